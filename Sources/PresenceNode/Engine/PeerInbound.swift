import ClusterCore
import EventLoop
import PresenceCore
import PresenceWire

/// What other nodes send this one: calls routed here as a channel owner or user home, pushes
/// (deliveries for this gateway's sessions, copies, handoffs, sessions that moved away), and the
/// owner's side of anti-entropy. Input from the network is validated; a node that does not own a
/// key forwards the call once, or answers UNAVAILABLE.
struct PeerInbound: Sendable {
    let core: EngineCore
    let router: Router
    let sessions: SessionLifecycle
    /// Told when a member back from death asks for handoffs.
    let handoffRequested: @Sendable (NodeInstance, UInt64, UInt64) -> Void
    /// Told when a batch brought handoffs (or said one is done): a key a handoff started waits
    /// for the handoff gate before its followers get their SNAPSHOTs.
    let handoffsLanded: @Sendable () -> Void

    private var topology: Topology { core.topology }

    // MARK: Calls

    /// A channel call routed here; `answerBy`: the deadline of the caller's attempt. Answered at
    /// once on the calling thread when this node owns the channel, serves it, its shard runs on
    /// this thread and the answer waits for no copy (a read, or a write with no replica): then no
    /// task is started for the call. On another of this node's loops, it is tried again there
    /// once; the rest (a wait for replicas, a call passed on to the owner) runs as a task. It
    /// never fails: errors are answered in the result.
    func channel(_ call: ClusterChannelCall, answerBy: UInt64?, handOff: Bool = true) -> Staged<ClusterChannelResult, any Error> {
        let key: ChannelKey
        do throws(PresenceError) {
            key = try Validate.channel(call.channelName, call.channelType)
            if let why = topology.ringMismatch(call.ringFingerprint) { throw PresenceError(.unavailable, "NOT_SERVING", why) }
        } catch {
            return .now(ClusterChannelResult(error: error.wire))
        }
        guard topology.owner(of: key) == topology.me else { return .later { [self] in await servedOrPassedOn(key, call, answerBy: answerBy) } }
        switch router.channelCallAtOnce(key, call) {
        case .answered(let answer):
            if answer.isFinal(core) { return .now(answer.result) }
            return .later { [router] in
                do throws(PresenceError) { return try await router.finish(answer, answerBy: answerBy) } catch { return ClusterChannelResult(error: error.wire) }
            }
        case .onLoop(let loop) where handOff:
            return .onLoop(loop) { [self] in channel(call, answerBy: answerBy, handOff: false) }
        case .onLoop, .elsewhere:
            return .later { [self] in await servedOrPassedOn(key, call, answerBy: answerBy) }
        }
    }

    /// The rest of a channel call `channel` checked: answered here as the owner (or refused while
    /// this node may not), or passed on once to the owner.
    private func servedOrPassedOn(_ key: ChannelKey, _ call: ClusterChannelCall, answerBy: UInt64?) async -> ClusterChannelResult {
        do throws(PresenceError) {
            let owner = topology.owner(of: key)
            if owner == topology.me { return try await router.localChannel(key, call, answerBy: answerBy) }
            guard call.hops == 0, let link = core.link else {
                throw PresenceError(.unavailable, "NOT_OWNER", "\(topology.me) does not own \(key) (its owner is \(owner)); retry")
            }
            var forwarded = call
            forwarded.hops = 1
            return try await link.channel(owner, forwarded, timeout: try router.forwardTimeout(answerBy: answerBy))
        } catch {
            return ClusterChannelResult(error: error.wire)
        }
    }

    /// A home call routed here. `answerBy`: the deadline of the caller's attempt.
    func home(_ call: ClusterHomeCall, answerBy: UInt64?) async -> ClusterHomeResult {
        do throws(PresenceError) {
            var users: [String] = []
            for u in call.userIDs { users.append(try Validate.userID(u)) }
            guard let first = users.first, users.count <= Limits.maxUsersPerCall else {
                throw PresenceError(.invalidArgument, "INVALID_USER_ID", "a home call names 1 to \(Limits.maxUsersPerCall) users")
            }
            if let why = topology.ringMismatch(call.ringFingerprint) { throw PresenceError(.unavailable, "NOT_SERVING", why) }
            let home = topology.home(of: first)
            guard users.allSatisfy({ topology.home(of: $0) == home }) else {
                throw PresenceError(.unavailable, "NOT_OWNER", "these users do not share a home here; retry")
            }
            if home == topology.me { return try await router.localHome(call, answerBy: answerBy) }
            guard call.hops == 0, let link = core.link else {
                throw PresenceError(.unavailable, "NOT_OWNER", "\(topology.me) is not the home of \(first) (\(home) is); retry")
            }
            var forwarded = call
            forwarded.hops = 1
            return try await link.home(home, forwarded, timeout: try router.forwardTimeout(answerBy: answerBy))
        } catch {
            return ClusterHomeResult(error: error.wire)
        }
    }

