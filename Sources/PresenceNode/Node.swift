import EventLoop
import Foundation
import GRPCTransport
import HTTPFrontDoor
import ClusterCore
import PresenceCore
import PresenceWire
import Synchronization

/// One presenced node: its event loops, its client-facing gRPC server and its services.
public final class Node: Sendable {
    public let configuration: NodeConfiguration
    public let logger: Logger
    public let group: EventLoopGroup
    public let health = HealthService()
    public var engine: PresenceEngine { core.engine }
    public var membership: Membership { core.membership }
    private let server: GRPCServer
    private let peerServer: GRPCServer
    /// The HTTP/1.1 front door (nil when `--http-listen none`).
    let httpServer: HTTPServer?
    /// What `/metrics` serves.
    public let metrics: NodeMetrics
    private let clientTLS: TLSContextSource?
    /// What the peer port serves (membership, routed presence calls, pushes, anti-entropy): the
    /// fuzzer calls these handlers directly with hostile messages.
    public let peerServices: ServiceRegistry
    private let peerTLS: (server: TLSContextSource, client: TLSContextSource)?
    /// The node without its doors (membership, peer link, engine), as the simulation runs it too.
    public let core: NodeCore

    /// Builds the node; throws when a secret, certificate or key file cannot be used.
    /// `peerTransport`: the transport to other nodes, given production's (the peer transport seam:
    /// a test wraps it to hold or delay what goes to a peer).
    public init(configuration: NodeConfiguration, logger: Logger? = nil,
                peerTransport: (any PeerTransport) -> any PeerTransport = { $0 }) throws {
        self.configuration = configuration
        self.logger = logger ?? Logger(level: configuration.logLevel, format: configuration.logFormat)
        let metrics = NodeMetrics()
        self.metrics = metrics
        let verifier = try configuration.authSecretFile.map { try TokenVerifier(secretFile: $0) }
        // (files are read before any thread starts: a bad one stops the node with nothing to undo)
        clientTLS = try configuration.tlsCertFile.map {
            try TLSContextSource(TLSConfiguration(certificateFile: $0, privateKeyFile: configuration.tlsKeyFile), server: true)
        }
        var peerTLS: (server: TLSContextSource, client: TLSContextSource)? = nil
        if let ca = configuration.peerTLSCAFile {
            let files = TLSConfiguration(certificateFile: configuration.peerTLSCertFile, privateKeyFile: configuration.peerTLSKeyFile, trustedCAFile: ca)
            peerTLS = (try TLSContextSource(files, server: true), try TLSContextSource(files, server: false))
        }
        self.peerTLS = peerTLS
        self.group = EventLoopGroup(count: configuration.threads, name: "presenced")
        let clusterSecret = try configuration.clusterSecretFile.map { try TokenVerifier.readSecret(file: $0) }
        var settings = EngineSettings(nodeID: configuration.nodeID, presenceTimeout: configuration.presenceTimeout,
                                      maxInstantEvents: configuration.maxInstantEvents, presenceInterval: configuration.presenceInterval,
                                      probeInterval: configuration.probeInterval)
        settings.maxSessions = configuration.maxSessions
        settings.listingCacheBytes = configuration.listingCacheBytes
        let clock = SystemClock()
        let peerAuth = clusterSecret.map { PeerRequestAuth(secret: $0) }
        let transport = GRPCPeerTransport(group: group, peerTLS: peerTLS?.client, peerAuth: peerAuth,
                                          connectTimeout: settings.timings.peerConnectTimeout, clock: clock)
        let core = NodeCore(settings: settings, replicationFactor: configuration.replicationFactor,
                            peerAddress: (configuration.peerAdvertise ?? configuration.peerListen).description,
                            clientAddress: configuration.listen.description, seeds: configuration.seeds,
                            seams: NodeCore.Seams(loops: group.loops, transport: peerTransport(transport), clock: clock, placement: .pool,
                                                  peerAuth: peerAuth),
                            logger: self.logger)
        self.core = core
        let membership = core.membership, engine = core.engine, topology = core.topology, link = core.link
        let health = self.health
        health.setJoining(true)
        topology.onReady { health.setJoining(false) }
        // (the peer server counts what it received; Admin on either port reports it)
        let peerServerBox = Mutex<GRPCServer?>(nil)
        let peerTraffic: @Sendable () -> (requests: Int, bytes: Int) = { peerServerBox.withLock { $0?.traffic } ?? (0, 0) }
        var peerRegistry = core.peerServices
        AdminService(membership: membership, engine: engine, peerTraffic: peerTraffic,
                     onClientPort: false, tokenMode: verifier != nil).register(in: &peerRegistry)
        var peerConfig = ServerConfiguration(address: configuration.peerListen)
        peerConfig.maxReceiveMessageSize = 64 << 20
        // (peers hold a few connections each; loopback test clusters share one address)
        peerConfig.maxConnectionsPerAddress = 1024
        // (a peer multiplexes every routed call of its clients on a connection or two)
        peerConfig.maxConcurrentUnaryPerConnection = 4096
        // every peer request is signed (when the cluster has a secret), checked before its body
        // is read and again before it is decoded
        peerConfig.refuseEarly = membership.refuseEarly
        peerConfig.refuse = membership.refuse
        peerConfig.tls = peerTLS?.server
        peerServices = peerRegistry
        let peerServer = GRPCServer(configuration: peerConfig, services: peerRegistry, group: group)
        peerServerBox.withLock { $0 = peerServer }
        self.peerServer = peerServer
        var registry = ServiceRegistry()
        health.register(in: &registry)
        PresenceService(engine: engine, verifier: verifier).register(in: &registry)
        ReflectionService.register(in: &registry)
        AdminService(membership: membership, engine: engine, peerTraffic: peerTraffic,
                     onClientPort: true, tokenMode: verifier != nil).register(in: &registry)
        var clientConfig = ServerConfiguration(address: configuration.listen)
        if membership.hasClusterSecret {
            // Admin on the client port: only signed with the cluster secret, like a peer
            let admin = "/" + AdminMethods.serviceName + "/"
            clientConfig.refuseEarly = { path, metadata in path.hasPrefix(admin) ? membership.refuseEarly(path: path, metadata: metadata) : nil }
            clientConfig.refuse = { path, metadata, message in path.hasPrefix(admin) ? membership.refuse(path: path, metadata: metadata, message: message) : nil }
        }
        clientConfig.tls = clientTLS
        clientConfig.callObserver = metrics.callObserver(paths: Array(registry.methods.keys))
        let server = GRPCServer(configuration: clientConfig, services: registry, group: group)
        self.server = server
        let loops = self.group
        let webSocket = WebSocketAPI(registry: registry, callObserver: metrics.webSocketCallObserver(paths: Array(registry.methods.keys)))
        let httpServer = configuration.httpListen.map { address in
            HTTPServer(configuration: HTTPServerConfiguration(address: address), group: loops,
                       handler: FrontDoor(health: health, metrics: metrics, webSocket: webSocket).handle)
        }
        self.httpServer = httpServer
        metrics.register(engine: engine, membership: membership, link: link, connections: {
            [("grpc", server.connections), ("peer", peerServerBox.withLock { $0?.connections } ?? 0),
             ("http", (httpServer?.connections ?? 0) - webSocket.openSockets), ("websocket", webSocket.openSockets)]
        }, peerTraffic: peerTraffic)
    }

