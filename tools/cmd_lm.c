/* SPDX-License-Identifier: MIT */
/*
 * cmd_lm.c - the llama2.c decoder on the command line: `kvevict lm logits`,
 * `lm eval`, `lm passkey`, `lm repeat`, `lm dump`, `lm prefill` and `kvevict
 * generate`.
 *
 * Every command loads a checkpoint (and where text is involved a tokenizer:
 * --tokenizer, else a GGUF's own, else tokenizer.bin beside the checkpoint) and runs the
 * decoder of lm/lm.h, one kvevict policy per (layer, KV head). Arguments are
 * checked before any file is read, so usage errors (exit 2) come before
 * input errors (exit 1); arguments that can only be checked against the
 * model (a token id, a distance) are usage errors too. What the decoder
 * allocates stays reachable from `ctx` until exit, so an early exit leaks
 * nothing that a leak checker could call lost. Output files go through
 * out_open/out_close, so a failure or a signal leaves no partial file.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "lm.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- shared pieces ---------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct {
    lm_model *model;
    lm_tokenizer *tok;
    char *text;
    size_t text_len;
    int32_t *ids; /* the text, encoded */
    size_t n_ids;
    budget_args budgets; /* --share-heads, --schedule, ... (budgets.c) */
    double *layer_weights; /* (L) --schedule attention: measured on --calibration */
    size_t threads;        /* --threads: the decoder's matrix threads */
} ctx;

/* Exit for a failed lm call: KVE_EINVAL is usage, the rest bad input. */
#if defined(__GNUC__)
#define LM_NORETURN __attribute__((noreturn))
#else
#define LM_NORETURN
#endif
LM_NORETURN static void die_lm(kve_status s, const char *what)
{
    if (s == KVE_EINVAL)
        die_usage("%s: %s", what, lm_last_error());
    die_input("%s: %s", what, lm_last_error());
}

/* The value of own option `name`, NULL when absent. */
static const char *own(const cli_args *a, const cli_spec *spec, const char *name)
{
    const opt_val *v = cli_own(a, spec, name);
    return v->count ? v->v[0] : NULL;
}

static const char *need(const cli_args *a, const cli_spec *spec, const char *name)
{
    const char *v = own(a, spec, name);
    if (!v)
        die_usage("missing required option '--%s' (see kvevict %s --help)", name, cli_cmd);
    return v;
}

/* --threads N (default: the cores available) into ctx.threads. */
static void parse_threads(const cli_args *a, const cli_spec *spec)
{
    const char *v = own(a, spec, "threads");
    ctx.threads = v ? (size_t)parse_u64("--threads", v, 1, LM_MAX_THREADS) : lm_cores();
}

static lm_positions opt_positions(const char *s)
{
    if (!s || strcmp(s, "original") == 0)
        return LM_POS_ORIGINAL;
    if (strcmp(s, "cache") == 0)
        return LM_POS_CACHE;
    die_usage("--positions: '%s' is neither 'original' nor 'cache'", s);
}

static const char *positions_name(lm_positions p)
{
    return p == LM_POS_CACHE ? "cache" : "original";
}

static void load_model(const char *path)
{
    kve_status s = lm_model_open(path, &ctx.model);
    if (s != KVE_OK)
        die_input("--model %s: %s", path, lm_last_error());
}

/* The tokenizer at `path`, else tokenizer.bin in the checkpoint's directory;
 * its pieces must be the model's vocabulary. Messages begin with `what`. */
static lm_tokenizer *open_tokenizer(const char *path, const char *model_path, const lm_model *m,
                                    const char *what)
{
    char buf[4096];
    if (!path && m->config.format == LM_FORMAT_GGUF) { /* the GGUF's own vocabulary */
        lm_tokenizer *t = NULL;
        if (lm_tokenizer_from_model(m, &t) != KVE_OK)
            die_input("%s not given, and %s: %s", what, model_path, lm_last_error());
        return t;
    }
    if (!path) {
        const char *slash = strrchr(model_path, '/');
        int dirlen = slash ? (int)(slash - model_path) : 1;
        snprintf(buf, sizeof buf, "%.*s/tokenizer.bin", dirlen, slash ? model_path : ".");
        if (access(buf, F_OK) != 0)
            die_usage("%s not given and %s does not exist", what, buf);
        path = buf;
    }
    lm_tokenizer *t = NULL;
    kve_status s = lm_tokenizer_open(path, &t);
    if (s != KVE_OK)
        die_input("%s %s: %s", what, path, lm_last_error());
    if (t->n_pieces != m->config.vocab_size) {
        int32_t n = t->n_pieces;
        lm_tokenizer_free(t);
        die_input("%s %s: %d pieces, but the model's vocab_size is %d", what, path, n,
                  m->config.vocab_size);
    }
    return t;
}

static void load_tokenizer(const char *path, const char *model_path)
{
    ctx.tok = open_tokenizer(path, model_path, ctx.model, "--tokenizer");
}

/* Reads --text ("-": standard input) whole; NUL bytes are refused. */
static void load_text(const char *path)
{
    kve_status st = lm_read_file(path, &ctx.text, &ctx.text_len);
    if (st != KVE_OK)
        die_input("--text: %s", lm_last_error());
    const char *nul = memchr(ctx.text, 0, ctx.text_len);
    if (nul)
        die_input("--text %s: a NUL byte at offset %zu", path, (size_t)(nul - ctx.text));
}

static int32_t *encode(const char *s, size_t len, size_t *n)
{
    int32_t *ids = xmalloc((len + 1) * sizeof *ids);
    kve_status st = lm_encode(ctx.tok, s, len, ids, len + 1, n);
    if (st != KVE_OK) {
        free(ids);
        die_lm(st, "encode");
    }
    return ids;
}

static void encode_text(const char *path)
{
    ctx.ids = encode(ctx.text, ctx.text_len, &ctx.n_ids);
    if (ctx.n_ids == 0)
        die_input("--text %s: empty", path);
}

/* Splits --policy SPEC[,SPEC...]: an item holding '=' but no ':' is a
 * parameter of the spec before it ("h2o:budget=64,recent_window=8,window"
 * is two specs). Repeated --policy options add to the list. */
static char **split_specs(const opt_val *v, size_t *n)
{
    char **out = NULL;
    *n = 0;
    for (int k = 0; k < v->count; k++) {
        size_t m;
        char **items = split_list("--policy", v->v[k], &m);
        for (size_t i = 0; i < m; i++) {
            if (*n > 0 && strchr(items[i], '=') && !strchr(items[i], ':')) {
                char *prev = out[*n - 1];
                size_t len = strlen(prev) + strlen(items[i]) + 2;
                out[*n - 1] = xmalloc(len);
                snprintf(out[*n - 1], len, "%s,%s", prev, items[i]);
                free(prev);
                continue;
            }
            out = xrealloc(out, (*n + 1) * sizeof *out);
            out[(*n)++] = xstrdup(items[i]);
        }
        free_list(items, m);
    }
    return out;
}

/* A budget: B (a count) or P% of the context, floor(P * seq_len / 100). */
static size_t budget_of(const char *s, int32_t seq_len)
{
    size_t len = strlen(s);
    if (len > 1 && s[len - 1] == '%') {
        char *end;
        errno = 0;
        double p = strtod(s, &end);
        if (end != s + len - 1 || errno || !(p > 0) || p > 100 || s[0] < '0' || s[0] > '9')
            die_usage("--budget: '%s' is not a percentage in (0, 100]", s);
        size_t b = (size_t)floor(p * (double)seq_len / 100.0);
        if (b == 0)
            die_usage("--budget: %s of the context (%d) is no position", s, seq_len);
        return b;
    }
    return (size_t)parse_u64("--budget", s, 1, KVE_MAX_BUDGET);
}

/* A decoder; dies (usage) on a bad spec. The budgets options apply. */
static lm_state *new_state(const char *spec, size_t budget, lm_positions pos, uint64_t seed)
{
    lm_options o = {.policy = spec, .budget = budget, .positions = pos, .seed = seed,
                    .schedule = ctx.budgets.schedule, .beta = ctx.budgets.beta,
                    .layer_weights = ctx.layer_weights, .share_heads = ctx.budgets.share_heads,
                    .min_share = ctx.budgets.min_share, .threads = ctx.threads};
    lm_state *s = NULL;
    kve_status st = lm_state_new(ctx.model, &o, &s);
    if (st != KVE_OK)
        die_lm(st, "--policy");
    return s;
}

/* A command's cli_spec from its usage, shared options and own option table. */
#define LM_SPEC(usage_, shared_, own_, format_)                                                    \
    {                                                                                              \
        .usage = (usage_), .shared = (shared_), CLI_OWN(own_), .default_format = (format_)        \
    }

/* ---- the measuring commands' common part: eval, passkey, repeat ------------ */

/* Options every measuring command takes, first in its own table. */
#define MEASURE_OPTS                                                                               \
    {"model", 0, OPT_VALUE}, {"text", 0, OPT_VALUE}, {"tokenizer", 0, OPT_VALUE},                  \
        {"policy", 0, OPT_VALUE | OPT_REPEAT}, {"budget", 0, OPT_VALUE | OPT_REPEAT},              \
        {"positions", 0, OPT_VALUE}, {"threads", 0, OPT_VALUE}, BUDGET_OPTS

typedef struct measure_args {
    cli_args a;
    const char *model, *text;
    char **specs, **budgets;
    size_t n_specs, n_budgets;
    lm_positions positions;
} measure_args;

/* Parses the options and loads model, tokenizer and text. Every argument is
 * checked before a file is read. */
static void measure_parse(measure_args *m, const cli_spec *spec, int argc, char **argv)
{
    memset(m, 0, sizeof *m);
    cli_parse(&m->a, spec, argc, argv);
    m->model = need(&m->a, spec, "model");
    m->text = need(&m->a, spec, "text");
    m->specs = split_specs(cli_own(&m->a, spec, "policy"), &m->n_specs);
    for (size_t i = 0; i < m->n_specs; i++)
        free(canon_spec("--policy", m->specs[i], 0));
    const opt_val *bv = cli_own(&m->a, spec, "budget");
    for (int k = 0; k < bv->count; k++) {
        size_t n;
        char **items = split_list("--budget", bv->v[k], &n);
        for (size_t i = 0; i < n; i++)
            budget_of(items[i], 100); /* the syntax; the size once the model is known */
        m->budgets = xrealloc(m->budgets, (m->n_budgets + n) * sizeof *m->budgets);
        memcpy(m->budgets + m->n_budgets, items, n * sizeof *items);
        m->n_budgets += n;
        free(items);
    }
    if (m->n_budgets && !m->n_specs)
        die_usage("--budget needs --policy");
    m->positions = opt_positions(own(&m->a, spec, "positions"));
    parse_threads(&m->a, spec);
    budget_args_parse(&ctx.budgets, &m->a, spec);
}

/* --schedule attention: each layer's spread beyond the calibration window,
 * on BOS and the first seq_len - 1 tokens of the --calibration text. */
