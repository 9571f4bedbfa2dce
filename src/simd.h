/* SPDX-License-Identifier: MIT */
/*
 * simd.h - one small vocabulary of vector operations, defined three times:
 * kv1 (one lane: plain C, the portable definition), kv4 (AVX2: four doubles)
 * and kv8 (AVX-512: eight doubles). Kernels are written once against the
 * generic names below and instantiated per instruction set by defining KV to
 * kv1, kv4 or kv8 (see simd_generic.inc, observe.inc). Because every
 * instantiation performs the same IEEE operation on the same operands lane by
 * lane, the vector paths equal the scalar one bit for bit by construction:
 * each operation here is one correctly rounded IEEE operation (or exact), and
 * none fuses or reassociates.
 *
 * Types of width W (W lanes):
 *   KV_d  W doubles       KV_f  W floats        KV_m  W-lane mask
 *   KV_u  W uint64_t      KV_h  W uint32_t
 * Operations (generic name = kv_<op>, resolved through KV):
 *   ld st ldf ldu stu ldh sth        unaligned loads and stores of W elements
 *   set setf setu seth               broadcasts
 *   add sub mul div min              doubles (min(a, b) = a < b ? a : b)
 *   cvt (float -> double, exact)     cvtf (double -> float, round to nearest)
 *   maxf (a > b ? a : b, floats)     cvth (uint32 -> double, exact)
 *   subh (uint32, modulo 2^32)       andu oru shlu (uint64)
 *   gtf (a > b, floats)  lt (a < b, doubles)  testu ((a & b) != 0): masks
 *   sel selu (m ? a : b)              any (some lane of a mask is set)
 *   firstm (k: the mask of lanes 0 .. k-1, k <= W)
 */
#ifndef KVE_SIMD_H
#define KVE_SIMD_H

#include "kernels.h"

#include <float.h>
#include <string.h>

#define KV_CAT_(a, b) a##b
#define KV_CAT(a, b) KV_CAT_(a, b)
#define KV_FN(name) KV_CAT(KV, _##name)

#define KV_d KV_FN(d)
#define KV_f KV_FN(f)
#define KV_m KV_FN(m)
#define KV_u KV_FN(u)
#define KV_h KV_FN(h)
#define KV_W KV_FN(W)
#define kv_ld KV_FN(ld)
#define kv_st KV_FN(st)
#define kv_ldf KV_FN(ldf)
#define kv_ldu KV_FN(ldu)
#define kv_stu KV_FN(stu)
#define kv_ldh KV_FN(ldh)
#define kv_sth KV_FN(sth)
#define kv_set KV_FN(set)
#define kv_setf KV_FN(setf)
#define kv_setu KV_FN(setu)
#define kv_seth KV_FN(seth)
#define kv_add KV_FN(add)
#define kv_sub KV_FN(sub)
#define kv_mul KV_FN(mul)
#define kv_div KV_FN(div)
#define kv_min KV_FN(min)
#define kv_cvt KV_FN(cvt)
#define kv_cvtf KV_FN(cvtf)
#define kv_maxf KV_FN(maxf)
#define kv_cvth KV_FN(cvth)
#define kv_subh KV_FN(subh)
#define kv_andu KV_FN(andu)
#define kv_oru KV_FN(oru)
#define kv_shlu KV_FN(shlu)
#define kv_gtf KV_FN(gtf)
#define kv_lt KV_FN(lt)
#define kv_testu KV_FN(testu)
#define kv_sel KV_FN(sel)
#define kv_selu KV_FN(selu)
#define kv_any KV_FN(any)
#define kv_firstm KV_FN(firstm)

/* The types of vocabulary P, W lanes wide: doubles, floats, a mask, uint64s
 * and uint32s. */
