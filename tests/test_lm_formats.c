/* SPDX-License-Identifier: MIT */
/*
 * test_lm_formats.c - GGUF checkpoints and llama2.c's version 2 in the
 * decoder (lm/gguf.c, lm/model.c), with their vocabularies.
 *
 * Files are written by the converter's library (tools/gguf_write.c, whose
 * encoders share nothing with lm/) from tiny random models
 * (tests/lm_fixture.h), and version 2 by the fixture's own writer (runq.c's
 * layout). Checked:
 * - every GGUF type: the hyperparameters, every tensor by name, and the
 *   decoder's logits bit for bit equal to the float32 decoder run on the
 *   dequantized weights (a legacy file of them); for Q8_0, Q4_K and version 2,
 *   whose products quantize the input, within the bound stated at
 *   Q8_TOL; F32 equal to the legacy file of the same weights; the stored
 *   values near the written ones (each type's rounding);
 * - the same bits for 1, 2 and 3 threads;
 * - refusals that name the key or tensor: big-endian and unknown versions,
 *   truncation everywhere, metadata of every type and nested arrays read
 *   (and malformed ones refused), alignment, offsets, overlaps, missing,
 *   duplicate, misshapen and unexpected tensors, unsupported types and
 *   architectures, non-finite values and scales;
 * - the vocabulary in the metadata: pieces, scores and encodings equal to
 *   the tokenizer.bin it was written from; other tokenizer models refused
 *   by name; byte fallback to UNK without byte pieces;
 * - version 2: header fields, truncation, non-finite scales.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "gw_fixture.h"
#include "lm.h"
#include "lm_check.h"
#include "test_allocator.h"

#include <math.h>

/* 2 layers, 4 query heads over 2 KV heads of 64 (rows of 256: the K types'
 * blocks), hidden 256, vocabulary 300, context 24; 8 steps decoded. */
enum { D_ = 256, F_ = 256, L_ = 2, H_ = 4, G_ = 2, V_ = 300, T_ = 24, STEPS = 8 };

/* Q8_0, Q4_K and version 2 quantize each product's input to 8 bits: an element
 * moves by at most half a step, d_x / 2 = max|x| / 254, so a dot product by
 * at most max|x| / 254 * sum |w| (test_lm_matvec holds each product to
 * that). Through two layers and the classifier these add up; the logits
 * are required within 2^-5 of the largest logit of the position (a logit
 * changed by a wrong weight moves by far more), and the worst is printed. */
#define Q8_TOL 0x1p-5

/* A failure inside a function that returns a value (CHECK_FAIL_AT returns). */
#define NOTE_FAIL(...)                                                                             \
    do {                                                                                           \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                            \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        check_failures++;                                                                          \
    } while (0)

static int32_t token_at(size_t t, size_t vocab)
{
    return (int32_t)((t * 7 + 3) % vocab);
}

/* The GGUF image of m under spec s (malloc'ed). */
static unsigned char *gguf_image(fx_model *m, const gw_spec *spec, size_t *n)
{
    gw_spec copy = *spec, *s = &copy;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    char err[256] = "";
    int rc = gw_write_gguf(f, s, fx_source, m, err, sizeof err);
    fclose(f);
    if (rc != 0)
        NOTE_FAIL("gw_write_gguf: %s", err);
    *n = len;
    return (unsigned char *)buf;
}

/* Logits (STEPS, V) of a fresh decoder over m. */
static kve_status decode(const lm_model *m, const lm_options *opt, float *logits)
{
    lm_state *s = NULL;
    kve_status st = lm_state_new(m, opt, &s);
    size_t V = (size_t)m->config.vocab_size;
    for (size_t t = 0; st == KVE_OK && t < STEPS; t++) {
        st = lm_forward(s, token_at(t, V));
        if (st == KVE_OK)
            memcpy(logits + t * V, s->logits, V * sizeof(float));
    }
    lm_state_free(s);
    return st;
}

/* A legacy fx model holding m's weights as float32 (dequantized). */
static void twin_of(const lm_model *m, fx_model *t)
{
    const lm_config *c = &m->config;
    fx_model_init(t, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                  c->seq_len, c->shared_classifier, 1);
    const lm_weights *w = &m->weights;
    size_t D = (size_t)c->dim;
    for (size_t r = 0; r < w->token_embedding.rows; r++)
        lm_matrix_row(&w->token_embedding, r, t->emb + r * D);
    if (!c->shared_classifier)
        for (size_t r = 0; r < w->wcls.rows; r++)
            lm_matrix_row(&w->wcls, r, t->cls + r * D);
    memcpy(t->rms_final, w->rms_final, D * sizeof(float));
    for (size_t l = 0; l < (size_t)c->n_layers; l++) {
        const lm_layer *ly = &w->layer[l];
        memcpy(t->rms_att + l * D, ly->rms_att, D * sizeof(float));
        memcpy(t->rms_ffn + l * D, ly->rms_ffn, D * sizeof(float));
        struct {
            const lm_matrix *m;
            float *dst;
        } mx[] = {{&ly->wq, t->wq}, {&ly->wk, t->wk}, {&ly->wv, t->wv}, {&ly->wo, t->wo},
                  {&ly->w1, t->w1}, {&ly->w2, t->w2}, {&ly->w3, t->w3}};
        for (size_t i = 0; i < sizeof mx / sizeof mx[0]; i++) {
            size_t n = mx[i].m->rows * mx[i].m->cols;
            for (size_t r = 0; r < mx[i].m->rows; r++)
                lm_matrix_row(mx[i].m, r, mx[i].dst + l * n + r * mx[i].m->cols);
        }
    }
}

/* Logits of m against its float32 twin: bit for bit, or (q8) within Q8_TOL
 * of the position's largest logit; returns the worst relative difference.
 * Decoded under both options (no policy, h2o), or only opts[only] when
 * `only` is 0 or 1 (test_types' light grid). */
static void against_twin(const lm_model *m, int q8, const char *what, int only,
                         double *worst_out)
{
    fx_model tw;
    twin_of(m, &tw);
    size_t n;
    unsigned char *img = fx_image(&tw, 0, &n);
    lm_model *f32 = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &f32));
    size_t V = (size_t)m->config.vocab_size;
    *worst_out = 0;
    float *a = malloc(STEPS * V * sizeof *a), *b = malloc(STEPS * V * sizeof *b);
    double worst = 0;
    lm_options opts[2] = {{0}, {.policy = "h2o:budget=4,recent_window=1"}};
    for (int o = 0; o < 2; o++) {
        if (only >= 0 && o != only)
            continue;
        ASSERT_OK(decode(m, &opts[o], a));
        ASSERT_OK(decode(f32, &opts[o], b));
        for (size_t t = 0; t < STEPS; t++) {
            double big = 0, diff = 0;
            for (size_t i = 0; i < V; i++) {
                big = fabs(b[t * V + i]) > big ? fabs(b[t * V + i]) : big;
                double d = fabs((double)a[t * V + i] - b[t * V + i]);
                diff = d > diff ? d : diff;
            }
            worst = diff / big > worst ? diff / big : worst;
        }
        if (!q8 && memcmp(a, b, STEPS * V * sizeof *a) != 0)
            CHECK_FAIL_AT("%s: logits differ from the float32 decoder on the dequantized weights "
                          "(worst %.3g of the largest logit)", what, worst);
        if (q8 && !(worst <= Q8_TOL))
            CHECK_FAIL_AT("%s: logits %.3g of the largest logit from the dequantized float32 "
                          "ones, beyond %.3g", what, worst, Q8_TOL);
    }
    free(a), free(b), free(img);
    lm_model_free(f32);
    fx_model_free(&tw);
    *worst_out = worst;
}

/* ---- every type ---- */

/* The bits of a type's levels: its values are at most half a step from the
 * written ones, the step 2 max / (2^q - 1) of its block (q bits; F16 and BF16
 * a relative step of 2^-10 and 2^-7); 0 for F32. */
static int level_bits(uint32_t type)
{
    switch (type) {
    case GW_F32: return 0;
    case GW_F16: return 11;
    case GW_BF16: return 8;
    case GW_Q2_K: return 2;
    case GW_Q3_K: return 3;
    case GW_Q5_0:
    case GW_Q5_1:
    case GW_Q5_K: return 5;
    case GW_Q6_K: return 6;
    case GW_Q8_0: return 8;
    default: return 4; /* Q4_0, Q4_1, Q4_K, IQ4_NL, IQ4_XS */
    }
}

