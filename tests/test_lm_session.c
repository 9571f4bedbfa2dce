/* SPDX-License-Identifier: MIT */
/*
 * test_lm_session.c - what an engine does to a decoded sequence, in the
 * decoder (lm/session.c, lm/sample.c): forks and rewinds with
 * lm_state_copy (kve_bank_copy underneath), session images saved, loaded
 * and refused, and the sampler's chain.
 *
 * Every comparison is bit for bit: logits (memcmp), every cache's kept
 * positions, and the bank's image (kve_bank_save), between a decoder that
 * forked, rewound or was reloaded and one that decoded the same tokens from
 * scratch. Models are the tiny fixtures of tests/lm_fixture.h, so each case
 * decodes a few dozen positions.
 */
#include "check.h"
#include "lm.h"
#include "lm_fixture.h"

#include <math.h>

enum { D_ = 16, F_ = 24, L_ = 2, H_ = 4, G_ = 2, V_ = 40, T_ = 12 };

static lm_model *load(const fx_model *fx, unsigned char **img)
{
    size_t n;
    *img = fx_image(fx, 1, &n);
    lm_model *m = NULL;
    if (lm_model_from_memory(*img, n, NULL, &m) != KVE_OK)
        fprintf(stderr, "load: %s\n", kve_last_error());
    return m;
}

/* Token t of a fixed pseudo-random stream (`salt` picks the stream). */
static int32_t tok(size_t t, uint64_t salt)
{
    uint64_t s = (t + 1) * 0x9e3779b97f4a7c15u ^ salt;
    return (int32_t)(3 + fx_next(&s) % (V_ - 3));
}

/* The tests' allocator: counts allocations (for "a restore allocates
 * nothing") and, from the fail_at-th on (0: never), fails them. */
static size_t n_allocs, fail_at;
static void *counting(void *ud, void *p, size_t old, size_t n)
{
    (void)ud;
    (void)old;
    if (n == 0) {
        free(p);
        return NULL;
    }
    if (fail_at && ++n_allocs >= fail_at)
        return NULL;
    n_allocs += !fail_at;
    return realloc(p, n);
}
static const kve_allocator counting_alloc = {counting, NULL};

/* 1 when a and b are in the same state: position, logits, every cache's
 * positions, keys and values, and the bank's image. */
static int same_state(const lm_state *a, const lm_state *b)
{
    if (a->pos != b->pos || memcmp(a->logits, b->logits, sizeof(float) * V_) != 0)
        return 0;
    size_t S = (size_t)a->model->config.head_size;
    for (size_t i = 0; i < (size_t)L_ * G_; i++) {
        const lm_cache *x = &a->cache[i], *y = &b->cache[i];
        if (x->n != y->n)
            return 0;
        if (x->n && (memcmp(x->pos, y->pos, x->n * sizeof(int32_t)) != 0 ||
                     memcmp(x->key, y->key, x->n * S * sizeof(float)) != 0 ||
                     memcmp(x->value, y->value, x->n * S * sizeof(float)) != 0))
            return 0;
    }
    if (!a->bank)
        return b->bank == NULL;
    size_t na, nb;
    if (kve_bank_save(a->bank, NULL, 0, &na) != KVE_OK ||
        kve_bank_save(b->bank, NULL, 0, &nb) != KVE_OK || na != nb)
        return 0;
    unsigned char *ia = malloc(na), *ib = malloc(nb);
    int same = kve_bank_save(a->bank, ia, na, &na) == KVE_OK &&
               kve_bank_save(b->bank, ib, nb, &nb) == KVE_OK && memcmp(ia, ib, na) == 0;
    free(ia);
    free(ib);
    return same;
}

typedef struct config {
    const char *spec;
    lm_positions positions;
    int share;
    int same; /* lm_options.same_positions */
} config;

static const config configs[] = {
    {"h2o:budget=5,recent_window=2", LM_POS_ORIGINAL, 0, 0},
    {"tova:budget=4", LM_POS_CACHE, 0, 0},
    {"random:budget=5", LM_POS_ORIGINAL, 0, 0},
    {"knorm:budget=5", LM_POS_ORIGINAL, 0, 0},
    {"h2o:budget=4,recent_window=1", LM_POS_ORIGINAL, 1, 0},
    {"h2o:budget=5,recent_window=2", LM_POS_ORIGINAL, 0, 1},
    {"knorm:budget=5", LM_POS_ORIGINAL, 0, 1},
    {NULL, LM_POS_CACHE, 0, 0}, /* every key kept */
};
enum { N_CONFIGS = sizeof configs / sizeof configs[0] };

static lm_options options_of(const config *c, uint64_t seed)
{
    lm_options o = {.allocator = &counting_alloc, .policy = c->spec, .positions = c->positions,
                    .seed = seed, .share_heads = c->share, .min_share = 0.25,
                    .same_positions = c->same};
    return o;
}

/* Rewind (speculative decoding's rollback): decode a prefix, checkpoint it
 * (lm_state_copy into a second decoder: the KV cache and kve_bank_copy),
 * decode k draft tokens, restore the checkpoint, decode other tokens; the
 * result equals, bit for bit and at every step, a decoder that never saw
 * the draft. The second restore allocates nothing. */
