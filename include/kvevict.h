/* SPDX-License-Identifier: MIT */
/*
 * kvevict.h - KV-cache eviction policies for LLM inference: the engine core.
 *
 * Everything an inference engine needs: policies, banks of heads, shared
 * budgets, layer schedules, pages, prefill compression, attention rows for
 * fused attention kernels. Pure C11: the library behind this header does no
 * file I/O, reads no clock and includes no POSIX header. The research
 * harness (attention traces, .npy files, the evaluation of policies) is a
 * second library on top of this one, with its own header, kvevict_eval.h.
 *
 * This header is also the reference manual: every function states what it
 * does, what it returns, what it refuses, what it does with NULL, what
 * threads may call it, what it allocates and what it costs. It is ordered by
 * what a reader needs first:
 *
 *   1. Conventions       status, errors, version, threads, argument order,
 *                        limits, stability
 *   2. The allocator     where every byte the library owns comes from
 *   3. Random numbers    the one transparent struct
 *   4. Policies          one head: new, options, step, keys, queries and
 *                        values, evict, accessors, the type registry,
 *                        specs, score rules of the application's own; its
 *                        lifecycle: clone, copy, remove, reset, save, load
 *   5. Banks             every head of an engine behind one handle:
 *                        construction, options, every step and evict form,
 *                        shared budgets, the lifecycle of every head
 *   6. Budgets across layers
 *   7. Pages
 *   8. Prefill compression
 *   9. Attention rows    for engines that never materialise attention
 *  10. Instruction sets
 *
 * Vocabulary (used throughout):
 *   position   the index of a token in the sequence, an int32_t >= 0.
 *   kept set   the positions a policy currently keeps, held in ascending
 *              order ("kept order"). Attention vectors passed to a policy are
 *              index-aligned with kept order.
 *   budget     the number of positions a policy may keep after an eviction.
 *   spec       a text description of a policy:
 *              "name" or "name:key=value,key=value".
 */
#ifndef KVEVICT_H
#define KVEVICT_H

#include <stddef.h>
#include <stdint.h>

#include "kvevict_version.h" /* KVEVICT_VERSION_MAJOR/MINOR/PATCH/STRING/NUMBER */

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the public functions; the library is built with hidden visibility,
 * so nothing else is exported from the shared object (but the kve__
 * functions kvevict_eval calls: see docs/architecture.md). */
#if defined(__GNUC__) || defined(__clang__)
#define KVE_API __attribute__((visibility("default")))
#define KVE_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define KVE_API
#define KVE_PRINTF(fmt, args)
#endif

/* ======================================================================
 * 1. Conventions
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
 * state except the per-thread error message, the instruction set of its
 * kernels (chosen once from the CPU) and the registry of score rules (which
 * has its own lock: see "Score rules"). One object must not be used from two
 * threads at the same time, with one exception: disjoint head ranges of one
 * bank (see "Banks").
 *
 * Calls from callbacks. While a call into a policy or bank runs the caller's
 * code (a score rule's observe, the object's allocator), every call into
 * that same object from the same thread is refused with KVE_EINVAL naming
 * it: steps, evicts, prefill, remove, copy (into or from it), clone and
 * save, the outer call going on unharmed. Its free and reset are ignored
 * there (the object stays as it is; kve_last_error says why), and its
 * queries (size, positions, spec, sizes, attention rows) see the kept set as
 * it was before the outer call. The allocator also runs while the object
 * is built (by its constructor, a clone or a load, before the handle is
 * returned: the allocator may know it as the first block it handed out)
 * and while it is freed: those calls are refused then too, free and reset
 * ignored, and its queries must not be made. A copy's source is read
 * while the destination's allocator runs: calls into it are refused then
 * too ("called from inside a callback of a copy from this policy"). Other
 * objects may be used from a callback.
 *
 * Memory. Constructors allocate, through the allocator of their options (see
 * "The allocator"); nothing on the steady-state decode path does (see
 * kve_policy_step). Every object is released by its *_free function, which
 * accepts NULL. Options are passed as a struct that the caller starts from
 * kve_X_default_options() and sets the fields it needs in, so that a field
 * added later keeps its default; a NULL options pointer means the defaults.
 * No option field holds an output buffer, and none uses 0 to mean something
 * other than zero where a named constant can say it.
 *
 * Argument order. The step, evict, prefill and attention-row families take
 * their arguments in one order:
 *   the object; the head range (first, count); the position or budget the
 *   call is about; the input data, each array followed by its layout (its
 *   row stride ld, then what else describes its rows: the query heads per
 *   KV head and how they are reduced); the options; the outputs, each
 *   followed by its capacity or stride.
 * A call without an object or a head range starts at the next item, e.g.
 *   kve_bank_step_range(b, first, count, pos, attn, ld, group, reduce, keys, ld_keys)
 *   kve_bank_evict_range(b, first, count, budget, victims, ld_victims, counts)
 *   kve_prefill_scores(n, rows, ld, group, reduce, options, scores)
 * and every function that writes a caller's buffer is told its capacity.
 *
 * Stability. Version 0.x: the functions marked [stable] keep their name,
 * signature and meaning from here on (so do the kve_status values); the
 * others may still change before 1.0, each change named in the release
 * notes.
 * ====================================================================== */

/* The version of the library linked at run time, "MAJOR.MINOR.PATCH" (static
 * string); KVEVICT_VERSION_STRING is the version of the header compiled
 * against. kve_version_number() is MAJOR * 10000 + MINOR * 100 + PATCH, as
 * KVEVICT_VERSION_NUMBER. */
KVE_API const char *kve_version(void);
KVE_API unsigned kve_version_number(void);

/* Limits (the one place they are defined). */
/* The largest budget any policy spec accepts (2^24 positions). */
#define KVE_MAX_BUDGET 16777216
/* Bytes that hold any canonical policy spec, its NUL included: a buffer for
 * kve_spec_with that always fits (and the size of kve_eval_result.spec). */
#define KVE_SPEC_MAX 256
/* The largest key dimension a policy accepts (2^16 floats); also the
 * largest value dimension. */
#define KVE_MAX_KEY_DIM 65536
/* As p1 of kve_policy_remove and kve_bank_remove: through the last
 * position, INT32_MAX (the largest a step accepts) included. */
#define KVE_POS_END INT32_MAX
/* The most query heads per KV head whose queries a step may carry. */
#define KVE_MAX_QUERY_GROUP 4096
/* The most score rules registered at once, and the doubles of per-slot
 * state one may keep (see "Score rules"). */
#define KVE_MAX_SCORE_RULES 16
#define KVE_MAX_RULE_STATE 16

/* [stable] */
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

/* [stable] The message of this thread's most recent failure, e.g.
 *   "h2o: recent_window 512 must be smaller than budget 512".
 * Thread-local: a failure in one thread never shows in another. Successful
 * calls do not clear it (read it only after a call returned non-OK). Returns
 * "" when this thread has had no failure. The string stays valid until the
 * next failing call in this thread. */
KVE_API const char *kve_last_error(void);

/* Sets this thread's message (what kve_last_error returns) from a printf
 * format and its arguments, and returns `s`, so that a failure reads
 *     return kve_set_error(KVE_EINVAL, "rows: %zu is not %zu", got, want);
 * For the callbacks and the layers built on kvevict (the harness's sources,
 * an engine's wrapper, the decoder of lm/): their failures then reach the
 * caller as the library's own do. The arguments may quote the message being
 * replaced (kve_set_error(st, "layer %zu: %s", l, kve_last_error()) prefixes
 * it). The message is truncated to 255 bytes and each control character
 * becomes '?', so it stays one printable line; a NULL fmt clears it.
 * Thread-safe (the message is per thread); never allocates. */
KVE_API kve_status kve_set_error(kve_status s, const char *fmt, ...) KVE_PRINTF(2, 3);

/* ======================================================================
 * 2. The allocator
 *
 * Every byte an object owns, and every byte of scratch a call uses, comes
 * from one allocation function in the manner of Lua's lua_Alloc, so an
 * engine can count, cap, pool or pin the library's memory:
 *
 *     void *fn(void *ud, void *ptr, size_t old_size, size_t new_size);
 *
 *   new_size == 0   frees ptr (a block of old_size bytes) and returns NULL;
 *   ptr == NULL     allocates new_size bytes (old_size is then 0);
 *   otherwise       resizes ptr from old_size to new_size bytes.
 * On failure it returns NULL and leaves ptr untouched. Blocks must be aligned
 * for any object type, as malloc's are. The library passes back exactly the
 * size it asked for as old_size, never asks for 0 bytes and never frees
 * NULL.
 *
 * Every constructor's options carry `const kve_allocator *allocator`: NULL
 * is the C library's (malloc, realloc, free). The object copies the struct
 * (so it may be a temporary), and fn and ud must stay valid until the object
 * is freed; every allocation the object makes afterwards (growth, scratch)
 * goes through the same copy, and its free releases everything through it.
 * Calls that allocate scratch without an object (kve_prefill_scores) take
 * the allocator through their own options.
 *
 * Threads: the library calls fn from the thread that called into the
 * object. Objects used from several threads, or threads stepping disjoint
 * head ranges of one bank (whose heads may grow), call one allocator at once:
 * it must then be safe for that.
 * ====================================================================== */

typedef void *(*kve_alloc_fn)(void *ud, void *ptr, size_t old_size, size_t new_size);

typedef struct kve_allocator {
    kve_alloc_fn fn; /* the function above */
    void *ud;        /* passed to every call of fn */
} kve_allocator;

/* ======================================================================
 * 3. Random numbers
 *
 * xoshiro256** seeded through splitmix64. The one transparent struct of the
 * API, meant to live on the caller's stack. For a given seed the sequence is
 * the same on every platform and every run.
 * ====================================================================== */

typedef struct kve_rng {
    uint64_t s[4];
} kve_rng;

/* [stable] Seeds `rng` from `seed` by four splitmix64 draws. O(1). */
KVE_API void kve_rng_seed(kve_rng *rng, uint64_t seed);

/* The next 64-bit output of xoshiro256**. O(1). */
KVE_API uint64_t kve_rng_next(kve_rng *rng);

/* [stable] A double uniform in [0, 1): the top 53 bits of kve_rng_next()
 * times 2^-53. */
KVE_API double kve_rng_uniform(kve_rng *rng);

/* A uniform integer in [0, bound) without modulo bias (rejection sampling);
 * 0 when bound is 0. Consumes one or (rarely) more outputs. */
KVE_API uint64_t kve_rng_below(kve_rng *rng, uint64_t bound);

