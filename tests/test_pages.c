/* SPDX-License-Identifier: MIT */
/*
 * test_pages.c - eviction in whole pages (block=b) against the naive
 * page-level model of reference.h (pages sorted by (score, page), a
 * different algorithm from the library's repeated scans), on random
 * workloads for every policy that takes a block: ties, exact zeros, NULL
 * steps, positions that skip, steps without an evict, evictions to smaller
 * budgets. After every call: the same victims, count and kept set. Then:
 * block=1 is the plain policy bit for bit (spec, victims, state bytes);
 * whole pages only; the budget's page reserve refused at parse and at evict;
 * the victim capacity a page eviction needs; state bytes per page.
 * Deterministic per seed (printed; replay with argv[1]).
 */
#include "check.h"
#include "test_allocator.h"
#include "kvevict.h"
#include "reference.h"
#include "workload.h"

enum { MAXN = 1024, STEPS = 700 };

static const char *const page_specs[] = {
    "h2o:budget=8,recent_window=0,block=2",
    "h2o:budget=12,recent_window=2,block=3",
    "h2o:budget=40,recent_window=8,block=16",
    "h2o:budget=64,recent_window=8,block=16,block_mean=1",
    "h2o:budget=130,recent_window=32,block=64",
    "tova:budget=10,recent_window=1,block=4",
    "tova:budget=20,recent_window=0,block=5,block_mean=1",
    "scissorhands:budget=24,recent_window=3,block=4,history=7",
    "scissorhands:budget=16,recent_window=2,block=3",
    "h2o_decay:budget=20,recent_window=2,block=4,decay=0.5",
    "h2o_mean:budget=24,recent_window=1,block=6",
    "h2o_mean:budget=30,recent_window=4,block=8,block_mean=1",
    "window:budget=1,block=2",
    "window:budget=15,block=16",
    "window:budget=33,block=8",
    "streaming:budget=9,sinks=1,block=4",
    "streaming:budget=40,sinks=4,block=16",
    "streaming:budget=12,sinks=0,block=5",
    "streaming:budget=20,sinks=5,block=3",
};
enum { N_SPECS = sizeof page_specs / sizeof page_specs[0] };

static float attn[MAXN];
static int32_t lib_victims[MAXN], ref_victims[MAXN];

/* Steps policy and model with the same random row (or NULL), then (most of
 * the time) evicts both to `budget`; 0 and a message on any disagreement. */
static int drive(kve_policy *p, ref_policy *r, kve_rng *g, const float pool[4], int32_t *pos,
                 size_t budget, const char *spec)
{
    size_t n = kve_policy_size(p);
    int null_step = kve_rng_below(g, 10) == 0;
    for (size_t i = 0; i < n; i++)
        attn[i] = random_weight(g, pool, n);
    *pos += kve_rng_below(g, 6) == 0 ? 1 + (int32_t)kve_rng_below(g, 40) : 1;
    const float *a = null_step ? NULL : attn;
    if (kve_policy_step(p, *pos, a, n) != KVE_OK || ref_step(r, *pos, a, n) != 0) {
        fprintf(stderr, "%s: step at %d refused: %s\n", spec, *pos, kve_last_error());
        return 0;
    }
    if (kve_rng_below(g, 12) == 0)
        return 1; /* no evict: the next one removes more */
    size_t nl = 0, nr = 0;
    kve_status st = kve_policy_evict(p, budget, lib_victims, MAXN, &nl);
    if (st != KVE_OK || ref_evict(r, budget, ref_victims, &nr) != 0) {
        fprintf(stderr, "%s: evict to %zu refused: %s\n", spec, budget, kve_last_error());
        return 0;
    }
    if (nl != nr || memcmp(lib_victims, ref_victims, nl * sizeof *lib_victims) != 0) {
        fprintf(stderr, "%s: at pos %d to budget %zu: %zu victims, the model %zu\n", spec, *pos,
                budget, nl, nr);
        return 0;
    }
    if (kve_policy_size(p) != r->n || kve_policy_size(p) > budget)
        return 0;
    for (size_t i = 0; i < r->n; i++)
        if (kve_policy_positions(p)[i] != r->slot[i].pos)
            return 0;
    return 1;
}

