/* SPDX-License-Identifier: MIT */
/*
 * test_lm_matvec.c - the decoder's weight types and matrix-vector products
 * (lm/quant.c, lm/matvec.c, lm/pool.c).
 *
 * - Dequantization of every type equals, bit for bit, the values numpy
 *   computes from ggml's published definitions (tests/fixtures/quant/,
 *   written by its make.py, independently of lm/); the types added later
 *   (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS) against values
 *   worked out by hand from ggml's definitions, a block each.
 * - Every vector kernel on every instruction set this machine has equals
 *   the plain reference bit for bit, on random matrices of every type
 *   (rows that are not a multiple of 4, row ranges that start anywhere,
 *   columns with a tail of fewer than 8).
 * - The float references are the float32 product (lm_matmul) over the
 *   dequantized weights, bit for bit; the integer ones (Q8_0, Q4_K,
 *   version-2 groups) stay within the bound that quantizing the input allows:
 *   |sum w x - result| <= sum over groups of d_x / 2 * sum |w| plus float
 *   rounding (2^-20 of sum |w x|), and the quantizer is held to its
 *   definition (round to nearest, |x - q d| <= d / 2, zeros, NaN).
 * - Products split over pools of 1 to 4 threads give the same bits.
 * Random data from the seed printed (replay with the seed as argument).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "lm.h"
#include "lm_check.h"
#include "lm_fixture.h"
#include "lm_random.h"

#include <math.h>

static uint64_t rng_state;

static void put16(unsigned char *p, uint16_t v)
{
    lr_put16(p, v);
}

/* A random matrix of `type` (rows, cols): its bytes in *data (free()), and
 * for LM_I8G its scales (lm_random.h at full size). */
static lm_matrix random_matrix(lm_dtype type, size_t rows, size_t cols, size_t group,
                               unsigned char **data, unsigned char **scales)
{
    return lr_matrix(&rng_state, type, rows, cols, group, 0, data, scales);
}

static float *random_x(size_t n)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = fx_uniform(&rng_state, 2.0);
    return x;
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

/* ---- dequantization against numpy ---- */

static void test_dequant_vectors(void)
{
    const char *src = getenv("KVE_SOURCE_DIR");
    char path[600];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/vectors.bin", src ? src : ".");
    size_t len;
    char *data = fx_slurp(path, &len);
    if (!data) {
        CHECK_FAIL_AT("cannot read %s (KVE_SOURCE_DIR=%s)", path, src ? src : "(unset)");
        return;
    }
    const unsigned char *p = (const unsigned char *)data;
    uint32_t count;
    memcpy(&count, p, 4);
    size_t off = 4, seen[31] = {0};
    for (uint32_t r = 0; r < count; r++) {
        uint32_t head[3];
        memcpy(head, p + off, sizeof head);
        off += sizeof head;
        lm_dtype type = (lm_dtype)head[0];
        size_t n = head[1], nbytes = head[2], bs = lm_dtype_block(type);
        ASSERT_TRUE(bs > 0 && n % bs == 0 && nbytes == n / bs * lm_dtype_block_bytes(type));
        ASSERT_TRUE(off + nbytes + 4 * n <= len);
        /* one row of n values */
        lm_matrix w = {.data = p + off, .type = type, .rows = 1, .cols = n, .row_bytes = nbytes};
        float *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
        memcpy(want, p + off + nbytes, 4 * n);
        lm_matrix_row(&w, 0, got);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += memcmp(&got[i], &want[i], 4) != 0;
        if (bad)
            CHECK_FAIL_AT("%s: %zu of %zu values differ from numpy's", lm_dtype_name(type), bad, n);
        seen[type <= 30 ? type : 0]++;
        free(got);
        free(want);
        off += nbytes + 4 * n;
    }
    ASSERT_TRUE(off == len);
    lm_dtype all[] = {LM_F32, LM_F16, LM_BF16, LM_Q8_0, LM_Q4_0, LM_Q4_K, LM_Q6_K};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ASSERT_TRUE(seen[all[i]] == 1);
    free(data);
}

static void test_f16_bf16(void)
{
    /* Every float16 pattern: exact (compared through double), NaN kept NaN. */
    for (uint32_t h = 0; h < 65536; h++) {
        int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float f = lm_f16_to_f32((uint16_t)h);
        if (e == 31) {
            ASSERT_TRUE(m ? isnan(f) : isinf(f) && (f < 0) == sign);
            continue;
        }
        double want = (e ? ldexp(1024 + m, e - 25) : ldexp(m, -24)) * (sign ? -1 : 1);
        if ((double)f != want || (signbit(f) != 0) != (sign != 0))
            CHECK_FAIL_AT("f16 0x%04x -> %.9g, want %.9g", h, (double)f, want);
    }
    float one = lm_bf16_to_f32(0x3f80), minus_two = lm_bf16_to_f32(0xc000);
    ASSERT_TRUE(one == 1.0f && minus_two == -2.0f);
    ASSERT_STR_EQ(lm_dtype_name(LM_Q4_K), "Q4_K");
    ASSERT_STR_EQ(lm_dtype_name(LM_Q5_K), "Q5_K");
    ASSERT_STR_EQ(lm_dtype_name(16), "IQ2_XXS");
    ASSERT_STR_EQ(lm_dtype_name(999), "unknown");
    ASSERT_TRUE(lm_dtype_block(LM_Q6_K) == 256 && lm_dtype_block_bytes(LM_Q6_K) == 210);
    ASSERT_TRUE(lm_dtype_block((lm_dtype)16) == 0 && lm_dtype_block_bytes((lm_dtype)16) == 0);
    ASSERT_TRUE(lm_dtype_block((lm_dtype)9) == 0); /* Q8_1: not a weight type */
    /* ggml's ids, names and sizeof(block_*) (ggml-common.h's static_asserts) */
    static const struct {
        lm_dtype type;
        const char *name;
        size_t block, bytes;
    } sizes[] = {{LM_Q4_1, "Q4_1", 32, 20},    {LM_Q5_0, "Q5_0", 32, 22},
                 {LM_Q5_1, "Q5_1", 32, 24},    {LM_Q2_K, "Q2_K", 256, 84},
                 {LM_Q3_K, "Q3_K", 256, 110},  {LM_Q5_K, "Q5_K", 256, 176},
                 {LM_IQ4_NL, "IQ4_NL", 32, 18}, {LM_IQ4_XS, "IQ4_XS", 256, 136}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ASSERT_STR_EQ(lm_dtype_name(sizes[i].type), sizes[i].name);
        ASSERT_TRUE(lm_dtype_block(sizes[i].type) == sizes[i].block);
        ASSERT_TRUE(lm_dtype_block_bytes(sizes[i].type) == sizes[i].bytes);
    }
}

/* One hand-built block per type added after the numpy fixtures, and a few
 * of its values worked out by hand from ggml's dequantize_row_* (the float16
 * scales powers of two, so every value is exact): a nibble, bit or scale
 * read from the wrong place fails. */
typedef struct deq_case {
    size_t e;   /* element of the block */
    float want; /* its value */
} deq_case;

static void check_block(lm_dtype type, const unsigned char *b, const deq_case *c, size_t n)
{
    float y[256];
    lm_matrix w = {.data = b, .type = type, .rows = 1, .cols = lm_dtype_block(type),
                   .row_bytes = lm_dtype_block_bytes(type)};
    lm_matrix_row(&w, 0, y);
    for (size_t i = 0; i < n; i++)
        if (y[c[i].e] != c[i].want)
            CHECK_FAIL_AT("%s element %zu: %.9g, want %.9g", lm_dtype_name(type), c[i].e,
                          (double)y[c[i].e], (double)c[i].want);
}

#define DEQ(TYPE, ...)                                                                            \
    do {                                                                                          \
        static const deq_case cases[] = {__VA_ARGS__};                                            \
        check_block(TYPE, b, cases, sizeof cases / sizeof cases[0]);                              \
    } while (0)

