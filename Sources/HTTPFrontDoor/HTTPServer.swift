import CSystemShim
import Dispatch
import EventLoop
import Glibc
import Synchronization

/// An answer to an HTTP/1.1 request.
public struct HTTPResponse: Sendable {
    public var status: Int
    /// Header fields besides `content-length`, `date`-less (`connection` is added when closing).
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A plain-text answer.
    public static func text(_ status: Int, _ text: String, contentType: String = "text/plain; charset=utf-8") -> HTTPResponse {
        HTTPResponse(status: status, headers: [("content-type", contentType)], body: Array(text.utf8))
    }

    /// The reason phrase of a status code.
    public static func reason(_ status: Int) -> String {
        switch status {
        case 101: "Switching Protocols"
        case 200: "OK"
        case 204: "No Content"
        case 400: "Bad Request"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 413: "Content Too Large"
        case 426: "Upgrade Required"
        case 431: "Request Header Fields Too Large"
        case 500: "Internal Server Error"
        case 503: "Service Unavailable"
        case 505: "HTTP Version Not Supported"
        default: "Status"
        }
    }

    /// The answer on the wire; `close` adds `connection: close`.
    public func serialized(close: Bool, includeBody: Bool = true) -> [UInt8] {
        var head = "HTTP/1.1 \(status) \(Self.reason(status))\r\n"
        for (n, v) in headers { head += "\(n): \(v)\r\n" }
        if status != 101 && status != 204 { head += "content-length: \(body.count)\r\n" }
        if close { head += "connection: close\r\n" }
        head += "\r\n"
        var out = Array(head.utf8)
        if includeBody { out += body }
        return out
    }
}

/// How a request is answered: now (on the loop thread; must not block) or by an async task.
public enum HTTPReply: Sendable {
    case now(HTTPResponse)
    case later(@Sendable () async -> HTTPResponse)
    /// Switches the connection to another protocol (WebSocket): `response` (101) goes out, then
    /// `adopt` takes over the socket on its loop with the bytes already read after the request.
    case upgrade(HTTPResponse, adopt: @Sendable (_ connection: UpgradedSocket) -> Void)
}

/// A socket handed over after `101 Switching Protocols`: the new protocol's handler owns it and
/// must call `release()` once when it closes it (the server counts it until then).
public struct UpgradedSocket: @unchecked Sendable {
    // (@unchecked: `loop` is Sendable and the rest are values; `release` is a Sendable closure)
    public let fd: Int32
    public let loop: EventLoop
    /// Bytes that came after the upgrade request, already the new protocol's.
    public let leftover: [UInt8]
    public let release: @Sendable () -> Void

    public init(fd: Int32, loop: EventLoop, leftover: [UInt8], release: @escaping @Sendable () -> Void) {
        self.fd = fd
        self.loop = loop
        self.leftover = leftover
        self.release = release
    }
}

/// Settings of the HTTP/1.1 front door.
public struct HTTPServerConfiguration: Sendable {
    public var address: HostPort
    public var limits = HTTPLimits()
    public var timeouts = HTTPConnectionTimer.Timeouts()
    /// Connections at once (200,000: WebSockets are long-lived), and from one remote address
    /// (20,000: many browsers share an address behind NAT), as on the gRPC port.
    public var maxConnections = 200_000
    public var maxConnectionsPerAddress = 20_000

    public init(address: HostPort) { self.address = address }
}

/// The HTTP/1.1 server of the front door (WEB.md): on every loop of a group, the first one
/// accepting and handing connections to the loops in turn, like the gRPC server.
public final class HTTPServer: Sendable {
    public let configuration: HTTPServerConfiguration
    private let group: EventLoopGroup
    private let handler: @Sendable (HTTPRequest) -> HTTPReply
    private let limiter: ConnectionLimiter
    private let boundPort = Atomic<Int>(0)
    private let cores = Mutex<[LoopBound<HTTPServerCore>]>([])
    private let listenFD = Atomic<Int32>(-1)

