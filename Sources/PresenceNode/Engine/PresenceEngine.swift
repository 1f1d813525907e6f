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
    /// Shard actors per role.
    public var shards = 32
    /// How long a gateway keeps retrying a call whose owner is moving or unreachable before it
    /// answers UNAVAILABLE.
    public var routingRetryNanoseconds: UInt64 = 2_000_000_000

    public init(nodeID: String, presenceTimeout: Double, maxInstantEvents: Int, presenceInterval: Double) {
        self.nodeID = nodeID
        self.presenceTimeoutNanoseconds = UInt64(presenceTimeout * 1e9)
        self.maxInstantEvents = maxInstantEvents
        self.presenceIntervalNanoseconds = UInt64(presenceInterval * 1e9)
    }
}

/// Every presence call of API.md on this node, in the three roles of ARCHITECTURE.md: gateway
/// (the sessions connected here), channel owner and user home (for the keys the ring gives this
/// node). A call is routed to the owner of what it touches: a shard actor here, or the owning
/// node over the peer link. While ownership moves the call is retried briefly, then answered
/// UNAVAILABLE (retryable); it is never answered from state this node does not own.
public final class PresenceEngine: Sendable {
    public let settings: EngineSettings
    let clock: EngineClock
    let topology: Topology
    let link: PeerLink?
    let gateway: LocalGateway
    let channelShards: [ChannelShard]
    let userHomes: [UserHomeShard]
    /// The ring before the current burst of ring changes, until its settling re-announce has run.
    let settleBase = Mutex<HashRing?>(nil)
    private var me: String { settings.nodeID }

    /// The shard actors run on `loops`, spread evenly (shard i on loop i mod count). Without a
    /// `link` the engine is a cluster of one.
    public init(settings: EngineSettings, loops: [EventLoop], clock: EngineClock = SystemClock(),
                topology: Topology? = nil, link: PeerLink? = nil) {
        precondition(!loops.isEmpty, "the engine needs at least one event loop")
        self.settings = settings
        self.clock = clock
        let topology = topology ?? Topology(me: settings.nodeID, replicationFactor: 1)
        self.topology = topology
        self.link = link
        let n = max(1, settings.shards)
        let gateway = LocalGateway(shards: n, resumeWindow: settings.presenceTimeoutNanoseconds, clock: clock)
        self.gateway = gateway
        let fabric = Fabric(topology: topology, link: link, gateway: gateway)
        channelShards = (0..<n).map { i in
            ChannelShard(maxInstantEvents: settings.maxInstantEvents, intervalNanoseconds: settings.presenceIntervalNanoseconds,
                         presenceTimeout: settings.presenceTimeoutNanoseconds, clock: clock, fabric: fabric, loop: loops[i % loops.count])
        }
        userHomes = (0..<n).map { i in
            UserHomeShard(clock: clock, presenceTimeout: settings.presenceTimeoutNanoseconds, fabric: fabric, loop: loops[i % loops.count])
        }
    }

    private func gatewayShard(_ id: SessionID) -> GatewayShard { gateway.shard(id) }
    func channelShard(_ key: ChannelKey) -> ChannelShard { channelShards[Int(StableHash.of(key) % UInt64(channelShards.count))] }
    func homeShard(_ user: String) -> UserHomeShard { userHomes[Int(StableHash.of(user) % UInt64(userHomes.count))] }

    func ref(_ id: SessionID, _ user: String, withPresence: Bool = false) -> ClusterSessionRef {
        ClusterSessionRef(sessionID: id.description, userID: user, gateway: me, withPresence: withPresence)
    }

    // MARK: Routing

    /// Runs a call at the channel's owner: here, or over the peer link; retried while ownership moves.
    func channelCall(_ key: ChannelKey, _ call: ClusterChannelCall) async throws(PresenceError) -> ClusterChannelResult {
        try await retrying { () async throws(PresenceError) in
            let (owner, fingerprint) = topology.route(key)
            if owner == me { return try await localChannel(key, call) }
            guard let link else { throw PresenceError(.unavailable, "NODE_UNAVAILABLE", "no peer link to \(owner)") }
            var call = call
            call.ringFingerprint = fingerprint
            return try await link.channel(owner, call)
        }
    }

