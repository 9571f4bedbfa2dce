/* SPDX-License-Identifier: MIT */
/*
 * window.c - the most recent `budget` positions: the sliding layout
 * (sliding.c) with no sinks. O(1) amortised per step, 4.5 bytes a slot.
 */
#include "../policy_impl.h"

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_BLOCK,
};

const kve_policy_type kve__window_type = {
    .name = "window",
    .summary = "the most recent budget positions",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .evict = kve__sliding_evict,
    .cap_for_budget = kve__sliding_cap,
};
