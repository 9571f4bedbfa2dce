/* SPDX-License-Identifier: MIT */
/*
 * policy_impl.h - the bank, its heads, and the function table behind every
 * policy.
 *
 * Legend: H = heads of a bank, S0 = slots per head in the slabs (the size at
 * construction), S = slots a head can hold now (cap), n = positions a head
 * keeps (size).
 *
 * A bank is H instances ("heads") of one policy spec. The spec is parsed once
 * into a kve_config that every head shares (type, parameters, canonical spec,
 * column layout); a head holds only what differs per head. A kve_policy is a
 * bank of one head: the public policy API is a thin layer over the same
 * functions, so there is one implementation of every rule.
 *
 * Storage is a structure of arrays, one slab per column across heads:
 *   slab[c]   (H, S0) slots of elem[c] bytes; head h's column c starts at h * S0
 * so one step over every head streams each column once, in order. A head that
 * must hold more than S0 positions (stepped without evicting) moves to a
 * private block of its own; the slabs are freed when the last head has left
 * them (an atomic count, because heads of disjoint ranges may grow in
 * different threads at once).
 *
 * Columns of one head, parallel arrays in kept order:
 *   pos     int32_t   kept positions, ascending
 *   score   double    eviction key of the scored family (lowest goes first)
 *   mark    uint8_t   eviction scratch: 1 = chosen as a victim
 *   extra0  extra1    policy-owned (sums, births, vote histories, unit keys,
 *                     a score rule's state)
 *   raw     double    vnorm=1: the rule's own score (score = raw * vnorm)
 *   vnorm   double    ||v|| of the position's value (vnorm=1, score rules
 *                     that read it)
 *   scratch           per-step scratch of a policy (expected_attention's
 *                     logits, a score rule's output buffers): never read
 *                     across calls, so never closed up
 *   row     float     a score rule's reduced attention row (scratch too)
 * Columns a policy does not use have elem 0 and cost nothing. A policy may
 * also own aux_bytes of scratch per head (keydiff's sum of unit keys,
 * expected_attention's query buffer and statistics), one slab for every
 * head, allocated with the bank and never moved; it holds plain bytes (no
 * pointers), so it can be copied as it is.
 *
 * Lazy compaction. Removing a single victim at index g closes the hole in
 * pos at once (positions stay a plain array for kve_*_positions) but leaves
 * it open in the lazy columns (score, extra0, extra1, raw, vnorm): they then
 * hold n + 1 entries, entry g stale, and gap = g. The next observe pass reads slot i
 * from i + (i >= g) and writes it to i, so the hole closes inside the pass
 * that updates the scores anyway; anything else that reads the lazy columns
 * first closes it with kve__close_gap.
 *
 * Invariants between public calls, per head:
 *   - pos[0 .. size) strictly ascending, every element <= last_pos;
 *   - mark[0 .. cap) all zero (marks live only inside one evict call);
 *   - size <= cap, and size + 1 <= cap while gap != KVE_NONE;
 *   - gap == KVE_NONE or gap < size;
 *   - best == KVE_NONE, or (only between a step and the next evict) the
 *     lowest index of the lowest score among the unprotected slots
 *     [0, size - recent_window);
 *   - recent_window < budget and sinks < budget (checked when parsed).
 */
#ifndef KVE_POLICY_IMPL_H
#define KVE_POLICY_IMPL_H

#include "internal.h"
#include "kernels.h"

#include <stdatomic.h>
#include <stddef.h>

/* The parameters every policy may take. A policy's param table names the
 * subset it accepts; the rest stay at zero. */
typedef struct kve_params {
    size_t budget;        /* positions kept after an eviction */
    size_t recent_window; /* newest kept positions never evicted */
    size_t sinks;         /* streaming: first positions pinned forever */
    size_t history;       /* scissorhands: steps counted (0 = lifetime) */
    double decay;         /* h2o_decay: forgetting factor per observed step */
    size_t block;         /* pages of `block` aligned positions, evicted whole (1: none) */
    size_t block_mean;    /* 1: a page scores the mean of its slots, 0: their sum */
    size_t vnorm;         /* 1: score * ||v|| (the scored policies, kvevict.h);
                             2: CriticalKV (score + epsilon) * ||v||_1, two stages */
    double first_stage;   /* vnorm=2: the budget's fraction kept by the score alone */
    /* expected_attention (policies/expected_attention.c) */
    size_t n_future;      /* n_future_positions: the rotation averaged over them */
    size_t covariance;    /* use_covariance */
    double epsilon;       /* added to the score before the value norm (also vnorm=2's) */
    size_t interval;      /* steps between rescorings */
    size_t n_queries;     /* queries of the statistics (the newest steps) */
    size_t future_from_buffer; /* 1: future positions from the buffer's length (kvpress) */
    size_t query_stats;   /* 1: the caller's statistics (kve_bank_query_stats), no ring */
    /* h2o_mean (policies/h2o_mean.c) */
    size_t diagonal;      /* 1: a prefill seeds each mean with its own query's weight */
} kve_params;

