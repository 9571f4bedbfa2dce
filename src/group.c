/* SPDX-License-Identifier: MIT */
/*
 * group.c - one budget shared by the heads of a group (a layer's KV heads):
 * their storage, which follows each head's size, and the eviction that takes
 * the group's lowest-scoring positions wherever they are (Ada-KV).
 *
 * Legend: G = heads of a group (the bank's share), n_j = positions head j
 * keeps, c_j = slots head j owns, C = slots of the group's storage.
 *
 * Storage. A group's heads live in one region per column (its part of the
 * slabs, C = G * S0 with S0 = budget + 1 + slack, slack = max(1, S0 / 8);
 * later a private block): head j owns slots [o_j, o_j + c_j), heads in
 * order, o_0 = 0, sum of c_j = C. Sizes drift apart under a shared budget,
 * so a step that finds a head full (n_j = c_j) lays the group out again in
 * place: every head gets n_j + 1 slots plus an even share of the slots
 * left. Heads that move left are moved first, in head order, then the ones
 * that move right, in reverse order; so no head's slots are written before
 * they moved (the new and the old layout are both in head order). In the
 * steady state (evict after every step, sum of n_j <= budget before the
 * step) the group always has room: sum (n_j + 1) <= budget + G <= C, and a
 * re-layout leaves every head at least (C - budget - G) / G >= slack - 1
 * free slots, so it happens at most once every slack - 1 steps of one head's
 * growth: O(G * S0) per re-layout, O(G) amortised per step. Nothing
 * allocates then. Only a group that must hold more than C (stepped without
 * evicting, or evicted to a budget above the bank's) moves to a private
 * block of max(2C, need) slots, allocated all or nothing before anything
 * changes.
 *
 * Eviction. A group over its budget B loses its lowest-scoring unprotected
 * slots, compared across its heads by (score, head, position): each head's
 * newest recent_window are protected, and no head goes below its floor
 * f = max(recent_window, floor(min_share * B / G)). Since B > G *
 * recent_window is required and min_share <= 1, G * f <= B and the floors
 * can always be met. Each pick takes the lowest of the heads' current
 * minima (ties to the lower head), then rescans that head for its next
 * unpicked minimum: O(k * (n_j + G)) for k victims, the first minimum of a
 * head coming free from the step's pass. Marks are scratch: a refused call
 * clears them and changes nothing.
 */
#include "policy_impl.h"

#include <string.h>

static kve_head *group_heads(kve_bank *b, size_t g)
{
    return &b->heads[g * b->share];
}

/* Slot offset of head h in group storage `base` (its pos column). */
static size_t offset_in(const kve_group *g, const kve_head *h)
{
    return (size_t)((const int32_t *)h->col[KVE_COL_POS] - (const int32_t *)g->base[KVE_COL_POS]);
}

/* c_j after a re-layout into C slots: n_j + 1 and an even share of the rest. */
static size_t new_cap(const kve_head *h, size_t j, size_t share, size_t left)
{
    return h->size + 1 + left / share + (j < left % share);
}

/* Moves head h's columns to slot `to` of dst (memmove: dst may overlap its
 * current slots) and points it there. The marks are all zero between calls,
 * so they are not copied: the caller zeroes dst's marks when dst is new. */
static void move_head(const kve_config *c, kve_head *h, void *const dst[KVE_NCOLS], size_t to)
{
    for (int k = 0; k < KVE_NCOLS; k++) {
        size_t e = c->elem[k];
        if (!e)
            continue;
        char *at = (char *)dst[k] + to * e;
        if (k != KVE_COL_MARK)
            memmove(at, h->col[k], h->size * e);
        h->col[k] = at;
    }
}

/* Lays group g out anew in dst (C slots per column): see the top of the file. */
static void relayout(kve_bank *b, size_t gi, void *const dst[KVE_NCOLS], size_t C)
{
    const kve_config *c = &b->cfg;
    kve_group *g = &b->groups[gi];
    kve_head *hs = group_heads(b, gi);
    const size_t G = b->share;
    size_t need = 0;
    for (size_t j = 0; j < G; j++) {
        kve__close_gap(c, &hs[j]);
        need += hs[j].size + 1;
    }
    const size_t left = C - need;
    size_t to = 0;
    for (size_t j = 0; j < G; j++) { /* left-movers, in head order */
        size_t from = offset_in(g, &hs[j]);
        if (dst != g->base || to <= from)
            move_head(c, &hs[j], dst, to);
        to += new_cap(&hs[j], j, G, left);
    }
    for (size_t j = G; j-- > 0;) { /* right-movers, in reverse order */
        size_t cap = new_cap(&hs[j], j, G, left);
        to -= cap;
        if (dst == g->base && to > offset_in(g, &hs[j]))
            move_head(c, &hs[j], dst, to);
        hs[j].cap = cap;
    }
}

