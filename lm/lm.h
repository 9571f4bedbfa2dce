/*
 * lm.h - a llama2.c decoder whose KV cache kvevict manages.
 *
 * The decoder is a client of the public header only (include/kvevict.h), the
 * way an inference engine would be: one kve_policy per (layer, KV head),
 * stepped with the real attention of the model and obeyed by compacting the
 * cache. It is a small static library (kvevict_lm) used by `kvevict lm ...`,
 * `kvevict generate` and the tests; it is not installed.
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

/* ---- checkpoints (model.c) ------------------------------------------------
 *
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
 * Every header field is validated and the file must be exactly as long as
 * the header says.
 */

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
    int version;           /* 0 legacy, 1 version 1 */
} lm_config;

typedef struct lm_weights {       /* all pointers into the mapped file */
    const float *token_embedding; /* (V, D) */
    const float *rms_att;         /* (L, D) */
    const float *wq;              /* (L, H*S, D) */
    const float *wk;              /* (L, G*S, D) */
    const float *wv;              /* (L, G*S, D) */
    const float *wo;              /* (L, D, H*S) */
    const float *rms_ffn;         /* (L, D) */
    const float *w1;              /* (L, F, D) */
    const float *w2;              /* (L, D, F) */
    const float *w3;              /* (L, F, D) */
    const float *rms_final;       /* (D) */
    const float *wcls;            /* (V, D): token_embedding when shared */
} lm_weights;

typedef struct lm_model {
    lm_config config;
    lm_weights weights;
    void *map; /* the mmapped file; NULL for lm_model_from_memory */
    size_t map_size;
    kve_allocator alloc; /* the handle's, and lm_layer_spread's scratch (a copy) */
} lm_model;

/* mmaps `path` and validates it; the handle comes from `allocator` (NULL:
 * the C library's). KVE_EIO (with strerror) when the file cannot be opened,
 * stat'ed or mapped; KVE_EFORMAT naming the field for a malformed or
 * truncated file; KVE_ENOMEM. *out untouched on failure. */
kve_status lm_model_open(const char *path, const kve_allocator *allocator, lm_model **out);
/* The same over caller memory (4-byte aligned, KVE_EINVAL otherwise), which
 * must outlive the model. */
kve_status lm_model_from_memory(const void *data, size_t size, const kve_allocator *allocator,
                                lm_model **out);
void lm_model_free(lm_model *m);

/* ---- tokenizer (tokenizer.c) ----------------------------------------------
 *
 * llama2.c's tokenizer.bin: int32 max_token_length, then until the end of
 * the file, per piece: float32 score, int32 length, `length` bytes. Piece 1
 * is BOS, pieces 3 + b are the bytes b ("<0xHH>"). Encoding and decoding are
 * run.c's (see docs/decoder.md).
 */

enum { LM_BOS = 1, LM_EOS = 2 };

typedef struct lm_tokenizer {
    int32_t n_pieces;
    int32_t max_token_length;       /* as the file says: no piece is longer */
    int32_t longest;                /* the longest piece's length: what buffers are sized by */
    const char **piece;             /* (n_pieces) pointers into `bytes`, not NUL-terminated */
    int32_t *len;                   /* (n_pieces) */
    float *score;                   /* (n_pieces) */
    int32_t *sorted;                /* (n_pieces) ids by (bytes, id): the lookup table */
    char *bytes;                    /* every piece, back to back */
    unsigned char byte_pieces[256]; /* byte b at [b]: what "<0xHH>" decodes to */
    kve_allocator alloc;            /* every block of the tokenizer and of lm_encode (a copy) */
} lm_tokenizer;

/* Reads and validates a tokenizer.bin, allocating from `allocator` (NULL:
 * the C library's): KVE_EIO, KVE_EFORMAT naming the piece and field,
 * KVE_ENOMEM. */
kve_status lm_tokenizer_open(const char *path, const kve_allocator *allocator, lm_tokenizer **out);
kve_status lm_tokenizer_from_memory(const void *data, size_t size, const kve_allocator *allocator,
                                    lm_tokenizer **out);
void lm_tokenizer_free(lm_tokenizer *t);

/* Encodes text[0 .. len) as run.c does with bos = eos = 0: the dummy prefix
 * " " when len > 0, one token per UTF-8 code point found among the pieces,
 * byte fallback (byte + 3) otherwise, then repeated merges of the adjacent
 * pair whose concatenation is the highest-scoring piece (the leftmost on
 * ties). At most len + 1 tokens. Writes *n tokens to tokens[0 .. cap).
 * KVE_ERANGE when cap is too small; KVE_EFORMAT when a byte has no piece
 * (vocabulary smaller than 259); KVE_ENOMEM. O(len log len). */
kve_status lm_encode(const lm_tokenizer *t, const char *text, size_t len, int32_t *tokens,
                     size_t cap, size_t *n);
/* The bytes `token` stands for after `prev` (run.c's decode): a piece
 * "<0xHH>" is the one byte HH; after BOS a leading space is dropped.
 * Returns a pointer (not NUL-terminated) and its length in *len; NULL for a
 * token out of range. */
const char *lm_decode(const lm_tokenizer *t, int32_t prev, int32_t token, size_t *len);
/* The id of the piece whose bytes are exactly `piece` (the lowest id if
 * several), -1 if none. */
