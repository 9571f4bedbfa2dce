/* SPDX-License-Identifier: MIT */
/*
 * full.c - keeps everything: the ceiling every other policy is measured
 * against. Storage starts at budget + 1 slots and doubles as the sequence
 * grows; evict always reports 0 victims. 4 bytes a slot.
 */
#include "../policy_impl.h"

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
};

const kve_policy_type kve__full_type = {
    .name = "full",
    .summary = "never evicts: the ceiling",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_NEVER_EVICTS,
};
