/*
 * decode.c - the forward pass of llama2.c's run.c with a KV cache that
 * kvevict's policies manage.
 *
 * The decode step at position t, per layer (docs/decoder.md says it in full):
 *   1. RMSNorm, then q (H*S), k and v (G*S) of position t;
 *   2. rotary embedding: under original positions q and k at t, and k is
 *      stored rotated; under cache positions k is stored as computed, every
 *      kept key is rotated at its index in the cache and q at the cache's
 *      length;
 *   3. each query head attends over its KV head's kept keys K and the new
 *      key (scaled dot products, max subtracted, softmax in float32);
 *   4. each KV head's policy receives the mean over its group's query heads
 *      of the weights on K, in kept order (lm_group_mean), and admits t;
 *      every head is evicted to the budget and the victims' keys and values
 *      are compacted out, so attention always runs over exactly the kept keys;
 *   5. output projection, residual, RMSNorm, SwiGLU, residual.
 * Then the final RMSNorm and the classifier.
 *
 * Invariants: cache (l, g) holds cache[].n rows in ascending position order,
 * equal to its policy's kept set between steps; every buffer a step needs is
 * grown before the step changes anything, so KVE_ENOMEM leaves the state as
 * it was. Arithmetic is float32 as in run.c, with fixed summation orders
 * (8 partial sums in dot products) so that results do not depend on the
 * compiler's vectoriser. Products of dimensions are size_t (64-bit).
 */
#define _POSIX_C_SOURCE 200809L
#include "lm.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* LANES: a dot product's partial sums; FIRST_CAP: a cache's first rows;
 * ATTEND_PARALLEL: the (key, query head) pairs of a layer from which its
 * attention is split over the threads. */
enum { LANES = 8, FIRST_CAP = 64, ATTEND_PARALLEL = 1024 };


/* ---- the neural net blocks ---- */

/* sum of a[i] * b[i] over i < n: LANES partial sums, combined pairwise,
 * then the tail. The compiler vectorises the lane loop. */
static float dot(const float *restrict a, const float *restrict b, size_t n)
{
    float acc[LANES] = {0};
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (size_t k = 0; k < LANES; k++)
            acc[k] += a[i + k] * b[i + k];
    float tail = 0.0f;
    for (; i < n; i++)
        tail += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

void lm_matmul(float *restrict xout, const float *restrict x, const float *restrict w, size_t n,
               size_t d)
{
    for (size_t i = 0; i < d; i++)
        xout[i] = dot(w + i * n, x, n);
}

static void rmsnorm(float *o, const float *x, const float *weight, size_t size, float eps)
{
    float ss = dot(x, x, size) / (float)size + eps;
    ss = 1.0f / sqrtf(ss);
    for (size_t j = 0; j < size; j++)
        o[j] = weight[j] * (ss * x[j]);
}

/* rmsnorm as ggml's CPU back end computes it (LM_PRODUCTS_LLAMA): the
 * squares, each rounded to float, summed in double in order; their mean
 * rounded to float before eps is added. */
static void rmsnorm_llama(float *o, const float *x, const float *weight, size_t size, float eps)
{
    double sum = 0.0;
    for (size_t j = 0; j < size; j++)
        sum += (double)(x[j] * x[j]);
    const float mean = (float)(sum / (double)size), ss = 1.0f / sqrtf(mean + eps);
    for (size_t j = 0; j < size; j++)
        o[j] = weight[j] * (ss * x[j]);
}

static void softmax(float *x, size_t size)
{
    float max_val = x[0];
    for (size_t i = 1; i < size; i++)
        if (x[i] > max_val)
            max_val = x[i];
    float sum = 0.0f;
    for (size_t i = 0; i < size; i++) {
        x[i] = expf(x[i] - max_val);
        sum += x[i];
    }
    for (size_t i = 0; i < size; i++)
        x[i] /= sum;
}

/* Whether softmax(x) (size) is finite, without it: it is unless some x is
 * NaN or the largest is infinite (then every weight is NaN, the first at
 * index 0: softmax's sum is NaN). */
static int softmax_finite(const float *x, size_t size)
{
    float max_val = x[0];
    for (size_t i = 0; i < size; i++) {
        if (x[i] != x[i])
            return 0;
        if (x[i] > max_val)
            max_val = x[i];
    }
    return isfinite(max_val);
}

void lm_rope_scaling_set(lm_config *c, lm_rope_scaling type, float factor, float attn,
                         int32_t orig)
{
    if (type == LM_ROPE_SCALING_NONE)
        factor = 1.0f; /* llama.cpp: never scaled when the type is none */
    if (type == LM_ROPE_SCALING_LINEAR && factor == 1.0f && attn == 1.0f)
        type = LM_ROPE_SCALING_NONE; /* the same rotation, exactly */
    c->rope_scaling = type;
    c->rope_factor = factor;
    c->rope_orig_ctx = orig;
    c->rope_attn_factor = attn;
    c->rope_mscale = attn;
    if (type == LM_ROPE_SCALING_YARN && factor > 1.0f)
        c->rope_mscale = attn * (1.0f + 0.1f * logf(factor));
}

kve_rope lm_rope(const lm_config *c)
{
    kve_rope r = kve_policy_default_options().rope;
    r.rotary_dim = (size_t)c->head_size, r.base = (double)c->rope_theta;
    r.pairs = KVE_ROPE_ADJACENT;
    if (c->rope_freqs || c->rope_factor < 1.0f) { /* what kve_rope cannot carry: */
        r.rotary_dim = KVE_ROPE_UNSET;              /* a policy that reads it refuses */
        return r;
    }
    if (c->rope_scaling == LM_ROPE_SCALING_LINEAR)
        r.scaling = KVE_ROPE_SCALING_LINEAR;
    else if (c->rope_scaling == LM_ROPE_SCALING_YARN)
        r.scaling = KVE_ROPE_SCALING_YARN, r.original_max_position = (size_t)c->rope_orig_ctx;
    if (c->rope_scaling != LM_ROPE_SCALING_NONE) {
        r.factor = (double)c->rope_factor;
        r.attention_factor = (double)c->rope_mscale; /* llama.cpp's magnitude, as given */
    }
    return r;
}

kve_rope lm_model_rope(const lm_model *m)
{
    const lm_config *c = &m->config;
    if (!c->rope_freqs || !m->weights.rope_freqs)
        return lm_rope(c);
    lm_config plain = *c;
    plain.rope_freqs = 0;
    kve_rope r = lm_rope(&plain);
    if (r.rotary_dim == KVE_ROPE_UNSET)
        return r;
    r.freq_factors = m->weights.rope_freqs; /* pair j's frequency over rope_freqs[j] */
    r.attention_factor = (double)c->rope_mscale; /* as rope_row scales a rope_freqs file */
    return r;
}

/* yarn's correction dimension of llama.cpp (ggml_rope_yarn_corr_dim): the
 * pair index, counted in dimensions, whose wavelength turns n_rot times in
 * the original context. */
static float yarn_corr_dim(float S, float orig, float n_rot, float base)
{
    return S * logf(orig / (n_rot * 2.0f * 3.14159265358979323846f)) / (2.0f * logf(base));
}

/* rope (S): cos and sin interleaved for position pos. Pair j (dimensions i
 * = 2j, 2j + 1) turns by pos * f_j, run.c's f_j = 1 / theta^(2j / S) (theta
 * 10000 but in GGUF files that say otherwise: llama.rope.freq_base), then
 * as llama.cpp scales it (ggml's rope_yarn, lm_config's rope fields): f_j
 * divided by rope_freqs[j]; linear: times 1 / factor; yarn: times
 * (1 - ramp_j) / factor + ramp_j, ramp_j = 1 - clamp((j - lo) / max(0.001,
 * hi - lo), 0, 1) between the correction dimensions lo = max(0,
 * floor(corr(32))) and hi = min(S - 1, ceil(corr(1))), and cos and sin
 * times rope_mscale. Without scaling the arithmetic is run.c's, unchanged. */
static void rope_row(float *rope, int64_t pos, size_t S, const lm_model *m)
{
    const lm_config *c = &m->config;
    const float theta = c->rope_theta, fs = 1.0f / c->rope_factor;
    const float *ff = m->weights.rope_freqs;
    const int scaled = c->rope_scaling != LM_ROPE_SCALING_NONE || ff;
    float lo = 0, hi = 0;
    if (c->rope_scaling == LM_ROPE_SCALING_YARN) {
        float orig = (float)c->rope_orig_ctx, fS = (float)S;
        lo = fmaxf(0.0f, floorf(yarn_corr_dim(fS, orig, 32.0f, theta)));
        hi = fminf(fS - 1.0f, ceilf(yarn_corr_dim(fS, orig, 1.0f, theta)));
    }
    for (size_t i = 0; i < S; i += 2) {
        float freq = 1.0f / powf(theta, (float)i / (float)S);
        if (scaled) {
            if (ff)
                freq /= ff[i / 2];
            if (c->rope_scaling == LM_ROPE_SCALING_LINEAR) {
                freq *= fs;
            } else if (c->rope_scaling == LM_ROPE_SCALING_YARN) {
                size_t pair = i / 2; /* ggml's i0 / 2, a whole pair index */
                float y = ((float)pair - lo) / fmaxf(0.001f, hi - lo);
                float ramp = 1.0f - fminf(1.0f, fmaxf(0.0f, y));
                freq *= fs * (1.0f - ramp) + ramp;
            }
        }
        float val = (float)pos * freq;
        rope[i] = cosf(val);
        rope[i + 1] = sinf(val);
        if (scaled && c->rope_mscale != 1.0f) {
            rope[i] *= c->rope_mscale;
            rope[i + 1] *= c->rope_mscale;
        }
    }
}

/* rope_row as ggml's CPU back end computes it (ggml_rope_cache_init and
 * rope_yarn, LM_PRODUCTS_LLAMA): the angle of pair j is pos * theta_scale^j
 * by repeated float multiplication, theta_scale = base^(-2 / S), divided
 * by rope_freqs[j]; scaled by 1 / factor (linear, yarn), yarn's ramp mixing
 * the scaled angle with the unscaled one and its magnitude factor applied
 * inside; cos and sin times the attention factor. */
static void rope_row_llama(float *rope, int64_t pos, size_t S, const lm_model *m)
{
    const lm_config *c = &m->config;
    const float *ff = m->weights.rope_freqs;
    const float theta_scale = powf(c->rope_theta, -2.0f / (float)S);
    const float fs = c->rope_scaling == LM_ROPE_SCALING_NONE ? 1.0f : 1.0f / c->rope_factor;
    const int yarn = c->rope_scaling == LM_ROPE_SCALING_YARN;
    const float attn = c->rope_scaling != LM_ROPE_SCALING_NONE || ff ? c->rope_attn_factor : 1.0f;
    float lo = 0, hi = 0;
    if (yarn) {
        float orig = (float)c->rope_orig_ctx, fS = (float)S;
        lo = fmaxf(0.0f, floorf(yarn_corr_dim(fS, orig, 32.0f, c->rope_theta)));
        hi = fminf(fS - 1.0f, ceilf(yarn_corr_dim(fS, orig, 1.0f, c->rope_theta)));
    }
    float theta = (float)pos;
    for (size_t i = 0; i < S; i += 2) {
        const float extrap = theta / (ff ? ff[i / 2] : 1.0f);
        float t = fs * extrap, ms = attn;
        if (yarn) {
            const size_t pair = i / 2; /* ggml's i0 / 2 */
            const float y = ((float)pair - lo) / fmaxf(0.001f, hi - lo);
            const float mix = 1.0f - fminf(1.0f, fmaxf(0.0f, y));
            t = fmaf(t, 1 - mix, extrap * mix); /* contracted, as rotate_llama's */
            ms *= fmaf(logf(1.0f / fs), 0.1f, 1.0f);
        }
        rope[i] = cosf(t) * ms;
        rope[i + 1] = sinf(t) * ms;
        theta *= theta_scale;
    }
}

void lm_rope_row(const lm_model *m, int llama_products, int64_t pos, float *rope)
{
    (llama_products ? rope_row_llama : rope_row)(rope, pos, (size_t)m->config.head_size, m);
}

/* Rotates the pairs of vec (S) by rope (S). */
static void rotate(float *vec, const float *rope, size_t S)
{
    for (size_t i = 0; i < S; i += 2) {
        float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = v0 * rope[i] - v1 * rope[i + 1];
        vec[i + 1] = v0 * rope[i + 1] + v1 * rope[i];
    }
}

/* rotate as ggml's rotate_pairs runs in llama.cpp's CPU back end
 * (LM_PRODUCTS_LLAMA): the build contracts x0 cos - x1 sin and x0 sin + x1
 * cos into fused multiply-adds of the second product, rounded first. */
static void rotate_llama(float *vec, const float *rope, size_t S)
{
    for (size_t i = 0; i < S; i += 2) {
        const float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = fmaf(v0, rope[i], -(v1 * rope[i + 1]));
        vec[i + 1] = fmaf(v0, rope[i + 1], v1 * rope[i]);
    }
}

void lm_group_mean(float *out, const float *rows, size_t ld, size_t group, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double sum = 0;
        for (size_t r = 0; r < group; r++)
            sum += rows[r * ld + i];
        out[i] = (float)(sum / (double)group);
    }
}

