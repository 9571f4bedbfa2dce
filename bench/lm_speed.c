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
 *
 * Usage: kvevict-lm-speed --prompt CKPT ID,ID,... [THREADS [PRODUCTS [BATCH]]]
 *   The tokens read as one prompt (lm_forward_batch, blocks of BATCH, default
 *   lm's), after a warm-up step of the first token (the weights' pages read
 *   in) and a reset, on THREADS threads (1) with PRODUCTS exact or llama
 *   (exact; llama reads Q4_K from its packed copy, as the CLI does); prints {"tokens": N, "threads": T, "products": P, "batch": B,
 *   "seconds": S, "cpu_seconds": C}, S the wall time of the prompt, C the
 *   process's CPU time in it: llama_plain's prompt mode for the decoder
 *   (bench/lm_vs_llama.sh).
 *
 * Usage: kvevict-lm-speed --decode CKPT ID,ID,... [THREADS [PRODUCTS]]
 *   The tokens one lm_forward each, after the same warm-up and reset, with
 *   the same options; prints the same object (batch 1), S the wall time of
 *   those steps: llama_plain's decode mode for the decoder.
 *
 * Usage: kvevict-lm-speed --weights [--dir DIR] [--types T,...] [--threads N,...]
 *                         [--tokens N] [--json]
 *   Weight types at TinyLlama's shape (22 layers, dim 2048, 32 heads over 4
 *   KV heads, hidden 5632, vocabulary 32000, untied classifier; random
 *   weights written as GGUF files in DIR, default /tmp, one type at a time,
 *   each removed after its runs; F32 is 4.4 GB): tokens per second, and the
 *   fraction of the memory-bandwidth floor reached: the bytes of weights a
 *   token reads (every matrix once, the embedding row, the norms) over the
 *   floor's bandwidth measured in the same run for the same number of
 *   threads (the best of several readers, prefetch distances and 1 to that
 *   many threads: stream_bandwidth; before and after the runs), against the
 *   time a token takes. Types default to
 *   f32,f16,q8_0,q4_k, threads to 1,2, tokens to 8 (after 2 of warm-up; best
 *   of 3 runs). One thread is timed in the thread's CPU time (waiting on
 *   memory counts, other jobs on a shared machine do not), the bandwidth
 *   with one thread too; two threads in wall time, their bandwidth too.
 *
 * Usage: kvevict-lm-speed --floor [--threads N,...] [--json] GGUF...
 *   The floor of decoding each file: its bytes a token (as above) over the
 *   floor's bandwidth for each thread count (default 1,2), in tokens per
 *   second; bench/lm_vs_llama.sh puts it beside llama.cpp's rate, which
 *   must never exceed it.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise */
#include "lm.h"

#define BENCH_NAME "kvevict-lm-speed"
#include "bench.h"

