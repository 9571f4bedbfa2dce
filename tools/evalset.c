/* SPDX-License-Identifier: MIT */
/*
 * evalset.c - a set of distinct canonical policy specs evaluated together:
 * one kve_eval call per head runs every spec in lockstep over one pass of
 * the trace. Specs are deduplicated by their canonical text (budget
 * included), so renderers that ask for the same policy twice share a
 * result. Lookup is linear: sets hold at most a few hundred specs.
 *
 * Progress: while a run lasts over two seconds and stderr is a terminal,
 * a "\r"-updated line shows the head and step; it is erased at the end.
 * A budget at which no step is scored (budget >= T - 1) gets one warning:
 * its metrics are NaN, printed null or n/a.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const kve_eval_result zero_result;

void evalset_init(evalset *es)
{
    memset(es, 0, sizeof *es);
    es->collecting = 1;
}

void evalset_free(evalset *es)
{
    for (size_t i = 0; i < es->n; i++)
        free(es->spec[i]);
    free(es->spec);
    free(es->res);
    free(es->per_head);
    memset(es, 0, sizeof *es);
}

size_t evalset_index(evalset *es, const char *spec, size_t budget)
{
    /* a budget the user gave that a policy's defaults do not fit: the
     * option named, the policy once (by the library's message) */
    char what[48];
    snprintf(what, sizeof what, "--budget %zu", budget);
    char *c = canon_spec(budget ? what : spec, spec, budget);
    for (size_t i = 0; i < es->n; i++) {
        if (strcmp(es->spec[i], c) == 0) {
            free(c);
            return i;
        }
    }
    if (!es->collecting) {
        /* A renderer asked for something it did not ask for while
         * collecting: a bug in the tool, reported rather than hidden. */
        free(c);
        die_input("internal error: '%s' was not evaluated", spec);
    }
    if (es->n == es->cap) {
        es->cap = es->cap ? 2 * es->cap : 32;
        es->spec = xrealloc(es->spec, es->cap * sizeof *es->spec);
    }
    es->spec[es->n] = c;
    return es->n++;
}

int evalset_runs(const evalset *es, size_t type)
{
    unsigned reads = kve_policy_type_reads(type);
    if (reads & (KVE_READS_QUERIES | KVE_READS_VALUES))
        return 0; /* no trace gives queries and values to the tables yet */
    return es->key_dim || !(reads & KVE_READS_KEYS);
}

const kve_eval_result *evalset_get(evalset *es, const char *spec, size_t budget)
{
    size_t i = evalset_index(es, spec, budget);
    return es->collecting ? &zero_result : &es->res[i];
}

static int on_step(void *user, size_t job, int32_t pos, const int32_t *victims, size_t n_victims)
{
    (void)victims;
    (void)n_victims;
    if (job == 0)
        progress_update(user, (uint64_t)pos + 1);
    return 0;
}

void evalset_warn_unscored(const evalset *es, size_t steps)
{
    size_t warned[CLI_MAX_BUDGETS];
    size_t n_warned = 0;
    for (size_t i = 0; i < es->n; i++) {
        const kve_eval_result *r = &es->res[i];
        if (r->scored_steps != 0 || r->steps < steps)
            continue;
        size_t w = 0;
        while (w < n_warned && warned[w] != r->budget)
            w++;
        if (w < n_warned)
            continue;
        if (n_warned < CLI_MAX_BUDGETS)
            warned[n_warned++] = r->budget;
        warn("no step is scored at budget %zu: the trace has %zu steps and a step t counts "
             "only when t > budget; metrics at this budget are n/a",
             r->budget, steps);
    }
}

void evalset_run(evalset *es, kve_trace *tr, const cli_args *a, int keep_heads)
{
    size_t heads = kve_trace_heads(tr);
    es->heads = heads;
    es->layers = kve_trace_layers(tr);
    es->collecting = 0;
    if (es->n == 0)
        return;
    kve_eval_job *jobs = xcalloc(es->n, sizeof *jobs);
    for (size_t i = 0; i < es->n; i++)
        jobs[i].spec = es->spec[i];
    es->res = xcalloc(es->n, sizeof *es->res);
    kve_eval_result *tmp = xcalloc(es->n, sizeof *tmp);
    if (keep_heads)
        es->per_head = xcalloc(heads * es->n, sizeof *es->per_head);
    progress pr;
    kve_eval_options o = kve_eval_default_options();
    o.seed = a->seed;
    o.topk = a->topk;
    o.on_step = on_step;
    o.user = &pr;
    if (es->quiet) {
        o.on_step = NULL;
        o.user = NULL;
    }
    for (size_t h = 0; h < heads; h++) {
        if (!es->quiet)
            progress_begin(&pr, "step", kve_trace_steps(tr), h, heads);
        kve_status s = kve_eval(tr, h, 1, jobs, es->n, &o, tmp, NULL);
        if (!es->quiet)
            progress_end(&pr);
        if (s != KVE_OK) {
            free(jobs);
            free(tmp);
            die_status(s, "evaluation");
        }
        if (keep_heads)
            memcpy(es->per_head + h * es->n, tmp, es->n * sizeof *tmp);
        for (size_t i = 0; i < es->n; i++) {
            kve_eval_result *r = &es->res[i];
            if (h == 0) {
                *r = tmp[i];
                continue;
            }
            r->retained_mass += tmp[i].retained_mass;
            r->top32_recall += tmp[i].top32_recall;
            r->topk_recall += tmp[i].topk_recall;
            r->ns_per_step += tmp[i].ns_per_step;
            if (tmp[i].min_retained_mass < r->min_retained_mass)
                r->min_retained_mass = tmp[i].min_retained_mass;
            if (tmp[i].state_bytes > r->state_bytes)
                r->state_bytes = tmp[i].state_bytes;
        }
    }
    if (heads > 1) {
        for (size_t i = 0; i < es->n; i++) {
            es->res[i].retained_mass /= (double)heads;
            es->res[i].top32_recall /= (double)heads;
            es->res[i].topk_recall /= (double)heads;
            es->res[i].ns_per_step /= (double)heads;
        }
    }
    free(jobs);
    free(tmp);
    if (!es->quiet)
        evalset_warn_unscored(es, kve_trace_steps(tr));
}
