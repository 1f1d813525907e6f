/// The opaque `next_page` of GetOnlineUsers: the last user id of the page, so the next page starts
/// strictly after it. Users are ordered by id, so a user present throughout is returned exactly once
/// however others join and leave between pages.
public enum PageBookmark {
    private static let prefix = "p1."
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    public static func make(after userID: String) -> String {
        prefix + encode(Array(userID.utf8))
    }

    /// The user id to start after; throws INVALID_ARGUMENT for anything this server did not make.
    public static func parse(_ token: String) throws(PresenceError) -> String {
        let bad = PresenceError(.invalidArgument, "INVALID_PAGE", "page is not a bookmark returned by GetOnlineUsers")
        guard token.utf8.count <= Limits.maxBookmarkBytes, token.hasPrefix(prefix),
              let bytes = decode(Array(token.utf8.dropFirst(prefix.utf8.count))),
              let id = String(validating: bytes, as: UTF8.self), Validate.isIdentifier(id) else { throw bad }
        return id
    }

    // unpadded base64url
    static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        var i = 0
        while i + 3 <= bytes.count {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
            i += 3
        }
        let rest = bytes.count - i
        if rest == 1 {
            let n = UInt32(bytes[i]) << 16
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)]]
        } else if rest == 2 {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)]]
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func decode(_ chars: [UInt8]) -> [UInt8]? {
        var values: [UInt32] = []
        values.reserveCapacity(chars.count)
        for c in chars {
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): values.append(UInt32(c - UInt8(ascii: "A")))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): values.append(UInt32(c - UInt8(ascii: "a") + 26))
            case UInt8(ascii: "0")...UInt8(ascii: "9"): values.append(UInt32(c - UInt8(ascii: "0") + 52))
            case UInt8(ascii: "-"): values.append(62)
            case UInt8(ascii: "_"): values.append(63)
            default: return nil
            }
        }
        if values.count % 4 == 1 { return nil }
        var out: [UInt8] = []
        var i = 0
        while i + 4 <= values.count {
            let n = values[i] << 18 | values[i + 1] << 12 | values[i + 2] << 6 | values[i + 3]
            out += [UInt8(n >> 16 & 255), UInt8(n >> 8 & 255), UInt8(n & 255)]
            i += 4
        }
        let rest = values.count - i
        if rest == 2 {
            let n = values[i] << 18 | values[i + 1] << 12
            out.append(UInt8(n >> 16 & 255))
        } else if rest == 3 {
            let n = values[i] << 18 | values[i + 1] << 12 | values[i + 2] << 6
            out += [UInt8(n >> 16 & 255), UInt8(n >> 8 & 255)]
        }
        // canonical: re-encoding must give the same text
        return encode(out).utf8.elementsEqual(chars) ? out : nil
    }

    /// base64url (unpadded) helpers shared with token parsing.
    public static func base64URLEncode(_ bytes: [UInt8]) -> String { encode(bytes) }
    public static func base64URLDecode(_ text: String) -> [UInt8]? { decode(Array(text.utf8)) }
}
