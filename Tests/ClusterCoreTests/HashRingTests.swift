import ClusterCore
import PresenceCore
import PresenceWire
import Testing

@Suite struct HashRingTests {
    let eight = (1...8).map { "node-\($0)" }

    @Test func everyNodeComputesTheSameRing() {
        let a = HashRing(members: eight)
        let b = HashRing(members: eight.reversed())
        for i in 0..<1000 {
            let key = ChannelKey(name: "room-\(i)", type: .message)
            #expect(a.owner(of: key) == b.owner(of: key))
            #expect(a.owners(of: key, count: 3) == b.owners(of: key, count: 3))
        }
    }

    @Test func replicasAreDistinctAndStartWithTheOwner() {
        let r = HashRing(members: eight)
        for i in 0..<500 {
            let key = ChannelKey(name: "c\(i)", type: .stream)
            let o = r.owners(of: key, count: 3)
            #expect(o.count == 3 && Set(o).count == 3 && o.first == r.owner(of: key))
        }
        #expect(HashRing(members: ["solo"]).owners(ofHash: 42, count: 3) == ["solo"])
        #expect(HashRing(members: []).owner(ofHash: 1) == nil)
    }

    /// Goal: the most loaded of 8 nodes owns at most 1.10x the mean.
    @Test func balanceOfEightNodes() {
        let r = HashRing(members: eight)
        var counts: [String: Int] = [:]
        let keys = 200_000
        for i in 0..<keys { counts[r.owner(of: ChannelKey(name: "channel-\(i)", type: .message))!, default: 0] += 1 }
        let mean = Double(keys) / 8
        let worst = Double(counts.values.max()!) / mean
        #expect(worst <= 1.10, "most loaded node owns \(worst)x the mean")
        let shareWorst = r.shares().values.max()! * 8
        #expect(shareWorst <= 1.10, "largest arc share \(shareWorst)x")
    }

    /// Goal: when a node joins N-1 others, at most 1.2/N of the keys move, and only to the new node.
    @Test func keysMovedWhenANodeJoins() {
        let before = HashRing(members: eight.dropLast())
        let after = before.adding("node-8")
        let keys = 100_000
        var moved = 0
        for i in 0..<keys {
            let k = ChannelKey(name: "k\(i)", type: .message)
            let (a, b) = (before.owner(of: k)!, after.owner(of: k)!)
            if a != b {
                moved += 1
                #expect(b == "node-8")
            }
        }
        let fraction = Double(moved) / Double(keys)
        #expect(fraction <= 1.2 / 8, "moved \(fraction)")
        #expect(fraction >= 0.5 / 8)
    }

    @Test func removingANodeMovesOnlyItsKeys() {
        let full = HashRing(members: eight)
        let less = full.removing("node-3")
        for i in 0..<20_000 {
            let k = ChannelKey(name: "k\(i)", type: .message)
            if full.owner(of: k) != "node-3" { #expect(less.owner(of: k) == full.owner(of: k)) }
        }
        #expect(!less.members.contains("node-3"))
    }
}

@Suite struct RingQuorumTests {
    @Test func aNodeCutOffWithAMinorityKeepsItsRing() {
        #expect(!RingQuorum.mayShrink(healthy: 1, recentlyLost: 4))   // 1 of 5 cut off
        #expect(!RingQuorum.mayShrink(healthy: 2, recentlyLost: 3))   // 2 of 5
        #expect(RingQuorum.mayShrink(healthy: 3, recentlyLost: 2))    // the majority side goes on
        #expect(RingQuorum.mayShrink(healthy: 4, recentlyLost: 1))    // one node died
        #expect(RingQuorum.mayShrink(healthy: 1, recentlyLost: 1))    // two nodes, one died: the other goes on
        #expect(RingQuorum.mayShrink(healthy: 2, recentlyLost: 2))    // an even split: both sides go on (merged on healing)
        // cut off alone, with the first of the far side declared dead and the rest still suspected
        #expect(!RingQuorum.mayShrink(healthy: 1, suspected: 3, recentlyLost: 1))
        // one node died while another is briefly suspected: the rest still go on
        #expect(RingQuorum.mayShrink(healthy: 3, suspected: 1, recentlyLost: 1))
    }
}
