import EventLoop
import Foundation
import GRPCTransport
import PresenceWire
import Synchronization

/// `presencectl bench ...`: load against a node, printing one `key=value` line of results.
struct Bench {
    let ctx: Context

    func run(_ rest: [String]) async throws {
        try ctx.args.check(allowed: ["server", "token", "clients", "duration", "subscribers", "connections", "rate", "publishers", "channel", "http", "sockets", "members", "channels"])
        guard let what = rest.first else { throw UsageError("bench wants setstate, online-users, fanout, ws-setstate, ws-fanout or ws-idle") }
        switch what {
        case "setstate": try await setState()
        case "online-users": try await onlineUsers()
        case "populate": try await populateAndHold()
        case "fanout": try await fanout()
        case "ws-setstate": try await wsSetState()
        case "ws-fanout": try await wsFanout()
        case "ws-idle": try await wsIdle()
        case "idle": try await wsIdle(grpcPeer: true)
        default: throw UsageError("unknown bench '\(what)'")
        }
    }

    func client(connections: Int) -> GRPCClient {
        var c = ClientConfiguration(target: ctx.server)
        c.connections = connections
        if !ctx.token.isEmpty { c.metadata = [("authorization", "Bearer " + ctx.token)] }
        c.tls = ctx.tls
        return GRPCClient(configuration: c, group: EventLoopGroup(count: 1, name: "bench"))
    }

    /// Opens `count` sessions (users `prefix`0...), each joined to `channel` (none: joined to
    /// nothing); returns ids and streams.
    func sessions(_ grpc: GRPCClient, count: Int, prefix: String, channel: String?, withPresence: Bool) async throws -> [(String, RawServerStreamingCall)] {
        try await withThrowingTaskGroup(of: (String, RawServerStreamingCall).self) { g in
            for i in 0..<count {
                g.addTask {
                    let req = MessageFraming.framed(OpenSessionRequest(userID: "\(prefix)\(i)", token: ctx.token))
                    let stream = grpc.serverStreaming(path: PresenceMethods.openSession.path, framedRequest: req)
                    var it = stream.makeAsyncIterator()
                    guard let first = try await it.next(), case .opened(let o)? = try SessionEvent(serializedBytes: first).event else {
                        throw GRPCStatus(.internal, "no opened message")
                    }
                    if let channel {
                        _ = try await grpc.unary(PresenceMethods.join, JoinRequest(sessionID: o.sessionID, channelName: channel, channelType: .message, withPresence: withPresence))
                    }
                    return (o.sessionID, stream)
                }
            }
            var out: [(String, RawServerStreamingCall)] = []
            for try await s in g { out.append(s) }
            return out
        }
    }

    /// Opens `count` sessions joined with presence to `channel`, whose events go to `onEvent` on the
    /// loop thread; returns their cancel functions.
    func callbackSessions(_ grpc: GRPCClient, count: Int, prefix: String, channel: String,
                          onEvent: @escaping @Sendable ([UInt8]) -> Void) async throws -> [@Sendable () -> Void] {
        final class Opened: Sendable {
            let id = Mutex<CheckedContinuation<String, Error>?>(nil)
        }
        return try await withThrowingTaskGroup(of: (@Sendable () -> Void).self) { g in
            for i in 0..<count {
                g.addTask {
                    let box = Opened()
                    var cancel: (@Sendable () -> Void)? = nil
                    let id = try await withCheckedThrowingContinuation { (c: CheckedContinuation<String, Error>) in
                        box.id.withLock { $0 = c }
                        let req = MessageFraming.framed(OpenSessionRequest(userID: "\(prefix)\(i)", token: ctx.token))
                        cancel = grpc.serverStreaming(path: PresenceMethods.openSession.path, framedRequest: req, onMessage: { bytes in
                            if let c = box.id.withLock({ c -> CheckedContinuation<String, Error>? in defer { c = nil }; return c }) {
                                if case .opened(let o)? = (try? SessionEvent(serializedBytes: bytes))?.event {
                                    c.resume(returning: o.sessionID)
                                } else {
                                    c.resume(throwing: GRPCStatus(.internal, "no opened message"))
                                }
                            } else {
                                onEvent(bytes)
                            }
                        }, onEnd: { status in
                            box.id.withLock { c -> CheckedContinuation<String, Error>? in defer { c = nil }; return c }?.resume(throwing: status)
                        })
                    }
                    _ = try await grpc.unary(PresenceMethods.join, JoinRequest(sessionID: id, channelName: channel, channelType: .message, withPresence: true))
                    return cancel!
                }
            }
            var out: [@Sendable () -> Void] = []
            for try await c in g { out.append(c) }
            return out
        }
    }

