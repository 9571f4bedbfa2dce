/* SPDX-License-Identifier: MIT */
/*
 * kvevict.h - KV-cache eviction policies for LLM inference.
 *
 * This is the only public header. It is also the reference manual: every
 * function states what it does, what it returns, what it refuses, what it
 * allocates and what it costs.
 *
 * Vocabulary (used throughout):
 *   position   the index of a token in the sequence, an int32_t >= 0.
 *   kept set   the positions a policy currently keeps, held in ascending
 *              order ("kept order"). Attention vectors passed to a policy are
 *              index-aligned with kept order.
 *   budget     the number of positions a policy may keep after an eviction.
 *   spec       a text description of a policy or trace:
 *              "name" or "name:key=value,key=value".
 *
 * Errors. Every fallible function returns a kve_status. On any status other
 * than KVE_OK the call has changed nothing (objects are exactly as before the
 * call, output arguments are untouched unless stated otherwise) and
 * kve_last_error() holds a one-line message naming the offending argument,
 * field or value. The library never prints, never exits and never aborts on
 * bad input.
 *
 * Threads. The library starts no threads. Distinct objects may be used from
 * distinct threads at once without locking; the library has no global mutable
 * state except the per-thread error message (and the instruction set of its
 * kernels, chosen once from the CPU). One object must not be used from two
 * threads at the same time, with one exception: disjoint head ranges of one
 * bank (see "Banks").
 *
 * Memory. Constructors allocate; nothing on the steady-state decode path does
 * (see kve_policy_step). Every object is released by its *_free function,
 * which accepts NULL.
 */
#ifndef KVEVICT_H
#define KVEVICT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvevict_version.h" /* KVEVICT_VERSION_MAJOR/MINOR/PATCH/STRING/NUMBER */

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the public functions; the library is built with hidden visibility,
 * so nothing else is exported from the shared object. */
#if defined(__GNUC__) || defined(__clang__)
#define KVE_API __attribute__((visibility("default")))
#else
#define KVE_API
#endif

/* ======================================================================
 * Version and limits
 * ====================================================================== */

/* The version of the library linked at run time, "MAJOR.MINOR.PATCH" (static
 * string); KVEVICT_VERSION_STRING is the version of the header compiled
 * against. kve_version_number() is MAJOR * 10000 + MINOR * 100 + PATCH, as
 * KVEVICT_VERSION_NUMBER. */
KVE_API const char *kve_version(void);
KVE_API unsigned kve_version_number(void);

/* The largest budget any policy spec accepts (2^24 positions). */
#define KVE_MAX_BUDGET 16777216
/* Bytes that hold any canonical policy spec, its NUL included: the size of
 * kve_eval_result.spec, and a buffer for kve_spec_with that always fits. */
#define KVE_SPEC_MAX 160

/* ======================================================================
 * Status and errors
 * ====================================================================== */

typedef enum kve_status {
    KVE_OK = 0,   /* success */
    KVE_EINVAL,   /* an argument, spec key or value is invalid */
    KVE_ENOMEM,   /* an allocation failed */
    KVE_ERANGE,   /* an output buffer is too small */
    KVE_EFORMAT,  /* a file or data stream is malformed */
    KVE_EIO,      /* a file could not be opened, read or written */
    KVE_ECANCELED /* a progress callback asked the call to stop */
} kve_status;

/* The enum name of `s` ("KVE_EINVAL"); "KVE_UNKNOWN" for values outside the
 * enum. Never NULL; the string is static. */
KVE_API const char *kve_status_name(kve_status s);

/* The message of this thread's most recent failure, e.g.
 *   "h2o: recent_window 512 must be smaller than budget 512".
 * Thread-local: a failure in one thread never shows in another. Successful
 * calls do not clear it (read it only after a call returned non-OK). Returns
 * "" when this thread has had no failure. The string stays valid until the
 * next failing call in this thread. */
KVE_API const char *kve_last_error(void);

/* Progress of a long call (opening and validating a large .npy file, writing
 * one): `done` of `total` units (rows) are finished. Called with done = 0
 * before the work, then after each unit (so done = total last).
 * Return 0 to go on, non-zero to stop: the call then returns KVE_ECANCELED
 * with everything released, as any other failure. */
typedef int (*kve_progress_fn)(void *user, uint64_t done, uint64_t total);

/* ======================================================================
 * Random numbers
 *
 * xoshiro256** seeded through splitmix64. The one transparent struct of the
 * API, meant to live on the caller's stack. For a given seed the sequence is
 * the same on every platform and every run.
 * ====================================================================== */

typedef struct kve_rng {
    uint64_t s[4];
} kve_rng;

/* Seeds `rng` from `seed` by four splitmix64 draws. O(1). */
KVE_API void kve_rng_seed(kve_rng *rng, uint64_t seed);

/* The next 64-bit output of xoshiro256**. O(1). */
KVE_API uint64_t kve_rng_next(kve_rng *rng);

/* A double uniform in [0, 1): the top 53 bits of kve_rng_next() times 2^-53. */
KVE_API double kve_rng_uniform(kve_rng *rng);

/* A uniform integer in [0, bound) without modulo bias (rejection sampling);
 * 0 when bound is 0. Consumes one or (rarely) more outputs. */
KVE_API uint64_t kve_rng_below(kve_rng *rng, uint64_t bound);

/* ======================================================================
 * Policies
 *
 * A policy holds the kept set of one attention head of one layer and decides
 * which positions to evict. An engine typically owns one policy per (layer,
 * KV head) and calls, for every decoded token:
 *
 *     kve_policy_step(p, pos, attn_over_kept, kve_policy_size(p));
 *     kve_policy_evict(p, budget, victims, cap, &n_victims);
 *     ... drop the victims' keys and values from its own cache ...
 *
 * Spec grammar:   spec  := name [ ":" param { "," param } ]
 *                 param := key "=" value
 * No white space. Integers are plain decimal digits; reals are decimal
 * (e.g. 0.99, 1e-3). A key may appear once. Every policy takes
 *   budget         (default 512, 1 .. KVE_MAX_BUDGET)  sizes the storage
 * and the keys listed on its page in docs/policies/. Policies:
 *   full           never evicts (the ceiling)
 *   window         the most recent `budget` positions
 *   streaming      StreamingLLM: `sinks` first positions + a recent window
 *   random         uniform victims among all but the newest `recent_window`
 *   h2o            heavy hitters: cumulative attention + recent window
 *   scissorhands   count of steps a position beat its fair share
 *   tova           the current step's attention only
 *   h2o_decay      cumulative attention with a forgetting factor (A2SF)
 *   h2o_mean       cumulative attention divided by steps observed
 *   knorm          the keys of smallest L2 norm (reads keys, not attention)
 *   keydiff        the keys least similar to the mean kept key (reads keys)
 * The last two read the key vector of each admitted position instead of
 * attention: build them with kve_policy_new_ex and a key dimension, and step
 * them with kve_policy_step_keys (see "Policies that read keys").
 *
 * Pages. Paged KV caches (vLLM, TensorRT-LLM, OpenVINO) store keys and
 * values in pages of b consecutive positions and can free only whole pages.
 * The scored policies (h2o, scissorhands, tova, h2o_decay, h2o_mean) take
 *   block          (default 1, 1 .. KVE_MAX_BUDGET)  evict whole pages
 *   block_mean     (default 0, 0 or 1)  1: a page scores the mean, not the sum
 * and window and streaming take block alone. Position p is in page p / b
 * (aligned pages). A page is evictable once it is complete (a position at or
 * past its last, (p / b + 1) * b - 1, has been admitted) and none of its
 * kept positions is among the newest recent_window; for streaming, once it
 * holds no sink (a page holding a sink is pinned whole: its memory is spent
 * anyway). An eviction to `budget` removes whole evictable pages until at
 * most `budget` positions are left: the scored policies the page with the
 * lowest score first, where a page's score is the sum of its positions'
 * scores (added in kept order, in double) or with block_mean=1 that sum
 * divided by its kept positions, ties to the lower page; window and
 * streaming the oldest page first. Victims are still reported as positions,
 * ascending, and may number up to size - budget + block - 1. So a head keeps
 * between budget - block + 1 and budget positions after an eviction, and a
 * page costs block slots of the policy's per-slot state (h2o: 13 * block
 * bytes; no per-page state is kept: page scores are summed when evicting).
 * The budget must be at least the positions pages can leave unevictable:
 * max(recent_window, block - 1) + block - 1 for the scored policies,
 * block - 1 for window, sinks + 2 * (block - 1) for streaming with sinks
 * (checked by kve_policy_new and every evict). block=1 is the policy
 * without pages, exactly, and its canonical spec omits both keys.
 * ====================================================================== */

