/*
 * fuzz_tokenizer.c - the tokenizer.bin reader, encoder and decoder, on
 * whatever bytes the fuzzer makes.
 *
 * The input is parsed with lm_tokenizer_from_memory. Checked:
 *   - a refusal is KVE_EFORMAT (or KVE_ENOMEM) with a non-empty one-line
 *     message and *out untouched;
 *   - an accepted tokenizer has at least one piece, lengths within
 *     [0, max_token_length], `longest` their maximum (what encoding buffers
 *     are sized by, never the header's max_token_length, which a file may
 *     set to 2^31 - 1), no NUL byte in a piece, and finds every piece
 *     by its bytes (lm_piece_id returns the lowest id with those bytes);
 *   - a few texts (fixed ones and slices of the input) encode exactly as
 *     run.c's algorithm written naively (tests/lm_naive_bpe.h) does, or are
 *     refused with KVE_EFORMAT exactly when a byte has no piece; every token
 *     decodes to at most max_token_length bytes.
 */
#include "kvevict.h"
#include "lm.h"
#include "lm_naive_bpe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_tokenizer: CHECK(%s) failed at line %d (last error: %s)\n", #c,  \
                    __LINE__, kve_last_error());                                                    \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

enum { TEXT_MAX = 48 };

static void check_text(const lm_tokenizer *t, const char *text)
{
    size_t len = strlen(text), n = 0;
    int32_t mine[TEXT_MAX + 1];
    int want[TEXT_MAX + 1];
    kve_status st = lm_encode(t, text, len, mine, TEXT_MAX + 1, &n);
    size_t nw = 0;
    int missing = 0;
    /* The naive encoder needs every fallback byte to exist to be defined. */
    nw = naive_encode(t, text, want);
    for (size_t i = 0; i < nw; i++)
        missing |= want[i] >= t->n_pieces;
    if (st != KVE_OK) {
        CHECK(st == KVE_EFORMAT || st == KVE_ENOMEM);
        CHECK(st == KVE_ENOMEM || missing); /* refused exactly when a byte has no piece */
        return;
    }
    CHECK(!missing);
    CHECK(n == nw && n <= len + 1);
    for (size_t i = 0; i < n; i++) {
        CHECK(mine[i] == want[i]);
        size_t pl;
        const char *p = lm_decode(t, i ? mine[i - 1] : LM_BOS, mine[i], &pl);
        CHECK(p != NULL && pl <= (size_t)t->longest);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lm_tokenizer *t = (lm_tokenizer *)&size;
    kve_status st = lm_tokenizer_from_memory(data, size, NULL, &t);
    if (st != KVE_OK) {
        CHECK(st == KVE_EFORMAT || st == KVE_ENOMEM);
        CHECK(kve_last_error()[0] != '\0' && strchr(kve_last_error(), '\n') == NULL);
        CHECK(t == (lm_tokenizer *)&size);
        return 0;
    }
    CHECK(t->n_pieces >= 1 && t->max_token_length >= 1);
    CHECK(t->longest >= 0 && t->longest <= t->max_token_length);
    int32_t longest = 0;
    for (int32_t i = 0; i < t->n_pieces; i++) {
        CHECK(t->len[i] >= 0 && t->len[i] <= t->max_token_length);
        longest = t->len[i] > longest ? t->len[i] : longest;
        CHECK(memchr(t->piece[i], 0, (size_t)t->len[i]) == NULL);
        int32_t id = lm_piece_id(t, t->piece[i], (size_t)t->len[i]);
        CHECK(id >= 0 && id <= i && t->len[id] == t->len[i]);
        CHECK(memcmp(t->piece[id], t->piece[i], (size_t)t->len[i]) == 0);
    }
    CHECK(longest == t->longest);
    size_t ignored;
    CHECK(lm_decode(t, 0, t->n_pieces, &ignored) == NULL && lm_decode(t, 0, -1, &ignored) == NULL);
    static const char *const fixed[] = {
        "", "a", "the cat", "\xc3\xa9t\xc3\xa9 \xe2\x82\xac", "\x80\xc3", "<0x41> <s>"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        check_text(t, fixed[i]);
    /* Slices of the input itself: the pieces' own bytes make merges likely. */
    char text[TEXT_MAX + 1];
    for (size_t off = 0; off < size && off < 4 * TEXT_MAX; off += TEXT_MAX / 2) {
        size_t n = size - off < TEXT_MAX ? size - off : TEXT_MAX;
        for (size_t i = 0; i < n; i++)
            text[i] = data[off + i] ? (char)data[off + i] : 'x';
        text[n] = '\0';
        check_text(t, text);
    }
    lm_tokenizer_free(t);
    return 0;
}
