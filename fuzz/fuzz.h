/* SPDX-License-Identifier: MIT */
/*
 * fuzz.h - what the fuzz targets share: the check that abort()s on a broken
 * promise (so libFuzzer, ASan and UBSan report through one channel), a
 * reader of the input byte by byte, and a private temporary path to write
 * each input to.
 */
#ifndef KVE_FUZZ_H
#define KVE_FUZZ_H

#include "kvevict.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* abort()s naming the target, the condition, the line and the library's
 * last message when c is false. */
#define FUZZ_CHECK(target, c)                                                             \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "%s: CHECK(%s) failed at line %d (last error: %s)\n", target, \
                    #c, __LINE__, kve_last_error());                                      \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* The input read a byte at a time; 0 past its end. */
typedef struct fuzz_reader {
    const uint8_t *d;
    size_t n, i;
} fuzz_reader;

static inline uint8_t fuzz_take(fuzz_reader *r)
{
    return r->i < r->n ? r->d[r->i++] : 0;
}

/* $TMPDIR (or /tmp)/kve-fuzz-PID<suffix> into path[0 .. cap). */
static inline void fuzz_temp_path(char *path, size_t cap, const char *suffix)
{
    const char *dir = getenv("TMPDIR");
    snprintf(path, cap, "%.32s/kve-fuzz-%ld%s", dir ? dir : "/tmp", (long)getpid(), suffix);
}

/* Grows the two row buffers *a and *b to hold `need` doubles. */
static inline void fuzz_rows(double **a, double **b, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    free(*a);
    free(*b);
    *cap = need;
    *a = malloc(need * sizeof **a);
    *b = malloc(need * sizeof **b);
    FUZZ_CHECK("fuzz", *a && *b);
}

#endif /* KVE_FUZZ_H */
