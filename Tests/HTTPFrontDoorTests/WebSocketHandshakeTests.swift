import HTTPFrontDoor
import Testing

@Suite struct WebSocketHandshakeTests {
    private func upgrade(_ extra: [(String, String)] = [], drop: String? = nil) -> HTTPRequest {
        var headers: [(name: String, value: String)] = [("host", "x"), ("connection", "keep-alive, Upgrade"), ("upgrade", "websocket"),
                                                        ("sec-websocket-version", "13"), ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")]
        headers.removeAll { $0.name == drop }
        for (n, v) in extra { headers.removeAll { $0.name == n }; headers.append((n, v)) }
        return HTTPRequest(method: "GET", target: "/v1/ws", headers: headers, isUpgrade: true)
    }

    @Test func theAcceptValueIsRFC6455s() throws {
        // RFC 6455, section 1.3: this key gives this accept value
        #expect(WebSocketHandshake.acceptValue(for: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        let r = try WebSocketHandshake.accept(upgrade()).get()
        #expect(r.status == 101)
        #expect(r.headers.contains { $0.name == "sec-websocket-accept" && $0.value == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" })
        #expect(r.serialized(close: false).count > 0 && !String(decoding: r.serialized(close: false), as: UTF8.self).contains("content-length"))
    }

    @Test func anythingElseIsRefused() {
        func status(_ r: HTTPRequest) -> Int? {
            if case .failure(let e) = WebSocketHandshake.accept(r) { return e.response.status }
            return nil
        }
        #expect(status(upgrade([("sec-websocket-version", "8")])) == 426)
        #expect(status(upgrade(drop: "upgrade")) == 426)
        #expect(status(upgrade(drop: "sec-websocket-key")) == 400)
        #expect(status(upgrade([("sec-websocket-key", "short")])) == 400)
        var post = upgrade()
        post.method = "POST"
        #expect(status(post) == 405)
        var plain = upgrade()
        plain.isUpgrade = false
        #expect(status(plain) == 426)
    }
}
