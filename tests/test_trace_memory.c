/* SPDX-License-Identifier: MIT */
/*
 * test_trace_memory.c - traces over the caller's float32 array
 * (kve_trace_from_memory): shapes [T,T], [H,T,T] and [L,H,T,T]; rows and
 * evaluation results bit for bit those of the .npy file holding the same
 * array (flags 0 and KVE_TRACE_NORMALIZE); every argument refusal; every
 * kind of bad row refused with a message naming head, layer, row and key;
 * the array borrowed, not copied (a changed row is refused when read); the
 * reserved source text "memory"; the .npy writer on a memory trace;
 * allocation failure; and a seeded refusal loop that corrupts random arrays
 * and holds every decision and message to the .npy reader's on the same
 * data (the fuzz target fuzz_memory is its libFuzzer cousin).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "test_allocator.h"
#include "internal.h"
#include "kvevict_eval.h"
#include "eval_options.h"
#include "npy_file.h"
#include "tmpdir.h"

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A deterministic generator for the test's arrays (not the library's). */
static uint64_t lcg_state;
static double lcg_uniform(void)
{
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}

/* Fills `heads` heads of [T, T] with attention rows: row t is positive over
 * keys [0, t] and sums to 1 in float32 within rounding, zeros above. With
 * `scale` != 1 every row is multiplied by it (rows for NORMALIZE). */
static void fill_rows(float *a, size_t heads, size_t T, double scale)
{
    for (size_t h = 0; h < heads; h++)
        for (size_t t = 0; t < T; t++) {
            float *row = a + (h * T + t) * T;
            double sum = 0;
            for (size_t i = 0; i <= t; i++) {
                row[i] = (float)(0.05 + lcg_uniform());
                sum += row[i];
            }
            for (size_t i = 0; i <= t; i++)
                row[i] = (float)(row[i] / sum * scale);
            for (size_t i = t + 1; i < T; i++)
                row[i] = 0.0f;
        }
}

/* Every row of every head of a and b equal bit for bit. */
static int same_rows(kve_trace *a, kve_trace *b)
{
    size_t T = kve_trace_steps(a), H = kve_trace_heads(a);
    if (kve_trace_steps(b) != T || kve_trace_heads(b) != H ||
        kve_trace_layers(a) != kve_trace_layers(b))
        return 0;
    double *ra = malloc(T * sizeof *ra), *rb = malloc(T * sizeof *rb);
    int same = ra && rb;
    for (size_t h = 0; same && h < H; h++)
        for (size_t t = 0; same && t < T; t++)
            same = kve_trace_row(a, h, t, ra, t + 1) == KVE_OK && kve_trace_row(b, h, t, rb, t + 1) == KVE_OK &&
                   memcmp(ra, rb, (t + 1) * sizeof *ra) == 0;
    free(ra);
    free(rb);
    return same;
}

static void test_shapes(void)
{
    enum { L = 2, H = 3, T = 17 };
    static float a[L * H * T * T];
    lcg_state = check_seed;
    fill_rows(a, L * H, T, 1.0);
    const size_t shapes[3][2] = {{1, 1}, {1, L * H}, {L, H}};
    for (int k = 0; k < 3; k++) {
        kve_trace *tr = NULL;
        ASSERT_OK(kve_trace_from_memory(a, shapes[k][0], shapes[k][1], T, NULL, &tr));
        ASSERT_EQ(kve_trace_steps(tr), T);
        ASSERT_EQ(kve_trace_heads(tr), shapes[k][0] * shapes[k][1]);
        ASSERT_EQ(kve_trace_layers(tr), shapes[k][0]);
        ASSERT_STR_EQ(kve_trace_source(tr), "memory");
        double row[T];
        size_t last = kve_trace_heads(tr) - 1;
        ASSERT_OK(kve_trace_row(tr, last, T - 1, row, T));
        for (size_t i = 0; i < T; i++)
            ASSERT_TRUE(row[i] == (double)a[(last * T + T - 1) * T + i]);
        ASSERT_OK(kve_trace_row(tr, 0, 0, row, 1));
        ASSERT_TRUE(row[0] == (double)a[0]);
        ASSERT_STATUS(kve_trace_row(tr, last + 1, 0, row, 1), KVE_EINVAL);
        ASSERT_STATUS(kve_trace_row(tr, 0, T, row, T + 1), KVE_EINVAL);
        kve_trace_free(tr);
    }
}

