/*
 * test_lm.c - the llama2.c decoder (lm/): checkpoints, tokenizer, the decode
 * step under every cache discipline, and the allocation-failure paths.
 *
 * Encoding is held to run.c's algorithm as run.c writes it
 * (tests/lm_naive_bpe.h) on random texts. Models are tiny random ones written by the test
 * (tests/lm_fixture.h) in the legacy (tied and untied) and version-1 formats. The decoder is held
 * to a naive double-precision reference (tests/lm_reference.h) that knows
 * nothing of lm/: with the full cache, with window and streaming masks
 * computed here, with keys re-rotated at their cache index, and with h2o
 * policies that the reference drives from its own attention.
 *
 * Tolerance against the reference: |logit - ref| <= 1e-4 * (1 + |ref|).
 * The decoder runs in float32 with different summation orders and computes
 * rotary angles in float (run.c's formula), the reference in double; over
 * two layers of width 16 and forty positions the float error measures
 * below 1e-6 relative (the test prints the worst), a margin of ~100, while
 * a wrong mask, rotation or tensor moves logits by 1e-2 or more.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "internal.h"
#include "kvevict.h"
#include "lm.h"
#include "lm_check.h"
#include "lm_naive_bpe.h"
#include "lm_reference.h"
#include "test_allocator.h"
#include "tmpdir.h"

/* The default prefill options with another method. */
static kve_prefill_options prefill_method(kve_prefill_method m)
{
    kve_prefill_options o = kve_prefill_default_options();
    o.method = m;
    return o;
}

#include <sys/stat.h>

/* The shape most tests use: 2 layers, 4 query heads over 2 KV heads (GQA),
 * head size 4, context 12 (decoding runs past it). */
enum { D_ = 16, F_ = 24, L_ = 2, H_ = 4, G_ = 2, V_ = 40, T_ = 12 };
#define TOL(ref) (1e-4 * (1.0 + fabs(ref)))

static lm_model *load(const fx_model *fx, int version, unsigned char **img)
{
    size_t n;
    *img = fx_image(fx, version, &n);
    lm_model *m = NULL;
    if (lm_model_from_memory(*img, n, NULL, &m) != KVE_OK)
        fprintf(stderr, "load: %s\n", kve_last_error());
    return m;
}

/* A tiny model of the shape above, its checkpoint image and the loaded model. */
typedef struct tiny {
    fx_model fx;
    unsigned char *img;
    lm_model *m;
} tiny;

static lm_model *tiny_open(tiny *k, int shared, int version, uint64_t seed)
{
    fx_model_init(&k->fx, D_, F_, L_, H_, G_, V_, T_, shared, seed);
    k->m = load(&k->fx, version, &k->img);
    return k->m;
}

static void tiny_close(tiny *k)
{
    lm_model_free(k->m);
    free(k->img);
    fx_model_free(&k->fx);
}

static int32_t token_at(size_t t)
{
    return (int32_t)((t * 7 + 3) % V_);
}

/* ---- checkpoints ---- */

static void test_loader_order(void)
{
    for (int version = 0; version < 2; version++) {
        for (int shared = 0; shared < 2; shared++) {
            tiny k;
            lm_model *m = tiny_open(&k, shared, version, check_seed + 1);
            ASSERT_TRUE(m != NULL);
            const lm_config *c = &m->config;
            ASSERT_EQ(c->dim, D_);
            ASSERT_EQ(c->hidden_dim, F_);
            ASSERT_EQ(c->n_layers, L_);
            ASSERT_EQ(c->n_heads, H_);
            ASSERT_EQ(c->n_kv_heads, G_);
            ASSERT_EQ(c->vocab_size, V_);
            ASSERT_EQ(c->seq_len, T_);
            ASSERT_EQ(c->head_size, D_ / H_);
            ASSERT_EQ(c->shared_classifier, shared);
            ASSERT_EQ(c->version, version);
            const lm_weights *w = &m->weights;
            size_t KD = (size_t)G_ * (D_ / H_);
            /* Every tensor, compared whole, layer by layer: a shifted layout
             * differs. */
            ASSERT_TRUE(w->token_embedding.type == LM_F32 && w->token_embedding.rows == V_ &&
                        w->token_embedding.cols == D_);
            ASSERT_TRUE(memcmp(w->token_embedding.data, k.fx.emb, sizeof(float) * V_ * D_) == 0);
            ASSERT_TRUE(memcmp(w->wcls.data, k.fx.cls, sizeof(float) * V_ * D_) == 0);
            ASSERT_TRUE(memcmp(w->rms_final, k.fx.rms_final, sizeof(float) * D_) == 0);
            for (size_t l = 0; l < L_; l++) {
                const lm_layer *ly = &w->layer[l];
                struct {
                    const lm_matrix *got;
                    const float *want;
                    size_t rows, cols;
                } t[] = {
                    {&ly->wq, k.fx.wq + l * D_ * D_, D_, D_},
                    {&ly->wk, k.fx.wk + l * KD * D_, KD, D_},
                    {&ly->wv, k.fx.wv + l * KD * D_, KD, D_},
                    {&ly->wo, k.fx.wo + l * D_ * D_, D_, D_},
                    {&ly->w1, k.fx.w1 + l * F_ * D_, F_, D_},
                    {&ly->w2, k.fx.w2 + l * D_ * F_, D_, F_},
                    {&ly->w3, k.fx.w3 + l * F_ * D_, F_, D_},
                };
                for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
                    ASSERT_TRUE(t[i].got->type == LM_F32 && t[i].got->rows == t[i].rows &&
                                t[i].got->cols == t[i].cols);
                    ASSERT_TRUE(memcmp(t[i].got->data, t[i].want,
                                       t[i].rows * t[i].cols * sizeof(float)) == 0);
                }
                ASSERT_TRUE(memcmp(ly->rms_att, k.fx.rms_att + l * D_, sizeof(float) * D_) == 0);
                ASSERT_TRUE(memcmp(ly->rms_ffn, k.fx.rms_ffn + l * D_, sizeof(float) * D_) == 0);
            }
            ASSERT_TRUE(!shared || w->wcls.data == w->token_embedding.data);
            ASSERT_EQ((int)c->format, version);
            tiny_close(&k);
        }
    }
}

static void set_i32(unsigned char *p, int32_t v)
{
    memcpy(p, &v, 4);
}

/* Expects a refusal with KVE_EFORMAT whose message contains `needle`. */
#define ASSERT_REFUSED(img, n, needle)                                                             \
    do {                                                                                           \
        lm_model *m_ = (lm_model *)&check_seed;                                                    \
        kve_status st_ = lm_model_from_memory((img), (n), NULL, &m_);                                    \
        if (st_ != KVE_EFORMAT || m_ != (lm_model *)&check_seed)                                   \
            CHECK_FAIL_AT("size %zu: %s, want KVE_EFORMAT (%s)", (size_t)(n),                      \
                          kve_status_name(st_), kve_last_error());                                  \
        ASSERT_CONTAINS(kve_last_error(), needle);                                                  \
        ASSERT_TRUE(strchr(kve_last_error(), '\n') == NULL);                                        \
    } while (0)

static void test_header_fields(void)
{
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, 7);
    for (int version = 0; version < 2; version++) {
        size_t n;
        unsigned char *img = fx_image(&fx, version, &n);
        size_t base = version ? 8 : 0;
        for (int f = 0; f < 7; f++) {
            int32_t saved;
            memcpy(&saved, img + base + 4 * f, 4);
            static const int32_t bad[] = {0, -3, INT32_MIN};
            for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
                if (version == 0 && f == 5 && bad[b] == -3)
                    continue; /* legacy: a negative vocab_size means untied */
                set_i32(img + base + 4 * f, bad[b]);
                ASSERT_REFUSED(img, n, names[f]);
            }
            /* Huge values: refused by the size check (or divisibility), never a
             * crash. Version 1 has no rotary tables: any positive seq_len fits. */
            set_i32(img + base + 4 * f, INT32_MAX);
            if (!(version == 1 && f == 6)) {
                lm_model *m = NULL;
                ASSERT_STATUS(lm_model_from_memory(img, n, NULL, &m), KVE_EFORMAT);
            }
            set_i32(img + base + 4 * f, saved);
        }
        /* Divisibility: dim % n_heads, n_heads % n_kv_heads, even head size. */
        set_i32(img + base + 12, 3);
        ASSERT_REFUSED(img, n, "dim 16 is not a multiple of n_heads 3");
        set_i32(img + base + 12, H_);
        set_i32(img + base + 16, 3);
        ASSERT_REFUSED(img, n, "n_heads 4 is not a multiple of n_kv_heads 3");
        set_i32(img + base + 16, 8);
        ASSERT_REFUSED(img, n, "n_kv_heads 8");
        set_i32(img + base + 16, G_);
        set_i32(img + base + 12, 16);
        set_i32(img + base + 16, 16);
        ASSERT_REFUSED(img, n, "head_size 1");
        set_i32(img + base + 12, H_);
        set_i32(img + base + 16, G_);
        /* Sizes that overflow 64 bits and sizes that merely mismatch. */
        set_i32(img + base + 0, 1 << 30);
        set_i32(img + base + 8, 1 << 30);
        ASSERT_REFUSED(img, n, "64 bits");
        set_i32(img + base + 0, D_);
        set_i32(img + base + 8, L_);
        set_i32(img + base + 4, F_ + 2);
        ASSERT_REFUSED(img, n, "promises");
        set_i32(img + base + 4, F_);
        /* The classifier flag: legacy sign, version-1 byte. */
        if (version == 0) {
            set_i32(img + 20, -V_); /* claims an untied classifier that is not there */
            ASSERT_REFUSED(img, n, "unshared classifier");
            set_i32(img + 20, V_);
        } else {
            img[36] = 2;
            ASSERT_REFUSED(img, n, "shared_classifier flag 2");
            img[36] = 0; /* untied: the classifier is missing */
            ASSERT_REFUSED(img, n, "promises");
            img[36] = 1;
            set_i32(img + 4, 3);
            ASSERT_REFUSED(img, n, "version 3 is not supported");
            set_i32(img + 4, 2); /* read as version 2: no group size after the flag */
            ASSERT_REFUSED(img, n, "group_size 0 must be in [1, 65536]");
            set_i32(img + 4, 0);
            ASSERT_REFUSED(img, n, "version 0");
            set_i32(img + 4, 1);
            set_i32(img, 0x616b3433); /* no magic: read as legacy, dim 1634415667 */
            ASSERT_REFUSED(img, n, "checkpoint header: dim 1634415667 is not a multiple");
            set_i32(img, 0x616b3432);
        }
        /* One byte too many. */
        unsigned char *longer = malloc(n + 4);
        memcpy(longer, img, n);
        longer[n] = 0;
        ASSERT_REFUSED(longer, n + 1, "the file holds");
        free(longer);
        lm_model *m = NULL;
        ASSERT_OK(lm_model_from_memory(img, n, NULL, &m)); /* restored: valid again */
        lm_model_free(m);
        free(img);
    }
    fx_model_free(&fx);
}

/* A file cut at every length is refused, naming the header field it ends in. */
static void test_truncated_everywhere(void)
{
    static const char *const names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                         "n_kv_heads", "vocab_size", "seq_len"};
    for (int version = 0; version < 2; version++) {
        for (int shared = 0; shared < 2; shared++) {
            fx_model fx;
            fx_model_init(&fx, 4, 6, 1, 2, 1, 5, 3, shared, 11);
            size_t n;
            unsigned char *img = fx_image(&fx, version, &n);
            for (size_t cut = 0; cut < n; cut++) {
                /* exactly `cut` bytes, so the sanitizers see any read past them */
                unsigned char *copy = malloc(cut ? cut : 1);
                memcpy(copy, img, cut);
                const char *needle = "promises";
                if (version == 0 && cut < 28)
                    needle = names[cut / 4];
                else if (version == 1 && cut < 4)
                    needle = names[cut / 4]; /* no magic yet: read as a legacy header */
                else if (version == 1 && cut < 8)
                    needle = "version";
                else if (version == 1 && cut < 36)
                    needle = names[(cut - 8) / 4];
                else if (version == 1 && cut < 256)
                    needle = "256-byte";
                ASSERT_REFUSED(copy, cut, needle);
                free(copy);
            }
            free(img);
            fx_model_free(&fx);
        }
    }
}

