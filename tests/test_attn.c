/* SPDX-License-Identifier: MIT */
/*
 * test_attn.c - attention rows from q and K (kve_attn_row,
 * kve_attn_rows over key tiles of float32 and of half floats,
 * kve_bank_attn_rows) against a softmax
 * computed in double.
 *
 * Tolerance, derived rather than tuned (u = 2^-24, first order): the
 * float32 logit l_i is off by at most delta_i = (ceil(d/16) + 5) * u *
 * |scale| * sum_j |q_j k_ij| (ceil(d/16) products and sums per partial sum,
 * four pairwise levels, the multiply by scale); the argument l_i - m of the
 * exponential gains u * |l_i - m| when rounded; the exponential adds at most
 * 8 u; so e_i has relative error r_i = delta_i + delta_max + u |l_i - m| + 8u,
 * their double sum at most sum_j p_j r_j, the division 2u. A weight p_i is
 * then within p_i (r_i + sum_j p_j r_j + 2u) of the exact softmax, plus
 * 2^-125 absolutely for weights below float32's normal range (the exponential
 * flushes e^x to 0 below x = -87.3). Every weight must lie within that bound
 * of the double-precision softmax of the same float inputs. Rows are
 * checked for every d and n shape class, extreme logits (no overflow, no NaN), n = 1 (exactly 1), every
 * instruction set (bit for bit), the tiled group (bit for bit the rows one
 * by one), the bank layout and every refusal.
 * Deterministic per seed (printed; argv[1]).
 */
#include "check.h"
#include "internal.h"
#include "kernels.h"
#include "kvevict.h"

#include <float.h>
#include <math.h>

enum { MAXN = 1100, MAXD = 160 };

static float q[8 * MAXD], keys[MAXN * (MAXD + 3)], out[8 * MAXN], again[8 * MAXN];
static double ref[MAXN], bound[MAXN];

/* The double softmax of the float inputs and each weight's error bound. */
static void reference(const float *qv, const float *k, size_t n, size_t d, size_t ld,
                      float scale)
{
    static double logit[MAXN], r[MAXN];
    const double u = 0x1p-24;
    double m = -INFINITY, delta_max = 0.0;
    for (size_t i = 0; i < n; i++) {
        double s = 0.0, a = 0.0;
        for (size_t j = 0; j < d; j++) {
            s += (double)qv[j] * (double)k[i * ld + j];
            a += fabs((double)qv[j] * (double)k[i * ld + j]);
        }
        logit[i] = (double)scale * s;
        r[i] = (double)((d + 15) / 16 + 5) * u * fabs((double)scale) * a; /* delta_i */
        m = logit[i] > m ? logit[i] : m;
        delta_max = r[i] > delta_max ? r[i] : delta_max;
    }
    double sum = 0.0, sum_err = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += exp(logit[i] - m);
    for (size_t i = 0; i < n; i++) {
        ref[i] = exp(logit[i] - m) / sum;
        r[i] += delta_max + u * fabs(logit[i] - m) + 8 * u;
        sum_err += ref[i] * r[i];
    }
    for (size_t i = 0; i < n; i++)
        bound[i] = ref[i] * (r[i] + sum_err + 2 * u) * 1.01 + 0x1p-125;
}

static void fill(kve_rng *g, float *v, size_t count, float spread)
{
    for (size_t i = 0; i < count; i++)
        v[i] = (float)((kve_rng_uniform(g) * 2.0 - 1.0) * spread);
}

static int check_row(size_t n, const char *what)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!(fabs((double)out[i] - ref[i]) <= bound[i])) {
            fprintf(stderr, "%s: weight %zu = %.9g, double softmax %.9g, bound %.3g\n", what, i,
                    (double)out[i], ref[i], bound[i]);
            return 0;
        }
        sum += out[i];
    }
    if (n && !(fabs(sum - 1.0) <= 1e-5)) {
        fprintf(stderr, "%s: weights sum to %.9g\n", what, sum);
        return 0;
    }
    return 1;
}

