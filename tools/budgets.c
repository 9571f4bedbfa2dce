/* SPDX-License-Identifier: MIT */
/*
 * budgets.c - the command line of docs/budgets.md: one budget shared by a
 * layer's KV heads (--share-heads, --min-share) and one total split over the
 * layers (--schedule uniform|pyramid|attention, --beta, --calibration),
 * for `kvevict eval` on traces and the measuring `kvevict lm` commands on
 * the model.
 *
 * On a trace of L layers (an [L, H, T, T] .npy from `kvevict lm dump`), the
 * budget is the mean per head: the total L * budget is split over the
 * layers by kve_layer_budgets (floor: the smallest budget the spec accepts,
 * kve_spec_min_budget), and each layer is one kve_eval call over its H
 * heads with its own budget, sharing or not. Every layer is scored on the
 * same steps, t > score_after (default: the largest layer budget), so
 * schedules are compared on equal steps when given the same --score-after.
 * The row's metrics are means over the layers' heads (minimum of the
 * minima), state bytes the sum over the layers' banks ("total_state_bytes")
 * and its mean per head ("state_bytes").
 */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void budget_args_parse(budget_args *b, const cli_args *a, const cli_spec *spec)
{
    memset(b, 0, sizeof *b);
    b->min_share = kve_bank_default_options().min_share;
    b->schedule = KVE_SCHEDULE_UNIFORM;
    b->schedule_name = "uniform";
    b->beta = kve_schedule_default_options().beta;
    b->calibration_window = 32;
    const opt_val *v;
    b->share_heads = cli_own(a, spec, "share-heads")->count > 0;
    b->given = b->share_heads;
    if ((v = cli_own(a, spec, "min-share"))->count) {
        if (!b->share_heads)
            die_usage("--min-share needs --share-heads");
        b->min_share = parse_real("--min-share", v->v[0], 0.0, 1.0);
    }
    if ((v = cli_own(a, spec, "schedule"))->count) {
        static const struct {
            const char *name;
            kve_schedule_kind kind;
        } names[] = {{"uniform", KVE_SCHEDULE_UNIFORM},
                     {"pyramid", KVE_SCHEDULE_PYRAMID},
                     {"attention", KVE_SCHEDULE_WEIGHTED}};
        size_t i = 0;
        while (i < 3 && strcmp(names[i].name, v->v[0]) != 0)
            i++;
        if (i == 3)
            die_usage("--schedule: '%s' is not uniform, pyramid or attention", v->v[0]);
        b->schedule = names[i].kind;
        b->schedule_name = names[i].name;
        b->given = 1;
    }
    if ((v = cli_own(a, spec, "beta"))->count) {
        if (b->schedule != KVE_SCHEDULE_PYRAMID)
            die_usage("--beta needs --schedule pyramid");
        b->beta = parse_real("--beta", v->v[0], 1.0, 1e9);
    }
    b->calibration = (v = cli_own(a, spec, "calibration"))->count ? v->v[0] : NULL;
    if ((b->schedule == KVE_SCHEDULE_WEIGHTED) != (b->calibration != NULL))
        die_usage(b->calibration ? "--calibration needs --schedule attention"
                                 : "--schedule attention needs --calibration");
    if ((v = cli_own(a, spec, "calibration-window"))->count) {
        if (!b->calibration)
            die_usage("--calibration-window needs --calibration");
        b->calibration_window = (size_t)parse_u64("--calibration-window", v->v[0], 0, 1u << 24);
    }
}

size_t budget_cols(col *cols, size_t n, const budget_args *b)
{
    if (!b->given)
        return n;
    cols[n++] = (col){"schedule", "schedule", COL_ALL | COL_LEFT};
    cols[n++] = (col){"share", "share", COL_ALL | COL_LEFT};
    cols[n++] = (col){"min share", "min_share", COL_CSV | COL_JSON};
    cols[n++] = (col){"layer budgets", "layer_budgets", COL_ALL | COL_LEFT};
    return n;
}

void budget_cells(table *t, const budget_args *b, const size_t *layer_budgets, size_t L)
{
    if (!b->given)
        return;
    char list[512] = "";
    for (size_t l = 0; layer_budgets && l < L; l++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%zu", l ? "," : "", layer_budgets[l]);
    }
    /* the full cache's row (no layer budgets) has no schedule and no sharing */
    table_str(t, layer_budgets ? b->schedule_name : "");
    table_str(t, layer_budgets ? (b->share_heads ? "heads" : "none") : "");
    table_real(t, layer_budgets && b->share_heads ? b->min_share : NAN, "%g");
    table_str(t, list);
}

