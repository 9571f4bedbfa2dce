/*
 * trace_impl.h - the kve_trace object shared by trace.c (public entry points
 * and dispatch), trace_canonical.c (the synthetic generator) and npy.c (the
 * .npy reader and writer). Nothing outside those files sees it.
 *
 * Invariants:
 *  - steps >= 1, heads >= 1, layers >= 1, layers divides heads, and
 *    heads * steps * steps fits in 64 bits.
 *  - `source` is owned, NUL-terminated and never NULL.
 *  - Exactly one of `canonical` / `npy` is non-NULL, per `kind`.
 *  - A row function is called with head < heads and t < steps already
 *    checked; it writes row[0 .. t] and nothing else.
 * Memory: O(steps) per trace whatever the source (never a T x T matrix).
 */
#ifndef KVE_TRACE_IMPL_H
#define KVE_TRACE_IMPL_H

#include "internal.h"

typedef struct kve_canonical kve_canonical; /* trace_canonical.c */
typedef struct kve_npy kve_npy;             /* npy.c */

typedef enum kve_trace_kind { KVE_TRACE_CANONICAL, KVE_TRACE_NPY } kve_trace_kind;

struct kve_trace {
    kve_trace_kind kind;
    size_t steps;  /* T */
    size_t heads;  /* L * H */
    size_t layers; /* L */
    char *source;  /* canonical spec or path */
    kve_canonical *canonical;
    kve_npy *npy;
};

/* Parses the parameters of "canonical[:params]" (params may be NULL), builds
 * the generator and fills tr->steps/heads/layers/source/canonical. On failure
 * *tr is unchanged and nothing stays allocated. */
kve_status kve__canonical_open(const char *params, kve_trace *tr);
void kve__canonical_free(kve_canonical *c);
/* Row t of the canonical trace into row[0 .. t]. Never fails. O(t). */
void kve__canonical_row(kve_canonical *c, size_t t, double *row);

/* Opens and validates the .npy file at `path` (flags: KVE_TRACE_NORMALIZE),
 * filling tr->steps/heads/layers/source/npy. On failure *tr is unchanged and
 * nothing stays allocated or open. */
kve_status kve__npy_open(const char *path, unsigned flags, kve_trace *tr);
void kve__npy_free(kve_npy *n);
/* Row t of head `head` into row[0 .. t]. KVE_EIO when the file cannot be
 * read any more (or changed under us, KVE_EFORMAT). O(t). */
kve_status kve__npy_row(kve_npy *n, size_t head, size_t t, double *row);

/* Writes head `head` of `tr` as a [T, T] float32 v1.0 .npy at `path` via a
 * temporary file and rename. */
kve_status kve__npy_write(kve_trace *tr, size_t head, const char *path);

/* Test hook (eval.c): when set, kve_eval calls fn with what each job's
 * policy is about to receive at step pos (kept positions and the attention
 * vector, NULL for "no information"), just before kve_policy_step. Per
 * thread; NULL (the default) disables it. */
typedef void (*kve__eval_attn_fn)(void *user, size_t job, int32_t pos, const int32_t *kept,
                                  const float *attn, size_t n);
void kve__eval_set_attn_hook(kve__eval_attn_fn fn, void *user);

#endif /* KVE_TRACE_IMPL_H */
