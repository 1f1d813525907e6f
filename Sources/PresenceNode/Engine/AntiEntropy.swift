import ClusterCore
import PresenceCore
import PresenceWire
import Synchronization

/// The gateway's side of anti-entropy (RELIABILITY.md, "Anti-entropy runs all the time"): every
/// `ClusterTimings.antiEntropyInterval`, and soon after each ring change, this gateway sends each
/// owner (itself included) a digest of what it holds for that owner's keys: its sessions'
/// memberships and state in the owner's channels, its sessions' records and the users they watch
/// at the owner's user homes. Buckets whose digests differ are exchanged whole; the owner restores
/// what it lacks, says which of its sessions this gateway has superseded, corrects state a later
/// change replaced, and names what it places here that this gateway did not mention, which this
/// gateway then confirms gone (or moved) before the owner drops it. A divergence is repaired
/// within about two intervals.
final class AntiEntropy: Sendable {
    let core: EngineCore
    let inbound: PeerInbound
    private struct State {
        var started = false
        var soon = false
    }
    private let state = Mutex(State())
    /// Rounds run, and rounds that found something to repair (for tests and benchmarks).
    let rounds = Atomic<Int>(0)
    let repairs = Atomic<Int>(0)
    /// Facts per exchange request at most (larger sets go in several).
    static let maxFactsPerExchange = 20_000

    init(core: EngineCore, inbound: PeerInbound) {
        self.core = core
        self.inbound = inbound
    }

    func start() {
        guard state.withLock({ s -> Bool in defer { s.started = true }; return !s.started }) else { return }
        core.background.run { [self] in
            while !Task.isCancelled {
                await core.clock.sleep(nanoseconds: core.timings.antiEntropyInterval)
                guard !Task.isCancelled else { return }
                // (a node alone is its own gateway and owner: their calls are in-process and cannot
                // be lost, so there is nothing to repair; under steady writes the digests of a busy
                // channel always differ by the writes in flight, and the exchange would walk the
                // whole channel every interval — see BENCHMARKS.md, "Scaling curves")
                guard core.topology.routingRing.members.count > 1 else { continue }
                await round()
            }
        }
    }

    /// Runs a round shortly (after a ring change: once the handoffs have landed).
    func runSoon() {
        guard state.withLock({ s -> Bool in defer { s.soon = true }; return s.started && !s.soon }) else { return }
        core.background.run { [self] in
            await core.clock.sleep(nanoseconds: core.timings.antiEntropyAfterRingChange)
            state.withLock { $0.soon = false }
            guard !Task.isCancelled else { return }
            await round()
        }
    }

    /// This gateway's facts, by the node that owns each key on `ring`.
    func facts(on ring: HashRing) -> [String: GatewayFacts] {
        GatewayFacts.byOwner(tables: core.gateway.shards.map { $0.allSessions() }, me: core.me, ring: ring)
    }

    /// One round with every owner.
    func round() async {
        let topology = core.topology
        guard topology.isReady, !topology.isLeaving else { return }
        let ring = topology.routingRing
        rounds.add(1, ordering: .relaxed)
        let all = facts(on: ring)
        // (every owner at once: an unreachable one costs its call's timeout once, not once for
        // every owner after it in the ring, so the others are repaired within the bound)
        _ = await concurrently(ring.members) { [self] node in
            await reconcile(with: node, all[node] ?? GatewayFacts(), fingerprint: ring.fingerprint)
        }
    }