static void test_against_double_softmax(void)
{
    static const size_t ds[] = {1, 3, 15, 16, 17, 64, 128, 130};
    static const size_t ns[] = {1, 2, 7, 8, 9, 100, 1024, 1031};
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            size_t d = ds[a], n = ns[b], ld = d + (size_t)kve_rng_below(&g, 3);
            float scale = (float)(1.0 / sqrt((double)d));
            float spread = (float)(kve_rng_below(&g, 3) + 1) * 2.0f;
            fill(&g, q, d, spread);
            fill(&g, keys, n * ld, spread);
            ASSERT_OK(kve_attn_row(q, d, keys, ld, n, scale, out));
            reference(q, keys, n, d, ld, scale);
            char what[64];
            snprintf(what, sizeof what, "d %zu, n %zu", d, n);
            if (!check_row(n, what))
                CHECK_FAIL_AT("%s (seed %" PRIu64 ")", what, check_seed);
        }
}

/* Logits of +-1e30, and spreads around the exponential's underflow: no
 * overflow, no NaN, the largest logit's key gets its share. */
static void test_extreme_logits(void)
{
    const size_t d = 4, n = 6;
    const float qv[4] = {1.0f, 0.0f, 0.0f, 0.0f};
    static const float firsts[][6] = {
        {1e30f, -1e30f, 0.0f, 1e30f, -3e38f, 3e38f},      /* one key far above the rest */
        {-1e30f, -1e30f, -1e30f, -1e30f, -1e30f, -1e30f}, /* all equal: uniform */
        {0.0f, -87.0f, -87.5f, -88.0f, -104.0f, -200.0f}, /* around the underflow */
        {FLT_MAX, -FLT_MAX, 0.0f, 1.0f, -1.0f, FLT_MAX},
    };
    for (size_t c = 0; c < sizeof firsts / sizeof firsts[0]; c++) {
        memset(keys, 0, n * d * sizeof(float));
        for (size_t i = 0; i < n; i++)
            keys[i * d] = firsts[c][i];
        ASSERT_OK(kve_attn_row(qv, d, keys, d, n, 1.0f, out));
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) {
            ASSERT_TRUE(isfinite(out[i]) && out[i] >= 0.0f);
            sum += out[i];
        }
        ASSERT_NEAR(sum, 1.0, 1e-6);
        reference(qv, keys, n, d, d, 1.0f);
        ASSERT_TRUE(check_row(n, "extreme logits"));
    }
    /* Case 0: 3e38 wins alone; case 1: uniform; case 3: two at FLT_MAX. */
    ASSERT_TRUE(kve_attn_row(qv, d, keys, d, n, 1.0f, out) == KVE_OK);
    ASSERT_TRUE(out[0] == 0.5f && out[5] == 0.5f && out[3] == 0.0f);
    for (size_t i = 0; i < n; i++)
        keys[i * d] = -1e30f;
    ASSERT_OK(kve_attn_row(qv, d, keys, d, n, 1.0f, out));
    for (size_t i = 0; i < n; i++)
        ASSERT_TRUE(out[i] == (float)(1.0 / 6.0));
}

/* The exponential alone: two keys with exact logits 0 and x (d = 1, q = 1,
 * scale 1), so the only errors are the exponential's (at most 8 u relative,
 * as claimed) and the normalisation's: out_1 = e^x / (1 + e^x) within
 * p (8u + 2u), over x in [-87, 0]. */
static void test_exponential(void)
{
    const float one = 1.0f;
    float k[2] = {0.0f, 0.0f};
    double worst = 0.0;
    for (int step = 0; step <= 87000; step++) {
        k[1] = -(float)step / 1000.0f;
        ASSERT_OK(kve_attn_row(&one, 1, k, 1, 2, 1.0f, out));
        double e = exp((double)k[1]), p = e / (1.0 + e);
        double err = fabs((double)out[1] - p) / p;
        if (!(err <= 10 * 0x1p-24))
            CHECK_FAIL_AT("x = %.9g: weight %.9g, exact %.9g: %.3g u", (double)k[1],
                          (double)out[1], p, err / 0x1p-24);
        worst = err > worst ? err : worst;
    }
    printf("  worst relative error %.2f u\n", worst / 0x1p-24);
}

