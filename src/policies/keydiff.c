/* SPDX-License-Identifier: MIT */
/*
 * keydiff.c - keep the distinctive keys (Park, Jones, Morse, Goel, Lee,
 * Lott: KeyDiff, 2025; kvpress's KeyDiffPress).
 *
 * Legend: n = kept positions before the step, d = key_dim.
 * Columns beyond h2o's: unit (float32[d] a slot): the key's direction
 *   u = (float)(k_j / max(||k||, 1e-12)) (torch's F.normalize), stored once
 *   when the position is admitted. Per head: S (double[d], aux scratch).
 * At every step, after storing the newcomer's unit key in slot n:
 *   S_j     = sum over slots i = 0 .. n, in kept order, of (double)u_i[j]
 *             (the anchor: the mean of the kept keys' directions, times n + 1);
 *   score_i = -(u_i . S), the products in double in 8 partial sums by index
 *             mod 8, added pairwise (KVE_KEY_LANES).
 * -(u_i . S) = -(n + 1) |mean| cos(k_i, mean) for a key of norm above 1e-12:
 * the order of KeyDiff's score -cos(k_i, mean), so the key most similar to
 * the anchor goes first (ties to the lower position). The anchor is that of
 * the cache the eviction chooses from: every kept key and the new one, the
 * recent window included. A key of norm 0 has u = 0 and scores 0.
 * Attention is never read (a weight vector is only validated).
 * Cost per step: O((n + 1) d): two passes over the unit keys (the sum, the
 * scores) plus the argmin; the hole the last evict left is closed first
 * (a memmove of the slots after it). 13 + 4 d bytes a slot, plus 8 d bytes
 * a head for S. Every pass is the same plain C compiled per instruction set
 * (fixed summation orders, no fused multiply-add), so every path gives the
 * same bits.
 */
#include "../policy_impl.h"

#include <stdio.h>

enum { UNIT = KVE_COL_EXTRA0 };

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(0),
};

static kve_status init(kve_config *c)
{
    kve__column(c, UNIT, c->key_dim, sizeof(float));
    c->aux_bytes = c->key_dim * sizeof(double);
    return kve__check_recent_window(c);
}

/* u (d) = the direction of k (d), of norm `norm`. */
KVE_ALWAYS_INLINE void unit_key(const float *k, size_t d, double norm, float *u)
{
    double den = norm > 1e-12 ? norm : 1e-12;
    for (size_t j = 0; j < d; j++)
        u[j] = (float)((double)k[j] / den);
}

/* S (d) = the sum of the m unit keys of u (m, d); score[i] = -(u_i . S). */
KVE_ALWAYS_INLINE void score_pass(const float *u, size_t m, size_t d, double *S, double *score)
{
    for (size_t j = 0; j < d; j++)
        S[j] = 0.0;
    for (size_t i = 0; i < m; i++) {
        const float *ui = u + i * d;
        for (size_t j = 0; j < d; j++)
            S[j] += (double)ui[j];
    }
    for (size_t i = 0; i < m; i++) {
        const float *ui = u + i * d;
        double acc[KVE_KEY_LANES] = {0};
        size_t j = 0;
        for (; j + KVE_KEY_LANES <= d; j += KVE_KEY_LANES)
            for (size_t l = 0; l < KVE_KEY_LANES; l++)
                acc[l] += (double)ui[j + l] * S[j + l];
        for (size_t l = 0; j < d; j++, l++)
            acc[l] += (double)ui[j] * S[j];
        for (size_t w = KVE_KEY_LANES / 2; w; w /= 2)
            for (size_t l = 0; l < w; l++)
                acc[l] += acc[l + w];
        score[i] = -acc[0];
    }
}

KVE_PER_ISA(unit, int, (const float *k, size_t d, double norm, float *u),
            (unit_key(k, d, norm, u), 0), (unit_key(k, d, norm, u), 0),
            (unit_key(k, d, norm, u), 0))
KVE_PER_ISA(pass, int, (const float *u, size_t m, size_t d, double *S, double *score),
            (score_pass(u, m, d, S, score), 0), (score_pass(u, m, d, S, score), 0),
            (score_pass(u, m, d, S, score), 0))

/* An image's unit keys are directions: finite, of norm at most 1 (a key's
 * is 1 within the rounding of its d floats; a key of norm below 1e-12 gives
 * less, the zero key 0). The scores are those of the last step (positions
 * removed since then kept theirs): finite is all they must be. */
static bool check_state(const kve_config *c, const kve_head *h, char *msg, size_t cap)
{
    const size_t d = c->key_dim;
    const float *u = h->col[UNIT];
    for (size_t i = 0; i < h->size; i++) {
        double sq = 0.0;
        for (size_t j = 0; j < d; j++) {
            double v = (double)u[i * d + j];
            sq += v * v;
        }
        if (!(sq <= 1.0 + 0x1p-20)) { /* NaN and infinite entries fail here too */
            snprintf(msg, cap, "unit[%zu] has squared norm %g: not a unit key", i, sq);
            return false;
        }
    }
    return true;
}

static size_t step(const kve_config *c, kve_head *h, const float *key, size_t limit, kve_isa isa)
{
    kve__close_gap(c, h);
    const size_t n = h->size, d = c->key_dim;
    float *u = h->col[UNIT];
    double *score = h->col[KVE_COL_SCORE];
    (void)unit_isa[isa](key, d, kve__key_norm(key, d), u + n * d);
    (void)pass_isa[isa](u, n + 1, d, h->aux, score);
    return kve__shift_argmin(score, n + 1, n + 1, limit);
}

const kve_policy_type kve__keydiff_type = {
    .name = "keydiff",
    .summary = "the keys least similar to the mean kept key (reads keys, not attention)",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED | KVE_TYPE_READS_KEYS,
    .init = init,
    .step_keys = step,
    .select = kve__select_argmin,
    .evict = kve__evict_scored,
    .check_state = check_state,
};
