import CPresenceProto
import CProtobufC
import Glibc

/// A protobuf message with a Swift value type on one side and protoc-c's C struct on the other.
public protocol ProtoMessage: Sendable, Hashable {
    init()
    /// Decodes protobuf bytes; throws `WireError` on malformed input.
    init(serializedBytes bytes: UnsafeRawBufferPointer) throws
    /// Encodes to protobuf bytes, after `prefix` zero bytes left for a frame header.
    func serializedBytes(prefix: Int) -> [UInt8]
}

extension ProtoMessage {
    /// Encodes to protobuf bytes.
    public func serializedBytes() -> [UInt8] { serializedBytes(prefix: 0) }

    /// Decodes protobuf bytes held in an array.
    public init(serializedBytes bytes: [UInt8]) throws {
        self = try bytes.withUnsafeBytes { try Self(serializedBytes: $0) }
    }
}

/// Why bytes could not be decoded.
public enum WireError: Error, Equatable, CustomStringConvertible {
    /// protobuf-c rejected the bytes (truncated, bad tag, bad length...).
    case malformed(type: String)
    /// A string field held bytes that are not UTF-8.
    case invalidUTF8(type: String)
    /// The bytes decode, but encode back to a different length: a string with an embedded NUL
    /// (which protobuf-c cuts short) or a non-canonical encoding. Rejected rather than guessed at.
    case nonCanonical(type: String)

    public var description: String {
        switch self {
        case .malformed(let t): return "malformed \(t) message"
        case .invalidUTF8(let t): return "\(t) message has a string that is not UTF-8"
        case .nonCanonical(let t): return "\(t) message has a string with a NUL byte or a non-canonical encoding"
        }
    }
}

/// How a gRPC method is called.
public enum MethodKind: Sendable {
    case unary
    case serverStreaming
    /// Client and server stream messages (gRPC server reflection).
    case bidiStreaming
}

/// A gRPC method: its `:path` and its request and response types.
public struct MethodDescriptor<Request: ProtoMessage, Response: ProtoMessage>: Sendable {
    public let path: String
    public let kind: MethodKind
    public init(path: String, kind: MethodKind) {
        self.path = path
        self.kind = kind
    }
}

/// The generated half of a message's bridge to its protoc-c struct.
protocol CMessageBridge: ProtoMessage {
    associatedtype CStruct
    /// Unpacks into memory taken from `allocator` (a `CArena`: freed at once, never piece by piece).
    static func cUnpack(_ allocator: UnsafeMutablePointer<ProtobufCAllocator>, _ count: Int, _ data: UnsafePointer<UInt8>) -> UnsafeMutablePointer<CStruct>?
    static func cPackedSize(_ message: UnsafePointer<CStruct>) -> Int
    static func cPack(_ message: UnsafePointer<CStruct>, _ out: UnsafeMutablePointer<UInt8>) -> Int
    init(cStruct: UnsafePointer<CStruct>) throws
    func fill(_ c: UnsafeMutablePointer<CStruct>, arena: inout CArena)
}

/// Encoding and decoding through protobuf-c, shared by every generated message.
enum WireCodec {
    static func decode<M: CMessageBridge>(_ type: M.Type, from bytes: UnsafeRawBufferPointer) throws -> M {
        if bytes.isEmpty {
            // protobuf-c wants a valid pointer even for zero bytes
            var zero: UInt8 = 0
            return try withUnsafePointer(to: &zero) { try decode(M.self, base: $0, count: 0) }
        }
        return try decode(M.self, base: bytes.baseAddress!.assumingMemoryBound(to: UInt8.self), count: bytes.count)
    }

