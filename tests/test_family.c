/* SPDX-License-Identifier: MIT */
/*
 * test_family.c - the attention-aware family (docs/policies/), one hand-computed
 * case per documented sentence: scissorhands' early spike, strict '>', the
 * vote history; tova's replaced scores and null rows; h2o_decay's decay = 1
 * identity and its forgetting (with null steps that do not decay);
 * h2o_mean's removal of the old-position bias and its score 0 before any
 * observation; and, per policy, that a NULL row is not a row of zeros where
 * the documentation says so (and is where attention is ignored).
 *
 * A device used throughout: evicting down to recent_window + 1 leaves one
 * unprotected survivor, the highest score (ties keep the higher position,
 * since the lower goes first), which reads a whole score order in one call.
 */
#include "check.h"
#include "kvevict.h"

enum { MAXN = 1024 };

static int32_t victims[MAXN];
static float row[MAXN];

static kve_status feed(kve_policy *p, int32_t pos, const float *w)
{
    return kve_policy_step(p, pos, w, kve_policy_size(p));
}

/* Steps with a uniform row over the kept set. */
static kve_status feed_uniform(kve_policy *p, int32_t pos)
{
    size_t n = kve_policy_size(p);
    for (size_t i = 0; i < n; i++)
        row[i] = 1.0f / (float)n;
    return kve_policy_step(p, pos, row, n);
}

static kve_status feed_zeros(kve_policy *p, int32_t pos)
{
    size_t n = kve_policy_size(p);
    for (size_t i = 0; i < n; i++)
        row[i] = 0.0f;
    return kve_policy_step(p, pos, row, n);
}

/* Evicts to `budget`; returns the kept set as a small bitmask of positions
 * (all positions in these tests are < 64). */
static uint64_t evict_to(kve_policy *p, size_t budget)
{
    size_t nv = 0;
    if (kve_policy_evict(p, budget, victims, MAXN, &nv) != KVE_OK)
        return UINT64_MAX;
    uint64_t set = 0;
    for (size_t i = 0; i < kve_policy_size(p); i++)
        set |= UINT64_C(1) << kve_policy_positions(p)[i];
    return set;
}

#define SET2(a, b) ((UINT64_C(1) << (a)) | (UINT64_C(1) << (b)))
#define SET4(a, b, c, d) (SET2(a, b) | SET2(c, d))

/* The early spike (docs/policies/h2o.md, "Nearest neighbour"): position 0 takes almost everything at steps 1
 * and 2 and almost nothing after. Its h2o score is the highest of all; it
 * has a single vote (at step 1, n = 1 and 1.0 is not > 1/1). h2o defends it,
 * scissorhands evicts it. */
static void test_scissorhands_early_spike(void)
{
    const char *specs[2] = {"h2o:budget=4,recent_window=2",
                            "scissorhands:budget=4,recent_window=2"};
    uint64_t kept[2];
    for (int k = 0; k < 2; k++) {
        kve_policy *p = NULL;
        ASSERT_OK(kve_policy_new(specs[k], NULL, &p));
        ASSERT_OK(feed(p, 0, NULL));
        ASSERT_OK(feed(p, 1, (const float[]){1.0f}));
        ASSERT_OK(feed(p, 2, (const float[]){0.98f, 0.02f}));
        ASSERT_OK(feed(p, 3, (const float[]){0.02f, 0.49f, 0.49f}));
        ASSERT_OK(feed(p, 4, (const float[]){0.01f, 0.33f, 0.33f, 0.33f}));
        /* h2o: 0 -> 2.01, 1 -> 0.84, 2 -> 0.82. votes: 0 -> 1, 1 -> 2, 2 -> 2. */
        kept[k] = evict_to(p, 4);
        ASSERT_EQ(kve_policy_size(p), 4);
        kve_policy_free(p);
    }
    ASSERT_U64_EQ(kept[0], SET4(0, 1, 3, 4)); /* h2o drops 2, the lowest sum */
    ASSERT_U64_EQ(kept[1], SET4(1, 2, 3, 4)); /* scissorhands drops the spike */
}

