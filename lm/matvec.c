/* SPDX-License-Identifier: MIT */
/*
 * matvec.c - matrix-vector products over weights in their stored type: a
 * plain reference per type, and the same arithmetic vectorised for AVX2 and
 * AVX-512, chosen once at run time.
 *
 * Invariants. The reference is the definition (lm.h says it in words): a
 * float product dequantizes the row exactly as quant.c does and sums
 * w[e] * x[e] into lane e mod 8 in element order, the last n mod 8 products
 * into a tail, then ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)) +
 * tail; an integer product sums q_w * q_x exactly per group and per lane
 * (j mod 32) / 4, then adds (float)sum * (d_w * d_x) to the lane in group
 * order (Q4_K, whose weights are d_j * q - m_j: (float)sum * (d_j * d_x) -
 * (float)sum_x * (m_j * d_x), sum_x the input's own sum in the lane). A
 * vector kernel performs the same IEEE operations on the same
 * operands in the same order, one lane per lane: 8 float lanes in a 256-bit
 * register, multiplies and adds as separate instructions (no fused
 * multiply-add: lm/ is built with -ffp-contract=off and the intrinsics say
 * mul and add), conversions that are exact (int8/int32 to float, float16 and
 * bfloat16 to float32). So its results are the reference's bits, for any
 * row and any instruction set (tests/test_lm_matvec.c). Kernels take four
 * rows at a time (their lanes interleaved to hide the adds' latency; the
 * last rows of a range repeat a row whose result is dropped): a row's value
 * does not depend on its neighbours, hence not on how rows are split over
 * threads. The AVX-512 kernels are the AVX2 bodies compiled for AVX-512
 * (EVEX encoding, 32 registers), but the 4-bit types' own: the lane order
 * is fixed at 8. Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS
 * share one kernel (k_deq) that calls quant.c's dequantization itself and
 * vectorises only the products. llama.cpp's orders (lm_q8.fused: one per
 * type, layout and CPU variant, the ORD_* list below) have references of
 * their own (ref_dot_llama), and row kernels equal to them: F32 and F16 in
 * its lanes, BF16 by its instruction or its lanes, Q8_0, Q4_K and Q6_K by
 * their own kernels, the other block types by two generic ones (exact
 * integer lanes, then the reference's float steps, k_step and step32,
 * shared), with fused multiply-adds where the reference has them (fmaf) or
 * where they round as a multiply and add (products of two float16 or
 * bfloat16 values, exact in float32).
 *
 * Shapes: W (rows, cols) row-major, row r at data + r * row_bytes; x
 * (cols); out (r1 - r0).
 */
#define _POSIX_C_SOURCE 200809L
#include "lm.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LM_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define LM_AVX2 __attribute__((target("avx2,f16c")))
#define LM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
#define LM_INLINE_AVX2 static inline __attribute__((always_inline, target("avx2,f16c")))
#else
#define LM_X86 0
#endif

/* ---- the instruction set ---- */

static atomic_int active = -1;

#if LM_X86
/* F16C (cpuid leaf 1, ECX bit 29): not every compiler's
 * __builtin_cpu_supports knows its name. */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

/* FMA, and AVX-512 VNNI (cpuid leaf 7, ECX bit 11: lm_matmat's AVX-512
 * kernels), asked once (racing first calls store the same answer). */
static atomic_int fma_known = -1, vnni_known = -1;

static int has_fma(void)
{
    int v = atomic_load_explicit(&fma_known, memory_order_relaxed);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("fma") != 0;
        atomic_store_explicit(&fma_known, v, memory_order_relaxed);
    }
    return v;
}

static int has_vnni(void)
{
    int v = atomic_load_explicit(&vnni_known, memory_order_relaxed);
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11)) != 0;
        atomic_store_explicit(&vnni_known, v, memory_order_relaxed);
    }
    return v;
}
#endif

int lm_isa_supported(lm_isa isa)
{
    switch (isa) {
    case LM_ISA_SCALAR: return 1;
#if LM_X86
    case LM_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && has_f16c();
    case LM_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx2") && has_f16c();
#endif
    default: return 0;
    }
}

static lm_isa detect(void)
{
    if (lm_isa_supported(LM_ISA_AVX512))
        return LM_ISA_AVX512;
    if (lm_isa_supported(LM_ISA_AVX2))
        return LM_ISA_AVX2;
    return LM_ISA_SCALAR;
}

lm_isa lm_isa_active(void)
{
    int v = atomic_load_explicit(&active, memory_order_relaxed);
    if (v < 0) { /* racing first calls detect and store the same value */
        v = (int)detect();
        atomic_store_explicit(&active, v, memory_order_relaxed);
    }
    return (lm_isa)v;
}

int lm_isa_force(lm_isa isa)
{
    if (isa == LM_ISA_COUNT) {
        atomic_store_explicit(&active, (int)detect(), memory_order_relaxed);
        return 1;
    }
    if (!lm_isa_supported(isa))
        return 0;
    atomic_store_explicit(&active, (int)isa, memory_order_relaxed);
    return 1;
}

const char *lm_isa_name(lm_isa isa)
{
    static const char *const names[LM_ISA_COUNT] = {"scalar", "avx2", "avx512"};
    return (unsigned)isa < LM_ISA_COUNT ? names[isa] : "unknown";
}

/* ---- llama.cpp's CPU variant (lm_llama_cpu) ---- */

lm_llama_cpu lm_llama_cpu_detect(void)
{
#if LM_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                     __builtin_cpu_supports("bmi2") && has_f16c();
    const int avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                       __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
    unsigned a = 0, b, c, d;
    const int bf16 = avx512 && __builtin_cpu_supports("avx512vnni") &&
                     __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)) != 0;
    return bf16 ? LM_LLAMA_CPU_AVX512_BF16 : avx512 ? LM_LLAMA_CPU_AVX512 : LM_LLAMA_CPU_AVX2;
#else
    return LM_LLAMA_CPU_AVX2;
#endif
}

const char *lm_llama_cpu_name(lm_llama_cpu cpu)
{
    static const char *const names[LM_LLAMA_CPU_COUNT] = {"auto", "avx2", "avx512",
                                                          "avx512-bf16"};
    return (unsigned)cpu < LM_LLAMA_CPU_COUNT ? names[cpu] : "unknown";
}

/* ---- the quantized input ---- */

void lm_quantize_q8(const float *x, size_t n, size_t group, int8_t *q, float *d)
{
    for (size_t g = 0; g < n / group; g++) {
        const float *v = x + g * group;
        int8_t *o = q + g * group;
        float amax = 0;
        int bad = 0;
        for (size_t j = 0; j < group; j++) {
            float a = fabsf(v[j]);
            if (!(a <= 3.40282347e38f))
                bad = 1;
            else if (a > amax)
                amax = a;
        }
        float dd = bad ? NAN : amax / 127.0f;
        d[g] = dd;
        for (size_t j = 0; j < group; j++) {
            long r = bad || dd == 0.0f ? 0 : lrintf(v[j] / dd);
            o[j] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r); /* a subnormal d rounds */
        }
    }
}

size_t lm_matrix_q8_group(const lm_matrix *w)
{
    return w->type == LM_Q8_0 || w->type == LM_Q4_K ? 32 : w->type == LM_I8G ? w->group : 0;
}

/* ---- llama.cpp's input (lm_llama_quantize) ---- */

lm_llama_in lm_llama_input(lm_dtype type)
{
    switch (type) {
    case LM_F32:
        return LM_IN_F32;
    case LM_F16:
        return LM_IN_F16;
    case LM_BF16:
        return LM_IN_BF16;
    case LM_Q4_0: case LM_Q4_1: case LM_Q5_0: case LM_Q5_1: case LM_Q8_0: case LM_IQ4_NL:
        return LM_IN_Q8_0;
    case LM_Q2_K: case LM_Q3_K: case LM_Q4_K: case LM_Q5_K: case LM_Q6_K: case LM_IQ4_XS:
        return LM_IN_Q8_K;
    default:
        return LM_IN_NATIVE;
    }
}

/* One block of b values: *amax its largest |x| (NaN when it holds a value
 * that is not finite), *big the first entry of that magnitude. */
static float block_max(const float *x, size_t b, float *big)
{
    float amax = 0, m = 0;
    for (size_t j = 0; j < b; j++) {
        const float a = fabsf(x[j]);
        if (!(a <= 3.40282347e38f))
            return *big = NAN;
        if (a > amax)
            amax = a, m = x[j];
    }
    *big = m;
    return amax;
}

/* One block of b (32: Q8_0, 256: Q8_K) of lm_llama_quantize: q, xt (b), d
 * (b / 32), *s (Q8_0's sum; may be NULL). */
static void quant_block_ref(lm_llama_in kind, const float *v, size_t b, int8_t *q, float *xt,
                            float *d, float *s)
{
    float big, dd = 0.0f, id = 0.0f, raw = 0.0f;
    const float amax = block_max(v, b, &big);
    if (kind == LM_IN_Q8_0) /* d = float16(amax / 127), q = x * (127 / amax) */
        raw = amax / 127.0f, dd = lm_f16_round(raw), id = amax != 0.0f ? 127.0f / amax : 0.0f;
    else if (amax != 0.0f) /* s = -127 / m, d = 1 / s */
        id = -127.0f / big, dd = 1.0f / id;
    int32_t sum = 0;
    for (size_t j = 0; j < b; j++) {
        const long r = amax != amax ? 0 : lrintf(v[j] * id); /* ties to even */
        const int8_t qq = (int8_t)(r > 127 ? 127 : r < -128 ? -128 : r);
        q[j] = qq, sum += qq;
        xt[j] = amax != amax ? NAN : (float)qq * dd;
    }
    for (size_t g = 0; g < b / 32; g++) /* Q8_K's d over its 8 groups of 32 */
        d[g] = amax != amax ? NAN : dd;
    if (s && kind == LM_IN_Q8_0)
        *s = amax != amax ? NAN : lm_f16_round(raw * (float)sum);
}

#if LM_X86
/* quant_block_ref of a block whose values are all finite (0 returned, and
 * nothing written, otherwise) sixteen at a time: the largest magnitude and
 * its first entry, then the same products rounded to the nearest, ties to
 * even (the rounding mode lrintf uses), clamped, and their q * d. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c"))) static int
quant_block_512(lm_llama_in kind, const float *v, size_t b, int8_t *q, float *xt, float *d,
                float *s)
{
    const __m512 lim = _mm512_set1_ps(3.40282347e38f);
    __m512 m = _mm512_setzero_ps();
    for (size_t j = 0; j < b; j += 16) {
        const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(v + j));
        if (_mm512_cmp_ps_mask(a, lim, _CMP_LE_OQ) != 0xFFFF) /* NaN or an infinity */
            return 0;
        m = _mm512_max_ps(m, a);
    }
    const float amax = _mm512_reduce_max_ps(m);
    float big = 0.0f;
    for (size_t j = 0; j < b; j += 16) {
        const __mmask16 at =
            _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(v + j)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
        if (at) {
            big = v[j + (size_t)__builtin_ctz(at)];
            break;
        }
    }
    float dd = 0.0f, id = 0.0f, raw = 0.0f;
    if (kind == LM_IN_Q8_0)
        raw = amax / 127.0f, dd = lm_f16_round(raw), id = amax != 0.0f ? 127.0f / amax : 0.0f;
    else if (amax != 0.0f)
        id = -127.0f / big, dd = 1.0f / id;
    const __m512 idv = _mm512_set1_ps(id), ddv = _mm512_set1_ps(dd);
    __m512i sum = _mm512_setzero_si512();
    for (size_t j = 0; j < b; j += 16) {
        __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + j), idv));
        r = _mm512_max_epi32(_mm512_min_epi32(r, _mm512_set1_epi32(127)), _mm512_set1_epi32(-128));
        _mm_storeu_si128((__m128i *)(void *)(q + j), _mm512_cvtepi32_epi8(r));
        _mm512_storeu_ps(xt + j, _mm512_mul_ps(_mm512_cvtepi32_ps(r), ddv));
        sum = _mm512_add_epi32(sum, r);
    }
    for (size_t g = 0; g < b / 32; g++)
        d[g] = dd;
    if (s && kind == LM_IN_Q8_0)
        *s = lm_f16_round(raw * (float)_mm512_reduce_add_epi32(sum));
    return 1;
}
#endif

void lm_llama_quantize(lm_llama_in kind, const float *x, size_t n, float *xt, int8_t *q, float *d,
                       float *s)
{
    if (kind == LM_IN_F16) {
        if (xt != x)
            memcpy(xt, x, n * sizeof *xt);
        lm_f16_round_n(xt, n);
        return;
    }
    if (kind == LM_IN_BF16) {
        for (size_t i = 0; i < n; i++)
            xt[i] = lm_bf16_to_f32(lm_f32_to_bf16(x[i]));
        return;
    }
    if (kind != LM_IN_Q8_0 && kind != LM_IN_Q8_K) {
        if (xt != x) /* LM_IN_F32, LM_IN_NATIVE: as it is */
            memcpy(xt, x, n * sizeof *xt);
        return;
    }
    const size_t b = kind == LM_IN_Q8_0 ? 32 : 256;
#if LM_X86
    const int wide = lm_isa_active() == LM_ISA_AVX512;
#endif
    for (size_t k = 0; k < n / b; k++) {
        float *sk = s && kind == LM_IN_Q8_0 ? s + k : NULL;
#if LM_X86
        if (wide && quant_block_512(kind, x + b * k, b, q + b * k, xt + b * k, d + b / 32 * k, sk))
            continue;
#endif
        quant_block_ref(kind, x + b * k, b, q + b * k, xt + b * k, d + b / 32 * k, sk);
    }
}

/* ---- float16 rounding of vectors (llama.cpp's cache and attention) ---- */

static void f16_round_ref(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lm_f16_round(x[i]);
}

static void f16_mad_ref(float *out, const float *v, float s, size_t n)
{
    for (size_t j = 0; j < n; j++)
        out[j] = lm_f16_round(fmaf(v[j], s, out[j]));
}

#if LM_X86
/* Eight lanes rounded to float16 and back by F16C (round to nearest even,
 * as lm_f32_to_f16), but NaN: F16C keeps the payload, lm_f32_to_f16 makes
 * every NaN the quiet one with its sign, and so does this. */
LM_INLINE_AVX2 __m256 f16_round8(__m256 x)
{
    const __m256 r = _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    const __m256 nan = _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)),
                                    _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    return _mm256_blendv_ps(r, nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

LM_AVX2 static void f16_round_avx2(float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, f16_round8(_mm256_loadu_ps(x + i)));
    f16_round_ref(x + i, n - i);
}

__attribute__((target("avx2,f16c,fma"))) static void f16_mad_avx2(float *out, const float *v,
                                                                   float s, size_t n)
{
    const __m256 sv = _mm256_set1_ps(s);
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, f16_round8(_mm256_fmadd_ps(_mm256_loadu_ps(v + j), sv,
                                                             _mm256_loadu_ps(out + j))));
    f16_mad_ref(out + j, v + j, s, n - j);
}

#endif

void lm_f16_round_n(float *x, size_t n)
{
#if LM_X86
    if (lm_isa_active() != LM_ISA_SCALAR) {
        f16_round_avx2(x, n);
        return;
    }
#endif
    f16_round_ref(x, n);
}

void lm_f16_mad(float *out, const float *v, float s, size_t n)
{
#if LM_X86
    if (lm_isa_active() != LM_ISA_SCALAR && has_fma()) {
        f16_mad_avx2(out, v, s, n);
        return;
    }
#endif
    f16_mad_ref(out, v, s, n);
}

/* ---- llama.cpp's SwiGLU (lm_swiglu_llama) ---- */

/* exp as ggml's AVX-512 builds compute it (ggml_v_expf), lane by lane with
 * fused multiply-adds: n = round(x / ln 2), b = x - n ln 2 in two parts, a
 * polynomial in b, scaled by 2^n; beyond |n| > 192, 0 or infinity. The
 * AVX2 builds' (avx2 = 1): the polynomial's last term b c1 rather than 1 +
 * b c1, then k + k j with k = 2^n from the bits of z; past |n| > 126 two
 * scales s1 s2 (s2 + s2 j) s1, past 192 s1 s1. */
static float expf_ggml(float x, int avx2)
{
    const float r = 0x1.8p23f, z = fmaf(x, 0x1.715476p+0f, r), n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    if (n != n) /* NaN in, NaN out (before the cast below) */
        return n;
    const float u = b * b;
    const float p = fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                         fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f));
    if (!avx2) {
        if (fabsf(n) > 192.0f)
            return n <= 0.0f ? 0.0f : INFINITY;
        return ldexpf(fmaf(p, u, fmaf(0x1.ffffecp-1f, b, 1.0f)), (int)n); /* _mm512_scalef_ps */
    }
    const float j = fmaf(p, u, 0x1.ffffecp-1f * b);
    uint32_t zb, one = 0x3f800000u;
    memcpy(&zb, &z, sizeof zb);
    const uint32_t e = zb << 23, kb = e + one, g = n <= 0.0f ? 0x82000000u : 0;
    const uint32_t s1b = g + 0x7f000000u, s2b = e - g;
    float k, s1, s2;
    memcpy(&k, &kb, sizeof k);
    memcpy(&s1, &s1b, sizeof s1);
    memcpy(&s2, &s2b, sizeof s2);
    if (fabsf(n) > 192.0f)
        return s1 * s1;
    if (fabsf(n) > 126.0f)
        return fmaf(s2, j, s2) * s1;
    return fmaf(k, j, k);
}

/* h[i] = silu(h[i]) * g[i] as ggml_vec_swiglu_f32: silu(x) = x / (1 +
 * expf_ggml(-x)) in whole groups of 16 (AVX2: 8), the leftover with the C
 * library's expf (ggml_silu_f32). */
static void swiglu_ref(float *h, const float *g, size_t n, lm_llama_cpu cpu)
{
    const int avx2 = cpu == LM_LLAMA_CPU_AVX2;
    const size_t whole = n & ~(size_t)(avx2 ? 7 : 15);
    size_t i = 0;
    for (; i < whole; i++)
        h[i] = h[i] / (1.0f + expf_ggml(0.0f - h[i], avx2)) * g[i];
    for (; i < n; i++)
        h[i] = h[i] / (1.0f + expf(-h[i])) * g[i];
}

#if LM_X86
/* swiglu_ref's whole groups sixteen lanes at a time for the AVX-512
 * variants, ggml_v_expf's own instructions (the fused multiply-adds of
 * expf_ggml; _mm512_scalef_ps, which ldexpf's exact scaling equals; NaN
 * lanes keep n, as expf_ggml returns it): the same bits. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,fma"))) static void
swiglu_512(float *h, const float *g, size_t n)
{
    const size_t whole = n & ~(size_t)15;
    const __m512 r = _mm512_set1_ps(0x1.8p23f), one = _mm512_set1_ps(1.0f);
    const __m512 zero = _mm512_setzero_ps();
    for (size_t i = 0; i < whole; i += 16) {
        const __m512 hv = _mm512_loadu_ps(h + i), x = _mm512_sub_ps(zero, hv);
        const __m512 nn = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r), r);
        const __m512 b = _mm512_fnmadd_ps(nn, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                          _mm512_fnmadd_ps(nn, _mm512_set1_ps(0x1.62e4p-1f), x));
        const __m512 u = _mm512_mul_ps(b, b);
        const __m512 j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b,
                                            _mm512_set1_ps(0x1.573e2ep-5f)),
                            u,
                            _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b,
                                            _mm512_set1_ps(0x1.fffdb6p-2f))),
            u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, one));
        __m512 e = _mm512_scalef_ps(j, nn);
        const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(nn), _mm512_set1_ps(192.0f),
                                                 _CMP_GT_OQ);
        const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(nn, zero, _CMP_LE_OQ),
                                                _mm512_set1_ps(INFINITY), zero);
        e = _mm512_mask_blend_ps(big, e, alt);
        e = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(nn, nn, _CMP_UNORD_Q), e, nn);
        _mm512_storeu_ps(h + i, _mm512_mul_ps(_mm512_div_ps(hv, _mm512_add_ps(one, e)),
                                              _mm512_loadu_ps(g + i)));
    }
    swiglu_ref(h + whole, g + whole, n - whole, LM_LLAMA_CPU_AVX512);
}
#endif

void lm_swiglu_llama(float *h, const float *g, size_t n, lm_llama_cpu cpu)
{
    if (cpu == LM_LLAMA_CPU_AUTO)
        cpu = lm_llama_cpu_detect();
#if LM_X86
    /* the AVX-512 variants' exp sixteen lanes at a time; the AVX2 variant's
     * (its own exp and groups of 8) by the reference */
    if (cpu != LM_LLAMA_CPU_AVX2 && lm_isa_active() == LM_ISA_AVX512 && has_fma()) {
        swiglu_512(h, g, n);
        return;
    }
#endif
    swiglu_ref(h, g, n, cpu);
}

/* ---- the references ---- */

static float combine(const float a[8], float tail)
{
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])) + tail;
}