static void test_dequant_by_hand(void)
{
    unsigned char b[256];
    /* Q4_1: d 0.5, m -1; byte 3 = 0xA5: element 3 = 5 d + m, 19 = 10 d + m */
    memset(b, 0, sizeof b);
    put16(b, 0x3800), put16(b + 2, 0xBC00), b[4 + 3] = 0xA5;
    DEQ(LM_Q4_1, {3, 1.5f}, {19, 4.0f}, {0, -1.0f});
    /* Q5_0: d 2; qh bits 3 and 17; qs[1] = 0x7F, qs[3] = 0x21 */
    memset(b, 0, sizeof b);
    put16(b, 0x4000), b[2] = 0x08, b[4] = 0x02, b[6 + 1] = 0x7F, b[6 + 3] = 0x21;
    DEQ(LM_Q5_0, {3, 2.0f}, {19, -28.0f}, {17, 14.0f}, {1, -2.0f}, {0, -32.0f});
    /* Q5_1: d 1, m 0.5; qh bit 31; qs[15] = 0x3C */
    memset(b, 0, sizeof b);
    put16(b, 0x3C00), put16(b + 2, 0x3800), b[4 + 3] = 0x80, b[8 + 15] = 0x3C;
    DEQ(LM_Q5_1, {15, 12.5f}, {31, 19.5f}, {30, 0.5f});
    /* IQ4_NL: d 0.5; qs[0] = 0xF0: kvalues[0] = -127, kvalues[15] = 113;
     * qs[9] = 0x98: kvalues[8] = 1, kvalues[9] = 13 */
    memset(b, 0, sizeof b);
    put16(b, 0x3800), b[2] = 0xF0, b[2 + 9] = 0x98;
    DEQ(LM_IQ4_NL, {0, -63.5f}, {16, 56.5f}, {9, 0.5f}, {25, 6.5f});
    /* Q2_K: d 1, dmin 0.5 (bytes 80, 82). Element 213: half 1, shift 4,
     * byte 32 + 21 of qs, scale 13; element 37: half 0, shift 2, qs[5],
     * scale 2; element 0: qs[0], scale 0. */
    memset(b, 0, sizeof b);
    put16(b + 80, 0x3C00), put16(b + 82, 0x3800);
    b[13] = 0x37, b[16 + 53] = 0x20;   /* sc 7, m 3; q 2: 7 * 2 - 1.5 */
    b[2] = 0x04, b[16 + 5] = 0x0C;     /* sc 4, m 0; q 3 */
    b[0] = 0x21, b[16 + 0] = 0x03;     /* sc 1, m 2; q 3: 3 - 1 */
    DEQ(LM_Q2_K, {213, 12.5f}, {37, 12.0f}, {0, 2.0f}, {16, 0.0f});
    /* Q3_K: d 0.5 (byte 108). Element 200: scale 12 = the high nibble of
     * scale byte 4 (5) and bits 6..7 of byte 8 (2): 37 - 32; its high bit
     * bit 6 of hmask[8] set; qs[40] >> 4 & 3 = 3: 0.5 * 5 * 3. Element 201:
     * high bit clear, q 1: 2.5 * (1 - 4). Element 0: scale 0 - 32, q 0 - 4. */
    memset(b, 0, sizeof b);
    put16(b + 108, 0x3800);
    b[96 + 4] = 0x50, b[96 + 8] = 0x80, b[8] = 0x40, b[32 + 40] = 0x30, b[32 + 41] = 0x10;
    DEQ(LM_Q3_K, {200, 7.5f}, {201, -7.5f}, {0, 64.0f});
    /* Q5_K: d 1, dmin 1. Element 167: sub-block 5 (sc 3 | 1 << 4 = 19 from
     * scale bytes 9 and 1, m 2), the high nibble of qs[64 + 7] (9), bit 5 of
     * qh[7]: 19 * 25 - 2. Element 0: sc 2, m 1, nibble 7: 13. */
    memset(b, 0, sizeof b);
    put16(b, 0x3C00), put16(b + 2, 0x3C00);
    b[4 + 9] = 0x23, b[4 + 1] = 0x40, b[48 + 64 + 7] = 0x90, b[16 + 7] = 0x20;
    b[4 + 0] = 0x02, b[4 + 4] = 0x01, b[48] = 0x07;
    DEQ(LM_Q5_K, {167, 473.0f}, {0, 13.0f}, {135, 0.0f});
    /* IQ4_XS: d 0.25. Sub-block 3: ls = the high nibble of scales_l[1] (7) |
     * bits 6..7 of scales_h (2) << 4 = 39, dl = 1.75; qs[48 + 2] = 0xE0:
     * element 114 kvalues[14] = 89, element 98 kvalues[0] = -127. Element 0:
     * ls 0, dl -8, kvalues[0]. */
    memset(b, 0, sizeof b);
    put16(b, 0x3400), put16(b + 2, 0x0080), b[4 + 1] = 0x70, b[8 + 48 + 2] = 0xE0;
    DEQ(LM_IQ4_XS, {114, 155.75f}, {98, -222.25f}, {0, 1016.0f});
}
#undef DEQ

/* ---- the quantized input ---- */

static void test_quantize(void)
{
    enum { N = 96 };
    float x[N];
    int8_t q[N];
    float d[3];
    for (int i = 0; i < N; i++)
        x[i] = fx_uniform(&rng_state, 3.0);
    for (int i = 32; i < 64; i++)
        x[i] = 0.0f;
    x[70] = NAN;
    lm_quantize_q8(x, N, 32, q, d);
    float amax = 0;
    for (int i = 0; i < 32; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    ASSERT_TRUE(d[0] == amax / 127.0f);
    for (int i = 0; i < 32; i++) {
        ASSERT_TRUE(q[i] == (int8_t)lrintf(x[i] / d[0]));
        ASSERT_TRUE(fabsf(x[i] - (float)q[i] * d[0]) <= 0.5f * d[0] * (1 + 1e-6f));
        if (fabsf(x[i]) == amax)
            ASSERT_TRUE(q[i] == 127 || q[i] == -127);
    }
    ASSERT_TRUE(d[1] == 0.0f);
    for (int i = 32; i < 64; i++)
        ASSERT_TRUE(q[i] == 0);
    ASSERT_TRUE(isnan(d[2]));
    for (int i = 64; i < 96; i++)
        ASSERT_TRUE(q[i] == 0);
    /* Ties go to the even integer (the vector conversion's rounding). */
    float t[4] = {127.0f, 0.5f, 1.5f, -2.5f};
    int8_t tq[4];
    float td;
    lm_quantize_q8(t, 4, 4, tq, &td);
    ASSERT_TRUE(td == 1.0f && tq[0] == 127 && tq[1] == 0 && tq[2] == 2 && tq[3] == -2);
}

/* ---- kernels against the reference ---- */

typedef struct shape {
    lm_dtype type;
    size_t rows, cols, group;
} shape;

static const shape shapes[] = {
    {LM_F32, 1, 1, 0},     {LM_F32, 5, 7, 0},       {LM_F32, 9, 37, 0},
    {LM_F32, 13, 264, 0},  {LM_F16, 3, 13, 0},      {LM_F16, 6, 300, 0},
    {LM_BF16, 7, 45, 0},   {LM_BF16, 4, 256, 0},    {LM_Q8_0, 1, 32, 0},
    {LM_Q8_0, 11, 160, 0}, {LM_Q4_0, 2, 32, 0},     {LM_Q4_0, 9, 224, 0},
    {LM_Q4_K, 1, 256, 0},  {LM_Q4_K, 7, 768, 0},    {LM_Q6_K, 1, 256, 0},
    {LM_Q6_K, 6, 512, 0},  {LM_I8G, 5, 64, 32},     {LM_I8G, 9, 192, 64},
    {LM_I8G, 3, 48, 16},   {LM_I8G, 4, 12, 4},      {LM_Q4_1, 1, 32, 0},
    {LM_Q4_1, 9, 288, 0},  {LM_Q5_0, 2, 32, 0},     {LM_Q5_0, 11, 544, 0},
    {LM_Q5_1, 1, 64, 0},   {LM_Q5_1, 10, 352, 0},   {LM_IQ4_NL, 3, 32, 0},
    {LM_IQ4_NL, 9, 800, 0}, {LM_Q2_K, 1, 256, 0},   {LM_Q2_K, 9, 768, 0},
    {LM_Q3_K, 1, 256, 0},  {LM_Q3_K, 7, 512, 0},    {LM_Q5_K, 2, 256, 0},
    {LM_Q5_K, 10, 768, 0}, {LM_IQ4_XS, 1, 256, 0},  {LM_IQ4_XS, 9, 512, 0},
};

/* Sum of |w| over group g of row r, and of |w x| over the row (double). */
static void row_norms(const float *w, const float *x, size_t cols, size_t group, double *gsum,
                      double *wx)
{
    *wx = 0;
    for (size_t g = 0; g < cols / group; g++) {
        gsum[g] = 0;
        for (size_t j = g * group; j < (g + 1) * group; j++) {
            gsum[g] += fabs((double)w[j]);
            *wx += fabs((double)w[j] * x[j]);
        }
    }
}

static void test_kernels(void)
{
    int isas = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        unsigned char *data, *scales;
        lm_matrix w = random_matrix(sh->type, sh->rows, sh->cols, sh->group, &data, &scales);
        float *x = random_x(sh->cols);
        size_t group = lm_matrix_q8_group(&w);
        int8_t *xq = malloc(sh->cols);
        float *xd = malloc((sh->cols / (group ? group : 1) + 1) * sizeof *xd);
        lm_q8 q8 = {xq, xd, group, 0, NULL};
        if (group)
            lm_quantize_q8(x, sh->cols, group, xq, xd);
        float *ref = malloc(sh->rows * sizeof *ref), *got = malloc(sh->rows * sizeof *got);
        lm_matvec_ref(&w, x, &q8, ref, 0, sh->rows);
        /* The reference is the float32 product over the dequantized weights
         * (float types), or within the quantization bound (integer ones). */
        float *deq = malloc(sh->rows * sh->cols * sizeof *deq), *f32 = malloc(sh->rows * 4);
        for (size_t r = 0; r < sh->rows; r++)
            lm_matrix_row(&w, r, deq + r * sh->cols);
        lm_matmul(f32, x, deq, sh->cols, sh->rows);
        if (!group) {
            if (!same_bits(ref, f32, sh->rows))
                CHECK_FAIL_AT("%s %zux%zu: the reference is not lm_matmul over the dequantized "
                              "weights", lm_dtype_name(sh->type), sh->rows, sh->cols);
        } else {
            double *gsum = malloc(sh->cols / group * sizeof *gsum);
            for (size_t r = 0; r < sh->rows; r++) {
                const float *wr = deq + r * sh->cols;
                double exact = 0, wx, bound = 0;
                for (size_t j = 0; j < sh->cols; j++)
                    exact += (double)wr[j] * x[j];
                row_norms(wr, x, sh->cols, group, gsum, &wx);
                for (size_t g = 0; g < sh->cols / group; g++)
                    bound += 0.5 * xd[g] * gsum[g] * (1 + 1e-6);
                bound += wx * 0x1p-20;
                if (!(fabs(ref[r] - exact) <= bound))
                    CHECK_FAIL_AT("%s row %zu: %.9g against %.9g, beyond the bound %.3g",
                                  lm_dtype_name(sh->type), r, (double)ref[r], exact, bound);
            }
            free(gsum);
        }
        /* Every instruction set, every start of a range. */
        for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
            if (!lm_isa_supported((lm_isa)isa))
                continue;
            isas |= 1 << isa;
            for (size_t r0 = 0; r0 < sh->rows; r0 += (sh->rows > 4 ? 3 : 1)) {
                memset(got, 0xff, sh->rows * sizeof *got);
                lm_matvec_rows(&w, x, &q8, got, r0, sh->rows, (lm_isa)isa);
                if (!same_bits(got, ref + r0, sh->rows - r0))
                    CHECK_FAIL_AT("%s %zux%zu, rows %zu..: %s differs from the reference",
                                  lm_dtype_name(sh->type), sh->rows, sh->cols, r0,
                                  lm_isa_name((lm_isa)isa));
            }
        }
        free(data), free(scales), free(x), free(xq), free(xd), free(ref), free(got);
        free(deq), free(f32);
    }
    printf("  instruction sets checked:");
    for (int isa = 0; isa < LM_ISA_COUNT; isa++)
        if (isas & (1 << isa))
            printf(" %s", lm_isa_name((lm_isa)isa));
    printf(" (active: %s)\n", lm_isa_name(lm_isa_active()));
    ASSERT_TRUE(isas & 1);
}

