/* SPDX-License-Identifier: MIT */
/*
 * fuzz_rows.h - what the trace fuzz targets (fuzz_npy, fuzz_memory) hold
 * every row they read to: the row's weights over keys 0..t finite and >= 0,
 * and, for t >= 1, summing to 1 within tol (row 0 is not held to a sum).
 */
#ifndef KVE_FUZZ_ROWS_H
#define KVE_FUZZ_ROWS_H

#include <math.h>
#include <stddef.h>

static inline int row_is_distribution(const double *row, size_t t, double tol)
{
    double sum = 0;
    for (size_t i = 0; i <= t; i++) {
        if (!isfinite(row[i]) || row[i] < 0)
            return 0;
        sum += row[i];
    }
    return t == 0 || fabs(sum - 1.0) <= tol;
}

#endif /* KVE_FUZZ_ROWS_H */
