/* SPDX-License-Identifier: MIT */
/*
 * gguf.c - GGUF checkpoints (ggml's docs/gguf.md, versions 2 and 3, little
 * endian), architecture "llama", and the vocabulary in their metadata.
 *
 * Invariants. Nothing is read before the bytes are known to be in the file:
 * every length is checked against what is left, in 64 bits, before it is
 * used or anything is allocated for it (so a count the file cannot hold is
 * refused before an allocation of that size). Parsing is in two passes: the
 * container (header, every metadata pair of every type down to nested
 * arrays, tensor infos, alignment, the data section: offsets aligned and
 * inside the file, sizes from dims and type, no overlap), then the llama
 * model (hyperparameters from llama.* keys, every expected tensor present
 * once with its shape and a type the decoder reads, nothing unexpected,
 * every float value and block scale finite). Only then are weights pointed
 * at. Messages name the key or tensor. Matrices stay in the file's type;
 * norms stored in 16 bits are widened once into m->norms.
 *
 * GGUF lists dims innermost first: a matrix of `rows` rows of `cols`
 * values has dims [cols, rows].
 */
#define _POSIX_C_SOURCE 200809L
#include "lm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64, T_I64, T_F64,
    N_TYPES,
    MAX_DEPTH = 16,
    MAX_KEY = 65535,
    MAX_NAME = 64
};

static const char *const type_names[N_TYPES] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64"};
static const unsigned char scalar_size[N_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

typedef struct str_ref { /* a name in the file: bytes, not NUL-terminated */
    const char *s;
    size_t len;
} str_ref;

typedef struct gg_kv {
    str_ref key; /* first: the lookups read it through str_ref */
    uint32_t type;
    size_t val;         /* offset of the value (after its type) */
    uint32_t arr_type;  /* arrays: element type, count, first element's offset */
    uint64_t arr_n;
    size_t arr_val;
    size_t end;         /* offset just past the value: the pair is [key - 8, end) */
} gg_kv;

typedef struct gg_tensor {
    str_ref name; /* first, as in gg_kv */
    uint32_t n_dims;
    uint64_t ne[4]; /* 1 beyond n_dims */
    uint32_t type;
    uint64_t offset, bytes; /* relative to the data section */
    int used;
} gg_tensor;

struct lm_gguf {
    uint32_t version;
    const unsigned char *base;
    size_t size;
    size_t n_kv, n_t;
    gg_kv *kv;
    gg_tensor *t;
    size_t *kv_sorted, *t_sorted; /* indices by key and by name */
    uint64_t alignment, data_start;
    kve_allocator alloc; /* the model's: every block here (a copy) */
};

void lm__gguf_free(lm_gguf *g)
{
    if (!g)
        return;
    const kve_allocator a = g->alloc;
    lm_free(&a, g->kv);
    lm_free(&a, g->t);
    lm_free(&a, g->kv_sorted);
    lm_free(&a, g->t_sorted);
    lm_free(&a, g);
}

/* ---- reading ---- */

typedef struct rd {
    const unsigned char *p;
    size_t size, off;
} rd;

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int take(rd *r, size_t n, size_t *at)
{
    if (r->size - r->off < n)
        return 0;
    *at = r->off;
    r->off += n;
    return 1;
}

static int rd_u32(rd *r, uint32_t *v)
{
    size_t at;
    if (!take(r, 4, &at))
        return 0;
    *v = (uint32_t)le(r->p + at, 4);
    return 1;
}

static int rd_u64(rd *r, uint64_t *v)
{
    size_t at;
    if (!take(r, 8, &at))
        return 0;
    *v = le(r->p + at, 8);
    return 1;
}

/* A GGUF string: uint64 length, then the bytes. */
static int rd_str(rd *r, const char **s, uint64_t *len)
{
    size_t at;
    if (!rd_u64(r, len) || *len > r->size - r->off || !take(r, (size_t)*len, &at))
        return 0;
    *s = (const char *)(r->p + at);
    return 1;
}

static int printable(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

/* Skips one value of `type`; validates bools (0 or 1). 0 with the message
 * set (naming key `k`) when it does not fit or is malformed. */
static kve_status skip_value(rd *r, uint32_t type, int depth, const gg_kv *k)
{
    if (type >= N_TYPES)
        return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: value type %u is not a GGUF type",
                       (int)k->key.len, k->key.s, type);
    size_t at;
    if (type == T_STRING) {
        const char *s;
        uint64_t len;
        if (!rd_str(r, &s, &len))
            return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: a string runs past the end of "
                           "the file", (int)k->key.len, k->key.s);
        return KVE_OK;
    }
    if (type != T_ARRAY) {
        if (!take(r, scalar_size[type], &at))
            return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: truncated in its %s value",
                           (int)k->key.len, k->key.s, type_names[type]);
        if (type == T_BOOL && r->p[at] > 1)
            return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: bool value %u is neither 0 "
                           "nor 1", (int)k->key.len, k->key.s, r->p[at]);
        return KVE_OK;
    }
    if (depth >= MAX_DEPTH)
        return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: arrays nested deeper than %d",
                       (int)k->key.len, k->key.s, MAX_DEPTH);
    uint32_t et;
    uint64_t n;
    if (!rd_u32(r, &et) || !rd_u64(r, &n))
        return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: truncated in an array header",
                       (int)k->key.len, k->key.s);
    if (et >= N_TYPES)
        return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: array element type %u is not a "
                       "GGUF type", (int)k->key.len, k->key.s, et);
    if (et != T_STRING && et != T_ARRAY) {
        if (n > (r->size - r->off) / scalar_size[et])
            return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: an array of %llu %s runs past "
                           "the end of the file", (int)k->key.len, k->key.s,
                           (unsigned long long)n, type_names[et]);
        size_t first = r->off;
        r->off += (size_t)n * scalar_size[et];
        for (uint64_t i = 0; et == T_BOOL && i < n; i++)
            if (r->p[first + i] > 1)
                return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: element %llu: bool value "
                               "%u is neither 0 nor 1", (int)k->key.len, k->key.s,
                               (unsigned long long)i, r->p[first + i]);
        return KVE_OK;
    }
    /* Strings take at least 8 bytes and arrays 12: the loop ends with the file. */
    for (uint64_t i = 0; i < n; i++) {
        kve_status st = skip_value(r, et, depth + 1, k);
        if (st != KVE_OK)
            return st;
    }
    return KVE_OK;
}

static int cmp_bytes(const char *a, size_t na, const char *b, size_t nb)
{
    int c = memcmp(a, b, na < nb ? na : nb);
    return c != 0 ? c : (na > nb) - (na < nb);
}

/* The name at the start of element i of an array of `stride`-byte
 * elements (gg_kv, gg_tensor). */
static const str_ref *name_at(const void *base, size_t stride, size_t i)
{
    return (const str_ref *)(const void *)((const unsigned char *)base + i * stride);
}

/* Sorts idx[0 .. n) by the names of the elements they index (a merge sort:
 * qsort has no context argument in C11). */