    /// Runs `work` from `clients` tasks for `duration` seconds (optionally paced to `rate` calls/s in
    /// total); returns calls/s and latency percentiles in ms.
    func drive(clients: Int, duration: Double, rate: Double?, _ work: @escaping @Sendable (Int, Int) async throws -> Void) async throws -> String {
        let end = MonotonicClock.now() + UInt64(duration * 1e9)
        let perClientGap = rate.map { UInt64(Double(clients) / $0 * 1e9) }
        // (paced clients start at evenly spaced phases of their gap, so the offered calls arrive
        // spread over time: started together, 50 clients sent in bursts of 50 and measured the
        // burst's queue, not the node's latency at that rate)
        let start = MonotonicClock.now()
        let results = try await withThrowingTaskGroup(of: [UInt64].self) { g in
            for c in 0..<clients {
                g.addTask {
                    var lat: [UInt64] = []
                    var n = 0
                    var next = start + (perClientGap ?? 0) / UInt64(clients) * UInt64(c)
                    while MonotonicClock.now() < end {
                        if let gap = perClientGap {
                            let now = MonotonicClock.now()
                            if next > now { try await Task.sleep(nanoseconds: next - now) }
                            next += gap
                        }
                        let t0 = MonotonicClock.now()
                        try await work(c, n)
                        lat.append(MonotonicClock.now() - t0)
                        n += 1
                    }
                    return lat
                }
            }
            var all: [UInt64] = []
            for try await l in g { all += l }
            return all
        }
        let sorted = results.sorted()
        func pct(_ p: Double) -> Double { sorted.isEmpty ? 0 : Double(sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]) / 1e6 }
        return String(format: "rate=%.0f p50_ms=%.3f p99_ms=%.3f calls=%d", Double(sorted.count) / duration, pct(0.5), pct(0.99), sorted.count)
    }

    func setState() async throws {
        let clients = try ctx.args.int("clients", default: 50)
        let duration = try ctx.args.double("duration", default: 5)
        let rate = ctx.args.value("rate").flatMap(Double.init)
        let grpc = client(connections: try ctx.args.int("connections", default: 4))
        let channel = ctx.args.value("channel") ?? "bench-setstate"
        // (--channels K: client c writes to channel "NAME-(c % K)")
        let spread = try ctx.args.int("channels", default: 1)
        @Sendable func channelOf(_ c: Int) -> String { spread > 1 ? "\(channel)-\(c % spread)" : channel }
        // (other members of the channel, idle: a write's cost should not grow with them)
        let extra = try ctx.args.count("members", default: 0)
        let others = extra == 0 ? [] : try await populate(client(connections: connections(forMembers: extra)), channel: channel,
                                                          count: extra, withState: false)
        var s: [(String, RawServerStreamingCall)] = []
        for c in 0..<clients {
            s += try await sessions(grpc, count: 1, prefix: "bench-u\(c)-", channel: channelOf(c), withPresence: false)
        }
        let ids = s.map(\.0)
        let result = try await drive(clients: clients, duration: duration, rate: rate) { c, n in
            _ = try await grpc.unary(PresenceMethods.setState, SetStateRequest(sessionID: ids[c], channelName: channelOf(c), channelType: .message,
                                                                              items: [StateItem(key: "mic", value: n % 2 == 0 ? "on" : "off")]))
        }
        Output.line("bench=setstate clients=\(clients) members=\(others.count + clients) \(result)")
        for (_, st) in s { st.cancel() }
        for (_, st) in others { st.cancel() }
    }

    func onlineUsers() async throws {
        let clients = try ctx.args.int("clients", default: 50)
        let duration = try ctx.args.double("duration", default: 5)
        // (--members 0: the channel is filled already, by `bench populate`)
        let count = try ctx.args.count("members", default: 100)
        let channel = ctx.args.value("channel") ?? "bench-online"
        let grpc = client(connections: try ctx.args.int("connections", default: connections(forMembers: count)))
        let members = try await populate(grpc, channel: channel, count: count, withState: true)
        let page = min(100, count)
        let result = try await drive(clients: clients, duration: duration, rate: nil) { _, _ in
            let r = try await grpc.unary(PresenceMethods.getOnlineUsers, GetOnlineUsersRequest(channelName: channel, channelType: .message, includeState: true))
            guard page == 0 ? !r.users.isEmpty : r.users.count == page else { throw GRPCStatus(.internal, "page of \(r.users.count)") }
        }
        Output.line("bench=online-users members=\(count) page=\(page) include_state=true clients=\(clients) \(result)")
        for (_, st) in members { st.cancel() }
    }

    /// Fills a channel with members (with a state key each), prints `ready`, and holds their
    /// sessions until standard input closes: for load generators such as h2load to read it.
    func populateAndHold() async throws {
        let count = try ctx.args.count("members", default: 100)
        let channel = ctx.args.value("channel") ?? "bench-online"
        let grpc = client(connections: try ctx.args.int("connections", default: connections(forMembers: count)))
        let members = try await populate(grpc, channel: channel, count: count, withState: true)
        Output.line("bench=populate channel=\(channel) members=\(members.count) ready")
        try await Task.detached { while readLine() != nil {} }.value
        for (_, st) in members { st.cancel() }
    }

    /// Connections for `count` sessions held open: each carries at most 1,024 streams.
    func connections(forMembers count: Int) -> Int { max(4, count / 1000 + 1) }

    /// Opens `count` sessions joined to `channel` (without presence), each with one state key when
    /// `withState`, at most 512 opening at a time.
    func populate(_ grpc: GRPCClient, channel: String, count: Int, withState: Bool) async throws -> [(String, RawServerStreamingCall)] {
        var out: [(String, RawServerStreamingCall)] = []
        var start = 0
        while start < count {
            let n = min(512, count - start)
            let batch = try await sessions(grpc, count: n, prefix: "bench-m\(start)-", channel: channel, withPresence: false)
            if withState {
                for (i, (id, _)) in batch.enumerated() {
                    _ = try await grpc.unary(PresenceMethods.setState, SetStateRequest(sessionID: id, channelName: channel, channelType: .message,
                                                                                      items: [StateItem(key: "score", value: String(start + i))]))
                }
            }
            out += batch
            start += n
        }
        return out
    }

    func fanout() async throws {
        let subscribers = try ctx.args.int("subscribers", default: 1000)
        let publishers = try ctx.args.int("publishers", default: 4)
        let duration = try ctx.args.double("duration", default: 5)
        let grpc = client(connections: try ctx.args.int("connections", default: 8))
        final class Counter: Sendable { let n = Atomic<Int>(0); let counting = Atomic<Bool>(false) }
        let counter = Counter()
        // Subscribers read on the loop thread with a callback (a counting consumer needs no task per message).
        let subs = try await callbackSessions(grpc, count: subscribers, prefix: "fan-s", channel: "bench-fanout") { _ in
            if counter.counting.load(ordering: .relaxed) { counter.n.add(1, ordering: .relaxed) }
        }
        let pubs = try await sessions(grpc, count: publishers, prefix: "fan-p", channel: "bench-fanout", withPresence: false)
        try await Task.sleep(nanoseconds: 500_000_000)  // let the snapshots drain
        counter.counting.store(true, ordering: .relaxed)
        let t0 = MonotonicClock.now()
        let ids = pubs.map(\.0)
        // (--rate: state changes/s in all, paced; default: as fast as the publishers go)
        let result = try await drive(clients: publishers, duration: duration, rate: ctx.args.value("rate").flatMap(Double.init)) { c, n in
            _ = try await grpc.unary(PresenceMethods.setState, SetStateRequest(sessionID: ids[c], channelName: "bench-fanout", channelType: .message,
                                                                              items: [StateItem(key: "n", value: String(n))]))
        }
        let elapsed = Double(MonotonicClock.now() - t0) / 1e9
        counter.counting.store(false, ordering: .relaxed)
        let delivered = counter.n.load(ordering: .relaxed)
        Output.line(String(format: "bench=fanout subscribers=%d publishers=%d deliveries_per_s=%.0f state_changes: %@", subscribers, publishers, Double(delivered) / elapsed, result))
        subs.forEach { $0() }
        for (_, st) in pubs { st.cancel() }
    }
}
