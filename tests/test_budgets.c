/* SPDX-License-Identifier: MIT */
/*
 * test_budgets.c - budgets where they matter.
 *
 * Shared budgets: a bank with share = G against the naive global selection
 * of reference.h (every unprotected slot of a group sorted by (score, head,
 * position), taken in order while a head is above its floor), on random
 * workloads for every scored policy: ties and exact zeros, NULL steps,
 * steps without an evict (the group's storage grows), budgets below and
 * above the bank's, uniform evicts mixed in, floors from min_share 0 to 1.
 * After every eviction the victims, counts and kept sets agree, the group's
 * sizes add up to its budget whenever it had to lose something, and no head
 * is below its floor unless it was before, on every instruction set the
 * machine runs (the first candidates come from the step's pass). Then: ties
 * by hand; every refusal,
 * each changing nothing (checked by carrying on against the model); no
 * allocation in the steady state and all-or-nothing growth (the allocation
 * test allocator); state bytes; construction checks.
 * Layer schedules: hand-computed budgets (uniform, PyramidKV, weighted),
 * the apportionment's properties on random weights, refusals.
 * The harness on several heads (kve_eval with a count of heads): without
 * sharing each head's numbers are those of its one-head evaluation, bit for
 * bit; sharing, the heads' mean kept sizes add up to the group's budget;
 * score_after moves the scored steps; refusals.
 * Deterministic per seed (printed; replay with argv[1]).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "test_allocator.h"
#include "internal.h"
#include "kernels.h"  /* kve__isa_force */
#include "kvevict_eval.h"
#include "eval_options.h"
#include "npy_file.h"
#include "reference.h"
#include "tmpdir.h"
#include "workload.h"

enum { MAXG = 4, GROUPS = 2, MAXH = MAXG * GROUPS, LD = 512, STEPS = 400, KEY_DIM = 6 };

static const char *const shared_specs[] = {
    "h2o:budget=8,recent_window=0",
    "h2o:budget=16,recent_window=2",
    "h2o:budget=40,recent_window=8",
    "tova:budget=10,recent_window=1",
    "scissorhands:budget=12,recent_window=1,history=5",
    "scissorhands:budget=9,recent_window=0",
    "h2o_decay:budget=12,recent_window=2,decay=0.9",
    "h2o_mean:budget=10,recent_window=1",
    "knorm:budget=10,recent_window=1", /* these two read the keys every step carries */
    "keydiff:budget=12,recent_window=2",
};
enum { N_SPECS = sizeof shared_specs / sizeof shared_specs[0] };
static const double min_shares[] = {0.0, 0.2, 0.5, 1.0};

static float rows[MAXH * LD];
static float keys[MAXH * KEY_DIM];
static int32_t lib_v[MAXH * LD], ref_v[MAXH * LD];
static size_t lib_n[MAXH], ref_n[MAXH];

/* A shared bank and its model: one ref_policy per head. */
typedef struct pair {
    kve_bank *b;
    ref_policy *r[MAXH];
    size_t heads, G, budget;
    double min_share;
    int32_t pos;
    kve_rng g;
    float pool[4];
} pair;

static int pair_new(pair *p, const char *spec, size_t G, double min_share, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    kve_bank_options o = kve_bank_default_options();
    o.share = G;
    o.min_share = min_share;
    o.key_dim = KEY_DIM;
    p->G = G;
    p->heads = G * GROUPS;
    p->min_share = min_share;
    p->pos = -1;
    kve_rng_seed(&p->g, seed);
    for (int k = 0; k < 4; k++)
        p->pool[k] = (float)(k + 1) / 16.0f;
    if (kve_bank_new_ex(spec, p->heads, NULL, &o, &p->b) != KVE_OK)
        return 0;
    p->budget = kve_bank_budget(p->b);
    for (size_t h = 0; h < p->heads; h++)
        if (!(p->r[h] = ref_new_keys(kve_bank_spec(p->b), NULL, KEY_DIM)))
            return 0;
    return 1;
}

static void pair_free(pair *p)
{
    kve_bank_free(p->b);
    for (size_t h = 0; h < p->heads; h++)
        ref_free(p->r[h]);
}

static int same_kept(const pair *p, const char *when)
{
    for (size_t h = 0; h < p->heads; h++) {
        size_t n = kve_bank_size(p->b, h);
        if (n != p->r[h]->n) {
            fprintf(stderr, "%s: %s: head %zu keeps %zu, the model %zu\n", kve_bank_spec(p->b),
                    when, h, n, p->r[h]->n);
            return 0;
        }
        for (size_t i = 0; i < n; i++)
            if (kve_bank_positions(p->b, h)[i] != p->r[h]->slot[i].pos) {
                fprintf(stderr, "%s: %s: head %zu slot %zu differs\n", kve_bank_spec(p->b), when,
                        h, i);
                return 0;
            }
    }
    return 1;
}