static void merge_sort(size_t *idx, size_t *tmp, size_t n, const void *base, size_t stride)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    merge_sort(idx, tmp, h, base, stride);
    merge_sort(idx + h, tmp, n - h, base, stride);
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        const str_ref *a = name_at(base, stride, idx[i]), *b = name_at(base, stride, idx[j]);
        tmp[o++] = cmp_bytes(b->s, b->len, a->s, a->len) < 0 ? idx[j++] : idx[i++];
    }
    while (i < h)
        tmp[o++] = idx[i++];
    while (j < n)
        tmp[o++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

/* idx (n) sorted by name; refused, naming `what`, when two names are equal. */
static kve_status sort_names(const kve_allocator *alloc, size_t *idx, size_t n, const void *base,
                             size_t stride, const char *what)
{
    size_t *tmp = lm_malloc(alloc, (n ? n : 1) * sizeof *tmp);
    if (!tmp)
        return kve_set_error(KVE_ENOMEM, "GGUF: out of memory");
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    merge_sort(idx, tmp, n, base, stride);
    lm_free(alloc, tmp);
    for (size_t i = 1; i < n; i++) {
        const str_ref *a = name_at(base, stride, idx[i - 1]), *b = name_at(base, stride, idx[i]);
        if (cmp_bytes(a->s, a->len, b->s, b->len) == 0)
            return kve_set_error(KVE_EFORMAT, "GGUF: %s %.*s appears twice", what, (int)b->len, b->s);
    }
    return KVE_OK;
}

/* The index of the element named `name`, by binary search over the sorted
 * indices; SIZE_MAX when none is. */
static size_t find_name(const void *base, size_t stride, const size_t *sorted, size_t n,
                        const char *name)
{
    size_t lo = 0, hi = n, len = strlen(name);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const str_ref *r = name_at(base, stride, sorted[mid]);
        int c = cmp_bytes(r->s, r->len, name, len);
        if (c == 0)
            return sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return SIZE_MAX;
}

static const gg_kv *find_kv(const lm_gguf *g, const char *key)
{
    size_t i = find_name(g->kv, sizeof *g->kv, g->kv_sorted, g->n_kv, key);
    return i == SIZE_MAX ? NULL : &g->kv[i];
}

static gg_tensor *find_tensor(const lm_gguf *g, const char *name)
{
    size_t i = find_name(g->t, sizeof *g->t, g->t_sorted, g->n_t, name);
    return i == SIZE_MAX ? NULL : &g->t[i];
}

/* ---- the container ---- */

static kve_status parse_kvs(lm_gguf *g, rd *r)
{
    for (size_t i = 0; i < g->n_kv; i++) {
        gg_kv *k = &g->kv[i];
        uint64_t len;
        if (!rd_str(r, &k->key.s, &len))
            return kve_set_error(KVE_EFORMAT, "GGUF: metadata pair %zu: truncated in its key", i);
        k->key.len = (size_t)len;
        if (len == 0 || len > MAX_KEY || !printable(k->key.s, k->key.len))
            return kve_set_error(KVE_EFORMAT, "GGUF: metadata pair %zu: the key is not 1 to %d "
                           "printable ASCII characters", i, MAX_KEY);
        if (!rd_u32(r, &k->type))
            return kve_set_error(KVE_EFORMAT, "GGUF: metadata key %.*s: truncated in its type",
                           (int)k->key.len, k->key.s);
        k->val = r->off;
        if (k->type == T_ARRAY && r->size - r->off >= 12) {
            k->arr_type = (uint32_t)le(r->p + r->off, 4);
            k->arr_n = le(r->p + r->off + 4, 8);
            k->arr_val = r->off + 12;
        }
        kve_status st = skip_value(r, k->type, 0, k);
        if (st != KVE_OK)
            return st;
        k->end = r->off;
    }
    return KVE_OK;
}

static kve_status parse_tensor_infos(lm_gguf *g, rd *r)
{
    for (size_t i = 0; i < g->n_t; i++) {
        gg_tensor *t = &g->t[i];
        uint64_t len;
        if (!rd_str(r, &t->name.s, &len))
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor info %zu: truncated in its name", i);
        t->name.len = (size_t)len;
        if (len == 0 || len > MAX_NAME || !printable(t->name.s, t->name.len))
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor info %zu: the name is not 1 to %d "
                           "printable ASCII characters", i, MAX_NAME);
        const int nl = (int)t->name.len;
        if (!rd_u32(r, &t->n_dims))
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: truncated in n_dimensions", nl,
                           t->name.s);
        if (t->n_dims == 0 || t->n_dims > 4)
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: %u dimensions (1 to 4)", nl, t->name.s,
                           t->n_dims);
        uint64_t elems = 1;
        for (int d = 0; d < 4; d++) {
            t->ne[d] = 1;
            if ((uint32_t)d < t->n_dims && !rd_u64(r, &t->ne[d]))
                return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: truncated in its dimensions", nl,
                               t->name.s);
            if (__builtin_mul_overflow(elems, t->ne[d], &elems) || elems > (UINT64_C(1) << 56))
                return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: its dimensions hold more than "
                               "2^56 values", nl, t->name.s);
        }
        uint64_t offset;
        if (!rd_u32(r, &t->type) || !rd_u64(r, &offset))
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: truncated in its type or offset", nl,
                           t->name.s);
        t->offset = offset;
        size_t bs = lm_dtype_block((lm_dtype)t->type), bb = lm_dtype_block_bytes((lm_dtype)t->type);
        if (t->type == LM_I8G || bs == 0)
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: type %u (%s) is not supported (F32, "
                           "F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                           "IQ4_NL and IQ4_XS are)", nl, t->name.s, t->type,
                           lm_dtype_name(t->type));
        if (t->ne[0] % bs != 0)
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: %llu values a row are not whole %s "
                           "blocks of %zu", nl, t->name.s, (unsigned long long)t->ne[0],
                           lm_dtype_name(t->type), bs);
        t->bytes = elems / bs * bb; /* elems < 2^56, bb <= 210 */
    }
    return KVE_OK;
}

/* The unsigned value of an integer pair (any integer type); 0 when it is
 * not an integer or is negative. */
static int kv_uint(const lm_gguf *g, const gg_kv *k, uint64_t *v)
{
    const unsigned char *p = g->base + k->val;
    switch (k->type) {
    case T_U8: *v = p[0]; return 1;
    case T_U16: *v = le(p, 2); return 1;
    case T_U32: *v = le(p, 4); return 1;
    case T_U64: *v = le(p, 8); return 1;
    case T_I8: *v = (uint64_t)(int64_t)(int8_t)p[0]; return (int8_t)p[0] >= 0;
    case T_I16: *v = (uint64_t)(int64_t)(int16_t)le(p, 2); return (int16_t)le(p, 2) >= 0;
    case T_I32: *v = (uint64_t)(int64_t)(int32_t)le(p, 4); return (int32_t)le(p, 4) >= 0;
    case T_I64: *v = le(p, 8); return (int64_t)*v >= 0;
    default: return 0;
    }
}

