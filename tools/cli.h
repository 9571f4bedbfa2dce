/* SPDX-License-Identifier: MIT */
/*
 * cli.h - shared pieces of the kvevict command-line tool.
 *
 * The tool uses only the public header. Conventions every subcommand follows
 * (docs/cli.md is the user's version):
 *  - Exit codes: 0 success, 1 bad input (unreadable or malformed trace, data
 *    errors, failed writes, I/O errors with the system's reason), 2 bad usage
 *    (unknown subcommand or option, missing or malformed argument, bad policy
 *    spec, contradictory options). A run stopped by SIGINT/SIGTERM/SIGHUP
 *    dies of that signal, leaving no file it was writing.
 *  - Every failure prints exactly one line, "kvevict CMD: message", on
 *    stderr; warnings are "kvevict CMD: warning: message". Results go to
 *    standard output or -o FILE; progress goes to stderr only when it is a
 *    terminal, the work has lasted over two seconds and --quiet is not given.
 *  - --budget is B positions or P% of a whole the command names (a trace's
 *    steps, a model's context), the same syntax everywhere.
 *  - Output: --format text|md|csv|json (shorthands --json, --csv, --md,
 *    --markdown); JSON is JSON Lines, one object per result row, with the
 *    same key for the same quantity everywhere (KEY_* below). A metric over
 *    no scored step is null in JSON and n/a in tables, with a warning.
 *  - "-" names standard output (-o) or standard input (--trace).
 *
 * A new subcommand: one file tools/cmd_NAME.c with `int cmd_NAME(int, char
 * **)`, a cli_spec naming the shared options it takes (parsed and checked
 * once by cli_parse) and its own, one line in the table of kvevict.c, one
 * word in tools/CMakeLists.txt (a new `lm` command: tools/lm/, lm_cli.h and
 * the table of lm/cmd_lm.c; a source-tree command: tools/docs/, docs.h).
 * Results go through out_open/out_close and the table or json_result
 * helpers, so formats and keys stay the same. A new trace source of the
 * tool's own is one file and one line of traces.c's tool_sources.
 */
#ifndef KVE_CLI_H
#define KVE_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvevict_eval.h"
#include "jsonl.h"

enum { EXIT_INPUT = 1, EXIT_USAGE = 2 };

/* ---- errors, memory, temporary files, signals (errors.c) ---------------- */

/* The subcommand being run, for messages ("eval"); "" at top level. */
extern const char *cli_cmd;
/* The program messages name: "kvevict" (kvevict-llama sets its own). */
extern const char *cli_program;

#if defined(__GNUC__)
#define CLI_NORETURN __attribute__((noreturn, format(printf, 1, 2)))
#define CLI_PRINTF __attribute__((format(printf, 1, 2)))
#else
#define CLI_NORETURN
#define CLI_PRINTF
#endif
/* Print "kvevict CMD: message" on stderr, remove any file being written,
 * and exit with the code. */
CLI_NORETURN void die_usage(const char *fmt, ...);
CLI_NORETURN void die_input(const char *fmt, ...);
/* "kvevict CMD: warning: message" on stderr; the run goes on. */
CLI_PRINTF void warn(const char *fmt, ...);
/* Exit for a failed library call, with the library's message in the CLI's
 * words (flags named as options): KVE_EINVAL is usage (the arguments came
 * from the command line), anything else bad input. `what` prefixes the
 * message unless NULL. */
#if defined(__GNUC__)
__attribute__((noreturn))
#endif
void die_status(kve_status s, const char *what);

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* The first n bytes of s (fewer if s is shorter), NUL-terminated. */
char *xstrndup(const char *s, size_t n);

/* Flushes standard output; a write error is bad input (exit 1). */
void finish_stdout(void);

/* Temporary files registered at once (so, output files open at once). */
enum { MAX_TEMPS = 4 };
/* Creates a temporary file from `template` (ending in XXXXXX, rewritten in
 * place with letters and digits; at most PATH_MAX bytes) that is removed on
 * failure or signal until temp_forget; returns its descriptor (read and
 * write), or -1 with errno set. The file holds an exclusive flock from
 * before its name exists where the system allows (Linux: O_TMPFILE, locked,
 * then linked under the name), else from just after mkstemp made it: so a
 * sweep of stale temporaries (output.c), which removes only files whose
 * lock it can take, never removes a live one. */
int temp_create(char *template);
void temp_forget(const char *path);
/* The directory of `path` ("." for a bare name, "/" for one at the root)
 * into dir[0 .. cap), truncated to fit. */
void path_dir(const char *path, char *dir, size_t cap);
/* Removes every temporary file still registered (die_* call it). */
void temp_remove_all(void);

