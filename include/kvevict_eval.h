/* SPDX-License-Identifier: MIT */
/*
 * kvevict_eval.h - kvevict's research harness: attention traces and the
 * evaluation of policies on them.
 *
 * A second library, libkvevict_eval, on top of the engine core (kvevict.h,
 * which this header includes): every trace source (the synthetic canonical
 * trace, .npy files, query/key traces, arrays in memory), the .npy reader
 * and writer, and kve_eval, which runs policies over a trace and measures
 * what they keep. An engine needs none of it; a researcher comparing
 * policies, the kvevict tool and the Python binding use it. It reads files
 * and clocks, which the core never does. A model evaluated live hands its
 * attention over step by step through callbacks (kve_trace_from_callback).
 *
 * The conventions of kvevict.h hold here too: kve_status and
 * kve_last_error, nothing changed on failure, options from
 * kve_X_default_options(), the allocator of the options, the argument order
 * (object, head range, position, data, options, outputs with their
 * capacities). Ordered as a reader needs it:
 *
 *   1. Traces        sources, opening, reading rows and keys, writing .npy
 *   2. The harness   jobs, options, results, kve_eval
 *
 * The harness must run on the core of its own version (both are built and
 * installed together): every constructor here refuses, with KVE_EINVAL, a
 * core whose kve_version_number() differs.
 */
#ifndef KVEVICT_EVAL_H
#define KVEVICT_EVAL_H

#include "kvevict.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * 1. Traces
 *
 * A trace is a sequence of attention rows. Row t (query position t) holds
 * weights over keys [0, t], the query's own key t included, summing to 1.
 * For a triplet (source, options, head) the rows are always the same, on
 * every machine. Sources:
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
 *   a live trace (kve_trace_from_callback, below): rows and keys produced by
 *        the caller's callbacks a step at a time, as a model computes them,
 *        validated as they arrive. Its source text is "callback", which
 *        kve_trace_open refuses likewise.
 * ====================================================================== */

typedef struct kve_trace kve_trace; /* opaque */

/* Progress of a long call (opening and validating a large .npy file, writing
 * one): `done` of `total` units (rows) are finished. Called with done = 0
 * before the work, then after each unit (so done = total last).
 * Return 0 to go on, non-zero to stop: the call then returns KVE_ECANCELED
 * with everything released, as any other failure. */
typedef int (*kve_progress_fn)(void *user, uint64_t done, uint64_t total);

/* How a trace reads its rows: a set of these flags. */
typedef enum kve_trace_flags {
    KVE_TRACE_NONE = 0,     /* rows as the source holds them (the default) */
    KVE_TRACE_NORMALIZE = 1 /* recorded rows (a .npy file, memory) rescaled to sum 1 */
} kve_trace_flags;

/* What kve_trace_open and kve_trace_from_memory do besides the source. */
typedef struct kve_trace_options {
    const kve_allocator *allocator; /* NULL (the default): the C library's */
    kve_trace_flags flags;          /* default KVE_TRACE_NONE */
    kve_progress_fn progress;       /* reports while a file is validated (a .npy
                                       file: one unit per row of every head,
                                       heads * T in all; a q/K file: one per
                                       vector of Q and K); NULL (the default):
                                       none. A synthetic or in-memory trace
                                       reports nothing */
    void *user;                     /* passed to progress (default NULL) */
} kve_trace_options;

/* The defaults: the C library's allocator, no flags, no progress. */
KVE_API kve_trace_options kve_trace_default_options(void);

/* Opens `src` (see above) with options (NULL: the defaults).
 * Refuses: KVE_EINVAL for a malformed canonical spec, NULL src or out, or
 * flags outside kve_trace_flags; KVE_EIO for a file that cannot be opened or
 * read; KVE_EFORMAT for a malformed .npy (bad magic, header, dtype, order,
 * shape, truncation) or rows that are not distributions; KVE_ECANCELED when
 * progress asks to stop; KVE_ENOMEM. *out is untouched on failure.
 * Allocates the handle and the source's state (O(T), a q/K trace O(T*d))
 * through options->allocator; every later read uses only that. */
KVE_API kve_status kve_trace_open(const char *src, const kve_trace_options *options,
                                  kve_trace **out);

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
 * options: NULL for the defaults. The rows are validated now, exactly as a
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
 *       out, flags outside kve_trace_flags, a zero dimension, steps above
 *       INT32_MAX (positions are int32_t), a shape whose size in bytes does
 *       not fit in size_t; KVE_EFORMAT for a row that is not a distribution
 *       (the message names head, layer, row and key); KVE_ENOMEM.
 * Memory: the handle and one row of T doubles while validating (freed),
 *       through options->allocator; never a copy of the array. Cost: one
 *       read of the lower triangle, layers * heads_per_layer * T * (T + 1) / 2
 *       weights. Reads only the array: several traces may borrow one array,
 *       from several threads. */
