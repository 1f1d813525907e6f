import ClusterCore
import PresenceCore
import Testing

@Suite struct HandoffGateTests {
    let old = HashRing(members: ["a", "b"])
    let new = HashRing(members: ["a", "b", "c"])

    /// A key hash that `c` owns in `new` and `owner` owned in `old`.
    func movedKey(from owner: String) -> UInt64 {
        for i in 0..<100_000 {
            let h = StableHash.of("k\(i)")
            if new.owner(ofHash: h) == "c" && old.owner(ofHash: h) == owner { return h }
        }
        fatalError("no such key")
    }

    @Test func aJoiningNodeWaitsForTheLiveOwnersHandoff() {
        var g = HandoffGate(me: "c", limit: 3_000)
        g.ringChanged(from: old, to: new, alive: ["a", "b", "c"], now: 1_000)
        let fromA = movedKey(from: "a"), fromB = movedKey(from: "b")
        #expect(!g.mayServe(keyHash: fromA, now: 1_001) && !g.mayServe(keyHash: fromB, now: 1_001))
        g.handoffDone(from: "a", fingerprint: new.fingerprint, now: 1_001)
        #expect(g.mayServe(keyHash: fromA, now: 1_002) && !g.mayServe(keyHash: fromB, now: 1_002))
        // a "done" for another ring does not count
        g.handoffDone(from: "b", fingerprint: old.fingerprint, now: 1_002)
        #expect(!g.mayServe(keyHash: fromB, now: 1_003))
        // nor does waiting forever: past the limit it serves
        #expect(g.mayServe(keyHash: fromB, now: 4_000))
    }

    @Test func aDoneThatArrivesBeforeTheRingChangeCounts() {
        var g = HandoffGate(me: "c", limit: 3_000)
        g.handoffDone(from: "a", fingerprint: new.fingerprint, now: 0)
        g.handoffDone(from: "b", fingerprint: new.fingerprint, now: 0)
        g.ringChanged(from: old, to: new, alive: ["a", "b", "c"], now: 0)
        #expect(g.pending.isEmpty)
    }

    @Test func keysOfADeadOwnerAreServedAtOnce() {
        var g = HandoffGate(me: "b", limit: 3_000)
        g.ringChanged(from: HashRing(members: ["a", "b", "c"]), to: HashRing(members: ["b", "c"]), alive: ["b", "c"], now: 0)
        #expect(g.pending == ["c"])  // c may hand off its share of the reshuffle, a cannot
        let h = (0..<100_000).map { StableHash.of("k\($0)") }.first { HashRing(members: ["a", "b", "c"]).owner(ofHash: $0) == "a" }!
        #expect(g.mayServe(keyHash: h, now: 1))
    }

    /// With replicas, a dead owner's keys wait for the live replicas' "done" (each sends its copy
    /// first): the new owner may hold no copy, restarted after the dead owner last reached it.
    @Test func keysOfADeadOwnerWaitForTheirLiveReplicas() {
        let before = HashRing(members: ["a", "b", "c", "d"]), after = before.removing("a")
        var g = HandoffGate(me: "b", limit: 3_000, copies: 3)
        g.ringChanged(from: before, to: after, alive: Set(after.members), now: 0)
        let hashes = (0..<100_000).map { StableHash.of("k\($0)") }
        let withC = hashes.first { before.owners(ofHash: $0, count: 3) == ["a", "b", "c"] }!
        let withD = hashes.first { before.owners(ofHash: $0, count: 3) == ["a", "b", "d"] }!
        let ownedByB = hashes.first { before.owner(ofHash: $0) == "b" }!
        #expect(!g.mayServe(keyHash: withC, now: 1) && !g.mayServe(keyHash: withD, now: 1))
        #expect(g.mayServe(keyHash: ownedByB, now: 1))  // no owner changed: nothing to wait for
        g.handoffDone(from: "c", fingerprint: after.fingerprint, now: 2)
        #expect(g.mayServe(keyHash: withC, now: 3) && !g.mayServe(keyHash: withD, now: 3))
        #expect(g.mayServe(keyHash: withD, now: 3_000))  // the limit holds
    }
}