typedef struct kve_policy kve_policy; /* opaque */

/* Builds a policy from `spec` and stores it in *out.
 *
 * rng: policies that draw random numbers (random) require one and refuse
 *      NULL; they seed a private generator from one kve_rng_next(rng) draw,
 *      so the caller's generator advances by one output and several policies
 *      built from one generator draw independent streams. Deterministic
 *      policies ignore `rng` entirely (it may be NULL and is not advanced).
 * Refuses (KVE_EINVAL): NULL spec or out; an unknown name; an unknown,
 *      repeated, malformed or out-of-range key or value; parameters that
 *      contradict each other (recent_window >= budget, sinks >= budget).
 *      The message names the key. KVE_ENOMEM if allocation fails.
 * Allocates the per-slot storage for budget + 1 positions (the steady state
 * of step-then-evict); *out is untouched on failure. */
KVE_API kve_status kve_policy_new(const char *spec, kve_rng *rng, kve_policy **out);

/* Releases `p` and everything it owns. NULL is a no-op. */
KVE_API void kve_policy_free(kve_policy *p);

/* Tells the policy that the query at position `pos` paid attention `attn` to
 * the kept positions, then admits `pos` into the kept set.
 *
 * attn: attn[i] is the weight the query at `pos` paid to the i-th kept
 *       position in kept order; `n` must equal kve_policy_size(p). Weights
 *       must be finite and >= 0; they need not sum to 1. The policy reads
 *       attn during the call only.
 *       attn == NULL means "no information this step": every score is left
 *       unchanged (which is not the same as a vector of zeroes) and `n` is
 *       ignored. Position `pos` is admitted either way.
 * pos:  must be >= 0 and greater than every position seen before.
 * Refuses (KVE_EINVAL, nothing changed): NULL p; pos negative or not
 *       increasing; n != size; a NaN, infinite or negative weight (the
 *       message names its index and value).
 * Memory: no allocation while size <= budget before the call (the
 *       step-then-evict loop). Stepping several times without evicting grows
 *       the storage geometrically; KVE_ENOMEM if that fails.
 * Cost: the policies that read attention make a read-only validation pass
 *       over attn, then one pass over the kept set that updates every score,
 *       closes the hole the last evict left in the per-slot state and finds
 *       the next victim (vectorised for the machine: kve_isa_name); O(1) for
 *       the others (plus the validation pass when attn is not NULL: window,
 *       streaming, full and random should be stepped with NULL). */
KVE_API kve_status kve_policy_step(kve_policy *p, int32_t pos, const float *attn, size_t n);

/* Evicts down to `budget` positions.
 *
 * When size > budget, removes size - budget positions chosen by the policy,
 * writes them to victims[0 .. count) in ascending position order (not the
 * order they were chosen in) and stores count in *n_victims; otherwise
 * removes nothing and stores 0. Kept order (ascending) is preserved. The
 * `full` policy never evicts and always reports 0.
 * victims/cap: caller's buffer and its capacity in elements. victims may be
 *       NULL when cap is 0. n_victims may be NULL when the count is not
 *       wanted.
 * Refuses: KVE_EINVAL for NULL p, budget 0, budget that leaves nothing to
 *       choose between (budget <= recent_window for the scored and random
 *       policies, budget <= sinks for streaming), or victims NULL with
 *       cap > 0; KVE_ERANGE when cap < size - budget. Nothing changes on
 *       refusal. Never allocates.
 * Cost: scored policies, one victim (the steady state): the step found it,
 *       so evict is one memmove of the positions after it (the other columns
 *       are closed up by the next step's pass); after a NULL step, one argmin
 *       scan more. Several victims: one scan of the unprotected kept set per
 *       victim (repeated argmin, never a sort) and one compaction.
 *       window/streaming are O(victims + sinks) amortised; random is O(kept)
 *       per victim. */
KVE_API kve_status kve_policy_evict(kve_policy *p, size_t budget, int32_t *victims, size_t cap,
                            size_t *n_victims);

/* The number of kept positions. O(1). 0 for NULL. */
KVE_API size_t kve_policy_size(const kve_policy *p);

/* The kept positions, kve_policy_size(p) of them, in ascending order. The
 * pointer is owned by the policy and valid until its next step, evict or
 * free. NULL for NULL p; may be non-NULL with size 0. */
KVE_API const int32_t *kve_policy_positions(const kve_policy *p);

/* Bytes of per-slot state the policy holds now: allocated slots times bytes
 * per slot (h2o: 13, i.e. 4 of position, 8 of score, 1 of eviction scratch;
 * 6669 at the default budget of 512). Excludes the fixed-size handle itself.
 * 0 for NULL. */
KVE_API size_t kve_policy_state_bytes(const kve_policy *p);

/* The canonical spec: the name and every parameter spelled out in a fixed
 * order, e.g. "h2o:budget=512,recent_window=32". kve_policy_new accepts it
 * back and builds an identical policy. Owned by the policy; never NULL for
 * non-NULL p (NULL for NULL p). */
KVE_API const char *kve_policy_spec(const kve_policy *p);

/* The policy's name ("h2o") and its budget parameter. NULL / 0 for NULL p. */
KVE_API const char *kve_policy_name(const kve_policy *p);
KVE_API size_t kve_policy_budget(const kve_policy *p);

/* The registered policies, in a fixed order: kve_policy_type_name(i) for
 * i < kve_policy_type_count(), and a one-line summary of each. NULL past the
 * end. */
KVE_API size_t kve_policy_type_count(void);
KVE_API const char *kve_policy_type_name(size_t i);
KVE_API const char *kve_policy_type_summary(size_t i);

/* Writes to out[0 .. cap) the canonical form of `spec` with parameter `key`
 * set to `value` (replacing any value the spec gave). key may be NULL to
 * canonicalise only. Validates exactly as kve_policy_new does, without
 * allocating. Refuses: KVE_EINVAL as kve_policy_new; KVE_ERANGE when the
 * result and its terminating NUL do not fit in cap (never with
 * cap >= KVE_SPEC_MAX). */
KVE_API kve_status kve_spec_with(const char *spec, const char *key, const char *value, char *out,
                         size_t cap);

/* Stores in *out the smallest budget `spec` accepts (as kve_policy_new with
 * that budget, or an evict to it): recent_window + 1, sinks + 1, the page
 * reserve (see "Pages"), or 1, whichever is largest; every larger budget is
 * accepted too. E.g. 33 for "h2o", 5 for "streaming", 1 for "window".
 * Refuses (KVE_EINVAL, *out untouched): NULL out, and the specs
 * kve_policy_new refuses. Never allocates. */
KVE_API kve_status kve_spec_min_budget(const char *spec, size_t *out);

