@testable import PresenceCore
import PresenceWire
import Testing

/// Channel keys hash by mixing the seeded hash their name already has (`KeyHash`), not by a
/// `Hasher` run: equal keys must still hash alike, and keys must still spread over a table's low
/// bits (tables mask by them). Session ids keep `Hasher`: ids a client picks must not collide.
struct KeyHashTests {
    /// The largest number of `hashes` that land in one of `buckets` buckets (a power of two), by
    /// their low bits as `DenseDictionary` and `Dictionary` use them.
    private func fullestBucket(_ hashes: [Int], buckets: Int) -> Int {
        var load = [Int](repeating: 0, count: buckets)
        for h in hashes { load[h & (buckets - 1)] += 1 }
        return load.max() ?? 0
    }

    @Test func equalKeysHashAlikeWhateverTableTheirNamesAreIn() {
        let a = ChannelKey(name: "lobby", type: .message, in: ChannelNames())
        let b = ChannelKey(name: "lobby", type: .message, in: ChannelNames())
        #expect(a == b)
        for seed in [0, 1, -7, Int.max] {
            #expect(a._rawHashValue(seed: seed) == b._rawHashValue(seed: seed))
        }
        let id = SessionID(hi: 0x1234, lo: 0x5678)
        #expect(id.hashValue == SessionID(text: id.description)?.hashValue)
        #expect(Set([id, SessionID(hi: 0x1234, lo: 0x5678), SessionID(hi: 0x5678, lo: 0x1234)]).count == 2)
    }

    /// Every pattern of ids spreads as random ones do: with 4,096 ids in 4,096 buckets a fair hash
    /// fills no bucket past ~7. Among them the ids a client could pick to collide under an unkeyed
    /// fold of the two halves (`raw = t ^ (hi * c)`), and ids that differ only in their high half.
    @Test func sessionIdsOfAnyPatternSpreadOverATablesLowBits() {
        let n = 4096
        let sequential = (1...n).map { SessionID(raw: UInt64($0)).hashValue }
        let highHalfOnly = (1...n).map { SessionID(hi: UInt64($0), lo: 1).hashValue }
        let strided = (1...n).map { SessionID(raw: UInt64($0) << 32).hashValue }
        let sameFold = (1...n).map { i -> Int in
            let hi = UInt64(i) &* 0x1234_5678_9ABC_DEF1
            return SessionID(hi: hi, lo: 0x5555 ^ (hi &* 0x9E37_79B9_7F4A_7C15)).hashValue
        }
        for hashes in [sequential, highHalfOnly, strided, sameFold] {
            #expect(Set(hashes).count == n)
            #expect(fullestBucket(hashes, buckets: n) <= 10)
        }
    }

    /// The mixer reaches every input bit into the low bits: inputs that differ only in their high
    /// bits, or step by a power of two, spread as random ones do.
    @Test func theMixerSpreadsInputsThatDifferOnlyInHighBits() {
        let n = 4096
        for shift: UInt64 in [0, 20, 32, 52] {
            let hashes = (0..<UInt64(n)).map { KeyHash.mix($0 << shift, seed: 0) }
            #expect(fullestBucket(hashes, buckets: n) <= 10, "inputs i << \(shift)")
        }
        let names = ChannelNames()
        let channels = (0..<n).map { ChannelKey(name: "room-\($0)", type: .message, in: names).hashValue }
        #expect(fullestBucket(channels, buckets: n) <= 10)
    }

    /// A table's seed changes where keys land (`Dictionary` gives each table its own, so that
    /// copying one table into a smaller one does not pile keys up in bucket order).
    @Test func theTablesSeedMovesTheBuckets() {
        let ids = (1...64).map { SessionID(raw: UInt64($0)) }
        let moved = ids.filter { $0._rawHashValue(seed: 0) & 1023 != $0._rawHashValue(seed: 12_345) & 1023 }
        #expect(moved.count > 56)
        let key = ChannelKey(name: "lobby", type: .message, in: ChannelNames())
        #expect(key._rawHashValue(seed: 0) != key._rawHashValue(seed: 12_345))
    }

    /// Tables keyed by these keys still find every key after growing, shrinking and moving entries.
    @Test func tablesKeyedByThemFindEveryKey() {
        var dense = DenseDictionary<SessionID, Int>()
        var plain: [SessionID: Int] = [:]
        for i in 1...3000 {
            let id = SessionID(hi: UInt64(i % 7), lo: UInt64(i))
            dense[id] = i
            plain[id] = i
        }
        for i in stride(from: 1, through: 3000, by: 2) { dense[SessionID(hi: UInt64(i % 7), lo: UInt64(i))] = nil }
        for i in 1...3000 {
            let id = SessionID(hi: UInt64(i % 7), lo: UInt64(i))
            #expect(dense[id] == (i % 2 == 0 ? i : nil))
            #expect(plain[id] == i)
        }
    }
}
