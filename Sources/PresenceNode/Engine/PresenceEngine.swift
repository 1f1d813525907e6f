import ClusterCore
import EventLoop
import PresenceCore
import PresenceWire
import Synchronization

/// Settings of the presence engine.
public struct EngineSettings: Sendable {
    public var nodeID: String
    public var presenceTimeoutNanoseconds: UInt64
    public var maxInstantEvents: Int
    public var presenceIntervalNanoseconds: UInt64
    /// New sessions past this many on the node are refused (`--max-sessions`).
    public var maxSessions = 1_000_000
    /// Shard actors per role.
    public var shards = 32
    /// Bytes of encoded GetOnlineUsers pages kept until their channel changes, over all shards.
    public var listingCacheBytes = 16 << 20
    /// The cluster's timings (derived from the probe interval and the presence timeout).
    public var timings: ClusterTimings

    public init(nodeID: String, presenceTimeout: Double, maxInstantEvents: Int, presenceInterval: Double, probeInterval: Double = 0.2) {
        self.nodeID = nodeID
        self.presenceTimeoutNanoseconds = UInt64(presenceTimeout * 1e9)
        self.maxInstantEvents = maxInstantEvents
        self.presenceIntervalNanoseconds = UInt64(presenceInterval * 1e9)
        self.timings = ClusterTimings(probeInterval: UInt64(probeInterval * 1e9), presenceTimeout: UInt64(presenceTimeout * 1e9))
    }
}

/// What every part of the engine shares: settings, clock, routing state, the peer link, this
/// node's gateway and its shard actors, and the background tasks that stop with the node.
final class EngineCore: Sendable {
    let settings: EngineSettings
    let clock: EngineClock
    let topology: Topology
    let link: PeerLink?
    let gateway: LocalGateway
    let channelShards: [ChannelShard]
    let userHomes: [UserHomeShard]
    let background: BackgroundTasks
    /// Debug-level log lines (nil unless the node logs at debug).
    let trace: (@Sendable (String, KeyValuePairs<String, String>) -> Void)?
    var timings: ClusterTimings { settings.timings }
    var me: NodeInstance { topology.instance }

    init(settings: EngineSettings, loops: [EventLoop], clock: EngineClock, placement: TaskPlacement, topology: Topology, link: PeerLink?,
         trace: (@Sendable (String, KeyValuePairs<String, String>) -> Void)? = nil) {
        self.settings = settings
        background = BackgroundTasks(placement: placement)
        self.clock = clock
        self.topology = topology
        self.link = link
        self.trace = trace
        let n = max(1, settings.shards)
        let gateway = LocalGateway(shards: n, resumeWindow: settings.presenceTimeoutNanoseconds, clock: clock, movedMemory: settings.timings.movedMemory,
                                   trace: trace)
        self.gateway = gateway
        let fabric = Fabric(topology: topology, link: link, gateway: gateway, placement: placement, timings: settings.timings, trace: trace)
        channelShards = (0..<n).map { i in
            ChannelShard(maxInstantEvents: settings.maxInstantEvents, intervalNanoseconds: settings.presenceIntervalNanoseconds,
                         presenceTimeout: settings.presenceTimeoutNanoseconds, staleHold: settings.timings.staleTakeoverHold,
                         replicationFactor: topology.replicationFactor, listingCacheBytes: settings.listingCacheBytes / n,
                         clock: clock, fabric: fabric, loop: loops[i % loops.count])
        }
        userHomes = (0..<n).map { i in
            UserHomeShard(clock: clock, presenceTimeout: settings.presenceTimeoutNanoseconds, staleHold: settings.timings.staleTakeoverHold,
                          replicationFactor: topology.replicationFactor,
                          fabric: fabric, loop: loops[i % loops.count])
        }
    }

    func gatewayShard(_ id: SessionID) -> GatewayShard { gateway.shard(id) }
    func channelShard(_ key: ChannelKey) -> ChannelShard { channelShard(keyHash: StableHash.of(key)) }
    func channelShard(keyHash: UInt64) -> ChannelShard { channelShards[Int(keyHash % UInt64(channelShards.count))] }
    func homeShardIndex(_ user: String) -> Int { Int(StableHash.of(user) % UInt64(userHomes.count)) }

