/* SPDX-License-Identifier: MIT */
/*
 * gguf_write.c - GGUF and llama2.c writers and their quantizers
 * (gguf_write.h says what each quantizer chooses).
 *
 * Invariants: a GGUF file is laid out before a byte of data is written
 * (metadata into a buffer, every tensor's offset from its shape and type,
 * aligned to 32), then each tensor is asked of the source, converted row by
 * row and written, so memory holds one tensor at a time. Multi-byte fields
 * are written little endian byte by byte. Nothing here includes lm/: these
 * encoders are the independent half of the round trips the tests run.
 */
#define _POSIX_C_SOURCE 200809L
#include "gguf_write.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { ALIGN = 32 };

static int fail(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && cap)
        vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- numbers ---- */

uint16_t gw_f32_to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* infinity, NaN */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
    if (a >= 0x477ff000u) /* 65520 and above round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: a multiple of 2^-24, nearest (ties to even) */
        float v;
        memcpy(&v, &a, 4);
        return (uint16_t)(sign | (uint16_t)nearbyintf(v * 0x1p24f));
    }
    uint32_t h = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3ffu), rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right rounding */
    return (uint16_t)(sign | h);
}

/* float16 bits to float32 (finite values: what the writer reads back of
 * its own rounded scales). */
static float f16_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e ? ldexpf((float)(1024 + m), e - 25) : ldexpf((float)m, -24);
    return (h & 0x8000u) ? -v : v;
}

static uint16_t f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t rest = u & 0xffffu, h = u >> 16;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(h | 0x40u); /* NaN stays NaN */
    if (rest > 0x8000u || (rest == 0x8000u && (h & 1u)))
        h++;
    return (uint16_t)h;
}

static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

/* ---- blocks ----
 *
 * The shared steps of the encoders. A block's parameters are first chosen
 * as ggml's quantizer chooses them (the searches below, written in the
 * manner of ggml-quants.c's make_qkx2_quants, make_qx_quants,
 * make_q3_quants and quantize_row_iq4_nl_impl); then, under the stored
 * float16 scales, each sub-block's integer scale (and offset) moves to a
 * neighbour while that lowers the sub-block's squared error, and every
 * value takes the nearest level of its final parameters. The first choice
 * is where the descent starts, so no sub-block ends with more squared error
 * than that choice gives. */

/* v rounded to the nearest integer (ties to even), kept within [lo, hi]
 * (NaN: lo); clamped before the conversion, so any float is defined. */
static int nearest_in(float v, int lo, int hi)
{
    if (!(v > (float)lo))
        return lo;
    if (v >= (float)hi)
        return hi;
    return (int)lrintf(v);
}

/* v as float16 at p; returns the value a reader gets back, NaN when v does
 * not fit a float16 (the row is refused). */
static float put_scale(unsigned char *p, float v)
{
    uint16_t h = gw_f32_to_f16(v);
    put16(p, h);
    return (h & 0x7c00u) == 0x7c00u ? NAN : f16_value(h);
}

/* v rounded as put_scale stores it (NaN beyond float16's range). */
static float f16_round(float v)
{
    unsigned char tmp[2];
    return put_scale(tmp, v);
}

/* Squared error of x (n) against a q - o, each q the nearest level of
 * 0..nmax (0 where a <= 0); the levels into q when it is not NULL. The
 * value is computed as the readers do (dequantize_row_q4_K's d1 * q - m1). */
static double affine_err(const float *x, int n, int nmax, float a, float o, uint8_t *q)
{
    double e = 0;
    for (int i = 0; i < n; i++) {
        int l = a > 0 ? nearest_in((x[i] + o) / a, 0, nmax) : 0;
        double d = (double)(a * (float)l - o) - x[i];
        e += d * d;
        if (q)
            q[i] = (uint8_t)l;
    }
    return e;
}

/* IQ4_NL's and IQ4_XS's 16 levels (ggml-common.h's kvalues_iq4nl). */
static const int8_t iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

/* The index of the level nearest v, the upper one on a tie (as ggml's
 * best_index_int8). */
static int iq4_index(float v)
{
    if (!(v > iq4_levels[0]))
        return 0;
    if (v >= iq4_levels[15])
        return 15;
    int k = 1;
    while (v > iq4_levels[k])
        k++; /* levels[k - 1] < v <= levels[k] */
    return v - iq4_levels[k - 1] < iq4_levels[k] - v ? k - 1 : k;
}

/* The levels of a symmetric type: integers lo..hi, or (lo > hi) IQ4's. */
typedef struct levels {
    int lo, hi;
} levels;

static const levels IQ4 = {1, 0};

/* Squared error of x (n) against a q, each q the nearest level (index for
 * IQ4); the levels into q when it is not NULL. */
static double scaled_err(levels lv, const float *x, int n, float a, int8_t *q)
{
    double e = 0;
    for (int i = 0; i < n; i++) {
        float v = a != 0 ? x[i] / a : 0.0f;
        int l = lv.lo > lv.hi ? iq4_index(v) : nearest_in(v, lv.lo, lv.hi);
        float y = a * (float)(lv.lo > lv.hi ? iq4_levels[l] : l);
        double d = (double)y - x[i];
        e += d * d;
        if (q)
            q[i] = (int8_t)l;
    }
    return e;
}

/* The descent: sub-block scale *l in [lo, hi] (the value's step d * l)
 * moves by one while that lowers the squared error. */
static void refine_scaled(levels lv, const float *x, int n, float d, int *l, int lo, int hi)
{
    double best = scaled_err(lv, x, n, d * (float)*l, NULL);
    for (int step = 0; step < 64; step++) {
        int from = *l;
        for (int c = from - 1; c <= from + 1; c += 2) {
            if (c < lo || c > hi)
                continue;
            double e = scaled_err(lv, x, n, d * (float)c, NULL);
            if (e < best)
                best = e, *l = c;
        }
        if (*l == from)
            break;
    }
}

/* The same for a scale and an offset, ls and lm in [0, top] (the value
 * (d ls) q - (dmin lm)), over their eight neighbours. */
static void refine_affine(const float *x, int n, int nmax, float d, float dmin, int *ls, int *lm,
                          int top)
{
    double best = affine_err(x, n, nmax, d * (float)*ls, dmin * (float)*lm, NULL);
    for (int step = 0; step < 64; step++) {
        int s0 = *ls, m0 = *lm;
        for (int s = s0 - 1; s <= s0 + 1; s++)
            for (int m = m0 - 1; m <= m0 + 1; m++) {
                if (s < 0 || s > top || m < 0 || m > top || (s == s0 && m == m0))
                    continue;
                double e = affine_err(x, n, nmax, d * (float)s, dmin * (float)m, NULL);
                if (e < best)
                    best = e, *ls = s, *lm = m;
            }
        if (*ls == s0 && *lm == m0)
            break;
    }
}

