/* SPDX-License-Identifier: MIT */
/*
 * test_isa.c - every instruction-set path against the scalar one, bit for
 * bit (src/kernels.h, src/simd.h).
 *
 * Each supported path (scalar, AVX2, AVX-512) is forced in turn through the
 * private hook kve__isa_force, and the same workloads run on each: banks of
 * every policy at small budgets (vector tails) and large ones (whole blocks
 * of four vectors), grouped steps with every reduction, NULL rows, ties,
 * steps without evicts, evictions below the budget, each bank built checked
 * and unchecked (kve_bank_options.unchecked: valid weights must give the
 * same bits whether validated or not); then each spec as a policy (one head,
 * kve_policy_step_keys, its own compiled step), unchecked on every path
 * against the scalar checked one. After every step the
 * victims, counts, kept sets and the bits of every score are hashed; the hash
 * sequence of each path must equal the scalar path's, and the first step
 * that differs is reported. Then the pieces on their own: the validation and
 * argmin kernels on adversarial rows, and each operation of the vector
 * vocabulary against its one-lane definition, including the inputs an engine
 * cannot reach through the API (counts of 2^31 and more). Paths the CPU lacks
 * are skipped and said so. Deterministic per seed (printed; argv[1]).
 */
#include "check.h"
#include "policy_impl.h"
#include "simd.h"
#include "workload.h"

#include <float.h>

enum { H = 3, MAXG = 3, MAXN = 1200, STEPS = 700 };

static const char *const isa_names[KVE_ISA_COUNT] = {"scalar", "avx2", "avx512"};

enum { MAXD = 128 };

enum { QG = 2, VD = 5 }; /* queries a KV head and value floats, for the policies that read them */

static float rows[H * MAXG * MAXN];
static float keys[H * MAXD], key_pool[4 * MAXD];
static float queries[H * QG * MAXD], values[H * VD];
static int32_t victims[H * MAXN];

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15u + (h << 6) + (h >> 2);
    return h * 0x100000001b3u;
}

/* Kept positions and every column the rule wrote, read through the lazy gap
 * (not the scratch columns, whose slots a step may leave unwritten). */
static uint64_t hash_bank(const kve_bank *b, uint64_t h)
{
    for (size_t k = 0; k < b->n_heads; k++) {
        const kve_head *hd = &b->heads[k];
        h = mix(h, hd->size);
        for (size_t i = 0; i < hd->size; i++) {
            size_t src = hd->gap != KVE_NONE && i >= hd->gap ? i + 1 : i;
            h = mix(h, (uint64_t)((const int32_t *)hd->col[KVE_COL_POS])[i]);
            for (int c = KVE_COL_SCORE; c < KVE_NCOLS; c++) {
                size_t e = b->cfg.elem[c];
                if (!e || c == KVE_COL_MARK || !KVE_COL_LAZY(c))
                    continue;
                const char *at = (const char *)hd->col[c] + src * e;
                for (size_t o = 0; o < e; o += 8) { /* a unit key is 4 d bytes */
                    uint64_t bits = 0;
                    memcpy(&bits, at + o, e - o < 8 ? e - o : 8);
                    h = mix(h, bits);
                }
            }
        }
    }
    return h;
}

/* Runs the workload of `spec` with keys of `dim` floats (0: none) on the
 * current path, in a bank of H heads or (as_policy) in a policy, one head
 * stepped through kve_policy_step_keys (group 1) and kve_policy_evict, built
 * checked or unchecked; hashes[s] after step s. */
