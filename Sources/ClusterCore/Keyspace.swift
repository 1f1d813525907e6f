import PresenceCore

/// A key's replicated value, as `Keyspace` keeps it: a channel (`ChannelMachine`) or a user's home
/// record (`HomeRecord`). The value holds the rules of what it is; the keyspace holds who owns it,
/// its copies, and what to do when the ring changes, a copy arrives, a gateway is gone or says
/// what it holds.
public protocol ReplicatedValue: Sendable {
    associatedtype Key: Hashable & Comparable & Sendable
    /// What replicas and new owners receive: the whole value or the part that changed.
    associatedtype Copy: Sendable
    /// Events the value makes, already addressed.
    associatedtype Output: Sendable
    /// What a gateway says it holds for one session in this key (anti-entropy).
    associatedtype GatewayFact: Sendable
    /// What an owner tells a gateway that holds an older word than its own (anti-entropy).
    associatedtype Correction: Sendable

    static func ringHash(of key: Key) -> UInt64
    static func key(of copy: Copy) -> Key
    static func isFull(_ copy: Copy) -> Bool
    static func isHandoff(_ copy: Copy) -> Bool
    /// The same copy, no longer marked as a handoff (passed on by a node it was not meant for).
    static func passedOn(_ copy: Copy) -> Copy
    static func term(of copy: Copy) -> UInt64
    /// Where in its lineage a copy was taken (it only grows), and where this value is.
    static func version(of copy: Copy) -> UInt64
    var version: UInt64 { get }

    var isEmpty: Bool { get }
    /// Whether the value, empty, still remembers sessions that left: it is kept (for
    /// `departureMemory` wall ms), so a stale copy or a late word does not bring them back.
    var remembersDepartures: Bool { get }
    static var departureMemory: Int64 { get }
    var term: UInt64 { get }
    /// The processes where this value's sessions (and watchers) live.
    var sinks: Set<NodeInstance> { get }

    /// A new owner's first act: a lineage of versions above every earlier one.
    mutating func startLineage(now: Int64)
    /// The whole value as copies (the first replaces whatever the receiver held).
    func fullCopies(handoff: Bool) -> [Copy]
    /// A replica applies a copy from the owner, silently.
    mutating func install(_ copy: Copy)
    /// The owner merges another version of the value; the events it makes.
    mutating func merge(_ copy: Copy, keepsSessionsOf: (NodeInstance) -> Bool, now: Int64) -> [Output]
    /// This node became the owner (the previous one died or handed it off): events may have been
    /// lost on the way, so everyone following gets a fresh start (SNAPSHOTs).
    mutating func tookOver(now: Int64) -> [Output]
    /// The sessions and watchers at `sink` time out (their gateway is gone).
    mutating func timeOut(at sink: NodeInstance, now: Int64) -> [Output]
    /// Pushes to `node` may have been lost: fresh starts for whoever follows there.
    mutating func restart(followersAt node: String, now: Int64) -> [Output]

    /// Hashes of the facts of this value whose session lives at `sink` (anti-entropy digests);
    /// a gateway computes the same hashes from what it holds.
    func factHashes(at sink: NodeInstance) -> [UInt64]
    /// Reconciles what the gateway at `sink` holds here with this value.
    mutating func reconcile(_ facts: [GatewayFact], from sink: NodeInstance, now: Int64) -> Reconciliation<Output, Correction>
    /// The gateway at `sink` confirmed it no longer holds `session` here, as of its `version`.
    mutating func removeGone(_ session: SessionID, at sink: NodeInstance, version: UInt64, now: Int64) -> [Output]
    /// The session left the gateway at `sink` for `to` (its client resumed it there).
    mutating func moved(_ session: SessionID, from sink: NodeInstance, to: NodeInstance, version: UInt64, now: Int64) -> [Output]
    /// The gateway at `sink` gave up on the session's open before its client heard of it.
    mutating func removeNeverOpened(_ session: SessionID, at sink: NodeInstance, now: Int64) -> [Output]
}

/// What reconciling one key with a gateway's facts did.
public struct Reconciliation<Output: Sendable, Correction: Sendable>: Sendable {
    public var outputs: [Output] = []
    /// Sessions this owner places at the gateway that the gateway did not mention, with the
    /// version of that placement (the gateway confirms them gone as of it, or of its own later one).
    public var suspects: [SessionID: UInt64] = [:]
    /// Sessions the gateway holds under an epoch older than one this owner knows.
    public var superseded: [SessionID: UInt64] = [:]
    public var corrections: [Correction] = []
    public init() {}
}

/// The rules of a replicated keyspace (channels, or user homes), as one plain value
/// (RELIABILITY.md, "Replicated keyspace rules are one pure core"): which keys this node owns and
/// which copies it holds, what moves when the ring changes, which sessions are orphans (their
/// gateway's process is gone) and when they time out, and how copies and gateways' words are
/// merged. Inputs are the ring, copies, gateway facts and clock readings; outputs are `Effect`s
/// and values' events, which the shard actor carries out. Nothing here does I/O.
public struct Keyspace<V: ReplicatedValue>: Sendable {
    public let me: String
    public let replicationFactor: Int
    /// How long sessions of a gone gateway wait for their client to resume them elsewhere (ns).
    public let presenceTimeout: UInt64
    /// How long a key taken over from a copy that may be stale (one this node had dropped, or
    /// restored and not yet confirmed by its owner) stays unserved: no call, no SNAPSHOT, until
    /// another node's version of it is merged or this time (ns) passes, in which gateways'
    /// anti-entropy brings it up to date. 0: taken over and served at once.
    public let staleHold: UInt64
    private let make: @Sendable (V.Key) -> V

