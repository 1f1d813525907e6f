/// What a node does with one key (a channel, or a user's home) when the ring changes
/// (ARCHITECTURE.md, "Failover" and "Handoff"): plain functions of the two rings, the node and the
/// replication factor, so the rules are tested without actors or sockets.
public enum RingMove {
    /// For a key this node owned under the old ring.
    public enum Owned: Equatable, Sendable {
        /// Still the owner: bring these replicas (new in the replica set) up to date.
        case keep(newReplicas: [String])
        /// Another node owns it now: hand it over, and keep a replica copy if this node is still
        /// one of its replicas.
        case handOff(to: String, keepCopy: Bool)
    }

    /// For a key this node held a replica copy of.
    public enum Copy: Equatable, Sendable {
        /// This node owns it now. `previousOwner` is who owned it before (its subscribers get fresh
        /// SNAPSHOTs unless that node handed it off); bring `newReplicas` up to date.
        case takeOver(previousOwner: String?, newReplicas: [String])
        /// Still a replica.
        case keep
        /// No longer a replica: forget the copy.
        case drop
    }

    public static func owned(keyHash h: UInt64, from old: HashRing, to new: HashRing, me: String, copies: Int) -> Owned {
        let owners = new.owners(ofHash: h, count: copies)
        guard let owner = owners.first, owner != me else {
            return .keep(newReplicas: added(h, old, owners, me, copies))
        }
        return .handOff(to: owner, keepCopy: owners.contains(me))
    }

    public static func copy(keyHash h: UInt64, from old: HashRing, to new: HashRing, me: String, copies: Int) -> Copy {
        let owners = new.owners(ofHash: h, count: copies)
        if owners.first == me {
            return .takeOver(previousOwner: old.owner(ofHash: h), newReplicas: added(h, old, owners, me, copies))
        }
        return owners.contains(me) ? .keep : .drop
    }

    /// Replicas in `owners` (the new set) that were not replicas or owner under `old`.
    private static func added(_ h: UInt64, _ old: HashRing, _ owners: [String], _ me: String, _ copies: Int) -> [String] {
        let before = Set(old.owners(ofHash: h, count: copies))
        return owners.filter { $0 != me && !before.contains($0) }
    }
}
