#define _GNU_SOURCE
#include <sys/socket.h>
#include "CSystemShim.h"

int cshim_accept_nonblocking(int listener) {
    return accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
}
