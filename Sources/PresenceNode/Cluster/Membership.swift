import Metrics
import ClusterCore
import EventLoop
import Foundation
import GRPCTransport
import PresenceCore
import PresenceWire
import Synchronization

/// Runs SWIM for this node: carries out what `SWIM.Instance` decides (probes over the peer link,
/// timers on an event loop), answers other nodes' probes, joins through the seeds, and keeps the
/// hash ring of alive members up to date. The instance itself is pure; this is only its shell.
public final class Membership: Sendable {
    public let nodeID: String
    private let addresses: Mutex<(peer: String, client: String)>
    public var peerAddress: String { addresses.withLock { $0.peer } }
    public var clientAddress: String { addresses.withLock { $0.client } }
    /// Where SWIM's timers run (its probe period, probe timeouts, suspicions).
    private let loop: EventLoop
    /// The seams: peers are reached through `transport`, time is read from `clock`, and the
    /// tasks this shell starts (probes, joins) run on `placement`.
    let transport: PeerTransport
    private let clock: EngineClock
    private let placement: TaskPlacement
    private let seeds: [HostPort]
    /// Signs and checks each peer request (when the cluster has a secret).
    let peerAuth: PeerRequestAuth?
    private let replay = Mutex(ReplayWindow())
    private let logger: Logger
    private let swim: Mutex<SWIM.Instance>
    private let clientAddresses = Mutex<[String: String]>([:])
    private let relayWaiters = Mutex<[String: CheckedContinuation<ClusterPingResponse?, Never>]>([:])
    private let running = Atomic<Bool>(false)
    public let settings: SWIM.Settings
    /// Routing state shared with the engine; this shell keeps its ring current.
    public let topology: Topology
    /// Called with (old ring, new ring) after every ring change, in order.
    private let ringObserver = ObserverSlot<(HashRing, HashRing)>()
    /// Called when this node refuted a suspicion or death of itself (others may have timed its
    /// sessions out meanwhile: its gateway re-announces them).
    private let refuteObserver = ObserverSlot<Void>()
    private let deathObserver = ObserverSlot<UInt64>()
    private let aliveObserver = ObserverSlot<String>()
    /// Seeds that turned out to be this node under another name (a DNS seed list).
    private let selfSeeds = Mutex<Set<String>>([])
    /// How often seeds that are not live members are joined through again (`keepFindingSeeds`).
    let seedRecheck: UInt64 = 2_000_000_000
    /// Derives the ring from SWIM's view (remembers recent deaths for `RingQuorum`).
    private let ringRule: Mutex<MembershipRing>
    private let lastDeath = Atomic<UInt64>(0)
    /// What SWIM saw since the start (for metrics).
    public let counters = MembershipCounters()

    /// This node learnt it was declared dead: at most once a second, it announces its return with
    /// a new incarnation (`s`: SWIM, held by the caller), returned for the engine to be told
    /// (`deathObserver`) that others may have taken its keys over; nil when it was just told.
    private func declaredDead(incarnation: UInt64? = nil, swim s: inout SWIM.Instance) -> UInt64? {
        let now = clock.monotonicNanoseconds()
        let last = lastDeath.load(ordering: .relaxed)
        guard last == 0 || now - last > 1_000_000_000, lastDeath.compareExchange(expected: last, desired: now, ordering: .relaxed).exchanged else {
            // (the same news again, from other members' gossip: already being handled)
            logger.debug("declared dead again", ["incarnation": incarnation.map(String.init) ?? "-"])
            return nil
        }
        let returnedAs = s.announceReturn()
        logger.warning("this node was declared dead and is back", ["incarnation": incarnation.map(String.init) ?? "-", "returned_as": String(returnedAs)])
        return returnedAs
    }
    /// `declaredDead(swim:)` from outside the SWIM lock; the engine is told after it is released.
    private func declaredDead(incarnation: UInt64? = nil) {
        if let returnedAs = swim.withLock({ declaredDead(incarnation: incarnation, swim: &$0) }) { deathObserver(returnedAs) }
    }
    private let lastIncarnation = Atomic<UInt64>(0)
    /// The process each member was last known as (to tell a restart from a status change).
    private let knownBoots = Mutex<[String: UInt64]>([:])
    private var myBoot: UInt64 { swim.withLock { $0.myself.boot } }
    /// A node with seeds that no seed answered within this long starts a cluster of its own.
    public let aloneAfter: UInt64 = 3_000_000_000

