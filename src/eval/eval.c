/* SPDX-License-Identifier: MIT */
/*
 * eval.c - the evaluation harness (kvevict_eval.h, "The evaluation harness").
 *
 * All jobs run in lockstep over one pass of the trace head: each row is
 * produced once, its top-32 and top-k sets computed once (one heap when
 * k = 32), then every job is measured on it, stepped and evicted. Per step
 * and job the harness does O(|K|) work (sum of kept weights, recall counts,
 * renormalisation); the top sets cost O(t log k) per row, shared by all
 * jobs.
 *
 * Buffers (all allocated before the first step; refusals allocate nothing
 * that survives):
 *   rows     [H, T]         each head's current row, weights over keys 0..t
 *   total    [H]            its total, P = sum over keys 0..t in key order
 *   attn     [H, T]         one job's renormalised kept weights (float32)
 *   in_top   [H, T]         bit 0: key in the head's current top-32,
 *                           bit 1: key in its top-k
 *   heap     [H, 32]        the top-32 selections
 *   heap_k   [H, min(k, T)] the top-k selections (none when k = 32)
 *   n_top    [2 H]          their sizes
 *   victims  [H, T + 1]     one job's victims of one step, head after head
 *   counts   [H]            their counts per head
 *   keys     [H, d]         the keys of position t (traces with keys only)
 *   jobs     [n_jobs]       per-job bank and per-head accumulators
 * (H: the count of heads.) So memory is O(H (T + d) + n_jobs) here plus
 * O(budget) per head of each job's bank, all of it (the banks included)
 * from options.allocator, in blocks of the sizes the buffer table below
 * records, freed with those sizes.
 *
 * Keys: on a trace with keys (kve_trace_key_dim d > 0) every job's bank is
 * built with key dimension d, and the jobs whose policy reads keys get the
 * key of position t of each head at step t (read once per step, shared by
 * every job); the others are stepped without it. On a trace without keys a
 * job whose policy reads keys is refused before anything runs.
 *
 * Retained mass: the kept weights and the query's own, over the row's total
 * P, both summed in ascending key order with the query's own weight last.
 * A sum over a subset of non-negative terms, taken in the order of the full
 * sum, never exceeds it (rounding is monotonic), so the mass is at most 1,
 * and exactly 1 when nothing was evicted: no clamp, and a trace whose
 * float32 weights sum to 1 + 1e-9 reads the same as one summing to 1.
 *
 * Invariants: results[] is written only when the whole call succeeds; the
 * timer brackets kve_policy_step + kve_policy_evict only and its readings
 * feed nothing but ns_per_step (minus the cost of one clock-reading pair,
 * calibrated as the minimum over 64 pairs, so never over-subtracted).
 * A per-thread test hook (kve__eval_set_attn_hook, eval_impl.h) sees what
 * each policy receives; it is NULL outside tests. A metric over no scored
 * step is NaN, never a number that could pass for a score.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
#define _POSIX_C_SOURCE 200809L

#include "eval_impl.h"
#include "kvevict_eval.h"

#include <math.h>

#include <stdio.h>
#include <string.h>
#include <time.h>

enum { TOP_32 = 32, CALIBRATION_PAIRS = 64, IN_TOP32 = 1, IN_TOPK = 2 };

/* One head's accumulators. */
typedef struct head_acc {
    size_t scored;
    double sum_mass;
    double sum_recall;   /* top-32 */
    double sum_recall_k; /* top-k */
    double sum_kept;
    double min_mass;
} head_acc;

typedef struct job_state {
    kve_bank *bank; /* (heads) */
    int reads_keys; /* the policy reads keys: step it with the keys of t */
    size_t budget;  /* per head; a shared group of share heads gets share * budget */
    size_t steps;   /* steps done */
    uint64_t ns;    /* timed policy work, overhead subtracted at the end */
    head_acc *acc;  /* (heads) */
} job_state;

static _Thread_local kve__eval_attn_fn attn_hook;
static _Thread_local void *attn_hook_user;

void kve__eval_set_attn_hook(kve__eval_attn_fn fn, void *user)
{
    attn_hook = fn;
    attn_hook_user = user;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The cost of one back-to-back pair of clock readings: the minimum over a
 * few pairs, so that subtracting it never exceeds the true overhead. */
static uint64_t timer_overhead_ns(void)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < CALIBRATION_PAIRS; i++) {
        uint64_t a = now_ns();
        uint64_t b = now_ns();
        if (b - a < best)
            best = b - a;
    }
    return best;
}

