/* SPDX-License-Identifier: MIT */
/*
 * test_trace.c - the canonical synthetic trace (docs/trace.md), every
 * version: the determinism promise, the distribution contract, the
 * structure each version is documented to have (sinks, recency band, heavy
 * hitters, jittered background, renormalisation where a class is missing;
 * version 2's one hitter per slot, its strength held for an epoch and
 * multiplied by heavy_decay after, and its class present in proportion
 * min(1, W/W*)), streaming memory, spec refusals and allocation failure.
 *
 * The constants below restate the documented defaults; they are the
 * definition under test, not values fitted to the output. Version 2's
 * sink_mass is its one fitted constant (tests/test_calibration.c checks it
 * against its procedure); version 3 is version 2's generator with heavy,
 * heavy_mass and sink_mass at the point the calibration of docs/trace.md
 * chose (tests/test_calibration_v3.sh holds them to the committed run), and
 * gives exactly version 2's rows with those three keys.
 */
#include "check.h"
#include "test_allocator.h"
#include "internal.h"
#include "kvevict_eval.h"
#include "eval_options.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SINKS = 4, RECENT = 64, EPOCH = 512, HEAVY = 16 };
static const double SINK_MASS = 0.10, RECENT_MASS = 0.55, HEAVY_MASS = 0.20, DECAY = 0.96;
static const double BG_MASS = 1.0 - 0.10 - 0.55 - 0.20; /* version 1 */
static const double V2_SINK_MASS = 0.09034;               /* version 2's fitted value */

static const char V1_SPEC[] =
    "canonical:version=1,seed=1,steps=4096,sinks=4,sink_mass=0.1,recent=64,recent_mass=0.55,"
    "recent_decay=0.96,epoch=512,heavy=16,heavy_mass=0.2,jitter=0.5";
static const char V2_SPEC[] =
    "canonical:version=2,seed=1,steps=4096,sinks=4,sink_mass=0.09034,recent=64,recent_mass=0.55,"
    "recent_decay=0.96,epoch=512,heavy=16,heavy_mass=0.2,heavy_decay=0.5,jitter=0.5";
static const char V3_SPEC[] =
    "canonical:version=3,seed=1,steps=4096,sinks=4,sink_mass=0.10304,recent=64,recent_mass=0.55,"
    "recent_decay=0.96,epoch=512,heavy=3,heavy_mass=0.15,heavy_decay=0.5,jitter=0.5";
/* Version 3 as version 2 with its three calibrated keys. */
static const char V3_AS_V2[] = "canonical:version=2,heavy=3,heavy_mass=0.15,sink_mass=0.10304";

/* FNV-1a of the float32 bits of rows 0..1199 of each version's default
 * trace (see test_golden). Versions 1 and 2 keep the values they had before
 * version 3 existed. */
#define GOLDEN_HASH_V1 0x92bbe0076cbe1867u
#define GOLDEN_HASH_V2 0xdf114f9409e7c6d5u
#define GOLDEN_HASH_V3 0x4740c7adb8a50e0eu

static double sum_range(const double *row, size_t lo, size_t hi)
{
    double s = 0;
    for (size_t i = lo; i < hi; i++)
        s += row[i];
    return s;
}

static void test_defaults_and_source(void)
{
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical", NULL, &tr));
    ASSERT_EQ(kve_trace_steps(tr), 4096);
    ASSERT_EQ(kve_trace_heads(tr), 1);
    ASSERT_EQ(kve_trace_layers(tr), 1);
    ASSERT_STR_EQ(kve_trace_source(tr), V3_SPEC);
    /* The canonical spec opens back to the same spec; a partial spec fills
     * in the defaults of its version in the fixed order. */
    kve_trace *tr2 = NULL;
    ASSERT_OK(kve_trace_open(kve_trace_source(tr), NULL, &tr2));
    ASSERT_STR_EQ(kve_trace_source(tr2), V3_SPEC);
    kve_trace_free(tr2);
    tr2 = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=10,seed=7", NULL, &tr2));
    ASSERT_CONTAINS(kve_trace_source(tr2), "canonical:version=3,seed=7,steps=10,sinks=4,");
    ASSERT_EQ(kve_trace_steps(tr2), 10);
    kve_trace_free(tr2);
    kve_trace_free(tr);
    /* Version 1: its own keys and defaults, version first wherever given. */
    ASSERT_OK(kve_trace_open("canonical:version=1", NULL, &tr));
    ASSERT_STR_EQ(kve_trace_source(tr), V1_SPEC);
    kve_trace_free(tr);
    ASSERT_OK(kve_trace_open(V1_SPEC, NULL, &tr));
    ASSERT_STR_EQ(kve_trace_source(tr), V1_SPEC);
    kve_trace_free(tr);
    ASSERT_OK(kve_trace_open("canonical:seed=7,steps=10,version=1", NULL, &tr));
    ASSERT_CONTAINS(kve_trace_source(tr), "canonical:version=1,seed=7,steps=10,sinks=4,");
    kve_trace_free(tr);
    ASSERT_OK(kve_trace_open("canonical:version=2", NULL, &tr));
    ASSERT_STR_EQ(kve_trace_source(tr), V2_SPEC);
    kve_trace_free(tr);
    ASSERT_OK(kve_trace_open(V2_SPEC, NULL, &tr));
    ASSERT_STR_EQ(kve_trace_source(tr), V2_SPEC);
    kve_trace_free(tr);
    ASSERT_OK(kve_trace_open("canonical:version=3", NULL, &tr));
    ASSERT_STR_EQ(kve_trace_source(tr), V3_SPEC);
    kve_trace_free(tr);
    kve_trace_free(NULL);
    ASSERT_EQ(kve_trace_steps(NULL), 0);
    ASSERT_TRUE(kve_trace_source(NULL) == NULL);
}

