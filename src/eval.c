/* SPDX-License-Identifier: MIT */
/*
 * eval.c - the evaluation harness (kvevict.h, "Evaluation harness").
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
 *   row      [T]            the current row, weights over keys 0..t
 *   attn     [T]            one job's renormalised kept weights (float32)
 *   in_top   [T]            bit 0: key in the current row's top-32,
 *                           bit 1: key in its top-k
 *   heap     [min(k, T)]    the top-k selection (the top-32 one is on the stack)
 *   victims  [max budget+1] one job's victims of one step
 *   jobs     [n_jobs]       per-job policy and accumulators
 * So memory is O(T + n_jobs) here plus O(budget) per policy.
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
    size_t budget;  /* per head; a shared group of share heads gets share * budget */
    size_t steps;   /* steps done */
    uint64_t ns;    /* timed policy work, overhead subtracted at the end */
    head_acc *acc;  /* (heads) */
} job_state;

typedef struct top_entry {
    double w;
    int32_t pos;
} top_entry;

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

/* "a ranks below b" in the top-k order: smaller weight, or equal weight and
 * higher position (ties go to the lower position). */
static int ranks_below(const top_entry *a, const top_entry *b)
{
    return a->w < b->w || (a->w == b->w && a->pos > b->pos);
}

static void sift_down(top_entry *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_below(&h[l], &h[m]))
            m = l;
        if (r < n && ranks_below(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        top_entry tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
}

/* Marks in_top[i] |= bit for the top-min(k, t) keys of row over [0, t) and
 * stores them in heap[0 .. *n). A min-heap on ranks_below keeps the weakest
 * kept entry at the root; keys arrive in ascending position, so a newcomer
 * with a weight equal to the root's ranks below it and is skipped. */
static void top_k(const double *row, size_t t, size_t k, top_entry *heap, size_t *n,
                  unsigned char *in_top, unsigned char bit)
{
    size_t m = 0;
    for (size_t i = 0; i < t; i++) {
        top_entry e = {row[i], (int32_t)i};
        if (m < k) {
            heap[m] = e;
            m++;
            if (m == k)
                for (size_t j = k / 2; j-- > 0;)
                    sift_down(heap, m, j);
        } else if (e.w > heap[0].w) {
            heap[0] = e;
            sift_down(heap, m, 0);
        }
    }
    for (size_t j = 0; j < m; j++)
        in_top[heap[j].pos] |= bit;
    *n = m;
}

static void free_jobs(job_state *js, size_t n)
{
    if (!js)
        return;
    for (size_t i = 0; i < n; i++) {
        kve_bank_free(js[i].bank);
        kve__free(js[i].acc);
    }
    kve__free(js);
}

/* Builds job i's bank with its budget override. The message of a refusal
 * names the job and its spec. */
static kve_status build_job(const kve_eval_job *job, size_t i, const kve_eval_options *o,
                            size_t heads, job_state *js)
{
    char spec[KVE_SPEC_MAX];
    char value[32];
    if (!job->spec)
        return kve__fail(KVE_EINVAL, "job %zu: spec is NULL", i);
    snprintf(value, sizeof value, "%zu", job->budget);
    kve_status st = kve_spec_with(job->spec, job->budget ? "budget" : NULL,
                                  job->budget ? value : NULL, spec, sizeof spec);
    if (st == KVE_OK) {
        kve_rng rng;
        kve_rng_seed(&rng, o->seed);
        st = kve_bank_new_ex(spec, heads, &o->bank, &rng, &js->bank);
    }
    if (st != KVE_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", kve_last_error());
        return kve__fail(st, "job %zu (\"%.60s\"): %s", i, job->spec, why);
    }
    js->budget = kve_bank_budget(js->bank);
    if (!(js->acc = kve__calloc(heads, sizeof *js->acc)))
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
static bool measure_head(head_acc *acc, const kve_bank *b, size_t h, const double *row, size_t t,
                         size_t k, size_t score_from, const unsigned char *in_top, float *attn)
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
        double mass = row[t] + kept;
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

/* One step of one job on rows p_t of its heads (rows[h * T ...]): metrics,
 * renormalised attention, step, evict; the victims head after head into
 * victims (*n_victims in all). The timer brackets the bank's calls only.
 * Returns the bank's status (non-OK only on a broken invariant or KVE_ENOMEM
 * from a bank that grows). */
static kve_status run_step(job_state *js, size_t job, const double *rows, size_t T, size_t t,
                           size_t k, size_t score_after, const unsigned char *in_top, float *attn,
                           int32_t *victims, size_t *counts, size_t *n_victims)
{
    kve_bank *b = js->bank;
    const size_t heads = kve_bank_heads(b), share = kve_bank_share(b);
    const size_t score_from = score_after ? score_after : js->budget;
    kve_status st = KVE_OK;
    bool any = false;
    uint64_t t0;
    for (size_t h = 0; h < heads && st == KVE_OK; h++) {
        float *a = attn + h * T;
        bool info = measure_head(&js->acc[h], b, h, rows + h * T, t, k, score_from,
                                 in_top + h * T, a);
        any = any || info;
        if (attn_hook)
            attn_hook(attn_hook_user, job, (int32_t)t, kve_bank_positions(b, h), info ? a : NULL,
                      kve_bank_size(b, h));
        if (!share) { /* a head of its own: exactly a one-head evaluation */
            t0 = now_ns();
            st = kve_bank_step_range(b, h, 1, (int32_t)t, info ? a : NULL, T, 1,
                                     KVE_REDUCE_MEAN);
            js->ns += now_ns() - t0;
        }
    }
    t0 = now_ns();
    if (share && st == KVE_OK) /* a group is stepped whole */
        st = kve_bank_step_range(b, 0, heads, (int32_t)t, any ? attn : NULL, T, 1,
                                 KVE_REDUCE_MEAN);
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
    kve_eval_options o = {.seed = 0, .topk = TOP_32, .on_step = NULL, .user = NULL,
                          .heads = 1, .bank = kve_bank_default_options(), .score_after = 0,
                          .per_head = NULL};
    return o;
}

kve_status kve_eval(kve_trace *tr, size_t head, const kve_eval_job *jobs, size_t n_jobs,
                    uint64_t seed, kve_eval_step_fn on_step, void *user,
                    kve_eval_result *results)
{
    kve_eval_options o = kve_eval_default_options();
    o.seed = seed;
    o.on_step = on_step;
    o.user = user;
    return kve_eval_ex(tr, head, jobs, n_jobs, &o, results);
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

kve_status kve_eval_ex(kve_trace *tr, size_t head, const kve_eval_job *jobs, size_t n_jobs,
                       const kve_eval_options *options, kve_eval_result *results)
{
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
    size_t heads = kve_trace_heads(tr), H = o.heads ? o.heads : 1;
    if (head >= heads)
        return kve__fail(KVE_EINVAL, "head %zu is out of range (the trace has %zu heads)", head,
                         heads);
    if (H > heads - head)
        return kve__fail(KVE_EINVAL, "heads %zu .. %zu are out of range (the trace has %zu heads)",
                         head, head + H - 1, heads);
    size_t T = kve_trace_steps(tr);
    size_t k = o.topk;
    /* The top-k set of row t has min(k, t) < T members. */
    size_t heap_cap = k < T ? k : T;

    job_state *js = kve__calloc(n_jobs, sizeof *js);
    if (!js)
        return kve__fail(KVE_ENOMEM, "out of memory for %zu jobs", n_jobs);
    kve_status st = KVE_OK;
    size_t built = 0;
    for (; built < n_jobs; built++)
        if ((st = build_job(&jobs[built], built, &o, H, &js[built])) != KVE_OK)
            break;
    if (st != KVE_OK) {
        free_jobs(js, built + 1);
        return st;
    }
    /* Per head: its row, its top sets, its attention; victims of every head
     * (up to T + 1 each: pages and shared budgets may take more than one). */
    double *rows = kve__malloc(H * T * sizeof *rows);
    float *attn = kve__malloc(H * T * sizeof *attn);
    unsigned char *in_top = kve__calloc(H * T, 1);
    int32_t *victims = kve__malloc(H * (T + 1) * sizeof *victims);
    size_t *counts = kve__malloc(H * sizeof *counts);
    top_entry *heap_k = k == TOP_32 ? NULL : kve__malloc(H * heap_cap * sizeof *heap_k);
    top_entry *heap = kve__malloc(H * TOP_32 * sizeof *heap);
    size_t *n_top = kve__calloc(2 * H, sizeof *n_top); /* top-32, top-k counts per head */
    if (!rows || !attn || !in_top || !victims || !counts || (k != TOP_32 && !heap_k) || !heap ||
        !n_top) {
        st = kve__fail(KVE_ENOMEM, "out of memory for the evaluation buffers (T = %zu)", T);
        goto done;
    }

    int stop = 0;
    for (size_t t = 0; t < T && !stop; t++) {
        for (size_t h = 0; h < H; h++) {
            double *row = rows + h * T;
            unsigned char *top = in_top + h * T;
            if ((st = kve_trace_row(tr, head + h, t, row)) != KVE_OK)
                goto done;
            if (k == TOP_32) {
                top_k(row, t, TOP_32, heap + h * TOP_32, &n_top[h], top, IN_TOP32 | IN_TOPK);
            } else {
                top_k(row, t, TOP_32, heap + h * TOP_32, &n_top[h], top, IN_TOP32);
                top_k(row, t, k, heap_k + h * heap_cap, &n_top[H + h], top, IN_TOPK);
            }
        }
        for (size_t j = 0; j < n_jobs; j++) {
            size_t nv = 0;
            st = run_step(&js[j], j, rows, T, t, k, o.score_after, in_top, attn, victims, counts,
                          &nv);
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
        for (size_t h = 0; o.per_head && h < H; h++) {
            kve_eval_result *q = &o.per_head[j * H + h];
            *q = *r;
            head_result(&s->acc[h], q);
            q->ns_per_step = r->ns_per_step / (double)H;
            q->state_bytes = r->state_bytes / H;
        }
    }
    st = KVE_OK;
done:
    kve__free(rows);
    kve__free(attn);
    kve__free(in_top);
    kve__free(victims);
    kve__free(counts);
    kve__free(heap_k);
    kve__free(heap);
    kve__free(n_top);
    free_jobs(js, n_jobs);
    return st;
}
