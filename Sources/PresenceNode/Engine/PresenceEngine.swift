import EventLoop
import PresenceCore
import PresenceWire

/// Settings of the presence engine.
public struct EngineSettings: Sendable {
    public var nodeID: String
    public var presenceTimeoutNanoseconds: UInt64
    public var maxInstantEvents: Int
    public var presenceIntervalNanoseconds: UInt64
    /// Shard actors per role.
    public var shards = 32

    public init(nodeID: String, presenceTimeout: Double, maxInstantEvents: Int, presenceInterval: Double) {
        self.nodeID = nodeID
        self.presenceTimeoutNanoseconds = UInt64(presenceTimeout * 1e9)
        self.maxInstantEvents = maxInstantEvents
        self.presenceIntervalNanoseconds = UInt64(presenceInterval * 1e9)
    }
}

/// Every presence call of API.md on this node. Each call is routed to the shard actor that owns
/// what it touches, in the three roles of ARCHITECTURE.md: gateway (sessions), channel owner
/// (channels), user home (users). On one node every role is local; the cluster puts a router here.
public final class PresenceEngine: Sendable {
    public let settings: EngineSettings
    let clock: EngineClock
    private let gateways: [GatewayShard]
    private let channelShards: [ChannelShard]
    private let userHomes: [UserHomeShard]

    /// The shard actors run on `loops`, spread evenly (shard i on loop i mod count).
    public init(settings: EngineSettings, loops: [EventLoop], clock: EngineClock = SystemClock()) {
        precondition(!loops.isEmpty, "the engine needs at least one event loop")
        self.settings = settings
        self.clock = clock
        let n = max(1, settings.shards)
        gateways = (0..<n).map { _ in GatewayShard(resumeWindow: settings.presenceTimeoutNanoseconds, clock: clock) }
        channelShards = (0..<n).map { i in
            ChannelShard(maxInstantEvents: settings.maxInstantEvents, intervalNanoseconds: settings.presenceIntervalNanoseconds,
                         clock: clock, loop: loops[i % loops.count])
        }
        userHomes = (0..<n).map { i in UserHomeShard(clock: clock, loop: loops[i % loops.count]) }
    }

    private func gateway(_ id: SessionID) -> GatewayShard { gateways[Int(id.raw % UInt64(gateways.count))] }
    private func owner(_ key: ChannelKey) -> ChannelShard { channelShards[Int(StableHash.of(key) % UInt64(channelShards.count))] }
    private func homeIndex(_ user: String) -> Int { Int(StableHash.of(user) % UInt64(userHomes.count)) }
    private func home(_ user: String) -> UserHomeShard { userHomes[homeIndex(user)] }

    /// Users grouped by the user-home shard that owns them, one hop per shard.
    private func byHome(_ users: [String]) -> [(UserHomeShard, [String])] {
        var groups: [Int: [String]] = [:]
        for u in users { groups[homeIndex(u), default: []].append(u) }
        return groups.map { (userHomes[$0.key], $0.value) }
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
    public func openSession(user: String, resume: String, initialStatus: UserStatus) async throws(PresenceError) -> OpenedSession {
        let user = try Validate.userID(user)
        switch initialStatus {
        case .unknown, .online, .away, .busy, .offline: break
        case .unrecognized(let v): throw PresenceError(.invalidArgument, "INVALID_STATUS", "initial_status \(v) is not a UserStatus")
        }
        if !resume.isEmpty, let id = SessionID(text: resume), let o = gateway(id).resume(id, user: user) {
            if initialStatus != .unknown { await home(user).setStatus(user, initialStatus) }
            return OpenedSession(id: o.id, generation: o.generation, resumed: true, outbox: o.outbox)
        }
        let id = SessionID.random()
        let o = gateway(id).create(id, user: user)
        await home(user).sessionOpened(user, session: id, initial: initialStatus)
        return OpenedSession(id: o.id, generation: o.generation, resumed: false, outbox: o.outbox)
    }

    /// After a resume that lost events: a fresh SNAPSHOT of every channel the session follows.
    public func resnapshot(_ id: SessionID) async {
        guard let (s, _) = try? gateway(id).session(id) else { return }
        for (key, withPresence) in s.channels where withPresence {
            await owner(key).resnapshot(key, session: id)
        }
    }

    /// The session's stream of `generation` broke: start its resume window; time it out after.
    public func streamBroke(_ id: SessionID, generation: UInt64) async {
        guard let deadline = gateway(id).disconnect(id, generation: generation) else { return }
        let now = clock.monotonicNanoseconds()
        let wait = deadline > now ? deadline - now : 0
        Task { [self] in
            try? await Task.sleep(nanoseconds: wait + 1_000_000)
            await expire(id)
        }
    }

    /// Times the session out if its window has passed (and it was not resumed meanwhile).
    func expire(_ id: SessionID) async {
        guard let s = gateway(id).expireIfDue(id) else { return }
        await endSession(s, timedOut: true)
    }

    /// CloseSession: REMOTE_LEAVE where the user has no other session; the stream ends.
    public func closeSession(_ sessionID: String) async throws(PresenceError) {
        let id = try Validate.sessionID(sessionID)
        guard let (s, outbox) = gateway(id).close(id) else {
            throw PresenceError(.notFound, "SESSION_NOT_FOUND", "no session \(sessionID)")
        }
        await endSession(s, timedOut: false)
        outbox.end(.closed)
    }

    private func endSession(_ s: SessionTable.Session, timedOut: Bool) async {
        for key in s.channels.keys.sorted() {
            if await owner(key).leave(key, user: s.userID, session: s.id, timedOut: timedOut) {
                await home(s.userID).removeChannel(s.userID, key)
            }
        }
        await home(s.userID).sessionEnded(s.userID, session: s.id)
        await unwatch(Array(s.watching), by: s.id)
    }

    private func unwatch(_ users: [String], by id: SessionID) async {
        for (shard, us) in byHome(users) { await shard.unwatch(us, by: id) }
    }

    /// Ends every session's stream (node shutdown); the sessions stay, to resume elsewhere.
    public func endAllStreams() async {
        for g in gateways {
            for o in g.allOutboxes() { o.end(.shutdown) }
        }
    }

    // MARK: Channels

    public func join(_ sessionID: String, channel: String, type: ChannelType, withPresence: Bool) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        let j = try gateway(id).joined(id, channel: key, withPresence: withPresence)
        await owner(key).join(key, user: j.user, session: id, withPresence: withPresence, outbox: j.outbox, pending: j.pending)
        if !j.already { await home(j.user).addChannel(j.user, key) }
    }

