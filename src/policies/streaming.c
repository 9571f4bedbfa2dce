/* SPDX-License-Identifier: MIT */
/*
 * streaming.c - StreamingLLM (Xiao et al., ICLR 2024): the first `sinks`
 * positions ever admitted stay forever, the rest is the most recent
 * budget - sinks positions. No score, no arithmetic on the kept set: the
 * sliding layout of sliding.c, the sinks kept at the front of the run.
 * O(1) amortised per step, 4.5 bytes a slot.
 */
#include "../policy_impl.h"

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_SIZE("sinks", 4, 0, KVE_MAX_BUDGET - 1, sinks,
                 "first positions ever admitted, kept forever"),
    KVE_DEF_BLOCK,
};

static kve_status init(kve_config *c)
{
    if (c->params.sinks >= c->params.budget)
        return kve__fail(KVE_EINVAL, "%s: sinks %zu must be smaller than budget %zu",
                         c->type->name, c->params.sinks, c->params.budget);
    return KVE_OK;
}

const kve_policy_type kve__streaming_type = {
    .name = "streaming",
    .summary = "StreamingLLM: attention sinks plus a recent window",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .init = init,
    .evict = kve__sliding_evict,
    .cap_for_budget = kve__sliding_cap,
};