static int run(const char *spec, size_t dim, int unchecked, int as_policy, uint64_t seed,
               uint64_t *hashes)
{
    kve_rng rb, g;
    kve_rng_seed(&rb, seed);
    kve_rng_seed(&g, seed ^ 0xabcdef);
    kve_bank *b = NULL;
    kve_policy *p = NULL;
    if (dim > MAXD)
        return 0;
    kve_policy_options po = kve_policy_default_options();
    po.key_dim = dim;
    po.value_dim = VD; /* vnorm=1 and expected_attention read values */
    po.query_group = QG;
    po.rope.rotary_dim = dim - dim % 2;
    po.rope.pairs = dim % 4 ? KVE_ROPE_ADJACENT : KVE_ROPE_HALF;
    po.unchecked = unchecked;
    if (as_policy) {
        if (kve_policy_new_ex(spec, &rb, &po, &p) != KVE_OK)
            return 0;
        b = &p->bank;
    } else {
        kve_bank_options o = kve_bank_default_options();
        o.key_dim = dim;
        o.value_dim = po.value_dim;
        o.query_group = po.query_group;
        o.rope = po.rope;
        o.unchecked = unchecked;
        if (kve_bank_new_ex(spec, H, &rb, &o, &b) != KVE_OK)
            return 0;
    }
    const size_t heads = b->n_heads;
    const kve_reads reads = kve_bank_reads(b);
    size_t budget = b->cfg.params.budget;
    size_t lo = (b->cfg.params.recent_window > b->cfg.params.sinks ? b->cfg.params.recent_window
                                                                    : b->cfg.params.sinks) + 1;
    float pool[4] = {0.5f, 0.25f, 1.0f, 0.125f};
    uint64_t h = 0;
    for (int s = 0; s < STEPS; s++) {
        if (s % 60 == 0) {
            for (int k = 0; k < 4; k++)
                pool[k] = (float)kve_rng_uniform(&g);
            for (size_t j = 0; j < 4 * dim; j++)
                key_pool[j] = (float)(kve_rng_uniform(&g) * 2.0 - 1.0);
        }
        size_t n = 0;
        for (size_t k = 0; k < heads; k++)
            n = b->heads[k].size > n ? b->heads[k].size : n;
        size_t group = p ? 1 : 1 + (size_t)kve_rng_below(&g, MAXG);
        kve_reduce reduce = (kve_reduce)kve_rng_below(&g, 3);
        for (size_t r = 0; r < heads * group; r++)
            for (size_t i = 0; i < n; i++)
                rows[r * n + i] = random_weight(&g, pool, n);
        const float *attn = kve_rng_below(&g, 10) ? rows : NULL;
        for (size_t k = 0; k < heads; k++)
            random_key(&g, key_pool, dim, keys + k * MAXD);
        kve_step_data d = kve_step_default_data();
        d.attn = attn;
        d.ld = n;
        d.group = group;
        d.reduce = reduce;
        d.keys = dim ? keys : NULL;
        d.ld_keys = MAXD;
        if (reads & KVE_READS_QUERIES) { /* queries near the pool's keys, now and then one */
            for (size_t k = 0; k < H * QG; k++)
                random_key(&g, key_pool, dim, queries + k * MAXD);
            d.queries = queries;
            d.ld_queries = MAXD;
            d.flags = kve_rng_below(&g, 30) == 0 ? KVE_STEP_RESCORE : 0;
        }
        if (reads & KVE_READS_VALUES) {
            for (size_t k = 0; k < H * VD; k++) /* zeros and ties among the norms */
                values[k] = kve_rng_below(&g, 8) ? (float)kve_rng_below(&g, 5) - 2.0f : 0.0f;
            d.values = values;
            d.ld_values = VD;
        }
        kve_status st;
        if (p && !(reads & (KVE_READS_QUERIES | KVE_READS_VALUES))) /* the policy's own step */
            st = kve_policy_step_keys(p, s, attn, n, dim ? keys : NULL);
        else
            st = p ? kve_policy_step_data(p, s, &d) : kve_bank_step_data(b, 0, H, s, &d);
        if (st != KVE_OK)
            break;
        h = hash_bank(b, h);
        if (n + 1 < MAXN && kve_rng_below(&g, 12) == 0)
            ; /* no evict: the next step grows or runs without a victim */
        else {
            size_t to = budget;
            if (kve_rng_below(&g, 20) == 0 && budget > lo)
                to = lo + (size_t)kve_rng_below(&g, budget - lo);
            size_t counts[H];
            if ((p ? kve_policy_evict(p, to, victims, MAXN, counts)
                   : kve_bank_evict(b, to, victims, MAXN, counts)) != KVE_OK)
                break;
            for (size_t k = 0; k < heads; k++) {
                h = mix(h, counts[k]);
                for (size_t i = 0; i < counts[k]; i++)
                    h = mix(h, (uint64_t)victims[k * MAXN + i]);
            }
            h = hash_bank(b, h);
        }
        hashes[s] = h;
    }
    if (p)
        kve_policy_free(p);
    else
        kve_bank_free(b);
    return 1;
}

