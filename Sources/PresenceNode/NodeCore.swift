import ClusterCore
import EventLoop
import GRPCTransport
import PresenceCore
import PresenceWire

/// A node without its doors: the routing state, SWIM membership, the peer link and the presence
/// engine, wired to each other, and what its peer port serves. `Node` puts the gRPC, peer and HTTP
/// servers around it; the deterministic simulation runs it as it is, on its own seams
/// (RELIABILITY.md, "The real node in a deterministic simulation"): the same code either way.
public final class NodeCore: Sendable {
    public let topology: Topology
    public let membership: Membership
    public let link: PeerLink
    public let engine: PresenceEngine
    /// What the peer port serves (membership, routed presence calls, pushes, anti-entropy).
    public let peerServices: ServiceRegistry
    private let ringChanges: AsyncStream<(HashRing, HashRing)>.Continuation
    private let ringTask: Task<Void, Never>

    /// The seams a node runs on: where its shard actors run (`loops`) and its membership's timers
    /// (the first loop), how it reaches peers, time, and where its own tasks run.
    public struct Seams: Sendable {
        public var loops: [EventLoop]
        public var transport: PeerTransport
        public var clock: EngineClock
        public var placement: TaskPlacement
        public var peerAuth: PeerRequestAuth?

        public init(loops: [EventLoop], transport: PeerTransport, clock: EngineClock, placement: TaskPlacement, peerAuth: PeerRequestAuth?) {
            self.loops = loops
            self.transport = transport
            self.clock = clock
            self.placement = placement
            self.peerAuth = peerAuth
        }
    }

    /// `peerAddress`/`clientAddress`: as gossiped until `start` gives the bound ones; `seeds`:
    /// peer addresses to join through (none: a cluster of its own); `boot`: this process.
    public init(settings: EngineSettings, replicationFactor: Int, peerAddress: String, clientAddress: String, seeds: [HostPort],
                boot: UInt64 = Topology.newBoot(), seams: Seams, logger: Logger) {
        let topology = Topology(me: settings.nodeID, boot: boot, replicationFactor: replicationFactor,
                                handoffLimit: settings.timings.handoffLimit, lease: settings.timings.lease,
                                cutOffAfter: settings.timings.cutOffAfter,
                                ready: !seeds.contains { $0.description != peerAddress }, clock: seams.clock)
        self.topology = topology
        let membership = Membership(nodeID: settings.nodeID, peerAddress: peerAddress, clientAddress: clientAddress, seeds: seeds,
                                    loop: seams.loops[0], transport: seams.transport, peerAuth: seams.peerAuth,
                                    settings: SWIM.Settings(probeInterval: settings.timings.probeInterval), topology: topology,
                                    clock: seams.clock, placement: seams.placement, logger: logger)
        self.membership = membership
        let link = PeerLink(me: { topology.instance }, timings: settings.timings,
                            relays: { node in topology.relays(for: node) },
                            trace: logger.debugTrace, transport: seams.transport, clock: seams.clock, placement: seams.placement) { [weak membership] id in
            membership?.peerAddress(of: id)
        }
        self.link = link
        let engine = PresenceEngine(settings: settings, loops: seams.loops, clock: seams.clock, placement: seams.placement,
                                    topology: topology, link: link, logger: logger)
        self.engine = engine
        // ring changes are carried out one at a time, in the order membership saw them
        let (changes, queue) = AsyncStream.makeStream(of: (HashRing, HashRing).self)
        membership.onRingChange { old, new in queue.yield((old, new)) }
        // a node that refuted its own death: owners may have lost its pushes or timed sessions out
        membership.onRefute { engine.antiEntropy.runSoon() }
        membership.onDeclaredDead { engine.ring.returnedFromDeath(incarnation: $0) }
        topology.readIncarnations { [weak membership] in membership?.incarnation(of: $0) }
        topology.readHealth { [weak membership] in membership?.isHealthy($0) ?? false }
        membership.onMemberAlive { engine.ring.memberAlive($0) }
        ringChanges = queue
        ringTask = seams.placement.start {
            for await (old, new) in changes {
                logger.info("ring changed", ["members": new.members.map { "\($0)@\(new.boot(of: $0))" }.joined(separator: ","),
                                             "was": old.members.map { "\($0)@\(old.boot(of: $0))" }.joined(separator: ",")])
                await engine.ring.ringChanged(from: old, to: new)
            }
        }
        var peerRegistry = ServiceRegistry()
        membership.register(in: &peerRegistry)
        PeerPresenceService(engine: engine, membership: membership).register(in: &peerRegistry)
        peerServices = peerRegistry
    }

    /// Starts probing, joins through the seeds, starts the engine's periodic work.
    public func start(peerAddress: String, clientAddress: String) {
        membership.start(peerAddress: peerAddress, clientAddress: clientAddress)
        engine.start()
    }

    /// Graceful stop (SIGTERM), the node's own part: hands everything off (it owns nothing from
    /// then on), ends the client streams (their clients resume on other nodes), says goodbye and
    /// stops taking ring changes, then stops the engine. `step` hears each stage as it ends.
    /// The streams end before the goodbye: the others start the presence timeout of this node's
    /// sessions when they hear it, and a client must never have less than the whole timeout to
    /// resume (said after, a resume sent just inside the timeout, as the client counts it, could
    /// find the session timed out). It waits for the streams' ends to be sent, and a margin more
    /// for them to reach their clients (`ClusterTimings.goodbyeMargin`).
    public func shutdown(step: (String) -> Void = { _ in }) async {
        await engine.ring.handOffBeforeLeaving(timeout: 2_000_000_000)
        step("handed off")
        await engine.endAllStreams()
        await engine.core.clock.sleep(nanoseconds: engine.settings.timings.goodbyeMargin)
        step("client streams ended")
        await membership.leave()
        ringChanges.finish()
        step("left the cluster")
        await engine.stop()
        step("engine stopped")
    }

    /// Stops without a word to anyone: what others see of a crash.
    public func halt() async {
        membership.halt()
        ringChanges.finish()
        ringTask.cancel()
        await engine.stop()
    }
}