/* Installs the SIGINT/SIGTERM/SIGHUP handler that removes the files being
 * written, then dies of the signal (signals ignored at start stay ignored),
 * and the SIGBUS handler: it removes them too and exits 1 with one line,
 * which names the model file when the fault lies in a mapping
 * cli_watch_mapping registered (the file cut short or replaced under the
 * run), and is a plain bus error otherwise. */
void cli_signals_install(void);
/* Registers [base, base + size), the mapping of the model file `path`
 * (copied), for the SIGBUS handler; up to 8 (more are not named). A
 * mapping stays registered until exit. */
void cli_watch_mapping(const void *base, size_t size, const char *path);
/* Set while a progress line is on stderr (output.c), for the handler to erase. */
extern volatile sig_atomic_t cli_progress_shown;

/* ---- options (args.c) ------------------------------------------------- */

typedef enum { FMT_TEXT, FMT_MD, FMT_CSV, FMT_JSON } tfmt;

enum { OPT_VALUE = 1u, OPT_REPEAT = 2u };
enum { OPT_MAXREP = 8, CLI_MAX_OWN = 32, CLI_MAX_POS = 1024, CLI_MAX_BUDGETS = 64 };

typedef struct opt_def {
    const char *name; /* long name without "--" */
    char short_name;  /* 0 or a letter for "-x" */
    unsigned flags;   /* OPT_VALUE: --name VALUE or --name=VALUE; OPT_REPEAT */
} opt_def;

typedef struct opt_val {
    int count;
    const char *v[OPT_MAXREP];
} opt_val;

/* The options several subcommands share. A subcommand names the ones it
 * takes; cli_parse parses and checks them once, into cli_args. */
enum {
    SO_TRACE = 1u << 0,     /* --trace SRC ("-": a .npy on standard input) */
    SO_POLICY = 1u << 1,    /* --policy SPEC (checked with kve_spec_with) */
    SO_BUDGET = 1u << 2,    /* --budget B, 1 .. KVE_MAX_BUDGET, or P% (parse_budget) */
    SO_BUDGETS = 1u << 3,   /* --budget B1,B2,... (repeatable; each as SO_BUDGET) */
    SO_SEED = 1u << 4,      /* --seed N */
    SO_NORMALIZE = 1u << 5, /* --normalize */
    SO_TOPK = 1u << 6,      /* --topk K, 1 .. KVE_MAX_BUDGET */
    SO_HEAD = 1u << 7,      /* --head N */
    SO_FORMAT = 1u << 8,    /* --format F, --json, --csv, --md, --markdown */
    SO_OUTPUT = 1u << 9,    /* -o FILE, --output FILE ("-": standard output) */
    SO_QUIET = 1u << 10     /* --quiet: no progress line (cli_quiet) */
};

typedef struct cli_spec {
    const char *usage;   /* printed by --help */
    unsigned shared;     /* SO_* the command takes */
    unsigned required;   /* SO_* it requires */
    const opt_def *own;  /* its own options */
    size_t n_own;
    size_t max_pos;      /* positional words it takes (<= CLI_MAX_POS) */
    tfmt default_format; /* without a format option */
} cli_spec;

/* A cli_spec's own options: .own and .n_own from one array, so the count is
 * never written by hand (a count that lags its table hides options). */
#define CLI_OWN(table) .own = (table), .n_own = sizeof(table) / sizeof((table)[0])

typedef struct cli_args {
    /* shared options, checked; defaults when absent */
    const char *trace;     /* NULL when absent */
    unsigned trace_flags;  /* KVE_TRACE_NORMALIZE with --normalize */
    const char *policy;    /* NULL when absent */
    size_t budget;         /* the (first) budget, 0 when absent */
    size_t n_budgets;      /* with SO_BUDGETS */
    size_t budgets[CLI_MAX_BUDGETS]; /* 0 for a percentage until cli_resolve_budgets */
    double budget_pct[CLI_MAX_BUDGETS]; /* P of a budget given as P%, else 0 */
    int budgets_relative;  /* some budget is a percentage, not yet resolved */
    uint64_t seed;         /* 0 */
    size_t topk;           /* 32 */
    int topk_given;        /* --topk was given: JSON says "topk" */
    size_t head;           /* 0 */
    int head_given;        /* --head was given */
    tfmt format;
    const char *output;    /* NULL or "-": standard output */
    /* the command's own options, index-aligned with cli_spec.own */
    opt_val own[CLI_MAX_OWN];
    const char *pos[CLI_MAX_POS];
    size_t n_pos;
} cli_args;