/* Two opens give bit-identical rows, in ascending order, descending order
 * and a seeded random order. */
static void check_determinism(const char *spec, const char *other_seed)
{
    enum { T = 1300 };
    kve_trace *a = NULL, *b = NULL;
    ASSERT_OK(kve_trace_open(spec, NULL, &a));
    ASSERT_OK(kve_trace_open(spec, NULL, &b));
    ASSERT_EQ(kve_trace_steps(a), T);
    double *ra = malloc(T * sizeof *ra), *rb = malloc(T * sizeof *rb);
    double *all = malloc((size_t)T * T * sizeof *all); /* test-side copy, 13 MB */
    ASSERT_TRUE(ra && rb && all);
    for (size_t t = 0; t < T; t++) {
        ASSERT_OK(kve_trace_row(a, 0, t, all + t * T, t + 1));
    }
    for (size_t t = T; t-- > 0;) {
        ASSERT_OK(kve_trace_row(b, 0, t, rb, t + 1));
        if (memcmp(rb, all + t * T, (t + 1) * sizeof *rb) != 0)
            CHECK_FAIL_AT("%s: row %zu differs when read in descending order", spec, t);
    }
    uint64_t x = check_seed;
    for (int k = 0; k < 400; k++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        size_t t = (size_t)(x >> 33) % T;
        ASSERT_OK(kve_trace_row(a, 0, t, ra, t + 1));
        if (memcmp(ra, all + t * T, (t + 1) * sizeof *ra) != 0)
            CHECK_FAIL_AT("%s: row %zu differs when read in random order", spec, t);
    }
    /* A different seed gives a different trace. */
    kve_trace *c = NULL;
    ASSERT_OK(kve_trace_open(other_seed, NULL, &c));
    ASSERT_OK(kve_trace_row(c, 0, 1000, rb, 1001));
    ASSERT_TRUE(memcmp(rb, all + 1000 * (size_t)T, 1001 * sizeof *rb) != 0);
    kve_trace_free(c);
    free(ra);
    free(rb);
    free(all);
    kve_trace_free(a);
    kve_trace_free(b);
}

static void test_determinism(void)
{
    check_determinism("canonical:steps=1300,seed=77", "canonical:steps=1300,seed=78");
    check_determinism("canonical:version=2,steps=1300,seed=77",
                      "canonical:version=2,steps=1300,seed=78");
    check_determinism("canonical:version=1,steps=1300,seed=77",
                      "canonical:version=1,steps=1300,seed=78");
}

/* Every row is a distribution of float32-representable weights: row 0 is
 * [1]; row t >= 1 puts 0 on key t and sums to 1 within float rounding. */
static void check_distributions(const char *spec)
{
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open(spec, NULL, &tr));
    size_t T = kve_trace_steps(tr);
    double *row = malloc(T * sizeof *row);
    ASSERT_TRUE(row);
    ASSERT_OK(kve_trace_row(tr, 0, 0, row, 1));
    ASSERT_TRUE(row[0] == 1.0);
    for (size_t t = 1; t < T; t++) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
        if (row[t] != 0.0)
            CHECK_FAIL_AT("%s: row %zu puts %g on its own key", spec, t, row[t]);
        double s = 0;
        for (size_t i = 0; i < t; i++) {
            if (!(row[i] > 0.0) || (double)(float)row[i] != row[i])
                CHECK_FAIL_AT("%s: row %zu key %zu: %.17g is not a positive float32", spec, t, i,
                              row[i]);
            s += row[i];
        }
        /* Each weight is off by at most 2^-24 of itself after rounding. */
        if (!(fabs(s - 1.0) <= 1e-7))
            CHECK_FAIL_AT("%s: row %zu sums to %.17g", spec, t, s);
    }
    free(row);
    kve_trace_free(tr);
}

