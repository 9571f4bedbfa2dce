/* SPDX-License-Identifier: MIT */
/*
 * kvevict_llama.c - kvevict-llama: llama.cpp's KV cache managed by kvevict
 * (engine.c), on the command line: `logits`, `eval` and `generate`, whose
 * outputs are those of `kvevict lm logits`, `kvevict lm eval
 * --same-positions` and `kvevict generate` (docs/llama.cpp.md).
 *
 * Exits: 0 success; 1 bad input: a model llama.cpp cannot load, a spec or
 * budget the engine cannot run, a missing llama.cpp, a session that is
 * corrupted or another run's (left as it was), a failed decode; 2 a
 * malformed command line. One line on stderr says which.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine.h"
#include "lm_cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static kvl_api api;
static kvl_model model;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The options every command takes. */
#define COMMON_OPTS                                                                                \
    {"model", 0, OPT_VALUE}, {"threads", 0, OPT_VALUE}, {"batch", 0, OPT_VALUE},                  \
        {"llama-lib", 0, OPT_VALUE}, {"policy", 0, OPT_VALUE | OPT_REPEAT},                       \
    {                                                                                              \
        "budget", 0, OPT_VALUE | OPT_REPEAT                                                        \
    }
#define COMMON_USAGE                                                                               \
    "  --model GGUF        a model llama.cpp loads (any type it reads)\n"                            \
    "  --threads N         llama.cpp's threads (default 1: ggml's threads spin at every\n"   \
    "                      barrier, which costs a small model more than it gains;\n"        \
    "                      give a large one the cores)\n"                     \
    "  --llama-lib DIR     the folder of libllama.v0.4.0.so (default: $KVEVICT_LLAMA_LIB,\n"         \
    "                      else the node-llama-cpp 3.21.1 the build fetched)\n"
/* The option of the commands that run policies (all but quantize). */
#define KV_THREADS_OPT {"kv-threads", 0, OPT_VALUE}
#define KV_THREADS_USAGE                                                                           \
    "  --kv-threads N      kvevict's threads for the attention rows, after each decode\n"        \
    "                      (default: --threads; the same bits with any number)\n"

/* What a command shares once parsed. */
typedef struct common {
    const char *model;
    size_t threads, kv_threads, batch;
    int batch_given;
} common;

static void common_parse(common *c, const cli_args *a, const cli_spec *sp)
{
    c->model = need(a, sp, "model");
    const char *v = own(a, sp, "threads");
    c->threads = v ? (size_t)parse_u64("--threads", v, 1, 256) : 1;
    v = NULL; /* --kv-threads: declared by the commands that run policies */
    for (size_t i = 0; i < sp->n_own; i++)
        if (strcmp(sp->own[i].name, "kv-threads") == 0)
            v = own(a, sp, "kv-threads");
    c->kv_threads = v ? (size_t)parse_u64("--kv-threads", v, 1, 256) : c->threads;
    v = own(a, sp, "batch");
    c->batch_given = v != NULL;
    c->batch = v ? (size_t)parse_u64("--batch", v, 1, 4096) : 1;
}

/* Loads llama.cpp and the model; failures are bad input (exit 1). */
static void open_model(const cli_args *a, const cli_spec *sp, const common *c)
{
    char msg[4600];
    if (kvl_api_open(&api, own(a, sp, "llama-lib"), msg, sizeof msg) != 0)
        die_input("%s", msg);
    kve_status st = kvl_model_open(&api, c->model, &model);
    if (st != KVE_OK)
        die_input("--model %s", kve_last_error());
}

static void close_model(void)
{
    kvl_model_close(&model);
    api.llama_backend_free();
    kvl_api_close(&api);
}

/* A budget written B or P% (of the model's context), at most the context. */
static size_t budget_value(const char *text)
{
    double pct;
    size_t b = parse_budget("--budget", text, &pct);
    if (!b)
        b = budget_of_whole("--budget", text, pct, model.n_ctx_train, "the context");
    if (b > model.n_ctx_train)
        die_input("--budget %s is above the model's context of %zu positions", text,
                  model.n_ctx_train);
    return b;
}

/* The spec the engine runs for `spec` at `budget` (0: the spec's); a spec
 * it cannot run is bad input. */
static char *runnable(const char *spec, size_t budget)
{
    char out[KVE_SPEC_MAX];
    int raised = 0;
    kve_status st = kvl_runnable_spec(spec, budget, out, &raised);
    if (st != KVE_OK)
        die_input("--policy %s: %s", spec, kve_last_error());
    if (raised)
        warn("%s: recent_window 0 raised to 1: llama.cpp cannot remove a sequence's newest "
             "position while it goes on (docs/llama.cpp.md)", out);
    if (kve_spec_min_budget(out, &(size_t){0}) != KVE_OK)
        die_input("--policy %s: %s", out, kve_last_error());
    return xstrdup(out);
}

static kvl_engine *new_engine(const char *spec, const common *c, size_t sequences, size_t cells,
                              uint64_t seed)
{
    kvl_options o = {.spec = spec, .batch = c->batch, .sequences = sequences, .cells = cells,
                     .threads = c->threads, .kv_threads = c->kv_threads, .seed = seed,
                     .capture = 1};
    kvl_engine *e = NULL;
    kve_status st = kvl_engine_new(&model, &o, &e);
    if (st != KVE_OK)
        die_input("%s", kve_last_error());
    return e;
}

static kvl_seq *new_seq(kvl_engine *e, int32_t id)
{
    kvl_seq *s = NULL;
    if (kvl_seq_new(e, id, &s) != KVE_OK)
        die_input("%s", kve_last_error());
    return s;
}

static void decode_or_die(kvl_seq *s, const int32_t *t, size_t n, float *logits)
{
    if (kvl_decode(s, t, n, logits) != KVE_OK)
        die_input("decode: %s", kve_last_error());
}

/* text[0 .. len) as llama.cpp tokenizes it: no BOS, no special tokens
 * parsed (the model's own prefix space, as its tokenizer says). */
static int32_t *tokenize(const char *text, size_t len, size_t *n)
{
    if (len > (size_t)INT32_MAX / 2)
        die_input("a text of %zu bytes is beyond llama.cpp's tokenizer", len);
    size_t cap = len + 8;
    int32_t *t = xmalloc(cap * sizeof *t);
    int32_t got = api.llama_tokenize(model.vocab, text, (int32_t)len, t, (int32_t)cap, false,
                                     false);
    if (got < 0) {
        cap = (size_t)-got;
        t = xrealloc(t, cap * sizeof *t);
        got = api.llama_tokenize(model.vocab, text, (int32_t)len, t, (int32_t)cap, false, false);
    }
    if (got < 0)
        die_input("llama.cpp could not tokenize the text");
    *n = (size_t)got;
    return t;
}

