/*
 * trace.c - the public kve_trace entry points: argument checks, dispatch
 * between the canonical generator and the .npy reader.
 *
 * Invariants: every public function validates its arguments once here, so
 * the source-specific row functions see only in-range heads and steps. A
 * source string is canonical when it is exactly "canonical" or starts with
 * "canonical:"; anything else is a path (a file called "canonical" is opened
 * as "./canonical").
 */
#include "trace_impl.h"

#include <string.h>

static const char CANONICAL[] = "canonical";

kve_status kve_trace_open(const char *src, unsigned flags, kve_trace **out)
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
    kve_trace *tr = kve__calloc(1, sizeof *tr);
    if (!tr)
        return kve__fail(KVE_ENOMEM, "out of memory for the trace handle");
    size_t n = sizeof CANONICAL - 1;
    kve_status st;
    if (strncmp(src, CANONICAL, n) == 0 && (src[n] == '\0' || src[n] == ':')) {
        tr->kind = KVE_TRACE_CANONICAL;
        st = kve__canonical_open(src[n] == ':' ? src + n + 1 : NULL, tr);
    } else {
        tr->kind = KVE_TRACE_NPY;
        st = kve__npy_open(src, flags, tr);
    }
    if (st != KVE_OK) {
        kve__free(tr);
        return st;
    }
    *out = tr;
    return KVE_OK;
}

void kve_trace_free(kve_trace *tr)
{
    if (!tr)
        return;
    kve__canonical_free(tr->canonical);
    kve__npy_free(tr->npy);
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

kve_status kve_trace_row(kve_trace *tr, size_t head, size_t t, double *row)
{
    if (!tr)
        return kve__fail(KVE_EINVAL, "trace is NULL");
    if (!row)
        return kve__fail(KVE_EINVAL, "row is NULL");
    if (head >= tr->heads)
        return kve__fail(KVE_EINVAL, "head %zu is out of range (the trace has %zu heads)", head,
                         tr->heads);
    if (t >= tr->steps)
        return kve__fail(KVE_EINVAL, "step %zu is out of range (the trace has %zu steps)", t,
                         tr->steps);
    if (tr->kind == KVE_TRACE_CANONICAL) {
        kve__canonical_row(tr->canonical, t, row);
        return KVE_OK;
    }
    return kve__npy_row(tr->npy, head, t, row);
}

kve_status kve_trace_write_npy(kve_trace *tr, size_t head, const char *path)
{
    if (!tr)
        return kve__fail(KVE_EINVAL, "trace is NULL");
    if (!path || !*path)
        return kve__fail(KVE_EINVAL, "output path is %s", path ? "empty" : "NULL");
    if (head >= tr->heads)
        return kve__fail(KVE_EINVAL, "head %zu is out of range (the trace has %zu heads)", head,
                         tr->heads);
    return kve__npy_write(tr, head, path);
}
