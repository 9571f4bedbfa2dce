/* SPDX-License-Identifier: MIT */
/*
 * cmd_sweep.c - `kvevict sweep`: a grid of parameter values and budgets
 * (grid.c), every point evaluated in one lockstep pass over the trace.
 * Every point's spec is checked before the trace is opened.
 */
#include "cli.h"

static const char sweep_usage[] =
    "usage: kvevict sweep --trace SRC --policy SPEC [--param KEY=V1,V2,...]...\n"
    "                     [--budget B1,B2,...] [--topk K]\n"
    "                     [--format text|md|csv|json | --json | --csv | --md] [-o FILE]\n"
    "                     [--normalize] [--seed N]\n"
    "\n"
    "Evaluates a grid of policies in one lockstep pass over the trace: every\n"
    "combination of the --param values (up to 8 --param options; the last varies\n"
    "fastest) at every budget (budgets outermost). One row per grid point.\n"
    "\n"
    "  --trace SRC           canonical, canonical:key=value,..., a .npy file, qk:FILE,\n"
    "                        or -\n"
    "  --policy SPEC         the base spec; each point sets its keys with kve_spec_with\n"
    "  --param KEY=V1,...    a parameter of the policy and its values\n"
    "  --budget B1,...       budgets (default: the spec's); not with --param budget=...\n"
    "  --topk K              recall over the K most-attended positions (default 32)\n"
    "  --format F            text (default), md, csv or json; --csv, --json, --md\n"
    "  --csv                 comma-separated, with a header row of snake_case keys\n"
    "  --json                JSON Lines: one object per grid point, with the keys of\n"
    "                        eval --json plus \"params\": {KEY: \"VALUE\", ...}\n"
    "  -o, --output FILE     write there instead of standard output (- for it)\n"
    "  --normalize           rescale each row of a .npy file to sum 1 instead of refusing\n"
    "  --seed N              seed of the policies' random numbers (default 0)\n"
    "\n"
    "Multi-head files report means over heads as eval does. Points at which no\n"
    "step is scored (budget >= steps - 1) show n/a (null), with a warning.\n";

static const opt_def sweep_own[] = {{"param", 0, OPT_VALUE | OPT_REPEAT}};
static const cli_spec sweep_spec = {
    .usage = sweep_usage,
    .shared = SO_TRACE | SO_POLICY | SO_BUDGETS | SO_TOPK | SO_SEED | SO_NORMALIZE | SO_FORMAT |
              SO_OUTPUT,
    .required = SO_TRACE | SO_POLICY,
    .own = sweep_own,
    .n_own = 1,
    .default_format = FMT_TEXT,
};

int cmd_sweep(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &sweep_spec, argc, argv);
    const opt_val *params = cli_own(&a, &sweep_spec, "param");
    grid g;
    grid_init(&g, a.policy);
    if (a.n_budgets)
        grid_set_budgets(&g, a.budgets, a.n_budgets);
    for (int p = 0; p < params->count; p++)
        grid_add_param(&g, "--param", params->v[p]);
    grid_check(&g);
    FILE *out = out_open(a.output);
    evalset es;
    evalset_init(&es);
    result_ctx c = {0};
    render_grid(NULL, &es, &g, &c, FMT_TEXT); /* collects every point */
    kve_trace *tr = open_trace(&a);
    evalset_run(&es, tr, &a, 0);
    result_ctx_init(&c, &a, tr);
    render_grid(out, &es, &g, &c, a.format);
    evalset_free(&es);
    kve_trace_free(tr);
    grid_free(&g);
    out_close(out);
    return 0;
}