#include "gguf_write.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

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
    struct {
        const char *name;
        const lm_matrix *m;
    } shapes[] = {
        {"wq (D, D)", &m->weights.layer[0].wq},
        {"w1 (F, D)", &m->weights.layer[0].w1},
        {"w2 (D, F)", &m->weights.layer[0].w2},
        {"classifier (V, D)", &m->weights.wcls},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        if (shapes[k].m->type != LM_F32)
            return; /* the comparison is of float32 kernels (no quantized input) */
    void *blas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    sgemv_fn sgemv = NULL;
    void (*set_threads)(int) = NULL;
    if (blas) {
        *(void **)&sgemv = dlsym(blas, "cblas_sgemv");
        *(void **)&set_threads = dlsym(blas, "openblas_set_num_threads");
        if (set_threads)
            set_threads(1);
    }
    printf("\nmatrix kernel, ns per matrix-vector product (best of 5; lm_matmul is the\n"
           "reference the compiler vectorises for baseline x86-64, %s the decoder's kernel,\n"
           "the same bits):\n", lm_isa_name(lm_isa_active()));
    printf("%-20s %12s %12s %12s %12s\n", "shape", "serial", "lm_matmul",
           lm_isa_name(lm_isa_active()), sgemv ? "OpenBLAS" : "");
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        size_t d = shapes[k].m->rows, n = shapes[k].m->cols;
        const float *wf = shapes[k].m->data;
        float *x = malloc(n * sizeof *x), *y = malloc(d * sizeof *y);
        for (size_t i = 0; i < n; i++)
            x[i] = (float)i / (float)n;
        size_t reps = (size_t)(2e4 * (double)steps / (double)(d * n)) + 3;
        double best[4] = {1e30, 1e30, 1e30, 1e30};
        for (int r = 0; r < 5; r++) {
            double t0 = now_s();
            for (size_t q = 0; q < reps; q++)
                for (size_t i = 0; i < d; i++) {
                    float acc = 0;
                    for (size_t j = 0; j < n; j++)
                        acc += wf[i * n + j] * x[j];
                    y[i] = acc;
                }
            double t1 = now_s();
            for (size_t q = 0; q < reps; q++)
                lm_matmul(y, x, wf, n, d);
            double t2 = now_s();
            for (size_t q = 0; q < reps; q++)
                lm_matvec_rows(shapes[k].m, x, NULL, y, 0, d, LM_ISA_COUNT);
            double t3 = now_s();
            if (sgemv)
                for (size_t q = 0; q < reps; q++)
                    sgemv(101, 111, (int)d, (int)n, 1.0f, wf, (int)n, x, 1, 0.0f, y, 1);
            double t4 = now_s();
            best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
            best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
            best[2] = t3 - t2 < best[2] ? t3 - t2 : best[2];
            best[3] = t4 - t3 < best[3] ? t4 - t3 : best[3];
        }
        printf("%-20s %12.0f %12.0f %12.0f", shapes[k].name, 1e9 * best[0] / (double)reps,
               1e9 * best[1] / (double)reps, 1e9 * best[2] / (double)reps);
        if (sgemv)
            printf(" %12.0f", 1e9 * best[3] / (double)reps);
        printf("\n");
        free(x);
        free(y);
    }
    if (!blas)
        printf("(libopenblas.so.0 not found: no OpenBLAS column)\n");
    else
        dlclose(blas);
}

/* ---- --weights: the stored types at TinyLlama's shape ---- */

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the memory-bandwidth floor ----
 *
 * A floor is a bound nothing reading the same bytes can beat, so it is the
 * best read bandwidth over every way of reading this code knows, as STREAM
 * and its successors take the best of their kernels: each kernel below, with
 * no software prefetch and with prefetches 256 bytes, 1 KiB and 4 KiB ahead, on 1 to T
 * threads for a run on T threads (more readers can only help a floor), best
 * of 3 passes over a 1 GiB buffer each, in pages of 2 MB where the kernel
 * grants them (the weights' file mappings get them too). A pass's bytes are the bytes the
 * kernel read; the result is kept so the reads cannot be optimised away. */

typedef uint64_t (*read_fn)(const unsigned char *p, size_t n, size_t ahead);

static uint64_t read_words(const unsigned char *p, size_t n, size_t ahead)
{
    (void)ahead;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        uint64_t v[4];
        memcpy(v, p + i, 32);
        s0 += v[0], s1 += v[1], s2 += v[2], s3 += v[3];
    }
    return s0 + s1 + s2 + s3;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BW_X86 1
/* Eight interleaved streams, each a contiguous eighth, 64 bytes a stream a
 * round: the access pattern of products that read eight rows at a time. */
__attribute__((target("avx2"))) static uint64_t read8_avx2(const unsigned char *p, size_t n,
                                                           size_t ahead)
{
    __m256i acc[8];
    for (int k = 0; k < 8; k++)
        acc[k] = _mm256_setzero_si256();
    size_t part = n / 8 / 64 * 64;
    for (size_t i = 0; i < part; i += 64)
        for (int k = 0; k < 8; k++) {
            const unsigned char *q = p + (size_t)k * part + i;
            if (ahead && i + ahead < part)
                _mm_prefetch((const char *)(q + ahead), _MM_HINT_T0);
            const __m256i *v = (const __m256i *)(const void *)q;
            acc[k] = _mm256_add_epi64(acc[k], _mm256_add_epi64(_mm256_load_si256(v),
                                                               _mm256_load_si256(v + 1)));
        }
    for (int k = 1; k < 8; k++)
        acc[0] = _mm256_add_epi64(acc[0], acc[k]);
    return (uint64_t)_mm256_extract_epi64(acc[0], 0) + (uint64_t)_mm256_extract_epi64(acc[0], 3);
}

/* One contiguous stream of 32-byte loads, 64 bytes a round into two
 * accumulators, or 128 into four (wide). */
__attribute__((target("avx2"))) static inline uint64_t read1_256(const unsigned char *p, size_t n,
                                                                 size_t ahead, int wide)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    const size_t step = wide ? 128 : 64, end = n / step * step;
    for (size_t i = 0; i < end; i += step) {
        if (ahead && i + ahead < end)
            _mm_prefetch((const char *)(p + i + ahead), _MM_HINT_T0);
        const __m256i *v = (const __m256i *)(const void *)(p + i);
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(v));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + 1));
        if (wide) {
            if (ahead && i + ahead < end)
                _mm_prefetch((const char *)(p + i + ahead + 64), _MM_HINT_T0);
            a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + 2));
            a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + 3));
        }
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0) + (uint64_t)_mm256_extract_epi64(a0, 3);
}

