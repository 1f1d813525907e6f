import ClusterCore
import PresenceCore
import PresenceWire

// Mapping between the engine's copies of state and their peer-link messages. Input from the
// network is checked here: invalid ids are dropped, never trusted.

extension ClusterSessionRef {
    /// The process the session lives at (nil when the reference names none).
    var sink: NodeInstance? { Validate.isIdentifier(gateway) ? NodeInstance(gateway, boot: gatewayBoot) : nil }
}

extension ClusterMemberRecord {
    init(_ c: MemberCopy<NodeInstance>) {
        self.init(userID: c.userID,
                  sessions: c.sessions.map { ClusterSessionRef(sessionID: $0.id.description, userID: c.userID, gateway: $0.sink.id, withPresence: $0.withPresence,
                                                               gatewayBoot: $0.sink.boot, version: $0.version, write: $0.written) },
                  state: c.state, stateVersion: c.stateVersion)
    }

    var copy: MemberCopy<NodeInstance>? {
        guard let user = try? Validate.userID(userID) else { return nil }
        let sessions = self.sessions.compactMap { s -> MemberCopy<NodeInstance>.Session? in
            guard let id = SessionID(text: s.sessionID), let sink = s.sink else { return nil }
            return MemberCopy.Session(id: id, sink: sink, withPresence: s.withPresence, version: s.version, written: s.write)
        }
        let state = (try? Validate.stateItems(self.state)) ?? []
        return MemberCopy(userID: user, sessions: sessions, state: state, stateVersion: stateVersion)
    }
}

extension ClusterChannelRecord {
    init(_ c: ChannelCopy<NodeInstance>) {
        self.init(channelName: c.key.name, channelType: c.key.type, sequence: c.sequence, full: c.full,
                  members: c.members.map(ClusterMemberRecord.init), handoff: c.handoff, term: c.term,
                  departed: c.departed.sorted { $0.key < $1.key }.map { id, d in
                      ClusterDeparture(sessionID: id.description, userID: d.user, version: d.version, byGateway: d.byGateway, atMs: d.at)
                  })
    }

    /// The copy this record carries; nil when its channel is invalid.
    var copy: ChannelCopy<NodeInstance>? {
        guard let key = try? Validate.channel(channelName, channelType) else { return nil }
        var departed: [SessionID: ChannelMachine<NodeInstance>.Departure] = [:]
        for d in self.departed {
            guard let id = SessionID(text: d.sessionID), Validate.isIdentifier(d.userID) else { continue }
            departed[id] = .init(user: d.userID, version: d.version, byGateway: d.byGateway, at: d.atMs)
        }
        return ChannelCopy(key: key, sequence: sequence, term: term, full: full, handoff: handoff,
                           members: members.compactMap(\.copy), departed: departed)
    }
}

extension ClusterSessionChannel {
    init(_ key: ChannelKey, withPresence: Bool) {
        self.init(channelName: key.name, channelType: key.type, withPresence: withPresence)
    }
    var key: ChannelKey? { try? Validate.channel(channelName, channelType) }
}

extension ClusterHomeSession {
    init(_ id: SessionID, _ s: HomeRecord<NodeInstance>.Session) {
        self.init(sessionID: id.description, gateway: s.sink.id,
                  channels: s.channels.sorted { $0.key < $1.key }.map { ClusterSessionChannel($0.key, withPresence: $0.value) },
                  watching: s.watching, gatewayBoot: s.sink.boot, version: s.version, statusStamp: s.statusStamp,
                  watchingStamp: s.watchingStamp)
    }

    /// The record this carries (nil without a valid session id and gateway).
    var record: (SessionID, HomeRecord<NodeInstance>.Session)? {
        guard let id = SessionID(text: sessionID), Validate.isIdentifier(gateway),
              watching.count <= Limits.maxWatchedPerSession, channels.count <= Limits.maxChannelsPerSession else { return nil }
        var joined: [ChannelKey: Bool] = [:]
        for c in channels { if let k = c.key { joined[k] = c.withPresence } }
        var s = HomeRecord.Session(sink: NodeInstance(gateway, boot: gatewayBoot), version: version, channels: joined,
                                   watching: watching.filter(Validate.isIdentifier))
        s.statusStamp = statusStamp
        s.watchingStamp = watchingStamp
        return (id, s)
    }
}