    /// Reads the TLS certificates and keys again (SIGHUP): new connections use them, open ones
    /// keep theirs. A file that cannot be used leaves that port on its current certificate.
    /// Returns what was reloaded, and why anything was not.
    public func reloadCertificates() -> (reloaded: [String], failed: [String]) {
        var reloaded: [String] = [], failed: [String] = []
        let sources = [("client port", clientTLS), ("peer port", peerTLS?.server), ("peer client", peerTLS?.client)]
        for case let (name, source?) in sources {
            do {
                try source.reload()
                reloaded.append(name)
            } catch {
                failed.append("\(name): \(error)")
            }
        }
        for f in failed { logger.error("certificate reload failed, keeping the current one", ["what": f]) }
        if !reloaded.isEmpty { logger.info("certificates reloaded", ["ports": reloaded.joined(separator: ", ")]) }
        return (reloaded, failed)
    }

    /// The client port actually bound (useful with port 0).
    public var clientPort: UInt16 { server.port }
    /// The peer port actually bound.
    public var peerPort: UInt16 { peerServer.port }
    /// The HTTP/1.1 port actually bound (nil when it is off).
    public var httpPort: UInt16? { httpServer?.port }

    /// Binds and starts serving.
    public func start() throws {
        Sockets.raiseOpenFileLimit()
        try server.start()
        try peerServer.start()
        try httpServer?.start()
        // the address gossiped to others: --peer-advertise if given, else the one bound
        let advertised = configuration.peerAdvertise ?? HostPort(host: configuration.peerListen.host, port: peerServer.port)
        core.start(peerAddress: advertised.description, clientAddress: HostPort(host: configuration.listen.host, port: server.port).description)
        logger.info("presenced started", [
            "node_id": configuration.nodeID,
            "boot": String(engine.topology.boot),
            "listen": HostPort(host: configuration.listen.host, port: server.port).description,
            "peer_listen": HostPort(host: configuration.peerListen.host, port: peerServer.port).description,
            "peer_advertise": advertised.description,
            "http_listen": httpServer.map { HostPort(host: configuration.httpListen!.host, port: $0.port).description } ?? "off",
        ])
        if configuration.clusterSecretFile == nil && configuration.peerTLSCAFile == nil {
            logger.warning("no --cluster-secret-file or --peer-tls-ca-file: any process that reaches the peer port can join this cluster")
        }
        if configuration.authSecretFile == nil {
            logger.warning("OPEN MODE: no --auth-secret-file, so user ids are trusted as clients give them; do not run this way in production")
        }
    }

    /// Graceful stop: NOT_SERVING, GOAWAY, in-flight calls finish (up to `gracePeriod` ns).
    public func shutdown(gracePeriod: UInt64 = 5_000_000_000) async {
        health.setNotServing()
        logger.info("shutting down", ["node_id": configuration.nodeID])
        // hand everything off first and own nothing from then on; then end the streams, so
        // clients resume their sessions on other nodes; then say goodbye (`NodeCore.shutdown`)
        let start = MonotonicClock.now()
        let step = { [logger] (what: String) in logger.debug("shutdown: \(what)", ["after_ms": String((MonotonicClock.now() - start) / 1_000_000)]) }
        await core.shutdown(step: step)
        await peerServer.shutdown(gracePeriod: 200_000_000)
        step("peer server stopped")
        await server.shutdown(gracePeriod: gracePeriod)
        await httpServer?.shutdown()
        group.shutdown()
        logger.info("stopped", ["node_id": configuration.nodeID])
    }
}