static void test_open_errors(void)
{
    lm_model *m = NULL;
    ASSERT_STATUS(lm_model_open(path_of("missing.bin"), NULL, &m), KVE_EIO);
    ASSERT_CONTAINS(kve_last_error(), "No such file");
    ASSERT_STATUS(lm_model_open(dir, NULL, &m), KVE_EIO);
    ASSERT_CONTAINS(kve_last_error(), "not a regular file");
    ASSERT_TRUE(fx_write_file(path_of("empty.bin"), "", 0) == 0);
    ASSERT_STATUS(lm_model_open(path_of("empty.bin"), NULL, &m), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "0 bytes, truncated in the field dim");
    ASSERT_TRUE(m == NULL);
    /* The mapped file gives the same model as the same bytes in memory. */
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 0, 5);
    ASSERT_TRUE(fx_write_model(&fx, 1, path_of("v1.bin")) == 0);
    ASSERT_OK(lm_model_open(path_of("v1.bin"), NULL, &m));
    ASSERT_TRUE(m->map != NULL);
    ASSERT_TRUE(memcmp(m->weights.wcls.data, fx.cls, sizeof(float) * V_ * D_) == 0);
    ASSERT_TRUE(memcmp(m->weights.layer[L_ - 1].w3.data, fx.w3 + (L_ - 1) * F_ * D_,
                       sizeof(float) * F_ * D_) == 0);
    lm_model_free(m);
    remove(path_of("v1.bin"));
    remove(path_of("empty.bin"));
    fx_model_free(&fx);
    uint32_t words[10] = {0};
    ASSERT_STATUS(lm_model_from_memory((unsigned char *)words + 1, 28, NULL, &m), KVE_EINVAL);
}

/* ---- the decode step ---- */

/* Runs `steps` tokens through a fresh decoder; logits (steps, V) out. */
static kve_status run_decoder(const lm_model *m, const lm_options *opt, size_t steps, float *logits)
{
    lm_state *s = NULL;
    kve_status st = lm_state_new(m, opt, &s);
    for (size_t t = 0; st == KVE_OK && t < steps; t++) {
        st = lm_forward(s, token_at(t));
        if (st == KVE_OK)
            memcpy(logits + t * V_, s->logits, V_ * sizeof(float));
    }
    if (st != KVE_OK)
        fprintf(stderr, "run_decoder: %s\n", kve_last_error());
    lm_state_free(s);
    return st;
}

typedef struct mask { /* the masked caches of the reference */
    enum { M_FULL, M_WINDOW, M_STREAMING } kind;
    int32_t budget, sinks;
} mask;

static size_t mask_keys(void *user, int layer, int g, int32_t t, int32_t *keys)
{
    (void)layer, (void)g;
    const mask *mk = user;
    size_t n = 0;
    for (int32_t i = 0; i < t; i++) {
        int keep = 1;
        if (mk->kind == M_WINDOW)
            keep = i >= t - mk->budget;
        else if (mk->kind == M_STREAMING)
            keep = i < mk->sinks || i >= t - (mk->budget - mk->sinks);
        if (keep)
            keys[n++] = i;
    }
    return n;
}

/* Holds decoder logits to the masked reference, step by step. */
static void check_against_mask(const fx_model *fx, const lm_model *m, const char *spec,
                               lm_positions positions, mask mk, size_t steps)
{
    float *got = malloc(steps * V_ * sizeof(float));
    double want[V_];
    lm_options opt = {.policy = spec, .positions = positions};
    kve_status st = run_decoder(m, &opt, steps, got);
    ref_state r;
    ref_init(&r, fx, positions == LM_POS_CACHE, steps);
    double worst = 0, bad_got = 0, bad_want = 0;
    size_t bad_t = SIZE_MAX;
    int bad_i = 0;
    for (size_t t = 0; st == KVE_OK && t < steps && bad_t == SIZE_MAX; t++) {
        ref_step(&r, token_at(t), (int32_t)t, mask_keys, NULL, &mk, want);
        for (int i = 0; i < V_ && bad_t == SIZE_MAX; i++) {
            double g = got[t * V_ + i], err = fabs(g - want[i]) / (1.0 + fabs(want[i]));
            worst = err > worst ? err : worst;
            if (!(fabs(g - want[i]) <= TOL(want[i])))
                bad_t = t, bad_i = i, bad_got = g, bad_want = want[i];
        }
    }
    ref_free(&r);
    free(got);
    ASSERT_OK(st);
    if (bad_t != SIZE_MAX)
        CHECK_FAIL_AT("%s: step %zu logit %d: %.9g vs reference %.9g", spec ? spec : "none", bad_t,
                      bad_i, bad_got, bad_want);
    printf("  %-28s %-8s worst relative error %.2e over %zu steps\n", spec ? spec : "(none)",
           positions == LM_POS_CACHE ? "cache" : "original", worst, steps);
}

static void test_full_cache_reference(void)
{
    for (int version = 0; version < 2; version++) {
        tiny k;
        lm_model *m = tiny_open(&k, version, version, check_seed + 2);
        ASSERT_TRUE(m != NULL);
        mask full = {M_FULL, 0, 0};
        check_against_mask(&k.fx, m, NULL, LM_POS_ORIGINAL, full, 30); /* past seq_len 12 */
        check_against_mask(&k.fx, m, "full:budget=4", LM_POS_CACHE, full, 30);
        tiny_close(&k);
    }
}

/* --policy full is bit-identical to no policy at all, and with the full cache
 * cache positions equal original ones (index == position). */
static void test_full_identity(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 0, 0, check_seed + 3);
    ASSERT_TRUE(m != NULL);
    enum { STEPS = 40 };
    float *none = malloc(STEPS * V_ * sizeof(float)), *full = malloc(STEPS * V_ * sizeof(float));
    float *cache = malloc(STEPS * V_ * sizeof(float));
    ASSERT_OK(run_decoder(m, NULL, STEPS, none));
    lm_options opt = {.policy = "full:budget=3"};
    ASSERT_OK(run_decoder(m, &opt, STEPS, full));
    opt.positions = LM_POS_CACHE;
    ASSERT_OK(run_decoder(m, &opt, STEPS, cache));
    ASSERT_TRUE(memcmp(none, full, STEPS * V_ * sizeof(float)) == 0);
    ASSERT_TRUE(memcmp(none, cache, STEPS * V_ * sizeof(float)) == 0);
    /* And a window as long as the run never evicts: identical too. */
    opt = (lm_options){.policy = "window", .budget = STEPS};
    ASSERT_OK(run_decoder(m, &opt, STEPS, full));
    ASSERT_TRUE(memcmp(none, full, STEPS * V_ * sizeof(float)) == 0);
    /* A window that evicts must differ (else the test above proves nothing). */
    opt.budget = 4;
    ASSERT_OK(run_decoder(m, &opt, STEPS, full));
    ASSERT_TRUE(memcmp(none + 10 * V_, full + 10 * V_, V_ * sizeof(float)) != 0);
    free(none);
    free(full);
    free(cache);
    tiny_close(&k);
}

static void test_window_and_streaming(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 0, 1, check_seed + 4);
    ASSERT_TRUE(m != NULL);
    static const lm_positions modes[2] = {LM_POS_ORIGINAL, LM_POS_CACHE};
    for (int i = 0; i < 2; i++) {
        check_against_mask(&k.fx, m, "window:budget=5", modes[i], (mask){M_WINDOW, 5, 0}, 40);
        check_against_mask(&k.fx, m, "window:budget=1", modes[i], (mask){M_WINDOW, 1, 0}, 20);
        check_against_mask(&k.fx, m, "streaming:budget=6,sinks=2", modes[i],
                           (mask){M_STREAMING, 6, 2}, 40);
        check_against_mask(&k.fx, m, "streaming:budget=4,sinks=1", modes[i],
                           (mask){M_STREAMING, 4, 1}, 30);
    }
    /* The masks differ from the full cache: the reference can tell them apart. */
    float a[30 * V_], b[30 * V_];
    lm_options opt = {.policy = "window:budget=5", .positions = LM_POS_CACHE};
    ASSERT_OK(run_decoder(m, &opt, 30, a));
    opt.positions = LM_POS_ORIGINAL;
    ASSERT_OK(run_decoder(m, &opt, 30, b));
    ASSERT_TRUE(memcmp(a + 20 * V_, b + 20 * V_, V_ * sizeof(float)) != 0);
    tiny_close(&k);
}

/* The h2o reference: one kve_policy per (layer, KV head) that the reference
 * drives with its own (double, group-mean) attention. */
typedef struct policy_ref {
    kve_policy *p[L_ * G_];
    size_t budget;
} policy_ref;

static size_t policy_keys(void *user, int layer, int g, int32_t t, int32_t *keys)
{
    (void)t;
    policy_ref *pr = user;
    kve_policy *p = pr->p[layer * G_ + g];
    size_t n = kve_policy_size(p);
    memcpy(keys, kve_policy_positions(p), n * sizeof *keys);
    return n;
}

static void policy_seen(void *user, int layer, int g, int32_t t, const int32_t *keys,
                        const double *mean, size_t n)
{
    (void)keys;
    policy_ref *pr = user;
    kve_policy *p = pr->p[layer * G_ + g];
    float w[64];
    for (size_t i = 0; i < n; i++)
        w[i] = (float)mean[i];
    int32_t victims[64];
    if (kve_policy_step(p, t, w, n) != KVE_OK ||
        kve_policy_evict(p, pr->budget, victims, 64, NULL) != KVE_OK)
        fprintf(stderr, "policy_seen: %s\n", kve_last_error());
}

/* The decoder under `spec` in position mode `mode` against the reference
 * driving the same policies (`seen` steps them, from its attention or, with
 * `key_cb`, its keys): logits within TOL and kept sets equal at every step,
 * some head keeping a position older than a window would. */
static void against_reference(const char *spec, int mode, uint64_t seed, ref_seen_fn seen,
                              ref_key_fn key_cb)
{
    tiny k;
    lm_model *m = tiny_open(&k, 1, 0, seed);
    ASSERT_TRUE(m != NULL);
    policy_ref pr;
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = key_cb ? D_ / H_ : 0;
    for (int i = 0; i < L_ * G_; i++)
        ASSERT_OK(kve_policy_new_ex(spec, NULL, &o, &pr.p[i]));
    pr.budget = kve_policy_budget(pr.p[0]);
    lm_options opt = {.policy = spec, .positions = (lm_positions)mode};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    ASSERT_EQ(kve_bank_key_dim(s->bank), D_ / H_);
    ref_state r;
    enum { STEPS = 36 };
    ref_init(&r, &k.fx, mode, STEPS);
    r.key_cb = key_cb;
    double want[V_];
    int older = 0;
    for (size_t t = 0; t < STEPS; t++) {
        ASSERT_OK(lm_forward(s, token_at(t)));
        ref_step(&r, token_at(t), (int32_t)t, policy_keys, seen, &pr, want);
        for (int i = 0; i < V_; i++)
            if (!(fabs(s->logits[i] - want[i]) <= TOL(want[i])))
                CHECK_FAIL_AT("%s step %zu logit %d: %.9g vs %.9g", spec, t, i, s->logits[i],
                              want[i]);
        for (int h = 0; h < L_ * G_; h++) {
            const lm_cache *c = &s->cache[h];
            ASSERT_EQ(c->n, kve_policy_size(pr.p[h]));
            if (memcmp(c->pos, kve_policy_positions(pr.p[h]), c->n * sizeof(int32_t)) != 0)
                CHECK_FAIL_AT("%s, positions %d, step %zu, head %d: kept sets differ", spec, mode,
                              t, h);
            older |= c->n > 0 && c->pos[0] < (int32_t)t - (int32_t)c->n;
        }
    }
    ASSERT_TRUE(older); /* not a window in disguise */
    ref_free(&r);
    for (int i = 0; i < L_ * G_; i++)
        kve_policy_free(pr.p[i]);
    lm_state_free(s);
    tiny_close(&k);
}

static void test_h2o_against_reference(void)
{
    static const char *const specs[] = {"h2o:budget=6,recent_window=2", "tova:budget=5",
                                        "scissorhands:budget=6,recent_window=2"};
    for (size_t sp = 0; sp < sizeof specs / sizeof specs[0]; sp++)
        for (int mode = 0; mode < 2; mode++)
            against_reference(specs[sp], mode, check_seed + 5, policy_seen, NULL);
}

/* ---- policies that read keys, and prefill ---- */

/* The reference's new key of (layer, g), kept until its `seen` steps the
 * policy with it. */
static float ref_key[L_ * G_][D_ / H_];

static void policy_key(void *user, int layer, int g, int32_t t, const double *key)
{
    (void)user;
    (void)t;
    for (int i = 0; i < D_ / H_; i++)
        ref_key[layer * G_ + g][i] = (float)key[i];
}

static void policy_seen_keys(void *user, int layer, int g, int32_t t, const int32_t *keys,
                             const double *mean, size_t n)
{
    (void)keys;
    (void)mean;
    policy_ref *pr = user;
    kve_policy *p = pr->p[layer * G_ + g];
    int32_t victims[64];
    (void)n;
    if (kve_policy_step_keys(p, t, NULL, 0, ref_key[layer * G_ + g]) != KVE_OK ||
        kve_policy_evict(p, pr->budget, victims, 64, NULL) != KVE_OK)
        fprintf(stderr, "policy_seen_keys: %s\n", kve_last_error());
}

