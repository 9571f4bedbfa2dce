/* SPDX-License-Identifier: MIT */
/*
 * cmd_merge.c - `kvevict merge FILE...`: the shards of one sharded run
 * (`sweep --shard`, `bench --shard`; shard.c) combined into the table, JSON
 * or CSV the unsharded run prints.
 *
 * Every line is checked before anything is printed: it parses (strictly,
 * jsonl.c) as a shard line; every line belongs to the same run (the
 * "run" objects are equal as written), to the same number of shards, and
 * to the trace, heads, layers and seed the first line names; its job is in
 * its shard (job % N == I) and below the grid's size; no job appears twice
 * (a shard given twice); every job of every shard is present (a shard
 * missing, or cut short). The grid is then rebuilt from the run exactly as
 * the command built it, each job's policy is held to the grid's spec at its
 * index, and the results fill an evalset that the command's own renderer
 * prints: the same code, so the same bytes, but for ns_per_step, the one
 * timing (each job's, as measured by the shard that ran it).
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char merge_usage[] =
    "usage: kvevict merge [--format text|md|csv|json | --json | --csv | --md] [-o FILE]\n"
    "                     FILE...\n"
    "\n"
    "Combines the shards of one run of `kvevict sweep --shard I/N` or `kvevict\n"
    "bench --shard I/N` (JSON Lines, one line per job) into exactly what the\n"
    "unsharded run prints in the format asked for: the same rows in the same\n"
    "order, the same figures (ns/step, a timing, is each job's as its shard\n"
    "measured it). FILE may be - (standard input); the lines of several shards\n"
    "may be in one file, in any order.\n"
    "\n"
    "  --format F         text (default), md, csv or json; --json, --csv, --md\n"
    "  -o, --output FILE  write there instead of standard output (- for it)\n"
    "\n"
    "Refused, naming the file and line (exit 1): a line that is not a shard\n"
    "line, lines of different runs (another grid, trace, seed, shard count),\n"
    "a job given twice (a shard given twice), and a missing job (a shard\n"
    "missing or cut short: the message names the shard).\n";

static const cli_spec merge_spec = {
    .usage = merge_usage,
    .shared = SO_FORMAT | SO_OUTPUT,
    .max_pos = CLI_MAX_POS,
    .default_format = FMT_TEXT,
};

/* One job read back. */
typedef struct record {
    const char *file;
    size_t line;
    kve_eval_result r;
} record;

/* What every line shares, from the first line read. */
typedef struct merge_set {
    int have;
    const char *file; /* where it was read, for messages */
    size_t line;
    char *run;        /* the run object as written */
    size_t count;     /* N of I/N */
    size_t jobs;
    char *trace;
    size_t heads, layers, topk;
    uint64_t seed;
    record *rec;      /* [jobs], by job; file NULL where not seen */
} merge_set;

/* ---- reading one line ---- */

typedef struct line_ctx {
    const char *file;
    size_t line;
    const jv *obj;
} line_ctx;

/* "FILE:LINE: message", bad input. */
#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 2, 3)))
#endif
static void bad_line(const line_ctx *x, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    die_input("%s:%zu: %s", x->file, x->line, msg);
}
#define BAD bad_line

static const jv *member(const line_ctx *x, const char *key, jv_kind kind, const char *what)
{
    const jv *v = jv_get(x->obj, key);
    if (!v)
        BAD(x, "no \"%s\" key: not a line of a sharded run (sweep --shard, bench --shard)", key);
    if (v->kind != kind && !(kind == JV_NUMBER && v->kind == JV_NULL))
        BAD(x, "\"%s\" is not %s", key, what);
    return v;
}

static const char *str_of(const line_ctx *x, const char *key)
{
    return member(x, key, JV_STRING, "a string")->text;
}

/* A whole number in [0, max] written as plain digits. */
static uint64_t whole(const line_ctx *x, const char *key, const char *text, uint64_t max)
{
    uint64_t v = 0;
    int ok = text[0] != '\0';
    for (const char *c = text; ok && *c; c++) {
        uint64_t d = (uint64_t)(*c - '0');
        ok = *c >= '0' && *c <= '9' && v <= (max - d) / 10;
        v = v * 10 + d;
    }
    if (!ok)
        BAD(x, "\"%s\": %s is not a whole number up to %llu", key, text,
            (unsigned long long)max);
    return v;
}

static uint64_t u64_of(const line_ctx *x, const char *key, uint64_t max)
{
    const jv *v = member(x, key, JV_NUMBER, "a number");
    if (v->kind == JV_NULL)
        BAD(x, "\"%s\" is null, not a number", key);
    return whole(x, key, v->text, max);
}