/* ======================================================================
 * 4. Policies
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
 * and the keys listed on its page in docs/policies/ (the page keys block
 * and block_mean: see "Pages"). Policies:
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
 *   expected_attention  the attention expected from the statistics of the
 *                  recent queries (reads queries, keys and values)
 * and the score rules an application registers (see "Score rules").
 *
 * What a policy reads. Every policy declares what it reads at a step
 * (kve_policy_reads, kve_policy_type_reads): the attention weights over its
 * kept set (the h2o family), the key vector of the position it admits
 * (knorm, keydiff), the queries and the value of that position
 * (expected_attention; the value also for any scored policy with vnorm=1),
 * or nothing (full, window, streaming, random). An engine
 * whose attention kernel never writes weights can run a key-reading policy
 * with no extra pass over the cache: it hands the policy the key it has just
 * computed, once per (KV head, position):
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
 *
 * Queries and values. A step may also carry, per KV head, the queries of
 * its query heads at `pos` and the value of `pos` (kve_step_data, stepped
 * with kve_policy_step_data or kve_bank_step_data). Like the key dimension,
 * their shapes are facts of the model given at construction
 * (kve_policy_options): query_group, the query heads per KV head (a query
 * has key_dim floats), and value_dim, the floats of a value. Queries are,
 * like keys, the vectors the attention compares: after the rotary embedding
 * at `pos` (what an engine feeds its attention kernel). A policy that models
 * queries before the rotation (expected_attention) undoes it itself, from
 * the rotary embedding described by options.rope (kve_rope): rotary_dim,
 * base and the pairing of dimensions.
 *
 * Value-aware scores (vnorm). The attention a position receives matters to
 * the output in proportion to the size of what it contributes (CriticalKV,
 * Feng et al. 2025; VATP, Guo et al. 2024): every scored policy that reads
 * attention (h2o, scissorhands, tova, h2o_decay, h2o_mean, and every
 * registered score rule) takes the spec key
 *   vnorm          (default 0, 0 or 1)  1: the score is the rule's score
 *                  times ||v||, the norm of the position's value
 * with ||v|| = the square root of the sum of squares in double in 8 partial
 * sums (as knorm's ||k||) of whatever value_dim floats the engine hands for
 * the position: its value, or CriticalKV's W_o v (the value projected by
 * the head's slice of the output projection) where the engine has it. It is
 * computed once, when the position is admitted, and kept in a column (8
 * bytes a slot); the rule's own score is kept beside it (8 bytes more) and
 * multiplied by it in the step's pass, one multiply a slot: exactly,
 * score = rule_score * ||v||, one rounding, for every rule. So h2o:vnorm=1
 * is 29 bytes a slot and reads attention and values (every step must carry
 * the new value). vnorm=0 is the policy without it, exactly, and its
 * canonical spec omits the key. expected_attention has its own vnorm
 * (default 1, kvpress's use_vnorm).
 *   vnorm=2        kvpress's CriticalKVPress: ||v|| is the mean over the
 *                  query_group equal parts of the value (W_o,g v of each
 *                  query head g, value_dim a multiple of query_group) of
 *                  their L1 norms, and positions are chosen in two stages:
 *                  floor(first_stage * B) of a budget B (the protected
 *                  newest counted in it) by the rule's score, the rest by
 *                  (score + epsilon) * ||v||, at every eviction and in a
 *                  prefill (H2O, SnapKV); keys
 *   epsilon        (default 1e-4, 0 .. 1e6) and
 *   first_stage    (default 0.5, 0 .. 1), refused without vnorm=2. Not
 *                  with pages, share, same_positions, kve_bank_evict_shared
 *                  or a KVzip prefill (refused). Scratch: 16 bytes a slot.
 *                  docs/policies/vnorm.md.
 *
 * expected_attention (Devoto, Jeblick, Jegou 2025; kvpress's
 * ExpectedAttentionPress, and its DecodingPress for rescoring while
 * decoding). Future queries are modelled as Gaussian. Per query head g of
 * the KV head, over the queries of the newest n_queries steps (not counting
 * the head's first n_sink steps, the sinks' own), un-rotated to before the
 * rotary embedding: mean mu_g and covariance Sigma_g (divided by the count);
 * with query_stats=1, the caller's instead (kve_bank_query_stats).
 * The rotation is averaged over the next n_future_positions positions
 * pos + 1 .. pos + F (with future_from_buffer=1, kvpress's DecodingPress
 * offset: from m + n_sink, m the buffered queries, its press's q_len): R =
 * mean of R(p), applied as mu' = R mu, Sigma' = R Sigma R^T. A kept key k
 * (post-RoPE) then has the expected softmax numerator's log
 * z_g(k) = mu'.k / sqrt(d) + k^T Sigma' k / (2 d)
 * (use_covariance=0 drops the second term); score = the mean over g of the
 * softmax of z_g over the kept keys that are not sinks, with vnorm=1 times
 * (score + epsilon) ||v||. The first n_sink kept slots are sinks, scored
 * above every other (kvpress keeps them). Every kept key is rescored every
 * `interval` steps (and at a step flagged KVE_STEP_RESCORE); in between a
 * newcomer is scored against the statistics and the softmax of the last
 * rescoring. Cost: a rescoring O(n_queries G d^2 + kept G d^2) (covariance;
 * O(kept G d) without), so per step O((n_queries + kept) G d^2 / interval)
 * amortised plus O(G d^2) for the newcomer. Memory: 21 + 4 d bytes a slot
 * (the key is kept for the rescoring), 29 + 4 d with vnorm, plus a head's
 * query buffer of n_queries G d floats and its statistics (G (d^2 + d)
 * doubles). docs/policies/expected_attention.md defines every operation.
 * ====================================================================== */

typedef struct kve_policy kve_policy; /* opaque */

/* [stable] Builds a policy from `spec` and stores it in *out; as
 * kve_policy_new_ex(spec, rng, NULL, out).
 *
 * rng: policies that draw random numbers (random) require one and refuse
 *      NULL; they seed a private generator from one kve_rng_next(rng) draw,
 *      so the caller's generator advances by one output and several policies
 *      built from one generator draw independent streams. Deterministic
 *      policies ignore `rng` entirely (it may be NULL and is not advanced).
 * Refuses (KVE_EINVAL): NULL spec or out; an unknown name; an unknown,
 *      repeated, malformed or out-of-range key or value; parameters that
 *      contradict each other (recent_window >= budget, sinks >= budget);
 *      a policy that reads keys (it needs a key dimension: kve_policy_new_ex).
 *      The message names the key. KVE_ENOMEM if allocation fails.
 * Allocates (through the C library's allocator) the handle and the per-slot
 * storage for budget + 1 positions (the steady state of step-then-evict);
 * *out is untouched on failure. */
KVE_API kve_status kve_policy_new(const char *spec, kve_rng *rng, kve_policy **out);

/* How the model's rotary embedding (RoPE) pairs the dimensions of a query
 * or key: pair j of the rotary_dim rotated ones is (2j, 2j + 1) or
 * (j, j + rotary_dim / 2). */
typedef enum kve_rope_pairs {
    KVE_ROPE_ADJACENT = 0, /* (2j, 2j+1): llama2.c, GPT-J, llama.cpp's LLaMA rope */
    KVE_ROPE_HALF = 1      /* (j, j+r/2): Hugging Face's rotate_half, GPT-NeoX, kvpress */
} kve_rope_pairs;

/* rotary_dim until an engine says otherwise: a policy that needs the
 * rotary embedding (expected_attention) refuses it. */
#define KVE_ROPE_UNSET SIZE_MAX

/* How the model rescales the frequencies of its rotary embedding for a
 * longer context: Hugging Face's rope_type (transformers'
 * ROPE_INIT_FUNCTIONS) of the same name. */
typedef enum kve_rope_scaling {
    KVE_ROPE_SCALING_NONE = 0, /* "default": theta_j = base^(-2j / r) */
    KVE_ROPE_SCALING_LINEAR,   /* "linear": theta_j / factor */
    KVE_ROPE_SCALING_LLAMA3,   /* "llama3": Llama 3.1's smoothing by wavelength */
    KVE_ROPE_SCALING_YARN      /* "yarn": YaRN's ramp between interpolation and extrapolation */
} kve_rope_scaling;

/* The model's rotary embedding: pair j (j < rotary_dim / 2) of a vector at
 * position p is turned by the angle p * theta_j, as
 * (x, y) -> a (x cos - y sin, x sin + y cos), and the dimensions from
 * rotary_dim on are not rotated. Without scaling theta_j = base^(-2j / r)
 * and a = 1. With scaling theta_j is Hugging Face's inv_freq, w_j = 2 pi /
 * base^(-2j / r) the unscaled wavelength, L = original_max_position:
 *   LINEAR  theta_j = base^(-2j / r) / factor;
 *   LLAMA3  theta_j = base^(-2j / r) where w_j < L / high_freq_factor,
 *           / factor where w_j > L / low_freq_factor, and in between
 *           (1 - s) t / factor + s t, t = base^(-2j / r),
 *           s = (L / w_j - low_freq_factor) / (high_freq_factor - low_freq_factor);
 *   YARN    theta_j = t_j / factor (1 - e_j) + t_j e_j, e_j = 1 - clamp((j - lo)
 *           / (hi - lo), 0, 1) (hi - lo: 0.001 where they meet), lo =
 *           max(floor(c(beta_fast)), 0), hi = min(ceil(c(beta_slow)), r - 1),
 *           c(b) = r ln(L / (2 pi b)) / (2 ln base) (transformers' truncate=True).
 * a is attention_factor (HF's attention_scaling, by which it multiplies cos
 * and sin), derived when 0: 0.1 ln(factor) + 1 for YARN (1 when factor is 1;
 * a model with mscale and mscale_all_dim passes HF's quotient here), 1
 * otherwise. With freq_factors, t_j = base^(-2j / r) / freq_factors[j]
 * everywhere above (w_j = 2 pi / t_j). Only expected_attention reads the rope (docs/policies/
 * expected_attention.md); the fields a scaling does not name are ignored by
 * it but still validated. Dynamic NTK and LongRoPE are not modelled. */
typedef struct kve_rope {
    size_t rotary_dim;    /* r: even, <= key_dim; 0: no rotary embedding;
                             default KVE_ROPE_UNSET */
    double base;          /* the base of the frequencies, > 0 and finite
                             (default 10000: LLaMA's theta); > 1 with YARN */
    kve_rope_pairs pairs; /* default KVE_ROPE_ADJACENT */
    /* Fields from here on are zero in an initializer that names only the
     * three above; zero means the default wherever the default differs. */
    kve_rope_scaling scaling;    /* default KVE_ROPE_SCALING_NONE (0) */
    double factor;               /* LINEAR, LLAMA3, YARN: the context's scale, finite
                                    and >= 1; 0 means 1 (the default) */
    double low_freq_factor;      /* LLAMA3: finite and > 0, below high_freq_factor
                                    (checked with LLAMA3); 0 means 1 (the default,
                                    Llama 3.1's) */
    double high_freq_factor;     /* LLAMA3: finite and > 0; 0 means 4 (the default,
                                    Llama 3.1's) */
    size_t original_max_position; /* LLAMA3, YARN: L, the model's
                                    original_max_position_embeddings (8192 for Llama
                                    3.1); 0 (the default): unset, which LLAMA3 and
                                    YARN refuse; at most 2^31 - 1 */
    double beta_fast;            /* YARN: finite and > 0; 0 means 32 (the default) */
    double beta_slow;            /* YARN: finite and > 0, at most beta_fast (checked
                                    with YARN); 0 means 1 (the default) */
    double attention_factor;     /* a: finite and >= 0; 0 (the default): derived as
                                    above; any other value multiplies the rotation
                                    under every scaling, NONE included */
    const float *freq_factors;   /* r/2 per-pair divisors, each finite and > 0:
                                    base^(-2j / r) / freq_factors[j] stands for
                                    base^(-2j / r) before NONE, LINEAR or YARN (not
                                    LLAMA3: these are its factors already), as
                                    llama.cpp divides by a GGUF's rope_freqs.weight
                                    (Llama 3's factors). Read at construction and
                                    copied (r at most KVE_ROPE_MAX_FACTORS * 2);
                                    NULL (the default): none */
} kve_rope;

/* The most per-pair factors a kve_rope carries (rotary_dim 512). */
#define KVE_ROPE_MAX_FACTORS 256

/* What kve_policy_new_ex builds besides the spec (kve_bank_options carries
 * the same fields for a bank). Every field but the allocator is a fact of
 * the model, not of the policy (see "Queries and values"). */
