/* SPDX-License-Identifier: MIT */
/*
 * gguf_write.c - GGUF and llama2.c writers and their quantizers
 * (gguf_write.h says what each quantizer chooses).
 *
 * Invariants: a GGUF file is laid out before a byte of data is written
 * (metadata into a buffer, every tensor's offset from its shape and type,
 * aligned to 32), then each tensor is asked of the source, converted row by
 * row and written, so memory holds one tensor at a time. Multi-byte fields
 * are written little endian byte by byte. Nothing here includes lm/: these
 * encoders are the independent half of the round trips the tests run.
 */
#define _POSIX_C_SOURCE 200809L
#include "gguf_write.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { ALIGN = 32 };

static int fail(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && cap)
        vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- numbers ---- */

uint16_t gw_f32_to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* infinity, NaN */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0));
    if (a >= 0x477ff000u) /* 65520 and above round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: a multiple of 2^-24, nearest (ties to even) */
        float v;
        memcpy(&v, &a, 4);
        return (uint16_t)(sign | (uint16_t)nearbyintf(v * 0x1p24f));
    }
    uint32_t h = ((a >> 23) - 112u) << 10 | ((a >> 13) & 0x3ffu), rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right rounding */
    return (uint16_t)(sign | h);
}

/* float16 bits to float32 (finite values: what the writer reads back of
 * its own rounded scales). */
static float f16_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e ? ldexpf((float)(1024 + m), e - 25) : ldexpf((float)m, -24);
    return (h & 0x8000u) ? -v : v;
}

static uint16_t f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t rest = u & 0xffffu, h = u >> 16;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(h | 0x40u); /* NaN stays NaN */
    if (rest > 0x8000u || (rest == 0x8000u && (h & 1u)))
        h++;
    return (uint16_t)h;
}

static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static int clampi(long v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : (int)v;
}

/* ---- blocks ---- */

static void q8_0_block(const float *x, unsigned char *b)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(b, gw_f32_to_f16(d));
    for (int j = 0; j < 32; j++)
        b[2 + j] = (unsigned char)(int8_t)roundf(x[j] * id);
}

static void q4_0_block(const float *x, unsigned char *b)
{
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(b, gw_f32_to_f16(d));
    for (int j = 0; j < 16; j++) {
        int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + 16] * id + 8.5f);
        lo = lo > 15 ? 15 : lo;
        hi = hi > 15 ? 15 : hi;
        b[2 + j] = (unsigned char)(lo | hi << 4);
    }
}

/* ggml's quantize_row_q5_0_ref: d = the entry of largest magnitude / -16,
 * q = min(31, trunc(x / d + 16.5)), the low nibbles packed as Q4_0's and
 * the fifth bits in a 32-bit word. */
static void q5_0_block(const float *x, unsigned char *b)
{
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(b, gw_f32_to_f16(d));
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int lo = (int)(x[j] * id + 16.5f), hi = (int)(x[j + 16] * id + 16.5f);
        lo = lo > 31 ? 31 : lo;
        hi = hi > 31 ? 31 : hi;
        b[6 + j] = (unsigned char)((lo & 0xF) | (hi & 0xF) << 4);
        qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        b[2 + k] = (unsigned char)(qh >> (8 * k));
}