/// A node still joining learns the members one by one, one ring change each, while each of them
/// says "done" for the whole ring, possibly several changes before this node gets there.
@Suite struct HandoffGateDoneAheadTests {
    let whole = HashRing(members: ["a", "b", "c", "d"])
    var first: HashRing { HashRing(members: ["a", "d"]) }
    var second: HashRing { HashRing(members: ["a", "b", "d"]) }
    /// A key `d` owns on the whole ring that `a` or `b` owned before.
    var key: UInt64 {
        (0..<100_000).map { StableHash.of("k\($0)") }.first { whole.owner(ofHash: $0) == "d" && second.removing("d").owner(ofHash: $0) == "b" }!
    }

    /// (as `Topology.update` calls it while not ready: from the new ring without this node)
    func joinInSteps(_ g: inout HandoffGate, lastAt: UInt64) {
        g.ringChanged(from: first.removing("d"), to: first, alive: Set(first.members), now: 0, joining: true)
        g.ringChanged(from: second.removing("d"), to: second, alive: Set(second.members), now: 20, joining: true)
        g.ringChanged(from: whole.removing("d"), to: whole, alive: Set(whole.members), now: lastAt, joining: true)
    }

    @Test func aDoneForARingTwoChangesAheadCountsOnceTheRingGetsThere() {
        var g = HandoffGate(me: "d", limit: 3_000)
        for n in ["a", "b", "c"] { g.handoffDone(from: n, fingerprint: whole.fingerprint, now: 10) }
        joinInSteps(&g, lastAt: 30)
        #expect(g.pending.isEmpty)
        #expect(g.mayServe(keyHash: key, now: 31))
    }

    @Test func aDoneKeptForARingAheadExpiresWithTheLimit() {
        var g = HandoffGate(me: "d", limit: 3_000)
        for n in ["a", "b", "c"] { g.handoffDone(from: n, fingerprint: whole.fingerprint, now: 10) }
        joinInSteps(&g, lastAt: 3_010)
        #expect(g.pending == ["a", "b", "c"])
        #expect(!g.mayServe(keyHash: key, now: 3_011))
    }

    /// One for the ring this node leaves belongs to that episode: the same ring again later (a
    /// member back after a partition) must be handed off again.
    @Test func aDoneForTheRingLeftIsForgotten() {
        var g = HandoffGate(me: "d", limit: 3_000)
        g.ringChanged(from: second, to: whole, alive: Set(whole.members), now: 0)
        g.handoffDone(from: "a", fingerprint: whole.fingerprint, now: 5)
        g.handoffDone(from: "b", fingerprint: whole.fingerprint, now: 5)
        #expect(g.pending.isEmpty)
        g.ringChanged(from: whole, to: second, alive: Set(second.members), now: 10)
        g.ringChanged(from: second, to: whole, alive: Set(whole.members), now: 20)
        #expect(g.pending == ["a", "b"])
    }

    /// A node that serves keeps none for a ring two changes ahead: a late "done" of an episode
    /// of a ring it left (pushes are retried and relayed) looks the same, and would count when
    /// that ring comes back after a heal, before this episode's handoff arrived.
    @Test func aServingNodeCountsNoLateDoneForARingItLeft() {
        var g = HandoffGate(me: "d", limit: 3_000)
        g.ringChanged(from: second, to: whole, alive: Set(whole.members), now: 0)
        for n in ["a", "b", "c"] { g.handoffDone(from: n, fingerprint: whole.fingerprint, now: 5) }
        #expect(g.pending.isEmpty)
        g.ringChanged(from: whole, to: second, alive: Set(second.members), now: 10)
        g.handoffDone(from: "a", fingerprint: whole.fingerprint, now: 12)  // late, from the episode that ended
        g.ringChanged(from: second, to: first, alive: Set(first.members), now: 14)
        g.ringChanged(from: first, to: whole, alive: Set(whole.members), now: 20)
        #expect(g.pending.contains("a"))
    }

