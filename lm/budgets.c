/*
 * budgets.c - where the decoder spends its cache: each layer's budget from
 * one total (uniform, PyramidKV, or weighted by a statistic measured on a
 * calibration text), and the cache of layers whose KV heads share one
 * budget (kve_bank_evict_shared), whose heads hold different numbers of
 * keys that change every step.
 *
 * Legend as lm.h; b_l = layer l's per-head budget, A = rows of a layer's
 * arena, C_g = rows cache g owns in it.
 *
 * Layer budgets: total L * budget, floor the smallest budget the spec
 * accepts (kve_spec_min_budget), so PyramidKV's top layer keeps its window
 * plus a little.
 *
 * Shared layers: a layer's G caches live in one arena per array (keys,
 * values, positions), cache g owning rows [o_g, o_g + C_g), heads in order.
 * Before a step every cache needs one free row (before a block of B
 * tokens that no eviction interrupts, B rows); when one has none, the
 * layer is laid out again: cache g gets n_g + 1 (or B) rows plus an even share of
 * the rest, heads moving left moved first in head order, then heads moving
 * right in reverse order (so no rows are overwritten before they moved),
 * or, when the arena is too small, into a new arena of
 * max(need, min(2A, G * (b_l + 1 + slack))) rows, slack = max(1, (b_l+1)/8):
 * the bank's own layout (group.c), so the arena stops growing at the
 * layer's budget plus slack and a re-layout happens at most every slack - 1
 * steps of one head's growth. Nothing allocates in the steady state. The
 * arena never shrinks: the layer's budget bounds it.
 */
#include "lm.h"

#include <stdio.h>
#include <string.h>

enum { FIRST_ROWS = 64 };

/* ---- layer budgets ---- */

/* Per-head budgets (lm_options.head_budgets): copied, each checked against
 * the spec's floor and the library's limit; each layer's budget becomes its
 * largest head's (it sizes the bank's slots and the caches). */
static kve_status head_budgets_init(lm_state *s, size_t floor)
{
    const size_t *hb = s->opt.head_budgets;
    s->opt.head_budgets = NULL; /* read here only */
    if (!hb)
        return KVE_OK;
    size_t L = (size_t)s->model->config.n_layers, G = (size_t)s->model->config.n_kv_heads;
    if (s->opt.share_heads || s->opt.schedule != KVE_SCHEDULE_UNIFORM)
        return kve_set_error(KVE_EINVAL, "budgets: per-head budgets take neither shared heads "
                                         "nor a layer schedule");
    for (size_t i = 0; i < L * G; i++)
        if (hb[i] < floor || hb[i] > KVE_MAX_BUDGET)
            return kve_set_error(KVE_EINVAL, "budgets: head %zu (layer %zu, KV head %zu): budget "
                                 "%zu is outside [%zu, %d]", i, i / G, i % G, hb[i], floor,
                                 KVE_MAX_BUDGET);
    if (!(s->head_budget = lm_malloc(&s->alloc, L * G * sizeof *s->head_budget)))
        return kve_set_error(KVE_ENOMEM, "decoder: out of memory for the head budgets");
    memcpy(s->head_budget, hb, L * G * sizeof *hb);
    for (size_t l = 0; l < L; l++) {
        s->layer_budget[l] = 0;
        for (size_t g = 0; g < G; g++)
            if (hb[l * G + g] > s->layer_budget[l])
                s->layer_budget[l] = hb[l * G + g];
    }
    return KVE_OK;
}

