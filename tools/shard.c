/* SPDX-License-Identifier: MIT */
/*
 * shard.c - one grid split across processes or machines (`sweep --shard`,
 * `bench --shard`), the writing half; cmd_merge.c reads the shards back.
 *
 * A grid's jobs are enumerated in a fixed order (sweep: its points, budgets
 * outermost and the last --param fastest; bench: the report's specs in the
 * order the report first uses them). Shard I of N runs the jobs j with
 * j % N == I: every N-th job, so shards of a grid ordered by budget get
 * similar work. Each job is one JSON line carrying everything merge needs
 * and checks: the run (what the command line asked for, so lines of another
 * run are refused), the shard, the job's index and the grid's size, and the
 * job's result with every field of kve_eval_result at full precision
 * (%.17g, which reads back to the same double). Results do not depend on
 * the sharding: the harness gives every job the same seed (--seed), so job
 * j's figures are the same whichever jobs run beside it, in any shard.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The largest shard count: a grid has at most GRID_MAX_POINTS jobs. */
enum { SHARD_MAX = GRID_MAX_POINTS };

void shard_parse(shard *s, const char *arg)
{
    const char *slash = strchr(arg, '/');
    if (!slash || slash == arg || slash[1] == '\0')
        die_usage("--shard: '%s' is not I/N (shard I of N, 0 <= I < N), e.g. 0/4", arg);
    char index[32];
    size_t len = (size_t)(slash - arg);
    if (len >= sizeof index)
        die_usage("--shard: '%s': the index is too large", arg);
    memcpy(index, arg, len);
    index[len] = '\0';
    s->count = (size_t)parse_u64("--shard (the count N of I/N)", slash + 1, 1, SHARD_MAX);
    s->index = (size_t)parse_u64("--shard (the index I of I/N)", index, 0, SHARD_MAX);
    if (s->index >= s->count)
        die_usage("--shard %s: the index must be below the count (shards are numbered 0 to %zu)",
                  arg, s->count - 1);
}

void shard_check(const shard *s, size_t jobs)
{
    if (s->count > jobs)
        die_usage("--shard %zu/%zu: the grid has %zu job%s, so at most %zu shards", s->index,
                  s->count, jobs, jobs == 1 ? "" : "s", jobs);
}

int shard_has(const shard *s, size_t job)
{
    return s->count == 0 || job % s->count == s->index;
}

char *shard_run(const char *command, const cli_args *a, const char *trace, size_t key_dim,
                const char *policy,
                const opt_val *params)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        die_input("out of memory: %s", strerror(errno));
    fputs("{\"command\": ", f);
    json_string(f, command);
    fputs(", \"trace\": ", f);
    json_string(f, trace);
    if (policy) {
        fputs(", \"policy\": ", f);
        json_string(f, policy);
        fputs(", \"param\": [", f);
        for (int p = 0; params && p < params->count; p++) {
            fputs(p ? ", " : "", f);
            json_string(f, params->v[p]);
        }
        fputc(']', f);
    }
    fputs(", \"budget\": [", f);
    for (size_t b = 0; b < a->n_budgets; b++)
        fprintf(f, "%s%zu", b ? ", " : "", a->budgets[b]);
    fprintf(f, "], \"seed\": %llu, \"topk\": ", (unsigned long long)a->seed);
    if (a->topk_given)
        fprintf(f, "%zu", a->topk);
    else
        fputs("null", f);
    fprintf(f, ", \"normalize\": %s", a->trace_flags & KVE_TRACE_NORMALIZE ? "true" : "false");
    if (strcmp(command, "bench") == 0)
        fprintf(f, ", \"key_dim\": %zu", key_dim);
    fputc('}', f);
    if (fclose(f) != 0)
        die_input("out of memory: %s", strerror(errno));
    return text;
}

void shard_line(FILE *f, const shard *s, size_t job, size_t jobs, const char *run,
                const result_ctx *c, const kve_eval_result *r, const grid *g)
{
    result_ctx all = *c;
    all.topk_given = 1; /* a shard line always says its k */
    /* the unsharded row's keys, from the same writers, then the shard's */
    json_result_begin(f, &all, r);
    if (g) {
        fputs(", ", f);
        json_params(f, g, job);
    }
    fputs(", ", f);
    json_metrics(f, c, r); /* top32_recall, and topk_recall when the run gave --topk */
    fprintf(f, ", \"shard\": \"%zu/%zu\", \"job\": %zu, \"jobs\": %zu, \"run\": %s}\n", s->index,
            s->count, job, jobs, run);
}
