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
 * Memory. kve_bank_new allocates the handle with its heads (about 150 bytes
 * a head) and one slab per column of n_heads * (budget + 1) slots
 * (window/streaming: their sliding block). As with a policy, nothing
 * allocates while every head is evicted after every step; a head stepped
 * past its slots without evicting moves to a private block of twice the
 * slots, and the slabs are freed once no head uses them.
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

/* Releases `b` and everything it owns. NULL is a no-op. */
KVE_API void kve_bank_free(kve_bank *b);

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
 * kve_bank_evict, plus first + count > kve_bank_heads(b). */
KVE_API kve_status kve_bank_evict_range(kve_bank *b, size_t first, size_t count, size_t budget,
                                        int32_t *victims, size_t ld_victims, size_t *counts);

/* The instruction set the library's kernels run with on this machine:
 * "avx512", "avx2" or "scalar" (the portable code, the definition the others
 * equal bit for bit). Chosen once, at the first call that needs it, from the
 * CPU. Never NULL; the string is static. */
KVE_API const char *kve_isa_name(void);

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
 *        Keys: version (2, the default, or 1 for the first version, kept
 *        bit for bit), seed, steps and the constants documented there for
 *        that version.
 *   a path to a .npy file: little-endian float32 or float64, C order, shape
 *        [T, T], [H, T, T] or [L, H, T, T]; each of the L*H heads is a trace.
 *        Entries above the diagonal are ignored. The whole file is validated
 *        when opened: a NaN, infinite or negative weight in [0, t], or a row
 *        t >= 1 whose sum over [0, t] is off 1 by more than 1e-3, is refused
 *        with KVE_EFORMAT naming the head and row (unless KVE_TRACE_NORMALIZE
 *        is given, which rescales each row to sum 1 instead; an all-zero row
 *        is still refused).
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
 *  3. kve_policy_step(t, ...), then kve_policy_evict(budget).
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
} kve_eval_result;

/* Called after each step of each job with the positions just evicted
 * (ascending). Return non-zero to stop the evaluation: the other jobs finish
 * the step in progress (without further calls), so every result covers the
 * same steps, and the evaluation returns KVE_OK with the steps done so far. */
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
} kve_eval_options;

/* The defaults: seed 0, topk 32, no callback. */
KVE_API kve_eval_options kve_eval_default_options(void);

/* Evaluates n_jobs policies on head `head` of `tr`, writing results[i] for
 * jobs[i]; results are written only when the whole call succeeds. options
 * may be NULL (the defaults). Refuses: KVE_EINVAL for NULL arguments, n_jobs
 * 0, a bad spec or budget (message names the job's spec), head out of range,
 * topk 0 or above KVE_MAX_BUDGET; KVE_ENOMEM; KVE_EIO from the trace.
 * Memory: O(T + min(topk, T) + sum of budgets). Cost per step: O(t log k)
 * for the top-k sets (shared by every job) plus O(kept) per job. */
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
