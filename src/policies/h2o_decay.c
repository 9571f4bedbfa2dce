/* SPDX-License-Identifier: MIT */
/*
 * h2o_decay.c - heavy hitters with a forgetting factor (A2SF, Jo & Shin, 2024).
 *
 * Score: score = decay * score + attn at every informative step, so a weight
 * received k informative steps ago counts decay^k. decay = 1 is h2o exactly.
 * A NULL step neither adds nor decays. The default 0.99 (a memory of about
 * 1 / (1 - 0.99) = 100 steps) was fixed before any measurement.
 * Cost: one multiply-add per kept position per step; 13 bytes a slot.
 */
#include "../policy_impl.h"

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(32),
    {.key = "decay", .kind = KVE_PARAM_REAL, .rdefault = 0.99, .rmin = 0.0, .rmax = 1.0,
     .flags = KVE_PARAM_MIN_OPEN, .offset = offsetof(kve_params, decay),
     .doc = "forgetting factor per informative step, in (0, 1]"},
};

static void observe(kve_policy *p, const float *attn, size_t n)
{
    double *score = p->score;
    const double decay = p->params.decay;
    for (size_t i = 0; i < n; i++)
        score[i] = decay * score[i] + (double)attn[i];
}

const kve_policy_type kve__h2o_decay_type = {
    .name = "h2o_decay",
    .summary = "cumulative attention that forgets: decay * score + attn (A2SF)",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED,
    .observe = observe,
    .select = kve__select_argmin,
};
