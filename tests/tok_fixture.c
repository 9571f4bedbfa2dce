/* SPDX-License-Identifier: MIT */
/*
 * tok_fixture.c - GGUF files of random weights whose vocabularies the
 * tokenizer tests hold to llama.cpp's (tests/test_tokenize_llama.sh),
 * written by the converter's writer (tools/gguf_write.c):
 *
 *   tok_fixture bpe TEXT PRE MERGES OUT [KEY=VALUE...]
 *     a byte-level BPE ("gpt2") vocabulary trained on TEXT and 40 copies of a
 *     built-in supplement (digits, contractions, accents, CJK, emoji): GPT-2's 256
 *     byte characters (ids 0 .. 255, in byte order), then up to MERGES
 *     merges, each the most frequent adjacent pair of the words (ties: the
 *     smaller pair by bytes) while one occurs twice, then <|endoftext|>
 *     (control, BOS and EOS), <|eot_id|> (control) and <|sep|>
 *     (user-defined); tokenizer.ggml.pre PRE ("-": no key).
 *   tok_fixture vocab IN OUT [KEY=VALUE...]
 *     IN's tokenizer.* pairs, as they are, but for the keys given.
 *
 * KEY: add_bos, add_eos, add_space_prefix (0 or 1), bos, eos (ids), pre,
 * model (strings). Words for training: an optional space and a run of
 * letters (bytes from 0x80 count as letters), a run of digits, a run of
 * other printable bytes, or one other byte. The same arguments write the
 * same bytes.
 */
#include "gguf_kv.h"
#include "gw_fixture.h"
#include "lm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what)
{
    fprintf(stderr, "tok_fixture: %s\n", what);
    exit(1);
}

/* KEY=VALUE options: which keys they set, and their pairs. */
static const struct opt {
    const char *name, *key;
    uint32_t type;
} opts[] = {{"add_bos", "tokenizer.ggml.add_bos_token", KV_BOOL},
            {"add_eos", "tokenizer.ggml.add_eos_token", KV_BOOL},
            {"add_space_prefix", "tokenizer.ggml.add_space_prefix", KV_BOOL},
            {"bos", "tokenizer.ggml.bos_token_id", KV_U32},
            {"eos", "tokenizer.ggml.eos_token_id", KV_U32},
            {"pre", "tokenizer.ggml.pre", KV_STRING},
            {"model", "tokenizer.ggml.model", KV_STRING}};

static const struct opt *opt_of(const char *arg, const char **value)
{
    const char *eq = strchr(arg, '=');
    for (size_t i = 0; eq && i < sizeof opts / sizeof opts[0]; i++)
        if (strlen(opts[i].name) == (size_t)(eq - arg) && memcmp(arg, opts[i].name, (size_t)(eq - arg)) == 0) {
            *value = eq + 1;
            return &opts[i];
        }
    fprintf(stderr, "tok_fixture: '%s' is not KEY=VALUE of a known key\n", arg);
    exit(2);
}

static void put_opts(kv_pairs *k, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        const char *v;
        const struct opt *o = opt_of(argv[i], &v);
        if (o->type == KV_BOOL)
            kv_key_bool(k, o->key, atoi(v));
        else if (o->type == KV_U32)
            kv_key_u32(k, o->key, (uint32_t)strtoul(v, NULL, 10));
        else
            kv_key_str(k, o->key, v);
    }
}

/* Writes a random model of V tokens carrying the pairs k. */
static void write_model(const char *path, int32_t V, const kv_pairs *k)
{
    fx_model fx;
    fx_model_init(&fx, 32, 64, 1, 2, 1, V, 128, 1, 5);
    gw_spec s = spec_of(&fx, GW_F32);
    s.extra_kv = k->b.p, s.extra_kv_bytes = k->b.n, s.extra_kv_count = k->count;
    FILE *f = fopen(path, "wb");
    char err[256] = "";
    if (!f)
        fail("cannot create the output");
    int rc = gw_write_gguf(f, &s, fx_source, &fx, err, sizeof err);
    if (fclose(f) != 0 || rc != 0)
        fail(err[0] ? err : "cannot write the output");
    fx_model_free(&fx);
}

/* ---- vocab: another file's vocabulary, some keys changed ---- */

typedef struct filter {
    kv_pairs *k;
    int argc;
    char **argv;
} filter;

static void keep_pair(void *user, const void *pair, size_t bytes)
{
    filter *f = user;
    const unsigned char *p = pair;
    size_t len = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16;
    for (int i = 0; i < f->argc; i++) {
        const char *v;
        const struct opt *o = opt_of(f->argv[i], &v);
        if (strlen(o->key) == len && memcmp(o->key, p + 8, len) == 0)
            return; /* replaced */
    }
    fx_put(&f->k->b, pair, bytes);
    f->k->count++;
}