    public private(set) var ring: HashRing
    /// The values this node owns. (A `DenseDictionary`: a node's users' home records are 88 bytes
    /// each, and a `Dictionary` keeps up to 2.6 times their number of buckets, full or empty:
    /// 100,000 users' homes took 60 bytes per membership of the benchmark's, 44 this way. Change
    /// values in place with `modify`: `owned[key]!.change()` takes a copy and writes it back.)
    public private(set) var owned: DenseDictionary<V.Key, V> = [:]
    /// Owned keys whose followers are owed a fresh start this node held back: it waited for
    /// their handoff, and what it held may have been stale (`releaseHeldBack`).
    public private(set) var heldBack: Set<V.Key> = []
    /// Owned keys taken over from a possibly stale copy, and until when (monotonic ns) they are
    /// not served unless another node's version is merged first (`staleHold`).
    public private(set) var staleUntil: [V.Key: UInt64] = [:]
    public private(set) var copies: [V.Key: V] = [:]
    /// When each gone process was first seen gone (monotonic ns): its sessions time out a
    /// presence timeout later, unless it comes back.
    public private(set) var goneSince: [NodeInstance: UInt64] = [:]
    /// Owned keys that may hold sessions of a gone process.
    public private(set) var orphanKeys: Set<V.Key> = []
    /// While this node's serving lease has run out (it is cut off from the others): the next
    /// look at the orphans (monotonic ns). Nil while it holds its lease.
    public private(set) var sweepsHeldUntil: UInt64?
    /// Set once this node has handed everything off before leaving: it owns nothing any more.
    public private(set) var leaving = false
    /// Owned keys and copies that hold nobody but remember departures, and since when (wall ms):
    /// kept until `V.departureMemory` after that (see `keep`).
    public private(set) var emptied: [V.Key: Int64] = [:]
    public private(set) var emptiedCopies: [V.Key: Int64] = [:]
    /// Copies a ring change made this node drop, and since when (wall ms), kept for a presence
    /// timeout from their first drop: the ring may have been a passing one (after a heal the
    /// members come back one at a time) while the owner's never changed, so nobody would send
    /// them again. If the ring comes back within that time, the copy is restored, unconfirmed, and
    /// a whole one asked for; or taken over from, if this node came to own the key.
    public private(set) var retired: [V.Key: (value: V, since: Int64)] = [:]
    /// Restored copies the owner has not confirmed with a whole copy yet, and when they were
    /// first dropped: they go when their time is up (the owner may not count this node as a
    /// replica at all), and the owner's whole copy replaces them whatever its lineage.
    public private(set) var unconfirmed: [V.Key: Int64] = [:]
    /// Processes this node saw come back (gone, then live again on its ring), and when: another
    /// node's word that one has been gone since before that is of the earlier absence (that node
    /// missed the return), and counts for nothing: else a process paused twice counts as gone
    /// from its first pause. Kept a presence timeout: older words are capped at it anyway.
    private var cameBackAt: [NodeInstance: UInt64] = [:]
    /// Copies that came as a handoff meant for the key's owner while this node did not own it,
    /// and when (wall ms). Such a copy may be the only whole version left: its sender has handed
    /// off and is leaving, and the owner it was passed on to may be leaving too. A ring change
    /// that gives the key another owner hands it on to that owner, for a presence timeout after
    /// it came (`handOnAfterRingChange`).
    public private(set) var handedHere: [V.Key: Int64] = [:]
    /// Keys this node handed off as their owner, keeping a copy as a replica, and when (wall ms).
    /// The handoff went to the owner of the ring it had then; a ring change that gives the key yet
    /// another owner within a presence timeout hands this copy to that owner too, before this node
    /// says it is done: the first receiver may be passing it on (or may have lost it) while the
    /// new owner, counting this node's "done", would serve without it (`handOnAfterRingChange`).
    public private(set) var handedAway: [V.Key: Int64] = [:]
    /// When the next retired or unconfirmed copy is due to go (wall ms).
    private var retirementDue = Int64.max
    /// When the earliest of `emptied` and `emptiedCopies` may be forgotten (or earlier).
    private var emptiedDue = Int64.max

    /// Something for the shard to do.
    public enum Effect: Sendable {
        /// Send a copy to a node; `replica`: the call being answered waits until it arrived.
        /// `gone`: how long (ns) each gone process with sessions in it has been gone.
        case send(V.Copy, to: String, replica: Bool, gone: [NodeInstance: UInt64])
        /// Carry out these events.
        case deliver([V.Output])
        /// Ask `node` (the key's owner) for a whole copy: this replica holds only part of it.
        case askForCopy(V.Key, from: String)
    }

    public init(me: String, replicationFactor: Int, presenceTimeout: UInt64, staleHold: UInt64 = 0, ring: HashRing? = nil,
                make: @escaping @Sendable (V.Key) -> V) {
        self.me = me
        self.replicationFactor = max(1, replicationFactor)
        self.presenceTimeout = presenceTimeout
        self.staleHold = staleHold
        self.make = make
        self.ring = ring ?? HashRing(members: [me])
    }

    // MARK: Ownership

    // (The per-call methods are pre-specialised for the two values a node keeps, as ChannelMachine's
    // are: called across modules, generic code looks up metadata and witnesses for every
    // dictionary access.)

    /// Whether the ring makes this node the key's owner (and it has not left).
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    public func isOwner(_ key: V.Key) -> Bool {
        !leaving && ring.owner(ofHash: V.ringHash(of: key)) ?? me == me
    }

    /// The key's replicas under the current ring (owner excluded).
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    public func replicas(of key: V.Key) -> [String] {
        guard replicationFactor > 1, ring.members.count > 1 else { return [] }
        return ring.owners(ofHash: V.ringHash(of: key), count: replicationFactor).filter { $0 != me }
    }

    /// Whether the process a session lives at is live on the current ring.
    public func isLive(_ sink: NodeInstance) -> Bool { ring.isLive(sink.id, boot: sink.boot) }

    /// A copy of an owned value (every field retained: on a per-call path, read it in place with
    /// `inspectOwned` instead).
    public subscript(owned key: V.Key) -> V? { owned[key] }

    /// Whether the key's value is held here as its owner (without copying it).
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    public func hasOwned(_ key: V.Key) -> Bool { owned.index(forKey: key) != nil }

    /// Lets `read` look at an owned value where it lies (an in-place access: no copy of the value
    /// and its fields). `read` must not change it (it is `inout` only to avoid the copy). False
    /// when the key is not owned here.
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    public mutating func inspectOwned(_ key: V.Key, _ read: (inout V) -> Void) -> Bool {
        guard let i = owned.index(forKey: key) else { return false }
        read(&owned[valueAt: i])
        return true
    }

    /// What `read` makes of an owned value, read in place (`inspectOwned`), or nil when the key is
    /// not owned here. (Inlinable: each caller's result type is specialised where it is called.)
    @inlinable
    public mutating func readOwned<R>(_ key: V.Key, _ read: (inout V) -> R) -> R? {
        var result: R? = nil
        _ = inspectOwned(key) { result = read(&$0) }
        return result
    }

