/* SPDX-License-Identifier: MIT */
/*
 * test_bank.c - a bank of n heads against n separate policies built one after
 * another from the same generator (the promise of kvevict.h), on random
 * workloads for every policy: NULL rows, ties, steps without evicts
 * (growth), evictions below the budget (several victims), sub-range steps and
 * evicts (heads drifting apart in size and last position). After every call
 * the statuses, counts, victims and kept sets must agree. Then: the grouped
 * step against a naive reduction loop; every refusal, each leaving every head
 * unchanged (checked against the twins, then over more steps); construction,
 * generators and accessors. Deterministic per seed (printed; replay with
 * argv[1]).
 */
#include "check.h"
#include "kvevict.h"
#include "workload.h"

#include <float.h>

enum { MAXH = 6, MAXG = 4, MAXN = 512, STEPS = 500, MAXD = 40 };

/* A bank and its twins: the policies it must equal, head for head. */
typedef struct twin {
    kve_bank *b;
    kve_policy *p[MAXH];
    size_t heads;
    size_t budget; /* the spec's */
    int32_t pos;   /* the last position stepped anywhere */
    kve_rng g;     /* the workload's weights */
    float pool[4]; /* repeated weights: ties */
    size_t dim;    /* floats of a key; 0: steps carry none */
    float key_pool[4 * MAXD];
} twin;

static float rows[MAXH * MAXG * MAXN], reduced[MAXH * MAXN];
static float keys[MAXH * (MAXD + 3)];
static int32_t bank_victims[MAXH * MAXN], pol_victims[MAXN];

/* A bank of `heads` of spec with keys of `dim` floats (0: none) and its twins. */
static int twin_new(twin *t, const char *spec, size_t heads, size_t dim, uint64_t seed)
{
    kve_rng rb, rp;
    kve_rng_seed(&rb, seed);
    kve_rng_seed(&rp, seed);
    memset(t, 0, sizeof *t);
    t->heads = heads;
    t->pos = -1;
    t->dim = dim;
    kve_rng_seed(&t->g, seed * 7 + 1);
    for (int k = 0; k < 4; k++)
        t->pool[k] = (float)(k + 1) / 8.0f;
    for (size_t j = 0; j < 4 * dim; j++)
        t->key_pool[j] = (float)kve_rng_uniform(&t->g) - 0.5f;
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = dim;
    kve_bank_options bo = kve_bank_default_options();
    bo.key_dim = dim;
    if (dim > MAXD || kve_bank_new_ex(spec, heads, &rb, &bo, &t->b) != KVE_OK)
        return 0;
    if (kve_bank_key_dim(t->b) != dim)
        return 0;
    for (size_t h = 0; h < heads; h++)
        if (kve_policy_new_ex(spec, &rp, &o, &t->p[h]) != KVE_OK)
            return 0;
    t->budget = kve_policy_budget(t->p[0]);
    return memcmp(&rb, &rp, sizeof rb) == 0; /* the bank drew what the policies drew */
}

static void twin_free(twin *t)
{
    kve_bank_free(t->b);
    for (size_t h = 0; h < t->heads; h++)
        kve_policy_free(t->p[h]);
}

/* Every head's kept set equals its twin's; reports the first difference. */
static int twin_same(const twin *t, const char *when)
{
    for (size_t h = 0; h < t->heads; h++) {
        size_t n = kve_bank_size(t->b, h);
        if (n != kve_policy_size(t->p[h])) {
            fprintf(stderr, "%s: %s: head %zu keeps %zu, its policy %zu\n",
                    kve_bank_spec(t->b), when, h, n, kve_policy_size(t->p[h]));
            return 0;
        }
        if (n && memcmp(kve_bank_positions(t->b, h), kve_policy_positions(t->p[h]),
                        n * sizeof(int32_t)) != 0) {
            fprintf(stderr, "%s: %s: head %zu kept positions differ\n", kve_bank_spec(t->b),
                    when, h);
            return 0;
        }
    }
    return 1;
}

