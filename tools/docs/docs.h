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

/* ---- committed measurement files (data.c), shared by docs and plot ---- */

/* A JSON Lines file of flat objects (jsonl.h), read whole. */
typedef struct jfile {
    size_t n;
    jrow *rows; /* (n) */
} jfile;

/* Reads `path` (blank lines skipped); a missing, unreadable or empty file,
 * or a malformed line, is bad input ("PATH:LINE: expected ... at column C"). */
void jfile_read(jfile *jf, const char *path);
void jfile_free(jfile *jf);
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

/* ---- gnuplot (gnuplot.c), shared by plot, plot_real.c and perf's figure -- */

/* A fresh directory $TMPDIR/kvevict-plot-XXXXXX for gnuplot's files, its
 * path in buf; exits on failure or a quote in TMPDIR. */
const char *plot_tmpdir(char *buf, size_t cap);
/* s as a gnuplot single-quoted string (a quote doubled, a newline a blank). */
void gp_quote(FILE *f, const char *s);

/* ---- the commands --------------------------------------------------------- */

int cmd_docs(int argc, char **argv); /* cmd_docs.c */
int cmd_plot(int argc, char **argv); /* cmd_plot.c */
/* perf's renderers of docs/performance.md's block and figure (perf_docs.c),
 * handed to perf_main (cmd_perf.c). */
struct perf_renderers;
extern const struct perf_renderers perf_docs_renderers;

#endif /* KVE_DOCS_H */