static void load_calibration(const char *path)
{
    char *text = NULL;
    size_t len = 0, n = 0;
    kve_status st = lm_read_file(path, &text, &len);
    if (st != KVE_OK)
        die_input("--calibration: %s", lm_last_error());
    int32_t *ids = encode(text, len, &n);
    size_t most = (size_t)ctx.model->config.seq_len - 1;
    ctx.layer_weights = xcalloc((size_t)ctx.model->config.n_layers, sizeof *ctx.layer_weights);
    st = lm_layer_spread(ctx.model, ids, n < most ? n : most, ctx.budgets.calibration_window,
                         ctx.layer_weights);
    lm_free(text);
    free(ids);
    if (st != KVE_OK)
        die_input("--calibration %s: %s", path, lm_last_error());
}

static void measure_load(const measure_args *m, const cli_spec *spec)
{
    load_model(m->model);
    load_tokenizer(own(&m->a, spec, "tokenizer"), m->model);
    load_text(m->text);
    encode_text(m->text);
    if (ctx.budgets.calibration)
        load_calibration(ctx.budgets.calibration);
}

static void measure_free(measure_args *m)
{
    free_list(m->specs, m->n_specs);
    free_list(m->budgets, m->n_budgets);
}

/* The (policy, budget) jobs: job 0 is the full cache (no policy), then every
 * spec at every budget, budgets outermost. */
typedef struct job {
    char *spec;    /* canonical, budget applied; NULL for the full cache */
    size_t budget; /* 0 for the full cache */
    lm_state *s;
} job;

static job *make_jobs(const measure_args *m, size_t *n_jobs)
{
    size_t nb = m->n_budgets ? m->n_budgets : 1;
    job *jobs = xcalloc(1 + m->n_specs * nb, sizeof *jobs);
    jobs[0].s = new_state(NULL, 0, m->positions, m->a.seed);
    size_t n = 1;
    for (size_t b = 0; b < nb; b++) {
        size_t budget = m->n_budgets ? budget_of(m->budgets[b], ctx.model->config.seq_len) : 0;
        for (size_t i = 0; i < m->n_specs; i++) {
            jobs[n].s = new_state(m->specs[i], budget, m->positions, m->a.seed);
            jobs[n].spec = xstrdup(jobs[n].s->spec);
            jobs[n].budget = jobs[n].s->budget;
            n++;
        }
    }
    *n_jobs = n;
    return jobs;
}

static void free_jobs(job *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        lm_state_free(jobs[i].s);
        free(jobs[i].spec);
    }
    free(jobs);
}

/* The first cells of a row: policy ("full" for the full cache), budget
 * (null for the full cache), positions; then, with budgets options, the
 * schedule, the sharing and the layer budgets. */
static void job_cells(table *t, const job *jb, lm_positions positions)
{
    table_str(t, jb->spec ? jb->spec : "full");
    if (jb->spec)
        table_uint(t, jb->budget);
    else
        table_real(t, NAN, "%.0f");
    table_str(t, positions_name(positions));
    budget_cells(t, &ctx.budgets, jb->spec ? jb->s->layer_budget : NULL,
                 (size_t)ctx.model->config.n_layers);
}

/* The columns of job_cells, then `rest`; returns the count. */
static size_t job_cols(col *cols, const col *rest, size_t n_rest)
{
    size_t n = 0;
    cols[n++] = (col){"policy", KEY_POLICY, COL_ALL | COL_LEFT | COL_CODE};
    cols[n++] = (col){"budget", KEY_BUDGET, COL_ALL};
    cols[n++] = (col){"positions", "positions", COL_CSV | COL_JSON};
    n = budget_cols(cols, n, &ctx.budgets);
    memcpy(cols + n, rest, n_rest * sizeof *rest);
    return n + n_rest;
}

/* ---- lm logits ---------------------------------------------------------------- */

static const char logits_usage[] =
    "usage: kvevict lm logits --model CKPT (--tokens ID,ID,... | --prompt TEXT)\n"
    "                         [--tokenizer TOK] [--policy SPEC] [--budget B]\n"
    "                         [--positions original|cache] [--seed N] [-o FILE]\n"
    "\n"
    "Decodes the tokens from position 0 and prints, for every position t, one JSON\n"
    "object per line:\n"
    "  {\"pos\": t, \"token\": id, \"logits\": [every vocabulary entry]}\n"
    "with each logit a float32 printed with the digits that read back to the same\n"
    "float (%.9g).\n"
    "\n"
    "  --model CKPT     a checkpoint, its format told from the file: llama2.c\n"
    "                   (legacy, version 1 float32, version 2 int8) or GGUF (llama:\n"
    "                   F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K)\n"
    "  --tokens LIST    token ids, decoded as given (no BOS is added)\n"
    "  --prompt TEXT    instead of --tokens: BOS, then TEXT encoded with the tokenizer\n"
    "  --tokenizer TOK  tokenizer.bin (default: a GGUF's own vocabulary, else\n"
    "                   tokenizer.bin beside CKPT); only read with --prompt\n"
    "  --policy SPEC    the policy of every (layer, KV head), e.g. window:budget=64;\n"
    "                   default: none, every key kept (--policy full is identical)\n"
    "  --budget B       evict to B positions (default: the spec's budget)\n"
    "  --positions P    original (keys rotated at their position, the default) or\n"
    "                   cache (keys rotated at their index in the cache)\n"
    "  --seed N         seed of the policies' random numbers (default 0)\n"
    "  --threads N      matrix products on N threads (default: the cores available;\n"
    "                   the same bits for every N)\n"
    "  -o, --output F   write to F instead of standard output\n";

static const opt_def logits_own[] = {{"model", 0, OPT_VALUE},
                                     {"tokens", 0, OPT_VALUE},
                                     {"prompt", 0, OPT_VALUE},
                                     {"tokenizer", 0, OPT_VALUE},
                                     {"positions", 0, OPT_VALUE},
                                     {"threads", 0, OPT_VALUE}};
static const cli_spec logits_spec =
    LM_SPEC(logits_usage, SO_POLICY | SO_BUDGET | SO_SEED | SO_OUTPUT, logits_own, FMT_JSON);

/* A float32 as JSON with the digits that round-trip (%.9g); null if not finite. */
static void json_float(FILE *f, float x)
{
    if (isfinite(x))
        fprintf(f, "%.9g", (double)x);
    else
        fputs("null", f);
}

static int lm_logits(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &logits_spec, argc, argv);
    const cli_spec *sp = &logits_spec;
    const char *model = need(&a, sp, "model");
    const char *tokens = own(&a, sp, "tokens"), *prompt = own(&a, sp, "prompt");
    if (!tokens == !prompt)
        die_usage("give exactly one of --tokens and --prompt");
    lm_positions positions = opt_positions(own(&a, sp, "positions"));
    parse_threads(&a, sp);
    if (a.budget && !a.policy)
        die_usage("--budget needs --policy");
    if (a.policy)
        free(canon_spec("--policy", a.policy, a.budget));
    int32_t *toks = NULL;
    size_t n = 0;
    if (tokens) {
        char **items = split_list("--tokens", tokens, &n);
        toks = xmalloc(n * sizeof *toks);
        for (size_t i = 0; i < n; i++)
            toks[i] = (int32_t)parse_u64("--tokens", items[i], 0, INT32_MAX);
        free_list(items, n);
    }
    load_model(model);
    int32_t V = ctx.model->config.vocab_size;
    if (prompt) {
        load_tokenizer(own(&a, sp, "tokenizer"), model);
        size_t m;
        int32_t *ids = encode(prompt, strlen(prompt), &m);
        toks = xmalloc((m + 1) * sizeof *toks);
        toks[0] = LM_BOS;
        memcpy(toks + 1, ids, m * sizeof *ids);
        n = m + 1;
        free(ids);
    }
    for (size_t i = 0; i < n; i++)
        if (toks[i] >= V)
            die_usage("--tokens: token %d is outside the model's vocabulary [0, %d)", toks[i], V);
    lm_state *s = new_state(a.policy, a.budget, positions, a.seed);
    FILE *out = out_open(a.output);
    for (size_t t = 0; t < n; t++) {
        kve_status st = lm_forward(s, toks[t]);
        if (st != KVE_OK)
            die_lm(st, "decode");
        fprintf(out, "{\"pos\": %zu, \"token\": %d, \"logits\": [", t, toks[t]);
        for (int32_t i = 0; i < V; i++) {
            if (i)
                fputs(", ", out);
            json_float(out, s->logits[i]);
        }
        fputs("]}\n", out);
    }
    out_close(out);
    lm_state_free(s);
    free(toks);
    return 0;
}

/* ---- lm eval ------------------------------------------------------------------ */

static const char eval_usage[] =
    "usage: kvevict lm eval --model CKPT --text FILE [--tokenizer TOK]\n"
    "                       [--policy SPEC[,SPEC...]] [--budget B[,B...]]\n"
    "                       [--positions original|cache] [--seed N]\n"
    "                       [--format text|md|csv|json | --json | --csv | --md] [-o FILE]\n"
    "\n"
    "Bits per byte and per token of the model on a text, with the full cache and\n"
    "with every policy at every budget, paired window by window. The text is\n"
    "encoded once (dummy prefix, no BOS or EOS) and cut into consecutive chunks\n"
    "of seq_len - 1 tokens (the last shorter); each window is BOS + chunk,\n"
    "decoded from a fresh cache, its loss summed over the chunk's tokens.\n"
    "bits/byte = nats / ln 2 / (UTF-8 bytes of the text + 1); bits/token = nats /\n"
    "ln 2 / tokens. Standard errors treat windows as the samples (docs/decoder.md):\n"
    "se of bits/byte, and of its difference to the full cache, paired per window.\n"
    "\n"
    "  --model CKPT        a llama2.c (legacy, version 1 or 2) or GGUF checkpoint\n"
    "  --text FILE         the text (\"-\": standard input)\n"
    "  --tokenizer TOK     tokenizer.bin (default: a GGUF's own vocabulary, else\n"
    "                      tokenizer.bin beside CKPT)\n"
    "  --policy SPECS      policies, comma-separated (a key=value item belongs to\n"
    "                      the spec before it); may be repeated. Default: none,\n"
    "                      the full cache alone\n"
    "  --budget LIST       budgets: counts (64) or percentages of the context (20%);\n"
    "                      every policy runs at every budget (default: the spec's)\n"
    "  --positions P       original (default) or cache\n"
    "  --seed N            seed of the policies' random numbers (default 0)\n"
    "  --threads N         matrix products on N threads (default: the cores)\n"
    "  --format F          text (default), md, csv or json; --json, --csv, --md\n"
    "  -o, --output F      write to F instead of standard output\n"
    "\n"
    "Budgets across heads and layers (docs/budgets.md): the budget is the mean per\n"
    "KV head; rows add the keys schedule, share and layer_budgets.\n"
    BUDGET_USAGE
    "                      (SRC: a text, its first seq_len - 1 tokens after BOS)\n"
    "\n"
    "The first row is the full cache (policy full, budget null in JSON). JSON keys:\n"
    "policy, budget, positions, windows, tokens, bytes, bits_per_byte,\n"
    "bits_per_byte_se, bits_per_token, full_bits_per_byte, delta_bits_per_byte,\n"
    "delta_bits_per_byte_se, seed.\n";

