/* SPDX-License-Identifier: MIT */
/*
 * fuzz_vocab.c - a GGUF's byte-level BPE vocabulary (lm/gguf.c's reading of
 * tokenizer.ggml.merges and tokenizer.ggml.pre, lm/vocab.c's
 * pre-tokenizers, merges and decoding) on whatever the fuzzer makes.
 *
 * Input: byte 0 picks tokenizer.ggml.pre (among the decoder's families,
 * none, and names it refuses); byte 1 flags (1: an add_bos_token key, 2:
 * its value, 4: a user-defined piece "<|u|>", 8: <|endoftext|> as a
 * control piece and EOS, 16: add_eos_token true); then up to the first NUL
 * lines, "m LEFT RIGHT" a merge and any other line a piece (after GPT-2's
 * 256 byte characters); after the NUL the text. The vocabulary is written
 * into a tiny model by the converter's writer (tools/gguf_write.c).
 * Checked:
 *   - the model loads; its vocabulary is refused (KVE_EFORMAT, one line
 *     naming tokenizer.ggml.pre) exactly when the name is not one the
 *     decoder has, else read with the flags asked for;
 *   - the text and fixed ones encode into ids in range, at most
 *     lm_encode_bound of them; lm_tokenize adds BOS and EOS as the flags
 *     say; every id decodes; a lookup finds the highest id of equal pieces;
 *   - text in, text out: when every piece but the specials is normal and
 *     every merge makes one, valid UTF-8 (shortest forms) decodes back to
 *     its own bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"
#include "gguf_kv.h"
#include "gw_fixture.h"
#include "lm.h"

#include <string.h>

#define CHECK(c) FUZZ_CHECK("fuzz_vocab", c)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const pres[] = {"", "default", "gpt-2", "llama-bpe", "qwen2", "smollm",
                                   "dbrx", "chatglm-bpe", "tekken", "gpt2", "-"};

/* UTF-8 in its shortest forms (what survives a decode and re-encode). */
static int shortest_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned b = s[i];
        size_t k = b < 0x80 ? 1 : b < 0xC2 ? 0 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : b < 0xF8 ? 4 : 0;
        if (k == 0 || n - i < k)
            return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
        if ((k == 3 && b == 0xE0 && s[i + 1] < 0xA0) || (k == 4 && b == 0xF0 && s[i + 1] < 0x90))
            return 0;
        i += k;
    }
    return 1;
}

typedef struct line {
    const char *s;
    size_t n;
} line;

