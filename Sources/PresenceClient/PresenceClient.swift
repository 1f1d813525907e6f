import EventLoop
import GRPCTransport
import PresenceWire
import Synchronization

/// Where a `PresenceClient`'s session stands.
public enum ConnectionState: Sendable, Equatable {
    /// `connect()` was not called yet.
    case notInitialized
    /// Opening the session for the first time.
    case connecting
    /// The session is open and events flow.
    case connected
    /// The stream broke; reopening it (resuming the same session while the server still holds it).
    case reconnecting
    /// Closed by `close()` (or the server refused the session for good).
    case disconnected
}

/// An event for the app: a channel's presence event or a watched user's status change.
public enum PresenceClientEvent: Sendable, Equatable {
    case presence(PresenceEvent)
    case status(UserStatusEvent)
}

/// A presence session for one user, over gRPC to any presenced node.
///
/// ```swift
/// let client = PresenceClient(server: HostPort(host: "127.0.0.1", port: 7400), userID: "ann")
/// try await client.connect()
/// try await client.join("lobby", withPresence: true)
/// for await event in client.events { print(event) }
/// ```
/// When the stream breaks, the client reconnects by itself and resumes the session, so the server
/// keeps its presence and state with no event; if the session was lost meanwhile (the presence
/// timeout passed), it opens a new one and joins its channels, restores its state and watches again.
public final class PresenceClient: Sendable {
    public let userID: String
    private let token: String
    private let ownGroup: EventLoopGroup?
    private let driver: Driver
    /// The node the session lives on now (calls naming the session must go there).
    var grpc: GRPCClient { driver.current }

    /// The session's events. One consumer.
    public let events: AsyncStream<PresenceClientEvent>
    /// Every change of `connectionState`, starting with the current one. One consumer.
    public let connectionStates: AsyncStream<ConnectionState>

    /// - Parameters:
    ///   - token: an HMAC token for nodes in token mode (empty in open mode).
    ///   - tls: TLS to the nodes (nil: cleartext h2c), as `TLSContextSource(_:server: false)` makes it:
    ///     the CA the nodes' certificates chain to, and the name they must carry, if any.
    ///   - group: event loops to use; by default the client starts one of its own.
    public convenience init(server: HostPort, userID: String, token: String = "", tls: TLSContextSource? = nil, group: EventLoopGroup? = nil) {
        self.init(servers: [server], userID: userID, token: token, tls: tls, group: group)
    }

    /// A client of a cluster: it opens its session on the first node, and when a node cannot be
    /// reached it resumes the session on the next one (the session keeps its presence and state).
    public init(servers: [HostPort], userID: String, token: String = "", tls: TLSContextSource? = nil, group: EventLoopGroup? = nil) {
        precondition(!servers.isEmpty, "a client needs at least one server")
        self.userID = userID
        self.token = token
        let own = group == nil ? EventLoopGroup(count: 1, name: "presence-client") : nil
        ownGroup = own
        let loops = group ?? own!
        let clients = servers.map { server in
            var config = ClientConfiguration(target: server)
            config.http2.keepaliveInterval = 5_000_000_000
            config.http2.keepaliveTimeout = 3_000_000_000
            // token mode: every call carries the user's token (OpenSession carries it in its request too)
            if !token.isEmpty { config.metadata = [("authorization", "Bearer " + token)] }
            config.tls = tls
            return GRPCClient(configuration: config, group: loops)
        }
        let (events, eventSink) = AsyncStream<PresenceClientEvent>.makeStream(bufferingPolicy: .unbounded)
        let (states, stateSink) = AsyncStream<ConnectionState>.makeStream(bufferingPolicy: .unbounded)
        self.events = events
        self.connectionStates = states
        driver = Driver(clients: clients, userID: userID, token: token, events: eventSink, states: stateSink)
        stateSink.yield(.notInitialized)
    }

    deinit {
        driver.closeAll()
        ownGroup?.shutdown()
    }

    /// The node (address) the session is on, or will be opened on.
    public var server: HostPort { grpc.configuration.target }

    /// The current connection state.
    public var connectionState: ConnectionState { driver.state }