    /// A peer that says "done" for many rings cannot grow what is kept without bound; those that
    /// arrived last are kept.
    @Test func doneForManyRingsIsBounded() {
        var g = HandoffGate(me: "d", limit: 3_000)
        for i in 0..<1_000 { g.handoffDone(from: "a", fingerprint: UInt64(i) &+ 1_000_000, now: UInt64(i)) }
        g.handoffDone(from: "b", fingerprint: whole.fingerprint, now: 1_000)
        #expect(g.doneRingsKept <= 16)
        g.ringChanged(from: second, to: whole, alive: Set(whole.members), now: 1_001)
        #expect(g.pending == ["a"])
    }
}

@Suite struct HandoffGateJoinTests {
    /// A node still waiting as it joins learns the members one ring change at a time: one it
    /// learns of during the wait may hold keys it owns (handed to it by a ring this node never
    /// had, say a member that is joining too), so it is waited for like the others. Once the wait
    /// is over, a member that joins is not (it holds nothing this node owns).
    @Test func aMemberLearntOfDuringTheJoinWaitIsWaitedForToo() {
        let alone = HashRing(members: ["c"]), first = HashRing(members: ["a", "b", "c"]), all = HashRing(members: ["a", "b", "c", "d"])
        let mine = (0..<10_000).map { StableHash.of("k\($0)") }.first { all.owner(ofHash: $0) == "c" }!
        var g = HandoffGate(me: "c", limit: 3_000)
        g.ringChanged(from: alone, to: first, alive: ["a", "b", "c"], now: 0, joining: true)
        g.ringChanged(from: first, to: all, alive: ["a", "b", "c", "d"], now: 10)
        #expect(g.pending == ["a", "b", "d"])
        for n in ["a", "b"] { g.handoffDone(from: n, fingerprint: all.fingerprint, now: 20) }
        #expect(!g.mayServe(keyHash: mine, now: 21))
        g.handoffDone(from: "d", fingerprint: all.fingerprint, now: 30)
        #expect(g.mayServe(keyHash: mine, now: 31))
        // the wait over, a member that joins is not waited for
        let five = HashRing(members: ["a", "b", "c", "d", "e"])
        g.ringChanged(from: all, to: five, alive: ["a", "b", "c", "d", "e"], now: 40)
        #expect(!g.pending.contains("e"))
    }
}

@Suite struct HandoffGateReturnTests {
    @Test func aNodeBackFromDeathServesItsKeysOnlyOnceHandedBack() {
        let ring = HashRing(members: ["a", "b", "c"])
        var g = HandoffGate(me: "c", limit: 3_000)
        // an old "done" for this very ring (from before c was declared dead) must not count
        g.handoffDone(from: "a", fingerprint: ring.fingerprint, now: 0)
        g.returnedFromDeath(ring: ring, incarnation: 1, now: 1_000)
        let mine = (0..<10_000).map { StableHash.of("k\($0)") }.first { ring.owner(ofHash: $0) == "c" }!
        #expect(!g.mayServe(keyHash: mine, now: 1_001))
        #expect(g.pending == ["a", "b"])
        g.handoffDone(from: "a", fingerprint: ring.fingerprint, toIncarnation: 1, now: 1_001)
        g.handoffDone(from: "b", fingerprint: ring.fingerprint, toIncarnation: 1, now: 1_001)
        #expect(g.mayServe(keyHash: mine, now: 1_002))
        // and a silent member does not block it forever
        var h = HandoffGate(me: "c", limit: 3_000)
        h.returnedFromDeath(ring: ring, incarnation: 1, now: 0)
        #expect(!h.mayServe(keyHash: mine, now: 2_999) && h.mayServe(keyHash: mine, now: 3_000))
    }

