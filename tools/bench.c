/*
 * bench.c - `kvevict bench` and the report sections it prints, shared with
 * the docs generator: a table of every registered policy at one budget, the
 * H2O recent-window sweep beside streaming, the H2O page's observations
 * checked against the figures, and a two-budget summary.
 *
 * Every section is a renderer over an evalset: run once collecting (output
 * discarded), evaluate every spec in one lockstep pass, run again to print.
 * Only columns headed "ns/step" hold timings; everything else is a pure
 * function of the trace, the specs and the seed (the docs drift test relies
 * on this).
 *
 * The observation criteria were fixed before any figure was seen:
 *  (3) "the gain saturates at 64": retained mass rises by more than
 *      SAT_EPS at each step 16 -> 32 -> 48 -> 64 and no window in
 *      {80, 96, 128} retains more than mass(64) + SAT_EPS;
 *  (5) "within a hundredth": |difference| <= 0.01 on both metrics at both
 *      budgets;
 *  (6) the page's 0.7367: reproduced when ours rounds to it at 4 decimals.
 */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SAT_EPS 0.001
#define PAGE_STREAMING_MASS 0.7367

static const size_t bench_budgets[2] = {256, 512};
static const size_t sweep_windows[] = {16, 32, 48, 64, 80, 96, 128};
enum { N_WINDOWS = sizeof sweep_windows / sizeof sweep_windows[0] };

static const char *spec_cell(tfmt fmt)
{
    return fmt == FMT_MD ? "`%s`" : "%s";
}

static const kve_eval_result *h2o_window(evalset *es, size_t w)
{
    char spec[64];
    snprintf(spec, sizeof spec, "h2o:recent_window=%zu", w);
    return evalset_get(es, spec, 256);
}

void render_policy_table(FILE *f, evalset *es, size_t budget, tfmt fmt)
{
    static const char *const head[] = {"policy spec", "retained mass", "top-32 recall",
                                       "min mass",    "ns/step",       "state bytes"};
    static const char *const csv[] = {"policy",           "retained_mass", "top32_recall",
                                      "min_retained_mass", "ns_per_step",   "state_bytes"};
    table t;
    table_init(&t, 6, head, csv, 1u);
    for (size_t i = 0; i < kve_policy_type_count(); i++) {
        const kve_eval_result *r = evalset_get(es, kve_policy_type_name(i), budget);
        table_add(&t, spec_cell(fmt), r->spec);
        table_add(&t, "%.4f", r->retained_mass);
        table_add(&t, "%.4f", r->top32_recall);
        table_add(&t, "%.4f", r->min_retained_mass);
        table_add(&t, "%.1f", r->ns_per_step);
        table_add(&t, "%zu", r->state_bytes);
    }
    table_print(&t, f, fmt);
    table_free(&t);
}

void render_h2o_sweep(FILE *f, evalset *es, tfmt fmt)
{
    static const char *const head[] = {"policy spec", "retained mass", "top-32 recall",
                                       "min mass", "mass - streaming", "recall - streaming"};
    static const char *const csv[] = {"policy", "retained_mass", "top32_recall",
                                      "min_retained_mass", "mass_minus_streaming",
                                      "recall_minus_streaming"};
    const kve_eval_result *s = evalset_get(es, "streaming", 256);
    table t;
    table_init(&t, 6, head, csv, 1u);
    for (size_t i = 0; i <= N_WINDOWS; i++) {
        const kve_eval_result *r = i < N_WINDOWS ? h2o_window(es, sweep_windows[i]) : s;
        table_add(&t, spec_cell(fmt), r->spec);
        table_add(&t, "%.4f", r->retained_mass);
        table_add(&t, "%.4f", r->top32_recall);
        table_add(&t, "%.4f", r->min_retained_mass);
        table_add(&t, "%+.4f", r->retained_mass - s->retained_mass);
        table_add(&t, "%+.4f", r->top32_recall - s->top32_recall);
    }
    table_print(&t, f, fmt);
    table_free(&t);
}

/* Rank of value v among the budgeted policies' values (1 = highest; equal
 * values share a rank); `full`, the unbudgeted ceiling, is not ranked. */
static size_t rank_of(const double *vals, const int *ranked, size_t n, double v)
{
    size_t r = 1;
    for (size_t i = 0; i < n; i++)
        r += ranked[i] && vals[i] > v;
    return r;
}

