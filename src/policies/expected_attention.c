/* SPDX-License-Identifier: MIT */
/*
 * expected_attention.c - the attention expected from the statistics of
 * future queries (Devoto, Jeblick, Jegou 2025; kvpress's
 * ExpectedAttentionPress, rescored while decoding in the manner of
 * kvpress's DecodingPress; future_from_buffer=1 takes its offset).
 *
 * Legend: n = kept positions before the step (N = n + 1 after it), d =
 * key_dim, G = query_group, r = rope.rotary_dim (even, <= d), B = n_queries,
 * F = n_future_positions, S = min(n_sink, N) the sink slots (the first S in
 * kept order).
 * Columns beyond h2o's: key (float32[d] a slot, the post-RoPE key, kept for
 * the rescoring), z (double: the logits of one query head during a
 * rescoring, scratch), vnorm (double, with vnorm=1: ||v||, stored by the
 * bank). Per head (aux, zeroed at construction, plain bytes):
 *   ea_head  the counters: steps, steps since the last rescoring, the query
 *            ring's next slot and fill, whether statistics are held
 *   theta    (r/2) double: the rope's theta_j (base^(-2j / r) unscaled,
 *            over freq_factors[j] when given, Hugging Face's inv_freq under
 *            rope.scaling: kve_rope), filled
 *            at the first step
 *   mu       (G, d) double: R mu of the last rescoring
 *   sigma    (G, d, d) double: R Sigma R^T of the last rescoring (covariance)
 *   zmax     (G) double and zsum (G) double: the softmax of that rescoring
 *   tmp      (d) double: scratch of a step
 *   ring     (B, G, d) float: the un-rotated queries of the newest steps;
 *            with query_stats=1 in its place mu0 (G, d) and sigma0 (G, d, d)
 *            double (sigma0 with the covariance): the caller's statistics
 *            (kve_bank_query_stats, held bit 2), no query is buffered and
 *            step 2 below takes them for the ring's
 *
 * Per step, before position p = in->pos is admitted into slot n:
 *  1. key[n] = k. The step's queries (post-RoPE, at p) are un-rotated,
 *     pair (a, b) of angle p theta_j: q_a' = q_a cos + q_b sin,
 *     q_b' = q_b cos - q_a sin (double, rounded to float; divided by the
 *     rope's attention factor A before rounding when A != 1, so the ring
 *     holds the queries before the embedding), and pushed into
 *     the ring, unless the head has taken fewer than n_sink steps (the
 *     sinks' own queries are left out, as kvpress drops the first n_sink
 *     hidden states).
 *  2. Every `interval` steps, or at a step flagged KVE_STEP_RESCORE, the
 *     statistics and every score are computed again:
 *       mu_g = (sum of the m buffered queries of head g, oldest first) / m;
 *       Sigma_g[a][b] = (sum of (q_a - mu_a)(q_b - mu_b)) / m (a <= b in
 *         that order, mirrored), with use_covariance=1;
 *       R = the mean over positions s .. s + F - 1 of the rotation, s = p + 1
 *         (with future_from_buffer=1, s = m + n_sink: kvpress's q_len, the
 *         hidden states its DecodingPress hands the press): per pair
 *         [[C, -S], [S, C]], C = D cos(phi), S = D sin(phi),
 *         D = sin(F theta / 2) / (F sin(theta / 2)),
 *         phi = (s + (F - 1) / 2) theta (the closed form of the means of
 *         cos and sin over the F positions; C and S times A when A != 1,
 *         as Hugging Face scales cos and sin by its attention_scaling);
 *         mu <- R mu, Sigma <- R Sigma R^T (rows, then columns);
 *       z_g(i) = (mu_g . k_i) / sqrt(d) + (k_i^T Sigma_g k_i) / (2 d), each
 *         dot product in double in 8 partial sums (KVE_KEY_LANES), the
 *         quadratic form as sum_a k_a (sum_b Sigma[a][b] k_b);
 *       over the non-sink slots i in [S, N): zmax_g = max z_g,
 *         e = exp(z_g(i) - zmax_g), zsum_g = sum of e in kept order,
 *         p_g(i) = e / zsum_g; score_i = (sum over g, in order, of p_g(i)) / G;
 *         with vnorm=1 score_i = (score_i + epsilon) * ||v_i||;
 *       a sink slot scores SINK_SCORE, above any other score.
 *     No buffered query (m = 0): every non-sink slot scores 0 (no
 *     statistics are held).
 *  3. Otherwise only the newcomer is scored, against the statistics and the
 *     softmax of the last rescoring: p_g = e / (zsum_g + e) with
 *     e = exp(z_g - zmax_g) (as 1 / (1 + zsum_g exp(zmax_g - z_g)) when
 *     z_g > zmax_g, so nothing overflows), its weight had it joined that
 *     softmax; the mean over g, vnorm as above. Before any statistics, 0.
 * The argmin over [0, limit) follows (the shared kernel, ties to the lower
 * index). Every loop is plain C in a fixed order, compiled per instruction
 * set (KVE_PER_ISA), no fused multiply-add: every path gives the same bits.
 * Cost: a rescoring O(m G d^2 + N G d^2) (O(m G d + N G d) without the
 * covariance) plus O(r) trigonometry; a step without one O(G d^2) for the
 * newcomer, O(G r) for the un-rotation and O(N) for the argmin.
 * Memory: 21 + 4 d bytes a slot (+8 with vnorm); a head's aux
 * 40 + 8 (r/2 + G d + G d^2 + 2 G + d) + 4 B G d bytes (G d^2 without the
 * covariance: 0).
 */
