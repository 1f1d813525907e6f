import ClusterCore
import EventLoop
import PresenceCore
import PresenceWire

/// Owns a share of this node's users (the user-home role): a `Keyspace` of `HomeRecord`s, each a
/// user's sessions (where they live, at which version, which channels they are in), its chosen
/// status and its watchers; plus replica copies of users homed elsewhere. Status changes go once
/// to each watcher's gateway. It is where sessions are claimed (a resume starts a new epoch).
actor UserHomeShard {
    typealias Record = HomeRecord<NodeInstance>
    nonisolated let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private var space: Keyspace<Record>
    private let clock: EngineClock
    private let fabric: Fabric
    private var sweeper: Task<Void, Never>? = nil
    private var sweepAt: UInt64? = nil
    /// Copies that arrived before this shard carried out the ring change they were sent for.
    private var early: [(HomeCopy, String?, [NodeInstance: UInt64])] = []
    /// Replica copies sent by the call being handled.
    private var replicaTickets: [PeerLink.Ticket] = []

    init(clock: EngineClock, presenceTimeout: UInt64, staleHold: UInt64, replicationFactor: Int, fabric: Fabric, loop: EventLoop) {
        self.loop = loop
        self.clock = clock
        self.fabric = fabric
        space = Keyspace(me: fabric.me, replicationFactor: replicationFactor, presenceTimeout: presenceTimeout, staleHold: staleHold,
                         ring: fabric.topology.ring) { user in
            Record(userID: user)
        }
    }

    private var wall: Int64 { clock.wallMilliseconds() }
    private var now: UInt64 { clock.monotonicNanoseconds() }

    private func carryOut(_ effects: [Keyspace<Record>.Effect]) {
        for e in effects {
            switch e {
            case .send(let copy, let node, let replica, let gone):
                if copy.handoff, let trace = fabric.trace {
                    trace("home handoff", ["user": copy.record.userID, "to": node, "sessions": String(copy.record.sessions.count),
                                           "status": "\(copy.record.chosen)@\(copy.record.chosenVersion)"])
                }
                if let t = fabric.send(copy, to: node, gone: gone), replica { replicaTickets.append(t) }
            case .askForCopy(let user, let node):
                fabric.link?.push(to: fabric.instance(of: node)) { $0.homeCopyRequests.append(user) }
            case .deliver(let changes):
                for c in changes { fabric.deliver(c, at: wall) }
            }
        }
    }

    // MARK: Calls (this node is the users' home)

    /// Carries out one call for users homed here; the tickets are the replica copies it sent.
    func handle(_ call: ClusterHomeCall, users: [String]) -> (ClusterHomeResult, [PeerLink.Ticket]) {
        replicaTickets = []
        defer { replicaTickets = [] }
        do throws(PresenceError) {
            // (a call that got past the routing checks before this node handed its keys off to leave)
            guard !space.leaving else { throw PresenceError(.unavailable, "NOT_SERVING", "LEAVING: this node has handed its keys off; retry") }
            let result = try tracingRemovals("call \(call.op)", users: users) { () throws(PresenceError) -> ClusterHomeResult in
                try perform(call, users: users)
            }
            return (result, replicaTickets)
        } catch {
            return (ClusterHomeResult(error: error.wire), replicaTickets)
        }
    }

    private func caller(_ call: ClusterHomeCall) throws(PresenceError) -> (SessionID, NodeInstance, UInt64) {
        guard let ref = call.session, let id = SessionID(text: ref.sessionID), let sink = ref.sink else {
            throw PresenceError(.invalidArgument, "INVALID_SESSION_ID", "the call carries no valid session")
        }
        return (id, sink, ref.version)
    }

    /// A session's list of watched users, as a peer sent it: every id valid, within the limit.
    private func watching(_ call: ClusterHomeCall) throws(PresenceError) -> [String] {
        guard call.watching.count <= Limits.maxWatchedPerSession else {
            throw PresenceError(.resourceExhausted, "WATCH_LIMIT", "a session may watch at most \(Limits.maxWatchedPerSession) users")
        }
        for u in call.watching { _ = try Validate.userID(u, field: "watching") }
        return call.watching
    }

    /// Runs `body` on a user's record, tells watchers of a status change, and copies the record to
    /// the replicas.
    @discardableResult
    private func update<R>(_ user: String, create: Bool, _ body: (inout Record) throws(PresenceError) -> (Record.StatusChange?, R)) throws(PresenceError) -> R? {
        var change: Record.StatusChange? = nil
        var copy: HomeCopy? = nil
        let replicated = !query { $0.replicas(of: user) }.isEmpty
        let r = try withOwned(user, create: create, now: wall) { (rec: inout Record) throws(PresenceError) -> R in
            let (c, r) = try body(&rec)
            change = c
            if replicated { copy = HomeCopy(record: rec, handoff: false) }
            return r
        }
        if let change { fabric.deliver(change, at: wall) }
        if let copy { carryOut(query { $0.replicate(copy) }) }
        return r
    }

    private func record(_ id: SessionID, _ s: Record.Session) -> ClusterHomeSession { ClusterHomeSession(id, s) }

    // `withOwned`, `readOwned` and `query` are ChannelShard's, for home records: see the reasons
    // there. (Kept per shard on purpose: a helper shared across the two value types, generic in
    // the value, is the kind of call that lost the pre-specialisations before.)

    /// Runs `body` on an owned record (created when `create`, dropped once empty); nil when it
    /// does not exist.
    private func withOwned<R>(_ key: String, create: Bool, now: Int64,
                              _ body: (inout Record) throws(PresenceError) -> R) throws(PresenceError) -> R? {
        var result: R? = nil
        _ = try space.withOwnedValue(key, create: create, now: now) { (v: inout Record) throws(PresenceError) in result = try body(&v) }
        return result
    }

    /// What `read` makes of an owned record, read in place; nil when it is not owned here.
    private func readOwned<R>(_ key: String, _ read: (inout Record) -> R) -> R? {
        var result: R? = nil
        _ = space.inspectOwned(key) { result = read(&$0) }
        return result
    }

    /// Runs a query on the keyspace where it lies (not on a copy of it).
    private func query<R>(_ read: (inout Keyspace<Record>) -> R) -> R { read(&space) }


    private func perform(_ call: ClusterHomeCall, users: [String]) throws(PresenceError) -> ClusterHomeResult {
        var result = ClusterHomeResult()
        guard let user = users.first else { return result }
        // (routing checked the home, but this shard may have carried out a ring change since)
        guard users.allSatisfy({ u in query { $0.isOwner(u) } }) else {
            throw PresenceError(.unavailable, "NOT_SERVING", "NOT_OWNER: these users' home moved to another node; retry")
        }
        // (nor may a ring change since have started a handoff one of them waits for)
        if let why = fabric.topology.notServing(users: users) { throw PresenceError(.unavailable, "NOT_SERVING", why) }
        if users.contains(where: { u in query { $0.isStale(u, now: now) } }) { throw PresenceError.staleTakeover }
        for u in users { carryOut(space.releaseHeldBack(u, wall: wall)) }
        switch call.op {
        case .sessionOpened:
            let (id, sink, version) = try caller(call)
            if call.announce {
                var channels: [ChannelKey: Bool] = [:]
                for c in call.channels { if let k = c.key { channels[k] = c.withPresence } }
                let rec = Record.Session(sink: sink, version: version, channels: channels, watching: try watching(call))
                try update(user, create: true) { r in (r.announce(session: id, record: rec).change, ()) }
                if call.status != .unknown { try update(user, create: true) { r in (r.setStatus(call.status), ()) } }
            } else {
                if readOwned(user, { $0.sessions[id] == nil && $0.sessions.count >= Limits.maxSessionsPerUser }) == true {
                    throw PresenceError(.resourceExhausted, "SESSION_LIMIT", "a user may have at most \(Limits.maxSessionsPerUser) sessions open; close one first")
                }
                try update(user, create: true) { r in (r.sessionOpened(session: id, sink: sink, version: version, initial: call.status), ()) }
            }
            space.placed(user, at: sink, now: now)
            scheduleSweep()
        case .claimSession:
            let (id, sink, _) = try caller(call)
            var claimed: (record: Record.Session, previous: NodeInstance)? = nil
            try update(user, create: false) { r in
                claimed = r.claim(session: id, sink: sink)
                // (the status the resume sets, in the same change: one replication, not two)
                guard let c = claimed, call.status != .unknown else { return (nil, ()) }
                return (r.setStatus(call.status, by: id, version: c.record.version), ())
            }
            fabric.trace?("claim", ["user": user, "session": id.description, "by": "\(sink)", "found": claimed == nil ? "no" : "yes",
                                   "version": String(claimed?.record.version ?? 0), "previous": claimed.map { "\($0.previous)" } ?? "-"])
            guard let claimed else { return result }
            result.found = true
            // (with its new version, and the gateway it had before: cluster.proto's HomeResult)
            var before = claimed.record
            before.sink = claimed.previous
            result.session = record(id, before)
            if claimed.previous != sink {
                // the gateway it left stops speaking for it (it may still think it holds it)
                if claimed.previous == fabric.instance {
                    fabric.gateway.movedAway(id, to: sink, version: claimed.record.version, why: "claimed by \(sink)")
                } else if fabric.topology.ring.isLive(claimed.previous.id, boot: claimed.previous.boot) {
                    let moved = ClusterSessionMoved(sessionID: id.description, gateway: sink.id, gatewayBoot: sink.boot, version: claimed.record.version)
                    fabric.link?.push(to: claimed.previous) { $0.moved.append(moved) }
                }
            }
            space.placed(user, at: sink, now: now)
            scheduleSweep()
        case .sessionEnded:
            let (id, _, version) = try caller(call)
            try update(user, create: false) { r in
                guard r.supersedingVersion(of: id, version) == nil else { return (nil, ()) }  // it lives on elsewhere
                return (r.sessionEnded(session: id, version: version, now: wall), ())
            }
        case .setStatus:
            let by = try? caller(call)
            if let (id, _, version) = by, let newer = readOwned(user, { $0.supersedingVersion(of: id, version) }) ?? nil {
                throw PresenceError.sessionMoved(id, supersededBy: newer)
            }
            try update(user, create: true) { r in (r.setStatus(call.status, by: by?.0, version: by?.2 ?? 0, write: call.session?.write ?? 0), ()) }
        case .sessionJoined, .sessionLeft:
            let (id, _, version) = try caller(call)
            guard let c = call.channel, let key = c.key else {
                throw PresenceError(.invalidArgument, "INVALID_CHANNEL", "the call carries no valid channel")
            }
            // (a gateway its client left behind must not acknowledge this: the new one started from this record)
            try update(user, create: false) { r throws(PresenceError) in
                let newer = call.op == .sessionJoined
                    ? r.sessionJoined(session: id, channel: key, withPresence: c.withPresence, version: version)
                    : r.sessionLeft(session: id, channel: key, version: version)
                if let newer { throw PresenceError.sessionMoved(id, supersededBy: newer) }
                return (nil, ())
            }
        case .sessionWatching:
            let (id, _, version) = try caller(call)
            let list = try watching(call)
            try update(user, create: false) { r throws(PresenceError) in
                if let newer = r.sessionWatching(session: id, watching: list, version: version, write: call.session?.write ?? 0) {
                    throw PresenceError.sessionMoved(id, supersededBy: newer)
                }
                return (nil, ())
            }
        case .channels:
            result.channels = (readOwned(user, { $0.channels }) ?? []).map { ClusterSessionChannel($0, withPresence: false) }
        case .statuses:
            result.statuses = users.map { u in UserStatusEntry(userID: u, status: readOwned(u, { $0.visibleStatus }) ?? .unknown) }
        case .watch:
            let (id, sink, version) = try caller(call)
            for u in users {
                try update(u, create: true) { r in (r.watch(by: id, sink: sink, version: version, write: call.session?.write ?? 0), ()) }
                space.placed(u, at: sink, now: now)
            }
            let read = users.map { u in readOwned(u, { ($0.visibleStatus, $0.counterValue) }) ?? (.unknown, 0) }
            result.statuses = zip(users, read).map { UserStatusEntry(userID: $0, status: $1.0) }
            result.statusVersions = read.map(\.1)
            scheduleSweep()
        case .unwatch:
            let (id, sink, version) = try caller(call)
            for u in users {
                try update(u, create: false) { r in
                    r.unwatch(by: id, at: sink, version: version, write: call.session?.write ?? 0)
                    return (nil, ())
                }
            }
        case .lookupSession:
            let (id, _, _) = try caller(call)
            if let s = readOwned(user, { $0.sessions[id] }) ?? nil {
                result.found = true
                result.session = record(id, s)
            }
        case .unspecified, .unrecognized:
            throw PresenceError(.invalidArgument, "UNKNOWN_OPERATION", "unknown home operation")
        }
        return result
    }

    // MARK: Ring changes, copies, gateways

    func ringChanged(to ring: HashRing) {
        let before = fabric.trace == nil ? nil : (copies: space.copies, owned: Set(space.owned.keys))
        carryOut(tracingRemovals("ring change") { space.ringChanged(to: ring, now: now, wall: wall, mayServe: mayServe) })
        if let trace = fabric.trace, let before {
            // (which copies this ring made the node drop, and which it took over, for the debug log)
            for (user, v) in before.copies.sorted(by: { $0.key < $1.key }) where space.copies[user] == nil {
                let how = space.owned[user] != nil && !before.owned.contains(user) ? "took over" : "dropped"
                trace("home copy \(how)", ["user": user, "sessions": String(v.sessions.count), "ring": ring.members.joined(separator: ",")])
            }
        }
        scheduleSweep()
        receiveEarly()
    }

    /// Copies that waited for this shard to catch up (with the ring, or with joining).
    func receiveEarly() {
        guard fabric.topology.isReady, space.ring == fabric.topology.ring, !early.isEmpty else { return }
        let copies = early
        early = []
        for (c, sender, gone) in copies { received(c, from: sender, gone: gone) }
    }

    /// A copy from another node; one sent for a ring this shard has not caught up with yet waits for it.
    func received(_ copy: HomeCopy, from sender: String? = nil, gone: [NodeInstance: UInt64] = [:]) {
        // (a node that has not joined yet routes by a ring of its own: it would own everything)
        guard fabric.topology.isReady, space.ring == fabric.topology.ring else {
            early.append((copy, sender, gone))
            return
        }
        if copy.handoff, let trace = fabric.trace {
            let before = space[owned: copy.record.userID] != nil
            carryOut(tracingRemovals("handoff from \(sender ?? "-")", users: [copy.record.userID]) {
                space.received(copy, from: sender, gone: gone, now: now, wall: wall, mayServe: mayServe)
            })
            trace("home handoff received", ["user": copy.record.userID, "from": sender ?? "-", "sessions": String(copy.record.sessions.count),
                                            "owned": before ? "merged" : (space[owned: copy.record.userID] != nil ? "took over" : "not owner"),
                                            "status": "\(copy.record.chosen)@\(copy.record.chosenVersion)",
                                            "now": space[owned: copy.record.userID].map { "\($0.chosen)@\($0.chosenVersion)" } ?? "-",
                                            "gone": gone.sorted { $0.key.id < $1.key.id }.map { "\($0.key)=\($0.value / 1_000_000)ms" }.joined(separator: ",")])
        } else if let trace = fabric.trace {
            let user = copy.record.userID
            let before = (space.copies[user]?.sessions.count, space[owned: user]?.sessions.count)
            carryOut(tracingRemovals("copy from \(sender ?? "-")", users: [user]) {
                space.received(copy, from: sender, gone: gone, now: now, wall: wall, mayServe: mayServe)
            })
            trace("home copy", ["user": user, "from": sender ?? "-", "sessions": String(copy.record.sessions.count),
                                "copy_before": before.0.map(String.init) ?? "-", "copy_after": space.copies[user].map { String($0.sessions.count) } ?? "-",
                                "owned": before.1 != nil ? "yes" : "no"])
        } else {
            carryOut(space.received(copy, from: sender, gone: gone, now: now, wall: wall, mayServe: mayServe))
        }
        scheduleSweep()
    }

    /// Pushes to `node` may have been lost: its watchers are told the current statuses.
    /// This node was declared dead and is back: its counts of how long others were gone restart.
    func returnedFromDeath() {
        space.returnedFromDeath(now: now)
    }

    func restart(followersAt node: String) {
        carryOut(space.restart(followersAt: node, now: now, wall: wall, mayServe: mayServe))
    }

    /// Whether this node may answer for the user now (the handoff gate).
    private var mayServe: (String) -> Bool {
        let topology = fabric.topology
        return { topology.notServing(keyHash: HashRing.hash(ofUser: $0)) == nil }
    }

    /// Fresh starts held back while their handoff was awaited; returns whether some still wait.
    func releaseHeldBack() -> Bool {
        guard !space.heldBack.isEmpty else { return false }
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
    func sendWholeCopy(of key: String, to node: String) {
        carryOut(space.wholeCopy(of: key, for: node, now: now))
    }

    func digest(of sink: NodeInstance) -> FactDigest { space.digest(of: sink) }

    /// Homes owned and replica copies held (for metrics).
    var counts: (owned: Int, copies: Int) { (space.owned.count, space.copies.count) }

    /// (debug log) Runs `body`, then names each session an owned home lost in it, and why.
    /// (`cause` is only made when tracing is on: printing an op on every call was 8% of building a
    /// million memberships)
    private func tracingRemovals<R, E: Error>(_ cause: @autoclosure () -> String, users: [String]? = nil, _ body: () throws(E) -> R) throws(E) -> R {
        guard let trace = fabric.trace else { return try body() }
        let keys = users ?? Array(space.owned.keys)
        var before: [String: Set<String>] = [:]
        for u in keys { if let r = space[owned: u] { before[u] = Set(r.sessions.keys.map(\.description)) } }
        let result = try body()
        for (u, ids) in before.sorted(by: { $0.key < $1.key }) {
            // (a home no longer held here was handed off, or emptied: nothing to name)
            guard let now = space[owned: u] else { continue }
            let after = Set(now.sessions.keys.map(\.description))
            for id in ids.subtracting(after).sorted() { trace("home session removed", ["user": u, "session": id, "cause": cause()]) }
        }
        return result
    }

    /// The ring this shard has carried out.
    var ring: HashRing { space.ring }

    func reconcile(from sink: NodeInstance, buckets: Set<Int>, facts: [String: [HomeFact]]) -> [String: Reconciliation<Record.StatusChange, Never>] {
        let topology = fabric.topology
        let (effects, results) = tracingRemovals("anti-entropy with \(sink)") {
            space.reconcile(from: sink, buckets: buckets, facts: facts,
                            mayServe: { topology.notServing(keyHash: HashRing.hash(ofUser: $0)) == nil }, now: now, wall: wall)
        }
        carryOut(effects)
        scheduleSweep()
        return results
    }

    func confirmed(from sink: NodeInstance, gone: [(String, SessionID, UInt64)], moved: [(String, SessionID, NodeInstance, UInt64)],
                   neverOpened: [(String, SessionID)] = []) {
        let effects = tracingRemovals("confirmed by \(sink)", users: gone.map(\.0) + moved.map(\.0) + neverOpened.map(\.0)) {
            space.confirmed(from: sink, gone: gone, moved: moved, neverOpened: neverOpened, now: now, wall: wall)
        }
        carryOut(effects)
        scheduleSweep()
    }

    func handOffAll(to ring: HashRing) {
        carryOut(space.handOffAll(to: ring, now: now))
    }

    // MARK: Timers

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
        sweeper = nil
        sweepAt = nil
        carryOut(tracingRemovals("timed out (gateway gone)") {
            space.sweep(now: now, wall: wall, holdsLease: fabric.topology.holdsLease, recheck: fabric.timings.probeInterval,
                        grace: fabric.timings.backFromCutGrace)
        })
        scheduleSweep()
    }

    func stop() {
        sweeper?.cancel()
        sweeper = nil
    }
}