/* knorm and keydiff through the decoder keep what the same policies keep
 * when the reference steps them with its own (rotated) keys. */
static void test_key_policies_against_reference(void)
{
    static const char *const specs[] = {"knorm:budget=6,recent_window=0",
                                        "knorm:budget=7,recent_window=2",
                                        "keydiff:budget=6,recent_window=0",
                                        "keydiff:budget=5,recent_window=1"};
    for (size_t sp = 0; sp < sizeof specs / sizeof specs[0]; sp++)
        for (int mode = 0; mode < 2; mode++)
            against_reference(specs[sp], mode, check_seed + 15 + sp, policy_seen_keys,
                              policy_key);
}

/* ---- policies that read queries and values ---- */

/* The reference's queries (R*S), value and W_o v of (layer, g) at the step,
 * kept until its `seen` steps the policy with them. */
enum { RS_ = D_ / H_, RR_ = H_ / G_ };
static float ref_q[L_ * G_][RR_ * RS_], ref_v[L_ * G_][RS_], ref_wov[L_ * G_][RR_ * D_];
static int ref_use_wov; /* 1: the policy's values are W_o v (vnorm=1), 0: the value */

static void policy_data(void *user, int layer, int g, int32_t t, const double *queries,
                        const double *value, const double *wov)
{
    (void)user;
    (void)t;
    int h = layer * G_ + g;
    for (int i = 0; i < RR_ * RS_; i++)
        ref_q[h][i] = (float)queries[i];
    for (int i = 0; i < RS_; i++)
        ref_v[h][i] = (float)value[i];
    for (int i = 0; i < RR_ * D_; i++)
        ref_wov[h][i] = (float)wov[i];
}

static void policy_seen_data(void *user, int layer, int g, int32_t t, const int32_t *keys,
                             const double *mean, size_t n)
{
    (void)keys;
    policy_ref *pr = user;
    int h = layer * G_ + g;
    kve_policy *p = pr->p[h];
    float w[64];
    for (size_t i = 0; i < n; i++)
        w[i] = (float)mean[i];
    kve_step_data d = kve_step_default_data();
    d.attn = w;
    d.ld = n;
    d.keys = ref_key[h];
    d.ld_keys = RS_;
    d.queries = ref_q[h];
    d.ld_queries = RS_;
    d.values = ref_use_wov ? ref_wov[h] : ref_v[h];
    d.ld_values = ref_use_wov ? RR_ * D_ : RS_;
    int32_t victims[64];
    if (kve_policy_step_data(p, t, &d) != KVE_OK ||
        kve_policy_evict(p, pr->budget, victims, 64, NULL) != KVE_OK)
        fprintf(stderr, "policy_seen_data: %s\n", kve_last_error());
}

/* expected_attention (queries, keys, values) and vnorm=1 (attention times
 * ||W_o v||) through the decoder keep, at every step, what the same
 * policies keep when the double-precision reference steps them with its
 * own rotated queries and keys, values and W_o v (the decoder builds the
 * bank with the model's facts: key_dim, value_dim, query_group, rope). */