#include "../policy_impl.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { KEY = KVE_COL_EXTRA0, Z = KVE_COL_SCRATCH };

/* Above any score a non-sink slot can have: (1 + epsilon) ||v|| <= 1e6 *
 * sqrt(2^16) * FLT_MAX < 1e47, and a page of 2^24 of them still sums below
 * DBL_MAX. */
#define SINK_SCORE 1e300

static const kve_param_def params[] = {
    KVE_DEF_BUDGET,
    KVE_DEF_RECENT_WINDOW(0),
    KVE_DEF_SIZE("n_future_positions", 512, 1, 1048576, n_future,
                 "future positions whose rotations are averaged"),
    KVE_DEF_SIZE("n_sink", 4, 0, KVE_MAX_BUDGET - 1, sinks,
                 "first kept positions, scored above all others"),
    KVE_DEF_SIZE("use_covariance", 1, 0, 1, covariance,
                 "1: the queries' covariance adds k^T Sigma k / (2 d)"),
    KVE_DEF_SIZE("vnorm", 1, 0, 1, vnorm, "1: (score + epsilon) times the value's norm"),
    {.key = "epsilon", .kind = KVE_PARAM_REAL, .rdefault = 0.0, .rmin = 0.0, .rmax = 1e6,
     .offset = offsetof(kve_params, epsilon), .doc = "added to the score before the value norm"},
    KVE_DEF_SIZE("interval", 1, 1, KVE_MAX_BUDGET, interval,
                 "steps between rescorings of every kept key"),
    KVE_DEF_SIZE("n_queries", 256, 1, 65536, n_queries,
                 "queries of the statistics: those of the newest steps"),
    {.key = "future_from_buffer", .kind = KVE_PARAM_SIZE, .idefault = 0, .imin = 0, .imax = 1,
     .flags = KVE_PARAM_OMIT_DEFAULT, .offset = offsetof(kve_params, future_from_buffer),
     .doc = "1: the future positions start at the buffered queries + n_sink (kvpress's "
            "DecodingPress), 0: after the step's position"},
    {.key = "query_stats", .kind = KVE_PARAM_SIZE, .idefault = 0, .imin = 0, .imax = 1,
     .flags = KVE_PARAM_OMIT_DEFAULT, .offset = offsetof(kve_params, query_stats),
     .doc = "1: the statistics are the caller's (kve_bank_query_stats: kvpress's "
            "ExpectedAttentionStatsPress), steps carry no queries"},
    KVE_DEF_PAGES,
};

typedef struct ea_head {
    uint64_t steps; /* steps taken */
    uint64_t since; /* steps since the last rescoring */
    uint64_t next;  /* the ring slot the next query goes to */
    uint64_t fill;  /* buffered queries, <= B */
    uint64_t held;  /* 1: mu, sigma, zmax, zsum hold a rescoring's; bit 1: theta filled;
                       bit 2 (query_stats): mu0, sigma0 hold the caller's statistics */
} ea_head;

/* The parts of a head's aux. */
typedef struct ea_parts {
    ea_head *e;
    double *theta, *mu, *sigma, *zmax, *zsum, *tmp;
    float *ring;
    double *mu0, *sigma0; /* query_stats: the caller's (G, d) and (G, d, d) */
} ea_parts;

static size_t rot(const kve_config *c)
{
    return c->rope.rotary_dim == KVE_ROPE_UNSET ? 0 : c->rope.rotary_dim;
}