/* ======================================================================
 * Banks: one policy for every head of an engine
 *
 * An engine runs one policy per (layer, KV head, sequence). A bank holds
 * n_heads instances ("heads") of one spec behind one handle, so a decode step
 * for every head is one call:
 *
 *     kve_bank_step(b, pos, attn, ld);          attn: row h = head h's weights
 *     kve_bank_evict(b, budget, victims, ld_victims, counts);
 *     ... head h drops victims[h * ld_victims .. + counts[h]) from its cache ...
 *
 * Head h behaves exactly as the h-th of n_heads policies built one after
 * another by kve_policy_new(spec, rng, ...) from the same generator, stepped
 * and evicted with head h's row: same victims, same kept set, same refusals
 * (so policies that draw get independent streams, and a bank is reproducible
 * from its seed). The spec is parsed once and shared; per-slot state is held
 * as one slab per column across heads (structure of arrays), so a step over
 * every head streams each column once.
 *
 * Grouped-query attention. With `group` query heads per KV head, an engine
 * passes the attention of all n_heads * group query heads to
 * kve_bank_step_grouped; KV head h owns query rows h*group .. h*group+group-1
 * and sees, in each slot, their
 *   KVE_REDUCE_MEAN  sum in double in query-head order, divided by group in
 *                    double, rounded to float32 once (the default);
 *   KVE_REDUCE_SUM   sum in double in query-head order, rounded to float32
 *                    once (a sum that overflows float32 is refused);
 *   KVE_REDUCE_MAX   the largest weight.
 * The reduction happens inside the step's pass over the scores: no buffer of
 * reduced rows is written.
 *
 * Threads. The library starts no threads. An engine that splits heads across
 * its own threads calls kve_bank_step_range and kve_bank_evict_range on
 * disjoint head ranges of one bank concurrently; kve_bank_size and
 * kve_bank_positions of a head may be called by the thread that owns its
 * range. Nothing else on a bank may overlap another call on it: in
 * particular kve_bank_step, kve_bank_step_grouped and kve_bank_evict (every
 * head), kve_bank_state_bytes and kve_bank_free.
 *
 * Memory. kve_bank_new allocates the handle with its heads (about 180 bytes
 * a head) and one slab per column of n_heads * (budget + 1) slots
 * (window/streaming: their sliding block). As with a policy, nothing
 * allocates while every head is evicted after every step; a head stepped
 * past its slots without evicting moves to a private block of twice the
 * slots, and the slabs are freed once no head uses them.
 *
 * Shared budgets (Ada-KV). Heads differ: some attend locally and need a few
 * dozen positions, others retrieve from far back. A bank built with
 * options.share = G (kve_bank_new_ex) groups heads [0, G), [G, 2G), ... (an
 * engine's KV heads of one layer), and kve_bank_evict_shared evicts each
 * group to one budget B for its heads together: the group's lowest-scoring
 * evictable positions go, wherever they are, so heads end up holding
 * different numbers of positions (their sizes add up to B after every
 * eviction that had to remove something). Exactly:
 *   - candidates are each head's kept positions outside its newest
 *     recent_window, compared by (score, head, position): ties go to the
 *     lower head, then the lower position;
 *   - no head is evicted below its floor max(recent_window,
 *     floor(min_share * B / G)); min_share defaults to 0.2 (Ada-KV's and
 *     kvpress's safeguard alpha), so each head keeps a fifth of an even share;
 *   - victims are chosen one at a time, each the lowest candidate of a head
 *     still above its floor, until the group holds B;
 *   - each head's victims are written ascending, as kve_bank_evict does.
 * Scores are compared as they are, unscaled: every head's attention row sums
 * to (at most) 1, so h2o's score (attention mass received), h2o_decay's
 * (decayed mass) and tova's (the last weight) are masses in the same unit in
 * every head, and h2o_mean's is a mean weight per step; scissorhands' is a
 * count of steps in which the position beat 1/n of its own head, the same
 * unit (steps) in every head although n differs between heads. Only the
 * scored policies can share a budget, and only without pages.
 * Memory follows the sizes: a group's storage is one region per column of
 * G * (budget + 1 + slack) slots (slack = max(1, (budget + 1) / 8), the
 * spec's budget), each head owning a part of it; a head that fills its part
 * makes the next step lay the group out again in place (every head gets its
 * size + 1 plus an even share of what is left; O(G * budget), at most once
 * every slack - 1 steps of one head's growth). Nothing allocates while each
 * group is evicted to at most G * budget after every step; a group that must
 * hold more moves to a private block of twice the slots (all or nothing).
 * The ranges of every call on a shared bank (step, evict, evict_shared) must
 * be whole groups; threads may run disjoint groups at once.
 * ====================================================================== */

typedef struct kve_bank kve_bank; /* opaque: n_heads instances of one policy spec */

/* How a grouped step reduces the query rows of one KV head (see above). */
typedef enum kve_reduce {
    KVE_REDUCE_MEAN = 0, /* mean in double, rounded once (the default) */
    KVE_REDUCE_SUM,      /* sum in double, rounded once */
    KVE_REDUCE_MAX       /* largest weight */
} kve_reduce;

/* Builds a bank of n_heads instances of `spec` and stores it in *out.
 *
 * rng: as kve_policy_new, once per head in head order: policies that draw
 *      (random) require one and seed head h from the h-th of n_heads
 *      kve_rng_next(rng) draws, so the caller's generator advances by
 *      n_heads outputs; deterministic policies ignore it (NULL allowed, not
 *      advanced).
 * Refuses (KVE_EINVAL): NULL out; a spec kve_policy_new refuses (same
 *      message); n_heads 0; a NULL rng for a policy that draws.
 *      KVE_ENOMEM if allocation fails, or n_heads * slots does not fit in
 *      memory. On failure *out and rng are untouched.
 * Allocates: the handle and heads, then one slab per column (policy page:
 *      13 bytes a slot for h2o) of n_heads * (budget + 1) slots. */
KVE_API kve_status kve_bank_new(const char *spec, size_t n_heads, kve_rng *rng, kve_bank **out);

/* What kve_bank_new_ex builds besides the spec. Start from
 * kve_bank_default_options() and set the fields you need, so that a field
 * added later keeps its default. */
typedef struct kve_bank_options {
    size_t key_dim;   /* d: the floats of every key a step carries, as
                         kve_policy_options.key_dim (see "Policies that read
                         keys"); 0 (the default): steps carry no keys */
    size_t share;     /* heads per shared-budget group, dividing n_heads; 0 (the
                         default): every head has its own budget */
    double min_share; /* the floor of a shared eviction, as a fraction of an even
                         share, in [0, 1] (default 0.2; see "Shared budgets") */
} kve_bank_options;

/* The defaults: key_dim 0, share 0 (no shared budget), min_share 0.2. */
KVE_API kve_bank_options kve_bank_default_options(void);

/* kve_bank_new with options; options may be NULL (the defaults, which make
 * it kve_bank_new). Argument order as kve_policy_new_ex.
 * Refuses (KVE_EINVAL) what kve_bank_new refuses, plus: what
 *      kve_policy_new_ex refuses of key_dim (above KVE_MAX_KEY_DIM, or 0 for
 *      a policy that reads keys); min_share outside
 *      [0, 1] (or NaN); share that does not divide n_heads; share > 0 with a
 *      policy that has no score (full, window, streaming, random) or with
 *      block > 1. KVE_ENOMEM. On failure *out and rng are untouched.
 * Allocates: as kve_bank_new; with share > 0 the handle also holds
 *      n_heads / share groups (about 70 bytes each) and each head starts with
 *      budget + 1 + slack slots (see "Shared budgets"). */
KVE_API kve_status kve_bank_new_ex(const char *spec, size_t n_heads, kve_rng *rng,
                                   const kve_bank_options *options, kve_bank **out);

/* Releases `b` and everything it owns. NULL is a no-op. */
KVE_API void kve_bank_free(kve_bank *b);

/* The bank's heads per shared group (options.share); 0 for a bank without
 * shared budgets and for NULL. O(1). */
KVE_API size_t kve_bank_share(const kve_bank *b);

/* The number of heads; 0 for NULL. O(1). */
KVE_API size_t kve_bank_heads(const kve_bank *b);

/* The number of positions head `head` keeps; 0 for NULL b or head out of
 * range. O(1). */
KVE_API size_t kve_bank_size(const kve_bank *b, size_t head);

/* Head `head`'s kept positions, kve_bank_size(b, head) of them, ascending.
 * Owned by the bank, valid until the next step, evict or free whose range
 * contains the head. NULL for NULL b or head out of range. O(1). */
KVE_API const int32_t *kve_bank_positions(const kve_bank *b, size_t head);

/* Bytes of per-slot state the bank holds now: allocated slots (every head's)
 * times bytes per slot; n_heads times kve_policy_state_bytes of one policy
 * of the same spec in the steady state. 0 for NULL. O(n_heads). */
KVE_API size_t kve_bank_state_bytes(const kve_bank *b);

/* The canonical spec shared by every head (as kve_policy_spec). NULL for
 * NULL b. */
KVE_API const char *kve_bank_spec(const kve_bank *b);

/* The spec's budget parameter, shared by every head (as kve_policy_budget).
 * 0 for NULL b. */
KVE_API size_t kve_bank_budget(const kve_bank *b);

