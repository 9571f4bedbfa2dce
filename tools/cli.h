/*
 * cli.h - shared pieces of the kvevict command-line tool.
 *
 * The tool uses only the public header. Exit codes: 0 success, 1 bad input
 * (unreadable or malformed trace, data errors, failed writes), 2 bad usage
 * (unknown subcommand or option, missing or malformed argument, bad policy
 * spec, contradictory options). Every failure prints exactly one line,
 * "kvevict CMD: message", on stderr. Results go to stdout; progress goes to
 * stderr only when it is a terminal and a run has lasted over two seconds.
 */
#ifndef KVE_CLI_H
#define KVE_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvevict.h"

enum { EXIT_INPUT = 1, EXIT_USAGE = 2 };

/* The subcommand being run, for messages ("eval"); "" at top level. */
extern const char *cli_cmd;

/* Print "kvevict CMD: message" on stderr and exit with the code. */
#if defined(__GNUC__)
#define CLI_NORETURN __attribute__((noreturn, format(printf, 1, 2)))
#else
#define CLI_NORETURN
#endif
CLI_NORETURN void die_usage(const char *fmt, ...);
CLI_NORETURN void die_input(const char *fmt, ...);
/* Exit for a failed library call: KVE_EINVAL is usage (the arguments came
 * from the command line), anything else is bad input. */
#if defined(__GNUC__)
__attribute__((noreturn))
#endif
void die_status(kve_status s, const char *what);

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* ---- options (args.c) ------------------------------------------------- */

enum { OPT_MAXREP = 8 };

typedef struct opt_def {
    const char *name; /* long name without "--" */
    char short_name;  /* 0 or a letter for "-x" */
    int takes_value;  /* 1: --name VALUE or --name=VALUE */
    int repeatable;   /* 1: may appear up to OPT_MAXREP times */
} opt_def;

typedef struct opt_val {
    int count;
    const char *v[OPT_MAXREP];
} opt_val;

/* Parses argv[0 .. argc) (the words after the subcommand). "--help"/"-h"
 * anywhere prints `usage` on stdout and exits 0. Unknown options, missing
 * values, values given to flags, repeats of single options and positional
 * words beyond max_pos are usage errors. Positional words are stored in
 * pos[0 .. *n_pos). */
void args_parse(int argc, char **argv, const char *usage, const opt_def *defs, size_t n_defs,
                opt_val *vals, const char **pos, size_t max_pos, size_t *n_pos);

/* Strict decimal: digits only, no sign, no blanks, no overflow, within
 * [min, max]; otherwise a usage error naming `what`. */
uint64_t parse_u64(const char *what, const char *s, uint64_t min, uint64_t max);

/* Splits a comma-separated list into *n fresh strings; empty items are a
 * usage error naming `what`. Free with free_list. */
char **split_list(const char *what, const char *s, size_t *n);
void free_list(char **items, size_t n);

/* The canonical spec of `spec` with its budget set to `budget` (0: as
 * given), in a fresh string; a usage error naming `what` if refused. */
char *canon_spec(const char *what, const char *spec, size_t budget);

/* Opens a trace source; EINVAL (bad canonical spec) is usage, the rest
 * bad input. */
kve_trace *open_trace(const char *src, unsigned flags);

/* Prints a double as a JSON number (%.17g); null when not finite. */
void json_double(FILE *f, double x);
/* Prints a JSON string literal with the needed escapes. */
void json_string(FILE *f, const char *s);

/* Flushes stdout; a write error is bad input (exit 1). */
void finish_stdout(void);

/* ---- tables (table.c) ------------------------------------------------- */

typedef enum { FMT_TEXT, FMT_MD, FMT_CSV } tfmt;

enum { TABLE_MAXCOLS = 16 };

typedef struct table {
    size_t ncols, ncells, cap;
    const char *head[TABLE_MAXCOLS];     /* human header */
    const char *csv_head[TABLE_MAXCOLS]; /* CSV header (snake_case) */
    unsigned left;                       /* bit c: column c left-aligned */
    char **cells;                        /* row-major, ncells of them */
} table;