/* The aux layout: offsets in doubles after the header; false when it does
 * not fit in a size_t. With query_stats the ring's place holds the
 * caller's statistics, mu0 (G d) and sigma0 (G d d, covariance), doubles. */
static bool layout(const kve_config *c, size_t *doubles, size_t *floats)
{
    const size_t d = c->key_dim, G = c->query_group, B = c->params.n_queries;
    if (d && (G > SIZE_MAX / d / d / 2 || B > SIZE_MAX / G / d / sizeof(float)))
        return false;
    size_t sig = c->params.covariance ? G * d * d : 0;
    *doubles = rot(c) / 2 + G * d + sig + 2 * G + d;
    *floats = c->params.query_stats ? 2 * (G * d + sig) : B * G * d;
    return *doubles < SIZE_MAX / 16 && *floats < SIZE_MAX / 8;
}

static ea_parts parts(const kve_config *c, void *aux)
{
    const size_t d = c->key_dim, G = c->query_group;
    ea_parts p;
    p.e = aux;
    p.theta = (double *)(void *)(p.e + 1);
    p.mu = p.theta + rot(c) / 2;
    p.sigma = p.mu + G * d;
    p.zmax = p.sigma + (c->params.covariance ? G * d * d : 0);
    p.zsum = p.zmax + G;
    p.tmp = p.zsum + G;
    p.ring = (float *)(void *)(p.tmp + d);
    p.mu0 = (double *)(void *)p.ring; /* query_stats: in the ring's place */
    p.sigma0 = p.mu0 + G * d;
    return p;
}

static kve_status init(kve_config *c)
{
    if (c->params.sinks >= c->params.budget)
        return kve__fail(KVE_EINVAL, "%s: n_sink %zu must be smaller than budget %zu",
                         c->type->name, c->params.sinks, c->params.budget);
    if (c->params.query_stats && c->params.future_from_buffer)
        return kve__fail(KVE_EINVAL, "%s: query_stats=1 has no buffer of queries, so "
                         "future_from_buffer=1 has no length to start from", c->type->name);
    if (c->params.query_stats && c->rope.rotary_dim == KVE_ROPE_UNSET)
        return kve__fail(KVE_EINVAL, "%s: rotates the statistics to the future positions, so the "
                         "options must say what the rotary embedding is (rope.rotary_dim; 0 for "
                         "a model without one)", c->type->name);
    size_t doubles, floats;
    if (!layout(c, &doubles, &floats))
        return kve__fail(KVE_ENOMEM, "%s: %zu queries of %zu heads of %zu floats do not fit in "
                         "memory", c->type->name, c->params.n_queries, c->query_group,
                         c->key_dim);
    kve__column(c, KEY, c->key_dim, sizeof(float));
    c->elem[Z] = sizeof(double);
    c->aux_bytes = sizeof(ea_head) + doubles * sizeof(double) + floats * sizeof(float);
    /* State (kve_*_save): the counters, theta .. zsum, the ring; not tmp. */
    const size_t stats = doubles - c->key_dim;
    c->aux_state[0].offset = 0;
    c->aux_state[0].bytes = sizeof(ea_head) + stats * sizeof(double);
    c->aux_state[0].unit = 8;
    c->aux_state[1].offset = sizeof(ea_head) + doubles * sizeof(double);
    c->aux_state[1].bytes = floats * sizeof(float);
    c->aux_state[1].unit = c->params.query_stats ? 8 : 4;
    return kve__check_recent_window(c);
}

/* ---- kernels, compiled per instruction set ---- */

/* sum_j (double)k[j] * w[j] in KVE_KEY_LANES partial sums added pairwise. */
KVE_ALWAYS_INLINE double dot_lanes(const float *k, const double *w, size_t d)
{
    double acc[KVE_KEY_LANES] = {0};
    size_t j = 0;
    for (; j + KVE_KEY_LANES <= d; j += KVE_KEY_LANES)
        for (size_t l = 0; l < KVE_KEY_LANES; l++)
            acc[l] += (double)k[j + l] * w[j + l];
    for (size_t l = 0; j < d; j++, l++)
        acc[l] += (double)k[j] * w[j];
    for (size_t s = KVE_KEY_LANES / 2; s; s /= 2)
        for (size_t l = 0; l < s; l++)
            acc[l] += acc[l + s];
    return acc[0];
}

