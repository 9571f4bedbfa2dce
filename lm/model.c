/*
 * model.c - checkpoints: the format told from the first bytes; llama2.c's
 * legacy and version-1 float32 formats and its version-2 int8 format here,
 * GGUF in gguf.c; the file mmapped.
 *
 * Invariants: nothing is read from the file before the header says it is
 * there; every size is computed in 64 bits with overflow checks; a llama2.c
 * model is only returned when the file is exactly as long as its header
 * promises, so every weight pointer lies inside the mapping, and only when
 * every weight is finite (a NaN or an infinity is refused naming its tensor
 * as its format names it: every float32 value of the legacy and version-1
 * formats, version 2's norms and int8 scales here, GGUF's float values and
 * block scales in gguf.c; it would otherwise surface as null logits or a
 * policy refusing the attention). Messages name the field. A failed parse
 * frees everything it allocated (release()).
 */
#define _POSIX_C_SOURCE 200809L
#include "lm.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
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

/* A float32 matrix (rows, cols) at base. */
static lm_matrix f32_matrix(const float *base, size_t rows, size_t cols)
{
    return (lm_matrix){.data = base, .type = LM_F32, .rows = rows, .cols = cols,
                       .row_bytes = 4 * cols};
}

/* The per-layer tables of m (L entries), allocated. */
static kve_status alloc_layers(lm_model *m)
{
    m->weights.layer = lm_calloc(&m->alloc, (size_t)m->config.n_layers, sizeof *m->weights.layer);
    return m->weights.layer ? KVE_OK : kve_set_error(KVE_ENOMEM, "checkpoint: out of memory");
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

/* KVE_EFORMAT naming tensor `name` and the element when one of its n
 * float32 values at p is not finite. */
static kve_status check_floats(const char *name, const float *p, uint64_t n)
{
    uint64_t bad = first_not_finite(p, n);
    if (bad == n)
        return KVE_OK;
    return kve_set_error(KVE_EFORMAT, "checkpoint: tensor %s holds %s at element %llu", name,
                         isnan(p[bad]) ? "NaN" : "an infinity", (unsigned long long)bad);
}

/* Lays the float32 weights out from `base` in the order of the format
 * (legacy or version 1) and checks that they end exactly at the end of the
 * file. */
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
        kve_status fin = check_floats(tensor_name[i], base + off[i], count[i]);
        if (fin != KVE_OK)
            return fin;
    }
    kve_status st = alloc_layers(m);
    if (st != KVE_OK)
        return st;
    lm_weights *w = &m->weights;
    w->token_embedding = f32_matrix(base + off[EMB], V, D);
    for (uint64_t l = 0; l < L; l++) {
        lm_layer *ly = &w->layer[l];
        ly->rms_att = base + off[RMS_ATT] + l * D;
        ly->rms_ffn = base + off[RMS_FFN] + l * D;
        ly->wq = f32_matrix(base + off[WQ] + l * Q * D, Q, D);
        ly->wk = f32_matrix(base + off[WK] + l * K * D, K, D);
        ly->wv = f32_matrix(base + off[WV] + l * K * D, K, D);
        ly->wo = f32_matrix(base + off[WO] + l * D * Q, D, Q);
        ly->w1 = f32_matrix(base + off[W1] + l * F * D, F, D);
        ly->w2 = f32_matrix(base + off[W2] + l * D * F, D, F);
        ly->w3 = f32_matrix(base + off[W3] + l * F * D, F, D);
    }
    w->rms_final = base + off[RMS_FINAL];
    w->wcls = c->shared_classifier ? w->token_embedding : f32_matrix(base + off[CLS], V, D);
    return KVE_OK;
}

/* Version 2 (runq.c): float32 norms, then per tensor its int8 values and
 * float32 scales, one per group_size values (group_size divides every row,
 * so a group never straddles two). Every norm value and
 * every scale must be finite. */
