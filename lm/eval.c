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
    double total = 0;
    int32_t prev = s->model->config.bos;
    size_t first = 0;
    if (prev < 0 && n > 0) { /* no BOS: tokens[0] is context, never predicted */
        prev = tokens[0], first = 1;
        if (per_token)
            per_token[0] = 0;
    }
    for (size_t i = first; st == KVE_OK && i < n; i++) {
        st = lm_forward(s, prev);
        if (st != KVE_OK)
            break;
        double t = lm_token_nats(s->logits, V, tokens[i]);
        if (per_token)
            per_token[i] = t;
        total += t;
        prev = tokens[i];
    }
    if (st == KVE_OK)
        *nats = total;
    return st;
}