KVE_API kve_status kve_trace_from_memory(const float *attn, size_t layers,
                                         size_t heads_per_layer, size_t steps,
                                         const kve_trace_options *options, kve_trace **out);

/* The caller's side of a live trace (kve_trace_from_callback), in the
 * manner of Redis' dictType: a table of functions, usually static const,
 * and a user pointer given to each. The trace asks for a whole step at a
 * time, every head of it, so a model that computes its attention one
 * decode step after another (a decoder, a PyTorch forward with a KV cache)
 * hands over each step as it computes it and never holds [L, H, T, T].
 *
 * rows (required): writes step t of every head: head h's weights over keys
 *      [0, t] (query t's attention, its own key included) at
 *      rows[h * ld + i] for i <= t, ld >= t + 1 (entries past t are
 *      ignored). Returns KVE_OK, or a status with a message set by
 *      kve_set_error (the trace's reader gets both; without a message the
 *      trace writes one naming the step). The trace asks for the steps a
 *      reader needs: kve_eval and every command ask in ascending order,
 *      each step once per pass; a reader that goes back (a second pass, a
 *      kve_trace_row of an earlier step) asks for an earlier t, which the
 *      callback produces again (a decoder starting over) or refuses.
 * keys (NULL unless key_dim > 0, required then): writes the key of position
 *      t of every head, head h's key_dim floats at keys[h * ld], ld >=
 *      key_dim; asked for when a key-reading policy is stepped at t.
 * free (may be NULL): called once by kve_trace_free with `user`; not called
 *      when kve_trace_from_callback fails (the caller still owns user). */
typedef struct kve_trace_callbacks {
    kve_status (*rows)(void *user, size_t t, float *rows, size_t ld);
    kve_status (*keys)(void *user, size_t t, float *keys, size_t ld);
    void (*free)(void *user);
} kve_trace_callbacks;

/* Makes a trace whose rows (and keys) the caller's callbacks produce on
 * demand, as they are read: the attention of a model evaluated live, with
 * no file and no [L, H, T, T] array.
 *
 * cb: the callbacks (borrowed: must outlive the trace); user: passed to
 *      each. layers * heads_per_layer heads of `steps` rows, numbered
 *      layer-major as every trace's; key_dim: the floats of a key (0: the
 *      trace has no keys, and cb->keys must be NULL).
 * Validation, the same as every source's: each row is checked when the
 *      callback delivers it, exactly as a .npy file's rows are when opened
 *      (every weight over [0, t] finite and >= 0, every row t >= 1 summing
 *      to 1 within 1e-3 unless KVE_TRACE_NORMALIZE, which divides it by its
 *      sum in double; an all-zero row is still refused): KVE_EFORMAT naming
 *      "callback", the head (layer and head in the layer), the row and the
 *      key. Keys are checked finite (KVE_EFORMAT naming head, position and
 *      index). kve_trace_row gives the floats widened to double (the same
 *      bits as a memory trace or the .npy file of the same float32 rows).
 *      A step that fails (callback or validation) is not kept: the next
 *      read asks for it again.
 * kve_trace_source is "callback"; progress in options is not used.
 * Refuses (*out untouched, nothing allocated, no callback called):
 *      KVE_EINVAL for NULL cb, cb->rows or out, cb->keys NULL with key_dim
 *      > 0 or set with key_dim 0, key_dim above KVE_MAX_KEY_DIM, a zero
 *      dimension, steps above INT32_MAX, flags outside kve_trace_flags, a
 *      step of heads * steps floats whose size does not fit in size_t;
 *      KVE_ENOMEM.
 * Memory: one step of every head, heads * steps floats (plus heads *
 *      key_dim for keys), allocated now through options->allocator; reads
 *      never allocate. O(heads * t) per step delivered, O(t) per row read.
 * Threads: the callbacks run on the thread that reads the trace, one at a
 *      time per trace; a trace is read from one thread at a time. A read
 *      of the trace from inside its own callbacks (kve_trace_row, kve_eval
 *      of it, ...) is refused, KVE_EINVAL naming it, the step being
 *      delivered intact; kve_trace_free must not be called there. */
KVE_API kve_status kve_trace_from_callback(const kve_trace_callbacks *cb, void *user,
                                           size_t layers, size_t heads_per_layer, size_t steps,
                                           size_t key_dim, const kve_trace_options *options,
                                           kve_trace **out);

/* Releases `tr`, through its allocator. NULL is a no-op. */
KVE_API void kve_trace_free(kve_trace *tr);

