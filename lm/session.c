/* SPDX-License-Identifier: MIT */
/*
 * session.c - the decoder's state as an engine forks, rewinds and persists
 * it: lm_state_copy (a fork, a checkpoint, a restore) and the session image
 * (lm_session_save / lm_session_load), whose layout docs/decoder.md gives
 * byte for byte.
 *
 * Legend as lm.h; n_c = keys of cache c = (l, g), layer-major.
 *
 * Invariants: a copy and a load change nothing on refusal; everything they
 * need is allocated before the first byte of the destination changes, so
 * KVE_ENOMEM leaves it as it was too. The image is written and read with
 * explicit little-endian byte order (floats as their IEEE bits), so it is
 * the same file on every machine. Load trusts nothing: every count is
 * checked against the bytes that remain before it is used, the checksum
 * before anything else is parsed, and the caches against the bank's own
 * kept positions, so a loaded decoder is one that could have decoded.
 */
#include "lm.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- copy ---- */

/* "" for equal options of the two decoders, else what differs. */
static const char *difference(const lm_state *a, const lm_state *b)
{
    if (a->model != b->model)
        return "model";
    if ((a->spec == NULL) != (b->spec == NULL) || (a->spec && strcmp(a->spec, b->spec) != 0))
        return "policy";
    if (a->opt.positions != b->opt.positions)
        return "positions";
    if (a->opt.share_heads != b->opt.share_heads ||
        (a->opt.share_heads && a->opt.min_share != b->opt.min_share))
        return "head sharing";
    if (a->spec && !a->opt.same_positions != !b->opt.same_positions)
        return "same positions";
    if (a->opt.products != b->opt.products ||
        (a->opt.products == LM_PRODUCTS_LLAMA && a->opt.llama_cpu != b->opt.llama_cpu))
        return "products";
    size_t L = (size_t)a->model->config.n_layers;
    if (a->layer_budget && memcmp(a->layer_budget, b->layer_budget, L * sizeof(size_t)) != 0)
        return "layer budgets";
    return "";
}

/* The rows cache i of a copy needs: src's (its kept keys; in a shared
 * layer its part of the arena, so the copy is laid out as src is), or,
 * without src, counts[i] + 1 (a session's keys and room for the next). */
static size_t rows_of(const lm_state *src, const size_t *counts, size_t i)
{
    if (!src)
        return counts[i] + 1;
    return src->arena ? src->cache[i].cap : src->cache[i].n;
}

/* Makes room for rows_of(i) keys in each non-shared cache i of dst, or
 * gives every shared layer an arena of at least their sum; nothing
 * observable changes (the caches it grows are copied over afterwards, and
 * lay_shared then places them). */
static kve_status make_room(lm_state *dst, const lm_state *src, const size_t *counts)
{
    const lm_config *c = &dst->model->config;
    size_t S = (size_t)c->head_size, G = (size_t)c->n_kv_heads, LG = (size_t)c->n_layers * G;
    if (!dst->arena) {
        for (size_t i = 0; i < LG; i++) {
            lm_cache *k = &dst->cache[i];
            size_t want = rows_of(src, counts, i);
            if (k->cap >= want)
                continue;
            float *key = lm_realloc(&dst->alloc, k->key, want * S * sizeof(float));
            if (key)
                k->key = key;
            float *value = key ? lm_realloc(&dst->alloc, k->value, want * S * sizeof(float))
                               : NULL;
            if (value)
                k->value = value;
            int32_t *pos = value ? lm_realloc(&dst->alloc, k->pos, want * sizeof(int32_t)) : NULL;
            if (!pos)
                return kve_set_error(KVE_ENOMEM, "decoder: out of memory for a cache of %zu keys",
                                     want);
            k->pos = pos;
            k->cap = want;
        }
        return KVE_OK;
    }
    for (size_t l = 0; l * G < LG; l++) {
        size_t need = 0;
        for (size_t g = 0; g < G; g++)
            need += rows_of(src, counts, l * G + g);
        lm_arena *a = &dst->arena[l];
        if (a->cap >= need)
            continue;
        float *key = lm_malloc(&dst->alloc, need * S * sizeof(float));
        float *value = lm_malloc(&dst->alloc, need * S * sizeof(float));
        int32_t *pos = lm_malloc(&dst->alloc, need * sizeof(int32_t));
        if (!key || !value || !pos) {
            lm_free(&dst->alloc, key);
            lm_free(&dst->alloc, value);
            lm_free(&dst->alloc, pos);
            return kve_set_error(KVE_ENOMEM, "decoder: out of memory for layer %zu's cache of %zu "
                                 "keys", l, need);
        }
        /* The old rows move along (so a refusal after this changes nothing);
         * each cache keeps its offset. */
        if (a->cap) {
            memcpy(key, a->key, a->cap * S * sizeof(float));
            memcpy(value, a->value, a->cap * S * sizeof(float));
            memcpy(pos, a->pos, a->cap * sizeof(int32_t));
        }
        for (size_t g = 0; g < G; g++) {
            lm_cache *k = &dst->cache[l * G + g];
            size_t at = k->cap ? (size_t)(k->pos - a->pos) : 0;
            k->key = key + at * S;
            k->value = value + at * S;
            k->pos = pos + at;
        }
        lm_free(&dst->alloc, a->key);
        lm_free(&dst->alloc, a->value);
        lm_free(&dst->alloc, a->pos);
        a->key = key;
        a->value = value;
        a->pos = pos;
        a->cap = need;
    }
    return KVE_OK;
}

