import CNGHTTP2
import CSystemShim
import EventLoop
import Glibc

/// Settings of the HTTP/2 layer shared by server and client connections.
public struct HTTP2Settings: Sendable {
    /// SETTINGS_MAX_CONCURRENT_STREAMS advertised to the peer.
    public var maxConcurrentStreams: UInt32 = 1024
    /// SETTINGS_INITIAL_WINDOW_SIZE (per stream receive window).
    public var initialWindowSize: UInt32 = 1 << 20
    /// Receive window of the whole connection.
    public var connectionWindowSize: Int32 = 16 << 20
    /// SETTINGS_MAX_FRAME_SIZE.
    public var maxFrameSize: UInt32 = 16384
    /// SETTINGS_HEADER_TABLE_SIZE (HPACK dynamic table the peer may use towards us).
    public var headerTableSize: UInt32 = 4096
    /// SETTINGS_MAX_HEADER_LIST_SIZE: the decoded header bytes (name + value + 32 per field, as
    /// RFC 9113 counts them) one request may carry; a server refuses more with RESOURCE_EXHAUSTED.
    /// HPACK makes a few bytes on the wire decode to kilobytes, so this bounds memory per stream.
    public var maxHeaderListSize: UInt32 = 16 * 1024
    /// Metadata entries (other than gRPC's own headers) a server keeps per request.
    public var maxMetadataEntries = 32
    /// Whether a server keeps RFC 7540's stream priority tree. Off by default: a server then sends
    /// SETTINGS_NO_RFC7540_PRIORITIES = 1 (RFC 9218), ignores the priorities clients send to the
    /// methods it serves, and nghttp2 sends unary answers before streamed messages, the streams
    /// of each urgency taking turns (`ServerMethod.sendUrgency`). With the tree, closed streams
    /// were kept in it and every stream's DATA went through its parent's queue (Health/Check
    /// took 8.7% more CPU per call); gRPC gives streams no priorities, and peers could make the
    /// tree work for them (RFC 9113, 5.3.2). Client connections keep the tree: their streams'
    /// turns are unchanged.
    public var rfc7540Priorities = false
    /// Idle time before a keepalive PING, and how long to wait for its answer.
    public var keepaliveInterval: UInt64 = 30_000_000_000
    public var keepaliveTimeout: UInt64 = 10_000_000_000
    /// After this long with nothing sent, the connection's outbound frame buffer is given back to
    /// the kernel (see `IdleBufferStateMachine`): what keeps an idle connection light.
    public var releaseIdleBuffersAfter: UInt64 = 2_000_000_000

    public init() {}
}

/// One HTTP/2 connection on one socket: nghttp2 does the protocol, this class the I/O.
/// Server and client connections subclass it and receive nghttp2's callbacks.
/// Loop-confined: every method runs on `loop`'s thread. Its mutable fields are
/// `@exclusivity(unchecked)` for the reasons `ServerStream` gives: one thread, and no access to a
/// field open across a call into nghttp2 or anything else that could reach the field again.
open class HTTP2Connection: FileDescriptorHandler, FlushHandler {
    public let loop: EventLoop
    let fd: Int32
    @exclusivity(unchecked) var session: OpaquePointer?
    @exclusivity(unchecked) private var outbound: [UInt8] = []
    /// `flush` writes once this much is buffered (a frame may take it up to 16 KiB past), so the
    /// buffer of a busy connection settles at 64 KiB...
    static let writeAt = 47 * 1024
    /// ...which is what it keeps between flushes at most.
    static let keptOutbound = 64 * 1024
    @exclusivity(unchecked) private var outboundOffset = 0
    @exclusivity(unchecked) private var flushScheduled = false
    @exclusivity(unchecked) private var writableWanted = false
    @exclusivity(unchecked) public private(set) var isClosed = false
    /// Calls into nghttp2 (`mem_recv`, `mem_send`) under way on this connection's stack: the
    /// session must outlive them, so a close asked for from inside one of their callbacks (a
    /// handler's answer over the output budget) waits for them to return.
    @exclusivity(unchecked) private var sessionDepth = 0
    /// Such a close, carried out when the outermost call into nghttp2 returns. Meanwhile every
    /// callback refuses (NGHTTP2_ERR_CALLBACK_FAILURE), so nothing more of the input is acted on.
    @exclusivity(unchecked) private var closeWhenOut: (reason: String, flushFirst: Bool)? = nil
    /// A close is waiting for nghttp2 to return (see `closeWhenOut`).
    var isClosing: Bool { closeWhenOut != nil }
    @exclusivity(unchecked) private var keepalive: KeepaliveStateMachine
    @exclusivity(unchecked) private var keepaliveTimer: TimerID?
    @exclusivity(unchecked) private var idleBuffers: IdleBufferStateMachine
    @exclusivity(unchecked) private var idleBufferTimer: TimerID?
    /// The allocator's notes on this session's blocks (nghttp2_mem's user data; freed in `close`).
    @exclusivity(unchecked) private var pagesSession: UnsafeMutablePointer<cshim_pages_session>?
    let settings: HTTP2Settings
    private let readBuffer: ReadBuffer
    /// TLS between the socket and nghttp2, when the endpoint uses it (set before `start`).
    @exclusivity(unchecked) var tls: TLSPipe?

