import EventLoop
import Foundation
@testable import GRPCTransport
import PresenceWire
import Synchronization
import TestSupport
import Testing

@Suite(.serialized) struct ServerClientTests {
    @Test func unaryRoundTripBothHandlerKinds() async throws {
        let h = try Harness()
        let item = StateItem(key: "mic", value: "on ✓")
        #expect(try await h.client.unary(TestMethods.echo, item) == item)
        #expect(try await h.client.unary(TestMethods.inlineEcho, item) == item)
        await h.stop()
    }

    /// A staged method's first part runs on the connection's loop and, when it answers at once,
    /// no task is made for it; otherwise its rest runs as a task; errors of either part are the
    /// call's status.
    @Test func aStagedMethodAnswersAtOnceOrFromItsRest() async throws {
        let h = try Harness()
        #expect(try await h.client.unary(TestMethods.staged, StateItem(key: "now")) == StateItem(key: "now", value: "no task"))
        #expect(try await h.client.unary(TestMethods.staged, StateItem(key: "later")) == StateItem(key: "later", value: "task"))
        let first = await expectStatus(.failedPrecondition) { _ = try await h.client.unary(TestMethods.staged, StateItem(key: "fail")) }
        #expect(first?.message == "FIRST_PART_FAILED")
        let rest = await expectStatus(.aborted) { _ = try await h.client.unary(TestMethods.staged, StateItem(key: "fail later")) }
        #expect(rest?.message == "REST_FAILED")
        // many at once on one connection, both kinds mixed: each answered, the slots given back
        try await withThrowingTaskGroup(of: Void.self) { g in
            for i in 0..<200 {
                g.addTask {
                    let key = i % 2 == 0 ? "now" : "later"
                    let answer = try await h.client.unary(TestMethods.staged, StateItem(key: key))
                    #expect(answer.key == key)
                }
            }
            try await g.waitForAll()
        }
        #expect(try await h.client.unary(TestMethods.staged, StateItem(key: "now")).value == "no task")
        await h.stop()
    }

    /// A staged call handed to another loop is tried again there, as a plain job (no task), and
    /// its answer, failure or rest comes back to its connection; one that asks to move again is
    /// not handed on twice but still answered.
    @Test func aStagedCallHandedToAnotherLoopIsAnsweredFromThere() async throws {
        let h = try Harness()
        // (a deadline: an answer lost on its way back fails the test instead of hanging it)
        func call(_ key: String) async throws -> String {
            try await h.client.unary(TestMethods.staged, StateItem(key: key), timeout: .seconds(10)).value
        }
        #expect(try await call("moved now") == "no task there")
        #expect(try await call("moved later") == "task")
        let failed = await expectStatus(.failedPrecondition) { _ = try await call("moved fail") }
        #expect(failed?.message == "FIRST_PART_FAILED")
        await expectStatus(.aborted) { _ = try await call("moved fail later") }
        #expect(try await call("moved moved now").hasSuffix("there"))
        // a loop that has stopped takes no job: the call is answered UNAVAILABLE, not left waiting
        await expectStatus(.unavailable) { _ = try await call("to a stopped loop") }
        try await withThrowingTaskGroup(of: Void.self) { g in
            for i in 0..<200 {
                g.addTask {
                    let key = ["moved now", "now", "moved later"][i % 3]
                    let answer = try await h.client.unary(TestMethods.staged, StateItem(key: key), timeout: .seconds(10))
                    #expect(answer.key == key)
                }
            }
            try await g.waitForAll()
        }
        await h.stop()
    }

    @Test func handlerErrorsBecomeStatusWithPercentEncodedMessage() async throws {
        let h = try Harness()
        let s = await expectStatus(.invalidArgument) { _ = try await h.client.unary(TestMethods.inlineEcho, StateItem(key: "fail")) }
        #expect(s?.message == "BAD_KEY: ünïcode % message")
        await h.stop()
    }

    @Test func unknownMethodIsUnimplemented() async throws {
        let h = try Harness()
        let m = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Nope", kind: .unary)
        await expectStatus(.unimplemented) { _ = try await h.client.unary(m, StateItem()) }
        await h.stop()
    }