/* ---- state ---- */

/* The group size of the quantized input the model's integer products read
 * (Q8_0, Q4_K: 32; version 2: its group size), 0 when none does. */
static size_t q8_group(const lm_model *m)
{
    const lm_weights *w = &m->weights;
    size_t g = lm_matrix_q8_group(&w->wcls);
    for (int32_t l = 0; !g && l < m->config.n_layers; l++) {
        const lm_layer *ly = &w->layer[l];
        const lm_matrix *all[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->w3};
        for (size_t i = 0; !g && i < sizeof all / sizeof all[0]; i++)
            g = lm_matrix_q8_group(all[i]);
    }
    return g;
}

/* The group of the quantized input the products read (0: none): the
 * model's integer products' (q8_group); LM_PRODUCTS_LLAMA: 32, or the
 * version-2 group when smaller. *widest: the longest input, max(D, F, H*S). */
static size_t input_group(const lm_model *m, lm_products products, size_t *widest)
{
    const lm_config *c = &m->config;
    size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim;
    size_t HS = (size_t)c->n_heads * (size_t)c->head_size, group = q8_group(m);
    *widest = D > F ? D : F;
    *widest = HS > *widest ? HS : *widest;
    if (products == LM_PRODUCTS_LLAMA) /* groups of 32 (or the version-2 group, when smaller) */
        group = group && group < 32 ? group : 32;
    return group;
}

/* The block buffers (lm_forward_batch), freed and set to NULL. */
static void free_block(lm_state *s)
{
    void **bufs[] = {(void **)&s->bx,   (void **)&s->bxb,     (void **)&s->bxb2,
                     (void **)&s->bhb,  (void **)&s->bhb2,    (void **)&s->bq,
                     (void **)&s->bk,   (void **)&s->bv,      (void **)&s->brope,
                     (void **)&s->blogits, (void **)&s->bhinv, (void **)&s->bxq,
                     (void **)&s->bxd,  (void **)&s->bxl,     (void **)&s->bxs,
                     (void **)&s->bq8};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        lm_free(&s->alloc, *bufs[i]);
        *bufs[i] = NULL;
    }
    s->bcap = 0;
}

static void free_buffers(lm_state *s)
{
    void *bufs[] = {s->x,    s->xb,         s->xb2,     s->hb,     s->hb2,     s->q,
                    s->k,    s->v,          s->rope,    s->logits, s->att,     s->krot,
                    s->rope_table, s->victims, s->counts, s->pf_rows, s->xq, s->xd, s->xl, s->xs,
                    s->wov, s->kz_wov, s->layer_keep, s->pf_values, s->qh};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        lm_free(&s->alloc, bufs[i]);
    free_block(s);
}

void lm_state_free(lm_state *s)
{
    if (!s)
        return;
    if (s->cache) {
        const lm_config *c = &s->model->config;
        for (size_t i = 0; !s->arena && i < (size_t)c->n_layers * (size_t)c->n_kv_heads; i++) {
            lm_free(&s->alloc, s->cache[i].key);
            lm_free(&s->alloc, s->cache[i].value);
            lm_free(&s->alloc, s->cache[i].pos);
        }
        lm_free(&s->alloc, s->cache);
    }
    lm__arena_free(s);
    lm_pool_free(s->pool);
    lm_free(&s->alloc, s->layer_budget);
    lm_free(&s->alloc, s->head_budget);
    kve_bank_free(s->bank);
    lm_free(&s->alloc, s->spec);
    free_buffers(s);
    const kve_allocator a = s->alloc;
    lm_free(&a, s);
}

/* The model's facts a policy that reads queries or values is built with:
 * keys and queries of head_size floats, n_heads / n_kv_heads queries a KV
 * head, the decoder's rotary embedding (lm_rope), values of s->value_dim
 * floats. */
static void data_options(const lm_state *s, kve_bank_options *o)
{
    const lm_config *c = &s->model->config;
    o->key_dim = (size_t)c->head_size;
    o->value_dim = s->value_dim;
    o->query_group = (size_t)(c->n_heads / c->n_kv_heads);
    o->rope = lm_model_rope(s->model);
}

/* The floats of a value the policy is handed (s->reads, lm__budgets_init):
 * none when it reads neither queries nor values; the raw value (S) for one
 * that reads queries (expected_attention, as kvpress's use_vnorm); R*D, W_o v
 * over the KV head's query heads (CriticalKV), for vnorm=1 alone. */
static size_t value_dim_of(const lm_state *s)
{
    const lm_config *c = &s->model->config;
    if (!(s->reads & (KVE_READS_QUERIES | KVE_READS_VALUES)))
        return 0;
    if (s->reads & KVE_READS_QUERIES)
        return (size_t)c->head_size;
    return (size_t)c->n_heads / (size_t)c->n_kv_heads * (size_t)c->dim;
}

/* The bank of every (layer, KV head), layer-major, built from one generator
 * seeded by opt.seed (so a run is reproducible from its seed), with keys of
 * head_size floats (the policies that read keys get each new key) and, for
 * a policy that reads queries or values, the facts of data_options; NULL
 * without a policy. Its spec's budget is the largest layer budget (it sizes
 * the slots); with share_heads each layer's KV heads are one shared group. */
static kve_status make_bank(const lm_state *s, kve_bank **out)
{
    *out = NULL;
    if (!s->spec)
        return KVE_OK;
    const lm_config *c = &s->model->config;
    char spec[KVE_SPEC_MAX];
    kve_status st = lm__bank_spec(s, spec, sizeof spec);
    if (st != KVE_OK)
        return st;
    kve_bank_options o = kve_bank_default_options();
    o.allocator = s->opt.allocator;
    o.share = s->opt.share_heads ? (size_t)c->n_kv_heads : 0;
    o.min_share = s->opt.min_share;
    o.same_positions = s->opt.same_positions != 0;
    kve_rng rng;
    kve_rng_seed(&rng, s->opt.seed);
    o.key_dim = (size_t)c->head_size;
    if (s->value_dim)
        data_options(s, &o);
    st = kve_bank_new_ex(spec, (size_t)c->n_layers * (size_t)c->n_kv_heads, &rng, &o, out);
    return st == KVE_OK ? st : kve_set_error(st, "policy: %s", kve_last_error());
}