    public func leave(_ sessionID: String, channel: String, type: ChannelType) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        let (user, wasIn) = try gateway(id).left(id, channel: key)
        guard wasIn else { return }
        if await owner(key).leave(key, user: user, session: id, timedOut: false) {
            await home(user).removeChannel(user, key)
        }
    }

    public func setState(_ sessionID: String, channel: String, type: ChannelType, items: [StateItem]) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        let items = try Validate.stateItems(items)
        let (s, _) = try gateway(id).session(id)
        if s.channels[key] != nil {
            try await owner(key).setState(key, user: s.userID, session: id, items: items)
        } else {
            try gateway(id).setPendingState(id, channel: key, items: items)
        }
    }

    public func removeState(_ sessionID: String, channel: String, type: ChannelType, keys: [String]) async throws(PresenceError) {
        let key = try Validate.channel(channel, type)
        let id = try Validate.sessionID(sessionID)
        for k in keys { try Validate.stateKey(k) }
        let (s, _) = try gateway(id).session(id)
        if s.channels[key] != nil {
            await owner(key).removeState(key, user: s.userID, session: id, keys: keys)
        } else {
            gateway(id).removePendingState(id, channel: key, keys: keys)
        }
    }

    public func getState(channel: String, type: ChannelType, user: String) async throws(PresenceError) -> UserState {
        let key = try Validate.channel(channel, type)
        let user = try Validate.userID(user)
        guard let items = await owner(key).state(key, user: user) else {
            throw PresenceError(.notFound, "PRESENCE_USER_NOT_EXIST", "user \(user) is not in channel \(key)")
        }
        return UserState(userID: user, states: items)
    }

    public func getOnlineUsers(_ r: GetOnlineUsersRequest) async throws(PresenceError) -> GetOnlineUsersResponse {
        let key = try Validate.channel(r.channelName, r.channelType)
        let includeUserID = r.includeUserID ?? true
        if r.includeState && !includeUserID {
            throw PresenceError(.invalidArgument, "INVALID_INCLUDE_FLAGS", "include_state needs include_user_id (state is listed per user)")
        }
        let after = r.page.isEmpty ? nil : try PageBookmark.parse(r.page)
        if !includeUserID {
            return GetOnlineUsersResponse(totalOccupancy: UInt32(await owner(key).occupancy(key)))
        }
        let (total, users, next) = await owner(key).page(key, after: after, includeState: r.includeState)
        return GetOnlineUsersResponse(totalOccupancy: UInt32(total), users: users, nextPage: next.map(PageBookmark.make(after:)) ?? "")
    }

    public func getUserChannels(_ user: String) async throws(PresenceError) -> GetUserChannelsResponse {
        let user = try Validate.userID(user)
        let channels = await home(user).channels(of: user)
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
        let (s, _) = try gateway(id).session(id)
        await home(s.userID).setStatus(s.userID, status)
    }

    public func getUserStatuses(_ users: [String]) async throws(PresenceError) -> [UserStatusEntry] {
        let users = try Validate.userList(users, field: "user_ids")
        var found: [String: UserStatus] = [:]
        for (shard, us) in byHome(users) { found.merge(await shard.statuses(us)) { a, _ in a } }
        return users.map { UserStatusEntry(userID: $0, status: found[$0] ?? .unknown) }
    }

    public func watch(_ sessionID: String, add: [String], remove: [String]) async throws(PresenceError) -> [UserStatusEntry] {
        let id = try Validate.sessionID(sessionID)
        let add = try Validate.userList(add, field: "user_ids")
        let remove = try Validate.userList(remove, field: "unwatch_user_ids")
        let (_, outbox, added) = try gateway(id).watch(id, add: add, remove: remove)
        await unwatch(remove.filter { !added.contains($0) }, by: id)
        var statuses: [String: UserStatus] = [:]
        for (shard, us) in byHome(added) { statuses.merge(await shard.watch(us, by: id, outbox: outbox)) { a, _ in a } }
        return added.map { UserStatusEntry(userID: $0, status: statuses[$0] ?? .unknown) }
    }

    /// The user a session belongs to (for permission checks).
    public func owner(ofSession sessionID: String) async -> String? {
        guard let id = SessionID(text: sessionID), let (s, _) = try? gateway(id).session(id) else { return nil }
        return s.userID
    }

    /// Sessions on this node (for metrics and tests).
    public func sessionCount() async -> Int {
        var n = 0
        for g in gateways { n += g.count }
        return n
    }
}
