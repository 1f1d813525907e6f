import PresenceWire

/// A user's state in a channel: items kept sorted by key (API.md asks for sorted `states`).
public struct StateItems: Sendable, Equatable {
    public private(set) var items: [StateItem] = []

    public init() {}
    public init(_ items: [StateItem]) {
        self.items = items.sorted { $0.key < $1.key }
    }

    public var isEmpty: Bool { items.isEmpty }
    public var count: Int { items.count }

    private func index(of key: String) -> (found: Bool, at: Int) {
        var lo = 0, hi = items.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if items[mid].key < key { lo = mid + 1 } else { hi = mid }
        }
        return (lo < items.count && items[lo].key == key, lo)
    }

    /// How many keys there would be after merging `updates`.
    public func countAfterMerging(_ updates: [StateItem]) -> Int {
        var added = Set<String>()
        for u in updates where !index(of: u.key).found { added.insert(u.key) }
        return items.count + added.count
    }

    /// Overwrites existing keys and adds new ones; returns whether anything changed.
    @discardableResult
    public mutating func merge(_ updates: [StateItem]) -> Bool {
        var changed = false
        for u in updates {
            let (found, at) = index(of: u.key)
            if found {
                if items[at].value != u.value {
                    items[at].value = u.value
                    changed = true
                }
            } else {
                items.insert(u, at: at)
                changed = true
            }
        }
        return changed
    }

    /// Removes the keys (all of them when `keys` is empty); returns whether anything changed.
    @discardableResult
    public mutating func remove(_ keys: [String]) -> Bool {
        if keys.isEmpty {
            defer { items = [] }
            return !items.isEmpty
        }
        var changed = false
        for k in keys {
            let (found, at) = index(of: k)
            if found {
                items.remove(at: at)
                changed = true
            }
        }
        return changed
    }
}
