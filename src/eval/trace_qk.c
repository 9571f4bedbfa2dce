/* SPDX-License-Identifier: MIT */
/*
 * trace_qk.c - query/key traces: attention rows computed on demand from the
 * queries and keys a model produced, so a trace of T positions costs O(T d)
 * bytes on disk and in memory instead of the O(T^2) of a dense .npy.
 *
 * Legend: L layers, H query heads, G KV heads (G divides H, R = H / G query
 * heads a KV head), T positions, d the head dimension.
 * File ("qk:PATH"): two .npy arrays back to back, as numpy writes them with
 * two np.save calls on one open file:
 *   Q  (L, H, T, d)  the queries, after any rotary embedding
 *   K  (L, G, T, d)  the keys, after any rotary embedding
 * little-endian float32 or float64 each (independently), C order; the
 * leading dimensions may be dropped together: (H, T, d) / (G, T, d) with
 * L = 1, or (T, d) / (T, d) with L = H = G = 1. The file ends with K's data.
 * The trace has L * G heads (KV heads), layer-major; head (l, g) = l*G + g.
 *
 * Row t of head (l, g): for each query head h = g*R + r (r < R), the
 * softmax over keys [0, t] of scale * q(l, h, t) . k(l, g, i), computed by
 * kve_attn_row (scale = (float)(1 / sqrt(d))); the R rows summed in double
 * in query-head order, divided by R in double and rounded to float32 once
 * (KVE_REDUCE_MEAN). With R = 1 the row is kve_attn_row's.
 *
 * Invariants: every header, shape, size and value was checked when the
 * file was opened (values finite, and within float32 for a float64 array),
 * so reading can fail only with KVE_EIO, or KVE_EFORMAT for a row whose
 * logits overflow float32 (a dot product of finite floats can). The keys of
 * one head (the last one read) are held decoded; nothing else of the file.
 * Memory: T * d floats of keys, T floats and T doubles for a row, d floats of
 * query, and a read buffer of at most CHUNK bytes: O(T d). Rows may be read in
 * any order; changing heads re-reads T * d keys. Cost of a row: O(R t d).
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "trace_impl.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { CHUNK = 1 << 16 }; /* bytes read at once while scanning or loading keys */

typedef struct kve_qk {
    FILE *f;
    const char *path;     /* for messages; owned by the trace (after "qk:") */
    size_t L, H, G, T, d; /* see the legend */
    size_t R;             /* H / G */
    size_t q_item, k_item; /* 4 or 8 */
    uint64_t q_off, k_off; /* where each array's data starts */
    float scale;
    size_t cached;        /* the head whose keys are in `keys`; SIZE_MAX: none */
    float *keys;          /* (T, d) */
    float *q;             /* (d) the query being read */
    float *w;             /* (T) one query head's row */
    double *acc;          /* (T) the group's sum */
    unsigned char *raw;   /* (CHUNK) bytes as read */
} kve_qk;

static int mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

/* The shape of one array as (layers, heads, T, d); refuses what is not 2, 3
 * or 4 dimensions of at least 1 each. */
static kve_status shape_of(const kve__npy_header *h, const char *path, const char *name,
                           uint64_t out[4])
{
    if (h->ndim < 2)
        return kve__fail(KVE_EFORMAT, "%s: %s has %zu dimensions (want (L, heads, T, d), "
                         "(heads, T, d) or (T, d))", path, name, h->ndim);
    out[0] = out[1] = 1;
    for (size_t i = 0; i < h->ndim; i++) {
        if (h->dims[i] == 0)
            return kve__fail(KVE_EFORMAT, "%s: %s: dimension %zu is 0 (the trace would be "
                             "empty)", path, name, i);
        out[4 - h->ndim + i] = h->dims[i];
    }
    return KVE_OK;
}

/* Reads Q's and K's headers and checks them against each other and the
 * file's size; fills the dimensions and offsets of n. */
