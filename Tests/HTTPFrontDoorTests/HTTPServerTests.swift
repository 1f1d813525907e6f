import Dispatch
import EventLoop
import Glibc
import HTTPFrontDoor
import Testing

/// A blocking HTTP/1.1 client on a raw socket: sends bytes, reads what comes back until a
/// deadline or the server closes.
struct RawHTTPClient {
    let fd: Int32

    init(port: UInt16) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard rc == 0 else { throw SocketError("connect") }
        var tv = timeval(tv_sec: 0, tv_usec: 50_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    func send(_ text: String) { _ = Array(text.utf8).withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }

    /// `read`, on a thread of its own: blocking reads on the cooperative pool (two threads on this
    /// machine) could starve the server's own tasks, which answer the requests read here.
    func read(for seconds: Double = 5, until done: @escaping @Sendable (String) -> Bool = { _ in false }) async -> (text: String, closed: Bool) {
        let fd = self.fd
        return await withCheckedContinuation { c in
            DispatchQueue.global().async { c.resume(returning: RawHTTPClient(fd: fd).blockingRead(for: seconds, until: done)) }
        }
    }

    init(fd: Int32) { self.fd = fd }

    /// What arrived until `seconds` passed, `done` said enough, or the server closed.
    func blockingRead(for seconds: Double, until done: (String) -> Bool) -> (text: String, closed: Bool) {
        let deadline = MonotonicClock.now() + UInt64(seconds * 1e9)
        var got: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while MonotonicClock.now() < deadline {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n == 0 { return (String(decoding: got, as: UTF8.self), true) }
            if n < 0 { continue }
            got += chunk[0..<n]
            if done(String(decoding: got, as: UTF8.self)) { break }
        }
        return (String(decoding: got, as: UTF8.self), false)
    }

    /// Reads until `count` whole answers (by their content-length) are in.
    func answers(_ count: Int, within seconds: Double = 5) async -> [String] {
        let (text, _) = await read(for: seconds) { Self.split($0).count >= count }
        return Self.split(text)
    }

    static func split(_ text: String) -> [String] {
        var out: [String] = []
        var rest = Substring(text)
        while let end = rest.range(of: "\r\n\r\n") {
            let head = rest[..<end.lowerBound]
            let length = head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
                .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: " ")) } ?? 0
            let bodyStart = end.upperBound
            guard rest.utf8.distance(from: bodyStart, to: rest.endIndex) >= length else { break }
            let bodyEnd = rest.utf8.index(bodyStart, offsetBy: length)
            out.append(String(rest[..<bodyEnd]))
            rest = rest[bodyEnd...]
        }
        return out
    }

    func close() { Glibc.close(fd) }
}

extension Substring {
    func trimmingCharacters(in set: String) -> String {
        var s = self
        while let f = s.first, set.contains(f) { s = s.dropFirst() }
        while let l = s.last, set.contains(l) { s = s.dropLast() }
        return String(s)
    }
}

@Suite(.serialized) struct HTTPServerTests {
    private func withServer(_ configure: (inout HTTPServerConfiguration) -> Void = { _ in },
                            _ body: (HTTPServer) async throws -> Void) async throws {
        let group = EventLoopGroup(count: 2, name: "http-test")
        var config = HTTPServerConfiguration(address: HostPort(host: "127.0.0.1", port: 0))
        configure(&config)
        let server = HTTPServer(configuration: config, group: group) { request in
            switch request.path {
            case "/later": return .later { .text(200, "later \(request.method)\n") }
            case "/upgrade": return .now(.text(426, "upgrade required\n"))
            default: return .now(.text(200, "path \(request.path)\n"))
            }
        }
        try server.start()
        do { try await body(server) } catch { await server.shutdown(); group.shutdown(); throw error }
        await server.shutdown()
        group.shutdown()
    }

    @Test func keptAliveRequestsAreAnsweredInOrder() async throws {
        try await withServer { server in
            let c = try RawHTTPClient(port: server.port)
            defer { c.close() }
            // pipelined: the second waits for the first, answered by a task
            c.send("GET /later HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
            let two = await c.answers(2)
            #expect(two.count == 2)
            #expect(two.first?.hasPrefix("HTTP/1.1 200 OK\r\n") == true && two.first?.hasSuffix("later GET\n") == true)
            #expect(two.last?.hasSuffix("path /b\n") == true)
            c.send("HEAD /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            let (text, closed) = await c.read()
            #expect(text.hasPrefix("HTTP/1.1 200 OK\r\n") && text.contains("connection: close\r\n") && text.hasSuffix("\r\n\r\n"))
            #expect(closed)
        }
    }

    @Test func aMalformedRequestGets400AndTheConnectionCloses() async throws {
        try await withServer { server in
            let c = try RawHTTPClient(port: server.port)
            defer { c.close() }
            c.send("NONSENSE\r\n\r\n")
            let (text, closed) = await c.read()
            #expect(text.hasPrefix("HTTP/1.1 400 Bad Request\r\n") && closed)
        }
    }

    @Test func headersOverTheLimitGet431() async throws {
        try await withServer({ $0.limits.maxHeaderBytes = 512 }) { server in
            let c = try RawHTTPClient(port: server.port)
            defer { c.close() }
            c.send("GET / HTTP/1.1\r\nX: " + String(repeating: "a", count: 1_000) + "\r\n\r\n")
            let (text, closed) = await c.read()
            #expect(text.hasPrefix("HTTP/1.1 431 ") && closed)
        }
    }

    @Test func aRequestThatTricklesGets408AndASilentConnectionIsClosed() async throws {
        try await withServer({ $0.timeouts.handshake = 200_000_000; $0.timeouts.idle = 200_000_000 }) { server in
            let trickle = try RawHTTPClient(port: server.port)
            defer { trickle.close() }
            trickle.send("GET / HTTP/1.1\r\nHo")
            let (text, closed) = await trickle.read(for: 5)
            #expect(text.hasPrefix("HTTP/1.1 408 ") && closed)
            let silent = try RawHTTPClient(port: server.port)
            defer { silent.close() }
            let quiet = await silent.read(for: 5)
            #expect(quiet.text.isEmpty && quiet.closed)
            // answered, then idle past the idle timeout: closed
            let idle = try RawHTTPClient(port: server.port)
            defer { idle.close() }
            idle.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            let after = await idle.read(for: 5)
            #expect(after.text.hasPrefix("HTTP/1.1 200 ") && after.closed)
        }
    }

    @Test func connectionsFromOneAddressAreCapped() async throws {
        try await withServer({ $0.maxConnectionsPerAddress = 2 }) { server in
            let a = try RawHTTPClient(port: server.port), b = try RawHTTPClient(port: server.port)
            defer { a.close(); b.close() }
            for c in [a, b] {
                c.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
                #expect(await c.answers(1).count == 1)
            }
            let third = try RawHTTPClient(port: server.port)
            defer { third.close() }
            third.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            let (text, closed) = await third.read()
            #expect(text.isEmpty && closed)
            #expect(server.connections == 2)
        }
    }
}
