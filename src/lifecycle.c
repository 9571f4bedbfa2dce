/* SPDX-License-Identifier: MIT */
/*
 * lifecycle.c - what an engine does to a sequence besides appending to it:
 * fork it (clone, copy), rewind or cut it (remove), reuse its slot (reset).
 * Saving and loading are image.c's.
 *
 * A head's state is what its rule reads: the kept positions, the columns in
 * kept order (read through the lazy gap of policy_impl.h; the scratch
 * columns, KVE_COL_SCRATCH and after, are never read across calls and are
 * not state), the step counter, the private generator and its seed, the
 * last position, the victim cached by a step (set only while the gap is
 * closed, so it indexes the dense columns), and the policy's per-head aux
 * (plain bytes: expected_attention's counters, statistics and query ring;
 * keydiff's sum, which every step recomputes, goes along at no harm). Where a head's slots are (the slabs, a private block,
 * its part of a group, the sliding offset) and how many it has is storage:
 * any layout that holds the state gives the same victims and scores.
 *
 * Invariants:
 *  - copy and clone write dst's heads dense (no gap, offset 0) and take
 *    src's cached victim, so dst's next evict takes the path src's would;
 *  - copy allocates only for a head of dst with fewer slots than src's head
 *    holds positions, or a group of dst with fewer slots than src's group,
 *    all those blocks before anything changes; remove and reset never
 *    allocate;
 *  - remove leaves the columns dense and sets the last position to the
 *    largest one kept (nothing admitted, when none is);
 *  - reset leaves every block where it is, a group's heads evenly placed in
 *    their storage, and each generator at its seed.
 * Cost: copy O(slots of src) (memcpy of each column), remove O(kept) a head,
 * reset O(1) a head.
 */
#include "policy_impl.h"

#include <string.h>

/* ---- copy ---- */

/* Writes head s's columns, dense, into d's storage (at least s->size slots
 * from its base) and takes s's scalar state. */
static void copy_head(const kve_config *c, kve_head *d, const kve_head *s)
{
    if (d->offset) { /* the sliding layout: back to the start of its slots */
        d->col[KVE_COL_POS] = (int32_t *)d->col[KVE_COL_POS] - d->offset;
        d->offset = 0;
    }
    const size_t n = s->size, g = s->gap < n ? s->gap : n;
    for (int k = 0; k < KVE_COL_SCRATCH; k++) {
        size_t e = c->elem[k];
        if (!e || k == KVE_COL_MARK)
            continue;
        char *to = d->col[k];
        const char *from = s->col[k];
        if (!KVE_COL_LAZY(k) || g == n) {
            memcpy(to, from, n * e);
        } else { /* a lazy column: slot i is at i + (i >= gap) */
            memcpy(to, from, g * e);
            memcpy(to + g * e, from + (g + 1) * e, (n - g) * e);
        }
    }
    d->size = n;
    d->gap = KVE_NONE;
    d->best = s->best;
    d->observed = s->observed;
    d->rng = s->rng;
    d->seed = s->seed;
    d->last_pos = s->last_pos;
    d->any_pos = s->any_pos;
    d->picked = 0;
    if (c->aux_bytes)
        memcpy(d->aux, s->aux, c->aux_bytes);
}

/* Frees every spare block reserve() made (a head's is of src's head's
 * slots, a group's of spare_cap) and returns st. */
static kve_status drop_spares(kve_bank *dst, const kve_bank *src, kve_status st)
{
    const kve_config *c = &dst->cfg;
    for (size_t gi = 0; dst->share && gi < dst->n_heads / dst->share; gi++) {
        kve_group *g = &dst->groups[gi];
        kve__dealloc(&dst->alloc, g->spare, g->spare ? kve__block_bytes(c, g->spare_cap) : 0);
        g->spare = NULL;
    }
    for (size_t h = 0; h < dst->n_heads; h++) {
        kve_head *d = &dst->heads[h];
        kve__dealloc(&dst->alloc, d->spare,
                     d->spare ? kve__block_bytes(c, src->heads[h].cap) : 0);
        d->spare = NULL;
    }
    return st;
}

/* The blocks dst needs to take src's state: for each group of dst with
 * fewer slots than src's (a block of src's group's slots), or each head
 * with fewer slots than src's head has positions (a block of src's head's
 * slots), into its spare; all or nothing. */