static uint64_t want[STEPS], got[STEPS];

/* A score rule with state (a decayed sum and a count) that reads the value
 * norms: whatever a rule computes, the scored mechanism around it must give
 * the same bits on every path. */
static kve_status isa_rule(void *user, const kve_score_step *s)
{
    (void)user;
    for (size_t i = 0; i < s->n; i++) {
        double *st = s->new_state + i * 2;
        st[0] = 0.75 * st[0] + (double)s->attn[i];
        st[1] += 1.0;
        s->new_score[i] = st[0] / st[1] + s->vnorm[i] * 1e-3;
    }
    return KVE_OK;
}

static void test_every_path_equals_scalar(void)
{
    static const char *const large[] = {
        "h2o:budget=300,recent_window=7", "tova:budget=129,recent_window=0",
        "h2o_decay:budget=257,recent_window=5,decay=0.97", "h2o_mean:budget=200,recent_window=3",
        "scissorhands:budget=250,recent_window=9,history=64", "scissorhands:budget=130,recent_window=1",
        "h2o:budget=1000,recent_window=0", "random:budget=100,recent_window=4",
        "streaming:budget=77,sinks=3",
        "knorm:budget=300,recent_window=5", "keydiff:budget=260,recent_window=3",
        "keydiff:budget=70,recent_window=0",
        /* vnorm=1 on every rule, expected_attention, and a score rule */
        "h2o:budget=101,recent_window=7,vnorm=1", "tova:budget=67,recent_window=0,vnorm=1",
        "h2o_decay:budget=93,recent_window=5,decay=0.97,vnorm=1",
        "h2o_mean:budget=71,recent_window=3,vnorm=1",
        "scissorhands:budget=97,recent_window=9,history=64,vnorm=1",
        "scissorhands:budget=66,recent_window=1,vnorm=1",
        "expected_attention:budget=90,interval=3,n_queries=24",
        "expected_attention:budget=40,recent_window=3,n_sink=2,interval=7,use_covariance=0,"
        "n_queries=30,epsilon=0.5",
        "isa_rule:budget=150,recent_window=4", "isa_rule:budget=70,recent_window=0,vnorm=1",
    };
    static const size_t large_dim[] = {0,  0,  0,  0,  0, 0, 0, 0, 0, 128, 64, 77,
                                       0,  0,  0,  0,  0, 0, 16, 13, 0, 0};
    _Static_assert(sizeof large_dim / sizeof large_dim[0] == sizeof large / sizeof large[0],
                   "one key dimension per large spec");
    size_t n_small = sizeof workload_specs / sizeof workload_specs[0];
    size_t n_large = sizeof large / sizeof large[0];
    int paths = 0;
    kve_score_rule rule = kve_score_rule_default();
    rule.name = "isa_rule";
    rule.observe = isa_rule;
    rule.state = 2;
    rule.values = 1;
    ASSERT_OK(kve_score_rule_register(&rule));
    /* Every path, checked and unchecked (which skips the validation of the
     * weights, all valid here), against the scalar checked path. */
    for (int isa = KVE_ISA_SCALAR + 1; isa < KVE_ISA_COUNT; isa++) {
        paths += kve__isa_supported((kve_isa)isa);
        if (!kve__isa_supported((kve_isa)isa))
            printf("  (%s: not supported by this CPU, skipped)\n", isa_names[isa]);
    }
    for (size_t i = 0; i < 2 * (n_small + n_large); i++) {
        const int as_policy = i >= n_small + n_large; /* then each spec as a policy */
        const size_t j = i % (n_small + n_large);
        const char *spec = j < n_small ? workload_specs[j] : large[j - n_small];
        size_t dim = j < n_small ? workload_key_dim(spec, j) : large_dim[j - n_small];
        uint64_t seed = check_seed + j;
        ASSERT_TRUE(kve__isa_force(KVE_ISA_SCALAR));
        ASSERT_TRUE(run(spec, dim, 0, as_policy, seed, want));
        for (int isa = KVE_ISA_SCALAR; isa < KVE_ISA_COUNT; isa++) {
            if (!kve__isa_force((kve_isa)isa))
                continue;
            ASSERT_STR_EQ(kve_isa_name(), isa_names[isa]);
            /* A policy's checked step is the bank's code (above): only its
             * unchecked step is run on every path. */
            for (int unchecked = isa == KVE_ISA_SCALAR || as_policy; unchecked < 2; unchecked++) {
                ASSERT_TRUE(run(spec, dim, unchecked, as_policy, seed, got));
                for (int s = 0; s < STEPS; s++)
                    if (got[s] != want[s]) {
                        kve__isa_force(KVE_ISA_COUNT);
                        CHECK_FAIL_AT("%s (%s): %s%s differs from scalar first at step %d (seed %"
                                      PRIu64 ")", spec, as_policy ? "policy" : "bank",
                                      isa_names[isa], unchecked ? " unchecked" : "", s, seed);
                    }
            }
        }
    }
    ASSERT_TRUE(kve__isa_force(KVE_ISA_COUNT));
    ASSERT_OK(kve_score_rule_unregister("isa_rule"));
    printf("  %d vector path(s) compared, banks checked and unchecked, policies unchecked; "
           "detected: %s\n", paths,
           kve_isa_name());
}

