import ClusterCore
import EventLoop
import PresenceCore
import PresenceWire

extension PresenceError {
    /// The owner's answer for a key (channel or user home) it took over from a possibly stale copy,
    /// until that copy is brought up to date (`Keyspace.isStale`).
    static let staleTakeover = PresenceError(.unavailable, "NOT_SERVING",
                                             "STALE_TAKEOVER: this key was taken over from an old copy that is being brought up to date; retry")
}

/// Sends each call to the owner of what it touches (ARCHITECTURE.md, "Routing"): a channel's owner
/// or a user's home, here (a shard actor) or over the peer link, stamped with the fingerprint of
/// the ring it was routed by. While ownership moves, or the owner cannot be reached, a call is
/// retried as its `RoutingWindow` says, then answered UNAVAILABLE (retryable); it is never
/// answered from state this node does not own.
struct Router: Sendable {
    let core: EngineCore

    private var topology: Topology { core.topology }

    /// What this node's own shard answered to a channel call, and the copies to its replicas that
    /// the answer must wait for.
    struct LocalAnswer: Sendable {
        let result: ClusterChannelResult
        let tickets: [PeerLink.Ticket]

        /// Nothing is left to do with it: no copy to wait for, no error to act on.
        func isFinal(_ core: EngineCore) -> Bool { result.error == nil && (tickets.isEmpty || core.link == nil) }
    }

    /// Where a channel call can be made without a task: here, done (`answered`); on another of
    /// this node's loops, where the channel's shard runs (`onLoop`: try again there); or not
    /// without waiting (`elsewhere`: another node owns the channel, or this one does not serve it
    /// now), and then the call was not made.
    enum AtOnce {
        case answered(LocalAnswer)
        case onLoop(EventLoop)
        case elsewhere
    }

    /// A channel call run at once on the calling thread: when this node owns the channel, serves
    /// it, and the channel's shard runs on this thread (its connection's loop), the shard's
    /// synchronous `handle` answers it here.
    func channelCallAtOnce(_ key: ChannelKey, _ call: ClusterChannelCall) -> AtOnce {
        let hash = StableHash.of(key)
        let shard = core.channelShard(keyHash: hash)
        guard topology.route(key).0 == topology.me, topology.notServing(keyHash: hash) == nil else { return .elsewhere }
        guard shard.loop.inEventLoop else { return .onLoop(shard.loop) }
        let (result, tickets) = shard.handleOnLoop(call, key: key)
        return .answered(LocalAnswer(result: result, tickets: tickets))
    }

    /// Runs a call at the channel's owner. `first`, when given, is the answer this node's shard
    /// already gave to the call (`channelCallAtOnce`): it stands for the first attempt.
    func channelCall(_ key: ChannelKey, _ call: ClusterChannelCall, first: LocalAnswer? = nil) async throws(PresenceError) -> ClusterChannelResult {
        var first = first
        return try await retrying { (attempt: RoutingWindow.Attempt) async throws(PresenceError) in
            if let answer = first.take() { return try await finish(answer, answerBy: nil) }
            let (owner, fingerprint) = topology.route(key)
            if owner == topology.me { return try await localChannel(key, call, answerBy: nil) }
            guard let link = core.link else { throw PresenceError(.unavailable, "NODE_UNAVAILABLE", "no peer link to \(owner)") }
            var call = call
            call.ringFingerprint = fingerprint
            return try await link.channel(target(owner, attempt), call, timeout: attempt.timeout)
        }
    }

    /// Runs a call at the users' home (all of `call.userIDs`, at least one, share it).
    func homeCall(_ call: ClusterHomeCall) async throws(PresenceError) -> ClusterHomeResult {
        try await retrying { (attempt: RoutingWindow.Attempt) async throws(PresenceError) in
            let (home, fingerprint) = topology.route(user: call.userIDs.first ?? "")
            if home == topology.me { return try await localHome(call, answerBy: nil) }
            guard let link = core.link else { throw PresenceError(.unavailable, "NODE_UNAVAILABLE", "no peer link to \(home)") }
            var call = call
            call.ringFingerprint = fingerprint
            return try await link.home(target(home, attempt), call, timeout: attempt.timeout)
        }
    }

    /// Where an attempt at `owner` goes: to it, or through another healthy member (any one) when
    /// the attempt is to take a relay (`Topology.relays`).
    private func target(_ owner: String, _ attempt: RoutingWindow.Attempt) -> String {
        guard attempt.throughRelay else { return owner }
        return core.clock.pick(topology.relays(for: owner)) ?? owner
    }

    func homeCall(_ user: String, _ op: ClusterHomeOp, _ fill: (inout ClusterHomeCall) -> Void = { _ in }) async throws(PresenceError) -> ClusterHomeResult {
        var call = ClusterHomeCall(userIDs: [user], op: op)
        fill(&call)
        return try await homeCall(call)
    }

