/* SPDX-License-Identifier: MIT */
/*
 * loss.c - the model's loss on a text under every policy and budget beside
 * the full cache: `kvevict lm eval` (bits per byte over the context's
 * windows, paired per window with standard errors) and `kvevict lm stream`
 * (the loss against position over one decode far past the context).
 */
#include "lm_cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    "of seq_len - 1 tokens (the last shorter); each window is BOS (or the token\n"
    "before) + chunk, decoded from a fresh cache, its loss summed over the chunk.\n"
    "bits/byte = nats / ln 2 / (UTF-8 bytes of the text, + 1 for a dummy prefix);\n"
    "bits/token = nats / ln 2 / tokens. Standard errors: windows as samples\n"
    "(docs/decoder.md):\n"
    "se of bits/byte, and of its difference to the full cache, paired per window.\n"
    "\n"
    "  --model CKPT        a llama2.c (legacy, version 1 or 2) or GGUF checkpoint\n"
    "  --text FILE         the text (\"-\": standard input)\n"
    "  --tokenizer TOK     tokenizer.bin (default: a GGUF's own vocabulary, else\n"
    "                      tokenizer.bin beside CKPT)\n"
    "  --policy SPECS      policies, comma-separated (a key=value item belongs to\n"
    "                      the spec before it); may be repeated (default: none)\n"
    "  --budget LIST       budgets: counts (64) or percentages of the context (20%);\n"
    "                      every policy runs at every budget (default: the spec's)\n"
    "  --positions P       original (default) or cache\n"
    "  --seed N            seed of the policies' random numbers (default 0)\n"
    "  --threads N         matrix products on N threads (default: the cores)\n"
    PRODUCTS_USAGE
    BATCH_USAGE
    SAME_POSITIONS_USAGE
    "  --quiet             no progress line on stderr (drawn on a terminal after 2 s)\n"
    "  --format F          text (default), md, csv or json; --json, --csv, --md\n"
    "  -o, --output F      write to F instead of standard output\n"
    "\n"
    "Budgets across heads and layers (docs/budgets.md): the budget is the mean per\n"
    "KV head; rows add the keys schedule, share and layer_budgets.\n"
    BUDGET_USAGE
    "                      (SRC: a text, its first seq_len - 1 tokens after BOS)\n"
    "\n"
    "Retrieval and streaming heads (docs/duo.md; rows add head_budgets):\n"
    HEADS_USAGE
    "\n"
    "The first row is the full cache (policy full, budget null in JSON). JSON keys:\n"
    "policy, budget, positions, windows, tokens, bytes, bits_per_byte,\n"
    "bits_per_byte_se, bits_per_token, full_bits_per_byte, delta_bits_per_byte,\n"
    "delta_bits_per_byte_se, seed (and same_positions, 1, with --same-positions).\n";

static const opt_def eval_own[] = {MEASURE_OPTS};
static const cli_spec eval_spec =
    LM_SPEC(eval_usage, SO_SEED | SO_FORMAT | SO_OUTPUT | SO_QUIET, eval_own, FMT_TEXT);

double ratio_se(const double *x, const double *b, size_t w, double den)
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

int lm_eval(int argc, char **argv)
{
    measure_args m;
    measure_parse(&m, &eval_spec, argc, argv);
    measure_load(&m, &eval_spec);
    size_t chunk = (size_t)lm_ctx.model->config.seq_len - 1;
    if (chunk == 0)
        die_input("--model: seq_len 1 leaves no room after BOS");
    m.span = chunk; /* a window decodes BOS and chunk - 1 tokens */
    size_t n_jobs;
    job *jobs = jobs_new(&m, &n_jobs);
    FILE *out = out_open(m.a.output);

    size_t W = (lm_ctx.n_ids + chunk - 1) / chunk;
    double *bits = xcalloc(n_jobs * W, sizeof *bits); /* (jobs, W) */
    double *bytes = xcalloc(W, sizeof *bytes);        /* (W) */
    progress pr;
    progress_begin(&pr, "token", (uint64_t)lm_ctx.n_ids * n_jobs, 0, 1);
    uint64_t done = 0;
    int32_t *win = xmalloc((chunk + 1) * sizeof *win); /* no BOS: the token before, the chunk */
    for (size_t w = 0; w < W; w++) {
        const int32_t *toks = lm_ctx.ids + w * chunk;
        size_t n = w + 1 < W ? chunk : lm_ctx.n_ids - w * chunk;
        for (size_t i = 0; i < n; i++) {
            size_t len;
            lm_decode(lm_ctx.tok, 0, toks[i], &len);
            bytes[w] += (double)len;
        }
        int ctx = lm_ctx.model->config.bos < 0;
        if (ctx) {
            win[0] = first_token(w * chunk);
            memcpy(win + 1, toks, n * sizeof *win);
        }
        for (size_t j = 0; j < n_jobs; j++) {
            double nats;
            kve_status st = ctx ? lm_window_nats(jobs[j].s, win, n + 1, &nats, NULL)
                                : lm_window_nats(jobs[j].s, toks, n, &nats, NULL);
            if (st != KVE_OK)
                die_lm(st, jobs[j].spec ? jobs[j].spec : "full cache");
            bits[j * W + w] = nats / log(2.0);
            progress_update(&pr, done += n);
        }
    }
    progress_end(&pr);
    free(win);
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
    size_t text_bytes = lm_ctx.text_len + (size_t)lm_ctx.tok->add_space_prefix;
    double total_bytes = (double)text_bytes, full = 0;
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
        table_uint(&t, lm_ctx.n_ids);
        table_uint(&t, text_bytes);
        table_real(&t, sum / total_bytes, "%.4f");
        table_real(&t, ratio_se(x, bytes, W, total_bytes), "%.4f");
        table_real(&t, sum / (double)lm_ctx.n_ids, "%.4f");
        table_real(&t, full / total_bytes, "%.4f");
        table_real(&t, dsum / total_bytes, "%+.4f");
        table_real(&t, j ? ratio_se(diff, bytes, W, total_bytes) : NAN, "%.4f");
        table_uint(&t, m.a.seed);
    }
    if (m.a.format == FMT_TEXT)
        fprintf(out, "%s: %zu tokens, %zu bytes, %zu windows of up to %zu tokens, positions %s\n\n",
                m.text, lm_ctx.n_ids, text_bytes, W, chunk, positions_name(m.positions));
    table_print(&t, out, m.a.format);
    table_free(&t);
    out_close(out);
    free(diff);
    free(bits);
    free(bytes);
    jobs_free(jobs, n_jobs);
    measure_free(&m);
    return 0;
}

