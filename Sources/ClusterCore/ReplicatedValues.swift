import PresenceCore
import PresenceWire

/// What a gateway holds for one of its sessions in one channel (anti-entropy): the session's
/// membership there, and the user's state there as the owner last acknowledged it.
public struct ChannelFact: Sendable, Equatable {
    public var session: SessionID
    public var user: String
    public var withPresence: Bool
    public var joinVersion: UInt64
    public var state: [StateItem]
    public var stateVersion: UInt64
    public init(session: SessionID, user: String, withPresence: Bool, joinVersion: UInt64, state: [StateItem], stateVersion: UInt64) {
        self.session = session
        self.user = user
        self.withPresence = withPresence
        self.joinVersion = joinVersion
        self.state = state
        self.stateVersion = stateVersion
    }

    /// The hash both sides compute for this fact.
    public var hash: UInt64 { FactDigest.hash(session.digest, joinVersion, withPresence ? 1 : 0, stateVersion) }
}

/// A later state of a user than the gateway's session holds (another device of the user changed it).
public struct StateCorrection: Sendable, Equatable {
    public var session: SessionID
    public var state: [StateItem]
    public var stateVersion: UInt64
    public init(session: SessionID, state: [StateItem], stateVersion: UInt64) {
        self.session = session
        self.state = state
        self.stateVersion = stateVersion
    }
}

extension ChannelMachine: ReplicatedValue where Sink == NodeInstance {
    public typealias Key = ChannelKey
    public typealias Copy = ChannelCopy<NodeInstance>
    public typealias Output = RoutedDelivery<NodeInstance>
    public typealias GatewayFact = ChannelFact
    public typealias Correction = StateCorrection

    public static func ringHash(of key: ChannelKey) -> UInt64 { StableHash.of(key) }
    public static func key(of copy: Copy) -> ChannelKey { copy.key }
    public static func isFull(_ copy: Copy) -> Bool { copy.full }
    public static func isHandoff(_ copy: Copy) -> Bool { copy.handoff }
    public static func passedOn(_ copy: Copy) -> Copy {
        var c = copy
        c.handoff = false
        return c
    }
    public static func term(of copy: Copy) -> UInt64 { copy.term }
    public static func version(of copy: Copy) -> UInt64 { copy.sequence }
    public var version: UInt64 { sequence }

    public var sinks: Set<NodeInstance> { allSinks }
    public var remembersDepartures: Bool { !departed.isEmpty }

    public func fullCopies(handoff: Bool) -> [Copy] { fullCopies(handoff: handoff, chunk: 500) }

    // (Each change is routed by the channel after it: `routing`, not `route(change())`.)

    public mutating func merge(_ copy: Copy, keepsSessionsOf: (NodeInstance) -> Bool, now: Int64) -> [Output] {
        routing { $0.merge(copy, keepsSessionsOf: keepsSessionsOf, now: now) }
    }

    public mutating func tookOver(now: Int64) -> [Output] { routing { $0.snapshotForAll(now: now) } }

    public mutating func timeOut(at sink: NodeInstance, now: Int64) -> [Output] {
        // (routed as each leave happens: a timed-out subscriber must not be counted for later ones)
        var out: [Output] = []
        for (user, s) in sessions(at: sink) {
            out += routing { $0.leave(user: user, session: s, timedOut: true, byGateway: false, now: now) }
        }
        return out
    }

    public mutating func restart(followersAt node: String, now: Int64) -> [Output] {
        var out: [Output] = []
        for sink in subscriberSinks.keys.sorted() where sink.id == node { out += routing { $0.snapshotForAll(at: sink, now: now) } }  // (a few sinks)
        return out
    }

    public func factHashes(at sink: NodeInstance) -> [UInt64] {
        var out: [UInt64] = []
        forEachPlacement(at: sink) { id, version, withPresence, stateVersion in
            out.append(FactDigest.hash(id.digest, version, withPresence ? 1 : 0, stateVersion))
        }
        return out
    }

    public mutating func reconcile(_ facts: [ChannelFact], from sink: NodeInstance, now: Int64) -> Reconciliation<Output, StateCorrection> {
        var r = Reconciliation<Output, StateCorrection>()
        var mentioned = Set<SessionID>()
        // (one batch: a subscriber restored by one fact is listed the channel with all the others)
        let (_, snapshots) = batched(now: now) { m in
            for f in facts {
                mentioned.insert(f.session)
                let o = m.announce(user: f.user, session: f.session, withPresence: f.withPresence, sink: sink, version: f.joinVersion,
                                   state: f.state, stateVersion: f.stateVersion, now: now)
                r.outputs += m.route(o.deliveries)
                if let v = o.superseded { r.superseded[f.session] = v }
                if let c = o.correction { r.corrections.append(StateCorrection(session: f.session, state: c.state, stateVersion: c.version)) }
            }
        }
        r.outputs = route(snapshots) + r.outputs
        for (_, s) in sessions(at: sink) where !mentioned.contains(s) { r.suspects[s] = place(of: s)?.version ?? 0 }
        return r
    }