/* A type's relative RMS error for values uniform over a block's range
 * (lm_fixture.h's): errors of at most half a step, uniform too, RMS step /
 * sqrt 12 = 1 / (2^q - 1) of the values' RMS (max / sqrt 3). F16, BF16: 2^-q
 * (rounding to nearest); F32: 0. */
static double uniform_error(uint32_t type)
{
    int q = level_bits(type);
    return type == GW_F32 ? 0 : type == GW_F16 || type == GW_BF16 ? ldexp(1, -q)
                                                                 : 1.0 / (ldexp(1, q) - 1);
}

/* The bound on a tensor's stored values: twice uniform_error (blocks whose
 * values are not uniform). */
static double type_bound(uint32_t type)
{
    return 2 * uniform_error(type);
}

/* Stored values near the written ones: relative RMS error of the whole
 * tensor within type_bound. */
static void check_values(const lm_matrix *w, const float *orig, uint32_t type, const char *name)
{
    double num = 0, den = 0;
    float *row = malloc(w->cols * sizeof *row);
    for (size_t r = 0; r < w->rows; r++) {
        lm_matrix_row(w, r, row);
        for (size_t c = 0; c < w->cols; c++) {
            double d = (double)row[c] - orig[r * w->cols + c];
            num += d * d;
            den += (double)orig[r * w->cols + c] * orig[r * w->cols + c];
        }
    }
    free(row);
    double rel = sqrt(num / den), bound = type_bound(type);
    if (!(rel <= bound))
        CHECK_FAIL_AT("%s in %s: relative RMS error %.3g beyond %.3g", name, lm_dtype_name(type),
                      rel, bound);
}

/* The logits of a quantized model against the float32 one's (the weights as
 * written): finite, and a relative RMS difference within sqrt(M (e_w^2 +
 * e_x^2)): M = 2 + 7 L quantized matrices, each product's relative error
 * e_w = uniform_error(type), plus e_x = uniform_error(Q8_0) where the
 * product quantizes its input (lm_matrix_q8_group), independent errors
 * adding in quadrature along the residual stream. Returns the figure; the
 * bound into *bound_out. */
