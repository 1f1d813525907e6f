import CNGHTTP2
import EventLoop
import Glibc
import Synchronization

/// One request stream of a server connection. Loop-confined.
///
/// Its fields, and the connection's, are `@exclusivity(unchecked)`: they are read and written on
/// one thread, and no access to one of them is ever open while another starts (no field is passed
/// inout to, or changed by a mutating method of, anything that calls back into the connection;
/// nghttp2's callbacks run from calls that hold no such access). Checked, each field access was a
/// call into the runtime's access set: 5-7% of a Health/Check's CPU (`Scripts/profile health`).
/// (Until they were marked, the suites and the chaos runs exercised every one of these paths with
/// the checks on, and none ever trapped.)
final class ServerStream {
    let id: Int32
    /// The served method its `:path` names; nil for a path no method serves (kept in `unknownPath`).
    @exclusivity(unchecked) var route: Route? = nil
    @exclusivity(unchecked) var unknownPath = ""
    var path: String { route?.path ?? unknownPath }
    @exclusivity(unchecked) var isPost = false
    @exclusivity(unchecked) var isGRPC = false
    @exclusivity(unchecked) var unsupportedEncoding: String? = nil
    @exclusivity(unchecked) var timeout: UInt64? = nil
    /// When `timeout` runs out (monotonic ns), counted from the headers' arrival, as the deadline
    /// timer is: what the handler is told (`ServerContext.deadline`).
    @exclusivity(unchecked) var deadline: UInt64? = nil
    @exclusivity(unchecked) var badTimeout = false
    @exclusivity(unchecked) var metadata: [(String, String)] = []
    /// Decoded header bytes so far (RFC 9113's count); over the limit, nothing more is kept.
    @exclusivity(unchecked) var headerBytes = 0
    @exclusivity(unchecked) var headersTooLarge = false
    @exclusivity(unchecked) var deframer: MessageDeframer
    /// A unary or server-streaming call's request message (the first one), and how many came:
    /// more than one is refused, so only the first is kept (a list of them cost an allocation
    /// per call).
    @exclusivity(unchecked) var message: [UInt8]? = nil
    @exclusivity(unchecked) var messageCount = 0
    @exclusivity(unchecked) var requestComplete = false
    @exclusivity(unchecked) var dispatched = false
    /// When its headers began (monotonic ns; only kept for a server with a call observer).
    @exclusivity(unchecked) var startedAt: UInt64 = 0

    // response side
    @exclusivity(unchecked) var outbound = OutboundMessages()
    @exclusivity(unchecked) var responseSubmitted = false
    @exclusivity(unchecked) var status: GRPCStatus? = nil
    @exclusivity(unchecked) var task: Task<Void, Never>? = nil
    @exclusivity(unchecked) var writer: ServerStreamWriter? = nil
    /// A bidirectional call's request messages, handed to its handler as they arrive.
    @exclusivity(unchecked) var requests: RequestMessages? = nil
    @exclusivity(unchecked) var deadlineTimer: TimerID? = nil
    /// Ends the request if its message has not fully arrived in time (`requestTimeout`).
    @exclusivity(unchecked) var requestTimer: TimerID? = nil
    /// A unary request waiting for a handler slot of its connection.
    @exclusivity(unchecked) var waitingForTurn = false
    /// The server's `refuse` check passed.
    @exclusivity(unchecked) var checked = false
    /// Counted among its connection's running unary handlers.
    @exclusivity(unchecked) var countedUnary = false
    /// Its unary handler has ended (its answer, or failure, was taken).
    @exclusivity(unchecked) var handlerEnded = false

    init(id: Int32, maxMessageSize: Int) {
        self.id = id
        self.deframer = MessageDeframer(maxMessageSize: maxMessageSize)
    }

    var hasOutbound: Bool { !outbound.isEmpty }
}

/// The streams of one connection whose writers have messages waiting, collected from the threads
/// that fill them: one hop to the connection's loop drains them all. (A channel event for 125
/// subscribers on one connection is one hop and one wake-up, not 125: the hops were 9% of a
/// fan-out profile.)
final class PendingDrains: Sendable {
    private let state = Mutex<(ids: [Int32], scheduled: Bool)>(([], false))

