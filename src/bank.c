/* SPDX-License-Identifier: MIT */
/*
 * bank.c - banks of heads: construction, storage, and the step and evict
 * that both the bank API and the policy API (a bank of one head) run.
 *
 * Every entry point validates everything it is given, for every head of its
 * range, before it changes anything: positions, buffer sizes, every weight of
 * every row (but in a bank or policy built unchecked, which trusts the
 * weights: kvevict.h, "Unchecked steps"), then the allocations a growth needs
 * (made for every head first, committed only once all succeeded). So a refused call leaves every head
 * exactly as it was, and a head's state is only ever touched by calls whose
 * range contains it: disjoint ranges may run in different threads.
 *
 * Memory: construction makes one allocation for the handle and its heads,
 * one slab per column (policy_impl.h) and, for a policy with per-head
 * scratch (keydiff), one slab of it. Growth (a head stepped past S0 without
 * evicting) doubles that head's slots into a private block, one allocation.
 * Nothing else allocates.
 */
#include "policy_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>


/* ---- the re-entry guard (policy_impl.h) ---- */

static _Thread_local const kve_frame *running;

kve_status kve__check_idle(const kve_bank *b, const char *call)
{
    for (const kve_frame *f = running; f; f = f->up)
        if (f->bank == b && f->source)
            return kve__fail(KVE_EINVAL,
                             "%s: %s called from inside a callback of a copy from this %s (the "
                             "destination's allocator): a copy's source refuses every call "
                             "while the copy runs",
                             f->name, call, f->policy ? "policy" : "bank");
        else if (f->bank == b)
            return kve__fail(KVE_EINVAL,
                             "%s: %s called from inside one of this %s's own callbacks (its "
                             "score rule or allocator): an object refuses every call while "
                             "its callbacks run",
                             f->name, call, f->policy ? "policy" : "bank");
    return KVE_OK;
}

/* A frame lives on its caller's stack from kve__enter to kve__leave, which
 * takes it off the list again: GCC 12 at -O2, once this is inlined, sees the
 * store of a local's address in running and not the kve__leave that undoes it. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
void kve__enter_new(kve_frame *f, const kve_bank *b, const char *name, bool policy)
{
    f->bank = b;
    f->name = name;
    f->policy = policy;
    f->source = false;
    f->up = running;
    running = f;
}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

kve_status kve__enter_source(kve_frame *f, const kve_bank *b, const char *call)
{
    kve_status st = kve__enter(f, b, call);
    if (st == KVE_OK)
        f->source = true;
    return st;
}

kve_status kve__enter(kve_frame *f, const kve_bank *b, const char *call)
{
    kve_status st = kve__check_idle(b, call);
    if (st == KVE_OK)
        kve__enter_new(f, b, b->cfg.type->name, b->is_policy);
    return st;
}

void kve__leave(const kve_frame *f)
{
    running = f->up;
}

/* ---- storage ---- */

size_t kve__block_layout(const kve_config *c, size_t cap, size_t off[KVE_NCOLS])
{
    size_t total = 0;
    for (int k = 0; k < KVE_NCOLS; k++) {
        off[k] = total;
        size_t bytes = cap * c->elem[k];
        total += (bytes + KVE_BLOCK_ALIGN - 1) / KVE_BLOCK_ALIGN * KVE_BLOCK_ALIGN;
    }
    return total;
}

size_t kve__block_bytes(const kve_config *c, size_t cap)
{
    size_t off[KVE_NCOLS];
    return kve__block_layout(c, cap, off);
}

static void free_slabs(kve_bank *b)
{
    for (int k = 0; k < KVE_NCOLS; k++) {
        kve__dealloc(&b->alloc, b->slab[k], b->n_heads * b->cfg.cap0 * b->cfg.elem[k]);
        b->slab[k] = NULL;
    }
}

kve_status kve__bank_init(kve_bank *b, const kve_config *c, const kve_allocator *alloc,
                          size_t n_heads, kve_head *heads, const kve_bank_options *opt,
                          kve_group *groups, kve_rng *rng)
{
    memset(b, 0, sizeof *b);
    b->cfg = *c;
    b->alloc = *alloc;
    b->n_heads = n_heads;
    b->heads = heads;
    if (opt) {
        b->min_share = opt->min_share; /* kept without a share too: an option of the bank */
        b->same_positions = opt->same_positions != 0;
    }
    if (opt && opt->share) {
        /* A shared group's heads drift apart in size: each starts with the
         * slack of the sliding layout, so that a head outgrows its slots
         * only every slack steps (group.c). */
        b->cfg.cap0 = kve__sliding_cap(c->params.budget);
        b->share = opt->share;
        b->groups = groups;
    }
    const size_t cap = b->cfg.cap0;
    if (n_heads > SIZE_MAX / KVE_BLOCK_ALIGN / cap || n_heads * cap > SIZE_MAX / c->slot_bytes ||
        (c->aux_bytes && n_heads > SIZE_MAX / c->aux_bytes))
        return kve__fail(KVE_ENOMEM, "%s: cannot hold %zu heads of %zu slots", c->type->name,
                         n_heads, cap);
    bool ok = true;
    for (int k = 0; ok && k < KVE_NCOLS; k++) {
        if (!c->elem[k])
            continue;
        size_t slots = n_heads * cap;
        b->slab[k] = k == KVE_COL_MARK ? kve__alloc_zero(&b->alloc, slots * c->elem[k])
                                        : kve__alloc(&b->alloc, slots * c->elem[k]);
        ok = b->slab[k] != NULL;
    }
    if (ok && c->aux_bytes)
        ok = (b->aux = kve__alloc_zero(&b->alloc, n_heads * c->aux_bytes)) != NULL;
    if (!ok) {
        free_slabs(b);
        kve__dealloc(&b->alloc, b->aux, n_heads * c->aux_bytes);
        b->aux = NULL;
        return kve__fail(KVE_ENOMEM, "%s: out of memory for %zu heads of %zu slots",
                         c->type->name, n_heads, cap);
    }
    atomic_init(&b->slab_users, n_heads);
    for (size_t h = 0; h < n_heads; h++) {
        kve_head *hd = &heads[h];
        memset(hd, 0, sizeof *hd);
        for (int k = 0; k < KVE_NCOLS; k++)
            hd->col[k] = c->elem[k] ? (char *)b->slab[k] + h * cap * c->elem[k] : NULL;
        hd->cap = cap;
        hd->gap = KVE_NONE;
        hd->best = KVE_NONE;
        hd->aux = b->aux ? (char *)b->aux + h * c->aux_bytes : NULL;
    }
    for (size_t g = 0; b->share && g < n_heads / b->share; g++) {
        memset(&groups[g], 0, sizeof groups[g]);
        for (int k = 0; k < KVE_NCOLS; k++)
            groups[g].base[k] = heads[g * b->share].col[k];
        groups[g].cap = b->share * cap;
    }
    /* Drawn last, one output per head in head order: head h gets the stream
     * the h-th of n_heads policies built from the same generator would. */
    if (c->type->flags & KVE_TYPE_NEEDS_RNG)
        for (size_t h = 0; h < n_heads; h++)
            kve_rng_seed(&heads[h].rng, heads[h].seed = kve_rng_next(rng));
    return KVE_OK;
}

