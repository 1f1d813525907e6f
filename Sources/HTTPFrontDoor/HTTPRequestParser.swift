import CHTTPParser

/// One HTTP/1.1 request, as the front door sees it.
public struct HTTPRequest: Sendable {
    public var method: String
    /// The request-target as sent (`/metrics?x=1`).
    public var target: String
    /// The target up to `?`.
    public var path: String { String(target.prefix { $0 != "?" }) }
    /// Header fields in order, names lowercased.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// Whether the connection stays open after the answer (HTTP/1.1 default, or `keep-alive`).
    public var keepAlive: Bool
    /// The request asks to switch protocols (`Connection: upgrade`); the bytes after its head are
    /// the new protocol's.
    public var isUpgrade: Bool

    public init(method: String, target: String, headers: [(name: String, value: String)] = [], body: [UInt8] = [],
                keepAlive: Bool = true, isUpgrade: Bool = false) {
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.keepAlive = keepAlive
        self.isUpgrade = isUpgrade
    }

    /// The first value of a header (name in any case).
    public func header(_ name: String) -> String? {
        let n = name.lowercased()
        return headers.first { $0.name == n }?.value
    }

    /// Whether a comma-separated header lists `token` (case-insensitive), as `Connection` and
    /// `Upgrade` do.
    public func headerLists(_ name: String, _ token: String) -> Bool {
        let n = name.lowercased(), t = token.lowercased()
        return headers.contains { $0.name == n && $0.value.split(separator: ",").contains { $0.trimmingSpaces.lowercased() == t } }
    }
}

extension Substring {
    var trimmingSpaces: Substring {
        var s = self
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return s
    }
}

/// What one request may carry at most: past a limit the request is refused and the connection
/// closed, before more of it is kept.
public struct HTTPLimits: Sendable {
    /// Request line and header fields together (16 KiB, as the gRPC port's header list).
    public var maxHeaderBytes = 16 * 1024
    /// Header fields.
    public var maxHeaders = 64
    /// A body (the front door's routes take none; 64 KiB).
    public var maxBodyBytes = 64 * 1024

    public init() {}
}

/// Reads HTTP/1.1 requests out of a byte stream with http-parser, one at a time and within
/// `HTTPLimits`. Loop-confined (a connection owns one).
public final class HTTPRequestParser {
    /// What `parse` found.
    public enum Outcome: Equatable {
        /// Not a whole request yet: every byte was taken; feed more.
        case needMore
        /// A whole request, which took the first `consumed` bytes; what follows is the next
        /// request (or, after an upgrade, the new protocol's bytes).
        case request(consumed: Int)
        /// A request that cannot be served: answer `status` and close.
        case failed(status: Int, reason: String)
    }

    public let limits: HTTPLimits
    private let parser: UnsafeMutablePointer<http_parser>
    private var settings = http_parser_settings()

    // the request being read
    private var target: [UInt8] = []
    private var headers: [(name: String, value: String)] = []
    private var field: [UInt8] = []
    private var value: [UInt8] = []
    private var inValue = false
    private var headerBytes = 0
    private var body: [UInt8] = []
    private var complete = false
    private var refusal: (status: Int, reason: String)? = nil
    /// The last whole request (taken by `takeRequest`).
    private var finished: HTTPRequest? = nil

    public init(limits: HTTPLimits = HTTPLimits()) {
        self.limits = limits
        parser = .allocate(capacity: 1)
        http_parser_init(parser, HTTP_REQUEST)
        settings.on_url = { p, at, n in HTTPRequestParser.from(p).take(url: at, n) }
        settings.on_header_field = { p, at, n in HTTPRequestParser.from(p).take(field: at, n) }
        settings.on_header_value = { p, at, n in HTTPRequestParser.from(p).take(value: at, n) }
        settings.on_headers_complete = { p in HTTPRequestParser.from(p).headersComplete() }
        settings.on_body = { p, at, n in HTTPRequestParser.from(p).take(body: at, n) }
        settings.on_message_complete = { p in HTTPRequestParser.from(p).messageComplete() }
    }

    deinit { parser.deallocate() }

    private static func from(_ p: UnsafeMutablePointer<http_parser>?) -> HTTPRequestParser {
        Unmanaged<HTTPRequestParser>.fromOpaque(p!.pointee.data!).takeUnretainedValue()
    }