    /// Notes that `id` has messages waiting; true when the caller must schedule the drain (none
    /// is scheduled yet).
    func add(_ id: Int32) -> Bool {
        state.withLock { s in
            s.ids.append(id)
            defer { s.scheduled = true }
            return !s.scheduled
        }
    }

    /// Loop side: swaps the streams to drain, in the order they asked, into `ids` (empty, its
    /// storage kept from the last time: the two lists trade buffers instead of growing a new one
    /// for every hand-over); the next `add` schedules anew.
    func take(swappingWith ids: inout [Int32]) {
        state.withLock { s in
            s.scheduled = false
            swap(&s.ids, &ids)
        }
    }
}

/// The server side of one client connection: turns request streams into handler calls and their
/// results into responses. Loop-confined.
final class ServerConnection: HTTP2Connection {
    private let core: ServerCore
    @exclusivity(unchecked) private var streams: [Int32: ServerStream] = [:]
    @exclusivity(unchecked) private var draining = false
    var activeStreamCount: Int { streams.count }
    /// The client's first SETTINGS frame arrived (the handshake is done).
    @exclusivity(unchecked) private var handshakeDone = false
    /// Response bytes on this connection's streams that the client has not taken yet.
    @exclusivity(unchecked) private var queuedBytes = 0
    /// Unary handlers running for this connection, and requests waiting for one to end.
    @exclusivity(unchecked) private var runningUnary = 0
    @exclusivity(unchecked) private var waitingUnary: [Int32] = []
    /// Streams whose writers have messages waiting (they are filled from any thread).
    private let pendingDrains = PendingDrains()
    /// The list `pendingDrains` hands over into (empty between drains; see `PendingDrains.take`).
    @exclusivity(unchecked) private var drainingIDs: [Int32] = []

    /// Counts bytes queued for the client; closes the connection past the budget.
    private func queued(_ n: Int) {
        queuedBytes += n
        let budget = core.configuration.maxQueuedBytesPerConnection
        if queuedBytes > budget {
            goAwayAndClose(reason: "the client does not read: \(queuedBytes) bytes queued (budget \(budget))")
        }
    }

    /// When a connection with no call in progress is closed (one timer per connection).
    private lazy var idleTimeout = IdleTimeoutStateMachine(timeout: core.configuration.idleTimeout)
    @exclusivity(unchecked) private var idleTimer: TimerID?
    @exclusivity(unchecked) private var handshakeTimer: TimerID?

    /// Handshake timeout now, idle timeout from now (no stream yet).
    func armHandshakeAndIdleTimers() {
        let handshake = core.configuration.handshakeTimeout
        // (strong captures, cancelled in `connectionClosed`: a weak one would give the connection
        // a side table and put every retain and release of it on the runtime's slow path)
        handshakeTimer = loop.scheduleTimer(after: handshake) { [self] in
            handshakeTimer = nil
            guard !handshakeDone, !isClosed else { return }
            close(reason: "no HTTP/2 handshake within \(handshake / 1_000_000) ms")
        }
        becameIdle()
    }

    /// No call in progress any more: the idle timer runs (armed if it is not).
    private func becameIdle() {
        if let at = idleTimeout.becameIdle(now: MonotonicClock.now()) { armIdleTimer(at: at) }
    }

    private func armIdleTimer(at deadline: UInt64) {
        idleTimer = loop.scheduleTimer(at: deadline) { [self] in
            idleTimer = nil
            guard !isClosed else { return }
            switch idleTimeout.timerFired(now: MonotonicClock.now()) {
            case .none:
                break
            case .rearm(let at):
                armIdleTimer(at: at)
            case .close:
                // (a draining connection is closed by its GOAWAY's own timers, not this one)
                if !draining { goAwayAndClose(reason: "idle for \(idleTimeout.timeout / 1_000_000_000) s") }
            }
        }
    }

    init(fd: Int32, loop: EventLoop, core: ServerCore) {
        self.core = core
        super.init(fd: fd, loop: loop, settings: core.configuration.http2)
    }

    override func connectionClosed(reason: String) {
        loop.cancelTimer(&idleTimer)
        loop.cancelTimer(&handshakeTimer)
        for (_, s) in streams { abandon(s, GRPCStatus(.unavailable, "connection closed: \(reason)")) }
        streams.removeAll()
        core.connectionClosed(self)
    }

    // MARK: nghttp2 callbacks