/* The rows and a whole evaluation of a memory trace equal the .npy file's. */
static void test_same_as_npy(void)
{
    enum { L = 2, H = 2, T = 90 };
    static float a[L * H * T * T];
    static const unsigned flag_sets[2] = {0, KVE_TRACE_NORMALIZE};
    for (int f = 0; f < 2; f++) {
        lcg_state = check_seed + (uint64_t)f;
        fill_rows(a, L * H, T, f ? 3.5 : 1.0); /* rows summing to 3.5 need NORMALIZE */
        const size_t dims[4] = {L, H, T, T};
        ASSERT_EQ(npy_write_f4(path_of("same.npy"), dims, 4, a), 0);
        kve_trace *m = NULL, *n = NULL;
        ASSERT_OK(kve_trace_from_memory(a, L, H, T, TRACE_FLAGS(flag_sets[f]), &m));
        ASSERT_OK(kve_trace_open(path_of("same.npy"), TRACE_FLAGS(flag_sets[f]), &n));
        ASSERT_TRUE(same_rows(m, n));
        const kve_eval_job jobs[] = {{"h2o:recent_window=4", 16}, {"tova", 20},
                                     {"random:recent_window=2", 10}, {"streaming:sinks=2", 8}};
        enum { NJ = sizeof jobs / sizeof jobs[0] };
        kve_eval_result rm[NJ], rn[NJ];
        kve_eval_options o = kve_eval_default_options();
        o.seed = check_seed;
        o.topk = 5;
        for (size_t h = 0; h < L * H; h++) {
            ASSERT_OK(kve_eval(m, h, 1, jobs, NJ, &o, rm, NULL));
            ASSERT_OK(kve_eval(n, h, 1, jobs, NJ, &o, rn, NULL));
            for (size_t j = 0; j < NJ; j++) {
                rm[j].ns_per_step = rn[j].ns_per_step = 0; /* the one timing */
                ASSERT_TRUE(memcmp(&rm[j], &rn[j], sizeof rm[j]) == 0);
                ASSERT_TRUE(rm[j].scored_steps > 0);
            }
        }
        kve_trace_free(m);
        kve_trace_free(n);
    }
    unlink(path_of("same.npy"));
}

