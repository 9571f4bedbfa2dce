/* SPDX-License-Identifier: MIT */
/*
 * test_rope_scaling.c - expected_attention under the rope's scaling
 * (kve_rope.scaling, issue 27), held to a port written here (plain C in
 * double, dense matrices, none of the library's code) of Hugging Face's
 * inv_freq and attention_scaling (transformers' modeling_rope_utils:
 * linear, llama3, yarn) and of kvpress's ExpectedAttentionPress, whose
 * averaged rotation is the mean over the future positions of the model's
 * cos and sin, both multiplied by attention_scaling:
 *   mu' = Rbar mu, Sigma' = Rbar Sigma Rbar^T, Rbar = mean_f a R(f).
 * The engine hands the policy post-RoPE queries a R(t) q; the port's
 * statistics read the queries before RoPE. On random tensors the scores
 * must be the port's within 1e-9 relative, and the kept sets at
 * compression 0.5 and 0.8 equal; the unscaled port must differ from each
 * scaled run by more than 1e-6 (the port tells the scalings apart).
 * KVE_ROPE_SCALING_NONE must give the bits of a rope whose new fields are
 * left zero, and every refusal names its field. Two shapes (4 query heads,
 * d 64, 512 positions, 100 queries; 2, d 128, 777, 253). Per-pair
 * frequency factors (kve_rope.freq_factors, llama.cpp's rope_freqs.weight)
 * are held to the port with inv_freq over the factors; Llama 3's factors
 * so stored against its llama3 formula (they differ by the factors'
 * float32 rounding). And the decoder's own rotation (lm_rope_row, both
 * orders of products) under none, linear, yarn and rope_freqs files
 * against the kve_rope it builds its policies with (lm_model_rope): a
 * policy handed the decoder's post-RoPE queries must un-rotate them to the
 * decoder's pre-RoPE ones. Deterministic; the seed is printed (argv[1]
 * replays).
 *
 * Legend: G query heads, d head size (= r, the rotary dim; rotate_half
 * pairs, as kvpress assumes), N positions, M the statistics' queries
 * (the newest, past none: n_sink 4 kept from the start of the run), F
 * n_future_positions.
 */
#include "check.h"
#include "lm.h"
#include "policy_impl.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

enum { SINKS = 4, FUTURE = 512, MAXG = 4, MAXD = 128, MAXN = 777 };

/* The shape of the run (test_against_port sets it). */
static size_t G = 2, D = 64, N = 400, M = 100;

static kve_rng rng;

static double unif(double lo, double hi)
{
    return lo + (hi - lo) * kve_rng_uniform(&rng);
}

static double rel(double a, double b)
{
    double e = fabs(a - b);
    return b != 0.0 ? e / fabs(b) : e;
}

/* ---- the port of Hugging Face's inv_freq and attention_scaling ---- */

typedef struct hf_rope {
    const char *name;
    int type; /* 0 default, 1 linear, 2 llama3, 3 yarn */
    double base, factor, low, high, omax, beta_fast, beta_slow, attention; /* 0: derived */
    int freqs; /* 1: llama3's factors as rope_freqs (type 0): ff below */
} hf_rope;

/* Llama 3's per-pair factors as llama.cpp's converter writes rope_freqs.weight
 * (float32): 1 above the high-frequency wavelength, factor beyond the low
 * one, 1 / ((1 - s) / factor + s) between; factor 8, 1 .. 4, L 8192. */
static float ff[MAXD / 2];

static void llama3_freqs(double base, size_t dim)
{
    const double pi = 3.14159265358979323846, L = 8192, lo = 1, hi = 4, f = 8;
    for (size_t j = 0; j < dim / 2; j++) {
        double freq = 1.0 / pow(base, (double)(2 * j) / (double)dim), wl = 2 * pi / freq;
        double s = (L / wl - lo) / (hi - lo);
        ff[j] = (float)(wl < L / hi ? 1.0 : wl > L / lo ? f : 1.0 / ((1 - s) / f + s));
    }
}

