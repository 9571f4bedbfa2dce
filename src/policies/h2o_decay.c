/* SPDX-License-Identifier: MIT */
/*
 * h2o_decay.c - heavy hitters with a forgetting factor (A2SF, Jo & Shin, 2024).
 *
 * Score: score = decay * score + attn at every informative step, so a weight
 * received k informative steps ago counts decay^k. decay = 1 is h2o exactly.
 * A NULL step neither adds nor decays. The default 0.99 (a memory of about
 * 1 / (1 - 0.99) = 100 steps) was fixed before any measurement.
 * The multiply and the add are two roundings on every path, never one fused
 * multiply-add (kernels.h), so every instruction set gives the same scores.
 * Cost: one multiply and one add per kept position per step; 13 bytes a slot.
 */
#include "../policy_impl.h"

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(32),
    {.key = "decay", .kind = KVE_PARAM_REAL, .rdefault = 0.99, .rmin = 0.0, .rmax = 1.0,
     .flags = KVE_PARAM_MIN_OPEN, .offset = offsetof(kve_params, decay),
     .doc = "forgetting factor per informative step, in (0, 1]"},
    KVE_DEF_PAGES,
    KVE_DEF_VNORM,
};

/* The rule, per slot: score = decay * score + a. */
typedef struct decay_ctx {
    double *score;
    double decay;
} decay_ctx;

KVE_ALWAYS_INLINE void decay_prep(decay_ctx *x, const kve_config *c, kve_head *h)
{
    x->score = h->col[KVE_COL_SCORE];
    x->decay = c->params.decay;
}

#define KVE_OBS decay
#define KVE_OBS_LANE                                                                        \
    {                                                                                       \
        KV_d s = kv_add(kv_mul(kv_set(x->decay), kv_ld(x->score + src)), kv_cvt(a));        \
        kv_st(x->score + i, s);                                                             \
        return s;                                                                           \
    }
#include "../observe.inc"

static const kve_lane decay_lane = KVE_LANE(decay);

const kve_policy_type kve__h2o_decay_type = {
    .name = "h2o_decay",
    .summary = "cumulative attention that forgets: decay * score + attn (A2SF)",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED | KVE_TYPE_ATTN_SCORE | KVE_TYPE_VNORM,
    .lane = &decay_lane,
    .select = kve__select_argmin,
    .evict = kve__evict_scored,
};