static void test_pages_against_model(void)
{
    for (size_t s = 0; s < N_SPECS; s++) {
        kve_rng g;
        kve_rng_seed(&g, check_seed + s);
        const float pool[4] = {0.25f, 0.125f, 0.0625f, 0.5f};
        kve_policy *p = NULL;
        ASSERT_OK(kve_policy_new(page_specs[s], NULL, &p));
        ref_policy *r = ref_new(kve_policy_spec(p), NULL);
        ASSERT_TRUE(r != NULL);
        size_t budget = kve_policy_budget(p);
        int32_t pos = -1;
        for (size_t t = 0; t < STEPS; t++) {
            /* now and then a smaller budget, never below what pages need */
            size_t b = budget;
            if (kve_rng_below(&g, 8) == 0) {
                char probe[KVE_SPEC_MAX], num[24];
                size_t lower = budget - (size_t)kve_rng_below(&g, budget / 4 + 1);
                snprintf(num, sizeof num, "%zu", lower);
                if (lower >= 1 && kve_spec_with(page_specs[s], "budget", num, probe,
                                                sizeof probe) == KVE_OK)
                    b = lower;
            }
            if (!drive(p, r, &g, pool, &pos, b, page_specs[s])) {
                check_failures++;
                printf("FAIL: %s at step %zu (seed %llu)\n", page_specs[s], t,
                       (unsigned long long)(check_seed + s));
                break;
            }
        }
        ref_free(r);
        kve_policy_free(p);
    }
}

/* block=1 is the plain policy: the same canonical spec, and on one random
 * workload the same victims, sizes and state bytes. */
