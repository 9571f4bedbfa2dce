/* SPDX-License-Identifier: MIT */
/*
 * fuzz_npy.c - the .npy reader and writer, on whatever bytes the fuzzer makes.
 *
 * Each input is written to a private temporary file and opened with
 * kve_trace_open, with flags 0 and with KVE_TRACE_NORMALIZE. Checked:
 *   - a refusal is KVE_EFORMAT / KVE_EIO / KVE_ENOMEM with a non-empty
 *     one-line message and *out untouched;
 *   - an opened trace has T >= 1, heads >= 1, layers dividing heads, and its
 *     T*T*heads entries fit in the input (the header cannot promise more data
 *     than the file holds);
 *   - every row read (first, middle and last of the first and last head) is
 *     a distribution: finite, >= 0, summing to 1 within 1e-3 (1e-6 after
 *     NORMALIZE, up to float rounding); reading the same row twice, out of
 *     order, gives the same values;
 *   - out-of-range head / step reads are refused with KVE_EINVAL;
 *   - kve_trace_write_npy of head 0 writes a file that opens again with the
 *     same shape and rows within float32 rounding, or refuses with
 *     KVE_ERANGE, writing nothing, when row 0 holds a weight beyond float32.
 */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"
#include "fuzz_rows.h"
#include "kvevict_eval.h"
#include "eval_options.h"

#include <float.h>
#include <math.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) FUZZ_CHECK("fuzz_npy", c)

static char in_path[64], out_path[64];

static void make_paths(void)
{
    fuzz_temp_path(in_path, sizeof in_path, ".npy");
    fuzz_temp_path(out_path, sizeof out_path, "-w.npy");
}

static void write_input(const uint8_t *data, size_t size)
{
    FILE *f = fopen(in_path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, size, f) == size);
    CHECK(fclose(f) == 0);
}

static double *row_a, *row_b;
static size_t row_cap;

static void check_row(const double *row, size_t t, double tol)
{
    CHECK(row_is_distribution(row, t, tol));
}

static void check_trace(kve_trace *tr, unsigned flags, size_t input_size)
{
    size_t steps = kve_trace_steps(tr), heads = kve_trace_heads(tr),
           layers = kve_trace_layers(tr);
    CHECK(steps >= 1 && heads >= 1 && layers >= 1 && heads % layers == 0);
    /* The entries were all validated at open, so they are in the input. */
    CHECK(steps <= input_size && heads <= input_size);
    CHECK(heads * steps * steps <= input_size / 4);

    fuzz_rows(&row_a, &row_b, &row_cap, steps + 1);
    double tol = flags & KVE_TRACE_NORMALIZE ? 1e-6 : 1e-3 + 1e-6;
    size_t hs[2] = {0, heads - 1}, ts[3] = {steps - 1, 0, steps / 2};
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 3; k++) {
            CHECK(kve_trace_row(tr, hs[h], ts[k], row_a, (ts[k]) + 1) == KVE_OK);
            check_row(row_a, ts[k], tol);
        }
        CHECK(kve_trace_row(tr, hs[h], steps - 1, row_b, steps) == KVE_OK);
        CHECK(kve_trace_row(tr, hs[h], steps - 1, row_a, steps) == KVE_OK);
        CHECK(memcmp(row_a, row_b, steps * sizeof *row_a) == 0);
    }
    CHECK(kve_trace_row(tr, heads, 0, row_a, 1) == KVE_EINVAL);
    CHECK(kve_trace_row(tr, 0, steps, row_a, steps + 1) == KVE_EINVAL);

    /* Round trip of head 0 through the writer. */
    kve_status st = kve_trace_write_npy(tr, 0, out_path);
    if (st == KVE_ERANGE) { /* row 0 may hold a weight beyond float32 */
        CHECK(kve_trace_row(tr, 0, 0, row_a, 1) == KVE_OK);
        CHECK(row_a[0] > FLT_MAX); /* rows t >= 1 sum to 1: only row 0 can be this large */
        CHECK(access(out_path, F_OK) != 0);
        return;
    }
    CHECK(st == KVE_OK);
    kve_trace *back = NULL;
    CHECK(kve_trace_open(out_path, NULL, &back) == KVE_OK);
    CHECK(kve_trace_steps(back) == steps && kve_trace_heads(back) == 1);
    for (size_t k = 0; k < 3; k++) {
        size_t t = ts[k];
        CHECK(kve_trace_row(tr, 0, t, row_a, t + 1) == KVE_OK);
        CHECK(kve_trace_row(back, 0, t, row_b, t + 1) == KVE_OK);
        for (size_t i = 0; i <= t; i++)
            CHECK(row_b[i] == (double)(float)row_a[i]);
    }
    kve_trace_free(back);
    unlink(out_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!in_path[0])
        make_paths();
    write_input(data, size);
    static const unsigned flag_sets[2] = {0, KVE_TRACE_NORMALIZE};
    for (int f = 0; f < 2; f++) {
        kve_trace *tr = (kve_trace *)&tr;
        kve_status st = kve_trace_open(in_path, TRACE_FLAGS(flag_sets[f]), &tr);
        if (st != KVE_OK) {
            CHECK(st == KVE_EFORMAT || st == KVE_EIO || st == KVE_ENOMEM);
            CHECK(kve_last_error()[0] != '\0' && strchr(kve_last_error(), '\n') == NULL);
            CHECK(tr == (kve_trace *)&tr);
            continue;
        }
        check_trace(tr, flag_sets[f], size);
        kve_trace_free(tr);
    }
    unlink(in_path);
    return 0;
}
