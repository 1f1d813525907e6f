/// A hash map for the per-membership tables of a channel (its members, its sessions' places):
/// the entries packed in two arrays, found through a table of 32-bit slots (open addressing,
/// linear probing, at most half full).
///
/// Why not `Dictionary`: a Swift dictionary keeps key and value storage for every bucket, full or
/// empty, with up to 3/4 of the buckets full; a table of 100 entries has 256 buckets, 2.56 times
/// the entries' size. Here an empty bucket costs 4 bytes, and the entries' arrays grow as arrays do
/// (at most twice what they hold). Keys are hashed with the standard library's seeded hasher, as a
/// `Dictionary`'s are, so ids chosen by clients cannot be made to collide.
///
/// Order: entries are kept in the order they were added, except that removing one moves the last
/// entry into its place. Callers that need an order (a channel's users by id) keep one themselves.
public struct DenseDictionary<Key: Hashable, Value> {
    @usableFromInline var entryKeys: [Key] = []
    @usableFromInline var entryValues: [Value] = []
    /// 0: empty; else the index of an entry, plus one. A power of two long, or empty.
    @usableFromInline var slots: [UInt32] = []

    public init() {}

    public var count: Int { entryKeys.count }
    public var isEmpty: Bool { entryKeys.isEmpty }
    /// The keys, in entry order.
    public var keys: [Key] { entryKeys }
    /// The values, in entry order.
    public var values: [Value] { entryValues }

    /// The slot holding `key`'s entry and that entry's index, or the empty slot where it would go
    /// (slot -1 when there is no table yet).
    @inlinable
    func find(_ key: Key) -> (slot: Int, entry: Int?) {
        guard !slots.isEmpty else { return (-1, nil) }
        let mask = slots.count - 1
        var s = key.hashValue & mask
        while true {
            let e = slots[s]
            if e == 0 { return (s, nil) }
            if entryKeys[Int(e &- 1)] == key { return (s, Int(e &- 1)) }
            s = (s &+ 1) & mask
        }
    }

    public func index(forKey key: Key) -> Int? { find(key).entry }

    public subscript(key: Key) -> Value? {
        get {
            guard let i = find(key).entry else { return nil }
            return entryValues[i]
        }
        set {
            if let newValue {
                let (slot, entry) = find(key)
                if let entry {
                    entryValues[entry] = newValue
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

    /// The value of the entry at `index` (from `index(forKey:)`), to read or change in place.
    public subscript(valueAt index: Int) -> Value {
        get { entryValues[index] }
        _modify { yield &entryValues[index] }
    }

    /// Changes the value of `key` where it lies (no copy of it is made); nil when `key` is absent.
    @discardableResult
    public mutating func modify<R>(_ key: Key, _ body: (inout Value) throws -> R) rethrows -> R? {
        guard let i = find(key).entry else { return nil }
        return try body(&entryValues[i])
    }

    private mutating func insert(_ key: Key, _ value: Value, at slot: Int) {
        var slot = slot
        if (entryKeys.count + 1) * 2 > slots.count {
            rebuildSlots(count: Swift.max(8, slots.count * 2))
            slot = find(key).slot
        }
        precondition(entryKeys.count < Int(UInt32.max - 1), "DenseDictionary: too many entries")
        entryKeys.append(key)
        entryValues.append(value)
        slots[slot] = UInt32(entryKeys.count)
    }

    @discardableResult
    public mutating func removeValue(forKey key: Key) -> Value? {
        let (slot, entry) = find(key)
        guard let entry else { return nil }
        clear(slot: slot)
        // the last entry moves into the removed one's place; its slot follows it
        let last = entryKeys.count - 1
        if entry != last {
            let moved = find(entryKeys[last]).slot
            slots[moved] = UInt32(entry + 1)
            entryKeys.swapAt(entry, last)
            entryValues.swapAt(entry, last)
        }
        entryKeys.removeLast()
        let removed = entryValues.removeLast()
        shrinkIfSparse()
        return removed
    }

    public mutating func removeAll() {
        self = DenseDictionary()
    }

    public mutating func reserveCapacity(_ n: Int) {
        entryKeys.reserveCapacity(n)
        entryValues.reserveCapacity(n)
        var size = Swift.max(8, slots.count)
        while size < n * 2 { size *= 2 }
        if size > slots.count { rebuildSlots(count: size) }
    }

    /// Empties `slot` and moves later entries of its run back, so every entry stays reachable from
    /// its home slot without gaps (deletion without tombstones, for linear probing).
    private mutating func clear(slot: Int) {
        let mask = slots.count - 1
        var hole = slot
        var j = slot
        while true {
            j = (j &+ 1) & mask
            let e = slots[j]
            if e == 0 { break }
            let home = entryKeys[Int(e &- 1)].hashValue & mask
            // the entry at j may fill the hole if the hole lies on its probe path (home ... j)
            if (j &- home) & mask >= (j &- hole) & mask {
                slots[hole] = e
                hole = j
            }
        }
        slots[hole] = 0
    }

    /// The same elements in storage of their size (`Array(array)` would share the old storage).
    private static func copied<T>(_ a: [T]) -> [T] {
        var out: [T] = []
        out.reserveCapacity(a.count)
        out.append(contentsOf: a)
        return out
    }

    private mutating func rebuildSlots(count size: Int) {
        slots = [UInt32](repeating: 0, count: size)
        let mask = size - 1
        for (i, key) in entryKeys.enumerated() {
            var s = key.hashValue & mask
            while slots[s] != 0 { s = (s &+ 1) & mask }
            slots[s] = UInt32(i + 1)
        }
    }

    /// A table that held many entries and now holds few gives its storage back (arrays and
    /// dictionaries keep theirs).
    private mutating func shrinkIfSparse() {
        if entryKeys.isEmpty {
            self = DenseDictionary()
            return
        }
        guard slots.count > 64, entryKeys.count * 8 < slots.count else { return }
        entryKeys = Self.copied(entryKeys)
        entryValues = Self.copied(entryValues)
        var size = 8
        while size < entryKeys.count * 2 { size *= 2 }
        rebuildSlots(count: size)
    }
}

extension DenseDictionary: Sequence {
    public struct Iterator: IteratorProtocol {
        let dictionary: DenseDictionary
        var i = 0
        public mutating func next() -> (key: Key, value: Value)? {
            guard i < dictionary.entryKeys.count else { return nil }
            defer { i += 1 }
            return (dictionary.entryKeys[i], dictionary.entryValues[i])
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