    /// Whether an owned key was taken over from a possibly stale copy and is not to be served
    /// yet (`staleHold`): calls are refused (retryable), and its followers' fresh start waits.
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    public func isStale(_ key: V.Key, now: UInt64) -> Bool {
        guard let until = staleUntil[key] else { return false }
        return now < until
    }

    /// Whether the followers of an owned key may get their fresh start now.
    private func mayStart(_ key: V.Key, now: UInt64, _ mayServe: (V.Key) -> Bool) -> Bool {
        mayServe(key) && !isStale(key, now: now)
    }

    /// Runs an owner's call on the key's value (created, with a new lineage, when `create` and it
    /// does not exist); drops the value once it is empty. Nil when the value does not exist.
    /// (Inlinable: each caller's result type is specialised where it is called; the work is done
    /// by `withOwnedValue`, pre-specialised.)
    @inlinable
    public mutating func withOwned<R>(_ key: V.Key, create: Bool, now: Int64,
                                      _ body: (inout V) throws(PresenceError) -> R) throws(PresenceError) -> R? {
        var result: R? = nil
        _ = try withOwnedValue(key, create: create, now: now) { (v: inout V) throws(PresenceError) in result = try body(&v) }
        return result
    }

    /// `withOwned` for a body with no result (one specialisation per value type serves every
    /// caller); false when the value does not exist.
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    public mutating func withOwnedValue(_ key: V.Key, create: Bool, now: Int64,
                                        _ body: (inout V) throws(PresenceError) -> Void) throws(PresenceError) -> Bool {
        forgetEmptied(wall: now)
        // (the value is reached by its index, in place: `if let v = owned[key]` copies the whole
        // machine, a retain and a release of each of its tables per call)
        var found = owned.index(forKey: key)
        if found == nil {
            guard create else { return false }
            var v = make(key)
            v.startLineage(now: now)
            owned[key] = v
            settled(key)
            found = owned.index(forKey: key)
        }
        guard let i = found else { return false }
        do {
            try body(&owned[valueAt: i])
        } catch {
            keep(key, at: i, wall: now)
            throw error
        }
        keep(key, at: i, wall: now)
        return true
    }

    /// After a change to an owned key (or copy): an empty value is dropped, unless it remembers
    /// sessions that left. Those are kept a while: when a key's last session left, a version of
    /// it from before that (the other side of a partition, handed off or merged later) or a late
    /// word from a superseded gateway must still meet the departure, not an empty slate that
    /// takes the session back as new.
    private mutating func keep(_ key: V.Key, wall: Int64) {
        guard let i = owned.index(forKey: key) else {
            emptied[key] = nil
            return
        }
        keep(key, at: i, wall: wall)
    }

    private mutating func keep(_ key: V.Key, at i: Int, wall: Int64) {
        let (isEmpty, remembersDepartures) = Self.emptiness(&owned[valueAt: i])
        guard isEmpty else {
            if !emptied.isEmpty { emptied[key] = nil }
            return
        }
        if remembersDepartures {
            if emptied[key] == nil {
                emptied[key] = wall
                emptiedDue = min(emptiedDue, wall &+ V.departureMemory)
            }
        } else {
            owned.removeValue(forKey: key)
            emptied[key] = nil
        }
    }

    /// Whether a value is empty, and if so whether it remembers departures. (Read in place:
    /// `Dictionary.Values`' getter copies the whole value, a retain and a release of each of its
    /// tables; an inout access does not.)
    private static func emptiness(_ v: inout V) -> (isEmpty: Bool, remembersDepartures: Bool) {
        v.isEmpty ? (true, v.remembersDepartures) : (false, false)
    }

    private mutating func keepReplica(_ key: V.Key, wall: Int64) {
        guard let i = copies.index(forKey: key) else {
            if !emptiedCopies.isEmpty { emptiedCopies[key] = nil }
            return
        }
        let (isEmpty, remembersDepartures) = Self.emptiness(&copies.values[i])
        guard isEmpty else {
            if !emptiedCopies.isEmpty { emptiedCopies[key] = nil }
            return
        }
        if remembersDepartures {
            if emptiedCopies[key] == nil {
                emptiedCopies[key] = wall
                emptiedDue = min(emptiedDue, wall &+ V.departureMemory)
            }
        } else {
            copies[key] = nil
            emptiedCopies[key] = nil
        }
    }

    /// Drops the kept empty values whose departures are old enough to be forgotten.
    /// (Every call comes here: the lists are walked only once the earliest entry is due.)
    private mutating func forgetEmptied(wall: Int64) {
        if wall >= emptiedDue {
            for (key, since) in emptied where wall - since >= V.departureMemory {
                if owned[key]?.isEmpty == true { owned[key] = nil }
                emptied[key] = nil
            }
            for (key, since) in emptiedCopies where wall - since >= V.departureMemory {
                if copies[key]?.isEmpty == true { copies[key] = nil }
                emptiedCopies[key] = nil
            }
            let oldest = min(emptied.values.min() ?? .max, emptiedCopies.values.min() ?? .max)
            emptiedDue = oldest == .max ? .max : oldest &+ V.departureMemory
        }
        if wall >= retirementDue { expireRetired(wall: wall) }
    }

    private var retirement: Int64 { Int64(clamping: presenceTimeout / 1_000_000) }

    private mutating func expireRetired(wall: Int64) {
        for (key, r) in retired where wall - r.since >= retirement { retired[key] = nil }
        for (key, since) in unconfirmed where wall - since >= retirement {
            unconfirmed[key] = nil
            if !hasOwned(key) { copies[key] = nil }
        }
        let oldest = min(retired.values.map(\.since).min() ?? .max, unconfirmed.values.min() ?? .max)
        retirementDue = oldest == .max ? .max : oldest &+ retirement
    }

    /// The key is held (owned, or a confirmed copy) from now on: nothing retired of it may come back.
    private mutating func settled(_ key: V.Key) {
        retired[key] = nil
        unconfirmed[key] = nil
    }

    private mutating func retire(_ key: V.Key, _ v: V, wall: Int64) {
        let since = unconfirmed.removeValue(forKey: key) ?? retired[key]?.since ?? wall
        retired[key] = (v, since)
        retirementDue = min(retirementDue, since &+ retirement)
    }

    /// Notes that an owned key now has a session at `sink` (it may be a gone process).
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    public mutating func placed(_ key: V.Key, at sink: NodeInstance, now: UInt64) {
        guard !isLive(sink), hasOwned(key) else { return }
        orphanKeys.insert(key)
        if goneSince[sink] == nil { goneSince[sink] = now }
    }

