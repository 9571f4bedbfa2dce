/* SPDX-License-Identifier: MIT */
/*
 * llama_plain.c - plain llama.cpp, as any program calls it (linked against
 * the pinned libllama, no eval callback, no kvevict): decodes a token list
 * one token at a time from position 0 and prints every position's logits
 * as `kvevict-llama logits` does. test_llama.sh holds kvevict-llama's
 * full-cache logits to these, bit for bit.
 *
 *   llama_plain LIBDIR MODEL ID,ID,... [THREADS [prompt]]
 *
 * THREADS (default 1): llama.cpp's threads (bench/lm_vs_llama.sh times it).
 * prompt: the tokens as one prompt instead, as llama.cpp reads one (a
 * single llama_decode of them all, n_batch and n_ubatch the prompt's
 * length, the last token's logits only), after a warm-up decode of the
 * first token (the weights' pages read in) and a cleared cache; prints
 * {"tokens": N, "threads": T, "seconds": S, "cpu_seconds": C}, S the wall
 * time of that llama_decode (bench/lm_vs_llama.sh's prompt table), C the
 * process's CPU time in it (every thread's).
 */
#define _POSIX_C_SOURCE 200809L
#include <ggml-backend.h>
#include <llama.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

int main(int argc, char **argv)
{
    const int prompt = argc == 6 && strcmp(argv[5], "prompt") == 0;
    if ((argc != 4 && argc != 5 && !prompt)) {
        fprintf(stderr, "usage: llama_plain LIBDIR MODEL ID,ID,... [THREADS [prompt]]\n");
        return 2;
    }
    const int threads = argc >= 5 ? atoi(argv[4]) : 1;
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
    cp.n_batch = cp.n_ubatch = prompt ? (uint32_t)n : 1;
    cp.n_threads = cp.n_threads_batch = threads;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx)
        return 1;
    if (prompt) {
        if (llama_decode(ctx, llama_batch_get_one(toks, 1)) != 0)
            return 1;
        llama_memory_clear(llama_get_memory(ctx), true);
        struct timespec t0, t1, c0, c1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        if (llama_decode(ctx, llama_batch_get_one(toks, n)) != 0)
            return 1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("{\"tokens\": %d, \"threads\": %d, \"seconds\": %.6f, \"cpu_seconds\": %.6f}\n",
               n, threads, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
               (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec));
        llama_free(ctx);
        llama_model_free(m);
        llama_backend_free();
        return 0;
    }
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
