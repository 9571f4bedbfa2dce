/* SPDX-License-Identifier: MIT */
/*
 * random.c - uniform random victims among all but the newest recent_window
 * kept positions: the floor that any policy worth its arithmetic must beat.
 *
 * Each victim is drawn with kve_rng_below over the unmarked unprotected
 * slots, from a private generator seeded at construction by one draw of the
 * caller's Rng (one draw per head of a bank, in head order): same seed, same
 * victims. Cost: O(kept) per victim (the walk to the r-th unmarked slot);
 * 5 bytes a slot (position and scratch).
 */
#include "../policy_impl.h"

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(0),
};

static size_t select_random(const kve_config *c, kve_head *h, size_t n_evict)
{
    uint8_t *mark = h->col[KVE_COL_MARK];
    size_t limit = h->size - c->params.recent_window;
    size_t first = limit;
    for (size_t k = 0; k < n_evict; k++) {
        uint64_t r = kve_rng_below(&h->rng, limit - k);
        size_t i = 0;
        for (;; i++) /* the r-th unmarked slot; it exists since r < limit - k */
            if (!mark[i] && r-- == 0)
                break;
        mark[i] = 1;
        if (i < first)
            first = i;
    }
    return first;
}

const kve_policy_type kve__random_type = {
    .name = "random",
    .summary = "uniform random victims (the floor)",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_MARKED | KVE_TYPE_NEEDS_RNG,
    .select = select_random,
};
