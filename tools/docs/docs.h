/* SPDX-License-Identifier: MIT */
/*
 * docs.h - the documentation build tool, kvevict-docs (tools/docs/): what its
 * files share beside the CLI's own pieces (cli.h). It is built in a kvevict
 * checkout and never installed: `kvevict docs`, `kvevict plot` and `kvevict
 * perf --docs/--plot` run it from beside the kvevict binary
 * (source_tree_run). Its commands read and write a checkout's docs/.
 */
#ifndef KVE_DOCS_H
#define KVE_DOCS_H

#include "cli.h"
#include "jsonl.h"

/* ---- committed measurement files (data.c; read by cli.h's jfile_read),
 * shared by docs and plot ---- */

/* The value of `key` in row r as text (a string unescaped, a number's
 * literal, "true", "false", "null"; "null" when absent); the key "spec" is
 * the row's policy without its budget= parameter, written into buf. */
const char *jrow_value(const jrow *r, const char *key, char *buf, size_t cap);

/* "KEY:V1|V2|..." (the row's value is one of them) or "KEY!V1|..." (none),
 * the value as jrow_value reads it (so "KEY!null": KEY present and not
 * null): the where= of docs tables, the --where of `plot --jsonl` and the
 * filters of plot_real.c. filter_parse exits (usage) on another form,
 * naming `what`. */
typedef struct row_filter {
    char *key, *vals;
    int negate;
} row_filter;
void filter_parse(row_filter *flt, const char *what, const char *arg);
void filter_free(row_filter *flt);
/* 1 when r passes every one of the n filters. */
int filters_match(const row_filter *flt, size_t n, const jrow *r);

/* The docs block `table FILE ARG...` (cmd_docs.c documents the arguments):
 * the rows of a JSON Lines file as a markdown table. */
void render_data_table(FILE *f, char *const *args, size_t n_args);
/* `kvevict plot --real-model DIR`: the figures of docs/real-model.md from
 * its data files (plot_real.c). */
void plot_real_model(const char *data_dir, const char *out_dir);
/* `kvevict plot --calibration FILE --png PATH`: the feasibility map of a
 * committed `kvevict trace --calibrate --json` run (plot_calibration.c, on
 * calibrate.h's rows). */
void plot_calibration(const char *file, const char *png);

/* ---- gnuplot (gnuplot.c), shared by plot, plot_real.c and perf's figure -- */

/* A fresh directory $TMPDIR/kvevict-plot-XXXXXX for gnuplot's files, its
 * path in buf; exits on failure or a quote in TMPDIR. */
const char *plot_tmpdir(char *buf, size_t cap);
/* s as a gnuplot single-quoted string (a quote doubled, a newline a blank). */
void gp_quote(FILE *f, const char *s);
/* Exits (bad input) when gnuplot is not installed, naming the package. */
void gp_require(void);
/* Closes f, written at `path`; exits (bad input) when a write failed. */
void gp_close(FILE *f, const char *path);
/* Runs gnuplot on the script at `script` (a path without a quote, as
 * plot_tmpdir's are); returns system()'s status, 0 when it drew. */
int gp_run(const char *script);

/* ---- the commands --------------------------------------------------------- */

int cmd_docs(int argc, char **argv); /* cmd_docs.c */
int cmd_plot(int argc, char **argv); /* cmd_plot.c */
/* perf's renderers of docs/performance.md's block and figure (perf_docs.c),
 * handed to perf_main (cmd_perf.c). */
struct perf_renderers;
extern const struct perf_renderers perf_docs_renderers;

#endif /* KVE_DOCS_H */