/* Marks in_top[i] |= bit for the top-min(k, t) keys of row over [0, t)
 * (ties to the lower position) and stores them in heap[0 .. *n). */
static void top_k(const double *row, size_t t, size_t k, kve__top_entry *heap, size_t *n,
                  unsigned char *in_top, unsigned char bit)
{
    *n = kve__top_k(row, t, k, heap);
    for (size_t j = 0; j < *n; j++)
        in_top[heap[j].pos] |= bit;
}

static void free_jobs(const kve_allocator *a, job_state *js, size_t n, size_t heads)
{
    if (!js)
        return;
    for (size_t i = 0; i < n; i++) {
        kve_bank_free(js[i].bank);
        kve__dealloc(a, js[i].acc, heads * sizeof *js[i].acc);
    }
    kve__dealloc(a, js, n * sizeof *js);
}

/* Whether the policy of canonical spec `spec` reads keys. */
static int spec_reads_keys(const char *spec)
{
    char name[KVE_NAME_MAX];
    const char *params;
    if (kve__spec_split(spec, name, &params) != KVE_OK)
        return 0;
    for (size_t t = 0; t < kve_policy_type_count(); t++)
        if (strcmp(kve_policy_type_name(t), name) == 0)
            return (kve_policy_type_reads(t) & KVE_READS_KEYS) != 0;
    return 0;
}

/* Builds job i's bank with its budget override, for keys of key_dim
 * floats. The message of a refusal names the job and its spec. */
static kve_status build_job(const kve_eval_job *job, size_t i, const kve_eval_options *o,
                            const kve_allocator *a, size_t heads, size_t key_dim, job_state *js)
{
    char spec[KVE_SPEC_MAX];
    char value[32];
    if (!job->spec)
        return kve__fail(KVE_EINVAL, "job %zu: spec is NULL", i);
    snprintf(value, sizeof value, "%zu", job->budget);
    const bool own = job->budget != KVE_EVAL_BUDGET_SPEC;
    kve_status st = kve_spec_with(job->spec, own ? "budget" : NULL, own ? value : NULL, spec,
                                  sizeof spec);
    if (st == KVE_OK && spec_reads_keys(spec) && key_dim == 0)
        return kve__fail(KVE_EINVAL, "job %zu (\"%.60s\"): the policy reads keys, but the trace "
                         "has none (a q/K trace has: qk:PATH)", i, job->spec);
    if (st == KVE_OK) {
        kve_rng rng;
        kve_rng_seed(&rng, o->seed);
        kve_bank_options bo = kve_bank_default_options();
        bo.allocator = a;
        bo.key_dim = key_dim;
        bo.share = o->share;
        bo.min_share = o->min_share;
        st = kve_bank_new_ex(spec, heads, &rng, &bo, &js->bank);
    }
    if (st != KVE_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", kve_last_error());
        return kve__fail(st, "job %zu (\"%.60s\"): %s", i, job->spec, why);
    }
    js->budget = kve_bank_budget(js->bank);
    js->reads_keys = (kve_bank_reads(js->bank) & KVE_READS_KEYS) != 0;
    if (!(js->acc = kve__alloc_zero(a, heads * sizeof *js->acc)))
        return kve__fail(KVE_ENOMEM, "out of memory for %zu heads", heads);
    for (size_t h = 0; h < heads; h++)
        js->acc[h].min_mass = 1.0;
    return KVE_OK;
}

/* The measures of head h of one job on row p_t, before the step, and the
 * renormalised attention it is about to receive (in attn, n entries; zeros
 * when the kept weights sum to 0). Returns whether the step informs it: an
 * empty kept set (an empty vector) or a kept sum above 0; otherwise a head
 * of its own is stepped with NULL, "no information". */
static bool measure_head(head_acc *acc, const kve_bank *b, size_t h, const double *row,
                         double total, size_t t, size_t k, size_t score_from,
                         const unsigned char *in_top, float *attn)
{
    size_t n = kve_bank_size(b, h);
    const int32_t *pos = kve_bank_positions(b, h);
    double kept = 0;
    size_t hits = 0, hits_k = 0;
    for (size_t i = 0; i < n; i++) {
        kept += row[pos[i]];
        hits += in_top[pos[i]] & IN_TOP32;
        hits_k += (in_top[pos[i]] & IN_TOPK) >> 1;
    }
    if (t > score_from) {
        double mass = (kept + row[t]) / total; /* at most 1: see the top of the file */
        acc->sum_mass += mass;
        acc->sum_recall += (double)hits / (double)(t < TOP_32 ? t : TOP_32);
        acc->sum_recall_k += (double)hits_k / (double)(t < k ? t : k);
        if (mass < acc->min_mass || acc->scored == 0)
            acc->min_mass = mass;
        acc->scored++;
    }
    for (size_t i = 0; i < n; i++)
        attn[i] = kept > 0 ? (float)(row[pos[i]] / kept) : 0.0f;
    return n == 0 || kept > 0;
}

