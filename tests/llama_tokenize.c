/* SPDX-License-Identifier: MIT */
/*
 * llama_tokenize.c - llama.cpp's tokenizer, as any program calls it
 * (linked against the pinned libllama, the vocabulary alone loaded): for
 * each file, the ids of llama_tokenize(add_special = true, parse_special =
 * false) and the bytes llama_token_to_piece(lstrip 0, special = false)
 * gives them back, in the lines tests/lm_tokenize.c prints for the decoder's
 * tokenizer (test_tokenize_llama.sh compares the two):
 *
 *   ids ID,ID,...      (nothing after "ids " for no token)
 *   text HEX           (the pieces' bytes, two hex digits each)
 *
 *   llama_tokenize LIBDIR MODEL FILE...
 */
#include <ggml-backend.h>
#include <llama.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

static char *slurp(const char *path, long *n)
{
    FILE *f = fopen(path, "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0 || (*n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        if (f)
            fclose(f);
        return NULL;
    }
    char *b = malloc((size_t)*n + 1);
    if (b && fread(b, 1, (size_t)*n, f) != (size_t)*n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: llama_tokenize LIBDIR MODEL FILE...\n");
        return 2;
    }
    llama_log_set(quiet, NULL);
    ggml_backend_load_all_from_path(argv[1]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *m = llama_model_load_from_file(argv[2], mp);
    if (!m) {
        fprintf(stderr, "llama_tokenize: %s: llama.cpp cannot load it\n", argv[2]);
        return 1;
    }
    const struct llama_vocab *v = llama_model_get_vocab(m);
    for (int a = 3; a < argc; a++) {
        long n;
        char *text = slurp(argv[a], &n);
        if (!text || n > (1L << 26)) {
            fprintf(stderr, "llama_tokenize: cannot read %s\n", argv[a]);
            return 1;
        }
        int32_t cap = (int32_t)(4 * n + 8);
        llama_token *ids = malloc((size_t)cap * sizeof *ids);
        int32_t k = ids ? llama_tokenize(v, text, (int32_t)n, ids, cap, true, false) : -1;
        if (k < 0) {
            fprintf(stderr, "llama_tokenize: %s: llama_tokenize failed (%d)\n", argv[a], k);
            return 1;
        }
        fputs("ids ", stdout);
        for (int32_t i = 0; i < k; i++)
            printf(i ? ",%d" : "%d", ids[i]);
        fputs("\ntext ", stdout);
        for (int32_t i = 0; i < k; i++) {
            char piece[4096];
            int32_t len = llama_token_to_piece(v, ids[i], piece, sizeof piece, 0, false);
            for (int32_t j = 0; j < len; j++)
                printf("%02x", (unsigned char)piece[j]);
        }
        fputc('\n', stdout);
        free(ids);
        free(text);
    }
    llama_model_free(m);
    llama_backend_free();
    return 0;
}
