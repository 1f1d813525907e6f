/// Whether this node may serve a key it owns, while ownership moves (ARCHITECTURE.md, "Handoff").
/// When the ring changes, a key this node now owns may still have its state at the key's previous
/// owner. If that node is alive, it hands the state off and then says it is done; until it does
/// (or `limit` passes), calls for its keys must get a retryable error rather than an answer from
/// empty state. A key whose previous owner left the ring (died) is served from the replicas'
/// copies: each live replica sends the new owner its copy before it says "done" (`Keyspace`), so
/// the key waits for those of its previous replicas still waited for. The new owner may hold no
/// copy of its own: it was restarted after the previous owner last reached it.
/// A plain value: rings, "done" messages and clock readings in; answers out.
public struct HandoffGate: Sendable {
    public let me: String
    /// How long to wait for a previous owner's handoff before serving anyway (it may be stuck).
    public let limit: UInt64
    /// How many nodes hold each key (its owner and replicas): the replicas of a key whose owner
    /// left are waited for.
    public let copies: Int
    /// The rings before each change not handed off yet, oldest first: a key waits while its owner
    /// on any of them is a member that has not said it is done. A ring change that comes while an
    /// earlier one is still being handed off adds to them (found by Cluster/chaos: a node back
    /// from a partition, whose ring then lost another member, served its keys from its stale copy
    /// because the second change had replaced the first one's wait).
    private var bases: [HashRing] = []
    private var current: HashRing?
    private var waitingFor: Set<String> = []
    private var deadline: UInt64 = 0
    /// "Done" messages, by the ring fingerprint they were sent for, with when each arrived: they
    /// can arrive before this node has computed that ring itself. A node that serves keeps, at a
    /// ring change, only those for the ring it moves to: a "done" for a ring it had before, late
    /// or relayed, cannot be told from one for a ring ahead, and would count for a later episode
    /// of that ring (after a heal) that must be handed off again. A node still joining (its
    /// boot is in no ring from before it started) learns the members one ring change at a time
    /// while each of them, knowing them all, says "done" for the whole ring at once, possibly
    /// several changes ahead: it keeps those for `limit` across its changes.
    private var done: [UInt64: [String: UInt64]] = [:]
    /// (a bound on the bases kept; a ring that changes this often is past any handoff limit anyway)
    private static let maxBases = 16
    /// Set while a wait that began as this node joined lasts: it serves no key until every member
    /// it waits for is done. Its view of who owned what before it came is the ring without it,
    /// but the cluster may have been mid-change itself (a member restarted at the same moment, a
    /// key's owner died and another took it over), so the owner by that ring may not be the one
    /// that holds the key.
    private var joinWait = false
    /// When the members still waited for were last asked whether they handed off (`membersToAsk`):
    /// a wait's start counts (after a ring change each member says "done" on its own, and a node
    /// back from death asks at once).
    private var askedAt: UInt64 = 0

    public init(me: String, limit: UInt64, copies: Int = 1) {
        self.me = me
        self.limit = limit
        self.copies = max(1, copies)
    }

    /// Members this node waits for since it came back from death, whether on its ring or not: its
    /// view of who is dead is as stale as its keys (found by Cluster/chaos: back from a partition,
    /// a node dropped the members it had believed dead while cut off, and served what they had
    /// taken over from its stale copy; they were alive, and on its ring again a moment later).
    private var sinceReturn: Set<String> = []
    /// Set once this node, back from death, took a live member's whole view (`viewRefreshed`):
    /// from then on a member leaving its ring died by news from after the return, not by its stale
    /// view, and is waited for only if it comes back.
    private var viewFresh = false
    /// The incarnation this node returned from death with, last (0: it never did). A "done"
    /// stamped with a lower incarnation of this node was decided before it was declared dead:
    /// delivered late (a freeze holds what reached the process unread), it may name a ring this
    /// node has again after its return, while what the sender took over meanwhile has not been
    /// handed back: counted, the node would serve a stale copy.
    public private(set) var returnedAs: UInt64 = 0

