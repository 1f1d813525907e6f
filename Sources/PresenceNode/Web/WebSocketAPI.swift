import EventLoop
import GRPCTransport
import HTTPFrontDoor
import PresenceWire
import Synchronization

/// The client API over WebSocket (WEB.md, `/v1/ws`): JSON messages carried to and from the very
/// handlers the gRPC port runs, so both kinds of client get the same rules, checks and events.
/// The first message opens or resumes the session (OpenSession, whose stream is the socket); calls
/// go to the unary handlers with the token of the open message as their `authorization`.
public final class WebSocketAPI: Sendable {
    /// The client port's methods (OpenSession and the unary calls).
    let registry: ServiceRegistry
    let settings: WebSocketSettings
    /// Calls one socket may have in flight at once; more are refused with RESOURCE_EXHAUSTED.
    static let maxCallsInFlight = 32
    /// A socket whose first message has not opened a session within this is closed (4408), like a
    /// gRPC connection that never completes its handshake.
    let openTimeout: UInt64
    /// Told of every call answered (for metrics).
    let callObserver: (@Sendable (String, GRPCStatus.Code, UInt64) -> Void)?
    private let open = Atomic<Int>(0)

    init(registry: ServiceRegistry, settings: WebSocketSettings = WebSocketSettings(), openTimeout: UInt64 = 10_000_000_000,
         callObserver: (@Sendable (String, GRPCStatus.Code, UInt64) -> Void)? = nil) {
        self.registry = registry
        self.settings = settings
        self.openTimeout = openTimeout
        self.callObserver = callObserver
    }

    /// WebSockets open now (for metrics).
    public var openSockets: Int { open.load(ordering: .relaxed) }

    /// The front door's answer to `GET /v1/ws`.
    func upgrade(_ request: HTTPRequest) -> HTTPReply {
        switch WebSocketHandshake.accept(request) {
        case .failure(let refusal):
            return .now(refusal.response)
        case .success(let response):
            return .upgrade(response) { [self] socket in
                open.add(1, ordering: .relaxed)
                let ws = WebSocketConnection(socket: UpgradedSocket(fd: socket.fd, loop: socket.loop, leftover: socket.leftover, release: { [self] in
                    open.subtract(1, ordering: .relaxed)
                    socket.release()
                }), settings: settings)
                let session = WebSocketSession(socket: ws, api: self)
                ws.delegate = session
                ws.start()
                // (a strong capture, cancelled when the socket closes: a weak one would give the
                // session a side table, and each retain and release of it, one per event it is
                // handed, would take the runtime's slow path)
                session.openTimer = socket.loop.scheduleTimer(after: openTimeout) { session.openDeadlinePassed() }
            }
        }
    }

    /// A call a socket may make: its path, and how its JSON request and protobuf answer are coded.
    struct Method: Sendable {
        let path: String
        let handler: @Sendable ([UInt8], ServerContext) async throws -> [UInt8]
        let request: @Sendable (JSONValue) throws(JSONError) -> [UInt8]
        let response: @Sendable ([UInt8]) throws -> JSONValue
    }

    /// One of Presence's unary methods, by name ("Join").
    func method(_ name: String) -> Method? {
        guard let m = Self.coders[name], let handler = registry.methods[m.path]?.asyncUnary else { return nil }
        return Method(path: m.path, handler: handler, request: m.request, response: m.response)
    }

    private struct Coder: Sendable {
        let path: String
        let request: @Sendable (JSONValue) throws(JSONError) -> [UInt8]
        let response: @Sendable ([UInt8]) throws -> JSONValue

        init<Req: ProtoMessage & JSONCodable, Resp: ProtoMessage & JSONCodable>(_ m: MethodDescriptor<Req, Resp>) {
            path = m.path
            request = { json throws(JSONError) in try Req(json: json).serializedBytes(prefix: 0) }
            response = { framed in try Resp(serializedBytes: Array(framed.dropFirst(5))).json() }
        }
    }

