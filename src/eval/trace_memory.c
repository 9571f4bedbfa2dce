/* SPDX-License-Identifier: MIT */
/*
 * trace_memory.c - a trace over the caller's float32 attention in memory
 * (kve_trace_from_memory): the source "memory" of trace.c's table.
 *
 * Layout legend: L = layers, H = heads per layer, T = steps. The caller's
 * array is [L, H, T, T] float32 in C order; head h = l*H + j (layer-major),
 * and element (h, t, i) is at data[(h*T + t)*T + i] (indices in 64 bits).
 * Row t of a head is its first t + 1 elements; entries above the diagonal
 * are never read.
 *
 * Invariants: the array is borrowed, never copied or written; the handle is
 * all this source keeps (O(1), whatever T), and a row of T doubles is its
 * scratch while validating, all blocks of the trace (trace_impl.h). Every row is checked at
 * creation by kve__trace_check_row, as a .npy file's rows are when it is
 * opened, and checked again when read (so an array changed since is refused
 * with KVE_EFORMAT instead of feeding a policy bad weights). A row is
 * widened to double element by element and, with KVE_TRACE_NORMALIZE,
 * divided by its sum in double, exactly as npy.c reads a '<f4' file: a
 * memory trace and the .npy file numpy saves from the same array give the
 * same rows bit for bit. The source text "memory" is reserved for these
 * traces; kve_trace_open refuses it (a file of that name opens as
 * "./memory").
 */
#include "trace_impl.h"

#include <string.h>

static const char MEMORY_NAME[] = "memory";

typedef struct kve_memory {
    const float *data; /* [heads, T, T], borrowed */
    size_t steps;      /* T */
    size_t heads;      /* L * H */
    size_t layers;     /* L */
    unsigned flags;
} kve_memory;

static void row_in(const kve_memory *m, size_t h, size_t t, double *row)
{
    const float *src = m->data + ((uint64_t)h * m->steps + t) * m->steps;
    for (size_t i = 0; i <= t; i++)
        row[i] = (double)src[i];
}

static kve_status memory_row(void *impl, size_t head, size_t t, double *row)
{
    const kve_memory *m = impl;
    double sum = 0;
    row_in(m, head, t, row);
    kve_status st =
        kve__trace_check_row(MEMORY_NAME, m->heads, m->layers, m->flags, head, t, row, &sum);
    if (st != KVE_OK)
        return st; /* the caller changed the array since it was checked */
    if (m->flags & KVE_TRACE_NORMALIZE)
        for (size_t i = 0; i <= t; i++)
            row[i] /= sum;
    return KVE_OK;
}

const kve_trace_source_type kve__memory_source = {
    .prefix = MEMORY_NAME,
    .made_by = "in-memory traces are made by kve_trace_from_memory",
    .row = memory_row,
};

/* Checks every row of every head, reading each into `row` ([T] doubles). */
static kve_status validate(const kve_memory *m, double *row)
{
    for (size_t h = 0; h < m->heads; h++)
        for (size_t t = 0; t < m->steps; t++) {
            double sum;
            row_in(m, h, t, row);
            kve_status st =
                kve__trace_check_row(MEMORY_NAME, m->heads, m->layers, m->flags, h, t, row, &sum);
            if (st != KVE_OK)
                return st;
        }
    return KVE_OK;
}

kve_status kve_trace_from_memory(const float *attn, size_t layers, size_t heads_per_layer,
                                 size_t steps, const kve_trace_options *options, kve_trace **out)
{
    if (!attn)
        return kve__fail(KVE_EINVAL, "memory: attn is NULL");
    if (!out)
        return kve__fail(KVE_EINVAL, "memory: out is NULL");
    kve_status st = kve__trace_check_options(options, "memory: ");
    if (st != KVE_OK)
        return st;
    const unsigned flags = options ? (unsigned)options->flags : 0;
    if (layers == 0 || heads_per_layer == 0 || steps == 0)
        return kve__fail(KVE_EINVAL, "memory: shape [%zu, %zu, %zu, %zu] has a zero dimension "
                         "(the trace would be empty)", layers, heads_per_layer, steps, steps);
    if (steps > (size_t)INT32_MAX)
        return kve__fail(KVE_EINVAL, "memory: %zu steps exceed the largest position %d", steps,
                         INT32_MAX);
    /* The array's size in bytes must be addressable: L*H*T*T*4 <= SIZE_MAX. */
    size_t cap = SIZE_MAX / sizeof(float);
    if (heads_per_layer > cap / layers || steps > cap / (layers * heads_per_layer) ||
        steps > cap / (layers * heads_per_layer * steps))
        return kve__fail(KVE_EINVAL, "memory: shape [%zu, %zu, %zu, %zu] is larger than memory "
                         "can hold", layers, heads_per_layer, steps, steps);
    kve_trace *tr;
    st = kve__trace_new(options, "memory: ", &tr);
    if (st != KVE_OK)
        return st;
    kve_memory probe = {attn, steps, layers * heads_per_layer, layers, flags};
    double *row = kve__trace_malloc(tr, steps * sizeof *row);
    if (!row) {
        kve__trace_discard(tr);
        return kve__fail(KVE_ENOMEM, "memory: out of memory for a row of %zu entries", steps);
    }
    st = validate(&probe, row);
    kve__trace_free(tr, row);
    if (st != KVE_OK) {
        kve__trace_discard(tr);
        return st;
    }
    kve_memory *m = kve__trace_malloc(tr, sizeof *m);
    char *source = kve__trace_malloc(tr, sizeof MEMORY_NAME);
    if (!m || !source) {
        kve__trace_discard(tr);
        return kve__fail(KVE_ENOMEM, "memory: out of memory for the trace handle");
    }
    *m = probe;
    memcpy(source, MEMORY_NAME, sizeof MEMORY_NAME);
    tr->type = &kve__memory_source;
    tr->impl = m;
    tr->steps = steps;
    tr->heads = m->heads;
    tr->layers = layers;
    tr->source = source;
    *out = tr;
    return KVE_OK;
}