void kve__bank_release(kve_bank *b)
{
    for (size_t h = 0; h < b->n_heads; h++)
        if (b->heads[h].block)
            kve__dealloc(&b->alloc, b->heads[h].block, kve__block_bytes(&b->cfg, b->heads[h].cap));
    for (size_t g = 0; b->share && g < b->n_heads / b->share; g++)
        if (b->groups[g].block)
            kve__dealloc(&b->alloc, b->groups[g].block,
                         kve__block_bytes(&b->cfg, b->groups[g].cap));
    free_slabs(b);
    kve__dealloc(&b->alloc, b->aux, b->n_heads * b->cfg.aux_bytes);
    kve__type_release(b->cfg.type);
}

void kve__bank_leave_slabs(kve_bank *b, size_t n)
{
    if (atomic_fetch_sub_explicit(&b->slab_users, n, memory_order_acq_rel) == n)
        free_slabs(b); /* the last head has left the slabs */
}

kve_status kve__block_alloc(const kve_bank *b, size_t cap, void **out)
{
    const kve_config *c = &b->cfg;
    if (cap > SIZE_MAX / KVE_BLOCK_ALIGN ||
        cap > (SIZE_MAX - (size_t)KVE_NCOLS * KVE_BLOCK_ALIGN) / c->slot_bytes)
        return kve__fail(KVE_ENOMEM, "%s: cannot hold %zu positions", c->type->name, cap);
    if (!(*out = kve__alloc(&b->alloc, kve__block_bytes(c, cap))))
        return kve__fail(KVE_ENOMEM, "%s: out of memory for %zu slots", c->type->name, cap);
    return KVE_OK;
}

void kve__head_adopt(kve_bank *b, kve_head *h, void *block, size_t cap, bool keep)
{
    const kve_config *c = &b->cfg;
    size_t off[KVE_NCOLS];
    kve__block_layout(c, cap, off);
    if (keep)
        kve__close_gap(c, h);
    for (int k = 0; k < KVE_NCOLS; k++) {
        if (!c->elem[k])
            continue;
        char *dst = (char *)block + off[k];
        if (k == KVE_COL_MARK)
            memset(dst, 0, cap * c->elem[k]);
        else if (keep)
            memcpy(dst, h->col[k], h->size * c->elem[k]);
        h->col[k] = dst;
    }
    if (h->block)
        kve__dealloc(&b->alloc, h->block, kve__block_bytes(c, h->cap));
    else
        kve__bank_leave_slabs(b, 1);
    h->block = block;
    h->cap = cap;
    h->offset = 0;
    if (!keep) {
        h->size = 0;
        h->gap = h->best = KVE_NONE;
    }
}

/* Allocates the block a head needs to double, into h->spare. */
static kve_status alloc_growth(const kve_bank *b, size_t head)
{
    kve_head *h = &b->heads[head];
    if (h->cap > SIZE_MAX / 2)
        return kve__fail(KVE_ENOMEM, "%s: cannot hold %zu positions", b->cfg.type->name, h->cap);
    return kve__block_alloc(b, h->cap * 2, &h->spare);
}

/* Moves a head into its spare block. The head's gap is closed first (it has
 * none when full, but the copy must not depend on that). */
static void commit_growth(kve_bank *b, kve_head *h)
{
    kve__head_adopt(b, h, h->spare, h->cap * 2, true);
    h->spare = NULL;
}

/* ---- messages ---- */

/* "" for a policy, "head 3: " for a bank. */
static const char *label(const kve_bank *b, size_t head, char buf[32])
{
    if (b->is_policy)
        return "";
    snprintf(buf, 32, "head %zu: ", head);
    return buf;
}

