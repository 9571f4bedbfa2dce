/* SPDX-License-Identifier: MIT */
/*
 * dump.c - `kvevict lm dump`: the model's full-cache attention as an
 * [L, H, T, T] .npy trace, or (--qk) its queries and keys as a q/K trace,
 * written from the decoder's hooks as it decodes; write_attention is also
 * the lm: trace source's writer (lm_trace.c).
 */
#include "lm_cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
    "  --threads N  matrix products on N threads (default: the cores; the same\n"
    "          bits for every N)\n"
    "  --products P  exact (default) or llama[:VARIANT]: as for `kvevict lm eval`\n"
    "  --quiet no progress line on stderr (drawn on a terminal after 2 s)\n"
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
                                   {"threads", 0, OPT_VALUE},
                                   {"products", 0, OPT_VALUE}};
static const cli_spec dump_spec = LM_SPEC(dump_usage, SO_OUTPUT | SO_QUIET, dump_own, FMT_TEXT);

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
    o.threads = lm_ctx.threads;
    o.products = lm_ctx.products;
    o.llama_cpu = lm_ctx.llama_cpu;
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

int write_attention(FILE *f, const lm_model *m, const int32_t *toks, size_t T, size_t group)
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

int lm_dump(int argc, char **argv)
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
    if (lm_ctx.n_ids + 1 < T && !loop)
        die_usage("--steps %zu: the text gives BOS and %zu tokens (--loop repeats them)", T,
                  lm_ctx.n_ids);
    const lm_config *c = &lm_ctx.model->config;
    size_t group =
        cli_own(&a, &dump_spec, "query-heads")->count ? 1 : (size_t)(c->n_heads / c->n_kv_heads);
    int32_t *toks = xmalloc(T * sizeof *toks);
    for (size_t t = 0; t < T; t++) /* BOS, then the text (looped with --loop) */
        toks[t] = t ? lm_ctx.ids[(t - 1) % lm_ctx.n_ids] : first_token(0);
    FILE *f = out_open(a.output);
    int bad = qk ? write_qk(f, lm_ctx.model, toks, T)
                 : write_attention(f, lm_ctx.model, toks, T, group);
    if (bad != 0)
        die_input("%s: cannot write: %s", a.output, strerror(errno));
    out_close(f);
    free(toks);
    return 0;
}