    // MARK: Pushes

    /// Passes a batch on to its destination for a sender that cannot reach it (one hop).
    func relay(_ batch: ClusterPushBatch) async throws {
        guard let link = core.link, Validate.isIdentifier(batch.relayTo) else { return }
        try await link.relay(batch)
    }

    /// What another node pushed, in its order: copies and handoffs, sessions that moved away,
    /// deliveries. A push queued for an earlier process of this node is dropped.
    func push(_ batch: ClusterPushBatch) async {
        guard batch.toBoot == 0 || batch.toBoot == core.me.boot, Validate.isIdentifier(batch.fromNodeID) else { return }
        let from = NodeInstance(batch.fromNodeID, boot: batch.fromBoot)
        var handedOff = batch.handoffDone
        for r in batch.channels {
            handedOff = handedOff || r.handoff
            guard let copy = r.copy else { continue }
            await core.channelShard(copy.key).received(copy, from: from.id, gone: ClusterGoneGateway.ages(r.gone))
        }
        for r in batch.users {
            handedOff = handedOff || r.handoff
            guard let copy = r.copy else { continue }
            await core.userHomes[core.homeShardIndex(copy.record.userID)].received(copy, from: from.id, gone: ClusterGoneGateway.ages(r.gone))
        }
        for c in batch.copyRequests.prefix(Limits.maxChannelsPerSession) {
            guard let key = c.key else { continue }
            await core.channelShard(key).sendWholeCopy(of: key, to: from.id)
        }
        for u in batch.homeCopyRequests.prefix(Limits.maxUsersPerCall) where Validate.isIdentifier(u) {
            await core.userHomes[core.homeShardIndex(u)].sendWholeCopy(of: u, to: from.id)
        }
        for m in batch.moved {
            guard let id = SessionID(text: m.sessionID), Validate.isIdentifier(m.gateway) else { continue }
            core.gateway.movedAway(id, to: NodeInstance(m.gateway, boot: m.gatewayBoot), version: m.version, why: "its home: claimed by \(m.gateway)")
        }
        for d in batch.deliveries { core.gateway.deliver(d, from: from) }
        if batch.handoffDone {
            topology.handoffDone(from: batch.fromNodeID, fingerprint: batch.ringFingerprint, toIncarnation: batch.toIncarnation)
            core.trace?("handoff done by", ["node": batch.fromNodeID, "ring": String(batch.ringFingerprint),
                                            "pending": topology.handoffPending])
        }
        if batch.handoffRequest != 0 { handoffRequested(from, batch.handoffRequest, batch.fromIncarnation) }
        if handedOff { handoffsLanded() }
    }

    // MARK: Anti-entropy (this node as owner and home)

    func digest(_ req: ClusterDigestRequest) async -> ClusterDigestResponse {
        guard Validate.isIdentifier(req.fromNodeID) else { return ClusterDigestResponse() }
        guard topology.ringMismatch(req.ringFingerprint) == nil, topology.isReady else {
            return ClusterDigestResponse(ringMismatch: true)
        }
        let sink = NodeInstance(req.fromNodeID, boot: req.fromBoot)
        var channels = FactDigest(), homes = FactDigest()
        for s in core.channelShards { channels.add(await s.digest(of: sink)) }
        for s in core.userHomes { homes.add(await s.digest(of: sink)) }
        let theirChannels = FactDigest(counts: req.channelCounts, sums: req.channelSums)
        let theirHomes = FactDigest(counts: req.homeCounts, sums: req.homeSums)
        return ClusterDigestResponse(channelBuckets: channels.mismatches(theirChannels).sorted().map(UInt32.init),
                                     homeBuckets: homes.mismatches(theirHomes).sorted().map(UInt32.init))
    }