    /// Back from death, a key waits for every one of its holders on the ring without this node,
    /// not its owner there only: another holder may have owned it meanwhile (its owner there was
    /// away too), and that holder's "done" says it handed it back.
    @Test func aNodeBackFromDeathWaitsForEachHolderOfAKey() throws {
        let ring = HashRing(members: ["a", "b", "c", "d", "e"])
        let without = ring.removing("e")
        let key = try #require((0..<10_000).map { StableHash.of("k\($0)") }.first {
            ring.owner(ofHash: $0) == "e" && without.owners(ofHash: $0, count: 3).count == 3
        })
        let holders = without.owners(ofHash: key, count: 3)
        var g = HandoffGate(me: "e", limit: 3_000, copies: 3)
        g.returnedFromDeath(ring: ring, incarnation: 1, now: 1_000)
        g.handoffDone(from: holders[0], fingerprint: ring.fingerprint, toIncarnation: 1, now: 1_001)
        #expect(!g.mayServe(keyHash: key, now: 1_002), "its owner without e is done; \(holders[1]) may have owned it meanwhile")
        for h in holders.dropFirst() { g.handoffDone(from: h, fingerprint: ring.fingerprint, toIncarnation: 1, now: 1_003) }
        #expect(g.mayServe(keyHash: key, now: 1_004))
    }

    /// A "done" decided while its sender knew this node at an incarnation below the one it
    /// returned from death with was decided before the death: read late (a freeze holds what
    /// reached the process unread), it names a ring this node has again, but what the sender took
    /// over meanwhile has not been handed back. It counts for nothing; one stamped at or above
    /// the return's incarnation counts, and so does any "done" to a node that never returned.
    @Test func aDoneDecidedBeforeTheReturnFromDeathCountsForNothing() {
        let ring = HashRing(members: ["a", "b", "c"])
        let mine = (0..<10_000).map { StableHash.of("k\($0)") }.first { ring.owner(ofHash: $0) == "c" }!
        var g = HandoffGate(me: "c", limit: 3_000)
        g.returnedFromDeath(ring: ring, incarnation: 3, now: 1_000)
        g.handoffDone(from: "a", fingerprint: ring.fingerprint, toIncarnation: 2, now: 1_001)  // read after the return
        g.handoffDone(from: "b", fingerprint: ring.fingerprint, toIncarnation: 3, now: 1_001)
        #expect(!g.mayServe(keyHash: mine, now: 1_002))
        #expect(g.pending == ["a"])
        g.handoffDone(from: "a", fingerprint: ring.fingerprint, toIncarnation: 4, now: 1_003)
        #expect(g.mayServe(keyHash: mine, now: 1_004))
        // a node that never returned counts every "done", whatever it carries
        var joined = HandoffGate(me: "c", limit: 3_000)
        joined.ringChanged(from: ring.removing("c"), to: ring, alive: ["a", "b", "c"], now: 0)
        joined.handoffDone(from: "a", fingerprint: ring.fingerprint, toIncarnation: 0, now: 1)
        joined.handoffDone(from: "b", fingerprint: ring.fingerprint, toIncarnation: 0, now: 1)
        #expect(joined.mayServe(keyHash: mine, now: 2))
    }
}

@Suite struct HandoffGateFreshViewTests {
    /// Back from death, c took a live member's whole view: a member that leaves its ring after
    /// that died by fresh news (it is paused or cut off now) and is not waited for, so c's keys are
    /// served once the live members handed back, not after the whole limit. If it comes back while
    /// c still waits, it is waited for again (it may have owned c's keys meanwhile).
    @Test func aMemberThatDiesAfterTheViewWasRefreshedIsNotWaitedFor() {
        let five = HashRing(members: ["a", "b", "c", "d", "e"])
        let four = five.removing("a")
        let h = (0..<100_000).map { StableHash.of("k\($0)") }.first { four.owner(ofHash: $0) == "c" && five.owner(ofHash: $0) == "c" }!
        var g = HandoffGate(me: "c", limit: 3_000)
        g.returnedFromDeath(ring: five, incarnation: 1, now: 0)
        g.viewRefreshed()
        g.ringChanged(from: five, to: four, alive: Set(four.members), now: 10)
        for n in ["b", "d", "e"] { g.handoffDone(from: n, fingerprint: four.fingerprint, toIncarnation: 1, now: 11) }
        #expect(g.pending.isEmpty && g.mayServe(keyHash: h, now: 12))
        // without a refreshed view, the same death may be c's stale view: a is still waited for
        var stale = HandoffGate(me: "c", limit: 3_000)
        stale.returnedFromDeath(ring: five, incarnation: 1, now: 0)
        stale.ringChanged(from: five, to: four, alive: Set(four.members), now: 10)
        for n in ["b", "d", "e"] { stale.handoffDone(from: n, fingerprint: four.fingerprint, toIncarnation: 1, now: 11) }
        #expect(stale.pending == ["a"] && !stale.mayServe(keyHash: h, now: 12))
        // a back on the ring while c still waits for someone is waited for again
        var back = HandoffGate(me: "c", limit: 3_000)
        back.returnedFromDeath(ring: five, incarnation: 1, now: 0)
        back.viewRefreshed()
        back.ringChanged(from: five, to: four, alive: Set(four.members), now: 10)
        back.ringChanged(from: four, to: five, alive: Set(five.members), now: 20)
        #expect(back.pending.contains("a"))
    }
}