static void q4_k_block(const float *x, unsigned char *b)
{
    float step[8], off[8], max_step = 0, max_off = 0;
    for (int j = 0; j < 8; j++) {
        float mn = 0, mx = x[32 * (size_t)j];
        for (int l = 0; l < 32; l++) {
            mn = x[32 * j + l] < mn ? x[32 * j + l] : mn;
            mx = x[32 * j + l] > mx ? x[32 * j + l] : mx;
        }
        off[j] = -mn;
        step[j] = (mx - mn) / 15.0f;
        max_step = step[j] > max_step ? step[j] : max_step;
        max_off = off[j] > max_off ? off[j] : max_off;
    }
    uint16_t dh = gw_f32_to_f16(max_step / 63.0f), mh = gw_f32_to_f16(max_off / 63.0f);
    const float d = f16_value(dh), dmin = f16_value(mh);
    put16(b, dh);
    put16(b + 2, mh);
    unsigned char *scales = b + 4, *qs = b + 16;
    memset(scales, 0, 12);
    unsigned char q[256];
    for (int j = 0; j < 8; j++) {
        int sc = d > 0 ? clampi(lrintf(step[j] / d), 0, 63) : 0;
        int m = dmin > 0 ? clampi(lrintf(off[j] / dmin), 0, 63) : 0;
        const float a = d * (float)sc, o = dmin * (float)m;
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (unsigned char)(a > 0 ? clampi(lrintf((x[32 * j + l] + o) / a), 0, 15)
                                                  : 0);
        /* the 6-bit packing: j < 4 in the low bits of bytes j and j + 4; j >= 4
         * split into the low nibbles of byte j + 4 and the top bits of j - 4, j */
        if (j < 4) {
            scales[j] |= (unsigned char)sc;
            scales[j + 4] |= (unsigned char)m;
        } else {
            scales[j + 4] = (unsigned char)((sc & 0xF) | (m & 0xF) << 4);
            scales[j - 4] |= (unsigned char)((sc >> 4) << 6);
            scales[j] |= (unsigned char)((m >> 4) << 6);
        }
    }
    for (int p = 0; p < 4; p++) /* 32 bytes per pair of sub-blocks: 2p low, 2p + 1 high */
        for (int l = 0; l < 32; l++)
            qs[32 * p + l] = (unsigned char)(q[64 * p + l] | q[64 * p + 32 + l] << 4);
}

static void q6_k_block(const float *x, unsigned char *b)
{
    float step[16], max_step = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0;
        for (int l = 0; l < 16; l++)
            amax = fabsf(x[16 * j + l]) > amax ? fabsf(x[16 * j + l]) : amax;
        step[j] = amax / 31.0f;
        max_step = step[j] > max_step ? step[j] : max_step;
    }
    uint16_t dh = gw_f32_to_f16(max_step / 127.0f);
    const float d = f16_value(dh);
    unsigned char L[256];
    int8_t *sc = (int8_t *)(void *)(b + 192);
    for (int j = 0; j < 16; j++) {
        sc[j] = (int8_t)(d > 0 ? clampi(lrintf(step[j] / d), -128, 127) : 0);
        const float a = d * (float)sc[j];
        for (int l = 0; l < 16; l++)
            L[16 * j + l] =
                (unsigned char)((a > 0 ? clampi(lrintf(x[16 * j + l] / a), -32, 31) : 0) + 32);
    }
    unsigned char *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++) /* per half of 128: runs of 32 at 0, 32, 64, 96 */
        for (int l = 0; l < 32; l++) {
            const unsigned char *e = L + 128 * (size_t)h + (size_t)l;
            ql[64 * h + l] = (unsigned char)((e[0] & 0xF) | (e[64] & 0xF) << 4);
            ql[64 * h + 32 + l] = (unsigned char)((e[32] & 0xF) | (e[96] & 0xF) << 4);
            qh[32 * h + l] = (unsigned char)((e[0] >> 4) | (e[32] >> 4) << 2 | (e[64] >> 4) << 4 |
                                             (e[96] >> 4) << 6);
        }
    put16(b + 208, dh);
}

static size_t block_of(uint32_t type, size_t *bytes)
{
    switch (type) {
    case GW_F32: *bytes = 4; return 1;
    case GW_F16:
    case GW_BF16: *bytes = 2; return 1;
    case GW_Q8_0: *bytes = 34; return 32;
    case GW_Q4_0: *bytes = 18; return 32;
    case GW_Q5_0: *bytes = 22; return 32;
    case GW_Q4_K: *bytes = 144; return 256;
    case GW_Q6_K: *bytes = 210; return 256;
    default: *bytes = 0; return 0;
    }
}

size_t gw_row_bytes(uint32_t type, size_t n)
{
    size_t bb, bs = block_of(type, &bb);
    return bs && n % bs == 0 ? n / bs * bb : 0;
}