/* ---- llama.cpp's input (LM_PRODUCTS_LLAMA) ---- */

/* float32 to float16 and bfloat16: hand-worked roundings (ties to even,
 * the edge of the range, subnormals, NaN), then every finite 16-bit value
 * back to its own bits. */
static void test_llama_round(void)
{
    static const struct {
        float f;
        uint16_t h;
    } f16[] = {{1.0f, 0x3c00}, {-2.0f, 0xc000}, {65504.0f, 0x7bff}, {65519.0f, 0x7bff},
               {65520.0f, 0x7c00}, {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x3p-11f, 0x3c02},
               {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000}, {0x3p-25f, 0x0002}, {0x1p-14f, 0x0400},
               {-0.0f, 0x8000}, {INFINITY, 0x7c00}, {-INFINITY, 0xfc00}};
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++)
        if (lm_f32_to_f16(f16[i].f) != f16[i].h)
            CHECK_FAIL_AT("f16 of %a: %#06x, want %#06x", (double)f16[i].f,
                          (unsigned)lm_f32_to_f16(f16[i].f), (unsigned)f16[i].h);
    ASSERT_EQ(lm_f32_to_f16(NAN) & 0x7e00, 0x7e00); /* a quiet NaN */
    static const struct {
        float f;
        uint16_t h;
    } bf[] = {{1.0f, 0x3f80}, {1.0f + 0x1p-8f, 0x3f80}, {1.0f + 0x3p-8f, 0x3f82},
              {-3.0f, 0xc040}, {3.40282347e38f, 0x7f80}, {0x1p-140f, 0x0000}, {0x1p-133f, 0x0001}};
    for (size_t i = 0; i < sizeof bf / sizeof bf[0]; i++)
        if (lm_f32_to_bf16(bf[i].f) != bf[i].h)
            CHECK_FAIL_AT("bf16 of %a: %#06x, want %#06x", (double)bf[i].f,
                          (unsigned)lm_f32_to_bf16(bf[i].f), (unsigned)bf[i].h);
    ASSERT_EQ(lm_f32_to_bf16(NAN) & 0x7fc0, 0x7fc0);
    size_t f16_n = 0, f16_ok = 0, bf_n = 0, bf_ok = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (!((h & 0x7c00) == 0x7c00 && (h & 0x3ff))) /* not a float16 NaN */
            f16_n++, f16_ok += lm_f32_to_f16(lm_f16_to_f32((uint16_t)h)) == h;
        if (!((h & 0x7f80) == 0x7f80 && (h & 0x7f))) /* not a bfloat16 NaN */
            bf_n++, bf_ok += lm_f32_to_bf16(lm_bf16_to_f32((uint16_t)h)) == h;
    }
    ASSERT_EQ(f16_ok, f16_n);
    ASSERT_EQ(bf_ok, bf_n);
    ASSERT_EQ(f16_n, 65536 - 2 * 1023);
}

/* lm_f16_round_n and lm_f16_mad on every instruction set against the
 * scalar rounding, bit for bit: random bit patterns (every exponent, NaN
 * payloads, subnormals, overflow), values a hair from a float16 tie, and
 * lengths that leave a partial vector; and by hand, a multiply-add that
 * rounds to float16 otherwise when it is not fused (ggml's build fuses
 * every element, its leftover past the vectors too). */
static void test_llama_round_vectors(void)
{
    enum { N = 203 };
    float x[N], v[N], want[N], got[N];
    uint64_t st = 0x9e3779b97f4a7c15u;
    for (int trial = 0; trial < 64; trial++) {
        for (size_t i = 0; i < N; i++) {
            st = st * 6364136223846793005u + 1442695040888963407u;
            uint32_t b = (uint32_t)(st >> 32);
            if (trial % 2) /* near float16's range: ties and carries */
                b = (b & 0x8000ffffu) | (uint32_t)(0x33 + (st >> 20) % 16) << 23 | (b & 0x1000u);
            memcpy(&x[i], &b, 4);
            v[i] = (float)((double)(int32_t)(st >> 8) * 0x1p-30);
        }
        const float s = trial % 3 ? 0.37f : 1e30f;
        for (size_t n = 0; n <= N; n += trial % 2 ? 67 : 29) {
            for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
                if (!lm_isa_supported((lm_isa)isa) || !lm_isa_force((lm_isa)isa))
                    continue;
                for (size_t i = 0; i < n; i++)
                    want[i] = lm_f16_round(x[i]);
                memcpy(got, x, sizeof got);
                lm_f16_round_n(got, n);
                const int round_bad = memcmp(got, want, n * sizeof *got) != 0;
                for (size_t i = 0; i < n; i++) {
                    const float o = lm_f16_round(v[i] * 0.5f);
                    want[i] = lm_f16_round(fmaf(x[i], s, o));
                    got[i] = o;
                }
                lm_f16_mad(got, x, s, n);
                int mad_bad = memcmp(got, want, n * sizeof *got) != 0;
                /* 1 + (1 + 2^-16)(1 + 7 2^-16) 2^-11: fused, above float16's tie
                 * (1 + 2^-10); the product rounded first lands on it (1) */
                float one[N], vh[N];
                for (size_t i = 0; i < n; i++)
                    one[i] = 1.0f, vh[i] = 0x1.0001p+0f;
                lm_f16_mad(one, vh, 0x1.0007p-11f, n);
                for (size_t i = 0; i < n; i++)
                    mad_bad |= !(one[i] == 0x1.004p+0f);
                lm_isa_force(LM_ISA_COUNT); /* restored before a failure returns */
                if (round_bad || mad_bad)
                    CHECK_FAIL_AT("f16 %s of %zu: %s differs", round_bad ? "rounding" : "mad", n,
                                  lm_isa_name((lm_isa)isa));
            }
        }
    }
}

/* lm_llama_quantize's Q8_0 and Q8_K blocks on every instruction set against
 * the scalar path, bit for bit: random blocks, a block of zeros, one whose
 * largest magnitude comes twice with both signs (the first counts), one of
 * exact ties after scaling, one holding NaN and one an infinity. */