static void test_argument_refusals(void)
{
    float a[4] = {1, 0, 0.5f, 0.5f};
    kve_trace *const untouched = (kve_trace *)&a;
    kve_trace *tr = untouched;
    ASSERT_STATUS(kve_trace_from_memory(NULL, 1, 1, 2, NULL, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "attn is NULL");
    ASSERT_STATUS(kve_trace_from_memory(a, 1, 1, 2, NULL, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "out is NULL");
    ASSERT_STATUS(kve_trace_from_memory(a, 1, 1, 2, TRACE_FLAGS(2), &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "flags 0x2");
    ASSERT_STATUS(kve_trace_from_memory(a, 0, 1, 2, NULL, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "zero dimension");
    ASSERT_STATUS(kve_trace_from_memory(a, 1, 0, 2, NULL, &tr), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_from_memory(a, 1, 1, 0, NULL, &tr), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_from_memory(a, 1, 1, (size_t)INT32_MAX + 1, NULL, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "largest position");
    /* Shapes whose byte size overflows, at each factor (nothing is read). */
    ASSERT_STATUS(kve_trace_from_memory(a, SIZE_MAX / 2, 3, 1, NULL, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "larger than memory");
    ASSERT_STATUS(kve_trace_from_memory(a, 1, SIZE_MAX / 8, 3, NULL, &tr), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_from_memory(a, 1, SIZE_MAX / 8 / 65536, 65536, NULL, &tr), KVE_EINVAL);
    ASSERT_TRUE(tr == untouched);
}

/* One corruption at (head, t, i) of a [2, 2, T, T] array: refused with the
 * expected status and words. */
static void expect_refused(float *a, size_t T, unsigned flags, size_t h, size_t t,
                           const char *words)
{
    kve_trace *const untouched = (kve_trace *)&a;
    kve_trace *tr = untouched;
    ASSERT_STATUS(kve_trace_from_memory(a, 2, 2, T, TRACE_FLAGS(flags), &tr), KVE_EFORMAT);
    ASSERT_TRUE(tr == untouched);
    char where[64];
    snprintf(where, sizeof where, "memory: head %zu (layer %zu, head %zu), row %zu", h, h / 2,
             h % 2, t);
    ASSERT_CONTAINS(kve_last_error(), where);
    ASSERT_CONTAINS(kve_last_error(), words);
    ASSERT_TRUE(strchr(kve_last_error(), '\n') == NULL);
}

static void test_bad_rows(void)
{
    enum { T = 9 };
    static float a[4 * T * T];
    lcg_state = check_seed;
    fill_rows(a, 4, T, 1.0);
    size_t at = (3 * T + 5) * T + 2; /* head 3, row 5, key 2 */
    float keep = a[at];
    const float bad[] = {NAN, INFINITY, -0.25f};
    for (size_t k = 0; k < 3; k++) {
        a[at] = bad[k];
        expect_refused(a, T, 0, 3, 5, "weight at key 2 is");
        expect_refused(a, T, KVE_TRACE_NORMALIZE, 3, 5, "weight at key 2 is");
    }
    a[at] = keep + 0.01f; /* a sum off by 0.01 */
    expect_refused(a, T, 0, 3, 5, "sums to");
    a[at] = keep;
    /* A zero row cannot be normalised; row 0 is not held to sum 1. */
    float row1[T];
    memcpy(row1, a + (1 * T + 4) * T, sizeof row1);
    memset(a + (1 * T + 4) * T, 0, sizeof row1);
    expect_refused(a, T, KVE_TRACE_NORMALIZE, 1, 4, "all weights over [0, t] are zero");
    memcpy(a + (1 * T + 4) * T, row1, sizeof row1);
    a[(2 * T + 0) * T + 0] = 0.5f;
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_from_memory(a, 2, 2, T, NULL, &tr));
    kve_trace_free(tr);
    /* Entries above the diagonal are never read: NaN there is fine. */
    a[(0 * T + 3) * T + 7] = NAN;
    ASSERT_OK(kve_trace_from_memory(a, 2, 2, T, NULL, &tr));
    kve_trace_free(tr);
    /* Without NORMALIZE a huge weight is a row that does not sum to 1. */
    a[(0 * T + 3) * T + 0] = FLT_MAX;
    expect_refused(a, T, 0, 0, 3, "sums to");
}

/* The array is borrowed: a row changed after creation is refused when read,
 * and the rows read before the change were the array's. */
static void test_borrowed(void)
{
    enum { T = 12 };
    static float a[T * T];
    lcg_state = check_seed;
    fill_rows(a, 1, T, 1.0);
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_from_memory(a, 1, 1, T, NULL, &tr));
    double row[T];
    ASSERT_OK(kve_trace_row(tr, 0, 7, row, 8));
    a[7 * T + 3] = NAN;
    ASSERT_STATUS(kve_trace_row(tr, 0, 7, row, 8), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "memory: head 0, row 7: weight at key 3 is nan");
    kve_eval_job job = {"h2o:recent_window=2", 4};
    kve_eval_result r;
    ASSERT_STATUS(kve_eval(tr, 0, 1, &job, 1, EVAL_OPTS(0, NULL, NULL), &r, NULL), KVE_EFORMAT);
    a[7 * T + 3] = 0.5f; /* a finite weight, but the row no longer sums to 1 */
    ASSERT_STATUS(kve_trace_row(tr, 0, 7, row, 8), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "sums to");
    kve_trace_free(tr);
}

/* "memory" is the source text of these traces: no text opens one. */
static void test_reserved_name(void)
{
    kve_trace *tr = NULL;
    ASSERT_STATUS(kve_trace_open("memory", NULL, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "kve_trace_from_memory");
    ASSERT_STATUS(kve_trace_open("memory:steps=3", NULL, &tr), KVE_EINVAL);
    ASSERT_TRUE(tr == NULL);
    /* A file of that name opens by a path. */
    enum { T = 4 };
    float a[T * T];
    lcg_state = check_seed;
    fill_rows(a, 1, T, 1.0);
    const size_t dims[2] = {T, T};
    ASSERT_EQ(npy_write_f4(path_of("memory"), dims, 2, a), 0);
    ASSERT_OK(kve_trace_open(path_of("memory"), NULL, &tr));
    ASSERT_EQ(kve_trace_steps(tr), T);
    kve_trace_free(tr);
    unlink(path_of("memory"));
}

/* kve_trace_write_npy of each head of a memory trace: the file holds the
 * array's head. */
static void test_writer(void)
{
    enum { H = 3, T = 21 };
    static float a[H * T * T];
    lcg_state = check_seed;
    fill_rows(a, H, T, 1.0);
    kve_trace *m = NULL, *back = NULL, *one = NULL;
    ASSERT_OK(kve_trace_from_memory(a, 1, H, T, NULL, &m));
    ASSERT_EQ(kve_trace_npy_bytes(m), 128 + 4 * T * T);
    for (size_t h = 0; h < H; h++) {
        ASSERT_OK(kve_trace_write_npy(m, h, path_of("w.npy")));
        ASSERT_OK(kve_trace_open(path_of("w.npy"), NULL, &back));
        ASSERT_OK(kve_trace_from_memory(a + h * T * T, 1, 1, T, NULL, &one));
        ASSERT_TRUE(same_rows(back, one));
        kve_trace_free(back);
        kve_trace_free(one);
        back = one = NULL;
    }
    kve_trace_free(m);
    unlink(path_of("w.npy"));
}

/* Every allocation of kve_trace_from_memory failing in turn: ENOMEM, *out
 * untouched, nothing leaked (ASan and valgrind see the rest). */
static void test_alloc_failure(void)
{
    enum { T = 6 };
    float a[T * T];
    lcg_state = check_seed;
    fill_rows(a, 1, T, 1.0);
    talloc ta;
    talloc_init(&ta);
    kve_trace_options o = kve_trace_default_options();
    o.allocator = &ta.a;
    size_t k = 0;
    for (;; k++) {
        ASSERT_TRUE(k < 16);
        kve_trace *const untouched = (kve_trace *)&k;
        kve_trace *tr = untouched;
        talloc_fail_after(&ta, k);
        kve_status st = kve_trace_from_memory(a, 1, 1, T, &o, &tr);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK) {
            ASSERT_EQ(kve_trace_steps(tr), T);
            kve_trace_free(tr);
            break;
        }
        ASSERT_STATUS(st, KVE_ENOMEM);
        ASSERT_CONTAINS(kve_last_error(), "out of memory");
        ASSERT_TRUE(tr == untouched);
        ASSERT_EQ(ta.blocks, 0);
    }
    ASSERT_TRUE(k >= 2); /* the row buffer and the handle, at least */
    talloc_check_empty(&ta);
}

/* Seeded refusal loop: random shapes, random arrays with random damage (a
 * NaN, an infinity, a negative weight, a scaled row, a zero row, damage
 * above the diagonal), both flags. Every decision, message (but for its
 * first word: "memory" or the path) and accepted row equals the .npy
 * reader's on the same bytes. */
static void test_refusals_match_npy(void)
{
    enum { ROUNDS = 300, MAX_T = 12 };
    static float a[2 * 3 * MAX_T * MAX_T];
    char mem_msg[512];
    lcg_state = check_seed ^ 0x9e3779b97f4a7c15ull;
    size_t accepted = 0, refused = 0;
    for (int round = 0; round < ROUNDS; round++) {
        size_t L = 1 + (size_t)(lcg_uniform() * 2), H = 1 + (size_t)(lcg_uniform() * 3);
        size_t T = 1 + (size_t)(lcg_uniform() * MAX_T);
        size_t heads = L * H;
        fill_rows(a, heads, T, 1.0);
        size_t damages = (size_t)(lcg_uniform() * 3);
        for (size_t d = 0; d < damages; d++) {
            size_t h = (size_t)(lcg_uniform() * (double)heads), t = (size_t)(lcg_uniform() * (double)T);
            size_t i = (size_t)(lcg_uniform() * (double)T);
            float *row = a + (h * T + t) * T;
            switch ((int)(lcg_uniform() * 6)) {
            case 0: row[i] = NAN; break;
            case 1: row[i] = -INFINITY; break;
            case 2: row[i] = -1e-30f; break;
            case 3: for (size_t j = 0; j <= t; j++) row[j] *= 1.5f; break;
            case 4: memset(row, 0, (t + 1) * sizeof *row); break;
            default: row[i] = 2.0f; break;
            }
        }
        const size_t dims[4] = {L, H, T, T};
        ASSERT_EQ(npy_write_f4(path_of("r.npy"), dims, 4, a), 0);
        for (unsigned flags = 0; flags <= KVE_TRACE_NORMALIZE; flags++) {
            kve_trace *m = NULL, *n = NULL;
            kve_status sm = kve_trace_from_memory(a, L, H, T, TRACE_FLAGS(flags), &m);
            snprintf(mem_msg, sizeof mem_msg, "%s", kve_last_error());
            kve_status sn = kve_trace_open(path_of("r.npy"), TRACE_FLAGS(flags), &n);
            if (sm != sn)
                CHECK_FAIL_AT("round %d (replay with seed %llu): memory %s (%s), npy %s (%s)",
                              round, (unsigned long long)check_seed, kve_status_name(sm), mem_msg,
                              kve_status_name(sn), kve_last_error());
            if (sm == KVE_OK) {
                accepted++;
                ASSERT_TRUE(same_rows(m, n));
            } else {
                refused++;
                ASSERT_STATUS(sm, KVE_EFORMAT);
                const char *tail_m = strstr(mem_msg, ": head "), *tail_n = strstr(kve_last_error(), ": head ");
                ASSERT_TRUE(tail_m && tail_n);
                ASSERT_STR_EQ(tail_m, tail_n);
            }
            kve_trace_free(m);
            kve_trace_free(n);
        }
    }
    unlink(path_of("r.npy"));
    printf("    %zu accepted, %zu refused\n", accepted, refused);
    ASSERT_TRUE(accepted > ROUNDS / 4 && refused > ROUNDS / 4);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    if (tmpdir_make("kve-memory") != 0)
        return 1;
    RUN(test_shapes);
    RUN(test_same_as_npy);
    RUN(test_argument_refusals);
    RUN(test_bad_rows);
    RUN(test_borrowed);
    RUN(test_reserved_name);
    RUN(test_writer);
    RUN(test_alloc_failure);
    RUN(test_refusals_match_npy);
    remove_dir();
    return CHECK_DONE();
}