__attribute__((target("avx2"))) static uint64_t read1_avx2(const unsigned char *p, size_t n,
                                                           size_t ahead)
{
    return read1_256(p, n, ahead, 0);
}

__attribute__((target("avx2"))) static uint64_t read1_avx2_wide(const unsigned char *p, size_t n,
                                                                size_t ahead)
{
    return read1_256(p, n, ahead, 1);
}

/* One contiguous stream, 256 bytes a round into four accumulators. */
__attribute__((target("avx512f"))) static uint64_t read1_avx512(const unsigned char *p, size_t n,
                                                                size_t ahead)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    size_t end = n / 256 * 256;
    for (size_t i = 0; i < end; i += 256) {
        if (ahead && i + ahead < end) {
            _mm_prefetch((const char *)(p + i + ahead), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + i + ahead + 128), _MM_HINT_T0);
        }
        const __m512i *v = (const __m512i *)(const void *)(p + i);
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(v));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(v + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(v + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(v + 3));
    }
    return (uint64_t)_mm512_reduce_add_epi64(
        _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
}

/* Eight interleaved streams of 64-byte loads, as read8_avx2 with 512-bit
 * registers. */
__attribute__((target("avx512f"))) static uint64_t read8_avx512(const unsigned char *p, size_t n,
                                                                size_t ahead)
{
    __m512i acc[8];
    for (int k = 0; k < 8; k++)
        acc[k] = _mm512_setzero_si512();
    size_t part = n / 8 / 64 * 64;
    for (size_t i = 0; i < part; i += 64)
        for (int k = 0; k < 8; k++) {
            const unsigned char *q = p + (size_t)k * part + i;
            if (ahead && i + ahead < part)
                _mm_prefetch((const char *)(q + ahead), _MM_HINT_T0);
            acc[k] = _mm512_add_epi64(acc[k], _mm512_load_si512((const void *)q));
        }
    for (int k = 1; k < 8; k++)
        acc[0] = _mm512_add_epi64(acc[0], acc[k]);
    return (uint64_t)_mm512_reduce_add_epi64(acc[0]);
}
#else
#define BW_X86 0
#endif

static const struct {
    const char *name;
    read_fn fn;
    lm_isa isa; /* needed by the kernel */
} readers[] = {
    {"words", read_words, LM_ISA_SCALAR},
#if BW_X86
    {"avx2 x8", read8_avx2, LM_ISA_AVX2},
    {"avx2 x1", read1_avx2, LM_ISA_AVX2},
    {"avx2 x1 wide", read1_avx2_wide, LM_ISA_AVX2},
    {"avx512 x1", read1_avx512, LM_ISA_AVX512},
    {"avx512 x8", read8_avx512, LM_ISA_AVX512},
#endif
};