    private static func decode<M: CMessageBridge>(_ type: M.Type, base: UnsafePointer<UInt8>, count: Int) throws -> M {
        // protobuf-c's structs for one decode come from an arena whose first kilobyte is on the
        // stack (the most the standard library puts there without asking) and are dropped
        // together once read into Swift values: a SetState's request took five mallocs and as
        // many frees from the default allocator.
        try withUnsafeTemporaryAllocation(byteCount: 1024, alignment: 16) { first in
            var arena = CArena(first: first)
            defer { arena.release() }
            return try withUnsafeMutablePointer(to: &arena) { arenaPointer in
                var allocator = ProtobufCAllocator(
                    alloc: { data, size in data!.assumingMemoryBound(to: CArena.self).pointee.raw(size, alignment: 16) },
                    free: { _, _ in },
                    allocator_data: UnsafeMutableRawPointer(arenaPointer))
                return try decode(M.self, base: base, count: count, allocator: &allocator)
            }
        }
    }

    private static func decode<M: CMessageBridge>(_ type: M.Type, base: UnsafePointer<UInt8>, count: Int,
                                                  allocator: UnsafeMutablePointer<ProtobufCAllocator>) throws -> M {
        guard let c = M.cUnpack(allocator, count, base) else {
            throw WireError.malformed(type: String(describing: M.self))
        }
        // protobuf-c cuts strings at a NUL byte without saying so; a length check catches it.
        guard M.cPackedSize(c) == count else {
            throw WireError.nonCanonical(type: String(describing: M.self))
        }
        do {
            return try M(cStruct: c)
        } catch is StringDecodingFailure {
            throw WireError.invalidUTF8(type: String(describing: M.self))
        }
    }

    static func encode<M: CMessageBridge>(_ message: M, prefix: Int) -> [UInt8] {
        // The first kilobyte of C structs lives on the stack; larger messages spill to the heap.
        withUnsafeTemporaryAllocation(byteCount: 1024, alignment: 16) { first in
            var arena = CArena(first: first)
            defer { arena.release() }
            return encode(message, prefix: prefix, arena: &arena)
        }
    }

    private static func encode<M: CMessageBridge>(_ message: M, prefix: Int, arena: inout CArena) -> [UInt8] {
        let c = arena.allocate(M.CStruct.self)
        message.fill(c, arena: &arena)
        let size = M.cPackedSize(c)
        return [UInt8](unsafeUninitializedCapacity: prefix + size) { buffer, count in
            for i in 0..<prefix { buffer[i] = 0 }
            let written = size == 0 ? 0 : M.cPack(c, buffer.baseAddress! + prefix)
            precondition(written == size, "protobuf-c packed a different size than it measured")
            count = prefix + size
        }
    }

    struct StringDecodingFailure: Error {}

    static func readString(_ p: UnsafeMutablePointer<CChar>?) throws -> String {
        guard let p, p.pointee != 0 else { return "" }
        guard let s = String(validatingCString: p) else { throw StringDecodingFailure() }
        return s
    }

    static func readBytes(_ b: ProtobufCBinaryData) -> [UInt8] {
        guard b.len > 0, let data = b.data else { return [] }
        return Array(UnsafeBufferPointer(start: data, count: b.len))
    }

    static func readArray<E, T>(_ items: UnsafeMutablePointer<E>?, _ count: Int, _ read: (E) throws -> T) rethrows -> [T] {
        guard count > 0, let items else { return [] }
        var out: [T] = []
        out.reserveCapacity(count)
        for i in 0..<count { out.append(try read(items[i])) }
        return out
    }
}

/// A bump allocator for the C structs of one encode or decode: everything is freed at once by
/// `release()`.
struct CArena {
    private var chunks: [UnsafeMutableRawPointer] = []
    private var cursor: UnsafeMutableRawPointer? = nil
    private var remaining = 0
    private static let chunkSize = 4096

    /// An arena that starts in `first` (caller-owned, e.g. on the stack) and spills to the heap.
    init(first: UnsafeMutableRawBufferPointer) {
        cursor = first.baseAddress
        remaining = first.count
    }

