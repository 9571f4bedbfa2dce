/* SPDX-License-Identifier: MIT */
/*
 * test_kvpress_parity.c - the methods the docs call kvpress's presses held to
 * ports written here from kvpress's source (NVIDIA/kvpress, kvpress/presses/):
 *
 *   knorm      knorm_press.py     KnormPress.score: -||k||, per KV head
 *   keydiff    keydiff_press.py   KeyDiffPress.score: anchor = the mean of
 *                                 the unit keys over the sequence, score
 *                                 -cos(k, anchor)
 *   streaming  streaming_llm_press.py  StreamingLLMPress.score: 1 on the
 *                                 first n_sink and the last n_kept - n_sink
 *                                 positions, 0 elsewhere
 *   Ada-KV     adakv_press.py     AdaKVPress.compress over H2O's prompt
 *                                 scores (the column sums of the attention,
 *                                 the group's mean): each head's top
 *                                 int(n_kept * alpha_safeguard) raised to
 *                                 the maximum, then the lowest
 *                                 J * (n - n_kept) of the layer pruned
 * and ScorerPress.compress for the single-head ones: n_kept = int(n (1 -
 * cr)), the n_kept highest scores kept (scores.topk). kvevict runs each as
 * the docs say it equals the press: the prompt stepped without evicting,
 * then one eviction to n_kept (the policies); kve_bank_prefill to n, then
 * kve_bank_evict_shared over the layer (Ada-KV).
 *
 * Legend: J KV heads, G query heads a KV head, d the head's dimension, n
 * prompt positions, cr the compression ratio. Two shapes, ratios 0.5 and
 * 0.8; random continuous data, so no two scores tie. Each comparison is
 * also run against a port with one deliberate error (the mutation), which
 * it must notice.
 */
#include "check.h"
#include "policy_impl.h"
#include "kvpress_port.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    size_t J, G, d, n;
} shape;

static const shape shapes[] = {{2, 4, 64, 512}, {4, 2, 128, 777}};
static const double ratios[] = {0.5, 0.8};

static uint64_t rng_state;

static double uniform(void) /* xorshift64*, [0, 1) */
{
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * 0x1p-53;
}

/* ---- the ports ---- */

enum { M_KNORM, M_KEYDIFF, M_STREAMING };

/* Head j's kvpress score of every position from keys (n, J, d). mutate:
 * knorm the squared norm, keydiff the anchor of raw (not unit) keys,
 * streaming one sink fewer. */
static void port_scores(int method, const float *keys, shape s, size_t j, size_t kept,
                        int mutate, double *score)
{
    const size_t n = s.n, d = s.d;
    double *anchor = calloc(d, sizeof *anchor);
    if (method == M_KEYDIFF)
        for (size_t i = 0; i < n; i++) {
            const float *k = keys + (i * s.J + j) * d;
            double nn = 0;
            for (size_t c = 0; c < d; c++)
                nn += (double)k[c] * k[c];
            double inv = mutate ? 1.0 : 1.0 / fmax(sqrt(nn), 1e-12); /* F.normalize */
            for (size_t c = 0; c < d; c++)
                anchor[c] += k[c] * inv / (double)n;
        }
    for (size_t i = 0; i < n; i++) {
        const float *k = keys + (i * s.J + j) * d;
        double nn = 0, dot = 0, na = 0;
        for (size_t c = 0; c < d; c++) {
            nn += (double)k[c] * k[c];
            dot += (double)k[c] * anchor[c];
            na += anchor[c] * anchor[c];
        }
        if (method == M_KNORM) {
            score[i] = mutate ? -nn : -sqrt(nn);
        } else if (method == M_KEYDIFF) {
            score[i] = -dot / fmax(sqrt(nn) * sqrt(na), 1e-8); /* cosine_similarity */
        } else {
            size_t sinks = mutate ? 3 : 4;
            score[i] = i < sinks || i >= n - (kept - sinks) ? 1.0 : 0.0;
        }
    }
    free(anchor);
}

