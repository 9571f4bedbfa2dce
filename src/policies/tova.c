/* SPDX-License-Identifier: MIT */
/*
 * tova.c - Token Omission Via Attention (Oren et al., 2024).
 *
 * Score: the attention of the latest informative step only (replaced, not
 * accumulated). A NULL step keeps the previous scores. The newcomer has no
 * score yet, so recent_window defaults to 1 to protect it.
 * Cost: one store per kept position per step (the old score is never read);
 * 13 bytes a slot.
 */
#include "../policy_impl.h"

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(1),
    KVE_DEF_PAGES,
    KVE_DEF_VNORM,
};

/* The rule, per slot: score = a. The slot's old score is not read, so the
 * gap closes by itself. A pass that only stores makes every store miss
 * the score lines that are no longer in L1 (a read for ownership in the
 * store's path, where h2o's load of the old score brings the line in
 * first): the lane prefetches the lines PREFETCH_AHEAD slots ahead, for
 * writing, which measured 1.1 to 1.3 times faster from 4Ki slots on. A
 * prefetch changes no result and cannot fault past the column's end (its
 * address is computed as an integer: no pointer past the column is
 * formed). */
enum { PREFETCH_AHEAD = 64 };
typedef kve_score_ctx tova_ctx;
#define tova_prep kve__score_prep

#define KVE_OBS tova
#define KVE_OBS_LANE                                                                        \
    {                                                                                       \
        (void)src;                                                                          \
        __builtin_prefetch((const void *)((uintptr_t)(x->score + i) +                       \
                                          PREFETCH_AHEAD * sizeof(double)), 1, 3);           \
        KV_d s = kv_cvt(a);                                                                 \
        kv_st(x->score + i, s);                                                             \
        return s;                                                                           \
    }
#include "../observe.inc"

static const kve_lane tova_lane = KVE_LANE(tova);

const kve_policy_type kve__tova_type = {
    .name = "tova",
    .summary = "the current step's attention only",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED | KVE_TYPE_ATTN_SCORE | KVE_TYPE_VNORM,
    .lane = &tova_lane,
    .select = kve__select_argmin,
    .evict = kve__evict_scored,
};