static void test_rows_are_distributions(void)
{
    check_distributions("canonical:steps=2100,seed=3");
    check_distributions("canonical:version=1,steps=2100,seed=3");
    /* Version 2 with retired hitters at weight 0 (heavy_decay=0), with a
     * hitter in every position (heavy = epoch) and with no band. */
    check_distributions("canonical:steps=700,seed=4,heavy_decay=0,epoch=64");
    check_distributions("canonical:steps=300,seed=5,epoch=16,heavy=16");
    check_distributions("canonical:steps=300,seed=6,recent=0,sinks=0");
}

/* Version 1. Away from the first RECENT steps of an epoch (where last epoch's keys can
 * be heavy and recent at once) and past epoch 0 (which has no heavy
 * hitters), the classes hold exactly their documented masses: sinks 0.10 in
 * equal shares, the last 64 keys 0.55 decaying by 0.96 per step of
 * distance, 16 heavy keys 0.20, the background the remaining 0.15. */
static void test_v1_structure_in_steady_state(void)
{
    enum { T = 2048 };
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:version=1,steps=2048", NULL, &tr));
    double *row = malloc(T * sizeof *row);
    ASSERT_TRUE(row);
    int32_t prev_heavy[HEAVY] = {0};
    for (size_t t = EPOCH + RECENT; t < T; t += 37) {
        if (t % EPOCH < RECENT)
            continue;
        ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
        ASSERT_NEAR(sum_range(row, 0, SINKS), SINK_MASS, 1e-7);
        for (size_t i = 1; i < SINKS; i++)
            ASSERT_TRUE(row[i] == row[0]);
        ASSERT_NEAR(sum_range(row, t - RECENT, t), RECENT_MASS, 1e-7);
        for (size_t d = 1; d < RECENT; d++) /* key t-1-d vs its newer neighbour */
            ASSERT_NEAR(row[t - 1 - d] / row[t - d], DECAY, 1e-6);
        /* Heavy keys: the only keys outside sinks and band above 0.002
         * (a heavy key holds >= 0.2 * 0.5 / (16 * 1.5) = 0.0042; a background
         * key <= 0.15 * 1.5 / (0.5 * 440) = 0.0011). */
        size_t epoch_start = t / EPOCH * EPOCH;
        int32_t heavy[HEAVY];
        size_t nh = 0;
        double heavy_sum = 0, bg_sum = 0, bg_min = 1, bg_max = 0;
        for (size_t i = SINKS; i < t - RECENT; i++) {
            if (row[i] > 0.002) {
                if (nh == HEAVY)
                    CHECK_FAIL_AT("row %zu: more than %d heavy keys", t, HEAVY);
                if (i >= epoch_start)
                    CHECK_FAIL_AT("row %zu: heavy key %zu is not before epoch start %zu", t, i,
                                  epoch_start);
                heavy[nh++] = (int32_t)i;
                heavy_sum += row[i];
            } else {
                bg_sum += row[i];
                bg_min = row[i] < bg_min ? row[i] : bg_min;
                bg_max = row[i] > bg_max ? row[i] : bg_max;
            }
        }
        ASSERT_EQ(nh, HEAVY);
        ASSERT_NEAR(heavy_sum, HEAVY_MASS, 1e-7);
        ASSERT_NEAR(bg_sum, BG_MASS, 1e-7);
        /* Jitter factors lie in [0.5, 1.5): the spread is real but bounded. */
        ASSERT_TRUE(bg_max / bg_min > 1.5);
        ASSERT_TRUE(bg_max / bg_min < 3.0 + 1e-5);
        /* The heavy set holds for the whole epoch and changes with it. */
        if (t % EPOCH >= RECENT && t - 37 >= epoch_start + RECENT) {
            ASSERT_TRUE(memcmp(heavy, prev_heavy, sizeof heavy) == 0);
        } else if (t >= 2 * EPOCH) {
            ASSERT_TRUE(memcmp(heavy, prev_heavy, sizeof heavy) != 0);
        }
        memcpy(prev_heavy, heavy, sizeof heavy);
    }
    free(row);
    kve_trace_free(tr);
}

/* Where a class is empty the others are rescaled by 1 / (sum of the masses
 * present): the first steps lack band or background, version 1's epoch 0
 * has no heavy hitters (in version 2, heavy=0 removes them). */
