/* SPDX-License-Identifier: MIT */
/*
 * scissorhands.c - Scissorhands (Liu et al., NeurIPS 2023).
 *
 * Score: the number of informative steps in which a position beat its fair
 * share, attn[i] > 1/n strictly, n = the kept positions that step. The fair
 * share is rounded to float32, the precision weights arrive in, so a uniform
 * row casts no vote. At n = 1 the only weight cannot exceed 1/1: a position
 * that takes almost everything early gets few votes, where h2o's sum would
 * defend it forever.
 * history = 0 counts votes over the whole lifetime (score += vote).
 * history = W (1..64) counts the last W informative steps: a per-slot 64-bit
 * shift register of votes, and the score gains the new vote and loses the
 * one leaving the window. A NULL step casts no votes and does not shift.
 * The two are two rules (lifetime, windowed); init picks one.
 * Cost: one compare per kept position per step; 13 bytes a slot, 21 with a
 * history.
 */
#include "../policy_impl.h"

#include <stdio.h>

enum { VOTES = KVE_COL_EXTRA0 };
enum { MAX_HISTORY = 64 };

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(32),
    KVE_DEF_SIZE("history", 0, 0, MAX_HISTORY, history,
                 "informative steps whose votes count (0 = the whole lifetime)"),
    KVE_DEF_PAGES,
};

/* Both rules: the fair share of this step, and (windowed) the vote register's
 * oldest bit and mask. */
typedef struct votes_ctx {
    double *score;
    uint64_t *votes;
    float fair;
    uint64_t oldest, mask;
} votes_ctx;

/* A pass over n > 0 slots only reads the fair share: 1/n needs no guard. */
KVE_ALWAYS_INLINE void lifetime_prep(votes_ctx *x, const kve_config *c, kve_head *h)
{
    (void)c;
    x->score = h->col[KVE_COL_SCORE];
    x->fair = (float)(1.0 / (double)(h->size | (h->size == 0)));
}

KVE_ALWAYS_INLINE void windowed_prep(votes_ctx *x, const kve_config *c, kve_head *h)
{
    size_t w = c->params.history; /* 1 .. 64 */
    lifetime_prep(x, c, h);
    x->votes = h->col[VOTES];
    x->oldest = (uint64_t)1 << (w - 1);
    x->mask = (x->oldest << 1) - 1; /* w = 64: 2^64 - 1 by wrap-around */
}

/* ---- lifetime: score = score + (a > fair) ---- */

typedef votes_ctx lifetime_ctx;

#define KVE_OBS lifetime
#define KVE_OBS_LANE                                                                        \
    {                                                                                       \
        KV_m vote = kv_gtf(a, kv_setf(x->fair));                                            \
        KV_d s = kv_add(kv_ld(x->score + src), kv_sel(vote, kv_set(1.0), kv_set(0.0)));     \
        kv_st(x->score + i, s);                                                             \
        return s;                                                                           \
    }
#include "../observe.inc"

/* ---- windowed: votes = (votes << 1 | vote) & mask; score += vote - leaving ---- */

typedef votes_ctx windowed_ctx;

#define KVE_OBS windowed
#define KVE_OBS_LANE                                                                        \
    {                                                                                       \
        const KV_d one = kv_set(1.0), zero = kv_set(0.0);                                   \
        KV_u v = kv_ldu(x->votes + src);                                                    \
        KV_m vote = kv_gtf(a, kv_setf(x->fair));                                            \
        KV_m leaving = kv_testu(v, kv_setu(x->oldest));                                     \
        KV_u next = kv_oru(kv_shlu(v, 1), kv_selu(vote, kv_setu(1), kv_setu(0)));           \
        kv_stu(x->votes + i, kv_andu(next, kv_setu(x->mask)));                              \
        KV_d d = kv_sub(kv_sel(vote, one, zero), kv_sel(leaving, one, zero));               \
        KV_d s = kv_add(kv_ld(x->score + src), d);                                          \
        kv_st(x->score + i, s);                                                             \
        return s;                                                                           \
    }
#include "../observe.inc"

static const kve_observe_fn windowed_rule[KVE_ISA_COUNT] = KVE_OBSERVE_TABLE(windowed);

static kve_status init(kve_config *c)
{
    if (c->params.history) {
        kve__column(c, VOTES, 1, sizeof(uint64_t));
        c->observe = windowed_rule;
    }
    return kve__check_recent_window(c);
}

static void admit(const kve_config *c, kve_head *h, size_t i)
{
    if (c->params.history)
        ((uint64_t *)h->col[VOTES])[i] = 0;
}

/* An image's scores are counts of steps (whole, at most the steps observed)
 * and, with a history, exactly the votes its register holds, none of them
 * older than the history. */
static bool check_state(const kve_config *c, const kve_head *h, char *msg, size_t cap)
{
    const double *score = h->col[KVE_COL_SCORE];
    const size_t w = c->params.history;
    const uint64_t mask = w ? (((uint64_t)1 << (w - 1)) << 1) - 1 : 0;
    for (size_t i = 0; i < h->size; i++) {
        double s = score[i];
        if (!(s >= 0.0 && s <= 0x1p53 && s <= (double)h->observed && s == (double)(uint64_t)s)) {
            snprintf(msg, cap, "score[%zu] = %g is not a count of the %llu steps observed", i, s,
                     (unsigned long long)h->observed);
            return false;
        }
        if (!w)
            continue;
        uint64_t v = ((const uint64_t *)h->col[VOTES])[i];
        if (v & ~mask) {
            snprintf(msg, cap, "votes[%zu] = %#llx has votes older than history %zu", i,
                     (unsigned long long)v, w);
            return false;
        }
        unsigned n = 0;
        for (; v; v &= v - 1)
            n++;
        if (s != (double)n) {
            snprintf(msg, cap, "score[%zu] = %g, but votes[%zu] holds %u votes", i, s, i, n);
            return false;
        }
    }
    return true;
}

const kve_policy_type kve__scissorhands_type = {
    .name = "scissorhands",
    .summary = "count of steps a position beat its fair share 1/n",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED,
    .init = init,
    .observe = KVE_OBSERVE_TABLE(lifetime),
    .admit = admit,
    .select = kve__select_argmin,
    .evict = kve__evict_scored,
    .check_state = check_state,
};