    init(fd: Int32, loop: EventLoop, settings: HTTP2Settings) {
        self.fd = fd
        self.loop = loop
        self.settings = settings
        self.readBuffer = ReadBuffer.shared(for: loop)
        self.keepalive = KeepaliveStateMachine(interval: settings.keepaliveInterval, timeout: settings.keepaliveTimeout, now: MonotonicClock.now())
        self.idleBuffers = IdleBufferStateMachine(quietPeriod: settings.releaseIdleBuffersAfter)
    }

    /// Creates the nghttp2 session (server or client side), sends our SETTINGS and starts reading.
    func start(server: Bool, watchWritable: Bool = false) {
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        NGHTTP2Callbacks.install(callbacks)
        var option: OpaquePointer?
        nghttp2_option_new(&option)
        defer { nghttp2_option_del(option) }
        // Window updates are ours to send (nghttp2_session_consume), so a slow reader pushes back.
        nghttp2_option_set_no_auto_window_update(option, 1)
        nghttp2_option_set_max_deflate_dynamic_table_size(option, 4096)
        // (Never enable PRIORITY_UPDATE frames here, `nghttp2_option_set_builtin_recv_extension_type`,
        // on nghttp2 before 1.61: an idle stream one creates is freed while still listed, which a
        // client can trigger. Unenabled, they are dropped as unknown frames.)
        let me = Unmanaged.passUnretained(self).toOpaque()
        // (nghttp2 copies the allocator into the session; see cshim_pages_malloc for why it is ours)
        let notes = UnsafeMutablePointer<cshim_pages_session>.allocate(capacity: 1)
        notes.initialize(to: cshim_pages_session())
        pagesSession = notes
        var mem = nghttp2_mem(mem_user_data: UnsafeMutableRawPointer(notes), malloc: cshim_pages_malloc,
                              free: cshim_pages_free, calloc: cshim_pages_calloc, realloc: cshim_pages_realloc)
        cshim_pages_session_begin(notes)
        if server {
            nghttp2_session_server_new3(&session, callbacks, me, option, &mem)
        } else {
            nghttp2_session_client_new3(&session, callbacks, me, option, &mem)
        }
        cshim_pages_session_end(notes)
        var iv = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: settings.maxConcurrentStreams),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: settings.initialWindowSize),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_FRAME_SIZE.rawValue), value: settings.maxFrameSize),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_HEADER_TABLE_SIZE.rawValue), value: settings.headerTableSize),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), value: settings.maxHeaderListSize),
        ]
        if server && !settings.rfc7540Priorities {
            iv.append(nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES.rawValue), value: 1))
        }
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &iv, iv.count)
        nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, settings.connectionWindowSize)
        let events = UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue) | (watchWritable ? UInt32(EPOLLOUT.rawValue) : 0)
        writableWanted = watchWritable
        loop.register(fd: fd, events: events, handler: self)
        if !server { tls?.startHandshake() }
        scheduleKeepalive()
        markDirty()
    }

    // MARK: I/O

    public func handleEvents(_ events: UInt32) {
        if events & UInt32(EPOLLIN.rawValue) != 0 || events & UInt32(EPOLLRDHUP.rawValue) != 0 {
            readAvailable()
        }
        if isClosed { return }
        if events & (UInt32(EPOLLERR.rawValue) | UInt32(EPOLLHUP.rawValue)) != 0 {
            close(reason: "socket error or hang-up")
            return
        }
        if events & UInt32(EPOLLOUT.rawValue) != 0 {
            writableBecameReady()
        }
    }

    public func loopStopping() {
        close(reason: "event loop stopped")
    }

    /// Called when the socket is writable (a client uses it to learn that connect finished).
    func writableBecameReady() {
        flush()
    }

    private func readAvailable() {
        let buffer = readBuffer
        var total = 0
        while !isClosed {
            let n = read(fd, buffer.base, buffer.count)
            if n > 0 {
                total += n
                if !consume(buffer, n) { return }
                if n < buffer.count { break }
            } else if n == 0 {
                close(reason: "peer closed the connection")
                return
            } else {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { break }
                close(reason: "read failed: errno \(errno)")
                return
            }
        }
        if total > 0 {
            keepalive.bytesRead(now: MonotonicClock.now())
            received(bytes: total)
        }
        if !isClosed { inputBatchEnded() }
        markDirty()
    }

    /// Bytes read into `buffer` go through TLS (if any) to nghttp2; false when the connection closed.
    private func consume(_ buffer: ReadBuffer, _ n: Int) -> Bool {
        guard let tls else { return protocolInput(buffer.base, n) }
        let outcome = tls.receive(buffer.base, count: n, scratch: buffer.base, scratchSize: buffer.count) { plain, length in
            protocolInput(plain, length)
        }
        if isClosed { return false }
        switch outcome {
        case .more:
            return true
        case .closed:
            close(reason: "peer ended TLS")
            return false
        case .failed(let why):
            close(reason: why, flushFirst: true)   // (the alert OpenSSL queued)
            return false
        }
    }

    /// Feeds bytes as if read from the socket (fuzzing and tests drive a connection this way).
    func receive(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count && !isClosed {
            let n = min(readBuffer.count, bytes.count - offset)
            bytes.withUnsafeBufferPointer { readBuffer.base.update(from: $0.baseAddress! + offset, count: n) }
            offset += n
            if !consume(readBuffer, n) { return }
        }
        if !isClosed { inputBatchEnded() }
        markDirty()
    }

    /// Hands HTTP/2 bytes to nghttp2; false when the connection closed.
    private func protocolInput(_ bytes: UnsafePointer<UInt8>, _ count: Int) -> Bool {
        sessionDepth += 1
        let rc = nghttp2_session_mem_recv(session, bytes, count)
        sessionDepth -= 1
        if closeIfAsked() { return false }
        if rc < 0 {
            close(reason: "HTTP/2 protocol error: \(String(cString: nghttp2_strerror(Int32(rc))))", flushFirst: true)
            return false
        }
        return !isClosed
    }

    /// Bytes read from the socket (a server counts them).
    func received(bytes: Int) {}
    /// Everything one read brought has been handed to nghttp2 (and its callbacks have run).
    func inputBatchEnded() {}
    /// Bytes of the frame buffer just given back to the kernel (a server counts them).
    func releasedIdleBuffers(bytes: Int) {}

    /// Asks for a flush at the end of the loop's current batch.
    public func markDirty() {
        if flushScheduled || isClosed { return }
        flushScheduled = true
        loop.scheduleFlush(self)
    }

    /// Carries out a close asked for from inside nghttp2, once out of it; true when it did.
    private func closeIfAsked() -> Bool {
        guard sessionDepth == 0, let pending = closeWhenOut else { return false }
        closeWhenOut = nil
        if pending.flushFirst { flush() }
        close(reason: pending.reason)
        return true
    }

    /// Writes what nghttp2 has queued, coalescing frames into large writes.
    public func flush() {
        if sessionDepth > 0 {   // (inside nghttp2's callbacks: after they return)
            markDirty()
            return
        }
        flushScheduled = false
        guard !isClosed, let session else { return }
        if !writePending() { return }
        var sentFrames = false
        while true {
            var chunk: UnsafePointer<UInt8>?
            sessionDepth += 1
            let n = nghttp2_session_mem_send(session, &chunk)
            sessionDepth -= 1
            if closeIfAsked() { return }
            if n < 0 {
                close(reason: "HTTP/2 send error: \(String(cString: nghttp2_strerror(Int32(n))))")
                return
            }
            if n == 0 { break }
            if !sentFrames {
                sentFrames = true
                if let at = idleBuffers.sent(now: MonotonicClock.now()) { scheduleIdleBufferRelease(at: at) }
            }
            if let tls {
                if let problem = tls.send(chunk!, count: n) {
                    close(reason: problem)
                    return
                }
                tls.takeOutput(into: &outbound)
            } else {
                outbound.append(contentsOf: UnsafeBufferPointer(start: chunk, count: n))
            }
            if outbound.count >= Self.writeAt {
                if !writePending() { return }
            }
        }
        tls?.takeOutput(into: &outbound)   // handshake records, alerts
        if !writePending() { return }
        if nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0 {
            close(reason: "HTTP/2 session finished")
        }
    }

    /// Writes buffered bytes; false when the socket is full (EPOLLOUT is then watched) or closed.
    private func writePending() -> Bool {
        while outboundOffset < outbound.count {
            let n = outbound.withUnsafeBytes { raw in
                send(fd, raw.baseAddress! + outboundOffset, outbound.count - outboundOffset, Int32(MSG_NOSIGNAL))
            }
            if n > 0 {
                outboundOffset += n
            } else if n < 0 && errno == EINTR {
                continue
            } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                if !writableWanted {
                    writableWanted = true
                    loop.modify(fd: fd, events: UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue) | UInt32(EPOLLOUT.rawValue))
                }
                return false
            } else {
                close(reason: "write failed: errno \(errno)")
                return false
            }
        }
        // All written: the buffer is kept for the next flush (a busy connection, streaming events
        // to many subscribers, filled it up to 64 KiB on every flush: growing it by doubling and
        // freeing it each time was 5-10% of a fan-out profile, in malloc_consolidate and copies);
        // one past `keptOutbound` (a burst that doubled it again) is dropped now, and what is
        // kept goes once the connection is idle (`idleBufferTimerFired`), so idle connections
        // stay light.
        if outbound.capacity > Self.keptOutbound {
            outbound = []
        } else {
            outbound.removeAll(keepingCapacity: true)
        }
        outboundOffset = 0
        if writableWanted {
            writableWanted = false
            loop.modify(fd: fd, events: UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue))
        }
        return true
    }

    /// Closes the socket and frees the session; subclasses learn of it in `connectionClosed`.
    public func close(reason: String, flushFirst: Bool = false) {
        if isClosed { return }
        if sessionDepth > 0 {
            if closeWhenOut == nil { closeWhenOut = (reason, flushFirst) }
            return
        }
        if flushFirst, session != nil {
            // best effort: a GOAWAY nghttp2 queued for a protocol error (or a TLS alert)
            var chunk: UnsafePointer<UInt8>?
            var last: [UInt8] = []
            while true {
                // (counted as inside nghttp2: a close asked for from its callbacks here waits, and
                // this one frees the session only after the loop)
                sessionDepth += 1
                let n = nghttp2_session_mem_send(session, &chunk)
                sessionDepth -= 1
                if n <= 0 { break }
                if let tls {
                    if tls.send(chunk!, count: n) != nil { break }
                } else {
                    last.append(contentsOf: UnsafeBufferPointer(start: chunk, count: n))
                }
            }
            tls?.takeOutput(into: &last)
            // (only behind nothing: after bytes still waiting it would arrive out of order)
            if !last.isEmpty, outboundOffset >= outbound.count {
                _ = last.withUnsafeBytes { send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }
            }
        }
        isClosed = true
        if let t = keepaliveTimer { loop.cancelTimer(t) }
        if let t = idleBufferTimer { loop.cancelTimer(t) }
        loop.unregister(fd: fd)
        Glibc.close(fd)
        connectionClosed(reason: reason)
        if let s = session {
            session = nil
            nghttp2_session_del(s)
        }
        if let notes = pagesSession {   // (after the session, whose frees still report to it)
            pagesSession = nil
            notes.deallocate()
        }
    }

    // MARK: Idle buffers

    private func scheduleIdleBufferRelease(at deadline: UInt64) {
        // strong capture, cancelled in `close` (as the keepalive timer)
        idleBufferTimer = loop.scheduleTimer(at: deadline) { [self] in
            idleBufferTimerFired()
        }
    }

    private func idleBufferTimerFired() {
        idleBufferTimer = nil
        guard !isClosed else { return }
        switch idleBuffers.timerFired(now: MonotonicClock.now()) {
        case .none:
            break
        case .rearm(let at):
            scheduleIdleBufferRelease(at: at)
        case .release:
            // Only between frames: while nghttp2 has something to send, its buffer may hold a frame
            // not yet handed over (what it handed over, `flush` has copied into `outbound`).
            if nghttp2_session_want_write(session) != 0 {
                idleBuffers.releaseDeferred()
            } else {
                let bytes = cshim_pages_session_release(pagesSession)
                if bytes > 0 { releasedIdleBuffers(bytes: bytes) }
                if outboundOffset == 0, outbound.isEmpty, outbound.capacity > 1024 { outbound = [] }
            }
        }
    }

    // MARK: Keepalive

    private func scheduleKeepalive() {
        // A strong capture (cancelled in `close`): a weak one would put this object's refcount
        // in a side table and make every retain on the hot path slower.
        keepaliveTimer = loop.scheduleTimer(at: keepalive.nextDeadline) { [self] in
            keepaliveFired()
        }
    }

    private func keepaliveFired() {
        guard !isClosed else { return }
        switch keepalive.timerFired(now: MonotonicClock.now()) {
        case .none:
            break
        case .sendPing:
            nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
            markDirty()
        case .closeConnection:
            close(reason: "peer did not answer a keepalive PING in time")
            return
        }
        scheduleKeepalive()
    }

    // MARK: Subclass hooks (nghttp2 callbacks)

    func connectionClosed(reason: String) {}
    func onBeginHeaders(streamID: Int32) -> Int32 { 0 }
    func onHeader(streamID: Int32, category: UInt32, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) -> Int32 { 0 }
    func onDataChunk(streamID: Int32, data: UnsafeBufferPointer<UInt8>) -> Int32 { 0 }
    func onFrameReceived(type: UInt8, flags: UInt8, streamID: Int32, headersCategory: UInt32) -> Int32 { 0 }
    func onStreamClose(streamID: Int32, errorCode: UInt32) -> Int32 { 0 }
    func readData(streamID: Int32, into buffer: UnsafeMutablePointer<UInt8>, length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int { 0 }
}

