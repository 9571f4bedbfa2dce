/* SPDX-License-Identifier: MIT */
/*
 * cmd_docs.c - `kvevict docs`, a source-tree tool: regenerates the measured blocks of markdown files
 * and, with --check, reports blocks that drifted from the tools' output.
 *
 * A block is a pair of lines, each alone on its line:
 *     <!-- kvevict:begin NAME ARG... -->
 *     <!-- kvevict:end NAME -->
 * and everything between them is generated (a blank line, the content, a
 * blank line). Blocks do not nest. Every block is computed with policy seed
 * 0 on the canonical trace, unless --trace SRC is given or the block names
 * its own trace with an argument trace=SRC (anywhere among its arguments).
 * Names:
 *     results                       the whole `kvevict bench --markdown`
 *                                   (its section on the committed model's
 *                                   attention on the canonical trace only)
 *     bench budget=B                every policy at budget B
 *     h2o-sweep                     the H2O recent-window sweep at 256
 *     observations                  the claims of the H2O page, checked
 *     summary                       every policy at 256 and 512, one row each
 *     sweep SPEC [KEY=V1,V2,...]... [budget=B1,B2,...]
 *                                   a grid, as `kvevict sweep` prints it
 *     seeds n=N                     the claims on N seeds of a canonical trace
 *                                   (`kvevict bench --seeds N --md`)
 *     trace-stats [block=B]         `kvevict trace --stats --md` of the trace
 *     table FILE ARG...             the rows of a committed JSON Lines file
 *                                   (data.c; measurements too slow to repeat
 *                                   here, drift-checked by the tests that
 *                                   re-make a subset), no trace involved:
 *                                   ARGs are where=KEY:V1|V2 (or KEY!V1|V2;
 *                                   repeatable), then show=C,... (one table
 *                                   row per file row) or rows=C,... cols=KEY
 *                                   [::Header] value=KEY[:F] (a pivot: one
 *                                   column per value of KEY, headed "Header
 *                                   VALUE"); a column C is KEY[:F[:Header]],
 *                                   F empty, N or +N decimals or `code`, the
 *                                   header with _ for blanks; the key `spec`
 *                                   is the policy without its budget
 *     calibration FILE part=P       a part of the report of a committed
 *                                   `kvevict trace --calibrate --json` run
 *                                   (calibrate.c): map, sink, pairs,
 *                                   argument, choice or outside
 * e.g. <!-- kvevict:begin sweep h2o recent_window=16,32,64 budget=256 -->,
 *      <!-- kvevict:begin observations trace=canonical:version=1 -->.
 * The blocks of one trace are evaluated in one lockstep pass; a trace that
 * is a path is read relative to the current directory (make docs and the
 * drift test run from the source tree).
 *
 * Blocks hold no timings (no ns/step column: timings depend on the machine
 * and live outside drift-checked text), so a block is up to date exactly
 * when its text equals what the tools print now. All the blocks of all the
 * files are evaluated in one lockstep pass. Files are rewritten through a
 * temporary file and a rename, so an interrupt leaves each whole.
 */
#define _POSIX_C_SOURCE 200809L
#include "calibrate.h"
#include "docs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_ARGS = 16 };

typedef struct block {
    size_t file;
    size_t begin, end; /* line indexes of the marker lines */
    char *name;
    size_t n_args;
    char *args[MAX_ARGS];
    char *trace;       /* its trace=SRC argument, or NULL */
    size_t group;      /* index of its trace in the groups */
    char where[300];   /* "FILE:LINE" for messages */
} block;

/* The blocks of one trace: one evalset, evaluated in one pass. */
typedef struct group {
    const char *src; /* the trace's source text */
    evalset es;
    kve_trace *tr;
    result_ctx ctx; /* seed 0, top-32, no timings */
} group;

typedef struct doc {
    const char *path;
    char *text;
    size_t n_lines;
    char **line; /* pointers into text, NUL-terminated, newline removed */
} doc;

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die_input("%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap)
            buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad)
        die_input("%s: cannot read: %s", path, strerror(errno));
    buf[n] = '\0';
    *len = n;
    return buf;
}

