import ClusterCore
import EventLoop
import PresenceCore
import PresenceWire

/// Owns a share of this node's channels outright (no locks), in two roles: the channels it owns
/// (each a `ChannelMachine` whose sessions' sinks are gateway node ids; it carries out the events
/// the machine computes, once per gateway, and copies every change to the replicas), and the
/// copies it holds as a replica (taken over when the ring makes this node their owner). It also
/// times out the sessions of gateways that died, unless their clients resume them elsewhere.
/// Runs on an event loop: a call arriving on that loop's connections reaches it without a thread hop.
actor ChannelShard {
    nonisolated let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private var channels: [ChannelKey: ChannelMachine<String>] = [:]
    /// Replica copies of channels other nodes own.
    private var copies: [ChannelKey: ChannelMachine<String>] = [:]
    /// Copies that arrived as a handoff from their live owner (nothing was lost: no SNAPSHOT on taking over).
    private var handedOff = Set<ChannelKey>()
    private let maxInstantEvents: Int
    private let intervalNanoseconds: UInt64
    private let presenceTimeout: UInt64
    private let clock: EngineClock
    private let fabric: Fabric
    private var intervalChannels = Set<ChannelKey>()
    private var ticker: Task<Void, Never>? = nil

    struct Orphan: Hashable, Sendable {
        let key: ChannelKey
        let user: String
        let session: SessionID
    }
    private var orphans = OrphanTimers<Orphan>()
    /// How long an orphan may still wait once its gateway is back on the ring.
    static let rejoinGrace: UInt64 = 2_000_000_000
    /// Orphan deadlines that came with replica copies, started if this node takes the channel over.
    private var copyOrphans: [Orphan: UInt64] = [:]
    /// Replica copies sent by the call being handled: the call answers once they arrived.
    private var replicaTickets: [PeerLink.Ticket] = []
    private var orphanSweeper: Task<Void, Never>? = nil

    init(maxInstantEvents: Int, intervalNanoseconds: UInt64, presenceTimeout: UInt64, clock: EngineClock, fabric: Fabric, loop: EventLoop) {
        self.loop = loop
        self.maxInstantEvents = maxInstantEvents
        self.intervalNanoseconds = intervalNanoseconds
        self.presenceTimeout = presenceTimeout
        self.clock = clock
        self.fabric = fabric
    }

    private var me: String { fabric.me }

    // MARK: Deliveries and replication

    private func deliver(_ deliveries: [Delivery], in machine: ChannelMachine<String>) {
        for d in deliveries {
            let bytes = EventEncoding.framed(d.event)
            switch d.to {
            case .session(let id):
                guard let node = machine.sink(of: id) else { continue }
                fabric.deliver(to: node, sessions: [id], channel: machine.key, snapshot: d.event.type == .snapshot, framed: bytes)
            case .subscribers(let except):
                for node in machine.subscriberSinks.keys {
                    fabric.deliver(to: node, channel: machine.key, except: except, framed: bytes)
                }
            }
        }
    }

    /// Copies the records of `users` to the channel's replicas.
    private func replicate(_ key: ChannelKey, users: [String]) {
        let replicas = fabric.topology.owners(of: key).filter { $0 != me }
        guard !replicas.isEmpty else { return }
        let m = channels[key]
        var record = ClusterChannelRecord(channelName: key.name, channelType: key.type, sequence: m?.sequence ?? 0)
        record.members = users.map { u in ClusterMemberRecord(m?.copy(of: u) ?? MemberCopy(userID: u, sessions: [], state: [])) }
        for r in replicas {
            if let t = fabric.send(record, to: r) { replicaTickets.append(t) }
        }
    }

    /// A channel's whole state as records, in chunks (the first replaces what the receiver held).
    /// Sessions whose gateway is gone carry the time left before they time out.
    private func fullRecords(_ m: ChannelMachine<String>, handoff: Bool = false) -> [ClusterChannelRecord] {
        let now = clock.monotonicNanoseconds()
        let all = m.copies.map { c -> ClusterMemberRecord in
            var r = ClusterMemberRecord(c)
            for (i, s) in c.sessions.enumerated() {
                r.sessions[i].orphanMs = orphans.millisecondsLeft(Orphan(key: m.key, user: c.userID, session: s.id), now: now)
            }
            return r
        }
        var out: [ClusterChannelRecord] = []
        var i = 0
        repeat {
            out.append(ClusterChannelRecord(channelName: m.key.name, channelType: m.key.type, sequence: m.sequence, full: i == 0,
                                            members: Array(all[i..<min(all.count, i + 500)]), handoff: handoff))
            i += 500
        } while i < all.count
        return out
    }

    /// Starts timers for this channel's sessions that no live gateway holds (`Fabric.isStray`).
    private func orphanStrays(_ key: ChannelKey) {
        guard let m = channels[key] else { return }
        let deadline = clock.monotonicNanoseconds() + presenceTimeout
        let alive = fabric.topology.alive
        for sink in m.allSinks where !alive.contains(sink) || sink == me {
            for (user, s) in m.sessions(at: sink) where fabric.isStray(s, at: sink) {
                orphans.start(Orphan(key: key, user: user, session: s), deadline: deadline)
            }
        }
        if !orphans.isEmpty { startSweeping() }
    }

    /// Runs `body` on the channel's machine (created on demand, changed in place), delivers the
    /// events it computed, copies `user`'s record to the replicas, and drops the channel once
    /// nobody is in it.
    private func update<R>(_ key: ChannelKey, user: String?, create: Bool, _ body: (inout ChannelMachine<String>) throws(PresenceError) -> ([Delivery], R)) throws(PresenceError) -> R? {
        if channels[key] == nil {
            guard create else { return nil }
            channels[key] = ChannelMachine(key: key, maxInstantEvents: maxInstantEvents)
        }
        let deliveries: [Delivery]
        let result: R
        do {
            (deliveries, result) = try body(&channels[key]!)
        } catch {
            if channels[key]!.isEmpty { channels[key] = nil }
            throw error
        }
        let machine = channels[key]!
        deliver(deliveries, in: machine)
        if machine.isIntervalMode { startTicking(key) } else { intervalChannels.remove(key) }
        if machine.isEmpty { channels[key] = nil }
        if let user { replicate(key, users: [user]) }
        return result
    }

    // MARK: Calls (this node owns the channel)

    /// Carries out one call on a channel this node owns. The tickets are the replica copies of
    /// what it changed: the caller answers once they arrived, so an acknowledged change survives
    /// this node's death.
    func handle(_ call: ClusterChannelCall, key: ChannelKey) -> (ClusterChannelResult, [PeerLink.Ticket]) {
        replicaTickets = []
        defer { replicaTickets = [] }
        do {
            return (try perform(call, key: key), replicaTickets)
        } catch {
            return (ClusterChannelResult(error: error.wire), replicaTickets)
        }
    }

    private func session(_ call: ClusterChannelCall) throws(PresenceError) -> (SessionID, String, String) {
        guard let ref = call.session, let id = SessionID(text: ref.sessionID), !ref.gateway.isEmpty else {
            throw PresenceError(.invalidArgument, "INVALID_SESSION_ID", "the call carries no valid session")
        }
        let user = try Validate.userID(ref.userID)
        return (id, user, ref.gateway)
    }

    private func perform(_ call: ClusterChannelCall, key: ChannelKey) throws(PresenceError) -> ClusterChannelResult {
        let now = clock.wallMilliseconds()
        var result = ClusterChannelResult()
        switch call.op {
        case .join, .announce:
            let (id, user, gateway) = try session(call)
            let withPresence = call.session?.withPresence ?? false
            let pending = try Validate.stateItems(call.items)
            orphans.cancel(Orphan(key: key, user: user, session: id))
            _ = try update(key, user: user, create: true) { m in
                let d = call.op == .join
                    ? m.join(user: user, session: id, withPresence: withPresence, sink: gateway, pendingState: pending, now: now)
                    : m.announce(user: user, session: id, withPresence: withPresence, sink: gateway, now: now)
                return (d, ())
            }
        case .leave:
            let (id, user, gateway) = try session(call)
            orphans.cancel(Orphan(key: key, user: user, session: id))
            // only the session's current gateway may take it out (it may have moved to another)
            guard channels[key]?.sink(of: id) == gateway else {
                result.userGone = !(channels[key]?.contains(user: user) ?? false)
                return result
            }
            let gone = try update(key, user: user, create: false) { m in
                (m.leave(user: user, session: id, timedOut: call.timedOut, now: now), !m.contains(user: user))
            }
            result.userGone = gone ?? true
        case .setState:
            let (id, user, _) = try session(call)
            let items = try Validate.stateItems(call.items)
            _ = try update(key, user: user, create: false) { m throws(PresenceError) in
                (try m.setState(user: user, session: id, items: items, now: now), ())
            }
        case .removeState:
            let (id, user, _) = try session(call)
            for k in call.keys { try Validate.stateKey(k) }
            _ = try update(key, user: user, create: false) { m in
                (m.removeState(user: user, session: id, keys: call.keys, now: now), ())
            }
        case .getState:
            let user = try Validate.userID(call.userID)
            if let items = channels[key]?.state(of: user) {
                result.found = true
                result.state = items
            }
        case .list:
            let m = channels[key]
            result.total = UInt32(m?.occupancy ?? 0)
            if !call.countOnly, let m {
                let (users, next) = m.page(after: call.after.isEmpty ? nil : call.after, includeState: call.includeState)
                result.users = users
                result.next = next ?? ""
            }
        case .resnapshot:
            let (id, _, _) = try session(call)
            if let m = channels[key], let d = m.resnapshot(for: id, now: now) { deliver([d], in: m) }
        case .unspecified, .unrecognized:
            throw PresenceError(.invalidArgument, "UNKNOWN_OPERATION", "unknown channel operation")
        }
        return result
    }

    // MARK: Replicas, handoff, failover

    /// A record from the channel's owner (replication) or its previous owner (handoff). When the
    /// ring already makes this node the owner, it is merged into the channel served here.
    func apply(_ record: ClusterChannelRecord, key: ChannelKey) {
        let owned = channels[key] != nil || fabric.topology.owner(of: key) == me
        // a record reaching a channel this node already serves is another version of it (each
        // side of a partition kept one): merged, never simply replacing what is here
        let merging = channels[key] != nil
        var m = (owned ? channels[key] : copies[key]) ?? ChannelMachine(key: key, maxInstantEvents: maxInstantEvents)
        if record.full && !owned {
            m = ChannelMachine(key: key, maxInstantEvents: maxInstantEvents)
        }
        let now = clock.monotonicNanoseconds()
        for r in record.members {
            guard let c = r.copy else { continue }
            if merging { m.merge(c) } else { m.install(c) }
            // the sender's clock runs on only for gateways this node also sees gone (its own view decides)
            for s in r.sessions where s.orphanMs > 0 {
                guard let id = SessionID(text: s.sessionID), fabric.isStray(id, at: s.gateway) else { continue }
                let o = Orphan(key: key, user: c.userID, session: id)
                let deadline = OrphanTimers<Orphan>.deadline(millisecondsLeft: s.orphanMs, now: now, cap: presenceTimeout)
                if owned { orphans.start(o, deadline: deadline) } else { copyOrphans[o] = deadline }
            }
        }
        m.advanceSequence(to: record.sequence)
        if owned {
            channels[key] = m.isEmpty ? nil : m
            if m.isIntervalMode { startTicking(key) }
            if !m.isEmpty {
                replicate(key, users: record.members.map(\.userID))
                orphanStrays(key)
            }
        } else {
            copies[key] = m.isEmpty ? nil : m
            if record.handoff { handedOff.insert(key) }
        }
    }

    /// The ring changed: hand off channels that moved away, take over copies this node now owns,
    /// bring new replicas up to date, and start timing out sessions whose gateway is gone.
    func ringChanged(from old: HashRing, to new: HashRing, alive: Set<String>) {
        let rf = fabric.topology.replicationFactor
        for (key, m) in channels {
            switch RingMove.owned(keyHash: StableHash.of(key), from: old, to: new, me: me, copies: rf) {
            case .handOff(let newOwner, let keepCopy):
                for r in fullRecords(m, handoff: true) { fabric.send(r, to: newOwner) }
                channels[key] = nil
                // its timers went with the records; kept here they would fire if it came back
                for o in orphans.keys where o.key == key { orphans.cancel(o) }
                intervalChannels.remove(key)
                if keepCopy { copies[key] = m }
            case .keep(let newReplicas):
                for r in newReplicas { for rec in fullRecords(m) { fabric.send(rec, to: r) } }
            }
        }
        let now = clock.wallMilliseconds()
        for (key, m) in copies {
            switch RingMove.copy(keyHash: StableHash.of(key), from: old, to: new, me: me, copies: rf) {
            case .takeOver(let previous, let newReplicas):
                copies[key] = nil
                channels[key] = m
                for (o, deadline) in copyOrphans where o.key == key && fabric.isStray(o.session, at: m.sink(of: o.session) ?? me) {
                    orphans.start(o, deadline: deadline)
                }
                if !handedOff.contains(key), previous != me {
                    // the previous owner died: events may have been lost on the way
                    deliver(m.snapshotForAll(now: now), in: m)
                }
                if m.isIntervalMode { startTicking(key) }
                for r in newReplicas { for rec in fullRecords(m) { fabric.send(rec, to: r) } }
            case .keep:
                break
            case .drop:
                copies[key] = nil
            }
        }
        handedOff = []
        copyOrphans = copyOrphans.filter { copies[$0.key.key] != nil }
        // sessions whose gateway is gone time out unless resumed elsewhere
        for key in channels.keys { orphanStrays(key) }
        // a gateway believed dead is back (a partition healed, a false death): give its re-announce
        // time to arrive before its sessions time out (if it restarted, they still do), and ask it
        // which of them it still holds (those need not wait)
        let back = orphans.gatewaysBack(grace: clock.monotonicNanoseconds() + Self.rejoinGrace) { o in
            guard let sink = channels[o.key]?.sink(of: o.session), sink != me, alive.contains(sink) else { return nil }
            return (sink, o.session)
        }
        fabric.askWhichLive(back) { [weak self] live, gateway in await self?.gatewayHolds(live, at: gateway) }
    }

    /// A returning gateway still holds these sessions: they are not orphans.
    private func gatewayHolds(_ live: Set<SessionID>, at gateway: String) {
        for o in orphans.keys where live.contains(o.session) { orphans.cancel(o) }
    }

    /// Hands every channel to the node that owns it once this node is gone (graceful leave).
    func handOffAll(to ring: HashRing) {
        for (key, m) in channels {
            guard let owner = ring.owner(of: key) else { continue }
            for r in fullRecords(m, handoff: true) { fabric.send(r, to: owner) }
        }
    }

    private func startSweeping() {
        guard orphanSweeper == nil else { return }
        orphanSweeper = periodically(every: 100_000_000) { [weak self] in await self?.sweepOrphans() ?? false }
    }

    /// Times out orphans whose deadline passed; false once none are left.
    private func sweepOrphans() -> Bool {
        let now = clock.wallMilliseconds()
        for o in orphans.due(now: clock.monotonicNanoseconds()) {
            // a session resumed elsewhere (or re-announced by a gateway that was wrongly declared
            // dead) cancelled its timer; what is left has no gateway any more, even if a node
            // with the same id has restarted since
            guard channels[o.key]?.sink(of: o.session) != nil else { continue }
            _ = try? update(o.key, user: o.user, create: false) { m in
                (m.leave(user: o.user, session: o.session, timedOut: true, now: now), ())
            }
        }
        if orphans.isEmpty {
            orphanSweeper = nil
            return false
        }
        return true
    }

    // MARK: Counters

    var channelCount: Int { channels.count }
    var copyCount: Int { copies.count }

    // MARK: Interval mode

    private func startTicking(_ key: ChannelKey) {
        intervalChannels.insert(key)
        guard ticker == nil else { return }
        let period = intervalNanoseconds
        ticker = periodically(every: period) { [weak self] in await self?.tick() ?? false }
    }

    /// Sends each interval channel's INTERVAL event; false once no channel needs ticking.
    private func tick() -> Bool {
        let now = clock.wallMilliseconds()
        for key in intervalChannels {
            _ = try? update(key, user: nil, create: false) { m in (m.tick(now: now), ()) }
        }
        if intervalChannels.isEmpty {
            ticker = nil
            return false
        }
        return true
    }
}