/* ---- lm stream ------------------------------------------------------------------
 *
 * One decode far past the context: position 0 is BOS (first_token(0)
 * without one), position p >= 1 holds
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

/* lm stream's sums: position at + i predicts the text's token at + i, its
 * loss added to its bin of W positions, in position order. */
enum { STREAM_CHUNK = 512 };
typedef struct stream_sum {
    double *bins;
    size_t W, at;
    int32_t V;
    progress *pr;
    uint64_t *done;
} stream_sum;

static void stream_add(void *user, size_t i, const float *logits)
{
    stream_sum *x = user;
    const size_t p = x->at + i;
    x->bins[(p + 1) / x->W] += lm_token_nats(logits, x->V, lm_ctx.ids[p % lm_ctx.n_ids]);
    progress_update(x->pr, ++*x->done);
}

static const opt_def stream_own[] = {MEASURE_OPTS,
                                     {"tokens", 0, OPT_VALUE},
                                     {"bin", 0, OPT_VALUE},
                                     {"full-tokens", 0, OPT_VALUE}};
static const cli_spec stream_spec =
    LM_SPEC(stream_usage, SO_SEED | SO_FORMAT | SO_OUTPUT | SO_QUIET, stream_own, FMT_TEXT);

enum { STREAM_MAX_TOKENS = 1 << 30 };

int lm_stream(int argc, char **argv)
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
        W = (size_t)lm_ctx.model->config.seq_len;
    m.span = N - 1; /* a policy decodes positions 0 .. N-2 */
    m.span_name = "the stream";
    size_t n_jobs;
    job *jobs = jobs_new(&m, &n_jobs);
    FILE *out = out_open(m.a.output);

    size_t n_bins = (N + W - 1) / W;
    double *nats = xcalloc(n_jobs * n_bins, sizeof *nats); /* (jobs, bins) */
    int32_t V = lm_ctx.model->config.vocab_size;
    uint64_t total = (M ? M - 1 : 0) + (uint64_t)(n_jobs - 1) * (N - 1), done = 0;
    progress pr;
    progress_begin(&pr, "position", total, 0, 1);
    int32_t chunk[STREAM_CHUNK];
    for (size_t j = 0; j < n_jobs; j++) {
        size_t n = j ? N : M; /* positions this job decodes, the last one only predicted */
        stream_sum ss = {nats + j * n_bins, W, 0, V, &pr, &done};
        for (size_t p = 0; p + 1 < n; p += STREAM_CHUNK) { /* in blocks (lm_forward_batch) */
            size_t k = n - 1 - p; /* at least 1 */
            if (k > STREAM_CHUNK)
                k = STREAM_CHUNK;
            for (size_t i = 0; i < k; i++)
                chunk[i] = (p + i > 0) ? lm_ctx.ids[(p + i - 1) % lm_ctx.n_ids] : first_token(0);
            ss.at = p;
            kve_status st = lm_forward_batch(jobs[j].s, chunk, k, stream_add, &ss);
            if (st != KVE_OK)
                die_lm(st, jobs[j].spec ? jobs[j].spec : "full cache");
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
                lm_decode(lm_ctx.tok, 0, lm_ctx.ids[(p - 1) % lm_ctx.n_ids], &len);
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
                N, m.text, lm_ctx.n_ids, (double)(N - 1) / (double)lm_ctx.n_ids, W, M,
                positions_name(m.positions));
    table_print(&t, out, m.a.format);
    table_free(&t);
    out_close(out);
    free(nats);
    jobs_free(jobs, n_jobs);
    measure_free(&m);
    return 0;
}
