import CTLS
import Synchronization

/// Where one TLS endpoint finds its certificate, key and trusted CA (PEM files).
public struct TLSConfiguration: Sendable, Equatable {
    /// This endpoint's certificate chain (leaf first). Required on a server; on a client, the
    /// certificate it presents when the server asks for one (mutual TLS).
    public var certificateFile: String?
    public var privateKeyFile: String?
    /// CA certificates the other side's certificate must chain to. On a server: when set, a
    /// client must present a certificate from one of them or the handshake fails (mutual TLS).
    /// On a client: the server's certificate must chain to them (nil: the system's trust store).
    public var trustedCAFile: String?
    /// Client only: the name the server's certificate must carry, also sent as SNI. Nil checks
    /// the chain alone: right for a cluster's own CA, where every certificate it signed is a
    /// cluster member whatever address it answers on.
    public var serverName: String?

    public init(certificateFile: String? = nil, privateKeyFile: String? = nil, trustedCAFile: String? = nil, serverName: String? = nil) {
        self.certificateFile = certificateFile
        self.privateKeyFile = privateKeyFile
        self.trustedCAFile = trustedCAFile
        self.serverName = serverName
    }
}

/// A TLS set-up that failed (unreadable file, key that does not match, ...), with OpenSSL's reason.
public struct TLSError: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ what: String) {
        var text = what
        var codes: [String] = []
        while case let e = ERR_get_error(), e != 0 {
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(e, &buffer, buffer.count)
            codes.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        if !codes.isEmpty { text += ": " + codes.joined(separator: "; ") }
        description = text
    }
}

/// One OpenSSL `SSL_CTX` built from a `TLSConfiguration`: TLS 1.2 or later, ALPN `h2`.
///
/// `@unchecked Sendable`: the context is configured completely in `init` and never changed
/// after; OpenSSL allows creating connections (`SSL_new`) from one context on any thread.
public final class TLSContext: @unchecked Sendable {
    let context: OpaquePointer
    let isServer: Bool
    public let configuration: TLSConfiguration

    public init(_ configuration: TLSConfiguration, server: Bool) throws {
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()) else { throw TLSError("cannot create a TLS context") }
        context = ctx
        isServer = server
        self.configuration = configuration
        _ = presenced_ssl_ctx_min_tls12(ctx)
        _ = presenced_ssl_ctx_set_mode(ctx, presenced_ssl_mode_release_buffers())  // idle connections keep no 34 KiB of record buffers
        if let cert = configuration.certificateFile {
            guard SSL_CTX_use_certificate_chain_file(ctx, cert) == 1 else { throw TLSError("cannot read the certificate \(cert)") }
            guard let key = configuration.privateKeyFile else { throw TLSError("a certificate needs its private key file") }
            guard SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1 else { throw TLSError("cannot read the private key \(key)") }
            guard SSL_CTX_check_private_key(ctx) == 1 else { throw TLSError("the private key \(key) does not match the certificate \(cert)") }
        } else if server {
            throw TLSError("a TLS server needs a certificate file")
        }
        if let ca = configuration.trustedCAFile {
            guard SSL_CTX_load_verify_locations(ctx, ca, nil) == 1 else { throw TLSError("cannot read the CA file \(ca)") }
        }
        if server {
            _ = presenced_ssl_ctx_session_cache_off(ctx)
            if let ca = configuration.trustedCAFile {
                if let names = SSL_load_client_CA_file(ca) { SSL_CTX_set_client_CA_list(ctx, names) }
                SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nil)
            }
            SSL_CTX_set_alpn_select_cb(ctx, { _, out, outlen, offered, offeredLength, _ in
                // The client offers its protocols; we speak only h2 (gRPC requires it).
                var selected: UnsafeMutablePointer<UInt8>? = nil
                var length: UInt8 = 0
                let rc = SSL_select_next_proto(&selected, &length, TLSContext.alpnH2, 3, offered, offeredLength)
                guard rc == OPENSSL_NPN_NEGOTIATED, let selected else { return SSL_TLSEXT_ERR_ALERT_FATAL }
                out?.pointee = UnsafePointer(selected)
                outlen?.pointee = length
                return SSL_TLSEXT_ERR_OK
            }, nil)
        } else {
            if configuration.trustedCAFile == nil { SSL_CTX_set_default_verify_paths(ctx) }
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
            guard SSL_CTX_set_alpn_protos(ctx, TLSContext.alpnH2, 3) == 0 else { throw TLSError("cannot set ALPN") }
        }
    }

    deinit { SSL_CTX_free(context) }

    /// ALPN's wire form of "h2". `nonisolated(unsafe)`: written once here, only read after.
    nonisolated(unsafe) static let alpnH2: UnsafeMutablePointer<UInt8> = {
        let p = UnsafeMutablePointer<UInt8>.allocate(capacity: 3)
        p[0] = 2; p[1] = UInt8(ascii: "h"); p[2] = UInt8(ascii: "2")
        return p
    }()
}

/// The TLS context an endpoint uses now; `reload()` re-reads the files (SIGHUP), and connections
/// made after it use the new certificate while those already open keep theirs.
public final class TLSContextSource: Sendable {
    private let current: Mutex<TLSContext>
    public let configuration: TLSConfiguration
    public let isServer: Bool

    public init(_ configuration: TLSConfiguration, server: Bool) throws {
        self.configuration = configuration
        isServer = server
        current = Mutex(try TLSContext(configuration, server: server))
    }

    public var context: TLSContext { current.withLock { $0 } }

    /// Reads the files again. On failure the context in use stays, and the error says why.
    public func reload() throws {
        let fresh = try TLSContext(configuration, server: isServer)
        current.withLock { $0 = fresh }
    }
}