/* One decode step for every head: the query at `pos` paid attention `attn`
 * to each head's kept positions; then `pos` is admitted in every head.
 *
 * attn: row h at attn + h*ld, its first kve_bank_size(b, h) entries valid,
 *       kept order; ld >= every head's size; NULL = no information for every
 *       head (ld ignored). Weights as kve_policy_step: finite and >= 0; read
 *       during the call only.
 * pos:  >= 0 and greater than every head's last position.
 * Refuses (KVE_EINVAL, no head changed): NULL b; a bad pos (the message names
 *       the first head it fails for); ld smaller than some head's size; a NaN,
 *       infinite or negative weight (the message names head and index).
 *       KVE_ENOMEM when a head must grow and cannot (no head changed).
 * Memory: no allocation while every head's size <= budget before the call.
 * Cost: one read-only validation pass over every row, then one pass over
 *       every head's scores that adds the weights, closes the hole the last
 *       evict left and finds the next victim (the scored policies; O(1) a
 *       head for the others), vectorised for the machine (kve_isa_name). */
KVE_API kve_status kve_bank_step(kve_bank *b, int32_t pos, const float *attn, size_t ld);

/* kve_bank_step with grouped-query attention: attn holds n_heads * group
 * query rows, row r at attn + r*ld, and KV head h reduces rows
 * h*group .. h*group+group-1 as `reduce` says (see above) in each of its
 * kve_bank_size(b, h) slots. group 1 is kve_bank_step (reduce ignored).
 * Refuses as kve_bank_step, plus: group 0, a reduce outside kve_reduce, and
 * (KVE_REDUCE_SUM) a reduced weight that overflows float32 (message names
 * head and index); every query row is validated before any head changes.
 * Cost: kve_bank_step's, reading group rows instead of one. */
KVE_API kve_status kve_bank_step_grouped(kve_bank *b, int32_t pos, const float *attn, size_t ld,
                                         size_t group, kve_reduce reduce);

/* kve_bank_step_grouped on heads [first, first + count) only: the rows of
 * head first + j start at attn + j*group*ld. The other heads are not read or
 * written, so threads may step disjoint ranges of one bank at once (see
 * "Threads" above). count 0 does nothing and succeeds.
 * Refuses as kve_bank_step_grouped, plus first + count > kve_bank_heads(b). */
KVE_API kve_status kve_bank_step_range(kve_bank *b, size_t first, size_t count, int32_t pos,
                                       const float *attn, size_t ld, size_t group,
                                       kve_reduce reduce);

/* Evicts every head to `budget`, as kve_policy_evict does each: head h's
 * victims, ascending, at victims + h*ld_victims, their count in counts[h].
 * counts may be NULL when the counts are not wanted; victims may be NULL
 * when ld_victims is 0.
 * Refuses (nothing changed): KVE_EINVAL for NULL b and for what
 *       kve_policy_evict refuses (budget 0, budget <= recent_window or
 *       sinks, victims NULL with ld_victims > 0); KVE_ERANGE if some head
 *       needs more than ld_victims (the message names the first such head).
 *       Never allocates.
 * Cost: per head as kve_policy_evict; in the steady state (one victim a head)
 *       the victim was found by the step, so evict is one memmove of the
 *       positions after it. */
KVE_API kve_status kve_bank_evict(kve_bank *b, size_t budget, int32_t *victims,
                                  size_t ld_victims, size_t *counts);

/* kve_bank_evict on heads [first, first + count) only: head first + j's
 * victims at victims + j*ld_victims, its count in counts[j]. Other heads are
 * untouched (see "Threads"). count 0 does nothing and succeeds. Refuses as
 * kve_bank_evict, plus first + count > kve_bank_heads(b) and, on a bank with
 * shared groups, a range that splits a group. */
KVE_API kve_status kve_bank_evict_range(kve_bank *b, size_t first, size_t count, size_t budget,
                                        int32_t *victims, size_t ld_victims, size_t *counts);

/* Evicts each shared group in heads [first, first + count) to `budget`
 * positions for all its heads together (see "Shared budgets": a layer's
 * budget, e.g. G times a per-head budget). Head first + j's victims go to
 * victims + j*ld_victims, ascending, their count to counts[j] (counts may be
 * NULL; victims may be NULL when ld_victims is 0). A group holding at most
 * `budget` positions loses nothing.
 * Refuses (nothing changed): KVE_EINVAL for NULL b, a bank built without
 * share, a range out of the bank or splitting a group, budget <= share *
 * recent_window (budget 0 included), victims NULL with ld_victims > 0;
 * KVE_ERANGE if some head would lose more than ld_victims (the message
 * names the first such head; then no head changed). Never allocates.
 * Cost: O(k * (n + G)) for k victims in a group whose heads keep n positions
 * each: one scan of a head per victim taken from it (its first candidate was
 * found by the step), plus one compaction per head that loses several. */
KVE_API kve_status kve_bank_evict_shared(kve_bank *b, size_t first, size_t count, size_t budget,
                                         int32_t *victims, size_t ld_victims, size_t *counts);

/* ======================================================================
 * Budgets across layers
 *
 * An engine with L layers and a memory total T (positions per KV head,
 * summed over layers) gives each layer its own budget: every head of layer l
 * evicts to out[l] (or, sharing, each layer's group to G * out[l]), and the
 * out[l] add up to T, so the memory is the same as T / L per layer. Three
 * schedules, one apportionment: every layer gets `floor`, and the rest
 * R = T - L * floor is split in proportion to weights w_l, layer l getting
 * floor + floor(R * w_l / sum w), the units left over going one each to the
 * largest fractional parts (ties to the lower layer):
 *   KVE_SCHEDULE_UNIFORM   w_l = 1: T / L each, the first T mod L layers one
 *                          more (with floor 0);
 *   KVE_SCHEDULE_PYRAMID   PyramidKV (Cai et al., 2024): w falls on a straight
 *                          line from 2 - 1/beta at the bottom layer (l = 0) to
 *                          1/beta at the top (weights averaging 1): the top
 *                          layer gets floor + (mean part) / beta, the bottom
 *                          twice the mean part minus that. beta >= 1
 *                          (PyramidKV's default, 20; beta 1 is uniform). The
 *                          floor plays PyramidKV's window, which every layer
 *                          keeps: pass the smallest budget the policy accepts
 *                          (recent_window + 1 for the scored policies);
 *   KVE_SCHEDULE_WEIGHTED  w_l = weights[l], e.g. a statistic measured per
 *                          layer on a calibration text (the decoder measures
 *                          the attention mass a layer puts beyond its recent
 *                          window: docs/budgets.md).
 * ====================================================================== */

typedef enum kve_schedule_kind {
    KVE_SCHEDULE_UNIFORM = 0, /* the same for every layer */
    KVE_SCHEDULE_PYRAMID,     /* PyramidKV's straight line, more for lower layers */
    KVE_SCHEDULE_WEIGHTED     /* in proportion to the caller's weights */
} kve_schedule_kind;

/* A schedule. Start from kve_schedule_default() and set what you need. */
typedef struct kve_schedule {
    kve_schedule_kind kind;
    size_t floor;          /* every layer gets at least this (default 0) */
    double beta;           /* PYRAMID: >= 1, finite (default 20) */
    const double *weights; /* WEIGHTED: n_layers finite weights >= 0, summing > 0 */
} kve_schedule;

/* The defaults: uniform, floor 0, beta 20, no weights. */
KVE_API kve_schedule kve_schedule_default(void);

/* Writes to out[0 .. n_layers) the budgets of schedule `s` for `total`,
 * which add up to total exactly (see above). Deterministic: the same
 * arguments give the same budgets on every machine.
 * Refuses (KVE_EINVAL, out untouched): NULL s or out, n_layers 0, a kind
 *      outside kve_schedule_kind, total < n_layers * floor, a pyramid beta
 *      below 1 or not finite, NULL weights or a weight that is negative, NaN
 *      or infinite, or weights summing to 0 (the message names the index).
 * Thread-safe; never allocates; O(n_layers^2). */
KVE_API kve_status kve_layer_budgets(const kve_schedule *s, size_t total, size_t n_layers,
                                     size_t *out);

/* The instruction set the library's kernels run with on this machine:
 * "avx512", "avx2" or "scalar" (the portable code, the definition the others
 * equal bit for bit). Chosen once, at the first call that needs it, from the
 * CPU. Never NULL; the string is static. */