kve_status lm__budgets_init(lm_state *s)
{
    size_t L = (size_t)s->model->config.n_layers;
    if (!s->spec)
        return KVE_OK;
    kve_rng rng; /* a policy that draws needs one; the budget is all we read */
    kve_rng_seed(&rng, 0);
    kve_policy *p = NULL;
    kve_policy_options o = kve_policy_default_options();
    o.allocator = s->opt.allocator;
    /* every fact of the model a policy may read (one that reads none ignores
     * them): keys and queries of head_size floats, the rotary embedding,
     * values of head_size floats (vnorm=1's R*D differ only in size) */
    const lm_config *c = &s->model->config;
    o.key_dim = (size_t)c->head_size;
    o.value_dim = (size_t)c->head_size;
    o.query_group = (size_t)(c->n_heads / c->n_kv_heads);
    o.rope = lm_model_rope(s->model);
    kve_status st = kve_policy_new_ex(s->spec, &rng, &o, &p);
    if (st != KVE_OK)
        return kve_set_error(st, "policy: %s", kve_last_error());
    s->budget = kve_policy_budget(p);
    s->reads = kve_policy_reads(p);
    kve_policy_free(p);
    if (s->budget > KVE_MAX_BUDGET / L)
        return kve_set_error(KVE_EINVAL, "budgets: %zu layers of %zu positions exceed %d", L, s->budget,
                       KVE_MAX_BUDGET);
    if (s->opt.same_positions && (s->opt.share_heads || s->opt.schedule != KVE_SCHEDULE_UNIFORM ||
                                  s->opt.head_budgets))
        return kve_set_error(KVE_EINVAL, "decoder: same_positions keeps one set of positions in "
                             "every layer and KV head, so one budget: not with %s",
                             s->opt.share_heads    ? "shared heads"
                             : s->opt.head_budgets ? "per-head budgets"
                                                   : "a layer schedule");
    kve_schedule_options sch = kve_schedule_default_options();
    sch.kind = s->opt.schedule;
    if ((st = kve_spec_min_budget(s->spec, &sch.floor)) != KVE_OK)
        return kve_set_error(st, "policy: %s", kve_last_error());
    sch.beta = s->opt.beta > 0 ? s->opt.beta : sch.beta;
    sch.weights = s->opt.layer_weights;
    s->opt.layer_weights = NULL; /* read here only */
    if (!(s->layer_budget = lm_calloc(&s->alloc, L, sizeof *s->layer_budget)))
        return kve_set_error(KVE_ENOMEM, "decoder: out of memory for the layer budgets");
    if ((st = kve_layer_budgets(L * s->budget, L, &sch, s->layer_budget)) != KVE_OK)
        return kve_set_error(st, "%s", kve_last_error());
    if (s->opt.share_heads && !(s->arena = lm_calloc(&s->alloc, L, sizeof *s->arena)))
        return kve_set_error(KVE_ENOMEM, "decoder: out of memory for the layer arenas");
    return head_budgets_init(s, sch.floor);
}

kve_status lm__bank_spec(const lm_state *s, char *out, size_t cap)
{
    size_t L = (size_t)s->model->config.n_layers, most = 0;
    for (size_t l = 0; l < L; l++)
        most = s->layer_budget[l] > most ? s->layer_budget[l] : most;
    char num[32];
    snprintf(num, sizeof num, "%zu", most);
    kve_status st = kve_spec_with(s->spec, "budget", num, out, cap);
    return st == KVE_OK ? st : kve_set_error(st, "policy: %s", kve_last_error());
}

/* ---- the arena of a shared layer ---- */

/* Moves cache k's rows to row `to` of the arrays (memmove: they may overlap
 * its rows) and points it there. */
static void move_cache(lm_cache *k, float *key, float *value, int32_t *pos, size_t to, size_t S)
{
    if (k->n) {
        memmove(key + to * S, k->key, k->n * S * sizeof *key);
        memmove(value + to * S, k->value, k->n * S * sizeof *value);
        memmove(pos + to, k->pos, k->n * sizeof *pos);
    }
    k->key = key + to * S;
    k->value = value + to * S;
    k->pos = pos + to;
}

/* C_g after a layout over A rows with `left` rows beyond n_g + extra each. */
static size_t rows_of(const lm_cache *k, size_t g, size_t G, size_t left, size_t extra)
{
    return k->n + extra + left / G + (g < left % G);
}