void trace_layer_spread(kve_trace *tr, size_t window, double *out)
{
    size_t L = kve_trace_layers(tr), heads = kve_trace_heads(tr), T = kve_trace_steps(tr);
    if (T <= window + 1)
        die_input("--calibration %s: %zu steps leave none beyond a window of %zu",
                  trace_name(tr), T, window);
    double *row = xmalloc(T * sizeof *row);
    for (size_t l = 0; l < L; l++) {
        double sum = 0;
        size_t seen = 0;
        for (size_t h = l * (heads / L); h < (l + 1) * (heads / L); h++)
            for (size_t t = window + 1; t < T; t++) {
                kve_status st = kve_trace_row(tr, h, t, row, T);
                if (st != KVE_OK)
                    die_status(st, "--calibration");
                for (size_t i = 0; i + window < t; i++)
                    sum += row[i];
                seen++;
            }
        out[l] = sum / (double)seen;
    }
    free(row);
}

void eval_budgets(FILE *out, const cli_args *a, const budget_args *b, int per_head,
                  size_t score_after)
{
    char *spec = canon_spec("--policy", a->policy, a->budget);
    cli_args resolved = *a;
    kve_trace *tr = open_trace_resolved(&resolved, &spec);
    a = &resolved;
    size_t L = kve_trace_layers(tr), heads = kve_trace_heads(tr), H = heads / L;
    kve_rng rng;
    kve_rng_seed(&rng, a->seed);
    kve_policy *probe = NULL;
    kve_status st = kve_policy_new(spec, &rng, &probe);
    if (st != KVE_OK)
        die_status(st, "--policy");
    size_t budget = kve_policy_budget(probe);
    kve_policy_free(probe);
    if (budget > KVE_MAX_BUDGET / L)
        die_usage("--budget %zu: %zu layers of it exceed %d", budget, L, KVE_MAX_BUDGET);

    kve_schedule_options sch = kve_schedule_default_options();
    sch.kind = b->schedule;
    sch.beta = b->beta;
    double *weights = xcalloc(L, sizeof *weights);
    if (b->calibration) {
        cli_args ca = *a;
        ca.trace = b->calibration;
        kve_trace *cal = open_trace(&ca);
        if (kve_trace_layers(cal) != L)
            die_input("--calibration %s: %zu layers, the trace has %zu", b->calibration,
                      kve_trace_layers(cal), L);
        trace_layer_spread(cal, b->calibration_window, weights);
        kve_trace_free(cal);
        sch.weights = weights;
    }
    if ((st = kve_spec_min_budget(spec, &sch.floor)) != KVE_OK)
        die_status(st, "--policy");
    size_t *lb = xcalloc(L, sizeof *lb), most = 0;
    if ((st = kve_layer_budgets(L * budget, L, &sch, lb)) != KVE_OK)
        die_status(st, "--schedule");
    for (size_t l = 0; l < L; l++)
        most = lb[l] > most ? lb[l] : most;

    kve_eval_result *layer = xcalloc(L, sizeof *layer), *ph = xcalloc(heads, sizeof *ph);
    kve_eval_options o = kve_eval_default_options();
    o.seed = a->seed;
    o.topk = a->topk;
    o.share = b->share_heads ? H : 0;
    o.min_share = b->min_share;
    o.score_after = score_after ? score_after : most;
    progress pr;
    progress_begin(&pr, "layer", L, 0, 1);
    for (size_t l = 0; l < L; l++) {
        kve_eval_job job = {spec, lb[l]};
        if ((st = kve_eval(tr, l * H, H, &job, 1, &o, &layer[l], ph + l * H)) != KVE_OK)
            die_status(st, NULL);
        progress_update(&pr, l + 1);
    }
    progress_end(&pr);

    kve_eval_result all = layer[0];
    size_t total_bytes = layer[0].state_bytes;
    for (size_t l = 1; l < L; l++) {
        all.retained_mass += layer[l].retained_mass;
        all.top32_recall += layer[l].top32_recall;
        all.topk_recall += layer[l].topk_recall;
        all.mean_kept += layer[l].mean_kept;
        all.ns_per_step += layer[l].ns_per_step;
        all.min_retained_mass = fmin(all.min_retained_mass, layer[l].min_retained_mass);
        total_bytes += layer[l].state_bytes;
    }
    all.retained_mass /= (double)L;
    all.top32_recall /= (double)L;
    all.topk_recall /= (double)L;
    all.mean_kept /= (double)L;
    all.budget = budget;
    all.state_bytes = total_bytes / heads;
    snprintf(all.spec, sizeof all.spec, "%s", spec);
    if (!all.scored_steps)
        warn("no step is scored (the trace has %zu steps, --score-after %zu): the metrics are "
             "n/a",
             all.steps, o.score_after);

    result_ctx c;
    result_ctx_init(&c, a, tr);
    const unsigned M = COL_CSV | COL_JSON; /* context: in every machine-readable row */
    col cols[TABLE_MAXCOLS];
    size_t nc = 0;
    cols[nc++] = (col){"policy spec", KEY_POLICY, COL_ALL | COL_LEFT | COL_CODE};
    cols[nc++] = (col){"budget", KEY_BUDGET, COL_ALL};
    nc = budget_cols(cols, nc, b);
    if (per_head) {
        cols[nc++] = (col){"layer", "layer", COL_ALL};
        cols[nc++] = (col){"head", "head", COL_ALL};
    }
    cols[nc++] = (col){"retained mass", KEY_MASS, COL_ALL};
    char recall_head[48];
    snprintf(recall_head, sizeof recall_head, "top-%zu recall", c.topk);
    if (c.topk_given) /* k = 32 always has its key; the table shows the recall at k */
        cols[nc++] = (col){"top-32 recall", KEY_RECALL32, M};
    cols[nc++] = (col){recall_head, recall_key(&c), COL_ALL};
    cols[nc++] = (col){"min mass", KEY_MIN_MASS, COL_ALL};
    cols[nc++] = (col){"mean kept", "mean_kept", COL_ALL};
    cols[nc++] = (col){"ns/step", KEY_NS, COL_ALL};
    cols[nc++] = (col){"state bytes", KEY_STATE, COL_ALL};
    cols[nc++] = (col){"total state bytes", "total_state_bytes", M};
    cols[nc++] = (col){"scored after", "score_after", M};
    cols[nc++] = (col){"trace", KEY_TRACE, M};
    cols[nc++] = (col){"steps", KEY_STEPS, M};
    cols[nc++] = (col){"scored steps", KEY_SCORED, M};
    cols[nc++] = (col){"heads", KEY_HEADS, M};
    cols[nc++] = (col){"layers", KEY_LAYERS, M};
    cols[nc++] = (col){"seed", KEY_SEED, M};
    table t;
    table_init(&t, cols, nc);
    for (size_t h = 0; h <= (per_head ? heads : 0); h++) {
        const kve_eval_result *r = h ? &ph[h - 1] : &all;
        table_str(&t, all.spec);
        table_uint(&t, h ? lb[(h - 1) / H] : budget);
        budget_cells(&t, b, lb, L);
        if (per_head && h == 0) {
            table_str(&t, "all");
            table_str(&t, "all");
        } else if (per_head) {
            table_uint(&t, (h - 1) / H);
            table_uint(&t, (h - 1) % H);
        }
        table_real(&t, r->retained_mass, "%.4f");
        if (c.topk_given)
            table_real(&t, r->top32_recall, "%.4f");
        table_real(&t, recall_of(&c, r), "%.4f");
        table_real(&t, r->min_retained_mass, "%.4f");
        table_real(&t, r->mean_kept, "%.1f");
        table_real(&t, r->ns_per_step, "%.1f");
        table_uint(&t, r->state_bytes);
        table_uint(&t, h ? layer[(h - 1) / H].state_bytes / H : total_bytes);
        table_uint(&t, o.score_after);
        table_str(&t, c.trace);
        table_uint(&t, r->steps);
        table_uint(&t, r->scored_steps);
        table_uint(&t, h ? 1 : heads);
        table_uint(&t, h ? 1 : L);
        table_uint(&t, a->seed);
    }
    table_print(&t, out, a->format);
    table_free(&t);
    free(layer);
    free(ph);
    free(lb);
    free(weights);
    free(spec);
    kve_trace_free(tr);
}
