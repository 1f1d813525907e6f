import CCrypto
import CSystemShim
import CWSLay
import EventLoop
import Glibc

/// Settings of the WebSocket side of the front door (WEB.md).
public struct WebSocketSettings: Sendable {
    /// Largest message a client may send (64 KiB; a bigger one closes with 1009).
    public var maxMessageBytes = 64 * 1024
    /// Bytes queued for a client that does not read, at most (4 MiB); past it the socket closes
    /// with 1008, as a slow gRPC stream is cut off.
    public var maxQueuedBytes = 4 * 1024 * 1024
    /// A ping after this long with nothing read (15 s); closed if nothing arrives within
    /// `keepaliveTimeout` after it.
    public var keepaliveInterval: UInt64 = 15_000_000_000
    public var keepaliveTimeout: UInt64 = 15_000_000_000
    /// After this node sends its close frame, how long the client has to answer before the
    /// connection is dropped anyway (5 s).
    public var closeTimeout: UInt64 = 5_000_000_000
    public init() {}
}

/// The opening handshake (RFC 6455, section 4.2): checks an upgrade request and makes the
/// `101 Switching Protocols` answer. A plain function of the request.
public enum WebSocketHandshake {
    static let guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// The 101 answer, or why the request is not a WebSocket opening handshake (400, or 426
    /// for another protocol version).
    public static func accept(_ request: HTTPRequest) -> Result<HTTPResponse, HTTPResponseError> {
        guard request.method == "GET" else { return .failure(.init(405, "a WebSocket opens with GET")) }
        guard request.isUpgrade, request.headerLists("connection", "upgrade"), request.headerLists("upgrade", "websocket") else {
            return .failure(.init(426, "this route takes a WebSocket (Connection: Upgrade, Upgrade: websocket)"))
        }
        guard request.header("sec-websocket-version") == "13" else {
            return .failure(.init(426, "Sec-WebSocket-Version 13 is the one served here", headers: [("sec-websocket-version", "13")]))
        }
        guard let key = request.header("sec-websocket-key"), key.utf8.count == 24 else {
            return .failure(.init(400, "Sec-WebSocket-Key must be 16 bytes in base64"))
        }
        return .success(HTTPResponse(status: 101, headers: [("upgrade", "websocket"), ("connection", "Upgrade"),
                                                            ("sec-websocket-accept", acceptValue(for: key))]))
    }

    /// base64(SHA-1(key + GUID)).
    public static func acceptValue(for key: String) -> String {
        var digest = [UInt8](repeating: 0, count: Int(SHA_DIGEST_LENGTH))
        let input = Array((key + guid).utf8)
        _ = input.withUnsafeBufferPointer { SHA1($0.baseAddress, $0.count, &digest) }
        var out = [UInt8](repeating: 0, count: 32)
        let n = CCryptoBase64.encode(digest, into: &out)
        return String(decoding: out[0..<n], as: UTF8.self)
    }
}

/// libcrypto's base64 (the handshake's key and accept value).
enum CCryptoBase64 {
    /// Writes base64 of `bytes` into `out` (at least 4/3 of the input plus 1); returns its length.
    static func encode(_ bytes: [UInt8], into out: inout [UInt8]) -> Int {
        Int(EVP_EncodeBlock(&out, bytes, Int32(bytes.count)))
    }
}

/// An answer that refuses a request (status, text, extra headers).
public struct HTTPResponseError: Error, Sendable {
    public let response: HTTPResponse
    public init(_ status: Int, _ text: String, headers: [(name: String, value: String)] = []) {
        var r = HTTPResponse.text(status, text + "\n")
        r.headers += headers
        response = r
    }
}

/// What a WebSocket connection tells its owner (on the connection's loop).
public protocol WebSocketDelegate: AnyObject {
    /// A whole text message (valid UTF-8: wslay checks it).
    func webSocket(_ socket: WebSocketConnection, received text: [UInt8])
    /// The connection is closed (`code` from the client's close frame, if it sent one).
    func webSocketClosed(_ socket: WebSocketConnection, code: UInt16?)
    /// Queued bytes went out: there may be room for more.
    func webSocketDrained(_ socket: WebSocketConnection)
}