static void test_rewind(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, check_seed);
    unsigned char *img;
    lm_model *m = load(&fx, &img);
    ASSERT_TRUE(m != NULL);
    enum { PREFIX = 9, DRAFT = 6, AFTER = 8 };
    for (size_t c = 0; c < N_CONFIGS; c++) {
        lm_options o = options_of(&configs[c], check_seed + c);
        lm_state *s = NULL, *cp = NULL, *ref = NULL;
        ASSERT_OK(lm_state_new(m, &o, &s));
        ASSERT_OK(lm_state_new(m, &o, &cp));
        ASSERT_OK(lm_state_new(m, &o, &ref));
        for (size_t t = 0; t < PREFIX; t++) {
            ASSERT_OK(lm_forward(s, t ? tok(t, 1) : LM_BOS));
            ASSERT_OK(lm_forward(ref, t ? tok(t, 1) : LM_BOS));
        }
        ASSERT_OK(lm_state_copy(cp, s));
        ASSERT_TRUE(same_state(cp, s));
        for (int round = 0; round < 2; round++) {
            for (size_t t = 0; t < DRAFT; t++)
                ASSERT_OK(lm_forward(s, tok(t, 2 + (uint64_t)round)));
            ASSERT_TRUE(!same_state(s, ref));
            size_t before = n_allocs;
            ASSERT_OK(lm_state_copy(s, cp)); /* the rewind */
            if (round == 1)
                ASSERT_EQ(n_allocs, before);
            ASSERT_TRUE(same_state(s, ref));
        }
        for (size_t t = 0; t < AFTER; t++) {
            ASSERT_OK(lm_forward(s, tok(t, 7)));
            ASSERT_OK(lm_forward(ref, tok(t, 7)));
            if (!same_state(s, ref))
                CHECK_FAIL_AT("%s: step %zu after the rewind differs", configs[c].spec, t);
        }
        lm_state_free(s);
        lm_state_free(cp);
        lm_state_free(ref);
    }
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
}

/* Fork: copies of one prefix continue as independent decoders, each equal
 * to a decoder that decoded its tokens from scratch; and refusals. */
static void test_fork_and_refusals(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, check_seed + 1);
    unsigned char *img;
    lm_model *m = load(&fx, &img);
    ASSERT_TRUE(m != NULL);
    lm_options o = options_of(&configs[0], 1);
    lm_state *p = NULL, *f[3] = {NULL}, *ref = NULL;
    ASSERT_OK(lm_state_new(m, &o, &p));
    for (size_t t = 0; t < 7; t++)
        ASSERT_OK(lm_forward(p, tok(t, 1)));
    for (int k = 0; k < 3; k++) {
        ASSERT_OK(lm_state_new(m, &o, &f[k]));
        ASSERT_OK(lm_state_copy(f[k], p));
    }
    for (size_t t = 0; t < 6; t++)
        for (int k = 0; k < 3; k++)
            ASSERT_OK(lm_forward(f[k], tok(t, 10 + (uint64_t)k)));
    for (int k = 0; k < 3; k++) {
        ASSERT_OK(lm_state_new(m, &o, &ref));
        for (size_t t = 0; t < 7; t++)
            ASSERT_OK(lm_forward(ref, tok(t, 1)));
        for (size_t t = 0; t < 6; t++)
            ASSERT_OK(lm_forward(ref, tok(t, 10 + (uint64_t)k)));
        ASSERT_TRUE(same_state(ref, f[k]));
        lm_state_free(ref);
        ref = NULL;
    }
    /* Refusals name the difference and change nothing. */
    struct {
        lm_options o;
        const char *needle;
    } bad[] = {
        {{.policy = "h2o:budget=6,recent_window=2"}, "policy"},
        {{.policy = "tova:budget=5"}, "policy"},
        {{0}, "policy"},
        {{.policy = "h2o:budget=5,recent_window=2", .positions = LM_POS_CACHE}, "positions"},
        {{.policy = "h2o:budget=5,recent_window=2", .share_heads = 1}, "head sharing"},
        {{.policy = "h2o:budget=5,recent_window=2", .schedule = KVE_SCHEDULE_PYRAMID},
         "layer budgets"},
    };
    lm_state *twin = NULL;
    ASSERT_OK(lm_state_new(m, &o, &twin));
    ASSERT_OK(lm_state_copy(twin, f[0]));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lm_state *d = NULL;
        ASSERT_OK(lm_state_new(m, &bad[i].o, &d));
        ASSERT_STATUS(lm_state_copy(d, p), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), bad[i].needle);
        ASSERT_STATUS(lm_state_copy(f[0], d), KVE_EINVAL);
        ASSERT_TRUE(same_state(f[0], twin));
        lm_state_free(d);
    }
    ASSERT_STATUS(lm_state_copy(p, p), KVE_EINVAL);
    ASSERT_STATUS(lm_state_copy(NULL, p), KVE_EINVAL);
    lm_state_free(twin);
    for (int k = 0; k < 3; k++)
        lm_state_free(f[k]);
    lm_state_free(p);
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
}

/* FNV-1a over n bytes, written here from its definition (the image's
 * checksum), to forge images whose checksum is right. */
