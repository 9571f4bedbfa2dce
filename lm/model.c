/*
 * model.c - llama2.c checkpoints: the legacy and version-1 float32 formats.
 *
 * Invariants: nothing is read from the file before the header says it is
 * there; every size is computed in 64 bits with overflow checks; a model is
 * only returned when the file is exactly as long as its header promises, so
 * every weight pointer lies inside the mapping, and only when every weight
 * is finite (a NaN or an infinity is refused naming its tensor: it would
 * otherwise surface as null logits or a policy refusing the attention).
 * Messages name the field.
 */
#define _POSIX_C_SOURCE 200809L
#include "lm.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

enum { LEGACY_HEADER = 28, V1_HEADER = 256, V1_MAGIC = 0x616b3432 };

static const char *const field_name[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                          "n_kv_heads", "vocab_size", "seq_len"};

static int32_t read_i32(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* *acc += a * b * c (counts of floats), 0 on overflow. */
static int add_product(uint64_t *acc, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) ||
        __builtin_add_overflow(*acc, abc, acc))
        return 0;
    return 1;
}

/* Fills c from the seven int32 at p and checks them; `legacy` allows the
 * negative vocab_size that flags an unshared classifier. */
static kve_status parse_params(const unsigned char *p, int legacy, lm_config *c)
{
    int32_t f[7];
    for (int i = 0; i < 7; i++)
        f[i] = read_i32(p + (size_t)4 * (size_t)i);
    for (int i = 0; i < 7; i++) {
        if (i == 5 && legacy && f[i] < 0 && f[i] != INT32_MIN)
            continue;
        if (f[i] <= 0)
            return kve_set_error(KVE_EFORMAT, "checkpoint header: %s %d must be positive", field_name[i],
                           f[i]);
    }
    c->dim = f[0];
    c->hidden_dim = f[1];
    c->n_layers = f[2];
    c->n_heads = f[3];
    c->n_kv_heads = f[4];
    c->vocab_size = f[5] < 0 ? -f[5] : f[5];
    c->seq_len = f[6];
    if (legacy)
        c->shared_classifier = f[5] > 0;
    if (c->dim % c->n_heads != 0)
        return kve_set_error(KVE_EFORMAT, "checkpoint header: dim %d is not a multiple of n_heads %d",
                       c->dim, c->n_heads);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        return kve_set_error(KVE_EFORMAT,
                       "checkpoint header: n_heads %d is not a multiple of n_kv_heads %d",
                       c->n_heads, c->n_kv_heads);
    c->head_size = c->dim / c->n_heads;
    if (c->head_size % 2 != 0)
        return kve_set_error(KVE_EFORMAT,
                       "checkpoint header: head_size %d (dim / n_heads) must be even for the "
                       "rotary embedding",
                       c->head_size);
    return KVE_OK;
}

/* The index of the first of p[0 .. n) that is NaN or infinite (its
 * exponent bits all set), n when every value is finite. Reads the bits, so
 * no floating-point exception or compiler assumption is involved. */
static uint64_t first_not_finite(const float *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + i, sizeof u);
        if ((u & 0x7f800000u) == 0x7f800000u)
            return i;
    }
    return n;
}

/* Lays the weights out from `base` in the order of the format and checks
 * that they end exactly at the end of the file. */