    func exchange(_ req: ClusterExchangeRequest) async -> ClusterExchangeResponse {
        guard Validate.isIdentifier(req.fromNodeID) else { return ClusterExchangeResponse() }
        guard topology.ringMismatch(req.ringFingerprint) == nil else { return ClusterExchangeResponse(ringMismatch: true) }
        let sink = NodeInstance(req.fromNodeID, boot: req.fromBoot)
        let channelBuckets = Set(req.channelBuckets.map(Int.init).filter { $0 < FactDigest.buckets })
        let homeBuckets = Set(req.homeBuckets.map(Int.init).filter { $0 < FactDigest.buckets })
        var response = ClusterExchangeResponse()

        var channelFacts: [Int: [ChannelKey: [ChannelFact]]] = [:]
        for f in req.channelFacts {
            guard let key = try? Validate.channel(f.channelName, f.channelType), let ref = f.session,
                  let id = SessionID(text: ref.sessionID), Validate.isIdentifier(ref.userID),
                  let state = try? Validate.stateItems(f.state) else { continue }
            let fact = ChannelFact(session: id, user: ref.userID, withPresence: ref.withPresence, joinVersion: ref.version, state: state, stateVersion: f.stateVersion)
            channelFacts[shardIndex(key), default: [:]][key, default: []].append(fact)
        }
        for (i, shard) in core.channelShards.enumerated() {
            let results = await shard.reconcile(from: sink, buckets: channelBuckets, facts: channelFacts[i] ?? [:])
            for (key, r) in results {
                response.suspects += r.suspects.map { ClusterKeySession(channelName: key.name, channelType: key.type, sessionID: $0.key.description, version: $0.value) }
                response.superseded += r.superseded.map { ClusterKeySession(channelName: key.name, channelType: key.type, sessionID: $0.key.description, version: $0.value) }
                response.corrections += r.corrections.map {
                    ClusterStateCorrection(channelName: key.name, channelType: key.type, sessionID: $0.session.description, state: $0.state, stateVersion: $0.stateVersion)
                }
            }
        }

        var homeFacts: [Int: [String: [HomeFact]]] = [:]
        for f in req.homeFacts {
            guard Validate.isIdentifier(f.userID), let s = f.session else { continue }
            let fact: HomeFact
            if f.watcher {
                guard let id = SessionID(text: s.sessionID) else { continue }
                fact = .watcher(id, version: s.version)
            } else {
                guard let (id, record) = s.record else { continue }
                fact = .session(id, record)
            }
            homeFacts[core.homeShardIndex(f.userID), default: [:]][f.userID, default: []].append(fact)
        }
        for (i, shard) in core.userHomes.enumerated() {
            let results = await shard.reconcile(from: sink, buckets: homeBuckets, facts: homeFacts[i] ?? [:])
            for (user, r) in results {
                response.suspects += r.suspects.map { ClusterKeySession(userID: user, sessionID: $0.key.description, version: $0.value) }
                response.superseded += r.superseded.map { ClusterKeySession(userID: user, sessionID: $0.key.description, version: $0.value) }
            }
        }
        return response
    }

    func confirm(_ req: ClusterConfirmRequest) async {
        guard Validate.isIdentifier(req.fromNodeID) else { return }
        let sink = NodeInstance(req.fromNodeID, boot: req.fromBoot)
        var channelGone: [Int: [(ChannelKey, SessionID, UInt64)]] = [:], channelMoved: [Int: [(ChannelKey, SessionID, NodeInstance, UInt64)]] = [:]
        var homeGone: [Int: [(String, SessionID, UInt64)]] = [:], homeMoved: [Int: [(String, SessionID, NodeInstance, UInt64)]] = [:]
        for (list, moved) in [(req.gone, false), (req.moved, true)] {
            for k in list {
                guard let id = SessionID(text: k.sessionID) else { continue }
                let to = Validate.isIdentifier(k.gateway) ? NodeInstance(k.gateway, boot: k.gatewayBoot) : nil
                if k.channelName.isEmpty {
                    guard Validate.isIdentifier(k.userID) else { continue }
                    let i = core.homeShardIndex(k.userID)
                    if moved, let to { homeMoved[i, default: []].append((k.userID, id, to, k.version)) } else if !moved { homeGone[i, default: []].append((k.userID, id, k.version)) }
                } else {
                    guard let key = try? Validate.channel(k.channelName, k.channelType) else { continue }
                    let i = shardIndex(key)
                    if moved, let to { channelMoved[i, default: []].append((key, id, to, k.version)) } else if !moved { channelGone[i, default: []].append((key, id, k.version)) }
                }
            }
        }
        for (i, shard) in core.channelShards.enumerated() where channelGone[i] != nil || channelMoved[i] != nil {
            await shard.confirmed(from: sink, gone: channelGone[i] ?? [], moved: channelMoved[i] ?? [])
        }
        var homeNeverOpened: [Int: [(String, SessionID)]] = [:]
        for k in req.neverOpened {
            guard let id = SessionID(text: k.sessionID), k.channelName.isEmpty, Validate.isIdentifier(k.userID) else { continue }
            homeNeverOpened[core.homeShardIndex(k.userID), default: []].append((k.userID, id))
        }
        for (i, shard) in core.userHomes.enumerated() where homeGone[i] != nil || homeMoved[i] != nil || homeNeverOpened[i] != nil {
            await shard.confirmed(from: sink, gone: homeGone[i] ?? [], moved: homeMoved[i] ?? [], neverOpened: homeNeverOpened[i] ?? [])
        }
    }

    private func shardIndex(_ key: ChannelKey) -> Int { Int(StableHash.of(key) % UInt64(core.channelShards.count)) }
}