typedef struct kve_policy_options {
    const kve_allocator *allocator; /* NULL (the default): the C library's */
    size_t key_dim; /* d: the floats of every key a step carries, 0 .. KVE_MAX_KEY_DIM;
                       0 (the default): steps carry no keys */
    size_t value_dim;   /* the floats of every value a step carries, 0 .. KVE_MAX_KEY_DIM;
                           0 (the default): steps carry no values */
    size_t query_group; /* G: the query heads of the KV head, whose queries (key_dim
                           floats each) a step carries, 1 .. KVE_MAX_QUERY_GROUP
                           (default 1) */
    kve_rope rope;      /* the rotary embedding of the queries and keys (default
                           rotary_dim KVE_ROPE_UNSET, base 10000, adjacent pairs) */
    int unchecked;      /* 0 (the default): every step validates every attention weight
                           before any score changes; 1: the caller promises finite weights
                           >= 0 and steps skip that pass (see "Unchecked steps" below) */
} kve_policy_options;

/* The defaults: the C library's allocator, key_dim 0, value_dim 0,
 * query_group 1, rope unset (base 10000, adjacent pairs, no scaling: factor 1,
 * low_freq_factor 1, high_freq_factor 4, original_max_position 0, beta_fast
 * 32, beta_slow 1, attention_factor 0, no freq_factors), checked
 * (unchecked 0).
 *
 * Unchecked steps. A checked step (the default) reads every attention weight
 * twice: once to validate it (finite, >= 0; for KVE_REDUCE_SUM, a reduced
 * weight that fits float32), before any score changes, so that a refused
 * step changes nothing; then once to update the scores. An engine whose
 * attention is a softmax it computed itself can promise valid weights and
 * build its policies (or banks: kve_bank_options.unchecked) with
 * unchecked = 1, and every step then skips the validation pass: one pass
 * over the attention instead of two.
 *   Skipped: the weight checks above, and nothing else.
 *   Still checked, with the same refusals and messages: NULL objects; pos
 *     (negative, not increasing); n == size (a policy) and ld >= every
 *     head's size (a bank); rows or keys that overflow the address space;
 *     group, reduce and the head range; a key missing, unexpected, with
 *     ld_keys < key_dim, or with a NaN or infinite entry (a key is O(d) to
 *     check); growth that cannot allocate. Evictions check as always, and
 *     kve_bank_prefill still validates its rows.
 *   Valid weights: the results are bit-identical to the checked step's
 *     (the same victims, kept sets and score bits, on every instruction
 *     set).
 *   Invalid weights (the promise broken): the step succeeds and the scores
 *     of the heads that read them become unspecified (a NaN or an infinity
 *     spreads into h2o's sum and h2o_decay's decayed sum, and stays there
 *     while the position is kept; tova's score is the weight itself), so the
 *     victims chosen from them are unspecified too, and may differ between
 *     instruction sets. What stays defined: every call keeps the object's
 *     invariants, so each victim is a kept position outside the recent
 *     window, counts and sizes stay within 0 .. size, kept positions stay
 *     ascending, nothing is read or written outside the caller's buffers
 *     and the object's own storage, and nothing is undefined behaviour
 *     (tests/test_unchecked.c runs NaN, infinite and negative weights under
 *     AddressSanitizer and UndefinedBehaviorSanitizer). Other heads and
 *     other objects are unaffected. The save of such an object holds those
 *     scores, and a load refuses it (a score that is not finite, or
 *     negative attention received): a checked object's save always loads,
 *     an unchecked one's only while its promise is kept.
 * Policies that read no attention (full, window, streaming, random) and
 * those that read keys (knorm, keydiff, expected_attention, which scores
 * from queries and keys) only validate the attention they are given;
 * unchecked, they skip even that. Queries, values and keys are checked
 * either way. vnorm=1 changes nothing here (its value norms come from the
 * checked values). A score rule's observe receives the weights unchecked
 * as they are given (their reduction too), and its scores are still
 * checked: a score that is not finite refuses the step as ever. */
KVE_API kve_policy_options kve_policy_default_options(void);

/* kve_policy_new with options (NULL: the defaults).
 * Refuses as kve_policy_new, plus (KVE_EINVAL): key_dim or value_dim above
 * KVE_MAX_KEY_DIM; query_group 0 or above KVE_MAX_QUERY_GROUP; a rope
 * whose rotary_dim is odd or above key_dim (unless KVE_ROPE_UNSET), or
 * whose base is not finite and > 0, or pairs outside kve_rope_pairs, or a
 * scaling field out of the range kve_rope gives (scaling outside
 * kve_rope_scaling, factor not 0 or finite >= 1, a field NaN or infinite,
 * LLAMA3 with low_freq_factor >= high_freq_factor, YARN with beta_slow >
 * beta_fast or base <= 1, LLAMA3 or YARN with original_max_position 0;
 * freq_factors with LLAMA3, with rotary_dim KVE_ROPE_UNSET or above 2 *
 * KVE_ROPE_MAX_FACTORS, or with a factor that is not finite and > 0; the
 * message names the field and its value); a
 * policy that reads keys with key_dim 0, one that reads values (vnorm=1,
 * expected_attention by default) with value_dim 0, expected_attention with
 * rope.rotary_dim KVE_ROPE_UNSET (the messages say so: it could never be
 * stepped, or would be stepped wrong). A policy that does not read keys,
 * queries or values accepts any of these dimensions and then validates and
 * ignores what it is given. Unchecked other than 0 or 1 is refused too.
 * Allocates as kve_policy_new, through options->allocator; a policy whose
 * per-slot state depends on d (keydiff, expected_attention) sizes its slots
 * from it, and expected_attention a head's query buffer from query_group. */
KVE_API kve_status kve_policy_new_ex(const char *spec, kve_rng *rng,
                                     const kve_policy_options *options, kve_policy **out);

/* [stable] Releases `p` and everything it owns, through its allocator. NULL
 * is a no-op; so is a call from inside p's own callbacks ("Calls from
 * callbacks"). */
KVE_API void kve_policy_free(kve_policy *p);

/* [stable] Tells the policy that the query at position `pos` paid attention
 * `attn` to the kept positions, then admits `pos` into the kept set.
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
 *       message names its index and value; not checked by a policy built
 *       unchecked: see "Unchecked steps"); a policy that reads keys (step
 *       it with kve_policy_step_keys).
 * Memory: no allocation while size <= budget before the call (the
 *       step-then-evict loop). Stepping several times without evicting grows
 *       the storage geometrically; KVE_ENOMEM if that fails.
 * Cost: the policies that read attention make a read-only validation pass
 *       over attn (none when unchecked), then one pass over the kept set
 *       that updates every score,
 *       closes the hole the last evict left in the per-slot state and finds
 *       the next victim (vectorised for the machine: kve_isa_name); O(1) for
 *       the others (plus the validation pass when attn is not NULL: window,
 *       streaming, full and random should be stepped with NULL). A NULL
 *       step of a scored policy is one pass over the scores when the last
 *       evict left a hole to close (it finds the next victim on the way),
 *       else O(1).
 *       kve_policy_step(p, pos, attn, n) is
 *       kve_policy_step_keys(p, pos, attn, n, NULL). */
KVE_API kve_status kve_policy_step(kve_policy *p, int32_t pos, const float *attn, size_t n);

/* kve_policy_step that also hands the policy the key of `pos`.
 *
 * key: key_dim floats (the key_dim of construction), read during the call
 *      only; NULL = no key.
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

/* How a grouped step reduces the query rows of one KV head (see
 * "Grouped-query attention" under "Banks"). */
typedef enum kve_reduce {
    KVE_REDUCE_MEAN = 0, /* mean in double, rounded once (the default) */
    KVE_REDUCE_SUM,      /* sum in double, rounded once */
    KVE_REDUCE_MAX       /* largest weight */
} kve_reduce;

/* Flags of a step (kve_step_data.flags). */
enum {
    KVE_STEP_RESCORE = 1u /* a policy that rescores every `interval` steps
                             (expected_attention) rescores at this step too:
                             e.g. at the last prompt position, before the one
                             eviction of a prefill */
};

/* Everything one step may hand a policy or a range of a bank's heads,
 * described in one place. Start from kve_step_default_data() (nothing:
 * every pointer NULL, group 1, KVE_REDUCE_MEAN, no flags) and set what the
 * policy reads (kve_policy_reads). For head j of the step's range (j = 0
 * for a policy):
 *   attn     query row g < group at attn + (j*group + g)*ld, the weights
 *            over the head's kept positions in kept order, reduced over the
 *            group as `reduce` says (see "Grouped-query attention"); NULL:
 *            no information. For a policy ld must equal its size (group 1).
 *   keys     the key of pos at keys + j*ld_keys, key_dim floats.
 *   queries  query head g < query_group (of construction) at queries +
 *            (j*query_group + g)*ld_queries, key_dim floats each: the
 *            queries at pos, after the rotary embedding.
 *   values   the value of pos at values + j*ld_values, value_dim floats.
 * Every array is read during the call only; each NULL array's stride is
 * ignored. */
typedef struct kve_step_data {
    const float *attn;    /* (count*group, ld) or NULL */
    size_t ld;            /* row stride of attn, >= every head's size */
    size_t group;         /* query rows of attn per head, >= 1 */
    kve_reduce reduce;    /* their reduction */
    const float *keys;    /* (count, ld_keys) or NULL */
    size_t ld_keys;       /* >= key_dim */
    const float *queries; /* (count*query_group, ld_queries) or NULL */
    size_t ld_queries;    /* >= key_dim */
    const float *values;  /* (count, ld_values) or NULL */
    size_t ld_values;     /* >= value_dim */
    unsigned flags;       /* KVE_STEP_* */
} kve_step_data;

/* Nothing: every array NULL with stride 0, group 1, KVE_REDUCE_MEAN, flags
 * 0 (a step with no information, for a policy that reads nothing). */
KVE_API kve_step_data kve_step_default_data(void);

/* The general step of a policy: as kve_policy_step_keys, with everything
 * `data` describes (NULL: the defaults). kve_policy_step_keys(p, pos, attn,
 * n, key) is this call with attn, ld = n and keys = key.
 * Refuses (KVE_EINVAL, nothing changed), besides kve_policy_step_keys's
 *      refusals: NULL data fields the policy reads ("expected_attention: the
 *      policy reads queries, but the step carries none"); queries given to a
 *      policy built with key_dim 0, values with value_dim 0; a stride below
 *      its dimension; a NaN or infinite query or value entry (the message
 *      names query head and index); a group other than 1; flags outside
 *      KVE_STEP_*; a score rule's own failure (its status and message).
 * Cost: as the policy's page says (expected_attention: see above); a
 *      validation pass over each array given. No allocation while size <=
 *      budget before the call. */
KVE_API kve_status kve_policy_step_data(kve_policy *p, int32_t pos, const kve_step_data *data);

/* [stable] Evicts down to `budget` positions.
 *
 * When size > budget, removes size - budget positions chosen by the policy,
 * writes them to victims[0 .. count) in ascending position order (not the
 * order they were chosen in) and stores count in *n_victims; otherwise
 * removes nothing and stores 0. Kept order (ascending) is preserved. The
 * `full` policy never evicts and always reports 0. With pages (block > 1)
 * count may exceed size - budget (see "Pages").
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
 *       are closed up by the next step's pass); after a NULL step that had
 *       no hole to close (a prompt stepped through without evicting), one
 *       argmin scan more. Several victims: one scan of the unprotected kept set per
 *       victim (repeated argmin, never a sort) and one compaction.
 *       window/streaming are O(victims + sinks) amortised; random is O(kept)
 *       per victim. */
KVE_API kve_status kve_policy_evict(kve_policy *p, size_t budget, int32_t *victims, size_t cap,
                                    size_t *n_victims);

/* [stable] The number of kept positions. O(1). 0 for NULL. */
KVE_API size_t kve_policy_size(const kve_policy *p);

/* [stable] The kept positions, kve_policy_size(p) of them, in ascending
 * order. The pointer is owned by the policy and valid until its next step,
 * evict or free. NULL for NULL p; may be non-NULL with size 0. */
KVE_API const int32_t *kve_policy_positions(const kve_policy *p);