/* One step of group gi (its heads' random rows, or NULL), model too. */
static int step_group(pair *p, size_t gi, int32_t pos, int null_step)
{
    size_t first = gi * p->G;
    for (size_t j = 0; j < p->G; j++) {
        size_t n = kve_bank_size(p->b, first + j);
        for (size_t i = 0; i < n; i++)
            rows[j * LD + i] = random_weight(&p->g, p->pool, n);
    }
    for (size_t j = 0; j < p->G * KEY_DIM; j++)
        keys[j] = (float)kve_rng_uniform(&p->g) - 0.5f;
    const float *a = null_step ? NULL : rows;
    if (kve_bank_step_range(p->b, first, p->G, pos, a, LD, 1, KVE_REDUCE_MEAN, keys, KEY_DIM) !=
        KVE_OK) {
        fprintf(stderr, "step: %s\n", kve_last_error());
        return 0;
    }
    for (size_t j = 0; j < p->G; j++)
        if (ref_step_keys(p->r[first + j], pos, a ? rows + j * LD : NULL, p->r[first + j]->n,
                          keys + j * KEY_DIM) != 0)
            return 0;
    return 1;
}

/* Shared evict of group gi to B, against the model; checks sizes and floors. */
static int evict_group(pair *p, size_t gi, size_t B)
{
    size_t first = gi * p->G, before[MAXG], total = 0;
    for (size_t j = 0; j < p->G; j++)
        total += before[j] = kve_bank_size(p->b, first + j);
    if (kve_bank_evict_shared(p->b, first, p->G, B, lib_v, LD, lib_n) != KVE_OK) {
        fprintf(stderr, "evict_shared to %zu: %s\n", B, kve_last_error());
        return 0;
    }
    if (ref_evict_shared(p->r + first, p->G, B, p->min_share, ref_v, LD, ref_n) != 0)
        return 0;
    size_t after = 0, rw = p->r[0]->recent_window;
    size_t floor = (size_t)(p->min_share * (double)B / (double)p->G);
    floor = floor > rw ? floor : rw;
    for (size_t j = 0; j < p->G; j++) {
        if (lib_n[j] != ref_n[j] || memcmp(lib_v + j * LD, ref_v + j * LD,
                                           lib_n[j] * sizeof *lib_v) != 0) {
            fprintf(stderr, "%s: group %zu head %zu to %zu: %zu victims, the model %zu\n",
                    kve_bank_spec(p->b), gi, j, B, lib_n[j], ref_n[j]);
            return 0;
        }
        size_t n = kve_bank_size(p->b, first + j);
        if (n < floor && n != before[j]) {
            fprintf(stderr, "head %zu went below its floor %zu: %zu\n", j, floor, n);
            return 0;
        }
        after += n;
    }
    if (after != (total > B ? B : total)) {
        fprintf(stderr, "group %zu holds %zu after an evict to %zu (had %zu)\n", gi, after, B,
                total);
        return 0;
    }
    return same_kept(p, "after evict_shared");
}

static void test_shared_against_model(void)
{
    size_t runs = 0;
    for (size_t s = 0; s < N_SPECS; s++)
        for (size_t G = 1; G <= MAXG; G++) {
            pair p;
            double ms = min_shares[(s + G) % 4];
            uint64_t seed = check_seed + 100 * s + G;
            if (!pair_new(&p, shared_specs[s], G, ms, seed)) {
                pair_free(&p);
                CHECK_FAIL_AT("%s G=%zu: construction failed: %s", shared_specs[s], G,
                              kve_last_error());
            }
            size_t rw = p.r[0]->recent_window;
            int ok = 1;
            for (size_t t = 0; t < STEPS && ok; t++) {
                p.pos += kve_rng_below(&p.g, 7) == 0 ? 3 : 1;
                int null_step = kve_rng_below(&p.g, 9) == 0;
                for (size_t gi = 0; gi < GROUPS && ok; gi++)
                    ok = step_group(&p, gi, p.pos, null_step);
                uint64_t what = kve_rng_below(&p.g, 20);
                for (size_t gi = 0; gi < GROUPS && ok; gi++) {
                    size_t B = G * p.budget;
                    if (what == 0)
                        continue; /* no evict: the group outgrows its storage */
                    if (what == 1) /* a smaller budget, above the recent windows */
                        B = G * rw + 1 + (size_t)kve_rng_below(&p.g, B - G * rw);
                    if (what == 2) /* above the bank's budget: the group grows */
                        B += (size_t)kve_rng_below(&p.g, 3 * G + 1);
                    if (what == 3) { /* a uniform evict on a shared bank */
                        size_t first = gi * G;
                        ok = kve_bank_evict_range(p.b, first, G, p.budget, lib_v, LD, lib_n) ==
                             KVE_OK;
                        for (size_t j = 0; j < G && ok; j++)
                            ok = ref_evict(p.r[first + j], p.budget, ref_v, &ref_n[j]) == 0 &&
                                 ref_n[j] == lib_n[j] &&
                                 memcmp(ref_v, lib_v + j * LD, ref_n[j] * sizeof *ref_v) == 0;
                        ok = ok && same_kept(&p, "after a uniform evict");
                        continue;
                    }
                    ok = evict_group(&p, gi, B);
                }
            }
            if (!ok)
                CHECK_FAIL_AT("%s G=%zu min_share %g: disagreement (seed %llu)", shared_specs[s],
                              G, ms, (unsigned long long)seed);
            pair_free(&p);
            runs++;
        }
    ASSERT_EQ(runs, N_SPECS * MAXG);
}

