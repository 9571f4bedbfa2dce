/* SPDX-License-Identifier: MIT */
/*
 * convert.c - kvevict-convert: writes a llama model as GGUF (every type the
 * decoder reads) or as a llama2.c export (legacy, version 1, version 2),
 * from any checkpoint the decoder reads or from random weights.
 *
 *   kvevict-convert (--model CKPT | --random SHAPE) [--tokenizer TOK]
 *                   --to gguf|llama2c|llama2c-v1|llama2c-v2 [--type T]
 *                   [--embedding-type T] [--norm-type T] [--group N] -o OUT
 *
 * Invariants: the input is read with lm/ (float32 values of every tensor,
 * dequantized when the input is quantized); the output is written by
 * gguf_write.c, whose encoders are independent of lm/. Random weights are
 * a function of (seed, tensor, layer) only: splitmix64, uniform, scaled as
 * tests/lm_fixture.h scales them, so activations stay of order 1. The
 * output goes to a temporary name renamed into place on success.
 */
#define _POSIX_C_SOURCE 200809L
#include "gguf_write.h"
#include "lm.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: kvevict-convert (--model CKPT | --random SHAPE) [--tokenizer TOK]\n"
    "                       --to FORMAT [--type T] [--embedding-type T] [--norm-type T]\n"
    "                       [--group N] [--name NAME] [--rope-scaling SPEC] -o OUT\n"
    "\n"
    "Writes a llama model as GGUF (version 3) or as a llama2.c export.\n"
    "\n"
    "  --model CKPT        any checkpoint the decoder reads (llama2.c legacy,\n"
    "                      version 1 or 2, GGUF); quantized values are dequantized\n"
    "  --random SHAPE      random weights instead: dim=D,hidden=F,layers=L,heads=H,\n"
    "                      kv_heads=G,vocab=V,seq_len=T[,seed=S][,tied=0|1]\n"
    "  --tokenizer TOK     the GGUF's vocabulary: a tokenizer.bin, or a GGUF whose\n"
    "                      tokenizer.* keys are copied as they are (its vocabulary\n"
    "                      must match). Default: the input GGUF's own (copied), or\n"
    "                      tokenizer.bin beside a llama2.c input; --random writes a\n"
    "                      placeholder (<unk>, <s>, </s>, the 256 byte pieces <0xHH>,\n"
    "                      then t<i>). A vocabulary that cannot be read is refused\n"
    "  --to FORMAT         gguf, llama2c (legacy), llama2c-v1, llama2c-v2\n"
    "  --type T            GGUF: the matrices' type: f32 (default), f16, bf16, q8_0,\n"
    "                      q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k,\n"
    "                      q6_k, iq4_xs (general.file_type: llama.cpp's for the type,\n"
    "                      q3_k, q4_k, q5_k as its Q3_K_M, Q4_K_M, Q5_K_M). A tensor\n"
    "                      whose rows are not whole blocks of its type falls back,\n"
    "                      as llama.cpp's quantizer does: q2_k and q3_k to q4_0,\n"
    "                      q4_k to q5_0, q5_k to q5_1, q6_k to q8_0, iq4_xs to\n"
    "                      iq4_nl (blocks of 32), then f16; the tool says so\n"
    "  --embedding-type T  GGUF: the embedding's and classifier's type (default: --type,\n"
    "                      with the same fallback)\n"
    "  --norm-type T       GGUF: the norms' type: f32 (default), f16, bf16\n"
    "  --group N           llama2c-v2: values per int8 scale (default 64, halved until\n"
    "                      it divides dim and hidden, as llama2.c's export.py does)\n"
    "  --name NAME         GGUF: general.name (default: the input GGUF's)\n"
    "  --rope-scaling SPEC GGUF: the rotary embedding's scaling, as llama.cpp reads it:\n"
    "                      none, linear:F, yarn:F[,orig=N][,attn=A] (llama.rope.scaling.*;\n"
    "                      orig the original context, default the model's), or\n"
    "                      llama3:F[,low=1][,high=4][,orig=8192] (a rope_freqs.weight\n"
    "                      of Llama 3's factors, as llama.cpp's converter writes it).\n"
    "                      Default: the input GGUF's own\n"
    "  -o OUT              the output file\n";

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvevict-convert: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static const struct {
    const char *name;
    uint32_t type;
} types[] = {{"f32", GW_F32},       {"f16", GW_F16},   {"bf16", GW_BF16}, {"q8_0", GW_Q8_0},
             {"q4_0", GW_Q4_0},     {"q4_1", GW_Q4_1}, {"q5_0", GW_Q5_0}, {"q5_1", GW_Q5_1},
             {"iq4_nl", GW_IQ4_NL}, {"q2_k", GW_Q2_K}, {"q3_k", GW_Q3_K}, {"q4_k", GW_Q4_K},
             {"q5_k", GW_Q5_K},     {"q6_k", GW_Q6_K}, {"iq4_xs", GW_IQ4_XS}};

