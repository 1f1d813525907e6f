import EventLoop
import Foundation
@testable import GRPCTransport
import PresenceWire
import Synchronization
import Testing

/// Test methods, using generated message types as payloads.
enum TestMethods {
    static let echo = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Unary", kind: .unary)
    static let inlineEcho = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Inline", kind: .unary)
    /// key = count, value = payload size; streams `count` messages.
    static let stream = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Stream", kind: .serverStreaming)
    /// Sends one message, then waits until cancelled.
    static let hang = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Hang", kind: .serverStreaming)
    /// Waits until cancelled (unary).
    static let hangUnary = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/HangUnary", kind: .unary)
    /// Waits until `value` calls are in the barrier at once, then answers how many it saw.
    static let barrier = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Barrier", kind: .unary)
    /// Runs for 20 ms, counting how many run at once.
    static let gauge = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Gauge", kind: .unary)
    /// Echoes each message of a bidirectional call; with key "count", answers how many it read.
    static let bidiEcho = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Bidi", kind: .bidiStreaming)
    /// A bidirectional call that never reads its requests (waits until cancelled).
    static let bidiDeaf = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/BidiDeaf", kind: .bidiStreaming)
    /// A staged method: key "now" answers at once, "later" from its rest (after a suspension),
    /// "fail" and "fail later" fail in the first part or the rest; the answer's value says whether
    /// the part that answered ran in a task ("task" or "no task"). Keys starting "moved " hand the
    /// call to the other loop first, where the rest of the key is done ("moved now", "moved
    /// fail", "moved later", "moved moved now"), and the value then ends with " there" when the
    /// answering part ran on that other loop. "to a stopped loop" hands the call to a loop that
    /// has stopped.
    static let staged = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Staged", kind: .unary)
    /// Sleeps `value` ms, then echoes.
    static let slow = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Slow", kind: .unary)
}

/// What the test handlers observed.
final class Observations: Sendable {
    let cancelledHandlers = Atomic<Int>(0)
    /// Handlers of `hangUnary` and `slow` that have started (tests wait for them, not for a time).
    let startedHandlers = Atomic<Int>(0)
    let inBarrier = Atomic<Int>(0)
    let maxInBarrier = Atomic<Int>(0)
    /// Handlers of `gauge` running now, and the most at once.
    let inGauge = Atomic<Int>(0)
    let maxInGauge = Atomic<Int>(0)
    let writers = Mutex<[ServerStreamWriter]>([])
}

/// A server with the test methods on loopback, and a client for it.
struct Harness {
    let group: EventLoopGroup
    let server: GRPCServer
    let client: GRPCClient
    let seen: Observations