enum {
    KVE_COL_POS,
    KVE_COL_SCORE,
    KVE_COL_MARK,
    KVE_COL_EXTRA0,
    KVE_COL_EXTRA1,
    KVE_COL_RAW,
    KVE_COL_VNORM,
    KVE_COL_SCRATCH,
    KVE_COL_ROW,
    KVE_NCOLS
};

/* Whether column k is lazy: closed up at the next pass (see the top). */
#define KVE_COL_LAZY(k) ((k) != KVE_COL_POS && (k) != KVE_COL_MARK && (k) < KVE_COL_SCRATCH)

typedef struct kve_policy_type kve_policy_type;
typedef struct kve_config kve_config;
typedef struct kve_head kve_head;

/* The fused observe pass of a scored policy (observe.inc): updates every slot
 * of h from `in` (validated: finite, >= 0, unless the config is unchecked),
 * closes h's pending gap, and returns the lowest index of the lowest new
 * score among [0, limit) (limit <= size), KVE_NONE when limit is 0 and an
 * index below limit otherwise, whatever the weights were (kve__amin_index).
 * One entry per instruction set; every entry gives bit-identical results on
 * valid weights. */
typedef size_t (*kve_observe_fn)(const kve_config *c, kve_head *h, const kve_rows *in,
                                 size_t limit);

/* A score rule's passes: the plain one and the one of vnorm=1 (which keeps
 * the rule's score in the raw column and stores raw * vnorm as the score). */
typedef struct kve_lane {
    kve_observe_fn fn[KVE_ISA_COUNT];
    kve_observe_fn vn[KVE_ISA_COUNT];
} kve_lane;

#if KVE_X86
#define KVE_OBSERVE_TABLE(P) {P##_observe_kv1, P##_observe_kv4, P##_observe_kv8}
#define KVE_OBSERVE_VN_TABLE(P) {P##_observe_vn_kv1, P##_observe_vn_kv4, P##_observe_vn_kv8}
#else
#define KVE_OBSERVE_TABLE(P) {P##_observe_kv1, P##_observe_kv1, P##_observe_kv1}
#define KVE_OBSERVE_VN_TABLE(P) {P##_observe_vn_kv1, P##_observe_vn_kv1, P##_observe_vn_kv1}
#endif
/* The kve_lane of the rule observe.inc built with prefix P. */
#define KVE_LANE(P) {KVE_OBSERVE_TABLE(P), KVE_OBSERVE_VN_TABLE(P)}

/* What a step hands one head besides attention (bank.c, from kve_step_data):
 * each pointer validated (finite) or NULL. */
typedef struct kve_head_in {
    int32_t pos;           /* the position being admitted */
    const float *key;      /* (key_dim) or NULL */
    const float *queries;  /* (query_group, ld_queries) or NULL */
    size_t ld_queries;
    const float *value;    /* (value_dim) or NULL */
    double vnorm;          /* ||value|| when the policy keeps a vnorm column, else 0 */
    unsigned flags;        /* KVE_STEP_* */
} kve_head_in;

/* Everything parsed from the spec, and the construction options; shared by
 * every head of a bank. */
struct kve_config {
    const kve_policy_type *type;
    kve_params params;
    char spec[KVE_SPEC_MAX]; /* canonical spec */
    size_t key_dim;          /* d: floats of every key a step carries; 0 = none */
    bool unchecked;          /* steps skip the validation of attention weights */
    size_t value_dim;        /* floats of every value a step carries; 0 = none */
    size_t query_group;      /* G: queries a step carries per KV head (>= 1) */
    kve_rope rope;           /* the model's rotary embedding (kvevict.h); its
                                freq_factors pointer is always NULL here: */
    size_t rope_nff;         /* 0, or the rope's freq_factors, copied: r/2 of them */
    float rope_ff[KVE_ROPE_MAX_FACTORS];
    kve_reads reads;         /* what a step must carry (the type's and the spec's) */
    size_t elem[KVE_NCOLS];  /* bytes per slot of each column; 0 = not stored */
    size_t unit[KVE_NCOLS];  /* bytes of one scalar of each column (1, 2, 4 or 8; a slot
                                holds elem / unit of them): how an image writes it */
    size_t slot_bytes;       /* sum of elem[] */
    size_t aux_bytes;        /* per-head scratch of the policy; 0 = none */
    struct {                 /* the parts of aux that are state (an image writes them, in
                                order): `bytes` bytes at `offset`, scalars of `unit` bytes
                                (1, 2, 4 or 8); bytes 0 = none (keydiff's sum is not) */
        size_t offset, bytes, unit;
    } aux_state[2];
    size_t cap0;             /* S0: slots per head at construction */
    const kve_lane *lane;    /* the attention rule's passes (the type's, or init's
                                choice); NULL if it reads no attention */
    const kve_observe_fn *observe; /* (KVE_ISA_COUNT) lane->fn or, vnorm=1, lane->vn */
    /* The eviction: the type's, or the page eviction when block > 1 (which
     * removes at least n_evict positions, in whole pages, and returns how
     * many); NULL: the marked path (select, then compaction). */
    size_t (*evict)(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims);
};

