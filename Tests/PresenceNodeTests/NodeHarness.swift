import EventLoop
import Foundation
import GRPCTransport
@testable import PresenceClient
import PresenceCore
@testable import PresenceNode
import PresenceWire
import Synchronization
import TestSupport
import Testing

/// A node on a loopback port with short timers, plus clients for it.
final class TestNode: Sendable {
    let node: Node
    /// What the test does to this node's traffic to its peers.
    let faults: PeerFaults
    let group = EventLoopGroup(count: 1, name: "test-clients")
    var address: HostPort { HostPort(host: "127.0.0.1", port: node.clientPort) }

    init(presenceTimeout: Double = 0.5, maxInstantEvents: Int = 50, presenceInterval: Double = 0.2, authSecretFile: String? = nil,
         nodeID: String = "test-node", seeds: [HostPort] = [], clusterSecretFile: String? = nil, replicationFactor: Int = 2,
         maxSessions: Int = 1_000_000, threads: Int = 1) throws {
        var c = NodeConfiguration(nodeID: nodeID)
        c.listen = HostPort(host: "127.0.0.1", port: 0)
        c.peerListen = HostPort(host: "127.0.0.1", port: 0)
        c.httpListen = HostPort(host: "127.0.0.1", port: 0)
        c.seeds = seeds
        c.replicationFactor = replicationFactor
        c.clusterSecretFile = clusterSecretFile
        c.presenceTimeout = presenceTimeout
        c.maxInstantEvents = maxInstantEvents
        c.maxSessions = maxSessions
        c.presenceInterval = presenceInterval
        c.authSecretFile = authSecretFile
        c.threads = threads
        c.logLevel = .error
        var wrapped: PeerFaults?
        node = try Node(configuration: c) { production in
            let faults = PeerFaults(production)
            wrapped = faults
            return faults
        }
        faults = wrapped!
        try node.start()
    }

    /// A node in token mode, and a signer of tokens it accepts.
    static func inTokenMode() throws -> (TestNode, TokenVerifier) {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("presenced-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let secretFile = dir.appendingPathComponent("secret").path
        try "s3cret\n".write(toFile: secretFile, atomically: true, encoding: .utf8)
        return (try TestNode(authSecretFile: secretFile), TokenVerifier(secret: Array("s3cret".utf8)))
    }

    func client(_ user: String, token: String = "") -> PresenceClient {
        PresenceClient(server: address, userID: user, token: token, group: group)
    }

    /// A raw gRPC client, for calls the library does not make.
    func raw() -> GRPCClient { GRPCClient(target: address, group: group) }

    func stop() async {
        await node.shutdown(gracePeriod: 500_000_000)
        group.shutdown()
    }
}

/// Collects a client's events so tests can wait for one with a deadline.
final class Inbox: Sendable {
    private final class Log: Sendable { let events = Mutex<[PresenceClientEvent]>([]) }
    private let log = Log()
    private let task: Task<Void, Never>

    init(_ client: PresenceClient) {
        let log = self.log
        task = Task {
            for await e in client.events { log.events.withLock { $0.append(e) } }
        }
    }

    deinit { task.cancel() }

    var all: [PresenceClientEvent] { log.events.withLock { $0 } }

    var presence: [PresenceEvent] {
        all.compactMap { if case .presence(let e) = $0 { return e } else { return nil } }
    }

    var statuses: [UserStatusEvent] {
        all.compactMap { if case .status(let e) = $0 { return e } else { return nil } }
    }

    /// Waits until `count` presence events of `type` (about `publisher`, if given) have arrived.
    @discardableResult
    func waitFor(_ type: PresenceEventType, publisher: String? = nil, count: Int = 1, within seconds: Double = 5) async throws -> PresenceEvent {
        let deadline = MonotonicClock.now() + UInt64(seconds * 1e9)
        while true {
            let matches = presence.filter { $0.type == type && (publisher == nil || $0.publisher == publisher) }
            if matches.count >= count { return matches[count - 1] }
            if MonotonicClock.now() > deadline {
                throw TimedOutWaiting(what: "\(type) \(publisher ?? "") (have \(presence.map { "\($0.channelName)#\($0.sequence % 100_000) \($0.type)/\($0.publisher)\($0.states.map { "=" + $0.value }.joined())" }))")
            }
            try await Task.sleep(nanoseconds: 2_000_000)
        }
    }

    @discardableResult
    func waitForStatus(_ user: String, _ status: UserStatus, within seconds: Double = 5) async throws -> UserStatusEvent {
        let deadline = MonotonicClock.now() + UInt64(seconds * 1e9)
        while true {
            if let e = statuses.last(where: { $0.userID == user && $0.status == status }) { return e }
            if MonotonicClock.now() > deadline { throw TimedOutWaiting(what: "status \(user) \(status) (have \(statuses))") }
            try await Task.sleep(nanoseconds: 2_000_000)
        }
    }
}


/// Expects a gRPC error with `code` whose message starts with `prefix`.
func expectError(_ code: GRPCStatus.Code, _ prefix: String = "", sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> Void) async {
    do {
        try await body()
        Issue.record("expected \(code.name) \(prefix), the call succeeded", sourceLocation: sourceLocation)
    } catch let s as GRPCStatus {
        #expect(s.code == code, "\(s)", sourceLocation: sourceLocation)
        #expect(s.message.hasPrefix(prefix), "\(s)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected GRPCStatus \(code.name), got \(error)", sourceLocation: sourceLocation)
    }
}

/// The next message of a server stream within a deadline: nil when the stream ended,
/// `TimedOutWaiting` when nothing came.
func next<M: ProtoMessage>(_ call: ServerStreamingCall<M>, within seconds: Double = 5) async throws -> M? {
    try await within(seconds, "the next message of a stream") {
        var it = call.makeAsyncIterator()
        return try await it.next()
    }
}

/// Expects a server stream to end with `code` (its message starting with `prefix`) before it
/// sends anything, within a deadline.
func expectStreamRefused<M: ProtoMessage>(_ call: ServerStreamingCall<M>, _ code: GRPCStatus.Code, _ prefix: String,
                                          within seconds: Double = 5, sourceLocation: SourceLocation = #_sourceLocation) async {
    do {
        if let m = try await next(call, within: seconds) {
            Issue.record("expected \(code.name) \(prefix), the stream sent \(m)", sourceLocation: sourceLocation)
        } else {
            Issue.record("expected \(code.name) \(prefix), the stream ended without an error", sourceLocation: sourceLocation)
        }
    } catch let s as GRPCStatus {
        #expect(s.code == code && s.message.hasPrefix(prefix), "\(s)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected \(code.name) \(prefix), got \(error)", sourceLocation: sourceLocation)
    }
}