/* The bytes token stands for (llama.cpp's piece, special tokens empty). */
static size_t piece(int32_t token, char *buf, size_t cap)
{
    int32_t n = api.llama_token_to_piece(model.vocab, token, buf, (int32_t)cap, 0, false);
    return n > 0 ? (size_t)n : 0;
}

static void json_float(FILE *f, float x)
{
    if (isfinite(x))
        fprintf(f, "%.9g", (double)x);
    else
        fputs("null", f);
}

/* ---- logits ------------------------------------------------------------------ */

static const char logits_usage[] =
    "usage: kvevict-llama logits --model GGUF --tokens LIST [--policy SPEC] [--budget B]\n"
    "                            [--threads N] [--batch N] [--seed N] [-o FILE]\n"
    "\n"
    "Decodes the tokens from position 0 with llama.cpp, its cache evicted by the policy\n"
    "(one decision per position for every layer and KV head), and prints for every\n"
    "position t one JSON object a line, as `kvevict lm logits` does:\n"
    "  {\"pos\": t, \"token\": id, \"logits\": [every vocabulary entry]}\n"
    "\n"
    "  --tokens LIST       token ids, decoded as given (no BOS is added)\n"
    "  --policy SPEC       kvevict's policy (default: none, every cell kept)\n"
    "  --budget B          positions kept (default: the spec's), or P% of the context\n"
    "  --batch N           tokens a llama_decode takes (default 1: an eviction after\n"
    "                      every token, as kvevict's decoder does)\n"
    "  --seed N            seed of the policies' random numbers (default 0)\n"
    KV_THREADS_USAGE
    COMMON_USAGE;

static const opt_def logits_own[] = {COMMON_OPTS, KV_THREADS_OPT, {"tokens", 0, OPT_VALUE}};
static const cli_spec logits_spec =
    LM_SPEC(logits_usage, SO_SEED | SO_OUTPUT, logits_own, FMT_JSON);

static int llama_logits(int argc, char **argv)
{
    cli_args a;
    const cli_spec *sp = &logits_spec;
    cli_parse(&a, sp, argc, argv);
    common c;
    common_parse(&c, &a, sp);
    size_t n = 0;
    char **items = split_list("--tokens", need(&a, sp, "tokens"), &n);
    int32_t *toks = xmalloc(n * sizeof *toks);
    for (size_t i = 0; i < n; i++)
        toks[i] = (int32_t)parse_u64("--tokens", items[i], 0, INT32_MAX);
    free_list(items, n);
    const char *spec = own(&a, sp, "policy"), *btext = own(&a, sp, "budget");
    if (btext && !spec)
        die_usage("--budget needs --policy");
    if (cli_own(&a, sp, "policy")->count > 1 || cli_own(&a, sp, "budget")->count > 1)
        die_usage("logits takes one --policy and one --budget");
    open_model(&a, sp, &c);
    for (size_t i = 0; i < n; i++)
        if ((size_t)toks[i] >= model.V)
            die_input("--tokens: token %d is outside the model's vocabulary [0, %zu)", toks[i],
                      model.V);
    char *run = spec ? runnable(spec, btext ? budget_value(btext) : 0) : NULL;
    kvl_engine *e = new_engine(run, &c, 1, n, a.seed);
    kvl_seq *s = new_seq(e, 0);
    FILE *out = out_open(a.output);
    float *lg = xmalloc(c.batch * model.V * sizeof *lg);
    for (size_t t = 0; t < n; t += c.batch) {
        size_t m = n - t < c.batch ? n - t : c.batch;
        decode_or_die(s, toks + t, m, lg);
        for (size_t i = 0; i < m; i++) {
            fprintf(out, "{\"pos\": %zu, \"token\": %d, \"logits\": [", t + i, toks[t + i]);
            for (size_t v = 0; v < model.V; v++) {
                if (v)
                    fputs(", ", out);
                json_float(out, lg[i * model.V + v]);
            }
            fputs("]}\n", out);
        }
    }
    out_close(out);
    free(lg);
    kvl_seq_free(s);
    kvl_engine_free(e);
    free(run);
    free(toks);
    close_model();
    return 0;
}

/* ---- eval ---------------------------------------------------------------------- */

static const char eval_usage[] =
    "usage: kvevict-llama eval --model GGUF --text FILE --policy LIST [--budget B|P%[,...]]\n"
    "                          [--threads N] [--batch N] [--seed N]\n"
    "                          [--format text|md|csv|json | --json | --csv | --md] [-o FILE]\n"
    "\n"
    "Bits per byte of the model on a text under llama.cpp with the full cache and with\n"
    "every policy at every budget, by the protocol of `kvevict lm eval`: the text\n"
    "tokenized once by llama.cpp (no BOS), cut into chunks of n_ctx_train - 1 tokens,\n"
    "each window BOS + chunk decoded from an empty cache. The rows are those of\n"
    "`kvevict lm eval --same-positions --json`, plus max_cells: the most cells\n"
    "llama.cpp's attention ran over at once (read from its mask), and n_ctx: the\n"
    "cells its context was created with.\n"
    "\n"
    "  --policy LIST       policies, comma-separated (a key=value item belongs to the\n"
    "                      spec before it); may be repeated\n"
    "  --budget LIST       budgets, counts or percentages of the context (default: the\n"
    "                      spec's)\n"
    "  --batch N           tokens a llama_decode takes (default 1)\n"
    "  --seed N            seed of the policies' random numbers (default 0)\n"
    "  --quiet             no progress line on stderr\n"
    KV_THREADS_USAGE
    COMMON_USAGE;

static const opt_def eval_own[] = {COMMON_OPTS, KV_THREADS_OPT, {"text", 0, OPT_VALUE}};
static const cli_spec eval_spec =
    LM_SPEC(eval_usage, SO_SEED | SO_FORMAT | SO_OUTPUT | SO_QUIET, eval_own, FMT_TEXT);

typedef struct ejob {
    char *spec; /* NULL: the full cache */
    size_t budget, max_cells, n_ctx;
    double *bits; /* (W) */
} ejob;