/* The same, with the first factor in double. */
KVE_ALWAYS_INLINE double dot_lanes_d(const double *x, const float *k, size_t d)
{
    double acc[KVE_KEY_LANES] = {0};
    size_t j = 0;
    for (; j + KVE_KEY_LANES <= d; j += KVE_KEY_LANES)
        for (size_t l = 0; l < KVE_KEY_LANES; l++)
            acc[l] += x[j + l] * (double)k[j + l];
    for (size_t l = 0; j < d; j++, l++)
        acc[l] += x[j] * (double)k[j];
    for (size_t s = KVE_KEY_LANES / 2; s; s /= 2)
        for (size_t l = 0; l < s; l++)
            acc[l] += acc[l + s];
    return acc[0];
}

/* z(k) for one query head's statistics; tmp holds d doubles. */
KVE_ALWAYS_INLINE double logit(const float *k, const double *mu, const double *sigma, size_t d,
                               double *tmp)
{
    double z = dot_lanes(k, mu, d) / sqrt((double)d);
    if (sigma) {
        for (size_t a = 0; a < d; a++)
            tmp[a] = dot_lanes(k, sigma + a * d, d);
        z += dot_lanes_d(tmp, k, d) / (2.0 * (double)d);
    }
    return z;
}

/* z of slots [lo, hi) of keys (N, d) into z[]. */
KVE_ALWAYS_INLINE void logits(const float *keys, size_t lo, size_t hi, const double *mu,
                              const double *sigma, size_t d, double *tmp, double *z)
{
    for (size_t i = lo; i < hi; i++)
        z[i] = logit(keys + i * d, mu, sigma, d, tmp);
}

/* The covariance of the m queries of a ring of B rows `stride` floats
 * apart, oldest first from row `start`, upper triangle then mirrored. */
KVE_ALWAYS_INLINE void covariance(const float *ring, size_t start, size_t B, size_t m,
                                  size_t stride, const double *mu, size_t d, double *tmp,
                                  double *sigma)
{
    for (size_t a = 0; a < d * d; a++)
        sigma[a] = 0.0;
    for (size_t k = 0; k < m; k++) {
        const float *q = ring + ((start + k) % B) * stride;
        for (size_t a = 0; a < d; a++)
            tmp[a] = (double)q[a] - mu[a];
        for (size_t a = 0; a < d; a++)
            for (size_t b = a; b < d; b++)
                sigma[a * d + b] += tmp[a] * tmp[b];
    }
    for (size_t a = 0; a < d; a++)
        for (size_t b = a; b < d; b++) {
            double v = sigma[a * d + b] / (double)m;
            sigma[a * d + b] = v;
            sigma[b * d + a] = v;
        }
}

KVE_PER_ISA(logits, int,
            (const float *keys, size_t lo, size_t hi, const double *mu, const double *sigma,
             size_t d, double *tmp, double *z),
            (logits(keys, lo, hi, mu, sigma, d, tmp, z), 0),
            (logits(keys, lo, hi, mu, sigma, d, tmp, z), 0),
            (logits(keys, lo, hi, mu, sigma, d, tmp, z), 0))
KVE_PER_ISA(cov, int,
            (const float *ring, size_t start, size_t B, size_t m, size_t stride, const double *mu,
             size_t d, double *tmp, double *sigma),
            (covariance(ring, start, B, m, stride, mu, d, tmp, sigma), 0),
            (covariance(ring, start, B, m, stride, mu, d, tmp, sigma), 0),
            (covariance(ring, start, B, m, stride, mu, d, tmp, sigma), 0))

/* ---- the rotary embedding ---- */

/* The indexes of pair j of r rotated dimensions. */
static void pair(const kve_config *c, size_t j, size_t *a, size_t *b)
{
    if (c->rope.pairs == KVE_ROPE_HALF) {
        *a = j;
        *b = j + rot(c) / 2;
    } else {
        *a = 2 * j;
        *b = 2 * j + 1;
    }
}

/* theta_j of the rope (kve_rope): base^(-2j / r) (divided by the pair's
 * freq_factor, as llama.cpp divides by rope_freqs), rescaled as Hugging
 * Face's inv_freq under rope.scaling. Without scaling or factors the one
 * pow() of before either existed, bit for bit. */