/* [stable] Bytes of per-slot state the policy holds now: allocated slots
 * times bytes per slot (h2o: 13, i.e. 4 of position, 8 of score, 1 of
 * eviction scratch; 6669 at the default budget of 512). Excludes the
 * fixed-size handle itself. 0 for NULL. */
KVE_API size_t kve_policy_state_bytes(const kve_policy *p);

/* The canonical spec: the name and every parameter spelled out in a fixed
 * order, e.g. "h2o:budget=512,recent_window=32". kve_policy_new accepts it
 * back and builds an identical policy. Owned by the policy; never NULL for
 * non-NULL p (NULL for NULL p). */
KVE_API const char *kve_policy_spec(const kve_policy *p);

/* The policy's name ("h2o") and its budget parameter. NULL / 0 for NULL p. */
KVE_API const char *kve_policy_name(const kve_policy *p);
KVE_API size_t kve_policy_budget(const kve_policy *p);

/* What a policy reads at each step: a set of these flags. */
typedef enum kve_reads {
    KVE_READS_NOTHING = 0, /* full, window, streaming, random */
    KVE_READS_ATTN = 1,    /* the attention weights over the kept set */
    KVE_READS_KEYS = 2,    /* the key vector of each admitted position */
    KVE_READS_QUERIES = 4, /* the queries at each admitted position */
    KVE_READS_VALUES = 8   /* the value vector of each admitted position */
} kve_reads;

/* What `p` reads (a spec's keys may add to its type's: vnorm=1 reads
 * values); KVE_READS_NOTHING for NULL. */
KVE_API kve_reads kve_policy_reads(const kve_policy *p);

/* The key dimension `p` was built with; 0 for NULL or when built without. */
KVE_API size_t kve_policy_key_dim(const kve_policy *p);

/* The built-in policies, in a fixed order: kve_policy_type_name(i) for
 * i < kve_policy_type_count(), a one-line summary of each and what it reads
 * at its defaults. NULL (KVE_READS_NOTHING) past the end. Score rules
 * registered at run time are not listed here (see "Score rules"). O(1). */
KVE_API size_t kve_policy_type_count(void);
KVE_API const char *kve_policy_type_name(size_t i);
KVE_API const char *kve_policy_type_summary(size_t i);
KVE_API kve_reads kve_policy_type_reads(size_t i);

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

/* ---- Lifecycle: fork, rewind, reuse, persist ----
 *
 * An engine does more to a sequence than append to it, and a policy's state
 * must follow what it does to the sequence's KV cache (docs/api.md, "What an
 * engine does to a sequence", maps llama.cpp's and vLLM's operations to
 * these calls):
 *
 *   fork     parallel sampling, beam search, a shared prefix copy the cache
 *            after the prompt, and the policy with it: kve_policy_clone (a
 *            new policy) or kve_policy_copy (into one already held, without
 *            allocating).
 *   rewind   rejected draft tokens, an edited or regenerated last turn, a
 *            context shift: positions leave the cache by the engine's
 *            decision, not the policy's: kve_policy_remove.
 *   reuse    a server's pool of sequence slots: kve_policy_reset.
 *   persist  session files, preemption to host memory, prefix caches:
 *            kve_policy_save and kve_policy_load.
 *
 * The state of a policy is everything its decisions depend on: the kept
 * positions, their per-slot state (scores, and the policy's own columns:
 * h2o_mean's sums and births, scissorhands' vote registers, keydiff's unit
 * keys, vnorm=1's value norms and the rule's own scores, a score rule's
 * state, expected_attention's keys), the policy's per-head state
 * (expected_attention's step counters, the statistics of its last
 * rescoring and its ring of recent queries), the count of informative
 * steps, the private random stream (random), and the last position
 * admitted. A clone, a copy and a loaded
 * image hold exactly that state, and continue BIT-IDENTICALLY: the same
 * calls give the same victims, the same kept sets and the same score bits
 * as the original would, for every policy (pages, shared budgets and the
 * policies that read keys included), whatever instruction set each runs
 * with (kve_isa_name) and whatever machine wrote the image. Where the
 * original's slots are and how many it has are not state: they are not
 * copied or saved, and change nothing.
 *
 * Removing positions does not undo what their queries added to the scores
 * of the positions still kept (h2o's sums, scissorhands' votes, tova's last
 * weights, the step count h2o_mean divides by, expected_attention's
 * buffered queries and statistics, a score rule's state). A rewind that must leave
 * the policy exactly as it was before some steps is a copy from a
 * checkpoint taken before them: speculative decoding clones (once) or
 * copies the policy before the draft, steps the draft, and on a rejection
 * copies the checkpoint back and steps the accepted tokens again.
 *
 * Images. kve_policy_save writes a self-contained, versioned image: a
 * header (magic, version, kind, size, options, column sizes, the canonical
 * spec; version 2 adds value_dim, query_group and the rope for an object
 * that has them or the methods' state), the head's state, and a checksum
 * (FNV-1a, 64 bits). A score rule is named, not saved: its spec names it,
 * and kve_policy_load builds from the rule registered under that name then
 * (refusing, with a message naming the rule and kve_score_rule_register,
 * while none is, and refusing by the column sizes a rule of another state
 * or values); that it is the same rule is the application's to keep.
 * unchecked is not state: a loaded policy is checked. Every scalar
 * is little-endian on every machine; the image holds no pointer, capacity
 * or allocator, so it loads with any allocator, in any process, on a
 * machine of either byte order. docs/api.md ("State images") gives each
 * field's offset, type and meaning. The version field changes whenever the
 * layout or the meaning of a field does: a release reads every version it
 * documents (converting an older one) and refuses any other with a message
 * naming both. No version records the rope's scaling: kve_policy_save
 * and kve_bank_save refuse (KVE_EINVAL, naming the field) an object whose
 * rope.scaling is not KVE_ROPE_SCALING_NONE or whose rope.attention_factor
 * is not 0, rather than write an image that would load unscaled.
 */

/* A new, independent policy in exactly the state of p (kept set, scores,
 * private random stream, options), stored in *out.
 * Refuses (KVE_EINVAL): NULL p or out. KVE_ENOMEM. On failure *out is
 * untouched and p unchanged.
 * Allocates through p's allocator: what kve_policy_new_ex allocates, plus,
 * when p keeps more positions than a new policy has slots (it was stepped
 * past them without evicting), a block of p's slots.
 * Reads p only (other threads may read it meanwhile, none may step it).
 * O(kept). */
KVE_API kve_status kve_policy_clone(const kve_policy *p, kve_policy **out);

/* dst takes src's exact state, as kve_policy_clone would give it; dst keeps
 * its own allocator. dst == src does nothing.
 * Refuses (KVE_EINVAL, nothing changed): NULL dst or src; policies whose
 * canonical spec, key_dim, value_dim, query_group or rope differ
 * (kve_policy_spec, kve_policy_key_dim, the options; the message names the
 * difference). unchecked may differ: it is not state.
 * Memory: no allocation when dst has at least as many slots as src keeps
 * positions: when dst is a clone or an earlier copy of src, or both are
 * stepped then evicted to at most their budget (the checkpoint and restore
 * of speculative decoding). Otherwise dst grows to src's slots through its
 * own allocator; KVE_ENOMEM leaves dst unchanged.
 * Threads: writes dst, reads src. O(kept). */
KVE_API kve_status kve_policy_copy(kve_policy *dst, const kve_policy *src);

/* Removes every kept position in [p0, p1), its per-slot state with it; the
 * other positions keep their scores, state and order. p1 = KVE_POS_END
 * removes through the end (INT32_MAX included); p0 may be negative. Stores
 * in *n_removed (may be NULL) how many went: 0 when the range held none.
 * After a remove the last position admitted is the largest one still kept
 * (none, when nothing is): the next step may use any position greater than
 * every position still kept, so a rewind to p, kve_policy_remove(p, p,
 * KVE_POS_END, NULL), can step p again. What the removed positions' queries
 * added to the others' scores stays (see "Lifecycle"), and so does the
 * count of informative steps. Pages: the page of the largest kept position
 * is incomplete again (until a step reaches its end) if its last position is
 * past it; a page the range cut keeps its other positions, and is evicted
 * whole with them.
 * streaming: its sinks are the first `sinks` kept positions, so removing a
 * sink makes the next kept position, or the next one stepped, a sink.
 * Refuses (KVE_EINVAL, nothing changed): NULL p; p0 >= p1 (the message
 * names both).
 * Never allocates. O(kept): one move of each column. */
KVE_API kve_status kve_policy_remove(kve_policy *p, int32_t p0, int32_t p1, size_t *n_removed);

/* Back to the state of a new policy of the same spec and options: nothing
 * kept, nothing stepped, the private random stream at its start (random
 * chooses the same victims again for the same calls). The storage stays
 * allocated: a policy that grew keeps its slots. NULL is a no-op, as is a
 * call from inside p's own callbacks. Never allocates. O(1). */
KVE_API void kve_policy_reset(kve_policy *p);

/* Writes p's image (see "Lifecycle", and docs/api.md for the layout) to
 * buf[0 .. *size): the same bytes for the same state on every machine and
 * instruction set. buf NULL: only stores in *size the bytes the image needs
 * (cap is then ignored), so a caller does
 *     kve_policy_save(p, NULL, 0, &n);  ... n bytes ...
 *     kve_policy_save(p, buf, n, &n);
 * The size is 72 + strlen(kve_policy_spec(p)) + 8 bytes of header and
 * checksum (+ 48 in version 2), 64 bytes of the head's record (+ the
 * policy's per-head state: expected_attention's, docs/api.md), and per kept
 * position 4 bytes of position, 8 of score (the scored policies) and the
 * policy's columns (h2o_mean 12, scissorhands with a history 8, keydiff and
 * expected_attention 4 * key_dim, a score rule 8 * its state, vnorm=1 16).
 * Refuses: KVE_EINVAL for NULL p or size; KVE_ERANGE when cap is smaller
 * than the image: *size then holds the bytes needed (the one output a
 * refusal writes) and buf is untouched.
 * Reads p only; never allocates. O(size of the image). */
KVE_API kve_status kve_policy_save(const kve_policy *p, void *buf, size_t cap, size_t *size);

/* A new policy from the image buf[0 .. size), written by kve_policy_save on
 * this machine or another, stored in *out and allocated through `allocator`
 * (NULL: the C library's; the struct is copied, as in kve_policy_options).
 * It continues exactly as the saved policy would.
 * Every byte is validated before anything is built: magic, version, kind
 * (a bank's image is refused: kve_bank_load reads it), size (exactly
 * `size`: no byte short or over), checksum, the spec (known, valid,
 * canonical; keys for a policy that reads them), the options, every length,
 * then the head: its flags, its generator (random: not all zero; the others
 * all zero), its positions (>= 0, strictly ascending, none past the last
 * position), its scores (finite; attention received >= 0; knorm's <= 0) and
 * the policy's own columns (h2o_mean: score exactly sum / steps observed;
 * scissorhands: whole counts of steps, equal to the votes of a history and
 * none older than it; keydiff: unit keys of norm at most 1). Anything else
 * is KVE_EINVAL with a message naming the field, e.g. "image: pos[3] = 12
 * is not greater than pos[2] = 12"; a version this library does not read is
 * refused naming it. KVE_ENOMEM. On failure *out is untouched and nothing
 * stays allocated; an image makes load allocate at most the storage of the
 * positions it holds (no more than about its own size) beyond what
 * kve_policy_new_ex would.
 * Thread-safe (reads buf only). O(size) (keydiff: O(kept * key_dim)). */
KVE_API kve_status kve_policy_load(const void *buf, size_t size, const kve_allocator *allocator,
                                   kve_policy **out);