@Suite struct HandoffGateLaterChangeTests {
    /// Found by Cluster/chaos (netns, partition-long): c, cut off alone, kept its ring; back, it
    /// waited for the others to hand back — until its ring dropped a, still dead to it, and that
    /// second change replaced the wait: c served (and sent SNAPSHOTs of) its stale copy.
    @Test func aRingChangeWhileWaitingKeepsTheEarlierWait() {
        let five = HashRing(members: ["a", "b", "c", "d", "e"])
        let four = five.removing("a")
        var g = HandoffGate(me: "c", limit: 3_000)
        g.returnedFromDeath(ring: five, incarnation: 1, now: 1_000)
        // a key c owns on both rings that b held while c was away
        let h = (0..<100_000).map { StableHash.of("k\($0)") }.first {
            five.owner(ofHash: $0) == "c" && four.owner(ofHash: $0) == "c" && five.removing("c").owner(ofHash: $0) == "b"
        }!
        g.ringChanged(from: five, to: four, alive: Set(four.members), now: 1_100)
        #expect(!g.mayServe(keyHash: h, now: 1_101))
        #expect(g.pending == ["a", "b", "d", "e"])  // (a too: c's view that it is dead is stale)
        // a "done" for the ring before does not count; one for the newest covers both changes
        g.handoffDone(from: "b", fingerprint: five.fingerprint, toIncarnation: 1, now: 1_101)
        #expect(!g.mayServe(keyHash: h, now: 1_102))
        for n in ["b", "d", "e"] { g.handoffDone(from: n, fingerprint: four.fingerprint, toIncarnation: 1, now: 1_102) }
        #expect(g.mayServe(keyHash: h, now: 1_103) && g.pending == ["a"])
        // the limit still counts from the latest change
        var late = HandoffGate(me: "c", limit: 3_000)
        defer {
            // a member that was off the ring for a while is waited for again once it is back: it
            // held c's keys while c was away (found by Cluster/chaos too: a, dead to c, came back)
            var back = HandoffGate(me: "c", limit: 3_000)
            back.returnedFromDeath(ring: five, incarnation: 1, now: 0)
            back.ringChanged(from: five, to: four, alive: Set(four.members), now: 10)
            for n in ["b", "d", "e"] { back.handoffDone(from: n, fingerprint: five.fingerprint, toIncarnation: 1, now: 15) }
            back.ringChanged(from: four, to: five, alive: Set(five.members), now: 20)
            let fromA = (0..<100_000).map { StableHash.of("k\($0)") }.first { five.owner(ofHash: $0) == "c" && five.removing("c").owner(ofHash: $0) == "a" }!
            #expect(back.pending == ["a"])  // (b, d and e said done for this ring already)
            #expect(!back.mayServe(keyHash: fromA, now: 21))
            back.handoffDone(from: "a", fingerprint: five.fingerprint, toIncarnation: 1, now: 21)
            #expect(back.mayServe(keyHash: fromA, now: 22))
        }
        late.returnedFromDeath(ring: five, incarnation: 1, now: 0)
        late.ringChanged(from: five, to: four, alive: Set(four.members), now: 2_000)
        #expect(!late.mayServe(keyHash: h, now: 4_999) && late.mayServe(keyHash: h, now: 5_000))
    }