static uint64_t fnv(const unsigned char *p, size_t n)
{
    uint64_t h = 14695981039346656037u;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211u;
    }
    return h;
}

static void reseal(unsigned char *img, size_t n)
{
    uint64_t h = fnv(img, n - 8);
    for (int i = 0; i < 8; i++)
        img[n - 8 + (size_t)i] = (unsigned char)(h >> (8 * i));
}

/* A of n_a tokens, saved, loaded into a new decoder, then B: equal to one
 * decoder that decoded A then B; and the image of the loaded decoder, saved
 * again, is the same bytes. */
static void test_session_roundtrip(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, check_seed + 2);
    unsigned char *img;
    lm_model *m = load(&fx, &img);
    ASSERT_TRUE(m != NULL);
    enum { NA = 11, NB = 9 };
    for (size_t c = 0; c < N_CONFIGS; c++) {
        lm_options o = options_of(&configs[c], 5 + c);
        lm_state *a = NULL, *b = NULL, *ref = NULL;
        ASSERT_OK(lm_state_new(m, &o, &a));
        ASSERT_OK(lm_state_new(m, &o, &ref));
        int32_t toks[NA];
        for (size_t t = 0; t < NA; t++) {
            toks[t] = t ? tok(t, 3) : LM_BOS;
            ASSERT_OK(lm_forward(a, toks[t]));
            ASSERT_OK(lm_forward(ref, toks[t]));
        }
        lm_session ss = {.tokens = toks, .n_tokens = NA};
        kve_rng_seed(&ss.rng, 77);
        (void)kve_rng_next(&ss.rng);
        size_t size;
        ASSERT_OK(lm_session_save(a, &ss, NULL, 0, &size));
        /* The size docs/decoder.md gives: 128 + P + 4L + 4N + 4V + B + the caches. */
        size_t want = 128 + (a->spec ? strlen(a->spec) + 4 * L_ : 0) + 4 * NA + 4 * V_, bank = 0;
        if (a->bank)
            ASSERT_OK(kve_bank_save(a->bank, NULL, 0, &bank));
        want += bank;
        for (size_t i = 0; i < (size_t)L_ * G_; i++)
            want += 4 + a->cache[i].n * (4 + 8 * (size_t)(D_ / H_));
        ASSERT_EQ(size, want);
        unsigned char *buf = malloc(size);
        ASSERT_STATUS(lm_session_save(a, &ss, buf, size - 1, &size), KVE_ERANGE);
        ASSERT_OK(lm_session_save(a, &ss, buf, size, &size));
        ASSERT_OK(lm_state_new(m, &o, &b));
        lm_session got;
        ASSERT_OK(lm_session_load(b, buf, size, &got));
        ASSERT_EQ(got.n_tokens, NA);
        ASSERT_TRUE(memcmp(got.tokens, toks, sizeof toks) == 0);
        ASSERT_TRUE(memcmp(&got.rng, &ss.rng, sizeof ss.rng) == 0);
        ASSERT_TRUE(same_state(a, b));
        unsigned char *again = malloc(size);
        size_t size2;
        ASSERT_OK(lm_session_save(b, &got, again, size, &size2));
        ASSERT_EQ(size2, size);
        ASSERT_TRUE(memcmp(again, buf, size) == 0);
        for (size_t t = 0; t < NB; t++) {
            ASSERT_OK(lm_forward(b, tok(t, 4)));
            ASSERT_OK(lm_forward(ref, tok(t, 4)));
            if (!same_state(b, ref))
                CHECK_FAIL_AT("config %zu: step %zu after the load differs", c, t);
        }
        lm_free(&b->alloc, got.tokens);
        free(again);
        free(buf);
        lm_state_free(a);
        lm_state_free(b);
        lm_state_free(ref);
    }
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
}

/* Load refusals: every truncation, every flipped byte, a forged image with a
 * right checksum but wrong contents, another model, other options; each
 * names its reason and leaves the decoder as it was (it decodes as a new
 * one does). */