/* T, the number of steps (rows) of every head; 0 for NULL. */
KVE_API size_t kve_trace_steps(const kve_trace *tr);

/* The number of heads: L*H for a .npy file of shape [L, H, T, T], H for
 * [H, T, T], 1 otherwise. Heads are numbered layer-major. 0 for NULL. */
KVE_API size_t kve_trace_heads(const kve_trace *tr);

/* L, the number of layers (1 unless the file is [L, H, T, T]); 0 for NULL. */
KVE_API size_t kve_trace_layers(const kve_trace *tr);

/* The canonical spec of a synthetic trace, the path of a file, or "memory".
 * Owned by the trace; NULL for NULL. */
KVE_API const char *kve_trace_source(const kve_trace *tr);

/* d, the dimension of the trace's key vectors: that of a q/K trace, 0 for a
 * trace without keys (canonical, a dense .npy) or NULL. */
KVE_API size_t kve_trace_key_dim(const kve_trace *tr);

/* Writes row `t` of head `head` to row[0 .. t] (t + 1 doubles: the weights
 * over keys 0..t); row holds cap doubles. Rows may be read in any order;
 * reading them in ascending t is the fast path. Refuses: KVE_EINVAL for NULL
 * tr or row, head or t out of range; KVE_ERANGE when cap < t + 1; KVE_EIO if
 * the file can no longer be read; KVE_EFORMAT for a row found invalid (an
 * array in memory that changed, logits of a q/K trace beyond float32).
 * Never allocates. O(t) (a q/K trace: O(t*d) a query head). */
KVE_API kve_status kve_trace_row(kve_trace *tr, size_t head, size_t t, double *row, size_t cap);

/* Writes the key of position t of head `head` (its KV head's key: the
 * vector the file holds, kve_trace_key_dim(tr) floats) to key, which holds
 * cap floats. Refuses: KVE_EINVAL for NULL arguments, head or t out of
 * range, or a trace without keys; KVE_ERANGE when cap < key_dim; KVE_EIO if
 * the file can no longer be read. Never allocates. O(d). */
KVE_API kve_status kve_trace_key(kve_trace *tr, size_t head, size_t t, float *key, size_t cap);

