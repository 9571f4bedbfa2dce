/* SPDX-License-Identifier: MIT */
/*
 * test_h2o.c - every behavioural sentence of the H2O page
 * (docs/policies/h2o.md) and of the header's h2o contract, one test
 * each: float64 exactness, ties, victim order, the recent window and its
 * refusals, null attention, Rng independence, state bytes, canonical spec.
 */
#include "check.h"
#include "kvevict.h"

#include <float.h>

enum { MAXN = 1024 };

static int32_t victims[MAXN];
static float row[MAXN];

/* Steps `p` at `pos` with attn[0 .. size) from `w` (NULL: no information). */
static kve_status step(kve_policy *p, int32_t pos, const float *w)
{
    return kve_policy_step(p, pos, w, kve_policy_size(p));
}

/* A float32 accumulation would keep one position and float64 the other:
 * A starts at 1.0 and gets 1000 increments of 3e-8 (each below half an ulp
 * of 1.0f, so float32 rounds every one away); B sits at 1.00001f. In float32
 * A < B and A would go; in float64 A = 1.00003 > B and B goes. */
static void test_float64_exactness(void)
{
    const float tiny = 3e-8f, b_weight = 1.00001f;
    enum { INCREMENTS = 1000 };
    float a32 = 1.0f;
    double a64 = 1.0;
    for (int k = 0; k < INCREMENTS; k++) {
        a32 += tiny;
        a64 += (double)tiny;
    }
    /* The case discriminates: the two precisions order A and B differently. */
    ASSERT_TRUE(a32 < b_weight);
    ASSERT_TRUE(a64 > (double)b_weight);

    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=3,recent_window=1", NULL, &p));
    size_t nv = 0;
    ASSERT_OK(step(p, 0, NULL));
    ASSERT_OK(step(p, 1, (const float[]){1.0f}));
    ASSERT_OK(step(p, 2, (const float[]){0.0f, b_weight}));
    ASSERT_OK(kve_policy_evict(p, 3, victims, MAXN, &nv));
    ASSERT_EQ(nv, 0);
    /* Kept [A=0, B=1, newest]; each step A gets `tiny`, the rest 0, and the
     * previous newest (score 0) is the one victim. */
    for (int32_t t = 3; t < 3 + INCREMENTS; t++) {
        ASSERT_OK(step(p, t, (const float[]){tiny, 0.0f, 0.0f}));
        ASSERT_OK(kve_policy_evict(p, 3, victims, MAXN, &nv));
        ASSERT_EQ(nv, 1);
        ASSERT_EQ(victims[0], t - 1);
    }
    ASSERT_OK(kve_policy_evict(p, 2, victims, MAXN, &nv));
    ASSERT_EQ(nv, 1);
    ASSERT_EQ(victims[0], 1); /* B: float64 saw A pass it */
    ASSERT_EQ(kve_policy_positions(p)[0], 0);
    ASSERT_EQ(kve_policy_positions(p)[1], 3 + INCREMENTS - 1);
    kve_policy_free(p);
}

/* Equal scores evict the lower position, including among several tied
 * positions and when a higher position with the same score sits between. */
static void test_ties_evict_lower_position(void)
{
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=8,recent_window=1", NULL, &p));
    size_t nv = 0;
    /* Scores after admitting 0..4: 0 -> 0.5, 1 -> 0.25, 2 -> 0.5, 3 -> 0.25,
     * 4 newest. */
    ASSERT_OK(step(p, 0, NULL));
    ASSERT_OK(step(p, 1, (const float[]){0.5f}));
    ASSERT_OK(step(p, 2, (const float[]){0.0f, 0.25f}));
    ASSERT_OK(step(p, 3, (const float[]){0.0f, 0.0f, 0.5f}));
    ASSERT_OK(step(p, 4, (const float[]){0.0f, 0.0f, 0.0f, 0.25f}));
    ASSERT_OK(kve_policy_evict(p, 4, victims, MAXN, &nv));
    ASSERT_EQ(nv, 1);
    ASSERT_EQ(victims[0], 1); /* 1 and 3 tie at 0.25: the lower goes */
    ASSERT_OK(kve_policy_evict(p, 3, victims, MAXN, &nv));
    ASSERT_EQ(victims[0], 3);
    ASSERT_OK(kve_policy_evict(p, 2, victims, MAXN, &nv));
    ASSERT_EQ(victims[0], 0); /* 0 and 2 tie at 0.5 */
    ASSERT_EQ(kve_policy_positions(p)[0], 2);
    ASSERT_EQ(kve_policy_positions(p)[1], 4);
    kve_policy_free(p);
}

