/* SPDX-License-Identifier: MIT */
/*
 * scored.c - the eviction mechanism of every policy that chooses victims one
 * by one: the one-victim fast path of the steady state, the marked path for
 * several victims (select marks them, one compaction removes them), and the
 * lazy gap of policy_impl.h.
 *
 * Invariants:
 *  - Only slots [0, size - recent_window) can be chosen: the newest
 *    recent_window kept positions are protected.
 *  - Argmin ties go to the lower index, which is the lower position: a scan
 *    in kept order takes only a strictly smaller score (kernels.h).
 *  - Compaction walks kept order, so victims come out ascending and the kept
 *    positions stay ascending; it clears every mark it meets.
 * Cost of one victim (the steady state): the argmin was computed by the
 * step's pass (observe, or kve__scored_scan for a NULL step), so evict is
 * one memmove of the positions after the victim; the hole in the lazy
 * columns is closed by the next step's pass for free. Without a cached
 * argmin (a second evict), one scan of the scores that also closes the hole.
 * Several victims: n_evict scans of the unprotected slots and one compaction
 * of every column. A same_positions bank (bank.c) ranks slots by their
 * combined score, the sum over its heads (kve__combined_argmin: one pass
 * over the heads' score columns), with the same ties and protection.
 */
#include "policy_impl.h"

#include <math.h>
#include <string.h>

kve_status kve__check_recent_window(kve_config *c)
{
    if (c->params.recent_window >= c->params.budget)
        return kve__fail(KVE_EINVAL, "%s: recent_window %zu must be smaller than budget %zu",
                         c->type->name, c->params.recent_window, c->params.budget);
    return KVE_OK;
}

void kve__close_gap(const kve_config *c, kve_head *h)
{
    size_t g = h->gap;
    if (g == KVE_NONE)
        return;
    for (int k = 0; k < KVE_NCOLS; k++) {
        size_t e = c->elem[k];
        if (e && KVE_COL_LAZY(k)) {
            char *base = h->col[k];
            memmove(base + g * e, base + (g + 1) * e, (h->size - g) * e);
        }
    }
    h->gap = KVE_NONE;
}

size_t kve__align_gap(const kve_config *c, kve_head *h, size_t w)
{
    size_t g = h->gap, n = h->size;
    if (g == KVE_NONE)
        return n;
    size_t to = (g + w - 1) / w * w;
    if (to >= n) {
        kve__close_gap(c, h);
        return n;
    }
    for (int k = 0; k < KVE_NCOLS; k++) {
        size_t e = c->elem[k];
        if (e && KVE_COL_LAZY(k)) {
            char *base = h->col[k];
            memmove(base + g * e, base + (g + 1) * e, (to - g) * e);
        }
    }
    h->gap = to;
    return to;
}

size_t kve__scored_scan(const kve_config *c, kve_head *h, size_t limit)
{
    size_t n = h->size, g = h->gap < n ? h->gap : n;
    for (int k = 0; k < KVE_NCOLS && g < n; k++) {
        size_t e = c->elem[k];
        if (e && KVE_COL_LAZY(k) && k != KVE_COL_SCORE) {
            char *base = h->col[k];
            memmove(base + g * e, base + (g + 1) * e, (n - g) * e);
        }
    }
    h->gap = KVE_NONE;
    return kve__shift_argmin(h->col[KVE_COL_SCORE], n, g, limit);
}

size_t kve__combined_argmin(const kve_head *heads, size_t nh, size_t limit, const uint8_t *mark)
{
    enum { BLOCK = 256 }; /* slots summed at once: each head's column read in runs */
    double sum[BLOCK];
    size_t best = KVE_NONE;
    double best_score = 0.0;
    for (size_t i0 = 0; i0 < limit; i0 += BLOCK) {
        size_t m = limit - i0;
        if (m > BLOCK)
            m = BLOCK;
        memcpy(sum, (const double *)heads[0].col[KVE_COL_SCORE] + i0, m * sizeof *sum);
        for (size_t h = 1; h < nh; h++) {
            const double *s = (const double *)heads[h].col[KVE_COL_SCORE] + i0;
            for (size_t k = 0; k < m; k++)
                sum[k] += s[k];
        }
        for (size_t k = 0; k < m; k++)
            if ((!mark || !mark[i0 + k]) && (best == KVE_NONE || sum[k] < best_score)) {
                best = i0 + k;
                best_score = sum[k];
            }
    }
    return best;
}

size_t kve__mark_argmin(const kve_config *c, kve_head *h, const kve_head *heads, size_t nh,
                        size_t n_evict)
{
    uint8_t *mark = h->col[KVE_COL_MARK];
    size_t limit = h->size - c->params.recent_window;
    size_t first = limit;
    for (size_t k = 0; k < n_evict; k++) {
        size_t best = kve__combined_argmin(heads, nh, limit, mark);
        mark[best] = 1;
        if (best < first)
            first = best;
    }
    return first;
}