/* Writes head `head` of `tr` as a [T, T] float32 C-order .npy file (version
 * 1.0 header, zeros above the diagonal), kve_trace_npy_bytes(tr) bytes. The
 * file is written to a temporary name beside `path` and renamed into place,
 * so a failure leaves no partial file. Refuses: KVE_EINVAL, KVE_EIO (the
 * message carries the system's reason), KVE_ENOMEM; KVE_ERANGE for a weight
 * too large for float32 (possible only in row 0, which is not held to sum
 * 1). Allocates O(T) of scratch through the trace's allocator. */
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
 * 2. The evaluation harness
 *
 * For each step t of heads [first, first + count) of a trace, and each
 * policy (kept set K):
 *  1. metrics on the full row p_t, whose total is P = sum over i <= t of
 *     p_t(i) (1 up to the rounding of the source's weights):
 *       retained mass = (sum over i in K of p_t(i) + p_t(t)) / P
 *       top-k recall  = |topk(p_t over [0, t)) & K| / min(k, t)
 *     Both sums are taken in ascending position, the query's own weight
 *     last, so the kept sum never exceeds P: a mass is at most 1, exactly 1
 *     for a policy that keeps everything. Ties in the top-k go to the lower
 *     position; top32_recall is the recall at k = 32, topk_recall the
 *     recall at options.topk;
 *  2. the policy sees p_t restricted to K and renormalised: the kept weights
 *     summed in double in kept order, each divided by that sum in double and
 *     rounded to float32. A zero kept sum passes NULL (no information); at
 *     t = 0 an empty vector;
 *  3. the step, then the evict to the job's budget. A policy that reads
 *     keys (kve_policy_type_reads) is built with the trace's key dimension
 *     and stepped with the key of position t (kve_trace_key): it runs on
 *     traces that have keys (q/K traces), and a job whose policy reads keys
 *     is refused on a trace without them.
 * Metrics are means over the "scored" steps: t > options.score_after, by
 * default t > the job's budget (before that nothing can have been evicted).
 * When there is none (budget >= T - 1), scored_steps is 0 and every metric
 * (retained_mass, top32_recall, topk_recall, min_retained_mass, mean_kept)
 * is NaN: a mean over no step is not a number, and a caller must not
 * mistake it for a perfect score (test with isnan). Policies of one call run
 * in lockstep over one pass of the trace, so a row is generated or read once
 * however many policies are evaluated.
 * ====================================================================== */

/* kve_eval_job.budget: the job evicts to its spec's own budget. */
#define KVE_EVAL_BUDGET_SPEC ((size_t)0)

typedef struct kve_eval_job {
    const char *spec; /* policy spec */
    size_t budget;    /* the budget evicted to, which overrides the spec's; or
                         KVE_EVAL_BUDGET_SPEC: the spec's */
} kve_eval_job;

typedef struct kve_eval_result {
    char spec[KVE_SPEC_MAX];  /* canonical spec of the policy evaluated */
    size_t budget;            /* budget evicted to */
    size_t steps;             /* steps evaluated: T unless stopped early */
    size_t scored_steps;      /* steps with t > score_after; 0: the metrics are NaN */
    double retained_mass;     /* mean over scored steps (NaN if none), at most 1 */
    double top32_recall;      /* mean over scored steps, k = 32 (NaN if none) */
    double min_retained_mass; /* minimum over scored steps (NaN if none) */
    double ns_per_step;       /* policy work only (step + evict), per step */
    size_t state_bytes;       /* kve_bank_state_bytes at the end */
    size_t topk;              /* k of topk_recall: options.topk */
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

/* kve_eval_options.score_after: score the steps after each job's budget. */
#define KVE_EVAL_AFTER_BUDGET SIZE_MAX

/* What kve_eval does besides the jobs. */
typedef struct kve_eval_options {
    const kve_allocator *allocator; /* every byte of the call: buffers and the
                                       jobs' banks. NULL (the default): the C
                                       library's */
    uint64_t seed;            /* policies needing an Rng get one seeded from it: the
                                 same seed for every job, so a job's result does not
                                 depend on its neighbours (default 0) */
    size_t topk;              /* k of topk_recall, 1 .. KVE_MAX_BUDGET (default 32) */
    kve_eval_step_fn on_step; /* called after each step of each job (default NULL) */
    void *user;               /* passed to on_step (default NULL) */
    size_t share;             /* heads per shared-budget group of each job's bank, as
                                 kve_bank_options.share: each group of share heads is
                                 evicted to share * budget by kve_bank_evict_shared
                                 (default 0: every head its own budget) */
    double min_share;         /* as kve_bank_options.min_share (default 0.2) */
    size_t score_after;       /* metrics over steps t > score_after (any value, 0
                                 included), or KVE_EVAL_AFTER_BUDGET (the default):
                                 over t > the job's budget. A fixed value lets jobs
                                 of different budgets (a layer schedule) be measured
                                 on the same steps */
} kve_eval_options;

/* The defaults: the C library's allocator, seed 0, topk 32, no callback, no
 * sharing (min_share 0.2), score_after KVE_EVAL_AFTER_BUDGET. */
KVE_API kve_eval_options kve_eval_default_options(void);

/* Evaluates n_jobs policies on heads [first, first + count) of `tr`,
 * writing results[i] for jobs[i] (n_jobs entries); options may be NULL (the
 * defaults). Each job is one bank of `count` heads (kve_bank_new_ex, with
 * options->share and min_share), head h fed trace head first + h as above,
 * the heads stepped and evicted together; with count 1 that is one policy
 * on one trace head. results[i] holds the means over the heads of each
 * head's metrics (min_retained_mass the minimum, state_bytes the bank's,
 * ns_per_step the whole bank's step and evict). per_head: NULL, or n_jobs *
 * count results, job-major, head h of job j at per_head[j * count + h] with
 * that head's own metrics (state_bytes and ns_per_step: the bank's divided
 * by count). Without sharing, head h's numbers are exactly those of a
 * one-head evaluation of that trace head. Sharing, the heads of a group are
 * stepped in one call, so a head whose kept weights sum to 0 receives a row
 * of zeros (unless every head of the bank does: then NULL). results and
 * per_head are written only when the whole call succeeds.
 * Refuses: KVE_EINVAL for NULL tr, jobs or results, n_jobs 0, count 0, heads
 * past the trace's, a bad spec, budget or sharing option (the message names
 * the job's spec), topk 0 or above KVE_MAX_BUDGET; KVE_ENOMEM; KVE_EIO and
 * KVE_EFORMAT from the trace.
 * Memory: O(count * T + min(topk, T)) plus the banks, all through
 * options->allocator and freed before returning. Cost per step: O(count * t
 * log k) for the top-k sets (shared by every job) plus O(kept) per job and
 * head. */
KVE_API kve_status kve_eval(kve_trace *tr, size_t first, size_t count, const kve_eval_job *jobs,
                            size_t n_jobs, const kve_eval_options *options,
                            kve_eval_result *results, kve_eval_result *per_head);

#ifdef __cplusplus
}
#endif

#endif /* KVEVICT_EVAL_H */
