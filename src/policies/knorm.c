/* SPDX-License-Identifier: MIT */
/*
 * knorm.c - keys of smallest L2 norm (Devoto, Zhao, Scardapane, Minervini,
 * EMNLP 2024; kvpress's KnormPress).
 *
 * Score: -||k|| of the position's key (kve__key_norm: the sum of squares in
 * double in 8 partial sums, then the square root), fixed when the position
 * is admitted; the lowest score, i.e. the largest norm, is evicted first,
 * ties to the lower position. Keys of large norm tend to draw little
 * attention. The newcomer competes with its own score, so no recent window
 * is needed to protect it (the default is 0, as in the sources); one may be
 * given.
 * Attention is never read (a weight vector is only validated).
 * Cost per step: O(d) for the norm, then one pass over the kept scores that
 * closes the hole of the last evict and finds the next victim (the shared
 * argmin, vectorised); 13 bytes a slot: a scalar score per slot, never the
 * key.
 */
#include "../policy_impl.h"

#include <stdio.h>

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(0),
};

/* An image's scores are minus norms: never positive. */
static bool check_state(const kve_config *c, const kve_head *h, char *msg, size_t cap)
{
    (void)c;
    const double *score = h->col[KVE_COL_SCORE];
    for (size_t i = 0; i < h->size; i++)
        if (score[i] > 0.0) {
            snprintf(msg, cap, "score[%zu] = %g is positive: it is minus a key's norm", i,
                     score[i]);
            return false;
        }
    return true;
}

static size_t step(const kve_config *c, kve_head *h, const float *key, size_t limit, kve_isa isa)
{
    (void)isa; /* the norm kernel dispatches itself */
    size_t n = h->size;
    size_t best = kve__scored_scan(c, h, limit < n ? limit : n);
    double *score = h->col[KVE_COL_SCORE];
    double s = -kve__key_norm(key, c->key_dim);
    score[n] = s;
    /* The newcomer is the highest index: it wins only on a strictly lower
     * score. */
    if (limit > n && (best == KVE_NONE || score[best] > s))
        best = n;
    return best;
}

const kve_policy_type kve__knorm_type = {
    .name = "knorm",
    .summary = "the keys of smallest L2 norm (reads keys, not attention)",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED | KVE_TYPE_READS_KEYS,
    .step_keys = step,
    .select = kve__select_argmin,
    .evict = kve__evict_scored,
    .check_state = check_state,
};