static const opt_def eval_own[] = {MEASURE_OPTS};
static const cli_spec eval_spec =
    LM_SPEC(eval_usage, SO_SEED | SO_FORMAT | SO_OUTPUT, eval_own, FMT_TEXT);

/* Standard error of the ratio sum(x) / den over samples x_i weighted by
 * b_i (delta method): sqrt(W / (W - 1) * sum (x_i - r b_i)^2) / den, with
 * r = sum(x) / sum(b). NAN with fewer than two samples. */
static double ratio_se(const double *x, const double *b, size_t w, double den)
{
    if (w < 2)
        return NAN;
    double sx = 0, sb = 0;
    for (size_t i = 0; i < w; i++) {
        sx += x[i];
        sb += b[i];
    }
    double r = sx / sb, ss = 0;
    for (size_t i = 0; i < w; i++)
        ss += (x[i] - r * b[i]) * (x[i] - r * b[i]);
    return sqrt((double)w / (double)(w - 1) * ss) / den;
}

static int lm_eval(int argc, char **argv)
{
    measure_args m;
    measure_parse(&m, &eval_spec, argc, argv);
    measure_load(&m, &eval_spec);
    size_t n_jobs;
    job *jobs = make_jobs(&m, &n_jobs);
    size_t chunk = (size_t)ctx.model->config.seq_len - 1;
    if (chunk == 0)
        die_input("--model: seq_len 1 leaves no room after BOS");
    FILE *out = out_open(m.a.output);

    size_t W = (ctx.n_ids + chunk - 1) / chunk;
    double *bits = xcalloc(n_jobs * W, sizeof *bits); /* (jobs, W) */
    double *bytes = xcalloc(W, sizeof *bytes);        /* (W) */
    progress pr;
    progress_begin(&pr, "token", (uint64_t)ctx.n_ids * n_jobs, 0, 1);
    uint64_t done = 0;
    for (size_t w = 0; w < W; w++) {
        const int32_t *toks = ctx.ids + w * chunk;
        size_t n = w + 1 < W ? chunk : ctx.n_ids - w * chunk;
        for (size_t i = 0; i < n; i++) {
            size_t len;
            lm_decode(ctx.tok, 0, toks[i], &len);
            bytes[w] += (double)len;
        }
        for (size_t j = 0; j < n_jobs; j++) {
            double nats;
            kve_status st = lm_window_nats(jobs[j].s, toks, n, &nats, NULL);
            if (st != KVE_OK)
                die_lm(st, jobs[j].spec ? jobs[j].spec : "full cache");
            bits[j * W + w] = nats / log(2.0);
            progress_update(&pr, done += n);
        }
    }
    progress_end(&pr);
    if (W < 2)
        warn("one window: no standard errors");

    static const col rest[] = {
        {"windows", "windows", COL_CSV | COL_JSON},
        {"tokens", "tokens", COL_CSV | COL_JSON},
        {"bytes", "bytes", COL_CSV | COL_JSON},
        {"bits/byte", "bits_per_byte", COL_ALL},
        {"se", "bits_per_byte_se", COL_ALL},
        {"bits/token", "bits_per_token", COL_ALL},
        {"full bits/byte", "full_bits_per_byte", COL_ALL},
        {"delta", "delta_bits_per_byte", COL_ALL},
        {"delta se", "delta_bits_per_byte_se", COL_ALL},
        {"seed", KEY_SEED, COL_CSV | COL_JSON},
    };
    col cols[TABLE_MAXCOLS];
    table t;
    table_init(&t, cols, job_cols(cols, rest, sizeof rest / sizeof rest[0]));
    double total_bytes = (double)ctx.text_len + 1, full = 0;
    for (size_t w = 0; w < W; w++)
        full += bits[w];
    double *diff = xmalloc(W * sizeof *diff);
    for (size_t j = 0; j < n_jobs; j++) {
        const double *x = bits + j * W;
        double sum = 0, dsum = 0;
        for (size_t w = 0; w < W; w++) {
            sum += x[w];
            diff[w] = x[w] - bits[w];
            dsum += diff[w];
        }
        job_cells(&t, &jobs[j], m.positions);
        table_uint(&t, W);
        table_uint(&t, ctx.n_ids);
        table_uint(&t, ctx.text_len + 1);
        table_real(&t, sum / total_bytes, "%.4f");
        table_real(&t, ratio_se(x, bytes, W, total_bytes), "%.4f");
        table_real(&t, sum / (double)ctx.n_ids, "%.4f");
        table_real(&t, full / total_bytes, "%.4f");
        table_real(&t, dsum / total_bytes, "%+.4f");
        table_real(&t, j ? ratio_se(diff, bytes, W, total_bytes) : NAN, "%.4f");
        table_uint(&t, m.a.seed);
    }
    if (m.a.format == FMT_TEXT)
        fprintf(out, "%s: %zu tokens, %zu bytes, %zu windows of up to %zu tokens, positions %s\n\n",
                m.text, ctx.n_ids, ctx.text_len + 1, W, chunk, positions_name(m.positions));
    table_print(&t, out, m.a.format);
    table_free(&t);
    out_close(out);
    free(diff);
    free(bits);
    free(bytes);
    free_jobs(jobs, n_jobs);
    measure_free(&m);
    return 0;
}

/* ---- lm passkey and lm repeat ---------------------------------------------------
 *
 * The prompts of the training engineer's models/README.md, rebuilt from
 * token ids: H is the text encoded once (dummy prefix, no BOS/EOS), enc(s)
 * run.c's encode of s, L = seq_len.
 *   pass key, trial j at distance d:
 *     [BOS] F1 enc(INTRO) KEY enc(AFTER) F2 enc(QUESTION), exactly L tokens;
 *     KEY = "<keyNN>", NN = j mod 64, at position k = L-1-d; f1 = k-1-a,
 *     m = L-2-a-b-q (a, b, q the segments' lengths), s = j (|H| - m) / N,
 *     F1 = H[s, s+f1), F2 = H[s+f1, s+m). Scored: the argmax at L-1 is KEY.
 *   repeated passage, trial j at distance r, span P:
 *     W = [BOS] H[s, s+L-1), s = j (|H| - (L-1)) / N, then W[L-P+i] =
 *     W[L-P-r+i] for i < P; scored: the mean loss over i = 1..P-1 of each
 *     occurrence's tokens, each predicted from the position before it.
 */

static const char *const PK_INTRO = "The pass key is #";
static const char *const PK_AFTER = "Remember it.";
static const char *const PK_QUESTION = "What is the pass key? The pass key is #";
enum { PK_KEYS = 64 };

/* The pass-key template: its three segments encoded, the 64 keys found. */
typedef struct pk_template {
    int32_t *intro, *after, *question;
    size_t na, nb, nq;
    int32_t keys[PK_KEYS];
} pk_template;

static void pk_load(pk_template *p)
{
    p->intro = encode(PK_INTRO, strlen(PK_INTRO), &p->na);
    p->after = encode(PK_AFTER, strlen(PK_AFTER), &p->nb);
    p->question = encode(PK_QUESTION, strlen(PK_QUESTION), &p->nq);
    for (int k = 0; k < PK_KEYS; k++) {
        char name[16];
        snprintf(name, sizeof name, "<key%02d>", k);
        p->keys[k] = lm_piece_id(ctx.tok, name, strlen(name));
        if (p->keys[k] < 0)
            die_input("--tokenizer: no piece %s (the pass keys are <key00> .. <key63>)", name);
    }
}

static void pk_free(pk_template *p)
{
    free(p->intro), free(p->after), free(p->question);
}

/* Writes trial j of N at distance d (L tokens) to w; returns its key. */
static int32_t pk_prompt(const pk_template *p, size_t L, size_t j, size_t N, size_t d, int32_t *w)
{
    size_t na = p->na, nb = p->nb, nq = p->nq;
    size_t k = L - 1 - d, f1 = k - 1 - na, m = L - 2 - na - nb - nq;
    size_t s = (size_t)((uint64_t)j * (ctx.n_ids - m) / N), o = 0;
    int32_t key = p->keys[j % PK_KEYS];
    w[o++] = LM_BOS;
    memcpy(w + o, ctx.ids + s, f1 * sizeof *w), o += f1;
    memcpy(w + o, p->intro, na * sizeof *w), o += na;
    w[o++] = key;
    memcpy(w + o, p->after, nb * sizeof *w), o += nb;
    memcpy(w + o, ctx.ids + s + f1, (m - f1) * sizeof *w), o += m - f1;
    memcpy(w + o, p->question, nq * sizeof *w);
    return key;
}

static const char passkey_usage[] =
    "usage: kvevict lm passkey --model CKPT --text FILE [--tokenizer TOK]\n"
    "                          [--policy SPEC[,SPEC...]] [--budget B[,B...]]\n"
    "                          [--distances D,...] [--trials N] [--positions P] [--seed N]\n"
    "                          [--format F | --json | --csv | --md] [-o FILE]\n"
    "\n"
    "Long-range recall: a single-token pass key (\"<keyNN>\") stated once, held-out\n"
    "text, then asked for; accuracy is how often the model's argmax at the last\n"
    "position is the key (chance 1/64), by policy, budget and distance (key to\n"
    "last position). Prompts are those of models/README.md, built from FILE.\n"
    "\n"
    "  --distances LIST  distances (default: 64, 128, ... within the valid range,\n"
    "                    and its top)\n"
    "  --trials N        prompts per distance (default 128)\n"
    "  other options as for `kvevict lm eval`; JSON rows: policy, budget,\n"
    "  positions, distance, trials, accuracy, accuracy_se, key_accuracy\n"
    "  (argmax over the 64 keys only), chance, seed.\n";

static const char repeat_usage[] =
    "usage: kvevict lm repeat --model CKPT --text FILE [--tokenizer TOK]\n"
    "                         [--policy SPEC[,SPEC...]] [--budget B[,B...]]\n"
    "                         [--distances R,...] [--trials N] [--span P] [--positions P]\n"
    "                         [--seed N] [--format F | --json | --csv | --md] [-o FILE]\n"
    "\n"
    "The continuous recall measure: a held-out window whose last P tokens repeat a\n"
    "passage r tokens earlier; the mean loss (nats/token) on the second occurrence\n"
    "against the first, by policy, budget and distance r. A model that copies\n"
    "predicts the repeat far better than the first occurrence; evicting the first\n"
    "occurrence takes that away. Windows are those of models/README.md.\n"
    "\n"
    "  --distances LIST  distances r (default: P, 64, 128, ... up to L-1-P)\n"
    "  --trials N        windows per distance (default 64)\n"
    "  --span P          repeated tokens (default 32)\n"
    "  other options as for `kvevict lm eval`; JSON rows: policy, budget, positions,\n"
    "  distance, trials, span, first_nats, second_nats, second_nats_se, seed.\n";

