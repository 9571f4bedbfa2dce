/* SPDX-License-Identifier: MIT */
/*
 * trace.c - the public kve_trace entry points: argument checks, and dispatch
 * through the table of trace sources (trace_impl.h).
 *
 * Invariants: every public function validates its arguments once here, so
 * the sources' row functions see only in-range heads and steps, and rows
 * and keys only buffers that hold them. Every byte of a trace is a block
 * on its list (below), returned to its allocator with its size. A source
 * text selects the first source whose prefix it is followed by nothing or
 * ':' ("canonical", "canonical:steps=100"); any other text is a path for
 * the fallback source (a file called "canonical" is opened as
 * "./canonical"; "memory" and "callback" name the traces
 * kve_trace_from_memory and kve_trace_from_callback make, which no text
 * opens). What a row of recorded attention must be, for every
 * source that reads one, is defined once here (kve__trace_check_row).
 */
#include "trace_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const double SUM_TOLERANCE = 1e-3;

/* ---- memory: the blocks a trace owns ---- */

/* A block's header, as aligned as malloc's blocks so the bytes after it are
 * too: the neighbours on its trace's list and the size asked for. */
struct kve__block {
    union {
        struct {
            kve__block *prev, *next;
            size_t bytes; /* the allocation, header included */
        } h;
        max_align_t align; /* cppcheck-suppress unusedStructMember ; only its alignment is used */
    } u;
};

void *kve__trace_malloc(kve_trace *tr, size_t n)
{
    if (n > SIZE_MAX - sizeof(kve__block))
        return NULL;
    kve__block *b = kve__alloc(&tr->alloc, sizeof *b + n);
    if (!b)
        return NULL;
    b->u.h.bytes = sizeof *b + n;
    b->u.h.prev = NULL;
    b->u.h.next = tr->blocks;
    if (tr->blocks)
        tr->blocks->u.h.prev = b;
    tr->blocks = b;
    return b + 1;
}

void *kve__trace_calloc(kve_trace *tr, size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *p = kve__trace_malloc(tr, count * size);
    if (p)
        memset(p, 0, count * size);
    return p;
}

void kve__trace_free(kve_trace *tr, void *p)
{
    if (!p)
        return;
    kve__block *b = (kve__block *)p - 1;
    if (b->u.h.prev)
        b->u.h.prev->u.h.next = b->u.h.next;
    else
        tr->blocks = b->u.h.next;
    if (b->u.h.next)
        b->u.h.next->u.h.prev = b->u.h.prev;
    kve__dealloc(&tr->alloc, b, b->u.h.bytes);
}

kve_trace_options kve_trace_default_options(void)
{
    kve_trace_options o = {.allocator = NULL, .flags = KVE_TRACE_NONE, .progress = NULL,
                           .user = NULL};
    return o;
}

kve_status kve__trace_check_options(const kve_trace_options *options, const char *what)
{
    kve_status st = kve__check_core();
    if (st != KVE_OK)
        return st;
    const unsigned flags = options ? (unsigned)options->flags : 0;
    if (flags & ~(unsigned)KVE_TRACE_NORMALIZE)
        return kve__fail(KVE_EINVAL, "%strace flags 0x%x: only KVE_TRACE_NORMALIZE (0x1) is "
                         "defined", what, flags);
    return KVE_OK;
}

kve_status kve__trace_new(const kve_trace_options *options, const char *what, kve_trace **out)
{
    kve_status st = kve__trace_check_options(options, what);
    if (st != KVE_OK)
        return st;
    const kve_trace_options o = options ? *options : kve_trace_default_options();
    const kve_allocator alloc = kve__allocator(o.allocator);
    kve_trace *tr = kve__alloc_zero(&alloc, sizeof *tr);
    if (!tr)
        return kve__fail(KVE_ENOMEM, "%sout of memory for the trace handle", what);
    tr->alloc = alloc;
    *out = tr;
    return KVE_OK;
}

void kve__trace_discard(kve_trace *tr)
{
    while (tr->blocks)
        kve__trace_free(tr, tr->blocks + 1);
    const kve_allocator alloc = tr->alloc;
    kve__dealloc(&alloc, tr, sizeof *tr);
}

/* "head h", or "head h (layer l, head j)" when the trace has layers. */
static const char *head_name(size_t heads, size_t layers, size_t h, char *out, size_t cap)
{
    if (layers > 1)
        snprintf(out, cap, "head %zu (layer %zu, head %zu)", h, h / (heads / layers),
                 h % (heads / layers));
    else
        snprintf(out, cap, "head %zu", h);
    return out;
}

kve_status kve__trace_check_row(const char *what, size_t heads, size_t layers, unsigned flags,
                                size_t h, size_t t, const double *row, double *sum)
{
    char name[96];
    double s = 0;
    for (size_t i = 0; i <= t; i++) {
        double w = row[i];
        if (!isfinite(w) || w < 0)
            return kve__fail(KVE_EFORMAT, "%s: %s, row %zu: weight at key %zu is %g (want finite "
                             "and >= 0)", what, head_name(heads, layers, h, name, sizeof name),
                             t, i, w);
        s += w;
    }
    if (flags & KVE_TRACE_NORMALIZE) {
        if (!(s > 0) || !isfinite(s))
            return kve__fail(KVE_EFORMAT, "%s: %s, row %zu: %s, cannot normalise", what,
                             head_name(heads, layers, h, name, sizeof name), t,
                             s > 0 ? "sum overflows" : "all weights over [0, t] are zero");
    } else if (t >= 1 && !(fabs(s - 1.0) <= SUM_TOLERANCE)) {
        return kve__fail(KVE_EFORMAT, "%s: %s, row %zu sums to %.9g over keys [0, %zu], not 1 "
                         "(tolerance 1e-3); to rescale rows, pass KVE_TRACE_NORMALIZE", what,
                         head_name(heads, layers, h, name, sizeof name), t, s, t);
    }
    *sum = s;
    return KVE_OK;
}