    public init(configuration: HTTPServerConfiguration, group: EventLoopGroup, handler: @escaping @Sendable (HTTPRequest) -> HTTPReply) {
        self.configuration = configuration
        self.group = group
        self.handler = handler
        limiter = ConnectionLimiter(limit: configuration.maxConnections, perAddress: configuration.maxConnectionsPerAddress)
    }

    /// The port bound (useful with port 0).
    public var port: UInt16 { UInt16(boundPort.load(ordering: .relaxed)) }
    /// Connections open now (WebSockets included).
    public var connections: Int { limiter.count }

    public func start() throws {
        let fd = try Sockets.listen(on: configuration.address, reusePort: false)
        listenFD.store(fd, ordering: .relaxed)
        boundPort.store(Int(Sockets.localPort(of: fd)), ordering: .relaxed)
        var made: [LoopBound<HTTPServerCore>] = []
        for loop in group.loops {
            let ready = DispatchSemaphore(value: 0)
            let box = Mutex<LoopBound<HTTPServerCore>?>(nil)
            let (config, handler, limiter) = (configuration, self.handler, self.limiter)
            loop.execute {
                box.withLock { $0 = LoopBound(HTTPServerCore(loop: loop, configuration: config, handler: handler, limiter: limiter), loop: loop) }
                ready.signal()
            }
            ready.wait()
            made.append(box.withLock { $0! })
        }
        cores.withLock { $0 = made }
        let all = made
        let started = DispatchSemaphore(value: 0)
        all[0].execute { core in
            core.startAccepting(fd: fd, handingOffTo: all)
            started.signal()
        }
        started.wait()
    }

    /// Stops accepting and closes idle connections; answers in progress finish (up to
    /// `gracePeriod`), then everything left is closed.
    public func shutdown(gracePeriod: UInt64 = 1_000_000_000) async {
        let cores = self.cores.withLock { $0 }
        for c in cores { c.execute { $0.beginShutdown() } }
        let deadline = MonotonicClock.now() + gracePeriod
        while connections > 0 && MonotonicClock.now() < deadline {
            try? await Task.sleep(nanoseconds: 10_000_000)
        }
        for c in cores { c.execute { $0.closeAll() } }
        let fd = listenFD.exchange(-1, ordering: .relaxed)
        if fd >= 0 { close(fd) }
    }
}

/// The server's connections on one loop. Loop-confined.
final class HTTPServerCore {
    let loop: EventLoop
    let configuration: HTTPServerConfiguration
    let handler: @Sendable (HTTPRequest) -> HTTPReply
    let limiter: ConnectionLimiter
    private var acceptor: Acceptor?
    private var connections: [ObjectIdentifier: HTTPConnection] = [:]
    private(set) var shuttingDown = false

    init(loop: EventLoop, configuration: HTTPServerConfiguration, handler: @escaping @Sendable (HTTPRequest) -> HTTPReply, limiter: ConnectionLimiter) {
        self.loop = loop
        self.configuration = configuration
        self.handler = handler
        self.limiter = limiter
    }

    func startAccepting(fd: Int32, handingOffTo all: [LoopBound<HTTPServerCore>]) {
        let a = Acceptor(loop: loop, fd: fd, limiter: limiter, targets: all.map { core in
            (loop: core.loop, adopt: { fd, address in core.value.adopt(fd, from: address) })
        })
        a.onLoopStopping = { [unowned self] in self.acceptor = nil }
        acceptor = a
        a.start()
    }

    func adopt(_ fd: Int32, from address: [UInt8]) {
        guard !shuttingDown else {
            close(fd)
            limiter.release(from: address)
            return
        }
        let c = HTTPConnection(fd: fd, address: address, core: self)
        connections[ObjectIdentifier(c)] = c
        c.start()
    }

    /// The connection closed, or was handed to another protocol (which releases it then).
    func connectionEnded(_ c: HTTPConnection, handedOver: Bool) {
        guard connections.removeValue(forKey: ObjectIdentifier(c)) != nil else { return }
        if !handedOver { limiter.release(from: c.address) }
    }

    func beginShutdown() {
        shuttingDown = true
        acceptor?.stop()
        acceptor = nil
        for c in Array(connections.values) { c.closeIfIdle() }
    }

