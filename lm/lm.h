/*
 * lm.h - a llama2.c-style decoder whose KV cache kvevict manages, for
 * llama2.c checkpoints and GGUF files of the llama architecture.
 *
 * The decoder is a client of the public headers only (include/kvevict.h, and
 * kvevict_eval.h for its live trace, trace.c), the way an inference engine
 * would be: one kve_policy per (layer, KV head),
 * stepped with the real attention of the model and obeyed by compacting the
 * cache. It is a small static library (kvevict_lm) used by `kvevict lm ...`,
 * `kvevict generate`, kvevict-convert, the tests and the benchmark; it is
 * not installed. Weights stay in their file's type; the matrix products
 * read them there (matvec.c) on the state's threads (pool.c).
 *
 * Legend of the dimension letters used in every shape comment:
 *   V  vocab_size           D  dim                 F  hidden_dim
 *   L  n_layers             H  n_heads (query)     G  n_kv_heads
 *   S  head_size = D / H    R  group = H / G       T  seq_len (training context)
 *   C  capacity of one (layer, KV head) cache: kept positions + 1
 *
 * Errors are kve_status values; on failure kve_last_error() holds a one-line
 * message naming the field or argument at fault (set with kve_set_error, as
 * a layer built on kvevict does). Nothing here prints, exits or aborts.
 * Every allocation goes through the caller's kve_allocator (lm_options,
 * and the allocator argument of the model and tokenizer constructors; NULL:
 * the C library's), so an engine can redirect it and a test can make the
 * k-th allocation fail.
 */
#ifndef KVE_LM_H
#define KVE_LM_H

#include "kvevict.h"
#include "kvevict_eval.h"

#include <stddef.h>
#include <stdint.h>

/* ---- errors and allocation (util.c) ------------------------------------- */

#ifdef __clang_analyzer__
/* Tells the analyser, which sees one file at a time, that kve_set_error
 * returns s (as internal.h does for kve__fail). Not compiled. */
#define kve_set_error(s, ...) (kve_set_error((s), __VA_ARGS__), (s))
#endif

/* Blocks from allocator `a` (NULL: the C library's), each remembering its
 * size so lm_free and lm_realloc hand it back with exactly that size. NULL
 * on failure (lm_realloc then leaves p as it was); lm_free(a, NULL) does
 * nothing. A block goes back to the allocator it came from. */
void *lm_malloc(const kve_allocator *a, size_t n);
void *lm_calloc(const kve_allocator *a, size_t count, size_t size);
void *lm_realloc(const kve_allocator *a, void *p, size_t n);
void lm_free(const kve_allocator *a, void *p);

/* Reads the whole file at `path` ("-": standard input) into a fresh buffer
 * from `a` (*data, *size; free with lm_free(a, ...)), NUL-terminated beyond
 * *size. KVE_EIO with strerror, KVE_ENOMEM; *data untouched on failure. */
kve_status lm_read_file(const kve_allocator *a, const char *path, char **data, size_t *size);
/* lm_read_file of a file that may hold at most `max` bytes: a larger one is
 * refused (KVE_EFORMAT naming the path and max) before a byte is read when
 * it is a regular file, and once max + 1 bytes arrived otherwise (a pipe,
 * /dev/zero): memory never exceeds max + 2 bytes. */
kve_status lm_read_file_max(const kve_allocator *a, const char *path, size_t max, char **data,
                            size_t *size);
/* The first n bytes of the file at `path` (fewer when it is shorter: *got)
 * into buf: a header to be checked before the rest is read. KVE_EIO. */
kve_status lm_read_head(const char *path, void *buf, size_t n, size_t *got);

/* The most bytes a tokenizer file may hold (llama2.c's tokenizer.bin of
 * 32,000 pieces is 424 KB; one of 256 Ki pieces of 200 bytes, 56 MB). */
#define LM_MAX_TOKENIZER_BYTES ((size_t)64 << 20)

/* ---- weight types (quant.c) -----------------------------------------------
 *
 * A matrix is kept in the type its file stores it in; the matrix-vector
 * products (matvec.c) read it in that type. The GGUF types carry ggml's ids
 * and ggml's block layouts (ggml-common.h), dequantized exactly as ggml's
 * reference code (ggml-quants.c) defines them:
 *   F32, F16, BF16: one value per element (F16/BF16 widened exactly);
 *   Q8_0: blocks of 32: float16 d, 32 int8 q;           x = q * d
 *   Q4_0: blocks of 32: float16 d, 16 bytes;            x = (nibble - 8) * d,
 *         element j < 16 the low nibble of byte j, j >= 16 the high nibble
 *         of byte j - 16;
 *   Q4_K: blocks of 256: float16 d, dmin, 12 bytes of 6-bit scales and
 *         mins, 128 bytes of nibbles; x = (d*sc) * q - (dmin*m) per
 *         sub-block of 32;
 *   Q6_K: blocks of 256: 128 bytes low nibbles, 64 bytes high 2 bits, 16
 *         int8 scales, float16 d; x = d * sc * (q - 32) per 16 elements;
 *   Q4_1: blocks of 32: float16 d, m, 16 bytes;         x = nibble * d + m,
 *         the nibbles ordered as Q4_0's;
 *   Q5_0: blocks of 32: float16 d, 4 bytes qh, 16 bytes; x = (q - 16) * d,
 *         q = nibble (Q4_0's order) | bit j of qh (little endian) << 4;
 *   Q5_1: blocks of 32: float16 d, m, 4 bytes qh, 16 bytes; x = q * d + m,
 *         q as Q5_0's;
 *   Q2_K: blocks of 256: 16 bytes of 4-bit scale (low) and min (high), 64
 *         bytes of 2-bit q, float16 d, dmin; x = (d*sc) * q - (dmin*m) per
 *         16, 128 elements a half: 32 bytes, 2 bits at shift 2s for the
 *         elements 32s .. 32s + 31 of the half;
 *   Q3_K: blocks of 256: 32 bytes high bits, 64 bytes of 2-bit q, 12 bytes
 *         of 6-bit scales, float16 d; x = (d * (sc - 32)) * (q - 4 when
 *         its high bit is clear) per 16, the 2 bits as Q2_K's, the high bit
 *         of element e of the block bit e / 32 of byte e mod 32;
 *   Q5_K: blocks of 256: float16 d, dmin, 12 bytes of scales and mins as
 *         Q4_K's, 32 bytes high bits, 128 bytes of nibbles; x = (d*sc) *
 *         (nibble + 16 * bit) - (dmin*m) per 32, the bit of element e bit
 *         e / 32 of byte e mod 32;
 *   IQ4_NL: blocks of 32: float16 d, 16 bytes; x = d * kvalues[nibble] (the
 *         16 int8 values of ggml's kvalues_iq4nl), nibbles as Q4_0's;
 *   IQ4_XS: blocks of 256: float16 d, uint16 high scale bits, 4 bytes low
 *         scale nibbles, 128 bytes; x = (d * (ls - 32)) * kvalues[nibble]
 *         per 32, ls 6 bits, each 32's nibbles as Q4_0's.
 * LM_I8G is llama2.c's version-2 format (runq.c): int8 values with one
 * float32 scale per group of `group` consecutive elements of a row.
 */

typedef enum lm_dtype {
    LM_F32 = 0,
    LM_F16 = 1,
    LM_Q4_0 = 2,
    LM_Q4_1 = 3,
    LM_Q5_0 = 6,
    LM_Q5_1 = 7,
    LM_Q8_0 = 8,
    LM_Q2_K = 10,
    LM_Q3_K = 11,
    LM_Q4_K = 12,
    LM_Q5_K = 13,
    LM_Q6_K = 14,
    LM_IQ4_NL = 20,
    LM_IQ4_XS = 23,
    LM_BF16 = 30,
    LM_I8G = 1000 /* not a ggml id */
} lm_dtype;

/* The name ("F32", "Q4_K", "I8G", ...) of a type, or of any ggml type id
 * (for messages: "Q5_K"); "unknown" for ids ggml does not define. */
const char *lm_dtype_name(uint32_t type);
/* Elements per block and bytes per block of a supported type (LM_I8G: 1
 * and 1, its scales apart); 0 and 0 for others. */
size_t lm_dtype_block(lm_dtype type);
size_t lm_dtype_block_bytes(lm_dtype type);

/* float16 and bfloat16 bits widened to float32, exactly (NaN and infinity
 * kept). */
float lm_f16_to_f32(uint16_t h);
float lm_bf16_to_f32(uint16_t h);
/* float32 rounded to float16 and bfloat16 bits, to the nearest (ties to
 * even) as ggml's conversions (F16C's, ggml_compute_fp32_to_bf16): past
 * float16's range to infinity, NaN kept quiet with its sign. */
uint16_t lm_f32_to_f16(float f);
uint16_t lm_f32_to_bf16(float f);
/* f rounded to the nearest float16 value, as a float. */
static inline float lm_f16_round(float f)
{
    return lm_f16_to_f32(lm_f32_to_f16(f));
}
/* lm_f16_round of x[0 .. n) in place; and out[j] = lm_f16_round(fmaf(v[j],
 * s, out[j])) for every j (ggml_vec_mad_f16 as llama.cpp's build compiles
 * it: fused multiply-adds in its vectors, and its scalar leftover contracted
 * to one too). The active instruction set's path (matvec.c), bit for bit
 * the scalar one's, NaN included. */
void lm_f16_round_n(float *x, size_t n);
void lm_f16_mad(float *out, const float *v, float s, size_t n);
/* The CPU variants of llama.cpp's back end whose arithmetic
 * LM_PRODUCTS_LLAMA follows. ggml builds one library per x86 family
 * (libggml-cpu-haswell.so, -skylakex.so, -zen4.so, ...) and loads the
 * best one the CPU runs; their float arithmetic falls in three kinds:
 *   LM_LLAMA_CPU_AVX2         haswell, alderlake: 8-lane sums (F32, F16,
 *                             BF16 dot products), ggml_v_expf's AVX2 form;
 *   LM_LLAMA_CPU_AVX512       skylakex, cannonlake, cascadelake, icelake:
 *                             16-lane sums, the AVX-512 exp, Q2_K repacked;
 *   LM_LLAMA_CPU_AVX512_BF16  cooperlake, zen4 (and sapphirerapids, whose
 *                             AMX kernels are not followed): BF16 products
 *                             by vdpbf16ps.
 * LM_LLAMA_CPU_AUTO: the one llama.cpp loads on this machine
 * (lm_llama_cpu_detect: ggml's own test, AVX2 with FMA, F16C and BMI2;
 * AVX-512 F, CD, VL, DQ and BW; BF16 with AVX512_VNNI). Elsewhere (no AVX2,
 * other architectures) llama.cpp's arithmetic is not followed and detection
 * says AVX2. */