/* Cache i of dst gets n keys: positions, keys and values from the arrays
 * (a shared layer: laid out as make_room left it, or as the arena was). */
static void put_cache(lm_state *dst, size_t i, size_t n, const int32_t *pos, const float *key,
                      const float *value)
{
    size_t S = (size_t)dst->model->config.head_size;
    lm_cache *k = &dst->cache[i];
    k->n = n;
    if (n == 0) /* an empty cache may have no rows at all */
        return;
    memcpy(k->pos, pos, n * sizeof *pos);
    memcpy(k->key, key, n * S * sizeof *key);
    memcpy(k->value, value, n * S * sizeof *value);
}

/* Places the caches of each shared layer of dst in its arena: cache g at
 * the sum of rows_of before it, rows_of(g) rows, the last one the rest. */
static void lay_shared(lm_state *dst, const lm_state *src, const size_t *counts)
{
    const lm_config *c = &dst->model->config;
    size_t S = (size_t)c->head_size, G = (size_t)c->n_kv_heads, L = (size_t)c->n_layers;
    for (size_t l = 0; dst->arena && l < L; l++) {
        lm_arena *a = &dst->arena[l];
        size_t to = 0;
        for (size_t g = 0; g < G; g++) {
            lm_cache *k = &dst->cache[l * G + g];
            k->key = a->key + to * S;
            k->value = a->value + to * S;
            k->pos = a->pos + to;
            size_t rows = rows_of(src, counts, l * G + g);
            k->cap = g + 1 < G ? rows : a->cap - to;
            to += rows;
        }
    }
}

/* What KVzip's overall budgets left (layer_keep) follows a copy: the
 * destination's own array, made when the source has one. */
static kve_status copy_layer_keep(lm_state *dst, const lm_state *src)
{
    const size_t L = (size_t)src->model->config.n_layers;
    if (!src->layer_keep) {
        if (dst->layer_keep)
            memset(dst->layer_keep, 0, L * sizeof *dst->layer_keep);
        return KVE_OK;
    }
    if (!dst->layer_keep && !(dst->layer_keep = lm_calloc(&dst->alloc, L, sizeof(size_t)))) {
        dst->broken = 1;
        return kve_set_error(KVE_ENOMEM, "decoder copy: out of memory for %zu layer totals", L);
    }
    memcpy(dst->layer_keep, src->layer_keep, L * sizeof *dst->layer_keep);
    return KVE_OK;
}

kve_status lm_state_copy(lm_state *dst, const lm_state *src)
{
    if (!dst || !src || dst == src)
        return kve_set_error(KVE_EINVAL, "decoder copy: %s", !dst || !src ? "NULL state"
                                                                          : "dst is src");
    if (src->broken || src->prefilling)
        return kve_set_error(KVE_EINVAL, "decoder copy: the source is %s",
                             src->broken ? "broken" : "prefilling");
    const char *d = difference(dst, src);
    if (*d)
        return kve_set_error(KVE_EINVAL, "decoder copy: the two decoders differ in their %s", d);
    const lm_config *c = &src->model->config;
    size_t LG = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    kve_status st = make_room(dst, src, NULL);
    if (st == KVE_OK && src->bank)
        st = kve_bank_copy(dst->bank, src->bank);
    if (st == KVE_OK) {
        lay_shared(dst, src, NULL);
        for (size_t i = 0; i < LG; i++) {
            const lm_cache *k = &src->cache[i];
            put_cache(dst, i, k->n, k->pos, k->key, k->value);
        }
        memcpy(dst->logits, src->logits, (size_t)c->vocab_size * sizeof(float));
        dst->pos = src->pos;
        dst->broken = 0;
        st = copy_layer_keep(dst, src);
    }
    return st;
}

/* ---- the image ---- */

