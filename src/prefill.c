/* SPDX-License-Identifier: MIT */
/*
 * prefill.c - compressing a prompt to the budget before decoding
 * (kvevict.h, "Prefill compression"): H2O's prompt scores, SnapKV and
 * KVzip.
 *
 * Legend: n prompt positions (0 .. n-1), r rows read (n for H2O, min(w, n)
 * for SnapKV, options.queries for KVzip), R = group query heads a KV head,
 * w the observation window, k the pooling kernel (odd), B the budget, s
 * KVzip's sinks.
 *   rows   (R, r, ld)  query head g's row j: the weights of query
 *                      t = n - r + j over keys 0 .. t (past t never read);
 *                      KVzip: reconstruction query j's over keys 0 .. n-1
 *   col    (n)         col[i] = sum over rows j, in row order, of the row's
 *                      weight on i reduced over the group (kve_rows: the
 *                      bank's reduction, float32), in double; KVzip: the
 *                      largest of those reduced weights (exact)
 *                      (h2o_mean with diagonal=1: the group's weights
 *                      reduced in double, mean_scores)
 *   score  (n)         what ranks i: H2O and KVzip col[i] (h2o_mean with
 *                      diagonal=1: col[i] / (n - i)); SnapKV, before
 *                      the window (i < n - w), the pooling of col over
 *                      [i - k/2, i + k/2] clipped to [0, n - w) (max, or the
 *                      sum divided by k); inside the window col[i]
 * Selection: when n > B, the `protect` newest positions (H2O: the policy's
 * recent_window; SnapKV: the window) or, KVzip, the first min(s, n) are
 * kept, and of the others the B - protect of highest score, ties to the
 * lower position (kve__top_k, the harness's own top-k selection).
 *
 * A same_positions bank is prefilled whole: the heads' scores are added in
 * head order (its combined score) and one selection is installed in every
 * head (each with its own column sums as its scores).
 *
 * Invariants: every argument, every weight that is read and every head is
 * checked before any head changes; a head is written only when the whole
 * call has succeeded but for its own installation, which cannot fail. The
 * scratch (n doubles, n bytes and B - protect heap entries for the bank) is
 * one allocation from the call's allocator (the options', else the bank's
 * or the C library's), freed before returning.
 * Cost: O(R r n) to read the rows, O(n k) to pool, O(n log B) to select.
 */
#include "policy_impl.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

kve_prefill_options kve_prefill_default_options(void)
{
    kve_prefill_options o = {.method = KVE_PREFILL_H2O, .window = 32, .kernel = 5,
                             .pool = KVE_POOL_MAX, .allocator = NULL, .queries = 1, .sinks = 4,
                             .values = NULL, .ld_values = 0, .budgets = KVE_PREFILL_PER_HEAD,
                             .layer_heads = 0, .prefix = KVE_PREFILL_NO_PREFIX,
                             .row_scale = NULL, .key_scale = NULL, .compression_ratio = 0.0};
    return o;
}

size_t kve_prefill_rows(size_t n, const kve_prefill_options *options)
{
    if (options && options->method == KVE_PREFILL_SNAPKV)
        return options->window < n ? options->window : n;
    if (options && options->method == KVE_PREFILL_KVZIP)
        return options->queries;
    return n;
}

/* The last key row j of r reads. */
static size_t last_key(const kve_prefill_options *p, size_t n, size_t r, size_t j)
{
    return p->method == KVE_PREFILL_KVZIP ? n - 1 : n - r + j;
}