    public mutating func removeGone(_ session: SessionID, at sink: NodeInstance, version: UInt64, now: Int64) -> [Output] {
        guard let p = place(of: session), p.sink == sink, p.version <= version else { return [] }
        // "not held there at all" (the maximum) speaks for the epoch this owner placed the session
        // in, no later: recorded as the maximum, the departure would refuse the session's next
        // epochs (it resumed on another gateway) for good
        let v = version == .max ? SessionVersion.make(epoch: SessionVersion.epoch(p.version), counter: 0xffff_ffff) : version
        return routing { $0.leave(user: p.user, session: session, version: v, now: now) }
    }

    /// (A channel learns of a session only from its gateway's join: one its gateway never
    /// opened is simply gone.)
    public mutating func removeNeverOpened(_ session: SessionID, at sink: NodeInstance, now: Int64) -> [Output] {
        removeGone(session, at: sink, version: .max, now: now)
    }

    public mutating func moved(_ session: SessionID, from sink: NodeInstance, to: NodeInstance, version: UInt64, now: Int64) -> [Output] {
        guard let p = place(of: session), p.sink == sink, SessionVersion.epoch(version) > SessionVersion.epoch(p.version) else { return [] }
        // (placed where it went under the version it had here: the move says where the session
        // lives, not that it is still in this channel there — its new gateway says that, at its
        // own version; placed under the later epoch, a membership that ended meanwhile elsewhere
        // would outrank its departure when the versions of the channel are merged)
        let o = announce(user: p.user, session: session, withPresence: p.withPresence, sink: to, version: p.version, now: now)
        return route(o.deliveries)
    }
}

/// What a gateway holds for one of its sessions at a user's home: the session itself (if it is
/// the user's) with its record, or that the session watches the user.
public enum HomeFact: Sendable, Equatable {
    case session(SessionID, HomeRecord<NodeInstance>.Session)
    case watcher(SessionID, version: UInt64)

    public var session: SessionID {
        switch self {
        case .session(let s, _), .watcher(let s, _): s
        }
    }

    /// The hash both sides compute for this fact.
    public var hash: UInt64 {
        switch self {
        case .session(let s, let r): HomeFact.sessionHash(s, r)
        case .watcher(let s, let v): FactDigest.hash(2, s.digest, SessionVersion.epoch(v))
        }
    }

    /// Hashes the session's channels as the text "message:a+,stream:b" (sorted; "+": with presence)
    /// and the users it watches as "u1,u2" (sorted), without making either text: every home
    /// digests each of its sessions for its gateway every anti-entropy round.
    static func sessionHash(_ s: SessionID, _ r: HomeRecord<NodeInstance>.Session) -> UInt64 {
        var channels = StableHash.Stream()
        func add(_ key: ChannelKey, withPresence: Bool) {
            channels.add(key.type == .stream ? "stream:" : "message:")
            channels.add(key.name)
            if withPresence { channels.add(UInt8(ascii: "+")) }
        }
        if r.channels.count <= 1 {
            for (key, withPresence) in r.channels { add(key, withPresence: withPresence) }
        } else {
            for (i, key) in r.channels.keys.sorted().enumerated() {
                if i > 0 { channels.add(UInt8(ascii: ",")) }
                add(key, withPresence: r.channels[key]!)
            }
        }
        var watching = StableHash.Stream()
        for (i, user) in (r.watching.count <= 1 ? r.watching : r.watching.sorted()).enumerated() {
            if i > 0 { watching.add(UInt8(ascii: ",")) }
            watching.add(user)
        }
        return FactDigest.hash(1, s.digest, r.version, channels.value, watching.value)
    }
}

/// A user's home record as replicas and new homes receive it (always whole).
public struct HomeCopy: Sendable, Equatable {
    public var record: HomeRecord<NodeInstance>
    public var handoff: Bool
    public init(record: HomeRecord<NodeInstance>, handoff: Bool) {
        self.record = record
        self.handoff = handoff
    }
}

