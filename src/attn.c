/* SPDX-License-Identifier: MIT */
/*
 * attn.c - attention rows for engines whose attention kernel never writes
 * the weights (fused / flash attention): the softmax of one query over the
 * kept keys, recomputed from q and K.
 *
 * Shapes (d = head dimension, n = kept keys of the head):
 *   q     float[d]                        one query vector
 *   keys  float[n][ld], row i at keys + i*ld, its first d entries used
 *   tiles float[ceil(n/16)][d][16]        the same keys in tiles (kvevict.h):
 *                                         kve_attn_rows' layout; uint16_t
 *                                         half floats, kve_attn_rows_f16's
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
 * AVX-512 has its own passes one and two (softmax_row16: sixteen keys' dot
 * products reduced together, sixteen exponentials at once), the same
 * operations in the same order; tests/test_attn.c holds every path to the
 * portable one's bits. Over tiles (kve_attn_rows, a query group at once)
 * AVX-512 holds sixteen keys in the lanes of a register, so each partial
 * sum is a register of sixteen keys' and the pairwise steps are plain
 * additions (tile_partial, tile_logits); the portable path does the same
 * in plain C over a tile's sixteen keys (tile_logits_plain), which the
 * compiler vectorises for AVX2. Half-float tiles (kve_attn_rows_f16) take
 * the same kernels, each entry widened exactly as it is loaded (tile_row,
 * tile_at): the element size is a constant in each of their two tables.
 *
 * Invariants: nothing is allocated; the row is written in three passes over
 * out (logits, exponentials, normalisation); the keys are read once a row
 * (over tiles on AVX-512, once for up to eight rows).
 * Cost: O(n*d) per query: one more pass over the keys than the attention it
 * shadows, plus O(n) for the softmax.
 */
#include "policy_impl.h"

#include <float.h>
#include <string.h>

_Static_assert(KVE_ATTN_TILE == 16, "the tile kernels hold one tile in sixteen lanes");

enum { DOT_LANES = 16, SUM_LANES = 8 };

/* A half float (IEEE binary16) widened to float32: exact (a NaN stays a
 * NaN; a signalling one is not made quiet, as vcvtph2ps makes it: a NaN
 * key is refused either way). */