    /// Found by Cluster/chaos (netns, partition-long): back, c installed the ring without a and b,
    /// which it had believed dead while cut off; they had held c's keys meanwhile, and were alive.
    @Test func aNodeBackFromDeathWaitsForTheMembersItBelievedDeadToo() {
        let five = HashRing(members: ["a", "b", "c", "d", "e"])
        let three = five.removing("a").removing("b")
        var g = HandoffGate(me: "c", limit: 3_000)
        g.returnedFromDeath(ring: five, incarnation: 1, now: 0)
        let h = (0..<100_000).map { StableHash.of("k\($0)") }.first {
            three.owner(ofHash: $0) == "c" && five.removing("c").owner(ofHash: $0) == "a"
        }!
        g.ringChanged(from: five, to: three, alive: Set(three.members), now: 10)
        #expect(!g.mayServe(keyHash: h, now: 11))
        #expect(g.pending == ["a", "b", "d", "e"])
        for n in ["a", "b", "d", "e"] { g.handoffDone(from: n, fingerprint: three.fingerprint, toIncarnation: 1, now: 11) }
        #expect(g.mayServe(keyHash: h, now: 12))
        // and past the limit it serves whatever happened to them
        var h2 = HandoffGate(me: "c", limit: 3_000)
        h2.returnedFromDeath(ring: five, incarnation: 1, now: 0)
        h2.ringChanged(from: five, to: three, alive: Set(three.members), now: 10)
        #expect(h2.mayServe(keyHash: h, now: 3_010))
    }

    /// Found by Cluster/chaos (netns seed 67, partition-long): cut off, d had kept a ring without
    /// b (it had seen b die before its own partition); back from death it waited for the members
    /// of that ring only. b was alive all along and had owned d's keys meanwhile: when b came back
    /// onto d's ring, d served those keys (anti-entropy, SNAPSHOTs) from its stale copy before
    /// b's handoff arrived, listing users who had left. A member that comes back onto the ring of
    /// a node still waiting after its return from death is waited for too, for the keys it would
    /// have owned without this node.
    @Test func aMemberThatReappearsWhileANodeBackFromDeathWaitsIsWaitedForToo() {
        let five = HashRing(members: ["a", "b", "c", "d", "e"])
        let stale = five.removing("b")  // d's ring while cut off
        var g = HandoffGate(me: "d", limit: 3_000)
        g.returnedFromDeath(ring: stale, incarnation: 1, now: 0)
        // a key d owns on every ring, that b held while d was dead
        let h = (0..<100_000).map { StableHash.of("k\($0)") }.first {
            stale.owner(ofHash: $0) == "d" && five.owner(ofHash: $0) == "d" && five.removing("d").owner(ofHash: $0) == "b"
        }!
        g.ringChanged(from: stale, to: five, alive: Set(five.members), now: 10)
        #expect(g.pending == ["a", "b", "c", "e"])
        for n in ["a", "c", "e"] { g.handoffDone(from: n, fingerprint: five.fingerprint, toIncarnation: 1, now: 10) }
        #expect(!g.mayServe(keyHash: h, now: 11), "served from its stale copy before b handed back")
        g.handoffDone(from: "b", fingerprint: five.fingerprint, toIncarnation: 1, now: 11)
        #expect(g.mayServe(keyHash: h, now: 12))
        // past the limit it serves whatever happened to b
        var late = HandoffGate(me: "d", limit: 3_000)
        late.returnedFromDeath(ring: stale, incarnation: 1, now: 0)
        late.ringChanged(from: stale, to: five, alive: Set(five.members), now: 10)
        #expect(late.mayServe(keyHash: h, now: 3_011))
    }