static void split_lines(doc *d)
{
    size_t len = strlen(d->text), cap = 64;
    d->line = xmalloc(cap * sizeof *d->line);
    d->n_lines = 0;
    char *p = d->text;
    while (p < d->text + len) {
        char *nl = strchr(p, '\n');
        if (d->n_lines == cap)
            d->line = xrealloc(d->line, (cap *= 2) * sizeof *d->line);
        d->line[d->n_lines++] = p;
        if (!nl)
            break;
        *nl = '\0';
        p = nl + 1;
    }
}

/* Parses a marker "<!-- kvevict:KIND REST -->"; returns REST (in a fresh
 * string) or NULL when the line is not such a marker. */
static char *marker(const char *line, const char *kind)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "<!-- kvevict:%s ", kind);
    size_t pl = strlen(prefix), n = strlen(line);
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\r'))
        n--;
    if (n < pl + 4 || strncmp(line, prefix, pl) != 0 || strncmp(line + n - 4, " -->", 4) != 0)
        return NULL;
    size_t m = n - 4 - pl;
    char *r = xmalloc(m + 1);
    memcpy(r, line + pl, m);
    r[m] = '\0';
    return r;
}

static const size_t block_budgets[2] = {256, 512};

/* The value of argument KEY=VALUE of b, or NULL. */
static const char *block_arg(const block *b, const char *key)
{
    size_t n = strlen(key);
    for (size_t i = 0; i < b->n_args; i++)
        if (strncmp(b->args[i], key, n) == 0 && b->args[i][n] == '=')
            return b->args[i] + n + 1;
    return NULL;
}

/* Renders block b (or, while its group's evalset is collecting, registers
 * what it needs). */
static void render_block(FILE *f, group *g, const block *b)
{
    const char *name = b->name;
    evalset *es = &g->es;
    const result_ctx *c = &g->ctx;
    if (strcmp(name, "results") == 0 || strcmp(name, "h2o-sweep") == 0 ||
        strcmp(name, "observations") == 0 || strcmp(name, "summary") == 0) {
        if (b->n_args)
            die_usage("block '%s' takes no arguments but trace=SRC", name);
        if (name[0] == 'r') {
            bench_opts o = {block_budgets, 2, 1};
            render_bench(f, es, &o, c, FMT_MD);
            /* bench --markdown's last section (seed 0), which bench prints
             * only without --trace: on the default trace alone */
            if (!es->collecting && strcmp(g->src, BENCH_TRACE) == 0) {
                cli_args a;
                memset(&a, 0, sizeof a);
                a.topk = 32;
                render_model_section(f, NULL, &a, 0, FMT_MD);
            }
        } else if (name[0] == 'h') {
            render_h2o_sweep(f, es, 256, c, FMT_MD);
        } else if (name[0] == 'o') {
            render_observations(f, es, 1, c->trace);
        } else {
            render_summary(f, es, FMT_MD);
        }
        return;
    }
    if (strcmp(name, "bench") == 0) {
        if (b->n_args != 1 || strncmp(b->args[0], "budget=", 7) != 0)
            die_usage("block 'bench' takes one argument, budget=B");
        size_t budget = (size_t)parse_u64("budget", b->args[0] + 7, 1, KVE_MAX_BUDGET);
        render_policy_table(f, es, budget, c, FMT_MD);
        return;
    }
    if (strcmp(name, "seeds") == 0) {
        const char *n = block_arg(b, "n");
        if (b->n_args != 1 || !n)
            die_usage("block 'seeds' takes one argument, n=N");
        size_t seeds = (size_t)parse_u64("n", n, 1, 1000);
        if (es->collecting)
            return; /* its own evaluation, one trace per seed */
        cli_args a;
        memset(&a, 0, sizeof a);
        a.topk = 32;
        seeds_run r;
        seeds_eval(&r, g->src, seeds, &a);
        render_seeds(f, &r, FMT_MD);
        seeds_free(&r);
        return;
    }
    if (strcmp(name, "trace-stats") == 0) {
        const char *bl = block_arg(b, "block");
        if (b->n_args > (bl ? 1u : 0u))
            die_usage("block 'trace-stats' takes at most one argument, block=B");
        size_t rows = bl ? (size_t)parse_u64("block", bl, 1, KVE_MAX_BUDGET) : STATS_BLOCK;
        if (!es->collecting)
            render_trace_stats(f, g->tr, 0, 1, rows, FMT_MD);
        return;
    }
    if (strcmp(name, "calibration") == 0) { /* calibrate.c: a committed calibration run */
        if (b->trace)
            die_usage("block 'calibration' reads a data file, not a trace: no trace=");
        if (!es->collecting)
            render_calibration_block(f, b->args, b->n_args);
        return;
    }
    if (strcmp(name, "table") == 0) {
        if (b->trace)
            die_usage("block 'table' reads a data file, not a trace: no trace=");
        if (!es->collecting)
            render_data_table(f, b->args, b->n_args);
        return;
    }
    if (strcmp(name, "sweep") == 0) {
        if (b->n_args < 1)
            die_usage("block 'sweep' needs a policy spec");
        grid gr;
        grid_init(&gr, b->args[0]);
        for (size_t i = 1; i < b->n_args; i++) {
            const char *a = b->args[i];
            if (strncmp(a, "budget=", 7) == 0) {
                size_t budgets[CLI_MAX_BUDGETS], n;
                parse_budgets("budget", a + 7, budgets, CLI_MAX_BUDGETS, &n);
                grid_set_budgets(&gr, budgets, n);
            } else {
                grid_add_param(&gr, "sweep", a);
            }
        }
        grid_check(&gr);
        render_grid(f, es, &gr, c, FMT_MD);
        grid_free(&gr);
        return;
    }
    die_usage("unknown block '%s' (results, bench, h2o-sweep, observations, summary, sweep, "
              "seeds, trace-stats, table, calibration)",
              name);
}

