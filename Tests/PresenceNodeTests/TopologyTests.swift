import ClusterCore
@testable import PresenceNode
import Testing

@Suite struct TopologyTests {
    /// A node of a five-node ring back from death (the others took its keys over meanwhile),
    /// having heard "handoff done" from every member but `slow`.
    private func backFromDeath(waitingFor slow: String) -> (Topology, HashRing) {
        let (t, ring) = n4OnFiveNodes(ready: true)
        t.returnedFromDeath(incarnation: 2)
        for m in ring.members where m != "n4" && m != slow { t.handoffDone(from: m, fingerprint: ring.fingerprint, toIncarnation: 2) }
        return (t, ring)
    }

    /// Node n4 with the ring of n1-n5 installed and carried out; `ready`: it had joined before.
    private func n4OnFiveNodes(ready: Bool) -> (Topology, HashRing) {
        let members = ["n1", "n2", "n3", "n4", "n5"]
        let t = Topology(me: "n4", boot: 9, replicationFactor: 2, handoffLimit: 3_600_000_000_000, ready: ready)
        let ring = HashRing(members: members, boots: Dictionary(uniqueKeysWithValues: members.enumerated().map { ($1, UInt64($0 + 1)) }))
        _ = t.update(ring: ring)
        t.settled(ring.fingerprint)
        return (t, ring)
    }

    /// A call or push whose direct link failed goes through a member the failure detector holds
    /// alive: not the destination, not this node, and not one suspected or dead but still on the
    /// ring (it would cost the attempt its whole timeout).
    @Test func aRelayIsAMemberHeldAliveOtherThanTheDestinationAndThisNode() {
        let (t, _) = n4OnFiveNodes(ready: true)
        #expect(t.relays(for: "n1") == ["n2", "n3", "n5"], "no failure detector wired: every other member")
        t.readHealth { $0 != "n2" }
        #expect(t.relays(for: "n1") == ["n3", "n5"])
        #expect(t.relays(for: "n3") == ["n1", "n5"])
    }

    /// Members' incarnations are read through a lookup membership sets once; reading it costs the
    /// same on the millionth call as on the first (a closure kept bare in a `Mutex` was rewrapped
    /// on every read, and overflowed the stack after about 100,000: see `ObserverSlot`).
    @Test func anIncarnationLookupReadAMillionTimesStaysFlat() {
        let t = Topology(me: "n1", boot: 1, replicationFactor: 2)
        #expect(t.incarnation(of: "n2") == 0, "no lookup set: none known")
        t.readIncarnations { $0 == "n2" ? 7 : nil }
        var sum: UInt64 = 0
        for _ in 0..<1_000_000 { sum &+= t.incarnation(of: "n2") }
        #expect(sum == 7_000_000 && t.incarnation(of: "n3") == 0)
    }

    /// A node that just joined serves no key until every member has said it handed off: the
    /// cluster may have been mid-change as it came (a member restarted at the same moment, or a
    /// key's owner died and another took it over), so the owner by the ring without it may not be
    /// the node that holds a key.
    @Test func aNodeThatJustJoinedServesNoKeyUntilEveryMemberHandedOff() throws {
        let (t, ring) = n4OnFiveNodes(ready: false)
        t.markReady()
        for m in ["n1", "n2", "n5"] { t.handoffDone(from: m, fingerprint: ring.fingerprint, toIncarnation: 2) }
        let homedHere = (0..<2_000).map { "u\($0)" }.filter { ring.home(ofUser: $0) == "n4" }
        let fromN1 = try #require(homedHere.first { ring.removing("n4").home(ofUser: $0) == "n1" })
        #expect(t.notServing(users: [fromN1])?.hasPrefix("HANDOFF_IN_PROGRESS") == true)
        t.handoffDone(from: "n3", fingerprint: ring.fingerprint, toIncarnation: 2)
        #expect(t.notServing(users: [fromN1]) == nil)
    }

