/* SPDX-License-Identifier: MIT */
/*
 * lm_cli.h - what the decoder's commands (tools/lm/: `kvevict lm ...` and
 * `kvevict generate`) share: the loaded model, tokenizer and text, the
 * options of the measuring commands, their (policy, budget) jobs, the
 * pass-key prompts, and one entry point per command for cmd_lm.c's table.
 *
 * measure.c defines it all. What a command loads stays reachable from
 * lm_ctx until exit, so an early exit (die_*) leaks nothing that a leak
 * checker could call lost. Arguments are checked before any file is read,
 * so usage errors (exit 2) come before input errors (exit 1).
 */
#ifndef KVE_LM_CLI_H
#define KVE_LM_CLI_H

#include "cli.h"
#include "lm.h"

#include <string.h>

/* What the running command loaded (measure.c). */
typedef struct lm_loaded {
    lm_model *model;
    lm_tokenizer *tok;
    char *text;
    size_t text_len;
    int32_t *ids; /* the text, encoded */
    size_t n_ids;
    budget_args budgets; /* --share-heads, --schedule, ... (budgets.c) */
    double *layer_weights; /* (L) --schedule attention: measured on --calibration */
    size_t threads;        /* --threads: the decoder's matrix threads */
    lm_heads *heads;        /* --heads FILE: a DuoAttention schedule; NULL: none */
    size_t streaming_budget; /* --streaming-budget (16) */
    int timing; /* 1: new_state's decoders time their policies (lm_options.timing) */
    int same_positions; /* --same-positions: every (layer, KV head) keeps the same positions */
    lm_products products; /* --products: exact (the default) or llama (lm_options.products) */
    lm_llama_cpu llama_cpu; /* --products llama:VARIANT (lm_options.llama_cpu); AUTO */
    size_t batch;         /* --batch: tokens a prompt block holds (lm_options.batch; 0: LM_BATCH) */
} lm_loaded;
extern lm_loaded lm_ctx;

/* Exit for a failed lm call: KVE_EINVAL is usage, the rest bad input. */
#if defined(__GNUC__)
#define LM_NORETURN __attribute__((noreturn))
#else
#define LM_NORETURN
#endif
LM_NORETURN void die_lm(kve_status s, const char *what);

/* The value of own option `name`, NULL when absent. */
static inline const char *own(const cli_args *a, const cli_spec *spec, const char *name)
{
    const opt_val *v = cli_own(a, spec, name);
    return v->count ? v->v[0] : NULL;
}

static inline const char *need(const cli_args *a, const cli_spec *spec, const char *name)
{
    const char *v = own(a, spec, name);
    if (!v)
        die_usage("missing required option '--%s' (see %s %s --help)", name, cli_program,
                  cli_cmd);
    return v;
}

static inline lm_positions opt_positions(const char *s)
{
    if (!s || strcmp(s, "original") == 0)
        return LM_POS_ORIGINAL;
    if (strcmp(s, "cache") == 0)
        return LM_POS_CACHE;
    die_usage("--positions: '%s' is neither 'original' nor 'cache'", s);
}

/* --threads N (default: the cores available) into lm_ctx.threads, and
 * --products exact|llama[:VARIANT] (default exact) into lm_ctx.products
 * and lm_ctx.llama_cpu: the two options of the decoder's arithmetic, in
 * every table that has one. */
static inline void parse_threads(const cli_args *a, const cli_spec *spec)
{
    const char *v = own(a, spec, "threads");
    lm_ctx.threads = v ? (size_t)parse_u64("--threads", v, 1, LM_MAX_THREADS) : lm_cores();
    v = own(a, spec, "products");
    lm_ctx.products = LM_PRODUCTS_EXACT;
    lm_ctx.llama_cpu = LM_LLAMA_CPU_AUTO;
    if (!v || strcmp(v, "exact") == 0)
        return;
    if (strncmp(v, "llama", 5) != 0 || (v[5] != '\0' && v[5] != ':'))
        die_usage("--products: '%s' is neither 'llama' nor 'exact'", v);
    lm_ctx.products = LM_PRODUCTS_LLAMA;
    if (v[5] == '\0')
        return;
    for (int c = LM_LLAMA_CPU_AVX2; c < LM_LLAMA_CPU_COUNT; c++)
        if (strcmp(v + 6, lm_llama_cpu_name((lm_llama_cpu)c)) == 0) {
            lm_ctx.llama_cpu = (lm_llama_cpu)c;
            return;
        }
    die_usage("--products: '%s': the variant is none of avx2, avx512, avx512-bf16", v);
}

/* The usage lines of --products. */
#define PRODUCTS_USAGE                                                                             \
    "  --products P        exact (default), llama or llama:VARIANT (docs/cli.md)\n"

/* --batch N (lm_options.batch) into lm_ctx.batch, for the commands that
 * declare it; its usage lines. */
