import EventLoop
import PresenceWire
import Synchronization

/// What a handler knows about the call it serves.
public struct ServerContext: Sendable {
    /// The method's `:path`.
    public let path: String
    /// The call's deadline (monotonic nanoseconds), when the client sent `grpc-timeout`.
    public let deadline: UInt64?
    /// Request headers that are not part of HTTP/2 or gRPC framing (`authorization`, custom ones).
    public let metadata: [(String, String)]

    public init(path: String, deadline: UInt64?, metadata: [(String, String)]) {
        self.path = path
        self.deadline = deadline
        self.metadata = metadata
    }
}

/// How one method is served. Handlers take the request's protobuf bytes and give back framed
/// responses (5-byte gRPC header included), so a response is encoded straight into its frame.
public enum ServerMethod: Sendable {
    /// Runs on the connection's loop thread: for cheap answers that never wait (health checks).
    case unaryInline(@Sendable ([UInt8], ServerContext) throws -> [UInt8])
    /// Runs as a task: may await actors, other nodes...
    case unary(@Sendable ([UInt8], ServerContext) async throws -> [UInt8])
    /// Starts on the connection's loop thread and answers there when it needs no wait (no task
    /// started, nothing suspended); else hands back the rest of the call, which runs as a task.
    case unaryStaged(@Sendable ([UInt8], ServerContext) throws -> Staged<[UInt8], any Error>)
    /// Runs as a task that sends any number of messages through the writer.
    case serverStreaming(@Sendable ([UInt8], ServerContext, ServerStreamWriter) async throws -> Void)
    /// Starts when the request's headers arrive; reads the client's messages as they come and
    /// sends any number back.
    case bidiStreaming(@Sendable (RequestMessages, ServerContext, ServerStreamWriter) async throws -> Void)
}

extension ServerMethod {
    /// The RFC 9218 urgency of the method's responses on a connection (lower goes first): a
    /// unary answer is one message, so on a congested connection it goes before the streams of
    /// events, which take turns among themselves (`ServerConnection.schedule`).
    public var sendUrgency: UInt32 {
        switch self {
        case .unaryInline, .unary, .unaryStaged: return 2
        case .serverStreaming, .bidiStreaming: return 3
        }
    }

    /// A unary method's handler as one async function (for front doors other than gRPC's), nil
    /// for a streaming one.
    public var asyncUnary: (@Sendable ([UInt8], ServerContext) async throws -> [UInt8])? {
        switch self {
        case .unary(let handler): return handler
        case .unaryInline(let handler): return { bytes, ctx in try handler(bytes, ctx) }
        case .unaryStaged(let handler): return { bytes, ctx in try await handler(bytes, ctx).value }
        case .serverStreaming, .bidiStreaming: return nil
        }
    }
}

/// The request messages of a bidirectional call, as they arrive; ends when the client half-closes.
/// Bounded: a client that sends more than `limit` messages, or more than `byteLimit` bytes past
/// the first, that the handler has not read yet is refused (RESOURCE_EXHAUSTED), so a flood cannot
/// grow the queue.
public final class RequestMessages: AsyncSequence, Sendable {
    public typealias Element = [UInt8]
    public static let defaultLimit = 64
    public static let defaultByteLimit = 1 << 20
    private struct State {
        var queue: [[UInt8]] = []
        var head = 0
        var queuedBytes = 0
        var ended: GRPCStatus?? = nil   // nil: open; .some(nil): half-closed; .some(status): failed
        var waiter: Suspended<[UInt8]?, Error>? = nil
    }
    private let state = Mutex(State())
    public let limit: Int
    public let byteLimit: Int

    init(limit: Int = RequestMessages.defaultLimit, byteLimit: Int = RequestMessages.defaultByteLimit) {
        self.limit = limit
        self.byteLimit = byteLimit
    }

    /// Loop side: a message arrived; false when too many wait unread.
    func push(_ message: [UInt8]) -> Bool {
        let (ok, waiter) = state.withLock { s -> (Bool, Suspended<[UInt8]?, Error>?) in
            guard s.ended == nil else { return (true, nil) }
            if let w = s.waiter {
                s.waiter = nil
                return (true, w)
            }
            let waiting = s.queue.count - s.head
            guard waiting < limit, waiting == 0 || s.queuedBytes + message.count <= byteLimit else { return (false, nil) }
            s.queue.append(message)
            s.queuedBytes += message.count
            return (true, nil)
        }
        waiter?.continuation.resume(returning: message)
        return ok
    }

    /// Loop side: the client half-closed (`nil`) or the call ended (`status`).
    func end(_ status: GRPCStatus?) {
        let waiter = state.withLock { s -> Suspended<[UInt8]?, Error>? in
            if s.ended == nil { s.ended = .some(status) }
            let w = s.waiter
            s.waiter = nil
            return w
        }
        if let status { waiter?.continuation.resume(throwing: status) } else { waiter?.continuation.resume(returning: nil) }
    }