static kve_status reserve(kve_bank *dst, const kve_bank *src)
{
    size_t n_groups = dst->share ? dst->n_heads / dst->share : 0;
    kve_status st = KVE_OK;
    for (size_t gi = 0; st == KVE_OK && gi < n_groups; gi++) {
        kve_group *g = &dst->groups[gi];
        g->spare_cap = src->groups[gi].cap;
        if (g->cap < g->spare_cap)
            st = kve__block_alloc(dst, g->spare_cap, &g->spare);
    }
    for (size_t h = 0; st == KVE_OK && !n_groups && h < dst->n_heads; h++)
        if (dst->heads[h].cap < src->heads[h].size)
            st = kve__block_alloc(dst, src->heads[h].cap, &dst->heads[h].spare);
    return st == KVE_OK ? st : drop_spares(dst, src, st);
}

kve_status kve__bank_copy_state(kve_bank *dst, const kve_bank *src)
{
    if (dst == src)
        return KVE_OK;
    kve_status st = reserve(dst, src);
    if (st != KVE_OK)
        return st;
    /* Nothing fails from here. A group takes src's layout: each head as many
     * slots as its twin in src (the last one the rest), which hold its
     * positions. */
    for (size_t gi = 0; dst->share && gi < dst->n_heads / dst->share; gi++) {
        kve_group *g = &dst->groups[gi];
        if (g->spare) {
            kve__group_adopt(dst, gi, g->spare, g->spare_cap);
            g->spare = NULL;
        }
        kve__group_place(dst, gi, &src->heads[gi * dst->share]);
    }
    for (size_t h = 0; h < dst->n_heads; h++) {
        kve_head *d = &dst->heads[h];
        if (d->spare) {
            kve__head_adopt(dst, d, d->spare, src->heads[h].cap, false);
            d->spare = NULL;
        }
        copy_head(&dst->cfg, d, &src->heads[h]);
    }
    return KVE_OK;
}

/* Whether two ropes scale alike (their zeros read as the defaults). */
static bool same_rope_scaling(const kve_rope *x, const kve_rope *y)
{
    const kve_rope a = kve__rope_effective(x), b = kve__rope_effective(y);
    return a.scaling == b.scaling && a.original_max_position == b.original_max_position &&
           kve__same_bits(a.factor, b.factor) &&
           kve__same_bits(a.low_freq_factor, b.low_freq_factor) &&
           kve__same_bits(a.high_freq_factor, b.high_freq_factor) &&
           kve__same_bits(a.beta_fast, b.beta_fast) && kve__same_bits(a.beta_slow, b.beta_slow) &&
           kve__same_bits(a.attention_factor, b.attention_factor);
}

/* KVE_OK when dst may take src's state: the same canonical spec, key
 * dimension, heads and sharing. */