KVE_ALWAYS_INLINE float widen_half(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float f;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
        f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    const uint32_t bits = sign | (e == 0x1f ? 0x7f800000u : (e + 112u) << 23) | (m << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Entry `at` of tiles of float32 (esize 4) or half floats (esize 2), as
 * float32. */
KVE_ALWAYS_INLINE float tile_at(const void *t, size_t at, size_t esize)
{
    return esize == 2 ? widen_half(((const uint16_t *)t)[at]) : ((const float *)t)[at];
}

/* The tile of keys i .. i + 15 (i a multiple of KVE_ATTN_TILE). */
KVE_ALWAYS_INLINE const void *tile_of(const void *tiles, size_t i, size_t d, size_t esize)
{
    return (const char *)tiles + i * d * esize;
}

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

/* Passes two and three (exponentials and their sum, normalisation) over
 * the logits out[0 .. n) whose largest is m; the exponentials of out[0 ..
 * from) are already in place, their sums in acc (lane j: the indices j mod
 * SUM_LANES; from is a multiple of SUM_LANES). */
KVE_ALWAYS_INLINE void softmax_tail(size_t n, float m, float *out, size_t from, double *acc)
{
    size_t i = from;
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
}

/* The first key from `from` whose logit in out is not finite. */
static size_t first_bad(const float *out, size_t from)
{
    size_t i = from;
    while (out[i] - out[i] == 0.0f)
        i++;
    return i;
}

/* Pass one for keys from..n: logits into out; the largest of them and of *m
 * into *m; whether one is not finite. */
KVE_ALWAYS_INLINE int logits_row(const float *q, const float *keys, size_t from, size_t n,
                                 size_t d, size_t ld, float scale, float *out, float *m)
{
    float mx = *m;
    int bad = 0;
    for (size_t i = from; i < n; i++) {
        float l = scale * dot(q, keys + i * ld, d);
        out[i] = l;
        bad |= !(l - l == 0.0f); /* NaN or infinite */
        mx = l > mx ? l : mx;
    }
    *m = mx;
    return bad;
}

/* The three passes; returns KVE_NONE, or the first key whose logit is not
 * finite (out then holds unspecified values). */
KVE_ALWAYS_INLINE size_t softmax_row(const float *q, const float *keys, size_t n, size_t d,
                                     size_t ld, float scale, float *out)
{
    float m = -FLT_MAX;
    if (logits_row(q, keys, 0, n, d, ld, scale, out, &m))
        return first_bad(out, 0);
    double acc[SUM_LANES] = {0};
    softmax_tail(n, m, out, 0, acc);
    return KVE_NONE;
}

#if KVE_X86
/* AVX-512's pass one, sixteen keys at a time when d is a multiple of 16:
 * each key's sixteen partial sums in one register, exactly dot()'s (a zero
 * start, products added chunk by chunk), then the sixteen registers reduced
 * together, each step dot()'s for every key at once: the upper eight lanes
 * onto the lower eight (w = 8), then 4, 2 and 1, by shuffles that pair two
 * keys' halves in one register. Addition commutes bit for bit, so the
 * result is dot()'s; the largest logit is order-free (a signed zero's sign
 * cannot reach an exponential: x - 0 and x + 0 differ only at x = 0, where
 * both give 1). Keys past the last sixteen take logits_row. */
/* The 256-bit halves of a, then b, each the sum of its two halves' lanes
 * 0..7 and 8..15 (the w = 8 step for the keys of a and b). */
KVE_ALWAYS_INLINE KVE_TARGET_AVX512 __m512 fold_halves(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}

/* Blocks 0, 1 of a's halves summed, then b's (the w = 4 step for the four
 * keys a and b hold). */
KVE_ALWAYS_INLINE KVE_TARGET_AVX512 __m512 fold_quarters(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

KVE_ALWAYS_INLINE KVE_TARGET_AVX512 __m512 dots16(const float *q, const float *k, size_t d,
                                                   size_t ld)
{
    __m512 a[16];
    for (size_t i = 0; i < 16; i++)
        a[i] = _mm512_setzero_ps();
    for (size_t c = 0; c < d; c += 16) {
        const __m512 qc = _mm512_loadu_ps(q + c);
        for (size_t i = 0; i < 16; i++)
            a[i] = _mm512_add_ps(a[i], _mm512_mul_ps(qc, _mm512_loadu_ps(k + i * ld + c)));
    }
    __m512 b[8], c4[4], e2[2];
    for (size_t i = 0; i < 8; i++) /* w = 8: keys 2i, 2i+1 in the halves */
        b[i] = fold_halves(a[2 * i], a[2 * i + 1]);
    for (size_t i = 0; i < 4; i++) /* w = 4: keys 4i .. 4i+3 in the 128-bit blocks */
        c4[i] = fold_quarters(b[2 * i], b[2 * i + 1]);
    for (size_t i = 0; i < 2; i++) /* w = 2: block j has keys 8i+j, 8i+4+j, two lanes each */
        e2[i] = _mm512_add_ps(_mm512_shuffle_ps(c4[2 * i], c4[2 * i + 1], 0x44),
                              _mm512_shuffle_ps(c4[2 * i], c4[2 * i + 1], 0xEE));
    /* w = 1: lane 4j + s holds key 4s + j */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(e2[0], e2[1], 0x88),
                                   _mm512_shuffle_ps(e2[0], e2[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, r);
}

/* Passes two and three of a row whose logits out[0 .. n) have the largest
 * m: exp_nonpositive sixteen at a time, operation for operation (the sums'
 * lanes are SUM_LANES, so the lower eight go in first), then softmax_tail. */
KVE_ALWAYS_INLINE KVE_TARGET_AVX512 void exp_tail16(size_t n, float m, float *out)
{
    const __m512 big = _mm512_set1_ps(0x1.8p23f), lowest = _mm512_set1_ps(-87.3f);
    const __m512 mv = _mm512_set1_ps(m);
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(out + i), mv);
        const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
        const __m512 k = _mm512_sub_ps(_mm512_add_ps(t, big), big);
        const __m512 r =
            _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(k, _mm512_set1_ps(0.693145751953125f))),
                          _mm512_mul_ps(k, _mm512_set1_ps(1.428606765330187045e-6f)));
        __m512 p = _mm512_set1_ps(1.0f / 5040);
        static const float horner[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f,
                                       1.0f};
        for (size_t c = 0; c < sizeof horner / sizeof horner[0]; c++)
            p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(horner[c]));
        const __mmask16 normal = _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);
        const __m512i bits = _mm512_slli_epi32(
            _mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23);
        const __m512 e = _mm512_maskz_mul_ps(normal, p, _mm512_castsi512_ps(bits));
        _mm512_storeu_ps(out + i, e);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    double sums[SUM_LANES];
    _mm512_storeu_pd(sums, acc);
    softmax_tail(n, m, out, i, sums);
}