    /// The session id once connected.
    public var sessionID: String? { driver.sessionID }

    /// Opens the session and returns once the server confirmed it (or throws why it could not).
    /// `initialStatus` is sent with the opening; a status set before connecting is used too.
    public func connect(initialStatus: UserStatus? = nil) async throws {
        if let s = initialStatus { driver.setDesiredStatus(s) }
        try await driver.start()
    }

    /// Ends the session (CloseSession: others see REMOTE_LEAVE) and stops reconnecting.
    public func close() async {
        await driver.stop(grpc: grpc)
    }

    /// How many times the session stream was reopened after a break.
    public var _reconnects: Int { driver.reconnects }

    // MARK: Calls

    private func sessionIDOrThrow() throws -> String {
        guard let id = driver.sessionID, driver.state == .connected else {
            throw GRPCStatus(.unavailable, "NOT_CONNECTED: the session is not open (state \(driver.state))")
        }
        return id
    }

    public func join(_ channel: String, type: ChannelType = .message, withPresence: Bool = true) async throws {
        _ = try await grpc.unary(PresenceMethods.join, JoinRequest(sessionID: try sessionIDOrThrow(), channelName: channel, channelType: type, withPresence: withPresence))
        driver.remember { $0.channels[ChannelRef(channel, type)] = withPresence }
    }

    public func leave(_ channel: String, type: ChannelType = .message) async throws {
        _ = try await grpc.unary(PresenceMethods.leave, LeaveRequest(sessionID: try sessionIDOrThrow(), channelName: channel, channelType: type))
        driver.remember {
            $0.channels[ChannelRef(channel, type)] = nil
            $0.state[ChannelRef(channel, type)] = nil
        }
    }

    public func setState(_ channel: String, type: ChannelType = .message, _ items: [String: String]) async throws {
        let list = items.sorted { $0.key < $1.key }.map { StateItem(key: $0.key, value: $0.value) }
        _ = try await grpc.unary(PresenceMethods.setState, SetStateRequest(sessionID: try sessionIDOrThrow(), channelName: channel, channelType: type, items: list))
        driver.remember { $0.state[ChannelRef(channel, type), default: [:]].merge(items) { _, b in b } }
    }

    public func removeState(_ channel: String, type: ChannelType = .message, keys: [String] = []) async throws {
        _ = try await grpc.unary(PresenceMethods.removeState, RemoveStateRequest(sessionID: try sessionIDOrThrow(), channelName: channel, channelType: type, keys: keys))
        driver.remember { m in
            if keys.isEmpty { m.state[ChannelRef(channel, type)] = nil } else { for k in keys { m.state[ChannelRef(channel, type)]?[k] = nil } }
        }
    }

    public func getState(_ channel: String, type: ChannelType = .message, user: String) async throws -> [StateItem] {
        try await grpc.unary(PresenceMethods.getState, GetStateRequest(channelName: channel, channelType: type, userID: user)).state?.states ?? []
    }

    /// One page of a channel's users (`page`: the previous response's `nextPage`).
    public func onlineUsers(_ channel: String, type: ChannelType = .message, includeUserID: Bool = true, includeState: Bool = false, page: String = "") async throws -> GetOnlineUsersResponse {
        try await grpc.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: channel, channelType: type, includeUserID: includeUserID, includeState: includeState, page: page))
    }

    /// Every user of a channel, walking all pages.
    public func allOnlineUsers(_ channel: String, type: ChannelType = .message, includeState: Bool = false) async throws -> [UserState] {
        var all: [UserState] = []
        var page = ""
        repeat {
            let r = try await onlineUsers(channel, type: type, includeState: includeState, page: page)
            all += r.users
            page = r.nextPage
        } while !page.isEmpty
        return all
    }

    public func userChannels(_ user: String) async throws -> [ChannelInfo] {
        try await grpc.unary(PresenceMethods.getUserChannels, GetUserChannelsRequest(userID: user)).channels
    }

    /// Sets this user's status; before `connect`, it is kept and sent with the opening.
    public func setStatus(_ status: UserStatus) async throws {
        driver.setDesiredStatus(status)
        guard driver.state == .connected, let id = driver.sessionID else { return }
        _ = try await grpc.unary(PresenceMethods.setStatus, SetStatusRequest(sessionID: id, status: status))
    }

    public func statuses(_ users: [String]) async throws -> [UserStatusEntry] {
        try await grpc.unary(PresenceMethods.getUserStatuses, GetUserStatusesRequest(userIDs: users)).statuses
    }

    /// Follows (and unfollows) users; returns the current status of the newly followed.
    @discardableResult
    public func watch(_ users: [String], unwatch: [String] = []) async throws -> [UserStatusEntry] {
        let r = try await grpc.unary(PresenceMethods.watch, WatchRequest(sessionID: try sessionIDOrThrow(), userIDs: users, unwatchUserIDs: unwatch))
        driver.remember { m in
            m.watching.formUnion(users)
            m.watching.subtract(unwatch)
        }
        return r.statuses
    }
}