static void test_single_key_is_one(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed + 1);
    for (size_t d = 1; d < 40; d += 7) {
        fill(&g, q, d, 100.0f);
        fill(&g, keys, d, 100.0f);
        out[0] = -1.0f;
        ASSERT_OK(kve_attn_row(q, d, keys, d, 1, 0.125f, out));
        ASSERT_TRUE(out[0] == 1.0f);
    }
    out[0] = 7.0f;
    ASSERT_OK(kve_attn_row(NULL, 4, NULL, 4, 0, 1.0f, NULL)); /* n = 0: nothing */
    ASSERT_TRUE(out[0] == 7.0f);
}

/* Every instruction set writes the same bits, and names the same first
 * non-finite key: head sizes that are and are not multiples of 16 (AVX-512
 * takes sixteen keys at a time when d is one), key counts around 16, padded
 * rows. */
static void test_every_path_same_bits(void)
{
    static const size_t ds[] = {16, 64, 100, 128};
    static const size_t ns[] = {1, 15, 16, 17, 48, 333};
    kve_rng g;
    kve_rng_seed(&g, check_seed + 2);
    int paths = 0, cases = 0;
    for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
            const size_t d = ds[a], n = ns[b], ld = d + (b % 2 ? 0 : 3);
            fill(&g, q, d, 3.0f);
            fill(&g, keys, n * ld, 3.0f);
            ASSERT_TRUE(kve__isa_force(KVE_ISA_SCALAR));
            ASSERT_OK(kve_attn_row(q, d, keys, ld, n, 0.1f, again));
            for (int isa = KVE_ISA_AVX2; isa < KVE_ISA_COUNT; isa++) {
                if (!kve__isa_force((kve_isa)isa))
                    continue;
                ASSERT_OK(kve_attn_row(q, d, keys, ld, n, 0.1f, out));
                ASSERT_TRUE(memcmp(out, again, n * sizeof(float)) == 0);
                paths += a == 0 && b == 0;
            }
            /* one key's logit made infinite: every path names it */
            const size_t bad = (size_t)kve_rng_below(&g, n);
            keys[bad * ld + (size_t)kve_rng_below(&g, d)] = INFINITY;
            for (int isa = KVE_ISA_SCALAR; isa < KVE_ISA_COUNT; isa++) {
                if (!kve__isa_force((kve_isa)isa))
                    continue;
                ASSERT_TRUE(kve_attn_row(q, d, keys, ld, n, 0.1f, out) == KVE_EINVAL);
                char want[64];
                snprintf(want, sizeof want, "the logit of key %zu is not finite", bad);
                ASSERT_TRUE(strstr(kve_last_error(), want) != NULL);
            }
            cases++;
        }
    kve__isa_force(KVE_ISA_COUNT);
    printf("  %d vector path(s) compared on %d shapes\n", paths, cases);
}

/* kve_attn_rows: every row of a group over tiled keys is kve_attn_row's
 * over the same keys in rows, bit for bit, on every instruction set: head
 * sizes below, at, between and above multiples of 16 (a partial sum with
 * no entry when d < 16), key counts that end inside a tile (the lanes past
 * n hold NaN, which must not reach a row), group sizes that take every
 * branch of the eight-four-two-one split; then the bad logit's row and key
 * named, and the refusals. */
