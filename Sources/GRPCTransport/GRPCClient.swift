import EventLoop
import PresenceWire
import Synchronization

/// Settings of a gRPC client.
public struct ClientConfiguration: Sendable {
    public var target: HostPort
    /// Connections in the pool; calls are spread over them and multiplexed on each.
    public var connections = 1
    /// The group's loop the first connection goes on (the others follow it round the group):
    /// clients of several servers spread over the loops instead of all sharing the first.
    public var firstLoop = 0
    public var http2 = HTTP2Settings()
    /// Largest response message accepted.
    public var maxReceiveMessageSize = 4 * 1024 * 1024
    /// Headers sent with every call (for example a user's token).
    public var metadata: [(String, String)] = []
    /// Headers computed for each call from its method path and request message (protobuf bytes),
    /// when it is sent: a request signature, for example (peer authentication).
    public var callMetadata: (@Sendable (_ path: String, _ message: ArraySlice<UInt8>) -> [(String, String)])? = nil
    /// TLS to the server (nil: cleartext HTTP/2). Its certificate, if any, is presented when the
    /// server asks for one (mutual TLS).
    public var tls: TLSContextSource? = nil
    /// A connect not finished within this fails its calls (UNAVAILABLE CONNECT_FAILED) and the
    /// next call tries again (nil: wait as long as the kernel does, over a minute).
    public var connectTimeout: UInt64? = nil

    public init(target: HostPort) {
        self.target = target
    }
}

/// A gRPC client for one server address: a small pool of HTTP/2 connections, each on a loop of
/// the group, opened on first use and reopened after they close.
public final class GRPCClient: Sendable {
    public let configuration: ClientConfiguration
    private let slots: [ConnectionSlot]
    private let counter = Atomic<Int>(0)

    public init(configuration: ClientConfiguration, group: EventLoopGroup) {
        self.configuration = configuration
        slots = (0..<max(1, configuration.connections)).map { i in
            ConnectionSlot(loop: group.loops[(i + max(0, configuration.firstLoop)) % group.loops.count], configuration: configuration)
        }
    }

    public convenience init(target: HostPort, group: EventLoopGroup) {
        self.init(configuration: ClientConfiguration(target: target), group: group)
    }

    /// The loop of the client's first connection: a task that mostly calls this client runs
    /// best there (no thread hop to send, none to resume with the answer).
    public var preferredLoop: EventLoop { slots[0].loop }

    private func nextSlot() -> ConnectionSlot {
        slots[counter.add(1, ordering: .relaxed).oldValue % slots.count]
    }

    /// Calls a unary method. Throws `GRPCStatus` for any status but OK.
    public func unary<Req, Resp>(_ method: MethodDescriptor<Req, Resp>, _ request: Req, timeout: Duration? = nil) async throws -> Resp {
        let bytes = try await unary(path: method.path, framedRequest: MessageFraming.framed(request), timeout: timeout.map(Self.nanoseconds))
        do {
            return try Resp(serializedBytes: bytes)
        } catch {
            throw GRPCStatus(.internal, "MALFORMED_RESPONSE: \(error)")
        }
    }

