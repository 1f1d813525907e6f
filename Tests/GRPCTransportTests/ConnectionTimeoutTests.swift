import EventLoop
import Foundation
@testable import GRPCTransport
import Glibc
import PresenceWire
import Testing

/// A raw TCP client for attacks our own client cannot make: frames are written by hand (header
/// fields as HPACK literals without indexing, so no table is needed).
struct RawPeer {
    let fd: Int32

    init(port: UInt16) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard rc == 0 else { throw POSIXError(.ECONNREFUSED) }
        var tv = timeval(tv_sec: 0, tv_usec: 100_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    static func frame(type: UInt8, flags: UInt8, stream: UInt32, _ payload: [UInt8]) -> [UInt8] {
        let n = payload.count
        return [UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff), type, flags,
                UInt8(stream >> 24 & 0x7f), UInt8(stream >> 16 & 0xff), UInt8(stream >> 8 & 0xff), UInt8(stream & 0xff)] + payload
    }

    static func literal(_ name: String, _ value: String) -> [UInt8] {
        [0x00, UInt8(name.utf8.count)] + Array(name.utf8) + [UInt8(value.utf8.count)] + Array(value.utf8)
    }

    func send(_ bytes: [UInt8]) { _ = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }  // (no SIGPIPE once the server has cut it off)

    /// The client preface and an empty SETTINGS frame.
    func handshake() { send(Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + Self.frame(type: 4, flags: 0, stream: 0, [])) }

    /// The header block of a gRPC request for `path` (HPACK literals).
    static func requestHeaders(path: String) -> [UInt8] {
        literal(":method", "POST") + literal(":scheme", "http") + literal(":path", path)
            + literal(":authority", "localhost") + literal("content-type", "application/grpc") + literal("te", "trailers")
    }

    /// Request headers for `path` on stream 1, without END_STREAM (the body is still to come).
    func openRequest(path: String) {
        send(Self.frame(type: 1, flags: 0x4, stream: 1, Self.requestHeaders(path: path)))  // HEADERS, END_HEADERS
    }

    /// Reads frames until `deadline`; returns (type, flags, stream) of each, and whether the
    /// server closed the connection.
    /// `onFrame` is told each frame's type, stream and payload length as it is read.
    func readFrames(until deadline: UInt64, stopWhen done: ([(UInt8, UInt8, UInt32)]) -> Bool = { _ in false },
                    onFrame: ((UInt8, UInt32, Int) -> Void)? = nil) -> (frames: [(UInt8, UInt8, UInt32)], closed: Bool) {
        var buffer: [UInt8] = []
        var frames: [(UInt8, UInt8, UInt32)] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while MonotonicClock.now() < deadline {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n == 0 { return (frames, true) }
            if n < 0 { continue }  // (the receive timeout: look at the clock again)
            buffer += chunk[0..<n]
            while buffer.count >= 9 {
                let len = Int(buffer[0]) << 16 | Int(buffer[1]) << 8 | Int(buffer[2])
                guard buffer.count >= 9 + len else { break }
                let stream = UInt32(buffer[5] & 0x7f) << 24 | UInt32(buffer[6]) << 16 | UInt32(buffer[7]) << 8 | UInt32(buffer[8])
                frames.append((buffer[3], buffer[4], stream))
                onFrame?(buffer[3], stream, len)
                buffer.removeFirst(9 + len)
            }
            if done(frames) { return (frames, false) }
        }
        return (frames, false)
    }

    /// The entries of the server's first SETTINGS frame (not an acknowledgement), by identifier;
    /// nil if none came before `deadline`.
    func readSettings(until deadline: UInt64) -> [UInt16: UInt32]? {
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while MonotonicClock.now() < deadline {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n == 0 { return nil }
            if n < 0 { continue }
            buffer += chunk[0..<n]
            while buffer.count >= 9 {
                let len = Int(buffer[0]) << 16 | Int(buffer[1]) << 8 | Int(buffer[2])
                guard buffer.count >= 9 + len else { break }
                if buffer[3] == 4, buffer[4] & 0x1 == 0 {
                    var entries: [UInt16: UInt32] = [:]
                    for at in stride(from: 9, to: 9 + len - 5, by: 6) {
                        let id = UInt16(buffer[at]) << 8 | UInt16(buffer[at + 1])
                        entries[id] = buffer[(at + 2)..<(at + 6)].reduce(0) { $0 << 8 | UInt32($1) }
                    }
                    return entries
                }
                buffer.removeFirst(9 + len)
            }
        }
        return nil
    }