    /// Members waited for that are on the current ring (one that is not cannot hand off now; if
    /// it comes back, it is waited for again), and those waited for since a return from death.
    private var waitingOnRing: Set<String> {
        guard let current else { return waitingFor }
        return waitingFor.filter { current.members.contains($0) || sinceReturn.contains($0) }
    }

    /// Whether this node still waits for a handoff at `now` (within the limit, for a member on
    /// its ring or one waited for since its return from death).
    public func isWaiting(now: UInt64) -> Bool { now < deadline && !waitingOnRing.isEmpty }

    /// Whether a wait that began as this node joined still holds every key (`joinWait`).
    private func holdsEveryKey(now: UInt64) -> Bool { joinWait && isWaiting(now: now) }

    /// The ring changed from `old` to `new`; `alive` are members that can still hand off. Each
    /// member hands off by every ring it carries out, in order, and says "done" for the newest:
    /// so a "done" for `new` covers the earlier changes too. `joining`: this node has not joined
    /// the cluster yet (it keeps "done" messages for rings still ahead).
    public mutating func ringChanged(from old: HashRing, to new: HashRing, alive: Set<String>, now: UInt64, joining: Bool = false) {
        forgetStaleDones(now: now)
        let said: Set<String> = done[new.fingerprint].map { Set($0.keys) } ?? []
        if viewFresh { sinceReturn.subtract(old.members.filter { !new.members.contains($0) && !alive.contains($0) }) }
        let earlier = isWaiting(now: now) ? waitingFor : []
        if earlier.isEmpty {
            bases = []
            sinceReturn = []
            joinWait = joining
        } else if joining {
            joinWait = true
        }
        bases.append(old)
        if bases.count > Self.maxBases { bases.removeFirst(bases.count - Self.maxBases) }
        current = new
        // (an earlier owner off the new ring stays on the list: if it comes back during the wait,
        // it holds what it took over meanwhile and must hand it back first)
        var owners = earlier.union(old.members.filter { alive.contains($0) && new.members.contains($0) })
        if joinWait {
            // (still joining: a member it learns of only now may hold keys this node owns — handed
            // to it by a ring this node never had — and is waited for like the others)
            owners.formUnion(new.members.filter { !old.members.contains($0) && alive.contains($0) })
        }
        if !sinceReturn.isEmpty {
            // still waiting after a return from death: a member back on the ring that this node
            // had believed dead owned its keys meanwhile, by the ring without this node (found by
            // Cluster/chaos, netns seed 67: they were served from the stale copy before it handed back)
            let reappeared = new.members.filter { $0 != me && !old.members.contains($0) && alive.contains($0) && !said.contains($0) }
            if !reappeared.isEmpty {
                sinceReturn.formUnion(reappeared)
                owners.formUnion(reappeared)
                bases.append(new.removing(me))
                if bases.count > Self.maxBases { bases.removeFirst(bases.count - Self.maxBases) }
            }
        }
        waitingFor = Set(owners.filter { $0 != me && !said.contains($0) })
        deadline = now &+ limit
        askedAt = now
        if joining {
            if old.fingerprint != new.fingerprint { done[old.fingerprint] = nil }
        } else {
            done = done.filter { $0.key == new.fingerprint }
        }
        if waitingOnRing.isEmpty { bases = [] }
    }

    /// This node was declared dead and is back (it refuted): whatever it owns on `ring` was taken
    /// over by others meanwhile. Until each live member says it handed back (or `limit` passes),
    /// this node serves none of its keys: it would answer from a stale copy. `incarnation`: the
    /// one it announced its return with; "done" messages stamped below it count for nothing.
    public mutating func returnedFromDeath(ring: HashRing, incarnation: UInt64, now: UInt64) {
        returnedAs = max(returnedAs, incarnation)
        bases = [ring.removing(me)]
        current = ring
        done = [:]
        waitingFor = Set(ring.members.filter { $0 != me })
        sinceReturn = waitingFor
        viewFresh = false
        deadline = now &+ limit
        askedAt = now
    }