/* The sources in the order they are tried; the fallback (prefix NULL) last. */
static const kve_trace_source_type *const sources[] = {
    &kve__canonical_source,
    &kve__qk_source,
    &kve__memory_source,
    &kve__callback_source,
    &kve__npy_source,
};
enum { N_SOURCES = sizeof sources / sizeof sources[0] };

kve_status kve_trace_open(const char *src, const kve_trace_options *options, kve_trace **out)
{
    if (!src)
        return kve__fail(KVE_EINVAL, "trace source is NULL");
    if (*src == '\0')
        return kve__fail(KVE_EINVAL, "trace source is empty");
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    const kve_trace_source_type *type = sources[N_SOURCES - 1];
    const char *arg = src;
    for (size_t i = 0; i + 1 < N_SOURCES; i++) {
        size_t n = strlen(sources[i]->prefix);
        if (strncmp(src, sources[i]->prefix, n) == 0 && (src[n] == '\0' || src[n] == ':')) {
            type = sources[i];
            arg = src[n] == ':' ? src + n + 1 : NULL;
            break;
        }
    }
    kve_trace *tr;
    kve_status st = kve__trace_new(options, "", &tr);
    if (st != KVE_OK)
        return st;
    const kve_trace_options o = options ? *options : kve_trace_default_options();
    if (!type->open) /* a source made by a constructor, never by text */
        st = kve__fail(KVE_EINVAL, "%s: %s, not opened by name (a file called %s opens as ./%s)",
                       type->prefix, type->made_by, type->prefix, type->prefix);
    else
        st = type->open(arg, (unsigned)o.flags, o.progress, o.user, tr);
    if (st != KVE_OK) {
        kve__trace_discard(tr);
        return st;
    }
    tr->type = type;
    *out = tr;
    return KVE_OK;
}

void kve_trace_free(kve_trace *tr)
{
    if (!tr)
        return;
    if (tr->type->free)
        tr->type->free(tr->impl);
    kve__trace_discard(tr);
}

size_t kve_trace_steps(const kve_trace *tr)
{
    return tr ? tr->steps : 0;
}

size_t kve_trace_heads(const kve_trace *tr)
{
    return tr ? tr->heads : 0;
}

size_t kve_trace_layers(const kve_trace *tr)
{
    return tr ? tr->layers : 0;
}

const char *kve_trace_source(const kve_trace *tr)
{
    return tr ? tr->source : NULL;
}

size_t kve_trace_key_dim(const kve_trace *tr)
{
    return tr ? tr->key_dim : 0;
}

uint64_t kve_trace_npy_bytes(const kve_trace *tr)
{
    return tr ? kve__npy_bytes(tr->steps) : 0;
}

static kve_status check_head(const kve_trace *tr, size_t head)
{
    if (head >= tr->heads)
        return kve__fail(KVE_EINVAL, "head %zu is out of range (the trace has %zu heads)", head,
                         tr->heads);
    return KVE_OK;
}

/* The checks of a read at (head, t) into `out`, named `what`. */
static kve_status check_read(const kve_trace *tr, size_t head, size_t t, const void *out,
                             const char *what)
{
    if (!tr)
        return kve__fail(KVE_EINVAL, "trace is NULL");
    if (!out)
        return kve__fail(KVE_EINVAL, "%s is NULL", what);
    kve_status st = check_head(tr, head);
    if (st != KVE_OK)
        return st;
    if (t >= tr->steps)
        return kve__fail(KVE_EINVAL, "step %zu is out of range (the trace has %zu steps)", t,
                         tr->steps);
    return KVE_OK;
}

kve_status kve_trace_row(kve_trace *tr, size_t head, size_t t, double *row, size_t cap)
{
    kve_status st = check_read(tr, head, t, row, "row");
    if (st == KVE_OK && cap <= t)
        st = kve__fail(KVE_ERANGE, "row %zu has %zu weights, but the buffer holds %zu", t, t + 1,
                       cap);
    return st == KVE_OK ? tr->type->row(tr->impl, head, t, row) : st;
}

kve_status kve_trace_key(kve_trace *tr, size_t head, size_t t, float *key, size_t cap)
{
    kve_status st = check_read(tr, head, t, key, "key");
    if (st == KVE_OK && !tr->key_dim)
        st = kve__fail(KVE_EINVAL, "trace %s has no keys (a q/K trace has: qk:PATH)",
                       tr->source);
    if (st == KVE_OK && cap < tr->key_dim)
        st = kve__fail(KVE_ERANGE, "a key has %zu floats, but the buffer holds %zu", tr->key_dim,
                       cap);
    return st == KVE_OK ? tr->type->key(tr->impl, head, t, key) : st;
}

kve_status kve_trace_write_npy_file(kve_trace *tr, size_t head, FILE *f,
                                    kve_progress_fn progress, void *user)
{
    if (!tr)
        return kve__fail(KVE_EINVAL, "trace is NULL");
    if (!f)
        return kve__fail(KVE_EINVAL, "output stream is NULL");
    kve_status st = check_head(tr, head);
    if (st != KVE_OK)
        return st;
    return kve__npy_write_file(tr, head, f, progress, user);
}
