/* SPDX-License-Identifier: MIT */
/*
 * attn.c - attention rows for engines whose attention kernel never writes
 * the weights (fused / flash attention): the softmax of one query over the
 * kept keys, recomputed from q and K.
 *
 * Shapes (d = head dimension, n = kept keys of the head):
 *   q     float[d]                        one query vector
 *   keys  float[n][ld], row i at keys + i*ld, its first d entries used
 *   out   float[n]                        the weights, kept order
 *
 * Definition (every instruction set computes exactly this, bit for bit):
 *   l_i  = scale * dot(q, k_i), in float32: products added into 16 partial
 *          sums by dimension index mod 16, the partial sums then added
 *          pairwise (8 + 8, 4 + 4, 2 + 2, 1 + 1), then one multiply by scale;
 *   m    = max_i l_i;
 *   e_i  = exp(l_i - m) in float32 by kve's own exponential (below; at most a
 *          few ulp from the true value; 0 below e^-87.3, where float32 stops
 *          being normal);
 *   s    = sum of e_i in double, in 8 partial sums by index mod 8, then
 *          pairwise;
 *   out_i = (float)((double)e_i / s).
 * The max is subtracted, so no logit overflows the exponential and the
 * largest weight's term is exactly 1 (s >= 1). The fixed orders make the
 * plain C below vectorise without changing a bit: the compiler is given one
 * function per instruction set (the same text inlined into three targets)
 * and must not reassociate or fuse (-ffp-contract=off, no -ffast-math).
 *
 * Invariants: nothing is allocated; the row is written in three passes over
 * out (logits, exponentials, normalisation); the keys are read once.
 * Cost: O(n*d) per query: one more pass over the keys than the attention it
 * shadows, plus O(n) for the softmax.
 */
#include "policy_impl.h"

#include <float.h>
#include <string.h>

enum { DOT_LANES = 16, SUM_LANES = 8 };

KVE_ALWAYS_INLINE float dot(const float *q, const float *k, size_t d)
{
    float acc[DOT_LANES] = {0};
    size_t i = 0;
    for (; i + DOT_LANES <= d; i += DOT_LANES)
        for (size_t j = 0; j < DOT_LANES; j++)
            acc[j] += q[i + j] * k[i + j];
    for (size_t j = 0; i < d; i++, j++)
        acc[j] += q[i] * k[i];
    for (size_t w = DOT_LANES / 2; w; w /= 2)
        for (size_t j = 0; j < w; j++)
            acc[j] += acc[j + w];
    return acc[0];
}

/* e^x for x <= 0: x = n ln2 + r, |r| <= ln2 / 2 (Cody and Waite's two-part
 * ln2, whose high part times n is exact), e^r by its Taylor series to r^7
 * (truncation below 6e-9 relative), times 2^n built from its exponent bits.
 * n is rounded to nearest by adding and subtracting 1.5 * 2^23. */
KVE_ALWAYS_INLINE float exp_nonpositive(float x)
{
    const float big = 0x1.8p23f;
    float t = x * 1.44269504088896341f;
    float n = (t + big) - big;
    float r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-6f;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = x < -87.3f ? 0 : (int32_t)n + 127; /* 2^n is normal down to n = -126 */
    uint32_t bits = (uint32_t)e << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.3f ? 0.0f : p * scale;
}

/* The three passes; returns KVE_NONE, or the first key whose logit is not
 * finite (out then holds unspecified values). */
KVE_ALWAYS_INLINE size_t softmax_row(const float *q, const float *keys, size_t n, size_t d,
                                     size_t ld, float scale, float *out)
{
    float m = -FLT_MAX;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float l = scale * dot(q, keys + i * ld, d);
        out[i] = l;
        bad |= !(l - l == 0.0f); /* NaN or infinite */
        m = l > m ? l : m;
    }
    if (bad) {
        size_t i = 0;
        while (out[i] - out[i] == 0.0f)
            i++;
        return i;
    }
    double acc[SUM_LANES] = {0};
    size_t i = 0;
    for (; i + SUM_LANES <= n; i += SUM_LANES)
        for (size_t j = 0; j < SUM_LANES; j++) {
            float e = exp_nonpositive(out[i + j] - m);
            out[i + j] = e;
            acc[j] += (double)e;
        }
    for (size_t j = 0; i < n; i++, j++) {
        float e = exp_nonpositive(out[i] - m);
        out[i] = e;
        acc[j] += (double)e;
    }
    for (size_t w = SUM_LANES / 2; w; w /= 2)
        for (size_t j = 0; j < w; j++)
            acc[j] += acc[j + w];
    const double s = acc[0];
    for (size_t k = 0; k < n; k++)
        out[k] = (float)((double)out[k] / s);
    return KVE_NONE;
}

