/*
 * lm_fixture.h - tiny llama2.c models and tokenizers made by the tests
 * themselves: random weights from a seed, written in the legacy, version-1
 * and version-2 checkpoint formats, and a small tokenizer.bin.
 *
 * Nothing here shares code with lm/ (files are read with stdio): the writer
 * follows llama2.c's
 * export.py (legacy_export, version1_export) on its own, so a loader that
 * reads tensors in the wrong order fails the tests. For a (shape, seed) the
 * weights are the same on every run (splitmix64).
 */
#ifndef KVE_LM_FIXTURE_H
#define KVE_LM_FIXTURE_H

#include "lm.h"
#include "read_file.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fx_model {
    int dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared;
    float *emb;       /* (V, D) */
    float *rms_att;   /* (L, D) */
    float *wq;        /* (L, H*S, D) */
    float *wk, *wv;   /* (L, G*S, D) */
    float *wo;        /* (L, D, H*S) */
    float *rms_ffn;   /* (L, D) */
    float *w1, *w3;   /* (L, F, D) */
    float *w2;        /* (L, D, F) */
    float *rms_final; /* (D) */
    float *rope;      /* (2, T, S/2): written in legacy files, never read */
    float *cls;       /* (V, D): emb when shared */
} fx_model;

static inline uint64_t fx_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* uniform in [-a, a) */
static inline float fx_uniform(uint64_t *s, double a)
{
    return (float)(((double)(fx_next(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * a);
}

static inline float *fx_tensor(uint64_t *s, size_t n, double center, double a)
{
    float *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++)
        t[i] = (float)center + fx_uniform(s, a);
    return t;
}

/* Random weights scaled so activations stay of order 1. */
static inline void fx_model_init(fx_model *m, int dim, int hidden, int layers, int heads,
                                 int kv_heads, int vocab, int seq_len, int shared, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    m->dim = dim, m->hidden = hidden, m->layers = layers, m->heads = heads;
    m->kv_heads = kv_heads, m->vocab = vocab, m->seq_len = seq_len, m->shared = shared;
    size_t D = (size_t)dim, F = (size_t)hidden, L = (size_t)layers, S = D / (size_t)heads;
    size_t K = (size_t)kv_heads * S, V = (size_t)vocab, T = (size_t)seq_len;
    uint64_t s = seed;
    double wd = 1.0 / sqrt((double)D), wf = 1.0 / sqrt((double)F);
    m->emb = fx_tensor(&s, V * D, 0, 1.0);
    m->rms_att = fx_tensor(&s, L * D, 1.0, 0.2);
    m->wq = fx_tensor(&s, L * D * D, 0, 1.5 * wd);
    m->wk = fx_tensor(&s, L * K * D, 0, 1.5 * wd);
    m->wv = fx_tensor(&s, L * K * D, 0, wd);
    m->wo = fx_tensor(&s, L * D * D, 0, wd);
    m->rms_ffn = fx_tensor(&s, L * D, 1.0, 0.2);
    m->w1 = fx_tensor(&s, L * F * D, 0, wd);
    m->w2 = fx_tensor(&s, L * D * F, 0, wf);
    m->w3 = fx_tensor(&s, L * F * D, 0, wd);
    m->rms_final = fx_tensor(&s, D, 1.0, 0.2);
    m->rope = fx_tensor(&s, T * S, 0, 1.0);
    m->cls = shared ? m->emb : fx_tensor(&s, V * D, 0, 1.0);
}

static inline void fx_model_free(fx_model *m)
{
    float *t[] = {m->emb,     m->rms_att, m->wq, m->wk, m->wv,        m->wo,
                  m->rms_ffn, m->w1,      m->w2, m->w3, m->rms_final, m->rope};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        free(t[i]);
    if (!m->shared)
        free(m->cls);
}

/* A growing byte buffer. */
typedef struct fx_buf {
    unsigned char *p;
    size_t n, cap;
} fx_buf;

static inline void fx_put(fx_buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static inline void fx_i32(fx_buf *b, int32_t v)
{
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 24)};
    fx_put(b, le, 4);
}

static inline void fx_floats(fx_buf *b, const float *f, size_t n)
{
    fx_put(b, f, n * sizeof *f); /* the tests run on little-endian machines */
}

/* The checkpoint image: version 0 (legacy) or 1. Free with free(). */
static inline unsigned char *fx_image(const fx_model *m, int version, size_t *size)
{
    fx_buf b = {0};
    size_t D = (size_t)m->dim, F = (size_t)m->hidden, L = (size_t)m->layers;
    size_t S = D / (size_t)m->heads, K = (size_t)m->kv_heads * S, V = (size_t)m->vocab;
    int32_t params[7] = {m->dim, m->hidden, m->layers, m->heads, m->kv_heads, m->vocab, m->seq_len};
    if (version == 0) {
        if (!m->shared)
            params[5] = -params[5];
        for (int i = 0; i < 7; i++)
            fx_i32(&b, params[i]);
        fx_floats(&b, m->emb, V * D);
        fx_floats(&b, m->rms_att, L * D);
        fx_floats(&b, m->wq, L * D * D);
        fx_floats(&b, m->wk, L * K * D);
        fx_floats(&b, m->wv, L * K * D);
        fx_floats(&b, m->wo, L * D * D);
        fx_floats(&b, m->rms_ffn, L * D);
        fx_floats(&b, m->w1, L * F * D);
        fx_floats(&b, m->w2, L * D * F);
        fx_floats(&b, m->w3, L * F * D);
        fx_floats(&b, m->rms_final, D);
        fx_floats(&b, m->rope, (size_t)m->seq_len * S);
    } else {
        fx_i32(&b, 0x616b3432);
        fx_i32(&b, 1);
        for (int i = 0; i < 7; i++)
            fx_i32(&b, params[i]);
        unsigned char flag = (unsigned char)m->shared;
        fx_put(&b, &flag, 1);
        unsigned char zero[256] = {0};
        fx_put(&b, zero, 256 - b.n);
        fx_floats(&b, m->rms_att, L * D);
        fx_floats(&b, m->rms_ffn, L * D);
        fx_floats(&b, m->rms_final, D);
        fx_floats(&b, m->emb, V * D);
        fx_floats(&b, m->wq, L * D * D);
        fx_floats(&b, m->wk, L * K * D);
        fx_floats(&b, m->wv, L * K * D);
        fx_floats(&b, m->wo, L * D * D);
        fx_floats(&b, m->w1, L * F * D);
        fx_floats(&b, m->w2, L * D * F);
        fx_floats(&b, m->w3, L * F * D);
    }
    if (!m->shared)
        fx_floats(&b, m->cls, V * D);
    *size = b.n;
    return b.p;
}

/* llama2.c's version 2 (export.py's version2_export, runq.c's reader): the
 * version-1 header with version 2 and int32 group_size after the flag;
 * float32 norms; then each quantized tensor (the embedding, wq, wk, wv, wo,
 * w1, w2, w3 of every layer in turn, the classifier when untied) as int8
 * values then float32 scales, one per `group` values: s = max |w| / 127,
 * q = round(w / s), ties to even (torch.round). Free with free(). */
static inline void fx_put_q80(fx_buf *b, const float *w, size_t n, size_t group)
{
    unsigned char *q = malloc(n);
    float *s = malloc(n / group * sizeof *s);
    for (size_t g = 0; g < n / group; g++) {
        float wmax = 0;
        for (size_t j = g * group; j < (g + 1) * group; j++)
            wmax = fabsf(w[j]) > wmax ? fabsf(w[j]) : wmax;
        s[g] = wmax / 127.0f;
        for (size_t j = g * group; j < (g + 1) * group; j++)
            q[j] = (unsigned char)(int8_t)(s[g] > 0 ? nearbyintf(w[j] / s[g]) : 0);
    }
    fx_put(b, q, n);
    fx_floats(b, s, n / group);
    free(q);
    free(s);
}

static inline unsigned char *fx_image_v2(const fx_model *m, size_t group, size_t *size)
{
    fx_buf b = {0};
    size_t D = (size_t)m->dim, F = (size_t)m->hidden, L = (size_t)m->layers;
    size_t S = D / (size_t)m->heads, K = (size_t)m->kv_heads * S, V = (size_t)m->vocab;
    int32_t params[7] = {m->dim, m->hidden, m->layers, m->heads, m->kv_heads, m->vocab, m->seq_len};
    fx_i32(&b, 0x616b3432);
    fx_i32(&b, 2);
    for (int i = 0; i < 7; i++)
        fx_i32(&b, params[i]);
    unsigned char flag = (unsigned char)m->shared;
    fx_put(&b, &flag, 1);
    fx_i32(&b, (int32_t)group);
    unsigned char zero[256] = {0};
    fx_put(&b, zero, 256 - b.n);
    fx_floats(&b, m->rms_att, L * D);
    fx_floats(&b, m->rms_ffn, L * D);
    fx_floats(&b, m->rms_final, D);
    fx_put_q80(&b, m->emb, V * D, group);
    const struct {
        const float *w;
        size_t n;
    } t[] = {{m->wq, D * D}, {m->wk, K * D}, {m->wv, K * D}, {m->wo, D * D},
             {m->w1, F * D}, {m->w2, D * F}, {m->w3, F * D}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        for (size_t l = 0; l < L; l++)
            fx_put_q80(&b, t[i].w + l * t[i].n, t[i].n, group);
    if (!m->shared)
        fx_put_q80(&b, m->cls, V * D, group);
    *size = b.n;
    return b.p;
}

static inline int fx_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static inline int fx_write_model(const fx_model *m, int version, const char *path)
{
    size_t n;
    unsigned char *img = fx_image(m, version, &n);
    int rc = fx_write_file(path, img, n);
    free(img);
    return rc;
}

/* ---- a tokenizer.bin: <unk>, <s>, </s>, the 256 byte pieces, then the
 * learned pieces below with their scores ---- */

static const char *const fx_learned[] = {
    " ",        "a",   "b",           "c",  "e",   "h",    "t",   "ab",
    "ba",       " a",  " t",          "th", "the", " the", "he",  "abc",
    "\xc3\xa9", "caf", "caf\xc3\xa9", "  ", "bb",  "aa",   "aaa", "\xe2\x82\xac",
    "T",        " is", " key",        "?",  "."};
static const float fx_learned_score[] = {-1.0f, -2.0f, -2.0f, -2.5f, -2.2f, -3.0f, -1.5f, -4.0f,
                                         -4.0f, -3.0f, -3.0f, -2.0f, -1.0f, -0.5f, -2.0f, -5.0f,
                                         -6.0f, -7.0f, -8.0f, -4.0f, -4.0f, -4.0f, -4.0f, -6.0f,
                                         -2.0f, -3.0f, -3.0f, -2.0f, -2.0f};
enum { FX_LEARNED = sizeof fx_learned / sizeof fx_learned[0] };
/* Then the 64 pass keys "<key00>" .. "<key63>" (score -1e10: never merged). */
enum { FX_KEYS = 64, FX_FIRST_KEY = 3 + 256 + FX_LEARNED, FX_PIECES = FX_FIRST_KEY + FX_KEYS };

static inline unsigned char *fx_tokenizer_image(size_t *size)
{
    fx_buf b = {0};
    fx_i32(&b, 16);
    char piece[16];
    for (int i = 0; i < FX_PIECES; i++) {
        float score = 0;
        if (i == 0)
            snprintf(piece, sizeof piece, "<unk>");
        else if (i == 1)
            snprintf(piece, sizeof piece, "\n<s>\n");
        else if (i == 2)
            snprintf(piece, sizeof piece, "\n</s>\n");
        else if (i < 259)
            snprintf(piece, sizeof piece, "<0x%02X>", i - 3);
        else if (i < FX_FIRST_KEY) {
            snprintf(piece, sizeof piece, "%s", fx_learned[i - 259]);
            score = fx_learned_score[i - 259];
        } else {
            snprintf(piece, sizeof piece, "<key%02d>", i - FX_FIRST_KEY);
            score = -1e10f;
        }
        int32_t len = (int32_t)strlen(piece);
        fx_put(&b, &score, 4);
        fx_i32(&b, len);
        fx_put(&b, piece, (size_t)len);
    }
    *size = b.n;
    return b.p;
}

/* The whole file at `path` (read_file.h): NUL-terminated beyond *len (len
 * may be NULL); NULL if it cannot be read. Free with free(). */
static inline char *fx_slurp(const char *path, size_t *len)
{
    return read_whole_file(path, len);
}

/* ---- the files of `kvevict lm logits` ---- */

/* Parses `{"pos": t, "token": id, "logits": [V numbers]}` lines (positions
 * 0, 1, ... in order) into logits (n, V) and tokens (n), at most cap lines.
 * Returns the lines read, or (size_t)-1 for text of another shape. */
static inline size_t fx_parse_logits(const char *s, int32_t V, float *logits, int32_t *tokens,
                                     size_t cap)
{
    size_t n = 0;
    while (*s && n < cap) {
        long pos;
        int tok, used = 0;
        if (sscanf(s, "{\"pos\": %ld, \"token\": %d, \"logits\": [%n", &pos, &tok, &used) != 2 ||
            used == 0 || pos != (long)n)
            return (size_t)-1;
        tokens[n] = tok;
        s += used;
        for (int32_t i = 0; i < V; i++) {
            char *end;
            logits[n * (size_t)V + (size_t)i] = strtof(s, &end);
            if (end == s)
                return (size_t)-1;
            s = end;
            if (i + 1 < V && strncmp(s, ", ", 2) != 0)
                return (size_t)-1;
            s += i + 1 < V ? 2 : 0;
        }
        if (strncmp(s, "]}\n", 3) != 0)
            return (size_t)-1;
        s += 3;
        n++;
    }
    return n;
}

#endif /* KVE_LM_FIXTURE_H */
