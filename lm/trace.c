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
 * that fails leaves `done` at 0 after a reset is asked for, so the next
 * request starts over rather than continuing from a broken state. Memory:
 * the decoder's caches (O(L * G * T * S)), the tokens and this handle,
 * through the trace options' allocator; never T x T.
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
} lm_live;

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
    if (t < v->done || v->broken) {
        kve_status st = lm_state_reset(v->state);
        if (st != KVE_OK)
            return st;
        v->done = 0;
        v->broken = 0;
    }
    while (v->done <= t) {
        v->dst = v->done == t ? rows : NULL;
        v->dst_ld = ld;
        kve_status st = lm_forward(v->state, v->tokens[v->done]);
        v->dst = NULL;
        if (st != KVE_OK) {
            v->broken = 1;
            return kve_set_error(st, "lm: step %zu: %s", v->done, kve_last_error());
        }
        v->done++;
    }
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
    v->model = m;
    lm_options so = {.allocator = a, .on_attention = live_attention, .user = v};
    kve_status st = lm_state_new(m, &so, &v->state);
    if (st == KVE_OK)
        st = kve_trace_from_callback(&live_callbacks, v, (size_t)c->n_layers, v->heads, steps, 0,
                                     o->trace, out);
    if (st != KVE_OK) {
        lm_state_free(v->state);
        lm_free(a, toks);
        lm_free(a, v);
        return st;
    }
    v->own_model = o->own_model; /* the caller keeps the model when this fails */
    return KVE_OK;
}