KVE_API const char *kve_isa_name(void);

/* ======================================================================
 * Policies that read keys
 *
 * Every policy declares what it reads at a step (kve_policy_reads): the
 * attention weights over its kept set (the h2o family), the key vector of
 * the position it admits (knorm, keydiff), or nothing (full, window,
 * streaming, random). An engine whose attention kernel never writes weights
 * can run a key-reading policy with no extra pass over the cache: it hands
 * the policy the key it has just computed, once per (KV head, position).
 *
 *     kve_policy_options o = kve_policy_default_options();
 *     o.key_dim = d;                                  the model's head size
 *     kve_policy_new_ex("knorm:budget=512", NULL, &o, &p);
 *     for each token:
 *         kve_policy_step_keys(p, pos, NULL, 0, k);   k: the new key, d floats
 *         kve_policy_evict(p, budget, victims, cap, &n_victims);
 *
 * The key dimension is a construction option, not a spec key. A spec says
 * what a policy does and is the same text on every model, trace and engine
 * ("knorm:budget=512" names one policy wherever it runs, and its canonical
 * form does not change with the model); d is a fact of the model, known to
 * the engine when it builds its policies, like the number of heads of a bank.
 * It is fixed for the object's life: every key of every step has d floats,
 * and the per-slot state a policy sizes from it (keydiff's unit keys) is
 * allocated once.
 *
 * Keys are the vectors the model's attention compares queries with, i.e.
 * after any rotary embedding ("post-RoPE", as an engine's cache holds them
 * and as kvpress scores them). Definitions (docs/policies/knorm.md and
 * keydiff.md give them in full):
 *   knorm    score = -||k||, ||k|| = sqrt of the sum of squares taken in
 *            double in 8 partial sums (by index mod 8, added pairwise); the
 *            lowest score, i.e. the largest norm, is evicted first. A scalar
 *            per slot: 13 bytes a slot, as h2o.
 *   keydiff  u = k / max(||k||, 1e-12), rounded to float32 (the key's unit
 *            vector, torch's F.normalize); at every step, after admitting the
 *            new key, S = the sum in double of the u of every kept position
 *            (the newcomer included; the mean of the kept keys' directions
 *            times their count), and score_i = -(u_i . S), the dot product in
 *            double in 8 partial sums. -(u_i . S) = -n |mean| cos(k_i, mean):
 *            the order of -cos(k_i, mean), so the key most similar to the mean
 *            is evicted first. Needs the unit key of every slot: 13 + 4 d
 *            bytes a slot, plus 8 d bytes a head for S (scratch, which
 *            kve_policy_state_bytes, a count of per-slot state, leaves out).
 * Both protect the newest recent_window positions and send ties to the lower
 * position, as every scored policy does.
 * ====================================================================== */

/* What a policy reads at each step: a bit set. */
enum {
    KVE_READS_NOTHING = 0u, /* full, window, streaming, random */
    KVE_READS_ATTN = 1u,    /* the attention weights over the kept set */
    KVE_READS_KEYS = 2u     /* the key vector of each admitted position */
};

/* The largest key dimension a policy accepts (2^16 floats). */
#define KVE_MAX_KEY_DIM 65536

/* What kve_policy_new_ex builds besides the spec (kve_bank_options carries
 * the same key_dim for a bank). Start
 * from kve_policy_default_options(), so that a field added later keeps its
 * default. */
typedef struct kve_policy_options {
    size_t key_dim; /* d: the floats of every key a step carries, 0 .. KVE_MAX_KEY_DIM;
                       0 (the default): steps carry no keys */
} kve_policy_options;

/* The defaults: key_dim 0. */
KVE_API kve_policy_options kve_policy_default_options(void);

/* What registered type i reads (KVE_READS_*); 0 past the end. */
KVE_API unsigned kve_policy_type_reads(size_t i);

/* What `p` reads (KVE_READS_*); 0 for NULL. */
KVE_API unsigned kve_policy_reads(const kve_policy *p);

/* The key dimension `p` was built with; 0 for NULL or when built without. */
KVE_API size_t kve_policy_key_dim(const kve_policy *p);

/* kve_policy_new with options (NULL: the defaults). kve_policy_new(spec,
 * rng, out) is kve_policy_new_ex(spec, rng, NULL, out).
 * Refuses as kve_policy_new, plus (KVE_EINVAL): key_dim above
 * KVE_MAX_KEY_DIM; a policy that reads keys with key_dim 0 (the message
 * says so: it could never be stepped). A policy that does not read keys
 * accepts any key_dim and then validates and ignores the keys it is given.
 * Allocates as kve_policy_new; a policy whose per-slot state depends on d
 * (keydiff) sizes its slots from it. */
KVE_API kve_status kve_policy_new_ex(const char *spec, kve_rng *rng,
                                     const kve_policy_options *options, kve_policy **out);

/* kve_policy_step that also hands the policy the key of `pos`.
 *
 * key: key_dim floats (the key_dim of construction), read during the call
 *      only; NULL = no key. kve_policy_step(p, pos, attn, n) is
 *      kve_policy_step_keys(p, pos, attn, n, NULL).
 * attn: as kve_policy_step; a policy that reads keys only validates it (pass
 *      NULL).
 * Refuses (KVE_EINVAL, nothing changed), besides kve_policy_step's refusals:
 *      a policy that reads keys stepped with key NULL ("knorm: the policy
 *      reads keys, but the step carries none"); a key given to a policy
 *      built with key_dim 0; a NaN or infinite key entry (the message names
 *      its index).
 * Cost: knorm O(d) for the norm plus one argmin scan of the kept scores;
 *      keydiff O(kept * d): the new unit key, the sum S and every score are
 *      recomputed (two passes over the kept unit keys). Vectorised for the
 *      machine, every instruction set giving the same bits. No allocation
 *      while size <= budget before the call. */
KVE_API kve_status kve_policy_step_keys(kve_policy *p, int32_t pos, const float *attn, size_t n,
                                        const float *key);

/* A bank of key-reading heads: kve_bank_new_ex with options.key_dim = d
 * (kve_bank_options, in "Banks"). */

/* What the bank's policy reads (KVE_READS_*), and its key dimension; 0 for
 * NULL. */
KVE_API unsigned kve_bank_reads(const kve_bank *b);
KVE_API size_t kve_bank_key_dim(const kve_bank *b);

/* kve_bank_step_range that also hands every head of the range the key of
 * `pos`: head first + j's key is keys[j*ld_keys .. j*ld_keys + key_dim), one
 * row per KV head (the key is the KV head's: grouped query heads share it).
 * keys NULL: no keys (ld_keys ignored). kve_bank_step_range(b, first, count,
 * pos, attn, ld, group, reduce) is this call with keys NULL.
 * Refuses as kve_bank_step_range and kve_policy_step_keys (the message names
 * the head), plus ld_keys < key_dim with keys given; every key of every head
 * is validated before any head changes. Threads: as kve_bank_step_range
 * (disjoint ranges may run at once). Cost: per head as kve_policy_step_keys. */
KVE_API kve_status kve_bank_step_keys(kve_bank *b, size_t first, size_t count, int32_t pos,
                                      const float *attn, size_t ld, size_t group,
                                      kve_reduce reduce, const float *keys, size_t ld_keys);

