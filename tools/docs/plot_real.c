/* SPDX-License-Identifier: MIT */
/*
 * plot_real.c - `kvevict plot --real-model DIR`: the figures of
 * docs/real-model.md, drawn by gnuplot from the committed data files in DIR
 * (docs/data/real-model/, written by `make real-model`), so a figure shows
 * exactly what the page's tables show.
 *
 *   real_bits_per_byte.png   bits per byte above the full cache against
 *                            budget, every policy, paired standard errors
 *   real_passkey_distance.png  pass-key accuracy against distance at 20%
 *   real_passkey_budget.png  pass-key accuracy (mean over distances)
 *                            against budget
 *   real_passkey_h2o.png     h2o's pass-key accuracy against distance for
 *                            each recent window at 20%
 *   real_stream.png          loss against position over one long decode
 *   real_stream_start.png    the same over the first positions, with the
 *                            full cache, across the training length
 *
 * A figure is a set of series: the rows of a file that pass its filters,
 * grouped by a label built from some keys, with x and y (and an error bar)
 * from others; rows of one series with the same x are averaged. A filter
 * value "@20" stands for the budget at 20% of the context (the budget of
 * eval-h2o.jsonl's rows), so the figures suit any checkpoint; a figure
 * whose files are missing is skipped with a line saying so. Data and the
 * script go to a temporary directory removed afterwards.
 */
#define _POSIX_C_SOURCE 200809L
#include "docs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct figure {
    const char *png, *title, *xlabel, *ylabel;
    int xtics_data; /* x tics at the x values of the data (budgets) */
    const char *files[2]; /* data files in the directory (the second may be NULL) */
    const char *where[3]; /* filters, NULL-terminated */
    const char *label[2]; /* keys whose values name a series: "a" or "a (b)" */
    const char *x, *y, *err;
    const char *extra; /* gnuplot settings for this figure, or NULL */
    double hline;      /* a dashed reference line at this y, NAN for none */
    const char *hline_title;
} figure;

#define CHANCE (1.0 / 64.0)

static const figure figures[] = {
    {"real_bits_per_byte.png", "Held-out bits per byte above the full cache (paired s.e.)",
     "budget (kept positions per layer and KV head)", "bits per byte - full cache", 1,
     {"eval.jsonl", NULL}, {"policy!full", NULL}, {"spec", NULL}, "budget",
     "delta_bits_per_byte", "delta_bits_per_byte_se", "set logscale x 2\n", 0.0, "full cache"},
    {"real_passkey_distance.png", "Pass-key accuracy at 20% of the context",
     "distance from the key to the last token of the question", "exact-match accuracy", 0,
     {"passkey.jsonl", NULL}, {"budget:@20|null", NULL}, {"spec", NULL}, "distance", "accuracy",
     NULL, "set yrange [-0.05:1.05]\n", CHANCE, "chance (1/64)"},
    {"real_passkey_budget.png", "Pass-key accuracy against budget (mean over the distances)",
     "budget (kept positions per layer and KV head)", "exact-match accuracy", 1,
     {"passkey.jsonl", NULL}, {"policy!full", NULL}, {"spec", NULL}, "budget", "accuracy", NULL,
     "set logscale x 2\nset yrange [-0.05:1.05]\n", CHANCE, "chance (1/64)"},
    {"real_passkey_h2o.png", "h2o's pass-key accuracy at 20% of the context, by recent window",
     "distance from the key to the last token of the question", "exact-match accuracy", 0,
     {"passkey-h2o.jsonl", NULL}, {NULL}, {"spec", NULL}, "distance", "accuracy", NULL,
     "set yrange [-0.05:1.05]\n", CHANCE, "chance (1/64)"},
    {"real_stream.png", "Loss against position over one long decode (the text looped)",
     "position (bins of 1024)", "nats per token (mean over the bin)", 0,
     {"stream.jsonl", "stream-cache.jsonl"}, {NULL}, {"spec", "positions"}, "start",
     "nats_per_token", NULL, NULL, NAN, NULL},
    {"real_stream_start.png", "Loss against position over the first positions",
     "position (bins of 128)", "nats per token (mean over the bin)", 0,
     {"stream-start.jsonl", "stream-start-cache.jsonl"}, {NULL}, {"spec", "positions"}, "start",
     "nats_per_token", NULL, NULL, NAN, NULL},
};

static void label_of(const jrow *r, const figure *fg, char *out, size_t cap)
{
    char a[256];
    const char *va = jrow_value(r, fg->label[0], a, sizeof a);
    if (fg->label[1]) {
        char b[256];
        snprintf(out, cap, "%s (%s)", va, jrow_value(r, fg->label[1], b, sizeof b));
    } else {
        snprintf(out, cap, "%s", va);
    }
}

/* Writes figure fg's series to `dat` (one gnuplot index per series) and its
 * plot command to `gp`. */