static kve_status read_shapes(kve_trace *tr, kve_qk *n, uint64_t size)
{
    kve__npy_header hq, hk;
    uint64_t q_off = 0, k_at = 0, k_off = 0, q_shape[4], k_shape[4], q_bytes = 0, k_bytes = 0;
    char label[512];
    const char *p = n->path;
    kve_status st = kve__npy_read_header(tr, n->f, p, 0, size, &hq, &q_off);
    if (st == KVE_OK)
        st = shape_of(&hq, p, "Q", q_shape);
    if (st != KVE_OK)
        return st;
    uint64_t q_elems = 1;
    for (int i = 0; i < 4; i++)
        if (!mul_ok(q_elems, q_shape[i], &q_elems))
            return kve__fail(KVE_EFORMAT, "%s: Q's shape is too large", p);
    if (!mul_ok(q_elems, hq.itemsize, &q_bytes) || q_bytes > size - q_off)
        return kve__fail(KVE_EFORMAT, "%s: Q's header promises %llu elements of %zu bytes, "
                         "but the file is %llu bytes (truncated, or not a q/K file)",
                         p, (unsigned long long)q_elems, hq.itemsize, (unsigned long long)size);
    k_at = q_off + q_bytes;
    if (k_at == size)
        return kve__fail(KVE_EFORMAT, "%s: the file ends after Q: no K array follows (a q/K "
                         "trace is Q then K, two np.save calls on one file)", p);
    snprintf(label, sizeof label, "%.500s (K)", p);
    st = kve__npy_read_header(tr, n->f, label, k_at, size, &hk, &k_off);
    if (st == KVE_OK)
        st = shape_of(&hk, p, "K", k_shape);
    if (st != KVE_OK)
        return st;
    if (hk.ndim != hq.ndim || k_shape[0] != q_shape[0] || k_shape[2] != q_shape[2] ||
        k_shape[3] != q_shape[3])
        return kve__fail(KVE_EFORMAT, "%s: Q is (%llu, %llu, %llu, %llu) and K (%llu, %llu, "
                         "%llu, %llu) as (L, heads, T, d): they must have the same number of "
                         "dimensions and the same L, T and d", p,
                         (unsigned long long)q_shape[0], (unsigned long long)q_shape[1],
                         (unsigned long long)q_shape[2], (unsigned long long)q_shape[3],
                         (unsigned long long)k_shape[0], (unsigned long long)k_shape[1],
                         (unsigned long long)k_shape[2], (unsigned long long)k_shape[3]);
    if (q_shape[1] % k_shape[1] != 0)
        return kve__fail(KVE_EFORMAT, "%s: %llu query heads are not a multiple of %llu KV heads",
                         p, (unsigned long long)q_shape[1], (unsigned long long)k_shape[1]);
    uint64_t T = q_shape[2], d = q_shape[3], k_elems = 1, heads = 0, cells = 0;
    if (T > (uint64_t)INT32_MAX)
        return kve__fail(KVE_EFORMAT, "%s: T = %llu exceeds the largest position %d", p,
                         (unsigned long long)T, INT32_MAX);
    if (d > KVE_MAX_KEY_DIM)
        return kve__fail(KVE_EFORMAT, "%s: d = %llu exceeds the largest key dimension %d", p,
                         (unsigned long long)d, KVE_MAX_KEY_DIM);
    for (int i = 0; i < 4; i++)
        (void)mul_ok(k_elems, k_shape[i], &k_elems); /* no larger than Q's, which fit */
    if (!mul_ok(k_elems, hk.itemsize, &k_bytes) || k_off > size || k_bytes != size - k_off)
        return kve__fail(KVE_EFORMAT, "%s: K's header and shape need %llu bytes of data, the "
                         "file holds %llu after it (%s)", p, (unsigned long long)k_bytes,
                         (unsigned long long)(k_off <= size ? size - k_off : 0),
                         k_off <= size && k_bytes < size - k_off ? "trailing data"
                                                                 : "truncated");
    if (!mul_ok(k_shape[0], k_shape[1], &heads) || !mul_ok(heads, T, &cells) ||
        !mul_ok(cells, T, &cells) || heads > SIZE_MAX || T * d > SIZE_MAX / sizeof(double))
        return kve__fail(KVE_EFORMAT, "%s: %llu heads of %llu positions are too many", p,
                         (unsigned long long)heads, (unsigned long long)T);
    n->L = (size_t)q_shape[0];
    n->H = (size_t)q_shape[1];
    n->G = (size_t)k_shape[1];
    n->T = (size_t)T;
    n->d = (size_t)d;
    n->R = n->H / n->G;
    n->q_item = hq.itemsize;
    n->k_item = hk.itemsize;
    n->q_off = q_off;
    n->k_off = k_off;
    return KVE_OK;
}

