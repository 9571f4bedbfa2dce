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
    "                   F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K,\n"
    "                   IQ4_NL, IQ4_XS)\n"
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
    "  --products P     exact (the default: the decoder's own arithmetic) or llama\n"
    "                   (llama.cpp's: inputs converted per weight type, float16 keys\n"
    "                   and values, its flash attention; docs/decoder.md), as the\n"
    "                   CPU variant it loads here computes it; llama:avx2,\n"
    "                   llama:avx512 or llama:avx512-bf16 names the variant\n"
    "  --batch N        tokens decoded at once, each weight read once for all\n"
    "                   (default 64; 1: one at a time; the same bits for every N)\n"
    "  --same-positions every (layer, KV head) keeps the same positions: one eviction\n"
    "                   a step for all, by their scores added together (docs/decoder.md)\n"
    "  -o, --output F   write to F instead of standard output\n";

static const opt_def logits_own[] = {{"model", 0, OPT_VALUE},
                                     {"tokens", 0, OPT_VALUE},
                                     {"prompt", 0, OPT_VALUE},
                                     {"tokenizer", 0, OPT_VALUE},
                                     {"positions", 0, OPT_VALUE},
                                     {"threads", 0, OPT_VALUE}, {"products", 0, OPT_VALUE},
                                     {"batch", 0, OPT_VALUE}, {"same-positions", 0, 0}};
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

/* One JSON line per token's logits (lm_forward_batch's callback). */
typedef struct logits_out {
    FILE *out;
    const int32_t *toks;
    int32_t V;
} logits_out;

static void print_logits(void *user, size_t t, const float *logits)
{
    const logits_out *lo = user;
    fprintf(lo->out, "{\"pos\": %zu, \"token\": %d, \"logits\": [", t, lo->toks[t]);
    for (int32_t i = 0; i < lo->V; i++) {
        if (i)
            fputs(", ", lo->out);
        json_float(lo->out, logits[i]);
    }
    fputs("]}\n", lo->out);
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
    parse_batch(&a, sp);
    parse_same_positions(&a, sp);
    if (a.n_budgets && !a.policy)
        die_usage("--budget needs --policy");
    if (lm_ctx.same_positions && !a.policy)
        die_usage("--same-positions needs --policy");
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
        int32_t bos = lm_ctx.model->config.bos;
        size_t first = bos >= 0;
        if (m + first == 0)
            die_usage("--prompt is empty and the model has no BOS: no token to decode");
        toks = xmalloc((m + 1) * sizeof *toks);
        toks[0] = bos;
        memcpy(toks + first, ids, m * sizeof *ids);
        n = m + first;
        free(ids);
    }
    for (size_t i = 0; i < n; i++)
        if (toks[i] >= V)
            die_usage("--tokens: token %d is outside the model's vocabulary [0, %d)", toks[i], V);
    lm_state *s = new_state(a.policy, a.budget, positions, a.seed);
    logits_out lo = {out_open(a.output), toks, V};
    kve_status st = lm_forward_batch(s, toks, n, print_logits, &lo);
    if (st != KVE_OK)
        die_lm(st, "decode");
    out_close(lo.out);
    lm_state_free(s);
    free(toks);
    return 0;
}

/* ---- generate --------------------------------------------------------------------- */