    init(configure: (inout ServerConfiguration) -> Void = { _ in }, client configureClient: (inout ClientConfiguration) -> Void = { _ in }) throws {
        group = EventLoopGroup(count: 2, name: "test")
        let seen = Observations()
        self.seen = seen
        var registry = ServiceRegistry()
        registry.unary(TestMethods.echo) { req, _ in req }
        registry.bidiStreaming(TestMethods.bidiEcho) { requests, _, writer in
            var n = 0
            for try await req in requests {
                n += 1
                try await writer.send(req)
            }
            try await writer.send(StateItem(key: "count", value: String(n)))
        }
        registry.bidiStreaming(TestMethods.bidiDeaf) { _, _, _ in
            while !Task.isCancelled { try? await Task.sleep(nanoseconds: 10_000_000) }
            seen.cancelledHandlers.add(1, ordering: .relaxed)
        }
        registry.unaryInline(TestMethods.inlineEcho) { req, _ in
            if req.key == "fail" { throw GRPCStatus(.invalidArgument, "BAD_KEY: ünïcode % message") }
            return req
        }
        let loops = group.loops
        let stoppedGroup = EventLoopGroup(count: 1, name: "test-stopped")
        stoppedGroup.shutdown()  // (waits until it has stopped: it takes no job from then on)
        let stopped = stoppedGroup.loops[0]
        @Sendable func staged(_ key: String, answering full: String, there: EventLoop?) throws -> Staged<StateItem, any Error> {
            @Sendable func where_() -> String {
                withUnsafeCurrentTask { $0 == nil ? "no task" : "task" } + (there?.inEventLoop == true ? " there" : "")
            }
            switch key {
            case "now": return .now(StateItem(key: full, value: where_()))
            case "fail": throw GRPCStatus(.failedPrecondition, "FIRST_PART_FAILED")
            case "fail later":
                return .later {
                    await Task.yield()
                    throw GRPCStatus(.aborted, "REST_FAILED")
                }
            case "to a stopped loop":
                return .onLoop(stopped) { .now(StateItem(key: full, value: "ran")) }
            case let moved where moved.hasPrefix("moved "):
                let other = there ?? loops.first { !$0.inEventLoop }!
                return .onLoop(other) { try staged(String(moved.dropFirst(6)), answering: full, there: other) }
            default:
                return .later {
                    await Task.yield()
                    return StateItem(key: full, value: where_())
                }
            }
        }
        registry.unaryStaged(TestMethods.staged) { req, _ in try staged(req.key, answering: req.key, there: nil) }
        registry.serverStreaming(TestMethods.stream) { req, _, writer in
            seen.writers.withLock { $0.append(writer.raw) }
            let count = Int(req.key) ?? 0
            let payload = String(repeating: "x", count: Int(req.value) ?? 10)
            for i in 0..<count {
                try await writer.send(StateItem(key: String(i), value: payload))
            }
        }
        registry.serverStreaming(TestMethods.hang) { req, _, writer in
            try await writer.send(req)
            do {
                while true { try await Task.sleep(nanoseconds: 1_000_000_000) }
            } catch {
                seen.cancelledHandlers.add(1, ordering: .relaxed)
                throw error
            }
        }
        registry.unary(TestMethods.hangUnary) { req, _ in
            seen.startedHandlers.add(1, ordering: .relaxed)
            do {
                while true { try await Task.sleep(nanoseconds: 1_000_000_000) }
            } catch {
                seen.cancelledHandlers.add(1, ordering: .relaxed)
                throw error
            }
        }
        registry.unary(TestMethods.barrier) { req, _ in
            let target = Int(req.value) ?? 1
            let now = seen.inBarrier.add(1, ordering: .relaxed).newValue
            _ = seen.maxInBarrier.max(now, ordering: .relaxed)
            let deadline = MonotonicClock.now() + 20_000_000_000
            while seen.maxInBarrier.load(ordering: .relaxed) < target && MonotonicClock.now() < deadline {
                try await Task.sleep(nanoseconds: 1_000_000)
            }
            return StateItem(key: req.key, value: String(seen.maxInBarrier.load(ordering: .relaxed)))
        }
        registry.unary(TestMethods.gauge) { req, _ in
            let now = seen.inGauge.add(1, ordering: .relaxed).newValue
            _ = seen.maxInGauge.max(now, ordering: .relaxed)
            try? await Task.sleep(nanoseconds: 20_000_000)
            seen.inGauge.subtract(1, ordering: .relaxed)
            return req
        }
        registry.unary(TestMethods.slow) { req, _ in
            seen.startedHandlers.add(1, ordering: .relaxed)
            try await Task.sleep(nanoseconds: UInt64(Int(req.value) ?? 0) * 1_000_000)
            return req
        }
        var config = ServerConfiguration(address: HostPort(host: "127.0.0.1", port: 0))
        configure(&config)
        server = GRPCServer(configuration: config, services: registry, group: group)
        try server.start()
        var clientConfig = ClientConfiguration(target: HostPort(host: "127.0.0.1", port: server.port))
        configureClient(&clientConfig)
        client = GRPCClient(configuration: clientConfig, group: group)
    }

    func stop() async {
        client.close()
        await server.shutdown(gracePeriod: 1_000_000_000)
        group.shutdown()
    }
}

struct TimedOut: Error, CustomStringConvertible {
    let what: String
    var description: String { "timed out waiting for \(what)" }
}

/// Waits until `condition` holds, checking every millisecond, failing after `seconds`.
func eventually(_ what: String, within seconds: Double = 5, _ condition: () -> Bool) async throws {
    let deadline = MonotonicClock.now() + UInt64(seconds * 1e9)
    while !condition() {
        if MonotonicClock.now() > deadline { throw TimedOut(what: what) }
        try await Task.sleep(nanoseconds: 1_000_000)
    }
}

func expectStatus(_ code: GRPCStatus.Code, _ body: () async throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) async -> GRPCStatus? {
    do {
        try await body()
        Issue.record("expected \(code.name), the call succeeded", sourceLocation: sourceLocation)
        return nil
    } catch let s as GRPCStatus {
        #expect(s.code == code, "\(s)", sourceLocation: sourceLocation)
        return s
    } catch {
        Issue.record("expected GRPCStatus \(code.name), got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}