    /// Calls a unary method with raw framed request bytes; returns the response's protobuf bytes.
    public func unary(path: String, framedRequest: [UInt8], timeout: UInt64?) async throws -> [UInt8] {
        let slot = nextSlot()
        let handle = CallHandle()
        let maxSize = configuration.maxReceiveMessageSize
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<[UInt8], Error>) in
                let accepted = slot.loop.execute {
                    slot.start(ClientCall(path: path, body: framedRequest, timeout: timeout, handle: handle, sink: .unary(c), maxMessageSize: maxSize))
                }
                if !accepted { c.resume(throwing: GRPCStatus(.unavailable, "CLIENT_STOPPED: the client's event loop has stopped")) }
            }
        } onCancel: {
            handle.cancel()
            slot.loop.execute { slot.cancel(handle) }
        }
    }

    /// Calls a server-streaming method; iterate the result for the responses.
    public func serverStreaming<Req, Resp>(_ method: MethodDescriptor<Req, Resp>, _ request: Req, timeout: Duration? = nil) -> ServerStreamingCall<Resp> {
        ServerStreamingCall(state: startStream(path: method.path, framedRequest: MessageFraming.framed(request),
                                               timeout: timeout.map(Self.nanoseconds)))
    }

    /// Calls a server-streaming method with a raw framed request; the responses come undecoded
    /// (for tools that only count or forward them).
    public func serverStreaming(path: String, framedRequest: [UInt8], timeout: UInt64? = nil) -> RawServerStreamingCall {
        RawServerStreamingCall(state: startStream(path: path, framedRequest: framedRequest, timeout: timeout))
    }

    private func startStream(path: String, framedRequest: [UInt8], timeout: UInt64?) -> ResponseStreamState {
        let slot = nextSlot()
        let handle = CallHandle()
        let maxSize = configuration.maxReceiveMessageSize
        let state = ResponseStreamState(
            consume: { bytes in slot.loop.execute { slot.consumed(handle, bytes) } },
            cancelCall: {
                handle.cancel()
                slot.loop.execute { slot.cancel(handle) }
            })
        let accepted = slot.loop.execute {
            slot.start(ClientCall(path: path, body: framedRequest, timeout: timeout, handle: handle, sink: .stream(state), maxMessageSize: maxSize))
        }
        if !accepted { state.finish(GRPCStatus(.unavailable, "CLIENT_STOPPED: the client's event loop has stopped")) }
        return state
    }

    /// Calls a server-streaming method and hands each response's protobuf bytes to `onMessage` on
    /// the connection's loop thread, as it arrives (no task switch per message: for consumers that
    /// must keep up with many messages and never wait). `onEnd` gets the final status.
    /// Returns a function that cancels the call.
    public func serverStreaming(path: String, framedRequest: [UInt8], onMessage: @escaping @Sendable ([UInt8]) -> Void,
                                onEnd: @escaping @Sendable (GRPCStatus) -> Void) -> @Sendable () -> Void {
        let slot = nextSlot()
        let handle = CallHandle()
        let maxSize = configuration.maxReceiveMessageSize
        let accepted = slot.loop.execute {
            slot.start(ClientCall(path: path, body: framedRequest, timeout: nil, handle: handle,
                                  sink: .callback(onMessage, onEnd), maxMessageSize: maxSize))
        }
        if !accepted { onEnd(GRPCStatus(.unavailable, "CLIENT_STOPPED: the client's event loop has stopped")) }
        return {
            handle.cancel()
            slot.loop.execute { slot.cancel(handle) }
        }
    }

    /// Closes every connection; calls in flight fail with UNAVAILABLE.
    public func close() {
        for s in slots { s.loop.execute { s.close() } }
    }

    static func nanoseconds(_ d: Duration) -> UInt64 {
        let (s, atto) = d.components
        if s < 0 { return 0 }
        // (saturating: a timeout past what UInt64 nanoseconds hold is as good as none)
        let (whole, o1) = UInt64(s).multipliedReportingOverflow(by: 1_000_000_000)
        let (total, o2) = whole.addingReportingOverflow(UInt64(max(0, atto) / 1_000_000_000))
        return o1 || o2 ? .max : total
    }
}

/// One connection of the pool, replaced when it closes or is told to go away.
///
/// `@unchecked Sendable`: it is created on any thread but all its state is read and written only
/// on `loop`'s thread (every method asserts it); other threads only call `loop.execute`.
final class ConnectionSlot: @unchecked Sendable {
    let loop: EventLoop
    private let configuration: ClientConfiguration
    private var connection: ClientConnection?
    private var callsByHandle: [ObjectIdentifier: (ClientConnection, ClientCall)] = [:]

    init(loop: EventLoop, configuration: ClientConfiguration) {
        self.loop = loop
        self.configuration = configuration
    }

    private func usableConnection() throws -> ClientConnection {
        loop.assertInLoop()
        if let c = connection, c.isUsable { return c }
        var pipe: TLSPipe? = nil
        if let tls = configuration.tls {
            guard let p = TLSPipe(context: tls.context) else { throw TLSError("cannot start TLS") }
            pipe = p
        }
        let fd = try Sockets.connect(to: configuration.target)
        let c = ClientConnection(fd: fd, loop: loop, settings: configuration.http2,
                                 authority: configuration.target.description, maxMessageSize: configuration.maxReceiveMessageSize,
                                 metadata: configuration.metadata, callMetadata: configuration.callMetadata)
        c.tls = pipe
        if let t = configuration.connectTimeout { c.armConnectTimeout(t) }
        c.onClosed = { [weak self, unowned c] in
            guard let self else { return }
            if self.connection === c { self.connection = nil }
            self.callsByHandle = self.callsByHandle.filter { $0.value.0 !== c }
        }
        connection = c
        return c
    }

    func start(_ call: ClientCall) {
        loop.assertInLoop()
        let c: ClientConnection
        do {
            c = try usableConnection()
        } catch {
            call.complete(GRPCStatus(.unavailable, "CONNECT_FAILED: \(error)"))
            return
        }
        switch call.sink {
        case .stream?, .callback?: callsByHandle[ObjectIdentifier(call.handle)] = (c, call)
        default: break
        }
        c.start(call)
    }

    func cancel(_ handle: CallHandle) {
        loop.assertInLoop()
        if let (c, call) = callsByHandle.removeValue(forKey: ObjectIdentifier(handle)) {
            c.fail(call, GRPCStatus(.cancelled, "CANCELLED: the call was cancelled"))
            return
        }
        // unary calls: find by handle on the current connection
        connection?.cancel(handle)
    }

    func consumed(_ handle: CallHandle, _ bytes: Int) {
        loop.assertInLoop()
        guard let (c, call) = callsByHandle[ObjectIdentifier(handle)] else { return }
        if call.sink == nil {
            callsByHandle[ObjectIdentifier(handle)] = nil
            return
        }
        c.consumed(streamID: call.streamID, bytes: bytes)
    }

    func close() {
        loop.assertInLoop()
        connection?.close(reason: "client closed")
        connection = nil
    }
}