    /// A node's membership on the given seams: `transport` to reach peers, `clock`, `placement`
    /// for its tasks and `loop` for its timers.
    public init(nodeID: String, peerAddress: String, clientAddress: String, seeds: [HostPort], loop: EventLoop,
                transport: PeerTransport, peerAuth: PeerRequestAuth?, settings: SWIM.Settings = SWIM.Settings(), topology: Topology? = nil,
                clock: EngineClock, placement: TaskPlacement, logger: Logger) {
        self.transport = transport
        self.clock = clock
        self.placement = placement
        self.nodeID = nodeID
        ringRule = Mutex(MembershipRing(me: nodeID))
        self.addresses = Mutex((peerAddress, clientAddress))
        self.seeds = seeds
        self.loop = loop
        self.logger = logger
        self.settings = settings
        self.peerAuth = peerAuth
        let topology = topology ?? Topology(me: nodeID, replicationFactor: 1)
        self.topology = topology
        swim = Mutex(SWIM.Instance(id: nodeID, address: peerAddress, settings: settings, seed: clock.randomBits(), boot: topology.boot))
    }

    /// Whether the cluster has a secret (peer calls must carry a `cluster-auth` signature).
    var hasClusterSecret: Bool { peerAuth != nil }

    /// A request's headers, before its body is read: without a well-formed, current signature it
    /// is refused at once (its body is never kept). Nil: go on.
    @Sendable func refuseEarly(path: String, metadata: [(String, String)]) -> GRPCStatus? {
        guard let peerAuth else { return nil }
        let value = metadata.first(where: { $0.0 == PeerRequestAuth.header })?.1
        guard let why = peerAuth.refusesEarly(value, now: clock.wallMilliseconds()) else { return nil }
        return GRPCStatus(.unauthenticated, "CLUSTER_AUTH: \(why)")
    }

    /// The whole request, before its message is decoded: the signature must match the method, the
    /// time and the message, and not have been used before (a replay).
    @Sendable func refuse(path: String, metadata: [(String, String)], message: [UInt8]) -> GRPCStatus? {
        guard let peerAuth else { return nil }
        let now = clock.wallMilliseconds()
        switch peerAuth.check(metadata.first(where: { $0.0 == PeerRequestAuth.header })?.1, method: path, message: message[...], now: now) {
        case .failure(let refusal):
            return GRPCStatus(.unauthenticated, "CLUSTER_AUTH: \(refusal.reason)")
        case .success(let mac):
            guard replay.withLock({ $0.admit(mac, now: now) }) else {
                return GRPCStatus(.unauthenticated, "CLUSTER_AUTH: this request was already received (a replay)")
            }
            return nil
        }
    }

    // MARK: State for others

    /// What this node knows of every member.
    public var members: [SWIM.Update] { swim.withLock { $0.fullState } }
    public var ring: HashRing { topology.ring }

    /// Sets what runs after each ring change (the engine's handoff and anti-entropy).
    public func onRingChange(_ observer: @escaping @Sendable (HashRing, HashRing) -> Void) {
        ringObserver.set { observer($0.0, $0.1) }
    }

    public func onRefute(_ observer: @escaping @Sendable () -> Void) {
        refuteObserver.set { observer() }
    }

    /// Sets what runs when this node learns it was declared dead (it refuted): the others took its
    /// keys over meanwhile.
    public func onDeclaredDead(_ observer: @escaping @Sendable (UInt64) -> Void) {
        deathObserver.set(observer)
    }

    /// Sets what runs when another member is (again) believed alive.
    public func onMemberAlive(_ observer: @escaping @Sendable (String) -> Void) {
        aliveObserver.set(observer)
    }

    /// The peer address of a live member; nil for anyone else.
    public func peerAddress(of id: String) -> String? {
        swim.withLock { s -> String? in
            guard let m = s.members[id], m.status == .alive || m.status == .suspect, id != nodeID else { return nil }
            return m.address
        }
    }
    public var myIncarnation: UInt64 { swim.withLock { $0.myself.incarnation } }
    /// The incarnation this node knows `id` at (nil: not a member it knows).
    public func incarnation(of id: String) -> UInt64? { swim.withLock { $0.members[id]?.incarnation } }
    /// Whether this node holds `id` alive (not suspected, not dead).
    public func isHealthy(_ id: String) -> Bool { swim.withLock { $0.members[id]?.status == .alive } }

