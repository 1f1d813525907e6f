import ClusterCore
import EventLoop
import PresenceCore
import PresenceWire

/// Owns a share of this node's users (the user-home role): each user's sessions and where they
/// live, the channels each session is in, the status the user chose, and its watchers; plus
/// replica copies of users homed elsewhere. Status changes go once to each watcher's gateway.
/// Sessions and watchers on a gateway that died time out unless resumed elsewhere.
actor UserHomeShard {
    nonisolated let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private var directory = UserDirectory<String>()
    private var copies = UserDirectory<String>()
    private let clock: EngineClock
    private let fabric: Fabric
    private let presenceTimeout: UInt64

    struct Orphan: Hashable, Sendable {
        let user: String
        let session: SessionID
        /// A watcher of `user` (else one of its sessions).
        let watcher: Bool
    }
    private var orphans = OrphanTimers<Orphan>()
    private var orphanSweeper: Task<Void, Never>? = nil
    /// Orphan deadlines that came with replica copies, started if this node becomes their home.
    private var copyOrphans: [Orphan: UInt64] = [:]
    /// Replica copies sent by the call being handled.
    private var replicaTickets: [PeerLink.Ticket] = []

    init(clock: EngineClock, presenceTimeout: UInt64, fabric: Fabric, loop: EventLoop) {
        self.loop = loop
        self.clock = clock
        self.presenceTimeout = presenceTimeout
        self.fabric = fabric
    }

    private var me: String { fabric.me }

    private func notify(_ change: UserDirectory<String>.StatusChange?) {
        guard let change, !change.watchers.isEmpty else { return }
        let bytes = EventEncoding.framed(status: change.userID, change.status, at: clock.wallMilliseconds())
        var byNode: [String: [SessionID]] = [:]
        for (id, node) in change.watchers { byNode[node, default: []].append(id) }
        for (node, ids) in byNode { fabric.deliver(to: node, sessions: ids.sorted(), channel: nil, snapshot: false, framed: bytes) }
    }

    private func replicate(_ users: [String]) {
        for u in users {
            let replicas = fabric.topology.homes(of: u).filter { $0 != me }
            guard !replicas.isEmpty else { continue }
            let record = record(of: u)
            for r in replicas {
                if let t = fabric.send(record, to: r) { replicaTickets.append(t) }
            }
        }
    }

    // MARK: Calls (this node is the users' home)

    /// Carries out one call for users homed here; the tickets are the replica copies it sent.
    func handle(_ call: ClusterHomeCall, users: [String]) -> (ClusterHomeResult, [PeerLink.Ticket]) {
        replicaTickets = []
        defer { replicaTickets = [] }
        do {
            return (try perform(call, users: users), replicaTickets)
        } catch {
            return (ClusterHomeResult(error: error.wire), replicaTickets)
        }
    }

    private func session(_ call: ClusterHomeCall) throws(PresenceError) -> (SessionID, String) {
        guard let ref = call.session, let id = SessionID(text: ref.sessionID), !ref.gateway.isEmpty else {
            throw PresenceError(.invalidArgument, "INVALID_SESSION_ID", "the call carries no valid session")
        }
        return (id, ref.gateway)
    }

    /// A session's list of watched users, as a peer sent it: every id valid, within the limit.
    private func watching(_ call: ClusterHomeCall) throws(PresenceError) -> [String] {
        guard call.watching.count <= Limits.maxWatchedPerSession else {
            throw PresenceError(.resourceExhausted, "WATCH_LIMIT", "a session may watch at most \(Limits.maxWatchedPerSession) users")
        }
        for u in call.watching { _ = try Validate.userID(u, field: "watching") }
        return call.watching
    }

    private func perform(_ call: ClusterHomeCall, users: [String]) throws(PresenceError) -> ClusterHomeResult {
        var result = ClusterHomeResult()
        guard let user = users.first else { return result }
        switch call.op {
        case .sessionOpened:
            let (id, gateway) = try session(call)
            orphans.cancel(Orphan(user: user, session: id, watcher: false))
            if call.announce {
                var channels: [ChannelKey: Bool] = [:]
                for c in call.channels { if let k = c.key { channels[k] = c.withPresence } }
                let record = UserDirectory<String>.SessionRecord(sink: gateway, channels: channels, watching: try watching(call))
                notify(directory.announce(user, session: id, record: record))
            } else {
                notify(directory.sessionOpened(user, session: id, sink: gateway, initial: call.status))
            }
            if call.status != .unknown && call.announce { notify(directory.setStatus(user, call.status)) }
            replicate([user])
        case .sessionEnded:
            let (id, gateway) = try session(call)
            // only the session's current gateway may end it (it may have moved to another)
            if directory.session(user, id)?.sink == gateway {
                orphans.cancel(Orphan(user: user, session: id, watcher: false))
                notify(directory.sessionEnded(user, session: id))
                replicate([user])
            }
        case .setStatus:
            notify(directory.setStatus(user, call.status))
            replicate([user])
        case .sessionJoined, .sessionLeft:
            let (id, _) = try session(call)
            guard let c = call.channel, let key = c.key else {
                throw PresenceError(.invalidArgument, "INVALID_CHANNEL", "the call carries no valid channel")
            }
            if call.op == .sessionJoined {
                directory.sessionJoined(user, session: id, channel: key, withPresence: c.withPresence)
            } else {
                directory.sessionLeft(user, session: id, channel: key)
            }
            replicate([user])
        case .sessionWatching:
            let (id, _) = try session(call)
            directory.sessionWatching(user, session: id, watching: try watching(call))
            replicate([user])
        case .channels:
            result.channels = directory.channels(of: user).map { ClusterSessionChannel($0, withPresence: false) }
        case .statuses:
            result.statuses = users.map { UserStatusEntry(userID: $0, status: directory.visibleStatus($0)) }
        case .watch:
            let (id, gateway) = try session(call)
            for u in users {
                orphans.cancel(Orphan(user: u, session: id, watcher: true))
                directory.watch(u, by: id, sink: gateway)
            }
            result.statuses = users.map { UserStatusEntry(userID: $0, status: directory.visibleStatus($0)) }
            replicate(users)
        case .unwatch:
            let (id, gateway) = try session(call)
            for u in users { directory.unwatch(u, by: id, at: gateway) }
            replicate(users)
        case .lookupSession:
            let (id, _) = try session(call)
            if let r = directory.session(user, id) {
                result.found = true
                result.session = ClusterHomeSession(sessionID: id.description, gateway: r.sink,
                                                    channels: r.channels.sorted { $0.key < $1.key }.map { ClusterSessionChannel($0.key, withPresence: $0.value) },
                                                    watching: r.watching)
            }
        case .unspecified, .unrecognized:
            throw PresenceError(.invalidArgument, "UNKNOWN_OPERATION", "unknown home operation")
        }
        return result
    }

    // MARK: Replicas, handoff, failover

    /// A user's record for a replica or a new home; sessions and watchers whose gateway is gone
    /// carry the time left before they time out.
    private func record(of user: String) -> ClusterUserRecord {
        var r = ClusterUserRecord(directory.copy(of: user))
        let now = clock.monotonicNanoseconds()
        func left(_ text: String, watcher: Bool) -> UInt64 {
            SessionID(text: text).map { orphans.millisecondsLeft(Orphan(user: user, session: $0, watcher: watcher), now: now) } ?? 0
        }
        for i in r.sessions.indices { r.sessions[i].orphanMs = left(r.sessions[i].sessionID, watcher: false) }
        for i in r.watchers.indices { r.watchers[i].orphanMs = left(r.watchers[i].sessionID, watcher: true) }
        return r
    }

    func apply(_ record: ClusterUserRecord) {
        guard let c = record.copy else { return }
        let home = fabric.topology.home(of: c.userID) == me
        let now = clock.monotonicNanoseconds()
        let timers = record.sessions.map { ($0.sessionID, $0.gateway, $0.orphanMs, false) } + record.watchers.map { ($0.sessionID, $0.gateway, $0.orphanMs, true) }
        // the sender's clock runs on only for gateways this node also sees gone (its own view decides)
        for (text, gateway, ms, watcher) in timers where ms > 0 {
            guard let id = SessionID(text: text), fabric.isStray(id, at: gateway) else { continue }
            let o = Orphan(user: c.userID, session: id, watcher: watcher)
            let deadline = OrphanTimers<Orphan>.deadline(millisecondsLeft: ms, now: now, cap: presenceTimeout)
            if home { orphans.start(o, deadline: deadline) } else { copyOrphans[o] = deadline }
        }
        if home {
            directory.merge(c)  // another version of a user this home serves (after a partition): merged
            replicate([c.userID])
            orphanStrays(c.userID)
        } else {
            copies.install(c)
        }
    }

    /// Starts timers for the user's sessions and watchers that no live gateway holds (`Fabric.isStray`).
    private func orphanStrays(_ user: String) {
        let c = directory.copy(of: user)
        let deadline = clock.monotonicNanoseconds() + presenceTimeout
        for (id, r) in c.sessions where fabric.isStray(id, at: r.sink) { orphans.start(Orphan(user: user, session: id, watcher: false), deadline: deadline) }
        for (id, sink) in c.watchers where fabric.isStray(id, at: sink) { orphans.start(Orphan(user: user, session: id, watcher: true), deadline: deadline) }
        if !orphans.isEmpty { startSweeping() }
    }

    func ringChanged(from old: HashRing, to new: HashRing, alive: Set<String>) {
        let rf = fabric.topology.replicationFactor
        for u in directory.allUserIDs {
            let record = record(of: u)
            switch RingMove.owned(keyHash: HashRing.hash(ofUser: u), from: old, to: new, me: me, copies: rf) {
            case .handOff(let newHome, let keepCopy):
                fabric.send(record, to: newHome)
                if keepCopy { copies.install(directory.copy(of: u)) }
                directory.remove(u)
                for o in orphans.keys where o.user == u { orphans.cancel(o) }  // they went with the record
            case .keep(let newReplicas):
                for r in newReplicas { fabric.send(record, to: r) }
            }
        }
        for u in copies.allUserIDs {
            switch RingMove.copy(keyHash: HashRing.hash(ofUser: u), from: old, to: new, me: me, copies: rf) {
            case .takeOver(_, let newReplicas):
                directory.install(copies.copy(of: u))
                copies.remove(u)
                for (o, deadline) in copyOrphans where o.user == u {
                    if let gateway = gateway(of: o), fabric.isStray(o.session, at: gateway) { orphans.start(o, deadline: deadline) }
                }
                let record = record(of: u)
                for r in newReplicas { fabric.send(record, to: r) }
            case .keep:
                break
            case .drop:
                copies.remove(u)
            }
        }
        // keep the deadlines of copies still held (watchers are few; they go with their user)
        copyOrphans = copyOrphans.filter { $0.key.watcher || copies.session($0.key.user, $0.key.session) != nil }
        for u in directory.allUserIDs { orphanStrays(u) }
        // a gateway believed dead is back: give its re-announce time to arrive (see ChannelShard)
        let back = orphans.gatewaysBack(grace: clock.monotonicNanoseconds() + ChannelShard.rejoinGrace) { o in
            guard let sink = gateway(of: o), sink != me, alive.contains(sink) else { return nil }
            return (sink, o.session)
        }
        fabric.askWhichLive(back) { [weak self] live, gateway in await self?.gatewayHolds(live, at: gateway) }
    }

    private func gateway(of o: Orphan) -> String? {
        o.watcher ? directory.watcher(o.user, o.session) : directory.session(o.user, o.session)?.sink
    }

    /// A returning gateway still holds these sessions: they are not orphans.
    private func gatewayHolds(_ live: Set<SessionID>, at gateway: String) {
        for o in orphans.keys where live.contains(o.session) { orphans.cancel(o) }
    }

    func handOffAll(to ring: HashRing) {
        for u in directory.allUserIDs {
            guard let home = ring.home(ofUser: u) else { continue }
            fabric.send(record(of: u), to: home)
        }
    }

    private func startSweeping() {
        guard orphanSweeper == nil else { return }
        orphanSweeper = periodically(every: 100_000_000) { [weak self] in await self?.sweepOrphans() ?? false }
    }

    private func sweepOrphans() -> Bool {
        for o in orphans.due(now: clock.monotonicNanoseconds()) {
            if o.watcher {
                directory.unwatch(o.user, by: o.session)
            } else {
                guard directory.session(o.user, o.session) != nil else { continue }
                notify(directory.sessionEnded(o.user, session: o.session))
            }
            replicate([o.user])
        }
        if orphans.isEmpty {
            orphanSweeper = nil
            return false
        }
        return true
    }
}