    /// A session as calls carry it: its user, this gateway's process, the session's version.
    /// `write`: the call's number, for a call its home orders by it (`GatewayShard.numberedCall`).
    func ref(_ s: SessionTable.Session, withPresence: Bool = false, version: UInt64? = nil, write: UInt32 = 0) -> ClusterSessionRef {
        ClusterSessionRef(sessionID: s.id.description, userID: s.userID, gateway: me.id, withPresence: withPresence,
                          gatewayBoot: me.boot, version: version ?? s.version, write: write)
    }

    /// The session's ref for a state write on a channel it is in (stamped with its join's version
    /// and numbered; in flight until `GatewayShard.writeFinished`), or nil when it is not in the channel. Throws for an unknown or moved session.
    /// (No copy of the session is made: one kept across a call would make the next change to the
    /// session's channels copy them whole.)
    /// `text`: the id as the client sent it, when it parsed to `id` (any text form that does names
    /// the same session: not made again, 16 or 32 digits of text allocated per write).
    func writeRef(_ g: GatewayShard, _ id: SessionID, text: String? = nil, _ key: ChannelKey) throws(PresenceError) -> ClusterSessionRef? {
        guard let w = try g.numberedWrite(id, channel: key) else { return nil }
        return ClusterSessionRef(sessionID: text ?? id.description, userID: w.user, gateway: me.id, withPresence: false,
                                 gatewayBoot: me.boot, version: w.joinVersion, write: w.write, settled: w.settled)
    }
}

/// Every presence call of API.md on this node, in the three roles of ARCHITECTURE.md: gateway
/// (the sessions connected here, and the authority on them), channel owner and user home (for the
/// keys the ring gives this node). The parts: `Router` (calls to owners), `SessionLifecycle`
/// (open, resume, close, time out), `RingCoordinator` (ring changes, handoff, leaving),
/// `PeerInbound` (what other nodes send), `AntiEntropy` (gateways keeping owners in step).
public final class PresenceEngine: Sendable {
    public var settings: EngineSettings { core.settings }
    let core: EngineCore
    let router: Router
    let sessions: SessionLifecycle
    let ring: RingCoordinator
    let inbound: PeerInbound
    let antiEntropy: AntiEntropy
    var topology: Topology { core.topology }
    /// Set once `endAllStreams` ran: a stream attached after that (a resume that was in flight)
    /// ends at once too, so its client resumes elsewhere instead of waiting out the grace period.
    private let streamsEnded = Atomic<Bool>(false)
    public var isShuttingDown: Bool { streamsEnded.load(ordering: .acquiring) }

    /// The shard actors run on `loops`, spread evenly (shard i on loop i mod count). Without a
    /// `link` the engine is a cluster of one.
    /// `clock` and `placement`: the clock and task seams (production: the system's clock and the
    /// global pool; the simulation: virtual time and the node's stepped loops).
    public init(settings: EngineSettings, loops: [EventLoop], clock: EngineClock = SystemClock(), placement: TaskPlacement = .pool,
                topology: Topology? = nil, link: PeerLink? = nil, logger: Logger? = nil) {
        precondition(!loops.isEmpty, "the engine needs at least one event loop")
        let topology = topology ?? Topology(me: settings.nodeID, replicationFactor: 1)
        let core = EngineCore(settings: settings, loops: loops, clock: clock, placement: placement, topology: topology, link: link, trace: logger?.debugTrace)
        self.core = core
        router = Router(core: core)
        sessions = SessionLifecycle(core: core, router: router)
        let handoffs = Mutex<RingCoordinator?>(nil)
        inbound = PeerInbound(core: core, router: router, sessions: sessions, handoffRequested: { node, fingerprint, incarnation in
            handoffs.withLock { $0 }?.handoffRequested(by: node, fingerprint: fingerprint, incarnation: incarnation)
        }, handoffsLanded: {
            handoffs.withLock { $0 }?.releaseHeldBackSoon()
        })
        antiEntropy = AntiEntropy(core: core, inbound: inbound)
        ring = RingCoordinator(core: core, antiEntropy: antiEntropy)
        handoffs.withLock { [ring] in $0 = ring }
        let sessions = self.sessions
        core.gateway.onResnapshot { asks in sessions.requestSnapshots(asks) }
        link?.onLoss { [ring] node, copies in ring.lostPushes(to: node, copies: copies) }
        topology.onReady { [core, ring] in
            core.background.run { await ring.joined() }
        }
    }