KVE_ALWAYS_INLINE KVE_TARGET_AVX512 size_t softmax_row16(const float *q, const float *keys,
                                                          size_t n, size_t d, size_t ld,
                                                          float scale, float *out)
{
    if (d % 16 != 0)
        return softmax_row(q, keys, n, d, ld, scale, out);
    const __m512 sc = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
    __m512 mx = _mm512_set1_ps(-FLT_MAX);
    __mmask16 finite = 0xFFFF;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 l = _mm512_mul_ps(sc, dots16(q, keys + i * ld, d, ld));
        _mm512_storeu_ps(out + i, l);
        finite &= _mm512_cmp_ps_mask(_mm512_sub_ps(l, l), zero, _CMP_EQ_OQ);
        mx = _mm512_max_ps(mx, l);
    }
    float m = _mm512_reduce_max_ps(mx);
    if (finite != 0xFFFF || logits_row(q, keys, i, n, d, ld, scale, out, &m))
        return first_bad(out, 0);
    exp_tail16(n, m, out);
    return KVE_NONE;
}
#define SOFTMAX_KV8 softmax_row16

/* Tile row c (entry c of the tile's sixteen keys) as sixteen float32s. */
KVE_ALWAYS_INLINE KVE_TARGET_AVX512 __m512 tile_row(const void *t, size_t c, size_t esize)
{
    if (esize == 2) /* vcvtph2ps: exact, as widen_half */
        return _mm512_cvtph_ps(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)t + c * KVE_ATTN_TILE)));
    return _mm512_loadu_ps((const float *)t + c * KVE_ATTN_TILE);
}

/* AVX-512's pass one over tiles, for R query rows at once (R <= 8, a
 * constant where inlined): lane i of a register is the tile's key i, so the
 * definition's partial sums are vertical and need no shuffle. p[r] gets
 * partial sum j of the tile's keys for query r: its products chunk by chunk
 * (entries j, 16 + j, ... below d), each tile row loaded once for the R
 * queries. The first product is not added to a zero: that changes only the
 * sign of a zero partial sum, which cannot reach an exponential (see
 * dots16). A j with no entry (d < 16) gives zero, as in dot(). */
KVE_ALWAYS_INLINE KVE_TARGET_AVX512 void tile_partial(const float *q, size_t ldq, size_t R,
                                                       const void *t, size_t esize, size_t d,
                                                       size_t j, __m512 *p)
{
    for (size_t r = 0; r < R; r++)
        p[r] = _mm512_setzero_ps();
    for (size_t c = j; c < d; c += DOT_LANES) {
        const __m512 k = tile_row(t, c, esize);
        for (size_t r = 0; r < R; r++) {
            const __m512 x = _mm512_mul_ps(_mm512_set1_ps(q[r * ldq + c]), k);
            p[r] = c == j ? x : _mm512_add_ps(p[r], x);
        }
    }
}

