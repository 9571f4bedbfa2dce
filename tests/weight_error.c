/* SPDX-License-Identifier: MIT */
/*
 * weight_error.c - the weight error of two quantizations of one model, on
 * the tensors both wrote in the same type (test_convert_error.sh).
 *
 *   weight_error SOURCE TYPE A B
 *
 * SOURCE: the model in F32 or F16 (the values both quantized); A and B: two
 * quantized files of it (kvevict-convert's and llama.cpp's). Over the
 * matrices (embedding, classifier, the seven of each layer) stored as TYPE
 * (ggml's name, "Q4_K") in both A and B, prints one JSON line
 *   {"type": "Q4_K", "tensors": N, "values": M, "a": RA, "b": RB}
 * RA = sqrt(sum (a - s)^2 / sum s^2) over those tensors' values (the
 * relative RMS error of A's dequantized weights against the source's), RB
 * the same of B's. Every file is read with the decoder (lm/), whose
 * dequantization test_lm_matvec holds to ggml's. Exit 0; 1 when a file
 * cannot be read, the shapes differ or no tensor is TYPE in both; 2 usage.
 *
 * Invariants: sums in double, tensors in a fixed order (embedding,
 * classifier when untied, then layer by layer wq, wk, wv, wo, w1, w2, w3),
 * so the figures are a function of the files.
 */
#include "lm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PER_LAYER = 7 };

/* Matrix k of m in the fixed order: 0 embedding, 1 classifier (NULL when
 * tied), then 2 + 7 l + i. */
static const lm_matrix *matrix_at(const lm_model *m, size_t k)
{
    const lm_weights *w = &m->weights;
    if (k == 0)
        return &w->token_embedding;
    if (k == 1)
        return m->config.shared_classifier ? NULL : &w->wcls;
    const lm_layer *ly = &w->layer[(k - 2) / PER_LAYER];
    const lm_matrix *mx[PER_LAYER] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo,
                                      &ly->w1, &ly->w2, &ly->w3};
    return mx[(k - 2) % PER_LAYER];
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: weight_error SOURCE TYPE A B\n");
        return 2;
    }
    lm_model *m[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        const char *path = argv[i == 0 ? 1 : i + 2];
        if (lm_model_open(path, NULL, &m[i]) != KVE_OK) {
            fprintf(stderr, "weight_error: %s: %s\n", path, kve_last_error());
            for (int j = 0; j < i; j++)
                lm_model_free(m[j]);
            return 1;
        }
    }
    int rc = 0;
    const lm_config *c = &m[0]->config;
    for (int i = 1; i < 3; i++)
        if (m[i]->config.dim != c->dim || m[i]->config.hidden_dim != c->hidden_dim ||
            m[i]->config.n_layers != c->n_layers || m[i]->config.vocab_size != c->vocab_size ||
            m[i]->config.shared_classifier != c->shared_classifier) {
            fprintf(stderr, "weight_error: %s is not the shape of %s\n", argv[i + 2], argv[1]);
            rc = 1;
        }
    size_t n_mat = 2 + PER_LAYER * (size_t)c->n_layers, tensors = 0, values = 0;
    double num[2] = {0, 0}, den = 0;
    float *row[3] = {NULL, NULL, NULL};
    for (size_t k = 0; rc == 0 && k < n_mat; k++) {
        const lm_matrix *s = matrix_at(m[0], k), *a = matrix_at(m[1], k), *b = matrix_at(m[2], k);
        if (!s || strcmp(lm_dtype_name(a->type), argv[2]) != 0 ||
            strcmp(lm_dtype_name(b->type), argv[2]) != 0)
            continue;
        for (int i = 0; i < 3; i++) {
            free(row[i]);
            row[i] = malloc(s->cols * sizeof(float));
        }
        if (!row[0] || !row[1] || !row[2]) {
            fprintf(stderr, "weight_error: out of memory\n");
            rc = 1;
            break;
        }
        for (size_t r = 0; r < s->rows; r++) {
            lm_matrix_row(s, r, row[0]);
            lm_matrix_row(a, r, row[1]);
            lm_matrix_row(b, r, row[2]);
            for (size_t j = 0; j < s->cols; j++) {
                double v = row[0][j], da = row[1][j] - v, db = row[2][j] - v;
                num[0] += da * da;
                num[1] += db * db;
                den += v * v;
            }
        }
        tensors++;
        values += s->rows * s->cols;
    }
    if (rc == 0 && (tensors == 0 || !(den > 0))) {
        fprintf(stderr, "weight_error: no matrix is %s in both %s and %s\n", argv[2], argv[3],
                argv[4]);
        rc = 1;
    }
    if (rc == 0)
        printf("{\"type\": \"%s\", \"tensors\": %zu, \"values\": %zu, \"a\": %.6f, \"b\": %.6f}\n",
               argv[2], tensors, values, sqrt(num[0] / den), sqrt(num[1] / den));
    for (int i = 0; i < 3; i++) {
        free(row[i]);
        lm_model_free(m[i]);
    }
    return rc;
}