void table_init(table *t, size_t ncols, const char *const *head, const char *const *csv_head,
                unsigned left);
/* Appends the next cell, row-major. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void table_add(table *t, const char *fmt, ...);
/* TEXT: aligned columns; MD: a markdown table; CSV: comma-separated with
 * the csv header (cells quoted when they hold a comma or quote). */
void table_print(const table *t, FILE *f, tfmt fmt);
void table_free(table *t);

/* ---- evaluation sets (evalset.c) ---------------------------------------- */

/* A set of distinct policy specs evaluated in lockstep over every head of
 * one trace. Renderers ask for results twice: once while collecting (every
 * get registers the spec and returns zeroes) and, after evalset_run, again
 * to print real figures. Results are the mean over heads of retained mass,
 * recall and ns/step, the minimum of min_retained_mass, and the maximum of
 * state_bytes. */
typedef struct evalset {
    int collecting;
    size_t n, cap;
    char **spec;              /* canonical specs, budget included */
    kve_eval_result *res;     /* [n] aggregated over heads */
    kve_eval_result *per_head; /* [heads][n] when keep_heads, else NULL */
    size_t heads, layers;
} evalset;

void evalset_init(evalset *es);
void evalset_free(evalset *es);
/* The result of `spec` at `budget` (0: the spec's). While collecting:
 * registers it and returns zeroes. Invalid spec: usage error. */
const kve_eval_result *evalset_get(evalset *es, const char *spec, size_t budget);
/* Index of a registered spec (for per-head lookups); registers while
 * collecting. */
size_t evalset_index(evalset *es, const char *spec, size_t budget);
/* Evaluates every registered spec on every head of `tr`, then leaves
 * collecting mode. Exits on failure. */
void evalset_run(evalset *es, kve_trace *tr, uint64_t seed, int keep_heads);

/* Progress reporting for kve_eval callbacks (stderr when a terminal). */
typedef struct progress {
    double start;
    double last; /* when the line was last drawn */
    size_t steps, head, heads;
    int shown;
} progress;
void progress_begin(progress *pr, size_t steps, size_t head, size_t heads);
void progress_tick(progress *pr, int32_t pos);
void progress_end(progress *pr);

/* ---- subcommands ---------------------------------------------------------- */

int cmd_eval(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_sweep(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_docs(int argc, char **argv);
int cmd_plot(int argc, char **argv);

/* ---- report renderers shared by bench, sweep and docs (bench.c) ---------- */

#define BENCH_TRACE "canonical"
#define BENCH_SEED 0u

void render_policy_table(FILE *f, evalset *es, size_t budget, tfmt fmt);
void render_h2o_sweep(FILE *f, evalset *es, tfmt fmt);
void render_observations(FILE *f, evalset *es, int markdown);
void render_summary(FILE *f, evalset *es, tfmt fmt);
void render_bench(FILE *f, evalset *es, int markdown, const char *trace_src, uint64_t seed);
/* A stream that discards what is written (for collecting passes). */
FILE *null_sink(void);

/* A sweep grid: base spec, n_keys keys each with its values, and budgets
 * (n_budgets 0: the spec's). Rows iterate budgets outermost, then keys in
 * order with the last key varying fastest. */
typedef struct grid {
    const char *base;
    size_t n_keys;
    const char *key[OPT_MAXREP];
    char **vals[OPT_MAXREP];
    size_t n_vals[OPT_MAXREP];
    size_t n_budgets;
    size_t *budgets;
} grid;

size_t grid_points(const grid *g);
/* The canonical spec of point i (fresh string) and its budget (0: spec's). */
char *grid_spec(const grid *g, size_t i, size_t *budget);
/* Value index of key k at point i. */
size_t grid_val(const grid *g, size_t i, size_t k);
void render_grid(FILE *f, evalset *es, const grid *g, tfmt fmt);

#endif /* KVE_CLI_H */