static double check_logits_near(const lm_model *m, const lm_model *f32, uint32_t type,
                                const char *what, double *bound_out)
{
    size_t V = (size_t)m->config.vocab_size;
    float *a = malloc(STEPS * V * sizeof *a), *b = malloc(STEPS * V * sizeof *b);
    if (decode(m, NULL, a) != KVE_OK || decode(f32, NULL, b) != KVE_OK) {
        NOTE_FAIL("%s: decode: %s", what, kve_last_error());
        free(a), free(b);
        *bound_out = 0;
        return 0;
    }
    double num = 0, den = 0;
    int finite = 1;
    for (size_t i = 0; i < STEPS * V; i++) {
        finite &= isfinite(a[i]) != 0;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    double rel = sqrt(num / den);
    double ew = uniform_error(type);
    double ex = lm_matrix_q8_group(&m->weights.layer[0].wq) ? uniform_error(GW_Q8_0) : 0;
    double bound = sqrt((2.0 + 7.0 * m->config.n_layers) * (ew * ew + ex * ex));
    *bound_out = bound;
    if (!finite || !(rel <= bound))
        NOTE_FAIL("%s: logits %s, relative RMS %.3g from the float32 model's, bound %.3g", what,
                  finite ? "finite" : "not finite", rel, bound);
    free(a), free(b);
    return rel;
}

static size_t find(const unsigned char *img, size_t n, const char *s);

/* Whether gw_write_gguf searches for type's scales (Q4_1, Q5_1, the K and
 * IQ4 types: some hundred times ggml's plain references' cost under
 * valgrind) rather than computing them once (F32, F16, BF16, Q8_0, Q4_0,
 * Q5_0). */
static int searched(uint32_t type)
{
    return type == GW_Q4_1 || type == GW_Q5_1 || type == GW_Q2_K || type == GW_Q3_K ||
           type == GW_Q4_K || type == GW_Q5_K || type == GW_Q6_K || type == GW_IQ4_NL ||
           type == GW_IQ4_XS;
}

static void test_types(void)
{
    static const uint32_t types[] = {GW_F32,  GW_F16,  GW_BF16,   GW_Q8_0, GW_Q4_0,
                                     GW_Q4_1, GW_Q5_0, GW_Q5_1,   GW_Q2_K, GW_Q3_K,
                                     GW_Q4_K, GW_Q5_K, GW_Q6_K,   GW_IQ4_NL, GW_IQ4_XS};
    /* general.file_type of each, llama.h's LLAMA_FTYPE_*: ALL_F32, MOSTLY_F16,
     * BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_M, Q4_K_M, Q5_K_M, Q6_K,
     * IQ4_NL, IQ4_XS */
    static const uint32_t ftypes[] = {0, 1, 32, 7, 2, 3, 8, 9, 10, 12, 15, 17, 18, 25, 30};
    const size_t nt = sizeof types / sizeof types[0];
    /* The light grid (check_light): every type once, untied for the even k
     * and tied for the odd; the twin under one of its two options, k / 2's
     * parity choosing; the plain types' files of L_ layers and V_ tokens,
     * the searched ones' of 1 layer and 60 tokens (their writing is what
     * costs; the 8 steps' tokens, 3 .. 52, are the same); the file of
     * mixed types once (tied, 1 layer, 60 tokens). Passes: (untied, L_ layers),
     * (tied, L_), then light only (untied, 1), (tied, 1). Natively the full
     * grid: every type tied and untied, L_ layers, V_ tokens, both options. */
    const int light = check_light();
    if (light)
        printf("  light grid (KVE_TEST_LIGHT): %zu of %zu type and classifier combinations, "
               "the twin under one option each, searched types in 1 layer of 60 tokens, the "
               "mixed file once\n", nt, 2 * nt);
    for (int pass = 0; pass < (light ? 4 : 2); pass++) {
        const int shared = pass % 2, layers = pass < 2 ? L_ : 1, vocab = pass < 2 ? V_ : 60;
        fx_model fx;
        fx_model_init(&fx, D_, F_, layers, H_, G_, vocab, T_, shared,
                      check_seed + (uint64_t)shared);
        size_t ln;
        unsigned char *limg = fx_image(&fx, 0, &ln);
        lm_model *legacy = NULL;
        ASSERT_OK(lm_model_from_memory(limg, ln, NULL, &legacy));
        const size_t last = (size_t)layers - 1; /* natively layer 1 */
        for (size_t k = 0; k < nt; k++) {
            if (light && ((int)(k % 2) != shared || (searched(types[k]) ? 1 : L_) != layers))
                continue;
            gw_spec s = spec_of(&fx, types[k]);
            size_t n;
            unsigned char *img = gguf_image(&fx, &s, &n);
            lm_model *m = NULL;
            ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
            if (!m) {
                free(img);
                continue;
            }
            const lm_config *c = &m->config;
            ASSERT_EQ((int)c->format, (int)LM_FORMAT_GGUF);
            ASSERT_EQ(c->version, 3);
            ASSERT_EQ(c->dim, D_);
            ASSERT_EQ(c->hidden_dim, F_);
            ASSERT_EQ(c->n_layers, layers);
            ASSERT_EQ(c->n_heads, H_);
            ASSERT_EQ(c->n_kv_heads, G_);
            ASSERT_EQ(c->vocab_size, vocab);
            ASSERT_EQ(c->seq_len, T_);
            ASSERT_EQ(c->shared_classifier, shared);
            ASSERT_TRUE(c->norm_eps == 1e-5f && c->rope_theta == 10000.0f);
            const lm_weights *w = &m->weights;
            ASSERT_EQ((int)w->layer[last].w2.type, (int)types[k]);
            ASSERT_TRUE(w->layer[last].w2.rows == D_ && w->layer[last].w2.cols == F_);
            char down[32];
            snprintf(down, sizeof down, "blk.%zu.ffn_down", last);
            check_values(&w->layer[last].w2, fx.w2 + last * D_ * F_, types[k], down);
            check_values(&w->token_embedding, fx.emb, types[k], "token_embd");
            check_values(&w->layer[0].wk, fx.wk, types[k], "blk.0.attn_k");
            ASSERT_TRUE(memcmp(w->layer[last].rms_ffn, fx.rms_ffn + last * D_,
                               D_ * sizeof(float)) == 0);
            ASSERT_TRUE(!shared || w->wcls.data == w->token_embedding.data);
            char what[64];
            snprintf(what, sizeof what, "%s %s%s", lm_dtype_name(types[k]),
                     shared ? "tied" : "untied", layers == L_ ? "" : ", 1 layer, V 60");
            double worst = 0;
            /* integer products (lm.h: Q8_0, Q4_K): the input quantized */
            const int q8 = lm_matrix_q8_group(&w->layer[last].w2) != 0;
            against_twin(m, q8, what, light ? (int)(k / 2 % 2) : -1, &worst);
            if (q8)
                printf("  %-14s worst logit difference %.3g of the largest (bound %.3g)\n", what,
                       worst, Q8_TOL);
            /* what a file's type says (llama.cpp's LLAMA_FTYPE_*) */
            uint32_t ft = 0;
            memcpy(&ft, img + find(img, n, "general.file_type") + 17 + 4, 4);
            ASSERT_EQ(ft, ftypes[k]);
            if (types[k] != GW_F32 && types[k] != GW_F16 && types[k] != GW_BF16) {
                double bound = 0, rel = check_logits_near(m, legacy, types[k], what, &bound);
                printf("  %-14s logits against the float32 model: relative RMS %.3g (bound "
                       "%.3g)\n", what, rel, bound);
            }
            if (types[k] == GW_F32 || types[k] == GW_F16 || types[k] == GW_BF16) {
                /* Against the legacy file of the written weights: F32 the same bits; F16
                 * and BF16 within their rounding: a weight moves by at most 2^-11 (2^-8)
                 * of itself, and the logits by errors of that order; required within 8
                 * times it (of the largest logit), a margin for two layers' accumulation
                 * (measured: printed). */
                const size_t V = (size_t)vocab;
                float *a = malloc(STEPS * V * sizeof *a), *b = malloc(STEPS * V * sizeof *b);
                ASSERT_OK(decode(m, NULL, a));
                ASSERT_OK(decode(legacy, NULL, b));
                double rel = 0;
                for (size_t t = 0; t < STEPS; t++) {
                    double big = 0, diff = 0;
                    for (size_t i = 0; i < V; i++) {
                        big = fabs(b[t * V + i]) > big ? fabs(b[t * V + i]) : big;
                        double d = fabs((double)a[t * V + i] - b[t * V + i]);
                        diff = d > diff ? d : diff;
                    }
                    rel = diff / big > rel ? diff / big : rel;
                }
                double bound = types[k] == GW_F16 ? 0x1p-8 : 0x1p-5;
                if (types[k] == GW_F32)
                    ASSERT_TRUE(memcmp(a, b, STEPS * V * sizeof *a) == 0);
                else if (!(rel <= bound))
                    CHECK_FAIL_AT("%s: logits %.3g of the largest from the float32 model's, "
                                  "beyond %.3g", what, rel, bound);
                else
                    printf("  %-14s against the float32 model: %.3g of the largest logit "
                           "(bound %.3g)\n", what, rel, bound);
                free(a), free(b);
            }
            lm_model_free(m);
            free(img);
        }
        /* Norms stored in 16 bits are widened; the embedding in its own type. */
        if (light && pass != 3) {
            lm_model_free(legacy);
            free(limg);
            fx_model_free(&fx);
            continue;
        }
        gw_spec s = spec_of(&fx, GW_Q4_K);
        s.norm_type = GW_BF16;
        s.emb_type = GW_Q8_0;
        size_t n;
        unsigned char *img = gguf_image(&fx, &s, &n);
        lm_model *m = NULL;
        ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
        if (m) {
            ASSERT_TRUE(m->norms != NULL && m->weights.token_embedding.type == LM_Q8_0);
            uint32_t u;
            memcpy(&u, &fx.rms_att[3], 4);
            uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            ASSERT_TRUE(m->weights.layer[0].rms_att[3] == lm_bf16_to_f32(rounded));
            double worst = 0;
            against_twin(m, 1, "Q4_K, Q8_0 embedding, BF16 norms", -1, &worst);
            lm_model_free(m);
        }
        free(img);
        lm_model_free(legacy);
        free(limg);
        fx_model_free(&fx);
    }
}

/* The quantized types, for the tests below. */
static const uint32_t quantized[] = {GW_Q8_0, GW_Q4_0, GW_Q4_1,  GW_Q5_0, GW_Q5_1,
                                     GW_Q2_K, GW_Q3_K, GW_Q4_K,  GW_Q5_K, GW_Q6_K,
                                     GW_IQ4_NL, GW_IQ4_XS};

/* Each encoder on edge rows of 256, read back by the decoder: zeros stay
 * zeros; a constant, a spike among zeros, a ramp and values of mixed
 * magnitudes come back within half a step of their range (max |x| / (2^q -
 * 1), IQ4's widest gap: 23 / 254 of max |x|, all within 2 max |x| /
 * (2^q - 1)); a value whose scale leaves float16's range refuses the row. */
static void test_encoders(void)
{
    enum { N = 256 };
    float x[N], y[N];
    unsigned char buf[N * 4];
    for (size_t k = 0; k < sizeof quantized / sizeof quantized[0]; k++) {
        const uint32_t t = quantized[k];
        lm_matrix w = {.data = buf, .type = (lm_dtype)t, .rows = 1, .cols = N,
                       .row_bytes = gw_row_bytes(t, N)};
        ASSERT_TRUE(w.row_bytes > 0 && w.row_bytes <= sizeof buf);
        for (int shape = 0; shape < 5; shape++) {
            double amax = 0;
            for (int i = 0; i < N; i++) {
                x[i] = shape == 0   ? 0.0f
                       : shape == 1 ? 0.7f
                       : shape == 2 ? (i == 37 ? -2.5f : 0.0f)
                       : shape == 3 ? (float)(i - 100) / 64.0f
                                    : (float)((i * 7919) % 23 - 11) * (i % 3 ? 1e-3f : 1.0f);
                amax = fabs(x[i]) > amax ? fabs(x[i]) : amax;
            }
            ASSERT_EQ(gw_quantize_row(t, x, N, buf), 0);
            lm_matrix_row(&w, 0, y);
            double worst = 0;
            for (int i = 0; i < N; i++)
                worst = fabs((double)y[i] - x[i]) > worst ? fabs((double)y[i] - x[i]) : worst;
            double bound = 2 * amax * uniform_error(t);
            if (!(worst <= bound))
                CHECK_FAIL_AT("%s, row shape %d: an error of %.3g, beyond %.3g", lm_dtype_name(t),
                              shape, worst, bound);
        }
        x[5] = 1e9f; /* d = 1e9 / 127 or less, beyond 65504 */
        ASSERT_EQ(gw_quantize_row(t, x, N, buf), -1);
    }
}

/* Rows that are not whole blocks of the asked type fall back as llama.cpp's
 * quantizer does (tensor_type_fallback): the 256-value types to their
 * 32-value neighbours on rows of 128 and 384, every quantized type to F16 on
 * rows of 48 and 80; refused without the fallback. */
static void test_fallback(void)
{
    static const uint32_t to32[][2] = {
        {GW_Q2_K, GW_Q4_0}, {GW_Q3_K, GW_Q4_0}, {GW_Q4_K, GW_Q5_0}, {GW_Q5_K, GW_Q5_1},
        {GW_Q6_K, GW_Q8_0}, {GW_IQ4_XS, GW_IQ4_NL}, {GW_Q4_1, GW_Q4_1}, {GW_Q8_0, GW_Q8_0}};
    const int light = check_light();
    if (light)
        printf("  light grid (KVE_TEST_LIGHT): the types that fit not written again without the "
               "fallback\n");
    for (int narrow = 0; narrow < 2; narrow++) {
        fx_model fx;
        if (narrow)
            fx_model_init(&fx, 48, 80, 1, 2, 1, 16, 8, 0, check_seed + 40);
        else
            fx_model_init(&fx, 128, 384, 1, 4, 2, 16, 8, 0, check_seed + 41);
        for (size_t k = 0; k < (narrow ? sizeof quantized / sizeof quantized[0] : 8); k++) {
            const uint32_t want = narrow ? quantized[k] : to32[k][0];
            const uint32_t got = narrow ? GW_F16 : to32[k][1];
            gw_spec s = spec_of(&fx, want);
            s.fallback = 1;
            size_t n;
            unsigned char *img = gguf_image(&fx, &s, &n);
            lm_model *m = NULL;
            ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
            if (m) {
                const lm_weights *w = &m->weights;
                ASSERT_EQ((int)w->layer[0].w2.type, (int)got);
                ASSERT_EQ((int)w->layer[0].wq.type, (int)got);
                ASSERT_EQ((int)w->token_embedding.type, (int)got);
                check_values(&w->layer[0].w2, fx.w2, got, "blk.0.ffn_down");
            }
            lm_model_free(m);
            free(img);
            /* without the fallback: refused, the tensor and the type named (a
             * type that fits is written again, nothing checked: not in the
             * light grid) */
            if (light && got == want)
                continue;
            s.fallback = 0;
            char *text = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&text, &len);
            char err[256] = "";
            int rc = gw_write_gguf(f, &s, fx_source, &fx, err, sizeof err);
            fclose(f);
            free(text);
            if (got != want) {
                ASSERT_EQ(rc, -1);
                ASSERT_CONTAINS(err, "are not whole blocks of type");
            }
        }
        fx_model_free(&fx);
    }
}

