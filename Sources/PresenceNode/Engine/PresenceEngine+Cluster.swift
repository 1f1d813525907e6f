import ClusterCore
import EventLoop
import PresenceCore
import PresenceWire

/// The engine's side of the peer link: calls other nodes route here, pushes they send, and what
/// this node does when the ring changes (handoff, takeover, anti-entropy).
extension PresenceEngine {
    // MARK: Calls from other nodes

    /// A channel call another node routed here. Input from the network is validated; a node that
    /// no longer owns the key forwards the call once, or answers UNAVAILABLE.
    func peerChannel(_ call: ClusterChannelCall) async -> ClusterChannelResult {
        do throws(PresenceError) {
            let key = try Validate.channel(call.channelName, call.channelType)
            if let why = topology.ringMismatch(call.ringFingerprint) { throw PresenceError(.unavailable, "NOT_SERVING", why) }
            let owner = topology.owner(of: key)
            if owner == topology.me { return try await localChannel(key, call) }
            guard call.hops == 0, let link else {
                throw PresenceError(.unavailable, "NOT_OWNER", "\(topology.me) does not own \(key) (its owner is \(owner)); retry")
            }
            var forwarded = call
            forwarded.hops += 1
            return try await link.channel(owner, forwarded)
        } catch {
            return ClusterChannelResult(error: error.wire)
        }
    }

    func peerHome(_ call: ClusterHomeCall) async -> ClusterHomeResult {
        do throws(PresenceError) {
            var users: [String] = []
            for u in call.userIDs { users.append(try Validate.userID(u)) }
            guard let first = users.first, users.count <= Limits.maxWatchedPerSession else {
                throw PresenceError(.invalidArgument, "INVALID_USER_ID", "a home call names 1 to \(Limits.maxWatchedPerSession) users")
            }
            if let why = topology.ringMismatch(call.ringFingerprint) { throw PresenceError(.unavailable, "NOT_SERVING", why) }
            let home = topology.home(of: first)
            guard users.allSatisfy({ topology.home(of: $0) == home }) else {
                throw PresenceError(.unavailable, "NOT_OWNER", "these users do not share a home here; retry")
            }
            if home == topology.me { return try await localHome(call) }
            guard call.hops == 0, let link else {
                throw PresenceError(.unavailable, "NOT_OWNER", "\(topology.me) is not the home of \(first) (\(home) is); retry")
            }
            var forwarded = call
            forwarded.hops += 1
            return try await link.home(home, forwarded)
        } catch {
            return ClusterHomeResult(error: error.wire)
        }
    }

    /// Which of these sessions this gateway holds (an owner checking before it times them out).
    func peerCheckSessions(_ check: ClusterSessionCheck) -> ClusterSessionCheckResult {
        let live = check.sessionIDs.prefix(Self.maxSessionCheck).filter { text in
            SessionID(text: text).map { gateway.shard($0).holds($0) } ?? false
        }
        return ClusterSessionCheckResult(liveSessionIDs: Array(live))
    }

    /// Session ids one CheckSessions call may name.
    static let maxSessionCheck = 100_000

    /// What another node pushed, in its order: replica records and handoffs, announces, deliveries.
    func peerPush(_ batch: ClusterPushBatch) async {
        for r in batch.channels {
            guard let key = try? Validate.channel(r.channelName, r.channelType) else { continue }
            await channelShard(key).apply(r, key: key, handoff: r.handoff)
        }
        for r in batch.users {
            guard (try? Validate.userID(r.userID)) != nil else { continue }
            await homeShard(r.userID).apply(r)
        }
        for a in batch.announces {
            guard let key = try? Validate.channel(a.channelName, a.channelType) else { continue }
            if topology.owner(of: key) == topology.me {
                announceHere { () async throws(PresenceError) in _ = try await self.localChannel(key, a) }
            } else if a.hops == 0 {
                var f = a
                f.hops = 1
                link?.push(to: topology.owner(of: key)) { $0.announces.append(f) }
            }
        }
        for a in batch.homeAnnounces {
            guard let u = a.userIDs.first, (try? Validate.userID(u)) != nil else { continue }
            if topology.home(of: u) == topology.me {
                announceHere { () async throws(PresenceError) in _ = try await self.localHome(a) }
            } else if a.hops == 0 {
                var f = a
                f.hops = 1
                link?.push(to: topology.home(of: u)) { $0.homeAnnounces.append(f) }
            }
        }
        for d in batch.deliveries { gateway.deliver(d) }
        if batch.handoffDone { topology.handoffDone(from: batch.fromNodeID, fingerprint: batch.ringFingerprint) }
    }

