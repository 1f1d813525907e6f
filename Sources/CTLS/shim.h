#ifndef PRESENCED_CTLS_SHIM_H
#define PRESENCED_CTLS_SHIM_H
// OpenSSL's libssl (Debian's libssl-dev) for TLS on the client and peer ports. Several of its
// settings are macros over SSL_CTX_ctrl, which Swift cannot call: small inline wrappers below.
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

static inline int presenced_ssl_ctx_min_tls12(SSL_CTX *ctx) {
    return (int)SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
}
static inline long presenced_ssl_ctx_set_mode(SSL_CTX *ctx, long mode) {
    return SSL_CTX_set_mode(ctx, mode);
}
static inline long presenced_ssl_mode_partial_write(void) { return SSL_MODE_ENABLE_PARTIAL_WRITE; }
static inline long presenced_ssl_mode_release_buffers(void) { return SSL_MODE_RELEASE_BUFFERS; }
static inline int presenced_ssl_set_tlsext_host_name(SSL *ssl, const char *name) {
    return (int)SSL_set_tlsext_host_name(ssl, name);
}
static inline long presenced_ssl_ctx_session_cache_off(SSL_CTX *ctx) {
    return SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
}
// An empty memory BIO asks to retry (the socket has not delivered more yet) instead of
// reporting the end of the stream.
static inline long presenced_bio_mem_retry_when_empty(BIO *bio) {
    return BIO_set_mem_eof_return(bio, -1);
}
#endif
