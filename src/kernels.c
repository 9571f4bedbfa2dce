/* SPDX-License-Identifier: MIT */
/*
 * kernels.c - the whole-row kernels every policy shares, dispatched on the
 * instruction set: validating an attention input, the argmin of a score
 * column (closing its hole on the way), and validating a key and taking its
 * norm.
 *
 * Invariants: each instruction set's version returns exactly what the scalar
 * one does (simd.h); validation only reads, and once a pass has said that a
 * row holds a bad weight, the scalar loop finds the first one, so the message
 * is the same on every path.
 * Cost: validation reads group * n weights once (twice for a row holding a
 * -0.0 or a bad weight; plus one reduction pass for reduce = sum); the argmin reads the n scores once and writes those past
 * the hole.
 */
#include "simd.h"

#include <float.h>
#include <string.h>

/* ---- validation ---- */

/* Branch-free integer maxima, so the compiler vectorises it for the target it
 * is inlined into (two max instructions per vector). A float is finite and
 * >= 0 exactly when its bits u satisfy u <= 0x7f7fffff (the largest finite)
 * or u == 0x80000000 (-0.0): the signed maximum of the bits catches +inf and
 * +NaN (above 0x7f7fffff), the unsigned maximum catches every other value with
 * the sign bit set (above 0x80000000). */
KVE_ALWAYS_INLINE bool row_bad(const float *a, size_t n)
{
    int32_t smax = 0;
    uint32_t umax = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &a[i], sizeof u);
        int32_t s = (int32_t)u;
        smax = s > smax ? s : smax;
        umax = u > umax ? u : umax;
    }
    return smax > 0x7f7fffff || umax > 0x80000000u;
}

/* The screen every row passes first, at one maximum per vector where
 * row_bad needs two: every valid weight but -0.0 has bits <= 0x7f7fffff, so a
 * row whose largest bits are no larger is valid. A row that fails the screen
 * (a bad weight, or a valid -0.0) takes row_bad. SCREEN_LANES partial
 * maxima, so that the vectorised loop carries several independent ones. */
enum { SCREEN_LANES = 64 };

KVE_ALWAYS_INLINE bool row_suspect(const float *a, size_t n)
{
    uint32_t part[SCREEN_LANES] = {0};
    size_t i = 0;
    for (; i + SCREEN_LANES <= n; i += SCREEN_LANES)
        for (size_t j = 0; j < SCREEN_LANES; j++) {
            uint32_t u;
            memcpy(&u, &a[i + j], sizeof u);
            part[j] = u > part[j] ? u : part[j];
        }
    uint32_t umax = 0;
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, &a[i], sizeof u);
        umax = u > umax ? u : umax;
    }
    for (size_t j = 0; j < SCREEN_LANES; j++)
        umax = part[j] > umax ? part[j] : umax;
    return umax > 0x7f7fffffu;
}

KVE_PER_ISA(row_bad, bool, (const float *a, size_t n), row_suspect(a, n) && row_bad(a, n),
            row_suspect(a, n) && row_bad(a, n), row_suspect(a, n) && row_bad(a, n))
KVE_PER_ISA(sum_overflow, size_t, (const kve_rows *in, size_t n), kv1_sum_overflow(in, n),
            kv4_sum_overflow(in, n), kv8_sum_overflow(in, n))

bool kve__rows_invalid(const kve_rows *in, size_t n, size_t *q, size_t *i)
{
    kve_isa isa = kve__isa();
    for (size_t r = 0; r < in->group; r++) {
        const float *a = in->row + r * in->ld;
        if (row_bad_isa[isa](a, n)) {
            size_t k = 0;
            while (a[k] >= 0.0f && a[k] <= FLT_MAX)
                k++;
            *q = r;
            *i = k;
            return true;
        }
    }
    if (in->group == 1 || in->reduce != KVE_REDUCE_SUM)
        return false; /* a mean or max of finite weights >= 0 is one too */
    size_t k = sum_overflow_isa[isa](in, n);
    if (k == n)
        return false;
    *q = in->group;
    *i = k;
    return true;
}

/* ---- keys ---- */

/* Branch-free: an entry is NaN or infinite exactly when its bits without
 * the sign exceed 0x7f7fffff (the largest finite). */
KVE_ALWAYS_INLINE bool key_bad(const float *k, size_t d)
{
    uint32_t umax = 0;
    for (size_t i = 0; i < d; i++) {
        uint32_t u;
        memcpy(&u, &k[i], sizeof u);
        u &= 0x7fffffffu;
        umax = u > umax ? u : umax;
    }
    return umax > 0x7f7fffffu;
}

KVE_ALWAYS_INLINE double key_norm(const float *k, size_t d)
{
    double acc[KVE_KEY_LANES] = {0};
    size_t i = 0;
    for (; i + KVE_KEY_LANES <= d; i += KVE_KEY_LANES)
        for (size_t j = 0; j < KVE_KEY_LANES; j++)
            acc[j] += (double)k[i + j] * (double)k[i + j];
    for (size_t j = 0; i < d; i++, j++)
        acc[j] += (double)k[i] * (double)k[i];
    for (size_t w = KVE_KEY_LANES / 2; w; w /= 2)
        for (size_t j = 0; j < w; j++)
            acc[j] += acc[j + w];
    return sqrt(acc[0]);
}

KVE_PER_ISA(key_bad, bool, (const float *k, size_t d), key_bad(k, d), key_bad(k, d),
            key_bad(k, d))
KVE_PER_ISA(key_norm, double, (const float *k, size_t d), key_norm(k, d), key_norm(k, d),
            key_norm(k, d))

size_t kve__key_invalid(const float *k, size_t d)
{
    if (!key_bad_isa[kve__isa()](k, d))
        return d;
    size_t i = 0;
    while (k[i] - k[i] == 0.0f)
        i++;
    return i;
}

double kve__key_norm(const float *k, size_t d)
{
    return key_norm_isa[kve__isa()](k, d);
}

/* ---- argmin ---- */

KVE_PER_ISA(shift_argmin, size_t, (double *score, size_t n, size_t gap, size_t limit),
            kv1_shift_argmin(score, n, gap, limit), kv4_shift_argmin(score, n, gap, limit),
            kv8_shift_argmin(score, n, gap, limit))

size_t kve__shift_argmin(double *score, size_t n, size_t gap, size_t limit)
{
    return shift_argmin_isa[kve__isa()](score, n, gap, limit);
}