/* Parses argv[0 .. argc) (the words after the subcommand) against `spec`.
 * "--help"/"-h" anywhere prints the usage on stdout and exits 0. Unknown
 * options, missing values, values given to flags, repeats of single
 * options, contradictory formats, malformed numbers and specs, and
 * positional words beyond max_pos are usage errors (exit 2). */
void cli_parse(cli_args *a, const cli_spec *spec, int argc, char **argv);
/* The values of own option `name` (which must be in the spec's table). */
const opt_val *cli_own(const cli_args *a, const cli_spec *spec, const char *name);

/* Strict decimal: digits only, no sign, no blanks, no overflow, within
 * [min, max]; otherwise a usage error naming `what`. */
uint64_t parse_u64(const char *what, const char *s, uint64_t min, uint64_t max);
/* A comma-separated list of budgets (KVE_MAX_BUDGET at most each) into
 * out[0 .. *n), at most cap of them; usage errors name `what`. Counts only
 * (the docs' blocks); --budget is parse_budget's. */
void parse_budgets(const char *what, const char *s, size_t *out, size_t cap, size_t *n);
/* A budget as every command's --budget is written: B, a count of positions
 * (1 .. KVE_MAX_BUDGET), or P%, 0 < P <= 100, a share of a whole the command
 * names (a trace's steps T; a model's context). Returns B, or 0 with
 * *percent = P. Usage errors name `what`. */
size_t parse_budget(const char *what, const char *s, double *percent);
/* P% of `whole` positions, floor(P * whole / 100), for the budget written
 * `s`; a usage error naming `what` and `of` ("the context") when that is no
 * position. */
size_t budget_of_whole(const char *what, const char *s, double percent, size_t whole,
                       const char *of);
/* Turns a's budgets given as percentages into positions of `whole` (`of`
 * names it: "the trace's steps"); a->budget follows the first. */
void cli_resolve_budgets(cli_args *a, size_t whole, const char *of);

/* A finite decimal number (strtod syntax without hex, inf or nan) within
 * [min, max]; otherwise a usage error naming `what`. */
double parse_real(const char *what, const char *s, double min, double max);
/* Splits a comma-separated list into *n fresh strings; empty items are a
 * usage error naming `what`. Free with free_list. */
char **split_list(const char *what, const char *s, size_t *n);
/* The items of every value of a list option that may be repeated, in the
 * order given: `--x A,B --x C` is A, B, C (split_list on each value; NULL
 * and *n = 0 when the option is absent). Free with free_list. The one
 * reading of every list option (OPT_REPEAT), so that each takes both forms. */
char **split_lists(const char *what, const opt_val *v, size_t *n);
void free_list(char **items, size_t n);

/* The canonical spec of `spec` with its budget set to `budget` (0: as
 * given), in a fresh string; a usage error naming `what` if refused. */
char *canon_spec(const char *what, const char *spec, size_t budget);

/* What a policy reads (kve_reads) as `policies` prints it: "nothing",
 * "attention", "keys", or the '+'-joined list when it reads several
 * ("keys+queries+values"). A static string. */
const char *reads_label(unsigned reads);

/* ---- output files, progress (output.c) ------------------------------- */

/* The stream for results: standard output for NULL or "-", else a fresh
 * temporary file beside `path` (created now, so an unwritable path fails
 * before any long work), synced and renamed into place by out_close. Until
 * then it is removed on any failure or signal: no partial file is ever left
 * under `path`, except for the two kinds of file written in place (a device
 * or FIFO; a hard-linked file, copied into once the temporary is whole:
 * output.c says what a crash during that copy leaves). */
FILE *out_open(const char *path);
/* out_open for a file only its owner should read (a session: the whole
 * conversation): a new file is 0600; an existing one keeps its mode. */
FILE *out_open_private(const char *path);
/* A session file held for the run that resumes and saves it: an existing
 * one is locked (flock, kept until exit; another run holding it is exit 1,
 * "in use by another run"); returns 1 when it exists, 0 when it does not
 * yet. session_check, before the save: the name still names the file held
 * (or still none), else exit 1 naming it (another run saved first: this
 * run's continuation is not written over it). */
int session_hold(const char *path);
void session_check(const char *path);
/* Replaces what lies between the lines "<!-- NAME:begin -->" and
 * "<!-- NAME:end -->" of the file at `path` with `block` (through out_open,
 * so a failure leaves the file whole); dies (input error, the option --docs
 * named) when the file has no such block. */
void rewrite_block(const char *path, const char *name, const char *block);
/* Flushes, checks and commits what out_open gave: fsync of the temporary,
 * its rename, fsync of the directory (a hard-linked file: fsync of the
 * temporary, its bytes copied in place, fsync of the file); a write error is
 * bad input (exit 1) with the system's reason. */
