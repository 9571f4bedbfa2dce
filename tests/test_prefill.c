/* SPDX-License-Identifier: MIT */
/*
 * test_prefill.c - prefill compression (kvevict.h, "Prefill compression")
 * against a naive computation written here: the column sums of the rows
 * (each group reduced by a plain loop), the pooling by its definition, and
 * the kept set by SORTING the candidates by (score descending, position
 * ascending) and taking the first budget - protect, plus the protected
 * newest. Then the state a prefill leaves: h2o continues from the column
 * sums exactly as tests/reference.h's h2o does when its scores are set to
 * them; every refusal, leaving every head empty and a later prefill
 * unchanged; allocation failure. Deterministic per seed (printed; argv[1]).
 */
#include "check.h"
#include "internal.h"
#include "kvevict.h"
#include "reference.h"
#include "test_allocator.h"

#include <float.h>

/* The default options with another method. */
static kve_prefill_options prefill_method(kve_prefill_method m)
{
    kve_prefill_options o = kve_prefill_default_options();
    o.method = m;
    return o;
}

enum { MAXN = 300, MAXG = 3, MAXH = 3 };

static float rows[MAXH * MAXG * MAXN * MAXN];
static double naive_col[MAXN], naive_score[MAXN], lib_score[MAXN];

/* Rows of `heads` KV heads of `group` query heads, r rows each over keys
 * 0 .. t, ld = n + pad (the entries past t hold NaN: never read). Weights
 * are random with ties (a small pool) and zeros; each row sums to about 1. */
static void make_rows(kve_rng *g, size_t heads, size_t group, size_t n, size_t r, size_t ld)
{
    float pool[4];
    for (int k = 0; k < 4; k++)
        pool[k] = (float)kve_rng_uniform(g) / 8.0f;
    for (size_t q = 0; q < heads * group; q++)
        for (size_t j = 0; j < r; j++) {
            size_t t = n - r + j;
            float *row = rows + (q * r + j) * ld;
            for (size_t i = 0; i < ld; i++) {
                uint64_t k = kve_rng_below(g, 8);
                row[i] = i > t ? NAN
                         : k == 0 ? 0.0f
                         : k < 4  ? pool[k]
                                  : (float)(kve_rng_uniform(g) * 2.0 / (double)(t + 1));
            }
        }
}

/* The method's definition, one KV head (rows at `q`): col and score. */
static void naive(const kve_prefill_options *p, size_t n, const float *q, size_t ld,
                  size_t group, kve_reduce reduce)
{
    size_t r = p->method == KVE_PREFILL_SNAPKV && p->window < n ? p->window : n;
    for (size_t i = 0; i < n; i++) {
        naive_col[i] = 0;
        for (size_t j = 0; j < r; j++) {
            size_t t = n - r + j;
            if (i > t)
                continue;
            double sum = 0;
            float best = q[j * ld + i];
            for (size_t h = 0; h < group; h++) {
                float a = q[(h * r + j) * ld + i];
                sum += (double)a;
                if (a > best)
                    best = a;
            }
            float red = reduce == KVE_REDUCE_MAX    ? best
                        : reduce == KVE_REDUCE_SUM ? (float)sum
                                                   : (float)(sum / (double)group);
            naive_col[i] += (double)red;
        }
    }
    size_t m = n - r;
    for (size_t i = 0; i < n; i++) {
        if (p->method == KVE_PREFILL_H2O || i >= m) {
            naive_score[i] = naive_col[i];
            continue;
        }
        double mx = -1, sum = 0;
        for (long d = -(long)(p->kernel / 2); d <= (long)(p->kernel / 2); d++) {
            long k = (long)i + d;
            if (k < 0 || k >= (long)m)
                continue; /* outside: nothing for max, 0 for the average */
            mx = naive_col[k] > mx ? naive_col[k] : mx;
            sum += naive_col[k];
        }
        naive_score[i] = p->pool == KVE_POOL_MAX ? mx : sum / (double)p->kernel;
    }
}

typedef struct cand {
    double s;
    int32_t pos;
} cand;

static int by_score_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->s != y->s)
        return x->s > y->s ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* The kept set by sorting: the newest `protect`, and of the rest the
 * budget - protect of highest score. kept[] ascending; returns its size. */
