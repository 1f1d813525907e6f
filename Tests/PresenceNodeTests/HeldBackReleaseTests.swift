import ClusterCore
import EventLoop
@testable import PresenceNode
import PresenceCore
import PresenceWire
import Testing

/// A channel shard's held-back keys (`Keyspace.heldBack`) and the calls that reach them.
@Suite struct HeldBackReleaseTests {
    /// A key a handoff started while the handoff gate waited is held back: its followers' SNAPSHOTs
    /// wait for the release loop's next look once the gate opens. A call the gate lets through
    /// before that look releases the key first; served while it is held back, the call's events
    /// would reach followers that do not follow this owner yet, and be lost to them.
    @Test func aCallThatReachesAKeyStillHeldBackReleasesItFirst() async throws {
        let group = EventLoopGroup(count: 1, name: "held-back")
        defer { group.shutdown() }
        let loop = group.loops[0]
        let clock = SystemClock()
        let topology = Topology(me: "n", replicationFactor: 1, handoffLimit: 600_000_000_000, ready: false)   // (a wait that cannot run out in a slow run)
        let ring = HashRing(members: ["n", "o"], boots: ["n": topology.boot, "o": 1])
        let key = try #require((0..<10_000).lazy.map { ChannelKey(name: "k\($0)", type: .message) }.first { ring.owner(of: $0) == "n" })
        // n joins a ring of o: what n owns now moves to it from o, whose handoff it waits for
        _ = topology.update(ring: ring)
        topology.markReady()
        topology.settled(ring.fingerprint)
        topology.heardFromCluster(at: clock.monotonicNanoseconds())
        #expect(topology.notServing(keyHash: StableHash.of(key)) != nil)
        let gateway = LocalGateway(shards: 1, resumeWindow: 1_000_000_000, clock: clock, movedMemory: 1_000_000_000)
        let shard = ChannelShard(maxInstantEvents: 100, intervalNanoseconds: 100_000_000, presenceTimeout: 5_000_000_000, staleHold: 0,
                                 replicationFactor: 1, clock: clock, fabric: Fabric(topology: topology, link: nil, gateway: gateway), loop: loop)
        await shard.ringChanged(to: ring)
        // o's handoff: a user whose session, at gateway g, follows the channel
        var handed = ChannelMachine<NodeInstance>(key: key, maxInstantEvents: 100)
        handed.startLineage(now: clock.wallMilliseconds())
        _ = handed.join(user: "u", session: SessionID(raw: 7), withPresence: true, sink: NodeInstance("g", boot: 1),
                        version: SessionVersion.make(epoch: 1, counter: 1), now: clock.wallMilliseconds())
        for c in handed.fullCopies(handoff: true) { await shard.received(c, from: "o") }
        #expect(await shard.space.heldBack == [key])
        // o says it is done: the gate opens, and a call comes before the release loop looks
        topology.handoffDone(from: "o", fingerprint: ring.fingerprint, toIncarnation: 0)
        #expect(topology.notServing(keyHash: StableHash.of(key)) == nil)
        let (r, _) = await shard.handle(ClusterChannelCall(channelName: key.name, channelType: key.type, op: .list, countOnly: true), key: key)
        #expect(r.error == nil && r.total == 1)
        #expect(await shard.space.heldBack.isEmpty)
    }

    /// The release loop (`ReleaseLoop`): one at a time; a release asked for during a look that
    /// found nothing waiting makes it look once more, else the key held back just after that look
    /// keeps its followers without their SNAPSHOT until the next ring change.
    @Test func aReleaseAskedForDuringTheLoopsLastLookMakesItLookAgain() {
        var loop = ReleaseLoop()
        var started = loop.ask()
        #expect(started && loop.running)
        started = loop.ask()
        #expect(!started)                       // one loop at a time
        loop.looking()
        var next = loop.looked(waiting: true)
        #expect(next == .sleep)
        loop.looking()
        started = loop.ask()                    // asked during the look
        next = loop.looked(waiting: false)
        #expect(!started && next == .lookAgain && loop.running)
        loop.looking()
        next = loop.looked(waiting: false)
        #expect(next == .stop && !loop.running)
        started = loop.ask()
        #expect(started)                        // the next ask starts a new loop
        loop.cancelled()
        #expect(!loop.running)
    }
}
