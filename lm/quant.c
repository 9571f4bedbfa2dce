/* SPDX-License-Identifier: MIT */
/*
 * quant.c - the weight types: their names, block sizes, the float16 and
 * bfloat16 widenings, and the dequantization of a row (the definition every
 * matrix kernel of matvec.c equals).
 *
 * Invariants: block layouts and dequantization are ggml's (ggml-common.h,
 * ggml-quants.c's dequantize_row_*): the same operations on the same
 * operands in the same order, float32, no fused multiply-add (lm/ is built
 * with -ffp-contract=off), so a dequantized value is the bits ggml's
 * reference gives. Multi-byte fields are read byte by byte (little endian),
 * so no block needs any alignment. Nothing here allocates or fails: the
 * loaders have checked every size before a matrix exists.
 */
#include "lm.h"

#include <math.h>
#include <string.h>

/* Every ggml type id up to 39 by name (ggml.h's enum ggml_type), for
 * messages that name a type the decoder does not read. */
static const char *const ggml_names[] = {
    "F32",     "F16",    "Q4_0",   "Q4_1",    "Q4_2",  "Q4_3",   "Q5_0",   "Q5_1",
    "Q8_0",    "Q8_1",   "Q2_K",   "Q3_K",    "Q4_K",  "Q5_K",   "Q6_K",   "Q8_K",
    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",  "IQ4_NL", "IQ3_S", "IQ2_S",  "IQ4_XS",
    "I8",      "I16",    "I32",    "I64",     "F64",   "IQ1_M",  "BF16",   "Q4_0_4_4",
    "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8",
    "MXFP4"};

const char *lm_dtype_name(uint32_t type)
{
    if (type == LM_I8G)
        return "I8G";
    return type < sizeof ggml_names / sizeof ggml_names[0] ? ggml_names[type] : "unknown";
}

size_t lm_dtype_block(lm_dtype type)
{
    switch (type) {
    case LM_F32:
    case LM_F16:
    case LM_BF16:
    case LM_I8G: return 1;
    case LM_Q4_0:
    case LM_Q4_1:
    case LM_Q5_0:
    case LM_Q5_1:
    case LM_Q8_0:
    case LM_IQ4_NL: return 32;
    case LM_Q2_K:
    case LM_Q3_K:
    case LM_Q4_K:
    case LM_Q5_K:
    case LM_Q6_K:
    case LM_IQ4_XS: return 256;
    default: return 0;
    }
}

size_t lm_dtype_block_bytes(lm_dtype type)
{
    switch (type) {
    case LM_F32: return 4;
    case LM_F16:
    case LM_BF16: return 2;
    case LM_I8G: return 1;
    case LM_Q4_0: return 2 + 16;
    case LM_Q4_1: return 2 + 2 + 16;
    case LM_Q5_0: return 2 + 4 + 16;
    case LM_Q5_1: return 2 + 2 + 4 + 16;
    case LM_Q8_0: return 2 + 32;
    case LM_IQ4_NL: return 2 + 16;
    case LM_Q2_K: return 16 + 64 + 2 + 2;
    case LM_Q3_K: return 32 + 64 + 12 + 2;
    case LM_Q4_K: return 2 + 2 + 12 + 128;
    case LM_Q5_K: return 2 + 2 + 12 + 32 + 128;
    case LM_Q6_K: return 128 + 64 + 16 + 2;
    case LM_IQ4_XS: return 2 + 2 + 4 + 128;
    default: return 0;
    }
}

static float bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t lm_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: a quiet one, the sign kept */
        return sign | 0x7e00;
    if (ax >= 0x477ff000u) /* 65520 and above round to infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half, f * 2^24 rounded */
        float a;
        memcpy(&a, &ax, sizeof a);
        return sign | (uint16_t)lrintf(a * 16777216.0f); /* exact scaling; ties to even */
    }
    uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7fffffu) >> 13));
    const uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) /* ties to even; a carry */
        h++;                                             /* moves into the exponent */
    return sign | (uint16_t)h;
}

uint16_t lm_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet */
        return (uint16_t)((x >> 16) | 64);
    return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1))) >> 16);
}

