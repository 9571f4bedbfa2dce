/* SPDX-License-Identifier: MIT */
/*
 * h2o_mean.c - mean-normalised heavy hitters (NORM_SUM in OpenVINO GenAI;
 * ObservedAttention in kvpress).
 *
 * Score: the sum of a position's attention divided by the number of
 * informative steps it has been kept through, which removes the cumulative
 * sum's bias toward old positions. A position not yet observed scores 0
 * (the recent window protects it).
 * Columns beyond h2o's: sum (double) and birth (uint32_t, the value of the
 * informative-step counter when the position was admitted), so the count is
 * observed - birth with no per-slot counter to update.
 * Cost: one add and one divide per kept position per step; 25 bytes a slot.
 */
#include "../policy_impl.h"

enum { SUM, BIRTH };

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(32),
};

static kve_status init(kve_policy *p)
{
    p->extra_elem[SUM] = sizeof(double);
    p->extra_elem[BIRTH] = sizeof(uint32_t);
    return kve__check_recent_window(p);
}

static void observe(kve_policy *p, const float *attn, size_t n)
{
    double *score = p->score;
    double *sum = p->extra[SUM];
    const uint32_t *birth = p->extra[BIRTH];
    /* Positions are strictly increasing int32, so fewer than 2^31 steps exist. */
    const uint32_t now = (uint32_t)p->observed;
    for (size_t i = 0; i < n; i++) {
        sum[i] += (double)attn[i];
        score[i] = sum[i] / (double)(now - birth[i]);
    }
}

static void admit(kve_policy *p, size_t i)
{
    ((double *)p->extra[SUM])[i] = 0.0;
    ((uint32_t *)p->extra[BIRTH])[i] = (uint32_t)p->observed;
}

const kve_policy_type kve__h2o_mean_type = {
    .name = "h2o_mean",
    .summary = "cumulative attention divided by steps observed (NORM_SUM)",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED,
    .init = init,
    .observe = observe,
    .admit = admit,
    .select = kve__select_argmin,
};