    private static let coders: [String: Coder] = {
        let all = [Coder(PresenceMethods.closeSession), Coder(PresenceMethods.join), Coder(PresenceMethods.leave),
                   Coder(PresenceMethods.getOnlineUsers), Coder(PresenceMethods.getUserChannels), Coder(PresenceMethods.setState),
                   Coder(PresenceMethods.getState), Coder(PresenceMethods.removeState), Coder(PresenceMethods.setStatus),
                   Coder(PresenceMethods.getUserStatuses), Coder(PresenceMethods.watch)]
        return Dictionary(uniqueKeysWithValues: all.map { (String($0.path.split(separator: "/").last!), $0) })
    }()
}

/// One socket's session. Loop-confined (the socket's loop); tasks hop back to it.
final class WebSocketSession: WebSocketDelegate {
    private let socket: WebSocketConnection
    private let api: WebSocketAPI
    private var loop: EventLoop { socket.loop }
    private enum Phase { case waitingForOpen, open, closed }
    private var phase = Phase.waitingForOpen
    /// The deadline for the first message (cancelled when the socket closes).
    var openTimer: TimerID?
    /// The token of the open message, sent with every call as `authorization`.
    private var metadata: [(String, String)] = []
    private var sessionID = ""
    /// The OpenSession handler, whose stream is this socket.
    private var stream: Task<Void, Never>?
    private var writer: ServerStreamWriter?
    /// Framed SessionEvents taken from the writer, not yet handed to the socket.
    private var pending: [[UInt8]] = []
    private var callsInFlight = 0
    /// Events are handed to the socket while it holds less than this; the rest wait in the
    /// writer, whose bound then cuts a slow reader off exactly as on gRPC.
    private static let socketBudget = 256 * 1024

    /// The JSON of recent events on this socket's loop (shared by its sessions).
    private let textCache: EventTextCache

    init(socket: WebSocketConnection, api: WebSocketAPI) {
        self.socket = socket
        self.api = api
        textCache = EventTextCache.forLoop(socket.loop)
    }

    private func reply(_ members: [(String, JSONValue)]) {
        if !socket.send(text: Array(JSONValue.object(members).text.utf8)) {
            socket.close(code: 1008, reason: "SLOW_CONSUMER")
        }
    }

    private func error(id: JSONValue?, _ status: GRPCStatus) {
        var members: [(String, JSONValue)] = []
        if let id { members.append(("id", id)) }
        members.append(("error", .object([("code", .string(status.code.name)), ("message", .string(status.message))])))
        reply(members)
    }

    // MARK: WebSocketDelegate

    func webSocket(_ socket: WebSocketConnection, received text: [UInt8]) {
        let message: JSONValue
        do {
            message = try JSONParser.parse(text)
        } catch {
            self.error(id: nil, GRPCStatus(.invalidArgument, "MALFORMED_JSON: \(error.message)"))
            return
        }
        switch phase {
        case .waitingForOpen:
            guard let open = message["open"] else {
                fail(GRPCStatus(.invalidArgument, "OPEN_FIRST: the first message opens or resumes the session: {\"open\": {\"userId\": ...}}"))
                return
            }
            startSession(open)
        case .open:
            call(message)
        case .closed:
            break
        }
    }

    func webSocketDrained(_ socket: WebSocketConnection) { deliver() }

    func webSocketClosed(_ socket: WebSocketConnection, code: UInt16?) {
        phase = .closed
        loop.cancelTimer(&openTimer)
        // the stream broke: the session waits to be resumed (OpenSession's handler ends as
        // cancelled, as when a gRPC client goes away)
        stream?.cancel()
        stream = nil
        writer?.close(GRPCStatus(.cancelled, "the socket closed"))
        writer = nil
        pending = []
    }

    // MARK: The session

    /// No session was opened in time: the socket goes.
    func openDeadlinePassed() {
        guard phase == .waitingForOpen else { return }
        fail(GRPCStatus(.deadlineExceeded, "OPEN_TIMEOUT: the first message must open or resume a session"))
    }

