/* SPDX-License-Identifier: MIT */
/*
 * cmd_eval.c - `kvevict eval`: one policy on every head of a trace, its
 * retained mass, top-k recall, minimum mass, ns/step and state bytes.
 *
 * Every argument is validated (the spec through kve_spec_with, numbers
 * strictly) before the trace is opened, so usage errors (exit 2) are found
 * before input errors (exit 1).
 */
#include "cli.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static const char eval_usage[] =
    "usage: kvevict eval --trace SRC --policy SPEC [--budget B] [--topk K] [--per-head]\n"
    "                    [--format text|md|csv|json | --json | --csv | --md] [-o FILE]\n"
    "                    [--normalize] [--seed N]\n"
    "\n"
    "Evaluates one policy on a trace and prints its retained mass, top-K recall,\n"
    "minimum retained mass, ns/step of policy work and state bytes. Means are over\n"
    "the scored steps t > budget; with none (budget >= steps - 1) the metrics are\n"
    "n/a (null in JSON) and a warning says why.\n"
    "\n"
    "  --trace SRC    canonical, canonical:key=value,... (seed, steps, ...), a .npy\n"
    "                 file of shape [T,T], [H,T,T] or [L,H,T,T], qk:FILE (queries\n"
    "                 and keys; the policies that read keys need one), or - (a\n"
    "                 .npy on standard input)\n"
    "  --policy SPEC  name[:key=value,...], e.g. h2o:recent_window=64\n"
    "  --budget B     evict down to B positions (default: the spec's budget), or\n"
    "                 P% of the trace's steps T: floor(P T / 100) positions\n"
    "  --topk K       recall over the K most-attended earlier positions (default 32;\n"
    "                 JSON and CSV add topk_recall and \"topk\": K beside top32_recall)\n"
    "  --per-head     also report every head (layer-major) of a multi-head file\n"
    "  --format F     text (default), md, csv or json; --json, --csv, --md for short\n"
    "  --json         one JSON object: policy, trace, budget, steps, scored_steps,\n"
    "                 heads, layers, seed, retained_mass, top32_recall,\n"
    "                 min_retained_mass, ns_per_step, state_bytes (and per_head)\n"
    "  -o, --output FILE  write there instead of standard output (- for it)\n"
    "  --normalize    rescale each row of a .npy file to sum 1 instead of refusing\n"
    "  --seed N       seed of the policies' random numbers (default 0)\n"
    "  --quiet        no progress line on stderr (drawn on a terminal after 2 s)\n"
    "\n"
    "A multi-head file evaluates each head independently: retained mass, recall\n"
    "and ns/step are means over heads, min mass the minimum, state bytes the\n"
    "largest.\n"
    "\n"
    "Budgets across heads and layers (docs/budgets.md) on an [L,H,T,T] file: the\n"
    "budget is the mean per head, the layers' heads run as one bank per layer;\n"
    "the row adds schedule, share, layer_budgets, mean_kept, score_after and\n"
    "total_state_bytes (state_bytes: its mean per head):\n"
    BUDGET_USAGE
    "                      (SRC: a trace of as many layers)\n"
    "  --score-after N     score every layer on steps t > N (default: the largest\n"
    "                      layer budget); any of these options selects this mode\n"
    "\n"
    "Exit status: 0 ok, 1 bad input, 2 bad usage.\n";

static const opt_def eval_own[] = {{"per-head", 0, 0}, BUDGET_OPTS, {"score-after", 0, OPT_VALUE}};
static const cli_spec eval_spec = {
    .usage = eval_usage,
    .shared = SO_TRACE | SO_POLICY | SO_BUDGET | SO_TOPK | SO_SEED | SO_NORMALIZE | SO_FORMAT |
              SO_OUTPUT | SO_QUIET,
    .required = SO_TRACE | SO_POLICY,
    CLI_OWN(eval_own),
    .default_format = FMT_TEXT,
};

static void text_metric(FILE *f, const char *label, double x, const char *fmt)
{
    fprintf(f, "%-19s", label);
    if (isfinite(x))
        fprintf(f, fmt, x);
    else
        fputs("n/a", f);
    fputc('\n', f);
}

