import PresenceWire

/// The user-home rules (API.md, "User-level status" and GetUserChannels): each user's sessions and
/// where they live, the channels each session is in (GetUserChannels is their union; a session that
/// moves to another gateway is resumed from this record), the status the user chose, and who
/// watches it. A plain value. `Sink` is where a session lives (in the cluster: its gateway node).
public struct UserDirectory<Sink: Hashable> {
    /// One session of a user, as its home keeps it.
    public struct SessionRecord: Equatable {
        public var sink: Sink
        /// Channels joined, with `with_presence`.
        public var channels: [ChannelKey: Bool] = [:]
        /// Users this session watches.
        public var watching: [String] = []
        public init(sink: Sink, channels: [ChannelKey: Bool] = [:], watching: [String] = []) {
            self.sink = sink
            self.channels = channels
            self.watching = watching
        }
    }

    /// A user's whole record (replication and handoff).
    public struct UserCopy: Equatable {
        public var userID: String
        public var chosen: UserStatus
        public var everOpened: Bool
        public var sessions: [SessionID: SessionRecord]
        public var watchers: [SessionID: Sink]
        public init(userID: String, chosen: UserStatus, everOpened: Bool, sessions: [SessionID: SessionRecord], watchers: [SessionID: Sink]) {
            self.userID = userID
            self.chosen = chosen
            self.everOpened = everOpened
            self.sessions = sessions
            self.watchers = watchers
        }
    }

    struct User {
        var chosen: UserStatus = .online
        var sessions: [SessionID: SessionRecord] = [:]
        var watchers: [SessionID: Sink] = [:]
        var everOpened = false
    }

    /// A change of a user's visible status, for its watchers.
    public struct StatusChange {
        public let userID: String
        public let status: UserStatus
        public let watchers: [SessionID: Sink]
    }

    private var users: [String: User] = [:]

    public init() {}

    /// UNKNOWN if the user never opened a session; its chosen status while it has a session (OFFLINE
    /// when it chose to be invisible); OFFLINE once it has none.
    public func visibleStatus(_ userID: String) -> UserStatus {
        guard let u = users[userID], u.everOpened else { return .unknown }
        return u.sessions.isEmpty ? .offline : u.chosen
    }

    private mutating func change(_ userID: String, _ body: (inout User) -> Void) -> StatusChange? {
        let before = visibleStatus(userID)
        var u = users[userID] ?? User()
        body(&u)
        users[userID] = u
        let after = visibleStatus(userID)
        guard before != after else { return nil }
        return StatusChange(userID: userID, status: after, watchers: u.watchers)
    }

    /// A session opened (or resumed) at `sink`. `initial` UNKNOWN keeps the user's status (ONLINE if it had none).
    public mutating func sessionOpened(_ userID: String, session: SessionID, sink: Sink, initial: UserStatus) -> StatusChange? {
        change(userID) { u in
            if u.sessions.isEmpty { u.chosen = .online }
            u.everOpened = true
            if u.sessions[session] == nil {
                u.sessions[session] = SessionRecord(sink: sink)
            } else {
                u.sessions[session]!.sink = sink
            }
            if initial != .unknown { u.chosen = initial }
        }
    }

    /// Anti-entropy: the session's gateway states its whole record (it moved there, or the home
    /// changed and lost it). Keeps the chosen status.
    public mutating func announce(_ userID: String, session: SessionID, record: SessionRecord) -> StatusChange? {
        change(userID) { u in
            if u.sessions.isEmpty && !u.everOpened { u.chosen = .online }
            u.everOpened = true
            u.sessions[session] = record
        }
    }

    /// A session ended (closed or timed out).
    public mutating func sessionEnded(_ userID: String, session: SessionID) -> StatusChange? {
        guard users[userID]?.sessions[session] != nil else { return nil }
        return change(userID) { u in u.sessions[session] = nil }
    }