/* The shared eviction takes each head's first candidate from the step's
 * pass, which every instruction set computes: the model test on each. */
static void test_shared_on_every_isa(void)
{
    int runs = 0;
    for (int isa = 0; isa < KVE_ISA_COUNT; isa++) {
        if (!kve__isa_supported((kve_isa)isa))
            continue;
        ASSERT_TRUE(kve__isa_force((kve_isa)isa));
        const char *name = kve_isa_name();
        int before = check_failures;
        test_shared_against_model();
        kve__isa_force(KVE_ISA_COUNT);
        if (check_failures != before)
            CHECK_FAIL_AT("instruction set %s disagrees with the model", name);
        runs++;
    }
    ASSERT_TRUE(runs >= 1);
}

/* Ties by hand: every score 0 (NULL steps), no recent window. */
static void test_ties_and_floors(void)
{
    for (int floor_on = 0; floor_on < 2; floor_on++) {
        kve_bank_options o = kve_bank_default_options();
        o.share = 2;
        o.min_share = floor_on ? 1.0 : 0.0;
        kve_bank *b = NULL;
        ASSERT_OK(kve_bank_new_ex("h2o:budget=4,recent_window=0", 2, NULL, &o, &b));
        for (int32_t t = 0; t < 6; t++)
            ASSERT_OK(kve_bank_step(b, t, NULL, 0));
        int32_t v[2 * 8];
        size_t counts[2];
        ASSERT_OK(kve_bank_evict_shared(b, 0, 2, 8, v, 8, counts));
        if (!floor_on) { /* all ties: head 0 first, its lowest positions */
            ASSERT_EQ(counts[0], 4);
            ASSERT_EQ(counts[1], 0);
            for (int32_t i = 0; i < 4; i++)
                ASSERT_EQ(v[i], i);
            ASSERT_EQ(kve_bank_size(b, 0), 2);
            ASSERT_EQ(kve_bank_size(b, 1), 6);
        } else { /* floor 4 each: head 0 down to 4, then head 1 */
            ASSERT_EQ(counts[0], 2);
            ASSERT_EQ(counts[1], 2);
            ASSERT_EQ(v[0], 0);
            ASSERT_EQ(v[1], 1);
            ASSERT_EQ(v[8], 0);
            ASSERT_EQ(v[9], 1);
        }
        kve_bank_free(b);
    }
    /* A head that draws attention keeps more: head 1's rows put everything on
     * its oldest slot, head 0's spread evenly. */
    kve_bank_options o = kve_bank_default_options();
    o.share = 2;
    o.min_share = 0.0;
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=8,recent_window=1", 2, NULL, &o, &b));
    int32_t v[2 * 32];
    for (int32_t t = 0; t < 64; t++) {
        float r[2 * 32];
        size_t n0 = kve_bank_size(b, 0), n1 = kve_bank_size(b, 1);
        for (size_t i = 0; i < n0; i++)
            r[i] = 1.0f / (float)n0;
        for (size_t i = 0; i < n1; i++)
            r[32 + i] = i == 0 ? 1.0f : 0.0f;
        ASSERT_OK(kve_bank_step(b, t, t ? r : NULL, 32));
        ASSERT_OK(kve_bank_evict_shared(b, 0, 2, 16, v, 32, NULL));
        ASSERT_TRUE(kve_bank_size(b, 0) + kve_bank_size(b, 1) <= 16);
    }
    ASSERT_TRUE(kve_bank_size(b, 0) > kve_bank_size(b, 1));
    ASSERT_EQ(kve_bank_size(b, 1), 2); /* its sink and its recent window */
    kve_bank_free(b);
}