/* The checks every entry point shares. */
static kve_status check_params(const kve_prefill_options *p, size_t n, size_t ld, size_t group,
                               kve_reduce reduce)
{
    if (p->method != KVE_PREFILL_H2O && p->method != KVE_PREFILL_SNAPKV &&
        p->method != KVE_PREFILL_KVZIP)
        return kve__fail(KVE_EINVAL, "prefill: method %d is not a kve_prefill_method",
                         (int)p->method);
    if (p->method == KVE_PREFILL_KVZIP && p->queries == 0)
        return kve__fail(KVE_EINVAL, "prefill: kvzip: queries must be at least 1");
    if (p->method == KVE_PREFILL_SNAPKV) {
        if (p->window == 0)
            return kve__fail(KVE_EINVAL, "prefill: snapkv: window must be at least 1");
        if (p->kernel == 0 || p->kernel % 2 == 0)
            return kve__fail(KVE_EINVAL, "prefill: snapkv: kernel %zu must be odd", p->kernel);
        if (p->pool != KVE_POOL_MAX && p->pool != KVE_POOL_AVG)
            return kve__fail(KVE_EINVAL, "prefill: snapkv: pool %d is not a kve_pool",
                             (int)p->pool);
    }
    if (n == 0 || n > (size_t)INT32_MAX + 1)
        return kve__fail(KVE_EINVAL, "prefill: n %zu is not in 1 .. 2^31", n);
    if (ld < n)
        return kve__fail(KVE_EINVAL, "prefill: ld %zu is smaller than n %zu", ld, n);
    if (group == 0)
        return kve__fail(KVE_EINVAL, "prefill: group must be at least 1");
    if (reduce != KVE_REDUCE_MEAN && reduce != KVE_REDUCE_SUM && reduce != KVE_REDUCE_MAX)
        return kve__fail(KVE_EINVAL, "prefill: reduce %d is not a kve_reduce", (int)reduce);
    if (p->budgets != KVE_PREFILL_PER_HEAD && p->budgets != KVE_PREFILL_PER_LAYER &&
        p->budgets != KVE_PREFILL_OVERALL)
        return kve__fail(KVE_EINVAL, "prefill: budgets %d is not a kve_prefill_budgets",
                         (int)p->budgets);
    if (p->method != KVE_PREFILL_KVZIP &&
        (p->budgets != KVE_PREFILL_PER_HEAD || p->layer_heads ||
         p->prefix != KVE_PREFILL_NO_PREFIX || p->row_scale || p->key_scale))
        return kve__fail(KVE_EINVAL, "prefill: budgets, layer_heads, prefix, row_scale and "
                         "key_scale are KVzip's (method KVE_PREFILL_KVZIP); leave them at their "
                         "defaults");
    if (p->compression_ratio != 0.0 &&
        !(p->compression_ratio > 0.0 && p->compression_ratio < 1.0))
        return kve__fail(KVE_EINVAL, "prefill: compression_ratio %g is not 0 or in (0, 1)",
                         p->compression_ratio);
    if (p->compression_ratio != 0.0 &&
        (p->method != KVE_PREFILL_KVZIP || p->budgets == KVE_PREFILL_PER_HEAD))
        return kve__fail(KVE_EINVAL, "prefill: compression_ratio is kvpress's KVzipPress cut "
                         "across heads: method KVE_PREFILL_KVZIP with budgets "
                         "KVE_PREFILL_PER_LAYER or KVE_PREFILL_OVERALL");
    size_t r = kve_prefill_rows(n, p);
    if (group > SIZE_MAX / r || ld > SIZE_MAX / sizeof(float) / (group * r))
        return kve__fail(KVE_EINVAL, "prefill: %zu rows of ld %zu overflow the address space",
                         group * r, ld);
    return KVE_OK;
}

/* KVzip+'s factors of one KV head (ks: its group * n key factors, or NULL)
 * and the scaled weights they make: finite factors >= 0, scaled weights
 * finite. Run after the weights are known to be valid. */
static kve_status check_scales(const kve_prefill_options *p, const float *rows, size_t n,
                               size_t r, size_t ld, size_t group, const float *ks,
                               const char *label)
{
    for (size_t k = 0; p->row_scale && k < r; k++)
        if (!(isfinite(p->row_scale[k]) && p->row_scale[k] >= 0.0f))
            return kve__fail(KVE_EINVAL, "prefill: row_scale[%zu] = %g is not a finite factor "
                             ">= 0", k, (double)p->row_scale[k]);
    for (size_t g = 0; ks && g < group; g++)
        for (size_t i = 0; i < n; i++)
            if (!(isfinite(ks[g * n + i]) && ks[g * n + i] >= 0.0f))
                return kve__fail(KVE_EINVAL, "prefill: %skey_scale of query head %zu on key %zu "
                                 "= %g is not a finite factor >= 0", label, g, i,
                                 (double)ks[g * n + i]);
    for (size_t g = 0; g < group; g++)
        for (size_t k = 0; k < r; k++) {
            const float *w = rows + (g * r + k) * ld;
            const float rs = p->row_scale ? p->row_scale[k] : 1.0f;
            for (size_t i = 0; i < n; i++) {
                float v = (w[i] * rs) * (ks ? ks[g * n + i] : 1.0f);
                if (isinf(v))
                    return kve__fail(KVE_EINVAL, "prefill: %squery head %zu, row %zu: the "
                                     "scaled weight on key %zu overflows float32", label, g, k, i);
            }
        }
    return KVE_OK;
}

/* Validates the weights one KV head's rows hold over [0, t] (and, with
 * reduce = sum, their reduced sums); `label` names the head in messages. */