static kve_status lay_out_v2(lm_model *m, const unsigned char *base, uint64_t payload_bytes)
{
    const lm_config *c = &m->config;
    uint64_t V = (uint64_t)c->vocab_size, D = (uint64_t)c->dim, F = (uint64_t)c->hidden_dim;
    uint64_t L = (uint64_t)c->n_layers, S = (uint64_t)c->head_size, G = (uint64_t)c->group_size;
    uint64_t Q = (uint64_t)c->n_heads * S, K = (uint64_t)c->n_kv_heads * S;
    /* The quantized tensors in file order: (rows, cols) and how many. */
    struct {
        const char *name;
        uint64_t rows, cols, n;
    } t[] = {{"token_embedding", V, D, 1}, {"wq", Q, D, L}, {"wk", K, D, L}, {"wv", K, D, L},
             {"wo", D, Q, L},  {"w1", F, D, L}, {"w2", D, F, L}, {"w3", F, D, L},
             {"wcls", V, D, c->shared_classifier ? 0 : 1}};
    enum { N_Q = sizeof t / sizeof t[0] };
    uint64_t norms = 0, total = 0, bytes[N_Q];
    int ok = add_product(&norms, 2 * L + 1, D, 1) && !__builtin_mul_overflow(norms, 4, &total);
    for (int i = 0; ok && i < N_Q; i++) {
        uint64_t e = 0; /* values of one tensor; 1 + 4 / G bytes each */
        ok = add_product(&e, t[i].rows, t[i].cols, 1) && e / G <= UINT64_MAX / 4 &&
             !__builtin_add_overflow(e, e / G * 4, &bytes[i]);
        uint64_t all = 0;
        ok = ok && add_product(&all, bytes[i], t[i].n, 1) &&
             !__builtin_add_overflow(total, all, &total);
    }
    if (!ok)
        return kve_set_error(KVE_EFORMAT,
                       "checkpoint header: dim %d, hidden_dim %d, n_layers %d, vocab_size %d "
                       "describe more weights than 64 bits count",
                       c->dim, c->hidden_dim, c->n_layers, c->vocab_size);
    if (total != payload_bytes)
        return kve_set_error(KVE_EFORMAT,
                       "checkpoint: the header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                       "n_kv_heads %d, vocab_size %d, group_size %d, %s classifier) promises "
                       "%llu bytes of weights, the file holds %llu",
                       c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                       c->group_size, c->shared_classifier ? "shared" : "unshared",
                       (unsigned long long)total, (unsigned long long)payload_bytes);
    const float *nf = (const float *)(const void *)base;
    static const char *const norm_name[3] = {"rms_att", "rms_ffn", "rms_final"};
    for (uint64_t i = 0; i < 3; i++) {
        kve_status fin = check_floats(norm_name[i], nf + i * L * D, i < 2 ? L * D : D);
        if (fin != KVE_OK)
            return fin;
    }
    kve_status st = alloc_layers(m);
    if (st != KVE_OK)
        return st;
    lm_weights *w = &m->weights;
    for (uint64_t l = 0; l < L; l++) {
        w->layer[l].rms_att = nf + l * D;
        w->layer[l].rms_ffn = nf + (L + l) * D;
    }
    w->rms_final = nf + 2 * L * D;
    const unsigned char *p = base + norms * 4;
    for (int i = 0; i < N_Q; i++) {
        for (uint64_t l = 0; l < t[i].n; l++, p += bytes[i]) {
            uint64_t e = t[i].rows * t[i].cols;
            lm_matrix mx = {.data = p, .scales = p + e, .type = LM_I8G, .rows = t[i].rows,
                            .cols = t[i].cols, .row_bytes = t[i].cols, .group = G};
            for (uint64_t g = 0; g < e / G; g++) {
                float s = lm__i8g_scale(&mx, g * G);
                if (!(fabsf(s) <= 3.40282347e38f)) {
                    char name[48];
                    if (t[i].n > 1)
                        snprintf(name, sizeof name, "%s of layer %llu", t[i].name,
                                 (unsigned long long)l);
                    else
                        snprintf(name, sizeof name, "%s", t[i].name);
                    return kve_set_error(KVE_EFORMAT, "checkpoint: %s: scale %llu is %g, not finite",
                                   name, (unsigned long long)g, (double)s);
                }
            }
            lm_matrix *dst = i == 0 ? &w->token_embedding
                             : i == N_Q - 1 ? &w->wcls
                             : i == 1 ? &w->layer[l].wq
                             : i == 2 ? &w->layer[l].wk
                             : i == 3 ? &w->layer[l].wv
                             : i == 4 ? &w->layer[l].wo
                             : i == 5 ? &w->layer[l].w1
                             : i == 6 ? &w->layer[l].w2
                                      : &w->layer[l].w3;
            *dst = mx;
        }
    }
    if (c->shared_classifier)
        w->wcls = w->token_embedding;
    return KVE_OK;
}

static const unsigned char gguf_magic[4] = {'G', 'G', 'U', 'F'};