/* The GGUF fuzzer's seeds (fuzz/make-seeds.sh) hold a file the converter
 * wrote in every type, and each loads with its matrices in that type. */
static void test_fuzz_seeds(void)
{
    static const struct {
        const char *name;
        uint32_t type;
    } seeds[] = {{"f32-vocab", GW_F32}, {"f16-untied", GW_F16}, {"bf16", GW_BF16},
                 {"q8_0", GW_Q8_0},     {"q4_0-untied", GW_Q4_0}, {"q4_1", GW_Q4_1},
                 {"q5_0", GW_Q5_0},     {"q5_1", GW_Q5_1},     {"iq4_nl", GW_IQ4_NL},
                 {"q2_k", GW_Q2_K},     {"q3_k", GW_Q3_K},     {"q4_k", GW_Q4_K},
                 {"q5_k", GW_Q5_K},     {"q6_k-untied", GW_Q6_K}, {"iq4_xs", GW_IQ4_XS}};
    const char *src = getenv("KVE_SOURCE_DIR");
    if (!src)
        CHECK_FAIL_AT("set KVE_SOURCE_DIR to the source tree (ctest does)");
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/fuzz/corpus/fuzz_gguf/g-%s", src, seeds[i].name);
        lm_model *m = NULL;
        ASSERT_OK(lm_model_open(path, NULL, &m));
        if (m)
            ASSERT_EQ((int)m->weights.layer[0].w1.type, (int)seeds[i].type);
        lm_model_free(m);
    }
}

/* The same bits for every thread count: a vocabulary of 4100 makes the
 * classifier (4100 x 256) big enough to be split. */
static void test_threads(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, 1, H_, G_, 4100, T_, 0, check_seed + 9);
    gw_spec s = spec_of(&fx, GW_Q4_K);
    s.emb_type = GW_F16;
    size_t n;
    unsigned char *img = gguf_image(&fx, &s, &n);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    size_t V = 4100;
    float *want = malloc(STEPS * V * sizeof *want), *got = malloc(STEPS * V * sizeof *got);
    lm_options o = {.policy = "window:budget=3", .threads = 1};
    ASSERT_OK(decode(m, &o, want));
    for (size_t th = 2; th <= 3; th++) {
        o.threads = th;
        ASSERT_OK(decode(m, &o, got));
        if (memcmp(got, want, STEPS * V * sizeof *got) != 0)
            CHECK_FAIL_AT("%zu threads: logits differ from 1 thread's", th);
    }
    /* llama.cpp's arithmetic: the packed copy (lm_model_pack) gives the bits
     * of the rows in the file, on every thread count */
    lm_options ol = {.policy = "window:budget=3", .threads = 1, .products = LM_PRODUCTS_LLAMA};
    ASSERT_OK(decode(m, &ol, want));
    ASSERT_OK(lm_model_pack(m));
    ASSERT_OK(lm_model_pack(m)); /* idempotent */
    if (lm_isa_active() == LM_ISA_AVX512)
        ASSERT_TRUE(m->packed != NULL && m->weights.layer[0].w1.packed != NULL &&
                    m->weights.wcls.packed == NULL); /* 4100 rows: not in eights */
    /* the light grid (check_light): the packed copy on 2 threads (1 .. 3 are
     * taken above, unpacked) */
    const int light = check_light();
    if (light)
        printf("  light grid (KVE_TEST_LIGHT): the packed copy on 2 threads of 1 .. 3\n");
    for (size_t th = light ? 2 : 1; th <= (light ? 2u : 3u); th++) {
        ol.threads = th;
        ASSERT_OK(decode(m, &ol, got));
        if (memcmp(got, want, STEPS * V * sizeof *got) != 0)
            CHECK_FAIL_AT("packed, %zu threads: logits differ from the file's rows", th);
    }
    o.threads = LM_MAX_THREADS + 1;
    lm_state *st = NULL;
    ASSERT_STATUS(lm_state_new(m, &o, &st), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "threads");
    free(want), free(got), free(img);
    lm_model_free(m);
    fx_model_free(&fx);
}

/* ---- refusals ---- */

/* Expects KVE_EFORMAT with a one-line message containing `needle`. */
#define ASSERT_REFUSED(img, n, needle)                                                             \
    do {                                                                                           \
        lm_model *m_ = (lm_model *)&check_seed;                                                    \
        kve_status st_ = lm_model_from_memory((img), (n), NULL, &m_);                                    \
        if (st_ != KVE_EFORMAT || m_ != (lm_model *)&check_seed)                                   \
            CHECK_FAIL_AT("%s: %s, want KVE_EFORMAT (%s)", needle, kve_status_name(st_),           \
                          kve_last_error());                                                        \
        ASSERT_CONTAINS(kve_last_error(), needle);                                                  \
        ASSERT_TRUE(strchr(kve_last_error(), '\n') == NULL);                                        \
    } while (0)

