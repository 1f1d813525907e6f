import PresenceWire

/// Sessions whose gateway node died or left: each times out at its deadline unless its client
/// resumes it on another node first (which cancels the timer). A plain value; the owner of the
/// records asks what is `due` at a clock reading.
public struct OrphanTimers<Key: Hashable>: Sendable where Key: Sendable {
    private var deadlines: [Key: UInt64] = [:]

    public init() {}

    public var isEmpty: Bool { deadlines.isEmpty }
    public var count: Int { deadlines.count }
    /// The earliest deadline.
    public var next: UInt64? { deadlines.values.min() }

    /// Starts `key`'s timer; a running timer keeps its earlier deadline.
    public mutating func start(_ key: Key, deadline: UInt64) {
        if deadlines[key] == nil { deadlines[key] = deadline }
    }

    public mutating func cancel(_ key: Key) { deadlines[key] = nil }

    public func contains(_ key: Key) -> Bool { deadlines[key] != nil }
    public func deadline(_ key: Key) -> UInt64? { deadlines[key] }

    /// What a record carries for `key`: milliseconds left before it times out (at least 1), or 0
    /// when it has no timer.
    public func millisecondsLeft(_ key: Key, now: UInt64) -> UInt64 {
        guard let d = deadlines[key] else { return 0 }
        return max(1, (d > now ? d - now : 0) / 1_000_000)
    }

    /// The deadline a record's `millisecondsLeft` stands for here, never further than `cap` ns away.
    public static func deadline(millisecondsLeft ms: UInt64, now: UInt64, cap: UInt64) -> UInt64 {
        now + min(ms * 1_000_000, cap)
    }
    public var keys: [Key] { Array(deadlines.keys) }

    /// Postpones to `grace` the timers whose session's gateway `locate` says is back (nil: not
    /// back), and returns those sessions by gateway, for the caller to ask which it still holds.
    public mutating func gatewaysBack(grace: UInt64, locate: (Key) -> (gateway: String, session: SessionID)?) -> [String: Set<SessionID>] {
        var back: [String: Set<SessionID>] = [:]
        for key in keys {
            guard let (gateway, session) = locate(key) else { continue }
            postpone(key, to: grace)
            back[gateway, default: []].insert(session)
        }
        return back
    }

    /// Moves a running timer's deadline later (never earlier).
    public mutating func postpone(_ key: Key, to deadline: UInt64) {
        if let d = deadlines[key], d < deadline { deadlines[key] = deadline }
    }

    /// Keys whose deadline has passed, removed.
    public mutating func due(now: UInt64) -> [Key] {
        let keys = deadlines.filter { $0.value <= now }.map(\.key)
        for k in keys { deadlines[k] = nil }
        return keys
    }
}