void out_close(FILE *f);

/* A "\r"-updated line on stderr while long work runs, drawn only when
 * stderr is a terminal, the command has run over two seconds and it was
 * not given --quiet (cli_quiet). */
extern int cli_quiet;
typedef struct progress {
    const char *what; /* "step", "row", ... */
    uint64_t total;
    size_t head, heads; /* shown as "head h/H" when heads > 1 */
    double last;        /* when the line was last drawn */
    uint64_t next;      /* the work done at which to read the clock again */
    int shown;
} progress;
void progress_begin(progress *pr, const char *what, uint64_t total, size_t head, size_t heads);
void progress_update(progress *pr, uint64_t done);
void progress_end(progress *pr);
/* A kve_progress_fn over a progress (user); never asks to stop. */
int progress_callback(void *user, uint64_t done, uint64_t total);

/* ---- traces (traces.c) -------------------------------------------------- */

/* Opens --trace (a source text; "-": a .npy file read from standard input
 * into a temporary file removed once opened; "lm:...": a model's attention,
 * lm_trace_open), with progress while a large file is validated. Errors
 * exit (usage for a bad canonical or lm: spec). */
kve_trace *open_trace(const cli_args *a);
/* open_trace, then with --budget P% the budgets resolved against the
 * trace's steps (in a) and *spec, --policy's canonical spec made before
 * (canon_spec), re-made at the resolved budget. */
kve_trace *open_trace_resolved(cli_args *a, char **spec);
/* The name the user gave the trace: "-" for standard input, the lm: source
 * for a model's attention, else kve_trace_source. */
const char *trace_name(const kve_trace *tr);
/* Records that the live trace `tr` (source "callback") is called `name`
 * (for trace_name). */
void trace_alias(const kve_trace *tr, const char *name);
/* The source "lm:model=CKPT,text=FILE[,tokenizer=TOK][,steps=T][,window=W]
 * [,heads=kv|query]": the model's full-cache attention over window W of the
 * text as `kvevict lm dump` writes it, streamed from the decoder as the trace
 * is read (lm_trace_new; tools/lm/lm_trace.c). Errors exit. */
kve_trace *lm_trace_open(const char *src, unsigned flags);

/* ---- JSON (output.c) ----------------------------------------------------- */

/* A double as a JSON number (%.17g); null when not finite. */
void json_double(FILE *f, double x);
/* A JSON string literal with the needed escapes. */
void json_string(FILE *f, const char *s);

/* ---- committed JSON Lines files (jfile.c) ------------------------------- */

/* A JSON Lines file of flat objects (jsonl.h), read whole. */
typedef struct jfile {
    size_t n;
    jrow *rows; /* (n) */
} jfile;

/* Reads `path` (blank lines skipped); a missing, unreadable or empty file,
 * or a malformed line, is bad input ("PATH:LINE: expected ... at column C"). */
void jfile_read(jfile *jf, const char *path);
void jfile_free(jfile *jf);

/* ---- tables (table.c) ------------------------------------------------- */

enum {
    COL_TEXT = 1u,  /* shown in text and markdown */
    COL_CSV = 2u,   /* a CSV column */
    COL_JSON = 4u,  /* a JSON key (table_print FMT_JSON) */
    COL_ALL = 7u,
    COL_LEFT = 8u,  /* left-aligned in text and markdown */
    COL_CODE = 16u  /* `quoted` in markdown (specs) */
};
enum { TABLE_MAXCOLS = 32 };

typedef struct col {
    const char *head; /* human header (text, markdown) */
    const char *key;  /* snake_case: CSV header, JSON key */
    unsigned flags;
} col;

typedef struct cell {
    char *text;    /* as shown in text and markdown */
    char *machine; /* as written in CSV and JSON: full precision, "null" for NaN */
    int number;    /* machine is a JSON number (or null), not a string */
} cell;

typedef struct table {
    size_t ncols, ncells, cap;
    col cols[TABLE_MAXCOLS];
    cell *cells; /* row-major, ncells of them */
} table;

void table_init(table *t, const col *cols, size_t ncols);
/* Appends the next cell, row-major. */
void table_str(table *t, const char *s);
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void table_fmt(table *t, const char *fmt, ...);
void table_uint(table *t, uint64_t v);
/* A real shown with `shown` (a printf format for one double, e.g. "%.4f"),
 * written in full (%.17g) to CSV and JSON; NaN shows n/a (null in JSON). */
