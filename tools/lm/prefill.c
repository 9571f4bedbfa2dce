/* SPDX-License-Identifier: MIT */
/*
 * prefill.c - `kvevict lm prefill`: a long prompt compressed to the budget
 * at prefill (kve_bank_prefill, KVzip's reconstruction, or the policy's own
 * scores once) against per-step eviction while it is read, measured after
 * the compression.
 */
#define _POSIX_C_SOURCE 200809L
#include "lm_cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    "                          [--kernel K] [--pool max|avg] [--kvzip-chunk C]\n"
    "                          [--kvzip-budgets head|layer|overall] [--kvzip-plus]\n"
    "                          [--kvzip-sinks kvevict|kvpress]\n"
    "                          [--prompt P] [--windows N]\n"
    "                          [--distances D,...] [--trials N] [--tokenizer TOK]\n"
    "                          [--positions P] [--seed N] [--format F] [-o FILE]\n"
    "                          [--docs FILE [--docs-block NAME]]\n"
    "\n"
    "A long prompt compressed to the budget at prefill, against per-step eviction\n"
    "while the prompt is read: bits per byte of the text that follows a prompt,\n"
    "and pass-key accuracy with the question at the prompt's end. Both are read\n"
    "from decode steps after the compression (docs/prefill.md).\n"
    "\n"
    "  --methods LIST  of: step (per-step eviction during the prompt), h2o (H2O's\n"
    "                  prompt scores: column sums of the prompt's attention),\n"
    "                  snapkv (the last W prompt queries, pooled), kvzip (KVzip:\n"
    "                  the largest attention from a teacher-forced reconstruction\n"
    "                  of the prompt), policy (the policy's own scores once: the\n"
    "                  prompt stepped without evicting, then one eviction).\n"
    "                  Default: step,h2o,snapkv,kvzip for the policies scored from\n"
    "                  attention, step,policy for those that read keys, step for\n"
    "                  the others\n"
    "  --window W      SnapKV's observation window (default 32)\n"
    "  --kernel K      SnapKV's pooling kernel, odd (default 5)\n"
    "  --pool P        SnapKV's pooling: max (default) or avg\n"
    "  --kvzip-chunk C KVzip's reconstruction chunk, prompt positions (default 2048)\n"
    "  --kvzip-budgets M  how KVzip cuts across heads: head (each head to the\n"
    "                  budget, the default), layer (each layer's heads together:\n"
    "                  kvpress's layerwise=True), overall (one threshold over every\n"
    "                  head and layer: kvpress's default); layer and overall need\n"
    "                  --share-heads, so that decoding keeps each layer's total\n"
    "  --kvzip-plus    KVzip+ scores (kvpress's kvzip_plus_normalization)\n"
    "  --kvzip-sinks S kvevict (the first 4 always kept, the default) or kvpress\n"
    "                  (those below the BOS prefix only, as KVzipPress keeps them)\n"
    "  --prompt P      prompt positions of a bits-per-byte window (default half\n"
    "                  the context)\n"
    "  --windows N     bits-per-byte windows, the text's first N (default 16)\n"
    "  --distances L   pass-key distances (default 64, 128, ... and the top)\n"
    "  --trials N      pass-key prompts per distance (default 16)\n"
    "  --docs FILE     also rewrite the block between <!-- lm-prefill:begin -->\n"
    "                  and <!-- lm-prefill:end --> of FILE with the markdown table\n"
    "  --docs-block N  the block's name instead of lm-prefill\n"
    "  other options as for `kvevict lm eval`. A list is comma-separated, and its\n"
    "  option may be repeated: --methods h2o --methods snapkv is --methods\n"
    "  h2o,snapkv.\n"
    "\n"
    "The first row is the full cache. JSON keys: policy, budget, positions,\n"
    "prefill, windows, tokens, bytes, bits_per_byte, delta_bits_per_byte,\n"
    "prompts, passkey_accuracy, passkey_accuracy_se, seed.\n";

static const opt_def prefill_own[] = {
    MEASURE_OPTS,           {"methods", 0, OPT_VALUE | OPT_REPEAT}, {"window", 0, OPT_VALUE},
    {"kernel", 0, OPT_VALUE}, {"pool", 0, OPT_VALUE},  {"prompt", 0, OPT_VALUE},
    {"kvzip-chunk", 0, OPT_VALUE}, {"kvzip-budgets", 0, OPT_VALUE}, {"kvzip-plus", 0, 0},
    {"kvzip-sinks", 0, OPT_VALUE},
    {"windows", 0, OPT_VALUE}, {"distances", 0, OPT_VALUE | OPT_REPEAT}, {"trials", 0, OPT_VALUE},
    {"docs", 0, OPT_VALUE}, {"docs-block", 0, OPT_VALUE}};
