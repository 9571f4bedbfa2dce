/* SPDX-License-Identifier: MIT */
/*
 * fuzz_gguf.c - GGUF files (lm/gguf.c): the container, the llama model and
 * the vocabulary in the metadata, on whatever bytes the fuzzer makes.
 *
 * Each input is parsed with lm_model_from_memory (fuzz_model.h checks a
 * refusal, or every tensor of the accepted model inside the input and a
 * few decode steps). An accepted model's vocabulary is then read with
 * lm_tokenizer_from_model: a refusal is KVE_EFORMAT (or KVE_ENOMEM) with a
 * one-line message; an accepted one has one piece per vocabulary entry,
 * finds every piece by its bytes (the highest id of equal pieces, as
 * llama.cpp), byte fallback ids in range, and encodes a few texts (fixed
 * ones and a slice of the input) into ids in range, at most
 * lm_encode_bound of them, each of which decodes.
 * The corpus (fuzz/corpus/fuzz_gguf/) is written by kvevict-convert in
 * every type, tied and untied, with and without a vocabulary
 * (fuzz/make-seeds.sh).
 */
#define FUZZ_TARGET "fuzz_gguf"
#include "fuzz_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_vocabulary(const lm_model *m, const uint8_t *data, size_t size)
{
    lm_tokenizer *t = (lm_tokenizer *)&data;
    kve_status st = lm_tokenizer_from_model(m, NULL, &t);
    if (st != KVE_OK) {
        CHECK(st == KVE_EFORMAT || st == KVE_ENOMEM);
        CHECK(kve_last_error()[0] != '\0' && strchr(kve_last_error(), '\n') == NULL);
        CHECK(t == (lm_tokenizer *)&data);
        return;
    }
    CHECK(t->n_pieces == m->config.vocab_size);
    for (int32_t i = 0; i < t->n_pieces; i++) {
        CHECK(t->len[i] >= 0 && t->len[i] <= t->longest);
        int32_t id = lm_piece_id(t, t->piece[i], (size_t)t->len[i]);
        CHECK(id >= i && id < t->n_pieces && t->len[id] == t->len[i]);
    }
    for (int b = 0; b < 256; b++)
        CHECK(t->byte_id[b] >= -1 && t->byte_id[b] < t->n_pieces);
    CHECK(t->unk >= -1 && t->unk < t->n_pieces && (t->kind != LM_TOK_SPM || t->unk >= 0));
    CHECK(t->bos >= -1 && t->bos < t->n_pieces && t->eos >= -1 && t->eos < t->n_pieces);
    const char *texts[] = {"", "a", "the pass key is #", "caf\xc3\xa9 \xe2\x82\xac\x01"};
    int32_t ids[4 * 32 + 3];
    for (size_t k = 0; k <= sizeof texts / sizeof texts[0]; k++) {
        const char *s = k < 4 ? texts[k] : (const char *)data;
        size_t len = k < 4 ? strlen(s) : (size < 32 ? size : 32);
        size_t n = 0;
        st = lm_encode(t, s, len, ids, sizeof ids / sizeof ids[0], &n);
        CHECK(st == KVE_OK || st == KVE_ENOMEM);
        CHECK(st != KVE_OK || n <= lm_encode_bound(t, len));
        for (size_t i = 0; st == KVE_OK && i < n; i++) {
            size_t pl;
            CHECK(ids[i] >= 0 && ids[i] < t->n_pieces && lm_decode(t, -1, ids[i], &pl));
        }
    }
    lm_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void *buf;
    lm_model *m = load_checked(data, size, &buf);
    if (m) {
        check_vocabulary(m, data, size);
        decode_a_little(m, LM_POS_ORIGINAL);
        decode_a_little(m, LM_POS_CACHE);
        lm_model_free(m);
    }
    free(buf);
    return 0;
}