static void test_tiled_rows(void)
{
    enum { TD = 128, TN = 340, TR = 15 };
    static const size_t ds[] = {8, 16, 64, 100, TD};
    static const size_t ns[] = {1, 15, 16, 17, 48, 333};
    static const size_t rs[] = {1, 3, 8, TR};
    static float tq[TR * (TD + 1)], tk[TN * TD], tiles[(TN + 15) / 16 * 16 * TD];
    static float rows[TR * TN], one[TN];
    kve_rng g;
    kve_rng_seed(&g, check_seed + 5);
    int cases = 0, paths = 0;
    for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (size_t c = 0; c < sizeof rs / sizeof rs[0]; c++) {
                const size_t d = ds[a], n = ns[b], R = rs[c], ldq = d + c % 2, ld_out = n + b % 2;
                fill(&g, tq, R * ldq, 3.0f);
                fill(&g, tk, n * d, 3.0f);
                for (size_t i = 0; i < (n + 15) / 16 * 16 * d; i++)
                    tiles[i] = NAN;
                for (size_t i = 0; i < n; i++)
                    for (size_t e = 0; e < d; e++)
                        tiles[(i / KVE_ATTN_TILE) * KVE_ATTN_TILE * d + e * KVE_ATTN_TILE +
                              i % KVE_ATTN_TILE] = tk[i * d + e];
                for (int isa = KVE_ISA_SCALAR; isa < KVE_ISA_COUNT; isa++) {
                    if (!kve__isa_force((kve_isa)isa))
                        continue;
                    ASSERT_OK(kve_attn_rows(tq, ldq, R, d, tiles, n, 0.1f, rows, ld_out));
                    ASSERT_TRUE(kve__isa_force(KVE_ISA_SCALAR));
                    for (size_t r = 0; r < R; r++) {
                        ASSERT_OK(kve_attn_row(tq + r * ldq, d, tk, d, n, 0.1f, one));
                        if (memcmp(rows + r * ld_out, one, n * sizeof(float)) != 0)
                            CHECK_FAIL_AT("isa %d, d %zu, n %zu, %zu rows: row %zu differs", isa,
                                          d, n, R, r);
                    }
                    paths += a == 0 && b == 0 && c == 0;
                }
                cases++;
            }
    /* A bad query names its row (past the first eight too: counted from row
     * 0); a bad key is every row's, the first named, and a key past n is
     * never read. */
    fill(&g, tq, 13 * 64, 1.0f);
    fill(&g, tiles, 48 * 64, 1.0f);
    const struct {
        float *at, bad;
        const char *want;
        size_t unread; /* a key count that leaves the bad entry out, or 0 */
    } bad[] = {
        {&tq[5 * 64 + 7], INFINITY, "query row 5: the logit of key 0 is not finite", 0},
        {&tq[10 * 64 + 2], NAN, "query row 10: the logit of key 0 is not finite", 0},
        {&tiles[(33 / 16) * 16 * 64 + 3 * 16 + 33 % 16], NAN, /* key 33, entry 3 */
         "query row 0: the logit of key 33 is not finite", 33},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        const float was = *bad[b].at;
        *bad[b].at = bad[b].bad;
        for (int isa = KVE_ISA_SCALAR; isa < KVE_ISA_COUNT; isa++) {
            if (!kve__isa_force((kve_isa)isa))
                continue;
            ASSERT_STATUS(kve_attn_rows(tq, 64, 13, 64, tiles, 40, 1.0f, rows, 40), KVE_EINVAL);
            ASSERT_CONTAINS(kve_last_error(), bad[b].want);
            if (bad[b].unread)
                ASSERT_OK(kve_attn_rows(tq, 64, 13, 64, tiles, bad[b].unread, 1.0f, rows, 40));
        }
        *bad[b].at = was;
    }
    kve__isa_force(KVE_ISA_COUNT);
    /* Refusals, before anything is written; nothing to do is no error. */
    rows[0] = 42.0f;
    ASSERT_STATUS(kve_attn_rows(tq, 64, 2, 0, tiles, 4, 1.0f, rows, 4), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "d must be");
    ASSERT_STATUS(kve_attn_rows(tq, 64, 2, 64, tiles, 4, NAN, rows, 4), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "scale");
    ASSERT_STATUS(kve_attn_rows(tq, 63, 2, 64, tiles, 4, 1.0f, rows, 4), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "query stride 63");
    ASSERT_STATUS(kve_attn_rows(tq, 64, 2, 64, tiles, 4, 1.0f, rows, 3), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "ld_out 3");
    ASSERT_STATUS(kve_attn_rows(NULL, 64, 2, 64, tiles, 4, 1.0f, rows, 4), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "q is NULL");
    ASSERT_STATUS(kve_attn_rows(tq, 64, 2, 64, NULL, 4, 1.0f, rows, 4), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "tiles is NULL");
    ASSERT_STATUS(kve_attn_rows(tq, 64, 2, 64, tiles, 4, 1.0f, NULL, 4), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "out is NULL");
    ASSERT_TRUE(rows[0] == 42.0f);
    ASSERT_OK(kve_attn_rows(NULL, 64, 0, 64, NULL, 4, 1.0f, NULL, 0));
    ASSERT_OK(kve_attn_rows(NULL, 64, 3, 64, NULL, 0, 1.0f, NULL, 0));
    ASSERT_OK(kve_attn_rows(tq, 1, 1, 64, tiles, 33, 1.0f, rows, 1)); /* one row: strides free */
    printf("  %d tiled shapes, %d path(s) each, every row bit-equal\n", cases, paths);
}