static int llama_eval(int argc, char **argv)
{
    cli_args a;
    const cli_spec *sp = &eval_spec;
    cli_parse(&a, sp, argc, argv);
    common c;
    common_parse(&c, &a, sp);
    const char *path = need(&a, sp, "text");
    size_t n_specs = 0, n_budgets = 0;
    char **specs = split_specs(cli_own(&a, sp, "policy"), &n_specs);
    if (!n_specs)
        die_usage("missing required option '--policy' (see kvevict-llama eval --help)");
    char **btexts = NULL;
    const opt_val *bv = cli_own(&a, sp, "budget");
    for (int k = 0; k < bv->count; k++) {
        size_t m;
        char **items = split_list("--budget", bv->v[k], &m);
        btexts = xrealloc(btexts, (n_budgets + m) * sizeof *btexts);
        memcpy(btexts + n_budgets, items, m * sizeof *items);
        n_budgets += m;
        free(items);
    }
    char *text = NULL;
    size_t text_len = 0;
    if (lm_read_file(NULL, path, &text, &text_len) != KVE_OK)
        die_input("--text: %s", kve_last_error());
    open_model(&a, sp, &c);
    size_t n_ids;
    int32_t *ids = tokenize(text, text_len, &n_ids);
    if (!n_ids)
        die_input("--text %s: empty", path);
    if (model.n_ctx_train < 2)
        die_input("--model: a context of %zu positions leaves no room after BOS",
                  model.n_ctx_train);
    const size_t chunk = model.n_ctx_train - 1, W = (n_ids + chunk - 1) / chunk;
    const int32_t bos = api.llama_vocab_bos(model.vocab);
    if (bos < 0 || (size_t)bos >= model.V)
        die_input("--model %s: no BOS token, which eval's windows begin with (kvevict lm "
                  "eval's protocol)", c.model);
    size_t nb = n_budgets ? n_budgets : 1, n_jobs = 1 + n_specs * nb;
    ejob *jobs = xcalloc(n_jobs, sizeof *jobs);
    for (size_t b = 0, j = 1; b < nb; b++)
        for (size_t i = 0; i < n_specs; i++, j++) {
            jobs[j].spec = runnable(specs[i], n_budgets ? budget_value(btexts[b]) : 0);
            kve_policy *p = NULL;
            kve_policy_options po = kve_policy_default_options();
            po.key_dim = model.S, po.value_dim = model.S, po.query_group = model.R;
            po.rope = model.rope;
            kve_rng g;
            kve_rng_seed(&g, 0);
            if (kve_policy_new_ex(jobs[j].spec, &g, &po, &p) != KVE_OK)
                die_input("--policy %s: %s", jobs[j].spec, kve_last_error());
            jobs[j].budget = kve_policy_budget(p);
            kve_policy_free(p);
        }
    double *bytes = xcalloc(W, sizeof *bytes);
    char pbuf[256];
    for (size_t w = 0; w < W; w++) {
        size_t n = w + 1 < W ? chunk : n_ids - w * chunk;
        for (size_t i = 0; i < n; i++)
            bytes[w] += (double)piece(ids[w * chunk + i], pbuf, sizeof pbuf);
    }
    int32_t *window = xmalloc((chunk + 1) * sizeof *window);
    float *lg = xmalloc(c.batch * model.V * sizeof *lg);
    progress pr;
    progress_begin(&pr, "token", (uint64_t)n_ids * n_jobs, 0, 1);
    uint64_t done = 0;
    for (size_t j = 0; j < n_jobs; j++) {
        ejob *jb = &jobs[j];
        jb->bits = xcalloc(W, sizeof *jb->bits);
        kvl_engine *e = new_engine(jb->spec, &c, 1, model.n_ctx_train, a.seed);
        kvl_seq *s = new_seq(e, 0);
        jb->n_ctx = kvl_engine_n_ctx(e);
        for (size_t w = 0; w < W; w++) {
            const int32_t *toks = ids + w * chunk;
            size_t n = w + 1 < W ? chunk : n_ids - w * chunk;
            window[0] = bos;
            memcpy(window + 1, toks, (n - 1) * sizeof *window);
            kvl_seq_reset(s);
            double nats = 0;
            for (size_t t = 0; t < n; t += c.batch) {
                size_t m = n - t < c.batch ? n - t : c.batch;
                decode_or_die(s, window + t, m, lg);
                for (size_t i = 0; i < m; i++)
                    nats += lm_token_nats(lg + i * model.V, (int32_t)model.V, toks[t + i]);
            }
            jb->bits[w] = nats / log(2.0);
            if (kvl_seq_max_cells(s) > jb->max_cells)
                jb->max_cells = kvl_seq_max_cells(s);
            progress_update(&pr, done += n);
        }
        kvl_seq_free(s);
        kvl_engine_free(e);
    }
    progress_end(&pr);
    if (W < 2)
        warn("one window: no standard errors");

    static const col cols[] = {
        {"policy", KEY_POLICY, COL_ALL | COL_LEFT | COL_CODE},
        {"budget", KEY_BUDGET, COL_ALL},
        {"positions", "positions", COL_CSV | COL_JSON},
        {"same positions", "same_positions", COL_CSV | COL_JSON},
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
        {"max cells", "max_cells", COL_ALL},
        {"n_ctx", "n_ctx", COL_ALL},
    };
    table t;
    table_init(&t, cols, sizeof cols / sizeof cols[0]);
    double total_bytes = (double)text_len + 1, full = 0;
    for (size_t w = 0; w < W; w++)
        full += jobs[0].bits[w];
    double *diff = xmalloc(W * sizeof *diff);
    for (size_t j = 0; j < n_jobs; j++) {
        const double *x = jobs[j].bits;
        double sum = 0, dsum = 0;
        for (size_t w = 0; w < W; w++) {
            sum += x[w];
            diff[w] = x[w] - jobs[0].bits[w];
            dsum += diff[w];
        }
        table_str(&t, jobs[j].spec ? jobs[j].spec : "full");
        if (jobs[j].spec)
            table_uint(&t, jobs[j].budget);
        else
            table_real(&t, NAN, "%.0f");
        table_str(&t, "original");
        table_real(&t, jobs[j].spec ? 1.0 : NAN, "%.0f");
        table_uint(&t, W);
        table_uint(&t, n_ids);
        table_uint(&t, text_len + 1);
        table_real(&t, sum / total_bytes, "%.4f");
        table_real(&t, ratio_se(x, bytes, W, total_bytes), "%.4f");
        table_real(&t, sum / (double)n_ids, "%.4f");
        table_real(&t, full / total_bytes, "%.4f");
        table_real(&t, dsum / total_bytes, "%+.4f");
        table_real(&t, j ? ratio_se(diff, bytes, W, total_bytes) : NAN, "%.4f");
        table_uint(&t, a.seed);
        table_uint(&t, jobs[j].max_cells);
        table_uint(&t, jobs[j].n_ctx);
    }
    FILE *out = out_open(a.output);
    if (a.format == FMT_TEXT)
        fprintf(out, "%s: %zu tokens, %zu bytes, %zu windows of up to %zu tokens, llama.cpp\n\n",
                path, n_ids, text_len + 1, W, chunk);
    table_print(&t, out, a.format);
    table_free(&t);
    out_close(out);
    for (size_t j = 0; j < n_jobs; j++) {
        free(jobs[j].spec);
        free(jobs[j].bits);
    }
    free(jobs), free(diff), free(bytes), free(window), free(lg), free(ids);
    lm_free(NULL, text);
    free_list(specs, n_specs);
    free_list(btexts, n_budgets);
    close_model();
    return 0;
}

