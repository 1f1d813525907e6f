import CNGHTTP2
import CSystemShim
import EventLoop
import Glibc
import Synchronization

/// Where a call's response goes. Loop side of a client call.
final class ClientCall {
    enum Sink {
        case unary(CheckedContinuation<[UInt8], Error>)
        case stream(ResponseStreamState)
        /// Messages go to a callback on the loop thread; the window is credited at once.
        case callback(@Sendable ([UInt8]) -> Void, @Sendable (GRPCStatus) -> Void)
    }

    let path: String
    let body: [UInt8]
    var bodyOffset = 0
    let timeout: UInt64?
    let handle: CallHandle
    var sink: Sink?
    var deframer: MessageDeframer
    var message: [UInt8]? = nil
    var extraMessages = 0
    var httpStatus = 0
    var grpcStatus: Int? = nil
    var grpcMessage = ""
    var streamID: Int32 = 0
    var deadlineTimer: TimerID? = nil
    var failure: GRPCStatus? = nil
    /// Times the stream was refused before the server saw it (retried transparently).
    var refusals = 0

    init(path: String, body: [UInt8], timeout: UInt64?, handle: CallHandle, sink: Sink, maxMessageSize: Int) {
        self.path = path
        self.body = body
        self.timeout = timeout
        self.handle = handle
        self.sink = sink
        self.deframer = MessageDeframer(maxMessageSize: maxMessageSize)
    }

    /// Delivers the final outcome once.
    func complete(_ status: GRPCStatus) {
        guard let sink else { return }
        self.sink = nil
        switch sink {
        case .unary(let c):
            if status.code == .ok {
                if let message, extraMessages == 0 {
                    c.resume(returning: message)
                } else {
                    c.resume(throwing: GRPCStatus(.internal, "the server sent \(message == nil ? 0 : 1 + extraMessages) messages for a unary call"))
                }
            } else {
                c.resume(throwing: status)
            }
        case .stream(let s):
            s.finish(status)
        case .callback(_, let done):
            done(status)
        }
    }
}

/// Lets another thread cancel a call whose stream lives on a loop.
final class CallHandle: Sendable {
    private let cancelled = Atomic<Bool>(false)
    var isCancelled: Bool { cancelled.load(ordering: .relaxed) }
    func cancel() { cancelled.store(true, ordering: .relaxed) }
}

/// The client side of one HTTP/2 connection to a server. Loop-confined.
final class ClientConnection: HTTP2Connection {
    enum State { case connecting, ready, closed }
    private(set) var state = State.connecting
    private(set) var goawayReceived = false
    private var pending: [ClientCall] = []
    private var calls: [Int32: ClientCall] = [:]
    private let authority: String
    private let maxMessageSize: Int
    var onClosed: (() -> Void)?

    private let metadata: [(String, String)]
    private let callMetadata: (@Sendable (String, ArraySlice<UInt8>) -> [(String, String)])?

    init(fd: Int32, loop: EventLoop, settings: HTTP2Settings, authority: String, maxMessageSize: Int, metadata: [(String, String)] = [],
         callMetadata: (@Sendable (String, ArraySlice<UInt8>) -> [(String, String)])? = nil) {
        self.metadata = metadata
        self.callMetadata = callMetadata
        self.authority = authority
        self.maxMessageSize = maxMessageSize
        super.init(fd: fd, loop: loop, settings: settings)
        loop.register(fd: fd, events: UInt32(EPOLLOUT.rawValue), handler: self)
    }

    private var connectTimer: TimerID?

    /// Gives up on a connect that has not finished within `timeout`: its pending calls fail
    /// (UNAVAILABLE), and the next call connects afresh. Without it a connect whose SYN was lost
    /// (a partition that has since healed) waits for the kernel's retransmission, 1 s, then 3 s,
    /// then 7 s after it started, and every call meanwhile queues behind it.
    func armConnectTimeout(_ timeout: UInt64) {
        // (a strong capture, cancelled once the connect finishes: a weak one would give the
        // connection a side table and put every retain and release of it on the slow path)
        connectTimer = loop.scheduleTimer(after: timeout) { [self] in
            connectTimer = nil
            guard state == .connecting else { return }
            loop.unregister(fd: fd)
            Glibc.close(fd)
            state = .closed
            failAll(GRPCStatus(.unavailable, "CONNECT_FAILED: no answer from \(authority) within \(timeout / 1_000_000) ms"))
            onClosed?()
        }
    }

    /// Accepts new calls (not closed, not told to go away).
    var isUsable: Bool { state != .closed && !goawayReceived }
    var activeCalls: Int { calls.count + pending.count }