static void test_llama_quantize_vectors(void)
{
    enum { N = 2048 };
    float *x = malloc(N * sizeof *x), *xt[2], *d[2], *sm[2];
    int8_t *q[2];
    for (int v = 0; v < 2; v++) {
        xt[v] = malloc(N * sizeof(float)), d[v] = malloc(N / 32 * sizeof(float));
        sm[v] = malloc(N / 32 * sizeof(float)), q[v] = malloc(N);
    }
    for (int trial = 0; trial < 8; trial++) {
        for (size_t i = 0; i < N; i++)
            x[i] = fx_uniform(&rng_state, trial % 2 ? 1e-3 : 40.0);
        memset(x + 256, 0, 256 * sizeof *x); /* block 1: zeros */
        x[512 + 7] = 3.5f, x[512 + 9] = -3.5f, x[512 + 100] = 3.5f; /* block 2: ties of the max */
        for (size_t j = 0; j < 256; j++) /* block 3: -127 / m = 1: x * id lands on halves */
            x[768 + j] = j == 0 ? -127.0f : (float)((int)(j % 200) - 100) + 0.5f;
        x[1024 + 33] = trial % 3 ? NAN : INFINITY; /* block 4: not finite */
        x[1280 + 200] = -INFINITY;
        for (int kind = LM_IN_Q8_0; kind <= LM_IN_Q8_K; kind++) {
            for (int v = 0; v < 2; v++) {
                lm_isa isa = v ? LM_ISA_COUNT : LM_ISA_SCALAR;
                ASSERT_TRUE(lm_isa_force(isa));
                memset(sm[v], 0, N / 32 * sizeof(float));
                lm_llama_quantize((lm_llama_in)kind, x, N, xt[v], q[v], d[v], sm[v]);
            }
            lm_isa_force(LM_ISA_COUNT);
            if (memcmp(q[0], q[1], N) != 0 || memcmp(xt[0], xt[1], N * sizeof(float)) != 0 ||
                memcmp(d[0], d[1], N / 32 * sizeof(float)) != 0 ||
                memcmp(sm[0], sm[1], N / 32 * sizeof(float)) != 0)
                CHECK_FAIL_AT("llama quantize kind %d: %s differs from the scalar path", kind,
                              lm_isa_name(lm_isa_active()));
        }
    }
    free(x);
    for (int v = 0; v < 2; v++)
        free(xt[v]), free(d[v]), free(sm[v]), free(q[v]);
}

/* ggml_vec_dot_f16's order (lm_dot_f16, flash attention's scores) in every
 * variant of llama.cpp: every instruction set's path the scalar one's
 * bits, on float16 values of both signs and wide range (so the order
 * shows), y as floats and as float16 bits, lengths with and without
 * leftovers past the steps of 32 and 64. */
static void test_llama_dot_f16(void)
{
    enum { N = 200 };
    float x[N], y[N];
    unsigned char yh[2 * N];
    static const size_t lens[] = {0, 1, 31, 32, 33, 63, 64, 65, 96, 128, 130, 200};
    for (int trial = 0; trial < 50; trial++) {
        for (size_t i = 0; i < N; i++) {
            const double e = (double)(fx_next(&rng_state) % 24);
            x[i] = lm_f16_round((float)(fx_uniform(&rng_state, 1.0) * pow(2.0, e - 12.0)));
            y[i] = lm_f16_round(fx_uniform(&rng_state, 8.0));
            put16(yh + 2 * i, lm_f32_to_f16(y[i]));
        }
        for (int cpu = LM_LLAMA_CPU_AVX2; cpu < LM_LLAMA_CPU_COUNT; cpu++) {
            const lm_llama_cpu v = (lm_llama_cpu)cpu;
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                const size_t n = lens[li];
                ASSERT_TRUE(lm_isa_force(LM_ISA_SCALAR));
                const float want = lm_dot_f16(x, y, NULL, n, v);
                const float wanth = lm_dot_f16(x, NULL, yh, n, v);
                lm_isa_force(LM_ISA_COUNT);
                ASSERT_TRUE(memcmp(&want, &wanth, sizeof want) == 0);
                for (int isa = 1; isa < LM_ISA_COUNT; isa++) {
                    if (!lm_isa_supported((lm_isa)isa) || !lm_isa_force((lm_isa)isa))
                        continue;
                    const float got = lm_dot_f16(x, y, NULL, n, v);
                    const float goth = lm_dot_f16(x, NULL, yh, n, v);
                    lm_isa_force(LM_ISA_COUNT);
                    if (memcmp(&got, &want, sizeof got) != 0 ||
                        memcmp(&goth, &want, sizeof got) != 0)
                        CHECK_FAIL_AT("dot_f16 of %zu (%s): %s gives %a and %a, the scalar "
                                      "path %a", n, lm_llama_cpu_name(v),
                                      lm_isa_name((lm_isa)isa), (double)got, (double)goth,
                                      (double)want);
                }
            }
            /* a query against keys of S (lm_dot_f16_keys): each its own call's bits */
            static const size_t sizes[] = {32, 64, 80, 128};
            for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
                const size_t S = sizes[si], nk = N / S;
                float want[6], got[6];
                ASSERT_TRUE(lm_isa_force(LM_ISA_SCALAR));
                for (size_t i = 0; i < nk; i++)
                    want[i] = lm_dot_f16(x, y + i * S, NULL, S, v) * 0.125f;
                lm_isa_force(LM_ISA_COUNT);
                for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
                    if (!lm_isa_supported((lm_isa)isa) || !lm_isa_force((lm_isa)isa))
                        continue;
                    lm_dot_f16_keys(x, y, nk, S, 0.125f, v, got);
                    lm_isa_force(LM_ISA_COUNT);
                    if (memcmp(got, want, nk * sizeof *got) != 0)
                        CHECK_FAIL_AT("dot_f16 keys of %zu (%s): %s differs", S,
                                      lm_llama_cpu_name(v), lm_isa_name((lm_isa)isa));
                }
            }
        }
    }
}

/* llama.cpp's SwiGLU in every variant: every instruction set's path the
 * scalar one's bits, on values across exp's whole range (results that are
 * subnormal, 0 and infinite among them), NaN and the infinities, lengths
 * with leftovers past the groups of 8 and 16; the variants' exps tell apart
 * on these values; and values worked out by hand. */
static void test_llama_swiglu(void)
{
    enum { N = 517 };
    float h[N], g[N], want[N], got[N], first[N];
    size_t apart = 0;
    for (int trial = 0; trial < 40; trial++) {
        const double range = trial % 4 == 0 ? 300.0 : trial % 4 == 1 ? 110.0 : 8.0;
        for (size_t i = 0; i < N; i++)
            h[i] = fx_uniform(&rng_state, range), g[i] = fx_uniform(&rng_state, 4.0);
        if (trial == 0)
            h[3] = NAN, h[4] = INFINITY, h[5] = -INFINITY, h[6] = 0.0f, h[7] = -0.0f,
            h[N - 1] = NAN, h[17] = 88.7f, h[18] = -103.9f, h[19] = 192.5f, h[20] = -192.5f;
        for (int cpu = LM_LLAMA_CPU_AVX2; cpu < LM_LLAMA_CPU_COUNT; cpu++) {
            const lm_llama_cpu v = (lm_llama_cpu)cpu;
            for (size_t n = 0; n <= N; n += trial % 2 ? 97 : 41) {
                ASSERT_TRUE(lm_isa_force(LM_ISA_SCALAR));
                memcpy(want, h, sizeof want);
                lm_swiglu_llama(want, g, n, v);
                for (int isa = 1; isa < LM_ISA_COUNT; isa++) {
                    if (!lm_isa_supported((lm_isa)isa) || !lm_isa_force((lm_isa)isa))
                        continue;
                    memcpy(got, h, sizeof got);
                    lm_swiglu_llama(got, g, n, v);
                    lm_isa_force(LM_ISA_COUNT); /* restored before a failure returns */
                    for (size_t i = 0; i < n; i++)
                        if (memcmp(&got[i], &want[i], sizeof got[i]) != 0 &&
                            !(isnan(got[i]) && isnan(want[i])))
                            CHECK_FAIL_AT("swiglu of %zu (%s): %s gives %a for %a, the scalar "
                                          "path %a", n, lm_llama_cpu_name(v),
                                          lm_isa_name((lm_isa)isa), (double)got[i],
                                          (double)h[i], (double)want[i]);
                }
                lm_isa_force(LM_ISA_COUNT);
            }
            /* the whole length: AVX2's exp against the AVX-512 ones' */
            memcpy(got, h, sizeof got);
            lm_swiglu_llama(got, g, N, v);
            if (cpu == LM_LLAMA_CPU_AVX2)
                memcpy(first, got, sizeof got);
            else
                for (size_t i = 0; i < N; i++)
                    apart += memcmp(&got[i], &first[i], sizeof got[i]) != 0 && !isnan(got[i]);
        }
    }
    ASSERT_TRUE(apart > 0);
    /* silu(0) * g = 0; silu(x) for x far below exp's range: x / (1 + inf) = -0 */
    for (int cpu = LM_LLAMA_CPU_AVX2; cpu < LM_LLAMA_CPU_COUNT; cpu++) {
        float hh[16] = {0}, gg[16];
        for (size_t i = 0; i < 16; i++)
            gg[i] = 2.0f;
        hh[1] = -200.0f;
        hh[2] = 200.0f; /* exp(-200) = 0 there: 200 / 1 * 2 */
        lm_swiglu_llama(hh, gg, 16, (lm_llama_cpu)cpu);
        ASSERT_TRUE(hh[0] == 0.0f && hh[1] == 0.0f && signbit(hh[1]) && hh[2] == 400.0f);
    }
}

