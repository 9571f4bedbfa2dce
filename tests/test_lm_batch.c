/* SPDX-License-Identifier: MIT */
/*
 * test_lm_batch.c - prompts decoded in blocks (lm_forward_batch, lm/decode.c)
 * against token-by-token decoding, bit for bit.
 *
 * The same decoder options run twice: with batch 1 (lm_forward, one token
 * at a time: the definition) and with blocks of 3, 64 and (but for the
 * types' runs) 7 tokens (sizes that do not divide the 21 tokens, and one
 * that holds them all). Compared
 * bit for bit: the logits after every token (as lm_forward_batch hands them
 * out), the position, every (layer, KV head) cache's kept positions, keys
 * and values, and the logits of five more steps decoded one at a time
 * afterwards (so the policies' own state, which the caches do not show,
 * must agree too). Over:
 * - every weight type the decoder reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 *   Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS: a fixture
 *   model's matrices replaced by random blocks of the type, lm_random.h;
 *   and llama2.c version 2's int8 groups), with --products exact and llama
 *   in each of llama.cpp's CPU variants (AVX2, AVX512, AVX512_BF16: their
 *   own orders, tiles and fallbacks), Q4_K also from its packed copy
 *   (lm_model_pack, as the CLI reads it under llama), 1 and 2 threads, no
 *   policy and an evicting h2o;
 * - on two types (Q4_K, F16) and both products (llama in the variant
 *   llama.cpp loads here): policies that read keys
 *   (knorm), queries and values (expected_attention, tova with vnorm), draw
 *   random numbers (random), window under cache positions, per-head
 *   budgets, share_heads, same_positions, each prefill (the policy's own
 *   scores, h2o's and snapkv's rows, KVzip and KVzip+ with its
 *   reconstruction in blocks);
 * - the refusals: tokens outside the vocabulary (nothing decoded), a
 *   broken decoder, NULL arguments; the same logits through the callback
 *   as lm_forward's; out-of-memory before a block leaves the state as it
 *   was, and the retried call goes on bit for bit.
 * Random data from the seed printed (replay with the seed as argument).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "lm.h"
#include "lm_check.h"
#include "lm_fixture.h"
#include "lm_random.h"
#include "test_allocator.h"

/* 2 layers, 4 query heads over 2 KV heads of 64 (rows of 256: the K types'
 * blocks), hidden 512, vocabulary 300 (the classifier's rows not a multiple
 * of 8), context 32. */
enum { D_ = 256, F_ = 512, L_ = 2, H_ = 4, G_ = 2, V_ = 300, T_ = 32, N_ = 21, MORE = 5 };

static uint64_t rng_state;

/* A model whose every matrix is random blocks of `type` (LM_I8G: the
 * fixture's weights as llama2.c version 2, groups of 64). */
typedef struct typed {
    fx_model fx;
    unsigned char *img;
    lm_model *m;
    unsigned char *blocks[2 + 7 * L_];
    size_t n_blocks;
} typed;

static lm_model *typed_open(typed *t, lm_dtype type)
{
    memset(t, 0, sizeof *t);
    fx_model_init(&t->fx, D_, F_, L_, H_, G_, V_, T_, 0, check_seed + 17);
    size_t n;
    t->img = type == LM_I8G ? fx_image_v2(&t->fx, 64, &n) : fx_image(&t->fx, 1, &n);
    if (lm_model_from_memory(t->img, n, NULL, &t->m) != KVE_OK) {
        fprintf(stderr, "typed_open: %s\n", kve_last_error());
        return NULL;
    }
    if (type == LM_I8G || type == LM_F32)
        return t->m;
    lm_weights *w = &t->m->weights;
    lm_matrix *all[2 + 7 * L_];
    size_t k = 0;
    all[k++] = &w->token_embedding;
    all[k++] = &w->wcls;
    for (size_t l = 0; l < L_; l++) {
        lm_layer *ly = &w->layer[l];
        lm_matrix *m7[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->w3};
        for (size_t i = 0; i < 7; i++)
            all[k++] = m7[i];
    }
    for (size_t i = 0; i < k; i++) {
        unsigned char *scales;
        *all[i] = lr_matrix(&rng_state, type, all[i]->rows, all[i]->cols, 0, 5,
                            &t->blocks[t->n_blocks++], &scales);
    }
    return t->m;
}

