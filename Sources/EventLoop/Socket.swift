import CSystemShim
import Glibc

/// A `HOST:PORT` pair as given on a command line (`127.0.0.1:7400`, `[::1]:7400`, `localhost:7400`).
public struct HostPort: Hashable, Sendable, CustomStringConvertible {
    public var host: String
    public var port: UInt16

    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    /// Parses `HOST:PORT`; nil when it is not of that form or the port is not 0...65535.
    public init?(parsing text: String) {
        var host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else { return nil }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":") else { return nil }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
            if host.contains(":") { return nil }
        }
        guard !host.isEmpty, let port = UInt16(portText) else { return nil }
        self.host = String(host)
        self.port = port
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// Errors from socket calls, with the call's name and errno.
public struct SocketError: Error, CustomStringConvertible {
    public let call: String
    public let code: Int32
    public init(_ call: String, _ code: Int32 = errno) {
        self.call = call
        self.code = code
    }
    public var description: String { "\(call): \(String(cString: strerror(code)))" }
}

/// Thin, non-blocking wrappers over the BSD socket calls.
public enum Sockets {
    /// Resolves `address` to socket addresses (numeric hosts need no lookup).
    static func resolve(_ address: HostPort) throws -> [(family: Int32, storage: sockaddr_storage, length: socklen_t)] {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_ADDRCONFIG
        var result: UnsafeMutablePointer<addrinfo>?
        let rc = getaddrinfo(address.host, String(address.port), &hints, &result)
        guard rc == 0, let first = result else { throw SocketError("getaddrinfo(\(address.host))", rc) }
        defer { freeaddrinfo(first) }
        var out: [(Int32, sockaddr_storage, socklen_t)] = []
        var p: UnsafeMutablePointer<addrinfo>? = first
        while let ai = p {
            var storage = sockaddr_storage()
            withUnsafeMutableBytes(of: &storage) { dst in
                dst.copyMemory(from: UnsafeRawBufferPointer(start: ai.pointee.ai_addr, count: Int(ai.pointee.ai_addrlen)))
            }
            out.append((ai.pointee.ai_family, storage, ai.pointee.ai_addrlen))
            p = ai.pointee.ai_next
        }
        return out
    }

    /// A non-blocking listening socket; with `reusePort`, several may share one port (the kernel
    /// spreads connections over them).
    public static func listen(on address: HostPort, reusePort: Bool, backlog: Int32 = 4096) throws -> Int32 {
        var lastError = SocketError("bind(\(address))", EADDRNOTAVAIL)
        for var target in try resolve(address) {
            let fd = socket(target.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { throw SocketError("socket") }
            var one: Int32 = 1
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
            if reusePort { setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, socklen_t(MemoryLayout<Int32>.size)) }
            let ok = withUnsafePointer(to: &target.storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, target.length) }
            }
            if ok != 0 {
                lastError = SocketError("bind(\(address))")
                close(fd)
                continue
            }
            guard Glibc.listen(fd, backlog) == 0 else {
                lastError = SocketError("listen(\(address))")
                close(fd)
                continue
            }
            return fd
        }
        throw lastError
    }

    /// The port a socket is bound to (to learn the port after binding port 0).
    public static func localPort(of fd: Int32) -> UInt16 {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        return withUnsafeBytes(of: &storage) { raw in
            // sin_port and sin6_port sit at the same offset, in network order
            UInt16(bigEndian: raw.load(fromByteOffset: 2, as: UInt16.self))
        }
    }

    /// Accepts one connection, non-blocking; nil when none is waiting.
    public static func accept(_ listener: Int32) throws -> Int32? {
        let fd = cshim_accept_nonblocking(listener)
        if fd >= 0 {
            setNoDelay(fd)
            return fd
        }
        switch errno {
        case EAGAIN, EWOULDBLOCK, EINTR, ECONNABORTED: return nil
        case EMFILE, ENFILE, ENOBUFS, ENOMEM: throw SocketError("accept")
        default: return nil
        }
    }

    /// Starts a non-blocking connect; the socket becomes writable when it completes.
    public static func connect(to address: HostPort) throws -> Int32 {
        var lastError = SocketError("connect(\(address))", ECONNREFUSED)
        for var target in try resolve(address) {
            let fd = socket(target.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { throw SocketError("socket") }
            setNoDelay(fd)
            let rc = withUnsafePointer(to: &target.storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, target.length) }
            }
            if rc == 0 || errno == EINPROGRESS { return fd }
            lastError = SocketError("connect(\(address))")
            close(fd)
        }
        throw lastError
    }

    /// The pending error of a socket (for a finished non-blocking connect), 0 when none.
    public static func pendingError(_ fd: Int32) -> Int32 {
        var err: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)
        return err
    }

    static func setNoDelay(_ fd: Int32) {
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    /// Raises the open-file limit to its hard limit (many client connections need many fds).
    @discardableResult
    public static func raiseOpenFileLimit() -> Int {
        Int(cshim_raise_nofile_limit())
    }
}
