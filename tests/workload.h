/* SPDX-License-Identifier: MIT */
/*
 * workload.h - the random decode workload the differential tests share: specs
 * that reach every policy's corners (budget 1, recent_window 0, sinks 0 and
 * at the limit, every history length class, decay 1), and a weight generator
 * built to hit the cases where two implementations can disagree: exact
 * zeros, ties (a small pool of repeated values), the fair share 1/n exactly
 * (scissorhands' strict '>'), and rare large weights.
 * Header only; deterministic for a given generator state.
 */
#ifndef KVE_WORKLOAD_H
#define KVE_WORKLOAD_H

#include "kvevict.h"

#include <string.h>

static const char *const workload_specs[] = {
    "full:budget=8",
    "window:budget=1",
    "window:budget=7",
    "window:budget=64",
    "streaming:budget=5,sinks=4",
    "streaming:budget=9,sinks=0",
    "streaming:budget=12,sinks=1",
    "streaming:budget=33,sinks=4",
    "random:budget=6,recent_window=0",
    "random:budget=10,recent_window=3",
    "random:budget=40,recent_window=8",
    "h2o:budget=1,recent_window=0",
    "h2o:budget=6,recent_window=0",
    "h2o:budget=8,recent_window=2",
    "h2o:budget=32,recent_window=8",
    "scissorhands:budget=6,recent_window=0,history=0",
    "scissorhands:budget=8,recent_window=2,history=1",
    "scissorhands:budget=12,recent_window=1,history=7",
    "scissorhands:budget=24,recent_window=4,history=64",
    "scissorhands:budget=16,recent_window=3,history=0",
    "tova:budget=4,recent_window=1",
    "tova:budget=9,recent_window=0",
    "tova:budget=20,recent_window=5",
    "h2o_decay:budget=6,recent_window=1,decay=1",
    "h2o_decay:budget=8,recent_window=2,decay=0.5",
    "h2o_decay:budget=16,recent_window=3,decay=0.99",
    "h2o_mean:budget=5,recent_window=0",
    "h2o_mean:budget=8,recent_window=1",
    "h2o_mean:budget=24,recent_window=6",
    "knorm:budget=1,recent_window=0",
    "knorm:budget=6,recent_window=0",
    "knorm:budget=9,recent_window=2",
    "knorm:budget=30,recent_window=7",
    "keydiff:budget=1,recent_window=0",
    "keydiff:budget=5,recent_window=0",
    "keydiff:budget=8,recent_window=1",
    "keydiff:budget=28,recent_window=6",
};

/* The key dimension the workload gives spec i: the policies that read keys
 * get one of a few (below, at and past a multiple of the 8 summation lanes);
 * every third of the others gets keys too, which it must validate and
 * ignore. */
static inline size_t workload_key_dim(const char *spec, size_t i)
{
    static const size_t dims[] = {1, 3, 8, 13, 32};
    size_t name = strcspn(spec, ":"); /* what the policy reads: the registry says */
    int keyed = 0;
    for (size_t t = 0; t < kve_policy_type_count(); t++)
        if (strlen(kve_policy_type_name(t)) == name &&
            strncmp(spec, kve_policy_type_name(t), name) == 0)
            keyed = (kve_policy_type_reads(t) & KVE_READS_KEYS) != 0;
    if (keyed || i % 3 == 0)
        return dims[i % (sizeof dims / sizeof dims[0])];
    return 0;
}

/* One key of d floats into key[], built to hit the cases two
 * implementations can disagree on: a key from a small pool (equal norms and
 * equal directions: ties), a pooled key scaled by 2 or 0.5 (the same
 * direction, another norm, exactly), the zero key, or fresh values with now
 * and then a large one. pool holds 4 keys of d floats. */
static inline void random_key(kve_rng *g, const float *pool, size_t d, float *key)
{
    uint64_t kind = kve_rng_below(g, 12);
    const float *src = pool + kve_rng_below(g, 4) * d;
    for (size_t j = 0; j < d; j++) {
        if (kind < 3)
            key[j] = src[j];
        else if (kind < 5)
            key[j] = src[j] * (kind == 3 ? 2.0f : 0.5f);
        else if (kind == 5)
            key[j] = 0.0f;
        else
            key[j] = (float)(kve_rng_uniform(g) * 2.0 - 1.0) *
                     (kve_rng_below(g, 50) == 0 ? 1000.0f : 1.0f);
    }
}

/* One weight over n kept: an exact zero, a value from a pool of four (ties),
 * exactly the fair share (float)(1/n) (scissorhands' strict '>'), a random
 * float in [0, 1), or a rare large one. */
static float random_weight(kve_rng *g, const float pool[4], size_t n)
{
    uint64_t kind = kve_rng_below(g, 20);
    if (kind == 18)
        return (float)(1.0 / (double)n);
    if (kind < 3)
        return 0.0f;
    if (kind < 10)
        return pool[kve_rng_below(g, 4)];
    if (kind == 19)
        return (float)(kve_rng_uniform(g) * 100.0);
    return (float)kve_rng_uniform(g);
}

#endif /* KVE_WORKLOAD_H */