void table_real(table *t, double x, const char *shown);
/* As table_real, but CSV and JSON get the shown text too (a value given as
 * written, e.g. a compression ratio 0.9, not 0.90000000000000002); `shown`
 * must print a number. */
void table_real_shown(table *t, double x, const char *shown);
/* TEXT: aligned columns; MD: a markdown table; CSV: RFC 4180 with the keys
 * as header; JSON: one object per row (JSON Lines). */
void table_print(const table *t, FILE *f, tfmt fmt);
void table_free(table *t);

/* ---- result rows (results.c) -------------------------------------------- */

/* The keys of result rows: the same key for the same quantity in every
 * subcommand (docs/cli.md lists them). */
#define KEY_POLICY "policy"
#define KEY_TRACE "trace"
#define KEY_BUDGET "budget"
#define KEY_HEADS "heads"
#define KEY_LAYERS "layers"
#define KEY_LAYER "layer"
#define KEY_THREADS "threads"
#define KEY_STEPS "steps"
#define KEY_SCORED "scored_steps"
#define KEY_SEED "seed"
#define KEY_TOPK "topk"
#define KEY_RECALL32 "top32_recall"  /* the recall at k = 32, in every row */
#define KEY_TOPK_RECALL "topk_recall" /* the recall at --topk K, beside "topk": K */
#define KEY_MASS "retained_mass"
#define KEY_MIN_MASS "min_retained_mass"
#define KEY_NS "ns_per_step"
#define KEY_STATE "state_bytes"
#define KEY_FLOOR_NS "floor_ns_per_step"
#define KEY_RATIO "ratio_to_floor"

/* What every result row of one run shares. */
typedef struct result_ctx {
    const char *trace; /* trace_name */
    uint64_t seed;
    size_t heads, layers;
    size_t topk;    /* k of the recall column */
    int topk_given; /* print "topk" in JSON */
    int timings;    /* tables show ns/step (never in the docs' blocks) */
} result_ctx;

void result_ctx_init(result_ctx *c, const cli_args *a, const kve_trace *tr);
/* The key of the recall a table shows: top32_recall, or topk_recall with
 * --topk (whose k is then "topk"). */
const char *recall_key(const result_ctx *c);
/* The recall of r at the context's k (top32_recall when k = 32). */
double recall_of(const result_ctx *c, const kve_eval_result *r);
/* `{"policy": ..., "trace": ..., "budget", "steps", "scored_steps",
 * "heads", "layers", "seed"[, "topk"]` without the closing brace. */
void json_result_begin(FILE *f, const result_ctx *c, const kve_eval_result *r);
/* `"retained_mass": x, "top32_recall": y[, "topk_recall": y_k],
 * "min_retained_mass": z, "ns_per_step": w, "state_bytes": n` (no leading
 * comma; topk_recall with --topk). */
void json_metrics(FILE *f, const result_ctx *c, const kve_eval_result *r);
/* One whole row: begin, ", ", metrics, "}\n". */
void json_result(FILE *f, const result_ctx *c, const kve_eval_result *r);

/* The standard columns of a result row (after whatever columns the caller
 * put first): retained mass, top-K recall, min mass, ns/step (when
 * c->timings), state bytes, then the CSV-only context columns. */
size_t result_cols(col *cols, size_t n, const result_ctx *c);
void result_cells(table *t, const result_ctx *c, const kve_eval_result *r);

/* ---- budgets across heads and layers (budgets.c) ------------------------- */

/* The options of docs/budgets.md, shared by `kvevict eval` (traces) and the
 * measuring `kvevict lm` commands (the model): BUDGET_OPTS in a command's own
 * table, budget_args_parse after cli_parse. */
#define BUDGET_OPTS                                                                                \
    {"share-heads", 0, 0}, {"min-share", 0, OPT_VALUE}, {"schedule", 0, OPT_VALUE},                \
        {"beta", 0, OPT_VALUE}, {"calibration", 0, OPT_VALUE},                                     \
    {                                                                                              \
        "calibration-window", 0, OPT_VALUE                                                         \
    }
#define BUDGET_USAGE                                                                               \
    "  --share-heads       each layer's KV heads share one budget, heads x budget\n"             \
    "                      (Ada-KV: the layer's lowest scores go; docs/budgets.md)\n"             \
    "  --min-share F       with --share-heads: no head keeps less than F of an even\n"           \
    "                      share, nor less than its recent window (default 0.2)\n"               \
    "  --schedule S        uniform (default), pyramid (PyramidKV) or attention: the\n"          \
    "                      total, layers x budget, split over the layers\n"                     \
    "  --beta B            pyramid: the top layer gets 1/B of the mean (default 20)\n"          \
    "  --calibration SRC   attention: each layer weighted by the attention mass it\n"           \
    "                      puts beyond the newest W keys, measured on SRC\n"                    \
    "  --calibration-window W   that W (default 32)\n"