/* One step of one job on rows p_t of its heads (rows[h * T ...]) and, on a
 * trace with keys, keys k_t (keys[h * d ...]): metrics, renormalised
 * attention, step, evict; the victims head after head into
 * victims (*n_victims in all). The timer brackets the bank's calls only.
 * Returns the bank's status (non-OK only on a broken invariant or KVE_ENOMEM
 * from a bank that grows). */
static kve_status run_step(job_state *js, size_t job, const double *rows, const double *totals,
                           const float *keys, size_t d, size_t T, size_t t, size_t k,
                           size_t score_after, const unsigned char *in_top, float *attn,
                           int32_t *victims, size_t *counts, size_t *n_victims)
{
    kve_bank *b = js->bank;
    if (!js->reads_keys)
        keys = NULL;
    const size_t heads = kve_bank_heads(b), share = kve_bank_share(b);
    const size_t score_from = score_after == KVE_EVAL_AFTER_BUDGET ? js->budget : score_after;
    kve_status st = KVE_OK;
    bool any = false;
    uint64_t t0;
    for (size_t h = 0; h < heads && st == KVE_OK; h++) {
        float *a = attn + h * T;
        bool info = measure_head(&js->acc[h], b, h, rows + h * T, totals[h], t, k, score_from,
                                 in_top + h * T, a);
        any = any || info;
        if (attn_hook)
            attn_hook(attn_hook_user, job, (int32_t)t, kve_bank_positions(b, h), info ? a : NULL,
                      kve_bank_size(b, h));
        if (!share) { /* a head of its own: exactly a one-head evaluation */
            t0 = now_ns();
            st = kve_bank_step_range(b, h, 1, (int32_t)t, info ? a : NULL, T, 1,
                                     KVE_REDUCE_MEAN, keys ? keys + h * d : NULL, d);
            js->ns += now_ns() - t0;
        }
    }
    t0 = now_ns();
    if (share && st == KVE_OK) /* a group is stepped whole */
        st = kve_bank_step_range(b, 0, heads, (int32_t)t, any ? attn : NULL, T, 1,
                                 KVE_REDUCE_MEAN, keys, d);
    if (st == KVE_OK)
        st = share ? kve_bank_evict_shared(b, 0, heads, share * js->budget, victims, T + 1,
                                           counts)
                   : kve_bank_evict(b, js->budget, victims, T + 1, counts);
    js->ns += now_ns() - t0;
    js->steps++;
    *n_victims = 0;
    for (size_t h = 0; h < heads && st == KVE_OK; h++) {
        if (t > score_from)
            js->acc[h].sum_kept += (double)kve_bank_size(b, h);
        memmove(victims + *n_victims, victims + h * (T + 1), counts[h] * sizeof *victims);
        *n_victims += counts[h];
    }
    return st;
}

kve_eval_options kve_eval_default_options(void)
{
    kve_eval_options o = {.allocator = NULL, .seed = 0, .topk = TOP_32, .on_step = NULL,
                          .user = NULL, .share = 0, .min_share = 0.2,
                          .score_after = KVE_EVAL_AFTER_BUDGET};
    return o;
}

/* result of one head's accumulators; r->spec etc. are the caller's. */
static void head_result(const head_acc *a, kve_eval_result *r)
{
    r->scored_steps = a->scored;
    if (a->scored) {
        double n = (double)a->scored;
        r->retained_mass = a->sum_mass / n;
        r->top32_recall = a->sum_recall / n;
        r->topk_recall = a->sum_recall_k / n;
        r->min_retained_mass = a->min_mass;
        r->mean_kept = a->sum_kept / n;
    } else {
        r->retained_mass = r->top32_recall = r->topk_recall = r->min_retained_mass =
            r->mean_kept = NAN;
    }
}

/* The buffers of one call (the table at the top of the file), each with the
 * size it is allocated and freed with. */
typedef struct buffers {
    double *rows;
    double *totals;
    float *attn;
    unsigned char *in_top;
    int32_t *victims;
    size_t *counts;
    kve__top_entry *heap_k;
    kve__top_entry *heap;
    size_t *n_top;
    float *keys;
    size_t bytes[10]; /* of each, in the order above */
} buffers;

