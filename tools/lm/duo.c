/* SPDX-License-Identifier: MIT */
/*
 * duo.c - `kvevict lm duo-calibrate`: which (layer, KV head) of a checkpoint
 * retrieves, found without a training run, written as a DuoAttention
 * schedule (lm.h, "retrieval and streaming heads"; docs/duo.md).
 *
 * The calibration, fixed before it runs: a decoder of policy streaming
 * (4 sinks) in which every head keeps the whole context C but one, cut to a
 * streaming window of W positions, once for each (layer, KV head), and once
 * with none cut. Each runs the pass-key prompts of `lm passkey` built C
 * tokens long (trials at each distance, all beyond W) and the last
 * --windows whole windows of the text (BOS + C - 1 tokens). A head's score
 * is the pass-key accuracy lost when it alone is cut (accuracy with none
 * cut minus with it cut); its loss is the bits per byte added. Retrieval
 * heads: the K of highest score with --retrieval K (ties: the larger loss,
 * then the lower head), else every head whose score is at least
 * --threshold. Nothing here is tuned to the committed model: the model's
 * docs name its retrieval heads, the calibration is not told them.
 */
#define _POSIX_C_SOURCE 200809L
#include "lm_cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char duo_usage[] =
    "usage: kvevict lm duo-calibrate --model CKPT --text FILE --out FILE\n"
    "                                [--window W] [--context C] [--distances D,...]\n"
    "                                [--trials N] [--windows N] [--threshold F]\n"
    "                                [--retrieval K] [--tokenizer TOK] [--format F]\n"
    "                                [-o FILE] [--quiet]\n"
    "\n"
    "DuoAttention's retrieval and streaming heads, calibrated without training:\n"
    "each (layer, KV head) alone is cut to a streaming window (4 sinks and the\n"
    "most recent W - 4 positions) while every other head keeps the whole context;\n"
    "its score is the pass-key accuracy that costs, its loss the bits per byte\n"
    "added on the text's last windows (docs/duo.md).\n"
    "\n"
    "  --out FILE        the schedule (kvevict-heads 1), for --heads FILE\n"
    "  --window W        the cut head's window, sinks included (default 32)\n"
    "  --context C       prompt and window length (default: the model's seq_len)\n"
    "  --distances L     pass-key distances, each above W (default 128, 256, 384\n"
    "                    and the largest the context allows)\n"
    "  --trials N        pass-key prompts per distance (default 8)\n"
    "  --windows N       text windows for the loss, the text's last N (default 4;\n"
    "                    0: none)\n"
    "  --threshold F     retrieval heads: score (accuracy lost) at least F\n"
    "                    (default 0.5)\n"
    "  --retrieval K     retrieval heads: the K of highest score instead\n"
    "  --tokenizer TOK   tokenizer.bin (default: tokenizer.bin beside CKPT)\n"
    "  --format F        text (default), md, csv or json; -o FILE as elsewhere\n"
    "\n"
    "The first row is no head cut. JSON keys: layer, kv_head, role, score,\n"
    "passkey_accuracy, delta_bits_per_byte, prompts, windows, window, context.\n";

static const opt_def duo_own[] = {
    {"model", 0, OPT_VALUE},     {"text", 0, OPT_VALUE},      {"tokenizer", 0, OPT_VALUE},
    {"out", 0, OPT_VALUE},       {"window", 0, OPT_VALUE},    {"context", 0, OPT_VALUE},
    {"distances", 0, OPT_VALUE | OPT_REPEAT},
    {"trials", 0, OPT_VALUE},    {"windows", 0, OPT_VALUE},
    {"threshold", 0, OPT_VALUE}, {"retrieval", 0, OPT_VALUE}};
static const cli_spec duo_spec =
    LM_SPEC(duo_usage, SO_FORMAT | SO_OUTPUT | SO_QUIET, duo_own, FMT_TEXT);

/* One configuration's measures. */
typedef struct duo_row {
    double hits, nats;
} duo_row;

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