/// TLS for one connection over memory BIOs: ciphertext from the socket goes in, plaintext comes
/// out for nghttp2, and nghttp2's output comes back as ciphertext for the socket. The socket I/O
/// stays the connection's own (non-blocking, epoll); OpenSSL never touches the file descriptor.
/// Loop-confined, like its connection.
final class TLSPipe {
    enum Received: Equatable {
        case more
        /// The other side ended TLS (close_notify).
        case closed
        case failed(String)
    }

    private let ssl: OpaquePointer
    private let incoming: OpaquePointer
    private let outgoing: OpaquePointer
    private let isServer: Bool
    private let context: TLSContext   // kept alive while the connection uses it
    /// Plaintext written before the handshake finished (nghttp2's preface and SETTINGS).
    private var early: [UInt8] = []
    private(set) var handshakeDone = false

    init?(context: TLSContext) {
        guard let ssl = SSL_new(context.context) else { return nil }
        guard let r = BIO_new(BIO_s_mem()), let w = BIO_new(BIO_s_mem()) else {
            SSL_free(ssl)
            return nil
        }
        _ = presenced_bio_mem_retry_when_empty(r)
        SSL_set_bio(ssl, r, w)   // the SSL owns both BIOs from here
        self.ssl = ssl
        incoming = r
        outgoing = w
        isServer = context.isServer
        self.context = context
        if isServer {
            SSL_set_accept_state(ssl)
        } else {
            SSL_set_connect_state(ssl)
            if let name = context.configuration.serverName {
                _ = presenced_ssl_set_tlsext_host_name(ssl, name)
                _ = SSL_set1_host(ssl, name)
            }
        }
    }

    deinit { SSL_free(ssl) }

    /// Client: produces the ClientHello (taken with `takeOutput`).
    func startHandshake() {
        ERR_clear_error()
        _ = SSL_do_handshake(ssl)
    }

    /// Ciphertext read from the socket. Plaintext is decrypted into `scratch` (which may be the
    /// buffer `bytes` came in: it is copied into OpenSSL first) and handed to `deliver`, which
    /// returns false to stop (the connection closed).
    func receive(_ bytes: UnsafePointer<UInt8>, count: Int, scratch: UnsafeMutablePointer<UInt8>, scratchSize: Int,
                 deliver: (UnsafePointer<UInt8>, Int) -> Bool) -> Received {
        var offset = 0
        while offset < count {
            let n = BIO_write(incoming, bytes + offset, Int32(min(count - offset, Int(Int32.max))))
            guard n > 0 else { return .failed("TLS: cannot buffer input") }
            offset += Int(n)
        }
        while true {
            // (before every call: `deliver` runs nghttp2's callbacks, and what they do with
            // libcrypto, or a write, may leave errors that SSL_get_error would report as ours)
            ERR_clear_error()
            let n = SSL_read(ssl, scratch, Int32(min(scratchSize, Int(Int32.max))))
            // (read the outcome before anything else uses the SSL: the early write below would
            // replace what SSL_get_error reports)
            let code = n > 0 ? SSL_ERROR_NONE : SSL_get_error(ssl, n)
            if !handshakeDone && SSL_is_init_finished(ssl) == 1 {
                if let problem = handshakeFinished() { return .failed(problem) }
            }
            if n > 0 {
                if !deliver(scratch, Int(n)) { return .more }
                continue
            }
            switch code {
            case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
                return .more
            case SSL_ERROR_ZERO_RETURN:
                return .closed
            default:
                return .failed(TLSError(handshakeDone ? "TLS error \(code)" : "TLS handshake failed (\(code))").description)
            }
        }
    }

    private func handshakeFinished() -> String? {
        handshakeDone = true
        if !isServer {
            // gRPC runs over HTTP/2 only: a server that did not pick h2 cannot be talked to
            var proto: UnsafePointer<UInt8>? = nil
            var length: UInt32 = 0
            SSL_get0_alpn_selected(ssl, &proto, &length)
            guard let proto, length == 2, proto[0] == UInt8(ascii: "h"), proto[1] == UInt8(ascii: "2") else {
                return "TLS: the server did not agree to HTTP/2 (ALPN h2)"
            }
        }
        if !early.isEmpty {
            let pending = early
            early = []
            if let problem = pending.withUnsafeBufferPointer({ send($0.baseAddress!, count: $0.count) }) { return problem }
        }
        return nil
    }

    /// Plaintext to send: encrypted now, or held until the handshake is done. Nil, or why not.
    func send(_ bytes: UnsafePointer<UInt8>, count: Int) -> String? {
        guard count > 0 else { return nil }
        guard handshakeDone else {
            early.append(contentsOf: UnsafeBufferPointer(start: bytes, count: count))
            return nil
        }
        var offset = 0
        while offset < count {
            ERR_clear_error()
            let n = SSL_write(ssl, bytes + offset, Int32(min(count - offset, 1 << 30)))
            guard n > 0 else { return TLSError("TLS write failed").description }
            offset += Int(n)
        }
        return nil
    }

    /// Appends the ciphertext waiting for the socket.
    func takeOutput(into buffer: inout [UInt8]) {
        let pending = Int(BIO_ctrl_pending(outgoing))
        guard pending > 0 else { return }
        let start = buffer.count
        buffer.append(contentsOf: repeatElement(0, count: pending))
        let n = buffer.withUnsafeMutableBytes { raw in BIO_read(outgoing, raw.baseAddress! + start, Int32(pending)) }
        buffer.removeLast(pending - max(0, Int(n)))
    }
}