static const opt_def passkey_own[] = {
    MEASURE_OPTS, {"distances", 0, OPT_VALUE}, {"trials", 0, OPT_VALUE}};
static const cli_spec passkey_spec =
    LM_SPEC(passkey_usage, SO_SEED | SO_FORMAT | SO_OUTPUT, passkey_own, FMT_TEXT);
static const opt_def repeat_own[] = {
    MEASURE_OPTS, {"distances", 0, OPT_VALUE}, {"trials", 0, OPT_VALUE}, {"span", 0, OPT_VALUE}};
static const cli_spec repeat_spec =
    LM_SPEC(repeat_usage, SO_SEED | SO_FORMAT | SO_OUTPUT, repeat_own, FMT_TEXT);

/* Distances from --distances, or 64-steps within [lo, hi] plus hi (and lo
 * first when `with_lo`); each must lie in [lo, hi]. */
static size_t *distances(const char *list, size_t lo, size_t hi, int with_lo, size_t *n)
{
    size_t *d = xmalloc((hi / 64 + 3) * sizeof *d);
    *n = 0;
    if (list) {
        size_t m;
        char **items = split_list("--distances", list, &m);
        d = xrealloc(d, m * sizeof *d);
        for (size_t i = 0; i < m; i++) {
            d[i] = (size_t)parse_u64("--distances", items[i], 0, SIZE_MAX / 2);
            if (d[i] < lo || d[i] > hi) {
                free_list(items, m);
                die_usage("--distances: %zu is outside the valid range [%zu, %zu] for this "
                          "model and prompt",
                          d[i], lo, hi);
            }
        }
        free_list(items, m);
        *n = m;
        return d;
    }
    if (with_lo)
        d[(*n)++] = lo;
    for (size_t x = 64; x <= hi; x += 64)
        if (x >= lo && (!*n || x > d[*n - 1]))
            d[(*n)++] = x;
    if (!*n || d[*n - 1] != hi)
        d[(*n)++] = hi;
    return d;
}

/* Decodes a window from a fresh cache. Without per_pos: all n tokens, and
 * returns the argmax after the last. With per_pos: tokens[0 .. n-1), and
 * per_pos[i] (i < n - 1) is the loss of tokens[i + 1] after tokens[0 .. i]. */
static int32_t run_prompt(lm_state *s, const int32_t *tokens, size_t n, double *per_pos,
                          const char *what)
{
    kve_status st = lm_state_reset(s);
    int32_t V = ctx.model->config.vocab_size;
    size_t feed = per_pos ? n - 1 : n;
    for (size_t i = 0; st == KVE_OK && i < feed; i++) {
        st = lm_forward(s, tokens[i]);
        if (st == KVE_OK && per_pos)
            per_pos[i] = lm_token_nats(s->logits, V, tokens[i + 1]);
    }
    if (st != KVE_OK)
        die_lm(st, what);
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (s->logits[i] > s->logits[best])
            best = i;
    return best;
}

static int lm_recall(int argc, char **argv, int repeat)
{
    const cli_spec *sp = repeat ? &repeat_spec : &passkey_spec;
    measure_args ma;
    measure_parse(&ma, sp, argc, argv);
    const char *tr = own(&ma.a, sp, "trials");
    size_t trials = tr ? (size_t)parse_u64("--trials", tr, 1, 1u << 20) : (repeat ? 64 : 128);
    const char *span = repeat ? own(&ma.a, sp, "span") : NULL;
    size_t P = span ? (size_t)parse_u64("--span", span, 2, 1u << 20) : 32;
    measure_load(&ma, sp);
    size_t L = (size_t)ctx.model->config.seq_len;

    size_t lo, hi;
    pk_template pk = {0};
    if (!repeat) {
        pk_load(&pk);
        size_t na = pk.na, nb = pk.nb, nq = pk.nq;
        if (L < 2 + na + nb + nq)
            die_input("--model: seq_len %zu cannot hold the pass-key prompt", L);
        lo = nb + nq;
        hi = L - 2 - na;
        if (ctx.n_ids < L - 2 - na - nb - nq)
            die_input("--text %s: %zu tokens, the prompts need %zu", ma.text, ctx.n_ids,
                      L - 2 - na - nb - nq);
    } else {
        if (L < 2 * P + 1)
            die_usage("--span %zu: the context %zu holds no repeat", P, L);
        lo = P;
        hi = L - 1 - P;
        if (ctx.n_ids < L - 1)
            die_input("--text %s: %zu tokens, the windows need %zu", ma.text, ctx.n_ids, L - 1);
    }
    size_t nd;
    size_t *dist = distances(own(&ma.a, sp, "distances"), lo, hi, repeat, &nd);
    size_t n_jobs;
    job *jobs = make_jobs(&ma, &n_jobs);
    FILE *out = out_open(ma.a.output);

    int32_t *w = xmalloc(L * sizeof *w);
    double *loss = xmalloc(L * sizeof *loss);
    size_t cells = n_jobs * nd;
    double *r1 = xcalloc(cells, sizeof *r1), *r2 = xcalloc(cells, sizeof *r2);
    double *r3 = xcalloc(cells, sizeof *r3);
    progress pr;
    progress_begin(&pr, "prompt", (uint64_t)nd * trials * n_jobs, 0, 1);
    uint64_t done = 0;
    for (size_t di = 0; di < nd; di++) {
        size_t d = dist[di];
        for (size_t j = 0; j < trials; j++) {
            int32_t key = 0;
            if (!repeat) { /* the pass-key prompt */
                key = pk_prompt(&pk, L, j, trials, d, w);
            } else { /* the repeated passage */
                size_t s = (size_t)((uint64_t)j * (ctx.n_ids - (L - 1)) / trials);
                w[0] = LM_BOS;
                memcpy(w + 1, ctx.ids + s, (L - 1) * sizeof *w);
                for (size_t i = 0; i < P; i++)
                    w[L - P + i] = w[L - P - d + i];
            }
            for (size_t jb = 0; jb < n_jobs; jb++) {
                const char *what = jobs[jb].spec ? jobs[jb].spec : "full cache";
                size_t c = jb * nd + di;
                if (!repeat) {
                    int32_t best = run_prompt(jobs[jb].s, w, L, NULL, what);
                    r1[c] += best == key;
                    int32_t kb = pk.keys[0];
                    for (int k = 1; k < PK_KEYS; k++)
                        if (jobs[jb].s->logits[pk.keys[k]] > jobs[jb].s->logits[kb])
                            kb = pk.keys[k];
                    r2[c] += kb == key;
                } else {
                    run_prompt(jobs[jb].s, w, L, loss, what);
                    size_t p1 = L - P - d, p2 = L - P;
                    for (size_t i = 1; i < P; i++) {
                        r1[c] += loss[p1 + i - 1];
                        r2[c] += loss[p2 + i - 1];
                        r3[c] += loss[p2 + i - 1] * loss[p2 + i - 1];
                    }
                }
                progress_update(&pr, ++done);
            }
        }
    }
    progress_end(&pr);

    static const col pk_cols[] = {
        {"distance", "distance", COL_ALL},
        {"trials", "trials", COL_CSV | COL_JSON},
        {"accuracy", "accuracy", COL_ALL},
        {"se", "accuracy_se", COL_ALL},
        {"among keys", "key_accuracy", COL_ALL},
        {"chance", "chance", COL_CSV | COL_JSON},
        {"seed", KEY_SEED, COL_CSV | COL_JSON},
    };
    static const col rp_cols[] = {
        {"distance", "distance", COL_ALL},
        {"trials", "trials", COL_CSV | COL_JSON},
        {"span", "span", COL_CSV | COL_JSON},
        {"first nats", "first_nats", COL_ALL},
        {"second nats", "second_nats", COL_ALL},
        {"se", "second_nats_se", COL_ALL},
        {"seed", KEY_SEED, COL_CSV | COL_JSON},
    };
    table t;
    col cols[TABLE_MAXCOLS];
    if (repeat)
        table_init(&t, cols, job_cols(cols, rp_cols, sizeof rp_cols / sizeof rp_cols[0]));
    else
        table_init(&t, cols, job_cols(cols, pk_cols, sizeof pk_cols / sizeof pk_cols[0]));
    double count = repeat ? (double)trials * (double)(P - 1) : (double)trials;
    for (size_t jb = 0; jb < n_jobs; jb++) {
        for (size_t di = 0; di < nd; di++) {
            size_t c = jb * nd + di;
            double m1 = r1[c] / count, m2 = r2[c] / count;
            job_cells(&t, &jobs[jb], ma.positions);
            table_uint(&t, dist[di]);
            table_uint(&t, trials);
            if (repeat) {
                table_uint(&t, P);
                table_real(&t, m1, "%.4f");
                table_real(&t, m2, "%.4f");
                table_real(&t, sqrt(fmax(0.0, r3[c] / count - m2 * m2) / count), "%.4f");
            } else {
                table_real(&t, m1, "%.4f");
                table_real(&t, sqrt(m1 * (1 - m1) / count), "%.4f");
                table_real(&t, m2, "%.4f");
                table_real(&t, 1.0 / PK_KEYS, "%.4f");
            }
            table_uint(&t, ma.a.seed);
        }
    }
    if (ma.a.format == FMT_TEXT) {
        if (repeat)
            fprintf(out,
                    "repeated passage of %zu tokens, %zu windows per distance, positions "
                    "%s; loss in nats/token over tokens 2..%zu of each occurrence\n\n",
                    P, trials, positions_name(ma.positions), P);
        else
            fprintf(out, "pass key: %zu prompts per distance, positions %s, chance %.4f\n\n",
                    trials, positions_name(ma.positions), 1.0 / PK_KEYS);
    }
    table_print(&t, out, ma.a.format);
    table_free(&t);
    out_close(out);
    free(r1), free(r2), free(r3), free(w), free(loss), free(dist);
    pk_free(&pk);
    free_jobs(jobs, n_jobs);
    measure_free(&ma);
    return 0;
}

/* ---- lm stream ------------------------------------------------------------------
 *
 * One decode far past the context: position 0 is BOS, position p >= 1 holds
 * H[(p - 1) mod |H|] (the text encoded once, repeated end to end). Every job
 * decodes positions 0 .. N-2 once, never resetting its cache, and the loss
 * of the token at p (1 <= p < N), predicted from positions 0 .. p-1, goes to
 * bin p / W. The full cache (job 0) stops after its first M positions.
 */

