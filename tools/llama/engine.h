/* SPDX-License-Identifier: MIT */
/*
 * engine.h - kvevict inside llama.cpp: sequences of a llama.cpp context
 * whose KV cells a kvevict bank decides (kvevict-llama; docs/llama.cpp.md).
 *
 * Legend: L layers, H query heads, G KV heads, S head size, R = H / G, V
 * vocabulary, B the batch (llama.cpp's n_ubatch), C = budget + B the slots
 * of a sequence's key copy.
 *
 * llama.cpp's cache holds one cell per position for every layer and KV head
 * at once, so the bank of a sequence is one same_positions bank of all L*G
 * (layer, KV head) pairs, layer-major: one decision per position, the same
 * victims in every head, removed from llama.cpp with
 * llama_memory_seq_rm(mem, seq, p, p + 1). llama.cpp never hands out
 * attention weights (with flash attention none exist), so the engine reads
 * each layer's rotated queries and keys as llama.cpp computes them (its
 * eval callback: the ROPE outputs named Qcur-l and Kcur-l, the values
 * Vcur-l), keeps a copy of every kept position's keys itself, in half
 * floats (rounded as llama.cpp rounds its F16 cells) in kve_attn_rows'
 * tiles, and computes the rows of each KV head's query group over them with
 * kve_attn_rows_f16 (kve_attn_row's bits over those keys, row by row), on
 * kv_threads threads (a share of the layers each; the main thread steps
 * the bank, whose same_positions steps must not overlap). Positions
 * stay original: every key is rotated at its own position, as llama.cpp
 * stores it. llama.cpp's mask of layer 0 (the cells each query attends) is
 * read at every decode too: it gives max_cells, and every token's count
 * of attended cells is checked against the kept set kvevict holds.
 *
 * A batch of m tokens is one llama_decode; token i's row covers the kept
 * positions and the batch's tokens before it (what llama.cpp's causal mask
 * lets it attend), its own key last and left out, normalised over all of
 * them as the decoder does; the bank steps the m tokens in order, then one
 * eviction cuts it to the budget. So memory is bounded by budget + B cells
 * per sequence, and llama.cpp's context is created with budget + B cells
 * per sequence (rounded up to 256, llama.cpp's padding).
 *
 * What llama.cpp's API cannot do, and what the engine does instead:
 *  - drop a sequence's newest position: llama_decode requires a batch to
 *    continue from the largest position a sequence holds, so a policy whose
 *    recent window is 0 (knorm, keydiff, expected_attention, random by
 *    default) runs with recent_window 1 (kvl_runnable_spec);
 *  - hand out W_o v per head: vnorm=1 (CriticalKV's value norm) is refused.
 */
#ifndef KVL_ENGINE_H
#define KVL_ENGINE_H

#include "kvevict.h"
#include "llama_dl.h"

#include <stddef.h>
#include <stdint.h>

/* A GGUF model loaded by llama.cpp, and the facts the engine reads. */
typedef struct kvl_model {
    const kvl_api *api;
    struct llama_model *model;
    const struct llama_vocab *vocab;
    size_t L, H, G, S, R, V; /* S from n_embd / n_head; checked against the tensors */
    size_t n_ctx_train;
    kve_rope rope;      /* the model's rotary embedding (expected_attention's facts) */
    float *freq_factors; /* rope.freq_factors: a rope_freqs.weight tensor's (rotary_dim / 2),
                            read from the file; NULL without one */
    float scale;        /* the attention scale: the GGUF's attention.scale, else 1/sqrt(S) */
    uint64_t fingerprint; /* of the file: what a session names its model by */
} kvl_model;

/* Loads path with llama.cpp (weights mmapped, CPU). KVE_EIO or KVE_EFORMAT
 * (llama.cpp refused the file; its own reason went to stderr) with the
 * message set. */
kve_status kvl_model_open(const kvl_api *api, const char *path, kvl_model *out);
void kvl_model_close(kvl_model *m);

/* The canonical spec of `spec` at `budget` (0: the spec's) as the engine
 * runs it: recent_window 0 raised to 1 (*raised set), vnorm=1 refused
 * (KVE_EINVAL, the reason named). */
kve_status kvl_runnable_spec(const char *spec, size_t budget, char out[KVE_SPEC_MAX], int *raised);

