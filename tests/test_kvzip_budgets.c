/* SPDX-License-Identifier: MIT */
/*
 * test_kvzip_budgets.c - KVzip's budgets across heads (kve_prefill_options
 * budgets, layer_heads, prefix) held to a port of kvpress's own cut,
 * written here from kvpress/presses/kvzip_press.py (NVIDIA/kvpress):
 *
 *   prepare:       score_val = 0 for every (layer, KV head, position), then
 *                  1 on the first n_sink positions;
 *   score_kvzip:   each chunk's scores overwrite [prefix, n) (so a prefix
 *                  shorter than n_sink leaves only its first `prefix` at 1);
 *   compress_post: layerwise=True: each layer prunes int(G n ratio) of its
 *                  G n scores, its lowest; layerwise=False: sort every score
 *                  ascending, t = sorted[max(int(N ratio) - 1, 0)], each
 *                  layer prunes as many as it has scores <= t, its lowest.
 *
 * The port is naive (a selection of the lowest, one at a time) and keeps
 * kvpress's float arithmetic for the counts (int() of a double). Ties among
 * equal scores are pruned highest flat index first here and in the library;
 * torch.topk leaves that order undefined, so the shapes below keep ties
 * away from the cut (random weights; the zero-scored prefix positions are
 * all pruned). Two shapes (3 layers of 2 KV heads x 4 query heads, 512
 * positions; 2 layers of 4 x 2, 777), ratios 0.5 and 0.8, both modes, with
 * and without a prefix, into a plain bank and a bank sharing each layer's
 * budget; then the decode continues; refusals and allocation failure leave
 * every head empty. Deterministic (the seed is printed).
 */
#include "check.h"
#include "kvevict.h"
#include "test_allocator.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAXL = 3, MAXG = 4, MAXR = 4, MAXN = 777 };

static float rows[MAXL * MAXG * MAXR * MAXN];
static double chunk[MAXL * MAXG * MAXN]; /* the engine's scores: max over rows and group */
static unsigned char want[MAXL * MAXG * MAXN];

/* Rows of every (layer, KV head, query head): uniform weights on the
 * context's keys [prefix, n), 0 on the prefix (no chunk covers it). */
static void make(kve_rng *g, size_t L, size_t G, size_t R, size_t n, size_t prefix)
{
    for (size_t h = 0; h < L * G; h++) {
        for (size_t i = 0; i < n; i++)
            chunk[h * n + i] = 0;
        for (size_t q = 0; q < R; q++)
            for (size_t i = 0; i < n; i++) {
                float w = i < prefix ? 0.0f : (float)(0.001 + 0.998 * kve_rng_uniform(g));
                rows[(h * R + q) * n + i] = w;
                if ((double)w > chunk[h * n + i])
                    chunk[h * n + i] = (double)w;
            }
    }
}

/* kvpress's compress_post on score_val (L, G, n), as the header describes;
 * keep[(l G + j) n + i]. */
static void kvpress_cut(size_t L, size_t G, size_t n, size_t n_sink, size_t prefix, double ratio,
                        int layerwise, unsigned char *keep)
{
    static double sv[MAXL * MAXG * MAXN], sorted[MAXL * MAXG * MAXN];
    const size_t N = L * G * n;
    for (size_t h = 0; h < L * G; h++)
        for (size_t i = 0; i < n; i++) {
            double v = i < n_sink ? 1.0 : 0.0;
            if (i >= prefix)
                v = chunk[h * n + i];
            sv[h * n + i] = v;
        }
    double t = 0;
    if (!layerwise) {
        memcpy(sorted, sv, N * sizeof *sorted);
        for (size_t a = 1; a < N; a++) { /* insertion sort: naive on purpose */
            double x = sorted[a];
            size_t b = a;
            while (b && sorted[b - 1] > x) {
                sorted[b] = sorted[b - 1];
                b--;
            }
            sorted[b] = x;
        }
        long idx = (long)((double)N * ratio) - 1;
        t = sorted[idx > 0 ? idx : 0];
    }
    memset(keep, 1, N);
    for (size_t l = 0; l < L; l++) {
        const double *s = sv + l * G * n;
        size_t prune = 0;
        if (layerwise) {
            prune = (size_t)((double)(G * n) * ratio);
        } else {
            for (size_t i = 0; i < G * n; i++)
                prune += s[i] <= t;
        }
        for (size_t k = 0; k < prune; k++) { /* the lowest left, the highest index of a tie */
            size_t at = SIZE_MAX;
            for (size_t i = 0; i < G * n; i++)
                if (keep[l * G * n + i] && (at == SIZE_MAX || s[i] <= s[at]))
                    at = i;
            keep[l * G * n + at] = 0;
        }
    }
}