static void test_block_one_is_plain(void)
{
    static const char *const plain[] = {"h2o:budget=16,recent_window=4",
                                        "tova:budget=9,recent_window=1",
                                        "scissorhands:budget=12,recent_window=2,history=5",
                                        "h2o_decay:budget=10,recent_window=2,decay=0.75",
                                        "h2o_mean:budget=11,recent_window=3",
                                        "window:budget=7",
                                        "streaming:budget=9,sinks=2"};
    for (size_t s = 0; s < sizeof plain / sizeof plain[0]; s++) {
        char with[KVE_SPEC_MAX], canon[KVE_SPEC_MAX];
        ASSERT_OK(kve_spec_with(plain[s], "block", "1", with, sizeof with));
        ASSERT_OK(kve_spec_with(plain[s], NULL, NULL, canon, sizeof canon));
        ASSERT_STR_EQ(with, canon); /* block=1 is not spelled */
        char explicit_one[KVE_SPEC_MAX];
        snprintf(explicit_one, sizeof explicit_one, "%s,block=1", plain[s]);
        kve_policy *a = NULL, *b = NULL;
        ASSERT_OK(kve_policy_new(plain[s], NULL, &a));
        ASSERT_OK(kve_policy_new(explicit_one, NULL, &b));
        ASSERT_STR_EQ(kve_policy_spec(a), kve_policy_spec(b));
        kve_rng g;
        kve_rng_seed(&g, check_seed ^ s);
        const float pool[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
        int32_t va[MAXN], vb[MAXN];
        for (int32_t t = 0; t < 400; t++) {
            size_t n = kve_policy_size(a);
            for (size_t i = 0; i < n; i++)
                attn[i] = random_weight(&g, pool, n);
            ASSERT_OK(kve_policy_step(a, t, attn, n));
            ASSERT_OK(kve_policy_step(b, t, attn, n));
            size_t na = 0, nb = 0;
            ASSERT_OK(kve_policy_evict(a, kve_policy_budget(a), va, MAXN, &na));
            ASSERT_OK(kve_policy_evict(b, kve_policy_budget(b), vb, MAXN, &nb));
            ASSERT_EQ(na, nb);
            ASSERT_TRUE(memcmp(va, vb, na * sizeof *va) == 0);
            ASSERT_EQ(kve_policy_state_bytes(a), kve_policy_state_bytes(b));
        }
        kve_policy_free(a);
        kve_policy_free(b);
    }
}

/* With contiguous positions every kept page is whole and complete but the
 * newest; h2o keeps between budget - block + 1 and budget. */
static void test_whole_pages_only(void)
{
    kve_policy *p = NULL;
    talloc ta;
    talloc_init(&ta);
    kve_policy_options o = kve_policy_default_options();
    o.allocator = &ta.a;
    ASSERT_OK(kve_policy_new_ex("h2o:budget=72,recent_window=8,block=16", NULL, &o, &p));
    ASSERT_STR_EQ(kve_policy_spec(p), "h2o:budget=72,recent_window=8,block=16");
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    const float pool[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    int32_t v[MAXN];
    talloc_fail_after(&ta, 0); /* pages never allocate */
    for (int32_t t = 0; t < 600; t++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            attn[i] = random_weight(&g, pool, n);
        kve_status st = kve_policy_step(p, t, attn, n);
        size_t nv = 0;
        if (st == KVE_OK)
            st = kve_policy_evict(p, 72, v, MAXN, &nv);
        if (st != KVE_OK)
            talloc_fail_after(&ta, SIZE_MAX);
        ASSERT_OK(st);
        ASSERT_TRUE(nv == 0 || nv == 16);
        for (size_t i = 0; i < nv; i++) /* one page, in order */
            ASSERT_EQ(v[i], v[0] / 16 * 16 + (int32_t)i);
        n = kve_policy_size(p);
        ASSERT_TRUE(n <= 72 && (t < 72 || n >= 72 - 15));
        const int32_t *kp = kve_policy_positions(p);
        for (size_t i = 0; i < n;) { /* every page but the newest is whole */
            int32_t page = kp[i] / 16;
            size_t j = i;
            while (j < n && kp[j] / 16 == page)
                j++;
            if (page != t / 16)
                ASSERT_EQ(j - i, 16);
            i = j;
        }
    }
    ASSERT_EQ(talloc_fail_after(&ta, SIZE_MAX), 0);
    ASSERT_EQ(kve_policy_state_bytes(p), 73 * 13); /* a page is 16 slots of 13 bytes */
    kve_policy_free(p);
    talloc_check_empty(&ta);
}

static void test_page_refusals(void)
{
    kve_policy *p = NULL;
    /* the reserve: max(rw, b - 1) + b - 1 */
    ASSERT_STATUS(kve_policy_new("h2o:budget=45,recent_window=32,block=16", NULL, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "below 47");
    ASSERT_OK(kve_policy_new("h2o:budget=47,recent_window=32,block=16", NULL, &p));
    kve_policy_free(p);
    ASSERT_STATUS(kve_policy_new("h2o:budget=39,recent_window=4,block=21", NULL, &p), KVE_EINVAL);
    ASSERT_OK(kve_policy_new("h2o:budget=40,recent_window=4,block=21", NULL, &p));
    kve_policy_free(p);
    /* sinks + 2 * (block - 1) */
    ASSERT_STATUS(kve_policy_new("streaming:budget=9,sinks=4,block=4", NULL, &p), KVE_EINVAL);
    ASSERT_OK(kve_policy_new("streaming:budget=10,sinks=4,block=4", NULL, &p));
    kve_policy_free(p);
    ASSERT_STATUS(kve_policy_new("window:budget=6,block=8", NULL, &p), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_new("random:budget=8,block=2", NULL, &p), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_new("full:block=2", NULL, &p), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_new("h2o:block=0", NULL, &p), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_new("h2o:block_mean=2", NULL, &p), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_new("window:block_mean=1", NULL, &p), KVE_EINVAL);

    /* at evict: the budget's reserve, and room for up to need + block - 1 */
    ASSERT_OK(kve_policy_new("h2o:budget=20,recent_window=2,block=4", NULL, &p));
    for (int32_t t = 0; t < 23; t++)
        ASSERT_OK(kve_policy_step(p, t, NULL, 0));
    int32_t v[64];
    size_t nv = 99;
    ASSERT_STATUS(kve_policy_evict(p, 5, v, 64, &nv), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "block=4");
    ASSERT_STATUS(kve_policy_evict(p, 20, v, 5, &nv), KVE_ERANGE);
    ASSERT_CONTAINS(kve_last_error(), "up to 6 victims");
    ASSERT_EQ(nv, 99);
    ASSERT_EQ(kve_policy_size(p), 23);
    ASSERT_OK(kve_policy_evict(p, 20, v, 6, &nv));
    ASSERT_EQ(nv, 4); /* page 0: the lowest (all scores 0, ties to the lower page) */
    for (int32_t i = 0; i < 4; i++)
        ASSERT_EQ(v[i], i);
    kve_policy_free(p);
}

/* A bank of heads with pages is the same as its policies (the bank's path). */
static void test_bank_with_pages(void)
{
    const char *spec = "h2o:budget=24,recent_window=3,block=4";
    kve_bank *b = NULL;
    kve_policy *p[3] = {NULL, NULL, NULL};
    ASSERT_OK(kve_bank_new(spec, 3, NULL, &b));
    for (int h = 0; h < 3; h++)
        ASSERT_OK(kve_policy_new(spec, NULL, &p[h]));
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    const float pool[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    static float rows[3 * MAXN];
    int32_t bv[3 * 32], pv[32];
    size_t counts[3];
    for (int32_t t = 0; t < 300; t++) {
        size_t ld = 32;
        for (int h = 0; h < 3; h++)
            for (size_t i = 0; i < kve_bank_size(b, (size_t)h); i++)
                rows[(size_t)h * ld + i] = random_weight(&g, pool, kve_bank_size(b, (size_t)h));
        ASSERT_OK(kve_bank_step(b, t, rows, ld));
        ASSERT_OK(kve_bank_evict(b, 24, bv, 32, counts));
        for (int h = 0; h < 3; h++) {
            size_t nv = 0;
            ASSERT_OK(kve_policy_step(p[h], t, rows + (size_t)h * ld, kve_policy_size(p[h])));
            ASSERT_OK(kve_policy_evict(p[h], 24, pv, 32, &nv));
            ASSERT_EQ(nv, counts[h]);
            ASSERT_TRUE(memcmp(pv, bv + h * 32, nv * sizeof *pv) == 0);
        }
    }
    kve_bank_free(b);
    for (int h = 0; h < 3; h++)
        kve_policy_free(p[h]);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_pages_against_model);
    RUN(test_block_one_is_plain);
    RUN(test_whole_pages_only);
    RUN(test_page_refusals);
    RUN(test_bank_with_pages);
    return CHECK_DONE();
}