    /// Back from death, this node merged a live member's whole view (SWIM's `syncView`): the
    /// members off its ring now are dead in that member's view too, not just in this node's stale
    /// one, and hand nothing back; nor does one that dies later (unless it comes back).
    public mutating func viewRefreshed() {
        guard !sinceReturn.isEmpty else { return }
        viewFresh = true
        if let current { sinceReturn.formIntersection(current.members) }
        if waitingOnRing.isEmpty { bases = [] }
    }

    /// The members to ask now whether they have handed off for the current ring (with its
    /// fingerprint): those on it still waited for, at most once every `interval` while the wait
    /// lasts; nil when there is no one to ask yet. A member answers only once it has carried out
    /// that ring. Without this, a "done" can be lost for good: one that arrived just before a
    /// return from death is forgotten with everything else, and the member that sent it, having
    /// carried out its ring already, says nothing more; asked for another ring (the one this node
    /// had at its return), it stays silent too. The node then waited the whole limit (found by
    /// Cluster/chaos, netns seed 2: after a 2 s partition, a node refused its keys for 3 s).
    public mutating func membersToAsk(now: UInt64, every interval: UInt64) -> (fingerprint: UInt64, members: [String])? {
        guard isWaiting(now: now), let current, now >= askedAt &+ interval else { return nil }
        let ask = waitingFor.filter { current.members.contains($0) }.sorted()
        guard !ask.isEmpty else { return nil }
        askedAt = now
        return (current.fingerprint, ask)
    }

    /// Keeps only the "done" messages that may still count: those for the current ring, and
    /// those for a ring still ahead that arrived within the limit. At most `maxBases` rings'
    /// worth besides the current one, newest first: a bound against a peer that says "done" for
    /// many rings.
    private mutating func forgetStaleDones(now: UInt64) {
        let mine = current?.fingerprint
        for (fingerprint, senders) in done where fingerprint != mine {
            let recent = senders.filter { now < $0.value &+ limit }
            done[fingerprint] = recent.isEmpty ? nil : recent
        }
        guard done.count > Self.maxBases else { return }
        let newestFirst = done.map { (fingerprint: $0.key, at: $0.value.values.max() ?? 0) }.sorted { $0.at > $1.at }
        for entry in newestFirst.dropFirst(Self.maxBases) where entry.fingerprint != mine { done[entry.fingerprint] = nil }
    }

    /// `node` has handed off everything it owned that this node owns under ring `fingerprint`,
    /// deciding so while it knew this node at `toIncarnation` (ignored if below the incarnation
    /// this node last returned from death with: see `returnedAs`).
    public mutating func handoffDone(from node: String, fingerprint: UInt64, toIncarnation: UInt64 = 0, now: UInt64) {
        guard toIncarnation >= returnedAs else { return }
        done[fingerprint, default: [:]][node] = now
        if done.count > Self.maxBases { forgetStaleDones(now: now) }
        if fingerprint == current?.fingerprint {
            waitingFor.remove(node)
            sinceReturn.remove(node)
            if waitingOnRing.isEmpty { bases = [] }
        }
    }

    /// May this node answer for a key with this hash (which it owns under the current ring)?
    public func mayServe(keyHash: UInt64, now: UInt64) -> Bool {
        guard isWaiting(now: now) else { return true }
        if holdsEveryKey(now: now) { return false }
        let waiting = waitingOnRing
        for base in bases {
            let holders = base.owners(ofHash: keyHash, count: copies)
            guard let before = holders.first else { continue }
            if waiting.contains(before) { return false }
            // (back from death: the cluster may have lost another of the key's holders while this
            // node was away, and the next one owned the key meanwhile; its "done" covers that)
            if !sinceReturn.isEmpty, holders.dropFirst().contains(where: { $0 != me && sinceReturn.contains($0) }) { return false }
            // (an owner gone from the ring hands nothing off: its replicas send their copies)
            if let current, !current.members.contains(before),
               holders.dropFirst().contains(where: { $0 != me && waiting.contains($0) }) { return false }
        }
        return true
    }

    /// How many rings' "done" messages are kept (tests: the bound).
    public var doneRingsKept: Int { done.count }

    /// Previous owners not done yet (for logs and tests).
    public var pending: Set<String> { waitingOnRing }
}