/* ---- generate ---------------------------------------------------------------------- */

static const char generate_usage[] =
    "usage: kvevict-llama generate --model GGUF --prompt TEXT -n N [--policy SPEC]\n"
    "                              [--budget B] [--seed S] [--policy-seed S]\n"
    "                              [--samples K | --session FILE]\n"
    "                              [--top-k K] [--top-p P] [--temp T] [--repeat-penalty R]\n"
    "                              [--threads N] [--batch N] [--json]\n"
    "\n"
    "Text from the model under llama.cpp, its cache bounded by the policy: BOS (when\n"
    "the model asks for one), the prompt decoded in batches of --batch tokens with an\n"
    "eviction after each, then up to N tokens, one at a time (generation stops at an\n"
    "end-of-generation token). Greedy by default; --temp T > 0 samples with\n"
    "kvevict's sampler (llama.cpp's chain: repetition penalty, top-k, top-p,\n"
    "temperature, one draw from a generator seeded by --seed), so a seed repeats its\n"
    "text. llama.cpp's context holds budget + batch cells a sequence: a generation\n"
    "longer than that proves the memory bounded (llama.cpp fails when it finds no\n"
    "free cell).\n"
    "\n"
    "  -n, --tokens N      tokens to generate (default 256)\n"
    "  --policy SPEC       kvevict's policy (default: none, every cell kept)\n"
    "  --budget B          positions kept (default: the spec's), or P% of the context\n"
    "  --samples K         decode the prompt once, fork it into K sequences of one\n"
    "                      context (llama_memory_seq_cp and kve_bank_copy) and sample\n"
    "                      each with seed --seed + k; each equals a separate run with\n"
    "                      its seed\n"
    "  --session FILE      continue the session in FILE if it exists (--prompt is\n"
    "                      appended to it), then save llama.cpp's sequence state, the\n"
    "                      bank's image, the tokens and the sampler in FILE (written to a\n"
    "                      temporary and renamed); a corrupted file or another run's is\n"
    "                      refused and left as it was\n"
    "  --top-k K           keep the K most likely tokens (default 40; 0: off)\n"
    "  --top-p P           then the smallest set of probability >= P (default 0.95)\n"
    "  --temp T            temperature (default 0: greedy)\n"
    "  --repeat-penalty R  the repetition penalty over the last 64 tokens (default 1)\n"
    "  --batch N           tokens a llama_decode of the prompt takes (default: the\n"
    "                      budget, at most 512; 512 without a policy)\n"
    "  --seed S            the sampler's seed (default 0); on a resumed --session, the\n"
    "                      sampler's generator is the file's unless --seed is given\n"
    "  --policy-seed S     the policies' seed (random's victims; default 0), apart from\n"
    "                      the sampler's, so that a fork equals a separate run\n"
    "  --json              one JSON object per sample: sample, seed (the sampler's, null\n"
    "                      when it continues a session's generator), tokens (the ids\n"
    "                      generated), text, positions, max_cells (the most cells\n"
    "                      llama.cpp held for it at once, read from its mask), n_ctx\n"
    "                      (the cells of llama.cpp's context)\n"
    KV_THREADS_USAGE
    COMMON_USAGE;

static const opt_def generate_own[] = {
    COMMON_OPTS,          KV_THREADS_OPT, {"prompt", 0, OPT_VALUE}, {"tokens", 'n', OPT_VALUE},
    {"samples", 0, OPT_VALUE}, {"session", 0, OPT_VALUE},    {"top-k", 0, OPT_VALUE},
    {"top-p", 0, OPT_VALUE},   {"temp", 0, OPT_VALUE},       {"temperature", 0, OPT_VALUE},
    {"repeat-penalty", 0, OPT_VALUE}, {"policy-seed", 0, OPT_VALUE}};
static const cli_spec generate_spec =
    LM_SPEC(generate_usage, SO_SEED | SO_FORMAT, generate_own, FMT_TEXT);

/* A session file: "kvlsess\0", u32 version 1, u32 flags 0, u64 its size,
 * u64 the tokens decoded and each as i32, the sampler's generator (4 u64),
 * u64 the sequence's state bytes and the state (kvl_seq_save), u64 FNV-1a
 * 64 of every byte before it. Little-endian. */
enum { SESSION_VERSION = 1, SESSION_HEADER = 32 };
static const char session_magic[8] = {'k', 'v', 'l', 's', 'e', 's', 's', 0};

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

static void le64(unsigned char *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (unsigned char)(v >> (8 * k));
}

static uint64_t rd64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = v << 8 | p[k];
    return v;
}


static void save_session(const char *path, const kvl_seq *s, const history *h, const kve_rng *rng)
{
    size_t state = 0;
    if (kvl_seq_save(s, NULL, 0, &state) != KVE_OK)
        die_input("--session %s: %s", path, kve_last_error());
    size_t total = SESSION_HEADER + 4 * h->n + 32 + 8 + state + 8;
    unsigned char *buf = xmalloc(total), *p = buf;
    memcpy(p, session_magic, 8);
    le64(p + 8, SESSION_VERSION); /* u32 version 1, u32 flags 0 */
    le64(p + 16, total);
    le64(p + 24, h->n);
    p += SESSION_HEADER;
    for (size_t i = 0; i < h->n; i++, p += 4)
        for (int k = 0; k < 4; k++)
            p[k] = (unsigned char)((uint32_t)h->t[i] >> (8 * k));
    for (int k = 0; k < 4; k++, p += 8)
        le64(p, rng->s[k]);
    le64(p, state);
    p += 8;
    if (kvl_seq_save(s, p, state, &state) != KVE_OK)
        die_input("--session %s: %s", path, kve_last_error());
    p += state;
    le64(p, fnv1a(buf, total - 8));
    session_check(path); /* another run saved meanwhile: refused, its file kept */
    FILE *f = out_open_private(path) /* the conversation: 0600 when new */;
    if (fwrite(buf, 1, total, f) != total)
        die_input("--session %s: %s", path, strerror(errno));
    out_close(f);
    free(buf);
}