/* Validation and the plain argmin on every path: bad weights at every
 * position of rows of every length around the vector widths, and argmins
 * with ties everywhere. */
static void test_row_kernels(void)
{
    static float a[300];
    static double score[300];
    kve_rng g, g_rng;
    kve_rng_seed(&g, check_seed);
    kve_rng_seed(&g_rng, check_seed + 5);
    static const float bad[] = {NAN, -NAN, INFINITY, -INFINITY, -1.0f, -0x1p-149f};
    for (int isa = 0; isa < KVE_ISA_COUNT; isa++) {
        if (!kve__isa_force((kve_isa)isa))
            continue;
        for (size_t n = 0; n < 70; n++) {
            for (size_t i = 0; i < n; i++)
                a[i] = kve_rng_below(&g, 4) ? (float)kve_rng_uniform(&g) : 0.0f;
            if (n)
                a[kve_rng_below(&g, n)] = -0.0f; /* allowed */
            kve_rows in = {a, n, 1, KVE_REDUCE_MEAN};
            size_t q = 99, at = 99;
            ASSERT_TRUE(!kve__rows_invalid(&in, n, &q, &at));
            for (size_t k = 0; k < n; k++) {
                float keep = a[k];
                a[k] = bad[(k + n) % 6];
                ASSERT_TRUE(kve__rows_invalid(&in, n, &q, &at));
                ASSERT_EQ(q, 0);
                ASSERT_EQ(at, k);
                a[k] = keep;
            }
            /* Sums of two rows: FLT_MAX twice overflows at exactly one slot. */
            if (n >= 2) {
                for (size_t i = 0; i < n; i++)
                    a[i] = 1.0f;
                size_t k = (size_t)kve_rng_below(&g, n / 2);
                a[k] = FLT_MAX;
                a[n / 2 + k] = FLT_MAX;
                kve_rows sum = {a, n / 2, 2, KVE_REDUCE_SUM};
                ASSERT_TRUE(kve__rows_invalid(&sum, n / 2, &q, &at));
                ASSERT_EQ(q, 2);
                ASSERT_EQ(at, k);
                kve_rows mean = {a, n / 2, 2, KVE_REDUCE_MEAN};
                ASSERT_TRUE(!kve__rows_invalid(&mean, n / 2, &q, &at));
            }
            /* Argmin: few distinct values, so ties everywhere; naive answer. */
            for (size_t i = 0; i < n; i++)
                score[i] = (double)kve_rng_below(&g, 3) * 0.5;
            size_t best = n ? 0 : KVE_NONE;
            for (size_t i = 1; i < n; i++)
                if (score[i] < score[best])
                    best = i;
            ASSERT_EQ(kve__shift_argmin(score, n, n, n), best);
            /* With a hole at g: the argmin of the closed-up column, closed. */
            if (n >= 2) {
                size_t hole = (size_t)kve_rng_below(&g_rng, n - 1);
                size_t lim = (size_t)kve_rng_below(&g_rng, n);
                static double closed[300];
                for (size_t i = 0; i < n - 1; i++)
                    closed[i] = score[i + (i >= hole)];
                size_t low = lim ? 0 : KVE_NONE;
                for (size_t i = 1; i < lim; i++)
                    if (closed[i] < closed[low])
                        low = i;
                ASSERT_EQ(kve__shift_argmin(score, n - 1, hole, lim), low);
                ASSERT_TRUE(memcmp(score, closed, (n - 1) * sizeof *score) == 0);
            }
            /* No score below +inf (only an unchecked step's garbage can do
             * that): slot 0, never KVE_NONE, unless there is no candidate. */
            for (size_t i = 0; i < n; i++)
                score[i] = i % 3 ? (double)NAN : (double)INFINITY;
            ASSERT_EQ(kve__shift_argmin(score, n, n, n), n ? 0 : KVE_NONE);
            if (n >= 2) {
                score[n - 1] = -INFINITY;
                ASSERT_EQ(kve__shift_argmin(score, n, n, n), n - 1);
            }
        }
    }
    kve__isa_force(KVE_ISA_COUNT);
}