/* The bank's kept sets against keep (every head, position for position). */
static void expect_kept(const kve_bank *b, size_t heads, size_t n, const unsigned char *keep)
{
    for (size_t h = 0; h < heads; h++) {
        const int32_t *pos = kve_bank_positions(b, h);
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (keep[h * n + i]) {
                if (k >= kve_bank_size(b, h) || pos[k] != (int32_t)i)
                    CHECK_FAIL_AT("head %zu: kept slot %zu is %ld, kvpress keeps %zu", h, k,
                                  k < kve_bank_size(b, h) ? (long)pos[k] : -1L, i);
                k++;
            }
        ASSERT_EQ(kve_bank_size(b, h), k);
    }
}

/* One case through the library: a bank of L*G heads (shared: each layer's G
 * sharing its budget) prefilled with `budget`, and kvpress's ratio when cr
 * is not 0; the kept sets must be keep's; then the decode goes on (with a
 * shared budget each layer keeps its total). *pruned: the positions pruned. */
static void run_case(size_t L, size_t G, size_t R, size_t n, size_t prefix, size_t budget,
                     double cr, int layerwise, int shared, const unsigned char *keep,
                     size_t *pruned)
{
    kve_bank_options bo = kve_bank_default_options();
    bo.share = shared ? G : 0;
    kve_bank *b = NULL;
    char spec[64];
    snprintf(spec, sizeof spec, "h2o:budget=%zu,recent_window=8", budget);
    ASSERT_OK(kve_bank_new_ex(spec, L * G, NULL, &bo, &b));
    kve_prefill_options o = kve_prefill_default_options();
    o.method = KVE_PREFILL_KVZIP;
    o.sinks = 4;
    o.prefix = prefix;
    o.budgets = layerwise ? KVE_PREFILL_PER_LAYER : KVE_PREFILL_OVERALL;
    o.layer_heads = G;
    o.compression_ratio = cr;
    ASSERT_OK(kve_bank_prefill(b, 0, L * G, n, budget, rows, n, R, KVE_REDUCE_MAX, &o));
    expect_kept(b, L * G, n, keep);
    size_t total[MAXL] = {0};
    *pruned = 0;
    for (size_t h = 0; h < L * G; h++) {
        total[h / G] += kve_bank_size(b, h);
        *pruned += n - kve_bank_size(b, h);
    }
    static float step[MAXL * MAXG * (MAXN + 1)];
    for (size_t h = 0; h < L * G; h++)
        for (size_t i = 0; i < kve_bank_size(b, h); i++)
            step[h * (MAXN + 1) + i] = 1.0f / (float)kve_bank_size(b, h);
    ASSERT_OK(kve_bank_step(b, (int32_t)n, step, MAXN + 1));
    if (shared) {
        static int32_t v[MAXL * MAXG * (MAXN + 1)];
        for (size_t l = 0; l < L; l++)
            ASSERT_OK(kve_bank_evict_shared(b, l * G, G, total[l] / G + 1, v, MAXN + 1, NULL));
    }
    kve_bank_free(b);
}

/* Every case twice: with kvpress's own ratio (compression_ratio = 0.5 or
 * 0.8, the port at the same ratio) and with the budget alone (the port at
 * the ratio whose count is the per-head budget's, (n - budget + 1/4) / n of
 * each head); the two prune different counts where int(N cr) is no multiple
 * of the heads (printed). */