    override func onBeginHeaders(streamID: Int32) -> Int32 {
        if streams.isEmpty { idleTimeout.becameBusy() }
        if streams[streamID] == nil {
            let stream = ServerStream(id: streamID, maxMessageSize: core.configuration.maxReceiveMessageSize)
            if core.configuration.callObserver != nil { stream.startedAt = MonotonicClock.now() }
            streams[streamID] = stream
            // nghttp2 keeps a pointer to the stream (owned by `streams`) for fast lookups.
            nghttp2_session_set_stream_user_data(session, streamID, Unmanaged.passUnretained(stream).toOpaque())
        }
        return 0
    }

    /// Where nghttp2 puts the stream's DATA among the connection's (RFC 9218 urgency,
    /// incremental: streams of one urgency take turns by bytes sent, as under RFC 7540's equal
    /// weights; not incremental, the oldest stream with data would always go first and a
    /// congested connection's newer streams would wait for every older backlog), whatever a
    /// `priority` header of the client's says. (Without SETTINGS_NO_RFC7540_PRIORITIES sent,
    /// nghttp2 does nothing with it.)
    private func schedule(_ streamID: Int32, _ urgency: UInt32) {
        guard !settings.rfc7540Priorities, let session else { return }
        var priority = nghttp2_extpri(urgency: urgency, inc: 1)
        nghttp2_session_change_extpri_stream_priority(session, streamID, &priority, 1)
    }

    /// The open stream with this id, found through nghttp2's stream user data (no hashing).
    @inline(__always)
    private func stream(_ id: Int32) -> ServerStream? {
        guard let session, let p = nghttp2_session_get_stream_user_data(session, id) else { return nil }
        return Unmanaged<ServerStream>.fromOpaque(p).takeUnretainedValue()  // owned by `streams`
    }

    override func onHeader(streamID: Int32, category: UInt32, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) -> Int32 {
        guard let s = stream(streamID), category == NGHTTP2_HCAT_REQUEST.rawValue else { return 0 }
        s.headerBytes += name.count + value.count + 32
        if s.headerBytes > Int(settings.maxHeaderListSize) {
            s.headersTooLarge = true
            s.metadata = []
            return 0
        }
        if name.first == UInt8(ascii: ":") {
            if bytesEqual(name, ":path") {
                s.route = core.routes.find(value)
                if let route = s.route { schedule(streamID, route.method.sendUrgency) }
                s.unknownPath = s.route == nil ? String(decoding: value, as: UTF8.self) : ""
            } else if bytesEqual(name, ":method") {
                s.isPost = bytesEqual(value, "POST")
            }
            return 0
        }
        if bytesEqual(name, "content-type") {
            let grpc: StaticString = "application/grpc"
            s.isGRPC = value.count >= grpc.utf8CodeUnitCount
                && memcmp(value.baseAddress!, grpc.utf8Start, grpc.utf8CodeUnitCount) == 0
                && (value.count == grpc.utf8CodeUnitCount || value[grpc.utf8CodeUnitCount] == UInt8(ascii: "+") || value[grpc.utf8CodeUnitCount] == UInt8(ascii: ";"))
        } else if bytesEqual(name, "grpc-timeout") {
            if let t = GRPCTimeout.parse(value) { s.timeout = t } else { s.badTimeout = true }
        } else if bytesEqual(name, "grpc-encoding") {
            if !bytesEqual(value, "identity") { s.unsupportedEncoding = String(decoding: value, as: UTF8.self) }
        } else if bytesEqual(name, "te") || bytesEqual(name, "user-agent") || bytesEqual(name, "grpc-accept-encoding") {
            // framing headers: nothing to keep
        } else if s.metadata.count < settings.maxMetadataEntries {
            s.metadata.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
        }
        return 0
    }