static float ref_dot_float(const lm_matrix *w, size_t r, const float *x)
{
    float acc[8] = {0}, tail = 0.0f, buf[256];
    size_t n = w->cols, bs = lm_dtype_block(w->type);
    size_t chunk = bs > 1 ? bs : 256; /* a multiple of 8 */
    for (size_t s = 0; s < n; s += chunk) {
        size_t c = n - s < chunk ? n - s : chunk, i = 0;
        const float *v = buf;
        if (w->type == LM_F32)
            v = (const float *)(const void *)((const unsigned char *)w->data + r * w->row_bytes) +
                s;
        else
            lm__dequant_span(w, r, s, c, buf);
        for (; i + 8 <= c; i += 8)
            for (size_t k = 0; k < 8; k++)
                acc[k] += v[i + k] * x[s + i + k];
        for (; i < c; i++) /* only in the last chunk: the n mod 8 last products */
            tail += v[i] * x[s + i];
    }
    return combine(acc, tail);
}

/* hsum_float_8's order: the halves added lane by lane, then the pairs. */
static float combine_hsum(const float a[8])
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* _mm512_reduce_add_ps's order (GCC's): the halves added lane by lane
 * twice, then lanes 0 + 2 and 1 + 3, then those two. */
static float reduce16(const float a[16])
{
    float t[8];
    for (int e = 0; e < 8; e++)
        t[e] = a[e + 8] + a[e];
    const float u0 = t[4] + t[0], u1 = t[5] + t[1], u2 = t[6] + t[2], u3 = t[7] + t[3];
    return (u0 + u2) + (u1 + u3);
}

/* GGML_F32x8_REDUCE's last steps (AVX2): the halves added lane by lane,
 * then two horizontal adds. */
static float reduce8(const float a[8])
{
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* ---- llama.cpp's orders (lm_q8.fused) ----
 *
 * What the CPU back end that llama.cpp loads on an AVX-512 machine runs
 * for one token's product (lm_llama_cpu: zen4 and cooperlake, skylakex to
 * icelake alike but for BF16), read from its source and its compiled code
 * (GCC contracts a * b + c into fused multiply-adds there):
 *   F32     ggml_vec_dot_f32: 4 x 16 lanes of fmas over steps of 64,
 *           reduced, the leftover fused into the float sum;
 *   F16     ggml_vec_dot_f16 (lm_dot_f16);
 *   BF16    ggml_vec_dot_bf16 with AVX512_BF16: two 16-lane dpbf16
 *           accumulators over steps of 64, reduced into a double, the
 *           leftover in double; without it two 16-lane accumulators of
 *           exact products over steps of 32 (ref_dot_bf16);
 *   VEC32   Q8_0, Q5_0, Q4_1, Q5_1 and Q4_0 off the repack: the x86
 *           vec_dot's 8 lanes of exact sums of 4, fma by d_w d_x a block,
 *           hsum_float_8, then Q4_1's and Q5_1's m s in order;
 *   IQ4NL   IQ4_NL off the repack: even and odd blocks in two such
 *           accumulators, added before hsum, an odd last block fused into
 *           the float sum;
 *   REPACK32 Q4_0 and IQ4_NL with rows in 8s (CPU_REPACK's 8x8 gemv): a
 *           block's whole sum fused into one accumulator;
 *   KLANES  Q2_K .. Q6_K and IQ4_XS by their vec_dot: per block of 256
 *           eight lanes of exact scaled sums, fma by d_x d_w (Q2_K after
 *           its mins' lanes, Q4_K's mins in four lanes apart, Q5_K's in a
 *           float sum), hsum_float_8;
 *   REPACKK Q4_K (AVX2) and Q2_K (AVX-512) with rows in 8s: the block's
 *           whole scaled sum and its mins' sum each fused into an
 *           accumulator of its own, their difference.
 * The AVX2 variant (libggml-cpu-haswell) sums F32, F16 and BF16 in 8 lanes
 * instead (GGML_F32x8_REDUCE: the pairs of ((0 + 4) + (1 + 5)) + ((2 + 6)
 * + (3 + 7)); the others alike), and keeps Q2_K off the repack. */
typedef enum llama_order {
    ORD_NONE = 0,
    ORD_F32,
    ORD_F16,
    ORD_BF16,
    ORD_VEC32,
    ORD_IQ4NL,
    ORD_REPACK32,
    ORD_KLANES,
    ORD_REPACKK
} llama_order;

static llama_order order_of(const lm_matrix *w, lm_llama_cpu cpu)
{
    const int in8s = w->rows % 8 == 0, avx512 = cpu >= LM_LLAMA_CPU_AVX512;
    switch (w->type) {
    case LM_F32: return ORD_F32;
    case LM_F16: return ORD_F16;
    case LM_BF16: return ORD_BF16;
    case LM_Q8_0: case LM_Q5_0: case LM_Q4_1: case LM_Q5_1: return ORD_VEC32;
    case LM_Q4_0: return in8s ? ORD_REPACK32 : ORD_VEC32;
    case LM_IQ4_NL: return in8s ? ORD_REPACK32 : ORD_IQ4NL;
    case LM_Q2_K: return in8s && avx512 ? ORD_REPACKK : ORD_KLANES;
    case LM_Q4_K: return in8s ? ORD_REPACKK : ORD_KLANES;
    case LM_Q3_K: case LM_Q5_K: case LM_Q6_K: case LM_IQ4_XS: return ORD_KLANES;
    default: return ORD_NONE;
    }
}

/* A block of 32 of those types as llama.cpp's vec_dot reads it: the 32
 * integer weights in element order, *d and *m (0 without a min). */
static void block32_ints(lm_dtype t, const unsigned char *blk, int32_t w[32], float *d, float *m)
{
    *d = lm_f16_to_f32(lm__u16(blk));
    *m = t == LM_Q4_1 || t == LM_Q5_1 ? lm_f16_to_f32(lm__u16(blk + 2)) : 0.0f;
    if (t == LM_Q8_0) {
        for (int j = 0; j < 32; j++)
            w[j] = blk[2 + j] < 128 ? blk[2 + j] : blk[2 + j] - 256; /* int8 */
        return;
    }
    if (t == LM_Q4_0 || t == LM_IQ4_NL) {
        for (int j = 0; j < 32; j++) {
            const int nib = j < 16 ? blk[2 + j] & 0xF : blk[2 + j - 16] >> 4;
            w[j] = t == LM_Q4_0 ? nib - 8 : lm__iq4nl_values[nib];
        }
        return;
    }
    const unsigned char *qs = blk + (t == LM_Q4_1 ? 4 : t == LM_Q5_0 ? 6 : 8);
    const uint32_t qh = t == LM_Q4_1 ? 0
                                     : (uint32_t)lm__u16(blk + (t == LM_Q5_0 ? 2 : 4)) |
                                           (uint32_t)lm__u16(blk + (t == LM_Q5_0 ? 4 : 6)) << 16;
    for (int j = 0; j < 32; j++) {
        const int nib = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4, hi = (int)(qh >> j & 1) << 4;
        w[j] = t == LM_Q5_0 ? nib + hi - 16 : nib + hi; /* Q4_1: qh = 0 */
    }
}

/* A block of 256 of the k-quants or IQ4_XS as their integer sums read it:
 * q[e] the integer weight of element e (|q| < 128; Q6_K's without its
 * offset of 32, which k_step takes off as llama.cpp does), sc[i] the scale of
 * elements 16i .. 16i + 15 and mn[i] their min (a scale or min of 32 given
 * twice; mn 0 without mins), *d and *dm the float16 scale and min scale. */
static void block256_ints(lm_dtype t, const unsigned char *b, int8_t q[256], int16_t sc[16],
                          int16_t mn[16], float *d, float *dm)
{
    *dm = 0.0f;
    memset(mn, 0, 16 * sizeof *mn);
    switch (t) {
    case LM_Q2_K: /* scales 0..15 (min << 4 | scale), q 16..79, d 80, dmin 82 */
        *d = lm_f16_to_f32(lm__u16(b + 80)), *dm = lm_f16_to_f32(lm__u16(b + 82));
        for (int e = 0; e < 256; e++)
            q[e] = (int8_t)((b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3);
        for (int i = 0; i < 16; i++)
            sc[i] = b[i] & 0xF, mn[i] = b[i] >> 4;
        return;
    case LM_Q3_K: { /* high bits 0..31, q 32..95, scales 96..107, d 108 */
        const unsigned char *sb = b + 96;
        *d = lm_f16_to_f32(lm__u16(b + 108));
        for (int e = 0; e < 256; e++)
            q[e] = (int8_t)(((b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) -
                            ((b[e % 32] >> (e / 32)) & 1 ? 0 : 4));
        for (int i = 0; i < 16; i++)
            sc[i] = (int16_t)(((i < 8 ? sb[i] & 0xF : sb[i - 8] >> 4) |
                               ((sb[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32);
        return;
    }
    case LM_Q4_K:
    case LM_Q5_K: /* d 0, dmin 2, scales 4..15; Q5_K: high bits 16..47, nibbles 48.. */
        *d = lm_f16_to_f32(lm__u16(b)), *dm = lm_f16_to_f32(lm__u16(b + 2));
        for (size_t j = 0; j < 8; j++) {
            unsigned s, m;
            lm__scale_min_k4((int)j, b + 4, &s, &m);
            sc[2 * j] = sc[2 * j + 1] = (int16_t)s, mn[2 * j] = mn[2 * j + 1] = (int16_t)m;
            const unsigned char *ql = b + (t == LM_Q4_K ? 16 : 48) + 32 * (j / 2);
            for (size_t l = 0; l < 32; l++)
                q[32 * j + l] = (int8_t)((j % 2 ? ql[l] >> 4 : ql[l] & 0xF) +
                                         (t == LM_Q5_K && (b[16 + l] >> j) & 1 ? 16 : 0));
        }
        return;
    case LM_Q6_K: /* ql 0..127, qh 128..191, scales 192..207, d 208 */
        *d = lm_f16_to_f32(lm__u16(b + 208));
        for (int e = 0; e < 256; e++) {
            const int h = e / 128, m = (e % 128) / 32, l = e % 32;
            const unsigned char lo = b[64 * h + 32 * (m & 1) + l], hb = b[128 + 32 * h + l];
            q[e] = (int8_t)((m < 2 ? lo & 0xF : lo >> 4) | ((hb >> (2 * m)) & 3) << 4);
        }
        for (int i = 0; i < 16; i++)
            sc[i] = (int16_t)(b[192 + i] < 128 ? b[192 + i] : b[192 + i] - 256); /* int8 */
        return;
    case LM_IQ4_XS: { /* d 0, high scale bits 2, low scale nibbles 4..7, nibbles 8.. */
        const unsigned sh = lm__u16(b + 2);
        *d = lm_f16_to_f32(lm__u16(b));
        for (size_t j = 0; j < 8; j++) {
            sc[2 * j] = sc[2 * j + 1] = (int16_t)((((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) |
                                                   (int)((sh >> (2 * j)) & 3) << 4) - 32);
            for (size_t l = 0; l < 32; l++)
                q[32 * j + l] = lm__iq4nl_values[l < 16 ? b[8 + 16 * j + l] & 0xF
                                                        : b[8 + 16 * j + l - 16] >> 4];
        }
        return;
    }
    default:
        *d = 0.0f;
        memset(q, 0, 256), memset(sc, 0, 16 * sizeof *sc);
        return;
    }
}

/* The lanes of a block of 256: lane k the exact sum over the elements e
 * with e mod 32 in [4k, 4k + 4) of sc(e) q(e) x(e); bs the input's sums
 * over runs of 16 (quantize_row_q8_K's bsums). */
static void lanes256(const int8_t q[256], const int16_t sc[16], const int8_t *x, int32_t lane[8],
                     int32_t bs[16])
{
    memset(lane, 0, 8 * sizeof *lane);
    memset(bs, 0, 16 * sizeof *bs);
    for (int e = 0; e < 256; e++) {
        lane[e % 32 / 4] += sc[e / 16] * q[e] * x[e];
        bs[e / 16] += x[e];
    }
}

/* The float side of a row's sum in llama.cpp's order: its accumulators,
 * one block's step on them from the block's exact integer lanes (and the
 * input's sums of 16), and the row's result. The references and the
 * vector kernels share them; only the integer lanes are computed apart. */
typedef struct k_acc {
    float acc[8], odd[8], accm[4], summs, one, onem; /* odd: IQ4NL's second accumulator */
} k_acc;

static inline void k_step(lm_dtype t, int repacked, const int32_t lanes[8], const int32_t bs[16],
                          const int16_t sc[16], const int16_t mn[16], float d, float dm, float dx,
                          k_acc *a)
{
    int32_t lane[8];
    memcpy(lane, lanes, sizeof lane);
    if (t == LM_Q6_K) /* lane k less 32 times runs 2k and 2k + 1's scaled sums (bsums) */
        for (size_t k = 0; k < 8; k++)
            lane[k] -= 32 * (bs[2 * k] * sc[2 * k] + bs[2 * k + 1] * sc[2 * k + 1]);
    if (repacked) { /* the whole block's sums: lanes, then mins */
        int32_t isum = 0, imin = 0;
        for (int k = 0; k < 8; k++)
            isum += lane[k];
        for (int i = 0; i < 16; i++)
            imin += mn[i] * bs[i];
        a->one = fmaf((float)isum, d * dx, a->one);
        a->onem = fmaf((float)imin, dm * dx, a->onem);
        return;
    }
    const float dd = dx * d, dmin = -dx * dm;
    if (t == LM_Q2_K) /* lane k: the mins of runs 2k and 2k + 1 */
        for (size_t k = 0; k < 8; k++)
            a->acc[k] = fmaf(dmin, (float)(mn[2 * k] * bs[2 * k] + mn[2 * k + 1] * bs[2 * k + 1]),
                             a->acc[k]);
    if (t == LM_Q4_K) /* lane k: sub-blocks 2k and 2k + 1 */
        for (size_t k = 0; k < 4; k++)
            a->accm[k] = fmaf(dmin, (float)(mn[4 * k] * (bs[4 * k] + bs[4 * k + 1]) +
                                            mn[4 * k + 2] * (bs[4 * k + 2] + bs[4 * k + 3])),
                              a->accm[k]);
    if (t == LM_Q5_K) {
        int32_t imin = 0;
        for (int i = 0; i < 16; i++)
            imin += mn[i] * bs[i];
        a->summs = fmaf((float)imin, dmin, a->summs);
    }
    for (int k = 0; k < 8; k++)
        a->acc[k] = fmaf(dd, (float)lane[k], a->acc[k]);
}

static inline float k_finish(lm_dtype t, int repacked, const k_acc *a)
{
    if (repacked)
        return a->one - a->onem;
    const float s = combine_hsum(a->acc);
    return t == LM_Q4_K   ? s + ((a->accm[0] + a->accm[2]) + (a->accm[1] + a->accm[3]))
           : t == LM_Q5_K ? s + a->summs
                          : s;
}

/* A row of a k-quant or IQ4_XS against Q8_K in llama.cpp's order
 * (KLANES, or REPACKK when repacked). */
static float ref_dot_k(const lm_matrix *w, size_t r, const lm_q8 *xq, int repacked)
{
    const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
    const size_t bb = lm_dtype_block_bytes(w->type);
    k_acc a;
    memset(&a, 0, sizeof a);
    for (size_t b = 0; b < w->cols / 256; b++) {
        int8_t q[256];
        int16_t sc[16], mn[16];
        int32_t lane[8], bs[16];
        float d, dm;
        block256_ints(w->type, row + bb * b, q, sc, mn, &d, &dm);
        lanes256(q, sc, xq->q + 256 * b, lane, bs);
        k_step(w->type, repacked, lane, bs, sc, mn, d, dm, xq->d[8 * b], &a);
    }
    return k_finish(w->type, repacked, &a);
}

/* The same for the blocks of 32 against Q8_0 (VEC32, IQ4NL, REPACK32):
 * block b of nb, its lanes, d and m (block32_ints). */
static inline void step32(lm_dtype t, llama_order ord, size_t b, size_t nb, const int32_t lane[8],
                          float d, float m, const lm_q8 *xq, k_acc *a)
{
    int32_t sum = 0;
    for (int k = 0; k < 8; k++)
        sum += lane[k];
    if (ord == ORD_REPACK32) { /* gemv_q4_b32_8x8_q8_0_lut_avx: the block's whole sum */
        a->one = fmaf((float)sum, d * xq->d[b], a->one);
        return;
    }
    if (ord == ORD_IQ4NL && b == nb - 1 && nb % 2) { /* the odd last block: scalar */
        a->one = fmaf((float)sum, xq->d[b] * d, a->one);
        return;
    }
    if (t == LM_Q4_1 || t == LM_Q5_1)
        a->summs += m * xq->s[b];
    const float dd = d * xq->d[b];
    float *acc = ord == ORD_IQ4NL && b % 2 ? a->odd : a->acc;
    for (int k = 0; k < 8; k++)
        acc[k] = fmaf(dd, (float)lane[k], acc[k]);
}

static inline float finish32(llama_order ord, const k_acc *a)
{
    if (ord == ORD_REPACK32)
        return a->one;
    if (ord == ORD_IQ4NL) {
        float s[8];
        for (int k = 0; k < 8; k++)
            s[k] = a->acc[k] + a->odd[k];
        return combine_hsum(s) + a->one;
    }
    return combine_hsum(a->acc) + a->summs;
}

static float ref_dot_32(const lm_matrix *w, size_t r, const lm_q8 *xq, llama_order ord)
{
    const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
    const size_t bb = lm_dtype_block_bytes(w->type), nb = w->cols / 32;
    k_acc a;
    memset(&a, 0, sizeof a);
    for (size_t b = 0; b < nb; b++) {
        int32_t q[32], lane[8] = {0};
        float d, m;
        block32_ints(w->type, row + bb * b, q, &d, &m);
        for (int j = 0; j < 32; j++)
            lane[j / 4] += q[j] * (int32_t)xq->q[32 * b + (size_t)j];
        step32(w->type, ord, b, nb, lane, d, m, xq, &a);
    }
    return finish32(ord, &a);
}

/* F32 rows as ggml_vec_dot_f32: lane i mod 64 of 4 x 16 (AVX2: i mod 32
 * of 4 x 8) accumulates by fma over whole steps, the accumulators reduced
 * (0 + 2, 1 + 3, then the two; then _mm512_reduce_add_ps or reduce8), then
 * each leftover product fused into that float sum. */
static float ref_dot_f32(const float *w, const float *x, size_t n, lm_llama_cpu cpu)
{
    const size_t L = cpu == LM_LLAMA_CPU_AVX2 ? 8 : 16, np = n / (4 * L) * (4 * L);
    float acc[4][16] = {{0}};
    for (size_t i = 0; i < np; i++)
        acc[i % (4 * L) / L][i % L] = fmaf(w[i], x[i], acc[i % (4 * L) / L][i % L]);
    for (size_t e = 0; e < L; e++)
        acc[0][e] += acc[2][e], acc[1][e] += acc[3][e];
    for (size_t e = 0; e < L; e++)
        acc[0][e] += acc[1][e];
    float sum = L == 8 ? reduce8(acc[0]) : reduce16(acc[0]);
    for (size_t i = np; i < n; i++)
        sum = fmaf(x[i], w[i], sum);
    return sum;
}

/* vdpbf16ps's arithmetic on one lane: input subnormals read as zero, then
 * c + a1 b1 rounded, then + a0 b0 rounded (each product exact in float32),
 * a subnormal result flushed to zero (its sign kept). */
static float bf16_flush(float f)
{
    return fabsf(f) < 0x1p-126f ? copysignf(0.0f, f) : f;
}

static float dpbf16(float c, float a0, float b0, float a1, float b1)
{
    a0 = bf16_flush(a0), b0 = bf16_flush(b0), a1 = bf16_flush(a1), b1 = bf16_flush(b1);
    c = bf16_flush(fmaf(a1, b1, c));
    return bf16_flush(fmaf(a0, b0, c));
}

/* BF16 rows against the input rounded to bfloat16 as ggml_vec_dot_bf16:
 * with AVX512_BF16 two accumulators of 16 lanes, the first over elements
 * i mod 64 < 32, the second over the rest, lane k taking the pair 2k, 2k + 1
 * of its 32 (dpbf16), each reduced and added into a double; with AVX-512
 * alone two of 16 over steps of 32 (lane e mod 16 of the first half, of the
 * second), each reduced and added into a double; with AVX2 four of 8 over
 * steps of 32, added (0 + 2) + (1 + 3) and reduced as hsum_float_8 into the
 * double; then the leftover products in double. Products of two bfloat16
 * values are exact in float32. */
static float ref_dot_bf16(const unsigned char *row, const float *x, size_t n, lm_llama_cpu cpu)
{
#define W(i) lm_bf16_to_f32(lm__u16(row + 2 * (i)))
    const size_t step = cpu == LM_LLAMA_CPU_AVX512_BF16 ? 64 : 32, np = n / step * step;
    float c[4][16] = {{0}}; /* dpbf16 and AVX-512: c[0], c[1]; AVX2: c[0 .. 3] of 8 */
    double sum = 0.0;
    for (size_t i = 0; i < np; i += step)
        for (size_t j = 0; j < step; j += 2) {
            const size_t e = i + j;
            if (cpu == LM_LLAMA_CPU_AVX512_BF16) {
                float *a = &c[j / 32][j % 32 / 2];
                *a = dpbf16(*a, W(e), x[e], W(e + 1), x[e + 1]);
            } else {
                const size_t L = cpu == LM_LLAMA_CPU_AVX2 ? 8 : 16;
                for (size_t t = 0; t < 2; t++)
                    c[(j + t) / L][(j + t) % L] += W(e + t) * x[e + t];
            }
        }
    if (cpu == LM_LLAMA_CPU_AVX2) {
        float a[8];
        for (size_t k = 0; k < 8; k++)
            a[k] = (c[0][k] + c[2][k]) + (c[1][k] + c[3][k]);
        sum += (double)combine_hsum(a);
    } else {
        sum += (double)reduce16(c[0]);
        sum += (double)reduce16(c[1]);
    }
    for (size_t i = np; i < n; i++)
        sum += (double)(W(i) * x[i]);
    return (float)sum;
#undef W
}

static float dot_f16_ref(const float *x, const float *y, const unsigned char *yh, size_t n,
                         lm_llama_cpu cpu);

/* A row in llama.cpp's order (lm_q8.fused). */
static float ref_dot_llama(const lm_matrix *w, size_t r, const float *x, const lm_q8 *xq)
{
    const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
    const lm_llama_cpu cpu = (lm_llama_cpu)xq->fused;
    const llama_order ord = order_of(w, cpu);
    switch (ord) {
    case ORD_F32: return ref_dot_f32((const float *)(const void *)row, x, w->cols, cpu);
    case ORD_F16: return dot_f16_ref(x, NULL, row, w->cols, cpu);
    case ORD_BF16: return ref_dot_bf16(row, x, w->cols, cpu);
    case ORD_VEC32: case ORD_IQ4NL: case ORD_REPACK32: return ref_dot_32(w, r, xq, ord);
    case ORD_KLANES: case ORD_REPACKK: return ref_dot_k(w, r, xq, ord == ORD_REPACKK);
    default: return NAN; /* lm_matvec_ref takes the decoder's own order */
    }
}

static float ref_dot_q8(const lm_matrix *w, size_t r, const lm_q8 *xq)
{
    const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
    size_t n = w->cols, G = xq->group;
    float acc[8] = {0};
    for (size_t g = 0; g < n / G; g++) {
        int32_t s[8] = {0};
        float wd;
        if (w->type == LM_Q4_K) { /* group g: sub-block g mod 8 of block g / 8 */
            const unsigned char *b = row + 144 * (g / 8);
            const size_t j = g % 8;
            const unsigned char *q = b + 16 + 32 * (j / 2);
            unsigned sc, m;
            lm__scale_min_k4((int)j, b + 4, &sc, &m);
            const float d1 = lm_f16_to_f32(lm__u16(b)) * (float)sc;
            const float m1 = lm_f16_to_f32(lm__u16(b + 2)) * (float)m;
            int32_t sx[8] = {0};
            for (size_t e = 0; e < 32; e++) {
                const int32_t qx = (int32_t)xq->q[32 * g + e];
                s[e / 4] += (int32_t)(j % 2 ? q[e] >> 4 : q[e] & 0xF) * qx;
                sx[e / 4] += qx;
            }
            const float s1 = d1 * xq->d[g], s2 = m1 * xq->d[g];
            for (int k = 0; k < 8; k++)
                acc[k] += (float)s[k] * s1 - (float)sx[k] * s2;
            continue;
        }
        if (w->type == LM_Q8_0) {
            const unsigned char *b = row + 34 * g;
            wd = lm_f16_to_f32(lm__u16(b));
            for (size_t j = 0; j < 32; j++)
                s[j / 4] += (int32_t)(int8_t)b[2 + j] * (int32_t)xq->q[32 * g + j];
        } else {
            wd = lm__i8g_scale(w, r * w->cols + g * G);
            for (size_t j = g * G; j < (g + 1) * G; j++)
                s[(j % 32) / 4] += (int32_t)(int8_t)row[j] * (int32_t)xq->q[j];
        }
        float scale = wd * xq->d[g];
        for (int k = 0; k < 8; k++)
            acc[k] += (float)s[k] * scale;
    }
    return combine(acc, 0.0f);
}

#if LM_X86
/* lm_dot_f16's whole steps (np elements, steps of 4 L) on the vector unit:
 * the four accumulators of L lanes each one register (fused multiply-adds
 * of exact products round as the reference's multiply and add), added (0 +
 * 2) + (1 + 3) and reduced by REDUCE in the reference's order: the same
 * float before the leftover. L = 16 for the AVX-512 variants (reduce16),
 * 8 for the AVX2 one (reduce8). */
#define LM_DOT_F16_STEPS(NAME, TARGET, L, VEC, ZERO, LOAD_X, LOAD_H, FMA, ADD, REDUCE)           \
    TARGET static inline float NAME(const float *x, const float *y, const unsigned char *yh,    \
                                    size_t np)                                                  \
    {                                                                                           \
        VEC a[4] = {ZERO, ZERO, ZERO, ZERO};                                                    \
        for (size_t i = 0; i < np; i += (size_t)4 * (L))                                        \
            for (size_t k = 0; k < 4; k++) {                                                    \
                const size_t e = i + (L) * k;                                                   \
                const VEC yv = yh ? LOAD_H(yh + 2 * e) : LOAD_X(y + e);                         \
                a[k] = FMA(LOAD_X(x + e), yv, a[k]);                                            \
            }                                                                                   \
        return REDUCE(ADD(ADD(a[0], a[2]), ADD(a[1], a[3])));                                   \
    }

#define LM_F16_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,fma")))
#define LM_F16_256 __attribute__((target("avx2,f16c,fma")))

/* reduce16's order on a register: the halves added lane by lane twice, then
 * lanes 0 + 2 and 1 + 3, then those two. */
LM_F16_512 static inline float reduce16_512(__m512 s)
{
    const __m256 t = _mm256_add_ps(_mm512_extractf32x8_ps(s, 1), _mm512_castps512_ps256(s));
    const __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u)); /* u0 + u2, u1 + u3 */
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

/* reduce8's: the halves added lane by lane, then two horizontal adds. */
LM_F16_256 static inline float reduce8_256(__m256 s)
{
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    const __m128 u = _mm_hadd_ps(t, t); /* t0 + t1, t2 + t3 */
    return _mm_cvtss_f32(_mm_hadd_ps(u, u));
}

LM_F16_512 static inline __m512 f16_h512(const unsigned char *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

LM_F16_256 static inline __m256 f16_h256(const unsigned char *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

LM_DOT_F16_STEPS(dot_f16_steps_512, LM_F16_512, 16, __m512, _mm512_setzero_ps(), _mm512_loadu_ps,
                 f16_h512, _mm512_fmadd_ps, _mm512_add_ps, reduce16_512)
LM_DOT_F16_STEPS(dot_f16_steps_256, LM_F16_256, 8, __m256, _mm256_setzero_ps(), _mm256_loadu_ps,
                 f16_h256, _mm256_fmadd_ps, _mm256_add_ps, reduce8_256)
#endif

/* lm_dot_f16's whole steps (*np elements) by the vector unit where `cpu`'s
 * lanes have a kernel on the active instruction set: 1 and *sum their
 * reduced float; 0 (nothing done) otherwise. */
static int dot_f16_steps(const float *x, const float *y, const unsigned char *yh, size_t n,
                         lm_llama_cpu cpu, size_t *np, float *sum)
{
#if LM_X86
    const lm_isa isa = lm_isa_active();
    if (isa == LM_ISA_SCALAR || !has_fma())
        return 0;
    if (cpu == LM_LLAMA_CPU_AVX2) {
        *np = n & ~(size_t)31;
        *sum = dot_f16_steps_256(x, y, yh, *np);
        return 1;
    }
    if (isa == LM_ISA_AVX512) {
        *np = n & ~(size_t)63;
        *sum = dot_f16_steps_512(x, y, yh, *np);
        return 1;
    }
#else
    (void)x, (void)y, (void)yh, (void)n, (void)cpu, (void)np, (void)sum;
#endif
    return 0;
}

void lm_dot_f16_keys(const float *x, const float *keys, size_t n, size_t S, float scale,
                     lm_llama_cpu cpu, float *out)
{
    for (size_t i = 0; i < n; i++) {
        const float *y = keys + i * S;
        size_t np;
        float steps;
        if (!dot_f16_steps(x, y, NULL, S, cpu, &np, &steps)) {
            out[i] = dot_f16_ref(x, y, NULL, S, cpu) * scale;
            continue;
        }
        double sum = (double)steps;
        for (size_t e = np; e < S; e++)
            sum += (double)(x[e] * y[e]);
        out[i] = (float)sum * scale;
    }
}

/* Element i of the second operand: half floats yh when given, else y. */
static inline float operand_at(const float *y, const unsigned char *yh, size_t i)
{
    return yh ? lm_f16_to_f32(lm__u16(yh + 2 * i)) : y[i];
}

/* ggml_vec_dot_f16's order, plainly (lm.h's lm_dot_f16). */
static float dot_f16_ref(const float *x, const float *y, const unsigned char *yh, size_t n,
                         lm_llama_cpu cpu)
{
#define Y(i) operand_at(y, yh, i)
    const size_t L = cpu == LM_LLAMA_CPU_AVX2 ? 8 : 16, np = n / (4 * L) * (4 * L);
    float acc[4][16] = {{0}};
    for (size_t i = 0; i < np; i++)
        acc[i % (4 * L) / L][i % L] += x[i] * Y(i);
    for (size_t e = 0; e < L; e++)
        acc[0][e] += acc[2][e], acc[1][e] += acc[3][e];
    for (size_t e = 0; e < L; e++)
        acc[0][e] += acc[1][e];
    double sum = (double)(L == 8 ? reduce8(acc[0]) : reduce16(acc[0]));
    for (size_t i = np; i < n; i++)
        sum += (double)(x[i] * Y(i));
    return (float)sum;
#undef Y
}

float lm_dot_f16(const float *x, const float *y, const unsigned char *yh, size_t n,
                 lm_llama_cpu cpu)
{
    if (!yh && !y) /* neither operand: no sum */
        return NAN;
    size_t np;
    float steps;
    if (!dot_f16_steps(x, y, yh, n, cpu, &np, &steps))
        return dot_f16_ref(x, y, yh, n, cpu);
    double sum = (double)steps;
    for (size_t i = np; i < n; i++)
        sum += (double)(x[i] * (yh ? lm_f16_to_f32(lm__u16(yh + 2 * i)) : y[i]));
    return (float)sum;
}

void lm_matvec_ref(const lm_matrix *w, const float *x, const lm_q8 *xq, float *out, size_t r0,
                   size_t r1)
{
    const int llama = xq && xq->fused && order_of(w, (lm_llama_cpu)xq->fused) != ORD_NONE;
    const int q8 = lm_matrix_q8_group(w) > 0;
    for (size_t r = r0; r < r1; r++)
        out[r - r0] = llama ? ref_dot_llama(w, r, x, xq)
                      : q8  ? ref_dot_q8(w, r, xq)
                            : ref_dot_float(w, r, x);
}

/* ---- the vector kernels: four rows ri[0..3] of w each ---- */

typedef void (*kern4_fn)(const lm_matrix *w, const size_t ri[8], const float *x, const lm_q8 *xq,
                         float out[8]);

#if LM_X86

/* float16 bits to float32 (exact, as lm_f16_to_f32), in one instruction. */
LM_INLINE_AVX2 float half(uint16_t h)
{
    return _cvtsh_ss(h);
}
#define F16(p) lm__u16(p)

LM_INLINE_AVX2 float finish8(__m256 acc, float tail)
{
    float a[8];
    _mm256_storeu_ps(a, acc);
    return combine(a, tail);
}

/* acc += w * x */
LM_INLINE_AVX2 __m256 madd8(__m256 acc, __m256 w, __m256 x)
{
    return _mm256_add_ps(acc, _mm256_mul_ps(w, x));
}

LM_INLINE_AVX2 __m256i bytes8(const unsigned char *p) /* 8 bytes zero-extended to int32 */
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

/* Eight exact int32 sums of 4 products of int8 each: lane k = sum over j in
 * [4k, 4k + 4) of w[j] * x[j] (|w| as unsigned bytes, its sign moved to x,
 * so -128 works; no pair sum reaches the int16 limit). */
LM_INLINE_AVX2 __m256i dot_i8(__m256i w, __m256i x)
{
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

#define ROWS4(w, ri, k) ((const unsigned char *)(w)->data + (ri)[k] * (w)->row_bytes)

/* A kernel's start: the nr rows' bytes, and their sums at zero. */
LM_INLINE_AVX2 void rows_begin(const lm_matrix *w, const size_t ri[8], int nr,
                               const unsigned char *p[8], __m256 acc[8])
{
    for (int k = 0; k < nr; k++) {
        p[k] = ROWS4(w, ri, k);
        acc[k] = _mm256_setzero_ps();
    }
}

/* A kernel's end when no tail is left: each row's lanes combined. */
LM_INLINE_AVX2 void rows_end(int nr, const __m256 acc[8], float out[8])
{
    for (int k = 0; k < nr; k++)
        out[k] = finish8(acc[k], 0.0f);
}

LM_INLINE_AVX2 void k_f32(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                          const lm_q8 *xq, float out[8])
{
    (void)xq;
    const float *p[8];
    __m256 acc[8];
    for (int k = 0; k < nr; k++) {
        p[k] = (const float *)(const void *)ROWS4(w, ri, k);
        acc[k] = _mm256_setzero_ps();
    }
    size_t n = w->cols, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        for (int k = 0; k < nr; k++)
            acc[k] = madd8(acc[k], _mm256_loadu_ps(p[k] + i), xv);
    }
    for (int k = 0; k < nr; k++) {
        float t = 0.0f;
        for (size_t e = i; e < n; e++)
            t += p[k][e] * x[e];
        out[k] = finish8(acc[k], t);
    }
}

LM_INLINE_AVX2 __m256 load_f16(const unsigned char *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

LM_INLINE_AVX2 __m256 load_bf16(const unsigned char *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* F16 and BF16: two bytes an element, widened on the fly. */
LM_INLINE_AVX2 void k_half(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                           float out[8], int bf16)
{
    const unsigned char *p[8];
    __m256 acc[8];
    rows_begin(w, ri, nr, p, acc);
    size_t n = w->cols, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        for (int k = 0; k < nr; k++)
            acc[k] = madd8(acc[k], bf16 ? load_bf16(p[k] + 2 * i) : load_f16(p[k] + 2 * i), xv);
    }
    for (int k = 0; k < nr; k++) {
        float t = 0.0f;
        for (size_t e = i; e < n; e++) {
            uint16_t h = lm__u16(p[k] + 2 * e);
            t += (bf16 ? lm_bf16_to_f32(h) : _cvtsh_ss(h)) * x[e];
        }
        out[k] = finish8(acc[k], t);
    }
}

LM_INLINE_AVX2 void k_f16(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                          const lm_q8 *xq, float out[8])
{
    (void)xq;
    k_half(nr, w, ri, x, out, 0);
}

LM_INLINE_AVX2 void k_bf16(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                           const lm_q8 *xq, float out[8])
{
    (void)xq;
    k_half(nr, w, ri, x, out, 1);
}

/* Q4_0: per block of 32, elements 0..15 the low nibbles of its 16 bytes,
 * 16..31 the high ones; (nibble - 8) * d. */
LM_INLINE_AVX2 void k_q4_0(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                           const lm_q8 *xq, float out[8])
{
    (void)xq;
    const unsigned char *p[8];
    __m256 acc[8];
    rows_begin(w, ri, nr, p, acc);
    const __m256i m4 = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
    for (size_t b = 0; b < w->cols / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        for (int k = 0; k < nr; k++) {
            const unsigned char *blk = p[k] + 18 * b;
            __m256 d = _mm256_set1_ps(half(F16(blk)));
            __m256i lo = bytes8(blk + 2), hi = bytes8(blk + 10);
            __m256 w0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(lo, m4), eight));
            __m256 w1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(hi, m4), eight));
            __m256 w2 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(lo, 4), eight));
            __m256 w3 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(hi, 4), eight));
            acc[k] = madd8(acc[k], _mm256_mul_ps(w0, d), x0);
            acc[k] = madd8(acc[k], _mm256_mul_ps(w1, d), x1);
            acc[k] = madd8(acc[k], _mm256_mul_ps(w2, d), x2);
            acc[k] = madd8(acc[k], _mm256_mul_ps(w3, d), x3);
        }
    }
    rows_end(nr, acc, out);
}

/* A Q4_K block's eight steps d * sc_j (d1) and offsets dmin * m_j (m1),
 * the 6-bit fields unpacked four at a time (the packing of lm__scale_min_k4:
 * bytes 0..3 sc 0..3 and the top bits of sc 4..7, bytes 4..7 m 0..3 and the
 * top bits of m 4..7, bytes 8..11 the low nibbles of sc and m 4..7). Each
 * lane is one float multiply of the same operands as the reference's. */
LM_INLINE_AVX2 void q4_k_scales(const unsigned char *blk, float d1[8], float m1[8])
{
    uint32_t u0, u1, u2;
    memcpy(&u0, blk + 4, 4);
    memcpy(&u1, blk + 8, 4);
    memcpy(&u2, blk + 12, 4);
    const uint32_t s_lo = u0 & 0x3f3f3f3fu, m_lo = u1 & 0x3f3f3f3fu;
    const uint32_t s_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4;
    const uint32_t m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4;
    __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)s_hi, (int)s_lo)));
    __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, (int)m_hi, (int)m_lo)));
    _mm256_storeu_ps(d1, _mm256_mul_ps(_mm256_set1_ps(half(F16(blk))), sc));
    _mm256_storeu_ps(m1, _mm256_mul_ps(_mm256_set1_ps(half(F16(blk + 2))), m));
}