static void test_session_refusals(void)
{
    fx_model fx, fx2, fx3;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, check_seed + 3);
    fx_model_init(&fx2, D_, F_, L_, H_, G_, V_, T_, 1, check_seed + 4); /* same shape */
    fx_model_init(&fx3, D_, F_, L_ + 1, H_, G_, V_, T_, 1, check_seed + 3);
    unsigned char *img, *img2, *img3;
    lm_model *m = load(&fx, &img), *m2 = load(&fx2, &img2), *m3 = load(&fx3, &img3);
    ASSERT_TRUE(m && m2 && m3);
    lm_options o = {.policy = "h2o:budget=4,recent_window=1"};
    lm_state *a = NULL, *fresh = NULL, *twin = NULL;
    ASSERT_OK(lm_state_new(m, &o, &a));
    int32_t toks[8];
    for (size_t t = 0; t < 8; t++)
        ASSERT_OK(lm_forward(a, toks[t] = tok(t, 5)));
    lm_session ss = {.tokens = toks, .n_tokens = 8};
    kve_rng_seed(&ss.rng, 1);
    size_t size;
    ASSERT_OK(lm_session_save(a, &ss, NULL, 0, &size));
    unsigned char *buf = malloc(size), *bad = malloc(size);
    ASSERT_OK(lm_session_save(a, &ss, buf, size, &size));
    ASSERT_OK(lm_state_new(m, &o, &fresh));
    ASSERT_OK(lm_state_new(m, &o, &twin));
    lm_session got = {0};
    for (size_t n = 0; n < size; n++) {
        if (lm_session_load(fresh, buf, n, &got) != KVE_EFORMAT)
            CHECK_FAIL_AT("a session cut to %zu of %zu bytes loads", n, size);
        ASSERT_TRUE(strstr(kve_last_error(), "truncated") != NULL);
    }
    for (size_t i = 0; i < size; i++) {
        memcpy(bad, buf, size);
        bad[i] ^= (unsigned char)(1u << (i % 8));
        if (lm_session_load(fresh, bad, size, &got) == KVE_OK)
            CHECK_FAIL_AT("a session with byte %zu flipped loads", i);
    }
    ASSERT_TRUE(got.tokens == NULL);
    ASSERT_TRUE(same_state(fresh, twin));
    /* Forged with a right checksum: the fields themselves are checked. */
    struct {
        size_t at;
        uint32_t value;
        const char *needle;
    } forged[] = {
        {8, 2, "version 2"},
        {12, 32, "unknown bits"},
        {68, 1, "reserved"},
        {64, 100000, "truncated in the tokens"},
    };
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        memcpy(bad, buf, size);
        for (int b = 0; b < 4; b++)
            bad[forged[i].at + (size_t)b] = (unsigned char)(forged[i].value >> (8 * b));
        reseal(bad, size);
        ASSERT_STATUS(lm_session_load(fresh, bad, size, &got), KVE_EFORMAT);
        ASSERT_CONTAINS(kve_last_error(), forged[i].needle);
    }
    /* The first token, forged out of the vocabulary; the first cache's
     * first position, forged to one the bank does not keep. */
    size_t spec_len = strlen(a->spec), toks_at = 120 + spec_len + 4 * L_;
    memcpy(bad, buf, size);
    bad[toks_at] = 0xff;
    reseal(bad, size);
    ASSERT_STATUS(lm_session_load(fresh, bad, size, &got), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "token 0");
    size_t bank_size;
    ASSERT_OK(kve_bank_save(a->bank, NULL, 0, &bank_size));
    size_t cache_at = toks_at + 8 * 4 + V_ * 4 + bank_size;
    memcpy(bad, buf, size);
    bad[cache_at + 4] ^= 1;
    reseal(bad, size);
    ASSERT_STATUS(lm_session_load(fresh, bad, size, &got), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "the cache of layer 0, KV head 0: key 0 is position");
    ASSERT_TRUE(same_state(fresh, twin));
    /* A loaded decoder is one that could have decoded (before, both
     * loaded): 5 tokens for a bank and caches at position 8, an all-zero
     * sampler generator. */
    {
        size_t cut = size - 3 * 4;
        memcpy(bad, buf, toks_at + 5 * 4);
        memcpy(bad + toks_at + 5 * 4, buf + toks_at + 8 * 4, size - toks_at - 8 * 4);
        for (int b = 0; b < 4; b++)
            bad[64 + (size_t)b] = (unsigned char)(5u >> (8 * b));
        for (int b = 0; b < 8; b++)
            bad[112 + (size_t)b] = (unsigned char)((uint64_t)cut >> (8 * b));
        reseal(bad, cut);
        ASSERT_STATUS(lm_session_load(fresh, bad, cut, &got), KVE_EFORMAT);
        ASSERT_CONTAINS(kve_last_error(), "but the session holds 5 tokens (positions 0 .. 4)");
        memcpy(bad, buf, size);
        memset(bad + 72, 0, 32);
        reseal(bad, size);
        ASSERT_STATUS(lm_session_load(fresh, bad, size, &got), KVE_EFORMAT);
        ASSERT_CONTAINS(kve_last_error(), "generator is all zero");
        ASSERT_TRUE(same_state(fresh, twin));
    }
    /* A save writes nothing a load refuses: a logit or a cached key that is
     * not finite (before: saved, then refused by the next run), a zero
     * generator. */
    {
        size_t sz = 0;
        const float keep = a->logits[3];
        a->logits[3] = INFINITY;
        ASSERT_STATUS(lm_session_save(a, &ss, NULL, 0, &sz), KVE_ERANGE);
        ASSERT_CONTAINS(kve_last_error(), "logit 3 is not finite; not saved");
        a->logits[3] = keep;
        const float k0 = a->cache[1].key[2];
        a->cache[1].key[2] = NAN;
        ASSERT_STATUS(lm_session_save(a, &ss, NULL, 0, &sz), KVE_ERANGE);
        ASSERT_CONTAINS(kve_last_error(), "KV head 1: key element 2 is not finite");
        a->cache[1].key[2] = k0;
        lm_session zero = ss;
        memset(&zero.rng, 0, sizeof zero.rng);
        ASSERT_STATUS(lm_session_save(a, &zero, NULL, 0, &sz), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "all zero");
        ASSERT_OK(lm_session_save(a, &ss, NULL, 0, &sz));
    }
    /* Another model, other options. */
    struct {
        const lm_model *m;
        lm_options o;
        const char *needle;
    } other[] = {
        {m2, {.policy = "h2o:budget=4,recent_window=1"}, "fingerprint"},
        {m3, {.policy = "h2o:budget=4,recent_window=1"}, "its n_layers is 2, this model's 3"},
        {m, {.policy = "h2o:budget=5,recent_window=1"}, "policy: the session's is 'h2o:budget=4"},
        {m, {0}, "this decoder's 'none'"},
        {m, {.policy = "h2o:budget=4,recent_window=1", .positions = LM_POS_CACHE}, "positions"},
        {m, {.policy = "h2o:budget=4,recent_window=1", .share_heads = 1}, "head sharing"},
        {m, {.policy = "h2o:budget=4,recent_window=1", .schedule = KVE_SCHEDULE_PYRAMID},
         "layer budgets"},
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        lm_state *d = NULL;
        ASSERT_OK(lm_state_new(other[i].m, &other[i].o, &d));
        ASSERT_STATUS(lm_session_load(d, buf, size, &got), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), other[i].needle);
        ASSERT_EQ(d->pos, 0);
        lm_state_free(d);
    }
    /* Not into a decoder that has started. */
    ASSERT_STATUS(lm_session_load(a, buf, size, &got), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "position 8");
    ss.n_tokens = 7;
    ASSERT_STATUS(lm_session_save(a, &ss, NULL, 0, &size), KVE_EINVAL);
    ASSERT_TRUE(same_state(fresh, twin));
    free(buf);
    free(bad);
    lm_state_free(a);
    lm_state_free(fresh);
    lm_state_free(twin);
    lm_model_free(m);
    lm_model_free(m2);
    lm_model_free(m3);
    free(img);
    free(img2);
    free(img3);
    fx_model_free(&fx);
    fx_model_free(&fx2);
    fx_model_free(&fx3);
}