static void typed_close(typed *t)
{
    lm_model_free(t->m);
    free(t->img);
    for (size_t i = 0; i < t->n_blocks; i++)
        free(t->blocks[i]);
    fx_model_free(&t->fx);
}

static int32_t token_at(size_t i)
{
    return (int32_t)(i == 0 ? LM_BOS : (i * 37 + 11) % V_);
}

/* How a run starts: a prefill of the first P tokens (or none), then
 * lm_forward_batch over the rest. */
typedef enum start { PLAIN, PF_OWN, PF_H2O, PF_SNAPKV, PF_KVZIP, PF_KVZIP_PLUS } start;
enum { P_ = 13 };

/* What a run leaves: every logit it handed out, then the caches. */
typedef struct outcome {
    float logits[(N_ + MORE) * V_];
    size_t seen; /* logits rows received */
    int32_t pos;
    size_t kept[L_ * G_];
    int32_t kpos[L_ * G_][N_ + 8];
    float key[L_ * G_][(N_ + 8) * (D_ / H_)], value[L_ * G_][(N_ + 8) * (D_ / H_)];
    kve_status st;
} outcome;

static void on_logits(void *user, size_t i, const float *logits)
{
    outcome *o = user;
    if (o->seen != i) /* out of order: poison */
        o->st = KVE_EINVAL;
    memcpy(o->logits + o->seen * V_, logits, V_ * sizeof(float));
    o->seen++;
}

static void run(const lm_model *m, lm_options opt, start how, outcome *o)
{
    memset(o, 0, sizeof *o);
    int32_t toks[N_];
    for (size_t i = 0; i < N_; i++)
        toks[i] = token_at(i);
    lm_state *s = NULL;
    if ((o->st = lm_state_new(m, &opt, &s)) != KVE_OK)
        return;
    size_t first = 0;
    if (how != PLAIN) {
        kve_prefill_options p = kve_prefill_default_options();
        p.method = how == PF_SNAPKV ? KVE_PREFILL_SNAPKV : KVE_PREFILL_H2O;
        p.window = 4;
        lm_kvzip kz = {.first = {5, 6, 7}, .n_first = 3, .later = {8, 9}, .n_later = 2,
                       .newline = 10, .chunk = 5, .overlap = 2, .plus = how == PF_KVZIP_PLUS};
        o->st = how == PF_KVZIP || how == PF_KVZIP_PLUS ? lm_prefill_kvzip(s, toks, P_, &kz, NULL)
                : lm_prefill(s, toks, P_, how == PF_OWN ? NULL : &p);
        first = P_;
        for (size_t i = 0; i < P_; i++) /* the prefill hands out the last logits only */
            on_logits(o, o->seen, s->logits);
    }
    if (o->st == KVE_OK)
        o->st = lm_forward_batch(s, toks + first, N_ - first, on_logits, o);
    o->seen = N_; /* the same rows whatever the callback saw */
    for (size_t i = 0; o->st == KVE_OK && i < MORE; i++)
        if ((o->st = lm_forward(s, token_at(N_ + i))) == KVE_OK)
            memcpy(o->logits + (N_ + i) * V_, s->logits, V_ * sizeof(float));
    o->pos = s->pos;
    const size_t S = D_ / H_;
    for (size_t i = 0; o->st == KVE_OK && i < L_ * G_; i++) {
        const lm_cache *k = &s->cache[i];
        o->kept[i] = k->n;
        if (k->n > N_ + 8) {
            o->st = KVE_ERANGE;
            break;
        }
        memcpy(o->kpos[i], k->pos, k->n * sizeof(int32_t));
        memcpy(o->key[i], k->key, k->n * S * sizeof(float));
        memcpy(o->value[i], k->value, k->n * S * sizeof(float));
    }
    lm_state_free(s);
}

static size_t compared;

/* opt decoded token by token and in blocks of 3, 64 and (all) 7: the same
 * bits. */