static double hf_inv_freq(const hf_rope *h, size_t j, size_t dim)
{
    const double pi = 3.14159265358979323846;
    double inv = 1.0 / pow(h->base, (double)(2 * j) / (double)dim); /* _compute_default */
    if (h->freqs)
        inv /= (double)ff[j]; /* llama.cpp: theta over rope_freqs[j] */
    if (h->type == 1)
        return inv / h->factor;
    if (h->type == 2) { /* _compute_llama3_parameters, one frequency */
        double low_wl = h->omax / h->low, high_wl = h->omax / h->high;
        double wl = 2 * pi / inv;
        double out = wl > low_wl ? inv / h->factor : inv;
        double smooth = (h->omax / wl - h->low) / (h->high - h->low);
        double smoothed = (1 - smooth) * out / h->factor + smooth * out;
        int medium = !(wl < high_wl) && !(wl > low_wl);
        return medium ? smoothed : out;
    }
    if (h->type == 3) { /* _compute_yarn_parameters, truncate=True */
        double cl = (double)dim * log(h->omax / (h->beta_fast * 2 * pi)) / (2 * log(h->base));
        double ch = (double)dim * log(h->omax / (h->beta_slow * 2 * pi)) / (2 * log(h->base));
        double lo = fmax(floor(cl), 0.0), hi = fmin(ceil(ch), (double)(dim - 1));
        if (lo == hi)
            hi += 0.001;
        double ramp = fmin(fmax(((double)j - lo) / (hi - lo), 0.0), 1.0);
        double extra = 1 - ramp;
        double pos_freq = pow(h->base, (double)(2 * j) / (double)dim);
        return 1.0 / (h->factor * pos_freq) * (1 - extra) + 1.0 / pos_freq * extra;
    }
    return inv;
}

static double hf_attention(const hf_rope *h)
{
    if (h->type == 3) {
        if (h->attention != 0.0)
            return h->attention;
        return h->factor <= 1 ? 1.0 : 0.1 * log(h->factor) + 1.0;
    }
    return h->attention != 0.0 ? h->attention : 1.0;
}

/* ---- the port of kvpress's ExpectedAttentionPress ---- */

/* The dense rotation att R(pos) (rotate_half): R[a][b] = att (cos_b I +
 * sin_b P); the model's is att = hf_attention (HF scales cos and sin). */
static void rotation(const hf_rope *h, double pos, double att, double *R)
{
    const size_t hd = D / 2;
    double inv[MAXD / 2];
    for (size_t j = 0; j < hd; j++)
        inv[j] = hf_inv_freq(h, j, D);
    memset(R, 0, D * D * sizeof *R);
    for (size_t a = 0; a < D; a++)
        for (size_t b = 0; b < D; b++) {
            double P = a >= hd && b == a - hd ? 1.0 : a < hd && b == a + hd ? -1.0 : 0.0;
            if (a != b && P == 0.0)
                continue; /* 0, as memset left it */
            double ang = pos * inv[b % hd];
            R[a * D + b] = att * cos(ang) * (a == b) + att * sin(ang) * P;
        }
}

/* post (N, G, D) from pre (N, G, D): a R(t) q in double, rounded to float. */
static void embed(const hf_rope *h, const float *pre, float *post)
{
    double *R = malloc(D * D * sizeof *R);
    for (size_t t = 0; t < N; t++) {
        rotation(h, (double)t, hf_attention(h), R);
        for (size_t g = 0; g < G; g++) {
            const float *q = pre + (t * G + g) * D;
            for (size_t a = 0; a < D; a++) {
                double s = 0.0;
                for (size_t b = 0; b < D; b++)
                    s += R[a * D + b] * (double)q[b];
                post[(t * G + g) * D + a] = (float)s;
            }
        }
    }
    free(R);
}

/* What the engine's post-RoPE q at t stands for before RoPE: R(t)^T q / a
 * (the inverse of a R(t)), in double, rounded to float32. */
static void unembed(const hf_rope *h, const float *q, double t, float *out)
{
    double *R = malloc(D * D * sizeof *R);
    const double att = hf_attention(h);
    rotation(h, t, 1.0, R);
    for (size_t a = 0; a < D; a++) {
        double s = 0.0;
        for (size_t k = 0; k < D; k++)
            s += R[k * D + a] * (double)q[k];
        out[a] = (float)(att == 1.0 ? s : s / att);
    }
    free(R);
}

/* Scores (N) of one KV head: statistics of pre (M, G, D) rotated by the
 * mean over positions N .. N + F - 1 of a R, kvpress's logits, softmax
 * over the non-sinks, mean over the group, times ||v||; sinks the top. */
