/* SPDX-License-Identifier: MIT */
/*
 * llama_dl.h - llama.cpp, loaded at run time: the llama.h and ggml calls
 * kvevict-llama makes, resolved from the prebuilt libllama of the pinned npm
 * package node-llama-cpp (never vendored, never linked at build time). A
 * program that links libllama and starts where it is missing dies in the
 * dynamic loader with exit 127; loading it here lets kvevict-llama say in
 * one line which library is missing where, and exit 1.
 *
 * Each entry of KVL_CALLS is a pointer of the declared function's own type
 * (__typeof__ of the llama.h or ggml declaration), so a call through the
 * table is checked against the header of the release it was built with.
 */
#ifndef KVL_LLAMA_DL_H
#define KVL_LLAMA_DL_H

#include <ggml-backend.h>
#include <ggml.h>
#include <gguf.h>
#include <llama.h>

/* The libraries, in load order (each later one needs the earlier). */
#define KVL_LIBGGML_BASE "libggml-base.so"
#define KVL_LIBGGML "libggml.v0.4.0.so"
#define KVL_LIBLLAMA "libllama.v0.4.0.so"

#define KVL_CALLS(X)                                                                               \
    X(ggml_backend_load_all_from_path) X(ggml_backend_tensor_get) X(ggml_nbytes)                   \
    X(llama_backend_init) X(llama_backend_free) X(llama_log_set)                                   \
    X(llama_model_default_params) X(llama_model_load_from_file) X(llama_model_free)                \
    X(llama_model_get_vocab) X(llama_model_n_layer) X(llama_model_n_head)                          \
    X(llama_model_n_head_kv) X(llama_model_n_embd) X(llama_model_n_ctx_train)                      \
    X(llama_model_rope_type) X(llama_model_rope_freq_scale_train) X(llama_model_meta_val_str)      \
    X(llama_model_desc) X(llama_model_size) X(llama_model_n_params)                                \
    X(llama_context_default_params) X(llama_init_from_model) X(llama_free) X(llama_n_ctx)          \
    X(llama_get_memory) X(llama_memory_clear) X(llama_memory_seq_rm) X(llama_memory_seq_cp)        \
    X(llama_memory_seq_pos_max) X(llama_decode) X(llama_batch_init) X(llama_batch_free)            \
    X(llama_get_logits_ith) X(llama_vocab_n_tokens) X(llama_vocab_bos) X(llama_vocab_is_eog)       \
    X(llama_vocab_get_add_bos) X(llama_tokenize) X(llama_token_to_piece)                           \
    X(llama_state_seq_get_size) X(llama_state_seq_get_data) X(llama_state_seq_set_data)        \
    X(llama_model_quantize_default_params) X(llama_model_quantize) X(llama_model_ftype)           \
    X(gguf_init_from_file) X(gguf_find_tensor) X(gguf_free) X(gguf_get_data_offset)             \
    X(gguf_get_tensor_offset) X(gguf_get_tensor_type) X(gguf_get_tensor_size)

#define KVL_SLOT(name) __typeof__(name) *name;
typedef struct kvl_api {
    KVL_CALLS(KVL_SLOT)
    void *handle[3]; /* ggml-base, ggml, llama: dlopen's */
    char dir[4096];  /* where they were found */
} kvl_api;
#undef KVL_SLOT

/* Loads the three libraries from `dir` (NULL: $KVEVICT_LLAMA_LIB, else the
 * folder the build found, KVL_DEFAULT_LIB_DIR), resolves every call, loads
 * ggml's CPU back ends from the same folder and initialises llama.cpp with
 * its log silenced (its notes would bury the tool's own line; the last
 * error is kept, kvl_llama_error).
 * Returns 0, or -1 with msg (cap bytes) naming the library, the folder and
 * dlerror's reason. */
int kvl_api_open(kvl_api *api, const char *dir, char *msg, size_t cap);
void kvl_api_close(kvl_api *api);
/* llama.cpp's first error message since the last kvl_llama_error_clear
 * (its log, which kvevict-llama never prints), on one line, for the one line
 * a failure gets; "it gave no reason" when none. */
const char *kvl_llama_error(void);
void kvl_llama_error_clear(void);

#endif /* KVL_LLAMA_DL_H */