enum {
    SESSION_VERSION = 1,
    HEADER = LM_SESSION_HEADER, /* the fixed part, up to the spec */
    FLAG_CACHE_POS = 1, /* positions cache (else original) */
    FLAG_SHARED = 2,    /* each layer's KV heads share its budget */
    FLAG_POLICY = 4,    /* a policy and its bank (else every key kept) */
    FLAG_SAME = 8,      /* every (layer, KV head) keeps the same positions */
    FLAG_LLAMA = 16,    /* LM_PRODUCTS_LLAMA: llama.cpp's arithmetic */
    FLAGS_KNOWN = 31
};
static const unsigned char session_magic[8] = {'k', 'v', 'e', 's', 'e', 's', 's', '\0'};

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

uint64_t lm_model_fingerprint(const lm_model *m)
{
    return fnv1a(m->image, m->image_size);
}

/* A little-endian writer that counts what it would write beyond cap. */
typedef struct writer {
    unsigned char *p;
    size_t at, cap;
} writer;

static void put_bytes(writer *w, const void *b, size_t n)
{
    if (n && w->p && w->at <= w->cap && n <= w->cap - w->at)
        memcpy(w->p + w->at, b, n);
    w->at += n;
}

static void put_u32(writer *w, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    put_bytes(w, b, 4);
}

static void put_u64(writer *w, uint64_t v)
{
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}