int gw_quantize_row(uint32_t type, const float *x, size_t n, unsigned char *out)
{
    size_t bb, bs = block_of(type, &bb);
    if (!bs || n % bs)
        return -1;
    for (size_t i = 0; i < n / bs; i++) {
        const float *v = x + i * bs;
        unsigned char *o = out + i * bb;
        switch (type) {
        case GW_F32: memcpy(o, v, 4); break; /* the machines are little endian */
        case GW_F16:
            if (!(fabsf(*v) < 65520.0f))
                return -1;
            put16(o, gw_f32_to_f16(*v));
            break;
        case GW_BF16: put16(o, f32_to_bf16(*v)); break;
        case GW_Q8_0: q8_0_block(v, o); break;
        case GW_Q4_0: q4_0_block(v, o); break;
        case GW_Q5_0: q5_0_block(v, o); break;
        case GW_Q4_K: q4_k_block(v, o); break;
        default: q6_k_block(v, o); break;
        }
    }
    return 0;
}

/* ---- shapes ---- */

void gw_shape(const gw_spec *s, gw_kind kind, size_t *rows, size_t *cols)
{
    size_t D = (size_t)s->dim, F = (size_t)s->hidden, S = D / (size_t)s->heads;
    size_t Q = (size_t)s->heads * S, K = (size_t)s->kv_heads * S, V = (size_t)s->vocab;
    if (kind == GW_ROPE_FREQS) {
        *rows = 1, *cols = S / 2;
        return;
    }
    /* rows and columns by kind, as letters of the legend above */
    static const char r_of[GW_KINDS + 1] = "V1QKKD1FDF1V", c_of[GW_KINDS + 1] = "DDDDDQDDFDDD";
    char r = r_of[kind], c = c_of[kind];
    *rows = r == 'V' ? V : r == 'Q' ? Q : r == 'K' ? K : r == 'D' ? D : r == 'F' ? F : 1;
    *cols = c == 'Q' ? Q : c == 'F' ? F : D;
}

static int check_spec(const gw_spec *s, char *err, size_t cap)
{
    if (s->dim <= 0 || s->hidden <= 0 || s->layers <= 0 || s->heads <= 0 || s->kv_heads <= 0 ||
        s->vocab <= 0 || s->seq_len <= 0 || s->dim % s->heads || s->heads % s->kv_heads ||
        (s->dim / s->heads) % 2)
        return fail(err, cap,
                    "shape: dim %d, hidden %d, layers %d, heads %d, kv_heads %d, vocab %d, "
                    "seq_len %d is not a llama model",
                    s->dim, s->hidden, s->layers, s->heads, s->kv_heads, s->vocab, s->seq_len);
    return 0;
}

/* ---- a growing buffer (the GGUF metadata) ---- */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2 + 256;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_u32(buf *b, uint32_t v)
{
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 24)};
    put(b, le, 4);
}

static void put_u64(buf *b, uint64_t v)
{
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_f32(buf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_u32(b, u);
}

static void put_str(buf *b, const char *s, size_t n)
{
    put_u64(b, n);
    put(b, s, n);
}

enum { K_U32 = 4, K_I32 = 5, K_F32 = 6, K_STRING = 8, K_ARRAY = 9 };

static void key(buf *b, const char *k, uint32_t type)
{
    put_str(b, k, strlen(k));
    put_u32(b, type);
}

/* A piece with each space written U+2581, as SentencePiece stores it. */
static void put_piece(buf *b, const char *p, size_t n)
{
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++)
        spaces += p[i] == ' ';
    put_u64(b, n + 2 * spaces);
    for (size_t i = 0; i < n; i++)
        put(b, p[i] == ' ' ? "\xe2\x96\x81" : p + i, p[i] == ' ' ? 3 : 1);
}

static int is_byte_piece(const char *p, size_t n)
{
    return n == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>';
}

