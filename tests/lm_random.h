/*
 * lm_random.h - random matrices of every weight type the decoder reads, for
 * the kernel and batch tests: random block bytes (every nibble, bit and
 * code), with each block's float16 scales drawn finite and of a chosen
 * size, so products stay finite. For a (type, shape, shift, generator
 * state) the bytes are the same on every run (fx_next).
 */
#ifndef KVE_LM_RANDOM_H
#define KVE_LM_RANDOM_H

#include "lm.h"
#include "lm_fixture.h"

#include <stdlib.h>
#include <string.h>

static inline uint32_t lr_next(uint64_t *rng)
{
    return (uint32_t)(fx_next(rng) >> 32);
}

/* A random finite float16 scale of magnitude about 2^(-9 - shift) ..
 * 2^(-2 - shift), either sign (shift <= 5). */
static inline uint16_t lr_f16_scale(uint64_t *rng, int shift)
{
    uint16_t e = (uint16_t)(6 - shift + (int)(lr_next(rng) % 8)), m = (uint16_t)(lr_next(rng) & 0x3ff);
    return (uint16_t)((lr_next(rng) & 0x8000u) | (uint16_t)(e << 10) | m);
}

static inline void lr_put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

/* A random matrix of `type` (rows, cols): its bytes in *data (free()), and
 * for LM_I8G its scales in *scales (free(); NULL for the others). Scales
 * and float values 2^-shift times test_lm_matvec's (F16 2^-1 .. 2^7, F32
 * and BF16 within 1 and 2, block scales 2^-9 .. 2^-2). */
static inline lm_matrix lr_matrix(uint64_t *rng, lm_dtype type, size_t rows, size_t cols,
                                  size_t group, int shift, unsigned char **data,
                                  unsigned char **scales)
{
    size_t bs = lm_dtype_block(type), bb = lm_dtype_block_bytes(type);
    size_t row_bytes = cols / bs * bb, n = rows * row_bytes;
    unsigned char *p = malloc(n ? n : 1);
    const double mag = 1.0 / (double)(1u << shift);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)lr_next(rng);
    *scales = NULL;
    for (size_t b = 0; b < n / bb; b++) {
        unsigned char *blk = p + b * bb;
        switch (type) {
        case LM_F32: {
            float f = fx_uniform(rng, mag);
            memcpy(blk, &f, 4);
            break;
        }
        case LM_F16:
            lr_put16(blk, (uint16_t)(lr_f16_scale(rng, shift) + 0x2000u));
            break;
        case LM_BF16: {
            float f = fx_uniform(rng, 2.0 * mag);
            uint32_t u;
            memcpy(&u, &f, 4);
            lr_put16(blk, (uint16_t)(u >> 16));
            break;
        }
        case LM_Q8_0:
        case LM_Q4_0:
        case LM_Q4_1:
        case LM_Q5_0:
        case LM_Q5_1:
        case LM_Q4_K:
        case LM_Q5_K:
        case LM_IQ4_NL:
        case LM_IQ4_XS: lr_put16(blk, lr_f16_scale(rng, shift)); break;
        case LM_Q6_K: lr_put16(blk + 208, lr_f16_scale(rng, shift)); break;
        case LM_Q2_K: lr_put16(blk + 80, lr_f16_scale(rng, shift)); break;
        case LM_Q3_K: lr_put16(blk + 108, lr_f16_scale(rng, shift)); break;
        default: break;
        }
        /* the second scale (of the mins) */
        if (type == LM_Q4_K || type == LM_Q5_K || type == LM_Q4_1 || type == LM_Q5_1)
            lr_put16(blk + 2, lr_f16_scale(rng, shift));
        if (type == LM_Q2_K)
            lr_put16(blk + 82, lr_f16_scale(rng, shift));
    }
    if (type == LM_I8G) {
        size_t ns = rows * cols / group;
        *scales = malloc(4 * ns + 1); /* one byte on: scales at any alignment */
        for (size_t i = 0; i < ns; i++) {
            float s = (float)(lr_next(rng) % 1000 + 1) * 1e-4f * (float)mag;
            memcpy(*scales + 1 + 4 * i, &s, 4);
        }
    }
    *data = p;
    return (lm_matrix){.data = p, .scales = *scales ? *scales + 1 : NULL, .type = type,
                       .rows = rows, .cols = cols, .row_bytes = row_bytes, .group = group};
}

#endif /* KVE_LM_RANDOM_H */