void render_summary(FILE *f, evalset *es, tfmt fmt)
{
    enum { MASS256, RECALL256, MASS512, RECALL512, N_METRICS, MAX_POLICIES = 64 };
    static const char *const head[] = {"policy",        "mass @256 (rank)", "recall @256 (rank)",
                                       "mass @512 (rank)", "recall @512 (rank)", "ns/step @512",
                                       "state bytes @512"};
    static const char *const csv[] = {"policy",        "retained_mass_256", "top32_recall_256",
                                      "retained_mass_512", "top32_recall_512",
                                      "ns_per_step_512", "state_bytes_512"};
    size_t n = kve_policy_type_count();
    if (n > MAX_POLICIES)
        n = MAX_POLICIES;
    double val[N_METRICS][MAX_POLICIES];
    int ranked[MAX_POLICIES];
    for (size_t i = 0; i < n; i++) {
        const char *name = kve_policy_type_name(i);
        const kve_eval_result *a = evalset_get(es, name, 256);
        const kve_eval_result *b = evalset_get(es, name, 512);
        val[MASS256][i] = a->retained_mass;
        val[RECALL256][i] = a->top32_recall;
        val[MASS512][i] = b->retained_mass;
        val[RECALL512][i] = b->top32_recall;
        ranked[i] = strcmp(name, "full") != 0;
    }
    table t;
    table_init(&t, 7, head, csv, 1u);
    for (size_t i = 0; i < n; i++) {
        const char *name = kve_policy_type_name(i);
        table_add(&t, fmt == FMT_MD ? "`%s`" : "%s", name);
        for (int m = 0; m < N_METRICS; m++) {
            double v = val[m][i];
            if (fmt == FMT_CSV)
                table_add(&t, "%.4f", v);
            else if (!ranked[i])
                table_add(&t, "%.4f (ceiling)", v);
            else
                table_add(&t, "%.4f (%zu)", v, rank_of(val[m], ranked, n, v));
        }
        const kve_eval_result *b = evalset_get(es, name, 512);
        table_add(&t, "%.1f", b->ns_per_step);
        table_add(&t, "%zu", b->state_bytes);
    }
    table_print(&t, f, fmt);
    table_free(&t);
}

/* One observation: verdict, claim, then the figures behind it. */
static void obs(FILE *f, int md, int num, int ok, const char *claim, const char *figures)
{
    const char *verdict = ok ? "reproduced" : "not reproduced";
    if (md)
        fprintf(f, "%d. **%s**: %s\n   %s\n", num, verdict, claim, figures);
    else
        fprintf(f, "(%d) %s: %s\n    %s\n", num, verdict, claim, figures);
}

void render_observations(FILE *f, evalset *es, int md)
{
    char fig[1024];
    size_t pos = 0;
    const kve_eval_result *s256 = evalset_get(es, "streaming", 256);

    const kve_eval_result *h32 = h2o_window(es, 32), *h64 = h2o_window(es, 64);
    snprintf(fig, sizeof fig, "retained mass: %s %.4f, %s %.4f", h32->spec, h32->retained_mass,
             s256->spec, s256->retained_mass);
    obs(f, md, 1, h32->retained_mass < s256->retained_mass,
        "h2o at recent_window 32 retains less mass than streaming at budget 256.", fig);

    snprintf(fig, sizeof fig, "%s: mass %.4f, recall %.4f; %s: mass %.4f, recall %.4f",
             h64->spec, h64->retained_mass, h64->top32_recall, s256->spec,
             s256->retained_mass, s256->top32_recall);
    obs(f, md, 2,
        h64->retained_mass > s256->retained_mass && h64->top32_recall > s256->top32_recall,
        "h2o at recent_window 64 beats streaming on both metrics at budget 256.", fig);

    double m[N_WINDOWS];
    int rises = 1, flat = 1;
    size_t i64 = 3;
    pos = (size_t)snprintf(fig, sizeof fig, "h2o retained mass at budget 256 by recent_window:");
    for (size_t i = 0; i < N_WINDOWS; i++) {
        m[i] = h2o_window(es, sweep_windows[i])->retained_mass;
        pos += (size_t)snprintf(fig + pos, sizeof fig - pos, "%s %zu: %.4f", i ? "," : "",
                                sweep_windows[i], m[i]);
        if (i > 0 && i <= i64 && !(m[i] > m[i - 1] + SAT_EPS))
            rises = 0;
        if (i > i64 && m[i] > m[i64] + SAT_EPS)
            flat = 0;
    }
    snprintf(fig + pos, sizeof fig - pos,
             ". Criterion: mass rises by more than %.3f at each step up to 64 (%s) and no "
             "wider window retains more than mass(64) + %.3f (%s).",
             SAT_EPS, rises ? "yes" : "no", SAT_EPS, flat ? "yes" : "no");
    obs(f, md, 3, rises && flat, "the gain of widening recent_window saturates at exactly 64.",
        fig);

    static const char *const blind[] = {"window", "streaming", "random"};
    int all = 1;
    pos = 0;
    for (size_t b = 0; b < 2; b++) {
        const kve_eval_result *h = evalset_get(es, "h2o", bench_budgets[b]);
        pos += (size_t)snprintf(fig + pos, sizeof fig - pos, "%sbudget %zu: h2o %.4f",
                                b ? "; " : "", bench_budgets[b], h->top32_recall);
        for (size_t j = 0; j < 3; j++) {
            const kve_eval_result *o = evalset_get(es, blind[j], bench_budgets[b]);
            pos += (size_t)snprintf(fig + pos, sizeof fig - pos, ", %s %.4f", blind[j],
                                    o->top32_recall);
            if (!(h->top32_recall > o->top32_recall))
                all = 0;
        }
    }
    snprintf(fig + pos, sizeof fig - pos, " (top-32 recall; full is the unbudgeted ceiling)");
    obs(f, md, 4, all,
        "h2o (defaults) recovers more of the top-32 than every policy that does not read "
        "attention (window, streaming, random), at budgets 256 and 512.",
        fig);

    int near = 1;
    pos = 0;
    for (size_t b = 0; b < 2; b++) {
        const kve_eval_result *h = evalset_get(es, "h2o", bench_budgets[b]);
        const kve_eval_result *c = evalset_get(es, "scissorhands", bench_budgets[b]);
        double dm = h->retained_mass - c->retained_mass, dr = h->top32_recall - c->top32_recall;
        pos += (size_t)snprintf(fig + pos, sizeof fig - pos,
                                "%sbudget %zu: mass h2o %.4f vs scissorhands %.4f (%+.4f), "
                                "recall %.4f vs %.4f (%+.4f)",
                                b ? "; " : "", bench_budgets[b], h->retained_mass,
                                c->retained_mass, dm, h->top32_recall, c->top32_recall, dr);
        if (!(fabs(dm) <= 0.01 && fabs(dr) <= 0.01))
            near = 0;
    }
    obs(f, md, 5, near,
        "h2o and scissorhands (defaults) land within 0.01 of each other on both metrics at "
        "budgets 256 and 512.",
        fig);

    snprintf(fig, sizeof fig,
             "ours: %s %.4f against the page's 0.7367 (difference %+.4f). Our trace's "
             "constants are chosen from the page's description, not copied from its "
             "trace, so equality is not expected.",
             s256->spec, s256->retained_mass, s256->retained_mass - PAGE_STREAMING_MASS);
    obs(f, md, 6, fabs(s256->retained_mass - PAGE_STREAMING_MASS) < 0.00005,
        "streaming retains 0.7367 of the mass at budget 256 (the page's figure on its trace).",
        fig);
}

