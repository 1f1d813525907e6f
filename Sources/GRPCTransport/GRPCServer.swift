import CSystemShim
import Dispatch
import EventLoop
import Glibc
import Synchronization

/// Settings of a gRPC server.
public struct ServerConfiguration: Sendable {
    public var address: HostPort
    public var http2 = HTTP2Settings()
    /// Largest request message accepted (larger: RESOURCE_EXHAUSTED).
    public var maxReceiveMessageSize = 4 * 1024 * 1024
    /// Connections served at once; more are closed as soon as they are accepted.
    public var maxConnections = 200_000
    /// Unary handlers one connection runs at once (32); later requests wait their turn. Together
    /// with the output budget this bounds what one client can make the server build and hold
    /// (answers to requests it never reads).
    public var maxConcurrentUnaryPerConnection = 32
    /// Checks a request's headers before its message is read (path, metadata): a refusal ends the
    /// call at once, and its body is not kept. For authentication that needs no body.
    public var refuseEarly: (@Sendable (_ path: String, _ metadata: [(String, String)]) -> GRPCStatus?)? = nil
    /// Checks a whole request before its message is decoded (path, metadata, protobuf bytes).
    public var refuse: (@Sendable (_ path: String, _ metadata: [(String, String)], _ message: [UInt8]) -> GRPCStatus?)? = nil
    /// Connections from one remote IP address served at once (20,000: many clients can share
    /// an address behind NAT; a peer port sets far fewer); more are closed as soon as accepted.
    public var maxConnectionsPerAddress = 20_000
    /// Backpressure bounds of a server stream's queue (see `ServerStreamWriter`).
    public var streamHighWaterMark = ServerStreamWriter.defaultHighWaterMark
    public var streamLowWaterMark = ServerStreamWriter.defaultLowWaterMark
    /// A connection that has not sent the HTTP/2 preface and its SETTINGS within this is closed (10 s).
    public var handshakeTimeout: UInt64 = 10_000_000_000
    /// A request whose message has not fully arrived within this after its headers is ended with
    /// `DEADLINE_EXCEEDED REQUEST_TIMEOUT` (30 s): a client cannot hold a stream open by trickling.
    public var requestTimeout: UInt64 = 30_000_000_000
    /// A connection with no stream for this long is closed (GOAWAY; 5 min). A client with a
    /// session always has its stream open.
    public var idleTimeout: UInt64 = 300_000_000_000
    /// Response bytes queued for one connection, not yet taken by its client (flow control), at
    /// most (32 MiB); past it the connection is closed: a client that does not read cannot make
    /// the server hold responses for it without bound.
    public var maxQueuedBytesPerConnection = 32 << 20
    /// Asked once per method when the server starts (its `:path`, and `"unknown"` for paths no
    /// method serves) for what to tell when one of its calls ends (the status code, and the time
    /// from its headers to its end): for metrics. Resolved up front, so a call's end costs no
    /// lookup by path.
    public var callObserver: (@Sendable (_ path: String) -> @Sendable (_ code: GRPCStatus.Code, _ nanoseconds: UInt64) -> Void)? = nil
    /// TLS on this port (nil: cleartext HTTP/2 with prior knowledge). With a trusted CA in its
    /// configuration, clients must present a certificate from it (mutual TLS).
    public var tls: TLSContextSource? = nil

    public init(address: HostPort) {
        self.address = address
    }
}

/// A gRPC server over HTTP/2 cleartext (prior knowledge), on every loop of a group: the first loop
/// accepts and hands connections to the loops in turn, so they spread evenly over cores. One
/// listening socket, not SO_REUSEPORT, so that a second process can never bind the same port by
/// mistake and silently take half the connections.
public final class GRPCServer: Sendable {
    public let configuration: ServerConfiguration
    private let group: EventLoopGroup
    private let registry: ServiceRegistry
    private let cores = Mutex<[LoopBound<ServerCore>]>([])
    private let counter = TrafficCounter()
    private let limiter: ConnectionLimiter
    private let boundPort = Atomic<Int>(0)

    public init(configuration: ServerConfiguration, services: ServiceRegistry, group: EventLoopGroup) {
        self.configuration = configuration
        self.registry = services
        self.group = group
        self.limiter = ConnectionLimiter(limit: configuration.maxConnections, perAddress: configuration.maxConnectionsPerAddress)
    }

    /// The port the server listens on (useful after binding port 0).
    public var port: UInt16 { UInt16(boundPort.load(ordering: .relaxed)) }

    /// Connections open now.
    public var connections: Int { limiter.count }
    /// Connections accepted since the server started (open or closed since).
    public var acceptedConnections: Int { limiter.accepted }
    /// Requests and bytes this server has received since it started.
    public var traffic: (requests: Int, bytes: Int) { counter.traffic }
    /// Bytes of connections' frame buffers given back to the kernel while they were quiet.
    public var releasedIdleBufferBytes: Int { counter.releasedIdleBytes }

    /// Connections open now on each event loop, in the group's order (read on each loop).
    public func connectionsPerLoop() async -> [Int] {
        var counts: [Int] = []
        for core in cores.withLock({ $0 }) {
            counts.append(await withCheckedContinuation { done in
                // (a stopped loop runs nothing: it holds no connections)
                if !core.execute({ done.resume(returning: $0.openConnections) }) { done.resume(returning: 0) }
            })
        }
        return counts
    }

