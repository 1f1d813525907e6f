/// Table hashes for channel keys: a key's name was hashed once, when it was interned, with the
/// process's secret `Hasher` seed (`ChannelNames`), so its tables need not run `Hasher` again on
/// every lookup (SipHash, ~4% of a SetState's CPU in `Scripts/profile setstate`): mixing those
/// bits with the table's seed spreads them as well, and a client that cannot predict the seeded
/// hash of a name cannot pick names that collide either.
///
/// Used through `Hashable._rawHashValue(seed:)`, the hook the standard library's `Dictionary` and
/// `Set` call (with their per-table seed) and `hashValue` calls with seed 0. `hash(into:)` stays as
/// it was, for keys combined into other hashes. (Session ids keep `Hasher`: clients can name ids
/// that a node holds for a while, and their bits are not secret.)
@usableFromInline
enum KeyHash {
    /// The SplitMix64 finaliser of `bits` XOR `seed`: a bijection of 64 bits in which every input
    /// bit moves about half the output bits, so that the low bits a table masks by are as good as
    /// the high ones, whatever pattern the inputs have.
    @inlinable @inline(__always)
    static func mix(_ bits: UInt64, seed: Int) -> Int {
        var z = bits ^ UInt64(bitPattern: Int64(seed))
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return Int(truncatingIfNeeded: z ^ (z >> 31))
    }
}
