import ClusterCore
import EventLoop
import PresenceCore
import Synchronization

/// What routing needs to know, shared by every actor of the node: this node's id and process
/// (boot), the ring of live members with their processes (owner first, then replicas), the
/// replication factor, and whether a key this node owns may be served yet (`HandoffGate`).
/// Updated by the membership shell on every ring change.
public final class Topology: Sendable {
    public let me: String
    /// This process: drawn at start, so a restart is a new member instance (RELIABILITY.md).
    public var boot: UInt64 { state.withLock { $0.boot } }
    public var instance: NodeInstance { NodeInstance(me, boot: boot) }
    /// Nodes holding each channel's (and user home's) state, owner included.
    public let replicationFactor: Int
    private struct State {
        var boot: UInt64
        var ring: HashRing
        var gate: HandoffGate
        /// False until this node has joined its seeds (it owns nothing it could answer for).
        var ready: Bool
        /// False between a ring change and the end of the engine's handoff and takeover for it:
        /// the shards may not hold yet what the new ring says this node owns.
        var settled = true
        /// Set when this node has handed everything off to leave: it owns nothing, and routes as
        /// if it were gone already.
        var leaving = false
        /// The ring calls are routed by (without this node once it leaves).
        var routing: HashRing
        /// Whether this node heard from the cluster lately enough to answer from its view.
        var lease: ServingLease
        /// After how long without an answered probe this node counts as cut off (0: never).
        var cutOffAfter: UInt64
    }
    private let state: Mutex<State>
    /// Where time is read (the clock seam).
    let clock: EngineClock
    private var now: UInt64 { clock.monotonicNanoseconds() }
    private let readyObservers = Mutex<[@Sendable () -> Void]>([])
    /// Where a member's incarnation is read (membership's SWIM view; never called under this
    /// topology's lock). Kept in a struct, not as a bare closure in the `Mutex`: see `ObserverSlot`.
    private struct IncarnationLookup: Sendable {
        let read: @Sendable (String) -> UInt64?
    }
    private let incarnations = Mutex<IncarnationLookup?>(nil)
    private struct HealthLookup: Sendable {
        let read: @Sendable (String) -> Bool
    }
    private let health = Mutex<HealthLookup?>(nil)

    public init(me: String, boot: UInt64 = Topology.newBoot(), replicationFactor: Int, handoffLimit: UInt64 = 3_000_000_000,
                lease: UInt64 = 0, cutOffAfter: UInt64 = 0, ready: Bool = true, clock: EngineClock = SystemClock()) {
        self.me = me
        self.clock = clock
        self.replicationFactor = max(1, replicationFactor)
        let ring = HashRing(members: [me], boots: [me: boot])
        state = Mutex(State(boot: boot, ring: ring, gate: HandoffGate(me: me, limit: handoffLimit, copies: max(1, replicationFactor)), ready: ready, routing: ring,
                                 lease: ServingLease(duration: lease), cutOffAfter: cutOffAfter))
    }

    /// A fresh process instance: the wall clock in ns (a restart on the same host is always
    /// later), which SWIM raises further if the cluster already knows a later one for this id.
    public static func newBoot() -> UInt64 { newBoot(wallMilliseconds: WallClock.nowMilliseconds(), random: UInt64.random(in: 0..<1_000_000)) }

    /// The boot of a process started at `wallMilliseconds`, with `random` (below a million) apart
    /// processes started in the same millisecond.
    public static func newBoot(wallMilliseconds: Int64, random: UInt64) -> UInt64 {
        UInt64(max(1, wallMilliseconds)) &* 1_000_000 &+ random % 1_000_000
    }

    public var ring: HashRing { state.withLock { $0.ring } }
    public var isReady: Bool { state.withLock { $0.ready } }
    public var isAlone: Bool { state.withLock { $0.ring.members.count == 1 } }
    public var isLeaving: Bool { state.withLock { $0.leaving } }
    /// Whether this node is cut off from the cluster at `now`: it has other members, but none
    /// answered its probes for `cutOffAfter` (a partition; or a process just back from a freeze,
    /// until its next probe is answered). A failed call is then answered at once instead of tried
    /// again for the routing window (`RoutingWindow`): from a partition none of its attempts could
    /// succeed, and its clients do better moving; after a freeze it costs a client one retry.
    public func isCutOff(now: UInt64? = nil) -> Bool {
        let now = now ?? self.now
        return state.withLock { s in s.cutOffAfter > 0 && s.ring.members.count > 1 && s.lease.silent(for: s.cutOffAfter, now: now) }
    }
    /// Whether this node heard from the cluster recently enough to answer for its keys
    /// (`ServingLease`; always, alone).
    public var holdsLease: Bool {
        state.withLock { s in s.ring.members.count == 1 || s.lease.holds(now: self.now) }
    }
    /// Whether the engine has carried out the current ring.
    public var isSettled: Bool { state.withLock { $0.settled } }