static const char generate_usage[] =
    "usage: kvevict generate --model CKPT [--prompt TEXT] [--steps N] [--tokenizer TOK]\n"
    "                        [--policy SPEC] [--budget B] [--positions original|cache]\n"
    "                        [--temperature T] [--top-k K] [--top-p P]\n"
    "                        [--repeat-penalty R] [--repeat-last-n N] [--seed N]\n"
    "                        [--policy-seed N]\n"
    "                        [--allow-key-tokens] [--samples N | --session FILE]\n"
    "                        [--json [--logits]] [--prefill METHOD]\n"
    "                        [--heads FILE [--streaming-budget N]]\n"
    "\n"
    "Streams text from the model with a bounded cache: BOS, the prompt, then N\n"
    "generated tokens (default 256; generation stops early at an end-of-generation\n"
    "token of the vocabulary, a GGUF's EOS or end of turn, or at BOS). Greedy\n"
    "(argmax) by default; --temperature T > 0 samples with llama.cpp's chain:\n"
    "repetition penalty, top-k, top-p, temperature, one draw from kvevict's\n"
    "generator seeded by --seed, so a seed repeats its text. The reserved\n"
    "pass-key tokens <keyNN> are never chosen without --allow-key-tokens. Tokens\n"
    "per second and the cache's occupancy go to standard error at the end.\n"
    "\n"
    "  --policy SPEC       the policy of every (layer, KV head) (default: none, the\n"
    "                      cache grows without bound)\n"
    "  --top-k K           keep the K most likely tokens (default 40; 0: off)\n"
    "  --top-p P           then the smallest set of probability >= P (default 0.95;\n"
    "                      1: off)\n"
    "  --repeat-penalty R  divide a positive logit (multiply a negative one) of each\n"
    "                      token among the last --repeat-last-n (default 64) by R\n"
    "                      (default 1: off)\n"
    "  --samples N         decode the prompt once, fork the cache and the policies N\n"
    "                      ways and sample N continuations with seeds --seed,\n"
    "                      --seed + 1, ...; each printed after a line\n"
    "                      '--- sample I of N, seed S ---' (text); each equals a\n"
    "                      separate run with its seed\n"
    "  --seed N            the sampler's seed (default 0); a resumed --session\n"
    "                      continues the file's generator unless --seed is given\n"
    "  --policy-seed N     the policies' seed (random's victims; default 0), apart\n"
    "                      from the sampler's, so that a fork equals a separate run\n"
    "  --session FILE      continue the session in FILE if it exists (--prompt is\n"
    "                      appended to it), then save the whole state to FILE;\n"
    "                      a session of another model or other options is refused\n"
    "  --prefill M         read BOS and the prompt with every key kept, then cut the\n"
    "                      cache to the budget at once (docs/prefill.md): h2o,\n"
    "                      snapkv, kvzip (KVzip's reconstruction) or policy (the\n"
    "                      policy's own scores); default: per-step eviction from\n"
    "                      the first token. A new sequence only (not a resumed\n"
    "                      --session)\n"
    "  --heads FILE        a DuoAttention schedule: the budget spent on retrieval\n"
    "                      and streaming heads as docs/duo.md says (not with\n"
    "                      --session, which does not record it)\n"
    "  --streaming-budget N  with --heads: the least a streaming head keeps (16)\n"
    SAME_POSITIONS_USAGE
    "  --json              one JSON object per generated token instead of text:\n"
    "                      sample, seed (null when the sampler continues a session's\n"
    "                      generator), pos, token, piece (and logits with --logits)\n"
    "  other options as for `kvevict lm logits`.\n";

static const opt_def generate_own[] = {
    {"model", 0, OPT_VALUE},          {"prompt", 0, OPT_VALUE},
    {"steps", 0, OPT_VALUE},          {"tokenizer", 0, OPT_VALUE},
    {"positions", 0, OPT_VALUE},      {"temperature", 0, OPT_VALUE},
    {"top-k", 0, OPT_VALUE},          {"top-p", 0, OPT_VALUE},
    {"repeat-penalty", 0, OPT_VALUE}, {"repeat-last-n", 0, OPT_VALUE},
    {"samples", 0, OPT_VALUE},        {"session", 0, OPT_VALUE},
    {"allow-key-tokens", 0, 0},       {"logits", 0, 0},
    {"threads", 0, OPT_VALUE}, {"products", 0, OPT_VALUE},        {"prefill", 0, OPT_VALUE},
    {"heads", 0, OPT_VALUE},          {"streaming-budget", 0, OPT_VALUE},
    {"same-positions", 0, 0},         {"policy-seed", 0, OPT_VALUE},
    {"batch", 0, OPT_VALUE}};
static const cli_spec generate_spec =
    LM_SPEC(generate_usage, SO_POLICY | SO_BUDGET | SO_SEED | SO_FORMAT, generate_own, FMT_TEXT);

/* Writes a decoded piece; a lone raw byte that is a control character other
 * than white space is skipped, as run.c's safe_printf does. */
static void put_piece(FILE *f, const char *p, size_t n)
{
    if (n == 1) {
        unsigned char b = (unsigned char)p[0];
        if (b < 0x20 && b != '\n' && b != '\t' && b != '\r')
            return;
    }
    fwrite(p, 1, n, f);
}


/* What one sample's loop needs. */
typedef struct gen_ctx {
    lm_sampler_params sp;
    const unsigned char *banned; /* (V) or NULL */
    lm_candidate *scratch;       /* (V) */
    size_t steps;
    int json, logits;
    size_t sample;
    int seeded; /* 0: the sampler continues a session's generator (JSON seed null) */
} gen_ctx;

static size_t decoded; /* forward steps of this run, for the speed */

static void decode(lm_state *s, history *h, int32_t token)
{
    decoded++;
    kve_status st = lm_forward(s, token);
    if (st != KVE_OK)
        die_lm(st, "decode");
    push(h, token);
}