/* Q8_0 and Q8_K blocks worked by hand: llama.cpp's scale and signs. */
static void test_llama_quantize(void)
{
    float x[256], xt[256], d[8];
    int8_t q[256];
    /* Q8_0, amax 127: d = 1, q = x rounded, ties to even */
    static const float tie[8] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 126.5f, -127.0f, 127.0f};
    static const int8_t tq[8] = {0, 2, 2, 0, -2, 126, -127, 127};
    for (size_t j = 0; j < 32; j++)
        x[j] = j < 8 ? tie[j] : 0.0f;
    /* a second block of amax 1: d = float16(1 / 127) = 0x2008, 0.5 -> 63.5 -> 64 */
    for (size_t j = 32; j < 64; j++)
        x[j] = j == 32 ? 1.0f : j == 33 ? 0.5f : j == 34 ? -1.0f : 0.0f;
    lm_llama_quantize(LM_IN_Q8_0, x, 64, xt, q, d, NULL);
    ASSERT_TRUE(d[0] == 1.0f);
    for (size_t j = 0; j < 8; j++)
        ASSERT_EQ(q[j], tq[j]);
    ASSERT_TRUE(d[1] == lm_f16_to_f32(0x2008));
    ASSERT_EQ(q[32], 127);
    ASSERT_EQ(q[33], 64);
    ASSERT_EQ(q[34], -127);
    ASSERT_TRUE(xt[33] == 64.0f * lm_f16_to_f32(0x2008));
    /* a zero block; a block holding NaN */
    for (size_t j = 0; j < 64; j++)
        x[j] = j == 40 ? NAN : 0.0f;
    lm_llama_quantize(LM_IN_Q8_0, x, 64, xt, q, d, NULL);
    ASSERT_TRUE(d[0] == 0.0f && q[5] == 0 && xt[5] == 0.0f);
    ASSERT_TRUE(d[1] != d[1] && xt[33] != xt[33] && q[33] == 0);
    /* Q8_K: the entry of largest magnitude sets the sign: -2 -> scale 63.5,
     * d = 1 / 63.5; a positive maximum 4 makes the scale negative and its
     * own q -127 */
    for (size_t j = 0; j < 256; j++)
        x[j] = 0.0f;
    x[5] = -2.0f, x[6] = 1.0f, x[7] = -1.0f;
    lm_llama_quantize(LM_IN_Q8_K, x, 256, xt, q, d, NULL);
    ASSERT_EQ(q[5], -127);
    ASSERT_EQ(q[6], 64); /* 63.5, to even */
    ASSERT_EQ(q[7], -64);
    for (size_t g = 0; g < 8; g++)
        ASSERT_TRUE(d[g] == 1.0f / 63.5f);
    x[5] = 0.0f, x[0] = 4.0f;
    lm_llama_quantize(LM_IN_Q8_K, x, 256, xt, q, d, NULL);
    ASSERT_EQ(q[0], -127);
    ASSERT_TRUE(d[0] < 0.0f && fabsf(xt[0] - 4.0f) < 1e-6f);
    ASSERT_EQ(q[6], -32); /* 1 * -31.75, to -32 */
    /* F16 and BF16 inputs: each value rounded */
    x[0] = 1.0f + 0x3p-11f, x[1] = 1.0f + 0x3p-8f;
    lm_llama_quantize(LM_IN_F16, x, 2, xt, q, d, NULL);
    ASSERT_TRUE(xt[0] == 1.0f + 0x1p-9f);
    lm_llama_quantize(LM_IN_BF16, x, 2, xt, q, d, NULL);
    ASSERT_TRUE(xt[1] == 1.0f + 0x1p-6f);
    ASSERT_EQ((int)lm_llama_input(LM_Q4_1), (int)LM_IN_Q8_0);
    ASSERT_EQ((int)lm_llama_input(LM_IQ4_XS), (int)LM_IN_Q8_K);
    ASSERT_EQ((int)lm_llama_input(LM_F32), (int)LM_IN_F32);
    ASSERT_EQ((int)lm_llama_input(LM_I8G), (int)LM_IN_NATIVE);
}

/* Q8_0 rows summed as ggml_vec_dot_q8_0_q8_0: a row worked by hand, then
 * every instruction set's path equal to the reference, bit for bit. */
static void test_llama_q8_0(void)
{
    unsigned char row[34];
    put16(row, 0x3c00); /* d = 1, q = 1 */
    memset(row + 2, 1, 32);
    int8_t xq[512];
    float xd[16];
    for (size_t j = 0; j < 32; j++)
        xq[j] = (int8_t)(j + 1);
    xd[0] = 0.5f;
    lm_matrix w1 = {.data = row, .type = LM_Q8_0, .rows = 1, .cols = 32, .row_bytes = 34};
    lm_q8 q1 = {xq, xd, 32, LM_LLAMA_CPU_AVX2, NULL};
    float out = 0;
    lm_matvec_ref(&w1, NULL, &q1, &out, 0, 1);
    ASSERT_TRUE(out == 264.0f); /* 0.5 * (1 + ... + 32) */
    unsigned char *data, *scales;
    lm_matrix w = random_matrix(LM_Q8_0, 37, 512, 0, &data, &scales);
    float *x = random_x(512), xt[512], *ref = malloc(37 * sizeof *ref), *got = malloc(37 * 4);
    lm_llama_quantize(LM_IN_Q8_0, x, 512, xt, xq, xd, NULL);
    lm_q8 q8 = {xq, xd, 32, LM_LLAMA_CPU_AVX2, NULL}, plain = {xq, xd, 32, 0, NULL};
    lm_matvec_ref(&w, xt, &q8, ref, 0, 37);
    lm_matvec_ref(&w, xt, &plain, got, 0, 37);
    size_t moved = 0; /* the fused order is another arithmetic: some row moves */
    for (size_t r = 0; r < 37; r++)
        moved += memcmp(&ref[r], &got[r], sizeof(float)) != 0;
    printf("  fused Q8_0: %zu of 37 rows differ from the exact order\n", moved);
    ASSERT_TRUE(moved > 0);
    for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
        if (!lm_isa_supported((lm_isa)isa))
            continue;
        memset(got, 0xff, 37 * sizeof *got);
        lm_matvec_rows(&w, xt, &q8, got, 0, 37, (lm_isa)isa);
        if (!same_bits(got, ref, 37))
            CHECK_FAIL_AT("fused Q8_0: %s differs from the reference", lm_isa_name((lm_isa)isa));
    }
    free(data), free(scales), free(x), free(ref), free(got);
}

/* Every type in llama.cpp's order (lm_q8.fused), on random rows in groups
 * of 8 (the repacked types' condition) and not (their vec_dot's order):
 * every path the reference's bits (a range inside too); the sum within
 * float rounding of the double product of the dequantized weights with the
 * converted input (plus, for Q4_1 and Q5_1, the float16 rounding of Q8_1's
 * d * sum(q): the bound counts it), so every block layout is read right;
 * some row off the decoder's own order (another arithmetic); and a
 * deliberate misreading (the input of the next block) is caught. */