    override func onDataChunk(streamID: Int32, data: UnsafeBufferPointer<UInt8>) -> Int32 {
        // Request bodies are bounded by the message size limit: give the window back at once.
        nghttp2_session_consume(session, streamID, data.count)
        guard let s = stream(streamID), s.status == nil else { return 0 }
        let failure: MessageDeframer.Failure?
        if let requests = s.requests {
            var overflow = false
            failure = s.deframer.append(data) { m in if !requests.push(m) { overflow = true } }
            if overflow {
                finish(s, GRPCStatus(.resourceExhausted, "TOO_MANY_MESSAGES: more than \(requests.limit) request messages (or \(requests.byteLimit) bytes) wait unread"))
                return 0
            }
        } else {
            failure = s.deframer.append(data) { m in
                if s.messageCount == 0 { s.message = m }
                s.messageCount += 1
            }
        }
        if let failure {
            switch failure {
            case .tooLarge(let length, let limit):
                finish(s, GRPCStatus(.resourceExhausted, "MESSAGE_TOO_LARGE: request message of \(length) bytes exceeds the limit of \(limit) bytes"))
            case .compressed:
                finish(s, GRPCStatus(.unimplemented, "COMPRESSION_UNSUPPORTED: compressed messages are not supported; send identity encoding"))
            case .badFlag(let f):
                finish(s, GRPCStatus(.internal, "BAD_FRAME: message flag \(f) is neither 0 nor 1"))
            }
        }
        return 0
    }

    override func onFrameReceived(type: UInt8, flags: UInt8, streamID: Int32, headersCategory: UInt32) -> Int32 {
        if type == UInt8(NGHTTP2_SETTINGS.rawValue) { handshakeDone = true }
        let endStream = flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
        if type == UInt8(NGHTTP2_HEADERS.rawValue), headersCategory == NGHTTP2_HCAT_REQUEST.rawValue, let s = stream(streamID) {
            requestHeadersDone(s)
            if s.status == nil, case .bidiStreaming = s.route?.method {
                // (a bidirectional call starts now; its messages follow as they come)
                dispatch(s)
                if endStream { s.requestComplete = true; s.requests?.end(nil) }
                return 0
            }
            if endStream, s.status == nil { s.requestComplete = true; dispatch(s) }
            // (its timer is armed once this read's bytes are all handled, if the message is still
            // missing then: a request whose message came in the same read, the usual case, costs
            // no timer)
            if !s.requestComplete, s.status == nil { awaitingMessage.append(s.id) }
        } else if (type == UInt8(NGHTTP2_DATA.rawValue) || type == UInt8(NGHTTP2_HEADERS.rawValue)), endStream,
                  let s = stream(streamID), s.status == nil, let requests = s.requests {
            s.requestComplete = true
            guard s.deframer.isIdle else {
                finish(s, GRPCStatus(.internal, "BAD_REQUEST_STREAM: the request stream ended inside a message"))
                return 0
            }
            requests.end(nil)
        } else if type == UInt8(NGHTTP2_DATA.rawValue), endStream, let s = stream(streamID), s.status == nil {
            s.requestComplete = true
            loop.cancelTimer(&s.requestTimer)
            dispatch(s)
        } else if type == UInt8(NGHTTP2_HEADERS.rawValue), endStream, let s = stream(streamID), s.status == nil {
            // trailers from the client end the request too
            s.requestComplete = true
            loop.cancelTimer(&s.requestTimer)
            dispatch(s)
        }
        return 0
    }

    override func onStreamClose(streamID: Int32, errorCode: UInt32) -> Int32 {
        guard let s = streams.removeValue(forKey: streamID) else { return 0 }
        queuedBytes -= s.outbound.remainingBytes
        s.waitingForTurn = false
        unaryEnded(s)
        if streams.isEmpty && !draining { becameIdle() }
        if s.status == nil || s.task != nil {
            abandon(s, GRPCStatus(.cancelled, "the client cancelled the call"))  // (cancels its timers)
        } else {
            loop.cancelTimer(&s.requestTimer)
            loop.cancelTimer(&s.deadlineTimer)
        }
        core.streamClosed(on: self)
        return 0
    }

    /// The stream ended before its handler: cancel what runs for it.
    private func abandon(_ s: ServerStream, _ status: GRPCStatus) {
        if s.status == nil {
            s.status = status
            observe(s, status)
        }
        s.requests?.end(status)
        s.task?.cancel()
        s.task = nil
        s.writer?.close(status)
        loop.cancelTimer(&s.deadlineTimer)
        loop.cancelTimer(&s.requestTimer)
    }

    override func readData(streamID: Int32, into buffer: UnsafeMutablePointer<UInt8>, length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard let s = stream(streamID) else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
        let written = s.outbound.copy(into: buffer, length: length)
        if written > 0 {
            queuedBytes -= written
            s.writer?.drained(written)
        }
        if !s.hasOutbound {
            if let status = s.status {
                flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue | NGHTTP2_DATA_FLAG_NO_END_STREAM.rawValue
                submitTrailers(s, status)
            } else if written == 0 {
                return Int(NGHTTP2_ERR_DEFERRED.rawValue)
            }
        }
        return written
    }

