/* SPDX-License-Identifier: MIT */
/*
 * trace_callback.c - a live trace whose rows and keys the caller's
 * callbacks produce (kve_trace_from_callback): the source "callback" of
 * trace.c's table.
 *
 * Layout legend: H = heads (layers * heads per layer), T = steps, d =
 * key_dim. The source holds one step of every head: `rows` is [H, T]
 * floats, head h's row of step `at` at rows[h * T], valid over [0, at];
 * `keys` is [H, d], the keys of position `keys_at`. A read of step t of any
 * head is served from the held step when t is the one held, and otherwise
 * asks the callback for step t (every head at once) first, so a reader
 * that goes through the heads of each step in turn (kve_eval) makes one
 * call per step.
 *
 * Invariants: `at` (and `keys_at`) is the held step plus 1, 0 when none is
 * held: a step is held only after the callback succeeded, and a failed
 * call leaves nothing held, so a bad step is asked for again rather than
 * served. Rows are validated when read by kve__trace_check_row, the check
 * of every source of recorded attention, and widened and normalised exactly
 * as trace_memory.c does (the same bits as a memory trace of the same
 * floats). The callback's failures keep its status and message; one that
 * fails without a message gets one naming the step. Memory: the two
 * buffers, blocks of the trace, allocated at creation; reads allocate
 * nothing. The source text "callback" is reserved: kve_trace_open refuses
 * it (a file of that name opens as "./callback").
 */
#include "trace_impl.h"

#include <math.h>
#include <string.h>

static const char CALLBACK_NAME[] = "callback";

typedef struct kve_callback {
    const kve_trace_callbacks *cb; /* borrowed */
    void *user;
    size_t heads, layers, steps, key_dim;
    unsigned flags;
    float *rows;    /* [H, T]: step at - 1 */
    size_t at;      /* the held step + 1; 0: none */
    float *keys;    /* [H, d]: position keys_at - 1; NULL without keys */
    size_t keys_at; /* the held position + 1; 0: none */
    bool busy;      /* a callback is running: reads of this trace are refused */
} kve_callback;

/* A read from inside one of this trace's own callbacks (it would overwrite
 * the step being delivered): refused. */
static kve_status reentered(const char *what, size_t t)
{
    return kve__fail(KVE_EINVAL, "callback: the trace was read (step %zu) from inside its own %s "
                     "callback: a live trace refuses reads while its callbacks run", t, what);
}

/* The callback's status, given a message when it came without one. */
static kve_status callback_failed(kve_status st, const char *what, size_t t)
{
    if (st < KVE_OK || st > KVE_ECANCELED)
        return kve__fail(KVE_EINVAL, "callback: the %s callback returned %d for step %zu, "
                         "which is not a kve_status", what, (int)st, t);
    if (kve_last_error()[0] == '\0')
        return kve__fail(st, "callback: the %s callback failed (%s) for step %zu", what,
                         kve_status_name(st), t);
    return st;
}

static kve_status callback_row(void *impl, size_t head, size_t t, double *row)
{
    kve_callback *c = impl;
    if (c->busy)
        return reentered("rows", t);
    if (c->at != t + 1) {
        c->at = 0;
        kve_set_error(KVE_OK, NULL);
        c->busy = true;
        kve_status st = c->cb->rows(c->user, t, c->rows, c->steps);
        c->busy = false;
        if (st != KVE_OK)
            return callback_failed(st, "rows", t);
        c->at = t + 1;
    }
    const float *src = c->rows + head * c->steps;
    for (size_t i = 0; i <= t; i++)
        row[i] = (double)src[i];
    double sum = 0;
    kve_status st =
        kve__trace_check_row(CALLBACK_NAME, c->heads, c->layers, c->flags, head, t, row, &sum);
    if (st != KVE_OK)
        return st;
    if (c->flags & KVE_TRACE_NORMALIZE)
        for (size_t i = 0; i <= t; i++)
            row[i] /= sum;
    return KVE_OK;
}

static kve_status callback_key(void *impl, size_t head, size_t t, float *key)
{
    kve_callback *c = impl;
    if (c->busy)
        return reentered("keys", t);
    if (c->keys_at != t + 1) {
        c->keys_at = 0;
        kve_set_error(KVE_OK, NULL);
        c->busy = true;
        kve_status st = c->cb->keys(c->user, t, c->keys, c->key_dim);
        c->busy = false;
        if (st != KVE_OK)
            return callback_failed(st, "keys", t);
        for (size_t h = 0; h < c->heads; h++)
            for (size_t i = 0; i < c->key_dim; i++)
                if (!isfinite(c->keys[h * c->key_dim + i]))
                    return kve__fail(KVE_EFORMAT, "callback: head %zu, position %zu: key "
                                     "index %zu is %g (want finite)", h, t, i,
                                     (double)c->keys[h * c->key_dim + i]);
        c->keys_at = t + 1;
    }
    memcpy(key, c->keys + head * c->key_dim, c->key_dim * sizeof *key);
    return KVE_OK;
}