static void check_text(const lm_tokenizer *t, const char *s, size_t n, int round_trip)
{
    size_t cap = lm_encode_bound(t, n) + 2, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    CHECK(ids != NULL);
    kve_status st = lm_encode(t, s, n, ids, cap, &k);
    CHECK(st == KVE_OK && k <= lm_encode_bound(t, n));
    fx_buf back = {0};
    for (size_t i = 0; i < k; i++) {
        CHECK(ids[i] >= 0 && ids[i] < t->n_pieces);
        size_t len;
        const char *p = lm_decode(t, -1, ids[i], &len);
        CHECK(p != NULL);
        if (len)
            fx_put(&back, p, len);
    }
    if (round_trip && shortest_utf8((const unsigned char *)s, n))
        CHECK(back.n == n && (n == 0 || memcmp(back.p, s, n) == 0));
    size_t k2 = 0;
    st = lm_tokenize(t, s, n, ids, cap, &k2);
    size_t first = t->add_bos && t->bos >= 0, last = t->add_eos && t->eos >= 0;
    CHECK(st == KVE_OK && k2 == k + first + last);
    CHECK(!first || ids[0] == t->bos);
    CHECK(!last || ids[k2 - 1] == t->eos);
    free(back.p);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const char *pre = pres[data[0] % (sizeof pres / sizeof pres[0])];
    unsigned flags = data[1];
    const char *body = (const char *)data + 2, *end = (const char *)data + size;
    const char *nul = memchr(body, 0, (size_t)(end - body));
    const char *text = nul ? nul + 1 : end;
    size_t text_n = (size_t)(end - text);
    line *tok = malloc((size + 1) * sizeof *tok), *mer = malloc((size + 1) * sizeof *mer);
    CHECK(tok && mer);
    size_t nt = 0, nm = 0;
    for (const char *p = body, *stop = nul ? nul : end; p < stop;) {
        const char *nl = memchr(p, '\n', (size_t)(stop - p));
        const char *e = nl ? nl : stop;
        if (e - p >= 2 && p[0] == 'm' && p[1] == ' ')
            mer[nm++] = (line){p + 2, (size_t)(e - p - 2)};
        else if (e > p)
            tok[nt++] = (line){p, (size_t)(e - p)};
        p = e + 1;
    }
    int user = (flags & 4) != 0, eos = (flags & 8) != 0;
    size_t V = 256 + nt + (size_t)user + (size_t)eos;
    kv_pairs k = {{0}, 0};
    kv_key(&k, "tokenizer.ggml.model", 8);
    kv_str(&k.b, "gpt2", 4);
    if (strcmp(pre, "-") != 0) {
        kv_key(&k, "tokenizer.ggml.pre", 8);
        kv_str(&k.b, pre, strlen(pre));
    }
    kv_key(&k, "tokenizer.ggml.tokens", 9);
    kv_u32(&k.b, 8), kv_u32(&k.b, (uint32_t)V), kv_u32(&k.b, 0);
    for (unsigned b = 0; b < 256; b++) {
        char c[2];
        kv_str(&k.b, c, kv_byte_char(b, c));
    }
    for (size_t i = 0; i < nt; i++)
        kv_str(&k.b, tok[i].s, tok[i].n);
    if (user)
        kv_str(&k.b, "<|u|>", 5);
    if (eos)
        kv_str(&k.b, "<|endoftext|>", 13);
    kv_key(&k, "tokenizer.ggml.token_type", 9);
    kv_u32(&k.b, 5), kv_u32(&k.b, (uint32_t)V), kv_u32(&k.b, 0);
    for (size_t i = 0; i < 256 + nt; i++)
        kv_u32(&k.b, 1);
    if (user)
        kv_u32(&k.b, 4);
    if (eos)
        kv_u32(&k.b, 3);
    kv_key(&k, "tokenizer.ggml.merges", 9);
    kv_u32(&k.b, 8), kv_u32(&k.b, (uint32_t)nm), kv_u32(&k.b, 0);
    for (size_t i = 0; i < nm; i++)
        kv_str(&k.b, mer[i].s, mer[i].n);
    if (eos) {
        kv_key(&k, "tokenizer.ggml.eos_token_id", 4);
        kv_u32(&k.b, (uint32_t)(V - 1));
    }
    if (flags & 1) {
        unsigned char v = (flags & 2) != 0;
        kv_key(&k, "tokenizer.ggml.add_bos_token", 7);
        fx_put(&k.b, &v, 1);
    }
    if (flags & 16) {
        unsigned char v = 1;
        kv_key(&k, "tokenizer.ggml.add_eos_token", 7);
        fx_put(&k.b, &v, 1);
    }
    fx_model fx;
    fx_model_init(&fx, 4, 8, 1, 1, 1, (int)V, 4, 1, 1);
    gw_spec s = spec_of(&fx, GW_F32);
    s.extra_kv = k.b.p, s.extra_kv_bytes = k.b.n, s.extra_kv_count = k.count;
    char *img = NULL;
    size_t img_n = 0;
    FILE *f = open_memstream(&img, &img_n);
    char err[256];
    CHECK(f && gw_write_gguf(f, &s, fx_source, &fx, err, sizeof err) == 0);
    CHECK(fclose(f) == 0);
    lm_model *m = NULL;
    CHECK(lm_model_from_memory(img, img_n, NULL, &m) == KVE_OK);
    lm_tokenizer *t = (lm_tokenizer *)&size;
    kve_status st = lm_tokenizer_from_model(m, NULL, &t);
    lm_tok_pre kind;
    int a, b, c;
    int known = strcmp(pre, "-") == 0 || lm__pre_lookup(pre, strlen(pre), &kind, &a, &b, &c);
    if (!known) {
        CHECK(st == KVE_EFORMAT && t == (lm_tokenizer *)&size);
        CHECK(strstr(kve_last_error(), "tokenizer.ggml.pre") && !strchr(kve_last_error(), '\n'));
    } else {
        CHECK(st == KVE_OK && t->kind == LM_TOK_BPE && t->n_pieces == (int32_t)V);
        CHECK(!(flags & 1) || t->add_bos == ((flags & 2) != 0));
        CHECK(t->add_eos == ((flags & 16) != 0));
        CHECK(!eos || (t->eos == (int32_t)V - 1 && lm_token_ends(t, t->eos)));
        for (int32_t i = 0; i < t->n_pieces; i++) { /* the highest id of equal pieces */
            int32_t id = lm_piece_id(t, t->piece[i], (size_t)t->len[i]);
            CHECK(id >= i && t->len[id] == t->len[i] &&
                  memcmp(t->piece[id], t->piece[i], (size_t)t->len[i]) == 0);
        }
        /* round trips hold when no merge makes a piece that is missing or not
         * normal (a missing one falls back to bytes the vocabulary may lack) */
        int merges_ok = 1;
        for (size_t i = 0; i < 256 + nt; i++) /* a piece named as an end of turn is control */
            merges_ok &= t->attr[i] == LM_ATTR_NORMAL;
        for (size_t i = 0; i < t->n_merges && merges_ok; i++) {
            const lm_merge *g = &t->merge[i];
            char cat[1024];
            size_t n = (size_t)g->left_len + (size_t)g->right_len;
            if (n > sizeof cat) {
                merges_ok = 0;
                break;
            }
            memcpy(cat, g->left, (size_t)g->left_len);
            memcpy(cat + g->left_len, g->right, (size_t)g->right_len);
            int32_t id = lm_piece_id(t, cat, n);
            merges_ok = id >= 0 && t->attr[id] == LM_ATTR_NORMAL;
        }
        static const char *const fixed[] = {
            "", " ", "the cat's 12345 don't", "a\tb\r\n\n  c   ", "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82",
            "x\x80y \xff", "<|u|>x<|u|> <|endoftext|>", "$1+2=3 ^~| ...!!"};
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
            check_text(t, fixed[i], strlen(fixed[i]), merges_ok);
        check_text(t, text, text_n, merges_ok);
        lm_tokenizer_free(t);
    }
    lm_model_free(m);
    free(img);
    fx_model_free(&fx);
    free(k.b.p);
    free(tok);
    free(mer);
    return 0;
}