kve_status kve__head_fail(const kve_bank *b, kve_status st, size_t head, const char *fmt, ...)
{
    char msg[200], buf[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kve__fail(st, "%s: %s%s", b->cfg.type->name, label(b, head, buf), msg);
}

KVE_COLD static kve_status bad_weight(const kve_bank *b, size_t head, size_t row, size_t group,
                                      const kve_rows *in, size_t q, size_t i)
{
    char rowbuf[48] = "";
    if (q == group)
        return kve__head_fail(b, KVE_EINVAL, head,
                         "the sum of %zu query rows at attn index %zu overflows float32", group, i);
    if (group > 1)
        snprintf(rowbuf, sizeof rowbuf, "query row %zu: ", row + q);
    float a = in->row[q * in->ld + i];
    return kve__head_fail(b, KVE_EINVAL, head, "%sattn[%zu] = %g is %s", rowbuf, i, (double)a,
                     isnan(a) ? "NaN" : isinf(a) ? "infinite" : "negative");
}

/* ---- step ---- */

KVE_ALWAYS_INLINE void head_step(const kve_config *c, kve_head *h, const kve_rows *in,
                                 const kve_head_in *hi, kve_isa isa)
{
    if (h->offset && h->offset + h->size >= h->cap)
        kve__sliding_rewind(h);
    size_t n = h->size;
    if (in)
        h->observed++;
    if (c->observe && !in && h->gap == KVE_NONE) {
        /* A NULL step (no information: scores unchanged) with no hole to
         * close: O(1), the evict that follows finds the victim (a prompt
         * stepped through with NULL costs O(1) a token). */
        h->best = KVE_NONE;
        ((double *)h->col[KVE_COL_SCORE])[n] = 0.0;
        if (c->elem[KVE_COL_RAW])
            ((double *)h->col[KVE_COL_RAW])[n] = 0.0;
    } else if (c->observe) {
        /* One pass over the scores finds the victim of the coming evict and
         * closes the hole the last one left: the rule's observe pass, or for
         * a NULL step a plain scan. */
        double *score = h->col[KVE_COL_SCORE];
        size_t rw = c->params.recent_window;
        size_t limit = n + 1 > rw ? n + 1 - rw : 0; /* unprotected slots after admission */
        size_t best = in ? c->observe[isa](c, h, in, limit < n ? limit : n)
                         : kve__scored_scan(c, h, limit < n ? limit : n);
        /* With no recent window the newcomer (score 0) is a candidate too;
         * it is the highest index, so it wins only on a strictly lower score. */
        if (limit > n && (best == KVE_NONE || score[best] > 0.0))
            best = n;
        h->best = best;
        score[n] = 0.0;
        if (c->elem[KVE_COL_RAW])
            ((double *)h->col[KVE_COL_RAW])[n] = 0.0;
    } else if (c->type->step_keys) {
        /* The rule scores the newcomer itself (its key), so it competes
         * with its own score; slots [0, limit) after admission. */
        size_t rw = c->params.recent_window;
        h->best = c->type->step_keys(c, h, hi, n + 1 > rw ? n + 1 - rw : 0, isa);
    }
    /* Every pass above closed the gap, so slot n is the newcomer's in every
     * lazy column. */
    if (c->elem[KVE_COL_VNORM])
        ((double *)h->col[KVE_COL_VNORM])[n] = hi->vnorm;
    ((int32_t *)h->col[KVE_COL_POS])[n] = hi->pos;
    if (c->type->admit)
        c->type->admit(c, h, n);
    h->size = n + 1;
    h->last_pos = hi->pos;
    h->any_pos = true;
}

KVE_COLD static kve_status bad_vector(const kve_bank *b, size_t head, const char *what,
                                      size_t row, size_t rows, const float *v, size_t i)
{
    char rowbuf[40] = "";
    if (rows > 1)
        snprintf(rowbuf, sizeof rowbuf, "query head %zu: ", row);
    return kve__head_fail(b, KVE_EINVAL, head, "%s%s[%zu] = %g is %s", rowbuf, what, i,
                          (double)v[i], isnan(v[i]) ? "NaN" : "infinite");
}

/* One kind of vector a step carries per head (keys, queries, values):
 * present when the policy reads them, allowed only with a dimension, rows
 * far enough apart, every entry finite. `rows` vectors a head. */
static kve_status check_vectors(const kve_bank *b, size_t first, size_t count, const float *v,
                                size_t ld, size_t dim, size_t rows, kve_reads flag,
                                const char *what, const char *whats, const char *dim_name)
{
    const kve_config *c = &b->cfg;
    if (!v) {
        if ((c->reads & flag) && count)
            return kve__head_fail(b, KVE_EINVAL, first, "the policy reads %s, but the step "
                                  "carries none", whats);
        return KVE_OK;
    }
    if (dim == 0)
        return kve__head_fail(b, KVE_EINVAL, first, "a %s is given, but the policy was built "
                              "with %s 0", what, dim_name);
    if (ld < dim)
        return kve__fail(KVE_EINVAL, "%s: ld_%s %zu is smaller than %s %zu", c->type->name,
                         whats, ld, dim_name, dim);
    if (count * rows > 1 && ld > SIZE_MAX / sizeof(float) / rows / count)
        return kve__fail(KVE_EINVAL, "%s: %zu %s of ld_%s %zu overflow the address space",
                         c->type->name, count * rows, whats, whats, ld);
    for (size_t j = 0; j < count; j++)
        for (size_t g = 0; g < rows; g++) {
            const float *x = v + (j * rows + g) * ld;
            size_t i = kve__key_invalid(x, dim);
            if (i != dim)
                return bad_vector(b, first + j, what, g, rows, x, i);
        }
    return KVE_OK;
}

/* The checks of a score rule's prepare (and any other hook that can fail)
 * on every head of the range: see kve_policy_type.prepare. */
static kve_status prepare_heads(kve_bank *b, size_t first, size_t count, const kve_step_data *d)
{
    const kve_config *c = &b->cfg;
    for (size_t j = 0; j < count; j++) {
        kve_rows in = {d->attn + j * d->group * d->ld, d->ld, d->group, d->reduce};
        kve_status st = c->type->prepare(c, &b->heads[first + j], &in,
                                         b->is_policy ? KVE_NONE : first + j);
        if (st != KVE_OK)
            return st;
    }
    return KVE_OK;
}

/* ---- same positions ----
 *
 * A same_positions bank keeps one kept set in every head. Steps append, so
 * the heads can differ only while a position is being admitted range by
 * range (a layer at a time): then some heads (the front) have admitted the
 * bank's newest position F and the others have not, and their kept sets are
 * otherwise equal. Nothing beyond the heads records that: the front is the
 * largest last position of any head. */

/* The front: *front the largest last position admitted by any head and
 * *behind the heads that have not admitted it (0: every head is at the same
 * position, or none has admitted any). O(heads). */
static void same_front(const kve_bank *b, int32_t *front, size_t *behind, size_t *first_behind,
                       size_t *first_front)
{
    bool any = false;
    int32_t f = 0;
    size_t at = 0, ff = 0;
    for (size_t h = 0; h < b->n_heads; h++) {
        const kve_head *hd = &b->heads[h];
        if (!hd->any_pos)
            continue;
        if (!any || hd->last_pos > f) {
            f = hd->last_pos;
            any = true;
            at = 0;
            ff = h;
        }
        at += hd->last_pos == f;
    }
    size_t fb = 0;
    while (any && at < b->n_heads && fb < b->n_heads && b->heads[fb].any_pos &&
           b->heads[fb].last_pos == f)
        fb++;
    *front = f;
    *behind = any ? b->n_heads - at : 0;
    *first_behind = fb;
    *first_front = ff;
}

/* A step at pos may start a new position only when every head is at the
 * same one; while some heads have admitted the front and others not, the
 * others are stepped at the front (the per-head check refuses the heads
 * that have admitted it). */
static kve_status check_round(const kve_bank *b, int32_t pos)
{
    int32_t front;
    size_t behind, fb, ff;
    same_front(b, &front, &behind, &fb, &ff);
    if (behind && pos != front)
        return kve__fail(KVE_EINVAL, "%s: same_positions: head %zu has admitted position %ld "
                         "and head %zu has not: every head is stepped at %ld before any is "
                         "stepped at %ld", b->cfg.type->name, ff, (long)front, fb,
                         (long)front, (long)pos);
    return KVE_OK;
}

/* An eviction decides for every head at once: the range is the bank, and
 * every head has admitted the same positions. */
static kve_status check_evict_same(const kve_bank *b, size_t first, size_t count)
{
    if (first != 0 || count != b->n_heads)
        return kve__fail(KVE_EINVAL, "%s: same_positions: an eviction decides for every head "
                         "at once: evict heads 0 + %zu, not %zu + %zu", b->cfg.type->name,
                         b->n_heads, first, count);
    int32_t front;
    size_t behind, fb, ff;
    same_front(b, &front, &behind, &fb, &ff);
    if (behind)
        return kve__fail(KVE_EINVAL, "%s: same_positions: head %zu has not admitted position "
                         "%ld, which head %zu has: step every head before evicting",
                         b->cfg.type->name, fb, (long)front, ff);
    return KVE_OK;
}

/* The eviction of a same_positions bank (checked: every head, the same
 * kept set, victims room for each): one decision, the same victims in every
 * head. Scored policies rank slots by the sum of the heads' scores (the
 * one-victim steady state: one pass over the combined scores, then each
 * head loses the slot as its own evict would lose it); random draws from
 * head 0's generator; window, streaming and full decide from positions
 * alone, so each head's own evict gives the same victims. */
static void evict_same(kve_bank *b, size_t budget, int32_t *victims, size_t ld_victims,
                       size_t *counts)
{
    const kve_config *c = &b->cfg;
    const size_t H = b->n_heads;
    kve_head *h0 = &b->heads[0];
    const size_t n = h0->size;
    const bool scored = (c->type->flags & KVE_TYPE_SCORED) != 0;
    size_t need = !(c->type->flags & KVE_TYPE_NEVER_EVICTS) && n > budget ? n - budget : 0;
    if (need && scored)
        for (size_t j = 0; j < H; j++) {
            kve__close_gap(c, &b->heads[j]);
            b->heads[j].best = KVE_NONE;
        }
    if (!need) {
        /* nothing to remove */
    } else if (scored && c->params.block <= 1 && need == 1) {
        size_t v = kve__combined_argmin(b->heads, H, n - c->params.recent_window, NULL);
        for (size_t j = 0; j < H; j++)
            kve__evict_one(&b->heads[j], v, victims + j * ld_victims);
    } else if (scored || c->type->select) {
        size_t first = !scored ? c->type->select(c, h0, need)
                       : c->params.block > 1 ? kve__mark_pages(c, h0, b->heads, H, need)
                                             : kve__mark_argmin(c, h0, b->heads, H, need);
        const uint8_t *m0 = h0->col[KVE_COL_MARK];
        for (size_t j = 1; j < H && first < n; j++)
            memcpy((uint8_t *)b->heads[j].col[KVE_COL_MARK] + first, m0 + first, n - first);
        for (size_t j = 0; j < H; j++)
            need = kve__compact_marked(c, &b->heads[j], first, victims + j * ld_victims);
    } else {
        for (size_t j = 0; j < H; j++)
            need = c->evict(c, &b->heads[j], need, victims + j * ld_victims);
    }
    for (size_t j = 0; counts && j < H; j++)
        counts[j] = need;
}

/* The step of heads [first, first + count) of b (policy: b is a policy's,
 * count 1, group 1, no shared budget). Written once, inlined twice: into
 * kve__bank_step_data, any range of a bank (or a policy's step with data),
 * and into kve__policy_step, where the constants let the compiler drop the
 * loops over heads and the tests that cannot hold for a policy. */
KVE_ALWAYS_INLINE kve_status step_heads(kve_bank *b, size_t first, size_t count, int32_t pos,
                                        const kve_step_data *d, const bool policy)
{
    const kve_config *c = &b->cfg;
    const float *attn = d->attn;
    const size_t ld = d->ld, group = d->group;
    if (pos < 0)
        return kve__head_fail(b, KVE_EINVAL, first, "pos %ld is negative", (long)pos);
    if (d->flags & ~(unsigned)KVE_STEP_RESCORE)
        return kve__fail(KVE_EINVAL, "%s: flags %#x has bits outside KVE_STEP_*", c->type->name,
                         d->flags);
    for (size_t j = 0; j < count; j++) {
        const kve_head *h = &b->heads[first + j];
        if (h->any_pos && pos <= h->last_pos)
            return kve__head_fail(b, KVE_EINVAL, first + j,
                             "pos %ld is not greater than the last position %ld", (long)pos,
                             (long)h->last_pos);
    }
    if (!policy && b->same_positions && count) {
        kve_status st = check_round(b, pos);
        if (st != KVE_OK)
            return st;
    }
    if (attn) {
        for (size_t j = 0; j < count; j++) {
            size_t n = b->heads[first + j].size;
            if ((policy || b->is_policy) && ld != n)
                return kve__head_fail(b, KVE_EINVAL, 0, "n is %zu but the policy keeps %zu positions",
                                 ld, n);
            if (ld < n)
                return kve__head_fail(b, KVE_EINVAL, first + j,
                                 "ld %zu is smaller than the %zu kept positions", ld, n);
        }
        for (size_t j = 0; j < count && !c->unchecked; j++) {
            kve_rows in = {attn + j * group * ld, ld, group, d->reduce};
            size_t q, i;
            if (kve__rows_invalid(&in, b->heads[first + j].size, &q, &i))
                return bad_weight(b, first + j, j * group, group, &in, q, i);
        }
    }
    kve_status kst = check_vectors(b, first, count, d->keys, d->ld_keys, c->key_dim, 1,
                                   KVE_READS_KEYS, "key", "keys", "key_dim");
    if (kst == KVE_OK)
        kst = check_vectors(b, first, count, d->queries, d->ld_queries, c->key_dim,
                            c->query_group, KVE_READS_QUERIES, "query", "queries", "key_dim");
    if (kst == KVE_OK)
        kst = check_vectors(b, first, count, d->values, d->ld_values, c->value_dim, 1,
                            KVE_READS_VALUES, "value", "values", "value_dim");
    if (kst != KVE_OK)
        return kst;
    const bool share = !policy && b->share;
    if (share) {
        kve_status st = kve__groups_prepare(b, first / b->share, count / b->share);
        if (st != KVE_OK)
            return st;
        kve__groups_commit(b, first / b->share, count / b->share);
    }
    for (size_t j = 0; j < count && !share; j++) {
        const kve_head *h = &b->heads[first + j];
        if (h->offset == 0 && h->size >= h->cap) {
            kve_status st = alloc_growth(b, first + j);
            if (st != KVE_OK) {
                for (size_t k = 0; k < j; k++) {
                    kve_head *g = &b->heads[first + k];
                    if (g->spare)
                        kve__dealloc(&b->alloc, g->spare, kve__block_bytes(c, g->cap * 2));
                    g->spare = NULL;
                }
                return st;
            }
        }
    }
    if (c->type->prepare && attn) {
        /* A rule that can fail runs on every head before any is stepped;
         * growth is committed first (it changes no kept set). */
        for (size_t j = 0; j < count; j++)
            if (b->heads[first + j].spare)
                commit_growth(b, &b->heads[first + j]);
        kve_status st = prepare_heads(b, first, count, d);
        if (st != KVE_OK)
            return st;
    }

    kve_isa isa = kve__isa();
    for (size_t j = 0; j < count; j++) {
        kve_head *h = &b->heads[first + j];
        if (h->spare)
            commit_growth(b, h);
        kve_rows in = {attn ? attn + j * group * ld : NULL, ld, group, d->reduce};
        kve_head_in hi = {.pos = pos, .flags = d->flags};
        hi.key = d->keys ? d->keys + j * d->ld_keys : NULL;
        hi.queries = d->queries ? d->queries + j * c->query_group * d->ld_queries : NULL;
        hi.ld_queries = d->ld_queries;
        hi.value = d->values ? d->values + j * d->ld_values : NULL;
        if (c->elem[KVE_COL_VNORM] && hi.value)
            hi.vnorm = c->params.vnorm == 2 ? kve__value_norm(c, hi.value)
                                            : kve__key_norm(hi.value, c->value_dim);
        head_step(c, h, attn ? &in : NULL, &hi, isa);
    }
    return KVE_OK;
}

/* step_heads inside a frame of the guard. */
static kve_status guarded_step(kve_bank *b, size_t first, size_t count, int32_t pos,
                               const kve_step_data *d, bool policy)
{
    kve_frame f;
    kve_status st = kve__enter(&f, b, "a step");
    if (st != KVE_OK)
        return st;
    st = policy ? step_heads(b, 0, 1, pos, d, true) : step_heads(b, first, count, pos, d, false);
    kve__leave(&f);
    return st;
}

kve_status kve__bank_step_data(kve_bank *b, size_t first, size_t count, int32_t pos,
                               const kve_step_data *d)
{
    return guarded_step(b, first, count, pos, d, false);
}

/* The step data of the older step calls: attention and keys only. */
static kve_step_data attn_keys_data(const float *attn, size_t ld, size_t group,
                                    kve_reduce reduce, const float *keys, size_t ld_keys)
{
    kve_step_data d = kve_step_default_data();
    d.attn = attn;
    d.ld = ld;
    d.group = group;
    d.reduce = reduce;
    d.keys = keys;
    d.ld_keys = ld_keys;
    return d;
}
kve_status kve__bank_step(kve_bank *b, size_t first, size_t count, int32_t pos,
                          const float *attn, size_t ld, size_t group, kve_reduce reduce,
                          const float *keys, size_t ld_keys)
{
    kve_step_data d = attn_keys_data(attn, ld, group, reduce, keys, ld_keys);
    return guarded_step(b, first, count, pos, &d, false);
}

kve_status kve__policy_step(kve_bank *b, int32_t pos, const float *attn, size_t n,
                            const float *key)
{
    kve_step_data d = attn_keys_data(attn, n, 1, KVE_REDUCE_MEAN, key, b->cfg.key_dim);
    return guarded_step(b, 0, 1, pos, &d, true);
}

kve_step_data kve_step_default_data(void)
{
    kve_step_data d = {.attn = NULL, .ld = 0, .group = 1, .reduce = KVE_REDUCE_MEAN,
                       .keys = NULL, .ld_keys = 0, .queries = NULL, .ld_queries = 0,
                       .values = NULL, .ld_values = 0, .flags = 0};
    return d;
}

/* ---- evict ---- */

/* The evict of heads [first, first + count) to `budget`; inlined twice, as
 * step_heads. */
KVE_ALWAYS_INLINE kve_status evict_heads(kve_bank *b, size_t first, size_t count, size_t budget,
                                         int32_t *victims, size_t ld_victims, size_t *counts,
                                         const char *ld_name)
{
    const kve_config *c = &b->cfg;
    const char *name = c->type->name;
    if (budget == 0)
        return kve__fail(KVE_EINVAL, "%s: budget must be at least 1", name);
    if (c->params.recent_window && budget <= c->params.recent_window)
        return kve__fail(KVE_EINVAL, "%s: budget %zu must be greater than recent_window %zu", name,
                         budget, c->params.recent_window);
    if (c->params.sinks && budget <= c->params.sinks)
        return kve__fail(KVE_EINVAL, "%s: budget %zu must be greater than sinks %zu", name, budget,
                         c->params.sinks);
    if (c->params.block > 1) {
        kve_status st = kve__check_pages(c, budget);
        if (st != KVE_OK)
            return st;
    }
    if (!victims && ld_victims)
        return kve__fail(KVE_EINVAL, "%s: victims is NULL but %s is %zu", name, ld_name,
                         ld_victims);
    if (b->same_positions && count) { /* one decision: the whole bank, in step */
        kve_status st = check_evict_same(b, first, count);
        if (st != KVE_OK)
            return st;
    }
    const bool never = (c->type->flags & KVE_TYPE_NEVER_EVICTS) != 0;
    /* pages: up to block - 1 past the need (policies without the key have block 0) */
    const size_t extra = c->params.block > 1 ? c->params.block - 1 : 0;
    for (size_t j = 0; j < count && !never; j++) {
        size_t n = b->heads[first + j].size;
        size_t need = n > budget ? n - budget : 0;
        size_t most = need && extra ? (need + extra < n ? need + extra : n) : need;
        if (most > ld_victims)
            return kve__head_fail(b, KVE_ERANGE, first + j, "%s%zu victims to report but %s is %zu",
                                  extra ? "up to " : "", most, ld_name, ld_victims);
    }
    if (b->same_positions && count) {
        evict_same(b, budget, victims, ld_victims, counts);
        return KVE_OK;
    }
    for (size_t j = 0; j < count; j++) {
        kve_head *h = &b->heads[first + j];
        size_t need = !never && h->size > budget ? h->size - budget : 0;
        if (need) {
            int32_t *out = victims + j * ld_victims;
            need = c->evict ? c->evict(c, h, need, out) : kve__evict_marked(c, h, need, out);
        }
        if (counts)
            counts[j] = need;
    }
    return KVE_OK;
}

kve_status kve__bank_evict(kve_bank *b, size_t first, size_t count, size_t budget,
                           int32_t *victims, size_t ld_victims, size_t *counts)
{
    kve_status st = kve__check_idle(b, "an evict");
    if (st != KVE_OK)
        return st;
    return evict_heads(b, first, count, budget, victims, ld_victims, counts, "ld_victims");
}

kve_status kve__policy_evict(kve_bank *b, size_t budget, int32_t *victims, size_t cap,
                             size_t *n_victims)
{
    kve_status st = kve__check_idle(b, "an evict");
    if (st != KVE_OK)
        return st;
    return evict_heads(b, 0, 1, budget, victims, cap, n_victims, "cap");
}

/* ---- the bank API ---- */

typedef struct bank_alloc {
    kve_bank bank;
    kve_head heads[]; /* (n_heads), then (n_heads / share) kve_group */
} bank_alloc;

kve_bank_options kve_bank_default_options(void)
{
    const kve_policy_options p = kve_policy_default_options();
    kve_bank_options o = {.allocator = NULL, .key_dim = 0, .share = 0, .min_share = 0.2,
                          .value_dim = 0, .query_group = p.query_group, .rope = p.rope,
                          .unchecked = 0, .same_positions = 0};
    return o;
}

kve_status kve__bank_check_options(const kve_config *c, size_t n_heads,
                                   const kve_bank_options *o)
{
    const char *name = c->type->name;
    if (n_heads == 0)
        return kve__fail(KVE_EINVAL, "%s: n_heads must be at least 1", name);
    if (!(o->min_share >= 0.0 && o->min_share <= 1.0))
        return kve__fail(KVE_EINVAL, "%s: min_share %g is outside [0, 1]", name, o->min_share);
    if (o->same_positions != 0 && o->same_positions != 1)
        return kve__fail(KVE_EINVAL, "%s: same_positions %d is neither 0 nor 1", name,
                         o->same_positions);
    if (o->same_positions && o->share)
        return kve__fail(KVE_EINVAL, "%s: same_positions keeps one set of positions for every "
                         "head, a shared budget (share %zu) lets heads keep different ones: "
                         "choose one", name, o->share);
    if ((o->same_positions || o->share) && (c->type->flags & KVE_TYPE_VNORM) &&
        c->params.vnorm == 2)
        return kve__fail(KVE_EINVAL, "%s: vnorm=2 (CriticalKV) selects each head's positions in "
                         "two stages; %s is not supported with it", name,
                         o->share ? "a shared budget (share)" : "same_positions");
    if (!o->share)
        return KVE_OK;
    if (n_heads % o->share)
        return kve__fail(KVE_EINVAL, "%s: share %zu does not divide n_heads %zu", name, o->share,
                         n_heads);
    if (!(c->type->flags & KVE_TYPE_SCORED))
        return kve__fail(KVE_EINVAL,
                         "%s: a shared budget compares scores, and this policy has none", name);
    if (c->params.block > 1)
        return kve__fail(KVE_EINVAL, "%s: a shared budget evicts positions, not pages (block=%zu)",
                         name, c->params.block);
    return KVE_OK;
}

kve_status kve__bank_create(const kve_config *c, size_t n_heads, kve_rng *rng,
                            const kve_bank_options *o, const kve_allocator *alloc,
                            kve_bank **out)
{
    size_t n_groups = o->share ? n_heads / o->share : 0;
    if (n_heads > (SIZE_MAX - sizeof(bank_alloc)) / (sizeof(kve_head) + sizeof(kve_group)))
        return kve__fail(KVE_ENOMEM, "%s: cannot hold %zu heads", c->type->name, n_heads);
    const size_t bytes = sizeof(bank_alloc) + n_heads * sizeof(kve_head) +
                         n_groups * sizeof(kve_group);
    bank_alloc *a = kve__alloc(alloc, bytes);
    if (!a) {
        kve__type_release(c->type);
        return kve__fail(KVE_ENOMEM, "%s: out of memory for %zu heads", c->type->name, n_heads);
    }
    kve_group *groups = n_groups ? (kve_group *)(void *)(a->heads + n_heads) : NULL;
    kve_frame f; /* its allocator runs: a call into the half-built bank is refused */
    kve__enter_new(&f, &a->bank, c->type->name, false);
    kve_status st = kve__bank_init(&a->bank, c, alloc, n_heads, a->heads, o, groups, rng);
    if (st != KVE_OK)
        kve__dealloc(alloc, a, bytes);
    kve__leave(&f);
    if (st != KVE_OK) {
        kve__type_release(c->type);
        return st;
    }
    a->bank.handle_bytes = bytes;
    *out = &a->bank;
    return KVE_OK;
}

/* a + b and a * b, stuck at SIZE_MAX. */
static size_t sat_add(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}
static size_t sat_mul(size_t a, size_t b)
{
    return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

size_t kve__create_bytes(const kve_config *c, size_t n_heads, size_t share, bool policy)
{
    size_t total = policy ? sizeof(kve_policy)
                          : sat_add(sizeof(bank_alloc),
                                    sat_mul(n_heads, sizeof(kve_head) +
                                                         (share ? sizeof(kve_group) / share : 0)));
    if (!policy && share) /* groups: n_heads / share of them, counted exactly */
        total = sat_add(sat_add(sizeof(bank_alloc), sat_mul(n_heads, sizeof(kve_head))),
                        sat_mul(n_heads / share, sizeof(kve_group)));
    const size_t cap = share ? kve__sliding_cap(c->params.budget) : c->cap0;
    for (int k = 0; k < KVE_NCOLS; k++)
        total = sat_add(total, sat_mul(sat_mul(n_heads, cap), c->elem[k]));
    return sat_add(total, sat_mul(n_heads, c->aux_bytes));
}

kve_status kve_bank_new_ex(const char *spec, size_t n_heads, kve_rng *rng,
                           const kve_bank_options *options, kve_bank **out)
{
    kve_bank_options o = options ? *options : kve_bank_default_options();
    kve_policy_options po = kve_policy_default_options();
    po.key_dim = o.key_dim;
    po.value_dim = o.value_dim;
    po.query_group = o.query_group;
    po.rope = o.rope;
    po.unchecked = o.unchecked;
    const kve_allocator alloc = kve__allocator(o.allocator);
    kve_config c;
    kve_status st = kve__config_new(spec, rng, &po, out, &c);
    if (st != KVE_OK)
        return st;
    if ((st = kve__bank_check_options(&c, n_heads, &o)) != KVE_OK) {
        kve__type_release(c.type);
        return st;
    }
    return kve__bank_create(&c, n_heads, rng, &o, &alloc, out);
}

kve_status kve_bank_new(const char *spec, size_t n_heads, kve_rng *rng, kve_bank **out)
{
    return kve_bank_new_ex(spec, n_heads, rng, NULL, out);
}

void kve_bank_free(kve_bank *b)
{
    kve_frame f; /* its allocator runs: a call into it meanwhile is refused */
    if (!b || kve__enter(&f, b, "kve_bank_free") != KVE_OK)
        return; /* from its own callback: not freed (kvevict.h) */
    const kve_allocator alloc = b->alloc;
    const size_t bytes = b->handle_bytes;
    kve__bank_release(b);
    kve__dealloc(&alloc, b, bytes); /* the bank is the first member of its bank_alloc */
    kve__leave(&f);
}

size_t kve_bank_heads(const kve_bank *b)
{
    return b ? b->n_heads : 0;
}

size_t kve_bank_size(const kve_bank *b, size_t head)
{
    return b && head < b->n_heads ? b->heads[head].size : 0;
}

kve_status kve_bank_sizes(const kve_bank *b, size_t first, size_t count, size_t *sizes,
                          size_t *largest)
{
    if (!b)
        return kve__fail(KVE_EINVAL, "bank is NULL");
    if (first > b->n_heads || count > b->n_heads - first)
        return kve__fail(KVE_EINVAL, "sizes: heads %zu + %zu are out of range: the bank has %zu",
                         first, count, b->n_heads);
    size_t most = 0;
    for (size_t j = 0; j < count; j++) {
        size_t n = b->heads[first + j].size;
        if (sizes)
            sizes[j] = n;
        most = n > most ? n : most;
    }
    if (largest)
        *largest = most;
    return KVE_OK;
}

const int32_t *kve_bank_positions(const kve_bank *b, size_t head)
{
    return b && head < b->n_heads ? (const int32_t *)b->heads[head].col[KVE_COL_POS] : NULL;
}

size_t kve_bank_state_bytes(const kve_bank *b)
{
    if (!b)
        return 0;
    size_t slots = b->slab[KVE_COL_POS] ? b->n_heads * b->cfg.cap0 : 0;
    for (size_t h = 0; h < b->n_heads; h++)
        if (b->heads[h].block)
            slots += b->heads[h].cap;
    for (size_t g = 0; b->share && g < b->n_heads / b->share; g++)
        if (b->groups[g].block)
            slots += b->groups[g].cap;
    return slots * b->cfg.slot_bytes;
}

const char *kve_bank_spec(const kve_bank *b)
{
    return b ? b->cfg.spec : NULL;
}

size_t kve_bank_budget(const kve_bank *b)
{
    return b ? b->cfg.params.budget : 0;
}

kve_reads kve_bank_reads(const kve_bank *b)
{
    return b ? b->cfg.reads : KVE_READS_NOTHING;
}

size_t kve_bank_key_dim(const kve_bank *b)
{
    return b ? b->cfg.key_dim : 0;
}

static kve_status check_range(const kve_bank *b, size_t first, size_t count)
{
    if (!b)
        return kve__fail(KVE_EINVAL, "bank is NULL");
    if (first > b->n_heads || count > b->n_heads - first)
        return kve__fail(KVE_EINVAL, "%s: heads %zu + %zu are out of range: the bank has %zu",
                         b->cfg.type->name, first, count, b->n_heads);
    if (b->share && (first % b->share || count % b->share))
        return kve__fail(KVE_EINVAL,
                         "%s: heads %zu + %zu split a shared group: ranges of this bank are "
                         "whole groups of %zu heads",
                         b->cfg.type->name, first, count, b->share);
    return KVE_OK;
}

kve_status kve_bank_step_data(kve_bank *b, size_t first, size_t count, int32_t pos,
                              const kve_step_data *data)
{
    kve_status st = check_range(b, first, count);
    if (st != KVE_OK)
        return st;
    const kve_step_data d = data ? *data : kve_step_default_data();
    const char *name = b->cfg.type->name;
    if (d.group == 0)
        return kve__fail(KVE_EINVAL, "%s: group must be at least 1", name);
    if (d.reduce != KVE_REDUCE_MEAN && d.reduce != KVE_REDUCE_SUM && d.reduce != KVE_REDUCE_MAX)
        return kve__fail(KVE_EINVAL, "%s: reduce %d is not a kve_reduce", name, (int)d.reduce);
    if (d.attn && d.ld && count > SIZE_MAX / sizeof(float) / d.group / d.ld)
        return kve__fail(KVE_EINVAL, "%s: %zu rows of ld %zu overflow the address space", name,
                         count * d.group, d.ld);
    return kve__bank_step_data(b, first, count, pos, &d);
}

kve_status kve_bank_step_range(kve_bank *b, size_t first, size_t count, int32_t pos,
                               const float *attn, size_t ld, size_t group, kve_reduce reduce,
                               const float *keys, size_t ld_keys)
{
    kve_step_data d = attn_keys_data(attn, ld, group, reduce, keys, ld_keys);
    return kve_bank_step_data(b, first, count, pos, &d);
}

kve_status kve_bank_step(kve_bank *b, int32_t pos, const float *attn, size_t ld)
{
    return kve_bank_step_range(b, 0, b ? b->n_heads : 0, pos, attn, ld, 1, KVE_REDUCE_MEAN,
                               NULL, 0);
}

kve_status kve_bank_evict_range(kve_bank *b, size_t first, size_t count, size_t budget,
                                int32_t *victims, size_t ld_victims, size_t *counts)
{
    kve_status st = check_range(b, first, count);
    if (st != KVE_OK)
        return st;
    return kve__bank_evict(b, first, count, budget, victims, ld_victims, counts);
}

kve_status kve_bank_evict(kve_bank *b, size_t budget, int32_t *victims, size_t ld_victims,
                          size_t *counts)
{
    return kve_bank_evict_range(b, 0, b ? b->n_heads : 0, budget, victims, ld_victims, counts);
}

kve_status kve_bank_evict_shared(kve_bank *b, size_t first, size_t count, size_t budget,
                                 int32_t *victims, size_t ld_victims, size_t *counts)
{
    kve_status st = check_range(b, first, count);
    if (st == KVE_OK)
        st = kve__check_idle(b, "kve_bank_evict_shared");
    if (st == KVE_OK && (b->cfg.type->flags & KVE_TYPE_VNORM) && b->cfg.params.vnorm == 2)
        st = kve__fail(KVE_EINVAL, "%s: vnorm=2 (CriticalKV) selects each head's positions in "
                       "two stages; a shared eviction is not supported with it",
                       b->cfg.type->name);
    if (st != KVE_OK)
        return st;
    return kve__bank_evict_shared(b, first, count, budget, victims, ld_victims, counts);
}

size_t kve_bank_share(const kve_bank *b)
{
    return b ? b->share : 0;
}

int kve_bank_same_positions(const kve_bank *b)
{
    return b && b->same_positions;
}

double kve_bank_min_share(const kve_bank *b)
{
    return b ? b->min_share : 0.0;
}