/* The sixteen logits of one tile for R queries: the partial sums combined
 * as dot() combines them (w = 8: A_j = P_j + P_j+8; w = 4: B_j = A_j +
 * A_j+4; w = 2: C_j = B_j + B_j+2; then C_0 + C_1), times the scale. */
KVE_ALWAYS_INLINE KVE_TARGET_AVX512 void tile_logits(const float *q, size_t ldq, size_t R,
                                                      const void *t, size_t esize, size_t d,
                                                      __m512 sc, __m512 *l)
{
    __m512 c2[2][8];
    for (size_t half = 0; half < 2; half++) {
        __m512 b2[2][8];
        for (size_t t2 = 0; t2 < 2; t2++) {
            __m512 a2[2][8];
            for (size_t s4 = 0; s4 < 2; s4++) {
                const size_t j = half + 2 * t2 + 4 * s4;
                __m512 lo[8], hi[8];
                tile_partial(q, ldq, R, t, esize, d, j, lo);
                tile_partial(q, ldq, R, t, esize, d, j + 8, hi);
                for (size_t r = 0; r < R; r++)
                    a2[s4][r] = _mm512_add_ps(lo[r], hi[r]);
            }
            for (size_t r = 0; r < R; r++)
                b2[t2][r] = _mm512_add_ps(a2[0][r], a2[1][r]);
        }
        for (size_t r = 0; r < R; r++)
            c2[half][r] = _mm512_add_ps(b2[0][r], b2[1][r]);
    }
    for (size_t r = 0; r < R; r++)
        l[r] = _mm512_mul_ps(sc, _mm512_add_ps(c2[0][r], c2[1][r]));
}

/* R rows over tiled keys: pass one tile by tile (lanes past n neither
 * stored nor compared), then each row's passes two and three. Returns
 * KVE_NONE, or the first key of the first row (*bad_row) whose logit is not
 * finite. */
KVE_ALWAYS_INLINE KVE_TARGET_AVX512 size_t tile_rows16(const float *q, size_t ldq, size_t R,
                                                        const void *tiles, size_t esize, size_t n,
                                                        size_t d, float scale, float *out,
                                                        size_t ld_out, size_t *bad_row)
{
    const __m512 sc = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
    __m512 mx[8];
    __mmask16 finite[8];
    for (size_t r = 0; r < R; r++) {
        mx[r] = _mm512_set1_ps(-FLT_MAX);
        finite[r] = 0xFFFF;
    }
    for (size_t i = 0; i < n; i += KVE_ATTN_TILE) {
        const __mmask16 live = (__mmask16)(n - i >= 16 ? 0xFFFFu : (1u << (n - i)) - 1);
        __m512 l[8];
        /* two tiles ahead, toward L2 (at d = 64 a float32 tile is a 4 KB
         * page, where hardware prefetchers stop; a half-float one half of one) */
        if (i + (size_t)2 * KVE_ATTN_TILE < n) {
            const char *ahead = tile_of(tiles, i + (size_t)2 * KVE_ATTN_TILE, d, esize);
            for (size_t b = 0; b < d * KVE_ATTN_TILE * esize; b += 64)
                _mm_prefetch(ahead + b, _MM_HINT_T1);
        }
        tile_logits(q, ldq, R, tile_of(tiles, i, d, esize), esize, d, sc, l);
        for (size_t r = 0; r < R; r++) {
            _mm512_mask_storeu_ps(out + r * ld_out + i, live, l[r]);
            finite[r] &= (__mmask16)(_mm512_mask_cmp_ps_mask(live, _mm512_sub_ps(l[r], l[r]), zero,
                                                             _CMP_EQ_OQ) |
                                     (__mmask16)~live);
            mx[r] = _mm512_mask_max_ps(mx[r], live, mx[r], l[r]);
        }
    }
    for (size_t r = 0; r < R; r++)
        if (finite[r] != 0xFFFF) {
            *bad_row = r;
            return first_bad(out + r * ld_out, 0);
        }
    for (size_t r = 0; r < R; r++)
        exp_tail16(n, _mm512_reduce_max_ps(mx[r]), out + r * ld_out);
    return KVE_NONE;
}

