/* SPDX-License-Identifier: MIT */
/*
 * sliding.c - the layout of the policies that keep a contiguous run of recent
 * positions (window, and streaming with its sinks in front): no score, no
 * arithmetic on the kept set, O(1) amortised per step.
 *
 * Layout: a head's positions are one ascending run pos[0 .. size) that starts
 * `offset` slots into a block of cap = (budget + 1) + slack slots,
 * slack = max(1, (budget + 1) / 8). Evicting k positions writes the k oldest
 * non-sinks out, slides the sinks k slots right over them and moves the start
 * right by k: O(k + sinks), no shifting of the recent run. When the run
 * reaches the end of the block, kve__sliding_rewind moves it back to the
 * start, at most once every `slack` steps, so the amortised cost per step is
 * O(sinks + (budget + 1) / slack) = O(1). 4.5 bytes a slot.
 *
 * Invariants: offset + size <= cap; offset > 0 only for these policies (so
 * the bank's growth test "offset == 0 and size == cap" means "full" for
 * every policy, and "offset + size == cap with offset > 0" means "rewind").
 */
#include "policy_impl.h"

#include <string.h>

size_t kve__sliding_cap(size_t budget)
{
    size_t slots = budget + 1;
    size_t slack = slots / 8;
    return slots + (slack ? slack : 1);
}

void kve__sliding_rewind(kve_head *h)
{
    int32_t *run = h->col[KVE_COL_POS];
    int32_t *base = run - h->offset;
    memmove(base, run, h->size * sizeof *base);
    h->col[KVE_COL_POS] = base;
    h->offset = 0;
}

void kve__sliding_remove(kve_head *h, size_t pinned, size_t n_evict, int32_t *victims)
{
    int32_t *pos = h->col[KVE_COL_POS];
    /* Plain loops: the steady state moves one victim and a few sinks. */
    for (size_t i = 0; i < n_evict; i++)
        victims[i] = pos[pinned + i];
    for (size_t i = pinned; i-- > 0;) /* right by n_evict, over the victims: downwards */
        pos[i + n_evict] = pos[i];
    h->col[KVE_COL_POS] = pos + n_evict;
    h->offset += n_evict;
    h->size -= n_evict;
}

size_t kve__sliding_evict(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims)
{
    kve__sliding_remove(h, c->params.sinks < h->size ? c->params.sinks : h->size, n_evict,
                        victims);
    return n_evict;
}