/* Checks every value of one array (count elements of `item` bytes at off):
 * finite, and within float32. Reports progress in rows of d values. */
static kve_status scan(kve_qk *n, const char *name, uint64_t off, uint64_t count, size_t item,
                       const size_t dims[4], kve_progress_fn progress, void *user, uint64_t *done,
                       uint64_t total)
{
    const uint64_t per = CHUNK / item;
    for (uint64_t at = 0; at < count; at += per) {
        size_t m = (size_t)(count - at < per ? count - at : per);
        kve_status st = kve__npy_read_at(n->f, n->path, off + at * item, n->raw, m * item, name);
        if (st != KVE_OK)
            return st;
        for (size_t i = 0; i < m; i++) {
            double v = kve__npy_decode(n->raw + i * item, item);
            if (!(fabs(v) <= FLT_MAX)) {
                uint64_t e = at + i, j = e % dims[3], t = e / dims[3] % dims[2];
                uint64_t h = e / dims[3] / dims[2] % dims[1], l = e / dims[3] / dims[2] / dims[1];
                return kve__fail(KVE_EFORMAT, "%s: %s[%llu, %llu, %llu, %llu] = %g is %s", n->path,
                                 name, (unsigned long long)l, (unsigned long long)h,
                                 (unsigned long long)t, (unsigned long long)j, v,
                                 isfinite(v) ? "beyond float32" : "not finite");
            }
        }
        if (progress && progress(user, *done + (at + m) / dims[3], total))
            return kve__fail(KVE_ECANCELED, "%s: validation canceled in %s", n->path, name);
    }
    *done += count / dims[3];
    return KVE_OK;
}

static void qk_free(void *impl)
{
    kve_qk *n = impl;
    if (n && n->f)
        fclose(n->f);
}

static kve_status qk_open(const char *arg, unsigned flags, kve_progress_fn progress, void *user,
                          kve_trace *tr)
{
    (void)flags; /* rows are softmaxes: there is nothing to normalise */
    if (!arg || !*arg)
        return kve__fail(KVE_EINVAL, "qk: no path (want qk:PATH)");
    size_t plen = strlen(arg);
    char *source = kve__trace_malloc(tr, plen + 4);
    kve_qk *n = kve__trace_calloc(tr, 1, sizeof *n);
    if (!source || !n) {
        kve__trace_free(tr, source);
        kve__trace_free(tr, n);
        return kve__fail(KVE_ENOMEM, "qk:%s: out of memory", arg);
    }
    snprintf(source, plen + 4, "qk:%s", arg);
    n->path = source + 3;
    n->cached = SIZE_MAX;
    uint64_t size = 0;
    kve_status st = kve__npy_open_file(arg, &n->f, &size);
    if (st != KVE_OK || (st = read_shapes(tr, n, size)) != KVE_OK)
        goto fail;
    n->raw = kve__trace_malloc(tr, CHUNK);
    n->keys = kve__trace_malloc(tr, n->T * n->d * sizeof *n->keys);
    n->q = kve__trace_malloc(tr, n->d * sizeof *n->q);
    n->w = kve__trace_malloc(tr, n->T * sizeof *n->w);
    n->acc = kve__trace_malloc(tr, n->T * sizeof *n->acc);
    if (!n->raw || !n->keys || !n->q || !n->w || !n->acc) {
        st = kve__fail(KVE_ENOMEM, "%s: out of memory for %zu keys of %zu floats", arg, n->T,
                       n->d);
        goto fail;
    }
    const size_t qd[4] = {n->L, n->H, n->T, n->d}, kd[4] = {n->L, n->G, n->T, n->d};
    uint64_t total = (uint64_t)n->L * (n->H + n->G) * n->T, done = 0;
    if (progress && progress(user, 0, total)) {
        st = kve__fail(KVE_ECANCELED, "%s: validation canceled at row 0 of %llu", arg,
                       (unsigned long long)total);
        goto fail;
    }
    st = scan(n, "Q", n->q_off, (uint64_t)n->L * n->H * n->T * n->d, n->q_item, qd, progress,
              user, &done, total);
    if (st == KVE_OK)
        st = scan(n, "K", n->k_off, (uint64_t)n->L * n->G * n->T * n->d, n->k_item, kd, progress,
                  user, &done, total);
    if (st != KVE_OK)
        goto fail;
    n->scale = (float)(1.0 / sqrt((double)n->d));
    tr->steps = n->T;
    tr->heads = n->L * n->G;
    tr->layers = n->L;
    tr->key_dim = n->d;
    tr->source = source;
    tr->impl = n;
    return KVE_OK;
fail:
    qk_free(n); /* the file; the blocks go with the discarded trace */
    return st;
}

