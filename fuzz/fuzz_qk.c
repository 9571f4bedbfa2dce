/* SPDX-License-Identifier: MIT */
/*
 * fuzz_qk.c - the query/key trace reader ("qk:PATH", src/eval/trace_qk.c), on
 * whatever bytes the fuzzer makes.
 *
 * Each input is written to a private temporary file and opened as
 * "qk:FILE". Checked:
 *   - a refusal is KVE_EFORMAT / KVE_EIO / KVE_ENOMEM with a non-empty
 *     one-line message and *out untouched;
 *   - an opened trace has T >= 1, heads >= 1, layers dividing heads, a key
 *     dimension >= 1, and its queries and keys fit in the input (the
 *     headers cannot promise more data than the file holds);
 *   - every row read (first, middle and last of the first and last head)
 *     is a distribution over [0, t] (finite, >= 0, summing to 1 within
 *     1e-5), or is refused with KVE_EFORMAT (logits beyond float32) and a
 *     message; reading it again gives the same bits;
 *   - every key read is finite; out-of-range heads and steps are refused
 *     with KVE_EINVAL;
 *   - the harness runs knorm and h2o on the first head (when T is small)
 *     and reports metrics in [0, 1], or refuses with KVE_EFORMAT.
 */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"
#include "kvevict_eval.h"
#include "eval_options.h"

#include <math.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) FUZZ_CHECK("fuzz_qk", c)

static char path[64], src[80];

static double *row_a, *row_b;
static float *key;
static size_t row_cap, key_cap;

static void check_trace(kve_trace *tr, size_t input_size)
{
    size_t steps = kve_trace_steps(tr), heads = kve_trace_heads(tr),
           layers = kve_trace_layers(tr), d = kve_trace_key_dim(tr);
    CHECK(steps >= 1 && heads >= 1 && layers >= 1 && heads % layers == 0 && d >= 1);
    /* K alone holds heads * steps * d values of at least 4 bytes. */
    CHECK(steps <= input_size && d <= input_size && heads * steps <= input_size / 4 / d);
    fuzz_rows(&row_a, &row_b, &row_cap, steps + 1);
    if (d > key_cap) {
        free(key);
        key_cap = d;
        key = malloc(key_cap * sizeof *key);
        CHECK(key != NULL);
    }
    size_t hs[2] = {0, heads - 1}, ts[3] = {steps - 1, 0, steps / 2};
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 3; k++) {
            kve_status st = kve_trace_row(tr, hs[h], ts[k], row_a, (ts[k]) + 1);
            if (st != KVE_OK) {
                CHECK(st == KVE_EFORMAT && kve_last_error()[0] != '\0');
                continue;
            }
            double sum = 0;
            for (size_t i = 0; i <= ts[k]; i++) {
                CHECK(isfinite(row_a[i]) && row_a[i] >= 0);
                sum += row_a[i];
            }
            CHECK(fabs(sum - 1.0) <= 1e-5);
            CHECK(kve_trace_row(tr, hs[h], ts[k], row_b, (ts[k]) + 1) == KVE_OK);
            CHECK(memcmp(row_a, row_b, (ts[k] + 1) * sizeof *row_a) == 0);
            CHECK(kve_trace_key(tr, hs[h], ts[k], key, kve_trace_key_dim(tr)) == KVE_OK);
            for (size_t j = 0; j < d; j++)
                CHECK(isfinite(key[j]));
        }
    }
    CHECK(kve_trace_row(tr, heads, 0, row_a, 1) == KVE_EINVAL);
    CHECK(kve_trace_row(tr, 0, steps, row_a, steps + 1) == KVE_EINVAL);
    CHECK(kve_trace_key(tr, heads, 0, key, kve_trace_key_dim(tr)) == KVE_EINVAL);
    CHECK(kve_trace_key(tr, 0, steps, key, kve_trace_key_dim(tr)) == KVE_EINVAL);
    if (steps <= 256 && d <= 256) {
        kve_eval_job jobs[2] = {{"knorm:budget=4,recent_window=1", 0}, {"h2o:budget=4,recent_window=1", 0}};
        kve_eval_result res[2];
        kve_status st = kve_eval(tr, 0, 1, jobs, 2, EVAL_OPTS(0, NULL, NULL), res, NULL);
        if (st == KVE_OK) {
            for (int j = 0; j < 2; j++)
                CHECK(res[j].scored_steps == 0 ||
                      (res[j].retained_mass >= 0 && res[j].retained_mass <= 1 + 1e-6));
        } else {
            CHECK(st == KVE_EFORMAT);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!path[0]) {
        fuzz_temp_path(path, sizeof path, ".qk");
        snprintf(src, sizeof src, "qk:%s", path);
    }
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, size, f) == size);
    CHECK(fclose(f) == 0);
    kve_trace *tr = (kve_trace *)&tr;
    kve_status st = kve_trace_open(src, NULL, &tr);
    if (st != KVE_OK) {
        CHECK(st == KVE_EFORMAT || st == KVE_EIO || st == KVE_ENOMEM);
        CHECK(kve_last_error()[0] != '\0' && strchr(kve_last_error(), '\n') == NULL);
        CHECK(tr == (kve_trace *)&tr);
    } else {
        check_trace(tr, size);
        kve_trace_free(tr);
    }
    unlink(path);
    return 0;
}
