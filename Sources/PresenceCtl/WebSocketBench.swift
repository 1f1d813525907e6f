import EventLoop
import GRPCTransport
import Foundation
import HTTPFrontDoor
import PresenceWire
import Synchronization

/// One WebSocket session of the JSON API for the benchmarks: calls by id (awaited), events counted.
final class WSBenchSession: WebSocketDelegate, @unchecked Sendable {
    // (@unchecked: `socket` and the delegate callbacks are confined to `loop`; the only state
    // touched from other threads is behind `state`'s Mutex)
    let loop: EventLoop
    private var socket: WebSocketConnection!
    private struct State {
        var nextID = 0
        var waiting: [Int: CheckedContinuation<Void, Error>] = [:]
        var opened: CheckedContinuation<String, Error>? = nil
        var closed = false
    }
    private let state = Mutex(State())
    /// Presence events received while `counting` is on.
    let events = Atomic<Int>(0)
    let counting = Atomic<Bool>(false)

    private init(loop: EventLoop) { self.loop = loop }

    /// Connects, opens a session for `user`, and returns it with its session id.
    static func open(_ address: HostPort, user: String, token: String, loop: EventLoop) async throws -> (WSBenchSession, String) {
        let upgraded = try await Task.detached { try WebSocketClient.connect(to: address, loop: loop) }.value
        let s = WSBenchSession(loop: loop)
        let id = try await withCheckedThrowingContinuation { (c: CheckedContinuation<String, Error>) in
            s.state.withLock { $0.opened = c }
            let box = UncheckedBox(value: s)
            loop.execute {
                let ws = WebSocketConnection(socket: upgraded, client: true)
                box.value.socket = ws
                ws.delegate = box.value
                ws.start()
                var open = ["userId": user]
                if !token.isEmpty { open["token"] = token }
                let text = JSONValue.object([("open", .object(open.map { ($0.key, .string($0.value)) }))]).text
                _ = ws.send(text: Array(text.utf8))
            }
        }
        return (s, id)
    }