static kve_status check_rows(const kve_prefill_options *p, const float *rows, size_t n, size_t r,
                             size_t ld, size_t group, kve_reduce reduce, const char *label)
{
    for (size_t j = 0; j < r; j++) {
        size_t t = last_key(p, n, r, j);
        for (size_t g = 0; g < group; g++) {
            kve_rows in = {rows + (g * r + j) * ld, ld, 1, reduce};
            size_t q, i;
            if (kve__rows_invalid(&in, t + 1, &q, &i)) {
                float a = in.row[i];
                return kve__fail(KVE_EINVAL, "prefill: %squery head %zu, query %zu: weight on "
                                 "key %zu = %g is %s", label, g, t, i, (double)a,
                                 isnan(a) ? "NaN" : isinf(a) ? "infinite" : "negative");
            }
        }
        if (group > 1 && reduce == KVE_REDUCE_SUM) {
            kve_rows in = {rows + j * ld, r * ld, group, reduce};
            size_t q, i;
            if (kve__rows_invalid(&in, t + 1, &q, &i))
                return kve__fail(KVE_EINVAL, "prefill: %squery %zu: the sum of %zu query heads "
                                 "on key %zu overflows float32", label, t, group, i);
        }
    }
    return KVE_OK;
}

/* The group's reduced weight on key i in row j, as the bank reduces. */
static float reduced(const float *rows, size_t r, size_t ld, size_t group, kve_reduce reduce,
                     size_t j, size_t i)
{
    const float *a = rows + j * ld + i;
    const size_t step = r * ld; /* from one query head's row j to the next's */
    if (group == 1)
        return a[0];
    if (reduce == KVE_REDUCE_MAX) {
        float m = a[0];
        for (size_t g = 1; g < group; g++)
            m = a[g * step] > m ? a[g * step] : m;
        return m;
    }
    double s = (double)a[0];
    for (size_t g = 1; g < group; g++)
        s += (double)a[g * step];
    return (float)(reduce == KVE_REDUCE_MEAN ? s / (double)group : s);
}

/* KVzip+: as reduced(), each query head's weight first scaled by the row's
 * factor rs and its own key factor (ks: group * n, or NULL), in float. */
static float reduced_scaled(const float *rows, size_t r, size_t ld, size_t group,
                            kve_reduce reduce, size_t j, size_t i, float rs, const float *ks,
                            size_t n)
{
    const float *a = rows + j * ld + i;
    const size_t step = r * ld;
    float m = 0.0f;
    double s = 0.0;
    for (size_t g = 0; g < group; g++) {
        float w = (a[g * step] * rs) * (ks ? ks[g * n + i] : 1.0f);
        if (group == 1)
            return w;
        m = g == 0 || w > m ? w : m;
        s += (double)w;
    }
    return reduce == KVE_REDUCE_MAX    ? m
           : reduce == KVE_REDUCE_MEAN ? (float)(s / (double)group)
                                       : (float)s;
}

/* col (n) and score (n) of one KV head's validated rows; ks: its KVzip+ key
 * factors (group * n) or NULL. */
static void head_scores(const kve_prefill_options *p, size_t n, const float *rows, size_t ld,
                        size_t group, kve_reduce reduce, const float *ks, double *col,
                        double *score)
{
    const size_t r = kve_prefill_rows(n, p);
    for (size_t i = 0; i < n; i++)
        col[i] = 0.0;
    if (p->method == KVE_PREFILL_KVZIP) {
        /* the largest weight of any row; weights are >= 0, so 0 is its floor */
        const bool plus = p->row_scale || ks;
        for (size_t j = 0; j < r; j++)
            for (size_t i = 0; i < n; i++) {
                double a = plus ? (double)reduced_scaled(rows, r, ld, group, reduce, j, i,
                                                         p->row_scale ? p->row_scale[j] : 1.0f,
                                                         ks, n)
                                : (double)reduced(rows, r, ld, group, reduce, j, i);
                col[i] = a > col[i] ? a : col[i];
            }
        memcpy(score, col, n * sizeof *score);
        return;
    }
    for (size_t j = 0; j < r; j++) {
        size_t t = n - r + j;
        for (size_t i = 0; i <= t; i++)
            col[i] += (double)reduced(rows, r, ld, group, reduce, j, i);
    }
    if (p->method == KVE_PREFILL_H2O) {
        memcpy(score, col, n * sizeof *score);
        return;
    }
    const size_t m = n - r, half = p->kernel / 2; /* positions before the window */
    for (size_t i = 0; i < m; i++) {
        size_t lo = i > half ? i - half : 0, hi = i + half < m ? i + half : m - 1;
        double v = p->pool == KVE_POOL_MAX ? col[lo] : 0.0;
        for (size_t q = lo; q <= hi; q++)
            v = p->pool == KVE_POOL_MAX ? (col[q] > v ? col[q] : v) : v + col[q];
        score[i] = p->pool == KVE_POOL_MAX ? v : v / (double)p->kernel;
    }
    for (size_t i = m; i < n; i++)
        score[i] = col[i];
}

/* col (n) and score (n) of one KV head's validated H2O rows for a policy
 * seeded with means (prefill_mean: h2o_mean with diagonal=1, kvpress's
 * ObservedAttentionPress): col[i] = sum over rows t >= i of the group's
 * weights on i reduced in double (no float32 rounding: kvpress averages
 * the heads' means), score[i] = the policy's rank of it. */