/* In the manner of ggml's make_qkx2_quants: a step a and offset o for x
 * (n <= 32) ~ a q - o, q in 0..nmax, o >= 0 (free_min: of any sign). From
 * the range [min(x, 0), max x] in nmax steps, then the trials of (nmax +
 * rmin + rdelta k) steps over the range, k = 0..nstep: each trial's levels
 * refitted by least squares weighted by w, the fit of least weighted error
 * (absolute when mad, else squared) kept. Returns a, o in *off. */
static float search_affine(const float *x, const float *w, int n, int nmax, float rmin,
                           float rdelta, int nstep, int mad, int free_min, float *off)
{
    float lo = x[0], hi = x[0], sw = w[0], sx = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0 && !free_min)
        lo = 0;
    if (hi == lo) {
        *off = -lo;
        return 0;
    }
    float m = lo, inv = (float)nmax / (hi - lo), a = 1 / inv, best = 0;
    for (int i = 0; i < n; i++) {
        float diff = a * (float)nearest_in(inv * (x[i] - m), 0, nmax) + m - x[i];
        best += w[i] * (mad ? fabsf(diff) : diff * diff);
    }
    uint8_t L[32];
    for (int k = 0; k <= nstep; k++) {
        float t = (rmin + rdelta * (float)k + (float)nmax) / (hi - m);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_in(t * (x[i] - m), 0, nmax);
            L[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sl2 += w[i] * (float)l * (float)l;
            sxl += w[i] * (float)l * x[i];
        }
        float D = sw * sl2 - sl * sl;
        if (!(D > 0))
            continue;
        float ta = (sw * sxl - sx * sl) / D, tm = (sl2 * sx - sl * sxl) / D;
        if (tm > 0 && !free_min) {
            tm = 0;
            ta = sxl / sl2;
        }
        float e = 0;
        for (int i = 0; i < n; i++) {
            float diff = ta * (float)L[i] + tm - x[i];
            e += w[i] * (mad ? fabsf(diff) : diff * diff);
        }
        if (e < best) {
            best = e;
            a = ta;
            m = tm;
        }
    }
    *off = -m;
    return a;
}

/* The entry of largest magnitude of x (n) into *max; returns its magnitude. */
static float largest(const float *x, int n, float *max)
{
    float amax = 0;
    *max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            *max = x[i];
        }
    return amax;
}

#define GROUP_EPS 1e-15f /* ggml's GROUP_MAX_EPS: a group below it is zeros */

/* In the manner of ggml's make_qx_quants (weights x^2): a step a for x (n)
 * ~ a q, q in -nmax..nmax-1: the trials (nmax + k / 10) / -max, k = 0, -9
 * .. 9 (max the entry of largest magnitude), each trial's levels fitted by
 * weighted least squares, the fit of most weighted correlation kept. */
static float search_signed(const float *x, int n, int nmax)
{
    float max, a = 0, best = 0;
    if (largest(x, n, &max) < GROUP_EPS)
        return 0;
    for (int k = 0; k < 19; k++) {
        int is = k == 0 ? 0 : k <= 9 ? k - 10 : k - 9;
        float inv = -((float)nmax + 0.1f * (float)is) / max, slx = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            float l = (float)nearest_in(inv * x[i], -nmax, nmax - 1), w = x[i] * x[i];
            slx += w * x[i] * l;
            sl2 += w * l * l;
        }
        if (k == 0) {
            a = sl2 > 0 ? slx / sl2 : 0.0f;
            best = a * slx;
        } else if (sl2 > 0 && slx * slx > best * sl2) {
            a = slx / sl2;
            best = a * slx;
        }
    }
    return a;
}

/* In the manner of ggml's make_q3_quants (weights x^2): a step for x (n <=
 * 16) ~ a q, q in -4..3, from 4 / -max, then up to five passes that move
 * single levels while the weighted fit improves. */
static float search_q3(const float *x, int n)
{
    float max;
    if (largest(x, n, &max) < GROUP_EPS)
        return 0;
    float inv = -4.0f / max, slx = 0, sl2 = 0;
    int L[16];
    for (int i = 0; i < n; i++) {
        float w = x[i] * x[i];
        L[i] = nearest_in(inv * x[i], -4, 3);
        slx += w * x[i] * (float)L[i];
        sl2 += w * (float)L[i] * (float)L[i];
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i], s1 = slx - w * x[i] * (float)L[i];
            if (!(s1 > 0))
                continue;
            float s2 = sl2 - w * (float)L[i] * (float)L[i];
            int l = nearest_in(x[i] * s2 / s1, -4, 3);
            if (l == L[i])
                continue;
            s1 += w * x[i] * (float)l;
            s2 += w * (float)l * (float)l;
            if (s2 > 0 && s1 * s1 * sl2 > slx * slx * s2) {
                L[i] = l, slx = s1, sl2 = s2;
                changed++;
            }
        }
        if (!changed)
            break;
    }
    return sl2 > 0 ? slx / sl2 : 0.0f;
}

/* In the manner of ggml's quantize_row_iq4_nl_impl (no importance matrix,
 * weights x^2, 7 trials a side, as llama.cpp's quantizer calls it): the
 * scale d of x (n <= 32) ~ d levels[q]. */
static float search_nl(const float *x, int n)
{
    float max;
    if (largest(x, n, &max) < GROUP_EPS)
        return 0;
    float d = -max / (float)iq4_levels[0], id = 1 / d, sqx = 0, sq2 = 0;
    for (int i = 0; i < n; i++) {
        float q = iq4_levels[iq4_index(id * x[i])], w = x[i] * x[i];
        sqx += w * q * x[i];
        sq2 += w * q * q;
    }
    d = sq2 > 0 ? sqx / sq2 : 0.0f;
    float best = d * sqx;
    for (int t = -7; t <= 7; t++) {
        id = ((float)t + (float)iq4_levels[0]) / max;
        sqx = sq2 = 0;
        for (int i = 0; i < n; i++) {
            float q = iq4_levels[iq4_index(id * x[i])], w = x[i] * x[i];
            sqx += w * q * x[i];
            sq2 += w * q * q;
        }
        if (sq2 > 0 && sqx * sqx > best * sq2) {
            d = sqx / sq2;
            best = d * sqx;
        }
    }
    return d;
}

/* The 32-value blocks. Q8_0, Q4_0 and Q5_0 are ggml's references as they
 * are (quantize_row_q8_0_ref, _q4_0_ref, _q5_0_ref: llama.cpp's quantizer
 * calls them without an importance matrix), byte for byte. */