    override func handleEvents(_ events: UInt32) {
        guard state == .connecting else {
            super.handleEvents(events)
            return
        }
        let err = Sockets.pendingError(fd)
        loop.unregister(fd: fd)
        if let t = connectTimer {
            loop.cancelTimer(t)
            connectTimer = nil
        }
        if err != 0 || events & (UInt32(EPOLLERR.rawValue) | UInt32(EPOLLHUP.rawValue)) != 0 {
            state = .closed
            Glibc.close(fd)
            let status = GRPCStatus(.unavailable, "CONNECT_FAILED: cannot connect to \(authority): \(String(cString: strerror(err == 0 ? ECONNREFUSED : err)))")
            failAll(status)
            onClosed?()
            return
        }
        state = .ready
        start(server: false)
        let queued = pending
        pending = []
        for c in queued { submit(c) }
    }

    override func connectionClosed(reason: String) {
        loop.cancelTimer(&connectTimer)  // (closed while connecting)
        state = .closed
        failAll(GRPCStatus(.unavailable, "CONNECTION_LOST: connection to \(authority) closed: \(reason)"))
        onClosed?()
    }

    private func failAll(_ status: GRPCStatus) {
        let all = pending + Array(calls.values)
        pending = []
        calls = [:]
        for c in all {
            if let t = c.deadlineTimer { loop.cancelTimer(t) }
            c.complete(status)
        }
    }

    // MARK: Calls

    func start(_ call: ClientCall) {
        if call.handle.isCancelled {
            call.complete(GRPCStatus(.cancelled, "CANCELLED: the call was cancelled"))
            return
        }
        if let timeout = call.timeout {
            // Strong captures: the timer is cancelled whenever the call ends first. (A weak
            // reference would move the connection's refcount to a side table: slower retains.)
            call.deadlineTimer = loop.scheduleTimer(after: timeout) { [self] in
                call.deadlineTimer = nil
                self.fail(call, GRPCStatus(.deadlineExceeded, "DEADLINE_EXCEEDED: no answer within the deadline"))
            }
        }
        switch state {
        case .connecting: pending.append(call)
        case .ready: submit(call)
        case .closed: call.complete(GRPCStatus(.unavailable, "CONNECTION_LOST: connection to \(authority) is closed"))
        }
    }

    private static let dataProvider: nghttp2_data_provider = {
        var p = nghttp2_data_provider()
        p.read_callback = NGHTTP2Callbacks.readCallback
        return p
    }()

    private func submit(_ call: ClientCall) {
        if call.sink == nil { return }  // already failed (deadline while connecting)
        var headers = HeaderBlock()
        headers.add(":method", "POST")
        headers.add(":scheme", tls == nil ? "http" : "https")
        headers.add(":path", call.path)
        headers.add(":authority", authority)
        headers.add("content-type", "application/grpc")
        headers.add("te", "trailers")
        headers.add("user-agent", "presenced-swift/0.1")
        if let t = call.timeout { headers.add("grpc-timeout", GRPCTimeout.encode(nanoseconds: t)) }
        for (name, value) in metadata { headers.add(dynamic: name, value) }
        if let callMetadata {
            // (computed now, at each attempt: a signature carries the time it is sent at)
            for (name, value) in callMetadata(call.path, call.body.dropFirst(5)) { headers.add(dynamic: name, value) }
        }
        var provider = Self.dataProvider
        let id = headers.withNV { nv, n in nghttp2_submit_request(session, nil, nv, n, &provider, nil) }
        guard id > 0 else {
            call.complete(GRPCStatus(.unavailable, "STREAM_REFUSED: cannot open a stream: \(String(cString: nghttp2_strerror(id)))"))
            if let t = call.deadlineTimer { loop.cancelTimer(t) }
            return
        }
        call.streamID = id
        calls[id] = call
        markDirty()
    }

