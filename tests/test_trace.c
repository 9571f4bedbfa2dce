/* SPDX-License-Identifier: MIT */
/*
 * test_trace.c - the canonical synthetic trace (docs/trace.md): the
 * determinism promise, the distribution contract, the structure it is
 * documented to have (sinks, recency band, epoch heavy hitters, jittered
 * background, renormalisation where a class is missing), streaming memory,
 * spec refusals and allocation failure.
 *
 * The constants below restate the documented defaults; they are the
 * definition under test, not values fitted to the output.
 */
#include "check.h"
#include "internal.h"
#include "kvevict.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SINKS = 4, RECENT = 64, EPOCH = 512, HEAVY = 16 };
static const double SINK_MASS = 0.10, RECENT_MASS = 0.55, HEAVY_MASS = 0.20, DECAY = 0.96;
static const double BG_MASS = 1.0 - 0.10 - 0.55 - 0.20;

static const char CANONICAL_SPEC[] =
    "canonical:seed=1,steps=4096,sinks=4,sink_mass=0.1,recent=64,recent_mass=0.55,"
    "recent_decay=0.96,epoch=512,heavy=16,heavy_mass=0.2,jitter=0.5";

#define GOLDEN_HASH 0x92bbe0076cbe1867u

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
    ASSERT_OK(kve_trace_open("canonical", 0, &tr));
    ASSERT_EQ(kve_trace_steps(tr), 4096);
    ASSERT_EQ(kve_trace_heads(tr), 1);
    ASSERT_EQ(kve_trace_layers(tr), 1);
    ASSERT_STR_EQ(kve_trace_source(tr), CANONICAL_SPEC);
    /* The canonical spec opens back to the same spec; a partial spec fills
     * in the defaults in the fixed order. */
    kve_trace *tr2 = NULL;
    ASSERT_OK(kve_trace_open(kve_trace_source(tr), 0, &tr2));
    ASSERT_STR_EQ(kve_trace_source(tr2), CANONICAL_SPEC);
    kve_trace_free(tr2);
    tr2 = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=10,seed=7", 0, &tr2));
    ASSERT_CONTAINS(kve_trace_source(tr2), "canonical:seed=7,steps=10,sinks=4,");
    ASSERT_EQ(kve_trace_steps(tr2), 10);
    kve_trace_free(tr2);
    kve_trace_free(tr);
    kve_trace_free(NULL);
    ASSERT_EQ(kve_trace_steps(NULL), 0);
    ASSERT_TRUE(kve_trace_source(NULL) == NULL);
}

/* Two opens give bit-identical rows, in ascending order, descending order
 * and a seeded random order. */
static void test_determinism(void)
{
    enum { T = 1300 };
    const char *spec = "canonical:steps=1300,seed=77";
    kve_trace *a = NULL, *b = NULL;
    ASSERT_OK(kve_trace_open(spec, 0, &a));
    ASSERT_OK(kve_trace_open(spec, 0, &b));
    double *ra = malloc(T * sizeof *ra), *rb = malloc(T * sizeof *rb);
    double *all = malloc((size_t)T * T * sizeof *all); /* test-side copy, 13 MB */
    ASSERT_TRUE(ra && rb && all);
    for (size_t t = 0; t < T; t++) {
        ASSERT_OK(kve_trace_row(a, 0, t, all + t * T));
    }
    for (size_t t = T; t-- > 0;) {
        ASSERT_OK(kve_trace_row(b, 0, t, rb));
        if (memcmp(rb, all + t * T, (t + 1) * sizeof *rb) != 0)
            CHECK_FAIL_AT("row %zu differs when read in descending order", t);
    }
    uint64_t x = check_seed;
    for (int k = 0; k < 400; k++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        size_t t = (size_t)(x >> 33) % T;
        ASSERT_OK(kve_trace_row(a, 0, t, ra));
        if (memcmp(ra, all + t * T, (t + 1) * sizeof *ra) != 0)
            CHECK_FAIL_AT("row %zu differs when read in random order", t);
    }
    /* A different seed gives a different trace. */
    kve_trace *c = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=1300,seed=78", 0, &c));
    ASSERT_OK(kve_trace_row(c, 0, 1000, rb));
    ASSERT_TRUE(memcmp(rb, all + 1000 * (size_t)T, 1001 * sizeof *rb) != 0);
    kve_trace_free(c);
    free(ra);
    free(rb);
    free(all);
    kve_trace_free(a);
    kve_trace_free(b);
}