    /// Refuses the open message: the error, then a close with the code WEB.md gives it.
    private func fail(_ status: GRPCStatus) {
        error(id: nil, status)
        let code: UInt16
        switch status.code {
        case .unauthenticated: code = 4001
        case .permissionDenied: code = 4003
        case .invalidArgument: code = 4400
        case .notFound: code = 4404
        case .resourceExhausted: code = 4429
        case .deadlineExceeded: code = 4408
        default: code = 1011
        }
        phase = .closed
        socket.close(code: code, reason: String(status.message.prefix(100)))
    }

    private func startSession(_ open: JSONValue) {
        let request: OpenSessionRequest
        do {
            request = try OpenSessionRequest(json: open)
        } catch {
            fail(GRPCStatus(.invalidArgument, "MALFORMED_OPEN: \(error.message)"))
            return
        }
        guard case .serverStreaming(let handler)? = api.registry.methods[PresenceMethods.openSession.path] else {
            fail(GRPCStatus(.unimplemented, "OpenSession is not served here"))
            return
        }
        phase = .open
        if !request.token.isEmpty { metadata = [("authorization", "Bearer " + request.token)] }
        let me = LoopBound(self, loop: loop)
        let writer = ServerStreamWriter { me.execute { $0.deliver() } }
        self.writer = writer
        let bytes = request.serializedBytes(prefix: 0)
        let context = ServerContext(path: PresenceMethods.openSession.path, deadline: nil, metadata: metadata)
        stream = Task.immediate(executorPreference: loop) {
            let status: GRPCStatus
            do {
                try await handler(bytes, context, writer)
                status = .ok
            } catch {
                status = GRPCStatus(error)
            }
            me.execute { $0.streamEnded(status) }
        }
    }

    /// Moves events from the writer to the socket while the socket has room.
    private func deliver() {
        guard phase != .closed, let writer else { return }
        pending += writer.takePending()
        var handed = 0
        while !pending.isEmpty, socket.queuedBytes < Self.socketBudget {
            let framed = pending.removeFirst()
            handed += framed.count
            let text: [UInt8]
            if sessionID.isEmpty {
                // (the first event, `opened`, names the session)
                guard let event = try? SessionEvent(serializedBytes: Array(framed.dropFirst(5))) else { continue }
                if case .opened(let o)? = event.event { sessionID = o.sessionID }
                text = Self.eventText(event)
            } else {
                // an event goes to every socket that follows its channel: its JSON is made once
                guard let t = textCache.text(for: framed, make: {
                    (try? SessionEvent(serializedBytes: Array(framed.dropFirst(5)))).map(Self.eventText)
                }) else { continue }
                text = t
            }
            guard socket.send(text: text) else {
                socket.close(code: 1008, reason: "SLOW_CONSUMER")
                return
            }
        }
        if handed > 0 { writer.drained(handed) }
    }

    static func eventText(_ event: SessionEvent) -> [UInt8] { Array(JSONValue.object([("event", event.json())]).text.utf8) }

    /// OpenSession's handler ended: the socket closes, with a code that says why.
    private func streamEnded(_ status: GRPCStatus) {
        stream = nil
        guard phase != .closed else { return }
        deliver()
        switch status.code {
        case .ok:
            phase = .closed
            socket.close(code: 1000, reason: "session closed")
        case .resourceExhausted where status.message.hasPrefix("SLOW_CONSUMER"):
            phase = .closed
            socket.close(code: 1008, reason: "SLOW_CONSUMER: resume the session to get fresh snapshots")
        case .unavailable where status.message.hasPrefix("SHUTTING_DOWN"):
            phase = .closed
            socket.close(code: 1001, reason: "SHUTTING_DOWN: resume the session on another node")
        case .aborted:
            phase = .closed
            socket.close(code: 4409, reason: "SESSION_RESUMED_ELSEWHERE")
        case .cancelled:
            break
        default:
            fail(status)
        }
    }

    // MARK: Calls