static void test_llama_fused_types(void)
{
    static const lm_dtype types[] = {LM_F32,  LM_F16,  LM_BF16,   LM_Q8_0,  LM_Q5_0,
                                     LM_Q4_1, LM_Q5_1, LM_Q4_0,   LM_IQ4_NL, LM_Q2_K,
                                     LM_Q3_K, LM_Q4_K, LM_Q5_K,   LM_Q6_K,  LM_IQ4_XS};
    const size_t cols = 768; /* three blocks of 256: IQ4_NL's odd count of pairs */
    for (int cpu = LM_LLAMA_CPU_AVX2; cpu < LM_LLAMA_CPU_COUNT; cpu++)
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t rows = 16; rows >= 13; rows -= 3) {
            const lm_llama_in kind = lm_llama_input(types[t]);
            unsigned char *data, *scales;
            lm_matrix w = random_matrix(types[t], rows, cols, 0, &data, &scales);
            float *x = random_x(cols), xt[768], xd[24], xs[24], deq[768];
            int8_t xq[768];
            lm_llama_quantize(kind, x, cols, xt, xq, xd, xs);
            lm_q8 q8 = {xq, xd, 32, cpu, xs};
            float got[16], mine[16];
            lm_matvec_ref(&w, xt, &q8, got, 0, rows);
            for (int isa = 0; isa < LM_ISA_COUNT; isa++) { /* every path the reference's bits */
                float vec[16];
                if (!lm_isa_supported((lm_isa)isa))
                    continue;
                memset(vec, 0xff, sizeof vec);
                lm_matvec_rows(&w, xt, &q8, vec, 0, rows, (lm_isa)isa);
                lm_matvec_rows(&w, xt, &q8, vec + 3, 3, 11, (lm_isa)isa); /* a range inside */
                if (!same_bits(vec, got, rows))
                    CHECK_FAIL_AT("llama %s (%s), %zu rows: %s differs from the reference",
                                  lm_dtype_name(types[t]), lm_llama_cpu_name((lm_llama_cpu)cpu),
                                  rows, lm_isa_name((lm_isa)isa));
            }
            /* the packed copy (lm_model_pack), where the active kernels read one:
             * every range, in groups of four or across them, the reference's bits */
            const size_t pb = lm_matrix_pack_bytes(&w);
            if (types[t] == LM_Q4_K && rows % 8 == 0 && lm_isa_active() == LM_ISA_AVX512)
                ASSERT_EQ(pb, rows * w.row_bytes);
            if (pb) {
                unsigned char *packed = malloc(pb);
                lm_matrix_pack(&w, packed);
                lm_matrix pw = w;
                pw.packed = packed;
                static const size_t ranges[][2] = {{0, 16}, {3, 11}, {1, 2}, {4, 8}, {5, 16}, {0, 7}};
                for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
                    const size_t a = ranges[k][0], e = ranges[k][1];
                    float vec[16];
                    memset(vec, 0xff, sizeof vec);
                    lm_matvec_rows(&pw, xt, &q8, vec, a, e, LM_ISA_COUNT);
                    if (!same_bits(vec, got + a, e - a))
                        CHECK_FAIL_AT("packed %s (%s) rows %zu..%zu differ from the reference",
                                      lm_dtype_name(types[t]),
                                      lm_llama_cpu_name((lm_llama_cpu)cpu), a, e);
                }
                /* the mutation: a byte of the copy changed changes the products */
                packed[pb / 2] ^= 0x11;
                float vec[16];
                lm_matvec_rows(&pw, xt, &q8, vec, 0, rows, LM_ISA_COUNT);
                ASSERT_TRUE(!same_bits(vec, got, rows));
                free(packed);
            }
            /* the decoder's own order on the same converted input */
            if (lm_matrix_q8_group(&w) == 0) {
                lm_matvec_ref(&w, xt, NULL, mine, 0, rows);
                size_t moved = 0;
                for (size_t r = 0; r < rows; r++)
                    moved += memcmp(&mine[r], &got[r], sizeof(float)) != 0;
                if (!moved)
                    CHECK_FAIL_AT("llama %s, %zu rows: every row is the decoder's own sum",
                                  lm_dtype_name(types[t]), rows);
            }
            size_t bad = 0;
            for (size_t r = 0; r < rows; r++) {
                lm_matrix_row(&w, r, deq);
                double exact = 0, mag = 0, mins = 0;
                for (size_t j = 0; j < cols; j++)
                    exact += (double)deq[j] * xt[j], mag += fabs((double)deq[j] * xt[j]);
                if (types[t] == LM_Q4_1 || types[t] == LM_Q5_1) {
                    const size_t bb = lm_dtype_block_bytes(types[t]);
                    for (size_t b = 0; b < cols / 32; b++) {
                        const unsigned char *blk = data + r * w.row_bytes + bb * b;
                        double sq = 0;
                        for (size_t j = 0; j < 32; j++)
                            sq += xq[32 * b + j];
                        mins += fabs((double)lm_f16_to_f32(lm__u16(blk + 2))) *
                                fabs((double)xs[b] - (double)xd[b] * sq);
                    }
                }
                const double bound = mag * 1e-6 + mins * 1.000001 + 1e-30;
                if (!(fabs((double)got[r] - exact) <= bound)) {
                    if (!bad)
                        CHECK_FAIL_AT("llama %s row %zu: %.9g, dequantized %.9g (bound %.3g)",
                                      lm_dtype_name(types[t]), r, (double)got[r], exact, bound);
                    bad++;
                }
            }
            /* the mutation: the input shifted by one block of 256 */
            lm_q8 off = {xq + 256, xd + 8, 32, cpu, xs + 8};
            lm_matrix part = w;
            part.cols = cols - 256; /* what the shifted input can still cover */
            float moved[16];
            lm_matvec_ref(&part, xt + 256, &off, moved, 0, rows);
            size_t differ = 0;
            for (size_t r = 0; r < rows; r++) {
                lm_matrix_row(&part, r, deq);
                double exact = 0, mag = 0;
                for (size_t j = 0; j < part.cols; j++)
                    exact += (double)deq[j] * xt[j], mag += fabs((double)deq[j] * xt[j]);
                differ += fabs((double)moved[r] - exact) > mag * 1e-3;
            }
            ASSERT_TRUE(differ > 0);
            free(data), free(scales), free(x);
        }
}

/* BF16 rows as vdpbf16ps sums them: a lane's odd element first, then its
 * even one, worked by hand; subnormal inputs read as zero and subnormal
 * results flushed; on random rows with subnormals mixed in, the
 * instruction's path (where this machine has it) the reference's bits. */
static void test_llama_bf16(void)
{
    /* 128 columns of x = 1; lane 0 of the first accumulator takes
     * elements 0, 1, then 64, 65: w1 = 2^24 (w0 = 0), then w65 = 1 first:
     * a tie to even (2^24), then w64 = 2: 2^24 + 2 (even first, or the
     * pair's sum first: 2^24 + 4) */
    unsigned char row[256];
    float x[128];
    for (size_t j = 0; j < 128; j++)
        put16(row + 2 * j, j == 1 ? 0x4b80 : j == 64 ? 0x4000 : j == 65 ? 0x3f80 : 0), x[j] = 1;
    lm_matrix w = {.data = row, .type = LM_BF16, .rows = 1, .cols = 128, .row_bytes = 256};
    lm_q8 q8 = {NULL, NULL, 32, LM_LLAMA_CPU_AVX512_BF16, NULL};
    for (int pass = 0; pass < 3; pass++) {
        /* pass 1: a subnormal weight 2^-127 against 2^100 reads as 0 (not
         * 2^-27); pass 2: 2^-70 * 2^-70 is flushed (not 2^-140) */
        const float want = pass ? 0.0f : 16777216.0f + 2.0f;
        if (pass) {
            memset(row, 0, sizeof row);
            put16(row, pass == 1 ? 0x0040 : 0x1c80);
            x[0] = pass == 1 ? 0x1p100f : 0x1p-70f;
        }
        for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
            float got = -1;
            if (!lm_isa_supported((lm_isa)isa))
                continue;
            lm_matvec_rows(&w, x, &q8, &got, 0, 1, (lm_isa)isa);
            if (!(got == want && !signbit(got)))
                CHECK_FAIL_AT("BF16 by hand (%d), %s: %a, want %a", pass,
                              lm_isa_name((lm_isa)isa), (double)got, (double)want);
        }
    }
    enum { R = 9, C = 200 };
    unsigned char *data, *scales;
    lm_matrix m = random_matrix(LM_BF16, R, C, 0, &data, &scales);
    float *xr = random_x(C), xt[C], ref[R], vec[R];
    lm_llama_quantize(LM_IN_BF16, xr, C, xt, NULL, NULL, NULL);
    for (size_t i = 0; i < C; i += 7) /* subnormal inputs and weights, tiny products */
        xt[i] = i % 2 ? 0x1p-130f : 0x1p-100f, put16(data + 2 * (i + C * (i % R)), 0x0011);
    lm_matvec_ref(&m, xt, &q8, ref, 0, R);
    for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
        if (!lm_isa_supported((lm_isa)isa))
            continue;
        memset(vec, 0xff, sizeof vec);
        lm_matvec_rows(&m, xt, &q8, vec, 0, R, (lm_isa)isa);
        if (!same_bits(vec, ref, R))
            CHECK_FAIL_AT("BF16 with subnormals: %s differs from the reference",
                          lm_isa_name((lm_isa)isa));
    }
    free(data), free(scales), free(xr);
}

/* The three variants' orders tell apart, by hand (64 columns: w0 x0 =
 * 2^24, then products of 1): F16 and F32 with ones at 1 and 3 (AVX-512's
 * 16-lane reduction adds the two ones first: 2^24 + 2; AVX2's 8-lane one
 * meets 2^24 with each, ties to even: 2^24), BF16 with ones at 16 and 24
 * (AVX2 adds element e + 16 and e + 24 to e's lane first: 2^24; AVX-512
 * alone reduces elements 16..31 apart, into the double: 2^24 + 2; dpbf16
 * puts 16 and 24 in lanes 8 and 12, each added to 2^24 alone: 2^24); then
 * every type's reference and paths in every variant (test_llama_fused_types
 * holds them per variant). */