static double theta_of(const kve_config *c, size_t j)
{
    const size_t r = rot(c);
    double t = pow(c->rope.base, -(double)(2 * j) / (double)r);
    if (c->rope_nff)
        t /= (double)c->rope_ff[j];
    if (c->rope.scaling == KVE_ROPE_SCALING_NONE)
        return t;
    const kve_rope e = kve__rope_effective(&c->rope);
    const double L = (double)e.original_max_position, two_pi = 2.0 * acos(-1.0);
    switch (e.scaling) {
    case KVE_ROPE_SCALING_LINEAR:
        return t / e.factor;
    case KVE_ROPE_SCALING_LLAMA3: {
        const double w = two_pi / t; /* the wavelength */
        if (w < L / e.high_freq_factor)
            return t;
        if (w > L / e.low_freq_factor)
            return t / e.factor;
        const double sm = (L / w - e.low_freq_factor) / (e.high_freq_factor - e.low_freq_factor);
        return (1.0 - sm) * t / e.factor + sm * t;
    }
    case KVE_ROPE_SCALING_YARN: {
        /* the dimension (of r) at which b rotations fit in L, truncated */
        const double lnb = 2.0 * log(e.base);
        double lo = floor((double)r * log(L / (e.beta_fast * two_pi)) / lnb);
        double hi = ceil((double)r * log(L / (e.beta_slow * two_pi)) / lnb);
        lo = lo > 0.0 ? lo : 0.0;
        hi = hi < (double)(r - 1) ? hi : (double)(r - 1);
        if (lo == hi)
            hi += 0.001;
        double ramp = ((double)j - lo) / (hi - lo);
        ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
        const double ex = 1.0 - ramp; /* the extrapolated share */
        return t / e.factor * (1.0 - ex) + t * ex;
    }
    default:
        return t;
    }
}

/* A: the rope's attention factor, by which the model multiplies cos and
 * sin (kve_rope.attention_factor; derived when 0). */
static double attention_factor(const kve_config *c)
{
    if (c->rope.attention_factor != 0.0)
        return c->rope.attention_factor;
    const double f = kve__rope_effective(&c->rope).factor;
    if (c->rope.scaling == KVE_ROPE_SCALING_YARN && f > 1.0)
        return 0.1 * log(f) + 1.0;
    return 1.0;
}

static void fill_theta(const kve_config *c, double *theta)
{
    const size_t r = rot(c);
    for (size_t j = 0; j < r / 2; j++)
        theta[j] = theta_of(c, j);
}

/* The G queries of the step, un-rotated from position pos, into ring slot. */
static void push_queries(const kve_config *c, const ea_parts *p, const kve_head_in *in)
{
    const size_t d = c->key_dim, G = c->query_group, r = rot(c), B = c->params.n_queries;
    const double A = attention_factor(c);
    float *dst = p->ring + (size_t)p->e->next * G * d;
    for (size_t g = 0; g < G; g++)
        memcpy(dst + g * d, in->queries + g * in->ld_queries, d * sizeof(float));
    for (size_t j = 0; j < r / 2; j++) {
        double ang = (double)in->pos * p->theta[j], cs = cos(ang), sn = sin(ang);
        size_t a, b;
        pair(c, j, &a, &b);
        for (size_t g = 0; g < G; g++) {
            float *q = dst + g * d;
            double x = (double)q[a], y = (double)q[b];
            if (A == 1.0) {
                q[a] = (float)(x * cs + y * sn);
                q[b] = (float)(y * cs - x * sn);
            } else {
                q[a] = (float)((x * cs + y * sn) / A);
                q[b] = (float)((y * cs - x * sn) / A);
            }
        }
    }
    p->e->next = (p->e->next + 1) % B;
    if (p->e->fill < B)
        p->e->fill++;
}

/* The first future position of a rescoring at pos: pos + 1, or with
 * future_from_buffer=1 kvpress's q_len, the hidden states its press is
 * handed: the m buffered queries and the n_sink it drops before the
 * statistics. */
static double future_start(const kve_config *c, const ea_parts *p, int32_t pos)
{
    if (c->params.future_from_buffer)
        return (double)p->e->fill + (double)c->params.sinks;
    return (double)pos + 1.0;
}

/* mu <- R mu and sigma <- R sigma R^T for the future positions of pos. */
static void rotate_stats(const kve_config *c, const ea_parts *p, int32_t pos, double *mu,
                         double *sigma)
{
    const size_t d = c->key_dim, r = rot(c);
    const double F = (double)c->params.n_future, start = future_start(c, p, pos);
    const double A = attention_factor(c);
    for (size_t j = 0; j < r / 2; j++) {
        double th = p->theta[j];
        double D = sin(F * th / 2.0) / (F * sin(th / 2.0));
        double phi = (start + (F - 1.0) / 2.0) * th;
        double C = D * cos(phi), S = D * sin(phi);
        if (A != 1.0) {
            C *= A;
            S *= A;
        }
        size_t a, b;
        pair(c, j, &a, &b);
        double x = mu[a], y = mu[b];
        mu[a] = C * x - S * y;
        mu[b] = S * x + C * y;
        if (!sigma)
            continue;
        for (size_t col = 0; col < d; col++) { /* rows a and b */
            double u = sigma[a * d + col], v = sigma[b * d + col];
            sigma[a * d + col] = C * u - S * v;
            sigma[b * d + col] = S * u + C * v;
        }
        for (size_t row = 0; row < d; row++) { /* columns a and b */
            double u = sigma[row * d + a], v = sigma[row * d + b];
            sigma[row * d + a] = C * u - S * v;
            sigma[row * d + b] = S * u + C * v;
        }
    }
}