/* The widest head of [first, first + count). */
static size_t max_size(const twin *t, size_t first, size_t count)
{
    size_t m = 0;
    for (size_t h = first; h < first + count; h++)
        if (kve_bank_size(t->b, h) > m)
            m = kve_bank_size(t->b, h);
    return m;
}

/* Steps heads [first, first + count) of the bank and their twins at the next
 * position; rows (count of them, ld apart) random, or NULL. Returns 0 on a
 * disagreement. */
static int step_range(twin *t, size_t first, size_t count, int with_attn)
{
    kve_rng *g = &t->g;
    const float *pool = t->pool;
    size_t ld = max_size(t, first, count) + (size_t)kve_rng_below(g, 3);
    t->pos += kve_rng_below(g, 8) == 0 ? 3 : 1;
    for (size_t j = 0; j < count; j++) {
        size_t n = kve_bank_size(t->b, first + j);
        for (size_t i = 0; i < ld; i++)
            rows[j * ld + i] = i < n ? random_weight(g, pool, n) : NAN; /* past n: never read */
    }
    const float *attn = with_attn ? rows : NULL;
    size_t ldk = t->dim + (size_t)kve_rng_below(g, 3);
    for (size_t j = 0; j < count; j++)
        random_key(g, t->key_pool, t->dim, keys + j * ldk);
    const float *k = t->dim ? keys : NULL;
    kve_status st = first == 0 && count == t->heads && !k
                        ? kve_bank_step(t->b, t->pos, attn, ld)
                        : kve_bank_step_range(t->b, first, count, t->pos, attn, ld, 1,
                                             KVE_REDUCE_MEAN, k, ldk);
    if (st != KVE_OK) {
        fprintf(stderr, "bank step: %s\n", kve_last_error());
        return 0;
    }
    for (size_t j = 0; j < count; j++) {
        kve_policy *p = t->p[first + j];
        if (kve_policy_step_keys(p, t->pos, attn ? rows + j * ld : NULL, kve_policy_size(p),
                                 k ? keys + j * ldk : NULL) != KVE_OK)
            return 0;
    }
    return twin_same(t, "after a step");
}

/* Evicts heads [first, first + count) to `budget`; victims and counts must
 * match the twins'. */
static int evict_range(twin *t, size_t first, size_t count, size_t budget)
{
    size_t ld = max_size(t, first, count);
    size_t counts[MAXH];
    kve_status st = first == 0 && count == t->heads
                        ? kve_bank_evict(t->b, budget, bank_victims, ld, counts)
                        : kve_bank_evict_range(t->b, first, count, budget, bank_victims, ld, counts);
    if (st != KVE_OK) {
        fprintf(stderr, "bank evict: %s\n", kve_last_error());
        return 0;
    }
    for (size_t j = 0; j < count; j++) {
        size_t nv = SIZE_MAX;
        if (kve_policy_evict(t->p[first + j], budget, pol_victims, MAXN, &nv) != KVE_OK ||
            nv != counts[j] ||
            (nv && memcmp(pol_victims, bank_victims + j * ld, nv * sizeof(int32_t)) != 0)) {
            fprintf(stderr, "%s: head %zu: victims differ\n", kve_bank_spec(t->b), first + j);
            return 0;
        }
    }
    return twin_same(t, "after an evict");
}

/* The lowest budget evict accepts for this spec: recent_window or sinks + 1. */
static size_t floor_budget(const char *spec)
{
    kve_rng g;
    kve_rng_seed(&g, 1);
    kve_policy *p = NULL;
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = 1;
    if (kve_policy_new_ex(spec, &g, &o, &p) != KVE_OK)
        return 0;
    size_t lo = 1;
    while (kve_policy_evict(p, lo, NULL, 0, NULL) == KVE_EINVAL)
        lo++;
    kve_policy_free(p);
    return lo;
}

