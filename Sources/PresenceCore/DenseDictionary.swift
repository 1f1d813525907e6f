/// A hash map for the per-membership tables of a channel (its members, its sessions' places), a
/// gateway's sessions and the values a node owns:
/// the entries packed in one array, found by scanning it while they are few and through a table
/// of slots past that (open addressing, linear probing, at most half full).
///
/// Why not `Dictionary`: a Swift dictionary keeps key and value storage for every bucket, full or
/// empty, with up to 3/4 of the buckets full; a table of 100 entries has 256 buckets, 2.56 times
/// the entries' size. Here an empty bucket is a slot of 2 bytes (4 in a table past 65,536 slots:
/// `SlotTable`), and the entries' array grows as arrays do (at most twice what it holds). Keys are
/// hashed with the standard library's seeded hasher, as a `Dictionary`'s are, so ids chosen by
/// clients cannot be made to collide.
///
/// Order: entries are kept in the order they were added, except that removing one moves the last
/// entry into its place (nothing else moves: a caller that keeps entry indices, as a channel's
/// paging order does, relies on exactly this).
public struct DenseDictionary<Key: Hashable, Value> {
    @usableFromInline struct Entry {
        @usableFromInline var key: Key
        @usableFromInline var value: Value
        @usableFromInline init(key: Key, value: Value) {
            self.key = key
            self.value = value
        }
    }
    @usableFromInline var entries: [Entry] = []
    /// 0: empty; else the index of an entry, plus one. A power of two long; empty while the
    /// dictionary is small enough to be searched by scanning its entries (most channels have a
    /// few members: a table of slots would be one more allocation for each).
    @usableFromInline var slots = SlotTable()
    /// Up to this many entries are found by scanning; a table of slots is made past it, and
    /// dropped again at half of it.
    @usableFromInline static var scanLimit: Int { 8 }

    public init() {}

    @inlinable public var count: Int { entries.count }
    @inlinable public var isEmpty: Bool { entries.isEmpty }
    /// The keys, in entry order.
    public var keys: [Key] { entries.map(\.key) }
    /// The values, in entry order.
    public var values: [Value] { entries.map(\.value) }

    /// The slot holding `key`'s entry and that entry's index, or the empty slot where it would go
    /// (slot -1 when there is no table of slots).
    @inlinable
    func find(_ key: Key) -> (slot: Int, entry: Int?) {
        // (keys read through the buffer: read off the array, an entry could be copied whole, its
        // value's references retained and released, for each key compared)
        entries.withUnsafeBufferPointer { entries in
            guard !slots.isEmpty else {
                for i in entries.indices where entries[i].key == key { return (-1, i) }
                return (-1, nil)
            }
            let mask = slots.count - 1
            var s = key.hashValue & mask
            while true {
                let e = slots[s]
                if e == 0 { return (s, nil) }
                if entries[Int(e &- 1)].key == key { return (s, Int(e &- 1)) }
                s = (s &+ 1) & mask
            }
        }
    }

    @inlinable public func index(forKey key: Key) -> Int? { find(key).entry }

    @inlinable public subscript(key: Key) -> Value? {
        get {
            guard let i = find(key).entry else { return nil }
            return entries[i].value
        }
        set {
            if let newValue {
                let (slot, entry) = find(key)
                if let entry {
                    entries[entry].value = newValue
                } else {
                    insert(key, newValue, at: slot)
                }
            } else {
                removeValue(forKey: key)
            }
        }
    }

    public subscript(key: Key, default fallback: @autoclosure () -> Value) -> Value {
        get { self[key] ?? fallback() }
        set { self[key] = newValue }
    }

    /// The key of the entry at `index` (0 ..< count).
    @inlinable public func key(at index: Int) -> Key { entries[index].key }

    /// The value of the entry at `index` (from `index(forKey:)`), to read or change in place.
    @inlinable public subscript(valueAt index: Int) -> Value {
        get { entries[index].value }
        _modify { yield &entries[index].value }
    }