    /// Ends a call early (deadline, cancellation) and resets its stream.
    func fail(_ call: ClientCall, _ status: GRPCStatus) {
        if let t = call.deadlineTimer {
            loop.cancelTimer(t)
            call.deadlineTimer = nil
        }
        if let i = pending.firstIndex(where: { $0 === call }) { pending.remove(at: i) }
        if call.streamID > 0, calls[call.streamID] != nil, session != nil {
            call.failure = status
            nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), call.streamID, UInt32(NGHTTP2_CANCEL.rawValue))
            markDirty()
        }
        call.complete(status)
    }

    /// Cancels the call holding `handle`, if it is still running here.
    func cancel(_ handle: CallHandle) {
        if let call = pending.first(where: { $0.handle === handle }) ?? calls.values.first(where: { $0.handle === handle }) {
            fail(call, GRPCStatus(.cancelled, "CANCELLED: the call was cancelled"))
        }
    }

    /// The app took `bytes` of a stream's messages: open the window for more.
    func consumed(streamID: Int32, bytes: Int) {
        guard state == .ready, calls[streamID] != nil else { return }
        nghttp2_session_consume(session, streamID, bytes)
        markDirty()
    }

    // MARK: nghttp2 callbacks

    override func onHeader(streamID: Int32, category: UInt32, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) -> Int32 {
        guard let c = calls[streamID] else { return 0 }
        if bytesEqual(name, ":status") {
            c.httpStatus = Int(String(decoding: value, as: UTF8.self)) ?? 0
        } else if bytesEqual(name, "grpc-status") {
            c.grpcStatus = Int(String(decoding: value, as: UTF8.self)) ?? GRPCStatus.Code.unknown.rawValue
        } else if bytesEqual(name, "grpc-message") {
            c.grpcMessage = PercentEncoding.decode(value)
        }
        return 0
    }

    override func onDataChunk(streamID: Int32, data: UnsafeBufferPointer<UInt8>) -> Int32 {
        guard let c = calls[streamID], let sink = c.sink else {
            nghttp2_session_consume(session, streamID, data.count)
            return 0
        }
        var streamMessages: [[UInt8]] = []
        let failure = c.deframer.append(data) { m in
            switch sink {
            case .unary:
                if c.message == nil { c.message = m } else { c.extraMessages += 1 }
            case .stream:
                streamMessages.append(m)
            case .callback(let onMessage, _):
                onMessage(m)
            }
        }
        switch sink {
        case .unary, .callback:
            nghttp2_session_consume(session, streamID, data.count)
        case .stream(let s):
            // Window opens as the app reads (see ResponseStreamState.next): backpressure.
            s.deliver(streamMessages, wireBytes: data.count)
        }
        if let failure {
            let status: GRPCStatus
            switch failure {
            case .tooLarge(let length, let limit): status = GRPCStatus(.resourceExhausted, "MESSAGE_TOO_LARGE: response message of \(length) bytes exceeds the limit of \(limit) bytes")
            case .compressed: status = GRPCStatus(.internal, "COMPRESSION_UNSUPPORTED: the server sent a compressed message")
            case .badFlag(let f): status = GRPCStatus(.internal, "BAD_FRAME: message flag \(f)")
            }
            fail(c, status)
        }
        return 0
    }

    override func onFrameReceived(type: UInt8, flags: UInt8, streamID: Int32, headersCategory: UInt32) -> Int32 {
        if type == UInt8(NGHTTP2_GOAWAY.rawValue) {
            goawayReceived = true
        }
        return 0
    }

    override func onStreamClose(streamID: Int32, errorCode: UInt32) -> Int32 {
        guard let c = calls.removeValue(forKey: streamID) else { return 0 }
        // REFUSED_STREAM means the server did not process the stream (say, it was opened before our
        // client learnt the server's stream limit): safe to send again, as gRPC's transparent retry does.
        if errorCode == NGHTTP2_REFUSED_STREAM.rawValue, c.httpStatus == 0, c.failure == nil, c.sink != nil,
           c.refusals < 5, isUsable {
            c.refusals += 1
            c.bodyOffset = 0
            c.streamID = 0
            submit(c)
            return 0
        }
        if let t = c.deadlineTimer { loop.cancelTimer(t) }
        if let f = c.failure {
            c.complete(f)
            return 0
        }
        c.complete(Self.status(of: c, errorCode: errorCode))
        return 0
    }

    static func status(of c: ClientCall, errorCode: UInt32) -> GRPCStatus {
        if let code = c.grpcStatus {
            return GRPCStatus(GRPCStatus.Code(rawValue: code) ?? .unknown, c.grpcMessage)
        }
        if errorCode == NGHTTP2_REFUSED_STREAM.rawValue {
            return GRPCStatus(.unavailable, "STREAM_REFUSED: the server refused the stream; safe to retry")
        }
        if errorCode == NGHTTP2_CANCEL.rawValue {
            return GRPCStatus(.cancelled, "CANCELLED: the server cancelled the stream")
        }
        if errorCode != 0 {
            return GRPCStatus(.internal, "STREAM_RESET: stream reset with HTTP/2 error \(errorCode)")
        }
        if c.httpStatus != 200 {
            let code: GRPCStatus.Code
            switch c.httpStatus {
            case 400: code = .internal
            case 401: code = .unauthenticated
            case 403: code = .permissionDenied
            case 404: code = .unimplemented
            case 429, 502, 503, 504: code = .unavailable
            default: code = .unknown
            }
            return GRPCStatus(code, "HTTP_STATUS: the server answered HTTP \(c.httpStatus)")
        }
        return GRPCStatus(.internal, "MISSING_STATUS: the stream ended without grpc-status")
    }

    override func readData(streamID: Int32, into buffer: UnsafeMutablePointer<UInt8>, length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard let c = calls[streamID] else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
        let take = min(length, c.body.count - c.bodyOffset)
        if take > 0 {
            c.body.withUnsafeBufferPointer { (buffer).update(from: $0.baseAddress! + c.bodyOffset, count: take) }
            c.bodyOffset += take
        }
        if c.bodyOffset == c.body.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
        return take
    }
}