/* A tensor's bytes in the data section, for the overlap check. */
typedef struct span {
    uint64_t offset, bytes;
    size_t index;
} span;

static int cmp_span(const void *x, const void *y)
{
    const span *a = x, *b = y;
    return (a->offset > b->offset) - (a->offset < b->offset);
}

static kve_status parse_container(lm_gguf *g, const unsigned char *data, size_t size)
{
    rd r = {data, size, 4};
    uint32_t version;
    uint64_t n_t, n_kv;
    if (!rd_u32(&r, &version))
        return kve_set_error(KVE_EFORMAT, "GGUF: %zu bytes, truncated in the field version", size);
    if ((version & 0xFFFFu) == 0 && version != 0)
        return kve_set_error(KVE_EFORMAT, "GGUF: the file is big-endian (version field 0x%08x); only "
                       "little-endian files are read", version);
    if (version != 2 && version != 3)
        return kve_set_error(KVE_EFORMAT, "GGUF: version %u is not supported (versions 2 and 3 are)",
                       version);
    g->version = version;
    if (!rd_u64(&r, &n_t) || !rd_u64(&r, &n_kv))
        return kve_set_error(KVE_EFORMAT, "GGUF: %zu bytes, truncated in the tensor and metadata "
                       "counts", size);
    /* A pair takes at least 14 bytes, a tensor info 33: refuse counts the
     * file cannot hold before allocating for them. */
    if (n_kv > (size - r.off) / 14 || n_t > (size - r.off) / 33)
        return kve_set_error(KVE_EFORMAT, "GGUF: %llu metadata pairs and %llu tensors do not fit in "
                       "%zu bytes", (unsigned long long)n_kv, (unsigned long long)n_t, size);
    g->n_kv = (size_t)n_kv;
    g->n_t = (size_t)n_t;
    g->kv = lm_calloc(&g->alloc, g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->t = lm_calloc(&g->alloc, g->n_t ? g->n_t : 1, sizeof *g->t);
    g->kv_sorted = lm_malloc(&g->alloc, (g->n_kv ? g->n_kv : 1) * sizeof *g->kv_sorted);
    g->t_sorted = lm_malloc(&g->alloc, (g->n_t ? g->n_t : 1) * sizeof *g->t_sorted);
    if (!g->kv || !g->t || !g->kv_sorted || !g->t_sorted)
        return kve_set_error(KVE_ENOMEM, "GGUF: out of memory for %zu metadata pairs and %zu tensors",
                       g->n_kv, g->n_t);
    kve_status st = parse_kvs(g, &r);
    if (st == KVE_OK)
        st = sort_names(&g->alloc, g->kv_sorted, g->n_kv, g->kv, sizeof *g->kv, "metadata key");
    if (st == KVE_OK)
        st = parse_tensor_infos(g, &r);
    if (st == KVE_OK)
        st = sort_names(&g->alloc, g->t_sorted, g->n_t, g->t, sizeof *g->t, "tensor");
    if (st != KVE_OK)
        return st;

    g->alignment = 32;
    const gg_kv *al = find_kv(g, "general.alignment");
    if (al && (!kv_uint(g, al, &g->alignment) || g->alignment < 8 || g->alignment > (1u << 30) ||
               (g->alignment & (g->alignment - 1)) != 0))
        return kve_set_error(KVE_EFORMAT, "GGUF: general.alignment must be a power of two from 8 to "
                       "2^30 (a multiple of 8, as the format says)");
    g->data_start = (r.off + g->alignment - 1) / g->alignment * g->alignment;
    if (g->data_start > size)
        return kve_set_error(KVE_EFORMAT, "GGUF: the data section would start at byte %llu, past the "
                       "end of the file (%zu bytes)", (unsigned long long)g->data_start, size);
    uint64_t room = size - g->data_start;
    for (size_t i = 0; i < g->n_t; i++) {
        const gg_tensor *t = &g->t[i];
        if (t->offset % g->alignment != 0)
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: offset %llu is not a multiple of "
                           "the alignment %llu", (int)t->name.len, t->name.s,
                           (unsigned long long)t->offset, (unsigned long long)g->alignment);
        if (t->offset > room || t->bytes > room - t->offset)
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: its %llu bytes at offset %llu of "
                           "the data section run past the end of the file", (int)t->name.len,
                           t->name.s, (unsigned long long)t->bytes, (unsigned long long)t->offset);
    }
    /* No two tensors share a byte: sorted by offset, each ends before the next begins. */
    span *by_off = lm_malloc(&g->alloc, (g->n_t ? g->n_t : 1) * sizeof *by_off);
    if (!by_off)
        return kve_set_error(KVE_ENOMEM, "GGUF: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < g->n_t; i++)
        if (g->t[i].bytes > 0)
            by_off[n++] = (span){g->t[i].offset, g->t[i].bytes, i};
    qsort(by_off, n, sizeof *by_off, cmp_span);
    for (size_t i = 1; st == KVE_OK && i < n; i++) {
        const gg_tensor *a = &g->t[by_off[i - 1].index], *b = &g->t[by_off[i].index];
        if (a->offset + a->bytes > b->offset)
            st = kve_set_error(KVE_EFORMAT, "GGUF: tensors %.*s and %.*s overlap", (int)a->name.len,
                         a->name.s, (int)b->name.len, b->name.s);
    }
    lm_free(&g->alloc, by_off);
    return st;
}

/* ---- the llama model ---- */

/* A required (need) or optional integer key llama.NAME in [lo, hi]; *v
 * untouched when absent. */
static kve_status key_int(const lm_gguf *g, const char *key, int need, uint64_t lo, uint64_t hi,
                          uint64_t *v)
{
    const gg_kv *k = find_kv(g, key);
    if (!k)
        return need ? kve_set_error(KVE_EFORMAT, "GGUF: the key %s is missing", key) : KVE_OK;
    uint64_t x;
    if (!kv_uint(g, k, &x))
        return kve_set_error(KVE_EFORMAT, "GGUF: %s: a %s, want a non-negative integer", key,
                       k->type < N_TYPES ? type_names[k->type] : "?");
    if (x < lo || x > hi)
        return kve_set_error(KVE_EFORMAT, "GGUF: %s %llu is outside [%llu, %llu]", key,
                       (unsigned long long)x, (unsigned long long)lo, (unsigned long long)hi);
    *v = x;
    return KVE_OK;
}

/* An optional or required float key (float32 or float64), finite and > 0. */
static kve_status key_float(const lm_gguf *g, const char *key, int need, float *v)
{
    const gg_kv *k = find_kv(g, key);
    if (!k)
        return need ? kve_set_error(KVE_EFORMAT, "GGUF: the key %s is missing", key) : KVE_OK;
    double x;
    if (k->type == T_F32) {
        uint32_t u = (uint32_t)le(g->base + k->val, 4);
        float f;
        memcpy(&f, &u, sizeof f);
        x = f;
    } else if (k->type == T_F64) {
        uint64_t u = le(g->base + k->val, 8);
        memcpy(&x, &u, sizeof x);
    } else {
        return kve_set_error(KVE_EFORMAT, "GGUF: %s: a %s, want a float", key,
                       k->type < N_TYPES ? type_names[k->type] : "?");
    }
    if (!(x > 0 && x <= 3.40282347e38))
        return kve_set_error(KVE_EFORMAT, "GGUF: %s %g must be positive and finite", key, x);
    *v = (float)x;
    return KVE_OK;
}