kve_status lm__arena_reserve(lm_state *s, size_t l, size_t extra)
{
    const lm_config *c = &s->model->config;
    size_t G = (size_t)c->n_kv_heads, S = (size_t)c->head_size;
    lm_cache *ks = &s->cache[l * G];
    lm_arena *a = &s->arena[l];
    size_t need = 0;
    int full = 0;
    for (size_t g = 0; g < G; g++) {
        need += ks[g].n + extra;
        full |= ks[g].n + extra > ks[g].cap;
    }
    if (!full)
        return KVE_OK;
    float *key = a->key, *value = a->value;
    int32_t *pos = a->pos;
    size_t A = a->cap;
    if (need > A) {
        size_t b = s->layer_budget[l] + 1, slack = b / 8 ? b / 8 : 1;
        size_t most = G * (b + slack), grown = A ? 2 * A : G * FIRST_ROWS;
        A = grown < most ? grown : most;
        A = A > need ? A : need;
        key = lm_malloc(&s->alloc, A * S * sizeof *key);
        value = lm_malloc(&s->alloc, A * S * sizeof *value);
        pos = lm_malloc(&s->alloc, A * sizeof *pos);
        if (!key || !value || !pos) {
            lm_free(&s->alloc, key);
            lm_free(&s->alloc, value);
            lm_free(&s->alloc, pos);
            return kve_set_error(KVE_ENOMEM, "decoder: out of memory for layer %zu's cache of %zu keys",
                           l, A);
        }
    }
    /* Lay the layer out over A rows: left-movers in head order, then
     * right-movers in reverse order (into new arrays any order would do). */
    size_t left = A - need, to = 0;
    int fresh = key != a->key;
    for (size_t g = 0; g < G; g++) {
        size_t from = ks[g].cap ? (size_t)(ks[g].pos - a->pos) : 0;
        if (fresh || to <= from)
            move_cache(&ks[g], key, value, pos, to, S);
        to += rows_of(&ks[g], g, G, left, extra);
    }
    for (size_t g = G; g-- > 0;) {
        size_t rows = rows_of(&ks[g], g, G, left, extra);
        to -= rows;
        if (!fresh && to > (size_t)(ks[g].pos - a->pos))
            move_cache(&ks[g], key, value, pos, to, S);
        ks[g].cap = rows;
    }
    if (fresh) {
        lm_free(&s->alloc, a->key);
        lm_free(&s->alloc, a->value);
        lm_free(&s->alloc, a->pos);
        a->key = key;
        a->value = value;
        a->pos = pos;
        a->cap = A;
    }
    return KVE_OK;
}

void lm__arena_free(lm_state *s)
{
    for (size_t l = 0; s->arena && l < (size_t)s->model->config.n_layers; l++) {
        lm_free(&s->alloc, s->arena[l].key);
        lm_free(&s->alloc, s->arena[l].value);
        lm_free(&s->alloc, s->arena[l].pos);
    }
    lm_free(&s->alloc, s->arena);
}

/* ---- the calibration statistic ---- */

typedef struct spread_ctx {
    size_t window, G, R;
    float *row;   /* (T) one KV head's group mean */
    double *sum;  /* (L) */
    size_t *seen; /* (L) */
} spread_ctx;

static void on_spread(void *user, int32_t layer, int32_t pos, const float *att, size_t ld,
                      const size_t *n_keys)
{
    spread_ctx *x = user;
    size_t t = (size_t)pos;
    if (t <= x->window)
        return;
    for (size_t g = 0; g < x->G; g++) {
        lm_group_mean(x->row, att + g * x->R * ld, ld, x->R, n_keys[g]);
        double far = 0;
        for (size_t i = 0; i + x->window < t; i++)
            far += x->row[i];
        x->sum[layer] += far;
        x->seen[layer]++;
    }
}

kve_status lm_layer_spread(const lm_model *m, const int32_t *tokens, size_t n, size_t window,
                           double *out)
{
    if (!m || !tokens || !out)
        return kve_set_error(KVE_EINVAL, "layer spread: NULL argument");
    if (n <= window)
        return kve_set_error(KVE_EINVAL,
                       "layer spread: %zu tokens leave no step beyond a window of %zu", n, window);
    const lm_config *c = &m->config;
    size_t L = (size_t)c->n_layers;
    spread_ctx x = {.window = window, .G = (size_t)c->n_kv_heads,
                    .R = (size_t)(c->n_heads / c->n_kv_heads)};
    x.row = lm_malloc(&m->alloc, (n + 1) * sizeof *x.row);
    x.sum = lm_calloc(&m->alloc, L, sizeof *x.sum);
    x.seen = lm_calloc(&m->alloc, L, sizeof *x.seen);
    lm_options o = {.allocator = &m->alloc, .on_attention = on_spread, .user = &x};
    lm_state *s = NULL;
    kve_status st = x.row && x.sum && x.seen ? lm_state_new(m, &o, &s)
                                             : kve_set_error(KVE_ENOMEM, "layer spread: out of memory");
    int32_t bos = c->bos; /* BOS first, when the model has one */
    for (size_t i = bos < 0; st == KVE_OK && i <= n; i++)
        st = lm_forward(s, i ? tokens[i - 1] : bos);
    if (st == KVE_OK)
        for (size_t l = 0; l < L; l++)
            out[l] = x.sum[l] / (double)x.seen[l];
    lm_state_free(s);
    lm_free(&m->alloc, x.row);
    lm_free(&m->alloc, x.sum);
    lm_free(&m->alloc, x.seen);
    return st;
}
