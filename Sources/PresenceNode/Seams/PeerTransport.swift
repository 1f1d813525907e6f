import EventLoop
import GRPCTransport
import PresenceWire
import Synchronization

/// The peer transport seam (RELIABILITY.md, "Seams, not hooks"): everything a node says to
/// another node is one request and its answer, sent to the peer port at `address` — SWIM probes
/// and joins, routed calls, pushes (whose answer is their acknowledgement), anti-entropy. A lost
/// connection, a timeout or a refusal is a thrown error. Production: gRPC over the nghttp2 peer
/// link (`GRPCPeerTransport`); the deterministic simulation: an in-memory network whose faults
/// (loss, delay, reordering, partitions) wrap it.
public protocol PeerTransport: Sendable {
    /// Sends `request` to `method` at the peer on `address`; its answer, or an error when it was
    /// refused or none came within `timeout` ns.
    func unary<Req: ProtoMessage, Resp: ProtoMessage>(_ address: String, _ method: MethodDescriptor<Req, Resp>, _ request: Req,
                                                      timeout: UInt64) async throws -> Resp
    /// The loop of the connection to `address`, where work for that peer runs best (nil: none).
    func preferredLoop(of address: String) -> EventLoop?
    /// Forgets the connection to `address` (its process died, left or restarted: a later call
    /// talks to it afresh).
    func forget(_ address: String)
    /// Closes every connection (the node stops).
    func close()
}

/// Production's peer transport: one pooled gRPC client per peer address, signed with the cluster
/// secret when there is one, over mutual TLS when configured.
public final class GRPCPeerTransport: PeerTransport {
    private let clients = Mutex<[String: GRPCClient]>([:])
    private let group: EventLoopGroup
    private let peerTLS: TLSContextSource?
    private let peerAuth: PeerRequestAuth?
    private let connectTimeout: UInt64
    private let clock: EngineClock

    /// `connectTimeout`: `ClusterTimings.peerConnectTimeout`.
    init(group: EventLoopGroup, peerTLS: TLSContextSource?, peerAuth: PeerRequestAuth?, connectTimeout: UInt64, clock: EngineClock) {
        self.group = group
        self.peerTLS = peerTLS
        self.peerAuth = peerAuth
        self.connectTimeout = connectTimeout
        self.clock = clock
    }

    public func unary<Req: ProtoMessage, Resp: ProtoMessage>(_ address: String, _ method: MethodDescriptor<Req, Resp>, _ request: Req,
                                                             timeout: UInt64) async throws -> Resp {
        try await client(address).unary(method, request, timeout: .nanoseconds(Int64(min(timeout, UInt64(Int64.max)))))
    }

    public func preferredLoop(of address: String) -> EventLoop? { client(address).preferredLoop }

    public func forget(_ address: String) {
        clients.withLock { $0.removeValue(forKey: address) }?.close()
    }

    public func close() {
        clients.withLock { cs in cs.values.forEach { $0.close() } }
    }

    private func client(_ address: String) -> GRPCClient {
        clients.withLock { cs in
            if let c = cs[address] { return c }
            var config = ClientConfiguration(target: HostPort(parsing: address) ?? HostPort(host: "127.0.0.1", port: 0))
            config.http2.keepaliveInterval = 2_000_000_000
            config.http2.keepaliveTimeout = 1_000_000_000
            config.connectTimeout = connectTimeout
            config.maxReceiveMessageSize = 64 << 20
            config.firstLoop = cs.count   // one peer's connection per loop in turn
            config.tls = peerTLS
            if let peerAuth {
                let clock = self.clock
                config.callMetadata = { path, message in
                    [(PeerRequestAuth.header, peerAuth.sign(method: path, message: message, now: clock.wallMilliseconds()))]
                }
            }
            let c = GRPCClient(configuration: config, group: group)
            cs[address] = c
            return c
        }
    }
}