static void check_renormalisation(const char *prefix, double sink_mass)
{
    const double bg_mass = 1.0 - sink_mass - RECENT_MASS - HEAVY_MASS;
    char spec[160];
    kve_trace *tr = NULL;
    snprintf(spec, sizeof spec, "%s,steps=600", prefix);
    ASSERT_OK(kve_trace_open(spec, NULL, &tr));
    double row[600];
    /* t = 1..4: keys [0, t) are all sinks. */
    for (size_t t = 1; t <= SINKS; t++) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
        for (size_t i = 0; i < t; i++)
            ASSERT_TRUE(row[i] == (double)(float)(1.0 / (double)t));
    }
    /* t = 5: sinks and a band of one key. */
    ASSERT_OK(kve_trace_row(tr, 0, 5, row, 6));
    ASSERT_TRUE(row[4] == (double)(float)(RECENT_MASS / (sink_mass + RECENT_MASS)));
    ASSERT_TRUE(row[0] == (double)(float)(sink_mass / (sink_mass + RECENT_MASS) / 4));
    /* t = 300: sinks, full band and background, no heavy. */
    ASSERT_OK(kve_trace_row(tr, 0, 300, row, 301));
    double present = sink_mass + RECENT_MASS + bg_mass;
    ASSERT_NEAR(sum_range(row, 0, SINKS), sink_mass / present, 1e-7);
    ASSERT_NEAR(sum_range(row, 300 - RECENT, 300), RECENT_MASS / present, 1e-7);
    ASSERT_NEAR(sum_range(row, SINKS, 300 - RECENT), bg_mass / present, 1e-7);
    kve_trace_free(tr);

    /* All present classes at mass 0: the row is uniform. */
    snprintf(spec, sizeof spec, "%s,steps=40,sink_mass=0,recent_mass=0,heavy_mass=1", prefix);
    ASSERT_OK(kve_trace_open(spec, NULL, &tr));
    ASSERT_OK(kve_trace_row(tr, 0, 30, row, 31));
    for (size_t i = 0; i < 30; i++)
        ASSERT_TRUE(row[i] == (double)(float)(1.0 / 30));
    kve_trace_free(tr);

    /* Masses that leave no background are fine; more than 1 is refused. */
    snprintf(spec, sizeof spec, "%s,steps=40,sink_mass=0.2,recent_mass=0.8,heavy_mass=0", prefix);
    ASSERT_OK(kve_trace_open(spec, NULL, &tr));
    ASSERT_OK(kve_trace_row(tr, 0, 39, row, 40));
    ASSERT_NEAR(sum_range(row, 0, SINKS), 0.2, 1e-7);
    ASSERT_NEAR(sum_range(row, SINKS, 39), 0.8, 1e-7);
    kve_trace_free(tr);
}

static void test_renormalisation_of_missing_classes(void)
{
    /* Version 1 before its first epoch ends; version 2 without hitters. */
    check_renormalisation("canonical:version=1", SINK_MASS);
    check_renormalisation("canonical:version=2,heavy=0", V2_SINK_MASS);
}

/* d^k by repeated multiplication, as the generator computes it. */
static double power(double d, size_t k)
{
    double f = 1;
    for (size_t q = 0; q < k; q++)
        f *= d;
    return f;
}

/* The hitters of version 2 at row t of `spec` (one whose only mass is the
 * heavy class, so every other key is 0): their positions, ascending. */
static size_t hitters_of(const double *row, size_t t, int32_t *pos, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < t; i++)
        if (row[i] > 0.0 && n < cap)
            pos[n++] = (int32_t)i;
    return n;
}

/* Version 2's heavy class alone (no sinks, band or background mass): the
 * row is 0 except on the hitters, exactly one in each slot
 * [sinks + j*epoch/heavy, sinks + (j+1)*epoch/heavy), present from the row
 * after its position; hitter j's weight is s_j * heavy_decay^k / W(t) with
 * k = (t - 1 - p_j) / epoch, so weight / heavy_decay^k is, up to a common
 * factor per row, a constant s_j in [1 - jitter, 1 + jitter). */