/* ---- scores ---- */

/* (score + epsilon) * ||v|| with vnorm=1, else score. */
static double value_aware(const kve_config *c, double s, double vn)
{
    return c->params.vnorm ? (s + c->params.epsilon) * vn : s;
}

/* The statistics of every query head from the ring (query_stats: the
 * caller's), rotated for pos; false when no query is buffered (none
 * given). */
static bool statistics(const kve_config *c, const ea_parts *p, int32_t pos, kve_isa isa)
{
    const size_t d = c->key_dim, G = c->query_group, B = c->params.n_queries;
    const size_t m = (size_t)p->e->fill;
    if (c->params.query_stats) {
        if (!(p->e->held & 4))
            return false;
        const size_t sig = c->params.covariance ? G * d * d : 0;
        memcpy(p->mu, p->mu0, G * d * sizeof(double));
        memcpy(p->sigma, p->sigma0, sig * sizeof(double));
        for (size_t g = 0; g < G; g++)
            rotate_stats(c, p, pos, p->mu + g * d, sig ? p->sigma + g * d * d : NULL);
        return true;
    }
    if (m == 0)
        return false;
    const size_t start = ((size_t)p->e->next + B - m) % B; /* the oldest */
    for (size_t g = 0; g < G; g++) {
        double *mu = p->mu + g * d;
        for (size_t j = 0; j < d; j++)
            mu[j] = 0.0;
        for (size_t k = 0; k < m; k++) {
            const float *q = p->ring + (((start + k) % B) * G + g) * d;
            for (size_t j = 0; j < d; j++)
                mu[j] += (double)q[j];
        }
        for (size_t j = 0; j < d; j++)
            mu[j] /= (double)m;
        double *sigma = c->params.covariance ? p->sigma + g * d * d : NULL;
        if (sigma)
            (void)cov_isa[isa](p->ring + g * d, start, B, m, G * d, mu, d, p->tmp, sigma);
        rotate_stats(c, p, pos, mu, sigma);
    }
    return true;
}

/* Every slot of [0, N) scored from the held statistics; vn_new is the
 * newcomer's (slot N - 1) value norm. */
static void rescore(const kve_config *c, kve_head *h, const ea_parts *p, size_t N, double vn_new,
                    kve_isa isa)
{
    const size_t d = c->key_dim, G = c->query_group;
    const size_t S = c->params.sinks < N ? c->params.sinks : N;
    const float *keys = h->col[KEY];
    const double *norm = h->col[KVE_COL_VNORM];
    double *score = h->col[KVE_COL_SCORE], *z = h->col[Z];
    for (size_t i = S; i < N; i++)
        score[i] = 0.0;
    for (size_t g = 0; g < G && S < N; g++) {
        const double *sigma = c->params.covariance ? p->sigma + g * d * d : NULL;
        (void)logits_isa[isa](keys, S, N, p->mu + g * d, sigma, d, p->tmp, z);
        double zmax = z[S];
        for (size_t i = S + 1; i < N; i++)
            zmax = z[i] > zmax ? z[i] : zmax;
        double zsum = 0.0;
        for (size_t i = S; i < N; i++) {
            z[i] = exp(z[i] - zmax);
            zsum += z[i];
        }
        for (size_t i = S; i < N; i++)
            score[i] += z[i] / zsum;
        p->zmax[g] = zmax;
        p->zsum[g] = zsum;
    }
    for (size_t i = S; i < N; i++) /* norm is NULL without vnorm: read only with it */
        score[i] = value_aware(c, score[i] / (double)G,
                               i + 1 == N || !norm ? vn_new : norm[i]);
    for (size_t i = 0; i < S; i++)
        score[i] = SINK_SCORE;
    if (S == N)
        for (size_t g = 0; g < G; g++)
            p->zsum[g] = 0.0; /* no softmax held: a newcomer would be alone in it */
}

