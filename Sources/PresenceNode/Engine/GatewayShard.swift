import PresenceCore
import PresenceWire
import Synchronization

/// Owns a share of the sessions connected to this node (the gateway role): their liveness and
/// resume window, the channels they are in, state set before joining, and their outboxes.
/// Every operation is a short lookup or update, so a mutex serves better than an actor here: calls
/// that touch a session do not pay a hop to another thread just to read it.
final class GatewayShard: Sendable {
    private struct State {
        var table: SessionTable
        var outboxes: [SessionID: SessionOutbox] = [:]
    }
    private let state: Mutex<State>
    private let clock: EngineClock

    init(resumeWindow: UInt64, clock: EngineClock) {
        state = Mutex(State(table: SessionTable(resumeWindow: resumeWindow)))
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
        let now = clock.monotonicNanoseconds()
        return state.withLock { st -> Opened? in
            guard case .resumed(let id, let generation) = st.table.open(user: user, resume: id, newID: id, now: now),
                  let outbox = st.outboxes[id] else { return nil }
            return Opened(id: id, generation: generation, resumed: true, outbox: outbox)
        }
    }

    /// Takes over a session whose client resumed it here from another gateway.
    func adopt(_ id: SessionID, user: String, channels: [ChannelKey: Bool], watching: Set<String>) -> Opened {
        let outbox = SessionOutbox(sessionID: id, userID: user)
        state.withLock { st in
            _ = st.table.adopt(id, user: user, channels: channels, watching: watching)
            st.outboxes[id] = outbox
        }
        return Opened(id: id, generation: 1, resumed: true, outbox: outbox)
    }

    /// The outbox of a session here, if it has one.
    func outbox(_ id: SessionID) -> SessionOutbox? { state.withLock { $0.outboxes[id] } }

    /// Whether the session is here and in `channel` with presence (a SNAPSHOT may subscribe it).
    func follows(_ id: SessionID, channel: ChannelKey) -> SessionOutbox? {
        state.withLock { st in st.table[id]?.channels[channel] == true ? st.outboxes[id] : nil }
    }

    /// Whether this gateway holds the session (connected, or disconnected within its window).
    func holds(_ id: SessionID) -> Bool { state.withLock { $0.table[id] != nil } }

    /// Every session here (anti-entropy re-announces them).
    func allSessions() -> [SessionTable.Session] { state.withLock { Array($0.table.sessions.values) } }

    func create(_ id: SessionID, user: String) -> Opened {
        let now = clock.monotonicNanoseconds()
        let outbox = SessionOutbox(sessionID: id, userID: user)
        state.withLock { st in
            _ = st.table.open(user: user, resume: nil, newID: id, now: now)
            st.outboxes[id] = outbox
        }
        return Opened(id: id, generation: 1, resumed: false, outbox: outbox)
    }

    /// The stream broke: returns the monotonic deadline of the session's resume window.
    func disconnect(_ id: SessionID, generation: UInt64) -> UInt64? {
        let now = clock.monotonicNanoseconds()
        return state.withLock { st -> UInt64? in
            let deadline = st.table.disconnect(id, generation: generation, now: now)
            if deadline != nil { st.outboxes[id]?.detach(generation: generation) }
            return deadline
        }
    }

    func expireIfDue(_ id: SessionID) -> SessionTable.Session? {
        let now = clock.monotonicNanoseconds()
        return state.withLock { st -> SessionTable.Session? in
            guard let s = st.table.expireIfDue(id, now: now) else { return nil }
            st.outboxes[id] = nil
            return s
        }
    }

    func close(_ id: SessionID) -> (SessionTable.Session, SessionOutbox)? {
        state.withLock { st -> (SessionTable.Session, SessionOutbox)? in
            guard let s = st.table.close(id), let o = st.outboxes.removeValue(forKey: id) else { return nil }
            return (s, o)
        }
    }

    private static func lookup(_ st: inout State, _ id: SessionID, now: UInt64) throws(PresenceError) -> (SessionTable.Session, SessionOutbox) {
        let s = try st.table.session(id, now: now)
        guard let o = st.outboxes[id] else { throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(id)") }
        return (s, o)
    }

    func session(_ id: SessionID) throws(PresenceError) -> (SessionTable.Session, SessionOutbox) {
        let now = clock.monotonicNanoseconds()
        return try state.withLock { (st: inout State) throws(PresenceError) in try Self.lookup(&st, id, now: now) }
    }

    func joined(_ id: SessionID, channel: ChannelKey, withPresence: Bool) throws(PresenceError) -> (user: String, outbox: SessionOutbox, pending: [StateItem], already: Bool) {
        let now = clock.monotonicNanoseconds()
        return try state.withLock { (st: inout State) throws(PresenceError) in
            let (s, o) = try Self.lookup(&st, id, now: now)
            let (pending, already) = try st.table.joined(id, channel: channel, withPresence: withPresence)
            return (s.userID, o, pending, already)
        }
    }

    func left(_ id: SessionID, channel: ChannelKey) throws(PresenceError) -> (user: String, wasIn: Bool) {
        let now = clock.monotonicNanoseconds()
        return try state.withLock { (st: inout State) throws(PresenceError) in
            let (s, _) = try Self.lookup(&st, id, now: now)
            return (s.userID, st.table.left(id, channel: channel))
        }
    }

    func setPendingState(_ id: SessionID, channel: ChannelKey, items: [StateItem]) throws(PresenceError) {
        try state.withLock { (st: inout State) throws(PresenceError) in try st.table.setPendingState(id, channel: channel, items: items) }
    }

    func removePendingState(_ id: SessionID, channel: ChannelKey, keys: [String]) {
        state.withLock { $0.table.removePendingState(id, channel: channel, keys: keys) }
    }

    func watch(_ id: SessionID, add: [String], remove: [String]) throws(PresenceError) -> (user: String, outbox: SessionOutbox, added: [String]) {
        let now = clock.monotonicNanoseconds()
        return try state.withLock { (st: inout State) throws(PresenceError) in
            let (s, o) = try Self.lookup(&st, id, now: now)
            let added = try st.table.watch(id, add: add, remove: remove)
            return (s.userID, o, added)
        }
    }

    /// Every live session's outbox (for shutdown).
    func allOutboxes() -> [SessionOutbox] { state.withLock { Array($0.outboxes.values) } }

    var count: Int { state.withLock { $0.table.count } }
}