/* Out of memory at every allocation of a copy (into a decoder 3 tokens
 * in) and of a load: KVE_ENOMEM, the destination as it was (it equals a
 * decoder that decoded what it had), and the call succeeds once memory
 * suffices. */
static void test_out_of_memory(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, check_seed + 5);
    unsigned char *img;
    lm_model *m = load(&fx, &img);
    ASSERT_TRUE(m != NULL);
    for (size_t c = 0; c < N_CONFIGS; c++) {
        lm_options o = options_of(&configs[c], 2);
        fail_at = 0;
        lm_state *src = NULL;
        ASSERT_OK(lm_state_new(m, &o, &src));
        int32_t toks[10];
        for (size_t t = 0; t < 10; t++)
            ASSERT_OK(lm_forward(src, toks[t] = tok(t, 9)));
        lm_session ss = {.tokens = toks, .n_tokens = 10};
        kve_rng_seed(&ss.rng, 5);
        size_t size;
        ASSERT_OK(lm_session_save(src, &ss, NULL, 0, &size));
        unsigned char *buf = malloc(size);
        ASSERT_OK(lm_session_save(src, &ss, buf, size, &size));
        for (int what = 0; what < 2; what++) {
            int done = 0;
            for (size_t k = 1; k < 64 && !done; k++) {
                lm_state *dst = NULL, *ref = NULL;
                fail_at = 0;
                ASSERT_OK(lm_state_new(m, &o, &dst));
                ASSERT_OK(lm_state_new(m, &o, &ref));
                for (size_t t = 0; what == 0 && t < 3; t++) {
                    ASSERT_OK(lm_forward(dst, toks[t]));
                    ASSERT_OK(lm_forward(ref, toks[t]));
                }
                fail_at = k;
                n_allocs = 0;
                lm_session got = {0};
                kve_status st = what == 0 ? lm_state_copy(dst, src)
                                          : lm_session_load(dst, buf, size, &got);
                fail_at = 0;
                if (st == KVE_OK) {
                    done = 1;
                    ASSERT_TRUE(same_state(dst, src));
                    if (what == 1)
                        lm_free(&dst->alloc, got.tokens);
                } else {
                    if (st != KVE_ENOMEM)
                        CHECK_FAIL_AT("config %zu, %s, allocation %zu: status %d (%s)", c,
                                      what ? "load" : "copy", k, (int)st, kve_last_error());
                    ASSERT_TRUE(same_state(dst, ref));
                }
                lm_state_free(dst);
                lm_state_free(ref);
            }
            ASSERT_TRUE(done);
        }
        free(buf);
        lm_state_free(src);
    }
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
}