/* Victims come out in ascending position order, not in the order chosen. */
static void test_victims_ascending_not_choice_order(void)
{
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=8,recent_window=1", NULL, &p));
    size_t nv = 0;
    /* Scores: 0 -> 0.3, 1 -> 0.1, 2 -> 0.5, 3 -> 0.2, 4 newest. The argmin
     * chooses 1, then 3, then 0; the report is 0, 1, 3. */
    ASSERT_OK(step(p, 0, NULL));
    ASSERT_OK(step(p, 1, (const float[]){0.3f}));
    ASSERT_OK(step(p, 2, (const float[]){0.0f, 0.1f}));
    ASSERT_OK(step(p, 3, (const float[]){0.0f, 0.0f, 0.5f}));
    ASSERT_OK(step(p, 4, (const float[]){0.0f, 0.0f, 0.0f, 0.2f}));
    ASSERT_OK(kve_policy_evict(p, 2, victims, MAXN, &nv));
    ASSERT_EQ(nv, 3);
    ASSERT_EQ(victims[0], 0);
    ASSERT_EQ(victims[1], 1);
    ASSERT_EQ(victims[2], 3);
    ASSERT_EQ(kve_policy_size(p), 2);
    ASSERT_EQ(kve_policy_positions(p)[0], 2);
    ASSERT_EQ(kve_policy_positions(p)[1], 4);
    kve_policy_free(p);
}

/* The newest recent_window positions are never evicted, however low their
 * score; without the window the newcomer (score 0) goes at once and the
 * cache never advances. */
static void test_recent_window_protected(void)
{
    kve_policy *p = NULL;
    size_t nv = 0;
    ASSERT_OK(kve_policy_new("h2o:budget=4,recent_window=2", NULL, &p));
    ASSERT_OK(step(p, 0, NULL));
    for (int32_t t = 1; t < 50; t++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            row[i] = i + 2 < n ? 1.0f : 0.0f; /* the two newest get nothing */
        ASSERT_OK(step(p, t, row));
        ASSERT_OK(kve_policy_evict(p, 4, victims, MAXN, &nv));
        const int32_t *kept = kve_policy_positions(p);
        size_t size = kve_policy_size(p);
        ASSERT_EQ(kept[size - 1], t);
        if (size >= 2)
            ASSERT_EQ(kept[size - 2], t - 1);
    }
    /* The window moved: the two newest of the first steps are long gone
     * except where the score defended them (0 and 1 got 1.0 every step). */
    ASSERT_EQ(kve_policy_positions(p)[0], 0);
    ASSERT_EQ(kve_policy_positions(p)[1], 1);
    kve_policy_free(p);

    ASSERT_OK(kve_policy_new("h2o:budget=2,recent_window=0", NULL, &p));
    ASSERT_OK(step(p, 0, NULL));
    ASSERT_OK(step(p, 1, (const float[]){1.0f}));
    for (int32_t t = 2; t < 10; t++) {
        ASSERT_OK(step(p, t, (const float[]){0.5f, 0.5f}));
        ASSERT_OK(kve_policy_evict(p, 2, victims, MAXN, &nv));
        ASSERT_EQ(nv, 1);
        ASSERT_EQ(victims[0], t); /* the newcomer, score 0 */
    }
    kve_policy_free(p);
}