/* Q4_K against the input quantized in groups of 32, one a sub-block: per
 * sub-block j the nibbles' byte products with the input's, summed in the
 * eight lanes of four (exact), and the input's own sums in the same lanes
 * (shared by the rows); lane += s * (d * sc_j * d_x) - sx * (dmin * m_j *
 * d_x), the reference's operations. */
LM_INLINE_AVX2 void q4_k_steps(const unsigned char *blk, const float *xd, float s1[8],
                               float s2[8])
{
    float d1[8], m1[8];
    q4_k_scales(blk, d1, m1);
    const __m256 dx = _mm256_loadu_ps(xd);
    _mm256_storeu_ps(s1, _mm256_mul_ps(_mm256_loadu_ps(d1), dx));
    _mm256_storeu_ps(s2, _mm256_mul_ps(_mm256_loadu_ps(m1), dx));
}

/* The lines of the block two ahead of blk, asked for now: with rows read
 * eight (or four) at a time the hardware's prefetcher alone left the loads
 * waiting (Q4_K's tokens a second rose by about a third with it, 11 to
 * 14.5, make bench-weights; Q8_0's by a fifth with its own below). A hint: no result depends on it. */
LM_INLINE_AVX2 void q4_k_ahead(const unsigned char *blk)
{
    const char *a = (const char *)blk + 288; /* two blocks of 144 bytes */
    _mm_prefetch(a, _MM_HINT_T0);
    _mm_prefetch(a + 64, _MM_HINT_T0);
    _mm_prefetch(a + 128, _MM_HINT_T0);
}

LM_INLINE_AVX2 void k_q4_k(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                           const lm_q8 *xq, float out[8])
{
    (void)x;
    const unsigned char *p[8];
    __m256 acc[8];
    rows_begin(w, ri, nr, p, acc);
    const __m256i m4 = _mm256_set1_epi8(0x0F), one8 = _mm256_set1_epi8(1);
    const __m256i one16 = _mm256_set1_epi16(1);
    for (size_t b = 0; b < w->cols / 256; b++) {
        float s1[8][8], s2[8][8];
        for (int k = 0; k < nr; k++) {
            q4_k_ahead(p[k] + 144 * b);
            q4_k_steps(p[k] + 144 * b, xq->d + 8 * b, s1[k], s2[k]);
        }
        for (size_t j = 0; j < 8; j++) { /* sub-block j: pair j / 2, low nibbles when even */
            const __m256i xv =
                _mm256_loadu_si256((const __m256i *)(const void *)(xq->q + 256 * b + 32 * j));
            const __m256 sx = _mm256_cvtepi32_ps(
                _mm256_madd_epi16(_mm256_maddubs_epi16(one8, xv), one16));
            for (int k = 0; k < nr; k++) {
                __m256i raw = _mm256_loadu_si256(
                    (const __m256i *)(const void *)(p[k] + 144 * b + 16 + 32 * (j / 2)));
                __m256i q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(raw, 4) : raw, m4);
                __m256 sq = _mm256_cvtepi32_ps(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), one16));
                acc[k] = _mm256_add_ps(
                    acc[k], _mm256_sub_ps(_mm256_mul_ps(sq, _mm256_broadcast_ss(&s1[k][j])),
                                          _mm256_mul_ps(sx, _mm256_broadcast_ss(&s2[k][j]))));
            }
        }
    }
    rows_end(nr, acc, out);
}

/* AVX-512 for the 4-bit types. Q4_K: the same as k_q4_k, two sub-blocks
 * (a pair's low and high nibbles, 64 consecutive elements) a register: the
 * lanes 0..7 of the sub-block 2i, 8..15 of 2i + 1, each half added to the
 * eight lanes in sub-block order. */
#define LM_INLINE_AVX512                                                                          \
    static inline __attribute__((always_inline,                                                   \
                                 target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))