/// One WebSocket connection on one loop, after the handshake: wslay does the protocol (framing,
/// masking, fragments, ping/pong, the closing handshake); this class the I/O, the output bound and
/// the keepalive. Loop-confined.
public final class WebSocketConnection: FileDescriptorHandler {
    public let loop: EventLoop
    private let fd: Int32
    private let settings: WebSocketSettings
    private var context: OpaquePointer?
    private let release: @Sendable () -> Void
    /// Bytes that came with the upgrade request, read before the socket.
    private var leftover: [UInt8]
    private var keepalive: KeepaliveStateMachine
    private var keepaliveTimer: TimerID?
    private var closeTimer: TimerID?
    /// Text queued in wslay and not yet written, in bytes (wslay copies each message).
    public private(set) var queuedBytes = 0
    private var queuedSizes: [Int] = []
    private var writtenOfHead = 0
    public private(set) var isClosed = false
    private var closeCode: UInt16?
    /// Held until the connection closes (the delegate usually holds the connection too: the
    /// close breaks that cycle).
    public var delegate: WebSocketDelegate?

    /// The client end of a connection masks what it sends (benchmarks and tests use it).
    private let isClient: Bool

    public init(socket: UpgradedSocket, settings: WebSocketSettings = WebSocketSettings(), client: Bool = false) {
        isClient = client
        loop = socket.loop
        fd = socket.fd
        self.settings = settings
        release = socket.release
        leftover = socket.leftover
        keepalive = KeepaliveStateMachine(interval: settings.keepaliveInterval, timeout: settings.keepaliveTimeout, now: MonotonicClock.now())
    }