static void run_workload(const char *spec, size_t heads, size_t dim, uint64_t seed)
{
    twin t;
    ASSERT_TRUE(twin_new(&t, spec, heads, dim, seed));
    kve_rng *g = &t.g;
    size_t budget = t.budget, lo = floor_budget(spec);
    size_t ranges = 0, multi = 0;
    for (int s = 0; s < STEPS; s++) {
        if (s % 40 == 0)
            for (int k = 0; k < 4; k++)
                t.pool[k] = (float)kve_rng_uniform(g);
        int with_attn = kve_rng_below(g, 12) != 0;
        /* Mostly every head; sometimes a sub-range, which lets heads drift
         * apart in size and last position. */
        size_t first = 0, count = heads;
        if (heads > 1 && kve_rng_below(g, 6) == 0) {
            first = (size_t)kve_rng_below(g, heads);
            count = 1 + (size_t)kve_rng_below(g, heads - first);
            ranges++;
        }
        if (!step_range(&t, first, count, with_attn))
            CHECK_FAIL_AT("%s x %zu: step %d differs (seed %" PRIu64 ")", spec, heads, s, seed);
        if (max_size(&t, 0, heads) >= MAXN - 1 || kve_rng_below(g, 10) != 0) {
            size_t b = budget;
            if (kve_rng_below(g, 15) == 0 && budget > lo) {
                b = lo + (size_t)kve_rng_below(g, budget - lo);
                multi++;
            }
            if (!evict_range(&t, first, count, b))
                CHECK_FAIL_AT("%s x %zu: evict %d differs (seed %" PRIu64 ")", spec, heads, s,
                              seed);
        }
    }
    if (heads > 1)
        ASSERT_TRUE(ranges > 0);
    ASSERT_TRUE(multi > 0 || budget == lo);
    twin_free(&t);
}

static void test_bank_matches_policies(void)
{
    static const size_t head_counts[] = {1, 2, 5};
    for (size_t i = 0; i < sizeof workload_specs / sizeof workload_specs[0]; i++)
        for (size_t k = 0; k < 3; k++) {
            int before = check_failures;
            run_workload(workload_specs[i], head_counts[k], workload_key_dim(workload_specs[i], i),
                         check_seed + 100 * i + k);
            if (check_failures != before)
                return;
        }
}

/* The reduction of kvevict.h, written as plainly as possible. */
static void naive_reduce(const float *q, size_t ld, size_t group, kve_reduce reduce, size_t n,
                         float *out)
{
    for (size_t i = 0; i < n; i++) {
        if (reduce == KVE_REDUCE_MAX) {
            float m = q[i];
            for (size_t r = 1; r < group; r++)
                if (q[r * ld + i] > m)
                    m = q[r * ld + i];
            out[i] = m;
            continue;
        }
        double s = 0.0;
        for (size_t r = 0; r < group; r++)
            s += (double)q[r * ld + i];
        out[i] = (float)(reduce == KVE_REDUCE_MEAN ? s / (double)group : s);
    }
}

static void grouped_workload(const char *spec, size_t heads, size_t group, kve_reduce reduce,
                             uint64_t seed)
{
    twin t;
    ASSERT_TRUE(twin_new(&t, spec, heads, 0, seed));
    kve_rng *g = &t.g;
    for (int s = 0; s < 300; s++) {
        size_t ld = max_size(&t, 0, heads) + (size_t)kve_rng_below(g, 4);
        for (size_t r = 0; r < heads * group; r++)
            for (size_t i = 0; i < ld; i++)
                rows[r * ld + i] = random_weight(g, t.pool, kve_bank_size(t.b, r / group) + 1);
        int with_attn = kve_rng_below(g, 10) != 0;
        t.pos++;
        ASSERT_OK(kve_bank_step_range(t.b, 0, kve_bank_heads(t.b), t.pos, with_attn ? rows : NULL, ld, group, reduce, NULL, 0));
        for (size_t h = 0; h < heads; h++) {
            size_t n = kve_policy_size(t.p[h]);
            naive_reduce(rows + h * group * ld, ld, group, reduce, n, reduced);
            ASSERT_OK(kve_policy_step(t.p[h], t.pos, with_attn ? reduced : NULL, n));
        }
        if (!twin_same(&t, "after a grouped step"))
            CHECK_FAIL_AT("%s, group %zu, reduce %d: step %d (seed %" PRIu64 ")", spec, group,
                          (int)reduce, s, seed);
        if (!evict_range(&t, 0, heads, t.budget))
            CHECK_FAIL_AT("%s: evict after grouped step %d", spec, s);
    }
    twin_free(&t);
}