/* Every refusal changes nothing: afterwards the bank still agrees with a
 * model that never saw the refused call. */
static void test_refusals_change_nothing(void)
{
    pair p;
    ASSERT_TRUE(pair_new(&p, "h2o:budget=12,recent_window=2", 2, 0.2, check_seed));
    int32_t v[4 * LD];
    size_t counts[4];
    for (int32_t t = 0; t < 30; t++) {
        for (size_t gi = 0; gi < GROUPS; gi++)
            ASSERT_TRUE(step_group(&p, gi, t, 0));
        if (t % 3 == 0)
            for (size_t gi = 0; gi < GROUPS; gi++)
                ASSERT_TRUE(evict_group(&p, gi, 24));
    }
    ASSERT_STATUS(kve_bank_evict_shared(p.b, 0, 2, 4, v, LD, counts), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "recent windows");
    ASSERT_STATUS(kve_bank_evict_shared(p.b, 0, 2, 0, v, LD, counts), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_evict_shared(p.b, 1, 2, 24, v, LD, counts), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "split a shared group");
    ASSERT_STATUS(kve_bank_evict_shared(p.b, 0, 3, 24, v, LD, counts), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_evict_shared(p.b, 2, 4, 24, v, LD, counts), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_evict_shared(NULL, 0, 2, 24, v, LD, counts), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_evict_shared(p.b, 0, 2, 24, NULL, LD, counts), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_evict_range(p.b, 1, 1, 12, v, LD, counts), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_step_range(p.b, 0, 1, 99, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0), KVE_EINVAL);
    /* too little room for the victims: the marks are undone */
    ASSERT_STATUS(kve_bank_evict_shared(p.b, 0, 4, 2 * 5, v, 1, counts), KVE_ERANGE);
    ASSERT_CONTAINS(kve_last_error(), "victims to report");
    ASSERT_TRUE(same_kept(&p, "after the refusals"));
    for (int32_t t = 30; t < 80; t++) {
        for (size_t gi = 0; gi < GROUPS; gi++)
            ASSERT_TRUE(step_group(&p, gi, t, t % 5 == 0));
        for (size_t gi = 0; gi < GROUPS; gi++)
            ASSERT_TRUE(evict_group(&p, gi, 10 + (size_t)(t % 15)));
    }
    pair_free(&p);

    /* a bank without share */
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("h2o:budget=8,recent_window=2", 2, NULL, &b));
    ASSERT_EQ(kve_bank_share(b), 0);
    ASSERT_STATUS(kve_bank_evict_shared(b, 0, 2, 16, v, LD, counts), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "no shared groups");
    kve_bank_free(b);
}

static void test_construction(void)
{
    kve_bank_options o = kve_bank_default_options();
    ASSERT_EQ(o.share, 0);
    ASSERT_NEAR(o.min_share, 0.2, 0.0);
    kve_bank *b = NULL;
    o.share = 3;
    ASSERT_STATUS(kve_bank_new_ex("h2o", 4, NULL, &o, &b), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "does not divide");
    o.share = 2;
    ASSERT_STATUS(kve_bank_new_ex("window", 4, NULL, &o, &b), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_new_ex("streaming", 4, NULL, &o, &b), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_new_ex("full", 4, NULL, &o, &b), KVE_EINVAL);
    kve_rng rng;
    kve_rng_seed(&rng, 1);
    ASSERT_STATUS(kve_bank_new_ex("random", 4, &rng, &o, &b), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_new_ex("h2o:budget=64,block=16", 4, NULL, &o, &b), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "not pages");
    double bad[] = {-0.1, 1.5, NAN};
    for (int i = 0; i < 3; i++) {
        o.min_share = bad[i];
        ASSERT_STATUS(kve_bank_new_ex("h2o", 4, NULL, &o, &b), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "min_share");
    }
    o.min_share = 0.2;
    ASSERT_STATUS(kve_bank_new_ex("h2o", 0, NULL, &o, &b), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_new_ex("h2o", 4, NULL, &o, NULL), KVE_EINVAL);
    ASSERT_TRUE(b == NULL);
    /* NULL options: kve_bank_new */
    ASSERT_OK(kve_bank_new_ex("h2o:budget=16,recent_window=2", 4, NULL, NULL, &b));
    ASSERT_EQ(kve_bank_share(b), 0);
    ASSERT_EQ(kve_bank_state_bytes(b), 4 * 17 * 13);
    kve_bank_free(b);
    /* a shared bank starts with budget + 1 + slack slots a head */
    ASSERT_OK(kve_bank_new_ex("h2o:budget=16,recent_window=2", 4, NULL, &o, &b));
    ASSERT_EQ(kve_bank_share(b), 2);
    ASSERT_EQ(kve_bank_state_bytes(b), 4 * (17 + 2) * 13);
    ASSERT_EQ(kve_bank_share(NULL), 0);
    kve_bank_free(b);
}