    // MARK: Requests

    /// Requests whose headers came in this read without their message.
    @exclusivity(unchecked) private var awaitingMessage: [Int32] = []

    /// This read's bytes are handled: requests still missing their message get their timer.
    override func inputBatchEnded() {
        guard !awaitingMessage.isEmpty else { return }
        for id in awaitingMessage {
            if let s = stream(id), !s.requestComplete, s.status == nil, s.requestTimer == nil { armRequestTimer(s) }
        }
        awaitingMessage.removeAll(keepingCapacity: true)
    }

    /// The request's message must arrive within `requestTimeout` of its headers.
    private func armRequestTimer(_ s: ServerStream) {
        let id = s.id
        let limit = core.configuration.requestTimeout
        // (a strong capture, cancelled when the stream closes or is abandoned: see
        // `armHandshakeAndIdleTimers`)
        s.requestTimer = loop.scheduleTimer(after: limit) { [self] in
            guard let s = streams[id] else { return }
            s.requestTimer = nil
            guard !s.requestComplete, s.status == nil else { return }
            finish(s, GRPCStatus(.deadlineExceeded, "REQUEST_TIMEOUT: the request's message did not arrive within \(limit / 1_000_000) ms"))
        }
    }

    private func requestHeadersDone(_ s: ServerStream) {
        if !s.isPost {
            submitHTTPError(s, status: "405")
            return
        }
        if !s.isGRPC {
            submitHTTPError(s, status: "415")
            return
        }
        if let enc = s.unsupportedEncoding {
            finish(s, GRPCStatus(.unimplemented, "COMPRESSION_UNSUPPORTED: grpc-encoding \(enc) is not supported; use identity"))
            return
        }
        if s.badTimeout {
            finish(s, GRPCStatus(.invalidArgument, "BAD_TIMEOUT: grpc-timeout header is malformed"))
            return
        }
        if s.headersTooLarge {
            finish(s, GRPCStatus(.resourceExhausted, "HEADERS_TOO_LARGE: the request's headers exceed \(settings.maxHeaderListSize) bytes"))
            return
        }
        if let refuseEarly = core.configuration.refuseEarly, let refusal = refuseEarly(s.path, s.metadata) {
            finish(s, refusal)
            return
        }
        if draining {
            finish(s, GRPCStatus(.unavailable, "SHUTTING_DOWN: the server is shutting down; retry on another node"))
            return
        }
        if let timeout = s.timeout {
            let id = s.id
            let (at, overflow) = MonotonicClock.now().addingReportingOverflow(timeout)
            s.deadline = overflow ? .max : at  // (a huge grpc-timeout is no deadline, not one in the past)
            s.deadlineTimer = loop.scheduleTimer(after: timeout) { [self] in deadlineExpired(streamID: id) }
        }
    }

    private func deadlineExpired(streamID: Int32) {
        guard let s = stream(streamID) else { return }
        s.deadlineTimer = nil
        guard s.status == nil else { return }
        let status = GRPCStatus(.deadlineExceeded, "DEADLINE_EXCEEDED: the call's deadline passed")
        s.task?.cancel()
        s.task = nil
        s.writer?.close(status)
        finish(s, status)
    }

    override func received(bytes: Int) { core.counter.received(bytes: bytes) }
    override func releasedIdleBuffers(bytes: Int) { core.counter.released(idleBytes: bytes) }