static kve_status check_same(const kve_bank *dst, const kve_bank *src)
{
    const char *name = dst->cfg.type->name;
    if (strcmp(dst->cfg.spec, src->cfg.spec) != 0)
        return kve__fail(KVE_EINVAL, "%s: cannot copy: dst's spec is \"%s\", src's \"%s\"", name,
                         dst->cfg.spec, src->cfg.spec);
    const kve_config *a = &dst->cfg, *b = &src->cfg;
    if (a->key_dim != b->key_dim)
        return kve__fail(KVE_EINVAL, "%s: cannot copy: dst's key_dim is %zu, src's %zu", name,
                         a->key_dim, b->key_dim);
    if (a->value_dim != b->value_dim)
        return kve__fail(KVE_EINVAL, "%s: cannot copy: dst's value_dim is %zu, src's %zu", name,
                         a->value_dim, b->value_dim);
    if (a->query_group != b->query_group)
        return kve__fail(KVE_EINVAL, "%s: cannot copy: dst's query_group is %zu, src's %zu",
                         name, a->query_group, b->query_group);
    if (a->rope.rotary_dim != b->rope.rotary_dim || a->rope.pairs != b->rope.pairs ||
        !kve__same_bits(a->rope.base, b->rope.base))
        return kve__fail(KVE_EINVAL,
                         "%s: cannot copy: dst's rope (rotary_dim %zu, base %g, pairs %d) is not "
                         "src's (rotary_dim %zu, base %g, pairs %d)",
                         name, a->rope.rotary_dim, a->rope.base, (int)a->rope.pairs,
                         b->rope.rotary_dim, b->rope.base, (int)b->rope.pairs);
    const kve_rope ra = kve__rope_effective(&a->rope), rb = kve__rope_effective(&b->rope);
    if (a->rope_nff != b->rope_nff ||
        memcmp(a->rope_ff, b->rope_ff, a->rope_nff * sizeof(float)) != 0)
        return kve__fail(KVE_EINVAL, "%s: cannot copy: dst's rope freq_factors (%zu) are not "
                         "src's (%zu)", name, a->rope_nff, b->rope_nff);
    if (!same_rope_scaling(&a->rope, &b->rope))
        return kve__fail(KVE_EINVAL,
                         "%s: cannot copy: dst's rope scaling (scaling %d, factor %g, "
                         "attention_factor %g) is not src's (scaling %d, factor %g, "
                         "attention_factor %g; or another scaling field differs)",
                         name, (int)ra.scaling, ra.factor, ra.attention_factor, (int)rb.scaling,
                         rb.factor, rb.attention_factor);
    if (dst->n_heads != src->n_heads)
        return kve__fail(KVE_EINVAL, "%s: cannot copy: dst has %zu heads, src %zu", name,
                         dst->n_heads, src->n_heads);
    if (dst->share != src->share)
        return kve__fail(KVE_EINVAL, "%s: cannot copy: dst's share is %zu, src's %zu", name,
                         dst->share, src->share);
    if (dst->same_positions != src->same_positions)
        return kve__fail(KVE_EINVAL, "%s: cannot copy: dst's same_positions is %d, src's %d",
                         name, (int)dst->same_positions, (int)src->same_positions);
    if (dst->share && dst->min_share != src->min_share) /* without shared heads it does nothing */
        return kve__fail(KVE_EINVAL, "%s: cannot copy: dst's min_share is %g, src's %g", name,
                         dst->min_share, src->min_share);
    return KVE_OK;
}

kve_status kve_bank_copy(kve_bank *dst, const kve_bank *src)
{
    if (!dst || !src)
        return kve__fail(KVE_EINVAL, "%s is NULL", dst ? "src" : "dst");
    kve_frame fs, f; /* src read while dst's allocator runs: both refuse calls */
    kve_status st = dst == src ? kve__check_idle(src, "a copy from it")
                               : kve__enter_source(&fs, src, "a copy from it");
    if (st != KVE_OK)
        return st;
    if ((st = kve__enter(&f, dst, "a copy into it")) == KVE_OK) {
        st = check_same(dst, src);
        if (st == KVE_OK)
            st = kve__bank_copy_state(dst, src);
        kve__leave(&f);
    }
    if (dst != src)
        kve__leave(&fs);
    return st;
}

kve_status kve_policy_copy(kve_policy *dst, const kve_policy *src)
{
    return kve_bank_copy(dst ? &dst->bank : NULL, src ? &src->bank : NULL);
}

/* ---- clone ---- */

kve_status kve_bank_clone(const kve_bank *b, kve_bank **out)
{
    if (!b || !out)
        return kve__fail(KVE_EINVAL, "%s is NULL", b ? "out" : "bank");
    kve_bank_options o = kve_bank_default_options();
    o.share = b->share;
    o.min_share = b->min_share;
    o.same_positions = b->same_positions;
    kve_rng unused; /* the generators are src's, copied below */
    kve_rng_seed(&unused, 0);
    kve_bank *c = NULL;
    kve_frame f; /* b's allocator runs */
    kve_status st = kve__enter(&f, b, "a clone");
    if (st != KVE_OK)
        return st;
    kve__type_hold(b->cfg.type); /* the clone's own; create releases it on failure */
    st = kve__bank_create(&b->cfg, b->n_heads, &unused, &o, &b->alloc, &c);
    if (st == KVE_OK) {
        kve_frame fc; /* and the clone's, half built */
        kve__enter_new(&fc, c, c->cfg.type->name, false);
        st = kve__bank_copy_state(c, b);
        kve__leave(&fc);
        if (st != KVE_OK)
            kve_bank_free(c);
    }
    kve__leave(&f);
    if (st == KVE_OK)
        *out = c;
    return st;
}