static int vocab_mode(int argc, char **argv)
{
    lm_model *m = NULL;
    if (lm_model_open(argv[0], NULL, &m) != KVE_OK)
        fail(kve_last_error());
    kv_pairs k = {{0}, 0};
    filter f = {&k, argc - 2, argv + 2};
    lm_gguf_pairs(m, "tokenizer.", keep_pair, &f);
    put_opts(&k, argc - 2, argv + 2);
    write_model(argv[1], m->config.vocab_size, &k);
    free(k.b.p);
    lm_model_free(m);
    return 0;
}

/* ---- bpe: training ---- */

static const char supplement[] =
    "don't won't it's we're they've I'm you'll he'd DON'T IT'S We'Re 's 't\n"
    "1 12 123 1234 12345 123456 2024 1999 3.14159 100,000 007\n"
    "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\xa9t\xc3\xa9 \xc3\x9c" "ber stra\xc3\x9f" "e\n"
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xe4\xb8\xad\xe6\x96\x87 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4\n"
    "\xf0\x9f\x99\x82 \xf0\x9f\x8e\x89\xf0\x9f\x8e\x89 \xe2\x80\x94 \xe2\x80\x9cquoted\xe2\x80\x9d\n"
    "  two  spaces\tand\ttabs\r\nCRLF lines\r\n\n\n";

typedef struct word {
    int32_t *sym; /* symbol ids */
    size_t n;
    uint64_t count;
} word;

typedef struct vocab {
    char **s;
    size_t *len, n, cap;
} vocab;

static int32_t vocab_add(vocab *v, const char *s, size_t len)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 512;
        v->s = realloc(v->s, v->cap * sizeof *v->s);
        v->len = realloc(v->len, v->cap * sizeof *v->len);
        if (!v->s || !v->len)
            fail("out of memory");
    }
    v->s[v->n] = malloc(len + 1);
    if (!v->s[v->n])
        fail("out of memory");
    memcpy(v->s[v->n], s, len);
    v->s[v->n][len] = '\0';
    v->len[v->n] = len;
    return (int32_t)v->n++;
}

