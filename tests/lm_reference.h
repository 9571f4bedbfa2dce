/*
 * lm_reference.h - a naive reference of the decode step, for the tests:
 * plain loops, double accumulation, no code shared with lm/.
 *
 * It keeps every position's unrotated key and value (double) and, at each
 * step, asks the caller which earlier positions each (layer, KV head) may
 * attend to (`keys`), so one function serves the full cache, masked caches
 * (window, streaming) and caches driven by policies. Rotary embeddings are
 * applied at attention time: under original positions key i turns by
 * angle(i) and the query by angle(t); under cache positions the j-th
 * attended key turns by angle(j) and the query by angle(|K|). The caller
 * also receives (`seen`) each KV head's group-mean weights over K, in the
 * order of K, to drive its policies, and (`key_cb`, when set) each KV
 * head's new key as attention turns it (rotated at t under original
 * positions, at its cache index |K| under cache positions), before `seen`,
 * and (`data_cb`, when set) the group's queries as attention turns them, the
 * new value, and that value through the output projection's slice of each
 * query head of the group (CriticalKV's W_o v), before `seen`.
 */
#ifndef KVE_LM_REFERENCE_H
#define KVE_LM_REFERENCE_H

#include "lm_fixture.h"

/* Writes the positions (< t, ascending) that (layer, g) attends to besides t
 * into keys and returns their number. */
typedef size_t (*ref_keys_fn)(void *user, int layer, int g, int32_t t, int32_t *keys);
/* The mean over g's query heads of the weights on keys[0 .. n). */
typedef void (*ref_seen_fn)(void *user, int layer, int g, int32_t t, const int32_t *keys,
                            const double *mean, size_t n);

/* The new key of (layer, g) at t, rotated as attention turns it (S doubles). */
typedef void (*ref_key_fn)(void *user, int layer, int g, int32_t t, const double *key);

/* The queries of (layer, g)'s R query heads at t, rotated as attention turns
 * them (R*S doubles, head g*R + r at r*S), its new value (S doubles) and
 * wov (R*D doubles): at r*D the output projection's columns of head g*R + r
 * times the value. */
typedef void (*ref_data_fn)(void *user, int layer, int g, int32_t t, const double *queries,
                            const double *value, const double *wov);

typedef struct ref_state {
    const fx_model *m;
    ref_key_fn key_cb;   /* may be NULL; gets the `user` of ref_step */
    ref_data_fn data_cb; /* may be NULL; gets the `user` of ref_step */
    int cache_positions;
    size_t cap;      /* positions it can hold */
    double *kc, *vc; /* (L, cap, G*S) unrotated keys, values */
    int32_t *keys;   /* (cap + 1) */
    double *att;     /* (H, cap + 1) */
    double *hnorm;   /* (L) the norm of each layer's attention input at the last step */
} ref_state;

static inline void ref_init(ref_state *r, const fx_model *m, int cache_positions, size_t cap)
{
    size_t KD = (size_t)m->kv_heads * (size_t)(m->dim / m->heads);
    r->m = m;
    r->key_cb = NULL;
    r->data_cb = NULL;
    r->cache_positions = cache_positions;
    r->cap = cap;
    r->kc = calloc((size_t)m->layers * cap * KD, sizeof(double));
    r->vc = calloc((size_t)m->layers * cap * KD, sizeof(double));
    r->keys = calloc(cap + 1, sizeof(int32_t));
    r->att = calloc((size_t)m->heads * (cap + 1), sizeof(double));
    r->hnorm = calloc((size_t)m->layers, sizeof(double));
}

static inline void ref_free(ref_state *r)
{
    free(r->kc);
    free(r->vc);
    free(r->keys);
    free(r->att);
    free(r->hnorm);
}

static inline void ref_rmsnorm(double *o, const double *x, const float *w, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double scale = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++)
        o[i] = w[i] * x[i] * scale;
}

/* out (rows) = W (rows, cols) x (cols) */
static inline void ref_matvec(double *out, const float *W, const double *x, int rows, int cols)
{
    for (int i = 0; i < rows; i++) {
        double s = 0;
        for (int j = 0; j < cols; j++)
            s += (double)W[(size_t)i * (size_t)cols + (size_t)j] * x[j];
        out[i] = s;
    }
}

/* vec (S) turned pairwise by position p: pair j by p / 10000^(2j/S). */
static inline void ref_rotate(double *out, const double *vec, double p, int S)
{
    for (int i = 0; i < S; i += 2) {
        double a = p / pow(10000.0, (double)i / S);
        out[i] = vec[i] * cos(a) - vec[i + 1] * sin(a);
        out[i + 1] = vec[i] * sin(a) + vec[i + 1] * cos(a);
    }
}

