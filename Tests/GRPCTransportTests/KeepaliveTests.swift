import CSystemShim
import EventLoop
import Foundation
@testable import GRPCTransport
import PresenceWire
import Testing

@Suite struct KeepaliveStateMachineTests {
    let s: UInt64 = 1_000_000_000

    @Test func pingsAfterIdleIntervalAndClosesWithoutAnswer() {
        var k = KeepaliveStateMachine(interval: 10 * s, timeout: 2 * s, now: 0)
        #expect(k.nextDeadline == 10 * s)
        #expect(k.timerFired(now: 9 * s) == .none)
        #expect(k.timerFired(now: 10 * s) == .sendPing)
        #expect(k.nextDeadline == 12 * s)
        #expect(k.timerFired(now: 11 * s) == .none)
        #expect(k.timerFired(now: 12 * s) == .closeConnection)
    }

    @Test func anyBytesReadCountAsLife() {
        var k = KeepaliveStateMachine(interval: 10 * s, timeout: 2 * s, now: 0)
        k.bytesRead(now: 5 * s)
        #expect(k.timerFired(now: 10 * s) == .none)
        #expect(k.nextDeadline == 15 * s)
        #expect(k.timerFired(now: 15 * s) == .sendPing)
        k.bytesRead(now: 16 * s) // the ACK
        #expect(k.timerFired(now: 17 * s) == .none)
        #expect(k.nextDeadline == 26 * s)
    }
}

@Suite(.serialized) struct DeadPeerTests {
    /// A raw TCP peer that sends the HTTP/2 preface and SETTINGS, then never reads or answers.
    @Test func serverDropsAPeerThatStopsAnsweringPings() async throws {
        let h = try Harness {
            $0.http2.keepaliveInterval = 100_000_000
            $0.http2.keepaliveTimeout = 200_000_000
        }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = h.server.port.bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        #expect(rc == 0)
        let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [0, 0, 0, 4, 0, 0, 0, 0, 0] // empty SETTINGS
        // timed from before the server could have read anything (a slow run may notice the accept late)
        let t0 = MonotonicClock.now()
        _ = preface.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        // (counted as accepted, not as open: on a slow run it may already be closed when polled)
        try await eventually("server accepted") { h.server.acceptedConnections == 1 }
        try await eventually("server closed the silent connection", within: 3) { h.server.connections == 0 }
        let elapsed = MonotonicClock.now() - t0
        #expect(elapsed >= 250_000_000) // interval + timeout, not sooner
        close(fd)
        await h.stop()
    }

    /// Found by Cluster/chaos (netns, a partition healed while a peer's connect was waiting for
    /// the kernel's SYN retransmission: its probes queued behind it for seconds and a healthy
    /// node was declared dead again). A listener whose backlog is full drops SYNs the same way.
    @Test func aConnectThatGetsNoAnswerFailsAtTheConnectTimeoutAndTheNextCallStartsAfresh() async throws {
        let group = EventLoopGroup(count: 1)
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, len) } }
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &len) } }
        #expect(listen(listener, 0) == 0)
        // fill the accept queue (never accepted): the kernel now drops every further SYN
        var fillers: [Int32] = []
        for _ in 0..<3 {
            let f = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(f, $0, len) } }
            fillers.append(f)
        }
        var config = ClientConfiguration(target: HostPort(host: "127.0.0.1", port: UInt16(bigEndian: addr.sin_port)))
        config.connectTimeout = 200_000_000
        let client = GRPCClient(configuration: config, group: group)
        for attempt in 0..<2 {
            // (a call deadline far beyond the connect timeout: the failure must be the connect's)
            let s = await expectStatus(.unavailable) { _ = try await client.unary(TestMethods.echo, StateItem(), timeout: .seconds(30)) }
            #expect(s?.message.contains("CONNECT_FAILED") == true, "attempt \(attempt): \(String(describing: s))")
        }
        for f in fillers { close(f) }
        close(listener)
        group.shutdown()
    }

    /// A "server" that accepts and then says nothing: the client's keepalive gives up on it.
    @Test func clientFailsCallsOnADeadServer() async throws {
        let group = EventLoopGroup(count: 1)
        let listener = try Sockets.listen(on: HostPort(host: "127.0.0.1", port: 0), reusePort: false)
        var config = ClientConfiguration(target: HostPort(host: "127.0.0.1", port: Sockets.localPort(of: listener)))
        config.http2.keepaliveInterval = 100_000_000
        config.http2.keepaliveTimeout = 200_000_000
        let client = GRPCClient(configuration: config, group: group)
        let t0 = MonotonicClock.now()
        let s = await expectStatus(.unavailable) { _ = try await client.unary(TestMethods.echo, StateItem()) }
        #expect(s?.message.contains("keepalive") == true)
        #expect(MonotonicClock.now() - t0 < 3_000_000_000)
        close(listener)
        group.shutdown()
    }
}

@Suite struct IdleBufferStateMachineTests {
    let s: UInt64 = 1_000_000_000

    @Test func releasesOnceQuietForThePeriodAndArmsOneTimerAtATime() {
        var m = IdleBufferStateMachine(quietPeriod: 2 * s)
        #expect(m.sent(now: 1 * s) == 3 * s)
        #expect(m.sent(now: 2 * s) == nil)           // (a timer is armed already)
        #expect(m.timerFired(now: 3 * s) == .rearm(at: 4 * s))
        #expect(m.timerFired(now: 4 * s) == .release)
        #expect(m.timerFired(now: 9 * s) == .none)   // nothing held any more
    }

    @Test func sendingAgainAfterAReleaseArmsAgain() {
        var m = IdleBufferStateMachine(quietPeriod: 2 * s)
        #expect(m.sent(now: 0) == 2 * s)
        #expect(m.timerFired(now: 2 * s) == .release)
        #expect(m.sent(now: 10 * s) == 12 * s)
        #expect(m.timerFired(now: 12 * s) == .release)
    }

    @Test func aDeferredReleaseWaitsForTheNextSend() {
        var m = IdleBufferStateMachine(quietPeriod: 2 * s)
        #expect(m.sent(now: 0) == 2 * s)
        #expect(m.timerFired(now: 2 * s) == .release)
        m.releaseDeferred()                          // (the connection still had bytes to send)
        #expect(m.sent(now: 3 * s) == 5 * s)
        #expect(m.timerFired(now: 5 * s) == .release)
    }
}

@Suite(.serialized) struct IdleBufferReleaseTests {
    /// A connection quiet for the period gives its frame buffer back, and calls after it work.
    @Test func aQuietConnectionGivesItsFrameBufferBackAndStillWorks() async throws {
        let h = try Harness {
            $0.http2.releaseIdleBuffersAfter = 50_000_000
        }
        let first = try await h.client.unary(TestMethods.echo, StateItem(key: "a", value: "1"))
        #expect(first.value == "1")
        if cshim_pages_enabled() != 0 {
            try await eventually("the server released the connection's frame buffer") { h.server.releasedIdleBufferBytes >= 16384 }
        } else {
            #expect(h.server.releasedIdleBufferBytes == 0)   // (under ASan the allocator steps aside)
        }
        for i in 0..<3 {
            let again = try await h.client.unary(TestMethods.echo, StateItem(key: "b", value: String(i)))
            #expect(again == StateItem(key: "b", value: String(i)))
        }
        await h.stop()
    }
}