kve_status lm_state_new(const lm_model *m, const lm_options *opt, lm_state **out)
{
    if (!m || !out)
        return kve_set_error(KVE_EINVAL, "decoder: NULL argument");
    static const lm_options defaults = {0};
    if (!opt)
        opt = &defaults;
    if (opt->positions != LM_POS_ORIGINAL && opt->positions != LM_POS_CACHE)
        return kve_set_error(KVE_EINVAL, "decoder: positions must be original or cache");
    char spec[KVE_SPEC_MAX];
    if (opt->policy) {
        char num[32];
        snprintf(num, sizeof num, "%zu", opt->budget);
        kve_status st = kve_spec_with(opt->policy, opt->budget ? "budget" : NULL,
                                      opt->budget ? num : NULL, spec, sizeof spec);
        if (st != KVE_OK)
            return kve_set_error(st, "policy: %s", kve_last_error());
    } else if (opt->budget || opt->head_budgets) {
        return kve_set_error(KVE_EINVAL, "decoder: a budget needs a policy");
    }
    if (opt->threads > LM_MAX_THREADS)
        return kve_set_error(KVE_EINVAL, "decoder: threads %zu is above %d", opt->threads,
                       LM_MAX_THREADS);
    if (opt->products != LM_PRODUCTS_EXACT && opt->products != LM_PRODUCTS_LLAMA)
        return kve_set_error(KVE_EINVAL, "decoder: products %d is neither exact (0) nor llama (1)",
                             (int)opt->products);
    if ((unsigned)opt->llama_cpu >= LM_LLAMA_CPU_COUNT)
        return kve_set_error(KVE_EINVAL, "decoder: llama_cpu %d is not a variant (0 .. %d)",
                             (int)opt->llama_cpu, LM_LLAMA_CPU_COUNT - 1);
    const lm_config *c = &m->config;
    size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim, S = (size_t)c->head_size;
    size_t H = (size_t)c->n_heads, G = (size_t)c->n_kv_heads, V = (size_t)c->vocab_size;
    size_t LG = (size_t)c->n_layers * G;
    lm_state *s = lm_calloc(opt->allocator, 1, sizeof *s);
    if (!s)
        return kve_set_error(KVE_ENOMEM, "decoder: out of memory");
    s->model = m;
    s->opt = *opt;
    if (s->opt.llama_cpu == LM_LLAMA_CPU_AUTO) /* the variant llama.cpp loads here */
        s->opt.llama_cpu = lm_llama_cpu_detect();
    if (opt->allocator) { /* the state's own copy, which its blocks and bank use */
        s->alloc = *opt->allocator;
        s->opt.allocator = &s->alloc;
    }
    s->opt.policy = NULL; /* the canonical copy below is the one used */
    int ok = 1;
    if (opt->policy) {
        size_t len = strlen(spec) + 1;
        ok = (s->spec = lm_malloc(&s->alloc, len)) != NULL;
        if (ok)
            memcpy(s->spec, spec, len);
    }
    s->x = lm_calloc(&s->alloc, D, sizeof(float));
    s->xb = lm_calloc(&s->alloc, D, sizeof(float));
    s->xb2 = lm_calloc(&s->alloc, D, sizeof(float));
    s->hb = lm_calloc(&s->alloc, F, sizeof(float));
    s->hb2 = lm_calloc(&s->alloc, F, sizeof(float));
    s->q = lm_calloc(&s->alloc, H * S, sizeof(float));
    s->k = lm_calloc(&s->alloc, G * S, sizeof(float));
    s->v = lm_calloc(&s->alloc, G * S, sizeof(float));
    s->rope = lm_calloc(&s->alloc, S, sizeof(float));
    s->qh = lm_calloc(&s->alloc, (opt->threads > 1 ? opt->threads : 1) * S, sizeof(float));
    s->logits = lm_calloc(&s->alloc, V, sizeof(float));
    s->counts = lm_calloc(&s->alloc, opt->same_positions ? LG : G, sizeof(size_t));
    s->cache = lm_calloc(&s->alloc, LG, sizeof *s->cache);
    size_t widest, group = input_group(m, opt->products, &widest);
    if (opt->products == LM_PRODUCTS_LLAMA) {
        s->xl = lm_malloc(&s->alloc, widest * sizeof(float));
        s->xs = lm_malloc(&s->alloc, (widest / 32 + 1) * sizeof(float));
        ok = ok && s->xl && s->xs;
    }
    if (group) {
        s->xq = lm_malloc(&s->alloc, widest);
        s->xd = lm_malloc(&s->alloc, (widest / group + 1) * sizeof(float));
        ok = ok && s->xq && s->xd;
    }
    ok = ok && s->x && s->xb && s->xb2 && s->hb && s->hb2 && s->q && s->k && s->v && s->rope && s->qh &&
         s->logits && s->counts && s->cache;
    kve_status st = ok ? lm__budgets_init(s) : KVE_ENOMEM;
    if (st == KVE_OK && ok) {
        s->value_dim = value_dim_of(s);
        if ((s->reads & KVE_READS_QUERIES) && opt->positions == LM_POS_CACHE)
            st = kve_set_error(KVE_EINVAL, "decoder: policy %s reads queries, which it takes "
                               "rotated at their positions: it needs positions original, not "
                               "cache", s->spec);
        if (st == KVE_OK && s->value_dim > (size_t)c->head_size &&
            !(s->wov = lm_calloc(&s->alloc, G * s->value_dim + (size_t)c->n_heads * c->head_size,
                                 sizeof(float)))) {
            ok = 0;
            st = KVE_ENOMEM;
        }
    }
    if (st == KVE_OK && ok && opt->threads > 1)
        st = lm_pool_new(opt->threads, s->opt.allocator, &s->pool);
    if (st == KVE_OK && ok)
        st = make_bank(s, &s->bank);
    if (!ok)
        kve_set_error(KVE_ENOMEM, "decoder: out of memory for the activations");
    if (st != KVE_OK) {
        lm_state_free(s);
        return st;
    }
    *out = s;
    return KVE_OK;
}

kve_status lm_state_reset(lm_state *s)
{
    if (!s)
        return kve_set_error(KVE_EINVAL, "decoder: NULL state");
    kve_bank *fresh;
    kve_status st = make_bank(s, &fresh);
    if (st != KVE_OK)
        return st;
    kve_bank_free(s->bank);
    s->bank = fresh;
    const lm_config *c = &s->model->config;
    for (size_t i = 0; i < (size_t)c->n_layers * (size_t)c->n_kv_heads; i++)
        s->cache[i].n = 0;
    s->pos = 0;
    s->broken = 0;
    s->prefilling = 0;
    if (s->layer_keep)
        memset(s->layer_keep, 0, (size_t)c->n_layers * sizeof *s->layer_keep);
    return KVE_OK;
}

size_t lm_state_kept(const lm_state *s, int32_t layer, int32_t kv_head)
{
    return s->cache[(size_t)layer * (size_t)s->model->config.n_kv_heads + (size_t)kv_head].n;
}

/* realloc of *p to n elements of `size` bytes; the old block stays valid
 * (and *p unchanged) on failure. */
static int grow(const kve_allocator *a, void *pp, size_t n, size_t size)
{
    void **p = pp;
    if (n > SIZE_MAX / size)
        return 0;
    void *q = lm_realloc(a, *p, n * size);
    if (!q)
        return 0;
    *p = q;
    return 1;
}

/* The parts the state's pool runs (1 without one): attention's scratch
 * is one a part. */
static size_t parts_of(const lm_state *s)
{
    return s->opt.threads > 1 ? s->opt.threads : 1;
}

/* Whether the policies are stepped at each position (not during a prefill
 * that records rows or KVzip's), and whether they evict there. */
static int stepped(const lm_state *s)
{
    return s->bank && !(s->prefilling && s->pf_method);
}

static int evicting(const lm_state *s)
{
    return stepped(s) && !s->prefilling;
}

/* Makes room for the keys of the next `b` positions in every cache and for
 * the attention scratch over them, before they change anything: b more keys
 * a cache (a shared layer's arena: b more a head, a block that evicts
 * nothing), but at most its budget + 1 when its policy evicts at every step
 * (never more is held). Rows of the rotary table up to the largest cache
 * under cache positions. */
static kve_status reserve(lm_state *s, size_t b)
{
    const lm_config *c = &s->model->config;
    size_t S = (size_t)c->head_size, H = (size_t)c->n_heads, G = (size_t)c->n_kv_heads;
    size_t LG = (size_t)c->n_layers * G, need_ld = 0, rows = 0;
    const int evicts = evicting(s);
    for (size_t i = 0; i < LG; i++) {
        lm_cache *k = &s->cache[i];
        size_t bud = !s->bank ? 0 : s->head_budget ? s->head_budget[i] : s->layer_budget[i / G];
        size_t want = k->n + b; /* the keys it may hold during the b steps */
        if (evicts && want > bud + 1)
            want = k->n + 1 > bud + 1 ? k->n + 1 : bud + 1;
        if (s->arena) { /* a shared layer: its arena, laid out again or grown */
            kve_status st = (i % G) ? KVE_OK : lm__arena_reserve(s, i / G, b);
            if (st != KVE_OK)
                return st;
        } else if (want > k->cap) {
            size_t cap = k->cap ? 2 * k->cap : FIRST_CAP;
            cap = cap > want ? cap : want;
            if (s->bank && want <= bud + 1 && cap > bud + 1)
                cap = bud + 1; /* a policy that evicts never holds more */
            if (!grow(&s->alloc, &k->key, cap, S * sizeof(float)) ||
                !grow(&s->alloc, &k->value, cap, S * sizeof(float)) ||
                !grow(&s->alloc, &k->pos, cap, sizeof(int32_t)))
                return kve_set_error(KVE_ENOMEM, "decoder: out of memory for a cache of %zu keys", cap);
            k->cap = cap;
        }
        if (k->cap > need_ld)
            need_ld = k->cap;
        if (want > rows)
            rows = want;
    }
    if (need_ld > s->ld) {
        size_t vrows = s->opt.same_positions ? LG : G; /* victim rows: one a head evicted at once */
        int ok = grow(&s->alloc, &s->att, H * need_ld, sizeof(float)) &&
                 grow(&s->alloc, &s->victims, vrows * need_ld, sizeof(int32_t));
        if (ok && s->opt.positions == LM_POS_CACHE) /* krot: one a thread */
            ok = grow(&s->alloc, &s->krot, need_ld * parts_of(s), S * sizeof(float)) &&
                 grow(&s->alloc, &s->rope_table, need_ld, S * sizeof(float));
        if (!ok)
            return kve_set_error(KVE_ENOMEM, "decoder: out of memory for attention over %zu keys",
                           need_ld);
        s->ld = need_ld;
    }
    if (s->opt.positions == LM_POS_CACHE) /* a row per cache index; the same rows whenever */
        for (rows = rows < s->ld ? rows : s->ld; s->rope_rows < rows; s->rope_rows++)
            (s->opt.products == LM_PRODUCTS_LLAMA ? rope_row_llama : rope_row)(
                s->rope_table + s->rope_rows * S, (int64_t)s->rope_rows, S, s->model);
    return KVE_OK;
}

/* Keeps in cache k only the positions of kept[0 .. m) (both ascending): its
 * policy's kept set after an eviction or a prefill. */
static kve_status keep_only(lm_cache *k, const int32_t *kept, size_t m, size_t S)
{
    size_t w = 0, j = 0;
    for (size_t i = 0; i < k->n && j < m; i++) {
        if (k->pos[i] != kept[j])
            continue;
        if (w != i) {
            k->pos[w] = k->pos[i];
            memcpy(k->key + w * S, k->key + i * S, S * sizeof(float));
            memcpy(k->value + w * S, k->value + i * S, S * sizeof(float));
        }
        w++;
        j++;
    }
    if (j != m)
        return kve_set_error(KVE_EINVAL, "decoder: the policy keeps position %d, which the cache does "
                       "not hold", kept[j]);
    k->n = w;
    return KVE_OK;
}

/* KVzip: query head h of layer l, at reconstruction key index n (its own),
 * with att its softmax over the cache (keys 0 .. n, the prompt's positions
 * at their own index). The scoring softmax is over the sinks [0, s0), the
 * chunk [a, b) and the reconstruction keys [pf_n, n]: the same weights
 * divided by their sum over that set (exp(l_i) / sum over the set of
 * exp(l_j)). The running maximum on the chunk's keys goes to pf_rows. */