/* ----------------------------------------------------------------------
 * Score rules: a scored policy of the application's own
 *
 * A score rule is the one part of a scored policy that differs between
 * h2o, tova and their family: how each kept position's score changes at a
 * step that carries attention. Registered under a name, it is a policy like
 * the built-in ones, usable in every spec ("my_rule:budget=256,vnorm=1"),
 * in a policy or a bank, and it inherits everything the scored mechanism
 * gives them: the recent window, ties to the lower position, the one-victim
 * fast path, pages (block, block_mean), shared budgets, prefill
 * compression, vnorm. Its spec keys are budget, recent_window (default: the
 * rule's), block, block_mean and vnorm.
 *
 * At every step of a head with attention, before the newcomer is admitted,
 * the library calls observe(user, &s) with the head's kept set: s.attn its
 * weights this step (a group's rows already reduced), s.score and s.state
 * the rule's scores and per-slot state after its previous step, s.vnorm the
 * value norms (with rule.values). observe writes every slot's new score to
 * s.new_score (finite) and its new state to s.new_state (which holds the
 * old on entry). A step without attention does not call it: scores and
 * state stay. A newcomer starts with score 0 and state 0 and is protected
 * by the recent window (or, without one, competes with score 0). With
 * vnorm=1 the rule's scores are kept apart and the policy evicts by
 * score * ||v||, as for the built-in rules (s.score is the rule's own).
 * If observe returns a status other than KVE_OK (with kve_set_error for
 * its message), or writes a score or a state that is not finite (or,
 * under vnorm, a score whose product with the value norm is not: a state
 * image holds only finite values, so that what is saved always loads), the
 * step is refused with that status (KVE_EINVAL for the score or state,
 * naming the rule and the slot)
 * and every head of the call is left as it was: the library gives the rule
 * buffers of its own and commits them only when every head's rule
 * succeeded. Cost against a built-in rule's fused pass: the reduction of
 * the rows into one, a copy of the scores and state into and out of the
 * rule's buffers, its call and the argmin pass (docs/policies/score_rules.md
 * measures it). Memory: 25 + 16 * state bytes a slot (the position, the
 * score, the eviction mark, the reduced row, the state and the rule's
 * buffers), 16 more with vnorm.
 *
 * Threads and lifetime. The registry is the one table the library shares
 * between threads: kve_score_rule_register and _unregister may be called
 * from any thread at any time, serialised with each other and with every
 * call that parses a spec by a lock (a spin on an atomic flag, held for a
 * lookup of at most KVE_MAX_SCORE_RULES names). Every object built from a
 * rule holds it (as does a spec call while it runs): unregister refuses
 * (KVE_EINVAL, "rule \"x\" is held by 2 objects") until they are freed, so
 * a rule can never be pulled from under an object. The rule's observe and
 * user must stay valid until its unregister succeeds; observe is called by
 * whatever thread steps a head built from it, possibly by several threads
 * at once (distinct objects, disjoint ranges of a bank): it must be safe
 * for that.
 * ---------------------------------------------------------------------- */

/* One step of a score rule for one head: what observe reads and writes. */
typedef struct kve_score_step {
    size_t n;              /* kept positions before the newcomer: every array has n rows */
    const int32_t *pos;    /* (n) the kept positions, ascending */
    const float *attn;     /* (n) this step's weights over them (the group reduced) */
    const double *score;   /* (n) the rule's scores after its previous step */
    const double *state;   /* (n, n_state) the rule's state, slot i at state + i*n_state */
    size_t n_state;        /* doubles of state a slot (the rule's `state`) */
    const double *vnorm;   /* (n) ||v|| of each kept position; NULL unless rule.values */
    uint64_t step;         /* the head's steps with attention, this one included */
    double *new_score;     /* (n) out: every slot's new score, finite */
    double *new_state;     /* (n, n_state) out: the new state, finite; holds `state` on entry */
} kve_score_step;

/* The score update; returns KVE_OK, or a status (and kve_set_error's
 * message) that refuses the step. */
typedef kve_status (*kve_score_fn)(void *user, const kve_score_step *step);

/* A rule to register. */
typedef struct kve_score_rule {
    const char *name;     /* the policy's name in specs: 1 .. 31 characters of [a-z0-9_],
                             neither a built-in policy's nor a registered rule's */
    const char *summary;  /* one line, copied (up to 127 bytes); NULL: "" */
    kve_score_fn observe; /* the update, not NULL */
    void *user;           /* passed to observe */
    size_t state;         /* doubles of per-slot state, 0 .. KVE_MAX_RULE_STATE (default 0) */
    size_t recent_window; /* the default of the spec key recent_window (default 32) */
    int values;           /* 1: observe reads s.vnorm, and objects need a value_dim
                             (default 0) */
} kve_score_rule;

/* The defaults: no name, no observe, no state, recent_window 32, values 0. */
KVE_API kve_score_rule kve_score_rule_default(void);

/* Registers `rule` (copied, its name and summary included) under
 * rule->name; from now on specs of that name build it.
 * Refuses (KVE_EINVAL, nothing registered): NULL rule or observe; a name
 * that is empty, too long, of other characters, a built-in policy's or
 * registered already; state above KVE_MAX_RULE_STATE; values other than 0
 * and 1; recent_window at or above KVE_MAX_BUDGET. KVE_ENOMEM when
 * KVE_MAX_SCORE_RULES are registered. Never allocates. Thread-safe (see
 * above). O(KVE_MAX_SCORE_RULES). */
KVE_API kve_status kve_score_rule_register(const kve_score_rule *rule);

/* Removes the rule registered as `name`. Refuses (KVE_EINVAL, nothing
 * changed): NULL name, a name not registered (a built-in policy's
 * included), and a rule some object (or a spec call in progress) still
 * holds: the message says how many. Thread-safe. O(KVE_MAX_SCORE_RULES). */
KVE_API kve_status kve_score_rule_unregister(const char *name);

/* ======================================================================
 * 5. Banks: one policy for every head of an engine
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
 * Two calls step, three evict:
 *   kve_bank_step         every head, one attention row each;
 *   kve_bank_step_range   a range of heads, grouped-query attention, keys:
 *                         the general form (kve_bank_step is this call on
 *                         every head, group 1, no keys);
 *   kve_bank_evict        every head to one budget;
 *   kve_bank_evict_range  a range of heads to one budget;
 *   kve_bank_evict_shared each group of heads to one budget together.
 *
 * Grouped-query attention. With `group` query heads per KV head, an engine
 * passes the attention of all n_heads * group query heads to
 * kve_bank_step_range; KV head h owns query rows h*group .. h*group+group-1
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
 * particular kve_bank_step and kve_bank_evict (every head),
 * kve_bank_state_bytes and kve_bank_free.
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
 *
 * Same positions. An engine's cache may hold one entry per position for
 * every head at once: llama.cpp's cells hold a position's keys and values
 * for every layer and KV head, vLLM's blocks a position for every head of a
 * layer. Such a cache can only drop a position from all heads together. A
 * bank built with options.same_positions = 1 makes that decision: every
 * head is stepped as it would be otherwise (its own row, its own scores),
 * and an eviction removes the same victims from every head, so the heads
 * keep one kept set. Exactly:
 *   - the scored policies rank slot i by its combined score, the heads'
 *     scores of slot i added in head order in double (head 0's plus head
 *     1's plus ...), protecting the newest recent_window slots, ties to
 *     the lower position; with pages (block > 1) a page's key is the sum of
 *     its slots' combined scores (block_mean: divided by its slots);
 *   - window, streaming and full decide from positions alone (each head
 *     decides what the others do); random draws its victims from head 0's
 *     generator only;
 *   - an eviction (kve_bank_evict, or kve_bank_evict_range of every head)
 *     covers the whole bank, after every head has admitted the same
 *     positions; kve_bank_evict_range of fewer heads is refused;
 *   - steps may come range by range (a layer at a time): once some head has
 *     admitted position p, the others are stepped at p before any head is
 *     stepped past it (refused, KVE_EINVAL, naming both heads).
 * Everything else is unchanged: prefill (kve_bank_prefill of the whole
 * bank: the prompt's scores added over the heads, one kept set installed in
 * every head), pages, the lifecycle calls, images (version 3: the option
 * is part of the state), the allocator and unchecked steps. Cost: the
 * heads' step passes as without the option, plus O(heads) a step call to
 * check the positions and, in the steady state of one victim, one pass over
 * the heads' score columns (heads * kept doubles) instead of each head's
 * cached argmin; several victims, k passes. No allocation beyond a plain
 * bank's. Calls on a same_positions bank must not overlap (a step range
 * reads every head's last position).
 * ====================================================================== */

typedef struct kve_bank kve_bank; /* opaque: n_heads instances of one policy spec */

/* kve_reduce, how a grouped step reduces the query rows of one KV head, is
 * defined with kve_step_data (section 4). */

/* [stable] Builds a bank of n_heads instances of `spec` and stores it in
 * *out; as kve_bank_new_ex(spec, n_heads, rng, NULL, out).
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

/* What kve_bank_new_ex builds besides the spec. */
typedef struct kve_bank_options {
    const kve_allocator *allocator; /* NULL (the default): the C library's */
    size_t key_dim;   /* d: the floats of every key a step carries, as
                         kve_policy_options.key_dim; 0 (the default): steps
                         carry no keys */
    size_t share;     /* heads per shared-budget group, dividing n_heads; 0 (the
                         default): no groups, every head has its own budget */
    double min_share; /* the floor of a shared eviction, as a fraction of an even
                         share, in [0, 1] (default 0.2; see "Shared budgets") */
    size_t value_dim;   /* as kve_policy_options.value_dim (default 0) */
    size_t query_group; /* as kve_policy_options.query_group (default 1) */
    kve_rope rope;      /* as kve_policy_options.rope (default unset) */
    int unchecked;      /* 0 (the default) or 1, as kve_policy_options.unchecked: 1 skips
                           the validation of every head's attention weights (see
                           "Unchecked steps" in "Policies") */
    int same_positions; /* 0 (the default) or 1: every head keeps the same positions,
                           one eviction decision for all of them (see "Same
                           positions"); not with share */
} kve_bank_options;

/* The defaults: the C library's allocator, key_dim 0, share 0 (no shared
 * budget), min_share 0.2, value_dim 0, query_group 1, rope unset, checked
 * (unchecked 0), each head its own positions (same_positions 0). */
KVE_API kve_bank_options kve_bank_default_options(void);

/* kve_bank_new with options; options may be NULL (the defaults). Argument
 * order as kve_policy_new_ex.
 * Refuses (KVE_EINVAL) what kve_bank_new refuses, plus: what
 *      kve_policy_new_ex refuses of key_dim, value_dim, query_group, rope
 *      (above KVE_MAX_KEY_DIM, or 0 for a policy that reads keys, ...) and
 *      unchecked (not 0 or 1); min_share outside [0, 1] (or NaN); share
 *      that does not divide n_heads; share > 0 with a policy that has no
 *      score (full, window, streaming, random) or with block > 1;
 *      same_positions not 0 or 1, or 1 with share > 0.
 *      KVE_ENOMEM. On failure *out and rng are untouched.
 * Allocates: as kve_bank_new, through options->allocator; with share > 0 the
 *      handle also holds n_heads / share groups (about 70 bytes each) and
 *      each head starts with budget + 1 + slack slots (see "Shared
 *      budgets"). */
KVE_API kve_status kve_bank_new_ex(const char *spec, size_t n_heads, kve_rng *rng,
                                   const kve_bank_options *options, kve_bank **out);

/* [stable] Releases `b` and everything it owns, through its allocator. NULL
 * is a no-op; so is a call from inside b's own callbacks ("Calls from
 * callbacks"). */
KVE_API void kve_bank_free(kve_bank *b);

/* [stable] The number of heads; 0 for NULL. O(1). */
KVE_API size_t kve_bank_heads(const kve_bank *b);