typedef struct stream_job {
    const unsigned char *p;
    size_t n;
    read_fn fn;
    size_t ahead;
    uint64_t sum[LM_MAX_THREADS];
} stream_job;

static void stream_part(void *arg, size_t part, size_t parts)
{
    stream_job *j = arg;
    size_t chunk = j->n / parts / 512 * 512;
    j->sum[part] += j->fn(j->p + part * chunk, chunk, j->ahead);
}

typedef struct floor_bw {
    double bytes_per_s; /* the best */
    const char *kernel; /* how it was reached */
    size_t ahead, threads;
} floor_bw;

/* The floor's bandwidth for a run on `threads` threads: the best over the
 * readers, prefetch distances and 1 to `threads` threads (above). */
static floor_bw stream_bandwidth(size_t threads)
{
    floor_bw best = {0, "none", 0, 0};
    size_t n = (size_t)1 << 30;
    unsigned char *p = aligned_alloc((size_t)2 << 20, n);
    if (!p)
        return best;
#ifdef MADV_HUGEPAGE
    /* pages of 2 MB where the kernel has them, as a model's file mapping
     * gets them (llama.cpp's and the decoder's weights are mapped so on a
     * filesystem with large folios): small pages would cost the readers
     * their TLB misses and a prefetch stopped at every 4 KB, which the
     * weights do not pay */
    madvise(p, n, MADV_HUGEPAGE);
#endif
    memset(p, 1, n);
    stream_job *j = calloc(1, sizeof *j);
    if (!j)
        die("floor");
    j->p = p;
    j->n = n;
    static const size_t aheads[] = {0, 256, 1024, 4096};
    for (size_t t = 1; t <= threads; t++) {
        lm_pool *pool = NULL;
        if (t > 1 && lm_pool_new(t, NULL, &pool) != KVE_OK)
            die("threads");
        for (size_t k = 0; k < sizeof readers / sizeof readers[0]; k++) {
            if (!lm_isa_supported(readers[k].isa))
                continue;
            for (size_t a = 0; a < sizeof aheads / sizeof aheads[0]; a++) {
                if (readers[k].fn == read_words && aheads[a])
                    continue; /* no prefetch in plain C */
                j->fn = readers[k].fn;
                j->ahead = aheads[a];
                for (int r = 0; r < 3; r++) {
                    double t0 = t > 1 ? wall_s() : now_s();
                    lm_pool_run(pool, stream_part, j);
                    double dt = (t > 1 ? wall_s() : now_s()) - t0;
                    double bw = (double)(n / t / 512 * 512 * t) / dt;
                    if (bw > best.bytes_per_s)
                        best = (floor_bw){bw, readers[k].name, aheads[a], t};
                }
            }
        }
        lm_pool_free(pool);
    }
    uint64_t s = 0;
    for (size_t i = 0; i < threads; i++)
        s += j->sum[i];
    if (s == 42)
        printf(" ");
    free(j);
    free(p);
    return best;
}

static void print_floor(size_t threads, const floor_bw *b)
{
    printf("floor bandwidth, %zu thread%s: %.2f GB/s (%s, prefetch %zu bytes ahead, %zu reader%s; "
           "the best of every reader, prefetch and thread count)\n",
           threads, threads > 1 ? "s" : "", b->bytes_per_s / 1e9, b->kernel, b->ahead, b->threads,
           b->threads > 1 ? "s" : "");
}

