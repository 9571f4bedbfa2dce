/* SPDX-License-Identifier: MIT */
/*
 * h2o_mean.c - mean-normalised heavy hitters (NORM_SUM in OpenVINO GenAI;
 * ObservedAttention in kvpress).
 *
 * Score: the sum of a position's attention divided by the number of
 * informative steps it has been kept through, which removes the cumulative
 * sum's bias toward old positions. A position not yet observed scores 0
 * (the recent window protects it).
 * Columns beyond h2o's: sum (double) and birth (uint32_t, the value of the
 * informative-step counter when the position was admitted), so the count is
 * observed - birth with no per-slot counter to update. Positions are
 * strictly increasing int32, so there are at most 2^31 steps and the count
 * fits a uint32; it is converted to double exactly on every path.
 * diagonal=1 (kvpress's ObservedAttentionPress): a KVE_PREFILL_H2O prefill
 * (prefill.c) seeds the kept prompt positions instead of leaving them as
 * admitted: position i of an n-token prompt gets sum = its column sum (the
 * weights of queries i .. n-1, its own included), birth = i and observed =
 * n, so its count is n - i and its score sum / (n - i), the rank the
 * prefill chose it by. Steps are the default's (a step's row does not carry
 * the newcomer's weight on itself).
 * Cost: one add and one divide per kept position per step; 25 bytes a slot.
 */
#include "../policy_impl.h"

#include <stdio.h>
#include <string.h>

enum { SUM = KVE_COL_EXTRA0, BIRTH = KVE_COL_EXTRA1 };

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(32),
    KVE_DEF_PAGES,
    KVE_DEF_VNORM,
    {.key = "diagonal", .kind = KVE_PARAM_SIZE, .idefault = 0, .imin = 0, .imax = 1,
     .flags = KVE_PARAM_OMIT_DEFAULT, .offset = offsetof(kve_params, diagonal),
     .doc = "1: a prefill seeds each mean with the prompt's weights, its own query's "
            "included (kvpress's ObservedAttentionPress)"},
};

static kve_status init(kve_config *c)
{
    kve__column(c, SUM, 1, sizeof(double));
    kve__column(c, BIRTH, 1, sizeof(uint32_t));
    return kve__check_recent_window(c);
}

/* The rule, per slot: sum = sum + a; score = sum / (now - birth). */
typedef struct mean_ctx {
    double *score;
    double *sum;
    uint32_t *birth;
    uint32_t now;
} mean_ctx;

KVE_ALWAYS_INLINE void mean_prep(mean_ctx *x, const kve_config *c, kve_head *h)
{
    (void)c;
    x->score = h->col[KVE_COL_SCORE];
    x->sum = h->col[SUM];
    x->birth = h->col[BIRTH];
    x->now = (uint32_t)h->observed;
}

#define KVE_OBS mean
#define KVE_OBS_LANE                                                                        \
    {                                                                                       \
        KV_d sum = kv_add(kv_ld(x->sum + src), kv_cvt(a));                                  \
        KV_h birth = kv_ldh(x->birth + src);                                                \
        kv_st(x->sum + i, sum);                                                             \
        kv_sth(x->birth + i, birth);                                                        \
        KV_d s = kv_div(sum, kv_cvth(kv_subh(kv_seth(x->now), birth)));                     \
        kv_st(x->score + i, s);                                                             \
        return s;                                                                           \
    }
#include "../observe.inc"

static const kve_lane mean_lane = KVE_LANE(mean);

static void admit(const kve_config *c, kve_head *h, size_t i)
{
    (void)c;
    ((double *)h->col[SUM])[i] = 0.0;
    ((uint32_t *)h->col[BIRTH])[i] = (uint32_t)h->observed;
}

/* diagonal=1's prefill (policy_impl.h, prefill_mean). */
static bool prefill_mean(const kve_config *c)
{
    return c->params.diagonal != 0;
}

static double prefill_rank(const kve_config *c, size_t i, size_t n, double col)
{
    (void)c;
    return col / (double)(n - i);
}

static double prefill_seed(const kve_config *c, kve_head *h, size_t slot, size_t i, size_t n,
                           double col)
{
    (void)c;
    h->observed = n; /* the prompt's n queries, each an informative step */
    ((double *)h->col[SUM])[slot] = col;
    ((uint32_t *)h->col[BIRTH])[slot] = (uint32_t)i;
    return col / (double)(n - i); /* exactly check_state's sum / (observed - birth) */
}

/* An image's columns agree: a slot observed k = now - birth steps (mod 2^32,
 * as the rule counts; k <= observed and k < 2^31) has a finite sum >= 0, 0 when k is 0,
 * and its score is exactly sum / k (0 when k is 0), the rule's last
 * division. */
static bool check_state(const kve_config *c, const kve_head *h, char *msg, size_t cap)
{
    (void)c;
    const double *score = h->col[KVE_COL_SCORE], *sum = h->col[SUM];
    const uint32_t *birth = h->col[BIRTH];
    for (size_t i = 0; i < h->size; i++) {
        uint32_t k = (uint32_t)h->observed - birth[i];
        double want = k ? sum[i] / (double)k : 0.0;
        if (k > h->observed || k > INT32_MAX) { /* a slot is observed at most 2^31 - 1 times */
            snprintf(msg, cap, "birth[%zu] = %lu is after the %llu steps observed", i,
                     (unsigned long)birth[i], (unsigned long long)h->observed);
            return false;
        }
        if (!(isfinite(sum[i]) && sum[i] >= 0.0) || (k == 0 && sum[i] != 0.0)) {
            snprintf(msg, cap, "sum[%zu] = %g is not attention received in %lu steps", i,
                     sum[i], (unsigned long)k);
            return false;
        }
        uint64_t want_bits, bits; /* bit for bit: -0.0 is not the rule's 0 */
        memcpy(&want_bits, &want, sizeof want);
        memcpy(&bits, &score[i], sizeof bits);
        if (want_bits != bits) {
            snprintf(msg, cap, "score[%zu] = %.17g is not sum / steps = %.17g", i, score[i],
                     want);
            return false;
        }
    }
    return true;
}

const kve_policy_type kve__h2o_mean_type = {
    .name = "h2o_mean",
    .summary = "cumulative attention divided by steps observed (NORM_SUM)",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED | KVE_TYPE_VNORM,
    .init = init,
    .lane = &mean_lane,
    .admit = admit,
    .select = kve__select_argmin,
    .evict = kve__evict_scored,
    .check_state = check_state,
    .prefill_mean = prefill_mean,
    .prefill_rank = prefill_rank,
    .prefill_seed = prefill_seed,
};