LM_INLINE_AVX512 void k_q4_k_512(const int nr, const lm_matrix *w, const size_t ri[8],
                                 const float *x, const lm_q8 *xq, float out[8])
{
    (void)x;
    const unsigned char *p[8];
    __m256 acc[8];
    rows_begin(w, ri, nr, p, acc);
    const __m512i m4 = _mm512_set1_epi8(0x0F), one8 = _mm512_set1_epi8(1);
    const __m512i one16 = _mm512_set1_epi16(1);
    for (size_t b = 0; b < w->cols / 256; b++) {
        __m512 s1[8], s2[8];
        for (int k = 0; k < nr; k++) {
            q4_k_ahead(p[k] + 144 * b);
            float a[8], c[8];
            q4_k_steps(p[k] + 144 * b, xq->d + 8 * b, a, c);
            s1[k] = _mm512_castps256_ps512(_mm256_loadu_ps(a));
            s2[k] = _mm512_castps256_ps512(_mm256_loadu_ps(c));
        }
        for (size_t i = 0; i < 4; i++) { /* sub-blocks 2i and 2i + 1 */
            const __m512i xv = _mm512_loadu_si512((const void *)(xq->q + 256 * b + 64 * i));
            const __m512 sx = _mm512_cvtepi32_ps(
                _mm512_madd_epi16(_mm512_maddubs_epi16(one8, xv), one16));
            const int lo = (int)(2 * i), hi = lo + 1;
            const __m512i idx = _mm512_set_epi32(hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo,
                                                 lo, lo, lo);
            for (int k = 0; k < nr; k++) {
                const __m256i raw = _mm256_loadu_si256(
                    (const __m256i *)(const void *)(p[k] + 144 * b + 16 + 32 * i));
                const __m512i q = _mm512_and_si512(
                    _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1),
                    m4);
                const __m512 sq = _mm512_cvtepi32_ps(
                    _mm512_madd_epi16(_mm512_maddubs_epi16(q, xv), one16));
                const __m512 t =
                    _mm512_sub_ps(_mm512_mul_ps(sq, _mm512_permutexvar_ps(idx, s1[k])),
                                  _mm512_mul_ps(sx, _mm512_permutexvar_ps(idx, s2[k])));
                acc[k] = _mm256_add_ps(acc[k], _mm512_castps512_ps256(t));
                acc[k] = _mm256_add_ps(acc[k], _mm512_extractf32x8_ps(t, 1));
            }
        }
    }
    rows_end(nr, acc, out);
}

/* Q4_0 with AVX-512's two-register permute: per block the 16 values a
 * nibble can stand for, (q - 8) * d for q = 0..15 (the reference's
 * operations), in two registers of 8, each element's weight looked up by
 * its nibble (the permute reads the index's low four bits, so the low
 * nibble needs no mask), then multiplied and added in element order. */
LM_INLINE_AVX512 void k_q4_0_lut(const int nr, const lm_matrix *w, const size_t ri[8],
                                 const float *x, const lm_q8 *xq, float out[8])
{
    (void)xq;
    const unsigned char *p[8];
    __m256 acc[8];
    rows_begin(w, ri, nr, p, acc);
    const __m256 lo8 = _mm256_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1);
    const __m256 hi8 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t b = 0; b < w->cols / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        for (int k = 0; k < nr; k++) {
            const unsigned char *blk = p[k] + 18 * b;
            __m256 d = _mm256_set1_ps(half(F16(blk)));
            __m256 tlo = _mm256_mul_ps(lo8, d), thi = _mm256_mul_ps(hi8, d);
            __m256i lo = bytes8(blk + 2), hi = bytes8(blk + 10);
            acc[k] = madd8(acc[k], _mm256_permutex2var_ps(tlo, lo, thi), x0);
            acc[k] = madd8(acc[k], _mm256_permutex2var_ps(tlo, hi, thi), x1);
            acc[k] = madd8(acc[k], _mm256_permutex2var_ps(tlo, _mm256_srli_epi32(lo, 4), thi), x2);
            acc[k] = madd8(acc[k], _mm256_permutex2var_ps(tlo, _mm256_srli_epi32(hi, 4), thi), x3);
        }
    }
    rows_end(nr, acc, out);
}

/* Q6_K: per block of 256, two halves of 128 in four runs of 32: the low
 * nibbles of ql[0..32) and ql[32..64), then their high nibbles, each with
 * two bits of qh[0..32); (d * sc) * (q - 32), a scale per 16. */
LM_INLINE_AVX2 void k_q6_k(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                           const lm_q8 *xq, float out[8])
{
    (void)xq;
    const unsigned char *p[8];
    __m256 acc[8];
    rows_begin(w, ri, nr, p, acc);
    const __m256i m4 = _mm256_set1_epi32(0xF), m2 = _mm256_set1_epi32(3);
    const __m256i k32 = _mm256_set1_epi32(32);
    for (size_t b = 0; b < w->cols / 256; b++) {
        float dk[8];
        for (int k = 0; k < nr; k++)
            dk[k] = half(F16(p[k] + 210 * b + 208));
        for (size_t h = 0; h < 2; h++) {
            for (size_t run = 0; run < 4; run++) { /* elements 128h + 32 run + [0, 32) */
                const float *xr = x + 256 * b + 128 * h + 32 * run;
                for (size_t c = 0; c < 4; c++) {
                    __m256 xv = _mm256_loadu_ps(xr + 8 * c);
                    for (int k = 0; k < nr; k++) {
                        const unsigned char *blk = p[k] + 210 * b;
                        const unsigned char *ql = blk + 64 * h + 32 * (run % 2) + 8 * c;
                        const unsigned char *qh = blk + 128 + 32 * h + 8 * c;
                        const int8_t sc = (int8_t)blk[192 + 8 * h + 2 * run + c / 2];
                        __m256i lo = bytes8(ql);
                        lo = run < 2 ? _mm256_and_si256(lo, m4) : _mm256_srli_epi32(lo, 4);
                        __m256i hi =
                            _mm256_and_si256(_mm256_srli_epi32(bytes8(qh), (int)(2 * run)), m2);
                        __m256i q = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)),
                                                     k32);
                        __m256 ds = _mm256_set1_ps(dk[k] * (float)sc);
                        acc[k] = madd8(acc[k], _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q)), xv);
                    }
                }
            }
        }
    }
    rows_end(nr, acc, out);
}

/* The other block types (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL,
 * IQ4_XS): each row's next 256 values (whole blocks: 256 is a multiple of
 * every block) dequantized by quant.c's own code, the reference's, into a
 * buffer (8 rows of 256 floats, 8 KB of stack), then multiplied and added
 * eight at a time in element order. The dequantization is scalar: the
 * product is the reference's arithmetic, not a faster one. */
LM_INLINE_AVX2 void k_deq(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                          const lm_q8 *xq, float out[8])
{
    (void)xq;
    const unsigned char *p[8];
    __m256 acc[8];
    rows_begin(w, ri, nr, p, acc);
    float buf[8][256];
    const size_t n = w->cols;
    for (size_t s = 0, c; s < n; s += c) {
        c = n - s > 256 ? 256 : n - s; /* whole blocks, a multiple of 8 */
        for (int k = 0; k < nr; k++)
            lm__dequant_span(w, ri[k], s, c, buf[k]);
        for (size_t i = 0; i < c; i += 8) {
            __m256 xv = _mm256_loadu_ps(x + s + i);
            for (int k = 0; k < nr; k++)
                acc[k] = madd8(acc[k], _mm256_loadu_ps(buf[k] + i), xv);
        }
    }
    rows_end(nr, acc, out);
}

/* Q8_0 against the input quantized in groups of 32. */
LM_INLINE_AVX2 void k_q8_0(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                           const lm_q8 *xq, float out[8])
{
    (void)x;
    const unsigned char *p[8];
    __m256 acc[8];
    rows_begin(w, ri, nr, p, acc);
    for (size_t b = 0; b < w->cols / 32; b++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq->q + 32 * b));
        const float xd = xq->d[b];
        for (int k = 0; k < nr; k++) {
            const unsigned char *blk = p[k] + 34 * b;
            _mm_prefetch((const char *)blk + 384, _MM_HINT_T0); /* as q4_k_ahead */
            __m256i wv = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
            const float scale = half(F16(blk)) * xd;
            __m256 s = _mm256_cvtepi32_ps(dot_i8(wv, xv));
            acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(s, _mm256_set1_ps(scale)));
        }
    }
    rows_end(nr, acc, out);
}

/* LM_I8G with a group size that is a multiple of 32. */
LM_INLINE_AVX2 void k_i8g(const int nr, const lm_matrix *w, const size_t ri[8], const float *x,
                          const lm_q8 *xq, float out[8])
{
    (void)x;
    const unsigned char *p[8];
    __m256 acc[8];
    rows_begin(w, ri, nr, p, acc);
    size_t G = w->group;
    for (size_t g = 0; g < w->cols / G; g++) {
        __m256i s[8];
        for (int k = 0; k < 8; k++)
            s[k] = _mm256_setzero_si256();
        for (size_t c = 0; c < G; c += 32) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq->q + g * G + c));
            for (int k = 0; k < nr; k++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(const void *)(p[k] + g * G + c));
                s[k] = _mm256_add_epi32(s[k], dot_i8(wv, xv));
            }
        }
        const float xd = xq->d[g];
        for (int k = 0; k < nr; k++) {
            const float scale = lm__i8g_scale(w, ri[k] * w->cols + g * G) * xd;
            acc[k] = _mm256_add_ps(acc[k],
                                   _mm256_mul_ps(_mm256_cvtepi32_ps(s[k]), _mm256_set1_ps(scale)));
        }
    }
    rows_end(nr, acc, out);
}

/* The kernels of one instruction set, from the bodies above, on NR rows at
 * a time (4 for AVX2's 16 registers, 8 for AVX-512's 32: enough
 * independent sums to hide the adds' latency). */
#define LM_KERNEL(NAME, BODY, SUFFIX, TARGET, NR)                                                 \
    TARGET __attribute__((unused)) static void NAME##_##SUFFIX(                                   \
        const lm_matrix *w, const size_t ri[8], const float *x, const lm_q8 *xq, float out[8])    \
    {                                                                                             \
        BODY(NR, w, ri, x, xq, out);                                                              \
    }
#define LM_KERNELS(SUFFIX, TARGET, NR)                                                            \
    LM_KERNEL(f32, k_f32, SUFFIX, TARGET, NR)                                                     \
    LM_KERNEL(f16, k_f16, SUFFIX, TARGET, NR)                                                     \
    LM_KERNEL(bf16, k_bf16, SUFFIX, TARGET, NR)                                                   \
    LM_KERNEL(q4_0, k_q4_0, SUFFIX, TARGET, NR)                                                   \
    LM_KERNEL(q4_k, k_q4_k, SUFFIX, TARGET, NR)                                                   \
    LM_KERNEL(q6_k, k_q6_k, SUFFIX, TARGET, NR)                                                   \
    LM_KERNEL(q8_0, k_q8_0, SUFFIX, TARGET, NR)                                                   \
    LM_KERNEL(i8g, k_i8g, SUFFIX, TARGET, NR)                                                     \
    LM_KERNEL(deq, k_deq, SUFFIX, TARGET, NR)

LM_KERNELS(avx2, LM_AVX2, 4)
LM_KERNELS(avx512, LM_AVX512, 8)
LM_KERNEL(q4_k_512, k_q4_k_512, avx512, LM_AVX512, 8)
LM_KERNEL(q4_0_lut, k_q4_0_lut, avx512, LM_AVX512, 8)

#define LM_TABLE(SUFFIX)                                                                          \
    {f32_##SUFFIX, f16_##SUFFIX, bf16_##SUFFIX, q4_0_##SUFFIX, q4_k_##SUFFIX, q6_k_##SUFFIX,      \
     q8_0_##SUFFIX, i8g_##SUFFIX, deq_##SUFFIX}

enum { N_KINDS = 9 };
/* AVX-512: the AVX2 bodies, but the 4-bit types' own kernels */
static const kern4_fn kernels[LM_ISA_COUNT][N_KINDS] = {
    {NULL},
    LM_TABLE(avx2),
    {f32_avx512, f16_avx512, bf16_avx512, q4_0_lut_avx512, q4_k_512_avx512, q6_k_avx512,
     q8_0_avx512, i8g_avx512, deq_avx512}};
static const size_t kernel_rows[LM_ISA_COUNT] = {1, 4, 8};

#else
enum { N_KINDS = 9 };
static const kern4_fn kernels[LM_ISA_COUNT][N_KINDS] = {{NULL}};
static const size_t kernel_rows[LM_ISA_COUNT] = {1, 1, 1};
#endif

/* The kernel table's column of a type; -1: only the reference. */
static int kind(const lm_matrix *w)
{
    switch (w->type) {
    case LM_F32: return 0;
    case LM_F16: return 1;
    case LM_BF16: return 2;
    case LM_Q4_0: return 3;
    case LM_Q4_K: return 4;
    case LM_Q6_K: return 5;
    case LM_Q8_0: return 6;
    case LM_I8G: return w->group % 32 == 0 ? 7 : -1;
    case LM_Q4_1:
    case LM_Q5_0:
    case LM_Q5_1:
    case LM_Q2_K:
    case LM_Q3_K:
    case LM_Q5_K:
    case LM_IQ4_NL:
    case LM_IQ4_XS: return 8;
    default: return -1;
    }
}

#if LM_X86
/* ref_dot_fused of Q8_0 rows with AVX2 and FMA, row by row: the same bits. */
__attribute__((target("avx2,f16c,fma"))) static void q8_0_fused_rows(const lm_matrix *w,
                                                                      const lm_q8 *xq, float *out,
                                                                      size_t r0, size_t r1)
{
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < w->cols / 32; b++) {
            const unsigned char *blk = row + 34 * b;
            __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq->q + 32 * b));
            __m256i wv = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
            const __m256 d = _mm256_set1_ps(half(F16(blk)) * xq->d[b]);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(wv, xv)), acc);
        }
        float a[8];
        _mm256_storeu_ps(a, acc);
        out[r - r0] = combine_hsum(a);
    }
}

/* A Q4_K block's 6-bit scales and mins, eight bytes each, in sub-block
 * order (lm__scale_min_k4's fields four at a time, as q4_k_scales). */
static inline void q4_k_fields(const unsigned char *blk, uint8_t sc[8], uint8_t m[8])
{
    uint32_t u0, u1, u2, f[4];
    memcpy(&u0, blk + 4, 4);
    memcpy(&u1, blk + 8, 4);
    memcpy(&u2, blk + 12, 4);
    f[0] = u0 & 0x3f3f3f3fu, f[2] = u1 & 0x3f3f3f3fu;
    f[1] = (u2 & 0x0f0f0f0fu) | ((u0 >> 6) & 0x03030303u) << 4;
    f[3] = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 6) & 0x03030303u) << 4;
    memcpy(sc, f, 8);
    memcpy(m, f + 2, 8);
}

/* The input's sums over runs of `run` (16 or 32) of each block of 256, for
 * the Q6_K and Q4_K rows below: nb blocks, nb * 256 / run sums. */
static void q8_k_sums(const int8_t *x, size_t nb, size_t run, int16_t *bs)
{
    for (size_t g = 0; g < nb * 256 / run; g++) {
        int s = 0;
        for (size_t l = 0; l < run; l++)
            s += x[run * g + l];
        bs[g] = (int16_t)s; /* |s| <= 32 * 128 */
    }
}

enum { FUSED_BLOCKS = 256 }; /* the sums' buffer: rows of up to 65536 columns */

/* ref_dot_q6_k_fused with AVX2 and FMA, row by row: each lane's exact
 * integer sum (the bytes' products by maddubs, their scales by madd, in the
 * lanes of ggml_vec_dot_q6_K_q8_K), then the same fused multiply-adds and
 * hsum_float_8: the same bits. */
__attribute__((target("avx2,f16c,fma"))) static void q6_k_fused_rows(const lm_matrix *w,
                                                                      const lm_q8 *xq, float *out,
                                                                      size_t r0, size_t r1)
{
    const size_t nb = w->cols / 256;
    int16_t bs[FUSED_BLOCKS * 16];
    q8_k_sums(xq->q, nb, 16, bs);
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const unsigned char *blk = row + 210 * b;
            const int8_t *sc = (const int8_t *)(const void *)(blk + 192), *x = xq->q + 256 * b;
            _mm_prefetch((const char *)blk + 420, _MM_HINT_T0); /* two blocks ahead */
            _mm_prefetch((const char *)blk + 484, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + 548, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + 612, _MM_HINT_T0);
            const __m256i sc16 =
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)sc));
            int16_t sw[16]; /* the scales as words */
            _mm256_storeu_si256((__m256i *)(void *)sw, sc16);
            __m256i lane = _mm256_slli_epi32(
                _mm256_madd_epi16(
                    _mm256_loadu_si256((const __m256i *)(const void *)(bs + 16 * b)), sc16),
                5); /* 32 (bsum_2k sc_2k + bsum_2k+1 sc_2k+1), taken off below */
            lane = _mm256_sub_epi32(_mm256_setzero_si256(), lane);
            for (size_t j = 0; j < 2; j++) {
                const __m256i qa = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * j));
                const __m256i qb =
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * j + 32));
                const __m256i qh =
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + 128 + 32 * j));
                for (size_t m = 0; m < 4; m++) {
                    const __m256i src = m & 1 ? qb : qa;
                    const __m256i lo = _mm256_and_si256(m < 2 ? src : _mm256_srli_epi16(src, 4), m4);
                    const __m256i hi = _mm256_slli_epi16(
                        _mm256_and_si256(_mm256_srli_epi16(qh, (int)(2 * m)), m2), 4);
                    const __m256i xv = _mm256_loadu_si256(
                        (const __m256i *)(const void *)(x + 128 * j + 32 * m));
                    const __m256i p16 = _mm256_maddubs_epi16(_mm256_or_si256(lo, hi), xv);
                    const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sw[8 * j + 2 * m + 1]),
                                                       _mm_set1_epi16(sw[8 * j + 2 * m]));
                    lane = _mm256_add_epi32(lane, _mm256_madd_epi16(p16, s));
                }
            }
            const float d = xq->d[8 * b] * half(F16(blk + 208));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lane), acc);
        }
        float a[8];
        _mm256_storeu_ps(a, acc);
        out[r - r0] = combine_hsum(a);
    }
}

/* ref_dot_q4_k_fused with AVX2 and FMA, row by row: a block's sum of
 * sc_j sum(q x) exact in eight integer lanes, the mins' sum from the input's
 * sums of 32, then the reference's two fused multiply-adds: the same bits. */
__attribute__((target("avx2,f16c,fma"))) static void q4_k_fused_rows(const lm_matrix *w,
                                                                      const lm_q8 *xq, float *out,
                                                                      size_t r0, size_t r1)
{
    const size_t nb = w->cols / 256;
    int16_t bs[FUSED_BLOCKS * 8];
    q8_k_sums(xq->q, nb, 32, bs);
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
        __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const unsigned char *blk = row + 144 * b;
            const int8_t *x = xq->q + 256 * b;
            q4_k_ahead(blk);
            uint8_t sc[8], mn[8];
            q4_k_fields(blk, sc, mn);
            __m256i lane = _mm256_setzero_si256();
            for (size_t i = 0; i < 4; i++) { /* sub-blocks 2i (low nibbles) and 2i + 1 */
                const __m256i raw =
                    _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16 + 32 * i));
                const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 64 * i));
                const __m256i x1 =
                    _mm256_loadu_si256((const __m256i *)(const void *)(x + 64 * i + 32));
                const __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(raw, m4), x0);
                const __m256i p1 =
                    _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), x1);
                lane = _mm256_add_epi32(
                    lane, _mm256_madd_epi16(p0, _mm256_set1_epi16((short)sc[2 * i])));
                lane = _mm256_add_epi32(
                    lane, _mm256_madd_epi16(p1, _mm256_set1_epi16((short)sc[2 * i + 1])));
            }
            const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(lane),
                                            _mm256_extracti128_si256(lane, 1));
            const __m128i h2 = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            const int32_t isum = _mm_cvtsi128_si32(_mm_add_epi32(h2, _mm_shuffle_epi32(h2, 0xb1)));
            int32_t imin = 0;
            for (size_t j = 0; j < 8; j++)
                imin += (int32_t)mn[j] * bs[8 * b + (size_t)j];
            const float dx = xq->d[8 * b];
            acc = _mm_fmadd_ss(_mm_set_ss((float)isum), _mm_set_ss(half(F16(blk)) * dx), acc);
            accm = _mm_fmadd_ss(_mm_set_ss((float)imin), _mm_set_ss(half(F16(blk + 2)) * dx),
                                accm);
        }
        out[r - r0] = _mm_cvtss_f32(acc) - _mm_cvtss_f32(accm);
    }
}

#define LM_FUSED_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,fma")))

/* q6_k_fused_rows with AVX-512: two runs of 32 a register (their scales
 * spread by one word permute), the 16 lanes folded to the reference's 8 by
 * adding the halves: exact integers, so the same lanes and the same bits. */