    /// Starts reading (after the delegate is set).
    public func start() {
        var callbacks = wslay_event_callbacks()
        callbacks.recv_callback = { _, buf, len, _, user in WebSocketConnection.from(user).receive(into: buf!, max: len) }
        callbacks.send_callback = { _, data, len, _, user in WebSocketConnection.from(user).transmit(data!, len) }
        callbacks.on_msg_recv_callback = { _, arg, user in WebSocketConnection.from(user).message(arg!.pointee) }
        if isClient {
            callbacks.genmask_callback = { _, buf, len, _ in
                var rng = SystemRandomNumberGenerator()
                for i in 0..<len { buf![i] = UInt8.random(in: 0...255, using: &rng) }
                return 0
            }
            wslay_event_context_client_init(&context, &callbacks, Unmanaged.passUnretained(self).toOpaque())
        } else {
            wslay_event_context_server_init(&context, &callbacks, Unmanaged.passUnretained(self).toOpaque())
        }
        wslay_event_config_set_max_recv_msg_length(context, UInt64(settings.maxMessageBytes))
        loop.register(fd: fd, events: UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue), handler: self)
        scheduleKeepalive()
        pump()
    }

    private static func from(_ user: UnsafeMutableRawPointer?) -> WebSocketConnection {
        Unmanaged<WebSocketConnection>.fromOpaque(user!).takeUnretainedValue()
    }

    /// Queues a text message; false (nothing queued) when the socket is closed or the client has
    /// more than `maxQueuedBytes` waiting: the caller then closes with 1008.
    @discardableResult
    public func send(text: [UInt8]) -> Bool {
        guard !isClosed, queuedBytes <= settings.maxQueuedBytes else { return false }
        let rc = text.withUnsafeBufferPointer { b -> Int32 in
            var msg = wslay_event_msg(opcode: UInt8(WSLAY_TEXT_FRAME.rawValue), msg: b.baseAddress, msg_length: b.count)
            return wslay_event_queue_msg(context, &msg)
        }
        guard rc == 0 else { return false }
        queuedBytes += text.count
        queuedSizes.append(text.count)
        pump()
        return true
    }

    /// Starts the closing handshake (the socket closes once the client answers or goes away).
    /// The close frame goes after what was queued before it (wslay sends control frames first: a
    /// refusal's error message would be lost behind its own close).
    public func close(code: UInt16, reason: String) {
        guard !isClosed, pendingClose == nil else { return }
        pendingClose = (code, Self.closeReason(reason))
        armCloseTimer()
        pump()
    }

    /// A close asked for, waiting for the messages queued before it to go out.
    private var pendingClose: (code: UInt16, reason: [UInt8])?

    /// A close frame's reason: whole characters only, within the 123 bytes a control frame leaves
    /// (a character cut in two would make a browser fail the connection instead of reading the code).
    static func closeReason(_ reason: String) -> [UInt8] {
        var out: [UInt8] = []
        for c in reason {
            let bytes = Array(String(c).utf8)
            guard out.count + bytes.count <= 123 else { break }
            out += bytes
        }
        return out
    }

    /// (a client that never answers a close, or never reads it, does not keep the socket)
    private func armCloseTimer() {
        guard closeTimer == nil, !isClosed else { return }
        // (strong captures, here and in `scheduleKeepalive`, cancelled in `finish`: a weak one
        // would give the connection a side table and put each retain and release of it on the
        // runtime's slow path)
        closeTimer = loop.scheduleTimer(after: settings.closeTimeout) { [self] in
            closeTimer = nil
            finish()
        }
    }

    public func handleEvents(_ events: UInt32) {
        if isClosed { return }
        if events & (UInt32(EPOLLERR.rawValue) | UInt32(EPOLLHUP.rawValue)) != 0 && events & UInt32(EPOLLIN.rawValue) == 0 {
            finish()
            return
        }
        pump()
    }

    public func loopStopping() { finish() }

    /// Inside `wslay_event_recv`/`send`: wslay calls back from there (a message arrives, the delegate
    /// answers or closes). Those calls only queue; wslay is never entered again, nor its context freed,
    /// until the outer call has returned.
    private var pumping = false
    private var pumpAgain = false
    private var finishRequested = false
    /// Bytes one pump may still read (a client that sends without end does not hold the loop).
    private var readBudget = 0
    private static let readBudgetPerPump = 256 * 1024
    /// Pings read since the socket last had nothing left to write: wslay queues a pong for each,
    /// outside any bound of ours, so past a few reading stops until they went out.
    private var pingsUnanswered = 0
    private static let maxPingsUnanswered = 256
    private var watchedEvents = UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue)

    /// Lets wslay read and write what it can, then closes if it wants neither any more.
    private func pump() {
        if pumping {
            pumpAgain = true
            return
        }
        guard !isClosed, let context else { return }
        pumping = true
        var failed = false
        if wslay_event_want_read(context) != 0 && pingsUnanswered < Self.maxPingsUnanswered {
            readBudget = Self.readBudgetPerPump
            failed = wslay_event_recv(context) != 0
        }
        while !failed {
            pumpAgain = false
            if let c = pendingClose, wslay_event_get_queued_msg_count(context) == 0 {
                pendingClose = nil
                _ = c.reason.withUnsafeBufferPointer { wslay_event_queue_close(context, c.code, $0.baseAddress, $0.count) }
            }
            if wslay_event_want_write(context) != 0, wslay_event_send(context) != 0 {
                failed = true
                break
            }
            let closeReady = pendingClose != nil && wslay_event_get_queued_msg_count(context) == 0
            if !pumpAgain && !closeReady { break }
        }
        pumping = false
        let wantRead = wslay_event_want_read(context) != 0, wantWrite = wslay_event_want_write(context) != 0
        if failed || finishRequested || (!wantRead && !wantWrite) {
            finish()
            return
        }
        if !wantWrite { pingsUnanswered = 0 }
        // (reading is over: the close handshake has started, from either side)
        if !wantRead { armCloseTimer() }
        if drainedSome {
            drainedSome = false
            delegate?.webSocketDrained(self)
            if isClosed { return }
        }
        // read only while wslay wants to and pongs are not piling up; write while it has output
        let read = wantRead && pingsUnanswered < Self.maxPingsUnanswered
        let events = (read ? UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue) : 0) | (wantWrite ? UInt32(EPOLLOUT.rawValue) : 0)
        if events != watchedEvents {
            watchedEvents = events
            loop.modify(fd: fd, events: events)
        }
    }

    // MARK: wslay callbacks

    private func receive(into buf: UnsafeMutablePointer<UInt8>, max wanted: Int) -> Int {
        guard readBudget > 0 else {
            wslay_event_set_error(context, Int32(WSLAY_ERR_WOULDBLOCK.rawValue))
            return -1
        }
        let max = min(wanted, readBudget)
        if !leftover.isEmpty {
            let n = min(max, leftover.count)
            leftover.withUnsafeBufferPointer { buf.update(from: $0.baseAddress!, count: n) }
            leftover.removeFirst(n)
            readBudget -= n
            keepalive.bytesRead(now: MonotonicClock.now())
            return n
        }
        while true {
            let n = read(fd, buf, max)
            if n > 0 {
                readBudget -= n
                keepalive.bytesRead(now: MonotonicClock.now())
                return n
            }
            if n == 0 {
                wslay_event_set_error(context, Int32(WSLAY_ERR_CALLBACK_FAILURE.rawValue))
                return -1
            }
            if errno == EINTR { continue }
            wslay_event_set_error(context, Int32(errno == EAGAIN || errno == EWOULDBLOCK ? WSLAY_ERR_WOULDBLOCK.rawValue : WSLAY_ERR_CALLBACK_FAILURE.rawValue))
            return -1
        }
    }

    private func transmit(_ data: UnsafePointer<UInt8>, _ len: Int) -> Int {
        while true {
            let n = Glibc.send(fd, data, len, Int32(MSG_NOSIGNAL))
            if n >= 0 {
                written(n)
                return n
            }
            if errno == EINTR { continue }
            wslay_event_set_error(context, Int32(errno == EAGAIN || errno == EWOULDBLOCK ? WSLAY_ERR_WOULDBLOCK.rawValue : WSLAY_ERR_CALLBACK_FAILURE.rawValue))
            return -1
        }
    }

    /// Counts written bytes against the queued messages (frame headers make the count a little
    /// high, so a message is let go slightly early; the bound stays a bound).
    private func written(_ n: Int) {
        var left = n
        while left > 0, let head = queuedSizes.first {
            let take = min(left, head - writtenOfHead)
            writtenOfHead += take
            left -= take
            if writtenOfHead >= head {
                queuedSizes.removeFirst()
                queuedBytes -= head
                writtenOfHead = 0
                drainedSome = true
            }
        }
    }
    private var drainedSome = false

    private func message(_ arg: wslay_event_on_msg_recv_arg) {
        switch arg.opcode {
        case UInt8(WSLAY_TEXT_FRAME.rawValue):
            delegate?.webSocket(self, received: Array(UnsafeBufferPointer(start: arg.msg, count: arg.msg_length)))
        case UInt8(WSLAY_BINARY_FRAME.rawValue):
            close(code: 1003, reason: "this API speaks JSON in text messages")
        case UInt8(WSLAY_CONNECTION_CLOSE.rawValue):
            closeCode = arg.status_code
        case UInt8(WSLAY_PING.rawValue):
            pingsUnanswered += 1   // (wslay queues the pong)
        default:
            break  // (pongs)
        }
    }

    // MARK: Keepalive and the end

    private func scheduleKeepalive() {
        keepaliveTimer = loop.scheduleTimer(at: keepalive.nextDeadline) { [self] in keepaliveFired() }
    }

    private func keepaliveFired() {
        guard !isClosed else { return }
        switch keepalive.timerFired(now: MonotonicClock.now()) {
        case .sendPing:
            var msg = wslay_event_msg(opcode: UInt8(WSLAY_PING.rawValue), msg: nil, msg_length: 0)
            _ = wslay_event_queue_msg(context, &msg)
            pump()
        case .closeConnection:
            finish()
            return
        case .none:
            break
        }
        scheduleKeepalive()
    }

    private func finish() {
        guard !isClosed else { return }
        if pumping {
            finishRequested = true
            return
        }
        isClosed = true
        if let t = keepaliveTimer { loop.cancelTimer(t) }
        if let t = closeTimer { loop.cancelTimer(t) }
        loop.unregister(fd: fd)
        Glibc.close(fd)
        if let c = context {
            context = nil
            wslay_event_context_free(c)
        }
        release()
        delegate?.webSocketClosed(self, code: closeCode)
        delegate = nil
    }
}
