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
        g.handoffDone(from: "a", fingerprint: new.fingerprint)
        #expect(g.mayServe(keyHash: fromA, now: 1_002) && !g.mayServe(keyHash: fromB, now: 1_002))
        // a "done" for another ring does not count
        g.handoffDone(from: "b", fingerprint: old.fingerprint)
        #expect(!g.mayServe(keyHash: fromB, now: 1_003))
        // nor does waiting forever: past the limit it serves
        #expect(g.mayServe(keyHash: fromB, now: 4_000))
    }

    @Test func aDoneThatArrivesBeforeTheRingChangeCounts() {
        var g = HandoffGate(me: "c", limit: 3_000)
        g.handoffDone(from: "a", fingerprint: new.fingerprint)
        g.handoffDone(from: "b", fingerprint: new.fingerprint)
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
}

@Suite struct HandoffGateReturnTests {
    @Test func aNodeBackFromDeathServesItsKeysOnlyOnceHandedBack() {
        let ring = HashRing(members: ["a", "b", "c"])
        var g = HandoffGate(me: "c", limit: 3_000)
        // an old "done" for this very ring (from before c was declared dead) must not count
        g.handoffDone(from: "a", fingerprint: ring.fingerprint)
        g.returnedFromDeath(ring: ring, now: 1_000)
        let mine = (0..<10_000).map { StableHash.of("k\($0)") }.first { ring.owner(ofHash: $0) == "c" }!
        #expect(!g.mayServe(keyHash: mine, now: 1_001))
        #expect(g.pending == ["a", "b"])
        g.handoffDone(from: "a", fingerprint: ring.fingerprint)
        g.handoffDone(from: "b", fingerprint: ring.fingerprint)
        #expect(g.mayServe(keyHash: mine, now: 1_002))
        // and a silent member does not block it forever
        var h = HandoffGate(me: "c", limit: 3_000)
        h.returnedFromDeath(ring: ring, now: 0)
        #expect(!h.mayServe(keyHash: mine, now: 2_999) && h.mayServe(keyHash: mine, now: 3_000))
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