LM_FUSED_512 static void q6_k_fused_rows_512(const lm_matrix *w, const lm_q8 *xq, float *out,
                                             size_t r0, size_t r1)
{
    const size_t nb = w->cols / 256;
    int16_t bs[FUSED_BLOCKS * 16];
    q8_k_sums(xq->q, nb, 16, bs);
    const __m512i m4 = _mm512_set1_epi8(0xF), m2 = _mm512_set1_epi8(3);
    __m512i idx[4]; /* run pair p of half j: words 8i .. 8i + 7 take scale 8j + 4p + i */
    for (int k = 0; k < 4; k++) {
        int16_t t[32];
        for (int e = 0; e < 32; e++)
            t[e] = (int16_t)(4 * k + e / 8);
        idx[k] = _mm512_loadu_si512((const void *)t);
    }
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
        __m256 acc = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const unsigned char *blk = row + 210 * b;
            const int8_t *x = xq->q + 256 * b;
            _mm_prefetch((const char *)blk + 420, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + 484, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + 548, _MM_HINT_T0);
            _mm_prefetch((const char *)blk + 612, _MM_HINT_T0);
            const __m256i sc16 =
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 192)));
            const __m512i sc = _mm512_castsi256_si512(sc16);
            __m512i lane = _mm512_setzero_si512();
            for (size_t j = 0; j < 2; j++) {
                const __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * j));
                const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 128 + 32 * j));
                const __m512i qh = _mm512_inserti64x4(_mm512_castsi256_si512(h),
                                                      _mm256_srli_epi16(h, 2), 1);
                for (size_t p = 0; p < 2; p++) { /* runs 2p and 2p + 1 */
                    const __m512i lo =
                        _mm512_and_si512(p ? _mm512_srli_epi16(ql, 4) : ql, m4);
                    const __m512i hi = _mm512_slli_epi16(
                        _mm512_and_si512(p ? _mm512_srli_epi16(qh, 4) : qh, m2), 4);
                    const __m512i xv = _mm512_loadu_si512((const void *)(x + 128 * j + 64 * p));
                    const __m512i p16 = _mm512_maddubs_epi16(_mm512_or_si512(lo, hi), xv);
                    const __m512i s = _mm512_permutexvar_epi16(idx[2 * j + p], sc);
                    lane = _mm512_add_epi32(lane, _mm512_madd_epi16(p16, s));
                }
            }
            __m256i l8 = _mm256_add_epi32(_mm512_castsi512_si256(lane),
                                          _mm512_extracti64x4_epi64(lane, 1));
            const __m256i mins = _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)(const void *)(bs + 16 * b)), sc16);
            l8 = _mm256_sub_epi32(l8, _mm256_slli_epi32(mins, 5));
            const float d = xq->d[8 * b] * half(F16(blk + 208));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(l8), acc);
        }
        float a[8];
        _mm256_storeu_ps(a, acc);
        out[r - r0] = combine_hsum(a);
    }
}

/* q4_k_fused_rows with AVX-512: 64 bytes of a block's nibbles a register,
 * their low nibbles sub-blocks 4h and 4h + 2, their high ones 4h + 1 and
 * 4h + 3, against the input laid out once in that order (xp); each half
 * scaled by its sub-block's scale; the mins' sum from the input's sums of
 * 32 in the same reduction: exact integers, then the reference's fused
 * multiply-adds. */
LM_FUSED_512 static void q4_k_fused_rows_512(const lm_matrix *w, const lm_q8 *xq, float *out,
                                             size_t r0, size_t r1)
{
    const size_t nb = w->cols / 256;
    int16_t bs[FUSED_BLOCKS * 8];
    _Alignas(64) int8_t xp[FUSED_BLOCKS * 256];
    q8_k_sums(xq->q, nb, 32, bs);
    static const size_t order[8] = {0, 2, 1, 3, 4, 6, 5, 7}; /* xp's sub-blocks */
    for (size_t b = 0; b < nb; b++)
        for (size_t j = 0; j < 8; j++)
            memcpy(xp + 256 * b + 32 * j, xq->q + 256 * b + 32 * order[j], 32);
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512i idx[4]; /* register k: words 0..15 scale order[2k], 16..31 order[2k + 1] */
    for (int k = 0; k < 4; k++) {
        int16_t t[32];
        for (int e = 0; e < 32; e++)
            t[e] = (int16_t)order[2 * k + e / 16];
        idx[k] = _mm512_loadu_si512((const void *)t);
    }
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
        __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const unsigned char *blk = row + 144 * b;
            const int8_t *x = xp + 256 * b;
            q4_k_ahead(blk);
            uint8_t sc[8], mn[8];
            q4_k_fields(blk, sc, mn);
            const __m512i s16 = _mm512_castsi128_si512(
                _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)sc)));
            __m512i lane = _mm512_setzero_si512();
            for (size_t h = 0; h < 2; h++) {
                const __m512i raw = _mm512_loadu_si512((const void *)(blk + 16 + 64 * h));
                const __m512i lo = _mm512_and_si512(raw, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                const __m512i p0 =
                    _mm512_maddubs_epi16(lo, _mm512_load_si512((const void *)(x + 128 * h)));
                const __m512i p1 =
                    _mm512_maddubs_epi16(hi, _mm512_load_si512((const void *)(x + 128 * h + 64)));
                lane = _mm512_add_epi32(
                    lane, _mm512_madd_epi16(p0, _mm512_permutexvar_epi16(idx[2 * h], s16)));
                lane = _mm512_add_epi32(
                    lane, _mm512_madd_epi16(p1, _mm512_permutexvar_epi16(idx[2 * h + 1], s16)));
            }
            const __m256i l8 = _mm256_add_epi32(_mm512_castsi512_si256(lane),
                                                _mm512_extracti64x4_epi64(lane, 1));
            const __m128i l4 =
                _mm_add_epi32(_mm256_castsi256_si128(l8), _mm256_extracti128_si256(l8, 1));
            const __m128i m = _mm_madd_epi16(
                _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)mn)),
                _mm_loadu_si128((const __m128i *)(const void *)(bs + 8 * b)));
            const __m128i h = _mm_hadd_epi32(l4, m); /* i01 i23 m01 m23 */
            const __m128 both = _mm_cvtepi32_ps(_mm_hadd_epi32(h, h)); /* isum, imin */
            const float dx = xq->d[8 * b];
            acc = _mm_fmadd_ss(both, _mm_set_ss(half(F16(blk)) * dx), acc);
            accm = _mm_fmadd_ss(_mm_movehdup_ps(both), _mm_set_ss(half(F16(blk + 2)) * dx), accm);
        }
        out[r - r0] = _mm_cvtss_f32(acc) - _mm_cvtss_f32(accm);
    }
}

/* Row q's block 0 in the packed copy (lm_matrix_pack). */
static inline const unsigned char *packed_row(const lm_matrix *w, size_t q)
{
    return w->packed + (q / 4) * 4 * w->row_bytes + 144 * (q % 4);
}

/* q4_k_fused_rows with AVX-512 over the packed copy (lm_matrix_pack: block
 * b of rows 4g .. 4g + 3 in 576 contiguous bytes, read in order), four rows
 * at a time. A block's 16-byte
 * header (d, dmin, then the 12 bytes of 6-bit scales and mins) of row k is
 * lane k of one register, unpacked there as q4_k_fields does (bytes 0..7
 * the scales, 8..15 the mins) for the four rows at once. 64 bytes of
 * nibbles a register, their low nibbles sub-blocks 4h and 4h + 2, their
 * high ones 4h + 1 and 4h + 3, against the input laid out once in that
 * order (xp, loaded once for the four rows); each half scaled by its
 * sub-block's scale; the four rows' exact integer sums reduced together,
 * the mins' sums from the input's sums of 32 likewise; then the reference's
 * fused multiply-adds, row k in lane k (a vector fma rounds as fmaf does):
 * the same bits. Rows past r1 repeat the last row, their results dropped;
 * a range may start or end inside a group of four. No prefetch hints: the
 * copy is read front to back, which the hardware's own prefetch follows. */
LM_FUSED_512 static void q4_k_packed_rows_512(const lm_matrix *w, const lm_q8 *xq, float *out,
                                             size_t r0, size_t r1)
{
    const size_t nb = w->cols / 256;
    int16_t bs[FUSED_BLOCKS * 8];
    _Alignas(64) int8_t xp[FUSED_BLOCKS * 256];
    q8_k_sums(xq->q, nb, 32, bs);
    static const size_t order[8] = {0, 2, 1, 3, 4, 6, 5, 7}; /* xp's sub-blocks */
    for (size_t b = 0; b < nb; b++)
        for (size_t j = 0; j < 8; j++)
            memcpy(xp + 256 * b + 32 * j, xq->q + 256 * b + 32 * order[j], 32);
    const __m512i m4 = _mm512_set1_epi8(0xF);
    /* idx[e][k]: register k of a row whose header words start at 16 e (rows
     * 0 and 2: e = 0; 1 and 3: e = 1): words 0..15 take scale order[2k],
     * 16..31 order[2k + 1] */
    __m512i idx[2][4];
    for (int e = 0; e < 2; e++)
        for (int k = 0; k < 4; k++) {
            int16_t t[32];
            for (int i = 0; i < 32; i++)
                t[i] = (int16_t)(16 * e + (int)order[2 * k + i / 16]);
            idx[e][k] = _mm512_loadu_si512((const void *)t);
        }
    const __m512i c3f = _mm512_set1_epi32(0x3f3f3f3f), c0f = _mm512_set1_epi32(0x0f0f0f0f),
                  c03 = _mm512_set1_epi32(0x03030303),
                  shift = _mm512_setr_epi32(0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4);
    /* the header words d (0, 8, 16, 24) then dmin (1, 9, 17, 25) */
    const __m512i dwords = _mm512_setr_epi64(0x0018001000080000LL, 0x0019001100090001LL, 0, 0, 0,
                                             0, 0, 0);
    /* the mins' totals, rows 0 and 1 in lanes 4 and 12 of one register, 2
     * and 3 of the other */
    const __m512i tot = _mm512_setr_epi32(4, 12, 20, 28, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    for (size_t r = r0; r < r1; r += 4) {
        const unsigned char *row[4]; /* block 0 of each row */
        for (size_t k = 0; k < 4; k++)
            row[k] = packed_row(w, r + k < r1 ? r + k : r1 - 1);
        __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            const int8_t *x = xp + 256 * b;
            const __m512i x0 = _mm512_load_si512((const void *)x);
            const __m512i x1 = _mm512_load_si512((const void *)(x + 64));
            const __m512i x2 = _mm512_load_si512((const void *)(x + 128));
            const __m512i x3 = _mm512_load_si512((const void *)(x + 192));
            const unsigned char *blk[4];
            for (size_t k = 0; k < 4; k++)
                blk[k] = row[k] + 576 * b;
            __m512i hd = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)blk[0]));
            hd = _mm512_inserti32x4(hd, _mm_loadu_si128((const __m128i *)(const void *)blk[1]), 1);
            hd = _mm512_inserti32x4(hd, _mm_loadu_si128((const __m128i *)(const void *)blk[2]), 2);
            hd = _mm512_inserti32x4(hd, _mm_loadu_si128((const __m128i *)(const void *)blk[3]), 3);
            /* dwords of a lane: d|dmin, u0, u1, u2 -> f0 f1 f2 f3 (q4_k_fields) */
            const __m512i pp = _mm512_shuffle_epi32(hd, (_MM_PERM_ENUM)0xA5); /* u0 u0 u1 u1 */
            const __m512i qq =
                _mm512_srlv_epi32(_mm512_shuffle_epi32(hd, _MM_PERM_DDDD), shift); /* u2 .. u2>>4 */
            const __m512i even = _mm512_and_si512(pp, c3f);
            const __m512i odd = _mm512_or_si512(
                _mm512_and_si512(qq, c0f),
                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(pp, 6), c03), 4));
            const __m512i f = _mm512_mask_blend_epi32(0xAAAA, even, odd);
            const __m512i wl = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(f)); /* rows 0, 1 */
            const __m512i wh = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(f, 1)); /* 2, 3 */
            __m256i l8[4];
            for (size_t k = 0; k < 4; k++) {
                const __m512i s16 = k < 2 ? wl : wh;
                const __m512i *ix = idx[k & 1];
                const __m512i raw0 = _mm512_loadu_si512((const void *)(blk[k] + 16));
                const __m512i raw1 = _mm512_loadu_si512((const void *)(blk[k] + 80));
                const __m512i p0 = _mm512_maddubs_epi16(_mm512_and_si512(raw0, m4), x0);
                const __m512i p1 =
                    _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(raw0, 4), m4), x1);
                const __m512i p2 = _mm512_maddubs_epi16(_mm512_and_si512(raw1, m4), x2);
                const __m512i p3 =
                    _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(raw1, 4), m4), x3);
                const __m512i lane = _mm512_add_epi32(
                    _mm512_add_epi32(_mm512_madd_epi16(p0, _mm512_permutexvar_epi16(ix[0], s16)),
                                     _mm512_madd_epi16(p1, _mm512_permutexvar_epi16(ix[1], s16))),
                    _mm512_add_epi32(_mm512_madd_epi16(p2, _mm512_permutexvar_epi16(ix[2], s16)),
                                     _mm512_madd_epi16(p3, _mm512_permutexvar_epi16(ix[3], s16))));
                l8[k] = _mm256_add_epi32(_mm512_castsi512_si256(lane),
                                         _mm512_extracti64x4_epi64(lane, 1));
            }
            /* four rows' eight lanes to four sums: [r0 r1 r2 r3] */
            const __m256i u = _mm256_hadd_epi32(_mm256_hadd_epi32(l8[0], l8[1]),
                                                _mm256_hadd_epi32(l8[2], l8[3]));
            const __m128i isum =
                _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
            /* m_j * sum(x_j): the mins' words (8..15 of each 16) against the block's 8 sums */
            const __m512i bsv = _mm512_maskz_broadcast_i32x4(
                0xF0F0, _mm_loadu_si128((const __m128i *)(const void *)(bs + 8 * b)));
            __m512i ml = _mm512_madd_epi16(wl, bsv), mh = _mm512_madd_epi16(wh, bsv);
            ml = _mm512_add_epi32(ml, _mm512_shuffle_epi32(ml, _MM_PERM_BADC));
            mh = _mm512_add_epi32(mh, _mm512_shuffle_epi32(mh, _MM_PERM_BADC));
            ml = _mm512_add_epi32(ml, _mm512_shuffle_epi32(ml, _MM_PERM_CDAB));
            mh = _mm512_add_epi32(mh, _mm512_shuffle_epi32(mh, _MM_PERM_CDAB));
            const __m128i imin = _mm512_castsi512_si128(_mm512_permutex2var_epi32(ml, tot, mh));
            /* d0..d3 dmin0..dmin3, each times d_x */
            const __m256 dd = _mm256_mul_ps(
                _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(dwords, hd))),
                _mm256_set1_ps(xq->d[8 * b]));
            acc = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm256_castps256_ps128(dd), acc);
            accm = _mm_fmadd_ps(_mm_cvtepi32_ps(imin), _mm256_extractf128_ps(dd, 1), accm);
        }
        float o[4];
        _mm_storeu_ps(o, _mm_sub_ps(acc, accm));
        for (size_t k = 0; k < 4 && r + k < r1; k++)
            out[r - r0 + k] = o[k];
    }
}

#endif

#if LM_X86
/* lm_dot_f16's and ref_dot_f32's orders on F16 and F32 rows, one row at a
 * time (four interleaved rows read a row-major matrix at half the rate
 * once it is out of cache, measured on an AMD EPYC: the row's own stream is
 * the one the hardware prefetches best, and four accumulators keep two
 * fused multiply-add pipes busy): per row four accumulators of L lanes (16: one AVX-512 register
 * each, or two of AVX2's, lanes 0..7 and 8..15; 8: the AVX2 variant's, one
 * of AVX2's) over whole steps of 4 L, fused multiply-adds (F16: of products
 * exact in float32), added (0 + 2) + (1 + 3) and reduced as the references
 * do, then their leftover (TAIL): the same bits. */
#define LM_VECDOT(NAME, TARGET, L, VEC, LOAD_X, LOAD_W, WB, FMA, ADD, ZERO, TAIL)               \
    TARGET static void NAME(const lm_matrix *w, const float *x, float *out, size_t r0,         \
                            size_t r1)                                                         \
    {                                                                                          \
        const size_t n = w->cols, np = n / ((size_t)4 * (L)) * ((size_t)4 * (L));              \
        for (size_t r = r0; r < r1; r++) {                                                     \
            const unsigned char *p = (const unsigned char *)w->data + r * w->row_bytes;        \
            VEC acc[4] = {ZERO, ZERO, ZERO, ZERO};                                             \
            for (size_t i = 0; i < np; i += (size_t)4 * (L))                                   \
                for (size_t a = 0; a < 4; a++)                                                 \
                    acc[a] = FMA(LOAD_W(p + (WB) * (i + (L) * a)), LOAD_X(x + i + (L) * a),    \
                                 acc[a]);                                                      \
            const VEC s = ADD(ADD(acc[0], acc[2]), ADD(acc[1], acc[3]));                       \
            float a[16];                                                                       \
            memcpy(a, &s, sizeof s);                                                           \
            out[r - r0] = TAIL(a, L, p, x, np, n);                                             \
        }                                                                                      \
    }

typedef struct f16x2 {
    __m256 lo, hi;
} f16x2;

__attribute__((target("avx2,f16c,fma"))) static inline f16x2 f16x2_x(const float *x)
{
    return (f16x2){_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)};
}

__attribute__((target("avx2,f16c,fma"))) static inline f16x2 f16x2_w(const unsigned char *p)
{
    return (f16x2){load_f16(p), load_f16(p + 16)};
}

__attribute__((target("avx2,f16c,fma"))) static inline f16x2 f16x2_fma(f16x2 a, f16x2 b,
                                                                       f16x2 c)
{
    return (f16x2){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}

__attribute__((target("avx2,f16c,fma"))) static inline f16x2 f16x2_add(f16x2 a, f16x2 b)
{
    return (f16x2){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}

LM_FUSED_512 static inline __m512 f16_w512(const unsigned char *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

__attribute__((target("avx2,f16c,fma"))) static inline f16x2 f32x2_w(const unsigned char *p)
{
    return (f16x2){_mm256_loadu_ps((const float *)(const void *)p),
                   _mm256_loadu_ps((const float *)(const void *)p + 8)};
}

LM_FUSED_512 static inline __m512 f32_w512(const unsigned char *p)
{
    return _mm512_loadu_ps((const float *)(const void *)p);
}

/* lm_dot_f16's reduction of its L lanes (16 or 8) and leftover: in double */
__attribute__((target("avx2,f16c,fma"))) static inline float tail_f16(const float a[16], size_t L,
                                                                      const unsigned char *p,
                                                                      const float *x, size_t np,
                                                                      size_t n)
{
    double sum = (double)(L == 8 ? reduce8(a) : reduce16(a));
    for (size_t e = np; e < n; e++)
        sum += (double)(x[e] * half(F16(p + 2 * e)));
    return (float)sum;
}

/* ref_dot_f32's: fused into the float sum */
__attribute__((target("avx2,f16c,fma"))) static inline float tail_f32(const float a[16], size_t L,
                                                                      const unsigned char *p,
                                                                      const float *x, size_t np,
                                                                      size_t n)
{
    const float *w = (const float *)(const void *)p;
    float sum = L == 8 ? reduce8(a) : reduce16(a);
    for (size_t e = np; e < n; e++)
        sum = fmaf(x[e], w[e], sum);
    return sum;
}

#define LM_AVX2_FMA __attribute__((target("avx2,f16c,fma")))
LM_AVX2_FMA static inline __m256 f32_w256(const unsigned char *p)
{
    return _mm256_loadu_ps((const float *)(const void *)p);
}

LM_VECDOT(f16_vecdot8_rows, LM_AVX2_FMA, 8, __m256, _mm256_loadu_ps, load_f16, 2, _mm256_fmadd_ps,
          _mm256_add_ps, _mm256_setzero_ps(), tail_f16)
LM_VECDOT(f32_vecdot8_rows, LM_AVX2_FMA, 8, __m256, _mm256_loadu_ps, f32_w256, 4, _mm256_fmadd_ps,
          _mm256_add_ps, _mm256_setzero_ps(), tail_f32)

/* ref_dot_bf16 without AVX512_BF16 (the AVX-512 and AVX2 variants), row by
 * row: four accumulators of 8 lanes over steps of 32 (the AVX-512 ones as
 * two of 16: lanes 0..15 and 16..31 of a step), fused multiply-adds of
 * exact products, then the reference's reductions and leftover. */
__attribute__((target("avx2,f16c,fma"))) static void bf16_rows(const lm_matrix *w, const float *x,
                                                                float *out, size_t r0, size_t r1,
                                                                lm_llama_cpu cpu)
{
    const size_t n = w->cols, np = n & ~(size_t)31;
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
        __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
        for (size_t i = 0; i < np; i += 32)
            for (size_t a = 0; a < 4; a++)
                c[a] = _mm256_fmadd_ps(load_bf16(row + 2 * (i + 8 * a)),
                                       _mm256_loadu_ps(x + i + 8 * a), c[a]);
        double sum = 0.0;
        if (cpu == LM_LLAMA_CPU_AVX2) {
            float a[8];
            _mm256_storeu_ps(a, _mm256_add_ps(_mm256_add_ps(c[0], c[2]),
                                              _mm256_add_ps(c[1], c[3])));
            sum += (double)combine_hsum(a);
        } else {
            float a[2][16];
            for (size_t h = 0; h < 2; h++) {
                _mm256_storeu_ps(a[h], c[2 * h]);
                _mm256_storeu_ps(a[h] + 8, c[2 * h + 1]);
            }
            sum += (double)reduce16(a[0]);
            sum += (double)reduce16(a[1]);
        }
        for (size_t e = np; e < n; e++)
            sum += (double)(lm_bf16_to_f32(lm__u16(row + 2 * e)) * x[e]);
        out[r - r0] = (float)sum;
    }
}

#define LM_F16X2_ZERO ((f16x2){_mm256_setzero_ps(), _mm256_setzero_ps()})
LM_VECDOT(f16_vecdot_rows, LM_AVX2_FMA, 16, f16x2, f16x2_x, f16x2_w,
          2, f16x2_fma, f16x2_add, LM_F16X2_ZERO, tail_f16)
LM_VECDOT(f16_vecdot_rows_512_x32, LM_FUSED_512, 16, __m512, _mm512_loadu_ps, f16_w512, 2,
          _mm512_fmadd_ps, _mm512_add_ps, _mm512_setzero_ps(), tail_f16)

enum { XH_MAX = 16384 }; /* the columns f16_vecdot_rows_512 holds as half floats */

/* f16_vecdot_rows_512 with the input held as half floats, as llama.cpp
 * holds it, so a row's pass reads 2 bytes of input per weight rather than
 * 4: the same products wherever the input's values are half floats (the
 * decoder rounds it so under --products llama), which is checked; any
 * other input (or a row past XH_MAX) takes the float32 input. */
LM_FUSED_512 static void f16_vecdot_rows_512(const lm_matrix *w, const float *x, float *out,
                                             size_t r0, size_t r1)
{
    const size_t n = w->cols, np = n / 64 * 64;
    _Alignas(64) unsigned char xh[2 * XH_MAX]; /* (np) half floats: the input */
    __mmask16 exact = 0xFFFF;
    for (size_t i = 0; i < np && n <= XH_MAX; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        exact &= _mm512_cmp_ps_mask(_mm512_cvtph_ps(h), v, _CMP_EQ_OQ);
        _mm256_store_si256((__m256i *)(void *)(xh + 2 * i), h);
    }
    if (n > XH_MAX || exact != 0xFFFF) {
        f16_vecdot_rows_512_x32(w, x, out, r0, r1);
        return;
    }
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *p = (const unsigned char *)w->data + r * w->row_bytes;
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        for (size_t i = 0; i < np; i += 64)
            for (size_t a = 0; a < 4; a++)
                acc[a] = _mm512_fmadd_ps(f16_w512(p + 2 * (i + 16 * a)),
                                         f16_w512(xh + 2 * (i + 16 * a)), acc[a]);
        const __m512 s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]),
                                       _mm512_add_ps(acc[1], acc[3]));
        float a[16];
        memcpy(a, &s, sizeof s);
        out[r - r0] = tail_f16(a, 16, p, x, np, n);
    }
}
LM_VECDOT(f32_vecdot_rows, LM_AVX2_FMA, 16, f16x2, f16x2_x, f32x2_w,
          4, f16x2_fma, f16x2_add, LM_F16X2_ZERO, tail_f32)
