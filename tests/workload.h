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
};

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
