/* SPDX-License-Identifier: MIT */
/*
 * kernels.h - instruction sets, runtime dispatch, and the building blocks the
 * vector kernels share: reading one head's (possibly grouped) attention input
 * and tracking an argmin with ties to the lower index.
 *
 * The scalar code is the definition. A vector path computes the same
 * operations on the same operands in the same order, lane by lane, so its
 * results are bit-identical to the scalar path's: no reassociation, no fused
 * multiply-add (the library is built with -ffp-contract=off and the vector
 * code spells every multiply and add as its own instruction), conversions and
 * divisions that IEEE 754 rounds exactly, and argmins that keep the lower
 * index on ties. tests/test_isa.c forces each path in turn and compares.
 *
 * The instruction set is chosen once, at the first call that needs it, from
 * the CPU (cpuid, through __builtin_cpu_supports): AVX-512 (F, VL, DQ, BW),
 * else AVX2, else the portable scalar code. Only x86-64 built by GCC or Clang
 * has vector paths; elsewhere everything is scalar.
 */
#ifndef KVE_KERNELS_H
#define KVE_KERNELS_H

#include "internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define KVE_NONE SIZE_MAX

typedef enum kve_isa { KVE_ISA_SCALAR, KVE_ISA_AVX2, KVE_ISA_AVX512, KVE_ISA_COUNT } kve_isa;

/* The instruction set in use: detected at the first call, then fixed.
 * Inline: one relaxed load of isa.c's kve__isa_active on every step, the
 * detection (kve__isa_detect) only while it is still -1. */
extern atomic_int kve__isa_active;
kve_isa kve__isa_detect(void);
static inline kve_isa kve__isa(void)
{
    int v = atomic_load_explicit(&kve__isa_active, memory_order_relaxed);
    return v >= 0 ? (kve_isa)v : kve__isa_detect();
}

/* Whether this CPU (and build) can run `isa`. */
bool kve__isa_supported(kve_isa isa);

/* Test hook: makes every later call use `isa` (KVE_ISA_COUNT: back to the
 * detected one). Returns false, changing nothing, when `isa` is not
 * supported. Not for use while other threads call the library. */
bool kve__isa_force(kve_isa isa);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVE_X86 1
#include <immintrin.h>
#define KVE_TARGET_AVX2 __attribute__((target("avx2")))
#if defined(__clang__)
#define KVE_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2")))
#else
#define KVE_TARGET_AVX512 \
    __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,prefer-vector-width=512")))
#endif
#else
#define KVE_X86 0
#endif

#define KVE_ALWAYS_INLINE static inline __attribute__((always_inline))

/* Three functions NAME_kv1 (portable), NAME_kv4 (AVX2) and NAME_kv8 (AVX-512)
 * of type RET PARAMS, returning CALL1, CALL4 and CALL8 (each usually an
 * always-inline body, so the compiler vectorises it for that target), and
 * the table NAME_isa[kve_isa] of them. Without vector paths every entry is
 * the portable one. */