size_t kve__select_argmin(const kve_config *c, kve_head *h, size_t n_evict)
{
    return kve__mark_argmin(c, h, h, 1, n_evict);
}

/* Moves `count` slots from index `src` to index `dst` (dst < src) in every
 * column but the marks. */
static void move_slots(const kve_config *c, kve_head *h, size_t dst, size_t src, size_t count)
{
    for (int k = 0; k < KVE_NCOLS; k++) {
        size_t e = c->elem[k];
        if (e && k != KVE_COL_MARK) {
            char *base = h->col[k];
            memmove(base + dst * e, base + src * e, count * e);
        }
    }
}

size_t kve__compact_marked(const kve_config *c, kve_head *h, size_t first, int32_t *victims)
{
    uint8_t *mark = h->col[KVE_COL_MARK];
    const int32_t *pos = h->col[KVE_COL_POS];
    size_t n = h->size, nv = 0;
    size_t w = first, r = first; /* write and read indexes */
    while (r < n) {
        if (mark[r]) {
            victims[nv++] = pos[r];
            mark[r] = 0;
            r++;
            continue;
        }
        size_t end = r;
        while (end < n && !mark[end])
            end++;
        move_slots(c, h, w, r, end - r);
        w += end - r;
        r = end;
    }
    h->size = w;
    return nv;
}

size_t kve__evict_marked(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims)
{
    kve__close_gap(c, h);
    h->best = KVE_NONE;
    return kve__compact_marked(c, h, c->type->select(c, h, n_evict), victims);
}

void kve__evict_one(kve_head *h, size_t v, int32_t *victims)
{
    int32_t *pos = h->col[KVE_COL_POS];
    size_t n = h->size;
    victims[0] = pos[v];
    memmove(pos + v, pos + v + 1, (n - v - 1) * sizeof *pos);
    h->size = n - 1;
    h->gap = v + 1 < n ? v : KVE_NONE; /* the last slot needs no closing */
    h->best = KVE_NONE;
}

size_t kve__evict_scored(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims)
{
    if (n_evict != 1)
        return kve__evict_marked(c, h, n_evict, victims);
    /* A cached victim comes from a step's pass, which closed the gap. */
    size_t v = h->best;
    if (v == KVE_NONE)
        v = kve__scored_scan(c, h, h->size - c->params.recent_window);
    kve__evict_one(h, v, victims);
    return 1;
}

/* ---- vnorm=2: CriticalKV (kvpress's CriticalKVPress) ----
 *
 * The columns are vnorm=1's (raw: the rule's own score; vnorm: the kept
 * norm; score = raw * vnorm, which pages of no kind and no other path of
 * this mode read for a decision), with the norm the mean over the query
 * heads of ||W_o,g v||_1. Only the eviction differs: two stages, below. */
double kve__value_norm(const kve_config *c, const float *v)
{
    if (c->params.vnorm != 2)
        return kve__key_norm(v, c->value_dim);
    const size_t G = c->query_group ? c->query_group : 1, part = c->value_dim / G;
    double mean = 0.0;
    for (size_t g = 0; g < G; g++) {
        double l1 = 0.0;
        for (size_t i = 0; i < part; i++)
            l1 += fabs((double)v[g * part + i]);
        mean += l1;
    }
    return mean / (double)G;
}

size_t kve__evict_critical(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims)
{
    kve__close_gap(c, h);
    h->best = KVE_NONE;
    const size_t n = h->size, rw = c->params.recent_window, limit = n - rw;
    const size_t target = n - n_evict;
    const double *raw = h->col[KVE_COL_RAW], *norm = h->col[KVE_COL_VNORM];
    uint8_t *mark = h->col[KVE_COL_MARK];
    const double eps = c->params.epsilon;
    /* stage one: floor(first_stage * B) of the budget by the rule's score,
     * the protected newest counted in it (they rank first, as kvpress's
     * window scored at the maximum) */
    size_t s1 = (size_t)(c->params.first_stage * (double)target);
    s1 = s1 > rw ? s1 - rw : 0;
    if (s1 > c->params.budget)
        s1 = c->params.budget;
    kve__top_entry *heap = h->aux;
    size_t k = kve__top_k(raw, limit, s1, heap);
    for (size_t j = 0; j < k; j++)
        mark[heap[j].pos] = 2;
    /* stage two: the victims, the lowest (raw + epsilon) * vnorm of the rest */
    size_t first = limit;
    for (size_t v = 0; v < n_evict; v++) {
        size_t best = KVE_NONE;
        double best_score = 0.0;
        for (size_t i = 0; i < limit; i++) {
            if (mark[i])
                continue;
            double s = (raw[i] + eps) * norm[i];
            if (best == KVE_NONE || s < best_score) {
                best = i;
                best_score = s;
            }
        }
        mark[best] = 1;
        first = best < first ? best : first;
    }
    for (size_t j = 0; j < k; j++)
        mark[heap[j].pos] = 0;
    return kve__compact_marked(c, h, first, victims);
}
