/* SPDX-License-Identifier: MIT */
/*
 * streaming.c - StreamingLLM (Xiao et al., ICLR 2024): the first `sinks`
 * positions ever admitted stay forever, the rest is the most recent
 * budget - sinks positions. No score, no arithmetic on the kept set.
 *
 * Layout: the kept positions are one ascending run pos[0 .. size) that
 * starts `offset` slots into a block of cap = (budget + 1) + slack slots,
 * slack = max(1, (budget + 1) / 8). Evicting k positions writes the k
 * oldest non-sinks out, slides the sinks k slots right over them and moves
 * the start right by k: O(k + sinks), no shifting of the recent run. When the
 * run reaches the end of the block it is moved back to the start, at most
 * once every `slack` steps, so the amortised cost per step is
 * O(sinks + (budget + 1) / slack) = O(1). 4.5 bytes a slot.
 * window.c reuses all of this with sinks fixed at 0.
 */
#include "../policy_impl.h"

#include <string.h>

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_SIZE("sinks", 4, 0, KVE_MAX_BUDGET - 1, sinks,
                 "first positions ever admitted, kept forever"),
};

static kve_status init(kve_policy *p)
{
    if (p->params.sinks >= p->params.budget)
        return kve__fail(KVE_EINVAL, "%s: sinks %zu must be smaller than budget %zu",
                         p->type->name, p->params.sinks, p->params.budget);
    return KVE_OK;
}

size_t kve__sliding_cap(size_t budget)
{
    size_t slots = budget + 1;
    size_t slack = slots / 8;
    return slots + (slack ? slack : 1);
}

kve_status kve__sliding_reserve(kve_policy *p)
{
    if (p->offset + p->size < p->cap)
        return KVE_OK;
    if (p->offset == 0)
        return kve__policy_resize(p, p->cap * 2);
    int32_t *base = p->pos - p->offset;
    memmove(base, p->pos, p->size * sizeof *base);
    p->pos = base;
    p->offset = 0;
    return KVE_OK;
}

void kve__sliding_evict(kve_policy *p, size_t n_evict, int32_t *victims)
{
    size_t sinks = p->params.sinks < p->size ? p->params.sinks : p->size;
    memcpy(victims, p->pos + sinks, n_evict * sizeof *victims);
    memmove(p->pos + n_evict, p->pos, sinks * sizeof *p->pos);
    p->pos += n_evict;
    p->offset += n_evict;
    p->size -= n_evict;
}

const kve_policy_type kve__streaming_type = {
    .name = "streaming",
    .summary = "StreamingLLM: attention sinks plus a recent window",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .init = init,
    .evict = kve__sliding_evict,
    .reserve = kve__sliding_reserve,
    .cap_for_budget = kve__sliding_cap,
};