float lm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) /* infinity, or NaN made quiet (as the hardware conversion does) */
        return bits_to_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0));
    if (exp != 0)
        return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
    float f = (float)mant * 0x1p-24f; /* zero or subnormal: exact */
    return sign ? -f : f;
}

float lm_bf16_to_f32(uint16_t h)
{
    return bits_to_float((uint32_t)h << 16);
}

/* ggml's kvalues_iq4nl: the 16 values an IQ4_NL or IQ4_XS nibble stands for. */
const int8_t lm__iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

/* The 32 5-bit values of a Q5_0 or Q5_1 block: element j < 16 the low
 * nibble of qs[j], j >= 16 the high nibble of qs[j - 16], and bit j of the
 * little-endian qh as its fifth bit. */
static void q5_values(const unsigned char *qh, const unsigned char *qs, int q[32])
{
    const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                       (uint32_t)qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0x0F) | (int)((h >> j) & 1u) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((h >> (j + 16)) & 1u) << 4;
    }
}

/* One block of a GGUF type at b into y (its 32 or 256 values). */
static void dequant_block(lm_dtype type, const unsigned char *b, float *y)
{
    switch (type) {
    case LM_Q4_1: {
        const float d = lm_f16_to_f32(lm__u16(b)), m = lm_f16_to_f32(lm__u16(b + 2));
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[4 + j] & 0x0F) * d + m;
            y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
        break;
    }
    case LM_Q5_0: {
        const float d = lm_f16_to_f32(lm__u16(b));
        int q[32];
        q5_values(b + 2, b + 6, q);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(q[j] - 16) * d;
        break;
    }
    case LM_Q5_1: {
        const float d = lm_f16_to_f32(lm__u16(b)), m = lm_f16_to_f32(lm__u16(b + 2));
        int q[32];
        q5_values(b + 4, b + 8, q);
        for (int j = 0; j < 32; j++)
            y[j] = (float)q[j] * d + m;
        break;
    }
    case LM_IQ4_NL: {
        const float d = lm_f16_to_f32(lm__u16(b));
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)lm__iq4nl_values[b[2 + j] & 0x0F];
            y[j + 16] = d * (float)lm__iq4nl_values[b[2 + j] >> 4];
        }
        break;
    }
    case LM_Q2_K: { /* scales 0..15, q 16..79, d 80, dmin 82 */
        const float d = lm_f16_to_f32(lm__u16(b + 80)), min = lm_f16_to_f32(lm__u16(b + 82));
        for (int e = 0; e < 256; e += 16) { /* 16 elements a scale */
            const unsigned sc = b[e / 16];
            const float dl = d * (float)(sc & 0xF), ml = min * (float)(sc >> 4);
            const unsigned char *q = b + 16 + (size_t)(32 * (e / 128) + e % 32);
            const int shift = 2 * ((e % 128) / 32);
            for (int l = 0; l < 16; l++)
                y[e + l] = dl * (float)((q[l] >> shift) & 3) - ml;
        }
        break;
    }
    case LM_Q3_K: { /* high bits 0..31, q 32..95, scales 96..107, d 108 */
        const float d = lm_f16_to_f32(lm__u16(b + 108));
        const unsigned char *hm = b, *sb = b + 96;
        for (int e = 0; e < 256; e += 16) {
            const int i = e / 16; /* the scale: 4 low bits, 2 high bits */
            const int lo = i < 8 ? sb[i] & 0xF : sb[i - 8] >> 4;
            const int sc = (lo | ((sb[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32;
            const float dl = d * (float)sc;
            const unsigned char *q = b + 32 + (size_t)(32 * (e / 128) + e % 32);
            const int shift = 2 * ((e % 128) / 32), bit = e / 32;
            for (int l = 0; l < 16; l++) {
                const int v = ((q[l] >> shift) & 3) - ((hm[e % 32 + l] >> bit) & 1 ? 0 : 4);
                y[e + l] = dl * (float)v;
            }
        }
        break;
    }
    case LM_Q5_K: { /* d 0, dmin 2, scales 4..15, high bits 16..47, nibbles 48..175 */
        const float d = lm_f16_to_f32(lm__u16(b)), min = lm_f16_to_f32(lm__u16(b + 2));
        const unsigned char *qh = b + 16;
        for (int j = 0; j < 8; j++) { /* sub-block j: pair j / 2, low nibbles when even */
            unsigned sc, m;
            lm__scale_min_k4(j, b + 4, &sc, &m);
            const float d1 = d * (float)sc, m1 = min * (float)m;
            const unsigned char *ql = b + 48 + (size_t)(32 * (j / 2));
            for (int l = 0; l < 32; l++) {
                const int q = (j % 2 ? ql[l] >> 4 : ql[l] & 0xF) + ((qh[l] >> j) & 1 ? 16 : 0);
                y[32 * j + l] = d1 * (float)q - m1;
            }
        }
        break;
    }
    case LM_IQ4_XS: { /* d 0, high scale bits 2, low scale nibbles 4..7, nibbles 8..135 */
        const float d = lm_f16_to_f32(lm__u16(b));
        const unsigned sh = lm__u16(b + 2);
        for (int ib = 0; ib < 8; ib++) {
            const int ls =
                ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (int)((sh >> (2 * ib)) & 3) << 4;
            const float dl = d * (float)(ls - 32);
            const unsigned char *qs = b + 8 + (size_t)(16 * ib);
            for (int j = 0; j < 16; j++) {
                y[32 * ib + j] = dl * (float)lm__iq4nl_values[qs[j] & 0xF];
                y[32 * ib + j + 16] = dl * (float)lm__iq4nl_values[qs[j] >> 4];
            }
        }
        break;
    }
    case LM_Q8_0: {
        const float d = lm_f16_to_f32(lm__u16(b));
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
        break;
    }
    case LM_Q4_0: {
        const float d = lm_f16_to_f32(lm__u16(b));
        for (int j = 0; j < 16; j++) {
            const int x0 = (b[2 + j] & 0x0F) - 8, x1 = (b[2 + j] >> 4) - 8;
            y[j] = (float)x0 * d;
            y[j + 16] = (float)x1 * d;
        }
        break;
    }
    case LM_Q4_K: {
        const float d = lm_f16_to_f32(lm__u16(b)), min = lm_f16_to_f32(lm__u16(b + 2));
        const unsigned char *scales = b + 4, *q = b + 16;
        for (int j = 0; j < 4; j++, q += 32) {
            unsigned sc, m;
            lm__scale_min_k4(2 * j, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = min * (float)m;
            lm__scale_min_k4(2 * j + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = min * (float)m;
            for (int l = 0; l < 32; l++)
                y[64 * j + l] = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++)
                y[64 * j + 32 + l] = d2 * (float)(q[l] >> 4) - m2;
        }
        break;
    }
    case LM_Q6_K: {
        const float d = lm_f16_to_f32(lm__u16(b + 208));
        const unsigned char *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(const void *)(b + 192);
        for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[n + l] = d * (float)sc[is] * (float)q1;
                y[n + l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[n + l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[n + l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
        break;
    }
    default: break;
    }
}

void lm__dequant_span(const lm_matrix *w, size_t row, size_t start, size_t count, float *out)
{
    const unsigned char *r = (const unsigned char *)w->data + row * w->row_bytes;
    switch (w->type) {
    case LM_F32: memcpy(out, r + 4 * start, count * sizeof(float)); break;
    case LM_F16:
        for (size_t i = 0; i < count; i++)
            out[i] = lm_f16_to_f32(lm__u16(r + 2 * (start + i)));
        break;
    case LM_BF16:
        for (size_t i = 0; i < count; i++)
            out[i] = lm_bf16_to_f32(lm__u16(r + 2 * (start + i)));
        break;
    case LM_I8G:
        for (size_t i = 0; i < count; i++)
            out[i] = (float)(int8_t)r[start + i] * lm__i8g_scale(w, row * w->cols + start + i);
        break;
    default: {
        size_t bs = lm_dtype_block(w->type), bb = lm_dtype_block_bytes(w->type);
        for (size_t b = start / bs; b < (start + count) / bs; b++)
            dequant_block(w->type, r + b * bb, out + (b * bs - start));
    }
    }
}

void lm_matrix_row(const lm_matrix *w, size_t row, float *out)
{
    lm__dequant_span(w, row, 0, w->cols, out);
}