    /// The call observer is asked once per method when the server starts, and each call's end
    /// reaches its method's observer; paths no method serves count as "unknown", and a path that
    /// only shares a method's length is not taken for it.
    @Test func eachCallsEndReachesItsMethodsObserver() async throws {
        let asked = Mutex<[String]>([])
        let ended = Mutex<[String]>([])
        let h = try Harness {
            $0.callObserver = { path in
                asked.withLock { $0.append(path) }
                return { code, _ in ended.withLock { $0.append("\(path) \(code)") } }
            }
        }
        let item = StateItem(key: "mic")
        #expect(try await h.client.unary(TestMethods.echo, item) == item)
        #expect(try await h.client.unary(TestMethods.inlineEcho, item) == item)
        await expectStatus(.invalidArgument) { _ = try await h.client.unary(TestMethods.inlineEcho, StateItem(key: "fail")) }
        // "/test.Echo/Unary" and "/test.Echo/Unarx" are the same length
        let lookalike = MethodDescriptor<StateItem, StateItem>(path: "/test.Echo/Unarx", kind: .unary)
        await expectStatus(.unimplemented) { _ = try await h.client.unary(lookalike, item) }
        try await eventually("four calls observed") { ended.withLock { $0.count } == 4 }
        #expect(ended.withLock { $0 } == ["\(TestMethods.echo.path) ok", "\(TestMethods.inlineEcho.path) ok",
                                           "\(TestMethods.inlineEcho.path) invalidArgument", "unknown unimplemented"])
        let paths = asked.withLock { $0 }
        #expect(Set(paths).count == paths.count && Set([TestMethods.echo.path, TestMethods.inlineEcho.path, "unknown"]).isSubset(of: paths), "\(paths)")
        await h.stop()
    }

    @Test func malformedRequestIsInvalidArgument() async throws {
        let h = try Harness()
        await expectStatus(.invalidArgument) {
            _ = try await h.client.unary(path: TestMethods.echo.path, framedRequest: MessageDeframer.frame([0xff, 0xff]), timeout: nil)
        }
        await h.stop()
    }

    @Test func manyCallsMultiplexOnOneConnection() async throws {
        let h = try Harness()
        try await withThrowingTaskGroup(of: Void.self) { g in
            for i in 0..<500 {
                g.addTask {
                    let r = try await h.client.unary(TestMethods.echo, StateItem(key: "k\(i)", value: String(i)))
                    #expect(r.value == String(i))
                }
            }
            try await g.waitForAll()
        }
        #expect(h.server.connections == 1)
        await h.stop()
    }

    @Test func serverStreamOf10000WithSlowReaderStaysBounded() async throws {
        let h = try Harness()
        let call = h.client.serverStreaming(TestMethods.stream, StateItem(key: "10000", value: "1000"))
        let received = try await within(60, "10,000 messages") {
            var expected = 0
            for try await item in call {
                #expect(item.key == String(expected))
                expected += 1
                if expected % 50 == 0 { try await Task.sleep(nanoseconds: 1_000_000) } // a slow reader
            }
            return expected
        }
        #expect(received == 10_000)
        let writer = try #require(h.seen.writers.withLock { $0.first })
        // The server never held more than its high-water mark plus one message...
        #expect(writer.peakQueuedBytes <= writer.highWaterMark + 1_100)
        // ...because it had to wait for the reader (10 MB went through a 1 MiB window).
        #expect(writer.suspensions > 0)
        await h.stop()
    }

    @Test func callbackStreamsDeliverEveryMessageOnTheLoop() async throws {
        let h = try Harness()
        final class Seen: Sendable {
            let keys = Mutex<[String]>([])
            let onLoop = Atomic<Int>(0)
            let end = Mutex<GRPCStatus?>(nil)
        }
        let seen = Seen()
        let client = GRPCClient(configuration: ClientConfiguration(target: HostPort(host: "127.0.0.1", port: h.server.port)), group: EventLoopGroup(count: 1))
        _ = client.serverStreaming(path: TestMethods.stream.path, framedRequest: MessageFraming.framed(StateItem(key: "500", value: "100")),
                                   onMessage: { bytes in
                                       if let item = try? StateItem(serializedBytes: bytes) { seen.keys.withLock { $0.append(item.key) } }
                                   }, onEnd: { status in seen.end.withLock { $0 = status } })
        try await eventually("stream ended") { seen.end.withLock { $0 } != nil }
        #expect(seen.end.withLock { $0 }?.code == .ok)
        #expect(seen.keys.withLock { $0 } == (0..<500).map(String.init))
        client.close()
        await h.stop()
    }

    /// The streams of a connection with messages waiting are drained in one hop: only the first
    /// to ask schedules it, and once the loop took them the next ask schedules again. The lists
    /// trade buffers: what the loop hands back empty is filled next.
    @Test func oneHopDrainsEveryStreamThatAsked() {
        let drains = PendingDrains()
        var ids: [Int32] = []
        #expect(drains.add(3) && !drains.add(5) && !drains.add(7))
        drains.take(swappingWith: &ids)
        #expect(ids == [3, 5, 7])
        let capacity = ids.capacity
        ids.removeAll(keepingCapacity: true)
        drains.take(swappingWith: &ids)
        #expect(ids.isEmpty)
        #expect(drains.add(5))
        ids = []
        drains.take(swappingWith: &ids)
        #expect(ids == [5])
        #expect(ids.capacity >= capacity, "the list handed back kept its storage for the next asks")
    }

    /// Many streams of one connection streaming at once, each message of each reaching its client
    /// in order (their writers are drained together).
    @Test func concurrentStreamsOnOneConnectionEachGetEveryMessage() async throws {
        let h = try Harness()
        try await withThrowingTaskGroup(of: [String].self) { g in
            for _ in 0..<50 {
                g.addTask {
                    var keys: [String] = []
                    for try await item in h.client.serverStreaming(TestMethods.stream, StateItem(key: "200", value: "10")) { keys.append(item.key) }
                    return keys
                }
            }
            var n = 0
            while let keys = try await g.next() {
                #expect(keys == (0..<200).map(String.init))
                n += 1
            }
            #expect(n == 50)
        }
        #expect(h.server.connections == 1)
        await h.stop()
    }

    @Test func batchReadsReturnEverythingQueued() async throws {
        let h = try Harness()
        let raw = h.client.serverStreaming(path: TestMethods.stream.path, framedRequest: MessageFraming.framed(StateItem(key: "300", value: "10")))
        // let every message arrive before reading, so the reads take them in batches
        try await eventually("the 300 messages arrived") { raw.queued == (300, true) }
        var total = 0
        var batches = 0
        while let batch = try await raw.nextBatch() {
            total += batch.count
            batches += 1
        }
        #expect(total == 300)
        #expect(batches < 300)
        await h.stop()
    }

    @Test func deadlineExceededEndsTheCallAndCancelsTheHandler() async throws {
        let h = try Harness()
        await expectStatus(.deadlineExceeded) { _ = try await h.client.unary(TestMethods.hangUnary, StateItem(), timeout: .milliseconds(100)) }
        try await eventually("handler cancelled") { h.seen.cancelledHandlers.load(ordering: .relaxed) == 1 }
        await h.stop()
    }

    @Test func serverEnforcesGrpcTimeoutHeader() async throws {
        let h = try Harness()
        // the server's own timer fires even if the client does not enforce the deadline itself
        let t0 = MonotonicClock.now()
        await expectStatus(.deadlineExceeded) { _ = try await h.client.unary(TestMethods.hangUnary, StateItem(), timeout: .milliseconds(50)) }
        #expect(MonotonicClock.now() - t0 < 2_000_000_000)
        await h.stop()
    }

    /// Issue 9: the largest grpc-timeout (99999999H, more nanoseconds than UInt64 holds) wrapped
    /// the deadline into the past: an instant DEADLINE_EXCEEDED. It means "no deadline" in effect.
    @Test func aHugeGrpcTimeoutIsNoDeadlineNotAPastOne() async throws {
        let h = try Harness()
        #expect(GRPCTimeout.parse("99999999H") == .max)
        let item = StateItem(key: "k", value: "v")
        #expect(try await h.client.unary(TestMethods.echo, item, timeout: .seconds(Int64(1) << 60)) == item)
        #expect(try await h.client.unary(TestMethods.inlineEcho, item, timeout: .seconds(Int64(1) << 60)) == item)
        await h.stop()
    }

    /// Issue 9: no SETTINGS_MAX_HEADER_LIST_SIZE, and 32 metadata entries kept per stream whatever
    /// their size (HPACK decodes a few bytes on the wire into kilobytes each).
    @Test func requestHeadersOverTheListSizeAreRefused() async throws {
        let big = String(repeating: "x", count: 20_000)
        let h = try Harness(client: { $0.metadata = [("x-big", big)] })
        let s = await expectStatus(.resourceExhausted) { _ = try await h.client.unary(TestMethods.echo, StateItem(key: "k")) }
        #expect(s?.message.hasPrefix("HEADERS_TOO_LARGE") == true, "\(String(describing: s))")
        await h.stop()
        // within the limit, calls go through
        let ok = try Harness(client: { $0.metadata = [("x-small", String(repeating: "y", count: 8_000))] })
        #expect(try await ok.client.unary(TestMethods.echo, StateItem(key: "k")) == StateItem(key: "k"))
        await ok.stop()
    }

    @Test func clientCancellationResetsTheStreamAndCancelsTheHandler() async throws {
        let h = try Harness()
        let call = h.client.serverStreaming(TestMethods.hang, StateItem(key: "first"))
        let first = try await within(5, "the first message") { () -> StateItem? in
            var it = call.makeAsyncIterator()
            return try await it.next()
        }
        #expect(first?.key == "first")
        call.cancel()
        try await eventually("server handler cancelled") { h.seen.cancelledHandlers.load(ordering: .relaxed) == 1 }
        await expectStatus(.cancelled) {
            _ = try await within(5, "the end of the cancelled call") { () -> StateItem? in
                var it = call.makeAsyncIterator()
                return try await it.next()
            }
        }
        await h.stop()
    }

    @Test func taskCancellationCancelsAUnaryCall() async throws {
        let h = try Harness()
        let task = Task { try await h.client.unary(TestMethods.hangUnary, StateItem()) }
        try await eventually("the handler started") { h.seen.startedHandlers.load(ordering: .relaxed) == 1 }
        task.cancel()
        await expectStatus(.cancelled) { _ = try await task.value }
        try await eventually("server handler cancelled") { h.seen.cancelledHandlers.load(ordering: .relaxed) == 1 }
        await h.stop()
    }

    @Test func oversizedRequestIsResourceExhaustedAndConnectionSurvives() async throws {
        let h = try Harness { $0.maxReceiveMessageSize = 1024 * 1024 }
        let big = StateItem(key: "big", value: String(repeating: "a", count: 1024 * 1024 + 1))
        let s = await expectStatus(.resourceExhausted) { _ = try await h.client.unary(TestMethods.echo, big) }
        #expect(s?.message.hasPrefix("MESSAGE_TOO_LARGE") == true)
        #expect(try await h.client.unary(TestMethods.echo, StateItem(key: "small")).key == "small")
        await h.stop()
    }

    @Test func defaultLimitIs4MiB() async throws {
        let h = try Harness()
        let fits = StateItem(key: "k", value: String(repeating: "a", count: 4 * 1024 * 1024 - 64))
        #expect(try await h.client.unary(TestMethods.echo, fits).value.count == fits.value.count)
        let over = StateItem(key: "k", value: String(repeating: "a", count: 4 * 1024 * 1024))
        await expectStatus(.resourceExhausted) { _ = try await h.client.unary(TestMethods.echo, over) }
        await h.stop()
    }

    @Test func compressedMessageIsUnimplemented() async throws {
        let h = try Harness()
        var framed = MessageDeframer.frame(StateItem(key: "k").serializedBytes())
        framed[0] = 1
        await expectStatus(.unimplemented) { _ = try await h.client.unary(path: TestMethods.echo.path, framedRequest: framed, timeout: nil) }
        await h.stop()
    }

    @Test func thousandConcurrentStreams() async throws {
        let h = try Harness { $0.maxConcurrentUnaryPerConnection = 1000 }
        let n = 1000
        try await withThrowingTaskGroup(of: String.self) { g in
            for i in 0..<n {
                g.addTask { try await h.client.unary(TestMethods.barrier, StateItem(key: String(i), value: String(n)), timeout: .seconds(30)).value }
            }
            for try await seen in g { #expect(seen == String(n)) }
        }
        #expect(h.seen.maxInBarrier.load(ordering: .relaxed) == n)
        await h.stop()
    }

    /// Issue 9: a connection runs at most `maxConcurrentUnaryPerConnection` unary handlers at once;
    /// later requests wait for their turn (they are not refused).
    @Test func unaryHandlersPerConnectionAreCappedAndTheRestWaitTheirTurn() async throws {
        let h = try Harness { $0.maxConcurrentUnaryPerConnection = 8 }
        let n = 40
        try await withThrowingTaskGroup(of: String.self) { g in
            for i in 0..<n {
                g.addTask { try await h.client.unary(TestMethods.gauge, StateItem(key: String(i)), timeout: .seconds(30)).key }
            }
            var answered = 0
            for try await _ in g { answered += 1 }
            #expect(answered == n)
        }
        let most = h.seen.maxInGauge.load(ordering: .relaxed)
        #expect(most <= 8 && most >= 2, "\(most) at once")
        await h.stop()
    }

    @Test func maxConcurrentStreamsIsRespected() async throws {
        // the server allows 8 streams per connection (and would run 64 handlers at once): 40 calls
        // of 20 ms still all succeed (queued by the client), never more than 8 at once
        let h = try Harness {
            $0.http2.maxConcurrentStreams = 8
            $0.maxConcurrentUnaryPerConnection = 64
        }
        try await withThrowingTaskGroup(of: Void.self) { g in
            for i in 0..<40 {
                g.addTask {
                    let answer = try await h.client.unary(TestMethods.gauge, StateItem(key: String(i)))
                    #expect(answer.key == String(i))
                }
            }
            try await g.waitForAll()
        }
        let most = h.seen.maxInGauge.load(ordering: .relaxed)
        #expect(most <= 8 && most >= 2, "\(most) at once")
        await h.stop()
    }

    @Test func gracefulShutdownFinishesCallsInFlight() async throws {
        let h = try Harness()
        let inFlight = Task { try await h.client.unary(TestMethods.slow, StateItem(key: "late", value: "300")) }
        try await eventually("the handler started") { h.seen.startedHandlers.load(ordering: .relaxed) == 1 }
        await h.server.shutdown(gracePeriod: 5_000_000_000)
        #expect(try await inFlight.value.key == "late")
        #expect(h.server.connections == 0)
        await expectStatus(.unavailable) { _ = try await h.client.unary(TestMethods.echo, StateItem()) }
        h.group.shutdown()
    }

    @Test func connectionsOverTheLimitAreClosed() async throws {
        let h = try Harness { $0.maxConnections = 2 }
        let others = (0..<2).map { _ in GRPCClient(target: HostPort(host: "127.0.0.1", port: h.server.port), group: h.group) }
        _ = try await h.client.unary(TestMethods.echo, StateItem())
        _ = try await others[0].unary(TestMethods.echo, StateItem())
        await expectStatus(.unavailable) { _ = try await others[1].unary(TestMethods.echo, StateItem()) }
        #expect(h.server.connections == 2)
        others.forEach { $0.close() }
        await h.stop()
    }

    @Test func aSecondServerCannotTakeTheSamePort() async throws {
        let h = try Harness()
        let other = GRPCServer(configuration: ServerConfiguration(address: HostPort(host: "127.0.0.1", port: h.server.port)),
                               services: ServiceRegistry(), group: h.group)
        #expect(throws: SocketError.self) { try other.start() }
        #expect(try await h.client.unary(TestMethods.echo, StateItem(key: "still mine")).key == "still mine")
        await h.stop()
    }

    @Test func connectionsSpreadOverTheLoops() async throws {
        let h = try Harness()
        let clients = (0..<8).map { _ in GRPCClient(target: HostPort(host: "127.0.0.1", port: h.server.port), group: h.group) }
        for c in clients { _ = try await c.unary(TestMethods.echo, StateItem()) }
        #expect(h.server.connections == 8)
        // handed to the loops in turn: 8 over the harness's loops, evenly
        let perLoop = await h.server.connectionsPerLoop()
        #expect(perLoop.count == h.group.loops.count && perLoop.count > 1)
        #expect(perLoop.allSatisfy { $0 == 8 / perLoop.count }, "\(perLoop)")
        clients.forEach { $0.close() }
        await h.stop()
    }

    @Test func connectionRefusedIsUnavailable() async throws {
        let group = EventLoopGroup(count: 1)
        let fd = try Sockets.listen(on: HostPort(host: "127.0.0.1", port: 0), reusePort: false)
        let port = Sockets.localPort(of: fd)
        close(fd)
        let client = GRPCClient(target: HostPort(host: "127.0.0.1", port: port), group: group)
        await expectStatus(.unavailable) { _ = try await client.unary(TestMethods.echo, StateItem()) }
        group.shutdown()
    }
}