typedef struct budget_args {
    int given;                  /* some budgets option was given: rows carry its columns */
    int share_heads;            /* --share-heads */
    double min_share;           /* --min-share (0.2) */
    kve_schedule_kind schedule; /* --schedule */
    const char *schedule_name;  /* "uniform", "pyramid", "attention" */
    double beta;                /* --beta (20) */
    const char *calibration;    /* --calibration, NULL unless attention */
    size_t calibration_window;  /* --calibration-window (32) */
} budget_args;

void budget_args_parse(budget_args *b, const cli_args *a, const cli_spec *spec);
/* Appends the budgets columns (schedule, share, layer budgets) when given. */
size_t budget_cols(col *cols, size_t n, const budget_args *b);
/* Their cells: the layer budgets L of them, "a,b,c". */
void budget_cells(table *t, const budget_args *b, const size_t *layer_budgets, size_t L);
/* The statistic of --schedule attention on a trace of L layers (layer-major
 * heads): per layer, the mean over steps t > window and the layer's heads of
 * the mass on keys older than t - window. Errors exit. */
void trace_layer_spread(kve_trace *tr, size_t window, double *out);
/* `kvevict eval` with budgets options: the trace's layers evaluated one by
 * one, each a bank of its heads at its budget (budgets.c). */
void eval_budgets(FILE *out, const cli_args *a, const budget_args *b, int per_head,
                  size_t score_after);

/* ---- evaluation sets (evalset.c) ---------------------------------------- */

/* A set of distinct policy specs evaluated in lockstep over every head of
 * one trace. Renderers ask for results twice: once while collecting (every
 * get registers the spec and returns zeroes) and, after evalset_run, again
 * to print real figures. Results are the mean over heads of retained mass,
 * recall and ns/step, the minimum of min_retained_mass, and the maximum of
 * state_bytes. */
typedef struct evalset {
    int collecting;
    int quiet;                 /* no progress line and no warning (worker threads) */
    size_t n, cap;
    char **spec;               /* canonical specs, budget included */
    kve_eval_result *res;      /* [n] aggregated over heads */
    kve_eval_result *per_head; /* [heads][n] when keep_heads, else NULL */
    size_t heads, layers;
    size_t key_dim;            /* the trace's keys (kve_trace_key_dim); set before collecting */
} evalset;

void evalset_init(evalset *es);
/* Whether registered policy type i can run on the set's trace: every type
 * but those that read keys, which need a trace with keys. The renderers that
 * list every policy list these. */
int evalset_runs(const evalset *es, size_t type);
void evalset_free(evalset *es);
/* The result of `spec` at `budget` (0: the spec's). While collecting:
 * registers it and returns zeroes. Invalid spec: usage error. */
const kve_eval_result *evalset_get(evalset *es, const char *spec, size_t budget);
/* Index of a registered spec (for per-head lookups); registers while
 * collecting. */
size_t evalset_index(evalset *es, const char *spec, size_t budget);
/* Evaluates every registered spec on every head of `tr` (seed and topk from
 * `a`), then leaves collecting mode, warning once per budget at which no
 * step is scored. Exits on failure. */
void evalset_run(evalset *es, kve_trace *tr, const cli_args *a, int keep_heads);
/* One warning per budget at which no step of a trace of `steps` steps is
 * scored (evalset_run gives them; merge gives them again). */
void evalset_warn_unscored(const evalset *es, size_t steps);

/* ---- the sweep grid (grid.c), shared by sweep and docs ------------------ */

/* A grid: base spec, n_keys keys each with its values, and budgets
 * (n_budgets 0: the spec's). Points iterate budgets outermost, then keys in
 * order with the last key varying fastest. */
typedef struct grid {
    const char *base;
    size_t n_keys;
    char *key[OPT_MAXREP];
    char **vals[OPT_MAXREP];
    size_t n_vals[OPT_MAXREP];
    size_t n_budgets;
    size_t budgets[CLI_MAX_BUDGETS];
} grid;

enum { GRID_MAX_POINTS = 4096 };

void grid_init(grid *g, const char *base);
/* Adds "KEY=V1,V2,..." (usage errors name `what`); KEY budget is refused
 * when budgets were set, and the other way round. */
void grid_add_param(grid *g, const char *what, const char *arg);
void grid_set_budgets(grid *g, const size_t *budgets, size_t n);
/* Checks the base spec alone (an error no budget mends is a usage error
 * naming --policy), the size (at most GRID_MAX_POINTS) and every point's
 * spec (naming --param or --budget). */