/* A half float's value from its fields, in double (exact), as float32. */
static float half_value(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e ? ldexp(1024.0 + m, e - 25) : ldexp((double)m, -24);
    return (float)(h & 0x8000 ? -v : v);
}

enum { HD = 128, HN = 340, HR = 15 };
static uint16_t th[(HN + 15) / 16 * 16 * HD];
static float tf[(HN + 15) / 16 * 16 * HD], hq[HR * (HD + 1)], hrows[HR * HN], hwant[HR * HN];

/* Keys i < n of the half tiles th widened into tf (by half_value), the
 * lanes past n a NaN in both; then kve_attn_rows_f16 over th against
 * kve_attn_rows over tf (the portable path's), bit for bit, on every
 * instruction set; *paths gets the paths run. */
static void half_case(size_t d, size_t n, size_t R, size_t ldq, size_t ld_out, float scale,
                      int *paths)
{
    const size_t whole = (n + 15) / 16 * 16;
    for (size_t i = n; i < whole; i++)
        for (size_t e = 0; e < d; e++) {
            const size_t at = (i / 16) * 16 * d + e * 16 + i % 16;
            th[at] = 0x7e00, tf[at] = NAN;
        }
    for (size_t i = 0; i < n; i++)
        for (size_t e = 0; e < d; e++) {
            const size_t at = (i / 16) * 16 * d + e * 16 + i % 16;
            tf[at] = half_value(th[at]);
        }
    ASSERT_TRUE(kve__isa_force(KVE_ISA_SCALAR));
    ASSERT_OK(kve_attn_rows(hq, ldq, R, d, tf, n, scale, hwant, ld_out));
    *paths = 0;
    for (int isa = KVE_ISA_SCALAR; isa < KVE_ISA_COUNT; isa++) {
        if (!kve__isa_force((kve_isa)isa))
            continue;
        ASSERT_OK(kve_attn_rows_f16(hq, ldq, R, d, th, n, scale, hrows, ld_out));
        for (size_t r = 0; r < R; r++)
            if (memcmp(hrows + r * ld_out, hwant + r * ld_out, n * sizeof(float)) != 0)
                CHECK_FAIL_AT("half tiles: isa %d, d %zu, n %zu, %zu rows: row %zu differs", isa,
                              d, n, R, r);
        ++*paths;
    }
    kve__isa_force(KVE_ISA_COUNT);
}

/* kve_attn_rows_f16: every row bit for bit kve_attn_rows' over the keys
 * widened to float32 (so kve_attn_row's, test_tiled_rows), on every
 * instruction set: first every finite half float once (62 tiles of 16 keys
 * of 64 entries, one exponent and sign a tile, scaled to logits near 1: the
 * subnormals, both zeros and +-65504 among them), then the
 * shapes of test_tiled_rows with keys of random sign and mantissa between
 * 2^-8 and 8; a NaN or infinite key is named, one past n never read. */
