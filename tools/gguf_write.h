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
 * reader that misreads a layout disagrees with them. Each chooses a block
 * as llama.cpp's quantizer does without an importance matrix (ggml's
 * quantize_row_*_ref, quantize_iq4_nl, quantize_iq4_xs), or better: never
 * more squared error per sub-block than that choice (test_convert_error.sh
 * holds every type's weight error to llama.cpp's on one model):
 *   F16, BF16: round to nearest, ties to even;
 *   Q8_0, Q4_0, Q5_0: ggml's references exactly (d = max|x| / 127; d = (the x
 *         of largest magnitude) / -8 or / -16, q = min(15 or 31, (int)(x/d +
 *         8.5 or 16.5)));
 *   Q4_1, Q5_1: d q + m, of ggml's range (d = (max - min) / 15 or 31, m =
 *         min) and a least-squares fit over 21 trial steps, the one of less
 *         squared error;
 *   Q2_K, Q4_K, Q5_K: per sub-block a step and an offset as ggml's
 *         make_qkx2_quants searches them, stored as 4-bit (Q2_K) or 6-bit
 *         multiples of d and dmin;
 *   Q3_K, Q6_K: per sub-block of 16 a signed step as make_q3_quants and
 *         make_qx_quants search it, a 6-bit or int8 multiple of d;
 *   IQ4_NL, IQ4_XS: ggml's 16 non-linear levels, the scale searched as
 *         quantize_row_iq4_nl_impl does (IQ4_XS: 6-bit multiples of d);
 *   then every sub-block's integer scale (and offset) moves to a neighbour
 *   while that lowers its squared error under the stored float16 scales
 *   (IQ4_NL: its float16 scale, within two steps), and each value takes the
 *   nearest level;
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
enum {
    GW_F32 = 0, GW_F16 = 1, GW_Q4_0 = 2, GW_Q4_1 = 3, GW_Q5_0 = 6, GW_Q5_1 = 7, GW_Q8_0 = 8,
    GW_Q2_K = 10, GW_Q3_K = 11, GW_Q4_K = 12, GW_Q5_K = 13, GW_Q6_K = 14, GW_IQ4_NL = 20,
    GW_IQ4_XS = 23, GW_BF16 = 30
};

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
                              type gets the nearest one that fits, as llama.cpp's
                              quantizer falls back (tensor_type_fallback): Q2_K and
                              Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
                              IQ4_XS -> IQ4_NL, and a 32-value type -> F16; 0:
                              refused */
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

/* Writes the model as GGUF version 3 (alignment 32), general.file_type
 * gw_file_type(s->type); sets s->fell_back. */
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
/* general.file_type of a file whose matrices are `type`: llama.cpp's
 * LLAMA_FTYPE_* as its quantizer records a single type (llama-quantize's
 * Q3_K, Q4_K and Q5_K are its Q3_K_M, Q4_K_M and Q5_K_M, 12, 15 and 17, and
 * llama.cpp's loader guesses the same from a file's most common type). */
uint32_t gw_file_type(uint32_t type);
/* float32 to float16 bits, nearest, ties to even (65520 and beyond: inf). */
uint16_t gw_f32_to_f16(float x);

#endif /* KVE_GGUF_WRITE_H */