    // MARK: Ring changes

    /// Carries out a ring change: every shard hands off what moved away and takes over what it now
    /// owns; then this node tells every member it is done handing off, and its gateway
    /// re-announces its sessions to the owners and homes that changed (anti-entropy).
    func ringChanged(from old: HashRing, to new: HashRing, alive: Set<String>) async {
        for s in channelShards { await s.ringChanged(from: old, to: new, alive: alive) }
        for s in userHomes { await s.ringChanged(from: old, to: new, alive: alive) }
        topology.settled(new.fingerprint)
        guard let link else { return }
        for node in new.members where node != topology.me {
            link.push(to: node) { b in
                b.handoffDone = true
                b.ringFingerprint = new.fingerprint
            }
        }
        for node in old.members where !new.members.contains(node) { link.forget(node) }
        reannounce(from: old, to: new)
        // and once more when the ring has settled, relative to the ring before this burst of changes:
        // owners that had not caught up yet may have dropped or misrouted the first announces
        let first = settleBase.withLock { base -> Bool in
            guard base == nil else { return false }
            base = old
            return true
        }
        guard first else { return }
        Task { [self] in
            try? await Task.sleep(nanoseconds: 2_000_000_000)
            if let base = settleBase.withLock({ b -> HashRing? in defer { b = nil }; return b }) {
                reannounce(from: base, to: topology.ring)
            }
        }
    }

    /// Applies an announce this node owns; while it may not serve yet (ring change, handoff in
    /// progress) the announce waits and tries again, up to a few seconds, instead of being lost.
    func announceHere(_ apply: @escaping @Sendable () async throws(PresenceError) -> Void) {
        Task {
            for _ in 0..<20 {
                do throws(PresenceError) {
                    try await apply()
                    return
                } catch {
                    guard error.kind == .unavailable else { return }
                    try? await Task.sleep(nanoseconds: 250_000_000)
                }
            }
        }
    }

    /// Anti-entropy: for every session here, tell the new owner of each of its channels and its
    /// user's new home (and the new homes of the users it watches) that it is alive and where.
    func reannounce(from old: HashRing, to new: HashRing) {
        guard let link else { return }
        let me = topology.me
        for shard in gateway.shards {
            for s in shard.allSessions() {
                for (key, withPresence) in s.channels {
                    guard let owner = new.owner(of: key), owner != old.owner(of: key) || !old.members.contains(owner) else { continue }
                    let call = ClusterChannelCall(channelName: key.name, channelType: key.type, op: .announce,
                                                  session: ClusterSessionRef(sessionID: s.id.description, userID: s.userID, gateway: me, withPresence: withPresence))
                    if owner == me {
                        let engine = self
                        engine.announceHere { () async throws(PresenceError) in _ = try await engine.localChannel(key, call) }
                    } else {
                        link.push(to: owner) { $0.announces.append(call) }
                    }
                }
                let sref = ClusterSessionRef(sessionID: s.id.description, userID: s.userID, gateway: me)
                if let home = new.home(ofUser: s.userID), home != old.home(ofUser: s.userID) {
                    let call = ClusterHomeCall(userIDs: [s.userID], op: .sessionOpened, session: sref, announce: true,
                                               channels: s.channels.sorted { $0.key < $1.key }.map { ClusterSessionChannel($0.key, withPresence: $0.value) },
                                               watching: s.watching.sorted())
                    push(call, to: home)
                }
                for w in s.watching {
                    guard let home = new.home(ofUser: w), home != old.home(ofUser: w) else { continue }
                    push(ClusterHomeCall(userIDs: [w], op: .watch, session: sref), to: home)
                }
            }
        }
    }

    private func push(_ call: ClusterHomeCall, to home: String) {
        if home == topology.me {
            let engine = self
            engine.announceHere { () async throws(PresenceError) in _ = try await engine.localHome(call) }
        } else {
            link?.push(to: home) { $0.homeAnnounces.append(call) }
        }
    }

    /// Graceful leave: hands every channel and user home to the node that owns it once this one
    /// is gone, and waits (up to `timeout` ns) until that was sent.
    public func handOffBeforeLeaving(timeout: UInt64) async {
        guard let link, !topology.isAlone else { return }
        let without = topology.ring.removing(topology.me)
        for s in channelShards { await s.handOffAll(to: without) }
        for s in userHomes { await s.handOffAll(to: without) }
        await link.drain(timeout: timeout)
    }
}