typedef enum lm_llama_cpu {
    LM_LLAMA_CPU_AUTO = 0,
    LM_LLAMA_CPU_AVX2,
    LM_LLAMA_CPU_AVX512,
    LM_LLAMA_CPU_AVX512_BF16,
    LM_LLAMA_CPU_COUNT
} lm_llama_cpu;
lm_llama_cpu lm_llama_cpu_detect(void);
/* "auto", "avx2", "avx512", "avx512-bf16"; "unknown" past the enum. */
const char *lm_llama_cpu_name(lm_llama_cpu cpu);
/* x . y as ggml_vec_dot_f16 sums it in the variant cpu (not AUTO): four
 * accumulators of 16 lanes (AVX-512; 8 lanes with AVX2) over whole steps of
 * 64 (32), reduced as GGML_F32x16_REDUCE and _mm512_reduce_add_ps do
 * (GGML_F32x8_REDUCE's pairs), the leftover products added in double, on
 * values already float16: y as floats, or, when yh is not NULL, as float16
 * bits there. Every product is exact in float32, so a fused multiply-add
 * rounds as the plain one. The active instruction set's path (matvec.c:
 * the whole steps in vector registers where it has the variant's lanes),
 * bit for bit the scalar one's. */
float lm_dot_f16(const float *x, const float *y, const unsigned char *yh, size_t n,
                 lm_llama_cpu cpu);
/* out[i] = lm_dot_f16(x, keys + i * S, NULL, S, cpu) * scale for i < n,
 * each the bits of its own call: flash attention's scores over n keys
 * (S). */
void lm_dot_f16_keys(const float *x, const float *keys, size_t n, size_t S, float scale,
                     lm_llama_cpu cpu, float *out);
/* h[i] = silu(h[i]) * g[i] for i < n as ggml_vec_swiglu_f32 in the variant
 * cpu (LM_PRODUCTS_LLAMA's SwiGLU; AUTO: lm_llama_cpu_detect's): silu(x) =
 * x / (1 + e), e ggml_v_expf(-x) of the variant (AVX-512: a polynomial
 * scaled by 2^n, in fused multiply-adds, 0 or infinity beyond |n| > 192;
 * AVX2: its own last steps and scaling) over whole groups of 16 (AVX2: 8),
 * the C library's expf after them. The active instruction set's path
 * (matvec.c: the AVX-512 variants sixteen lanes at a time on AVX-512), bit
 * for bit the scalar one's, NaN included. */
void lm_swiglu_llama(float *h, const float *g, size_t n, lm_llama_cpu cpu);

typedef struct lm_matrix {  /* W (rows, cols), row-major, in its stored type */
    const void *data;       /* rows * row_bytes bytes */
    const unsigned char *scales; /* LM_I8G: rows * cols / group float32 (any alignment) */
    lm_dtype type;
    size_t rows, cols;
    size_t row_bytes;       /* cols / block * block bytes */
    size_t group;           /* LM_I8G: elements per scale; else 0 */
    const unsigned char *packed; /* NULL, or (lm_model_pack) the same rows in fours: block b
                                    of rows 4g .. 4g + 3 at packed + 4g * row_bytes +
                                    4 * block bytes * b, one after another */
} lm_matrix;

/* out (cols) = row `row` of w as float32, dequantized as above. */
void lm_matrix_row(const lm_matrix *w, size_t row, float *out);
/* For matvec.c: elements [start, start + count) of the row (whole blocks
 * for block types). */
void lm__dequant_span(const lm_matrix *w, size_t row, size_t start, size_t count, float *out);
/* For quant.c and matvec.c: a little-endian uint16; ggml's
 * get_scale_min_k4 (the 6-bit scale and min of Q4_K sub-block j < 8 from
 * the block's 12 scale bytes q); the float32 scale of element e (counted
 * over the whole matrix) of an LM_I8G matrix. */
static inline uint16_t lm__u16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
/* IQ4_NL's and IQ4_XS's 16 values (ggml's kvalues_iq4nl). */
extern const int8_t lm__iq4nl_values[16];