static void test_equal_to_kvpress(void)
{
    static const struct {
        size_t L, G, R, n;
    } shapes[] = {{3, 2, 4, 512}, {2, 4, 2, 777}};
    static const double ratios[] = {0.5, 0.8};
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    size_t cases = 0, differ = 0, off = 0, sink_cut[2] = {0, 0}, sink_slots[2] = {0, 0};
    for (size_t sh = 0; sh < 2; sh++)
        for (size_t ri = 0; ri < 2; ri++)
            for (int layerwise = 0; layerwise < 2; layerwise++)
                for (size_t pi = 0; pi < 3; pi++) {
                    const size_t L = shapes[sh].L, G = shapes[sh].G, R = shapes[sh].R;
                    const size_t n = shapes[sh].n;
                    const size_t prefix = pi == 0 ? 0 : pi == 1 ? 2 : 7; /* below, at, past 4 sinks */
                    make(&g, L, G, R, n, prefix);
                    /* the per-head budget whose pruned count is nearest kvpress's at this ratio */
                    const size_t budget = n - (size_t)floor((double)n * ratios[ri]);
                    const double shifted = ((double)(n - budget) + 0.25 / (double)(L * G)) / (double)n;
                    size_t pruned[2];
                    for (int exact = 0; exact < 2; exact++) {
                        const double cr = exact ? ratios[ri] : shifted;
                        kvpress_cut(L, G, n, 4, prefix, cr, layerwise, want);
                        for (int shared = 0; shared < 2; shared++)
                            run_case(L, G, R, n, prefix, budget, exact ? cr : 0.0, layerwise,
                                     shared, want, &pruned[exact]);
                        /* how far kvpress's own cut is from the uniform one, and
                         * (prefix 0, no chat template) how many of the first four
                         * positions' slots it cuts: reported */
                        for (size_t h = 0; exact && h < L * G; h++) {
                            size_t k = 0;
                            for (size_t i = 0; i < n; i++)
                                k += want[h * n + i];
                            differ += k != budget;
                            for (size_t i = 0; pi == 0 && i < 4; i++) {
                                sink_cut[ri] += !want[h * n + i];
                                sink_slots[ri]++;
                            }
                        }
                        cases++;
                    }
                    if (pi == 0 && pruned[0] != pruned[1])
                        printf("  %zux%zux%zu at %.1f, %s: kvpress prunes %zu, the budget %zu\n",
                               L, G, n, ratios[ri], layerwise ? "layerwise" : "overall",
                               pruned[1], pruned[0]);
                    off += pruned[0] != pruned[1];
                }
    printf("  %zu cases equal to kvpress's cut (kvpress's ratios 0.5 and 0.8 and the budget's; "
           "layerwise and not, prefix 0, 2, 7; %zu heads kept other than the uniform budget; "
           "the budget's count off kvpress's in %zu of 24)\n", cases, differ, off);
    printf("  at prefix 0 kvpress cuts %zu of the first four positions' %zu slots at 0.5 and "
           "%zu of %zu at 0.8 (kvevict's default sinks keep them all)\n",
           sink_cut[0], sink_slots[0], sink_cut[1], sink_slots[1]);
    ASSERT_EQ(cases, 48);
    ASSERT_TRUE(differ > 0); /* the cut is head-adaptive: not the per-head budget in disguise */
    ASSERT_TRUE(off > 0);    /* the ratio is needed: the budget cannot give kvpress's count */
}

/* Per head with kvpress's sinks: the top budget of each head's scores with
 * the first min(sinks, prefix) scored 1; kvevict's default keeps the first
 * four whatever the prefix (kvpress at prefix 0 keeps none of them by
 * right). */
