/* SPDX-License-Identifier: MIT */
/*
 * cmd_plot.c - `kvevict plot`, a source-tree tool: the figures of docs/img/,
 * rendered by gnuplot.
 *
 *   mass_vs_budget.png    retained mass against budget, every policy
 *   recall_vs_budget.png  top-32 recall against budget, every policy
 *   h2o_recent_window.png h2o's recent-window sweep at budget 256, with
 *                         streaming at the same budget as reference lines
 *   trace_h2o.png         the canonical trace's attention over (step,
 *                         position) for PLOT_STEPS steps around an epoch
 *                         boundary, log colour scale, with the positions
 *                         h2o (defaults) had evicted when each row arrived
 *                         washed out: what stays in colour is its kept set
 *
 * Data (.dat text, .bin float32/uint8 matrices) and the .gp script go to a
 * fresh temporary directory that is removed afterwards. All figures come
 * from one lockstep evaluation plus one replay of h2o.
 */
#define _POSIX_C_SOURCE 200809L
#include "calibrate.h"
#include "docs.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const size_t plot_budgets[] = {64, 96, 128, 192, 256, 384, 512, 768, 1024};
enum { N_BUDGETS = sizeof plot_budgets / sizeof plot_budgets[0] };
static const size_t plot_windows[] = {16, 32, 48, 64, 80, 96, 128};
enum { N_WINDOWS = sizeof plot_windows / sizeof plot_windows[0] };

/* The trace picture: steps [t1 - PLOT_STEPS, t1) with t1 = min(T, PLOT_END),
 * positions [0, t1); on the canonical trace that is steps 1792..2303 (on
 * version 1, across its epoch boundary at 2048). Shorter traces show their
 * first t1 steps. */
enum { PLOT_END = 2304, PLOT_STEPS = 512, PLOT_BUDGET = 512, PLOT_ROWS = 768 };

static const char plot_usage[] =
    "usage: kvevict plot [--out DIR] [--trace SRC]\n"
    "\n"
    "Renders with gnuplot (Debian package gnuplot-nox; `make plots` installs it)\n"
    "into DIR (default docs/img): mass_vs_budget.png, recall_vs_budget.png (every\n"
    "policy at budgets 64..1024), h2o_recent_window.png (the recent-window sweep at\n"
    "budget 256 beside streaming) and trace_h2o.png (the canonical trace's\n"
    "attention over step and position, log colour scale, with the positions h2o\n"
    "has evicted washed out). All on the canonical trace, policy seed 0.\n"
    "This is a source-tree tool: it maintains the docs/img of a kvevict checkout.\n"
    "\n"
    "  --out DIR    the directory to write the PNG files to (must exist)\n"
    "  --trace SRC  plot another trace (default canonical); the trace picture\n"
    "               shows its steps up to 2304\n"
    "  --quiet      no progress line on stderr (drawn on a terminal after 2 s)\n"
    "  --real-model DIR  instead, the figures of docs/real-model.md (real_*.png)\n"
    "               from the data files in DIR (docs/data/real-model; make\n"
    "               real-model writes them)\n"
    "  --calibration FILE --png PATH  instead, the feasibility map of a committed\n"
    "               `kvevict trace --calibrate --json` run (docs/trace.md)\n"
    "\n"
    "usage: kvevict plot --jsonl FILE --x KEY --y KEY [--series KEY] [--where F]...\n"
    "                    [--title T] [--xlabel T] [--ylabel T] [--logx] [--yrange LO:HI]\n"
    "                    --png PATH\n"
    "\n"
    "A figure of committed measurements (the JSON Lines of `--json` outputs, as\n"
    "docs/data/ holds): the rows passing every --where F, KEY:V1|V2... (the\n"
    "value's text is one of them) or KEY!V1|V2... (none of them; a missing key\n"
    "reads null, so KEY!null: present), as in the docs' table blocks; one line\n"
    "of y against x per distinct value of --series (in order of first\n"
    "appearance; one line without it). A numeric x is an axis, any other x a list\n"
    "of categories in order of first appearance. --yrange LO:HI fixes the y axis\n"
    "(lines beyond it leave the frame).\n";