static int q8_0_block(const float *x, unsigned char *b)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    float stored = put_scale(b, d);
    for (int j = 0; j < 32; j++)
        b[2 + j] = (unsigned char)(int8_t)roundf(x[j] * id);
    return isnan(stored) ? -1 : 0;
}

/* Q4_0 (nmax 8, 4 bits) and Q5_0 (nmax 16, 5 bits, the fifth bits in a
 * 32-bit word): d = (the x of largest magnitude) / -nmax, q = min(2 nmax -
 * 1, trunc(x / d + nmax + 0.5)). */
static int q_0_block(const float *x, unsigned char *b, int nmax)
{
    float max;
    largest(x, 32, &max);
    const float d = max / -(float)nmax, id = d != 0.0f ? 1.0f / d : 0.0f;
    const float half = (float)nmax + 0.5f;
    float stored = put_scale(b, d);
    unsigned char *qs = b + (nmax == 16 ? 6 : 2);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int lo = (int)(x[j] * id + half), hi = (int)(x[j + 16] * id + half);
        lo = lo > 2 * nmax - 1 ? 2 * nmax - 1 : lo;
        hi = hi > 2 * nmax - 1 ? 2 * nmax - 1 : hi;
        qs[j] = (unsigned char)((lo & 0xF) | (hi & 0xF) << 4);
        qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + 16);
    }
    if (nmax == 16)
        for (int k = 0; k < 4; k++)
            b[2 + k] = (unsigned char)(qh >> (8 * k));
    return isnan(stored) ? -1 : 0;
}

/* Q4_1 (nmax 15) and Q5_1 (nmax 31): x ~ d q + m. Two candidates: ggml's
 * reference (d = (max - min) / nmax, m = min) and search_affine's fit
 * (unweighted, 20 trials, an offset of any sign); the one of less squared
 * error under its stored float16 d and m is written. */