/* The newcomer's score against the held statistics. */
static double score_new(const kve_config *c, const ea_parts *p, const float *k, double vn,
                        kve_isa isa)
{
    const size_t d = c->key_dim, G = c->query_group;
    double sum = 0.0;
    for (size_t g = 0; g < G; g++) {
        const double *sigma = c->params.covariance ? p->sigma + g * d * d : NULL;
        double z = 0.0;
        (void)logits_isa[isa](k, 0, 1, p->mu + g * d, sigma, d, p->tmp, &z);
        double zsum = p->zsum[g], zmax = p->zmax[g];
        double w;
        if (zsum == 0.0)
            w = 1.0;
        else if (z <= zmax)
            w = exp(z - zmax) / (zsum + exp(z - zmax));
        else
            w = 1.0 / (1.0 + zsum * exp(zmax - z));
        sum += w;
    }
    return value_aware(c, sum / (double)G, vn);
}

static size_t step(const kve_config *c, kve_head *h, const kve_head_in *in, size_t limit,
                   kve_isa isa)
{
    kve__close_gap(c, h);
    const size_t n = h->size, d = c->key_dim, N = n + 1;
    ea_parts p = parts(c, h->aux);
    if (!(p.e->held & 2)) {
        fill_theta(c, p.theta);
        p.e->held |= 2;
    }
    memcpy((float *)h->col[KEY] + n * d, in->key, d * sizeof(float));
    if (p.e->steps >= c->params.sinks && !c->params.query_stats)
        push_queries(c, &p, in);
    p.e->steps++;
    p.e->since++;
    double *score = h->col[KVE_COL_SCORE];
    if (p.e->since >= c->params.interval || (in->flags & KVE_STEP_RESCORE)) {
        p.e->since = 0;
        if (statistics(c, &p, in->pos, isa)) {
            p.e->held |= 1;
            rescore(c, h, &p, N, in->vnorm, isa);
        } else {
            p.e->held &= ~(uint64_t)1;
            for (size_t i = 0; i < N; i++)
                score[i] = i < c->params.sinks ? SINK_SCORE : 0.0;
        }
    } else if (n < c->params.sinks) {
        score[n] = SINK_SCORE;
    } else {
        score[n] = (p.e->held & 1)
                       ? score_new(c, &p, (const float *)h->col[KEY] + n * d, in->vnorm, isa)
                       : 0.0;
    }
    return kve__shift_argmin(score, N, N, limit);
}

/* An image's state is one the steps reach: unit-free finite keys, counters
 * within their ranges (next < B, fill <= B and at most the steps past the
 * sinks, since < interval, held bits 0 and 1 only), theta exactly
 * fill_theta's once filled (zero before), finite statistics (mu, sigma,
 * zmax, zsum >= 0) and a finite ring whose rows past `fill` are zero. */
static bool check_state(const kve_config *c, const kve_head *h, char *msg, size_t cap)
{
    const size_t d = c->key_dim, G = c->query_group, B = c->params.n_queries, r = rot(c);
    const ea_parts p = parts(c, h->aux);
    const ea_head *e = p.e;
    const uint64_t past = e->steps > c->params.sinks ? e->steps - c->params.sinks : 0;
    const bool given = c->params.query_stats != 0;
    if (e->next >= B || e->fill > B || e->fill > past || e->since >= c->params.interval ||
        e->held > (given ? 7u : 3u) || e->since > e->steps || (e->fill < B && e->next != e->fill) ||
        (given && (e->fill || e->next))) {
        snprintf(msg, cap,
                 "counters (steps %llu, since %llu, next %llu, fill %llu, held %llu) are not "
                 "a state of n_queries %zu, interval %zu, n_sink %zu",
                 (unsigned long long)e->steps, (unsigned long long)e->since,
                 (unsigned long long)e->next, (unsigned long long)e->fill,
                 (unsigned long long)e->held, B, c->params.interval, c->params.sinks);
        return false;
    }
    const float *keys = h->col[KEY];
    size_t bad = kve__key_invalid(keys, h->size * d);
    if (bad != h->size * d) {
        snprintf(msg, cap, "key[%zu][%zu] is not finite", bad / d, bad % d);
        return false;
    }
    for (size_t j = 0; j < r / 2; j++) {
        double want = (e->held & 2) ? theta_of(c, j) : 0.0;
        if (!kve__same_bits(p.theta[j], want)) {
            snprintf(msg, cap, "theta[%zu] = %.17g is not the rope's theta_j (or 0 before a step)",
                     j, p.theta[j]);
            return false;
        }
    }
    const size_t stats = G * d + (c->params.covariance ? G * d * d : 0) + 2 * G;
    for (size_t i = 0; i < stats; i++)
        if (!isfinite(p.mu[i]) || (i >= stats - G && p.mu[i] < 0.0)) {
            snprintf(msg, cap, "statistic %zu = %g is not finite (or a negative zsum)", i,
                     p.mu[i]);
            return false;
        }
    if (given) { /* the caller's statistics: finite, zero until given */
        const size_t n0 = G * d + (c->params.covariance ? G * d * d : 0);
        for (size_t i = 0; i < n0; i++)
            if (!isfinite(p.mu0[i]) || (!(e->held & 4) && p.mu0[i] != 0.0)) {
                snprintf(msg, cap, "the given statistic %zu = %g is not finite (or set before "
                         "any was given)", i, p.mu0[i]);
                return false;
            }
        return true;
    }
    const size_t row = G * d;
    bad = kve__key_invalid(p.ring, B * row);
    if (bad != B * row) {
        snprintf(msg, cap, "ring[%zu] is not finite", bad);
        return false;
    }
    for (size_t i = (size_t)e->fill * row; i < B * row; i++)
        if (p.ring[i] != 0.0f) {
            snprintf(msg, cap, "ring row %zu holds a query, but only %llu are buffered", i / row,
                     (unsigned long long)e->fill);
            return false;
        }
    return true;
}