/* The sampler: llama.cpp's definitions on small hand-made cases. */
static void test_sampler(void)
{
    lm_candidate scratch[8];
    lm_sampler_params p = lm_sampler_default_params();
    ASSERT_EQ(p.top_k, 40);
    ASSERT_NEAR(p.top_p, 0.95, 0);
    ASSERT_NEAR(p.repeat_penalty, 1.0, 0);
    ASSERT_EQ(p.repeat_last_n, 64);
    ASSERT_NEAR(p.temperature, 0, 0);
    ASSERT_OK(lm_sampler_check(&p));
    kve_rng rng, before;
    kve_rng_seed(&rng, 3);
    /* Greedy: the first maximum; the generator untouched. */
    const float l1[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    before = rng;
    ASSERT_EQ(lm_sample(&p, l1, 5, NULL, NULL, 0, &rng, scratch), 1);
    ASSERT_TRUE(memcmp(&rng, &before, sizeof rng) == 0);
    /* Banned tokens are never chosen, greedy or not; all banned: -1. */
    const unsigned char ban[5] = {0, 1, 0, 1, 0};
    ASSERT_EQ(lm_sample(&p, l1, 5, ban, NULL, 0, &rng, scratch), 4);
    const unsigned char all[5] = {1, 1, 1, 1, 1};
    ASSERT_EQ(lm_sample(&p, l1, 5, all, NULL, 0, &rng, scratch), -1);
    /* The penalty, once per distinct token of the last n: token 0's 2 / 2 =
     * 1 and token 2's -1 * 2 = -2, so token 1's 1.5 wins. */
    const float l2[3] = {2.0f, 1.5f, -1.0f};
    const int32_t recent[4] = {2, 0, 0, 0};
    p.repeat_penalty = 2.0;
    ASSERT_EQ(lm_sample(&p, l2, 3, NULL, recent, 4, &rng, scratch), 1);
    p.repeat_last_n = 3; /* only the last three: 0, 0, 0 */
    ASSERT_EQ(lm_sample(&p, l2, 3, NULL, recent, 4, &rng, scratch), 1);
    p.repeat_last_n = 0; /* off */
    ASSERT_EQ(lm_sample(&p, l2, 3, NULL, recent, 4, &rng, scratch), 0);
    p = lm_sampler_default_params();
    /* Top-k 2 never draws the third; top-p 0.75 of (0.5, 0.3, 0.2) keeps two
     * (0.5 + 0.3 >= 0.75); one draw per call; frequencies follow the
     * softmax of what is kept. */
    const float l3[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    int count[3] = {0};
    enum { DRAWS = 20000 };
    p.temperature = 1.0;
    p.top_k = 0;
    p.top_p = 1.0;
    for (int i = 0; i < DRAWS; i++) {
        kve_rng mirror = rng;
        (void)kve_rng_uniform(&mirror);
        count[lm_sample(&p, l3, 3, NULL, NULL, 0, &rng, scratch)]++;
        if (memcmp(&mirror, &rng, sizeof rng) != 0)
            CHECK_FAIL_AT("draw %d: the generator did not advance by one draw", i);
    }
    for (int k = 0; k < 3; k++) /* 5 standard errors of a binomial at 20000 */
        ASSERT_NEAR((double)count[k] / DRAWS, expf(l3[k]), 5 * sqrt(0.25 / DRAWS));
    p.top_k = 2;
    memset(count, 0, sizeof count);
    for (int i = 0; i < 4000; i++)
        count[lm_sample(&p, l3, 3, NULL, NULL, 0, &rng, scratch)]++;
    ASSERT_EQ(count[2], 0);
    ASSERT_NEAR((double)count[0] / 4000, 0.625, 5 * sqrt(0.25 / 4000));
    p.top_k = 0;
    p.top_p = 0.75;
    memset(count, 0, sizeof count);
    for (int i = 0; i < 4000; i++)
        count[lm_sample(&p, l3, 3, NULL, NULL, 0, &rng, scratch)]++;
    ASSERT_EQ(count[2], 0);
    ASSERT_TRUE(count[1] > 0);
    p.top_p = 0.5; /* the first alone reaches 0.5 */
    for (int i = 0; i < 200; i++)
        ASSERT_EQ(lm_sample(&p, l3, 3, NULL, NULL, 0, &rng, scratch), 0);
    /* Top-p sees the logits before the temperature (llama.cpp's order): a
     * high temperature does not let the third token past top-p 0.75. */
    p.top_p = 0.75;
    p.temperature = 100;
    for (int i = 0; i < 500; i++)
        ASSERT_TRUE(lm_sample(&p, l3, 3, NULL, NULL, 0, &rng, scratch) != 2);
    /* The same seed, the same tokens. */
    kve_rng r1, r2;
    kve_rng_seed(&r1, 9);
    kve_rng_seed(&r2, 9);
    p.temperature = 0.7;
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(lm_sample(&p, l1, 5, NULL, NULL, 0, &r1, scratch),
                  lm_sample(&p, l1, 5, NULL, NULL, 0, &r2, scratch));
    /* Ranges. */
    lm_sampler_params q = lm_sampler_default_params();
    q.top_p = 0;
    ASSERT_STATUS(lm_sampler_check(&q), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "top-p");
    q = lm_sampler_default_params();
    q.repeat_penalty = 0;
    ASSERT_STATUS(lm_sampler_check(&q), KVE_EINVAL);
    q = lm_sampler_default_params();
    q.temperature = NAN;
    ASSERT_STATUS(lm_sampler_check(&q), KVE_EINVAL);
    q = lm_sampler_default_params();
    q.top_k = -1;
    ASSERT_STATUS(lm_sampler_check(&q), KVE_EINVAL);
}

/* The reserved pass-key pieces of the fixture tokenizer, found by name. */
static void test_reserved_tokens(void)
{
    size_t n;
    unsigned char *img = fx_tokenizer_image(&n);
    lm_tokenizer *t = NULL;
    ASSERT_OK(lm_tokenizer_from_memory(img, n, NULL, &t));
    unsigned char *mask = malloc((size_t)t->n_pieces);
    ASSERT_EQ(lm_reserved_tokens(t, mask), FX_KEYS);
    for (int32_t i = 0; i < t->n_pieces; i++)
        ASSERT_EQ(mask[i], i >= FX_FIRST_KEY && i < FX_FIRST_KEY + FX_KEYS);
    free(mask);
    lm_tokenizer_free(t);
    free(img);
}

/* --products llama: a session of it loads only into a decoder with the same
 * arithmetic (and copies likewise), and resumes to the uninterrupted run's
 * bits; an unknown products value is refused at construction. */
static void test_products(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, check_seed + 11);
    unsigned char *img;
    lm_model *m = load(&fx, &img);
    ASSERT_TRUE(m != NULL);
    config cf = {"h2o:budget=6,recent_window=2", LM_POS_ORIGINAL, 0, 0};
    lm_options o = options_of(&cf, 1);
    o.products = LM_PRODUCTS_LLAMA;
    lm_state *a = NULL, *b = NULL, *whole = NULL, *exact = NULL;
    ASSERT_OK(lm_state_new(m, &o, &a));
    ASSERT_OK(lm_state_new(m, &o, &b));
    ASSERT_OK(lm_state_new(m, &o, &whole));
    int32_t toks[24];
    for (size_t t = 0; t < 24; t++)
        toks[t] = t ? tok(t, 8) : LM_BOS;
    for (size_t t = 0; t < 24; t++)
        ASSERT_OK(lm_forward(whole, toks[t]));
    for (size_t t = 0; t < 12; t++)
        ASSERT_OK(lm_forward(a, toks[t]));
    lm_session ss = {.tokens = toks, .n_tokens = 12};
    kve_rng_seed(&ss.rng, 3);
    size_t size;
    ASSERT_OK(lm_session_save(a, &ss, NULL, 0, &size));
    unsigned char *buf = malloc(size);
    ASSERT_OK(lm_session_save(a, &ss, buf, size, &size));
    lm_session got;
    ASSERT_OK(lm_session_load(b, buf, size, &got));
    ASSERT_TRUE(got.n_tokens == 12 && memcmp(got.tokens, toks, 12 * sizeof *toks) == 0);
    lm_free(&b->alloc, got.tokens);
    for (size_t t = 12; t < 24; t++)
        ASSERT_OK(lm_forward(b, toks[t]));
    ASSERT_TRUE(memcmp(b->logits, whole->logits, (size_t)V_ * sizeof(float)) == 0);
    o.products = LM_PRODUCTS_EXACT;
    ASSERT_OK(lm_state_new(m, &o, &exact));
    ASSERT_STATUS(lm_session_load(exact, buf, size, &got), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "products");
    ASSERT_EQ(exact->pos, 0);
    ASSERT_STATUS(lm_state_copy(exact, a), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "products");
    o.products = (lm_products)2;
    lm_state *bad = NULL;
    ASSERT_STATUS(lm_state_new(m, &o, &bad), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "products");
    ASSERT_TRUE(bad == NULL);
    free(buf);
    lm_state_free(a), lm_state_free(b), lm_state_free(whole), lm_state_free(exact);
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
}

/* --same-positions: every (layer, KV head) cache holds the bank's one kept
 * set after every step, each head its budget once full; a session of it
 * loads only into a decoder with the option, and sharing or a schedule is
 * refused beside it. */
static void test_same_positions(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, check_seed + 9);
    unsigned char *img;
    lm_model *m = load(&fx, &img);
    ASSERT_TRUE(m != NULL);
    config cf = {"tova:budget=4", LM_POS_ORIGINAL, 0, 1};
    lm_options o = options_of(&cf, 1);
    lm_state *a = NULL, *plain = NULL;
    ASSERT_OK(lm_state_new(m, &o, &a));
    ASSERT_EQ(kve_bank_same_positions(a->bank), 1);
    for (size_t t = 0; t < 30; t++) {
        ASSERT_OK(lm_forward(a, t ? tok(t, 8) : LM_BOS));
        const lm_cache *c0 = &a->cache[0];
        ASSERT_EQ(c0->n, t + 1 < 5 ? t + 1 : 4);
        for (size_t i = 0; i < (size_t)L_ * G_; i++) {
            const lm_cache *ci = &a->cache[i];
            ASSERT_EQ(ci->n, c0->n);
            ASSERT_TRUE(memcmp(ci->pos, c0->pos, c0->n * sizeof(int32_t)) == 0);
            ASSERT_TRUE(memcmp(ci->pos, kve_bank_positions(a->bank, i), c0->n * sizeof(int32_t)) == 0);
        }
    }
    lm_session ss = {.tokens = NULL, .n_tokens = 30};
    kve_rng_seed(&ss.rng, 6);
    int32_t toks[30];
    for (size_t t = 0; t < 30; t++)
        toks[t] = t ? tok(t, 8) : LM_BOS;
    ss.tokens = toks;
    kve_rng_seed(&ss.rng, 3);
    size_t size;
    ASSERT_OK(lm_session_save(a, &ss, NULL, 0, &size));
    unsigned char *buf = malloc(size);
    ASSERT_OK(lm_session_save(a, &ss, buf, size, &size));
    cf.same = 0;
    o = options_of(&cf, 1);
    ASSERT_OK(lm_state_new(m, &o, &plain));
    lm_session got;
    ASSERT_STATUS(lm_session_load(plain, buf, size, &got), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "same positions");
    ASSERT_EQ(plain->pos, 0);
    ASSERT_STATUS(lm_state_copy(plain, a), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "same positions");
    o.same_positions = 1;
    o.share_heads = 1;
    lm_state *bad = NULL;
    ASSERT_STATUS(lm_state_new(m, &o, &bad), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "same_positions");
    o.share_heads = 0;
    o.schedule = KVE_SCHEDULE_PYRAMID;
    ASSERT_STATUS(lm_state_new(m, &o, &bad), KVE_EINVAL);
    ASSERT_TRUE(bad == NULL);
    free(buf);
    lm_state_free(a);
    lm_state_free(plain);
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
}