static void mean_scores(const kve_config *c, size_t n, const float *rows, size_t ld,
                        size_t group, kve_reduce reduce, double *col, double *score)
{
    for (size_t i = 0; i < n; i++)
        col[i] = 0.0;
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i <= t; i++) {
            const float *a = rows + t * ld + i;
            double s = (double)a[0];
            for (size_t g = 1; g < group; g++) {
                double w = (double)a[g * n * ld];
                s = reduce == KVE_REDUCE_MAX ? (w > s ? w : s) : s + w;
            }
            col[i] += reduce == KVE_REDUCE_MEAN ? s / (double)group : s;
        }
    for (size_t i = 0; i < n; i++)
        score[i] = c->type->prefill_rank ? c->type->prefill_rank(c, i, n, col[i]) : col[i];
}

/* Whether a prefill of `method` seeds c's heads with means (policy_impl.h). */
static bool seeds_means(const kve_config *c, kve_prefill_method method)
{
    return method == KVE_PREFILL_H2O && c->type->prefill_mean && c->type->prefill_mean(c);
}

kve_status kve_prefill_scores(size_t n, const float *rows, size_t ld, size_t group,
                              kve_reduce reduce, const kve_prefill_options *options,
                              double *scores)
{
    const kve_prefill_options o = options ? *options : kve_prefill_default_options();
    kve_status st = check_params(&o, n, ld, group, reduce);
    if (st != KVE_OK)
        return st;
    if (!rows || !scores)
        return kve__fail(KVE_EINVAL, "prefill: %s is NULL", !rows ? "rows" : "scores");
    if ((st = check_rows(&o, rows, n, kve_prefill_rows(n, &o), ld, group, reduce, "")) != KVE_OK)
        return st;
    if ((o.row_scale || o.key_scale) &&
        (st = check_scales(&o, rows, n, o.queries, ld, group, o.key_scale, "")) != KVE_OK)
        return st;
    const kve_allocator alloc = kve__allocator(o.allocator);
    double *col = kve__alloc(&alloc, n * sizeof *col);
    if (!col)
        return kve__fail(KVE_ENOMEM, "prefill: out of memory for %zu column sums", n);
    head_scores(&o, n, rows, ld, group, reduce, o.key_scale, col, scores);
    kve__dealloc(&alloc, col, n * sizeof *col);
    return KVE_OK;
}

/* The prompt's values for a policy with a vnorm column: present, far enough
 * apart, finite. */
static kve_status check_values(const kve_bank *b, size_t first, size_t count, size_t n,
                               const kve_prefill_options *p)
{
    const kve_config *c = &b->cfg;
    const char *name = c->type->name;
    if (!count)
        return KVE_OK;
    if (!p->values)
        return kve__fail(KVE_EINVAL, "%s: prefill: the policy reads values (vnorm), but "
                         "options.values is NULL", name);
    if (p->ld_values < c->value_dim)
        return kve__fail(KVE_EINVAL, "%s: prefill: ld_values %zu is smaller than value_dim %zu",
                         name, p->ld_values, c->value_dim);
    if (p->ld_values > SIZE_MAX / sizeof(float) / n / count)
        return kve__fail(KVE_EINVAL, "%s: prefill: %zu values of ld_values %zu overflow the "
                         "address space", name, count * n, p->ld_values);
    for (size_t j = 0; j < count; j++)
        for (size_t i = 0; i < n; i++) {
            const float *v = p->values + (j * n + i) * p->ld_values;
            size_t k = kve__key_invalid(v, c->value_dim);
            if (k != c->value_dim)
                return kve__fail(KVE_EINVAL, "%s: prefill: head %zu: the value of position %zu: "
                                 "value[%zu] = %g is %s", name, first + j, i, k, (double)v[k],
                                 isnan(v[k]) ? "NaN" : "infinite");
        }
    return KVE_OK;
}

/* ---- selection ---- */

/* keep[i] = 1 for the `want` candidates of [0, m) of highest score (ties to
 * the lower position); heap holds want entries. */
static void select_top(const double *score, size_t m, size_t want, kve__top_entry *heap,
                       unsigned char *keep)
{
    size_t k = kve__top_k(score, m, want, heap);
    for (size_t j = 0; j < k; j++)
        keep[heap[j].pos] = 1;
}

/* keep[i] = 1 for the positions a head of these scores keeps: all when n <=
 * budget; else the `protect` newest (KVzip: the first `protect`) and the
 * `want` of highest score among the others. */
