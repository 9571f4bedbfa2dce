/* SPDX-License-Identifier: MIT */
/*
 * trace.c - the decoder's attention as a live trace (lm_trace_new): the
 * full-cache decode of a token sequence, streamed into the harness through
 * kve_trace_from_callback as it is computed, one decode step per trace step.
 *
 * Invariants: `done` is the number of tokens the decoder has consumed since
 * its last reset, so step t of the trace is the attention computed while
 * consuming tokens[t]; a request for step t decodes tokens[done .. t] with
 * the hook writing only during tokens[t], and a request for a step below
 * `done` resets the decoder (lm_state_reset: the same bits again) and
 * decodes from token 0. The rows of step t are exactly those `lm dump`
 * writes (lm_group_mean of each KV head's query heads, or every query head
 * with group 1, over the t + 1 keys of the full cache) and the harness reads
 * them widened to double: the same bits as the dumped .npy file. A decode
 * that fails marks the state broken, so the next request starts over
 * rather than continuing from it.
 *
 * The row cache (options cache_bytes, 0: none): the rows of steps
 * [0, cached) as they were decoded, step s at cache + heads_all * s(s+1)/2,
 * head h's t + 1 floats at + h * (s + 1), for readers that go back (a
 * command reads head after head). A step below `cached` is served from it
 * without decoding; `cached` only grows, in step order, up to cache_steps,
 * the most steps whose triangle fits in cache_bytes. Memory: the decoder's
 * caches (O(L * G * T * S)), the tokens, this handle and the row cache,
 * through the trace options' allocator.
 */
#include "lm.h"

#include <string.h>

typedef struct lm_live {
    kve_allocator alloc; /* the trace options' (copied), for this block and the tokens */
    lm_model *model;     /* owned when own_model */
    int own_model;
    lm_state *state;     /* full cache, the hook below */
    int32_t *tokens;     /* (steps) */
    size_t steps;
    size_t group;        /* query heads averaged per row */
    size_t heads;        /* rows per layer: H / group */
    size_t done;         /* tokens consumed since the last reset */
    int broken;          /* a decode failed: reset before the next */
    float *dst;          /* where the hook writes the current step's rows; NULL: nowhere */
    size_t dst_ld;
    size_t heads_all;    /* L * heads: the rows of a step */
    float *cache;        /* the rows of steps [0, cached); NULL: no cache */
    size_t cache_steps;  /* the steps the cache can hold */
    size_t cached;       /* the steps it holds */
} lm_live;

/* Where step s starts in the row cache. */
static float *cache_step(const lm_live *v, size_t s)
{
    return v->cache + v->heads_all * (s * (s + 1) / 2);
}

static void live_attention(void *user, int32_t layer, int32_t pos, const float *att, size_t ld,
                           const size_t *n_keys)
{
    (void)pos;
    lm_live *v = user;
    if (!v->dst)
        return;
    for (size_t h = 0; h < v->heads; h++)
        lm_group_mean(v->dst + ((size_t)layer * v->heads + h) * v->dst_ld,
                      att + h * v->group * ld, ld, v->group, n_keys[0]);
}

static kve_status live_rows(void *user, size_t t, float *rows, size_t ld)
{
    lm_live *v = user;
    if (t < v->cached) {
        const float *c = cache_step(v, t);
        for (size_t h = 0; h < v->heads_all; h++)
            memcpy(rows + h * ld, c + h * (t + 1), (t + 1) * sizeof *rows);
        return KVE_OK;
    }
    if (t < v->done || v->broken) {
        kve_status st = lm_state_reset(v->state);
        if (st != KVE_OK)
            return st;
        v->done = 0;
        v->broken = 0;
    }
    while (v->done <= t) {
        const size_t s = v->done;
        const int caching = s == v->cached && s < v->cache_steps;
        v->dst = caching ? cache_step(v, s) : s == t ? rows : NULL;
        v->dst_ld = caching ? s + 1 : ld;
        kve_status st = lm_forward(v->state, v->tokens[s]);
        v->dst = NULL;
        if (st != KVE_OK) {
            v->broken = 1;
            return kve_set_error(st, "lm: step %zu: %s", s, kve_last_error());
        }
        v->done++;
        if (caching)
            v->cached = s + 1;
    }
    if (t < v->cached)
        return live_rows(user, t, rows, ld); /* decoded into the cache: copy it out */
    return KVE_OK;
}