int cmd_eval(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &eval_spec, argc, argv);
    int per_head = cli_own(&a, &eval_spec, "per-head")->count > 0;
    budget_args ba;
    budget_args_parse(&ba, &a, &eval_spec);
    const opt_val *sa = cli_own(&a, &eval_spec, "score-after");
    if (ba.given || sa->count) {
        ba.given = 1; /* the rows carry the budgets columns */
        size_t after = sa->count ? (size_t)parse_u64("--score-after", sa->v[0], 1, INT32_MAX) : 0;
        free(canon_spec("--policy", a.policy, a.budget)); /* a usage error before the trace */
        FILE *out = out_open(a.output);
        eval_budgets(out, &a, &ba, per_head, after);
        out_close(out);
        return 0;
    }
    char *spec = canon_spec("--policy", a.policy, a.budget);
    FILE *out = out_open(a.output);
    kve_trace *tr = open_trace_resolved(&a, &spec);

    evalset es;
    evalset_init(&es);
    size_t idx = evalset_index(&es, spec, 0);
    evalset_run(&es, tr, &a, per_head);
    const kve_eval_result *r = &es.res[idx];
    result_ctx c;
    result_ctx_init(&c, &a, tr);
    size_t heads = es.heads, layers = es.layers, per_layer = heads / (layers ? layers : 1);

    if (a.format == FMT_JSON) {
        json_result_begin(out, &c, r);
        fputs(", ", out);
        json_metrics(out, &c, r);
        if (per_head) {
            fprintf(out, ", \"per_head\": [");
            for (size_t h = 0; h < heads; h++) {
                fprintf(out, "%s{\"layer\": %zu, \"head\": %zu, ", h ? ", " : "",
                        h / per_layer, h % per_layer);
                json_metrics(out, &c, &es.per_head[h * es.n + idx]);
                fprintf(out, "}");
            }
            fprintf(out, "]");
        }
        fprintf(out, "}\n");
    } else if (a.format == FMT_TEXT) {
        char recall[48];
        snprintf(recall, sizeof recall, "top-%zu recall", c.topk);
        fprintf(out, "policy             %s\n", r->spec);
        fprintf(out, "trace              %s\n", c.trace);
        fprintf(out, "budget             %zu\n", r->budget);
        fprintf(out, "steps              %zu (%zu scored: t > budget)\n", r->steps,
                r->scored_steps);
        fprintf(out, "heads              %zu (layers: %zu)\n", heads, layers);
        text_metric(out, "retained mass", r->retained_mass, "%.6f");
        text_metric(out, recall, recall_of(&c, r), "%.6f");
        text_metric(out, "min retained mass", r->min_retained_mass, "%.6f");
        text_metric(out, "ns/step", r->ns_per_step, "%.1f");
        fprintf(out, "state bytes        %zu\n", r->state_bytes);
    }
    if (a.format != FMT_JSON && (a.format != FMT_TEXT || per_head)) {
        /* md and csv: one row for the whole trace, then (--per-head) one per
         * head; text: the per-head table under the listing. */
        int whole = a.format != FMT_TEXT;
        col cols[TABLE_MAXCOLS];
        size_t nc = 0;
        if (whole) {
            cols[nc++] = (col){"policy spec", KEY_POLICY, COL_ALL | COL_LEFT | COL_CODE};
            cols[nc++] = (col){"budget", KEY_BUDGET, COL_ALL};
        }
        if (per_head) {
            cols[nc++] = (col){"layer", "layer", COL_ALL};
            cols[nc++] = (col){"head", "head", COL_ALL};
        }
        nc = result_cols(cols, nc, &c);
        table t;
        table_init(&t, cols, nc);
        for (size_t h = 0; h <= (per_head ? heads : 0); h++) {
            if (!whole && h == 0)
                continue;
            const kve_eval_result *q = h == 0 ? r : &es.per_head[(h - 1) * es.n + idx];
            if (whole) {
                table_str(&t, r->spec);
                table_uint(&t, r->budget);
            }
            if (per_head) {
                if (h == 0) {
                    table_str(&t, "all");
                    table_str(&t, "all");
                } else {
                    table_uint(&t, (h - 1) / per_layer);
                    table_uint(&t, (h - 1) % per_layer);
                }
            }
            result_cells(&t, &c, q);
        }
        if (a.format == FMT_TEXT)
            fputc('\n', out);
        table_print(&t, out, a.format);
        table_free(&t);
    }
    evalset_free(&es);
    kve_trace_free(tr);
    free(spec);
    out_close(out);
    return 0;
}