/* ======================================================================
 * Prefill compression
 *
 * A prompt of n tokens (positions 0 .. n-1) is processed in one pass; an
 * engine then compresses it to the budget before decoding starts, and the
 * policy carries on per step from the kept set. Two methods choose what the
 * prompt keeps, from the prompt's own attention:
 *
 *   KVE_PREFILL_H2O     H2O's prompt scores (Zhang et al. 2023): position i
 *                       scores the sum of the weights every prompt query t >= i
 *                       paid it (a column sum of the prompt's attention,
 *                       query i's weight on its own key included). Reads all
 *                       n rows. The newest recent_window positions of the
 *                       policy are kept; of the others, the budget -
 *                       recent_window of highest score.
 *   KVE_PREFILL_SNAPKV  SnapKV (Li et al. 2024): only the last w prompt
 *                       queries (the observation window) are read; position i
 *                       scores the sum of their weights on it, smoothed by a
 *                       pooling of `kernel` positions centred on i over the
 *                       positions before the window (max, or the mean with
 *                       the positions past either end counted as 0); the w
 *                       positions of the window are kept, and of the others
 *                       the budget - w of highest pooled score. An engine
 *                       needs only those w rows (w * n weights), so it works
 *                       with attention kernels that compute no other rows.
 *
 * Ties go to the lower position. Grouped-query attention: the rows of a KV
 * head's `group` query heads are reduced to one as the bank's grouped step
 * does (kve_reduce), then summed in double in row order. A prompt that fits
 * (n <= budget) keeps everything. After kve_bank_prefill the heads hold the
 * kept positions as if admitted, and the policies whose score is attention
 * received (h2o, h2o_decay, tova) start from the column sum of the rows
 * given: for h2o, the attention each kept position accumulated over the
 * prompt (its own query's weight included); tova replaces it at the next
 * step. scissorhands and h2o_mean start as admitted (no votes, no sum). The
 * next step is at position n or later. Parameters and defaults, with their
 * sources: docs/prefill.md.
 *
 *     r = kve_prefill_rows(&p, n);        rows the method reads
 *     ... compute rows of the queries n-r .. n-1 for every query head ...
 *     kve_bank_prefill(b, first, count, &p, n, rows, ld, group, reduce, budget);
 *     ... keep kve_bank_positions(b, h) in head h's cache, drop the rest ...
 *
 * Policies that read keys need no prefill call: step them through the
 * prompt without evicting and evict once (kvpress's KnormPress and
 * KeyDiffPress are exactly that).
 * ====================================================================== */

typedef enum kve_prefill_method {
    KVE_PREFILL_H2O = 0,   /* column sums of every prompt row */
    KVE_PREFILL_SNAPKV = 1 /* the last `window` rows, pooled */
} kve_prefill_method;

typedef enum kve_pool {
    KVE_POOL_MAX = 0, /* the largest score within the kernel */
    KVE_POOL_AVG = 1  /* the kernel's sum divided by kernel (missing positions count 0) */
} kve_pool;

typedef struct kve_prefill_params {
    kve_prefill_method method;
    size_t window; /* SnapKV: w, the observation window (default 32) */
    size_t kernel; /* SnapKV: pooling kernel, odd (default 5) */
    kve_pool pool; /* SnapKV: pooling (default KVE_POOL_MAX) */
} kve_prefill_params;

/* The defaults of `method` (window 32, kernel 5, KVE_POOL_MAX; the H2O
 * method uses none of them). */
KVE_API kve_prefill_params kve_prefill_default_params(kve_prefill_method method);

/* The number of rows r the method reads of an n-token prompt: n for H2O,
 * min(window, n) for SnapKV; 0 for NULL params. Row k of a query head is the
 * attention of query n - r + k. */
KVE_API size_t kve_prefill_rows(const kve_prefill_params *params, size_t n);

/* The scores of one KV head's prompt: scores[i] for i < n, the value the
 * method ranks position i by (H2O: the column sum; SnapKV: the pooled column
 * sum before the window, the plain column sum inside it).
 * rows: for query head g < group and row k < r = kve_prefill_rows(params,
 *      n), the weights of query t = n - r + k over keys 0 .. t at
 *      rows + (g*r + k)*ld (entries past t are not read); ld >= n.
 * Refuses (KVE_EINVAL): NULL params or scores, NULL rows; n 0 or above
 *      2^31; ld < n; group 0; a reduce outside kve_reduce; an unknown method;
 *      window 0, or a kernel that is 0 or even (SnapKV); a NaN, infinite or
 *      negative weight (the message names query head, query position and
 *      key) or (KVE_REDUCE_SUM) a reduced weight beyond float32. scores is
 *      untouched on refusal; KVE_ENOMEM if its scratch (n doubles) cannot
 *      be allocated. Thread-safe; O(group*r*n + n*kernel). */
KVE_API kve_status kve_prefill_scores(const kve_prefill_params *params, size_t n,
                                      const float *rows, size_t ld, size_t group,
                                      kve_reduce reduce, double *scores);

/* Compresses heads [first, first + count) of `b`, which must hold nothing
 * yet (a new sequence), to the prefill of an n-token prompt: each head keeps
 * at most `budget` of the positions 0 .. n-1, chosen as described above.
 * rows: head first + j's query head g, row k at rows + ((j*group + g)*r +
 *      k)*ld, as kve_prefill_scores reads one KV head.
 * Refuses (nothing changed): what kve_prefill_scores refuses (the message
 *      names the head), plus NULL b, a range past the bank; a head that
 *      holds positions; a policy that is not scored (full, window,
 *      streaming, random: evict them instead) or that reads keys; budget 0,
 *      above the bank's budget, not above recent_window (H2O) or not above
 *      window (SnapKV). count 0 checks every argument but the rows (which
 *      may then be NULL) and changes nothing: a way to validate before
 *      computing the rows. KVE_ENOMEM if its scratch (2 n doubles, n bytes
 *      and budget heap entries) cannot be allocated.
 * Threads: as kve_bank_step_range. Cost: O(count*group*r*n) plus O(n log
 * budget) a head for the selection. */
KVE_API kve_status kve_bank_prefill(kve_bank *b, size_t first, size_t count,
                                    const kve_prefill_params *params, size_t n,
                                    const float *rows, size_t ld, size_t group,
                                    kve_reduce reduce, size_t budget);

/* ======================================================================
 * Attention rows for engines that never materialise attention
 *
 * Fused ("flash") attention kernels never write the attention weights, which
 * every scored policy reads. These functions recompute them from the query
 * and the kept keys: the softmax of one query over the keys the policy keeps
 * (the query's own key excluded), which is exactly the row the evaluation
 * harness feeds a policy (p_t restricted to the kept set, renormalised).
 *
 *     for every query head r of KV head h:   (or kve_bank_attn_rows, below)
 *         kve_attn_row(q[r], K[h], kve_bank_size(b, h), d, ld, scale, row[r]);
 *     kve_bank_step_grouped(b, pos, rows, ld_rows, group, KVE_REDUCE_MEAN);
 *
 * Cost, honestly: O(n*d) per query head per step, i.e. one more pass over
 * the kept keys (n keys of d floats) beside the attention kernel it shadows,
 * which reads the same keys (and the values) once; plus O(n) for the
 * softmax. For a 4096-key head of d = 128 that is 2 MiB of keys read again
 * per query head. Nothing is allocated.
 *
 * Definition (every instruction set gives the same bits): logit
 * l_i = scale * dot(q, k_i) in float32, the products summed in 16 partial
 * sums by dimension index mod 16 and then pairwise; m = max l_i;
 * e_i = exp(l_i - m) in float32 (kvevict's own exponential, within a few
 * ulp; 0 below e^-87.3); out_i = e_i / sum(e) with the sum and the division
 * in double, rounded to float32 once. The max is subtracted, so logits of
 * any finite size neither overflow nor give NaN, and a single key gets
 * exactly 1.
 * ====================================================================== */

/* Writes to out[0 .. n) the softmax over n keys of the logits
 * scale * dot(q, keys + i*ld), as defined above.
 *
 * q: d floats. keys: n rows of d floats, row i at keys + i*ld (ld >= d).
 * n == 0 writes nothing and succeeds (pointers may then be NULL).
 * Refuses (KVE_EINVAL): d == 0; ld < d; a NaN or infinite scale; NULL q,
 *       keys or out with n > 0; a logit that is not finite (a NaN or
 *       infinite input, or a dot product beyond float32): the message names
 *       the key, and out[0 .. n) then holds unspecified values.
 * Thread-safe (reads only its arguments). O(n*d). */
KVE_API kve_status kve_attn_row(const float *q, const float *keys, size_t n, size_t d,
                                size_t ld, float scale, float *out);

/* The rows kve_bank_step_range(b, first, count, pos, out, ld_out, group,
 * reduce) reads, for heads [first, first + count) of `b`: for KV head
 * h = first + j and its query heads g < group, query row r = j*group + g is
 *   kve_attn_row(q + r*d, keys + j*ld_head, kve_bank_size(b, h), d, ld_key,
 *                scale, out + r*ld_out).
 * So q holds count*group query vectors of d floats, contiguous; head h's
 * kept keys (in kept order: the engine's cache as the bank keeps it) start
 * at keys + j*ld_head with row stride ld_key; out row r has ld_out >= the
 * head's size. The reduction over a group is left to the grouped step, so an
 * engine that computes its own rows and one that calls this get the same.
 * Refuses as kve_attn_row (the message names head, query row and key), plus
 * NULL b, a range past kve_bank_heads(b), group 0, and ld_out smaller than
 * some head's size; all checked before anything is written, except a logit
 * that is not finite, found while writing (the rows written so far then hold
 * unspecified values). Reads `b` only: may run concurrently with other
 * readers of disjoint ranges (kvevict.h, "Banks"). O(count*group*n*d). */