static void test_grouped_matches_naive_reduction(void)
{
    static const char *const specs[] = {
        "h2o:budget=40,recent_window=4", "tova:budget=33,recent_window=0",
        "h2o_decay:budget=20,recent_window=3,decay=0.9", "h2o_mean:budget=37,recent_window=5",
        "scissorhands:budget=30,recent_window=2,history=9", "scissorhands:budget=21,recent_window=1",
        "window:budget=9", "random:budget=25,recent_window=2",
    };
    static const kve_reduce reduces[] = {KVE_REDUCE_MEAN, KVE_REDUCE_SUM, KVE_REDUCE_MAX};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        for (size_t group = 1; group <= MAXG; group++)
            for (size_t r = 0; r < 3; r++) {
                int before = check_failures;
                grouped_workload(specs[i], 3, group, reduces[r], check_seed + 31 * i + group);
                if (check_failures != before)
                    return;
            }
}

/* The sum is taken in double: (1, 2^-24, 2^-24) sums to 1 + 2^-23 in double
 * (a float32), to 1 in float32 (1 + 2^-24 rounds back to 1, twice). Against
 * a slot of exactly 1, the double sum makes that slot the victim; a float sum
 * would tie and evict the lower position instead. */
static void test_grouped_sum_is_taken_in_double(void)
{
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("tova:budget=4,recent_window=0", 1, NULL, &b));
    ASSERT_OK(kve_bank_step(b, 0, NULL, 0));
    ASSERT_OK(kve_bank_step(b, 1, (const float[]){0.0f}, 1));
    const float tiny = 0x1p-24f;
    const float q[3 * 2] = {1.0f, 1.0f, tiny, 0.0f, tiny, 0.0f}; /* 3 query rows, ld 2 */
    ASSERT_OK(kve_bank_step_range(b, 0, kve_bank_heads(b), 2, q, 2, 3, KVE_REDUCE_SUM, NULL, 0));
    int32_t v[4];
    size_t c = 0;
    /* Scores: pos 0: 1 + 2^-23, pos 1: 1, pos 2: 0 (the newcomer). */
    ASSERT_OK(kve_bank_evict(b, 2, v, 4, &c));
    ASSERT_EQ(c, 1);
    ASSERT_EQ(v[0], 2);
    ASSERT_OK(kve_bank_evict(b, 1, v, 4, &c));
    ASSERT_EQ(c, 1);
    ASSERT_EQ(v[0], 1);
    kve_bank_free(b);
}

/* ---- refusals ---- */

/* After a refusal the bank must equal its twins, and keep equalling them. */
#define REFUSED(t, call, want, needle)                                   \
    do {                                                                          \
        ASSERT_STATUS(call, want);                                                \
        ASSERT_CONTAINS(kve_last_error(), needle);                                \
        if (!twin_same(t, needle))                                                \
            CHECK_FAIL_AT("a refusal (%s) changed a head", needle);               \
        for (int k_ = 0; k_ < 3; k_++)                                            \
            if (!step_range(t, 0, (t)->heads, 1) ||                               \
                !evict_range(t, 0, (t)->heads, (t)->budget))                      \
                CHECK_FAIL_AT("behaviour changed after %s", needle);              \
    } while (0)

