/// Splits a gRPC request or response body into messages: each is a 1-byte compressed flag,
/// a 4-byte big-endian length, then that many bytes. Bytes may arrive in any split.
public struct MessageDeframer: Sendable {
    public enum Failure: Error, Equatable, Sendable {
        /// A message longer than the limit was announced; nothing of it was buffered.
        case tooLarge(length: UInt32, limit: Int)
        /// The compressed flag was set; this server speaks identity only.
        case compressed
        /// The flag byte was neither 0 nor 1.
        case badFlag(UInt8)
    }

    public let maxMessageSize: Int
    private var header: [UInt8] = []
    private var body: [UInt8] = []
    private var expected: Int? = nil
    public private(set) var failed: Failure? = nil

    public init(maxMessageSize: Int) {
        self.maxMessageSize = maxMessageSize
    }

    /// True when no partial message is buffered (so END_STREAM here ends cleanly).
    public var isIdle: Bool { header.isEmpty && expected == nil }

    /// Bytes held for a message not yet complete.
    public var bufferedBytes: Int { header.count + body.count }

    /// Feeds bytes; calls `onMessage` for each complete message. After a failure, ignores input.
    public mutating func append(_ bytes: UnsafeBufferPointer<UInt8>, onMessage: ([UInt8]) -> Void) -> Failure? {
        if let failed { return failed }
        var i = 0
        while i < bytes.count {
            if let want = expected {
                let take = min(want - body.count, bytes.count - i)
                body.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[i..<(i + take)]))
                i += take
                if body.count == want {
                    onMessage(body)
                    body = []
                    expected = nil
                }
                continue
            }
            // Fast path: a whole header and message in this chunk, nothing buffered.
            if header.isEmpty && bytes.count - i >= 5 {
                let flag = bytes[i]
                let length = Int(UInt32(bytes[i + 1]) << 24 | UInt32(bytes[i + 2]) << 16 | UInt32(bytes[i + 3]) << 8 | UInt32(bytes[i + 4]))
                if let f = check(flag: flag, length: length) { failed = f; return f }
                if bytes.count - i - 5 >= length {
                    onMessage(Array(UnsafeBufferPointer(rebasing: bytes[(i + 5)..<(i + 5 + length)])))
                    i += 5 + length
                    continue
                }
                expected = length
                body.reserveCapacity(length)
                i += 5
                continue
            }
            header.append(bytes[i])
            i += 1
            if header.count == 5 {
                let length = Int(UInt32(header[1]) << 24 | UInt32(header[2]) << 16 | UInt32(header[3]) << 8 | UInt32(header[4]))
                if let f = check(flag: header[0], length: length) { failed = f; return f }
                header = []
                if length == 0 {
                    onMessage([])
                } else {
                    expected = length
                    body.reserveCapacity(length)
                }
            }
        }
        return nil
    }

    private func check(flag: UInt8, length: Int) -> Failure? {
        if flag == 1 { return .compressed }
        if flag > 1 { return .badFlag(flag) }
        if length > maxMessageSize { return .tooLarge(length: UInt32(length), limit: maxMessageSize) }
        return nil
    }

    /// Writes the 5-byte header for a message of `length` bytes into `buffer[0..<5]`.
    public static func writeHeader(into buffer: inout [UInt8], length: Int) {
        buffer[0] = 0
        buffer[1] = UInt8(truncatingIfNeeded: length >> 24)
        buffer[2] = UInt8(truncatingIfNeeded: length >> 16)
        buffer[3] = UInt8(truncatingIfNeeded: length >> 8)
        buffer[4] = UInt8(truncatingIfNeeded: length)
    }

    /// A framed message: header then payload.
    public static func frame(_ payload: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 5)
        writeHeader(into: &out, length: payload.count)
        out.append(contentsOf: payload)
        return out
    }
}