static const cli_spec prefill_spec =
    LM_SPEC(prefill_usage, SO_SEED | SO_FORMAT | SO_OUTPUT | SO_QUIET, prefill_own, FMT_TEXT);

enum { PF_STEP, PF_H2O, PF_SNAPKV, PF_KVZIP, PF_POLICY, PF_METHODS };
static const char *const pf_names[PF_METHODS] = {"step", "h2o", "snapkv", "kvzip", "policy"};

/* KVzip's prompts (lm_kvzip_default, --kvzip-chunk). */
static lm_kvzip kvzip;

/* The library's method of a row's method. */
static kve_prefill_method method_of(int m)
{
    return m == PF_H2O ? KVE_PREFILL_H2O : m == PF_KVZIP ? KVE_PREFILL_KVZIP : KVE_PREFILL_SNAPKV;
}

/* A row's prefill options: the command's, with its method, KVzip's fields
 * (budgets, prefix) only for KVzip. */
static kve_prefill_options options_of(const kve_prefill_options *pp, int m)
{
    kve_prefill_options q = *pp;
    q.method = method_of(m);
    if (m != PF_KVZIP) {
        q.budgets = KVE_PREFILL_PER_HEAD;
        q.prefix = KVE_PREFILL_NO_PREFIX;
    }
    return q;
}

/* Decodes tokens[0 .. n) from a fresh cache: the first p as the prompt,
 * compressed by `method`, the rest one step at a time; per_pos[i] (i in
 * [p, n - 1)) gets the loss of tokens[i + 1]. Returns the argmax after the
 * last token. */
static int32_t run_with_prompt(lm_state *s, const int32_t *tokens, size_t n, size_t p, int method,
                               const kve_prefill_options *pp, double *per_pos, const char *what)
{
    kve_status st = lm_state_reset(s);
    int32_t V = lm_ctx.model->config.vocab_size;
    size_t i = 0;
    if (st == KVE_OK && method != PF_STEP && s->bank) {
        st = method == PF_KVZIP ? lm_prefill_kvzip(s, tokens, p, &kvzip, pp)
                                : lm_prefill(s, tokens, p, method == PF_POLICY ? NULL : pp);
        i = p;
    }
    next_loss nl = {tokens, per_pos, i, p, n, V};
    if (st == KVE_OK) /* the rest in blocks (lm_forward_batch) */
        st = lm_forward_batch(s, tokens + i, n - i, next_loss_add, &nl);
    if (st != KVE_OK)
        die_lm(st, what);
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++)
        if (s->logits[v] > s->logits[best])
            best = v;
    return best;
}

