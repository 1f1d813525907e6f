import EventLoop
import GRPCTransport
import PresenceCore
import PresenceWire

/// `presence.v1.Presence` over gRPC: decodes, checks the caller, calls the engine, maps errors.
public struct PresenceService: Sendable {
    let engine: PresenceEngine
    /// Token mode when set; open mode (user ids trusted) when nil.
    let verifier: TokenVerifier?

    public init(engine: PresenceEngine, verifier: TokenVerifier?) {
        self.engine = engine
        self.verifier = verifier
    }

    static func status(_ e: PresenceError) -> GRPCStatus {
        let code: GRPCStatus.Code
        switch e.kind {
        case .invalidArgument: code = .invalidArgument
        case .notFound: code = .notFound
        case .permissionDenied: code = .permissionDenied
        case .unauthenticated: code = .unauthenticated
        case .resourceExhausted: code = .resourceExhausted
        case .unavailable: code = .unavailable
        case .failedPrecondition: code = .failedPrecondition
        }
        return GRPCStatus(code, e.description)
    }

    /// A staged engine call (`Staged`) with its errors, at once or from its rest, as gRPC statuses.
    static func staged<T: Sendable>(_ body: () throws(PresenceError) -> Staged<T, PresenceError>) throws -> Staged<T, any Error> {
        let first: Staged<T, PresenceError>
        do { first = try body() } catch { throw status(error) }
        switch first {
        case .now(let value): return .now(value)
        case .onLoop(let loop, let attempt): return .onLoop(loop) { try staged(attempt) }
        case .later(let rest): return .later { try await call { () async throws(PresenceError) in try await rest() } }
        }
    }

    /// Runs a call, turning `PresenceError` into its gRPC status.
    static func call<T>(_ body: () async throws(PresenceError) -> T) async throws -> T {
        do {
            return try await body()
        } catch {
            throw status(error)
        }
    }

    /// In token mode, the user of the call's `authorization: Bearer <token>` (API.md, "Security");
    /// nil in open mode. A missing, malformed, forged or expired token is UNAUTHENTICATED.
    func caller(_ ctx: ServerContext) throws(PresenceError) -> String? {
        guard let verifier else { return nil }
        guard let auth = ctx.metadata.first(where: { $0.0 == "authorization" })?.1 else {
            throw PresenceError(.unauthenticated, "INVALID_TOKEN", "this node runs in token mode: every call carries 'authorization: Bearer <token>'")
        }
        guard auth.hasPrefix("Bearer ") else {
            throw PresenceError(.unauthenticated, "INVALID_TOKEN", "authorization must be 'Bearer <token>'")
        }
        return try verifier.user(of: String(auth.dropFirst(7)), now: WallClock.nowMilliseconds() / 1000)
    }

    /// A call that names a session: in token mode its token must be valid and for the session's
    /// own user (PERMISSION_DENIED otherwise; an unknown session is NOT_FOUND from the call).
    func checkCaller(_ ctx: ServerContext, session: String) throws(PresenceError) {
        guard let user = try caller(ctx) else { return }
        guard let owner = engine.owner(ofSession: session) else { return }
        if owner != user {
            throw PresenceError(.permissionDenied, "NOT_YOUR_SESSION", "session \(session) belongs to another user")
        }
    }

    /// A read call: in token mode any valid user's token may read.
    func checkReader(_ ctx: ServerContext) throws(PresenceError) {
        _ = try caller(ctx)
    }

