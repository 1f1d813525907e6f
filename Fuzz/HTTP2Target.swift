// libFuzzer target: a gRPC server connection fed raw bytes as if read from its socket, in pieces
// whose sizes the input chooses, with nghttp2 doing the HTTP/2 and the server its limits (header
// list size, metadata entries, message size, streams, output budget). One inline method echoes;
// one staged method (at GetOnlineUsers' and SetState's paths) echoes at once, from another loop,
// from a task, or fails, by its request's last byte (its answers may come back after the stream
// or the connection has gone); every other
// path is UNIMPLEMENTED; one is refused before its body is read. Built by
// Scripts/fuzz, with the transport's sources compiled into this one module.
import Dispatch
import Glibc

/// The loop every input runs on (connections are loop-confined), and the server core they belong to.
private nonisolated(unsafe) let loop = EventLoop.start(name: "fuzz-http2")
/// Where the staged method hands some calls (as a call whose shard runs on another loop).
private nonisolated(unsafe) let otherLoop = EventLoop.start(name: "fuzz-http2-other")
private nonisolated(unsafe) let core: ServerCore = {
    var config = ServerConfiguration(address: HostPort(host: "127.0.0.1", port: 0))
    config.maxReceiveMessageSize = 4096          // small limits: the fuzzer reaches them
    config.http2.maxConcurrentStreams = 16
    config.http2.maxHeaderListSize = 2048
    config.http2.maxMetadataEntries = 8
    config.maxQueuedBytesPerConnection = 64 * 1024
    config.refuseEarly = { path, _ in path.hasSuffix("/Refused") ? GRPCStatus(.unauthenticated, "refused") : nil }
    var methods = ServiceRegistry()
    methods.register(path: "/grpc.health.v1.Health/Check", .unaryInline { bytes, _ in
        var framed = [UInt8](repeating: 0, count: 5) + bytes
        MessageDeframer.writeHeader(into: &framed, length: bytes.count)
        return framed
    })
    // (served at paths the recorded seeds call, so the fuzzer starts from calls that reach it)
    let other = otherLoop
    let staged = ServerMethod.unaryStaged { bytes, _ in
        let answer = MessageFraming.framed(encoded: bytes)
        switch bytes.last.map({ $0 % 4 }) ?? 0 {
        case 0: return .now(answer)
        case 1: return .onLoop(other) { .now(answer) }
        case 2: return .later { answer }
        default: throw GRPCStatus(.invalidArgument, "BAD_REQUEST")
        }
    }
    methods.register(path: "/presence.v1.Presence/GetOnlineUsers", staged)
    methods.register(path: "/presence.v1.Presence/SetState", staged)
    let made = DispatchSemaphore(value: 0)
    nonisolated(unsafe) var c: ServerCore? = nil
    _ = loop.execute {
        c = ServerCore(loop: loop, listener: SharedListener(fd: -1, users: 1), configuration: config,
                       routes: RouteTable(methods: methods.methods, observer: nil), counter: TrafficCounter(), limiter: ConnectionLimiter(limit: 1 << 30, perAddress: 1 << 30))
        made.signal()
    }
    made.wait()
    return c!
}()

private let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 4, 0, 0, 0, 0, 0]

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTP2(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 1 else { return 0 }
    // first byte: bit 0 prepends a valid client preface (so most inputs get past it), the rest
    // give the size of the pieces the bytes arrive in
    let control = data[0]
    var bytes = control & 1 == 1 ? preface : []
    bytes.append(contentsOf: UnsafeBufferPointer(start: data + 1, count: size - 1))
    let piece = 1 + Int(control >> 1) * 64
    var fds: [Int32] = [0, 0]
    guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0, &fds) == 0 else { return 0 }
    let done = DispatchSemaphore(value: 0)
    let input = bytes
    let core = core   // (made here, not first on the loop: its set-up waits for the loop)
    _ = loop.execute {
        if let c = core.adopt(fds[0], from: [127, 0, 0, 1]) {
            var i = 0
            while i < input.count && !c.isClosed {
                let n = min(piece, input.count - i)
                c.receive(Array(input[i..<(i + n)]))
                c.flush()
                i += n
            }
            c.close(reason: "end of the fuzz input")
        } else {
            close(fds[0])
        }
        done.signal()
    }
    done.wait()
    var sink = [UInt8](repeating: 0, count: 65536)
    while read(fds[1], &sink, sink.count) > 0 {}
    close(fds[1])
    return 0
}
