/* SPDX-License-Identifier: MIT */
/*
 * llama_plain.c - plain llama.cpp, as any program calls it (linked against
 * the pinned libllama, no eval callback, no kvevict): decodes a token list
 * from position 0, BATCH tokens a llama_decode (default 1: one token at a
 * time), and prints every position's logits as `kvevict-llama logits`
 * does. test_llama.sh holds kvevict-llama's full-cache logits to these, bit
 * for bit, at the same batch size (llama.cpp's batched logits are not its
 * one-token ones bit for bit: its kernels for several rows are others).
 *
 *   llama_plain LIBDIR MODEL ID,ID,... [THREADS [BATCH | prompt | decode]]
 *   llama_plain LIBDIR --features
 *
 * THREADS (default 1): llama.cpp's threads (bench/lm_vs_llama.sh times it).
 * BATCH (default 1): n_batch = n_ubatch, the tokens of one llama_decode.
 * prompt: the tokens as one prompt instead, as llama.cpp reads one (a
 * single llama_decode of them all, n_batch and n_ubatch the prompt's
 * length, the last token's logits only), after a warm-up decode of the
 * first token (the weights' pages read in) and a cleared cache; prints
 * {"tokens": N, "threads": T, "seconds": S, "cpu_seconds": C}, S the wall
 * time of that llama_decode (bench/lm_vs_llama.sh's prompt table), C the
 * process's CPU time in it (every thread's).
 * decode: the tokens one llama_decode each (every token's logits), after the
 * same warm-up and cleared cache; prints the same object, S the wall time
 * of those decodes (bench/lm_vs_llama.sh's decode table: start-up and
 * loading outside the clock).
 * --features prints the features of the CPU back end ggml loaded from
 * LIBDIR (the variant it chose for this machine: AVX2, AVX512,
 * AVX512_BF16, AMX_INT8, ...) on one line, separated by spaces; test_llama.sh
 * reads whether the decoder's --products llama follows that variant.
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
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: llama_plain LIBDIR MODEL ID,ID,... [THREADS [BATCH | prompt | decode]]\n"
                        "       llama_plain LIBDIR --features\n");
        return 2;
    }
    const int prompt = argc == 6 && strcmp(argv[5], "prompt") == 0,
              timed = argc == 6 && strcmp(argv[5], "decode") == 0;
    const int threads = argc >= 5 ? atoi(argv[4]) : 1,
              B = argc == 6 && !prompt && !timed ? atoi(argv[5]) : 1;
    if (threads < 1 || threads > 256 || B < 1 || B > 4096) {
        fprintf(stderr, "llama_plain: THREADS %s is not 1 .. 256 or BATCH %s not 1 .. 4096\n",
                argv[4], argc == 6 ? argv[5] : "1");
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
    cp.n_batch = cp.n_ubatch = prompt ? (uint32_t)n : (uint32_t)B;
    cp.n_threads = cp.n_threads_batch = threads;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx)
        return 1;
    if (prompt || timed) {
        if (llama_decode(ctx, llama_batch_get_one(toks, 1)) != 0)
            return 1;
        llama_memory_clear(llama_get_memory(ctx), true);
        struct timespec t0, t1, c0, c1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        if (prompt && llama_decode(ctx, llama_batch_get_one(toks, n)) != 0)
            return 1;
        float sink = 0; /* each token's logits read, as a caller would */
        for (int32_t t = 0; timed && t < n; t++) {
            if (llama_decode(ctx, llama_batch_get_one(toks + t, 1)) != 0)
                return 1;
            sink += llama_get_logits_ith(ctx, -1)[0];
        }
        if (sink == 42.0f)
            fputs(" ", stderr);
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
    struct llama_batch b = llama_batch_init(B, 0, 1);
    for (int32_t t = 0; t < n; t += B) {
        const int32_t k = n - t < B ? n - t : B;
        for (int32_t i = 0; i < k; i++) { /* every token's logits */
            b.token[i] = toks[t + i], b.pos[i] = t + i, b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0, b.logits[i] = 1;
        }
        b.n_tokens = k;
        if (llama_decode(ctx, b) != 0)
            return 1;
        for (int32_t i = 0; i < k; i++) {
            const float *lg = llama_get_logits_ith(ctx, i);
            printf("{\"pos\": %d, \"token\": %d, \"logits\": [", t + i, toks[t + i]);
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
    }
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(m);
    llama_backend_free();
    return 0;
}
