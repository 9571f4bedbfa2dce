/* SPDX-License-Identifier: MIT */
/*
 * cmd_sweep.c - `kvevict sweep`: a grid of parameter values and budgets
 * (grid.c), every point evaluated in one lockstep pass over the trace.
 * Every point's spec is checked before the trace is opened. With --shard
 * I/N only the points p with p % N == I are evaluated, each written as a
 * shard line (shard.c) for `kvevict merge`.
 */
#include "cli.h"

#include <stdlib.h>

static const char sweep_usage[] =
    "usage: kvevict sweep --trace SRC --policy SPEC [--param KEY=V1,V2,...]...\n"
    "                     [--budget B1,B2,...] [--topk K]\n"
    "                     [--format text|md|csv|json | --json | --csv | --md] [-o FILE]\n"
    "                     [--normalize] [--seed N] [--shard I/N]\n"
    "\n"
    "Evaluates a grid of policies in one lockstep pass over the trace: every\n"
    "combination of the --param values (up to 8 --param options; the last varies\n"
    "fastest) at every budget (budgets outermost). One row per grid point.\n"
    "\n"
    "  --trace SRC           canonical, canonical:key=value,..., a .npy file, qk:FILE,\n"
    "                        or -\n"
    "  --policy SPEC         the base spec; each point sets its keys with kve_spec_with\n"
    "  --param KEY=V1,...    a parameter of the policy and its values\n"
    "  --budget B1,...       budgets (default: the spec's); not with --param budget=...;\n"
    "                        each a count or P% of the trace's steps T (floor(P T / 100))\n"
    "  --topk K              recall over the K most-attended positions (default 32)\n"
    "  --format F            text (default), md, csv or json; --csv, --json, --md\n"
    "  --csv                 comma-separated, with a header row of snake_case keys\n"
    "  --json                JSON Lines: one object per grid point, with the keys of\n"
    "                        eval --json plus \"params\": {KEY: \"VALUE\", ...}\n"
    "  -o, --output FILE     write there instead of standard output (- for it)\n"
    "  --normalize           rescale each row of a .npy file to sum 1 instead of refusing\n"
    "  --seed N              seed of the policies' random numbers (default 0)\n"
    "  --quiet               no progress line on stderr (drawn on a terminal after 2 s)\n"
    "  --shard I/N           run shard I of N (0 <= I < N): the points p with\n"
    "                        p % N == I, as JSON Lines carrying each whole job;\n"
    "                        `kvevict merge` combines the N files into what the\n"
    "                        unsharded run prints (see docs/scale-out.md)\n"
    "\n"
    "Multi-head files report means over heads as eval does. Points at which no\n"
    "step is scored (budget >= steps - 1) show n/a (null), with a warning.\n";

static const opt_def sweep_own[] = {{"param", 0, OPT_VALUE | OPT_REPEAT},
                                    {"shard", 0, OPT_VALUE}};
static const cli_spec sweep_spec = {
    .usage = sweep_usage,
    .shared = SO_TRACE | SO_POLICY | SO_BUDGETS | SO_TOPK | SO_SEED | SO_NORMALIZE | SO_FORMAT |
              SO_OUTPUT | SO_QUIET,
    .required = SO_TRACE | SO_POLICY,
    CLI_OWN(sweep_own),
    .default_format = FMT_TEXT,
};

/* The points of shard `sh`, evaluated and written as shard lines; `tr` the
 * trace when it is open already, else NULL. */
static void run_shard(const cli_args *a, const grid *g, const shard *sh, const opt_val *params,
                      kve_trace *tr)
{
    size_t n = grid_points(g);
    shard_check(sh, n);
    char *run = shard_run("sweep", a, a->trace, 0, a->policy, params);
    FILE *out = out_open(a->output);
    evalset es;
    evalset_init(&es);
    for (size_t i = 0; i < n; i++)
        if (shard_has(sh, i)) {
            char *spec = grid_spec(g, i);
            evalset_index(&es, spec, 0);
            free(spec);
        }
    if (!tr)
        tr = open_trace(a);
    evalset_run(&es, tr, a, 0);
    result_ctx c;
    result_ctx_init(&c, a, tr);
    for (size_t i = 0; i < n; i++)
        if (shard_has(sh, i)) {
            char *spec = grid_spec(g, i);
            shard_line(out, sh, i, n, run, &c, evalset_get(&es, spec, 0), g);
            free(spec);
        }
    evalset_free(&es);
    kve_trace_free(tr);
    free(run);
    out_close(out);
}

int cmd_sweep(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &sweep_spec, argc, argv);
    const opt_val *params = cli_own(&a, &sweep_spec, "param");
    const opt_val *shard_opt = cli_own(&a, &sweep_spec, "shard");
    shard sh = {0, 0};
    if (shard_opt->count) {
        shard_parse(&sh, shard_opt->v[0]);
        if (a.format != FMT_TEXT && a.format != FMT_JSON)
            die_usage("--shard writes JSON Lines for kvevict merge; give the format to merge");
    }
    kve_trace *tr = NULL;
    if (a.budgets_relative) { /* --budget P%: of the trace's steps, known once it is open */
        tr = open_trace(&a);
        cli_resolve_budgets(&a, kve_trace_steps(tr), "the trace's steps");
    }
    grid g;
    grid_init(&g, a.policy);
    if (a.n_budgets)
        grid_set_budgets(&g, a.budgets, a.n_budgets);
    for (int p = 0; p < params->count; p++)
        grid_add_param(&g, "--param", params->v[p]);
    grid_check(&g);
    if (sh.count) {
        run_shard(&a, &g, &sh, params, tr);
        grid_free(&g);
        return 0;
    }
    FILE *out = out_open(a.output);
    evalset es;
    evalset_init(&es);
    result_ctx c = {0};
    render_grid(NULL, &es, &g, &c, FMT_TEXT); /* collects every point */
    if (!tr)
        tr = open_trace(&a);
    evalset_run(&es, tr, &a, 0);
    result_ctx_init(&c, &a, tr);
    render_grid(out, &es, &g, &c, a.format);
    evalset_free(&es);
    kve_trace_free(tr);
    grid_free(&g);
    out_close(out);
    return 0;
}