LM_VECDOT(f32_vecdot_rows_512, LM_FUSED_512, 16, __m512, _mm512_loadu_ps, f32_w512, 4,
          _mm512_fmadd_ps, _mm512_add_ps, _mm512_setzero_ps(), tail_f32)

/* AVX512_BF16 (cpuid leaf 7, subleaf 1, EAX bit 5): llama.cpp's BF16 dot
 * product is the instruction itself. */
static int has_avx512bf16(void)
{
    unsigned a, b, c, d;
    return lm_isa_supported(LM_ISA_AVX512) && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
           (a & (1u << 5)) != 0;
}

/* ref_dot_bf16 with vdpbf16ps, row by row: the input rounded to bfloat16
 * packed once (xb), the two accumulators, the same reductions and
 * leftover: the same bits (the instruction is the reference's arithmetic,
 * its subnormal flushing included). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,f16c,fma"))) static void
bf16_rows_512(const lm_matrix *w, const float *x, float *out, size_t r0, size_t r1)
{
    enum { XB = 4096 }; /* the packed input: rows of up to 4096 columns, else the reference */
    uint16_t xb[XB];
    const size_t n = w->cols, np = n & ~(size_t)63;
    if (n > XB) {
        for (size_t r = r0; r < r1; r++)
            out[r - r0] = ref_dot_bf16((const unsigned char *)w->data + r * w->row_bytes, x, n,
                                       LM_LLAMA_CPU_AVX512_BF16);
        return;
    }
    for (size_t i = 0; i < np; i++)
        xb[i] = lm_f32_to_bf16(x[i]);
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
        __m512 c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps();
        for (size_t i = 0; i < np; i += 64) {
            c1 = _mm512_dpbf16_ps(c1, (__m512bh)_mm512_loadu_si512((const void *)(row + 2 * i)),
                                  (__m512bh)_mm512_loadu_si512((const void *)(xb + i)));
            c2 = _mm512_dpbf16_ps(c2,
                                  (__m512bh)_mm512_loadu_si512((const void *)(row + 2 * i + 64)),
                                  (__m512bh)_mm512_loadu_si512((const void *)(xb + i + 32)));
        }
        float a1[16], a2[16];
        _mm512_storeu_ps(a1, c1);
        _mm512_storeu_ps(a2, c2);
        double sum = 0.0;
        sum += (double)reduce16(a1);
        sum += (double)reduce16(a2);
        for (size_t e = np; e < n; e++)
            sum += (double)(lm_bf16_to_f32(lm__u16(row + 2 * e)) * x[e]);
        out[r - r0] = (float)sum;
    }
}

/* ref_dot_32 with AVX2 and FMA, row by row: a block's weights unpacked by
 * block32_ints, the eight lanes' exact sums by dot_i8, then step32 and
 * finish32: the same bits. */
__attribute__((target("avx2,f16c,fma"))) static void ints32_rows(const lm_matrix *w,
                                                                  const lm_q8 *xq, float *out,
                                                                  size_t r0, size_t r1)
{
    const llama_order ord = order_of(w, (lm_llama_cpu)xq->fused);
    const size_t bb = lm_dtype_block_bytes(w->type), nb = w->cols / 32;
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
        k_acc a;
        memset(&a, 0, sizeof a);
        for (size_t b = 0; b < nb; b++) {
            int32_t q[32], lane[8];
            int8_t q8[32];
            float d, m;
            block32_ints(w->type, row + bb * b, q, &d, &m);
            for (int j = 0; j < 32; j++)
                q8[j] = (int8_t)q[j]; /* every type's weights are int8 */
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(const void *)q8);
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq->q + 32 * b));
            _mm256_storeu_si256((__m256i *)(void *)lane, dot_i8(wv, xv));
            step32(w->type, ord, b, nb, lane, d, m, xq, &a);
        }
        out[r - r0] = finish32(ord, &a);
    }
}

/* ref_dot_k with AVX2 and FMA, row by row: a block unpacked by
 * block256_ints, its lanes' exact sums by maddubs and madd (the scale of
 * each run of 16 in the lanes that hold it), then k_step and k_finish: the
 * same bits. */
__attribute__((target("avx2,f16c,fma"))) static void ints256_rows(const lm_matrix *w,
                                                                   const lm_q8 *xq, float *out,
                                                                   size_t r0, size_t r1)
{
    const int repacked = order_of(w, (lm_llama_cpu)xq->fused) == ORD_REPACKK;
    const size_t bb = lm_dtype_block_bytes(w->type), nb = w->cols / 256;
    int16_t bs16[FUSED_BLOCKS * 16];
    q8_k_sums(xq->q, nb, 16, bs16);
    for (size_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
        k_acc a;
        memset(&a, 0, sizeof a);
        for (size_t b = 0; b < nb; b++) {
            int8_t q[256];
            int16_t sc[16], mn[16];
            int32_t lane[8], bs[16];
            float d, dm;
            block256_ints(w->type, row + bb * b, q, sc, mn, &d, &dm);
            __m256i l = _mm256_setzero_si256();
            for (size_t c = 0; c < 8; c++) { /* elements 32c .. 32c + 31 */
                const __m256i wv = _mm256_loadu_si256((const __m256i *)(const void *)(q + 32 * c));
                const __m256i xv =
                    _mm256_loadu_si256((const __m256i *)(const void *)(xq->q + 256 * b + 32 * c));
                const __m256i p16 =
                    _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
                const __m256i sv =
                    _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c]));
                l = _mm256_add_epi32(l, _mm256_madd_epi16(p16, sv));
            }
            _mm256_storeu_si256((__m256i *)(void *)lane, l);
            for (int i = 0; i < 16; i++)
                bs[i] = bs16[16 * b + (size_t)i];
            k_step(w->type, repacked, lane, bs, sc, mn, d, dm, xq->d[8 * b], &a);
        }
        out[r - r0] = k_finish(w->type, repacked, &a);
    }
}
#endif

/* The path lm_matvec_rows takes for w against xq on `isa`, which
 * lm_matmat_rows follows: one place for the conditions. */
typedef enum mv_path {
    MV_REF,         /* lm_matvec_ref */
    MV_KERNEL,      /* kernels[isa][kind(w)]: the exact products */
    MV_VECDOT,      /* F16 and F32 in llama.cpp's vec_dot order: f16/f32_vecdot(8)_rows(_512) */
    MV_BF16,        /* bf16_rows */
    MV_BF16_512,    /* bf16_rows_512 */
    MV_Q8_0_FUSED,  /* q8_0_fused_rows */
    MV_INTS32,      /* ints32_rows */
    MV_Q6_K_FUSED,  /* q6_k_fused_rows(_512) */
    MV_Q4_K_FUSED,  /* q4_k_fused_rows(_512) */
    MV_Q4_K_PACKED, /* q4_k_packed_rows_512 */
    MV_INTS256      /* ints256_rows */
} mv_path;

static mv_path path_of(const lm_matrix *w, const lm_q8 *xq, lm_isa isa)
{
    const lm_llama_cpu cpu = xq ? (lm_llama_cpu)xq->fused : LM_LLAMA_CPU_AUTO;
    const llama_order ord = cpu != LM_LLAMA_CPU_AUTO ? order_of(w, cpu) : ORD_NONE;
    if (ord != ORD_NONE) {
#if LM_X86
        if (isa != LM_ISA_SCALAR && has_fma()) {
            const int wide = isa == LM_ISA_AVX512;
            if (ord == ORD_F16 || ord == ORD_F32)
                return MV_VECDOT;
            if (ord == ORD_BF16)
                return cpu != LM_LLAMA_CPU_AVX512_BF16 ? MV_BF16
                       : wide && has_avx512bf16()      ? MV_BF16_512
                                                       : MV_REF;
            if (w->type == LM_Q8_0)
                return MV_Q8_0_FUSED;
            if (ord == ORD_VEC32 || ord == ORD_IQ4NL || ord == ORD_REPACK32)
                return MV_INTS32;
            if ((ord == ORD_KLANES || ord == ORD_REPACKK) && w->cols / 256 <= FUSED_BLOCKS) {
                if (w->type == LM_Q6_K)
                    return MV_Q6_K_FUSED;
                if (w->type == LM_Q4_K && ord == ORD_REPACKK)
                    return wide && w->packed ? MV_Q4_K_PACKED : MV_Q4_K_FUSED;
                return MV_INTS256;
            }
        }
#endif
        return MV_REF;
    }
    const int kd = kind(w);
    return kd >= 0 && (unsigned)isa < LM_ISA_COUNT && kernels[isa][kd] ? MV_KERNEL : MV_REF;
}

void lm_matvec_rows(const lm_matrix *w, const float *x, const lm_q8 *xq, float *out, size_t r0,
                    size_t r1, lm_isa isa)
{
    if (isa == LM_ISA_COUNT)
        isa = lm_isa_active();
    const mv_path path = path_of(w, xq, isa);
#if LM_X86
    const int wide = isa == LM_ISA_AVX512;
    const lm_llama_cpu cpu = xq ? (lm_llama_cpu)xq->fused : LM_LLAMA_CPU_AUTO;
    const int lanes8 = cpu == LM_LLAMA_CPU_AVX2, f16 = w->type == LM_F16;
    switch (path) {
    case MV_VECDOT:
        (f16 ? lanes8 ? f16_vecdot8_rows
               : wide ? f16_vecdot_rows_512
                      : f16_vecdot_rows
         : lanes8 ? f32_vecdot8_rows
         : wide   ? f32_vecdot_rows_512
                  : f32_vecdot_rows)(w, x, out, r0, r1);
        return;
    case MV_BF16: bf16_rows(w, x, out, r0, r1, cpu); return;
    case MV_BF16_512: bf16_rows_512(w, x, out, r0, r1); return;
    case MV_Q8_0_FUSED: q8_0_fused_rows(w, xq, out, r0, r1); return;
    case MV_INTS32: ints32_rows(w, xq, out, r0, r1); return;
    case MV_Q6_K_FUSED: (wide ? q6_k_fused_rows_512 : q6_k_fused_rows)(w, xq, out, r0, r1); return;
    case MV_Q4_K_FUSED: (wide ? q4_k_fused_rows_512 : q4_k_fused_rows)(w, xq, out, r0, r1); return;
    case MV_Q4_K_PACKED: q4_k_packed_rows_512(w, xq, out, r0, r1); return;
    case MV_INTS256: ints256_rows(w, xq, out, r0, r1); return;
    default: break;
    }
#endif
    const int kd = kind(w); /* >= 0 wherever path_of chose a kernel */
    if (path != MV_KERNEL || kd < 0) {
        lm_matvec_ref(w, x, xq, out, r0, r1);
        return;
    }
    const kern4_fn f = kernels[isa][kd];
    const size_t nr = kernel_rows[isa];
    for (size_t r = r0; r < r1; r += nr) {
        size_t ri[8];
        float o[8];
        for (size_t k = 0; k < nr; k++) /* past the range: the last row again, dropped */
            ri[k] = r + k < r1 ? r + k : r1 - 1;
        f(w, ri, x, xq, o);
        for (size_t k = 0; k < nr && r + k < r1; k++)
            out[r - r0 + k] = o[k];
    }
}

/* ---- the packed copy of Q4_K rows (lm_model_pack) ---- */

size_t lm_matrix_pack_bytes(const lm_matrix *w)
{
#if LM_X86
    if (w->type == LM_Q4_K && w->rows % 8 == 0 && w->cols / 256 <= FUSED_BLOCKS &&
        lm_isa_active() == LM_ISA_AVX512 && has_fma())
        return w->rows * w->row_bytes;
#else
    (void)w;
#endif
    return 0;
}

void lm_matrix_pack(const lm_matrix *w, unsigned char *dst)
{
    const size_t nb = w->cols / 256;
    for (size_t q = 0; q < w->rows; q++) {
        const unsigned char *src = (const unsigned char *)w->data + q * w->row_bytes;
        unsigned char *d = dst + (q / 4) * 4 * w->row_bytes + 144 * (q % 4);
        for (size_t b = 0; b < nb; b++)
            memcpy(d + 576 * b, src + 144 * b, 144);
    }
}

/* ---- matrix-matrix products (lm_matmat) ----
 *
 * Tiles of MM_NR rows by up to 4 columns (2 for AVX2's 16 registers), every
 * (row, column) with its own accumulators doing exactly the operations of
 * the matvec path that row and column would take (path_of), in its order:
 *   the float family of the exact products (kernels f32, f16, bf16, q4_0,
 *     q6_k and deq: weights dequantized exactly, w x summed in lm_matmul's
 *     8 lanes plus the tail): MM_NR rows dequantized once per span of 256
 *     columns into a buffer (F16, BF16, Q4_0 and Q6_K by the kernels' own
 *     vector expressions, the others by lm__dequant_span), then every
 *     column's lanes over it, kept in memory from span to span (an
 *     accumulator's sum goes on in order);
 *   F16 and F32 in llama.cpp's vec_dot order (MV_VECDOT: four accumulators
 *     of 16 lanes, 8 for the AVX2 variant, fused multiply-adds), the same
 *     spans, one accumulator of each (row, column) at a time;
 *   Q8_0 and Q4_K exact, Q8_0, Q4_K (rows in 8s: REPACKK) and Q6_K in
 *     llama.cpp's order: each block's exact integer sums per (row, column),
 *     then the path's float operations on them in block order (Q4_K read
 *     from its packed copy where it has one).
 * So a value does not depend on its neighbours, the tile or the thread:
 * lm_matvec_rows's bits (tests/test_lm_matvec.c, every llama.cpp variant).
 * The other paths (I8G, llama.cpp's BF16, its other block types and Q4_K
 * with rows not in 8s, the references) run lm_matvec_rows itself column by
 * column over blocks of rows that stay in the cache meanwhile (64 KB):
 * each weight read from memory once, and llama.cpp's orders followed by
 * construction wherever they change. */

#if LM_X86
enum { MM_NR = 4, MM_SPAN = 256, MM_COLS = 64 };

/* Elements [s, s + c) of row r of w as float32, lm__dequant_span's values
 * exactly (the vector kernels' own expressions of them): into buf, or for
 * F32 the row itself. */
LM_INLINE_AVX2 const float *mm_deq(const lm_matrix *w, size_t r, size_t s, size_t c, float *buf)
{
    const unsigned char *row = (const unsigned char *)w->data + r * w->row_bytes;
    size_t i = 0;
    switch (w->type) {
    case LM_F32:
        return (const float *)(const void *)row + s;
    case LM_F16:
    case LM_BF16: {
        const int bf = w->type == LM_BF16;
        for (; i + 8 <= c; i += 8)
            _mm256_storeu_ps(buf + i, bf ? load_bf16(row + 2 * (s + i)) : load_f16(row + 2 * (s + i)));
        for (; i < c; i++) {
            const uint16_t h = lm__u16(row + 2 * (s + i));
            buf[i] = bf ? lm_bf16_to_f32(h) : half(h);
        }
        return buf;
    }
    case LM_Q4_0: {
        const __m256i m4 = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
        for (; i < c; i += 32) { /* (nibble - 8) * d, as k_q4_0 */
            const unsigned char *blk = row + 18 * ((s + i) / 32);
            const __m256 d = _mm256_set1_ps(half(F16(blk)));
            const __m256i lo = bytes8(blk + 2), hi = bytes8(blk + 10);
            const __m256i q[4] = {_mm256_and_si256(lo, m4), _mm256_and_si256(hi, m4),
                                  _mm256_srli_epi32(lo, 4), _mm256_srli_epi32(hi, 4)};
            for (size_t k = 0; k < 4; k++)
                _mm256_storeu_ps(buf + i + 8 * k,
                                 _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[k], eight)), d));
        }
        return buf;
    }
    case LM_Q6_K: {
        const __m256i m4 = _mm256_set1_epi32(0xF), m2 = _mm256_set1_epi32(3);
        const __m256i k32 = _mm256_set1_epi32(32);
        for (; i < c; i += 256) { /* (d * sc) * (q - 32), as k_q6_k */
            const unsigned char *blk = row + 210 * ((s + i) / 256);
            const float dk = half(F16(blk + 208));
            for (size_t h = 0; h < 2; h++)
                for (size_t run = 0; run < 4; run++)
                    for (size_t q8 = 0; q8 < 4; q8++) {
                        const unsigned char *ql = blk + 64 * h + 32 * (run % 2) + 8 * q8;
                        const unsigned char *qh = blk + 128 + 32 * h + 8 * q8;
                        const int8_t sc = (int8_t)blk[192 + 8 * h + 2 * run + q8 / 2];
                        __m256i lo = bytes8(ql);
                        lo = run < 2 ? _mm256_and_si256(lo, m4) : _mm256_srli_epi32(lo, 4);
                        const __m256i hi =
                            _mm256_and_si256(_mm256_srli_epi32(bytes8(qh), (int)(2 * run)), m2);
                        const __m256i q =
                            _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), k32);
                        _mm256_storeu_ps(buf + i + 128 * h + 32 * run + 8 * q8,
                                         _mm256_mul_ps(_mm256_set1_ps(dk * (float)sc),
                                                       _mm256_cvtepi32_ps(q)));
                    }
        }
        return buf;
    }
    default:
        lm__dequant_span(w, r, s, c, buf);
        return buf;
    }
}

/* The float family's tile: nc (<= 4) columns of x (column j at x + j * ldx)
 * against the MM_NR rows wp over len elements (a multiple of 8); acc
 * (MM_NR, lda, 8): each (row, column)'s 8 lanes, lane e += w[i] * x[i] for
 * i = e mod 8, in order: k_f32's operations. */
LM_INLINE_AVX2 void mm_tile8(const int nc, const float *const wp[MM_NR], const float *x,
                             size_t ldx, size_t len, float *acc, size_t lda)
{
    __m256 a[MM_NR][4];
    for (int k = 0; k < MM_NR; k++)
        for (int j = 0; j < nc; j++)
            a[k][j] = _mm256_loadu_ps(acc + ((size_t)k * lda + (size_t)j) * 8);
    for (size_t i = 0; i < len; i += 8) {
        __m256 wv[MM_NR];
        for (int k = 0; k < MM_NR; k++)
            wv[k] = _mm256_loadu_ps(wp[k] + i);
        for (int j = 0; j < nc; j++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)j * ldx + i);
            for (int k = 0; k < MM_NR; k++)
                a[k][j] = madd8(a[k][j], wv[k], xv);
        }
    }
    for (int k = 0; k < MM_NR; k++)
        for (int j = 0; j < nc; j++)
            _mm256_storeu_ps(acc + ((size_t)k * lda + (size_t)j) * 8, a[k][j]);
}

/* llama.cpp's vec_dot order (MV_VECDOT) over a span: accumulator a (of
 * 4) of each of the MM_NR rows by nc (<= 4) columns, its L lanes taking
 * elements i = a L + 4 L t + e by fused multiply-adds, one accumulator at a
 * time (each is a sum of its own: the same operations in the same order as
 * the row kernels' four together); len a multiple of 4 L; acc (MM_NR, lda,
 * 4, L). */