    /// A whole unary request on `stream`: headers, then one gRPC message and END_STREAM.
    func request(stream: UInt32, path: String, message: [UInt8], headers: [(String, String)] = []) {
        var block = Self.requestHeaders(path: path)
        for (name, value) in headers { block += Self.literal(name, value) }
        send(Self.frame(type: 1, flags: 0x4, stream: stream, block) + Self.frame(type: 0, flags: 0x1, stream: stream, Self.framed(message)))
    }

    /// `message` behind its 5-byte gRPC header.
    static func framed(_ message: [UInt8]) -> [UInt8] {
        let n = message.count
        return [0, UInt8(n >> 24 & 0xff), UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)] + message
    }

    /// A DATA frame on `stream` holding `messages` (each behind its 5-byte gRPC header).
    func data(stream: UInt32, _ messages: [[UInt8]], end: Bool) {
        var payload: [UInt8] = []
        for m in messages { payload += Self.framed(m) }
        send(Self.frame(type: 0, flags: end ? 0x1 : 0, stream: stream, payload))
    }

    func close() { Glibc.close(fd) }

    /// A whole unary request on `stream`, then the frames read until the server ended it (or 3 s
    /// passed); whether it was ended, and whether the server closed or sent GOAWAY meanwhile.
    func call(stream: UInt32, path: String, message: [UInt8]) -> (ended: Bool, closed: Bool) {
        request(stream: stream, path: path, message: message)
        let ended = Self.ended(stream: stream)
        let (frames, closed) = readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: ended)
        return (ended(frames), closed || frames.contains { $0.0 == 7 })
    }

    /// Whether frames read (`readFrames`) hold a HEADERS frame with END_STREAM on `stream`: the
    /// server ended it (its trailers).
    static func ended(stream: UInt32) -> ([(UInt8, UInt8, UInt32)]) -> Bool {
        { fs in fs.contains { $0.0 == 1 && $0.1 & 0x1 != 0 && $0.2 == stream } }
    }
}

@Suite(.serialized) struct ConnectionTimeoutTests {
    /// The server enforces a request's `grpc-timeout` itself: a client that never resets the stream
    /// (as this raw peer) still gets the call ended, and the handler is cancelled.
    @Test func theServerEndsACallAtItsGrpcTimeoutEvenIfTheClientWaits() async throws {
        let h = try Harness()
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        let t0 = MonotonicClock.now()
        peer.request(stream: 1, path: TestMethods.hangUnary.path, message: StateItem().serializedBytes(prefix: 0),
                     headers: [("grpc-timeout", "200m")])
        let ended = RawPeer.ended(stream: 1)
        let (frames, _) = peer.readFrames(until: MonotonicClock.now() + 5_000_000_000, stopWhen: ended)
        #expect(ended(frames), "the server did not end the call: \(frames)")
        #expect(MonotonicClock.now() - t0 >= 190_000_000)   // at its deadline, not before
        try await eventually("the handler cancelled") { h.seen.cancelledHandlers.load(ordering: .relaxed) == 1 }
        peer.close()
        await h.stop()
    }

    /// Issue 9: nothing closed a connection that never sent the HTTP/2 preface.
    @Test func aConnectionWithoutAHandshakeIsClosed() async throws {
        let h = try Harness { $0.handshakeTimeout = 200_000_000 }
        let peer = try RawPeer(port: h.server.port)
        let t0 = MonotonicClock.now()
        let (_, closed) = peer.readFrames(until: t0 + 3_000_000_000)
        let took = MonotonicClock.now() - t0
        #expect(closed && took >= 150_000_000, "closed \(closed) after \(took / 1_000_000) ms")
        peer.close()
        await h.stop()
    }