/* Strictly greater than the fair share: a weight equal to (float)(1/n) is
 * no vote, and at n = 1 no weight can vote. */
static void test_scissorhands_strict(void)
{
    /* Row [0.25, 0.25, 0.5, 0.0] at n = 4 votes for position 2 only; with
     * '>=' positions 0 and 1 would vote too and 3 would be the victim. */
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("scissorhands:budget=4,recent_window=1", NULL, &p));
    ASSERT_OK(feed(p, 0, NULL));
    ASSERT_OK(feed(p, 1, NULL));
    ASSERT_OK(feed(p, 2, NULL));
    ASSERT_OK(feed(p, 3, NULL));
    ASSERT_OK(feed(p, 4, (const float[]){0.25f, 0.25f, 0.5f, 0.0f}));
    ASSERT_U64_EQ(evict_to(p, 2), SET2(2, 4)); /* 2 has the only vote */
    kve_policy_free(p);

    ASSERT_OK(kve_policy_new("scissorhands:budget=4,recent_window=1", NULL, &p));
    ASSERT_OK(feed(p, 0, NULL));
    ASSERT_OK(feed(p, 1, NULL));
    ASSERT_OK(feed(p, 2, NULL));
    ASSERT_OK(feed(p, 3, NULL));
    ASSERT_OK(feed(p, 4, (const float[]){0.25f, 0.25f, 0.5f, 0.0f}));
    ASSERT_U64_EQ(evict_to(p, 4), SET4(1, 2, 3, 4)); /* 0, 1, 3 tie at 0: 0 goes */
    kve_policy_free(p);

    /* Uniform rows cast no vote at any n: all tie at 0 and the oldest goes,
     * exactly as with no attention at all. */
    ASSERT_OK(kve_policy_new("scissorhands:budget=3,recent_window=1", NULL, &p));
    ASSERT_OK(feed(p, 0, NULL));
    for (int32_t t = 1; t < 40; t++) {
        ASSERT_OK(feed_uniform(p, t));
        size_t nv = 0;
        ASSERT_OK(kve_policy_evict(p, 3, victims, MAXN, &nv));
        if (t >= 3) {
            ASSERT_EQ(nv, 1);
            ASSERT_EQ(victims[0], t - 3);
        }
    }
    kve_policy_free(p);

    /* At n = 1 the only weight (1.0) is not > 1/1: with budget 1 and no
     * recent window the old position has no vote and loses to the newcomer
     * by position, every step; h2o's sum keeps position 0 forever. */
    kve_policy *h = NULL;
    ASSERT_OK(kve_policy_new("scissorhands:budget=1,recent_window=0", NULL, &p));
    ASSERT_OK(kve_policy_new("h2o:budget=1,recent_window=0", NULL, &h));
    ASSERT_OK(feed(p, 0, NULL));
    ASSERT_OK(feed(h, 0, NULL));
    for (int32_t t = 1; t < 20; t++) {
        ASSERT_OK(feed(p, t, (const float[]){1.0f}));
        ASSERT_OK(feed(h, t, (const float[]){1.0f}));
        ASSERT_U64_EQ(evict_to(p, 1), UINT64_C(1) << t);
        ASSERT_U64_EQ(evict_to(h, 1), UINT64_C(1));
    }
    kve_policy_free(p);
    kve_policy_free(h);
}

/* history = W counts the votes of the last W informative steps; NULL steps
 * do not shift the window, zero rows do. Votes: position 0 at steps 2 and 3,
 * position 1 at step 4, none at step 5 (uniform), then two more steps. */