#define MM_VECDOT_TILE(NAME, TARGET, L, VEC, LOAD, STORE, FMA)                                    \
    TARGET static inline void NAME(const int nc, const float *const wp[MM_NR], const float *x,   \
                                   size_t ldx, size_t len, float *acc, size_t lda)                \
    {                                                                                             \
        for (size_t a = 0; a < 4; a++) {                                                          \
            VEC s[MM_NR][4];                                                                      \
            for (int k = 0; k < MM_NR; k++)                                                       \
                for (int j = 0; j < nc; j++)                                                      \
                    s[k][j] = LOAD(acc + (((size_t)k * lda + (size_t)j) * 4 + a) * (L));          \
            for (size_t i = (L) * a; i < len; i += (size_t)4 * (L)) {                             \
                VEC wv[MM_NR];                                                                    \
                for (int k = 0; k < MM_NR; k++)                                                   \
                    wv[k] = LOAD(wp[k] + i);                                                      \
                for (int j = 0; j < nc; j++) {                                                    \
                    const VEC xv = LOAD(x + (size_t)j * ldx + i);                                 \
                    for (int k = 0; k < MM_NR; k++)                                               \
                        s[k][j] = FMA(wv[k], xv, s[k][j]);                                        \
                }                                                                                 \
            }                                                                                     \
            for (int k = 0; k < MM_NR; k++)                                                       \
                for (int j = 0; j < nc; j++)                                                      \
                    STORE(acc + (((size_t)k * lda + (size_t)j) * 4 + a) * (L), s[k][j]);          \
        }                                                                                         \
    }

#define LM_MM_FMA256 __attribute__((always_inline, target("avx2,f16c,fma")))
#define LM_MM_FMA512                                                                              \
    __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,fma")))
MM_VECDOT_TILE(mm_vecdot8_tile, LM_MM_FMA256, 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps,
               _mm256_fmadd_ps)
MM_VECDOT_TILE(mm_vecdot8_tile_512, LM_MM_FMA512, 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps,
               _mm256_fmadd_ps)
MM_VECDOT_TILE(mm_vecdot16_tile_512, LM_MM_FMA512, 16, __m512, _mm512_loadu_ps, _mm512_storeu_ps,
               _mm512_fmadd_ps)

/* F16 and F32 in llama.cpp's vec_dot order over rows [r0, r1) and nc
 * columns, TN columns a tile (TILE, of L lanes): a column chunk of MM_COLS
 * at a time, MM_NR rows converted once a span of VD_SPAN (mm_deq: float16
 * to float32 exactly, float32 as it is; a span long enough that the tile's
 * sums, loaded and stored once a span and accumulator, cost little beside
 * its multiply-adds); per (row, column) the four accumulators combined (0
 * + 2) + (1 + 3) and reduced as lm_dot_f16 and ref_dot_f32 do, then the
 * leftover past the whole steps (within the last span: VD_SPAN is a
 * multiple of 4 L) as tail_f16 (in double) or tail_f32 (fused into the
 * float) do it: the row kernels' bits. */
enum { VD_SPAN = 512 };
#define MM_VECDOT_BODY(TN, L, TILE)                                                               \
    const size_t n = w->cols, np = n / ((size_t)4 * (L)) * ((size_t)4 * (L));                     \
    const int f32 = w->type == LM_F32;                                                            \
    float wbuf[MM_NR][VD_SPAN], acc[MM_NR * MM_COLS * 4 * (L)];                                   \
    for (size_t c0 = 0; c0 < nc; c0 += MM_COLS) {                                                 \
        const size_t cn = nc - c0 < MM_COLS ? nc - c0 : MM_COLS;                                  \
        const float *xc = x + c0 * n;                                                             \
        for (size_t r = r0; r < r1; r += MM_NR) {                                                 \
            memset(acc, 0, MM_NR * cn * 4 * (L) * sizeof *acc);                                   \
            const float *wp[MM_NR];                                                               \
            size_t s = 0;                                                                         \
            for (size_t at = 0; at < n; at += VD_SPAN) {                                          \
                const size_t cnt = n - at < VD_SPAN ? n - at : VD_SPAN;                           \
                const size_t len = np > at ? (np - at < cnt ? np - at : cnt) : 0;                 \
                for (size_t k = 0; k < MM_NR; k++) /* past the range: the last row again */       \
                    wp[k] = mm_deq(w, r + k < r1 ? r + k : r1 - 1, at, cnt, wbuf[k]);             \
                size_t j = 0;                                                                     \
                for (; j + (TN) <= cn; j += (TN))                                                 \
                    TILE((TN), wp, xc + j * n + at, n, len, acc + j * 4 * (L), cn);               \
                for (; j < cn; j++)                                                               \
                    TILE(1, wp, xc + j * n + at, n, len, acc + j * 4 * (L), cn);                  \
                s = at;                                                                           \
            }                                                                                     \
            for (size_t k = 0; k < MM_NR && r + k < r1; k++)                                      \
                for (size_t jj = 0; jj < cn; jj++) {                                              \
                    const float *a = acc + (k * cn + jj) * 4 * (L), *xj = xc + jj * n;            \
                    float t[16];                                                                  \
                    for (size_t e = 0; e < (L); e++)                                              \
                        t[e] = (a[e] + a[(size_t)2 * (L) + e]) +                                  \
                               (a[(L) + e] + a[(size_t)3 * (L) + e]);                             \
                    const float red = (L) == 8 ? reduce8(t) : reduce16(t);                        \
                    float v;                                                                      \
                    if (f32) {                                                                    \
                        v = red;                                                                  \
                        for (size_t e = np; e < n; e++)                                           \
                            v = fmaf(xj[e], wp[k][e - s], v);                                     \
                    } else {                                                                      \
                        double sum = (double)red;                                                 \
                        for (size_t e = np; e < n; e++)                                           \
                            sum += (double)(xj[e] * wp[k][e - s]);                                \
                        v = (float)sum;                                                           \
                    }                                                                             \
                    out[(c0 + jj) * ldo + r + k - r0] = v;                                        \
                }                                                                                 \
        }                                                                                         \
    }

/* The float family over rows [r0, r1) and nc columns, TN columns a tile
 * (mm_tile8); a column chunk of MM_COLS at a time, MM_NR rows dequantized
 * once a span. */
#define MM_FLOAT_BODY(TN)                                                                         \
    const size_t n = w->cols, n8 = n & ~(size_t)7;                                                \
    float wbuf[MM_NR][MM_SPAN], tail[MM_NR][MM_COLS], acc[MM_NR * MM_COLS * 8];                   \
    for (size_t c0 = 0; c0 < nc; c0 += MM_COLS) {                                                 \
        const size_t cn = nc - c0 < MM_COLS ? nc - c0 : MM_COLS;                                  \
        const float *xc = x + c0 * n;                                                             \
        for (size_t r = r0; r < r1; r += MM_NR) {                                                 \
            memset(acc, 0, MM_NR * cn * 8 * sizeof *acc);                                   \
            memset(tail, 0, sizeof tail);                                                         \
            for (size_t s = 0; s < n; s += MM_SPAN) {                                             \
                const size_t cnt = n - s < MM_SPAN ? n - s : MM_SPAN;                             \
                const size_t len = n8 > s ? (n8 - s < cnt ? n8 - s : cnt) : 0;                    \
                const float *wp[MM_NR];                                                           \
                for (size_t k = 0; k < MM_NR; k++) /* past the range: the last row again */       \
                    wp[k] = mm_deq(w, r + k < r1 ? r + k : r1 - 1, s, cnt, wbuf[k]);              \
                size_t j = 0;                                                                     \
                for (; j + (TN) <= cn; j += (TN))                                                 \
                    mm_tile8((TN), wp, xc + j * n + s, n, len, acc + j * 8, cn);                    \
                for (; j < cn; j++)                                                               \
                    mm_tile8(1, wp, xc + j * n + s, n, len, acc + j * 8, cn);                       \
                for (size_t i = len; i < cnt; i++) /* the n mod 8 last products, in order */      \
                    for (size_t k = 0; k < MM_NR; k++)                                            \
                        for (size_t jj = 0; jj < cn; jj++)                                        \
                            tail[k][jj] += wp[k][i] * xc[jj * n + s + i];                         \
            }                                                                                     \
            for (size_t k = 0; k < MM_NR && r + k < r1; k++)                                      \
                for (size_t jj = 0; jj < cn; jj++) {                                              \
                    out[(c0 + jj) * ldo + r + k - r0] =                                           \
                        combine(acc + (k * cn + jj) * 8, tail[k][jj]);                            \
                }                                                                                 \
        }                                                                                         \
    }

/* Q8_0 against the quantized columns xq: per block the exact sums of four
 * products in eight lanes (dot_i8's), then ACC(a, s, d) with d = d_w d_x:
 * exact, k_q8_0's lane += s * d; fused, q8_0_fused_rows's lane = fma(d,
 * s, lane), hsum_float_8's order at the end. TN columns a tile. The lanes'
 * integers by DOT: sign and maddubs (MM_DOT_SIGN), or AVX-512 VNNI's
 * vpdpbusd of x + 128 against w, less 128 times w's sums (MM_DOT_VNNI):
 * the same integers. */
#define MM_PRE_SIGN(w) _mm256_sign_epi8((w), (w))
#define MM_X_SIGN(x) (x)
#define MM_DOT_SIGN(pre, w, x)                                                                    \
    _mm256_madd_epi16(_mm256_maddubs_epi16((pre), _mm256_sign_epi8((x), (w))),                    \
                      _mm256_set1_epi16(1))
#define MM_PRE_VNNI(w)                                                                            \
    _mm256_sub_epi32(_mm256_setzero_si256(),                                                      \
                     _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), (w)))
#define MM_X_VNNI(x) _mm256_xor_si256((x), _mm256_set1_epi8(-128))
#define MM_DOT_VNNI(pre, w, x) _mm256_dpbusd_epi32((pre), (x), (w))
#define MM_Q8_0_BODY(TN, ACC, FINISH, PRE, XPREP, DOT)                                            \
    const size_t nb = w->cols / 32;                                                               \
    for (size_t r = r0; r < r1; r += MM_NR) {                                                     \
        const unsigned char *p[MM_NR];                                                            \
        for (size_t k = 0; k < MM_NR; k++) /* past the range: the last row again */               \
            p[k] = (const unsigned char *)w->data + (r + k < r1 ? r + k : r1 - 1) * w->row_bytes; \
        for (size_t j0 = 0; j0 < nc; j0 += (size_t)(TN)) {                                        \
            const size_t tn = nc - j0 < (size_t)(TN) ? nc - j0 : (size_t)(TN);                   \
            __m256 a[MM_NR][TN];                                                                  \
            for (int k = 0; k < MM_NR; k++)                                                       \
                for (int j = 0; j < (TN); j++)                                                    \
                    a[k][j] = _mm256_setzero_ps();                                                \
            for (size_t b = 0; b < nb; b++) {                                                     \
                __m256i wv[MM_NR], pre[MM_NR];                                                    \
                float dk[MM_NR];                                                                  \
                for (int k = 0; k < MM_NR; k++) {                                                 \
                    const unsigned char *blk = p[k] + 34 * b;                                     \
                    wv[k] = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));         \
                    pre[k] = PRE(wv[k]);                                                          \
                    dk[k] = half(F16(blk));                                                       \
                }                                                                                 \
                for (size_t j = 0; j < tn; j++) {                                                 \
                    const lm_q8 *c = &xq[j0 + j];                                                 \
                    const __m256i xv = XPREP(                                                     \
                        _mm256_loadu_si256((const __m256i *)(const void *)(c->q + 32 * b)));      \
                    const float xd = c->d[b];                                                     \
                    for (int k = 0; k < MM_NR; k++) {                                             \
                        const __m256 sv = _mm256_cvtepi32_ps(DOT(pre[k], wv[k], xv));             \
                        const __m256 d = _mm256_set1_ps(dk[k] * xd);                              \
                        a[k][j] = ACC(a[k][j], sv, d);                                            \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            for (size_t k = 0; k < MM_NR && r + k < r1; k++)                                      \
                for (size_t j = 0; j < tn; j++) {                                                 \
                    float v[8];                                                                   \
                    _mm256_storeu_ps(v, a[k][j]);                                                 \
                    out[(j0 + j) * ldo + r + k - r0] = FINISH(v);                                 \
                }                                                                                 \
        }                                                                                         \
    }
#define MM_ACC_EXACT(a, s, d) _mm256_add_ps((a), _mm256_mul_ps((s), (d)))
#define MM_ACC_FUSED(a, s, d) _mm256_fmadd_ps((d), (s), (a))
#define MM_FINISH_EXACT(v) combine((v), 0.0f)
#define MM_FINISH_FUSED(v) combine_hsum(v)

/* Row r (the range's last, r1 - 1, past it) of w from byte `at` (a whole
 * block's): a K tile's block, from the packed copy where w has one (only
 * Q4_K's: block at / 144 of the row, 576 bytes a block of four rows). */
static inline const unsigned char *mm_block(const lm_matrix *w, size_t r, size_t r1, size_t at)
{
    const size_t q = r < r1 ? r : r1 - 1;
    if (w->packed)
        return packed_row(w, q) + 4 * at;
    return (const unsigned char *)w->data + q * w->row_bytes + at;
}

/* The sums of eight vectors of eight int32 lanes: lane i of the result is
 * the sum of v[i]'s lanes (exact integers: any order). */
LM_INLINE_AVX2 __m256i mm_hsum8x8(const __m256i v[8])
{
    const __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i e = _mm256_hadd_epi32(a, b), f = _mm256_hadd_epi32(c, d);
    return _mm256_add_epi32(_mm256_permute2x128_si256(e, f, 0x20),
                            _mm256_permute2x128_si256(e, f, 0x31));
}

/* The input sums a K kernel keeps: MMQ_SUMS int16 (32 KB), for as many
 * columns (up to MMQ_COLS, a whole LM_BATCH block) as they hold: 64 of
 * TinyLlama's widths (Q6_K's sums of 16 at 5632: 46), at least 4 of
 * 65536. The weights are read once a chunk. */
enum { MMQ_SUMS = 16384, MMQ_COLS = 64 };

/* The nibbles and scale words of a Q4_K block of row k (Q4K_PACK) and the
 * lanes of every row of the group against a column's block x (Q4K_LANES:
 * lane[k * step] = sum_j sc_j (the products of sub-block j, pairs summed in
 * eight int32 lanes), exact integers). Y: a sub-block a 256-bit register,
 * madd and add; V: AVX-512 VNNI, two sub-blocks a 512-bit register (a
 * byte pair's nibbles, 64 consecutive inputs), vpdpwssd, the halves added
 * at the end. */
#define Q4K_DECL_Y                                                                                \
    const __m256i m4 = _mm256_set1_epi8(0xF);                                                     \
    __m256i nib[MM_NR][8], scw[MM_NR][8]
#define Q4K_PACK_Y(k, blk, sc)                                                                    \
    do {                                                                                          \
        for (size_t i = 0; i < 4; i++) {                                                          \
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)((blk) + 16 + 32 * i)); \
            nib[k][2 * i] = _mm256_and_si256(raw, m4);                                            \
            nib[k][2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);                  \
        }                                                                                         \
        for (size_t j = 0; j < 8; j++)                                                            \
            scw[k][j] = _mm256_set1_epi16((short)(sc)[j]);                                        \
    } while (0)
#define Q4K_LANES_Y(lane, step, x)                                                                \
    do {                                                                                          \
        for (size_t k = 0; k < MM_NR; k++)                                                        \
            (lane)[k * (step)] = _mm256_setzero_si256();                                          \
        for (size_t j = 0; j < 8; j++) {                                                          \
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)((x) + 32 * j)); \
            for (size_t k = 0; k < MM_NR; k++)                                                    \
                (lane)[k * (step)] = _mm256_add_epi32(                                            \
                    (lane)[k * (step)],                                                           \
                    _mm256_madd_epi16(_mm256_maddubs_epi16(nib[k][j], xv), scw[k][j]));           \
        }                                                                                         \
    } while (0)
#define Q4K_DECL_V                                                                                \
    const __m512i m4 = _mm512_set1_epi8(0xF);                                                     \
    __m512i nib[MM_NR][4], scw[MM_NR][4]
#define Q4K_PACK_V(k, blk, sc)                                                                    \
    do {                                                                                          \
        for (size_t i = 0; i < 4; i++) {                                                          \
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)((blk) + 16 + 32 * i)); \
            nib[k][i] = _mm512_and_si512(                                                         \
                _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1), m4); \
            scw[k][i] = _mm512_inserti64x4(_mm512_set1_epi16((short)(sc)[2 * i]),                 \
                                           _mm256_set1_epi16((short)(sc)[2 * i + 1]), 1);         \
        }                                                                                         \
    } while (0)
#define Q4K_LANES_V(lane, step, x)                                                                \
    do {                                                                                          \
        __m512i l16[MM_NR];                                                                       \
        for (size_t k = 0; k < MM_NR; k++)                                                        \
            l16[k] = _mm512_setzero_si512();                                                      \
        for (size_t i = 0; i < 4; i++) {                                                          \
            const __m512i xv = _mm512_loadu_si512((const void *)((x) + 64 * i));                  \
            for (size_t k = 0; k < MM_NR; k++)                                                    \
                l16[k] = _mm512_dpwssd_epi32(l16[k], _mm512_maddubs_epi16(nib[k][i], xv),         \
                                             scw[k][i]);                                          \
        }                                                                                         \
        for (size_t k = 0; k < MM_NR; k++)                                                        \
            (lane)[k * (step)] = _mm256_add_epi32(_mm512_castsi512_si256(l16[k]),                 \
                                                  _mm512_extracti64x4_epi64(l16[k], 1));          \
    } while (0)

/* Q4_K in llama.cpp's order (q4_k_fused_rows): per block and (row, column)
 * the exact isum = sum_j sc_j sum(q x) and imin = sum_j m_j sum(x), then
 * acc = fma(isum, d d_x, acc), accm = fma(imin, dmin d_x, accm); the value
 * acc - accm. MM_NR rows a group, their blocks unpacked once (nibbles and
 * scale words) for every column; TN columns a tile, whose 4 TN pairs' sums
 * are reduced eight at a time and their float steps taken eight lanes at a
 * time (each lane one pair's operations). */
#define MM_Q4_K_FUSED_BODY(TN, V)                                                                    \
    const size_t nb = w->cols / 256;                                                              \
    int16_t bs[MMQ_SUMS]; /* (chunk, nb * 8) */                                                  \
    const size_t chunk = MMQ_SUMS / (8 * nb) < MMQ_COLS ? MMQ_SUMS / (8 * nb) : MMQ_COLS;         \
    Q4K_DECL_##V;                                                                                 \
    __m256i mn32[MM_NR];                                                                          \
    float acc[MM_NR * MMQ_COLS], accm[MM_NR * MMQ_COLS], dk[8] = {0}, dmk[8] = {0};               \
    float dxb[MMQ_COLS + 8]; /* the block's d_x of each column, the last repeated after */       \
    __m256i ik[(TN) / 2], ic[(TN) / 2]; /* group g's pair q: row (8g + q) / TN, column % TN */     \
    for (int g = 0; g < (TN) / 2; g++) {                                                          \
        int32_t a[8], c[8];                                                                       \
        for (int q = 0; q < 8; q++)                                                               \
            a[q] = (8 * g + q) / (TN), c[q] = (8 * g + q) % (TN);                                 \
        ik[g] = _mm256_loadu_si256((const __m256i *)(const void *)a);                             \
        ic[g] = _mm256_loadu_si256((const __m256i *)(const void *)c);                             \
    }                                                                                             \
    for (size_t c0 = 0; c0 < nc; c0 += chunk) {                                                   \
        const size_t cn = nc - c0 < chunk ? nc - c0 : chunk;                                      \
        for (size_t c = 0; c < cn; c++)                                                           \
            q8_k_sums(xq[c0 + c].q, nb, 32, bs + c * 8 * nb);                                     \
        for (size_t r = r0; r < r1; r += MM_NR) {                                                 \
            memset(acc, 0, sizeof acc);                                                           \
            memset(accm, 0, sizeof accm);                                                         \
            for (size_t b = 0; b < nb; b++) {                                                     \
                for (size_t k = 0; k < MM_NR; k++) { /* past the range: the last row again */    \
                    const unsigned char *blk = mm_block(w, r + k, r1, 144 * b);                                           \
                    uint8_t sc[8], mn[8];                                                         \
                    q4_k_fields(blk, sc, mn);                                                     \
                    Q4K_PACK_##V(k, blk, sc);                                                     \
                    mn32[k] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)mn)); \
                    dk[k] = half(F16(blk)), dmk[k] = half(F16(blk + 2));                          \
                }                                                                                 \
                for (size_t c = 0; c < cn + 8; c++)                                               \
                    dxb[c] = xq[c0 + (c < cn ? c : cn - 1)].d[8 * b];                             \
                const __m256 dkv = _mm256_loadu_ps(dk), dmkv = _mm256_loadu_ps(dmk);              \
                for (size_t j0 = 0; j0 < cn; j0 += (TN)) {                                        \
                    __m256i lane[MM_NR * (TN)], mins[MM_NR * (TN)];                               \
                    for (size_t c = 0; c < (TN); c++) {                                           \
                        const size_t cc = j0 + c < cn ? j0 + c : cn - 1; /* the last again */     \
                        const int8_t *x = xq[c0 + cc].q + 256 * b;                                \
                        const __m256i bsum = _mm256_cvtepi16_epi32(                               \
                            _mm_loadu_si128((const __m128i *)(const void *)(bs + (cc * nb + b) * 8))); \
                        for (size_t k = 0; k < MM_NR; k++)                                        \
                            mins[k * (TN) + c] = _mm256_mullo_epi32(mn32[k], bsum);               \
                        Q4K_LANES_##V(lane + c, (TN), x);                                         \
                    }                                                                             \
                    const __m256 dxv = _mm256_loadu_ps(dxb + j0);                                 \
                    for (size_t g = 0; g < (TN) / 2; g++) { /* pairs 8g .. 8g + 7: each lane */  \
                        const __m256 dx = _mm256_permutevar8x32_ps(dxv, ic[g]); /* d * d_x */    \
                        const __m256 d = _mm256_mul_ps(_mm256_permutevar8x32_ps(dkv, ik[g]), dx); \
                        const __m256 dm = _mm256_mul_ps(_mm256_permutevar8x32_ps(dmkv, ik[g]), dx); \
                        const __m256 isum = _mm256_cvtepi32_ps(mm_hsum8x8(lane + 8 * g));         \
                        const __m256 imin = _mm256_cvtepi32_ps(mm_hsum8x8(mins + 8 * g));         \
                        float *a = acc + MM_NR * j0 + 8 * g, *am = accm + MM_NR * j0 + 8 * g;     \
                        _mm256_storeu_ps(a, _mm256_fmadd_ps(isum, d, _mm256_loadu_ps(a)));        \
                        _mm256_storeu_ps(am, _mm256_fmadd_ps(imin, dm, _mm256_loadu_ps(am)));     \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            for (size_t j0 = 0; j0 < cn; j0 += (TN))                                              \
                for (size_t q = 0; q < (size_t)MM_NR * (TN); q++) {                               \
                    const size_t k = q / (TN), c = j0 + q % (TN);                                 \
                    if (r + k < r1 && c < cn)                                                     \
                        out[(c0 + c) * ldo + r + k - r0] =                                        \
                            acc[MM_NR * j0 + q] - accm[MM_NR * j0 + q];                           \
                }                                                                                 \
        }                                                                                         \
    }

