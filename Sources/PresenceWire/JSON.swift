/// A JSON value, for the WebSocket API (WEB.md): messages follow protobuf's canonical JSON mapping,
/// coded by `JSONCodable` conformances generated from the same descriptors as the Swift types.
/// Numbers keep their text, so 64-bit integers lose nothing.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case number(String)
    case string(String)
    case array([JSONValue])
    /// Members in order (a later duplicate key wins when read through `object`).
    case object([(String, JSONValue)])

    public static func == (a: JSONValue, b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): return true
        case (.bool(let x), .bool(let y)): return x == y
        case (.number(let x), .number(let y)): return x == y
        case (.string(let x), .string(let y)): return x == y
        case (.array(let x), .array(let y)): return x == y
        case (.object(let x), .object(let y)): return x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        default: return false
        }
    }

    /// The member `key` of an object (nil for a missing key or a non-object).
    public subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.last { $0.0 == key }?.1
    }

    public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }
}

/// Why JSON could not be read: the path of the offending value and what was wanted.
public struct JSONError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// A message that has a canonical JSON form.
public protocol JSONCodable {
    init(json: JSONValue) throws(JSONError)
    func json() -> JSONValue
}

// MARK: Reading

/// A strict JSON parser (RFC 8259) with a nesting limit; input from the network is bounded by the
/// caller (the WebSocket message size).
public struct JSONParser {
    public static let maxDepth = 32
    private let bytes: [UInt8]
    private var i = 0

    public static func parse(_ text: [UInt8]) throws(JSONError) -> JSONValue {
        var p = JSONParser(bytes: text)
        p.skipSpace()
        let v = try p.value(depth: 0)
        p.skipSpace()
        guard p.i == p.bytes.count else { throw JSONError("unexpected text after the JSON value at byte \(p.i)") }
        return v
    }

    public static func parse(_ text: String) throws(JSONError) -> JSONValue { try parse(Array(text.utf8)) }

    private init(bytes: [UInt8]) { self.bytes = bytes }

    private mutating func skipSpace() {
        while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x0a || bytes[i] == 0x0d || bytes[i] == 0x09 { i += 1 }
    }

    private func fail(_ what: String) -> JSONError { JSONError("\(what) at byte \(i)") }

    private mutating func literal(_ word: StaticString, _ v: JSONValue) throws(JSONError) -> JSONValue {
        let n = word.utf8CodeUnitCount
        guard i + n <= bytes.count else { throw fail("truncated literal") }
        for k in 0..<n where bytes[i + k] != word.utf8Start[k] { throw fail("bad literal") }
        i += n
        return v
    }