static void **buffer_at(buffers *b, size_t i)
{
    void **p[] = {(void **)&b->rows,   (void **)&b->totals, (void **)&b->attn,
                  (void **)&b->in_top, (void **)&b->victims, (void **)&b->counts,
                  (void **)&b->heap_k, (void **)&b->heap,   (void **)&b->n_top,
                  (void **)&b->keys};
    return p[i];
}

/* Allocates every buffer of a call over H heads of T steps; false (nothing
 * left allocated) when one fails. A buffer of 0 bytes stays NULL. */
static bool alloc_buffers(const kve_allocator *a, buffers *b, size_t H, size_t T, size_t k,
                          size_t heap_cap, size_t key_dim)
{
    memset(b, 0, sizeof *b);
    const size_t bytes[10] = {
        H * T * sizeof *b->rows,         H * sizeof *b->totals,
        H * T * sizeof *b->attn,         H * T,
        H * (T + 1) * sizeof *b->victims, H * sizeof *b->counts,
        k == TOP_32 ? 0 : H * heap_cap * sizeof *b->heap_k,
        H * TOP_32 * sizeof *b->heap,    2 * H * sizeof *b->n_top,
        H * key_dim * sizeof *b->keys};
    for (size_t i = 0; i < 10; i++) {
        b->bytes[i] = bytes[i];
        if (bytes[i] && !(*buffer_at(b, i) = kve__alloc_zero(a, bytes[i])))
            return false;
    }
    return true;
}

static void free_buffers(const kve_allocator *a, buffers *b)
{
    for (size_t i = 0; i < 10; i++)
        kve__dealloc(a, *buffer_at(b, i), b->bytes[i]);
}