/* The state of one head. A kve_head is about 190 bytes; per-slot state lives
 * in the columns. */
struct kve_head {
    void *col[KVE_NCOLS]; /* column c: (cap) slots of elem[c] bytes, kept order */
    size_t size;          /* n, kept positions */
    size_t cap;           /* S, slots per column */
    size_t offset;        /* sliding layout: col[POS] starts `offset` slots into its block */
    size_t gap;           /* KVE_NONE, or the hole in the lazy columns (see above) */
    size_t best;          /* KVE_NONE, or the cached victim of a one-victim evict */
    void *block;          /* the private block when the head left the slabs, else NULL */
    void *spare;          /* a block allocated for growth, not yet committed */
    uint64_t observed;    /* number of informative (non-NULL) steps so far */
    kve_rng rng;          /* private generator, policies that draw only */
    uint64_t seed;        /* ... and the seed it started from (a reset starts it again) */
    void *aux;            /* (aux_bytes) the policy's per-head scratch, or NULL */
    size_t picked;        /* a shared eviction's scratch: victims marked in this head */
    size_t pick_first;    /* ... the lowest marked index */
    size_t pick_cur;      /* ... and the next candidate, KVE_NONE when none */
    int32_t last_pos;
    bool any_pos;         /* a position has been admitted; last_pos is meaningful */
};

/* A shared-budget group: `share` consecutive heads whose storage is one
 * region per column (group.c). Head j of the group owns the slots
 * [off_j, off_j + cap_j) of every column, heads in order, off_0 = 0. */
typedef struct kve_group {
    void *base[KVE_NCOLS]; /* column c of the group: (cap) slots; NULL if unused */
    size_t cap;            /* slots per column, all the group's heads together */
    void *block;           /* the private block after growth; NULL: the slabs */
    void *spare;           /* a block allocated for growth, not yet committed */
    size_t spare_cap;      /* ... of this many slots */
    bool relayout;         /* set by a step's checks: some head is full, room is left */
} kve_group;

struct kve_bank {
    kve_config cfg;
    kve_allocator alloc;      /* every byte of the bank: the constructor's, copied */
    size_t handle_bytes;      /* the allocation holding the bank, its heads and groups */
    size_t n_heads;
    bool is_policy;           /* a kve_policy: messages do not name the head */
    void *slab[KVE_NCOLS];    /* (H, S0) slots per column, NULL once every head left */
    void *aux;                /* (H, aux_bytes) per-head scratch, or NULL */
    atomic_size_t slab_users; /* heads whose columns still live in the slabs */
    kve_head *heads;          /* (H), in the same allocation as the bank */
    size_t share;             /* heads per shared-budget group; 0: none */
    double min_share;         /* the floor of a shared eviction (kvevict.h) */
    bool same_positions;      /* every head keeps the same positions (kvevict.h) */
    kve_group *groups;        /* (H / share), in the same allocation; NULL if share is 0 */
};

/* The re-entry guard (kvevict.h, "Calls from callbacks"): while an
 * operation of a bank runs code of the caller's (a score rule's observe, its
 * allocator), every call into that bank from the same thread is refused. The
 * operations running on a thread are a stack of frames on its callers'
 * stacks; a frame costs a thread-local read and write. A frame holds what
 * the refusal names, so that a refusal never reads the bank: it may be half
 * built (its allocator runs during its construction, a clone's or a load's)
 * or half released (during its free). */
typedef struct kve_frame {
    const kve_bank *bank;
    const char *name; /* the policy's name */
    bool policy;      /* the bank is a policy's */
    bool source;      /* the bank is read by a copy whose destination's allocator runs */
    const struct kve_frame *up;
} kve_frame;

/* Pushes a frame for b, or refuses (KVE_EINVAL naming `call`) when b's
 * callbacks are running on this thread. */
kve_status kve__enter(kve_frame *f, const kve_bank *b, const char *call);
/* Pushes a frame for a bank being built (its handle just allocated, not yet
 * initialised), whose callbacks cannot be running. */
void kve__enter_new(kve_frame *f, const kve_bank *b, const char *name, bool policy);
/* kve__enter for the source of a copy: read while the destination's
 * allocator runs, so refusing every call too (a step could move what the
 * copy is sized by). */