    /// Copies of a changed key for its replicas (the call answers once they arrived).
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    public func replicate(_ copy: V.Copy) -> [Effect] {
        replicas(of: V.key(of: copy)).map { .send(copy, to: $0, replica: true, gone: [:]) }
    }

    private func sendAll(_ v: V, to node: String, handoff: Bool, replica: Bool = false, now: UInt64) -> [Effect] {
        let gone = goneAges(of: v, now: now)
        return v.fullCopies(handoff: handoff).map { .send($0, to: node, replica: replica, gone: gone) }
    }

    /// How long each gone process with sessions in `v` has been gone.
    private func goneAges(of v: V, now: UInt64) -> [NodeInstance: UInt64] {
        var out: [NodeInstance: UInt64] = [:]
        for sink in v.sinks where !isLive(sink) {
            if let since = goneSince[sink] { out[sink] = now > since ? now - since : 0 }
        }
        return out
    }

    // MARK: Ring changes

    /// The ring changed (members, or their processes): hand off what moved away, take over copies
    /// this node now owns (their followers get a fresh start), bring new replicas up to date, and
    /// note which processes are gone from when. A restarted member must be passed as two changes:
    /// without it, then with its new process.
    ///
    /// A key taken over from a copy while `mayServe` refuses it (this node waits for a handoff:
    /// back from a partition, its copy is stale) gets no SNAPSHOT from that copy: it is held
    /// back (`releaseHeldBack`).
    public mutating func ringChanged(to new: HashRing, now: UInt64, wall: Int64, mayServe: (V.Key) -> Bool = { _ in true }) -> [Effect] {
        let old = ring
        ring = new
        forgetEmptied(wall: wall)
        for id in old.members where !new.isLive(id, boot: old.boot(of: id)) {
            let gone = NodeInstance(id, boot: old.boot(of: id))
            if goneSince[gone] == nil { goneSince[gone] = now }
        }
        // processes thought gone that are live again (a pause, a healed partition): nothing was
        // sent to them meanwhile, so whoever follows an owned key there gets a fresh start
        let back = Set(goneSince.keys.filter { new.isLive($0.id, boot: $0.boot) }.map(\.id))
        if !cameBackAt.isEmpty { cameBackAt = cameBackAt.filter { now &- $0.value <= presenceTimeout } }
        for g in goneSince.keys where new.isLive(g.id, boot: g.boot) { cameBackAt[g] = now }
        goneSince = goneSince.filter { !new.isLive($0.key.id, boot: $0.key.boot) }
        guard !leaving else { return [] }
        var out: [Effect] = []
        for (key, v) in owned.sorted(by: { $0.key < $1.key }) {
            switch RingMove.owned(keyHash: V.ringHash(of: key), from: old, to: new, me: me, copies: replicationFactor) {
            case .handOff(let newOwner, let keepCopy):
                out += sendAll(v, to: newOwner, handoff: true, now: now)
                owned[key] = nil
                emptied[key] = nil
                staleUntil[key] = nil
                orphanKeys.remove(key)
                settled(key)
                if keepCopy {
                    handedAway[key] = wall
                    copies[key] = v
                    keepReplica(key, wall: wall)
                }
            case .keep(let newReplicas):
                for r in newReplicas { out += sendAll(v, to: r, handoff: false, now: now) }
            }
        }
        // Followers at processes thought gone that are live again get a fresh start from the keys
        // this node still owns: a key it handed off above is the new owner's to restart, and its
        // version here may have dropped members whose gateways this node could not see (found
        // reading this path for Cluster/chaos netns seed 93, whose followers got SNAPSHOTs without
        // such members at a heal). Keys taken over below start their followers afresh themselves.
        var restarted: [V.Output] = []
        for key in owned.keys.sorted() where owned[key]!.sinks.contains(where: { back.contains($0.id) && new.isLive($0.id, boot: $0.boot) }) {
            // (not from a copy this node may not serve yet: it may be stale)
            guard mayStart(key, now: now, mayServe) else {
                heldBack.insert(key)
                continue
            }
            for node in back.sorted() { restarted += owned.modify(key) { $0.restart(followersAt: node, now: wall) } ?? [] }
        }
        if !restarted.isEmpty { out.append(.deliver(restarted)) }
        let died = Set(old.members.filter { !new.isLive($0, boot: old.boot(of: $0)) })
        handedHere = handedHere.filter { copies[$0.key] != nil && wall - $0.value < retirement }
        handedAway = handedAway.filter { copies[$0.key] != nil && wall - $0.value < retirement }
        for (key, v) in copies.sorted(by: { $0.key < $1.key }) {
            switch RingMove.copy(keyHash: V.ringHash(of: key), from: old, to: new, me: me, copies: replicationFactor) {
            case .takeOver(_, let newReplicas):
                // (a copy restored after a drop that its owner has not confirmed may be stale)
                let stale = unconfirmed[key] != nil
                copies[key] = nil
                emptiedCopies[key] = nil
                forgetHanded(key)
                settled(key)
                out += takeOver(key, from: v, stale: stale, replicas: newReplicas, mayServe: mayServe, now: now, wall: wall)
            case .keep:
                out += toOwnerAfterDeath(key, v, from: old, died: died, now: now)
                    ?? handOnAfterRingChange(key, v, from: old, now: now)
            case .drop:
                out += toOwnerAfterDeath(key, v, from: old, died: died, now: now)
                    ?? handOnAfterRingChange(key, v, from: old, now: now)
                forgetHanded(key)
                copies[key] = nil
                emptiedCopies[key] = nil
                retire(key, v, wall: wall)
            }
        }
        out += ringCameBack(mayServe: mayServe, now: now, wall: wall, skipping: Set(copies.keys))
        findOrphans(now: now)
        return out
    }

    /// The copy this node kept as a replica of a key that another of its holders left the ring
    /// with (died: it hands nothing off) goes to the key's owner, which merges it, before this node
    /// says it is done with the ring change (`HandoffGate` waits for that). The owner may hold no
    /// copy of its own, or an older one: restarted after the dead holder last reached it (as its
    /// owner, or as the owner in between that was to hand it back), it would serve the key empty
    /// while a live replica holds its sessions. Not a copy no dead holder kept up to date here
    /// (this node was no holder of it, or restored it unconfirmed): merged, its older word would
    /// count. `died`: the members of `old` not live on the new ring.
    /// Nil when it sends nothing.
    private func toOwnerAfterDeath(_ key: V.Key, _ v: V, from old: HashRing, died: Set<String>, now: UInt64) -> [Effect]? {
        guard !died.isEmpty, unconfirmed[key] == nil else { return nil }
        let h = V.ringHash(of: key)
        let holders = old.owners(ofHash: h, count: replicationFactor)
        guard holders.contains(me), holders.contains(where: died.contains),
              let owner = ring.owner(ofHash: h), owner != me else { return nil }
        return sendAll(v, to: owner, handoff: true, now: now)
    }