    private func dispatch(_ s: ServerStream) {
        guard !s.dispatched, s.status == nil else { return }
        s.dispatched = true
        if !s.checked { core.counter.requested() }
        guard let method = s.route?.method else {
            finish(s, GRPCStatus(.unimplemented, "UNIMPLEMENTED: method \(s.path) is not served here"))
            return
        }
        if case .bidiStreaming(let handler) = method {
            startBidi(s, handler)
            return
        }
        guard s.deframer.isIdle, s.messageCount == 1, let request = s.message else {
            let what = s.messageCount == 0 ? "no request message" : "\(s.messageCount) request messages"
            finish(s, GRPCStatus(.internal, "BAD_REQUEST_STREAM: a unary or server-streaming call takes exactly one request message, got \(what)"))
            return
        }
        s.message = nil
        if !s.checked, let refuse = core.configuration.refuse, let refusal = refuse(s.path, s.metadata, request) {
            finish(s, refusal)
            return
        }
        s.checked = true  // (once: a replay window must not see a request waiting for its turn twice)
        let context = self.context(of: s)
        let id = s.id
        switch method {
        case .unaryInline(let handler):
            do {
                respond(s, try handler(request, context))
                finish(s, .ok)
            } catch {
                finish(s, GRPCStatus(error))
            }
        case .unary, .unaryStaged:
            if runningUnary >= core.configuration.maxConcurrentUnaryPerConnection {
                // (its turn comes when a running one ends; the request is kept meanwhile)
                s.message = request
                s.dispatched = false
                s.waitingForTurn = true
                waitingUnary.append(id)
                return
            }
            runningUnary += 1
            s.countedUnary = true
            switch method {
            case .unaryStaged(let handler):
                // (its first part runs here, on this loop; an answer that needed no wait ends the
                // call as a task that never suspended would, with no task made)
                let outcome: Staged<[UInt8], any Error>
                do { outcome = try handler(request, context) } catch {
                    unaryCompleted(streamID: id, .failure(error))
                    return
                }
                carryOn(id, outcome)
            case .unary(let handler):
                startUnaryTask(id) { try await handler(request, context) }
            default:
                break
            }
        case .serverStreaming(let handler):
            startStreaming(s) { writer in try await handler(request, context, writer) }
        case .bidiStreaming:
            break  // (started when its headers arrived: `startBidi`)
        }
    }

    /// Carries a staged unary call on from its outcome so far: answers it, hands it to the loop
    /// its attempt must run on (whose answer comes back here as a plain job: no task, no actor
    /// hop), or runs its rest as a task. The rest runs even when the client has gone meanwhile
    /// (it may have a change to finish, as a cancelled task's does).
    private func carryOn(_ id: Int32, _ outcome: Staged<[UInt8], any Error>, handedOff: Bool = false) {
        switch outcome {
        case .now(let bytes):
            unaryCompleted(streamID: id, .success(bytes))
        case .onLoop(let other, let attempt) where !handedOff:
            let me = LoopBound(self, loop: loop)
            let sent = other.execute {
                let next: Staged<[UInt8], any Error>
                do { next = try attempt() } catch {
                    me.execute { $0.unaryCompleted(streamID: id, .failure(error)) }
                    return
                }
                me.execute { $0.carryOn(id, next, handedOff: true) }
            }
            if !sent {
                // (that loop has stopped: the node is going down, and what the call needs with it)
                unaryCompleted(streamID: id, .failure(GRPCStatus(.unavailable, "SHUTTING_DOWN: this node is shutting down; retry on another node")))
            }
        case .onLoop:
            // (an attempt that asks to move again is not moved twice: it runs as a task)
            startUnaryTask(id) { try await outcome.value }
        case .later(let rest):
            startUnaryTask(id, rest)
        }
    }

    /// Runs a unary call's handler (or its rest) as a task.
    private func startUnaryTask(_ id: Int32, _ rest: @escaping @Sendable () async throws -> [UInt8]) {
        let me = LoopBound(self, loop: loop)
        // Starts on this thread and runs until it first waits, and prefers this loop after
        // that: calls to actors pinned to this loop never change threads. Its answer is taken
        // at once when it ends on this loop (and so, when it never had to wait, before
        // `Task.immediate` returns: then there is no task left to keep).
        let task = Task.immediate(executorPreference: loop) {
            let result: Result<[UInt8], Error>
            do { result = .success(try await rest()) } catch { result = .failure(error) }
            me.run { $0.unaryCompleted(streamID: id, result) }
        }
        guard let s = streams[id] else {
            task.cancel()  // (its client has gone)
            return
        }
        if !s.handlerEnded {
            // (the call may have been abandoned while the handler runs: it is told at once)
            if s.status == nil { s.task = task } else { task.cancel() }
        }
    }

    private func context(of s: ServerStream) -> ServerContext {
        ServerContext(path: s.path, deadline: s.deadline, metadata: s.metadata)
    }

    /// Starts a bidirectional call's handler (its messages reach it through `s.requests`).
    private func startBidi(_ s: ServerStream, _ handler: @escaping @Sendable (RequestMessages, ServerContext, ServerStreamWriter) async throws -> Void) {
        let context = self.context(of: s)
        let requests = RequestMessages()
        s.requests = requests
        startStreaming(s) { writer in try await handler(requests, context, writer) }
    }