/* A string key's value (not NUL-terminated); 0 when absent or not a string. */
static int key_str(const lm_gguf *g, const gg_kv *k, const char **s, size_t *len)
{
    if (!k || k->type != T_STRING)
        return 0;
    *len = (size_t)le(g->base + k->val, 8);
    *s = (const char *)(g->base + k->val + 8);
    return 1;
}

static int str_is(const char *s, size_t len, const char *want)
{
    return len == strlen(want) && memcmp(s, want, len) == 0;
}

/* The first of n float values (4 bytes each, or 2 with exponent mask m16)
 * at p whose exponent bits are all set (an infinity or NaN), UINT64_MAX if
 * none: scanned in chunks the compiler vectorises, a chunk with one found
 * again for its index. */
static uint64_t first_not_finite(const unsigned char *p, uint64_t n, unsigned m16)
{
    for (uint64_t i = 0; i < n; i += 4096) {
        uint64_t m = 4096;
        if (m > n - i)
            m = n - i;
        unsigned hit = 0;
        for (uint64_t j = 0; j < m; j++) {
            if (m16) {
                uint16_t h;
                memcpy(&h, p + 2 * (i + j), 2);
                hit |= (h & m16) == m16;
            } else {
                uint32_t u;
                memcpy(&u, p + 4 * (i + j), 4);
                hit |= (u & 0x7f800000u) == 0x7f800000u;
            }
        }
        for (uint64_t j = 0; hit && j < m; j++)
            if (m16 ? (lm__u16(p + 2 * (i + j)) & m16) == m16
                    : (le(p + 4 * (i + j), 4) & 0x7f800000u) == 0x7f800000u)
                return i + j;
    }
    return UINT64_MAX;
}

/* Every value of t finite: float values, or each block's scales. */
static kve_status check_finite(const lm_gguf *g, const gg_tensor *t)
{
    const unsigned char *p = g->base + g->data_start + t->offset;
    uint64_t bad = UINT64_MAX;
    switch (t->type) {
    case LM_F32: bad = first_not_finite(p, t->bytes / 4, 0); break;
    case LM_F16: bad = first_not_finite(p, t->bytes / 2, 0x7c00u); break;
    case LM_BF16: bad = first_not_finite(p, t->bytes / 2, 0x7f80u); break;
    default: { /* a float16 scale at these offsets of each block (d, and the min's scale) */
        size_t bb = lm_dtype_block_bytes((lm_dtype)t->type), o1 = 0, o2;
        switch (t->type) {
        case LM_Q6_K: o1 = 208; break;
        case LM_Q2_K: o1 = 80; break;
        case LM_Q3_K: o1 = 108; break;
        default: break;
        }
        o2 = o1;
        if (t->type == LM_Q4_1 || t->type == LM_Q5_1 || t->type == LM_Q4_K || t->type == LM_Q5_K ||
            t->type == LM_Q2_K)
            o2 = o1 + 2;
        for (uint64_t b = 0; b < t->bytes / bb && bad == UINT64_MAX; b++)
            if ((lm__u16(p + b * bb + o1) & 0x7c00u) == 0x7c00u ||
                (lm__u16(p + b * bb + o2) & 0x7c00u) == 0x7c00u)
                bad = b;
        if (bad != UINT64_MAX)
            return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: block %llu has a scale that is not "
                           "finite", (int)t->name.len, t->name.s, (unsigned long long)bad);
        return KVE_OK;
    }
    }
    if (bad != UINT64_MAX)
        return kve_set_error(KVE_EFORMAT, "GGUF: tensor %.*s: value %llu is not finite",
                       (int)t->name.len, t->name.s, (unsigned long long)bad);
    return KVE_OK;
}