    /// Starts the engine's periodic work (anti-entropy, in a cluster).
    public func start() {
        if core.link != nil { antiEntropy.start() }
    }

    /// Stops every background task and timer (the node is shutting down).
    public func stop() async {
        core.background.stopAll()
        for s in core.channelShards { await s.stop() }
        for s in core.userHomes { await s.stop() }
    }

    // MARK: Sessions

    /// A session as opened for a stream.
    public struct OpenedSession: Sendable {
        public let id: SessionID
        public let generation: UInt64
        public let resumed: Bool
        public let outbox: SessionOutbox
    }

    /// Opens (or resumes, on any node) a session for `user`; the caller sends `opened`, then
    /// attaches its stream.
    public func openSession(user: String, resume: String, initialStatus: UserStatus) async throws(PresenceError) -> OpenedSession {
        try await sessions.open(user: user, resume: resume, initialStatus: initialStatus)
    }

    /// After a resume that lost events: a fresh SNAPSHOT of every channel the session follows.
    public func resnapshot(_ id: SessionID) async { await sessions.resnapshot(id) }

    /// The session's stream of `generation` broke: start its resume window; time it out after.
    public func streamBroke(_ id: SessionID, generation: UInt64) async { await sessions.streamBroke(id, generation: generation) }

    /// CloseSession: REMOTE_LEAVE where the user has no other session; the stream ends.
    public func closeSession(_ sessionID: String) async throws(PresenceError) { try await sessions.close(sessionID) }

    /// Ends every session's stream (node shutdown); the sessions stay, to resume elsewhere.
    /// Returns once every stream it ended has let go of its outbox (its handler returned, so its
    /// end is on its way to the client), or after `timings.streamsEndWait`: ending a stream is
    /// asynchronous, and the goodbye that follows must not overtake it.
    public func endAllStreams() async {
        streamsEnded.store(true, ordering: .releasing)
        var ended: [SessionOutbox] = []
        for g in core.gateway.shards {
            for o in g.allOutboxes() {
                o.end(.shutdown)
                ended.append(o)
            }
        }
        let clock = core.clock
        let deadline = clock.monotonicNanoseconds() &+ settings.timings.streamsEndWait
        while ended.contains(where: \.hasStream) && clock.monotonicNanoseconds() < deadline {
            await clock.sleep(nanoseconds: Self.streamsEndPoll)
        }
    }

    /// How often `endAllStreams` looks whether the streams it ended have let go.
    static let streamsEndPoll: UInt64 = 5_000_000

    // MARK: Channels

    /// Runs a call for one of this gateway's sessions at an owner; an owner that knows the session
    /// was resumed on another gateway makes this gateway drop it (UNAVAILABLE SESSION_MOVED for the
    /// client: the call succeeds on the node its stream is on now).
    /// An owner that lost the session's membership (NOT_A_MEMBER) is given it back by an announce
    /// from this gateway, the authority on it, and the call is made once more.
    private func sessionCall<T>(_ id: SessionID, _ key: ChannelKey? = nil, _ body: () async throws(PresenceError) -> T) async throws(PresenceError) -> T {
        do throws(PresenceError) {
            do throws(PresenceError) {
                return try await body()
            } catch where error.name == "NOT_A_MEMBER" {
                guard let key, let s = core.gatewayShard(id).held(id) else { throw error }
                try await sessions.announce(s, key)
                return try await body()
            }
        } catch where error.name == "SESSION_MOVED" {
            sessions.superseded(id, by: error.supersededBy)
            throw GatewayShard.movedError(id, to: nil)
        } catch where error.name == "NOT_A_MEMBER" {
            throw PresenceError(.unavailable, "NOT_SERVING", "the channel's owner is catching up with this session; retry")
        }
    }

