/* SPDX-License-Identifier: MIT */
/*
 * llama_plain.c - plain llama.cpp, as any program calls it (linked against
 * the pinned libllama, no eval callback, no kvevict): decodes a token list
 * one token at a time from position 0 and prints every position's logits
 * as `kvevict-llama logits` does. test_llama.sh holds kvevict-llama's
 * full-cache logits to these, bit for bit.
 *
 *   llama_plain LIBDIR MODEL ID,ID,... [THREADS]
 *   llama_plain LIBDIR --features
 *
 * THREADS (default 1): llama.cpp's threads (bench/lm_vs_llama.sh times it).
 * --features prints the features of the CPU back end ggml loaded from
 * LIBDIR (the variant it chose for this machine: AVX2, AVX512,
 * AVX512_BF16, AMX_INT8, ...) on one line, separated by spaces; test_llama.sh
 * reads whether the decoder's --products llama follows that variant.
 */
#include <ggml-backend.h>
#include <llama.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* The loaded CPU back end's features with value "1", on one line. */
static int features(void)
{
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("CPU");
    void *proc = reg ? ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features") : NULL;
    ggml_backend_get_features_t get = NULL;
    memcpy(&get, &proc, sizeof get); /* a function's address as dlsym gives it */
    if (!get) {
        fprintf(stderr, "llama_plain: no CPU back end with features was loaded\n");
        return 1;
    }
    const char *sep = "";
    for (struct ggml_backend_feature *f = get(reg); f->name; f++)
        if (strcmp(f->value, "1") == 0)
            printf("%s%s", sep, f->name), sep = " ";
    putchar('\n');
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[2], "--features") == 0) {
        llama_log_set(quiet, NULL);
        ggml_backend_load_all_from_path(argv[1]);
        return features();
    }
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: llama_plain LIBDIR MODEL ID,ID,... [THREADS]\n"
                        "       llama_plain LIBDIR --features\n");
        return 2;
    }
    const int threads = argc == 5 ? atoi(argv[4]) : 1;
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "llama_plain: THREADS %s is not 1 .. 256\n", argv[4]);
        return 2;
    }
    llama_log_set(quiet, NULL);
    ggml_backend_load_all_from_path(argv[1]);
    llama_backend_init();
    struct llama_model *m = llama_model_load_from_file(argv[2], llama_model_default_params());
    if (!m)
        return 1;
    int32_t toks[4096], n = 0;
    for (char *p = argv[3]; *p && n < 4096; p += *p == ',')
        toks[n++] = (int32_t)strtol(p, &p, 10);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n;
    cp.n_batch = cp.n_ubatch = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx)
        return 1;
    const int32_t V = llama_vocab_n_tokens(llama_model_get_vocab(m));
    for (int32_t t = 0; t < n; t++) {
        if (llama_decode(ctx, llama_batch_get_one(&toks[t], 1)) != 0)
            return 1;
        const float *lg = llama_get_logits_ith(ctx, -1);
        printf("{\"pos\": %d, \"token\": %d, \"logits\": [", t, toks[t]);
        for (int32_t v = 0; v < V; v++) {
            if (v)
                fputs(", ", stdout);
            if (isfinite(lg[v]))
                printf("%.9g", (double)lg[v]);
            else
                fputs("null", stdout);
        }
        fputs("]}\n", stdout);
    }
    llama_free(ctx);
    llama_model_free(m);
    llama_backend_free();
    return 0;
}