static void test_recent_window_refusals(void)
{
    kve_policy *p = (kve_policy *)&row; /* must stay untouched */
    ASSERT_STATUS(kve_policy_new("h2o:budget=32,recent_window=32", NULL, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "recent_window");
    ASSERT_TRUE(p == (kve_policy *)&row);
    ASSERT_STATUS(kve_policy_new("h2o:budget=4,recent_window=5", NULL, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "recent_window");
    ASSERT_STATUS(kve_policy_new("h2o:budget=1", NULL, &p), KVE_EINVAL); /* default 32 */
    ASSERT_CONTAINS(kve_last_error(), "recent_window");

    p = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=8,recent_window=3", NULL, &p));
    for (int32_t t = 0; t < 8; t++)
        ASSERT_OK(step(p, t, NULL));
    size_t nv = 99;
    ASSERT_STATUS(kve_policy_evict(p, 3, victims, MAXN, &nv), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "recent_window");
    ASSERT_EQ(nv, 99);
    ASSERT_EQ(kve_policy_size(p), 8);
    ASSERT_STATUS(kve_policy_evict(p, 2, victims, MAXN, &nv), KVE_EINVAL);
    ASSERT_OK(kve_policy_evict(p, 4, victims, MAXN, &nv));
    ASSERT_EQ(nv, 4);
    kve_policy_free(p);
}

/* NULL attention leaves every score unchanged and ignores n. For h2o a row
 * of zeros also adds nothing, so the two give the same victims; the
 * difference (a zero row is evidence, NULL is not) shows in h2o_mean and
 * scissorhands with a history: see test_family.c. */
static void test_null_attention(void)
{
    kve_policy *a = NULL, *b = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=6,recent_window=1", NULL, &a));
    ASSERT_OK(kve_policy_new("h2o:budget=6,recent_window=1", NULL, &b));
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    size_t na = 0, nb = 0;
    int32_t va[8], vb[8];
    for (int32_t t = 0; t < 400; t++) {
        size_t n = kve_policy_size(a);
        int null_step = kve_rng_below(&g, 3) == 0;
        for (size_t i = 0; i < n; i++)
            row[i] = null_step ? 0.0f : (float)kve_rng_uniform(&g);
        /* a gets NULL (with a nonsense n, which must be ignored), b zeros. */
        ASSERT_OK(kve_policy_step(a, t, null_step ? NULL : row, null_step ? 12345 : n));
        ASSERT_OK(kve_policy_step(b, t, row, n));
        ASSERT_OK(kve_policy_evict(a, 6, va, 8, &na));
        ASSERT_OK(kve_policy_evict(b, 6, vb, 8, &nb));
        ASSERT_EQ(na, nb);
        for (size_t i = 0; i < na; i++)
            ASSERT_EQ(va[i], vb[i]);
    }
    kve_policy_free(a);
    kve_policy_free(b);

    /* A NULL step changes no score: the heavy position stays the heaviest
     * through a long run of NULL steps, and the victims are newcomers. */
    ASSERT_OK(kve_policy_new("h2o:budget=3,recent_window=1", NULL, &a));
    ASSERT_OK(step(a, 0, NULL));
    ASSERT_OK(step(a, 1, (const float[]){0.9f}));
    ASSERT_OK(step(a, 2, (const float[]){0.1f, 0.2f}));
    for (int32_t t = 3; t < 100; t++) {
        ASSERT_OK(kve_policy_step(a, t, NULL, 0));
        ASSERT_OK(kve_policy_evict(a, 3, va, 8, &na));
        ASSERT_EQ(na, 1);
        ASSERT_EQ(va[0], t == 3 ? 2 : t - 1);
    }
    ASSERT_OK(kve_policy_evict(a, 2, va, 8, &na));
    ASSERT_EQ(va[0], 1); /* 0.2 < 1.0: unchanged by 97 NULL steps */
    kve_policy_free(a);
}

/* The Rng is accepted and never used: NULL and two different seeds give the
 * same victims, and the caller's generator is not advanced. */
static void test_rng_independence(void)
{
    kve_rng r1, r2, r1_before, r2_before;
    kve_rng_seed(&r1, 1);
    kve_rng_seed(&r2, 0xdeadbeef);
    r1_before = r1;
    r2_before = r2;
    kve_policy *p[3] = {NULL, NULL, NULL};
    ASSERT_OK(kve_policy_new("h2o:budget=16,recent_window=4", NULL, &p[0]));
    ASSERT_OK(kve_policy_new("h2o:budget=16,recent_window=4", &r1, &p[1]));
    ASSERT_OK(kve_policy_new("h2o:budget=16,recent_window=4", &r2, &p[2]));
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    int32_t v[3][8];
    size_t nv[3];
    size_t total = 0;
    for (int32_t t = 0; t < 3000; t++) {
        size_t n = kve_policy_size(p[0]);
        for (size_t i = 0; i < n; i++)
            row[i] = (float)kve_rng_uniform(&g);
        for (int k = 0; k < 3; k++) {
            ASSERT_OK(kve_policy_step(p[k], t, row, n));
            ASSERT_OK(kve_policy_evict(p[k], 16, v[k], 8, &nv[k]));
        }
        for (int k = 1; k < 3; k++) {
            ASSERT_EQ(nv[k], nv[0]);
            for (size_t i = 0; i < nv[0]; i++)
                ASSERT_EQ(v[k][i], v[0][i]);
        }
        total += nv[0];
    }
    ASSERT_TRUE(total > 2900);
    ASSERT_TRUE(memcmp(&r1, &r1_before, sizeof r1) == 0);
    ASSERT_TRUE(memcmp(&r2, &r2_before, sizeof r2) == 0);
    for (int k = 0; k < 3; k++)
        kve_policy_free(p[k]);
}

/* 13 bytes a slot (4 position, 8 score, 1 scratch) over budget + 1 slots:
 * 6669 at the default budget, under 7 KB. */
static void test_state_bytes(void)
{
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o", NULL, &p));
    ASSERT_EQ(kve_policy_state_bytes(p), 6669);
    ASSERT_EQ(kve_policy_state_bytes(p), 13 * 513);
    ASSERT_TRUE(kve_policy_state_bytes(p) < 7 * 1024);
    /* The steady state of step-then-evict never grows it. */
    size_t nv = 0;
    for (int32_t t = 0; t < 2000; t++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            row[i] = 1.0f / (float)(i + 1);
        ASSERT_OK(kve_policy_step(p, t, row, n));
        ASSERT_OK(kve_policy_evict(p, 512, victims, MAXN, &nv));
    }
    ASSERT_EQ(kve_policy_state_bytes(p), 6669);
    kve_policy_free(p);

    ASSERT_OK(kve_policy_new("h2o:budget=100,recent_window=10", NULL, &p));
    ASSERT_EQ(kve_policy_state_bytes(p), 13 * 101);
    kve_policy_free(p);
    ASSERT_EQ(kve_policy_state_bytes(NULL), 0);
}

static void test_canonical_spec_round_trip(void)
{
    static const struct {
        const char *in, *canonical;
    } cases[] = {
        {"h2o", "h2o:budget=512,recent_window=32"},
        {"h2o:budget=256", "h2o:budget=256,recent_window=32"},
        {"h2o:recent_window=64,budget=256", "h2o:budget=256,recent_window=64"},
        {"h2o:recent_window=0", "h2o:budget=512,recent_window=0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kve_policy *p = NULL, *q = NULL;
        ASSERT_OK(kve_policy_new(cases[i].in, NULL, &p));
        ASSERT_STR_EQ(kve_policy_spec(p), cases[i].canonical);
        ASSERT_STR_EQ(kve_policy_name(p), "h2o");
        ASSERT_OK(kve_policy_new(kve_policy_spec(p), NULL, &q));
        ASSERT_STR_EQ(kve_policy_spec(q), kve_policy_spec(p));
        ASSERT_EQ(kve_policy_budget(q), kve_policy_budget(p));
        ASSERT_EQ(kve_policy_state_bytes(q), kve_policy_state_bytes(p));
        kve_policy_free(p);
        kve_policy_free(q);
    }
}

/* The heavy hitter idea itself: the position with the largest cumulative
 * attention survives, even when another had the single largest weight. */
static void test_cumulative_sum_decides(void)
{
    kve_policy *p = NULL;
    size_t nv = 0;
    ASSERT_OK(kve_policy_new("h2o:budget=3,recent_window=1", NULL, &p));
    ASSERT_OK(step(p, 0, NULL));
    ASSERT_OK(step(p, 1, (const float[]){1.0f}));          /* 0: 1.0 */
    ASSERT_OK(step(p, 2, (const float[]){0.0f, 0.6f}));    /* 1: 0.6 */
    ASSERT_OK(kve_policy_evict(p, 3, victims, MAXN, &nv));
    ASSERT_OK(step(p, 3, (const float[]){0.0f, 0.6f, 0.0f})); /* 1: 1.2 */
    ASSERT_OK(kve_policy_evict(p, 3, victims, MAXN, &nv));
    ASSERT_EQ(victims[0], 2);
    ASSERT_OK(kve_policy_evict(p, 2, victims, MAXN, &nv));
    ASSERT_EQ(nv, 1);
    ASSERT_EQ(victims[0], 0); /* 1.0 < 1.2 though 1.0 was the largest weight */
    kve_policy_free(p);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_float64_exactness);
    RUN(test_ties_evict_lower_position);
    RUN(test_victims_ascending_not_choice_order);
    RUN(test_recent_window_protected);
    RUN(test_recent_window_refusals);
    RUN(test_null_attention);
    RUN(test_rng_independence);
    RUN(test_state_bytes);
    RUN(test_canonical_spec_round_trip);
    RUN(test_cumulative_sum_decides);
    return CHECK_DONE();
}