static const char stream_usage[] =
    "usage: kvevict lm stream --model CKPT --text FILE --tokens N [--tokenizer TOK]\n"
    "                         [--policy SPEC[,SPEC...]] [--budget B[,B...]] [--bin W]\n"
    "                         [--full-tokens M] [--positions original|cache] [--seed N]\n"
    "                         [--format F | --json | --csv | --md] [-o FILE]\n"
    "\n"
    "The loss against position over one long decode with a bounded cache (the\n"
    "StreamingLLM experiment). The stream is BOS, then FILE's tokens (encoded once:\n"
    "dummy prefix, no BOS or EOS) repeated end to end, N positions in all; each\n"
    "policy at each budget decodes it once, never resetting its cache, past the\n"
    "model's context when N exceeds it. The loss of the token at position p,\n"
    "predicted from positions 0 .. p-1, is averaged over bins of W positions: bin\n"
    "k covers [kW, (k+1)W) (position 0, BOS, is not predicted). The full cache\n"
    "comes first and decodes only the first M positions: its work grows with the\n"
    "square of M and its memory with M.\n"
    "\n"
    "  --tokens N         positions in the stream, 2 to 2^30\n"
    "  --bin W            positions per bin (default: the model's context)\n"
    "  --full-tokens M    positions the full cache decodes (default N; 0: none)\n"
    "  other options as for `kvevict lm eval`; JSON rows: policy, budget,\n"
    "  positions, start, end, tokens, bytes, nats_per_token, bits_per_byte, seed.\n";

static const opt_def stream_own[] = {MEASURE_OPTS,
                                     {"tokens", 0, OPT_VALUE},
                                     {"bin", 0, OPT_VALUE},
                                     {"full-tokens", 0, OPT_VALUE}};
static const cli_spec stream_spec =
    LM_SPEC(stream_usage, SO_SEED | SO_FORMAT | SO_OUTPUT, stream_own, FMT_TEXT);

enum { STREAM_MAX_TOKENS = 1 << 30 };

static int lm_stream(int argc, char **argv)
{
    measure_args m;
    measure_parse(&m, &stream_spec, argc, argv);
    size_t N = (size_t)parse_u64("--tokens", need(&m.a, &stream_spec, "tokens"), 2,
                                 STREAM_MAX_TOKENS);
    const char *bs = own(&m.a, &stream_spec, "bin"), *fs = own(&m.a, &stream_spec, "full-tokens");
    size_t W = bs ? (size_t)parse_u64("--bin", bs, 1, STREAM_MAX_TOKENS) : 0;
    size_t M = fs ? (size_t)parse_u64("--full-tokens", fs, 0, STREAM_MAX_TOKENS) : N;
    if (M > N)
        die_usage("--full-tokens %zu: the stream has %zu positions", M, N);
    if (M == 1)
        die_usage("--full-tokens 1: one position predicts nothing (give 0 for no full cache)");
    measure_load(&m, &stream_spec);
    if (!W)
        W = (size_t)ctx.model->config.seq_len;
    size_t n_jobs;
    job *jobs = make_jobs(&m, &n_jobs);
    FILE *out = out_open(m.a.output);

    size_t n_bins = (N + W - 1) / W;
    double *nats = xcalloc(n_jobs * n_bins, sizeof *nats); /* (jobs, bins) */
    int32_t V = ctx.model->config.vocab_size;
    uint64_t total = (M ? M - 1 : 0) + (uint64_t)(n_jobs - 1) * (N - 1), done = 0;
    progress pr;
    progress_begin(&pr, "position", total, 0, 1);
    for (size_t j = 0; j < n_jobs; j++) {
        size_t n = j ? N : M; /* positions this job decodes, the last one only predicted */
        lm_state *s = jobs[j].s;
        for (size_t p = 0; p + 1 < n; p++) {
            kve_status st = lm_forward(s, p ? ctx.ids[(p - 1) % ctx.n_ids] : LM_BOS);
            if (st != KVE_OK)
                die_lm(st, jobs[j].spec ? jobs[j].spec : "full cache");
            nats[j * n_bins + (p + 1) / W] += lm_token_nats(s->logits, V, ctx.ids[p % ctx.n_ids]);
            progress_update(&pr, ++done);
        }
    }
    progress_end(&pr);

    static const col rest[] = {
        {"start", "start", COL_ALL},
        {"end", "end", COL_ALL},
        {"tokens", "tokens", COL_CSV | COL_JSON},
        {"bytes", "bytes", COL_CSV | COL_JSON},
        {"nats/token", "nats_per_token", COL_ALL},
        {"bits/byte", "bits_per_byte", COL_ALL},
        {"seed", KEY_SEED, COL_CSV | COL_JSON},
    };
    col cols[TABLE_MAXCOLS];
    table t;
    table_init(&t, cols, job_cols(cols, rest, sizeof rest / sizeof rest[0]));
    for (size_t j = 0; j < n_jobs; j++) {
        size_t n = j ? N : M;
        for (size_t b = 0; b * W < n; b++) {
            size_t start = b * W, end = start + W < n ? start + W : n;
            size_t count = end - (start ? start : 1);
            if (count == 0)
                continue;
            double by = 0;
            for (size_t p = start ? start : 1; p < end; p++) {
                size_t len;
                lm_decode(ctx.tok, 0, ctx.ids[(p - 1) % ctx.n_ids], &len);
                by += (double)len;
            }
            double x = nats[j * n_bins + b];
            job_cells(&t, &jobs[j], m.positions);
            table_uint(&t, start);
            table_uint(&t, end);
            table_uint(&t, count);
            table_uint(&t, (uint64_t)by);
            table_real(&t, x / (double)count, "%.4f");
            table_real(&t, x / log(2.0) / by, "%.4f");
            table_uint(&t, m.a.seed);
        }
    }
    if (m.a.format == FMT_TEXT)
        fprintf(out,
                "stream of %zu positions: BOS, then %s (%zu tokens) repeated end to end "
                "(%.2f times); bins of %zu positions; the full cache decodes %zu; positions "
                "%s\n\n",
                N, m.text, ctx.n_ids, (double)(N - 1) / (double)ctx.n_ids, W, M,
                positions_name(m.positions));
    table_print(&t, out, m.a.format);
    table_free(&t);
    out_close(out);
    free(nats);
    free_jobs(jobs, n_jobs);
    measure_free(&m);
    return 0;
}

/* ---- lm dump -------------------------------------------------------------------- */

static const char dump_usage[] =
    "usage: kvevict lm dump --model CKPT --text FILE --steps T -o attn.npy\n"
    "                       [--tokenizer TOK] [--query-heads | --qk] [--loop]\n"
    "\n"
    "The model's attention with the full cache over BOS and the first T-1 tokens\n"
    "of FILE, as an [L, H, T, T] float32 .npy file that `kvevict eval` reads: row t\n"
    "of head (l, h) holds the weights over keys 0..t (its own key included, zeros\n"
    "above the diagonal), summing to 1. By default H is the number of KV heads and\n"
    "each row is the mean over the KV head's query heads, exactly what the\n"
    "decoder's policies receive; --query-heads writes every query head instead.\n"
    "\n"
    "  --qk    write a query/key trace instead (docs/trace.md): the queries\n"
    "          [L, H, T, S] then the keys [L, G, T, S] as two float32 .npy arrays\n"
    "          in one file, after the rotary embedding; `--trace qk:FILE` reads it\n"
    "          and computes the attention rows (the KV-head group mean) on demand.\n"
    "          O(T S) bytes instead of O(T^2): long traces stay small\n"
    "  --loop  repeat the text's tokens after BOS as often as --steps needs\n"
    "          (positions past the model's context are decoded all the same)\n"
    "\n"
    "The file is written under a temporary name and renamed into place.\n";

static const opt_def dump_own[] = {{"model", 0, OPT_VALUE},
                                   {"text", 0, OPT_VALUE},
                                   {"steps", 0, OPT_VALUE},
                                   {"tokenizer", 0, OPT_VALUE},
                                   {"query-heads", 0, 0},
                                   {"qk", 0, 0},
                                   {"loop", 0, 0},
                                   {"threads", 0, OPT_VALUE}};
static const cli_spec dump_spec = LM_SPEC(dump_usage, SO_OUTPUT, dump_own, FMT_TEXT);

typedef struct dump_ctx {
    FILE *f;
    size_t heads, steps; /* per layer, T */
    size_t group;        /* query heads averaged per row (1 with --query-heads) */
    long header;         /* bytes before the data */
    float *row;          /* (T) */
    int failed;
    /* --qk: Q (L, H, T, S) at q_off, K (L, G, T, S) at k_off */
    size_t H, G, S;
    long q_off, k_off;
} dump_ctx;

/* A version 1.0 .npy header for float32 data of shape `shape` ("(2, 3)"),
 * padded so the data starts on a multiple of 64 bytes; returns its length. */
static long npy_header(FILE *f, const char *shape)
{
    char hdr[160];
    int len = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }",
                       shape);
    int total = 10 + len + 1, pad = (64 - total % 64) % 64;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    unsigned hl = (unsigned)(len + 1 + pad);
    fputc((int)(hl & 0xff), f);
    fputc((int)(hl >> 8), f);
    fwrite(hdr, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    return 10 + (long)hl;
}

/* --qk: the queries and keys of layer `layer` at position pos, each head's
 * vector at its place in Q and K. */
static void dump_qk(void *user, int32_t layer, int32_t pos, const float *q, const float *k)
{
    dump_ctx *d = user;
    size_t T = d->steps, S = d->S, l = (size_t)layer, t = (size_t)pos;
    for (size_t h = 0; h < d->H && !d->failed; h++) {
        long off = d->q_off + (long)((((l * d->H + h) * T + t) * S) * sizeof(float));
        if (fseek(d->f, off, SEEK_SET) != 0 || fwrite(q + h * S, sizeof(float), S, d->f) != S)
            d->failed = 1;
    }
    for (size_t g = 0; g < d->G && !d->failed; g++) {
        long off = d->k_off + (long)((((l * d->G + g) * T + t) * S) * sizeof(float));
        if (fseek(d->f, off, SEEK_SET) != 0 || fwrite(k + g * S, sizeof(float), S, d->f) != S)
            d->failed = 1;
    }
}

static void dump_attention(void *user, int32_t layer, int32_t pos, const float *att, size_t ld,
                           const size_t *n_keys)
{
    dump_ctx *d = user;
    size_t t = (size_t)pos, T = d->steps, n = n_keys[0];
    for (size_t h = 0; h < d->heads && !d->failed; h++) {
        memset(d->row, 0, T * sizeof *d->row);
        lm_group_mean(d->row, att + h * d->group * ld, ld, d->group, n);
        long off =
            d->header + (long)(((((size_t)layer * d->heads + h) * T + t) * T) * sizeof(float));
        if (fseek(d->f, off, SEEK_SET) != 0 || fwrite(d->row, sizeof(float), T, d->f) != T)
            d->failed = 1;
    }
}

/* Decodes toks[0 .. T) with the full cache, the hooks of `o` writing into
 * d (set up by the caller); 0, or -1 when a write failed. */
static int dump_run(dump_ctx *d, const lm_model *m, const int32_t *toks, size_t T, lm_options o)
{
    o.user = d;
    o.threads = ctx.threads;
    lm_state *s = NULL;
    kve_status st = lm_state_new(m, &o, &s);
    if (st != KVE_OK)
        die_lm(st, "decoder");
    progress pr;
    progress_begin(&pr, "step", T, 0, 1);
    for (size_t t = 0; t < T && !d->failed; t++) {
        st = lm_forward(s, toks[t]);
        if (st != KVE_OK)
            die_lm(st, "decode");
        progress_update(&pr, t + 1);
    }
    progress_end(&pr);
    lm_state_free(s);
    free(d->row);
    return d->failed || ferror(d->f) ? -1 : 0;
}