    /// Found by Cluster/chaos (netns seed 51): a node back from a crash answered a Watch of several
    /// users while one of them still waited for its handoff (only the first user was checked). The
    /// record created from nothing, copied to the replica as a new lineage, replaced its sessions;
    /// a resume then found none. A call is refused while any of its users waits.
    @Test func aCallForSeveralUsersIsRefusedWhileAnyOfThemWaitsForItsHandoff() throws {
        let (t, ring) = backFromDeath(waitingFor: "n3")
        let before = ring.removing("n4")
        let homedHere = (0..<2_000).map { "u\($0)" }.filter { ring.home(ofUser: $0) == "n4" }
        let ready = try #require(homedHere.first { before.home(ofUser: $0) == "n1" })
        let waiting = try #require(homedHere.first { before.home(ofUser: $0) == "n3" })
        #expect(t.notServing(users: [ready]) == nil)
        #expect(t.notServing(users: [waiting])?.hasPrefix("HANDOFF_IN_PROGRESS") == true)
        #expect(t.notServing(users: [ready, waiting])?.hasPrefix("HANDOFF_IN_PROGRESS") == true)
        #expect(t.notServing(users: [waiting, ready])?.hasPrefix("HANDOFF_IN_PROGRESS") == true)
        t.handoffDone(from: "n3", fingerprint: ring.fingerprint, toIncarnation: 2)
        #expect(t.notServing(users: [ready, waiting]) == nil)
    }

    /// RELIABILITY.md, invariant 7 (`RoutingWindow`): a node counts as cut off from the cluster only
    /// when it has other members and none answered its probes for `cutOffAfter`; never when alone,
    /// never while it is joining, and not within the lease and its slack (counted, before its first
    /// answer, from the moment it served with others).
    @Test func aNodeIsCutOffOnlyWhenItsOtherMembersWereSilentForTheWholeSpan() {
        let t = Topology(me: "n1", boot: 1, replicationFactor: 2, lease: 600, cutOffAfter: 1_000)
        t.heardFromCluster(at: 10_000)
        #expect(!t.isCutOff(now: 50_000), "a node alone in its ring is never cut off")
        _ = t.update(ring: HashRing(members: ["n1", "n2", "n3"], boots: ["n1": 1, "n2": 2, "n3": 3]))
        #expect(!t.isCutOff(now: 11_000))
        #expect(t.isCutOff(now: 11_001))
        t.heardFromCluster(at: 11_500)
        #expect(!t.isCutOff(now: 12_000))

        let joining = Topology(me: "n1", boot: 1, replicationFactor: 2, lease: 600, cutOffAfter: 1_000, ready: false)
        _ = joining.update(ring: HashRing(members: ["n1", "n2"], boots: ["n1": 1, "n2": 2]))
        #expect(!joining.isCutOff(now: 1_000_000), "nothing heard yet: joining, not cut off")

        // ready with other members but never answered (cut off just after its join): the span
        // counts from the moment it served with them (found in CI, test_netns)
        let partitionedEarly = Topology(me: "n1", boot: 1, replicationFactor: 2, lease: 600, cutOffAfter: 1_000, ready: false)
        _ = partitionedEarly.update(ring: HashRing(members: ["n1", "n2"], boots: ["n1": 1, "n2": 2]), now: 5_000)
        partitionedEarly.markReady(now: 20_000)
        #expect(!partitionedEarly.isCutOff(now: 21_000))
        #expect(partitionedEarly.isCutOff(now: 21_001))
        let grown = Topology(me: "n1", boot: 1, replicationFactor: 2, lease: 600, cutOffAfter: 1_000)
        _ = grown.update(ring: HashRing(members: ["n1", "n2"], boots: ["n1": 1, "n2": 2]), now: 30_000)
        #expect(!grown.isCutOff(now: 31_000))
        #expect(grown.isCutOff(now: 31_001))

        let never = Topology(me: "n1", boot: 1, replicationFactor: 2, lease: 600)
        _ = never.update(ring: HashRing(members: ["n1", "n2"], boots: ["n1": 1, "n2": 2]))
        never.heardFromCluster(at: 1)
        #expect(!never.isCutOff(now: 1_000_000), "without a span (a single-node setting) never cut off")
    }
}