void grid_check(const grid *g);
size_t grid_points(const grid *g);
/* The canonical spec of point i (fresh string). */
char *grid_spec(const grid *g, size_t i);
/* Value index of key k at point i. */
size_t grid_val(const grid *g, size_t i, size_t k);
void grid_free(grid *g);
/* The grid as a table (every format but JSON) or JSON Lines with
 * "params": {KEY: "VALUE", ...}. */
void render_grid(FILE *f, evalset *es, const grid *g, const result_ctx *c, tfmt fmt);

/* The "params" object of grid point i: {"KEY": "VALUE", ...}. */
void json_params(FILE *f, const grid *g, size_t i);

/* ---- shards (shard.c): one grid split across processes or machines ------- */

/* Shard `index` of `count` runs the jobs j of a grid (enumerated in a fixed
 * order) with j % count == index, and writes one JSON line per job carrying
 * the whole job: the run it belongs to, its index, its result. `kvevict
 * merge` reads the shards back into what the unsharded run prints. A job's
 * result depends on the job alone (the harness seeds every job from --seed),
 * never on the shard or the jobs beside it. */
typedef struct shard {
    size_t index, count; /* count 0: not sharded */
} shard;

/* "I/N" (--shard): 0 <= I < N, plain decimal; usage errors otherwise. */
void shard_parse(shard *s, const char *arg);
/* Refuses (usage) more shards than the grid's `jobs`. */
void shard_check(const shard *s, size_t jobs);
/* Job j belongs to shard s (always, unsharded). */
int shard_has(const shard *s, size_t job);
/* The run's description, a JSON object (fresh string): command, the trace
 * and policy as given, the --param words (NULL: none), budgets, seed, topk
 * (null unless given), normalize and, for bench, the trace's key dimension
 * (it decides which policies the report runs). Equal texts mean the same
 * grid. */
char *shard_run(const char *command, const cli_args *a, const char *trace, size_t key_dim,
                const char *policy,
                const opt_val *params);
/* One shard line: the keys of the unsharded JSON row (with "topk" always,
 * and "params" of grid point `job` when g is not NULL), then "shard": "I/N",
 * "job", "jobs" and "run". */
void shard_line(FILE *f, const shard *s, size_t job, size_t jobs, const char *run,
                const result_ctx *c, const kve_eval_result *r, const grid *g);

/* ---- the claims of the H2O page (claims.c), judged on an evalset ---------- */

/* The six claims of the H2O page (docs/policies/h2o.md, "Claims, checked"),
 * each judged on an evalset: OBS_HOLDS, OBS_FAILS, or OBS_NOT_JUDGED when a
 * figure it needs is a mean over no scored step. */
enum { N_OBS = 6 };
enum { OBS_NOT_JUDGED = -1, OBS_FAILS = 0, OBS_HOLDS = 1 };
extern const char *const obs_claims[N_OBS];
/* Judges every claim into outcome[], printing each with its figures to f
 * (markdown list or text) unless f is NULL. `calibrated` (is_calibrated_trace):
 * the trace is one whose sink_mass was fitted on it, so claim 6 is the fit
 * ("fitted"), not a check. */
void judge_observations(FILE *f, evalset *es, int markdown, int calibrated, int outcome[N_OBS]);
/* judge_observations for a trace given by its source text. */
void render_observations(FILE *f, evalset *es, int markdown, const char *trace);
/* Which fit the source names: 3, the default canonical trace (version 3,
 * calibrated: docs/trace.md, "Calibration, version 3"); 2, version 2's
 * default (its sink_mass fitted); 0, neither. */
int is_calibrated_trace(const char *src);

/* The claims' budgets and bench's default budgets: 256 and 512. */
extern const size_t bench_default_budgets[2];
/* The recent windows of the page's sweep (claim 3; bench's h2o sweep). */
enum { N_CLAIM_WINDOWS = 7 };
extern const size_t claim_windows[N_CLAIM_WINDOWS];
/* The result of h2o:recent_window=w at `budget` in es (registers it while
 * collecting). */
const kve_eval_result *h2o_window(evalset *es, size_t w, size_t budget);

/* ---- the benchmark report (cmd_bench.c), shared with docs --------------- */

#define BENCH_TRACE "canonical"
#define BENCH_SEED 0u
#define H2O_PAGE "docs/policies/h2o.md"
/* The committed model and its held-out text, relative to a checkout. */
#define BENCH_MODEL "models/kjv.bin"
#define BENCH_MODEL_TEXT "models/heldout.txt"
#define BENCH_MODEL_TRACE "lm:model=" BENCH_MODEL ",text=" BENCH_MODEL_TEXT