/* Loads the session at path into s (empty); 0 when there is no such file.
 * Any refusal exits before anything is written. */
static int resume(const char *path, kvl_seq *s, history *h, kve_rng *rng)
{
    if (!session_hold(path)) /* locked for the run; none yet: a new session */
        return 0;
    /* the header first, then at most the size it states */
    unsigned char head[SESSION_HEADER];
    size_t got = 0;
    if (lm_read_head(path, head, sizeof head, &got) != KVE_OK)
        die_input("--session: %s", kve_last_error());
    if (got < SESSION_HEADER || memcmp(head, session_magic, 8) != 0)
        die_input("--session %s: not a kvevict-llama session", path);
    const uint32_t version = (uint32_t)rd64(head + 8), flags = (uint32_t)(rd64(head + 8) >> 32);
    if (version != SESSION_VERSION)
        die_input("--session %s: version %u, this kvevict-llama reads %d", path,
                  (unsigned)version, SESSION_VERSION);
    if (flags)
        die_input("--session %s: flags %#x, this kvevict-llama knows none (0)", path,
                  (unsigned)flags);
    /* at most the largest session of its token count this run could write */
    const uint64_t stated = rd64(head + 16), tokens = rd64(head + 24);
    const uint64_t most = tokens > (uint64_t)INT32_MAX
                              ? 0
                              : SESSION_HEADER + 4 * tokens + 32 + 8 + kvl_seq_state_bound(s) + 8;
    if (stated < SESSION_HEADER + 32 + 8 + 8 || stated > most)
        die_input("--session %s: its header states %llu bytes for %llu tokens, not a session's "
                  "size (at most %llu here)", path, (unsigned long long)stated,
                  (unsigned long long)tokens, (unsigned long long)most);
    char *data = NULL;
    size_t size = 0;
    if (lm_read_file_max(NULL, path, (size_t)stated, &data, &size) != KVE_OK)
        die_input("--session: %s", kve_last_error());
    const unsigned char *p = (const unsigned char *)data;
    if (size < SESSION_HEADER + 32 + 8 + 8)
        die_input("--session %s: not a kvevict-llama session", path);
    if (rd64(p + 16) != size)
        die_input("--session %s: %zu bytes, its header says %llu (truncated?)", path, size,
                  (unsigned long long)rd64(p + 16));
    if (rd64(p + size - 8) != fnv1a(p, size - 8))
        die_input("--session %s: the checksum does not match (corrupted)", path);
    uint64_t n = rd64(p + 24);
    if (n > (size - SESSION_HEADER - 48) / 4)
        die_input("--session %s: %llu tokens do not fit its %zu bytes", path,
                  (unsigned long long)n, size);
    const unsigned char *q = p + SESSION_HEADER;
    for (size_t i = 0; i < n; i++, q += 4) {
        int32_t t = (int32_t)((uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                              (uint32_t)q[3] << 24);
        if (t < 0 || (size_t)t >= model.V)
            die_input("--session %s: token %zu = %d is outside the vocabulary", path, i, t);
        push(h, t);
    }
    uint64_t any = 0;
    for (int k = 0; k < 4; k++, q += 8)
        any |= rng->s[k] = rd64(q);
    uint64_t state = rd64(q);
    q += 8;
    if (!any || state != (uint64_t)(p + size - 8 - q))
        die_input("--session %s: %s", path, !any ? "an all-zero sampler generator"
                                                 : "the sequence's state is not its size");
    if (kvl_seq_load(s, q, (size_t)state) != KVE_OK)
        die_input("--session %s: %s", path, kve_last_error());
    if ((size_t)kvl_seq_pos(s) != h->n)
        die_input("--session %s: %zu tokens, but the sequence is at position %d", path, h->n,
                  kvl_seq_pos(s));
    lm_free(NULL, data);
    return 1;
}

/* One sample's generation, round by round. */
typedef struct sample {
    kvl_seq *s;
    history h;
    kve_rng rng;
    uint64_t seed;
    int seeded;    /* 0: the generator is a resumed session's, not seed's */
    int32_t *made; /* the tokens generated */
    size_t n_made;
    int done;
} sample;

static int llama_generate(int argc, char **argv)
{
    cli_args a;
    const cli_spec *sp = &generate_spec;
    cli_parse(&a, sp, argc, argv);
    common c;
    common_parse(&c, &a, sp);
    const char *prompt = own(&a, sp, "prompt"), *v;
    if (!prompt)
        prompt = "";
    v = own(&a, sp, "tokens");
    size_t steps = v ? (size_t)parse_u64("--tokens", v, 0, INT32_MAX / 2) : 256;
    v = own(&a, sp, "samples");
    size_t K = v ? (size_t)parse_u64("--samples", v, 1, 64) : 1;
    const char *session = own(&a, sp, "session");
    if (session && K > 1)
        die_usage("--session saves one sequence: not with --samples %zu", K);
    lm_sampler_params spar = lm_sampler_default_params();
    if ((v = own(&a, sp, "temp")) || (v = own(&a, sp, "temperature")))
        spar.temperature = parse_real("--temp", v, 0, 1e6);
    if ((v = own(&a, sp, "top-k")))
        spar.top_k = (int32_t)parse_u64("--top-k", v, 0, INT32_MAX);
    if ((v = own(&a, sp, "top-p")) && (spar.top_p = parse_real("--top-p", v, 0, 1)) <= 0)
        die_usage("--top-p: '%s' is not in (0, 1]", v);
    if ((v = own(&a, sp, "repeat-penalty")) &&
        (spar.repeat_penalty = parse_real("--repeat-penalty", v, 0, 1e6)) <= 0)
        die_usage("--repeat-penalty: '%s' is not in (0, 1e6]", v);
    if (a.format != FMT_TEXT && a.format != FMT_JSON)
        die_usage("--format: generate writes text or json");
    const char *spec = own(&a, sp, "policy"), *btext = own(&a, sp, "budget");
    if (btext && !spec)
        die_usage("--budget needs --policy");
    if (cli_own(&a, sp, "policy")->count > 1 || cli_own(&a, sp, "budget")->count > 1)
        die_usage("generate takes one --policy and one --budget");
    int seed_given = 0;
    for (int i = 0; i < argc; i++)
        seed_given |= strcmp(argv[i], "--seed") == 0 || strncmp(argv[i], "--seed=", 7) == 0;
    v = own(&a, sp, "policy-seed");
    const uint64_t policy_seed = v ? parse_u64("--policy-seed", v, 0, UINT64_MAX) : 0;

    open_model(&a, sp, &c);
    char *run = spec ? runnable(spec, btext ? budget_value(btext) : 0) : NULL;
    size_t n_prompt;
    int32_t *ids = tokenize(prompt, strlen(prompt), &n_prompt);
    const int add_bos = api.llama_vocab_get_add_bos(model.vocab);
    size_t budget = 0;
    if (run) {
        kve_policy *p = NULL;
        kve_policy_options po = kve_policy_default_options();
        po.key_dim = model.S, po.value_dim = model.S, po.query_group = model.R;
        po.rope = model.rope;
        kve_rng g;
        kve_rng_seed(&g, 0);
        if (kve_policy_new_ex(run, &g, &po, &p) != KVE_OK)
            die_input("--policy %s: %s", run, kve_last_error());
        budget = kve_policy_budget(p);
        kve_policy_free(p);
    }
    if (!c.batch_given)
        c.batch = run ? (budget < 512 ? budget : 512) : 512;
    /* without a policy the cells hold every token: a resumed session's too */
    size_t cells = (size_t)add_bos + n_prompt + steps + 1;
    history h0 = {0};
    kve_rng rng;
    kve_rng_seed(&rng, a.seed);
    if (session && !run) {
        FILE *probe = fopen(session, "rb");
        if (probe) { /* room for the session's tokens */
            unsigned char hdr[SESSION_HEADER];
            if (fread(hdr, 1, sizeof hdr, probe) == sizeof hdr && rd64(hdr + 24) < INT32_MAX)
                cells += (size_t)rd64(hdr + 24);
            fclose(probe);
        }
    }
    int32_t bos = api.llama_vocab_bos(model.vocab);
    if (add_bos && (bos < 0 || (size_t)bos >= model.V))
        die_input("--model %s: it asks for a BOS token but names none in its vocabulary",
                  c.model);
    kvl_engine *e = new_engine(run, &c, K, cells, policy_seed);
    kvl_seq *s0 = new_seq(e, 0);
    int resumed = session && resume(session, s0, &h0, &rng);
    if (!resumed && !add_bos && !n_prompt)
        die_input("--prompt is empty and %s has no BOS: nothing to continue from", c.model);
    if (resumed && seed_given)
        kve_rng_seed(&rng, a.seed);
    double start = now_s();
    double kv0 = kvl_engine_kvevict_seconds(e);
    int32_t *all = xmalloc((n_prompt + 1) * sizeof *all);
    size_t n_all = 0;
    if (!resumed && add_bos)
        all[n_all++] = bos;
    memcpy(all + n_all, ids, n_prompt * sizeof *ids);
    n_all += n_prompt;
    if (n_all)
        decode_or_die(s0, all, n_all, NULL);
    for (size_t i = 0; i < n_all; i++)
        push(&h0, all[i]);
    size_t decoded = n_all;
    sample *smp = xcalloc(K, sizeof *smp);
    for (size_t k = 0; k < K; k++) {
        sample *x = &smp[k];
        x->seed = a.seed + k;
        x->seeded = !resumed || seed_given;
        x->s = k ? new_seq(e, (int32_t)k) : s0;
        if (k && kvl_seq_copy(x->s, s0) != KVE_OK)
            die_input("fork: %s", kve_last_error());
        x->h.n = x->h.cap = h0.n;
        x->h.t = xmalloc((h0.n ? h0.n : 1) * sizeof *x->h.t);
        memcpy(x->h.t, h0.t, h0.n * sizeof *h0.t);
        x->rng = rng; /* --seed's, or the session's */
        if (K > 1)
            kve_rng_seed(&x->rng, x->seed);
        x->made = xmalloc((steps ? steps : 1) * sizeof *x->made);
    }
    lm_candidate *scratch = xmalloc(model.V * sizeof *scratch);
    char pbuf[256];
    for (size_t r = 0; r < steps; r++) { /* round-robin: one token of each sample a round */
        int any = 0;
        for (size_t k = 0; k < K; k++) {
            sample *x = &smp[k];
            if (x->done)
                continue;
            int32_t next = lm_sample(&spar, kvl_seq_logits(x->s), (int32_t)model.V, NULL,
                                     x->h.t, x->h.n, &x->rng, scratch);
            if (next < 0 || api.llama_vocab_is_eog(model.vocab, next)) {
                x->done = 1;
                continue;
            }
            x->made[x->n_made++] = next;
            decode_or_die(x->s, &next, 1, NULL);
            push(&x->h, next);
            decoded++;
            any = 1;
        }
        if (!any)
            break;
    }
    double secs = now_s() - start, kv = kvl_engine_kvevict_seconds(e) - kv0;
    if (session)
        save_session(session, s0, &smp[0].h, &smp[0].rng);
    for (size_t k = 0; k < K; k++) {
        sample *x = &smp[k];
        char *txt = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&txt, &len);
        if (!mem)
            die_input("out of memory");
        for (size_t i = 0; i < x->n_made; i++) {
            size_t np = piece(x->made[i], pbuf, sizeof pbuf);
            fwrite(pbuf, 1, np, mem);
        }
        fclose(mem);
        if (a.format == FMT_JSON) {
            if (x->seeded)
                printf("{\"sample\": %zu, \"seed\": %llu, \"tokens\": [", k,
                       (unsigned long long)x->seed);
            else
                printf("{\"sample\": %zu, \"seed\": null, \"tokens\": [", k);
            for (size_t i = 0; i < x->n_made; i++)
                printf("%s%d", i ? ", " : "", x->made[i]);
            printf("], \"text\": ");
            json_string(stdout, txt);
            printf(", \"positions\": %d, \"max_cells\": %zu, \"n_ctx\": %zu}\n",
                   kvl_seq_pos(x->s), kvl_seq_max_cells(x->s), kvl_engine_n_ctx(e));
        } else {
            if (K > 1)
                printf("--- sample %zu of %zu, seed %llu ---\n", k + 1, K,
                       (unsigned long long)x->seed);
            printf("%s%s\n", k == 0 || K > 1 ? prompt : "", txt);
        }
        free(txt);
    }
    finish_stdout();
    fprintf(stderr,
            "kvevict-llama generate: %zu tokens decoded in %.3f s (%.1f tokens/s, %.1f%% of it "
            "kvevict's); llama.cpp's context %zu cells, at most %zu held; policy %s\n",
            decoded, secs, secs > 0 ? (double)decoded / secs : 0.0,
            secs > 0 ? 100.0 * kv / secs : 0.0, kvl_engine_n_ctx(e), kvl_seq_max_cells(s0),
            run ? run : "none (every cell kept)");
    for (size_t k = 0; k < K; k++) {
        free(smp[k].h.t);
        free(smp[k].made);
        kvl_seq_free(smp[k].s);
    }
    free(smp), free(scratch), free(all), free(ids), free(h0.t), free(run);
    kvl_engine_free(e);
    close_model();
    return 0;
}

