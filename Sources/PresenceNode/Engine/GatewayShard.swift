import PresenceCore
import PresenceWire
import Synchronization

/// Owns a share of the sessions connected to this node (the gateway role, the authority on them):
/// their liveness and resume window, the channels they are in with the state their owners
/// acknowledged, state set before joining, their versions, and their outboxes; and, for a while,
/// where sessions that left for another gateway went. Every operation is a short lookup or update,
/// so a mutex serves better than an actor here: calls that touch a session do not pay a hop to
/// another thread just to read it.
final class GatewayShard: Sendable {
    private struct State {
        var table: SessionTable
        var outboxes: [SessionID: SessionOutbox] = [:]
        /// Sessions whose client resumed them on another gateway: where, at which version, and
        /// until when this is remembered (monotonic ns).
        /// (`to` is nil when an owner said another gateway claimed it without saying which.)
        var moved: [SessionID: (to: NodeInstance?, version: UInt64, until: UInt64)] = [:]
        /// Sessions whose client is resuming them here (a claim at their home is in flight).
        var claiming: [SessionID: Int] = [:]
        /// Sessions whose claim here failed with no answer from their home (it may have carried
        /// the claim out), and until when (monotonic ns): see `claimInDoubt`.
        var claimsInDoubt: [SessionID: UInt64] = [:]
        /// Sessions whose claim here failed in doubt, until when that is remembered (monotonic
        /// ns): see `claimLandedLate`.
        var claimsGivenUp: [SessionID: UInt64] = [:]
        /// Sessions their client closed here, until when (monotonic ns): a CloseSession retried
        /// after its answer was lost finds the session closed, not unknown (RELIABILITY.md,
        /// invariant 7: a retried call is idempotent).
        var closed: [SessionID: UInt64] = [:]
        /// Sessions whose open this gateway gave up on before its client heard of them, until
        /// when (monotonic ns): see `abandonOpen`.
        var abandoned: [SessionID: UInt64] = [:]
        /// Sessions with a Watch call in flight, and the statuses delivered to them since.
        var watchWindows: [SessionID: WatchWindow] = [:]
    }

    /// What `close` found.
    enum Closing {
        /// Closed now: its record and outbox, for the session's end.
        case closed(SessionTable.Session, SessionOutbox)
        /// Closed here already, within the resume window (a retry).
        case alreadyClosed
    }
    private let state: Mutex<State>
    private let clock: EngineClock
    private let movedMemory: UInt64
    private let resumeWindow: UInt64

    private let counters: DeliveryCounters

    init(resumeWindow: UInt64, clock: EngineClock, movedMemory: UInt64, counters: DeliveryCounters = DeliveryCounters()) {
        state = Mutex(State(table: SessionTable(resumeWindow: resumeWindow)))
        self.counters = counters
        self.clock = clock
        self.movedMemory = movedMemory
        self.resumeWindow = resumeWindow
    }

    struct Opened {
        let id: SessionID
        let generation: UInt64
        let resumed: Bool
        let outbox: SessionOutbox
    }

    /// Resumes `id` for `user` if it can be (this gateway holds it, within its window); nil otherwise.
    func resume(_ id: SessionID, user: String) -> Opened? {
        let now = clock.monotonicNanoseconds()
        return state.withLock { st -> Opened? in
            // (only the session's own user may resume it, within its window; a refused resume
            // writes nothing: an expired id must not come back as new)
            guard case .resumed(let id, let generation) = st.table.open(user: user, resume: id, newID: id, now: now),
                  let outbox = st.outboxes[id] else { return nil }
            return Opened(id: id, generation: generation, resumed: true, outbox: outbox)
        }
    }

    /// Takes over a session at `version` (the epoch its home gave this gateway by a claim): one
    /// this gateway still holds keeps its channels, state and outbox (less what the outbox
    /// buffered, when the session lived at another gateway since); another comes with the
    /// channels and watched users from its home's record (`SessionTable.adopt`).
    func adopt(_ id: SessionID, user: String, version: UInt64, heldElsewhere: Bool, channels: [ChannelKey: Bool], watching: Set<String>) -> Opened? {
        state.withLock { st -> Opened? in
            if let held = st.table[id], held.userID != user { return nil }
            guard case .resumed(_, let generation) = st.table.adopt(id, user: user, version: version, heldElsewhere: heldElsewhere,
                                                                    channels: channels, watching: watching) else { return nil }
            st.moved[id] = nil
            if heldElsewhere { st.outboxes[id]?.dropBuffered() }
            let outbox = st.outboxes[id] ?? SessionOutbox(sessionID: id, userID: user, counters: counters)
            st.outboxes[id] = outbox
            return Opened(id: id, generation: generation, resumed: true, outbox: outbox)
        }
    }

