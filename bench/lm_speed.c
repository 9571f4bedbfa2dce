/*
 * lm_speed.c - decoder speed: tokens per second of the llama2.c decoder with
 * no policy and with every policy, the share of decode time spent on cache
 * bookkeeping (policy step, eviction, compaction), and the matrix kernel
 * against a plain serial loop and, when the machine has it, OpenBLAS.
 *
 * Usage: kvevict-lm-speed [--json] [CKPT [STEPS]]
 *   CKPT   a llama2.c checkpoint; "-" or absent: random weights of the shape
 *          of models/ (dim 128, hidden 384, 4 layers, 4 heads over 2 KV
 *          heads, vocabulary 1088, context 512), built in memory
 *   STEPS  positions decoded per run (default 2 * seq_len, so the bounded
 *          caches run in their steady state for half of the run)
 *   --json one JSON object per line per (policy, positions) instead of the
 *          report, and no kernel comparison: policy ("none" without one),
 *          positions, budget (null without a policy), steps,
 *          tokens_per_second, bookkeeping_share (docs/real-model.md renders
 *          them; a timing, never drift-checked)
 * Policies run at a budget of 20% of the context. Times are the thread's CPU
 * time, so other jobs on the machine do not count. Tokens per second come
 * from runs without timing; the bookkeeping share from a run with
 * lm_options.timing, which reads the CPU clock twice a layer: the cost of a
 * reading, calibrated here, is taken off both the bookkeeping and the run.
 * Each figure is the best of three runs. Speed is measured, never asserted; the
 * numbers depend on the machine.
 *
 * OpenBLAS is loaded with dlopen (libopenblas.so.0) only to compare
 * cblas_sgemv with the decoder's kernel on the model's matrix shapes, one
 * thread; the decoder itself never uses it (docs/decoder.md says why).
 */
#define _POSIX_C_SOURCE 200809L
#include "lm.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU time of this thread: on a shared machine, time spent waiting for a
 * core is not the decoder's. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "kvevict-lm-speed: %s: %s\n", what, kve_last_error());
    exit(1);
}

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* A version-1 image with random weights (tied classifier). */
static void *random_model(size_t *size)
{
    enum { D = 128, F = 384, L = 4, H = 4, G = 2, V = 1088, T = 512, S = D / H };
    size_t n = (size_t)2 * L * D + D + (size_t)V * D + (size_t)L * D * D * 2 +
               (size_t)2 * L * G * S * D + (size_t)3 * L * F * D;
    *size = 256 + 4 * n;
    unsigned char *img = calloc(1, *size);
    if (!img)
        return NULL;
    int32_t head[9] = {0x616b3432, 1, D, F, L, H, G, V, T};
    memcpy(img, head, sizeof head);
    img[36] = 1;
    float *w = (float *)(void *)(img + 256);
    uint64_t s = 1;
    for (size_t i = 0; i < n; i++) /* uniform in [-0.1, 0.1); norms near 1 */
        w[i] = (float)((double)(mix(&s) >> 11) * 0x1.0p-53 * 0.2 - 0.1) +
               (i < (size_t)2 * L * D + D ? 1.0f : 0.0f);
    return img;
}

/* Seconds one reading of the thread's CPU clock adds to a measured window. */
static double clock_cost(void)
{
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        for (int i = 0; i < 1000; i++)
            (void)now_s();
        double dt = (now_s() - t0) / 1000;
        best = dt < best ? dt : best;
    }
    return best;
}

static double one_run(const lm_model *m, const char *spec, size_t budget, lm_positions pos,
                      size_t steps, int timing, double *bookkeeping)
{
    lm_options o = {
        .policy = spec, .budget = spec ? budget : 0, .positions = pos, .timing = timing};
    lm_state *s = NULL;
    if (lm_state_new(m, &o, &s) != KVE_OK)
        die(spec ? spec : "decoder");
    double t0 = now_s();
    for (size_t t = 0; t < steps; t++)
        if (lm_forward(s, (int32_t)((t * 7919) % (size_t)m->config.vocab_size)) != KVE_OK)
            die("decode");
    double dt = now_s() - t0;
    *bookkeeping = s->bookkeeping_s;
    lm_state_free(s);
    return dt;
}

static int json; /* --json */

static void run(const lm_model *m, const char *spec, size_t budget, lm_positions pos, size_t steps,
                double reading)
{
    double best = 1e30, share = 1e30, bk;
    size_t windows = spec ? steps * (size_t)m->config.n_layers : 0;
    for (int rep = 0; rep < 3; rep++) {
        double dt = one_run(m, spec, budget, pos, steps, 0, &bk);
        best = dt < best ? dt : best;
        dt = one_run(m, spec, budget, pos, steps, 1, &bk);
        double sh = (bk - (double)windows * reading) / (dt - 2.0 * (double)windows * reading);
        share = sh < share ? sh : share;
    }
    if (json) {
        printf("{\"policy\": \"%s\", \"positions\": \"%s\", \"budget\": ", spec ? spec : "none",
               pos == LM_POS_CACHE ? "cache" : "original");
        if (spec)
            printf("%zu", budget);
        else
            printf("null");
        printf(", \"steps\": %zu, \"tokens_per_second\": %.1f, \"bookkeeping_share\": %.4f}\n",
               steps, (double)steps / best, share > 0 ? share : 0);
        return;
    }
    printf("%-36s %-9s %10.0f %12.1f%%\n", spec ? spec : "(none: every key kept)",
           pos == LM_POS_CACHE ? "cache" : "original", (double)steps / best,
           100.0 * (share > 0 ? share : 0));
}

typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);

/* Work proportional to `steps`: 2e4 multiply-adds a step per shape. */
static void kernels(const lm_model *m, size_t steps)
{
    const lm_config *c = &m->config;
    struct {
        const char *name;
        size_t d, n;
        const float *w;
    } shapes[] = {
        {"wq (D, D)", (size_t)c->dim, (size_t)c->dim, m->weights.wq},
        {"w1 (F, D)", (size_t)c->hidden_dim, (size_t)c->dim, m->weights.w1},
        {"w2 (D, F)", (size_t)c->dim, (size_t)c->hidden_dim, m->weights.w2},
        {"classifier (V, D)", (size_t)c->vocab_size, (size_t)c->dim, m->weights.wcls},
    };
    void *blas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    sgemv_fn sgemv = NULL;
    void (*set_threads)(int) = NULL;
    if (blas) {
        *(void **)&sgemv = dlsym(blas, "cblas_sgemv");
        *(void **)&set_threads = dlsym(blas, "openblas_set_num_threads");
        if (set_threads)
            set_threads(1);
    }
    printf("\nmatrix kernel, ns per matrix-vector product (best of 5):\n");
    printf("%-20s %12s %12s %12s\n", "shape", "serial", "lm_matmul", sgemv ? "OpenBLAS" : "");
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        size_t d = shapes[k].d, n = shapes[k].n;
        float *x = malloc(n * sizeof *x), *y = malloc(d * sizeof *y);
        for (size_t i = 0; i < n; i++)
            x[i] = (float)i / (float)n;
        size_t reps = (size_t)(2e4 * (double)steps / (double)(d * n)) + 3;
        double best[3] = {1e30, 1e30, 1e30};
        for (int r = 0; r < 5; r++) {
            double t0 = now_s();
            for (size_t q = 0; q < reps; q++)
                for (size_t i = 0; i < d; i++) {
                    float acc = 0;
                    for (size_t j = 0; j < n; j++)
                        acc += shapes[k].w[i * n + j] * x[j];
                    y[i] = acc;
                }
            double t1 = now_s();
            for (size_t q = 0; q < reps; q++)
                lm_matmul(y, x, shapes[k].w, n, d);
            double t2 = now_s();
            if (sgemv)
                for (size_t q = 0; q < reps; q++)
                    sgemv(101, 111, (int)d, (int)n, 1.0f, shapes[k].w, (int)n, x, 1, 0.0f, y, 1);
            double t3 = now_s();
            best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
            best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
            best[2] = t3 - t2 < best[2] ? t3 - t2 : best[2];
        }
        printf("%-20s %12.0f %12.0f", shapes[k].name, 1e9 * best[0] / (double)reps,
               1e9 * best[1] / (double)reps);
        if (sgemv)
            printf(" %12.0f", 1e9 * best[2] / (double)reps);
        printf("\n");
        free(x);
        free(y);
    }
    if (!blas)
        printf("(libopenblas.so.0 not found: no OpenBLAS column)\n");
    else
        dlclose(blas);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--json") == 0) {
        json = 1;
        argv++;
        argc--;
    }
    lm_model *m = NULL;
    void *img = NULL;
    const char *src = argc > 1 && strcmp(argv[1], "-") != 0 ? argv[1] : NULL;
    if (src) {
        if (lm_model_open(src, NULL, &m) != KVE_OK)
            die(src);
    } else {
        size_t size;
        if (!(img = random_model(&size)) || lm_model_from_memory(img, size, NULL, &m) != KVE_OK)
            die("random model");
    }
    const lm_config *c = &m->config;
    size_t steps = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 2 * (size_t)c->seq_len;
    size_t budget = (size_t)c->seq_len / 5;
    if (budget < 40)
        budget = 40;
    if (!json) {
        printf("model %s: dim %d, hidden %d, layers %d, heads %d over %d KV heads, vocab %d, "
               "context %d\n%zu positions per run, policies at budget %zu\n\n",
               src ? src : "(random weights)", c->dim, c->hidden_dim, c->n_layers, c->n_heads,
               c->n_kv_heads, c->vocab_size, c->seq_len, steps, budget);
        printf("%-36s %-9s %10s %13s\n", "policy", "positions", "tokens/s", "bookkeeping");
    }
    double reading = clock_cost();
    run(m, NULL, 0, LM_POS_ORIGINAL, steps, reading);
    /* The decoder hands its policies attention and keys; a policy that also
     * reads queries or values (expected_attention) is not run by it yet. */
    for (size_t i = 0; i < kve_policy_type_count(); i++)
        if (!(kve_policy_type_reads(i) & (KVE_READS_QUERIES | KVE_READS_VALUES)))
            run(m, kve_policy_type_name(i), budget, LM_POS_ORIGINAL, steps, reading);
    run(m, "window", budget, LM_POS_CACHE, steps, reading);
    run(m, "streaming", budget, LM_POS_CACHE, steps, reading);
    run(m, "h2o", budget, LM_POS_CACHE, steps, reading);
    if (!json) {
        printf("(bookkeeping: policy step + eviction + compaction, share of CPU time; one clock\n"
               " reading, %.0f ns, taken off each of the %d readings a step)\n",
               1e9 * reading, 2 * c->n_layers);
        kernels(m, steps);
    }
    lm_model_free(m);
    free(img);
    return 0;
}