    mutating func raw(_ size: Int, alignment: Int) -> UnsafeMutableRawPointer {
        let aligned = (size + 15) & ~15
        if aligned > remaining {
            let want = max(aligned, CArena.chunkSize)
            let chunk = UnsafeMutableRawPointer.allocate(byteCount: want, alignment: 16)
            chunks.append(chunk)
            cursor = chunk
            remaining = want
        }
        let p = cursor!
        cursor = p + aligned
        remaining -= aligned
        return p
    }

    mutating func allocate<T>(_ type: T.Type) -> UnsafeMutablePointer<T> {
        raw(MemoryLayout<T>.stride, alignment: MemoryLayout<T>.alignment).bindMemory(to: T.self, capacity: 1)
    }

    mutating func cString(_ s: String) -> UnsafeMutablePointer<CChar> {
        var s = s
        return s.withUTF8 { utf8 in
            let p = raw(utf8.count + 1, alignment: 1).bindMemory(to: CChar.self, capacity: utf8.count + 1)
            if utf8.count > 0 {
                UnsafeMutableRawPointer(p).copyMemory(from: utf8.baseAddress!, byteCount: utf8.count)
            }
            p[utf8.count] = 0
            return p
        }
    }

    mutating func binary(_ bytes: [UInt8]) -> ProtobufCBinaryData {
        guard !bytes.isEmpty else { return ProtobufCBinaryData(len: 0, data: nil) }
        let p = raw(bytes.count, alignment: 1).bindMemory(to: UInt8.self, capacity: bytes.count)
        bytes.withUnsafeBufferPointer { p.update(from: $0.baseAddress!, count: bytes.count) }
        return ProtobufCBinaryData(len: bytes.count, data: p)
    }

    mutating func message<M: CMessageBridge>(_ m: M) -> UnsafeMutablePointer<M.CStruct> {
        let c = allocate(M.CStruct.self)
        m.fill(c, arena: &self)
        return c
    }

    mutating func messageArray<M: CMessageBridge>(_ items: [M]) -> (Int, UnsafeMutablePointer<UnsafeMutablePointer<M.CStruct>?>?) {
        guard !items.isEmpty else { return (0, nil) }
        let list = raw(MemoryLayout<UnsafeMutablePointer<M.CStruct>?>.stride * items.count, alignment: 8)
            .bindMemory(to: UnsafeMutablePointer<M.CStruct>?.self, capacity: items.count)
        for (i, m) in items.enumerated() { list[i] = message(m) }
        return (items.count, list)
    }

    mutating func stringArray(_ items: [String]) -> (Int, UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) {
        guard !items.isEmpty else { return (0, nil) }
        let list = raw(MemoryLayout<UnsafeMutablePointer<CChar>?>.stride * items.count, alignment: 8)
            .bindMemory(to: UnsafeMutablePointer<CChar>?.self, capacity: items.count)
        for (i, s) in items.enumerated() { list[i] = cString(s) }
        return (items.count, list)
    }

    mutating func binaryArray(_ items: [[UInt8]]) -> (Int, UnsafeMutablePointer<ProtobufCBinaryData>?) {
        guard !items.isEmpty else { return (0, nil) }
        let list = raw(MemoryLayout<ProtobufCBinaryData>.stride * items.count, alignment: 8)
            .bindMemory(to: ProtobufCBinaryData.self, capacity: items.count)
        for (i, b) in items.enumerated() { list[i] = binary(b) }
        return (items.count, list)
    }

    mutating func scalarArray<T: FixedWidthInteger>(_ items: [T]) -> (Int, UnsafeMutablePointer<T>?) {
        guard !items.isEmpty else { return (0, nil) }
        let list = raw(MemoryLayout<T>.stride * items.count, alignment: 8).bindMemory(to: T.self, capacity: items.count)
        for (i, v) in items.enumerated() { list[i] = v }
        return (items.count, list)
    }

    mutating func release() {
        for c in chunks { c.deallocate() }
        chunks.removeAll()
        cursor = nil
        remaining = 0
    }
}