static void same_runs(const lm_model *m, lm_options opt, start how, int all, const char *what)
{
    static outcome want, got;
    opt.batch = 1;
    run(m, opt, how, &want);
    if (want.st != KVE_OK)
        CHECK_FAIL_AT("%s: token by token: %s (%s)", what, kve_status_name(want.st),
                      kve_last_error());
    static const size_t sizes[] = {3, 64, 7};
    for (size_t b = 0; b < (all ? 3u : 2u); b++) {
        opt.batch = sizes[b];
        run(m, opt, how, &got);
        if (got.st != KVE_OK)
            CHECK_FAIL_AT("%s, blocks of %zu: %s (%s)", what, sizes[b], kve_status_name(got.st),
                          kve_last_error());
        for (size_t t = 0; t < N_ + MORE; t++)
            if (memcmp(got.logits + t * V_, want.logits + t * V_, V_ * sizeof(float)) != 0)
                CHECK_FAIL_AT("%s, blocks of %zu: the logits after token %zu differ", what,
                              sizes[b], t);
        if (got.pos != want.pos || memcmp(got.kept, want.kept, sizeof got.kept) != 0)
            CHECK_FAIL_AT("%s, blocks of %zu: position %d or kept counts differ", what, sizes[b],
                          got.pos);
        for (size_t i = 0; i < L_ * G_; i++)
            if (memcmp(got.kpos[i], want.kpos[i], want.kept[i] * sizeof(int32_t)) != 0 ||
                memcmp(got.key[i], want.key[i], want.kept[i] * (D_ / H_) * sizeof(float)) != 0 ||
                memcmp(got.value[i], want.value[i], want.kept[i] * (D_ / H_) * sizeof(float)))
                CHECK_FAIL_AT("%s, blocks of %zu: cache %zu differs", what, sizes[b], i);
        compared++;
    }
}

static const lm_dtype all_types[] = {LM_F32,  LM_F16,  LM_BF16, LM_Q8_0, LM_Q4_0,
                                     LM_Q4_1, LM_Q5_0, LM_Q5_1, LM_Q2_K, LM_Q3_K,
                                     LM_Q4_K, LM_Q5_K, LM_Q6_K, LM_IQ4_NL, LM_IQ4_XS, LM_I8G};

/* Every type, the exact products and llama.cpp's in every variant, 1 and
 * 2 threads: the full cache and h2o; Q4_K again from its packed copy. The
 * light grid (check_light) takes one (products, threads, cache) a model,
 * turning, so that every products variant meets both thread counts and
 * each variant both caches. */
static void test_types(void)
{
    const int light = check_light();
    size_t c = 0; /* models so far */
    if (light)
        printf("  light grid (KVE_TEST_LIGHT): one of the %d (products, threads, cache) of each "
               "type\n", LM_LLAMA_CPU_COUNT * 4);
    for (size_t k = 0; k < sizeof all_types / sizeof all_types[0]; k++)
        for (int pack = 0; pack < 2; pack++) {
            if (pack && all_types[k] != LM_Q4_K)
                continue;
            const size_t turn = c++;
            typed t;
            lm_model *m = typed_open(&t, all_types[k]);
            ASSERT_TRUE(m != NULL);
            if (pack) {
                ASSERT_OK(lm_model_pack(m));
                if (!m->packed) /* no kernel here reads a packed copy */
                    printf("  no packed copy on this machine: %s\n",
                           lm_isa_name(lm_isa_active()));
            }
            /* mode 0: exact; 1 .. 3: llama in variant `mode` */
            for (int mode = 0; mode < LM_LLAMA_CPU_COUNT; mode++)
                for (size_t th = 1; th <= 2; th++) {
                    const size_t cache = (turn / 2 / LM_LLAMA_CPU_COUNT + turn) % 2;
                    if (light && (mode != (int)(turn % LM_LLAMA_CPU_COUNT) ||
                                  th != 1 + turn / LM_LLAMA_CPU_COUNT % 2))
                        continue;
                    char what[128];
                    const char *pr = mode ? lm_llama_cpu_name((lm_llama_cpu)mode) : "exact";
                    lm_options o = {.products = mode ? LM_PRODUCTS_LLAMA : LM_PRODUCTS_EXACT,
                                    .llama_cpu = (lm_llama_cpu)mode, .threads = th};
                    snprintf(what, sizeof what, "%s%s, products %s, %zu threads, full cache",
                             lm_dtype_name(all_types[k]), pack ? " packed" : "", pr, th);
                    if (!light || cache == 0)
                        same_runs(m, o, PLAIN, 0, what);
                    if (light && cache == 0)
                        continue;
                    o.policy = "h2o:budget=8,recent_window=2";
                    snprintf(what, sizeof what, "%s%s, products %s, %zu threads, h2o",
                             lm_dtype_name(all_types[k]), pack ? " packed" : "", pr, th);
                    same_runs(m, o, PLAIN, 0, what);
                }
            typed_close(&t);
        }
}