/* Samples up to g->steps tokens from s (whose logits follow h's last
 * token), decoding each, so s ends with the logits after the last; stops
 * after a token that ends a generation (lm_token_ends: the file's EOS and
 * ends of turn, and BOS). Text or JSON to stdout. Returns how many were
 * made. */
static size_t sample_loop(const gen_ctx *g, lm_state *s, history *h, kve_rng *rng, uint64_t seed)
{
    int32_t V = s->model->config.vocab_size;
    size_t made = 0;
    while (made < g->steps) {
        int32_t next = lm_sample(&g->sp, s->logits, V, g->banned, h->t, h->n, rng, g->scratch);
        if (next < 0)
            die_input("every token of the vocabulary is banned");
        made++;
        size_t len;
        const char *p = lm_decode(lm_ctx.tok, h->t[h->n - 1], next, &len);
        if (g->json) {
            if (g->seeded)
                printf("{\"sample\": %zu, \"seed\": %llu, ", g->sample, (unsigned long long)seed);
            else
                printf("{\"sample\": %zu, \"seed\": null, ", g->sample);
            printf("\"pos\": %d, \"token\": %d, \"piece\": ", s->pos, next);
            char *piece = xstrndup(p, len);
            json_string(stdout, piece);
            free(piece);
            if (g->logits) {
                fputs(", \"logits\": [", stdout);
                for (int32_t i = 0; i < V; i++) {
                    if (i)
                        fputs(", ", stdout);
                    json_float(stdout, s->logits[i]);
                }
                fputc(']', stdout);
            }
            fputs("}\n", stdout);
        } else if (!lm_token_ends(lm_ctx.tok, next)) {
            put_piece(stdout, p, len);
            fflush(stdout);
        }
        decode(s, h, next);
        if (lm_token_ends(lm_ctx.tok, next))
            break;
    }
    return made;
}

/* Reads and loads the session at `path` into s (at position 0); refusals
 * exit naming the file, before anything is written. 0 when there is no
 * such file. */
static int resume(const char *path, lm_state *s, history *h, kve_rng *rng)
{
    if (!session_hold(path)) /* locked for the run; none yet: a new session */
        return 0;
    /* the header first, then at most the size it states, itself at most
     * what this decoder could have saved: a huge file or an endless stream
     * is refused before it is read */
    unsigned char head[LM_SESSION_HEADER + KVE_SPEC_MAX]; /* with the spec: a refusal names it */
    size_t got = 0, stated = 0;
    kve_status st = lm_read_head(path, head, sizeof head, &got);
    if (st == KVE_OK)
        st = lm_session_size(s, head, got, &stated);
    if (st != KVE_OK) {
        char what[600];
        snprintf(what, sizeof what, "--session %s", path);
        die_lm(st, what);
    }
    char *data;
    size_t size;
    st = lm_read_file_max(NULL, path, stated, &data, &size);
    if (st != KVE_OK)
        die_input("--session: %s", kve_last_error());
    lm_session ss;
    st = lm_session_load(s, data, size, &ss);
    lm_free(NULL, data);
    if (st != KVE_OK) {
        char what[600];
        snprintf(what, sizeof what, "--session %s", path);
        die_lm(st, what);
    }
    for (size_t i = 0; i < ss.n_tokens; i++)
        push(h, ss.tokens[i]);
    lm_free(&s->alloc, ss.tokens);
    *rng = ss.rng;
    return 1;
}