kve_status kve__enter_source(kve_frame *f, const kve_bank *b, const char *call);
/* Pops the frame kve__enter pushed. */
void kve__leave(const kve_frame *f);
/* kve__enter's refusal without the frame: for calls that run no callback. */
kve_status kve__check_idle(const kve_bank *b, const char *call);

/* A policy is a bank of one head, allocated together. */
struct kve_policy {
    kve_bank bank;
    kve_head head;
};

enum {
    KVE_TYPE_SCORED = 1u,      /* has score and mark columns, observe and select */
    KVE_TYPE_MARKED = 2u,      /* has a mark column (evicts via select) */
    KVE_TYPE_NEEDS_RNG = 4u,    /* refuses a NULL rng */
    KVE_TYPE_NEVER_EVICTS = 8u, /* evict always reports 0 victims */
    KVE_TYPE_READS_KEYS = 16u,  /* scored from keys (step_keys), not attention */
    KVE_TYPE_ATTN_SCORE = 32u,  /* the score is attention received: prefill seeds it */
    KVE_TYPE_READS_QUERIES = 64u, /* step_keys reads the queries too */
    KVE_TYPE_VNORM = 128u       /* takes the spec key vnorm (reads values when it is 1) */
};

/* KVE_READS_* of a type (kvevict.h). */
kve_reads kve__type_reads(const kve_policy_type *t);

struct kve_policy_type {
    const char *name;
    const char *summary; /* one line: what it keeps */
    const kve_param_def *params;
    size_t n_params;
    unsigned flags;

    /* Cross-parameter checks after parsing; may declare extra columns in
     * c->elem[KVE_COL_EXTRA0/1]. NULL: the shared check (recent_window <
     * budget). */
    kve_status (*init)(kve_config *c);

    /* Score update of the scored family, per instruction set, plain and
     * with vnorm (the config's default; init may choose another rule). NULL
     * for the policies that do not read attention. */
    const kve_lane *lane;

    /* The step of a policy that reads keys (KVE_TYPE_READS_KEYS), called
     * before position n = h->size is admitted, with its key (in->key,
     * key_dim floats, validated: finite) and what else the step carries
     * (queries and the value's norm, validated when the policy reads them):
     * closes h's gap, writes slot n's score and policy columns, updates the
     * other scores as the rule says, and returns the lowest index of the
     * lowest score among [0, limit), limit <= n + 1 (the newcomer is slot n),
     * KVE_NONE when limit is 0. The bank stores slot n's vnorm column
     * afterwards. */
    size_t (*step_keys)(const kve_config *c, kve_head *h, const kve_head_in *in, size_t limit,
                        kve_isa isa);

    /* For a rule whose update can fail (a score rule): called for every head
     * of a step's range with attention, after validation and growth and
     * before any head is stepped; computes the head's new scores into its
     * scratch columns, which observe then commits. On a status other than
     * KVE_OK the step is refused (the message set, naming `head` unless it
     * is KVE_NONE: a policy), every head unchanged. NULL: the rule cannot
     * fail. */
    kve_status (*prepare)(const kve_config *c, kve_head *h, const kve_rows *in, size_t head);

    /* The registry's data of a type registered at run time (a score rule);
     * NULL for the built-in types. */
    const void *data;

    /* Initial per-slot state of the position just stored at index i (pos,
     * score = 0 and mark = 0 are already set). NULL: nothing more. */
    void (*admit)(const kve_config *c, kve_head *h, size_t i);

    /* Marks n_evict victims among the unprotected slots and returns the
     * lowest marked index. Used by the marked eviction path. */
    size_t (*select)(const kve_config *c, kve_head *h, size_t n_evict);

    /* Removes n_evict positions (0 < n_evict <= size - floor) and writes them
     * ascending to victims; returns n_evict. NULL: the marked path (select,
     * then compaction). */
    size_t (*evict)(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims);

    /* Slots per head for `budget`; NULL: budget + 1. */
    size_t (*cap_for_budget)(size_t budget);

    /* Whether a head read from an image (image.c) holds a state the rule can
     * be in, beyond the checks every policy gets (positions strictly
     * ascending, >= 0 and <= last_pos; scores finite, and >= 0 for the
     * KVE_TYPE_ATTN_SCORE policies): the invariants of the policy's own
     * columns and of its score (h2o_mean: score = sum / steps). On false,
     * msg (cap bytes) names the field and slot ("votes[3] ..."). The head's
     * columns are dense (no gap). NULL: nothing more to check. */
    bool (*check_state)(const kve_config *c, const kve_head *h, char *msg, size_t cap);