static void test_v2_hitters(void)
{
    enum { T = 1700, EP = 64, HV = 4, SK = 3, MAXH = 128 };
    const double d = 0.5, jit = 0.5;
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:version=2,steps=1700,seed=11,sinks=3,sink_mass=0,recent=0,"
                             "recent_mass=0,heavy_mass=1,epoch=64,heavy=4", NULL, &tr));
    double *row = malloc(T * sizeof *row);
    ASSERT_TRUE(row);
    int32_t pos[MAXH];
    ASSERT_OK(kve_trace_row(tr, 0, T - 1, row, T));
    size_t n = hitters_of(row, T - 1, pos, MAXH);
    /* Slots of width EP / HV = 16 from SK: one hitter each. */
    for (size_t j = 0; SK + (j + 1) * EP / HV <= T - 1; j++) {
        size_t lo = SK + j * EP / HV, hi = SK + (j + 1) * EP / HV, in = 0;
        for (size_t h = 0; h < n; h++)
            in += (size_t)pos[h] >= lo && (size_t)pos[h] < hi;
        if (in != 1)
            CHECK_FAIL_AT("slot [%zu, %zu) holds %zu hitters", lo, hi, in);
    }
    ASSERT_TRUE(n >= (T - 1 - SK) * HV / EP);
    /* Strengths: from the last row, s_h / s_0; then the same ratio on every
     * sampled row where both are present, whatever their ages. */
    double ratio[MAXH];
    for (size_t h = 0; h < n; h++) {
        double fh = power(d, (T - 2 - (size_t)pos[h]) / EP);
        double f0 = power(d, (T - 2 - (size_t)pos[0]) / EP);
        ratio[h] = (row[pos[h]] / fh) / (row[pos[0]] / f0);
        ASSERT_TRUE(ratio[h] >= (1 - jit) / (1 + jit) - 1e-6);
        ASSERT_TRUE(ratio[h] <= (1 + jit) / (1 - jit) + 1e-6);
    }
    size_t checked = 0;
    for (size_t t = (size_t)pos[0] + 1; t < T; t += 7) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
        size_t present = 0;
        for (size_t i = 0; i < t; i++)
            present += row[i] > 0.0;
        size_t before = 0;
        while (before < n && (size_t)pos[before] < t)
            before++;
        if (present != before)
            CHECK_FAIL_AT("row %zu: %zu keys hold weight, %zu hitters came before", t, present,
                          before);
        double f0 = power(d, (t - 1 - (size_t)pos[0]) / EP);
        for (size_t h = 1; h < before; h++) {
            double fh = power(d, (t - 1 - (size_t)pos[h]) / EP);
            double r = (row[pos[h]] / fh) / (row[pos[0]] / f0);
            if (!(fabs(r - ratio[h]) <= 1e-6 * ratio[h]))
                CHECK_FAIL_AT("row %zu hitter %d: strength ratio %.9g, %.9g on the last row", t,
                              pos[h], r, ratio[h]);
            checked++;
        }
    }
    ASSERT_TRUE(checked > 1000);
    free(row);
    kve_trace_free(tr);
}

/* Version 2 with the heavy class beside a uniform background (jitter 0, so
 * every strength is 1 and every background key equal): each key holds
 * b = (bg / total) / t and each hitter b plus (m_heavy / total) * d^k / W,
 * with W the sum of d^k over the hitters before t, W* = heavy / (1 - d),
 * m_heavy = heavy_mass * min(1, W / W*) and total = bg + m_heavy. Both
 * sides of the min are reached: W < W* early, W >= W* later. */
static void test_v2_heavy_class_presence(void)
{
    enum { T = 1500, EP = 64, HV = 4, MAXH = 128 };
    const double d = 0.5, heavy_mass = 0.5, bg = 0.5, w_star = HV / (1 - d);
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:version=2,steps=1500,sinks=0,sink_mass=0,recent=0,"
                             "recent_mass=0,heavy_mass=0.5,jitter=0,epoch=64,heavy=4", NULL, &tr));
    double *row = malloc(T * sizeof *row);
    ASSERT_TRUE(row);
    int below = 0, above = 0;
    for (size_t t = 40; t < T; t += 13) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
        double lowest = 1;
        for (size_t i = 0; i < t; i++)
            lowest = row[i] < lowest ? row[i] : lowest;
        double w = 0;
        int32_t pos[MAXH];
        size_t n = 0;
        for (size_t i = 0; i < t; i++) {
            if (row[i] > lowest * 1.0001) {
                ASSERT_TRUE(n < MAXH);
                pos[n++] = (int32_t)i;
                w += power(d, (t - 1 - i) / EP);
            }
        }
        ASSERT_TRUE(n >= 1);
        double m_heavy = heavy_mass * (w < w_star ? w / w_star : 1.0);
        double total = bg + m_heavy;
        double b = bg / total / (double)t;
        below += w < w_star;
        above += w >= w_star;
        ASSERT_NEAR(lowest, b, 1e-6 * b);
        for (size_t h = 0; h < n; h++) {
            size_t k = (t - 1 - (size_t)pos[h]) / EP;
            double want = b + m_heavy / total * power(d, k) / w;
            if (!(fabs(row[pos[h]] - want) <= 1e-6 * want))
                CHECK_FAIL_AT("row %zu hitter %d (age bracket %zu): %.9g, want %.9g", t,
                              pos[h], k, row[pos[h]], want);
        }
    }
    ASSERT_TRUE(below > 5 && above > 5);
    free(row);
    kve_trace_free(tr);
}