static void choose(kve_prefill_method method, size_t n, size_t budget, size_t protect,
                   size_t want, const double *score, kve__top_entry *heap, unsigned char *keep)
{
    if (n <= budget) {
        memset(keep, 1, n);
    } else if (method == KVE_PREFILL_KVZIP) { /* the first `protect` (< budget < n) */
        memset(keep, 1, protect);
        memset(keep + protect, 0, n - protect);
        select_top(score + protect, n - protect, want, heap, keep + protect);
    } else {
        memset(keep, 0, n);
        memset(keep + (n - protect), 1, protect);
        select_top(score, n - protect, want, heap, keep);
    }
}

/* choose() for vnorm=2 (CriticalKV, kvpress's CriticalKVPress over the
 * method's scores; n > budget, H2O or SnapKV): the `protect` newest, then
 * stage one's max(0, floor(first_stage * budget) - protect) of highest
 * score, then of the others the rest of `want` of highest (score +
 * epsilon) * norm (values: the head's n, ld apart), ties to the lower
 * position in both stages. crit: n doubles of scratch. */
static void choose_critical(const kve_config *c, size_t n, size_t budget, size_t protect,
                            size_t want, const double *score, const float *values, size_t ld,
                            double *crit, kve__top_entry *heap, unsigned char *keep)
{
    const size_t m = n - protect;
    size_t s1 = (size_t)(c->params.first_stage * (double)budget);
    s1 = s1 > protect ? s1 - protect : 0;
    memset(keep, 0, n);
    memset(keep + m, 1, protect);
    select_top(score, m, s1, heap, keep);
    for (size_t i = 0; i < m; i++) /* stage one's picks first, as kvpress's finfo.max */
        crit[i] = keep[i] ? INFINITY
                          : (score[i] + c->params.epsilon) * kve__value_norm(c, values + i * ld);
    memset(keep, 0, m);
    select_top(crit, m, want, heap, keep);
}

/* Installs the kept positions in an empty head: pos, the policy's own
 * admission of each slot, and the score: the column sum for a policy whose
 * score is attention received (h2o, h2o_decay, tova) after H2O or SnapKV,
 * the policy's seed after H2O for one seeded with means (h2o_mean with
 * diagonal=1: mean_scores), else 0, as admitted (scissorhands counts votes,
 * h2o_mean derives it from its own columns, KVzip's rows are no attention
 * the sequence paid). With a
 * vnorm column, the norms of the kept positions' values (values: n of them,
 * ld apart) and score = raw * vnorm. */
static void install(const kve_config *c, kve_head *h, const unsigned char *keep, size_t n,
                    const double *col, kve_prefill_method method, const float *values,
                    size_t ld_values)
{
    int32_t *pos = h->col[KVE_COL_POS];
    double *score = h->col[KVE_COL_SCORE];
    double *raw = h->col[KVE_COL_RAW], *norm = h->col[KVE_COL_VNORM];
    const bool seeded = (c->type->flags & KVE_TYPE_ATTN_SCORE) && method != KVE_PREFILL_KVZIP;
    const bool mean = seeds_means(c, method);
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (!keep[i])
            continue;
        pos[w] = (int32_t)i;
        score[w] = seeded ? col[i] : 0.0;
        if (mean) { /* admit first: the seed overwrites what it starts */
            if (c->type->admit)
                c->type->admit(c, h, w);
            score[w] = c->type->prefill_seed ? c->type->prefill_seed(c, h, w, i, n, col[i]) : 0.0;
        }
        if (norm)
            norm[w] = kve__value_norm(c, values + i * ld_values);
        if (raw) {
            raw[w] = score[w];
            score[w] = norm ? raw[w] * norm[w] : raw[w];
        }
        if (c->type->admit && !mean)
            c->type->admit(c, h, w);
        w++;
    }
    h->size = w;
    h->last_pos = (int32_t)(n - 1);
    h->any_pos = true;
    h->gap = KVE_NONE;
    h->best = KVE_NONE;
}

static kve_status prefill(kve_bank *b, size_t first, size_t count, size_t n, size_t budget,
                          const float *rows, size_t ld, size_t group, kve_reduce reduce,
                          const kve_prefill_options *options);

/* ---- KVzip's budgets across heads (kvpress's compress_post) ----
 *
 * Every head's scores, the sinks' raised (kvevict's: +inf, never cut;
 * kvpress's with a prefix: the first min(sinks, prefix) scored 1, as its
 * score_val starts), then per layer the kept flags of its heads' scores
 * flattened (head-major: flat index j*n + i): PER_LAYER keeps the
 * layer_heads * budget highest, OVERALL all but those at or below the
 * threshold t = the P-th lowest of every score of the call (P = count * (n -
 * budget)); with compression_ratio cr, kvpress's counts: PER_LAYER keeps
 * all but int(layer_heads n cr), OVERALL P = max(int(count n cr), 1) (both
 * capped so that kvevict's sinks stay); ties to the lower flat index (kve__top_k), so among equal
 * scores the lower head, then the lower position, stays. kvpress breaks
 * such ties by torch.topk's order, which it does not define; scores of
 * distinct values give both the same kept sets. Heads that keep more than
 * their slots get a block (a shared group: one for the group), all
 * allocated before any head changes. */
