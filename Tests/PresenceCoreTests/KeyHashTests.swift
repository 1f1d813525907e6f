@testable import PresenceCore
import PresenceWire
import Testing

/// Channel keys and session ids hash by mixing bits they already have (`KeyHash`), not by a
/// `Hasher` run: equal keys must still hash alike, and every pattern of ids must still spread over
/// a table's low bits (tables mask by them).
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

    /// Sequential ids (tests make them; the 64-bit form has no high half) and ids that differ only
    /// in their high half spread as evenly as random ones: with 4,096 ids in 4,096 buckets a fair
    /// hash fills no bucket past ~7; unmixed bits put every id of the second pattern in one.
    @Test func idsOfAnyPatternSpreadOverATablesLowBits() {
        let n = 4096
        let sequential = (1...n).map { SessionID(raw: UInt64($0)).hashValue }
        let highHalfOnly = (1...n).map { SessionID(hi: UInt64($0), lo: 1).hashValue }
        let strided = (1...n).map { SessionID(raw: UInt64($0) << 32).hashValue }
        for hashes in [sequential, highHalfOnly, strided] {
            #expect(Set(hashes).count == n)
            #expect(fullestBucket(hashes, buckets: n) <= 10)
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