    private func reconcile(with node: String, _ f: GatewayFacts, fingerprint: UInt64) async {
        let me = core.me
        let digest = ClusterDigestRequest(fromNodeID: me.id, fromBoot: me.boot, ringFingerprint: fingerprint,
                                          channelCounts: f.channels.counts, channelSums: f.channels.sums,
                                          homeCounts: f.homes.counts, homeSums: f.homes.sums)
        guard let d = await call(node, PeerPresenceMethods.digest, digest, local: { await inbound.digest($0) }),
              !d.ringMismatch, !(d.channelBuckets.isEmpty && d.homeBuckets.isEmpty) else { return }
        repairs.add(1, ordering: .relaxed)
        // whole buckets, in requests of bounded size
        var requests: [ClusterExchangeRequest] = []
        var current = ClusterExchangeRequest(fromNodeID: me.id, fromBoot: me.boot, ringFingerprint: fingerprint)
        func flush() {
            requests.append(current)
            current = ClusterExchangeRequest(fromNodeID: me.id, fromBoot: me.boot, ringFingerprint: fingerprint)
        }
        for b in d.channelBuckets where b < FactDigest.buckets {
            let facts = (f.channelFacts[Int(b)] ?? []).map { ClusterChannelFact($0.key, $0.fact, at: me) }
            if current.channelFacts.count + current.homeFacts.count + facts.count > Self.maxFactsPerExchange, !(current.channelBuckets.isEmpty && current.homeBuckets.isEmpty) { flush() }
            current.channelBuckets.append(b)
            current.channelFacts += facts
        }
        for b in d.homeBuckets where b < FactDigest.buckets {
            let facts = (f.homeFacts[Int(b)] ?? []).map { ClusterHomeFact($0.user, $0.fact, at: me) }
            if current.channelFacts.count + current.homeFacts.count + facts.count > Self.maxFactsPerExchange, !(current.channelBuckets.isEmpty && current.homeBuckets.isEmpty) { flush() }
            current.homeBuckets.append(b)
            current.homeFacts += facts
        }
        flush()
        for req in requests {
            guard let r = await call(node, PeerPresenceMethods.exchange, req, local: { await inbound.exchange($0) }), !r.ringMismatch else { return }
            apply(r)
            let confirm = confirmation(of: r.suspects)
            if !confirm.gone.isEmpty || !confirm.moved.isEmpty || !confirm.neverOpened.isEmpty {
                _ = await call(node, PeerPresenceMethods.confirm, confirm, local: { await inbound.confirm($0); return ClusterConfirmResponse() })
            }
        }
    }

    /// Takes in what the owner said: sessions superseded elsewhere, and later states.
    private func apply(_ r: ClusterExchangeResponse) {
        for s in r.superseded {
            guard let id = SessionID(text: s.sessionID) else { continue }
            core.gateway.movedAway(id, to: nil, version: s.version, why: "anti-entropy: \(s.channelName.isEmpty ? "home of " + s.userID : s.channelName)")
        }
        for c in r.corrections {
            guard let id = SessionID(text: c.sessionID), let key = try? Validate.channel(c.channelName, c.channelType),
                  let state = try? Validate.stateItems(c.state) else { continue }
            core.gatewayShard(id).stateAcknowledged(id, channel: key, state: state, version: c.stateVersion)
        }
    }

    /// For each suspect (a session the owner places here that this gateway did not mention): is it
    /// gone from here (as of which version), or did it move to another gateway? Sessions that are
    /// held in that key after all (they joined since the facts were taken) are left alone.
    func confirmation(of suspects: [ClusterKeySession]) -> ClusterConfirmRequest {
        let me = core.me
        var out = ClusterConfirmRequest(fromNodeID: me.id, fromBoot: me.boot)
        for k in suspects {
            guard let id = SessionID(text: k.sessionID) else { continue }
            let g = core.gatewayShard(id)
            let channel = k.channelName.isEmpty ? nil : try? Validate.channel(k.channelName, k.channelType)
            guard k.channelName.isEmpty || channel != nil else { continue }
            var answer = k
            switch GatewayFacts.verdict(channel: channel, user: k.channelName.isEmpty ? k.userID : nil, placedAt: k.version,
                                        held: g.held(id), claiming: g.isClaiming(id) || g.claimLandedLate(id), movedTo: g.movedTo(id),
                                        abandoned: g.openAbandoned(id)) {
            case .held:
                continue
            case .neverOpened:
                out.neverOpened.append(k)
            case .gone(let version):
                answer.version = version
                out.gone.append(answer)
            case .moved(let to, let version):
                answer.gateway = to.id
                answer.gatewayBoot = to.boot
                answer.version = version
                out.moved.append(answer)
            }
        }
        return out
    }

    /// A peer call, or the same thing done here when the owner is this node.
    private func call<Req: ProtoMessage, Resp: ProtoMessage>(_ node: String, _ method: MethodDescriptor<Req, Resp>, _ request: Req,
                                                             local: (Req) async -> Resp) async -> Resp? {
        if node == core.topology.me { return await local(request) }
        return try? await core.link?.unary(node, method, request)
    }
}
