/// The ring a node routes by, derived from its SWIM view (RELIABILITY.md, "Partitions" and
/// "Every process start is a new member incarnation"). A plain value: member changes, SWIM's
/// view and clock readings in; the rings to install out.
///
/// - A member that restarted (a new boot) is two changes: its old process leaves the ring (its
///   keys are taken over, its sessions orphaned, however fast it came back), then the new one joins.
/// - The ring shrinks only while this node sees a majority of the cluster it knew healthy
///   (`RingQuorum`). SWIM declares the members on the far side of a partition dead one at a time,
///   so a node cut off alone would otherwise shrink its ring step by step while it still counted
///   the others, not yet declared, as alive: members under suspicion count as lost.
public struct MembershipRing: Sendable {
    public let me: String
    /// How long a dead member still counts as part of the cluster (then the cluster has shrunk).
    public let lostMemberMemory: UInt64
    private var deadSince: [String: UInt64] = [:]
    /// Whether the last derivation kept the ring because this node sees only a minority.
    public private(set) var inMinority = false

    public init(me: String, lostMemberMemory: UInt64 = 30_000_000_000) {
        self.me = me
        self.lostMemberMemory = lostMemberMemory
    }

    /// SWIM changed what it believes of a member.
    public mutating func noted(_ u: SWIM.Update, now: UInt64) {
        if u.status == .dead { deadSince[u.id] = deadSince[u.id] ?? now } else { deadSince[u.id] = nil }
    }

    public enum Outcome: Sendable, Equatable {
        /// Install these rings, in order (some may equal the current one).
        case install([HashRing])
        /// This node sees too few healthy members to drop any: it keeps `current`.
        case keep(healthy: Int, suspected: Int, lost: Int)
    }

    /// What follows `current`, given SWIM's view of every member (this node included).
    public mutating func next(after current: HashRing, view: [SWIM.Update], now: UInt64) -> Outcome {
        var boots: [String: UInt64] = [:]
        var suspected = 0
        for u in view where u.status == .alive || u.status == .suspect {
            boots[u.id] = u.boot
            if u.status == .suspect && u.id != me { suspected += 1 }
        }
        boots[me] = boots[me] ?? current.boot(of: me)
        let new = HashRing(members: boots.keys, boots: boots)
        if !Set(current.members).isSubset(of: boots.keys) {
            // (members that left gracefully are not lost: the cluster shrank)
            let lost = deadSince.filter { now &- $0.value < lostMemberMemory && boots[$0.key] == nil }.count
            let healthy = boots.count - suspected
            if !RingQuorum.mayShrink(healthy: healthy, suspected: suspected, recentlyLost: lost) {
                inMinority = true
                return .keep(healthy: healthy, suspected: suspected, lost: lost)
            }
        }
        inMinority = false
        let restarted = current.members.filter { $0 != me && boots[$0] != nil && boots[$0] != current.boot(of: $0) }
        guard !restarted.isEmpty else { return .install([new]) }
        var without = new
        for id in restarted { without = without.removing(id) }
        return .install([without, new])
    }
}
