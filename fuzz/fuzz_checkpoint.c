/*
 * fuzz_checkpoint.c - the llama2.c checkpoint loader and the decode step,
 * on whatever bytes the fuzzer makes.
 *
 * Each input is copied into an aligned buffer and parsed with
 * lm_model_from_memory. Checked:
 *   - a refusal is KVE_EFORMAT (or KVE_ENOMEM) with a non-empty one-line
 *     message and *out untouched;
 *   - an accepted model has positive dimensions that divide as the format
 *     requires, and every tensor lies inside the input (the header promised
 *     exactly the bytes there are);
 *   - a few decode steps under a window policy, in both position modes, either
 *     succeed with one logit per vocabulary entry or (weights whose products
 *     overflow, NaN and infinities being refused at load, reaching a
 *     policy) fail with KVE_EINVAL and a message, never a crash.
 * Models stay small: the input holds all their weights.
 */
#include "kvevict.h"
#include "lm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_checkpoint: CHECK(%s) failed at line %d (last error: %s)\n", #c, \
                    __LINE__, kve_last_error());                                                    \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static int inside(const float *p, size_t n, const void *base, size_t size)
{
    const char *b = base, *q = (const char *)p;
    return q >= b && (size_t)(q - b) <= size && n * sizeof(float) <= size - (size_t)(q - b);
}

static void check_model(const lm_model *m, const void *base, size_t size)
{
    const lm_config *c = &m->config;
    CHECK(c->dim > 0 && c->hidden_dim > 0 && c->n_layers > 0 && c->n_heads > 0);
    CHECK(c->n_kv_heads > 0 && c->vocab_size > 0 && c->seq_len > 0);
    CHECK(c->dim % c->n_heads == 0 && c->n_heads % c->n_kv_heads == 0);
    CHECK(c->head_size == c->dim / c->n_heads && c->head_size % 2 == 0);
    size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t K = (size_t)c->n_kv_heads * (size_t)c->head_size, V = (size_t)c->vocab_size;
    const lm_weights *w = &m->weights;
    CHECK(inside(w->token_embedding, V * D, base, size));
    CHECK(inside(w->wq, L * D * D, base, size) && inside(w->wk, L * K * D, base, size));
    CHECK(inside(w->wv, L * K * D, base, size) && inside(w->wo, L * D * D, base, size));
    CHECK(inside(w->w1, L * F * D, base, size) && inside(w->w2, L * D * F, base, size));
    CHECK(inside(w->w3, L * F * D, base, size) && inside(w->wcls, V * D, base, size));
    CHECK(inside(w->rms_att, L * D, base, size) && inside(w->rms_ffn, L * D, base, size));
    CHECK(inside(w->rms_final, D, base, size));
}

static void decode_a_little(const lm_model *m, lm_positions positions)
{
    lm_options opt = {.policy = "window:budget=2", .positions = positions};
    lm_state *s = NULL;
    CHECK(lm_state_new(m, &opt, &s) == KVE_OK);
    int32_t V = m->config.vocab_size;
    for (int32_t t = 0; t < 4; t++) {
        kve_status st = lm_forward(s, (t * 7) % V);
        if (st != KVE_OK) {
            CHECK(st == KVE_EINVAL && kve_last_error()[0] != '\0');
            break;
        }
        CHECK(s->pos == t + 1);
        CHECK(lm_state_kept(s, 0, 0) == (size_t)(t + 1 < 2 ? t + 1 : 2));
    }
    CHECK(lm_forward(s, V) == KVE_EINVAL);
    lm_state_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void *buf = malloc(size ? size : 1); /* malloc aligns for float */
    CHECK(buf != NULL);
    if (size)
        memcpy(buf, data, size);
    lm_model *m = (lm_model *)&buf;
    kve_status st = lm_model_from_memory(buf, size, NULL, &m);
    if (st != KVE_OK) {
        CHECK(st == KVE_EFORMAT || st == KVE_ENOMEM);
        CHECK(kve_last_error()[0] != '\0' && strchr(kve_last_error(), '\n') == NULL);
        CHECK(m == (lm_model *)&buf);
        free(buf);
        return 0;
    }
    check_model(m, buf, size);
    decode_a_little(m, LM_POS_ORIGINAL);
    decode_a_little(m, LM_POS_CACHE);
    lm_model_free(m);
    free(buf);
    return 0;
}