/// One 64 KiB read buffer per loop, shared by all its connections (reads are consumed at once).
final class ReadBuffer {
    let base: UnsafeMutablePointer<UInt8>
    let count = 64 * 1024
    private init() { base = .allocate(capacity: count) }

    private nonisolated(unsafe) static var buffers: [ObjectIdentifier: ReadBuffer] = [:]
    private static let lock = Mutex()

    /// The dictionary is touched under a lock since loops share it; connections look it up once.
    static func shared(for loop: EventLoop) -> ReadBuffer {
        lock.lock()
        defer { lock.unlock() }
        if let b = buffers[ObjectIdentifier(loop)] { return b }
        let b = ReadBuffer()
        buffers[ObjectIdentifier(loop)] = b
        return b
    }

    /// A plain pthread mutex: tiny and allocation-free.
    final class Mutex: @unchecked Sendable {
        private var m = pthread_mutex_t()
        init() { pthread_mutex_init(&m, nil) }
        func lock() { pthread_mutex_lock(&m) }
        func unlock() { pthread_mutex_unlock(&m) }
    }
}

/// Calls `body` with the connection behind nghttp2's `user_data`, without retaining it: nghttp2
/// only calls back from inside `mem_recv`/`mem_send`, which the connection itself is running.
/// While a close waits for nghttp2 to return, every callback refuses, and nghttp2 stops.
@inline(__always)
private func withConnection<R: BinaryInteger>(_ userData: UnsafeMutableRawPointer?, _ body: (HTTP2Connection) -> R) -> R {
    Unmanaged<HTTP2Connection>.fromOpaque(userData!)._withUnsafeGuaranteedRef { c in
        c.isClosing ? R(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) : body(c)
    }
}