    func closeAll() {
        for c in Array(connections.values) { c.close() }
    }
}

/// One HTTP/1.1 connection: reads requests one at a time, answers each in order. Loop-confined.
final class HTTPConnection: FileDescriptorHandler {
    let fd: Int32
    let address: [UInt8]
    private unowned let core: HTTPServerCore
    private var loop: EventLoop { core.loop }
    private let parser: HTTPRequestParser
    private var timer: HTTPConnectionTimer
    private var timerID: TimerID?
    /// Bytes read but not parsed yet (while an answer is made, the next request waits here).
    private var inbound: [UInt8] = []
    private var outbound: [UInt8] = []
    private var outboundOffset = 0
    private var watchingWritable = false
    private var closeAfterWrite = false
    /// The client sent its end of the connection (FIN).
    private var readShut = false
    /// Closes a connection whose client does not take what is written to it.
    private var writeTimer: TimerID?
    private var answering = false
    private var upgrade: ((UpgradedSocket) -> Void)? = nil
    private(set) var isClosed = false
    private static let readEvents = UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue)

    init(fd: Int32, address: [UInt8], core: HTTPServerCore) {
        self.fd = fd
        self.address = address
        self.core = core
        parser = HTTPRequestParser(limits: core.configuration.limits)
        timer = HTTPConnectionTimer(timeouts: core.configuration.timeouts, now: MonotonicClock.now())
    }

    func start() {
        loop.register(fd: fd, events: Self.readEvents, handler: self)
        armTimer()
    }

    func handleEvents(_ events: UInt32) {
        if events & (UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue)) != 0 { readAvailable() }
        if isClosed { return }
        if events & (UInt32(EPOLLERR.rawValue) | UInt32(EPOLLHUP.rawValue)) != 0 {
            close()
            return
        }
        if events & UInt32(EPOLLOUT.rawValue) != 0 { writePending() }
    }

    func loopStopping() { close() }

    private func readAvailable() {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while !isClosed {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n > 0 {
                // (while an answer is made, at most one more request's worth waits)
                guard inbound.count + n <= core.configuration.limits.maxHeaderBytes + core.configuration.limits.maxBodyBytes else {
                    fail(status: 431, reason: "too much sent before the answer")
                    return
                }
                inbound += buffer[0..<n]
                timer.bytesArrived(now: MonotonicClock.now())
                if n < buffer.count { break }
            } else if n == 0 {
                // the client is done sending; an answer in progress, or one still being written,
                // goes out first (and the end is not read again meanwhile)
                if answering || hasOutput {
                    closeAfterWrite = true
                    readShut = true
                    watch()
                } else {
                    close()
                }
                break
            } else {
                if errno == EINTR { continue }
                if errno != EAGAIN && errno != EWOULDBLOCK { close() }
                break
            }
        }
        if !isClosed { parseNext() }
    }

    /// Reads the next whole request out of `inbound` and answers it (one at a time).
    private func parseNext() {
        // (one answer at a time, and the next request waits until the last answer is written:
        // a client that pipelines without reading cannot pile answers up here)
        while !answering && !hasOutput && !isClosed && !inbound.isEmpty && !closeAfterWrite {
            let outcome = inbound.withUnsafeBytes { parser.parse($0) }
            switch outcome {
            case .needMore:
                inbound.removeAll(keepingCapacity: true)
                armTimer()
                return
            case .failed(let status, let reason):
                fail(status: status, reason: reason)
                return
            case .request(let consumed):
                inbound.removeFirst(consumed)
                guard let request = parser.takeRequest() else { return }
                answer(request)
            }
        }
        armTimer()
    }

    private func answer(_ request: HTTPRequest) {
        answering = true
        timer.requestComplete()
        switch core.handler(request) {
        case .now(let response):
            send(response, for: request)
        case .later(let make):
            let me = LoopBound(self, loop: loop)
            // (on this loop's executor, like a gRPC handler: not waiting for the shared pool)
            Task.immediate(executorPreference: loop) {
                let response = await make()
                me.execute { $0.send(response, for: request) }
            }
        case .upgrade(let response, let adopt):
            guard request.isUpgrade else {
                send(.text(400, "not an upgrade request\n"), for: request)
                return
            }
            upgrade = adopt
            closeAfterWrite = true
            queue(response.serialized(close: false))
        }
    }

    private func send(_ response: HTTPResponse, for request: HTTPRequest) {
        guard !isClosed else { return }
        let close = !request.keepAlive || core.shuttingDown || closeAfterWrite
        if close { closeAfterWrite = true }
        queue(response.serialized(close: close, includeBody: request.method != "HEAD"))
        guard !isClosed else { return }
        answering = false
        timer.answered(now: MonotonicClock.now())
        parseNext()
    }

    /// Answers a request that cannot be served, then closes.
    private func fail(status: Int, reason: String) {
        closeAfterWrite = true
        answering = true
        queue(HTTPResponse.text(status, reason + "\n").serialized(close: true))
    }

    private func queue(_ bytes: [UInt8]) {
        outbound += bytes
        writePending()
    }

    private func writePending() {
        while outboundOffset < outbound.count {
            let n = outbound.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + outboundOffset, outbound.count - outboundOffset, Int32(MSG_NOSIGNAL)) }
            if n > 0 {
                outboundOffset += n
            } else if n < 0 && errno == EINTR {
                continue
            } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                if !watchingWritable {
                    watchingWritable = true
                    watch()
                    // (a client that does not take its answer does not hold the connection)
                    writeTimer = loop.scheduleTimer(after: core.configuration.timeouts.request) { [weak self] in
                        self?.writeTimer = nil
                        self?.close()
                    }
                }
                return
            } else {
                close()
                return
            }
        }
        outbound.removeAll(keepingCapacity: outbound.capacity <= 64 * 1024)
        outboundOffset = 0
        if let t = writeTimer {
            loop.cancelTimer(t)
            writeTimer = nil
        }
        if watchingWritable {
            watchingWritable = false
            watch()
        }
        if closeAfterWrite {
            if let upgrade { handOver(upgrade) } else { close() }
            return
        }
        // a request that waited for this answer to be written
        if !answering && !inbound.isEmpty { parseNext() }
    }

    private var hasOutput: Bool { outboundOffset < outbound.count }

    /// Watches for reading (unless the client has finished sending) and, while output waits, writing.
    private func watch() {
        guard !isClosed else { return }
        loop.modify(fd: fd, events: (readShut ? 0 : Self.readEvents) | (watchingWritable ? UInt32(EPOLLOUT.rawValue) : 0))
    }

    /// After `101 Switching Protocols`: the socket and what came after the request go to the
    /// new protocol's handler.
    private func handOver(_ adopt: (UpgradedSocket) -> Void) {
        isClosed = true
        if let t = timerID { loop.cancelTimer(t) }
        if let t = writeTimer { loop.cancelTimer(t) }
        loop.unregister(fd: fd)
        core.connectionEnded(self, handedOver: true)
        let (limiter, address) = (core.limiter, self.address)
        adopt(UpgradedSocket(fd: fd, loop: loop, leftover: inbound, release: { limiter.release(from: address) }))
    }

    private func armTimer() {
        if let t = timerID { loop.cancelTimer(t) }
        timerID = nil
        guard !isClosed, let deadline = timer.deadline else { return }
        timerID = loop.scheduleTimer(at: deadline) { [weak self] in self?.timerFired() }
    }

    private func timerFired() {
        timerID = nil
        switch timer.expired(now: MonotonicClock.now()) {
        case .requestTimeout: fail(status: 408, reason: "the request did not arrive in time")
        case .close: close()
        case nil: armTimer()
        }
    }

    /// Closes a connection with no request in progress (shutdown).
    func closeIfIdle() {
        if !answering && inbound.isEmpty && !hasOutput { close() } else { closeAfterWrite = true }
    }

    func close() {
        guard !isClosed else { return }
        isClosed = true
        if let t = timerID { loop.cancelTimer(t) }
        if let t = writeTimer { loop.cancelTimer(t) }
        loop.unregister(fd: fd)
        Glibc.close(fd)
        core.connectionEnded(self, handedOver: false)
    }
}