    private func call(_ message: JSONValue) {
        let id = message["id"]
        guard let name = message["method"]?.stringValue else {
            error(id: id, GRPCStatus(.invalidArgument, "MALFORMED_CALL: a call is {\"id\": ..., \"method\": \"Join\", \"request\": {...}}"))
            return
        }
        guard let method = api.method(name) else {
            error(id: id, GRPCStatus(.unimplemented, "UNKNOWN_METHOD: \(name.prefix(64)) is not a method of presence.v1.Presence this socket can call"))
            return
        }
        guard callsInFlight < WebSocketAPI.maxCallsInFlight else {
            error(id: id, GRPCStatus(.resourceExhausted, "TOO_MANY_CALLS: at most \(WebSocketAPI.maxCallsInFlight) calls in flight per socket"))
            return
        }
        // a call that names a session acts for this socket's own, unless it names one
        var request = message["request"] ?? .object([])
        if case .object(var members) = request, !members.contains(where: { $0.0 == "sessionId" || $0.0 == "session_id" }), !sessionID.isEmpty {
            members.append(("sessionId", .string(sessionID)))
            request = .object(members)
        }
        let bytes: [UInt8]
        do {
            bytes = try method.request(request)
        } catch {
            self.error(id: id, GRPCStatus(.invalidArgument, "MALFORMED_REQUEST: \(error.message)"))
            return
        }
        callsInFlight += 1
        let me = LoopBound(self, loop: loop)
        let context = ServerContext(path: method.path, deadline: nil, metadata: metadata)
        let observer = api.callObserver
        let started = MonotonicClock.now()
        Task.immediate(executorPreference: loop) {
            let outcome: Result<JSONValue, GRPCStatus>
            do {
                outcome = .success(try method.response(try await method.handler(bytes, context)))
            } catch {
                outcome = .failure(GRPCStatus(error))
            }
            if let observer {
                let code: GRPCStatus.Code
                switch outcome {
                case .success: code = .ok
                case .failure(let s): code = s.code
                }
                observer(method.path, code, MonotonicClock.now() &- started)
            }
            me.execute { $0.answered(id: id, outcome) }
        }
    }

    private func answered(id: JSONValue?, _ outcome: Result<JSONValue, GRPCStatus>) {
        callsInFlight -= 1
        guard phase != .closed else { return }
        switch outcome {
        case .success(let response):
            reply((id.map { [("id", $0)] } ?? []) + [("response", response)])
        case .failure(let status):
            error(id: id, status)
        }
    }
}

/// The JSON text of the last few events delivered on one loop, by their protobuf bytes: an owner
/// encodes an event once and the same bytes go to every session following the channel, so the
/// sockets on a loop share one conversion (found by Scripts/bench-web: converting per socket held
/// a 1,000-socket channel to 60 changes/s). Loop-confined; an event is found by its bytes (the
/// same buffer compares at once), so a reused address can never return another event's text.
final class EventTextCache {
    private var entries: [(framed: [UInt8], text: [UInt8])] = []
    private var next = 0
    private static let size = 16
    /// (large pages, a channel's paged SNAPSHOT, are converted each time rather than kept)
    private static let largest = 64 * 1024

    func text(for framed: [UInt8], make: () -> [UInt8]?) -> [UInt8]? {
        for e in entries where e.framed == framed { return e.text }
        guard let t = make() else { return nil }
        guard framed.count <= Self.largest else { return t }
        if entries.count < Self.size {
            entries.append((framed, t))
        } else {
            entries[next] = (framed, t)
            next = (next + 1) % Self.size
        }
        return t
    }

    private static let byLoop = Mutex<[ObjectIdentifier: UncheckedCache]>([:])
    /// (@unchecked: each cache is used only on the loop it was made for)
    private struct UncheckedCache: @unchecked Sendable { let cache: EventTextCache }

    /// The cache of `loop` (made on first use; called on that loop).
    static func forLoop(_ loop: EventLoop) -> EventTextCache {
        byLoop.withLock { m in
            if let c = m[ObjectIdentifier(loop)] { return c.cache }
            let c = EventTextCache()
            m[ObjectIdentifier(loop)] = UncheckedCache(cache: c)
            return c
        }
    }
}