static int exists(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, R_OK) == 0;
}

/* Writes figure fg's series to tmp/fig<idx>.dat (one gnuplot index per
 * series) and its plot command to `gp`; b20 is the budget at 20%. */
static void write_figure(const figure *fg, const char *dir, const char *tmp, FILE *gp,
                         const char *out_dir, size_t idx, const char *b20)
{
    row_filter flt[3];
    size_t n_flt = 0;
    for (; n_flt < 3 && fg->where[n_flt]; n_flt++) {
        char w[256];
        const char *at = strstr(fg->where[n_flt], "@20");
        if (at)
            snprintf(w, sizeof w, "%.*s%s%s", (int)(at - fg->where[n_flt]), fg->where[n_flt], b20,
                     at + 3);
        else
            snprintf(w, sizeof w, "%s", fg->where[n_flt]);
        filter_parse(&flt[n_flt], "plot", w);
    }
    jfile jf[2];
    size_t n_files = 0;
    char path[4096];
    for (; n_files < 2 && fg->files[n_files]; n_files++) {
        snprintf(path, sizeof path, "%s/%s", dir, fg->files[n_files]);
        jfile_read(&jf[n_files], path);
    }
    /* The series, in order of first appearance across the files. */
    char **labels = NULL;
    size_t n_labels = 0;
    char lab[512], buf[256];
    for (size_t fi = 0; fi < n_files; fi++)
        for (size_t r = 0; r < jf[fi].n; r++) {
            if (!filters_match(flt, n_flt, &jf[fi].rows[r]))
                continue;
            label_of(&jf[fi].rows[r], fg, lab, sizeof lab);
            size_t k = 0;
            while (k < n_labels && strcmp(labels[k], lab) != 0)
                k++;
            if (k == n_labels) {
                labels = xrealloc(labels, (n_labels + 1) * sizeof *labels);
                labels[n_labels++] = xstrdup(lab);
            }
        }
    if (n_labels == 0)
        die_input("%s: no row to plot for %s", dir, fg->png);
    snprintf(path, sizeof path, "%s/fig%zu.dat", tmp, idx);
    FILE *dat = fopen(path, "w");
    if (!dat)
        die_input("%s: cannot create", path);
    for (size_t k = 0; k < n_labels; k++) {
        fprintf(dat, "# %s\n", labels[k]);
        /* x values in order of appearance; y (and err) averaged over rows. */
        double xs[4096], ys[4096], es[4096];
        size_t cnt[4096], nx = 0;
        for (size_t fi = 0; fi < n_files; fi++)
            for (size_t r = 0; r < jf[fi].n; r++) {
                const jrow *row = &jf[fi].rows[r];
                if (!filters_match(flt, n_flt, row))
                    continue;
                label_of(row, fg, lab, sizeof lab);
                if (strcmp(lab, labels[k]) != 0)
                    continue;
                double x = strtod(jrow_value(row, fg->x, buf, sizeof buf), NULL);
                double y = strtod(jrow_value(row, fg->y, buf, sizeof buf), NULL);
                double e = fg->err ? strtod(jrow_value(row, fg->err, buf, sizeof buf), NULL) : 0;
                size_t i = 0;
                while (i < nx && xs[i] != x)
                    i++;
                if (i == nx) {
                    if (nx == 4096)
                        die_input("%s: more than 4096 points in a series", fg->png);
                    xs[nx] = x, ys[nx] = 0, es[nx] = 0, cnt[nx] = 0;
                    nx++;
                }
                ys[i] += y, es[i] += e, cnt[i]++;
            }
        for (size_t i = 0; i < nx; i++)
            fprintf(dat, "%.9g %.9g %.9g\n", xs[i], ys[i] / (double)cnt[i],
                    es[i] / (double)cnt[i]);
        fprintf(dat, "\n\n");
    }
    if (ferror(dat) | fclose(dat))
        die_input("%s: cannot write", path);

    fprintf(gp, "reset\nset terminal pngcairo size 1200,640 enhanced font 'Sans,11'\n"
                "set key outside right top noenhanced\nset grid\n");
    fprintf(gp, "set output '%s/%s'\nset title ", out_dir, fg->png);
    gp_quote(gp, fg->title);
    fprintf(gp, " noenhanced\nset xlabel ");
    gp_quote(gp, fg->xlabel);
    fprintf(gp, "\nset ylabel ");
    gp_quote(gp, fg->ylabel);
    fprintf(gp, "\n");
    if (fg->extra)
        fputs(fg->extra, gp);
    if (fg->xtics_data) { /* the x values of the first series, and a margin */
        double lo = HUGE_VAL, hi = 0;
        fprintf(gp, "set xtics (");
        for (size_t r = 0, k = 0; r < jf[0].n; r++) {
            if (!filters_match(flt, n_flt, &jf[0].rows[r]))
                continue;
            label_of(&jf[0].rows[r], fg, lab, sizeof lab);
            if (strcmp(lab, labels[0]) != 0)
                continue;
            double x = strtod(jrow_value(&jf[0].rows[r], fg->x, buf, sizeof buf), NULL);
            fprintf(gp, "%s%.9g", k++ ? ", " : "", x);
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
        fprintf(gp, ")\nset xrange [%.9g:%.9g]\n", lo / 1.15, hi * 1.15);
    }
    fprintf(gp, "plot ");
    for (size_t k = 0; k < n_labels; k++) {
        fprintf(gp, "%s'%s' index %zu using 1:2%s with %s lt %zu lw 2 title ", k ? ", \\\n  " : "",
                path, k, fg->err ? ":3" : "", fg->err ? "yerrorlines" : "linespoints", k + 1);
        gp_quote(gp, labels[k]);
    }
    if (!isnan(fg->hline)) {
        fprintf(gp, ", \\\n  %.9g with lines dt 2 lw 1 lc rgb '#000000' title ", fg->hline);
        gp_quote(gp, fg->hline_title ? fg->hline_title : "");
    }
    fprintf(gp, "\n");
    for (size_t k = 0; k < n_labels; k++)
        free(labels[k]);
    free(labels);
    for (size_t fi = 0; fi < n_files; fi++)
        jfile_free(&jf[fi]);
    for (size_t i = 0; i < n_flt; i++)
        filter_free(&flt[i]);
}

void plot_real_model(const char *dir, const char *out)
{
    if (strpbrk(dir, "'\"\n"))
        die_usage("--real-model: quotes and newlines are not supported in '%s'", dir);
    char tmpl[4096];
    const char *tmp = plot_tmpdir(tmpl, sizeof tmpl);
    char path[4096], script[4096];
    snprintf(script, sizeof script, "%s/plot.gp", tmp);
    FILE *gp = fopen(script, "w");
    if (!gp)
        die_input("%s: cannot create", script);
    /* The budget at 20% of the context: that of the h2o sweep's rows. */
    char b20[64] = "none";
    if (exists(dir, "eval-h2o.jsonl")) {
        char buf[256];
        jfile e;
        snprintf(path, sizeof path, "%s/eval-h2o.jsonl", dir);
        jfile_read(&e, path);
        for (size_t r = 0; r < e.n && strcmp(b20, "none") == 0; r++) {
            const char *v = jrow_value(&e.rows[r], "budget", buf, sizeof buf);
            if (strcmp(v, "null") != 0)
                snprintf(b20, sizeof b20, "%s", v);
        }
        jfile_free(&e);
    }
    fprintf(gp, "set datafile commentschars '#'\n"
                "set linetype 1 lc rgb '#1f77b4' pt 5\nset linetype 2 lc rgb '#ff7f0e' pt 7\n"
                "set linetype 3 lc rgb '#2ca02c' pt 9\nset linetype 4 lc rgb '#d62728' pt 11\n"
                "set linetype 5 lc rgb '#9467bd' pt 13\nset linetype 6 lc rgb '#8c564b' pt 4\n"
                "set linetype 7 lc rgb '#e377c2' pt 6\nset linetype 8 lc rgb '#7f7f7f' pt 8\n"
                "set linetype 9 lc rgb '#17becf' pt 10\nset linetype 10 lc rgb '#bcbd22' pt 12\n"
                "set linetype 11 lc rgb '#000000' pt 1\nset linetype 12 lc rgb '#aec7e8' pt 2\n"
                "set linetype cycle 12\n");
    size_t n = sizeof figures / sizeof figures[0];
    int drawn[sizeof figures / sizeof figures[0]];
    for (size_t i = 0; i < n; i++) {
        const figure *fg = &figures[i];
        drawn[i] = exists(dir, fg->files[0]) && (!fg->files[1] || exists(dir, fg->files[1]));
        if (!drawn[i])
            continue;
        fprintf(gp, "# %s\n", fg->png);
        write_figure(fg, dir, tmp, gp, out, i, b20);
        fprintf(gp, "\n");
    }
    gp_close(gp, script);
    int rc = gp_run(script);
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/fig%zu.dat", tmp, i);
        remove(path); /* absent for a skipped figure */
    }
    remove(script);
    rmdir(tmp);
    if (rc != 0)
        die_input("gnuplot failed (status %d)", rc);
    for (size_t i = 0; i < n; i++)
        if (drawn[i])
            printf("wrote %s/%s\n", out, figures[i].png);
        else
            printf("skipped %s: %s has no %s%s%s\n", figures[i].png, dir, figures[i].files[0],
                   figures[i].files[1] ? " or " : "", figures[i].files[1] ? figures[i].files[1] : "");
    finish_stdout();
}