    /// The next message, nil once the client half-closed; throws when the call ended otherwise.
    public func next() async throws -> [UInt8]? {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<[UInt8]?, Error>) in
            let outcome = state.withLock { s -> Result<[UInt8]?, Error>? in
                if s.head < s.queue.count {
                    let m = s.queue[s.head]
                    s.head += 1
                    s.queuedBytes -= m.count
                    if s.head > 32, s.head * 2 > s.queue.count {
                        s.queue.removeFirst(s.head)
                        s.head = 0
                    }
                    return .success(m)
                }
                switch s.ended {
                case .some(nil): return .success(nil)
                case .some(.some(let status)): return .failure(status)
                case nil:
                    s.waiter = Suspended(c)
                    return nil
                }
            }
            if let outcome { c.resume(with: outcome) }
        }
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        let source: RequestMessages
        public mutating func next() async throws -> [UInt8]? { try await source.next() }
    }
    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(source: self) }
}

/// The methods a server serves, by `:path`. Unknown paths answer `UNIMPLEMENTED`.
///
/// (The typed registrations are inlinable so that each method's closure is specialised for its
/// message types where it is registered; made generically here, every call looked up the types'
/// metadata at run time.)
public struct ServiceRegistry: Sendable {
    public private(set) var methods: [String: ServerMethod] = [:]

    public init() {}

    public mutating func register(path: String, _ method: ServerMethod) {
        methods[path] = method
    }

    @usableFromInline static func decode<M: ProtoMessage>(_ type: M.Type, _ bytes: [UInt8]) throws -> M {
        do {
            return try M(serializedBytes: bytes)
        } catch let e as WireError {
            throw GRPCStatus(.invalidArgument, "MALFORMED_REQUEST: \(e)")
        }
    }

    /// A unary method served on the loop thread (must not block).
    @inlinable public mutating func unaryInline<Req, Resp>(_ m: MethodDescriptor<Req, Resp>, _ handler: @escaping @Sendable (Req, ServerContext) throws -> Resp) {
        register(path: m.path, .unaryInline { bytes, ctx in
            MessageFraming.framed(try handler(try Self.decode(Req.self, bytes), ctx))
        })
    }

    /// A unary method served by an async handler.
    @inlinable public mutating func unary<Req, Resp>(_ m: MethodDescriptor<Req, Resp>, _ handler: @escaping @Sendable (Req, ServerContext) async throws -> Resp) {
        register(path: m.path, .unary { bytes, ctx in
            MessageFraming.framed(try await handler(try Self.decode(Req.self, bytes), ctx))
        })
    }

    /// A unary method that answers at once on the connection's loop when it can, and otherwise
    /// hands back the rest of the call (`ServerMethod.unaryStaged`).
    @inlinable public mutating func unaryStaged<Req, Resp>(_ m: MethodDescriptor<Req, Resp>, _ handler: @escaping @Sendable (Req, ServerContext) throws -> Staged<Resp, any Error>) {
        register(path: m.path, .unaryStaged { bytes, ctx in
            try handler(try Self.decode(Req.self, bytes), ctx).map { MessageFraming.framed($0) }
        })
    }

    /// `unaryStaged` with the response already encoded (a `Resp` as protobuf bytes).
    @inlinable public mutating func unaryStagedEncoded<Req, Resp>(_ m: MethodDescriptor<Req, Resp>, _ handler: @escaping @Sendable (Req, ServerContext) throws -> Staged<[UInt8], any Error>) {
        register(path: m.path, .unaryStaged { bytes, ctx in
            try handler(try Self.decode(Req.self, bytes), ctx).map { MessageFraming.framed(encoded: $0) }
        })
    }

    /// A unary method whose async handler answers with the response already encoded (a `Resp` as
    /// protobuf bytes), for answers kept encoded between calls.
    @inlinable public mutating func unaryEncoded<Req, Resp>(_ m: MethodDescriptor<Req, Resp>, _ handler: @escaping @Sendable (Req, ServerContext) async throws -> [UInt8]) {
        register(path: m.path, .unary { bytes, ctx in
            MessageFraming.framed(encoded: try await handler(try Self.decode(Req.self, bytes), ctx))
        })
    }

    /// A bidirectional streaming method: requests decoded as they arrive (a malformed one ends
    /// the call with INVALID_ARGUMENT), responses sent through the writer.
    public mutating func bidiStreaming<Req, Resp>(_ m: MethodDescriptor<Req, Resp>,
                                                  _ handler: @escaping @Sendable (AsyncThrowingMapSequence<RequestMessages, Req>, ServerContext, ResponseWriter<Resp>) async throws -> Void) {
        register(path: m.path, .bidiStreaming { requests, ctx, writer in
            try await handler(requests.map { try Self.decode(Req.self, $0) }, ctx, ResponseWriter(raw: writer))
        })
    }