/* 0 when a and b are equal, else the 1-based number of the first
 * differing line. */
static size_t differ(const char *a, const char *b)
{
    size_t line = 1;
    for (;;) {
        if (*a != *b)
            return line;
        if (!*a)
            return 0;
        line += *a == '\n';
        a++;
        b++;
    }
}

/* Whether `name` is one of the --skip values. */
static int skipped(const opt_val *skip, const char *name)
{
    for (int i = 0; i < skip->count; i++)
        if (strcmp(skip->v[i], name) == 0)
            return 1;
    return 0;
}

static const char docs_usage[] =
    "usage: kvevict docs [--check [--skip NAME]...] [--trace SRC] FILE...\n"
    "\n"
    "Regenerates the measured blocks of markdown files in place, or with --check\n"
    "reports (exit 1) every block that differs from what the tools print now.\n"
    "A block is the text between two marker lines:\n"
    "  <!-- kvevict:begin NAME ARG... -->\n"
    "  <!-- kvevict:end NAME -->\n"
    "Names: results (all of `kvevict bench --markdown`), bench budget=B,\n"
    "h2o-sweep, observations, summary (every policy at 256 and 512),\n"
    "sweep SPEC [KEY=V1,V2,...]... [budget=B1,B2,...], seeds n=N (the claims on\n"
    "N seeds, as bench --seeds), trace-stats [block=B] (as trace --stats) and\n"
    "table FILE [where=KEY:V1|V2...]... (show=C,... | rows=C,... cols=KEY[::Head]\n"
    "value=KEY[:F]): the rows of a committed JSON Lines file whose KEY is one of\n"
    "the values (where=KEY!V1|V2...: none of them), one table row per file row\n"
    "(show=) or a pivot (one row per distinct rows= values, one column per value\n"
    "of cols=, headed \"Head VALUE\"). A column C is KEY[:F[:Head]]: F empty, N or\n"
    "+N decimals or code; Head with _ for blanks (default: the key). A missing key\n"
    "reads null (where=KEY!null: present); the key spec is the policy without its\n"
    "budget. calibration FILE part=map|sink|pairs|argument|choice|outside: a part\n"
    "of the report of a committed `kvevict trace --calibrate --json` run.\n"
    "Every block uses policy seed 0 and the canonical trace, unless --trace is\n"
    "given or the block has an argument trace=SRC of its own; it holds no timings\n"
    "(they depend on the machine), so a block is up to date exactly when its text\n"
    "equals what the tools print now.\n"
    "\n"
    "This is a source-tree tool: it maintains the docs/ of a kvevict checkout.\n"
    "\n"
    "  --check      compare only; exit 1 naming each block that drifted\n"
    "  --skip NAME  with --check: leave the blocks named NAME unchecked (repeatable;\n"
    "               the drift test under sanitizers skips the seeds blocks, whose\n"
    "               21 benches cost minutes there and run natively anyway)\n"
    "  --quiet      no progress line on stderr (drawn on a terminal after 2 s)\n"
    "  --trace SRC  evaluate the blocks without a trace= of their own on another\n"
    "               trace (to try a page out; the committed docs and their drift\n"
    "               test use the canonical trace)\n";