static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static kve_status adaptive(kve_bank *b, size_t first, size_t count, size_t n, size_t budget,
                           const float *rows, size_t r, size_t ld, size_t group,
                           kve_reduce reduce, const kve_prefill_options *p)
{
    const kve_config *c = &b->cfg;
    const char *name = c->type->name;
    const size_t lh = p->budgets == KVE_PREFILL_PER_HEAD ? 1 : p->layer_heads ? p->layer_heads : count;
    if (count % lh)
        return kve__fail(KVE_EINVAL, "%s: prefill: layer_heads %zu does not divide the %zu heads "
                         "of the call", name, lh, count);
    if (lh > (size_t)INT32_MAX / n)
        return kve__fail(KVE_EINVAL, "%s: prefill: %zu heads of %zu positions a layer are too "
                         "many to rank together", name, lh, n);
    if (b->same_positions)
        return kve__fail(KVE_EINVAL, "%s: same_positions: every head keeps one kept set, so "
                         "budgets across heads (and kvpress's sinks) do not apply", name);
    if (b->share && (first % b->share || count % b->share))
        return kve__fail(KVE_EINVAL, "%s: prefill: heads %zu + %zu split a shared group of %zu",
                         name, first, count, b->share);
    const size_t groups = b->share ? count / b->share : 0;
    const size_t total = count * n, flat = lh * n;
    const double cr = p->compression_ratio;
    const bool overall = p->budgets == KVE_PREFILL_OVERALL && (n > budget || cr > 0.0);
    size_t bytes = total * sizeof(double) * (overall ? 2 : 1) + n * sizeof(double) +
                   (flat + 1) * sizeof(kve__top_entry) + total + count * sizeof(size_t) +
                   (count + groups) * sizeof(void *);
    const kve_allocator alloc = p->allocator ? kve__allocator(p->allocator) : b->alloc;
    char *scratch = kve__alloc(&alloc, bytes);
    if (!scratch)
        return kve__fail(KVE_ENOMEM, "%s: prefill: out of memory for the scores of %zu heads of "
                         "%zu positions", name, count, n);
    double *score = (double *)(void *)scratch, *col = score + total;
    double *sorted = overall ? col + n : NULL;
    kve__top_entry *heap = (kve__top_entry *)(void *)(col + n + (overall ? total : 0));
    size_t *kept = (size_t *)(void *)(heap + flat + 1);
    void **block = (void **)(void *)(kept + count);
    unsigned char *keep = (unsigned char *)(block + count + groups);
    const bool kvpress_sinks = p->prefix != KVE_PREFILL_NO_PREFIX;
    size_t sinks = kvpress_sinks && p->prefix < p->sinks ? p->prefix : p->sinks;
    if (sinks > n)
        sinks = n;
    for (size_t j = 0; j < count; j++) {
        double *sc = score + j * n;
        head_scores(p, n, rows + j * group * r * ld, ld, group, reduce,
                    p->key_scale ? p->key_scale + j * group * n : NULL, col, sc);
        for (size_t i = 0; i < sinks; i++)
            sc[i] = kvpress_sinks ? 1.0 : (double)INFINITY;
    }
    /* kvevict's sinks (+inf) are never among the pruned: at most the others */
    const size_t prunable = total - (kvpress_sinks ? 0 : count * sinks);
    double thres = 0;
    if (overall) {
        memcpy(sorted, score, total * sizeof *sorted);
        qsort(sorted, total, sizeof *sorted, cmp_double);
        size_t cut = cr > 0.0 ? (size_t)((double)total * cr) : count * (n - budget);
        cut = cut < prunable ? cut : prunable;
        thres = cut ? sorted[cut - 1] : -(double)INFINITY; /* kvpress: sorted[max(cut-1, 0)] */
        if (!cut && cr > 0.0 && prunable)
            thres = sorted[0];
    }
    for (size_t l = 0; l < count / lh; l++) {
        const double *s = score + l * flat;
        size_t want = flat;
        if (cr > 0.0 && !overall) {
            size_t cut = (size_t)((double)flat * cr), keep_least = kvpress_sinks ? 0 : lh * sinks;
            want = flat - cut > keep_least ? flat - cut : keep_least;
        } else if (n > budget && !overall) {
            want = lh * budget;
        } else if (overall) {
            for (size_t i = 0; i < flat; i++)
                want -= s[i] <= thres;
        }
        unsigned char *k = keep + l * flat;
        memset(k, 0, flat);
        size_t got = kve__top_k(s, flat, want, heap);
        for (size_t e = 0; e < got; e++)
            k[heap[e].pos] = 1;
    }
    for (size_t j = 0; j < count; j++) {
        kept[j] = 0;
        for (size_t i = 0; i < n; i++)
            kept[j] += keep[j * n + i];
    }
    /* storage for every head first: nothing changes unless all of it exists */
    kve_status st = KVE_OK;
    size_t made = 0;
    const size_t units = b->share ? groups : count;
    for (size_t u = 0; u < units; u++) {
        block[u] = NULL;
        size_t need = 0, have = 0;
        if (b->share) {
            for (size_t j = 0; j < b->share; j++)
                need += kept[u * b->share + j] + 1;
            have = b->groups[(first + u * b->share) / b->share].cap;
        } else {
            need = kept[u] + 1;
            have = b->heads[first + u].cap;
        }
        if (need > have && (st = kve__block_alloc(b, need, &block[u])) != KVE_OK)
            break;
        made = u + 1;
    }
    if (st != KVE_OK) {
        for (size_t u = 0; u < made; u++)
            if (block[u]) {
                size_t need = 0;
                for (size_t j = 0; b->share && j < b->share; j++)
                    need += kept[u * b->share + j] + 1;
                kve__dealloc(&b->alloc, block[u], kve__block_bytes(c, b->share ? need : kept[u] + 1));
            }
        kve__dealloc(&alloc, scratch, bytes);
        return st;
    }
    for (size_t u = 0; u < units; u++) {
        if (b->share) {
            const size_t gi = (first + u * b->share) / b->share;
            size_t need = 0;
            for (size_t j = 0; j < b->share; j++) {
                b->heads[first + u * b->share + j].size = kept[u * b->share + j];
                need += kept[u * b->share + j] + 1;
            }
            if (block[u])
                kve__group_adopt(b, gi, block[u], need);
            kve__group_even(b, gi);
        } else if (block[u]) {
            kve__head_adopt(b, &b->heads[first + u], block[u], kept[u] + 1, false);
        }
    }
    for (size_t j = 0; j < count; j++)
        install(c, &b->heads[first + j], keep + j * n, n, col, KVE_PREFILL_KVZIP,
                p->values ? p->values + j * n * p->ld_values : NULL, p->ld_values);
    kve__dealloc(&alloc, scratch, bytes);
    return KVE_OK;
}