static void test_llama_variants(void)
{
    static const float f16_want[LM_LLAMA_CPU_COUNT] = {0, 16777216.0f, 16777218.0f,
                                                       16777218.0f};
    static const float bf16_want[LM_LLAMA_CPU_COUNT] = {0, 16777216.0f, 16777218.0f,
                                                        16777216.0f};
    for (int cpu = LM_LLAMA_CPU_AVX2; cpu < LM_LLAMA_CPU_COUNT; cpu++) {
        unsigned char h[128], b[128], f[256];
        float x16[64], xb[64];
        for (size_t j = 0; j < 64; j++) {
            const int one = j == 1 || j == 3, bone = j == 16 || j == 24;
            put16(h + 2 * j, j == 0 ? 0x6800 /* 2048 */ : one ? 0x3c00 : 0);
            put16(b + 2 * j, j == 0 ? 0x4b80 /* 2^24 */ : bone ? 0x3f80 : 0);
            const float fw = j == 0 ? 2048.0f : one ? 1.0f : 0.0f;
            memcpy(f + 4 * j, &fw, 4);
            x16[j] = j == 0 ? 8192.0f : 1.0f, xb[j] = 1.0f;
        }
        lm_matrix wh = {.data = h, .type = LM_F16, .rows = 1, .cols = 64, .row_bytes = 128};
        lm_matrix wb = {.data = b, .type = LM_BF16, .rows = 1, .cols = 64, .row_bytes = 128};
        lm_matrix wf = {.data = f, .type = LM_F32, .rows = 1, .cols = 64, .row_bytes = 256};
        const lm_q8 q8 = {NULL, NULL, 32, cpu, NULL};
        ASSERT_TRUE(lm_dot_f16(x16, NULL, h, 64, (lm_llama_cpu)cpu) == f16_want[cpu]);
        for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
            float gh = -1, gb = -1, gf = -1;
            if (!lm_isa_supported((lm_isa)isa))
                continue;
            lm_matvec_rows(&wh, x16, &q8, &gh, 0, 1, (lm_isa)isa);
            lm_matvec_rows(&wf, x16, &q8, &gf, 0, 1, (lm_isa)isa);
            lm_matvec_rows(&wb, xb, &q8, &gb, 0, 1, (lm_isa)isa);
            if (!(gh == f16_want[cpu] && gf == f16_want[cpu] && gb == bf16_want[cpu]))
                CHECK_FAIL_AT("variant %s, %s: F16 %.9g, F32 %.9g (want %.9g), BF16 %.9g "
                              "(want %.9g)", lm_llama_cpu_name((lm_llama_cpu)cpu),
                              lm_isa_name((lm_isa)isa), (double)gh, (double)gf,
                              (double)f16_want[cpu], (double)gb, (double)bf16_want[cpu]);
        }
    }
    ASSERT_TRUE(lm_llama_cpu_detect() >= LM_LLAMA_CPU_AVX2 &&
                lm_llama_cpu_detect() < LM_LLAMA_CPU_COUNT);
    ASSERT_TRUE(strcmp(lm_llama_cpu_name(LM_LLAMA_CPU_AVX512_BF16), "avx512-bf16") == 0);
    printf("  llama.cpp's CPU variant here: %s\n", lm_llama_cpu_name(lm_llama_cpu_detect()));
}

/* F16 rows in llama.cpp's order for one token, ggml_vec_dot_f16's (4 x 16
 * lanes over steps of 64, the leftover in double; llamafile's tinyBLAS
 * only takes products of two columns and more): within float rounding of
 * the double product, every path the reference's bits, and a sum whose
 * order shows (1 + 2^-24 leftovers after a large lane) worked by hand, the
 * same for any number of rows. */
static void test_llama_f16_order(void)
{
    /* the input rounded to half floats, as the decoder rounds it: AVX-512
     * holds it so up to 16384 columns (its whole buffer), past them (16448)
     * as floats */
    const size_t dims[][2] = {{8, 96}, {6, 96}, {8, 200}, {5, 70}, {2, 16384}, {3, 16448}};
    for (size_t t = 0; t < sizeof dims / sizeof dims[0]; t++) {
        const size_t rows = dims[t][0], cols = dims[t][1];
        unsigned char *data, *scales;
        lm_matrix w = random_matrix(LM_F16, rows, cols, 0, &data, &scales);
        float *x = random_x(cols), *xt = malloc(cols * sizeof *xt), got[8], vec[8];
        float *deq = malloc(cols * sizeof *deq);
        ASSERT_TRUE(xt && deq);
        lm_llama_quantize(LM_IN_F16, x, cols, xt, NULL, NULL, NULL);
        lm_q8 q8 = {NULL, NULL, 32, LM_LLAMA_CPU_AVX512, NULL};
        lm_matvec_ref(&w, xt, &q8, got, 0, rows);
        for (size_t r = 0; r < rows; r++) {
            lm_matrix_row(&w, r, deq);
            double exact = 0, mag = 0;
            for (size_t j = 0; j < cols; j++)
                exact += (double)deq[j] * xt[j], mag += fabs((double)deq[j] * xt[j]);
            if (!(fabs((double)got[r] - exact) <= mag * 1e-6))
                CHECK_FAIL_AT("F16 %zux%zu row %zu: %.9g, want %.9g", rows, cols, r,
                              (double)got[r], exact);
        }
        for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
            if (!lm_isa_supported((lm_isa)isa))
                continue;
            memset(vec, 0xff, sizeof vec);
            lm_matvec_rows(&w, xt, &q8, vec, 0, rows, (lm_isa)isa);
            if (!same_bits(vec, got, rows))
                CHECK_FAIL_AT("F16 %zux%zu: %s differs from the reference", rows, cols,
                              lm_isa_name((lm_isa)isa));
        }
        free(data), free(scales), free(x), free(xt), free(deq);
    }
    /* one row of 64 + 16 weights 1 against x = 2^24, then 79 ones (exact:
     * 2^24 + 79; a float's step there is 2): lane 0 of the first
     * accumulator takes the third's 1 as a tie to even (2^24), the second's
     * reduction 2 more, the 16-lane reduction 60 (2^24 + 62), the leftover
     * 16 are exact in double: 2^24 + 78, on 8 rows and on 5 */
    unsigned char row[8 * 160];
    float xs[80];
    for (size_t j = 0; j < 80; j++)
        put16(row + 2 * j, 0x3c00), xs[j] = j == 0 ? 16777216.0f : 1.0f;
    lm_matrix w8 = {.data = row, .type = LM_F16, .rows = 8, .cols = 80, .row_bytes = 160};
    for (size_t r = 1; r < 8; r++)
        memcpy(row + 160 * r, row, 160);
    lm_q8 q8 = {NULL, NULL, 32, LM_LLAMA_CPU_AVX512, NULL};
    for (size_t rows = 8; rows >= 5; rows -= 3) {
        w8.rows = rows;
        for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
            float got[8];
            if (!lm_isa_supported((lm_isa)isa))
                continue;
            lm_matvec_rows(&w8, xs, &q8, got, 0, rows, (lm_isa)isa);
            for (size_t r = 0; r < rows; r++)
                if (!(got[r] == 16777216.0f + 78.0f))
                    CHECK_FAIL_AT("F16 by hand, %zu rows, %s: row %zu is %.9g, want 2^24 + 78",
                                  rows, lm_isa_name((lm_isa)isa), r, (double)got[r]);
        }
    }
}

/* ---- matrix-matrix products ---- */

/* Shapes beyond `shapes` where llama.cpp's orders apply: rows in groups of
 * 8 (the repacked types, Q4_K's packed copy) and not, F16 and F32 with
 * whole steps of 32 and 64 and leftovers, within a span of 256 and across
 * spans, Q8_0, Q4_K and Q6_K long enough for several blocks. */
static const shape llama_shapes[] = {
    {LM_Q4_K, 16, 512, 0}, {LM_Q4_0, 16, 256, 0}, {LM_IQ4_NL, 8, 64, 0}, {LM_F16, 8, 96, 0},
    {LM_F16, 12, 272, 0},  {LM_F16, 5, 70, 0},    {LM_Q6_K, 9, 512, 0},  {LM_Q8_0, 13, 256, 0},
    {LM_Q5_0, 8, 96, 0},   {LM_Q4_1, 8, 64, 0},   {LM_Q5_1, 16, 64, 0},  {LM_BF16, 6, 64, 0},
    {LM_Q2_K, 5, 512, 0},  {LM_Q5_K, 3, 256, 0},  {LM_IQ4_XS, 4, 256, 0}, {LM_F32, 9, 67, 0},
    {LM_F16, 7, 600, 0},   {LM_F32, 8, 296, 0},   {LM_Q4_K, 12, 512, 0}, {LM_Q2_K, 8, 256, 0},
    {LM_Q4_K, 8, 16640, 0}, {LM_Q6_K, 8, 16640, 0}, /* 65 blocks: fewer columns a chunk */
};

/* lm_matmat_rows against lm_matvec_rows column by column on every
 * instruction set (and so against the reference, which test_kernels and
 * the llama tests hold lm_matvec_rows to), for 1 to 37 columns and ranges
 * that start and end anywhere, in the exact products and llama.cpp's in
 * every variant (Q4_K from its packed copy too, where the active kernels
 * read one): bit for bit. Then lm_matmat over pools of 1 to 3 threads. */