    /// Recomputes the ring from SWIM's view (`MembershipRing`: a restart is two changes, and a
    /// node in a minority keeps its ring). Holding the SWIM lock while the topology changes keeps
    /// ring changes in the order membership changed.
    private func updateRing() {
        swim.withLock { s in
            let now = clock.monotonicNanoseconds()
            let current = topology.ring
            let (outcome, wasInMinority) = ringRule.withLock { r in
                let was = r.inMinority
                return (r.next(after: current, view: s.fullState, now: now), was)
            }
            switch outcome {
            case .keep(let healthy, let suspected, let lost):
                if !wasInMinority {
                    logger.warning("this node sees only a minority of the cluster: it keeps its ring until it sees more",
                                   ["healthy": String(healthy), "suspected": String(suspected), "lost": String(lost)])
                }
            case .install(let steps):
                if wasInMinority {
                    logger.info("this node sees a majority of the cluster again")
                    // Cut off, it was most likely declared dead, and the majority took its keys
                    // over; it may hear so only after this ring change (found by Cluster/chaos,
                    // netns partitions: it served a SNAPSHOT of its stale copy in between). So it
                    // waits for the others to hand back before the change, as if told.
                    // (told under the SWIM lock: before the ring change it precedes)
                    if let returnedAs = declaredDead(swim: &s) { deathObserver(returnedAs) }
                }
                for step in steps {
                    guard let old = topology.update(ring: step) else { continue }
                    // the observer only queues the change; calling it under the lock keeps changes in order
                    counters.ringChanges.add()
                    ringObserver((old, step))
                }
            }
        }
    }

    // MARK: Running

    /// Starts probing and joins through the seeds (retrying in the background until one answers).
    /// The addresses are the ones actually bound (a port 0 is known only then).
    public func start(peerAddress: String, clientAddress: String) {
        addresses.withLock { $0 = (peerAddress, clientAddress) }
        let settings = self.settings
        let boot = topology.boot
        // The peer port answers from the moment it is bound, so members may have joined through
        // it already: what they told is kept (replacing the instance forgot them, and until they
        // were heard again every push to them, a handoff's "done" among them, was dropped as
        // for a dead member — found by the netns test on CI's slower machine: a fresh cluster
        // held keys back for the whole handoff limit). Only an address that changed on binding
        // (port 0, which nobody could reach before) needs a new instance.
        swim.withLock { s in
            guard s.myself.address != peerAddress else { return }
            s = SWIM.Instance(id: nodeID, address: peerAddress, settings: settings, seed: clock.randomBits(), boot: boot)
        }
        running.store(true, ordering: .relaxed)
        scheduleTick()
        guard seeds.contains(where: { $0.description != peerAddress }) else {
            topology.markReady()
            return
        }
        placement.start { [self] in
            var attempt = 0
            let started = clock.monotonicNanoseconds()
            while running.load(ordering: .relaxed) {
                if await joinThroughSeeds(firstOnly: true) {
                    topology.markReady()
                    await keepFindingSeeds()
                    return
                }
                if !topology.isReady && clock.monotonicNanoseconds() - started > aloneAfter {
                    logger.warning("no seed answered: serving as a cluster of one until one does")
                    topology.markReady()
                }
                attempt += 1
                if attempt == 1 || attempt % 10 == 0 { logger.warning("no seed answered yet; retrying", ["seeds": seeds.map(\.description).joined(separator: ",")]) }
                await clock.sleep(nanoseconds: 500_000_000)
            }
        }
    }

    /// Joins through the seeds, in order: up to the first that answers (`firstOnly`), or every
    /// seed that is not a member this node sees alive. Whether any answered.
    private func joinThroughSeeds(firstOnly: Bool) async -> Bool {
        let me = swim.withLock { $0.myself }
        let seen = Set(swim.withLock { $0.fullState }.filter { $0.status == .alive || $0.status == .suspect }.map(\.address))
        var answered = false
        for seed in seeds where seed.description != peerAddress && !selfSeeds.withLock({ $0.contains(seed.description) }) {
            if !firstOnly && seen.contains(seed.description) { continue }
            let req = ClusterJoinRequest(member: wire(me))
            let resp: ClusterJoinResponse
            do {
                resp = try await transport.unary(seed.description, MembershipMethods.join, req, timeout: 1_000_000_000)
            } catch let e as GRPCStatus where e.message.hasPrefix("JOIN_SELF") {
                selfSeeds.withLock { _ = $0.insert(seed.description) }  // this node, by another name
                continue
            } catch {
                continue
            }
            let now = clock.monotonicNanoseconds()
            topology.heardFromCluster(at: now)  // (an answer from a member, as a probe's is)
            let ds = swim.withLock { s -> [SWIM.Directive] in
                var out: [SWIM.Directive] = []
                for m in resp.members { if let u = self.update(m) { out += s.receivedJoin(u, now: now) } }
                return out
            }
            carryOut(ds)
            if firstOnly { logger.info("joined the cluster", ["seed": seed.description, "members": String(resp.members.count)]) }
            answered = true
            if firstOnly { return true }
        }
        return answered
    }