/* ---- quantize --------------------------------------------------------------------- */

static const char quantize_usage[] =
    "usage: kvevict-llama quantize --model IN -o OUT --type T [--threads N]\n"
    "\n"
    "llama.cpp's own quantizer (llama_model_quantize) on a GGUF file: the files\n"
    "users download are its presets. T: F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,\n"
    "Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_NL,\n"
    "IQ4_XS.\n"
    COMMON_USAGE;

static const opt_def quantize_own[] = {COMMON_OPTS, {"type", 0, OPT_VALUE}};
static const cli_spec quantize_spec =
    LM_SPEC(quantize_usage, SO_OUTPUT, quantize_own, FMT_TEXT);

static int llama_quantize(int argc, char **argv)
{
    static const struct {
        const char *name;
        enum llama_ftype ftype;
    } types[] = {
        {"F16", LLAMA_FTYPE_MOSTLY_F16},       {"BF16", LLAMA_FTYPE_MOSTLY_BF16},
        {"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
        {"Q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},     {"Q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},
        {"Q5_1", LLAMA_FTYPE_MOSTLY_Q5_1},     {"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},
        {"Q3_K_S", LLAMA_FTYPE_MOSTLY_Q3_K_S}, {"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M},
        {"Q3_K_L", LLAMA_FTYPE_MOSTLY_Q3_K_L}, {"Q4_K_S", LLAMA_FTYPE_MOSTLY_Q4_K_S},
        {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"Q5_K_S", LLAMA_FTYPE_MOSTLY_Q5_K_S},
        {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K},
        {"IQ4_NL", LLAMA_FTYPE_MOSTLY_IQ4_NL}, {"IQ4_XS", LLAMA_FTYPE_MOSTLY_IQ4_XS},
    };
    cli_args a;
    const cli_spec *sp = &quantize_spec;
    cli_parse(&a, sp, argc, argv);
    common c;
    common_parse(&c, &a, sp);
    const char *tname = need(&a, sp, "type");
    if (!a.output || strcmp(a.output, "-") == 0)
        die_usage("quantize writes a file: give -o OUT");
    size_t k = 0, nt = sizeof types / sizeof types[0];
    while (k < nt && strcmp(types[k].name, tname) != 0)
        k++;
    if (k == nt)
        die_usage("--type: '%s' is not one of the types of --help", tname);
    char msg[4600];
    if (kvl_api_open(&api, own(&a, sp, "llama-lib"), msg, sizeof msg) != 0)
        die_input("%s", msg);
    FILE *f = fopen(c.model, "rb");
    if (!f)
        die_input("--model %s: %s", c.model, strerror(errno));
    fclose(f);
    llama_model_quantize_params qp = api.llama_model_quantize_default_params();
    qp.ftype = types[k].ftype;
    qp.nthread = (int32_t)c.threads;
    if (api.llama_model_quantize(c.model, a.output, &qp) != 0)
        die_input("llama_model_quantize %s to %s failed: %s", c.model, tname, kvl_llama_error());
    api.llama_backend_free();
    kvl_api_close(&api);
    return 0;
}

/* ---- bench ------------------------------------------------------------------------ */

static const char bench_usage[] =
    "usage: kvevict-llama bench --model GGUF [--policy LIST] [--budget B]\n"
    "                           [--prompt-tokens P] [--tokens N] [--repeats R] [--threads N]\n"
    "                           [--format text|md|csv|json | --json | --csv | --md]\n"
    "\n"
    "Decode speed of llama.cpp alone against llama.cpp with each policy managing its\n"
    "cache. Two configurations without kvevict: llama.cpp alone (no eval callback,\n"
    "every cell kept, its cache growing from P to P + N cells) and the floor of a\n"
    "bounded cache, llama.cpp keeping its newest B cells by llama_memory_seq_rm\n"
    "alone (no callback, no kvevict), which attends as many cells as a policy does.\n"
    "Each run reads a prompt of P tokens (default: the budget), then times N\n"
    "single-token decodes (default 128) of the argmax. Runs alternate between the\n"
    "configurations, R rounds (default 5); the table gives each one's median tokens\n"
    "per second, its median ratio to the floor of the same round, and kvevict's\n"
    "share of the decode time: the copies of queries and keys, the rows, the bank,\n"
    "the seq_rm calls and the key copy. A timing: machine-dependent, quoted, never\n"
    "checked.\n"
    "\n"
    "  --policy LIST       policies (default: h2o,streaming)\n"
    "  --budget B|P%       every policy's budget (default 512, or half the context of a\n"
    "                      model of at most 512 positions)\n"
    "  --batch N           tokens a llama_decode of the prompt takes (default: P, at\n"
    "                      most 512)\n"
    KV_THREADS_USAGE
    COMMON_USAGE;

static const opt_def bench_own[] = {COMMON_OPTS, KV_THREADS_OPT, {"prompt-tokens", 0, OPT_VALUE},
                                    {"tokens", 'n', OPT_VALUE}, {"repeats", 0, OPT_VALUE}};
static const cli_spec bench_spec =
    LM_SPEC(bench_usage, SO_FORMAT | SO_OUTPUT, bench_own, FMT_TEXT);

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One timed run: P prompt tokens, then N decodes of the argmax; the decode
 * phase's tokens per second and kvevict's share of it. */
static void bench_run(const char *spec, size_t window, const common *c, size_t P, size_t N,
                      double *tps, double *share)
{
    kvl_options o = {.spec = spec, .batch = c->batch, .sequences = 1, .cells = P + N + 1,
                     .threads = c->threads, .kv_threads = c->kv_threads, .seed = 0,
                     .capture = spec != NULL,
                     .window = window};
    kvl_engine *e = NULL;
    if (kvl_engine_new(&model, &o, &e) != KVE_OK)
        die_input("%s", kve_last_error());
    kvl_seq *s = new_seq(e, 0);
    int32_t *t = xmalloc((P + 1) * sizeof *t);
    for (size_t i = 0; i < P; i++) /* a fixed, model-independent token stream */
        t[i] = (int32_t)(1 + (i * 7919u) % (model.V - 1));
    decode_or_die(s, t, P, NULL);
    double kv0 = kvl_engine_kvevict_seconds(e), t0 = now_s();
    for (size_t k = 0; k < N; k++) {
        const float *lg = kvl_seq_logits(s);
        int32_t best = 0;
        for (size_t v = 1; v < model.V; v++)
            best = lg[v] > lg[best] ? (int32_t)v : best;
        decode_or_die(s, &best, 1, NULL);
    }
    double secs = now_s() - t0;
    *tps = (double)N / secs;
    *share = (kvl_engine_kvevict_seconds(e) - kv0) / secs;
    free(t);
    kvl_seq_free(s);
    kvl_engine_free(e);
}

static int llama_bench(int argc, char **argv)
{
    cli_args a;
    const cli_spec *sp = &bench_spec;
    cli_parse(&a, sp, argc, argv);
    common c;
    common_parse(&c, &a, sp);
    size_t n_specs = 0;
    char **specs = split_specs(cli_own(&a, sp, "policy"), &n_specs);
    if (!n_specs) {
        specs = xmalloc(2 * sizeof *specs);
        specs[0] = xstrdup("h2o");
        specs[1] = xstrdup("streaming");
        n_specs = 2;
    }
    const char *v = own(&a, sp, "tokens");
    size_t N = v ? (size_t)parse_u64("--tokens", v, 1, 1u << 20) : 128;
    v = own(&a, sp, "repeats");
    size_t R = v ? (size_t)parse_u64("--repeats", v, 1, 1000) : 5;
    open_model(&a, sp, &c);
    v = own(&a, sp, "budget");
    size_t budget = v ? budget_value(v) : 512 < model.n_ctx_train ? 512 : model.n_ctx_train / 2;
    v = own(&a, sp, "prompt-tokens");
    size_t P = v ? (size_t)parse_u64("--prompt-tokens", v, 1, 1u << 20) : budget;
    if (!c.batch_given)
        c.batch = P < 512 ? P : 512;
    size_t nc = 2 + n_specs; /* alone, the floor, the policies */
    char **run = xcalloc(nc, sizeof *run);
    for (size_t i = 0; i < n_specs; i++)
        run[2 + i] = runnable(specs[i], budget);
    double *tps = xcalloc(nc * R, sizeof *tps), *share = xcalloc(nc * R, sizeof *share);
    double *ratio = xcalloc(nc * R, sizeof *ratio);
    for (size_t r = 0; r < R; r++)
        for (size_t k = 0; k < nc; k++)
            bench_run(run[k], k == 1 ? budget : 0, &c, P, N, &tps[k * R + r], &share[k * R + r]);
    for (size_t r = 0; r < R; r++)
        for (size_t k = 0; k < nc; k++)
            ratio[k * R + r] = tps[k * R + r] / tps[1 * R + r];
    static const col cols[] = {
        {"configuration", KEY_POLICY, COL_ALL | COL_LEFT | COL_CODE},
        {"budget", KEY_BUDGET, COL_ALL},
        {"tokens/s", "tokens_per_s", COL_ALL},
        {"min", "tokens_per_s_min", COL_ALL},
        {"max", "tokens_per_s_max", COL_ALL},
        {"vs floor", "vs_floor", COL_ALL},
        {"kvevict share", "kvevict_share", COL_ALL},
        {"threads", "threads", COL_CSV | COL_JSON},
        {"kv threads", "kv_threads", COL_CSV | COL_JSON},
        {"prompt", "prompt_tokens", COL_CSV | COL_JSON},
        {"decoded", "tokens", COL_CSV | COL_JSON},
        {"rounds", "repeats", COL_CSV | COL_JSON},
    };
    table t;
    table_init(&t, cols, sizeof cols / sizeof cols[0]);
    for (size_t k = 0; k < nc; k++) {
        double *x = tps + k * R;
        double lo = x[0], hi = x[0];
        for (size_t r = 1; r < R; r++)
            lo = x[r] < lo ? x[r] : lo, hi = x[r] > hi ? x[r] : hi;
        table_str(&t, run[k] ? run[k] : k ? "floor: newest B cells by seq_rm" : "llama.cpp alone");
        if (k)
            table_uint(&t, budget);
        else
            table_real(&t, NAN, "%.0f");
        table_real(&t, median(x, R), "%.1f");
        table_real(&t, lo, "%.1f");
        table_real(&t, hi, "%.1f");
        table_real(&t, median(ratio + k * R, R), "%.3f");
        table_real(&t, run[k] ? median(share + k * R, R) : NAN, "%.4f");
        table_uint(&t, c.threads);
        table_uint(&t, c.kv_threads);
        table_uint(&t, P);
        table_uint(&t, N);
        table_uint(&t, R);
    }
    FILE *out = out_open(a.output);
    if (a.format == FMT_TEXT) {
        char desc[256] = "";
        api.llama_model_desc(model.model, desc, sizeof desc);
        fprintf(out, "%s (%s): %zu prompt tokens, %zu decoded, %zu rounds, %zu threads (kvevict's "
                "%zu)\n\n", c.model, desc, P, N, R, c.threads, c.kv_threads);
    }
    table_print(&t, out, a.format);
    table_free(&t);
    out_close(out);
    for (size_t k = 0; k < nc; k++)
        free(run[k]);
    free(run), free(tps), free(share), free(ratio);
    free_list(specs, n_specs);
    close_model();
    return 0;
}

/* ---- main ------------------------------------------------------------------------- */

static const char main_usage[] =
    "usage: kvevict-llama COMMAND [OPTIONS]   (COMMAND --help for its options)\n"
    "\n"
    "kvevict's eviction policies managing llama.cpp's KV cache (docs/llama.cpp.md):\n"
    "  logits     the logits of every position of a token list (kvevict lm logits)\n"
    "  eval       bits per byte on a text, every policy and budget (kvevict lm eval)\n"
    "  generate   text with a bounded cache; samples, sessions (kvevict generate)\n"
    "  bench      tokens per second of llama.cpp alone and with each policy\n"
    "  quantize   llama.cpp's quantizer on a GGUF file (its presets: Q4_K_M, ...)\n";

int main(int argc, char **argv)
{
    cli_program = "kvevict-llama";
    cli_signals_install();
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } cmds[] = {{"logits", llama_logits},     {"eval", llama_eval},
                {"generate", llama_generate}, {"bench", llama_bench},
                {"quantize", llama_quantize}};
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(main_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(argv[1], cmds[i].name) == 0) {
            cli_cmd = cmds[i].name;
            return cmds[i].fn(argc - 2, argv + 2);
        }
    die_usage("unknown command '%s' (logits, eval, generate, bench, quantize)", argv[1]);
}
