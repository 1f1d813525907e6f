#ifndef PRESENCED_CSYSTEMSHIM_H
#define PRESENCED_CSYSTEMSHIM_H
/* Swift's Glibc module does not expose epoll, eventfd or timerfd: this header makes them visible,
   plus a few socket helpers whose macros Swift cannot import. */
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>

/* epoll_event is packed on x86_64, which Swift imports awkwardly: these accessors hide that. */
static inline uint32_t cshim_epoll_event_events(const struct epoll_event *e) { return e->events; }
static inline uint64_t cshim_epoll_event_u64(const struct epoll_event *e) { return e->data.u64; }
static inline struct epoll_event cshim_epoll_event_make(uint32_t events, uint64_t u64) {
    struct epoll_event e; e.events = events; e.data.u64 = u64; return e;
}
static inline size_t cshim_epoll_event_size(void) { return sizeof(struct epoll_event); }

/* Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the new soft limit. */
static inline long cshim_raise_nofile_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
    return (long)rl.rlim_cur;
}
/* accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC (needs _GNU_SOURCE, so it lives in shim.c). */
int cshim_accept_nonblocking(int listener);

/* An allocator with nghttp2_mem's signatures (pages.c): blocks of 4-32 KiB come from lazily
   zeroed pages of large anonymous mappings, so an idle connection's untouched buffers stay out of
   resident memory; everything else goes to glibc. Thread-safe. */
void *cshim_pages_malloc(size_t size, void *user);
void *cshim_pages_calloc(size_t count, size_t size, void *user);
void cshim_pages_free(void *p, void *user);
void *cshim_pages_realloc(void *p, size_t size, void *user);
/* 0 under AddressSanitizer, or on a kernel whose pages are not 4 KiB: every request then goes to malloc. */
int cshim_pages_enabled(void);

/* One nghttp2 session's view of the allocator, passed as its nghttp2_mem's mem_user_data.
   Between cshim_pages_session_begin and _end (around nghttp2_session_*_new3) the allocator notes
   the page block of 4 pages or more the session takes: nghttp2's outbound frame buffer, whose
   first chunk the session keeps for its whole life and whose bytes are dead between frames. */
struct cshim_pages_session {
    void *frame_buffer;        /* that block, or NULL (freed, or the allocator is off) */
    size_t frame_buffer_bytes; /* its size in pages times the page size */
    int recording;
};
void cshim_pages_session_begin(struct cshim_pages_session *s);
void cshim_pages_session_end(struct cshim_pages_session *s);
/* Gives the frame buffer's pages back to the kernel (they read as zeros and are not resident
   until written again); returns the bytes released (0 when there is no such block). Only when the
   session has nothing to send (nghttp2_session_want_write is 0), so no frame is half written. */
size_t cshim_pages_session_release(struct cshim_pages_session *s);
#endif