#if KVE_X86
#define KVE_PER_ISA(NAME, RET, PARAMS, CALL1, CALL4, CALL8)                                 \
    static RET NAME##_kv1 PARAMS { return CALL1; }                                          \
    KVE_TARGET_AVX2 static RET NAME##_kv4 PARAMS { return CALL4; }                          \
    KVE_TARGET_AVX512 static RET NAME##_kv8 PARAMS { return CALL8; }                        \
    /* PARAMS is a parameter list: it cannot be parenthesised */                           \
    static RET(*const NAME##_isa[KVE_ISA_COUNT]) PARAMS = /* NOLINT(bugprone-macro-parentheses) */ \
        {NAME##_kv1, NAME##_kv4, NAME##_kv8};
#else
#define KVE_PER_ISA(NAME, RET, PARAMS, CALL1, CALL4, CALL8)                                 \
    static RET NAME##_kv1 PARAMS { return CALL1; }                                          \
    static RET(*const NAME##_isa[KVE_ISA_COUNT]) PARAMS = /* NOLINT(bugprone-macro-parentheses) */ \
        {NAME##_kv1, NAME##_kv1, NAME##_kv1};
#endif

/* ---- one head's attention input ---- */

/* `group` rows of query heads, row q at row + q * ld; slot i's weight is the
 * reduction of row[q * ld + i] over q: the row itself when group is 1; else
 * the sum in double in query-head order (mean: that sum divided by group in
 * double), rounded to float32 once; or the largest weight (max). The kernels
 * read a single row directly and reduce a group with kv*_rows
 * (simd_generic.inc), which assumes group > 1. */
typedef struct kve_rows {
    const float *row;
    size_t ld;
    size_t group;
    kve_reduce reduce;
} kve_rows;

/* The columns a vnorm pass writes besides the rule's own (observe.inc). */
typedef struct kve_vn_ctx {
    double *score; /* the score column: raw * vnorm */
    double *vn;    /* the value norms */
} kve_vn_ctx;

/* ---- argmin, ties to the lower index ---- */

typedef struct kve_amin {
    double v;
    size_t i; /* KVE_NONE while nothing was seen */
} kve_amin;

#define KVE_AMIN_INIT {INFINITY, KVE_NONE}

/* For candidates seen in ascending index order. Scores are finite. */
KVE_ALWAYS_INLINE void kve__amin_step(kve_amin *m, double s, size_t i)
{
    if (s < m->v) {
        m->v = s;
        m->i = i;
    }
}

/* For candidates in any order: the lower score, then the lower index. */
KVE_ALWAYS_INLINE void kve__amin_merge(kve_amin *m, double s, size_t i)
{
    if (s < m->v || (s == m->v && i < m->i)) {
        m->v = s;
        m->i = i;
    }
}

/* The answer of an argmin over `limit` candidates: m's index, KVE_NONE only
 * when limit is 0. Scores are finite after every checked step, so some
 * candidate is below the initial +inf; an unchecked step fed NaN or
 * infinite weights (kvevict.h, "Unchecked steps") can leave only NaN and
 * +inf, which never compare below it: the victim is then slot 0, so that it
 * stays a candidate and every later index stays in range. */
KVE_ALWAYS_INLINE size_t kve__amin_index(const kve_amin *m, size_t limit)
{
    return m->i == KVE_NONE && limit ? 0 : m->i;
}

/* ---- whole-row kernels (kernels.c), dispatched on kve__isa() ---- */

/* Whether some input weight of `in` over slots [0, n) is NaN, infinite or
 * negative, or (reduce sum) some reduced weight overflows float32. On true,
 * *q and *i name the first offender in row-major order (q = in->group for an
 * overflowing sum, i its slot). Reads every weight once. */
bool kve__rows_invalid(const kve_rows *in, size_t n, size_t *q, size_t *i);

/* The lowest index of the lowest of the first `limit` scores of a column of
 * n scores with a hole at `gap` (gap >= n: none), which it closes on the way
 * (slot i is read from i + (i >= gap); slots [gap, n) move one left).
 * KVE_NONE for limit 0; always below limit otherwise (kve__amin_index).
 * limit <= n. */
size_t kve__shift_argmin(double *score, size_t n, size_t gap, size_t limit);

/* ---- keys (kernels.c), dispatched on kve__isa() ---- */

/* The index of the first NaN or infinite entry of k[0 .. d), d if none. */
size_t kve__key_invalid(const float *k, size_t d);

/* Partial sums of the key kernels: index j goes to sum j mod KVE_KEY_LANES,
 * and the sums are added pairwise at the end (lane j += lane j + w, for w =
 * 4, 2, 1), so a vectorised path adds exactly what the scalar one does. */
enum { KVE_KEY_LANES = 8 };

/* ||k||: the square root (double) of the sum of (double)k_j * (double)k_j
 * over j < d in KVE_KEY_LANES partial sums. */
double kve__key_norm(const float *k, size_t d);

#endif /* KVE_KERNELS_H */
