/* SPDX-License-Identifier: MIT */
/*
 * fuzz_model.h - what the checkpoint fuzz targets (fuzz_checkpoint,
 * fuzz_gguf) check of a model the loader accepted, and of a refusal: the
 * promises of lm_model_from_memory, whatever the format.
 *   - a refusal is KVE_EFORMAT (or KVE_ENOMEM) with a non-empty one-line
 *     message and *out untouched;
 *   - an accepted model has positive dimensions that divide as the formats
 *     require, and every matrix (its scales too) and norm lies inside the
 *     input with the shape the config implies;
 *   - a few decode steps under a window policy, in both position modes,
 *     either succeed with one logit per vocabulary entry or (finite weights
 *     whose products overflow float32; NaN and infinite weights are refused
 *     at load) fail with KVE_ERANGE and a message naming the first
 *     non-finite activation, never a crash.
 * Include after defining FUZZ_TARGET (the target's name, for messages).
 */
#ifndef KVE_FUZZ_MODEL_H
#define KVE_FUZZ_MODEL_H

#include "kvevict.h"
#include "lm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s: CHECK(%s) failed at line %d (last error: %s)\n", FUZZ_TARGET, #c, \
                    __LINE__, kve_last_error());                                                    \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static int inside(const void *p, size_t bytes, const void *base, size_t size)
{
    const char *b = base, *q = p;
    return q >= b && (size_t)(q - b) <= size && bytes <= size - (size_t)(q - b);
}

/* A matrix of the expected shape whose bytes (and scales) lie in the input. */
static int matrix_inside(const lm_matrix *w, size_t rows, size_t cols, const void *base,
                         size_t size)
{
    if (w->rows != rows || w->cols != cols || !inside(w->data, rows * w->row_bytes, base, size))
        return 0;
    return w->type != LM_I8G ||
           (w->group > 0 && cols % w->group == 0 &&
            inside(w->scales, rows * cols / w->group * 4, base, size));
}

/* A norm inside the input, or in the model's own widened copies. */
static int norm_inside(const lm_model *m, const float *p, size_t D, const void *base, size_t size)
{
    return inside(p, D * sizeof(float), base, size) || (m->norms && p >= m->norms);
}

static void check_model(const lm_model *m, const void *base, size_t size)
{
    const lm_config *c = &m->config;
    CHECK(c->dim > 0 && c->hidden_dim > 0 && c->n_layers > 0 && c->n_heads > 0);
    CHECK(c->n_kv_heads > 0 && c->vocab_size > 0 && c->seq_len > 0);
    CHECK(c->dim % c->n_heads == 0 && c->n_heads % c->n_kv_heads == 0);
    CHECK(c->head_size == c->dim / c->n_heads && c->head_size % 2 == 0);
    CHECK(c->norm_eps > 0 && c->rope_theta > 0);
    size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t K = (size_t)c->n_kv_heads * (size_t)c->head_size, V = (size_t)c->vocab_size;
    const lm_weights *w = &m->weights;
    CHECK(matrix_inside(&w->token_embedding, V, D, base, size));
    CHECK(matrix_inside(&w->wcls, V, D, base, size));
    CHECK(norm_inside(m, w->rms_final, D, base, size));
    for (size_t l = 0; l < L; l++) {
        const lm_layer *ly = &w->layer[l];
        CHECK(matrix_inside(&ly->wq, D, D, base, size) && matrix_inside(&ly->wk, K, D, base, size));
        CHECK(matrix_inside(&ly->wv, K, D, base, size) && matrix_inside(&ly->wo, D, D, base, size));
        CHECK(matrix_inside(&ly->w1, F, D, base, size) && matrix_inside(&ly->w2, D, F, base, size));
        CHECK(matrix_inside(&ly->w3, F, D, base, size));
        CHECK(norm_inside(m, ly->rms_att, D, base, size));
        CHECK(norm_inside(m, ly->rms_ffn, D, base, size));
    }
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
            CHECK(st == KVE_ERANGE && kve_last_error()[0] != '\0');
            break;
        }
        CHECK(s->pos == t + 1);
        CHECK(lm_state_kept(s, 0, 0) == (size_t)(t + 1 < 2 ? t + 1 : 2));
    }
    CHECK(lm_forward(s, V) == KVE_EINVAL);
    lm_state_free(s);
}

/* Parses an input copied to aligned memory; checks a refusal or the model;
 * returns the model (NULL when refused) and the copy in *buf (free()). */
static lm_model *load_checked(const uint8_t *data, size_t size, void **buf)
{
    *buf = malloc(size ? size : 1); /* malloc aligns for float */
    CHECK(*buf != NULL);
    if (size)
        memcpy(*buf, data, size);
    lm_model *m = (lm_model *)buf;
    kve_status st = lm_model_from_memory(*buf, size, NULL, &m);
    if (st != KVE_OK) {
        CHECK(st == KVE_EFORMAT || st == KVE_ENOMEM);
        CHECK(kve_last_error()[0] != '\0' && strchr(kve_last_error(), '\n') == NULL);
        CHECK(m == (lm_model *)buf);
        return NULL;
    }
    check_model(m, *buf, size);
    return m;
}

#endif /* KVE_FUZZ_MODEL_H */
