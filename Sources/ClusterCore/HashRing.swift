import PresenceCore

/// Consistent hashing with virtual nodes (ARCHITECTURE.md, "Ring"): each member owns `virtualNodes`
/// points on a 64-bit circle; a key belongs to the member of the first point at or after the key's
/// hash, and its replicas are the next distinct members clockwise. Every node that has the same
/// member list computes the same ring (points come from `StableHash`, never from `Hasher`).
public struct HashRing: Sendable, Equatable {
    public let virtualNodes: Int
    /// Members, sorted (so the ring does not depend on the order they were learnt in).
    public private(set) var members: [String]
    /// Points sorted by position; `owner` indexes `members`.
    private var points: [(position: UInt64, owner: Int32)]

    /// Each member's process instance (`SWIM.Update.boot`), when known: points depend only on
    /// member ids, but a restarted member makes another ring (equality and `fingerprint` include
    /// boots), so nodes that disagree on which process a member is refuse each other's calls.
    public private(set) var boots: [String: UInt64]

    /// Identifies the member list and their process instances: nodes that compute the same ring
    /// from the same processes agree on it. (Stored: every routed call is stamped with it.)
    public let fingerprint: UInt64

    public init(members: some Sequence<String>, boots: [String: UInt64] = [:], virtualNodes: Int = 512) {
        let set = Set(members)
        self.virtualNodes = virtualNodes
        self.members = Array(set).sorted()
        self.boots = boots.filter { set.contains($0.key) }
        // (never 0: a peer call stamped 0 carries no ring and is refused)
        self.fingerprint = max(1, StableHash.of(self.members.map { "\($0)@\(boots[$0] ?? 0)" }.joined(separator: "\n")))
        self.points = []
        rebuild()
    }

    public static func == (a: HashRing, b: HashRing) -> Bool {
        a.virtualNodes == b.virtualNodes && a.members == b.members && a.boots == b.boots
    }

    /// The process instance of `member` on this ring (0 when unknown or not a member).
    public func boot(of member: String) -> UInt64 { boots[member] ?? 0 }

    /// Whether `member`'s process `boot` is the one on this ring (a later boot replaced it, or
    /// the member is gone, otherwise).
    public func isLive(_ member: String, boot: UInt64) -> Bool {
        guard let b = boots[member] else { return members.contains(member) && boot == 0 }
        return b == boot
    }

    private mutating func rebuild() {
        var pts: [(UInt64, Int32)] = []
        pts.reserveCapacity(members.count * virtualNodes)
        for (i, m) in members.enumerated() {
            for v in 0..<virtualNodes {
                pts.append((StableHash.of("\(m)#\(v)"), Int32(i)))
            }
        }
        // ties (vanishingly rare) break by member name, so every node agrees
        pts.sort { $0.0 != $1.0 ? $0.0 < $1.0 : members[Int($0.1)] < members[Int($1.1)] }
        points = pts.map { (position: $0.0, owner: $0.1) }
    }

    public var isEmpty: Bool { members.isEmpty }

    /// The ring with `member` added (no change if present).
    public func adding(_ member: String, boot: UInt64? = nil) -> HashRing {
        var b = boots
        if let boot { b[member] = boot }
        return HashRing(members: members + [member], boots: b, virtualNodes: virtualNodes)
    }

    /// The ring with `member` removed.
    public func removing(_ member: String) -> HashRing {
        HashRing(members: members.filter { $0 != member }, boots: boots.filter { $0.key != member }, virtualNodes: virtualNodes)
    }

    private func firstPoint(atOrAfter h: UInt64) -> Int {
        var lo = 0, hi = points.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if points[mid].position < h { lo = mid + 1 } else { hi = mid }
        }
        return lo == points.count ? 0 : lo
    }

    /// The member owning a key hash; nil on an empty ring.
    public func owner(ofHash h: UInt64) -> String? {
        guard !points.isEmpty else { return nil }
        return members[Int(points[firstPoint(atOrAfter: h)].owner)]
    }

    /// The owner followed by up to `count - 1` replicas, all distinct.
    public func owners(ofHash h: UInt64, count: Int) -> [String] {
        guard !points.isEmpty, count > 0 else { return [] }
        let want = min(count, members.count)
        var out: [String] = []
        var seen = Set<Int32>()
        var i = firstPoint(atOrAfter: h)
        while out.count < want {
            let o = points[i].owner
            if seen.insert(o).inserted { out.append(members[Int(o)]) }
            i = (i + 1) % points.count
        }
        return out
    }

    // By key: a ring of one answers without hashing (a node alone pays nothing for routing).
    public func owner(of key: ChannelKey) -> String? { members.count == 1 ? members[0] : owner(ofHash: StableHash.of(key)) }
    public func owners(of key: ChannelKey, count: Int) -> [String] {
        members.count == 1 ? (count > 0 ? members : []) : owners(ofHash: StableHash.of(key), count: count)
    }
    /// Owner of a user's home.
    public func home(ofUser user: String) -> String? { members.count == 1 ? members[0] : owner(ofHash: Self.hash(ofUser: user)) }
    /// A user's home first, then the nodes holding copies of it.
    public func homes(ofUser user: String, count: Int) -> [String] {
        members.count == 1 ? (count > 0 ? members : []) : owners(ofHash: Self.hash(ofUser: user), count: count)
    }
    /// Where a user sits on the ring (apart from channels, which hash by their key).
    public static func hash(ofUser user: String) -> UInt64 { StableHash.of("user:" + user) }


    /// The share of the circle each member owns (sums to 1).
    public func shares() -> [String: Double] {
        var out: [String: Double] = [:]
        guard !points.isEmpty else { return out }
        for (i, p) in points.enumerated() {
            let prev = i == 0 ? points[points.count - 1].position : points[i - 1].position
            let span = p.position &- prev  // wraps for the first point
            out[members[Int(p.owner)], default: 0] += Double(span) / 18_446_744_073_709_551_616.0
        }
        return out
    }
}

/// Whether a node may take the ring without the members it lost (RELIABILITY.md, partitions): only
/// while the members it sees healthy are at least half of the cluster it knew (those healthy, those
/// under suspicion, and those declared dead recently). A node cut off on its own (or with a
/// minority) keeps the ring it had: it takes nothing over, times no one out, and has nothing stale
/// to push on anyone when the partition heals. (Members gone long enough are no longer counted:
/// the cluster has shrunk.)
public enum RingQuorum {
    public static func mayShrink(healthy: Int, suspected: Int = 0, recentlyLost: Int) -> Bool {
        healthy * 2 >= healthy + suspected + recentlyLost
    }
}