    public func join(_ sessionID: String, channel: String, type: ChannelType, withPresence: Bool) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        let g = core.gatewayShard(id)
        let j = try g.joined(id, channel: key, withPresence: withPresence)
        if !withPresence { core.gateway.subscriptions.unsubscribe(key, id) }
        // (the refs are made here, not from a copy of the session kept across the calls: that copy
        // would make the next change to the session's channels copy them whole)
        let (channelRef, homeRef): (ClusterSessionRef, ClusterSessionRef)
        do {
            guard let s = g.held(id) else { throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(id)") }
            var ref = core.ref(s, withPresence: withPresence, version: j.version)
            // (a fresh membership: every state write numbered so far belongs to an earlier one)
            if !j.already { ref.settled = s.writes }
            channelRef = ref
            homeRef = core.ref(s, version: j.version)
        }
        let r: ClusterChannelResult
        do {
            r = try await sessionCall(id) { () async throws(PresenceError) in
                try await router.channelCall(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .join,
                                                                     session: channelRef, items: j.pending))
            }
        } catch {
            // (undone here, the subscription too: the owner may have carried the join out and its
            // SNAPSHOT started one, which nothing else would end — the session's end and its move
            // to another gateway end only the channels it is in here)
            if !j.already {
                _ = try? g.left(id, channel: key)
                core.gateway.subscriptions.undone(key, id, now: core.clock.monotonicNanoseconds())
            }
            if withPresence && error.kind == .unavailable { core.gateway.subscriptions.owe(key, id) }
            throw error
        }
        g.stateAcknowledged(id, channel: key, state: r.state, version: r.stateVersion)
        if withPresence, let floor = core.gateway.subscriptions.takeOwed(key, id) {
            sessions.requestSnapshots([Subscriptions.Resnapshot(key: key, session: id, floor: floor)])
        }
        // the session's record at its home is what a resume on another node starts from: the join
        // is acknowledged only once it is there (a retry of the call repeats both, harmlessly)
        // (a home that knows a later epoch refuses it: the client resumed the session elsewhere,
        // from a record without this join, and must make it there)
        _ = try await sessionCall(id) { () async throws(PresenceError) in
            try await router.homeCall(j.user, .sessionJoined) { c in
                c.session = homeRef
                c.channel = ClusterSessionChannel(key, withPresence: withPresence)
            }
        }
    }

    public func leave(_ sessionID: String, channel: String, type: ChannelType) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        let g = core.gatewayShard(id)
        let (user, left) = try g.left(id, channel: key)
        // (not in the channel here: a retry of a leave whose acknowledgement failed, or a leave of
        // a channel never joined; both ends are told again, which changes nothing if they knew)
        let ref: ClusterSessionRef
        do {
            guard let s = g.held(id) else { return }
            ref = core.ref(s, version: left ?? s.version)
        }
        core.gateway.subscriptions.unsubscribe(key, id)
        let call = ClusterChannelCall(channelName: key.name, channelType: key.type, op: .leave, session: ref)
        do {
            let r = try await router.channelCall(key, call)
            core.gateway.subscriptions.left(key, id, atSequence: r.sequence, now: core.clock.monotonicNanoseconds())
        } catch {
            // the session has left here; its owner must hear of it later rather than keep a ghost
            sessions.retryLater { [router] () async throws(PresenceError) in _ = try await router.channelCall(key, call) }
            throw error
        }
        // acknowledged only once its home's record says so too (a resume elsewhere starts from it)
        _ = try await sessionCall(id) { () async throws(PresenceError) in
            try await router.homeCall(user, .sessionLeft) { c in
                c.session = ref
                c.channel = ClusterSessionChannel(key, withPresence: false)
            }
        }
    }

    public func setState(_ sessionID: String, channel: String, type: ChannelType, items: [StateItem]) async throws(PresenceError) {
        try await setStateStaged(sessionID, channel: channel, type: type, items: items).value
    }

    /// `setState`, done at once when it needs no wait (`Router.channelCallAtOnce`).
    public func setStateStaged(_ sessionID: String, channel: String, type: ChannelType, items: [StateItem]) throws(PresenceError) -> Staged<Void, PresenceError> {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        let items = try Validate.stateItems(items)
        let g = core.gatewayShard(id)
        guard let ref = try core.writeRef(g, id, text: sessionID, key) else {
            try g.setPendingState(id, channel: key, items: items)
            return .now(())
        }
        return try stateWrite(id, key, g, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .setState,
                                                         session: ref, items: items))
    }

    public func removeState(_ sessionID: String, channel: String, type: ChannelType, keys: [String]) async throws(PresenceError) {
        try await removeStateStaged(sessionID, channel: channel, type: type, keys: keys).value
    }

    /// `removeState`, done at once when it needs no wait (`Router.channelCallAtOnce`).
    public func removeStateStaged(_ sessionID: String, channel: String, type: ChannelType, keys: [String]) throws(PresenceError) -> Staged<Void, PresenceError> {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        for k in keys { try Validate.stateKey(k) }
        let g = core.gatewayShard(id)
        guard let ref = try core.writeRef(g, id, text: sessionID, key) else {
            g.removePendingState(id, channel: key, keys: keys)
            return .now(())
        }
        return try stateWrite(id, key, g, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .removeState,
                                                         session: ref, keys: keys))
    }

    /// A session's state write at its channel's owner (`channelStaged`), its answer noted at the
    /// gateway; its rest goes through `sessionCall`.
    /// The write is finished at the gateway (`GatewayShard.writeFinished`) however it ends: at
    /// once, on its shard's loop, or after the rest.
    private func stateWrite(_ id: SessionID, _ key: ChannelKey, _ g: GatewayShard, _ call: ClusterChannelCall) throws(PresenceError) -> Staged<Void, PresenceError> {
        let staged: Staged<Void, PresenceError>
        do throws(PresenceError) {
            staged = try channelStaged(key, call, session: id, context: (g, id, key)) { (c: (GatewayShard, SessionID, ChannelKey), r: ClusterChannelResult) in
                c.0.stateAcknowledged(c.1, channel: c.2, state: r.state, version: r.stateVersion)
            }
        } catch {
            g.writeFinished(id)
            throw error
        }
        return staged.finally { g.writeFinished(id) }
    }

    public func getState(channel: String, type: ChannelType, user: String) async throws(PresenceError) -> UserState {
        try await getStateStaged(channel: channel, type: type, user: user).value
    }

    /// `getState`, answered at once when the channel's shard runs on this thread (or handed to
    /// its loop when it runs on another of this node's).
    public func getStateStaged(channel: String, type: ChannelType, user: String) throws(PresenceError) -> Staged<UserState, PresenceError> {
        let key = try Validate.channel(channel, type)
        let user = try Validate.userID(user)
        return try channelStaged(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .getState, userID: user),
                                 context: (user, key)) { (c: (String, ChannelKey), r: ClusterChannelResult) throws(PresenceError) -> UserState in
            try Self.userState(r, c.0, c.1)
        }
    }

    /// A call at a channel's owner, made on this thread when the owner's shard runs here: when it
    /// needs nothing more (no copy to wait for, no refusal to act on) it is done; else the rest of
    /// the call goes on from that answer (through `sessionCall` for a `session`'s call). Handed to
    /// the shard's loop when it runs on another of this node's (`handOff`: once).
    ///
    /// `answer` turns the owner's result into the call's value with what it needs from the caller
    /// passed apart, as `context`, and callers give it as a closure that captures nothing: a call
    /// answered at once then allocates no closure context (one per call, found by
    /// `Scripts/count-allocs`); only a call that goes on later captures the two together.
    private func channelStaged<C: Sendable, T: Sendable>(_ key: ChannelKey, _ call: ClusterChannelCall, session: SessionID? = nil, handOff: Bool = true,
                                                         context: C,
                                                         _ answer: @escaping @Sendable (C, ClusterChannelResult) throws(PresenceError) -> T) throws(PresenceError) -> Staged<T, PresenceError> {
        var first: Router.LocalAnswer? = nil
        switch router.channelCallAtOnce(key, call) {
        case .answered(let a):
            if a.isFinal(core) { return .now(try answer(context, a.result)) }
            first = a
        case .onLoop(let loop) where handOff:
            return .onLoop(loop) { [self] () throws(PresenceError) in
                try channelStaged(key, call, session: session, handOff: false, context: context, answer)
            }
        case .onLoop, .elsewhere:
            break
        }
        return .later { [self, first] () async throws(PresenceError) in
            guard let session else { return try answer(context, try await router.channelCall(key, call, first: first)) }
            var first = first
            return try answer(context, try await sessionCall(session, key) { () async throws(PresenceError) in
                try await router.channelCall(key, call, first: first.take())
            })
        }
    }

    private static func userState(_ r: ClusterChannelResult, _ user: String, _ key: ChannelKey) throws(PresenceError) -> UserState {
        guard r.found else {
            throw PresenceError(.notFound, "PRESENCE_USER_NOT_EXIST", "user \(user) is not in channel \(key)")
        }
        return UserState(userID: user, states: r.state)
    }

    public func getOnlineUsers(_ r: GetOnlineUsersRequest) async throws(PresenceError) -> GetOnlineUsersResponse {
        let (key, call) = try listCall(r, encoded: false)
        let result = try await router.channelCall(key, call)
        if call.countOnly { return GetOnlineUsersResponse(totalOccupancy: result.total) }
        return Self.listingResponse(result)
    }

    /// GetOnlineUsers answered encoded (protobuf bytes of a `GetOnlineUsersResponse`): the channel's
    /// owner encodes the page, or gives the one it kept since the channel last changed, and this
    /// node passes it on as it is.
    public func getOnlineUsersEncoded(_ r: GetOnlineUsersRequest) async throws(PresenceError) -> [UInt8] {
        try await getOnlineUsersEncodedStaged(r).value
    }

    /// `getOnlineUsersEncoded`, answered at once when the channel's shard runs on this thread.
    public func getOnlineUsersEncodedStaged(_ r: GetOnlineUsersRequest) throws(PresenceError) -> Staged<[UInt8], PresenceError> {
        let (key, call) = try listCall(r, encoded: true)
        let countOnly = call.countOnly
        return try channelStaged(key, call, context: countOnly) { (countOnly: Bool, r: ClusterChannelResult) throws(PresenceError) -> [UInt8] in
            Self.encodedListing(r, countOnly: countOnly)
        }
    }

    private static func encodedListing(_ result: ClusterChannelResult, countOnly: Bool) -> [UInt8] {
        if countOnly { return GetOnlineUsersResponse(totalOccupancy: result.total).serializedBytes() }
        // (an owner that does not encode pages answers with the users)
        if result.listing.isEmpty && (result.total != 0 || !result.users.isEmpty) { return listingResponse(result).serializedBytes() }
        return result.listing
    }

    private func listCall(_ r: GetOnlineUsersRequest, encoded: Bool) throws(PresenceError) -> (ChannelKey, ClusterChannelCall) {
        let key = try Validate.channel(r.channelName, r.channelType)
        let includeUserID = r.includeUserID ?? true
        if r.includeState && !includeUserID {
            throw PresenceError(.invalidArgument, "INVALID_INCLUDE_FLAGS", "include_state needs include_user_id (state is listed per user)")
        }
        let after = r.page.isEmpty ? nil : try PageBookmark.parse(r.page)
        return (key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .list, after: after ?? "",
                                        includeState: r.includeState, countOnly: !includeUserID, encoded: encoded))
    }

    private static func listingResponse(_ result: ClusterChannelResult) -> GetOnlineUsersResponse {
        GetOnlineUsersResponse(totalOccupancy: result.total, users: result.users,
                               nextPage: result.next.isEmpty ? "" : PageBookmark.make(after: result.next))
    }

    public func getUserChannels(_ user: String) async throws(PresenceError) -> GetUserChannelsResponse {
        let user = try Validate.userID(user)
        let r = try await router.homeCall(user, .channels)
        let channels = r.channels.compactMap(\.key)
        return GetUserChannelsResponse(channels: channels.map(\.info), totalChannel: UInt32(channels.count))
    }

    // MARK: Status

    public func setStatus(_ sessionID: String, status: UserStatus) async throws(PresenceError) {
        let id = try Validate.sessionID(sessionID)
        switch status {
        case .online, .away, .busy, .offline: break
        case .unknown, .unrecognized:
            throw PresenceError(.invalidArgument, "INVALID_STATUS", "status must be ONLINE, AWAY, BUSY or OFFLINE")
        }
        // (numbered: a first attempt that arrives late, behind the next SetStatus, changes nothing)
        let (s, write) = try core.gatewayShard(id).numberedCall(id)
        _ = try await sessionCall(id) { () async throws(PresenceError) in
            try await router.homeCall(s.userID, .setStatus) { c in
                c.status = status
                c.session = core.ref(s, write: write)
            }
        }
    }

    public func getUserStatuses(_ users: [String]) async throws(PresenceError) -> [UserStatusEntry] {
        let users = try Validate.userList(users, field: "user_ids")
        var found: [String: UserStatus] = [:]
        for us in router.byHome(users) {
            for e in try await router.homeCall(ClusterHomeCall(userIDs: us, op: .statuses)).statuses { found[e.userID] = e.status }
        }
        return users.map { UserStatusEntry(userID: $0, status: found[$0] ?? .unknown) }
    }

    public func watch(_ sessionID: String, add: [String], remove: [String]) async throws(PresenceError) -> [UserStatusEntry] {
        let id = try Validate.sessionID(sessionID)
        let add = try Validate.userList(add, field: "user_ids")
        let remove = try Validate.userList(remove, field: "unwatch_user_ids")
        let g = core.gatewayShard(id)
        let (_, _, added) = try g.watch(id, add: add, remove: remove)
        // (the list and its number together: a later number always goes with a later list)
        let (s, write) = try g.numberedCall(id)
        // (the unwatches go out beside the watches, not before them: other users' homes, each
        // independent, and a gateway cut off from them answers at the first failure, not after
        // one for each)
        let unwatched = remove.filter { !added.contains($0) }
        async let unwatches: Void = sessions.unwatch(unwatched, by: s, write: write)
        // (events the stream is sent while this call is in flight are newer than the homes' answers)
        g.openWatchWindow(id)
        let homes: [String: UserStatus]
        do { homes = try await watchAtHomes(added, by: s, write: write) } catch {
            _ = g.closeWatchWindow(id)
            await unwatches
            throw error
        }
        await unwatches
        return WatchWindow.answer(added, homes: homes, delivered: g.closeWatchWindow(id))
    }

    /// Registers the session as a watcher of `added` at their homes (their current statuses are
    /// the answer), then records its new list at its own home (a resume elsewhere starts from it).
    private func watchAtHomes(_ added: [String], by s: SessionTable.Session, write: UInt32) async throws(PresenceError) -> [String: UserStatus] {
        var statuses: [String: UserStatus] = [:]
        for us in router.byHome(added) {
            // (numbered as the list: an unwatch of an earlier call does not remove it in a merge)
            let r = try await router.homeCall(ClusterHomeCall(userIDs: us, op: .watch, session: core.ref(s, write: write)))
            for e in r.statuses { statuses[e.userID] = e.status }
            // (the answer is news as of these versions: a status event read earlier is older)
            if r.statusVersions.count == r.statuses.count, let outbox = core.gatewayShard(s.id).outbox(s.id) {
                for (e, v) in zip(r.statuses, r.statusVersions) { outbox.noteStatusGiven(e.userID, version: v) }
            }
        }
        _ = try await sessionCall(s.id) { () async throws(PresenceError) in
            try await router.homeCall(s.userID, .sessionWatching) { c in
                c.session = core.ref(s, write: write)
                c.watching = s.watching.sorted()
            }
        }
        return statuses
    }

    /// The user a session belongs to (for permission checks).
    public func owner(ofSession sessionID: String) -> String? {
        guard let id = SessionID(text: sessionID) else { return nil }
        return core.gatewayShard(id).held(id)?.userID
    }

    /// Sessions on this node (for metrics and tests).
    public func sessionCount() async -> Int {
        core.gateway.sessionCount
    }

    /// Sessions with a live stream, and sessions waiting to resume (for metrics).
    public func sessionCountsByLiveness() -> (connected: Int, disconnected: Int) {
        core.gateway.sessionCountsByLiveness
    }

    /// User homes this node owns, and replica copies of homes it holds (for metrics).
    public func homeCounts() async -> (owned: Int, copies: Int) {
        var owned = 0, copies = 0
        for s in core.userHomes {
            let c = await s.counts
            owned += c.owned
            copies += c.copies
        }
        return (owned, copies)
    }

    /// What the sessions' outboxes did with events: queued, dropped, streams cut off as too slow.
    public var deliveries: (queued: Int, dropped: Int, slowConsumers: Int) { core.gateway.deliveries }

    /// Anti-entropy rounds run and repairs they made (for metrics).
    public var antiEntropyCounts: (rounds: Int, repairs: Int) {
        (antiEntropy.rounds.load(ordering: .relaxed), antiEntropy.repairs.load(ordering: .relaxed))
    }

    /// Memberships (a user in a channel) in the channels this node owns.
    public func membershipCount() async -> Int {
        var n = 0
        for s in core.channelShards { n += await s.membershipCount }
        return n
    }

    /// Channels this node owns, and replica copies it holds (for tests and admin).
    public func channelCounts() async -> (owned: Int, copies: Int) {
        var owned = 0, copies = 0
        for s in core.channelShards {
            owned += await s.channelCount
            copies += await s.copyCount
        }
        return (owned, copies)
    }
}