static void test_data_policies_against_reference(void)
{
    static const struct {
        const char *spec;
        int wov, modes;
    } cases[] = {
        {"expected_attention:budget=6,n_sink=1", 0, 1},
        {"expected_attention:budget=5,n_sink=0,use_covariance=0,interval=3", 0, 1},
        {"h2o:budget=6,recent_window=2,vnorm=1", 1, 2},
        {"tova:budget=5,vnorm=1", 1, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ref_use_wov = cases[c].wov;
        for (int mode = 0; mode < cases[c].modes; mode++) {
            tiny k;
            lm_model *m = tiny_open(&k, 1, 0, check_seed + 31 + c);
            ASSERT_TRUE(m != NULL);
            policy_ref pr;
            kve_policy_options o = kve_policy_default_options();
            o.key_dim = RS_;
            o.value_dim = cases[c].wov ? RR_ * D_ : RS_;
            o.query_group = RR_;
            o.rope.rotary_dim = RS_;
            o.rope.base = 10000.0;
            o.rope.pairs = KVE_ROPE_ADJACENT;
            for (int i = 0; i < L_ * G_; i++)
                ASSERT_OK(kve_policy_new_ex(cases[c].spec, NULL, &o, &pr.p[i]));
            pr.budget = kve_policy_budget(pr.p[0]);
            lm_options opt = {.policy = cases[c].spec, .positions = (lm_positions)mode};
            lm_state *s = NULL;
            ASSERT_OK(lm_state_new(m, &opt, &s));
            ref_state r;
            enum { STEPS = 30 };
            ref_init(&r, &k.fx, mode, STEPS);
            r.key_cb = policy_key;
            r.data_cb = policy_data;
            double want[V_];
            int older = 0, differ = 0;
            for (size_t t = 0; t < STEPS && !differ; t++) {
                ASSERT_OK(lm_forward(s, token_at(t)));
                ref_step(&r, token_at(t), (int32_t)t, policy_keys, policy_seen_data, &pr, want);
                for (int h = 0; h < L_ * G_; h++) {
                    const lm_cache *kc = &s->cache[h];
                    if (kc->n != kve_policy_size(pr.p[h]) ||
                        memcmp(kc->pos, kve_policy_positions(pr.p[h]),
                               kc->n * sizeof(int32_t)) != 0) {
                        CHECK_FAIL_AT("%s, positions %d, step %zu, head %d: kept sets differ",
                                      cases[c].spec, mode, t, h);
                        differ = 1;
                        break;
                    }
                    older |= kc->n > 0 && kc->pos[0] < (int32_t)t - (int32_t)kc->n;
                }
            }
            ASSERT_TRUE(older); /* not a window in disguise */
            ref_free(&r);
            for (int i = 0; i < L_ * G_; i++)
                kve_policy_free(pr.p[i]);
            lm_state_free(s);
            tiny_close(&k);
        }
    }
    /* a policy that reads queries takes them rotated at their positions */
    tiny k;
    lm_model *m = tiny_open(&k, 1, 0, check_seed + 39);
    ASSERT_TRUE(m != NULL);
    lm_options opt = {.policy = "expected_attention:budget=6", .positions = LM_POS_CACHE};
    lm_state *s = NULL;
    ASSERT_EQ(lm_state_new(m, &opt, &s), KVE_EINVAL);
    ASSERT_TRUE(s == NULL && strstr(kve_last_error(), "positions original") != NULL);
    tiny_close(&k);
}

/* Rows the full-cache decoder computes, recorded for an independent
 * kve_bank_prefill: (L, H, n, n). */
enum { PN = 20 };
static float pf_rows[L_ * H_ * PN * PN];

static void record_attention(void *user, int32_t layer, int32_t pos, const float *att, size_t ld,
                             const size_t *n_keys)
{
    (void)user;
    (void)n_keys;
    for (size_t h = 0; h < H_; h++)
        memcpy(pf_rows + (((size_t)layer * H_ + h) * PN + (size_t)pos) * PN, att + h * ld,
               ((size_t)pos + 1) * sizeof(float));
}

static void test_prefill(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 0, 0, check_seed + 20);
    ASSERT_TRUE(m != NULL);
    int32_t toks[PN + 10];
    for (size_t i = 0; i < PN + 10; i++)
        toks[i] = token_at(i * 3 + 1);
    /* The full cache's rows and logits over the prompt. */
    lm_options full = {.on_attention = record_attention};
    lm_state *f = NULL;
    ASSERT_OK(lm_state_new(m, &full, &f));
    for (size_t i = 0; i < PN; i++)
        ASSERT_OK(lm_forward(f, toks[i]));
    static const struct {
        const char *spec;
        int method; /* -1: the policy's own scores (params NULL) */
        size_t window;
    } cases[] = {
        {"h2o:budget=8,recent_window=2", KVE_PREFILL_H2O, 0},
        {"h2o:budget=8,recent_window=2", KVE_PREFILL_SNAPKV, 3},
        {"tova:budget=9,recent_window=1", KVE_PREFILL_SNAPKV, 4},
        {"h2o_mean:budget=7,recent_window=1", KVE_PREFILL_H2O, 0},
        {"h2o:budget=8,recent_window=2", -1, 0},
        {"knorm:budget=8,recent_window=1", -1, 0},
        {"keydiff:budget=6,recent_window=0", -1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        lm_options opt = {.policy = cases[c].spec};
        lm_state *s = NULL;
        ASSERT_OK(lm_state_new(m, &opt, &s));
        kve_prefill_options p = prefill_method(
            cases[c].method == KVE_PREFILL_SNAPKV ? KVE_PREFILL_SNAPKV : KVE_PREFILL_H2O);
        p.window = cases[c].window ? cases[c].window : p.window;
        ASSERT_OK(lm_prefill(s, toks, PN, cases[c].method < 0 ? NULL : &p));
        ASSERT_EQ(s->pos, PN);
        /* The prompt was read with every key: the full cache's logits. */
        ASSERT_TRUE(memcmp(s->logits, f->logits, sizeof(float) * V_) == 0);
        /* What each head keeps: kve_bank_prefill on the full cache's rows, or
         * the policy stepped through them without evicting and evicted once. */
        kve_bank *b = NULL;
        kve_bank_options o = kve_bank_default_options();
        o.key_dim = D_ / H_;
        ASSERT_OK(kve_bank_new_ex(cases[c].spec, L_ * G_, NULL, &o, &b));
        if (cases[c].method >= 0) {
            size_t r = kve_prefill_rows(PN, &p);
            static float rows[L_ * H_ * PN * PN];
            for (size_t l = 0; l < L_; l++)
                for (size_t h = 0; h < H_; h++)
                    for (size_t j = 0; j < r; j++)
                        memcpy(rows + (((l * H_ + h) * r) + j) * PN,
                               pf_rows + ((l * H_ + h) * PN + (PN - r + j)) * PN,
                               PN * sizeof(float));
            for (size_t l = 0; l < L_; l++)
                ASSERT_OK(kve_bank_prefill(b, l * G_, G_, PN, kve_bank_budget(b), rows + l * H_ * r * PN, PN, H_ / G_, KVE_REDUCE_MEAN, &p));
            for (size_t h = 0; h < L_ * G_; h++) {
                const lm_cache *kc = &s->cache[h];
                ASSERT_EQ(kc->n, kve_bank_size(b, h));
                ASSERT_TRUE(memcmp(kc->pos, kve_bank_positions(b, h), kc->n * sizeof(int32_t)) ==
                            0);
            }
        }
        kve_bank_free(b);
        for (size_t h = 0; h < L_ * G_; h++) {
            const lm_cache *kc = &s->cache[h];
            ASSERT_EQ(kc->n, kve_bank_budget(s->bank));
            ASSERT_EQ(kc->n, kve_bank_size(s->bank, h));
            ASSERT_TRUE(memcmp(kc->pos, kve_bank_positions(s->bank, h), kc->n * sizeof(int32_t)) ==
                        0);
            if (!strstr(cases[c].spec, "recent_window=0")) /* the newest is protected */
                ASSERT_TRUE(kc->pos[kc->n - 1] == PN - 1);
        }
        /* Decoding goes on, evicting per step. */
        for (size_t i = PN; i < PN + 10; i++) {
            ASSERT_OK(lm_forward(s, toks[i]));
            for (size_t h = 0; h < L_ * G_; h++)
                ASSERT_EQ(s->cache[h].n, kve_bank_budget(s->bank));
        }
        lm_state_free(s);
    }
    lm_state_free(f);

    /* Refusals change nothing: the decoder still reads a prompt after them. */
    lm_options opt = {.policy = "h2o:budget=8,recent_window=2"};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    kve_prefill_options p = prefill_method(KVE_PREFILL_SNAPKV);
    p.window = 8; /* not below the budget */
    ASSERT_STATUS(lm_prefill(s, toks, PN, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "prefill: layer 0: h2o: prefill budget 8 must be greater than window 8");
    ASSERT_STATUS(lm_prefill(NULL, toks, PN, NULL), KVE_EINVAL);
    ASSERT_STATUS(lm_prefill(s, NULL, PN, NULL), KVE_EINVAL);
    ASSERT_STATUS(lm_prefill(s, toks, 0, NULL), KVE_EINVAL);
    toks[5] = V_;
    ASSERT_STATUS(lm_prefill(s, toks, PN, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "token 5");
    toks[5] = token_at(16);
    ASSERT_EQ(s->pos, 0);
    lm_state_free(s);
    talloc ta;
    talloc_init(&ta);
    opt.allocator = &ta.a;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    opt.allocator = NULL;
    talloc_fail_after(&ta, 0);
    p.window = 3;
    kve_status st = lm_prefill(s, toks, PN, &p);
    talloc_fail_after(&ta, SIZE_MAX);
    ASSERT_STATUS(st, KVE_ENOMEM);
    ASSERT_EQ(s->pos, 0);
    ASSERT_OK(lm_prefill(s, toks, PN, &p));
    ASSERT_STATUS(lm_prefill(s, toks, PN, &p), KVE_EINVAL); /* not at position 0 */
    ASSERT_CONTAINS(kve_last_error(), "reset it first");
    lm_state_free(s);
    talloc_check_empty(&ta);
    s = NULL;
    opt.policy = "knorm:budget=8";
    ASSERT_OK(lm_state_new(m, &opt, &s));
    ASSERT_STATUS(lm_prefill(s, toks, PN, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "reads keys");
    ASSERT_EQ(s->pos, 0);
    lm_state_free(s);
    s = NULL;
    ASSERT_OK(lm_state_new(m, NULL, &s));
    ASSERT_STATUS(lm_prefill(s, toks, PN, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "no policy");
    lm_state_free(s);
    tiny_close(&k);
}

/* Budgets: the reference drives one bank of every (layer, KV head), as the
 * decoder should: each layer's heads evicted to its own budget, or (shared)
 * the layer's G heads together to G times it. The layer budgets come from
 * kve_layer_budgets with the floor the decoder must use (recent_window + 1). */
typedef struct bank_ref {
    kve_bank *b;
    size_t budget[L_];
    int shared;
    float rows[G_ * 64];
} bank_ref;

static size_t bank_keys(void *user, int layer, int g, int32_t t, int32_t *keys)
{
    (void)t;
    bank_ref *br = user;
    size_t h = (size_t)(layer * G_ + g), n = kve_bank_size(br->b, h);
    memcpy(keys, kve_bank_positions(br->b, h), n * sizeof *keys);
    return n;
}

static void bank_seen(void *user, int layer, int g, int32_t t, const int32_t *keys,
                      const double *mean, size_t n)
{
    (void)keys;
    bank_ref *br = user;
    for (size_t i = 0; i < n; i++)
        br->rows[(size_t)g * 64 + i] = (float)mean[i];
    if (g != G_ - 1)
        return; /* the layer is stepped whole, after its last head */
    int32_t victims[G_ * 64];
    size_t first = (size_t)layer * G_, b = br->budget[layer];
    kve_status st = kve_bank_step_range(br->b, first, G_, t, br->rows, 64, 1, KVE_REDUCE_MEAN, NULL, 0);
    if (st == KVE_OK)
        st = br->shared ? kve_bank_evict_shared(br->b, first, G_, G_ * b, victims, 64, NULL)
                        : kve_bank_evict_range(br->b, first, G_, b, victims, 64, NULL);
    if (st != KVE_OK)
        fprintf(stderr, "bank_seen: %s\n", kve_last_error());
}

static void test_budgets_against_reference(void)
{
    static const kve_schedule_kind kinds[] = {KVE_SCHEDULE_UNIFORM, KVE_SCHEDULE_PYRAMID,
                                              KVE_SCHEDULE_WEIGHTED};
    static const double weights[L_] = {1.0, 4.0};
    const char *spec = "h2o:budget=7,recent_window=1";
    int spread_seen = 0;
    for (int shared = 0; shared < 2; shared++)
        for (int kind = 0; kind < 3; kind++) {
            tiny k;
            lm_model *m = tiny_open(&k, 1, 0, check_seed + 9);
            ASSERT_TRUE(m != NULL);
            bank_ref br = {.shared = shared};
            kve_schedule_options sch = kve_schedule_default_options();
            sch.kind = kinds[kind];
            sch.floor = 2;
            sch.beta = 3.0;
            sch.weights = weights;
            ASSERT_OK(kve_layer_budgets(L_ * 7, L_, &sch, br.budget));
            kve_bank_options o = kve_bank_default_options();
            o.share = shared ? G_ : 0;
            o.min_share = 0.5;
            ASSERT_OK(kve_bank_new_ex("h2o:budget=12,recent_window=1", L_ * G_, NULL, &o, &br.b));
            lm_options opt = {.policy = spec, .schedule = kinds[kind], .beta = 3.0,
                              .layer_weights = weights, .share_heads = shared,
                              .min_share = 0.5};
            lm_state *s = NULL;
            ASSERT_OK(lm_state_new(m, &opt, &s));
            for (int l = 0; l < L_; l++)
                ASSERT_EQ(s->layer_budget[l], br.budget[l]);
            ASSERT_TRUE(kind == 0 || br.budget[0] != br.budget[1]);
            ref_state r;
            enum { STEPS = 40 };
            ref_init(&r, &k.fx, 0, STEPS);
            double want[V_];
            for (size_t t = 0; t < STEPS; t++) {
                ASSERT_OK(lm_forward(s, token_at(t)));
                ref_step(&r, token_at(t), (int32_t)t, bank_keys, bank_seen, &br, want);
                for (int i = 0; i < V_; i++)
                    if (!(fabs(s->logits[i] - want[i]) <= TOL(want[i])))
                        CHECK_FAIL_AT("shared %d kind %d step %zu logit %d: %.9g vs %.9g", shared,
                                      kind, t, i, s->logits[i], want[i]);
                for (int l = 0; l < L_; l++) {
                    size_t total = 0;
                    for (int g = 0; g < G_; g++) {
                        const lm_cache *c = &s->cache[l * G_ + g];
                        size_t h = (size_t)(l * G_ + g);
                        ASSERT_EQ(c->n, kve_bank_size(br.b, h));
                        ASSERT_TRUE(memcmp(c->pos, kve_bank_positions(br.b, h),
                                           c->n * sizeof(int32_t)) == 0);
                        total += c->n;
                        spread_seen |= shared && c->n != br.budget[l];
                    }
                    ASSERT_TRUE(total <= G_ * br.budget[l]);
                    if (t >= G_ * br.budget[l])
                        ASSERT_EQ(total, G_ * br.budget[l]);
                }
            }
            ref_free(&r);
            kve_bank_free(br.b);
            lm_state_free(s);
            tiny_close(&k);
        }
    ASSERT_TRUE(spread_seen); /* sharing did move positions between heads */
}

/* The calibration statistic against a direct computation from dumped rows,
 * and its refusals. */
typedef struct spread_dump {
    double far[L_];
    size_t seen[L_];
    size_t window;
} spread_dump;

static void dump_far(void *user, int32_t layer, int32_t pos, const float *att, size_t ld,
                     const size_t *n_keys)
{
    spread_dump *d = user;
    if ((size_t)pos <= d->window)
        return;
    for (int g = 0; g < G_; g++) {
        double far = 0;
        for (size_t i = 0; i + d->window < (size_t)pos; i++) {
            double sum = 0;
            for (int r = 0; r < H_ / G_; r++)
                sum += att[(size_t)(g * (H_ / G_) + r) * ld + i];
            far += (float)(sum / (H_ / G_));
        }
        (void)n_keys;
        d->far[layer] += far;
        d->seen[layer]++;
    }
}

static void test_layer_spread(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 1, 0, check_seed + 10);
    ASSERT_TRUE(m != NULL);
    int32_t toks[30];
    for (size_t i = 0; i < 30; i++)
        toks[i] = token_at(i + 1);
    double got[L_];
    ASSERT_OK(lm_layer_spread(m, toks, 30, 4, got));
    spread_dump d = {.window = 4};
    lm_options o = {.on_attention = dump_far, .user = &d};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &o, &s));
    for (size_t i = 0; i <= 30; i++)
        ASSERT_OK(lm_forward(s, i ? toks[i - 1] : LM_BOS));
    lm_state_free(s);
    for (int l = 0; l < L_; l++) {
        ASSERT_EQ(d.seen[l], (30 - 4) * G_);
        ASSERT_NEAR(got[l], d.far[l] / (double)d.seen[l], 1e-12);
        ASSERT_TRUE(got[l] > 0 && got[l] < 1);
    }
    ASSERT_STATUS(lm_layer_spread(m, toks, 4, 4, got), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "no step beyond");
    ASSERT_STATUS(lm_layer_spread(NULL, toks, 30, 4, got), KVE_EINVAL);
    /* a schedule the decoder refuses: weights summing to zero, a bad kind;
     * a shared budget on a policy without scores */
    double zero[L_] = {0};
    lm_options bad = {.policy = "h2o:budget=6,recent_window=1",
                      .schedule = KVE_SCHEDULE_WEIGHTED, .layer_weights = zero};
    ASSERT_STATUS(lm_state_new(m, &bad, &s), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "sum to 0");
    bad = (lm_options){.policy = "window:budget=6", .share_heads = 1};
    ASSERT_STATUS(lm_state_new(m, &bad, &s), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "compares scores");
    tiny_close(&k);
}

static void test_reset_and_seeds(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 0, 0, check_seed + 6);
    ASSERT_TRUE(m != NULL);
    enum { STEPS = 30 };
    float a[STEPS * V_], b[STEPS * V_];
    lm_options opt = {.policy = "random:budget=5,recent_window=1", .seed = 9};
    ASSERT_OK(run_decoder(m, &opt, STEPS, a));
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    for (int round = 0; round < 2; round++) {
        for (size_t t = 0; t < STEPS; t++) {
            ASSERT_OK(lm_forward(s, token_at(t)));
            memcpy(b + t * V_, s->logits, sizeof(float) * V_);
        }
        ASSERT_TRUE(memcmp(a, b, sizeof a) == 0);
        ASSERT_OK(lm_state_reset(s));
        ASSERT_EQ(s->pos, 0);
    }
    lm_state_free(s);
    opt.seed = 10;
    ASSERT_OK(run_decoder(m, &opt, STEPS, b));
    ASSERT_TRUE(memcmp(a, b, sizeof a) != 0);
    tiny_close(&k);
}

static void test_refusals(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 0, 0, check_seed + 7);
    ASSERT_TRUE(m != NULL);
    lm_state *s = NULL;
    lm_options opt = {.policy = "h2o:budget=4,recent_window=4"};
    ASSERT_STATUS(lm_state_new(m, &opt, &s), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "policy: h2o: recent_window");
    opt = (lm_options){.policy = "nope"};
    ASSERT_STATUS(lm_state_new(m, &opt, &s), KVE_EINVAL);
    opt = (lm_options){.budget = 5};
    ASSERT_STATUS(lm_state_new(m, &opt, &s), KVE_EINVAL);
    opt = (lm_options){.policy = "window:budget=3", .positions = (lm_positions)7};
    ASSERT_STATUS(lm_state_new(m, &opt, &s), KVE_EINVAL);
    ASSERT_TRUE(s == NULL);

    /* A refused token changes nothing: the run continues as if it never came. */
    float a[8 * V_], b[8 * V_];
    opt = (lm_options){.policy = "window:budget=3"};
    ASSERT_OK(run_decoder(m, &opt, 8, a));
    ASSERT_OK(lm_state_new(m, &opt, &s));
    for (size_t t = 0; t < 8; t++) {
        ASSERT_STATUS(lm_forward(s, -1), KVE_EINVAL);
        ASSERT_STATUS(lm_forward(s, V_), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "outside the vocabulary");
        ASSERT_OK(lm_forward(s, token_at(t)));
        memcpy(b + t * V_, s->logits, sizeof(float) * V_);
    }
    ASSERT_TRUE(memcmp(a, b, sizeof a) == 0);
    lm_state_free(s);

    /* A NaN or an infinity among the weights is refused at load, naming the
     * tensor (both formats). */
    unsigned char *img2;
    for (int version = 0; version <= 1; version++) {
        float keep = k.fx.wk[3];
        k.fx.wk[3] = NAN;
        ASSERT_TRUE(load(&k.fx, version, &img2) == NULL);
        ASSERT_CONTAINS(kve_last_error(), "tensor wk holds NaN at element 3");
        free(img2);
        k.fx.wk[3] = keep;
        keep = k.fx.rms_final[1];
        k.fx.rms_final[1] = -INFINITY;
        ASSERT_TRUE(load(&k.fx, version, &img2) == NULL);
        ASSERT_CONTAINS(kve_last_error(), "tensor rms_final holds an infinity at element 1");
        free(img2);
        k.fx.rms_final[1] = keep;
    }
    /* Finite weights whose products overflow: refused at the first key
     * that is not finite (KVE_ERANGE, before a policy sees NaN attention;
     * before, position 0 went through and position 1 was a policy's
     * KVE_EINVAL), the decoder broken until reset, and says so. */
    for (size_t i = 0; i < (size_t)D_ * (size_t)G_ * (size_t)(D_ / H_); i++)
        k.fx.wk[i] = 3e38f;
    lm_model *bad = load(&k.fx, 0, &img2);
    ASSERT_TRUE(bad != NULL);
    ASSERT_OK(lm_state_new(bad, &opt, &s));
    ASSERT_STATUS(lm_forward(s, 1), KVE_ERANGE);
    ASSERT_CONTAINS(kve_last_error(), "position 0: key element 0 of layer 0 is NaN");
    ASSERT_CONTAINS(kve_last_error(), "overflow float32");
    ASSERT_STATUS(lm_forward(s, 2), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "reset");
    ASSERT_OK(lm_state_reset(s));
    ASSERT_EQ(s->pos, 0);
    ASSERT_STATUS(lm_forward(s, 1), KVE_ERANGE); /* the same model: the same refusal */
    lm_state_free(s);
    lm_model_free(bad);
    free(img2);
    tiny_close(&k);
}

