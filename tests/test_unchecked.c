/* SPDX-License-Identifier: MIT */
/*
 * test_unchecked.c - policies and banks built unchecked (kvevict.h,
 * "Unchecked steps"): the option and its refusal; what an unchecked step
 * still refuses, with the checked step's status and message and nothing
 * changed; and what a broken promise does. Valid weights must give the same
 * bits checked or unchecked: tests/test_isa.c runs every workload both ways
 * on every instruction set, and tests/test_refusals.c every other refusal.
 *
 * Broken promises: every policy, on every instruction set, alone and in
 * banks with and without shared budgets, is fed rows mixing valid weights with NaN (both
 * signs), infinities, negative weights, the largest floats (whose sum over a
 * group overflows) and whole rows of NaN or +inf (no score below +inf: the
 * argmin's fallback), through grouped steps with every reduction, NULL
 * steps, steps without evicts and evictions to the budget, below it and
 * shared. The results are garbage by contract; what is checked after every
 * call is what the header promises still holds: the call succeeds, every
 * victim was kept and unprotected, victims ascend, counts add up (no count
 * below 0 or above the size), kept positions ascend, sizes stay within the
 * budget, and the cached victim is in range. make test runs this under
 * AddressSanitizer and UndefinedBehaviorSanitizer, which must stay silent.
 * Deterministic per seed (printed; argv[1]).
 */
#include "check.h"
#include "policy_impl.h"
#include "workload.h"

#include <float.h>

enum { H = 4, MAXG = 3, MAXN = 700, STEPS = 400, KD = 8 };

static const char *const isa_names[KVE_ISA_COUNT] = {"scalar", "avx2", "avx512"};

static float rows[H * MAXG * MAXN];
static float keys[H * KD];
static int32_t victims[H * MAXN];
static int32_t before[H][MAXN];
static size_t before_n[H];

/* ---- the option ---- */

static void test_option(void)
{
    ASSERT_EQ(kve_policy_default_options().unchecked, 0);
    ASSERT_EQ(kve_bank_default_options().unchecked, 0);
    static const int bad[] = {2, -1, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kve_policy_options po = kve_policy_default_options();
        po.unchecked = bad[i];
        kve_policy *p = (kve_policy *)&po, *sentinel = p;
        ASSERT_STATUS(kve_policy_new_ex("h2o", NULL, &po, &p), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "unchecked");
        ASSERT_TRUE(p == sentinel);
        kve_bank_options bo = kve_bank_default_options();
        bo.unchecked = bad[i];
        kve_bank *b = NULL;
        ASSERT_STATUS(kve_bank_new_ex("h2o", 2, NULL, &bo, &b), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "unchecked");
        ASSERT_TRUE(b == NULL);
    }
    /* Not part of the spec: a policy is the same policy either way. */
    kve_policy_options po = kve_policy_default_options();
    po.unchecked = 1;
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new_ex("h2o:budget=64", NULL, &po, &p));
    ASSERT_STR_EQ(kve_policy_spec(p), "h2o:budget=64,recent_window=32");
    kve_policy_free(p);
}

/* What the checked step refuses and the unchecked one accepts: the weights,
 * alone. Both see the same history; the message names the weight. */
