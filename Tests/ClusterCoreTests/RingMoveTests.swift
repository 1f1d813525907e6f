import ClusterCore
import PresenceCore
import Testing

@Suite struct RingMoveTests {
    let three = HashRing(members: ["a", "b", "c"])
    let four = HashRing(members: ["a", "b", "c", "d"])
    let two = HashRing(members: ["a", "b"])
    let hashes = (0..<2_000).map { StableHash.of("key-\($0)") }

    @Test func aJoiningNodeGetsItsKeysHandedOffAndNothingElseMoves() {
        for h in hashes {
            let before = three.owners(ofHash: h, count: 2)
            let after = four.owners(ofHash: h, count: 2)
            let move = RingMove.owned(keyHash: h, from: three, to: four, me: before[0], copies: 2)
            if after[0] == "d" {
                // the old owner hands it to d, and stays a replica if it is still among the first two
                #expect(move == .handOff(to: "d", keepCopy: after.contains(before[0])))
            } else {
                #expect(after[0] == before[0])
                #expect(move == .keep(newReplicas: after.filter { $0 != before[0] && !before.contains($0) }))
            }
            // d owns nothing before the handoff: it never takes a key over from a copy of its own
            #expect(RingMove.copy(keyHash: h, from: three, to: four, me: "d", copies: 2) != .takeOver(previousOwner: "d", newReplicas: []))
        }
    }

    @Test func aDeadOwnersKeysAreTakenOverByTheirFirstReplica() {
        var takenOver = 0
        for h in hashes {
            let before = three.owners(ofHash: h, count: 2)
            guard before[0] == "c" else { continue }
            let replica = before[1]
            let move = RingMove.copy(keyHash: h, from: three, to: two, me: replica, copies: 2)
            guard case .takeOver(let previous, let newReplicas) = move else {
                Issue.record("the replica \(replica) must take over, got \(move)")
                continue
            }
            takenOver += 1
            #expect(previous == "c")
            #expect(newReplicas == two.owners(ofHash: h, count: 2).filter { $0 != replica })
        }
        #expect(takenOver > 0)
    }

    @Test func oneCopyMeansNoReplicasAndHandoffOnly() {
        for h in hashes {
            let owner = three.owner(ofHash: h)!
            switch RingMove.owned(keyHash: h, from: three, to: four, me: owner, copies: 1) {
            case .keep(let replicas): #expect(replicas.isEmpty)
            case .handOff(let to, let keepCopy): #expect(to == "d" && !keepCopy)
            }
        }
    }

    @Test func aReplicaNoLongerNeededDropsItsCopy() {
        var dropped = 0
        for h in hashes {
            let before = three.owners(ofHash: h, count: 2)
            let after = four.owners(ofHash: h, count: 2)
            if !after.contains(before[1]) {
                #expect(RingMove.copy(keyHash: h, from: three, to: four, me: before[1], copies: 2) == .drop)
                dropped += 1
            }
        }
        #expect(dropped > 0)
    }
}