/* A metric: a number, or null for a mean over no scored step (NaN). */
static double real_of(const line_ctx *x, const char *key)
{
    const jv *v = member(x, key, JV_NUMBER, "a number or null");
    if (v->kind == JV_NULL)
        return NAN;
    errno = 0;
    double d = strtod(v->text, NULL);
    if (errno == ERANGE && isinf(d))
        BAD(x, "\"%s\": %s does not fit a double", key, v->text);
    return d;
}

/* "I/N" as a shard line writes it. */
static void shard_of(const line_ctx *x, size_t *index, size_t *count)
{
    const char *s = str_of(x, "shard");
    const char *slash = strchr(s, '/');
    char head[32];
    size_t len = slash ? (size_t)(slash - s) : 0;
    if (!slash || len == 0 || len >= sizeof head)
        BAD(x, "\"shard\": '%s' is not I/N", s);
    memcpy(head, s, len);
    head[len] = '\0';
    *index = (size_t)whole(x, "shard", head, GRID_MAX_POINTS);
    *count = (size_t)whole(x, "shard", slash + 1, GRID_MAX_POINTS);
    if (*count == 0 || *index >= *count)
        BAD(x, "\"shard\": '%s' is not I/N with 0 <= I < N", s);
}

/* Reads one line into the set: checks it against the first, then records
 * its job. */
static void take_line(merge_set *m, const char *file, size_t lineno, const char *line)
{
    char err[256];
    jv *obj = jv_parse(line, err, sizeof err);
    if (!obj)
        die_input("%s:%zu: not JSON: %s", file, lineno, err);
    line_ctx x = {file, lineno, obj};
    if (obj->kind != JV_OBJECT)
        BAD(&x, "not a JSON object");
    size_t index, count;
    shard_of(&x, &index, &count);
    size_t job = (size_t)u64_of(&x, "job", SIZE_MAX);
    size_t jobs = (size_t)u64_of(&x, "jobs", GRID_MAX_POINTS);
    const jv *run = member(&x, "run", JV_OBJECT, "an object");
    const char *trace = str_of(&x, "trace");
    size_t heads = (size_t)u64_of(&x, "heads", SIZE_MAX);
    size_t layers = (size_t)u64_of(&x, "layers", SIZE_MAX);
    uint64_t seed = u64_of(&x, "seed", UINT64_MAX);
    size_t topk = (size_t)u64_of(&x, "topk", KVE_MAX_BUDGET);
    size_t run_len = run->end - run->start;
    if (!m->have) {
        m->have = 1;
        m->file = file;
        m->line = lineno;
        m->run = xmalloc(run_len + 1);
        memcpy(m->run, line + run->start, run_len);
        m->run[run_len] = '\0';
        m->count = count;
        m->jobs = jobs;
        m->trace = xstrdup(trace);
        m->heads = heads;
        m->layers = layers;
        m->seed = seed;
        m->topk = topk;
        m->rec = xcalloc(jobs ? jobs : 1, sizeof *m->rec);
    }
    if (strlen(m->run) != run_len || memcmp(m->run, line + run->start, run_len) != 0)
        BAD(&x, "a line of another run: its \"run\" differs from %s:%zu's (each merge takes the "
            "shards of one run)", m->file, m->line);
    if (count != m->count)
        BAD(&x, "shard %zu/%zu, but %s:%zu is of %zu shards", index, count, m->file, m->line,
            m->count);
    if (jobs != m->jobs || strcmp(trace, m->trace) != 0 || heads != m->heads ||
        layers != m->layers || seed != m->seed || topk != m->topk)
        BAD(&x, "the same run as %s:%zu, but its jobs, trace, heads, layers, seed or topk differ",
            m->file, m->line);
    if (job >= jobs)
        BAD(&x, "job %zu of a grid of %zu jobs", job, jobs);
    if (job % count != index)
        BAD(&x, "job %zu is not in shard %zu/%zu (job %% %zu is %zu)", job, index, count, count,
            job % count);
    record *r = &m->rec[job];
    if (r->file && strcmp(r->file, file) == 0 && r->line == lineno)
        BAD(&x, "job %zu (shard %zu/%zu) was read from this line before: the file is given "
            "twice", job, index, count);
    if (r->file)
        BAD(&x, "job %zu (shard %zu/%zu) is also at %s:%zu: a shard given twice", job, index,
            count, r->file, r->line);
    r->file = file;
    r->line = lineno;
    const char *policy = str_of(&x, "policy");
    if (strlen(policy) >= KVE_SPEC_MAX)
        BAD(&x, "\"policy\" is longer than any canonical spec");
    memcpy(r->r.spec, policy, strlen(policy) + 1);
    r->r.budget = (size_t)u64_of(&x, "budget", KVE_MAX_BUDGET);
    r->r.steps = (size_t)u64_of(&x, "steps", SIZE_MAX);
    r->r.scored_steps = (size_t)u64_of(&x, "scored_steps", SIZE_MAX);
    r->r.retained_mass = real_of(&x, "retained_mass");
    r->r.top32_recall = real_of(&x, "top32_recall");
    r->r.min_retained_mass = real_of(&x, "min_retained_mass");
    r->r.ns_per_step = real_of(&x, "ns_per_step");
    r->r.state_bytes = (size_t)u64_of(&x, "state_bytes", SIZE_MAX);
    r->r.topk = topk;
    /* topk_recall when the run gave --topk; without it k is 32 */
    r->r.topk_recall = jv_get(obj, "topk_recall") || topk != 32 ? real_of(&x, "topk_recall")
                                                                : r->r.top32_recall;
    jv_free(obj);
}