typedef struct kvl_options {
    const char *spec;   /* kvl_runnable_spec's; NULL: no policy, every cell kept */
    size_t batch;       /* B, tokens a decode takes at most (>= 1) */
    size_t sequences;   /* sequences the context holds (>= 1; > 1: one stream each) */
    size_t cells;       /* without a policy: the cells a sequence may need (its tokens) */
    size_t threads;     /* llama.cpp's threads */
    size_t kv_threads;  /* kvevict's threads for the rows after a decode (0: threads): the
                           main one and kv_threads - 1 helpers, a share of the layers each;
                           the same bits with any number */
    uint64_t seed;      /* the policies' generator (random) */
    int capture;        /* 0: no eval callback at all (plain llama.cpp, the benchmark's
                           floor); only without a policy */
    size_t window;      /* without a policy: > 0 keeps the newest `window` cells by
                           llama_memory_seq_rm alone (what an engine does without
                           kvevict: the benchmark's floor of a bounded cache) */
} kvl_options;

typedef struct kvl_engine kvl_engine;
typedef struct kvl_seq kvl_seq;

/* A context over m (which must outlive it) for o's sequences. KVE_EINVAL
 * names what o gets wrong; KVE_ENOMEM; KVE_EIO when llama.cpp cannot make
 * the context. */
kve_status kvl_engine_new(kvl_model *m, const kvl_options *o, kvl_engine **out);
void kvl_engine_free(kvl_engine *e);
/* The context's cells (llama_n_ctx, after llama.cpp's padding). */
size_t kvl_engine_n_ctx(const kvl_engine *e);
/* Seconds spent in kvevict's part of every decode since creation: the
 * copies of queries and keys, the rows, the bank's steps and evictions,
 * the seq_rm calls and the key copy's compaction. */
double kvl_engine_kvevict_seconds(const kvl_engine *e);

/* Sequence `id` (< o.sequences, not in use) of e, empty, its bank seeded
 * from o.seed. */
kve_status kvl_seq_new(kvl_engine *e, int32_t id, kvl_seq **out);
void kvl_seq_free(kvl_seq *s);
/* Back to empty: llama.cpp's cells of the sequence removed, the bank reset. */
void kvl_seq_reset(kvl_seq *s);
/* dst (another sequence of the same engine) takes src's state: llama.cpp's
 * cells (llama_memory_seq_cp, a whole stream when streams are separate),
 * the bank (kve_bank_copy), the key copy, the position and the logits. */
kve_status kvl_seq_copy(kvl_seq *dst, const kvl_seq *src);

/* Decodes tokens[0 .. n) at the sequence's next positions, batch by batch,
 * evicting after each. logits: (n, V) every token's logits, or NULL (only
 * the last token's, kvl_seq_logits). KVE_EINVAL for a token outside the
 * vocabulary (nothing decoded); KVE_EIO when llama_decode fails, its
 * logits are not finite (an activation overflowed) or llama.cpp's attended
 * cells disagree with the kept set; KVE_EINVAL from a policy. After a
 * failure the sequence is broken (reset it). */
kve_status kvl_decode(kvl_seq *s, const int32_t *tokens, size_t n, float *logits);

const float *kvl_seq_logits(const kvl_seq *s); /* (V) after the last token */
int32_t kvl_seq_pos(const kvl_seq *s);         /* the next position */
size_t kvl_seq_kept(const kvl_seq *s);         /* positions kept (every one without a policy) */
/* The most cells of this sequence llama.cpp's attention ran over at once,
 * read from its mask, since the sequence was created or reset. */
size_t kvl_seq_max_cells(const kvl_seq *s);
const kve_bank *kvl_seq_bank(const kvl_seq *s); /* NULL without a policy */

/* The sequence's state as bytes (llama.cpp's llama_state_seq_get_data, the
 * bank's image, the kept keys, the logits), kvl_session_save's body;
 * buf NULL: *size gets the size. KVE_ERANGE when cap is short. */
kve_status kvl_seq_save(const kvl_seq *s, void *buf, size_t cap, size_t *size);
/* The most bytes kvl_seq_save can write for a sequence of s's engine (a
 * bound, for reading a session no larger than that): its header and spec,
 * the bank's image at up to C kept slots a head (its image as it is now,
 * with its per-head state, plus at most two float32 head vectors and 64
 * bytes a slot and head, 64 KiB besides), the C slots' keys,
 * llama.cpp's cells (each layer's key and value at up to float32 and 64
 * bytes a cell, 64 bytes a layer, 64 KiB besides) and the logits; C the
 * cells of a sequence (budget + batch). */
size_t kvl_seq_state_bound(const kvl_seq *s);
/* Restores a state kvl_seq_save wrote into s, an empty sequence of an
 * engine of the same model and options: every part validated before
 * llama.cpp's is restored, llama.cpp's own bytes included (this release's
 * layout: its cells the bank's positions, rows of the model's width, every
 * key and value finite, nothing after them), KVE_EFORMAT naming the part;
 * KVE_EINVAL when it is another model's or spec's. On failure s is empty. */
kve_status kvl_seq_load(kvl_seq *s, const void *buf, size_t size);

#endif /* KVL_ENGINE_H */