/* Rows r .. r + R of rows16 (R a constant); the bad key's row is counted
 * from the first row. */
KVE_ALWAYS_INLINE KVE_TARGET_AVX512 size_t rows16_at(size_t r, size_t R, const float *q,
                                                      size_t ldq, const void *tiles, size_t esize,
                                                      size_t n, size_t d, float scale, float *out,
                                                      size_t ld_out, size_t *bad_row)
{
    size_t bad = tile_rows16(q + r * ldq, ldq, R, tiles, esize, n, d, scale, out + r * ld_out,
                             ld_out, bad_row);
    if (bad != KVE_NONE)
        *bad_row += r;
    return bad;
}

/* Every row, eight at a time, then four, two and one (esize a constant). */
KVE_ALWAYS_INLINE KVE_TARGET_AVX512 size_t rows16(const float *q, size_t ldq, size_t rows,
                                                      const void *tiles, size_t esize, size_t n,
                                                      size_t d, float scale, float *out,
                                                      size_t ld_out, size_t *bad_row)
{
    size_t r = 0, bad = KVE_NONE;
    for (; bad == KVE_NONE && r + 8 <= rows; r += 8)
        bad = rows16_at(r, 8, q, ldq, tiles, esize, n, d, scale, out, ld_out, bad_row);
    if (bad == KVE_NONE && rows - r >= 4) {
        bad = rows16_at(r, 4, q, ldq, tiles, esize, n, d, scale, out, ld_out, bad_row);
        r += 4;
    }
    if (bad == KVE_NONE && rows - r >= 2) {
        bad = rows16_at(r, 2, q, ldq, tiles, esize, n, d, scale, out, ld_out, bad_row);
        r += 2;
    }
    if (bad == KVE_NONE && rows - r >= 1)
        bad = rows16_at(r, 1, q, ldq, tiles, esize, n, d, scale, out, ld_out, bad_row);
    return bad;
}
#define ROWS_KV8 rows16
#else
#define SOFTMAX_KV8 softmax_row
#define ROWS_KV8 rows_plain
#endif

/* The logits of one tile's keys for one query, lane-wise in plain C (so
 * the compiler vectorises over the tile's keys): p[j][lane] is dot()'s
 * partial sum j of key `lane`, its products added chunk by chunk from zero,
 * then the same pairwise steps, then the scale. */
KVE_ALWAYS_INLINE void tile_logits_plain(const float *q, const void *t, size_t esize, size_t d,
                                         float scale, float *l)
{
    float p[DOT_LANES][KVE_ATTN_TILE] = {{0}};
    for (size_t c = 0; c < d; c++)
        for (size_t k = 0; k < KVE_ATTN_TILE; k++)
            p[c % DOT_LANES][k] += q[c] * tile_at(t, c * KVE_ATTN_TILE + k, esize);
    for (size_t w = DOT_LANES / 2; w; w /= 2)
        for (size_t j = 0; j < w; j++)
            for (size_t k = 0; k < KVE_ATTN_TILE; k++)
                p[j][k] += p[j + w][k];
    for (size_t k = 0; k < KVE_ATTN_TILE; k++)
        l[k] = scale * p[0][k];
}

/* The portable rows over tiles: each row's logits tile by tile, then its
 * passes two and three (softmax_tail). */
KVE_ALWAYS_INLINE size_t rows_plain(const float *q, size_t ldq, size_t rows, const void *tiles,
                                    size_t esize, size_t n, size_t d, float scale, float *out,
                                    size_t ld_out, size_t *bad_row)
{
    for (size_t r = 0; r < rows; r++) {
        float *o = out + r * ld_out, m = -FLT_MAX, l[KVE_ATTN_TILE];
        int bad = 0;
        for (size_t i = 0; i < n; i += KVE_ATTN_TILE) {
            tile_logits_plain(q + r * ldq, tile_of(tiles, i, d, esize), esize, d, scale, l);
            for (size_t k = 0; k < KVE_ATTN_TILE && i + k < n; k++) {
                o[i + k] = l[k];
                bad |= !(l[k] - l[k] == 0.0f); /* NaN or infinite */
                m = l[k] > m ? l[k] : m;
            }
        }
        if (bad) {
            *bad_row = r;
            return first_bad(o, 0);
        }
        double acc[SUM_LANES] = {0};
        softmax_tail(n, m, o, 0, acc);
    }
    return KVE_NONE;
}