static void put_floats(writer *w, const float *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, f + i, 4);
        put_u32(w, u);
    }
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p)
{
    return get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static int32_t get_i32(const unsigned char *p)
{
    uint32_t u = get_u32(p);
    int32_t v;
    memcpy(&v, &u, 4);
    return v;
}

static float get_f32(const unsigned char *p)
{
    uint32_t u = get_u32(p);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static uint32_t flags_of(const lm_state *s)
{
    return (s->opt.positions == LM_POS_CACHE ? FLAG_CACHE_POS : 0) |
           (s->opt.share_heads ? FLAG_SHARED : 0) | (s->bank ? FLAG_POLICY : 0) |
           (s->bank && s->opt.same_positions ? FLAG_SAME : 0) |
           (s->opt.products == LM_PRODUCTS_LLAMA ? FLAG_LLAMA : 0);
}

static void config_words(const lm_config *c, int32_t out[7])
{
    int32_t w[7] = {c->dim,        c->hidden_dim, c->n_layers, c->n_heads,
                    c->n_kv_heads, c->vocab_size, c->seq_len};
    memcpy(out, w, sizeof w);
}

static const char *const config_name[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                           "n_kv_heads", "vocab_size", "seq_len"};

kve_status lm_session_save(const lm_state *s, const lm_session *ss, void *buf, size_t cap,
                           size_t *size)
{
    if (!s || !ss || !size || (ss->n_tokens && !ss->tokens))
        return kve_set_error(KVE_EINVAL, "session save: NULL argument");
    if (s->broken || s->prefilling)
        return kve_set_error(KVE_EINVAL, "session save: the decoder is %s",
                             s->broken ? "broken" : "prefilling");
    if (ss->n_tokens != (size_t)s->pos)
        return kve_set_error(KVE_EINVAL, "session save: %zu tokens for a decoder at position %d",
                             ss->n_tokens, s->pos);
    for (size_t l = 0; s->layer_keep && l < (size_t)s->model->config.n_layers; l++)
        if (s->layer_keep[l])
            return kve_set_error(KVE_EINVAL, "session save: the decoder's layers keep the totals "
                                 "KVzip's overall budgets gave them, which a session does not "
                                 "hold");
    const lm_config *c = &s->model->config;
    for (size_t i = 0; i < ss->n_tokens; i++)
        if (ss->tokens[i] < 0 || ss->tokens[i] >= c->vocab_size)
            return kve_set_error(KVE_EINVAL, "session save: token %zu = %d is outside the "
                                 "vocabulary [0, %d)", i, ss->tokens[i], c->vocab_size);
    if (!(ss->rng.s[0] | ss->rng.s[1] | ss->rng.s[2] | ss->rng.s[3]))
        return kve_set_error(KVE_EINVAL, "session save: the sampler's generator is all zero, a "
                             "state xoshiro256** never reaches");
    size_t bank_size = 0;
    if (s->bank && kve_bank_save(s->bank, NULL, 0, &bank_size) != KVE_OK)
        return kve_set_error(KVE_EINVAL, "session save: %s", kve_last_error());
    size_t L = (size_t)c->n_layers, G = (size_t)c->n_kv_heads, S = (size_t)c->head_size;
    /* what a load refuses is never written: the logits, keys and values finite */
    for (size_t i = 0; i < (size_t)c->vocab_size; i++)
        if (!isfinite(s->logits[i]))
            return kve_set_error(KVE_ERANGE, "session save: logit %zu is not finite; not saved", i);
    for (size_t i = 0; i < L * G; i++)
        for (size_t j = 0; j < s->cache[i].n * S; j++)
            if (!isfinite(s->cache[i].key[j]) || !isfinite(s->cache[i].value[j]))
                return kve_set_error(KVE_ERANGE, "session save: the cache of layer %zu, KV head "
                                     "%zu: %s element %zu is not finite; not saved", i / G, i % G,
                                     isfinite(s->cache[i].key[j]) ? "value" : "key", j);
    size_t spec_len = s->spec ? strlen(s->spec) : 0;
    writer w = {.p = buf, .cap = buf ? cap : 0};
    int32_t words[7];
    config_words(c, words);
    put_bytes(&w, session_magic, 8);
    put_u32(&w, SESSION_VERSION);
    put_u32(&w, flags_of(s));
    put_u64(&w, lm_model_fingerprint(s->model));
    for (int i = 0; i < 7; i++)
        put_u32(&w, (uint32_t)words[i]);
    put_u32(&w, (uint32_t)spec_len);
    uint64_t share_bits = 0;
    double share = s->opt.share_heads ? s->opt.min_share : 0.0;
    memcpy(&share_bits, &share, 8);
    put_u64(&w, share_bits);
    put_u32(&w, (uint32_t)ss->n_tokens);
    put_u32(&w, 0); /* reserved */
    for (int i = 0; i < 4; i++)
        put_u64(&w, ss->rng.s[i]);
    put_u64(&w, bank_size);
    size_t at_size = w.at;
    put_u64(&w, 0); /* the image's size, written below */
    put_bytes(&w, s->spec, spec_len);
    for (size_t l = 0; s->bank && l < L; l++)
        put_u32(&w, (uint32_t)s->layer_budget[l]);
    for (size_t i = 0; i < ss->n_tokens; i++)
        put_u32(&w, (uint32_t)ss->tokens[i]);
    put_floats(&w, s->logits, (size_t)c->vocab_size);
    if (s->bank) {
        if (buf && w.at <= cap && bank_size <= cap - w.at &&
            kve_bank_save(s->bank, w.p + w.at, bank_size, &bank_size) != KVE_OK)
            return kve_set_error(KVE_EINVAL, "session save: %s", kve_last_error());
        w.at += bank_size;
    }
    for (size_t i = 0; i < L * G; i++) {
        const lm_cache *k = &s->cache[i];
        put_u32(&w, (uint32_t)k->n);
        for (size_t j = 0; j < k->n; j++)
            put_u32(&w, (uint32_t)k->pos[j]);
        put_floats(&w, k->key, k->n * S);
        put_floats(&w, k->value, k->n * S);
    }
    size_t need = w.at + 8;
    *size = need;
    if (!buf)
        return KVE_OK;
    if (cap < need)
        return kve_set_error(KVE_ERANGE, "session save: %zu bytes do not hold the image's %zu",
                             cap, need);
    writer ws = {.p = buf, .at = at_size, .cap = cap};
    put_u64(&ws, need);
    put_u64(&w, fnv1a(buf, need - 8));
    return KVE_OK;
}

/* A reader over the image: take(n) returns the next n bytes, or NULL
 * (and sets the error naming `what`) when fewer remain. */
typedef struct reader {
    const unsigned char *p;
    size_t at, size;
} reader;

static const unsigned char *take(reader *r, size_t n, const char *what)
{
    if (n > r->size - r->at) {
        kve_set_error(KVE_EFORMAT, "session: %zu bytes, truncated in %s", r->size + 8, what);
        return NULL;
    }
    const unsigned char *q = r->p + r->at;
    r->at += n;
    return q;
}

/* Refuses what the image says that differs from s (the caller's options). */
/* The header h's model and options against s's; spec (spec_len bytes)
 * the session's policy, or NULL when it is not read yet (then only whether
 * there is one and its length are compared). */
static kve_status match(const lm_state *s, const unsigned char *h, const char *spec, size_t spec_len)
{
    const lm_config *c = &s->model->config;
    int32_t words[7];
    config_words(c, words);
    for (size_t i = 0; i < 7; i++)
        if (get_i32(h + 24 + 4 * i) != words[i])
            return kve_set_error(KVE_EINVAL, "session: from another model: its %s is %d, this "
                                 "model's %d", config_name[i], get_i32(h + 24 + 4 * i), words[i]);
    uint64_t fp = get_u64(h + 16), mine = lm_model_fingerprint(s->model);
    if (fp != mine)
        return kve_set_error(KVE_EINVAL, "session: from another model: its checkpoint's "
                             "fingerprint is %016llx, this checkpoint's %016llx",
                             (unsigned long long)fp, (unsigned long long)mine);
    uint32_t flags = get_u32(h + 12), want = flags_of(s);
    const char *theirs = (flags & FLAG_POLICY) ? "" : "none";
    if (!spec && (flags & FLAG_POLICY) != (want & FLAG_POLICY))
        return kve_set_error(KVE_EINVAL, "session: policy: the session's is %s, this decoder's "
                             "'%s'", flags & FLAG_POLICY ? "a policy" : "'none'",
                             s->spec ? s->spec : "none");
    if (!spec && s->spec && spec_len != strlen(s->spec))
        return kve_set_error(KVE_EINVAL, "session: policy: the session's spec has %zu bytes, "
                             "this decoder's '%s' %zu", spec_len, s->spec, strlen(s->spec));
    if (spec && ((flags & FLAG_POLICY) != (want & FLAG_POLICY) ||
                 (s->spec && (spec_len != strlen(s->spec) ||
                              memcmp(spec, s->spec, spec_len) != 0))))
        return kve_set_error(KVE_EINVAL, "session: policy: the session's is '%.*s%s', this "
                             "decoder's '%s'", (int)spec_len, spec, theirs,
                             s->spec ? s->spec : "none");
    if ((flags & FLAG_CACHE_POS) != (want & FLAG_CACHE_POS))
        return kve_set_error(KVE_EINVAL, "session: positions: the session's are %s, this "
                             "decoder's %s", flags & FLAG_CACHE_POS ? "cache" : "original",
                             want & FLAG_CACHE_POS ? "cache" : "original");
    double share, mine_share = s->opt.share_heads ? s->opt.min_share : 0.0;
    uint64_t bits = get_u64(h + 56), mine_bits;
    memcpy(&share, &bits, 8);
    memcpy(&mine_bits, &mine_share, 8);
    if ((flags & FLAG_SHARED) != (want & FLAG_SHARED) || bits != mine_bits)
        return kve_set_error(KVE_EINVAL, "session: head sharing: the session's is %s (min share "
                             "%g), this decoder's %s (min share %g)",
                             flags & FLAG_SHARED ? "on" : "off", share,
                             want & FLAG_SHARED ? "on" : "off", mine_share);
    if ((flags & FLAG_SAME) != (want & FLAG_SAME))
        return kve_set_error(KVE_EINVAL, "session: same positions: the session's are %s, this "
                             "decoder's %s", flags & FLAG_SAME ? "on" : "off",
                             want & FLAG_SAME ? "on" : "off");
    if ((flags & FLAG_LLAMA) != (want & FLAG_LLAMA))
        return kve_set_error(KVE_EINVAL, "session: products: the session's are %s, this "
                             "decoder's %s", flags & FLAG_LLAMA ? "llama" : "exact",
                             want & FLAG_LLAMA ? "llama" : "exact");
    return KVE_OK;
}

/* a + b and a * b, stuck at UINT64_MAX. */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}
static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* The most bytes s's bank image holds when each of its heads keeps n
 * positions: its image now, less the slots it keeps, plus n slots a head.
 * A slot's bytes come from the image's header (docs/api.md, "State
 * images": the position, the score and the policy's two columns; version
 * 2 and 3: the raw scores and value norms). */
static kve_status bank_bound(const lm_state *s, uint64_t n, uint64_t *out)
{
    size_t size = 0;
    const size_t H = kve_bank_heads(s->bank);
    if (kve_bank_save(s->bank, NULL, 0, &size) != KVE_OK)
        return kve_set_error(KVE_EINVAL, "session: the decoder's bank: %s", kve_last_error());
    unsigned char *img = lm_malloc(&s->alloc, size);
    if (!img)
        return kve_set_error(KVE_ENOMEM, "session: out of memory");
    kve_status st = kve_bank_save(s->bank, img, size, &size);
    if (st == KVE_OK) {
        uint64_t slot = 4 + (uint64_t)get_u32(img + 56) + get_u32(img + 60) + get_u32(img + 64);
        if (get_u32(img + 8) >= 2) /* the methods' block after the spec */
            slot += (uint64_t)get_u32(img + 72 + get_u32(img + 68) + 36) +
                    get_u32(img + 72 + get_u32(img + 68) + 40);
        size_t kept = 0;
        for (size_t h = 0; h < H; h++)
            kept += kve_bank_size(s->bank, h);
        *out = sat_add(size - kept * slot, sat_mul(sat_mul(H, n), slot));
    } else {
        st = kve_set_error(st, "session: the decoder's bank: %s", kve_last_error());
    }
    lm_free(&s->alloc, img);
    return st;
}

kve_status lm_session_size(const lm_state *s, const void *head, size_t n, size_t *size)
{
    if (!s || !head || !size)
        return kve_set_error(KVE_EINVAL, "session size: NULL argument");
    const unsigned char *p = head;
    if (n < 8 || memcmp(p, session_magic, 8) != 0)
        return kve_set_error(KVE_EFORMAT, "session: bad magic (not a kvevict session file)");
    if (n < HEADER)
        return kve_set_error(KVE_EFORMAT, "session: %zu bytes, truncated in the %d-byte header",
                             n, HEADER);
    uint32_t version = get_u32(p + 8);
    if (version != SESSION_VERSION)
        return kve_set_error(KVE_EFORMAT, "session: version %u is not supported (this build "
                             "reads version %d)", version, SESSION_VERSION);
    uint64_t stated = get_u64(p + 112);
    if (stated < HEADER + 8 || stated > SIZE_MAX - 2)
        return kve_set_error(KVE_EFORMAT, "session: the header states %llu bytes, not a "
                             "session's size", (unsigned long long)stated);
    const uint64_t N = get_u32(p + 64);
    if (N > (uint64_t)INT32_MAX - 1)
        return kve_set_error(KVE_EFORMAT, "session: %llu tokens is past the last position",
                             (unsigned long long)N);
    /* the largest session of N tokens s could write (docs/decoder.md's sum,
     * each cache holding N keys) */
    const lm_config *c = &s->model->config;
    const uint64_t L = (uint64_t)c->n_layers, LG = L * (uint64_t)c->n_kv_heads;
    const uint64_t S = (uint64_t)c->head_size, V = (uint64_t)c->vocab_size;
    uint64_t most = HEADER + 8 + (s->spec ? strlen(s->spec) : 0) + 4 * V;
    most = sat_add(most, sat_mul(4, N));
    most = sat_add(most, sat_mul(LG, sat_add(4, sat_mul(N, 4 + 8 * S))));
    if (s->bank) {
        uint64_t bank = 0;
        kve_status bst = bank_bound(s, N, &bank);
        if (bst != KVE_OK)
            return bst;
        most = sat_add(sat_add(most, 4 * L), bank);
    }
    kve_status st = KVE_OK;
    const size_t spec_len = get_u32(p + 52); /* the spec, when the n bytes hold it */
    const char *spec = n - HEADER >= spec_len ? (const char *)p + HEADER : NULL;
    if (stated > most && (st = match(s, p, spec, spec_len)) != KVE_OK)
        return st; /* another model or other options: the bound is not theirs */
    if (stated > most)
        return kve_set_error(KVE_EFORMAT, "session: the header states %llu bytes, more than the "
                             "%llu a session of its %llu tokens of this model and options can "
                             "hold", (unsigned long long)stated, (unsigned long long)most,
                             (unsigned long long)N);
    *size = (size_t)stated;
    return KVE_OK;
}

kve_status lm_session_load(lm_state *s, const void *buf, size_t size, lm_session *out)
{
    if (!s || !buf || !out)
        return kve_set_error(KVE_EINVAL, "session load: NULL argument");
    if (s->pos != 0 || s->broken || s->prefilling)
        return kve_set_error(KVE_EINVAL, "session load: the decoder is at position %d; a session "
                             "loads into a new one", s->pos);
    const unsigned char *p = buf;
    if (size < HEADER + 8)
        return kve_set_error(KVE_EFORMAT, "session: %zu bytes, truncated in the %d-byte header",
                             size, HEADER);
    if (memcmp(p, session_magic, 8) != 0)
        return kve_set_error(KVE_EFORMAT, "session: bad magic (not a kvevict session file)");
    uint32_t version = get_u32(p + 8);
    if (version != SESSION_VERSION)
        return kve_set_error(KVE_EFORMAT, "session: version %u is not supported (this build "
                             "reads version %d)", version, SESSION_VERSION);
    uint64_t stated = get_u64(p + 112);
    if (stated != size)
        return kve_set_error(KVE_EFORMAT, "session: %zu bytes, the header states %llu (%s)", size,
                             (unsigned long long)stated, size < stated ? "truncated" : "too long");
    uint64_t sum = get_u64(p + size - 8), mine = fnv1a(p, size - 8);
    if (sum != mine)
        return kve_set_error(KVE_EFORMAT, "session: checksum %016llx does not match the "
                             "content's %016llx (corrupted or truncated)",
                             (unsigned long long)sum, (unsigned long long)mine);
    uint32_t flags = get_u32(p + 12);
    if (flags & ~(uint32_t)FLAGS_KNOWN)
        return kve_set_error(KVE_EFORMAT, "session: flags %#x hold unknown bits", flags);
    reader r = {.p = p, .at = HEADER, .size = size - 8};
    uint32_t spec_len = get_u32(p + 52);
    const unsigned char *spec = take(&r, spec_len, "the policy's spec");
    if (!spec)
        return KVE_EFORMAT;
    if (((flags & FLAG_POLICY) != 0) != (spec_len != 0))
        return kve_set_error(KVE_EFORMAT, "session: a spec of %u bytes with the policy flag %s",
                             spec_len, flags & FLAG_POLICY ? "set" : "clear");
    kve_status st = match(s, p, (const char *)spec, spec_len);
    if (st != KVE_OK)
        return st;
    const lm_config *c = &s->model->config;
    size_t L = (size_t)c->n_layers, G = (size_t)c->n_kv_heads, S = (size_t)c->head_size;
    for (size_t l = 0; s->bank && l < L; l++) {
        const unsigned char *b = take(&r, 4, "the layer budgets");
        if (!b)
            return KVE_EFORMAT;
        if (get_u32(b) != s->layer_budget[l])
            return kve_set_error(KVE_EINVAL, "session: layer budgets: layer %zu's is %u in the "
                                 "session, %zu in this decoder", l, get_u32(b), s->layer_budget[l]);
    }
    size_t n = get_u32(p + 64);
    if (n > (size_t)INT32_MAX - 1)
        return kve_set_error(KVE_EFORMAT, "session: %zu tokens is past the last position", n);
    if (get_u32(p + 68) != 0)
        return kve_set_error(KVE_EFORMAT, "session: the reserved word at offset 68 is %u, not 0",
                             get_u32(p + 68));
    const unsigned char *toks = take(&r, n * 4, "the tokens");
    if (!toks)
        return KVE_EFORMAT;
    for (size_t i = 0; i < n; i++)
        if (get_i32(toks + 4 * i) < 0 || get_i32(toks + 4 * i) >= c->vocab_size)
            return kve_set_error(KVE_EFORMAT, "session: token %zu = %d is outside the vocabulary "
                                 "[0, %d)", i, get_i32(toks + 4 * i), c->vocab_size);
    if (!(get_u64(p + 72) | get_u64(p + 80) | get_u64(p + 88) | get_u64(p + 96)))
        return kve_set_error(KVE_EFORMAT, "session: the sampler's generator is all zero, a state "
                             "xoshiro256** never reaches");
    size_t V = (size_t)c->vocab_size;
    const unsigned char *logits = take(&r, V * 4, "the logits");
    if (!logits)
        return KVE_EFORMAT;
    for (size_t i = 0; i < V; i++)
        if ((get_u32(logits + 4 * i) & 0x7f800000u) == 0x7f800000u)
            return kve_set_error(KVE_EFORMAT, "session: logit %zu is not finite", i);
    uint64_t bank_size = get_u64(p + 104);
    if (!(flags & FLAG_POLICY) && bank_size != 0)
        return kve_set_error(KVE_EFORMAT, "session: a bank image of %llu bytes without a policy",
                             (unsigned long long)bank_size);
    if (bank_size > SIZE_MAX)
        return kve_set_error(KVE_EFORMAT, "session: a bank image of %llu bytes",
                             (unsigned long long)bank_size);
    const unsigned char *bank_img = take(&r, (size_t)bank_size, "the bank's image");
    if (!bank_img)
        return KVE_EFORMAT;
    /* The caches: each checked against the bank (or, without a policy,
     * holding every position) before anything is allocated for them. */
    size_t *counts = lm_calloc(&s->alloc, L * G, sizeof *counts);
    int32_t *tokens = lm_malloc(&s->alloc, (n ? n : 1) * sizeof *tokens);
    kve_bank *bank = NULL;
    st = counts && tokens ? KVE_OK : kve_set_error(KVE_ENOMEM, "session: out of memory");
    if (st == KVE_OK && s->bank) {
        st = kve_bank_load(bank_img, (size_t)bank_size, &s->alloc, &bank);
        if (st != KVE_OK)
            st = kve_set_error(st == KVE_ENOMEM ? st : KVE_EFORMAT, "session: the bank: %s",
                               kve_last_error());
        else if (strcmp(kve_bank_spec(bank), kve_bank_spec(s->bank)) != 0 ||
                 kve_bank_heads(bank) != kve_bank_heads(s->bank))
            st = kve_set_error(KVE_EFORMAT, "session: the bank's image is of '%s' over %zu heads, "
                               "the decoder's bank '%s' over %zu", kve_bank_spec(bank),
                               kve_bank_heads(bank), kve_bank_spec(s->bank), kve_bank_heads(s->bank));
    }
    size_t cache_at = r.at;
    for (size_t i = 0; st == KVE_OK && i < L * G; i++) {
        char what[96];
        snprintf(what, sizeof what, "the cache of layer %zu, KV head %zu", i / G, i % G);
        const unsigned char *h = take(&r, 4, what);
        if (!h) {
            st = KVE_EFORMAT;
            break;
        }
        size_t m = get_u32(h);
        if (m > n) {
            st = kve_set_error(KVE_EFORMAT, "session: %s holds %zu keys of %zu positions", what,
                               m, n);
            break;
        }
        const unsigned char *pos = take(&r, m * 4, what);
        const unsigned char *kv = pos ? take(&r, m * S * 8, what) : NULL;
        if (!kv) {
            st = KVE_EFORMAT;
            break;
        }
        if (bank && m != kve_bank_size(bank, i)) {
            st = kve_set_error(KVE_EFORMAT, "session: %s holds %zu keys, the bank keeps %zu", what,
                               m, kve_bank_size(bank, i));
            break;
        }
        if (!bank && m != n) {
            st = kve_set_error(KVE_EFORMAT, "session: %s holds %zu keys; without a policy it keeps "
                               "all %zu", what, m, n);
            break;
        }
        const int32_t *kept = bank ? kve_bank_positions(bank, i) : NULL;
        for (size_t j = 0; j < m && st == KVE_OK; j++) {
            int32_t q = get_i32(pos + 4 * j);
            int32_t want = kept ? kept[j] : (int32_t)j;
            if (q != want)
                st = kve_set_error(KVE_EFORMAT, "session: %s: key %zu is position %d, the %s %d",
                                   what, j, q, kept ? "bank keeps" : "full cache holds", want);
            else if ((size_t)q >= n) /* a decoder at position n has decoded 0 .. n - 1 */
                st = kve_set_error(KVE_EFORMAT, "session: %s: key %zu is position %d, but the "
                                   "session holds %zu tokens (positions 0 .. %zu)", what, j, q, n,
                                   n ? n - 1 : 0);
        }
        for (size_t j = 0; j < m * S * 2 && st == KVE_OK; j++)
            if ((get_u32(kv + 4 * j) & 0x7f800000u) == 0x7f800000u)
                st = kve_set_error(KVE_EFORMAT, "session: %s: %s element %zu is not finite",
                                   what, j < m * S ? "key" : "value", j % (m * S));
        counts[i] = m;
    }
    if (st == KVE_OK && r.at != r.size)
        st = kve_set_error(KVE_EFORMAT, "session: %zu bytes after the last cache",
                           r.size - r.at);
    /* Everything valid: allocate, then commit. */
    if (st == KVE_OK)
        st = make_room(s, NULL, counts);
    if (st == KVE_OK && bank && (st = kve_bank_copy(s->bank, bank)) != KVE_OK &&
        st != KVE_ENOMEM) /* the image's options (key_dim, share) are not the decoder's */
        st = kve_set_error(KVE_EFORMAT, "session: the bank: %s", kve_last_error());
    if (st == KVE_OK) {
        lay_shared(s, NULL, counts);
        reader cr = {.p = p, .at = cache_at, .size = size - 8};
        for (size_t i = 0; i < L * G; i++) {
            lm_cache *k = &s->cache[i];
            size_t m = counts[i];
            cr.at += 4;
            for (size_t j = 0; j < m; j++)
                k->pos[j] = get_i32(cr.p + cr.at + 4 * j);
            cr.at += m * 4;
            for (size_t j = 0; j < m * S; j++)
                k->key[j] = get_f32(cr.p + cr.at + 4 * j);
            cr.at += m * S * 4;
            for (size_t j = 0; j < m * S; j++)
                k->value[j] = get_f32(cr.p + cr.at + 4 * j);
            cr.at += m * S * 4;
            k->n = m;
        }
        for (size_t i = 0; i < n; i++)
            tokens[i] = get_i32(toks + 4 * i);
        for (size_t i = 0; i < V; i++)
            s->logits[i] = get_f32(logits + 4 * i);
        s->pos = (int32_t)n;
        if (s->layer_keep) /* a session holds no KVzip totals: G times each budget */
            memset(s->layer_keep, 0, (size_t)c->n_layers * sizeof *s->layer_keep);
        out->tokens = tokens;
        out->n_tokens = n;
        for (size_t i = 0; i < 4; i++)
            out->rng.s[i] = get_u64(p + 72 + 8 * i);
        tokens = NULL;
    }
    kve_bank_free(bank);
    lm_free(&s->alloc, counts);
    lm_free(&s->alloc, tokens);
    return st;
}
