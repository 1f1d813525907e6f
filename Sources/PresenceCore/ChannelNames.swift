import PresenceWire
import Synchronization

/// The channel names a node keeps once, however many of its tables hold them: a channel key
/// (`ChannelKey`) is a reference to one shared copy of its channel's name.
///
/// Held by value, every entry of every table keyed by a channel took the whole name: 24 bytes
/// inline, and for a name longer than 15 bytes a heap copy of its own (each call decodes its names
/// afresh, so nothing shared them). Sharded by hash, each shard under a mutex, as keys are made on
/// every loop.
///
/// A name no key holds any more is swept away: a shard sweeps when it has grown to twice what it
/// held after its last sweep, so names clients make up do not pile up (at most twice the live ones,
/// plus a small floor per shard) and each key made pays O(1) for it on average. The table holds its
/// names strongly and finds the unheld ones by their reference count: a weak table would give each
/// name a side table, and every retain and release of a key (several per call) would take the
/// runtime's slow path (3.6% of a SetState's CPU when names were weakly held).
///
/// (User ids are not kept this way: a node holds ten times more users than channels, and a shared
/// name cost ~170 bytes when the table was weak — the object, its weak reference's side table, its slot — against the 8
/// bytes it saves in each entry; with 10 channels per user, members keyed by shared user ids took
/// 182 bytes per membership at the owner, against 172 with the ids inline.)
public final class ChannelNames: Sendable {
    /// The node's channel names.
    public static let shared = ChannelNames()

    /// One channel's name, shared by every key of it, with its hashes (computed once): its
    /// `StableHash`, the same on every node, for routing; and the process's seeded hash of it, for
    /// tables.
    @usableFromInline final class Name: Sendable {
        let text: ChannelName
        let stableHash: UInt64
        /// `text.hashValue`. Tables must not key by `stableHash`: FNV-1a is unseeded, and a client
        /// could make up any number of colliding channel names offline (the seeded hasher is what
        /// keeps them from landing in one bucket chain).
        @usableFromInline let seededHash: Int

        init(_ text: ChannelName, seededHash: Int) {
            self.text = text
            self.stableHash = StableHash.of(text.name, text.type)
            self.seededHash = seededHash
        }
    }

    private struct Slot: Hashable {
        let text: ChannelName
        let seededHash: Int
        func hash(into hasher: inout Hasher) { hasher.combine(seededHash) }
        func _rawHashValue(seed: Int) -> Int { KeyHash.mix(UInt64(bitPattern: Int64(seededHash)), seed: seed) }
        static func == (a: Slot, b: Slot) -> Bool { a.seededHash == b.seededHash && a.text == b.text }
    }

    /// A shard's names, and the size at which it next sweeps.
    private struct Table {
        var names: [Slot: Name] = [:]
        var sweepAt = Table.floor
        static var floor: Int { 32 }

        /// Drops the names only this table holds. A name held by the table alone has no key
        /// anywhere, and none can be made without this shard's lock: the check cannot race.
        mutating func sweep() {
            var gone: [Slot] = []
            // (an index loop: `names.indices` would hold a second reference to the storage, and
            // the first access through `values` would copy the whole table, every name with it)
            var i = names.startIndex
            while i != names.endIndex {
                if isKnownUniquelyReferenced(&names.values[i]) { gone.append(names.keys[i]) }
                names.formIndex(after: &i)
            }
            for slot in gone { names[slot] = nil }
            sweepAt = max(Table.floor, 2 * names.count)
        }
    }

    private final class Shard: Sendable {
        let table = Mutex<Table>(Table())
    }

    private let shards: [Shard] = (0..<64).map { _ in Shard() }

    init() {}

    private func shard(_ seededHash: Int) -> Shard { shards[(seededHash >> 20) & 63] }

    /// The shared name of the channel: the one held now, or a new one.
    func intern(_ name: String, _ type: ChannelType) -> Name {
        let text = ChannelName(name: name, type: type)
        let slot = Slot(text: text, seededHash: text.hashValue)
        return shard(slot.seededHash).table.withLock { t in
            if let held = t.names[slot] { return held }
            if t.names.count >= t.sweepAt { t.sweep() }
            let made = Name(text, seededHash: slot.seededHash)
            t.names[slot] = made
            return made
        }
    }

    /// Names some key holds now (for tests and metrics): sweeps every shard first.
    public var count: Int {
        shards.reduce(0) { n, s in
            n + s.table.withLock { t in
                t.sweep()
                return t.names.count
            }
        }
    }

    /// Names in the table, held or not, without sweeping (tests: what the amortised sweep leaves).
    var stored: Int { shards.reduce(0) { n, s in n + s.table.withLock { $0.names.count } } }
}

/// A channel's name and type, as `ChannelNames` keeps them.
public struct ChannelName: Hashable, Sendable {
    public let name: String
    public let type: ChannelType
}

/// A channel: its type and name. `CHANNEL_TYPE_UNSPECIFIED` never makes a key (validation refuses it).
///
/// A key is one reference to the node's copy of the channel's name (`ChannelNames`): the session
/// table, the users' homes, the owner's machines and the gateway's subscriptions all key their
/// tables by channel. It carries the name's `StableHash`, which routing asks for several times per
/// call.
public struct ChannelKey: Hashable, Sendable, Comparable, CustomStringConvertible {
    @usableFromInline let interned: ChannelNames.Name

    public init(name: String, type: ChannelType) {
        interned = ChannelNames.shared.intern(name, type)
    }

    /// A key whose name is kept in `names` (tests: a table of their own).
    init(name: String, type: ChannelType, in names: ChannelNames) {
        interned = names.intern(name, type)
    }

    public var name: String { interned.text.name }
    public var type: ChannelType { interned.text.type }
    /// `StableHash.of(self)`, computed once per name.
    public var stableHash: UInt64 { interned.stableHash }

    public static func == (a: ChannelKey, b: ChannelKey) -> Bool {
        a.interned === b.interned || (a.interned.seededHash == b.interned.seededHash && a.interned.text == b.interned.text)
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(interned.seededHash) }

    /// The name's seeded hash mixed with the table's seed (`KeyHash`): no `Hasher` run per lookup.
    @inlinable public func _rawHashValue(seed: Int) -> Int { KeyHash.mix(UInt64(bitPattern: Int64(interned.seededHash)), seed: seed) }

    public static func < (a: ChannelKey, b: ChannelKey) -> Bool {
        a.name != b.name ? a.name < b.name : a.type.rawValue < b.type.rawValue
    }

    public var description: String { "\(type == .stream ? "stream" : "message"):\(name)" }
    public var info: ChannelInfo { ChannelInfo(channelName: name, channelType: type) }
}