    /// A claim of the session for this gateway starts (`true`) or ends; while one is in flight,
    /// anti-entropy does not tell owners the session is not here.
    func claiming(_ id: SessionID, _ starts: Bool) {
        state.withLock { st in
            let n = (st.claiming[id] ?? 0) + (starts ? 1 : -1)
            st.claiming[id] = n > 0 ? n : nil
        }
    }

    /// A claim here failed without an answer from the home: it may have carried it out (the
    /// home now places the session here) while this gateway never adopted it. For a resume window
    /// this gateway does not tell the home it is not here — that would remove a session whose
    /// client is resuming it elsewhere right now (found by Cluster/chaos, netns seed 49); the
    /// client's claim there moves it on, and if it never comes back the home hears "gone" after.
    func claimInDoubt(_ id: SessionID) {
        let now = clock.monotonicNanoseconds()
        let until = now &+ resumeWindow
        state.withLock { st in
            st.claimsInDoubt = st.claimsInDoubt.filter { $0.value > until &- resumeWindow }
            st.claimsInDoubt[id] = until
            st.claimsGivenUp[id] = now &+ movedMemory
            if st.claimsGivenUp.count > Self.maxRemembered { st.claimsGivenUp = st.claimsGivenUp.filter { $0.value > now } }
        }
    }

    /// An owner or home places here a session this gateway does not hold, and whose claim here
    /// failed in doubt, earlier than a resume window ago: the claim may have reached the home
    /// only now (its first attempt, held on a cut link, delivered once it healed), taking the
    /// session from the gateway its client went to instead. Its client finds its stream broken
    /// and resumes it; so, once, the claim counts as in doubt for a resume window from now, and
    /// the home keeps the session for that resume (if the client never comes, it hears "gone"
    /// after). Returns whether it does.
    func claimLandedLate(_ id: SessionID) -> Bool {
        let now = clock.monotonicNanoseconds()
        return state.withLock { st in
            guard st.table[id] == nil, let remembered = st.claimsGivenUp.removeValue(forKey: id), remembered > now else { return false }
            st.claimsInDoubt[id] = now &+ resumeWindow
            return true
        }
    }

    /// Whether a claim of the session here is in flight, or failed in doubt within the window.
    func isClaiming(_ id: SessionID) -> Bool {
        let now = clock.monotonicNanoseconds()
        return state.withLock { $0.claiming[id] != nil || ($0.claimsInDoubt[id].map { $0 > now } ?? false) }
    }

    /// The outbox of a session here, if it has one.
    func outbox(_ id: SessionID) -> SessionOutbox? { state.withLock { $0.outboxes[id] } }

    /// Whether the session is here and in `channel` with presence (a SNAPSHOT may subscribe it).
    func follows(_ id: SessionID, channel: ChannelKey) -> SessionOutbox? {
        state.withLock { st in st.table[id]?.channels[channel]?.withPresence == true ? st.outboxes[id] : nil }
    }

    /// Whether this gateway holds the session (connected, or disconnected within its window).
    func holds(_ id: SessionID) -> Bool { state.withLock { $0.table[id] != nil } }

    /// A session here, if any (disconnected ones included).
    func held(_ id: SessionID) -> SessionTable.Session? { state.withLock { $0.table[id] } }

    /// Where a session that left this gateway went (nil: not known where), if it is remembered.
    func movedTo(_ id: SessionID) -> (to: NodeInstance?, version: UInt64)? {
        let now = clock.monotonicNanoseconds()
        return state.withLock { st in
            guard let m = st.moved[id], m.until > now else { return nil }
            return (m.to, m.version)
        }
    }

    /// Every session here (anti-entropy): the table itself, shared (copy-on-write), not a copy of
    /// each session; a change made while the caller reads it copies the table then, once.
    func allSessions() -> DenseDictionary<SessionID, SessionTable.Session> { state.withLock { $0.table.sessions } }

    func create(_ id: SessionID, user: String) -> Opened {
        let now = clock.monotonicNanoseconds()
        let outbox = SessionOutbox(sessionID: id, userID: user, counters: counters)
        state.withLock { st in
            _ = st.table.open(user: user, resume: nil, newID: id, now: now)
            st.outboxes[id] = outbox
        }
        return Opened(id: id, generation: 1, resumed: false, outbox: outbox)
    }