kve_status kve_eval(kve_trace *tr, size_t first, size_t count, const kve_eval_job *jobs,
                    size_t n_jobs, const kve_eval_options *options, kve_eval_result *results,
                    kve_eval_result *per_head)
{
    kve_status st = kve__check_core();
    if (st != KVE_OK)
        return st;
    kve_eval_options o = options ? *options : kve_eval_default_options();
    if (!tr)
        return kve__fail(KVE_EINVAL, "trace is NULL");
    if (!jobs)
        return kve__fail(KVE_EINVAL, "jobs is NULL");
    if (!results)
        return kve__fail(KVE_EINVAL, "results is NULL");
    if (n_jobs == 0)
        return kve__fail(KVE_EINVAL, "n_jobs is 0");
    if (o.topk == 0 || o.topk > KVE_MAX_BUDGET)
        return kve__fail(KVE_EINVAL, "topk %zu is out of range [1, %d]", o.topk, KVE_MAX_BUDGET);
    size_t heads = kve_trace_heads(tr), H = count;
    if (H == 0)
        return kve__fail(KVE_EINVAL, "count is 0: no head to evaluate");
    if (first >= heads)
        return kve__fail(KVE_EINVAL, "head %zu is out of range (the trace has %zu heads)", first,
                         heads);
    if (H > heads - first)
        return kve__fail(KVE_EINVAL, "heads %zu .. %zu are out of range (the trace has %zu heads)",
                         first, first + H - 1, heads);
    if (n_jobs > SIZE_MAX / sizeof(job_state))
        return kve__fail(KVE_EINVAL, "%zu jobs are more than memory can hold", n_jobs);
    size_t T = kve_trace_steps(tr);
    size_t k = o.topk;
    size_t key_dim = kve_trace_key_dim(tr);
    /* The top-k set of row t has min(k, t) < T members. */
    size_t heap_cap = k < T ? k : T;
    const kve_allocator alloc = kve__allocator(o.allocator);
    const kve_allocator *a = &alloc;

    job_state *js = kve__alloc_zero(a, n_jobs * sizeof *js);
    if (!js)
        return kve__fail(KVE_ENOMEM, "out of memory for %zu jobs", n_jobs);
    size_t built = 0;
    for (; built < n_jobs; built++)
        if ((st = build_job(&jobs[built], built, &o, a, H, key_dim, &js[built])) != KVE_OK)
            break;
    if (st != KVE_OK) {
        free_jobs(a, js, n_jobs, H);
        return st;
    }
    /* Per head: its row, its top sets, its attention; victims of every head
     * (up to T + 1 each: pages and shared budgets may take more than one). */
    buffers buf;
    if (!alloc_buffers(a, &buf, H, T, k, heap_cap, key_dim)) {
        st = kve__fail(KVE_ENOMEM, "out of memory for the evaluation buffers (T = %zu)", T);
        goto done;
    }
    double *rows = buf.rows, *totals = buf.totals;
    float *attn = buf.attn, *keys = buf.keys;
    unsigned char *in_top = buf.in_top;
    int32_t *victims = buf.victims;
    size_t *counts = buf.counts, *n_top = buf.n_top;
    kve__top_entry *heap_k = buf.heap_k, *heap = buf.heap;

    int stop = 0;
    for (size_t t = 0; t < T && !stop; t++) {
        for (size_t h = 0; h < H; h++) {
            double *row = rows + h * T;
            unsigned char *top = in_top + h * T;
            if ((st = kve_trace_row(tr, first + h, t, row, T)) != KVE_OK)
                goto done;
            if (keys &&
                (st = kve_trace_key(tr, first + h, t, keys + h * key_dim, key_dim)) != KVE_OK)
                goto done;
            double total = 0; /* the keys before t in order, then t: as the kept mass */
            for (size_t i = 0; i < t; i++)
                total += row[i];
            totals[h] = total + row[t];
            if (k == TOP_32) {
                top_k(row, t, TOP_32, heap + h * TOP_32, &n_top[h], top, IN_TOP32 | IN_TOPK);
            } else {
                top_k(row, t, TOP_32, heap + h * TOP_32, &n_top[h], top, IN_TOP32);
                top_k(row, t, k, heap_k + h * heap_cap, &n_top[H + h], top, IN_TOPK);
            }
        }
        for (size_t j = 0; j < n_jobs; j++) {
            size_t nv = 0;
            st = run_step(&js[j], j, rows, totals, keys, key_dim, T, t, k, o.score_after, in_top,
                          attn, victims, counts, &nv);
            if (st != KVE_OK) {
                char why[256];
                snprintf(why, sizeof why, "%s", kve_last_error());
                st = kve__fail(st, "job %zu (%s) at step %zu: %s", j, kve_bank_spec(js[j].bank),
                               t, why);
                goto done;
            }
            /* Once stopped, the step in progress is finished for every job
             * (so all results cover the same steps) without more calls. */
            if (o.on_step && !stop && o.on_step(o.user, j, (int32_t)t, victims, nv))
                stop = 1;
        }
        for (size_t h = 0; h < H; h++) {
            unsigned char *top = in_top + h * T;
            for (size_t j = 0; j < n_top[h]; j++)
                top[heap[h * TOP_32 + j].pos] = 0;
            for (size_t j = 0; k != TOP_32 && j < n_top[H + h]; j++)
                top[heap_k[h * heap_cap + j].pos] = 0;
        }
    }

    uint64_t overhead = timer_overhead_ns();
    for (size_t j = 0; j < n_jobs; j++) {
        const job_state *s = &js[j];
        kve_eval_result *r = &results[j];
        memset(r, 0, sizeof *r);
        snprintf(r->spec, sizeof r->spec, "%s", kve_bank_spec(s->bank));
        r->budget = s->budget;
        r->steps = s->steps;
        r->topk = k;
        /* Every head is scored on the same steps: the means of its heads'
         * means, the minimum of their minima. */
        head_result(&s->acc[0], r);
        for (size_t h = 1; h < H; h++) {
            kve_eval_result q;
            head_result(&s->acc[h], &q);
            r->retained_mass += q.retained_mass;
            r->top32_recall += q.top32_recall;
            r->topk_recall += q.topk_recall;
            r->mean_kept += q.mean_kept;
            r->min_retained_mass = fmin(r->min_retained_mass, q.min_retained_mass);
        }
        if (H > 1) {
            r->retained_mass /= (double)H;
            r->top32_recall /= (double)H;
            r->topk_recall /= (double)H;
            r->mean_kept /= (double)H;
        }
        uint64_t spent = overhead * s->steps;
        r->ns_per_step = s->steps && s->ns > spent ? (double)(s->ns - spent) / (double)s->steps
                                                   : 0.0;
        r->state_bytes = kve_bank_state_bytes(s->bank);
        for (size_t h = 0; per_head && h < H; h++) {
            kve_eval_result *q = &per_head[j * H + h];
            *q = *r;
            head_result(&s->acc[h], q);
            q->ns_per_step = r->ns_per_step / (double)H;
            q->state_bytes = r->state_bytes / H;
        }
    }
    st = KVE_OK;
done:
    free_buffers(a, &buf);
    free_jobs(a, js, n_jobs, H);
    return st;
}