    /// A call; returns when its answer came (throws on an error answer).
    func call(_ method: String, _ request: JSONValue) async throws {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, Error>) in
            let id = state.withLock { st -> Int in
                st.nextID += 1
                st.waiting[st.nextID] = c
                return st.nextID
            }
            let text = Array(JSONValue.object([("id", .number(String(id))), ("method", .string(method)), ("request", request)]).text.utf8)
            let box = UncheckedBox(value: self)
            loop.execute { _ = box.value.socket.send(text: text) }
        }
    }

    func close() {
        let box = UncheckedBox(value: self)
        loop.execute { box.value.socket?.close(code: 1000, reason: "bench over") }
    }

    // MARK: WebSocketDelegate (on the loop)

    func webSocket(_ socket: WebSocketConnection, received text: [UInt8]) {
        // answers start {"id":N, events {"event":{...}}: only an open's answer is parsed whole
        if text.starts(with: Array(#"{"id":"#.utf8)) {
            var n = 0
            for b in text.dropFirst(6) {
                guard b >= 0x30 && b <= 0x39 else { break }
                n = n * 10 + Int(b - 0x30)
            }
            let failed = text.count > 14 && String(decoding: text.prefix(40), as: UTF8.self).contains("\"error\"")
            let c = state.withLock { $0.waiting.removeValue(forKey: n) }
            if failed { c?.resume(throwing: WebSocketClient.Failure(description: String(decoding: text, as: UTF8.self))) } else { c?.resume() }
        } else if text.starts(with: Array(#"{"event":{"presence""#.utf8)) {
            if counting.load(ordering: .relaxed) { events.add(1, ordering: .relaxed) }
        } else if let v = try? JSONParser.parse(text), let opened = v["event"]?["opened"]?["sessionId"]?.stringValue {
            state.withLock { st -> CheckedContinuation<String, Error>? in defer { st.opened = nil }; return st.opened }?.resume(returning: opened)
        } else if text.starts(with: Array(#"{"error""#.utf8)) {
            state.withLock { st -> CheckedContinuation<String, Error>? in defer { st.opened = nil }; return st.opened }?
                .resume(throwing: WebSocketClient.Failure(description: String(decoding: text, as: UTF8.self)))
        }
    }

    func webSocketDrained(_ socket: WebSocketConnection) {}

    func webSocketClosed(_ socket: WebSocketConnection, code: UInt16?) {
        let (waiting, opened) = state.withLock { st -> ([CheckedContinuation<Void, Error>], CheckedContinuation<String, Error>?) in
            st.closed = true
            defer { st.waiting = [:]; st.opened = nil }
            return (Array(st.waiting.values), st.opened)
        }
        let e = WebSocketClient.Failure(description: "closed (\(code.map(String.init) ?? "-"))")
        for c in waiting { c.resume(throwing: e) }
        opened?.resume(throwing: e)
    }
}

/// Carries a bench session to its own loop (@unchecked: its loop-confined parts are touched there
/// only; see `WSBenchSession`).
struct UncheckedBox<Value: AnyObject>: @unchecked Sendable {
    let value: Value
}

extension Bench {
    var httpTarget: HostPort {
        get throws {
            let text = ctx.args.value("http") ?? "127.0.0.1:7402"
            guard let hp = HostPort(parsing: text) else { throw UsageError("--http wants HOST:PORT, got '\(text)'") }
            return hp
        }
    }

    func wsSessions(count: Int, prefix: String, channel: String?, withPresence: Bool, group: EventLoopGroup) async throws -> [(WSBenchSession, String)] {
        let http = try httpTarget
        return try await withThrowingTaskGroup(of: (WSBenchSession, String).self) { g in
            for i in 0..<count {
                g.addTask {
                    let (s, id) = try await WSBenchSession.open(http, user: "\(prefix)\(i)", token: ctx.token, loop: group.loops[i % group.loops.count])
                    if let channel {
                        try await s.call("Join", .object([("channelName", .string(channel)), ("channelType", .string("CHANNEL_TYPE_MESSAGE")),
                                                          ("withPresence", .bool(withPresence))]))
                    }
                    return (s, id)
                }
            }
            var out: [(WSBenchSession, String)] = []
            for try await s in g { out.append(s) }
            return out
        }
    }

    /// SetState round trips over WebSocket, `clients` sockets with one call in flight each.
    func wsSetState() async throws {
        let clients = try ctx.args.int("clients", default: 50)
        let duration = try ctx.args.double("duration", default: 5)
        let group = EventLoopGroup(count: 1, name: "ws-bench")
        let channel = ctx.args.value("channel") ?? "bench-ws-setstate"
        let sessions = try await wsSessions(count: clients, prefix: "ws-u", channel: channel, withPresence: false, group: group)
        let result = try await drive(clients: clients, duration: duration, rate: ctx.args.value("rate").flatMap(Double.init)) { c, n in
            try await sessions[c].0.call("SetState", .object([("channelName", .string(channel)), ("channelType", .string("CHANNEL_TYPE_MESSAGE")),
                                                              ("items", .array([.object([("key", .string("mic")), ("value", .string(n % 2 == 0 ? "on" : "off"))])]))]))
        }
        Output.line("bench=ws-setstate clients=\(clients) \(result)")
        sessions.forEach { $0.0.close() }
    }

    /// Deliveries/s to `subscribers` WebSocket sessions in one channel while `publishers` gRPC
    /// sessions change their state.
    func wsFanout() async throws {
        let subscribers = try ctx.args.int("subscribers", default: 1000)
        let publishers = try ctx.args.int("publishers", default: 4)
        let duration = try ctx.args.double("duration", default: 5)
        let group = EventLoopGroup(count: 1, name: "ws-bench")
        let subs = try await wsSessions(count: subscribers, prefix: "wsfan-s", channel: "bench-ws-fanout", withPresence: true, group: group)
        let grpc = client(connections: 2)
        let pubs = try await sessions(grpc, count: publishers, prefix: "wsfan-p", channel: "bench-ws-fanout", withPresence: false)
        try await Task.sleep(nanoseconds: 1_000_000_000)  // let the snapshots and joins drain
        for s in subs { s.0.counting.store(true, ordering: .relaxed) }
        let t0 = MonotonicClock.now()
        let ids = pubs.map(\.0)
        let result = try await drive(clients: publishers, duration: duration, rate: nil) { c, n in
            _ = try await grpc.unary(PresenceMethods.setState, SetStateRequest(sessionID: ids[c], channelName: "bench-ws-fanout", channelType: .message,
                                                                              items: [StateItem(key: "n", value: String(n))]))
        }
        let elapsed = Double(MonotonicClock.now() - t0) / 1e9
        for s in subs { s.0.counting.store(false, ordering: .relaxed) }
        let delivered = subs.reduce(0) { $0 + $1.0.events.load(ordering: .relaxed) }
        Output.line(String(format: "bench=ws-fanout subscribers=%d publishers=%d deliveries_per_s=%.0f state_changes: %@", subscribers, publishers, Double(delivered) / elapsed, result))
        subs.forEach { $0.0.close() }
        for (_, st) in pubs { st.cancel() }
    }

    /// The node's resident memory per idle session (from its /metrics, before and after opening
    /// `sockets` sessions that joined nothing): over WebSocket, or (`grpc`) one gRPC stream each,
    /// 100 streams per HTTP/2 connection.
    func wsIdle(grpcPeer: Bool = false) async throws {
        let sockets = try ctx.args.int("sockets", default: 2000)
        let http = try httpTarget
        func rss() throws -> Double {
            let text = try MetricsFetch.get(http.description, path: "/metrics")
            guard let v = MetricsText.parse(text).first(where: { $0.name == "presenced_process_resident_memory_bytes" })?.value else {
                throw UsageError("no presenced_process_resident_memory_bytes at \(http)")
            }
            return v
        }
        if grpcPeer {
            let grpc = client(connections: max(1, sockets / 100))
            let warm = try await sessions(grpc, count: 50, prefix: "gidle-w", channel: "bench-idle-warm", withPresence: false)
            try await Task.sleep(nanoseconds: 500_000_000)
            let before = try rss()
            var open: [(String, RawServerStreamingCall)] = []
            for batch in stride(from: 0, to: sockets, by: 200) {
                open += try await sessions(grpc, count: min(200, sockets - batch), prefix: "gidle-\(batch)-", channel: nil, withPresence: false)
            }
            try await Task.sleep(nanoseconds: 1_000_000_000)
            let after = try rss()
            Output.line(String(format: "bench=grpc-idle sessions=%d rss_before_mib=%.1f rss_after_mib=%.1f bytes_per_session=%.0f",
                               sockets, before / 1_048_576, after / 1_048_576, (after - before) / Double(sockets)))
            for (_, st) in warm + open { st.cancel() }
            return
        }
        let group = EventLoopGroup(count: 1, name: "ws-bench")
        // (a few sessions first: the node's one-time allocations are not counted per socket)
        let warm = try await wsSessions(count: 50, prefix: "wsidle-w", channel: nil, withPresence: false, group: group)
        try await Task.sleep(nanoseconds: 500_000_000)
        let before = try rss()
        var open: [(WSBenchSession, String)] = []
        for batch in stride(from: 0, to: sockets, by: 200) {
            open += try await wsSessions(count: min(200, sockets - batch), prefix: "wsidle-\(batch)-", channel: nil, withPresence: false, group: group)
        }
        try await Task.sleep(nanoseconds: 1_000_000_000)
        let after = try rss()
        Output.line(String(format: "bench=ws-idle sockets=%d rss_before_mib=%.1f rss_after_mib=%.1f bytes_per_socket=%.0f",
                           sockets, before / 1_048_576, after / 1_048_576, (after - before) / Double(sockets)))
        (warm + open).forEach { $0.0.close() }
        try await Task.sleep(nanoseconds: 500_000_000)
    }
}