KVE_API kve_status kve_bank_attn_rows(const kve_bank *b, size_t first, size_t count,
                                      size_t group, const float *q, size_t d, const float *keys,
                                      size_t ld_key, size_t ld_head, float scale, float *out,
                                      size_t ld_out);

/* ======================================================================
 * Traces
 *
 * A trace is a sequence of attention rows. Row t (query position t) holds
 * weights over keys [0, t], the query's own key t included, summing to 1.
 * Sources:
 *   "canonical" or "canonical:key=value,..."  the synthetic trace of
 *        docs/trace.md, generated on demand one row at a time (O(T) memory).
 *        Keys: version (3, the default: version 2's generator with three
 *        calibrated defaults; 2; or 1, the first; each kept bit for bit),
 *        seed, steps and the constants documented there for that version.
 *   a path to a .npy file: little-endian float32 or float64, C order, shape
 *        [T, T], [H, T, T] or [L, H, T, T]; each of the L*H heads is a trace.
 *        Entries above the diagonal are ignored. The whole file is validated
 *        when opened: a NaN, infinite or negative weight in [0, t], or a row
 *        t >= 1 whose sum over [0, t] is off 1 by more than 1e-3, is refused
 *        with KVE_EFORMAT naming the head and row (unless KVE_TRACE_NORMALIZE
 *        is given, which rescales each row to sum 1 instead; an all-zero row
 *        is still refused).
 *   "qk:PATH"  a query/key trace (docs/trace.md, "Query/key traces"): the
 *        file holds two .npy arrays back to back, the queries Q then the keys
 *        K, little-endian float32 or float64, C order, of shapes
 *        [L, H, T, d] and [L, G, T, d] (or [H, T, d] and [G, T, d], or
 *        [T, d] and [T, d]), G dividing H, T and d at least 1. The trace has
 *        L*G heads, one per KV head, layer-major. Row t of KV head (l, g) is
 *        computed on demand: for each of its H/G query heads h, the softmax
 *        over keys [0, t] of (1/sqrt(d)) q_t . k_i, computed exactly as
 *        kve_attn_row computes it (scale rounded to float32), then the
 *        group's rows averaged as KVE_REDUCE_MEAN (summed in double in
 *        query-head order, divided by the group, rounded to float32 once).
 *        Memory O(T*d): the keys of the head being read; the rest of the file
 *        is read as rows are asked for, in O(t*d) per row and query head.
 *        Opening checks both headers, the shapes against each other and the
 *        file's size, and every value (finite, and within float32 for a
 *        float64 file), naming the array, index and value at fault
 *        (KVE_EFORMAT); a row whose logits overflow float32 is refused when
 *        read (KVE_EFORMAT, naming head, row and key). The keys are available
 *        to key-reading policies (kve_trace_key). KVE_TRACE_NORMALIZE has no
 *        effect (the rows are softmaxes).
 *   an array in the caller's memory (kve_trace_from_memory, below): float32
 *        [L, H, T, T] in C order, validated as a .npy file is. Its source
 *        text is "memory", which kve_trace_open refuses (no text opens one;
 *        a file called memory opens as ./memory).
 * ====================================================================== */

typedef struct kve_trace kve_trace; /* opaque */

enum { KVE_TRACE_NORMALIZE = 1u };

/* Opens `src` (see above). flags: 0 or KVE_TRACE_NORMALIZE.
 * Refuses: KVE_EINVAL for a malformed canonical spec or NULL arguments;
 * KVE_EIO for a file that cannot be opened or read; KVE_EFORMAT for a
 * malformed .npy (bad magic, header, dtype, order, shape, truncation) or rows
 * that are not distributions; KVE_ENOMEM. */
KVE_API kve_status kve_trace_open(const char *src, unsigned flags, kve_trace **out);

/* kve_trace_open with progress reports while a .npy file is validated (one
 * unit per row of every head: heads * T in all); progress may be NULL. A
 * synthetic trace reports nothing. KVE_ECANCELED when progress asks to
 * stop. */
KVE_API kve_status kve_trace_open_ex(const char *src, unsigned flags, kve_progress_fn progress,
                                     void *user, kve_trace **out);

/* Makes a trace of attention already in memory, without copying it or
 * writing a file: e.g. a PyTorch model's output_attentions for one sequence,
 * stacked into one array.
 *
 * attn: layers * heads_per_layer heads of [steps, steps] float32 in C order
 *       (numpy's [L, H, T, T]; [H, T, T] is layers = 1 and [T, T] is
 *       layers = heads_per_layer = 1). Head h = l * heads_per_layer + j
 *       (layer-major, as kve_trace_heads counts them); element (h, t, i),
 *       the weight query t pays key i, is at attn[(h * steps + t) * steps + i].
 *       Entries above the diagonal (i > t) are never read.
 * flags: 0 or KVE_TRACE_NORMALIZE. The rows are validated now, exactly as a
 *       .npy file's are when opened (see above): every weight over keys
 *       [0, t] finite and >= 0, and every row t >= 1 summing to 1 within
 *       1e-3 unless KVE_TRACE_NORMALIZE, which divides each row by its sum
 *       (an all-zero row is still refused). kve_trace_row gives the weights
 *       widened to double, normalised in double: the same bits as the .npy
 *       file numpy saves from the same float32 array.
 * Lifetime: the array is borrowed. It must stay valid and unchanged until
 *       kve_trace_free(*out); a row found changed when read is refused with
 *       KVE_EFORMAT (checked, never trusted). kve_trace_source is "memory".
 * Refuses (*out untouched, nothing allocated): KVE_EINVAL for NULL attn or
 *       out, flags other than KVE_TRACE_NORMALIZE, a zero dimension, steps
 *       above INT32_MAX (positions are int32_t), a shape whose size in bytes
 *       does not fit in size_t; KVE_EFORMAT for a row that is not a
 *       distribution (the message names head, layer, row and key);
 *       KVE_ENOMEM.
 * Memory: the handle and one row of T doubles while validating (freed);
 *       never a copy of the array. Cost: one read of the lower triangle,
 *       layers * heads_per_layer * T * (T + 1) / 2 weights. Reads only the
 *       array: several traces may borrow one array, from several threads. */
KVE_API kve_status kve_trace_from_memory(const float *attn, size_t layers,
                                         size_t heads_per_layer, size_t steps, unsigned flags,
                                         kve_trace **out);

/* Releases `tr`. NULL is a no-op. */
KVE_API void kve_trace_free(kve_trace *tr);

/* T, the number of steps (rows) of every head. */
KVE_API size_t kve_trace_steps(const kve_trace *tr);

/* The number of heads: L*H for a .npy file of shape [L, H, T, T], H for
 * [H, T, T], 1 otherwise. Heads are numbered layer-major. */
KVE_API size_t kve_trace_heads(const kve_trace *tr);

/* L, the number of layers (1 unless the file is [L, H, T, T]). */
KVE_API size_t kve_trace_layers(const kve_trace *tr);

/* The canonical spec of a synthetic trace, the path of a file, or "memory". */
KVE_API const char *kve_trace_source(const kve_trace *tr);

/* Writes row `t` of head `head` to row[0 .. t] (t + 1 doubles: the weights
 * over keys 0..t). Rows may be read in any order; reading them in ascending
 * t is the fast path. Refuses: KVE_EINVAL for head or t out of range;
 * KVE_EIO if the file can no longer be read. O(t). */
KVE_API kve_status kve_trace_row(kve_trace *tr, size_t head, size_t t, double *row);

/* d, the dimension of the trace's key vectors: that of a q/K trace, 0 for a
 * trace without keys (canonical, a dense .npy) or NULL. */
KVE_API size_t kve_trace_key_dim(const kve_trace *tr);

