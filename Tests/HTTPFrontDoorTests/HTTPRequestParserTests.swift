import HTTPFrontDoor
import Testing

@Suite struct HTTPRequestParserTests {
    private func parse(_ text: String, limits: HTTPLimits = HTTPLimits()) -> (HTTPRequestParser.Outcome, HTTPRequest?, HTTPRequestParser) {
        let p = HTTPRequestParser(limits: limits)
        let bytes = Array(text.utf8)
        let outcome = bytes.withUnsafeBytes { p.parse($0) }
        return (outcome, p.takeRequest(), p)
    }

    @Test func aGetWithHeaders() throws {
        let text = "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept:  text/plain \r\n\r\n"
        let (outcome, request, _) = parse(text)
        #expect(outcome == .request(consumed: text.utf8.count))
        let r = try #require(request)
        #expect(r.method == "GET" && r.target == "/metrics?x=1" && r.path == "/metrics")
        #expect(r.header("HOST") == "a" && r.header("accept") == "text/plain")
        #expect(r.keepAlive && !r.isUpgrade && r.body.isEmpty)
    }

    @Test func pipelinedRequestsComeOneAtATime() throws {
        let first = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n", second = "GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        let p = HTTPRequestParser()
        var bytes = Array((first + second).utf8)
        var outcome = bytes.withUnsafeBytes { p.parse($0) }
        #expect(outcome == .request(consumed: first.utf8.count))
        #expect(p.takeRequest()?.path == "/a")
        bytes.removeFirst(first.utf8.count)
        outcome = bytes.withUnsafeBytes { p.parse($0) }
        #expect(outcome == .request(consumed: second.utf8.count))
        let b = try #require(p.takeRequest())
        #expect(b.path == "/b" && !b.keepAlive)
    }

    @Test func aRequestSplitAnywhereIsReadWhole() throws {
        let text = "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        let bytes = Array(text.utf8)
        for cut in 1..<bytes.count {
            let p = HTTPRequestParser()
            #expect(bytes[..<cut].withUnsafeBytes { p.parse($0) } == .needMore)
            #expect(bytes[cut...].withUnsafeBytes { p.parse($0) } == .request(consumed: bytes.count - cut))
            #expect(p.takeRequest()?.body == Array("hello".utf8))
        }
    }

    @Test func chunkedTrailersDoNotLeakIntoTheNextRequest() throws {
        let first = "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Evil: 1\r\n\r\n"
        let second = "GET /b HTTP/1.1\r\nHost: x\r\n\r\n"
        let p = HTTPRequestParser()
        var bytes = Array((first + second).utf8)
        guard case .request(let used) = bytes.withUnsafeBytes({ p.parse($0) }) else { Issue.record("no first request"); return }
        #expect(p.takeRequest()?.body == Array("abc".utf8))
        bytes.removeFirst(used)
        guard case .request = bytes.withUnsafeBytes({ p.parse($0) }) else { Issue.record("no second request"); return }
        let b = try #require(p.takeRequest())
        #expect(b.path == "/b" && b.headers.map(\.name) == ["host"])
    }

    @Test func http10ClosesUnlessKeptAlive() {
        #expect(parse("GET / HTTP/1.0\r\n\r\n").1?.keepAlive == false)
        #expect(parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").1?.keepAlive == true)
    }

    @Test func anUpgradeLeavesTheNewProtocolsBytes() throws {
        let head = "GET /v1/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n"
        let (outcome, request, _) = parse(head + "\u{81}\u{05}")
        #expect(outcome == .request(consumed: head.utf8.count))
        let r = try #require(request)
        #expect(r.isUpgrade && r.headerLists("connection", "upgrade") && r.headerLists("Upgrade", "WebSocket"))
    }

    @Test func headersOverTheLimitAre431() {
        var limits = HTTPLimits()
        limits.maxHeaderBytes = 100
        let (outcome, request, _) = parse("GET / HTTP/1.1\r\nX: " + String(repeating: "a", count: 200) + "\r\n\r\n", limits: limits)
        guard case .failed(431, _) = outcome else { Issue.record("got \(outcome)"); return }
        #expect(request == nil)
    }

    @Test func tooManyHeadersAre431() {
        var limits = HTTPLimits()
        limits.maxHeaders = 3
        let text = "GET / HTTP/1.1\r\n" + (0..<4).map { "H\($0): v\r\n" }.joined() + "\r\n"
        guard case .failed(431, _) = parse(text, limits: limits).0 else { Issue.record("not refused"); return }
        let three = "GET / HTTP/1.1\r\n" + (0..<3).map { "H\($0): v\r\n" }.joined() + "\r\n"
        #expect(parse(three, limits: limits).1?.headers.count == 3)
    }

    @Test func aBodyOverTheLimitIs413WhetherAnnouncedOrChunked() {
        var limits = HTTPLimits()
        limits.maxBodyBytes = 4
        guard case .failed(413, _) = parse("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", limits: limits).0 else { Issue.record("announced body taken"); return }
        guard case .failed(413, _) = parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n", limits: limits).0 else {
            Issue.record("chunked body taken"); return
        }
        #expect(parse("POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd", limits: limits).1?.body.count == 4)
    }

    @Test func garbageIs400() {
        guard case .failed(505, _) = parse("GET / HTTP/9.9\r\n\r\n").0 else { Issue.record("HTTP/9.9 was served"); return }
        for text in ["HELLO\r\n\r\n", "GET / HTTP/1.1\r\nBad Header\r\n\r\n", "\u{0}\u{1}\u{2}"] {
            guard case .failed(400, _) = parse(text).0 else { Issue.record("\(text.debugDescription) was not refused"); continue }
        }
    }
}

@Suite struct HTTPConnectionTimerTests {
    let timeouts: HTTPConnectionTimer.Timeouts = {
        var t = HTTPConnectionTimer.Timeouts()
        t.handshake = 10
        t.request = 30
        t.idle = 60
        return t
    }()

    @Test func aSilentNewConnectionIsClosedAtTheHandshakeTimeout() {
        let t = HTTPConnectionTimer(timeouts: timeouts, now: 100)
        #expect(t.deadline == 110)
        #expect(t.expired(now: 109) == nil)
        #expect(t.expired(now: 110) == .close)
    }

    @Test func aFirstRequestThatTricklesGets408AtTheHandshakeDeadline() {
        var t = HTTPConnectionTimer(timeouts: timeouts, now: 100)
        t.bytesArrived(now: 105)
        #expect(t.deadline == 110)
        #expect(t.expired(now: 110) == .requestTimeout)
    }

    @Test func noDeadlineWhileAnswering_thenIdle_thenTheNextRequestsOwn() {
        var t = HTTPConnectionTimer(timeouts: timeouts, now: 100)
        t.bytesArrived(now: 101)
        t.requestComplete()
        #expect(t.deadline == nil && t.expired(now: 1_000_000) == nil)
        t.answered(now: 200)
        #expect(t.deadline == 260 && t.expired(now: 260) == .close)
        t.bytesArrived(now: 250)
        #expect(t.deadline == 280)
        t.bytesArrived(now: 270)   // (more of the same request does not extend it)
        #expect(t.deadline == 280 && t.expired(now: 280) == .requestTimeout)
    }
}