static int q_1_block(const float *x, unsigned char *b, int nmax)
{
    float lo = x[0], hi = x[0], w[32], off;
    for (int j = 0; j < 32; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
        w[j] = 1.0f;
    }
    float a = search_affine(x, w, 32, nmax, -1.0f, 0.1f, 20, 0, 1, &off);
    const float cand[2][2] = {{(hi - lo) / (float)nmax, lo}, {a, -off}};
    double best = INFINITY;
    int pick = 0;
    for (int c = 0; c < 2; c++) {
        double e = affine_err(x, 32, nmax, f16_round(cand[c][0]), -f16_round(cand[c][1]), NULL);
        if (e < best)
            best = e, pick = c;
    }
    float d = put_scale(b, cand[pick][0]), m = put_scale(b + 2, cand[pick][1]);
    uint8_t q[32];
    affine_err(x, 32, nmax, d, -m, q);
    unsigned char *qs = b + (nmax == 31 ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (unsigned char)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    if (nmax == 31)
        for (int k = 0; k < 4; k++)
            b[4 + k] = (unsigned char)(qh >> (8 * k));
    return isnan(d) || isnan(m) ? -1 : 0;
}

/* IQ4_NL: x ~ d levels[q]. d from search_nl; then, among the float16
 * values within two steps of it (same sign), the one of least squared error. */
static int iq4_nl_block(const float *x, unsigned char *b)
{
    uint16_t h0 = gw_f32_to_f16(search_nl(x, 32)), h = h0;
    double best = scaled_err(IQ4, x, 32, f16_value(h0), NULL);
    for (int k = -2; k <= 2; k++) {
        uint16_t c = (uint16_t)(h0 + k);
        if (k == 0 || (c & 0x8000u) != (h0 & 0x8000u) || (c & 0x7c00u) == 0x7c00u)
            continue;
        double e = scaled_err(IQ4, x, 32, f16_value(c), NULL);
        if (e < best)
            best = e, h = c;
    }
    put16(b, h);
    int8_t q[32];
    scaled_err(IQ4, x, 32, f16_value(h), q);
    for (int j = 0; j < 16; j++)
        b[2 + j] = (unsigned char)(q[j] | q[j + 16] << 4);
    return (h & 0x7c00u) == 0x7c00u ? -1 : 0;
}

/* The 256-value super-blocks. */

/* Q2_K, Q3_K's low bits: four runs of 32 per half of 128 in one byte each,
 * two bits apiece (ggml's packing). */
static void pack_2bit(const uint8_t *L, unsigned char *qs)
{
    for (int h = 0; h < 256; h += 128)
        for (int l = 0; l < 32; l++)
            qs[h / 4 + l] = (unsigned char)(L[h + l] | L[h + l + 32] << 2 | L[h + l + 64] << 4 |
                                            L[h + l + 96] << 6);
}

/* Q2_K: 16 sub-blocks of 16, x ~ (d sc_j) q - (dmin m_j), q in 0..3, sc and
 * m 4-bit; sub-blocks as make_qkx2_quants(16, 3, weights |x|, -0.5, 0.1,
 * 15, absolute error), as quantize_row_q2_K_ref. */
static int q2_k_block(const float *x, unsigned char *b)
{
    float sc[16], mn[16], w[16], max_sc = 0, max_mn = 0;
    for (size_t j = 0; j < 16; j++) {
        for (int l = 0; l < 16; l++)
            w[l] = fabsf(x[16 * j + l]);
        sc[j] = search_affine(x + 16 * j, w, 16, 3, -0.5f, 0.1f, 15, 1, 0, &mn[j]);
        max_sc = sc[j] > max_sc ? sc[j] : max_sc;
        max_mn = mn[j] > max_mn ? mn[j] : max_mn;
    }
    int ls[16], lm[16];
    for (int j = 0; j < 16; j++) {
        ls[j] = max_sc > 0 ? nearest_in(15.0f / max_sc * sc[j], 0, 15) : 0;
        lm[j] = max_mn > 0 ? nearest_in(15.0f / max_mn * mn[j], 0, 15) : 0;
    }
    float d = put_scale(b + 80, max_sc > 0 ? max_sc / 15.0f : 0.0f);
    float dmin = put_scale(b + 82, max_mn > 0 ? max_mn / 15.0f : 0.0f);
    uint8_t L[256];
    for (size_t j = 0; j < 16; j++) {
        refine_affine(x + 16 * j, 16, 3, d, dmin, &ls[j], &lm[j], 15);
        b[j] = (unsigned char)(ls[j] | lm[j] << 4);
        affine_err(x + 16 * j, 16, 3, d * (float)ls[j], dmin * (float)lm[j], L + 16 * j);
    }
    pack_2bit(L, b + 16);
    return isnan(d) || isnan(dmin) ? -1 : 0;
}

/* Q3_K: 16 sub-blocks of 16, x ~ (d sc_j) q, q in -4..3 (the third bit in
 * hmask), sc 6-bit signed; sub-blocks as make_q3_quants, d = -(the scale
 * of largest magnitude) / 32, as quantize_row_q3_K_ref. */
static int q3_k_block(const float *x, unsigned char *b)
{
    float sc[16], max_sc;
    for (size_t j = 0; j < 16; j++)
        sc[j] = search_q3(x + 16 * j, 16);
    largest(sc, 16, &max_sc);
    int l[16] = {0};
    float inv = max_sc != 0 ? -32.0f / max_sc : 0.0f;
    float d = put_scale(b + 108, max_sc != 0 ? 1 / inv : 0.0f);
    unsigned char *s = b + 96, *hmask = b;
    memset(b, 0, 108);
    uint8_t L[256];
    for (size_t j = 0; j < 16; j++) {
        l[j] = nearest_in(inv * sc[j], -32, 31);
        refine_scaled((levels){-4, 3}, x + 16 * j, 16, d, &l[j], -32, 31);
        int u = l[j] + 32;
        s[j < 8 ? j : j - 8] |= (unsigned char)((u & 0xF) << (j < 8 ? 0 : 4));
        s[8 + j % 4] |= (unsigned char)((u >> 4) << (2 * (j / 4)));
        int8_t q[16];
        scaled_err((levels){-4, 3}, x + 16 * j, 16, d * (float)l[j], q);
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (uint8_t)(q[i] + 4);
    }
    for (int e = 0; e < 256; e++) /* the high bit of element e: bit e / 32 of byte e % 32 */
        if (L[e] > 3) {
            hmask[e % 32] |= (unsigned char)(1u << (e / 32));
            L[e] -= 4;
        }
    pack_2bit(L, b + 32);
    return isnan(d) ? -1 : 0;
}

/* Q4_K and Q5_K (nmax 15, 31): 8 sub-blocks of 32, x ~ (d sc_j) q - (dmin
 * m_j), sc and m 6-bit (packed as get_scale_min_k4 reads them); sub-blocks
 * as make_qkx2_quants(32, nmax, weights rms + |x|, rmin, 0.1, nstep, squared
 * error), as quantize_row_q4_K_ref (rmin -1, 20 trials) and
 * quantize_row_q5_K_ref (-0.5, 15). The levels into q. */
static int k_affine_block(const float *x, unsigned char *b, int nmax, float rmin, int nstep,
                          uint8_t *q)
{
    float sc[8], mn[8], w[32], max_sc = 0, max_mn = 0;
    for (size_t j = 0; j < 8; j++) {
        const float *v = x + 32 * j;
        float s2 = 0;
        for (int l = 0; l < 32; l++)
            s2 += v[l] * v[l];
        const float rms = sqrtf(s2 / 32);
        for (int l = 0; l < 32; l++)
            w[l] = rms + fabsf(v[l]);
        sc[j] = search_affine(v, w, 32, nmax, rmin, 0.1f, nstep, 0, 0, &mn[j]);
        max_sc = sc[j] > max_sc ? sc[j] : max_sc;
        max_mn = mn[j] > max_mn ? mn[j] : max_mn;
    }
    const float is = max_sc > 0 ? 63.0f / max_sc : 0.0f, im = max_mn > 0 ? 63.0f / max_mn : 0.0f;
    float d = put_scale(b, max_sc / 63.0f), dmin = put_scale(b + 2, max_mn / 63.0f);
    unsigned char *s = b + 4;
    memset(s, 0, 12);
    for (size_t j = 0; j < 8; j++) {
        int ls = nearest_in(is * sc[j], 0, 63), lm = nearest_in(im * mn[j], 0, 63);
        refine_affine(x + 32 * j, 32, nmax, d, dmin, &ls, &lm, 63);
        affine_err(x + 32 * j, 32, nmax, d * (float)ls, dmin * (float)lm, q + 32 * j);
        /* j < 4: the low 6 bits of bytes j and j + 4; j >= 4: the nibbles of
         * byte j + 4 and the top two bits of bytes j - 4 and j */
        if (j < 4) {
            s[j] |= (unsigned char)ls;
            s[j + 4] |= (unsigned char)lm;
        } else {
            s[j + 4] = (unsigned char)((ls & 0xF) | (lm & 0xF) << 4);
            s[j - 4] |= (unsigned char)((ls >> 4) << 6);
            s[j] |= (unsigned char)((lm >> 4) << 6);
        }
    }
    return isnan(d) || isnan(dmin) ? -1 : 0;
}

static int q4_k_block(const float *x, unsigned char *b)
{
    uint8_t q[256];
    int rc = k_affine_block(x, b, 15, -1.0f, 20, q);
    for (int p = 0; p < 4; p++) /* 32 bytes per pair of sub-blocks: 2p low, 2p + 1 high */
        for (int l = 0; l < 32; l++)
            b[16 + 32 * p + l] = (unsigned char)(q[64 * p + l] | q[64 * p + 32 + l] << 4);
    return rc;
}

static int q5_k_block(const float *x, unsigned char *b)
{
    uint8_t q[256];
    int rc = k_affine_block(x, b, 31, -0.5f, 15, q);
    unsigned char *qh = b + 16, *qs = b + 48;
    memset(qh, 0, 32);
    for (int p = 0; p < 4; p++) /* as Q4_K, the fifth bits: bit 2p (low), 2p + 1 (high) */
        for (int l = 0; l < 32; l++) {
            uint8_t lo = q[64 * p + l], hi = q[64 * p + 32 + l];
            qs[32 * p + l] = (unsigned char)((lo & 0xF) | (hi & 0xF) << 4);
            qh[l] |= (unsigned char)((lo >> 4) << (2 * p) | (hi >> 4) << (2 * p + 1));
        }
    return rc;
}

/* Q6_K: 16 sub-blocks of 16, x ~ (d sc_j) q, q in -32..31, sc int8;
 * sub-blocks as make_qx_quants(16, 32, weights x^2), d = -(the scale of
 * largest magnitude) / 128, as quantize_row_q6_K_ref. */
static int q6_k_block(const float *x, unsigned char *b)
{
    float sc[16], max_sc;
    for (size_t j = 0; j < 16; j++)
        sc[j] = search_signed(x + 16 * j, 16, 32);
    const float amax = largest(sc, 16, &max_sc);
    memset(b, 0, 210);
    if (amax < GROUP_EPS)
        return 0; /* zeros: d = 0 */
    const float inv = -128.0f / max_sc;
    float d = put_scale(b + 208, 1 / inv);
    int8_t *scales = (int8_t *)(void *)(b + 192);
    uint8_t L[256];
    for (size_t j = 0; j < 16; j++) {
        int l = nearest_in(inv * sc[j], -128, 127);
        refine_scaled((levels){-32, 31}, x + 16 * j, 16, d, &l, -128, 127);
        scales[j] = (int8_t)l;
        int8_t q[16];
        scaled_err((levels){-32, 31}, x + 16 * j, 16, d * (float)l, q);
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (uint8_t)(q[i] + 32);
    }
    unsigned char *ql = b, *qh = b + 128;
    for (size_t h = 0; h < 2; h++) /* per half of 128: runs of 32 at 0, 32, 64, 96 */
        for (int l = 0; l < 32; l++) {
            const uint8_t *e = L + 128 * h + l;
            ql[64 * h + l] = (unsigned char)((e[0] & 0xF) | (e[64] & 0xF) << 4);
            ql[64 * h + 32 + l] = (unsigned char)((e[32] & 0xF) | (e[96] & 0xF) << 4);
            qh[32 * h + l] = (unsigned char)((e[0] >> 4) | (e[32] >> 4) << 2 | (e[64] >> 4) << 4 |
                                             (e[96] >> 4) << 6);
        }
    return isnan(d) ? -1 : 0;
}

/* IQ4_XS: 8 sub-blocks of 32, x ~ (d sc_j) levels[q], sc 6-bit signed;
 * sub-blocks as search_nl, d = -(the scale of largest magnitude) / 32, as
 * quantize_iq4_xs. */
static int iq4_xs_block(const float *x, unsigned char *b)
{
    float sc[8], max_sc;
    for (size_t j = 0; j < 8; j++)
        sc[j] = search_nl(x + 32 * j, 32);
    largest(sc, 8, &max_sc);
    memset(b, 0, 136);
    const float d0 = -max_sc / 32, id = d0 != 0 ? 1 / d0 : 0.0f;
    float d = put_scale(b, d0);
    unsigned scales_h = 0;
    for (size_t j = 0; j < 8; j++) {
        int l = nearest_in(id * sc[j], -32, 31);
        refine_scaled(IQ4, x + 32 * j, 32, d, &l, -32, 31);
        int u = l + 32;
        b[4 + j / 2] |= (unsigned char)((u & 0xF) << (4 * (j % 2)));
        scales_h |= (unsigned)(u >> 4) << (2 * j);
        int8_t q[32];
        scaled_err(IQ4, x + 32 * j, 32, d * (float)l, q);
        for (int i = 0; i < 16; i++)
            b[8 + 16 * j + i] = (unsigned char)(q[i] | q[i + 16] << 4);
    }
    put16(b + 2, (uint16_t)scales_h);
    return isnan(d) ? -1 : 0;
}

static size_t block_of(uint32_t type, size_t *bytes)
{
    switch (type) {
    case GW_F32: *bytes = 4; return 1;
    case GW_F16:
    case GW_BF16: *bytes = 2; return 1;
    case GW_Q8_0: *bytes = 34; return 32;
    case GW_Q4_0: *bytes = 18; return 32;
    case GW_Q4_1: *bytes = 20; return 32;
    case GW_Q5_0: *bytes = 22; return 32;
    case GW_Q5_1: *bytes = 24; return 32;
    case GW_IQ4_NL: *bytes = 18; return 32;
    case GW_Q2_K: *bytes = 84; return 256;
    case GW_Q3_K: *bytes = 110; return 256;
    case GW_Q4_K: *bytes = 144; return 256;
    case GW_Q5_K: *bytes = 176; return 256;
    case GW_Q6_K: *bytes = 210; return 256;
    case GW_IQ4_XS: *bytes = 136; return 256;
    default: *bytes = 0; return 0;
    }
}

size_t gw_row_bytes(uint32_t type, size_t n)
{
    size_t bb, bs = block_of(type, &bb);
    return bs && n % bs == 0 ? n / bs * bb : 0;
}

int gw_quantize_row(uint32_t type, const float *x, size_t n, unsigned char *out)
{
    size_t bb, bs = block_of(type, &bb);
    if (!bs || n % bs)
        return -1;
    for (size_t i = 0; i < n / bs; i++) {
        const float *v = x + i * bs;
        unsigned char *o = out + i * bb;
        int rc = 0;
        switch (type) {
        case GW_F32: memcpy(o, v, 4); break; /* the machines are little endian */
        case GW_F16:
            if (!(fabsf(*v) < 65520.0f))
                return -1;
            put16(o, gw_f32_to_f16(*v));
            break;
        case GW_BF16: put16(o, f32_to_bf16(*v)); break;
        case GW_Q8_0: rc = q8_0_block(v, o); break;
        case GW_Q4_0: rc = q_0_block(v, o, 8); break;
        case GW_Q5_0: rc = q_0_block(v, o, 16); break;
        case GW_Q4_1: rc = q_1_block(v, o, 15); break;
        case GW_Q5_1: rc = q_1_block(v, o, 31); break;
        case GW_IQ4_NL: rc = iq4_nl_block(v, o); break;
        case GW_Q2_K: rc = q2_k_block(v, o); break;
        case GW_Q3_K: rc = q3_k_block(v, o); break;
        case GW_Q4_K: rc = q4_k_block(v, o); break;
        case GW_Q5_K: rc = q5_k_block(v, o); break;
        case GW_Q6_K: rc = q6_k_block(v, o); break;
        default: rc = iq4_xs_block(v, o); break;
        }
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* ---- shapes ---- */

void gw_shape(const gw_spec *s, gw_kind kind, size_t *rows, size_t *cols)
{
    size_t D = (size_t)s->dim, F = (size_t)s->hidden, S = D / (size_t)s->heads;
    size_t Q = (size_t)s->heads * S, K = (size_t)s->kv_heads * S, V = (size_t)s->vocab;
    if (kind == GW_ROPE_FREQS) {
        *rows = 1, *cols = S / 2;
        return;
    }
    /* rows and columns by kind, as letters of the legend above */
    static const char r_of[GW_KINDS + 1] = "V1QKKD1FDF1V", c_of[GW_KINDS + 1] = "DDDDDQDDFDDD";
    char r = r_of[kind], c = c_of[kind];
    *rows = r == 'V' ? V : r == 'Q' ? Q : r == 'K' ? K : r == 'D' ? D : r == 'F' ? F : 1;
    *cols = c == 'Q' ? Q : c == 'F' ? F : D;
}

static int check_spec(const gw_spec *s, char *err, size_t cap)
{
    if (s->dim <= 0 || s->hidden <= 0 || s->layers <= 0 || s->heads <= 0 || s->kv_heads <= 0 ||
        s->vocab <= 0 || s->seq_len <= 0 || s->dim % s->heads || s->heads % s->kv_heads ||
        (s->dim / s->heads) % 2)
        return fail(err, cap,
                    "shape: dim %d, hidden %d, layers %d, heads %d, kv_heads %d, vocab %d, "
                    "seq_len %d is not a llama model",
                    s->dim, s->hidden, s->layers, s->heads, s->kv_heads, s->vocab, s->seq_len);
    return 0;
}

/* ---- a growing buffer (the GGUF metadata) ---- */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2 + 256;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u32(buf *b, uint32_t v)
{
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 24)};
    put(b, le, 4);
}

static void put_u64(buf *b, uint64_t v)
{
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_f32(buf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(b, u);
}

static void put_str(buf *b, const char *s, size_t n)
{
    put_u64(b, n);
    put(b, s, n);
}

enum { K_U32 = 4, K_I32 = 5, K_F32 = 6, K_STRING = 8, K_ARRAY = 9 };

static void key(buf *b, const char *k, uint32_t type)
{
    put_str(b, k, strlen(k));
    put_u32(b, type);
}

/* A piece with each space written U+2581, as SentencePiece stores it. */
static void put_piece(buf *b, const char *p, size_t n)
{
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++)
        spaces += p[i] == ' ';
    put_u64(b, n + 2 * spaces);
    for (size_t i = 0; i < n; i++)
        put(b, p[i] == ' ' ? "\xe2\x96\x81" : p + i, p[i] == ' ' ? 3 : 1);
}

static int is_byte_piece(const char *p, size_t n)
{
    return n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>';
}

uint32_t gw_file_type(uint32_t type)
{
    /* llama.h's LLAMA_FTYPE_*: ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q4_1 3, Q8_0 7,
     * Q5_0 8, Q5_1 9, Q2_K 10, Q3_K_M 12, Q4_K_M 15, Q5_K_M 17, Q6_K 18,
     * IQ4_NL 25, IQ4_XS 30, BF16 32 */
    static const struct {
        uint32_t type, ftype;
    } map[] = {{GW_F32, 0},   {GW_F16, 1},   {GW_Q4_0, 2},    {GW_Q4_1, 3},    {GW_Q8_0, 7},
               {GW_Q5_0, 8},  {GW_Q5_1, 9},  {GW_Q2_K, 10},   {GW_Q3_K, 12},   {GW_Q4_K, 15},
               {GW_Q5_K, 17}, {GW_Q6_K, 18}, {GW_IQ4_NL, 25}, {GW_IQ4_XS, 30}, {GW_BF16, 32}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].type == type)
            return map[i].ftype;
    return 0;
}