/* Version 2 at the defaults, late in the trace: the sinks hold equal
 * shares; band keys that are not hitters decay by recent_decay per step of
 * distance; background keys outside the hitters spread by the jitter
 * factors only; the hitters (found from the heavy class alone, which they
 * do not depend on) whose age is under an epoch hold more than any
 * background key, and the heavy class holds at most heavy_mass. */
static void test_v2_structure_in_steady_state(void)
{
    enum { T = 3000, MAXH = 128 };
    kve_trace *tr = NULL, *only = NULL;
    ASSERT_OK(kve_trace_open("canonical:version=2,steps=3000", NULL, &tr));
    ASSERT_OK(kve_trace_open("canonical:version=2,steps=3000,sink_mass=0,recent=0,"
                             "recent_mass=0,heavy_mass=1", NULL, &only));
    double *row = malloc(T * sizeof *row);
    char *is_hit = calloc(T, 1);
    ASSERT_TRUE(row && is_hit);
    ASSERT_OK(kve_trace_row(only, 0, T - 1, row, T));
    int32_t pos[MAXH];
    size_t n = hitters_of(row, T - 1, pos, MAXH);
    ASSERT_EQ(n, (T - 1 - SINKS) / (EPOCH / HEAVY)); /* one per 32-position slot */
    for (size_t h = 0; h < n; h++)
        is_hit[pos[h]] = 1;
    for (size_t t = 2 * EPOCH; t < T; t += 41) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
        for (size_t i = 1; i < SINKS; i++)
            ASSERT_TRUE(row[i] == row[0]);
        for (size_t dist = 1; dist < RECENT; dist++) {
            size_t a = t - 1 - dist, b = t - dist; /* a is one step older than b */
            if (!is_hit[a] && !is_hit[b])
                ASSERT_NEAR(row[a] / row[b], DECAY, 1e-6);
        }
        double bg_min = 1, bg_max = 0, young_min = 1;
        for (size_t i = SINKS; i < t - RECENT; i++) {
            if (!is_hit[i]) {
                bg_min = row[i] < bg_min ? row[i] : bg_min;
                bg_max = row[i] > bg_max ? row[i] : bg_max;
            } else if (t - 1 - i < EPOCH && row[i] < young_min) {
                young_min = row[i];
            }
        }
        ASSERT_TRUE(bg_max / bg_min > 1.5);
        ASSERT_TRUE(bg_max / bg_min < 3.0 + 1e-5);
        ASSERT_TRUE(young_min > 5 * bg_max);
        /* Everything outside sinks and band: background plus heavy. */
        double rest = sum_range(row, SINKS, t - RECENT);
        ASSERT_TRUE(rest <= 1.0 - V2_SINK_MASS - RECENT_MASS + 1e-6);
    }
    free(is_hit);
    free(row);
    kve_trace_free(only);
    kve_trace_free(tr);
}

/* FNV-1a over the float32 bits of every row of a 1200-step trace (three
 * epochs). Pins each version's generator: any change to it, or a platform
 * that computes a different bit, fails here. Recorded from this
 * implementation; version 1's value predates version 2 and must never
 * change. */
static uint64_t hash_rows(const char *spec, size_t T)
{
    kve_trace *tr = NULL;
    if (kve_trace_open(spec, NULL, &tr) != KVE_OK)
        return 0;
    double *row = malloc(T * sizeof *row);
    uint64_t h = 1469598103934665603u;
    for (size_t t = 0; row && t < T; t++) {
        if (kve_trace_row(tr, 0, t, row, t + 1) != KVE_OK)
            break;
        for (size_t i = 0; i <= t; i++) {
            float f = (float)row[i];
            uint32_t bits;
            memcpy(&bits, &f, sizeof bits);
            for (int b = 0; b < 4; b++) {
                h ^= (bits >> (8 * b)) & 0xffu;
                h *= 1099511628211u;
            }
        }
    }
    free(row);
    kve_trace_free(tr);
    return h;
}