/* The steady state allocates nothing, whatever the heads' sizes do; a group
 * that must grow does so all or nothing; the memory follows. */
static void test_allocation(void)
{
    talloc ta;
    talloc_init(&ta);
    kve_bank_options o = kve_bank_default_options();
    o.allocator = &ta.a;
    o.share = 4;
    o.min_share = 0.0;
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=32,recent_window=4", 8, NULL, &o, &b));
    size_t bytes = kve_bank_state_bytes(b);
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    const float pool[4] = {0.5f, 0.25f, 0.0f, 0.125f};
    static float r[8 * 256];
    static int32_t v[8 * 256];
    talloc_fail_after(&ta, 0);
    for (int32_t t = 0; t < 2000; t++) {
        for (size_t h = 0; h < 8; h++) { /* head 0 of each group draws far more */
            size_t n = kve_bank_size(b, h);
            for (size_t i = 0; i < n; i++)
                r[h * 256 + i] = random_weight(&g, pool, n) * (h % 4 == 0 ? 1.0f : 0.01f);
        }
        kve_status st = kve_bank_step(b, t, r, 256);
        if (st == KVE_OK)
            st = kve_bank_evict_shared(b, 0, 8, 4 * 32, v, 256, NULL);
        if (st != KVE_OK) {
            talloc_fail_after(&ta, SIZE_MAX);
            CHECK_FAIL_AT("step %d: %s", t, kve_last_error());
        }
    }
    talloc_fail_after(&ta, SIZE_MAX);
    ASSERT_EQ(kve_bank_state_bytes(b), bytes);
    size_t sizes = 0, spread = 0;
    for (size_t h = 0; h < 8; h++) {
        sizes += kve_bank_size(b, h);
        spread += kve_bank_size(b, h) != 32;
    }
    ASSERT_EQ(sizes, 8 * 32);
    ASSERT_TRUE(spread > 0); /* the heads did drift apart */

    /* Stepped without evicting, group 1 must grow: refused without memory,
     * nothing changed; then it grows into a private block. */
    size_t before[8];
    for (size_t h = 0; h < 8; h++)
        before[h] = kve_bank_size(b, h);
    int32_t t = 2000;
    kve_status st = KVE_OK;
    for (; st == KVE_OK && t < 2100; t++) {
        talloc_fail_after(&ta, 0);
        st = kve_bank_step_range(b, 4, 4, t, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0);
        talloc_fail_after(&ta, SIZE_MAX);
    }
    ASSERT_EQ(st, KVE_ENOMEM);
    ASSERT_CONTAINS(kve_last_error(), "out of memory");
    t--;
    size_t stepped = (size_t)(t - 2000);
    for (size_t h = 4; h < 8; h++)
        ASSERT_EQ(kve_bank_size(b, h), before[h] + stepped);
    ASSERT_OK(kve_bank_step_range(b, 4, 4, t, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0));
    ASSERT_TRUE(kve_bank_state_bytes(b) > bytes);
    for (size_t h = 4; h < 8; h++)
        ASSERT_EQ(kve_bank_size(b, h), before[h] + stepped + 1);
    /* and carries on: back to the group's budget */
    ASSERT_OK(kve_bank_evict_shared(b, 4, 4, 4 * 32, v, 256, NULL));
    sizes = 0;
    for (size_t h = 4; h < 8; h++)
        sizes += kve_bank_size(b, h);
    ASSERT_EQ(sizes, 4 * 32);
    /* every step of the range fails the allocation of the whole bank */
    kve_bank_free(b);
    talloc_check_empty(&ta);

    /* Construction cleans up at every failing allocation. */
    for (size_t k = 0; k < 8; k++) {
        kve_bank *c = NULL;
        talloc_fail_after(&ta, k);
        st = kve_bank_new_ex("h2o_mean:budget=8,recent_window=1", 4, NULL, &o, &c);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK) {
            kve_bank_free(c);
            break;
        }
        ASSERT_EQ(st, KVE_ENOMEM);
        ASSERT_TRUE(c == NULL);
    }
    talloc_check_empty(&ta);
}

/* ---- layer schedules ---- */