/* ---- evaluation ---- */

static void test_window_nats(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 1, 1, check_seed + 8);
    ASSERT_TRUE(m != NULL);
    enum { N = 11 };
    int32_t toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = token_at((size_t)i + 5);
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, NULL, &s));
    double nats = 0, per[N];
    ASSERT_OK(lm_window_nats(s, toks, N, &nats, per));
    /* Reference: BOS, then the tokens; -log softmax of the next token. */
    ref_state r;
    ref_init(&r, &k.fx, 0, N + 1);
    double want_total = 0, logits[V_];
    int32_t prev = LM_BOS;
    for (int i = 0; i < N; i++) {
        ref_step(&r, prev, i, NULL, NULL, NULL, logits);
        double max = logits[0], sum = 0;
        for (int v = 1; v < V_; v++)
            max = logits[v] > max ? logits[v] : max;
        for (int v = 0; v < V_; v++)
            sum += exp(logits[v] - max);
        double want = max + log(sum) - logits[toks[i]];
        ASSERT_NEAR(per[i], want, 1e-4);
        want_total += want;
        prev = toks[i];
    }
    ASSERT_NEAR(nats, want_total, 1e-3);
    ASSERT_TRUE(nats > 0);
    /* A second window starts from a fresh cache: the same result. */
    double again = 0;
    ASSERT_OK(lm_window_nats(s, toks, N, &again, NULL));
    ASSERT_TRUE(again == nats);
    toks[3] = V_;
    ASSERT_STATUS(lm_window_nats(s, toks, N, &again, NULL), KVE_EINVAL);
    ref_free(&r);
    lm_state_free(s);
    tiny_close(&k);
}

/* ---- tokenizer ---- */

static lm_tokenizer *fixture_tokenizer(void)
{
    size_t n;
    unsigned char *img = fx_tokenizer_image(&n);
    lm_tokenizer *t = NULL;
    if (lm_tokenizer_from_memory(img, n, NULL, &t) != KVE_OK)
        fprintf(stderr, "tokenizer: %s\n", kve_last_error());
    free(img);
    return t;
}

static void test_tokenizer_encode(void)
{
    lm_tokenizer *t = fixture_tokenizer();
    ASSERT_TRUE(t != NULL);
    ASSERT_EQ(t->n_pieces, FX_PIECES);
    ASSERT_EQ(lm_piece_id(t, "<key01>", 7), FX_FIRST_KEY + 1);
    ASSERT_EQ(lm_piece_id(t, "<key63>", 7), FX_FIRST_KEY + 63);
    ASSERT_EQ(lm_piece_id(t, "<0x41>", 6), 3 + 0x41);
    ASSERT_EQ(lm_piece_id(t, "zz", 2), -1);
    /* Hand-checked: "th" and "he" tie at -2 and the leftmost merges first,
     * then "the", then " the"; in "baaa" the three pairs tie at -4. */
    int32_t got[64];
    size_t n = 0;
    ASSERT_OK(lm_encode(t, "the", 3, got, 64, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(got[0], lm_piece_id(t, " the", 4));
    ASSERT_OK(lm_encode(t, "baaa", 4, got, 64, &n));
    ASSERT_EQ(n, 3);
    ASSERT_EQ(got[0], lm_piece_id(t, " ", 1));
    ASSERT_EQ(got[1], lm_piece_id(t, "ba", 2));
    ASSERT_EQ(got[2], lm_piece_id(t, "aa", 2));
    ASSERT_OK(lm_encode(t, "", 0, got, 64, &n));
    ASSERT_EQ(n, 0);
    ASSERT_STATUS(lm_encode(t, "abcabc", 6, got, 2, &n), KVE_ERANGE);

    /* Against run.c's algorithm on random texts over an alphabet that makes
     * merges, ties, multi-byte code points and stray continuation bytes. */
    static const char *const alphabet[] = {"a",        "b",
                                           "c",        "e",
                                           "h",        "t",
                                           " ",        "th",
                                           "\xc3\xa9", "\xe2\x82\xac",
                                           "\x80",     "\xc3",
                                           "z",        "\n",
                                           "<key00>",  "\xf0\x9f\x98\x80"};
    uint64_t rs = check_seed;
    for (int trial = 0; trial < 400; trial++) {
        char text[200];
        size_t len = 0;
        int parts = (int)(fx_next(&rs) % 40);
        for (int k = 0; k < parts; k++) {
            const char *a = alphabet[fx_next(&rs) % (sizeof alphabet / sizeof alphabet[0])];
            size_t al = strlen(a);
            if (len + al >= sizeof text)
                break;
            memcpy(text + len, a, al);
            len += al;
        }
        text[len] = '\0';
        int want[256];
        size_t nw = naive_encode(t, text, want);
        int32_t mine[256];
        size_t nm = 0;
        ASSERT_OK(lm_encode(t, text, len, mine, 256, &nm));
        ASSERT_EQ(nm, nw);
        for (size_t i = 0; i < nw; i++)
            if (mine[i] != want[i])
                CHECK_FAIL_AT("trial %d text '%s': token %zu is %d, run.c's %d", trial, text, i,
                              mine[i], want[i]);
        /* Round trip: the pieces spell " " + text; after BOS, text. */
        char back[256];
        size_t bl = 0;
        for (size_t i = 0; i < nm; i++) {
            size_t pl;
            const char *p = lm_decode(t, i ? mine[i - 1] : LM_BOS, mine[i], &pl);
            ASSERT_TRUE(p != NULL && bl + pl < sizeof back);
            memcpy(back + bl, p, pl);
            bl += pl;
        }
        ASSERT_EQ(bl, len);
        ASSERT_TRUE(memcmp(back, text, len) == 0);
    }
    lm_tokenizer_free(t);
}

static void test_tokenizer_decode(void)
{
    lm_tokenizer *t = fixture_tokenizer();
    ASSERT_TRUE(t != NULL);
    size_t n;
    const char *p = lm_decode(t, 5, 3 + 0x0a, &n);
    ASSERT_TRUE(n == 1 && p[0] == '\n');
    p = lm_decode(t, LM_BOS, lm_piece_id(t, " the", 4), &n);
    ASSERT_TRUE(n == 3 && memcmp(p, "the", 3) == 0);
    p = lm_decode(t, 7, lm_piece_id(t, " the", 4), &n);
    ASSERT_TRUE(n == 4 && memcmp(p, " the", 4) == 0);
    ASSERT_TRUE(lm_decode(t, 0, -1, &n) == NULL);
    ASSERT_TRUE(lm_decode(t, 0, FX_PIECES, &n) == NULL);
    lm_tokenizer_free(t);
}

static void test_tokenizer_malformed(void)
{
    size_t n;
    unsigned char *img = fx_tokenizer_image(&n);
    /* Every cut: valid exactly when it falls between two pieces. */
    size_t boundaries = 0;
    for (size_t cut = 0; cut < n; cut++) {
        lm_tokenizer *t = NULL;
        kve_status st = lm_tokenizer_from_memory(img, cut, NULL, &t);
        int boundary = 0;
        if (cut >= 4) {
            size_t off = 4, pieces = 0;
            while (off + 8 <= cut) {
                int32_t len;
                memcpy(&len, img + off + 4, 4);
                if (off + 8 + (size_t)len > cut)
                    break;
                off += 8 + (size_t)len;
                pieces++;
            }
            boundary = off == cut && pieces > 0;
        }
        if (boundary) {
            ASSERT_OK(st);
            boundaries++;
            lm_tokenizer_free(t);
        } else {
            ASSERT_STATUS(st, KVE_EFORMAT);
            ASSERT_TRUE(t == NULL);
            ASSERT_TRUE(kve_last_error()[0] != '\0');
        }
    }
    ASSERT_EQ(boundaries, FX_PIECES - 1);
    lm_tokenizer *t = NULL;
    ASSERT_STATUS(lm_tokenizer_from_memory(img, 4, NULL, &t), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "no pieces");
    ASSERT_STATUS(lm_tokenizer_from_memory(img, 10, NULL, &t), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "piece 0 truncated in the field len");
    unsigned char *bad = malloc(n);
    memcpy(bad, img, n);
    set_i32(bad, 0);
    ASSERT_STATUS(lm_tokenizer_from_memory(bad, n, NULL, &t), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "max_token_length 0");
    memcpy(bad, img, n);
    set_i32(bad + 8, 17); /* piece 0 longer than max_token_length 16 */
    ASSERT_STATUS(lm_tokenizer_from_memory(bad, n, NULL, &t), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "piece 0: len 17");
    set_i32(bad + 8, -1);
    ASSERT_STATUS(lm_tokenizer_from_memory(bad, n, NULL, &t), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "len -1");
    /* A header max_token_length of 2^31 - 1 sizes nothing: buffers follow
     * the longest piece (the fuzzer found a 3 GB allocation here). */
    memcpy(bad, img, n);
    set_i32(bad, INT32_MAX);
    ASSERT_OK(lm_tokenizer_from_memory(bad, n, NULL, &t));
    ASSERT_EQ(t->longest, 7); /* "<key00>" */
    int32_t few[16];
    size_t nf;
    ASSERT_OK(lm_encode(t, "the", 3, few, 16, &nf));
    ASSERT_EQ(nf, 1);
    lm_tokenizer_free(t);
    memcpy(bad, img, n);
    bad[12] = 0; /* the first byte of "<unk>" */
    ASSERT_STATUS(lm_tokenizer_from_memory(bad, n, NULL, &t), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "NUL byte");
    memcpy(bad, img, n);
    float nan_score = NAN;
    memcpy(bad + 4, &nan_score, 4);
    ASSERT_STATUS(lm_tokenizer_from_memory(bad, n, NULL, &t), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "NaN score");
    free(bad);
    ASSERT_STATUS(lm_tokenizer_open(path_of("missing.bin"), NULL, &t), KVE_EIO);
    /* A vocabulary without byte pieces cannot fall back: refused, not a wild id. */
    fx_buf small = {0};
    fx_i32(&small, 5);
    const char *pieces[] = {"<unk>", "<s>", "</s>", " ", "a"};
    for (int i = 0; i < 5; i++) {
        float score = 0;
        fx_put(&small, &score, 4);
        fx_i32(&small, (int32_t)strlen(pieces[i]));
        fx_put(&small, pieces[i], strlen(pieces[i]));
    }
    ASSERT_OK(lm_tokenizer_from_memory(small.p, small.n, NULL, &t));
    int32_t toks[8];
    ASSERT_OK(lm_encode(t, "aa", 2, toks, 8, &n));
    ASSERT_EQ(n, 3);
    ASSERT_STATUS(lm_encode(t, "ab", 2, toks, 8, &n), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "byte 0x62 has no piece");
    lm_tokenizer_free(t);
    free(small.p);
    free(img);
}

/* ---- allocation failure ---- */

enum { WALK_MAX = 400 };

/* 1 when decoders a and b are in one state: position, logits, every
 * cache's kept positions, keys and values, and the bank's image. */
static int same_decoder(const lm_state *a, const lm_state *b)
{
    if (a->pos != b->pos || memcmp(a->logits, b->logits, sizeof(float) * V_) != 0)
        return 0;
    size_t S = (size_t)a->model->config.head_size;
    for (size_t i = 0; i < (size_t)L_ * G_; i++) {
        const lm_cache *x = &a->cache[i], *y = &b->cache[i];
        if (x->n != y->n || (x->n && (memcmp(x->pos, y->pos, x->n * sizeof(int32_t)) != 0 ||
                                      memcmp(x->key, y->key, x->n * S * sizeof(float)) != 0 ||
                                      memcmp(x->value, y->value, x->n * S * sizeof(float)) != 0)))
            return 0;
    }
    if (!a->bank || !b->bank)
        return !a->bank && !b->bank;
    size_t na, nb;
    if (kve_bank_save(a->bank, NULL, 0, &na) != KVE_OK ||
        kve_bank_save(b->bank, NULL, 0, &nb) != KVE_OK || na != nb)
        return 0;
    unsigned char *ia = malloc(na), *ib = malloc(nb);
    int same = ia && ib && kve_bank_save(a->bank, ia, na, &na) == KVE_OK &&
               kve_bank_save(b->bank, ib, nb, &nb) == KVE_OK && memcmp(ia, ib, na) == 0;
    free(ia);
    free(ib);
    return same;
}

/* What lm.h says a KVE_ENOMEM from lm_forward leaves: nothing changed (the
 * whole state equal to a copy taken before the call), and the decoder goes
 * on without lm_state_reset, the same token again and then the next ones,
 * equal at every step, caches and bank included, to a fresh decoder that
 * never failed. Every allocation of a step is made to fail in turn (the
 * k-th, k = 0, 1, ...), for the full cache, a policy per head, a policy
 * that reads keys, and shared heads (arenas laid out again). (robustness.md,
 * issue 30 item 10: the comment once said the state broke until reset.) */
static void test_forward_out_of_memory(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 0, 5);
    size_t n;
    unsigned char *img = fx_image(&fx, 0, &n);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    static const lm_options cases[] = {
        {.policy = "full"},
        {.policy = "h2o:budget=5,recent_window=1"},
        {.policy = "knorm:budget=6"},
        {.policy = "h2o:budget=6,recent_window=1", .share_heads = 1},
    };
    enum { STEPS = 72, AFTER = 6 }; /* past FIRST_CAP (64): the full cache grows */
    talloc ta;
    talloc_init(&ta);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t failures = 0;
        for (size_t k = 0; k < 12; k++) {
            lm_options o = cases[c];
            lm_state *ref = NULL, *s = NULL, *before = NULL;
            ASSERT_OK(lm_state_new(m, &o, &ref));
            ASSERT_OK(lm_state_new(m, &o, &before));
            o.allocator = &ta.a;
            ASSERT_OK(lm_state_new(m, &o, &s));
            for (size_t t = 0; t < STEPS; t++) {
                ASSERT_OK(lm_state_copy(before, s));
                talloc_fail_after(&ta, k);
                kve_status st = lm_forward(s, token_at(t));
                talloc_fail_after(&ta, SIZE_MAX);
                if (st != KVE_OK) {
                    ASSERT_STATUS(st, KVE_ENOMEM);
                    failures++;
                    if (!same_decoder(s, before))
                        CHECK_FAIL_AT("%s: a failed step %zu (allocation %zu) changed the state",
                                      cases[c].policy, t, k);
                    ASSERT_OK(lm_forward(s, token_at(t))); /* no reset: the same token again */
                }
                ASSERT_OK(lm_forward(ref, token_at(t)));
                if (!same_decoder(s, ref))
                    CHECK_FAIL_AT("%s: step %zu (allocation %zu failing) differs from a fresh "
                                  "decoder's", cases[c].policy, t, k);
            }
            for (size_t t = STEPS; t < STEPS + AFTER; t++) {
                ASSERT_OK(lm_forward(s, token_at(t)));
                ASSERT_OK(lm_forward(ref, token_at(t)));
            }
            ASSERT_TRUE(same_decoder(s, ref));
            lm_state_free(s);
            lm_state_free(ref);
            lm_state_free(before);
            talloc_check_empty(&ta);
        }
        if (failures == 0)
            CHECK_FAIL_AT("%s: no step's allocation failed: nothing was tested", cases[c].policy);
    }
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
}