/* ---- the caller's statistics (query_stats=1) ---- */

kve_status kve_bank_query_stats(kve_bank *b, size_t first, size_t count, const float *mean,
                                const float *cov)
{
    if (!b)
        return kve__fail(KVE_EINVAL, "bank is NULL");
    const kve_config *c = &b->cfg;
    const char *name = c->type->name;
    kve_status st = kve__check_idle(b, "a query_stats");
    if (st != KVE_OK)
        return st;
    if (c->type != &kve__expected_attention_type || !c->params.query_stats)
        return kve__fail(KVE_EINVAL, "%s: query statistics are expected_attention's with "
                         "query_stats=1", name);
    if (first > b->n_heads || count > b->n_heads - first)
        return kve__fail(KVE_EINVAL, "%s: heads %zu + %zu are out of range: the bank has %zu",
                         name, first, count, b->n_heads);
    const size_t d = c->key_dim, G = c->query_group;
    const bool with_cov = c->params.covariance != 0;
    if (count && !mean)
        return kve__fail(KVE_EINVAL, "%s: query_stats: mean is NULL", name);
    if (count && with_cov && !cov)
        return kve__fail(KVE_EINVAL, "%s: query_stats: cov is NULL, but use_covariance=1 reads "
                         "it", name);
    for (size_t j = 0; j < count; j++)
        for (size_t g = 0; g < G; g++) {
            const float *mu = mean + (j * G + g) * d;
            size_t i = kve__key_invalid(mu, d);
            if (i != d)
                return kve__fail(KVE_EINVAL, "%s: head %zu: query head %zu: mean[%zu] = %g is "
                                 "not finite", name, first + j, g, i, (double)mu[i]);
            if (!with_cov)
                continue;
            const float *sg = cov + (j * G + g) * d * d;
            i = kve__key_invalid(sg, d * d);
            if (i != d * d)
                return kve__fail(KVE_EINVAL, "%s: head %zu: query head %zu: cov[%zu][%zu] = %g "
                                 "is not finite", name, first + j, g, i / d, i % d,
                                 (double)sg[i]);
        }
    for (size_t j = 0; j < count; j++) {
        ea_parts p = parts(c, b->heads[first + j].aux);
        double *mu0 = p.mu0, *sigma0 = p.sigma0;
        for (size_t i = 0; i < G * d; i++)
            mu0[i] = (double)mean[j * G * d + i];
        if (with_cov)
            for (size_t i = 0; i < G * d * d; i++)
                sigma0[i] = (double)cov[j * G * d * d + i];
        p.e->held |= 4;
    }
    return KVE_OK;
}

kve_status kve_policy_query_stats(kve_policy *p, const float *mean, const float *cov)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    return kve_bank_query_stats(&p->bank, 0, 1, mean, cov);
}

const kve_policy_type kve__expected_attention_type = {
    .name = "expected_attention",
    .summary = "the attention expected from the recent queries' statistics (reads queries, keys "
               "and values)",
    .params = params,
    .n_params = sizeof params / sizeof params[0],
    .flags = KVE_TYPE_SCORED | KVE_TYPE_READS_KEYS | KVE_TYPE_READS_QUERIES | KVE_TYPE_VNORM,
    .init = init,
    .step_keys = step,
    .select = kve__select_argmin,
    .evict = kve__evict_scored,
    .check_state = check_state,
};