kve_status kve_policy_clone(const kve_policy *p, kve_policy **out)
{
    if (!p || !out)
        return kve__fail(KVE_EINVAL, "%s is NULL", p ? "out" : "policy");
    kve_rng unused;
    kve_rng_seed(&unused, 0);
    kve_policy *c = NULL;
    kve_frame f;
    kve_status st = kve__enter(&f, &p->bank, "a clone");
    if (st != KVE_OK)
        return st;
    kve__type_hold(p->bank.cfg.type);
    st = kve__policy_create(&p->bank.cfg, &unused, &p->bank.alloc, &c);
    if (st == KVE_OK) {
        kve_frame fc; /* and the clone's, half built */
        kve__enter_new(&fc, &c->bank, c->bank.cfg.type->name, true);
        st = kve__bank_copy_state(&c->bank, &p->bank);
        kve__leave(&fc);
        if (st != KVE_OK)
            kve_policy_free(c);
    }
    kve__leave(&f);
    if (st == KVE_OK)
        *out = c;
    return st;
}

/* ---- remove ---- */

/* The first index of pos[0 .. n) (ascending) holding a position >= p. */
static size_t lower_bound(const int32_t *pos, size_t n, int32_t p)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pos[mid] < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Removes h's kept positions in [p0, p1) (p1 KVE_POS_END: to the end);
 * returns how many went. */
static size_t head_remove(const kve_config *c, kve_head *h, int32_t p0, int32_t p1)
{
    const int32_t *pos = h->col[KVE_COL_POS];
    const size_t n = h->size;
    size_t i0 = lower_bound(pos, n, p0), i1 = p1 == KVE_POS_END ? n : lower_bound(pos, n, p1);
    if (i1 > i0) {
        kve__close_gap(c, h);
        for (int k = 0; k < KVE_COL_SCRATCH; k++) {
            size_t e = c->elem[k];
            if (e && k != KVE_COL_MARK) {
                char *base = h->col[k];
                memmove(base + i0 * e, base + i1 * e, (n - i1) * e);
            }
        }
        h->size = n - (i1 - i0);
        h->best = KVE_NONE;
    }
    h->any_pos = h->size > 0;
    h->last_pos = h->size ? pos[h->size - 1] : 0;
    return i1 - i0;
}

static kve_status check_remove(const kve_bank *b, int32_t p0, int32_t p1)
{
    kve_status st = kve__check_idle(b, "a remove");
    if (st != KVE_OK)
        return st;
    if (p0 >= p1)
        return kve__fail(KVE_EINVAL,
                         "%s: remove [%ld, %ld): p0 must be below p1 (KVE_POS_END removes to "
                         "the end)",
                         b->cfg.type->name, (long)p0, (long)p1);
    return KVE_OK;
}

kve_status kve_policy_remove(kve_policy *p, int32_t p0, int32_t p1, size_t *n_removed)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    kve_status st = check_remove(&p->bank, p0, p1);
    if (st != KVE_OK)
        return st;
    size_t n = head_remove(&p->bank.cfg, &p->head, p0, p1);
    if (n_removed)
        *n_removed = n;
    return KVE_OK;
}

kve_status kve_bank_remove(kve_bank *b, int32_t p0, int32_t p1)
{
    if (!b)
        return kve__fail(KVE_EINVAL, "bank is NULL");
    kve_status st = check_remove(b, p0, p1);
    if (st != KVE_OK)
        return st;
    for (size_t h = 0; h < b->n_heads; h++)
        (void)head_remove(&b->cfg, &b->heads[h], p0, p1);
    return KVE_OK;
}

/* ---- reset ---- */

static void head_reset(const kve_config *c, kve_head *h)
{
    if (h->offset) {
        h->col[KVE_COL_POS] = (int32_t *)h->col[KVE_COL_POS] - h->offset;
        h->offset = 0;
    }
    h->size = 0;
    h->gap = h->best = KVE_NONE;
    h->observed = 0;
    h->last_pos = 0;
    h->any_pos = false;
    h->picked = 0;
    if (c->type->flags & KVE_TYPE_NEEDS_RNG)
        kve_rng_seed(&h->rng, h->seed);
    if (c->aux_bytes) /* as constructed: zero */
        memset(h->aux, 0, c->aux_bytes);
}

void kve_bank_reset(kve_bank *b)
{
    if (!b || kve__check_idle(b, "a reset") != KVE_OK)
        return; /* from its own callback: left as it is (kvevict.h) */
    for (size_t h = 0; h < b->n_heads; h++)
        head_reset(&b->cfg, &b->heads[h]);
    for (size_t gi = 0; b->share && gi < b->n_heads / b->share; gi++)
        kve__group_even(b, gi);
}

void kve_policy_reset(kve_policy *p)
{
    kve_bank_reset(p ? &p->bank : NULL);
}