kve_status kve__groups_prepare(kve_bank *b, size_t g0, size_t n)
{
    const kve_config *c = &b->cfg;
    for (size_t gi = g0; gi < g0 + n; gi++) {
        kve_group *g = &b->groups[gi];
        const kve_head *hs = group_heads(b, gi);
        size_t need = 0;
        bool full = false;
        for (size_t j = 0; j < b->share; j++) {
            need += hs[j].size + 1;
            full = full || hs[j].size >= hs[j].cap;
        }
        g->relayout = full && need <= g->cap;
        if (!full || g->relayout)
            continue;
        size_t cap = 2 * g->cap > need ? 2 * g->cap : need;
        if (g->cap > SIZE_MAX / KVE_BLOCK_ALIGN / 2 ||
            (g->spare = kve__alloc(&b->alloc, kve__block_bytes(c, cap))) == NULL) {
            for (size_t k = g0; k < gi; k++) {
                kve_group *f = &b->groups[k];
                if (f->spare)
                    kve__dealloc(&b->alloc, f->spare, kve__block_bytes(c, f->spare_cap));
                f->spare = NULL;
                f->relayout = false;
            }
            g->relayout = false;
            return kve__head_fail(b, KVE_ENOMEM, gi * b->share,
                                  "out of memory for a group of %zu heads holding %zu slots",
                                  b->share, cap);
        }
        g->spare_cap = cap;
    }
    return KVE_OK;
}

void kve__groups_commit(kve_bank *b, size_t g0, size_t n)
{
    const kve_config *c = &b->cfg;
    for (size_t gi = g0; gi < g0 + n; gi++) {
        kve_group *g = &b->groups[gi];
        if (g->relayout) {
            relayout(b, gi, g->base, g->cap);
            g->relayout = false;
        }
        if (!g->spare)
            continue;
        size_t cap = g->spare_cap, off[KVE_NCOLS];
        kve__block_layout(c, cap, off);
        void *dst[KVE_NCOLS];
        for (int k = 0; k < KVE_NCOLS; k++)
            dst[k] = c->elem[k] ? (char *)g->spare + off[k] : NULL;
        relayout(b, gi, dst, cap);
        if (c->elem[KVE_COL_MARK])
            memset(dst[KVE_COL_MARK], 0, cap * c->elem[KVE_COL_MARK]);
        if (g->block)
            kve__dealloc(&b->alloc, g->block, kve__block_bytes(c, g->cap));
        else
            kve__bank_leave_slabs(b, b->share);
        g->block = g->spare;
        g->spare = NULL;
        g->cap = cap;
        memcpy(g->base, dst, sizeof dst);
    }
}

/* ---- placement without moving (copy, load, reset) ---- */

/* Head j of group gi gets like[j].cap slots, or (like NULL) its size + 1
 * and its share of the `left` slots over that; the last head also what
 * remains. */
static void place(kve_bank *b, size_t gi, const kve_head *like, size_t left)
{
    const kve_config *c = &b->cfg;
    kve_group *g = &b->groups[gi];
    kve_head *hs = group_heads(b, gi);
    size_t to = 0;
    for (size_t j = 0; j < b->share; j++) {
        for (int k = 0; k < KVE_NCOLS; k++)
            hs[j].col[k] = c->elem[k] ? (char *)g->base[k] + to * c->elem[k] : NULL;
        hs[j].cap = j + 1 == b->share ? g->cap - to
                    : like             ? like[j].cap
                                       : new_cap(&hs[j], j, b->share, left);
        to += hs[j].cap;
    }
}

void kve__group_place(kve_bank *b, size_t gi, const kve_head *like)
{
    place(b, gi, like, 0);
}

void kve__group_even(kve_bank *b, size_t gi)
{
    const kve_head *hs = group_heads(b, gi);
    size_t need = 0;
    for (size_t j = 0; j < b->share; j++)
        need += hs[j].size + 1;
    place(b, gi, NULL, b->groups[gi].cap - need);
}

void kve__group_adopt(kve_bank *b, size_t gi, void *block, size_t cap)
{
    const kve_config *c = &b->cfg;
    kve_group *g = &b->groups[gi];
    size_t off[KVE_NCOLS];
    kve__block_layout(c, cap, off);
    for (int k = 0; k < KVE_NCOLS; k++)
        g->base[k] = c->elem[k] ? (char *)block + off[k] : NULL;
    if (c->elem[KVE_COL_MARK])
        memset(g->base[KVE_COL_MARK], 0, cap * c->elem[KVE_COL_MARK]);
    if (g->block)
        kve__dealloc(&b->alloc, g->block, kve__block_bytes(c, g->cap));
    else
        kve__bank_leave_slabs(b, b->share);
    g->block = block;
    g->cap = cap;
}

