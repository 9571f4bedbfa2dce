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
 *   key      [d]            the key of position t (traces with keys only)
 *   jobs     [n_jobs]       per-job policy and accumulators
 * So memory is O(T + d + n_jobs) here plus O(budget) per policy.
 *
 * Keys: on a trace with keys (kve_trace_key_dim d > 0) every job's policy is
 * built with key dimension d, and the jobs whose policy reads keys get the
 * key of position t at step t (read once per step, shared by every job);
 * the others are stepped without it. On a trace without keys a job whose
 * policy reads keys is refused before anything runs.
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

typedef struct job_state {
    kve_policy *policy;
    int reads_keys; /* the policy reads keys: step it with the key of t */
    size_t budget;
    size_t steps; /* steps done */
    size_t scored;
    double sum_mass;
    double sum_recall;   /* top-32 */
    double sum_recall_k; /* top-k */
    double min_mass;
    uint64_t ns; /* timed policy work, overhead subtracted at the end */
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

static void free_jobs(job_state *js, size_t n)
{
    if (!js)
        return;
    for (size_t i = 0; i < n; i++)
        kve_policy_free(js[i].policy);
    kve__free(js);
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

/* Builds job i's policy with its budget override, for keys of key_dim
 * floats. The message of a refusal names the job and its spec. */
static kve_status build_job(const kve_eval_job *job, size_t i, uint64_t seed, size_t key_dim,
                            job_state *js)
{
    char spec[KVE_SPEC_MAX];
    char value[32];
    if (!job->spec)
        return kve__fail(KVE_EINVAL, "job %zu: spec is NULL", i);
    snprintf(value, sizeof value, "%zu", job->budget);
    kve_status st = kve_spec_with(job->spec, job->budget ? "budget" : NULL,
                                  job->budget ? value : NULL, spec, sizeof spec);
    if (st == KVE_OK && spec_reads_keys(spec) && key_dim == 0)
        return kve__fail(KVE_EINVAL, "job %zu (\"%.60s\"): the policy reads keys, but the trace "
                         "has none (a q/K trace has: qk:PATH)", i, job->spec);
    if (st == KVE_OK) {
        kve_rng rng;
        kve_rng_seed(&rng, seed);
        kve_policy_options o = kve_policy_default_options();
        o.key_dim = key_dim;
        st = kve_policy_new_ex(spec, &rng, &o, &js->policy);
    }
    if (st != KVE_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", kve_last_error());
        return kve__fail(st, "job %zu (\"%.60s\"): %s", i, job->spec, why);
    }
    js->budget = kve_policy_budget(js->policy);
    js->reads_keys = (kve_policy_reads(js->policy) & KVE_READS_KEYS) != 0;
    js->min_mass = 1.0;
    return KVE_OK;
}

/* One step of one job on row p_t: metrics, renormalised attention, step,
 * evict. Returns the policy's status (non-OK only on a broken invariant or
 * KVE_ENOMEM from a policy that grows). */
static kve_status run_step(job_state *js, size_t job, const double *row, const float *key,
                           size_t t, size_t k, const unsigned char *in_top, float *attn,
                           int32_t *victims, size_t victims_cap, size_t *n_victims)
{
    kve_policy *p = js->policy;
    size_t n = kve_policy_size(p);
    const int32_t *pos = kve_policy_positions(p);
    double kept = 0;
    size_t hits = 0, hits_k = 0;
    for (size_t i = 0; i < n; i++) {
        kept += row[pos[i]];
        hits += in_top[pos[i]] & IN_TOP32;
        hits_k += (in_top[pos[i]] & IN_TOPK) >> 1;
    }
    if (t > js->budget) {
        double mass = row[t] + kept;
        js->sum_mass += mass;
        js->sum_recall += (double)hits / (double)(t < TOP_32 ? t : TOP_32);
        js->sum_recall_k += (double)hits_k / (double)(t < k ? t : k);
        if (mass < js->min_mass || js->scored == 0)
            js->min_mass = mass;
        js->scored++;
    }
    const float *a = attn;
    if (n > 0 && kept > 0) {
        for (size_t i = 0; i < n; i++)
            attn[i] = (float)(row[pos[i]] / kept);
    } else if (n > 0) {
        a = NULL;
    }
    if (attn_hook)
        attn_hook(attn_hook_user, job, (int32_t)t, pos, a, n);
    uint64_t t0 = now_ns();
    kve_status st = kve_policy_step_keys(p, (int32_t)t, a, n, js->reads_keys ? key : NULL);
    if (st == KVE_OK)
        st = kve_policy_evict(p, js->budget, victims, victims_cap, n_victims);
    js->ns += now_ns() - t0;
    js->steps++;
    return st;
}

kve_eval_options kve_eval_default_options(void)
{
    kve_eval_options o = {.seed = 0, .topk = TOP_32, .on_step = NULL, .user = NULL};
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
    size_t heads = kve_trace_heads(tr);
    if (head >= heads)
        return kve__fail(KVE_EINVAL, "head %zu is out of range (the trace has %zu heads)", head,
                         heads);
    size_t T = kve_trace_steps(tr);
    size_t k = o.topk;
    size_t key_dim = kve_trace_key_dim(tr);
    /* The top-k set of row t has min(k, t) < T members. */
    size_t heap_cap = k < T ? k : T;

    job_state *js = kve__calloc(n_jobs, sizeof *js);
    if (!js)
        return kve__fail(KVE_ENOMEM, "out of memory for %zu jobs", n_jobs);
    kve_status st = KVE_OK;
    size_t built = 0;
    size_t max_budget = 0;
    for (; built < n_jobs; built++) {
        if ((st = build_job(&jobs[built], built, o.seed, key_dim, &js[built])) != KVE_OK)
            break;
        if (js[built].budget > max_budget)
            max_budget = js[built].budget;
    }
    if (st != KVE_OK) {
        free_jobs(js, built);
        return st;
    }
    size_t victims_cap = (max_budget < T ? max_budget : T) + 1;
    double *row = kve__malloc(T * sizeof *row);
    float *attn = kve__malloc(T * sizeof *attn);
    unsigned char *in_top = kve__calloc(T, 1);
    int32_t *victims = kve__malloc(victims_cap * sizeof *victims);
    kve__top_entry *heap_k = k == TOP_32 ? NULL : kve__malloc(heap_cap * sizeof *heap_k);
    float *key = key_dim ? kve__malloc(key_dim * sizeof *key) : NULL;
    if (!row || !attn || !in_top || !victims || (k != TOP_32 && !heap_k) || (key_dim && !key)) {
        st = kve__fail(KVE_ENOMEM, "out of memory for the evaluation buffers (T = %zu)", T);
        goto done;
    }

    kve__top_entry heap[TOP_32];
    int stop = 0;
    for (size_t t = 0; t < T && !stop; t++) {
        if ((st = kve_trace_row(tr, head, t, row)) != KVE_OK)
            goto done;
        if (key && (st = kve_trace_key(tr, head, t, key)) != KVE_OK)
            goto done;
        size_t n_top = 0, n_top_k = 0;
        if (k == TOP_32) {
            top_k(row, t, TOP_32, heap, &n_top, in_top, IN_TOP32 | IN_TOPK);
        } else {
            top_k(row, t, TOP_32, heap, &n_top, in_top, IN_TOP32);
            top_k(row, t, k, heap_k, &n_top_k, in_top, IN_TOPK);
        }
        for (size_t j = 0; j < n_jobs; j++) {
            size_t nv = 0;
            st = run_step(&js[j], j, row, key, t, k, in_top, attn, victims, victims_cap, &nv);
            if (st != KVE_OK) {
                char why[256];
                snprintf(why, sizeof why, "%s", kve_last_error());
                st = kve__fail(st, "job %zu (%s) at step %zu: %s", j,
                               kve_policy_spec(js[j].policy), t, why);
                goto done;
            }
            /* Once stopped, the step in progress is finished for every job
             * (so all results cover the same steps) without more calls. */
            if (o.on_step && !stop && o.on_step(o.user, j, (int32_t)t, victims, nv))
                stop = 1;
        }
        for (size_t j = 0; j < n_top; j++)
            in_top[heap[j].pos] = 0;
        for (size_t j = 0; j < n_top_k; j++)
            in_top[heap_k[j].pos] = 0;
    }

    uint64_t overhead = timer_overhead_ns();
    for (size_t j = 0; j < n_jobs; j++) {
        const job_state *s = &js[j];
        kve_eval_result *r = &results[j];
        memset(r, 0, sizeof *r);
        snprintf(r->spec, sizeof r->spec, "%s", kve_policy_spec(s->policy));
        r->budget = s->budget;
        r->steps = s->steps;
        r->scored_steps = s->scored;
        r->topk = k;
        if (s->scored) {
            r->retained_mass = s->sum_mass / (double)s->scored;
            r->top32_recall = s->sum_recall / (double)s->scored;
            r->topk_recall = s->sum_recall_k / (double)s->scored;
            r->min_retained_mass = s->min_mass;
        } else {
            r->retained_mass = r->top32_recall = r->topk_recall = r->min_retained_mass = NAN;
        }
        uint64_t spent = overhead * s->steps;
        r->ns_per_step = s->steps && s->ns > spent ? (double)(s->ns - spent) / (double)s->steps
                                                   : 0.0;
        r->state_bytes = kve_policy_state_bytes(s->policy);
    }
    st = KVE_OK;
done:
    kve__free(row);
    kve__free(attn);
    kve__free(in_top);
    kve__free(victims);
    kve__free(heap_k);
    kve__free(key);
    free_jobs(js, n_jobs);
    return st;
}