/* Policies, positions, budgets and prefills on two types; the light grid
 * (check_light) takes each case once, on one type and one products, the
 * two turning with the case (so each type meets both products). */
static void test_policies(void)
{
    const int light = check_light();
    if (light)
        printf("  light grid (KVE_TEST_LIGHT): each case on one (type, products)\n");
    static const lm_dtype types[] = {LM_Q4_K, LM_F16};
    static const size_t head_budgets[L_ * G_] = {6, 9, 7, 8};
    static const struct {
        const char *policy;
        int cache_positions, share, same, heads;
        start how;
    } cases[] = {
        {"knorm:budget=7,recent_window=2", 0, 0, 0, 0, PLAIN},
        {"expected_attention:budget=6,n_sink=1", 0, 0, 0, 0, PLAIN},
        {"tova:budget=9,vnorm=1", 0, 0, 0, 0, PLAIN},
        {"random:budget=6", 0, 0, 0, 0, PLAIN},
        {"window:budget=5", 1, 0, 0, 0, PLAIN},
        {"h2o:budget=6,recent_window=1", 1, 0, 0, 0, PLAIN},
        {"h2o:budget=6,recent_window=1", 0, 0, 0, 1, PLAIN},
        {"h2o:budget=6,recent_window=1", 0, 1, 0, 0, PLAIN},
        {"h2o:budget=6,recent_window=1", 0, 0, 1, 0, PLAIN},
        {"h2o:budget=30,recent_window=1", 0, 0, 1, 0, PLAIN},
        {"knorm:budget=6", 0, 0, 0, 0, PF_OWN},
        {"knorm:budget=6", 0, 0, 1, 0, PF_OWN},
        {"h2o:budget=6,recent_window=1", 0, 0, 0, 0, PF_H2O},
        {"h2o:budget=6,recent_window=1", 0, 1, 0, 0, PF_SNAPKV},
        {"h2o:budget=6,recent_window=1", 0, 0, 1, 0, PF_SNAPKV},
        {"tova:budget=9,vnorm=1", 0, 0, 0, 0, PF_SNAPKV},
        {"h2o:budget=6,recent_window=1", 0, 0, 0, 0, PF_KVZIP},
        {"h2o:budget=6,recent_window=1", 0, 0, 0, 0, PF_KVZIP_PLUS},
    };
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        typed t;
        lm_model *m = typed_open(&t, types[k]);
        ASSERT_TRUE(m != NULL);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int pr = 0; pr < 2; pr++) {
                if (light && (k != c % 2 || (size_t)pr != c / 2 % 2))
                    continue;
                lm_options o = {.products = (lm_products)pr, .threads = 2,
                                .policy = cases[c].policy, .seed = 7,
                                .positions = cases[c].cache_positions ? LM_POS_CACHE
                                                                      : LM_POS_ORIGINAL,
                                .share_heads = cases[c].share, .same_positions = cases[c].same,
                                .head_budgets = cases[c].heads ? head_budgets : NULL};
                char what[160];
                snprintf(what, sizeof what, "%s, products %s, %s%s%s%s%s, start %d",
                         lm_dtype_name(types[k]), pr ? "llama" : "exact", cases[c].policy,
                         cases[c].cache_positions ? ", cache positions" : "",
                         cases[c].share ? ", shared heads" : "",
                         cases[c].same ? ", same positions" : "",
                         cases[c].heads ? ", head budgets" : "", (int)cases[c].how);
                same_runs(m, o, cases[c].how, 1, what);
            }
        typed_close(&t);
    }
    printf("  %zu runs in blocks equal to token by token\n", compared);
}

static void on_count(void *user, size_t i, const float *logits)
{
    (void)logits;
    size_t *n = user;
    *n = i + 1;
}

/* Refusals change nothing; out of memory before a block leaves the state
 * as it was, and the retry goes on bit for bit. */