struct ChannelRef: Hashable, Sendable {
    let name: String
    let type: ChannelType
    init(_ name: String, _ type: ChannelType) {
        self.name = name
        self.type = type
    }
}

/// What the client re-applies when it has to open a new session after losing the old one.
struct Memory: Sendable {
    var channels: [ChannelRef: Bool] = [:]
    var state: [ChannelRef: [String: String]] = [:]
    var watching: Set<String> = []
}

/// Runs the session stream: opens, reads events, reconnects with resume. Sendable via a Mutex.
final class Driver: Sendable {
    private struct S {
        var state = ConnectionState.notInitialized
        var sessionID: String? = nil
        var desiredStatus = UserStatus.unknown
        var memory = Memory()
        var task: Task<Void, Never>? = nil
        var stopping = false
        var firstOpen: CheckedContinuation<Void, Error>? = nil
        var reconnects = 0
        /// The server refused to resume the session (it expired, or the cluster lost it): the next
        /// session opened is a fresh one, and gets the channels, state and watches back.
        var restoreOnOpen = false
        /// Index of the server in use.
        var server = 0
    }
    private let s = Mutex(S())
    private let clients: [GRPCClient]
    var current: GRPCClient { clients[s.withLock { $0.server }] }
    private var grpc: GRPCClient { current }
    private let userID: String
    private let token: String
    private let events: AsyncStream<PresenceClientEvent>.Continuation
    private let states: AsyncStream<ConnectionState>.Continuation

    init(clients: [GRPCClient], userID: String, token: String, events: AsyncStream<PresenceClientEvent>.Continuation, states: AsyncStream<ConnectionState>.Continuation) {
        self.clients = clients
        self.userID = userID
        self.token = token
        self.events = events
        self.states = states
    }

    var state: ConnectionState { s.withLock { $0.state } }

    /// Uses the next server from now on.
    func advance() { s.withLock { $0.server = ($0.server + 1) % clients.count } }

    func closeAll() { for c in clients { c.close() } }
    var sessionID: String? { s.withLock { $0.sessionID } }
    var reconnects: Int { s.withLock { $0.reconnects } }

    func setDesiredStatus(_ status: UserStatus) { s.withLock { $0.desiredStatus = status } }
    func remember(_ body: (inout Memory) -> Void) { s.withLock { body(&$0.memory) } }

    private func set(_ state: ConnectionState) {
        let changed = s.withLock { x -> Bool in
            guard x.state != state else { return false }
            x.state = state
            return true
        }
        if changed { states.yield(state) }
    }

