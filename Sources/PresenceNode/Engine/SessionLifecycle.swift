import ClusterCore
import PresenceCore
import PresenceWire

/// A session's life at its gateway (API.md, "Sessions"; RELIABILITY.md, "session epochs"): open;
/// resume, on this node or any other, by claiming it at its user's home (a new epoch, so what an
/// earlier gateway still says of it loses); close; the resume window after a broken stream and
/// the timeout after it; and dropping a session whose client resumed it elsewhere.
struct SessionLifecycle: Sendable {
    let core: EngineCore
    let router: Router

    private var topology: Topology { core.topology }

    func open(user: String, resume: String, initialStatus: UserStatus) async throws(PresenceError) -> PresenceEngine.OpenedSession {
        let user = try Validate.userID(user)
        switch initialStatus {
        case .unknown, .online, .away, .busy, .offline: break
        case .unrecognized(let v): throw PresenceError(.invalidArgument, "INVALID_STATUS", "initial_status \(v) is not a UserStatus")
        }
        if !resume.isEmpty {
            // (API.md, "Security": a resume by another user, or of an unknown or expired session,
            // is refused and changes nothing; the client opens a new session)
            guard let id = SessionID(text: resume) else {
                throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(resume) to resume; open a new one")
            }
            // (a node that has not joined yet sees itself alone and could not reach the session's
            // home: it cannot tell a live session from an unknown one, so the client tries again
            // or elsewhere — RELIABILITY.md, NOT_FOUND for a live session is a violation)
            if !topology.isReady {
                throw PresenceError(.unavailable, "NOT_READY", "this node has not joined the cluster yet: resume the session on another node, or retry")
            }
            if !topology.isAlone, let claimed = try await claim(id, user: user, initialStatus: initialStatus) { return claimed }
            if let o = core.gatewayShard(id).resume(id, user: user) {
                // (a node alone; or its home does not know it: a cluster of one that just grew, or a
                // home that lost it — anti-entropy gives the home this gateway's record. The status
                // is set unstamped: the home may hold no record of the session to order it by)
                if initialStatus != .unknown { _ = try await router.homeCall(user, .setStatus) { $0.status = initialStatus } }
                return PresenceEngine.OpenedSession(id: o.id, generation: o.generation, resumed: true, outbox: o.outbox)
            }
            if let other = core.gatewayShard(id).held(id)?.userID, other != user {
                throw PresenceError(.permissionDenied, "NOT_YOUR_SESSION", "session \(id) belongs to another user")
            }
            throw PresenceError(.notFound, "SESSION_NOT_FOUND", "session \(id) cannot be resumed (unknown, or past the presence timeout); open a new one")
        }
        if core.gateway.sessionCount >= core.settings.maxSessions {
            throw PresenceError(.resourceExhausted, "NODE_SESSION_LIMIT", "this node holds its maximum of \(core.settings.maxSessions) sessions; open the session on another node")
        }
        let id = core.clock.newSessionID()
        let o = core.gatewayShard(id).create(id, user: user)
        guard let s = core.gatewayShard(id).held(id) else { throw PresenceError(.unavailable, "SESSION_LOST", "the session ended while opening") }
        do {
            _ = try await router.homeCall(user, .sessionOpened) { c in
                c.session = core.ref(s)
                c.status = initialStatus
            }
        } catch {
            core.gatewayShard(id).abandonOpen(id)
            throw error
        }
        return PresenceEngine.OpenedSession(id: o.id, generation: o.generation, resumed: false, outbox: o.outbox)
    }