int lm_prefill_cmd(int argc, char **argv)
{
    const cli_spec *sp = &prefill_spec;
    measure_args ma;
    measure_parse(&ma, sp, argc, argv);
    if (!ma.n_specs)
        die_usage("missing required option '--policy' (see kvevict lm prefill --help)");
    kve_prefill_options pp = kve_prefill_default_options();
    pp.method = KVE_PREFILL_SNAPKV;
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
    if (own(&ma.a, sp, "methods")) { /* A,B or --methods A --methods B */
        size_t m;
        char **items = split_lists("--methods", cli_own(&ma.a, sp, "methods"), &m);
        for (size_t i = 0; i < m; i++) {
            int k = 0;
            while (k < PF_METHODS && strcmp(items[i], pf_names[k]) != 0)
                k++;
            if (k == PF_METHODS) {
                char bad[128];
                snprintf(bad, sizeof bad, "%s", items[i]);
                free_list(items, m);
                die_usage("--methods: '%s' is not step, h2o, snapkv, kvzip or policy", bad);
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
    size_t kvzip_chunk = (v = own(&ma.a, sp, "kvzip-chunk"))
                             ? (size_t)parse_u64("--kvzip-chunk", v, 1, KVE_MAX_BUDGET)
                             : 0;
    static const char *const kz_budgets[] = {"head", "layer", "overall"};
    if ((v = own(&ma.a, sp, "kvzip-budgets"))) {
        int k = 0;
        while (k < 3 && strcmp(v, kz_budgets[k]) != 0)
            k++;
        if (k == 3)
            die_usage("--kvzip-budgets: '%s' is not head, layer or overall", v);
        pp.budgets = k == 0 ? KVE_PREFILL_PER_HEAD : k == 1 ? KVE_PREFILL_PER_LAYER
                                                            : KVE_PREFILL_OVERALL;
        if (k && !lm_ctx.budgets.share_heads)
            die_usage("--kvzip-budgets %s needs --share-heads: the decode after the prefill "
                      "keeps each layer's total, not each head's", v);
    }
    if ((v = own(&ma.a, sp, "kvzip-sinks"))) {
        if (strcmp(v, "kvevict") != 0 && strcmp(v, "kvpress") != 0)
            die_usage("--kvzip-sinks: '%s' is neither 'kvevict' nor 'kvpress'", v);
        pp.prefix = strcmp(v, "kvpress") == 0 ? 1 : KVE_PREFILL_NO_PREFIX; /* the BOS */
    }
    const int kvzip_plus = cli_own(&ma.a, sp, "kvzip-plus")->count > 0;
    const char *docs = own(&ma.a, sp, "docs"), *docs_block = own(&ma.a, sp, "docs-block");
    if (docs_block && !docs)
        die_usage("--docs-block needs --docs");
    measure_load(&ma, sp);
    kve_status kst = lm_kvzip_default(lm_ctx.tok, &kvzip);
    if (kst != KVE_OK)
        die_input("--tokenizer: %s", kve_last_error());
    kvzip.plus = kvzip_plus;
    if (kvzip_chunk) {
        kvzip.chunk = kvzip_chunk;
        kvzip.overlap = kvzip.overlap < kvzip_chunk ? kvzip.overlap : kvzip_chunk;
    }
    const size_t L = (size_t)lm_ctx.model->config.seq_len;
    size_t P = prompt_opt ? (size_t)parse_u64("--prompt", prompt_opt, 1, L > 2 ? L - 2 : 1) : L / 2;
    if (L < 4 || P + 2 > L)
        die_usage("--prompt %zu: a window of %zu positions holds no text after it", P, L);

    /* The (policy, budget, method) rows; row 0 the full cache. */
    size_t n_jobs;
    job *jobs = jobs_new(&ma, &n_jobs);
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
                                                      (k == PF_H2O || k == PF_SNAPKV || k == PF_KVZIP)) ||
                                         ((reads & KVE_READS_KEYS) && k == PF_POLICY);
            if (!on)
                continue;
            if (k == PF_H2O || k == PF_SNAPKV || k == PF_KVZIP) { /* refused: usage errors */
                kve_prefill_options q = options_of(&pp, k);
                if (kve_bank_prefill(jobs[j].s->bank, 0, 0, L, jobs[j].budget, NULL, L, 1,
                                     k == PF_KVZIP ? KVE_REDUCE_MAX : KVE_REDUCE_MEAN,
                                     &q) != KVE_OK)
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
    if (L < 2 + na + nb + nq || lm_ctx.n_ids < L - 2 - na - nb - nq || lm_ctx.n_ids < L - 1)
        die_input("--text %s: too short for this model's windows and prompts", ma.text);
    size_t nd;
    size_t *dist = distances(cli_own(&ma.a, sp, "distances"), nb + nq, L - 2 - na, 0, &nd);
    size_t W = lm_ctx.n_ids / (L - 1); /* whole windows only */
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
        text_window(w, wi * (L - 1), L);
        bytes += window_bytes(w, P + 1, L, &tokens);
        for (size_t r = 0; r < n_rows; r++) {
            const job *jb = &jobs[rows[r].job];
            kve_prefill_options q = options_of(&pp, rows[r].method);
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
                kve_prefill_options q = options_of(&pp, rows[r].method);
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
             "pooling; KVzip%s chunks of %zu, %zu sinks%s%s\n\n",
             n_windows, L, P, tokens, bytes, dlist, trials, positions_name(ma.positions),
             pp.window, pp.kernel, pp.pool == KVE_POOL_MAX ? "max" : "average",
             kvzip.plus ? "+" : "", kvzip.chunk, pp.sinks,
             pp.prefix == KVE_PREFILL_NO_PREFIX ? "" : " (kvpress's: below the prefix)",
             pp.budgets == KVE_PREFILL_PER_HEAD    ? ""
             : pp.budgets == KVE_PREFILL_PER_LAYER ? ", budgets per layer"
                                                   : ", one threshold over every head");
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
        rewrite_block(docs, docs_block ? docs_block : "lm-prefill", block);
        free(block);
    }
    table_free(&t);
    out_close(out);
    free(w), free(loss), free(nats), free(hits), free(dist), free(rows);
    pk_free(&pk);
    jobs_free(jobs, n_jobs);
    measure_free(&ma);
    return 0;
}
