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
    case LM_Q8_0: return 32;
    case LM_Q4_K:
    case LM_Q6_K: return 256;
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
    case LM_Q8_0: return 2 + 32;
    case LM_Q4_K: return 2 + 2 + 12 + 128;
    case LM_Q6_K: return 128 + 64 + 16 + 2;
    default: return 0;
    }
}

static float bits_to_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
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

/* One block of a GGUF type at b into y (its 32 or 256 values). */
static void dequant_block(lm_dtype type, const unsigned char *b, float *y)
{
    switch (type) {
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