    /// A bidirectional call (reflection): messages reach the handler as they come, each answer
    /// goes out, and the half-close ends the handler's loop.
    @Test func aBidirectionalCallAnswersEachMessageAndEndsAtTheHalfClose() async throws {
        let h = try Harness()
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        peer.openRequest(path: TestMethods.bidiEcho.path)
        let item = StateItem(key: "k", value: "v").serializedBytes(prefix: 0)
        peer.data(stream: 1, [item], end: false)
        // the first answer comes before the client sends anything more
        let dataOn1 = { (fs: [(UInt8, UInt8, UInt32)]) in fs.contains { $0.0 == 0 && $0.2 == 1 } }
        let (first, _) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: dataOn1)
        #expect(dataOn1(first))
        peer.data(stream: 1, [item, item], end: true)
        let ended = RawPeer.ended(stream: 1)
        let (rest, _) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: ended)
        #expect(ended(rest))
        peer.close()
        await h.stop()
    }

    /// Nor by size: past a megabyte unread (beyond one message) the call is refused too.
    @Test func aBidirectionalCallIsBoundedInBytesToo() async throws {
        let h = try Harness()
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        peer.send(RawPeer.frame(type: 4, flags: 0x1, stream: 0, []))   // SETTINGS ACK: the server's 1 MiB stream window holds
        peer.openRequest(path: TestMethods.bidiDeaf.path)
        let big = StateItem(key: "k", value: String(repeating: "v", count: 500_000)).serializedBytes(prefix: 0)
        let one = RawPeer.framed(big)
        // four messages of 500 KB, in 16 KiB frames, pausing for the server's window updates (the
        // stream's window is 1 MiB; this peer does not count them)
        for _ in 0..<4 {
            var offset = 0
            while offset < one.count {
                let k = min(16_384, one.count - offset)
                peer.send(RawPeer.frame(type: 0, flags: 0, stream: 1, Array(one[offset..<(offset + k)])))
                offset += k
            }
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        let ended = RawPeer.ended(stream: 1)
        let (frames, _) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: ended)
        #expect(ended(frames), "the call was not ended: \(frames)")
        peer.close()
        await h.stop()
    }

    /// A request stream that ends inside a message is an error, not a clean half-close.
    @Test func aBidirectionalCallThatEndsInsideAMessageFails() async throws {
        let h = try Harness()
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        peer.openRequest(path: TestMethods.bidiEcho.path)
        peer.send(RawPeer.frame(type: 0, flags: 0x1, stream: 1, [0, 0, 0, 0, 9, 1, 2]))   // 2 of 9 bytes, END_STREAM
        let ended = RawPeer.ended(stream: 1)
        let (frames, _) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: ended)
        // ended by trailers alone (no answer message, no "count" the handler would send at a clean end)
        #expect(ended(frames) && !frames.contains { $0.0 == 0 && $0.2 == 1 }, "\(frames)")
        peer.close()
        await h.stop()
    }

    /// A client cannot queue requests without bound for a handler that does not read them.
    @Test func aBidirectionalCallWhoseHandlerDoesNotReadIsRefusedPastItsQueue() async throws {
        let h = try Harness()
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        peer.openRequest(path: TestMethods.bidiDeaf.path)
        let item = StateItem(key: "k", value: "v").serializedBytes(prefix: 0)
        peer.data(stream: 1, Array(repeating: item, count: RequestMessages.defaultLimit + 1), end: false)
        let ended = RawPeer.ended(stream: 1)
        let (frames, _) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: ended)
        #expect(ended(frames), "the call was not ended: \(frames)")
        try await eventually("the handler was cancelled") { h.seen.cancelledHandlers.load(ordering: .relaxed) == 1 }
        peer.close()
        await h.stop()
    }

    /// Issue 9: a request whose message never arrives held its stream (and handler slot) forever.
    @Test func aRequestWhoseMessageNeverArrivesEnds() async throws {
        let h = try Harness { $0.requestTimeout = 200_000_000 }
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        peer.openRequest(path: TestMethods.echo.path)
        let ended = RawPeer.ended(stream: 1)
        let t0 = MonotonicClock.now()
        let (frames, _) = peer.readFrames(until: t0 + 3_000_000_000, stopWhen: ended)
        // the server answered stream 1 and ended it (trailers with END_STREAM), unasked
        #expect(ended(frames) && MonotonicClock.now() - t0 >= 150_000_000, "\(frames)")
        peer.close()
        await h.stop()
    }

    /// A request's timer is armed only when a read ends without its message: a message that
    /// comes in a later read, within the timeout, is answered (and the timer then does nothing).
    @Test func aRequestWhoseMessageComesInALaterReadIsServed() async throws {
        let h = try Harness { $0.requestTimeout = 400_000_000 }
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        peer.openRequest(path: TestMethods.echo.path)
        // (the headers alone, then the message in a read of its own)
        let (early, _) = peer.readFrames(until: MonotonicClock.now() + 100_000_000)
        #expect(!early.contains { $0.2 == 1 }, "answered before its message: \(early)")
        peer.data(stream: 1, [[0x0a, 2, UInt8(ascii: "o"), UInt8(ascii: "k")]], end: true)
        let ended = RawPeer.ended(stream: 1)
        let (frames, closed) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000, stopWhen: ended)
        // answered with a message (DATA) before its trailers: not ended by the timer
        #expect(ended(frames) && frames.contains { $0.0 == 0 && $0.2 == 1 } && !closed, "\(frames)")
        // past the timeout, the connection still serves
        let (later, closedLater) = peer.readFrames(until: MonotonicClock.now() + 500_000_000)
        #expect(!later.contains { $0.2 == 1 } && !closedLater, "\(later)")
        peer.close()
        await h.stop()
    }

    /// Requests waiting for a handler slot are started as slots free up; a handler that answers at
    /// once (it never waits) frees its slot while the next one is being started. A queue of a
    /// thousand, one slot: every request is answered with its message.
    @Test func aLongQueueOfRequestsThatAnswerAtOnceIsServedThroughOneSlot() async throws {
        let h = try Harness { $0.maxConcurrentUnaryPerConnection = 1 }
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        let count = 1000
        for i in 0..<count { peer.request(stream: UInt32(2 * i + 1), path: TestMethods.echo.path, message: [0x0a, 1, UInt8(ascii: "k")]) }
        let endedCount = { (fs: [(UInt8, UInt8, UInt32)]) in Set(fs.filter { $0.0 == 1 && $0.1 & 0x1 != 0 }.map(\.2)).count }
        let (frames, closed) = peer.readFrames(until: MonotonicClock.now() + 10_000_000_000, stopWhen: { endedCount($0) == count })
        // every stream answered with its message (DATA) and ended with trailers
        #expect(!closed && endedCount(frames) == count && Set(frames.filter { $0.0 == 0 }.map(\.2)).count == count)
        peer.close()
        await h.stop()
    }

    /// Issue 9: with SETTINGS_INITIAL_WINDOW_SIZE = 0 a client takes no response byte, and the
    /// server queued every response whole (megabytes pinned for a few bytes per request).
    @Test func aClientThatDoesNotReadIsCutOffAtTheConnectionsBudget() async throws {
        let h = try Harness { $0.maxQueuedBytesPerConnection = 64 * 1024 }
        let peer = try RawPeer(port: h.server.port)
        // preface, SETTINGS_INITIAL_WINDOW_SIZE = 0
        peer.send(Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + RawPeer.frame(type: 4, flags: 0, stream: 0, [0x00, 0x04, 0, 0, 0, 0]))
        // StateItem { key: "k", value: 10,000 x "v" }: each echo answers 10 kB the client never takes
        let value = [UInt8](repeating: UInt8(ascii: "v"), count: 10_000)
        let message: [UInt8] = [0x0a, 1, UInt8(ascii: "k"), 0x12, 0x90, 0x4e] + value
        for i in 0..<20 { peer.request(stream: UInt32(2 * i + 1), path: TestMethods.echo.path, message: message) }
        let (frames, closed) = peer.readFrames(until: MonotonicClock.now() + 3_000_000_000)
        #expect(closed && frames.contains { $0.0 == 7 }, "\(frames)")  // GOAWAY, then closed
        peer.close()
        // everyone else is served as before
        #expect(try await h.client.unary(TestMethods.echo, StateItem(key: "ok")) == StateItem(key: "ok"))
        await h.stop()
    }

    /// Issue 9: no cap on connections from one address.
    @Test func connectionsFromOneAddressAreCapped() async throws {
        let h = try Harness { $0.maxConnectionsPerAddress = 3 }
        var peers = try (0..<3).map { _ in try RawPeer(port: h.server.port) }
        for p in peers { p.handshake() }
        try await eventually("three served") { h.server.connections == 3 }
        let fourth = try RawPeer(port: h.server.port)
        #expect(fourth.readFrames(until: MonotonicClock.now() + 2_000_000_000, stopWhen: { _ in false }).closed)
        fourth.close()
        #expect(h.server.connections == 3)
        // one closes: another may come
        peers.removeFirst().close()
        try await eventually("one fewer") { h.server.connections == 2 }
        let again = try RawPeer(port: h.server.port)
        again.handshake()
        try await eventually("served again") { h.server.connections == 3 }
        again.close()
        for p in peers { p.close() }
        await h.stop()
    }

    /// Issue 9: an idle connection (no stream) was kept for good, answering pings.
    @Test func aConnectionIdleForTooLongIsClosedWithGoAway() async throws {
        let h = try Harness { $0.idleTimeout = 300_000_000 }
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        let t0 = MonotonicClock.now()
        let (frames, closed) = peer.readFrames(until: t0 + 3_000_000_000)
        #expect(closed && frames.contains { $0.0 == 7 }, "\(frames)")  // GOAWAY
        #expect(MonotonicClock.now() - t0 >= 250_000_000)
        peer.close()
        // a client that keeps using its connection is not idle
        #expect(try await h.client.unary(TestMethods.echo, StateItem(key: "still here")) == StateItem(key: "still here"))
        await h.stop()
    }

    /// A connection whose calls come and go one at a time keeps one idle timer: arming one per
    /// call kept each in the loop's heap for the whole timeout (minutes), ~17 bytes and a heap
    /// insertion per call, 18 million timers at 60,000 calls/s.
    @Test func callsThatComeAndGoLeaveOneIdleTimer() async throws {
        let h = try Harness()  // (the default idle timeout: minutes)
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        func armed() async -> Int {
            var n = 0
            for loop in h.group.loops {
                n += await withCheckedContinuation { c in
                    if !loop.execute({ c.resume(returning: loop.armedTimerCount) }) { c.resume(returning: 0) }
                }
            }
            return n
        }
        var stream: UInt32 = 1
        func call() -> Bool {
            defer { stream += 2 }
            return peer.call(stream: stream, path: TestMethods.echo.path, message: StateItem(key: "k").serializedBytes(prefix: 0)).ended
        }
        #expect(call())
        let before = await armed()
        for _ in 0..<200 { #expect(call()) }
        let after = await armed()
        #expect(after <= before + 2, "\(after - before) more timers armed after 200 calls")
        peer.close()
        await h.stop()
    }

    /// The idle timeout counts from the end of the last call: calls that come and go more often
    /// than the timeout keep the connection, and so does one call that runs longer than it (the
    /// connection has one idle timer, re-armed for the rest of each idle spell, not one per call).
    @Test func aConnectionIsClosedOnlyAfterAWholeIdleTimeoutWithNoCall() async throws {
        let h = try Harness { $0.idleTimeout = 300_000_000 }
        let peer = try RawPeer(port: h.server.port)
        peer.handshake()
        let t0 = MonotonicClock.now()
        var stream: UInt32 = 1
        func call(_ method: String, _ value: String) -> Bool {
            defer { stream += 2 }
            let answer = peer.call(stream: stream, path: method, message: StateItem(key: "k", value: value).serializedBytes(prefix: 0))
            return answer.ended && !answer.closed
        }
        // calls every 100 ms for 700 ms: more than two timeouts, never idle for one
        while MonotonicClock.now() - t0 < 700_000_000 {
            #expect(call(TestMethods.echo.path, "v"), "closed while calls came and went")
            usleep(100_000)
        }
        // one call longer than the timeout
        #expect(call(TestMethods.slow.path, "500"), "closed under a call in progress")
        let lastEnded = MonotonicClock.now()
        let (frames, closed) = peer.readFrames(until: lastEnded + 3_000_000_000)
        #expect(closed && frames.contains { $0.0 == 7 }, "\(frames)")  // GOAWAY
        #expect(MonotonicClock.now() - lastEnded >= 250_000_000)
        peer.close()
        await h.stop()
    }
}