    /// The session's client resumed it on `to` (its home says so, or an owner knows a later epoch):
    /// it is no longer this gateway's. Returns it (and its outbox, to end the stream) if it was here
    /// under an older epoch; nothing is said to owners (the new gateway speaks for it now).
    func movedAway(_ id: SessionID, to: NodeInstance?, version: UInt64) -> (SessionTable.Session, SessionOutbox?)? {
        let now = clock.monotonicNanoseconds()
        return state.withLock { st -> (SessionTable.Session, SessionOutbox?)? in
            guard let s = st.table[id], SessionVersion.epoch(s.version) < SessionVersion.epoch(version) else { return nil }
            _ = st.table.close(id)
            st.moved[id] = (to, version, now &+ movedMemory)
            if st.moved.count > Self.maxRemembered { st.moved = st.moved.filter { $0.value.until > now } }
            return (s, st.outboxes.removeValue(forKey: id))
        }
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

    /// Closes the session (nil: not known here, nor closed here lately).
    func close(_ id: SessionID) -> Closing? {
        let now = clock.monotonicNanoseconds()
        return state.withLock { st -> Closing? in
            guard let s = st.table.close(id), let o = st.outboxes.removeValue(forKey: id) else {
                return (st.closed[id].map { $0 > now } ?? false) ? .alreadyClosed : nil
            }
            st.closed[id] = now &+ resumeWindow
            // (bounded: the expired ones go once there are many)
            if st.closed.count > Self.maxRemembered { st.closed = st.closed.filter { $0.value > now } }
            return .closed(s, o)
        }
    }

    /// The open of a session created here failed before its client heard of it: the session is
    /// dropped, and remembered for a while as never opened, so its home, should the open reach it
    /// late (a first attempt delivered once a cut link heals), learns that whatever that open set
    /// is not its client's word (`GatewayFacts.Verdict.neverOpened`).
    func abandonOpen(_ id: SessionID) {
        let now = clock.monotonicNanoseconds()
        state.withLock { st in
            _ = st.table.close(id)
            st.outboxes[id] = nil
            st.abandoned[id] = now &+ movedMemory
            if st.abandoned.count > Self.maxRemembered { st.abandoned = st.abandoned.filter { $0.value > now } }
        }
    }

    /// Whether this gateway gave up on the session's open (and still remembers it).
    func openAbandoned(_ id: SessionID) -> Bool {
        let now = clock.monotonicNanoseconds()
        return state.withLock { $0.abandoned[id].map { $0 > now } ?? false }
    }

    /// (past this many closed, moved or abandoned sessions remembered, the expired ones are dropped)
    static let maxRemembered = 1024

    private static func lookup(_ st: inout State, _ id: SessionID, now: UInt64) throws(PresenceError) -> (SessionTable.Session, SessionOutbox) {
        if st.table[id] == nil, let m = st.moved[id], m.until > now {
            // (its client resumed it on another node: the call raced the move, and succeeds there)
            throw Self.movedError(id, to: m.to)
        }
        let s = try st.table.session(id, now: now)
        guard let o = st.outboxes[id] else { throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(id)") }
        return (s, o)
    }

    /// A call for a session that moved to another gateway: retryable, where the session is now.
    static func movedError(_ id: SessionID, to: NodeInstance?) -> PresenceError {
        PresenceError(.unavailable, "SESSION_MOVED", "session \(id) was resumed on \(to.map { "node \($0.id)" } ?? "another node"); retry on the node its stream is on")
    }

    /// `lookup` without its copy of the session, for calls that change it next: the user and
    /// outbox of a live session, or the error `lookup` answers.
    private static func live(_ st: inout State, _ id: SessionID, now: UInt64) throws(PresenceError) -> (user: String, outbox: SessionOutbox) {
        if let o = st.outboxes[id], let user = try? st.table.liveUser(id, now: now) { return (user, o) }
        let (s, o) = try lookup(&st, id, now: now)
        return (s.userID, o)
    }

    func session(_ id: SessionID) throws(PresenceError) -> (SessionTable.Session, SessionOutbox) {
        let now = clock.monotonicNanoseconds()
        return try state.withLock { (st: inout State) throws(PresenceError) in try Self.lookup(&st, id, now: now) }
    }

    func joined(_ id: SessionID, channel: ChannelKey, withPresence: Bool) throws(PresenceError) -> (user: String, outbox: SessionOutbox, pending: [StateItem], already: Bool, version: UInt64) {
        let now = clock.monotonicNanoseconds()
        return try state.withLock { (st: inout State) throws(PresenceError) in
            let (user, o) = try Self.live(&st, id, now: now)
            let (pending, already, version) = try st.table.joined(id, channel: channel, withPresence: withPresence)
            return (user, o, pending, already, version)
        }
    }

    /// Records a leave; `version` is nil when the session was not in the channel.
    func left(_ id: SessionID, channel: ChannelKey) throws(PresenceError) -> (user: String, version: UInt64?) {
        let now = clock.monotonicNanoseconds()
        return try state.withLock { (st: inout State) throws(PresenceError) in
            let (user, _) = try Self.live(&st, id, now: now)
            return (user, st.table.left(id, channel: channel))
        }
    }

    /// The channel's owner acknowledged the user's state there at `version`.
    func stateAcknowledged(_ id: SessionID, channel: ChannelKey, state items: [StateItem], version: UInt64) {
        guard version > 0 else { return }
        state.withLock { $0.table.stateAcknowledged(id, channel: channel, state: items, version: version) }
    }

    /// A state write of the session in `channel`, numbered (nil: it is not in the channel).
    /// It is in flight until `writeFinished`.
    func numberedWrite(_ id: SessionID, channel: ChannelKey) throws(PresenceError) -> SessionTable.NumberedWrite? {
        let now = clock.monotonicNanoseconds()
        return try state.withLock { (st: inout State) throws(PresenceError) in
            // (the table checks the session where it lies: `lookup` copies it, every field retained
            // and released, 3% of a SetState's CPU; it is asked only for the error to answer)
            do throws(PresenceError) {
                guard st.outboxes.index(forKey: id) != nil else { throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(id)") }
                return try st.table.numberedWrite(id, channel: channel, now: now)
            } catch {
                _ = try Self.lookup(&st, id, now: now)
                throw error
            }
        }
    }

    /// A state write `numberedWrite` numbered finished: answered, or given up on.
    func writeFinished(_ id: SessionID) {
        state.withLock { $0.table.writeFinished(id) }
    }

    /// The session and the number of a call its home orders by it (`SessionTable.numberedCall`).
    func numberedCall(_ id: SessionID) throws(PresenceError) -> (session: SessionTable.Session, write: UInt32) {
        let now = clock.monotonicNanoseconds()
        return try state.withLock { (st: inout State) throws(PresenceError) in
            _ = try Self.lookup(&st, id, now: now)
            let write = try st.table.numberedCall(id)
            guard let s = st.table[id] else { throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(id)") }
            return (s, write)
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

    /// A Watch call of the session starts: status events delivered to it are recorded until it ends.
    func openWatchWindow(_ id: SessionID) {
        state.withLock { $0.watchWindows[id, default: WatchWindow()].open() }
    }

    /// A Watch call of the session ends: the statuses its stream was sent meanwhile.
    func closeWatchWindow(_ id: SessionID) -> [String: UserStatus] {
        state.withLock { st in
            guard var w = st.watchWindows[id] else { return [:] }
            let seen = w.close()
            st.watchWindows[id] = w.isOpen ? w : nil
            return seen
        }
    }

    /// A status event (framed, as it goes on the stream) for the session, if it is here; `status`:
    /// what it says, and the version of its user's record it was read at (`StatusOrder`).
    func deliverStatus(_ id: SessionID, framed: [UInt8], status: StatusNews?) {
        guard let outbox = state.withLock({ $0.outboxes[id] }) else { return }
        if let status {
            // (older news is neither given nor taken for what a Watch call in flight answers)
            guard outbox.mayGiveStatus(of: status.user, version: status.version) else { return }
            state.withLock { st in
                if st.watchWindows[id] != nil { st.watchWindows[id]?.delivered(status.status, of: status.user) }
            }
        }
        outbox.push(framed, status: status.map { ($0.user, $0.version) })
    }

    /// Every live session's outbox (for shutdown).
    func allOutboxes() -> [SessionOutbox] { state.withLock { Array($0.outboxes.values) } }

    var count: Int { state.withLock { $0.table.count } }

    /// Sessions with a live stream, and those waiting to resume (for metrics).
    var countsByLiveness: (connected: Int, disconnected: Int) {
        state.withLock { st in
            let connected = st.table.sessions.reduce(0) { $0 + ($1.value.liveness == .connected ? 1 : 0) }
            return (connected, st.table.count - connected)
        }
    }
}

/// A status event as a gateway passes it on: whose, what, and the version of the user's home
/// record it was read at (0: unversioned).
struct StatusNews: Sendable {
    let user: String
    let status: UserStatus
    let version: UInt64

    init(user: String, status: UserStatus, version: UInt64) {
        self.user = user
        self.status = status
        self.version = version
    }

    init(event: UserStatusEvent, version: UInt64) {
        self.init(user: event.userID, status: event.status, version: version)
    }
}