    @Test func aChangeAfterTheWaitEndedStartsAFreshOne() {
        let three = HashRing(members: ["a", "b", "c"])
        var g = HandoffGate(me: "c", limit: 3_000)
        g.ringChanged(from: three.removing("c"), to: three, alive: Set(three.members), now: 0)
        for n in ["a", "b"] { g.handoffDone(from: n, fingerprint: three.fingerprint, now: 0) }
        #expect(g.pending.isEmpty)
        let two = three.removing("a")
        g.ringChanged(from: three, to: two, alive: Set(two.members), now: 10)
        #expect(g.pending == ["b"])
        // keys that were c's on `three` are not held back by the finished join
        let mine = (0..<100_000).map { StableHash.of("k\($0)") }.first { three.owner(ofHash: $0) == "c" }!
        #expect(g.mayServe(keyHash: mine, now: 11))
    }
}

@Suite struct LossyFollowersTests {
    @Test func followersAreRestartedOnlyOnceTheirNodeCanBeReachedAndOnlyOnce() {
        let ring = HashRing(members: ["a", "b", "c"])
        var lossy = LossyFollowers()
        lossy.lost("b")
        // b is on the ring (kept in a minority) but believed dead: its SNAPSHOTs would be lost too
        #expect(lossy.due(ring: ring, reachable: { _ in false }) == [])
        #expect(lossy.contains("b"))
        #expect(lossy.due(ring: ring, reachable: { $0 == "b" }) == ["b"])
        #expect(lossy.due(ring: ring, reachable: { _ in true }) == [])
    }

    @Test func aNodeOffTheRingIsForgotten() {
        var lossy = LossyFollowers()
        lossy.lost("c")
        #expect(lossy.due(ring: HashRing(members: ["a", "b"]), reachable: { _ in true }) == [])
        #expect(!lossy.contains("c"))
    }
}

@Suite struct HandoffGateAskAgainTests {
    let five = HashRing(members: ["a", "b", "c", "d", "e"])

    /// A node back from death forgot the "done"s that came just before, and its ring changed
    /// after its request: it asks again, for its current ring, the members still waited for, once
    /// every interval while the wait lasts; answered, it serves.
    @Test func membersStillWaitedForAreAskedAgainForTheCurrentRing() {
        let stale = five.removing("a")
        var g = HandoffGate(me: "c", limit: 3_000)
        g.handoffDone(from: "b", fingerprint: five.fingerprint, now: 0)   // forgotten below
        g.returnedFromDeath(ring: stale, incarnation: 1, now: 10)
        #expect(g.membersToAsk(now: 300, every: 300) == nil, "asked again before the interval passed")
        g.ringChanged(from: stale, to: five, alive: Set(five.members), now: 200)
        #expect(g.membersToAsk(now: 499, every: 300) == nil)
        let ask = g.membersToAsk(now: 500, every: 300)
        #expect(ask?.fingerprint == five.fingerprint)
        #expect(ask?.members == ["a", "b", "d", "e"])
        #expect(g.membersToAsk(now: 600, every: 300) == nil, "asked twice within one interval")
        for n in ["a", "b", "d"] { g.handoffDone(from: n, fingerprint: five.fingerprint, toIncarnation: 1, now: 700) }
        #expect(g.membersToAsk(now: 800, every: 300)?.members == ["e"])
        g.handoffDone(from: "e", fingerprint: five.fingerprint, toIncarnation: 1, now: 900)
        #expect(!g.isWaiting(now: 901))
        #expect(g.membersToAsk(now: 2_000, every: 300) == nil, "asked with nothing left to wait for")
    }

    /// Members off the current ring cannot answer for it, and nobody is asked once the limit passed.
    @Test func onlyMembersOnTheRingAreAskedAndOnlyWithinTheLimit() {
        let four = five.removing("e")
        var g = HandoffGate(me: "c", limit: 3_000)
        g.returnedFromDeath(ring: five, incarnation: 1, now: 0)
        g.ringChanged(from: five, to: four, alive: Set(four.members), now: 10)
        #expect(g.membersToAsk(now: 400, every: 300)?.members == ["a", "b", "d"])
        #expect(g.isWaiting(now: 2_999) && !g.isWaiting(now: 3_010))
        #expect(g.membersToAsk(now: 3_010, every: 300) == nil)
    }
}