static const opt_def docs_own[] = {{"check", 0, 0}, {"skip", 0, OPT_VALUE | OPT_REPEAT}};
static const cli_spec docs_spec = {
    .usage = docs_usage,
    .shared = SO_TRACE | SO_QUIET,
    CLI_OWN(docs_own),
    .max_pos = CLI_MAX_POS,
};

int cmd_docs(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &docs_spec, argc, argv);
    const char *const *files = a.pos;
    size_t n_files = a.n_pos;
    if (n_files == 0)
        die_usage("no FILE given (see kvevict docs --help)");
    int check = cli_own(&a, &docs_spec, "check")->count > 0;
    const opt_val *skip = cli_own(&a, &docs_spec, "skip");
    if (skip->count && !check)
        die_usage("--skip: only with --check (a regenerated page has every block)");
    doc *docs = xcalloc(n_files, sizeof *docs);
    block *blocks = NULL;
    size_t n_blocks = 0, cap_blocks = 0;
    for (size_t i = 0; i < n_files; i++) {
        size_t len;
        docs[i].path = files[i];
        docs[i].text = read_all(files[i], &len);
        if (strlen(docs[i].text) != len)
            die_input("%s: holds a NUL byte", files[i]);
        split_lines(&docs[i]);
        block *open = NULL;
        for (size_t l = 0; l < docs[i].n_lines; l++) {
            char *rest = marker(docs[i].line[l], "begin");
            if (rest) {
                if (open)
                    die_input("%s:%zu: block begins inside block '%s' (line %zu)", files[i],
                              l + 1, open->name, open->begin + 1);
                if (n_blocks == cap_blocks)
                    blocks = xrealloc(blocks, (cap_blocks = cap_blocks ? 2 * cap_blocks : 16) *
                                                  sizeof *blocks);
                open = &blocks[n_blocks++];
                memset(open, 0, sizeof *open);
                open->file = i;
                open->begin = l;
                snprintf(open->where, sizeof open->where, "docs %s:%zu", files[i], l + 1);
                char *save = rest, *tok;
                while ((tok = strtok(save, " ")) != NULL) {
                    save = NULL;
                    if (!open->name)
                        open->name = xstrdup(tok);
                    else if (strncmp(tok, "trace=", 6) == 0 && !open->trace)
                        open->trace = xstrdup(tok + 6);
                    else if (strncmp(tok, "trace=", 6) == 0)
                        die_input("%s:%zu: trace= is given twice", files[i], l + 1);
                    else if (open->n_args == MAX_ARGS)
                        die_input("%s:%zu: too many arguments", files[i], l + 1);
                    else
                        open->args[open->n_args++] = xstrdup(tok);
                }
                if (open->trace && !open->trace[0])
                    die_input("%s:%zu: trace= names no trace", files[i], l + 1);
                free(rest);
                if (!open->name)
                    die_input("%s:%zu: block without a name", files[i], l + 1);
                continue;
            }
            rest = marker(docs[i].line[l], "end");
            if (rest) {
                if (!open || strcmp(rest, open->name) != 0)
                    die_input("%s:%zu: 'end %s' does not close an open block", files[i], l + 1,
                              rest);
                open->end = l;
                open = NULL;
                free(rest);
            }
        }
        if (open)
            die_input("%s:%zu: block '%s' is never closed", files[i], open->begin + 1,
                      open->name);
    }

    /* One group per distinct trace, in order of first use. */
    const char *default_src = a.trace ? a.trace : BENCH_TRACE;
    group *groups = xcalloc(n_blocks ? n_blocks : 1, sizeof *groups);
    size_t n_groups = 0;
    for (size_t k = 0; k < n_blocks; k++) {
        const char *src = blocks[k].trace ? blocks[k].trace : default_src;
        size_t g = 0;
        while (g < n_groups && strcmp(groups[g].src, src) != 0)
            g++;
        if (g == n_groups) {
            groups[g].src = src;
            evalset_init(&groups[g].es);
            groups[g].ctx.trace = src;
            groups[g].ctx.topk = 32;
            n_groups++;
        }
        blocks[k].group = g;
    }
    for (size_t g = 0; g < n_groups; g++) { /* what the traces hold decides what runs */
        cli_args ga = a;
        ga.trace = groups[g].src;
        groups[g].tr = open_trace(&ga);
        groups[g].es.key_dim = kve_trace_key_dim(groups[g].tr);
    }
    FILE *sink = null_sink();
    for (size_t k = 0; k < n_blocks; k++) {
        cli_cmd = blocks[k].where; /* messages name the file and line */
        render_block(sink, &groups[blocks[k].group], &blocks[k]);
    }
    fclose(sink);
    cli_cmd = "docs";
    for (size_t g = 0; g < n_groups; g++) {
        cli_args ga = a; /* seed 0, top-32: the defaults */
        ga.trace = groups[g].src;
        evalset_run(&groups[g].es, groups[g].tr, &ga, 0);
        result_ctx_init(&groups[g].ctx, &ga, groups[g].tr);
        groups[g].ctx.timings = 0;
    }

    int drift = 0;
    size_t k = 0, n_skipped = 0;
    for (size_t i = 0; i < n_files; i++) {
        doc *d = &docs[i];
        char *out = NULL;
        size_t out_len = 0;
        FILE *o = open_memstream(&out, &out_len);
        if (!o)
            die_input("out of memory");
        int changed = 0;
        size_t l = 0, n_here = 0;
        for (; k < n_blocks && blocks[k].file == i; k++, n_here++) {
            block *b = &blocks[k];
            for (; l <= b->begin; l++)
                fprintf(o, "%s\n", d->line[l]);
            if (skipped(skip, b->name)) {
                n_skipped++;
                continue;
            }
            char *gen = NULL, *old = NULL;
            size_t gen_len = 0, old_len = 0;
            FILE *g = open_memstream(&gen, &gen_len);
            FILE *h = open_memstream(&old, &old_len);
            if (!g || !h)
                die_input("out of memory");
            fputc('\n', g);
            cli_cmd = b->where;
            render_block(g, &groups[b->group], b);
            cli_cmd = "docs";
            fputc('\n', g);
            fclose(g);
            for (size_t j = b->begin + 1; j < b->end; j++)
                fprintf(h, "%s\n", d->line[j]);
            fclose(h);
            size_t at = differ(old, gen);
            if (at) {
                drift = 1;
                changed = 1;
                if (check)
                    fprintf(stderr,
                            "kvevict docs: %s:%zu: block '%s' is out of date (first difference "
                            "at line %zu); run make docs\n",
                            d->path, b->begin + 1, b->name, b->begin + 1 + at);
                fputs(gen, o);
            } else {
                fputs(old, o);
            }
            free(gen);
            free(old);
            l = b->end;
        }
        for (; l < d->n_lines; l++)
            fprintf(o, "%s\n", d->line[l]);
        fclose(o);
        if (changed && !check) {
            FILE *w = out_open(d->path);
            if (fwrite(out, 1, out_len, w) != out_len)
                die_input("%s: cannot write: %s", d->path, strerror(errno));
            out_close(w);
        }
        if (!check)
            printf("%s: %zu block%s, %s\n", d->path, n_here, n_here == 1 ? "" : "s",
                   changed ? "updated" : "up to date");
        free(out);
    }

    if (skip->count)
        fprintf(stderr, "kvevict docs: %zu block%s left unchecked (--skip)\n", n_skipped,
                n_skipped == 1 ? "" : "s");
    for (size_t g = 0; g < n_groups; g++) {
        evalset_free(&groups[g].es);
        kve_trace_free(groups[g].tr);
    }
    free(groups);
    for (size_t b = 0; b < n_blocks; b++) {
        free(blocks[b].name);
        free(blocks[b].trace);
        for (size_t k2 = 0; k2 < blocks[b].n_args; k2++)
            free(blocks[b].args[k2]);
    }
    free(blocks);
    for (size_t i = 0; i < n_files; i++) {
        free(docs[i].text);
        free(docs[i].line);
    }
    free(docs);
    finish_stdout();
    return check && drift ? EXIT_INPUT : 0;
}