    /// Runs a call at the users' home (all of `call.userIDs`, at least one, share it).
    func homeCall(_ call: ClusterHomeCall) async throws(PresenceError) -> ClusterHomeResult {
        try await retrying { () async throws(PresenceError) in
            let (home, fingerprint) = topology.route(user: call.userIDs.first ?? "")
            if home == me { return try await localHome(call) }
            guard let link else { throw PresenceError(.unavailable, "NODE_UNAVAILABLE", "no peer link to \(home)") }
            var call = call
            call.ringFingerprint = fingerprint
            return try await link.home(home, call)
        }
    }

    private func homeCall(_ user: String, _ op: ClusterHomeOp, _ fill: (inout ClusterHomeCall) -> Void = { _ in }) async throws(PresenceError) -> ClusterHomeResult {
        var call = ClusterHomeCall(userIDs: [user], op: op)
        fill(&call)
        return try await homeCall(call)
    }

    private func retrying<T>(_ body: () async throws(PresenceError) -> T) async throws(PresenceError) -> T {
        let deadline = clock.monotonicNanoseconds() + settings.routingRetryNanoseconds
        var pause: UInt64 = 10_000_000
        while true {
            do {
                return try await body()
            } catch where error.kind == .unavailable && clock.monotonicNanoseconds() + pause < deadline {
                try? await Task.sleep(nanoseconds: pause)
                pause = min(pause * 2, 200_000_000)
            }
        }
    }

    /// How long a change waits for its replica copies before it is answered anyway (a replica
    /// that does not acknowledge by then is stuck, and about to be declared dead).
    static let replicationWait: UInt64 = 1_000_000_000

    /// A channel call this node must answer as the owner (or refuse while it may not).
    func localChannel(_ key: ChannelKey, _ call: ClusterChannelCall) async throws(PresenceError) -> ClusterChannelResult {
        if let why = topology.notServing(keyHash: StableHash.of(key)) {
            throw PresenceError(.unavailable, "NOT_SERVING", why)
        }
        let (r, tickets) = await channelShard(key).handle(call, key: key)
        if !tickets.isEmpty, let link { await link.waitSent(tickets, timeout: Self.replicationWait) }
        if let e = r.error { throw PresenceError(wire: e) }
        return r
    }

    /// A home call this node must answer as the users' home; users are split over shards.
    func localHome(_ call: ClusterHomeCall) async throws(PresenceError) -> ClusterHomeResult {
        if let u = call.userIDs.first, let why = topology.notServing(keyHash: HashRing.hash(ofUser: u)) {
            throw PresenceError(.unavailable, "NOT_SERVING", why)
        }
        var groups: [Int: [String]] = [:]
        for u in call.userIDs { groups[Int(StableHash.of(u) % UInt64(userHomes.count)), default: []].append(u) }
        var merged = ClusterHomeResult()
        for (i, users) in groups.sorted(by: { $0.key < $1.key }) {
            var part = call
            part.userIDs = users
            let (r, tickets) = await userHomes[i].handle(part, users: users)
            if !tickets.isEmpty, let link { await link.waitSent(tickets, timeout: Self.replicationWait) }
            if let e = r.error { throw PresenceError(wire: e) }
            merged.channels += r.channels
            merged.statuses += r.statuses
            if r.found { merged.found = true; merged.session = r.session }
        }
        return merged
    }

    /// Users grouped by their home node (one home call per group).
    private func byHome(_ users: [String]) -> [[String]] {
        var groups: [String: [String]] = [:]
        for u in users { groups[topology.home(of: u), default: []].append(u) }
        return groups.sorted { $0.key < $1.key }.map(\.value)
    }

    /// Tries `body` again every `pause` ns while it fails as unavailable, up to `attempts` times, in
    /// the background: for what must reach an owner eventually (a session's end, an announce).
    func retryInBackground(attempts: Int, pause: UInt64, _ body: @escaping @Sendable () async throws(PresenceError) -> Void) {
        Task {
            for _ in 0..<attempts {
                do throws(PresenceError) {
                    try await body()
                    return
                } catch {
                    guard error.kind == .unavailable else { return }
                    try? await Task.sleep(nanoseconds: pause)
                }
            }
        }
    }

    // MARK: Announces (this node is a session's gateway)

    func announceCall(_ s: SessionTable.Session, _ key: ChannelKey, withPresence: Bool) -> ClusterChannelCall {
        ClusterChannelCall(channelName: key.name, channelType: key.type, op: .announce, session: ref(s.id, s.userID, withPresence: withPresence))
    }