static void test_weights_alone(void)
{
    static const float bad[] = {NAN, -NAN, INFINITY, -INFINITY, -1.0f, -0x1p-149f};
    kve_policy_options po = kve_policy_default_options();
    kve_policy *checked = NULL, *unchecked = NULL;
    ASSERT_OK(kve_policy_new_ex("h2o:budget=8,recent_window=2", NULL, &po, &checked));
    po.unchecked = 1;
    ASSERT_OK(kve_policy_new_ex("h2o:budget=8,recent_window=2", NULL, &po, &unchecked));
    float row[16];
    int32_t v[4];
    for (int32_t pos = 0; pos < 12; pos++) {
        size_t n = kve_policy_size(checked);
        for (size_t i = 0; i < n; i++)
            row[i] = 0.25f;
        ASSERT_OK(kve_policy_step(checked, pos, n ? row : NULL, n));
        ASSERT_OK(kve_policy_step(unchecked, pos, n ? row : NULL, n));
        ASSERT_OK(kve_policy_evict(checked, 8, v, 4, NULL));
        ASSERT_OK(kve_policy_evict(unchecked, 8, v, 4, NULL));
    }
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        size_t n = kve_policy_size(checked);
        row[k % n] = bad[k];
        ASSERT_STATUS(kve_policy_step(checked, 100 + (int32_t)k, row, n), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "attn[");
        ASSERT_EQ(kve_policy_size(checked), n);
        ASSERT_OK(kve_policy_step(unchecked, 100 + (int32_t)k, row, n));
        ASSERT_EQ(kve_policy_size(unchecked), n + 1);
        size_t nv = 9;
        ASSERT_OK(kve_policy_evict(unchecked, 8, v, 4, &nv));
        ASSERT_EQ(nv, 1);
        row[k % n] = 0.25f;
    }
    kve_policy_free(checked);
    kve_policy_free(unchecked);

    /* A sum over a group that overflows float32: refused checked only. */
    kve_bank_options bo = kve_bank_default_options();
    kve_bank *bc = NULL, *bu = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=4,recent_window=1", 1, NULL, &bo, &bc));
    bo.unchecked = 1;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=4,recent_window=1", 1, NULL, &bo, &bu));
    for (int32_t pos = 0; pos < 3; pos++) {
        ASSERT_OK(kve_bank_step(bc, pos, NULL, 0));
        ASSERT_OK(kve_bank_step(bu, pos, NULL, 0));
    }
    float two[2 * 3] = {1.0f, FLT_MAX, 1.0f, 1.0f, FLT_MAX, 1.0f};
    ASSERT_STATUS(kve_bank_step_range(bc, 0, 1, 3, two, 3, 2, KVE_REDUCE_SUM, NULL, 0),
                  KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "overflows");
    ASSERT_OK(kve_bank_step_range(bu, 0, 1, 3, two, 3, 2, KVE_REDUCE_SUM, NULL, 0));
    ASSERT_EQ(kve_bank_size(bc, 0), 3);
    ASSERT_EQ(kve_bank_size(bu, 0), 4);
    kve_bank_free(bc);
    kve_bank_free(bu);
}

/* A bank's other refusals, unchecked: the checked twin's status and
 * message, and no head changed. */
static void test_bank_still_checks(void)
{
    kve_bank *b[2] = {NULL, NULL};
    kve_bank_options bo = kve_bank_default_options();
    bo.key_dim = KD;
    for (int u = 0; u < 2; u++) {
        bo.unchecked = u;
        ASSERT_OK(kve_bank_new_ex("knorm:budget=6,recent_window=1", 2, NULL, &bo, &b[u]));
        for (int32_t pos = 0; pos < 5; pos++) {
            for (size_t j = 0; j < 2 * KD; j++)
                keys[j] = (float)(j % 5) - 1.5f + (float)pos;
            ASSERT_OK(kve_bank_step_range(b[u], 0, 2, pos, NULL, 0, 1, KVE_REDUCE_MEAN, keys, KD));
        }
    }
    for (size_t j = 0; j < sizeof rows / sizeof rows[0]; j++)
        rows[j] = NAN; /* refused checked; never reached by the refusals below */
    float nan_key[2 * KD];
    for (size_t j = 0; j < 2 * KD; j++)
        nan_key[j] = j == KD + 3 ? NAN : 1.0f;
    for (int c = 0; c < 9; c++) {
        char msg[2][256];
        kve_status st[2];
        for (int u = 0; u < 2; u++) {
            kve_bank *x = b[u];
            switch (c) {
            case 0: st[u] = kve_bank_step_range(x, 0, 2, -1, NULL, 0, 1, KVE_REDUCE_MEAN, keys, KD); break;
            case 1: st[u] = kve_bank_step_range(x, 0, 2, 4, NULL, 0, 1, KVE_REDUCE_MEAN, keys, KD); break;
            case 2: st[u] = kve_bank_step_range(x, 0, 2, 9, rows, 4, 1, KVE_REDUCE_MEAN, keys, KD); break;
            case 3: st[u] = kve_bank_step_range(x, 0, 2, 9, rows, 5, 0, KVE_REDUCE_MEAN, keys, KD); break;
            case 4: st[u] = kve_bank_step_range(x, 0, 2, 9, rows, 5, 1, (kve_reduce)7, keys, KD); break;
            case 5: st[u] = kve_bank_step_range(x, 1, 2, 9, rows, 5, 1, KVE_REDUCE_MEAN, keys, KD); break;
            case 6: st[u] = kve_bank_step_range(x, 0, 2, 9, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0); break;
            case 7: st[u] = kve_bank_step_range(x, 0, 2, 9, NULL, 0, 1, KVE_REDUCE_MEAN, keys, KD - 1); break;
            default: st[u] = kve_bank_step_range(x, 0, 2, 9, NULL, 0, 1, KVE_REDUCE_MEAN, nan_key, KD); break;
            }
            snprintf(msg[u], sizeof msg[u], "%s", kve_last_error());
        }
        ASSERT_EQ(st[0], KVE_EINVAL);
        ASSERT_EQ(st[1], KVE_EINVAL);
        ASSERT_STR_EQ(msg[1], msg[0]);
        for (size_t h = 0; h < 2; h++) {
            ASSERT_EQ(kve_bank_size(b[1], h), 5);
            ASSERT_TRUE(memcmp(kve_bank_positions(b[0], h), kve_bank_positions(b[1], h),
                               5 * sizeof(int32_t)) == 0);
        }
    }
    kve_bank_free(b[0]);
    kve_bank_free(b[1]);
}