/* "1,2" -> {1, 2}; 0 on a malformed list. */
static size_t parse_threads(const char *s, size_t th[8])
{
    size_t n = 0;
    for (const char *p = s; *p;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v < 1 || v > LM_MAX_THREADS || n == 8 || (*end && *end != ','))
            return 0;
        th[n++] = (size_t)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

static gw_spec tiny_llama = {.dim = 2048, .hidden = 5632, .layers = 22, .heads = 32,
                             .kv_heads = 4, .vocab = 32000, .seq_len = 2048, .shared = 0,
                             .norm_eps = 1e-5f, .rope_theta = 10000.0f, .norm_type = GW_F32};

/* Random values in [-0.05, 0.05) (norms near 1): fast, and a function of
 * (kind, layer) alone. */
static int bench_tensor(void *user, gw_kind kind, int layer, float *out)
{
    (void)user;
    size_t rows, cols;
    gw_shape(&tiny_llama, kind, &rows, &cols);
    uint64_t s = (uint64_t)kind * 1000003u + (uint64_t)layer + 1;
    int norm = kind == GW_RMS_ATT || kind == GW_RMS_FFN || kind == GW_RMS_FINAL;
    for (size_t i = 0; i < rows * cols; i++)
        out[i] = (float)((double)(mix(&s) >> 40) * 0x1p-24 * 0.1 - 0.05) + (norm ? 1.0f : 0.0f);
    return 0;
}

/* Bytes of weights one token reads: every matrix once, one embedding row,
 * the norms. */
static double token_bytes(const lm_model *m)
{
    const lm_weights *w = &m->weights;
    double b = (double)w->token_embedding.row_bytes;
    b += (double)w->wcls.rows * (double)w->wcls.row_bytes;
    b += (double)(2 * m->config.n_layers + 1) * m->config.dim * 4;
    for (int32_t l = 0; l < m->config.n_layers; l++) {
        const lm_layer *ly = &w->layer[l];
        const lm_matrix *all[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->w3};
        for (size_t i = 0; i < 7; i++)
            b += (double)all[i]->rows * (double)all[i]->row_bytes;
    }
    return b;
}

static int weights_speed(int argc, char **argv)
{
    const char *dir = "/tmp", *types = "f32,f16,q8_0,q4_k", *threads_s = "1,2";
    size_t tokens = 8;
    int as_json = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            as_json = 1;
        else if (i + 1 < argc && strcmp(argv[i], "--dir") == 0)
            dir = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--types") == 0)
            types = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--threads") == 0)
            threads_s = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--tokens") == 0)
            tokens = (size_t)strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "kvevict-lm-speed --weights: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    size_t th[8], n_th = parse_threads(threads_s, th);
    if (!n_th) {
        fprintf(stderr, "kvevict-lm-speed: --threads %s: a list of 1 to 8 counts, each 1 to %d\n",
                threads_s, (int)LM_MAX_THREADS);
        return 2;
    }
    floor_bw bw[8];
    for (size_t i = 0; i < n_th; i++)
        bw[i] = stream_bandwidth(th[i]);
    static const struct {
        const char *name;
        uint32_t type;
    } known[] = {{"f32", GW_F32}, {"f16", GW_F16}, {"bf16", GW_BF16}, {"q8_0", GW_Q8_0},
                 {"q4_0", GW_Q4_0}, {"q4_k", GW_Q4_K}, {"q6_k", GW_Q6_K}};
    struct {
        const char *type;
        size_t threads;        /* index into th */
        double bytes, seconds; /* per token */
    } res[64];
    size_t n_res = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] && strcmp(known[k].name, t) != 0)
            k++;
        if (k == sizeof known / sizeof known[0]) {
            fprintf(stderr, "kvevict-lm-speed: unknown type %s\n", t);
            return 2;
        }
        char path[4200];
        snprintf(path, sizeof path, "%s/kvevict-bench-tinyllama-%s.gguf", dir, t);
        gw_spec sp = tiny_llama;
        sp.type = sp.emb_type = known[k].type;
        FILE *f = fopen(path, "wb");
        char err[256] = "";
        if (!f || gw_write_gguf(f, &sp, bench_tensor, NULL, err, sizeof err) != 0 || fclose(f)) {
            fprintf(stderr, "kvevict-lm-speed: cannot write %s: %s\n", path, err);
            remove(path);
            return 1;
        }
        lm_model *m = NULL;
        if (lm_model_open(path, NULL, &m) != KVE_OK)
            die(path);
        double bytes = token_bytes(m);
        for (size_t i = 0; i < n_th && n_res < 64; i++) {
            lm_options o = {.threads = th[i]};
            lm_state *s = NULL;
            if (lm_state_new(m, &o, &s) != KVE_OK)
                die("decoder");
            double best = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                lm_state_reset(s);
                for (size_t w = 0; w < 2; w++) /* warm-up: the pages, the threads */
                    if (lm_forward(s, (int32_t)(w * 7919 % 32000)) != KVE_OK)
                        die("decode");
                double t0 = th[i] > 1 ? wall_s() : now_s();
                for (size_t q = 0; q < tokens; q++)
                    if (lm_forward(s, (int32_t)((q + 2) * 7919 % 32000)) != KVE_OK)
                        die("decode");
                double dt = ((th[i] > 1 ? wall_s() : now_s()) - t0) / (double)tokens;
                best = dt < best ? dt : best;
            }
            lm_state_free(s);
            res[n_res].type = known[k].name;
            res[n_res].threads = i;
            res[n_res].bytes = bytes;
            res[n_res++].seconds = best;
            fprintf(stderr, "  %s, %zu thread%s: %.2f tokens/s\n", t, th[i], th[i] > 1 ? "s" : "",
                    1.0 / best);
        }
        lm_model_free(m);
        remove(path);
    }
    /* The floor: the best bandwidth of the measurements before and after. */
    for (size_t i = 0; i < n_th; i++) {
        floor_bw again = stream_bandwidth(th[i]);
        bw[i] = again.bytes_per_s > bw[i].bytes_per_s ? again : bw[i];
    }
    if (!as_json) {
        printf("TinyLlama's shape: 22 layers, dim 2048, 32 heads over 4 KV heads, hidden 5632, "
               "vocabulary 32000; random weights; kernels: %s\n", lm_isa_name(lm_isa_active()));
        for (size_t i = 0; i < n_th; i++)
            print_floor(th[i], &bw[i]);
        printf("\n%-6s %8s %11s %9s %12s %10s\n", "type", "threads", "MB/token", "tokens/s",
               "floor tok/s", "of floor");
    }
    for (size_t r = 0; r < n_res; r++) {
        double floor_s = res[r].bytes / bw[res[r].threads].bytes_per_s, sec = res[r].seconds;
        size_t nt = th[res[r].threads];
        if (as_json)
            printf("{\"type\": \"%s\", \"threads\": %zu, \"isa\": \"%s\", \"bytes_per_token\": "
                   "%.0f, \"bandwidth\": %.4g, \"tokens_per_second\": %.3f, "
                   "\"floor_tokens_per_second\": %.3f, \"fraction_of_floor\": %.3f}\n",
                   res[r].type, nt, lm_isa_name(lm_isa_active()), res[r].bytes,
                   bw[res[r].threads].bytes_per_s, 1.0 / sec, 1.0 / floor_s, floor_s / sec);
        else
            printf("%-6s %8zu %11.1f %9.2f %12.2f %9.0f%%\n", res[r].type, nt,
                   res[r].bytes / 1e6, 1.0 / sec, 1.0 / floor_s, 100.0 * floor_s / sec);
    }
    return 0;
}

