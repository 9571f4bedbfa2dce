/* SPDX-License-Identifier: MIT */
/*
 * generate.c - the decoder on one token sequence: `kvevict lm logits` (the
 * logits at every position, JSON Lines) and `kvevict generate` (text
 * streamed from a prompt with a bounded cache).
 */
#define _POSIX_C_SOURCE 200809L
#include "lm_cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    "  --budget B       evict to B positions (default: the spec's budget), or P% of\n"
    "                   the model's context: floor(P seq_len / 100) positions\n"
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

int lm_logits(int argc, char **argv)
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
    if (a.n_budgets && !a.policy)
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
    resolve_budget(&a);
    int32_t V = lm_ctx.model->config.vocab_size;
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

/* ---- generate --------------------------------------------------------------------- */

static const char generate_usage[] =
    "usage: kvevict generate --model CKPT [--prompt TEXT] [--steps N] [--tokenizer TOK]\n"
    "                        [--policy SPEC] [--budget B] [--positions original|cache]\n"
    "                        [--temperature T] [--seed N] [--prefill METHOD]\n"
    "                        [--heads FILE [--streaming-budget N]]\n"
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
    "  --prefill M     read BOS and the prompt with every key kept, then cut the\n"
    "                  cache to the budget at once (docs/prefill.md): h2o, snapkv,\n"
    "                  kvzip (KVzip's reconstruction) or policy (the policy's own\n"
    "                  scores); default: per-step eviction from the first token\n"
    "  --heads FILE    a DuoAttention schedule: the budget spent on retrieval and\n"
    "                  streaming heads as docs/duo.md says\n"
    "  --streaming-budget N  with --heads: the least a streaming head keeps (16)\n"
    "  other options as for `kvevict lm logits`.\n";

static const opt_def generate_own[] = {{"model", 0, OPT_VALUE},     {"prompt", 0, OPT_VALUE},
                                       {"steps", 0, OPT_VALUE},     {"tokenizer", 0, OPT_VALUE},
                                       {"positions", 0, OPT_VALUE}, {"temperature", 0, OPT_VALUE},
                                       {"threads", 0, OPT_VALUE},
                                       {"prefill", 0, OPT_VALUE},   {"heads", 0, OPT_VALUE},
                                       {"streaming-budget", 0, OPT_VALUE}};
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
    if (a.n_budgets && !spec)
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
    static const char *const pf_names[] = {"h2o", "snapkv", "kvzip", "policy"};
    const char *pf = own(&a, sp, "prefill"), *heads = own(&a, sp, "heads");
    int pf_k = -1;
    for (int k = 0; pf && k < 4; k++)
        pf_k = strcmp(pf, pf_names[k]) == 0 ? k : pf_k;
    if (pf && pf_k < 0)
        die_usage("--prefill: '%s' is not h2o, snapkv, kvzip or policy", pf);
    if ((pf || heads) && !spec)
        die_usage("--%s needs --policy", pf ? "prefill" : "heads");
    const char *sb = own(&a, sp, "streaming-budget");
    if (sb && !heads)
        die_usage("--streaming-budget needs --heads");
    lm_ctx.streaming_budget = sb ? (size_t)parse_u64("--streaming-budget", sb, 1, KVE_MAX_BUDGET)
                                 : 16;
    load_model(model);
    resolve_budget(&a);
    budget = a.budget;
    load_tokenizer(own(&a, sp, "tokenizer"), model);
    if (heads)
        lm_ctx.heads = load_heads(heads, "--heads");
    size_t n_prompt;
    int32_t *ids = encode(prompt, strlen(prompt), &n_prompt);
    lm_state *s = new_state(spec, budget, positions, seed);
    kve_rng rng;
    kve_rng_seed(&rng, seed);
    int32_t V = lm_ctx.model->config.vocab_size, token = LM_BOS;
    size_t made = 0, i = 0;
    double start = now_s();
    if (pf) { /* BOS and the prompt read at once, then cut; generation goes on */
        int32_t *all = xmalloc((n_prompt + 1) * sizeof *all);
        all[0] = LM_BOS;
        memcpy(all + 1, ids, n_prompt * sizeof *ids);
        kve_prefill_options p = kve_prefill_default_options();
        p.method = pf_k == 1 ? KVE_PREFILL_SNAPKV : pf_k == 2 ? KVE_PREFILL_KVZIP : KVE_PREFILL_H2O;
        kve_status st;
        if (pf_k == 2) {
            lm_kvzip kz;
            st = lm_kvzip_default(lm_ctx.tok, &kz);
            if (st == KVE_OK)
                st = lm_prefill_kvzip(s, all, n_prompt + 1, &kz, &p);
        } else {
            st = lm_prefill(s, all, n_prompt + 1, pf_k == 3 ? NULL : &p);
        }
        free(all);
        if (st != KVE_OK) {
            free(ids);
            die_lm(st, "--prefill");
        }
        for (; i < n_prompt; i++) { /* the prompt's text, as the loop below writes it */
            size_t len;
            const char *piece = lm_decode(lm_ctx.tok, token, ids[i], &len);
            put_piece(piece, len);
            token = ids[i];
        }
        fflush(stdout);
    }
    for (; made < steps || i < n_prompt; i++) {
        if (pf && i == n_prompt && made == 0) {
            /* the logits after the prompt are the prefill's */
        } else {
            kve_status st = lm_forward(s, token);
            if (st != KVE_OK)
                die_lm(st, "decode");
        }
        int32_t next = i < n_prompt ? ids[i] : sample(s->logits, V, temp, &rng);
        if (i >= n_prompt)
            made++;
        if (next == LM_BOS)
            break;
        size_t len;
        const char *p = lm_decode(lm_ctx.tok, token, next, &len);
        put_piece(p, len);
        fflush(stdout);
        token = next;
    }
    fputc('\n', stdout);
    finish_stdout();
    double secs = now_s() - start;
    const lm_config *c = &lm_ctx.model->config;
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