    public func register(in registry: inout ServiceRegistry) {
        let engine = self.engine
        let verifier = self.verifier
        let service = self

        registry.serverStreaming(PresenceMethods.openSession) { req, _, writer in
            let opened = try await Self.call { () async throws(PresenceError) -> PresenceEngine.OpenedSession in
                let user = try Validate.userID(req.userID)
                if let verifier { try verifier.verify(req.token, userID: user, now: WallClock.nowMilliseconds() / 1000) }
                return try await engine.openSession(user: user, resume: req.resumeSessionID, initialStatus: req.initialStatus)
            }
            do {
                try await writer.send(SessionEvent(event: .opened(SessionOpened(
                    sessionID: opened.id.description, nodeID: engine.settings.nodeID, resumed: opened.resumed))))
            } catch {
                // the stream broke before `opened` reached the client (it cancelled the call): the
                // session it cannot know of starts its resume window now, then times out, instead
                // of staying connected with nobody behind it
                await engine.streamBroke(opened.id, generation: opened.generation)
                throw error
            }
            if opened.outbox.attach(writer.raw, generation: opened.generation) {
                await engine.resnapshot(opened.id)
            }
            // (attaching cleared an end the shutdown gave this outbox before the stream was here)
            if engine.isShuttingDown { opened.outbox.end(.shutdown) }
            switch await opened.outbox.waitForEnd() {
            case .closed:
                return
            case .replaced:
                throw GRPCStatus(.aborted, "SESSION_RESUMED_ELSEWHERE: another stream resumed session \(opened.id)")
            case .slowConsumer:
                await engine.streamBroke(opened.id, generation: opened.generation)
                throw GRPCStatus(.resourceExhausted, "SLOW_CONSUMER: events arrived faster than the client read them; resume the session to get fresh snapshots")
            case .shutdown:
                await engine.streamBroke(opened.id, generation: opened.generation)
                throw GRPCStatus(.unavailable, "SHUTTING_DOWN: this node is shutting down; resume the session on another node")
            case .broken:
                await engine.streamBroke(opened.id, generation: opened.generation)
                throw CancellationError()
            }
        }

        registry.unary(PresenceMethods.closeSession) { req, ctx in
            try await Self.call { () async throws(PresenceError) in
                try service.checkCaller(ctx, session: req.sessionID)
                try await engine.closeSession(req.sessionID)
            }
            return CloseSessionResponse()
        }
        registry.unary(PresenceMethods.join) { req, ctx in
            try await Self.call { () async throws(PresenceError) in
                try service.checkCaller(ctx, session: req.sessionID)
                try await engine.join(req.sessionID, channel: req.channelName, type: req.channelType, withPresence: req.withPresence)
            }
            return JoinResponse()
        }
        registry.unary(PresenceMethods.leave) { req, ctx in
            try await Self.call { () async throws(PresenceError) in
                try service.checkCaller(ctx, session: req.sessionID)
                try await engine.leave(req.sessionID, channel: req.channelName, type: req.channelType)
            }
            return LeaveResponse()
        }
        registry.unaryStagedEncoded(PresenceMethods.getOnlineUsers) { req, ctx in
            try Self.staged { () throws(PresenceError) in
                try service.checkReader(ctx)
                return try engine.getOnlineUsersEncodedStaged(req)
            }
        }
        registry.unary(PresenceMethods.getUserChannels) { req, ctx in
            try await Self.call { () async throws(PresenceError) in
                try service.checkReader(ctx)
                return try await engine.getUserChannels(req.userID)
            }
        }
        registry.unaryStaged(PresenceMethods.setState) { req, ctx in
            try Self.staged { () throws(PresenceError) in
                try service.checkCaller(ctx, session: req.sessionID)
                return try engine.setStateStaged(req.sessionID, channel: req.channelName, type: req.channelType, items: req.items)
            }.map { SetStateResponse() }
        }
        registry.unaryStaged(PresenceMethods.getState) { req, ctx in
            try Self.staged { () throws(PresenceError) in
                try service.checkReader(ctx)
                return try engine.getStateStaged(channel: req.channelName, type: req.channelType, user: req.userID)
            }.map { GetStateResponse(state: $0) }
        }
        registry.unaryStaged(PresenceMethods.removeState) { req, ctx in
            try Self.staged { () throws(PresenceError) in
                try service.checkCaller(ctx, session: req.sessionID)
                return try engine.removeStateStaged(req.sessionID, channel: req.channelName, type: req.channelType, keys: req.keys)
            }.map { RemoveStateResponse() }
        }
        registry.unary(PresenceMethods.setStatus) { req, ctx in
            try await Self.call { () async throws(PresenceError) in
                try service.checkCaller(ctx, session: req.sessionID)
                try await engine.setStatus(req.sessionID, status: req.status)
            }
            return SetStatusResponse()
        }
        registry.unary(PresenceMethods.getUserStatuses) { req, ctx in
            GetUserStatusesResponse(statuses: try await Self.call { () async throws(PresenceError) in
                try service.checkReader(ctx)
                return try await engine.getUserStatuses(req.userIDs)
            })
        }
        registry.unary(PresenceMethods.watch) { req, ctx in
            WatchResponse(statuses: try await Self.call { () async throws(PresenceError) in
                try service.checkCaller(ctx, session: req.sessionID)
                return try await engine.watch(req.sessionID, add: req.userIDs, remove: req.unwatchUserIDs)
            })
        }
    }
}
