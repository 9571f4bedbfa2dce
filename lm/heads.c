/*
 * heads.c - one kvevict policy per (layer, KV head), behind an interface
 * shaped like kvevict's multi-head bank: steps and evictions over a range of
 * heads, query-head rows reduced to one row per KV head. Only this file
 * knows that the heads are separate kve_policy objects.
 *
 * Invariants: every head holds a policy built from the same spec, in head
 * order from one generator (so a run is reproducible from its seed); a
 * head's kept set is exactly its policy's.
 */
#include "lm.h"

#include <string.h>

struct lm_heads {
    size_t n;       /* heads */
    kve_policy **p; /* (n) */
};

void lm_group_mean(float *out, const float *rows, size_t ld, size_t group, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double sum = 0;
        for (size_t r = 0; r < group; r++)
            sum += rows[r * ld + i];
        out[i] = (float)(sum / (double)group);
    }
}

void lm_heads_free(lm_heads *b)
{
    if (!b)
        return;
    for (size_t h = 0; h < b->n; h++)
        kve_policy_free(b->p[h]);
    lm_free(b->p);
    lm_free(b);
}

kve_status lm_heads_new(const char *spec, size_t n_heads, kve_rng *rng, lm_heads **out)
{
    if (!spec || !out || n_heads == 0)
        return lm_fail(KVE_EINVAL, "heads: NULL spec or no heads");
    lm_heads *b = lm_calloc(1, sizeof *b);
    if (!b || !(b->p = lm_calloc(n_heads, sizeof(kve_policy *)))) {
        lm_free(b);
        return lm_fail(KVE_ENOMEM, "heads: out of memory for %zu heads", n_heads);
    }
    for (; b->n < n_heads; b->n++) {
        kve_status st = kve_policy_new(spec, rng, &b->p[b->n]);
        if (st != KVE_OK) {
            lm_fail(st, "policy: %s", kve_last_error());
            lm_heads_free(b);
            return st;
        }
    }
    *out = b;
    return KVE_OK;
}

size_t lm_heads_size(const lm_heads *b, size_t head)
{
    return kve_policy_size(b->p[head]);
}

const int32_t *lm_heads_positions(const lm_heads *b, size_t head)
{
    return kve_policy_positions(b->p[head]);
}

size_t lm_heads_budget(const lm_heads *b)
{
    return kve_policy_budget(b->p[0]);
}

const char *lm_heads_spec(const lm_heads *b)
{
    return kve_policy_spec(b->p[0]);
}

kve_status lm_heads_step(lm_heads *b, size_t first, size_t count, int32_t pos, const float *attn,
                         size_t ld, size_t group, float *scratch)
{
    for (size_t g = 0; g < count; g++) {
        kve_policy *p = b->p[first + g];
        size_t n = kve_policy_size(p);
        lm_group_mean(scratch, attn + g * group * ld, ld, group, n);
        kve_status st = kve_policy_step(p, pos, scratch, n);
        if (st != KVE_OK)
            return lm_fail(st, "policy of KV head %zu at position %d: %s", first + g, pos,
                           kve_last_error());
    }
    return KVE_OK;
}

kve_status lm_heads_evict(lm_heads *b, size_t first, size_t count, size_t budget, int32_t *victims,
                          size_t ld_victims, size_t *counts)
{
    for (size_t g = 0; g < count; g++) {
        kve_status st = kve_policy_evict(b->p[first + g], budget, victims + g * ld_victims,
                                         ld_victims, &counts[g]);
        if (st != KVE_OK)
            return lm_fail(st, "policy of KV head %zu: %s", first + g, kve_last_error());
    }
    return KVE_OK;
}
