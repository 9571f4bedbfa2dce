/* SPDX-License-Identifier: MIT */
/*
 * lm_tokenize.c - the decoder's tokenizer (lm/) on files, in the lines
 * tests/llama_tokenize.c prints for llama.cpp's: for each file, the ids of
 * lm_tokenize (BOS and EOS as the vocabulary adds them, as llama_tokenize
 * with add_special) and the bytes lm_decode gives each back (prev -1: no
 * space dropped, as llama_token_to_piece with lstrip 0).
 *
 *   lm_tokenize MODEL.gguf FILE...
 *   lm_tokenize --tokenizer TOKENIZER.bin FILE...
 *
 * Exit 1 with one line when the vocabulary or a file is refused.
 */
#include "lm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "--tokenizer") == 0 && argc < 4)) {
        fprintf(stderr, "usage: lm_tokenize MODEL.gguf FILE... | --tokenizer TOK FILE...\n");
        return 2;
    }
    lm_tokenizer *t = NULL;
    lm_model *m = NULL;
    int first = 2;
    kve_status st;
    if (strcmp(argv[1], "--tokenizer") == 0) {
        st = lm_tokenizer_open(argv[2], NULL, &t);
        first = 3;
    } else {
        st = lm_model_open(argv[1], NULL, &m);
        if (st == KVE_OK)
            st = lm_tokenizer_from_model(m, NULL, &t);
    }
    if (st != KVE_OK) {
        fprintf(stderr, "lm_tokenize: %s\n", kve_last_error());
        return 1;
    }
    int rc = 0;
    for (int a = first; a < argc && rc == 0; a++) {
        char *text = NULL;
        size_t n = 0, k = 0;
        st = lm_read_file(NULL, argv[a], &text, &n);
        size_t cap = st == KVE_OK ? lm_encode_bound(t, n) + 2 : 0;
        int32_t *ids = st == KVE_OK ? malloc(cap * sizeof *ids) : NULL;
        if (st == KVE_OK && !ids)
            st = kve_set_error(KVE_ENOMEM, "out of memory");
        if (st == KVE_OK)
            st = lm_tokenize(t, text, n, ids, cap, &k);
        if (st != KVE_OK) {
            fprintf(stderr, "lm_tokenize: %s: %s\n", argv[a], kve_last_error());
            rc = 1;
        } else {
            fputs("ids ", stdout);
            for (size_t i = 0; i < k; i++)
                printf(i ? ",%d" : "%d", ids[i]);
            fputs("\ntext ", stdout);
            for (size_t i = 0; i < k; i++) {
                size_t len;
                const char *p = lm_decode(t, -1, ids[i], &len);
                for (size_t j = 0; j < len; j++)
                    printf("%02x", (unsigned char)p[j]);
            }
            fputc('\n', stdout);
        }
        free(ids);
        lm_free(NULL, text);
    }
    lm_tokenizer_free(t);
    lm_model_free(m);
    return rc;
}