static void test_half_tiles(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed + 7);
    int paths = 0, each = 0;
    fill(&g, hq, 8 * 64, 1.0f);
    for (uint32_t tile = 0; tile < 62; tile++) { /* 31 exponents, 2 signs: 1024 patterns each */
        const uint32_t e = tile % 31, sign = tile / 31;
        for (uint32_t p = 0; p < 1024; p++) /* key p / 64, entry p % 64 */
            th[(p % 64) * 16 + p / 64] = (uint16_t)(sign << 15 | e << 10 | p);
        /* logits near 1 for this exponent, so every key's bits reach its weight */
        half_case(64, 16, 8, 64, 16, ldexpf(1.0f, 12 - (int)(e ? e : 1)), &paths);
    }
    static const size_t ds[] = {8, 16, 64, 100, HD};
    static const size_t ns[] = {1, 15, 16, 17, 48, 333};
    static const size_t rs[] = {1, 3, 8, HR};
    int cases = 62;
    for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (size_t c = 0; c < sizeof rs / sizeof rs[0]; c++) {
                const size_t d = ds[a], n = ns[b], R = rs[c], ldq = d + c % 2;
                fill(&g, hq, R * ldq, 3.0f);
                for (size_t t = 0; t < (n + 15) / 16 * 16 * d; t++) {
                    const uint32_t u = (uint32_t)kve_rng_next(&g); /* exponent 7 .. 18: 2^-8 .. 8 */
                    th[t] = (uint16_t)((u & 0x83ffu) | ((7u + (u >> 16) % 12u) << 10));
                }
                half_case(d, n, R, ldq, n + b % 2, 0.1f, &each);
                cases++;
            }
    /* a NaN or infinite key is every row's, named; one past n is not read */
    const uint16_t nonfinite[] = {0x7e00, 0x7c00, 0xfc00, 0x7c01};
    for (size_t b = 0; b < sizeof nonfinite / sizeof nonfinite[0]; b++) {
        for (size_t t = 0; t < 48 * 64; t++)
            th[t] = 0x3c00; /* 1 */
        th[(33 / 16) * 16 * 64 + 5 * 16 + 33 % 16] = nonfinite[b]; /* key 33, entry 5 */
        for (int isa = KVE_ISA_SCALAR; isa < KVE_ISA_COUNT; isa++) {
            if (!kve__isa_force((kve_isa)isa))
                continue;
            ASSERT_STATUS(kve_attn_rows_f16(hq, 64, 13, 64, th, 40, 1.0f, hrows, 40), KVE_EINVAL);
            ASSERT_CONTAINS(kve_last_error(), "query row 0: the logit of key 33 is not finite");
            ASSERT_OK(kve_attn_rows_f16(hq, 64, 13, 64, th, 33, 1.0f, hrows, 33));
        }
    }
    kve__isa_force(KVE_ISA_COUNT);
    /* the refusals are kve_attn_rows' */
    ASSERT_STATUS(kve_attn_rows_f16(hq, 64, 2, 64, NULL, 4, 1.0f, hrows, 4), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "tiles is NULL");
    ASSERT_STATUS(kve_attn_rows_f16(hq, 64, 2, 64, th, 4, 1.0f, hrows, 3), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "ld_out 3");
    ASSERT_OK(kve_attn_rows_f16(NULL, 64, 3, 64, NULL, 0, 1.0f, NULL, 0));
    printf("  every finite half float and %d shapes, %d path(s) each, every row bit-equal\n",
           cases, paths);
}

/* The bank layout: row j*group + g is the softmax of query j*group + g over
 * head first + j's kept keys, and stepping with those rows works. */