static size_t naive_keep(size_t n, size_t budget, size_t protect, int32_t *kept)
{
    static cand c[MAXN];
    static unsigned char keep[MAXN];
    if (n <= budget) {
        for (size_t i = 0; i < n; i++)
            kept[i] = (int32_t)i;
        return n;
    }
    memset(keep, 0, n);
    for (size_t i = n - protect; i < n; i++)
        keep[i] = 1;
    for (size_t i = 0; i < n - protect; i++)
        c[i] = (cand){naive_score[i], (int32_t)i};
    qsort(c, n - protect, sizeof *c, by_score_desc);
    for (size_t k = 0; k < budget - protect; k++)
        keep[c[k].pos] = 1;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (keep[i])
            kept[m++] = (int32_t)i;
    return m;
}

/* ---- scores ---- */

static void test_scores_match_naive(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    static const kve_reduce reduces[] = {KVE_REDUCE_MEAN, KVE_REDUCE_SUM, KVE_REDUCE_MAX};
    int cases = 0;
    for (int it = 0; it < 60; it++) {
        size_t n = 1 + (size_t)kve_rng_below(&g, it < 30 ? 40 : MAXN);
        size_t group = 1 + (size_t)kve_rng_below(&g, MAXG);
        kve_reduce reduce = reduces[kve_rng_below(&g, 3)];
        kve_prefill_options p = prefill_method(
            kve_rng_below(&g, 2) ? KVE_PREFILL_SNAPKV : KVE_PREFILL_H2O);
        p.window = 1 + (size_t)kve_rng_below(&g, 40);
        p.kernel = 1 + 2 * (size_t)kve_rng_below(&g, 5);
        p.pool = kve_rng_below(&g, 2) ? KVE_POOL_MAX : KVE_POOL_AVG;
        size_t r = kve_prefill_rows(n, &p), ld = n + (size_t)kve_rng_below(&g, 3);
        ASSERT_EQ(r, p.method == KVE_PREFILL_H2O ? n : (p.window < n ? p.window : n));
        make_rows(&g, 1, group, n, r, ld);
        ASSERT_OK(kve_prefill_scores(n, rows, ld, group, reduce, &p, lib_score));
        naive(&p, n, rows, ld, group, reduce);
        for (size_t i = 0; i < n; i++)
            if (lib_score[i] != naive_score[i])
                CHECK_FAIL_AT("case %d (n %zu, group %zu, method %d, pool %d, kernel %zu): "
                              "score[%zu] = %.17g, naive %.17g (seed %" PRIu64 ")",
                              it, n, group, (int)p.method, (int)p.pool, p.kernel, i,
                              lib_score[i], naive_score[i], check_seed);
        cases++;
    }
    ASSERT_EQ(cases, 60);
}

/* A hand case: H2O's column sums include each query's weight on its own key;
 * SnapKV's max pooling spreads a peak over the kernel but not into the
 * window. */
static void test_scores_hand_case(void)
{
    /* n = 4, one query head, ld 4: rows over keys 0..t */
    const float r4[16] = {1.0f, 0, 0, 0,  0.5f, 0.5f, 0, 0,  0.25f, 0.5f, 0.25f, 0,
                          0.125f, 0.625f, 0.125f, 0.125f};
    double s[4];
    kve_prefill_options h = prefill_method(KVE_PREFILL_H2O);
    ASSERT_OK(kve_prefill_scores(4, r4, 4, 1, KVE_REDUCE_MEAN, &h, s));
    ASSERT_NEAR(s[0], 1.875, 0); /* 1 + 0.5 + 0.25 + 0.125 */
    ASSERT_NEAR(s[1], 1.625, 0);
    ASSERT_NEAR(s[2], 0.375, 0);
    ASSERT_NEAR(s[3], 0.125, 0); /* its own query's weight only */
    kve_prefill_options p = prefill_method(KVE_PREFILL_SNAPKV);
    p.window = 1;
    p.kernel = 3;
    ASSERT_OK(kve_prefill_scores(4, r4 + 12, 4, 1, KVE_REDUCE_MEAN, &p, s)); /* the last row */
    /* window sums over keys 0..2: 0.125 0.625 0.125; max-pooled by 3 */
    ASSERT_NEAR(s[0], 0.625, 0);
    ASSERT_NEAR(s[1], 0.625, 0);
    ASSERT_NEAR(s[2], 0.625, 0);
    ASSERT_NEAR(s[3], 0.125, 0); /* the window: its own sum, unpooled */
    p.pool = KVE_POOL_AVG;
    ASSERT_OK(kve_prefill_scores(4, r4 + 12, 4, 1, KVE_REDUCE_MEAN, &p, s));
    ASSERT_NEAR(s[0], 0.75 / 3, 1e-15); /* the missing position -1 counts 0 */
    ASSERT_NEAR(s[1], 0.875 / 3, 1e-15);
    ASSERT_NEAR(s[2], 0.75 / 3, 1e-15); /* position 3 is the window: not pooled in */
    ASSERT_EQ(kve_prefill_rows(4, &p), 1);
    /* NULL options are the defaults: H2O, every row. */
    ASSERT_EQ(kve_prefill_rows(4, NULL), 4);
    kve_prefill_options d = kve_prefill_default_options();
    ASSERT_TRUE(d.method == KVE_PREFILL_H2O && d.window == 32 && d.kernel == 5 &&
                d.pool == KVE_POOL_MAX && d.allocator == NULL);
    double s1[4], s2[4];
    ASSERT_OK(kve_prefill_scores(4, r4, 4, 1, KVE_REDUCE_MEAN, NULL, s1));
    ASSERT_OK(kve_prefill_scores(4, r4, 4, 1, KVE_REDUCE_MEAN, &d, s2));
    ASSERT_TRUE(memcmp(s1, s2, sizeof s1) == 0);
}