/// The C callbacks handed to nghttp2; each finds its connection through `user_data`.
enum NGHTTP2Callbacks {
    static func install(_ callbacks: OpaquePointer?) {
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks) { _, frame, userData in
            withConnection(userData) { $0.onBeginHeaders(streamID: frame!.pointee.hd.stream_id) }
        }
        nghttp2_session_callbacks_set_on_header_callback(callbacks) { _, frame, name, namelen, value, valuelen, _, userData in
            withConnection(userData) {
                $0.onHeader(streamID: frame!.pointee.hd.stream_id, category: frame!.pointee.headers.cat.rawValue,
                            name: UnsafeBufferPointer(start: name, count: namelen),
                            value: UnsafeBufferPointer(start: value, count: valuelen))
            }
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, _, streamID, data, len, userData in
            withConnection(userData) { $0.onDataChunk(streamID: streamID, data: UnsafeBufferPointer(start: data, count: len)) }
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, userData in
            let hd = frame!.pointee.hd
            let cat = hd.type == UInt8(NGHTTP2_HEADERS.rawValue) ? frame!.pointee.headers.cat.rawValue : 0
            return withConnection(userData) { $0.onFrameReceived(type: hd.type, flags: hd.flags, streamID: hd.stream_id, headersCategory: cat) }
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, streamID, errorCode, userData in
            withConnection(userData) { $0.onStreamClose(streamID: streamID, errorCode: errorCode) }
        }
    }

    /// The data provider read callback shared by all streams.
    static let readCallback: nghttp2_data_source_read_callback = { _, streamID, buf, length, flags, _, userData in
        withConnection(userData) { $0.readData(streamID: streamID, into: buf!, length: length, flags: flags!) }
    }
}