static void port(const hf_rope *h, const float *keys, const float *values, const float *pre,
                 double *score)
{
    double *Rbar = calloc(D * D, sizeof *Rbar), *R = malloc(D * D * sizeof *R);
    double mu[MAXD], mu2[MAXD], *cov = malloc(D * D * sizeof *cov);
    double *tmp = malloc(D * D * sizeof *tmp), *cov2 = malloc(D * D * sizeof *cov2), z[MAXN];
    for (size_t f = 0; f < FUTURE; f++) {
        rotation(h, (double)(N + f), hf_attention(h), R);
        for (size_t a = 0; a < D * D; a++)
            Rbar[a] += R[a];
    }
    for (size_t a = 0; a < D * D; a++)
        Rbar[a] /= (double)FUTURE;
    for (size_t i = 0; i < N; i++)
        score[i] = 0.0;
    for (size_t g = 0; g < G; g++) {
        for (size_t a = 0; a < D; a++) {
            double t = 0.0;
            for (size_t k = 0; k < M; k++)
                t += (double)pre[(k * G + g) * D + a];
            mu[a] = t / (double)M;
        }
        for (size_t a = 0; a < D; a++)
            for (size_t b = 0; b < D; b++) {
                double t = 0.0;
                for (size_t k = 0; k < M; k++)
                    t += ((double)pre[(k * G + g) * D + a] - mu[a]) *
                         ((double)pre[(k * G + g) * D + b] - mu[b]);
                cov[a * D + b] = t / (double)M;
            }
        for (size_t a = 0; a < D; a++) {
            double t = 0.0;
            for (size_t b = 0; b < D; b++)
                t += Rbar[a * D + b] * mu[b];
            mu2[a] = t;
        }
        for (size_t a = 0; a < D; a++)
            for (size_t b = 0; b < D; b++) {
                double t = 0.0;
                for (size_t k = 0; k < D; k++)
                    t += cov[a * D + k] * Rbar[b * D + k];
                tmp[a * D + b] = t;
            }
        for (size_t a = 0; a < D; a++)
            for (size_t b = 0; b < D; b++) {
                double t = 0.0;
                for (size_t k = 0; k < D; k++)
                    t += Rbar[a * D + k] * tmp[k * D + b];
                cov2[a * D + b] = t;
            }
        double zmax = -INFINITY, sum = 0.0;
        for (size_t i = SINKS; i < N; i++) {
            double lin = 0.0, quad = 0.0;
            for (size_t a = 0; a < D; a++) {
                lin += mu2[a] * (double)keys[i * D + a];
                for (size_t b = 0; b < D; b++)
                    quad += (double)keys[i * D + a] * cov2[a * D + b] * (double)keys[i * D + b];
            }
            z[i] = lin / sqrt((double)D) + quad / (double)D / 2.0;
            zmax = fmax(zmax, z[i]);
        }
        for (size_t i = SINKS; i < N; i++)
            sum += exp(z[i] - zmax);
        for (size_t i = SINKS; i < N; i++)
            score[i] += exp(z[i] - zmax) / sum / (double)G;
    }
    double top = 0.0;
    for (size_t i = SINKS; i < N; i++) {
        double vn = 0.0;
        for (size_t a = 0; a < D; a++)
            vn += (double)values[i * D + a] * (double)values[i * D + a];
        score[i] *= sqrt(vn);
        top = fmax(top, score[i]);
    }
    for (size_t i = 0; i < SINKS; i++)
        score[i] = top;
    free(Rbar), free(R), free(cov), free(tmp), free(cov2);
}

/* ---- the library ---- */

static kve_rope lib_rope(const hf_rope *h)
{
    kve_rope r = kve_policy_default_options().rope;
    r.rotary_dim = D;
    r.base = h->base;
    r.pairs = KVE_ROPE_HALF;
    r.scaling = (kve_rope_scaling)h->type;
    r.factor = h->factor;
    r.low_freq_factor = h->low;
    r.high_freq_factor = h->high;
    r.original_max_position = (size_t)h->omax;
    r.beta_fast = h->beta_fast;
    r.beta_slow = h->beta_slow;
    r.attention_factor = h->attention;
    r.freq_factors = h->freqs ? ff : NULL;
    return r;
}

static char SPEC[96]; /* budget N, n_queries M, one rescoring (test_against_port) */

/* A policy built with `rope` stepped through post (N, G, D), rescored at
 * the last step: its statistics are the newest M queries. */
static kve_policy *run(const kve_rope *rope, const float *keys, const float *values,
                       const float *post)
{
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = D;
    o.value_dim = D;
    o.query_group = G;
    o.rope = *rope;
    kve_policy *p = NULL;
    if (kve_policy_new_ex(SPEC, NULL, &o, &p) != KVE_OK) {
        fprintf(stderr, "%s\n", kve_last_error());
        return NULL;
    }
    for (size_t t = 0; t < N; t++) {
        kve_step_data dt = kve_step_default_data();
        dt.keys = keys + t * D;
        dt.ld_keys = D;
        dt.queries = post + t * G * D;
        dt.ld_queries = D;
        dt.values = values + t * D;
        dt.ld_values = D;
        dt.flags = t + 1 == N ? KVE_STEP_RESCORE : 0;
        if (kve_policy_step_data(p, (int32_t)t, &dt) != KVE_OK) {
            fprintf(stderr, "step %zu: %s\n", t, kve_last_error());
            kve_policy_free(p);
            return NULL;
        }
    }
    return p;
}