/* Writes the model's full-cache attention over toks[0 .. T) (BOS first) to
 * f as an [L, heads, T, T] float32 .npy file, each row the mean of `group`
 * query heads as the policies receive it (group 1: every query head).
 * Returns 0, or -1 when a write failed (errno says why). */
static int write_attention(FILE *f, const lm_model *m, const int32_t *toks, size_t T, size_t group)
{
    const lm_config *c = &m->config;
    dump_ctx d = {0};
    d.f = f;
    d.group = group;
    d.heads = (size_t)c->n_heads / group;
    d.steps = T;
    d.row = xmalloc(T * sizeof *d.row);
    char shape[128];
    snprintf(shape, sizeof shape, "(%d, %zu, %zu, %zu)", c->n_layers, d.heads, T, T);
    d.header = npy_header(f, shape);
    lm_options o = {.on_attention = dump_attention};
    return dump_run(&d, m, toks, T, o);
}

/* Writes the queries and keys of the full-cache decode of toks[0 .. T) to f
 * as a q/K trace: Q [L, H, T, S], then K [L, G, T, S], float32 .npy arrays
 * back to back. Returns 0, or -1 when a write failed (errno says why). */
static int write_qk(FILE *f, const lm_model *m, const int32_t *toks, size_t T)
{
    const lm_config *c = &m->config;
    dump_ctx d = {0};
    d.f = f;
    d.steps = T;
    d.H = (size_t)c->n_heads;
    d.G = (size_t)c->n_kv_heads;
    d.S = (size_t)c->head_size;
    char shape[128];
    snprintf(shape, sizeof shape, "(%d, %zu, %zu, %zu)", c->n_layers, d.H, T, d.S);
    d.q_off = npy_header(f, shape);
    long q_bytes = (long)((size_t)c->n_layers * d.H * T * d.S * sizeof(float));
    if (fseek(f, d.q_off + q_bytes, SEEK_SET) != 0)
        return -1;
    snprintf(shape, sizeof shape, "(%d, %zu, %zu, %zu)", c->n_layers, d.G, T, d.S);
    d.k_off = d.q_off + q_bytes + npy_header(f, shape);
    /* the file's last byte, so its size is right even before the last row */
    long k_bytes = (long)((size_t)c->n_layers * d.G * T * d.S * sizeof(float));
    if (fseek(f, d.k_off + k_bytes - 1, SEEK_SET) != 0 || fputc(0, f) == EOF)
        return -1;
    lm_options o = {.on_qk = dump_qk};
    return dump_run(&d, m, toks, T, o);
}

static int lm_dump(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &dump_spec, argc, argv);
    const char *model = need(&a, &dump_spec, "model");
    const char *text = need(&a, &dump_spec, "text");
    size_t T = (size_t)parse_u64("--steps", need(&a, &dump_spec, "steps"), 1, 1u << 20);
    if (!a.output)
        die_usage("missing required option '-o FILE' (see kvevict %s --help)", cli_cmd);
    if (strcmp(a.output, "-") == 0)
        die_usage("-o: a .npy file is written to a file, not standard output");
    int qk = cli_own(&a, &dump_spec, "qk")->count > 0;
    int loop = cli_own(&a, &dump_spec, "loop")->count > 0;
    if (qk && cli_own(&a, &dump_spec, "query-heads")->count)
        die_usage("--qk writes every query head already; --query-heads does not apply");
    parse_threads(&a, &dump_spec);
    load_model(model);
    load_tokenizer(own(&a, &dump_spec, "tokenizer"), model);
    load_text(text);
    encode_text(text);
    if (ctx.n_ids + 1 < T && !loop)
        die_usage("--steps %zu: the text gives BOS and %zu tokens (--loop repeats them)", T,
                  ctx.n_ids);
    const lm_config *c = &ctx.model->config;
    size_t group =
        cli_own(&a, &dump_spec, "query-heads")->count ? 1 : (size_t)(c->n_heads / c->n_kv_heads);
    int32_t *toks = xmalloc(T * sizeof *toks);
    for (size_t t = 0; t < T; t++) /* BOS, then the text (looped with --loop) */
        toks[t] = t ? ctx.ids[(t - 1) % ctx.n_ids] : LM_BOS;
    FILE *f = out_open(a.output);
    if ((qk ? write_qk(f, ctx.model, toks, T) : write_attention(f, ctx.model, toks, T, group)) != 0)
        die_input("%s: cannot write: %s", a.output, strerror(errno));
    out_close(f);
    free(toks);
    return 0;
}

/* ---- lm prefill --------------------------------------------------------------------
 *
 * A long prompt followed by generation: the prompt compressed to the budget
 * in one go when it has been read (kve_bank_prefill, or the policy's own
 * scores taken once), against per-step eviction while it is read. Two
 * measures, each read from steps taken after the compression:
 *   bits per byte: the eval windows ([BOS] + seq_len - 1 tokens of the text),
 *     the first P positions the prompt; scored, the tokens predicted by the
 *     steps at positions P .. end (the logits after the prompt's last token
 *     come from the uncompressed prefill under every method, so the token
 *     at P is not scored);
 *   pass key: the prompt of `lm passkey` without its last token is the
 *     prompt; the last token is then decoded, and its argmax must be the
 *     key. (With the whole prompt prefilled the answer would come from the
 *     uncompressed pass, under every method.)
 */

static const char prefill_usage[] =
    "usage: kvevict lm prefill --model CKPT --text FILE --policy SPEC[,SPEC...]\n"
    "                          [--budget B[,B...]] [--methods LIST] [--window W]\n"
    "                          [--kernel K] [--pool max|avg] [--prompt P] [--windows N]\n"
    "                          [--distances D,...] [--trials N] [--tokenizer TOK]\n"
    "                          [--positions P] [--seed N] [--format F] [-o FILE]\n"
    "                          [--docs FILE]\n"
    "\n"
    "A long prompt compressed to the budget at prefill, against per-step eviction\n"
    "while the prompt is read: bits per byte of the text that follows a prompt,\n"
    "and pass-key accuracy with the question at the prompt's end. Both are read\n"
    "from decode steps after the compression (docs/prefill.md).\n"
    "\n"
    "  --methods LIST  of: step (per-step eviction during the prompt), h2o (H2O's\n"
    "                  prompt scores: column sums of the prompt's attention),\n"
    "                  snapkv (the last W prompt queries, pooled), policy (the\n"
    "                  policy's own scores once: the prompt stepped without\n"
    "                  evicting, then one eviction). Default: step,h2o,snapkv for\n"
    "                  the policies scored from attention, step,policy for those\n"
    "                  that read keys, step for the others\n"
    "  --window W      SnapKV's observation window (default 32)\n"
    "  --kernel K      SnapKV's pooling kernel, odd (default 5)\n"
    "  --pool P        SnapKV's pooling: max (default) or avg\n"
    "  --prompt P      prompt positions of a bits-per-byte window (default half\n"
    "                  the context)\n"
    "  --windows N     bits-per-byte windows, the text's first N (default 16)\n"
    "  --distances L   pass-key distances (default 64, 128, ... and the top)\n"
    "  --trials N      pass-key prompts per distance (default 16)\n"
    "  --docs FILE     also rewrite the block between <!-- lm-prefill:begin -->\n"
    "                  and <!-- lm-prefill:end --> of FILE with the markdown table\n"
    "  other options as for `kvevict lm eval`.\n"
    "\n"
    "The first row is the full cache. JSON keys: policy, budget, positions,\n"
    "prefill, windows, tokens, bytes, bits_per_byte, delta_bits_per_byte,\n"
    "prompts, passkey_accuracy, passkey_accuracy_se, seed.\n";

static const opt_def prefill_own[] = {
    MEASURE_OPTS,           {"methods", 0, OPT_VALUE}, {"window", 0, OPT_VALUE},
    {"kernel", 0, OPT_VALUE}, {"pool", 0, OPT_VALUE},  {"prompt", 0, OPT_VALUE},
    {"windows", 0, OPT_VALUE}, {"distances", 0, OPT_VALUE}, {"trials", 0, OPT_VALUE},
    {"docs", 0, OPT_VALUE}};
static const cli_spec prefill_spec =
    LM_SPEC(prefill_usage, SO_SEED | SO_FORMAT | SO_OUTPUT, prefill_own, FMT_TEXT);

enum { PF_STEP, PF_H2O, PF_SNAPKV, PF_POLICY, PF_METHODS };
static const char *const pf_names[PF_METHODS] = {"step", "h2o", "snapkv", "policy"};

/* Decodes tokens[0 .. n) from a fresh cache: the first p as the prompt,
 * compressed by `method`, the rest one step at a time; per_pos[i] (i in
 * [p, n - 1)) gets the loss of tokens[i + 1]. Returns the argmax after the
 * last token. */
static int32_t run_with_prompt(lm_state *s, const int32_t *tokens, size_t n, size_t p, int method,
                               const kve_prefill_params *pp, double *per_pos, const char *what)
{
    kve_status st = lm_state_reset(s);
    int32_t V = ctx.model->config.vocab_size;
    size_t i = 0;
    if (st == KVE_OK && method != PF_STEP && s->bank) {
        st = lm_prefill(s, tokens, p, method == PF_POLICY ? NULL : pp);
        i = p;
    }
    for (; st == KVE_OK && i < n; i++) {
        st = lm_forward(s, tokens[i]);
        if (st == KVE_OK && per_pos && i >= p && i + 1 < n)
            per_pos[i] = lm_token_nats(s->logits, V, tokens[i + 1]);
    }
    if (st != KVE_OK)
        die_lm(st, what);
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++)
        if (s->logits[v] > s->logits[best])
            best = v;
    return best;
}

