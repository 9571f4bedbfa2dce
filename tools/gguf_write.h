/* SPDX-License-Identifier: MIT */
/*
 * gguf_write.h - writing llama models as GGUF files (version 3, little
 * endian) in every type the decoder reads, and as llama2.c exports (legacy,
 * version 1, version 2): the converter's library, used by tools/convert.c
 * (kvevict-convert), bench/lm_speed.c and the tests.
 *
 * The quantizers here are written from the published block definitions
 * (ggml-common.h's layouts; the value a block stands for as ggml-quants.c's
 * dequantize_row_* defines it) and share no code with lm/'s readers, so a
 * reader that misreads a layout disagrees with them:
 *   F16, BF16: round to nearest, ties to even;
 *   Q8_0: d = max|x| / 127, q = round(x / d) (ggml's quantize_row_q8_0_ref);
 *   Q4_0: d = (the x of largest magnitude) / -8, q = min(15, (int)(x/d + 8.5))
 *         (ggml's quantize_row_q4_0_ref);
 *   Q5_0: d = (the x of largest magnitude) / -16, q = min(31, (int)(x/d + 16.5)),
 *         the fifth bits in a u32 (quantize_row_q5_0_ref);
 *   Q4_K: per sub-block of 32 an offset m = -min(0, min x) and a step
 *         (max x + m) / 15; steps and offsets as 6-bit multiples of d and
 *         dmin = their largest / 63; q = round((x + m') / step') in 0..15
 *         with the stored (rounded) step' and m' (a plain min-max choice;
 *         ggml's reference searches for better scales, same format);
 *   Q6_K: per 16 a step max|x| / 31 as an int8 multiple of d = the largest
 *         |step| / 127; q = round(x / step') in -32..31;
 *   llama2.c version 2 (runq.c, export.py's quantize_q80): per group of G,
 *         s = max|x| / 127, q = round(x / s) (ties to even, as torch.round).
 * Functions return 0, or -1 with a message in err (capacity errcap).
 * Values are requested tensor by tensor from a callback, so a model larger
 * than memory is written with one tensor's floats in memory at a time.
 */
#ifndef KVE_GGUF_WRITE_H
#define KVE_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ggml's type ids (as lm.h's lm_dtype) */
enum { GW_F32 = 0, GW_F16 = 1, GW_Q4_0 = 2, GW_Q5_0 = 6, GW_Q8_0 = 8, GW_Q4_K = 12, GW_Q6_K = 14, GW_BF16 = 30 };

/* The tensors of a llama model, in llama2.c's names and shapes
 * (V vocab, D dim, F hidden, L layers, Q = heads * head size, K = kv heads
 * * head size): emb (V, D), rms_att (D), wq (Q, D), wk (K, D), wv (K, D),
 * wo (D, Q), rms_ffn (D), w1 (F, D), w2 (D, F), w3 (F, D), rms_final (D),
 * cls (V, D). */
typedef enum gw_kind {
    GW_EMB, GW_RMS_ATT, GW_WQ, GW_WK, GW_WV, GW_WO, GW_RMS_FFN, GW_W1, GW_W2, GW_W3,
    GW_RMS_FINAL, GW_CLS, GW_KINDS,
    GW_ROPE_FREQS /* (1, head size / 2) gw_spec.rope_freqs, never asked of the source */
} gw_kind;

/* Fills out (rows * cols floats, row-major) with tensor `kind` of layer
 * `layer` (0 for the others); returns 0, or -1 to stop the write. */
typedef int (*gw_source)(void *user, gw_kind kind, int layer, float *out);

typedef struct gw_vocab { /* a SentencePiece-style vocabulary */
    int32_t n;
    const char *const *piece; /* (n) bytes, a space where SentencePiece has U+2581 */
    const int32_t *len;       /* (n) */
    const float *score;       /* (n) */
} gw_vocab;

typedef struct gw_spec {
    int32_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
    int shared;            /* 1: no classifier tensor (tied to the embedding) */
    float norm_eps;        /* GGUF: llama.attention.layer_norm_rms_epsilon */
    float rope_theta;      /* GGUF: llama.rope.freq_base */
    uint32_t type;         /* GGUF: every matrix's type */
    uint32_t emb_type;     /* GGUF: the embedding's and classifier's type */
    uint32_t norm_type;    /* GGUF: the norms' type: GW_F32, GW_F16 or GW_BF16 */
    const gw_vocab *vocab_data; /* GGUF: tokenizer.ggml.* when not NULL */
    const char *name;      /* GGUF: general.name, may be NULL */
    int fallback;          /* GGUF: 1: a tensor whose rows are not whole blocks of its
                              type gets the nearest one that fits (Q4_K -> Q5_0 ->
                              F16, Q6_K -> Q8_0 -> F16, Q8_0, Q5_0 and Q4_0 -> F16, as
                              llama.cpp falls back); 0: refused */
    size_t fell_back;      /* out: tensors that fell back */
    int rope_scaling;      /* GGUF: 0 none (no key written), 1 linear, 2 yarn:
                              llama.rope.scaling.type, .factor, .attn_factor and
                              (yarn, when rope_orig_ctx > 0) .original_context_length */
    float rope_factor, rope_attn_factor;
    int32_t rope_orig_ctx;
    const float *rope_freqs; /* GGUF: (head size / 2) float32 rope_freqs.weight (Llama
                                3's frequency factors); NULL: none */
    const void *extra_kv;  /* GGUF: raw metadata pairs appended as they are (tests) */
    size_t extra_kv_bytes, extra_kv_count;
} gw_spec;

/* The rows and columns of a tensor kind under spec s. */
void gw_shape(const gw_spec *s, gw_kind kind, size_t *rows, size_t *cols);

/* Writes the model as GGUF version 3 (alignment 32); sets s->fell_back. */
int gw_write_gguf(FILE *f, gw_spec *s, gw_source src, void *user, char *err, size_t errcap);

/* Writes the model in llama2.c's format `version` (0 legacy, with run.c's
 * rotary tables; 1 float32; 2 int8 in groups of `group`, which must divide
 * dim and hidden). */
int gw_write_llama2c(FILE *f, const gw_spec *s, int version, int group, gw_source src, void *user,
                     char *err, size_t errcap);

/* One row of n values in a GGUF type into out (n / block * block bytes);
 * for the tests. -1 when a value does not fit the type (float16 range). */
int gw_quantize_row(uint32_t type, const float *x, size_t n, unsigned char *out);
/* Bytes of n values of a GGUF type (0 when n is not whole blocks). */
size_t gw_row_bytes(uint32_t type, size_t n);
/* float32 to float16 bits, nearest, ties to even (65520 and beyond: inf). */
uint16_t gw_f32_to_f16(float x);

#endif /* KVE_GGUF_WRITE_H */