/* [stable] The number of positions head `head` keeps; 0 for NULL b or head
 * out of range. O(1). */
KVE_API size_t kve_bank_size(const kve_bank *b, size_t head);

/* The sizes of heads [first, first + count) in one call: sizes[j] is
 * kve_bank_size(b, first + j) (count entries; sizes may be NULL), and
 * *largest (may be NULL) the largest of them, 0 when count is 0: what a
 * binding or an engine needs to size a step's rows (ld) or an evict's
 * victims (largest - budget) without a call per head. Refuses KVE_EINVAL
 * (nothing written) for NULL b or first + count > kve_bank_heads(b). Reads
 * only the heads of the range (see "Threads"). Never allocates. O(count). */
KVE_API kve_status kve_bank_sizes(const kve_bank *b, size_t first, size_t count, size_t *sizes,
                                  size_t *largest);

/* [stable] Head `head`'s kept positions, kve_bank_size(b, head) of them,
 * ascending. Owned by the bank, valid until the next step, evict or free
 * whose range contains the head. NULL for NULL b or head out of range.
 * O(1). */
KVE_API const int32_t *kve_bank_positions(const kve_bank *b, size_t head);

/* [stable] Bytes of per-slot state the bank holds now: allocated slots
 * (every head's) times bytes per slot; n_heads times kve_policy_state_bytes
 * of one policy of the same spec in the steady state. 0 for NULL.
 * O(n_heads). */
KVE_API size_t kve_bank_state_bytes(const kve_bank *b);

/* The canonical spec shared by every head (as kve_policy_spec). NULL for
 * NULL b. */
KVE_API const char *kve_bank_spec(const kve_bank *b);

/* The spec's budget parameter, shared by every head (as kve_policy_budget).
 * 0 for NULL b. */
KVE_API size_t kve_bank_budget(const kve_bank *b);

/* What the bank's policy reads, and its key dimension (as kve_policy_reads
 * and kve_policy_key_dim); KVE_READS_NOTHING and 0 for NULL. */
KVE_API kve_reads kve_bank_reads(const kve_bank *b);
KVE_API size_t kve_bank_key_dim(const kve_bank *b);

/* The bank's heads per shared group (options.share); 0 for a bank without
 * shared budgets and for NULL. O(1). */
KVE_API size_t kve_bank_share(const kve_bank *b);

/* 1 for a bank built with options.same_positions = 1, else 0 (NULL: 0).
 * O(1). */
KVE_API int kve_bank_same_positions(const kve_bank *b);

/* [stable] One decode step for every head: the query at `pos` paid attention
 * `attn` to each head's kept positions; then `pos` is admitted in every head.
 *
 * attn: row h at attn + h*ld, its first kve_bank_size(b, h) entries valid,
 *       kept order; ld >= every head's size; NULL = no information for every
 *       head (ld ignored). Weights as kve_policy_step: finite and >= 0; read
 *       during the call only.
 * pos:  >= 0 and greater than every head's last position.
 * Refuses (KVE_EINVAL, no head changed): NULL b; a bad pos (the message names
 *       the first head it fails for); ld smaller than some head's size; a NaN,
 *       infinite or negative weight (the message names head and index; not
 *       checked by a bank built unchecked); a policy that reads keys (step
 *       it with kve_bank_step_range).
 *       KVE_ENOMEM when a head must grow and cannot (no head changed).
 * Memory: no allocation while every head's size <= budget before the call.
 * Cost: one read-only validation pass over every row (none when
 *       unchecked), then one pass over
 *       every head's scores that adds the weights, closes the hole the last
 *       evict left and finds the next victim (the scored policies; O(1) a
 *       head for the others), vectorised for the machine (kve_isa_name).
 *       kve_bank_step(b, pos, attn, ld) is kve_bank_step_range(b, 0,
 *       kve_bank_heads(b), pos, attn, ld, 1, KVE_REDUCE_MEAN, NULL, 0). */
KVE_API kve_status kve_bank_step(kve_bank *b, int32_t pos, const float *attn, size_t ld);

/* One decode step for heads [first, first + count), the general form: the
 * attention of `group` query heads per KV head, and the key of `pos` for
 * each KV head.
 *
 * attn: the rows of head first + j start at attn + j*group*ld, query row g
 *       of it at attn + (j*group + g)*ld; KV head first + j reduces its
 *       group rows as `reduce` says (see "Grouped-query attention") in each
 *       of its kve_bank_size(b, first + j) slots. NULL: no information (ld,
 *       group and reduce are then still checked). group 1 is one row a head
 *       (reduce has no effect).
 * keys: head first + j's key at keys + j*ld_keys, key_dim floats (the key is
 *       the KV head's: grouped query heads share it); NULL: no keys
 *       (ld_keys ignored).
 * The other heads are not read or written, so threads may step disjoint
 * ranges of one bank at once (see "Threads"). count 0 does nothing and
 * succeeds.
 * Refuses as kve_bank_step and kve_policy_step_keys (the message names the
 *       head), plus: first + count > kve_bank_heads(b); on a shared bank a
 *       range that splits a group; group 0; a reduce outside kve_reduce;
 *       (KVE_REDUCE_SUM) a reduced weight that overflows float32; ld_keys <
 *       key_dim with keys given; on a same_positions bank, a position past
 *       one that some heads have admitted and others not (see "Same
 *       positions"). Every query row and every key of every head is
 *       validated before any head changes.
 * Cost: kve_bank_step's, reading group rows a head instead of one; per head
 *       as kve_policy_step_keys for the policies that read keys. */
KVE_API kve_status kve_bank_step_range(kve_bank *b, size_t first, size_t count, int32_t pos,
                                       const float *attn, size_t ld, size_t group,
                                       kve_reduce reduce, const float *keys, size_t ld_keys);

/* The general step of heads [first, first + count): everything `data`
 * describes (kve_step_data; NULL: the defaults), so the queries and values
 * too. kve_bank_step_range(b, first, count, pos, attn, ld, group, reduce,
 * keys, ld_keys) is this call with those fields set and the others at
 * their defaults.
 * Refuses as kve_bank_step_range and kve_policy_step_data (the message
 * names the head), every array of every head validated before any head
 * changes, plus the overflow of a stride times count. A score rule that
 * fails leaves every head's kept set and scores as they were (a head that
 * had to grow keeps its larger storage).
 * Threads and cost: as kve_bank_step_range; per head as the policy's page
 * says. */
KVE_API kve_status kve_bank_step_data(kve_bank *b, size_t first, size_t count, int32_t pos,
                                      const kve_step_data *data);

/* [stable] Evicts every head to `budget`, as kve_policy_evict does each:
 * head h's victims, ascending, at victims + h*ld_victims, their count in
 * counts[h] (n_heads entries). counts may be NULL when the counts are not
 * wanted; victims may be NULL when ld_victims is 0.
 * Refuses (nothing changed): KVE_EINVAL for NULL b and for what
 *       kve_policy_evict refuses (budget 0, budget <= recent_window or
 *       sinks, victims NULL with ld_victims > 0); KVE_ERANGE if some head
 *       needs more than ld_victims (the message names the first such head);
 *       a same_positions bank whose heads have not all admitted the same
 *       positions (KVE_EINVAL, naming a head of each). Never allocates.
 * A same_positions bank writes the same victims for every head (see "Same
 *       positions").
 * Cost: per head as kve_policy_evict; in the steady state (one victim a head)
 *       the victim was found by the step, so evict is one memmove of the
 *       positions after it (same_positions: plus one pass over the heads'
 *       scores). */
KVE_API kve_status kve_bank_evict(kve_bank *b, size_t budget, int32_t *victims,
                                  size_t ld_victims, size_t *counts);

/* kve_bank_evict on heads [first, first + count) only: head first + j's
 * victims at victims + j*ld_victims, its count in counts[j]. Other heads are
 * untouched (see "Threads"). count 0 does nothing and succeeds. Refuses as
 * kve_bank_evict, plus first + count > kve_bank_heads(b), on a bank with
 * shared groups a range that splits a group, and on a same_positions bank
 * any range but every head. */
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

/* The bank's options.min_share, the floor of a shared eviction (0.2 by
 * default; kept, with no effect, by a bank without a share); 0 for NULL.
 * O(1). */
KVE_API double kve_bank_min_share(const kve_bank *b);

/* ---- The lifecycle of a bank ----
 *
 * The policy calls of "Lifecycle" (section 4), on every head at once: a
 * bank's clone, copy and image hold every head's state and the bank's
 * options (key_dim, share, min_share, same_positions), and every head continues
 * bit-identically, shared groups included (their shared evictions choose
 * the same victims). An engine that forks a sequence forks its bank; one
 * that saves a session saves the bank's image beside its KV cache. These
 * calls touch every head: none may overlap another call on the bank (copy
 * and save only read src / b, which other readers may share).
 */

/* As kve_policy_clone, for every head: a new bank of the same spec, heads
 * and options in exactly b's state, through b's allocator.
 * Refuses (KVE_EINVAL): NULL b or out. KVE_ENOMEM. On failure *out is
 * untouched. O(kept, every head). */
KVE_API kve_status kve_bank_clone(const kve_bank *b, kve_bank **out);

/* As kve_policy_copy, for every head: dst takes src's exact state.
 * Refuses (KVE_EINVAL, nothing changed): NULL dst or src; banks that differ
 * in canonical spec, key_dim, value_dim, query_group, rope, heads, share,
 * min_share (only with shared heads: without them it does nothing) or
 * same_positions (the message names which).
 * Memory: no allocation when every head of dst has at least as many slots
 * as the same head of src keeps positions, or with shared budgets every
 * group of dst at least as many slots as src's group: when dst is a clone
 * or an earlier copy of src, or both are evicted after every step to at
 * most their budget (each group to at most share * budget). Otherwise the
 * heads (groups) that are short grow to src's slots, all or nothing:
 * KVE_ENOMEM leaves dst unchanged. O(kept, every head). */
KVE_API kve_status kve_bank_copy(kve_bank *dst, const kve_bank *src);

/* As kve_policy_remove, on every head: removes every kept position in
 * [p0, p1) from each. A shared group stays consistent: each head keeps its
 * part of the group's storage, and the next shared eviction compares what
 * the heads still keep.
 * Refuses (KVE_EINVAL, nothing changed): NULL b; p0 >= p1.
 * Never allocates. O(kept, every head). */
KVE_API kve_status kve_bank_remove(kve_bank *b, int32_t p0, int32_t p1);

/* As kve_policy_reset, on every head: each random stream back to its
 * start, and a shared group's heads back to even parts of its storage,
 * which keeps its size. NULL is a no-op, as is a call from inside b's own
 * callbacks. Never allocates. O(heads). */
KVE_API void kve_bank_reset(kve_bank *b);

/* As kve_policy_save: b's image, every head in head order (docs/api.md).
 * Its size is 72 + strlen(kve_bank_spec(b)) + 8 bytes (+ 48 for a bank
 * with the methods' facts or state, + 56 for a same_positions bank:
 * docs/api.md), and for each head 64 bytes and its kept positions times the
 * bytes of a slot (h2o: 12), e.g. 10415 bytes for 8 heads of
 * "h2o:budget=102" each at its budget.
 * Refuses as kve_policy_save (KVE_ERANGE: *size holds the bytes needed).
 * Reads b only; never allocates. O(size of the image). */
KVE_API kve_status kve_bank_save(const kve_bank *b, void *buf, size_t cap, size_t *size);

/* As kve_policy_load, for a bank's image (a policy's is refused: kind): a
 * new bank in *out, through `allocator`. Validates besides: the heads
 * (>= 1) and options as kve_bank_new_ex does (share dividing the heads, a
 * policy that scores, min_share in [0, 1]), and every head as
 * kve_policy_load does one (the message names it: "image: head 5: ...").
 * KVE_ENOMEM. On failure *out is untouched and nothing stays allocated.
 * Allocates what kve_bank_new_ex would, plus a block for each head (group)
 * whose image keeps more positions than its slots. O(size). */