    /// Nodes that start at the same moment can join through different seeds and form separate
    /// clusters that never hear of each other (SWIM only gossips among members it knows): seeds
    /// this node does not see as live members are joined through again, soon after the first join
    /// and then every `seedRecheck`, for as long as the node runs.
    private func keepFindingSeeds() async {
        while running.load(ordering: .relaxed) {
            _ = await joinThroughSeeds(firstOnly: false)
            await clock.sleep(nanoseconds: seedRecheck)
        }
    }

    /// Graceful leave: every live member is told at once (`SWIM.Instance.leave`); then stop probing.
    public func leave() async {
        guard running.exchange(false, ordering: .relaxed) else { return }
        let (directives, boot) = swim.withLock { s in (s.leave(), s.myself.boot) }
        await withTaskGroup(of: Void.self) { group in
            for case .sendPing(_, let address, let sequence, let gossip) in directives {
                let request = ClusterPingRequest(fromNodeID: nodeID, fromAddress: peerAddress, sequence: sequence, gossip: gossip.map(wire), fromBoot: boot)
                group.addTask { [transport] in _ = try? await transport.unary(address, MembershipMethods.ping, request, timeout: 300_000_000) }
            }
        }
        transport.close()
    }

    /// Stops without a word to anyone (tests use it to play a crash).
    public func halt() {
        running.store(false, ordering: .relaxed)
        transport.close()
    }

    private func scheduleTick() {
        let period = settings.probeInterval
        loop.execute { [self] in
            loop.scheduleTimer(after: period) { [self] in
                guard running.load(ordering: .relaxed) else { return }
                let now = clock.monotonicNanoseconds()
                // a tick far later than asked for: this process was frozen (a paused VM, SIGSTOP)
                // long enough to be declared dead, and others may hold its keys now
                if let frozen = swim.withLock({ $0.frozenSinceLastTick(now: now) }) {
                    logger.warning("this node was frozen for \(frozen / 1_000_000) ms", [:])
                    declaredDead()
                    carryOut(swim.withLock { $0.syncViewAfterFreeze(now: now) })
                }
                let (ds, incarnation) = swim.withLock { s in (s.periodTick(now: now), s.myself.incarnation) }
                carryOut(ds)
                if lastIncarnation.exchange(incarnation, ordering: .relaxed) < incarnation {
                    logger.warning("refuted a suspicion of this node", ["incarnation": String(incarnation)])
                    counters.refutations.add()
                    refuteObserver(())
                }
                scheduleTick()
            }
        }
    }

    // MARK: Directives

