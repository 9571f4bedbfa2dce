/* SPDX-License-Identifier: MIT */
/*
 * scored.c - the one eviction mechanism of every policy that chooses
 * victims individually: `select` marks them, one compaction removes them.
 *
 * Invariants:
 *  - Only slots [0, size - recent_window) can be marked: the newest
 *    recent_window kept positions are protected.
 *  - Argmin ties go to the lower index, which is the lower position, because
 *    the scan runs in kept (ascending) order and only a strictly smaller
 *    score replaces the candidate.
 *  - Compaction walks kept order, so victims come out ascending and the kept
 *    positions stay ascending; it clears every mark it meets.
 * Cost: select_argmin is n_evict scans of the unprotected slots (one in the
 * steady state); compaction is one memmove per column per run of survivors
 * after the first victim, plus a byte read per slot from the first victim on.
 */
#include "policy_impl.h"

#include <string.h>

kve_status kve__check_recent_window(kve_policy *p)
{
    if (p->params.recent_window >= p->params.budget)
        return kve__fail(KVE_EINVAL, "%s: recent_window %zu must be smaller than budget %zu",
                         p->type->name, p->params.recent_window, p->params.budget);
    return KVE_OK;
}

void kve__select_argmin(kve_policy *p, size_t n_evict)
{
    const double *score = p->score;
    uint8_t *mark = p->mark;
    size_t limit = p->size - p->params.recent_window;
    size_t first = limit;
    if (n_evict == 1) {
        /* The steady state: nothing is marked yet, so a plain argmin. */
        size_t best = 0;
        for (size_t i = 1; i < limit; i++)
            if (score[i] < score[best])
                best = i;
        mark[best] = 1;
        p->first_mark = best;
        return;
    }
    for (size_t k = 0; k < n_evict; k++) {
        size_t best = SIZE_MAX;
        double best_score = 0.0;
        for (size_t i = 0; i < limit; i++) {
            if (!mark[i] && (best == SIZE_MAX || score[i] < best_score)) {
                best = i;
                best_score = score[i];
            }
        }
        mark[best] = 1;
        if (best < first)
            first = best;
    }
    p->first_mark = first;
}

/* Moves `count` slots from index `src` to index `dst` (dst < src) in every column. */
static void move_slots(kve_policy *p, size_t dst, size_t src, size_t count)
{
    memmove(p->pos + dst, p->pos + src, count * sizeof *p->pos);
    if (p->score)
        memmove(p->score + dst, p->score + src, count * sizeof *p->score);
    for (int c = 0; c < KVE_MAX_EXTRA; c++) {
        size_t elem = p->extra_elem[c];
        if (elem) {
            char *base = p->extra[c];
            memmove(base + dst * elem, base + src * elem, count * elem);
        }
    }
}

void kve__evict_marked(kve_policy *p, size_t n_evict, int32_t *victims)
{
    p->type->select(p, n_evict);
    uint8_t *mark = p->mark;
    size_t n = p->size, nv = 0;
    size_t w = p->first_mark; /* write index */
    size_t r = w;             /* read index */
    while (r < n) {
        if (mark[r]) {
            victims[nv++] = p->pos[r];
            mark[r] = 0;
            r++;
            continue;
        }
        size_t end = r;
        while (end < n && !mark[end])
            end++;
        move_slots(p, w, r, end - r);
        w += end - r;
        r = end;
    }
    p->size = w;
}