/* --floor: the floor of decoding each GGUF file given, in tokens per second:
 * its bytes a token over the floor's bandwidth at each thread count. */
static int floor_speed(int argc, char **argv)
{
    const char *threads_s = "1,2";
    int as_json = 0, first = argc;
    for (int i = 2; i < argc && first == argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            as_json = 1;
        else if (i + 1 < argc && strcmp(argv[i], "--threads") == 0)
            threads_s = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "kvevict-lm-speed --floor: unknown option %s\n", argv[i]);
            return 2;
        } else
            first = i;
    }
    size_t th[8], n_th = parse_threads(threads_s, th);
    if (!n_th) {
        fprintf(stderr, "kvevict-lm-speed: --threads %s: a list of 1 to 8 counts, each 1 to %d\n",
                threads_s, (int)LM_MAX_THREADS);
        return 2;
    }
    if (first == argc) {
        fprintf(stderr, "usage: kvevict-lm-speed --floor [--threads N,...] [--json] GGUF...\n");
        return 2;
    }
    double bytes[64];
    int n_files = argc - first > 64 ? 64 : argc - first;
    for (int f = 0; f < n_files; f++) {
        lm_model *m = NULL;
        if (lm_model_open(argv[first + f], NULL, &m) != KVE_OK)
            die(argv[first + f]);
        bytes[f] = token_bytes(m);
        lm_model_free(m);
    }
    for (size_t i = 0; i < n_th; i++) {
        floor_bw b = stream_bandwidth(th[i]);
        if (!as_json)
            print_floor(th[i], &b);
        for (int f = 0; f < n_files; f++) {
            double tps = b.bytes_per_s / bytes[f];
            if (as_json)
                printf("{\"file\": \"%s\", \"threads\": %zu, \"bytes_per_token\": %.0f, "
                       "\"bandwidth\": %.4g, \"reader\": \"%s\", \"prefetch\": %zu, "
                       "\"reader_threads\": %zu, \"floor_tokens_per_second\": %.3f}\n",
                       argv[first + f], th[i], bytes[f], b.bytes_per_s, b.kernel, b.ahead, b.threads,
                       tps);
            else
                printf("  %s: %.1f MB a token, floor %.2f tokens/s\n", argv[first + f],
                       bytes[f] / 1e6, tps);
        }
    }
    return 0;
}