static void test_alloc_failures(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 0, 3);
    size_t n;
    unsigned char *img = fx_image(&fx, 0, &n);
    size_t tn;
    unsigned char *timg = fx_tokenizer_image(&tn);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    float ref[20 * V_];
    lm_options opt = {.policy = "h2o:budget=5,recent_window=1"};
    ASSERT_OK(run_decoder(m, &opt, 20, ref));

    /* Every block of lm/ and of the kvevict objects inside it comes from
     * the one allocator given, and goes back to it with its size. */
    talloc ta;
    talloc_init(&ta);
    size_t k;
    for (k = 0;; k++) { /* the model */
        ASSERT_TRUE(k < WALK_MAX);
        lm_model *x = NULL;
        talloc_fail_after(&ta, k);
        kve_status st = lm_model_from_memory(img, n, &ta.a, &x);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK) {
            lm_model_free(x);
            break;
        }
        ASSERT_STATUS(st, KVE_ENOMEM);
        ASSERT_TRUE(x == NULL);
    }
    talloc_check_empty(&ta);
    for (k = 0;; k++) { /* the tokenizer, then an encoding */
        ASSERT_TRUE(k < WALK_MAX);
        lm_tokenizer *t = NULL;
        talloc_fail_after(&ta, k);
        kve_status st = lm_tokenizer_from_memory(timg, tn, &ta.a, &t);
        int32_t toks[64];
        size_t nt = 0;
        if (st == KVE_OK)
            st = lm_encode(t, "the cafe abc", 12, toks, 64, &nt);
        talloc_fail_after(&ta, SIZE_MAX);
        lm_tokenizer_free(t);
        ASSERT_EQ(ta.blocks, 0);
        if (st == KVE_OK)
            break;
        ASSERT_STATUS(st, KVE_ENOMEM);
    }
    talloc_check_empty(&ta);
    /* The decoder: construction (lm's allocations and kvevict's inside the
     * bank, through the same allocator) and every cache growth of a run. A
     * failed step changes nothing: retried, the run equals the reference. */
    opt.allocator = &ta.a;
    size_t bank_blocks = 0;
    for (k = 0;; k++) {
        ASSERT_TRUE(k < WALK_MAX);
        lm_state *s = NULL;
        talloc_fail_after(&ta, k);
        kve_status st = lm_state_new(m, &opt, &s);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st != KVE_OK) {
            ASSERT_STATUS(st, KVE_ENOMEM);
            ASSERT_TRUE(s == NULL);
            ASSERT_EQ(ta.blocks, 0);
            continue;
        }
        size_t before = ta.blocks;
        kve_bank_free(s->bank); /* the bank's blocks were the allocator's too */
        bank_blocks = before - ta.blocks;
        s->bank = NULL;
        lm_state_free(s);
        break;
    }
    ASSERT_TRUE(bank_blocks >= 2);
    talloc_check_empty(&ta);
    /* full: the caches grow along the run; shared h2o: the layers' arenas
     * grow, then are laid out again in place */
    lm_options shared = {.policy = "h2o:budget=6,recent_window=1", .share_heads = 1};
    for (int which = 0; which < 2; which++) {
        opt = which ? shared : (lm_options){.policy = "full"};
        ASSERT_OK(run_decoder(m, &opt, 20, ref));
        opt.allocator = &ta.a;
        for (k = 0; k < 12; k++) {
            lm_state *s = NULL;
            ASSERT_OK(lm_state_new(m, &opt, &s));
            int failed = 0;
            for (size_t t = 0; t < 20; t++) {
                talloc_fail_after(&ta, k);
                kve_status st = lm_forward(s, token_at(t));
                talloc_fail_after(&ta, SIZE_MAX);
                if (st != KVE_OK) {
                    ASSERT_STATUS(st, KVE_ENOMEM);
                    ASSERT_EQ(s->pos, (int32_t)t);
                    failed = 1;
                    ASSERT_OK(lm_forward(s, token_at(t)));
                }
                ASSERT_TRUE(memcmp(s->logits, ref + t * V_, sizeof(float) * V_) == 0);
            }
            ASSERT_TRUE(failed || k > 0);
            lm_state_free(s);
            talloc_check_empty(&ta);
        }
    }
    lm_model_free(m);
    free(img);
    free(timg);
    fx_model_free(&fx);
}

/* ---- KVzip's reconstruction prefill, DuoAttention's per-head budgets ---- */

/* The rotated queries and keys a full-cache decoder computes (on_qk), by
 * layer and position, for the test's own recomputation of KVzip's scores. */
enum { KZ_MAX = 64 };
static float kz_q[L_][KZ_MAX][D_], kz_k[L_][KZ_MAX][G_ * (D_ / H_)];

static void record_qk(void *user, int32_t layer, int32_t pos, const float *q, const float *k)
{
    (void)user;
    memcpy(kz_q[layer][pos], q, sizeof kz_q[0][0]);
    memcpy(kz_k[layer][pos], k, sizeof kz_k[0][0]);
}

/* KVzip recomputed by brute force: for each chunk a fresh full-cache decoder
 * reads the prompt and that chunk's reconstruction sequence; every
 * reconstruction query's softmax over the sinks, the chunk and the
 * reconstruction keys up to its own (in double, from the decoder's rotated
 * q and k), its largest weight on each chunk position over the group's
 * query heads; then the first `sinks` kept and the best budget - sinks by
 * that score (ties to the lower position). */
static double score[L_][G_][KZ_MAX];

/* KVzip+'s factors from the naive reference (lm_reference.h): ||W_o,h v_i||
 * of every prompt position (its data_cb at step i) and 1 / ||h|| of each
 * layer's attention input at each reconstruction step. */
static double kzp_wov[L_][H_][KZ_MAX], kzp_h[L_][KZ_MAX];

static void kzp_data(void *user, int layer, int g, int32_t t, const double *q, const double *v,
                     const double *wov)
{
    (void)user, (void)q, (void)v;
    for (int r = 0; r < H_ / G_; r++) {
        double ss = 0;
        for (int i = 0; i < D_; i++)
            ss += wov[r * D_ + i] * wov[r * D_ + i];
        kzp_wov[layer][g * (H_ / G_) + r][t] = sqrt(ss);
    }
}

/* score[l][g][i] of KVzip (fx: also KVzip+, scaled as kvzip_plus_normalization). */
static void kvzip_scores(const lm_model *m, const fx_model *fx, const int32_t *toks, size_t n,
                         const lm_kvzip *kz, size_t sinks)
{
    enum { S = D_ / H_, R = H_ / G_ };
    memset(score, 0, sizeof score);
    lm_options o = {.on_qk = record_qk};
    lm_state *f = NULL;
    ASSERT_OK(lm_state_new(m, &o, &f));
    ref_state rs;
    if (fx) {
        ref_init(&rs, fx, 0, KZ_MAX);
        rs.data_cb = kzp_data;
    }
    size_t first = toks[0] == LM_BOS;
    for (size_t a = first; a < n; a += kz->chunk) {
        size_t b = a + kz->chunk < n ? a + kz->chunk : n, len = 0;
        int32_t seq[KZ_MAX];
        if (a == first) {
            for (size_t i = 0; i < kz->n_first; i++)
                seq[len++] = kz->first[i];
        } else {
            for (size_t i = 0; i < kz->n_later; i++)
                seq[len++] = kz->later[i];
            for (size_t i = a - kz->overlap; i < a; i++)
                seq[len++] = toks[i];
            seq[len++] = kz->newline;
        }
        for (size_t i = a; i < b; i++)
            seq[len++] = toks[i];
        ASSERT_TRUE(n + len <= KZ_MAX);
        ASSERT_OK(lm_state_reset(f));
        for (size_t i = 0; i < n; i++)
            ASSERT_OK(lm_forward(f, toks[i]));
        for (size_t j = 0; j < len; j++)
            ASSERT_OK(lm_forward(f, seq[j]));
        static double lg_ref[V_];
        for (size_t t = 0; fx && t < n + len; t++) {
            ref_step(&rs, t < n ? toks[t] : seq[t - n], (int32_t)t, NULL, NULL, NULL, lg_ref);
            for (size_t l = 0; l < L_; l++)
                kzp_h[l][t] = rs.hnorm[l];
        }
        size_t s0 = sinks < a ? sinks : a;
        for (size_t l = 0; l < L_; l++)
            for (size_t h = 0; h < H_; h++)
                for (size_t t = n; t < n + len; t++) {
                    size_t g = h / R;
                    double lg[KZ_MAX], mx = -INFINITY, sum = 0;
                    int in[KZ_MAX] = {0};
                    for (size_t i = 0; i <= t; i++) {
                        in[i] = i < s0 || (i >= a && i < b) || i >= n;
                        if (!in[i])
                            continue;
                        double d = 0;
                        for (size_t e = 0; e < S; e++)
                            d += (double)kz_q[l][t][h * S + e] * (double)kz_k[l][i][g * S + e];
                        lg[i] = d / sqrt((double)S);
                        mx = lg[i] > mx ? lg[i] : mx;
                    }
                    for (size_t i = 0; i <= t; i++)
                        if (in[i])
                            sum += exp(lg[i] - mx);
                    for (size_t i = a; i < b; i++) {
                        double w = exp(lg[i] - mx) / sum;
                        if (fx)
                            w = w / kzp_h[l][t] * kzp_wov[l][h][i];
                        score[l][g][i] = w > score[l][g][i] ? w : score[l][g][i];
                    }
                }
    }
    lm_state_free(f);
    if (fx)
        ref_free(&rs);
}