    /* A KVE_PREFILL_H2O prefill (every row of an n-token prompt read) of
     * a policy whose score is the mean weight a position received (h2o_mean
     * with diagonal=1: kvpress's ObservedAttentionPress). prefill_mean:
     * whether c's heads are seeded so (NULL: never; the slots then start as
     * admitted, or from the column sum for KVE_TYPE_ATTN_SCORE). When it is
     * true the prefill reduces each row's group in double (no float32
     * rounding), ranks position i of column sum col (queries i .. n-1, i's
     * own included) by prefill_rank, and, after admit, calls prefill_seed
     * for the slot that keeps i: it writes the policy's columns (and may
     * set h->observed) and returns the slot's score before any vnorm. */
    bool (*prefill_mean)(const kve_config *c);
    double (*prefill_rank)(const kve_config *c, size_t i, size_t n, double col);
    double (*prefill_seed)(const kve_config *c, kve_head *h, size_t slot, size_t i, size_t n,
                           double col);
};

/* Declares policy column k (KVE_COL_EXTRA0/1) from a type's init: `count`
 * scalars of `unit` bytes a slot (1, 2, 4 or 8), so that an image writes
 * each scalar in little-endian order. A column whose elem is 1, 2, 4 or 8
 * bytes and declares no unit is one scalar of that size. */
static inline void kve__column(kve_config *c, int k, size_t count, size_t unit)
{
    c->elem[k] = count * unit;
    c->unit[k] = unit;
}

/* The operands of a score rule that reads and writes the score column only
 * (h2o, tova): a policy file names them as its P_ctx and P_prep. */
typedef struct kve_score_ctx {
    double *score;
} kve_score_ctx;

KVE_ALWAYS_INLINE void kve__score_prep(kve_score_ctx *x, const kve_config *c, kve_head *h)
{
    (void)c;
    x->score = h->col[KVE_COL_SCORE];
}

/* Param defs shared by the policy tables, so keys, ranges and docs are
 * spelled once. Every table starts with KVE_DEF_BUDGET (KVE_MAX_BUDGET is
 * public, in kvevict.h); the scored tables end with KVE_DEF_PAGES and
 * KVE_DEF_VNORM, window and streaming with KVE_DEF_BLOCK. These keys are
 * spelled in a canonical spec only when set (KVE_PARAM_OMIT_DEFAULT). */
#define KVE_DEF_SIZE(key_, def_, lo_, hi_, field_, doc_) \
    {.key = (key_), .kind = KVE_PARAM_SIZE, .idefault = (def_), .imin = (lo_), .imax = (hi_), \
     .offset = offsetof(kve_params, field_), .doc = (doc_)}
#define KVE_DEF_BUDGET \
    KVE_DEF_SIZE("budget", 512, 1, KVE_MAX_BUDGET, budget, "positions kept after an eviction")
#define KVE_DEF_RECENT_WINDOW(def) \
    KVE_DEF_SIZE("recent_window", def, 0, KVE_MAX_BUDGET - 1, recent_window, \
                 "newest kept positions that are never evicted")
#define KVE_DEF_BLOCK \
    {.key = "block", .kind = KVE_PARAM_SIZE, .idefault = 1, .imin = 1, .imax = KVE_MAX_BUDGET, \
     .flags = KVE_PARAM_OMIT_DEFAULT, .offset = offsetof(kve_params, block), \
     .doc = "page size: aligned pages of block positions are evicted whole"}
#define KVE_DEF_PAGES \
    KVE_DEF_BLOCK, \
    {.key = "block_mean", .kind = KVE_PARAM_SIZE, .idefault = 0, .imin = 0, .imax = 1, \
     .flags = KVE_PARAM_OMIT_DEFAULT, .offset = offsetof(kve_params, block_mean), \
     .doc = "1: a page scores the mean of its positions' scores, 0: their sum"}
#define KVE_DEF_VNORM \
    {.key = "vnorm", .kind = KVE_PARAM_SIZE, .idefault = 0, .imin = 0, .imax = 2, \
     .flags = KVE_PARAM_OMIT_DEFAULT, .offset = offsetof(kve_params, vnorm), \
     .doc = "1: the score times the norm of the position's value; 2: CriticalKV"}, \
    {.key = "epsilon", .kind = KVE_PARAM_REAL, .rdefault = KVE_CRITICAL_EPSILON, .rmin = 0.0, \
     .rmax = 1e6, .flags = KVE_PARAM_OMIT_DEFAULT, .offset = offsetof(kve_params, epsilon), \
     .doc = "vnorm=2: added to the score before the value norm"}, \
    {.key = "first_stage", .kind = KVE_PARAM_REAL, .rdefault = 0.5, .rmin = 0.0, .rmax = 1.0, \
     .flags = KVE_PARAM_OMIT_DEFAULT, .offset = offsetof(kve_params, first_stage), \
     .doc = "vnorm=2: fraction of the budget chosen by the score alone"}
/* vnorm=2's epsilon by default (kvpress's CriticalKVPress). */
#define KVE_CRITICAL_EPSILON 1e-4