/// A header list built once and kept for the life of the process (nghttp2 need not copy it).
///
/// `@unchecked Sendable`: the memory is written once in `init` and only read afterwards.
final class StaticHeaders: @unchecked Sendable {
    let nv: UnsafeMutablePointer<nghttp2_nv>
    let count: Int

    init(_ pairs: [(String, String)]) {
        count = pairs.count
        nv = .allocate(capacity: pairs.count)
        for (i, (name, value)) in pairs.enumerated() {
            let n = Array(name.utf8), v = Array(value.utf8)
            let np = UnsafeMutablePointer<UInt8>.allocate(capacity: max(1, n.count))
            let vp = UnsafeMutablePointer<UInt8>.allocate(capacity: max(1, v.count))
            np.initialize(from: n, count: n.count)
            vp.initialize(from: v, count: v.count)
            let flags = UInt8(NGHTTP2_NV_FLAG_NO_COPY_NAME.rawValue | NGHTTP2_NV_FLAG_NO_COPY_VALUE.rawValue)
            nv[i] = nghttp2_nv(name: np, value: vp, namelen: n.count, valuelen: v.count, flags: flags)
        }
    }

    static let grpcResponse = StaticHeaders([(":status", "200"), ("content-type", "application/grpc")])
    static let okTrailers = StaticHeaders([("grpc-status", "0")])
}