void render_bench(FILE *f, evalset *es, int md, const char *trace_src, uint64_t seed)
{
    const char *h = md ? "### " : "";
    fprintf(f, "%s %s%s%s, policy seed %llu%s\n\n", md ? "Trace" : "kvevict bench: trace",
            md ? "`" : "", trace_src, md ? "`" : "", (unsigned long long)seed, md ? "." : "");
    fprintf(f,
            "Means over the steps t > budget. Every policy at its default parameters with "
            "the budget overridden;%sfull never evicts (the ceiling).\n\n",
            md ? " " : "\n");
    for (size_t b = 0; b < 2; b++) {
        fprintf(f, "%sBudget %zu\n\n", h, bench_budgets[b]);
        render_policy_table(f, es, bench_budgets[b], md ? FMT_MD : FMT_TEXT);
        fprintf(f, "\n");
    }
    fprintf(f, "%sH2O recent-window sweep at budget 256, beside streaming\n\n", h);
    render_h2o_sweep(f, es, md ? FMT_MD : FMT_TEXT);
    fprintf(f, "\n%sObservations of the H2O page, checked on this trace\n\n", h);
    render_observations(f, es, md);
}

static const char bench_usage[] =
    "usage: kvevict bench [--markdown] [--trace SRC] [--normalize] [--seed N]\n"
    "\n"
    "The benchmark: every registered policy (default parameters, budget overridden)\n"
    "at budgets 256 and 512, the H2O recent-window sweep at budget 256 beside\n"
    "streaming, and each observation of the H2O page marked \"reproduced\" or\n"
    "\"not reproduced\" with the figures behind it. All policies run in one\n"
    "lockstep pass over the trace.\n"
    "\n"
    "  --markdown   the same content as markdown (what docs/results.md holds)\n"
    "  --trace SRC  the trace (default: canonical)\n"
    "  --normalize  rescale each row of a .npy file to sum 1 instead of refusing\n"
    "  --seed N     seed of the policies' random numbers (default 0)\n";

enum { B_MD, B_TRACE, B_NORM, B_SEED, B_N };
static const opt_def bench_defs[B_N] = {
    {"markdown", 0, 0, 0}, {"trace", 0, 1, 0}, {"normalize", 0, 0, 0}, {"seed", 0, 1, 0}};

int cmd_bench(int argc, char **argv)
{
    opt_val v[B_N];
    size_t npos;
    args_parse(argc, argv, bench_usage, bench_defs, B_N, v, NULL, 0, &npos);
    const char *src = v[B_TRACE].count ? v[B_TRACE].v[0] : BENCH_TRACE;
    uint64_t seed = v[B_SEED].count ? parse_u64("--seed", v[B_SEED].v[0], 0, UINT64_MAX) : 0;
    int md = v[B_MD].count > 0;
    evalset es;
    evalset_init(&es);
    FILE *sink = null_sink();
    render_bench(sink, &es, md, src, seed);
    fclose(sink);
    kve_trace *tr = open_trace(src, v[B_NORM].count ? KVE_TRACE_NORMALIZE : 0u);
    evalset_run(&es, tr, seed, 0);
    render_bench(stdout, &es, md, kve_trace_source(tr), seed);
    evalset_free(&es);
    kve_trace_free(tr);
    finish_stdout();
    return 0;
}