    /// Binds and starts accepting.
    public func start() throws {
        let fd = try Sockets.listen(on: configuration.address, reusePort: false)
        boundPort.store(Int(Sockets.localPort(of: fd)), ordering: .relaxed)
        let listener = SharedListener(fd: fd, users: 1)
        let routes = RouteTable(methods: registry.methods, observer: configuration.callObserver)
        for loop in group.loops {
            let ready = DispatchSemaphore(value: 0)
            let config = configuration
            let counter = self.counter
            let limiter = self.limiter
            loop.execute { [self] in
                let core = ServerCore(loop: loop, listener: listener, configuration: config, routes: routes, counter: counter, limiter: limiter)
                cores.withLock { $0.append(LoopBound(core, loop: loop)) }
                ready.signal()
            }
            ready.wait()
        }
        // The first loop accepts for all of them.
        let all = cores.withLock { $0 }
        let started = DispatchSemaphore(value: 0)
        all[0].execute { core in
            core.startAccepting(handingOffTo: all)
            started.signal()
        }
        started.wait()
    }

    /// Graceful shutdown: stop accepting, send GOAWAY, let calls in flight finish for up to
    /// `gracePeriod` nanoseconds, then end what is left with UNAVAILABLE and close.
    public func shutdown(gracePeriod: UInt64 = 5_000_000_000) async {
        let cores = self.cores.withLock { $0 }
        for c in cores { c.execute { $0.beginShutdown() } }
        let deadline = MonotonicClock.now() + gracePeriod
        while connections > 0 && MonotonicClock.now() < deadline {
            try? await Task.sleep(nanoseconds: 10_000_000)
        }
        if connections > 0 {
            for c in cores { c.execute { $0.endRemaining() } }
            let hardDeadline = MonotonicClock.now() + 1_000_000_000
            while connections > 0 && MonotonicClock.now() < hardDeadline {
                try? await Task.sleep(nanoseconds: 10_000_000)
            }
        }
    }
}

/// The listening socket the loops share; closed when the last loop lets go of it.
final class SharedListener: Sendable {
    let fd: Int32
    private let users: Atomic<Int>
    init(fd: Int32, users: Int) {
        self.fd = fd
        self.users = Atomic(users)
    }
    func release() {
        if users.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 { close(fd) }
    }
}

/// Requests and bytes a server received, across all loops.
final class TrafficCounter: Sendable {
    private let requests = Atomic<Int>(0)
    private let bytesIn = Atomic<Int>(0)
    private let idleBytesReleased = Atomic<Int>(0)
    func requested() { requests.add(1, ordering: .relaxed) }
    func released(idleBytes: Int) { idleBytesReleased.add(idleBytes, ordering: .relaxed) }
    var releasedIdleBytes: Int { idleBytesReleased.load(ordering: .relaxed) }
    func received(bytes: Int) { bytesIn.add(bytes, ordering: .relaxed) }
    var traffic: (requests: Int, bytes: Int) { (requests.load(ordering: .relaxed), bytesIn.load(ordering: .relaxed)) }
}

/// The server's state on one loop: its listener and its connections. Loop-confined.
final class ServerCore {
    let loop: EventLoop
    let shared: SharedListener
    var listener: Int32 { shared.fd }
    let configuration: ServerConfiguration
    let routes: RouteTable
    let counter: TrafficCounter
    let limiter: ConnectionLimiter
    private var connections: [ObjectIdentifier: ServerConnection] = [:]
    /// Set on the accepting loop only.
    private var acceptor: Acceptor?

    init(loop: EventLoop, listener: SharedListener, configuration: ServerConfiguration, routes: RouteTable,
         counter: TrafficCounter, limiter: ConnectionLimiter) {
        self.loop = loop
        self.shared = listener
        self.configuration = configuration
        self.routes = routes
        self.counter = counter
        self.limiter = limiter
    }

    /// Makes this core the acceptor for `all` cores.
    func startAccepting(handingOffTo all: [LoopBound<ServerCore>]) {
        let a = Acceptor(loop: loop, fd: listener, limiter: limiter, targets: all.map { core in
            (loop: core.loop, adopt: { fd, address in core.value.adopt(fd, from: address) })
        })
        a.onLoopStopping = { [unowned self] in self.stopAccepting() }
        acceptor = a
        a.start()
    }

    var openConnections: Int { connections.count }

    /// Remote addresses of this loop's connections (to count them down when they close).
    private var addresses: [ObjectIdentifier: [UInt8]] = [:]

    /// Serves a connection accepted on (possibly) another loop.
    @discardableResult
    func adopt(_ fd: Int32, from address: [UInt8]) -> ServerConnection? {
        let c = ServerConnection(fd: fd, loop: loop, core: self)
        if let tls = configuration.tls {
            guard let pipe = TLSPipe(context: tls.context) else {
                close(fd)
                limiter.release(from: address)
                return nil
            }
            c.tls = pipe
        }
        connections[ObjectIdentifier(c)] = c
        addresses[ObjectIdentifier(c)] = address
        c.start(server: true)
        c.armHandshakeAndIdleTimers()
        return c
    }

    /// (the acceptor refers to every core, itself included: dropping it breaks that cycle)
    private func stopAccepting() {
        guard let a = acceptor else { return }
        acceptor = nil
        a.stop()
        shared.release()
    }

    func connectionClosed(_ c: ServerConnection) {
        connections.removeValue(forKey: ObjectIdentifier(c))
        if let a = addresses.removeValue(forKey: ObjectIdentifier(c)) { limiter.release(from: a) }
    }

    func streamClosed(on c: ServerConnection) {}

    func beginShutdown() {
        stopAccepting()
        for c in connections.values { c.beginDraining() }
    }

    func endRemaining() {
        for c in connections.values { c.endRemainingStreams() }
    }
}
