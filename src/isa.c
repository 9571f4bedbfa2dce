/* SPDX-License-Identifier: MIT */
/*
 * isa.c - choosing the instruction set of the kernels, once.
 *
 * Invariant: kve__isa_active holds -1 until the first call to kve__isa (an
 * inline function of kernels.h that reads it), then the index of a
 * supported kve_isa forever (unless a test forces another). It is an atomic
 * int read with relaxed ordering: threads racing through the first call each
 * detect the same answer and store the same value, so no lock is needed and
 * ThreadSanitizer sees no race.
 * Detection reads cpuid through __builtin_cpu_supports, which also checks
 * that the operating system saves the vector registers (xgetbv). Under
 * valgrind, which emulates no AVX-512, the same code picks AVX2.
 */
#include "kernels.h"

#include <stdatomic.h>

atomic_int kve__isa_active = -1;

bool kve__isa_supported(kve_isa isa)
{
    switch (isa) {
    case KVE_ISA_SCALAR: return true;
#if KVE_X86
    case KVE_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") != 0;
    case KVE_ISA_AVX512:
        __builtin_cpu_init();
        return (__builtin_cpu_supports("avx512f") != 0) & (__builtin_cpu_supports("avx512vl") != 0) &
               (__builtin_cpu_supports("avx512dq") != 0) & (__builtin_cpu_supports("avx512bw") != 0);
#endif
    default: return false;
    }
}

static kve_isa detect(void)
{
    if (kve__isa_supported(KVE_ISA_AVX512))
        return KVE_ISA_AVX512;
    if (kve__isa_supported(KVE_ISA_AVX2))
        return KVE_ISA_AVX2;
    return KVE_ISA_SCALAR;
}

kve_isa kve__isa_detect(void)
{
    int v = (int)detect();
    atomic_store_explicit(&kve__isa_active, v, memory_order_relaxed);
    return (kve_isa)v;
}

bool kve__isa_force(kve_isa isa)
{
    if (isa == KVE_ISA_COUNT) {
        atomic_store_explicit(&kve__isa_active, (int)detect(), memory_order_relaxed);
        return true;
    }
    if (!kve__isa_supported(isa))
        return false;
    atomic_store_explicit(&kve__isa_active, (int)isa, memory_order_relaxed);
    return true;
}

const char *kve_isa_name(void)
{
    static const char *const names[KVE_ISA_COUNT] = {"scalar", "avx2", "avx512"};
    return names[kve__isa()];
}