static double score_of(const kve_policy *p, size_t i)
{
    const kve_head *h = &p->head;
    size_t src = h->gap != KVE_NONE && i >= h->gap ? i + 1 : i;
    return ((const double *)h->col[KVE_COL_SCORE])[src];
}

/* The worst relative error of the non-sink scores; sinks must be on top. */
static double worst(const kve_policy *p, const double *ref)
{
    double w = 0.0, low = INFINITY, high = 0.0;
    for (size_t i = 0; i < N; i++) {
        double v = score_of(p, i);
        if (i < SINKS) {
            low = fmin(low, v);
            continue;
        }
        high = fmax(high, v);
        w = fmax(w, rel(v, ref[i]));
    }
    return low > high ? w : INFINITY;
}

/* Positions a copy evicted to kvpress's int(N (1 - ratio)) keeps that the
 * port's top-k does not. */
static size_t kept_diff(const kve_policy *run_p, const double *ref, double ratio)
{
    const size_t want = (size_t)((double)N * (1.0 - ratio));
    kve_policy *p = NULL;
    int32_t victims[MAXN];
    unsigned char keep[MAXN];
    size_t nv = 0, diff = SIZE_MAX;
    if (kve_policy_clone(run_p, &p) != KVE_OK)
        return SIZE_MAX;
    if (kve_policy_evict(p, want, victims, N, &nv) == KVE_OK && kve_policy_size(p) == want) {
        memset(keep, 0, N);
        for (size_t k = 0; k < want; k++) {
            size_t best = N;
            for (size_t i = 0; i < N; i++)
                if (!keep[i] && (best == N || ref[i] > ref[best]))
                    best = i;
            keep[best] = 1;
        }
        diff = 0;
        for (size_t i = 0; i < want; i++)
            diff += !keep[kve_policy_positions(p)[i]];
    }
    kve_policy_free(p);
    return diff;
}

static const hf_rope cases[] = {
    {"default", 0, 10000.0, 1, 1, 4, 0, 32, 1, 0, 0},
    {"linear x4", 1, 10000.0, 4, 1, 4, 0, 32, 1, 0, 0},
    {"llama3 x8 (Llama 3.1)", 2, 500000.0, 8, 1, 4, 8192, 32, 1, 0, 0},
    {"llama3 x4, 2 .. 8, L 1024", 2, 10000.0, 4, 2, 8, 1024, 32, 1, 0, 0},
    {"yarn x4, L 4096", 3, 10000.0, 4, 1, 4, 4096, 32, 1, 0, 0},
    {"yarn x16, 16 .. 2, L 2048, a 1.3", 3, 1000000.0, 16, 1, 4, 2048, 16, 2, 1.3, 0},
    {"linear x2, a 0.8", 1, 10000.0, 2, 1, 4, 0, 32, 1, 0.8, 0},
    {"rope_freqs (Llama 3.1's, float32)", 0, 500000.0, 1, 1, 4, 0, 32, 1, 0, 1},
};

static const struct {
    size_t G, D, N, M;
} run_shapes[] = {{4, 64, 512, 100}, {2, 128, 777, 253}};

/* The light grid (check_light): every case once, on the first shape but
 * yarn x16 (its ramp is placed by d) and rope_freqs (d / 2 factors, and
 * the llama3 run beside it) on the second, which costs three times as much. */
static int on_shape(size_t sh, size_t c)
{
    return !check_light() || (sh == 1) == (c == 5 || c == 7);
}

