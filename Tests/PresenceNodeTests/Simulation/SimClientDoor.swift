import EventLoop
import GRPCTransport
@testable import PresenceNode
import PresenceWire

/// How model clients reach a node's client port: the node's own `PresenceService` handlers,
/// called over a simulated client connection. A call to a node that is down fails at once
/// (`UNAVAILABLE`, as a reset connection does); one to a node that is paused or cut off gets no
/// answer (the client's deadline fires). Streams end the same ways, or by the client (`cancel`).
struct SimClientDoor {
    let cluster: SimCluster

    private func delay() -> UInt64 { 200_000 + cluster.world.random(below: 800_000) }

    /// One unary call with a per-attempt deadline; its outcome, never a throw.
    /// `connection`, when given, hears how to fail the call at once (the client's connection to
    /// the node broke: its keepalive gave up).
    func unary<Req: ProtoMessage, Resp: ProtoMessage>(_ id: String, _ method: MethodDescriptor<Req, Resp>, _ request: Req,
                                                      timeout: UInt64, connection: ((@escaping () -> Void) -> Void)? = nil) async -> Result<Resp, GRPCStatus> {
        let (cluster, clients) = (self.cluster, cluster.clients)
        let answer = OneShot<Result<[UInt8], GRPCStatus>>()
        connection? { answer.complete(.failure(GRPCStatus(.unavailable, "keepalive: the connection broke"))) }
        clients.after(timeout) { answer.complete(.failure(GRPCStatus(.deadlineExceeded, "deadline exceeded"))) }
        cluster.world.log("client -> \(id) \(method.path)")
        cluster.world.detail("  \(String(describing: request).prefix(160))")
        guard let node = cluster.node(id) else {
            return .failure(GRPCStatus(.unavailable, "connection refused"))
        }
        let token = node.onKill { answer.complete(.failure(GRPCStatus(.unavailable, "connection reset"))) }
        if cluster.clientReachable(id), let handler = node.clientServices.methods[method.path]?.asyncUnary {
            let bytes = request.serializedBytes()
            let deadline = cluster.world.now + timeout
            node.loop.after(delay()) {
                Task(executorPreference: node.loop) {
                    let work = cluster.network.began(node.address, "\(method.path) from a client")
                    let result: Result<[UInt8], GRPCStatus>
                    do {
                        result = .success(try await handler(bytes, ServerContext(path: method.path, deadline: deadline, metadata: [])))
                    } catch {
                        result = .failure(error as? GRPCStatus ?? GRPCStatus(.internal, "\(error)"))
                    }
                    cluster.network.ended(work)
                    guard cluster.clientReachable(id) else { return }
                    clients.after(delay()) { answer.complete(result) }
                }
            }
        }
        let result = await answer.value
        node.cancelOnKill(token)
        if cluster.world.keepsTrace {
            switch result {
            case .failure(let s): cluster.world.detail("client <- \(id) \(method.path) \(s.code) \(s.message)")
            case .success: cluster.world.detail("client <- \(id) \(method.path) ok")
            }
        }
        switch result {
        case .failure(let status): return .failure(status)
        case .success(let framed):
            do { return .success(try Resp(serializedBytes: Array(framed.dropFirst(5)))) } catch {
                return .failure(GRPCStatus(.internal, "undecodable answer: \(error)"))
            }
        }
    }

    /// Opens an OpenSession stream on `id`: `event` hears each message in order, `ended` once, how
    /// the stream ended (from the node, a kill, or `SimStream.cancel`).
    func open(_ id: String, _ request: OpenSessionRequest,
              event: @escaping (SessionEvent) -> Void, ended: @escaping (GRPCStatus) -> Void) -> SimStream {
        let stream = SimStream(nodeID: id, event: event, ended: ended)
        let (cluster, clients) = (self.cluster, cluster.clients)
        cluster.world.log("client -> \(id) OpenSession \(request.userID) resume=\(request.resumeSessionID)")
        guard let node = cluster.node(id), case .serverStreaming(let handler)? = node.clientServices.methods[PresenceMethods.openSession.path] else {
            clients.execute { stream.finish(GRPCStatus(.unavailable, "connection refused")) }
            return stream
        }
        stream.node = node
        stream.killToken = node.onKill { stream.finish(GRPCStatus(.unavailable, "connection reset")) }
        guard cluster.clientReachable(id) else { return stream }  // (the client's own deadline ends it)
        let bytes = request.serializedBytes()
        let slot = Box<ServerStreamWriter?>(nil)
        let w = ServerStreamWriter(coalescing: false) { [delay = delay()] in
            clients.after(delay) { if let w = slot.value { stream.drain(w, cluster: cluster) } }
        }
        slot.value = w
        node.loop.after(delay()) {
            guard !stream.isOver else { return }  // (the client gave up before the call arrived)
            stream.serverTask = Task(executorPreference: node.loop) {
                let status: GRPCStatus
                do {
                    try await handler(bytes, ServerContext(path: PresenceMethods.openSession.path, deadline: nil, metadata: []), w)
                    status = GRPCStatus(.ok, "")
                } catch let s as GRPCStatus {
                    status = s
                } catch {
                    status = GRPCStatus(.cancelled, "\(error)")
                }
                w.close(status)
                guard cluster.clientReachable(id) else { return }
                clients.after(20_000_000) { stream.finish(status) }  // (after the last drain)
            }
        }
        return stream
    }
}

/// A client's OpenSession stream. `@unchecked Sendable`: used from the driver's thread only.
final class SimStream: @unchecked Sendable {
    let nodeID: String
    fileprivate var node: SimNode?
    fileprivate var killToken: Int?
    fileprivate var serverTask: Task<Void, Never>?
    private let event: (SessionEvent) -> Void
    private let ended: (GRPCStatus) -> Void
    private(set) var isOver = false

    fileprivate init(nodeID: String, event: @escaping (SessionEvent) -> Void, ended: @escaping (GRPCStatus) -> Void) {
        self.nodeID = nodeID
        self.event = event
        self.ended = ended
    }

    /// Delivers what the node sent, unless the stream is over; waits while the node is unreachable.
    fileprivate func drain(_ writer: ServerStreamWriter, cluster: SimCluster) {
        guard !isOver else { return }
        guard cluster.clientReachable(nodeID) || node?.killed == true else {
            cluster.clients.after(50_000_000) { [self] in drain(writer, cluster: cluster) }
            return
        }
        let messages = writer.takePending()
        writer.drained(messages.reduce(0) { $0 + $1.count })
        for m in messages where !isOver {
            if let e = try? SessionEvent(serializedBytes: Array(m.dropFirst(5))) { event(e) }
        }
    }

    fileprivate func finish(_ status: GRPCStatus) {
        guard !isOver else { return }
        isOver = true
        if let node, let killToken { node.cancelOnKill(killToken) }
        ended(status)
    }

    /// The client gives up on the stream (keepalive, or it moves): the node sees its call cancelled
    /// (when it runs, and if it is still the same process).
    func cancel() {
        guard !isOver else { return }
        isOver = true
        if let node, let killToken { node.cancelOnKill(killToken) }
        if let node, !node.killed { node.loop.after(2_000_000) { [self] in serverTask?.cancel() } }
    }
}