/* Every row is a distribution of float32-representable weights: row 0 is
 * [1]; row t >= 1 puts 0 on key t and sums to 1 within float rounding. */
static void test_rows_are_distributions(void)
{
    enum { T = 2100 };
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=2100,seed=3", 0, &tr));
    double *row = malloc(T * sizeof *row);
    ASSERT_TRUE(row);
    ASSERT_OK(kve_trace_row(tr, 0, 0, row));
    ASSERT_TRUE(row[0] == 1.0);
    for (size_t t = 1; t < T; t++) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row));
        if (row[t] != 0.0)
            CHECK_FAIL_AT("row %zu puts %g on its own key", t, row[t]);
        double s = 0;
        for (size_t i = 0; i < t; i++) {
            if (!(row[i] > 0.0) || (double)(float)row[i] != row[i])
                CHECK_FAIL_AT("row %zu key %zu: %.17g is not a positive float32", t, i, row[i]);
            s += row[i];
        }
        /* Each weight is off by at most 2^-24 of itself after rounding. */
        if (!(fabs(s - 1.0) <= 1e-7))
            CHECK_FAIL_AT("row %zu sums to %.17g", t, s);
    }
    free(row);
    kve_trace_free(tr);
}

/* Away from the first RECENT steps of an epoch (where last epoch's keys can
 * be heavy and recent at once) and past epoch 0 (which has no heavy
 * hitters), the classes hold exactly their documented masses: sinks 0.10 in
 * equal shares, the last 64 keys 0.55 decaying by 0.96 per step of
 * distance, 16 heavy keys 0.20, the background the remaining 0.15. */
static void test_structure_in_steady_state(void)
{
    enum { T = 2048 };
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=2048", 0, &tr));
    double *row = malloc(T * sizeof *row);
    ASSERT_TRUE(row);
    int32_t prev_heavy[HEAVY] = {0};
    for (size_t t = EPOCH + RECENT; t < T; t += 37) {
        if (t % EPOCH < RECENT)
            continue;
        ASSERT_OK(kve_trace_row(tr, 0, t, row));
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
 * present): epoch 0 has no heavy hitters, the first steps lack band or
 * background. */
static void test_renormalisation_of_missing_classes(void)
{
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=600", 0, &tr));
    double row[600];
    /* t = 1..4: keys [0, t) are all sinks. */
    for (size_t t = 1; t <= SINKS; t++) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row));
        for (size_t i = 0; i < t; i++)
            ASSERT_TRUE(row[i] == (double)(float)(1.0 / (double)t));
    }
    /* t = 5: sinks and a band of one key. */
    ASSERT_OK(kve_trace_row(tr, 0, 5, row));
    ASSERT_TRUE(row[4] == (double)(float)(RECENT_MASS / (SINK_MASS + RECENT_MASS)));
    ASSERT_TRUE(row[0] == (double)(float)(SINK_MASS / (SINK_MASS + RECENT_MASS) / 4));
    /* t = 300, epoch 0: sinks, full band and background, no heavy. */
    ASSERT_OK(kve_trace_row(tr, 0, 300, row));
    double present = SINK_MASS + RECENT_MASS + BG_MASS;
    ASSERT_NEAR(sum_range(row, 0, SINKS), SINK_MASS / present, 1e-7);
    ASSERT_NEAR(sum_range(row, 300 - RECENT, 300), RECENT_MASS / present, 1e-7);
    ASSERT_NEAR(sum_range(row, SINKS, 300 - RECENT), BG_MASS / present, 1e-7);
    kve_trace_free(tr);

    /* All present classes at mass 0: the row is uniform. */
    ASSERT_OK(kve_trace_open("canonical:steps=40,sink_mass=0,recent_mass=0,heavy_mass=1", 0,
                             &tr));
    ASSERT_OK(kve_trace_row(tr, 0, 30, row));
    for (size_t i = 0; i < 30; i++)
        ASSERT_TRUE(row[i] == (double)(float)(1.0 / 30));
    kve_trace_free(tr);

    /* Masses that leave no background are fine; more than 1 is refused. */
    ASSERT_OK(kve_trace_open("canonical:steps=40,sink_mass=0.2,recent_mass=0.8,heavy_mass=0", 0,
                             &tr));
    ASSERT_OK(kve_trace_row(tr, 0, 39, row));
    ASSERT_NEAR(sum_range(row, 0, SINKS), 0.2, 1e-7);
    ASSERT_NEAR(sum_range(row, SINKS, 39), 0.8, 1e-7);
    kve_trace_free(tr);
}