static void refusals(const char *spec, size_t dim, uint64_t seed)
{
    twin t;
    const size_t H = 4;
    ASSERT_TRUE(twin_new(&t, spec, H, dim, seed));
    size_t budget = t.budget;
    for (int s = 0; s < 40; s++) {
        ASSERT_TRUE(step_range(&t, 0, H, 1));
        ASSERT_TRUE(evict_range(&t, 0, H, budget));
    }
    for (size_t i = 0; i < H * MAXG * MAXN; i++)
        rows[i] = 0.25f;
    REFUSED(&t, kve_bank_step(t.b, -1, NULL, 0), KVE_EINVAL, "negative");
    /* Heads apart: the last head one step ahead (one more position, a later
     * last position); pos is then new for heads 0..2 but not for head 3. */
    ASSERT_TRUE(step_range(&t, H - 1, 1, 1));
    size_t n_last = kve_bank_size(t.b, H - 1), ld;
    ASSERT_TRUE(n_last == kve_bank_size(t.b, 0) + 1);
    REFUSED(&t, kve_bank_step(t.b, t.pos, rows, n_last), KVE_EINVAL, "head 3: pos");
    ASSERT_TRUE(step_range(&t, H - 1, 1, 1));
    n_last = kve_bank_size(t.b, H - 1);
    REFUSED(&t, kve_bank_step(t.b, t.pos + 1, rows, n_last - 1), KVE_EINVAL,
            "head 3: ld");
    /* A bad weight in the last head's row: no head may have taken its row. */
    static const struct {
        float bad;
        const char *word;
    } weights[] = {{NAN, "NaN"}, {INFINITY, "infinite"}, {-0.5f, "negative"}};
    for (size_t w = 0; w < 3; w++) {
        n_last = kve_bank_size(t.b, H - 1);
        ld = n_last;
        for (size_t i = 0; i < H * MAXG * ld; i++)
            rows[i] = 0.25f;
        rows[(H - 1) * ld + n_last - 1] = weights[w].bad;
        char needle[48];
        snprintf(needle, sizeof needle, "head 3: attn[%zu]", n_last - 1);
        REFUSED(&t, kve_bank_step(t.b, t.pos + 1, rows, ld), KVE_EINVAL, needle);
        ASSERT_CONTAINS(kve_last_error(), weights[w].word);
        /* The same row as query row 1 of the last head of a grouped step. */
        for (size_t i = 0; i < H * MAXG * ld; i++)
            rows[i] = 0.25f;
        rows[((H - 1) * 2 + 1) * ld + 2] = weights[w].bad;
        REFUSED(&t, kve_bank_step_range(t.b, 0, kve_bank_heads(t.b), t.pos + 1, rows, ld, 2, KVE_REDUCE_MEAN, NULL, 0),
                KVE_EINVAL, "head 3: query row 7: attn[2]");
    }
    ld = kve_bank_size(t.b, H - 1);
    for (size_t i = 0; i < H * MAXG * ld; i++)
        rows[i] = 0.25f;
    /* A sum only float32 overflows; the mean and max of the same rows are fine. */
    rows[((H - 1) * 2) * ld + 1] = FLT_MAX;
    rows[((H - 1) * 2 + 1) * ld + 1] = FLT_MAX;
    REFUSED(&t, kve_bank_step_range(t.b, 0, kve_bank_heads(t.b), t.pos + 1, rows, ld, 2, KVE_REDUCE_SUM, NULL, 0),
            KVE_EINVAL, "overflows float32");
    REFUSED(&t, kve_bank_step_range(t.b, 0, kve_bank_heads(t.b), t.pos + 1, rows, ld, 0, KVE_REDUCE_MEAN, NULL, 0),
            KVE_EINVAL, "group");
    REFUSED(&t, kve_bank_step_range(t.b, 0, kve_bank_heads(t.b), t.pos + 1, rows, ld, 2, (kve_reduce)7, NULL, 0),
            KVE_EINVAL, "reduce 7");
    REFUSED(&t, kve_bank_step_range(t.b, 2, 3, t.pos + 1, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0),
            KVE_EINVAL, "out of range");
    REFUSED(&t, kve_bank_step_range(t.b, 5, 0, t.pos + 1, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0),
            KVE_EINVAL, "out of range");
    REFUSED(&t, kve_bank_step(NULL, t.pos + 1, NULL, 0), KVE_EINVAL, "bank is NULL");

    /* Keys: missing for a policy that reads them, too close together, or
     * with a bad entry in the last head's: no head may have taken one. */
    if (dim) {
        for (size_t i = 0; i < H * (MAXD + 3); i++)
            keys[i] = 0.5f;
        if (kve_bank_reads(t.b) & KVE_READS_KEYS)
            REFUSED(&t, kve_bank_step_range(t.b, 0, H, t.pos + 1, NULL, 0, 1, KVE_REDUCE_MEAN,
                                           NULL, 0),
                    KVE_EINVAL, "head 0: the policy reads keys, but the step carries none");
        REFUSED(&t, kve_bank_step_range(t.b, 0, H, t.pos + 1, NULL, 0, 1, KVE_REDUCE_MEAN, keys,
                                       dim - 1),
                KVE_EINVAL, "ld_keys");
        keys[(H - 1) * dim + dim - 1] = NAN;
        char needle[48];
        snprintf(needle, sizeof needle, "head 3: key[%zu] = nan is NaN", dim - 1);
        REFUSED(&t, kve_bank_step_range(t.b, 0, H, t.pos + 1, NULL, 0, 1, KVE_REDUCE_MEAN, keys,
                                       dim),
                KVE_EINVAL, needle);
    }

    /* Evict: only the last head needs two victims; a buffer of one refuses
     * them all. */
    ASSERT_TRUE(step_range(&t, 0, H, 1));
    ASSERT_TRUE(step_range(&t, H - 1, 1, 1));
    size_t counts[MAXH] = {7, 7, 7, 7};
    REFUSED(&t, kve_bank_evict(t.b, budget, bank_victims, 1, counts), KVE_ERANGE,
            "head 3: 2 victims to report but ld_victims is 1");
    ASSERT_EQ(counts[0], 7);
    REFUSED(&t, kve_bank_evict(t.b, 0, bank_victims, 8, counts), KVE_EINVAL, "budget");
    REFUSED(&t, kve_bank_evict(t.b, budget, NULL, 8, counts), KVE_EINVAL,
            "victims is NULL");
    REFUSED(&t, kve_bank_evict_range(t.b, 4, 1, budget, bank_victims, 8, counts),
            KVE_EINVAL, "out of range");
    REFUSED(&t, kve_bank_evict(NULL, budget, bank_victims, 8, counts), KVE_EINVAL,
            "bank is NULL");
    twin_free(&t);
}

