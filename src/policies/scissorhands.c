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
 * Cost: one compare per kept position per step; 13 bytes a slot, 21 with a
 * history.
 */
#include "../policy_impl.h"

enum { VOTES };
enum { MAX_HISTORY = 64 };

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(32),
    KVE_DEF_SIZE("history", 0, 0, MAX_HISTORY, history,
                 "informative steps whose votes count (0 = the whole lifetime)"),
};

static kve_status init(kve_policy *p)
{
    p->extra_elem[VOTES] = p->params.history ? sizeof(uint64_t) : 0;
    return kve__check_recent_window(p);
}

static void observe(kve_policy *p, const float *attn, size_t n)
{
    if (n == 0)
        return;
    double *score = p->score;
    const float fair = (float)(1.0 / (double)n);
    const size_t w = p->params.history;
    if (w == 0) {
        for (size_t i = 0; i < n; i++)
            score[i] += attn[i] > fair ? 1.0 : 0.0;
        return;
    }
    uint64_t *votes = p->extra[VOTES];
    const uint64_t oldest = (uint64_t)1 << (w - 1);
    const uint64_t mask = w == MAX_HISTORY ? UINT64_MAX : (((uint64_t)1 << w) - 1);
    for (size_t i = 0; i < n; i++) {
        uint64_t vote = attn[i] > fair;
        uint64_t leaving = (votes[i] & oldest) != 0;
        votes[i] = ((votes[i] << 1) | vote) & mask;
        score[i] += (double)vote - (double)leaving;
    }
}

static void admit(kve_policy *p, size_t i)
{
    if (p->params.history)
        ((uint64_t *)p->extra[VOTES])[i] = 0;
}

const kve_policy_type kve__scissorhands_type = {
    .name = "scissorhands",
    .summary = "count of steps a position beat its fair share 1/n",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED,
    .init = init,
    .observe = observe,
    .admit = admit,
    .select = kve__select_argmin,
};