/* ---- the bank ---- */

static int32_t want_kept[MAXN], victims[MAXH * MAXN];

static void test_bank_prefill_matches_naive(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed + 1);
    static const char *const specs[] = {
        "h2o:budget=%zu,recent_window=%zu", "tova:budget=%zu,recent_window=%zu",
        "h2o_decay:budget=%zu,recent_window=%zu,decay=0.9",
        "h2o_mean:budget=%zu,recent_window=%zu",
        "scissorhands:budget=%zu,recent_window=%zu",
    };
    for (int it = 0; it < 80; it++) {
        size_t heads = 1 + (size_t)kve_rng_below(&g, MAXH);
        size_t group = 1 + (size_t)kve_rng_below(&g, MAXG);
        size_t n = 1 + (size_t)kve_rng_below(&g, it < 40 ? 60 : MAXN);
        kve_prefill_options p = prefill_method(
            kve_rng_below(&g, 2) ? KVE_PREFILL_SNAPKV : KVE_PREFILL_H2O);
        p.window = 1 + (size_t)kve_rng_below(&g, 12);
        p.kernel = 1 + 2 * (size_t)kve_rng_below(&g, 4);
        p.pool = kve_rng_below(&g, 2) ? KVE_POOL_MAX : KVE_POOL_AVG;
        size_t rw = (size_t)kve_rng_below(&g, 6);
        size_t floor = p.method == KVE_PREFILL_SNAPKV ? (p.window > rw ? p.window : rw) : rw;
        size_t budget = floor + 1 + (size_t)kve_rng_below(&g, 30);
        char spec[128];
        int which = (int)kve_rng_below(&g, 5);
        snprintf(spec, sizeof spec, specs[which], budget + (size_t)kve_rng_below(&g, 3), rw);
        kve_bank *b = NULL;
        ASSERT_OK(kve_bank_new(spec, heads, NULL, &b));
        size_t r = kve_prefill_rows(n, &p), ld = n + 1;
        make_rows(&g, heads, group, n, r, ld);
        kve_reduce reduce = (kve_reduce)kve_rng_below(&g, 3);
        ASSERT_OK(kve_bank_prefill(b, 0, heads, n, budget, rows, ld, group, reduce, &p));
        size_t protect = p.method == KVE_PREFILL_SNAPKV ? p.window : rw;
        for (size_t h = 0; h < heads; h++) {
            naive(&p, n, rows + h * group * r * ld, ld, group, reduce);
            size_t m = naive_keep(n, budget, protect, want_kept);
            ASSERT_EQ(kve_bank_size(b, h), m);
            if (memcmp(kve_bank_positions(b, h), want_kept, m * sizeof *want_kept) != 0)
                CHECK_FAIL_AT("%s, method %d, n %zu, head %zu: kept sets differ (seed %" PRIu64
                              ")", spec, (int)p.method, n, h, check_seed);
        }
        /* The heads go on from there: the next position is n. */
        ASSERT_STATUS(kve_bank_step(b, (int32_t)n - 1, NULL, 0), KVE_EINVAL);
        ASSERT_OK(kve_bank_step(b, (int32_t)n, NULL, 0));
        size_t counts[MAXH];
        ASSERT_OK(kve_bank_evict(b, budget, victims, MAXN, counts));
        for (size_t h = 0; h < heads; h++)
            ASSERT_EQ(kve_bank_size(b, h), n + 1 > budget ? budget : n + 1);
        kve_bank_free(b);
    }
}