static void test_golden(void)
{
    uint64_t h1 = hash_rows("canonical:version=1,steps=1200", 1200);
    uint64_t h2 = hash_rows("canonical:version=2,steps=1200", 1200);
    uint64_t h3 = hash_rows("canonical:steps=1200", 1200);
    printf("golden hash version 1 %016llx, version 2 %016llx, version 3 %016llx\n",
           (unsigned long long)h1, (unsigned long long)h2, (unsigned long long)h3);
    ASSERT_U64_EQ(h1, GOLDEN_HASH_V1);
    ASSERT_U64_EQ(h2, GOLDEN_HASH_V2);
    ASSERT_U64_EQ(h3, GOLDEN_HASH_V3);
    /* Version 3 is version 2's generator at its three calibrated keys. */
    char spec[160];
    snprintf(spec, sizeof spec, "%s,steps=1200", V3_AS_V2);
    ASSERT_U64_EQ(hash_rows(spec, 1200), h3);
}

/* Version 3's rows are version 2's at the chosen point, bit for bit, on
 * rows across the whole default trace (every 17th, and the last; test_golden
 * compares the first 1200 through their hash). */
static void test_v3_is_v2_at_the_chosen_point(void)
{
    kve_trace *a = NULL, *b = NULL;
    ASSERT_OK(kve_trace_open("canonical", NULL, &a));
    ASSERT_OK(kve_trace_open(V3_AS_V2, NULL, &b));
    size_t T = kve_trace_steps(a);
    ASSERT_EQ(kve_trace_steps(b), T);
    double *ra = malloc(T * sizeof *ra), *rb = malloc(T * sizeof *rb);
    ASSERT_TRUE(ra && rb);
    for (size_t k = 0; k <= T / 17; k++) {
        size_t t = k < T / 17 ? 17 * k : T - 1;
        ASSERT_OK(kve_trace_row(a, 0, t, ra, T));
        ASSERT_OK(kve_trace_row(b, 0, t, rb, T));
        if (memcmp(ra, rb, (t + 1) * sizeof *ra) != 0)
            CHECK_FAIL_AT("row %zu: version 3 differs from version 2 at its point", t);
    }
    free(ra);
    free(rb);
    kve_trace_free(a);
    kve_trace_free(b);
}

/* Streaming: opening allocates O(recent + heavy), reading rows allocates
 * nothing, and a trace of 2^20 steps (a T x T matrix would be 8 TiB) opens
 * and yields its last row. A 65,536-step trace is sampled across its length. */
static void test_streaming_memory(void)
{
    kve_trace *tr = NULL;
    talloc ta;
    talloc_init(&ta);
    kve_trace_options o = kve_trace_default_options();
    o.allocator = &ta.a;
    ASSERT_OK(kve_trace_open("canonical:steps=65536", &o, &tr));
    size_t at_open = talloc_fail_after(&ta, SIZE_MAX);
    ASSERT_TRUE(at_open <= 8);
    /* Version 1 too: a fixed handful of allocations, none per row. */
    kve_trace *v1 = NULL;
    ASSERT_OK(kve_trace_open("canonical:version=1,steps=65536", &o, &v1));
    ASSERT_TRUE(talloc_fail_after(&ta, SIZE_MAX) <= 8);
    double *row = malloc(65536 * sizeof *row);
    ASSERT_TRUE(row);
    for (size_t t = 0; t < 65536; t += 2039) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
        ASSERT_NEAR(sum_range(row, 0, t + 1), 1.0, 1e-6);
    }
    for (size_t t = 0; t < 65536; t += 4099) {
        ASSERT_OK(kve_trace_row(v1, 0, t, row, t + 1));
        ASSERT_NEAR(sum_range(row, 0, t + 1), 1.0, 1e-6);
    }
    ASSERT_EQ(talloc_fail_after(&ta, SIZE_MAX), 0);
    kve_trace_free(v1);
    kve_trace_free(tr);
    talloc_check_empty(&ta);
    free(row);

    enum { BIG = 1 << 20 };
    ASSERT_OK(kve_trace_open("canonical:steps=1048576", NULL, &tr));
    row = malloc((size_t)BIG * sizeof *row);
    ASSERT_TRUE(row);
    ASSERT_OK(kve_trace_row(tr, 0, BIG - 1, row, BIG));
    ASSERT_NEAR(sum_range(row, 0, BIG), 1.0, 1e-6);
    /* The band's 0.55, plus the heavy shares of the hitters inside it. */
    double last = sum_range(row, BIG - 1 - RECENT, BIG - 1);
    ASSERT_TRUE(last >= RECENT_MASS - 1e-6 && last <= RECENT_MASS + HEAVY_MASS);
    free(row);
    kve_trace_free(tr);
}