int lm_duo_calibrate(int argc, char **argv)
{
    const cli_spec *sp = &duo_spec;
    cli_args a;
    cli_parse(&a, sp, argc, argv);
    const char *model = need(&a, sp, "model"), *text = need(&a, sp, "text");
    const char *out_path = need(&a, sp, "out"), *v;
    size_t W = (v = own(&a, sp, "window")) ? (size_t)parse_u64("--window", v, 5, KVE_MAX_BUDGET)
                                           : 32;
    size_t trials = (v = own(&a, sp, "trials")) ? (size_t)parse_u64("--trials", v, 1, 1u << 20)
                                                : 8;
    size_t n_windows = (v = own(&a, sp, "windows")) ? (size_t)parse_u64("--windows", v, 0, 1u << 20)
                                                    : 4;
    double threshold = (v = own(&a, sp, "threshold")) ? parse_real("--threshold", v, 0.0, 1.0)
                                                      : 0.5;
    const char *ret = own(&a, sp, "retrieval"), *ctx = own(&a, sp, "context");
    if (ret && own(&a, sp, "threshold"))
        die_usage("--retrieval and --threshold are two rules: give one");
    load_model(model);
    load_tokenizer(own(&a, sp, "tokenizer"), model);
    load_text(text);
    encode_text(text);
    const lm_config *c = &lm_ctx.model->config;
    size_t N = (size_t)c->n_layers * (size_t)c->n_kv_heads;
    size_t C = ctx ? (size_t)parse_u64("--context", ctx, 2, (size_t)c->seq_len)
                   : (size_t)c->seq_len;
    size_t K = ret ? (size_t)parse_u64("--retrieval", ret, 0, N) : 0;
    if (W >= C)
        die_usage("--window %zu: the context is %zu positions", W, C);
    pk_template pk;
    pk_load(&pk);
    size_t na = pk.na, nb = pk.nb, nq = pk.nq;
    if (C < 2 + na + nb + nq || W + 1 > C - 2 - na)
        die_usage("--context %zu holds no pass key beyond a window of %zu", C, W);
    size_t lo = W + 1 > nb + nq ? W + 1 : nb + nq, hi = C - 2 - na, nd = 0;
    size_t *dist;
    if (own(&a, sp, "distances")) {
        dist = distances(cli_own(&a, sp, "distances"), lo, hi, 0, &nd);
    } else {
        dist = xmalloc(4 * sizeof *dist);
        for (size_t d = 128; d < hi && d <= 384; d += 128)
            if (d >= lo)
                dist[nd++] = d;
        dist[nd++] = hi;
    }
    if (lm_ctx.n_ids < C - 2 - na - nb - nq)
        die_input("--text %s: %zu tokens, the prompts need %zu", text, lm_ctx.n_ids,
                  C - 2 - na - nb - nq);
    size_t have = lm_ctx.n_ids / (C - 1);
    if (n_windows > have)
        die_usage("--windows %zu: the text holds %zu whole windows of %zu", n_windows, have, C);

    /* Configuration 0: nothing cut; configuration 1 + i: head i cut to W. */
    char spec[64];
    snprintf(spec, sizeof spec, "streaming:budget=%zu,sinks=4", C);
    size_t *hb = xmalloc(N * sizeof *hb);
    lm_state **st = xcalloc(N + 1, sizeof *st); // NOLINT(bugprone-sizeof-expression)
    for (size_t k = 0; k <= N; k++) {
        for (size_t i = 0; i < N; i++)
            hb[i] = k == i + 1 ? W : C;
        lm_options o = {.policy = spec, .head_budgets = hb, .products = lm_ctx.products,
                        .llama_cpu = lm_ctx.llama_cpu};
        kve_status s = lm_state_new(lm_ctx.model, &o, &st[k]);
        if (s != KVE_OK)
            die_lm(s, "--window");
    }
    free(hb);
    duo_row *rows = xcalloc(N + 1, sizeof *rows);
    int32_t *w = xmalloc(C * sizeof *w);
    const int32_t V = c->vocab_size;
    double bytes = 0;
    progress pr;
    progress_begin(&pr, "configuration", N + 1, 0, 1);
    for (size_t k = 0; k <= N; k++) {
        lm_state *s = st[k];
        kve_status e;
        for (size_t di = 0; di < nd; di++)
            for (size_t j = 0; j < trials; j++) {
                int32_t key = pk_prompt(&pk, C, j, trials, dist[di], w);
                e = lm_state_reset(s);
                if (e == KVE_OK)
                    e = lm_forward_batch(s, w, C, NULL, NULL);
                if (e != KVE_OK)
                    die_lm(e, "decode");
                rows[k].hits += argmax(s->logits, V) == key;
            }
        for (size_t wi = have - n_windows; wi < have; wi++) {
            double nats = 0;
            text_window(w, wi * (C - 1), C); /* no BOS: lm_window_nats reads w[0] as context */
            e = lm_ctx.model->config.bos < 0 ? lm_window_nats(s, w, C, &nats, NULL)
                                              : lm_window_nats(s, w + 1, C - 1, &nats, NULL);
            if (e != KVE_OK)
                die_lm(e, "decode");
            rows[k].nats += nats;
            if (k == 0) {
                size_t counted = 0;
                bytes += window_bytes(w, 1, C, &counted);
            }
        }
        progress_update(&pr, k + 1);
    }
    progress_end(&pr);

    double prompts = (double)(nd * trials), acc0 = rows[0].hits / prompts;
    double *score = xmalloc(N * sizeof *score), *loss = xmalloc(N * sizeof *loss);
    unsigned char *role = xcalloc(N, 1);
    for (size_t i = 0; i < N; i++) {
        score[i] = acc0 - rows[i + 1].hits / prompts;
        loss[i] = bytes > 0 ? (rows[i + 1].nats - rows[0].nats) / log(2.0) / bytes : 0.0;
        role[i] = !ret && score[i] >= threshold;
    }
    for (size_t r = 0; ret && r < K; r++) { /* the K best, ties to the larger loss, lower head */
        size_t best = N;
        for (size_t i = 0; i < N; i++)
            if (!role[i] && (best == N || score[i] > score[best] ||
                             (score[i] == score[best] && loss[i] > loss[best])))
                best = i;
        role[best] = 1;
    }

    FILE *f = out_open(out_path);
    fprintf(f, "# DuoAttention schedule of %s (kvevict lm duo-calibrate)\n"
               "# each head alone cut to a streaming window of %zu (4 sinks); score: the\n"
               "# pass-key accuracy lost over %.0f prompts of %zu tokens (%.3f with none cut);\n"
               "# loss: bits per byte added on the last %zu windows of %s\n"
               "kvevict-heads 1\nlayers %d kv_heads %d\n",
            model, W, prompts, C, acc0, n_windows, text, c->n_layers, c->n_kv_heads);
    for (size_t i = 0; i < N; i++)
        fprintf(f, "# loss %+.4f\nhead %zu %zu %s %.6g\n", loss[i], i / (size_t)c->n_kv_heads,
                i % (size_t)c->n_kv_heads, role[i] ? "retrieval" : "streaming", score[i]);
    out_close(f);

    static const col cols[] = {
        {"layer", "layer", COL_ALL},
        {"KV head", "kv_head", COL_ALL},
        {"role", "role", COL_ALL | COL_LEFT},
        {"score", "score", COL_ALL},
        {"pass key", "passkey_accuracy", COL_ALL},
        {"delta bits/byte", "delta_bits_per_byte", COL_ALL},
        {"prompts", "prompts", COL_CSV | COL_JSON},
        {"windows", "windows", COL_CSV | COL_JSON},
        {"window", "window", COL_CSV | COL_JSON},
        {"context", "context", COL_CSV | COL_JSON},
    };
    table t;
    table_init(&t, cols, sizeof cols / sizeof cols[0]);
    for (size_t k = 0; k <= N; k++) {
        if (k == 0) {
            table_str(&t, "none");
            table_str(&t, "none");
            table_str(&t, "-");
            table_real(&t, NAN, "%.3f");
        } else {
            table_uint(&t, (k - 1) / (size_t)c->n_kv_heads);
            table_uint(&t, (k - 1) % (size_t)c->n_kv_heads);
            table_str(&t, role[k - 1] ? "retrieval" : "streaming");
            table_real(&t, score[k - 1], "%.3f");
        }
        table_real(&t, rows[k].hits / prompts, "%.3f");
        table_real(&t, k ? loss[k - 1] : 0.0, "%+.4f");
        table_uint(&t, (uint64_t)prompts);
        table_uint(&t, n_windows);
        table_uint(&t, W);
        table_uint(&t, C);
    }
    FILE *out = out_open(a.output);
    table_print(&t, out, a.format);
    table_free(&t);
    out_close(out);
    for (size_t k = 0; k <= N; k++)
        lm_state_free(st[k]);
    free(st), free(rows), free(w), free(dist), free(score), free(loss), free(role);
    pk_free(&pk);
    return 0;
}
