/* SPDX-License-Identifier: MIT */
/*
 * rng.c - xoshiro256** (Blackman & Vigna, 2018) seeded by splitmix64.
 *
 * Invariant: the output sequence is a pure function of the seed; no state
 * lives outside the caller's kve_rng. splitmix64 never yields the all-zero
 * state that xoshiro must avoid (four consecutive outputs cannot all be 0).
 */
#include "internal.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

void kve_rng_seed(kve_rng *rng, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&seed);
}

uint64_t kve_rng_next(kve_rng *rng)
{
    return kve__rng_next_inline(rng);
}

double kve_rng_uniform(kve_rng *rng)
{
    return kve__rng_uniform_inline(rng);
}

uint64_t kve_rng_below(kve_rng *rng, uint64_t bound)
{
    if (bound == 0)
        return 0;
    /* Reject the lowest (2^64 mod bound) outputs: the 2^64 - threshold that
     * remain are a whole number of periods of `bound`, so every residue is
     * equally likely. */
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t x = kve_rng_next(rng);
        if (x >= threshold)
            return x % bound;
    }
}
