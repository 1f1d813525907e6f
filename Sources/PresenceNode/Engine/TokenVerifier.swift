import CCrypto
import Foundation
import PresenceCore

/// Checks HMAC-SHA256 tokens (API.md, "Security"): `base64url(payload) "." base64url(mac)`, the MAC
/// taken with the app secret over the payload's base64url text, the payload
/// `{"uid": "<user_id>", "exp": <unix seconds>}`. OpenSSL's libcrypto computes the HMAC.
public struct TokenVerifier: Sendable {
    private let secret: [UInt8]

    public init(secret: [UInt8]) {
        self.secret = secret
    }

    /// Reads the secret from a file (surrounding whitespace trimmed).
    public init(secretFile path: String) throws {
        secret = try Self.readSecret(file: path)
    }

    /// A secret file's bytes, trailing whitespace trimmed; throws when empty or unreadable.
    public static func readSecret(file path: String) throws -> [UInt8] {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        var bytes = [UInt8](data)
        while let last = bytes.last, last == 10 || last == 13 || last == 32 || last == 9 { bytes.removeLast() }
        guard !bytes.isEmpty else {
            throw PresenceError(.invalidArgument, "EMPTY_SECRET", "the secret file \(path) is empty")
        }
        return bytes
    }

    static func hmac(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        _ = key.withUnsafeBytes { k in
            message.withUnsafeBytes { m in
                out.withUnsafeMutableBufferPointer { o in
                    HMAC(EVP_sha256(), k.baseAddress, Int32(k.count), m.baseAddress?.assumingMemoryBound(to: UInt8.self), m.count, o.baseAddress, &length)
                }
            }
        }
        return Array(out.prefix(Int(length)))
    }

    /// Makes a token (for tests and tools).
    public func sign(userID: String, expires: Int64) -> String {
        let json = "{\"uid\":\"\(userID)\",\"exp\":\(expires)}"
        let payload = PageBookmark.base64URLEncode(Array(json.utf8))
        let mac = Self.hmac(key: secret, message: Array(payload.utf8))
        return payload + "." + PageBookmark.base64URLEncode(mac)
    }

    /// Accepts the token for `userID` at `now` (Unix seconds) or throws UNAUTHENTICATED.
    public func verify(_ token: String, userID: String, now: Int64) throws(PresenceError) {
        let uid = try user(of: token, now: now)
        guard uid == userID else { throw PresenceError(.unauthenticated, "INVALID_TOKEN", "the token is for another user") }
    }

    /// The user a valid token at `now` (Unix seconds) is for, or UNAUTHENTICATED.
    public func user(of token: String, now: Int64) throws(PresenceError) -> String {
        func fail(_ why: String) -> PresenceError { PresenceError(.unauthenticated, "INVALID_TOKEN", why) }
        guard !token.isEmpty else { throw fail("a token is required (the node runs with --auth-secret-file)") }
        guard token.utf8.count <= 4096 else { throw fail("the token is too long") }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 2, let mac = PageBookmark.base64URLDecode(String(parts[1])),
              let payloadBytes = PageBookmark.base64URLDecode(String(parts[0])) else {
            throw fail("the token is not base64url(payload).base64url(signature)")
        }
        let expected = Self.hmac(key: secret, message: Array(parts[0].utf8))
        guard mac.count == expected.count, CRYPTO_memcmp(mac, expected, mac.count) == 0 else {
            throw fail("the token's signature does not match")
        }
        guard let obj = try? JSONSerialization.jsonObject(with: Data(payloadBytes)) as? [String: Any],
              let uid = obj["uid"] as? String, let exp = (obj["exp"] as? NSNumber)?.int64Value else {
            throw fail("the token's payload is not {\"uid\": ..., \"exp\": ...}")
        }
        guard exp > now else { throw fail("the token expired") }
        guard Validate.isIdentifier(uid) else { throw fail("the token's user id is not a valid user id") }
        return uid
    }
}