    private func carryOut(_ directives: [SWIM.Directive]) {
        for d in directives {
            switch d {
            case .sendPing(let to, let address, let seq, let gossip):
                let req = ClusterPingRequest(fromNodeID: nodeID, fromAddress: peerAddress, sequence: seq, gossip: gossip.map(wire), fromBoot: myBoot)
                let timeout = settings.probeInterval * 2
                placement.start { [self] in
                    guard let resp = try? await transport.unary(address, MembershipMethods.ping, req, timeout: timeout) else { return }
                    let now = clock.monotonicNanoseconds()
                    topology.heardFromCluster(at: now)
                    carryOut(swim.withLock { $0.receivedAck(from: to, sequence: resp.sequence, gossip: resp.gossip.compactMap(self.update), now: now) })
                }
            case .sendAck(let to, _, let seq, let gossip):
                // acks travel as responses: hand it to the indirect probe that waits for it
                let waiter = relayWaiters.withLock { $0.removeValue(forKey: "\(to)#\(seq)") }
                waiter?.resume(returning: ClusterPingResponse(fromNodeID: nodeID, sequence: seq, gossip: gossip.map(wire)))
            case .sendPingRequest(_, let address, let target, let targetAddress, let seq, let gossip):
                let req = ClusterIndirectPingRequest(fromNodeID: nodeID, fromAddress: peerAddress, targetNodeID: target,
                                                     targetAddress: targetAddress, sequence: seq, gossip: gossip.map(wire), fromBoot: myBoot)
                let timeout = settings.probeInterval * 2
                placement.start { [self] in
                    guard let resp = try? await transport.unary(address, MembershipMethods.indirectPing, req, timeout: timeout) else { return }
                    let now = clock.monotonicNanoseconds()
                    topology.heardFromCluster(at: now)
                    carryOut(swim.withLock { $0.receivedAck(from: target, sequence: seq, gossip: resp.gossip.compactMap(self.update), now: now) })
                }
            case .scheduleProbeTimeout(let seq, let at):
                loop.execute { [self] in
                    loop.scheduleTimer(at: at) { [self] in
                        let now = clock.monotonicNanoseconds()
                        carryOut(swim.withLock { $0.probeTimedOut(sequence: seq, now: now) })
                    }
                }
            case .scheduleSuspicionCheck(let at):
                loop.execute { [self] in
                    loop.scheduleTimer(at: at) { [self] in
                        let now = clock.monotonicNanoseconds()
                        carryOut(swim.withLock { $0.suspicionsDue(now: now) })
                    }
                }
            case .declaredDead(let incarnation):
                declaredDead(incarnation: incarnation)
            case .syncView(let with, let address):
                // (a join's exchange: it carries this node's refutation there, and that member's view back)
                let req = ClusterJoinRequest(member: wire(swim.withLock { $0.myself }))
                placement.start { [self] in
                    guard let resp = try? await transport.unary(address, MembershipMethods.join, req, timeout: settings.probeInterval * 2) else {
                        guard running.load(ordering: .relaxed) else { return }
                        let now = clock.monotonicNanoseconds()
                        carryOut(swim.withLock { $0.viewRequestFailed(with: with, now: now) })
                        return
                    }
                    let now = clock.monotonicNanoseconds()
                    topology.heardFromCluster(at: now)
                    carryOut(swim.withLock { $0.receivedView(resp.members.compactMap(self.update), from: with, now: now) })
                    topology.viewRefreshed()
                }
            case .memberChanged(let u):
                logger.info("member \(u.status)", ["member": u.id, "address": u.address, "incarnation": String(u.incarnation), "boot": String(u.boot)])
                switch u.status {
                case .suspect: counters.suspicions.add()
                case .dead: counters.deaths.add()
                case .alive, .left: break
                }
                let restarted = knownBoots.withLock { b -> Bool in
                    defer { b[u.id] = u.boot }
                    return b[u.id].map { $0 != u.boot } ?? false
                }
                if u.id == nodeID { topology.adoptBoot(u.boot) }
                ringRule.withLock { $0.noted(u, now: clock.monotonicNanoseconds()) }
                if u.status == .dead || u.status == .left || (restarted && u.id != nodeID) {
                    // its connection may be stuck in TCP retransmission (a partition), or lead to a
                    // process that is gone: if it comes back, talk to it over a fresh one
                    transport.forget(u.address)
                }
                updateRing()
                if u.status == .alive && u.id != nodeID { aliveObserver(u.id) }
            }
        }
    }

    // MARK: Peer service

    func handlePing(_ req: ClusterPingRequest) -> ClusterPingResponse {
        let now = clock.monotonicNanoseconds()
        guard Validate.isIdentifier(req.fromNodeID), !req.fromAddress.isEmpty else { return ClusterPingResponse(fromNodeID: nodeID, sequence: req.sequence) }
        var ds = swim.withLock { $0.receivedPing(from: req.fromNodeID, address: req.fromAddress, boot: req.fromBoot, sequence: req.sequence,
                                                   gossip: req.gossip.compactMap(self.update), now: now) }
        var response = ClusterPingResponse(fromNodeID: nodeID, sequence: req.sequence)
        if let i = ds.firstIndex(where: { if case .sendAck(let to, _, let seq, _) = $0 { return to == req.fromNodeID && seq == req.sequence }; return false }),
           case .sendAck(_, _, _, let gossip) = ds[i] {
            response.gossip = gossip.map(wire)
            ds.remove(at: i)
        }
        carryOut(ds)
        return response
    }