static uint32_t type_of(const char *opt, const char *s)
{
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(s, types[i].name) == 0)
            return types[i].type;
    die("%s: '%s' is not f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, "
        "q4_k, q5_k, q6_k or iq4_xs", opt, s);
}

/* ---- sources ---- */

typedef struct random_src {
    uint64_t seed;
    const gw_spec *spec;
} random_src;

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static int random_tensor(void *user, gw_kind kind, int layer, float *out)
{
    const random_src *r = user;
    size_t rows, cols;
    gw_shape(r->spec, kind, &rows, &cols);
    double center = kind == GW_RMS_ATT || kind == GW_RMS_FFN || kind == GW_RMS_FINAL ? 1.0 : 0.0;
    double a = kind == GW_EMB || kind == GW_CLS ? 1.0
               : center > 0                     ? 0.2
               : kind == GW_WQ || kind == GW_WK ? 1.5 / sqrt((double)cols)
                                                : 1.0 / sqrt((double)cols);
    uint64_t s = mix(r->seed ^ mix((uint64_t)kind << 32 | (uint32_t)layer));
    for (size_t i = 0; i < rows * cols; i++) {
        s = mix(s);
        out[i] = (float)(center + ((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0) * a);
    }
    return 0;
}

static int model_tensor(void *user, gw_kind kind, int layer, float *out)
{
    const lm_model *m = user;
    const lm_weights *w = &m->weights;
    const lm_layer *ly = &w->layer[layer];
    size_t D = (size_t)m->config.dim;
    const float *norm = kind == GW_RMS_ATT ? ly->rms_att
                        : kind == GW_RMS_FFN ? ly->rms_ffn
                        : kind == GW_RMS_FINAL ? w->rms_final
                                                : NULL;
    if (norm) {
        memcpy(out, norm, D * sizeof *out);
        return 0;
    }
    const lm_matrix *mx = kind == GW_EMB ? &w->token_embedding
                          : kind == GW_CLS ? &w->wcls
                          : kind == GW_WQ ? &ly->wq
                          : kind == GW_WK ? &ly->wk
                          : kind == GW_WV ? &ly->wv
                          : kind == GW_WO ? &ly->wo
                          : kind == GW_W1 ? &ly->w1
                          : kind == GW_W2 ? &ly->w2
                                          : &ly->w3;
    for (size_t r = 0; r < mx->rows; r++)
        lm_matrix_row(mx, r, out + r * mx->cols);
    return 0;
}

/* ---- the vocabulary ---- */

typedef struct kv_buf { /* raw metadata pairs, for gw_spec.extra_kv */
    unsigned char *p;
    size_t n, cap, count;
} kv_buf;

static void kv_add(void *user, const void *pair, size_t bytes)
{
    kv_buf *b = user;
    if (b->n + bytes > b->cap) {
        b->cap = (b->n + bytes) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            die("out of memory");
    }
    memcpy(b->p + b->n, pair, bytes);
    b->n += bytes;
    b->count++;
}

/* The tokenizer.* pairs of a GGUF model, checked first: its vocabulary
 * reads (as the decoder and llama.cpp read it) and has `vocab` pieces. */
static void carry_vocab(const lm_model *m, const char *what, const char *path, int32_t vocab,
                        kv_buf *kv)
{
    lm_tokenizer *t = NULL;
    if (lm_tokenizer_from_model(m, NULL, &t) != KVE_OK)
        die("%s %s: its vocabulary cannot be carried: %s (give --tokenizer)", what, path,
            kve_last_error());
    int32_t n = t->n_pieces;
    lm_tokenizer_free(t);
    if (n != vocab)
        die("%s %s: %d pieces, the model's vocabulary is %d", what, path, n, vocab);
    lm_gguf_pairs(m, "tokenizer.", kv_add, kv);
}

/* --random's vocabulary: llama2.c's layout with placeholder pieces. */
static char **placeholder_pieces(int32_t V, int32_t **len, float **score)
{
    char **p = calloc((size_t)V, sizeof *p);
    *len = calloc((size_t)V, sizeof **len);
    *score = calloc((size_t)V, sizeof **score);
    if (!p || !*len || !*score)
        die("out of memory");
    for (int32_t i = 0; i < V; i++) {
        char b[24];
        if (i < 3)
            snprintf(b, sizeof b, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(b, sizeof b, "<0x%02X>", i - 3);
        else
            snprintf(b, sizeof b, "t%d", i);
        p[i] = strdup(b);
        if (!p[i])
            die("out of memory");
        (*len)[i] = (int32_t)strlen(b);
    }
    return p;
}

/* --rope-scaling: the metadata of s, and for llama3 the factors (S/2
 * floats, Llama 3's: conversion/llama.py's formula over the float32
 * frequencies) into freqs. */
static void parse_rope_scaling(const char *arg, gw_spec *s, float *freqs)
{
    s->rope_scaling = 0, s->rope_factor = 1.0f, s->rope_attn_factor = 1.0f;
    s->rope_orig_ctx = 0, s->rope_freqs = NULL;
    if (strcmp(arg, "none") == 0)
        return;
    const char *colon = strchr(arg, ':');
    size_t tl = colon ? (size_t)(colon - arg) : strlen(arg);
    int llama3 = tl == 6 && memcmp(arg, "llama3", 6) == 0;
    if (tl == 6 && memcmp(arg, "linear", 6) == 0)
        s->rope_scaling = 1;
    else if (tl == 4 && memcmp(arg, "yarn", 4) == 0)
        s->rope_scaling = 2;
    else if (!llama3)
        die("--rope-scaling: '%.*s' is not none, linear, yarn or llama3", (int)tl, arg);
    if (!colon)
        die("--rope-scaling %s: give the factor (%.*s:F)", arg, (int)tl, arg);
    char *copy = strdup(colon + 1), *save = NULL;
    double factor = 0, low = 1, high = 4, attn = 1, orig = llama3 ? 8192 : 0;
    int first = 1;
    for (char *it = strtok_r(copy, ",", &save); it; it = strtok_r(NULL, ",", &save), first = 0) {
        char *eq = strchr(it, '='), *end;
        const char *v = first ? it : eq ? eq + 1 : "";
        if (!first && eq)
            *eq = '\0';
        double x = strtod(v, &end);
        if (!*v || *end || !(x > 0 && x < 1e30))
            die("--rope-scaling: '%s' is not a positive number", v);
        /* yarn and linear take attn; llama3 takes low and high. */
        const char *k1 = llama3 ? "low" : "attn", *k2 = llama3 ? "high" : "";
        double *slot = first                   ? &factor
                       : strcmp(it, "orig") == 0 ? &orig
                       : strcmp(it, k1) == 0     ? (llama3 ? &low : &attn)
                       : *k2 && strcmp(it, k2) == 0 ? &high
                                                    : NULL;
        if (!slot)
            die("--rope-scaling %s: unknown key '%s'", arg, it);
        *slot = x;
    }
    free(copy);
    if (factor == 0)
        die("--rope-scaling %s: give the factor", arg);
    if (orig != (double)(int32_t)orig || (s->rope_scaling == 1 && orig))
        die("--rope-scaling %s: orig is a whole context length, for yarn and llama3", arg);
    if (!llama3) {
        s->rope_factor = (float)factor, s->rope_attn_factor = (float)attn;
        s->rope_orig_ctx = (int32_t)orig;
        return;
    }
    if (!(low < high))
        die("--rope-scaling %s: low %g must be below high %g", arg, low, high);
    const int S = s->dim / s->heads;
    for (int j = 0; j < S / 2; j++) {
        double freq = 1.0f / powf(s->rope_theta, (float)(2 * j) / (float)S);
        double wavelen = 2 * 3.14159265358979323846 / freq;
        if (wavelen < orig / high) {
            freqs[j] = 1.0f;
        } else if (wavelen > orig / low) {
            freqs[j] = (float)factor;
        } else {
            double smooth = (orig / wavelen - low) / (high - low);
            freqs[j] = (float)(1 / ((1 - smooth) / factor + smooth));
        }
    }
    s->rope_freqs = freqs;
}

/* dim=...,hidden=... into s (and seed, tied). */
static void parse_shape(const char *arg, gw_spec *s, uint64_t *seed)
{
    char *copy = strdup(arg), *save = NULL;
    int have = 0;
    s->shared = 1;
    for (char *it = strtok_r(copy, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(it, '=');
        if (!eq)
            die("--random: '%s' is not key=value", it);
        *eq = '\0';
        char *end;
        errno = 0;
        unsigned long long v = strtoull(eq + 1, &end, 10);
        if (*end || errno || eq[1] == '\0' || (strcmp(it, "seed") != 0 && v > INT32_MAX))
            die("--random: %s=%s is not a number", it, eq + 1);
        int32_t *slot = strcmp(it, "dim") == 0        ? &s->dim
                        : strcmp(it, "hidden") == 0   ? &s->hidden
                        : strcmp(it, "layers") == 0   ? &s->layers
                        : strcmp(it, "heads") == 0    ? &s->heads
                        : strcmp(it, "kv_heads") == 0 ? &s->kv_heads
                        : strcmp(it, "vocab") == 0    ? &s->vocab
                        : strcmp(it, "seq_len") == 0  ? &s->seq_len
                                                      : NULL;
        if (slot) {
            *slot = (int32_t)v;
            have++;
        } else if (strcmp(it, "seed") == 0) {
            *seed = v;
        } else if (strcmp(it, "tied") == 0) {
            s->shared = v != 0;
        } else {
            die("--random: unknown key '%s'", it);
        }
    }
    free(copy);
    if (have != 7)
        die("--random: give dim, hidden, layers, heads, kv_heads, vocab and seq_len");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *random = NULL, *tok = NULL, *to = NULL, *out = NULL, *name = NULL;
    const char *type_s = "f32", *emb_s = NULL, *norm_s = "f32", *group_s = NULL, *rope_s = NULL;
    for (int i = 1; i < argc; i++) {
        const char **slot = strcmp(argv[i], "--model") == 0            ? &model
                            : strcmp(argv[i], "--random") == 0         ? &random
                            : strcmp(argv[i], "--tokenizer") == 0      ? &tok
                            : strcmp(argv[i], "--to") == 0             ? &to
                            : strcmp(argv[i], "--type") == 0           ? &type_s
                            : strcmp(argv[i], "--embedding-type") == 0 ? &emb_s
                            : strcmp(argv[i], "--norm-type") == 0      ? &norm_s
                            : strcmp(argv[i], "--group") == 0          ? &group_s
                            : strcmp(argv[i], "--name") == 0           ? &name
                            : strcmp(argv[i], "--rope-scaling") == 0   ? &rope_s
                            : strcmp(argv[i], "-o") == 0               ? &out
                                                                       : NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (!slot)
            die("unknown option '%s' (see --help)", argv[i]);
        if (i + 1 >= argc)
            die("%s needs a value", argv[i]);
        *slot = argv[++i];
    }
    if (!model == !random)
        die("give exactly one of --model and --random (see --help)");
    if (!to || !out)
        die("--to and -o are required (see --help)");
    int version = strcmp(to, "gguf") == 0         ? -1
                  : strcmp(to, "llama2c") == 0    ? 0
                  : strcmp(to, "llama2c-v1") == 0 ? 1
                  : strcmp(to, "llama2c-v2") == 0 ? 2
                                                  : -2;
    if (version == -2)
        die("--to: '%s' is not gguf, llama2c, llama2c-v1 or llama2c-v2", to);
    gw_spec s = {0};
    s.type = type_of("--type", type_s);
    s.emb_type = emb_s ? type_of("--embedding-type", emb_s) : s.type;
    s.norm_type = type_of("--norm-type", norm_s);
    if (s.norm_type != GW_F32 && s.norm_type != GW_F16 && s.norm_type != GW_BF16)
        die("--norm-type: norms are f32, f16 or bf16");
    s.name = name;
    s.norm_eps = 1e-5f;
    s.rope_theta = 10000.0f;
    lm_model *m = NULL;
    uint64_t seed = 1;
    if (model) {
        if (lm_model_open(model, NULL, &m) != KVE_OK)
            die("--model %s: %s", model, kve_last_error());
        const lm_config *c = &m->config;
        s.dim = c->dim, s.hidden = c->hidden_dim, s.layers = c->n_layers, s.heads = c->n_heads;
        s.kv_heads = c->n_kv_heads, s.vocab = c->vocab_size, s.seq_len = c->seq_len;
        s.shared = c->shared_classifier;
        s.norm_eps = c->norm_eps;
        s.rope_theta = c->rope_theta;
        s.rope_scaling = c->rope_scaling == LM_ROPE_SCALING_LINEAR ? 1
                         : c->rope_scaling == LM_ROPE_SCALING_YARN ? 2
                                                                   : 0;
        s.rope_factor = c->rope_factor, s.rope_attn_factor = c->rope_attn_factor;
        s.rope_orig_ctx = s.rope_scaling == 2 ? c->rope_orig_ctx : 0;
        s.rope_freqs = m->weights.rope_freqs;
    } else {
        parse_shape(random, &s, &seed);
    }
    float *rope_freqs = NULL;
    if (rope_s) {
        if (version >= 0)
            die("--rope-scaling: a llama2.c export has no RoPE scaling (--to gguf)");
        rope_freqs = calloc((size_t)(s.dim / s.heads / 2) + 1, sizeof *rope_freqs);
        if (!rope_freqs)
            die("out of memory");
        parse_rope_scaling(rope_s, &s, rope_freqs);
    } else if (version >= 0 && (s.rope_scaling || s.rope_freqs)) {
        die("--model %s: its rotary embedding is scaled, which a llama2.c export cannot say", model);
    }
    /* The vocabulary: a tokenizer.bin's pieces, or a GGUF's tokenizer.* pairs
     * as they are; every GGUF written has one. */
    lm_tokenizer *t = NULL;
    lm_model *tok_model = NULL;
    kv_buf kv = {0};
    char beside[4200], *name_copy = NULL;
    unsigned char magic[4] = {0};
    size_t got = 0;
    if (tok && lm_read_head(tok, magic, 4, &got) == KVE_OK && got == 4 && memcmp(magic, "GGUF", 4) == 0) {
        if (lm_model_open(tok, NULL, &tok_model) != KVE_OK)
            die("--tokenizer %s: %s", tok, kve_last_error());
        carry_vocab(tok_model, "--tokenizer", tok, s.vocab, &kv);
    } else if (!tok && version < 0 && m && m->config.format == LM_FORMAT_GGUF) {
        carry_vocab(m, "--model", model, s.vocab, &kv);
    } else if (!tok && version < 0 && m) { /* llama2.c: tokenizer.bin beside it, as lm reads it */
        const char *slash = strrchr(model, '/');
        snprintf(beside, sizeof beside, "%.*s/tokenizer.bin", slash ? (int)(slash - model) : 1,
                 slash ? model : ".");
        if (lm_read_head(beside, magic, 4, &got) != KVE_OK)
            die("--model %s: a llama2.c checkpoint carries no vocabulary and there is no %s: give "
                "--tokenizer", model, beside);
        tok = beside;
    }
    if (tok && !tok_model && lm_tokenizer_open(tok, NULL, &t) != KVE_OK)
        die("--tokenizer %s: %s", tok, kve_last_error());
    if (t && t->n_pieces != s.vocab)
        die("--tokenizer: %d pieces, the model's vocabulary is %d", t->n_pieces, s.vocab);
    gw_vocab vocab = {0};
    char **fake = NULL;
    int32_t *fake_len = NULL;
    float *fake_score = NULL;
    if (t) {
        vocab = (gw_vocab){t->n_pieces, (const char *const *)t->piece, t->len, t->score};
    } else if (!kv.count && version < 0) { /* --random */
        fake = placeholder_pieces(s.vocab, &fake_len, &fake_score);
        vocab = (gw_vocab){s.vocab, (const char *const *)fake, fake_len, fake_score};
    }
    s.vocab_data = vocab.n && version < 0 ? &vocab : NULL;
    s.extra_kv = kv.p, s.extra_kv_bytes = kv.n, s.extra_kv_count = kv.count;
    const char *in_name;
    size_t in_len;
    if (!name && m && lm_gguf_string(m, "general.name", &in_name, &in_len)) {
        name_copy = strndup(in_name, in_len);
        if (!name_copy)
            die("out of memory");
        s.name = name_copy;
    }
    s.fallback = 1;
    int group = 0;
    if (version == 2) {
        group = group_s ? atoi(group_s) : 64;
        if (!group_s)
            while (group > 1 && (s.dim % group || s.hidden % group))
                group /= 2;
        if (group <= 0 || s.dim % group || s.hidden % group)
            die("--group %s must divide dim %d and hidden %d", group_s ? group_s : "64", s.dim,
                s.hidden);
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        die("cannot create %s: %s", tmp, strerror(errno));
    random_src rs = {seed, &s};
    gw_source src = m ? model_tensor : random_tensor;
    void *user = m ? (void *)m : (void *)&rs;
    char err[256] = "";
    int rc = version < 0 ? gw_write_gguf(f, &s, src, user, err, sizeof err)
                         : gw_write_llama2c(f, &s, version, group, src, user, err, sizeof err);
    if (fclose(f) != 0 && rc == 0)
        rc = -1, snprintf(err, sizeof err, "%s", strerror(errno));
    if (rc == 0 && s.fell_back)
        fprintf(stderr, "kvevict-convert: %zu tensors have rows that are not whole blocks of their "
                "type: written in the nearest type that fits (as llama.cpp falls back)\n",
                s.fell_back);
    if (rc != 0 || rename(tmp, out) != 0) {
        remove(tmp);
        fprintf(stderr, "kvevict-convert: cannot write %s: %s\n", out,
                err[0] ? err : strerror(errno));
        return 1;
    }
    free(rope_freqs);
    for (int32_t i = 0; fake && i < s.vocab; i++)
        free(fake[i]);
    free(fake), free(fake_len), free(fake_score);
    free(kv.p), free(name_copy);
    lm_tokenizer_free(t);
    lm_model_free(tok_model);
    lm_model_free(m);
    return 0;
}
