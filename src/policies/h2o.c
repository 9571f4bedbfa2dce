/* SPDX-License-Identifier: MIT */
/*
 * h2o.c - Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023).
 *
 * Score: the sum of every attention weight a position has received, in
 * float64 (float32 weights widened before the add, so four thousand steps
 * lose no low-order bits the comparison depends on). Newcomers start at 0
 * and are protected by the recent window. Eviction: the shared argmin.
 * Cost: one add per kept position per step; 13 bytes a slot.
 */
#include "../policy_impl.h"

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(32),
    KVE_DEF_PAGES,
    KVE_DEF_VNORM,
};

/* The rule, per slot: score = score + a. */
typedef kve_score_ctx h2o_ctx;
#define h2o_prep kve__score_prep

#define KVE_OBS h2o
#define KVE_OBS_LANE                                                                        \
    {                                                                                       \
        KV_d s = kv_add(kv_ld(x->score + src), kv_cvt(a));                                  \
        kv_st(x->score + i, s);                                                             \
        return s;                                                                           \
    }
#include "../observe.inc"

static const kve_lane h2o_lane = KVE_LANE(h2o);

const kve_policy_type kve__h2o_type = {
    .name = "h2o",
    .summary = "heavy hitters: cumulative attention plus a recent window",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED | KVE_TYPE_ATTN_SCORE | KVE_TYPE_VNORM,
    .lane = &h2o_lane,
    .select = kve__select_argmin,
    .evict = kve__evict_scored,
};