/* h2o after an H2O prefill is h2o whose scores are the column sums: the
 * reference, given the kept set and those scores, takes the same victims
 * over a run of further steps. */
static void test_h2o_continues_from_the_column_sums(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed + 2);
    const size_t n = 200, budget = 48, rw = 8;
    kve_prefill_options p = prefill_method(KVE_PREFILL_H2O);
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("h2o:budget=48,recent_window=8", 1, NULL, &b));
    make_rows(&g, 1, 2, n, n, n);
    ASSERT_OK(kve_bank_prefill(b, 0, 1, n, budget, rows, n, 2, KVE_REDUCE_MEAN, &p));
    naive(&p, n, rows, n, 2, KVE_REDUCE_MEAN);
    ref_policy *ref = ref_new("h2o:budget=48,recent_window=8", NULL);
    ASSERT_TRUE(ref != NULL);
    ASSERT_EQ(kve_bank_size(b, 0), budget);
    for (size_t i = 0; i < budget; i++) { /* the reference, admitted and set */
        int32_t pos = kve_bank_positions(b, 0)[i];
        ASSERT_EQ(ref_step(ref, pos, NULL, 0), 0);
        ref->slot[i].acc = naive_col[pos];
    }
    ASSERT_EQ(ref->recent_window, rw);
    float attn[64];
    int32_t v1[8], v2[8];
    size_t n1 = 0, n2 = 0;
    for (int32_t pos = (int32_t)n; pos < (int32_t)n + 300; pos++) {
        size_t k = kve_bank_size(b, 0);
        for (size_t i = 0; i < k; i++)
            attn[i] = (float)kve_rng_uniform(&g) / (float)k;
        ASSERT_OK(kve_bank_step(b, pos, attn, 64));
        ASSERT_EQ(ref_step(ref, pos, attn, k), 0);
        ASSERT_OK(kve_bank_evict(b, budget, v1, 8, &n1));
        ASSERT_EQ(ref_evict(ref, budget, v2, &n2), 0);
        ASSERT_EQ(n1, n2);
        if (n1 && v1[0] != v2[0])
            CHECK_FAIL_AT("at %ld the bank evicts %ld, the reference %ld", (long)pos, (long)v1[0],
                          (long)v2[0]);
    }
    ref_free(ref);
    kve_bank_free(b);
}

/* ---- refusals ---- */

static void expect_empty(const kve_bank *b)
{
    for (size_t h = 0; h < kve_bank_heads(b); h++)
        ASSERT_EQ(kve_bank_size(b, h), 0);
}