    /// Parses `bytes` up to the end of the first whole request in them.
    public func parse(_ bytes: UnsafeRawBufferPointer) -> Outcome {
        guard !bytes.isEmpty else { return .needMore }
        parser.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        defer { parser.pointee.data = nil }
        let n = bytes.withMemoryRebound(to: CChar.self) { http_parser_execute(parser, &settings, $0.baseAddress, $0.count) }
        if let refusal {
            return .failed(status: refusal.status, reason: refusal.reason)
        }
        let errno = http_errno(rawValue: parser.pointee.http_errno)
        if complete {
            complete = false
            if errno == HPE_PAUSED { http_parser_pause(parser, 0) }
            // (after an upgrade, http-parser stops at the end of the head by itself)
            return .request(consumed: n)
        }
        if errno != HPE_OK {
            return .failed(status: 400, reason: String(cString: http_errno_description(errno)))
        }
        return .needMore
    }

    /// The request `parse` last reported.
    public func takeRequest() -> HTTPRequest? {
        defer { finished = nil }
        return finished
    }

    // MARK: http-parser callbacks (0 goes on, anything else stops the parse)

    private func count(_ n: Int) -> Bool {
        headerBytes += n
        if headerBytes > limits.maxHeaderBytes {
            refusal = (431, "the request line and headers are over \(limits.maxHeaderBytes) bytes")
            return false
        }
        return true
    }

    private func take(url at: UnsafePointer<CChar>?, _ n: Int) -> Int32 {
        guard count(n), let at else { return 1 }
        at.withMemoryRebound(to: UInt8.self, capacity: n) { target.append(contentsOf: UnsafeBufferPointer(start: $0, count: n)) }
        return 0
    }

    private func endField() -> Bool {
        guard inValue else { return true }
        guard headers.count < limits.maxHeaders else {
            refusal = (431, "a request may carry at most \(limits.maxHeaders) header fields")
            return false
        }
        headers.append((String(decoding: field, as: UTF8.self).lowercased(), String(decoding: value, as: UTF8.self).trimmingTrailingSpaces))
        field.removeAll(keepingCapacity: true)
        value.removeAll(keepingCapacity: true)
        inValue = false
        return true
    }

    private func take(field at: UnsafePointer<CChar>?, _ n: Int) -> Int32 {
        guard count(n), endField(), let at else { return 1 }
        at.withMemoryRebound(to: UInt8.self, capacity: n) { field.append(contentsOf: UnsafeBufferPointer(start: $0, count: n)) }
        return 0
    }

    private func take(value at: UnsafePointer<CChar>?, _ n: Int) -> Int32 {
        guard count(n), let at else { return 1 }
        inValue = true
        at.withMemoryRebound(to: UInt8.self, capacity: n) { value.append(contentsOf: UnsafeBufferPointer(start: $0, count: n)) }
        return 0
    }

    private func headersComplete() -> Int32 {
        guard endField() else { return -1 }
        guard parser.pointee.http_major == 1, parser.pointee.http_minor <= 1 else {
            refusal = (505, "only HTTP/1.0 and HTTP/1.1 are served here")
            return -1
        }
        if parser.pointee.content_length != UInt64.max, parser.pointee.content_length > UInt64(limits.maxBodyBytes) {
            refusal = (413, "a request body may be at most \(limits.maxBodyBytes) bytes")
            return -1
        }
        return 0
    }

    private func take(body at: UnsafePointer<CChar>?, _ n: Int) -> Int32 {
        guard body.count + n <= limits.maxBodyBytes else {
            refusal = (413, "a request body may be at most \(limits.maxBodyBytes) bytes")
            return 1
        }
        guard let at else { return 1 }
        at.withMemoryRebound(to: UInt8.self, capacity: n) { body.append(contentsOf: UnsafeBufferPointer(start: $0, count: n)) }
        return 0
    }

    private func messageComplete() -> Int32 {
        let method = String(cString: http_method_str(http_method(rawValue: parser.pointee.method)))
        finished = HTTPRequest(method: method, target: String(decoding: target, as: UTF8.self), headers: headers, body: body,
                               keepAlive: http_should_keep_alive(parser) != 0, isUpgrade: parser.pointee.upgrade != 0)
        target = []
        headers = []
        body = []
        headerBytes = 0
        // (chunked trailers end no header block: whatever of them is pending is dropped here,
        // not carried into the next request's headers)
        field = []
        value = []
        inValue = false
        complete = true
        // one request at a time: the connection answers it before the next is read
        if parser.pointee.upgrade == 0 { http_parser_pause(parser, 1) }
        return 0
    }
}

extension String {
    var trimmingTrailingSpaces: String {
        var s = Substring(self)
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return String(s)
    }
}