static void kvzip_score(lm_state *s, size_t l, size_t h, const float *att, size_t n)
{
    size_t a = s->kz_start, b = s->kz_end, s0 = s->kz_sinks < a ? s->kz_sinks : a;
    double sum = 0.0;
    for (size_t i = 0; i < s0; i++)
        sum += att[i];
    for (size_t i = a; i < b; i++)
        sum += att[i];
    for (size_t i = s->pf_n; i <= n; i++)
        sum += att[i];
    const size_t at = (l * (size_t)s->model->config.n_heads + h) * s->pf_n;
    float *best = s->pf_rows + at;
    const float *wov = s->kz_wov ? s->kz_wov + at : NULL; /* KVzip+ */
    for (size_t i = a; i < b; i++) {
        float w = (float)(att[i] / sum);
        if (wov) {
            w = w * s->kz_hinv;
            w = w * wov[i];
        }
        best[i] = w > best[i] ? w : best[i];
    }
}

/* Where KVzip+'s scratch starts in kz_wov: after the norms, 8-byte aligned. */
static size_t kvzip_scratch_at(size_t norms)
{
    return norms + (norms & 1);
}

/* KVzip+: kz_wov[(l H + h) n + i] = ||W_o[:, h S .. h S + S) v_i|| for every
 * prompt position i (the caches hold the whole prompt, position i at index
 * i): one row of W_o at a time, as step_data reads it. Refused (not
 * finite: NaN or overflow) before anything is cut. */
static kve_status kvzip_value_norms(lm_state *s, size_t n, float *row)
{
    const lm_config *c = &s->model->config;
    size_t L = (size_t)c->n_layers, H = (size_t)c->n_heads, G = (size_t)c->n_kv_heads;
    size_t S = (size_t)c->head_size, D = (size_t)c->dim, R = H / G;
    double *acc = (double *)(void *)(s->kz_wov + kvzip_scratch_at(L * H * n)); /* (H n) */
    for (size_t l = 0; l < L; l++) {
        memset(acc, 0, H * n * sizeof *acc);
        for (size_t d = 0; d < D; d++) {
            lm_matrix_row(&s->model->weights.layer[l].wo, d, row);
            for (size_t h = 0; h < H; h++) {
                const lm_cache *k = &s->cache[l * G + h / R];
                for (size_t i = 0; i < n; i++) {
                    double y = (double)dot(row + h * S, k->value + i * S, S);
                    acc[h * n + i] += y * y;
                }
            }
        }
        for (size_t i = 0; i < H * n; i++) {
            float v = (float)sqrt(acc[i]);
            if (!isfinite(v))
                return kve_set_error(KVE_ERANGE, "prefill: kvzip+: layer %zu, query head %zu: "
                                     "||W_o v|| of position %zu is not finite", l, i / n, i % n);
            s->kz_wov[(l * H) * n + i] = v;
        }
    }
    return KVE_OK;
}

/* llama.cpp's CPU flash attention (ggml_compute_forward_flash_attn_ext_f16,
 * one query, float16 keys and values, cells in position order): scores
 * s_i = (q16 . k_i) * (1 / sqrt(S)) in s[], then the online softmax with
 * its value accumulator in float16: on a new maximum M the accumulator is
 * scaled by exp(M_old - M) and rounded, each value added times exp(s_i -
 * M) and rounded (ggml_vec_mad_f16: a fused multiply-add for every
 * dimension, lm_f16_mad), and
 * the sum of the weights kept in float; out = the accumulator times 1 /
 * sum. */
static void flash_f16(const float *s, size_t n, const float *values, size_t S, float *out)
{
    float M = -INFINITY, sum = 0.0f;
    memset(out, 0, S * sizeof *out);
    for (size_t i = 0; i < n; i++) {
        float ms = 1.0f, vs = 1.0f;
        if (s[i] > M) {
            const float old = M;
            M = s[i];
            ms = expf(old - M);
            for (size_t j = 0; j < S; j++)
                out[j] *= ms;
            lm_f16_round_n(out, S);
        } else {
            vs = expf(s[i] - M);
        }
        lm_f16_mad(out, values + i * S, vs, S); /* ggml_vec_mad_f16 */
        sum = sum * ms + vs;
    }
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (size_t j = 0; j < S; j++)
        out[j] *= inv;
}

/* Whether anything reads the softmax rows of the attention (s->att): the
 * policies, a prefill's records, KVzip, the callback. Under
 * LM_PRODUCTS_LLAMA, whose flash attention needs none, they are computed
 * only then; otherwise att[0] says whether the softmax would have been
 * finite (0) or not (NaN, its first non-finite weight being at 0). */
static int rows_read(const lm_state *s)
{
    return s->opt.products != LM_PRODUCTS_LLAMA || s->opt.on_attention || s->kz_active ||
           (s->bank && !(s->prefilling && s->pf_method == 2));
}

/* Attention of layer l for the KV heads g0 <= g < g1 (rope: the
 * position's cos and sin under original positions; krot and qh the
 * caller's scratch, krot (ld, S) under cache positions, qh (S)): new key
 * and value appended, then the softmax rows of the group's query heads in
 * s->att and their weighted values in s->xb. Afterwards s->q holds the
 * rotated queries and s->k the rotated new keys (what on_qk and the
 * key-reading policies get). Writes only those heads' parts of the state. */
static void attend_heads(lm_state *s, size_t l, const float *rope, size_t g0, size_t g1,
                         float *krot, float *qh)
{
    const lm_config *c = &s->model->config;
    size_t S = (size_t)c->head_size, G = (size_t)c->n_kv_heads,
           R = (size_t)(c->n_heads / c->n_kv_heads);
    float scale = sqrtf((float)S); /* run.c divides by sqrt(head_size) */
    /* llama.cpp's arithmetic: float16 keys and values, its flash attention */
    const int llama = s->opt.products == LM_PRODUCTS_LLAMA, rows = rows_read(s);
    const int original = s->opt.positions == LM_POS_ORIGINAL; /* else krot is given */
    for (size_t g = g0; g < g1; g++) {
        lm_cache *k = &s->cache[l * G + g];
        size_t n = k->n; /* kept keys; the new one goes to row n */
        float *krow = k->key + n * S;
        memcpy(krow, s->k + g * S, S * sizeof(float));
        memcpy(k->value + n * S, s->v + g * S, S * sizeof(float));
        if (llama)
            lm_f16_round_n(k->value + n * S, S); /* as llama.cpp's cache */
        k->pos[n] = s->pos;
        k->n = n + 1;
        const float *keys = k->key, *qrope = rope;
        if (original) {
            (llama ? rotate_llama : rotate)(krow, rope, S);
            if (llama)
                lm_f16_round_n(krow, S);
        } else {
            for (size_t i = 0; i <= n; i++) {
                memcpy(krot + i * S, k->key + i * S, S * sizeof(float));
                (llama ? rotate_llama : rotate)(krot + i * S, s->rope_table + i * S, S);
                if (llama)
                    lm_f16_round_n(krot + i * S, S);
            }
            keys = krot;
            qrope = s->rope_table + n * S;
        }
        memcpy(s->k + g * S, keys + n * S, S * sizeof(float));
        for (size_t r = 0; r < R; r++) {
            size_t h = g * R + r;
            float *q = s->q + h * S, *att = s->att + h * s->ld, *out = s->xb + h * S;
            (llama ? rotate_llama : rotate)(q, qrope, S);
            if (llama) { /* the scores from the float16 query; the policies get
                            their softmax in float32, as in the exact products */
                memcpy(qh, q, S * sizeof(float));
                lm_f16_round_n(qh, S); /* as its attention converts a query */
                const float inv = 1.0f / scale;
                lm_dot_f16_keys(qh, keys, n + 1, S, inv, s->opt.llama_cpu, att);
                flash_f16(att, n + 1, k->value, S, out);
                if (rows) {
                    softmax(att, n + 1);
                    if (s->kz_active)
                        kvzip_score(s, l, h, att, n);
                } else { /* att[0]: NaN where softmax's first NaN would be, else 0 (no
                            reader: attention_step's check alone reads it) */
                    att[0] = softmax_finite(att, n + 1) ? 0.0f : NAN;
                }
                continue;
            }
            for (size_t i = 0; i <= n; i++)
                att[i] = dot(q, keys + i * S, S) / scale;
            softmax(att, n + 1);
            if (s->kz_active)
                kvzip_score(s, l, h, att, n);
            memset(out, 0, S * sizeof(float));
            for (size_t i = 0; i <= n; i++) {
                const float *v = k->value + i * S;
                float a = att[i];
                for (size_t j = 0; j < S; j++)
                    out[j] += a * v[j];
            }
        }
        s->counts[g] = n + 1;
    }
}

typedef struct attend_job {
    lm_state *s;
    size_t l;
    const float *rope;
} attend_job;

/* Part `part` of `parts`: KV heads [part G / parts, (part + 1) G / parts),
 * with the part's own scratch. */
static void attend_part(void *arg, size_t part, size_t parts)
{
    const attend_job *j = arg;
    lm_state *s = j->s;
    const size_t G = (size_t)s->model->config.n_kv_heads, S = (size_t)s->model->config.head_size;
    attend_heads(s, j->l, j->rope, part * G / parts, (part + 1) * G / parts,
                 s->opt.positions == LM_POS_ORIGINAL ? NULL : s->krot + part * s->ld * S,
                 s->qh + part * S);
}

/* attend_heads over every KV head: its heads split over the state's
 * threads when the layer's attention is worth waking them (a head's
 * results are the same on any thread). */
static void attend(lm_state *s, size_t l, const float *rope)
{
    const lm_config *c = &s->model->config;
    const size_t G = (size_t)c->n_kv_heads, R = (size_t)(c->n_heads / c->n_kv_heads);
    size_t keys = 0; /* (key, query head) pairs */
    for (size_t g = 0; g < G; g++)
        keys += (s->cache[l * G + g].n + 1) * R;
    attend_job j = {s, l, rope};
    if (s->pool && G > 1 && keys >= ATTEND_PARALLEL)
        lm_pool_run(s->pool, attend_part, &j);
    else
        attend_part(&j, 0, 1);
}

/* CriticalKV's W_o v of layer l's new values into s->wov: for query head h
 * the D floats W_o[:, h*S .. h*S+S) v of its KV head (KV head g's R*D at
 * wov + g*R*D). */