static void save_session(const char *path, const lm_state *s, const history *h,
                         const kve_rng *rng)
{
    lm_session ss = {.tokens = h->t, .n_tokens = h->n, .rng = *rng};
    size_t size;
    kve_status st = lm_session_save(s, &ss, NULL, 0, &size);
    if (st != KVE_OK)
        die_lm(st, "--session");
    unsigned char *buf = xmalloc(size);
    if ((st = lm_session_save(s, &ss, buf, size, &size)) != KVE_OK)
        die_lm(st, "--session");
    session_check(path); /* another run saved meanwhile: refused, its file kept */
    FILE *f = out_open_private(path) /* the conversation: 0600 when new */;
    if (fwrite(buf, 1, size, f) != size)
        die_input("--session %s: %s", path, strerror(errno));
    out_close(f);
    free(buf);
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
    const char *v = own(&a, sp, "steps");
    size_t steps = v ? (size_t)parse_u64("--steps", v, 0, INT32_MAX / 2) : 256;
    lm_positions positions = opt_positions(own(&a, sp, "positions"));
    parse_threads(&a, sp);
    parse_batch(&a, sp);
    const char *spec = a.policy;
    if (a.n_budgets && !spec)
        die_usage("--budget needs --policy");
    if (spec)
        free(canon_spec("--policy", spec, a.budget));
    gen_ctx g = {.sp = lm_sampler_default_params(), .steps = steps,
                 .json = a.format == FMT_JSON, .logits = cli_own(&a, sp, "logits")->count > 0};
    if (a.format != FMT_TEXT && a.format != FMT_JSON)
        die_usage("--format: generate writes text or json");
    if (g.logits && !g.json)
        die_usage("--logits needs --json");
    if ((v = own(&a, sp, "temperature")))
        g.sp.temperature = parse_real("--temperature", v, 0, 1e6);
    if ((v = own(&a, sp, "top-k")))
        g.sp.top_k = (int32_t)parse_u64("--top-k", v, 0, INT32_MAX);
    if ((v = own(&a, sp, "top-p"))) {
        g.sp.top_p = parse_real("--top-p", v, 0, 1);
        if (g.sp.top_p <= 0)
            die_usage("--top-p: '%s' is not in (0, 1]", v);
    }
    if ((v = own(&a, sp, "repeat-penalty"))) {
        g.sp.repeat_penalty = parse_real("--repeat-penalty", v, 0, 1e6);
        if (g.sp.repeat_penalty <= 0)
            die_usage("--repeat-penalty: '%s' is not in (0, 1e6]", v);
    }
    if ((v = own(&a, sp, "repeat-last-n")))
        g.sp.repeat_last_n = (int32_t)parse_u64("--repeat-last-n", v, 0, INT32_MAX);
    v = own(&a, sp, "samples");
    size_t samples = v ? (size_t)parse_u64("--samples", v, 1, 1u << 20) : 1;
    const char *session = own(&a, sp, "session");
    if (session && samples > 1)
        die_usage("--session saves one sequence: it cannot be combined with --samples %zu",
                  samples);
    static const char *const pf_names[] = {"h2o", "snapkv", "kvzip", "policy"};
    const char *pf = own(&a, sp, "prefill"), *heads = own(&a, sp, "heads");
    int pf_k = -1;
    for (int k = 0; pf && k < 4; k++)
        pf_k = strcmp(pf, pf_names[k]) == 0 ? k : pf_k;
    if (pf && pf_k < 0)
        die_usage("--prefill: '%s' is not h2o, snapkv, kvzip or policy", pf);
    if ((pf || heads) && !spec)
        die_usage("--%s needs --policy", pf ? "prefill" : "heads");
    if (heads && session)
        die_usage("--heads: a --session does not record the schedule; use one or the other");
    const char *sb = own(&a, sp, "streaming-budget");
    if (sb && !heads)
        die_usage("--streaming-budget needs --heads");
    parse_same_positions(&a, sp);
    if (lm_ctx.same_positions && (!spec || heads))
        die_usage("--same-positions %s", heads ? "keeps one set of positions: not with --heads"
                                               : "needs --policy");
    lm_ctx.streaming_budget = sb ? (size_t)parse_u64("--streaming-budget", sb, 1, KVE_MAX_BUDGET)
                                 : 16;
    int seed_given = 0;
    for (int i = 0; i < argc; i++)
        seed_given |= strcmp(argv[i], "--seed") == 0 || strncmp(argv[i], "--seed=", 7) == 0;
    v = own(&a, sp, "policy-seed");
    const uint64_t policy_seed = v ? parse_u64("--policy-seed", v, 0, UINT64_MAX) : 0;

    load_model(model);
    resolve_budget(&a);
    load_tokenizer(own(&a, sp, "tokenizer"), model);
    if (heads)
        lm_ctx.heads = load_heads(heads, "--heads");
    int32_t V = lm_ctx.model->config.vocab_size;
    size_t n_prompt;
    int32_t *ids = encode(prompt, strlen(prompt), &n_prompt);
    unsigned char *banned = xcalloc((size_t)V, 1);
    if (!cli_own(&a, sp, "allow-key-tokens")->count)
        lm_reserved_tokens(lm_ctx.tok, banned);
    g.banned = banned;
    g.scratch = xmalloc((size_t)V * sizeof *g.scratch);

    /* The shared part: the session (when there is one), then the prompt. */
    lm_state *s = new_state(spec, a.budget, positions, policy_seed);
    history h = {0};
    kve_rng rng;
    kve_rng_seed(&rng, a.seed);
    int resumed = session && resume(session, s, &h, &rng);
    if (resumed && seed_given)
        kve_rng_seed(&rng, a.seed);
    g.seeded = !resumed || seed_given;
    if (resumed && pf)
        die_usage("--prefill compresses a new prompt: a resumed --session continues step by step");
    double start = now_s();
    char *text = NULL; /* the prompt's text as printed */
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    if (!mem)
        die_input("out of memory");
    const int32_t bos = lm_ctx.model->config.bos;
    const size_t first = bos >= 0; /* a model without BOS starts with the prompt */
    if (!resumed && !first && n_prompt == 0)
        die_usage("--prompt is empty and the model has no BOS: nothing to continue from");
    if (pf) { /* BOS and the prompt read at once, then cut to the budget */
        int32_t *all = xmalloc((n_prompt + 1) * sizeof *all);
        all[0] = bos;
        memcpy(all + first, ids, n_prompt * sizeof *ids);
        kve_prefill_options p = kve_prefill_default_options();
        p.method = pf_k == 1 ? KVE_PREFILL_SNAPKV : pf_k == 2 ? KVE_PREFILL_KVZIP : KVE_PREFILL_H2O;
        kve_status st;
        if (pf_k == 2) {
            lm_kvzip kz;
            st = lm_kvzip_default(lm_ctx.tok, &kz);
            if (st == KVE_OK)
                st = lm_prefill_kvzip(s, all, n_prompt + first, &kz, &p);
        } else {
            st = lm_prefill(s, all, n_prompt + first, pf_k == 3 ? NULL : &p);
        }
        free(all);
        if (st != KVE_OK)
            die_lm(st, "--prefill");
        decoded += n_prompt + first;
        if (first)
            push(&h, bos);
        for (size_t i = 0; i < n_prompt; i++) {
            size_t len;
            const char *piece = lm_decode(lm_ctx.tok, h.n ? h.t[h.n - 1] : -1, ids[i], &len);
            put_piece(mem, piece, len);
            push(&h, ids[i]);
        }
    } else { /* BOS (a new sequence, or a session of no token) and the prompt in blocks */
        int32_t *all = xmalloc((n_prompt + 1) * sizeof *all);
        size_t m = 0;
        if (h.n == 0 && first)
            push(&h, all[m++] = bos);
        for (size_t i = 0; i < n_prompt; i++) {
            size_t len;
            const char *p = lm_decode(lm_ctx.tok, h.n ? h.t[h.n - 1] : -1, ids[i], &len);
            put_piece(mem, p, len);
            push(&h, all[m++] = ids[i]);
        }
        kve_status st = lm_forward_batch(s, all, m, NULL, NULL);
        free(all);
        if (st != KVE_OK)
            die_lm(st, "decode");
        decoded += m;
    }
    fclose(mem);

    /* The samples: each a copy of the shared state (its cache and bank). */
    size_t prefix = h.n, made = 0;
    lm_state *w = samples > 1 ? new_state(spec, a.budget, positions, policy_seed) : s;
    for (size_t k = 0; k < samples; k++) {
        uint64_t seed = a.seed + k;
        g.sample = k;
        if (samples > 1) {
            kve_status st = lm_state_copy(w, s);
            if (st != KVE_OK)
                die_lm(st, "fork");
            kve_rng_seed(&rng, seed);
            h.n = prefix;
            if (!g.json)
                printf("--- sample %zu of %zu, seed %llu ---\n", k + 1, samples,
                       (unsigned long long)seed);
        }
        if (!g.json)
            fwrite(text, 1, text_len, stdout);
        made = sample_loop(&g, w, &h, &rng, seed);
        if (!g.json)
            fputc('\n', stdout);
    }
    finish_stdout();
    double secs = now_s() - start;
    if (session)
        save_session(session, w, &h, &rng);
    const lm_config *c = &lm_ctx.model->config;
    size_t kept_min = SIZE_MAX, kept_max = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int32_t gi = 0; gi < c->n_kv_heads; gi++) {
            size_t kn = lm_state_kept(w, l, gi);
            kept_min = kn < kept_min ? kn : kept_min;
            kept_max = kn > kept_max ? kn : kept_max;
        }
    fprintf(stderr,
            "kvevict generate: %d positions (%s%zu prompt tokens, %zu generated%s) in %.3f s: "
            "%.1f tokens/s; cache: %zu..%zu of %d positions kept per (layer, KV head); "
            "policy %s\n",
            w->pos, resumed ? "a resumed session, " : first ? "BOS, " : "", n_prompt, made,
            samples > 1 ? " by the last sample" : "", secs,
            secs > 0 ? (double)decoded / secs : 0.0,
            kept_min, kept_max, w->pos, w->spec ? w->spec : "none (every key kept)");
    if (w != s)
        lm_state_free(w);
    lm_state_free(s);
    free(ids);
    free(h.t);
    free(text);
    free(banned);
    free(g.scratch);
    return 0;
}
