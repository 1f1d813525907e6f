import CCrypto
import Foundation
import PresenceCore
import Synchronization

/// Authenticates each peer request with the cluster secret (issue 9; replaces one static header
/// anyone who saw a request could replay): the header
/// `cluster-auth: v1.<unix ms>.<hex HMAC-SHA256(secret, "v1\n" + method + "\n" + ms + "\n" + hex(SHA-256(message)))>`
/// binds the method, the time and the request message. A receiver checks the header's form and
/// time before it reads the body, then the MAC (before decoding the message), and refuses a MAC it
/// has already accepted within the window (a replay). Node clocks must agree within `window`
/// (NTP). A plain value: clock readings in, answers out.
public struct PeerRequestAuth: Sendable {
    public static let header = "cluster-auth"
    private let secret: [UInt8]
    /// How far a request's time may be from the receiver's clock (30 s).
    public let window: Int64

    public init(secret: [UInt8], windowMilliseconds: Int64 = 30_000) {
        self.secret = secret
        self.window = windowMilliseconds
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(bytes.count * 2)
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func sha256(_ message: ArraySlice<UInt8>) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        _ = message.withUnsafeBytes { m in
            out.withUnsafeMutableBufferPointer { o in EVP_Digest(m.baseAddress, m.count, o.baseAddress, &length, EVP_sha256(), nil) }
        }
        return Array(out.prefix(Int(length)))
    }

    private func mac(method: String, milliseconds: Int64, message: ArraySlice<UInt8>) -> String {
        let text = "v1\n\(method)\n\(milliseconds)\n\(Self.hex(Self.sha256(message)))"
        return Self.hex(TokenVerifier.hmac(key: secret, message: Array(text.utf8)))
    }

    /// The header value for a request of `method` carrying `message` (protobuf bytes), at `now`.
    public func sign(method: String, message: ArraySlice<UInt8>, now: Int64) -> String {
        "v1.\(now).\(mac(method: method, milliseconds: now, message: message))"
    }

    /// Why a request's header cannot be right whatever its body (missing, malformed, too old or too
    /// new), or nil: checked before the body is read.
    public func refusesEarly(_ value: String?, now: Int64) -> String? {
        guard let value else { return "peer calls need the cluster-auth header (the cluster has a secret)" }
        guard value.utf8.count <= 128 else { return "the cluster-auth header is too long" }
        let parts = value.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "v1", let ms = Int64(parts[1]), parts[2].utf8.count == 64 else {
            return "the cluster-auth header is not v1.<ms>.<mac>"
        }
        let (diff, overflow) = now.subtractingReportingOverflow(ms)
        guard !overflow, diff.magnitude <= UInt64(window) else {
            return "the request's time is more than \(window) ms from this node's clock (clocks out of step, or a replay)"
        }
        return nil
    }

    /// Checks the whole request; returns its MAC (for the replay window) or why it is refused.
    public func check(_ value: String?, method: String, message: ArraySlice<UInt8>, now: Int64) -> Result<String, PeerAuthRefusal> {
        if let why = refusesEarly(value, now: now) { return .failure(PeerAuthRefusal(reason: why)) }
        let parts = value!.split(separator: ".", omittingEmptySubsequences: false)
        let expected = mac(method: method, milliseconds: Int64(parts[1])!, message: message)
        let got = Array(parts[2].utf8), want = Array(expected.utf8)
        guard got.count == want.count, CRYPTO_memcmp(got, want, got.count) == 0 else {
            return .failure(PeerAuthRefusal(reason: "the cluster-auth MAC does not match (another secret, or the request was changed)"))
        }
        return .success(expected)
    }
}

public struct PeerAuthRefusal: Error, Equatable, Sendable {
    public let reason: String
}

/// MACs accepted within the auth window, each refused a second time (a replayed request). Bounded:
/// past `capacity` the oldest are forgotten first. A plain value: MACs and clock readings in.
public struct ReplayWindow: Sendable {
    public let window: Int64
    public let capacity: Int
    private var seen: [String: Int64] = [:]
    private var order: [(String, Int64)] = []
    private var head = 0

    public init(windowMilliseconds: Int64 = 30_000, capacity: Int = 200_000) {
        self.window = windowMilliseconds
        self.capacity = capacity
    }

    /// Whether `mac` (accepted at `now`) is new; a new one is remembered for twice the window
    /// (a request may be stamped up to a window in the future).
    public mutating func admit(_ mac: String, now: Int64) -> Bool {
        forget(before: now)
        if seen[mac] != nil { return false }
        seen[mac] = now
        order.append((mac, now))
        while seen.count > capacity, head < order.count {
            seen[order[head].0] = nil
            head += 1
        }
        return true
    }

    private mutating func forget(before now: Int64) {
        while head < order.count, now - order[head].1 > 2 * window {
            if seen[order[head].0] == order[head].1 { seen[order[head].0] = nil }
            head += 1
        }
        if head > 4096, head * 2 > order.count {
            order.removeFirst(head)
            head = 0
        }
    }

    public var count: Int { seen.count }
}