    func start() async throws {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, Error>) in
            let startNow = s.withLock { x -> Bool in
                guard x.task == nil else { return false }
                x.firstOpen = c
                x.stopping = false
                return true
            }
            guard startNow else {
                c.resume(throwing: GRPCStatus(.failedPrecondition, "ALREADY_STARTED: connect() was already called"))
                return
            }
            set(.connecting)
            let task = Task { await self.run() }
            s.withLock { $0.task = task }
        }
    }

    func stop(grpc: GRPCClient) async {
        let (id, task) = s.withLock { x -> (String?, Task<Void, Never>?) in
            x.stopping = true
            return (x.sessionID, x.task)
        }
        if let id, state == .connected {
            _ = try? await grpc.unary(PresenceMethods.closeSession, CloseSessionRequest(sessionID: id), timeout: .seconds(5))
        }
        task?.cancel()
        await task?.value
        s.withLock {
            $0.task = nil
            $0.sessionID = nil
        }
        set(.disconnected)
    }

    private func run() async {
        var backoff: UInt64 = 100_000_000
        while !Task.isCancelled {
            let (resume, status, stopping) = s.withLock { ($0.sessionID ?? "", $0.desiredStatus, $0.stopping) }
            if stopping { break }
            let call = grpc.serverStreaming(PresenceMethods.openSession,
                                            OpenSessionRequest(userID: userID, token: token, resumeSessionID: resume, initialStatus: status))
            var opened = false
            do {
                for try await message in call {
                    switch message.event {
                    case .opened(let o)?:
                        opened = true
                        backoff = 100_000_000
                        let lostSession = s.withLock { x -> Bool in
                            defer { x.restoreOnOpen = false }
                            return (!o.resumed && !resume.isEmpty) || x.restoreOnOpen
                        }
                        s.withLock {
                            $0.sessionID = o.sessionID
                            if !resume.isEmpty { $0.reconnects += 1 }
                        }
                        if lostSession { await restore(o.sessionID) }
                        set(.connected)
                        let first = s.withLock { x -> CheckedContinuation<Void, Error>? in
                            defer { x.firstOpen = nil }
                            return x.firstOpen
                        }
                        first?.resume()
                    case .presence(let e)?: events.yield(.presence(e))
                    case .status(let e)?: events.yield(.status(e))
                    case nil: break
                    }
                }
            } catch let error as GRPCStatus {
                if error.code == .notFound && !resume.isEmpty && !opened {
                    // the session cannot be resumed (expired, or lost): open a fresh one at once
                    s.withLock {
                        $0.sessionID = nil
                        $0.restoreOnOpen = true
                        $0.reconnects += 1
                    }
                    continue
                }
                // Refusals that retrying cannot fix end the client.
                if [.unauthenticated, .invalidArgument, .permissionDenied].contains(error.code) {
                    let first = s.withLock { x -> CheckedContinuation<Void, Error>? in
                        defer { x.firstOpen = nil }
                        return x.firstOpen
                    }
                    if let first {
                        s.withLock { $0.task = nil }
                        set(.disconnected)  // before the caller hears of it
                        first.resume(throwing: error)
                        return
                    }
                }
            } catch {}
            if Task.isCancelled || s.withLock({ $0.stopping }) { break }
            // the node could not be reached (or dropped us before opening): try the next one
            if !opened { advance() }
            set(s.withLock { $0.firstOpen != nil } ? .connecting : .reconnecting)
            try? await Task.sleep(nanoseconds: backoff)
            backoff = min(backoff * 2, 2_000_000_000)
        }
        let first = s.withLock { x -> CheckedContinuation<Void, Error>? in
            defer { x.firstOpen = nil }
            return x.firstOpen
        }
        first?.resume(throwing: GRPCStatus(.cancelled, "CLOSED: the client was closed before the session opened"))
    }

    /// A new session replaced a lost one: join, set state and watch as before.
    private func restore(_ id: String) async {
        let m = s.withLock { $0.memory }
        for (ch, withPresence) in m.channels {
            let items = (m.state[ch] ?? [:]).sorted { $0.key < $1.key }.map { StateItem(key: $0.key, value: $0.value) }
            if !items.isEmpty {
                _ = try? await grpc.unary(PresenceMethods.setState, SetStateRequest(sessionID: id, channelName: ch.name, channelType: ch.type, items: items))
            }
            _ = try? await grpc.unary(PresenceMethods.join, JoinRequest(sessionID: id, channelName: ch.name, channelType: ch.type, withPresence: withPresence))
        }
        if !m.watching.isEmpty {
            _ = try? await grpc.unary(PresenceMethods.watch, WatchRequest(sessionID: id, userIDs: Array(m.watching)))
        }
    }
}