static int is_letter(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int is_other(unsigned char c)
{
    return c > ' ' && c < 0x7F && !is_letter(c) && !is_digit(c);
}

typedef struct span {
    const unsigned char *p;
    size_t n;
} span;

static int cmp_span(const void *x, const void *y)
{
    const span *a = x, *b = y;
    int c = memcmp(a->p, b->p, a->n < b->n ? a->n : b->n);
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

/* The words of t[0 .. n) appended to w (at *nw). */
static void words_of(const unsigned char *t, size_t n, span *w, size_t *nw)
{
    for (size_t i = 0; i < n;) {
        size_t j = i + (t[i] == ' ' && i + 1 < n && (is_letter(t[i + 1]) || is_digit(t[i + 1]) ||
                                                      is_other(t[i + 1])));
        int (*cls)(unsigned char) = is_letter(t[j]) ? is_letter : is_digit(t[j]) ? is_digit
                                    : is_other(t[j]) ? is_other : NULL;
        size_t k = j + 1;
        while (cls && k < n && cls(t[k]))
            k++;
        w[(*nw)++] = (span){t + i, k - i};
        i = k;
    }
}

typedef struct pair_count {
    uint64_t key, count; /* key: left << 32 | right, + 1 (0: empty) */
} pair_count;

static int bpe_mode(int argc, char **argv)
{
    const char *text_path = argv[0], *pre = argv[1], *out = argv[3];
    long merges = strtol(argv[2], NULL, 10);
    FILE *f = fopen(text_path, "rb");
    if (!f)
        fail("cannot read TEXT");
    fx_buf text = {0};
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        fx_put(&text, chunk, got);
    fclose(f);
    for (int r = 0; r < 40; r++) /* weight enough for its pairs among the merges */
        fx_put(&text, supplement, sizeof supplement - 1);
    span *all = malloc((text.n + 1) * sizeof *all);
    size_t n_all = 0;
    if (!all)
        fail("out of memory");
    words_of(text.p, text.n, all, &n_all);
    qsort(all, n_all, sizeof *all, cmp_span);
    word *w = calloc(n_all + 1, sizeof *w);
    size_t nw = 0;
    for (size_t i = 0; i < n_all; i++) {
        if (nw && cmp_span(&all[i], &all[i - 1]) == 0) {
            w[nw - 1].count++;
            continue;
        }
        w[nw].sym = malloc(all[i].n * sizeof *w[nw].sym);
        if (!w[nw].sym)
            fail("out of memory");
        for (size_t k = 0; k < all[i].n; k++)
            w[nw].sym[k] = all[i].p[k];
        w[nw].n = all[i].n;
        w[nw++].count = 1;
    }
    vocab v = {0};
    for (unsigned b = 0; b < 256; b++) {
        char u[2];
        vocab_add(&v, u, kv_byte_char(b, u));
    }
    fx_buf merge_list = {0}; /* "left right" strings, NUL-separated */
    size_t n_merges = 0, table_n = 1u << 18;
    pair_count *table = malloc(table_n * sizeof *table);
    if (!table)
        fail("out of memory");
    for (long m = 0; m < merges; m++) {
        memset(table, 0, table_n * sizeof *table);
        uint64_t best = 0, best_count = 0;
        for (size_t i = 0; i < nw; i++)
            for (size_t k = 0; k + 1 < w[i].n; k++) {
                uint64_t key = ((uint64_t)w[i].sym[k] << 32 | (uint32_t)w[i].sym[k + 1]) + 1;
                size_t h = (size_t)((key * 0x9e3779b97f4a7c15u) >> 46) & (table_n - 1);
                while (table[h].key && table[h].key != key)
                    h = (h + 1) & (table_n - 1);
                table[h].key = key;
                table[h].count += w[i].count;
                uint64_t c = table[h].count;
                int better = c > best_count;
                if (c == best_count && key != best) { /* ties: the smaller pair by bytes */
                    int32_t a = (int32_t)((key - 1) >> 32), b = (int32_t)(uint32_t)(key - 1);
                    int32_t x = (int32_t)((best - 1) >> 32), y = (int32_t)(uint32_t)(best - 1);
                    int cmp = strcmp(v.s[a], v.s[x]);
                    better = cmp < 0 || (cmp == 0 && strcmp(v.s[b], v.s[y]) < 0);
                }
                if (better)
                    best = key, best_count = c;
            }
        if (best_count < 2)
            break;
        int32_t a = (int32_t)((best - 1) >> 32), b = (int32_t)(uint32_t)(best - 1);
        char cat[512];
        if (v.len[a] + v.len[b] >= sizeof cat)
            break;
        snprintf(cat, sizeof cat, "%s%s", v.s[a], v.s[b]);
        int32_t id = vocab_add(&v, cat, v.len[a] + v.len[b]);
        char line[520];
        int ln = snprintf(line, sizeof line, "%s %s", v.s[a], v.s[b]);
        fx_put(&merge_list, line, (size_t)ln + 1);
        n_merges++;
        for (size_t i = 0; i < nw; i++) { /* the pair merged, left to right */
            size_t o = 0;
            for (size_t k = 0; k < w[i].n; k++) {
                if (k + 1 < w[i].n && w[i].sym[k] == a && w[i].sym[k + 1] == b)
                    w[i].sym[o++] = id, k++;
                else
                    w[i].sym[o++] = w[i].sym[k];
            }
            w[i].n = o;
        }
    }
    int32_t eot = vocab_add(&v, "<|endoftext|>", 13);
    vocab_add(&v, "<|eot_id|>", 10);
    vocab_add(&v, "<|sep|>", 7);

    kv_pairs k = {{0}, 0};
    kv_key_str(&k, "tokenizer.ggml.model", "gpt2");
    if (strcmp(pre, "-") != 0)
        kv_key_str(&k, "tokenizer.ggml.pre", pre);
    kv_key_array(&k, "tokenizer.ggml.tokens", KV_STRING, v.n);
    for (size_t i = 0; i < v.n; i++)
        kv_str(&k.b, v.s[i], v.len[i]);
    kv_key_array(&k, "tokenizer.ggml.token_type", KV_I32, v.n);
    for (size_t i = 0; i < v.n; i++)
        kv_u32(&k.b, i + 3 < v.n ? 1 : i + 1 < v.n ? 3 : 4);
    kv_key_array(&k, "tokenizer.ggml.merges", KV_STRING, n_merges);
    for (size_t i = 0, o = 0; i < n_merges; i++) {
        size_t len = strlen((const char *)merge_list.p + o);
        kv_str(&k.b, (const char *)merge_list.p + o, len);
        o += len + 1;
    }
    int given_bos = 0, given_eos = 0;
    for (int i = 4; i < argc; i++) {
        given_bos |= strncmp(argv[i], "bos=", 4) == 0;
        given_eos |= strncmp(argv[i], "eos=", 4) == 0;
    }
    if (!given_bos)
        kv_key_u32(&k, "tokenizer.ggml.bos_token_id", (uint32_t)eot);
    if (!given_eos)
        kv_key_u32(&k, "tokenizer.ggml.eos_token_id", (uint32_t)eot);
    put_opts(&k, argc - 4, argv + 4);
    write_model(out, (int32_t)v.n, &k);
    fprintf(stderr, "tok_fixture: %zu pieces, %zu merges\n", v.n, n_merges);
    for (size_t i = 0; i < nw; i++)
        free(w[i].sym);
    for (size_t i = 0; i < v.n; i++)
        free(v.s[i]);
    free(v.s), free(v.len), free(w), free(all), free(table), free(text.p), free(merge_list.p);
    free(k.b.p);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 6 && strcmp(argv[1], "bpe") == 0)
        return bpe_mode(argc - 2, argv + 2);
    if (argc >= 4 && strcmp(argv[1], "vocab") == 0)
        return vocab_mode(argc - 2, argv + 2);
    fprintf(stderr, "usage: tok_fixture bpe TEXT PRE MERGES OUT [KEY=VALUE...]\n"
                    "       tok_fixture vocab IN OUT [KEY=VALUE...]\n");
    return 2;
}
