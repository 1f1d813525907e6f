/// A gRPC status: a code and a message for a person. Thrown by handlers and clients as an error.
public struct GRPCStatus: Error, Hashable, Sendable, CustomStringConvertible {
    /// The gRPC status codes (grpc/grpc doc/statuscodes.md).
    public enum Code: Int, Sendable, Hashable, CaseIterable {
        case ok = 0, cancelled, unknown, invalidArgument, deadlineExceeded, notFound, alreadyExists,
             permissionDenied, resourceExhausted, failedPrecondition, aborted, outOfRange,
             unimplemented, `internal`, unavailable, dataLoss, unauthenticated

        public var name: String {
            switch self {
            case .ok: "OK"
            case .cancelled: "CANCELLED"
            case .unknown: "UNKNOWN"
            case .invalidArgument: "INVALID_ARGUMENT"
            case .deadlineExceeded: "DEADLINE_EXCEEDED"
            case .notFound: "NOT_FOUND"
            case .alreadyExists: "ALREADY_EXISTS"
            case .permissionDenied: "PERMISSION_DENIED"
            case .resourceExhausted: "RESOURCE_EXHAUSTED"
            case .failedPrecondition: "FAILED_PRECONDITION"
            case .aborted: "ABORTED"
            case .outOfRange: "OUT_OF_RANGE"
            case .unimplemented: "UNIMPLEMENTED"
            case .internal: "INTERNAL"
            case .unavailable: "UNAVAILABLE"
            case .dataLoss: "DATA_LOSS"
            case .unauthenticated: "UNAUTHENTICATED"
            }
        }
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String = "") {
        self.code = code
        self.message = message
    }

    public static let ok = GRPCStatus(.ok)

    /// The status an error stands for: itself when it is one, CANCELLED for cancellation, else UNKNOWN.
    public init(_ error: Error) {
        if let s = error as? GRPCStatus {
            self = s
        } else if error is CancellationError {
            self = GRPCStatus(.cancelled, "CANCELLED: the call was cancelled")
        } else {
            self = GRPCStatus(.unknown, "UNKNOWN: \(error)")
        }
    }

    public var description: String { message.isEmpty ? code.name : "\(code.name): \(message)" }
}

/// `grpc-message` is percent-encoded: bytes outside printable ASCII and `%` itself become `%XX`.
enum PercentEncoding {
    static func encode(_ text: String) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count)
        let hex = Array("0123456789ABCDEF".utf8)
        for b in text.utf8 {
            if b >= 0x20 && b <= 0x7e && b != UInt8(ascii: "%") {
                out.append(b)
            } else {
                out.append(UInt8(ascii: "%"))
                out.append(hex[Int(b >> 4)])
                out.append(hex[Int(b & 0xf)])
            }
        }
        return out
    }

    /// Decodes; a malformed escape is kept as it is (the spec asks receivers to be lenient).
    static func decode(_ bytes: UnsafeBufferPointer<UInt8>) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        func hexValue(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "%"), i + 2 < bytes.count,
               let hi = hexValue(bytes[i + 1]), let lo = hexValue(bytes[i + 2]) {
                out.append(hi << 4 | lo)
                i += 3
            } else {
                out.append(bytes[i])
                i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// The `grpc-timeout` header: up to 8 digits and a unit (H, M, S, m, u, n).
public enum GRPCTimeout {
    /// Nanoseconds, or nil when the header is malformed.
    public static func parse(_ bytes: UnsafeBufferPointer<UInt8>) -> UInt64? {
        guard bytes.count >= 2, bytes.count <= 9 else { return nil }
        var value: UInt64 = 0
        for b in bytes.dropLast() {
            guard b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + UInt64(b - UInt8(ascii: "0"))
        }
        let scale: UInt64
        switch bytes[bytes.count - 1] {
        case UInt8(ascii: "H"): scale = 3_600_000_000_000
        case UInt8(ascii: "M"): scale = 60_000_000_000
        case UInt8(ascii: "S"): scale = 1_000_000_000
        case UInt8(ascii: "m"): scale = 1_000_000
        case UInt8(ascii: "u"): scale = 1_000
        case UInt8(ascii: "n"): scale = 1
        default: return nil
        }
        let (product, overflow) = value.multipliedReportingOverflow(by: scale)
        return overflow ? UInt64.max : product
    }

    public static func parse(_ text: String) -> UInt64? {
        var text = text
        return text.withUTF8 { parse($0) }
    }

    /// Encodes nanoseconds with the finest unit that fits in 8 digits.
    public static func encode(nanoseconds: UInt64) -> String {
        let units: [(UInt64, Character)] = [(1, "n"), (1_000, "u"), (1_000_000, "m"), (1_000_000_000, "S"), (60_000_000_000, "M"), (3_600_000_000_000, "H")]
        for (scale, unit) in units {
            let v = nanoseconds / scale + (nanoseconds % scale == 0 ? 0 : 1)  // (rounded up, without overflow)
            if v < 100_000_000 { return "\(v)\(unit)" }
        }
        return "99999999H"
    }
}