    /// Changes the value of `key` where it lies (no copy of it is made); nil when `key` is absent.
    @discardableResult
    @inlinable public mutating func modify<R>(_ key: Key, _ body: (inout Value) throws -> R) rethrows -> R? {
        guard let i = find(key).entry else { return nil }
        return try body(&entries[i].value)
    }

    /// Runs `body` on every entry in entry order, each value changed where it lies (no copy of
    /// it, or of the table, is made).
    @inlinable
    public mutating func updateEach(_ body: (Key, inout Value) throws -> Void) rethrows {
        // (through the buffer: reading an entry's key straight off the array copied the whole
        // entry, its value's references retained and released, once per entry)
        try entries.withUnsafeMutableBufferPointer { buffer in
            for i in buffer.indices { try body(buffer[i].key, &buffer[i].value) }
        }
    }

    /// Runs `body` on every entry in entry order, reading each where it lies: no entry is copied
    /// (an iterator yields copies, each value's references retained and released).
    @inlinable
    public func forEachEntry(_ body: (Key, Value) throws -> Void) rethrows {
        try entries.withUnsafeBufferPointer { buffer in
            for i in buffer.indices { try body(buffer[i].key, buffer[i].value) }
        }
    }

    @usableFromInline mutating func insert(_ key: Key, _ value: Value, at slot: Int) {
        precondition(entries.count < Int(UInt32.max - 1), "DenseDictionary: too many entries")
        entries.append(Entry(key: key, value: value))
        if slots.isEmpty {
            if entries.count > Self.scanLimit { rebuildSlots(count: Self.slotCount(for: entries.count)) }
        } else if entries.count * 2 > slots.count {
            rebuildSlots(count: slots.count * 2)
        } else {
            slots[slot] = UInt32(entries.count)
        }
    }

    @discardableResult
    @inlinable public mutating func removeValue(forKey key: Key) -> Value? { removeEntry(forKey: key)?.value }

    /// Removes `key`'s entry; returns its value and the index it had, where the last entry now is
    /// (a caller that keeps entry indices moves the last one's: see the type's note on order).
    @discardableResult
    @inlinable public mutating func removeEntry(forKey key: Key) -> (index: Int, value: Value)? {
        let (slot, entry) = find(key)
        guard let entry else { return nil }
        if !slots.isEmpty { clear(slot: slot) }
        // the last entry moves into the removed one's place; its slot follows it
        let last = entries.count - 1
        if entry != last {
            if !slots.isEmpty { slots[find(entries[last].key).slot] = UInt32(entry + 1) }
            entries.swapAt(entry, last)
        }
        let removed = entries.removeLast().value
        shrinkIfSparse()
        return (entry, removed)
    }

    public mutating func removeAll() {
        self = DenseDictionary()
    }

    public mutating func reserveCapacity(_ n: Int) {
        entries.reserveCapacity(n)
        if n > Self.scanLimit {
            let size = Self.slotCount(for: n)
            if size > slots.count { rebuildSlots(count: size) }
        }
    }

    /// The smallest table of slots that holds `n` entries at most half full.
    @usableFromInline static func slotCount(for n: Int) -> Int {
        var size = 16
        while size < n * 2 { size *= 2 }
        return size
    }

    /// Empties `slot` and moves later entries of its run back, so every entry stays reachable from
    /// its home slot without gaps (deletion without tombstones, for linear probing).
    @usableFromInline mutating func clear(slot: Int) {
        let mask = slots.count - 1
        var hole = slot
        var j = slot
        while true {
            j = (j &+ 1) & mask
            let e = slots[j]
            if e == 0 { break }
            let home = entries[Int(e &- 1)].key.hashValue & mask
            // the entry at j may fill the hole if the hole lies on its probe path (home ... j)
            if (j &- home) & mask >= (j &- hole) & mask {
                slots[hole] = e
                hole = j
            }
        }
        slots[hole] = 0
    }

    @usableFromInline mutating func rebuildSlots(count size: Int) {
        slots = SlotTable(count: size)
        let mask = size - 1
        for i in entries.indices {
            var s = entries[i].key.hashValue & mask
            while slots[s] != 0 { s = (s &+ 1) & mask }
            slots[s] = UInt32(i + 1)
        }
    }