static void test_refusals(void)
{
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("h2o:budget=16,recent_window=4", 2, NULL, &b));
    kve_prefill_options p = prefill_method(KVE_PREFILL_SNAPKV);
    p.window = 4;
    const size_t n = 30, ld = 30, r = 4;
    kve_rng g;
    kve_rng_seed(&g, check_seed + 3);
    make_rows(&g, 2, 2, n, r, ld);
    double s[MAXN];
    static const struct {
        const char *what;
        kve_prefill_options p;
        size_t n, ld, group;
        kve_reduce reduce;
        const char *needle;
    } bad[] = {
        {"method", {(kve_prefill_method)9, 4, 5, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 30, 2, KVE_REDUCE_MEAN,
         "method 9"},
        {"window 0", {KVE_PREFILL_SNAPKV, 0, 5, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 30, 2, KVE_REDUCE_MEAN,
         "window"},
        {"kernel even", {KVE_PREFILL_SNAPKV, 4, 4, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 30, 2, KVE_REDUCE_MEAN,
         "kernel 4"},
        {"kernel 0", {KVE_PREFILL_SNAPKV, 4, 0, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 30, 2, KVE_REDUCE_MEAN,
         "kernel 0"},
        {"pool", {KVE_PREFILL_SNAPKV, 4, 5, (kve_pool)3, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 30, 2, KVE_REDUCE_MEAN, "pool 3"},
        {"n 0", {KVE_PREFILL_SNAPKV, 4, 5, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 0, 30, 2, KVE_REDUCE_MEAN, "n 0"},
        {"ld", {KVE_PREFILL_SNAPKV, 4, 5, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 29, 2, KVE_REDUCE_MEAN, "ld 29"},
        {"group", {KVE_PREFILL_SNAPKV, 4, 5, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 30, 0, KVE_REDUCE_MEAN, "group"},
        {"budgets", {KVE_PREFILL_KVZIP, 4, 5, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, (kve_prefill_budgets)7, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 30, 2, KVE_REDUCE_MEAN, "budgets 7"},
        {"budgets not kvzip", {KVE_PREFILL_H2O, 4, 5, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_OVERALL, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 30, 2, KVE_REDUCE_MEAN, "are KVzip's"},
        {"prefix not kvzip", {KVE_PREFILL_SNAPKV, 4, 5, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, 3, NULL, NULL, 0.0}, 30, 30, 2, KVE_REDUCE_MEAN, "are KVzip's"},
        {"reduce", {KVE_PREFILL_SNAPKV, 4, 5, KVE_POOL_MAX, NULL, 1, 4, NULL, 0, KVE_PREFILL_PER_HEAD, 0, KVE_PREFILL_NO_PREFIX, NULL, NULL, 0.0}, 30, 30, 2, (kve_reduce)5,
         "reduce 5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(s, 0x5a, sizeof s);
        ASSERT_STATUS(kve_prefill_scores(bad[i].n, rows, bad[i].ld, bad[i].group, bad[i].reduce, &bad[i].p, s),
                      KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), bad[i].needle);
        ASSERT_TRUE(((const unsigned char *)s)[0] == 0x5a); /* untouched */
        ASSERT_STATUS(kve_bank_prefill(b, 0, 2, bad[i].n, 12, rows, bad[i].ld, bad[i].group, bad[i].reduce, &bad[i].p),
                      KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), bad[i].needle);
        expect_empty(b);
    }
    ASSERT_STATUS(kve_prefill_scores(n, NULL, ld, 2, KVE_REDUCE_MEAN, &p, s), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "rows is NULL");
    ASSERT_STATUS(kve_prefill_scores(n, rows, ld, 2, KVE_REDUCE_MEAN, &p, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_prefill_scores((size_t)INT32_MAX + 2, rows, (size_t)INT32_MAX + 2, 1, KVE_REDUCE_MEAN, &p, s),
                  KVE_EINVAL);
    /* A bad weight in the last head's last query head: named, nothing changed. */
    static const struct {
        float bad;
        const char *word;
    } weights[] = {{NAN, "NaN"}, {INFINITY, "infinite"}, {-0.25f, "negative"}};
    for (size_t w = 0; w < 3; w++) {
        make_rows(&g, 2, 2, n, r, ld);
        rows[((1 * 2 + 1) * r + 2) * ld + 7] = weights[w].bad; /* head 1, query head 1, query 28 */
        ASSERT_STATUS(kve_bank_prefill(b, 0, 2, n, 12, rows, ld, 2, KVE_REDUCE_MEAN, &p),
                      KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "head 1: query head 1, query 28: weight on key 7");
        ASSERT_CONTAINS(kve_last_error(), weights[w].word);
        expect_empty(b);
    }
    /* A sum that only overflows float32 when reduced. */
    make_rows(&g, 2, 2, n, r, ld);
    rows[(0 * r + 1) * ld + 3] = FLT_MAX;
    rows[(1 * r + 1) * ld + 3] = FLT_MAX;
    ASSERT_STATUS(kve_bank_prefill(b, 0, 2, n, 12, rows, ld, 2, KVE_REDUCE_SUM, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "overflows float32");
    ASSERT_OK(kve_bank_prefill(b, 0, 2, n, 12, rows, ld, 2, KVE_REDUCE_MEAN, &p));
    kve_bank_free(b);
    b = NULL;

    /* The bank's own refusals. */
    ASSERT_OK(kve_bank_new("h2o:budget=16,recent_window=4", 2, NULL, &b));
    make_rows(&g, 2, 2, n, r, ld);
    kve_prefill_options h = prefill_method(KVE_PREFILL_H2O);
    ASSERT_STATUS(kve_bank_prefill(NULL, 0, 1, n, 12, rows, ld, 2, KVE_REDUCE_MEAN, &p),
                  KVE_EINVAL);
    const struct {
        size_t first, count;
        const kve_prefill_options *p;
        const float *rows;
        size_t budget;
        const char *needle;
    } refused[] = {
        {1, 2, &p, rows, 12, "out of range"},
        {0, 2, &p, rows, 0, "budget 0"},
        {0, 2, &p, rows, 17, "bank's budget"},
        {0, 2, &p, rows, 4, "greater than window 4"},
        {0, 2, &h, NULL, 4, "greater than recent_window 4"},
        {0, 2, &p, NULL, 12, "rows is NULL"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ASSERT_STATUS(kve_bank_prefill(b, refused[i].first, refused[i].count, n, refused[i].budget, refused[i].rows, ld, 2, KVE_REDUCE_MEAN, refused[i].p),
                      KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), refused[i].needle);
        expect_empty(b);
    }
    /* count 0 checks the rest and needs no rows. */
    ASSERT_OK(kve_bank_prefill(b, 2, 0, n, 12, NULL, ld, 2, KVE_REDUCE_MEAN, &p));
    expect_empty(b);
    /* A head that has admitted a position. */
    ASSERT_OK(kve_bank_step_range(b, 1, 1, 0, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0));
    ASSERT_STATUS(kve_bank_prefill(b, 0, 2, n, 12, rows, ld, 2, KVE_REDUCE_MEAN, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 1: prefill needs an empty head");
    ASSERT_EQ(kve_bank_size(b, 0), 0);
    ASSERT_OK(kve_bank_prefill(b, 0, 1, n, 12, rows, ld, 2, KVE_REDUCE_MEAN, &p));
    ASSERT_EQ(kve_bank_size(b, 0), 12);
    kve_bank_free(b);

    /* Policies that cannot prefill. */
    static const char *const cannot[] = {"window:budget=16", "streaming:budget=16",
                                         "random:budget=16", "full:budget=16",
                                         "knorm:budget=16", "keydiff:budget=16"};
    kve_bank_options o = kve_bank_default_options();
    o.key_dim = 4;
    kve_rng rng;
    kve_rng_seed(&rng, 1);
    for (size_t i = 0; i < sizeof cannot / sizeof cannot[0]; i++) {
        ASSERT_OK(kve_bank_new_ex(cannot[i], 1, &rng, &o, &b));
        ASSERT_STATUS(kve_bank_prefill(b, 0, 1, n, 12, rows, ld, 2, KVE_REDUCE_MEAN, &p),
                      KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), i >= 4 ? "reads keys" : "evict this one instead");
        expect_empty(b);
        kve_bank_free(b);
    }
}

/* Allocation failure: ENOMEM, every head still empty; then it succeeds.
 * The scratch comes from the bank's allocator, or the options' when given. */
static void test_allocation_failure(void)
{
    talloc tb, tp;
    talloc_init(&tb);
    talloc_init(&tp);
    kve_bank_options bo = kve_bank_default_options();
    bo.allocator = &tb.a;
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=16,recent_window=2", 2, NULL, &bo, &b));
    kve_rng g;
    kve_rng_seed(&g, check_seed + 4);
    const size_t n = 50;
    make_rows(&g, 2, 1, n, n, n);
    kve_prefill_options p = prefill_method(KVE_PREFILL_H2O);
    talloc_fail_after(&tb, 0);
    kve_status st = kve_bank_prefill(b, 0, 2, n, 16, rows, n, 1, KVE_REDUCE_MEAN, &p);
    talloc_fail_after(&tb, SIZE_MAX);
    ASSERT_STATUS(st, KVE_ENOMEM);
    expect_empty(b);
    p.allocator = &tp.a; /* the options' allocator, not the bank's */
    talloc_fail_after(&tp, 0);
    st = kve_bank_prefill(b, 0, 2, n, 16, rows, n, 1, KVE_REDUCE_MEAN, &p);
    talloc_fail_after(&tp, SIZE_MAX);
    ASSERT_STATUS(st, KVE_ENOMEM);
    expect_empty(b);
    double s[64];
    talloc_fail_after(&tp, 0);
    st = kve_prefill_scores(n, rows, n, 1, KVE_REDUCE_MEAN, &p, s);
    talloc_fail_after(&tp, SIZE_MAX);
    ASSERT_STATUS(st, KVE_ENOMEM);
    size_t bank_blocks = tb.blocks;
    ASSERT_OK(kve_bank_prefill(b, 0, 2, n, 16, rows, n, 1, KVE_REDUCE_MEAN, &p));
    ASSERT_EQ(tp.made, 1);
    ASSERT_EQ(tb.blocks, bank_blocks);
    ASSERT_EQ(kve_bank_size(b, 1), 16);
    kve_bank_free(b);
    talloc_check_empty(&tb);
    talloc_check_empty(&tp);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_scores_hand_case);
    RUN(test_scores_match_naive);
    RUN(test_bank_prefill_matches_naive);
    RUN(test_h2o_continues_from_the_column_sums);
    RUN(test_refusals);
    RUN(test_allocation_failure);
    return CHECK_DONE();
}