    /// Makes attempts at `body` as the call's `RoutingWindow` says, while they fail as unavailable.
    private func retrying<T>(_ body: (RoutingWindow.Attempt) async throws(PresenceError) -> T) async throws(PresenceError) -> T {
        var window = RoutingWindow(core.timings.routingWindow, now: core.clock.monotonicNanoseconds())
        var attempt = window.first
        while true {
            do {
                return try await body(attempt)
            } catch where error.kind == .unavailable && !Task.isCancelled {
                // (a node that did not answer at all is unreachable; one that refused is not)
                let next = window.failed(ownerUnreachable: error.name == "NODE_UNAVAILABLE", cutOff: topology.isCutOff(),
                                         now: core.clock.monotonicNanoseconds())
                guard case .retry(let pause, let nextAttempt) = next else { throw error }
                await core.clock.sleep(nanoseconds: pause)
                attempt = nextAttempt
            }
        }
    }

    /// A channel call this node must answer as the owner (or refuse while it may not).
    /// `answerBy`: the deadline of the caller's attempt, when another node made the call.
    func localChannel(_ key: ChannelKey, _ call: ClusterChannelCall, answerBy: UInt64?) async throws(PresenceError) -> ClusterChannelResult {
        let hash = StableHash.of(key)
        if let why = topology.notServing(keyHash: hash) {
            throw PresenceError(.unavailable, "NOT_SERVING", why)
        }
        let (r, tickets) = await core.channelShard(keyHash: hash).serve(call, key: key)
        return try await finish(LocalAnswer(result: r, tickets: tickets), answerBy: answerBy)
    }

    /// A local answer once its copies reached the replicas (or the wait for them timed out).
    func finish(_ answer: LocalAnswer, answerBy: UInt64?) async throws(PresenceError) -> ClusterChannelResult {
        try await replicate(answer.tickets, answerBy: answerBy)
        if let e = answer.result.error { throw PresenceError(wire: e) }
        return answer.result
    }

    /// Waits for a change's copies to reach the replicas (up to `replicaWait`). A change whose
    /// copies did not arrive is still acknowledged while this node holds its lease (a replica
    /// slow or dying: the ring moves on and anti-entropy restores the copy); one whose node lost
    /// its lease meanwhile is refused, retryably: cut off from the others (its clients may still
    /// reach it), this node cannot know they did not take its keys over without the change, which
    /// would be acknowledged to the client and lost (RELIABILITY.md invariant 1).
    private func replicate(_ tickets: [PeerLink.Ticket], answerBy: UInt64?) async throws(PresenceError) {
        guard !tickets.isEmpty, let link = core.link else { return }
        if await link.waitSent(tickets, timeout: replicaWait(answerBy: answerBy)) || topology.holdsLease { return }
        throw PresenceError(.unavailable, "NOT_SERVING",
                            "NO_LEASE: this node lost touch with the cluster before its replicas had the change; retry, or go elsewhere")
    }

    /// How long an answer waits for its copies to reach the replicas: the replication wait, or
    /// less when the caller is another node whose attempt ends sooner (its deadline, less the time
    /// the answer takes back). Waiting past it would turn a change this node made into a timeout
    /// at the caller, and an UNAVAILABLE for its client after its retries, while a replica is slow
    /// (found by `ClusterTests`: a write through another node, with the replica's copies held back,
    /// outwaited the gateway's first attempt, 0.7 s, and every later one).
    func replicaWait(answerBy deadline: UInt64?) -> UInt64 {
        let wait = core.timings.replicationWait
        guard let deadline else { return wait }
        return min(wait, ReplicaWait.left(until: deadline, margin: core.timings.answerMargin, now: core.clock.monotonicNanoseconds()))
    }

    /// How long a call passed on to the owner for another node (a relay) may take: what the
    /// caller's attempt leaves, less the way back, and never more than a peer call's timeout (nil,
    /// that timeout, for a caller with no deadline). The owner then bounds its own wait by it.
    /// When nothing is left the caller has given up: the call is refused here, not passed on.
    func forwardTimeout(answerBy deadline: UInt64?) throws(PresenceError) -> UInt64? {
        guard let deadline else { return nil }
        let left = ReplicaWait.left(until: deadline, margin: core.timings.answerMargin, now: core.clock.monotonicNanoseconds())
        guard left >= 1_000_000 else {
            throw PresenceError(.unavailable, "NOT_SERVING", "DEADLINE: too little is left of the caller's attempt to pass the call on; retry")
        }
        return min(core.timings.peerCallTimeout, left)
    }

    /// A home call this node must answer as the users' home; users are split over shards.
    func localHome(_ call: ClusterHomeCall, answerBy: UInt64?) async throws(PresenceError) -> ClusterHomeResult {
        if let why = topology.notServing(users: call.userIDs) {
            throw PresenceError(.unavailable, "NOT_SERVING", why)
        }
        // (most calls name one user: one shard, without grouping them first)
        if call.userIDs.count == 1 { return try await localHomePart(core.homeShardIndex(call.userIDs[0]), call, answerBy: answerBy) }
        var groups: [Int: [String]] = [:]
        for u in call.userIDs { groups[core.homeShardIndex(u), default: []].append(u) }
        var merged = ClusterHomeResult()
        for (i, users) in groups.sorted(by: { $0.key < $1.key }) {
            var part = call
            part.userIDs = users
            let r = try await localHomePart(i, part, answerBy: answerBy)
            merged.channels += r.channels
            merged.statuses += r.statuses
            if r.found { merged.found = true; merged.session = r.session }
        }
        return merged
    }