/* The metadata; returns the number of pairs. */
static uint64_t metadata(buf *b, const gw_spec *s)
{
    uint64_t n = 0;
    key(b, "general.architecture", K_STRING), put_str(b, "llama", 5), n++;
    if (s->name)
        key(b, "general.name", K_STRING), put_str(b, s->name, strlen(s->name)), n++;
    key(b, "general.alignment", K_U32), put_u32(b, ALIGN), n++;
    int quantized = s->type != GW_F32 && s->type != GW_F16 && s->type != GW_BF16;
    quantized |= s->emb_type != GW_F32 && s->emb_type != GW_F16 && s->emb_type != GW_BF16;
    if (quantized)
        key(b, "general.quantization_version", K_U32), put_u32(b, 2), n++;
    const struct {
        const char *k;
        int32_t v;
    } ints[] = {{"llama.context_length", s->seq_len},
                {"llama.embedding_length", s->dim},
                {"llama.block_count", s->layers},
                {"llama.feed_forward_length", s->hidden},
                {"llama.attention.head_count", s->heads},
                {"llama.attention.head_count_kv", s->kv_heads},
                {"llama.rope.dimension_count", s->dim / s->heads}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        key(b, ints[i].k, K_U32), put_u32(b, (uint32_t)ints[i].v), n++;
    key(b, "llama.attention.layer_norm_rms_epsilon", K_F32), put_f32(b, s->norm_eps), n++;
    key(b, "llama.rope.freq_base", K_F32), put_f32(b, s->rope_theta), n++;
    if (s->rope_scaling) {
        const char *type = s->rope_scaling == 2 ? "yarn" : "linear";
        key(b, "llama.rope.scaling.type", K_STRING), put_str(b, type, strlen(type)), n++;
        key(b, "llama.rope.scaling.factor", K_F32), put_f32(b, s->rope_factor), n++;
        if (s->rope_attn_factor != 1.0f)
            key(b, "llama.rope.scaling.attn_factor", K_F32), put_f32(b, s->rope_attn_factor), n++;
        if (s->rope_scaling == 2 && s->rope_orig_ctx > 0)
            key(b, "llama.rope.scaling.original_context_length", K_U32),
                put_u32(b, (uint32_t)s->rope_orig_ctx), n++;
    }
    if (s->extra_kv) {
        put(b, s->extra_kv, s->extra_kv_bytes);
        n += s->extra_kv_count;
    }
    const gw_vocab *v = s->vocab_data;
    if (!v)
        return n;
    key(b, "tokenizer.ggml.model", K_STRING), put_str(b, "llama", 5), n++;
    key(b, "tokenizer.ggml.tokens", K_ARRAY), put_u32(b, K_STRING), put_u64(b, (uint64_t)v->n), n++;
    for (int32_t i = 0; i < v->n; i++)
        put_piece(b, v->piece[i], (size_t)v->len[i]);
    key(b, "tokenizer.ggml.scores", K_ARRAY), put_u32(b, K_F32), put_u64(b, (uint64_t)v->n), n++;
    for (int32_t i = 0; i < v->n; i++)
        put_f32(b, v->score[i]);
    /* token types: 2 unknown, 3 control, 6 byte, 1 normal */
    key(b, "tokenizer.ggml.token_type", K_ARRAY), put_u32(b, K_I32), n++;
    put_u64(b, (uint64_t)v->n);
    for (int32_t i = 0; i < v->n; i++)
        put_u32(b, i == 0 ? 2 : i <= 2 ? 3 : is_byte_piece(v->piece[i], (size_t)v->len[i]) ? 6 : 1);
    key(b, "tokenizer.ggml.bos_token_id", K_U32), put_u32(b, 1), n++;
    key(b, "tokenizer.ggml.eos_token_id", K_U32), put_u32(b, 2), n++;
    key(b, "tokenizer.ggml.unknown_token_id", K_U32), put_u32(b, 0), n++;
    return n;
}

/* ---- GGUF ---- */

typedef struct tinfo {
    char name[64];
    gw_kind kind;
    int layer;
    size_t rows, cols;
    uint32_t type;
    uint64_t offset, bytes;
} tinfo;

static int write_all(FILE *f, const void *p, size_t n)
{
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

/* Asks the source for one tensor and writes it in `type` (rows of cols). */
static int write_tensor(FILE *f, gw_source src, void *user, const float *rope_freqs,
                        gw_kind kind, int layer, size_t rows, size_t cols, uint32_t type,
                        float *vals, unsigned char *row, char *err, size_t cap)
{
    if (kind == GW_ROPE_FREQS)
        memcpy(vals, rope_freqs, cols * sizeof *vals);
    else if (src(user, kind, layer, vals) != 0)
        return fail(err, cap, "the source failed on tensor %d of layer %d", (int)kind, layer);
    size_t rb = gw_row_bytes(type, cols);
    for (size_t r = 0; r < rows; r++) {
        if (gw_quantize_row(type, vals + r * cols, cols, row) != 0)
            return fail(err, cap, "tensor %d of layer %d: a value does not fit type %u",
                        (int)kind, layer, type);
        if (write_all(f, row, rb) != 0)
            return fail(err, cap, "write failed");
    }
    return 0;
}

/* The type a tensor of `cols` columns gets for `want` (the fallbacks of
 * gw_spec.fallback). */
static uint32_t fitting(uint32_t want, size_t cols)
{
    while (!gw_row_bytes(want, cols) && want != GW_F16)
        want = want == GW_Q4_K ? GW_Q5_0 : want == GW_Q6_K ? GW_Q8_0 : GW_F16; /* llama.cpp's */
    return want;
}

int gw_write_gguf(FILE *f, gw_spec *s, gw_source src, void *user, char *err, size_t cap)
{
    if (check_spec(s, err, cap) != 0)
        return -1;
    s->fell_back = 0;
    size_t n_t = 2 + (s->shared ? 0 : 1) + 9 * (size_t)s->layers + (s->rope_freqs ? 1 : 0);
    tinfo *t = calloc(n_t, sizeof *t);
    if (!t)
        return fail(err, cap, "out of memory");
    size_t k = 0;
    struct {
        const char *name;
        gw_kind kind;
    } glob[] = {{"token_embd.weight", GW_EMB}, {"output_norm.weight", GW_RMS_FINAL},
                {"output.weight", GW_CLS}};
    for (size_t i = 0; i < 3; i++) {
        if (glob[i].kind == GW_CLS && s->shared)
            continue;
        snprintf(t[k].name, sizeof t[k].name, "%s", glob[i].name);
        t[k++].kind = glob[i].kind;
    }
    static const struct {
        const char *suffix;
        gw_kind kind;
    } per[9] = {{"attn_norm", GW_RMS_ATT}, {"attn_q", GW_WQ},       {"attn_k", GW_WK},
                {"attn_v", GW_WV},         {"attn_output", GW_WO},  {"ffn_norm", GW_RMS_FFN},
                {"ffn_gate", GW_W1},       {"ffn_down", GW_W2},     {"ffn_up", GW_W3}};
    for (int l = 0; l < s->layers; l++)
        for (int i = 0; i < 9; i++) {
            snprintf(t[k].name, sizeof t[k].name, "blk.%d.%s.weight", l, per[i].suffix);
            t[k].kind = per[i].kind;
            t[k++].layer = l;
        }
    if (s->rope_freqs) {
        snprintf(t[k].name, sizeof t[k].name, "rope_freqs.weight");
        t[k++].kind = GW_ROPE_FREQS;
    }
    uint64_t off = 0;
    size_t most = 0, most_row = 0;
    for (size_t i = 0; i < n_t; i++) {
        gw_shape(s, t[i].kind, &t[i].rows, &t[i].cols);
        gw_kind kd = t[i].kind;
        t[i].type = kd == GW_EMB || kd == GW_CLS ? s->emb_type
                    : kd == GW_RMS_ATT || kd == GW_RMS_FFN || kd == GW_RMS_FINAL ? s->norm_type
                    : kd == GW_ROPE_FREQS                                        ? GW_F32
                                                                                 : s->type;
        if (s->fallback && fitting(t[i].type, t[i].cols) != t[i].type) {
            t[i].type = fitting(t[i].type, t[i].cols);
            s->fell_back++;
        }
        size_t rb = gw_row_bytes(t[i].type, t[i].cols);
        if (!rb) {
            fail(err, cap, "%s: %zu columns are not whole blocks of type %u", t[i].name,
                 t[i].cols, t[i].type);
            free(t);
            return -1;
        }
        t[i].offset = off;
        t[i].bytes = (uint64_t)rb * t[i].rows;
        off += (t[i].bytes + ALIGN - 1) / ALIGN * ALIGN;
        most = t[i].rows * t[i].cols > most ? t[i].rows * t[i].cols : most;
        most_row = rb > most_row ? rb : most_row;
    }
    buf head = {0}, kv = {0};
    uint64_t n_kv = metadata(&kv, s);
    put(&head, "GGUF", 4);
    put_u32(&head, 3);
    put_u64(&head, n_t);
    put_u64(&head, n_kv);
    put(&head, kv.p, kv.n);
    for (size_t i = 0; i < n_t; i++) {
        int norm = t[i].rows == 1;
        put_str(&head, t[i].name, strlen(t[i].name));
        put_u32(&head, norm ? 1 : 2);
        put_u64(&head, t[i].cols);
        if (!norm)
            put_u64(&head, t[i].rows);
        put_u32(&head, t[i].type);
        put_u64(&head, t[i].offset);
    }
    static const unsigned char zeros[ALIGN] = {0};
    put(&head, zeros, (ALIGN - head.n % ALIGN) % ALIGN);
    free(kv.p);
    float *vals = malloc(most ? most * sizeof *vals : 1);
    unsigned char *row = malloc(most_row);
    int rc = head.oom || kv.oom || !vals || !row ? fail(err, cap, "out of memory") : 0;
    if (rc == 0 && write_all(f, head.p, head.n) != 0)
        rc = fail(err, cap, "write failed");
    for (size_t i = 0; rc == 0 && i < n_t; i++) {
        rc = write_tensor(f, src, user, s->rope_freqs, t[i].kind, t[i].layer, t[i].rows,
                          t[i].cols, t[i].type, vals, row, err, cap);
        size_t pad = (size_t)((ALIGN - t[i].bytes % ALIGN) % ALIGN);
        if (rc == 0 && write_all(f, zeros, pad) != 0)
            rc = fail(err, cap, "write failed");
    }
    free(head.p);
    free(vals);
    free(row);
    free(t);
    return rc;
}

/* ---- llama2.c ---- */

static int put_i32s(FILE *f, const int32_t *v, size_t n)
{
    buf b = {0};
    for (size_t i = 0; i < n; i++)
        put_u32(&b, (uint32_t)v[i]);
    int rc = b.oom || write_all(f, b.p, b.n) != 0 ? -1 : 0;
    free(b.p);
    return rc;
}

/* Tensor `kind` of every layer (or the single one), float32 or version-2
 * int8 groups. */
static int put_all(FILE *f, const gw_spec *s, gw_kind kind, int per_layer, int group,
                   gw_source src, void *user, float *vals, char *err, size_t cap)
{
    size_t rows, cols;
    gw_shape(s, kind, &rows, &cols);
    size_t n = rows * cols;
    for (int l = 0; l < (per_layer ? s->layers : 1); l++) {
        if (src(user, kind, l, vals) != 0)
            return fail(err, cap, "the source failed on tensor %d of layer %d", (int)kind, l);
        if (!group) {
            if (write_all(f, vals, n * sizeof *vals) != 0)
                return fail(err, cap, "write failed");
            continue;
        }
        unsigned char *q = malloc(n);
        float *sc = malloc(n / (size_t)group * sizeof *sc);
        int rc = q && sc ? 0 : fail(err, cap, "out of memory");
        for (size_t g = 0; rc == 0 && q && sc && g < n / (size_t)group; g++) {
            float wmax = 0;
            for (size_t j = g * group; j < (g + 1) * (size_t)group; j++)
                wmax = fabsf(vals[j]) > wmax ? fabsf(vals[j]) : wmax;
            sc[g] = wmax / 127.0f;
            for (size_t j = g * group; j < (g + 1) * (size_t)group; j++)
                q[j] = (unsigned char)(int8_t)(sc[g] > 0 ? nearbyintf(vals[j] / sc[g]) : 0);
        }
        if (rc == 0 && (write_all(f, q, n) != 0 || write_all(f, sc, n / (size_t)group * 4) != 0))
            rc = fail(err, cap, "write failed");
        free(q);
        free(sc);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int gw_write_llama2c(FILE *f, const gw_spec *s, int version, int group, gw_source src, void *user,
                     char *err, size_t cap)
{
    if (check_spec(s, err, cap) != 0)
        return -1;
    if (version < 0 || version > 2 ||
        (version == 2 && (group <= 0 || s->dim % group || s->hidden % group)))
        return fail(err, cap, "llama2.c version %d with group %d (version 2 needs a group that "
                    "divides dim and hidden)", version, group);
    size_t most = 0;
    for (int k = 0; k < GW_KINDS; k++) {
        size_t r, c;
        gw_shape(s, (gw_kind)k, &r, &c);
        most = r * c > most ? r * c : most;
    }
    float *vals = malloc(most * sizeof *vals);
    if (!vals)
        return fail(err, cap, "out of memory");
    int32_t p[7] = {s->dim, s->hidden, s->layers, s->heads, s->kv_heads, s->vocab, s->seq_len};
    int rc = 0;
    if (version == 0) {
        if (!s->shared)
            p[5] = -p[5];
        rc = put_i32s(f, p, 7);
        static const gw_kind order[] = {GW_EMB, GW_RMS_ATT, GW_WQ, GW_WK, GW_WV, GW_WO,
                                        GW_RMS_FFN, GW_W1, GW_W2, GW_W3, GW_RMS_FINAL};
        for (size_t i = 0; rc == 0 && i < sizeof order / sizeof order[0]; i++)
            rc = put_all(f, s, order[i], order[i] != GW_EMB && order[i] != GW_RMS_FINAL, 0, src,
                         user, vals, err, cap);
        /* run.c's rotary tables, cos then sin of pos * freq_j (never read back) */
        size_t S = (size_t)(s->dim / s->heads), T = (size_t)s->seq_len;
        for (int part = 0; rc == 0 && part < 2; part++)
            for (size_t t = 0; rc == 0 && t < T; t++) {
                for (size_t j = 0; j < S / 2; j++) {
                    float a = (float)t * (1.0f / powf(10000.0f, (float)(2 * j) / (float)S));
                    vals[j] = part ? sinf(a) : cosf(a);
                }
                rc = write_all(f, vals, S / 2 * sizeof *vals) ? fail(err, cap, "write failed") : 0;
            }
    } else {
        int32_t magic_version[2] = {0x616b3432, version};
        unsigned char head[256] = {0};
        rc = put_i32s(f, magic_version, 2) || put_i32s(f, p, 7) ? -1 : 0;
        head[0] = (unsigned char)s->shared;
        size_t used = 1;
        if (version == 2) {
            head[1] = (unsigned char)group;
            head[2] = (unsigned char)(group >> 8);
            head[3] = (unsigned char)(group >> 16);
            head[4] = (unsigned char)(group >> 24);
            used = 5;
        }
        if (rc == 0)
            rc = write_all(f, head, 256 - 36) ? fail(err, cap, "write failed") : 0;
        (void)used;
        static const gw_kind norms[] = {GW_RMS_ATT, GW_RMS_FFN, GW_RMS_FINAL};
        for (size_t i = 0; rc == 0 && i < 3; i++)
            rc = put_all(f, s, norms[i], norms[i] != GW_RMS_FINAL, 0, src, user, vals, err, cap);
        static const gw_kind mats[] = {GW_EMB, GW_WQ, GW_WK, GW_WV, GW_WO, GW_W1, GW_W2, GW_W3};
        for (size_t i = 0; rc == 0 && i < sizeof mats / sizeof mats[0]; i++)
            rc = put_all(f, s, mats[i], mats[i] != GW_EMB, version == 2 ? group : 0, src, user,
                         vals, err, cap);
    }
    if (rc == 0 && !s->shared)
        rc = put_all(f, s, GW_CLS, 0, version == 2 ? group : 0, src, user, vals, err, cap);
    free(vals);
    if (rc != 0 && err && !err[0])
        fail(err, cap, "write failed");
    return rc;
}