extension ClusterUserRecord {
    init(_ c: HomeCopy) {
        let r = c.record
        self.init(userID: r.userID, chosen: r.chosen, everOpened: r.everOpened,
                  sessions: r.sessions.sorted { $0.key < $1.key }.map { ClusterHomeSession($0.key, $0.value) },
                  watchers: r.watchers.sorted { $0.key < $1.key }.map {
                      ClusterSessionRef(sessionID: $0.key.description, gateway: $0.value.sink.id, gatewayBoot: $0.value.sink.boot, version: $0.value.version,
                                    write: $0.value.write)
                  },
                  term: r.term, chosenVersion: r.chosenVersion,
                  departed: r.departed.sorted { $0.key < $1.key }.map { id, d in
                      ClusterDeparture(sessionID: id.description, version: d.version, byGateway: d.byGateway, atMs: d.at)
                  },
                  counter: r.counterValue, handoff: c.handoff,
                  unwatched: r.unwatches.map { ClusterUnwatched(sessionID: $0.session.description, epoch: $0.epoch, write: $0.write) })
    }

    /// The copy this record carries; nil when its user id is invalid.
    var copy: HomeCopy? {
        guard let user = try? Validate.userID(userID) else { return nil }
        var sessions: DenseDictionary<SessionID, HomeRecord<NodeInstance>.Session> = [:]
        for s in self.sessions { if let (id, r) = s.record { sessions[id] = r } }
        var watchers: [SessionID: HomeRecord<NodeInstance>.Watcher] = [:]
        for w in self.watchers {
            if let id = SessionID(text: w.sessionID), let sink = w.sink { watchers[id] = .init(sink: sink, version: w.version, write: w.write) }
        }
        var departed: [SessionID: HomeRecord<NodeInstance>.Departure] = [:]
        for d in self.departed {
            if let id = SessionID(text: d.sessionID) { departed[id] = .init(version: d.version, byGateway: d.byGateway, at: d.atMs) }
        }
        let record = HomeRecord<NodeInstance>(userID: user, term: term, chosen: chosen, chosenVersion: chosenVersion, everOpened: everOpened,
                                              sessions: sessions, watchers: watchers, departed: departed, counter: counter,
                                              unwatched: unwatched.compactMap { u in SessionID(text: u.sessionID).map { ($0, u.epoch, u.write) } })
        return HomeCopy(record: record, handoff: handoff)
    }
}

extension ClusterGoneGateway {
    static func list(_ gone: [NodeInstance: UInt64]) -> [ClusterGoneGateway] {
        gone.sorted { $0.key < $1.key }.map { ClusterGoneGateway(nodeID: $0.key.id, boot: $0.key.boot, goneMs: $0.value / 1_000_000) }
    }

    /// Gone processes and for how long (ns), as a peer said; invalid ids are dropped.
    static func ages(_ list: [ClusterGoneGateway]) -> [NodeInstance: UInt64] {
        var out: [NodeInstance: UInt64] = [:]
        for g in list where Validate.isIdentifier(g.nodeID) {
            out[NodeInstance(g.nodeID, boot: g.boot)] = g.goneMs.multipliedReportingOverflow(by: 1_000_000).overflow ? .max : g.goneMs * 1_000_000
        }
        return out
    }
}

extension ClusterChannelFact {
    init(_ key: ChannelKey, _ f: ChannelFact, at me: NodeInstance) {
        self.init(channelName: key.name, channelType: key.type,
                  session: ClusterSessionRef(sessionID: f.session.description, userID: f.user, gateway: me.id, withPresence: f.withPresence,
                                             gatewayBoot: me.boot, version: f.joinVersion),
                  state: f.state, stateVersion: f.stateVersion)
    }
}

extension ClusterHomeFact {
    init(_ user: String, _ f: HomeFact, at me: NodeInstance) {
        switch f {
        case .session(let id, let record):
            self.init(userID: user, session: ClusterHomeSession(id, record))
        case .watcher(let id, let version):
            self.init(userID: user, session: ClusterHomeSession(sessionID: id.description, gateway: me.id, gatewayBoot: me.boot, version: version), watcher: true)
        }
    }
}