static void test_against_port(void)
{
    const size_t nc = sizeof cases / sizeof cases[0];
    static float keys[MAXN * MAXD], values[MAXN * MAXD], pre[MAXN * MAXG * MAXD];
    static float post[MAXN * MAXG * MAXD], stat[MAXN * MAXG * MAXD];
    static double ref[MAXN], plain[MAXN], bias[MAXG * MAXD];
    double worst_ff = 0.0; /* Llama 3's factors as rope_freqs against its formula */
    if (check_light())
        printf("  light grid (KVE_TEST_LIGHT): %zu of %zu cases by shapes, each case once: 6 on "
               "the first shape, 2 on the second\n", nc, 2 * nc);
    for (size_t sh = 0; sh < 2; sh++) {
    G = run_shapes[sh].G, D = run_shapes[sh].D, N = run_shapes[sh].N, M = run_shapes[sh].M;
    snprintf(SPEC, sizeof SPEC, "expected_attention:budget=%zu,n_queries=%zu,interval=65536", N,
             M);
    llama3_freqs(500000.0, D);
    printf("G %zu, d %zu, %zu positions, %zu queries:\n", G, D, N, M);
    for (size_t c = 0; c < nc; c++) {
        if (!on_shape(sh, c))
            continue;
        const hf_rope *h = &cases[c];
        const hf_rope unscaled = {"default", 0, h->base, 1, 1, 4, 0, 32, 1, 0, 0};
        for (size_t a = 0; a < G * D; a++)
            bias[a] = unif(-1.0, 1.0);
        for (size_t i = 0; i < N * D; i++) {
            keys[i] = (float)unif(-1.0, 1.0);
            values[i] = (float)unif(-1.0, 1.0);
        }
        for (size_t t = 0; t < N; t++)
            for (size_t a = 0; a < G * D; a++)
                pre[t * G * D + a] = (float)(unif(-1.0, 1.0) + bias[a]);
        embed(h, pre, post); /* the engine's queries */
        for (size_t k = 0; k < M; k++)
            for (size_t g = 0; g < G; g++) {
                size_t t = N - M + k;
                unembed(h, post + (t * G + g) * D, (double)t, stat + (k * G + g) * D);
            }
        port(h, keys, values, stat, ref);
        port(&unscaled, keys, values, stat, plain);
        kve_rope rope = lib_rope(h);
        kve_policy *p = run(&rope, keys, values, post);
        ASSERT_TRUE(p != NULL);
        double e = worst(p, ref), e_plain = worst(p, plain);
        size_t d5 = kept_diff(p, ref, 0.5), d8 = kept_diff(p, ref, 0.8);
        printf("%-34s worst relative score %.3g (unscaled port: %.3g), kept-set differences "
               "%zu at 0.5, %zu at 0.8\n", h->name, e, e_plain, d5, d8);
        ASSERT_TRUE(e <= 1e-9);
        ASSERT_EQ(d5, 0);
        ASSERT_EQ(d8, 0);
        if (h->type != 0 || h->freqs)
            ASSERT_TRUE(e_plain > 1e-6);
        if (h->freqs) { /* the same data, kvevict's llama3 formula: the factors' rounding */
            const hf_rope l3 = {"llama3", 2, 500000.0, 8, 1, 4, 8192, 32, 1, 0, 0};
            kve_rope r3 = lib_rope(&l3);
            kve_policy *q = run(&r3, keys, values, post);
            ASSERT_TRUE(q != NULL);
            double e3 = 0.0;
            for (size_t i = SINKS; i < N; i++)
                e3 = fmax(e3, rel(score_of(q, i), score_of(p, i)));
            worst_ff = fmax(worst_ff, e3);
            kve_policy_free(q);
        }
        kve_policy_free(p);
    }
    }
    printf("Llama 3.1's factors as rope_freqs (float32) against scaling llama3: worst relative "
           "score %.3g\n", worst_ff);
    ASSERT_TRUE(worst_ff > 0.0 && worst_ff <= 1e-5);
}

/* NONE: the bits of a rope whose new fields are left zero (an initializer
 * from before they existed), of the defaults, and of attention_factor 1. */
static void test_none_bits(void)
{
    float *keys = malloc(N * D * sizeof *keys), *values = malloc(N * D * sizeof *values);
    float *post = malloc(N * G * D * sizeof *post);
    for (size_t i = 0; i < N * D; i++) {
        keys[i] = (float)unif(-1.0, 1.0);
        values[i] = (float)unif(-1.0, 1.0);
    }
    for (size_t i = 0; i < N * G * D; i++)
        post[i] = (float)unif(-1.0, 1.5);
    const kve_rope old = {.rotary_dim = D, .base = 10000.0, .pairs = KVE_ROPE_HALF};
    kve_rope def = kve_policy_default_options().rope, one;
    def.rotary_dim = D;
    def.pairs = KVE_ROPE_HALF;
    one = def;
    one.attention_factor = 1.0;
    one.factor = 8.0; /* ignored without scaling */
    kve_policy *a = run(&old, keys, values, post), *b = run(&def, keys, values, post);
    kve_policy *c = run(&one, keys, values, post);
    ASSERT_TRUE(a && b && c);
    for (size_t i = 0; i < N; i++) {
        double x = score_of(a, i), y = score_of(b, i), z = score_of(c, i);
        ASSERT_TRUE(memcmp(&x, &y, sizeof x) == 0 && memcmp(&x, &z, sizeof x) == 0);
    }
    /* an image of the unscaled rope round-trips; a scaled one is refused */
    size_t bytes = 0;
    ASSERT_OK(kve_policy_save(a, NULL, 0, &bytes));
    void *img = malloc(bytes);
    kve_policy *back = NULL;
    ASSERT_OK(kve_policy_save(a, img, bytes, &bytes));
    ASSERT_OK(kve_policy_load(img, bytes, NULL, &back));
    ASSERT_OK(kve_policy_copy(back, b)); /* zeros read as the defaults */
    kve_policy_free(back);
    free(img);
    ASSERT_STATUS(kve_policy_save(c, NULL, 0, &bytes), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "rope.attention_factor 1");
    kve_rope lin = def;
    lin.scaling = KVE_ROPE_SCALING_LINEAR;
    lin.factor = 2.0;
    kve_policy *l = run(&lin, keys, values, post);
    ASSERT_TRUE(l != NULL);
    ASSERT_STATUS(kve_policy_save(l, NULL, 0, &bytes), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "rope.scaling 1: an image does not record");
    ASSERT_STATUS(kve_policy_copy(a, l), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "rope scaling (scaling 0, factor 1");
    for (size_t i = 0; i < N; i++) { /* the refused copy changed nothing */
        double x = score_of(a, i), y = score_of(b, i);
        ASSERT_TRUE(memcmp(&x, &y, sizeof x) == 0);
    }
    kve_policy_free(a), kve_policy_free(b), kve_policy_free(c), kve_policy_free(l);
    free(keys), free(values), free(post);
}