    public func owner(of key: ChannelKey) -> String { state.withLock { $0.routing.owner(of: key) } ?? me }
    public func owners(of key: ChannelKey) -> [String] { state.withLock { $0.ring.owners(of: key, count: replicationFactor) } }
    public func home(of user: String) -> String { state.withLock { $0.routing.home(ofUser: user) } ?? me }

    /// A key's owner and the fingerprint of the ring that says so (sent along, for the owner to check).
    public func route(_ key: ChannelKey) -> (String, UInt64) {
        state.withLock { ($0.routing.owner(of: key) ?? me, $0.routing.fingerprint) }
    }

    /// A user's home and the ring's fingerprint.
    public func route(user: String) -> (String, UInt64) {
        state.withLock { ($0.routing.home(ofUser: user) ?? me, $0.routing.fingerprint) }
    }

    /// The ring calls are routed by, and its fingerprint.
    public var routingRing: HashRing { state.withLock { $0.routing } }

    /// Why a call routed by the ring with `fingerprint` may not be answered here: the rings differ
    /// (membership is still converging), or the call carries no fingerprint (every node stamps
    /// its calls: one without is not answered from a view the caller may not share); or nil.
    public func ringMismatch(_ fingerprint: UInt64) -> String? {
        guard fingerprint != 0 else { return "RING_MISMATCH: the call carries no ring fingerprint; retry" }
        return state.withLock { s in
            s.routing.fingerprint == fingerprint ? nil : "RING_MISMATCH: this node's view of the cluster differs from the caller's; retry"
        }
    }

    /// Why this node may not answer for a key it owns right now, or nil when it may.
    public func notServing(keyHash: @autoclosure () -> UInt64) -> String? {
        state.withLock { s in
            if s.leaving { return "LEAVING: this node is leaving the cluster and has handed its keys off; retry" }
            if s.ready && s.settled && s.ring.members.count == 1 { return nil }
            if !s.lease.holds(now: self.now) {
                return "NO_LEASE: this node has not heard from the cluster lately (it may have been frozen); retry"
            }
            if !s.ready { return "NOT_READY: this node has not joined the cluster yet" }
            if !s.settled { return "RING_CHANGING: ownership is moving; retry" }
            if !s.gate.mayServe(keyHash: keyHash(), now: self.now) {
                return "HANDOFF_IN_PROGRESS: this key is moving to this node; retry"
            }
            return nil
        }
    }

    /// Why this node may not answer for these users (homed here) right now, or nil when it may
    /// answer for every one of them. A call for several users (a Watch) must be refused while any
    /// of them waits for its handoff: answering would create that user's record from nothing, and
    /// the empty record, copied to the replicas as a new lineage, would replace the sessions they
    /// hold (found by Cluster/chaos, netns seed 51: only the first user was checked).
    public func notServing(users: [String]) -> String? {
        for u in users {
            if let why = notServing(keyHash: HashRing.hash(ofUser: u)) { return why }
        }
        return nil
    }

    /// Installs a new ring; returns the one it replaces (nil when nothing changed).
    public func update(ring new: HashRing, now: UInt64? = nil) -> HashRing? {
        let now = now ?? self.now
        return state.withLock { s in
            guard new != s.ring else { return nil }
            let old = s.ring
            s.ring = new
            if s.ready && new.members.count > 1 { s.lease.began(at: now) }
            s.routing = s.leaving ? new.removing(me) : new
            s.settled = false
            s.gate.ringChanged(from: s.ready ? old : new.removing(me), to: new, alive: Set(new.members), now: self.now, joining: !s.ready)
            return old
        }
    }

    /// The engine has carried out the change to the ring with this fingerprint.
    public func settled(_ fingerprint: UInt64) {
        state.withLock { s in if s.ring.fingerprint == fingerprint { s.settled = true } }
    }

    /// This node hands its keys off to leave: from now on it serves none and routes without itself.
    public func startLeaving() {
        state.withLock { s in
            s.leaving = true
            s.routing = s.ring.removing(me)
        }
    }

    /// The cluster already knew a later process of this id than this one (its host's clock was
    /// behind): SWIM took a later boot, and so does everything else, before this node serves.
    public func adoptBoot(_ boot: UInt64) {
        state.withLock { s in
            guard boot > s.boot else { return }
            s.boot = boot
            s.ring = s.ring.adding(me, boot: boot)
            s.routing = s.leaving ? s.ring.removing(me) : s.ring
        }
    }

