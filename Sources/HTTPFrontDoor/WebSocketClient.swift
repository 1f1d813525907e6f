import CSystemShim
import EventLoop
import Glibc

/// The client side of the opening handshake, for benchmarks and tests: connects, asks for the
/// upgrade, checks the 101 and its accept value, and returns the socket for a client-mode
/// `WebSocketConnection` on `loop`.
public enum WebSocketClient {
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        public init(description: String) { self.description = description }
    }

    /// Blocks (up to `timeout` seconds): call it off the loops.
    public static func connect(to address: HostPort, path: String = "/v1/ws", loop: EventLoop, timeout: Int32 = 5) throws -> UpgradedSocket {
        let fd = try Sockets.connect(to: address)
        var ok = false
        defer { if !ok { close(fd) } }
        guard wait(fd, for: Int16(POLLOUT), timeout: timeout), Sockets.pendingError(fd) == 0 else { throw Failure(description: "cannot connect to \(address)") }
        var keyBytes = [UInt8](repeating: 0, count: 16)
        var rng = SystemRandomNumberGenerator()
        for i in 0..<16 { keyBytes[i] = UInt8.random(in: 0...255, using: &rng) }
        var encoded = [UInt8](repeating: 0, count: 32)
        let n = CCryptoBase64.encode(keyBytes, into: &encoded)
        let key = String(decoding: encoded[0..<n], as: UTF8.self)
        let request = Array("GET \(path) HTTP/1.1\r\nHost: \(address)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\r\n".utf8)
        var sent = 0
        while sent < request.count {
            let w = request[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if w > 0 { sent += w } else if errno == EAGAIN { guard wait(fd, for: Int16(POLLOUT), timeout: timeout) else { throw Failure(description: "send timed out") } } else { throw Failure(description: "send failed") }
        }
        var got: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            guard wait(fd, for: Int16(POLLIN), timeout: timeout) else { throw Failure(description: "no answer to the upgrade") }
            let r = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if r <= 0 { if r < 0 && errno == EAGAIN { continue }; throw Failure(description: "closed during the upgrade") }
            got += chunk[0..<r]
            if let end = find(got, [13, 10, 13, 10]) {
                let head = String(decoding: got[..<end], as: UTF8.self)
                guard head.hasPrefix("HTTP/1.1 101"), head.lowercased().contains("sec-websocket-accept: \(WebSocketHandshake.acceptValue(for: key).lowercased())") else {
                    throw Failure(description: "upgrade refused: \(head.prefix(80))")
                }
                ok = true
                return UpgradedSocket(fd: fd, loop: loop, leftover: Array(got[(end + 4)...]), release: {})
            }
            guard got.count < 16 * 1024 else { throw Failure(description: "answer head too large") }
        }
    }

    private static func wait(_ fd: Int32, for events: Int16, timeout: Int32) -> Bool {
        var p = pollfd(fd: fd, events: events, revents: 0)
        return poll(&p, 1, timeout * 1000) == 1
    }

    private static func find(_ hay: [UInt8], _ needle: [UInt8]) -> Int? {
        guard hay.count >= needle.count else { return nil }
        for i in 0...(hay.count - needle.count) where hay[i..<(i + needle.count)].elementsEqual(needle) { return i }
        return nil
    }
}
