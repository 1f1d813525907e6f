@testable import PresenceCore
import PresenceWire
import Testing

/// Channel keys share one copy of each channel's name while any key holds it (`ChannelNames`).
struct ChannelNamesTests {
    @Test func keysOfOneChannelShareItsNameAndTheLastKeyTakesItAway() {
        let names = ChannelNames()
        do {
            let a = ChannelKey(name: "room-7", type: .message, in: names)
            let b = ChannelKey(name: "room-7", type: .message, in: names)
            let other = ChannelKey(name: "room-7", type: .stream, in: names)
            #expect(names.count == 2)
            #expect(a == b)
            #expect(a.hashValue == b.hashValue)
            #expect(a != other)
            #expect(a.stableHash == StableHash.of("room-7", .message))
            #expect(a.stableHash != other.stableHash)
            let keyed: [ChannelKey: Int] = [a: 1, other: 2]
            #expect(keyed[b] == 1)
            #expect(a.name == "room-7" && a.type == .message && other.type == .stream)
        }
        #expect(names.count == 0)
        // (made again once gone: a new name, equal in every way to the old keys')
        let again = ChannelKey(name: "room-7", type: .message, in: names)
        #expect(names.count == 1)
        #expect(again.description == "message:room-7")
    }

    @Test func keysMadeAndDroppedOnManyThreadsLeaveNoNameBehind() async {
        let names = ChannelNames()
        await withTaskGroup(of: Void.self) { group in
            for t in 0..<8 {
                group.addTask {
                    for i in 0..<5_000 {
                        let held = ChannelKey(name: "c\(i % 16)", type: .message, in: names)
                        let again = ChannelKey(name: "c\(i % 16)", type: .message, in: names)
                        precondition(held == again, "thread \(t): two keys of one channel differ")
                    }
                }
            }
        }
        #expect(names.count == 0)
    }

    /// Names clients make up and drop are swept as the table grows, without anyone asking for
    /// the count; names some key holds survive every sweep.
    @Test func madeUpNamesDoNotPileUpAndHeldNamesSurviveTheSweeps() {
        let names = ChannelNames()
        let held = (0..<1_000).map { ChannelKey(name: "held-\($0)", type: .stream, in: names) }
        for i in 0..<100_000 {
            _ = ChannelKey(name: "made-up-\(i)", type: .message, in: names)
        }
        // (each shard holds at most twice its live names after a sweep, or its floor of 32)
        #expect(names.stored <= 2 * 1_000 + 64 * 33)
        #expect(names.count == 1_000)
        for (i, key) in held.enumerated() {
            #expect(key == ChannelKey(name: "held-\(i)", type: .stream, in: names))
        }
        #expect(names.count == 1_000)
    }

    @Test func keysFromTheSharedTableAndAnotherAreEqualWhenTheyNameOneChannel() {
        let names = ChannelNames()
        let mine = ChannelKey(name: "lobby", type: .stream, in: names)
        let shared = ChannelKey(name: "lobby", type: .stream)
        #expect(mine == shared)
        #expect(Set([mine, shared]).count == 1)
        #expect(!(mine < shared) && !(shared < mine))
    }

    /// Tables key channels by the process's seeded hash of the name, never by its `StableHash`
    /// (unseeded FNV-1a: colliding names can be made up offline, and would share one bucket chain).
    @Test func keysHashWithTheSeededHasherNotTheStableHash() {
        let names = ChannelNames()
        let key = ChannelKey(name: "room-7", type: .message, in: names)
        let seeded = ChannelName(name: "room-7", type: .message).hashValue
        #expect(key.hashValue == KeyHash.mix(UInt64(bitPattern: Int64(seeded)), seed: 0))
        #expect(key.hashValue != KeyHash.mix(key.stableHash, seed: 0))
    }
}
