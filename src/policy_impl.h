/* SPDX-License-Identifier: MIT */
/*
 * policy_impl.h - the policy object and the function table behind it.
 *
 * Shapes (S = allocated slots, `cap`; n = kept positions, `size`):
 *   pos    int32_t[S]  kept positions, ascending in [0, n)
 *   score  double[S]   eviction key of the scored family (lowest goes first)
 *   mark   uint8_t[S]  eviction scratch: 1 = chosen as a victim, else 0
 *   extra  policy-owned parallel columns (sums, births, vote histories)
 * Every column is a parallel array indexed by kept order; columns move in
 * lockstep (growth, compaction), so no lookup is ever needed on the decode
 * path. Columns a policy does not use are NULL and cost nothing.
 *
 * Invariants between public calls:
 *   - pos[0 .. size) is strictly ascending; every element < last_pos + 1.
 *   - mark[0 .. size) is all zero (marks live only inside one evict call).
 *   - size <= cap; cap >= budget + 1 once constructed.
 *   - recent_window < budget and sinks < budget (checked at construction).
 *
 * One mechanism serves every policy that scores: the public wrapper in
 * policy.c validates once, the type's `observe` updates scores, and
 * kve__evict_marked runs `select` (argmin or random) then one compaction.
 * A new scored policy is a param table plus an observe rule.
 */
#ifndef KVE_POLICY_IMPL_H
#define KVE_POLICY_IMPL_H

#include "internal.h"

#include <stddef.h>

/* The parameters every policy may take. A policy's param table names the
 * subset it accepts; the rest stay at zero. */
typedef struct kve_params {
    size_t budget;        /* positions kept after an eviction */
    size_t recent_window; /* newest kept positions never evicted */
    size_t sinks;         /* streaming: first positions pinned forever */
    size_t history;       /* scissorhands: steps counted (0 = lifetime) */
    double decay;         /* h2o_decay: forgetting factor per observed step */
} kve_params;

enum { KVE_MAX_EXTRA = 2 }; /* policy-owned columns beyond pos/score/mark */

typedef struct kve_policy_type kve_policy_type;

struct kve_policy {
    const kve_policy_type *type;
    kve_params params;
    char spec[KVE_SPEC_MAX]; /* canonical spec */

    size_t size; /* kept positions */
    size_t cap;  /* allocated slots per column */
    int32_t last_pos;
    bool any_pos; /* a position has been admitted; last_pos is meaningful */

    int32_t *pos;   /* (cap) kept order */
    double *score;  /* (cap) or NULL */
    uint8_t *mark;  /* (cap) or NULL */
    void *extra[KVE_MAX_EXTRA];
    size_t extra_elem[KVE_MAX_EXTRA]; /* bytes per slot of each extra column; 0 = unused */

    size_t first_mark; /* lowest marked index, set by select, read by compaction */
    size_t offset;     /* window/streaming: pos starts `offset` slots into its block */
    uint64_t observed; /* number of non-NULL attention steps so far */
    kve_rng rng;       /* private generator, policies that draw only */
};

enum {
    KVE_TYPE_SCORED = 1u,      /* has score and mark columns */
    KVE_TYPE_MARKED = 2u,      /* has a mark column (evicts via select) */
    KVE_TYPE_NEEDS_RNG = 4u,   /* refuses a NULL rng */
    KVE_TYPE_NEVER_EVICTS = 8u /* evict always reports 0 victims */
};

struct kve_policy_type {
    const char *name;
    const char *summary; /* one line: what it keeps */
    const kve_param_def *params;
    size_t n_params;
    unsigned flags;

    /* Cross-parameter checks after parsing; may declare extra columns in
     * extra_elem[] of `p` (whose params are set, storage not yet allocated).
     * NULL: the shared check (recent_window < budget). */
    kve_status (*init)(kve_policy *p);

    /* Score update for a non-NULL attention vector, n == size, every weight
     * finite and >= 0 (already validated). NULL: attention is not read. */
    void (*observe)(kve_policy *p, const float *attn, size_t n);

    /* Initial per-slot state of the position just stored at index i (pos,
     * score = 0 and mark = 0 are already set). NULL: nothing more. */
    void (*admit)(kve_policy *p, size_t i);

    /* Marks n_evict victims among the unprotected slots and sets first_mark.
     * Used by kve__evict_marked. */
    void (*select)(kve_policy *p, size_t n_evict);

    /* Removes n_evict positions (0 < n_evict <= size - floor) and writes them
     * ascending to victims. NULL: kve__evict_marked. */
    void (*evict)(kve_policy *p, size_t n_evict, int32_t *victims);

    /* Makes room for one more position; NULL: the shared geometric growth. */
    kve_status (*reserve)(kve_policy *p);

    /* Per-slot bytes are derived from the columns; slots per budget is
     * cap_for_budget(budget), NULL meaning budget + 1. */
    size_t (*cap_for_budget)(size_t budget);
};

/* Param defs shared by the policy tables, so keys, ranges and docs are
 * spelled once. Every table starts with KVE_DEF_BUDGET (KVE_MAX_BUDGET is
 * public, in kvevict.h). */
#define KVE_DEF_SIZE(key_, def_, lo_, hi_, field_, doc_) \
    {.key = (key_), .kind = KVE_PARAM_SIZE, .idefault = (def_), .imin = (lo_), .imax = (hi_), \
     .offset = offsetof(kve_params, field_), .doc = (doc_)}
#define KVE_DEF_BUDGET \
    KVE_DEF_SIZE("budget", 512, 1, KVE_MAX_BUDGET, budget, "positions kept after an eviction")
#define KVE_DEF_RECENT_WINDOW(def) \
    KVE_DEF_SIZE("recent_window", def, 0, KVE_MAX_BUDGET - 1, recent_window, \
                 "newest kept positions that are never evicted")

/* The registry (registry.c). */
const kve_policy_type *kve__policy_type_find(const char *name);

/* Shared scored mechanism (scored.c). */
kve_status kve__check_recent_window(kve_policy *p);
void kve__select_argmin(kve_policy *p, size_t n_evict);
void kve__evict_marked(kve_policy *p, size_t n_evict, int32_t *victims);

/* Storage (policy.c): reallocates every column to `new_cap` slots, keeping
 * the first `size` slots (from `offset` for pos). All or nothing. */
kve_status kve__policy_resize(kve_policy *p, size_t new_cap);

/* The sliding layout of streaming.c, shared with window.c. */
size_t kve__sliding_cap(size_t budget);
kve_status kve__sliding_reserve(kve_policy *p);
void kve__sliding_evict(kve_policy *p, size_t n_evict, int32_t *victims);

/* Policy tables, one per file under policies/. */
extern const kve_policy_type kve__full_type;
extern const kve_policy_type kve__window_type;
extern const kve_policy_type kve__streaming_type;
extern const kve_policy_type kve__random_type;
extern const kve_policy_type kve__h2o_type;
extern const kve_policy_type kve__scissorhands_type;
extern const kve_policy_type kve__tova_type;
extern const kve_policy_type kve__h2o_decay_type;
extern const kve_policy_type kve__h2o_mean_type;

#endif /* KVE_POLICY_IMPL_H */
