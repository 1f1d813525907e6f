import PresenceWire

/// The user-home rules (API.md, "User-level status" and GetUserChannels): the channels each user is
/// in, the status it chose, its sessions, and who watches it. A plain value.
public struct UserDirectory<Sink> {
    struct User {
        var channels: Set<ChannelKey> = []
        var chosen: UserStatus = .online
        var sessions = SessionList()
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

    /// A session opened (or resumed). `initial` UNKNOWN keeps the user's status (ONLINE if it had none).
    public mutating func sessionOpened(_ userID: String, session: SessionID, initial: UserStatus) -> StatusChange? {
        change(userID) { u in
            if u.sessions.isEmpty { u.chosen = .online }
            u.everOpened = true
            if !u.sessions.contains(session) { u.sessions.append(session) }
            if initial != .unknown { u.chosen = initial }
        }
    }

    /// A session ended (closed or timed out).
    public mutating func sessionEnded(_ userID: String, session: SessionID) -> StatusChange? {
        change(userID) { u in
            u.sessions.remove(session)
        }
    }

    /// SetStatus: ONLINE, AWAY, BUSY or OFFLINE (invisible).
    public mutating func setStatus(_ userID: String, _ status: UserStatus) -> StatusChange? {
        change(userID) { u in u.chosen = status }
    }

    public mutating func addChannel(_ userID: String, _ channel: ChannelKey) {
        users[userID, default: User()].channels.insert(channel)
    }

    public mutating func removeChannel(_ userID: String, _ channel: ChannelKey) {
        guard var u = users[userID] else { return }
        u.channels.remove(channel)
        users[userID] = u
        dropIfIdle(userID)
    }

    /// Channels of a user, sorted.
    public func channels(of userID: String) -> [ChannelKey] {
        (users[userID]?.channels ?? []).sorted()
    }

    public mutating func watch(_ userID: String, by session: SessionID, sink: Sink) {
        users[userID, default: User()].watchers[session] = sink
    }

    public mutating func unwatch(_ userID: String, by session: SessionID) {
        guard var u = users[userID] else { return }
        u.watchers[session] = nil
        users[userID] = u
        dropIfIdle(userID)
    }

    public mutating func rebindWatcher(_ userID: String, session: SessionID, sink: Sink) {
        guard var u = users[userID], u.watchers[session] != nil else { return }
        u.watchers[session] = sink
        users[userID] = u
    }

    /// Forget users that hold nothing: never opened here, in no channel, watched by nobody.
    private mutating func dropIfIdle(_ userID: String) {
        if let u = users[userID], !u.everOpened, u.channels.isEmpty, u.watchers.isEmpty { users[userID] = nil }
    }
}