/* The metadata; returns the number of pairs. */
static uint64_t metadata(buf *b, const gw_spec *s)
{
    uint64_t n = 0;
    key(b, "general.architecture", K_STRING), put_str(b, "llama", 5), n++;
    if (s->name)
        key(b, "general.name", K_STRING), put_str(b, s->name, strlen(s->name)), n++;
    key(b, "general.alignment", K_U32), put_u32(b, ALIGN), n++;
    int quantized = s->type != GW_F32 && s->type != GW_F16 && s->type != GW_BF16;
    quantized |= s->emb_type != GW_F32 && s->emb_type != GW_F16 && s->emb_type != GW_BF16;
    if (quantized)
        key(b, "general.quantization_version", K_U32), put_u32(b, 2), n++;
    key(b, "general.file_type", K_U32), put_u32(b, gw_file_type(s->type)), n++;
    const struct {
        const char *k;
        int32_t v;
    } ints[] = {{"llama.context_length", s->seq_len},
                {"llama.embedding_length", s->dim},
                {"llama.block_count", s->layers},
                {"llama.feed_forward_length", s->hidden},
                {"llama.attention.head_count", s->heads},
                {"llama.attention.head_count_kv", s->kv_heads},
                {"llama.rope.dimension_count", s->dim / s->heads}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        key(b, ints[i].k, K_U32), put_u32(b, (uint32_t)ints[i].v), n++;
    key(b, "llama.attention.layer_norm_rms_epsilon", K_F32), put_f32(b, s->norm_eps), n++;
    key(b, "llama.rope.freq_base", K_F32), put_f32(b, s->rope_theta), n++;
    if (s->rope_scaling) {
        const char *type = s->rope_scaling == 2 ? "yarn" : "linear";
        key(b, "llama.rope.scaling.type", K_STRING), put_str(b, type, strlen(type)), n++;
        key(b, "llama.rope.scaling.factor", K_F32), put_f32(b, s->rope_factor), n++;
        if (s->rope_attn_factor != 1.0f)
            key(b, "llama.rope.scaling.attn_factor", K_F32), put_f32(b, s->rope_attn_factor), n++;
        if (s->rope_scaling == 2 && s->rope_orig_ctx > 0)
            key(b, "llama.rope.scaling.original_context_length", K_U32),
                put_u32(b, (uint32_t)s->rope_orig_ctx), n++;
    }
    if (s->extra_kv) {
        put(b, s->extra_kv, s->extra_kv_bytes);
        n += s->extra_kv_count;
    }
    const gw_vocab *v = s->vocab_data;
    if (!v)
        return n;
    key(b, "tokenizer.ggml.model", K_STRING), put_str(b, "llama", 5), n++;
    key(b, "tokenizer.ggml.tokens", K_ARRAY), put_u32(b, K_STRING), put_u64(b, (uint64_t)v->n), n++;
    for (int32_t i = 0; i < v->n; i++)
        put_piece(b, v->piece[i], (size_t)v->len[i]);
    key(b, "tokenizer.ggml.scores", K_ARRAY), put_u32(b, K_F32), put_u64(b, (uint64_t)v->n), n++;
    for (int32_t i = 0; i < v->n; i++)
        put_f32(b, v->score[i]);
    /* token types: 2 unknown, 3 control, 6 byte, 1 normal */
    key(b, "tokenizer.ggml.token_type", K_ARRAY), put_u32(b, K_I32), n++;
    put_u64(b, (uint64_t)v->n);
    for (int32_t i = 0; i < v->n; i++)
        put_u32(b, i == 0 ? 2 : i <= 2 ? 3 : is_byte_piece(v->piece[i], (size_t)v->len[i]) ? 6 : 1);
    key(b, "tokenizer.ggml.bos_token_id", K_U32), put_u32(b, 1), n++;
    key(b, "tokenizer.ggml.eos_token_id", K_U32), put_u32(b, 2), n++;
    key(b, "tokenizer.ggml.unknown_token_id", K_U32), put_u32(b, 0), n++;
    return n;
}

/* ---- GGUF ---- */

typedef struct tinfo {
    char name[64];
    gw_kind kind;
    int layer;
    size_t rows, cols;
    uint32_t type;
    uint64_t offset, bytes;
} tinfo;

static int write_all(FILE *f, const void *p, size_t n)
{
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

/* Asks the source for one tensor and writes it in `type` (rows of cols). */
static int write_tensor(FILE *f, gw_source src, void *user, const float *rope_freqs,
                        gw_kind kind, int layer, size_t rows, size_t cols, uint32_t type,
                        float *vals, unsigned char *row, char *err, size_t cap)
{
    if (kind == GW_ROPE_FREQS)
        memcpy(vals, rope_freqs, cols * sizeof *vals);
    else if (src(user, kind, layer, vals) != 0)
        return fail(err, cap, "the source failed on tensor %d of layer %d", (int)kind, layer);
    size_t rb = gw_row_bytes(type, cols);
    for (size_t r = 0; r < rows; r++) {
        if (gw_quantize_row(type, vals + r * cols, cols, row) != 0)
            return fail(err, cap, "tensor %d of layer %d: a value does not fit type %u",
                        (int)kind, layer, type);
        if (write_all(f, row, rb) != 0)
            return fail(err, cap, "write failed");
    }
    return 0;
}

/* The type a tensor of `cols` columns gets for `want` (the fallbacks of
 * gw_spec.fallback): llama.cpp's tensor_type_fallback (src/llama-quant.cpp),
 * a 256-value type to its 32-value neighbour, then F16. */
static uint32_t fitting(uint32_t want, size_t cols)
{
    while (!gw_row_bytes(want, cols) && want != GW_F16)
        want = want == GW_Q2_K || want == GW_Q3_K ? GW_Q4_0
               : want == GW_Q4_K                  ? GW_Q5_0
               : want == GW_Q5_K                  ? GW_Q5_1
               : want == GW_Q6_K                  ? GW_Q8_0
               : want == GW_IQ4_XS                ? GW_IQ4_NL
                                                  : GW_F16;
    return want;
}

int gw_write_gguf(FILE *f, gw_spec *s, gw_source src, void *user, char *err, size_t cap)
{
    if (check_spec(s, err, cap) != 0)
        return -1;
    s->fell_back = 0;
    size_t n_t = 2 + (s->shared ? 0 : 1) + 9 * (size_t)s->layers + (s->rope_freqs ? 1 : 0);
    tinfo *t = calloc(n_t, sizeof *t);
    if (!t)
        return fail(err, cap, "out of memory");
    size_t k = 0;
    struct {
        const char *name;
        gw_kind kind;
    } glob[] = {{"token_embd.weight", GW_EMB}, {"output_norm.weight", GW_RMS_FINAL},
                {"output.weight", GW_CLS}};
    for (size_t i = 0; i < 3; i++) {
        if (glob[i].kind == GW_CLS && s->shared)
            continue;
        snprintf(t[k].name, sizeof t[k].name, "%s", glob[i].name);
        t[k++].kind = glob[i].kind;
    }
    static const struct {
        const char *suffix;
        gw_kind kind;
    } per[9] = {{"attn_norm", GW_RMS_ATT}, {"attn_q", GW_WQ},       {"attn_k", GW_WK},
                {"attn_v", GW_WV},         {"attn_output", GW_WO},  {"ffn_norm", GW_RMS_FFN},
                {"ffn_gate", GW_W1},       {"ffn_down", GW_W2},     {"ffn_up", GW_W3}};
    for (int l = 0; l < s->layers; l++)
        for (int i = 0; i < 9; i++) {
            snprintf(t[k].name, sizeof t[k].name, "blk.%d.%s.weight", l, per[i].suffix);
            t[k].kind = per[i].kind;
            t[k++].layer = l;
        }
    if (s->rope_freqs) {
        snprintf(t[k].name, sizeof t[k].name, "rope_freqs.weight");
        t[k++].kind = GW_ROPE_FREQS;
    }
    uint64_t off = 0;
    size_t most = 0, most_row = 0;
    for (size_t i = 0; i < n_t; i++) {
        gw_shape(s, t[i].kind, &t[i].rows, &t[i].cols);
        gw_kind kd = t[i].kind;
        t[i].type = kd == GW_EMB || kd == GW_CLS ? s->emb_type
                    : kd == GW_RMS_ATT || kd == GW_RMS_FFN || kd == GW_RMS_FINAL ? s->norm_type
                    : kd == GW_ROPE_FREQS                                        ? GW_F32
                                                                                 : s->type;
        if (s->fallback && fitting(t[i].type, t[i].cols) != t[i].type) {
            t[i].type = fitting(t[i].type, t[i].cols);
            s->fell_back++;
        }
        size_t rb = gw_row_bytes(t[i].type, t[i].cols);
        if (!rb) {
            fail(err, cap, "%s: %zu columns are not whole blocks of type %u", t[i].name,
                 t[i].cols, t[i].type);
            free(t);
            return -1;
        }
        t[i].offset = off;
        t[i].bytes = (uint64_t)rb * t[i].rows;
        off += (t[i].bytes + ALIGN - 1) / ALIGN * ALIGN;
        most = t[i].rows * t[i].cols > most ? t[i].rows * t[i].cols : most;
        most_row = rb > most_row ? rb : most_row;
    }
    buf head = {0}, kv = {0};
    uint64_t n_kv = metadata(&kv, s);
    put(&head, "GGUF", 4);
    put_u32(&head, 3);
    put_u64(&head, n_t);
    put_u64(&head, n_kv);
    put(&head, kv.p, kv.n);
    for (size_t i = 0; i < n_t; i++) {
        int norm = t[i].rows == 1;
        put_str(&head, t[i].name, strlen(t[i].name));
        put_u32(&head, norm ? 1 : 2);
        put_u64(&head, t[i].cols);
        if (!norm)
            put_u64(&head, t[i].rows);
        put_u32(&head, t[i].type);
        put_u64(&head, t[i].offset);
    }
    static const unsigned char zeros[ALIGN] = {0};
    put(&head, zeros, (ALIGN - head.n % ALIGN) % ALIGN);
    free(kv.p);
    float *vals = malloc(most ? most * sizeof *vals : 1);
    unsigned char *row = malloc(most_row);
    int rc = head.oom || kv.oom || !vals || !row ? fail(err, cap, "out of memory") : 0;
    if (rc == 0 && write_all(f, head.p, head.n) != 0)
        rc = fail(err, cap, "write failed");
    for (size_t i = 0; rc == 0 && i < n_t; i++) {
        rc = write_tensor(f, src, user, s->rope_freqs, t[i].kind, t[i].layer, t[i].rows,
                          t[i].cols, t[i].type, vals, row, err, cap);
        size_t pad = (size_t)((ALIGN - t[i].bytes % ALIGN) % ALIGN);
        if (rc == 0 && write_all(f, zeros, pad) != 0)
            rc = fail(err, cap, "write failed");
    }
    free(head.p);
    free(vals);
    free(row);
    free(t);
    return rc;
}

/* ---- llama2.c ---- */

static int put_i32s(FILE *f, const int32_t *v, size_t n)
{
    buf b = {0};
    for (size_t i = 0; i < n; i++)
        put_u32(&b, (uint32_t)v[i]);
    int rc = b.oom || write_all(f, b.p, b.n) != 0 ? -1 : 0;
    free(b.p);
    return rc;
}

/* Tensor `kind` of every layer (or the single one), float32 or version-2
 * int8 groups. */
static int put_all(FILE *f, const gw_spec *s, gw_kind kind, int per_layer, int group,
                   gw_source src, void *user, float *vals, char *err, size_t cap)
{
    size_t rows, cols;
    gw_shape(s, kind, &rows, &cols);
    size_t n = rows * cols;
    for (int l = 0; l < (per_layer ? s->layers : 1); l++) {
        if (src(user, kind, l, vals) != 0)
            return fail(err, cap, "the source failed on tensor %d of layer %d", (int)kind, l);
        if (!group) {
            if (write_all(f, vals, n * sizeof *vals) != 0)
                return fail(err, cap, "write failed");
            continue;
        }
        unsigned char *q = malloc(n);
        float *sc = malloc(n / (size_t)group * sizeof *sc);
        int rc = q && sc ? 0 : fail(err, cap, "out of memory");
        for (size_t g = 0; rc == 0 && q && sc && g < n / (size_t)group; g++) {
            float wmax = 0;
            for (size_t j = g * group; j < (g + 1) * (size_t)group; j++)
                wmax = fabsf(vals[j]) > wmax ? fabsf(vals[j]) : wmax;
            sc[g] = wmax / 127.0f;
            for (size_t j = g * group; j < (g + 1) * (size_t)group; j++)
                q[j] = (unsigned char)(int8_t)(sc[g] > 0 ? nearbyintf(vals[j] / sc[g]) : 0);
        }
        if (rc == 0 && (write_all(f, q, n) != 0 || write_all(f, sc, n / (size_t)group * 4) != 0))
            rc = fail(err, cap, "write failed");
        free(q);
        free(sc);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int gw_write_llama2c(FILE *f, const gw_spec *s, int version, int group, gw_source src, void *user,
                     char *err, size_t cap)
{
    if (check_spec(s, err, cap) != 0)
        return -1;
    if (version < 0 || version > 2 ||
        (version == 2 && (group <= 0 || s->dim % group || s->hidden % group)))
        return fail(err, cap, "llama2.c version %d with group %d (version 2 needs a group that "
                    "divides dim and hidden)", version, group);
    size_t most = 0;
    for (int k = 0; k < GW_KINDS; k++) {
        size_t r, c;
        gw_shape(s, (gw_kind)k, &r, &c);
        most = r * c > most ? r * c : most;
    }
    float *vals = malloc(most * sizeof *vals);
    if (!vals)
        return fail(err, cap, "out of memory");
    int32_t p[7] = {s->dim, s->hidden, s->layers, s->heads, s->kv_heads, s->vocab, s->seq_len};
    int rc = 0;
    if (version == 0) {
        if (!s->shared)
            p[5] = -p[5];
        rc = put_i32s(f, p, 7);
        static const gw_kind order[] = {GW_EMB, GW_RMS_ATT, GW_WQ, GW_WK, GW_WV, GW_WO,
                                        GW_RMS_FFN, GW_W1, GW_W2, GW_W3, GW_RMS_FINAL};
        for (size_t i = 0; rc == 0 && i < sizeof order / sizeof order[0]; i++)
            rc = put_all(f, s, order[i], order[i] != GW_EMB && order[i] != GW_RMS_FINAL, 0, src,
                         user, vals, err, cap);
        /* run.c's rotary tables, cos then sin of pos * freq_j (never read back) */
        size_t S = (size_t)(s->dim / s->heads), T = (size_t)s->seq_len;
        for (int part = 0; rc == 0 && part < 2; part++)
            for (size_t t = 0; rc == 0 && t < T; t++) {
                for (size_t j = 0; j < S / 2; j++) {
                    float a = (float)t * (1.0f / powf(10000.0f, (float)(2 * j) / (float)S));
                    vals[j] = part ? sinf(a) : cosf(a);
                }
                rc = write_all(f, vals, S / 2 * sizeof *vals) ? fail(err, cap, "write failed") : 0;
            }
    } else {
        int32_t magic_version[2] = {0x616b3432, version};
        unsigned char head[256] = {0};
        rc = put_i32s(f, magic_version, 2) || put_i32s(f, p, 7) ? -1 : 0;
        head[0] = (unsigned char)s->shared;
        size_t used = 1;
        if (version == 2) {
            head[1] = (unsigned char)group;
            head[2] = (unsigned char)(group >> 8);
            head[3] = (unsigned char)(group >> 16);
            head[4] = (unsigned char)(group >> 24);
            used = 5;
        }
        if (rc == 0)
            rc = write_all(f, head, 256 - 36) ? fail(err, cap, "write failed") : 0;
        (void)used;
        static const gw_kind norms[] = {GW_RMS_ATT, GW_RMS_FFN, GW_RMS_FINAL};
        for (size_t i = 0; rc == 0 && i < 3; i++)
            rc = put_all(f, s, norms[i], norms[i] != GW_RMS_FINAL, 0, src, user, vals, err, cap);
        static const gw_kind mats[] = {GW_EMB, GW_WQ, GW_WK, GW_WV, GW_WO, GW_W1, GW_W2, GW_W3};
        for (size_t i = 0; rc == 0 && i < sizeof mats / sizeof mats[0]; i++)
            rc = put_all(f, s, mats[i], mats[i] != GW_EMB, version == 2 ? group : 0, src, user,
                         vals, err, cap);
    }
    if (rc == 0 && !s->shared)
        rc = put_all(f, s, GW_CLS, 0, version == 2 ? group : 0, src, user, vals, err, cap);
    free(vals);
    if (rc != 0 && err && !err[0])
        fail(err, cap, "write failed");
    return rc;
}
