/* SPDX-License-Identifier: MIT */
/*
 * cmd_replay.c - `kvevict replay`: one policy over one head of a trace, its
 * victims step by step. Rows are printed as they come (a replay of a long
 * trace is never held in memory); JSON Lines is the default format.
 */
#include "cli.h"

#include <stdlib.h>

static const char replay_usage[] =
    "usage: kvevict replay --trace SRC --policy SPEC [--budget B] [--head N]\n"
    "                      [--format json|text|md|csv | --json | --csv | --md] [-o FILE]\n"
    "                      [--normalize] [--seed N]\n"
    "\n"
    "Runs one policy over a trace and prints one row per step, in step order. The\n"
    "default (json) is one JSON object per line:\n"
    "  {\"pos\": t, \"victims\": [ascending positions evicted after step t], \"size\": n}\n"
    "where size is the number of kept positions after the eviction; csv, md and\n"
    "text print the same columns pos, size, victims (space-separated).\n"
    "\n"
    "  --trace SRC    canonical, canonical:key=value,..., a .npy file, qk:FILE, or -\n"
    "                 (stdin)\n"
    "  --policy SPEC  name[:key=value,...]\n"
    "  --budget B     evict down to B positions (default: the spec's budget), or\n"
    "                 P% of the trace's steps T: floor(P T / 100) positions\n"
    "  --head N       head of a multi-head file, layer-major (default 0)\n"
    "  --format F     json (default), text, md or csv\n"
    "  -o, --output FILE  write there instead of standard output (- for it)\n"
    "  --normalize    rescale each row of a .npy file to sum 1 instead of refusing\n"
    "  --seed N       seed of the policy's random numbers (default 0)\n"
    "  --quiet        no progress line on stderr (drawn on a terminal after 2 s)\n";

static const cli_spec replay_spec = {
    .usage = replay_usage,
    .shared = SO_TRACE | SO_POLICY | SO_BUDGET | SO_HEAD | SO_SEED | SO_NORMALIZE | SO_FORMAT |
              SO_OUTPUT | SO_QUIET,
    .required = SO_TRACE | SO_POLICY,
    .default_format = FMT_JSON,
};

typedef struct replay_ctx {
    FILE *out;
    tfmt fmt;
    size_t size;
    progress pr;
} replay_ctx;

static int replay_step(void *user, size_t job, int32_t pos, const int32_t *victims, size_t n)
{
    replay_ctx *c = user;
    FILE *f = c->out;
    (void)job;
    c->size = c->size + 1 - n;
    switch (c->fmt) {
    case FMT_JSON:
        fprintf(f, "{\"pos\": %ld, \"victims\": [", (long)pos);
        for (size_t i = 0; i < n; i++)
            fprintf(f, i ? ", %ld" : "%ld", (long)victims[i]);
        fprintf(f, "], \"size\": %zu}\n", c->size);
        break;
    case FMT_CSV:
    case FMT_TEXT:
    case FMT_MD:
        fprintf(f, c->fmt == FMT_MD ? "| %ld | %zu | " : c->fmt == FMT_CSV ? "%ld,%zu," : "%ld  %zu  ",
                (long)pos, c->size);
        for (size_t i = 0; i < n; i++)
            fprintf(f, i ? " %ld" : "%ld", (long)victims[i]);
        fputs(c->fmt == FMT_MD ? " |\n" : "\n", f);
        break;
    }
    progress_update(&c->pr, (uint64_t)pos + 1);
    return ferror(f) ? 1 : 0;
}

int cmd_replay(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &replay_spec, argc, argv);
    char *spec = canon_spec("--policy", a.policy, a.budget);
    FILE *out = out_open(a.output);
    kve_trace *tr = open_trace_resolved(&a, &spec);
    size_t nh = kve_trace_heads(tr);
    if (a.head >= nh) {
        kve_trace_free(tr);
        free(spec);
        die_usage("--head: %zu is out of range: the trace has %zu head%s", a.head, nh,
                  nh == 1 ? "" : "s");
    }
    if (a.format == FMT_CSV)
        fputs("pos,size,victims\n", out);
    else if (a.format == FMT_MD)
        fputs("| pos | size | victims |\n| --: | ---: | --- |\n", out);
    else if (a.format == FMT_TEXT)
        fputs("pos  size  victims\n", out);
    kve_eval_job job = {spec, KVE_EVAL_BUDGET_SPEC};
    kve_eval_result res;
    replay_ctx ctx = {out, a.format, 0, {0}};
    kve_eval_options o = kve_eval_default_options();
    o.seed = a.seed;
    o.on_step = replay_step;
    o.user = &ctx;
    progress_begin(&ctx.pr, "step", kve_trace_steps(tr), 0, 1);
    kve_status s = kve_eval(tr, a.head, 1, &job, 1, &o, &res, NULL);
    progress_end(&ctx.pr);
    kve_trace_free(tr);
    free(spec);
    if (s != KVE_OK)
        die_status(s, "replay");
    out_close(out);
    return 0;
}