/* The registry (registry.c): the built-in types, then the score rules
 * registered at run time (rules.c). kve__policy_type_find returns the type
 * of `name` holding it: a registered rule cannot be unregistered until
 * kve__type_release; NULL (no hold) for an unknown name. Holds of a built-in
 * type cost nothing. */
const kve_policy_type *kve__policy_type_find(const char *name);
void kve__type_release(const kve_policy_type *t);
/* Another hold of t (a config copied into a new object). */
void kve__type_hold(const kve_policy_type *t);
/* The built-in type of `name` (no hold needed), or NULL. */
const kve_policy_type *kve__builtin_type(const char *name);
/* rules.c: the registered type of `name` with a hold, NULL if none; the
 * release of such a hold, another one; whether the rule reads ||v||. */
const kve_policy_type *kve__rule_find(const char *name);
void kve__rule_release(const kve_policy_type *t);
void kve__rule_hold(const kve_policy_type *t);
bool kve__rule_reads_values(const kve_policy_type *t);

/* Configuration (config.c): parses `spec` (with `key` set to `value` when key
 * is not NULL) into *c for the model facts of `o` (NULL: the defaults, no
 * keys), runs the type's checks and sets the column layout. On success c
 * holds its type (kve__type_release(c->type) when c is dropped without an
 * object taking it over); on failure it holds nothing. */
kve_status kve__config_parse(const char *spec, const char *key, const char *value,
                             const kve_policy_options *o, kve_config *c);
/* What every constructor checks first: `out` (the caller's out argument) is
 * not NULL, the options are valid (NULL: the defaults), the spec parses, a
 * policy that draws has a generator and one that reads keys, queries or
 * values has their dimensions. On success c holds its type (the object
 * built from it releases it when freed). */
/* Its two halves, for image.c: the options' model facts (value_dim,
 * query_group, rope; key_dim is the caller's), and what a parsed config
 * needs of them and of rng to be stepped at all. */
kve_status kve__check_facts(const kve_policy_options *o);
kve_status kve__check_needs(const kve_config *c, const kve_rng *rng);
/* r with its zero scaling fields read as their defaults (kve_rope). */
kve_rope kve__rope_effective(const kve_rope *r);
kve_status kve__config_new(const char *spec, const kve_rng *rng,
                           const kve_policy_options *options, const void *out, kve_config *c);

/* Banks (bank.c). kve__bank_create allocates and builds a bank of n_heads
 * heads from a parsed config and options that passed kve__bank_check_options
 * (share, min_share), through alloc (a resolved copy, kve__allocator); it is
 * kve_bank_new_ex past its checks, and kve__policy_create (policy.c) is
 * kve_policy_new_ex's. Both take over the caller's hold of c->type
 * (kve__config_parse's, or kve__type_hold's): the object owns it on
 * success, and it is released on failure. On failure *out and rng are
 * untouched. */
kve_status kve__bank_check_options(const kve_config *c, size_t n_heads,
                                   const kve_bank_options *o);
kve_status kve__bank_create(const kve_config *c, size_t n_heads, kve_rng *rng,
                            const kve_bank_options *o, const kve_allocator *alloc,
                            kve_bank **out);
kve_status kve__policy_create(const kve_config *c, kve_rng *rng, const kve_allocator *alloc,
                              kve_policy **out);

/* kve__bank_init builds b (already allocated, with `heads`
 * storage for n_heads, and `groups` for n_heads / share when opt->share)
 * from a parsed config and checked options (opt may be NULL: no sharing):
 * the allocator (a resolved copy, kve__allocator), slabs, heads, groups,
 * generators. On failure nothing is left allocated and rng is not
 * advanced. kve__bank_release frees what init and growth allocated (not the
 * handle). */
kve_status kve__bank_init(kve_bank *b, const kve_config *c, const kve_allocator *alloc,
                          size_t n_heads, kve_head *heads, const kve_bank_options *opt,
                          kve_group *groups, kve_rng *rng);
void kve__bank_release(kve_bank *b);
/* n more heads have left the slabs; the last to leave frees them. */
void kve__bank_leave_slabs(kve_bank *b, size_t n);

enum { KVE_BLOCK_ALIGN = 64 }; /* columns of a private block start on cache lines */
/* Byte offsets of each column in a private block of `cap` slots; returns the
 * block's size. cap is at most SIZE_MAX / 64 (checked by the callers). */
size_t kve__block_layout(const kve_config *c, size_t cap, size_t off[KVE_NCOLS]);
/* The size of that block: what it is allocated and freed with. */
size_t kve__block_bytes(const kve_config *c, size_t cap);

/* A private block of `cap` slots for a head or a group of b (its size is
 * kve__block_bytes(&b->cfg, cap)); KVE_ENOMEM, naming the slots, when it
 * cannot be had. */