/* The rows over tiles per instruction set, one table per element size (a
 * constant in each: float32, then half floats). */
#define ROWS_PARAMS                                                                                \
    (const float *q, size_t ldq, size_t rows, const void *tiles, size_t n, size_t d, float scale, \
     float *out, size_t ld_out, size_t *bad_row)
KVE_PER_ISA(rows_f32, size_t, ROWS_PARAMS,
            rows_plain(q, ldq, rows, tiles, 4, n, d, scale, out, ld_out, bad_row),
            rows_plain(q, ldq, rows, tiles, 4, n, d, scale, out, ld_out, bad_row),
            ROWS_KV8(q, ldq, rows, tiles, 4, n, d, scale, out, ld_out, bad_row))
KVE_PER_ISA(rows_f16, size_t, ROWS_PARAMS,
            rows_plain(q, ldq, rows, tiles, 2, n, d, scale, out, ld_out, bad_row),
            rows_plain(q, ldq, rows, tiles, 2, n, d, scale, out, ld_out, bad_row),
            ROWS_KV8(q, ldq, rows, tiles, 2, n, d, scale, out, ld_out, bad_row))

KVE_PER_ISA(softmax_in, size_t,
            (const float *q, const float *keys, size_t n, size_t d, size_t ld, float scale,
             float *out),
            softmax_row(q, keys, n, d, ld, scale, out), softmax_row(q, keys, n, d, ld, scale, out),
            SOFTMAX_KV8(q, keys, n, d, ld, scale, out))

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

/* kve_attn_rows and kve_attn_rows_f16 over tiles of esize bytes an entry. */
static kve_status attn_rows(const float *q, size_t ldq, size_t rows, size_t d, const void *tiles,
                            size_t esize, size_t n, float scale, float *out, size_t ld_out)
{
    kve_status st = check_shape(d, d, scale);
    if (st != KVE_OK)
        return st;
    if (rows > 1 && ldq < d)
        return kve__fail(KVE_EINVAL, "attn: query stride %zu is smaller than d %zu", ldq, d);
    if (rows > 1 && ld_out < n)
        return kve__fail(KVE_EINVAL, "attn: ld_out %zu is smaller than the %zu keys", ld_out, n);
    if (n == 0 || rows == 0)
        return KVE_OK;
    if (!q || !tiles || !out)
        return kve__fail(KVE_EINVAL, "attn: %s is NULL", !q ? "q" : !tiles ? "tiles" : "out");
    size_t row = 0;
    const kve_isa isa = kve__isa();
    size_t bad = (esize == 2 ? rows_f16_isa[isa] : rows_f32_isa[isa])(q, ldq, rows, tiles, n, d,
                                                                     scale, out, ld_out, &row);
    if (bad != KVE_NONE)
        return kve__fail(KVE_EINVAL, "attn: query row %zu: the logit of key %zu is not finite",
                         row, bad);
    return KVE_OK;
}

kve_status kve_attn_rows(const float *q, size_t ldq, size_t rows, size_t d, const float *tiles,
                         size_t n, float scale, float *out, size_t ld_out)
{
    return attn_rows(q, ldq, rows, d, tiles, sizeof *tiles, n, scale, out, ld_out);
}

kve_status kve_attn_rows_f16(const float *q, size_t ldq, size_t rows, size_t d,
                             const uint16_t *tiles, size_t n, float scale, float *out,
                             size_t ld_out)
{
    return attn_rows(q, ldq, rows, d, tiles, sizeof *tiles, n, scale, out, ld_out);
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