static void test_refusals(void)
{
    typed t;
    lm_model *m = typed_open(&t, LM_Q8_0);
    ASSERT_TRUE(m != NULL);
    lm_options o = {.batch = 4};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &o, &s));
    int32_t toks[N_];
    for (size_t i = 0; i < N_; i++)
        toks[i] = token_at(i);
    ASSERT_STATUS(lm_forward_batch(NULL, toks, 3, NULL, NULL), KVE_EINVAL);
    ASSERT_STATUS(lm_forward_batch(s, NULL, 3, NULL, NULL), KVE_EINVAL);
    toks[5] = V_;
    size_t seen = 0;
    ASSERT_STATUS(lm_forward_batch(s, toks, N_, on_count, &seen), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "at 5");
    ASSERT_EQ(s->pos, 0);
    ASSERT_EQ(seen, 0);
    toks[5] = -1;
    ASSERT_STATUS(lm_forward_batch(s, toks, N_, on_count, &seen), KVE_EINVAL);
    toks[5] = token_at(5);
    ASSERT_OK(lm_forward_batch(s, toks, 0, on_count, &seen));
    ASSERT_EQ(seen, 0);
    ASSERT_OK(lm_forward_batch(s, toks, 10, on_count, &seen));
    ASSERT_EQ(seen, 10);
    ASSERT_EQ(s->pos, 10);
    s->pos = INT32_MAX - 3; /* three positions left: four tokens pass the last */
    ASSERT_STATUS(lm_forward_batch(s, toks, 4, NULL, NULL), KVE_EINVAL);
    ASSERT_EQ(s->pos, INT32_MAX - 3);
    s->broken = 1;
    ASSERT_STATUS(lm_forward_batch(s, toks, 1, NULL, NULL), KVE_EINVAL);
    lm_state_free(s);

    /* The k-th allocation of a block fails: refused, nothing changed, and
     * the same call then decodes as a run that never failed. */
    float *want = malloc((size_t)V_ * sizeof *want);
    o.policy = "h2o:budget=6,recent_window=1";
    o.batch = 5;
    ASSERT_OK(lm_state_new(m, &o, &s));
    ASSERT_OK(lm_forward_batch(s, toks, N_, NULL, NULL));
    memcpy(want, s->logits, (size_t)V_ * sizeof *want);
    lm_state_free(s);
    size_t refusals = 0;
    for (size_t k = 0; k < 400; k++) {
        talloc ta;
        talloc_init(&ta);
        o.allocator = &ta.a;
        ASSERT_OK(lm_state_new(m, &o, &s));
        ASSERT_OK(lm_forward_batch(s, toks, 2, NULL, NULL)); /* one block in */
        talloc_fail_after(&ta, k);
        kve_status st = lm_forward_batch(s, toks + 2, N_ - 2, NULL, NULL);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK) {
            ASSERT_TRUE(memcmp(s->logits, want, (size_t)V_ * sizeof *want) == 0);
            lm_state_free(s);
            talloc_check_empty(&ta);
            break;
        }
        refusals++;
        ASSERT_EQ((int)st, (int)KVE_ENOMEM);
        ASSERT_TRUE(!s->broken);
        int32_t at = s->pos; /* the blocks before the failure are decoded */
        ASSERT_TRUE(at >= 2 && (at - 2) % 5 == 0);
        ASSERT_OK(lm_forward_batch(s, toks + at, N_ - (size_t)at, NULL, NULL));
        ASSERT_TRUE(memcmp(s->logits, want, (size_t)V_ * sizeof *want) == 0);
        lm_state_free(s);
        talloc_check_empty(&ta);
    }
    printf("  %zu allocation failures refused and retried\n", refusals);
    ASSERT_TRUE(refusals > 0);
    free(want);
    typed_close(&t);
}

/* Finite queries and keys whose dot products overflow: the same refusal
 * (KVE_ERANGE, the first attention weight NaN, the decoder broken) token by
 * token and in blocks, in both products, with and without a policy (under
 * llama.cpp's products without one no softmax row is computed: the verdict
 * comes from the scores). */