/// Header name/value pairs for nghttp2, kept in one allocation for the duration of a submit call.
struct HeaderBlock {
    private var storage: [UInt8] = []
    private var spans: [(Int, Int, Int, Int)] = []

    mutating func add(_ name: StaticString, _ value: String) {
        let nameStart = storage.count
        storage.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        let valueStart = storage.count
        storage.append(contentsOf: value.utf8)
        spans.append((nameStart, name.utf8CodeUnitCount, valueStart, storage.count - valueStart))
    }

    mutating func add(dynamic name: String, _ value: String) {
        let nameStart = storage.count
        storage.append(contentsOf: name.lowercased().utf8)
        let valueStart = storage.count
        storage.append(contentsOf: value.utf8)
        spans.append((nameStart, valueStart - nameStart, valueStart, storage.count - valueStart))
    }

    mutating func add(_ name: StaticString, bytes: [UInt8]) {
        let nameStart = storage.count
        storage.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        let valueStart = storage.count
        storage.append(contentsOf: bytes)
        spans.append((nameStart, name.utf8CodeUnitCount, valueStart, bytes.count))
    }

    /// Calls `body` with an nghttp2_nv array pointing into this block.
    func withNV<R>(_ body: (UnsafePointer<nghttp2_nv>, Int) -> R) -> R {
        var storage = storage
        return storage.withUnsafeMutableBufferPointer { bytes in
            let base = bytes.baseAddress ?? UnsafeMutablePointer<UInt8>(bitPattern: 1)!
            let nv = spans.map { s in
                nghttp2_nv(name: base + s.0, value: base + s.2, namelen: s.1, valuelen: s.3, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            }
            return nv.withUnsafeBufferPointer { body($0.baseAddress!, $0.count) }
        }
    }
}

@inline(__always)
func bytesEqual(_ a: UnsafeBufferPointer<UInt8>, _ b: StaticString) -> Bool {
    a.count == b.utf8CodeUnitCount && (a.count == 0 || memcmp(a.baseAddress!, b.utf8Start, a.count) == 0)
}