/* Parses a whole checkpoint image into m (config and weights). */
static kve_status parse(lm_model *m, const unsigned char *data, size_t size)
{
    lm_config *c = &m->config;
    memset(c, 0, sizeof *c);
    m->image = data;
    m->image_size = size;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_scaling = LM_ROPE_SCALING_NONE;
    c->rope_factor = 1.0f;
    c->rope_attn_factor = 1.0f;
    c->rope_mscale = 1.0f;
    c->bos = LM_BOS; /* run.c's; a GGUF's own is read by lm__gguf_parse */
    if (size >= 4 && memcmp(data, gguf_magic, 4) == 0) {
        c->format = LM_FORMAT_GGUF;
        return lm__gguf_parse(m, data, size);
    }
    if (size >= 4 && (uint32_t)read_i32(data) == V1_MAGIC) {
        if (size < 8)
            return kve_set_error(KVE_EFORMAT, "checkpoint: %zu bytes, truncated in the field version",
                           size);
        int32_t version = read_i32(data + 4);
        if (version != 1 && version != 2)
            return kve_set_error(KVE_EFORMAT,
                           "checkpoint: version %d is not supported (version 1 is float32, 2 "
                           "int8 groups)",
                           version);
        c->version = version;
        c->format = version == 1 ? LM_FORMAT_V1 : LM_FORMAT_V2;
        if (size < 8 + LEGACY_HEADER)
            return kve_set_error(KVE_EFORMAT, "checkpoint: %zu bytes, truncated in the field %s", size,
                           field_name[(size - 8) / 4]);
        if (size < V1_HEADER)
            return kve_set_error(KVE_EFORMAT,
                           "checkpoint: %zu bytes, truncated in the 256-byte version-%d header",
                           size, version);
        kve_status st = parse_params(data + 8, 0, c);
        if (st != KVE_OK)
            return st;
        unsigned flag = data[8 + LEGACY_HEADER];
        if (flag > 1)
            return kve_set_error(KVE_EFORMAT,
                           "checkpoint header: shared_classifier flag %u must be 0 or 1", flag);
        c->shared_classifier = (int)flag;
        if (version == 1)
            return lay_out(m, (const float *)(const void *)(data + V1_HEADER), size - V1_HEADER);
        int32_t gs = read_i32(data + 8 + LEGACY_HEADER + 1);
        if (gs <= 0 || gs > 65536 || c->dim % gs != 0 || c->hidden_dim % gs != 0)
            return kve_set_error(KVE_EFORMAT,
                           "checkpoint header: group_size %d must be in [1, 65536] and divide "
                           "dim %d and hidden_dim %d",
                           gs, c->dim, c->hidden_dim);
        c->group_size = gs;
        return lay_out_v2(m, data + V1_HEADER, size - V1_HEADER);
    }
    if (size < LEGACY_HEADER)
        return kve_set_error(KVE_EFORMAT, "checkpoint: %zu bytes, truncated in the field %s", size,
                       field_name[size / 4]);
    kve_status st = parse_params(data, 1, c);
    if (st != KVE_OK)
        return st;
    c->format = LM_FORMAT_LEGACY;
    return lay_out(m, (const float *)(const void *)(data + LEGACY_HEADER), size - LEGACY_HEADER);
}

const char *lm_format_name(lm_format f)
{
    switch (f) {
    case LM_FORMAT_LEGACY: return "llama2.c legacy";
    case LM_FORMAT_V1: return "llama2.c version 1";
    case LM_FORMAT_V2: return "llama2.c version 2";
    case LM_FORMAT_GGUF: return "GGUF";
    default: return "unknown";
    }
}

/* Frees what parse() allocated in m, keeping the mapping. */
static void release(lm_model *m)
{
    lm_free(&m->alloc, m->weights.layer);
    m->weights.layer = NULL;
    lm_free(&m->alloc, m->norms);
    m->norms = NULL;
    lm_free(&m->alloc, m->packed);
    m->packed = NULL;
    m->packed_bytes = 0;
    lm__gguf_free(m->gguf);
    m->gguf = NULL;
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
        release(m);
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

/* Every matrix of the model, for lm_model_pack: up to 7 a layer and the
 * classifier; *n set. */
static size_t model_matrices(lm_model *m, lm_matrix **all, size_t cap)
{
    size_t n = 0;
    for (int32_t l = 0; l < m->config.n_layers; l++) {
        lm_layer *ly = &m->weights.layer[l];
        lm_matrix *mine[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->w3};
        for (size_t i = 0; i < 7 && n < cap; i++)
            all[n++] = mine[i];
    }
    if (n < cap)
        all[n++] = &m->weights.wcls;
    return n;
}

kve_status lm_model_pack(lm_model *m)
{
    if (!m)
        return kve_set_error(KVE_EINVAL, "lm_model_pack: model is NULL");
    if (m->packed)
        return KVE_OK;
    const size_t cap = 7 * (size_t)m->config.n_layers + 1;
    /* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers, sized by its element */
    lm_matrix **all = lm_calloc(&m->alloc, cap, sizeof *all);
    if (!all)
        return kve_set_error(KVE_ENOMEM, "lm_model_pack: out of memory");
    const size_t n = model_matrices(m, all, cap);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += lm_matrix_pack_bytes(all[i]);
    if (bytes) {
        unsigned char *p = lm_malloc(&m->alloc, bytes);
        if (!p) {
            lm_free(&m->alloc, all);
            return kve_set_error(KVE_ENOMEM, "lm_model_pack: %zu bytes for the packed matrices", bytes);
        }
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            const size_t b = lm_matrix_pack_bytes(all[i]);
            if (b) {
                lm_matrix_pack(all[i], p + at);
                all[i]->packed = p + at;
                at += b;
            }
        }
        m->packed = p;
        m->packed_bytes = bytes;
    }
    lm_free(&m->alloc, all);
    return KVE_OK;
}

void lm_model_free(lm_model *m)
{
    if (!m)
        return;
    release(m);
    if (m->map)
        munmap(m->map, m->map_size);
    const kve_allocator a = m->alloc;
    lm_free(&a, m);
}
