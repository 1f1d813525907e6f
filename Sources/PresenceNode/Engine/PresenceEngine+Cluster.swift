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
            await channelShard(key).apply(r, key: key)
        }
        for r in batch.users {
            guard (try? Validate.userID(r.userID)) != nil else { continue }
            await homeShard(r.userID).apply(r)
        }
        // announces are forwarded at most once, to the owner this node knows
        for var a in batch.announces {
            guard let key = try? Validate.channel(a.channelName, a.channelType) else { continue }
            let owner = topology.owner(of: key)
            guard owner == topology.me || a.hops == 0 else { continue }
            a.hops += 1
            sendAnnounce(a, key: key, to: owner)
        }
        for var a in batch.homeAnnounces {
            guard let u = a.userIDs.first, (try? Validate.userID(u)) != nil else { continue }
            let home = topology.home(of: u)
            guard home == topology.me || a.hops == 0 else { continue }
            a.hops += 1
            sendAnnounce(a, to: home)
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

    /// This node refuted its own death: others may be timing its sessions out. Every session is
    /// announced to every owner and home, now and again once the rings have settled.
    func refutedOwnDeath() {
        reannounce(from: HashRing(members: []), to: topology.ring)
        Task { [self] in
            try? await Task.sleep(nanoseconds: 2_000_000_000)
            reannounce(from: HashRing(members: []), to: topology.ring)
        }
    }

    /// An announce for `owner`: applied here (retried while this node may not serve yet: a ring
    /// change or a handoff in progress, instead of being lost) or pushed to it.
    func sendAnnounce(_ call: ClusterChannelCall, key: ChannelKey, to owner: String) {
        guard owner == topology.me else {
            link?.push(to: owner) { $0.announces.append(call) }
            return
        }
        retryInBackground(attempts: 20, pause: 250_000_000) { () async throws(PresenceError) in _ = try await self.localChannel(key, call) }
    }

    func sendAnnounce(_ call: ClusterHomeCall, to home: String) {
        guard home == topology.me else {
            link?.push(to: home) { $0.homeAnnounces.append(call) }
            return
        }
        retryInBackground(attempts: 20, pause: 250_000_000) { () async throws(PresenceError) in _ = try await self.localHome(call) }
    }

    /// Anti-entropy: for every session here, tell the new owner of each of its channels and its
    /// user's new home (and the new homes of the users it watches) that it is alive and where.
    func reannounce(from old: HashRing, to new: HashRing) {
        guard link != nil else { return }
        for shard in gateway.shards {
            for s in shard.allSessions() {
                for (key, withPresence) in s.channels {
                    guard let owner = new.owner(of: key), owner != old.owner(of: key) else { continue }
                    sendAnnounce(announceCall(s, key, withPresence: withPresence), key: key, to: owner)
                }
                if let home = new.home(ofUser: s.userID), home != old.home(ofUser: s.userID) {
                    sendAnnounce(homeAnnounceCall(s), to: home)
                }
                for w in s.watching {
                    guard let home = new.home(ofUser: w), home != old.home(ofUser: w) else { continue }
                    sendAnnounce(watchCall(s, [w]), to: home)
                }
            }
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