    /// `key`'s copy here is gone or owned now: nothing of it is handed on any more.
    private mutating func forgetHanded(_ key: V.Key) {
        handedHere[key] = nil
        handedAway[key] = nil
    }

    /// A copy that came here as a handoff (`handedHere`), or that this node kept of a key it
    /// handed off (`handedAway`), goes to the key's new owner when the ring moves the key, before
    /// this node says it is done with the ring change: the new owner may have started after that
    /// handoff was sent, and nobody else may hold all of it.
    private func handOnAfterRingChange(_ key: V.Key, _ v: V, from old: HashRing, now: UInt64) -> [Effect] {
        guard handedHere[key] != nil || handedAway[key] != nil else { return [] }
        let h = V.ringHash(of: key)
        // (not a key this node owned until this change: its handoff went out above)
        let before = old.owner(ofHash: h)
        guard let owner = ring.owner(ofHash: h), owner != me, owner != before, before != me else { return [] }
        return sendAll(v, to: owner, handoff: true, now: now)
    }

    /// This node owns `key` now, from a copy: a new lineage, a fresh start for its followers (held
    /// back while this node may not serve it yet), and the replicas brought up to date. A copy
    /// that may be `stale` (dropped a while ago, or restored and unconfirmed) is not served for
    /// `staleHold`: a SNAPSHOT from it would leave out whoever joined since (found by
    /// Cluster/chaos, netns seed 2: after a heal, a node whose ring briefly lost the owner and its
    /// replica took over from a copy dropped four seconds before).
    private mutating func takeOver(_ key: V.Key, from copy: V, stale: Bool, replicas: [String], mayServe: (V.Key) -> Bool, now: UInt64, wall: Int64) -> [Effect] {
        var out: [Effect] = []
        var value = copy
        value.startLineage(now: wall)
        if stale && staleHold > 0 { staleUntil[key] = now &+ staleHold }
        out += freshStart(key, &value, mayServe: mayServe, now: now, wall: wall)
        owned[key] = value
        keep(key, wall: wall)
        for r in replicas { out += sendAll(value, to: r, handoff: false, now: now) }
        return out
    }

    /// A key this node starts owning: its followers' fresh start (SNAPSHOTs, current statuses)
    /// now, or, while `mayServe` refuses it or it is a stale takeover in its hold, held back for
    /// `releaseHeldBack`.
    private mutating func freshStart(_ key: V.Key, _ value: inout V, mayServe: (V.Key) -> Bool, now: UInt64, wall: Int64) -> [Effect] {
        guard mayStart(key, now: now, mayServe) else {
            heldBack.insert(key)
            return []
        }
        let events = value.tookOver(now: wall)
        return events.isEmpty ? [] : [.deliver(events)]
    }

    /// Retired copies whose key this node replicates or owns again on the current ring: restored
    /// (the owner is asked for a whole copy: changes made meanwhile did not come here), or taken
    /// over from, stale as it may be (gateways' anti-entropy brings it up to date).
    private mutating func ringCameBack(mayServe: (V.Key) -> Bool, now: UInt64, wall: Int64, skipping held: Set<V.Key>) -> [Effect] {
        var out: [Effect] = []
        for (key, r) in retired.sorted(by: { $0.key < $1.key }) where !held.contains(key) && !hasOwned(key) {
            let owners = ring.owners(ofHash: V.ringHash(of: key), count: replicationFactor)
            guard owners.contains(me) else { continue }
            retired[key] = nil
            if owners.first == me {
                unconfirmed[key] = nil
                out += takeOver(key, from: r.value, stale: true, replicas: Array(owners.dropFirst()), mayServe: mayServe, now: now, wall: wall)
            } else {
                copies[key] = r.value
                unconfirmed[key] = r.since
                keepReplica(key, wall: wall)
                out.append(.askForCopy(key, from: owners[0]))
            }
        }
        return out
    }

    /// Scans the owned keys for sessions of processes that are not live.
    private mutating func findOrphans(now: UInt64) {
        orphanKeys = []
        for (key, v) in owned {
            for sink in v.sinks where !isLive(sink) {
                orphanKeys.insert(key)
                if goneSince[sink] == nil { goneSince[sink] = now }
            }
        }
    }

    /// Graceful leave: every owned key goes to its owner on `ring` (the ring without this node);
    /// from now on this node owns nothing, so no acknowledged change can land only here.
    public mutating func handOffAll(to ring: HashRing, now: UInt64) -> [Effect] {
        var out: [Effect] = []
        for (key, v) in owned.sorted(by: { $0.key < $1.key }) {
            guard let owner = ring.owner(ofHash: V.ringHash(of: key)), owner != me else { continue }
            out += sendAll(v, to: owner, handoff: true, now: now)
        }
        leaving = true
        retired = [:]
        unconfirmed = [:]
        staleUntil = [:]
        for (key, v) in owned { copies[key] = v }
        owned = [:]
        emptied = [:]
        orphanKeys = []
        return out
    }

    // MARK: Copies

