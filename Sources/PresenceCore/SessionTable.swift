import PresenceWire

/// The gateway's rules for its sessions (API.md, "Sessions"): open, resume within the presence
/// timeout, disconnect, time out, close; the channels each is in; state set before joining.
/// A plain value: monotonic nanoseconds come in, decisions come out.
public struct SessionTable {
    public enum Liveness: Equatable, Sendable {
        case connected
        /// The stream broke at this monotonic time; the session may resume until `since + window`.
        case disconnected(since: UInt64)
    }

    /// A channel the session is in, as this gateway (the authority on it) keeps it: whether it
    /// follows presence, the session version its join was stamped with, and the user's state there
    /// as the channel's owner last acknowledged it (with the owner's version of it), so an owner
    /// that lost any of it can be given it back (RELIABILITY.md, anti-entropy).
    public struct Membership: Sendable, Equatable {
        public var joinVersion: UInt64
        public var stateVersion: UInt64 = 0
        /// The state, and `withPresence` as which case holds it: an enum of two cases, each one
        /// array reference, takes 8 bytes (the case in the reference's spare bits), where the array
        /// and a Bool took 16 with padding. A node keeps one of these per channel of each of its
        /// sessions: 24 bytes each instead of 32.
        private var held: Held

        private enum Held: Sendable, Equatable {
            case followingPresence([StateItem])
            case notFollowingPresence([StateItem])

            init(_ state: [StateItem], withPresence: Bool) {
                self = withPresence ? .followingPresence(state) : .notFollowingPresence(state)
            }
        }

        public var withPresence: Bool {
            get { if case .followingPresence = held { return true } else { return false } }
            set { held = Held(state, withPresence: newValue) }
        }

        public var state: [StateItem] {
            get { switch held { case .followingPresence(let s), .notFollowingPresence(let s): return s } }
            set { held = Held(newValue, withPresence: withPresence) }
        }

        public init(withPresence: Bool, joinVersion: UInt64, state: [StateItem] = [], stateVersion: UInt64 = 0) {
            self.joinVersion = joinVersion
            self.stateVersion = stateVersion
            self.held = Held(state, withPresence: withPresence)
        }
    }

    public struct Session: Sendable, Equatable {
        public let id: SessionID
        public let userID: String
        public fileprivate(set) var liveness: Liveness
        /// Bumped on every (re)attachment of a stream, so a stale stream's end is ignored.
        public fileprivate(set) var generation: UInt64
        /// The session's version (`SessionVersion`): the epoch its user's home gave this gateway,
        /// and a counter bumped on every join and leave.
        public fileprivate(set) var version: UInt64 = SessionVersion.make(epoch: 1, counter: 0)
        /// Channels joined.
        public fileprivate(set) var channels: [ChannelKey: Membership] = [:]
        /// State set for channels not joined yet.
        public fileprivate(set) var pendingState: [ChannelKey: StateItems] = [:]
        public fileprivate(set) var watching: Set<String> = []
        /// The number of the session's last state write (`WriteNumber`).
        public fileprivate(set) var writes: UInt32 = 0
        /// The last state write numbered while none was in flight: every write numbered at or
        /// below it has finished here (answered, or given up on), so an attempt of one that reaches
        /// an owner later is late. Each write carries it (`settled`), and the owner drops such an
        /// attempt. (A client with writes always in flight holds it back: late attempts then
        /// compare with the fences owners learn from each other's copies only.)
        public fileprivate(set) var settledWrites: UInt32 = 0
        /// State writes numbered and not finished yet.
        public fileprivate(set) var writesInFlight: UInt16 = 0
        /// The number of the session's last call its home orders by number (SetStatus, Watch):
        /// counted apart from state writes, so the home's last number stays within reach of the next
        /// (`WriteNumber` compares numbers within 2^31 of each other) however many writes a
        /// long-lived session makes in between. (Four bytes in what was padding.)
        public fileprivate(set) var homeCalls: UInt32 = 0
    }

    public let resumeWindow: UInt64
    /// (A `DenseDictionary`: a node holds many sessions, and a `Dictionary` of them kept up to
    /// 2.6 times their size in buckets.)
    public private(set) var sessions: DenseDictionary<SessionID, Session> = [:]