/* ---- the vector vocabulary, operation by operation ---- */

/* Operands: slot i of each array is lane i % W of vector i / W. */
static double dx[64], dy[64];
static float fa[64], fb[64];
static uint64_t ux[64];
static uint32_t hx[64], hy[64];

enum { N_DOPS = 10, N_UOPS = 3, N_FOPS = 2 };

/* Every operation of one vocabulary on every lane, results stored per op. */
#define LANE_RESULTS(P)                                                                        \
    for (size_t o = 0; o < 64; o += (size_t)P##_W) {                                           \
        P##_d x = P##_ld(dx + o), y = P##_ld(dy + o);                                          \
        P##_f a = P##_ldf(fa + o), b = P##_ldf(fb + o);                                        \
        P##_u u = P##_ldu(ux + o);                                                             \
        P##_h h = P##_ldh(hx + o), k = P##_ldh(hy + o);                                        \
        P##_d d[N_DOPS] = {P##_add(x, y), P##_sub(x, y), P##_mul(x, y), P##_div(x, y),         \
                           P##_min(x, y), P##_cvt(a), P##_cvth(h), P##_cvth(P##_subh(h, k)),   \
                           P##_sel(P##_gtf(a, b), x, y), P##_sel(P##_lt(x, y), y, x)};         \
        P##_u us[N_UOPS] = {                                                                   \
            P##_selu(P##_testu(u, P##_setu(0x8000000000000001u)), u, P##_shlu(u, 1)),          \
            P##_andu(P##_oru(u, P##_setu(3)), P##_setu(0xfffu)),                               \
            P##_selu(P##_lt(x, P##_set(0.5)), P##_setu(1), P##_setu(0))};                      \
        P##_f fs[N_FOPS] = {P##_maxf(a, b), P##_cvtf(x)};                                      \
        for (size_t j = 0; j < N_DOPS; j++)                                                    \
            P##_st(out_d + j * 64 + o, d[j]);                                                  \
        for (size_t j = 0; j < N_UOPS; j++)                                                    \
            P##_stu(out_u + j * 64 + o, us[j]);                                                \
        for (size_t j = 0; j < N_FOPS; j++)                                                    \
            store_##P(out_f + j * 64 + o, fs[j]);                                              \
        any[o / (size_t)P##_W] = P##_any(P##_lt(x, y));                                        \
    }

static void store_kv1(float *p, kv1_f v)
{
    *p = v;
}

/* firstm(k) for every k <= W, as 1.0 (lane set) or 0.0: out[k * W + l]. */
#define FIRSTM_RESULTS(P)                                                                      \
    for (size_t k = 0; k <= (size_t)P##_W; k++)                                                \
        P##_st(out + k * (size_t)P##_W, P##_sel(P##_firstm(k), P##_set(1.0), P##_set(0.0)));

static void firstm_kv1(double *out)
{
    FIRSTM_RESULTS(kv1)
}

static void lanes_kv1(double *out_d, uint64_t *out_u, float *out_f, bool *any)
{
    LANE_RESULTS(kv1)
}

#if KVE_X86
KVE_TARGET_AVX2 static void store_kv4(float *p, kv4_f v)
{
    _mm_storeu_ps(p, v);
}

KVE_TARGET_AVX2 static void lanes_kv4(double *out_d, uint64_t *out_u, float *out_f, bool *any)
{
    LANE_RESULTS(kv4)
}

KVE_TARGET_AVX512 static void store_kv8(float *p, kv8_f v)
{
    _mm256_storeu_ps(p, v);
}

KVE_TARGET_AVX512 static void lanes_kv8(double *out_d, uint64_t *out_u, float *out_f, bool *any)
{
    LANE_RESULTS(kv8)
}

KVE_TARGET_AVX2 static void firstm_kv4(double *out)
{
    FIRSTM_RESULTS(kv4)
}

KVE_TARGET_AVX512 static void firstm_kv8(double *out)
{
    FIRSTM_RESULTS(kv8)
}
#endif

/* The lane mask of the first k lanes, on every path. */
static void test_firstm(void)
{
    double out[9 * 8];
    for (int isa = 0; isa < KVE_ISA_COUNT; isa++) {
        if (!kve__isa_supported((kve_isa)isa))
            continue;
        size_t w = isa == KVE_ISA_SCALAR ? 1 : isa == KVE_ISA_AVX2 ? 4 : 8;
        if (isa == KVE_ISA_SCALAR)
            firstm_kv1(out);
#if KVE_X86
        else if (isa == KVE_ISA_AVX2)
            firstm_kv4(out);
        else
            firstm_kv8(out);
#endif
        for (size_t k = 0; k <= w; k++)
            for (size_t l = 0; l < w; l++)
                if (out[k * w + l] != (l < k ? 1.0 : 0.0))
                    CHECK_FAIL_AT("%s: firstm(%zu) lane %zu", isa_names[isa], k, l);
    }
}

static void test_vocabulary_matches_one_lane(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed ^ 77);
    static const double dspecial[] = {0.0, -0.0, 1.0, 0.5, 1e300, -1e300, 3.0, 0.1};
    static const double dpartner[] = {-0.0, 0.0, 1.0, 0.25, -1e300, 1e300, 3.0, 0.2};
    static const float fspecial[] = {0.0f, -0.0f, 1.0f, FLT_MAX, 0x1p-149f, 0.25f, 3.0f, 0.1f};
    for (size_t i = 0; i < 64; i++) {
        dx[i] = i < 8 ? dspecial[i] : (kve_rng_uniform(&g) - 0.3) * 1e3;
        dy[i] = i < 8 ? dpartner[i] : kve_rng_below(&g, 4) ? dx[i] : kve_rng_uniform(&g);
        fa[i] = i < 8 ? fspecial[i] : (float)kve_rng_uniform(&g);
        fb[i] = i < 8 ? fspecial[(i + 1) % 8] : kve_rng_below(&g, 4) ? fa[i] : 0.5f;
        ux[i] = kve_rng_next(&g);
        /* counts near and past 2^31, which AVX2 must convert as unsigned */
        hx[i] = i % 3 ? (uint32_t)kve_rng_next(&g) : 0x80000000u + (uint32_t)kve_rng_below(&g, 9);
        hy[i] = (uint32_t)kve_rng_next(&g);
    }
    static double d1[N_DOPS * 64], dv[N_DOPS * 64];
    static uint64_t u1[N_UOPS * 64], uv[N_UOPS * 64];
    static float f1[N_FOPS * 64], fv[N_FOPS * 64];
    static bool a1[64], av[64];
    lanes_kv1(d1, u1, f1, a1);
    int compared = 0;
#if KVE_X86
    for (int isa = KVE_ISA_AVX2; isa < KVE_ISA_COUNT; isa++) {
        if (!kve__isa_supported((kve_isa)isa))
            continue;
        size_t w = isa == KVE_ISA_AVX2 ? 4 : 8;
        if (isa == KVE_ISA_AVX2)
            lanes_kv4(dv, uv, fv, av);
        else
            lanes_kv8(dv, uv, fv, av);
        for (size_t i = 0; i < N_DOPS * 64; i++)
            if (memcmp(&dv[i], &d1[i], sizeof dv[i]) != 0)
                CHECK_FAIL_AT("%s: double op %zu, lane %zu: %a, one lane %a", isa_names[isa],
                              i / 64, i % 64, dv[i], d1[i]);
        for (size_t i = 0; i < N_UOPS * 64; i++)
            if (uv[i] != u1[i])
                CHECK_FAIL_AT("%s: uint64 op %zu, lane %zu", isa_names[isa], i / 64, i % 64);
        for (size_t i = 0; i < N_FOPS * 64; i++)
            if (memcmp(&fv[i], &f1[i], sizeof fv[i]) != 0)
                CHECK_FAIL_AT("%s: float op %zu, lane %zu: %a, one lane %a", isa_names[isa],
                              i / 64, i % 64, (double)fv[i], (double)f1[i]);
        for (size_t v = 0; v < 64 / w; v++) {
            bool one = false;
            for (size_t l = 0; l < w; l++)
                one = one || a1[v * w + l];
            ASSERT_EQ(av[v], one);
        }
        compared++;
    }
#endif
    printf("  %d vector vocabularies compared\n", compared);
}

static void test_force_hook(void)
{
    ASSERT_TRUE(kve__isa_force(KVE_ISA_SCALAR));
    ASSERT_STR_EQ(kve_isa_name(), "scalar");
    ASSERT_TRUE(!kve__isa_force((kve_isa)(KVE_ISA_COUNT + 1)));
    ASSERT_STR_EQ(kve_isa_name(), "scalar"); /* a refused force changes nothing */
    ASSERT_TRUE(kve__isa_force(KVE_ISA_COUNT));
    const char *best = kve__isa_supported(KVE_ISA_AVX512)  ? "avx512"
                       : kve__isa_supported(KVE_ISA_AVX2) ? "avx2"
                                                          : "scalar";
    ASSERT_STR_EQ(kve_isa_name(), best);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_force_hook);
    RUN(test_vocabulary_matches_one_lane);
    RUN(test_firstm);
    RUN(test_row_kernels);
    RUN(test_every_path_equals_scalar);
    return CHECK_DONE();
}