static void test_schedules_by_hand(void)
{
    size_t out[8];
    kve_schedule_options s = kve_schedule_default_options();
    ASSERT_EQ(s.kind, KVE_SCHEDULE_UNIFORM);
    ASSERT_NEAR(s.beta, 20.0, 0.0);
    ASSERT_OK(kve_layer_budgets(10, 4, &s, out));
    ASSERT_EQ(out[0], 3);
    ASSERT_EQ(out[1], 3);
    ASSERT_EQ(out[2], 2);
    ASSERT_EQ(out[3], 2);
    s.floor = 2;
    ASSERT_OK(kve_layer_budgets(10, 4, &s, out));
    ASSERT_EQ(out[0] + out[1] + out[2] + out[3], 10);
    ASSERT_EQ(out[0], 3);
    ASSERT_EQ(out[3], 2);

    /* PyramidKV, 4 layers of mean 51 above a floor of 33, beta 20: the part
     * above the floor, 72, splits as 35.1, 23.7, 12.3, 0.9. */
    s.kind = KVE_SCHEDULE_PYRAMID;
    s.floor = 33;
    ASSERT_OK(kve_layer_budgets(4 * 51, 4, &s, out));
    ASSERT_EQ(out[0], 68);
    ASSERT_EQ(out[1], 57);
    ASSERT_EQ(out[2], 45);
    ASSERT_EQ(out[3], 34);
    s.beta = 1.0; /* flat */
    ASSERT_OK(kve_layer_budgets(4 * 51, 4, &s, out));
    for (int l = 0; l < 4; l++)
        ASSERT_EQ(out[l], 51);
    s.floor = 0;
    ASSERT_OK(kve_layer_budgets(7, 1, &s, out));
    ASSERT_EQ(out[0], 7);

    double w[3] = {1.0, 3.0, 0.0};
    s.kind = KVE_SCHEDULE_WEIGHTED;
    s.floor = 0;
    s.weights = w;
    ASSERT_OK(kve_layer_budgets(10, 2, &s, out)); /* 2.5 and 7.5: the tie to layer 0 */
    ASSERT_EQ(out[0], 3);
    ASSERT_EQ(out[1], 7);
    ASSERT_OK(kve_layer_budgets(10, 3, &s, out));
    ASSERT_EQ(out[2], 0);
}

static void test_schedules_properties(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    for (int trial = 0; trial < 2000; trial++) {
        size_t L = 1 + (size_t)kve_rng_below(&g, 40), out[40];
        double w[40], sum = 0;
        for (size_t l = 0; l < L; l++) {
            w[l] = kve_rng_below(&g, 5) == 0 ? 0.0 : kve_rng_uniform(&g) * 1e3;
            sum += w[l];
        }
        if (sum == 0)
            w[0] = sum = 1.0;
        kve_schedule_options s = kve_schedule_default_options();
        s.kind = (kve_schedule_kind)kve_rng_below(&g, 3);
        s.weights = w;
        s.beta = 1.0 + kve_rng_uniform(&g) * 40.0;
        s.floor = (size_t)kve_rng_below(&g, 50);
        size_t total = L * s.floor + (size_t)kve_rng_below(&g, 100000);
        ASSERT_OK(kve_layer_budgets(total, L, &s, out));
        size_t got = 0, rest = total - L * s.floor;
        for (size_t l = 0; l < L; l++) {
            ASSERT_TRUE(out[l] >= s.floor);
            got += out[l];
            double share;
            if (s.kind == KVE_SCHEDULE_WEIGHTED) {
                share = w[l] / sum;
            } else if (s.kind == KVE_SCHEDULE_PYRAMID && L > 1) { /* the line, again */
                double top = 1.0 / s.beta;
                share = ((2.0 - top) - (double)l * (2.0 - 2.0 * top) / (double)(L - 1)) / (double)L;
            } else {
                share = 1.0 / (double)L;
            }
            ASSERT_TRUE(fabs((double)(out[l] - s.floor) - (double)rest * share) < 1.0 + 1e-6);
            if (l > 0 && s.kind == KVE_SCHEDULE_PYRAMID)
                ASSERT_TRUE(out[l] <= out[l - 1] + 1);
        }
        ASSERT_EQ(got, total);
    }
}

