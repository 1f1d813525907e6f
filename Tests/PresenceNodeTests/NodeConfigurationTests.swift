@testable import PresenceNode
import EventLoop
import Testing

@Suite struct NodeConfigurationTests {
    func parse(_ args: [String], env: [String: String] = [:]) throws -> NodeConfiguration {
        guard case .run(let c) = try NodeConfiguration.parse(arguments: args, environment: env, hostName: "host-1") else {
            throw ConfigurationError.unexpectedArgument("help")
        }
        return c
    }

    /// Each command line is refused with a message naming the flag (or argument) given with it.
    func expectRefused(_ cases: [([String], String)]) {
        for (args, name) in cases {
            do {
                _ = try parse(args)
                Issue.record("\(args) was accepted")
            } catch {
                #expect("\(error)".contains(name), "\(args): \(error)")
            }
        }
    }

    @Test func defaults() throws {
        let c = try parse([])
        #expect(c.nodeID == "host-1")
        #expect(c.listen == HostPort(host: "127.0.0.1", port: 7400))
        #expect(c.peerListen == HostPort(host: "127.0.0.1", port: 7401))
        #expect(c.peerAdvertise == nil)
        #expect(c.httpListen == HostPort(host: "127.0.0.1", port: 7402))
        #expect(c.seeds.isEmpty)
        #expect(c.presenceTimeout == 10)
        #expect(c.maxInstantEvents == 50)
        #expect(c.presenceInterval == 1)
        #expect(c.replicationFactor == 2)
        #expect(c.probeInterval == 0.2)
        #expect(c.authSecretFile == nil)
        #expect(c.logLevel == .info && c.logFormat == .text)
    }

    @Test func everyFlag() throws {
        let c = try parse(["--node-id", "n7", "--listen", "0.0.0.0:9000", "--peer-listen=[::1]:9001",
                           "--seeds", "10.0.0.1:7401,h2:7401", "--presence-timeout", "2.5",
                           "--max-instant-events", "3", "--presence-interval", "0.25", "--replication-factor", "3", "--probe-interval", "0.5",
                           "--listing-cache", "0",
                           "--auth-secret-file", "/dev/null", "--cluster-secret-file", "/dev/null",
                           "--log-level", "debug", "--log-format", "json"])
        #expect(c.nodeID == "n7")
        #expect(c.listen == HostPort(host: "0.0.0.0", port: 9000))
        #expect(c.peerListen == HostPort(host: "::1", port: 9001))
        #expect(c.seeds == [HostPort(host: "10.0.0.1", port: 7401), HostPort(host: "h2", port: 7401)])
        #expect(c.presenceTimeout == 2.5)
        #expect(c.maxInstantEvents == 3)
        #expect(c.presenceInterval == 0.25)
        #expect(c.replicationFactor == 3)
        #expect(c.probeInterval == 0.5)
        #expect(c.listingCacheBytes == 0)
        #expect(c.authSecretFile == "/dev/null" && c.clusterSecretFile == "/dev/null")
        #expect(c.logLevel == .debug && c.logFormat == .json)
    }

    @Test func httpListenTakesAnAddressOrNone() throws {
        #expect(try parse(["--http-listen", "0.0.0.0:8080"]).httpListen == HostPort(host: "0.0.0.0", port: 8080))
        #expect(try parse(["--http-listen", "none"]).httpListen == nil)
        #expect(try parse([], env: ["PRESENCED_HTTP_LISTEN": "none"]).httpListen == nil)
        #expect(throws: ConfigurationError.self) { try parse(["--http-listen", "nowhere"]) }
    }

    @Test func peerAdvertise() throws {
        #expect(try parse(["--peer-advertise", "10.0.0.9:17401"]).peerAdvertise == HostPort(host: "10.0.0.9", port: 17401))
        #expect(try parse([], env: ["PRESENCED_PEER_ADVERTISE": "127.0.0.1:9"]).peerAdvertise == HostPort(host: "127.0.0.1", port: 9))
        #expect(try parse(["--peer-listen", "127.0.0.1:5"]).peerAdvertise == nil)
        #expect(throws: ConfigurationError.self) { try parse(["--peer-advertise", "nohost"]) }
    }

    @Test func environmentAndCommandLinePrecedence() throws {
        let env = ["PRESENCED_LISTEN": "127.0.0.1:1", "PRESENCED_NODE_ID": "from-env", "PRESENCED_PRESENCE_TIMEOUT": "3"]
        let c = try parse(["--listen", "127.0.0.1:2"], env: env)
        #expect(c.listen.port == 2)
        #expect(c.nodeID == "from-env")
        #expect(c.presenceTimeout == 3)
    }

    @Test func badValuesNameTheFlag() {
        let cases: [([String], String)] = [
            (["--listen", "x"], "--listen"), (["--presence-timeout", "0"], "--presence-timeout"),
            (["--presence-timeout", "nan"], "--presence-timeout"), (["--max-instant-events", "0"], "--max-instant-events"),
            (["--listing-cache", "-1"], "--listing-cache"),
            (["--replication-factor", "x"], "--replication-factor"), (["--probe-interval", "0"], "--probe-interval"), (["--node-id", "has space"], "--node-id"),
            (["--seeds", "a:1,b"], "--seeds"), (["--log-level", "loud"], "--log-level"), (["--nope"], "--nope"),
            (["--listen"], "--listen"), (["stray"], "stray"),
        ]
        expectRefused(cases)
    }

    @Test func tlsFlagsGoTogetherAndMustBeReadable() throws {
        let c = try parse(["--tls-cert-file", "/dev/null", "--tls-key-file", "/dev/null", "--peer-tls-ca-file", "/dev/null",
                           "--peer-tls-cert-file", "/dev/null", "--peer-tls-key-file", "/dev/null"])
        #expect(c.tlsCertFile == "/dev/null" && c.tlsKeyFile == "/dev/null" && c.peerTLSCAFile == "/dev/null")
        let incomplete: [([String], String)] = [
            (["--tls-cert-file", "/dev/null"], "--tls-key-file"),
            (["--peer-tls-ca-file", "/dev/null", "--peer-tls-cert-file", "/dev/null"], "--peer-tls-key-file"),
            (["--peer-tls-cert-file", "/dev/null", "--peer-tls-key-file", "/dev/null"], "--peer-tls-ca-file"),
            (["--tls-cert-file", "/nonexistent/cert.pem", "--tls-key-file", "/dev/null"], "--tls-cert-file"),
        ]
        expectRefused(incomplete)
        // files that exist but hold no certificate: the node refuses to start, saying which
        var bad = NodeConfiguration(nodeID: "n")
        bad.listen = HostPort(host: "127.0.0.1", port: 0)
        bad.peerListen = HostPort(host: "127.0.0.1", port: 0)
        bad.httpListen = nil
        bad.tlsCertFile = "/dev/null"
        bad.tlsKeyFile = "/dev/null"
        do {
            _ = try Node(configuration: bad)
            Issue.record("a node started with an empty certificate file")
        } catch {
            #expect("\(error)".contains("/dev/null"), "\(error)")
        }
    }

    @Test func help() throws {
        #expect(try NodeConfiguration.parse(arguments: ["--help"], environment: [:], hostName: "h") == .help)
        #expect(NodeConfiguration.usage.contains("PRESENCED_MAX_INSTANT_EVENTS"))
    }
}