    public func markReady(now: UInt64? = nil) {
        let now = now ?? self.now
        let observers = state.withLock { s -> [@Sendable () -> Void] in
            guard !s.ready else { return [] }
            s.ready = true
            if s.ring.members.count > 1 { s.lease.began(at: now) }
            return readyObservers.withLock { $0 }
        }
        for o in observers { o() }
    }

    /// Runs `observer` once this node becomes ready (at once if it is).
    public func onReady(_ observer: @escaping @Sendable () -> Void) {
        readyObservers.withLock { $0.append(observer) }
        if isReady { observer() }
    }

    /// A member answered this node's probe (`ServingLease`): a node that has not heard from the
    /// cluster for longer than others take to declare it dead (a frozen process, just resumed)
    /// answers nothing from its possibly stale view until it has heard again.
    public func heardFromCluster(at now: UInt64) {
        state.withLock { $0.lease.heard(at: now) }
    }

    /// This node was declared dead and is back, announced as `incarnation`: it serves none of its
    /// keys until the others handed back what they took over meanwhile (`HandoffGate.returnedFromDeath`).
    public func returnedFromDeath(incarnation: UInt64) {
        state.withLock { s in s.gate.returnedFromDeath(ring: s.ring, incarnation: incarnation, now: self.now) }
    }

    /// The incarnation this node last announced a return from death with (0: none): carried by
    /// its handoff requests, and back by their answers.
    public var returnIncarnation: UInt64 { state.withLock { $0.gate.returnedAs } }

    /// Sets where members' incarnations are read (`incarnation(of:)`).
    public func readIncarnations(from lookup: @escaping @Sendable (String) -> UInt64?) {
        incarnations.withLock { $0 = IncarnationLookup(read: lookup) }
    }

    /// Sets where members' health is read (`relays(for:)`): whether the failure detector holds
    /// a member alive, not suspected.
    public func readHealth(from lookup: @escaping @Sendable (String) -> Bool) {
        health.withLock { $0 = HealthLookup(read: lookup) }
    }

    /// The members a call or push for `node` may go through when the direct link fails: on the
    /// ring, neither `node` nor this one, and held alive by the failure detector (a member being
    /// suspected, or dead and not yet off the ring, would cost the attempt its whole timeout).
    public func relays(for node: String) -> [String] {
        let lookup = health.withLock { $0 }
        let candidates = ring.members.filter { $0 != node && $0 != me }
        guard let lookup else { return candidates }
        return candidates.filter(lookup.read)
    }

    /// The incarnation this node knows `member` at (0 when it knows none): a "done" sent to it
    /// carries it (`HandoffGate.returnedAs`).
    public func incarnation(of member: String) -> UInt64 {
        let lookup = incarnations.withLock { $0 }
        return lookup?.read(member) ?? 0
    }

    /// Back from death, this node took a live member's whole view (`HandoffGate.viewRefreshed`).
    public func viewRefreshed() {
        state.withLock { s in s.gate.viewRefreshed() }
    }

    /// The members to ask again whether they have handed off for this node's ring, and its
    /// fingerprint: those still waited for, once every `interval` (`HandoffGate.membersToAsk`).
    public func handoffRequestsDue(every interval: UInt64, now: UInt64? = nil) -> (fingerprint: UInt64, members: [NodeInstance])? {
        let now = now ?? self.now
        return state.withLock { s in
            guard let ask = s.gate.membersToAsk(now: now, every: interval) else { return nil }
            return (ask.fingerprint, ask.members.map { NodeInstance($0, boot: s.ring.boot(of: $0)) })
        }
    }

    /// Whether this node still waits for a previous owner's handoff.
    public func waitsForHandoff(now: UInt64? = nil) -> Bool {
        let now = now ?? self.now
        return state.withLock { $0.gate.isWaiting(now: now) }
    }

    /// Previous owners this node still waits for, sorted and comma-separated (logs).
    public var handoffPending: String { state.withLock { $0.gate.pending }.sorted().joined(separator: ",") }

    /// `node` says it has handed off, for the ring with this fingerprint, deciding so while it
    /// knew this node at `toIncarnation` (`HandoffGate.handoffDone`).
    public func handoffDone(from node: String, fingerprint: UInt64, toIncarnation: UInt64) {
        state.withLock { $0.gate.handoffDone(from: node, fingerprint: fingerprint, toIncarnation: toIncarnation, now: self.now) }
    }
}