    /// The session's whole record, for its user's home.
    func homeAnnounceCall(_ s: SessionTable.Session, status: UserStatus = .unknown) -> ClusterHomeCall {
        ClusterHomeCall(userIDs: [s.userID], op: .sessionOpened, session: ref(s.id, s.userID), status: status, announce: true,
                        channels: s.channels.sorted { $0.key < $1.key }.map { ClusterSessionChannel($0.key, withPresence: $0.value) },
                        watching: s.watching.sorted())
    }

    func watchCall(_ s: SessionTable.Session, _ users: [String]) -> ClusterHomeCall {
        ClusterHomeCall(userIDs: users, op: .watch, session: ref(s.id, s.userID))
    }

    // MARK: Sessions

    /// A session as opened for a stream.
    public struct OpenedSession: Sendable {
        public let id: SessionID
        public let generation: UInt64
        public let resumed: Bool
        public let outbox: SessionOutbox
    }

    /// Opens (or resumes) a session for `user`; the caller sends `opened`, then attaches its stream.
    /// A session of another gateway (its node died, or the client moved) is resumed from the
    /// record its user's home keeps: it keeps its channels, state and watches, with no event.
    public func openSession(user: String, resume: String, initialStatus: UserStatus) async throws(PresenceError) -> OpenedSession {
        let user = try Validate.userID(user)
        switch initialStatus {
        case .unknown, .online, .away, .busy, .offline: break
        case .unrecognized(let v): throw PresenceError(.invalidArgument, "INVALID_STATUS", "initial_status \(v) is not a UserStatus")
        }
        if !resume.isEmpty, let id = SessionID(text: resume) {
            if let o = gatewayShard(id).resume(id, user: user) {
                if initialStatus != .unknown { _ = try await homeCall(user, .setStatus) { $0.status = initialStatus } }
                // the client may have been on another node meanwhile: make this one its gateway again
                if !topology.isAlone, let (s, _) = try? gatewayShard(id).session(id) {
                    try await announce(s, initialStatus: .unknown)
                }
                return OpenedSession(id: o.id, generation: o.generation, resumed: true, outbox: o.outbox)
            }
            if let adopted = try await adopt(id, user: user, initialStatus: initialStatus) { return adopted }
        }
        let id = SessionID.random()
        let o = gatewayShard(id).create(id, user: user)
        do {
            _ = try await homeCall(user, .sessionOpened) { c in
                c.session = ref(id, user)
                c.status = initialStatus
            }
        } catch {
            _ = gatewayShard(id).close(id)
            throw error
        }
        return OpenedSession(id: o.id, generation: o.generation, resumed: false, outbox: o.outbox)
    }

    /// Takes over a session another gateway held, if the user's home knows it.
    private func adopt(_ id: SessionID, user: String, initialStatus: UserStatus) async throws(PresenceError) -> OpenedSession? {
        guard !topology.isAlone else { return nil }
        let found = try await homeCall(user, .lookupSession) { $0.session = ref(id, user) }
        // (a record naming this node comes from before a restart: it is adopted like any other)
        guard found.found, let record = found.session else { return nil }
        let r = ClusterHomeSession.record(record)
        let o = gatewayShard(id).adopt(id, user: user, channels: r.channels, watching: Set(r.watching))
        guard let (s, _) = try? gatewayShard(id).session(id) else { return nil }
        try await announce(s, initialStatus: initialStatus)
        return OpenedSession(id: o.id, generation: o.generation, resumed: true, outbox: o.outbox)
    }

    /// Tells the session's user home, its channels' owners and its watched users' homes that this
    /// node is now the session's gateway (no event for anyone; SNAPSHOTs for the session).
    private func announce(_ s: SessionTable.Session, initialStatus: UserStatus) async throws(PresenceError) {
        _ = try await homeCall(homeAnnounceCall(s, status: initialStatus))
        for (key, withPresence) in s.channels.sorted(by: { $0.key < $1.key }) {
            _ = try? await channelCall(key, announceCall(s, key, withPresence: withPresence))
        }
        for users in byHome(s.watching.sorted()) { _ = try? await homeCall(watchCall(s, users)) }
    }