    /// A server-streaming method.
    public mutating func serverStreaming<Req, Resp>(_ m: MethodDescriptor<Req, Resp>, _ handler: @escaping @Sendable (Req, ServerContext, ResponseWriter<Resp>) async throws -> Void) {
        register(path: m.path, .serverStreaming { bytes, ctx, writer in
            try await handler(try Self.decode(Req.self, bytes), ctx, ResponseWriter(raw: writer))
        })
    }
}

/// Framing of one message for the wire.
public enum MessageFraming {
    /// The message's bytes behind a 5-byte gRPC message header, in one allocation.
    public static func framed<M: ProtoMessage>(_ message: M) -> [UInt8] {
        var bytes = message.serializedBytes(prefix: 5)
        MessageDeframer.writeHeader(into: &bytes, length: bytes.count - 5)
        return bytes
    }

    /// Bytes of an already encoded message behind a 5-byte gRPC message header.
    public static func framed(encoded message: [UInt8]) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 5)
        bytes.reserveCapacity(5 + message.count)
        MessageDeframer.writeHeader(into: &bytes, length: message.count)
        bytes.append(contentsOf: message)
        return bytes
    }
}

/// Typed face of a `ServerStreamWriter`.
public struct ResponseWriter<Response: ProtoMessage>: Sendable {
    public let raw: ServerStreamWriter

    /// Sends one message; suspends while the client is too slow to take more (backpressure).
    public func send(_ message: Response) async throws {
        try await raw.send(framed: MessageFraming.framed(message))
    }
}

/// Sends the messages of a server-streaming call. Bounded: when more than `highWaterMark` bytes
/// wait for the client, `send` suspends until they drain below `lowWaterMark`, so a slow reader
/// cannot make the server hold an unbounded backlog; `trySend` never waits and refuses instead.
/// Messages sent from other threads reach the connection's loop in batches: one hop per burst.
///
/// A coalescing writer (an HTTP/2 stream's) copies each message's bytes into a buffer of its own
/// and hands the connection one copy of them all per drain: no message's storage is shared
/// between the thread that sends it and the connection's. An event fanned out to a thousand
/// subscribers is one buffer; shared, its reference count took an atomic operation from each
/// side for every subscriber, on one cache line the two loops' cores passed back and forth (27%
/// of a fan-out profile was retain and release). A writer that is not coalescing (the WebSocket
/// front door's) hands over each message as it was sent: that door caches an event's JSON text
/// by its buffer.
public final class ServerStreamWriter: Sendable {
    public static let defaultHighWaterMark = 256 * 1024
    public static let defaultLowWaterMark = 64 * 1024
    /// What `trySend` accepts at most in the queue.
    public static let defaultHardLimit = 4 * 1024 * 1024

    private struct State {
        /// What waits for the connection: each message (not coalescing)...
        var pending: [[UInt8]] = []
        /// ...or all of them back to back (coalescing).
        var pendingBytes: [UInt8] = []
        var hopScheduled = false
        var queuedBytes = 0
        var peakQueuedBytes = 0
        var suspensions = 0
        var waiter: Suspended<Void, Error>? = nil
        var closed: GRPCStatus? = nil
        /// Asks the connection's loop to take `pending`; dropped when the call ends, so a writer
        /// kept around afterwards does not keep the connection alive.
        var scheduleDrain: (@Sendable () -> Void)?
    }

    private let state: Mutex<State>
    public let highWaterMark: Int
    public let lowWaterMark: Int
    public let hardLimit: Int
    /// Whether messages are copied into one buffer of the writer's (see the type's comment).
    public let coalesces: Bool
    /// A coalescing writer keeps its buffer between drains up to this capacity (a subscriber's
    /// events are small; a big SNAPSHOT page's buffer is given back).
    static var keptCoalescingCapacity: Int { 2048 }

    /// A writer drained by something other than an HTTP/2 stream (the WebSocket front door):
    /// `scheduleDrain` asks it to come and `takePending()`, and it reports each message it wrote
    /// with `drained(_:)`, which is what frees room and wakes a waiting sender.
    /// `coalescing`: see the type's comment (`takePending()` then returns at most one array).
    public init(highWaterMark: Int = defaultHighWaterMark, lowWaterMark: Int = defaultLowWaterMark,
         hardLimit: Int = defaultHardLimit, coalescing: Bool = false, scheduleDrain: @escaping @Sendable () -> Void) {
        self.highWaterMark = highWaterMark
        self.lowWaterMark = lowWaterMark
        self.hardLimit = hardLimit
        self.coalesces = coalescing
        self.state = Mutex(State(scheduleDrain: scheduleDrain))
    }

