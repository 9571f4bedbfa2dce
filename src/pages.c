/* SPDX-License-Identifier: MIT */
/*
 * pages.c - eviction in whole pages (block = b > 1): positions p with the
 * same p / b form page p / b, and a page leaves the kept set whole, as the
 * page of a paged KV cache is freed whole.
 *
 * A page is evictable when it is complete (the head has admitted a position
 * at or past its last one, (p / b + 1) * b - 1, so nothing can join it any
 * more) and none of its kept slots is among the newest recent_window (scored
 * policies), or it holds no sink (streaming). Pages are runs of consecutive
 * slots in kept order, so one walk over the kept positions sees every page.
 *
 * Invariants:
 *  - Whole pages only: after an eviction every page is either wholly kept
 *    (every position of it the head admitted) or wholly gone.
 *  - Scored policies: the page with the lowest score goes first (the sum of
 *    its slots' scores in kept order, in double; with block_mean=1 that sum
 *    divided by the page's slot count), ties to the lower page; window and
 *    streaming: the oldest page first. A same_positions bank sums its
 *    heads' scores of each slot first (kve__slot_sum), then the page's.
 *  - Enough evictable pages exist whenever the budget is at least
 *    kve__page_reserve (checked when the spec is parsed and by every evict):
 *    the unevictable slots are the newest max(rw, b - 1) (the recent window
 *    and the incomplete newest page) and up to b - 1 older slots sharing a
 *    page with the oldest of them; for streaming the sinks and up to b - 1
 *    positions in the last sink's page, and the incomplete page.
 * Cost: one walk over the kept slots per page removed (usually one page per
 * eviction, every b-th step in the steady state), then one compaction; the
 * sliding policies walk only the pages they remove. No allocation, no state
 * beyond the policy's own columns: a page costs b slots of the plain policy.
 */
#include "policy_impl.h"

#include <stdio.h>

size_t kve__page_reserve(const kve_config *c)
{
    size_t b = c->params.block;
    if (b < 2)
        return 0;
    if (c->type->flags & KVE_TYPE_SCORED) {
        size_t rw = c->params.recent_window;
        return (rw > b - 1 ? rw : b - 1) + b - 1;
    }
    return (c->params.sinks ? c->params.sinks + b - 1 : 0) + b - 1;
}

kve_status kve__check_pages(const kve_config *c, size_t budget)
{
    size_t need = kve__page_reserve(c);
    if (budget < need)
        return kve__fail(KVE_EINVAL,
                         "%s: budget %zu is below %zu, the positions that pages of block=%zu can "
                         "leave unevictable",
                         c->type->name, budget, need, c->params.block);
    return KVE_OK;
}

/* Whether page `page` can no longer grow: the head admitted its last position. */
static bool complete(const kve_head *h, int64_t page, size_t b)
{
    return (int64_t)h->last_pos >= (page + 1) * (int64_t)b - 1;
}

size_t kve__mark_pages(const kve_config *c, kve_head *h, const kve_head *heads, size_t nh,
                       size_t n_evict)
{
    const size_t b = c->params.block, n = h->size, limit = n - c->params.recent_window;
    const int32_t *pos = h->col[KVE_COL_POS];
    uint8_t *mark = h->col[KVE_COL_MARK];
    size_t removed = 0, first = n;
    while (removed < n_evict) {
        size_t best = KVE_NONE, best_end = 0;
        double best_key = 0.0;
        for (size_t i = 0, j; i < limit; i = j) {
            int64_t page = pos[i] / (int64_t)b;
            double sum = 0.0;
            for (j = i; j < n && pos[j] / (int64_t)b == page; j++)
                sum += kve__slot_sum(heads, nh, j);
            if (j > limit || mark[i] || !complete(h, page, b))
                continue;
            double key = c->params.block_mean ? sum / (double)(j - i) : sum;
            if (best == KVE_NONE || key < best_key) { /* ties: the lower page stays chosen */
                best = i;
                best_end = j;
                best_key = key;
            }
        }
        if (best == KVE_NONE)
            break; /* unreachable above kve__page_reserve */
        for (size_t i = best; i < best_end; i++)
            mark[i] = 1;
        removed += best_end - best;
        first = best < first ? best : first;
    }
    return first;
}

size_t kve__evict_pages(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims)
{
    kve__close_gap(c, h);
    h->best = KVE_NONE;
    return kve__compact_marked(c, h, kve__mark_pages(c, h, h, 1, n_evict), victims);
}

size_t kve__sliding_evict_pages(const kve_config *c, kve_head *h, size_t n_evict,
                                int32_t *victims)
{
    const int32_t *pos = h->col[KVE_COL_POS];
    const size_t b = c->params.block, n = h->size;
    size_t pinned = 0;
    if (c->params.sinks) {
        size_t sinks = c->params.sinks < n ? c->params.sinks : n;
        int64_t last_sink_page = pos[sinks - 1] / (int64_t)b;
        while (pinned < n && pos[pinned] / (int64_t)b <= last_sink_page)
            pinned++;
    }
    size_t end = pinned;
    while (end - pinned < n_evict && end < n) {
        int64_t page = pos[end] / (int64_t)b;
        if (!complete(h, page, b))
            break; /* the newest page; unreachable above kve__page_reserve */
        while (end < n && pos[end] / (int64_t)b == page)
            end++;
    }
    kve__sliding_remove(h, pinned, end - pinned, victims);
    return end - pinned;
}