static uint64_t history_case(const char *spec, int null_tail)
{
    kve_policy *p = NULL;
    if (kve_policy_new(spec, NULL, &p) != KVE_OK)
        return UINT64_MAX;
    kve_status st = feed(p, 0, NULL);
    st = st ? st : feed(p, 1, (const float[]){0.1f});
    st = st ? st : feed(p, 2, (const float[]){0.9f, 0.1f});
    st = st ? st : feed(p, 3, (const float[]){0.8f, 0.1f, 0.1f});
    st = st ? st : feed(p, 4, (const float[]){0.0f, 0.5f, 0.25f, 0.25f});
    st = st ? st : feed_uniform(p, 5);
    for (int32_t t = 6; t < 8 && !st; t++)
        st = null_tail ? feed(p, t, NULL) : feed_zeros(p, t);
    uint64_t kept = st ? UINT64_MAX : evict_to(p, 2); /* one survivor among 0..6 */
    kve_policy_free(p);
    return kept;
}

static void test_scissorhands_history(void)
{
    /* Lifetime: 0 has 2 votes, 1 has 1. */
    ASSERT_U64_EQ(history_case("scissorhands:budget=16,recent_window=1,history=0", 1), SET2(0, 7));
    ASSERT_U64_EQ(history_case("scissorhands:budget=16,recent_window=1,history=0", 0), SET2(0, 7));
    /* Last 2 informative steps (4, 5): 1 has 1 vote, 0 none. NULL steps 6, 7
     * do not shift; zero rows would push both votes out (all 0: the highest
     * position, 6, survives). */
    ASSERT_U64_EQ(history_case("scissorhands:budget=16,recent_window=1,history=2", 1), SET2(1, 7));
    ASSERT_U64_EQ(history_case("scissorhands:budget=16,recent_window=1,history=2", 0), SET2(6, 7));
    /* Last step only (5, uniform): no votes anywhere. */
    ASSERT_U64_EQ(history_case("scissorhands:budget=16,recent_window=1,history=1", 1), SET2(6, 7));
    /* Last 3 (3, 4, 5): 0 and 1 one vote each: the tie keeps 1. */
    ASSERT_U64_EQ(history_case("scissorhands:budget=16,recent_window=1,history=3", 1), SET2(1, 7));
    /* Last 4 (2..5): 0 has 2. */
    ASSERT_U64_EQ(history_case("scissorhands:budget=16,recent_window=1,history=4", 1), SET2(0, 7));
    ASSERT_U64_EQ(history_case("scissorhands:budget=16,recent_window=1,history=64", 0), SET2(0, 7));
}

/* tova: the score is the latest informative row, replaced not summed; a
 * NULL row keeps the previous scores, a zero row replaces them. */
static uint64_t tova_case(int tail) /* 0: none, 1: two NULL rows, 2: two zero rows */
{
    kve_policy *p = NULL;
    if (kve_policy_new("tova:budget=8,recent_window=1", NULL, &p) != KVE_OK)
        return UINT64_MAX;
    kve_status st = feed(p, 0, NULL);
    st = st ? st : feed(p, 1, (const float[]){1.0f});
    st = st ? st : feed(p, 2, (const float[]){0.9f, 0.1f});
    st = st ? st : feed(p, 3, (const float[]){0.2f, 0.1f, 0.7f});
    for (int32_t t = 4; t < 6 && !st; t++)
        st = tail == 1 ? feed(p, t, NULL) : tail == 2 ? feed_zeros(p, t) : feed_uniform(p, t);
    uint64_t kept = st ? UINT64_MAX : evict_to(p, 2);
    kve_policy_free(p);
    return kept;
}