/* ---- broken promises ---- */

/* A weight that breaks the promise, or a valid one. */
static float bad_weight(kve_rng *g, size_t n)
{
    static const float bad[] = {NAN, -NAN, INFINITY, -INFINITY, -1.0f, -FLT_MAX, FLT_MAX,
                                -0x1p-149f, -0.0f, 1e30f};
    static const float pool[4] = {0.5f, 0.25f, 1.0f, 0.125f};
    uint64_t k = kve_rng_below(g, 16);
    if (k < sizeof bad / sizeof bad[0])
        return bad[k];
    return random_weight(g, pool, n ? n : 1);
}

/* Fills the rows of one step: per row, all valid, all NaN, all +inf, or a
 * mix. */
static void garbage_rows(kve_rng *g, size_t nrows, size_t ld)
{
    for (size_t r = 0; r < nrows; r++) {
        uint64_t kind = kve_rng_below(g, 6);
        for (size_t i = 0; i < ld; i++)
            rows[r * ld + i] = kind == 0   ? (float)kve_rng_uniform(g)
                               : kind == 1 ? NAN
                               : kind == 2 ? INFINITY
                                           : bad_weight(g, ld);
    }
}

/* Every head of b as policy_impl.h promises between calls: the kept
 * positions ascend, the gap and a cached victim are in range. */
static void check_heads(const kve_bank *b, const char *spec, int step)
{
    const size_t rw = b->cfg.params.recent_window;
    for (size_t h = 0; h < b->n_heads; h++) {
        const kve_head *hd = &b->heads[h];
        const int32_t *pos = kve_bank_positions(b, h);
        size_t n = kve_bank_size(b, h);
        if (n > hd->cap)
            CHECK_FAIL_AT("%s: step %d head %zu: size %zu above cap %zu", spec, step, h, n, hd->cap);
        for (size_t i = 1; i < n; i++)
            if (pos[i - 1] >= pos[i])
                CHECK_FAIL_AT("%s: step %d head %zu: kept positions not ascending at %zu", spec,
                              step, h, i);
        if (hd->gap != KVE_NONE && hd->gap >= n)
            CHECK_FAIL_AT("%s: step %d head %zu: gap %zu, size %zu", spec, step, h, hd->gap, n);
        if (hd->best != KVE_NONE && (n <= rw || hd->best >= n - rw))
            CHECK_FAIL_AT("%s: step %d head %zu: cached victim %zu of %zu kept (window %zu)", spec,
                          step, h, hd->best, n, rw);
    }
}

/* After an evict of every head: counts add up and every victim was kept
 * before, unprotected, ascending. */
static void check_victims(const kve_bank *b, const size_t *counts, size_t ld_victims,
                          const char *spec, int step)
{
    const size_t rw = b->cfg.params.recent_window;
    for (size_t h = 0; h < b->n_heads; h++) {
        size_t n = kve_bank_size(b, h), c = counts[h];
        if (c > before_n[h] || n != before_n[h] - c || c > ld_victims)
            CHECK_FAIL_AT("%s: step %d head %zu: %zu victims of %zu kept, %zu left", spec, step, h,
                          c, before_n[h], n);
        const int32_t *v = victims + h * ld_victims;
        size_t k = 0; /* walks the kept set of before the evict */
        for (size_t i = 0; i < c; i++) {
            if (i && v[i - 1] >= v[i])
                CHECK_FAIL_AT("%s: step %d head %zu: victims not ascending", spec, step, h);
            while (k < before_n[h] && before[h][k] != v[i])
                k++;
            if (k == before_n[h] || k + rw >= before_n[h])
                CHECK_FAIL_AT("%s: step %d head %zu: victim %ld was not an unprotected kept "
                              "position", spec, step, h, (long)v[i]);
        }
    }
}

static void snapshot(const kve_bank *b)
{
    for (size_t h = 0; h < b->n_heads; h++) {
        before_n[h] = kve_bank_size(b, h);
        memcpy(before[h], kve_bank_positions(b, h), before_n[h] * sizeof(int32_t));
    }
}