static const opt_def plot_own[] = {
    {"real-model", 0, OPT_VALUE}, {"calibration", 0, OPT_VALUE},
    {"out", 0, OPT_VALUE},    {"jsonl", 0, OPT_VALUE},   {"x", 0, OPT_VALUE},
    {"y", 0, OPT_VALUE},      {"series", 0, OPT_VALUE},  {"where", 0, OPT_VALUE | OPT_REPEAT},
    {"title", 0, OPT_VALUE},  {"xlabel", 0, OPT_VALUE},  {"ylabel", 0, OPT_VALUE},
    {"logx", 0, 0},           {"png", 0, OPT_VALUE},     {"yrange", 0, OPT_VALUE}};
static const cli_spec plot_spec = {
    .usage = plot_usage,
    .shared = SO_TRACE | SO_QUIET,
    CLI_OWN(plot_own),
};

typedef struct replay_rec {
    int32_t *evicted_at; /* [T]: the step after which a position left, or INT32_MAX */
} replay_rec;

static int record(void *user, size_t job, int32_t pos, const int32_t *victims, size_t n)
{
    replay_rec *r = user;
    (void)job;
    for (size_t i = 0; i < n; i++)
        r->evicted_at[victims[i]] = pos;
    return 0;
}

static FILE *open_in(const char *dir, const char *name, const char *mode, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, mode);
    if (!f)
        die_input("%s: cannot create", path);
    return f;
}

static const char *own1(const cli_args *a, const char *name)
{
    const opt_val *v = cli_own(a, &plot_spec, name);
    return v->count ? v->v[0] : NULL;
}