static void test_tova(void)
{
    /* Scores after step 3: 0 -> 0.2, 1 -> 0.1, 2 -> 0.7 (h2o would have 0 at
     * 2.1). NULL rows keep them: 2 survives. */
    ASSERT_U64_EQ(tova_case(1), SET2(2, 5));
    /* Zero rows replace them all by 0: the highest position, 4, survives. */
    ASSERT_U64_EQ(tova_case(2), SET2(4, 5));

    /* Heavy then cold: position 0 took 0.9 for ten steps, then nothing. */
    kve_policy *t = NULL, *h = NULL;
    ASSERT_OK(kve_policy_new("tova:budget=3,recent_window=1", NULL, &t));
    ASSERT_OK(kve_policy_new("h2o:budget=3,recent_window=1", NULL, &h));
    kve_policy *both[2] = {t, h};
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(feed(both[k], 0, NULL));
        ASSERT_OK(feed(both[k], 1, (const float[]){0.9f}));
        ASSERT_OK(feed(both[k], 2, (const float[]){0.9f, 0.1f}));
        ASSERT_OK(feed(both[k], 3, (const float[]){0.9f, 0.07f, 0.03f}));
        ASSERT_U64_EQ(evict_to(both[k], 3), SET2(0, 1) | (UINT64_C(1) << 3));
        ASSERT_OK(feed(both[k], 4, (const float[]){0.0f, 0.3f, 0.7f}));
    }
    ASSERT_U64_EQ(evict_to(t, 3), SET2(1, 3) | (UINT64_C(1) << 4)); /* cold 0 goes */
    ASSERT_U64_EQ(evict_to(h, 3), SET2(0, 3) | (UINT64_C(1) << 4)); /* 1 (0.47) goes */
    kve_policy_free(t);
    kve_policy_free(h);
}

/* h2o_decay with decay = 1 is h2o exactly, on a long random run. */
static void test_decay_one_is_h2o(void)
{
    kve_policy *d = NULL, *h = NULL;
    ASSERT_OK(kve_policy_new("h2o_decay:budget=12,recent_window=3,decay=1", NULL, &d));
    ASSERT_OK(kve_policy_new("h2o:budget=12,recent_window=3", NULL, &h));
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    int32_t vd[MAXN];
    size_t nd = 0, nh = 0, total = 0;
    for (int32_t t = 0; t < 3000; t++) {
        size_t n = kve_policy_size(h);
        for (size_t i = 0; i < n; i++)
            row[i] = kve_rng_below(&g, 4) ? (float)kve_rng_uniform(&g) : 0.125f;
        const float *w = kve_rng_below(&g, 10) ? row : NULL;
        ASSERT_OK(kve_policy_step(d, t, w, n));
        ASSERT_OK(kve_policy_step(h, t, w, n));
        size_t b = kve_rng_below(&g, 10) ? 12 : 8;
        ASSERT_OK(kve_policy_evict(d, b, vd, MAXN, &nd));
        ASSERT_OK(kve_policy_evict(h, b, victims, MAXN, &nh));
        ASSERT_EQ(nd, nh);
        ASSERT_TRUE(memcmp(vd, victims, nd * sizeof *vd) == 0);
        total += nd;
    }
    ASSERT_TRUE(total > 2900);
    kve_policy_free(d);
    kve_policy_free(h);
}

/* decay < 1 forgets a stale spike that h2o defends forever; a NULL step
 * neither adds nor decays. */