/* The smallest budget a spec accepts: accepted, and one less refused. */
static void test_min_budget(void)
{
    static const struct {
        const char *spec;
        size_t least;
    } cases[] = {{"h2o", 33},
                 {"streaming", 5},
                 {"window", 1},
                 {"full", 1},
                 {"random:recent_window=3", 4},
                 {"tova", 2},
                 {"h2o:budget=64,recent_window=8,block=16", 30},
                 {"streaming:sinks=4,block=4", 10},
                 {"window:block=8", 7}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t least = 0;
        char num[24], out[KVE_SPEC_MAX];
        ASSERT_OK(kve_spec_min_budget(cases[i].spec, &least));
        ASSERT_EQ(least, cases[i].least);
        snprintf(num, sizeof num, "%zu", least);
        ASSERT_OK(kve_spec_with(cases[i].spec, "budget", num, out, sizeof out));
        snprintf(num, sizeof num, "%zu", least - 1);
        ASSERT_TRUE(kve_spec_with(cases[i].spec, "budget", num, out, sizeof out) == KVE_EINVAL);
    }
    size_t least = 7;
    ASSERT_STATUS(kve_spec_min_budget("h2o:block=0", &least), KVE_EINVAL);
    ASSERT_STATUS(kve_spec_min_budget("h2o", NULL), KVE_EINVAL);
    ASSERT_EQ(least, 7);
}