kve_status kve_bank_prefill(kve_bank *b, size_t first, size_t count, size_t n, size_t budget,
                            const float *rows, size_t ld, size_t group, kve_reduce reduce,
                            const kve_prefill_options *options)
{
    if (!b)
        return kve__fail(KVE_EINVAL, "bank is NULL");
    kve_frame f; /* b's allocator runs */
    kve_status gst = kve__enter(&f, b, "a prefill");
    if (gst != KVE_OK)
        return gst;
    gst = prefill(b, first, count, n, budget, rows, ld, group, reduce, options);
    kve__leave(&f);
    return gst;
}

static kve_status prefill(kve_bank *b, size_t first, size_t count, size_t n, size_t budget,
                          const float *rows, size_t ld, size_t group, kve_reduce reduce,
                          const kve_prefill_options *options)
{
    const kve_prefill_options o = options ? *options : kve_prefill_default_options();
    const kve_prefill_options *params = &o;
    const kve_config *c = &b->cfg;
    const char *name = c->type->name;
    if (first > b->n_heads || count > b->n_heads - first)
        return kve__fail(KVE_EINVAL, "%s: heads %zu + %zu are out of range: the bank has %zu",
                         name, first, count, b->n_heads);
    kve_status st = check_params(params, n, ld, group, reduce);
    if (st != KVE_OK)
        return st;
    if (!(c->type->flags & KVE_TYPE_SCORED) || (c->type->flags & KVE_TYPE_READS_KEYS))
        return kve__fail(KVE_EINVAL, "%s: prefill needs a policy scored from attention (h2o, "
                         "tova, ...); %s", name,
                         c->type->flags & KVE_TYPE_READS_KEYS
                             ? "a policy that reads keys is stepped through the prompt and "
                               "evicted once instead"
                             : "evict this one instead");
    const size_t rw = c->params.recent_window;
    const size_t r = kve_prefill_rows(n, params);
    const kve_prefill_method method = params->method;
    const bool kvpress_sinks = method == KVE_PREFILL_KVZIP && params->prefix != KVE_PREFILL_NO_PREFIX;
    const size_t protect = method == KVE_PREFILL_SNAPKV ? params->window
                           : method == KVE_PREFILL_KVZIP ? (kvpress_sinks ? 0 : params->sinks)
                                                         : rw;
    if (budget == 0 || budget > c->params.budget)
        return kve__fail(KVE_EINVAL, "%s: prefill budget %zu is not in 1 .. %zu (the bank's "
                         "budget)", name, budget, c->params.budget);
    if (protect && budget <= protect)
        return kve__fail(KVE_EINVAL, "%s: prefill budget %zu must be greater than %s %zu", name,
                         budget, method == KVE_PREFILL_SNAPKV  ? "window"
                                 : method == KVE_PREFILL_KVZIP ? "sinks"
                                                               : "recent_window",
                         protect);
    if (count && !rows)
        return kve__fail(KVE_EINVAL, "%s: prefill: rows is NULL", name);
    if (c->elem[KVE_COL_VNORM] && (st = check_values(b, first, count, n, params)) != KVE_OK)
        return st;
    const bool critical = (c->type->flags & KVE_TYPE_VNORM) && c->params.vnorm == 2;
    if (critical && method == KVE_PREFILL_KVZIP)
        return kve__fail(KVE_EINVAL, "%s: vnorm=2 (CriticalKV) rescales a scorer's scores, and "
                         "KVzip's prefill is not one (kvpress's KVzipPress is no ScorerPress): "
                         "use KVE_PREFILL_H2O or KVE_PREFILL_SNAPKV", name);
    if (b->same_positions && count && (first != 0 || count != b->n_heads))
        return kve__fail(KVE_EINVAL, "%s: same_positions: a prefill chooses one kept set for "
                         "every head: prefill heads 0 + %zu, not %zu + %zu", name, b->n_heads,
                         first, count);
    for (size_t j = 0; j < count; j++) {
        const kve_head *h = &b->heads[first + j];
        if (h->size || h->any_pos)
            return kve__fail(KVE_EINVAL, "%s: head %zu: prefill needs an empty head (a new "
                             "sequence); this one has admitted position %ld", name, first + j,
                             (long)h->last_pos);
    }
    for (size_t j = 0; j < count; j++) {
        char label[32];
        snprintf(label, sizeof label, "head %zu: ", first + j);
        st = check_rows(params, rows + j * group * r * ld, n, r, ld, group, reduce, label);
        if (st == KVE_OK && (params->row_scale || params->key_scale))
            st = check_scales(params, rows + j * group * r * ld, n, r, ld, group,
                              params->key_scale ? params->key_scale + j * group * n : NULL,
                              label);
        if (st != KVE_OK)
            return st;
    }
    if (count == 0)
        return KVE_OK;
    if (method == KVE_PREFILL_KVZIP && (params->budgets != KVE_PREFILL_PER_HEAD || kvpress_sinks))
        return adaptive(b, first, count, n, budget, rows, r, ld, group, reduce, params);
    const size_t want = n <= budget ? 0 : budget - protect;
    /* same_positions: one kept set, chosen by the heads' scores added in head
     * order (the bank's combined score), installed in every head */
    const bool same = b->same_positions && n > budget;
    const bool crit = critical && n > budget; /* same_positions is refused with vnorm=2 */
    size_t bytes = (2 + same + crit) * n * sizeof(double) + n + (want + 1) * sizeof(kve__top_entry);
    const kve_allocator alloc = o.allocator ? kve__allocator(o.allocator) : b->alloc;
    char *scratch = kve__alloc(&alloc, bytes);
    if (!scratch)
        return kve__fail(KVE_ENOMEM, "%s: prefill: out of memory for the scores of %zu "
                         "positions", name, n);
    double *col = (double *)(void *)scratch, *score = col + n, *total = score + n;
    double *critical_score = score + (1 + same) * n; /* crit: n doubles */
    kve__top_entry *heap = (kve__top_entry *)(void *)(critical_score + (crit ? n : 0));
    unsigned char *keep = (unsigned char *)(heap + want + 1);
    const bool mean = seeds_means(c, method);
    for (size_t j = 0; same && j < count; j++) {
        if (mean)
            mean_scores(c, n, rows + j * group * r * ld, ld, group, reduce, col, score);
        else
            head_scores(params, n, rows + j * group * r * ld, ld, group, reduce,
                        params->key_scale ? params->key_scale + j * group * n : NULL, col,
                        score);
        for (size_t i = 0; i < n; i++)
            total[i] = j ? total[i] + score[i] : score[i];
    }
    if (same)
        choose(method, n, budget, protect, want, total, heap, keep);
    for (size_t j = 0; j < count; j++) {
        kve_head *h = &b->heads[first + j];
        if (mean)
            mean_scores(c, n, rows + j * group * r * ld, ld, group, reduce, col, score);
        else
            head_scores(params, n, rows + j * group * r * ld, ld, group, reduce,
                        params->key_scale ? params->key_scale + j * group * n : NULL, col,
                        score);
        if (crit)
            choose_critical(c, n, budget, protect, want, score,
                            params->values + j * n * params->ld_values, params->ld_values,
                            critical_score, heap, keep);
        else if (!same)
            choose(method, n, budget, protect, want, score, heap, keep);
        install(c, h, keep, n, col, method,
                params->values ? params->values + j * n * params->ld_values : NULL,
                params->ld_values);
    }
    kve__dealloc(&alloc, scratch, bytes);
    return KVE_OK;
}