static inline void lm__scale_min_k4(int j, const unsigned char *q, unsigned *sc, unsigned *m)
{
    if (j < 4) {
        *sc = q[j] & 63u;
        *m = q[j + 4] & 63u;
    } else {
        *sc = (q[j + 4] & 0xFu) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
static inline float lm__i8g_scale(const lm_matrix *w, size_t e)
{
    float s;
    const unsigned char *p = w->scales + 4 * (e / w->group);
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    __builtin_memcpy(&s, &u, sizeof s);
    return s;
}

/* ---- checkpoints (model.c, gguf.c) ----------------------------------------
 *
 * Four formats, told apart by their first bytes (docs/decoder.md):
 * Legacy (llama2.c "v0"): 7 int32 (dim, hidden_dim, n_layers, n_heads,
 * n_kv_heads, vocab_size, seq_len), vocab_size negative when an unshared
 * classifier follows; then float32 tensors in this order: token embedding,
 * rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, the two rotary
 * tables (T, S/2) each (present, never read), and the classifier when
 * unshared.
 * Version 1: uint32 magic 0x616b3432 ("ak42"), int32 version 1, the same 7
 * int32 (vocab_size positive), uint8 shared-classifier flag, zero padding to
 * 256 bytes; then rms_att, rms_ffn, rms_final, token embedding, wq, wk, wv,
 * wo, w1, w2, w3 and the classifier when unshared. No rotary tables.
 * Version 2 (runq.c): the version-1 header with version 2 and an int32
 * group_size after the flag; float32 rms_att, rms_ffn, rms_final; then per
 * tensor (token embedding, wq, wk, wv, wo, w1, w2, w3 of every layer in
 * turn, the classifier when unshared) its int8 values and their float32
 * scales, one per group_size values.
 * GGUF (versions 2 and 3, little endian), architecture "llama": the
 * hyperparameters from the llama.* keys, the tensors by their GGUF names,
 * in any of the types above (gguf.c).
 * Every header field, key and tensor is validated, and the file must be
 * exactly as long as the llama2.c headers say.
 */

typedef enum lm_format {
    LM_FORMAT_LEGACY = 0, /* llama2.c legacy float32 */
    LM_FORMAT_V1 = 1,     /* llama2.c version 1, float32 */
    LM_FORMAT_V2 = 2,     /* llama2.c version 2, int8 groups */
    LM_FORMAT_GGUF = 3
} lm_format;

/* "llama2.c legacy", "llama2.c version 1", "llama2.c version 2", "GGUF". */
const char *lm_format_name(lm_format f);

typedef enum lm_rope_scaling {
    LM_ROPE_SCALING_NONE = 0,
    LM_ROPE_SCALING_LINEAR = 1,
    LM_ROPE_SCALING_YARN = 2
} lm_rope_scaling;

typedef struct lm_config {
    int32_t dim;           /* D */
    int32_t hidden_dim;    /* F */
    int32_t n_layers;      /* L */
    int32_t n_heads;       /* H */
    int32_t n_kv_heads;    /* G */
    int32_t vocab_size;    /* V, always positive here */
    int32_t seq_len;       /* T: the training context; decoding may run past it */
    int32_t head_size;     /* S = D / H */
    int shared_classifier; /* 1: the classifier is the token embedding */
    int version;           /* llama2.c: 0 legacy, 1, 2; GGUF: its version (2 or 3) */
    lm_format format;
    float norm_eps;        /* RMSNorm epsilon: 1e-5 (run.c) unless the GGUF says */
    float rope_theta;      /* rotary base: 10000 (run.c) unless the GGUF says */
    int32_t group_size;    /* version 2: values per scale; else 0 */
    /* RoPE scaling as llama.cpp reads a GGUF's llama.rope.scaling.* (lm_rope,
     * docs/decoder.md): none (llama2.c files, factor 1), linear (the
     * positions divided by rope_factor) or yarn (ggml's rope_yarn: the
     * frequencies blended between interpolated and not by the correction
     * dimensions of rope_orig_ctx, beta_fast 32 and beta_slow 1, and cos and
     * sin scaled by rope_mscale); a rope_freqs.weight tensor divides pair
     * j's frequency by weights.rope_freqs[j] (Llama 3's factors). */
    lm_rope_scaling rope_scaling;
    float rope_factor;     /* the context scaling factor, > 0: 1 unless the GGUF says */
    int32_t rope_orig_ctx; /* yarn: original_context_length (default seq_len) */
    int rope_freqs;        /* 1: the file has rope_freqs.weight (weights.rope_freqs) */
    float rope_attn_factor; /* rope.scaling.attn_factor: 1 unless the GGUF says */
    float rope_mscale;     /* cos and sin times this: yarn: attn_factor * (1 + 0.1 ln
                              factor) for factor > 1; linear: attn_factor; none: 1 */
    int32_t bos;           /* the token every sequence starts with: 1 (run.c) for llama2.c
                              files; a GGUF's BOS when its vocabulary adds one
                              (lm_tokenizer's bos and add_bos), else -1: none */
} lm_config;

typedef struct lm_layer {
    const float *rms_att, *rms_ffn; /* (D) */
    lm_matrix wq;                   /* (H*S, D) */
    lm_matrix wk, wv;               /* (G*S, D) */
    lm_matrix wo;                   /* (D, H*S) */
    lm_matrix w1, w3;               /* (F, D): gate, up */
    lm_matrix w2;                   /* (D, F): down */
} lm_layer;

typedef struct lm_weights {  /* pointers into the file, but norms it stores
                                in 16 bits (converted into the model) */
    lm_matrix token_embedding; /* (V, D) */
    lm_layer *layer;           /* (L) */
    const float *rms_final;    /* (D) */
    lm_matrix wcls;            /* (V, D): token_embedding when shared */
    const float *rope_freqs;   /* (S/2) rope_freqs.weight: pair j's frequency is
                                  divided by rope_freqs[j]; NULL: none */
} lm_weights;

typedef struct lm_gguf lm_gguf; /* a parsed GGUF container (gguf.c) */

typedef struct lm_model {
    lm_config config;
    lm_weights weights;
    void *map; /* the mmapped file; NULL for lm_model_from_memory */
    size_t map_size;
    const unsigned char *image; /* the whole checkpoint as parsed (lm_model_fingerprint) */
    size_t image_size;
    kve_allocator alloc; /* the handle's, and lm_layer_spread's scratch (a copy) */
    lm_gguf *gguf; /* GGUF: its metadata and tensor infos; else NULL */
    float *norms;  /* GGUF norms stored in 16 bits, widened: (those, D) */
    unsigned char *packed; /* lm_model_pack's copy of the packed matrices, or NULL */
    size_t packed_bytes;
} lm_model;

/* mmaps `path` and validates it; the handle and what it holds besides the
 * mapping come from `allocator` (NULL: the C library's). KVE_EIO (with
 * strerror) when the file cannot be opened, stat'ed or mapped; KVE_EFORMAT
 * naming the field, key or tensor for a malformed or truncated file;
 * KVE_ENOMEM. *out untouched on failure. The file is never read whole into
 * memory: weights are read from the mapping (a GGUF's values are scanned
 * once, for finiteness). */
kve_status lm_model_open(const char *path, const kve_allocator *allocator, lm_model **out);
/* The same over caller memory (4-byte aligned, KVE_EINVAL otherwise), which
 * must outlive the model. */
kve_status lm_model_from_memory(const void *data, size_t size, const kve_allocator *allocator,
                                lm_model **out);
void lm_model_free(lm_model *m);
/* Copies the matrices that --products llama's fastest kernels read faster
 * in another layout (lm_matrix.packed: today Q4_K rows in fours, on
 * AVX-512 with FMA, as llama.cpp repacks its Q4_K rows at load) into memory
 * of the model's, and points each matrix at its copy; the products then
 * read the copy and give the same bits (tests/test_lm_matvec.c). The cost
 * is a copy of those weights (m->packed_bytes; 0 where nothing packs); the
 * file's mapping stays. Idempotent. Not thread-safe: call it before the
 * model is shared (states read it). KVE_ENOMEM leaves m as it was. */
kve_status lm_model_pack(lm_model *m);

/* A GGUF model's metadata pairs whose keys start with `prefix` (NULL or "":
 * every pair), in file order, each as the file has it (key, type, value:
 * bytes ready to write into another GGUF's metadata), handed to fn
 * (may be NULL); returns how many. 0 for a llama2.c model. */
size_t lm_gguf_pairs(const lm_model *m, const char *prefix,
                     void (*fn)(void *user, const void *pair, size_t bytes), void *user);
/* A GGUF model's string key (not NUL-terminated): 1 and s, len; 0 when
 * absent, not a string, or the model is not GGUF. */
int lm_gguf_string(const lm_model *m, const char *key, const char **s, size_t *len);

/* For model.c: parses a GGUF image (gguf.c) into m. */
kve_status lm__gguf_parse(lm_model *m, const unsigned char *data, size_t size);
void lm__gguf_free(lm_gguf *g); /* with the allocator it holds */

/* ---- tokenizer (tokenizer.c, vocab.c) --------------------------------------
 *
 * Three kinds, told by where the vocabulary comes from:
 *  - LM_TOK_RUNC: llama2.c's tokenizer.bin: int32 max_token_length, then
 *    until the end of the file, per piece: float32 score, int32 length,
 *    `length` bytes. Piece 1 is BOS, 2 EOS, pieces 3 + b the bytes b
 *    ("<0xHH>"). Encoding and decoding are run.c's (docs/decoder.md).
 *  - LM_TOK_SPM: a GGUF's tokenizer.ggml.model "llama" (SentencePiece),
 *    encoded as llama.cpp's llama_tokenize does (vocab.c);
 *  - LM_TOK_BPE: a GGUF's "gpt2" (byte-level BPE: tokenizer.ggml.merges and
 *    the pre-tokenizer tokenizer.ggml.pre), as llama_tokenize does.
 * The GGUF kinds read everything llama.cpp's llama_vocab reads for them:
 * token types, special ids, add_bos_token, add_eos_token, add_space_prefix.
 */

/* llama2.c's BOS and EOS (tokenizer.bin, llama2.c checkpoints); a GGUF says
 * its own (lm_tokenizer.bos, lm_config.bos). */
enum { LM_BOS = 1, LM_EOS = 2 };

typedef enum lm_tok_kind { LM_TOK_RUNC = 0, LM_TOK_SPM = 1, LM_TOK_BPE = 2 } lm_tok_kind;

/* The pre-tokenizers of LM_TOK_BPE (llama.cpp's regular expressions, by
 * tokenizer.ggml.pre; docs/decoder.md lists the names of each):
 *   DEFAULT  runs of punctuation and $+<=>^~|, then GPT-2's expression,
 *            runs of numbers, runs of three ASCII digits;
 *   GPT2     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   LLAMA3   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   QWEN2    LLAMA3 with \p{N} for \p{N}{1,3}
 *   DIGITS   every number alone (\p{N}), then GPT2. */
typedef enum lm_tok_pre {
    LM_PRE_NONE = 0, /* the SentencePiece kinds */
    LM_PRE_DEFAULT,
    LM_PRE_GPT2,
    LM_PRE_LLAMA3,
    LM_PRE_QWEN2,
    LM_PRE_DIGITS
} lm_tok_pre;

/* Token attributes (llama.cpp's, from tokenizer.ggml.token_type: 1 normal,
 * 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte, others
 * undefined; every token normal without the array). */
enum {
    LM_ATTR_NORMAL = 1,
    LM_ATTR_UNKNOWN = 2,
    LM_ATTR_CONTROL = 4,
    LM_ATTR_USER = 8,
    LM_ATTR_UNUSED = 16,
    LM_ATTR_BYTE = 32
};

typedef struct lm_merge { /* a BPE merge: the pair (left, right), its rank */
    const char *left, *right; /* into lm_tokenizer.merge_bytes, not NUL-terminated */
    int32_t left_len, right_len;
    int32_t rank;             /* its index in tokenizer.ggml.merges */
} lm_merge;

typedef struct lm_tokenizer {
    lm_tok_kind kind;
    lm_tok_pre pre;                 /* LM_TOK_BPE: its pre-tokenizer */
    int32_t n_pieces;
    int32_t max_token_length;       /* as the file says: no piece is longer */
    int32_t longest;                /* the longest piece's length: what buffers are sized by */
    const char **piece;             /* (n_pieces) pointers into `bytes`, not NUL-terminated:
                                       the bytes as the file has them (tokenizer.bin: spaces;
                                       GGUF: U+2581 for spaces, or GPT-2's byte characters) */
    int32_t *len;                   /* (n_pieces) */
    float *score;                   /* (n_pieces) */
    int32_t *sorted;                /* (n_pieces) ids by (bytes, id) (RUNC) or (bytes, -id)
                                       (GGUF: llama.cpp's map keeps the last): the lookup */
    char *bytes;                    /* every piece, back to back */
    unsigned char byte_pieces[256]; /* byte b at [b]: what "<0xHH>" decodes to */
    int32_t byte_id[256];           /* byte fallback: the piece of byte b, -1 if none
                                       (tokenizer.bin: 3 + b, as run.c) */
    int32_t unk;                    /* a byte without a piece: this id; -1: refused */
    kve_allocator alloc;            /* every block of the tokenizer and of lm_encode (a copy) */
    /* the special tokens (-1: none) and the flags of llama_tokenize with
     * add_special; RUNC: BOS 1, EOS 2, add_bos 1, add_space_prefix 1; BPE:
     * add_space_prefix 0 whatever the file says (llama.cpp adds none) */
    int32_t bos, eos;
    int add_bos, add_eos, add_space_prefix;
    int ignore_merges;              /* BPE: a word that is a piece is not merged (LLAMA3) */
    /* GGUF kinds (NULL for RUNC): */
    unsigned char *attr;            /* (n_pieces) LM_ATTR_* */
    const char **text;              /* (n_pieces) what a token decodes to (llama.cpp's
                                       token_to_piece without specials), into text_bytes */
    int32_t *text_len;              /* (n_pieces) */
    char *text_bytes;
    int32_t *user;                  /* (n_user) user-defined ids, longest first: split out of
                                       the text before encoding, as llama.cpp does */
    size_t n_user;
    int32_t *eog;                   /* (n_eog) ids that end a generation, ascending */
    size_t n_eog;
    lm_merge *merge;                /* (n_merges) by (left, right, rank): BPE's ranks */
    size_t n_merges;
    char *merge_bytes;
} lm_tokenizer;

/* Reads and validates a tokenizer.bin, allocating from `allocator` (NULL:
 * the C library's): KVE_EIO, KVE_EFORMAT naming the piece and field,
 * KVE_ENOMEM. */
kve_status lm_tokenizer_open(const char *path, const kve_allocator *allocator, lm_tokenizer **out);
kve_status lm_tokenizer_from_memory(const void *data, size_t size, const kve_allocator *allocator,
                                    lm_tokenizer **out);
/* The vocabulary a GGUF model carries in its metadata, as llama.cpp's
 * llama_vocab reads it: tokenizer.ggml.model "llama" (LM_TOK_SPM) or
 * "gpt2" (LM_TOK_BPE, with tokenizer.ggml.merges and a pre-tokenizer
 * tokenizer.ggml.pre this decoder has: lm_tok_pre); the pieces of
 * tokenizer.ggml.tokens (an empty one read as "[EMPTY_<id>]"), the scores
 * (float32 or int32; 0 when absent), the token types; the special ids
 * (bos, eos, unknown, eot, eom, ...: the model's defaults, then each
 * tokenizer.ggml.*_token_id inside the vocabulary), add_bos_token,
 * add_eos_token and add_space_prefix (defaults as llama.cpp's: SPM adds BOS
 * and the prefix space, BPE neither unless its pre-tokenizer does), byte
 * fallback to the pieces "<0xHH>" (SPM; a byte without one becomes the
 * unknown id). Allocates from `allocator` (NULL: the C library's).
 * Refuses KVE_EINVAL for a model that is not GGUF or has no tokenizer,
 * KVE_EFORMAT naming the key (another tokenizer model or pre-tokenizer, by
 * name; a count below the vocabulary's, a NaN score, a NUL byte in a piece,
 * a merge that is not a string), KVE_ENOMEM. The model may be freed after. */
kve_status lm_tokenizer_from_model(const lm_model *m, const kve_allocator *allocator,
                                   lm_tokenizer **out);
void lm_tokenizer_free(lm_tokenizer *t);

/* For tokenizer.c and gguf.c: a tokenizer of n pieces whose bytes (total
 * of them), from `a`, the caller fills in t->bytes, t->piece, t->len, t->score; then
 * lm__tokenizer_finish sorts the lookup table (by t->kind) and sets the
 * defaults of byte_pieces, byte_id (3 + b) and unk (-1). */
kve_status lm__tokenizer_alloc(const kve_allocator *a, size_t n, size_t total, lm_tokenizer **out);
kve_status lm__tokenizer_finish(lm_tokenizer *t);

/* The most tokens lm_encode makes of `len` bytes: len + 1 (RUNC), 4 len + 3
 * (the GGUF kinds: a space may become three byte tokens, an invalid byte
 * U+FFFD's three, and a stretch after a user-defined piece starts with a
 * space of its own); SIZE_MAX when that overflows. */
size_t lm_encode_bound(const lm_tokenizer *t, size_t len);

/* Encodes text[0 .. len) without BOS or EOS:
 *  - RUNC as run.c does with bos = eos = 0: the dummy prefix " " when len >
 *    0, one token per UTF-8 code point found among the pieces, byte
 *    fallback (t->byte_id[byte], else t->unk) otherwise, then repeated
 *    merges of the adjacent pair whose concatenation is the highest-scoring
 *    piece (the leftmost on ties);
 *  - SPM and BPE as llama.cpp's llama_tokenize(add_special = false,
 *    parse_special = false): user-defined pieces split out first, then
 *    each stretch of text by SentencePiece's merges (SPM: spaces as U+2581,
 *    a space first when add_space_prefix, symbols of the length their
 *    first byte announces) or by the pre-tokenizer and the merges' ranks
 *    (BPE: invalid UTF-8 read as U+FFFD, bytes as GPT-2's characters).
 * Writes *n tokens to tokens[0 .. cap); at most lm_encode_bound(t, len).
 * KVE_ERANGE when cap is too small; KVE_EFORMAT when a byte has no piece
 * and there is no unk (a tokenizer.bin of fewer than 259 pieces);
 * KVE_ENOMEM. O(len log len). */
kve_status lm_encode(const lm_tokenizer *t, const char *text, size_t len, int32_t *tokens,
                     size_t cap, size_t *n);
/* llama_tokenize(add_special = true, parse_special = false): BOS when
 * t->add_bos, lm_encode's tokens, EOS when t->add_eos (a special id of -1
 * is left out). At most lm_encode_bound(t, len) + 2 tokens. */
kve_status lm_tokenize(const lm_tokenizer *t, const char *text, size_t len, int32_t *tokens,
                       size_t cap, size_t *n);
/* The bytes `token` stands for after `prev`: RUNC as run.c's decode (a
 * piece "<0xHH>" is the one byte HH); the GGUF kinds as llama.cpp's
 * token_to_piece without specials (control and unknown tokens are empty,
 * U+2581 a space, byte tokens their byte, BPE pieces GPT-2's bytes). After
 * BOS a leading space is dropped when the tokenizer adds the prefix space
 * (RUNC, and SPM with add_space_prefix). Returns a pointer (not
 * NUL-terminated) and its length in *len; NULL for a token out of range. */
const char *lm_decode(const lm_tokenizer *t, int32_t prev, int32_t token, size_t *len);
/* The id of the piece whose bytes are exactly `piece` (as the file has
 * them: see piece above), -1 if none; several: the lowest id (RUNC), the
 * highest (GGUF, as llama.cpp). */
int32_t lm_piece_id(const lm_tokenizer *t, const char *piece, size_t len);
/* 1 when `token` ends a generation: the end-of-generation ids of a GGUF
 * (eos, eot, eom and the pieces llama.cpp takes for ends of turn), or BOS
 * (run.c stops there: llama2.c's training text separates stories by BOS). */
int lm_token_ends(const lm_tokenizer *t, int32_t token);

/* For vocab.c and gguf.c (internal): the pre-tokenizer of a
 * tokenizer.ggml.pre name; 0 when this decoder has none by that name. The
 * flags it implies in llama.cpp: add_bos (1), ignore_merges (1), no BOS
 * (bos_null 1). An empty name is DEFAULT (llama.cpp warns). */
int lm__pre_lookup(const char *name, size_t len, lm_tok_pre *pre, int *add_bos, int *ignore_merges,
                   int *bos_null);
/* Fills t->text, t->user, t->eog (eos, eot, eom: -1 none, and the pieces
 * named as ends of turn) and the byte tables of a GGUF tokenizer whose
 * pieces, attributes and special ids are set (vocab.c). */
kve_status lm__vocab_finish(lm_tokenizer *t, int32_t eot, int32_t eom);
/* The merges of tokenizer.ggml.merges, n strings given by pointer and
 * length, into t->merge (vocab.c): llama.cpp's reading (the first space
 * after the first byte separates the pair; a string without one is the
 * empty pair; the first of equal pairs keeps its rank). */
kve_status lm__vocab_merges(lm_tokenizer *t, const char *const *s, const size_t *len, size_t n);

/* out[i] = (float)((sum over r < group of rows[r*ld + i], in double, in
 * order of r) / group) for i < n: a group of query-head rows reduced to its
 * KV head exactly as kve_bank_step_range does with KVE_REDUCE_MEAN (the
 * decoder's policies receive that), for attention dumps (decode.c). */
void lm_group_mean(float *out, const float *rows, size_t ld, size_t group, size_t n);

/* ---- the decoder (decode.c) ------------------------------------------------ */

typedef enum lm_positions {
    LM_POS_ORIGINAL = 0, /* keys rotated once at their own position */
    LM_POS_CACHE = 1     /* keys rotated at their index in the cache */
} lm_positions;

/* Called once per layer of every step, after attention: att row h (query
 * head h) at att + h*ld holds the softmax weights over the keys of its KV
 * head's cache in kept order, the new key last; n_keys[g] (G of them) is the
 * number of those keys for KV head g. */
typedef void (*lm_attention_fn)(void *user, int32_t layer, int32_t pos, const float *att, size_t ld,
                                const size_t *n_keys);

/* Called once per layer of every step, after attention, with the queries
 * (H*S) and the new keys (G*S) of position pos, both after the rotary
 * embedding: exactly the vectors whose dot products (over sqrt(S)) are the
 * attention logits under original positions (the q/K trace of `lm dump
 * --qk`). Under cache positions the key is the one rotated at its index in
 * the cache. */
typedef void (*lm_qk_fn)(void *user, int32_t layer, int32_t pos, const float *q, const float *k);

/* The decoder's arithmetic. EXACT (the default): its own (float32 inputs;
 * Q8_0, Q4_K and version-2 weights against lm_quantize_q8's input; float32
 * keys and values), what the exactness tests hold to references. LLAMA:
 * llama.cpp's CPU back end's, so that a GGUF gives the logits llama.cpp
 * gives (docs/decoder.md, "llama.cpp's arithmetic"):
 *   - each product's input converted for its weight type
 *     (lm_llama_quantize), every row summed in the order llama.cpp sums it
 *     for one token (its vec_dot functions, its repacked gemv: lm_q8.fused);
 *   - keys (after RoPE) and values stored in float16, as its cache; the
 *     attention its flash attention (a float16 query, scores summed as
 *     ggml_vec_dot_f16, an online softmax over a float16 accumulator);
 *   - RoPE's angles by ggml's repeated multiplication and its rotation with
 *     the fused multiply-adds its build compiles, RMS norm's squares summed
 *     in double, SwiGLU's exp as ggml_v_expf.
 * Where ggml's code differs by instruction set the decoder follows the
 * variant lm_options.llama_cpu names (lm_llama_cpu: by default the one
 * llama.cpp loads on the machine). The policies get the same float32
 * softmax rows as under EXACT, computed from
 * LLAMA's scores. */
typedef enum lm_products {
    LM_PRODUCTS_EXACT = 0,
    LM_PRODUCTS_LLAMA = 1
} lm_products;

typedef struct lm_options {
    const kve_allocator *allocator; /* the state's blocks and its bank's (copied); NULL:
                                       the C library's */
    const char *policy;           /* spec; NULL: no policy, every key kept (run.c) */
    size_t budget;                /* 0: the spec's budget; else overrides it */
    lm_positions positions;       /* LM_POS_ORIGINAL (default) or LM_POS_CACHE */
    uint64_t seed;                /* seeds the policies that draw random numbers */
    lm_attention_fn on_attention; /* may be NULL */
    lm_qk_fn on_qk;               /* may be NULL */
    void *user;
    int timing; /* 1: accumulate lm_state.bookkeeping_s */
    /* Budgets (budgets.c, docs/budgets.md). The budget is the mean per KV
     * head: the total L * budget is split over the layers by `schedule`
     * (kve_layer_budgets, floor = the smallest budget the spec accepts). */
    kve_schedule_kind schedule;  /* KVE_SCHEDULE_UNIFORM (default), _PYRAMID, _WEIGHTED */
    double beta;                 /* PYRAMID: beta >= 1; 0 means PyramidKV's 20 */
    const double *layer_weights; /* WEIGHTED: L weights (lm_layer_spread); read by
                                    lm_state_new only */
    int share_heads;             /* 1: each layer's G KV heads share G * its budget
                                    (kve_bank_evict_shared) instead of each its own */
    double min_share;            /* share_heads: the floor, as kve_bank_options (0 is
                                    no floor but the recent window; the library's
                                    default is 0.2) */
    size_t threads;              /* matrix products split by rows over this many
                                    threads (the caller and threads - 1 workers), and
                                    a layer's attention by KV head once it holds 1024
                                    (key, query head) pairs; 0 or 1: the caller
                                    alone. Results are the same bits for every count */
    int same_positions;          /* 1: one bank of every layer's KV heads with
                                    kve_bank_options.same_positions: every (layer, KV
                                    head) keeps the same positions (an engine whose
                                    cache drops a position from every head at once,
                                    as llama.cpp's); each step evicts once, after the
                                    last layer. Not with share_heads, head_budgets
                                    or a non-uniform schedule; without a policy
                                    nothing to decide (every key is kept) */
    const size_t *head_budgets;  /* (L*G) each (layer, KV head)'s own budget,
                                    layer-major (a DuoAttention schedule, lm_heads_budgets);
                                    read by lm_state_new only; NULL: the layer
                                    budgets. Not with share_heads or a non-uniform
                                    schedule; each at least the spec's smallest
                                    budget (kve_spec_min_budget) */
    lm_products products;        /* LM_PRODUCTS_EXACT (0, the default) or
                                    LM_PRODUCTS_LLAMA (lm_llama_quantize) */
    lm_llama_cpu llama_cpu;      /* LM_PRODUCTS_LLAMA: the CPU variant of llama.cpp
                                    followed; LM_LLAMA_CPU_AUTO (0): the one it loads
                                    here (lm_llama_cpu_detect) */
    size_t batch;                /* tokens lm_forward_batch decodes as one block (each
                                    weight read once for all of them); 0: LM_BATCH;
                                    1: one at a time. The results are the same bits
                                    for every size */
} lm_options;

typedef struct lm_cache { /* one (layer, KV head) */
    float *key;           /* (C, S) rotated (original) or as computed (cache positions) */
    float *value;         /* (C, S) */
    int32_t *pos;         /* (C) the kept positions, ascending: the policy's kept set */
    size_t n;             /* entries in use */
    size_t cap;           /* C */
} lm_cache;

/* The storage of one layer's caches when its KV heads share a budget
 * (budgets.c): cache g of the layer owns rows [o_g, o_g + C_g) of each
 * array, heads in order, so the layer's memory follows the total it keeps
 * while each head's share moves. */
typedef struct lm_arena {
    float *key;   /* (A, S) */
    float *value; /* (A, S) */
    int32_t *pos; /* (A) */
    size_t cap;   /* A rows */
} lm_arena;

typedef struct lm_state { /* llama2.c's RunState plus the managed cache */
    const lm_model *model;
    lm_options opt;
    kve_allocator alloc;  /* opt.allocator, copied (opt.allocator then points here) */
    char *spec;           /* canonical spec with the budget applied; NULL: none */
    kve_bank *bank;       /* (L*G) policies, layer-major; NULL without a policy */
    size_t budget;        /* the mean per-head budget: the spec's (or opt.budget) */
    size_t *layer_budget; /* (L) per-head budget of each layer, adding up to L * budget:
                             its heads evict to it, or (share_heads) together to G
                             times it; with head_budget, the largest of the layer's;
                             NULL without a policy */
    size_t *head_budget;  /* (L*G) with opt.head_budgets: what each head evicts to */
    lm_arena *arena;      /* (L) with share_heads: every layer's cache storage */
    lm_cache *cache;      /* (L, G) */
    int32_t pos;          /* the position of the next token */
    int broken;           /* a step failed half way: refuse until reset */
    double bookkeeping_s; /* with opt.timing: CPU seconds of this thread in policy
                           * steps, evictions and cache compaction since
                           * creation, read twice a layer (each read costs a
                           * system call; bench/lm_speed.c subtracts it) */
    /* activations of the current position */
    float *x;        /* (D) the residual stream */
    float *xb;       /* (D) inside a residual branch */
    float *xb2;      /* (D) */
    float *hb, *hb2; /* (F) the SwiGLU hidden */
    float *q;        /* (H*S) */
    float *k, *v;    /* (G*S) of the current position */
    float *rope;     /* (S) cos, sin interleaved for the current position */
    float *logits;   /* (V) */
    /* attention scratch, ld >= every cache's n + 1 */
    size_t ld;
    float *att;        /* (H, ld) softmax weights */
    float *krot;       /* (P, ld, S) keys rotated at their cache index (cache positions),
                          one block a thread (P = opt.threads, at least 1) */
    float *qh;         /* (P, S) LM_PRODUCTS_LLAMA: a query rounded to float16, one a
                          thread */
    float *rope_table; /* (ld, S) cos, sin per cache index (cache positions) */
    size_t rope_rows;  /* rows of rope_table filled */
    int32_t *victims;  /* (G, ld); same_positions: (L*G, ld) */
    size_t *counts;    /* (G) victims, then keys per KV head; same_positions: (L*G) */
    /* prefill (lm_prefill), between its first and last token */
    int prefilling;    /* 1: record rows, step without evicting (or not at all) */
    int pf_method;     /* 1: kve_bank_prefill reads pf_rows; 0: step, evict once */
    size_t pf_n;       /* n, the prompt's tokens */
    size_t pf_r;       /* rows recorded per query head: queries n-r .. n-1 */
    float *pf_values;  /* (L, G, n, value_dim) a vnorm policy's prompt values (W_o v),
                          while lm_prefill runs; NULL otherwise */
    float *pf_rows;    /* (L, H, r, n) the recorded rows over keys 0 .. t; KVzip:
                          (L, H, 1, n) the running maximum of the scoring weights */
    /* KVzip's reconstruction pass (lm_prefill_kvzip), while it runs */
    int kz_active;     /* 1: attend() scores the prompt's chunk [kz_start, kz_end) */
    size_t kz_start, kz_end, kz_sinks;
    float *kz_wov;     /* KVzip+: (L, H, n) ||W_o,h v_i|| of the prompt's values; NULL
                          for KVzip */
    float kz_hinv;     /* KVzip+: 1 / ||attention input|| of the current layer's token */
    size_t *layer_keep; /* (L) after KVzip's overall budgets: each layer's shared total
                           while decoding (its kept positions); 0 (the default): G times
                           its layer_budget */
    /* matrix-vector products */
    struct lm_pool *pool; /* opt.threads > 1: the workers; else NULL */
    int8_t *xq;           /* (max(D, F, H*S)) the input quantized for Q8_0, Q4_K
                             and version-2 weights; NULL when no matrix needs it */
    float *xd;            /* (max(D, F, H*S) / group) its scales (LM_PRODUCTS_LLAMA:
                             group 32 at most) */
    float *xl;            /* LM_PRODUCTS_LLAMA: (max(D, F, H*S)) the converted input */
    float *xs;            /* LM_PRODUCTS_LLAMA: (max(D, F, H*S) / 32) its Q8_1 sums */
    /* a block of tokens (lm_forward_batch), B = its capacity, allocated by the
     * first block; the same shapes as the activations above, one row a token */
    size_t bcap;          /* B: tokens the block buffers hold; 0: none yet */
    float *bx, *bxb, *bxb2; /* (B, D) */
    float *bhb, *bhb2;    /* (B, F) */
    float *bq;            /* (B, H*S) */
    float *bk, *bv;       /* (B, G*S) */
    float *brope;         /* (B, S) original positions: each token's cos, sin */
    float *blogits;       /* (B, V) */
    float *bhinv;         /* (B) KVzip+: each token's 1 / ||attention input|| */
    int8_t *bxq;          /* (B, max(D, F, H*S)) each row quantized as xq; NULL when
                             no matrix needs it */
    float *bxd;           /* (B, max(D, F, H*S) / group + 1) their scales */
    float *bxl;           /* LM_PRODUCTS_LLAMA: (B, max(D, F, H*S)) as xl */
    float *bxs;           /* LM_PRODUCTS_LLAMA: (B, max(D, F, H*S) / 32 + 1) as xs */
    struct lm_q8 *bq8;    /* (B) each row's quantized input, as lm_matmat reads it */
    /* the step data of a policy that reads queries or values (decode.c) */
    kve_reads reads;   /* what the policy reads (KVE_READS_NOTHING without one) */
    size_t value_dim;  /* the floats of a value it is handed: S (expected_attention,
                          the raw value) or R*D (vnorm=1: CriticalKV's W_o v); 0
                          when it reads neither queries nor values */
    float *wov;        /* (G, R*D) with value_dim R*D: each KV head's value through
                          the output projection's slices of its R query heads;
                          then (H*S) floats: a row of W_o in float32 */
} lm_state;

/* The base of the rotary embedding's frequencies that llama2.c's run.c
 * hard-codes, and every llama2.c checkpoint uses (a GGUF file may say
 * otherwise: lm_config.rope_theta). */
#define LM_ROPE_BASE 10000.0f

/* The decoder's rotary embedding as kvevict describes one (kve_rope), its
 * linear or yarn scaling included (a rope_freqs.weight file's is not, the
 * factors being the model's weights: lm_model_rope; nor a factor below 1:
 * the rope is then unset, and a policy that reads it refuses it): every
 * dimension of a head (rotary_dim = head_size), base the model's
 * rope_theta, adjacent pairs (2j, 2j+1), as run.c rotates them. */
kve_rope lm_rope(const lm_config *c);
/* lm_rope of m's config, and with a rope_freqs.weight tensor (Llama 3's
 * GGUF files) its factors as kve_rope.freq_factors (which point into m:
 * read when a policy is built) and attention_factor rope_mscale, as
 * rope_row scales such a file: the rope the decoder builds its policies
 * with. */
kve_rope lm_model_rope(const lm_model *m);
/* The decoder's rotation at pos (S = head_size floats, cos and sin of pair
 * j at 2j and 2j + 1, times the magnitude factor): rope_row, or with
 * llama_products ggml's order (rope_row_llama). A vector's pair (x, y)
 * becomes (x cos - y sin, x sin + y cos), in float. For tests. */
void lm_rope_row(const lm_model *m, int llama_products, int64_t pos, float *rope);
/* c's RoPE scaling from the values a GGUF gives (lm/gguf.c reads them from
 * llama.rope.scaling.*, kvevict-llama through llama.cpp): the type, the
 * factor (ignored by none, as llama.cpp ignores it), attn_factor and the
 * original context; linear at factor 1 and attn_factor 1 becomes none (the
 * same rotation, exactly); rope_mscale as lm_config says. */
void lm_rope_scaling_set(lm_config *c, lm_rope_scaling type, float factor, float attn,
                         int32_t orig);

/* A decoder over `m` (which must outlive it). opt may be NULL (no policy,
 * original positions). Refuses KVE_EINVAL for a bad spec or budget (message
 * from kvevict, prefixed "policy"), KVE_ENOMEM. */
kve_status lm_state_new(const lm_model *m, const lm_options *opt, lm_state **out);
void lm_state_free(lm_state *s);
/* Back to position 0 with an empty cache and fresh policies (seeded again),
 * so a reset decoder repeats its first run bit for bit. KVE_ENOMEM leaves
 * the state as it was. */
kve_status lm_state_reset(lm_state *s);

/* One decode step: token at position s->pos, then s->pos++; the logits (V)
 * for the next token are in s->logits. Refuses KVE_EINVAL (nothing changed)
 * for a token outside [0, V) or a position past INT32_MAX; KVE_ENOMEM when a
 * cache cannot grow, which changes nothing (the same call may be retried,
 * and the run then goes on bit for bit as one that never failed:
 * tests/test_lm.c); KVE_ERANGE when the activations overflow float32 (a
 * query, key or value of some layer, or a logit, that is not finite: finite
 * weights too large for it), whether or not a policy is set, which leaves
 * the state broken until lm_state_reset (nothing non-finite is ever kept,
 * so a session saved before it loads). */
kve_status lm_forward(lm_state *s, int32_t token);

/* The tokens a block of lm_forward_batch holds when lm_options.batch is 0. */
enum { LM_BATCH = 64 };

/* Called by lm_forward_batch once per token, in order: i its index in the
 * call's tokens, logits (V) those after it. */
typedef void (*lm_logits_fn)(void *user, size_t i, const float *logits);

/* Decodes tokens[0 .. n) with the results of n calls of lm_forward, bit
 * for bit: the same logits, caches, policies' decisions and position, for
 * every weight type, products, policy and thread count. Tokens go in blocks
 * of opt.batch (LM_BATCH when 0): per layer every block token's products at
 * once (lm_matmat: each weight read once for the block, each token's value
 * the bits lm_matvec gives it), then attention, the policies' steps and
 * evictions token by token in order, as lm_forward runs them; then the
 * next layer. A block is one token (lm_forward itself) where that order
 * would change a result or a call's order (docs/decoder.md, "Prompts in
 * blocks"): with on_attention or on_qk set (called in token order), and
 * while policies are stepped under same_positions (a step at position t + 1
 * waits for every layer's eviction at t) or evict with share_heads (a
 * shared layer's arena is laid out step by step).
 * fn (may be NULL) gets each token's logits, block by block after each
 * block; s->logits holds the last token's.
 * Refuses KVE_EINVAL (nothing changed) for NULL s, NULL tokens with n > 0, a
 * broken decoder, a token outside [0, V) (all checked first) and positions
 * past INT32_MAX. KVE_ENOMEM for the block's buffers and caches (taken
 * before a block starts, room for every key the block can add): the tokens
 * of earlier blocks are decoded, the state is as after them and fn has seen
 * them. A failure inside a block (KVE_ERANGE, as lm_forward's, a policy's
 * refusal, or a cache that must still grow there) leaves the state broken;
 * its message names the first failure in the block's order (layer by
 * layer), which may be another (position, layer) than token by token's.
 * Memory: the block buffers, about B * (4 D + 2 F + V) floats. */
kve_status lm_forward_batch(lm_state *s, const int32_t *tokens, size_t n, lm_logits_fn fn,
                            void *user);

/* Prefill: decodes the prompt tokens[0 .. n) from position 0 of a fresh
 * decoder (one with a policy, at position 0) with every key kept, then
 * compresses every (layer, KV head) cache to the budget in one go, so the
 * decoding that follows (lm_forward) starts from a compressed prompt:
 *   options != NULL: kve_bank_prefill with that method, from the attention
 *       rows recorded while decoding the prompt (for each query head, all n
 *       rows for H2O, the last w for SnapKV; over keys 0 .. t, the own key
 *       included), each KV head's group reduced by the mean as the step
 *       does; the policies are not stepped during the prompt. Needs a policy
 *       scored from attention.
 *   options == NULL: the policy's own scores, taken once: every prompt
 *       position is stepped (attention and keys as in lm_forward) without
 *       evicting, then each head is evicted to the budget in one call
 *       (several victims at once). For knorm and keydiff this is kvpress's
 *       KnormPress and KeyDiffPress applied to the prompt.
 * Each layer's heads are compressed to that layer's budget (s->layer_budget;
 * with share_heads each head to the layer's even share, which the shared
 * evictions of the decode steps then move between heads).
 * The logits after the last prompt token (s->logits) are those of the
 * uncompressed prompt, as an engine's prefill gives them.
 * Refuses (KVE_EINVAL, nothing changed): NULL s or tokens, n 0, a decoder
 * without a policy or not at position 0, a token outside the vocabulary,
 * and what kve_bank_prefill refuses of options (checked before any token is
 * decoded). KVE_ENOMEM (nothing changed) when the rows (L*H*r*n floats)
 * cannot be allocated. A failure while decoding leaves the state broken, as
 * lm_forward's. Memory: the caches grow to n keys during the prompt. */
kve_status lm_prefill(lm_state *s, const int32_t *tokens, size_t n,
                      const kve_prefill_options *options);

/* KVzip (Kim et al. 2025, arXiv 2505.23416; kvpress's KVzipPress): the
 * reconstruction prompts and chunking of lm_prefill_kvzip. */
enum { LM_KVZIP_PROMPT_MAX = 128 };
typedef struct lm_kvzip {
    int32_t first[LM_KVZIP_PROMPT_MAX]; /* before the first chunk's repeat: "\n\nRepeat the
                                           previous context exactly." then "\n" */
    size_t n_first;
    int32_t later[LM_KVZIP_PROMPT_MAX]; /* before a later chunk's: "\n\nRepeat the part of
                                           the previous context exactly, starting with" */
    size_t n_later;
    int32_t newline; /* after `later` and the previous chunk's last `overlap` tokens */
    size_t chunk;    /* prompt positions a chunk (default 2048, kvpress's chunk_size) */
    size_t overlap;  /* the previous chunk's tokens quoted (default 8, prev_postfix_size) */
    int plus;        /* 1: KVzip+ (kvpress's kvzip_plus_normalization): each scoring
                        weight divided by the norm of its query token's attention
                        input and multiplied by ||W_o,h v_i||, the key's value through
                        the query head's slice of the output projection; default 0 */
} lm_kvzip;

/* The prompts above encoded with `t` (lm_encode, so each begins with the
 * dummy-prefix space; newline the token "\n" encodes to after it, a byte
 * token if `t` has no such piece), chunk 2048, overlap 8. What lm_encode
 * refuses (KVE_EFORMAT, KVE_ENOMEM), KVE_ERANGE when a prompt needs more
 * than LM_KVZIP_PROMPT_MAX tokens. */
kve_status lm_kvzip_default(const lm_tokenizer *t, lm_kvzip *out);

/* KVzip's prefill: decodes the prompt tokens[0 .. n) with every key kept
 * (as lm_prefill), then, chunk by chunk (chunk c the prompt positions
 * [p + c*chunk, p + (c+1)*chunk) ∩ [p, n), p = 1 when tokens[0] is the model's BOS: the
 * prefix not repeated, as kvpress leaves a chat template's prefix out; else
 * 0), decodes the reconstruction sequence teacher-forced at positions n,
 * n+1, ...: `first` (chunk 0) or `later`, the previous chunk's last
 * `overlap` tokens and `newline` (later chunks), then the chunk's own
 * tokens. Each of those queries, in every layer and query head, scores the
 * chunk's keys by its softmax over the first min(options->sinks, chunk
 * start) positions, the chunk and the reconstruction keys up to its own
 * (kvpress's score_kvzip); a position's score is the largest weight any of
 * them gives it, over the query heads of its KV head's group
 * (kve_bank_prefill with KVE_PREFILL_KVZIP, r = 1, KVE_REDUCE_MAX). The
 * reconstruction's keys and values are dropped after each chunk, the caches
 * cut to each head's budget by that score (the first options->sinks kept),
 * and position and logits are those after the prompt's last token, as
 * lm_prefill leaves them: decoding goes on at position n. With kz->plus
 * (KVzip+), each weight is first scaled as kvpress's
 * kvzip_plus_normalization scales it (lm_kvzip.plus), in float32.
 * options: method KVE_PREFILL_KVZIP (queries is set to 1 here); NULL for
 *      the defaults with that method. options->budgets across heads
 *      (kvpress's layerwise=True: KVE_PREFILL_PER_LAYER, each layer's G heads
 *      keeping G * its budget together; KVE_PREFILL_OVERALL, kvpress's
 *      default: one threshold over every layer's heads) need opt.share_heads
 *      (the decode then keeps each layer's total: G times its budget, or
 *      under OVERALL what the layer kept, layer_keep) and no head_budgets;
 *      OVERALL also needs every layer at the same budget. options->prefix
 *      (kvpress's sinks) as kve_prefill_options says; the decoder's own
 *      prefix is the BOS (prefix 1).
 * Refuses (KVE_EINVAL, nothing changed) what lm_prefill refuses, NULL kz, a
 * chunk of 0, an overlap above the chunk or above LM_KVZIP_PROMPT_MAX, a
 * prompt token outside the vocabulary, another method, budgets across heads
 * without share_heads (or with head_budgets, or OVERALL over layers of
 * different budgets). KVE_ENOMEM (nothing changed) for the L*H*n scores
 * (KVzip+: twice that). Cost: about one more prefill (n + the
 * prompts' tokens more decode steps) plus O(H * (sinks + chunk + m)) a
 * reconstruction step and layer; memory: the caches grow to n + chunk +
 * the prompt's tokens during it. */
kve_status lm_prefill_kvzip(lm_state *s, const int32_t *tokens, size_t n, const lm_kvzip *kz,
                            const kve_prefill_options *options);

/* ---- retrieval and streaming heads (heads.c) ---------------------------------
 *
 * A DuoAttention schedule (Xiao et al. 2024, arXiv 2410.10819): which
 * (layer, KV head) of a model retrieves (keeps a large budget or the whole
 * cache) and which streams (sinks and a recent window), as `kvevict lm
 * duo-calibrate` measures it and writes it. The text format
 * (docs/duo.md):
 *   # comments and blank lines anywhere
 *   kvevict-heads 1
 *   layers L kv_heads G
 *   head LAYER KV_HEAD retrieval|streaming SCORE
 *   ... exactly L*G head lines, each (layer, KV head) once, any order;
 *   SCORE a finite decimal (what the calibration measured), not read by the
 *   decoder. Lines end in "\n" (a final one may lack it; "\r\n" is refused).
 */

enum { LM_HEADS_MAX = 65536 }; /* layers * kv_heads at most */

typedef struct lm_heads {
    int32_t layers, kv_heads;
    unsigned char *retrieval; /* (layers * kv_heads) 1 retrieval, 0 streaming */
    double *score;            /* (layers * kv_heads) */
    kve_allocator alloc;
} lm_heads;

/* Parses text[0 .. len) (need not be NUL-terminated). KVE_EFORMAT naming
 * the line and field for anything else than the format above; KVE_ENOMEM.
 * *out untouched on failure. Free with lm_heads_free (NULL is fine). */
kve_status lm_heads_parse(const char *text, size_t len, const kve_allocator *allocator,
                          lm_heads **out);
void lm_heads_free(lm_heads *h);

/* The per-head budgets of `h` at the same memory as every head at `budget`
 * (L*G*budget positions in all): k retrieval heads get
 * Br = min(context, floor((L*G*budget - (L*G - k) * streaming) / k)) each,
 * the streaming heads the rest evenly, floor((L*G*budget - k*Br) / (L*G -
 * k)), at least `streaming` (no retrieval head: all get budget; every one:
 * all get min(context, budget)). out: L*G budgets, layer-major. Refuses
 * KVE_EINVAL when h does not match the model's L and G, budget or streaming
 * is 0, or streaming exceeds budget. */
kve_status lm_heads_budgets(const lm_heads *h, const lm_config *c, size_t budget,
                            size_t streaming, size_t context, size_t *out);

/* xout (d) = W (d, n) @ x (n) for float32 W: the plain reference of the
 * float32 products (the order every float product below keeps), each dot
 * product summed in 8 lanes, lane k taking the elements i = k mod 8 in
 * order, then ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)) plus the
 * n mod 8 last products summed in order. */
void lm_matmul(float *xout, const float *x, const float *w, size_t n, size_t d);

/* ---- matrix-vector products over stored types (matvec.c, pool.c) ----------
 *
 * Every type has a plain reference (lm_matvec_ref) and a vectorised kernel
 * per instruction set, chosen once at run time from the CPU (AVX-512 F, BW,
 * VL and DQ, else AVX2 with F16C, else the portable code) and equal to the
 * reference bit for bit (tests/test_lm_matvec.c forces each in turn):
 *   F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K,
 *       IQ4_NL, IQ4_XS: the row dequantized (exactly as lm_matrix_row does)
 *       and dotted with x in lm_matmul's order, so these give the bits of
 *       the float32 product over the dequantized weights;
 *   Q8_0, Q4_K and LM_I8G (integer products): x quantized as
 *       lm_quantize_q8 does (groups of 32 for Q8_0 and Q4_K, of the format's
 *       group size for LM_I8G); per group g the exact integer sums s_k of
 *       q_w * q_x over the elements j with (j mod 32) / 4 = k, k < 8, then
 *       lane k += (float)s_k * (d_w * d_x) in group order, the lanes combined
 *       as lm_matmul's. Q4_K's group is a sub-block j, its weights d * sc_j
 *       * q - dmin * m_j with q the nibble: lane k += (float)s_k * ((d *
 *       sc_j) * d_x) - (float)t_k * ((dmin * m_j) * d_x), t_k the sum of q_x
 *       over the same elements (llama.cpp's Q4_K products also quantize the
 *       input, in blocks of 256).
 *       Quantizing x costs accuracy, bounded in the tests: per group at most
 *       d_x / 2 an element (docs/decoder.md).
 */

typedef enum lm_isa { LM_ISA_SCALAR, LM_ISA_AVX2, LM_ISA_AVX512, LM_ISA_COUNT } lm_isa;

/* The instruction set in use (detected at the first call, then fixed), its
 * name ("scalar", "avx2", "avx512"), whether this CPU and build can run one,
 * and a test hook that makes later calls use `isa` (LM_ISA_COUNT: the
 * detected one again; 0 and nothing changed when unsupported; not while
 * other threads decode). */
lm_isa lm_isa_active(void);
const char *lm_isa_name(lm_isa isa);
int lm_isa_supported(lm_isa isa);
int lm_isa_force(lm_isa isa);

/* An activation quantized per group of `group` values: d = max |x| / 127 in
 * float32, q = x / d rounded to the nearest integer (ties to even); a group
 * of zeros has d = 0 and q = 0, a group holding NaN or an infinity d = NaN
 * (the products then give NaN, as float weights would) and q = 0.
 * n % group == 0. */
void lm_quantize_q8(const float *x, size_t n, size_t group, int8_t *q, float *d);

/* The quantized input of the integer kernels: q (cols), d (cols / group). */
typedef struct lm_q8 {
    const int8_t *q;
    const float *d;
    size_t group;
    int fused; /* an lm_llama_cpu other than AUTO (LM_PRODUCTS_LLAMA): every row in
                  the order llama.cpp's CPU variant sums it (matvec.c's ORD_*: the
                  vec_dot functions, the repacked gemv, per type); 0: the exact
                  products' order */
    const float *s; /* fused: (cols / 32) Q8_1's float16(d * sum of q) a block, the
                       unrounded d's (quantize_row_q8_1); NULL when no Q4_1 or Q5_1
                       row reads it */
} lm_q8;

/* The bytes of w's packed copy (lm_matrix.packed), 0 when w has none
 * (lm_model_pack), and the copy written to dst (that many bytes). */
size_t lm_matrix_pack_bytes(const lm_matrix *w);
void lm_matrix_pack(const lm_matrix *w, unsigned char *dst);

/* Whether products with w read a quantized input, and its group size. */
size_t lm_matrix_q8_group(const lm_matrix *w);

/* llama.cpp's arithmetic (lm_options.products = LM_PRODUCTS_LLAMA): its CPU
 * back end multiplies a weight type by the input converted to that type's
 * vec_dot_type, and so does the decoder then:
 *   LM_IN_F16   F16 weights: x rounded to float16 (lm_f32_to_f16)
 *   LM_IN_BF16  BF16 weights: x rounded to bfloat16
 *   LM_IN_Q8_0  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL: blocks of 32 as
 *               quantize_row_q8_0 (x86): amax = max |x|, d = float16(amax /
 *               127), q = x * (127 / amax) rounded (ties to even)
 *               (quantize_row_q8_1, Q4_1's and Q5_1's, the same d and q)
 *   LM_IN_Q8_K  Q2_K .. Q6_K, IQ4_XS: blocks of 256 as quantize_row_q8_K:
 *               m = the entry of largest |x| (the first), s = -127 / m, q =
 *               min(127, s x rounded), d = 1 / s, in float32
 *   LM_IN_F32   F32 weights: x as it is
 *   LM_IN_NATIVE I8G (llama2.c's runq.c, which llama.cpp does not read:
 *               lm_quantize_q8), as in the exact products.
 * lm_llama_quantize writes x's conversion: xt (n floats) the converted
 * values (q * d), and for Q8_0 and Q8_K q (n) and d (n / 32, Q8_K's d
 * repeated over its 8 groups of 32) for the integer kernels; for Q8_0, when
 * s is not NULL, s (n / 32) Q8_1's float16(d * sum of q), d unrounded. A block
 * holding NaN or an infinity gets d = NaN, q = 0 and xt = NaN. The
 * float kernels' sums of w * xt differ from llama.cpp's integer sums only
 * in the order of float additions; Q8_0, Q5_0, Q4_1 and Q5_1 rows follow
 * its order exactly (lm_q8.fused). */
typedef enum lm_llama_in {
    LM_IN_NATIVE = 0,
    LM_IN_F16,
    LM_IN_BF16,
    LM_IN_Q8_0,
    LM_IN_Q8_K,
    LM_IN_F32
} lm_llama_in;
lm_llama_in lm_llama_input(lm_dtype type);
void lm_llama_quantize(lm_llama_in kind, const float *x, size_t n, float *xt, int8_t *q, float *d,
                       float *s);

/* out[i] = (row r0 + i of w) . x for r0 <= r0 + i < r1: the reference
 * (plain loops) and the kernel of `isa` (LM_ISA_COUNT: the active one).
 * xq: the quantized x when lm_matrix_q8_group(w) > 0, else unused. */
void lm_matvec_ref(const lm_matrix *w, const float *x, const lm_q8 *xq, float *out, size_t r0,
                   size_t r1);
void lm_matvec_rows(const lm_matrix *w, const float *x, const lm_q8 *xq, float *out, size_t r0,
                    size_t r1, lm_isa isa);

/* A pool of threads - 1 workers and the caller (pool.c). lm_pool_run calls
 * fn(arg, part, parts) for every part < parts = threads, part 0 on the
 * caller, and returns when all have returned; one run at a time (callers on
 * several threads take turns). A NULL pool runs fn(arg, 0, 1). Workers wait
 * on a condition variable between runs. KVE_EINVAL for threads 0 or above
 * LM_MAX_THREADS, KVE_ENOMEM or KVE_EIO when a thread cannot start. The
 * pool's memory comes from `allocator` (NULL: the C library's). */
enum { LM_MAX_THREADS = 256 };
typedef struct lm_pool lm_pool;
typedef void (*lm_job_fn)(void *arg, size_t part, size_t parts);
kve_status lm_pool_new(size_t threads, const kve_allocator *allocator, lm_pool **out);
void lm_pool_free(lm_pool *p);
void lm_pool_run(lm_pool *p, lm_job_fn fn, void *arg);
/* The processors this process may run on (at least 1): the CLI's default
 * --threads. */
size_t lm_cores(void);

/* out_k (rows of w_k) = w_k . x for k < n (n <= 4, every w_k of x's
 * length), the rows of all of them split into `pool`'s parts by row
 * (contiguous ranges of the concatenated rows, so a part may span two
 * matrices); every row's value is the same for any pool. Products of fewer
 * than 2^20 weights in all run on the caller (waking a worker costs more).
 * xq: x quantized, when a w_k needs it. */
typedef struct lm_product {
    const lm_matrix *w;
    float *out;
} lm_product;
void lm_matvec(lm_pool *pool, const lm_product *p, size_t n, const float *x, const lm_q8 *xq);

/* Matrix-matrix products: nc input columns x (nc, cols), column c at x + c
 * * cols (xq[c] its quantized form when w needs one, else xq NULL), and
 * out[c * ldo + (r - r0)] = (row r of w) . column c for r0 <= r < r1:
 * every value the bits lm_matvec_rows gives that row and column on `isa`,
 * by the same operations in the same order, while each weight is read
 * once for all nc columns (tiles of rows and columns, a row dequantized
 * once for every column). A type or order without a tile kernel runs
 * lm_matvec_rows column by column. tests/test_lm_matvec.c holds each to
 * lm_matvec_rows and lm_matvec_ref. */
void lm_matmat_rows(const lm_matrix *w, const float *x, const lm_q8 *xq, size_t nc, float *out,
                    size_t ldo, size_t r0, size_t r1, lm_isa isa);
/* lm_matvec for nc columns: p[k].out (nc, rows of w_k), column c at
 * p[k].out + c * rows; the rows split over `pool` as lm_matvec splits them,
 * the caller alone below 2^20 weights times columns. */
void lm_matmat(lm_pool *pool, const lm_product *p, size_t n, const float *x, const lm_q8 *xq,
               size_t nc);

/* Kept positions of (layer, KV head) now. */
size_t lm_state_kept(const lm_state *s, int32_t layer, int32_t kv_head);

/* ---- evaluation (eval.c) ---------------------------------------------------- */

/* The loss of a window: a fresh cache (lm_state_reset), BOS (config.bos),
 * then tokens[0 .. n); returns in *nats the sum over i < n of
 * -log softmax(logits after BOS + tokens[0 .. i))[tokens[i]], the
 * log-sum-exp in double. per_token (n, may be NULL) gets each term. A model
 * without BOS (config.bos -1) decodes tokens[0] as context: the sum runs
 * over 1 <= i < n, per_token[0] = 0. */
kve_status lm_window_nats(lm_state *s, const int32_t *tokens, size_t n, double *nats,
                          double *per_token);

/* -log softmax(logits)[target] with the log-sum-exp in double; NAN for a
 * target outside [0, vocab). */
double lm_token_nats(const float *logits, int32_t vocab, int32_t target);

/* ---- budgets (budgets.c) ------------------------------------------------------ */

/* The calibration statistic of the weighted layer schedule: for each layer
 * l, out[l] is the mean, over the steps t > window of BOS (config.bos; none
 * when -1) + tokens[0 .. n) decoded with the full cache and over the layer's KV heads, of the
 * attention mass (the group mean the policies receive) on keys older than
 * the newest `window` before the query's own: sum over i < t - window of
 * p_t(i). The mass a layer spreads beyond a recent window of that size.
 * Refuses KVE_EINVAL for NULL arguments or n <= window (no step measured),
 * KVE_ENOMEM. Allocates from the model's allocator. */
kve_status lm_layer_spread(const lm_model *m, const int32_t *tokens, size_t n, size_t window,
                           double *out);

/* For decode.c: the layer budgets and bank options of a new state (s->spec
 * and s->opt set; fills s->layer_budget and s->budget, and s->arena with
 * share_heads), the spec the bank is built from (its budget the largest
 * layer budget, which sizes its slots), and room for `extra` more keys in
 * every cache of layer l of a shared state (1 before a step; a block's
 * tokens before a block that evicts nothing), the arena laid out again or
 * grown, all or nothing. */
kve_status lm__budgets_init(lm_state *s);
kve_status lm__bank_spec(const lm_state *s, char *out, size_t cap);
kve_status lm__arena_reserve(lm_state *s, size_t l, size_t extra);
void lm__arena_free(lm_state *s);

/* ---- sampling (sample.c, docs/decoder.md "Sampling") ------------------------
 *
 * llama.cpp's sampler chain with its spellings and definitions: banned
 * tokens removed; the repetition penalty on each distinct token of the last
 * repeat_last_n (a logit > 0 divided by it, one <= 0 multiplied); greedy
 * when temperature <= 0 (the first maximum), else top-k by logit, top-p on
 * the softmax of the survivors (before the temperature, as in llama.cpp's
 * chain), the temperature, and one draw from the softmax of what is left.
 */

typedef struct lm_sampler_params {
    double temperature;     /* <= 0: greedy (the default here; llama.cpp's is 0.8) */
    int32_t top_k;          /* 0: off; llama.cpp's default 40 */
    double top_p;           /* in (0, 1]; 1: off; llama.cpp's default 0.95 */
    double repeat_penalty;  /* > 0; 1: off (llama.cpp's default 1.0) */
    int32_t repeat_last_n;  /* tokens the penalty looks back over; llama.cpp's 64 */
} lm_sampler_params;

typedef struct lm_candidate { /* a token of the chain, 8 bytes */
    int32_t id;
    float logit;
} lm_candidate;

/* The defaults above: greedy, top-k 40, top-p 0.95, penalty 1 over 64. */
lm_sampler_params lm_sampler_default_params(void);
/* KVE_EINVAL naming the first parameter out of its range (temperature in
 * [0, 1e6], top_k >= 0, top_p in (0, 1], repeat_penalty in (0, 1e6]). */
kve_status lm_sampler_check(const lm_sampler_params *p);
/* The next token after `logits` (V = vocab), `recent` (n_recent tokens,
 * oldest first, may be NULL: what the penalty looks back over) and
 * banned[id] != 0 (may be NULL) never chosen. Draws kve_rng_uniform(rng)
 * exactly once when the temperature is positive, never when greedy; so the
 * same inputs and generator state give the same token and state on every
 * machine (ties broken by the lower id). scratch: V candidates. -1 when
 * every token is banned. p must pass lm_sampler_check. O(V log K) with
 * top-k K (O(V log V) without); no allocation. */
int32_t lm_sample(const lm_sampler_params *p, const float *logits, int32_t vocab,
                  const unsigned char *banned, const int32_t *recent, size_t n_recent,
                  kve_rng *rng, lm_candidate *scratch);
/* mask[i] = 1 for the reserved pass-key pieces "<keyNN>" (two digits) of
 * t, else 0 (t->n_pieces entries); returns how many. */
size_t lm_reserved_tokens(const lm_tokenizer *t, unsigned char *mask);

/* ---- forks, rewinds and sessions (session.c, docs/decoder.md "Sessions") ---- */

/* dst takes src's exact decoding state: position, every (layer, KV head)
 * cache's kept keys and values, the bank (kve_bank_copy) and the logits,
 * so both continue bit-identically (a fork for parallel sampling; a
 * checkpoint and its restore for a rewind). dst must be a decoder over the
 * same model with the same canonical spec, positions, layer budgets and
 * sharing; otherwise KVE_EINVAL naming the difference, nothing changed;
 * also refused: NULL, src == dst, a broken or prefilling src. KVE_ENOMEM
 * leaves dst's state as it was. No allocation when dst's caches are at
 * least src's (a restore from a checkpoint copied from dst's own line). */
kve_status lm_state_copy(lm_state *dst, const lm_state *src);

/* FNV-1a (64 bits) of the checkpoint's bytes, as parsed: what a session
 * names its model by. O(file size). */
uint64_t lm_model_fingerprint(const lm_model *m);

/* What a session holds besides the decoder's state. */
typedef struct lm_session {
    int32_t *tokens;  /* (n_tokens) every token decoded, BOS first: position i holds tokens[i] */
    size_t n_tokens;  /* = the decoder's position */
    kve_rng rng;      /* the sampler's generator */
} lm_session;

/* The session image of decoder s with ss (ss->n_tokens == s->pos; s's
 * logits, those after the last token, are saved with it), as
 * docs/decoder.md lays it out byte for byte: versioned, little-endian,
 * FNV-1a checksummed. buf NULL: *size gets the size. KVE_ERANGE when cap
 * is too small (*size: what it needs); KVE_EINVAL for NULL, a broken
 * decoder, a count that is not the position, tokens outside the
 * vocabulary. Reads s only; allocates nothing. */
kve_status lm_session_save(const lm_state *s, const lm_session *ss, void *buf, size_t cap,
                           size_t *size);
/* Loads a session image into s, a decoder at position 0 built with the
 * options the caller means to continue with. Every byte is validated
 * before s changes: magic, version, length, checksum, the model
 * (fingerprint and dimensions), the policy (canonical spec), positions,
 * layer budgets and sharing against s's own, the bank's image
 * (kve_bank_load) and each cache against it (the same kept positions),
 * tokens in the vocabulary, keys and values finite. Refusals are
 * KVE_EFORMAT for a malformed image, KVE_EINVAL for one from another model
 * or other options, each naming the field or the mismatch ("policy: the
 * session's is 'window:budget=8', this decoder's 'h2o:...'"); then s and
 * *out are untouched. On success s is at position out->n_tokens with the
 * saved caches, bank and logits, and out->tokens comes from s's allocator (free
 * with lm_free(&s->alloc, ...)). KVE_ENOMEM. O(size). */
kve_status lm_session_load(lm_state *s, const void *buf, size_t size, lm_session *out);

/* The fixed part of a session image: what lm_session_size reads. */
#define LM_SESSION_HEADER 120
/* The size a session image states, from its first n bytes (n >=
 * LM_SESSION_HEADER; with the spec after the header when n holds it, so
 * that a refusal can name the policy), so that a file is read only up to
 * what it claims (lm_read_file_max): magic and version checked, the token
 * count N no more than a decoder reaches (INT32_MAX - 1), and the size no
 * more than the largest session decoder s could write after N tokens (its
 * spec and layer budgets, N tokens, the logits, its bank's image with
 * every head keeping N positions, every cache holding N keys and values),
 * so that a header stating more (a forged or damaged one, or one over an
 * endless stream) is refused before anything is read: KVE_EFORMAT, naming
 * both sizes, or, when the header is of another model or options (whose
 * bound is not s's), KVE_EINVAL naming the difference as lm_session_load
 * does. KVE_ENOMEM (the bound reads s's bank image). Reads s only. */
kve_status lm_session_size(const lm_state *s, const void *head, size_t n, size_t *size);

/* ---- the attention as a live trace (trace.c) ---------------------------------- */

typedef struct lm_trace_options {
    const kve_trace_options *trace; /* the trace's options (allocator, flags); NULL: the
                                       defaults. The decoder allocates from the same
                                       allocator */
    size_t group;  /* query heads averaged per row: 1 (every query head, H rows per
                      layer) or R = H / G (each KV head's group mean, what the policies
                      receive); 0 (the default): R */
    int own_model; /* 1: the trace frees the model (lm_model_free) with itself; 0: the
                      model is borrowed and must outlive the trace */
    size_t cache_bytes; /* the rows of the first steps kept as they are decoded, up to
                           this many bytes (L * (H / group) * s(s+1)/2 floats for s
                           steps), for readers that go back; 0 (the default): none */
} lm_trace_options;

/* The full-cache attention of decoding tokens[0 .. steps) with `m` as a live
 * trace (kve_trace_from_callback): L * (H / group) heads, layer-major, row t
 * of head (l, j) the weights query t pays keys 0 .. t in layer l (head j's
 * group mean): the rows `kvevict lm dump` writes, bit for bit, streamed into
 * the reader as the decoder computes them. Step t is decoded when it is
 * first read; a reader that goes back to an earlier step gets it from the
 * row cache when options->cache_bytes holds it, and otherwise makes the
 * decoder start over from token 0 (the same bits again), so without a cache
 * the fast path reads the heads of each step before the next step (kve_eval
 * over every head).
 * Refuses KVE_EINVAL (NULL arguments, steps 0, a token outside the
 * vocabulary, a group other than 1 or R) and what kve_trace_from_callback
 * and lm_state_new refuse; nothing is kept on failure (the model stays the
 * caller's). Memory: the decoder's full cache (O(L * G * steps * S)), the
 * tokens, one step of every head (the trace's) and the row cache, allocated
 * now (KVE_ENOMEM when it cannot be). */
kve_status lm_trace_new(lm_model *m, const int32_t *tokens, size_t steps,
                        const lm_trace_options *options, kve_trace **out);

#endif /* KVE_LM_H */