#define KV_TYPES(P, W, D, F, M, U, H)                                                      \
    typedef D P##_d;                                                                        \
    typedef F P##_f;                                                                        \
    typedef M P##_m;                                                                        \
    typedef U P##_u;                                                                        \
    typedef H P##_h;                                                                        \
    enum { P##_W = (W) };

/* ---- kv1: one lane, plain C ---- */

KV_TYPES(kv1, 1, double, float, bool, uint64_t, uint32_t)
#define kv1_inline KVE_ALWAYS_INLINE

kv1_inline kv1_d kv1_ld(const double *p) { return *p; }
kv1_inline void kv1_st(double *p, kv1_d v) { *p = v; }
kv1_inline kv1_f kv1_ldf(const float *p) { return *p; }
kv1_inline kv1_u kv1_ldu(const uint64_t *p) { return *p; }
kv1_inline void kv1_stu(uint64_t *p, kv1_u v) { *p = v; }
kv1_inline kv1_h kv1_ldh(const uint32_t *p) { return *p; }
kv1_inline void kv1_sth(uint32_t *p, kv1_h v) { *p = v; }
kv1_inline kv1_d kv1_set(double x) { return x; }
kv1_inline kv1_f kv1_setf(float x) { return x; }
kv1_inline kv1_u kv1_setu(uint64_t x) { return x; }
kv1_inline kv1_h kv1_seth(uint32_t x) { return x; }
kv1_inline kv1_d kv1_add(kv1_d a, kv1_d b) { return a + b; }
kv1_inline kv1_d kv1_sub(kv1_d a, kv1_d b) { return a - b; }
kv1_inline kv1_d kv1_mul(kv1_d a, kv1_d b) { return a * b; }
kv1_inline kv1_d kv1_div(kv1_d a, kv1_d b) { return a / b; }
kv1_inline kv1_d kv1_min(kv1_d a, kv1_d b) { return a < b ? a : b; }
kv1_inline kv1_d kv1_cvt(kv1_f a) { return (double)a; }
kv1_inline kv1_f kv1_cvtf(kv1_d a) { return (float)a; }
kv1_inline kv1_f kv1_maxf(kv1_f a, kv1_f b) { return a > b ? a : b; }
kv1_inline kv1_d kv1_cvth(kv1_h a) { return (double)a; }
kv1_inline kv1_h kv1_subh(kv1_h a, kv1_h b) { return a - b; }
kv1_inline kv1_u kv1_andu(kv1_u a, kv1_u b) { return a & b; }
kv1_inline kv1_u kv1_oru(kv1_u a, kv1_u b) { return a | b; }
kv1_inline kv1_u kv1_shlu(kv1_u a, int k) { return a << k; }
kv1_inline kv1_m kv1_gtf(kv1_f a, kv1_f b) { return a > b; }
kv1_inline kv1_m kv1_lt(kv1_d a, kv1_d b) { return a < b; }
kv1_inline kv1_m kv1_testu(kv1_u a, kv1_u b) { return (a & b) != 0; }
kv1_inline kv1_d kv1_sel(kv1_m m, kv1_d a, kv1_d b) { return m ? a : b; }
kv1_inline kv1_u kv1_selu(kv1_m m, kv1_u a, kv1_u b) { return m ? a : b; }
kv1_inline bool kv1_any(kv1_m m) { return m; }
kv1_inline kv1_m kv1_firstm(size_t k) { return k > 0; }

#if KVE_X86

/* The operations whose intrinsics differ between AVX2 and AVX-512 only in
 * their prefix, defined once for both: P is kv4 or kv8 (P_inline its
 * function attributes), D the prefix of its double vectors (_mm256, _mm512),
 * F that of its float and uint32 vectors (_mm, _mm256). */
#define KV_PREFIXED_OPS(P, D, F)                                                        \
    P##_inline P##_d P##_ld(const double *p) { return D##_loadu_pd(p); }                           \
    P##_inline void P##_st(double *p, P##_d v) { D##_storeu_pd(p, v); }                            \
    P##_inline P##_f P##_ldf(const float *p) { return F##_loadu_ps(p); }                           \
    P##_inline P##_d P##_set(double x) { return D##_set1_pd(x); }                                 \
    P##_inline P##_f P##_setf(float x) { return F##_set1_ps(x); }                                  \
    P##_inline P##_h P##_seth(uint32_t x) { return F##_set1_epi32((int)x); }                       \
    P##_inline P##_d P##_add(P##_d a, P##_d b) { return D##_add_pd(a, b); }                        \
    P##_inline P##_d P##_sub(P##_d a, P##_d b) { return D##_sub_pd(a, b); }                        \
    P##_inline P##_d P##_mul(P##_d a, P##_d b) { return D##_mul_pd(a, b); }                        \
    P##_inline P##_d P##_div(P##_d a, P##_d b) { return D##_div_pd(a, b); }                        \
    P##_inline P##_d P##_min(P##_d a, P##_d b) { return D##_min_pd(a, b); }                        \
    P##_inline P##_d P##_cvt(P##_f a) { return D##_cvtps_pd(a); }                                  \
    P##_inline P##_f P##_cvtf(P##_d a) { return D##_cvtpd_ps(a); }                                 \
    P##_inline P##_f P##_maxf(P##_f a, P##_f b) { return F##_max_ps(a, b); }                      \
    P##_inline P##_h P##_subh(P##_h a, P##_h b) { return F##_sub_epi32(a, b); }

/* ---- kv4: AVX2. Masks are all-ones / all-zero 64-bit lanes in a __m256d. ---- */

KV_TYPES(kv4, 4, __m256d, __m128, __m256d, __m256i, __m128i)
#define kv4_inline KVE_ALWAYS_INLINE KVE_TARGET_AVX2
KV_PREFIXED_OPS(kv4, _mm256, _mm)

kv4_inline kv4_u kv4_ldu(const uint64_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }
kv4_inline void kv4_stu(uint64_t *p, kv4_u v) { _mm256_storeu_si256((__m256i *)(void *)p, v); }
kv4_inline kv4_h kv4_ldh(const uint32_t *p) { return _mm_loadu_si128((const __m128i *)(const void *)p); }
kv4_inline void kv4_sth(uint32_t *p, kv4_h v) { _mm_storeu_si128((__m128i *)(void *)p, v); }
kv4_inline kv4_u kv4_setu(uint64_t x) { return _mm256_set1_epi64x((long long)x); }
kv4_inline kv4_d kv4_cvth(kv4_h a)
{
    /* AVX2 converts signed int32 only: values of 2^31 and up read negative
     * and get 2^32 added back, exactly. */
    __m256d d = _mm256_cvtepi32_pd(a);
    __m256d wrapped = _mm256_cmp_pd(d, _mm256_setzero_pd(), _CMP_LT_OQ);
    return _mm256_add_pd(d, _mm256_and_pd(wrapped, _mm256_set1_pd(4294967296.0)));
}
kv4_inline kv4_u kv4_andu(kv4_u a, kv4_u b) { return _mm256_and_si256(a, b); }
kv4_inline kv4_u kv4_oru(kv4_u a, kv4_u b) { return _mm256_or_si256(a, b); }
kv4_inline kv4_u kv4_shlu(kv4_u a, int k) { return _mm256_slli_epi64(a, k); }
kv4_inline kv4_m kv4_gtf(kv4_f a, kv4_f b)
{
    /* a > b in float is (double)a > (double)b: widening is exact. */
    return _mm256_cmp_pd(_mm256_cvtps_pd(a), _mm256_cvtps_pd(b), _CMP_GT_OQ);
}
kv4_inline kv4_m kv4_lt(kv4_d a, kv4_d b) { return _mm256_cmp_pd(a, b, _CMP_LT_OQ); }
kv4_inline kv4_m kv4_testu(kv4_u a, kv4_u b)
{
    __m256i zero = _mm256_cmpeq_epi64(_mm256_and_si256(a, b), _mm256_setzero_si256());
    return _mm256_castsi256_pd(_mm256_xor_si256(zero, _mm256_set1_epi64x(-1)));
}
kv4_inline kv4_d kv4_sel(kv4_m m, kv4_d a, kv4_d b) { return _mm256_blendv_pd(b, a, m); }
kv4_inline kv4_u kv4_selu(kv4_m m, kv4_u a, kv4_u b)
{
    return _mm256_castpd_si256(_mm256_blendv_pd(_mm256_castsi256_pd(b), _mm256_castsi256_pd(a), m));
}
kv4_inline bool kv4_any(kv4_m m) { return _mm256_movemask_pd(m) != 0; }
kv4_inline kv4_m kv4_firstm(size_t k)
{
    return _mm256_cmp_pd(_mm256_setr_pd(0.0, 1.0, 2.0, 3.0), _mm256_set1_pd((double)k),
                         _CMP_LT_OQ);
}

/* ---- kv8: AVX-512 (F, VL, DQ, BW). Masks are __mmask8. ---- */

KV_TYPES(kv8, 8, __m512d, __m256, __mmask8, __m512i, __m256i)
#define kv8_inline KVE_ALWAYS_INLINE KVE_TARGET_AVX512
KV_PREFIXED_OPS(kv8, _mm512, _mm256)

kv8_inline kv8_u kv8_ldu(const uint64_t *p) { return _mm512_loadu_si512((const void *)p); }
kv8_inline void kv8_stu(uint64_t *p, kv8_u v) { _mm512_storeu_si512((void *)p, v); }
kv8_inline kv8_h kv8_ldh(const uint32_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }
kv8_inline void kv8_sth(uint32_t *p, kv8_h v) { _mm256_storeu_si256((__m256i *)(void *)p, v); }
kv8_inline kv8_u kv8_setu(uint64_t x) { return _mm512_set1_epi64((long long)x); }
kv8_inline kv8_d kv8_cvth(kv8_h a) { return _mm512_cvtepu32_pd(a); }
kv8_inline kv8_u kv8_andu(kv8_u a, kv8_u b) { return _mm512_and_si512(a, b); }
kv8_inline kv8_u kv8_oru(kv8_u a, kv8_u b) { return _mm512_or_si512(a, b); }
kv8_inline kv8_u kv8_shlu(kv8_u a, int k) { return _mm512_slli_epi64(a, (unsigned)k); }
kv8_inline kv8_m kv8_gtf(kv8_f a, kv8_f b) { return _mm256_cmp_ps_mask(a, b, _CMP_GT_OQ); }
kv8_inline kv8_m kv8_lt(kv8_d a, kv8_d b) { return _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ); }
kv8_inline kv8_m kv8_testu(kv8_u a, kv8_u b) { return _mm512_test_epi64_mask(a, b); }
kv8_inline kv8_d kv8_sel(kv8_m m, kv8_d a, kv8_d b) { return _mm512_mask_blend_pd(m, b, a); }
kv8_inline kv8_u kv8_selu(kv8_m m, kv8_u a, kv8_u b) { return _mm512_mask_blend_epi64(m, b, a); }
kv8_inline bool kv8_any(kv8_m m) { return m != 0; }
kv8_inline kv8_m kv8_firstm(size_t k) { return (__mmask8)((1u << k) - 1u); }

#endif /* KVE_X86 */

/* The generic kernels every instruction set shares (simd_generic.inc). */
#define KV kv1
#define KV_TARGET
#include "simd_generic.inc"
#if KVE_X86
#define KV kv4
#define KV_TARGET KVE_TARGET_AVX2
#include "simd_generic.inc"
#define KV kv8
#define KV_TARGET KVE_TARGET_AVX512
#include "simd_generic.inc"
#endif

#endif /* KVE_SIMD_H */