    /// Runs a streaming handler with the stream's writer, on this loop's executor; its end (or
    /// error) ends the stream.
    private func startStreaming(_ s: ServerStream, _ body: @escaping @Sendable (ServerStreamWriter) async throws -> Void) {
        let me = LoopBound(self, loop: loop)
        let id = s.id
        let drains = pendingDrains
        // (made once per stream: a closure built at each hand-over cost two allocations a hop)
        let drainOnLoop: @Sendable () -> Void = { me.value.drainPendingWriters() }
        let writer = ServerStreamWriter(highWaterMark: core.configuration.streamHighWaterMark,
                                        lowWaterMark: core.configuration.streamLowWaterMark,
                                        coalescing: true) {
            if drains.add(id) { me.loop.execute(drainOnLoop) }
        }
        s.writer = writer
        s.task = Task.immediate(executorPreference: loop) {
            let status: GRPCStatus
            do {
                try await body(writer)
                status = .ok
            } catch {
                status = GRPCStatus(error)
            }
            me.execute { $0.streamingCompleted(streamID: id, status) }
        }
    }

    /// The waiting requests are being started further up the stack.
    @exclusivity(unchecked) private var startingWaiting = false

    /// A unary handler ended (answered, failed, or its stream went away): the next waiting runs.
    private func unaryEnded(_ s: ServerStream) {
        guard s.countedUnary else { return }
        s.countedUnary = false
        runningUnary -= 1
        // (a started request may answer at once and end here again: the loop below, already on
        // the stack, starts the next one, so a long queue is started in a loop, not a recursion)
        guard !startingWaiting else { return }
        startingWaiting = true
        defer { startingWaiting = false }
        while runningUnary < core.configuration.maxConcurrentUnaryPerConnection, !waitingUnary.isEmpty {
            let next = waitingUnary.removeFirst()
            guard let w = streams[next], w.waitingForTurn, w.status == nil else { continue }
            w.waitingForTurn = false
            dispatch(w)
        }
    }

    private func unaryCompleted(streamID: Int32, _ result: Result<[UInt8], Error>) {
        if let s = streams[streamID] {
            s.handlerEnded = true
            unaryEnded(s)
        }
        guard let s = stream(streamID), s.status == nil else { return }
        s.task = nil
        switch result {
        case .success(let bytes):
            respond(s, bytes)
            finish(s, .ok)
        case .failure(let error):
            finish(s, GRPCStatus(error))
        }
    }

    /// Drains every stream whose writer asked since the last time.
    private func drainPendingWriters() {
        var ids = drainingIDs
        drainingIDs = []
        pendingDrains.take(swappingWith: &ids)
        for id in ids { drainWriter(streamID: id) }
        ids.removeAll(keepingCapacity: true)
        drainingIDs = ids
    }

    /// Moves what a stream's writer queued onto the stream, in one go.
    private func drainWriter(streamID: Int32) {
        guard let s = stream(streamID), s.status == nil, let writer = s.writer else { return }
        let n = s.outbound.take(from: writer)
        guard n > 0 else { return }
        queued(n)
        guard !isClosed else { return }
        submitOrResume(s)
    }

    private func streamingCompleted(streamID: Int32, _ status: GRPCStatus) {
        guard let s = stream(streamID), s.status == nil else { return }
        s.task = nil
        s.writer?.close(GRPCStatus(.cancelled, "the call has ended"))
        finish(s, status)
    }

    // MARK: Responses

    private static let dataProvider: nghttp2_data_provider = {
        var p = nghttp2_data_provider()
        p.read_callback = NGHTTP2Callbacks.readCallback
        return p
    }()

    /// Queues framed message bytes on the stream's response.
    private func respond(_ s: ServerStream, _ framed: [UInt8]) {
        s.outbound.append(framed)
        queued(framed.count)
        guard !isClosed else { return }
        submitOrResume(s)
    }

    /// Asks nghttp2 to send what the stream's queue holds: the response's headers first, if not
    /// sent yet, then its data as the flow-control windows allow.
    private func submitOrResume(_ s: ServerStream) {
        if !s.responseSubmitted {
            s.responseSubmitted = true
            var provider = Self.dataProvider
            let h = StaticHeaders.grpcResponse
            nghttp2_submit_response(session, s.id, h.nv, h.count, &provider)
        } else {
            nghttp2_session_resume_data(session, s.id)
        }
        markDirty()
    }