static void test_matmat(void)
{
    static const size_t ncs[] = {1, 2, 3, 5, 8, 13, 37};
    const size_t NC = 37;
    size_t n_shapes = sizeof shapes / sizeof shapes[0], checked = 0;
    for (size_t si = 0; si < n_shapes + sizeof llama_shapes / sizeof llama_shapes[0]; si++) {
        const shape *sh = si < n_shapes ? &shapes[si] : &llama_shapes[si - n_shapes];
        unsigned char *data, *scales;
        lm_matrix w = random_matrix(sh->type, sh->rows, sh->cols, sh->group, &data, &scales);
        const size_t cols = sh->cols, rows = sh->rows, nd = cols / 4 + 1;
        float *x = random_x(NC * cols), *xt = malloc(NC * cols * sizeof *xt);
        int8_t *q = malloc(NC * cols);
        float *d = malloc(NC * nd * sizeof *d), *sums = malloc(NC * nd * sizeof *sums);
        lm_q8 q8[37];
        float *got = malloc(NC * (rows + 1) * sizeof *got), *want = malloc(rows * sizeof *want);
        const size_t pb = lm_matrix_pack_bytes(&w);
        unsigned char *packed = pb ? malloc(pb) : NULL;
        if (packed)
            lm_matrix_pack(&w, packed);
        /* mode 0: the exact products; 1 .. 3: llama.cpp's, in variant `mode` */
        for (int mode = 0; mode < LM_LLAMA_CPU_COUNT; mode++) {
            const lm_llama_in kind = mode ? lm_llama_input(sh->type) : LM_IN_NATIVE;
            const size_t group = kind == LM_IN_NATIVE ? lm_matrix_q8_group(&w) : 32;
            const float *in = kind == LM_IN_NATIVE ? x : xt;
            for (size_t c = 0; c < NC; c++) {
                q8[c] = (lm_q8){q + c * cols, d + c * nd, group, kind != LM_IN_NATIVE ? mode : 0,
                                sums + c * nd};
                if (kind != LM_IN_NATIVE)
                    lm_llama_quantize(kind, x + c * cols, cols, xt + c * cols, q + c * cols,
                                      d + c * nd, sums + c * nd);
                else if (group)
                    lm_quantize_q8(x + c * cols, cols, group, q + c * cols, d + c * nd);
            }
            const lm_q8 *xq = group ? q8 : NULL;
            for (int pk = 0; pk < 2; pk++) {
                if (pk && !packed)
                    continue;
                lm_matrix mw = w;
                mw.packed = pk ? packed : NULL;
                for (int isa = 0; isa < LM_ISA_COUNT; isa++) {
                    if (!lm_isa_supported((lm_isa)isa))
                        continue;
                    for (size_t ni = 0; ni < sizeof ncs / sizeof ncs[0]; ni++)
                        for (size_t r0 = 0; r0 < rows; r0 += rows > 5 ? 5 : 1) {
                            const size_t nc = ncs[ni], r1 = rows - (r0 && rows > 3 ? 1 : 0);
                            if (r1 <= r0)
                                continue;
                            memset(got, 0xff, NC * (rows + 1) * sizeof *got);
                            lm_matmat_rows(&mw, in, xq, nc, got, rows + 1, r0, r1, (lm_isa)isa);
                            for (size_t c = 0; c < nc; c++) {
                                lm_matvec_rows(&mw, in + c * cols, xq ? &xq[c] : NULL, want, r0,
                                               r1, (lm_isa)isa);
                                if (!same_bits(got + c * (rows + 1), want, r1 - r0))
                                    CHECK_FAIL_AT("%s %zux%zu (%s%s), %zu columns, rows "
                                                  "%zu..%zu: %s's column %zu differs from its "
                                                  "matvec", lm_dtype_name(sh->type), rows, cols,
                                                  mode ? "llama " : "exact",
                                                  mode ? lm_llama_cpu_name((lm_llama_cpu)mode)
                                                       : "",
                                                  nc, r0, r1, lm_isa_name((lm_isa)isa), c);
                            }
                            checked++;
                        }
                }
            }
        }
        free(data), free(scales), free(x), free(xt), free(q), free(d), free(sums), free(got);
        free(want), free(packed);
    }
    printf("  %zu matrix-matrix products equal to their columns' matrix-vector ones\n", checked);

    /* Threads: products of 2^20 weights and more, mixed types. */
    unsigned char *dd[3], *ss[3];
    lm_matrix mw[3] = {random_matrix(LM_F16, 301, 512, 0, &dd[0], &ss[0]),
                       random_matrix(LM_Q4_K, 203, 512, 0, &dd[1], &ss[1]),
                       random_matrix(LM_Q8_0, 97, 512, 0, &dd[2], &ss[2])};
    const size_t nc = 9;
    float *x = random_x(nc * 512), *xd = malloc(nc * 16 * sizeof *xd);
    int8_t *xq = malloc(nc * 512);
    lm_q8 q8[9];
    for (size_t c = 0; c < nc; c++) {
        lm_quantize_q8(x + c * 512, 512, 32, xq + c * 512, xd + c * 16);
        q8[c] = (lm_q8){xq + c * 512, xd + c * 16, 32, 0, NULL};
    }
    float *want[3], *got[3];
    for (int k = 0; k < 3; k++) {
        want[k] = malloc(nc * mw[k].rows * sizeof(float));
        got[k] = malloc(nc * mw[k].rows * sizeof(float));
        for (size_t c = 0; c < nc; c++)
            lm_matvec_ref(&mw[k], x + c * 512, &q8[c], want[k] + c * mw[k].rows, 0, mw[k].rows);
    }
    for (size_t threads = 1; threads <= 3; threads++) {
        lm_pool *pool = NULL;
        ASSERT_OK(lm_pool_new(threads, NULL, &pool));
        lm_product p[3] = {{&mw[0], got[0]}, {&mw[1], got[1]}, {&mw[2], got[2]}};
        for (int k = 0; k < 3; k++)
            memset(got[k], 0xff, nc * mw[k].rows * sizeof(float));
        lm_matmat(pool, p, 3, x, q8, nc);
        for (int k = 0; k < 3; k++)
            if (!same_bits(got[k], want[k], nc * mw[k].rows))
                CHECK_FAIL_AT("%zu threads: product %d of %zu columns differs", threads, k, nc);
        lm_pool_free(pool);
    }
    for (int k = 0; k < 3; k++)
        free(dd[k]), free(ss[k]), free(want[k]), free(got[k]);
    free(x), free(xd), free(xq);
}

/* The active instruction set can be forced and restored. */
static void test_isa_force(void)
{
    lm_isa was = lm_isa_active();
    ASSERT_TRUE(lm_isa_force(LM_ISA_SCALAR));
    ASSERT_EQ((int)lm_isa_active(), (int)LM_ISA_SCALAR);
    ASSERT_TRUE(lm_isa_force(LM_ISA_COUNT));
    ASSERT_EQ((int)lm_isa_active(), (int)was);
    ASSERT_STR_EQ(lm_isa_name(LM_ISA_AVX2), "avx2");
    ASSERT_STR_EQ(lm_isa_name((lm_isa)7), "unknown");
}

/* ---- threads ---- */

static void test_threads(void)
{
    /* Three products of one input, 2^20 weights and more in all, so the
     * pool is used; mixed types; a part may span two matrices. */
    unsigned char *d[3], *s[3];
    lm_matrix w[3] = {random_matrix(LM_F16, 1031, 512, 0, &d[0], &s[0]),
                      random_matrix(LM_Q4_K, 517, 512, 0, &d[1], &s[1]),
                      random_matrix(LM_Q8_0, 263, 512, 0, &d[2], &s[2])};
    float *x = random_x(512);
    int8_t xq[512];
    float xd[16];
    lm_quantize_q8(x, 512, 32, xq, xd);
    lm_q8 q8 = {xq, xd, 32, 0, NULL};
    float *want[3], *got[3];
    for (int k = 0; k < 3; k++) {
        want[k] = malloc(w[k].rows * sizeof(float));
        got[k] = malloc(w[k].rows * sizeof(float));
        lm_matvec_ref(&w[k], x, &q8, want[k], 0, w[k].rows);
    }
    for (size_t threads = 1; threads <= 4; threads++) {
        lm_pool *pool = NULL;
        ASSERT_OK(lm_pool_new(threads, NULL, &pool));
        for (int rep = 0; rep < 3; rep++) {
            lm_product p[3] = {{&w[0], got[0]}, {&w[1], got[1]}, {&w[2], got[2]}};
            for (int k = 0; k < 3; k++)
                memset(got[k], 0xff, w[k].rows * sizeof(float));
            lm_matvec(pool, p, 3, x, &q8);
            for (int k = 0; k < 3; k++)
                if (!same_bits(got[k], want[k], w[k].rows))
                    CHECK_FAIL_AT("%zu threads: product %d differs", threads, k);
        }
        lm_pool_free(pool);
    }
    lm_pool *pool = (lm_pool *)&rng_state;
    ASSERT_STATUS(lm_pool_new(0, NULL, &pool), KVE_EINVAL);
    ASSERT_STATUS(lm_pool_new(LM_MAX_THREADS + 1, NULL, &pool), KVE_EINVAL);
    ASSERT_TRUE(pool == (lm_pool *)&rng_state);
    ASSERT_TRUE(lm_cores() >= 1);
    lm_pool_free(NULL);
    for (int k = 0; k < 3; k++)
        free(d[k]), free(s[k]), free(want[k]), free(got[k]);
    free(x);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    rng_state = check_seed;
    RUN(test_dequant_vectors);
    RUN(test_f16_bf16);
    RUN(test_dequant_by_hand);
    RUN(test_quantize);
    RUN(test_kernels);
    RUN(test_llama_round);
    RUN(test_llama_quantize);
    RUN(test_llama_q8_0);
    RUN(test_llama_fused_types);
    RUN(test_llama_round_vectors);
    RUN(test_llama_swiglu);
    RUN(test_llama_quantize_vectors);
    RUN(test_llama_dot_f16);
    RUN(test_llama_f16_order);
    RUN(test_llama_bf16);
    RUN(test_llama_variants);
    RUN(test_matmat);
    RUN(test_isa_force);
    RUN(test_threads);
    return CHECK_DONE();
}