    func handleIndirectPing(_ req: ClusterIndirectPingRequest) async throws -> ClusterPingResponse {
        let now = clock.monotonicNanoseconds()
        let key = "\(req.fromNodeID)#\(req.sequence)"
        let wait = settings.probeInterval * 2
        let response = await withCheckedContinuation { (c: CheckedContinuation<ClusterPingResponse?, Never>) in
            // a duplicated request (a lossy link repeats messages) answers the earlier one as failed:
            // each continuation is resumed exactly once
            relayWaiters.withLock { $0.updateValue(c, forKey: key) }?.resume(returning: nil)
            carryOut(swim.withLock {
                $0.receivedPingRequest(from: req.fromNodeID, address: req.fromAddress, target: req.targetNodeID, targetAddress: req.targetAddress,
                                       sequence: req.sequence, gossip: req.gossip.compactMap(self.update), now: now)
            })
            loop.execute { [self] in
                loop.scheduleTimer(after: wait) { [self] in
                    relayWaiters.withLock { $0.removeValue(forKey: key) }?.resume(returning: nil)
                }
            }
        }
        guard let response else { throw GRPCStatus(.unavailable, "PROBE_FAILED: \(req.targetNodeID) did not answer") }
        return response
    }

    func handleJoin(_ req: ClusterJoinRequest) throws -> ClusterJoinResponse {
        guard let m = req.member, let u = self.update(m) else { throw GRPCStatus(.invalidArgument, "JOIN: no member") }
        // a seed list may name this node itself (by a DNS name): joining yourself is no join
        guard u.id != nodeID else { throw GRPCStatus(.failedPrecondition, "JOIN_SELF: \(nodeID) cannot join through itself") }
        let now = clock.monotonicNanoseconds()
        carryOut(swim.withLock { $0.receivedJoin(u, now: now) })
        return ClusterJoinResponse(members: swim.withLock { $0.sharedView }.map(wire))
    }

    public func register(in registry: inout ServiceRegistry) {
        registry.unary(MembershipMethods.ping) { [self] req, ctx in
            return handlePing(req)
        }
        registry.unary(MembershipMethods.indirectPing) { [self] req, ctx in
            return try await handleIndirectPing(req)
        }
        registry.unary(MembershipMethods.join) { [self] req, ctx in
            return try handleJoin(req)
        }
    }

    // MARK: Wire mapping

    /// A member's client address, as it gossiped it ("" while unknown).
    public func clientAddress(of id: String) -> String {
        id == nodeID ? clientAddress : clientAddresses.withLock { $0[id] ?? "" }
    }

    func wire(_ u: SWIM.Update) -> ClusterMemberUpdate {
        let status: ClusterMemberStatus
        switch u.status {
        case .alive: status = .alive
        case .suspect: status = .suspect
        case .dead: status = .dead
        case .left: status = .left
        }
        return ClusterMemberUpdate(nodeID: u.id, address: u.address, status: status, incarnation: u.incarnation,
                                   clientAddress: clientAddress(of: u.id), boot: u.boot, accuser: u.accuser)
    }

    /// Reads a gossiped update, remembering the member's client address (for admin tools).
    func update(_ m: ClusterMemberUpdate) -> SWIM.Update? {
        if !m.clientAddress.isEmpty, !m.nodeID.isEmpty, m.nodeID != nodeID {
            clientAddresses.withLock { $0[m.nodeID] = m.clientAddress }
        }
        let status: SWIM.Status
        switch m.status {
        case .alive: status = .alive
        case .suspect: status = .suspect
        case .dead: status = .dead
        case .left: status = .left
        default: return nil
        }
        guard Validate.isIdentifier(m.nodeID), !m.address.isEmpty, m.accuser.isEmpty || Validate.isIdentifier(m.accuser) else { return nil }
        return SWIM.Update(id: m.nodeID, address: m.address, status: status, incarnation: m.incarnation, boot: m.boot,
                           accuser: status == .suspect ? m.accuser : "")
    }
}

/// Counts of what SWIM saw (for metrics): members suspected and declared dead, refutations of
/// this node's own suspicion or death, and ring changes.
public final class MembershipCounters: Sendable {
    public let suspicions = Counter()
    public let deaths = Counter()
    public let refutations = Counter()
    public let ringChanges = Counter()
    public init() {}
}