/* kvevict plot --jsonl: see the usage. */
static int plot_jsonl(const cli_args *a)
{
    const char *file = own1(a, "jsonl"), *x = own1(a, "x"), *y = own1(a, "y");
    const char *series = own1(a, "series"), *png = own1(a, "png");
    if (!x || !y || !png)
        die_usage("--jsonl needs --x, --y and --png");
    double y_lo = 0, y_hi = 0;
    const char *yr = own1(a, "yrange");
    if (yr) {
        char lo[64], *colon = strchr(yr, ':');
        if (!colon || (size_t)(colon - yr) >= sizeof lo)
            die_usage("--yrange: '%s' is not LO:HI", yr);
        memcpy(lo, yr, (size_t)(colon - yr));
        lo[colon - yr] = '\0';
        y_lo = parse_real("--yrange", lo, -1e300, 1e300);
        y_hi = parse_real("--yrange", colon + 1, -1e300, 1e300);
        if (!(y_lo < y_hi))
            die_usage("--yrange: %s is not below %s", lo, colon + 1);
    }
    const opt_val *wv = cli_own(a, &plot_spec, "where");
    row_filter *flt = xcalloc((size_t)wv->count + 1, sizeof *flt);
    for (int i = 0; i < wv->count; i++)
        filter_parse(&flt[i], "--where", wv->v[i]);
    gp_require();
    jfile j;
    jfile_read(&j, file);
    size_t n = 0, n_series = 0, n_cat = 0;
    const char **names = xcalloc(j.n + 1, sizeof *names), **cats = xcalloc(j.n + 1, sizeof *cats);
    size_t *row_series = xcalloc(j.n + 1, sizeof *row_series);
    size_t *keep = xcalloc(j.n + 1, sizeof *keep);
    int numeric = 1, integers = 1;
    double x_lo = INFINITY, x_hi = -INFINITY;
    for (size_t r = 0; r < j.n; r++) {
        const jrow *q = &j.rows[r];
        if (!filters_match(flt, (size_t)wv->count, q))
            continue;
        const char *xv = jrow_text(q, x), *yv = jrow_text(q, y);
        if (!xv || !yv)
            die_input("%s: a row without %s", file, xv ? y : x);
        char *end;
        double xd = strtod(xv, &end);
        numeric = numeric && *end == '\0' && xv[0];
        integers = integers && xd == floor(xd);
        x_lo = fmin(x_lo, xd);
        x_hi = fmax(x_hi, xd);
        const char *sv = series ? jrow_text(q, series) : "";
        sv = sv ? sv : "null";
        size_t i = 0;
        while (i < n_series && strcmp(names[i], sv) != 0)
            i++;
        if (i == n_series)
            names[n_series++] = sv;
        size_t c = 0;
        while (c < n_cat && strcmp(cats[c], xv) != 0)
            c++;
        if (c == n_cat)
            cats[n_cat++] = xv;
        row_series[n] = i;
        keep[n++] = r;
    }
    if (!n)
        die_input("%s: no row satisfies the --where options", file);
    char tmpl[4096], path[4200], data[4200];
    const char *tmpdir = plot_tmpdir(tmpl, sizeof tmpl);
    FILE *f = open_in(tmpdir, "data.dat", "w", data, sizeof data);
    for (size_t s = 0; s < n_series; s++) { /* one gnuplot index per series */
        fprintf(f, "# %s\n", names[s]);
        for (size_t k = 0; k < n; k++) {
            if (row_series[k] != s)
                continue;
            const jrow *q = &j.rows[keep[k]];
            const char *xv = jrow_text(q, x), *yv = jrow_text(q, y);
            size_t c = 0;
            while (strcmp(cats[c], xv) != 0)
                c++;
            const char *yy = strcmp(yv, "null") ? yv : "NaN";
            if (numeric)
                fprintf(f, "%s %s\n", xv, yy);
            else /* a category: its index, its text on the axis */
                fprintf(f, "%zu %s\n", c, yy);
        }
        fputs("\n\n", f);
    }
    gp_close(f, data);
    f = open_in(tmpdir, "plot.gp", "w", path, sizeof path);
    if (n_series > 16) /* a key too long for the side: below the frame, in columns */
        fprintf(f, "set terminal pngcairo size 1000,%zu enhanced font 'Sans,11'\n"
                   "set grid\nset key outside below center horizontal maxcols 3 noenhanced\n"
                   "set output ", 540 + 20 * ((n_series + 2) / 3));
    else
        fprintf(f, "set terminal pngcairo size 900,540 enhanced font 'Sans,11'\n"
                   "set grid\nset key outside right top noenhanced\nset output ");
    gp_quote(f, png);
    fprintf(f, "\nset title ");
    gp_quote(f, own1(a, "title") ? own1(a, "title") : "");
    fprintf(f, " noenhanced\nset xlabel ");
    gp_quote(f, own1(a, "xlabel") ? own1(a, "xlabel") : x);
    fprintf(f, " noenhanced\nset ylabel ");
    gp_quote(f, own1(a, "ylabel") ? own1(a, "ylabel") : y);
    fprintf(f, " noenhanced\n");
    if (yr)
        fprintf(f, "set yrange [%.17g:%.17g]\n", y_lo, y_hi);
    if (cli_own(a, &plot_spec, "logx")->count)
        fprintf(f, "set logscale x 2\n");
    else if (numeric && integers && x_hi - x_lo <= 16) /* a few integers: one tic each */
        fprintf(f, "set xtics 1\nset xrange [%g:%g]\n", x_lo - 0.25, x_hi + 0.25);
    if (!numeric) {
        fprintf(f, "set xrange [-0.5:%zu.5]\nset xtics (", n_cat - 1);
        for (size_t c = 0; c < n_cat; c++) {
            fprintf(f, "%s", c ? ", " : "");
            gp_quote(f, cats[c]);
            fprintf(f, " %zu", c);
        }
        fprintf(f, ") noenhanced\n");
    }
    fprintf(f, "plot ");
    for (size_t s = 0; s < n_series; s++) {
        fprintf(f, "%s'%s' index %zu using 1:2 with linespoints lw 2 pt %zu title ", s ? ", " : "",
                data, s, 5 + 2 * (s % 6));
        char title[256], *end;
        (void)strtod(names[s], &end);
        /* a number names its key too ("head 0"); a word stands alone */
        snprintf(title, sizeof title, "%s%s%s", *end || !names[s][0] ? "" : series,
                 *end || !names[s][0] ? "" : " ", series ? names[s] : y);
        gp_quote(f, title);
    }
    fputc('\n', f);
    gp_close(f, path);
    int rc = gp_run(path);
    remove(path);
    remove(data);
    rmdir(tmpdir);
    free(names);
    free(cats);
    free(row_series);
    free(keep);
    for (int i = 0; i < wv->count; i++)
        filter_free(&flt[i]);
    free(flt);
    jfile_free(&j);
    if (rc != 0)
        die_input("gnuplot failed (status %d)", rc);
    printf("wrote %s\n", png);
    finish_stdout();
    return 0;
}