static void test_sinks(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed + 1);
    const size_t n = 200, G = 2, R = 2, budget = 40;
    make(&g, 1, G, R, n, 0);
    int32_t first_kept[2][40];
    size_t differ = 0;
    for (size_t mode = 0; mode < 2; mode++) {
        kve_bank *b = NULL;
        ASSERT_OK(kve_bank_new("h2o:budget=40,recent_window=8", G, NULL, &b));
        kve_prefill_options o = kve_prefill_default_options();
        o.method = KVE_PREFILL_KVZIP;
        o.prefix = mode ? 0 : KVE_PREFILL_NO_PREFIX;
        ASSERT_OK(kve_bank_prefill(b, 0, G, n, budget, rows, n, R, KVE_REDUCE_MAX, &o));
        for (size_t h = 0; h < G; h++) {
            ASSERT_EQ(kve_bank_size(b, h), budget);
            /* the reference: sinks forced (default) or none (prefix 0), then the top */
            unsigned char keep[200] = {0};
            size_t left = budget;
            if (!mode)
                for (size_t i = 0; i < 4; i++)
                    keep[i] = 1, left--;
            while (left--) {
                size_t at = SIZE_MAX;
                for (size_t i = 0; i < n; i++)
                    if (!keep[i] && (at == SIZE_MAX || chunk[h * n + i] > chunk[h * n + at]))
                        at = i;
                keep[at] = 1;
            }
            const int32_t *pos = kve_bank_positions(b, h);
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (keep[i])
                    ASSERT_EQ(pos[k++], (int32_t)i);
            if (mode == 0)
                memcpy(first_kept[h], pos, sizeof first_kept[h]);
            else
                differ += memcmp(first_kept[h], pos, sizeof first_kept[h]) != 0;
        }
        kve_bank_free(b);
    }
    ASSERT_EQ(differ, G); /* kvpress's rule at prefix 0 cuts sinks kvevict's keeps */
}

/* Refusals name the field and change nothing; allocation failure at every
 * allocation of a call leaves every head empty, then the call succeeds. */
static void test_refusals_and_memory(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed + 2);
    const size_t n = 300, G = 3, R = 1;
    make(&g, 1, G, R, n, 0);
    kve_bank *b = NULL;
    kve_bank_options bo = kve_bank_default_options();
    ASSERT_OK(kve_bank_new_ex("h2o:budget=30,recent_window=4", G, NULL, &bo, &b));
    kve_prefill_options o = kve_prefill_default_options();
    o.method = KVE_PREFILL_KVZIP;
    o.budgets = KVE_PREFILL_PER_LAYER;
    o.layer_heads = 2; /* does not divide 3 */
    ASSERT_STATUS(kve_bank_prefill(b, 0, G, n, 30, rows, n, R, KVE_REDUCE_MAX, &o), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "layer_heads 2 does not divide the 3 heads");
    o.layer_heads = 0;
    static const struct {
        kve_prefill_budgets budgets;
        double cr;
        const char *msg;
    } bad[] = {{KVE_PREFILL_OVERALL, 1.0, "compression_ratio 1 is not 0 or in (0, 1)"},
               {KVE_PREFILL_OVERALL, -0.5, "compression_ratio -0.5 is not"},
               {KVE_PREFILL_PER_LAYER, NAN, "compression_ratio nan is not"},
               {KVE_PREFILL_PER_HEAD, 0.5, "compression_ratio is kvpress's KVzipPress cut"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        o.budgets = bad[k].budgets;
        o.compression_ratio = bad[k].cr;
        ASSERT_STATUS(kve_bank_prefill(b, 0, G, n, 30, rows, n, R, KVE_REDUCE_MAX, &o),
                      KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), bad[k].msg);
    }
    o.method = KVE_PREFILL_H2O;
    o.budgets = KVE_PREFILL_PER_HEAD;
    ASSERT_STATUS(kve_prefill_scores(n, rows, n, R, KVE_REDUCE_MAX, &o, chunk), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "compression_ratio is kvpress's");
    o.method = KVE_PREFILL_KVZIP;
    o.budgets = KVE_PREFILL_PER_LAYER;
    for (size_t h = 0; h < G; h++)
        ASSERT_EQ(kve_bank_size(b, h), 0);
    /* kvevict's sinks stay whatever the ratio: 0.99 of 900 scores, at most
     * the 888 that are not sinks */
    o.compression_ratio = 0.99;
    o.budgets = KVE_PREFILL_OVERALL;
    ASSERT_OK(kve_bank_prefill(b, 0, G, n, 30, rows, n, R, KVE_REDUCE_MAX, &o));
    size_t left = 0;
    for (size_t h = 0; h < G; h++) {
        ASSERT_TRUE(kve_bank_size(b, h) >= 4);
        for (size_t i = 0; i < 4; i++)
            ASSERT_EQ(kve_bank_positions(b, h)[i], (int32_t)i);
        left += kve_bank_size(b, h);
    }
    ASSERT_EQ((size_t)(0.99 * (double)(G * n)), 891); /* kvpress would cut 3 sinks */
    ASSERT_EQ(left, G * 4);
    o.compression_ratio = 0.0;
    o.budgets = KVE_PREFILL_PER_LAYER;
    o.layer_heads = 2;
    kve_bank_free(b);
    bo.same_positions = 1;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=30,recent_window=4", G, NULL, &bo, &b));
    o.layer_heads = 0;
    ASSERT_STATUS(kve_bank_prefill(b, 0, G, n, 30, rows, n, R, KVE_REDUCE_MAX, &o), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "same_positions");
    kve_bank_free(b);
    /* every allocation failing in turn: the heads grow past their slots here */
    talloc ta;
    talloc_init(&ta);
    bo = kve_bank_default_options();
    bo.allocator = &ta.a;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=30,recent_window=4", G, NULL, &bo, &b));
    o.budgets = KVE_PREFILL_OVERALL;
    for (size_t k = 0;; k++) {
        talloc_fail_after(&ta, k);
        kve_status st = kve_bank_prefill(b, 0, G, n, 30, rows, n, R, KVE_REDUCE_MAX, &o);
        if (st == KVE_OK)
            break;
        ASSERT_EQ(st, KVE_ENOMEM);
        for (size_t h = 0; h < G; h++)
            ASSERT_EQ(kve_bank_size(b, h), 0);
        ASSERT_TRUE(k < 64);
    }
    talloc_fail_after(&ta, SIZE_MAX);
    size_t sum = 0;
    for (size_t h = 0; h < G; h++)
        sum += kve_bank_size(b, h);
    ASSERT_EQ(sum, 3 * 30);
    kve_bank_free(b);
    talloc_check_empty(&ta);
}