static void wov_of(lm_state *s, size_t l)
{
    const lm_config *c = &s->model->config;
    size_t S = (size_t)c->head_size, D = (size_t)c->dim, H = (size_t)c->n_heads;
    size_t R = H / (size_t)c->n_kv_heads;
    const lm_matrix *wo = &s->model->weights.layer[l].wo;
    float *row = s->wov + H * D; /* (H*S) one row of W_o, in float32 */
    for (size_t i = 0; i < D; i++) {
        lm_matrix_row(wo, i, row);
        for (size_t h = 0; h < H; h++)
            s->wov[h * D + i] = dot(row + h * S, s->v + h / R * S, S);
    }
}

/* Layer l's step data for a policy that reads queries or values (s->reads):
 * the attention rows and the rotated new keys as kve_bank_step_range gets
 * them, the rotated queries of each KV head's R query heads (s->q is laid
 * out so: query head g*R + r), and the values: the raw value (value_dim S)
 * or, for vnorm=1, CriticalKV's W_o v: for KV head g the R*D floats
 * W_o[:, h*S .. h*S+S) v over its query heads h = g*R + r, whose norm is
 * sqrt(sum over h of ||W_o^h v||^2) (one D x S matvec a query head: the
 * cost of the layer's output projection once more). During a prefill that
 * steps the prompt (the policy's own scores), its last position carries
 * KVE_STEP_RESCORE, so a policy that rescores every `interval` steps scores
 * the whole prompt before the one eviction. */
static kve_step_data step_data(lm_state *s, size_t l)
{
    const lm_config *c = &s->model->config;
    size_t S = (size_t)c->head_size, G = (size_t)c->n_kv_heads, R = (size_t)c->n_heads / G;
    kve_step_data d = kve_step_default_data();
    d.attn = s->att;
    d.ld = s->ld;
    d.group = R;
    d.reduce = KVE_REDUCE_MEAN;
    if (s->reads & KVE_READS_KEYS) {
        d.keys = s->k;
        d.ld_keys = S;
    }
    if (s->reads & KVE_READS_QUERIES) {
        d.queries = s->q;
        d.ld_queries = S;
    }
    if ((s->reads & KVE_READS_VALUES) && s->wov) {
        wov_of(s, l);
        d.values = s->wov;
        d.ld_values = s->value_dim;
    } else if (s->reads & KVE_READS_VALUES) {
        d.values = s->v;
        d.ld_values = S;
    }
    if (s->prefilling && (size_t)s->pos + 1 == s->pf_n)
        d.flags = KVE_STEP_RESCORE;
    return d;
}

/* A same_positions bank: every head to the budget in one eviction (the same
 * victims everywhere), then every cache to the kept positions. */
static kve_status evict_all(lm_state *s)
{
    const lm_config *c = &s->model->config;
    size_t LG = (size_t)c->n_layers * (size_t)c->n_kv_heads, S = (size_t)c->head_size;
    kve_status st = kve_bank_evict(s->bank, s->layer_budget[0], s->victims, s->ld, s->counts);
    if (st != KVE_OK)
        return kve_set_error(st, "policies (every layer's heads, same positions) at position "
                             "%d: %s", s->pos, kve_last_error());
    for (size_t i = 0; st == KVE_OK && i < LG; i++)
        st = keep_only(&s->cache[i], kve_bank_positions(s->bank, i), kve_bank_size(s->bank, i), S);
    return st;
}

/* Steps layer l's policies (with the new keys, for a policy that reads
 * them; with step_data, for one that reads queries or values) and, unless
 * `evict` is 0, evicts them and compacts their caches. */
static kve_status manage(lm_state *s, size_t l, int evict)
{
    const lm_config *c = &s->model->config;
    size_t S = (size_t)c->head_size, G = (size_t)c->n_kv_heads,
           R = (size_t)(c->n_heads / c->n_kv_heads);
    kve_status st;
    if (s->value_dim) {
        kve_step_data d = step_data(s, l);
        st = kve_bank_step_data(s->bank, l * G, G, s->pos, &d);
    } else {
        const float *keys = kve_bank_reads(s->bank) & KVE_READS_KEYS ? s->k : NULL;
        st = kve_bank_step_range(s->bank, l * G, G, s->pos, s->att, s->ld, R, KVE_REDUCE_MEAN,
                                 keys, S);
    }
    if (st == KVE_OK && !evict)
        return KVE_OK;
    if (st == KVE_OK && s->opt.same_positions) /* once, after the last layer: evict_all */
        return l + 1 == (size_t)c->n_layers ? evict_all(s) : KVE_OK;
    size_t b = s->layer_budget[l];
    if (st == KVE_OK && s->head_budget) /* each head to its own budget */
        for (size_t g = 0; st == KVE_OK && g < G; g++)
            st = kve_bank_evict_range(s->bank, l * G + g, 1, s->head_budget[l * G + g],
                                      s->victims + g * s->ld, s->ld, s->counts + g);
    else if (st == KVE_OK)
        st = s->opt.share_heads ? kve_bank_evict_shared(s->bank, l * G, G,
                                                        s->layer_keep && s->layer_keep[l]
                                                            ? s->layer_keep[l]
                                                            : G * b,
                                                        s->victims, s->ld, s->counts)
                                : kve_bank_evict_range(s->bank, l * G, G, b, s->victims, s->ld,
                                                       s->counts);
    if (st != KVE_OK)
        return kve_set_error(st, "policies of layer %zu (bank heads %zu..%zu) at position %d: %s", l,
                       l * G, l * G + G - 1, s->pos, kve_last_error());
    for (size_t g = 0; st == KVE_OK && g < G; g++)
        st = keep_only(&s->cache[l * G + g], kve_bank_positions(s->bank, l * G + g),
                       kve_bank_size(s->bank, l * G + g), S);
    return st;
}

/* Prefill: the rows of layer l's query heads for position s->pos, when it is
 * among the last pf_r of the prompt. The cache holds every position, so row
 * h over keys 0 .. pos is att[h * ld .. + pos]. */
static void record_rows(lm_state *s, size_t l)
{
    size_t t = (size_t)s->pos, n = s->pf_n, r = s->pf_r, H = (size_t)s->model->config.n_heads;
    if (t < n - r)
        return;
    for (size_t h = 0; h < H; h++)
        memcpy(s->pf_rows + ((l * H + h) * r + (t - (n - r))) * n, s->att + h * s->ld,
               (t + 1) * sizeof(float));
}

/* The budget head i (layer-major) is cut to. */
static size_t budget_of_head(const lm_state *s, size_t i)
{
    return s->head_budget ? s->head_budget[i] : s->layer_budget[i / (size_t)s->model->config.n_kv_heads];
}

/* What every prefill checks before it decodes anything: the state, the
 * tokens, and kve_bank_prefill's view of params at every head's budget
 * (params NULL: the policy's own scores, nothing to check). */
static kve_status prefill_check(lm_state *s, const int32_t *tokens, size_t n,
                                const kve_prefill_options *params, kve_reduce reduce)
{
    if (!s || !tokens || n == 0)
        return kve_set_error(KVE_EINVAL, "prefill: %s", !s ? "NULL state" : !tokens ? "NULL tokens"
                                                                            : "no tokens");
    if (!s->bank)
        return kve_set_error(KVE_EINVAL, "prefill: the decoder has no policy to compress with");
    if (s->pos != 0 || s->broken)
        return kve_set_error(KVE_EINVAL, "prefill: the decoder is at position %d; reset it first",
                       s->pos);
    const lm_config *c = &s->model->config;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return kve_set_error(KVE_EINVAL, "prefill: token %zu = %d is outside the vocabulary "
                           "[0, %d)", i, tokens[i], c->vocab_size);
    size_t G = (size_t)c->n_kv_heads, R = (size_t)(c->n_heads / c->n_kv_heads);
    for (size_t i = 0; params && i < (size_t)c->n_layers * G; i++)
        if (kve_bank_prefill(s->bank, 0, 0, n, budget_of_head(s, i), NULL, n, R, reduce,
                             params) != KVE_OK)
            return kve_set_error(KVE_EINVAL, "prefill: layer %zu: %s", i / G, kve_last_error());
    return KVE_OK;
}

/* Decodes tokens[0 .. n) with every key kept, the policies not stepped
 * (method 1: rows recorded, 2: KVzip, nothing recorded) or stepped without
 * evicting (method 0), in blocks (lm_forward_batch). */
static kve_status prefill_read(lm_state *s, const int32_t *tokens, size_t n, int method, size_t r)
{
    s->prefilling = 1;
    s->pf_method = method;
    s->pf_n = n;
    s->pf_r = r;
    kve_status st = lm_forward_batch(s, tokens, n, NULL, NULL);
    s->prefilling = 0;
    return st;
}

/* Cuts every head to its budget: kve_bank_prefill over pf_rows (r rows a
 * query head; params NULL: one eviction by the policy's own scores), then
 * the caches to the kept positions. A failure leaves the state broken. */