/* ---- --prompt: a prompt's time on a model file ---- */

static int prompt_speed(int argc, char **argv)
{
    const int decode = strcmp(argv[1], "--decode") == 0;
    if (argc < 4 || argc > (decode ? 6 : 7)) {
        fprintf(stderr, "usage: kvevict-lm-speed --prompt CKPT ID,ID,... [THREADS [PRODUCTS "
                        "[BATCH]]]\n       kvevict-lm-speed --decode CKPT ID,ID,... [THREADS "
                        "[PRODUCTS]]\n");
        return 2;
    }
    lm_options o = {.threads = argc > 4 ? (size_t)strtoull(argv[4], NULL, 10) : 1,
                    .products = argc > 5 && strcmp(argv[5], "llama") == 0 ? LM_PRODUCTS_LLAMA
                                                                           : LM_PRODUCTS_EXACT,
                    .batch = argc > 6 ? (size_t)strtoull(argv[6], NULL, 10) : 0};
    size_t n = 1;
    for (const char *p = argv[3]; *p; p++)
        n += *p == ',';
    int32_t *toks = malloc(n * sizeof *toks);
    if (!toks)
        die("out of memory");
    n = 0;
    for (char *p = argv[3]; *p; p += *p == ',')
        toks[n++] = (int32_t)strtol(p, &p, 10);
    lm_model *m = NULL;
    lm_state *s = NULL;
    if (lm_model_open(argv[2], NULL, &m) != KVE_OK ||
        (o.products == LM_PRODUCTS_LLAMA && lm_model_pack(m) != KVE_OK) || /* as the CLI */
        lm_state_new(m, &o, &s) != KVE_OK)
        die(argv[2]);
    if (lm_forward(s, toks[0]) != KVE_OK || lm_state_reset(s) != KVE_OK)
        die("warm-up");
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    double t0 = wall_s();
    if (!decode && lm_forward_batch(s, toks, n, NULL, NULL) != KVE_OK)
        die("prompt");
    for (size_t t = 0; decode && t < n; t++)
        if (lm_forward(s, toks[t]) != KVE_OK)
            die("decode");
    double dt = wall_s() - t0;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    printf("{\"tokens\": %zu, \"threads\": %zu, \"products\": \"%s\", \"batch\": %zu, "
           "\"seconds\": %.6f, \"cpu_seconds\": %.6f}\n", n, o.threads ? o.threads : 1,
           o.products == LM_PRODUCTS_LLAMA ? "llama" : "exact",
           decode ? 1 : o.batch ? o.batch : LM_BATCH, dt,
           (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec));
    lm_state_free(s);
    lm_model_free(m);
    free(toks);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--weights") == 0)
        return weights_speed(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--floor") == 0)
        return floor_speed(argc, argv);
    if (argc > 1 && (strcmp(argv[1], "--prompt") == 0 || strcmp(argv[1], "--decode") == 0))
        return prompt_speed(argc, argv);
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