/* The tensor `name` with shape [cols] (rows 0) or [cols, rows]; marks it used. */
static kve_status get_tensor(lm_gguf *g, const char *name, uint64_t cols, uint64_t rows,
                             const char *what, gg_tensor **out)
{
    gg_tensor *t = find_tensor(g, name);
    if (!t)
        return kve_set_error(KVE_EFORMAT, "GGUF: the tensor %s is missing", name);
    uint64_t want[4] = {cols, rows ? rows : 1, 1, 1};
    if (memcmp(t->ne, want, sizeof want) != 0 || t->n_dims > (rows ? 2u : 1u))
        return kve_set_error(KVE_EFORMAT, "GGUF: tensor %s: shape [%llu, %llu, %llu, %llu], want "
                       "[%llu%s%llu] (%s)", name, (unsigned long long)t->ne[0],
                       (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                       (unsigned long long)t->ne[3], (unsigned long long)cols, rows ? ", " : "",
                       (unsigned long long)(rows ? rows : 0), what);
    if (!rows && t->type != LM_F32 && t->type != LM_F16 && t->type != LM_BF16)
        return kve_set_error(KVE_EFORMAT, "GGUF: tensor %s: a norm must be F32, F16 or BF16, not %s",
                       name, lm_dtype_name(t->type));
    kve_status st = check_finite(g, t);
    if (st != KVE_OK)
        return st;
    t->used = 1;
    *out = t;
    return KVE_OK;
}

static kve_status get_matrix(lm_gguf *g, const char *name, uint64_t cols, uint64_t rows,
                             const char *what, lm_matrix *m)
{
    gg_tensor *t;
    kve_status st = get_tensor(g, name, cols, rows, what, &t);
    if (st != KVE_OK)
        return st;
    *m = (lm_matrix){.data = g->base + g->data_start + t->offset, .type = (lm_dtype)t->type,
                     .rows = (size_t)rows, .cols = (size_t)cols,
                     .row_bytes = (size_t)(t->bytes / rows)};
    return KVE_OK;
}

/* A norm, checked: *out points into the file when it is F32; NULL when it
 * is stored in 16 bits (widen_norm fills it later), *t its tensor. */
static kve_status get_norm(lm_gguf *g, const char *name, uint64_t D, const float **out,
                           size_t *n16)
{
    gg_tensor *t;
    kve_status st = get_tensor(g, name, D, 0, "embedding_length", &t);
    if (st != KVE_OK)
        return st;
    *out = t->type == LM_F32 ? (const float *)(const void *)(g->base + g->data_start + t->offset)
                             : NULL;
    *n16 += t->type != LM_F32;
    return KVE_OK;
}

/* The 16-bit norm `name` (checked by get_norm) widened into dst (D). */
static const float *widen_norm(const lm_gguf *g, const char *name, uint64_t D, float *dst)
{
    const gg_tensor *t = find_tensor(g, name);
    const unsigned char *p = g->base + g->data_start + t->offset;
    for (uint64_t i = 0; i < D; i++)
        dst[i] = t->type == LM_F16 ? lm_f16_to_f32(lm__u16(p + 2 * i))
                                   : lm_bf16_to_f32(lm__u16(p + 2 * i));
    return dst;
}

/* RoPE scaling as llama.cpp (llama_model::load_hparams, llama_context) reads
 * it for the llama architecture: rope.scaling.type (absent: linear), the
 * factor from rope.scaling.factor or the older rope.scale_linear (absent: 1;
 * none ignores it), rope.scaling.attn_factor, and for yarn
 * original_context_length (absent: the context length), ext_factor 1,
 * beta_fast 32, beta_slow 1 and the magnitude attn_factor * (1 + 0.1 ln
 * factor) when factor > 1. What llama.cpp reads but the decoder does not
 * follow is refused: longrope, yarn_log_multiplier, an ext_factor, betas or
 * attention factor of yarn's own. */
static kve_status parse_rope_scaling(const lm_gguf *g, lm_config *c, uint64_t T)
{
    const char *sv = "linear";
    size_t sl = 6;
    const gg_kv *type = find_kv(g, "llama.rope.scaling.type");
    if (type && !key_str(g, type, &sv, &sl))
        return kve_set_error(KVE_EFORMAT, "GGUF: llama.rope.scaling.type is not a string");
    if (str_is(sv, sl, "none"))
        c->rope_scaling = LM_ROPE_SCALING_NONE;
    else if (str_is(sv, sl, "linear"))
        c->rope_scaling = LM_ROPE_SCALING_LINEAR;
    else if (str_is(sv, sl, "yarn"))
        c->rope_scaling = LM_ROPE_SCALING_YARN;
    else
        return kve_set_error(KVE_EFORMAT, "GGUF: llama.rope.scaling.type '%.*s' is not supported "
                             "(none, linear, yarn)", sl > 32 ? 32 : (int)sl, sv);
    static const char *const unsupported[] = {
        "llama.rope.scaling.yarn_log_multiplier", "llama.rope.scaling.yarn_ext_factor",
        "llama.rope.scaling.yarn_attn_factor", "llama.rope.scaling.yarn_beta_fast",
        "llama.rope.scaling.yarn_beta_slow", "llama.rope.scaling.alpha"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (find_kv(g, unsupported[i]))
            return kve_set_error(KVE_EFORMAT, "GGUF: %s is not supported (the decoder follows "
                                 "llama.cpp's yarn at its defaults only)", unsupported[i]);
    float factor = 1.0f, attn = 1.0f;
    kve_status st = find_kv(g, "llama.rope.scaling.factor")
                        ? key_float(g, "llama.rope.scaling.factor", 0, &factor)
                        : key_float(g, "llama.rope.scale_linear", 0, &factor);
    if (st == KVE_OK)
        st = key_float(g, "llama.rope.scaling.attn_factor", 0, &attn);
    uint64_t orig = T;
    if (st == KVE_OK)
        st = key_int(g, "llama.rope.scaling.original_context_length", 0, 1, INT32_MAX, &orig);
    if (st != KVE_OK)
        return st;
    lm_rope_scaling_set(c, c->rope_scaling, factor, attn, (int32_t)orig);
    return KVE_OK;
}

/* rope_freqs.weight, when the file has one: (S/2) float32 factors, each
 * finite and positive, that divide the pairs' frequencies. */
static kve_status get_rope_freqs(lm_gguf *g, uint64_t S, const float **out)
{
    *out = NULL;
    if (!find_tensor(g, "rope_freqs.weight"))
        return KVE_OK;
    gg_tensor *t;
    kve_status st = get_tensor(g, "rope_freqs.weight", S / 2, 0, "head size / 2", &t);
    if (st != KVE_OK)
        return st;
    if (t->type != LM_F32)
        return kve_set_error(KVE_EFORMAT, "GGUF: tensor rope_freqs.weight must be F32, not %s",
                             lm_dtype_name(t->type));
    const float *f = (const float *)(const void *)(g->base + g->data_start + t->offset);
    for (uint64_t j = 0; j < S / 2; j++)
        if (!(f[j] > 0.0f && f[j] <= 3.40282347e38f))
            return kve_set_error(KVE_EFORMAT, "GGUF: rope_freqs.weight[%llu] is %g: a frequency "
                                 "factor must be positive and finite", (unsigned long long)j,
                                 (double)f[j]);
    *out = f;
    return KVE_OK;
}

static int32_t start_token(const lm_gguf *g, uint64_t n);

static kve_status parse_llama(lm_model *m, lm_gguf *g)
{
    lm_config *c = &m->config;
    const char *arch;
    size_t arch_len;
    const gg_kv *ak = find_kv(g, "general.architecture");
    if (!ak)
        return kve_set_error(KVE_EFORMAT, "GGUF: the key general.architecture is missing");
    if (!key_str(g, ak, &arch, &arch_len))
        return kve_set_error(KVE_EFORMAT, "GGUF: general.architecture is not a string");
    if (!str_is(arch, arch_len, "llama"))
        return kve_set_error(KVE_EFORMAT, "GGUF: architecture '%.*s' is not supported (only llama)",
                       arch_len > 64 ? 64 : (int)arch_len, arch);
    const uint64_t I32 = INT32_MAX;
    uint64_t D = 0, F = 0, L = 0, H = 0, G = 0, T = 0, rope = 0, experts = 0, kl = 0, vl = 0;
    kve_status st = key_int(g, "llama.embedding_length", 1, 1, I32, &D);
    if (st == KVE_OK)
        st = key_int(g, "llama.feed_forward_length", 1, 1, I32, &F);
    if (st == KVE_OK)
        st = key_int(g, "llama.block_count", 1, 1, I32, &L);
    if (st == KVE_OK)
        st = key_int(g, "llama.attention.head_count", 1, 1, I32, &H);
    if (st == KVE_OK)
        st = key_int(g, "llama.context_length", 1, 1, I32, &T);
    G = H;
    if (st == KVE_OK)
        st = key_int(g, "llama.attention.head_count_kv", 0, 1, I32, &G);
    if (st == KVE_OK)
        st = key_float(g, "llama.attention.layer_norm_rms_epsilon", 1, &c->norm_eps);
    if (st == KVE_OK)
        st = key_float(g, "llama.rope.freq_base", 0, &c->rope_theta);
    if (st == KVE_OK)
        st = key_int(g, "llama.expert_count", 0, 0, I32, &experts);
    if (st != KVE_OK)
        return st;
    if (experts > 0)
        return kve_set_error(KVE_EFORMAT, "GGUF: llama.expert_count %llu: mixtures of experts are not "
                       "supported", (unsigned long long)experts);
    if (D % H != 0)
        return kve_set_error(KVE_EFORMAT, "GGUF: llama.embedding_length %llu is not a multiple of "
                       "llama.attention.head_count %llu", (unsigned long long)D,
                       (unsigned long long)H);
    if (G > H || H % G != 0)
        return kve_set_error(KVE_EFORMAT, "GGUF: llama.attention.head_count %llu is not a multiple of "
                       "llama.attention.head_count_kv %llu", (unsigned long long)H,
                       (unsigned long long)G);
    uint64_t S = D / H;
    if (S % 2 != 0)
        return kve_set_error(KVE_EFORMAT, "GGUF: the head size %llu (embedding_length / head_count) "
                       "must be even for the rotary embedding", (unsigned long long)S);
    rope = S;
    kl = vl = S;
    st = key_int(g, "llama.rope.dimension_count", 0, 0, UINT64_MAX, &rope);
    if (st == KVE_OK)
        st = key_int(g, "llama.attention.key_length", 0, 0, UINT64_MAX, &kl);
    if (st == KVE_OK)
        st = key_int(g, "llama.attention.value_length", 0, 0, UINT64_MAX, &vl);
    if (st != KVE_OK)
        return st;
    if (rope != S || kl != S || vl != S)
        return kve_set_error(KVE_EFORMAT, "GGUF: llama.rope.dimension_count %llu, key_length %llu and "
                       "value_length %llu must equal the head size %llu (partial rotary "
                       "embeddings and other head sizes are not supported)",
                       (unsigned long long)rope, (unsigned long long)kl, (unsigned long long)vl,
                       (unsigned long long)S);
    if ((st = parse_rope_scaling(g, c, T)) != KVE_OK)
        return st;
    const gg_tensor *emb = find_tensor(g, "token_embd.weight");
    if (!emb)
        return kve_set_error(KVE_EFORMAT, "GGUF: the tensor token_embd.weight is missing");
    uint64_t V = emb->ne[1], vocab = V;
    if (V == 0 || V > I32)
        return kve_set_error(KVE_EFORMAT, "GGUF: tensor token_embd.weight: %llu rows, not a "
                       "vocabulary size in [1, 2^31)", (unsigned long long)V);
    st = key_int(g, "llama.vocab_size", 0, 0, UINT64_MAX, &vocab);
    if (st != KVE_OK)
        return st;
    if (vocab != V)
        return kve_set_error(KVE_EFORMAT, "GGUF: llama.vocab_size %llu, but token_embd.weight has "
                       "%llu rows", (unsigned long long)vocab, (unsigned long long)V);
    c->dim = (int32_t)D;
    c->hidden_dim = (int32_t)F;
    c->n_layers = (int32_t)L;
    c->n_heads = (int32_t)H;
    c->n_kv_heads = (int32_t)G;
    c->vocab_size = (int32_t)V;
    c->seq_len = (int32_t)T;
    c->head_size = (int32_t)S;
    c->version = (int)g->version;
    c->bos = start_token(g, V);

    /* Every tensor, by name and shape. The layer table is allocated first
     * (its size bounded by the tensor count the file holds); the 16-bit
     * norms are widened last, into a buffer bounded by their bytes in the
     * file. */
    uint64_t Q = H * S, K = G * S;
    if (g->n_t < 2 + 9 * L)
        return kve_set_error(KVE_EFORMAT, "GGUF: %zu tensors, fewer than the %llu of %llu blocks",
                       g->n_t, (unsigned long long)(2 + 9 * L), (unsigned long long)L);
    lm_weights *w = &m->weights;
    w->layer = lm_calloc(&m->alloc, (size_t)L, sizeof *w->layer);
    if (!w->layer)
        return kve_set_error(KVE_ENOMEM, "GGUF: out of memory for %llu layers", (unsigned long long)L);
    size_t n16 = 0;
    st = get_matrix(g, "token_embd.weight", D, V, "embedding_length, vocabulary",
                    &w->token_embedding);
    if (st == KVE_OK)
        st = get_norm(g, "output_norm.weight", D, &w->rms_final, &n16);
    if (st == KVE_OK)
        st = get_rope_freqs(g, S, &w->rope_freqs);
    c->rope_freqs = w->rope_freqs != NULL;
    c->shared_classifier = find_tensor(g, "output.weight") == NULL;
    if (st == KVE_OK && !c->shared_classifier)
        st = get_matrix(g, "output.weight", D, V, "embedding_length, vocabulary", &w->wcls);
    if (c->shared_classifier)
        w->wcls = w->token_embedding;
    char name[64];
    for (uint64_t l = 0; st == KVE_OK && l < L; l++) {
        lm_layer *ly = &w->layer[l];
        struct {
            const char *suffix;
            uint64_t cols, rows;
            const char *what;
            lm_matrix *m;
        } mx[] = {{"attn_q", D, Q, "embedding_length, head_count x head size", &ly->wq},
                  {"attn_k", D, K, "embedding_length, head_count_kv x head size", &ly->wk},
                  {"attn_v", D, K, "embedding_length, head_count_kv x head size", &ly->wv},
                  {"attn_output", Q, D, "head_count x head size, embedding_length", &ly->wo},
                  {"ffn_gate", D, F, "embedding_length, feed_forward_length", &ly->w1},
                  {"ffn_down", F, D, "feed_forward_length, embedding_length", &ly->w2},
                  {"ffn_up", D, F, "embedding_length, feed_forward_length", &ly->w3}};
        snprintf(name, sizeof name, "blk.%llu.attn_norm.weight", (unsigned long long)l);
        st = get_norm(g, name, D, &ly->rms_att, &n16);
        if (st == KVE_OK) {
            snprintf(name, sizeof name, "blk.%llu.ffn_norm.weight", (unsigned long long)l);
            st = get_norm(g, name, D, &ly->rms_ffn, &n16);
        }
        for (size_t i = 0; st == KVE_OK && i < sizeof mx / sizeof mx[0]; i++) {
            snprintf(name, sizeof name, "blk.%llu.%s.weight", (unsigned long long)l, mx[i].suffix);
            st = get_matrix(g, name, mx[i].cols, mx[i].rows, mx[i].what, mx[i].m);
        }
    }
    for (size_t i = 0; st == KVE_OK && i < g->n_t; i++)
        if (!g->t[i].used)
            st = kve_set_error(KVE_EFORMAT, "GGUF: unexpected tensor %.*s (the llama architecture "
                         "has no such tensor; refused rather than ignored)",
                         (int)g->t[i].name.len, g->t[i].name.s);
    if (st != KVE_OK || n16 == 0)
        return st;
    float *buf = m->norms = lm_malloc(&m->alloc, n16 * (size_t)D * sizeof(float));
    if (!buf)
        return kve_set_error(KVE_ENOMEM, "GGUF: out of memory for %zu norms", n16);
    if (!w->rms_final) {
        w->rms_final = widen_norm(g, "output_norm.weight", D, buf);
        buf += D;
    }
    for (uint64_t l = 0; l < L; l++) {
        lm_layer *ly = &w->layer[l];
        if (!ly->rms_att) {
            snprintf(name, sizeof name, "blk.%llu.attn_norm.weight", (unsigned long long)l);
            ly->rms_att = widen_norm(g, name, D, buf);
            buf += D;
        }
        if (!ly->rms_ffn) {
            snprintf(name, sizeof name, "blk.%llu.ffn_norm.weight", (unsigned long long)l);
            ly->rms_ffn = widen_norm(g, name, D, buf);
            buf += D;
        }
    }
    return KVE_OK;
}

kve_status lm__gguf_parse(lm_model *m, const unsigned char *data, size_t size)
{
    lm_gguf *g = lm_calloc(&m->alloc, 1, sizeof *g);
    if (!g)
        return kve_set_error(KVE_ENOMEM, "GGUF: out of memory");
    g->alloc = m->alloc;
    g->base = data;
    g->size = size;
    m->gguf = g;
    kve_status st = parse_container(g, data, size);
    return st == KVE_OK ? parse_llama(m, g) : st;
}

/* ---- the vocabulary ---- */

/* The element offsets of an array of strings, in order: calls fn for each. */
typedef struct str_iter {
    const unsigned char *base;
    size_t off;
} str_iter;

static void str_next(str_iter *it, const char **s, size_t *len)
{
    *len = (size_t)le(it->base + it->off, 8);
    *s = (const char *)(it->base + it->off + 8);
    it->off += 8 + *len;
}

/* What llama.cpp's llama_vocab reads besides the pieces: the kind, the
 * pre-tokenizer, the special ids (defaults of the kind, out of the
 * vocabulary: none; then each key inside it) and the flags. */
typedef struct vocab_meta {
    lm_tok_kind kind;
    lm_tok_pre pre;
    int32_t bos, eos, unk, eot, eom;
    int add_bos, add_eos, add_space_prefix, ignore_merges;
} vocab_meta;

/* An optional boolean key into *v (untouched when absent). */
static kve_status key_bool(const lm_gguf *g, const char *key, int *v)
{
    const gg_kv *k = find_kv(g, key);
    if (!k)
        return KVE_OK;
    if (k->type != T_BOOL)
        return kve_set_error(KVE_EFORMAT, "tokenizer: %s is a %s, not a bool", key,
                             k->type < N_TYPES ? type_names[k->type] : "?");
    *v = g->base[k->val] != 0;
    return KVE_OK;
}

static kve_status read_vocab_meta(const lm_gguf *g, uint64_t n, vocab_meta *v)
{
    const char *model, *pre = "";
    size_t mlen, plen = 0;
    const gg_kv *mk = find_kv(g, "tokenizer.ggml.model");
    if (!mk)
        return kve_set_error(KVE_EFORMAT, "tokenizer: the GGUF has no tokenizer.ggml.model (give a "
                       "tokenizer.bin, or token ids)");
    if (!key_str(g, mk, &model, &mlen))
        return kve_set_error(KVE_EFORMAT, "tokenizer: tokenizer.ggml.model is not a string");
    const gg_kv *pk = find_kv(g, "tokenizer.ggml.pre");
    if (pk && !key_str(g, pk, &pre, &plen))
        return kve_set_error(KVE_EFORMAT, "tokenizer: tokenizer.ggml.pre is not a string");
    int bos_null = 0;
    memset(v, 0, sizeof *v);
    v->eot = v->eom = -1;
    if (str_is(model, mlen, "llama")) { /* SentencePiece */
        v->kind = LM_TOK_SPM;
        v->pre = LM_PRE_NONE;
        v->bos = 1, v->eos = 2, v->unk = 0;
        v->add_bos = 1, v->add_space_prefix = 1;
    } else if (str_is(model, mlen, "gpt2")) { /* byte-level BPE */
        v->kind = LM_TOK_BPE;
        v->bos = 11, v->eos = 11, v->unk = -1;
        if (!lm__pre_lookup(pre, plen, &v->pre, &v->add_bos, &v->ignore_merges, &bos_null))
            return kve_set_error(KVE_EFORMAT, "tokenizer: tokenizer.ggml.pre '%.*s' is not supported "
                           "(the decoder has default, gpt-2, llama-bpe, qwen2, smollm and their "
                           "aliases: docs/decoder.md)", plen > 64 ? 64 : (int)plen, pre);
    } else {
        return kve_set_error(KVE_EFORMAT, "tokenizer: tokenizer.ggml.model '%.*s' is not supported "
                       "(llama, SentencePiece, and gpt2, byte-level BPE; give token ids instead)",
                       mlen > 64 ? 64 : (int)mlen, model);
    }
    if (bos_null)
        v->bos = -1;
    static const char *const keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                       "tokenizer.ggml.unknown_token_id",
                                       "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
    int32_t *ids[] = {&v->bos, &v->eos, &v->unk, &v->eot, &v->eom};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (*ids[i] >= 0 && (uint64_t)*ids[i] >= n)
            *ids[i] = -1; /* a default outside the vocabulary: none */
        uint64_t x = UINT64_MAX;
        kve_status st = key_int(g, keys[i], 0, 0, UINT64_MAX, &x);
        if (st != KVE_OK)
            return st;
        if (x < n) /* one outside keeps the default, as llama.cpp (which warns) */
            *ids[i] = (int32_t)x;
    }
    kve_status st = key_bool(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix);
    if (st == KVE_OK)
        st = key_bool(g, "tokenizer.ggml.add_bos_token", &v->add_bos);
    if (st == KVE_OK)
        st = key_bool(g, "tokenizer.ggml.add_eos_token", &v->add_eos);
    return st;
}

/* lm_config.bos: the BOS a GGUF's vocabulary starts a sequence with, -1
 * when it adds none; run.c's 1 when there is no readable vocabulary. */
static int32_t start_token(const lm_gguf *g, uint64_t n)
{
    vocab_meta v;
    if (!find_kv(g, "tokenizer.ggml.model") || read_vocab_meta(g, n, &v) != KVE_OK)
        return LM_BOS;
    return v.add_bos && v.bos >= 0 ? v.bos : -1;
}

/* An array of type et with at least n elements (exactly n: exact), or absent
 * (need 0): its pair. */
static kve_status tok_array_min(const lm_gguf *g, const char *key, uint32_t et, uint32_t et2,
                                uint64_t n, int exact, int need, const gg_kv **out)
{
    const gg_kv *k = find_kv(g, key);
    *out = NULL;
    if (!k)
        return need ? kve_set_error(KVE_EFORMAT, "tokenizer: the GGUF has no %s", key) : KVE_OK;
    if (k->type != T_ARRAY || (k->arr_type != et && k->arr_type != et2))
        return kve_set_error(KVE_EFORMAT, "tokenizer: %s is not an array of %s%s%s", key,
                             type_names[et], et2 != et ? " or " : "", et2 != et ? type_names[et2] : "");
    if (exact ? k->arr_n != n : k->arr_n < n)
        return kve_set_error(KVE_EFORMAT, "tokenizer: %s has %llu entries, the model's vocabulary %llu",
                       key, (unsigned long long)k->arr_n, (unsigned long long)n);
    *out = k;
    return KVE_OK;
}

static unsigned char attr_of(int32_t type)
{
    switch (type) {
    case 1: return LM_ATTR_NORMAL;
    case 2: return LM_ATTR_UNKNOWN;
    case 3: return LM_ATTR_CONTROL;
    case 4: return LM_ATTR_USER;
    case 5: return LM_ATTR_UNUSED;
    case 6: return LM_ATTR_BYTE;
    default: return 0; /* undefined */
    }
}

/* The merges of tokenizer.ggml.merges into t (a BPE vocabulary needs them). */
static kve_status read_merges(const lm_gguf *g, lm_tokenizer *t)
{
    const gg_kv *k = find_kv(g, "tokenizer.ggml.merges");
    if (!k)
        return kve_set_error(KVE_EFORMAT, "tokenizer: a gpt2 vocabulary without tokenizer.ggml.merges");
    if (k->type != T_ARRAY || k->arr_type != T_STRING)
        return kve_set_error(KVE_EFORMAT, "tokenizer: tokenizer.ggml.merges is not an array of string");
    if (k->arr_n > INT32_MAX)
        return kve_set_error(KVE_EFORMAT, "tokenizer: %llu merges, more than %d",
                             (unsigned long long)k->arr_n, INT32_MAX);
    size_t n = (size_t)k->arr_n;
    const char **s = lm_malloc(&t->alloc, (n ? n : 1) * sizeof *s);
    size_t *len = lm_malloc(&t->alloc, (n ? n : 1) * sizeof *len);
    kve_status st = KVE_OK;
    if (!s || !len)
        st = kve_set_error(KVE_ENOMEM, "tokenizer: out of memory for %zu merges", n);
    str_iter it = {g->base, k->arr_val};
    for (size_t i = 0; st == KVE_OK && i < n; i++)
        str_next(&it, &s[i], &len[i]);
    if (st == KVE_OK)
        st = lm__vocab_merges(t, s, len, n);
    lm_free(&t->alloc, (void *)s);
    lm_free(&t->alloc, len);
    return st;
}

kve_status lm_tokenizer_from_model(const lm_model *m, const kve_allocator *allocator,
                                   lm_tokenizer **out)
{
    if (!m || !out)
        return kve_set_error(KVE_EINVAL, "tokenizer: NULL argument");
    const lm_gguf *g = m->gguf;
    if (!g)
        return kve_set_error(KVE_EINVAL, "tokenizer: a %s checkpoint has no tokenizer (give "
                       "tokenizer.bin)", lm_format_name(m->config.format));
    uint64_t n = (uint64_t)m->config.vocab_size;
    vocab_meta v;
    kve_status st = read_vocab_meta(g, n, &v);
    const gg_kv *tokens = NULL, *scores = NULL, *types = NULL;
    if (st == KVE_OK)
        st = tok_array_min(g, "tokenizer.ggml.tokens", T_STRING, T_STRING, n, 1, 1, &tokens);
    if (st == KVE_OK)
        st = tok_array_min(g, "tokenizer.ggml.scores", T_F32, T_I32, n, 0, 0, &scores);
    if (st == KVE_OK)
        st = tok_array_min(g, "tokenizer.ggml.token_type", T_I32, T_I32, n, 0, 0, &types);
    if (st != KVE_OK)
        return st;
    /* Sizes first, then one allocation of the bytes; an empty piece reads
     * "[EMPTY_<id>]", as llama.cpp's loader makes it. */
    size_t total = 0;
    str_iter it = {g->base, tokens->arr_val};
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        str_next(&it, &s, &len);
        if (memchr(s, 0, len))
            return kve_set_error(KVE_EFORMAT, "tokenizer: tokenizer.ggml.tokens[%llu] holds a NUL byte",
                           (unsigned long long)i);
        if (len > INT32_MAX)
            return kve_set_error(KVE_EFORMAT, "tokenizer: tokenizer.ggml.tokens[%llu] is too long",
                           (unsigned long long)i);
        total += len ? len : 32;
    }
    lm_tokenizer *t;
    st = lm__tokenizer_alloc(allocator, (size_t)n, total, &t);
    if (st != KVE_OK)
        return st;
    t->kind = v.kind;
    t->pre = v.pre;
    t->attr = lm_malloc(&t->alloc, (size_t)n);
    if (!t->attr) {
        lm_tokenizer_free(t);
        return kve_set_error(KVE_ENOMEM, "tokenizer: out of memory for %llu pieces",
                             (unsigned long long)n);
    }
    it.off = tokens->arr_val;
    char *dst = t->bytes;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        str_next(&it, &s, &len);
        t->piece[i] = dst;
        if (len)
            memcpy(dst, s, len);
        else
            len = (size_t)snprintf(dst, 32, "[EMPTY_%llu]", (unsigned long long)i);
        t->len[i] = (int32_t)len;
        dst += len;
        float sc = 0.0f;
        if (scores && scores->arr_type == T_F32) {
            uint32_t u = (uint32_t)le(g->base + scores->arr_val + 4 * i, 4);
            memcpy(&sc, &u, sizeof sc);
        } else if (scores) {
            sc = (float)(int32_t)(uint32_t)le(g->base + scores->arr_val + 4 * i, 4);
        }
        if (sc != sc) {
            lm_tokenizer_free(t);
            return kve_set_error(KVE_EFORMAT, "tokenizer: tokenizer.ggml.scores[%llu] is NaN",
                           (unsigned long long)i);
        }
        t->score[i] = sc;
        t->attr[i] = types ? attr_of((int32_t)(uint32_t)le(g->base + types->arr_val + 4 * i, 4))
                           : LM_ATTR_NORMAL;
    }
    st = lm__tokenizer_finish(t);
    t->max_token_length = t->longest;
    t->bos = v.bos, t->eos = v.eos, t->unk = v.unk;
    t->add_bos = v.add_bos, t->add_eos = v.add_eos;
    t->add_space_prefix = v.kind == LM_TOK_SPM && v.add_space_prefix; /* BPE never adds one */
    t->ignore_merges = v.ignore_merges;
    if (st == KVE_OK && v.kind == LM_TOK_BPE)
        st = read_merges(g, t);
    if (st == KVE_OK)
        st = lm__vocab_finish(t, v.eot, v.eom);
    if (st != KVE_OK) {
        lm_tokenizer_free(t);
        return st;
    }
    *out = t;
    return KVE_OK;
}

/* ---- metadata as the file has it ---- */

size_t lm_gguf_pairs(const lm_model *m, const char *prefix,
                     void (*fn)(void *user, const void *pair, size_t bytes), void *user)
{
    const lm_gguf *g = m ? m->gguf : NULL;
    size_t count = 0, np = prefix ? strlen(prefix) : 0;
    for (size_t i = 0; g && i < g->n_kv; i++) {
        const gg_kv *k = &g->kv[i];
        if (prefix && (k->key.len < np || memcmp(k->key.s, prefix, np) != 0))
            continue;
        const unsigned char *start = (const unsigned char *)k->key.s - 8;
        if (fn)
            fn(user, start, (size_t)(g->base + k->end - start));
        count++;
    }
    return count;
}

int lm_gguf_string(const lm_model *m, const char *key, const char **s, size_t *len)
{
    const lm_gguf *g = m ? m->gguf : NULL;
    return g && key_str(g, find_kv(g, key), s, len);
}