static inline void parse_batch(const cli_args *a, const cli_spec *spec)
{
    const char *v = own(a, spec, "batch");
    lm_ctx.batch = v ? (size_t)parse_u64("--batch", v, 1, 1u << 16) : 0;
}
#define BATCH_USAGE                                                                                \
    "  --batch N           tokens read at once (64)\n"

static inline const char *positions_name(lm_positions p)
{
    return p == LM_POS_CACHE ? "cache" : "original";
}

void load_model(const char *path);
/* The tokenizer at `path`, else a GGUF's own vocabulary, else tokenizer.bin
 * in the checkpoint's directory; its pieces must be the model's vocabulary.
 * Messages begin with `what`. */
lm_tokenizer *open_tokenizer(const char *path, const char *model_path, const lm_model *m,
                             const char *what);
void load_tokenizer(const char *path, const char *model_path);
/* Reads --text ("-": standard input) whole; NUL bytes are refused. */
void load_text(const char *path);
/* s[0 .. len) encoded with lm_ctx.tok, in fresh memory; *n tokens. */
int32_t *encode(const char *s, size_t len, size_t *n);
void encode_text(const char *path);
/* What position 0 of a window holds before the text's token `start`: the
 * model's BOS, or for a model without one (config.bos -1) the text token
 * before `start` (the text's last for start 0): context, never scored. */
int32_t first_token(size_t start);
/* first_token(start) and the text's L - 1 tokens from its token `start`
 * into w[0 .. L) (a window of `lm eval`, or the ground a prompt is built
 * on). */
void text_window(int32_t *w, size_t start, size_t L);
/* The bytes the tokens w[from .. L) decode to, each after the one before
 * it; *tokens counts them. */
double window_bytes(const int32_t *w, size_t from, size_t L, size_t *tokens);
/* Splits --policy SPEC[,SPEC...]: an item holding '=' but no ':' is a
 * parameter of the spec before it ("h2o:budget=64,recent_window=8,window"
 * is two specs). Repeated --policy options add to the list. */
char **split_specs(const opt_val *v, size_t *n);
/* A budget: B (a count) or P% of the context, floor(P * seq_len / 100). */
size_t budget_of(const char *s, int32_t seq_len);
/* A decoder; dies (usage) on a bad spec. The budgets options apply. */
lm_state *new_state(const char *spec, size_t budget, lm_positions pos, uint64_t seed);
/* A usage error naming --budget (as written: `text`) when `spec` cannot take
 * `budget` positions. */
void check_budget(const char *spec, size_t budget, const char *text);
/* The one --budget of lm logits and generate once the model is loaded: P%
 * resolved (of the context), then checked against --policy. */
void resolve_budget(cli_args *a);

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
        {"positions", 0, OPT_VALUE}, {"threads", 0, OPT_VALUE}, {"products", 0, OPT_VALUE},       \
        {"batch", 0, OPT_VALUE}, {"heads", 0, OPT_VALUE},                                          \
        {"streaming-budget", 0, OPT_VALUE}, {"same-positions", 0, 0}, BUDGET_OPTS

/* The usage lines of --same-positions (lm_options.same_positions). */
#define SAME_POSITIONS_USAGE                                                                       \
    "  --same-positions    one decision for every (layer, KV head): they keep the same\n"        \
    "                      positions, evicted once a step after the last layer by\n"            \
    "                      their scores added together, as an engine whose cache\n"             \
    "                      drops a position from every head at once (llama.cpp's;\n"           \
    "                      kvevict-llama). Not with --share-heads, --schedule or --heads\n"

/* --same-positions into lm_ctx.same_positions; usage errors for what it
 * cannot go with (the options of a command that takes them). */
static inline void parse_same_positions(const cli_args *a, const cli_spec *spec)
{
    lm_ctx.same_positions = cli_own(a, spec, "same-positions")->count > 0;
}

/* The usage lines of --heads and --streaming-budget (docs/duo.md). */
#define HEADS_USAGE                                                                                \
    "  --heads FILE        a DuoAttention schedule (kvevict lm duo-calibrate): its\n"            \
    "                      retrieval heads get the full cache or the largest budget\n"          \
    "                      the memory of every head at --budget allows, the\n"                  \
    "                      streaming heads the rest (docs/duo.md)\n"                            \
    "  --streaming-budget N  with --heads: the least a streaming head keeps (16)\n"

typedef struct measure_args {
    cli_args a;
    const char *model, *text;
    char **specs, **budgets;
    size_t n_specs, n_budgets;
    lm_positions positions;
    size_t span; /* positions the longest decode attends at most; 0: the context */
    const char *span_name; /* what decodes them ("the stream"); NULL: a window */
    const char *heads;     /* --heads FILE */
} measure_args;

/* Parses the options and loads model, tokenizer and text. Every argument is
 * checked before a file is read. */