    /// Takes the session over from wherever it was (this node included) through its user's home:
    /// a new epoch starts there, the gateway it left is told, and this node announces it to its
    /// channels' owners and its watched users' homes (no event for anyone; SNAPSHOTs for it).
    private func claim(_ id: SessionID, user: String, initialStatus: UserStatus) async throws(PresenceError) -> PresenceEngine.OpenedSession? {
        let probe = ClusterSessionRef(sessionID: id.description, userID: user, gateway: core.me.id, gatewayBoot: core.me.boot)
        core.gatewayShard(id).claiming(id, true)
        defer { core.gatewayShard(id).claiming(id, false) }
        let found: ClusterHomeResult
        do {
            found = try await router.homeCall(user, .claimSession) { c in
                c.session = probe
                c.status = initialStatus   // (set by the home as it claims: API.md, the status is set as the session opens)
            }
        } catch {
            // (no answer: the home may have placed the session here all the same)
            if error.kind == .unavailable { core.gatewayShard(id).claimInDoubt(id) }
            throw error
        }
        guard found.found, let (_, record) = found.session?.record else { return nil }
        guard let o = core.gatewayShard(id).adopt(id, user: user, version: record.version, heldElsewhere: record.sink != core.me,
                                                  channels: record.channels, watching: Set(record.watching)),
              let s = core.gatewayShard(id).held(id) else {
            throw PresenceError(.permissionDenied, "NOT_YOUR_SESSION", "session \(id) belongs to another user")
        }
        // A channel's owner that had timed the session out (it counted from an earlier sight of
        // the old gateway's end than the home did) does not take it back without its state: the
        // session is past the timeout, and ends everywhere as timed out; the resume is refused,
        // and the client opens a new one (API.md: a resume of an expired session is refused).
        guard await announce(s, resume: true) else {
            if case .closed(let ended, _)? = core.gatewayShard(id).close(id) { await end(ended, timedOut: true) }
            throw PresenceError(.notFound, "SESSION_NOT_FOUND", "session \(id) is past the presence timeout; open a new one")
        }
        return PresenceEngine.OpenedSession(id: o.id, generation: o.generation, resumed: true, outbox: o.outbox)
    }

    /// Tells the session's channels' owners and its watched users' homes that it lives here now,
    /// at its new version (with the state this gateway holds for it).
    /// (All at once, as a session's end: one unreachable owner costs its retry window once.)
    /// `resume`: made by the claim of a resume. Returns false when an owner had timed the session
    /// out (`ClusterChannelResult.expired`).
    func announce(_ s: SessionTable.Session, resume: Bool) async -> Bool {
        // (the watches go out with the announces: a home ignores a watch from an epoch older
        // than the one it knows, should the session have moved on meanwhile)
        let ref = core.ref(s)
        let watches = router.byHome(s.watching.sorted())
        let jobs = s.channels.keys.sorted().map { Announce.channel($0) } + watches.map { Announce.watch($0) }
        let outcomes = await concurrently(jobs) { [self, router] job -> (movedTo: UInt64?, expired: Bool) in
            switch job {
            case .channel(let key):
                do throws(PresenceError) {
                    return (nil, try await announce(s, key, resume: resume))
                } catch {
                    if error.name == "SESSION_MOVED" { return (error.supersededBy, false) }
                    // Tried again in the background, not left to anti-entropy: anti-entropy goes
                    // straight to the owner, and a cut link between the two would keep the owner
                    // timing the session out at its old gateway (RELIABILITY.md, invariant 3).
                    if error.kind == .unavailable { announceLater(s.id, key, epoch: SessionVersion.epoch(s.version), resume: resume) }
                }
            case .watch(let users):
                _ = try? await router.homeCall(ClusterHomeCall(userIDs: users, op: .watch, session: ref))
            }
            return (nil, false)
        }
        if let movedTo = outcomes.compactMap(\.movedTo).max() { superseded(s.id, by: movedTo) }
        return !outcomes.contains(where: \.expired)
    }

    /// Announces the session to `key`'s owner in the background (`retryLater`), each attempt from
    /// the session as this gateway holds it then: none once it ended, moved on (another epoch) or
    /// left the channel, and with how it follows the channel now. An owner that timed it out
    /// meanwhile is told again as of a join: the session lives here, and is listed again (once).
    private func announceLater(_ id: SessionID, _ key: ChannelKey, epoch: UInt64, resume: Bool) {
        retryLater { [self] () async throws(PresenceError) in
            guard let s = core.gatewayShard(id).held(id), SessionVersion.epoch(s.version) == epoch, s.channels[key] != nil else { return }
            if try await announce(s, key, resume: resume) { _ = try await announce(s, key, resume: false) }
        }
    }

    private enum Announce: Sendable {
        case channel(ChannelKey)
        case watch([String])
    }