KVE_API kve_status kve_bank_load(const void *buf, size_t size, const kve_allocator *allocator,
                                 kve_bank **out);

/* The bytes a kve_policy_load or kve_bank_load of the image buf[0 .. size)
 * would allocate (at its peak, through the allocator, the allocator's own
 * overhead aside), in *bytes, without allocating: so an untrusted image
 * can be refused before it is built. A small image can ask for much: its
 * spec's budget sizes the slots of every head before a position is read
 * (a 178-byte policy image of "h2o:budget=9000000,recent_window=8" asks
 * for 117 MB, one of keydiff for budget * key_dim floats more). The image's header and
 * lengths are checked as load checks them (the same KVE_EINVAL messages;
 * a rule's image needs the rule registered), its heads' contents are not.
 * SIZE_MAX when the count overflows. Thread-safe; never allocates. O(heads).
 *     size_t need;
 *     if (kve_image_load_bytes(buf, n, &need) != KVE_OK || need > my_limit)
 *         refuse it; else kve_bank_load(buf, n, NULL, &b); */
KVE_API kve_status kve_image_load_bytes(const void *buf, size_t size, size_t *bytes);

/* ======================================================================
 * 6. Budgets across layers
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

/* A schedule. */
typedef struct kve_schedule_options {
    kve_schedule_kind kind; /* default KVE_SCHEDULE_UNIFORM */
    size_t floor;           /* every layer gets at least this (default 0) */
    double beta;            /* PYRAMID: >= 1, finite (default 20) */
    const double *weights;  /* WEIGHTED: n_layers finite weights >= 0, summing > 0,
                               read during the call only (default NULL) */
} kve_schedule_options;

/* The defaults: uniform, floor 0, beta 20, no weights. */
KVE_API kve_schedule_options kve_schedule_default_options(void);

/* Writes to out[0 .. n_layers) the budgets of schedule `options` (NULL: the
 * defaults) for `total`, which add up to total exactly (see above).
 * Deterministic: the same arguments give the same budgets on every machine.
 * Refuses (KVE_EINVAL, out untouched): NULL out, n_layers 0, a kind outside
 *      kve_schedule_kind, total < n_layers * floor, a pyramid beta below 1 or
 *      not finite, NULL weights or a weight that is negative, NaN or
 *      infinite, or weights summing to 0 (the message names the index).
 * Thread-safe; never allocates; O(n_layers^2). */
KVE_API kve_status kve_layer_budgets(size_t total, size_t n_layers,
                                     const kve_schedule_options *options, size_t *out);

/* ======================================================================
 * 7. Pages
 *
 * Paged KV caches (vLLM, TensorRT-LLM, OpenVINO) store keys and values in
 * pages of b consecutive positions and can free only whole pages. The scored
 * policies (h2o, scissorhands, tova, h2o_decay, h2o_mean) take the spec keys
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
 * (checked by kve_policy_new and every evict; kve_spec_min_budget gives it).
 * block=1 is the policy without pages, exactly, and its canonical spec
 * omits both keys.
 * ====================================================================== */

/* ======================================================================
 * 8. Prefill compression
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
 *   KVE_PREFILL_KVZIP   KVzip (Kim et al. 2025): after the prompt, the model
 *                       is run over a reconstruction prompt ("Repeat the
 *                       previous context exactly.") and the prompt again,
 *                       teacher-forced; position i scores the largest weight
 *                       it receives from any of those reconstruction queries
 *                       in any query head of its KV head's group. The rows
 *                       are the engine's: r = options.queries rows a query
 *                       head, each over every prompt key 0 .. n-1 (entries a
 *                       query does not see, outside its chunk, are 0), the
 *                       group reduced (KVE_REDUCE_MAX is KVzip's max over
 *                       query heads), then the maximum over the rows. The
 *                       first options.sinks positions are kept (kvpress's
 *                       n_sink), and of the others the budget - sinks of
 *                       highest score. An engine that keeps a running max
 *                       over its reconstruction queries passes r = 1: the
 *                       call reads r * n weights a query head.
 *                       docs/policies/kvzip.md says how the rows are made
 *                       (a softmax over the sinks, the chunk and the
 *                       reconstruction tokens; chunks of 2048 positions).
 *
 * Ties go to the lower position. Grouped-query attention: the rows of a KV
 * head's `group` query heads are reduced to one as the bank's grouped step
 * does (kve_reduce), then summed in double in row order (KVzip: their
 * maximum). A prompt that fits (n <= budget) keeps everything. After
 * kve_bank_prefill the heads hold the kept positions as if admitted, and
 * the policies whose score is attention received (h2o, h2o_decay, tova)
 * start from the column sum of the rows given (H2O, SnapKV): for h2o, the
 * attention each kept position accumulated over the prompt (its own query's
 * weight included); tova replaces it at the next step. scissorhands,
 * h2o_mean, score rules, and every policy after KVzip (whose rows are not
 * attention the sequence paid) start as admitted (no votes, no sum, score
 * 0), except h2o_mean with diagonal=1 after H2O: position i starts from
 * its column sum (the group reduced in double) over the n - i queries that
 * see it, its own included, and is ranked by that mean, kvpress's
 * ObservedAttentionPress (docs/policies/h2o_mean.md). A policy with
 * vnorm=1 needs the prompt's values (options.values), whose norms it keeps
 * and scales its scores by. The next step is at
 * position n or later. Parameters and defaults, with their sources:
 * docs/prefill.md and docs/policies/kvzip.md.
 *
 *     kve_prefill_options o = kve_prefill_default_options();
 *     o.method = KVE_PREFILL_SNAPKV;
 *     r = kve_prefill_rows(n, &o);        rows the method reads
 *     ... compute rows of the queries n-r .. n-1 for every query head ...
 *     kve_bank_prefill(b, first, count, n, budget, rows, ld, group, reduce, &o);
 *     ... keep kve_bank_positions(b, h) in head h's cache, drop the rest ...
 *
 * Policies that read keys need no prefill call: step them through the
 * prompt without evicting and evict once (kvpress's KnormPress and
 * KeyDiffPress are exactly that).
 * ====================================================================== */

typedef enum kve_prefill_method {
    KVE_PREFILL_H2O = 0,    /* column sums of every prompt row */
    KVE_PREFILL_SNAPKV = 1, /* the last `window` rows, pooled */
    KVE_PREFILL_KVZIP = 2   /* the reconstruction pass's rows, their maximum */
} kve_prefill_method;

typedef enum kve_pool {
    KVE_POOL_MAX = 0, /* the largest score within the kernel */
    KVE_POOL_AVG = 1  /* the kernel's sum divided by kernel (missing positions count 0) */
} kve_pool;

/* How a prompt is compressed. */
/* KVzip's budgets across heads (kvpress's KVzipPress.layerwise). PER_HEAD:
 * every head keeps `budget` positions. PER_LAYER (kvpress's layerwise=True):
 * the heads of each layer keep layer_heads * budget positions together,
 * those of highest score over all of them (one cut per layer). OVERALL
 * (kvpress's default, layerwise=False): one threshold over every head of
 * the call, the P = count * (n - budget) lowest scores' largest; each layer
 * loses its scores at or below it (ties can take a few more), its lowest,
 * and keeps the rest. A head then keeps from 0 (sinks aside) to n
 * positions: with a shared budget over a layer's heads (share =
 * layer_heads) the decode steps keep each layer's total
 * (kve_bank_evict_shared); kve_bank_sizes reports what each head kept.
 * Those counts are kvpress's at the ratio that prunes them (a budget is a
 * whole number of positions a head). kvpress's own ratio cr prunes counts no
 * budget gives (3 layers of 2 heads of 512 at 0.8: 2457, a budget 2454 or
 * 2460); options.compression_ratio = cr takes them exactly: PER_LAYER each
 * layer prunes int(layer_heads * n * cr) (a double product, truncated, as
 * Python's int()), OVERALL the threshold is the max(int(count * n * cr) -
 * 1, 0)-th lowest score (from 0), whatever n and the budget (which is then
 * only checked); kvevict's sinks (prefix KVE_PREFILL_NO_PREFIX) are still
 * never cut. */
typedef enum kve_prefill_budgets {
    KVE_PREFILL_PER_HEAD = 0,
    KVE_PREFILL_PER_LAYER = 1,
    KVE_PREFILL_OVERALL = 2
} kve_prefill_budgets;

/* kve_prefill_options.prefix: no prefix, kvevict's sinks. */
#define KVE_PREFILL_NO_PREFIX SIZE_MAX

typedef struct kve_prefill_options {
    kve_prefill_method method;      /* default KVE_PREFILL_H2O */
    size_t window;                  /* SnapKV: w, the observation window (default 32) */
    size_t kernel;                  /* SnapKV: pooling kernel, odd (default 5) */
    kve_pool pool;                  /* SnapKV: pooling (default KVE_POOL_MAX) */
    const kve_allocator *allocator; /* the call's scratch; NULL (the default): the
                                       bank's (kve_bank_prefill) or the C
                                       library's (kve_prefill_scores) */
    size_t queries;                 /* KVzip: r, the rows a query head, >= 1 (default 1) */
    size_t sinks;                   /* KVzip: the first positions kept (default 4) */
    const float *values;            /* the prompt's values, for a policy with vnorm=1:
                                       head first + j's value of position i at
                                       values + (j*n + i)*ld_values, value_dim
                                       floats; read during the call (default NULL) */
    size_t ld_values;               /* >= value_dim (default 0) */
    kve_prefill_budgets budgets;    /* KVzip: how the heads of the call share the
                                       budget (default KVE_PREFILL_PER_HEAD) */
    size_t layer_heads;             /* KVzip, KVE_PREFILL_PER_LAYER: the heads of a
                                       layer, dividing count (layer l is heads
                                       first + l*layer_heads ..); 0 (the default):
                                       count, one layer */
    size_t prefix;                  /* KVzip: positions before the context (kvpress's
                                       prefix_length, a chat template's opening):
                                       the sinks are then kvpress's, the first
                                       min(sinks, prefix) scored 1; the default
                                       KVE_PREFILL_NO_PREFIX: the first `sinks`
                                       always kept (kvpress cuts sinks when the
                                       prefix is shorter: docs/policies/kvzip.md) */
    const float *row_scale;         /* KVzip+: r factors, row k's weights times
                                       row_scale[k] (kvpress's 1 / ||h||, the norm of
                                       the row's query token's attention input);
                                       NULL (the default): none */
    const float *key_scale;         /* KVzip+: query head g's weight on key i times
                                       key_scale[(j*group + g)*n + i] for head
                                       first + j (kve_prefill_scores: j = 0;
                                       kvpress's ||W_o,g v_i||, the norm of key i's
                                       value through query head g's slice of the
                                       output projection); NULL (the default): none */
    double compression_ratio;       /* KVzip, PER_LAYER or OVERALL: kvpress's
                                       KVzipPress.compression_ratio, in (0, 1): the
                                       call prunes kvpress's count, not the budget's
                                       (below); 0 (the default): the budget's */
} kve_prefill_options;

/* The defaults: H2O, window 32, kernel 5, KVE_POOL_MAX (the H2O method uses
 * none of the three), no allocator of the call's own, queries 1, sinks 4,
 * no values, KVE_PREFILL_PER_HEAD, layer_heads 0, KVE_PREFILL_NO_PREFIX, no
 * row_scale or key_scale, compression_ratio 0.
 *
 * KVzip+ (kvpress's KVzipPress(kvzip_plus_normalization=True)): with
 * row_scale and/or key_scale set, each weight is scaled before the group's
 * reduction and the maximum over rows, in float32 as kvpress's tensors are:
 * w' = (w * row_scale[k]) * key_scale[g, i], each product rounded to float.
 * KVzip only; a NaN, infinite or negative factor, or a scaled weight beyond
 * float32, is refused (the message names it). */