static void kvzip_expected(const lm_model *m, const int32_t *toks, size_t n, const lm_kvzip *kz,
                           size_t sinks, size_t budget, int32_t kept[L_ * G_][KZ_MAX])
{
    kvzip_scores(m, NULL, toks, n, kz, sinks);
    for (size_t l = 0; l < L_; l++)
        for (size_t g = 0; g < G_; g++) {
            unsigned char take[KZ_MAX] = {0};
            for (size_t i = 0; i < sinks && i < n; i++)
                take[i] = 1;
            for (size_t k = sinks; k < budget && k < n; k++) {
                size_t best = n;
                for (size_t i = 0; i < n; i++)
                    if (!take[i] && (best == n || score[l][g][i] > score[l][g][best]))
                        best = i;
                take[best] = 1;
            }
            size_t w = 0;
            for (size_t i = 0; i < n; i++)
                if (take[i])
                    kept[l * G_ + g][w++] = (int32_t)i;
        }
}

static int cmp_double_asc(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* kvpress's compress_post over score[][][] (its sinks: the first
 * min(4, prefix 1) positions scored 1): layerwise, each layer prunes its
 * G (n - budget) lowest; else every layer prunes its scores at or below
 * the L G (n - budget)-th lowest. keep[l G + g][i]. */
static void kvpress_cut_lm(size_t n, size_t budget, int layerwise, unsigned char keep[L_ * G_][KZ_MAX])
{
    static double sv[L_ * G_ * KZ_MAX], sorted[L_ * G_ * KZ_MAX];
    const size_t N = L_ * G_ * n;
    for (size_t h = 0; h < L_ * G_; h++)
        for (size_t i = 0; i < n; i++)
            sv[h * n + i] = i == 0 ? 1.0 : score[h / G_][h % G_][i];
    memcpy(sorted, sv, N * sizeof *sv);
    qsort(sorted, N, sizeof *sorted, cmp_double_asc);
    const double t = sorted[L_ * G_ * (n - budget) - 1];
    for (size_t l = 0; l < L_; l++) {
        const double *s = sv + l * G_ * n;
        size_t prune = 0;
        for (size_t i = 0; i < G_ * n; i++)
            prune += layerwise ? 0 : s[i] <= t;
        if (layerwise)
            prune = G_ * (n - budget);
        unsigned char k[G_ * KZ_MAX];
        memset(k, 1, sizeof k);
        for (size_t q = 0; q < prune; q++) {
            size_t at = SIZE_MAX;
            for (size_t i = 0; i < G_ * n; i++)
                if (k[i] && (at == SIZE_MAX || s[i] <= s[at]))
                    at = i;
            k[at] = 0;
        }
        for (size_t i = 0; i < G_ * n; i++)
            keep[l * G_ + i / n][i % n] = k[i];
    }
}

static void test_kvzip_plus_and_budgets(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 0, 0, check_seed + 41);
    ASSERT_TRUE(m != NULL);
    enum { KN = 20, BUDGET = 9 };
    int32_t toks[KN + 6];
    toks[0] = LM_BOS;
    for (size_t i = 1; i < KN + 6; i++)
        toks[i] = token_at(i * 3 + 1);
    lm_kvzip kz = {.first = {5, 6, 7}, .n_first = 3, .later = {8, 9}, .n_later = 2,
                   .newline = 10, .chunk = 7, .overlap = 3};
    size_t adaptive = 0;
    for (int plus = 0; plus < 2; plus++)
        for (int mode = 0; mode < 3; mode++) { /* per head (KVzip+ only), layer, overall */
            if (!plus && mode == 0)
                continue; /* test_kvzip's */
            kz.plus = plus;
            kvzip_scores(m, plus ? &k.fx : NULL, toks, KN, &kz, 4);
            static unsigned char keep[L_ * G_][KZ_MAX];
            kve_prefill_options p = prefill_method(KVE_PREFILL_KVZIP);
            lm_options opt = {.policy = "h2o:budget=9,recent_window=2", .share_heads = mode > 0};
            if (mode == 0) {
                memset(keep, 0, sizeof keep);
                for (size_t h = 0; h < L_ * G_; h++) { /* the first 4, then the best */
                    for (size_t i = 0; i < 4; i++)
                        keep[h][i] = 1;
                    for (size_t q = 4; q < BUDGET; q++) {
                        size_t best = KN;
                        for (size_t i = 0; i < KN; i++)
                            if (!keep[h][i] && (best == KN || score[h / G_][h % G_][i] >
                                                                  score[h / G_][h % G_][best]))
                                best = i;
                        keep[h][best] = 1;
                    }
                }
            } else {
                p.budgets = mode == 1 ? KVE_PREFILL_PER_LAYER : KVE_PREFILL_OVERALL;
                p.prefix = 1; /* the BOS: kvpress's sinks */
                kvpress_cut_lm(KN, BUDGET, mode == 1, keep);
            }
            lm_state *s = NULL;
            ASSERT_OK(lm_state_new(m, &opt, &s));
            ASSERT_OK(lm_prefill_kvzip(s, toks, KN, &kz, &p));
            size_t total[L_] = {0};
            for (size_t h = 0; h < L_ * G_; h++) {
                size_t w = 0;
                for (size_t i = 0; i < KN; i++)
                    if (keep[h][i]) {
                        ASSERT_TRUE(w < s->cache[h].n);
                        ASSERT_EQ(s->cache[h].pos[w], (int32_t)i);
                        w++;
                    }
                ASSERT_EQ(s->cache[h].n, w);
                adaptive += w != BUDGET;
                total[h / G_] += w;
            }
            for (size_t i = KN; i < KN + 6; i++) { /* each layer keeps its total */
                ASSERT_OK(lm_forward(s, toks[i]));
                for (size_t l = 0; mode > 0 && l < L_; l++) {
                    size_t now = 0;
                    for (size_t g = 0; g < G_; g++)
                        now += s->cache[l * G_ + g].n;
                    ASSERT_EQ(now, total[l] > G_ * 2 + 1 ? total[l] : G_ * 2 + 1);
                }
            }
            if (mode == 2) { /* a session does not hold the layers' totals */
                static int32_t hist[KN + 6];
                memcpy(hist, toks, sizeof hist);
                lm_session ss = {.tokens = hist, .n_tokens = KN + 6, .rng = {{1, 2, 3, 4}}};
                size_t size = 0;
                ASSERT_STATUS(lm_session_save(s, &ss, NULL, 0, &size), KVE_EINVAL);
                ASSERT_CONTAINS(kve_last_error(), "KVzip's overall budgets");
                ASSERT_OK(lm_state_reset(s));
                ASSERT_EQ(s->layer_keep[0], 0);
            }
            lm_state_free(s);
        }
    ASSERT_TRUE(adaptive > 0); /* the cuts across heads are not the per-head budget */
    /* budgets across heads need share_heads; overall, one budget a layer */
    lm_options opt = {.policy = "h2o:budget=9,recent_window=2"};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    kve_prefill_options p = prefill_method(KVE_PREFILL_KVZIP);
    p.budgets = KVE_PREFILL_PER_LAYER;
    ASSERT_STATUS(lm_prefill_kvzip(s, toks, KN, &kz, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "share_heads");
    ASSERT_EQ(s->pos, 0);
    lm_state_free(s);
    /* kvpress's ratio with per-layer budgets: each layer decodes at G times
     * its budget, so the count is the budget's, and the ratio is refused */
    opt.share_heads = 1;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    p.compression_ratio = 0.5;
    ASSERT_STATUS(lm_prefill_kvzip(s, toks, KN, &kz, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "compression_ratio with per-layer");
    ASSERT_EQ(s->pos, 0);
    p.budgets = KVE_PREFILL_OVERALL; /* the same ratio overall: taken */
    ASSERT_OK(lm_prefill_kvzip(s, toks, KN, &kz, &p));
    ASSERT_EQ(s->pos, KN);
    lm_state_free(s);
    tiny_close(&k);
}

/* A vnorm policy's prefill: lm_prefill records the prompt's W_o v and
 * hands it to kve_bank_prefill. Held to the library given the naive
 * reference's rows (the group's mean weights, which KVE_REDUCE_MEAN makes
 * of the query heads' rows) and W_o v (its data_cb): the same kept sets
 * for vnorm=1 and for CriticalKV's vnorm=2, under H2O and SnapKV. */
enum { VP_N = 24 };
static float vp_rows[L_ * G_][VP_N][VP_N], vp_vals[L_ * G_][VP_N][(H_ / G_) * D_];

static void vp_seen(void *user, int layer, int g, int32_t t, const int32_t *keys,
                    const double *mean, size_t n)
{
    (void)user, (void)keys;
    for (size_t i = 0; i < n; i++)
        vp_rows[layer * G_ + g][t][i] = (float)mean[i];
}

static void vp_data(void *user, int layer, int g, int32_t t, const double *q, const double *v,
                    const double *wov)
{
    (void)user, (void)q, (void)v;
    for (size_t i = 0; i < (H_ / G_) * D_; i++)
        vp_vals[layer * G_ + g][t][i] = (float)wov[i];
}

static void test_prefill_values(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 0, 0, check_seed + 42);
    ASSERT_TRUE(m != NULL);
    int32_t toks[VP_N];
    for (size_t i = 0; i < VP_N; i++)
        toks[i] = i ? token_at(i * 7 + 3) : LM_BOS;
    ref_state rs;
    ref_init(&rs, &k.fx, 0, VP_N);
    rs.data_cb = vp_data;
    memset(vp_rows, 0, sizeof vp_rows);
    double lg[V_];
    for (size_t t = 0; t < VP_N; t++) /* the diagonal: the new key's weight, last */
        ref_step(&rs, toks[t], (int32_t)t, NULL, vp_seen, NULL, lg);
    ref_free(&rs);
    /* seen hands the weights on the earlier keys; the own key's is 1 - their sum */
    for (size_t h = 0; h < L_ * G_; h++)
        for (size_t t = 0; t < VP_N; t++) {
            double sum = 0;
            for (size_t i = 0; i < t; i++)
                sum += vp_rows[h][t][i];
            vp_rows[h][t][t] = (float)(1.0 - sum);
        }
    static const char *const specs[] = {"h2o:budget=9,recent_window=2,vnorm=1",
                                        "h2o:budget=9,recent_window=2,vnorm=2"};
    size_t compared = 0;
    for (size_t si = 0; si < 2; si++)
        for (int snap = 0; snap < 2; snap++) {
            kve_prefill_options p = prefill_method(snap ? KVE_PREFILL_SNAPKV : KVE_PREFILL_H2O);
            p.window = 4;
            p.kernel = 3;
            lm_options opt = {.policy = specs[si]};
            lm_state *s = NULL;
            ASSERT_OK(lm_state_new(m, &opt, &s));
            ASSERT_OK(lm_prefill(s, toks, VP_N, &p));
            kve_bank_options bo = kve_bank_default_options();
            bo.value_dim = (H_ / G_) * D_;
            bo.query_group = H_ / G_;
            kve_bank *b = NULL;
            ASSERT_OK(kve_bank_new_ex(specs[si], L_ * G_, NULL, &bo, &b));
            size_t r = kve_prefill_rows(VP_N, &p);
            p.values = &vp_vals[0][0][0];
            p.ld_values = bo.value_dim;
            static float rows[L_ * G_ * VP_N * VP_N]; /* head h's row k at (h r + k) n */
            for (size_t h = 0; h < L_ * G_; h++)
                for (size_t q = 0; q < r; q++)
                    memcpy(rows + (h * r + q) * VP_N, vp_rows[h][VP_N - r + q], sizeof vp_rows[h][0]);
            ASSERT_OK(kve_bank_prefill(b, 0, L_ * G_, VP_N, 9, rows, VP_N, 1, KVE_REDUCE_MEAN, &p));
            for (size_t h = 0; h < L_ * G_; h++) {
                ASSERT_EQ(s->cache[h].n, kve_bank_size(b, h));
                ASSERT_TRUE(memcmp(s->cache[h].pos, kve_bank_positions(b, h),
                                   kve_bank_size(b, h) * sizeof(int32_t)) == 0);
                compared++;
            }
            kve_bank_free(b);
            lm_state_free(s);
        }
    ASSERT_EQ(compared, 4 * L_ * G_);
    tiny_close(&k);
}

