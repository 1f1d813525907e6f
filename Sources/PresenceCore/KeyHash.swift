/// Table hashes for keys whose bits are already unpredictable: a channel key (its name's hash,
/// computed once with the process's secret `Hasher` seed) and a session id (128 bits this node's
/// random generator drew; clients can name an id in a call but never make a table hold one they
/// chose). For these a full `Hasher` run per lookup (SipHash, ~4% of a SetState's CPU in
/// `Scripts/profile setstate`) buys nothing a bit mixer does not.
///
/// Used through `Hashable._rawHashValue(seed:)`, the hook the standard library's `Dictionary` and
/// `Set` call (with their per-table seed) and `hashValue` calls with seed 0. `hash(into:)` stays as
/// it was, for keys combined into other hashes.
@usableFromInline
enum KeyHash {
    /// The SplitMix64 finaliser of `bits` XOR `seed`: a bijection of 64 bits in which every input
    /// bit moves about half the output bits, so that the low bits a table masks by are as good as
    /// the high ones, whatever pattern the inputs have (sequential test ids included).
    @inlinable @inline(__always)
    static func mix(_ bits: UInt64, seed: Int) -> Int {
        var z = bits ^ UInt64(bitPattern: Int64(seed))
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return Int(truncatingIfNeeded: z ^ (z >> 31))
    }
}
