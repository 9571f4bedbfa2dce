/* SPDX-License-Identifier: MIT */
/*
 * trace.c - the public kve_trace entry points: argument checks, and dispatch
 * through the table of trace sources (trace_impl.h).
 *
 * Invariants: every public function validates its arguments once here, so
 * the sources' row functions see only in-range heads and steps. A source
 * text selects the first source whose prefix it is followed by nothing or
 * ':' ("canonical", "canonical:steps=100"); any other text is a path for
 * the fallback source (a file called "canonical" is opened as
 * "./canonical"; "memory" names the traces kve_trace_from_memory makes,
 * which no text opens). What a row of recorded attention must be, for every
 * source that reads one, is defined once here (kve__trace_check_row).
 */
#include "trace_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const double SUM_TOLERANCE = 1e-3;

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
    &kve__npy_source,
};
enum { N_SOURCES = sizeof sources / sizeof sources[0] };

kve_status kve_trace_open_ex(const char *src, unsigned flags, kve_progress_fn progress,
                             void *user, kve_trace **out)
{
    if (!src)
        return kve__fail(KVE_EINVAL, "trace source is NULL");
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    if (flags & ~(unsigned)KVE_TRACE_NORMALIZE)
        return kve__fail(KVE_EINVAL, "trace flags 0x%x: only KVE_TRACE_NORMALIZE (0x1) is defined",
                         flags);
    if (*src == '\0')
        return kve__fail(KVE_EINVAL, "trace source is empty");
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
    kve_trace *tr = kve__calloc(1, sizeof *tr);
    if (!tr)
        return kve__fail(KVE_ENOMEM, "out of memory for the trace handle");
    kve_status st = type->open(arg, flags, progress, user, tr);
    if (st != KVE_OK) {
        kve__free(tr);
        return st;
    }
    tr->type = type;
    *out = tr;
    return KVE_OK;
}

kve_status kve_trace_open(const char *src, unsigned flags, kve_trace **out)
{
    return kve_trace_open_ex(src, flags, NULL, NULL, out);
}

void kve_trace_free(kve_trace *tr)
{
    if (!tr)
        return;
    tr->type->free(tr->impl);
    kve__free(tr->source);
    kve__free(tr);
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

kve_status kve_trace_row(kve_trace *tr, size_t head, size_t t, double *row)
{
    kve_status st = check_read(tr, head, t, row, "row");
    return st == KVE_OK ? tr->type->row(tr->impl, head, t, row) : st;
}

kve_status kve_trace_key(kve_trace *tr, size_t head, size_t t, float *key)
{
    kve_status st = check_read(tr, head, t, key, "key");
    if (st == KVE_OK && !tr->key_dim)
        st = kve__fail(KVE_EINVAL, "trace %s has no keys (a q/K trace has: qk:PATH)",
                       tr->source);
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