static int lm_prefill_cmd(int argc, char **argv)
{
    const cli_spec *sp = &prefill_spec;
    measure_args ma;
    measure_parse(&ma, sp, argc, argv);
    if (!ma.n_specs)
        die_usage("missing required option '--policy' (see kvevict lm prefill --help)");
    kve_prefill_params pp = kve_prefill_default_params(KVE_PREFILL_SNAPKV);
    const char *v;
    if ((v = own(&ma.a, sp, "window")))
        pp.window = (size_t)parse_u64("--window", v, 1, KVE_MAX_BUDGET);
    if ((v = own(&ma.a, sp, "kernel")))
        pp.kernel = (size_t)parse_u64("--kernel", v, 1, 999);
    if (pp.kernel % 2 == 0)
        die_usage("--kernel %zu: the pooling kernel must be odd", pp.kernel);
    if ((v = own(&ma.a, sp, "pool"))) {
        if (strcmp(v, "max") != 0 && strcmp(v, "avg") != 0)
            die_usage("--pool: '%s' is neither 'max' nor 'avg'", v);
        pp.pool = v[0] == 'm' ? KVE_POOL_MAX : KVE_POOL_AVG;
    }
    int want[PF_METHODS] = {0}, methods_given = 0;
    if ((v = own(&ma.a, sp, "methods"))) {
        size_t m;
        char **items = split_list("--methods", v, &m);
        for (size_t i = 0; i < m; i++) {
            int k = 0;
            while (k < PF_METHODS && strcmp(items[i], pf_names[k]) != 0)
                k++;
            if (k == PF_METHODS) {
                free_list(items, m);
                die_usage("--methods: '%s' is not step, h2o, snapkv or policy", v);
            }
            want[k] = 1;
        }
        free_list(items, m);
        methods_given = 1;
    }
    size_t n_windows = (v = own(&ma.a, sp, "windows")) ? (size_t)parse_u64("--windows", v, 1, 1u << 20)
                                                       : 16;
    size_t trials = (v = own(&ma.a, sp, "trials")) ? (size_t)parse_u64("--trials", v, 1, 1u << 20)
                                                   : 16;
    const char *prompt_opt = own(&ma.a, sp, "prompt");
    const char *docs = own(&ma.a, sp, "docs");
    measure_load(&ma, sp);
    const size_t L = (size_t)ctx.model->config.seq_len;
    size_t P = prompt_opt ? (size_t)parse_u64("--prompt", prompt_opt, 1, L > 2 ? L - 2 : 1) : L / 2;
    if (L < 4 || P + 2 > L)
        die_usage("--prompt %zu: a window of %zu positions holds no text after it", P, L);

    /* The (policy, budget, method) rows; row 0 the full cache. */
    size_t n_jobs;
    job *jobs = make_jobs(&ma, &n_jobs);
    typedef struct prow {
        size_t job;
        int method;
    } prow;
    prow *rows = xmalloc((1 + (n_jobs - 1) * PF_METHODS) * sizeof *rows);
    size_t n_rows = 0;
    rows[n_rows++] = (prow){0, PF_STEP};
    for (size_t j = 1; j < n_jobs; j++) {
        unsigned reads = kve_bank_reads(jobs[j].s->bank);
        for (int k = 0; k < PF_METHODS; k++) {
            int on = methods_given ? want[k]
                                   : k == PF_STEP || ((reads & KVE_READS_ATTN) &&
                                                      (k == PF_H2O || k == PF_SNAPKV)) ||
                                         ((reads & KVE_READS_KEYS) && k == PF_POLICY);
            if (!on)
                continue;
            if (k == PF_H2O || k == PF_SNAPKV) { /* refused combinations are usage errors */
                kve_prefill_params q = pp;
                q.method = k == PF_H2O ? KVE_PREFILL_H2O : KVE_PREFILL_SNAPKV;
                if (kve_bank_prefill(jobs[j].s->bank, 0, 0, &q, L, NULL, L, 1, KVE_REDUCE_MEAN,
                                     jobs[j].budget) != KVE_OK)
                    die_usage("--methods %s with %s: %s", pf_names[k], jobs[j].spec,
                              kve_last_error());
            }
            rows[n_rows++] = (prow){j, k};
        }
    }

    /* Pass-key prompts: those of lm passkey. */
    pk_template pk;
    pk_load(&pk);
    size_t na = pk.na, nb = pk.nb, nq = pk.nq;
    if (L < 2 + na + nb + nq || ctx.n_ids < L - 2 - na - nb - nq || ctx.n_ids < L - 1)
        die_input("--text %s: too short for this model's windows and prompts", ma.text);
    size_t nd;
    size_t *dist = distances(own(&ma.a, sp, "distances"), nb + nq, L - 2 - na, 0, &nd);
    size_t W = ctx.n_ids / (L - 1); /* whole windows only */
    if (n_windows > W)
        die_usage("--windows %zu: the text holds %zu whole windows", n_windows, W);

    FILE *out = out_open(ma.a.output);
    int32_t *w = xmalloc(L * sizeof *w);
    double *loss = xmalloc(L * sizeof *loss);
    double *nats = xcalloc(n_rows, sizeof *nats), *hits = xcalloc(n_rows, sizeof *hits);
    double bytes = 0;
    size_t tokens = 0;
    progress pr;
    progress_begin(&pr, "window", (uint64_t)(n_windows + nd * trials) * n_rows, 0, 1);
    uint64_t done = 0;
    for (size_t wi = 0; wi < n_windows; wi++) {
        w[0] = LM_BOS;
        memcpy(w + 1, ctx.ids + wi * (L - 1), (L - 1) * sizeof *w);
        for (size_t i = P + 1; i < L; i++) {
            size_t len;
            lm_decode(ctx.tok, w[i - 1], w[i], &len);
            bytes += (double)len;
            tokens++;
        }
        for (size_t r = 0; r < n_rows; r++) {
            const job *jb = &jobs[rows[r].job];
            kve_prefill_params q = pp;
            q.method = rows[r].method == PF_H2O ? KVE_PREFILL_H2O : KVE_PREFILL_SNAPKV;
            run_with_prompt(jb->s, w, L, P, rows[r].method, &q, loss,
                            jb->spec ? jb->spec : "full cache");
            for (size_t i = P; i + 1 < L; i++)
                nats[r] += loss[i];
            progress_update(&pr, ++done);
        }
    }
    for (size_t di = 0; di < nd; di++) {
        size_t d = dist[di];
        for (size_t j = 0; j < trials; j++) {
            int32_t key = pk_prompt(&pk, L, j, trials, d, w);
            for (size_t r = 0; r < n_rows; r++) {
                const job *jb = &jobs[rows[r].job];
                kve_prefill_params q = pp;
                q.method = rows[r].method == PF_H2O ? KVE_PREFILL_H2O : KVE_PREFILL_SNAPKV;
                hits[r] += run_with_prompt(jb->s, w, L, L - 1, rows[r].method, &q, NULL,
                                           jb->spec ? jb->spec : "full cache") == key;
                progress_update(&pr, ++done);
            }
        }
    }
    progress_end(&pr);

    static const col rest[] = {
        {"prefill", "prefill", COL_ALL},
        {"windows", "windows", COL_CSV | COL_JSON},
        {"tokens", "tokens", COL_CSV | COL_JSON},
        {"bytes", "bytes", COL_CSV | COL_JSON},
        {"bits/byte", "bits_per_byte", COL_ALL},
        {"delta", "delta_bits_per_byte", COL_ALL},
        {"prompts", "prompts", COL_CSV | COL_JSON},
        {"pass key", "passkey_accuracy", COL_ALL},
        {"se", "passkey_accuracy_se", COL_ALL},
        {"seed", KEY_SEED, COL_CSV | COL_JSON},
    };
    col cols[TABLE_MAXCOLS];
    table t;
    table_init(&t, cols, job_cols(cols, rest, sizeof rest / sizeof rest[0]));
    double prompts = (double)(nd * trials);
    for (size_t r = 0; r < n_rows; r++) {
        const job *jb = &jobs[rows[r].job];
        double bpb = nats[r] / log(2.0) / bytes, acc = hits[r] / prompts;
        job_cells(&t, jb, ma.positions);
        table_str(&t, rows[r].job ? pf_names[rows[r].method] : "-");
        table_uint(&t, n_windows);
        table_uint(&t, tokens);
        table_real(&t, bytes, "%.0f");
        table_real(&t, bpb, "%.4f");
        table_real(&t, bpb - nats[0] / log(2.0) / bytes, "%+.4f");
        table_uint(&t, (uint64_t)prompts);
        table_real(&t, acc, "%.3f");
        table_real(&t, sqrt(acc * (1 - acc) / prompts), "%.3f");
        table_uint(&t, ma.a.seed);
    }
    char dlist[256] = "";
    for (size_t di = 0, len = 0; di < nd && len < sizeof dlist; di++)
        len += (size_t)snprintf(dlist + len, sizeof dlist - len, "%s%zu", di ? ", " : "", dist[di]);
    char head[1024];
    snprintf(head, sizeof head,
             "%zu windows of %zu positions (the first %zu the prompt; %zu tokens, %.0f bytes "
             "scored after it); pass key at distances %s, %zu prompts each, the last token "
             "decoded after the prompt; positions %s; SnapKV window %zu, kernel %zu, %s "
             "pooling\n\n",
             n_windows, L, P, tokens, bytes, dlist, trials, positions_name(ma.positions),
             pp.window, pp.kernel, pp.pool == KVE_POOL_MAX ? "max" : "average");
    if (ma.a.format == FMT_TEXT)
        fputs(head, out);
    table_print(&t, out, ma.a.format);
    if (docs) {
        char *block = NULL;
        size_t blen = 0;
        FILE *mem = open_memstream(&block, &blen);
        if (!mem)
            die_input("out of memory");
        fprintf(mem, "\n%s", head);
        table_print(&t, mem, FMT_MD);
        fputc('\n', mem);
        fclose(mem);
        rewrite_block(docs, "lm-prefill", block);
        free(block);
    }
    table_free(&t);
    out_close(out);
    free(w), free(loss), free(nats), free(hits), free(dist), free(rows);
    pk_free(&pk);
    free_jobs(jobs, n_jobs);
    measure_free(&ma);
    return 0;
}

/* ---- the model's attention as a trace source -----------------------------------
 *
 * --trace lm:model=CKPT,text=FILE[,tokenizer=TOK][,steps=T][,window=W][,heads=kv|query]
 * in every command that reads a trace: what `lm dump` writes for evaluation
 * window W of the text (BOS, then the encoded text from token W * (seq_len - 1)
 * on: the windows of `lm eval`), T steps (default: the model's context; at
 * most 8192, as L * H * T^2 * 4 bytes go to the temporary file),
 * spooled to a temporary .npy file that is removed as soon as it is open.
 * Everything loaded is freed before returning.
 */

static const char lm_trace_keys[] = "model, text, tokenizer, steps, window, heads";