/* KVzip+ (kvpress's kvzip_plus_normalization), ported from score_kvzip:
 * attn_weights times 1 / ||h|| by row, then times ||W_o,g v_i|| by column,
 * each a float32 product, then the maximum over the group and the rows.
 * Held to the library with row_scale and key_scale: scores bit for bit
 * (kve_prefill_scores), kept sets through kvpress's cut at 0.5 and 0.8
 * (kve_bank_prefill, OVERALL, kvpress's sinks); and the factors must move
 * the cut (else the test could not tell KVzip+ from KVzip). */
static float hnorm_inv[MAXR];
static float wov[MAXL * MAXG * MAXR * MAXN];

static void kvzip_plus_port(size_t heads, size_t R, size_t r, size_t n)
{
    for (size_t h = 0; h < heads; h++)
        for (size_t i = 0; i < n; i++) {
            float best = 0.0f;
            for (size_t g = 0; g < R; g++)
                for (size_t t = 0; t < r; t++) {
                    float a = rows[((h * R + g) * r + t) * n + i];
                    float w = a * hnorm_inv[t];
                    w = w * wov[(h * R + g) * n + i];
                    best = w > best ? w : best;
                }
            chunk[h * n + i] = (double)best;
        }
}

static void test_kvzip_plus(void)
{
    static const struct {
        size_t L, G, R, n;
    } shapes[] = {{3, 2, 4, 512}, {2, 4, 2, 777}};
    static const double ratios[] = {0.5, 0.8};
    kve_rng g;
    kve_rng_seed(&g, check_seed + 3);
    static double lib[MAXN];
    static unsigned char plain[MAXL * MAXG * MAXN];
    size_t moved = 0;
    for (size_t sh = 0; sh < 2; sh++) {
        const size_t L = shapes[sh].L, G = shapes[sh].G, R = shapes[sh].R, n = shapes[sh].n;
        const size_t prefix = 1; /* a BOS, as the decoder's prompts begin */
        make(&g, L, G, R, n, prefix);
        hnorm_inv[0] = 1.0f / (float)(0.5 + 3.0 * kve_rng_uniform(&g));
        for (size_t i = 0; i < L * G * R * n; i++)
            wov[i] = (float)(0.05 + 2.0 * kve_rng_uniform(&g));
        kvzip_plus_port(L * G, R, 1, n);
        kve_prefill_options o = kve_prefill_default_options();
        o.method = KVE_PREFILL_KVZIP;
        o.row_scale = hnorm_inv;
        for (size_t h = 0; h < L * G; h++) {
            o.key_scale = wov + h * R * n;
            ASSERT_OK(kve_prefill_scores(n, rows + h * R * n, n, R, KVE_REDUCE_MAX, &o, lib));
            for (size_t i = 0; i < n; i++)
                if (lib[i] != chunk[h * n + i])
                    CHECK_FAIL_AT("head %zu key %zu: %.9g, kvpress's KVzip+ %.9g", h, i, lib[i],
                                  chunk[h * n + i]);
        }
        for (size_t ri = 0; ri < 2; ri++) {
            const size_t budget = n - (size_t)floor((double)n * ratios[ri]);
            const double ratio = ratios[ri];
            kvzip_plus_port(L * G, R, 1, n);
            kvpress_cut(L, G, n, 4, prefix, ratio, 0, want);
            kve_bank *b = NULL;
            char spec[64];
            snprintf(spec, sizeof spec, "h2o:budget=%zu,recent_window=8", budget);
            ASSERT_OK(kve_bank_new(spec, L * G, NULL, &b));
            o.key_scale = wov;
            o.prefix = prefix;
            o.budgets = KVE_PREFILL_OVERALL;
            o.compression_ratio = ratio;
            ASSERT_OK(kve_bank_prefill(b, 0, L * G, n, budget, rows, n, R, KVE_REDUCE_MAX, &o));
            expect_kept(b, L * G, n, want);
            kve_bank_free(b);
            /* the same cut without the factors: KVzip's, which must differ */
            for (size_t h = 0; h < L * G; h++)
                for (size_t i = 0; i < n; i++) {
                    double m = 0;
                    for (size_t q = 0; q < R; q++)
                        m = rows[(h * R + q) * n + i] > m ? rows[(h * R + q) * n + i] : m;
                    chunk[h * n + i] = m;
                }
            kvpress_cut(L, G, n, 4, prefix, ratio, 0, plain);
            for (size_t i = 0; i < L * G * n; i++)
                moved += plain[i] != want[i];
            o.key_scale = NULL;
            o.prefix = KVE_PREFILL_NO_PREFIX;
            o.budgets = KVE_PREFILL_PER_HEAD;
            o.compression_ratio = 0.0;
        }
    }
    printf("  KVzip+ equal to kvpress's at 2 shapes x ratios 0.5, 0.8; %zu slots kept "
           "otherwise than KVzip's\n", moved);
    ASSERT_TRUE(moved > 0);
    /* refusals: named, and only with KVzip */
    kve_prefill_options o = kve_prefill_default_options();
    o.method = KVE_PREFILL_KVZIP;
    float bad[1] = {NAN};
    o.row_scale = bad;
    ASSERT_STATUS(kve_prefill_scores(8, rows, 8, 1, KVE_REDUCE_MAX, &o, lib), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "row_scale[0]");
    o.row_scale = NULL;
    static float ks[8] = {1, 1, 1, -1, 1, 1, 1, 1};
    o.key_scale = ks;
    ASSERT_STATUS(kve_prefill_scores(8, rows, 8, 1, KVE_REDUCE_MAX, &o, lib), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "key_scale of query head 0 on key 3");
    ks[3] = 3e38f;
    float big[1] = {1e30f};
    o.row_scale = big;
    ASSERT_STATUS(kve_prefill_scores(8, rows, 8, 1, KVE_REDUCE_MAX, &o, lib), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "overflows float32");
    o.method = KVE_PREFILL_H2O;
    ASSERT_STATUS(kve_prefill_scores(8, rows, 8, 1, KVE_REDUCE_MAX, &o, lib), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "row_scale and key_scale are KVzip's");
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_equal_to_kvpress);
    RUN(test_sinks);
    RUN(test_refusals_and_memory);
    RUN(test_kvzip_plus);
    return CHECK_DONE();
}