static void test_decay_forgets(void)
{
    const char *specs[2] = {"h2o:budget=3,recent_window=1",
                            "h2o_decay:budget=3,recent_window=1,decay=0.5"};
    uint64_t kept[2];
    for (int k = 0; k < 2; k++) {
        kve_policy *p = NULL;
        ASSERT_OK(kve_policy_new(specs[k], NULL, &p));
        ASSERT_OK(feed(p, 0, NULL));
        ASSERT_OK(feed(p, 1, (const float[]){1.0f}));
        ASSERT_OK(feed(p, 2, (const float[]){1.0f, 0.0f}));
        ASSERT_OK(feed(p, 3, (const float[]){0.0f, 0.3f, 0.2f}));
        ASSERT_U64_EQ(evict_to(p, 3), SET2(0, 1) | (UINT64_C(1) << 3));
        ASSERT_OK(feed(p, 4, (const float[]){0.0f, 0.3f, 0.3f}));
        ASSERT_U64_EQ(evict_to(p, 3), SET2(0, 1) | (UINT64_C(1) << 4));
        ASSERT_OK(feed(p, 5, (const float[]){0.0f, 0.3f, 0.3f}));
        /* h2o: 0 -> 2, 1 -> 0.9, 4 -> 0.3.  decay: 0 -> 0.1875, 1 -> 0.525, 4 -> 0.3. */
        kept[k] = evict_to(p, 3);
        kve_policy_free(p);
    }
    ASSERT_U64_EQ(kept[0], SET2(0, 1) | (UINT64_C(1) << 5));
    ASSERT_U64_EQ(kept[1], SET2(1, 4) | (UINT64_C(1) << 5));

    /* Ten NULL steps between a spike and the next row: without decay during
     * them, 0 keeps 1.0 * 0.5 = 0.5 > 0.4; had they decayed it, 0 would hold
     * 0.5^11 and lose. Zero rows do decay it. */
    for (int zeros = 0; zeros < 2; zeros++) {
        kve_policy *p = NULL;
        ASSERT_OK(kve_policy_new("h2o_decay:budget=16,recent_window=1,decay=0.5", NULL, &p));
        ASSERT_OK(feed(p, 0, NULL));
        ASSERT_OK(feed(p, 1, (const float[]){1.0f}));
        for (int32_t t = 2; t < 12; t++)
            ASSERT_OK(zeros ? feed_zeros(p, t) : feed(p, t, NULL));
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            row[i] = i == 1 ? 0.4f : 0.0f;
        ASSERT_OK(kve_policy_step(p, 12, row, n));
        ASSERT_U64_EQ(evict_to(p, 2), zeros ? SET2(1, 12) : SET2(0, 12));
        kve_policy_free(p);
    }
}

/* h2o_mean: an old position with a big sum and a small mean loses to a young
 * one with a smaller sum and a big mean; h2o keeps the old one. */
static void test_mean_removes_age_bias(void)
{
    const char *specs[2] = {"h2o:budget=3,recent_window=1", "h2o_mean:budget=3,recent_window=1"};
    uint64_t kept[2];
    for (int k = 0; k < 2; k++) {
        kve_policy *p = NULL;
        ASSERT_OK(kve_policy_new(specs[k], NULL, &p));
        ASSERT_OK(feed(p, 0, NULL));
        ASSERT_OK(feed(p, 1, (const float[]){0.3f}));
        ASSERT_OK(feed(p, 2, (const float[]){0.3f, 0.1f}));
        ASSERT_OK(feed(p, 3, (const float[]){0.3f, 0.1f, 0.0f}));
        ASSERT_U64_EQ(evict_to(p, 3), SET2(0, 1) | (UINT64_C(1) << 3));
        ASSERT_OK(feed(p, 4, (const float[]){0.3f, 0.1f, 0.6f}));
        ASSERT_U64_EQ(evict_to(p, 3), SET2(0, 3) | (UINT64_C(1) << 4));
        ASSERT_OK(feed(p, 5, (const float[]){0.3f, 0.6f, 0.0f}));
        ASSERT_U64_EQ(evict_to(p, 3), SET2(0, 3) | (UINT64_C(1) << 5));
        /* 0: sum 1.5 over 5 steps, mean 0.3; 3: sum 1.2 over 2 steps, mean 0.6. */
        kept[k] = evict_to(p, 2);
        kve_policy_free(p);
    }
    ASSERT_U64_EQ(kept[0], SET2(0, 5));
    ASSERT_U64_EQ(kept[1], SET2(3, 5));
}

/* h2o_mean: a position never observed scores 0 (not 0/0); NULL steps do not
 * count as observations, zero rows do (and dilute the mean). */