/* FNV-1a over the float32 bits of every row of a 1200-step trace (epochs 0,
 * 1 and 2). Pins the generator: any change to it, or a platform that
 * computes a different bit, fails here. Recorded from this implementation. */
static void test_golden(void)
{
    enum { T = 1200 };
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=1200", 0, &tr));
    double row[T];
    uint64_t h = 1469598103934665603u;
    for (size_t t = 0; t < T; t++) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row));
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
    printf("golden hash %016llx\n", (unsigned long long)h);
    ASSERT_U64_EQ(h, GOLDEN_HASH);
    kve_trace_free(tr);
}

/* Streaming: opening allocates O(recent + heavy), reading rows allocates
 * nothing, and a trace of 2^20 steps (a T x T matrix would be 8 TiB) opens
 * and yields its last row. A 65,536-step trace is sampled across its length. */
static void test_streaming_memory(void)
{
    kve_trace *tr = NULL;
    kve__alloc_fail_after(SIZE_MAX);
    ASSERT_OK(kve_trace_open("canonical:steps=65536", 0, &tr));
    size_t at_open = kve__alloc_fail_after(SIZE_MAX);
    ASSERT_TRUE(at_open <= 8);
    double *row = malloc(65536 * sizeof *row);
    ASSERT_TRUE(row);
    for (size_t t = 0; t < 65536; t += 2039) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row));
        ASSERT_NEAR(sum_range(row, 0, t + 1), 1.0, 1e-6);
    }
    ASSERT_EQ(kve__alloc_fail_after(SIZE_MAX), 0);
    kve_trace_free(tr);
    free(row);

    enum { BIG = 1 << 20 };
    ASSERT_OK(kve_trace_open("canonical:steps=1048576", 0, &tr));
    row = malloc((size_t)BIG * sizeof *row);
    ASSERT_TRUE(row);
    ASSERT_OK(kve_trace_row(tr, 0, BIG - 1, row));
    ASSERT_NEAR(sum_range(row, 0, BIG), 1.0, 1e-6);
    ASSERT_NEAR(sum_range(row, BIG - 1 - RECENT, BIG - 1), RECENT_MASS, 1e-6);
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
        {"", "empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kve_trace *tr = (kve_trace *)&bad; /* sentinel: must stay untouched */
        ASSERT_STATUS(kve_trace_open(bad[i].src, 0, &tr), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), bad[i].msg);
        ASSERT_TRUE(tr == (kve_trace *)&bad);
    }
    kve_trace *tr = NULL;
    ASSERT_STATUS(kve_trace_open(NULL, 0, &tr), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_open("canonical", 0, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_open("canonical", 2, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "flags");
    ASSERT_TRUE(tr == NULL);
    /* KVE_TRACE_NORMALIZE is accepted and changes nothing for canonical. */
    ASSERT_OK(kve_trace_open("canonical:steps=8", KVE_TRACE_NORMALIZE, &tr));
    double row[8];
    ASSERT_STATUS(kve_trace_row(tr, 1, 0, row), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 1");
    ASSERT_STATUS(kve_trace_row(tr, 0, 8, row), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "step 8");
    ASSERT_STATUS(kve_trace_row(tr, 0, 0, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_row(NULL, 0, 0, row), KVE_EINVAL);
    kve_trace_free(tr);
}

/* The k-th allocation failing gives KVE_ENOMEM, *out untouched and no leak
 * (the sanitizer build checks the last part). */
static void test_alloc_failure(void)
{
    for (size_t k = 0;; k++) {
        kve_trace *tr = NULL;
        kve__alloc_fail_after(k);
        kve_status st = kve_trace_open("canonical:steps=100", 0, &tr);
        kve__alloc_fail_after(SIZE_MAX);
        if (st == KVE_OK) {
            ASSERT_TRUE(k > 0);
            kve_trace_free(tr);
            break;
        }
        ASSERT_EQ(st, KVE_ENOMEM);
        ASSERT_TRUE(tr == NULL);
        ASSERT_TRUE(k < 20);
    }
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_defaults_and_source);
    RUN(test_determinism);
    RUN(test_rows_are_distributions);
    RUN(test_structure_in_steady_state);
    RUN(test_renormalisation_of_missing_classes);
    RUN(test_golden);
    RUN(test_streaming_memory);
    RUN(test_spec_refusals);
    RUN(test_alloc_failure);
    return CHECK_DONE();
}