    private func enqueue(_ bytes: [UInt8], refuseAbove limit: Int?) throws -> (accepted: Bool, mustWait: Bool) {
        // (the drain closure leaves the lock through a captured variable: returned through
        // `withLock`'s generic result, it was re-wrapped in a thunk allocated per delivery)
        var drain: (@Sendable () -> Void)? = nil
        let (accepted, mustWait) = try state.withLock { s -> (Bool, Bool) in
            if let closed = s.closed { throw closed }
            // (refused when the client already has more than the limit waiting, so one delivery
            // larger than the limit, a paged SNAPSHOT of a big channel, still reaches a client that
            // keeps up; the queue holds at most the limit plus one delivery)
            if let limit, s.queuedBytes > limit { return (false, false) }
            if coalesces {
                s.pendingBytes.append(contentsOf: bytes)
            } else {
                s.pending.append(bytes)
            }
            s.queuedBytes += bytes.count
            s.peakQueuedBytes = max(s.peakQueuedBytes, s.queuedBytes)
            if !s.hopScheduled {
                s.hopScheduled = true
                drain = s.scheduleDrain
            }
            return (true, s.queuedBytes > highWaterMark)
        }
        drain?()
        return (accepted, mustWait)
    }

    /// Sends one framed message (5-byte header included); suspends while the client is too slow.
    public func send(framed bytes: [UInt8]) async throws {
        let (_, mustWait) = try enqueue(bytes, refuseAbove: nil)
        guard mustWait else { return }
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, Error>) in
            let outcome = state.withLock { s -> Result<Void, Error>? in
                if let closed = s.closed { return .failure(closed) }
                if s.queuedBytes <= lowWaterMark { return .success(()) }
                s.suspensions += 1
                s.waiter = Suspended(c)
                return nil
            }
            if let outcome { c.resume(with: outcome) }
        }
    }

    /// Queues framed bytes (one message or several back to back) without waiting. False when
    /// the call is over, or when more than `hardLimit` bytes already wait for this client (they
    /// are then not sent).
    public func trySend(framed bytes: [UInt8]) -> Bool {
        (try? enqueue(bytes, refuseAbove: hardLimit).accepted) ?? false
    }

    /// Loop side: the messages handed over since the last drain.
    public func takePending() -> [[UInt8]] {
        var taken: [[UInt8]] = []
        _ = takePending(appendingTo: &taken)
        return taken
    }

    /// Loop side: appends the messages handed over since the last drain to `queue`; returns their
    /// bytes. The writer keeps its array's storage when it is small (a subscriber gets one event per
    /// drain, most often: taking the array whole made the next event allocate a new one, and the
    /// connection's thread free it, once per delivery).
    public func takePending(appendingTo queue: inout [[UInt8]]) -> Int {
        state.withLock { s in
            s.hopScheduled = false
            if coalesces {
                let n = s.pendingBytes.count
                guard n > 0 else { return 0 }
                // (a copy made on the connection's thread, and freed there once written: the
                // writer's own buffer stays with it)
                queue.append(s.pendingBytes.withUnsafeBufferPointer { Array($0) })
                s.pendingBytes.removeAll(keepingCapacity: s.pendingBytes.capacity <= Self.keptCoalescingCapacity)
                return n
            }
            var n = 0
            for i in s.pending.indices { n += s.pending[i].count }
            queue.append(contentsOf: s.pending)
            s.pending.removeAll(keepingCapacity: s.pending.count <= 8)
            return n
        }
    }

    /// Bytes handed to the connection that the client has not taken yet.
    public var queuedBytes: Int { state.withLock { $0.queuedBytes } }
    /// The most bytes ever queued at once (for tests and metrics).
    public var peakQueuedBytes: Int { state.withLock { $0.peakQueuedBytes } }
    /// How many times `send` had to wait for the client.
    public var suspensions: Int { state.withLock { $0.suspensions } }
    /// Non-nil once the call is over (the client went away, the deadline passed...).
    public var closedStatus: GRPCStatus? { state.withLock { $0.closed } }

    /// The connection wrote `count` bytes of this stream.
    public func drained(_ count: Int) {
        let waiter = state.withLock { s -> Suspended<Void, Error>? in
            s.queuedBytes -= count
            if s.queuedBytes <= lowWaterMark, let w = s.waiter {
                s.waiter = nil
                return w
            }
            return nil
        }
        waiter?.continuation.resume()
    }

    /// The call is over: pending and later sends fail with `status`.
    public func close(_ status: GRPCStatus) {
        let waiter = state.withLock { s -> Suspended<Void, Error>? in
            if s.closed == nil { s.closed = status }
            s.scheduleDrain = nil
            s.pending = []
            s.pendingBytes = []
            let w = s.waiter
            s.waiter = nil
            return w
        }
        waiter?.continuation.resume(throwing: status)
    }
}