    private mutating func value(depth: Int) throws(JSONError) -> JSONValue {
        guard depth < Self.maxDepth else { throw fail("nested deeper than \(Self.maxDepth)") }
        guard i < bytes.count else { throw fail("a value expected") }
        switch bytes[i] {
        case UInt8(ascii: "{"):
            i += 1
            var members: [(String, JSONValue)] = []
            skipSpace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "}") { i += 1; return .object(members) }
            while true {
                skipSpace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { throw fail("a member name expected") }
                let key = try string()
                skipSpace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { throw fail("':' expected") }
                i += 1
                skipSpace()
                members.append((key, try value(depth: depth + 1)))
                skipSpace()
                guard i < bytes.count else { throw fail("unterminated object") }
                if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
                if bytes[i] == UInt8(ascii: "}") { i += 1; return .object(members) }
                throw fail("',' or '}' expected")
            }
        case UInt8(ascii: "["):
            i += 1
            var items: [JSONValue] = []
            skipSpace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
            while true {
                skipSpace()
                items.append(try value(depth: depth + 1))
                skipSpace()
                guard i < bytes.count else { throw fail("unterminated array") }
                if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
                if bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
                throw fail("',' or ']' expected")
            }
        case UInt8(ascii: "\""):
            return .string(try string())
        case UInt8(ascii: "t"): return try literal("true", .bool(true))
        case UInt8(ascii: "f"): return try literal("false", .bool(false))
        case UInt8(ascii: "n"): return try literal("null", .null)
        default:
            return try number()
        }
    }

    private mutating func number() throws(JSONError) -> JSONValue {
        let start = i
        if i < bytes.count, bytes[i] == UInt8(ascii: "-") { i += 1 }
        func digits(_ p: inout JSONParser) -> Int {
            let s = p.i
            while p.i < p.bytes.count, p.bytes[p.i] >= 0x30, p.bytes[p.i] <= 0x39 { p.i += 1 }
            return p.i - s
        }
        let intStart = i
        guard digits(&self) > 0 else { throw fail("a value expected") }
        if bytes[intStart] == 0x30, i - intStart > 1 { throw fail("a number with a leading zero") }
        if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
            i += 1
            guard digits(&self) > 0 else { throw fail("digits expected after '.'") }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            i += 1
            if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            guard digits(&self) > 0 else { throw fail("digits expected in the exponent") }
        }
        return .number(String(decoding: bytes[start..<i], as: UTF8.self))
    }

    private mutating func hex4() throws(JSONError) -> UInt32 {
        guard i + 4 <= bytes.count else { throw fail("truncated \\u escape") }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[i]
            let d: UInt32
            switch c {
            case 0x30...0x39: d = UInt32(c - 0x30)
            case 0x41...0x46: d = UInt32(c - 0x41 + 10)
            case 0x61...0x66: d = UInt32(c - 0x61 + 10)
            default: throw fail("bad \\u escape")
            }
            v = v << 4 | d
            i += 1
        }
        return v
    }

    private mutating func string() throws(JSONError) -> String {
        i += 1  // the opening quote
        var out: [UInt8] = []
        while true {
            guard i < bytes.count else { throw fail("unterminated string") }
            let c = bytes[i]
            if c == UInt8(ascii: "\"") {
                i += 1
                guard let s = String(validating: out, as: UTF8.self) else { throw fail("a string that is not UTF-8") }
                return s
            }
            if c < 0x20 { throw fail("a control character in a string") }
            if c != UInt8(ascii: "\\") {
                out.append(c)
                i += 1
                continue
            }
            i += 1
            guard i < bytes.count else { throw fail("unterminated escape") }
            let e = bytes[i]
            i += 1
            switch e {
            case UInt8(ascii: "\""): out.append(0x22)
            case UInt8(ascii: "\\"): out.append(0x5c)
            case UInt8(ascii: "/"): out.append(0x2f)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0c)
            case UInt8(ascii: "n"): out.append(0x0a)
            case UInt8(ascii: "r"): out.append(0x0d)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = try hex4()
                if (0xD800...0xDBFF).contains(scalar) {
                    guard i + 2 <= bytes.count, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") else { throw fail("a lone surrogate") }
                    i += 2
                    let low = try hex4()
                    guard (0xDC00...0xDFFF).contains(low) else { throw fail("a lone surrogate") }
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00...0xDFFF).contains(scalar) {
                    throw fail("a lone surrogate")
                }
                guard let u = Unicode.Scalar(scalar) else { throw fail("a bad code point") }
                out += Array(String(Character(u)).utf8)
            default:
                throw fail("a bad escape")
            }
        }
    }
}

// MARK: Writing

extension JSONValue {
    /// Compact JSON text.
    public var text: String {
        var out = ""
        write(into: &out)
        return out
    }

    public func write(into out: inout String) {
        switch self {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .number(let n): out += n
        case .string(let s): Self.quote(s, into: &out)
        case .array(let items):
            out += "["
            for (k, v) in items.enumerated() {
                if k > 0 { out += "," }
                v.write(into: &out)
            }
            out += "]"
        case .object(let members):
            out += "{"
            for (k, (name, v)) in members.enumerated() {
                if k > 0 { out += "," }
                Self.quote(name, into: &out)
                out += ":"
                v.write(into: &out)
            }
            out += "}"
        }
    }

    static func quote(_ s: String, into out: inout String) {
        out += "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where u.value < 0x20 || u.value == 0x2028 || u.value == 0x2029:
                let hex = String(u.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(u)
            }
        }
        out += "\""
    }
}

// MARK: Helpers for the generated coding

/// Reading and writing of field values by protobuf's canonical JSON mapping.
public enum JSONField {
    public static func string(_ v: JSONValue, _ field: String) throws(JSONError) -> String {
        switch v {
        case .string(let s): return s
        case .null: return ""
        default: throw JSONError("\(field): a string expected")
        }
    }

    public static func bool(_ v: JSONValue, _ field: String) throws(JSONError) -> Bool {
        switch v {
        case .bool(let b): return b
        case .null: return false
        default: throw JSONError("\(field): true or false expected")
        }
    }

