import PresenceWire

/// FNV-1a, 64 bits: the same value on every node and every run (unlike `Hasher`), so that shards
/// and, later, the cluster ring place a key the same way everywhere.
public enum StableHash {
    public static func of(_ s: String, seed: UInt64 = 0xcbf2_9ce4_8422_2325) -> UInt64 {
        var h = Stream(seed: seed)
        h.add(s)
        return h.value
    }

    /// The hash fed piece by piece: `value` is `of` the pieces' concatenation, which is never made.
    public struct Stream: Sendable {
        private var h: UInt64
        public init(seed: UInt64 = 0xcbf2_9ce4_8422_2325) { h = seed }
        public mutating func add(_ s: String) {
            for b in s.utf8 { add(b) }
        }
        public mutating func add(_ b: UInt8) {
            h ^= UInt64(b)
            h = h &* 0x0000_0100_0000_01b3
        }
        public var value: UInt64 {
            // final mix so that close inputs spread over all bits
            var h = self.h
            h ^= h >> 33
            h = h &* 0xff51_afd7_ed55_8ccd
            h ^= h >> 33
            return h
        }
    }

    /// A channel's hash (kept in its key: `ChannelKey.stableHash`).
    public static func of(_ key: ChannelKey) -> UInt64 { key.stableHash }

    static func of(_ name: String, _ type: ChannelType) -> UInt64 {
        of(name, seed: 0xcbf2_9ce4_8422_2325 ^ UInt64(bitPattern: Int64(type.rawValue)))
    }
}
