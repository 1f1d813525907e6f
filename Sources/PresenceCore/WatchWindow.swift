import PresenceWire

/// The statuses a session's gateway delivered while one of the session's `Watch` calls was in
/// flight, so the call does not answer with something older than what its stream already said.
///
/// A home registers a watcher and reads the user's status in one step, and sends every later
/// change to the watcher's gateway as an event. The call's answer still has a way to go after that
/// read (the gateway also records the new list at the session's own home), so an event for a
/// change made meanwhile can reach the client first; a client that takes the last word it got would
/// then keep the older status for good (found by Cluster/chaos, loopback seed 1: the watcher's home
/// was a paused node). Events seen in the window are newer than the homes' answers: they win.
public struct WatchWindow: Sendable, Equatable {
    /// Watch calls of the session in flight.
    public private(set) var calls = 0
    /// The last status delivered for each user while a call was in flight.
    public private(set) var delivered: [String: UserStatus] = [:]

    public init() {}

    /// Whether deliveries are being recorded.
    public var isOpen: Bool { calls > 0 }

    /// A Watch call starts.
    public mutating func open() { calls += 1 }

    /// A status event reached the session's outbox.
    public mutating func delivered(_ status: UserStatus, of user: String) {
        guard isOpen, delivered[user] != nil || delivered.count < Limits.maxWatchedPerSession else { return }
        delivered[user] = status
    }

    /// A Watch call ends: the statuses delivered since it started. (A window shared by calls
    /// overlapping in time keeps recording until the last ends; an earlier one answering with a
    /// status delivered for a later one's users only repeats what the stream said.)
    public mutating func close() -> [String: UserStatus] {
        calls = max(0, calls - 1)
        let seen = delivered
        if calls == 0 { delivered = [:] }
        return seen
    }

    /// The answer for `added`: what their homes said, unless the stream said something since.
    public static func answer(_ added: [String], homes: [String: UserStatus], delivered: [String: UserStatus]) -> [UserStatusEntry] {
        added.map { UserStatusEntry(userID: $0, status: delivered[$0] ?? homes[$0] ?? .unknown) }
    }
}
