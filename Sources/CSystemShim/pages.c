/* A page allocator for nghttp2's large allocations (see cshim_pages_* in CSystemShim.h).
 *
 * nghttp2 callocs 4 KiB of stream-map buckets and a 16 KiB outbound frame buffer for every session;
 * through glibc both are carved from the heap and the buckets are zeroed at once, so an idle
 * connection keeps ~13 KiB resident. Here blocks of one to eight pages come from large anonymous
 * mappings, whose pages stay out of resident memory until written (fresh pages read as zeros, so
 * calloc needs no memset). A freed block is given back with MADV_DONTNEED (zero again, not resident)
 * and kept on its size's free stack. Smaller requests, larger ones and reallocations of blocks that
 * glibc made go to glibc. One mutex, for taking and giving back blocks: that happens per
 * connection, not per request. Telling whose a freed pointer is needs no lock (nghttp2 frees
 * several small allocations per request, on every loop): arenas are only ever added, each
 * published by a release store of the count after its fields are set. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "CSystemShim.h"

#define PAGE 4096u
#define MAX_PAGES 8u
#define ARENA_BYTES ((size_t)64 << 20)
#define MAX_ARENAS 128u

struct arena { char *base; char *next; unsigned pages; };
struct stack { void **items; size_t count, cap; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct arena arenas[MAX_ARENAS];
static unsigned arena_count;   /* written under `lock` (release), read without it (acquire) */
static int current[MAX_PAGES + 1] = { -1, -1, -1, -1, -1, -1, -1, -1, -1 };
static struct stack free_blocks[MAX_PAGES + 1];

/* The arena holding p, or NULL (p came from glibc). Needs no lock: an arena's base never changes. */
static struct arena *owner(const void *p) {
    unsigned count = __atomic_load_n(&arena_count, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < count; i++) {
        if ((const char *)p >= arenas[i].base && (const char *)p < arenas[i].base + ARENA_BYTES) return &arenas[i];
    }
    return NULL;
}

/* A zeroed block of `pages` pages, or NULL when no more address space may be taken. Locked. */
static void *take(unsigned pages) {
    struct stack *s = &free_blocks[pages];
    if (s->count > 0) return s->items[--s->count];
    int a = current[pages];
    if (a < 0 || arenas[a].next + (size_t)pages * PAGE > arenas[a].base + ARENA_BYTES) {
        if (arena_count == MAX_ARENAS) return NULL;
        void *m = mmap(NULL, ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return NULL;
        a = (int)arena_count;
        arenas[a] = (struct arena){ (char *)m, (char *)m, pages };
        __atomic_store_n(&arena_count, arena_count + 1, __ATOMIC_RELEASE);
        current[pages] = a;
    }
    void *block = arenas[a].next;
    arenas[a].next += (size_t)pages * PAGE;
    return block;
}

#if defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define PAGES_UNDER_ASAN 1
#  endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#  define PAGES_UNDER_ASAN 1
#endif

/* Blocks are carved in 4 KiB pages: on a kernel with larger pages, madvise would round a block's
   range up and zero its neighbours, so there the allocator steps aside. */
static int page_size_is_4k(void) {
    static int known = -1;   /* (every thread computes the same answer) */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k < 0) {
        k = sysconf(_SC_PAGESIZE) == (long)PAGE;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k;
}

static void *pages_alloc(size_t size) {
#ifdef PAGES_UNDER_ASAN
    (void)size;
    return NULL;   /* under AddressSanitizer everything goes to its malloc, which checks each access */
#endif
    if (!page_size_is_4k()) return NULL;
    if (size < PAGE || size > (size_t)MAX_PAGES * PAGE) return NULL;
    unsigned pages = (unsigned)((size + PAGE - 1) / PAGE);
    pthread_mutex_lock(&lock);
    void *p = take(pages);
    pthread_mutex_unlock(&lock);
    return p;
}

int cshim_pages_enabled(void) {
#ifdef PAGES_UNDER_ASAN
    return 0;
#else
    return page_size_is_4k();
#endif
}

/* Notes a block taken while its session is being created, if it is the frame buffer's size. */
static void note(void *p, size_t size, void *user) {
    struct cshim_pages_session *s = user;
    if (s == NULL || !s->recording || p == NULL || size < 4 * PAGE || s->frame_buffer != NULL) return;
    s->frame_buffer = p;
    s->frame_buffer_bytes = (size + PAGE - 1) / PAGE * PAGE;
}

void *cshim_pages_malloc(size_t size, void *user) {
    void *p = pages_alloc(size);
    note(p, size, user);
    return p ? p : malloc(size);
}

void *cshim_pages_calloc(size_t count, size_t size, void *user) {
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) return NULL;
    void *p = pages_alloc(total);   /* fresh or given-back pages read as zeros */
    note(p, total, user);
    return p ? p : calloc(count, size);
}

void cshim_pages_session_begin(struct cshim_pages_session *s) {
    s->frame_buffer = NULL;
    s->frame_buffer_bytes = 0;
    s->recording = 1;
}

void cshim_pages_session_end(struct cshim_pages_session *s) { s->recording = 0; }

size_t cshim_pages_session_release(struct cshim_pages_session *s) {
    if (s == NULL || s->frame_buffer == NULL) return 0;
    madvise(s->frame_buffer, s->frame_buffer_bytes, MADV_DONTNEED);
    return s->frame_buffer_bytes;
}

void cshim_pages_free(void *p, void *user) {
    if (p == NULL) return;
    struct cshim_pages_session *session = user;
    if (session != NULL && session->frame_buffer == p) session->frame_buffer = NULL;
    struct arena *a = owner(p);
    if (a == NULL) {
        free(p);
        return;
    }
    pthread_mutex_lock(&lock);
    madvise(p, (size_t)a->pages * PAGE, MADV_DONTNEED);
    struct stack *s = &free_blocks[a->pages];
    if (s->count == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        void **items = realloc(s->items, cap * sizeof(void *));
        if (items == NULL) {   /* keep the block out of use rather than lose track of it */
            pthread_mutex_unlock(&lock);
            return;
        }
        s->items = items;
        s->cap = cap;
    }
    s->items[s->count++] = p;
    pthread_mutex_unlock(&lock);
}

void *cshim_pages_realloc(void *p, size_t size, void *user) {
    if (p == NULL) return cshim_pages_malloc(size, user);
    struct arena *a = owner(p);
    size_t have = a ? (size_t)a->pages * PAGE : 0;
    if (a == NULL) return realloc(p, size);
    if (size <= have && size >= PAGE) return p;
    void *q = cshim_pages_malloc(size, user);
    if (q == NULL) return NULL;
    memcpy(q, p, size < have ? size : have);
    cshim_pages_free(p, user);
    return q;
}