int cmd_plot(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &plot_spec, argc, argv);
    if (own1(&a, "jsonl"))
        return plot_jsonl(&a);
    if (own1(&a, "calibration")) { /* plot_calibration.c: a committed calibration run */
        if (!own1(&a, "png"))
            die_usage("--calibration needs --png PATH");
        plot_calibration(own1(&a, "calibration"), own1(&a, "png"));
        return 0;
    }
    const char *src = a.trace ? a.trace : BENCH_TRACE;
    /* The figures' titles name the trace; a source gnuplot cannot quote is
     * named generically. */
    const char *label = !a.trace ? "canonical trace"
                        : strpbrk(src, "'\"\\\n") ? "given trace" : src;
    const opt_val *outv = cli_own(&a, &plot_spec, "out");
    const char *out = outv->count ? outv->v[0] : "docs/img";
    if (strchr(out, '\'') || strchr(out, '"') || strchr(out, '\n'))
        die_usage("--out: quotes and newlines are not supported in '%s'", out);
    if (access(out, W_OK) != 0)
        die_input("--out: '%s' is not a writable directory", out);
    gp_require();
    const opt_val *real = cli_own(&a, &plot_spec, "real-model");
    if (real->count) {
        if (a.trace)
            die_usage("--real-model plots data files, not a trace: --trace does not apply");
        plot_real_model(real->v[0], out);
        return 0;
    }

    size_t n_pol = kve_policy_type_count();
    evalset es;
    evalset_init(&es);
    kve_trace *tr = open_trace(&a);
    es.key_dim = kve_trace_key_dim(tr);
    size_t n_run = 0; /* the policies that run on this trace, in registry order */
    int runs[64] = {0};
    for (size_t i = 0; i < n_pol && i < 64; i++)
        n_run += (size_t)(runs[i] = evalset_runs(&es, i));
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            evalset_run(&es, tr, &a, 0);
            kve_trace_free(tr);
        }
        for (size_t b = 0; b < N_BUDGETS; b++)
            for (size_t i = 0; i < n_pol; i++)
                if (evalset_runs(&es, i))
                    evalset_get(&es, kve_policy_type_name(i), plot_budgets[b]);
        for (size_t w = 0; w < N_WINDOWS; w++) {
            char spec[64];
            snprintf(spec, sizeof spec, "h2o:recent_window=%zu", plot_windows[w]);
            evalset_get(&es, spec, 256);
        }
        evalset_get(&es, "streaming", 256);
    }

    char tmpl[4096];
    const char *tmpdir = plot_tmpdir(tmpl, sizeof tmpl);
    char path[4096];
    FILE *f = open_in(tmpdir, "budgets.dat", "w", path, sizeof path);
    fprintf(f, "# budget, then retained mass and top-32 recall of each policy\n");
    for (size_t b = 0; b < N_BUDGETS; b++) {
        fprintf(f, "%zu", plot_budgets[b]);
        for (size_t i = 0; i < n_pol; i++) {
            if (!evalset_runs(&es, i))
                continue;
            const kve_eval_result *r = evalset_get(&es, kve_policy_type_name(i), plot_budgets[b]);
            fprintf(f, " %.9f %.9f", r->retained_mass, r->top32_recall);
        }
        fprintf(f, "\n");
    }
    gp_close(f, path);
    f = open_in(tmpdir, "window.dat", "w", path, sizeof path);
    fprintf(f, "# recent_window, h2o retained mass, h2o top-32 recall (budget 256)\n");
    for (size_t w = 0; w < N_WINDOWS; w++) {
        char spec[64];
        snprintf(spec, sizeof spec, "h2o:recent_window=%zu", plot_windows[w]);
        const kve_eval_result *r = evalset_get(&es, spec, 256);
        fprintf(f, "%zu %.9f %.9f\n", plot_windows[w], r->retained_mass, r->top32_recall);
    }
    gp_close(f, path);
    const kve_eval_result *s = evalset_get(&es, "streaming", 256);
    double s_mass = s->retained_mass, s_recall = s->top32_recall;
    evalset_free(&es);

    /* The trace picture: replay h2o, then read the rows of the window. */
    tr = open_trace(&a);
    size_t T = kve_trace_steps(tr);
    /* cppcheck 2.10 reads min(T, PLOT_END) as "less than 1" whatever T is (a
     * false positive it shows on these three lines alone); the conditions it
     * then misjudges are marked below. */
    size_t t1 = T < PLOT_END ? T : PLOT_END;
    /* cppcheck-suppress knownConditionTrueFalse */
    size_t n_steps = t1 < PLOT_STEPS ? t1 : PLOT_STEPS, t0 = t1 - n_steps;
    replay_rec rec;
    rec.evicted_at = xmalloc(T * sizeof *rec.evicted_at);
    for (size_t i = 0; i < T; i++)
        rec.evicted_at[i] = INT32_MAX;
    char *h2o = canon_spec("h2o", "h2o", PLOT_BUDGET);
    kve_eval_job job = {h2o, KVE_EVAL_BUDGET_SPEC};
    kve_eval_result res;
    kve_eval_options o = kve_eval_default_options();
    o.seed = BENCH_SEED;
    o.on_step = record;
    o.user = &rec;
    kve_status st = kve_eval(tr, 0, 1, &job, 1, &o, &res, NULL);
    if (st != KVE_OK)
        die_status(st, "replay of h2o");
    /* Positions are pooled into bins of `bin` rows so that no row is lost
     * to the PNG's resolution: a bin shows its most attended position, and
     * that position's kept state. */
    size_t P = t1;                                /* positions shown */
    size_t bin = (P + PLOT_ROWS - 1) / PLOT_ROWS; /* positions per picture row */
    /* cppcheck-suppress zerodiv */
    size_t PB = (P + bin - 1) / bin;              /* picture rows */
    float *att = xmalloc(n_steps * PB * sizeof *att);  /* [step][bin] */
    unsigned char *mask = xmalloc(n_steps * PB * 4);   /* rgba, [step][bin] */
    double *row = xmalloc(T * sizeof *row);
    /* cppcheck-suppress knownConditionTrueFalse */
    for (size_t k = 0; k < n_steps; k++) {
        size_t t = t0 + k;
        st = kve_trace_row(tr, 0, t, row, T);
        if (st != KVE_OK)
            die_status(st, "trace row");
        for (size_t b = 0; b < PB; b++) {
            size_t best = b * bin;
            for (size_t i = b * bin; i < (b + 1) * bin && i <= t && i < P; i++)
                if (row[i] > row[best])
                    best = i;
            /* Kept when row t arrived: not evicted at any step before t. */
            int seen = best <= t;
            int kept = seen && (best == t || rec.evicted_at[best] >= (int32_t)t);
            att[k * PB + b] = seen && row[best] > 0 ? (float)row[best] : NAN;
            unsigned char *px = mask + 4 * (k * PB + b);
            px[0] = px[1] = px[2] = 255;
            px[3] = (unsigned char)(seen && !kept ? 180 : 0);
        }
    }
    free(row);
    kve_trace_free(tr);
    /* gnuplot's binary arrays are row-major with x fastest: x = step. */
    f = open_in(tmpdir, "att.bin", "wb", path, sizeof path);
    for (size_t b = 0; b < PB; b++)
        /* cppcheck-suppress knownConditionTrueFalse */
        for (size_t k = 0; k < n_steps; k++)
            fwrite(&att[k * PB + b], sizeof(float), 1, f);
    gp_close(f, path);
    f = open_in(tmpdir, "mask.bin", "wb", path, sizeof path);
    for (size_t b = 0; b < PB; b++)
        /* cppcheck-suppress knownConditionTrueFalse */
        for (size_t k = 0; k < n_steps; k++)
            fwrite(mask + 4 * (k * PB + b), 1, 4, f);
    gp_close(f, path);
    free(att);
    free(mask);

    f = open_in(tmpdir, "plot.gp", "w", path, sizeof path);
    fprintf(f, "set terminal pngcairo size 960,600 enhanced font 'Sans,11'\n"
               "set datafile commentschars '#'\n"
               "set key outside right top\n"
               "set grid\n"
               "set logscale x 2\n"
               "set xtics (64, 128, 256, 512, 1024)\n"
               "set xlabel 'budget (kept positions)'\n"
               "set linetype 1 lc rgb '#1f77b4' pt 5\n"
               "set linetype 2 lc rgb '#ff7f0e' pt 7\n"
               "set linetype 3 lc rgb '#2ca02c' pt 9\n"
               "set linetype 4 lc rgb '#d62728' pt 11\n"
               "set linetype 5 lc rgb '#9467bd' pt 13\n"
               "set linetype 6 lc rgb '#8c564b' pt 4\n"
               "set linetype 7 lc rgb '#e377c2' pt 6\n"
               "set linetype 8 lc rgb '#7f7f7f' pt 8\n"
               "set linetype 9 lc rgb '#17becf' pt 10\n"
               "set linetype 10 lc rgb '#bcbd22' pt 12\n"
               "set linetype cycle 10\n");
    fprintf(f, "names = \"");
    for (size_t i = 0, first = 1; i < n_pol && i < 64; i++)
        if (runs[i]) {
            fprintf(f, "%s%s", first ? "" : " ", kve_policy_type_name(i));
            first = 0;
        }
    fprintf(f, "\"\n");
    fprintf(f,
            "set output '%s/mass_vs_budget.png'\n"
            "set title 'Retained attention mass against budget (%s)' noenhanced\n"
            "set ylabel 'retained mass (mean over steps t > budget)'\n"
            "plot for [i=1:%zu] '%s/budgets.dat' using 1:(column(2*i)) with linespoints "
            "lt i lw 2 title word(names, i) noenhanced\n",
            out, label, n_run, tmpdir);
    fprintf(f,
            "set output '%s/recall_vs_budget.png'\n"
            "set title 'Top-32 recall against budget (%s)' noenhanced\n"
            "set ylabel 'top-32 recall (mean over steps t > budget)'\n"
            "plot for [i=1:%zu] '%s/budgets.dat' using 1:(column(2*i+1)) with linespoints "
            "lt i lw 2 title word(names, i) noenhanced\n",
            out, label, n_run, tmpdir);
    fprintf(f,
            "unset logscale x\n"
            "set xtics (16, 32, 48, 64, 80, 96, 128)\n"
            "set xlabel 'h2o recent\\_window'\n"
            "set ylabel 'mean over steps t > 256'\n"
            "set output '%s/h2o_recent_window.png'\n"
            "set title 'H2O recent-window sweep at budget 256, beside streaming'\n"
            "plot '%s/window.dat' using 1:2 with linespoints lw 2 lc 1 title 'h2o retained mass', "
            "%.9f with lines dt 2 lw 2 lc 1 title 'streaming retained mass', "
            "'%s/window.dat' using 1:3 with linespoints lw 2 lc 2 title 'h2o top-32 recall', "
            "%.9f with lines dt 2 lw 2 lc 2 title 'streaming top-32 recall'\n",
            out, tmpdir, s_mass, tmpdir, s_recall);
    fprintf(f,
            "reset\n"
            "set terminal pngcairo size 1000,900 enhanced font 'Sans,11'\n"
            "set output '%s/trace_h2o.png'\n"
            "set title \"%s: attention of step t over key positions, log colour\\n"
            "washed out: positions h2o:budget=%d had evicted when the row arrived\" "
            "noenhanced\n"
            "set xlabel 'step t (query position)'\n"
            "set ylabel 'key position'\n"
            "set logscale cb\n"
            "set cbrange [1e-6:1]\n"
            "set format cb '10^{%%L}'\n"
            "set palette defined (0 '#000004', 1 '#3b0f70', 2 '#8c2981', 3 '#de4968', "
            "4 '#fe9f6d', 5 '#fcfdbf')\n"
            "set xrange [%zu:%zu]\n"
            "set yrange [0:%zu]\n"
            "set object 1 rectangle from graph 0,0 to graph 1,1 behind fc rgb '#ffffff' fs solid\n"
            "plot '%s/att.bin' binary array=(%zu,%zu) dy=%zu format='%%float' origin=(%zu,0) "
            "with image notitle, '%s/mask.bin' binary array=(%zu,%zu) dy=%zu format='%%uchar' "
            "origin=(%zu,0) with rgbalpha notitle\n",
            out, label, PLOT_BUDGET, t0, t1 - 1, P, tmpdir, n_steps, PB, bin, t0, tmpdir, n_steps,
            PB, bin, t0);
    gp_close(f, path);

    int rc = gp_run(path);
    static const char *const tmp_files[] = {"budgets.dat", "window.dat", "att.bin", "mask.bin",
                                            "plot.gp"};
    for (size_t i = 0; i < sizeof tmp_files / sizeof tmp_files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, tmp_files[i]);
        remove(path);
    }
    rmdir(tmpdir);
    free(rec.evicted_at);
    free(h2o);
    if (rc != 0)
        die_input("gnuplot failed (status %d)", rc);
    printf("wrote %s/mass_vs_budget.png, %s/recall_vs_budget.png, %s/h2o_recent_window.png, "
           "%s/trace_h2o.png\n",
           out, out, out, out);
    finish_stdout();
    return 0;
}