static kve_status prefill_compress(lm_state *s, size_t n, size_t r,
                                   const kve_prefill_options *params, kve_reduce reduce)
{
    const lm_config *c = &s->model->config;
    size_t L = (size_t)c->n_layers, H = (size_t)c->n_heads, G = (size_t)c->n_kv_heads;
    size_t S = (size_t)c->head_size, R = H / G;
    kve_status st = KVE_OK;
    kve_prefill_options pv; /* params with the prompt's values, when recorded */
    if (params) {
        pv = *params;
        if (s->pf_values) {
            pv.values = s->pf_values;
            pv.ld_values = s->value_dim;
        }
        params = &pv;
    }
    const size_t head_values = n * s->value_dim; /* floats of one head's prompt values */
    if (s->opt.same_positions) { /* the whole bank at once: one kept set */
        size_t LG = L * G;
        st = params ? kve_bank_prefill(s->bank, 0, LG, n, s->layer_budget[0], s->pf_rows, n, R,
                                       reduce, params)
                    : kve_bank_evict(s->bank, s->layer_budget[0], s->victims, s->ld, s->counts);
        if (st != KVE_OK)
            st = kve_set_error(st, "prefill: every layer (same positions): %s", kve_last_error());
        for (size_t i = 0; st == KVE_OK && i < LG; i++)
            st = keep_only(&s->cache[i], kve_bank_positions(s->bank, i),
                           kve_bank_size(s->bank, i), S);
        s->broken = st != KVE_OK;
        return st;
    }
    if (params && params->method == KVE_PREFILL_KVZIP && params->budgets == KVE_PREFILL_OVERALL) {
        /* one threshold over every layer's heads: one call, then each
         * layer's kept total is its shared budget while decoding */
        st = kve_bank_prefill(s->bank, 0, L * G, n, s->layer_budget[0], s->pf_rows, n, R, reduce,
                              params);
        if (st != KVE_OK)
            st = kve_set_error(st, "prefill: every layer (kvzip overall): %s", kve_last_error());
        size_t floor = 1; /* a shared eviction's least: above G * recent_window */
        if (st == KVE_OK && kve_spec_min_budget(s->spec, &floor) == KVE_OK)
            floor = G * (floor - 1) + 1;
        for (size_t l = 0; st == KVE_OK && l < L; l++) {
            size_t total = 0;
            for (size_t g = 0; g < G; g++)
                total += kve_bank_size(s->bank, l * G + g);
            s->layer_keep[l] = total > floor ? total : floor;
        }
        for (size_t i = 0; st == KVE_OK && i < L * G; i++)
            st = keep_only(&s->cache[i], kve_bank_positions(s->bank, i),
                           kve_bank_size(s->bank, i), S);
        s->broken = st != KVE_OK;
        return st;
    }
    for (size_t l = 0; l < L && st == KVE_OK; l++) {
        /* the layer in one call, or (per-head budgets) head by head */
        size_t step = s->head_budget ? 1 : G;
        for (size_t g = 0; g < G && st == KVE_OK; g += step) {
            size_t b = budget_of_head(s, l * G + g);
            if (params && s->pf_values)
                pv.values = s->pf_values + (l * G + g) * head_values;
            if (params)
                st = kve_bank_prefill(s->bank, l * G + g, step, n, b,
                                      s->pf_rows + (l * H + g * R) * r * n, n, R, reduce, params);
            else
                st = kve_bank_evict_range(s->bank, l * G + g, step, b, s->victims + g * s->ld,
                                          s->ld, s->counts + g);
        }
        if (st != KVE_OK)
            st = kve_set_error(st, "prefill: layer %zu: %s", l, kve_last_error());
        for (size_t g = 0; st == KVE_OK && g < G; g++)
            st = keep_only(&s->cache[l * G + g], kve_bank_positions(s->bank, l * G + g),
                           kve_bank_size(s->bank, l * G + g), S);
    }
    if (st != KVE_OK)
        s->broken = 1;
    return st;
}

kve_status lm_prefill(lm_state *s, const int32_t *tokens, size_t n,
                      const kve_prefill_options *options)
{
    const kve_prefill_options *params = options;
    if (params && params->method == KVE_PREFILL_KVZIP)
        return kve_set_error(KVE_EINVAL, "prefill: kvzip needs its reconstruction prompt: "
                                         "lm_prefill_kvzip");
    kve_status st = prefill_check(s, tokens, n, params, KVE_REDUCE_MEAN);
    if (st != KVE_OK)
        return st;
    const lm_config *c = &s->model->config;
    size_t L = (size_t)c->n_layers, H = (size_t)c->n_heads;
    size_t r = params ? kve_prefill_rows(n, params) : 0;
    if (params && (r > SIZE_MAX / n / sizeof(float) / (L * H) ||
                   !grow(&s->alloc, &s->pf_rows, L * H * r * n, sizeof(float))))
        return kve_set_error(KVE_ENOMEM, "prefill: out of memory for %zu rows of %zu weights",
                       L * H * r, n);
    /* a vnorm policy reads the prompt's values (W_o v, value_dim floats a
     * position and KV head) */
    const size_t LG = L * (size_t)c->n_kv_heads, vd = s->value_dim;
    lm_free(&s->alloc, s->pf_values);
    s->pf_values = NULL;
    if (params && s->wov &&
        (vd > SIZE_MAX / sizeof(float) / n / LG ||
         !(s->pf_values = lm_malloc(&s->alloc, LG * n * vd * sizeof(float)))))
        return kve_set_error(KVE_ENOMEM, "prefill: out of memory for the values of %zu "
                             "positions", n);
    if ((st = prefill_read(s, tokens, n, params != NULL, r)) == KVE_OK)
        st = prefill_compress(s, n, r, params, KVE_REDUCE_MEAN);
    lm_free(&s->alloc, s->pf_values);
    s->pf_values = NULL;
    return st;
}

/* Drops every key at index pf_n and beyond (the reconstruction's) and puts
 * the position back at pf_n. */
static void kvzip_drop(lm_state *s)
{
    const lm_config *c = &s->model->config;
    for (size_t i = 0; i < (size_t)c->n_layers * (size_t)c->n_kv_heads; i++)
        if (s->cache[i].n > s->pf_n)
            s->cache[i].n = s->pf_n;
    s->pos = (int32_t)s->pf_n;
}

kve_status lm_prefill_kvzip(lm_state *s, const int32_t *tokens, size_t n, const lm_kvzip *kz,
                            const kve_prefill_options *options)
{
    kve_prefill_options p = options ? *options : kve_prefill_default_options();
    if (!options)
        p.method = KVE_PREFILL_KVZIP;
    if (p.method != KVE_PREFILL_KVZIP)
        return kve_set_error(KVE_EINVAL, "prefill: lm_prefill_kvzip takes method kvzip, not %d",
                             (int)p.method);
    p.queries = 1; /* the running maximum over the reconstruction's queries */
    if (!kz)
        return kve_set_error(KVE_EINVAL, "prefill: kvzip: NULL prompts");
    if (kz->chunk == 0 || kz->overlap > kz->chunk || kz->overlap > LM_KVZIP_PROMPT_MAX ||
        kz->n_first > LM_KVZIP_PROMPT_MAX || kz->n_later > LM_KVZIP_PROMPT_MAX)
        return kve_set_error(KVE_EINVAL, "prefill: kvzip: chunk %zu, overlap %zu or a prompt of "
                             "%zu or %zu tokens out of range (chunk >= 1, overlap <= chunk, "
                             "each at most %d)", kz->chunk, kz->overlap, kz->n_first, kz->n_later,
                             LM_KVZIP_PROMPT_MAX);
    kve_status st = prefill_check(s, tokens, n, &p, KVE_REDUCE_MAX);
    if (st != KVE_OK)
        return st;
    const lm_config *c = &s->model->config;
    const int32_t V = c->vocab_size;
    if (p.budgets != KVE_PREFILL_PER_HEAD) {
        if (!s->opt.share_heads || s->head_budget)
            return kve_set_error(KVE_EINVAL, "prefill: kvzip: budgets across heads need each "
                                 "layer's heads to share its budget while decoding (share_heads)"
                                 "%s", s->head_budget ? ", not per-head budgets" : "");
        if (p.budgets == KVE_PREFILL_PER_LAYER && p.compression_ratio != 0.0)
            return kve_set_error(KVE_EINVAL, "prefill: kvzip: compression_ratio with per-layer "
                                 "budgets: each layer decodes at G times its budget; use "
                                 "overall budgets, or the budget for the count");
        for (size_t l = 1; p.budgets == KVE_PREFILL_OVERALL && l < (size_t)c->n_layers; l++)
            if (s->layer_budget[l] != s->layer_budget[0])
                return kve_set_error(KVE_EINVAL, "prefill: kvzip: overall budgets need one "
                                     "budget for every layer; layer %zu has %zu, layer 0 %zu",
                                     l, s->layer_budget[l], s->layer_budget[0]);
    }
    for (size_t i = 0; i < kz->n_first + kz->n_later + 1; i++) {
        int32_t t = i < kz->n_first ? kz->first[i]
                    : i < kz->n_first + kz->n_later ? kz->later[i - kz->n_first]
                                                    : kz->newline;
        if (t < 0 || t >= V)
            return kve_set_error(KVE_EINVAL, "prefill: kvzip: prompt token %d is outside the "
                                 "vocabulary [0, %d)", t, V);
    }
    size_t L = (size_t)c->n_layers, H = (size_t)c->n_heads, D = (size_t)c->dim;
    float *logits = lm_malloc(&s->alloc, (size_t)V * sizeof *logits);
    const size_t chunk = kz->chunk < n ? kz->chunk : n; /* a reconstruction's tokens, at most: */
    int32_t *seq = lm_malloc(&s->alloc, (2 * LM_KVZIP_PROMPT_MAX + 1 + chunk) * sizeof *seq);
    /* KVzip+: (L H n) norms, then (H n) doubles and a row of W_o as scratch */
    const size_t wov_floats = kvzip_scratch_at(L * H * n) + 2 * H * n + D;
    int ok = logits && seq && n <= SIZE_MAX / sizeof(float) / (L * H + 2 * H + D + 1) &&
             grow(&s->alloc, &s->pf_rows, L * H * n, sizeof(float));
    if (ok && kz->plus) {
        lm_free(&s->alloc, s->kz_wov);
        ok = (s->kz_wov = lm_malloc(&s->alloc, wov_floats * sizeof(float))) != NULL;
    }
    if (ok && p.budgets == KVE_PREFILL_OVERALL && !s->layer_keep)
        ok = (s->layer_keep = lm_calloc(&s->alloc, L, sizeof *s->layer_keep)) != NULL;
    if (!ok) {
        lm_free(&s->alloc, logits);
        lm_free(&s->alloc, seq);
        return kve_set_error(KVE_ENOMEM, "prefill: kvzip: out of memory for %zu scores", L * H * n);
    }
    memset(s->pf_rows, 0, L * H * n * sizeof(float));
    if ((st = prefill_read(s, tokens, n, 2, 0)) == KVE_OK && kz->plus)
        st = kvzip_value_norms(s, n, s->kz_wov + kvzip_scratch_at(L * H * n) + 2 * H * n);
    if (st != KVE_OK) {
        lm_free(&s->alloc, logits);
        lm_free(&s->alloc, seq);
        lm_free(&s->alloc, s->kz_wov);
        s->kz_wov = NULL;
        s->broken = 1;
        return st;
    }
    memcpy(logits, s->logits, (size_t)V * sizeof *logits);
    /* The reconstruction, chunk by chunk; the prefix (BOS) is not repeated. */
    int32_t bos = s->model->config.bos;
    size_t first = bos >= 0 && tokens[0] == bos ? 1 : 0;
    s->prefilling = 1;
    s->kz_sinks = p.sinks;
    for (size_t a = first; a < n && st == KVE_OK; a += kz->chunk) {
        size_t b = n - a > kz->chunk ? a + kz->chunk : n;
        s->kz_start = a;
        s->kz_end = b;
        s->kz_active = 1;
        size_t m = 0; /* the reconstruction sequence, decoded in blocks */
        if (a == first) {
            memcpy(seq, kz->first, kz->n_first * sizeof *seq);
            m = kz->n_first;
        } else {
            memcpy(seq, kz->later, kz->n_later * sizeof *seq);
            m = kz->n_later; /* then the previous chunk's last tokens */
            memcpy(seq + m, tokens + a - kz->overlap, kz->overlap * sizeof *seq);
            m += kz->overlap;
            seq[m++] = kz->newline;
        }
        memcpy(seq + m, tokens + a, (b - a) * sizeof *seq);
        st = lm_forward_batch(s, seq, m + b - a, NULL, NULL);
        s->kz_active = 0;
        kvzip_drop(s);
    }
    s->prefilling = 0;
    memcpy(s->logits, logits, (size_t)V * sizeof *logits);
    lm_free(&s->alloc, logits);
    lm_free(&s->alloc, seq);
    lm_free(&s->alloc, s->kz_wov);
    s->kz_wov = NULL;
    if (st != KVE_OK)
        return st; /* lm_forward left the state broken */
    return prefill_compress(s, n, 1, &p, KVE_REDUCE_MAX);
}