/* One garbage workload on the current instruction set; share: heads per
 * shared group (0: none). */
static void garbage(const char *spec, size_t dim, size_t share, uint64_t seed)
{
    const int failures = check_failures;
    kve_rng rb, g;
    kve_rng_seed(&rb, seed);
    kve_rng_seed(&g, seed ^ 0x5eed);
    kve_bank_options o = kve_bank_default_options();
    o.key_dim = dim;
    o.share = share;
    o.unchecked = 1;
    kve_bank *b = NULL;
    if (kve_bank_new_ex(spec, H, &rb, &o, &b) != KVE_OK)
        CHECK_FAIL_AT("%s: %s", spec, kve_last_error());
    const size_t budget = kve_bank_budget(b);
    const size_t rw = b->cfg.params.recent_window;
    const size_t least = (rw > b->cfg.params.sinks ? rw : b->cfg.params.sinks) + 1;
    size_t reserve = kve__page_reserve(&b->cfg);
    for (int s = 0; s < STEPS; s++) {
        size_t n = 0;
        for (size_t h = 0; h < H; h++)
            n = kve_bank_size(b, h) > n ? kve_bank_size(b, h) : n;
        if (n + 2 >= MAXN)
            break;
        size_t group = 1 + (size_t)kve_rng_below(&g, MAXG);
        kve_reduce reduce = (kve_reduce)kve_rng_below(&g, 3);
        garbage_rows(&g, H * group, n);
        for (size_t j = 0; j < H * dim; j++)
            keys[j] = (float)(kve_rng_uniform(&g) * 2.0 - 1.0);
        const float *attn = kve_rng_below(&g, 8) ? rows : NULL;
        kve_status st = kve_bank_step_range(b, 0, H, s, attn, n, group, reduce,
                                            dim ? keys : NULL, KD);
        if (st != KVE_OK)
            CHECK_FAIL_AT("%s: step %d: %s", spec, s, kve_last_error());
        check_heads(b, spec, s);
        if (check_failures != failures)
            break;
        if (kve_rng_below(&g, 10) == 0)
            continue; /* no evict: the next step has more to read, or grows */
        size_t to = budget;
        if (kve_rng_below(&g, 8) == 0) {
            size_t lo = least > reserve ? least : reserve;
            to = lo < budget ? lo + (size_t)kve_rng_below(&g, budget - lo + 1) : budget;
        }
        size_t counts[H];
        snapshot(b);
        if (share && kve_rng_below(&g, 2)) {
            size_t shared = share * to;
            st = kve_bank_evict_shared(b, 0, H, shared > share * rw ? shared : share * rw + 1,
                                       victims, MAXN, counts);
        } else {
            st = kve_bank_evict(b, to, victims, MAXN, counts);
        }
        if (st != KVE_OK)
            CHECK_FAIL_AT("%s: evict at step %d: %s", spec, s, kve_last_error());
        check_victims(b, counts, MAXN, spec, s);
        check_heads(b, spec, s);
        if (check_failures != failures)
            break;
    }
    kve_bank_free(b);
}

/* The same garbage through a policy: one head, stepped with
 * kve_policy_step_keys and evicted with kve_policy_evict (the step compiled
 * for one head, not the bank's loop). */
static void garbage_policy(const char *spec, size_t dim, uint64_t seed)
{
    const int failures = check_failures;
    kve_rng rp, g;
    kve_rng_seed(&rp, seed);
    kve_rng_seed(&g, seed ^ 0x9011c7);
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = dim;
    o.unchecked = 1;
    kve_policy *p = NULL;
    if (kve_policy_new_ex(spec, &rp, &o, &p) != KVE_OK)
        CHECK_FAIL_AT("%s (policy): %s", spec, kve_last_error());
    const kve_bank *b = &p->bank;
    const size_t budget = kve_policy_budget(p);
    kve_status st = KVE_OK;
    for (int s = 0; s < STEPS && st == KVE_OK && check_failures == failures; s++) {
        size_t n = kve_policy_size(p);
        if (n + 2 >= MAXN)
            break;
        garbage_rows(&g, 1, n);
        for (size_t j = 0; j < dim; j++)
            keys[j] = (float)(kve_rng_uniform(&g) * 2.0 - 1.0);
        const float *attn = kve_rng_below(&g, 8) ? rows : NULL;
        st = kve_policy_step_keys(p, s, attn, n, dim ? keys : NULL);
        if (st != KVE_OK)
            break;
        check_heads(b, spec, s);
        if (check_failures != failures || kve_rng_below(&g, 10) == 0)
            continue; /* no evict: the next step has more to read */
        size_t count = 0;
        snapshot(b);
        st = kve_policy_evict(p, budget, victims, MAXN, &count);
        if (st != KVE_OK)
            break;
        check_victims(b, &count, MAXN, spec, s);
        if (check_failures == failures)
            check_heads(b, spec, s);
    }
    if (st != KVE_OK)
        fprintf(stderr, "%s (policy): %s\n", spec, kve_last_error());
    kve_policy_free(p);
    if (st != KVE_OK)
        CHECK_FAIL_AT("%s (policy): a call refused: %s", spec, kve_status_name(st));
}