static void test_kvzip(void)
{
    tiny k;
    lm_model *m = tiny_open(&k, 0, 0, check_seed + 40);
    ASSERT_TRUE(m != NULL);
    enum { KN = 20, BUDGET = 9 };
    int32_t toks[KN + 6];
    toks[0] = LM_BOS;
    for (size_t i = 1; i < KN + 6; i++)
        toks[i] = token_at(i * 5 + 2);
    lm_kvzip kz = {.first = {5, 6, 7}, .n_first = 3, .later = {8, 9}, .n_later = 2,
                   .newline = 10, .chunk = 7, .overlap = 3};
    /* Full cache: the logits after the prompt. */
    lm_state *f = NULL;
    ASSERT_OK(lm_state_new(m, NULL, &f));
    for (size_t i = 0; i < KN; i++)
        ASSERT_OK(lm_forward(f, toks[i]));
    for (int chunked = 0; chunked < 2; chunked++) {
        kz.chunk = chunked ? 7 : 2048; /* three chunks ([1,8), [8,15), [15,20)), or one */
        static int32_t want[L_ * G_][KZ_MAX];
        kvzip_expected(m, toks, KN, &kz, 4, BUDGET, want);
        lm_options opt = {.policy = "h2o:budget=9,recent_window=2"};
        lm_state *s = NULL;
        ASSERT_OK(lm_state_new(m, &opt, &s));
        ASSERT_OK(lm_prefill_kvzip(s, toks, KN, &kz, NULL));
        ASSERT_EQ(s->pos, KN);
        ASSERT_TRUE(memcmp(s->logits, f->logits, sizeof(float) * V_) == 0);
        for (size_t h = 0; h < L_ * G_; h++) { /* the reconstruction's keys are gone */
            ASSERT_EQ(s->cache[h].n, BUDGET);
            ASSERT_TRUE(memcmp(s->cache[h].pos, want[h], BUDGET * sizeof(int32_t)) == 0);
            ASSERT_TRUE(memcmp(kve_bank_positions(s->bank, h), want[h],
                               BUDGET * sizeof(int32_t)) == 0);
        }
        for (size_t i = KN; i < KN + 6; i++) { /* decoding goes on, evicting per step */
            ASSERT_OK(lm_forward(s, toks[i]));
            for (size_t h = 0; h < L_ * G_; h++)
                ASSERT_EQ(s->cache[h].n, BUDGET);
        }
        lm_state_free(s);
    }
    /* Refusals change nothing. */
    lm_options opt = {.policy = "h2o:budget=9,recent_window=2"};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    kve_prefill_options p = prefill_method(KVE_PREFILL_KVZIP);
    ASSERT_STATUS(lm_prefill(s, toks, KN, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "lm_prefill_kvzip");
    ASSERT_STATUS(lm_prefill_kvzip(s, toks, KN, NULL, NULL), KVE_EINVAL);
    p.method = KVE_PREFILL_SNAPKV;
    ASSERT_STATUS(lm_prefill_kvzip(s, toks, KN, &kz, &p), KVE_EINVAL);
    kz.chunk = 0;
    ASSERT_STATUS(lm_prefill_kvzip(s, toks, KN, &kz, NULL), KVE_EINVAL);
    kz.chunk = 7;
    kz.newline = V_;
    ASSERT_STATUS(lm_prefill_kvzip(s, toks, KN, &kz, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "prompt token 40");
    kz.newline = 10;
    p.method = KVE_PREFILL_KVZIP;
    p.sinks = 9; /* not below the budget */
    ASSERT_STATUS(lm_prefill_kvzip(s, toks, KN, &kz, &p), KVE_EINVAL);
    ASSERT_EQ(s->pos, 0);
    ASSERT_OK(lm_prefill_kvzip(s, toks, KN, &kz, NULL));
    lm_state_free(s);
    lm_state_free(f);
    /* Out of memory for the scores: nothing changed, and then it works. */
    talloc ta;
    talloc_init(&ta);
    opt.allocator = &ta.a;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    for (size_t j = 0; j < 2; j++) { /* the saved logits, then the scores */
        talloc_fail_after(&ta, j);
        kve_status st = lm_prefill_kvzip(s, toks, KN, &kz, NULL);
        talloc_fail_after(&ta, SIZE_MAX);
        ASSERT_STATUS(st, KVE_ENOMEM);
        ASSERT_EQ(s->pos, 0);
    }
    ASSERT_OK(lm_prefill_kvzip(s, toks, KN, &kz, NULL));
    ASSERT_EQ(s->pos, KN);
    lm_state_free(s);
    talloc_check_empty(&ta);
    /* The default prompts: kvpress's texts in the fixture tokenizer, each
     * as lm_encode gives it; "\n" by its byte token when no piece has it. */
    lm_tokenizer *tok = fixture_tokenizer();
    ASSERT_TRUE(tok != NULL);
    lm_kvzip d;
    ASSERT_OK(lm_kvzip_default(tok, &d));
    ASSERT_EQ(d.chunk, 2048);
    ASSERT_EQ(d.overlap, 8);
    int32_t want[LM_KVZIP_PROMPT_MAX];
    size_t nw;
    static const char first[] = "\n\nRepeat the previous context exactly.\n";
    ASSERT_OK(lm_encode(tok, first, sizeof first - 1, want, LM_KVZIP_PROMPT_MAX, &nw));
    ASSERT_EQ(d.n_first, nw);
    ASSERT_TRUE(memcmp(d.first, want, nw * sizeof *want) == 0);
    ASSERT_EQ(d.newline, d.first[d.n_first - 1]); /* the first prompt ends in "\n" */
    ASSERT_TRUE(d.n_later > d.n_first);
    ASSERT_STATUS(lm_kvzip_default(NULL, &d), KVE_EINVAL);
    ASSERT_STATUS(lm_kvzip_default(tok, NULL), KVE_EINVAL);
    lm_tokenizer_free(tok);
    tiny_close(&k);
}

static void test_head_budgets(void)
{
    static const char good[] = "# c\nkvevict-heads 1\nlayers 2 kv_heads 2\n\n"
                               "head 1 1 streaming -0.5\nhead 0 1 retrieval 1\n"
                               "head 0 0 streaming 0\nhead 1 0 streaming 2.5e-1";
    lm_heads *h = NULL;
    ASSERT_OK(lm_heads_parse(good, sizeof good - 1, NULL, &h));
    ASSERT_EQ(h->layers, 2);
    ASSERT_EQ(h->kv_heads, 2);
    static const unsigned char roles[] = {0, 1, 0, 0};
    static const double scores[] = {0, 1, 0.25, -0.5};
    for (size_t i = 0; i < 4; i++) {
        ASSERT_EQ(h->retrieval[i], roles[i]);
        ASSERT_TRUE(h->score[i] == scores[i]);
    }
    static const struct {
        const char *text, *error;
    } bad[] = {
        {"", "no \"kvevict-heads 1\" line"},
        {"kvevict-heads 2\n", "line 1: expected \"kvevict-heads 1\""},
        {"kvevict-heads 1\nlayers 0 kv_heads 2\n", "line 2: expected \"layers L kv_heads G\""},
        {"kvevict-heads 1\nlayers 1 kv_heads 2\nhead 0 0 streaming 0\n",
         "layer 0 KV head 1 is not given (1 of 2 heads)"},
        {"kvevict-heads 1\nlayers 1 kv_heads 1\nhead 0 0 streaming 0\nhead 0 0 retrieval 1\n",
         "line 4: layer 0 KV head 0 given twice"},
        {"kvevict-heads 1\nlayers 1 kv_heads 1\nhead 1 0 streaming 0\n", "line 3: layer '1'"},
        {"kvevict-heads 1\nlayers 1 kv_heads 1\nhead 0 00 streaming 0\n", "KV head '00'"},
        {"kvevict-heads 1\nlayers 1 kv_heads 1\nhead 0 0 sink 0\n", "role 'sink'"},
        {"kvevict-heads 1\nlayers 1 kv_heads 1\nhead 0 0 streaming inf\n", "score 'inf'"},
        {"kvevict-heads 1\nlayers 1 kv_heads 1\nhead 0 0 streaming\n", "expected \"head LAYER"},
        {"kvevict-heads 1\r\n", "carriage return"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lm_heads *g = (lm_heads *)&g;
        ASSERT_STATUS(lm_heads_parse(bad[i].text, strlen(bad[i].text), NULL, &g), KVE_EFORMAT);
        ASSERT_CONTAINS(kve_last_error(), bad[i].error);
        ASSERT_TRUE(g == (lm_heads *)&g);
    }
    /* Budgets at the memory of a uniform budget: the committed model's shape
     * (4 layers of 2 KV heads, context 512) with one retrieval head. */
    static const char one[] = "kvevict-heads 1\nlayers 4 kv_heads 2\nhead 0 0 streaming 0\n"
                              "head 0 1 retrieval 1\nhead 1 0 streaming 0\nhead 1 1 streaming 0\n"
                              "head 2 0 streaming 0\nhead 2 1 streaming 0\nhead 3 0 streaming 0\n"
                              "head 3 1 streaming 0\n";
    lm_heads *d = NULL;
    ASSERT_OK(lm_heads_parse(one, sizeof one - 1, NULL, &d));
    lm_config c = {.n_layers = 4, .n_kv_heads = 2};
    size_t out[8];
    static const size_t cases[][3] = {{256, 512, 219}, {102, 512, 43}, {51, 296, 16}};
    for (size_t i = 0; i < 3; i++) {
        ASSERT_OK(lm_heads_budgets(d, &c, cases[i][0], 16, 512, out));
        for (size_t j = 0; j < 8; j++)
            ASSERT_EQ(out[j], j == 1 ? cases[i][1] : cases[i][2]);
    }
    ASSERT_STATUS(lm_heads_budgets(d, &c, 8, 16, 512, out), KVE_EINVAL);
    c.n_layers = 2;
    ASSERT_STATUS(lm_heads_budgets(d, &c, 64, 16, 512, out), KVE_EINVAL);
    lm_heads_free(d);
    lm_heads_free(NULL);

    /* The decoder with per-head budgets: each streaming head keeps its sinks
     * and the newest budget - sinks positions of its own budget. */
    tiny k;
    lm_model *m = tiny_open(&k, 0, 0, check_seed + 41);
    ASSERT_TRUE(m != NULL);
    c = m->config;
    ASSERT_OK(lm_heads_budgets(h, &c, 5, 3, 30, out)); /* 4 heads, retrieval (0, 1) */
    ASSERT_EQ(out[1], 11);
    ASSERT_EQ(out[0], 3);
    lm_options opt = {.policy = "streaming:budget=5,sinks=2", .head_budgets = out};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    for (size_t t = 0; t < 16; t++) {
        ASSERT_OK(lm_forward(s, token_at(t)));
        for (size_t i = 0; i < L_ * G_; i++) {
            size_t n = t + 1 < out[i] ? t + 1 : out[i];
            ASSERT_EQ(s->cache[i].n, n);
            for (size_t j = 0; j < n; j++) /* sinks 0, 1, then the newest */
                ASSERT_EQ(s->cache[i].pos[j], j < 2 || n < out[i] ? (int32_t)j
                                                                   : (int32_t)(t + 1 - n + j));
        }
    }
    lm_state_free(s);
    size_t low[4] = {5, 5, 2, 5}; /* below streaming's smallest budget (sinks + 1) */
    opt.head_budgets = low;
    ASSERT_STATUS(lm_state_new(m, &opt, &s), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 2 (layer 1, KV head 0): budget 2");
    opt.head_budgets = out;
    opt.share_heads = 1;
    ASSERT_STATUS(lm_state_new(m, &opt, &s), KVE_EINVAL);
    lm_options none = {.head_budgets = out};
    ASSERT_STATUS(lm_state_new(m, &none, &s), KVE_EINVAL);
    lm_heads_free(h);
    tiny_close(&k);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    if (tmpdir_make("kve-lm") != 0)
        return 1;
    RUN(test_loader_order);
    RUN(test_header_fields);
    RUN(test_truncated_everywhere);
    RUN(test_open_errors);
    RUN(test_full_cache_reference);
    RUN(test_full_identity);
    RUN(test_window_and_streaming);
    RUN(test_h2o_against_reference);
    RUN(test_key_policies_against_reference);
    RUN(test_data_policies_against_reference);
    RUN(test_prefill);
    RUN(test_kvzip);
    RUN(test_prefill_values);
    RUN(test_kvzip_plus_and_budgets);
    RUN(test_head_budgets);
    RUN(test_budgets_against_reference);
    RUN(test_layer_spread);
    RUN(test_reset_and_seeds);
    RUN(test_refusals);
    RUN(test_window_nats);
    RUN(test_tokenizer_encode);
    RUN(test_tokenizer_decode);
    RUN(test_tokenizer_malformed);
    RUN(test_alloc_failures);
    RUN(test_forward_out_of_memory);
    remove_dir();
    return CHECK_DONE();
}