    /// Tells a channel's owner that the session is in it, as this gateway holds it. Returns
    /// whether the owner had timed the session out and, for a `resume`, did not take it back.
    @discardableResult
    func announce(_ s: SessionTable.Session, _ key: ChannelKey, resume: Bool = false) async throws(PresenceError) -> Bool {
        guard let m = s.channels[key] else { return false }
        var call = ClusterChannelCall(channelName: key.name, channelType: key.type, op: .announce,
                                      session: core.ref(s, withPresence: m.withPresence, version: m.joinVersion),
                                      items: m.state, stateVersion: m.stateVersion)
        call.resume = resume
        let r = try await router.channelCall(key, call)
        if r.expired { return true }
        core.gatewayShard(s.id).stateAcknowledged(s.id, channel: key, state: r.state, version: r.stateVersion)
        return false
    }

    /// After a resume that lost events: a fresh SNAPSHOT of every channel the session follows.
    func resnapshot(_ id: SessionID) async {
        guard let s = core.gatewayShard(id).held(id) else { return }
        for (key, m) in s.channels where m.withPresence {
            _ = try? await router.channelCall(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .resnapshot,
                                                                      session: core.ref(s, withPresence: true)))
        }
    }

    /// Sessions whose feed of a channel needs a fresh SNAPSHOT (their gateway saw events from
    /// another owner, or a SNAPSHOT not above what they had): asked of the channels' owners.
    func requestSnapshots(_ asks: [Subscriptions.Resnapshot]) {
        core.background.run { [core, router] in
            for a in asks {
                guard let s = core.gatewayShard(a.session).held(a.session) else { continue }
                _ = try? await router.channelCall(a.key, ClusterChannelCall(channelName: a.key.name, channelType: a.key.type, op: .resnapshot,
                                                                            session: core.ref(s, withPresence: true), floor: a.floor))
            }
        }
    }

    /// The session's stream of `generation` broke: start its resume window; time it out after.
    func streamBroke(_ id: SessionID, generation: UInt64) async {
        guard let deadline = core.gatewayShard(id).disconnect(id, generation: generation) else { return }
        let now = core.clock.monotonicNanoseconds()
        let wait = deadline > now ? deadline - now : 0
        core.background.run { [self] in
            await core.clock.sleep(nanoseconds: wait + 1_000_000)
            guard !Task.isCancelled else { return }
            await expire(id)
        }
    }

    /// Times the session out if its window has passed (and it was not resumed meanwhile).
    func expire(_ id: SessionID) async {
        guard let s = core.gatewayShard(id).expireIfDue(id) else { return }
        await end(s, timedOut: true)
    }

    /// CloseSession: REMOTE_LEAVE where the user has no other session; the stream ends.
    func close(_ sessionID: String) async throws(PresenceError) {
        let id = try Validate.sessionID(sessionID)
        // (a leaving node could not see the session's end through: its retries stop with it, and
        // the client resumes the session elsewhere — closed there instead; Cluster/chaos seed 68)
        if topology.isLeaving {
            throw PresenceError(.unavailable, "SHUTTING_DOWN", "this node is leaving the cluster: resume the session on another node and close it there")
        }
        // Cut off from the others (its client may still reach it), this node cannot tell the
        // session's owners and home that it ended: they time it out later, and a new session of
        // the user that joins meanwhile inherits its state. Acknowledged, that close would be lost
        // (RELIABILITY.md, invariant 1). So it is refused retryably, before and after the ends
        // were tried; the client moves, resumes the session elsewhere and closes it there (a
        // retry here while the node is still cut off is refused too).
        if !topology.holdsLease { throw Self.cutOffClose }
        switch core.gatewayShard(id).close(id) {
        case .closed(let s, let outbox):
            let told = await end(s, timedOut: false)
            outbox.end(.closed)
            if !told && !topology.holdsLease { throw Self.cutOffClose }
        case .alreadyClosed:
            return  // a retry whose first attempt's answer was lost: closed it is
        case nil:
            // (not held here; a node that has not joined yet cannot tell whether it lives elsewhere)
            if !topology.isReady {
                throw PresenceError(.unavailable, "NOT_READY", "this node has not joined the cluster yet: close the session on the node that serves it, or retry")
            }
            throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(sessionID)")
        }
    }

    /// Tells the session's owners and home that it ended (stamped with its last version, so an
    /// owner that knows a later epoch ignores it).
    /// The owners and the home are told at the same time: one unreachable owner (a cut link) costs
    /// its retry window once, not once per channel (RELIABILITY.md, invariant 7). The home's end
    /// is started last, as before (started first, a watcher got the user's OFFLINE before the
    /// channel's REMOTE_TIMEOUT: allowed, API.md promises no order between status and presence
    /// events; the interop suite's helpers now keep the events of the other kind they read past).
    /// Whether every end that must arrive did at once (the others are retried in the background).
    @discardableResult
    private func end(_ s: SessionTable.Session, timedOut: Bool) async -> Bool {
        let ended = core.ref(s, version: SessionVersion.bumped(s.version))
        var ends: [EndCall] = []
        for key in s.channels.keys.sorted() {
            core.gateway.subscriptions.unsubscribe(key, s.id)
            ends.append(.channel(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .leave, session: ended, timedOut: timedOut)))
        }
        ends.append(.home(ClusterHomeCall(userIDs: [s.userID], op: .sessionEnded, session: ended)))
        let unwatches = unwatchCalls(s.watching.sorted(), by: s).map(EndCall.home)
        let missed = await concurrently(ends + unwatches) { [self] end -> Bool in
            guard (try? await send(end)) == nil, end.mustArrive else { return false }
            retryLater { [self] () async throws(PresenceError) in try await send(end) }
            return true
        }
        return !missed.contains(true)
    }

    static let cutOffClose = PresenceError(.unavailable, "NOT_SERVING",
        "NO_LEASE: this node lost touch with the cluster and cannot tell the session's channels and home that it ended; resume the session on another node and close it there")

    /// One of the calls that tell a session's owners and homes it ended.
    private enum EndCall: Sendable {
        case channel(ChannelKey, ClusterChannelCall)
        case home(ClusterHomeCall)

        /// Retried in the background when it could not be carried now: what others see. (An
        /// unwatch is not: a status change still sent for a gone session is dropped by its gateway.)
        var mustArrive: Bool {
            if case .home(let call) = self { return call.op != .unwatch }
            return true
        }
    }

    private func send(_ end: EndCall) async throws(PresenceError) {
        switch end {
        case .channel(let key, let call): _ = try await router.channelCall(key, call)
        case .home(let call): _ = try await router.homeCall(call)
        }
    }

    /// What must reach an owner or home even if it was unreachable for the call's whole retry
    /// window (a session's end, a resumed session's announce): tried again in the background a
    /// few times, each through the router (and so through a relay when the link is cut).
    func retryLater(_ body: @escaping @Sendable () async throws(PresenceError) -> Void) {
        router.retryInBackground(attempts: core.timings.endRetryAttempts, pause: core.timings.endRetryPause, body)
    }

    /// The session stops watching `users`, by its Watch call numbered `write`.
    func unwatch(_ users: [String], by s: SessionTable.Session, write: UInt32) async {
        _ = await concurrently(unwatchCalls(users, by: s, write: write)) { [router] call in _ = try? await router.homeCall(call) }
    }

    /// One unwatch call per home of `users` (`write`: the Watch call's number; 0 for a session's end).
    private func unwatchCalls(_ users: [String], by s: SessionTable.Session, write: UInt32 = 0) -> [ClusterHomeCall] {
        let ref = core.ref(s, write: write)
        return router.byHome(users).map { ClusterHomeCall(userIDs: $0, op: .unwatch, session: ref) }
    }

    /// The session's client resumed it on another gateway (an owner or its home says so): this
    /// gateway drops it without a word to anyone.
    /// (Only if this gateway's epoch is older than `version`: an answer to an older claim's call,
    /// still being retried, must not drop the session a newer claim brought here.)
    func superseded(_ id: SessionID, by version: UInt64) {
        core.gateway.movedAway(id, to: nil, version: version == 0 ? .max : version, why: "an owner knows a later epoch")
    }
}