static void test_broken_promises(void)
{
    static const char *const large[] = {
        "h2o:budget=300,recent_window=7",        "tova:budget=129,recent_window=0",
        "h2o_decay:budget=257,recent_window=0",  "h2o_mean:budget=200,recent_window=3",
        "scissorhands:budget=150,history=64",     "h2o:budget=120,recent_window=3,block=4",
        "tova:budget=64,recent_window=0,block=8,block_mean=1",
    };
    size_t n_small = sizeof workload_specs / sizeof workload_specs[0];
    size_t n_large = sizeof large / sizeof large[0];
    int paths = 0, failures = check_failures;
    for (int isa = 0; isa < KVE_ISA_COUNT; isa++) {
        if (!kve__isa_force((kve_isa)isa)) {
            printf("  (%s: not supported by this CPU, skipped)\n", isa_names[isa]);
            continue;
        }
        paths++;
        for (size_t i = 0; i < n_small + n_large; i++) {
            const char *spec = i < n_small ? workload_specs[i] : large[i - n_small];
            size_t dim = i < n_small ? workload_key_dim(spec, i) : 0;
            dim = dim > KD ? KD : dim;
            if (i < n_small && strncmp(spec, "keydiff", 7) == 0 && dim == 0)
                dim = 1;
            garbage(spec, dim, 0, check_seed + i);
            garbage_policy(spec, dim, check_seed + 2000 + i);
            kve_bank *probe = NULL;
            kve_bank_options o = kve_bank_default_options();
            o.key_dim = dim;
            o.share = 2;
            if (kve_bank_new_ex(spec, H, NULL, &o, &probe) == KVE_OK) /* scored, no pages */
                garbage(spec, dim, 2, check_seed + 1000 + i);
            kve_bank_free(probe);
            if (check_failures != failures) {
                kve__isa_force(KVE_ISA_COUNT);
                CHECK_FAIL_AT("on %s (seed %" PRIu64 ")", isa_names[isa], check_seed);
            }
        }
    }
    ASSERT_TRUE(kve__isa_force(KVE_ISA_COUNT));
    printf("  %d instruction set(s)\n", paths);
}

/* The argmin's fallback on its own: a row of NaN or +inf leaves no score
 * below +inf, and the victim is still a kept, unprotected position. */
static void test_no_finite_score(void)
{
    static const float fill[] = {NAN, INFINITY};
    for (int isa = 0; isa < KVE_ISA_COUNT; isa++) {
        if (!kve__isa_force((kve_isa)isa))
            continue;
        for (size_t f = 0; f < 2; f++) {
            kve_policy_options po = kve_policy_default_options();
            po.unchecked = 1;
            kve_policy *p = NULL;
            ASSERT_OK(kve_policy_new_ex("tova:budget=100,recent_window=0", NULL, &po, &p));
            static float row[128];
            int32_t v[4];
            for (int32_t pos = 0; pos < 140; pos++) {
                size_t n = kve_policy_size(p);
                for (size_t i = 0; i < n; i++)
                    row[i] = fill[f];
                ASSERT_OK(kve_policy_step(p, pos, n ? row : NULL, n));
                size_t nv = 0;
                ASSERT_OK(kve_policy_evict(p, 100, v, 4, &nv));
                ASSERT_EQ(nv, pos >= 100);
                if (nv)
                    ASSERT_TRUE(v[0] >= 0 && v[0] <= pos); /* the newcomer may go: no window */
                ASSERT_TRUE(kve_policy_size(p) <= 100);
            }
            kve_policy_free(p);
        }
    }
    ASSERT_TRUE(kve__isa_force(KVE_ISA_COUNT));
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_option);
    RUN(test_weights_alone);
    RUN(test_bank_still_checks);
    RUN(test_no_finite_score);
    RUN(test_broken_promises);
    return CHECK_DONE();
}
