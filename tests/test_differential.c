/* SPDX-License-Identifier: MIT */
/*
 * test_differential.c - every policy against the naive model of reference.h
 * on thousands of random steps, compared after every call.
 *
 * The attention rows are built to hit the cases where a fast implementation
 * and a sort can disagree: exact zeros, ties (weights drawn from a small pool
 * of repeated values), occasional NULL rows, runs of steps without an evict
 * (storage growth), evictions to smaller budgets than the spec's (several
 * victims at once), gaps between positions. Statuses, victim lists (order
 * included) and the kept set must agree bit for bit after every call.
 * Deterministic for a given seed (printed; replay with argv[1]).
 */
#include "check.h"
#include "kvevict.h"
#include "reference.h"
#include "workload.h"

enum { STEPS = 1500, MAX_KEPT = 4096, MAX_DIM = 64 };

static float attn_buf[MAX_KEPT];
static float key_pool[4 * MAX_DIM], key_buf[MAX_DIM];
static int32_t lib_victims[MAX_KEPT], ref_victims[MAX_KEPT];

/* Compares the kept sets; returns 0 on a mismatch after reporting it. */
static int same_kept(const kve_policy *p, const ref_policy *r, const char *spec, int32_t pos)
{
    size_t n = kve_policy_size(p);
    const int32_t *kept = kve_policy_positions(p);
    if (n != r->n) {
        fprintf(stderr, "%s: at pos %ld size %zu, reference %zu\n", spec, (long)pos, n, r->n);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (kept[i] != r->slot[i].pos) {
            fprintf(stderr, "%s: at pos %ld kept[%zu] = %ld, reference %ld\n", spec, (long)pos, i,
                    (long)kept[i], (long)r->slot[i].pos);
            return 0;
        }
    return 1;
}

/* Runs `spec` with keys of `dim` floats on every step (0: no keys). */
static void run_spec(const char *spec, size_t dim, uint64_t seed, int steps)
{
    kve_rng g, lib_rng, ref_rng;
    kve_rng_seed(&g, seed);
    kve_rng_seed(&lib_rng, seed ^ 0x5eed);
    kve_rng_seed(&ref_rng, seed ^ 0x5eed);
    kve_policy *p = NULL;
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = dim;
    ASSERT_OK(kve_policy_new_ex(spec, &lib_rng, &o, &p));
    ASSERT_EQ(kve_policy_key_dim(p), dim);
    ref_policy *r = ref_new_keys(kve_policy_spec(p), &ref_rng, dim);
    ASSERT_TRUE(r != NULL);
    ASSERT_TRUE(memcmp(&lib_rng, &ref_rng, sizeof lib_rng) == 0);

    size_t budget = kve_policy_budget(p);
    size_t floor = r->recent_window > r->sinks ? r->recent_window : r->sinks;
    float pool[4];
    int32_t pos = -1;
    size_t evictions = 0, multi = 0, null_rows = 0;
    for (int s = 0; s < steps; s++) {
        /* Now and then a call both must refuse: a repeated position, or an
         * evict to the floor (recent_window / sinks) or to 0. */
        if (pos >= 0 && kve_rng_below(&g, 50) == 0) {
            ASSERT_STATUS(kve_policy_step(p, pos, NULL, 0), KVE_EINVAL);
            ASSERT_EQ(ref_step(r, pos, NULL, 0), -1);
            ASSERT_STATUS(kve_policy_evict(p, floor, lib_victims, MAX_KEPT, NULL), KVE_EINVAL);
            ASSERT_EQ(ref_evict(r, floor, ref_victims, NULL), -1);
            if (dim) { /* a NaN in the key */
                for (size_t j = 0; j < dim; j++)
                    key_buf[j] = 1.0f;
                key_buf[kve_rng_below(&g, dim)] = NAN;
                ASSERT_STATUS(kve_policy_step_keys(p, pos + 1, NULL, 0, key_buf), KVE_EINVAL);
                ASSERT_EQ(ref_step_keys(r, pos + 1, NULL, 0, key_buf), -1);
            }
            if (kve_policy_reads(p) & KVE_READS_KEYS) { /* no key at all */
                ASSERT_STATUS(kve_policy_step(p, pos + 1, NULL, 0), KVE_EINVAL);
                ASSERT_EQ(ref_step(r, pos + 1, NULL, 0), -1);
            }
        }
        pos += kve_rng_below(&g, 10) == 0 ? (int32_t)(2 + kve_rng_below(&g, 5)) : 1;
        if (s % 50 == 0) {
            for (int k = 0; k < 4; k++)
                pool[k] = (float)kve_rng_uniform(&g);
            for (size_t j = 0; j < 4 * dim; j++)
                key_pool[j] = (float)(kve_rng_uniform(&g) * 2.0 - 1.0);
        }
        size_t n = kve_policy_size(p);
        const float *attn = NULL;
        if (kve_rng_below(&g, 20) != 0) {
            for (size_t i = 0; i < n; i++)
                attn_buf[i] = random_weight(&g, pool, n);
            attn = attn_buf;
        } else {
            null_rows++;
        }
        const float *key = NULL;
        if (dim) {
            random_key(&g, key_pool, dim, key_buf);
            key = key_buf;
        }
        ASSERT_OK(kve_policy_step_keys(p, pos, attn, n, key));
        ASSERT_EQ(ref_step_keys(r, pos, attn, n, key), 0);
        if (!same_kept(p, r, spec, pos))
            CHECK_FAIL_AT("%s: kept sets differ after step (seed %" PRIu64 ")", spec, seed);

        /* Mostly evict to the budget; sometimes skip (growth), or cut up to 8
         * below it (several victims at once; the floor is the smallest legal). */
        uint64_t what = kve_rng_below(&g, 100);
        if (what < 8 && kve_policy_size(p) < 3 * budget + 8)
            continue;
        size_t b = budget;
        if (what == 8 && budget > floor + 1) {
            size_t room = budget - floor - 1;
            b = budget - 1 - (size_t)kve_rng_below(&g, room < 8 ? room : 8);
        }
        size_t nl = SIZE_MAX, nr = SIZE_MAX;
        ASSERT_OK(kve_policy_evict(p, b, lib_victims, MAX_KEPT, &nl));
        ASSERT_EQ(ref_evict(r, b, ref_victims, &nr), 0);
        if (nl != nr)
            CHECK_FAIL_AT("%s: at pos %ld %zu victims, reference %zu (seed %" PRIu64 ")", spec,
                          (long)pos, nl, nr, seed);
        for (size_t i = 0; i < nl; i++)
            if (lib_victims[i] != ref_victims[i])
                CHECK_FAIL_AT("%s: at pos %ld victim[%zu] = %ld, reference %ld (seed %" PRIu64 ")",
                              spec, (long)pos, i, (long)lib_victims[i], (long)ref_victims[i], seed);
        if (!same_kept(p, r, spec, pos))
            CHECK_FAIL_AT("%s: kept sets differ after evict (seed %" PRIu64 ")", spec, seed);
        evictions += nl != 0;
        multi += nl > 1;
    }
    /* The run must have exercised what it claims to. */
    ASSERT_TRUE(null_rows > 0);
    if (strncmp(spec, "full", 4) != 0) {
        if (evictions <= (size_t)steps / 10)
            CHECK_FAIL_AT("%s: only %zu evictions", spec, evictions);
        ASSERT_TRUE(multi > 0);
    }
    ref_free(r);
    kve_policy_free(p);
}

static void test_all_policies_match_reference(void)
{
    for (size_t i = 0; i < sizeof workload_specs / sizeof workload_specs[0]; i++) {
        int before = check_failures;
        run_spec(workload_specs[i], workload_key_dim(workload_specs[i], i), check_seed + i, STEPS);
        if (check_failures != before)
            return;
    }
}

/* The same run with the library's defaults (the budget-512 steady state). */
static void test_default_specs_match_reference(void)
{
    for (size_t t = 0; t < kve_policy_type_count(); t++) {
        int before = check_failures;
        /* expected_attention has no model in reference.h: it is held to its
         * numpy reference by test_methods.c */
        if (kve_policy_type_reads(t) & KVE_READS_QUERIES)
            continue;
        size_t dim = kve_policy_type_reads(t) & KVE_READS_KEYS ? 24 : 0;
        run_spec(kve_policy_type_name(t), dim, check_seed * 31 + t, 800);
        if (check_failures != before)
            return;
    }
}

/* The reference's own sanity: a sort by (score, pos) on a hand case. */
static void test_reference_hand_case(void)
{
    ref_policy *r = ref_new("h2o:budget=2,recent_window=1", NULL);
    ASSERT_TRUE(r != NULL);
    const float a1[] = {0.5f}, a2[] = {0.25f, 0.25f}, a3[] = {0.0f, 0.5f, 1.0f};
    int32_t v[4];
    size_t nv = 0;
    ASSERT_EQ(ref_step(r, 0, NULL, 0), 0);
    ASSERT_EQ(ref_step(r, 1, a1, 1), 0);
    ASSERT_EQ(ref_step(r, 2, a2, 2), 0);
    ASSERT_EQ(ref_step(r, 3, a3, 3), 0);
    /* scores: pos0 0.75, pos1 0.75, pos2 1.0, pos3 new (protected). Cut to 2:
     * two of {0, 1, 2} go: 0 and 1 (tie to the lower, then the next). */
    ASSERT_EQ(ref_evict(r, 2, v, &nv), 0);
    ASSERT_EQ(nv, 2);
    ASSERT_EQ(v[0], 0);
    ASSERT_EQ(v[1], 1);
    ASSERT_EQ(r->n, 2);
    ASSERT_EQ(r->slot[0].pos, 2);
    ASSERT_EQ(ref_evict(r, 1, v, &nv), -1); /* budget <= recent_window */
    ASSERT_EQ(ref_step(r, 3, NULL, 0), -1); /* not increasing */
    ref_free(r);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_reference_hand_case);
    RUN(test_all_policies_match_reference);
    RUN(test_default_specs_match_reference);
    return CHECK_DONE();
}