static void refuse(kve_rope r, const char *want)
{
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = D;
    o.value_dim = D;
    o.rope = r;
    kve_policy *p = NULL;
    ASSERT_STATUS(kve_policy_new_ex("expected_attention", NULL, &o, &p), KVE_EINVAL);
    ASSERT_TRUE(p == NULL);
    ASSERT_CONTAINS(kve_last_error(), want);
    kve_bank_options bo = kve_bank_default_options();
    bo.key_dim = D;
    bo.value_dim = D;
    bo.rope = r;
    kve_bank *b = NULL;
    ASSERT_STATUS(kve_bank_new_ex("expected_attention", 2, NULL, &bo, &b), KVE_EINVAL);
    ASSERT_TRUE(b == NULL);
    ASSERT_CONTAINS(kve_last_error(), want);
}

static void test_refusals(void)
{
    kve_rope r0 = kve_policy_default_options().rope, r;
    r0.rotary_dim = D;
#define REFUSE(field, value, want) (r = r0, r.field = (value), refuse(r, want))
    REFUSE(scaling, (kve_rope_scaling)4, "rope: scaling 4 is not a kve_rope_scaling");
    REFUSE(scaling, (kve_rope_scaling)-1, "rope: scaling -1 is not a kve_rope_scaling");
    REFUSE(factor, 0.5, "rope: factor 0.5 must be finite and at least 1");
    REFUSE(factor, NAN, "rope: factor nan must be");
    REFUSE(factor, INFINITY, "rope: factor inf must be");
    REFUSE(low_freq_factor, -1.0, "rope: low_freq_factor -1 must be finite and above 0");
    REFUSE(high_freq_factor, NAN, "rope: high_freq_factor nan must be");
    REFUSE(beta_fast, INFINITY, "rope: beta_fast inf must be");
    REFUSE(beta_slow, -2.0, "rope: beta_slow -2 must be");
    REFUSE(attention_factor, -0.5, "rope: attention_factor -0.5 must be finite and at least 0");
    REFUSE(attention_factor, NAN, "rope: attention_factor nan must be");
    REFUSE(original_max_position, (size_t)INT32_MAX + 1,
           "rope: original_max_position 2147483648 is above 2^31 - 1");
    r0.scaling = KVE_ROPE_SCALING_LLAMA3;
    REFUSE(original_max_position, 0,
           "rope: original_max_position 0 (unset): scaling llama3 needs");
    r0.original_max_position = 8192;
    REFUSE(low_freq_factor, 4.0, "rope: llama3 low_freq_factor 4 must be below high_freq_factor 4");
    r = r0, r.low_freq_factor = 3.0, r.high_freq_factor = 2.0;
    refuse(r, "rope: llama3 low_freq_factor 3 must be below high_freq_factor 2");
    r0.scaling = KVE_ROPE_SCALING_YARN;
    REFUSE(original_max_position, 0, "rope: original_max_position 0 (unset): scaling yarn needs");
    REFUSE(beta_slow, 33.0, "rope: yarn beta_slow 33 must be at most beta_fast 32");
    REFUSE(base, 1.0, "rope: yarn needs base above 1, not 1");
    REFUSE(base, 0.5, "rope: yarn needs base above 1, not 0.5");
#undef REFUSE
    /* the same values pass where their scaling does not read them */
    r0.scaling = KVE_ROPE_SCALING_LINEAR;
    r = r0, r.low_freq_factor = 4.0, r.beta_slow = 33.0, r.original_max_position = 0;
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = D;
    o.value_dim = D;
    o.rope = r;
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new_ex("expected_attention", NULL, &o, &p));
    kve_policy_free(p);
}

/* ---- the decoder's rotation against the kve_rope it builds policies with ---- */

