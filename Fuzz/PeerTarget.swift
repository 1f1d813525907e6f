// libFuzzer target: the peer services of a running single-node cluster (SWIM pings and joins,
// routed channel and home calls, pushes, digests, exchanges, confirmations) called with hostile
// request bytes, as a peer that passed authentication could send them. The first byte picks the
// method. A trap (overflow on a peer's number, a force unwrap, an index out of range) is a crash;
// refusals are answers. Built by Scripts/fuzz against the package's modules.
import Dispatch
import EventLoop
import GRPCTransport
import PresenceNode

private nonisolated(unsafe) let node: Node = {
    var c = NodeConfiguration(nodeID: "fuzz-1")
    c.listen = HostPort(host: "127.0.0.1", port: 0)
    c.peerListen = HostPort(host: "127.0.0.1", port: 0)
    c.httpListen = nil
    c.threads = 1
    c.logLevel = .error
    c.presenceTimeout = 0.5
    let n = try! Node(configuration: c)
    try! n.start()
    return n
}()

private nonisolated(unsafe) let methods: [(path: String, method: ServerMethod)] =
    node.peerServices.methods.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzPeer(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size >= 1 else { return 0 }
    let (path, method) = methods[Int(data[0]) % methods.count]
    let body = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    let context = ServerContext(path: path, deadline: MonotonicClock.now() + 1_000_000_000, metadata: [])
    switch method {
    case .unaryInline(let handler):
        _ = try? handler(body, context)
    case .unary, .unaryStaged:
        guard let handler = method.asyncUnary else { break }
        let done = DispatchSemaphore(value: 0)
        Task {
            _ = try? await handler(body, context)
            done.signal()
        }
        // (a call that waits on something, a handoff or another node, is left to finish alone)
        _ = done.wait(timeout: .now() + .seconds(1))
    case .serverStreaming, .bidiStreaming:
        break
    }
    return 0
}