KVE_API kve_prefill_options kve_prefill_default_options(void);

/* The number of rows r the method of `options` (NULL: the defaults) reads
 * of an n-token prompt: n for H2O, min(window, n) for SnapKV (row k of a
 * query head is the attention of query n - r + k), options->queries for
 * KVzip (row k is reconstruction query k's weights over all n keys).
 * O(1). */
KVE_API size_t kve_prefill_rows(size_t n, const kve_prefill_options *options);

/* The scores of one KV head's prompt: scores[i] for i < n, the value the
 * method ranks position i by (H2O: the column sum; SnapKV: the pooled column
 * sum before the window, the plain column sum inside it; KVzip: the largest
 * reduced weight of any row).
 * rows: for query head g < group and row k < r = kve_prefill_rows(n,
 *      options), the weights of query t = n - r + k over keys 0 .. t at
 *      rows + (g*r + k)*ld (entries past t are not read; KVzip: row k holds
 *      weights over every key 0 .. n-1, all read); ld >= n.
 * options: NULL for the defaults.
 * scores: n doubles.
 * Refuses (KVE_EINVAL): NULL scores or rows; n 0 or above 2^31; ld < n;
 *      group 0; a reduce outside kve_reduce; an unknown method; window 0, or
 *      a kernel that is 0 or even (SnapKV); queries 0 (KVzip); a compression_ratio
 *      that is not 0 or in (0, 1), or one without KVzip's PER_LAYER or
 *      OVERALL budgets; a NaN, infinite or negative
 *      weight (the message names query head, query position and key) or
 *      (KVE_REDUCE_SUM) a reduced weight beyond float32. scores is untouched
 *      on refusal; KVE_ENOMEM if its scratch (n doubles, through
 *      options->allocator) cannot be allocated. Thread-safe;
 *      O(group*r*n + n*kernel). */
KVE_API kve_status kve_prefill_scores(size_t n, const float *rows, size_t ld, size_t group,
                                      kve_reduce reduce, const kve_prefill_options *options,
                                      double *scores);

/* Compresses heads [first, first + count) of `b`, which must hold nothing
 * yet (a new sequence), to the prefill of an n-token prompt: each head keeps
 * at most `budget` of the positions 0 .. n-1, chosen as described above.
 * rows: head first + j's query head g, row k at rows + ((j*group + g)*r +
 *      k)*ld, as kve_prefill_scores reads one KV head.
 * options: NULL for the defaults.
 * Refuses (nothing changed): what kve_prefill_scores refuses (the message
 *      names the head), plus NULL b, a range past the bank; a head that
 *      holds positions; a policy that is not scored (full, window,
 *      streaming, random: evict them instead) or that reads keys; budget 0,
 *      above the bank's budget, not above recent_window (H2O), window
 *      (SnapKV) or sinks (KVzip); a policy with vnorm=1 without values, with
 *      ld_values below its value_dim, or with a NaN or infinite value entry;
 *      on a same_positions bank, a range but every head (which then keep
 *      one kept set, chosen by their scores added in head order; scratch 3
 *      n doubles). count 0 checks every argument but the rows (which
 *      may then be NULL) and changes nothing: a way to validate before
 *      computing the rows. KVE_ENOMEM if its scratch (2 n doubles, n bytes
 *      and budget heap entries, through options->allocator or else the
 *      bank's) cannot be allocated.
 * Threads: as kve_bank_step_range. Cost: O(count*group*r*n) plus O(n log
 * budget) a head for the selection. */
KVE_API kve_status kve_bank_prefill(kve_bank *b, size_t first, size_t count, size_t n,
                                    size_t budget, const float *rows, size_t ld, size_t group,
                                    kve_reduce reduce, const kve_prefill_options *options);

/* Precomputed query statistics (kvpress's ExpectedAttentionStatsPress):
 * expected_attention with the spec key query_stats=1 keeps no buffer of
 * queries (its steps need none) and scores from the statistics given here,
 * computed by the caller offline (over a calibration text, the queries
 * before the rotary embedding): at every rescoring mu_g and Sigma_g are
 * these, rotated to the future positions as the buffer's would be
 * (future_from_buffer=1 is refused with query_stats=1). Until they are
 * given a head scores as with no statistics (0; the sinks on top).
 * mean: (count, G, d) floats, head first + j's query head g at
 *      mean + (j*G + g)*d (G = query_group, d = key_dim);
 * cov: (count, G, d, d) floats at cov + ((j*G + g)*d + a)*d + b, read with
 *      use_covariance=1 (required then), ignored (may be NULL) with 0.
 * Both are read during the call and kept as doubles in each head (its aux:
 * G (d + d^2) doubles in the place of the query buffer); copies, clones
 * and images carry them, a reset forgets them (as constructed).
 * Refuses (KVE_EINVAL, nothing changed): NULL b; a bank that is not
 * expected_attention with query_stats=1; a range past the bank; mean NULL,
 * or cov NULL with use_covariance=1 (count 0 reads neither); an entry that
 * is NaN or infinite (the message names head, query head and index); a
 * call from the bank's own callbacks. Not thread-safe with other calls on
 * b. O(count G d^2). */
KVE_API kve_status kve_bank_query_stats(kve_bank *b, size_t first, size_t count,
                                        const float *mean, const float *cov);
/* kve_bank_query_stats of a policy's one head (count 1); NULL p refused. */
KVE_API kve_status kve_policy_query_stats(kve_policy *p, const float *mean, const float *cov);

/* ======================================================================
 * 9. Attention rows for engines that never materialise attention
 *
 * Fused ("flash") attention kernels never write the attention weights, which
 * every scored policy reads. These functions recompute them from the query
 * and the kept keys: the softmax of one query over the keys the policy keeps
 * (the query's own key excluded), which is exactly the row the evaluation
 * harness feeds a policy (p_t restricted to the kept set, renormalised).
 *
 *     for every query head r of KV head h:   (or kve_bank_attn_rows, below)
 *         kve_attn_row(q[r], d, K[h], ld, kve_bank_size(b, h), scale, row[r]);
 *     kve_bank_step_range(b, 0, heads, pos, rows, ld_rows, group,
 *                         KVE_REDUCE_MEAN, NULL, 0);
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
 * out: n floats. n == 0 writes nothing and succeeds (pointers may then be
 * NULL).
 * Refuses (KVE_EINVAL): d == 0; ld < d; a NaN or infinite scale; NULL q,
 *       keys or out with n > 0; a logit that is not finite (a NaN or
 *       infinite input, or a dot product beyond float32): the message names
 *       the key, and out[0 .. n) then holds unspecified values.
 * Thread-safe (reads only its arguments). O(n*d). */
KVE_API kve_status kve_attn_row(const float *q, size_t d, const float *keys, size_t ld, size_t n,
                                float scale, float *out);

/* Key tiles: the layout kve_attn_rows (float32) and kve_attn_rows_f16
 * (half floats) read, for an engine that keeps its own copy of the keys.
 * Keys go in blocks of KVE_ATTN_TILE, each block d * KVE_ATTN_TILE entries,
 * key i's entry c at
 *     tiles[(i / KVE_ATTN_TILE) * KVE_ATTN_TILE * d + c * KVE_ATTN_TILE + i % KVE_ATTN_TILE]
 * (a block is the keys' transpose: one key a lane). A copy of n keys takes
 * ceil(n / KVE_ATTN_TILE) whole blocks; one that starts on a 64-byte
 * boundary has each block's rows of 16 floats on one cache line each (of
 * 16 half floats, on half of one), which the calls read fastest (any
 * alignment works). */
#define KVE_ATTN_TILE 16

/* Writes `rows` rows: row r, at out + r*ld_out, is bit for bit
 *   kve_attn_row(q + r*ldq, d, K, d, n, scale, out + r*ld_out)
 * where K holds the same n keys in rows. A tile's sixteen keys are summed
 * lane-wise, with no horizontal sums; on AVX-512 the tiles are read once
 * for every eight query rows (a grouped-query attention group shares its
 * KV head's keys), so a group costs less than its rows one by one
 * (docs/performance.md); elsewhere once a row.
 *
 * q: query r at q + r*ldq, d floats. tiles: ceil(n / KVE_ATTN_TILE) blocks
 * as above; the lanes of the last block past n are read but never used
 * (any bits). rows == 0 or n == 0 writes nothing and succeeds (after the
 * checks of d, scale, ldq and ld_out below).
 * Refuses (KVE_EINVAL): d == 0; a NaN or infinite scale; ldq < d or ld_out
 * < n with rows > 1; NULL q, tiles or out with rows, n > 0; a logit that is
 * not finite (the message names the query row and the key; the rows then
 * hold unspecified values). Thread-safe (reads only its arguments).
 * O(rows*n*d). */
KVE_API kve_status kve_attn_rows(const float *q, size_t ldq, size_t rows, size_t d,
                                 const float *tiles, size_t n, float scale, float *out,
                                 size_t ld_out);

/* kve_attn_rows over tiles of half floats (IEEE binary16, as uint16_t: the
 * keys an engine's F16 cache holds, llama.cpp's default), the same layout
 * at two bytes an entry. Every row is bit for bit kve_attn_rows' over the
 * same keys widened to float32 (widening is exact), so it is
 * kve_attn_row's over them too; the tiles are half the bytes to read.
 * AVX-512 widens a tile row as it loads it (vcvtph2ps), the other paths in
 * plain C. The lanes of the last block past n are read but never used (any
 * bits). Refuses as kve_attn_rows (a NaN or infinite key gives a logit that
 * is not finite). Thread-safe (reads only its arguments). O(rows*n*d). */
KVE_API kve_status kve_attn_rows_f16(const float *q, size_t ldq, size_t rows, size_t d,
                                     const uint16_t *tiles, size_t n, float scale, float *out,
                                     size_t ld_out);

/* The rows kve_bank_step_range(b, first, count, pos, out, ld_out, group,
 * reduce, ...) reads, for heads [first, first + count) of `b`: for KV head
 * h = first + j and its query heads g < group, query row r = j*group + g is
 *   kve_attn_row(q + r*d, d, keys + j*ld_head, ld_key, kve_bank_size(b, h),
 *                scale, out + r*ld_out).
 * So q holds count*group query vectors of d floats, contiguous; head h's
 * kept keys (in kept order: the engine's cache as the bank keeps it) start
 * at keys + j*ld_head with row stride ld_key; out row r has ld_out >= the
 * head's size. The reduction over a group is left to the step, so an engine
 * that computes its own rows and one that calls this get the same.
 * Refuses as kve_attn_row (the message names head, query row and key), plus
 * NULL b, a range past kve_bank_heads(b), group 0, and ld_out smaller than
 * some head's size; all checked before anything is written, except a logit
 * that is not finite, found while writing (the rows written so far then hold
 * unspecified values). Reads `b` only: may run concurrently with other
 * readers of disjoint ranges (see "Banks"). O(count*group*n*d). */
KVE_API kve_status kve_bank_attn_rows(const kve_bank *b, size_t first, size_t count,
                                      const float *q, size_t d, size_t group, const float *keys,
                                      size_t ld_key, size_t ld_head, float scale, float *out,
                                      size_t ld_out);

/* ======================================================================
 * 10. Instruction sets
 * ====================================================================== */

/* The instruction set the library's kernels run with on this machine:
 * "avx512", "avx2" or "scalar" (the portable code, the definition the others
 * equal bit for bit). Chosen once, at the first call that needs it, from the
 * CPU. Never NULL; the string is static. */
KVE_API const char *kve_isa_name(void);

#ifdef __cplusplus
}
#endif

#endif /* KVEVICT_H */