static void test_overflow(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 0, check_seed + 5);
    for (size_t i = 0; i < (size_t)L_ * D_ * D_; i++)
        fx.wq[i] *= 4e18f;
    for (size_t i = 0; i < (size_t)L_ * G_ * (D_ / H_) * D_; i++)
        fx.wk[i] *= 4e18f;
    size_t n;
    unsigned char *img = fx_image(&fx, 1, &n);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    int32_t toks[N_];
    for (size_t i = 0; i < N_; i++)
        toks[i] = token_at(i);
    char first[512] = "";
    for (int pr = 0; pr < 2; pr++)
        for (int pol = 0; pol < 2; pol++)
            for (size_t b = 1; b <= 8; b += 7) {
                lm_options o = {.products = (lm_products)pr, .batch = b,
                                .policy = pol ? "h2o:budget=6,recent_window=1" : NULL};
                lm_state *s = NULL;
                ASSERT_OK(lm_state_new(m, &o, &s));
                ASSERT_STATUS(lm_forward_batch(s, toks, N_, NULL, NULL), KVE_ERANGE);
                ASSERT_CONTAINS(kve_last_error(), ": attention weight 0 of query head ");
                ASSERT_CONTAINS(kve_last_error(), " is NaN (q.k overflowed)");
                if (b == 1)
                    snprintf(first, sizeof first, "%s", kve_last_error());
                else
                    ASSERT_STR_EQ(kve_last_error(), first);
                ASSERT_TRUE(s->broken);
                ASSERT_STATUS(lm_forward_batch(s, toks, 1, NULL, NULL), KVE_EINVAL);
                lm_state_free(s);
            }
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
}

/* Attention split over threads (a layer's KV heads, once its (key, query
 * head) pairs reach 1024: 300 tokens here) gives one thread's bits: the
 * logits of every token and the caches, token by token and in blocks, the
 * exact products and llama.cpp's in every variant (flash attention's
 * scores in its lanes), both position modes (each thread its own
 * scratch). */
static void test_attention_threads(void)
{
    enum { NT = 300 };
    typed t;
    lm_model *m = typed_open(&t, LM_F16);
    ASSERT_TRUE(m != NULL);
    int32_t *toks = malloc(NT * sizeof *toks);
    for (size_t i = 0; i < NT; i++)
        toks[i] = token_at(i);
    float *want = malloc((size_t)NT * V_ * sizeof *want), *got = malloc((size_t)NT * V_ * sizeof *got);
    /* light grid: the exact products with original positions, llama.cpp's
     * AVX2 variant with cache positions and h2o (the AVX-512 variants run
     * the same code with 16 lanes and their exp; test_types takes every
     * variant, on fewer tokens) */
    const int light = check_light();
    if (light)
        printf("  light grid (KVE_TEST_LIGHT): exact, original; llama avx2, cache\n");
    for (int pr = 0; pr < LM_LLAMA_CPU_COUNT; pr++) /* 0: exact; else llama's variant pr */
        for (int cache = 0; cache < 2; cache++) {
            if (light && (pr > LM_LLAMA_CPU_AVX2 || cache != pr))
                continue;
            lm_options o = {.products = pr ? LM_PRODUCTS_LLAMA : LM_PRODUCTS_EXACT,
                            .llama_cpu = (lm_llama_cpu)pr,
                            .positions = cache ? LM_POS_CACHE : LM_POS_ORIGINAL,
                            .policy = cache ? "h2o:budget=290,recent_window=4" : NULL};
            for (int v = 0; v < 3; v++) { /* 1 thread one by one; 2 threads one by one, blocks */
                o.threads = v ? 2 : 1;
                o.batch = v == 2 ? 0 : 1;
                outcome *oc = calloc(1, sizeof *oc);
                lm_state *s = NULL;
                ASSERT_OK(lm_state_new(m, &o, &s));
                oc->seen = 0;
                float *dst = v ? got : want;
                for (size_t i = 0; i < NT; i += N_) { /* N_ rows at a time through on_logits */
                    const size_t k = NT - i < N_ ? NT - i : N_;
                    oc->seen = 0;
                    ASSERT_OK(lm_forward_batch(s, toks + i, k, on_logits, oc));
                    memcpy(dst + i * V_, oc->logits, k * V_ * sizeof(float));
                }
                int same = 1;
                if (v)
                    same = memcmp(got, want, (size_t)NT * V_ * sizeof *got) == 0;
                lm_state_free(s);
                free(oc);
                if (!same)
                    CHECK_FAIL_AT("products %d, %s positions, variant %d: the logits differ from "
                                  "one thread's", pr, cache ? "cache" : "original", v);
            }
        }
    free(want), free(got), free(toks);
    typed_close(&t);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    rng_state = check_seed;
    RUN(test_types);
    RUN(test_policies);
    RUN(test_refusals);
    RUN(test_overflow);
    RUN(test_attention_threads);
    return CHECK_DONE();
}