    /// An integer field: a JSON number or a string holding one (64-bit values travel as strings).
    public static func integer<T: FixedWidthInteger>(_ v: JSONValue, _ field: String, as: T.Type = T.self) throws(JSONError) -> T {
        let text: String
        switch v {
        case .number(let n): text = n
        case .string(let s): text = s
        case .null: return 0
        default: throw JSONError("\(field): an integer expected")
        }
        if let n = T(text) { return n }
        // (an integral value written with a fraction or exponent, 1.0 or 1e3, where a double holds
        // it exactly: past 2^53 such a spelling may round)
        if let d = Double(text), d.rounded() == d, abs(d) < 9_007_199_254_740_992, let n = T(exactly: d) { return n }
        throw JSONError("\(field): \(text.prefix(40)) is not an integer in range")
    }

    public static func double(_ v: JSONValue, _ field: String) throws(JSONError) -> Double {
        switch v {
        case .number(let n): if let d = Double(n) { return d }
        case .string(let s): if let d = Double(s) { return d }
        case .null: return 0
        default: break
        }
        throw JSONError("\(field): a number expected")
    }

    public static func bytes(_ v: JSONValue, _ field: String) throws(JSONError) -> [UInt8] {
        switch v {
        case .string(let s):
            guard let b = Base64.decode(s) else { throw JSONError("\(field): base64 expected") }
            return b
        case .null: return []
        default: throw JSONError("\(field): base64 text expected")
        }
    }

    public static func array(_ v: JSONValue, _ field: String) throws(JSONError) -> [JSONValue] {
        switch v {
        case .array(let a): return a
        case .null: return []
        default: throw JSONError("\(field): an array expected")
        }
    }

    /// An enum field: its value's name, or its number.
    public static func enumValue(_ v: JSONValue, _ field: String, names: [String: Int32]) throws(JSONError) -> Int32 {
        switch v {
        case .string(let s):
            guard let n = names[s] else { throw JSONError("\(field): \(s.prefix(60)) is not one of its values") }
            return n
        case .number:
            return try integer(v, field, as: Int32.self)
        case .null: return 0
        default: throw JSONError("\(field): an enum value name expected")
        }
    }

    public static func integerValue<T: FixedWidthInteger>(_ n: T) -> JSONValue {
        // (64-bit integers are strings, so JavaScript's doubles lose nothing)
        T.bitWidth > 32 ? .string(String(n)) : .number(String(n))
    }

    public static func doubleValue(_ d: Double) -> JSONValue {
        if d.isNaN { return .string("NaN") }
        if d.isInfinite { return .string(d > 0 ? "Infinity" : "-Infinity") }
        return .number(d == d.rounded() && abs(d) < 1e15 ? String(Int64(d)) : "\(d)")
    }
}

/// Base64 (RFC 4648, standard alphabet) for `bytes` fields.
public enum Base64 {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    public static func encode(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i + 3 <= bytes.count {
            let n = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], alphabet[Int(n >> 6 & 63)], alphabet[Int(n & 63)]]
            i += 3
        }
        let rest = bytes.count - i
        if rest > 0 {
            let n = UInt32(bytes[i]) << 16 | (rest == 2 ? UInt32(bytes[i + 1]) << 8 : 0)
            out += [alphabet[Int(n >> 18 & 63)], alphabet[Int(n >> 12 & 63)], rest == 2 ? alphabet[Int(n >> 6 & 63)] : UInt8(ascii: "="), UInt8(ascii: "=")]
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Standard or URL-safe alphabet, padded or not; nil for anything else.
    public static func decode(_ text: String) -> [UInt8]? {
        var out: [UInt8] = []
        var acc: UInt32 = 0, bits = 0
        for c in text.utf8 {
            let v: UInt32
            switch c {
            case 0x41...0x5a: v = UInt32(c - 0x41)
            case 0x61...0x7a: v = UInt32(c - 0x61 + 26)
            case 0x30...0x39: v = UInt32(c - 0x30 + 52)
            case UInt8(ascii: "+"), UInt8(ascii: "-"): v = 62
            case UInt8(ascii: "/"), UInt8(ascii: "_"): v = 63
            case UInt8(ascii: "="): continue
            default: return nil
            }
            acc = acc << 6 | v
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(acc >> UInt32(bits) & 0xff))
            }
        }
        return out
    }
}