static void read_file(merge_set *m, const char *path)
{
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "r");
    if (!f)
        die_input("%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if ((size_t)len != strlen(line))
            die_input("%s:%zu: a NUL byte: not a text file", path, lineno);
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len > 0)
            take_line(m, is_stdin ? "-" : path, lineno, line);
    }
    int bad = ferror(f);
    int e = errno;
    free(line);
    if (!is_stdin)
        fclose(f);
    if (bad)
        die_input("%s: cannot read: %s", path, strerror(e));
}

/* Every job present, or which shards are missing or cut short. */
static void check_complete(const merge_set *m)
{
    char list[256] = "";
    size_t len = 0, missing_shards = 0, first_cut = SIZE_MAX, cut_job = 0;
    for (size_t s = 0; s < m->count; s++) {
        size_t have = 0, want = 0, gap = SIZE_MAX;
        for (size_t j = s; j < m->jobs; j += m->count) {
            want++;
            if (m->rec[j].file)
                have++;
            else if (gap == SIZE_MAX)
                gap = j;
        }
        if (have == 0) {
            if (len < sizeof list - 16)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%zu/%zu",
                                        missing_shards ? ", " : "", s, m->count);
            missing_shards++;
        } else if (have < want && first_cut == SIZE_MAX) {
            first_cut = s;
            cut_job = gap;
        }
    }
    if (missing_shards)
        die_input("%s %s %s missing: no line of %s is in the files given (%zu jobs in %zu "
                  "shards)", missing_shards == 1 ? "shard" : "shards", list,
                  missing_shards == 1 ? "is" : "are", missing_shards == 1 ? "it" : "them",
                  m->jobs, m->count);
    if (first_cut != SIZE_MAX)
        die_input("shard %zu/%zu is incomplete: job %zu is missing (a shard cut short?)",
                  first_cut, m->count, cut_job);
}

/* ---- the run, rebuilt ---- */

typedef struct run_desc {
    const char *command, *trace, *policy;
    const jv *params; /* array of strings, or NULL */
    cli_args a;       /* budgets, seed, topk, topk_given, trace_flags */
    size_t key_dim;   /* bench: the trace's key dimension */
} run_desc;

static void parse_run(const merge_set *m, const jv *run, run_desc *d)
{
    line_ctx x = {m->file, m->line, run};
    memset(d, 0, sizeof *d);
    d->command = str_of(&x, "command");
    d->trace = str_of(&x, "trace");
    d->a.trace = d->trace;
    if (strcmp(d->command, "sweep") == 0) {
        d->policy = str_of(&x, "policy");
        d->params = member(&x, "param", JV_ARRAY, "an array");
        if (d->params->n > OPT_MAXREP)
            BAD(&x, "\"run\": more than %d --param", OPT_MAXREP);
        for (size_t i = 0; i < d->params->n; i++)
            if (d->params->child[i].kind != JV_STRING)
                BAD(&x, "\"run\": a --param that is not a string");
    } else if (strcmp(d->command, "bench") == 0) {
        d->key_dim = (size_t)u64_of(&x, "key_dim", KVE_MAX_KEY_DIM);
    } else {
        BAD(&x, "\"run\": command '%s' is neither sweep nor bench", d->command);
    }
    const jv *budgets = member(&x, "budget", JV_ARRAY, "an array");
    if (budgets->n > CLI_MAX_BUDGETS)
        BAD(&x, "\"run\": more than %d budgets", CLI_MAX_BUDGETS);
    for (size_t i = 0; i < budgets->n; i++) {
        if (budgets->child[i].kind != JV_NUMBER)
            BAD(&x, "\"run\": a budget that is not a number");
        d->a.budgets[i] = (size_t)whole(&x, "budget", budgets->child[i].text, KVE_MAX_BUDGET);
        if (d->a.budgets[i] == 0)
            BAD(&x, "\"run\": budget 0");
    }
    d->a.n_budgets = budgets->n;
    d->a.seed = u64_of(&x, "seed", UINT64_MAX);
    const jv *topk = member(&x, "topk", JV_NUMBER, "a number or null");
    d->a.topk_given = topk->kind != JV_NULL;
    d->a.topk = d->a.topk_given ? (size_t)whole(&x, "topk", topk->text, KVE_MAX_BUDGET) : 32;
    const jv *norm = jv_get(run, "normalize");
    if (!norm || (norm->kind != JV_TRUE && norm->kind != JV_FALSE))
        BAD(&x, "\"run\": \"normalize\" is not true or false");
    d->a.trace_flags = norm->kind == JV_TRUE ? KVE_TRACE_NORMALIZE : 0;
    if (d->a.seed != m->seed || d->a.topk != m->topk)
        BAD(&x, "\"run\" names seed or topk other than the line's");
}