/* The offset of the first occurrence of `s` (as bytes) in img. */
static size_t find(const unsigned char *img, size_t n, const char *s)
{
    size_t len = strlen(s);
    for (size_t i = 0; i + len <= n; i++)
        if (memcmp(img + i, s, len) == 0)
            return i;
    NOTE_FAIL("'%s' not found in the image", s);
    return 0;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* The tensor info after the name `name` (a string "...name"): the offset
 * of its n_dims field. */
static size_t info_of(const unsigned char *img, size_t n, const char *name)
{
    return find(img, n, name) + strlen(name);
}

/* Raw metadata pairs for gw_spec.extra_kv. */
typedef struct kvb {
    unsigned char p[4096];
    size_t n, count;
} kvb;

static void kb_bytes(kvb *b, const void *v, size_t n)
{
    memcpy(b->p + b->n, v, n);
    b->n += n;
}
static void kb_u32(kvb *b, uint32_t v)
{
    kb_bytes(b, &v, 4);
}
static void kb_u64(kvb *b, uint64_t v)
{
    kb_bytes(b, &v, 8);
}
static void kb_str(kvb *b, const char *s)
{
    kb_u64(b, strlen(s));
    kb_bytes(b, s, strlen(s));
}
static void kb_key(kvb *b, const char *k, uint32_t type)
{
    kb_str(b, k);
    kb_u32(b, type);
    b->count++;
}

/* A small valid model's image with extra metadata. */
static unsigned char *with_kv(fx_model *fx, const kvb *b, size_t *n)
{
    gw_spec s = spec_of(fx, GW_F32);
    if (b) {
        s.extra_kv = b->p;
        s.extra_kv_bytes = b->n;
        s.extra_kv_count = b->count;
    }
    return gguf_image(fx, &s, n);
}

static void test_metadata(void)
{
    fx_model fx;
    fx_model_init(&fx, 8, 16, 2, 2, 1, 8, 8, 1, 3);
    /* Every value type, arrays of each, nested arrays, an empty array: read. */
    kvb b = {.n = 0};
    static const uint32_t scalar[][2] = {{0, 1}, {1, 1}, {2, 2}, {3, 2}, {4, 4}, {5, 4},
                                         {6, 4}, {7, 1}, {10, 8}, {11, 8}, {12, 8}};
    char key[64];
    for (size_t i = 0; i < sizeof scalar / sizeof scalar[0]; i++) {
        unsigned char v[8] = {1, 0, 0, 0, 0, 0, 0, 0};
        snprintf(key, sizeof key, "test.scalar_%u", scalar[i][0]);
        kb_key(&b, key, scalar[i][0]);
        kb_bytes(&b, v, scalar[i][1]);
        snprintf(key, sizeof key, "test.array_%u", scalar[i][0]);
        kb_key(&b, key, 9);
        kb_u32(&b, scalar[i][0]);
        kb_u64(&b, 3);
        for (int j = 0; j < 3; j++)
            kb_bytes(&b, v, scalar[i][1]);
    }
    kb_key(&b, "test.string", 8), kb_str(&b, "a value");
    kb_key(&b, "test.strings", 9), kb_u32(&b, 8), kb_u64(&b, 2), kb_str(&b, "x"), kb_str(&b, "");
    kb_key(&b, "test.nested", 9), kb_u32(&b, 9), kb_u64(&b, 2); /* [[1, 2], ["y"]] */
    kb_u32(&b, 4), kb_u64(&b, 2), kb_u32(&b, 1), kb_u32(&b, 2);
    kb_u32(&b, 8), kb_u64(&b, 1), kb_str(&b, "y");
    kb_key(&b, "test.empty", 9), kb_u32(&b, 12), kb_u64(&b, 0);
    size_t n;
    unsigned char *img = with_kv(&fx, &b, &n);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    lm_model_free(m);
    free(img);

    /* Malformed metadata, each refused by name. */
    static const char *const bad[] = {"value type 13 is not a GGUF type", "bool value 2",
                                      "array element type 99", "nested deeper than 16"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvb k = {.n = 0};
        if (i == 0)
            kb_key(&k, "test.bad", 13), kb_u32(&k, 0);
        else if (i == 1)
            kb_key(&k, "test.bad", 7), kb_bytes(&k, "\2", 1);
        else if (i == 2)
            kb_key(&k, "test.bad", 9), kb_u32(&k, 99), kb_u64(&k, 0);
        else {
            kb_key(&k, "test.bad", 9);
            for (int d = 0; d < 17; d++)
                kb_u32(&k, 9), kb_u64(&k, 1);
            kb_u32(&k, 4), kb_u64(&k, 0);
        }
        img = with_kv(&fx, &k, &n);
        ASSERT_REFUSED(img, n, bad[i]);
        free(img);
    }
    /* Keys the llama architecture reads, wrong. */
    struct {
        const char *key;
        uint32_t type;
        uint32_t value;
        const char *needle;
        const char *str; /* type 8 */
    } keys[] = {
        {"llama.expert_count", 4, 8, "mixtures of experts", NULL},
        {"llama.rope.scale_linear", 6, 0xc0000000u /* -2.0f */, "scale_linear -2 must be positive",
         NULL},
        {"llama.rope.scaling.factor", 6, 0x7fc00000u /* NaN */, "scaling.factor nan must be positive",
         NULL},
        {"llama.rope.scaling.original_context_length", 4, 0, "original_context_length 0 is outside",
         NULL},
        {"llama.rope.scaling.yarn_log_multiplier", 6, 0x3dcccccdu /* 0.1f */,
         "yarn_log_multiplier is not supported", NULL},
        {"llama.vocab_size", 4, 9, "llama.vocab_size 9", NULL},
        {"llama.attention.key_length", 4, 2, "key_length 2", NULL},
        {"llama.rope.scaling.type", 8, 0, "scaling.type 'longrope' is not supported", "longrope"},
        {"llama.rope.scaling.type", 4, 1, "scaling.type is not a string", NULL},
        {"tokenizer.ggml.add_space_prefix", 7, 0, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        kvb k = {.n = 0};
        kb_key(&k, keys[i].key, keys[i].type);
        if (keys[i].type == 8)
            kb_str(&k, keys[i].str);
        else if (keys[i].type == 7)
            kb_bytes(&k, "\0", 1);
        else
            kb_u32(&k, keys[i].value);
        img = with_kv(&fx, &k, &n);
        if (keys[i].needle)
            ASSERT_REFUSED(img, n, keys[i].needle);
        free(img);
    }
    /* RoPE scaling read as llama.cpp reads it: the older scale_linear alone
     * is linear scaling (llama.cpp's default type); type none ignores any
     * factor; yarn's original context defaults to the context length. */
    struct {
        const char *type; /* NULL: no type key */
        const char *factor_key;
        lm_rope_scaling want;
        float factor, mscale;
        int32_t orig;
    } scal[] = {
        {NULL, "llama.rope.scale_linear", LM_ROPE_SCALING_LINEAR, 2.0f, 1.0f, 8},
        {"linear", "llama.rope.scaling.factor", LM_ROPE_SCALING_LINEAR, 2.0f, 1.0f, 8},
        {"none", "llama.rope.scaling.factor", LM_ROPE_SCALING_NONE, 1.0f, 1.0f, 8},
        {"yarn", "llama.rope.scaling.factor", LM_ROPE_SCALING_YARN, 2.0f,
         1.0f + 0.1f * logf(2.0f), 8},
    };
    for (size_t i = 0; i < sizeof scal / sizeof scal[0]; i++) {
        kvb k = {.n = 0};
        kb_key(&k, scal[i].factor_key, 6), kb_u32(&k, 0x40000000u /* 2.0f */);
        if (scal[i].type)
            kb_key(&k, "llama.rope.scaling.type", 8), kb_str(&k, scal[i].type);
        img = with_kv(&fx, &k, &n);
        lm_model *sm = NULL;
        ASSERT_OK(lm_model_from_memory(img, n, NULL, &sm));
        const lm_config *c = &sm->config;
        ASSERT_TRUE(c->rope_scaling == scal[i].want && c->rope_factor == scal[i].factor);
        ASSERT_TRUE(c->rope_mscale == scal[i].mscale && c->rope_orig_ctx == scal[i].orig);
        ASSERT_TRUE(sm->weights.rope_freqs == NULL);
        lm_model_free(sm);
        free(img);
    }
    fx_model_free(&fx);
}

/* rope_freqs.weight: factors of 1 change no bit of the logits (a division
 * by 1); factors of 2 give the bits of linear scaling by 2 (a division by 2
 * and a product with 0.5, both exact); a factor that is not positive and
 * finite, or the wrong length, is refused naming it. */
static void test_rope_freqs(void)
{
    fx_model fx;
    fx_model_init(&fx, 32, 48, 2, 2, 1, 40, 16, 1, check_seed + 21);
    const size_t S = 16, V = 40;
    float ones[8], twos[8], bad[8];
    for (size_t j = 0; j < S / 2; j++)
        ones[j] = 1.0f, twos[j] = 2.0f, bad[j] = 1.5f;
    lm_options opt = {0};
    float *want = malloc(STEPS * V * sizeof(float)), *got = malloc(STEPS * V * sizeof(float));
    struct {
        const float *freqs;
        int scaling;
        const float *twin_freqs; /* the file whose logits must be these bits */
        int twin_scaling;
    } cases[] = {{ones, 0, NULL, 0}, {twos, 0, NULL, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lm_model *a = NULL, *b = NULL;
        gw_spec sa = spec_of(&fx, GW_F32), sb = sa;
        sa.rope_freqs = cases[i].freqs, sa.rope_scaling = cases[i].scaling;
        sb.rope_freqs = cases[i].twin_freqs, sb.rope_scaling = cases[i].twin_scaling;
        sa.rope_factor = sb.rope_factor = 2.0f, sa.rope_attn_factor = sb.rope_attn_factor = 1.0f;
        size_t na, nb;
        unsigned char *ia = gguf_image(&fx, &sa, &na), *ib = gguf_image(&fx, &sb, &nb);
        ASSERT_OK(lm_model_from_memory(ia, na, NULL, &a));
        ASSERT_OK(lm_model_from_memory(ib, nb, NULL, &b));
        ASSERT_TRUE(a->weights.rope_freqs != NULL && a->weights.rope_freqs[3] == cases[i].freqs[3]);
        ASSERT_OK(decode(a, &opt, got));
        ASSERT_OK(decode(b, &opt, want));
        ASSERT_TRUE(memcmp(got, want, STEPS * V * sizeof(float)) == 0);
        lm_model_free(a);
        lm_model_free(b);
        free(ia);
        free(ib);
    }
    /* the factors of 2 move the logits (the comparison above is not vacuous) */
    {
        lm_model *a = NULL;
        gw_spec sa = spec_of(&fx, GW_F32);
        size_t na;
        unsigned char *ia = gguf_image(&fx, &sa, &na);
        ASSERT_OK(lm_model_from_memory(ia, na, NULL, &a));
        ASSERT_OK(decode(a, &opt, got));
        ASSERT_TRUE(memcmp(got, want, STEPS * V * sizeof(float)) != 0);
        lm_model_free(a);
        free(ia);
    }
    const float not_ok[] = {0.0f, -1.0f, INFINITY};
    const char *needles[] = {"rope_freqs.weight[5] is 0", "rope_freqs.weight[5] is -1",
                             "rope_freqs.weight"};
    for (size_t i = 0; i < 3; i++) {
        bad[5] = not_ok[i];
        gw_spec sa = spec_of(&fx, GW_F32);
        sa.rope_freqs = bad;
        size_t na;
        unsigned char *ia = gguf_image(&fx, &sa, &na);
        ASSERT_REFUSED(ia, na, needles[i]);
        free(ia);
    }
    free(want);
    free(got);
    fx_model_free(&fx);
}

static void test_refusals(void)
{
    fx_model fx;
    fx_model_init(&fx, 8, 16, 2, 2, 1, 8, 8, 0, 5);
    size_t n;
    unsigned char *img = with_kv(&fx, NULL, &n), *c = malloc(n);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    lm_model_free(m);
#define FRESH() memcpy(c, img, n)
    /* the header */
    FRESH(), put_u32(c + 4, 0x03000000u);
    ASSERT_REFUSED(c, n, "big-endian");
    FRESH(), put_u32(c + 4, 1);
    ASSERT_REFUSED(c, n, "version 1 is not supported");
    FRESH(), put_u32(c + 4, 4);
    ASSERT_REFUSED(c, n, "version 4 is not supported");
    FRESH(), put_u32(c + 4, 2); /* version 2: the same layout, read */
    ASSERT_OK(lm_model_from_memory(c, n, NULL, &m));
    ASSERT_EQ(m->config.version, 2);
    lm_model_free(m);
    FRESH(), put_u64(c + 8, UINT64_C(1) << 40);
    ASSERT_REFUSED(c, n, "do not fit");
    FRESH(), put_u64(c + 16, 1000000);
    ASSERT_REFUSED(c, n, "do not fit");
    /* keys */
    size_t k = find(img, n, "general.architecture") + 20 + 4 + 8;
    FRESH(), memcpy(c + k, "gpt2x", 5);
    ASSERT_REFUSED(c, n, "architecture 'gpt2x' is not supported");
    k = find(img, n, "llama.block_count");
    FRESH(), c[k + 16] = '_';
    ASSERT_REFUSED(c, n, "llama.block_count is missing");
    FRESH(), put_u32(c + k + 17, 8); /* a string where a count belongs */
    ASSERT_REFUSED(c, n, "llama.block_count");
    FRESH(), put_u32(c + k + 17 + 4, 0);
    ASSERT_REFUSED(c, n, "llama.block_count 0 is outside");
    FRESH(), put_u32(c + k + 17 + 4, 3);
    ASSERT_REFUSED(c, n, "tensors, fewer than");
    size_t hc = find(img, n, "llama.attention.head_count\x04") + 26 + 4;
    FRESH(), put_u32(c + hc, 3);
    ASSERT_REFUSED(c, n, "not a multiple of llama.attention.head_count 3");
    FRESH(), memcpy(c + find(img, n, "general.alignment"), "llama.block_count", 17);
    ASSERT_REFUSED(c, n, "metadata key llama.block_count appears twice");
    size_t al = find(img, n, "general.alignment") + 17 + 4;
    FRESH(), put_u32(c + al, 12);
    ASSERT_REFUSED(c, n, "general.alignment");
    FRESH(), put_u32(c + al, 64); /* the data section moves: offsets misaligned */
    ASSERT_REFUSED(c, n, "is not a multiple of the alignment 64");
    size_t eps = find(img, n, "layer_norm_rms_epsilon") + 22;
    FRESH(), put_u32(c + eps + 4, 0x7fc00000u);
    ASSERT_REFUSED(c, n, "layer_norm_rms_epsilon nan must be positive");
    /* tensors */
    size_t q = info_of(img, n, "blk.1.ffn_up.weight");
    FRESH(), c[q - 9] = 'q'; /* blk.1.ffn_uq.weight */
    ASSERT_REFUSED(c, n, "the tensor blk.1.ffn_up.weight is missing");
    FRESH(), c[q - 15] = '0'; /* blk.0.ffn_up twice */
    ASSERT_REFUSED(c, n, "tensor blk.0.ffn_up.weight appears twice");
    FRESH(), put_u32(c + q, 5);
    ASSERT_REFUSED(c, n, "blk.1.ffn_up.weight: 5 dimensions");
    FRESH(), put_u64(c + q + 4, 16), put_u64(c + q + 12, 8); /* the same bytes, transposed */
    ASSERT_REFUSED(c, n, "blk.1.ffn_up.weight: shape [16, 8, 1, 1], want [8, 16]");
    FRESH(), put_u32(c + q + 4 + 16, 16);
    ASSERT_REFUSED(c, n, "type 16 (IQ2_XXS) is not supported");
    FRESH(), put_u32(c + q + 4 + 16, 8); /* Q8_0: 8 values a row are not whole blocks */
    ASSERT_REFUSED(c, n, "not whole Q8_0 blocks of 32");
    uint64_t off;
    memcpy(&off, img + q + 4 + 16 + 4, 8);
    FRESH(), put_u64(c + q + 4 + 16 + 4, off + 4);
    ASSERT_REFUSED(c, n, "blk.1.ffn_up.weight: offset");
    FRESH(), put_u64(c + q + 4 + 16 + 4, off + (UINT64_C(1) << 40));
    ASSERT_REFUSED(c, n, "run past the end of the file");
    FRESH(), put_u64(c + q + 4 + 16 + 4, off - 32);
    ASSERT_REFUSED(c, n, "overlap");
    size_t norm = info_of(img, n, "blk.0.attn_norm.weight");
    FRESH(), put_u32(c + norm + 4 + 8, 8);
    ASSERT_REFUSED(c, n, "blk.0.attn_norm.weight: 8 values a row are not whole Q8_0 blocks");
    /* an unexpected tensor in place of the classifier: renamed */
    size_t out = info_of(img, n, "output.weight");
    FRESH(), c[out - 8] = 'p';
    ASSERT_REFUSED(c, n, "unexpected tensor outpup.weight");
    /* a non-finite value (where the loaded model says the embedding lies) */
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    size_t start = (size_t)((const unsigned char *)m->weights.token_embedding.data - img);
    lm_model_free(m);
    FRESH(), put_u32(c + start + 4 * 5, 0x7f800000u);
    ASSERT_REFUSED(c, n, "token_embd.weight: value 5 is not finite");
    /* truncated anywhere: refused, never read past the end */
    for (size_t cut = 0; cut < n; cut += (cut < 600 ? 1 : 97)) {
        unsigned char *t = malloc(cut ? cut : 1);
        memcpy(t, img, cut);
        lm_model *x = (lm_model *)&check_seed;
        kve_status st = lm_model_from_memory(t, cut, NULL, &x);
        if (st != KVE_EFORMAT || x != (lm_model *)&check_seed || !kve_last_error()[0])
            CHECK_FAIL_AT("cut at %zu of %zu: %s (%s)", cut, n, kve_status_name(st),
                          kve_last_error());
        free(t);
    }
#undef FRESH
    free(c);
    free(img);
    fx_model_free(&fx);
}

/* Quantized blocks: a non-finite scale is refused by block. */
static void test_scales(void)
{
    fx_model fx;
    fx_model_init(&fx, 32, 32, 1, 2, 1, 8, 8, 1, 6);
    gw_spec s = spec_of(&fx, GW_Q8_0);
    size_t n;
    unsigned char *img = gguf_image(&fx, &s, &n);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    size_t off = (size_t)((const unsigned char *)m->weights.layer[0].wv.data - img);
    lm_model_free(m);
    unsigned char save[2] = {img[off + 34 * 3], img[off + 34 * 3 + 1]};
    img[off + 34 * 3] = 0x00;
    img[off + 34 * 3 + 1] = 0x7c; /* block 3's scale: +inf */
    ASSERT_REFUSED(img, n, "blk.0.attn_v.weight: block 3 has a scale that is not finite");
    img[off + 34 * 3] = save[0];
    img[off + 34 * 3 + 1] = save[1];
    /* a norm of 32 values stored as one Q8_0 block (its bytes fit in its place) */
    put_u32(img + info_of(img, n, "blk.0.attn_norm.weight") + 4 + 8, 8);
    ASSERT_REFUSED(img, n, "blk.0.attn_norm.weight: a norm must be F32, F16 or BF16, not Q8_0");
    free(img);
    fx_model_free(&fx);
}

/* ---- the vocabulary ---- */

static void test_vocabulary(void)
{
    size_t tn;
    unsigned char *timg = fx_tokenizer_image(&tn);
    lm_tokenizer *bin = NULL;
    ASSERT_OK(lm_tokenizer_from_memory(timg, tn, NULL, &bin));
    fx_model fx;
    fx_model_init(&fx, 8, 16, 1, 2, 1, FX_PIECES, 8, 1, 7);
    gw_vocab v = {bin->n_pieces, (const char *const *)bin->piece, bin->len, bin->score};
    gw_spec s = spec_of(&fx, GW_F32);
    s.vocab_data = &v;
    size_t n;
    unsigned char *img = gguf_image(&fx, &s, &n);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    lm_tokenizer *t = NULL;
    ASSERT_OK(lm_tokenizer_from_model(m, NULL, &t));
    ASSERT_EQ(t->n_pieces, bin->n_pieces);
    ASSERT_TRUE(t->kind == LM_TOK_SPM && bin->kind == LM_TOK_RUNC);
    for (int32_t i = 0; i < t->n_pieces; i++) {
        /* the file's pieces: U+2581 for each space; they decode as run.c's */
        char raw[64];
        size_t o = 0;
        for (int32_t k = 0; k < bin->len[i] && o + 3 < sizeof raw; k++)
            if (bin->piece[i][k] == ' ')
                memcpy(raw + o, "\xe2\x96\x81", 3), o += 3;
            else
                raw[o++] = bin->piece[i][k];
        ASSERT_TRUE((size_t)t->len[i] == o && memcmp(t->piece[i], raw, o) == 0);
        ASSERT_TRUE(t->score[i] == bin->score[i]);
        size_t la, lb;
        const char *da = lm_decode(t, 7, i, &la), *db = lm_decode(bin, 7, i, &lb);
        if (i >= 3) /* the first three are unknown and control: nothing */
            ASSERT_TRUE(la == lb && memcmp(da, db, la) == 0);
        else
            ASSERT_EQ(la, 0);
    }
    for (int b = 0; b < 256; b++)
        ASSERT_EQ(t->byte_id[b], 3 + b);
    ASSERT_TRUE(t->bos == 1 && t->eos == 2 && t->add_bos && t->add_space_prefix && !t->add_eos);
    ASSERT_TRUE(m->config.bos == 1 && lm_token_ends(t, 2) && lm_token_ends(t, 1));
    /* Valid UTF-8 encodes as run.c does; invalid bytes as llama.cpp reads
     * them: 0xFF announces four bytes, so the symbol swallows the next
     * space's U+2581 and falls back to byte pieces. */
    static const char *texts[] = {"the cafe abc", " the the  a", "caf\xc3\xa9 \xe2\x82\xac?", "",
                                  "T is key."};
    int32_t a[64], b2[64];
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t na, nb;
        ASSERT_OK(lm_encode(t, texts[i], strlen(texts[i]), a, 64, &na));
        ASSERT_OK(lm_encode(bin, texts[i], strlen(texts[i]), b2, 64, &nb));
        ASSERT_TRUE(na == nb && memcmp(a, b2, na * sizeof *a) == 0);
    }
    size_t na;
    ASSERT_OK(lm_encode(t, "\x01\xff zz", 6, a, 64, &na));
    ASSERT_TRUE(na >= 6 && a[2] == 3 + 0xFF && a[3] == 3 + 0xE2 && a[4] == 3 + 0x96 &&
                a[5] == 3 + 0x81);
    lm_tokenizer_free(t);
    lm_model_free(m);
    free(img);

    /* add_space_prefix false, BOS 5, add_bos_token false: honoured. */
    for (int i = 0; i < 3; i++) {
        fx_model f2;
        fx_model_init(&f2, 8, 16, 1, 2, 1, FX_PIECES, 8, 1, 7);
        gw_spec s2 = spec_of(&f2, GW_F32);
        kvb k = {.n = 0};
        if (i == 0)
            kb_key(&k, "tokenizer.ggml.add_space_prefix", 7), kb_bytes(&k, "\0", 1);
        if (i == 2)
            kb_key(&k, "tokenizer.ggml.add_bos_token", 7), kb_bytes(&k, "\0", 1);
        s2.vocab_data = &v;
        s2.extra_kv = k.p;
        s2.extra_kv_bytes = k.n;
        s2.extra_kv_count = k.count;
        unsigned char *im = gguf_image(&f2, &s2, &n);
        if (i == 1) /* the value after the key and its type */
            put_u32(im + find(im, n, "tokenizer.ggml.bos_token_id") + 27 + 4, 5);
        lm_model *mm = NULL;
        lm_tokenizer *tt = NULL;
        ASSERT_OK(lm_model_from_memory(im, n, NULL, &mm));
        ASSERT_OK(lm_tokenizer_from_model(mm, NULL, &tt));
        if (tt) {
            int32_t w[8];
            size_t nw;
            ASSERT_OK(lm_tokenize(tt, "a", 1, w, 8, &nw));
            int32_t a_id = lm_piece_id(tt, "a", 1), sa_id = lm_piece_id(tt, "\xe2\x96\x81" "a", 4);
            if (i == 0)
                ASSERT_TRUE(!tt->add_space_prefix && nw == 2 && w[0] == 1 && w[1] == a_id);
            if (i == 1)
                ASSERT_TRUE(tt->bos == 5 && mm->config.bos == 5 && nw == 2 && w[0] == 5 &&
                            (w[1] == sa_id || sa_id < 0));
            if (i == 2)
                ASSERT_TRUE(!tt->add_bos && mm->config.bos == -1 && nw >= 1 && w[0] != 1);
        }
        lm_tokenizer_free(tt);
        lm_model_free(mm);
        free(im);
        fx_model_free(&f2);
    }

    /* Refusals by key; --tokens stay usable (the model loads). */
    char count_needle[96];
    snprintf(count_needle, sizeof count_needle,
             "tokenizer.ggml.tokens has %d entries, the model's vocabulary %d", FX_PIECES,
             FX_PIECES + 64);
    const char *const needles[] = {"tokenizer.ggml.model 'bert' is not supported",
                                   "tokenizer.ggml.add_bos_token is a uint32, not a bool",
                                   count_needle, "tokenizer.ggml.pre 'tekken' is not supported"};
    for (int i = 0; i < 4; i++) {
        fx_model f2;
        fx_model_init(&f2, 8, 16, 1, 2, 1, i == 2 ? FX_PIECES + 64 : FX_PIECES, 8, 1, 7);
        gw_spec s2 = spec_of(&f2, GW_F32);
        s2.vocab_data = i == 0 || i == 3 ? NULL : &v;
        kvb k = {.n = 0};
        if (i == 0)
            kb_key(&k, "tokenizer.ggml.model", 8), kb_str(&k, "bert");
        if (i == 1)
            kb_key(&k, "tokenizer.ggml.add_bos_token", 4), kb_u32(&k, 1);
        if (i == 3)
            kb_key(&k, "tokenizer.ggml.model", 8), kb_str(&k, "gpt2"),
                kb_key(&k, "tokenizer.ggml.pre", 8), kb_str(&k, "tekken");
        s2.extra_kv = k.p;
        s2.extra_kv_bytes = k.n;
        s2.extra_kv_count = k.count;
        unsigned char *im = gguf_image(&f2, &s2, &n);
        lm_model *mm = NULL;
        ASSERT_OK(lm_model_from_memory(im, n, NULL, &mm));
        if (mm) {
            lm_tokenizer *tt = (lm_tokenizer *)&check_seed;
            ASSERT_STATUS(lm_tokenizer_from_model(mm, NULL, &tt), KVE_EFORMAT);
            ASSERT_CONTAINS(kve_last_error(), needles[i]);
            ASSERT_TRUE(tt == (lm_tokenizer *)&check_seed);
        }
        lm_model_free(mm);
        free(im);
        fx_model_free(&f2);
    }
    /* A model without a vocabulary, and a llama2.c one. */
    gw_spec s3 = spec_of(&fx, GW_F32);
    img = gguf_image(&fx, &s3, &n);
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    ASSERT_STATUS(lm_tokenizer_from_model(m, NULL, &t), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "no tokenizer.ggml.model");
    lm_model_free(m);
    free(img);
    size_t ln;
    unsigned char *limg = fx_image(&fx, 1, &ln);
    ASSERT_OK(lm_model_from_memory(limg, ln, NULL, &m));
    ASSERT_STATUS(lm_tokenizer_from_model(m, NULL, &t), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "llama2.c version 1 checkpoint has no tokenizer");
    lm_model_free(m);
    free(limg);

    /* A vocabulary without byte pieces: a byte it cannot encode is UNK. */
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", " ", "a", "b", " a"};
    static const int32_t lens[] = {5, 3, 4, 1, 1, 1, 2};
    static const float scores[] = {0, 0, 0, -1, -2, -2, -1};
    gw_vocab small = {7, pieces, lens, scores};
    fx_model f3;
    fx_model_init(&f3, 8, 16, 1, 2, 1, 7, 8, 1, 8);
    gw_spec s4 = spec_of(&f3, GW_F32);
    s4.vocab_data = &small;
    img = gguf_image(&f3, &s4, &n);
    ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
    ASSERT_OK(lm_tokenizer_from_model(m, NULL, &t));
    size_t nt;
    ASSERT_OK(lm_encode(t, "a\xc3\xa9", 3, a, 64, &nt));
    ASSERT_TRUE(nt == 3 && a[0] == 6 && a[1] == 0 && a[2] == 0); /* " a", UNK, UNK */
    lm_tokenizer_free(t);
    lm_model_free(m);
    free(img);
    fx_model_free(&f3);
    fx_model_free(&fx);
    lm_tokenizer_free(bin);
    free(timg);
}

/* ---- llama2.c version 2 ---- */

static void test_v2(void)
{
    for (int shared = 0; shared < 2; shared++) {
        fx_model fx;
        fx_model_init(&fx, 64, 96, 2, 4, 2, 40, 16, shared, check_seed + 20 + (uint64_t)shared);
        static const size_t groups[] = {32, 16, 8};
        for (size_t gi = 0; gi < 3; gi++) {
            size_t n;
            unsigned char *img = fx_image_v2(&fx, groups[gi], &n);
            lm_model *m = NULL;
            ASSERT_OK(lm_model_from_memory(img, n, NULL, &m));
            if (!m) {
                free(img);
                continue;
            }
            ASSERT_EQ((int)m->config.format, (int)LM_FORMAT_V2);
            ASSERT_EQ(m->config.version, 2);
            ASSERT_EQ(m->config.group_size, (int32_t)groups[gi]);
            ASSERT_EQ(m->config.shared_classifier, shared);
            ASSERT_TRUE(m->weights.layer[1].w3.type == LM_I8G);
            ASSERT_TRUE(memcmp(m->weights.layer[1].rms_ffn, fx.rms_ffn + 64, 64 * 4) == 0);
            char what[48];
            snprintf(what, sizeof what, "version 2, group %zu, %s", groups[gi],
                     shared ? "tied" : "untied");
            double worst = 0;
            against_twin(m, 1, what, -1, &worst);
            if (gi == 0)
                printf("  %-28s worst logit difference %.3g of the largest (bound %.3g)\n", what,
                       worst, Q8_TOL);
            if (gi == 0 && shared) {
                /* header fields and truncation */
                unsigned char *c = malloc(n);
                memcpy(c, img, n);
                int32_t bad[] = {0, -32, 24, 65537 * 2};
                for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                    memcpy(c + 37, &bad[i], 4);
                    ASSERT_REFUSED(c, n, "group_size");
                }
                memcpy(c, img, n);
                float nan = NAN;
                memcpy(c + n - 4, &nan, 4); /* the last scale of the last w3 */
                ASSERT_REFUSED(c, n, "w3 of layer 1: scale");
                memcpy(c, img, n);
                float inf = INFINITY;
                memcpy(c + 256 + 4 * (2 * 64 + 3), &inf, 4); /* rms_ffn[3], after rms_att (2 x 64) */
                ASSERT_REFUSED(c, n, "tensor rms_ffn holds an infinity at element 3");
                for (size_t cut = 0; cut < n; cut += 61) {
                    memcpy(c, img, n);
                    ASSERT_STATUS(lm_model_from_memory(c, cut, NULL, &m), KVE_EFORMAT);
                }
                ASSERT_REFUSED(img, n - 1, "promises");
                free(c);
            }
            lm_model_free(m);
            free(img);
        }
        fx_model_free(&fx);
    }
}

/* ---- allocation failure ---- */

static void test_alloc_failures(void)
{
    fx_model fx;
    fx_model_init(&fx, 8, 16, 2, 2, 1, FX_PIECES, 8, 1, 4);
    size_t tn;
    unsigned char *timg = fx_tokenizer_image(&tn);
    lm_tokenizer *bin = NULL;
    ASSERT_OK(lm_tokenizer_from_memory(timg, tn, NULL, &bin));
    gw_vocab v = {bin->n_pieces, (const char *const *)bin->piece, bin->len, bin->score};
    gw_spec s = spec_of(&fx, GW_F16);
    s.norm_type = GW_F16;
    s.vocab_data = &v;
    size_t n;
    unsigned char *img = gguf_image(&fx, &s, &n);
    talloc ta;
    talloc_init(&ta);
    for (size_t k = 0;; k++) {
        ASSERT_TRUE(k < 200);
        lm_model *m = NULL;
        lm_tokenizer *t = NULL;
        talloc_fail_after(&ta, k);
        kve_status st = lm_model_from_memory(img, n, &ta.a, &m);
        if (st == KVE_OK)
            st = lm_tokenizer_from_model(m, &ta.a, &t);
        talloc_fail_after(&ta, SIZE_MAX);
        lm_tokenizer_free(t);
        lm_model_free(m);
        talloc_check_empty(&ta);
        if (st == KVE_OK)
            break;
        ASSERT_STATUS(st, KVE_ENOMEM);
    }
    free(img);
    /* lm_model_pack out of memory leaves the model as it was */
    fx_model wide;
    fx_model_init(&wide, 256, 256, 1, 2, 1, FX_PIECES, 8, 1, 5);
    gw_spec q = spec_of(&wide, GW_Q4_K);
    img = gguf_image(&wide, &q, &n);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_from_memory(img, n, &ta.a, &m));
    if (m) {
        talloc_fail_after(&ta, 0);
        const kve_status st = lm_model_pack(m);
        talloc_fail_after(&ta, SIZE_MAX);
        if (lm_isa_active() == LM_ISA_AVX512) {
            ASSERT_STATUS(st, KVE_ENOMEM);
            ASSERT_TRUE(m->packed == NULL && m->weights.layer[0].wq.packed == NULL);
        }
        ASSERT_OK(lm_model_pack(m));
        lm_model_free(m);
        talloc_check_empty(&ta);
    }
    free(img);
    fx_model_free(&wide);
    lm_tokenizer_free(bin);
    free(timg);
    fx_model_free(&fx);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_types);
    RUN(test_encoders);
    RUN(test_fallback);
    RUN(test_fuzz_seeds);
    RUN(test_threads);
    RUN(test_metadata);
    RUN(test_rope_freqs);
    RUN(test_refusals);
    RUN(test_scales);
    RUN(test_vocabulary);
    RUN(test_v2);
    RUN(test_alloc_failures);
    return CHECK_DONE();
}