/* One step at position t; logits (V) out. */
static inline void ref_step(ref_state *r, int32_t token, int32_t t, ref_keys_fn keys_fn,
                            ref_seen_fn seen, void *user, double *logits)
{
    const fx_model *m = r->m;
    int D = m->dim, F = m->hidden, H = m->heads, G = m->kv_heads, S = D / H, R = H / G;
    int KD = G * S;
    double *x = calloc((size_t)D, sizeof *x), *xb = calloc((size_t)D, sizeof *xb);
    double *q = calloc((size_t)D, sizeof *q), *k = calloc((size_t)KD, sizeof *k);
    double *v = calloc((size_t)KD, sizeof *v), *o = calloc((size_t)D, sizeof *o);
    double *h1 = calloc((size_t)F, sizeof *h1), *h3 = calloc((size_t)F, sizeof *h3);
    double *qr = calloc((size_t)S, sizeof *qr), *kr = calloc((size_t)S, sizeof *kr);
    double *mean = calloc(r->cap + 1, sizeof *mean), *tmp = calloc((size_t)D, sizeof *tmp);
    double *qg = calloc((size_t)(R * S), sizeof *qg), *wov = calloc((size_t)(R * D), sizeof *wov);
    for (int i = 0; i < D; i++)
        x[i] = m->emb[(size_t)token * (size_t)D + (size_t)i];
    for (int l = 0; l < m->layers; l++) {
        size_t lo = (size_t)l;
        ref_rmsnorm(xb, x, m->rms_att + lo * (size_t)D, D);
        r->hnorm[lo] = 0;
        for (int i = 0; i < D; i++)
            r->hnorm[lo] += xb[i] * xb[i];
        r->hnorm[lo] = sqrt(r->hnorm[lo]);
        ref_matvec(q, m->wq + lo * (size_t)D * (size_t)D, xb, D, D);
        ref_matvec(k, m->wk + lo * (size_t)KD * (size_t)D, xb, KD, D);
        ref_matvec(v, m->wv + lo * (size_t)KD * (size_t)D, xb, KD, D);
        double *kc = r->kc + (lo * r->cap + (size_t)t) * (size_t)KD;
        double *vc = r->vc + (lo * r->cap + (size_t)t) * (size_t)KD;
        memcpy(kc, k, (size_t)KD * sizeof *k);
        memcpy(vc, v, (size_t)KD * sizeof *v);
        for (int g = 0; g < G; g++) {
            size_t n = keys_fn ? keys_fn(user, l, g, t, r->keys) : (size_t)t;
            if (!keys_fn)
                for (size_t i = 0; i < n; i++)
                    r->keys[i] = (int32_t)i;
            r->keys[n] = t; /* the new key attends last */
            if (r->key_cb) {
                ref_rotate(kr, k + g * S, r->cache_positions ? (double)n : (double)t, S);
                r->key_cb(user, l, g, t, kr);
            }
            for (int rr = 0; rr < R; rr++) {
                int h = g * R + rr;
                double qpos = r->cache_positions ? (double)n : (double)t;
                ref_rotate(qr, q + h * S, qpos, S);
                memcpy(qg + rr * S, qr, (size_t)S * sizeof *qr);
                double *att = r->att + (size_t)h * (r->cap + 1), max = -INFINITY, sum = 0;
                for (size_t j = 0; j <= n; j++) {
                    const double *key =
                        r->kc + (lo * r->cap + (size_t)r->keys[j]) * (size_t)KD + (size_t)(g * S);
                    double kpos = r->cache_positions ? (double)j : (double)r->keys[j];
                    ref_rotate(kr, key, kpos, S);
                    double d = 0;
                    for (int i = 0; i < S; i++)
                        d += qr[i] * kr[i];
                    att[j] = d / sqrt((double)S);
                    if (att[j] > max)
                        max = att[j];
                }
                for (size_t j = 0; j <= n; j++)
                    sum += (att[j] = exp(att[j] - max));
                for (int i = 0; i < S; i++)
                    o[h * S + i] = 0;
                for (size_t j = 0; j <= n; j++) {
                    att[j] /= sum;
                    const double *val =
                        r->vc + (lo * r->cap + (size_t)r->keys[j]) * (size_t)KD + (size_t)(g * S);
                    for (int i = 0; i < S; i++)
                        o[h * S + i] += att[j] * val[i];
                }
            }
            if (r->data_cb) {
                const float *wo = m->wo + lo * (size_t)D * (size_t)D;
                for (int rr = 0; rr < R; rr++)
                    for (int i = 0; i < D; i++) {
                        double s = 0;
                        for (int j = 0; j < S; j++)
                            s += (double)wo[(size_t)i * (size_t)D + (size_t)((g * R + rr) * S + j)] *
                                 v[g * S + j];
                        wov[rr * D + i] = s;
                    }
                r->data_cb(user, l, g, t, qg, v + g * S, wov);
            }
            if (seen) {
                for (size_t j = 0; j < n; j++) {
                    double s = 0;
                    for (int rr = 0; rr < R; rr++)
                        s += r->att[(size_t)(g * R + rr) * (r->cap + 1) + j];
                    mean[j] = s / R;
                }
                seen(user, l, g, t, r->keys, mean, n);
            }
        }
        ref_matvec(tmp, m->wo + lo * (size_t)D * (size_t)D, o, D, D);
        for (int i = 0; i < D; i++)
            x[i] += tmp[i];
        ref_rmsnorm(xb, x, m->rms_ffn + lo * (size_t)D, D);
        ref_matvec(h1, m->w1 + lo * (size_t)F * (size_t)D, xb, F, D);
        ref_matvec(h3, m->w3 + lo * (size_t)F * (size_t)D, xb, F, D);
        for (int i = 0; i < F; i++)
            h1[i] = h1[i] / (1.0 + exp(-h1[i])) * h3[i];
        ref_matvec(tmp, m->w2 + lo * (size_t)D * (size_t)F, h1, D, F);
        for (int i = 0; i < D; i++)
            x[i] += tmp[i];
    }
    ref_rmsnorm(xb, x, m->rms_final, D);
    ref_matvec(logits, m->cls, xb, m->vocab, D);
    free(x), free(xb), free(q), free(k), free(v), free(o), free(h1), free(h3);
    free(qr), free(kr), free(mean), free(tmp), free(qg), free(wov);
}

#endif /* KVE_LM_REFERENCE_H */