/* ---- the shared eviction ---- */

/* The lowest index of the lowest unmarked score among h's first `limit`
 * slots, KVE_NONE if none. */
static size_t unmarked_argmin(const kve_head *h, size_t limit)
{
    const double *score = h->col[KVE_COL_SCORE];
    const uint8_t *mark = h->col[KVE_COL_MARK];
    size_t best = KVE_NONE;
    for (size_t i = 0; i < limit; i++)
        if (!mark[i] && (best == KVE_NONE || score[i] < score[best]))
            best = i;
    return best;
}

/* Marks the victims of one group (heads hs[0 .. G)) evicted to `budget`,
 * recording per head how many (picked), the first (pick_first) and its
 * current minimum (pick_cur, KVE_NONE once the head may lose no more). */
static void select_group(const kve_config *c, kve_head *hs, size_t G, size_t budget,
                         double min_share)
{
    size_t total = 0, rw = c->params.recent_window;
    for (size_t j = 0; j < G; j++) {
        hs[j].picked = 0;
        hs[j].pick_first = KVE_NONE;
        total += hs[j].size;
    }
    if (total <= budget)
        return;
    size_t floor = (size_t)(min_share * (double)budget / (double)G);
    floor = floor > rw ? floor : rw;
    for (size_t j = 0; j < G; j++) {
        kve_head *h = &hs[j];
        kve__close_gap(c, h);
        h->pick_cur = h->size <= floor      ? KVE_NONE
                      : h->best != KVE_NONE ? h->best
                                            : unmarked_argmin(h, h->size - rw);
    }
    for (size_t k = total - budget; k > 0; k--) {
        kve_head *h = NULL;
        double low = 0.0;
        for (size_t j = 0; j < G; j++) { /* ties: the lower head stays chosen */
            if (hs[j].pick_cur == KVE_NONE)
                continue;
            double s = ((const double *)hs[j].col[KVE_COL_SCORE])[hs[j].pick_cur];
            if (!h || s < low) {
                h = &hs[j];
                low = s;
            }
        }
        if (!h)
            return; /* unreachable: G * floor <= budget (see the top) */
        ((uint8_t *)h->col[KVE_COL_MARK])[h->pick_cur] = 1;
        if (h->pick_cur < h->pick_first)
            h->pick_first = h->pick_cur;
        h->picked++;
        h->pick_cur = h->size - h->picked <= floor ? KVE_NONE : unmarked_argmin(h, h->size - rw);
    }
}

static void clear_marks(kve_head *h)
{
    if (h->picked)
        memset((uint8_t *)h->col[KVE_COL_MARK] + h->pick_first, 0, h->size - h->pick_first);
    h->picked = 0;
}

kve_status kve__bank_evict_shared(kve_bank *b, size_t first, size_t count, size_t budget,
                                  int32_t *victims, size_t ld_victims, size_t *counts)
{
    const kve_config *c = &b->cfg;
    const char *name = c->type->name;
    if (!b->share)
        return kve__fail(KVE_EINVAL,
                         "%s: the bank has no shared groups (build it with kve_bank_new_ex and "
                         "a share)",
                         name);
    size_t rw = c->params.recent_window;
    if (budget == 0 || budget <= b->share * rw)
        return kve__fail(KVE_EINVAL,
                         "%s: budget %zu must be greater than %zu, the recent windows of a "
                         "group of %zu heads",
                         name, budget, b->share * rw, b->share);
    if (!victims && ld_victims)
        return kve__fail(KVE_EINVAL, "%s: victims is NULL but ld_victims is %zu", name,
                         ld_victims);
    /* Plan every group (marks), then check that the victims fit, then apply. */
    for (size_t g = first / b->share; g < (first + count) / b->share; g++)
        select_group(c, group_heads(b, g), b->share, budget, b->min_share);
    for (size_t j = 0; j < count; j++) {
        const kve_head *h = &b->heads[first + j];
        if (h->picked > ld_victims) {
            for (size_t k = 0; k < count; k++)
                clear_marks(&b->heads[first + k]);
            return kve__head_fail(b, KVE_ERANGE, first + j, "%zu victims to report but "
                                  "ld_victims is %zu", h->picked, ld_victims);
        }
    }
    for (size_t j = 0; j < count; j++) {
        kve_head *h = &b->heads[first + j];
        int32_t *out = victims + j * ld_victims;
        size_t nv = h->picked;
        if (nv == 1) {
            ((uint8_t *)h->col[KVE_COL_MARK])[h->pick_first] = 0;
            kve__evict_one(h, h->pick_first, out);
        } else if (nv > 1) {
            kve__compact_marked(c, h, h->pick_first, out);
            h->best = KVE_NONE;
        }
        h->picked = 0;
        if (counts)
            counts[j] = nv;
    }
    return KVE_OK;
}