    /// After a resume that lost events: a fresh SNAPSHOT of every channel the session follows.
    public func resnapshot(_ id: SessionID) async {
        guard let (s, _) = try? gatewayShard(id).session(id) else { return }
        for (key, withPresence) in s.channels where withPresence {
            _ = try? await channelCall(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .resnapshot,
                                                               session: ref(id, s.userID, withPresence: true)))
        }
    }

    /// The session's stream of `generation` broke: start its resume window; time it out after.
    public func streamBroke(_ id: SessionID, generation: UInt64) async {
        guard let deadline = gatewayShard(id).disconnect(id, generation: generation) else { return }
        let now = clock.monotonicNanoseconds()
        let wait = deadline > now ? deadline - now : 0
        Task { [self] in
            try? await Task.sleep(nanoseconds: wait + 1_000_000)
            await expire(id)
        }
    }

    /// Times the session out if its window has passed (and it was not resumed meanwhile).
    func expire(_ id: SessionID) async {
        guard let s = gatewayShard(id).expireIfDue(id) else { return }
        await endSession(s, timedOut: true)
    }

    /// CloseSession: REMOTE_LEAVE where the user has no other session; the stream ends.
    public func closeSession(_ sessionID: String) async throws(PresenceError) {
        let id = try Validate.sessionID(sessionID)
        guard let (s, outbox) = gatewayShard(id).close(id) else {
            throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(sessionID)")
        }
        await endSession(s, timedOut: false)
        outbox.end(.closed)
    }

    private func endSession(_ s: SessionTable.Session, timedOut: Bool) async {
        for key in s.channels.keys.sorted() {
            gateway.subscriptions.unsubscribe(key, s.id)
            let call = ClusterChannelCall(channelName: key.name, channelType: key.type, op: .leave, session: ref(s.id, s.userID), timedOut: timedOut)
            if (try? await channelCall(key, call)) == nil { endLater { () async throws(PresenceError) in _ = try await self.channelCall(key, call) } }
        }
        let ended = ClusterHomeCall(userIDs: [s.userID], op: .sessionEnded, session: ref(s.id, s.userID))
        if (try? await homeCall(ended)) == nil { endLater { () async throws(PresenceError) in _ = try await self.homeCall(ended) } }
        await unwatch(Array(s.watching), by: s.id, user: s.userID)
    }

    /// A session's end must reach its owners even if they were unreachable for the whole retry
    /// window (else a live node would keep a ghost): try again every few seconds, for a while.
    private func endLater(_ body: @escaping @Sendable () async throws(PresenceError) -> Void) {
        retryInBackground(attempts: 10, pause: 3_000_000_000, body)
    }

    private func unwatch(_ users: [String], by id: SessionID, user: String) async {
        for us in byHome(users) {
            _ = try? await homeCall(ClusterHomeCall(userIDs: us, op: .unwatch, session: ref(id, user)))
        }
    }

    /// Ends every session's stream (node shutdown); the sessions stay, to resume elsewhere.
    public func endAllStreams() async {
        for g in gateway.shards {
            for o in g.allOutboxes() { o.end(.shutdown) }
        }
    }

    // MARK: Channels

    public func join(_ sessionID: String, channel: String, type: ChannelType, withPresence: Bool) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        let j = try gatewayShard(id).joined(id, channel: key, withPresence: withPresence)
        if !withPresence { gateway.subscriptions.unsubscribe(key, id) }
        do {
            _ = try await channelCall(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .join,
                                                              session: ref(id, j.user, withPresence: withPresence), items: j.pending))
        } catch {
            if !j.already { _ = try? gatewayShard(id).left(id, channel: key) }
            throw error
        }
        _ = try? await homeCall(j.user, .sessionJoined) { c in
            c.session = ref(id, j.user)
            c.channel = ClusterSessionChannel(key, withPresence: withPresence)
        }
    }

    public func leave(_ sessionID: String, channel: String, type: ChannelType) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        let (user, wasIn) = try gatewayShard(id).left(id, channel: key)
        guard wasIn else { return }
        gateway.subscriptions.unsubscribe(key, id)
        let call = ClusterChannelCall(channelName: key.name, channelType: key.type, op: .leave, session: ref(id, user))
        do {
            _ = try await channelCall(key, call)
        } catch {
            // the session has left here; its owner must hear of it later rather than keep a ghost
            endLater { () async throws(PresenceError) in _ = try await self.channelCall(key, call) }
            throw error
        }
        _ = try? await homeCall(user, .sessionLeft) { c in
            c.session = ref(id, user)
            c.channel = ClusterSessionChannel(key, withPresence: false)
        }
    }

    public func setState(_ sessionID: String, channel: String, type: ChannelType, items: [StateItem]) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        let items = try Validate.stateItems(items)
        let (s, _) = try gatewayShard(id).session(id)
        if s.channels[key] != nil {
            _ = try await channelCall(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .setState,
                                                              session: ref(id, s.userID), items: items))
        } else {
            try gatewayShard(id).setPendingState(id, channel: key, items: items)
        }
    }

    public func removeState(_ sessionID: String, channel: String, type: ChannelType, keys: [String]) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        for k in keys { try Validate.stateKey(k) }
        let (s, _) = try gatewayShard(id).session(id)
        if s.channels[key] != nil {
            _ = try await channelCall(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .removeState,
                                                              session: ref(id, s.userID), keys: keys))
        } else {
            gatewayShard(id).removePendingState(id, channel: key, keys: keys)
        }
    }

    public func getState(channel: String, type: ChannelType, user: String) async throws(PresenceError) -> UserState {
        let key = try Validate.channel(channel, type)
        let user = try Validate.userID(user)
        let r = try await channelCall(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .getState, userID: user))
        guard r.found else {
            throw PresenceError(.notFound, "PRESENCE_USER_NOT_EXIST", "user \(user) is not in channel \(key)")
        }
        return UserState(userID: user, states: r.state)
    }

    public func getOnlineUsers(_ r: GetOnlineUsersRequest) async throws(PresenceError) -> GetOnlineUsersResponse {
        let key = try Validate.channel(r.channelName, r.channelType)
        let includeUserID = r.includeUserID ?? true
        if r.includeState && !includeUserID {
            throw PresenceError(.invalidArgument, "INVALID_INCLUDE_FLAGS", "include_state needs include_user_id (state is listed per user)")
        }
        let after = r.page.isEmpty ? nil : try PageBookmark.parse(r.page)
        let result = try await channelCall(key, ClusterChannelCall(channelName: key.name, channelType: key.type, op: .list,
                                                                   after: after ?? "", includeState: r.includeState, countOnly: !includeUserID))
        if !includeUserID { return GetOnlineUsersResponse(totalOccupancy: result.total) }
        return GetOnlineUsersResponse(totalOccupancy: result.total, users: result.users,
                                      nextPage: result.next.isEmpty ? "" : PageBookmark.make(after: result.next))
    }

    public func getUserChannels(_ user: String) async throws(PresenceError) -> GetUserChannelsResponse {
        let user = try Validate.userID(user)
        let r = try await homeCall(user, .channels)
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
        let (s, _) = try gatewayShard(id).session(id)
        _ = try await homeCall(s.userID, .setStatus) { $0.status = status }
    }

    public func getUserStatuses(_ users: [String]) async throws(PresenceError) -> [UserStatusEntry] {
        let users = try Validate.userList(users, field: "user_ids")
        var found: [String: UserStatus] = [:]
        for us in byHome(users) {
            for e in try await homeCall(ClusterHomeCall(userIDs: us, op: .statuses)).statuses { found[e.userID] = e.status }
        }
        return users.map { UserStatusEntry(userID: $0, status: found[$0] ?? .unknown) }
    }

    public func watch(_ sessionID: String, add: [String], remove: [String]) async throws(PresenceError) -> [UserStatusEntry] {
        let id = try Validate.sessionID(sessionID)
        let add = try Validate.userList(add, field: "user_ids")
        let remove = try Validate.userList(remove, field: "unwatch_user_ids")
        let (user, _, added) = try gatewayShard(id).watch(id, add: add, remove: remove)
        await unwatch(remove.filter { !added.contains($0) }, by: id, user: user)
        var statuses: [String: UserStatus] = [:]
        for us in byHome(added) {
            let r = try await homeCall(ClusterHomeCall(userIDs: us, op: .watch, session: ref(id, user)))
            for e in r.statuses { statuses[e.userID] = e.status }
        }
        if let (s, _) = try? gatewayShard(id).session(id) {
            _ = try? await homeCall(user, .sessionWatching) { c in
                c.session = ref(id, user)
                c.watching = s.watching.sorted()
            }
        }
        return added.map { UserStatusEntry(userID: $0, status: statuses[$0] ?? .unknown) }
    }

    /// The user a session belongs to (for permission checks).
    public func owner(ofSession sessionID: String) async -> String? {
        guard let id = SessionID(text: sessionID), let (s, _) = try? gatewayShard(id).session(id) else { return nil }
        return s.userID
    }

    /// Sessions on this node (for metrics and tests).
    public func sessionCount() async -> Int {
        var n = 0
        for g in gateway.shards { n += g.count }
        return n
    }

    /// Channels this node owns, and replica copies it holds (for tests and admin).
    public func channelCounts() async -> (owned: Int, copies: Int) {
        var owned = 0, copies = 0
        for s in channelShards {
            owned += await s.channelCount
            copies += await s.copyCount
        }
        return (owned, copies)
    }
}