kve_status kve__block_alloc(const kve_bank *b, size_t cap, void **out);
/* Moves head h (not in a shared group) into `block` of `cap` slots, which
 * it then owns: its old block is freed, or it leaves the slabs. keep: its
 * contents move with it (its gap closed first); else they are dropped and
 * the head holds nothing. The marks of the block are zeroed either way. */
void kve__head_adopt(kve_bank *b, kve_head *h, void *block, size_t cap, bool keep);

/* Fails with "NAME: head H: message" ("NAME: message" for a policy). Out of
 * line and cold, so the checks of the decode path stay small. */
kve_status kve__head_fail(const kve_bank *b, kve_status st, size_t head, const char *fmt, ...)
    KVE_PRINTF(4, 5) KVE_COLD;

/* Shared-budget groups (group.c), for the groups [g0, g0 + n) of a step's
 * range. prepare: after validation, decides per group whether a full head
 * needs the group re-laid out in place or the group needs a bigger block
 * (allocated now, all or nothing). commit: carries that out; cannot fail. */
kve_status kve__groups_prepare(kve_bank *b, size_t g0, size_t n);
void kve__groups_commit(kve_bank *b, size_t g0, size_t n);
/* For callers that then write every head of group gi (copy, load, reset):
 * points the heads at consecutive parts of the group's storage without
 * moving their contents. place: head j gets as many slots as like[j] has,
 * the last head also what is left (the like[j] add up to at most the
 * group's slots). even: head j gets
 * its size + 1 slots and an even share of the rest, as a re-layout gives
 * (the caller has set every head's size; their sizes + 1 add up to at most
 * the group's slots).
 * adopt: the group moves into `block` of `cap` slots (marks zeroed), its old
 * block freed or the slabs left; its heads must be placed afterwards. */
void kve__group_place(kve_bank *b, size_t gi, const kve_head *like);
void kve__group_even(kve_bank *b, size_t gi);
void kve__group_adopt(kve_bank *b, size_t gi, void *block, size_t cap);
/* kve_bank_evict_shared past its range check. */
kve_status kve__bank_evict_shared(kve_bank *b, size_t first, size_t count, size_t budget,
                                  int32_t *victims, size_t ld_victims, size_t *counts);

/* The checked halves of a step and an evict on heads [first, first + count),
 * once the bank API has checked its own arguments; and the same for the one
 * head of a policy (b = &p->bank; the message names the capacity "cap"),
 * the same code compiled for one head: the policy API's plain step is
 * kve__policy_step. kve__bank_step_data is the step with queries, values
 * and flags (kve_bank_step_data, kve_policy_step_data); kve__bank_step the
 * one of kve_bank_step_range, without them. */
kve_status kve__bank_step_data(kve_bank *b, size_t first, size_t count, int32_t pos,
                               const kve_step_data *d);
kve_status kve__bank_step(kve_bank *b, size_t first, size_t count, int32_t pos,
                          const float *attn, size_t ld, size_t group, kve_reduce reduce,
                          const float *keys, size_t ld_keys);
kve_status kve__bank_evict(kve_bank *b, size_t first, size_t count, size_t budget,
                           int32_t *victims, size_t ld_victims, size_t *counts);
kve_status kve__policy_step(kve_bank *b, int32_t pos, const float *attn, size_t n,
                            const float *key);
kve_status kve__policy_evict(kve_bank *b, size_t budget, int32_t *victims, size_t cap,
                             size_t *n_victims);

/* Pages (pages.c). The smallest budget an eviction in whole pages can always
 * reach: no more than that many kept positions can be unevictable (kvevict.h,
 * "Pages"). 0 without pages (block 1). */
size_t kve__page_reserve(const kve_config *c);
/* KVE_EINVAL, naming the budget, when budget < kve__page_reserve(c). */
kve_status kve__check_pages(const kve_config *c, size_t budget);

/* Shared scored mechanism (scored.c). */
kve_status kve__check_recent_window(kve_config *c);
size_t kve__select_argmin(const kve_config *c, kve_head *h, size_t n_evict);
/* The combined score of slot i of heads[0 .. nh) (dense score columns): the
 * heads' scores added in head order, in double, from head 0's (nh = 1: the
 * score itself). The key of a same_positions bank's eviction (kvevict.h). */
static inline double kve__slot_sum(const kve_head *heads, size_t nh, size_t i)
{
    double s = ((const double *)heads[0].col[KVE_COL_SCORE])[i];
    for (size_t h = 1; h < nh; h++)
        s += ((const double *)heads[h].col[KVE_COL_SCORE])[i];
    return s;
}
/* The lowest index of the lowest combined score among the slots [0, limit)
 * of heads[0 .. nh) that `mark` (NULL: none) does not mark; KVE_NONE when
 * there is none. One pass over the nh score columns. */