/* Decodes `count` values of `item` bytes at file offset `off` into out. */
static kve_status load(kve_qk *n, uint64_t off, size_t count, size_t item, float *out,
                       const char *what)
{
    const size_t per = CHUNK / item;
    for (size_t at = 0; at < count; at += per) {
        size_t m = count - at < per ? count - at : per;
        kve_status st = kve__npy_read_at(n->f, n->path, off + (uint64_t)at * item, n->raw,
                                         m * item, what);
        if (st != KVE_OK)
            return st;
        for (size_t i = 0; i < m; i++)
            out[at + i] = (float)kve__npy_decode(n->raw + i * item, item);
    }
    return KVE_OK;
}

/* Makes head's keys the cached ones. */
static kve_status load_keys(kve_qk *n, size_t head)
{
    if (n->cached == head)
        return KVE_OK;
    n->cached = SIZE_MAX;
    uint64_t off = n->k_off + (uint64_t)head * n->T * n->d * n->k_item;
    kve_status st = load(n, off, n->T * n->d, n->k_item, n->keys, "keys");
    if (st == KVE_OK)
        n->cached = head;
    return st;
}

static kve_status qk_row(void *impl, size_t head, size_t t, double *row)
{
    kve_qk *n = impl;
    kve_status st = load_keys(n, head);
    if (st != KVE_OK)
        return st;
    size_t l = head / n->G, g = head % n->G;
    for (size_t i = 0; i <= t; i++)
        n->acc[i] = 0.0;
    for (size_t r = 0; r < n->R; r++) {
        size_t h = g * n->R + r;
        uint64_t off = n->q_off + (((uint64_t)l * n->H + h) * n->T + t) * n->d * n->q_item;
        if ((st = load(n, off, n->d, n->q_item, n->q, "queries")) != KVE_OK)
            return st;
        if (kve_attn_row(n->q, n->d, n->keys, n->d, t + 1, n->scale, n->w) != KVE_OK) {
            char inner[96];
            snprintf(inner, sizeof inner, "%s", kve_last_error());
            return kve__fail(KVE_EFORMAT, "%s: head %zu (layer %zu, KV head %zu), row %zu, query "
                             "head %zu: %s", n->path, head, l, g, t, h, inner);
        }
        for (size_t i = 0; i <= t; i++)
            n->acc[i] += (double)n->w[i];
    }
    for (size_t i = 0; i <= t; i++)
        row[i] = (double)(float)(n->acc[i] / (double)n->R);
    return KVE_OK;
}

static kve_status qk_key(void *impl, size_t head, size_t t, float *key)
{
    kve_qk *n = impl;
    kve_status st = load_keys(n, head);
    if (st == KVE_OK)
        memcpy(key, n->keys + t * n->d, n->d * sizeof *key);
    return st;
}

const kve_trace_source_type kve__qk_source = {
    .prefix = "qk",
    .open = qk_open,
    .row = qk_row,
    .key = qk_key,
    .free = qk_free,
};
