import PresenceCore
import PresenceWire

/// Owns a share of the sessions connected to this node (the gateway role): their liveness and
/// resume window, the channels they are in, state set before joining, and their outboxes.
actor GatewayShard {
    private var table: SessionTable
    private var outboxes: [SessionID: SessionOutbox] = [:]
    private let clock: EngineClock

    init(resumeWindow: UInt64, clock: EngineClock) {
        table = SessionTable(resumeWindow: resumeWindow)
        self.clock = clock
    }

    struct Opened {
        let id: SessionID
        let generation: UInt64
        let resumed: Bool
        let outbox: SessionOutbox
    }

    /// Resumes `id` for `user` if it can be; nil otherwise.
    func resume(_ id: SessionID, user: String) -> Opened? {
        guard case .resumed(let id, let generation) = table.open(user: user, resume: id, newID: id, now: clock.monotonicNanoseconds()),
              let outbox = outboxes[id] else { return nil }
        return Opened(id: id, generation: generation, resumed: true, outbox: outbox)
    }

    func create(_ id: SessionID, user: String) -> Opened {
        _ = table.open(user: user, resume: nil, newID: id, now: clock.monotonicNanoseconds())
        let outbox = SessionOutbox(sessionID: id, userID: user)
        outboxes[id] = outbox
        return Opened(id: id, generation: 1, resumed: false, outbox: outbox)
    }

    /// The stream broke: returns the monotonic deadline of the session's resume window.
    func disconnect(_ id: SessionID, generation: UInt64) -> UInt64? {
        let deadline = table.disconnect(id, generation: generation, now: clock.monotonicNanoseconds())
        if deadline != nil { outboxes[id]?.detach(generation: generation) }
        return deadline
    }

    func expireIfDue(_ id: SessionID) -> SessionTable.Session? {
        guard let s = table.expireIfDue(id, now: clock.monotonicNanoseconds()) else { return nil }
        outboxes[id] = nil
        return s
    }

    func close(_ id: SessionID) -> (SessionTable.Session, SessionOutbox)? {
        guard let s = table.close(id), let o = outboxes.removeValue(forKey: id) else { return nil }
        return (s, o)
    }

    func session(_ id: SessionID) throws(PresenceError) -> (SessionTable.Session, SessionOutbox) {
        let s = try table.session(id, now: clock.monotonicNanoseconds())
        guard let o = outboxes[id] else { throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(id)") }
        return (s, o)
    }

    func joined(_ id: SessionID, channel: ChannelKey, withPresence: Bool) throws(PresenceError) -> (user: String, outbox: SessionOutbox, pending: [StateItem], already: Bool) {
        let (s, o) = try session(id)
        let (pending, already) = try table.joined(id, channel: channel, withPresence: withPresence)
        return (s.userID, o, pending, already)
    }

    func left(_ id: SessionID, channel: ChannelKey) throws(PresenceError) -> (user: String, wasIn: Bool) {
        let (s, _) = try session(id)
        return (s.userID, table.left(id, channel: channel))
    }

    func setPendingState(_ id: SessionID, channel: ChannelKey, items: [StateItem]) throws(PresenceError) {
        try table.setPendingState(id, channel: channel, items: items)
    }

    func removePendingState(_ id: SessionID, channel: ChannelKey, keys: [String]) {
        table.removePendingState(id, channel: channel, keys: keys)
    }

    func watch(_ id: SessionID, add: [String], remove: [String]) throws(PresenceError) -> (user: String, outbox: SessionOutbox, added: [String]) {
        let (s, o) = try session(id)
        let added = try table.watch(id, add: add, remove: remove)
        return (s.userID, o, added)
    }

    /// Every live session's outbox (for shutdown).
    func allOutboxes() -> [SessionOutbox] { Array(outboxes.values) }

    var count: Int { table.count }
}
