import PresenceCore
import PresenceWire

// Mapping between the engine's copies of state and their peer-link messages. Input from the
// network is checked here: invalid ids are dropped, never trusted.

extension ClusterMemberRecord {
    init(_ c: MemberCopy<String>) {
        self.init(userID: c.userID,
                  sessions: c.sessions.map { ClusterSessionRef(sessionID: $0.id.description, userID: c.userID, gateway: $0.sink, withPresence: $0.withPresence) },
                  state: c.state, stateAtMs: c.stateAt)
    }

    var copy: MemberCopy<String>? {
        guard let user = try? Validate.userID(userID) else { return nil }
        let sessions = self.sessions.compactMap { s -> MemberCopy<String>.Session? in
            guard let id = SessionID(text: s.sessionID), !s.gateway.isEmpty else { return nil }
            return MemberCopy<String>.Session(id: id, sink: s.gateway, withPresence: s.withPresence)
        }
        let state = (try? Validate.stateItems(self.state)) ?? []
        return MemberCopy(userID: user, sessions: sessions, state: state, stateAt: stateAtMs)
    }
}

extension ClusterSessionChannel {
    init(_ key: ChannelKey, withPresence: Bool) {
        self.init(channelName: key.name, channelType: key.type, withPresence: withPresence)
    }
    var key: ChannelKey? { try? Validate.channel(channelName, channelType) }
}

extension ClusterUserRecord {
    init(_ c: UserDirectory<String>.UserCopy) {
        self.init(userID: c.userID, chosen: c.chosen, everOpened: c.everOpened,
                  sessions: c.sessions.sorted { $0.key < $1.key }.map { id, r in
                      ClusterHomeSession(sessionID: id.description, gateway: r.sink,
                                         channels: r.channels.sorted { $0.key < $1.key }.map { ClusterSessionChannel($0.key, withPresence: $0.value) },
                                         watching: r.watching)
                  },
                  watchers: c.watchers.sorted { $0.key < $1.key }.map { ClusterSessionRef(sessionID: $0.key.description, gateway: $0.value) })
    }

    var copy: UserDirectory<String>.UserCopy? {
        guard let user = try? Validate.userID(userID) else { return nil }
        var sessions: [SessionID: UserDirectory<String>.SessionRecord] = [:]
        for s in self.sessions {
            guard let id = SessionID(text: s.sessionID), !s.gateway.isEmpty else { continue }
            sessions[id] = ClusterHomeSession.record(s)
        }
        var watchers: [SessionID: String] = [:]
        for w in self.watchers {
            if let id = SessionID(text: w.sessionID), !w.gateway.isEmpty { watchers[id] = w.gateway }
        }
        return UserDirectory<String>.UserCopy(userID: user, chosen: chosen, everOpened: everOpened, sessions: sessions, watchers: watchers)
    }
}

extension ClusterHomeSession {
    static func record(_ s: ClusterHomeSession) -> UserDirectory<String>.SessionRecord {
        var channels: [ChannelKey: Bool] = [:]
        for c in s.channels { if let k = c.key { channels[k] = c.withPresence } }
        return UserDirectory<String>.SessionRecord(sink: s.gateway, channels: channels, watching: s.watching.filter { (try? Validate.userID($0)) != nil })
    }
}