typedef struct bench_opts {
    const size_t *budgets; /* the policy tables' budgets */
    size_t n_budgets;
    int canonical; /* the trace is a canonical one: judge the H2O page */
} bench_opts;

void render_policy_table(FILE *f, evalset *es, size_t budget, const result_ctx *c, tfmt fmt);
void render_h2o_sweep(FILE *f, evalset *es, size_t budget, const result_ctx *c, tfmt fmt);

/* ---- the claims on several trace seeds (seeds.c) ------------------------- */

typedef struct seeds_run {
    char *base;            /* canonical source of the first seed's trace */
    uint64_t first;        /* its seed; seed i is first + i */
    size_t n;              /* seeds */
    uint64_t policy_seed;  /* --seed */
    int calibrated;        /* the first seed's trace is the calibrated one */
    int (*outcome)[N_OBS]; /* [n]: OBS_* per claim */
    double *streaming;     /* [n]: streaming's retained mass at budget 256 */
} seeds_run;

/* Judges the claims on seeds first .. first + n - 1 of the canonical trace
 * `src` (any other source is a usage error), policy seed a->seed. */
void seeds_eval(seeds_run *r, const char *src, size_t n, const cli_args *a);
void seeds_free(seeds_run *r);
/* text/md: the verdict per claim over the seeds, then the claims per seed;
 * csv/json: one row per seed. */
void render_seeds(FILE *f, const seeds_run *r, tfmt fmt);
void render_summary(FILE *f, evalset *es, tfmt fmt);
void render_bench(FILE *f, evalset *es, const bench_opts *o, const result_ctx *c, tfmt fmt);
/* Registers in `es` (collecting) every spec the report on `trace` (source
 * text) needs, in the order the report first uses them: bench's grid. */
void bench_collect(evalset *es, const bench_opts *o, const char *trace, size_t key_dim);
/* bench's last section (text or md): every policy at 10%, 20% and 50% of the
 * steps of trace `src`; NULL: the committed model's attention when the
 * current directory is a checkout, else a line saying so; "none": nothing.
 * Seed from `a`; ns/step columns when `timings`. */
void render_model_section(FILE *f, const char *src, const cli_args *a, int timings, tfmt fmt);
/* A stream that discards what is written (for collecting passes). */
FILE *null_sink(void);

/* ---- what a trace looks like (stats.c), shared by trace --stats and docs -- */

/* The statistics of one head (docs/trace.md, "Realism, measured"); a mean
 * over no row is NaN. */
typedef struct trace_stats {
    double sink_mass;             /* mean mass on the first 4 positions */
    double recent_mass;           /* mean mass on [t - 64, t) */
    double self_mass;             /* mean mass on the query's own key */
    double top32_persistence;     /* mean share of a row's top-32 kept by the next row's */
    double block_heavy_mass;      /* a block's top-32 by summed mass, per row, in it */
    double block_heavy_next_mass; /* ... and in the next block */
    size_t rows, pairs, blocks;   /* the counts behind the means */
} trace_stats;

enum { STATS_BLOCK = 512 };

/* Computes head `head` of `tr` with blocks of `block` rows. Exits on a read
 * error. O(T) memory. */
void trace_stats_head(kve_trace *tr, size_t head, size_t block, trace_stats *s);
/* One row per head (every head when all_heads, else `head`), plus their mean
 * in text and markdown. */
void render_trace_stats(FILE *f, kve_trace *tr, size_t head, int all_heads, size_t block,
                        tfmt fmt);

/* ---- the source-tree commands (source_tree.c) ---------------------------- */

/* The documentation tool (tools/docs/): built beside kvevict, not installed. */
#define DOCS_TOOL "kvevict-docs"
/* argv[0] of the running program (main sets it), to find DOCS_TOOL. */
extern const char *cli_argv0;
/* Runs `DOCS_TOOL cmd argv[0 .. argc)` in place of this process: the one
 * beside this program's executable. Returns only by exiting: usage (2),
 * saying where the command lives, when there is none. */
#if defined(__GNUC__)
__attribute__((noreturn))
#endif
int source_tree_run(const char *cmd, int argc, char **argv);

/* ---- subcommands ---------------------------------------------------------- */

int cmd_eval(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_sweep(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_policies(int argc, char **argv);
int cmd_perf(int argc, char **argv);
int cmd_lm(int argc, char **argv);       /* lm/cmd_lm.c: lm logits|eval|passkey|... */
int cmd_generate(int argc, char **argv); /* lm/generate.c */

#endif /* KVE_CLI_H */