KVE_PER_ISA(softmax_in, size_t,
            (const float *q, const float *keys, size_t n, size_t d, size_t ld, float scale,
             float *out),
            softmax_row(q, keys, n, d, ld, scale, out), softmax_row(q, keys, n, d, ld, scale, out),
            softmax_row(q, keys, n, d, ld, scale, out))

static size_t softmax(const float *q, const float *keys, size_t n, size_t d, size_t ld,
                      float scale, float *out)
{
    return softmax_in_isa[kve__isa()](q, keys, n, d, ld, scale, out);
}

/* The checks both entry points share. */
static kve_status check_shape(size_t d, size_t ld, float scale)
{
    if (d == 0)
        return kve__fail(KVE_EINVAL, "attn: d must be at least 1");
    if (ld < d)
        return kve__fail(KVE_EINVAL, "attn: key stride %zu is smaller than d %zu", ld, d);
    if (!(scale - scale == 0.0f))
        return kve__fail(KVE_EINVAL, "attn: scale %g is not finite", (double)scale);
    return KVE_OK;
}

kve_status kve_attn_row(const float *q, size_t d, const float *keys, size_t ld, size_t n,
                        float scale, float *out)
{
    kve_status st = check_shape(d, ld, scale);
    if (st != KVE_OK)
        return st;
    if (n == 0)
        return KVE_OK;
    if (!q || !keys || !out)
        return kve__fail(KVE_EINVAL, "attn: %s is NULL", !q ? "q" : !keys ? "keys" : "out");
    size_t bad = softmax(q, keys, n, d, ld, scale, out);
    if (bad != KVE_NONE)
        return kve__fail(KVE_EINVAL, "attn: the logit of key %zu is not finite", bad);
    return KVE_OK;
}

kve_status kve_bank_attn_rows(const kve_bank *b, size_t first, size_t count, const float *q,
                              size_t d, size_t group, const float *keys, size_t ld_key,
                              size_t ld_head, float scale, float *out, size_t ld_out)
{
    if (!b)
        return kve__fail(KVE_EINVAL, "bank is NULL");
    if (first > b->n_heads || count > b->n_heads - first)
        return kve__fail(KVE_EINVAL, "attn: heads %zu + %zu are out of range: the bank has %zu",
                         first, count, b->n_heads);
    if (group == 0)
        return kve__fail(KVE_EINVAL, "attn: group must be at least 1");
    kve_status st = check_shape(d, ld_key, scale);
    if (st != KVE_OK)
        return st;
    for (size_t j = 0; j < count; j++) {
        size_t n = b->heads[first + j].size;
        if (ld_out < n)
            return kve__fail(KVE_EINVAL, "attn: head %zu: ld_out %zu is smaller than its %zu kept "
                             "positions", first + j, ld_out, n);
        if (n && (!q || !keys || !out))
            return kve__fail(KVE_EINVAL, "attn: %s is NULL", !q ? "q" : !keys ? "keys" : "out");
    }
    for (size_t j = 0; j < count; j++) {
        size_t n = b->heads[first + j].size;
        for (size_t g = 0; g < group && n; g++) {
            size_t r = j * group + g;
            size_t bad = softmax(q + r * d, keys + j * ld_head, n, d, ld_key, scale,
                                 out + r * ld_out);
            if (bad != KVE_NONE)
                return kve__fail(KVE_EINVAL,
                                 "attn: head %zu, query row %zu: the logit of key %zu is not finite",
                                 first + j, r, bad);
        }
    }
    return KVE_OK;
}