int32_t lm_piece_id(const lm_tokenizer *t, const char *piece, size_t len);

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
    const size_t *head_budgets;  /* (L*G) each (layer, KV head)'s own budget,
                                    layer-major (a DuoAttention schedule, lm_heads_budgets);
                                    read by lm_state_new only; NULL: the layer
                                    budgets. Not with share_heads or a non-uniform
                                    schedule; each at least the spec's smallest
                                    budget (kve_spec_min_budget) */
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
    float *krot;       /* (ld, S) keys rotated at their cache index (cache positions) */
    float *rope_table; /* (ld, S) cos, sin per cache index (cache positions) */
    size_t rope_rows;  /* rows of rope_table filled */
    int32_t *victims;  /* (G, ld) */
    size_t *counts;    /* (G) victims, then keys per KV head */
    /* prefill (lm_prefill), between its first and last token */
    int prefilling;    /* 1: record rows, step without evicting (or not at all) */
    int pf_method;     /* 1: kve_bank_prefill reads pf_rows; 0: step, evict once */
    size_t pf_n;       /* n, the prompt's tokens */
    size_t pf_r;       /* rows recorded per query head: queries n-r .. n-1 */
    float *pf_rows;    /* (L, H, r, n) the recorded rows over keys 0 .. t; KVzip:
                          (L, H, 1, n) the running maximum of the scoring weights */
    /* KVzip's reconstruction pass (lm_prefill_kvzip), while it runs */
    int kz_active;     /* 1: attend() scores the prompt's chunk [kz_start, kz_end) */
    size_t kz_start, kz_end, kz_sinks;
    /* the step data of a policy that reads queries or values (decode.c) */
    kve_reads reads;   /* what the policy reads (KVE_READS_NOTHING without one) */
    size_t value_dim;  /* the floats of a value it is handed: S (expected_attention,
                          the raw value) or R*D (vnorm=1: CriticalKV's W_o v); 0
                          when it reads neither queries nor values */
    float *wov;        /* (G, R*D) with value_dim R*D: each KV head's value through
                          the output projection's slices of its R query heads */
} lm_state;

/* The base of the rotary embedding's frequencies: llama2.c's run.c
 * hard-codes 10000, and every checkpoint this decoder reads uses it. */
#define LM_ROPE_BASE 10000.0f

/* The decoder's rotary embedding as kvevict describes one (kve_rope): every
 * dimension of a head (rotary_dim = head_size), base LM_ROPE_BASE, adjacent
 * pairs (2j, 2j+1), as run.c rotates them. */
kve_rope lm_rope(const lm_config *c);

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
 * cache cannot grow, KVE_EINVAL when a policy refuses the attention (a NaN
 * from the weights): both leave the state broken until lm_state_reset. */
kve_status lm_forward(lm_state *s, int32_t token);

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
} lm_kvzip;

/* The prompts above encoded with `t` (lm_encode, so each begins with the
 * dummy-prefix space; newline the token "\n" encodes to after it, a byte
 * token if `t` has no such piece), chunk 2048, overlap 8. What lm_encode
 * refuses (KVE_EFORMAT, KVE_ENOMEM), KVE_ERANGE when a prompt needs more
 * than LM_KVZIP_PROMPT_MAX tokens. */
kve_status lm_kvzip_default(const lm_tokenizer *t, lm_kvzip *out);

/* KVzip's prefill: decodes the prompt tokens[0 .. n) with every key kept
 * (as lm_prefill), then, chunk by chunk (chunk c the prompt positions
 * [p + c*chunk, p + (c+1)*chunk) ∩ [p, n), p = 1 when tokens[0] is BOS: the
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
 * lm_prefill leaves them: decoding goes on at position n.
 * options: method KVE_PREFILL_KVZIP (queries is set to 1 here); NULL for
 *      the defaults with that method.
 * Refuses (KVE_EINVAL, nothing changed) what lm_prefill refuses, NULL kz, a
 * chunk of 0, an overlap above the chunk or above LM_KVZIP_PROMPT_MAX, a
 * prompt token outside the vocabulary, another method. KVE_ENOMEM (nothing
 * changed) for the L*H*n scores. Cost: about one more prefill (n + the
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

/* xout (d) = W (d, n) @ x (n): the decoder's one matrix kernel, every dot
 * product summed in 8 lanes in a fixed order (vectorised by the compiler). */
void lm_matmul(float *xout, const float *x, const float *w, size_t n, size_t d);

/* Kept positions of (layer, KV head) now. */
size_t lm_state_kept(const lm_state *s, int32_t layer, int32_t kv_head);

/* ---- evaluation (eval.c) ---------------------------------------------------- */

/* The loss of a window: a fresh cache (lm_state_reset), BOS, then
 * tokens[0 .. n); returns in *nats the sum over i < n of
 * -log softmax(logits after BOS + tokens[0 .. i))[tokens[i]], the
 * log-sum-exp in double. per_token (n, may be NULL) gets each term. */
kve_status lm_window_nats(lm_state *s, const int32_t *tokens, size_t n, double *nats,
                          double *per_token);

/* -log softmax(logits)[target] with the log-sum-exp in double; NAN for a
 * target outside [0, vocab). */
double lm_token_nats(const float *logits, int32_t vocab, int32_t target);

/* ---- budgets (budgets.c) ------------------------------------------------------ */

/* The calibration statistic of the weighted layer schedule: for each layer
 * l, out[l] is the mean, over the steps t > window of BOS + tokens[0 .. n)
 * decoded with the full cache and over the layer's KV heads, of the
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
 * layer budget, which sizes its slots), and room for one more key in every
 * cache of layer l of a shared state (the arena laid out again or grown,
 * all or nothing). */
kve_status lm__budgets_init(lm_state *s);
kve_status lm__bank_spec(const lm_state *s, char *out, size_t cap);
kve_status lm__arena_reserve(lm_state *s, size_t l);
void lm__arena_free(lm_state *s);

#endif /* KVE_LM_H */