/* kvevict's bank of J heads, the prompt's keys stepped, one eviction. */
static kve_status run_policy(int method, const float *keys, shape s, size_t budget, kve_bank **out)
{
    char spec[96];
    if (method == M_KNORM)
        snprintf(spec, sizeof spec, "knorm:budget=%zu", budget);
    else if (method == M_KEYDIFF)
        snprintf(spec, sizeof spec, "keydiff:budget=%zu,recent_window=0", budget);
    else
        snprintf(spec, sizeof spec, "streaming:budget=%zu,sinks=4", budget);
    kve_bank_options o = kve_bank_default_options();
    o.key_dim = s.d;
    kve_bank *b;
    kve_status st = kve_bank_new_ex(spec, s.J, NULL, &o, &b);
    if (st != KVE_OK)
        return st;
    for (size_t i = 0; i < s.n && st == KVE_OK; i++) {
        kve_step_data dt = {0};
        dt.keys = keys + i * s.J * s.d;
        dt.ld_keys = s.d;
        dt.group = 1;
        st = kve_bank_step_data(b, 0, s.J, (int32_t)i, &dt);
    }
    int32_t *victims = malloc(s.J * s.n * sizeof *victims);
    if (st == KVE_OK)
        st = kve_bank_evict(b, budget, victims, s.n, NULL);
    free(victims);
    if (st != KVE_OK)
        kve_bank_free(b), b = NULL;
    *out = b;
    return st;
}

static void test_key_scored(void)
{
    static const char *const names[] = {"knorm", "keydiff", "streaming"};
    for (int m = M_KNORM; m <= M_STREAMING; m++) {
        size_t diffs[2] = {0, 0}, caught = 0;
        double worst = 0;
        for (size_t si = 0; si < 2; si++) {
            const shape s = shapes[si];
            rng_state = check_seed * 2654435761u + 17 * si + (uint64_t)m + 1;
            float *keys = malloc(s.n * s.J * s.d * sizeof *keys);
            for (size_t x = 0; x < s.n * s.J * s.d; x++) /* a shared direction, as real keys have */
                keys[x] = (float)(2 * uniform() - 1 + (x % s.d < 4 ? 0.7 : 0.0));
            double *score = malloc(s.n * sizeof *score);
            unsigned char *keep = malloc(s.n);
            for (size_t r = 0; r < 2; r++) {
                size_t B = n_kept(s.n, ratios[r]);
                kve_bank *b;
                ASSERT_OK(run_policy(m, keys, s, B, &b));
                for (size_t j = 0; j < s.J; j++) {
                    ASSERT_EQ(kve_bank_size(b, j), B);
                    port_scores(m, keys, s, j, B, 0, score);
                    top(score, s.n, B, keep);
                    diffs[r] += kept_diff(kve_bank_positions(b, j), kve_bank_size(b, j), keep);
                    if (m == M_KNORM) { /* the stored score is kvpress's, -||k|| */
                        const kve_head *h = &b->heads[j];
                        const int32_t *pos = kve_bank_positions(b, j);
                        for (size_t k = 0; k < h->size; k++) {
                            double want = score[pos[k]], got = head_score(h, k);
                            worst = fmax(worst, fabs(got - want) / fabs(want));
                        }
                    }
                    port_scores(m, keys, s, j, B, 1, score);
                    top(score, s.n, B, keep);
                    size_t moved = kept_diff(kve_bank_positions(b, j), kve_bank_size(b, j), keep);
                    caught += moved > 0 || m == M_KNORM;
                }
                kve_bank_free(b);
            }
            free(keys), free(score), free(keep);
        }
        printf("parity %-9s kept outside kvpress's set: %zu at 0.5, %zu at 0.8; worst score rel %.2g\n",
               names[m], diffs[0], diffs[1], worst);
        ASSERT_EQ(diffs[0], 0);
        ASSERT_EQ(diffs[1], 0);
        ASSERT_TRUE(worst <= 1e-6); /* float32 norms against the double port */
        /* The mutations: keydiff's raw anchor and streaming's missing sink
         * move the kept set of some head (knorm's squared norm keeps the
         * same order: its mutation is the score check above). */
        ASSERT_TRUE(caught > 0);
    }
}

/* ---- Ada-KV over H2O's prompt scores ---- */