static void test_spec_refusals(void)
{
    static const struct {
        const char *src;
        const char *msg;
    } bad[] = {
        {"canonical:steps=0", "steps"},
        {"canonical:steps=16777217", "steps"},
        {"canonical:bogus=1", "bogus"},
        {"canonical:", "nothing follows"},
        {"canonical:seed=1,seed=2", "seed"},
        {"canonical:jitter=0.96", "jitter"},
        {"canonical:recent_decay=0", "recent_decay"},
        {"canonical:recent_decay=1.5", "recent_decay"},
        {"canonical:sink_mass=-0.1", "sink_mass"},
        {"canonical:heavy=1025", "heavy"},
        {"canonical:epoch=0", "epoch"},
        {"canonical:sink_mass=0.3,recent_mass=0.55,heavy_mass=0.2", "exceeds 1"},
        {"canonical:steps=ten", "steps"},
        {"canonical:version=0", "version"},
        {"canonical:version=4", "version"},
        {"canonical:version=", "version"},
        {"canonical:version=1,version=2", "version"},
        {"canonical:version=1,heavy_decay=0.5", "heavy_decay"},
        {"canonical:heavy_decay=1", "heavy_decay"},
        {"canonical:heavy_decay=-0.5", "heavy_decay"},
        {"canonical:epoch=8,heavy=9", "exceeds epoch"},
        {"", "empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kve_trace *tr = (kve_trace *)&bad; /* sentinel: must stay untouched */
        ASSERT_STATUS(kve_trace_open(bad[i].src, NULL, &tr), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), bad[i].msg);
        ASSERT_TRUE(tr == (kve_trace *)&bad);
    }
    kve_trace *tr = NULL;
    ASSERT_STATUS(kve_trace_open(NULL, NULL, &tr), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_open("canonical", NULL, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_open("canonical", TRACE_FLAGS(2), &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "flags");
    ASSERT_TRUE(tr == NULL);
    /* KVE_TRACE_NORMALIZE is accepted and changes nothing for canonical. */
    ASSERT_OK(kve_trace_open("canonical:steps=8", TRACE_FLAGS(KVE_TRACE_NORMALIZE), &tr));
    double row[8];
    ASSERT_STATUS(kve_trace_row(tr, 1, 0, row, 1), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 1");
    ASSERT_STATUS(kve_trace_row(tr, 0, 8, row, 9), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "step 8");
    ASSERT_STATUS(kve_trace_row(tr, 0, 0, NULL, 1), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_row(NULL, 0, 0, row, 1), KVE_EINVAL);
    /* The buffer must hold the row: t + 1 weights. */
    row[5] = -1;
    ASSERT_STATUS(kve_trace_row(tr, 0, 5, row, 5), KVE_ERANGE);
    ASSERT_CONTAINS(kve_last_error(), "row 5 has 6 weights, but the buffer holds 5");
    ASSERT_TRUE(row[5] == -1);
    ASSERT_OK(kve_trace_row(tr, 0, 5, row, 6));
    ASSERT_STATUS(kve_trace_row(tr, 0, 0, row, 0), KVE_ERANGE);
    kve_trace_free(tr);
}

/* The k-th allocation failing gives KVE_ENOMEM, *out untouched and no leak
 * (the sanitizer build checks the last part). */
static void test_alloc_failure(void)
{
    talloc ta;
    talloc_init(&ta);
    kve_trace_options o = kve_trace_default_options();
    o.allocator = &ta.a;
    for (size_t k = 0, v = 0; v < 2; k++) {
        kve_trace *tr = NULL;
        talloc_fail_after(&ta, k);
        kve_status st =
            kve_trace_open(v ? "canonical:version=1,steps=100" : "canonical:steps=100", &o, &tr);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK) {
            ASSERT_TRUE(k > 0);
            kve_trace_free(tr);
            v++;
            k = (size_t)-1; /* the next version starts again at 0 */
            continue;
        }
        ASSERT_EQ(st, KVE_ENOMEM);
        ASSERT_TRUE(tr == NULL);
        ASSERT_EQ(ta.blocks, 0);
        ASSERT_TRUE(k < 20);
    }
    talloc_check_empty(&ta);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_defaults_and_source);
    RUN(test_determinism);
    RUN(test_rows_are_distributions);
    RUN(test_v1_structure_in_steady_state);
    RUN(test_renormalisation_of_missing_classes);
    RUN(test_v2_hitters);
    RUN(test_v2_heavy_class_presence);
    RUN(test_v2_structure_in_steady_state);
    RUN(test_golden);
    RUN(test_v3_is_v2_at_the_chosen_point);
    RUN(test_streaming_memory);
    RUN(test_spec_refusals);
    RUN(test_alloc_failure);
    return CHECK_DONE();
}