    /// The part of a home call whose users all live in shard `i`, once its copies reached the
    /// replicas (or the wait for them timed out); a refusal is thrown.
    private func localHomePart(_ i: Int, _ call: ClusterHomeCall, answerBy: UInt64?) async throws(PresenceError) -> ClusterHomeResult {
        let (r, tickets) = await core.userHomes[i].serve(call, users: call.userIDs)
        try await replicate(tickets, answerBy: answerBy)
        if let e = r.error { throw PresenceError(wire: e) }
        return r
    }

    /// Users grouped by their home node (one home call per group).
    func byHome(_ users: [String]) -> [[String]] {
        var groups: [String: [String]] = [:]
        for u in users { groups[topology.home(of: u), default: []].append(u) }
        return groups.sorted { $0.key < $1.key }.map(\.value)
    }

    /// Tries `body` again every `pause` ns while it fails as unavailable, up to `attempts` times, in
    /// the background: for what must reach an owner eventually (a session's end).
    func retryInBackground(attempts: Int, pause: UInt64, _ body: @escaping @Sendable () async throws(PresenceError) -> Void) {
        core.background.run {
            for _ in 0..<attempts {
                do throws(PresenceError) {
                    try await body()
                    return
                } catch {
                    guard error.kind == .unavailable, !Task.isCancelled else { return }
                    await core.clock.sleep(nanoseconds: pause)
                }
            }
        }
    }
}

// A call is usually dispatched on the loop of its client's connection. When the shard it needs
// lives on that same loop, going through the actor would queue a job on the loop and come back
// to it later (a task switch, an enqueue and a wake of the loop's queue per call); the shard's
// synchronous `handle` is run at once instead. It is isolated all the same: the loop runs one
// thing at a time, and no shard's synchronous code reaches a call's dispatch (calls start from
// socket reads and loop tasks, never from inside a shard).

extension ChannelShard {
    /// `handle`, at once when the caller already runs on this shard's loop, else as an actor call.
    nonisolated func serve(_ call: ClusterChannelCall, key: ChannelKey) async -> (ClusterChannelResult, [PeerLink.Ticket]) {
        if loop.inEventLoop { return handleOnLoop(call, key: key) }
        return await handle(call, key: key)
    }

    /// `handle`, run synchronously on this shard's loop (its executor): checked, then called as
    /// `assumeIsolated` would call it. (The standard library's `assumeIsolated` is generic and
    /// takes a closure it makes escaping: two allocations a call. Here the isolated function is a
    /// closure that captures nothing, cast to the same function without `isolated`, which has the
    /// same calling convention: the cast is what `assumeIsolated` does inside; the check before
    /// it is what makes it sound.)
    nonisolated func handleOnLoop(_ call: ClusterChannelCall, key: ChannelKey) -> (ClusterChannelResult, [PeerLink.Ticket]) {
        precondition(loop.inEventLoop, "a channel shard's call run off its loop")
        typealias Isolated = (isolated ChannelShard, ClusterChannelCall, ChannelKey) -> (ClusterChannelResult, [PeerLink.Ticket])
        typealias Plain = (ChannelShard, ClusterChannelCall, ChannelKey) -> (ClusterChannelResult, [PeerLink.Ticket])
        let isolated: Isolated = { shard, call, key in shard.handle(call, key: key) }
        return unsafeBitCast(isolated, to: Plain.self)(self, call, key)
    }
}

extension UserHomeShard {
    /// `handle`, at once when the caller already runs on this shard's loop, else as an actor call.
    nonisolated func serve(_ call: ClusterHomeCall, users: [String]) async -> (ClusterHomeResult, [PeerLink.Ticket]) {
        if loop.inEventLoop { return handleOnLoop(call, users: users) }
        return await handle(call, users: users)
    }

    /// As `ChannelShard.handleOnLoop`.
    private nonisolated func handleOnLoop(_ call: ClusterHomeCall, users: [String]) -> (ClusterHomeResult, [PeerLink.Ticket]) {
        precondition(loop.inEventLoop, "a home shard's call run off its loop")
        typealias Isolated = (isolated UserHomeShard, ClusterHomeCall, [String]) -> (ClusterHomeResult, [PeerLink.Ticket])
        typealias Plain = (UserHomeShard, ClusterHomeCall, [String]) -> (ClusterHomeResult, [PeerLink.Ticket])
        let isolated: Isolated = { shard, call, users in shard.handle(call, users: users) }
        return unsafeBitCast(isolated, to: Plain.self)(self, call, users)
    }
}