    public init(resumeWindow: UInt64) {
        self.resumeWindow = resumeWindow
    }

    public var count: Int { sessions.count }
    public subscript(id: SessionID) -> Session? { sessions[id] }

    public enum OpenOutcome: Equatable, Sendable {
        case created(SessionID, generation: UInt64)
        case resumed(SessionID, generation: UInt64)
        /// The session to resume is another user's (API.md, "Security": PERMISSION_DENIED).
        case notYours
        /// The session to resume is unknown here, or past its window (NOT_FOUND).
        case notFound
    }

    /// Opens a session for `user`: a new one (`newID`) when `resume` is nil; otherwise resumes
    /// `resume` if it is a session of the same user still within its window (connected sessions
    /// may be taken over by a new stream, too). A resume that is refused changes nothing: no
    /// new session is made in its place.
    public mutating func open(user: String, resume: SessionID?, newID: SessionID, now: UInt64) -> OpenOutcome {
        guard let resume else {
            sessions[newID] = Session(id: newID, userID: user, liveness: .connected, generation: 1)
            return .created(newID, generation: 1)
        }
        guard var s = sessions[resume], !isExpired(s, now: now) else { return .notFound }
        guard s.userID == user else { return .notYours }
        s.liveness = .connected
        s.generation += 1
        sessions[resume] = s
        return .resumed(resume, generation: s.generation)
    }

    /// Takes over a session at `version` (the new epoch its user's home gave it): from another
    /// gateway (its client resumed it here; the channels and watched users come from the home), or
    /// one this gateway still holds (its channels and state here are kept, unless its home had
    /// placed it at another gateway since: `heldElsewhere`).
    /// (The home says where the session was, not the distance between epochs: a new home's
    /// claims jump epochs, `HomeRecord.startLineage`.)
    public mutating func adopt(_ id: SessionID, user: String, version: UInt64, heldElsewhere: Bool,
                               channels: [ChannelKey: Bool], watching: Set<String>) -> OpenOutcome {
        if var s = sessions[id], s.userID == user {
            s.liveness = .connected
            s.generation += 1
            if heldElsewhere {
                // (this gateway's copy is from before the session was held elsewhere — it came
                // back here after another gateway: what it joined and left meanwhile is in its
                // home's record, not here)
                var joined: [ChannelKey: Membership] = [:]
                for (key, withPresence) in channels { joined[key] = Membership(withPresence: withPresence, joinVersion: version) }
                s.channels = joined
                s.pendingState = [:]
                s.watching = watching
            }
            s.version = max(s.version, version)
            for (key, m) in s.channels { s.channels[key]?.joinVersion = max(m.joinVersion, s.version) }
            sessions[id] = s
            return .resumed(id, generation: s.generation)
        }
        var joined: [ChannelKey: Membership] = [:]
        for (key, withPresence) in channels { joined[key] = Membership(withPresence: withPresence, joinVersion: version) }
        sessions[id] = Session(id: id, userID: user, liveness: .connected, generation: 1, version: version, channels: joined, watching: watching)
        return .resumed(id, generation: 1)
    }

    private func isExpired(_ s: Session, now: UInt64) -> Bool { Self.isExpired(s.liveness, now: now, window: resumeWindow) }

    private static func isExpired(_ liveness: Liveness, now: UInt64, window: UInt64) -> Bool {
        if case .disconnected(let since) = liveness { return now >= since &+ window }
        return false
    }

    /// The stream of generation `generation` broke. Returns the deadline after which the session
    /// times out, or nil when that stream was already replaced (or the session is gone).
    public mutating func disconnect(_ id: SessionID, generation: UInt64, now: UInt64) -> UInt64? {
        guard var s = sessions[id], s.generation == generation, s.liveness == .connected else { return nil }
        s.liveness = .disconnected(since: now)
        sessions[id] = s
        return now &+ resumeWindow
    }

    /// Removes and returns the session if it is disconnected and its window has passed.
    public mutating func expireIfDue(_ id: SessionID, now: UInt64) -> Session? {
        guard let s = sessions[id], isExpired(s, now: now) else { return nil }
        sessions[id] = nil
        return s
    }

    /// Every disconnected session whose window has passed (a sweep), removed.
    public mutating func expireAll(now: UInt64) -> [Session] {
        let due = sessions.values.filter { isExpired($0, now: now) }
        for s in due { sessions[s.id] = nil }
        return due
    }

