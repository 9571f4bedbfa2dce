/*
 * eval.c - the loss of the model on a window of text.
 *
 * A window is BOS (the model's config.bos) followed by its tokens, decoded
 * from a fresh cache; the loss sums -log p(token) over the window's tokens
 * (never over BOS; without BOS the first token is context only), with
 * the log-sum-exp taken in double so that the sum over a whole text does
 * not depend on float rounding of the normaliser.
 */
#include "lm.h"

#include <math.h>

double lm_token_nats(const float *logits, int32_t vocab, int32_t target)
{
    if (vocab < 1 || target < 0 || target >= vocab)
        return NAN;
    double max = logits[0];
    for (int32_t i = 1; i < vocab; i++)
        if (logits[i] > max)
            max = logits[i];
    double sum = exp((double)logits[0] - max);
    for (int32_t i = 1; i < vocab; i++)
        sum += exp((double)logits[i] - max);
    return max + log(sum) - (double)logits[target];
}

/* lm_window_nats's running sum: the token each logits row predicts. */
typedef struct window_sum {
    const int32_t *tokens;
    double *per_token, total; /* the terms added in token order */
    int32_t V;
    size_t at; /* the index of the call's first token in the window */
} window_sum;

static void window_add(void *user, size_t i, const float *logits)
{
    window_sum *w = user;
    double t = lm_token_nats(logits, w->V, w->tokens[w->at + i]);
    if (w->per_token)
        w->per_token[w->at + i] = t;
    w->total += t;
}

kve_status lm_window_nats(lm_state *s, const int32_t *tokens, size_t n, double *nats,
                          double *per_token)
{
    if (!s || (!tokens && n) || !nats)
        return kve_set_error(KVE_EINVAL, "window: NULL argument");
    int32_t V = s->model->config.vocab_size;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return kve_set_error(KVE_EINVAL, "window: token %d at %zu is outside the vocabulary [0, %d)",
                           tokens[i], i, V);
    kve_status st = lm_state_reset(s);
    window_sum w = {tokens, per_token, 0.0, V, 0};
    const int32_t bos = s->model->config.bos;
    if (st == KVE_OK && n) { /* BOS, then tokens[0 .. n - 1) in blocks (lm_forward_batch) */
        if (bos >= 0)
            st = lm_forward_batch(s, &bos, 1, window_add, &w);
        else if (per_token) /* no BOS: tokens[0] is context, never predicted */
            per_token[0] = 0;
        w.at = 1;
        if (st == KVE_OK)
            st = lm_forward_batch(s, tokens, n - 1, window_add, &w);
    }
    if (st == KVE_OK)
        *nats = w.total;
    return st;
}