static void test_refusals_change_no_head(void)
{
    static const char *const specs[] = {
        "h2o:budget=12,recent_window=3",  "tova:budget=10,recent_window=1",
        "h2o_decay:budget=9,recent_window=2", "h2o_mean:budget=11,recent_window=2",
        "scissorhands:budget=10,recent_window=2,history=5", "random:budget=10,recent_window=2",
        "streaming:budget=10,sinks=2", "window:budget=10",
        "knorm:budget=10,recent_window=2", "keydiff:budget=9,recent_window=0",
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        int before = check_failures;
        refusals(specs[i], i % 2 || i >= 8 ? 6 : 0, check_seed + i);
        if (check_failures != before)
            return;
    }
    /* The budget refusals name the parameter, as a policy's do. */
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("h2o:budget=8,recent_window=4", 2, NULL, &b));
    ASSERT_STATUS(kve_bank_evict(b, 4, bank_victims, 8, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "recent_window 4");
    kve_bank_free(b);
    ASSERT_OK(kve_bank_new("streaming:budget=8,sinks=3", 2, NULL, &b));
    ASSERT_STATUS(kve_bank_evict(b, 3, bank_victims, 8, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "sinks 3");
    kve_bank_free(b);
}

/* ---- construction, generators, accessors ---- */

static void test_construction(void)
{
    kve_bank *b = (kve_bank *)&b, *sentinel = b;
    kve_rng g, before;
    kve_rng_seed(&g, 5);
    before = g;
    ASSERT_STATUS(kve_bank_new("h2o", 2, NULL, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "out");
    ASSERT_STATUS(kve_bank_new(NULL, 2, NULL, &b), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_new("h2o:budget=0", 2, &g, &b), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "budget");
    ASSERT_STATUS(kve_bank_new("nosuch", 2, &g, &b), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "unknown policy");
    ASSERT_STATUS(kve_bank_new("h2o", 0, &g, &b), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "n_heads");
    ASSERT_STATUS(kve_bank_new("random", 3, NULL, &b), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "rng");
    ASSERT_STATUS(kve_bank_new("h2o", SIZE_MAX, &g, &b), KVE_ENOMEM);
    ASSERT_STATUS(kve_bank_new("h2o:budget=16777216", SIZE_MAX / 100, &g, &b), KVE_ENOMEM);
    ASSERT_TRUE(b == sentinel);
    ASSERT_TRUE(memcmp(&g, &before, sizeof g) == 0);

    /* A bank of `random` draws one output per head; deterministic policies none. */
    ASSERT_OK(kve_bank_new("random:budget=8", 3, &g, &b));
    kve_rng three = before;
    for (int i = 0; i < 3; i++)
        (void)kve_rng_next(&three);
    ASSERT_TRUE(memcmp(&g, &three, sizeof g) == 0);
    kve_bank_free(b);
    ASSERT_OK(kve_bank_new("h2o:budget=8,recent_window=2", 3, &g, &b));
    ASSERT_TRUE(memcmp(&g, &three, sizeof g) == 0);

    ASSERT_EQ(kve_bank_heads(b), 3);
    ASSERT_STR_EQ(kve_bank_spec(b), "h2o:budget=8,recent_window=2");
    ASSERT_EQ(kve_bank_budget(b), 8);
    ASSERT_EQ(kve_bank_size(b, 0), 0);
    ASSERT_EQ(kve_bank_size(b, 3), 0);
    ASSERT_TRUE(kve_bank_positions(b, 3) == NULL);
    ASSERT_TRUE(kve_bank_positions(b, 2) != NULL);
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=8,recent_window=2", NULL, &p));
    ASSERT_EQ(kve_bank_state_bytes(b), 3 * kve_policy_state_bytes(p));
    kve_policy_free(p);
    kve_bank_free(b);

    ASSERT_EQ(kve_bank_heads(NULL), 0);
    ASSERT_EQ(kve_bank_size(NULL, 0), 0);
    ASSERT_TRUE(kve_bank_positions(NULL, 0) == NULL);
    ASSERT_EQ(kve_bank_state_bytes(NULL), 0);
    ASSERT_TRUE(kve_bank_spec(NULL) == NULL);
    ASSERT_EQ(kve_bank_budget(NULL), 0);
    kve_bank_free(NULL);
    ASSERT_STATUS(kve_bank_step_range(NULL, 0, kve_bank_heads(NULL), 0, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_evict_range(NULL, 0, 0, 4, NULL, 0, NULL), KVE_EINVAL);
}

/* Heads stepped past their slots move to private storage, one at a time;
 * the state bytes follow, and the slabs go once no head uses them. */
/* kve_bank_sizes: each head's size and the largest, in one call, equal to
 * kve_bank_size head by head; a range past the bank refused with nothing
 * written. */
static void test_sizes(void)
{
    enum { H = 5, B = 6 };
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("h2o:budget=6,recent_window=2", H, NULL, &b));
    size_t sizes[H + 1], largest = 99;
    ASSERT_OK(kve_bank_sizes(b, 0, H, sizes, &largest));
    ASSERT_EQ(largest, 0);
    float attn[H * (B + 4)];
    for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++)
        attn[i] = 0.1f;
    for (int32_t pos = 0; pos < 9; pos++) {
        ASSERT_OK(kve_bank_step(b, pos, attn, B + 4));
        int32_t victims[3 * 4];
        if (pos % 3 == 0)
            ASSERT_OK(kve_bank_evict_range(b, 1, 3, B, victims, 4, NULL));
    }
    ASSERT_OK(kve_bank_sizes(b, 0, H, sizes, &largest));
    size_t most = 0;
    for (size_t h = 0; h < H; h++) {
        ASSERT_EQ(sizes[h], kve_bank_size(b, h));
        most = sizes[h] > most ? sizes[h] : most;
    }
    ASSERT_EQ(largest, most);
    ASSERT_EQ(sizes[0], 9);
    ASSERT_EQ(sizes[1], 8); /* evicted to 6 at position 6, then two more */
    ASSERT_EQ(largest, 9);
    sizes[H] = 77;
    ASSERT_OK(kve_bank_sizes(b, 2, 3, sizes, NULL)); /* a range; largest not wanted */
    ASSERT_EQ(sizes[0], kve_bank_size(b, 2));
    ASSERT_EQ(sizes[2], kve_bank_size(b, 4));
    ASSERT_OK(kve_bank_sizes(b, 1, 2, NULL, &largest)); /* the largest alone */
    ASSERT_EQ(largest, kve_bank_size(b, 1) > kve_bank_size(b, 2) ? kve_bank_size(b, 1)
                                                                   : kve_bank_size(b, 2));
    ASSERT_OK(kve_bank_sizes(b, H, 0, sizes, &largest));
    ASSERT_EQ(largest, 0);
    largest = 99;
    sizes[0] = 77;
    ASSERT_STATUS(kve_bank_sizes(b, 3, 3, sizes, &largest), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "sizes: heads 3 + 3 are out of range: the bank has 5");
    ASSERT_STATUS(kve_bank_sizes(b, H + 1, 0, sizes, &largest), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_sizes(NULL, 0, 0, sizes, &largest), KVE_EINVAL);
    ASSERT_EQ(largest, 99);
    ASSERT_EQ(sizes[0], 77);
    kve_bank_free(b);
}

static void test_growth(void)
{
    kve_bank *b = NULL;
    kve_policy *p = NULL;
    ASSERT_OK(kve_bank_new("full:budget=4", 3, NULL, &b));
    ASSERT_OK(kve_policy_new("full:budget=4", NULL, &p));
    const size_t slot = kve_policy_state_bytes(p) / 5; /* 5 slots of 4 bytes */
    ASSERT_EQ(kve_bank_state_bytes(b), 3 * 5 * slot);
    int32_t pos = 0;
    for (; pos < 5; pos++)
        ASSERT_OK(kve_bank_step(b, pos, NULL, 0));
    ASSERT_EQ(kve_bank_state_bytes(b), 3 * 5 * slot); /* full, not grown */
    /* Head 1 alone grows: the slabs stay for heads 0 and 2. */
    ASSERT_OK(kve_bank_step_range(b, 1, 1, pos++, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0));
    ASSERT_EQ(kve_bank_state_bytes(b), (3 * 5 + 10) * slot);
    ASSERT_EQ(kve_bank_size(b, 1), 6);
    /* Then every head grows: head 1 has room, heads 0 and 2 leave the slabs. */
    ASSERT_OK(kve_bank_step(b, pos++, NULL, 0));
    ASSERT_EQ(kve_bank_state_bytes(b), 3 * 10 * slot);
    for (size_t h = 0; h < 3; h++) {
        size_t n = kve_bank_size(b, h);
        ASSERT_EQ(n, h == 1 ? 7 : 6);
        ASSERT_EQ(kve_bank_positions(b, h)[n - 1], 6);
        ASSERT_EQ(kve_bank_positions(b, h)[0], 0);
    }
    size_t counts[3];
    ASSERT_OK(kve_bank_evict(b, 1, NULL, 0, counts)); /* full never evicts */
    ASSERT_EQ(counts[1], 0);
    kve_policy_free(p);
    kve_bank_free(b);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_construction);
    RUN(test_growth);
    RUN(test_sizes);
    RUN(test_bank_matches_policies);
    RUN(test_grouped_matches_naive_reduction);
    RUN(test_grouped_sum_is_taken_in_double);
    RUN(test_refusals_change_no_head);
    return CHECK_DONE();
}
