/* SPDX-License-Identifier: MIT */
/*
 * fuzz_memory.c - in-memory traces (kve_trace_from_memory) on whatever
 * arrays the fuzzer makes, held to the .npy reader on the same data.
 *
 * Input: byte 0 gives L = 1 + b % 2, byte 1 H = 1 + b % 3, byte 2
 * T = 1 + b % 16, byte 3 the mode: bit 0 KVE_TRACE_NORMALIZE, bit 1 an
 * undefined flag (must be refused with KVE_EINVAL), bit 2 "weights" (else
 * "raw"), bit 3 rows divided by their sum in float32 (weights mode). The
 * L*H*T*T float32 values come from the rest of the input, cycled when it is
 * shorter (zeros when it is empty): raw mode takes 4 bytes as the float's
 * bits (NaN, infinities, negatives, huge values); weights mode takes one
 * byte per weight, b / 16, except 0xff NaN, 0xfe -1 and 0xfd infinity.
 * Checked:
 *   - a refusal is KVE_EFORMAT (KVE_EINVAL for the undefined flag) with a
 *     non-empty one-line message, *out untouched;
 *   - the .npy reader, on a file holding the same array, decides the same,
 *     and refuses with the same message but for its first word (the path);
 *   - an accepted trace has the shape asked for, every row read (first,
 *     middle, last of the first and last head) is a distribution and equals
 *     the .npy reader's bit for bit; out-of-range reads are refused.
 */
#define _POSIX_C_SOURCE 200809L
#include "fuzz_rows.h"
#include "kvevict_eval.h"
#include "eval_options.h"
#include "npy_file.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                           \
    do {                                                                                   \
        if (!(c)) {                                                                        \
            fprintf(stderr, "fuzz_memory: CHECK(%s) failed at line %d (last error: %s)\n", \
                    #c, __LINE__, kve_last_error());                                       \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

enum { MAX_L = 2, MAX_H = 3, MAX_T = 16, HEADER = 4 };

static float array[MAX_L * MAX_H * MAX_T * MAX_T];
static double row_m[MAX_T], row_n[MAX_T];
static char path[64], message[512];

/* The array the input describes, of n = L*H*T*T values. */
static void build(const uint8_t *body, size_t len, unsigned mode, size_t heads, size_t T)
{
    size_t n = heads * T * T;
    for (size_t k = 0; k < n; k++) {
        if (len == 0) {
            array[k] = 0.0f;
        } else if (mode & 4) {
            uint8_t b = body[k % len];
            array[k] = b == 0xff ? NAN : b == 0xfe ? -1.0f : b == 0xfd ? INFINITY : (float)b / 16;
        } else {
            uint32_t bits = 0;
            for (size_t j = 0; j < 4; j++)
                bits |= (uint32_t)body[(4 * k + j) % len] << (8 * j);
            memcpy(&array[k], &bits, sizeof bits);
        }
    }
    if ((mode & 12) != 12)
        return;
    for (size_t r = 0; r < heads * T; r++) { /* rows made distributions, in float32 */
        size_t t = r % T;
        float *row = array + r * T, sum = 0.0f;
        for (size_t i = 0; i <= t; i++)
            sum += row[i];
        if (sum > 0.0f && isfinite(sum))
            for (size_t i = 0; i <= t; i++)
                row[i] /= sum;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < HEADER)
        return 0;
    if (!path[0]) {
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%.32s/kve-fuzzm-%ld.npy", dir ? dir : "/tmp",
                 (long)getpid());
    }
    size_t L = 1 + data[0] % MAX_L, H = 1 + data[1] % MAX_H, T = 1 + data[2] % MAX_T;
    unsigned mode = data[3];
    unsigned flags = (mode & 1 ? KVE_TRACE_NORMALIZE : 0) | (mode & 2 ? 2u : 0);
    build(data + HEADER, size - HEADER, mode, L * H, T);

    kve_trace *const untouched = (kve_trace *)&size;
    kve_trace *m = untouched;
    kve_status sm = kve_trace_from_memory(array, L, H, T, TRACE_FLAGS(flags), &m);
    snprintf(message, sizeof message, "%s", kve_last_error());
    if (flags & 2) {
        CHECK(sm == KVE_EINVAL && m == untouched);
        return 0;
    }
    const size_t dims[4] = {L, H, T, T};
    CHECK(npy_write_f4(path, dims, 4, array) == 0);
    kve_trace *n = NULL;
    kve_status sn = kve_trace_open(path, TRACE_FLAGS(flags), &n);
    unlink(path);
    CHECK(sm == sn);
    if (sm != KVE_OK) {
        CHECK(sm == KVE_EFORMAT && m == untouched);
        CHECK(message[0] != '\0' && strchr(message, '\n') == NULL);
        const char *tail_m = strstr(message, ": head "), *tail_n = strstr(kve_last_error(), ": head ");
        CHECK(tail_m && tail_n && strcmp(tail_m, tail_n) == 0);
        return 0;
    }
    CHECK(kve_trace_steps(m) == T && kve_trace_heads(m) == L * H && kve_trace_layers(m) == L);
    double tol = flags & KVE_TRACE_NORMALIZE ? 1e-6 : 1e-3 + 1e-6;
    size_t hs[2] = {0, L * H - 1}, ts[3] = {T - 1, 0, T / 2};
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 3; k++) {
            CHECK(kve_trace_row(m, hs[h], ts[k], row_m, (ts[k]) + 1) == KVE_OK);
            CHECK(kve_trace_row(n, hs[h], ts[k], row_n, (ts[k]) + 1) == KVE_OK);
            CHECK(row_is_distribution(row_m, ts[k], tol));
            CHECK(memcmp(row_m, row_n, (ts[k] + 1) * sizeof *row_m) == 0);
        }
    CHECK(kve_trace_row(m, L * H, 0, row_m, 1) == KVE_EINVAL);
    CHECK(kve_trace_row(m, 0, T, row_m, T + 1) == KVE_EINVAL);
    kve_trace_free(m);
    kve_trace_free(n);
    return 0;
}
