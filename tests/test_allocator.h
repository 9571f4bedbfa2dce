/* SPDX-License-Identifier: MIT */
/*
 * test_allocator.h - a kve_allocator for the tests: it counts what it hands
 * out, fails on demand, and checks every size it is handed back.
 *
 *     talloc ta;
 *     talloc_init(&ta);
 *     o.allocator = &ta.a;                  any constructor's options
 *     talloc_fail_after(&ta, k);            the next k allocations succeed,
 *     ... call ...                          every later one fails
 *     talloc_fail_after(&ta, SIZE_MAX);     returns the allocations made
 *     ... free the objects ...
 *     talloc_check_empty(&ta);              every block back, with its size
 *
 * Invariants: each block carries a header (as aligned as malloc's blocks)
 * with a magic word and the size it was asked for; a release or a resize
 * whose old_size differs, or whose pointer this allocator never made,
 * counts as bad (and a foreign pointer is not touched). Allocation requests
 * of 0 bytes count as bad too: the library promises never to make them.
 * `made` counts successful allocations and resizes since the last arming,
 * exactly as the library's old failure hook did, so a walk k = 0, 1, 2, ...
 * reaches every allocation of a call. Nothing is global: each test (each
 * thread) owns its talloc, and blocks come from malloc, so ASan and
 * valgrind still see every one.
 */
#ifndef KVE_TEST_ALLOCATOR_H
#define KVE_TEST_ALLOCATOR_H

#include "kvevict.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct talloc {
    kve_allocator a; /* what the options point at: {talloc_fn, this} */
    size_t allowed;  /* successful allocations left before every one fails; SIZE_MAX: no limit */
    size_t made;     /* successful allocations and resizes since the last talloc_fail_after */
    size_t calls;    /* every call of the function, releases included, ever */
    size_t blocks;   /* live blocks */
    size_t bytes;    /* live bytes, as the library asked for them */
    size_t peak;     /* the most live bytes at once */
    size_t bad;      /* releases and resizes with a wrong size or pointer, requests of 0 */
} talloc;

enum { TALLOC_MAGIC = 0x6b76656d }; /* "kvem" */

typedef union talloc_header {
    struct {
        size_t size;
        unsigned magic;
    } h;
    max_align_t align;
} talloc_header;

static inline int talloc_take(talloc *t)
{
    if (t->allowed == 0)
        return 0;
    if (t->allowed != SIZE_MAX)
        t->allowed--;
    t->made++;
    return 1;
}

static inline void *talloc_fn(void *ud, void *ptr, size_t old_size, size_t new_size)
{
    talloc *t = ud;
    t->calls++;
    talloc_header *h = ptr ? (talloc_header *)ptr - 1 : NULL;
    if (h && (h->h.magic != TALLOC_MAGIC || h->h.size != old_size)) {
        t->bad++;
        if (h->h.magic != TALLOC_MAGIC)
            return NULL; /* not ours: leave it alone */
    }
    if (!h && old_size != 0)
        t->bad++;
    if (new_size == 0) {
        if (!h) {
            t->bad++; /* the library never frees NULL */
            return NULL;
        }
        t->blocks--;
        t->bytes -= h->h.size;
        h->h.magic = 0;
        free(h);
        return NULL;
    }
    if (!talloc_take(t))
        return NULL;
    size_t before = h ? h->h.size : 0;
    if (new_size > SIZE_MAX - sizeof *h)
        return NULL;
    talloc_header *n = realloc(h, sizeof *n + new_size);
    if (!n)
        return NULL;
    if (!h)
        t->blocks++;
    t->bytes += new_size - before;
    if (t->bytes > t->peak)
        t->peak = t->bytes;
    n->h.size = new_size;
    n->h.magic = TALLOC_MAGIC;
    return n + 1;
}

static inline void talloc_init(talloc *t)
{
    memset(t, 0, sizeof *t);
    t->a.fn = talloc_fn;
    t->a.ud = t;
    t->allowed = SIZE_MAX;
}

/* The old hook's contract: after k more successful allocations every one
 * fails, until re-armed with SIZE_MAX. Returns the allocations made since
 * the previous call. */
static inline size_t talloc_fail_after(talloc *t, size_t k)
{
    size_t n = t->made;
    t->made = 0;
    t->allowed = k;
    return n;
}

/* Every block came back, each with the size it was allocated with. */
#define talloc_check_empty(t)                                                                      \
    do {                                                                                           \
        ASSERT_EQ((t)->blocks, 0);                                                                 \
        ASSERT_EQ((t)->bytes, 0);                                                                  \
        ASSERT_EQ((t)->bad, 0);                                                                    \
    } while (0)

#endif /* KVE_TEST_ALLOCATOR_H */
