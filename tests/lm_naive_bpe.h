/*
 * lm_naive_bpe.h - run.c's encode written the way run.c writes it, as the
 * reference for lm_encode: C strings, a linear lookup per candidate, the
 * whole sequence rescanned for every merge (O(n^2)), the first pair on ties,
 * byte fallback (byte + 3) without checking the vocabulary's size. For the
 * tests and the tokenizer fuzzer only; no code shared with lm/.
 */
#ifndef KVE_LM_NAIVE_BPE_H
#define KVE_LM_NAIVE_BPE_H

#include "lm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int naive_lookup(const lm_tokenizer *t, const char *s)
{
    size_t n = strlen(s);
    for (int i = 0; i < t->n_pieces; i++)
        if ((size_t)t->len[i] == n && memcmp(t->piece[i], s, n) == 0)
            return i;
    return -1;
}

/* Encodes the C string `text` into tokens (room for strlen(text) + 1);
 * returns their number. */
static inline size_t naive_encode(const lm_tokenizer *t, const char *text, int *tokens)
{
    size_t longest = 0;
    for (int i = 0; i < t->n_pieces; i++)
        longest = (size_t)t->len[i] > longest ? (size_t)t->len[i] : longest;
    size_t cap = 2 * longest + 8;
    char buf[8], *cat = malloc(cap);
    size_t n = 0, len = 0;
    if (text[0] != '\0') {
        int id = naive_lookup(t, " ");
        tokens[n++] = id >= 0 ? id : ' ' + 3;
    }
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80)
            len = 0;
        buf[len++] = *c;
        buf[len] = '\0';
        if ((c[1] & 0xC0) == 0x80 && len < 4)
            continue;
        int id = naive_lookup(t, buf);
        if (id != -1)
            tokens[n++] = id;
        else
            for (size_t i = 0; i < len; i++)
                tokens[n++] = (unsigned char)buf[i] + 3;
        len = 0;
    }
    for (;;) {
        float best = -1e10f;
        int best_id = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            if (tokens[i] >= t->n_pieces || tokens[i + 1] >= t->n_pieces)
                continue; /* a byte without a piece: lm_encode refuses the text */
            snprintf(cat, cap, "%.*s%.*s", t->len[tokens[i]], t->piece[tokens[i]],
                     t->len[tokens[i + 1]], t->piece[tokens[i + 1]]);
            int id = naive_lookup(t, cat);
            if (id != -1 && t->score[id] > best) {
                best = t->score[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_id == -1)
            break;
        tokens[best_i] = best_id;
        memmove(tokens + best_i + 1, tokens + best_i + 2, (n - best_i - 2) * sizeof *tokens);
        n--;
    }
    free(cat);
    return n;
}

#endif /* KVE_LM_NAIVE_BPE_H */