/* Where products() puts the inputs it quantizes or converts: per token q
 * (cols), d (cols / group + 1), l (cols), s (cols / 32 + 1), and q8 the
 * token's lm_q8. */
typedef struct product_bufs {
    int8_t *q;
    float *d, *l, *s;
    lm_q8 *q8;
} product_bufs;

/* out_k = w_k . x for the n products of nc tokens' inputs x (nc, cols of
 * the p[k].w), p[k].out (nc, rows), each token's x quantized first (into b)
 * when a matrix reads it so, as lm_quantize_q8 does; split over the state's
 * threads (lm_matmat: one token, its lm_matvec_rows). */
static void products_native(lm_state *s, const product_bufs *b, const lm_product *p, size_t n,
                            const float *x, size_t nc)
{
    const size_t cols = p[0].w->cols;
    size_t group = 0;
    for (size_t k = 0; k < n && !group; k++)
        group = lm_matrix_q8_group(p[k].w);
    for (size_t c = 0; group && c < nc; c++) {
        b->q8[c] = (lm_q8){b->q + c * cols, b->d + c * (cols / group + 1), group, 0, NULL};
        lm_quantize_q8(x + c * cols, cols, group, b->q + c * cols, b->d + c * (cols / group + 1));
    }
    lm_matmat(s->pool, p, n, x, group ? b->q8 : NULL, nc);
}

/* products_native, but under LM_PRODUCTS_LLAMA each token's x converted for
 * each weight type's input (lm_llama_quantize), the products of one input
 * kind together. */
static void products(lm_state *s, const product_bufs *b, const lm_product *p, size_t n,
                     const float *x, size_t nc)
{
    if (s->opt.products != LM_PRODUCTS_LLAMA) {
        products_native(s, b, p, n, x, nc);
        return;
    }
    const size_t cols = p[0].w->cols, nd = cols / 32 + 1; /* nd: a token's scales, at most */
    unsigned done = 0;
    for (size_t k = 0; k < n; k++) {
        if (done >> k & 1)
            continue;
        const lm_llama_in kind = lm_llama_input(p[k].w->type);
        lm_product sub[8] = {p[k]}; /* the callers' n is at most 3 */
        size_t m = 1;
        for (size_t j = k + 1; j < n && m < 8; j++)
            if (!(done >> j & 1) && lm_llama_input(p[j].w->type) == kind)
                sub[m++] = p[j], done |= 1u << j;
        if (kind == LM_IN_NATIVE) { /* as the exact products */
            products_native(s, b, sub, m, x, nc);
            continue;
        }
        for (size_t c = 0; c < nc; c++) {
            lm_llama_quantize(kind, x + c * cols, cols, b->l + c * cols, b->q + c * cols,
                              b->d + c * nd, b->s + c * nd);
            b->q8[c] = (lm_q8){b->q + c * cols, b->d + c * nd, 32, (int)s->opt.llama_cpu,
                               b->s + c * nd};
        }
        lm_matmat(s->pool, sub, m, b->l, b->q8, nc);
    }
}

/* products() of one token, into the token's buffers. */
static void product(lm_state *s, const lm_product *p, size_t n, const float *x)
{
    lm_q8 one;
    const product_bufs b = {s->xq, s->xd, s->xl, s->xs, &one};
    products(s, &b, p, n, x, 1);
}

/* products() of a block of nc tokens, into the block's buffers. */
static void product_block(lm_state *s, const lm_product *p, size_t n, const float *x, size_t nc)
{
    const product_bufs b = {s->bxq, s->bxd, s->bxl, s->bxs, s->bq8};
    products(s, &b, p, n, x, nc);
}

/* The index of the first value of a[0 .. n) that is not finite; n if none. */
static size_t first_nonfinite(const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i]))
            return i;
    return n;
}

/* The refusal of a step whose activations overflowed (finite weights, values
 * past float's range): KVE_ERANGE, the state broken. */
static kve_status overflowed(lm_state *s, const char *what, size_t l, size_t i, float v)
{
    s->broken = 1;
    return kve_set_error(KVE_ERANGE, "decoder: position %d: %s %zu of layer %zu is %s: the "
                         "model's activations overflow float32 (its weights are finite)",
                         s->pos, what, i, l, isnan(v) ? "NaN" : "infinite");
}

/* h[i] = silu(h[i]) * g[i] for i < F: run.c's, or (LM_PRODUCTS_LLAMA) ggml's. */
static void swiglu(const lm_state *s, float *h, const float *g, size_t F)
{
    if (s->opt.products == LM_PRODUCTS_LLAMA) {
        lm_swiglu_llama(h, g, F, s->opt.llama_cpu);
        return;
    }
    for (size_t i = 0; i < F; i++) {
        float v = h[i];
        h[i] = v * (1.0f / (1.0f + expf(-v))) * g[i];
    }
}

/* 1 / ||x|| (D), the squares summed in double: KVzip+'s attention input. */
static float inv_norm(const float *x, size_t D)
{
    double ss = 0.0;
    for (size_t i = 0; i < D; i++)
        ss += (double)x[i] * (double)x[i];
    return 1.0f / (float)sqrt(ss);
}

/* The refusal of logits (V) at position s->pos that are not all finite. */
static kve_status check_logits(lm_state *s, const float *logits)
{
    const size_t V = (size_t)s->model->config.vocab_size, bad = first_nonfinite(logits, V);
    if (bad == V)
        return KVE_OK;
    s->broken = 1;
    return kve_set_error(KVE_ERANGE, "decoder: position %d: logit %zu is %s: the model's "
                         "activations overflow float32 (its weights are finite)", s->pos, bad,
                         isnan(logits[bad]) ? "NaN" : "infinite");
}

/* The token-by-token part of layer l at position s->pos, its q, k and v in
 * s->q, s->k and s->v (rope: the position's, original positions): their
 * finiteness checked, attention (the weighted values in s->xb), the
 * callbacks, a prefill's records, and the policies' step and eviction.
 * KVE_ERANGE (and a policy's refusal) leave the state broken. */
static kve_status attention_step(lm_state *s, size_t l, const float *rope)
{
    const lm_config *c = &s->model->config;
    size_t S = (size_t)c->head_size, G = (size_t)c->n_kv_heads;
    {
        const size_t nq = (size_t)c->n_heads * S, nk = G * S;
        size_t i = first_nonfinite(s->q, nq), j = first_nonfinite(s->k, nk);
        size_t v = first_nonfinite(s->v, nk);
        if (i < nq)
            return overflowed(s, "query element", l, i, s->q[i]);
        if (j < nk)
            return overflowed(s, "key element", l, j, s->k[j]);
        if (v < nk)
            return overflowed(s, "value element", l, v, s->v[v]);
    }
    attend(s, l, rope);
    const int rows = rows_read(s); /* without, only att[0] can show the NaN */
    for (size_t h = 0; h < (size_t)c->n_heads; h++) { /* finite q and k, overflowing q.k */
        const size_t n = rows ? s->counts[h / ((size_t)c->n_heads / G)] : 1;
        size_t i = first_nonfinite(s->att + h * s->ld, n);
        if (i < n) {
            s->broken = 1;
            return kve_set_error(KVE_ERANGE, "decoder: position %d: attention weight %zu of "
                                 "query head %zu of layer %zu is NaN (q.k overflowed): the "
                                 "model's activations overflow float32 (its weights are "
                                 "finite)", s->pos, i, h, l);
        }
    }
    if (s->opt.on_attention)
        s->opt.on_attention(s->opt.user, (int32_t)l, s->pos, s->att, s->ld, s->counts);
    if (s->opt.on_qk)
        s->opt.on_qk(s->opt.user, (int32_t)l, s->pos, s->q, s->k);
    if (s->prefilling && s->pf_method == 1) {
        record_rows(s, l);
        if (s->pf_values) { /* a vnorm policy's prompt values, W_o v */
            const size_t vd = s->value_dim, n = s->pf_n;
            wov_of(s, l);
            for (size_t g = 0; g < G; g++)
                memcpy(s->pf_values + ((l * G + g) * n + (size_t)s->pos) * vd,
                       s->wov + g * vd, vd * sizeof(float));
        }
    }
    if (s->bank && !(s->prefilling && s->pf_method)) {
        struct timespec t0 = {0}, t1 = {0};
        const int timing = s->opt.timing;
        if (timing)
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        kve_status st = manage(s, l, !s->prefilling);
        if (st != KVE_OK) {
            s->broken = 1;
            return st;
        }
        if (timing) {
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
            s->bookkeeping_s +=
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        }
    }
    return KVE_OK;
}