static void live_free(void *user)
{
    lm_live *v = user;
    const kve_allocator alloc = v->alloc;
    lm_state_free(v->state);
    if (v->own_model)
        lm_model_free(v->model);
    lm_free(&alloc, v->tokens);
    lm_free(&alloc, v->cache);
    lm_free(&alloc, v);
}

static const kve_trace_callbacks live_callbacks = {.rows = live_rows, .free = live_free};

kve_status lm_trace_new(lm_model *m, const int32_t *tokens, size_t steps,
                        const lm_trace_options *options, kve_trace **out)
{
    if (!m || !tokens || !out)
        return kve_set_error(KVE_EINVAL, "lm trace: NULL argument");
    static const lm_trace_options defaults = {0};
    const lm_trace_options *o = options ? options : &defaults;
    const lm_config *c = &m->config;
    const size_t H = (size_t)c->n_heads, G = (size_t)c->n_kv_heads;
    const size_t group = o->group ? o->group : H / G;
    if (group != 1 && group != H / G)
        return kve_set_error(KVE_EINVAL, "lm trace: group %zu is neither 1 (every query head) "
                             "nor %zu (the KV heads' group)", group, H / G);
    if (steps == 0)
        return kve_set_error(KVE_EINVAL, "lm trace: 0 steps");
    for (size_t t = 0; t < steps; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return kve_set_error(KVE_EINVAL, "lm trace: token %zu is %d, outside the "
                                 "vocabulary [0, %d)", t, (int)tokens[t], (int)c->vocab_size);
    const kve_allocator *a = o->trace ? o->trace->allocator : NULL;
    lm_live *v = lm_calloc(a, 1, sizeof *v);
    int32_t *toks = v ? lm_malloc(a, steps * sizeof *toks) : NULL;
    if (!toks) {
        lm_free(a, v);
        return kve_set_error(KVE_ENOMEM, "lm trace: out of memory for %zu tokens", steps);
    }
    if (a)
        v->alloc = *a;
    memcpy(toks, tokens, steps * sizeof *toks);
    v->tokens = toks;
    v->steps = steps;
    v->group = group;
    v->heads = H / group;
    v->heads_all = (size_t)c->n_layers * v->heads;
    v->model = m;
    /* the most steps s <= steps whose rows, heads_all * s(s+1)/2 floats, fit */
    const size_t floats = o->cache_bytes / sizeof(float);
    size_t fit = 0;
    while (fit < steps && (fit + 1) * (fit + 2) / 2 <= floats / v->heads_all)
        fit++;
    if (fit) {
        v->cache = lm_malloc(a, v->heads_all * (fit * (fit + 1) / 2) * sizeof(float));
        if (!v->cache) {
            lm_free(a, toks);
            lm_free(a, v);
            return kve_set_error(KVE_ENOMEM, "lm trace: out of memory for a row cache of %zu "
                                 "steps", fit);
        }
        v->cache_steps = fit;
    }
    lm_options so = {.allocator = a, .on_attention = live_attention, .user = v};
    kve_status st = lm_state_new(m, &so, &v->state);
    if (st == KVE_OK)
        st = kve_trace_from_callback(&live_callbacks, v, (size_t)c->n_layers, v->heads, steps, 0,
                                     o->trace, out);
    if (st != KVE_OK) {
        lm_state_free(v->state);
        lm_free(a, v->cache);
        lm_free(a, toks);
        lm_free(a, v);
        return st;
    }
    v->own_model = o->own_model; /* the caller keeps the model when this fails */
    return KVE_OK;
}