static kve_status lay_out(lm_model *m, const float *base, uint64_t payload_bytes)
{
    const lm_config *c = &m->config;
    uint64_t V = (uint64_t)c->vocab_size, D = (uint64_t)c->dim, F = (uint64_t)c->hidden_dim;
    uint64_t L = (uint64_t)c->n_layers, S = (uint64_t)c->head_size, T = (uint64_t)c->seq_len;
    uint64_t Q = (uint64_t)c->n_heads * S, K = (uint64_t)c->n_kv_heads * S;
    /* Offsets, in floats, of every tensor in the order of the format. */
    enum { EMB, RMS_ATT, WQ, WK, WV, WO, RMS_FFN, W1, W2, W3, RMS_FINAL, ROPE, CLS, N_T };
    uint64_t count[N_T] = {0}, off[N_T] = {0}, total = 0;
    int ok = add_product(&count[EMB], V, D, 1) && add_product(&count[RMS_ATT], L, D, 1) &&
             add_product(&count[WQ], L, Q, D) && add_product(&count[WK], L, K, D) &&
             add_product(&count[WV], L, K, D) && add_product(&count[WO], L, D, Q) &&
             add_product(&count[RMS_FFN], L, D, 1) && add_product(&count[W1], L, F, D) &&
             add_product(&count[W2], L, D, F) && add_product(&count[W3], L, F, D) &&
             add_product(&count[RMS_FINAL], D, 1, 1) &&
             (c->version != 0 || add_product(&count[ROPE], T, S, 1)) &&
             (c->shared_classifier || add_product(&count[CLS], V, D, 1));
    static const int legacy_order[N_T] = {EMB, RMS_ATT, WQ, WK,        WV,   WO, RMS_FFN,
                                          W1,  W2,      W3, RMS_FINAL, ROPE, CLS};
    static const int v1_order[N_T] = {RMS_ATT, RMS_FFN, RMS_FINAL, EMB, WQ,   WK, WV,
                                      WO,      W1,      W2,        W3,  ROPE, CLS};
    const int *order = c->version == 0 ? legacy_order : v1_order;
    for (int i = 0; ok && i < N_T; i++) {
        off[order[i]] = total;
        ok = !__builtin_add_overflow(total, count[order[i]], &total);
    }
    if (!ok || total > UINT64_MAX / 4)
        return kve_set_error(KVE_EFORMAT,
                       "checkpoint header: dim %d, hidden_dim %d, n_layers %d, vocab_size %d, "
                       "seq_len %d describe more weights than 64 bits count",
                       c->dim, c->hidden_dim, c->n_layers, c->vocab_size, c->seq_len);
    if (total * 4 != payload_bytes)
        return kve_set_error(KVE_EFORMAT,
                       "checkpoint: the header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                       "n_kv_heads %d, vocab_size %d, seq_len %d, %s classifier) promises %llu "
                       "bytes of weights, the file holds %llu",
                       c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                       c->seq_len, c->shared_classifier ? "shared" : "unshared",
                       (unsigned long long)total * 4u, (unsigned long long)payload_bytes);
    static const char *const tensor_name[N_T] = {
        "token_embedding", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn",
        "w1", "w2", "w3", "rms_final", "rope", "wcls"};
    for (int i = 0; i < N_T; i++) {
        if (i == ROPE) /* present in legacy files, never read */
            continue;
        uint64_t bad = first_not_finite(base + off[i], count[i]);
        if (bad < count[i])
            return kve_set_error(KVE_EFORMAT, "checkpoint: tensor %s holds %s at element %llu",
                                 tensor_name[i], isnan(base[off[i] + bad]) ? "NaN"
                                                                                 : "an infinity",
                                 (unsigned long long)bad);
    }
    lm_weights *w = &m->weights;
    w->token_embedding = base + off[EMB];
    w->rms_att = base + off[RMS_ATT];
    w->wq = base + off[WQ];
    w->wk = base + off[WK];
    w->wv = base + off[WV];
    w->wo = base + off[WO];
    w->rms_ffn = base + off[RMS_FFN];
    w->w1 = base + off[W1];
    w->w2 = base + off[W2];
    w->w3 = base + off[W3];
    w->rms_final = base + off[RMS_FINAL];
    w->wcls = c->shared_classifier ? w->token_embedding : base + off[CLS];
    return KVE_OK;
}