/* A model of head size S carrying only what the rotation reads: the
 * config as lm/gguf.c sets it (lm_rope_scaling_set) and, for a rope_freqs
 * file, its factors. */
typedef struct dec_case {
    const char *name;
    lm_rope_scaling type;
    float theta, factor, attn;
    int32_t orig;
    int freqs;
} dec_case;

/* The largest |q' - q| / |q| over T steps of one query head, q' what an
 * expected_attention policy built with `rope` un-rotates the decoder's
 * rotated q into (its ring, n_sink 0: step t in slot t). */
static double unrotate_error(const lm_model *m, int llama, const kve_rope *rope, size_t T)
{
    const size_t S = (size_t)m->config.head_size;
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = S;
    o.value_dim = S;
    o.rope = *rope;
    char spec[128];
    snprintf(spec, sizeof spec, "expected_attention:budget=%zu,n_sink=0,n_queries=%zu,"
             "interval=65536", T, T);
    kve_policy *p = NULL;
    if (kve_policy_new_ex(spec, NULL, &o, &p) != KVE_OK) {
        fprintf(stderr, "%s\n", kve_last_error());
        return INFINITY;
    }
    float *pre = malloc(T * S * sizeof *pre), post[MAXD], row[MAXD], key[MAXD];
    double worst = 0.0;
    kve_rng g; /* the same queries for every rope of a model */
    kve_rng_seed(&g, check_seed + S);
    for (size_t t = 0; t < T; t++) {
        float *q = pre + t * S;
        for (size_t a = 0; a < S; a++) {
            q[a] = (float)(2.0 * kve_rng_uniform(&g) - 1.0);
            key[a] = (float)(2.0 * kve_rng_uniform(&g) - 1.0);
        }
        lm_rope_row(m, llama, (int64_t)t, row);
        for (size_t a = 0; a < S; a += 2) { /* the decoder's rotate() */
            post[a] = q[a] * row[a] - q[a + 1] * row[a + 1];
            post[a + 1] = q[a] * row[a + 1] + q[a + 1] * row[a];
        }
        kve_step_data dt = kve_step_default_data();
        dt.keys = key;
        dt.ld_keys = S;
        dt.queries = post;
        dt.ld_queries = S;
        dt.values = key;
        dt.ld_values = S;
        if (kve_policy_step_data(p, (int32_t)t, &dt) != KVE_OK) {
            fprintf(stderr, "step %zu: %s\n", t, kve_last_error());
            worst = INFINITY;
            break;
        }
    }
    /* the ring: the last T * S floats of the head's aux (expected_attention.c) */
    const float *ring = (const float *)(const void *)((const char *)p->head.aux +
                                                      p->bank.cfg.aux_bytes -
                                                      T * S * sizeof(float));
    for (size_t t = 0; worst < INFINITY && t < T; t++) {
        double e = 0.0, n = 0.0;
        for (size_t a = 0; a < S; a++) {
            double x = (double)ring[t * S + a] - (double)pre[t * S + a];
            e += x * x;
            n += (double)pre[t * S + a] * pre[t * S + a];
        }
        worst = fmax(worst, sqrt(e / n));
    }
    free(pre);
    kve_policy_free(p);
    return worst;
}