    /// Ends the session now (CloseSession).
    public mutating func close(_ id: SessionID) -> Session? {
        sessions.removeValue(forKey: id)
    }

    /// The session, if it exists and may act (not expired).
    public func session(_ id: SessionID, now: UInt64) throws(PresenceError) -> Session {
        guard let s = sessions[id], !isExpired(s, now: now) else { throw Self.noSession(id) }
        return s
    }

    /// The user of a live session (known, and not past its resume window at `now`), read where
    /// the session lies (`session(_:now:)` returns a copy: every field retained and released).
    public mutating func liveUser(_ id: SessionID, now: UInt64) throws(PresenceError) -> String {
        let window = resumeWindow
        return try withSession(id) { (s: inout Session) throws(PresenceError) -> String in
            if Self.isExpired(s.liveness, now: now, window: window) { throw Self.noSession(id) }
            return s.userID
        }
    }

    private static func noSession(_ id: SessionID) -> PresenceError {
        PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(id) (it was closed, timed out, or never opened)")
    }

    // MARK: Membership

    /// Runs `body` on the session where it lies: a change to its channels or watch list is made in
    /// place, not on a copy written back (which would copy those collections whole on every call:
    /// O(channels) per join). `body` must check before it changes anything: a throw leaves what it
    /// changed.
    private mutating func withSession<R>(_ id: SessionID, _ body: (inout Session) throws(PresenceError) -> R) throws(PresenceError) -> R {
        guard let i = sessions.index(forKey: id) else { throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(id)") }
        return try body(&sessions[valueAt: i])
    }

    /// Records a join; returns state set earlier for that channel (now consumed), whether the
    /// session was already in it, and the session version the join is stamped with.
    public mutating func joined(_ id: SessionID, channel: ChannelKey, withPresence: Bool) throws(PresenceError) -> (pending: [StateItem], already: Bool, version: UInt64) {
        try withSession(id) { (s: inout Session) throws(PresenceError) in
            let already = s.channels[channel] != nil
            if !already && s.channels.count >= Limits.maxChannelsPerSession {
                throw PresenceError(.resourceExhausted, "CHANNEL_LIMIT", "a session may be in at most \(Limits.maxChannelsPerSession) channels")
            }
            s.version = SessionVersion.bumped(s.version)
            let version = s.version
            if s.channels[channel] == nil {
                s.channels[channel] = Membership(withPresence: withPresence, joinVersion: version)
            } else {
                s.channels[channel]!.withPresence = withPresence
                s.channels[channel]!.joinVersion = version
            }
            let pending = s.pendingState.removeValue(forKey: channel)?.items ?? []
            return (pending, already, version)
        }
    }

    /// Records a leave; returns the version it is stamped with, or nil when the session was not in
    /// the channel.
    public mutating func left(_ id: SessionID, channel: ChannelKey) -> UInt64? {
        try? withSession(id) { (s: inout Session) -> UInt64? in
            guard s.channels.removeValue(forKey: channel) != nil else { return nil }
            s.version = SessionVersion.bumped(s.version)
            return s.version
        } ?? nil
    }

    /// The user's state in a channel of the session, as its owner acknowledged it at `version`
    /// (kept if it is not older than what the session holds).
    public mutating func stateAcknowledged(_ id: SessionID, channel: ChannelKey, state: [StateItem], version: UInt64) {
        _ = try? withSession(id) { (s: inout Session) in
            guard let held = s.channels[channel]?.stateVersion, version >= held else { return }
            s.channels[channel]!.state = state
            s.channels[channel]!.stateVersion = version
        }
    }

    /// Numbers a state write of the session in `channel`: its user, the version its join was
    /// stamped with and the write's number (`WriteNumber`); nil when the session is not in the
    /// channel. With `now`, a session past its resume window is not found (as `session(_:now:)`).
    /// (One lookup, and no copy of the session: this runs on every SetState.)
    /// The write is in flight until `writeFinished` is called for it, and is numbered with the
    /// writes settled before it (`Session.settledWrites`).
    public mutating func numberedWrite(_ id: SessionID, channel: ChannelKey, now: UInt64? = nil) throws(PresenceError) -> NumberedWrite? {
        let window = resumeWindow
        return try withSession(id) { (s: inout Session) throws(PresenceError) -> NumberedWrite? in
            if let now, Self.isExpired(s.liveness, now: now, window: window) { throw Self.noSession(id) }
            guard let joinVersion = s.channels[channel]?.joinVersion else { return nil }
            if s.writesInFlight == 0 { s.settledWrites = s.writes }
            s.writes = WriteNumber.next(s.writes)
            // (a client that never lets its writes finish — 65,535 in flight — stops moving the
            // floor, which only makes owners fence less)
            if s.writesInFlight < .max { s.writesInFlight += 1 }
            return NumberedWrite(user: s.userID, joinVersion: joinVersion, write: s.writes, settled: s.settledWrites)
        }
    }

    /// A state write numbered by `numberedWrite`: its session's user, the version its join was
    /// stamped with, the write's number, and the number every write at or below which finished.
    public struct NumberedWrite: Sendable, Equatable {
        public var user: String
        public var joinVersion: UInt64
        public var write: UInt32
        public var settled: UInt32
    }

    /// A write numbered by `numberedWrite` finished (answered, or given up on): once none is in
    /// flight, every write so far is settled.
    public mutating func writeFinished(_ id: SessionID) {
        _ = try? withSession(id) { (s: inout Session) in
            guard s.writesInFlight > 0, s.writesInFlight < .max else { return }
            s.writesInFlight -= 1
            if s.writesInFlight == 0 { s.settledWrites = s.writes }
        }
    }

    /// Numbers a call of the session its user's home orders by that number (SetStatus, the list
    /// of watched users), from a count of its own (`homeCalls`).
    public mutating func numberedCall(_ id: SessionID) throws(PresenceError) -> UInt32 {
        try withSession(id) { (s: inout Session) -> UInt32 in
            s.homeCalls = WriteNumber.next(s.homeCalls)
            return s.homeCalls
        }
    }

    /// Keeps state for a channel the session has not joined (applied when it joins).
    public mutating func setPendingState(_ id: SessionID, channel: ChannelKey, items: [StateItem]) throws(PresenceError) {
        try withSession(id) { (s: inout Session) throws(PresenceError) in
            if s.pendingState[channel] == nil && s.pendingState.count >= Limits.maxPendingStateChannels {
                throw PresenceError(.resourceExhausted, "PENDING_STATE_LIMIT",
                                    "a session may hold state for at most \(Limits.maxPendingStateChannels) channels it has not joined")
            }
            var state = s.pendingState[channel] ?? StateItems()
            let after = state.countAfterMerging(items)
            guard after <= Limits.maxStateKeys else {
                throw PresenceError(.resourceExhausted, "STATE_KEY_LIMIT", "a user may hold at most \(Limits.maxStateKeys) state keys per channel; this call would make \(after)")
            }
            state.merge(items)
            s.pendingState[channel] = state
        }
    }

    public mutating func removePendingState(_ id: SessionID, channel: ChannelKey, keys: [String]) {
        _ = try? withSession(id) { (s: inout Session) in
            guard var state = s.pendingState[channel] else { return }
            state.remove(keys)
            s.pendingState[channel] = state.isEmpty ? nil : state
        }
    }

    // MARK: Watching

    /// Adds and removes watched users; returns the newly watched ones. Throws when over the limit
    /// (and changes nothing then).
    public mutating func watch(_ id: SessionID, add: [String], remove: [String]) throws(PresenceError) -> [String] {
        try withSession(id) { (s: inout Session) throws(PresenceError) in
            let removing = Set(remove)
            // (newly watched: not watched now, or watched and removed by this same call)
            let unique = Array(Set(add.filter { !s.watching.contains($0) || removing.contains($0) })).sorted()
            let stay = s.watching.count - removing.reduce(0) { $0 + (s.watching.contains($1) ? 1 : 0) }
            guard stay + unique.count <= Limits.maxWatchedPerSession else {
                throw PresenceError(.resourceExhausted, "WATCH_LIMIT", "a session may watch at most \(Limits.maxWatchedPerSession) users")
            }
            for u in removing { s.watching.remove(u) }
            s.watching.formUnion(unique)
            return unique
        }
    }
}