/* min_share does nothing without shared heads (issue 30, item 7): decoders
 * that differ only in it (0.25 against 0, share_heads off) copy into each
 * other both ways and load each other's sessions, and each then decodes as
 * a decoder of its own options that decoded the same tokens itself. (Before
 * the fix, kve_bank_copy refused: "cannot copy: dst's min_share is 0,
 * src's 0.25".) With shared heads the difference still refuses. */
static void test_min_share_unshared(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, check_seed + 5);
    unsigned char *img;
    lm_model *m = load(&fx, &img);
    ASSERT_TRUE(m != NULL);
    enum { NA = 9, NB = 7 };
    lm_options o[2];
    o[0] = options_of(&configs[0], 3); /* min_share 0.25, no shared heads */
    o[1] = o[0];
    o[1].min_share = 0;
    ASSERT_TRUE(!o[0].share_heads && o[0].min_share == 0.25);
    int32_t toks[NA];
    for (size_t t = 0; t < NA; t++)
        toks[t] = t ? tok(t, 8) : LM_BOS;
    for (int k = 0; k < 2; k++) { /* src with o[k], dst and ref with o[1 - k] */
        lm_state *src = NULL, *dst = NULL, *ref = NULL, *loaded = NULL;
        ASSERT_OK(lm_state_new(m, &o[k], &src));
        ASSERT_OK(lm_state_new(m, &o[1 - k], &dst));
        ASSERT_OK(lm_state_new(m, &o[1 - k], &ref));
        ASSERT_OK(lm_state_new(m, &o[1 - k], &loaded));
        for (size_t t = 0; t < NA; t++) {
            ASSERT_OK(lm_forward(src, toks[t]));
            ASSERT_OK(lm_forward(ref, toks[t]));
        }
        ASSERT_OK(lm_state_copy(dst, src));
        ASSERT_TRUE(same_state(dst, ref));
        /* the session of src, resumed by a decoder of the other min_share */
        lm_session ss = {.tokens = toks, .n_tokens = NA};
        kve_rng_seed(&ss.rng, 9);
        size_t size;
        ASSERT_OK(lm_session_save(src, &ss, NULL, 0, &size));
        unsigned char *buf = malloc(size);
        ASSERT_OK(lm_session_save(src, &ss, buf, size, &size));
        lm_session got = {0};
        ASSERT_OK(lm_session_load(loaded, buf, size, &got));
        ASSERT_EQ(got.n_tokens, NA);
        ASSERT_TRUE(same_state(loaded, ref));
        for (size_t t = 0; t < NB; t++) {
            ASSERT_OK(lm_forward(dst, tok(t, 9)));
            ASSERT_OK(lm_forward(loaded, tok(t, 9)));
            ASSERT_OK(lm_forward(ref, tok(t, 9)));
            if (!same_state(dst, ref) || !same_state(loaded, ref))
                CHECK_FAIL_AT("min_share %g into %g: step %zu after the copy differs",
                              o[k].min_share, o[1 - k].min_share, t);
        }
        lm_free(&loaded->alloc, got.tokens);
        free(buf);
        lm_state_free(src);
        lm_state_free(dst);
        lm_state_free(ref);
        lm_state_free(loaded);
    }
    /* shared heads: min_share selects what is kept, so a difference refuses */
    lm_options sh[2] = {o[0], o[1]};
    sh[0].share_heads = sh[1].share_heads = 1;
    sh[0].policy = sh[1].policy = configs[4].spec;
    lm_state *a = NULL, *b = NULL;
    ASSERT_OK(lm_state_new(m, &sh[0], &a));
    ASSERT_OK(lm_state_new(m, &sh[1], &b));
    ASSERT_OK(lm_forward(a, LM_BOS));
    ASSERT_STATUS(lm_state_copy(b, a), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head sharing");
    lm_state_free(a);
    lm_state_free(b);
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_rewind);
    RUN(test_fork_and_refusals);
    RUN(test_session_roundtrip);
    RUN(test_session_refusals);
    RUN(test_min_share_unshared);
    RUN(test_out_of_memory);
    RUN(test_sampler);
    RUN(test_reserved_tokens);
    RUN(test_same_positions);
    RUN(test_products);
    return CHECK_DONE();
}