static void test_decoder_rotation(void)
{
    static const dec_case dc[] = {
        {"none", LM_ROPE_SCALING_NONE, 10000.0f, 1.0f, 1.0f, 0, 0},
        {"linear x4", LM_ROPE_SCALING_LINEAR, 10000.0f, 4.0f, 1.0f, 0, 0},
        {"linear x2, attn 0.8", LM_ROPE_SCALING_LINEAR, 10000.0f, 2.0f, 0.8f, 0, 0},
        {"yarn x4, L 4096", LM_ROPE_SCALING_YARN, 10000.0f, 4.0f, 1.0f, 4096, 0},
        {"yarn x16, L 2048", LM_ROPE_SCALING_YARN, 1000000.0f, 16.0f, 1.0f, 2048, 0},
        {"rope_freqs (Llama 3.1)", LM_ROPE_SCALING_NONE, 500000.0f, 1.0f, 1.0f, 0, 1},
        {"rope_freqs and linear x2", LM_ROPE_SCALING_LINEAR, 500000.0f, 2.0f, 1.0f, 0, 1},
    };
    static const size_t sizes[] = {64, 128};
    const size_t T = 512, nd = sizeof dc / sizeof dc[0];
    double worst = 0.0, least_plain = INFINITY;
    /* The light grid (check_light): each file once, the head size by c's
     * parity, the order by (c / 2)'s: every size and order, and each pair of
     * them, still taken. */
    const int light = check_light();
    if (light)
        printf("  light grid (KVE_TEST_LIGHT): %zu of %zu files by head sizes by orders\n", nd,
               4 * nd);
    for (size_t si = 0; si < 2; si++)
        for (size_t c = 0; c < nd; c++)
            for (int llama = 0; llama < 2; llama++) {
                if (light && (si != c % 2 || llama != (int)(c / 2 % 2)))
                    continue;
                const size_t S = sizes[si];
                lm_model m;
                memset(&m, 0, sizeof m);
                m.config.head_size = (int32_t)S;
                m.config.rope_theta = dc[c].theta;
                lm_rope_scaling_set(&m.config, dc[c].type, dc[c].factor, dc[c].attn, dc[c].orig);
                llama3_freqs((double)dc[c].theta, S);
                if (dc[c].freqs) {
                    m.config.rope_freqs = 1;
                    m.weights.rope_freqs = ff;
                    /* lm_rope alone cannot carry the tensor: unset, refused */
                    ASSERT_EQ(lm_rope(&m.config).rotary_dim, KVE_ROPE_UNSET);
                }
                const kve_rope r = lm_model_rope(&m);
                ASSERT_EQ(r.rotary_dim, S);
                ASSERT_TRUE((r.freq_factors != NULL) == (dc[c].freqs != 0));
                double e = unrotate_error(&m, llama, &r, T);
                kve_rope plain = kve_policy_default_options().rope; /* no scaling, no factors */
                plain.rotary_dim = S;
                plain.base = (double)dc[c].theta;
                double e_plain = unrotate_error(&m, llama, &plain, T);
                if (si == 1)
                    printf("decoder %-26s %s: un-rotated query off by %.3g of its norm (the "
                           "unscaled rope: %.3g)\n", dc[c].name,
                           llama ? "ggml's order" : "rope_row    ", e, e_plain);
                worst = fmax(worst, e);
                if (c != 0)
                    least_plain = fmin(least_plain, e_plain);
                else
                    ASSERT_TRUE(e_plain == e); /* none: the same rope */
            }
    printf("decoder rotation vs kve_rope over 2 head sizes, 7 files, both orders, %zu positions: "
           "worst %.3g of the norm; an unscaled rope at least %.3g\n", T, worst, least_plain);
    /* float32 angles against double ones: p theta's rounding at p < 512 */
    ASSERT_TRUE(worst <= 1e-4);
    ASSERT_TRUE(least_plain > 1e-2);
}

/* freq_factors: refused where they cannot apply; images and copies refuse
 * a rope that carries them (no image records them). */
static void test_freq_factor_refusals(void)
{
    D = 64;
    llama3_freqs(500000.0, D);
    kve_rope r0 = kve_policy_default_options().rope, r;
    r0.rotary_dim = D;
    r0.freq_factors = ff;
    r = r0, r.scaling = KVE_ROPE_SCALING_LLAMA3, r.original_max_position = 8192;
    refuse(r, "rope: freq_factors with scaling llama3");
    float bad[MAXD / 2];
    memcpy(bad, ff, sizeof bad);
    bad[5] = 0.0f;
    r = r0, r.freq_factors = bad;
    refuse(r, "rope: freq_factors[5] = 0 is not finite and above 0");
    bad[5] = NAN;
    refuse(r, "rope: freq_factors[5] = nan is not");
    r = r0, r.rotary_dim = KVE_ROPE_UNSET;
    refuse(r, "rope: freq_factors need a rotary_dim of at most 512, not unset");
    /* copied at construction: the caller's array may change after */
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = D;
    o.value_dim = D;
    o.rope = r0;
    memcpy(bad, ff, sizeof bad);
    o.rope.freq_factors = bad;
    kve_policy *p = NULL, *q = NULL;
    ASSERT_OK(kve_policy_new_ex("expected_attention", NULL, &o, &p));
    for (size_t j = 0; j < D / 2; j++)
        bad[j] = -1.0f;
    ASSERT_EQ(p->bank.cfg.rope_nff, D / 2);
    ASSERT_TRUE(memcmp(p->bank.cfg.rope_ff, ff, D / 2 * sizeof(float)) == 0);
    size_t bytes = 0;
    ASSERT_STATUS(kve_policy_save(p, NULL, 0, &bytes), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "rope.freq_factors: an image does not record");
    o.rope.freq_factors = NULL;
    ASSERT_OK(kve_policy_new_ex("expected_attention", NULL, &o, &q));
    ASSERT_STATUS(kve_policy_copy(q, p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "rope freq_factors (0) are not src's (32)");
    kve_policy_free(p);
    kve_policy_free(q);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    kve_rng_seed(&rng, check_seed);
    RUN(test_against_port);
    RUN(test_none_bits);
    RUN(test_refusals);
    RUN(test_decoder_rotation);
    RUN(test_freq_factor_refusals);
    return CHECK_DONE();
}