    /// Ends the stream with `status` once its queued messages are out.
    private func finish(_ s: ServerStream, _ status: GRPCStatus) {
        guard s.status == nil else { return }
        s.status = status
        observe(s, status)
        if let requests = s.requests {
            requests.end(status.code == .ok ? GRPCStatus(.cancelled, "the call has ended") : status)
            s.task?.cancel()
        }
        loop.cancelTimer(&s.deadlineTimer)
        if !s.responseSubmitted {
            // Trailers-Only: one HEADERS frame with the status and END_STREAM.
            s.responseSubmitted = true
            var headers = HeaderBlock()
            headers.add(":status", "200")
            headers.add("content-type", "application/grpc")
            headers.add("grpc-status", String(status.code.rawValue))
            if !status.message.isEmpty { headers.add("grpc-message", bytes: PercentEncoding.encode(status.message)) }
            _ = headers.withNV { nv, n in nghttp2_submit_response(session, s.id, nv, n, nil) }
        } else {
            nghttp2_session_resume_data(session, s.id)
        }
        markDirty()
    }

    /// Tells the server's call observer that a call ended.
    private func observe(_ s: ServerStream, _ status: GRPCStatus) {
        guard s.isGRPC, let observer = s.route == nil ? core.routes.unknownObserver : s.route?.observe else { return }
        observer(status.code, MonotonicClock.now() &- s.startedAt)
    }

    private func submitTrailers(_ s: ServerStream, _ status: GRPCStatus) {
        if status.code == .ok && status.message.isEmpty {
            nghttp2_submit_trailer(session, s.id, StaticHeaders.okTrailers.nv, StaticHeaders.okTrailers.count)
            return
        }
        var headers = HeaderBlock()
        headers.add("grpc-status", String(status.code.rawValue))
        if !status.message.isEmpty { headers.add("grpc-message", bytes: PercentEncoding.encode(status.message)) }
        _ = headers.withNV { nv, n in nghttp2_submit_trailer(session, s.id, nv, n) }
    }

    private func submitHTTPError(_ s: ServerStream, status: String) {
        s.status = GRPCStatus(.internal, "HTTP \(status)")
        s.responseSubmitted = true
        var headers = HeaderBlock()
        headers.add(":status", status)
        _ = headers.withNV { nv, n in nghttp2_submit_response(session, s.id, nv, n, nil) }
        markDirty()
    }

    // MARK: Shutdown

    /// Tells the client to stop opening streams: a GOAWAY after the streams already started.
    func beginDraining() {
        guard !isClosed, !draining else { return }
        draining = true
        nghttp2_submit_shutdown_notice(session)
        markDirty()
        loop.scheduleTimer(after: 50_000_000) { [self] in
            guard !self.isClosed else { return }
            nghttp2_submit_goaway(self.session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nghttp2_session_get_last_proc_stream_id(self.session), UInt32(NGHTTP2_NO_ERROR.rawValue), nil, 0)
            self.markDirty()
            if self.streams.isEmpty { self.closeAfterFlush() }
        }
    }

    /// Ends streams still open at the end of the grace period.
    func endRemainingStreams() {
        for (_, s) in streams where s.status == nil {
            s.task?.cancel()
            s.task = nil
            s.writer?.close(GRPCStatus(.unavailable, "server shutting down"))
            finish(s, GRPCStatus(.unavailable, "SHUTTING_DOWN: the server is shutting down; reconnect to another node"))
        }
        loop.scheduleTimer(after: 100_000_000) { [self] in close(reason: "server shut down") }
    }

    private func closeAfterFlush() {
        flush()
        close(reason: "drained")
    }

    /// A GOAWAY (no error) and the close: the client reconnects when it needs to.
    private func goAwayAndClose(reason: String) {
        guard !isClosed else { return }
        nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nghttp2_session_get_last_proc_stream_id(session), UInt32(NGHTTP2_NO_ERROR.rawValue), nil, 0)
        flush()
        // (asked from inside nghttp2's callbacks, both wait for it to return: the GOAWAY is then
        // flushed first)
        close(reason: reason, flushFirst: true)
    }
}
