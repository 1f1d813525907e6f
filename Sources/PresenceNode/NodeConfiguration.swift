import EventLoop
import Glibc
import PresenceCore

/// Everything a node is started with. Each flag `--x-y` may also come from `PRESENCED_X_Y`;
/// a flag on the command line wins over the environment.
public struct NodeConfiguration: Sendable, Equatable {
    public enum LogLevel: String, Sendable, CaseIterable { case debug, info, warning, error }
    public enum LogFormat: String, Sendable, CaseIterable { case text, json }

    public var nodeID: String
    public var listen = HostPort(host: "127.0.0.1", port: 7400)
    public var peerListen = HostPort(host: "127.0.0.1", port: 7401)
    /// The HTTP/1.1 front door (WEB.md: WebSocket, metrics, health); nil turns it off.
    public var httpListen: HostPort? = HostPort(host: "127.0.0.1", port: 7402)
    /// The peer address gossiped to other nodes, when it differs from the bound one (a proxy, NAT).
    public var peerAdvertise: HostPort? = nil
    public var seeds: [HostPort] = []
    /// Seconds a disconnected session may resume before its user times out.
    public var presenceTimeout: Double = 10
    /// Occupancy above which a channel switches to interval events.
    public var maxInstantEvents = 50
    /// Seconds between interval events.
    public var presenceInterval: Double = 1
    /// Bytes of encoded GetOnlineUsers pages kept, per node, until their channel changes (0: none).
    public var listingCacheBytes = 16 << 20
    /// Sessions this node holds as their gateway at most; a new one past it is RESOURCE_EXHAUSTED
    /// (resumes of sessions from other nodes are still taken).
    public var maxSessions = 1_000_000
    /// Copies of each channel's and user home's state, owner included.
    public var replicationFactor = 2
    /// SWIM protocol period, seconds; the other membership timeouts scale with it.
    public var probeInterval: Double = 0.2
    public var authSecretFile: String? = nil
    public var clusterSecretFile: String? = nil
    /// TLS on the client port: this node's certificate chain and key (PEM). Both or neither.
    public var tlsCertFile: String? = nil
    public var tlsKeyFile: String? = nil
    /// Mutual TLS on the peer link: the cluster CA, and this node's certificate and key from it.
    /// Only nodes with a certificate from that CA can join, gossip or call the peer port.
    public var peerTLSCAFile: String? = nil
    public var peerTLSCertFile: String? = nil
    public var peerTLSKeyFile: String? = nil
    public var logLevel = LogLevel.info
    public var logFormat = LogFormat.text
    /// Event loop threads (default: one per core).
    public var threads = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))

    public init(nodeID: String) {
        self.nodeID = nodeID
    }

    /// A flag: its name, the value it takes, and what it does.
    struct Flag: Sendable {
        let name: String
        let valueName: String
        let help: String
        let apply: @Sendable (inout NodeConfiguration, String) throws(ConfigurationError) -> Void
        var envName: String { "PRESENCED_" + name.uppercased().replacingOccurrences(of: "-", with: "_") }
    }

    static let flags: [Flag] = [
        Flag(name: "node-id", valueName: "ID", help: "this node's id in the cluster (default: host name)") { c, v throws(ConfigurationError) in
            guard Validate.isIdentifier(v) else { throw .invalid("node-id", v, "1-64 bytes of [A-Za-z0-9_.:@-]") }
            c.nodeID = v
        },
        Flag(name: "listen", valueName: "HOST:PORT", help: "address for clients' gRPC (default 127.0.0.1:7400)") { c, v throws(ConfigurationError) in
            c.listen = try hostPort("listen", v)
        },
        Flag(name: "peer-listen", valueName: "HOST:PORT", help: "address for other nodes (default 127.0.0.1:7401)") { c, v throws(ConfigurationError) in
            c.peerListen = try hostPort("peer-listen", v)
        },
        Flag(name: "http-listen", valueName: "HOST:PORT", help: "address for HTTP/1.1: /metrics, /healthz, /readyz (default 127.0.0.1:7402; none turns it off)") { c, v throws(ConfigurationError) in
            c.httpListen = v == "none" ? nil : try hostPort("http-listen", v)
        },
        Flag(name: "peer-advertise", valueName: "HOST:PORT", help: "peer address other nodes are told to use (default: the bound --peer-listen address)") { c, v throws(ConfigurationError) in
            c.peerAdvertise = try hostPort("peer-advertise", v)
        },
        Flag(name: "seeds", valueName: "HOST:PORT,...", help: "peer addresses of nodes to join through (default: none, a cluster of one)") { c, v throws(ConfigurationError) in
            c.seeds = try v.split(separator: ",").map { s throws(ConfigurationError) in try hostPort("seeds", String(s)) }
        },
        Flag(name: "presence-timeout", valueName: "SECONDS", help: "how long a disconnected session may resume before its user times out (default 10)") { c, v throws(ConfigurationError) in
            c.presenceTimeout = try seconds("presence-timeout", v, min: 0.01, max: 86_400)
        },
        Flag(name: "max-instant-events", valueName: "N", help: "occupancy above which a channel sends interval events (default 50)") { c, v throws(ConfigurationError) in
            c.maxInstantEvents = try integer("max-instant-events", v, min: 1, max: 1_000_000)
        },
        Flag(name: "listing-cache", valueName: "BYTES", help: "encoded GetOnlineUsers pages kept until their channel changes, in bytes per node; 0 keeps none (default 16777216)") { c, v throws(ConfigurationError) in
            c.listingCacheBytes = try integer("listing-cache", v, min: 0, max: 1 << 34)
        },
        Flag(name: "max-sessions", valueName: "N", help: "sessions this node holds at most; more are refused, RESOURCE_EXHAUSTED (default 1000000)") { c, v throws(ConfigurationError) in
            c.maxSessions = try integer("max-sessions", v, min: 1, max: 100_000_000)
        },
        Flag(name: "presence-interval", valueName: "SECONDS", help: "period of interval events (default 1)") { c, v throws(ConfigurationError) in
            c.presenceInterval = try seconds("presence-interval", v, min: 0.01, max: 3_600)
        },
        Flag(name: "replication-factor", valueName: "N", help: "copies of each channel's state in the cluster (default 2)") { c, v throws(ConfigurationError) in
            c.replicationFactor = try integer("replication-factor", v, min: 1, max: 16)
        },
        Flag(name: "probe-interval", valueName: "SECONDS", help: "SWIM protocol period; probe and suspicion timeouts scale with it (default 0.2)") { c, v throws(ConfigurationError) in
            c.probeInterval = try seconds("probe-interval", v, min: 0.02, max: 60)
        },
        Flag(name: "auth-secret-file", valueName: "PATH", help: "file holding the app secret for HMAC tokens (default: open mode, user ids trusted)") { c, v throws(ConfigurationError) in
            c.authSecretFile = try readableFile("auth-secret-file", v)
        },
        Flag(name: "cluster-secret-file", valueName: "PATH", help: "file holding the secret that authenticates peer traffic") { c, v throws(ConfigurationError) in
            c.clusterSecretFile = try readableFile("cluster-secret-file", v)
        },
        Flag(name: "tls-cert-file", valueName: "PATH", help: "certificate chain (PEM) for TLS on the client port, ALPN h2 (default: cleartext h2c); needs --tls-key-file") { c, v throws(ConfigurationError) in
            c.tlsCertFile = try readableFile("tls-cert-file", v)
        },
        Flag(name: "tls-key-file", valueName: "PATH", help: "private key (PEM) of --tls-cert-file; both are read again on SIGHUP") { c, v throws(ConfigurationError) in
            c.tlsKeyFile = try readableFile("tls-key-file", v)
        },
        Flag(name: "peer-tls-ca-file", valueName: "PATH", help: "cluster CA (PEM): mutual TLS on the peer link, only nodes with a certificate from it can join or call; needs --peer-tls-cert-file and --peer-tls-key-file") { c, v throws(ConfigurationError) in
            c.peerTLSCAFile = try readableFile("peer-tls-ca-file", v)
        },
        Flag(name: "peer-tls-cert-file", valueName: "PATH", help: "this node's certificate (PEM) from the cluster CA, for the peer link") { c, v throws(ConfigurationError) in
            c.peerTLSCertFile = try readableFile("peer-tls-cert-file", v)
        },
        Flag(name: "peer-tls-key-file", valueName: "PATH", help: "private key (PEM) of --peer-tls-cert-file; the three are read again on SIGHUP") { c, v throws(ConfigurationError) in
            c.peerTLSKeyFile = try readableFile("peer-tls-key-file", v)
        },
        Flag(name: "log-level", valueName: "LEVEL", help: "debug, info, warning or error (default info)") { c, v throws(ConfigurationError) in
            guard let l = LogLevel(rawValue: v) else { throw .invalid("log-level", v, "one of debug, info, warning, error") }
            c.logLevel = l
        },
        Flag(name: "log-format", valueName: "FORMAT", help: "text or json (default text)") { c, v throws(ConfigurationError) in
            guard let f = LogFormat(rawValue: v) else { throw .invalid("log-format", v, "text or json") }
            c.logFormat = f
        },
        Flag(name: "threads", valueName: "N", help: "event loop threads (default: one per core)") { c, v throws(ConfigurationError) in
            c.threads = try integer("threads", v, min: 1, max: 256)
        },
    ]

    /// What `--help` prints.
    public static var usage: String {
        var out = """
        presenced: one node of a presence cluster (gRPC presence.v1.Presence and grpc.health.v1.Health).

        Usage: presenced [FLAGS]

        Flags (each may also be set with the environment variable shown; the command line wins):

        """
        for f in flags {
            let left = "  --\(f.name) \(f.valueName)"
            out += left.padding(toLength: max(34, left.count + 1), withPad: " ", startingAt: 0) + f.help + "\n"
            out += String(repeating: " ", count: 34) + "env \(f.envName)\n"
        }
        out += "  --help                          this text\n"
        return out
    }

    /// The outcome of reading the command line.
    public enum ParseResult: Equatable {
        case run(NodeConfiguration)
        case help
    }

    /// Reads flags from `arguments` (without the program name) over `environment`.
    public static func parse(arguments: [String], environment: [String: String], hostName: String) throws(ConfigurationError) -> ParseResult {
        var config = NodeConfiguration(nodeID: Validate.isIdentifier(hostName) ? hostName : "node")
        for f in flags {
            if let v = environment[f.envName] { try f.apply(&config, v) }
        }
        var i = 0
        while i < arguments.count {
            let arg = arguments[i]
            if arg == "--help" || arg == "-h" { return .help }
            guard arg.hasPrefix("--") else { throw .unexpectedArgument(arg) }
            var name = String(arg.dropFirst(2))
            var value: String? = nil
            if let eq = name.firstIndex(of: "=") {
                value = String(name[name.index(after: eq)...])
                name = String(name[..<eq])
            }
            guard let flag = flags.first(where: { $0.name == name }) else { throw .unknownFlag(arg) }
            if value == nil {
                i += 1
                guard i < arguments.count else { throw .missingValue(name) }
                value = arguments[i]
            }
            try flag.apply(&config, value!)
            i += 1
        }
        try config.checkTogether()
        return .run(config)
    }

    /// Flags that only work together.
    private func checkTogether() throws(ConfigurationError) {
        if (tlsCertFile == nil) != (tlsKeyFile == nil) {
            throw .incomplete("--tls-cert-file and --tls-key-file go together")
        }
        let peer = [peerTLSCAFile, peerTLSCertFile, peerTLSKeyFile].filter { $0 != nil }.count
        if peer != 0 && peer != 3 {
            throw .incomplete("--peer-tls-ca-file, --peer-tls-cert-file and --peer-tls-key-file go together")
        }
    }

    private static func hostPort(_ flag: String, _ v: String) throws(ConfigurationError) -> HostPort {
        guard let hp = HostPort(parsing: v) else { throw .invalid(flag, v, "HOST:PORT with a port of 0-65535") }
        return hp
    }

    private static func seconds(_ flag: String, _ v: String, min: Double, max: Double) throws(ConfigurationError) -> Double {
        guard let d = Double(v), d.isFinite, d >= min, d <= max else { throw .invalid(flag, v, "seconds from \(min) to \(max)") }
        return d
    }

    private static func integer(_ flag: String, _ v: String, min: Int, max: Int) throws(ConfigurationError) -> Int {
        guard let n = Int(v), n >= min, n <= max else { throw .invalid(flag, v, "a whole number from \(min) to \(max)") }
        return n
    }

    private static func readableFile(_ flag: String, _ v: String) throws(ConfigurationError) -> String {
        guard access(v, R_OK) == 0 else { throw .invalid(flag, v, "a readable file") }
        return v
    }
}

/// A command line or environment that cannot be used; the message names the flag.
public enum ConfigurationError: Error, Equatable, CustomStringConvertible {
    case unknownFlag(String)
    case missingValue(String)
    case unexpectedArgument(String)
    case invalid(String, String, String)
    case incomplete(String)

    public var description: String {
        switch self {
        case .unknownFlag(let f): "unknown flag \(f) (see --help)"
        case .missingValue(let f): "flag --\(f) needs a value"
        case .unexpectedArgument(let a): "unexpected argument \(a) (flags start with --)"
        case .invalid(let f, let v, let want): "invalid value '\(v)' for --\(f): want \(want)"
        case .incomplete(let what): what
        }
    }
}