/* Parses a whole checkpoint image into m (config and weights). */
static kve_status parse(lm_model *m, const unsigned char *data, size_t size)
{
    lm_config *c = &m->config;
    memset(c, 0, sizeof *c);
    m->image = data;
    m->image_size = size;
    if (size >= 4 && (uint32_t)read_i32(data) == V1_MAGIC) {
        c->version = 1;
        if (size < 8)
            return kve_set_error(KVE_EFORMAT, "checkpoint: %zu bytes, truncated in the field version",
                           size);
        int32_t version = read_i32(data + 4);
        if (version != 1)
            return kve_set_error(KVE_EFORMAT,
                           "checkpoint: version %d is not supported (only version 1, float32)",
                           version);
        if (size < 8 + LEGACY_HEADER)
            return kve_set_error(KVE_EFORMAT, "checkpoint: %zu bytes, truncated in the field %s", size,
                           field_name[(size - 8) / 4]);
        if (size < V1_HEADER)
            return kve_set_error(KVE_EFORMAT,
                           "checkpoint: %zu bytes, truncated in the 256-byte version-1 header",
                           size);
        kve_status st = parse_params(data + 8, 0, c);
        if (st != KVE_OK)
            return st;
        unsigned flag = data[8 + LEGACY_HEADER];
        if (flag > 1)
            return kve_set_error(KVE_EFORMAT,
                           "checkpoint header: shared_classifier flag %u must be 0 or 1", flag);
        c->shared_classifier = (int)flag;
        return lay_out(m, (const float *)(const void *)(data + V1_HEADER), size - V1_HEADER);
    }
    if (size < LEGACY_HEADER)
        return kve_set_error(KVE_EFORMAT, "checkpoint: %zu bytes, truncated in the field %s", size,
                       field_name[size / 4]);
    kve_status st = parse_params(data, 1, c);
    if (st != KVE_OK)
        return st;
    return lay_out(m, (const float *)(const void *)(data + LEGACY_HEADER), size - LEGACY_HEADER);
}

kve_status lm_model_from_memory(const void *data, size_t size, const kve_allocator *allocator,
                                lm_model **out)
{
    if (!data || !out)
        return kve_set_error(KVE_EINVAL, "checkpoint: NULL argument");
    if ((uintptr_t)data % 4 != 0)
        return kve_set_error(KVE_EINVAL, "checkpoint: data must be 4-byte aligned");
    lm_model *m = lm_calloc(allocator, 1, sizeof *m);
    if (!m)
        return kve_set_error(KVE_ENOMEM, "checkpoint: out of memory");
    if (allocator)
        m->alloc = *allocator;
    kve_status st = parse(m, data, size);
    if (st != KVE_OK) {
        lm_free(allocator, m);
        return st;
    }
    *out = m;
    return KVE_OK;
}

kve_status lm_model_open(const char *path, const kve_allocator *allocator, lm_model **out)
{
    if (!path || !out)
        return kve_set_error(KVE_EINVAL, "checkpoint: NULL argument");
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return kve_set_error(KVE_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kve_set_error(KVE_EIO, "cannot read %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kve_set_error(KVE_EIO, "cannot read %s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return kve_set_error(KVE_EFORMAT, "checkpoint %s: too large to map", path);
    }
    size_t size = (size_t)st.st_size;
    lm_model *m = lm_calloc(allocator, 1, sizeof *m);
    if (!m) {
        close(fd);
        return kve_set_error(KVE_ENOMEM, "checkpoint: out of memory");
    }
    if (allocator)
        m->alloc = *allocator;
    static const unsigned char empty[4] = {0};
    const unsigned char *data = empty;
    if (size > 0) {
        void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            lm_free(allocator, m);
            return kve_set_error(KVE_EIO, "cannot map %s: %s", path, strerror(e));
        }
        m->map = map;
        m->map_size = size;
        data = map;
    }
    close(fd);
    kve_status s = parse(m, data, size);
    if (s != KVE_OK) {
        lm_model_free(m);
        return s;
    }
    *out = m;
    return KVE_OK;
}

void lm_model_free(lm_model *m)
{
    if (!m)
        return;
    if (m->map)
        munmap(m->map, m->map_size);
    const kve_allocator a = m->alloc;
    lm_free(&a, m);
}
