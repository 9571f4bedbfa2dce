/* SPDX-License-Identifier: MIT */
/*
 * tova.c - Token Omission Via Attention (Oren et al., 2024).
 *
 * Score: the attention of the latest informative step only (replaced, not
 * accumulated). A NULL step keeps the previous scores. The newcomer has no
 * score yet, so recent_window defaults to 1 to protect it.
 * Cost: one store per kept position per step; 13 bytes a slot.
 */
#include "../policy_impl.h"

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(1),
};

static void observe(kve_policy *p, const float *attn, size_t n)
{
    double *score = p->score;
    for (size_t i = 0; i < n; i++)
        score[i] = (double)attn[i];
}

const kve_policy_type kve__tova_type = {
    .name = "tova",
    .summary = "the current step's attention only",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED,
    .observe = observe,
    .select = kve__select_argmin,
};
