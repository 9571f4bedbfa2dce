/* SPDX-License-Identifier: MIT */
/*
 * sample.c - the next token from a step's logits: llama.cpp's sampler chain
 * (its defaults and definitions, docs/decoder.md), deterministic for a seed.
 *
 * The chain, in llama.cpp's order: banned tokens out (the pass keys, unless
 * asked for); the repetition penalty over the distinct tokens of the last
 * repeat_last_n; then, greedy (temperature <= 0), the first maximum; else
 * top-k by logit, top-p on the softmax of what is left (before the
 * temperature, as llama.cpp's top-p sees it), the temperature, and one draw
 * from the softmax of the survivors with kve_rng_uniform.
 *
 * Invariants: the same (logits, recent tokens, generator state) give the
 * same token and the same generator state on every machine: the sort is
 * total (logit descending, then id ascending), the softmax and the running
 * sums are double in that order, and the generator is drawn exactly once
 * per call when the temperature is positive, never when greedy. Nothing
 * allocates: the caller passes a scratch of V candidates.
 */
#include "lm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

lm_sampler_params lm_sampler_default_params(void)
{
    lm_sampler_params p = {.temperature = 0.0, .top_k = 40, .top_p = 0.95,
                           .repeat_penalty = 1.0, .repeat_last_n = 64};
    return p;
}

kve_status lm_sampler_check(const lm_sampler_params *p)
{
    if (!p)
        return kve_set_error(KVE_EINVAL, "sampler: NULL parameters");
    if (!(p->temperature >= 0 && p->temperature <= 1e6))
        return kve_set_error(KVE_EINVAL, "sampler: temperature %g is not in [0, 1e6]",
                             p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return kve_set_error(KVE_EINVAL, "sampler: top-p %g is not in (0, 1]", p->top_p);
    if (!(p->repeat_penalty > 0 && p->repeat_penalty <= 1e6))
        return kve_set_error(KVE_EINVAL, "sampler: repeat-penalty %g is not in (0, 1e6]",
                             p->repeat_penalty);
    if (p->top_k < 0)
        return kve_set_error(KVE_EINVAL, "sampler: top-k %d is negative", p->top_k);
    return KVE_OK;
}

/* Logit descending, then id ascending: a total order, so qsort's result
 * does not depend on its algorithm. */
static int by_logit(const void *a, const void *b)
{
    const lm_candidate *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Sifts entry i of the heap h[0 .. n) down; the heap's top is the entry
 * that by_logit orders last (the least likely kept). */
static void sift(lm_candidate *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && by_logit(&h[l], &h[m]) > 0)
            m = l;
        if (r < n && by_logit(&h[r], &h[m]) > 0)
            m = r;
        if (m == i)
            return;
        lm_candidate t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Moves the k candidates that by_logit orders first into c[0 .. k), in no
 * particular order; returns k. A heap of k: O(n log k), so top-k over a
 * large vocabulary does not sort all of it. The set is defined by the
 * total order, so it does not depend on the algorithm. */
static size_t keep_top(lm_candidate *c, size_t n, size_t k)
{
    for (size_t i = k / 2; i-- > 0;)
        sift(c, k, i);
    for (size_t i = k; i < n; i++)
        if (by_logit(&c[i], &c[0]) < 0) {
            c[0] = c[i];
            sift(c, k, 0);
        }
    return k;
}

int32_t lm_sample(const lm_sampler_params *p, const float *logits, int32_t vocab,
                  const unsigned char *banned, const int32_t *recent, size_t n_recent,
                  kve_rng *rng, lm_candidate *scratch)
{
    size_t n = 0;
    for (int32_t i = 0; i < vocab; i++)
        if (!banned || !banned[i])
            scratch[n++] = (lm_candidate){.id = i, .logit = logits[i]};
    if (n == 0)
        return -1;
    /* The penalty: each distinct token of the window once, llama.cpp's rule
     * (a logit above 0 divided, one at or below 0 multiplied). */
    size_t last = p->repeat_last_n > 0 ? (size_t)p->repeat_last_n : 0;
    size_t from = n_recent > last ? n_recent - last : 0;
    if (p->repeat_penalty != 1.0 && recent) {
        float pen = (float)p->repeat_penalty;
        for (size_t r = from; r < n_recent; r++) {
            int32_t t = recent[r];
            int seen = 0;
            for (size_t q = from; q < r && !seen; q++)
                seen = recent[q] == t;
            if (seen || t < 0 || t >= vocab)
                continue;
            for (size_t c = 0; c < n; c++) /* candidates are in id order here */
                if (scratch[c].id == t) {
                    float *l = &scratch[c].logit;
                    *l = *l <= 0 ? *l * pen : *l / pen;
                    break;
                }
        }
    }
    if (p->temperature <= 0) {
        size_t best = 0;
        for (size_t c = 1; c < n; c++)
            if (scratch[c].logit > scratch[best].logit)
                best = c;
        return scratch[best].id;
    }
    if (p->top_k > 0 && (size_t)p->top_k < n)
        n = keep_top(scratch, n, (size_t)p->top_k);
    qsort(scratch, n, sizeof *scratch, by_logit);
    if (p->top_p < 1) {
        double sum = 0, cum = 0, max = scratch[0].logit;
        for (size_t c = 0; c < n; c++)
            sum += exp((double)scratch[c].logit - max);
        for (size_t c = 0; c < n; c++) {
            cum += exp((double)scratch[c].logit - max) / sum;
            if (cum >= p->top_p) {
                n = c + 1;
                break;
            }
        }
    }
    double sum = 0, max = scratch[0].logit / p->temperature;
    for (size_t c = 0; c < n; c++)
        sum += exp((double)scratch[c].logit / p->temperature - max);
    double r = kve_rng_uniform(rng) * sum, cdf = 0;
    for (size_t c = 0; c < n; c++) {
        cdf += exp((double)scratch[c].logit / p->temperature - max);
        if (r < cdf)
            return scratch[c].id;
    }
    return scratch[n - 1].id;
}

size_t lm_reserved_tokens(const lm_tokenizer *t, unsigned char *mask)
{
    size_t count = 0;
    for (int32_t i = 0; i < t->n_pieces; i++) {
        const char *s = t->piece[i];
        int key = t->len[i] == 7 && memcmp(s, "<key", 4) == 0 && s[4] >= '0' && s[4] <= '9' &&
                  s[5] >= '0' && s[5] <= '9' && s[6] == '>';
        mask[i] = (unsigned char)key;
        count += (size_t)key;
    }
    return count;
}