static void test_adakv(void)
{
    size_t diffs[2] = {0, 0}, mutated = 0;
    for (size_t si = 0; si < 2; si++) {
        const shape s = shapes[si];
        const size_t n = s.n, H = s.J * s.G;
        rng_state = check_seed * 40503u + si + 7;
        float *attn = malloc(H * n * n * sizeof *attn); /* (J, G, n, n) causal softmax rows */
        double *logit = malloc(n * sizeof *logit);
        for (size_t q = 0; q < H; q++) {
            /* KV heads differ in how peaked they are: a peaked head's tail is
             * what the safeguard keeps */
            double heat = (q / s.G) % 2 ? 12.0 : 0.5;
            for (size_t t = 0; t < n; t++) {
                float *row = attn + (q * n + t) * n;
                double z = 0;
                for (size_t i = 0; i <= t; i++)
                    z += logit[i] = exp(heat * (2 * uniform() - 1));
                for (size_t i = 0; i < n; i++)
                    row[i] = i <= t ? (float)(logit[i] / z) : 0.0f;
            }
        }
        double *score = malloc(s.J * n * sizeof *score);
        for (size_t j = 0; j < s.J; j++) /* the group's mean of the column sums */
            for (size_t i = 0; i < n; i++) {
                double sum = 0;
                for (size_t g = 0; g < s.G; g++)
                    for (size_t t = 0; t < n; t++)
                        sum += attn[((j * s.G + g) * n + t) * n + i];
                score[j * n + i] = sum / (double)s.G;
            }
        unsigned char *keep = malloc(s.J * n);
        for (size_t r = 0; r < 2; r++) {
            const size_t kept = n_kept(n, ratios[r]);
            for (int mutate = 0; mutate < 2; mutate++) {
                /* AdaKVPress.compress: n_safe per head, then the layer's lowest
                 * J (n - n_kept) pruned; the mutation safeguards all n_kept,
                 * a cut per head instead of the layer's. */
                const size_t n_safe = mutate ? kept : (size_t)((double)kept * 0.2);
                double *adj = malloc(s.J * n * sizeof *adj);
                memcpy(adj, score, s.J * n * sizeof *adj);
                for (size_t j = 0; j < s.J; j++) {
                    top(score + j * n, n, n_safe, keep + j * n);
                    for (size_t i = 0; i < n; i++)
                        if (keep[j * n + i])
                            adj[j * n + i] = DBL_MAX;
                }
                memset(keep, 1, s.J * n);
                for (size_t k = 0; k < s.J * (n - kept); k++) {
                    size_t low = s.J * n;
                    for (size_t x = 0; x < s.J * n; x++)
                        if (keep[x] && (low == s.J * n || adj[x] < adj[low]))
                            low = x;
                    keep[low] = 0;
                }
                free(adj);
                kve_bank_options o = kve_bank_default_options();
                o.share = s.J;
                o.query_group = s.G;
                kve_bank *b;
                char spec[64];
                snprintf(spec, sizeof spec, "h2o:budget=%zu,recent_window=0", n);
                ASSERT_OK(kve_bank_new_ex(spec, s.J, NULL, &o, &b));
                kve_prefill_options p = kve_prefill_default_options();
                ASSERT_OK(kve_bank_prefill(b, 0, s.J, n, n, attn, n, s.G, KVE_REDUCE_MEAN, &p));
                int32_t *victims = malloc(s.J * n * sizeof *victims);
                ASSERT_OK(kve_bank_evict_shared(b, 0, s.J, s.J * kept, victims, n, NULL));
                free(victims);
                size_t diff = 0;
                for (size_t j = 0; j < s.J; j++)
                    diff += kept_diff(kve_bank_positions(b, j), kve_bank_size(b, j), keep + j * n);
                if (mutate)
                    mutated += diff;
                else
                    diffs[r] += diff;
                kve_bank_free(b);
            }
        }
        free(attn), free(logit), free(score), free(keep);
    }
    printf("parity ada-kv    kept outside kvpress's set: %zu at 0.5, %zu at 0.8 (alpha_safeguard 0.2); "
           "cut per head instead %zu\n",
           diffs[0], diffs[1], mutated);
    ASSERT_EQ(diffs[0], 0);
    ASSERT_EQ(diffs[1], 0);
    ASSERT_TRUE(mutated > 0);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_key_scored);
    RUN(test_adakv);
    return CHECK_DONE();
}
