#ifndef PRESENCED_CWSLAY_SHIM_H
#define PRESENCED_CWSLAY_SHIM_H
// Debian's libwslay-dev (by the author of nghttp2): WebSocket framing, masking, fragmentation,
// ping/pong and the closing handshake (RFC 6455) for the front door. No pkg-config file: linked by name.
#include <sys/types.h>
#include <wslay/wslay.h>
#endif