/* Job j's result into the evalset, held to the grid's spec for j. */
static void put_result(evalset *es, const merge_set *m, size_t j, const char *spec)
{
    const record *r = &m->rec[j];
    if (strcmp(r->r.spec, spec) != 0)
        die_input("%s:%zu: job %zu is '%s', but the run's grid gives '%s' there", r->file,
                  r->line, j, r->r.spec, spec);
    size_t i = evalset_index(es, spec, 0);
    if (es->res[i].spec[0] == '\0')
        es->res[i] = r->r;
}

/* Leaves collecting mode with room for every registered spec's result. */
static void evalset_fill_begin(evalset *es, const merge_set *m)
{
    es->collecting = 0;
    es->res = xcalloc(es->n ? es->n : 1, sizeof *es->res);
    es->heads = m->heads;
    es->layers = m->layers;
}

int cmd_merge(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &merge_spec, argc, argv);
    if (a.n_pos == 0)
        die_usage("no files to merge (see kvevict merge --help)");
    merge_set m;
    memset(&m, 0, sizeof m);
    for (size_t i = 0; i < a.n_pos; i++)
        read_file(&m, a.pos[i]);
    if (!m.have)
        die_input("no shard lines in the files given");

    char err[256];
    jv *run = jv_parse(m.run, err, sizeof err);
    if (!run)
        die_input("%s:%zu: \"run\": %s", m.file, m.line, err);
    run_desc d;
    parse_run(&m, run, &d);
    result_ctx c;
    memset(&c, 0, sizeof c);
    c.trace = m.trace;
    c.seed = m.seed;
    c.heads = m.heads;
    c.layers = m.layers;
    c.topk = d.a.topk;
    c.topk_given = d.a.topk_given;
    c.timings = 1;
    size_t steps = 0;
    for (size_t j = 0; j < m.jobs; j++)
        if (m.rec[j].r.steps > steps)
            steps = m.rec[j].r.steps;

    FILE *out = out_open(a.output);
    evalset es;
    evalset_init(&es);
    if (d.policy) { /* sweep */
        grid g;
        grid_init(&g, d.policy);
        if (d.a.n_budgets)
            grid_set_budgets(&g, d.a.budgets, d.a.n_budgets);
        for (size_t p = 0; p < d.params->n; p++)
            grid_add_param(&g, "--param", d.params->child[p].text);
        grid_check(&g);
        if (grid_points(&g) != m.jobs)
            die_input("%s:%zu: a grid of %zu jobs, but the run's has %zu", m.file, m.line,
                      m.jobs, grid_points(&g));
        check_complete(&m);
        result_ctx none = {0};
        render_grid(NULL, &es, &g, &none, FMT_TEXT); /* registers every point */
        evalset_fill_begin(&es, &m);
        for (size_t j = 0; j < m.jobs; j++) {
            char *spec = grid_spec(&g, j);
            put_result(&es, &m, j, spec);
            free(spec);
        }
        evalset_warn_unscored(&es, steps);
        render_grid(out, &es, &g, &c, a.format);
        grid_free(&g);
    } else { /* bench */
        bench_opts o = {bench_default_budgets, 2, 0};
        if (d.a.n_budgets) {
            o.budgets = d.a.budgets;
            o.n_budgets = d.a.n_budgets;
        }
        o.canonical = strncmp(d.trace, "canonical", 9) == 0 &&
                      (d.trace[9] == '\0' || d.trace[9] == ':');
        bench_collect(&es, &o, d.trace, d.key_dim);
        if (es.n != m.jobs)
            die_input("%s:%zu: a grid of %zu jobs, but the run's report needs %zu", m.file,
                      m.line, m.jobs, es.n);
        check_complete(&m);
        evalset_fill_begin(&es, &m);
        for (size_t j = 0; j < m.jobs; j++)
            put_result(&es, &m, j, es.spec[j]);
        evalset_warn_unscored(&es, steps);
        render_bench(out, &es, &o, &c, a.format);
    }
    evalset_free(&es);
    jv_free(run);
    free(m.run);
    free(m.trace);
    free(m.rec);
    out_close(out);
    return 0;
}