kve_status lm_forward(lm_state *s, int32_t token)
{
    if (!s)
        return kve_set_error(KVE_EINVAL, "decoder: NULL state");
    const lm_config *c = &s->model->config;
    const lm_weights *w = &s->model->weights;
    if (s->broken)
        return kve_set_error(KVE_EINVAL, "decoder: an earlier step failed; reset the decoder first");
    if (token < 0 || token >= c->vocab_size)
        return kve_set_error(KVE_EINVAL, "token %d is outside the vocabulary [0, %d)", token,
                       c->vocab_size);
    if (s->pos == INT32_MAX)
        return kve_set_error(KVE_EINVAL, "decoder: position %d is the last one", s->pos);
    kve_status st = reserve(s, 1);
    if (st != KVE_OK)
        return st;
    size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim, S = (size_t)c->head_size;
    size_t L = (size_t)c->n_layers;
    void (*const norm)(float *, const float *, const float *, size_t, float) =
        s->opt.products == LM_PRODUCTS_LLAMA ? rmsnorm_llama : rmsnorm;
    if (s->opt.positions == LM_POS_ORIGINAL)
        (s->opt.products == LM_PRODUCTS_LLAMA ? rope_row_llama : rope_row)(s->rope, s->pos, S,
                                                                           s->model);

    float *x = s->x;
    lm_matrix_row(&w->token_embedding, (size_t)token, x);
    const float eps = c->norm_eps;
    for (size_t l = 0; l < L; l++) {
        const lm_layer *ly = &w->layer[l];
        norm(s->xb, x, ly->rms_att, D, eps);
        if (s->kz_active && s->kz_wov) /* KVzip+: 1 / ||h|| of the attention input */
            s->kz_hinv = inv_norm(s->xb, D);
        const lm_product qkv[3] = {{&ly->wq, s->q}, {&ly->wk, s->k}, {&ly->wv, s->v}};
        product(s, qkv, 3, s->xb);
        if ((st = attention_step(s, l, s->rope)) != KVE_OK)
            return st;
        const lm_product o[1] = {{&ly->wo, s->xb2}};
        product(s, o, 1, s->xb);
        for (size_t i = 0; i < D; i++)
            x[i] += s->xb2[i];

        norm(s->xb, x, ly->rms_ffn, D, eps);
        const lm_product up[2] = {{&ly->w1, s->hb}, {&ly->w3, s->hb2}};
        product(s, up, 2, s->xb);
        swiglu(s, s->hb, s->hb2, F);
        const lm_product down[1] = {{&ly->w2, s->xb}};
        product(s, down, 1, s->hb);
        for (size_t i = 0; i < D; i++)
            x[i] += s->xb[i];
    }
    norm(x, x, w->rms_final, D, eps);
    const lm_product cls[1] = {{&w->wcls, s->logits}};
    product(s, cls, 1, x);
    if ((st = check_logits(s, s->logits)) != KVE_OK)
        return st;
    s->pos++;
    return KVE_OK;
}

/* ---- prompts in blocks (lm_forward_batch) ---- */

/* The block buffers for B tokens, all or nothing (the old ones kept on
 * failure). */
static kve_status block_alloc(lm_state *s, size_t B)
{
    if (s->bcap >= B)
        return KVE_OK;
    const lm_config *c = &s->model->config;
    size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim, S = (size_t)c->head_size;
    size_t HS = (size_t)c->n_heads * S, GS = (size_t)c->n_kv_heads * S, V = (size_t)c->vocab_size;
    size_t widest, group = input_group(s->model, s->opt.products, &widest);
    const int llama = s->opt.products == LM_PRODUCTS_LLAMA;
    const size_t per = 3 * D + 2 * F + HS + 2 * GS + S + V + 1 + widest + (widest / 32 + 1);
    if (B > SIZE_MAX / sizeof(float) / per)
        return kve_set_error(KVE_ENOMEM, "decoder: out of memory for a block of %zu tokens", B);
    lm_state t = *s; /* the new buffers, in a copy */
    float **f[] = {&t.bx, &t.bxb, &t.bxb2, &t.bhb, &t.bhb2, &t.bq, &t.bk, &t.bv, &t.brope,
                   &t.blogits, &t.bhinv, &t.bxl, &t.bxs, &t.bxd};
    const size_t n[] = {D, D, D, F, F, HS, GS, GS, S, V, 1, llama ? widest : 0,
                        llama ? widest / 32 + 1 : 0, group ? widest / group + 1 : 0};
    int ok = 1;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        *f[i] = n[i] ? lm_malloc(&s->alloc, B * n[i] * sizeof(float)) : NULL;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        ok = ok && (!n[i] || *f[i]);
    t.bxq = group ? lm_malloc(&s->alloc, B * widest) : NULL;
    t.bq8 = lm_malloc(&s->alloc, B * sizeof *t.bq8);
    ok = ok && (!group || t.bxq) && t.bq8;
    if (!ok) {
        free_block(&t);
        return kve_set_error(KVE_ENOMEM, "decoder: out of memory for a block of %zu tokens", B);
    }
    free_block(s);
    s->bx = t.bx, s->bxb = t.bxb, s->bxb2 = t.bxb2, s->bhb = t.bhb, s->bhb2 = t.bhb2;
    s->bq = t.bq, s->bk = t.bk, s->bv = t.bv, s->brope = t.brope, s->blogits = t.blogits;
    s->bhinv = t.bhinv, s->bxl = t.bxl, s->bxs = t.bxs, s->bxd = t.bxd, s->bxq = t.bxq;
    s->bq8 = t.bq8;
    s->bcap = B;
    return KVE_OK;
}

/* How many of the next `left` tokens go in one block: opt.batch (LM_BATCH),
 * or 1 where token-by-token order is what the results depend on: the
 * callbacks (token order), a same_positions bank that is stepped (its steps
 * at t + 1 wait for every layer's at t and the one eviction), a shared
 * layer that evicts (its arena is laid out between steps). */
static size_t block_tokens(const lm_state *s, size_t left)
{
    size_t b = s->opt.batch ? s->opt.batch : LM_BATCH;
    b = b < left ? b : left;
    if (b <= 1 || s->opt.on_attention || s->opt.on_qk)
        return 1;
    if ((stepped(s) && s->opt.same_positions) || (evicting(s) && s->arena))
        return 1;
    return b;
}

/* Decodes the B tokens toks at positions s->pos .. s->pos + B - 1 layer by
 * layer (docs/decoder.md, "Prompts in blocks"); their logits in s->blogits. */
static kve_status forward_block(lm_state *s, const int32_t *toks, size_t B)
{
    const lm_config *c = &s->model->config;
    const lm_weights *w = &s->model->weights;
    size_t D = (size_t)c->dim, F = (size_t)c->hidden_dim, S = (size_t)c->head_size;
    size_t G = (size_t)c->n_kv_heads, L = (size_t)c->n_layers, V = (size_t)c->vocab_size;
    size_t HS = (size_t)c->n_heads * S, GS = G * S;
    kve_status st = block_alloc(s, B);
    if (st == KVE_OK)
        st = reserve(s, B);
    if (st != KVE_OK)
        return st;
    const int llama = s->opt.products == LM_PRODUCTS_LLAMA;
    void (*const norm)(float *, const float *, const float *, size_t, float) =
        llama ? rmsnorm_llama : rmsnorm;
    const int32_t pos0 = s->pos;
    for (size_t t = 0; t < B; t++) {
        if (s->opt.positions == LM_POS_ORIGINAL)
            (llama ? rope_row_llama : rope_row)(s->brope + t * S, pos0 + (int32_t)t, S, s->model);
        lm_matrix_row(&w->token_embedding, (size_t)toks[t], s->bx + t * D);
    }
    const float eps = c->norm_eps;
    for (size_t l = 0; l < L; l++) {
        const lm_layer *ly = &w->layer[l];
        for (size_t t = 0; t < B; t++) {
            norm(s->bxb + t * D, s->bx + t * D, ly->rms_att, D, eps);
            if (s->kz_active && s->kz_wov)
                s->bhinv[t] = inv_norm(s->bxb + t * D, D);
        }
        const lm_product qkv[3] = {{&ly->wq, s->bq}, {&ly->wk, s->bk}, {&ly->wv, s->bv}};
        product_block(s, qkv, 3, s->bxb, B);
        for (size_t t = 0; t < B; t++) { /* token by token, as lm_forward */
            s->pos = pos0 + (int32_t)t;
            memcpy(s->q, s->bq + t * HS, HS * sizeof(float));
            memcpy(s->k, s->bk + t * GS, GS * sizeof(float));
            memcpy(s->v, s->bv + t * GS, GS * sizeof(float));
            if (s->kz_active && s->kz_wov)
                s->kz_hinv = s->bhinv[t];
            int full = 0; /* reserve's room, unless a policy held more than its budget */
            for (size_t g = 0; g < G; g++)
                full |= s->cache[l * G + g].n >= s->cache[l * G + g].cap;
            if (full && (st = reserve(s, 1)) != KVE_OK) {
                s->broken = 1;
                return st;
            }
            st = attention_step(s, l, s->opt.positions == LM_POS_ORIGINAL ? s->brope + t * S : NULL);
            if (st != KVE_OK)
                return st;
            memcpy(s->bxb + t * D, s->xb, D * sizeof(float));
        }
        const lm_product o[1] = {{&ly->wo, s->bxb2}};
        product_block(s, o, 1, s->bxb, B);
        for (size_t i = 0; i < B * D; i++)
            s->bx[i] += s->bxb2[i];
        for (size_t t = 0; t < B; t++)
            norm(s->bxb + t * D, s->bx + t * D, ly->rms_ffn, D, eps);
        const lm_product up[2] = {{&ly->w1, s->bhb}, {&ly->w3, s->bhb2}};
        product_block(s, up, 2, s->bxb, B);
        for (size_t t = 0; t < B; t++)
            swiglu(s, s->bhb + t * F, s->bhb2 + t * F, F);
        const lm_product down[1] = {{&ly->w2, s->bxb}};
        product_block(s, down, 1, s->bhb, B);
        for (size_t i = 0; i < B * D; i++)
            s->bx[i] += s->bxb[i];
    }
    for (size_t t = 0; t < B; t++)
        norm(s->bx + t * D, s->bx + t * D, w->rms_final, D, eps);
    const lm_product cls[1] = {{&w->wcls, s->blogits}};
    product_block(s, cls, 1, s->bx, B);
    for (size_t t = 0; t < B; t++) {
        s->pos = pos0 + (int32_t)t;
        if ((st = check_logits(s, s->blogits + t * V)) != KVE_OK)
            return st;
    }
    memcpy(s->logits, s->blogits + (B - 1) * V, V * sizeof(float));
    s->pos = pos0 + (int32_t)B;
    return KVE_OK;
}

kve_status lm_forward_batch(lm_state *s, const int32_t *tokens, size_t n, lm_logits_fn fn,
                            void *user)
{
    if (!s || (!tokens && n))
        return kve_set_error(KVE_EINVAL, "decoder: NULL %s", s ? "tokens" : "state");
    const lm_config *c = &s->model->config;
    if (s->broken)
        return kve_set_error(KVE_EINVAL, "decoder: an earlier step failed; reset the decoder first");
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return kve_set_error(KVE_EINVAL, "token %d at %zu is outside the vocabulary [0, %d)",
                                 tokens[i], i, c->vocab_size);
    if (n > (size_t)(INT32_MAX - s->pos))
        return kve_set_error(KVE_EINVAL, "decoder: %zu tokens from position %d pass the last "
                             "position %d", n, s->pos, INT32_MAX - 1);
    const size_t V = (size_t)c->vocab_size;
    for (size_t i = 0, b; i < n; i += b) {
        b = block_tokens(s, n - i);
        kve_status st = b == 1 ? lm_forward(s, tokens[i]) : forward_block(s, tokens + i, b);
        if (st != KVE_OK)
            return st;
        for (size_t t = 0; fn && t < b; t++)
            fn(user, i + t, b == 1 ? s->logits : s->blogits + t * V);
    }
    return KVE_OK;
}