    /// A copy from another node: its owner's change (this node is a replica), a handoff from its
    /// previous owner, or another version of a key this node owns (merged). Stale copies — from an
    /// owner superseded by a later lineage — change nothing. A key started here from a handoff while
    /// `mayServe` refuses it (this node still waits for other members' handoffs) is held back, as a
    /// takeover is: its followers' SNAPSHOTs wait for `releaseHeldBack`.
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    public mutating func received(_ copy: V.Copy, from sender: String? = nil, gone: [NodeInstance: UInt64] = [:], now: UInt64, wall: Int64,
                                  mayServe: (V.Key) -> Bool = { _ in true }) -> [Effect] {
        let key = V.key(of: copy)
        forgetEmptied(wall: wall)
        // the sender's word on how long a process has been gone counts (capped at a presence
        // timeout), unless that process is live here
        for (sink, age) in gone {
            let since = now > min(age, presenceTimeout) ? now - min(age, presenceTimeout) : 0
            if let back = cameBackAt[sink], since < back { continue }
            if !isLive(sink) { goneSince[sink] = min(goneSince[sink] ?? since, since) }
        }
        if let i = owned.index(forKey: key) {
            // (another node's whole version, or its handoff, brings a stale takeover up to date)
            if V.isFull(copy) || V.isHandoff(copy) { staleUntil[key] = nil }
            // (a timeout the other version decided counts for a gateway this node has given up on
            // too: one gone from here for less than a presence timeout — a crash the other side,
            // cut off from it, had timed out before — is timed out by this node's own count.
            // Read from copies: given `self`, the merge would reach `self` while `owned` is changed,
            // and the value would be copied out and back)
            let ring = self.ring, goneSince = self.goneSince, timeout = presenceTimeout
            let events = owned[valueAt: i].merge(copy, keepsSessionsOf: { sink in
                ring.isLive(sink.id, boot: sink.boot) || goneSince[sink].map { now < $0 &+ timeout } ?? true
            }, now: wall)
            let v = owned[valueAt: i]
            keep(key, wall: wall)
            noteOrphans(key, now: now)
            var out: [Effect] = events.isEmpty ? [] : [.deliver(events)]
            // (after merging a whole other version, the replicas get the whole merged value: one
            // of them may hold that other version, whose lineage can be numbered above this one's)
            if !events.isEmpty || V.isHandoff(copy) || V.isFull(copy) {
                for r in replicas(of: key) { out += sendAll(v, to: r, handoff: false, now: now) }
            }
            return out
        }
        if isOwner(key) && !leaving {
            // this node owns the key and holds nothing of it yet: a handoff (or a copy from a
            // node that still thinks it owns it) starts it; only a whole copy can, and only from
            // a member of this node's ring. A node the ring holds dead (the other side of a
            // partition, back before the news of its return) hands off the copy it kept while the
            // members went on changing the key: started from it, this owner would serve it —
            // SNAPSHOTs without members who stayed — before the live holder's handoff came. The
            // live holders' handoffs, and the gateways' anti-entropy, bring the key.
            guard V.isFull(copy), sender.map({ ring.members.contains($0) }) ?? true else { return [] }
            var v = copies.removeValue(forKey: key) ?? retired[key]?.value ?? make(key)
            settled(key)
            emptiedCopies[key] = nil
            v.install(copy)
            v.startLineage(now: wall)
            // (the first of several handoffs — one from a node that was cut off holds a stale
            // version — must not give followers SNAPSHOTs without what the others bring)
            var out = freshStart(key, &v, mayServe: mayServe, now: now, wall: wall)
            owned[key] = v
            keep(key, wall: wall)
            noteOrphans(key, now: now)
            for r in replicas(of: key) { out += sendAll(v, to: r, handoff: false, now: now) }
            return out
        }
        // A handoff meant for the key's owner reached a node that does not own it on its ring:
        // the sender's ring differs (still being rebuilt after a heal, or ahead of this one). The
        // owner this node knows gets it too, to merge (unmarked, so it goes no further): else the
        // version it carries — the other side of a partition — never reaches the owner, and its
        // lineage, numbered above the owner's, makes this replica drop the owner's copies. It
        // goes on whatever its lineage: one numbered below the copy held here (an owner that took
        // over from a stale copy started a later one) still carries changes the owner lacks,
        // which the owner's merge keeps by their own versions.
        var passOn: [Effect] = []
        if V.isHandoff(copy), let owner = ring.owner(ofHash: V.ringHash(of: key)), owner != me {
            passOn = [.send(V.passedOn(copy), to: owner, replica: false, gone: gone)]
        }
        // a replica copy (a restored one the owner has not confirmed yet takes its whole copy,
        // whatever the lineage it held)
        let restored = unconfirmed[key] != nil
        if let held = copies[key], V.term(of: copy) < held.term, !(restored && V.isFull(copy)) { return passOn }  // from a superseded owner
        // a whole copy older than the one held, of the same lineage (relayed pushes overtake each
        // other): it would bring back what changed since (found by Cluster/chaos, netns seed 50)
        if let held = copies[key], V.isFull(copy), !restored, V.term(of: copy) == held.term, V.version(of: copy) < held.version { return passOn }
        // a change to a key this node holds no copy of (it was not a replica of it a moment ago,
        // by its ring): kept, but a replica must never take over from part of a key, so it asks
        // the owner for all of it
        let partial = !V.isFull(copy) && copies[key] == nil
        // a copy handed here goes to the owner before the owner's whole copy replaces it (its
        // changes, which the owner may lack, would be lost with it)
        var handOn: [Effect] = []
        if handedHere[key] != nil, V.isFull(copy), !V.isHandoff(copy), let held = copies[key],
           let owner = ring.owner(ofHash: V.ringHash(of: key)), owner != me {
            handOn = sendAll(held, to: owner, handoff: true, now: now)
            handedHere[key] = nil
        }
        if V.isFull(copy) || !restored { settled(key) }
        // (installed in place: a value taken out of the table while the table still holds it shares
        // its storage with it, and the install then copied all of it, the whole channel per change)
        if V.isFull(copy) { copies[key] = make(key) }
        copies[key, default: make(key)].install(copy)
        if V.isHandoff(copy) { handedHere[key] = wall }
        keepReplica(key, wall: wall)
        var out: [Effect] = []
        if partial, copies[key] != nil, let sender { out.append(.askForCopy(key, from: sender)) }
        return handOn + out + passOn
    }

    /// A replica asks for a whole copy of `key`: sent if this node owns it and `node` replicates it.
    public func wholeCopy(of key: V.Key, for node: String, now: UInt64) -> [Effect] {
        guard let v = owned[key], replicas(of: key).contains(node) else { return [] }
        return sendAll(v, to: node, handoff: false, now: now)
    }

    private mutating func noteOrphans(_ key: V.Key, now: UInt64) {
        guard let v = owned[key] else { return }
        for sink in v.sinks where !isLive(sink) {
            orphanKeys.insert(key)
            if goneSince[sink] == nil { goneSince[sink] = now }
        }
    }

    // MARK: Orphans

    /// When the next orphan is due (monotonic ns), if any.
    public var nextOrphanDeadline: UInt64? {
        guard !orphanKeys.isEmpty else { return nil }
        if let held = sweepsHeldUntil { return held }
        var next: UInt64? = nil
        for key in orphanKeys {
            guard let v = owned[key] else { continue }
            for sink in v.sinks where !isLive(sink) {
                let d = (goneSince[sink] ?? 0) &+ presenceTimeout
                next = min(next ?? d, d)
            }
        }
        return next
    }

