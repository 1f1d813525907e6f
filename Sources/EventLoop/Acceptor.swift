import CSystemShim
import Glibc
import Synchronization

/// Connections a server holds, against its limits: in all, and from one remote address.
public final class ConnectionLimiter: Sendable {
    public let limit: Int
    public let perAddress: Int
    private let open = Atomic<Int>(0)
    private let everOpened = Atomic<Int>(0)
    /// Open connections by remote address (raw sockaddr address bytes).
    private let byAddress = Mutex<[[UInt8]: Int]>([:])

    public init(limit: Int, perAddress: Int) {
        self.limit = limit
        self.perAddress = perAddress
    }

    /// Counts a connection from `address`; false (nothing counted) when over either limit.
    public func admit(from address: [UInt8]) -> Bool {
        guard open.add(1, ordering: .relaxed).newValue <= limit else {
            open.subtract(1, ordering: .relaxed)
            return false
        }
        let ok = byAddress.withLock { m in
            let n = m[address, default: 0]
            guard n < perAddress else { return false }
            m[address] = n + 1
            return true
        }
        guard ok else {
            open.subtract(1, ordering: .relaxed)
            return false
        }
        everOpened.add(1, ordering: .relaxed)
        return true
    }

    /// A connection `admit` counted has closed.
    public func release(from address: [UInt8]) {
        open.subtract(1, ordering: .relaxed)
        byAddress.withLock { m in
            let n = m[address, default: 0] - 1
            m[address] = n > 0 ? n : nil
        }
    }

    /// Connections open now.
    public var count: Int { open.load(ordering: .relaxed) }
    /// Connections admitted since the start.
    public var accepted: Int { everOpened.load(ordering: .relaxed) }
}

/// Accepts connections on one loop and hands each to the next of `targets` in turn, so they
/// spread evenly over the loops; connections over the limiter's bounds are closed at once.
/// Loop-confined to `loop`.
public final class Acceptor: FileDescriptorHandler {
    public let loop: EventLoop
    public let fd: Int32
    private let limiter: ConnectionLimiter
    private var targets: [(loop: EventLoop, adopt: @Sendable (Int32, [UInt8]) -> Void)]
    private var next = 0
    private var listening = false
    /// Called if the loop stops while this still accepts (the owner releases the socket then).
    public var onLoopStopping: (() -> Void)?
    private static let events = UInt32(EPOLLIN.rawValue)

    /// `targets` adopt a connection (its descriptor and remote address) on their loop; they
    /// must call `limiter.release(from:)` when it closes.
    public init(loop: EventLoop, fd: Int32, limiter: ConnectionLimiter,
                targets: [(loop: EventLoop, adopt: @Sendable (Int32, [UInt8]) -> Void)]) {
        self.loop = loop
        self.fd = fd
        self.limiter = limiter
        self.targets = targets
    }

    public func start() {
        listening = true
        loop.register(fd: fd, events: Self.events, handler: self)
    }

    /// Stops accepting (the listening socket stays open: its owner closes it).
    public func stop() {
        guard listening else { return }
        listening = false
        loop.unregister(fd: fd)
        targets = []
        onLoopStopping = nil
    }

    public func loopStopping() {
        listening = false
        targets = []
        let stopped = onLoopStopping
        onLoopStopping = nil
        stopped?()
    }

    public func handleEvents(_ events: UInt32) {
        while listening {
            let conn: Int32?
            do {
                conn = try Sockets.accept(fd)
            } catch {
                // out of file descriptors: pause accepting briefly rather than spin
                loop.unregister(fd: fd)
                loop.scheduleTimer(after: 100_000_000) { [weak self] in
                    guard let self, self.listening else { return }
                    self.loop.register(fd: self.fd, events: Self.events, handler: self)
                }
                return
            }
            guard let conn else { return }
            let address = Sockets.remoteAddress(conn)
            guard !targets.isEmpty, limiter.admit(from: address) else {
                close(conn)
                continue
            }
            let target = targets[next % targets.count]
            next &+= 1
            if target.loop === loop {
                target.adopt(conn, address)
            } else {
                let adopt = target.adopt
                if !target.loop.execute({ adopt(conn, address) }) {
                    close(conn)
                    limiter.release(from: address)
                }
            }
        }
    }
}

extension Sockets {
    /// The remote IP address of a connected socket, as bytes (empty if unknown).
    public static func remoteAddress(_ fd: Int32) -> [UInt8] {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &len) } }
        guard rc == 0 else { return [] }
        switch Int32(storage.ss_family) {
        case AF_INET:
            return withUnsafeBytes(of: &storage) { raw in
                raw.withMemoryRebound(to: sockaddr_in.self) { Array(withUnsafeBytes(of: $0[0].sin_addr) { Array($0) }) }
            }
        case AF_INET6:
            return withUnsafeBytes(of: &storage) { raw in
                raw.withMemoryRebound(to: sockaddr_in6.self) { Array(withUnsafeBytes(of: $0[0].sin6_addr) { Array($0) }) }
            }
        default:
            return []
        }
    }
}