/* Q4_K exact (k_q4_k): per block and sub-block j, per (row, column), the
 * eight exact lane sums s of nibble times x and t of x (DOT4: maddubs and
 * madd, or vpdpbusd), then lane += s * (d sc_j d_x) - t * (dmin m_j d_x),
 * those steps the products of q4_k_steps. MM_NR rows a group, their blocks
 * unpacked once (nibbles, d sc_j and dmin m_j) for every column. */
#define MM_DOT4_SIGN(q, x) _mm256_madd_epi16(_mm256_maddubs_epi16((q), (x)), _mm256_set1_epi16(1))
#define MM_DOT4_VNNI(q, x) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (q), (x))
#define MM_Q4_K_BODY(TN, DOT4)                                                                    \
    const size_t nb = w->cols / 256;                                                              \
    const __m256i m4 = _mm256_set1_epi8(0xF), one8 = _mm256_set1_epi8(1);                         \
    __m256i nib[MM_NR][8];                                                                        \
    float d1[MM_NR][8], m1[MM_NR][8];                                                             \
    for (size_t j0 = 0; j0 < nc; j0 += MMQ_COLS) {                                                \
        const size_t cn = nc - j0 < MMQ_COLS ? nc - j0 : MMQ_COLS;                                \
        for (size_t r = r0; r < r1; r += MM_NR) {                                                 \
            __m256 acc[MM_NR][MMQ_COLS];                                                          \
            for (size_t k = 0; k < MM_NR; k++)                                                    \
                for (size_t c = 0; c < cn; c++)                                                   \
                    acc[k][c] = _mm256_setzero_ps();                                              \
            for (size_t b = 0; b < nb; b++) {                                                     \
                for (size_t k = 0; k < MM_NR; k++) { /* past the range: the last row again */    \
                    const unsigned char *blk = mm_block(w, r + k, r1, 144 * b);                                           \
                    q4_k_scales(blk, d1[k], m1[k]);                                               \
                    for (size_t i = 0; i < 4; i++) {                                              \
                        const __m256i raw =                                                       \
                            _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16 + 32 * i)); \
                        nib[k][2 * i] = _mm256_and_si256(raw, m4);                                \
                        nib[k][2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);      \
                    }                                                                             \
                }                                                                                 \
                for (size_t c0 = 0; c0 < cn; c0 += (TN)) {                                        \
                    const size_t tn = cn - c0 < (TN) ? cn - c0 : (TN);                            \
                    float s1[MM_NR][TN][8], s2[MM_NR][TN][8];                                     \
                    for (size_t c = 0; c < tn; c++) {                                             \
                        const __m256 dx = _mm256_loadu_ps(xq[j0 + c0 + c].d + 8 * b);             \
                        for (size_t k = 0; k < MM_NR; k++) {                                      \
                            _mm256_storeu_ps(s1[k][c], _mm256_mul_ps(_mm256_loadu_ps(d1[k]), dx)); \
                            _mm256_storeu_ps(s2[k][c], _mm256_mul_ps(_mm256_loadu_ps(m1[k]), dx)); \
                        }                                                                         \
                    }                                                                             \
                    __m256 a[MM_NR][TN]; /* the tile's sums, in registers over its block */     \
                    for (size_t k = 0; k < MM_NR; k++)                                            \
                        for (size_t c = 0; c < (TN); c++)                                         \
                            a[k][c] = acc[k][c0 + (c < tn ? c : 0)];                              \
                    for (size_t j = 0; j < 8; j++)                                                \
                        for (size_t c = 0; c < tn; c++) {                                         \
                            const __m256i xv = _mm256_loadu_si256(                                \
                                (const __m256i *)(const void *)(xq[j0 + c0 + c].q + 256 * b + 32 * j)); \
                            const __m256 sx = _mm256_cvtepi32_ps(DOT4(one8, xv));                 \
                            for (size_t k = 0; k < MM_NR; k++) {                                  \
                                const __m256 sq = _mm256_cvtepi32_ps(DOT4(nib[k][j], xv));        \
                                a[k][c] = _mm256_add_ps(                                          \
                                    a[k][c],                                                      \
                                    _mm256_sub_ps(_mm256_mul_ps(sq, _mm256_broadcast_ss(&s1[k][c][j])), \
                                                  _mm256_mul_ps(sx, _mm256_broadcast_ss(&s2[k][c][j])))); \
                            }                                                                     \
                        }                                                                         \
                    for (size_t k = 0; k < MM_NR; k++)                                            \
                        for (size_t c = 0; c < tn; c++)                                           \
                            acc[k][c0 + c] = a[k][c];                                             \
                }                                                                                 \
            }                                                                                     \
            for (size_t k = 0; k < MM_NR && r + k < r1; k++)                                      \
                for (size_t c = 0; c < cn; c++) {                                                 \
                    float v[8];                                                                   \
                    _mm256_storeu_ps(v, acc[k][c]);                                               \
                    out[(j0 + c) * ldo + r + k - r0] = combine(v, 0.0f);                          \
                }                                                                                 \
        }                                                                                         \
    }

/* Q6_K in llama.cpp's order (q6_k_fused_rows): per block and (row,
 * column) eight exact lanes, lane k of a run of 32 the products of its
 * bytes 4k .. 4k+3 times their scale, less 32 (bsum_2k sc_2k + bsum_2k+1
 * sc_2k+1); acc_k = fma(d_x d, lane_k, acc_k) in eight float lanes a pair,
 * hsum_float_8's order at the end. The rows' blocks unpacked once (the
 * 6-bit values, the scale words) for every column. */
#define MM_Q6_K_FUSED_BODY(TN, DPW)                                                                  \
    const size_t nb = w->cols / 256;                                                              \
    const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);                           \
    int16_t bs[MMQ_SUMS]; /* (chunk, nb * 16) */                                                 \
    const size_t chunk = MMQ_SUMS / (16 * nb) < MMQ_COLS ? MMQ_SUMS / (16 * nb) : MMQ_COLS;       \
    __m256i q6[MM_NR][8], scv[MM_NR][8], sc16[MM_NR];                                             \
    float acc[MM_NR * MMQ_COLS][8], dk[MM_NR];                                                    \
    for (size_t c0 = 0; c0 < nc; c0 += chunk) {                                                   \
        const size_t cn = nc - c0 < chunk ? nc - c0 : chunk;                                      \
        for (size_t c = 0; c < cn; c++)                                                           \
            q8_k_sums(xq[c0 + c].q, nb, 16, bs + c * 16 * nb);                                    \
        for (size_t r = r0; r < r1; r += MM_NR) {                                                 \
            memset(acc, 0, sizeof acc);                                                           \
            for (size_t b = 0; b < nb; b++) {                                                     \
                for (size_t k = 0; k < MM_NR; k++) { /* past the range: the last row again */    \
                    const unsigned char *blk = mm_block(w, r + k, r1, 210 * b);                                           \
                    sc16[k] = _mm256_cvtepi8_epi16(                                               \
                        _mm_loadu_si128((const __m128i *)(const void *)(blk + 192)));             \
                    int16_t sw[16];                                                               \
                    _mm256_storeu_si256((__m256i *)(void *)sw, sc16[k]);                          \
                    for (size_t j = 0; j < 2; j++) {                                              \
                        const __m256i qa =                                                        \
                            _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * j));    \
                        const __m256i qb = _mm256_loadu_si256(                                    \
                            (const __m256i *)(const void *)(blk + 64 * j + 32));                  \
                        const __m256i qh = _mm256_loadu_si256(                                    \
                            (const __m256i *)(const void *)(blk + 128 + 32 * j));                 \
                        for (size_t m = 0; m < 4; m++) {                                          \
                            const __m256i src = m & 1 ? qb : qa;                                  \
                            const __m256i lo =                                                    \
                                _mm256_and_si256(m < 2 ? src : _mm256_srli_epi16(src, 4), m4);    \
                            const __m256i hi = _mm256_slli_epi16(                                 \
                                _mm256_and_si256(_mm256_srli_epi16(qh, (int)(2 * m)), m2), 4);    \
                            q6[k][4 * j + m] = _mm256_or_si256(lo, hi);                           \
                            scv[k][4 * j + m] =                                                   \
                                _mm256_set_m128i(_mm_set1_epi16(sw[8 * j + 2 * m + 1]),           \
                                                 _mm_set1_epi16(sw[8 * j + 2 * m]));              \
                        }                                                                         \
                    }                                                                             \
                    dk[k] = half(F16(blk + 208));                                                 \
                }                                                                                 \
                for (size_t c = 0; c < cn; c++) {                                                 \
                    const int8_t *x = xq[c0 + c].q + 256 * b;                                     \
                    const __m256i bsum =                                                          \
                        _mm256_loadu_si256((const __m256i *)(const void *)(bs + (c * nb + b) * 16)); \
                    const float dx = xq[c0 + c].d[8 * b];                                         \
                    __m256i lane[MM_NR];                                                          \
                    for (size_t k = 0; k < MM_NR; k++)                                            \
                        lane[k] = _mm256_sub_epi32(_mm256_setzero_si256(),                        \
                                                   _mm256_slli_epi32(                             \
                                                       _mm256_madd_epi16(bsum, sc16[k]), 5));     \
                    for (size_t jm = 0; jm < 8; jm++) {                                           \
                        const __m256i xv = _mm256_loadu_si256(                                    \
                            (const __m256i *)(const void *)(x + 128 * (jm / 4) + 32 * (jm % 4))); \
                        for (size_t k = 0; k < MM_NR; k++)                                        \
                            lane[k] = DPW(lane[k], _mm256_maddubs_epi16(q6[k][jm], xv),           \
                                          scv[k][jm]);                                            \
                    }                                                                             \
                    for (size_t k = 0; k < MM_NR; k++) {                                          \
                        float *a = acc[k * MMQ_COLS + c];                                   \
                        _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_set1_ps(dx * dk[k]),           \
                                                            _mm256_cvtepi32_ps(lane[k]),          \
                                                            _mm256_loadu_ps(a)));                 \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            for (size_t k = 0; k < MM_NR && r + k < r1; k++)                                      \
                for (size_t c = 0; c < cn; c++)                                                   \
                    out[(c0 + c) * ldo + r + k - r0] = combine_hsum(acc[k * MMQ_COLS + c]); \
        }                                                                                         \
    }

/* acc + the pairs of p (int16) times s (int16) summed, exactly: madd and
 * add, or AVX-512 VNNI's one instruction. */
#define MM_DPW(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#define MM_DPW_VNNI(acc, p, s) _mm256_dpwssd_epi32((acc), (p), (s))
#define LM_MM_VNNI                                                                                \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,f16c,fma")))
#define LM_MM_VNNI_EXACT /* the exact kernels: no fused multiply-add to contract into */          \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,f16c")))

/* The kernels of one instruction set: the exact ones without fused
 * multiply-adds (TARGET), the fused ones with them (FTARGET); VD8 the
 * 8-lane vec_dot tile compiled for it. */
/* NOLINTBEGIN(bugprone-macro-parentheses): TARGET and FTARGET are attributes, not expressions */
#define LM_MM_KERNELS(SUFFIX, TARGET, FTARGET, TN, DPW, I8, Q4K, VD8)                          \
    TARGET static void mm_float8_##SUFFIX(const lm_matrix *w, const float *x, size_t nc,           \
                                          float *out, size_t ldo, size_t r0, size_t r1)           \
    {                                                                                             \
        MM_FLOAT_BODY(TN)                                                                         \
    }                                                                                             \
    FTARGET static void mm_vecdot8_##SUFFIX(const lm_matrix *w, const float *x, size_t nc,         \
                                            float *out, size_t ldo, size_t r0, size_t r1)         \
    {                                                                                             \
        MM_VECDOT_BODY(TN, 8, VD8)                                                                \
    }                                                                                             \
    TARGET static void mm_q4_k_##SUFFIX(const lm_matrix *w, const lm_q8 *xq, size_t nc,          \
                                        float *out, size_t ldo, size_t r0, size_t r1)             \
    {                                                                                             \
        MM_Q4_K_BODY(TN, MM_DOT4_##I8)                                                            \
    }                                                                                             \
    TARGET static void mm_q8_0_##SUFFIX(const lm_matrix *w, const lm_q8 *xq, size_t nc,          \
                                        float *out, size_t ldo, size_t r0, size_t r1)             \
    {                                                                                             \
        MM_Q8_0_BODY(TN, MM_ACC_EXACT, MM_FINISH_EXACT, MM_PRE_##I8, MM_X_##I8, MM_DOT_##I8)      \
    }                                                                                             \
    FTARGET static void mm_q8_0_fused_##SUFFIX(const lm_matrix *w, const lm_q8 *xq, size_t nc,   \
                                               float *out, size_t ldo, size_t r0, size_t r1)      \
    {                                                                                             \
        MM_Q8_0_BODY(TN, MM_ACC_FUSED, MM_FINISH_FUSED, MM_PRE_##I8, MM_X_##I8, MM_DOT_##I8)      \
    }                                                                                             \
    FTARGET static void mm_q4_k_fused_##SUFFIX(const lm_matrix *w, const lm_q8 *xq, size_t nc,   \
                                               float *out, size_t ldo, size_t r0, size_t r1)      \
    {                                                                                             \
        MM_Q4_K_FUSED_BODY(TN, Q4K)                                                               \
    }                                                                                             \
    FTARGET static void mm_q6_k_fused_##SUFFIX(const lm_matrix *w, const lm_q8 *xq, size_t nc,   \
                                               float *out, size_t ldo, size_t r0, size_t r1)      \
    {                                                                                             \
        MM_Q6_K_FUSED_BODY(TN, DPW)                                                               \
    }
/* NOLINTEND(bugprone-macro-parentheses) */

LM_MM_KERNELS(avx2, LM_AVX2, __attribute__((target("avx2,f16c,fma"))), 2, MM_DPW, SIGN, Y,
              mm_vecdot8_tile)
LM_MM_KERNELS(avx512, LM_MM_VNNI_EXACT, LM_MM_VNNI, 4, MM_DPW_VNNI, VNNI, V, mm_vecdot8_tile_512)

/* The AVX-512 variants' 16 lanes (on AVX-512: 32 registers hold a tile's
 * sixteen sums, its four rows' weights and a column). */
LM_FUSED_512 static void mm_vecdot16_avx512(const lm_matrix *w, const float *x, size_t nc,
                                            float *out, size_t ldo, size_t r0, size_t r1)
{
    MM_VECDOT_BODY(4, 16, mm_vecdot16_tile_512)
}
#endif

void lm_matmat_rows(const lm_matrix *w, const float *x, const lm_q8 *xq, size_t nc, float *out,
                    size_t ldo, size_t r0, size_t r1, lm_isa isa)
{
    if (isa == LM_ISA_COUNT)
        isa = lm_isa_active();
    if (r0 >= r1 || nc == 0)
        return;
    if (nc == 1) { /* one column: the matrix-vector product itself */
        lm_matvec_rows(w, x, xq, out, r0, r1, isa);
        return;
    }
#if LM_X86
    /* the path of the first column is every column's (one kind of input) */
    const mv_path path = path_of(w, xq, isa);
    const int wide = isa == LM_ISA_AVX512 && has_vnni(), kd = kind(w);
    switch (path) {
    case MV_KERNEL:
        if (kd <= 3 || kd == 5 || kd == 8) { /* the float family */
            (wide ? mm_float8_avx512 : mm_float8_avx2)(w, x, nc, out, ldo, r0, r1);
            return;
        }
        if (kd == 4) {
            (wide ? mm_q4_k_avx512 : mm_q4_k_avx2)(w, xq, nc, out, ldo, r0, r1);
            return;
        }
        if (kd == 6) {
            (wide ? mm_q8_0_avx512 : mm_q8_0_avx2)(w, xq, nc, out, ldo, r0, r1);
            return;
        }
        break; /* I8G: column by column */
    case MV_VECDOT:
        if ((lm_llama_cpu)xq->fused == LM_LLAMA_CPU_AVX2) {
            (wide ? mm_vecdot8_avx512 : mm_vecdot8_avx2)(w, x, nc, out, ldo, r0, r1);
            return;
        }
        if (isa == LM_ISA_AVX512) {
            mm_vecdot16_avx512(w, x, nc, out, ldo, r0, r1);
            return;
        }
        break; /* 16 lanes on AVX2: column by column */
    case MV_Q8_0_FUSED:
        (wide ? mm_q8_0_fused_avx512 : mm_q8_0_fused_avx2)(w, xq, nc, out, ldo, r0, r1);
        return;
    case MV_Q4_K_FUSED:
    case MV_Q4_K_PACKED: /* mm_block reads the packed copy */
        (wide ? mm_q4_k_fused_avx512 : mm_q4_k_fused_avx2)(w, xq, nc, out, ldo, r0, r1);
        return;
    case MV_Q6_K_FUSED:
        (wide ? mm_q6_k_fused_avx512 : mm_q6_k_fused_avx2)(w, xq, nc, out, ldo, r0, r1);
        return;
    default:
        break;
    }
#endif
    /* column by column, lm_matvec_rows itself, over blocks of rows that stay
     * in the cache from one column to the next (64 KB of weights a block) */
    size_t rb = w->row_bytes ? ((size_t)64 << 10) / w->row_bytes : r1 - r0;
    rb = rb < 8 ? 8 : rb;
    for (size_t r = r0; r < r1; r += rb) {
        const size_t re = r1 - r < rb ? r1 : r + rb;
        for (size_t c = 0; c < nc; c++)
            lm_matvec_rows(w, x + c * w->cols, xq ? &xq[c] : NULL, out + c * ldo + (r - r0), r,
                           re, isa);
    }
}

/* ---- products split over threads ---- */

typedef struct mm_job {
    const lm_product *p;
    size_t n, rows, nc;
    const float *x;
    const lm_q8 *xq;
    lm_isa isa;
} mm_job;

/* Part `part` of `parts`: rows [part * R / parts, (part + 1) * R / parts) of
 * the R rows of the products one after another, every column. */
static void mm_part(void *arg, size_t part, size_t parts)
{
    const mm_job *j = arg;
    size_t lo = part * j->rows / parts, hi = (part + 1) * j->rows / parts, base = 0;
    for (size_t k = 0; k < j->n; k++) {
        const lm_matrix *w = j->p[k].w;
        size_t a = lo > base ? lo : base, b = hi < base + w->rows ? hi : base + w->rows;
        if (a < b)
            lm_matmat_rows(w, j->x, j->xq, j->nc, j->p[k].out + (a - base), w->rows, a - base,
                           b - base, j->isa);
        base += w->rows;
    }
}

void lm_matmat(lm_pool *pool, const lm_product *p, size_t n, const float *x, const lm_q8 *xq,
               size_t nc)
{
    mm_job j = {p, n, 0, nc, x, xq, lm_isa_active()};
    uint64_t weights = 0;
    for (size_t k = 0; k < n; k++) {
        j.rows += p[k].w->rows;
        weights += (uint64_t)p[k].w->rows * p[k].w->cols * nc;
    }
    if (!pool || weights < (1u << 20))
        mm_part(&j, 0, 1);
    else
        lm_pool_run(pool, mm_part, &j);
}

void lm_matvec(lm_pool *pool, const lm_product *p, size_t n, const float *x, const lm_q8 *xq)
{
    lm_matmat(pool, p, n, x, xq, 1); /* one column: lm_matvec_rows over the parts */
}