    /// This node was declared dead and is back (cut off, or frozen): how long it counted other
    /// processes as gone meant nothing — it was the one gone, and may have counted the whole
    /// time. Each such count starts again now, so a session is timed out only after a presence
    /// timeout of absence seen from here since the return (found by Cluster/chaos, netns seed 52).
    public mutating func returnedFromDeath(now: UInt64) {
        for sink in goneSince.keys { goneSince[sink] = now }
    }

    /// Times out the sessions of processes gone for a presence timeout (unless they came back or
    /// moved meanwhile); their replicas learn it.
    /// `holdsLease`: whether this node heard from the cluster recently (`ServingLease`). Without
    /// its lease it cannot tell a gateway gone from its own cut: it times nobody out, looks again
    /// `recheck` later, and once it holds the lease again each absence it counted runs at least
    /// `grace` more — time for what it missed (a session's resume announced elsewhere, retried
    /// across the heal, or anti-entropy) to reach it.
    public mutating func sweep(now: UInt64, wall: Int64, holdsLease: Bool = true, recheck: UInt64 = 0, grace: UInt64 = 0) -> [Effect] {
        guard holdsLease else {
            sweepsHeldUntil = now &+ max(recheck, 1)
            return []
        }
        if sweepsHeldUntil != nil {
            sweepsHeldUntil = nil
            let floor = now &+ grace
            for (sink, since) in goneSince where since &+ presenceTimeout < floor {
                goneSince[sink] = floor >= presenceTimeout ? floor - presenceTimeout : 0
            }
        }
        var out: [Effect] = []
        for key in orphanKeys.sorted() {
            guard var v = owned[key] else {
                orphanKeys.remove(key)
                continue
            }
            var events: [V.Output] = []
            var waiting = false
            var timedOut = false
            for sink in v.sinks.sorted() where !isLive(sink) {
                let since = goneSince[sink] ?? now
                if goneSince[sink] == nil { goneSince[sink] = now }
                if now >= since &+ presenceTimeout {
                    events += v.timeOut(at: sink, now: wall)
                    timedOut = true
                } else {
                    waiting = true
                }
            }
            if !waiting { orphanKeys.remove(key) }
            // (a timeout changes the value even when it makes no event for anyone — nobody there
            // follows presence, or the user has another session: it is kept all the same, else
            // the sessions stay, and the key is no orphan any more to be swept again)
            guard timedOut else { continue }
            owned[key] = v
            keep(key, wall: wall)
            if !events.isEmpty { out.append(.deliver(events)) }
            for r in replicas(of: key) { out += sendAll(v, to: r, handoff: false, now: now) }
        }
        return out
    }

    /// `node` asks whether this node has handed off to it (it waits for handoffs): the copies
    /// handed here whose key it owns go to it again first. The push that passed one on as it came
    /// may have been dropped (`node` was not a live member here then), and without a ring change
    /// here nothing else would send it.
    public func handOn(to node: String, now: UInt64, wall: Int64) -> [Effect] {
        var out: [Effect] = []
        let handed = handedHere.merging(handedAway) { max($0, $1) }
        for (key, since) in handed.sorted(by: { $0.key < $1.key }) where wall - since < retirement {
            guard let v = copies[key], node != me, ring.owner(ofHash: V.ringHash(of: key)) == node else { continue }
            out += sendAll(v, to: node, handoff: true, now: now)
        }
        return out
    }

    /// Copies sent to `node` were lost: whole copies of every owned key it is a replica of.
    public func resync(replica node: String, now: UInt64) -> [Effect] {
        var out: [Effect] = []
        for (key, v) in owned.sorted(by: { $0.key < $1.key }) where replicas(of: key).contains(node) {
            out += sendAll(v, to: node, handoff: false, now: now)
        }
        return out
    }

    /// Pushes to `node` may have been lost (its queue was dropped or shed): everyone following an
    /// owned key there gets a fresh start.
    /// Keys `mayServe` refuses (this node waits for their handoff: what it holds may be stale)
    /// get no SNAPSHOT from it now: they are held back, for `releaseHeldBack` once it may serve.
    public mutating func restart(followersAt node: String, now: UInt64, wall: Int64, mayServe: (V.Key) -> Bool = { _ in true }) -> [Effect] {
        var events: [V.Output] = []
        for key in owned.keys.sorted() where owned[key]!.sinks.contains(where: { $0.id == node }) {
            guard mayStart(key, now: now, mayServe) else {
                heldBack.insert(key)
                continue
            }
            events += owned.modify(key) { $0.restart(followersAt: node, now: wall) } ?? []
        }
        return events.isEmpty ? [] : [.deliver(events)]
    }

    /// Keys held back whose handoff has landed (or the wait is over), and stale takeovers brought
    /// up to date or past their hold, get their fresh start now: every follower a SNAPSHOT of
    /// what this node holds after the merge.
    public mutating func releaseHeldBack(now: UInt64, wall: Int64, mayServe: (V.Key) -> Bool) -> [Effect] {
        var events: [V.Output] = []
        for key in heldBack.sorted() where mayStart(key, now: now, mayServe) { events += release(key, wall: wall) }
        heldBack = heldBack.filter { hasOwned($0) }
        staleUntil = staleUntil.filter { hasOwned($0.key) && now < $0.value }
        return events.isEmpty ? [] : [.deliver(events)]
    }

    /// A key held back that the shell is about to serve a call on (the gate lets it, and it is not
    /// a stale takeover in its hold): its fresh start comes first, so the call's events follow
    /// the SNAPSHOTs instead of reaching followers that do not follow this owner yet.
    /// (On every call: a set with nothing held back is not hashed into.)
    public mutating func releaseHeldBack(_ key: V.Key, wall: Int64) -> [Effect] {
        guard !heldBack.isEmpty, heldBack.contains(key) else { return [] }
        let events = release(key, wall: wall)
        return events.isEmpty ? [] : [.deliver(events)]
    }

    /// A held-back key's fresh start.
    private mutating func release(_ key: V.Key, wall: Int64) -> [V.Output] {
        heldBack.remove(key)
        staleUntil[key] = nil
        return owned.modify(key) { $0.tookOver(now: wall) } ?? []
    }

    // MARK: Anti-entropy (owner side)