void measure_parse(measure_args *m, const cli_spec *spec, int argc, char **argv);
/* Loads model, tokenizer, text, (--schedule attention) the calibration and
 * (--heads) the schedule, checked against the model. */
void measure_load(const measure_args *m, const cli_spec *spec);
void measure_free(measure_args *m);

/* The (policy, budget) jobs: job 0 is the full cache (no policy), then every
 * spec at every budget, budgets outermost. */
typedef struct job {
    char *spec;    /* canonical, budget applied; NULL for the full cache */
    size_t budget; /* 0 for the full cache */
    lm_state *s;
} job;

job *jobs_new(const measure_args *m, size_t *n_jobs);
void jobs_free(job *jobs, size_t n);
/* The first cells of a row: policy ("full" for the full cache), budget
 * (null for the full cache), positions; then, with budgets options, the
 * schedule, the sharing and the layer budgets. */
void job_cells(table *t, const job *jb, lm_positions positions);
/* Reads and parses a schedule file (lm_heads_parse) and checks it against
 * the loaded model; errors exit naming `what`. */
lm_heads *load_heads(const char *path, const char *what);
/* The columns of job_cells, then `rest`; returns the count. */
size_t job_cols(col *cols, const col *rest, size_t n_rest);

/* Standard error of the ratio sum(x) / den over samples x_i weighted by
 * b_i (delta method): sqrt(W / (W - 1) * sum (x_i - r b_i)^2) / den, with
 * r = sum(x) / sum(b). NAN with fewer than two samples. (loss.c; windows
 * are the samples of lm eval and lm leaderboard) */
double ratio_se(const double *x, const double *b, size_t w, double den);

/* Distances from --distances (a list, repeatable: split_lists), or, when it
 * is absent, 64-steps within [lo, hi] plus hi (and lo first when
 * `with_lo`); each must lie in [lo, hi]. */
size_t *distances(const opt_val *list, size_t lo, size_t hi, int with_lo, size_t *n);

/* The pass-key prompts of models/README.md (measure.c says how they are
 * built), shared by `lm passkey` and `lm prefill`. */
enum { PK_KEYS = 64 };

/* The pass-key template: its three segments encoded, the 64 keys found. */
typedef struct pk_template {
    int32_t *intro, *after, *question;
    size_t na, nb, nq;
    int32_t keys[PK_KEYS];
} pk_template;

void pk_load(pk_template *p);
void pk_free(pk_template *p);
/* Writes trial j of N at distance d (L tokens) to w; returns its key. */
int32_t pk_prompt(const pk_template *p, size_t L, size_t j, size_t N, size_t d, int32_t *w);

/* Writes the model's full-cache attention over toks[0 .. T) (BOS first) to
 * f as an [L, heads, T, T] float32 .npy file, each row the mean of `group`
 * query heads as the policies receive it (group 1: every query head).
 * Returns 0, or -1 when a write failed (errno says why). (dump.c) */
int write_attention(FILE *f, const lm_model *m, const int32_t *toks, size_t T, size_t group);

/* The commands, for cmd_lm.c's table (cmd_generate is in cli.h). */
int lm_logits(int argc, char **argv);      /* generate.c */
int lm_eval(int argc, char **argv);        /* loss.c */
int lm_stream(int argc, char **argv);      /* loss.c */
int lm_passkey(int argc, char **argv);     /* recall.c */
int lm_repeat(int argc, char **argv);      /* recall.c */
int lm_dump(int argc, char **argv);        /* dump.c */
int lm_prefill_cmd(int argc, char **argv); /* prefill.c */
int lm_duo_calibrate(int argc, char **argv); /* duo.c */
int lm_leaderboard(int argc, char **argv);  /* leaderboard.c */

/* lm_forward_batch's callback for the loss of each next token of a
 * sequence: per_pos[j] = -log p(tokens[j + 1]) after token j, for from <= j
 * < n - 1 (j = at + the index in the call). */
typedef struct next_loss {
    const int32_t *tokens; /* (n) the whole sequence */
    double *per_pos;       /* (n) or NULL: nothing recorded */
    size_t at, from, n;
    int32_t V;
} next_loss;

static inline void next_loss_add(void *user, size_t i, const float *logits)
{
    const next_loss *x = user;
    const size_t j = x->at + i;
    if (x->per_pos && j >= x->from && j + 1 < x->n)
        x->per_pos[j] = lm_token_nats(logits, x->V, x->tokens[j + 1]);
}

/* The tokens decoded so far, BOS first (the repetition penalty's window and
 * a session's record): generate's, and kvevict-llama generate's. */
typedef struct history {
    int32_t *t;
    size_t n, cap;
} history;

static inline void push(history *h, int32_t t)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 256;
        h->t = xrealloc(h->t, h->cap * sizeof *h->t);
    }
    h->t[h->n++] = t;
}

#endif /* KVE_LM_CLI_H */