kve_trace *lm_trace_open(const char *src, unsigned flags)
{
    const char *model = NULL, *text = NULL, *tokenizer = NULL, *steps = NULL, *window = NULL,
               *heads = NULL;
    size_t n_items;
    char **items = split_list("--trace", src + 3, &n_items);
    for (size_t i = 0; i < n_items; i++) {
        char *eq = strchr(items[i], '=');
        if (!eq || eq == items[i] || !eq[1])
            die_usage("--trace %s: '%s' is not key=value (keys: %s)", src, items[i],
                      lm_trace_keys);
        *eq = '\0';
        const char *k = items[i], *v = eq + 1;
        const char **slot = strcmp(k, "model") == 0       ? &model
                            : strcmp(k, "text") == 0      ? &text
                            : strcmp(k, "tokenizer") == 0 ? &tokenizer
                            : strcmp(k, "steps") == 0     ? &steps
                            : strcmp(k, "window") == 0    ? &window
                            : strcmp(k, "heads") == 0     ? &heads
                                                          : NULL;
        if (!slot)
            die_usage("--trace %s: unknown key '%s' (keys: %s)", src, k, lm_trace_keys);
        if (*slot)
            die_usage("--trace %s: %s is given twice", src, k);
        *slot = v;
    }
    if (!model || !text)
        die_usage("--trace %s: model= and text= are required", src);
    if (heads && strcmp(heads, "query") != 0 && strcmp(heads, "kv") != 0)
        die_usage("--trace %s: heads=%s is neither kv nor query", src, heads);
    /* L * H * T^2 * 4 bytes go to TMPDIR: 2 GiB for 32 heads at the cap */
    size_t T = steps ? (size_t)parse_u64("--trace lm: steps", steps, 1, 1u << 13) : 0;
    size_t w = window ? (size_t)parse_u64("--trace lm: window", window, 0, SIZE_MAX / 2) : 0;

    lm_model *m = NULL;
    if (lm_model_open(model, &m) != KVE_OK)
        die_input("--trace lm: model %s: %s", model, lm_last_error());
    lm_tokenizer *tok = open_tokenizer(tokenizer, model, m, "--trace lm: tokenizer");
    char *txt = NULL;
    size_t txt_len = 0;
    if (lm_read_file(text, &txt, &txt_len) != KVE_OK)
        die_input("--trace lm: text: %s", lm_last_error());
    if (memchr(txt, 0, txt_len))
        die_input("--trace lm: text %s: holds a NUL byte", text);
    int32_t *ids = xmalloc((txt_len + 2) * sizeof *ids);
    size_t n_ids;
    kve_status st = lm_encode(tok, txt, txt_len, ids + 1, txt_len + 1, &n_ids);
    if (st != KVE_OK)
        die_lm(st, "--trace lm: text");
    const lm_config *c = &m->config;
    if (!T)
        T = (size_t)c->seq_len < (1u << 13) ? (size_t)c->seq_len : 1u << 13;
    size_t chunk = c->seq_len > 1 ? (size_t)c->seq_len - 1 : 1, start = w * chunk;
    if (start > n_ids || n_ids - start < T - 1)
        die_usage("--trace %s: the text has %zu tokens; window %zu of %zu steps needs %zu", src,
                  n_ids, w, T, start + T - 1);
    /* BOS just before the window's first token. */
    int32_t *toks = ids + start;
    toks[0] = LM_BOS;
    size_t group = heads && strcmp(heads, "query") == 0 ? 1 : (size_t)(c->n_heads / c->n_kv_heads);

    const char *dir = getenv("TMPDIR");
    static unsigned serial; /* names never repeat within a run (trace_name's aliases) */
    char path[4096];
    snprintf(path, sizeof path, "%s/kvevict-lm-%ld-%u-XXXXXX", dir && *dir ? dir : "/tmp",
             (long)getpid(), serial++);
    int fd = temp_create(path);
    if (fd < 0)
        die_input("--trace lm: cannot create a temporary file: %s", strerror(errno));
    FILE *f = fdopen(fd, "wb");
    if (!f)
        die_input("--trace lm: %s: %s", path, strerror(errno));
    if (write_attention(f, m, toks, T, group) != 0 || fclose(f) != 0)
        die_input("--trace lm: cannot write %s: %s", path, strerror(errno));
    free(ids);
    free(txt);
    lm_tokenizer_free(tok);
    lm_model_free(m);
    free_list(items, n_items);
    kve_trace *tr = NULL;
    progress pr;
    progress_begin(&pr, "validating row", 0, 0, 1);
    st = kve_trace_open_ex(path, flags, progress_callback, &pr, &tr);
    progress_end(&pr);
    unlink(path);
    temp_forget(path);
    if (st != KVE_OK)
        die_status(st, "--trace");
    trace_alias(path, src);
    return tr;
}

/* ---- lm: the dispatcher ------------------------------------------------------- */

static const char lm_usage[] =
    "usage: kvevict lm COMMAND [OPTIONS]\n"
    "\n"
    "A llama2.c or GGUF model decoded with a KV cache that kvevict's policies\n"
    "manage, one policy per (layer, KV head) (docs/decoder.md). Checkpoints:\n"
    "llama2.c legacy, version 1 (float32) and version 2 (int8), and GGUF\n"
    "(architecture llama; F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K), told from the\n"
    "file; a GGUF carries its tokenizer.\n"
    "\n"
    "Commands:\n"
    "  logits   the logits at every position of a token sequence (JSON Lines)\n"
    "  eval     bits per byte of a text, full cache beside every policy and budget\n"
    "  passkey  long-range recall of a single-token pass key by distance\n"
    "  repeat   loss on a repeated passage against the distance to its first copy\n"
    "  stream   loss against position over one long decode with a bounded cache\n"
    "  dump     the model's attention as an [L,H,T,T] .npy trace (or a q/K trace)\n"
    "  prefill  a long prompt compressed at prefill against per-step eviction\n"
    "\n"
    "Run `kvevict lm COMMAND --help` for its options. See also `kvevict generate`.\n";

static int lm_passkey(int argc, char **argv)
{
    return lm_recall(argc, argv, 0);
}

static int lm_repeat(int argc, char **argv)
{
    return lm_recall(argc, argv, 1);
}

int cmd_lm(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } subs[] = {{"logits", lm_logits},
                {"eval", lm_eval},
                {"passkey", lm_passkey},
                {"repeat", lm_repeat},
                {"stream", lm_stream},
                {"dump", lm_dump},
                {"prefill", lm_prefill_cmd}};
    if (argc < 1)
        die_usage("missing command (see kvevict lm --help)");
    if (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
        fputs(lm_usage, stdout);
        finish_stdout();
        return 0;
    }
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        if (strcmp(argv[0], subs[i].name) == 0) {
            static char name[32];
            snprintf(name, sizeof name, "lm %s", subs[i].name);
            cli_cmd = name;
            return subs[i].run(argc - 1, argv + 1);
        }
    }
    die_usage("unknown command '%s' (see kvevict lm --help)", argv[0]);
}

/* ---- generate --------------------------------------------------------------------- */

static const char generate_usage[] =
    "usage: kvevict generate --model CKPT [--prompt TEXT] [--steps N] [--tokenizer TOK]\n"
    "                        [--policy SPEC] [--budget B] [--positions original|cache]\n"
    "                        [--temperature T] [--seed N]\n"
    "\n"
    "Streams text from the model with a bounded cache: BOS, the prompt, then N\n"
    "generated tokens (default 256; generation stops early at BOS). Greedy\n"
    "(argmax) by default; --temperature T > 0 samples from softmax(logits / T)\n"
    "with kvevict's generator seeded by --seed, so a seed repeats its text. The\n"
    "text goes to standard output as it is made; tokens per second and the\n"
    "cache's occupancy go to standard error at the end.\n"
    "\n"
    "  --policy SPEC   the policy of every (layer, KV head) (default: none, the\n"
    "                  cache grows without bound)\n"
    "  other options as for `kvevict lm logits`.\n";

static const opt_def generate_own[] = {{"model", 0, OPT_VALUE},     {"prompt", 0, OPT_VALUE},
                                       {"steps", 0, OPT_VALUE},     {"tokenizer", 0, OPT_VALUE},
                                       {"positions", 0, OPT_VALUE}, {"temperature", 0, OPT_VALUE},
                                       {"threads", 0, OPT_VALUE}};
static const cli_spec generate_spec =
    LM_SPEC(generate_usage, SO_POLICY | SO_BUDGET | SO_SEED, generate_own, FMT_TEXT);

/* The next token: the first argmax, or a draw from softmax(logits / temp). */
static int32_t sample(const float *logits, int32_t V, double temp, kve_rng *rng)
{
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (temp <= 0)
        return best;
    double sum = 0;
    for (int32_t i = 0; i < V; i++)
        sum += exp(((double)logits[i] - logits[best]) / temp);
    double r = kve_rng_uniform(rng) * sum, cdf = 0;
    for (int32_t i = 0; i < V; i++) {
        cdf += exp(((double)logits[i] - logits[best]) / temp);
        if (r < cdf)
            return i;
    }
    return best;
}

/* Writes a decoded piece; a lone raw byte that is a control character other
 * than white space is skipped, as run.c's safe_printf does. */
static void put_piece(const char *p, size_t n)
{
    if (n == 1) {
        unsigned char b = (unsigned char)p[0];
        if (b < 0x20 && b != '\n' && b != '\t' && b != '\r')
            return;
    }
    fwrite(p, 1, n, stdout);
}

int cmd_generate(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &generate_spec, argc, argv);
    const cli_spec *sp = &generate_spec;
    const char *model = need(&a, sp, "model");
    const char *prompt = own(&a, sp, "prompt");
    if (!prompt)
        prompt = "";
    const char *st_s = own(&a, sp, "steps");
    size_t steps = st_s ? (size_t)parse_u64("--steps", st_s, 0, INT32_MAX / 2) : 256;
    lm_positions positions = opt_positions(own(&a, sp, "positions"));
    parse_threads(&a, sp);
    uint64_t seed = a.seed;
    size_t budget = a.budget;
    const char *spec = a.policy;
    if (budget && !spec)
        die_usage("--budget needs --policy");
    if (spec)
        free(canon_spec("--policy", spec, budget));
    double temp = 0;
    const char *ts = own(&a, sp, "temperature");
    if (ts) {
        char *end;
        errno = 0;
        temp = strtod(ts, &end);
        if (*end || errno || !(temp >= 0) || temp > 1e6 || ts[0] == '-')
            die_usage("--temperature: '%s' is not a number in [0, 1e6]", ts);
    }
    load_model(model);
    load_tokenizer(own(&a, sp, "tokenizer"), model);
    size_t n_prompt;
    int32_t *ids = encode(prompt, strlen(prompt), &n_prompt);
    lm_state *s = new_state(spec, budget, positions, seed);
    kve_rng rng;
    kve_rng_seed(&rng, seed);
    int32_t V = ctx.model->config.vocab_size, token = LM_BOS;
    size_t made = 0;
    double start = now_s();
    for (size_t i = 0; made < steps || i < n_prompt; i++) {
        kve_status st = lm_forward(s, token);
        if (st != KVE_OK)
            die_lm(st, "decode");
        int32_t next = i < n_prompt ? ids[i] : sample(s->logits, V, temp, &rng);
        if (i >= n_prompt)
            made++;
        if (next == LM_BOS)
            break;
        size_t len;
        const char *p = lm_decode(ctx.tok, token, next, &len);
        put_piece(p, len);
        fflush(stdout);
        token = next;
    }
    fputc('\n', stdout);
    finish_stdout();
    double secs = now_s() - start;
    const lm_config *c = &ctx.model->config;
    size_t kept_min = SIZE_MAX, kept_max = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int32_t g = 0; g < c->n_kv_heads; g++) {
            size_t k = lm_state_kept(s, l, g);
            kept_min = k < kept_min ? k : kept_min;
            kept_max = k > kept_max ? k : kept_max;
        }
    fprintf(stderr,
            "kvevict generate: %d positions (BOS, %zu prompt tokens, %zu generated) in %.3f s: "
            "%.1f tokens/s; cache: %zu..%zu of %d positions kept per (layer, KV head); "
            "policy %s\n",
            s->pos, n_prompt, made, secs, secs > 0 ? s->pos / secs : 0.0, kept_min, kept_max,
            s->pos, s->spec ? s->spec : "none (every key kept)");
    lm_state_free(s);
    free(ids);
    return 0;
}