static void callback_free(void *impl)
{
    const kve_callback *c = impl;
    if (c && c->cb->free)
        c->cb->free(c->user);
}

const kve_trace_source_type kve__callback_source = {
    .prefix = CALLBACK_NAME,
    .made_by = "live traces are made by kve_trace_from_callback",
    .row = callback_row,
    .key = callback_key,
    .free = callback_free,
};

kve_status kve_trace_from_callback(const kve_trace_callbacks *cb, void *user, size_t layers,
                                   size_t heads_per_layer, size_t steps, size_t key_dim,
                                   const kve_trace_options *options, kve_trace **out)
{
    if (!cb)
        return kve__fail(KVE_EINVAL, "callback: cb is NULL");
    if (!cb->rows)
        return kve__fail(KVE_EINVAL, "callback: cb->rows is NULL (every live trace needs its "
                         "rows)");
    if (!out)
        return kve__fail(KVE_EINVAL, "callback: out is NULL");
    if (key_dim > KVE_MAX_KEY_DIM)
        return kve__fail(KVE_EINVAL, "callback: key_dim %zu is above KVE_MAX_KEY_DIM (%d)",
                         key_dim, KVE_MAX_KEY_DIM);
    if (key_dim && !cb->keys)
        return kve__fail(KVE_EINVAL, "callback: key_dim %zu, but cb->keys is NULL", key_dim);
    if (!key_dim && cb->keys)
        return kve__fail(KVE_EINVAL, "callback: cb->keys is set, but key_dim is 0 (a trace "
                         "with keys gives their dimension)");
    kve_status st = kve__trace_check_options(options, "callback: ");
    if (st != KVE_OK)
        return st;
    if (layers == 0 || heads_per_layer == 0 || steps == 0)
        return kve__fail(KVE_EINVAL, "callback: shape [%zu, %zu, %zu] (layers, heads per "
                         "layer, steps) has a zero dimension (the trace would be empty)",
                         layers, heads_per_layer, steps);
    if (steps > (size_t)INT32_MAX)
        return kve__fail(KVE_EINVAL, "callback: %zu steps exceed the largest position %d",
                         steps, INT32_MAX);
    /* One step of every head, H * T floats, and the keys, H * d. */
    const size_t cap = SIZE_MAX / sizeof(float);
    if (heads_per_layer > cap / layers || steps > cap / (layers * heads_per_layer) ||
        (key_dim && key_dim > cap / (layers * heads_per_layer)))
        return kve__fail(KVE_EINVAL, "callback: %zu x %zu heads of %zu steps are more than "
                         "memory can hold", layers, heads_per_layer, steps);
    const size_t heads = layers * heads_per_layer;
    kve_trace *tr;
    st = kve__trace_new(options, "callback: ", &tr);
    if (st != KVE_OK)
        return st;
    kve_callback *c = kve__trace_calloc(tr, 1, sizeof *c);
    char *source = kve__trace_malloc(tr, sizeof CALLBACK_NAME);
    float *rows = kve__trace_malloc(tr, heads * steps * sizeof *rows);
    float *keys = key_dim ? kve__trace_malloc(tr, heads * key_dim * sizeof *keys) : NULL;
    if (!c || !source || !rows || (key_dim && !keys)) {
        kve__trace_discard(tr);
        return kve__fail(KVE_ENOMEM, "callback: out of memory for one step of %zu heads of "
                         "%zu steps", heads, steps);
    }
    c->cb = cb;
    c->user = user;
    c->heads = heads;
    c->layers = layers;
    c->steps = steps;
    c->key_dim = key_dim;
    c->flags = options ? (unsigned)options->flags : 0;
    c->rows = rows;
    c->keys = keys;
    memcpy(source, CALLBACK_NAME, sizeof CALLBACK_NAME);
    tr->type = &kve__callback_source;
    tr->impl = c;
    tr->steps = steps;
    tr->heads = heads;
    tr->layers = layers;
    tr->key_dim = key_dim;
    tr->source = source;
    *out = tr;
    return KVE_OK;
}
