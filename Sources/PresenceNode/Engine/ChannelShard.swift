import ClusterCore
import EventLoop
import PresenceCore
import PresenceWire

/// Owns a share of this node's channels outright (no locks): a `Keyspace` of `ChannelMachine`s,
/// the channels this node owns and the replica copies it holds. It runs the owner's calls on the
/// machines, and carries out what the keyspace and the machines decide: events once per gateway,
/// copies to replicas and new owners, timeouts of sessions whose gateway is gone, and the
/// anti-entropy exchanges with gateways. Runs on an event loop: a call arriving on that loop's
/// connections reaches it without a thread hop.
actor ChannelShard {
    typealias Machine = ChannelMachine<NodeInstance>
    nonisolated let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private(set) var space: Keyspace<Machine>
    private let intervalNanoseconds: UInt64
    private let clock: EngineClock
    private let fabric: Fabric
    private var intervalChannels = Set<ChannelKey>()
    private var ticker: Task<Void, Never>? = nil
    private var sweeper: Task<Void, Never>? = nil
    private var sweepAt: UInt64? = nil
    /// Copies that arrived before this shard carried out the ring change they were sent for.
    private var early: [(ChannelCopy<NodeInstance>, String?, [NodeInstance: UInt64])] = []
    /// Replica copies sent by the call being handled: the call answers once they arrived.
    private var replicaTickets: [PeerLink.Ticket] = []
    /// Encoded pages of the channels this shard owns, until they change.
    private var listings: ListingCache

    init(maxInstantEvents: Int, intervalNanoseconds: UInt64, presenceTimeout: UInt64, staleHold: UInt64, replicationFactor: Int,
         listingCacheBytes: Int = 0, clock: EngineClock, fabric: Fabric, loop: EventLoop) {
        self.loop = loop
        listings = ListingCache(byteLimit: listingCacheBytes)
        self.intervalNanoseconds = intervalNanoseconds
        self.clock = clock
        self.fabric = fabric
        space = Keyspace(me: fabric.me, replicationFactor: replicationFactor, presenceTimeout: presenceTimeout, staleHold: staleHold,
                         ring: fabric.topology.ring) { key in
            Machine(key: key, maxInstantEvents: maxInstantEvents)
        }
    }

    var wall: Int64 { clock.wallMilliseconds() }
    private var now: UInt64 { clock.monotonicNanoseconds() }

    // MARK: Carrying out

    private func carryOut(_ effects: [Keyspace<Machine>.Effect]) {
        for e in effects {
            switch e {
            case .send(let copy, let node, let replica, let gone):
                if let t = fabric.send(copy, to: node, gone: gone), replica { replicaTickets.append(t) }
            case .askForCopy(let key, let node):
                fabric.link?.push(to: fabric.instance(of: node)) { $0.copyRequests.append(ClusterSessionChannel(key, withPresence: false)) }
            case .deliver(let events):
                deliver(events)
            }
        }
    }

    /// What the shard is carrying out (for the debug log).
    private var cause = "call"

    /// Sends each event to the gateways it is routed to, encoded once.
    func deliver(_ routed: [RoutedDelivery<NodeInstance>]) {
        var encoded: (key: ChannelKey, sequence: UInt64, bytes: [UInt8])? = nil
        for d in routed {
            let key = ChannelKey(name: d.event.channelName, type: d.event.channelType)
            if encoded?.key != key || encoded?.sequence != d.event.sequence {
                encoded = (key, d.event.sequence, EventEncoding.framed(d.event))
                if let trace = fabric.trace, d.event.type == .remoteLeave || d.event.type == .remoteTimeout || d.event.type == .remoteJoin {
                    trace("event", ["channel": "\(key)", "type": "\(d.event.type)", "user": d.event.publisher, "sequence": String(d.event.sequence),
                                    "cause": cause])
                }
            }
            fabric.deliver(d, channel: key, framed: encoded!.bytes)
            if d.isSnapshot, let trace = fabric.trace {
                trace("snapshot", ["channel": "\(key)", "sessions": d.sessions.map(\.description).joined(separator: ","),
                                   "to": "\(d.sink)", "sequence": String(d.event.sequence)])
            }
        }
    }

    /// Logs (at debug) which channels this shard started or stopped owning, and their lineage.
    private func traceOwnership(_ what: String, before: [ChannelKey: UInt64]) {
        guard let trace = fabric.trace else { return }
        for (key, m) in space.owned where before[key] != m.term {
            trace("owning", ["channel": "\(key)", "after": what, "term": String(m.term), "sequence": String(m.sequence), "members": String(m.occupancy)])
        }
        for key in before.keys where !space.hasOwned(key) {
            trace("not owning", ["channel": "\(key)", "after": what])
        }
    }

    private var terms: [ChannelKey: UInt64] {
        fabric.trace == nil ? [:] : Dictionary(uniqueKeysWithValues: space.owned.map { ($0.key, $0.value.term) })
    }

    /// After anything that may have changed which channels need ticking or sweeping.
    private func reschedule(_ keys: some Sequence<ChannelKey>) {
        for key in keys {
            if readOwned(key, { $0.isIntervalMode }) == true { startTicking(key) } else { intervalChannels.remove(key) }
        }
        scheduleSweep()
    }

    // MARK: Calls (this node owns the channel)

    /// Carries out one call on a channel this node owns. The tickets are the replica copies of
    /// what it changed: the caller answers once they arrived, so an acknowledged change survives
    /// this node's death.
    func handle(_ call: ClusterChannelCall, key: ChannelKey) -> (ClusterChannelResult, [PeerLink.Ticket]) {
        replicaTickets = []
        defer { replicaTickets = [] }
        do throws(PresenceError) {
            // (a call that got past the routing checks before this node handed its keys off to leave)
            guard !space.leaving else { throw PresenceError(.unavailable, "NOT_SERVING", "LEAVING: this node has handed its keys off; retry") }
            return (try perform(call, key: key), replicaTickets)
        } catch {
            return (ClusterChannelResult(error: error.wire), replicaTickets)
        }
    }

    private struct Caller {
        let id: SessionID
        let user: String
        let sink: NodeInstance
        let version: UInt64
    }

    private func caller(_ call: ClusterChannelCall) throws(PresenceError) -> Caller {
        guard let ref = call.session, let id = SessionID(text: ref.sessionID), let sink = ref.sink else {
            throw PresenceError(.invalidArgument, "INVALID_SESSION_ID", "the call carries no valid session")
        }
        return Caller(id: id, user: try Validate.userID(ref.userID), sink: sink, version: ref.version)
    }

    /// Runs `body` on the channel's machine, delivers the events it computed, and copies `user`'s
    /// record to the replicas.
    private func update<R>(_ key: ChannelKey, user: String?, left: SessionID? = nil, create: Bool,
                           _ body: (inout Machine) throws(PresenceError) -> ([Delivery], R)) throws(PresenceError) -> R? {
        let replicated = user != nil && !query { $0.replicas(of: key) }.isEmpty
        var routed: [RoutedDelivery<NodeInstance>] = []
        var deltas: [ChannelCopy<NodeInstance>] = []
        let created = !query { $0.hasOwned(key) }
        let r = try withOwned(key, create: create, now: wall) { (m: inout Machine) throws(PresenceError) -> R in
            let (d, r) = try body(&m)
            routed = m.route(d)
            // (taken here: a channel left empty is gone once this returns; a channel this call
            // created goes whole, so its replicas hold all of it from the start)
            if replicated, let user { deltas = created ? m.fullCopies(handoff: false) : [m.delta(users: [user], left: left)] }
            return r
        }
        deliver(routed)
        for delta in deltas { carryOut(query { $0.replicate(delta) }) }
        if readOwned(key, { $0.isIntervalMode }) == true { startTicking(key) } else { intervalChannels.remove(key) }
        return r
    }

    /// Runs `body` on an owned value (`Keyspace.withOwnedValue`: created when `create`, dropped
    /// once empty); nil when it does not exist. (Here for the same reason as `readOwned` below:
    /// `R` specialised at each call, and the direct call picks the pre-specialisation.)
    func withOwned<R>(_ key: ChannelKey, create: Bool, now: Int64,
                              _ body: (inout Machine) throws(PresenceError) -> R) throws(PresenceError) -> R? {
        var result: R? = nil
        _ = try space.withOwnedValue(key, create: create, now: now) { (v: inout Machine) throws(PresenceError) in result = try body(&v) }
        return result
    }

    /// What `read` makes of an owned value, read in place (`inspectOwned`), or nil when the key is
    /// not owned here. (Written here, not through `Keyspace.readOwned`: that one is compiled in
    /// ClusterCore generic in `R`, so each call looked up metadata and copied its result through
    /// value witnesses, 2-3% of building memberships; here `R` is specialised at each call, and
    /// the direct call picks `inspectOwned`'s pre-specialisation.)
    private func readOwned<R>(_ key: ChannelKey, _ read: (inout Machine) -> R) -> R? {
        var result: R? = nil
        _ = space.inspectOwned(key) { result = read(&$0) }
        return result
    }

    /// Runs a query on the keyspace where it lies. (A non-mutating method called on `space` got a
    /// copy of the whole keyspace first, every table in it retained and released: seen on each
    /// call in SetState profiles. Through an `inout` access it is read in place.)
    private func query<R>(_ read: (inout Keyspace<Machine>) -> R) -> R { read(&space) }

    /// A page as the client's GetOnlineUsersResponse, encoded: kept from an earlier call while the
    /// channel has not changed since, else made (and kept).
    private func listing(_ key: ChannelKey, after: String, includeState: Bool) -> [UInt8] {
        let page = ListingCache.Page(channel: key, after: after, includeState: includeState)
        var made: (revision: UInt64, bytes: [UInt8])? = nil
        // (a channel with nobody in it is not owned here: its page is empty, and encodes as nothing)
        let bytes: [UInt8] = readOwned(key) { (m: inout Machine) -> [UInt8] in
            if let kept = listings.page(page, at: m.listingRevision) { return kept }
            let (users, next) = m.page(after: after.isEmpty ? nil : after, includeState: includeState)
            let encoded = GetOnlineUsersResponse(totalOccupancy: UInt32(m.occupancy), users: users,
                                                 nextPage: next.map { PageBookmark.make(after: $0) } ?? "").serializedBytes()
            made = (m.listingRevision, encoded)
            return encoded
        } ?? []
        if let made { listings.keep(page, at: made.revision, bytes: made.bytes) }
        return bytes
    }

    private func stateResult(_ key: ChannelKey, _ user: String) -> ClusterChannelResult {
        var r = ClusterChannelResult()
        _ = readOwned(key) { m in Self.noteState(of: user, in: m, to: &r) }
        return r
    }

    /// The user's state in the channel and its version, as a write's answer carries them.
    private static func noteState(of user: String, in m: borrowing Machine, to r: inout ClusterChannelResult) {
        (r.state, r.stateVersion) = m.stateAndVersion(of: user)
    }

    /// Why a state write of the caller's is refused (its gateway was superseded, or it is not a
    /// member here), found in one look at the channel.
    private enum WriteRefusal { case moved(UInt64), notMember }

    private func writeRefusal(_ c: Caller, _ key: ChannelKey) -> WriteRefusal? {
        readOwned(key) { (m: inout Machine) -> WriteRefusal? in
            if let newer = m.supersedingVersion(of: c.id, c.version) { return .moved(newer) }
            return m.contains(user: c.user, session: c.id) ? nil : .notMember
        } ?? .notMember
    }

    /// Checks a state write of the caller's in the order its refusals are answered: from a gateway
    /// superseded for the session (SESSION_MOVED: it drops the session), then the call's own
    /// input (`validate`, whose result is returned), then from a session that is not a member here.
    private func checkedWrite<T>(_ c: Caller, _ key: ChannelKey, _ validate: () throws(PresenceError) -> T) throws(PresenceError) -> T {
        let refusal = writeRefusal(c, key)
        if case .moved(let newer) = refusal { throw PresenceError.sessionMoved(c.id, supersededBy: newer) }
        let input = try validate()
        if refusal != nil { try requireMember(c, key) }
        return input
    }

    /// The session is not in the channel here: its gateway (which holds it there) says so again
    /// with an announce, then retries.
    private func requireMember(_ c: Caller, _ key: ChannelKey) throws(PresenceError) {
        guard readOwned(key, { $0.contains(user: c.user, session: c.id) }) == true else {
            throw PresenceError(.failedPrecondition, "NOT_A_MEMBER", "session \(c.id) is not in \(key) at its owner")
        }
    }

    private func perform(_ call: ClusterChannelCall, key: ChannelKey) throws(PresenceError) -> ClusterChannelResult {
        let now = wall
        // (routing checked the owner, but this shard may have carried out a ring change since)
        guard query({ $0.isOwner(key) }) else {
            throw PresenceError(.unavailable, "NOT_SERVING", "NOT_OWNER: \(key) moved to another node; retry")
        }
        // (nor may a ring change since have started a handoff this key waits for)
        if let why = fabric.topology.notServing(keyHash: StableHash.of(key)) { throw PresenceError(.unavailable, "NOT_SERVING", why) }
        let at = self.now
        if query({ $0.isStale(key, now: at) }) { throw PresenceError.staleTakeover }
        carryOut(space.releaseHeldBack(key, wall: now))
        switch call.op {
        case .join:
            let c = try caller(call)
            // (a superseded gateway, then the items, then a join from before the session's leave:
            // one look at the channel for both)
            let (newer, late) = readOwned(key) { m in (m.supersedingVersion(of: c.id, c.version), m.leftAfter(c.id, c.version)) } ?? (nil, false)
            if let newer { throw PresenceError.sessionMoved(c.id, supersededBy: newer) }
            let pending = try Validate.stateItems(call.items)
            if late { return stateResult(key, c.user) }
            var result = ClusterChannelResult()
            _ = try update(key, user: c.user, create: true) { m in
                let d = m.join(user: c.user, session: c.id, withPresence: call.session?.withPresence ?? false, sink: c.sink,
                               version: c.version, pendingState: pending, settled: call.session?.settled ?? 0, now: now)
                Self.noteState(of: c.user, in: m, to: &result)
                return (d, ())
            }
            space.placed(key, at: c.sink, now: self.now)
            scheduleSweep()
            return result
        case .announce:
            let c = try caller(call)
            let state = try Validate.stateItems(call.items)
            var outcome = Machine.AnnounceOutcome()
            _ = try update(key, user: c.user, create: true) { (m: inout Machine) throws(PresenceError) -> ([Delivery], Void) in
                outcome = m.announce(user: c.user, session: c.id, withPresence: call.session?.withPresence ?? false, sink: c.sink,
                                     version: c.version, state: state, stateVersion: call.stateVersion, resume: call.resume, now: now)
                return (outcome.deliveries, ())
            }
            if let newer = outcome.superseded {
                throw PresenceError.sessionMoved(c.id, supersededBy: newer)
            }
            space.placed(key, at: c.sink, now: self.now)
            scheduleSweep()
            var result = stateResult(key, c.user)
            result.expired = outcome.expired
            return result
        case .leave:
            let c = try caller(call)
            var result = ClusterChannelResult()
            guard (readOwned(key, { $0.supersedingVersion(of: c.id, c.version) }) ?? nil) == nil else {
                // a superseded gateway's leave: the session lives on elsewhere
                result.userGone = !(readOwned(key, { $0.contains(user: c.user) }) ?? false)
                return result
            }
            let gone = try update(key, user: c.user, left: c.id, create: false) { m in
                (m.leave(user: c.user, session: c.id, version: c.version, timedOut: call.timedOut, now: now), !m.contains(user: c.user))
            }
            result.userGone = gone ?? true
            result.sequence = readOwned(key, { $0.sequence }) ?? 0
            return result
        case .setState:
            let c = try caller(call)
            let items = try checkedWrite(c, key) { () throws(PresenceError) in try Validate.stateItems(call.items) }
            var result = ClusterChannelResult()
            _ = try update(key, user: c.user, create: false) { m throws(PresenceError) in
                let d = try m.setState(user: c.user, session: c.id, items: items, write: call.session?.write ?? 0,
                                   settled: call.session?.settled ?? 0, version: c.version, now: now)
                Self.noteState(of: c.user, in: m, to: &result)
                return (d, ())
            }
            return result
        case .removeState:
            let c = try caller(call)
            try checkedWrite(c, key) { () throws(PresenceError) in for k in call.keys { try Validate.stateKey(k) } }
            var result = ClusterChannelResult()
            _ = try update(key, user: c.user, create: false) { m in
                let d = m.removeState(user: c.user, session: c.id, keys: call.keys, write: call.session?.write ?? 0,
                                   settled: call.session?.settled ?? 0, version: c.version, now: now)
                Self.noteState(of: c.user, in: m, to: &result)
                return (d, ())
            }
            return result
        case .getState:
            let user = try Validate.userID(call.userID)
            var result = ClusterChannelResult()
            if let items = readOwned(key, { $0.state(of: user) }) ?? nil {
                result.found = true
                result.state = items
            }
            return result
        case .list:
            var result = ClusterChannelResult()
            if call.encoded && !call.countOnly {
                result.listing = listing(key, after: call.after, includeState: call.includeState)
                return result
            }
            _ = readOwned(key) { m in
                result.total = UInt32(m.occupancy)
                if !call.countOnly {
                    let (users, next) = m.page(after: call.after.isEmpty ? nil : call.after, includeState: call.includeState)
                    result.users = users
                    result.next = next ?? ""
                }
            }
            return result
        case .resnapshot:
            let c = try caller(call)
            var routed: [RoutedDelivery<NodeInstance>] = []
            _ = try withOwned(key, create: false, now: now) { m in
                if let d = m.resnapshot(for: c.id, floor: call.floor, now: now) { routed = m.route([d]) }
            }
            deliver(routed)
            return ClusterChannelResult()
        case .unspecified, .unrecognized:
            throw PresenceError(.invalidArgument, "UNKNOWN_OPERATION", "unknown channel operation")
        }
    }

    // MARK: Ring changes, copies, gateways

    func ringChanged(to ring: HashRing) {
        cause = "ring change"
        defer { cause = "call" }
        let before = terms
        carryOut(space.ringChanged(to: ring, now: now, wall: wall, mayServe: mayServe))
        traceOwnership("ring change", before: before)
        reschedule(space.owned.keys)
        receiveEarly()
    }

    /// Copies that waited for this shard to catch up (with the ring, or with joining).
    func receiveEarly() {
        guard fabric.topology.isReady, space.ring == fabric.topology.ring, !early.isEmpty else { return }
        let copies = early
        early = []
        for (c, sender, gone) in copies { received(c, from: sender, gone: gone) }
    }

    /// A copy from another node (replication, handoff, or another version of an owned channel).
    /// One sent for a ring this shard has not caught up with yet (or before this node joined) waits for it.
    func received(_ copy: ChannelCopy<NodeInstance>, from sender: String? = nil, gone: [NodeInstance: UInt64] = [:]) {
        // (a node that has not joined yet routes by a ring of its own: it would own everything)
        guard fabric.topology.isReady, space.ring == fabric.topology.ring else {
            early.append((copy, sender, gone))
            return
        }
        let before = terms
        cause = copy.handoff ? "copy from another node (handoff)" : "copy from another node (replica)"
        defer { cause = "call" }
        let heldBefore = fabric.trace == nil ? nil : (space.copies[copy.key]?.sequence, space.owned[copy.key]?.sequence)
        carryOut(space.received(copy, from: sender, gone: gone, now: now, wall: wall, mayServe: mayServe))
        traceOwnership(copy.handoff ? "handoff" : "copy", before: before)
        if let trace = fabric.trace, let heldBefore {
            trace("copy", ["channel": "\(copy.key)", "from": sender ?? "-", "full": copy.full ? "yes" : "no", "handoff": copy.handoff ? "yes" : "no",
                           "term": String(copy.term), "sequence": String(copy.sequence), "members": String(copy.members.count), "departed": String(copy.departed.count),
                           "copy_before": heldBefore.0.map(String.init) ?? "-", "copy_after": space.copies[copy.key].map { String($0.sequence) } ?? "-",
                           "owned": heldBefore.1 != nil ? "yes" : "no"])
        }
        reschedule([copy.key])
    }

    /// Pushes to `node` may have been lost: its followers get fresh SNAPSHOTs.
    /// This node was declared dead and is back: its counts of how long others were gone restart.
    func returnedFromDeath() {
        space.returnedFromDeath(now: now)
    }

    func restart(followersAt node: String) {
        cause = "restart followers"
        defer { cause = "call" }
        carryOut(space.restart(followersAt: node, now: now, wall: wall, mayServe: mayServe))
    }

    /// Whether this node may answer for the channel now (the handoff gate).
    private var mayServe: (ChannelKey) -> Bool {
        let topology = fabric.topology
        return { topology.notServing(keyHash: StableHash.of($0)) == nil }
    }

    /// Fresh starts held back while their handoff was awaited; returns whether some still wait.
    func releaseHeldBack() -> Bool {
        guard !space.heldBack.isEmpty else { return false }
        cause = "handoff landed"
        defer { cause = "call" }
        carryOut(space.releaseHeldBack(now: now, wall: wall, mayServe: mayServe))
        return !space.heldBack.isEmpty
    }

    /// Copies sent to `node` were lost: it gets whole copies of the keys it is a replica of.
    func resync(replica node: String) {
        carryOut(space.resync(replica: node, now: now))
    }

    /// `node` asks whether this node has handed off to it: copies handed here that it owns go again.
    func handOn(to node: String) {
        carryOut(space.handOn(to: node, now: now, wall: wall))
    }

    /// A replica asks for a whole copy of a key it holds only part of.
    func sendWholeCopy(of key: ChannelKey, to node: String) {
        carryOut(space.wholeCopy(of: key, for: node, now: now))
    }

    func digest(of sink: NodeInstance) -> FactDigest { space.digest(of: sink) }

    /// The ring this shard has carried out.
    var ring: HashRing { space.ring }

    func reconcile(from sink: NodeInstance, buckets: Set<Int>, facts: [ChannelKey: [ChannelFact]]) -> [ChannelKey: Reconciliation<RoutedDelivery<NodeInstance>, StateCorrection>] {
        cause = "anti-entropy from \(sink)"
        defer { cause = "call" }
        let topology = fabric.topology
        let (effects, results) = space.reconcile(from: sink, buckets: buckets, facts: facts,
                                                 mayServe: { topology.notServing(keyHash: StableHash.of($0)) == nil }, now: now, wall: wall)
        carryOut(effects)
        reschedule(results.keys)
        return results
    }

    func confirmed(from sink: NodeInstance, gone: [(ChannelKey, SessionID, UInt64)], moved: [(ChannelKey, SessionID, NodeInstance, UInt64)]) {
        cause = "confirmed by gateway"
        defer { cause = "call" }
        carryOut(space.confirmed(from: sink, gone: gone, moved: moved, now: now, wall: wall))
        reschedule(gone.map(\.0) + moved.map(\.0))
    }

    /// Hands every channel to the node that owns it once this node is gone (graceful leave); from
    /// now on this shard owns nothing.
    func handOffAll(to ring: HashRing) {
        carryOut(space.handOffAll(to: ring, now: now))
        intervalChannels = []
    }

    // MARK: Timers

    /// Wakes the shard when the next orphan is due (sessions of a gone gateway time out).
    private func scheduleSweep() {
        // (on every call: most often there is no orphan, and that is read off one field; the
        // deadline is read in place, as `query` does, not off a copy of the whole keyspace)
        guard !space.orphanKeys.isEmpty, let next = query({ $0.nextOrphanDeadline }) else { return }
        if let at = sweepAt, at <= next, sweeper != nil { return }
        sweeper?.cancel()
        sweepAt = next
        let wait = next > now ? next - now : 0
        sweeper = fabric.placement.start { [weak self, clock] in
            await clock.sleep(nanoseconds: wait + 1_000_000)
            guard !Task.isCancelled else { return }
            await self?.sweep()
        }
    }

    private func sweep() {
        cause = "orphan timeout"
        defer { cause = "call" }
        sweeper = nil
        sweepAt = nil
        carryOut(space.sweep(now: now, wall: wall, holdsLease: fabric.topology.holdsLease, recheck: fabric.timings.probeInterval,
                             grace: fabric.timings.backFromCutGrace))
        scheduleSweep()
    }

    private func startTicking(_ key: ChannelKey) {
        intervalChannels.insert(key)
        guard ticker == nil else { return }
        ticker = periodically(every: intervalNanoseconds, clock: clock, placement: fabric.placement) { [weak self] in await self?.tick() ?? false }
    }

    /// Sends each interval channel's INTERVAL event; false once no channel needs ticking.
    private func tick() -> Bool {
        let now = wall
        for key in intervalChannels {
            var routed: [RoutedDelivery<NodeInstance>] = []
            _ = try? withOwned(key, create: false, now: now) { m in routed = m.routing { $0.tick(now: now) } }
            deliver(routed)
            if readOwned(key, { $0.isIntervalMode }) != true { intervalChannels.remove(key) }
        }
        if intervalChannels.isEmpty {
            ticker = nil
            return false
        }
        return true
    }

    // MARK: Counters

    var channelCount: Int { space.owned.count }
    var copyCount: Int { space.copies.count }
    /// Users present in the channels this shard owns, summed over them.
    var membershipCount: Int {
        var n = 0
        space.owned.forEachEntry { n += $1.occupancy }
        return n
    }

    /// Stops the shard's timers (the node is shutting down).
    func stop() {
        ticker?.cancel()
        ticker = nil
        sweeper?.cancel()
        sweeper = nil
    }
}