    /// SetStatus: ONLINE, AWAY, BUSY or OFFLINE (invisible).
    public mutating func setStatus(_ userID: String, _ status: UserStatus) -> StatusChange? {
        change(userID) { u in u.chosen = status }
    }

    public mutating func sessionJoined(_ userID: String, session: SessionID, channel: ChannelKey, withPresence: Bool) {
        users[userID]?.sessions[session]?.channels[channel] = withPresence
    }

    public mutating func sessionLeft(_ userID: String, session: SessionID, channel: ChannelKey) {
        users[userID]?.sessions[session]?.channels[channel] = nil
    }

    public mutating func sessionWatching(_ userID: String, session: SessionID, watching: [String]) {
        users[userID]?.sessions[session]?.watching = watching
    }

    /// A session's record (to resume it elsewhere).
    public func session(_ userID: String, _ session: SessionID) -> SessionRecord? {
        users[userID]?.sessions[session]
    }

    /// Where a watcher of a user lives.
    public func watcher(_ userID: String, _ session: SessionID) -> Sink? {
        users[userID]?.watchers[session]
    }

    /// Channels the user is in (through any of its sessions), sorted.
    public func channels(of userID: String) -> [ChannelKey] {
        guard let u = users[userID] else { return [] }
        var all = Set<ChannelKey>()
        for s in u.sessions.values { all.formUnion(s.channels.keys) }
        return all.sorted()
    }

    public mutating func watch(_ userID: String, by session: SessionID, sink: Sink) {
        users[userID, default: User()].watchers[session] = sink
    }

    /// Removes a watcher; with `sink`, only if it still lives there (it may have moved on).
    public mutating func unwatch(_ userID: String, by session: SessionID, at sink: Sink? = nil) {
        guard let at = users[userID]?.watchers[session], sink == nil || at == sink else { return }
        users[userID]?.watchers[session] = nil
        dropIfIdle(userID)
    }

    /// Sessions (of the users here) living at `sink`.
    public func sessions(at sink: Sink) -> [(user: String, session: SessionID)] {
        var out: [(String, SessionID)] = []
        for (id, u) in users {
            for (s, r) in u.sessions where r.sink == sink { out.append((id, s)) }
        }
        return out
    }

    /// Watchers living at `sink`, with the user each watches.
    public func watchers(at sink: Sink) -> [(user: String, session: SessionID)] {
        var out: [(String, SessionID)] = []
        for (id, u) in users {
            for (s, w) in u.watchers where w == sink { out.append((id, s)) }
        }
        return out
    }

    // MARK: Copies

    public func copy(of userID: String) -> UserCopy {
        let u = users[userID] ?? User()
        return UserCopy(userID: userID, chosen: u.chosen, everOpened: u.everOpened, sessions: u.sessions, watchers: u.watchers)
    }

    public var allUserIDs: [String] { Array(users.keys) }

    /// Replaces a user's record with `copy`, silently.
    public mutating func install(_ copy: UserCopy) {
        users[copy.userID] = User(chosen: copy.chosen, sessions: copy.sessions, watchers: copy.watchers, everOpened: copy.everOpened)
        dropIfIdle(copy.userID)
    }

    /// Merges another version of a user's record (each side of a partition kept one): sessions and
    /// watchers are the union (this version wins where both have one), the chosen status stays.
    public mutating func merge(_ copy: UserCopy) {
        guard var u = users[copy.userID] else {
            install(copy)
            return
        }
        u.sessions.merge(copy.sessions) { mine, _ in mine }
        u.watchers.merge(copy.watchers) { mine, _ in mine }
        u.everOpened = u.everOpened || copy.everOpened
        users[copy.userID] = u
    }

    public mutating func remove(_ userID: String) { users[userID] = nil }

    /// Forget users that hold nothing: never opened here, watched by nobody.
    private mutating func dropIfIdle(_ userID: String) {
        if let u = users[userID], !u.everOpened, u.sessions.isEmpty, u.watchers.isEmpty { users[userID] = nil }
    }
}