/* Writes the key of position t of head `head` (its KV head's key: the
 * vector the file holds, kve_trace_key_dim(tr) floats) to key. Refuses:
 * KVE_EINVAL for NULL arguments, head or t out of range, or a trace without
 * keys; KVE_EIO if the file can no longer be read. O(d). */
KVE_API kve_status kve_trace_key(kve_trace *tr, size_t head, size_t t, float *key);

/* Writes head `head` of `tr` as a [T, T] float32 C-order .npy file (version
 * 1.0 header, zeros above the diagonal), kve_trace_npy_bytes(tr) bytes. The
 * file is written to a temporary name beside `path` and renamed into place,
 * so a failure leaves no partial file. Refuses: KVE_EINVAL, KVE_EIO (the
 * message carries the system's reason), KVE_ENOMEM; KVE_ERANGE for a weight
 * too large for float32 (possible only in row 0, which is not held to sum
 * 1). */
KVE_API kve_status kve_trace_write_npy(kve_trace *tr, size_t head, const char *path);

/* The same .npy bytes written to the open stream `f` (a pipe, standard
 * output, a temporary file of the caller's), reporting one progress unit per
 * row (T in all; progress may be NULL). The stream is not closed or
 * flushed. On failure (the statuses above, or KVE_ECANCELED) part of the
 * file may have been written: the caller discards it. */
KVE_API kve_status kve_trace_write_npy_file(kve_trace *tr, size_t head, FILE *f,
                                            kve_progress_fn progress, void *user);

/* The size in bytes of the file kve_trace_write_npy writes for `tr` (a
 * 64-byte-aligned header plus 4 * T * T); 0 for NULL. O(1). */
KVE_API uint64_t kve_trace_npy_bytes(const kve_trace *tr);

/* ======================================================================
 * Evaluation harness
 *
 * For each step t of one head of a trace, and each policy (kept set K):
 *  1. metrics on the full row p_t:
 *       retained mass = p_t(t) + sum over i in K of p_t(i)
 *       top-k recall  = |topk(p_t over [0, t)) & K| / min(k, t)
 *     (ties in the top-k go to the lower position); top32_recall is the
 *     recall at k = 32, topk_recall the recall at options.topk;
 *  2. the policy sees p_t restricted to K and renormalised: the kept weights
 *     summed in double in kept order, each divided by that sum in double and
 *     rounded to float32. A zero kept sum passes NULL (no information); at
 *     t = 0 an empty vector;
 *  3. kve_policy_step(t, ...), then kve_policy_evict(budget). A policy that
 *     reads keys (kve_policy_type_reads) is built with the trace's key
 *     dimension and stepped with kve_policy_step_keys and the key of
 *     position t (kve_trace_key): it runs on traces that have keys (q/K
 *     traces), and a job whose policy reads keys is refused on a trace
 *     without them.
 * Metrics are means over the steps t > budget (before that nothing can have
 * been evicted), the "scored" steps. When there is none (budget >= T - 1),
 * scored_steps is 0 and every metric (retained_mass, top32_recall,
 * topk_recall, min_retained_mass) is NaN: a mean over no step is not a
 * number, and a caller must not mistake it for a perfect score (test with
 * isnan). Policies of one call run in lockstep over one pass of the trace,
 * so a row is generated or read once however many policies are evaluated.
 * ====================================================================== */

typedef struct kve_eval_job {
    const char *spec; /* policy spec */
    size_t budget;    /* 0: the spec's budget; else overrides it */
} kve_eval_job;

typedef struct kve_eval_result {
    char spec[KVE_SPEC_MAX];  /* canonical spec of the policy evaluated */
    size_t budget;            /* budget evicted to */
    size_t steps;             /* steps evaluated: T unless stopped early */
    size_t scored_steps;      /* steps with t > budget; 0: the metrics are NaN */
    double retained_mass;     /* mean over scored steps (NaN if none) */
    double top32_recall;      /* mean over scored steps, k = 32 (NaN if none) */
    double min_retained_mass; /* minimum over scored steps (NaN if none) */
    double ns_per_step;       /* policy work only (step + evict), per step */
    size_t state_bytes;       /* kve_policy_state_bytes at the end */
    size_t topk;              /* k of topk_recall: options.topk (32 by kve_eval) */
    double topk_recall;       /* mean over scored steps, k = topk (NaN if none) */
    double mean_kept;         /* positions kept after the evict, mean over scored steps
                                 (NaN if none): below the budget with pages */
} kve_eval_result;

/* Called after each step of each job with the positions just evicted
 * (ascending; with several heads, head after head, each ascending, and
 * n_victims their total). Return non-zero to stop the evaluation: the other
 * jobs finish the step in progress (without further calls), so every result
 * covers the same steps, and the evaluation returns KVE_OK with the steps
 * done so far. */
typedef int (*kve_eval_step_fn)(void *user, size_t job, int32_t pos, const int32_t *victims,
                                size_t n_victims);

/* What kve_eval_ex does besides the jobs. Start from
 * kve_eval_default_options() and set the fields you need, so that a field
 * added later keeps its default. */
typedef struct kve_eval_options {
    uint64_t seed;            /* policies needing an Rng get one seeded from it: the
                                 same seed for every job, so a job's result does not
                                 depend on its neighbours (default 0) */
    size_t topk;              /* k of topk_recall, 1 .. KVE_MAX_BUDGET (default 32) */
    kve_eval_step_fn on_step; /* called after each step of each job (default NULL) */
    void *user;               /* passed to on_step (default NULL) */
    size_t heads;             /* trace heads [head, head + heads) run together, one bank
                                 of `heads` heads per job (default 1; 0 means 1) */
    kve_bank_options bank;    /* the jobs' banks: with bank.share > 0 each group of
                                 share heads is evicted to share * budget by
                                 kve_bank_evict_shared (default: no sharing);
                                 bank.key_dim is ignored: the trace's is used */
    size_t score_after;       /* metrics over steps t > score_after; 0 (default): over
                                 t > the job's budget. Lets jobs of different budgets
                                 (a layer schedule) be measured on the same steps */
    kve_eval_result *per_head; /* NULL (default), or n_jobs * heads results, job-major:
                                 head h of job j at [j * heads + h], its own metrics */
} kve_eval_options;

/* The defaults: seed 0, topk 32, no callback, one head, no sharing,
 * score_after 0, no per-head results. */
KVE_API kve_eval_options kve_eval_default_options(void);

/* Evaluates n_jobs policies on head `head` of `tr`, writing results[i] for
 * jobs[i]; results are written only when the whole call succeeds. options
 * may be NULL (the defaults).
 * Several heads (options->heads = H > 1): each job is one bank of H heads
 * (kve_bank_new_ex with options->bank), head h fed head + h of the trace as
 * above, the heads stepped and evicted together; results[i] holds the means
 * over the heads of each head's metrics (min_retained_mass the minimum,
 * state_bytes the bank's, ns_per_step the whole bank's step and evict), and
 * per_head (when given) each head's own (state_bytes and ns_per_step: the
 * bank's divided by H). Without sharing, head h's numbers are exactly those
 * of a one-head evaluation of that trace head. Sharing, the heads of a group
 * are stepped in one call, so a head whose kept weights sum to 0 receives a
 * row of zeros (unless every head of the bank does: then NULL).
 * Refuses: KVE_EINVAL for NULL arguments, n_jobs 0, a bad spec or budget or
 * bank option (message names the job's spec), heads past the trace's, topk
 * 0 or above KVE_MAX_BUDGET; KVE_ENOMEM; KVE_EIO from the trace.
 * Memory: O(H * T + min(topk, T)) plus the banks. Cost per step: O(H * t log
 * k) for the top-k sets (shared by every job) plus O(kept) per job and head. */
KVE_API kve_status kve_eval_ex(kve_trace *tr, size_t head, const kve_eval_job *jobs,
                               size_t n_jobs, const kve_eval_options *options,
                               kve_eval_result *results);

/* kve_eval_ex with options {seed, topk 32, on_step, user}. */
KVE_API kve_status kve_eval(kve_trace *tr, size_t head, const kve_eval_job *jobs, size_t n_jobs,
                            uint64_t seed, kve_eval_step_fn on_step, void *user,
                            kve_eval_result *results);

#ifdef __cplusplus
}
#endif

#endif /* KVEVICT_H */