extension HomeRecord: ReplicatedValue where Sink == NodeInstance {
    public typealias Key = String
    public typealias Copy = HomeCopy
    public typealias Output = StatusChange
    public typealias GatewayFact = HomeFact
    public typealias Correction = Never

    public static func ringHash(of key: String) -> UInt64 { HashRing.hash(ofUser: key) }
    public static func key(of copy: HomeCopy) -> String { copy.record.userID }
    public static func isFull(_ copy: HomeCopy) -> Bool { true }
    public static func isHandoff(_ copy: HomeCopy) -> Bool { copy.handoff }
    public static func passedOn(_ copy: HomeCopy) -> HomeCopy { HomeCopy(record: copy.record, handoff: false) }
    public static func term(of copy: HomeCopy) -> UInt64 { copy.record.term }
    public static func version(of copy: HomeCopy) -> UInt64 { copy.record.counterValue }
    public var version: UInt64 { counterValue }

    public var sinks: Set<NodeInstance> { allSinks }
    /// (a record once opened is kept for good: its `isEmpty` already says so)
    public var remembersDepartures: Bool { false }
    public static var departureMemory: Int64 { 0 }

    public func fullCopies(handoff: Bool) -> [HomeCopy] { [HomeCopy(record: self, handoff: handoff)] }
    public mutating func install(_ copy: HomeCopy) { install(copy.record) }

    public mutating func merge(_ copy: HomeCopy, keepsSessionsOf: (NodeInstance) -> Bool, now: Int64) -> [StatusChange] {
        merge(copy.record, keepsSessionsOf: keepsSessionsOf).map { [$0] } ?? []
    }

    /// A new home: watchers may have missed a change on the way; they are told the current status.
    public mutating func tookOver(now: Int64) -> [StatusChange] { currentStatus().map { [$0] } ?? [] }
    public mutating func timeOut(at sink: NodeInstance, now: Int64) -> [StatusChange] { timeOut(at: sink, now: now).map { [$0] } ?? [] }
    public mutating func restart(followersAt node: String, now: Int64) -> [StatusChange] {
        currentStatus(at: { $0.id == node }).map { [$0] } ?? []
    }

    public func factHashes(at sink: NodeInstance) -> [UInt64] {
        var out: [UInt64] = []
        // (read where they lie: every home is digested for every gateway each round)
        sessions.forEachEntry { id, s in if s.sink == sink { out.append(HomeFact.sessionHash(id, s)) } }
        for (id, w) in watchers where w.sink == sink { out.append(HomeFact.watcher(id, version: w.version).hash) }
        return out
    }

    public mutating func reconcile(_ facts: [HomeFact], from sink: NodeInstance, now: Int64) -> Reconciliation<StatusChange, Never> {
        var r = Reconciliation<StatusChange, Never>()
        var mentioned = Set<SessionID>()
        for f in facts {
            mentioned.insert(f.session)
            switch f {
            case .session(let id, var record):
                record.sink = sink
                let o = announce(session: id, record: record)
                if let c = o.change { r.outputs.append(c) }
                if let v = o.superseded { r.superseded[id] = v }
            case .watcher(let id, let version):
                if let c = restoreWatcher(by: id, sink: sink, version: version) { r.outputs.append(c) }
            }
        }
        for (id, s) in sessions where s.sink == sink && !mentioned.contains(id) { r.suspects[id] = s.version }
        for (id, w) in watchers where w.sink == sink && !mentioned.contains(id) && r.suspects[id] == nil { r.suspects[id] = w.version }
        return r
    }

    public mutating func removeGone(_ session: SessionID, at sink: NodeInstance, version: UInt64, now: Int64) -> [StatusChange] {
        if watchers[session]?.sink == sink { unwatch(by: session, at: sink) }
        guard let s = sessions[session], s.sink == sink, s.version <= version else { return [] }
        return sessionEnded(session: session, version: version, now: now).map { [$0] } ?? []
    }

    public mutating func removeNeverOpened(_ session: SessionID, at sink: NodeInstance, now: Int64) -> [StatusChange] {
        sessionNeverOpened(session: session, at: sink, now: now).map { [$0] } ?? []
    }

    public mutating func moved(_ session: SessionID, from sink: NodeInstance, to: NodeInstance, version: UInt64, now: Int64) -> [StatusChange] {
        guard var s = sessions[session], s.sink == sink, SessionVersion.epoch(version) > SessionVersion.epoch(s.version) else { return [] }
        s.sink = to
        s.version = version
        return announce(session: session, record: s).change.map { [$0] } ?? []
    }
}