static void test_schedule_refusals(void)
{
    size_t out[4] = {7, 7, 7, 7};
    kve_schedule_options s = kve_schedule_default_options();
    size_t uniform[4];
    ASSERT_OK(kve_layer_budgets(10, 4, NULL, uniform)); /* NULL: the defaults, uniform */
    ASSERT_TRUE(uniform[0] == 3 && uniform[1] == 3 && uniform[2] == 2 && uniform[3] == 2);
    ASSERT_STATUS(kve_layer_budgets(10, 4, &s, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_layer_budgets(10, 0, &s, out), KVE_EINVAL);
    s.floor = 3;
    ASSERT_STATUS(kve_layer_budgets(11, 4, &s, out), KVE_EINVAL);
    s.floor = 0;
    s.kind = (kve_schedule_kind)7;
    ASSERT_STATUS(kve_layer_budgets(10, 4, &s, out), KVE_EINVAL);
    s.kind = KVE_SCHEDULE_PYRAMID;
    s.beta = 0.5;
    ASSERT_STATUS(kve_layer_budgets(10, 4, &s, out), KVE_EINVAL);
    s.beta = INFINITY;
    ASSERT_STATUS(kve_layer_budgets(10, 4, &s, out), KVE_EINVAL);
    s.kind = KVE_SCHEDULE_WEIGHTED;
    ASSERT_STATUS(kve_layer_budgets(10, 4, &s, out), KVE_EINVAL);
    double w[4] = {1, -1, 1, 1};
    s.weights = w;
    ASSERT_STATUS(kve_layer_budgets(10, 4, &s, out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "weights[1]");
    w[1] = NAN;
    ASSERT_STATUS(kve_layer_budgets(10, 4, &s, out), KVE_EINVAL);
    double z[4] = {0, 0, 0, 0};
    s.weights = z;
    ASSERT_STATUS(kve_layer_budgets(10, 4, &s, out), KVE_EINVAL);
    for (int l = 0; l < 4; l++)
        ASSERT_EQ(out[l], 7);
}

/* ---- the harness on several heads ---- */

enum { TH = 4, TT = 160 };

/* Writes a [TH, TT, TT] float32 .npy of random rows (each summing to 1 over
 * [0, t]; head h more concentrated the larger h) to `path`; 0 on success. */
static int write_heads_npy(const char *path, uint64_t seed)
{
    static float data[TH * TT * TT];
    kve_rng g;
    kve_rng_seed(&g, seed);
    for (int h = 0; h < TH; h++)
        for (int t = 0; t < TT; t++) {
            float *row = data + ((size_t)h * TT + (size_t)t) * TT;
            double sum = 0;
            for (int i = 0; i < TT; i++) {
                double u = kve_rng_uniform(&g);
                row[i] = i <= t ? (float)pow(u, 1.0 + 3.0 * h) : 0.0f;
                sum += row[i];
            }
            for (int i = 0; i <= t; i++)
                row[i] = (float)(row[i] / sum);
        }
    const size_t dims[] = {TH, TT, TT};
    return npy_write_f4(path, dims, 3, data);
}

static void test_eval_heads(void)
{
    ASSERT_TRUE(write_heads_npy(path_of("heads.npy"), check_seed) == 0);
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open(path_of("heads.npy"), TRACE_FLAGS(KVE_TRACE_NORMALIZE), &tr));
    const kve_eval_job jobs[] = {{"h2o:recent_window=4", 24},
                                 {"tova:recent_window=1", 20},
                                 {"h2o_mean:recent_window=2,block=4", 30}};
    enum { NJ = sizeof jobs / sizeof jobs[0] };
    kve_eval_result all[NJ], per[NJ * TH], one[NJ];
    kve_eval_options o = kve_eval_default_options();
    ASSERT_EQ(o.share, 0);
    ASSERT_EQ(o.score_after, KVE_EVAL_AFTER_BUDGET);
    ASSERT_OK(kve_eval(tr, 0, TH, jobs, NJ, &o, all, per));
    for (size_t h = 0; h < TH; h++) { /* each head as its own evaluation */
        ASSERT_OK(kve_eval(tr, h, 1, jobs, NJ, NULL, one, NULL));
        for (size_t j = 0; j < NJ; j++) {
            const kve_eval_result *q = &per[j * TH + h];
            ASSERT_STR_EQ(q->spec, one[j].spec);
            ASSERT_EQ(q->scored_steps, one[j].scored_steps);
            ASSERT_TRUE(q->retained_mass == one[j].retained_mass);
            ASSERT_TRUE(q->top32_recall == one[j].top32_recall);
            ASSERT_TRUE(q->min_retained_mass == one[j].min_retained_mass);
            ASSERT_TRUE(q->mean_kept == one[j].mean_kept);
        }
    }
    for (size_t j = 0; j < NJ; j++) {
        double mass = 0, least = 1;
        for (size_t h = 0; h < TH; h++) {
            mass += per[j * TH + h].retained_mass;
            least = fmin(least, per[j * TH + h].min_retained_mass);
        }
        ASSERT_NEAR(all[j].retained_mass, mass / TH, 1e-12);
        ASSERT_TRUE(all[j].min_retained_mass == least);
        ASSERT_EQ(all[j].steps, TT);
    }
    ASSERT_TRUE(all[0].mean_kept == 24.0);
    ASSERT_TRUE(all[2].mean_kept < 30.0 && all[2].mean_kept > 30.0 - 4.0); /* pages */

    /* Sharing: every scored step ends with the group at its budget. */
    const kve_eval_job shared[] = {{"h2o:recent_window=4", 24}, {"scissorhands:recent_window=2", 16}};
    kve_eval_result sr[2], sp[2 * TH];
    o.share = TH;
    ASSERT_OK(kve_eval(tr, 0, TH, shared, 2, &o, sr, sp));
    for (size_t j = 0; j < 2; j++) {
        double kept = 0;
        for (size_t h = 0; h < TH; h++)
            kept += sp[j * TH + h].mean_kept;
        ASSERT_NEAR(kept, (double)(TH * shared[j].budget), 1e-9);
        ASSERT_EQ(sr[j].scored_steps, TT - 1 - shared[j].budget);
    }
    /* the concentrated heads (higher h) give up positions to the spread ones */
    ASSERT_TRUE(sp[0].mean_kept > sp[TH - 1].mean_kept);
    o.share = 2;
    ASSERT_OK(kve_eval(tr, 0, TH, shared, 2, &o, sr, sp));
    ASSERT_NEAR(sp[0].mean_kept + sp[1].mean_kept, 2.0 * 24, 1e-9);

    /* score_after: the same steps for every job */
    o.share = 0;
    o.score_after = 100;
    ASSERT_OK(kve_eval(tr, 0, TH, jobs, NJ, &o, all, NULL));
    for (size_t j = 0; j < NJ; j++)
        ASSERT_EQ(all[j].scored_steps, TT - 1 - 100);
    o.score_after = 0; /* 0 is a step like any other: every t > 0 is scored */
    ASSERT_OK(kve_eval(tr, 0, TH, jobs, NJ, &o, all, NULL));
    for (size_t j = 0; j < NJ; j++)
        ASSERT_EQ(all[j].scored_steps, TT - 1);

    /* refusals */
    o.score_after = KVE_EVAL_AFTER_BUDGET;
    ASSERT_STATUS(kve_eval(tr, 1, TH, jobs, NJ, &o, all, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "heads 1 .. 4");
    ASSERT_STATUS(kve_eval(tr, 0, 0, jobs, NJ, &o, all, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "count is 0");
    o.share = 3;
    ASSERT_STATUS(kve_eval(tr, 0, TH, jobs, NJ, &o, all, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "job 0");
    o.share = TH;
    ASSERT_STATUS(kve_eval(tr, 0, TH, jobs, NJ, &o, all, NULL), KVE_EINVAL); /* pages cannot share */
    ASSERT_CONTAINS(kve_last_error(), "job 2");
    kve_trace_free(tr);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    if (tmpdir_make("kve_budgets") != 0)
        return 1;
    RUN(test_shared_against_model);
    RUN(test_shared_on_every_isa);
    RUN(test_ties_and_floors);
    RUN(test_refusals_change_nothing);
    RUN(test_construction);
    RUN(test_allocation);
    RUN(test_schedules_by_hand);
    RUN(test_schedules_properties);
    RUN(test_schedule_refusals);
    RUN(test_min_budget);
    RUN(test_eval_heads);
    remove_dir();
    return CHECK_DONE();
}