static void test_mean_null_and_zero(void)
{
    /* Only NULL steps: every score 0, the oldest goes first: a window. */
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o_mean:budget=3,recent_window=1", NULL, &p));
    for (int32_t t = 0; t < 30; t++) {
        ASSERT_OK(feed(p, t, NULL));
        size_t nv = 0;
        ASSERT_OK(kve_policy_evict(p, 3, victims, MAXN, &nv));
        if (t >= 3)
            ASSERT_EQ(victims[0], t - 3);
    }
    kve_policy_free(p);

    /* 0: sum 2.0 over 5 steps (mean 0.4); 4: 0.6 over 1 step (mean 0.6).
     * Two NULL steps: means unchanged, 4 survives. Two zero rows: 0 -> 2/7,
     * 4 -> 0.6/3 = 0.2: 0 survives. */
    for (int zeros = 0; zeros < 2; zeros++) {
        ASSERT_OK(kve_policy_new("h2o_mean:budget=16,recent_window=1", NULL, &p));
        ASSERT_OK(feed(p, 0, NULL));
        ASSERT_OK(feed(p, 1, (const float[]){0.5f}));
        ASSERT_OK(feed(p, 2, (const float[]){0.5f, 0.0f}));
        ASSERT_OK(feed(p, 3, (const float[]){0.5f, 0.0f, 0.0f}));
        ASSERT_OK(feed(p, 4, (const float[]){0.5f, 0.0f, 0.0f, 0.0f}));
        ASSERT_OK(feed(p, 5, (const float[]){0.0f, 0.0f, 0.0f, 0.0f, 0.6f}));
        ASSERT_OK(zeros ? feed_zeros(p, 6) : feed(p, 6, NULL));
        ASSERT_OK(zeros ? feed_zeros(p, 7) : feed(p, 7, NULL));
        ASSERT_U64_EQ(evict_to(p, 2), zeros ? SET2(0, 7) : SET2(4, 7));
        kve_policy_free(p);
    }
}

/* Policies that ignore attention: a NULL row and any row give the same
 * victims (random: from generators in the same state). */
static void test_attention_ignored(void)
{
    static const char *const specs[] = {"full:budget=5", "window:budget=5",
                                        "streaming:budget=5,sinks=2",
                                        "random:budget=5,recent_window=1"};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        kve_rng ra, rb, g;
        kve_rng_seed(&ra, 99);
        kve_rng_seed(&rb, 99);
        kve_rng_seed(&g, check_seed);
        kve_policy *a = NULL, *b = NULL;
        ASSERT_OK(kve_policy_new(specs[s], &ra, &a));
        ASSERT_OK(kve_policy_new(specs[s], &rb, &b));
        int32_t va[MAXN];
        size_t na = 0, nb = 0;
        for (int32_t t = 0; t < 500; t++) {
            size_t n = kve_policy_size(a);
            for (size_t i = 0; i < n; i++)
                row[i] = (float)kve_rng_uniform(&g);
            ASSERT_OK(kve_policy_step(a, t, NULL, 0));
            ASSERT_OK(kve_policy_step(b, t, row, n));
            ASSERT_OK(kve_policy_evict(a, 5, va, MAXN, &na));
            ASSERT_OK(kve_policy_evict(b, 5, victims, MAXN, &nb));
            ASSERT_EQ(na, nb);
            ASSERT_TRUE(memcmp(va, victims, na * sizeof *va) == 0);
        }
        kve_policy_free(a);
        kve_policy_free(b);
    }
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_scissorhands_early_spike);
    RUN(test_scissorhands_strict);
    RUN(test_scissorhands_history);
    RUN(test_tova);
    RUN(test_decay_one_is_h2o);
    RUN(test_decay_forgets);
    RUN(test_mean_removes_age_bias);
    RUN(test_mean_null_and_zero);
    RUN(test_attention_ignored);
    return CHECK_DONE();
}