static void test_bank_rows(void)
{
    enum { H = 3, G = 2, D = 8, LDK = 9 };
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("h2o:budget=20,recent_window=2", H, NULL, &b));
    kve_rng g;
    kve_rng_seed(&g, check_seed + 3);
    const size_t ld_head = 40 * LDK, ld_out = 41;
    int32_t victims[H * 4];
    for (int32_t pos = 0; pos < 60; pos++) {
        fill(&g, q, H * G * D, 1.0f);
        fill(&g, keys, H * ld_head, 1.0f);
        ASSERT_OK(kve_bank_attn_rows(b, 0, H, q, D, G, keys, LDK, ld_head, 0.35f, out, ld_out));
        for (size_t j = 0; j < H; j++)
            for (size_t r = j * G; r < j * G + G; r++) {
                size_t n = kve_bank_size(b, j);
                ASSERT_OK(kve_attn_row(q + r * D, D, keys + j * ld_head, LDK, n, 0.35f, again));
                ASSERT_TRUE(memcmp(out + r * ld_out, again, n * sizeof(float)) == 0);
            }
        /* A sub-range reads and writes relative to its first head. */
        ASSERT_OK(kve_bank_attn_rows(b, 1, 2, q + G * D, D, G, keys + ld_head, LDK, ld_head, 0.35f, again, ld_out));
        ASSERT_TRUE(memcmp(again, out + G * ld_out, kve_bank_size(b, 1) * sizeof(float)) == 0);
        ASSERT_OK(kve_bank_step_range(b, 0, kve_bank_heads(b), pos, out, ld_out, G, KVE_REDUCE_MEAN, NULL, 0));
        ASSERT_OK(kve_bank_evict(b, 20, victims, 4, NULL));
    }
    ASSERT_EQ(kve_bank_size(b, 2), 20);

    /* Refusals, all before anything is written. */
    out[0] = 42.0f;
    ASSERT_STATUS(kve_bank_attn_rows(NULL, 0, 1, q, D, 1, keys, LDK, 0, 1.0f, out, 64), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_attn_rows(b, 2, 2, q, D, 1, keys, LDK, 0, 1.0f, out, 64), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "out of range");
    ASSERT_STATUS(kve_bank_attn_rows(b, 0, 3, q, D, 0, keys, LDK, 0, 1.0f, out, 64), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "group");
    ASSERT_STATUS(kve_bank_attn_rows(b, 0, 3, q, D, 1, keys, LDK, 0, 1.0f, out, 19), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 0: ld_out 19");
    ASSERT_STATUS(kve_bank_attn_rows(b, 0, 3, q, D, 1, keys, D - 1, 0, 1.0f, out, 64), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_attn_rows(b, 0, 3, NULL, D, 1, keys, LDK, 0, 1.0f, out, 64), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "q is NULL");
    ASSERT_TRUE(out[0] == 42.0f);
    keys[ld_head + 3 * LDK] = INFINITY; /* head 1, key 3 */
    ASSERT_STATUS(kve_bank_attn_rows(b, 0, 3, q, D, G, keys, LDK, ld_head, 1.0f, out, 64),
                  KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 1, query row 2: the logit of key 3");
    kve_bank_free(b);
}

static void test_refusals(void)
{
    const float one[4] = {1, 1, 1, 1};
    ASSERT_STATUS(kve_attn_row(one, 0, one, 4, 1, 1.0f, out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "d must be");
    ASSERT_STATUS(kve_attn_row(one, 4, one, 3, 2, 1.0f, out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "stride 3");
    ASSERT_STATUS(kve_attn_row(one, 4, one, 4, 1, NAN, out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "scale");
    ASSERT_STATUS(kve_attn_row(one, 4, one, 4, 1, INFINITY, out), KVE_EINVAL);
    ASSERT_STATUS(kve_attn_row(NULL, 4, one, 4, 1, 1.0f, out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "q is NULL");
    ASSERT_STATUS(kve_attn_row(one, 4, NULL, 4, 1, 1.0f, out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "keys is NULL");
    ASSERT_STATUS(kve_attn_row(one, 4, one, 4, 1, 1.0f, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "out is NULL");
    /* Logits that are not finite: a NaN input, and a dot product past float32. */
    float k[3 * 4] = {1, 1, 1, 1, 1, NAN, 1, 1, 1, 1, 1, 1};
    ASSERT_STATUS(kve_attn_row(one, 4, k, 4, 3, 1.0f, out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "key 1");
    k[5] = 1.0f;
    k[4] = 3e38f;
    ASSERT_OK(kve_attn_row(one, 4, k, 4, 3, 1.0f, out));
    ASSERT_STATUS(kve_attn_row(one, 4, k, 4, 3, 2.0f, out), KVE_EINVAL); /* scaled past float32 */
    ASSERT_CONTAINS(kve_last_error(), "key 1");
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_against_double_softmax);
    RUN(test_extreme_logits);
    RUN(test_exponential);
    RUN(test_single_key_is_one);
    RUN(test_every_path_same_bits);
    RUN(test_tiled_rows);
    RUN(test_half_tiles);
    RUN(test_bank_rows);
    RUN(test_refusals);
    return CHECK_DONE();
}