size_t kve__combined_argmin(const kve_head *heads, size_t nh, size_t limit, const uint8_t *mark);
/* kve__select_argmin by the combined score of heads[0 .. nh), marking h (one
 * of them, or heads itself with nh = 1); returns the lowest marked index. */
size_t kve__mark_argmin(const kve_config *c, kve_head *h, const kve_head *heads, size_t nh,
                        size_t n_evict);
size_t kve__evict_marked(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims);
size_t kve__evict_scored(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims);
/* vnorm=2 (CriticalKV, scored.c): the norm kept for a value of c->value_dim
 * floats, the mean over the query_group equal parts of their L1 norms (each
 * summed in double, in order); with vnorm=1, kve__key_norm (L2). */
double kve__value_norm(const kve_config *c, const float *v);
/* vnorm=2's eviction (c->evict): of the candidates (all but the newest
 * recent_window), the max(0, floor(first_stage * B) - recent_window) of
 * highest raw score (B = size - n_evict; ties: the lower position) are kept
 * by stage one; the victims are the n_evict others of lowest (raw +
 * epsilon) * vnorm (ties: the lower position). Scratch: the head's aux, a
 * heap of budget entries. O(n log B + n_evict n). */
size_t kve__evict_critical(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims);
/* Removes the marked slots of h (the first at index `first`), writing their
 * positions ascending to victims and clearing the marks; returns how many. */
size_t kve__compact_marked(const kve_config *c, kve_head *h, size_t first, int32_t *victims);
/* Removes the one slot v (pos closed at once, the lazy columns left open at
 * v: the gap of policy_impl.h). */
void kve__evict_one(kve_head *h, size_t v, int32_t *victims);
/* Evict in whole pages (pages.c): the scored policies lowest page score
 * first, window and streaming the oldest page first, until at least n_evict
 * positions are gone; return how many went (< n_evict + block). */
size_t kve__evict_pages(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims);
/* The selection of kve__evict_pages, by the combined scores of heads[0 ..
 * nh) (a page's key: the sum of its slots' combined scores in kept order),
 * marking the pages in h (dense, gap closed); returns the lowest marked
 * index (h->size when none is). */
size_t kve__mark_pages(const kve_config *c, kve_head *h, const kve_head *heads, size_t nh,
                       size_t n_evict);
size_t kve__sliding_evict_pages(const kve_config *c, kve_head *h, size_t n_evict,
                                int32_t *victims);
void kve__close_gap(const kve_config *c, kve_head *h);
/* Moves h's hole in the lazy columns up to the next multiple of w (slots
 * [gap, that) are closed on the way, fewer than w of them per column), or
 * closes it when that multiple is size or beyond; returns where the hole is
 * now, size when there is none. The vector observe pass starts with it, so
 * that both of its runs are whole vectors. */
size_t kve__align_gap(const kve_config *c, kve_head *h, size_t w);
/* Closes h's hole in every lazy column and returns the lowest index of the
 * lowest score among [0, limit) (limit <= size): one pass over the scores
 * (a NULL step's, or an evict's without a cached victim). */
size_t kve__scored_scan(const kve_config *c, kve_head *h, size_t limit);

/* The bytes kve__policy_create (policy) or kve__bank_create of c with
 * n_heads heads (share: heads per shared group, 0 none) allocates: the
 * handle, every column's slab and the per-head scratch; SIZE_MAX when that
 * overflows. What kve_image_load_bytes starts from. */
size_t kve__create_bytes(const kve_config *c, size_t n_heads, size_t share, bool policy);

/* The sliding layout of window and streaming (sliding.c). */
size_t kve__sliding_cap(size_t budget);
void kve__sliding_rewind(kve_head *h);
size_t kve__sliding_evict(const kve_config *c, kve_head *h, size_t n_evict, int32_t *victims);
/* Removes the n_evict oldest positions after the first `pinned` slots. */
void kve__sliding_remove(kve_head *h, size_t pinned, size_t n_evict, int32_t *victims);

/* Lifecycle (lifecycle.c): dst takes src's exact state (same config,
 * heads and sharing, checked by the caller), growing dst's heads or groups
 * that have fewer slots than src's (all or nothing: KVE_ENOMEM leaves dst as
 * it was). */
kve_status kve__bank_copy_state(kve_bank *dst, const kve_bank *src);

/* Images (image.c). Test hook: true makes save and load convert every
 * scalar byte by byte even on a little-endian machine, where they otherwise
 * copy columns whole (both give the same bytes; tests compare them). Not
 * for use while other threads save or load. */
void kve__image_force_bytewise(bool on);

/* Policy tables, one per file under policies/, declared from the list. */
#define KVE_POLICY(name) extern const kve_policy_type kve__##name##_type;
#include "policies/list.h"
#undef KVE_POLICY

#endif /* KVE_POLICY_IMPL_H */