    /// A dictionary that held many entries and now holds few gives its storage back (arrays and
    /// dictionaries keep theirs); a small one is searched by scanning again.
    @usableFromInline mutating func shrinkIfSparse() {
        if entries.isEmpty {
            self = DenseDictionary()
            return
        }
        if !slots.isEmpty && entries.count <= Self.scanLimit / 2 {
            slots = SlotTable()
        }
        if entries.capacity > 64, entries.count * 8 < entries.capacity {
            var compact: [Entry] = []
            compact.reserveCapacity(entries.count)
            compact.append(contentsOf: entries)
            entries = compact
        }
        // (the slots follow the count of entries, not their array's capacity, which the allocator
        // rounds as it pleases: shrinking them with the entries left a table's size to the heap's state)
        if !slots.isEmpty, slots.count > Self.slotCount(for: entries.count) * 4 {
            rebuildSlots(count: Self.slotCount(for: entries.count))
        }
    }
}

/// A table of slots, each 0 (empty) or an entry's index plus one: two bytes each while the table
/// has at most 65,536 slots, four bytes each past that. A table is at most half full, so one of
/// up to 65,536 slots names at most 32,768 entries, whose numbers fit in two bytes. The width
/// follows from the storage's length alone: up to 65,536 two-byte slots, or at least 262,144
/// halves (131,072 four-byte slots, the next power of two).
@usableFromInline struct SlotTable {
    @usableFromInline var raw: [UInt16] = []
    @usableFromInline static var narrowLimit: Int { 65_536 }

    @usableFromInline init() {}

    /// `count` empty slots (a power of two).
    @usableFromInline init(count: Int) {
        raw = [UInt16](repeating: 0, count: count <= Self.narrowLimit ? count : count * 2)
    }

    @inlinable var isWide: Bool { raw.count > Self.narrowLimit }
    @inlinable var count: Int { isWide ? raw.count / 2 : raw.count }
    @inlinable var isEmpty: Bool { raw.isEmpty }
    /// Bytes the slots take (tests).
    var byteCount: Int { raw.count * 2 }

    @usableFromInline subscript(i: Int) -> UInt32 {
        @inlinable get {
            guard isWide else { return UInt32(raw[i]) }
            precondition(i >= 0 && i < raw.count / 2)
            return raw.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: i &* 4, as: UInt32.self) }
        }
        @inlinable set {
            guard isWide else {
                raw[i] = UInt16(newValue)
                return
            }
            precondition(i >= 0 && i < raw.count / 2)
            raw.withUnsafeMutableBytes { $0.storeBytes(of: newValue, toByteOffset: i &* 4, as: UInt32.self) }
        }
    }
}

extension SlotTable: Sendable {}

extension DenseDictionary: Sequence {
    public struct Iterator: IteratorProtocol {
        let dictionary: DenseDictionary
        var i = 0
        public mutating func next() -> (key: Key, value: Value)? {
            guard i < dictionary.entries.count else { return nil }
            defer { i += 1 }
            return (dictionary.entries[i].key, dictionary.entries[i].value)
        }
    }
    public func makeIterator() -> Iterator { Iterator(dictionary: self) }
    public var underestimatedCount: Int { count }
}

extension DenseDictionary: ExpressibleByDictionaryLiteral {
    public init(dictionaryLiteral elements: (Key, Value)...) {
        self.init()
        for (k, v) in elements { self[k] = v }
    }
}

extension DenseDictionary: Equatable where Value: Equatable {
    /// The same keys with the same values, whatever their order.
    public static func == (a: DenseDictionary, b: DenseDictionary) -> Bool {
        guard a.count == b.count else { return false }
        for (k, v) in a where b[k] != v { return false }
        return true
    }
}

extension DenseDictionary: Sendable where Key: Sendable, Value: Sendable {}
extension DenseDictionary.Entry: Sendable where Key: Sendable, Value: Sendable {}