    /// This owner's digest of what it places at the gateway `sink`, bucketed like the gateway's.
    @_specialize(exported: true, where V == ChannelMachine<NodeInstance>)
    @_specialize(exported: true, where V == HomeRecord<NodeInstance>)
    /// (Mutating only to read each value where it lies, through the table's in-place access:
    /// iterating the table, or its `values` getter, copied every value, a retain and a release of
    /// each of its tables, for each gateway every round. Nothing is changed.)
    public mutating func digest(of sink: NodeInstance) -> FactDigest {
        var d = FactDigest()
        for i in 0..<owned.count {
            let h = V.ringHash(of: owned.key(at: i))
            Self.addFacts(of: &owned[valueAt: i], at: sink, keyHash: h, to: &d)
        }
        return d
    }

    private static func addFacts(of v: inout V, at sink: NodeInstance, keyHash h: UInt64, to d: inout FactDigest) {
        for f in v.factHashes(at: sink) { d.add(keyHash: h, fact: f) }
    }

    /// Reconciles the facts a gateway sent for `buckets`: every owned key in those buckets with a
    /// session there, and every key the gateway mentions that this node owns.
    /// Keys `mayServe` refuses (a handoff from their previous owner has not arrived yet) are left
    /// for a later round: a key this node is only about to own must not start from one gateway's word.
    public mutating func reconcile(from sink: NodeInstance, buckets: Set<Int>, facts: [V.Key: [V.GatewayFact]],
                                   mayServe: (V.Key) -> Bool = { _ in true },
                                   now: UInt64, wall: Int64) -> (effects: [Effect], results: [V.Key: Reconciliation<V.Output, V.Correction>]) {
        var keys = Set(facts.keys.filter { isOwner($0) })
        for (key, v) in owned where buckets.contains(FactDigest.bucket(V.ringHash(of: key))) && v.sinks.contains(sink) {
            keys.insert(key)
        }
        keys = keys.filter(mayServe)
        var effects: [Effect] = []
        var results: [V.Key: Reconciliation<V.Output, V.Correction>] = [:]
        for key in keys.sorted() {
            let given = facts[key] ?? []
            var r = Reconciliation<V.Output, V.Correction>()
            _ = try? withOwned(key, create: !given.isEmpty, now: wall) { v in r = v.reconcile(given, from: sink, now: wall) }
            if !r.outputs.isEmpty {
                effects.append(.deliver(r.outputs))
                if let v = owned[key] {
                    for rep in replicas(of: key) { effects += sendAll(v, to: rep, handoff: false, now: now) }
                }
                r.outputs = []
            }
            results[key] = r
        }
        return (effects, results)
    }

    /// The gateway at `sink` confirmed which suspects it does not hold (as of each one's version),
    /// which of them moved to another gateway, and which it never opened.
    public mutating func confirmed(from sink: NodeInstance, gone: [(V.Key, SessionID, UInt64)],
                                   moved: [(V.Key, SessionID, NodeInstance, UInt64)], neverOpened: [(V.Key, SessionID)] = [],
                                   now: UInt64, wall: Int64) -> [Effect] {
        var effects: [Effect] = []
        var touched = Set<V.Key>()
        for (key, session) in neverOpened {
            guard let i = owned.index(forKey: key) else { continue }
            let events = owned[valueAt: i].removeNeverOpened(session, at: sink, now: wall)
            if !events.isEmpty { effects.append(.deliver(events)) }
            touched.insert(key)
            keep(key, wall: wall)
        }
        for (key, session, to, version) in moved {
            guard let i = owned.index(forKey: key) else { continue }
            let events = owned[valueAt: i].moved(session, from: sink, to: to, version: version, now: wall)
            if !events.isEmpty { effects.append(.deliver(events)) }
            touched.insert(key)
            noteOrphans(key, now: now)
        }
        for (key, session, version) in gone {
            guard let i = owned.index(forKey: key) else { continue }
            let events = owned[valueAt: i].removeGone(session, at: sink, version: version, now: wall)
            if !events.isEmpty { effects.append(.deliver(events)) }
            touched.insert(key)
            keep(key, wall: wall)
        }
        for key in touched.sorted() {
            guard let v = owned[key] else { continue }
            for r in replicas(of: key) { effects += sendAll(v, to: r, handoff: false, now: now) }
        }
        return effects
    }
}

// MARK: The node's two values

// The shards do not call `withOwned` and `readOwned`: inlined into them from this module, those
// called the generic `withOwnedValue` and `inspectOwned`, not their pre-specialisations, and
// constrained overloads compiled here stayed generic in their result (metadata lookups and
// copies through value witnesses on every call: 4.4% of building memberships). Each shard has
// its own two-line `withOwned`/`readOwned`, calling the pre-specialised functions directly.

/// Digests of (key, fact) hashes in 64 buckets by key position: a gateway and an owner that hold
/// the same facts compute the same digest, and a mismatch names the buckets to exchange.
public struct FactDigest: Sendable, Equatable {
    public static let buckets = 64
    public private(set) var counts = [UInt32](repeating: 0, count: FactDigest.buckets)
    public private(set) var sums = [UInt64](repeating: 0, count: FactDigest.buckets)

    public init() {}
    public init(counts: [UInt32], sums: [UInt64]) {
        guard counts.count == Self.buckets, sums.count == Self.buckets else { return }
        self.counts = counts
        self.sums = sums
    }

    public static func bucket(_ keyHash: UInt64) -> Int { Int(keyHash >> 58) }

    public mutating func add(keyHash: UInt64, fact: UInt64) {
        let b = Self.bucket(keyHash)
        counts[b] &+= 1
        sums[b] &+= Self.mix(keyHash ^ fact)
    }

    /// Adds another digest's facts (of other keys) to this one.
    public mutating func add(_ other: FactDigest) {
        for i in 0..<Self.buckets {
            counts[i] &+= other.counts[i]
            sums[i] &+= other.sums[i]
        }
    }

    /// Buckets whose digests differ.
    public func mismatches(_ other: FactDigest) -> Set<Int> {
        Set((0..<Self.buckets).filter { counts[$0] != other.counts[$0] || sums[$0] != other.sums[$0] })
    }

    static func mix(_ x: UInt64) -> UInt64 {
        var z = x &+ 0x9e37_79b9_7f4a_7c15
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }

    /// One fact's hash from its parts (both sides hash the same fields in the same order).
    public static func hash(_ parts: UInt64...) -> UInt64 {
        var h: UInt64 = 0x243f_6a88_85a3_08d3
        for p in parts { h = mix(h ^ p) }
        return h
    }
}
