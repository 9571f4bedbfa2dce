/* SPDX-License-Identifier: MIT */
/*
 * engine.c - a llama.cpp context whose sequences a kvevict bank evicts
 * (engine.h says what and why).
 *
 * Invariants, per sequence with a policy, between calls:
 *  - kpos[0 .. n) is the bank's kept set (head 0's positions; every head
 *    keeps the same), ascending, and llama.cpp's cells of the sequence hold
 *    exactly those positions (checked against its mask at every decode);
 *  - the key copy is dense: slot[i] < n is where kept position kpos[i]'s
 *    keys are, in every (layer, KV head) block of Ct slots (C rounded up
 *    to whole tiles of KVE_ATTN_TILE slots, the layout kve_attn_rows_f16
 *    reads), each slot used once; a new position takes slot n;
 *  - n <= budget after every decode (n <= budget + B inside one).
 * Memory: keys L*G*Ct*S half floats a sequence (2 bytes each, rounded as
 * llama.cpp rounds its F16 cells: at TinyLlama's shape 22 x 4 x (512 + 512) x
 * 64 x 2 = 11.5 MB, of which a token's rows read the kept half); the
 * capture buffers 3 L B max(H, G) S floats an engine; each helper thread
 * its layers' rows, (its layers) H C floats.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine.h"
#include "lm.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the model ---- */

/* FNV-1a 64 of the file's size and its first and last MiB (at most): the
 * model a session belongs to, without reading gigabytes. */
static kve_status fingerprint(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return kve_set_error(KVE_EIO, "%s: %s", path, strerror(errno));
    uint64_t h = 0xcbf29ce484222325u;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    for (int k = 0; k < 8; k++)
        h = (h ^ (uint8_t)((uint64_t)size >> (8 * k))) * 0x100000001b3u;
    static unsigned char buf[1 << 20];
    for (int part = 0; part < 2 && size >= 0; part++) {
        long at = part == 0 ? 0 : (size > (long)sizeof buf ? size - (long)sizeof buf : 0);
        size_t got = fseek(f, at, SEEK_SET) == 0 ? fread(buf, 1, sizeof buf, f) : 0;
        for (size_t i = 0; i < got; i++)
            h = (h ^ buf[i]) * 0x100000001b3u;
    }
    int bad = size < 0 || ferror(f);
    fclose(f);
    if (bad)
        return kve_set_error(KVE_EIO, "%s: cannot be read", path);
    *out = h;
    return KVE_OK;
}

/* A number from the model's metadata key "ARCH.suffix", or `dflt`. */
static double meta_number(const kvl_model *m, const char *suffix, double dflt)
{
    char arch[64], key[160], val[64];
    if (m->api->llama_model_meta_val_str(m->model, "general.architecture", arch, sizeof arch) < 0)
        return dflt;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (m->api->llama_model_meta_val_str(m->model, key, val, sizeof val) < 0)
        return dflt;
    char *end;
    double v = strtod(val, &end);
    return end != val ? v : dflt;
}

/* The model's RoPE scaling into m->rope, read as the decoder reads a GGUF's
 * (lm_rope, lm/gguf.c): ARCH.rope.scaling.type (absent: linear), the factor
 * from rope.scaling.factor or rope.scale_linear (absent: 1),
 * rope.scaling.attn_factor, and for yarn rope.scaling.original_context_length
 * (absent: the training context), mapped to kve_rope by the decoder's own
 * lm_rope_scaling_set and lm_rope; a rope_freqs.weight tensor (Llama 3's,
 * found with ggml's own GGUF reader and read from the file) as
 * kve_rope.freq_factors with attention_factor the scaling's magnitude, as
 * lm_model_rope hands a decoder's policies. What kve_rope cannot describe
 * (a factor below 1, another type, factors not float32, not one a pair of
 * the rotary dimensions, or not finite and positive) leaves the rotation
 * unset, so that expected attention, the policy that reads it, is refused
 * rather than run with a wrong rotation. */
static float *rope_freqs(kvl_model *m, struct gguf_context *g, const char *path)
{
    const int64_t id = m->api->gguf_find_tensor(g, "rope_freqs.weight");
    const size_t n = m->rope.rotary_dim / 2, bytes = m->api->gguf_get_tensor_size(g, id);
    if (m->api->gguf_get_tensor_type(g, id) != GGML_TYPE_F32 || !n || bytes != n * sizeof(float))
        return NULL;
    float *f = malloc(bytes);
    FILE *in = fopen(path, "rb");
    const size_t at = m->api->gguf_get_data_offset(g) + m->api->gguf_get_tensor_offset(g, id);
    int ok = f && in && at <= LONG_MAX && fseek(in, (long)at, SEEK_SET) == 0 &&
             fread(f, 1, bytes, in) == bytes;
    for (size_t j = 0; ok && j < n; j++)
        ok = isfinite(f[j]) && f[j] > 0;
    if (in)
        fclose(in);
    if (!ok) {
        free(f);
        return NULL;
    }
    return f;
}

static void rope_scaling(kvl_model *m, const char *path)
{
    char arch[64], type[32] = "linear";
    if (m->api->llama_model_meta_val_str(m->model, "general.architecture", arch, sizeof arch) >= 0) {
        char key[160];
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        if (m->api->llama_model_meta_val_str(m->model, key, type, sizeof type) < 0)
            snprintf(type, sizeof type, "linear");
    }
    const double factor = meta_number(m, "rope.scaling.factor",
                                      meta_number(m, "rope.scale_linear", 1.0));
    const double attn = meta_number(m, "rope.scaling.attn_factor", 1.0);
    const double orig = meta_number(m, "rope.scaling.original_context_length",
                                    (double)m->n_ctx_train);
    struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = m->api->gguf_init_from_file(path, gp);
    const int freqs = g && m->api->gguf_find_tensor(g, "rope_freqs.weight") >= 0;
    float *factors = freqs ? rope_freqs(m, g, path) : NULL;
    if (g)
        m->api->gguf_free(g);
    static const char *const beyond[] = {"rope.scaling.yarn_log_multiplier",
                                         "rope.scaling.yarn_ext_factor",
                                         "rope.scaling.yarn_attn_factor",
                                         "rope.scaling.yarn_beta_fast",
                                         "rope.scaling.yarn_beta_slow", "rope.scaling.alpha"};
    int other = 0; /* yarn's other keys: the decoder follows its defaults only */
    for (size_t i = 0; i < sizeof beyond / sizeof beyond[0]; i++)
        other |= !isnan(meta_number(m, beyond[i], NAN));
    const int none = strcmp(type, "none") == 0, linear = strcmp(type, "linear") == 0,
              yarn = strcmp(type, "yarn") == 0;
    if (other || !(none || linear || yarn) || (!none && !(factor >= 1.0)) || !g ||
        (freqs && !factors)) {
        free(factors);
        m->rope.rotary_dim = KVE_ROPE_UNSET;
        return;
    }
    /* the decoder's own mapping (lm_rope_scaling_set, lm_rope, lm_model_rope)
     * from here: its rotation without the factors, then the factors */
    lm_config c = {.head_size = 2, .rope_theta = 10000.0f};
    lm_rope_scaling_set(&c, yarn ? LM_ROPE_SCALING_YARN : linear ? LM_ROPE_SCALING_LINEAR
                                                              : LM_ROPE_SCALING_NONE,
                        (float)factor, (float)attn, (int32_t)orig);
    const kve_rope r = lm_rope(&c);
    if (r.rotary_dim == KVE_ROPE_UNSET) {
        free(factors);
        m->rope.rotary_dim = KVE_ROPE_UNSET;
        return;
    }
    m->rope.scaling = r.scaling; /* base, pairs and rotary_dim stay the model's */
    m->rope.factor = r.factor;
    m->rope.attention_factor = factors ? (double)c.rope_mscale : r.attention_factor;
    m->rope.original_max_position = r.original_max_position;
    m->rope.freq_factors = m->freq_factors = factors;
}

kve_status kvl_model_open(const kvl_api *api, const char *path, kvl_model *out)
{
    memset(out, 0, sizeof *out);
    out->api = api;
    kve_status st = fingerprint(path, &out->fingerprint);
    if (st != KVE_OK)
        return st;
    struct llama_model_params mp = api->llama_model_default_params();
    kvl_llama_error_clear();
    out->model = api->llama_model_load_from_file(path, mp);
    if (!out->model)
        return kve_set_error(KVE_EFORMAT, "%s: llama.cpp cannot load it as a model: %s", path,
                             kvl_llama_error());
    kvl_model *m = out;
    m->vocab = api->llama_model_get_vocab(m->model);
    int32_t L = api->llama_model_n_layer(m->model), H = api->llama_model_n_head(m->model),
            G = api->llama_model_n_head_kv(m->model), D = api->llama_model_n_embd(m->model);
    int32_t V = api->llama_vocab_n_tokens(m->vocab);
    if (L <= 0 || H <= 0 || G <= 0 || D <= 0 || V <= 0 || H % G) {
        kvl_model_close(m);
        return kve_set_error(KVE_EFORMAT, "%s: %d layers, %d query and %d KV heads, width %d, "
                             "%d tokens: not a transformer kvevict-llama can run", path, L, H, G,
                             D, V);
    }
    m->L = (size_t)L, m->H = (size_t)H, m->G = (size_t)G, m->V = (size_t)V, m->R = m->H / m->G;
    m->S = (size_t)meta_number(m, "attention.key_length", (double)D / H);
    m->n_ctx_train = (size_t)api->llama_model_n_ctx_train(m->model);
    double scale = meta_number(m, "attention.scale", 0.0);
    m->scale = scale > 0 ? (float)scale : 1.0f / sqrtf((float)m->S);
    m->rope = kve_policy_default_options().rope;
    m->rope.rotary_dim = (size_t)meta_number(m, "rope.dimension_count", (double)m->S);
    m->rope.base = meta_number(m, "rope.freq_base", 10000.0);
    m->rope.pairs = api->llama_model_rope_type(m->model) == LLAMA_ROPE_TYPE_NEOX
                        ? KVE_ROPE_HALF
                        : KVE_ROPE_ADJACENT;
    rope_scaling(m, path);
    return KVE_OK;
}

void kvl_model_close(kvl_model *m)
{
    if (m->model)
        m->api->llama_model_free(m->model);
    m->model = NULL;
    free(m->freq_factors);
    m->freq_factors = NULL;
    m->rope.freq_factors = NULL;
}

kve_status kvl_runnable_spec(const char *spec, size_t budget, char out[KVE_SPEC_MAX], int *raised)
{
    char num[32];
    snprintf(num, sizeof num, "%zu", budget);
    *raised = 0;
    kve_status st = kve_spec_with(spec, budget ? "budget" : NULL, budget ? num : NULL, out,
                                  KVE_SPEC_MAX);
    if (st != KVE_OK)
        return st;
    /* vnorm=1 of a policy that reads queries weighs by the value's own norm
     * (the decoder's choice, kvpress's use_vnorm), which Vcur gives; of any
     * other, by CriticalKV's ||W_o v||, which llama.cpp never computes */
    size_t name = strcspn(out, ":");
    kve_reads reads = KVE_READS_NOTHING;
    for (size_t t = 0; t < kve_policy_type_count(); t++)
        if (strlen(kve_policy_type_name(t)) == name &&
            strncmp(out, kve_policy_type_name(t), name) == 0)
            reads = kve_policy_type_reads(t);
    if (strstr(out, "vnorm=1") && !(reads & KVE_READS_QUERIES))
        return kve_set_error(KVE_EINVAL, "%s: vnorm=1 weighs a position by ||W_o v|| (CriticalKV), "
                             "which llama.cpp's graph never computes per head: not in "
                             "kvevict-llama", out);
    const char *rw = strstr(out, "recent_window=0");
    if (rw && (rw[15] == ',' || rw[15] == '\0')) {
        char again[KVE_SPEC_MAX];
        memcpy(again, out, KVE_SPEC_MAX);
        if ((st = kve_spec_with(again, "recent_window", "1", out, KVE_SPEC_MAX)) != KVE_OK)
            return st;
        *raised = 1;
    }
    return KVE_OK;
}

/* ---- the engine ---- */

/* A thread of the engine beside the main one (kv_threads - 1 of them, for a
 * policy that reads rows): layer_rows of layers [l0, l1) for
 * each token, into its own rows and scratch. */
typedef struct kvl_helper {
    kvl_engine *e;
    pthread_t thread;
    size_t l0, l1;
    float *rows; /* (l1 - l0, H, C) its layers' rows of the token, in kept order */
    float *tmp;  /* (R, Ct) a KV head's rows by slot */
    kve_status st;
    char msg[256]; /* its kve_last_error when st fails */
} kvl_helper;

static kve_status start_helpers(kvl_engine *e);

struct kvl_engine {
    kvl_model *m;
    const kvl_api *api;
    kvl_options opt;
    struct llama_context *ctx;
    llama_memory_t mem;
    struct llama_batch batch;
    kve_reads reads;  /* what the policy reads; KVE_READS_NOTHING without one */
    size_t budget, C; /* the spec's budget; slots of a key copy (budget + B) */
    size_t Ct;        /* C in whole tiles */
    kvl_seq **seqs;   /* (sequences) the sequence of each id, or NULL */
    /* what the eval callback captures of the decode in progress */
    size_t n_tokens;
    float *q, *k, *v;   /* (L, B, H, S), (L, B, G, S), (L, B, G, S): v only for values */
    unsigned char *got; /* (L) bit 0: Q, 1: K, 2: V of the layer seen */
    size_t *attended;   /* (B) cells token i attended in layer 0 (llama.cpp's mask) */
    const struct ggml_tensor **qt;   /* (L) this decode's rotated queries, from the asks */
    const struct ggml_tensor *mask;  /* this decode's attention mask, from the asks */
    unsigned char *mask_row; /* (n_ctx float32s) one row of that mask */
    size_t mask_cap;    /* its bytes */
    int mask_seen;
    char bad[256];      /* what the callback found wrong; "" when nothing */
    /* scratch of the eviction */
    float *rows, *tmp;      /* (H, C) a layer's rows for one token; (R, Ct) a group's by slot */
    int32_t *victims;       /* (L*G, C) */
    size_t *counts;         /* (L*G) */
    unsigned char *used;    /* (C) */
    double kv_seconds;
    /* the helpers: the main thread makes layers [0, l_main)'s rows, they
     * the rest; the main thread steps the bank */
    kvl_helper *help;
    size_t help_cap, n_help, l_main; /* helpers made, started; the main thread's layers */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int sync;            /* mu, go and done made */
    unsigned long job;   /* counts the tokens handed out */
    size_t pending;      /* helpers not done with the job */
    int quit;
    kvl_seq *job_seq;    /* the job: token job_i of job_seq's decode */
    size_t job_i;
};

struct kvl_seq {
    kvl_engine *e;
    int32_t id;
    kve_bank *bank;  /* NULL without a policy */
    uint16_t *keys;  /* (L*G, Ct / KVE_ATTN_TILE, S, KVE_ATTN_TILE) the kept keys by slot, in
                        half floats, rounded as llama.cpp rounds its F16 cells */
    int32_t *kpos;   /* (C) kept positions, ascending */
    int32_t *slot;   /* (C) slot of kept index i */
    size_t n;        /* kept (with a policy) */
    int32_t pos;     /* the next position */
    float *logits;   /* (V) */
    size_t max_cells;
    int broken;
};

/* The layer of a tensor named PREFIX-L, or -1. */
static long layer_of(const char *name, const char *prefix, size_t L)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] < '0' || name[n] > '9')
        return -1;
    char *end;
    long l = strtol(name + n, &end, 10);
    return *end == '\0' && l >= 0 && (size_t)l < L ? l : -1;
}

static int is_view(enum ggml_op op)
{
    return op == GGML_OP_RESHAPE || op == GGML_OP_VIEW || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

/* Layer 0's attention node and its mask: flash attention's (src 3) or the
 * masked softmax's (src 1). */
static const struct ggml_tensor *attention_mask(const struct ggml_tensor *t)
{
    if (t->op == GGML_OP_FLASH_ATTN_EXT)
        return t->src[3];
    if (t->op == GGML_OP_SOFT_MAX)
        return t->src[1];
    return NULL;
}

/* Copies t (shape S, heads, tokens; float32) into dst as (tokens, heads, S). */
static void take(kvl_engine *e, const struct ggml_tensor *t, size_t heads, float *dst,
                 const char *what, long l)
{
    size_t S = e->m->S;
    if (t->type != GGML_TYPE_F32 || (size_t)t->ne[0] != S || (size_t)t->ne[1] != heads ||
        (size_t)t->ne[2] != e->n_tokens || t->nb[0] != sizeof(float) ||
        t->nb[1] != S * sizeof(float) || t->nb[2] != heads * S * sizeof(float)) {
        snprintf(e->bad, sizeof e->bad, "layer %ld's %s is a %lldx%lldx%lld tensor of type %d, "
                 "not float32 (%zu, %zu, %zu)", l, what, (long long)t->ne[0],
                 (long long)t->ne[1], (long long)t->ne[2], (int)t->type, S, heads, e->n_tokens);
        return;
    }
    e->api->ggml_backend_tensor_get(t, dst, 0, e->n_tokens * heads * S *
                                                                          sizeof(float));
}

/* Counts, for each token of the decode, the cells its row of the mask
 * leaves open (not -inf). */
static void count_cells(kvl_engine *e, const struct ggml_tensor *m)
{
    size_t n_kv = (size_t)m->ne[0];
    if ((m->type != GGML_TYPE_F16 && m->type != GGML_TYPE_F32) || (size_t)m->ne[1] < e->n_tokens) {
        snprintf(e->bad, sizeof e->bad, "layer 0's attention mask is of type %d and %lld rows",
                 (int)m->type, (long long)m->ne[1]);
        return;
    }
    size_t elt = m->type == GGML_TYPE_F16 ? 2 : 4;
    unsigned char *row = e->mask_row;
    if (n_kv * elt > e->mask_cap) {
        snprintf(e->bad, sizeof e->bad, "a mask row of %zu cells, the context has fewer", n_kv);
        return;
    }
    for (size_t i = 0; i < e->n_tokens; i++) {
        e->api->ggml_backend_tensor_get(m, row, i * m->nb[1], n_kv * elt);
        size_t open = 0;
        for (size_t j = 0; j < n_kv; j++) {
            if (elt == 2) {
                uint16_t h;
                memcpy(&h, row + 2 * j, 2);
                open += h != 0xFC00u; /* float16 -inf */
            } else {
                float x;
                memcpy(&x, row + 4 * j, 4);
                open += !(isinf(x) && x < 0);
            }
        }
        e->attended[i] = open;
    }
}

/* llama.cpp's eval callback: asked about every node of the graph (ask),
 * then handed each node it was told yes to, once computed; each yes splits
 * the graph's computation there (a synchronisation of llama.cpp's
 * threads), so the engine says yes once a layer: to the rotated keys
 * (Kcur-l, a ROPE). The rotated queries (Qcur-l) come before them in the
 * graph and live until the layer's attention, so they are read at the
 * keys' callback through the pointer the ask recorded; the mask, an input
 * every layer's attention reads, likewise at a later layer's callback (or
 * at layer 0's attention node when nothing else is asked for). Values
 * (Vcur-l) come after the keys: a policy that reads them adds their own
 * split. */
static bool capture(struct ggml_tensor *t, bool ask, void *user)
{
    kvl_engine *e = user;
    size_t L = e->m->L;
    long lq = layer_of(t->name, "Qcur-", L), lk = layer_of(t->name, "Kcur-", L),
         lv = layer_of(t->name, "Vcur-", L);
    /* queries for rows and for the policies that read them; keys for those
     * and for the policies that read keys */
    int wq = (e->reads & (KVE_READS_ATTN | KVE_READS_QUERIES)) != 0;
    int qk = wq || (e->reads & KVE_READS_KEYS) != 0;
    int rope = t->op == GGML_OP_ROPE;
    if (ask) {
        if (wq && rope && lq >= 0) {
            e->qt[lq] = t; /* read with its layer's keys */
            return false;
        }
        if (!e->mask && attention_mask(t)) {
            e->mask = attention_mask(t);
            return !qk || L == 1; /* else read at the next layer's keys */
        }
        return (qk && rope && lk >= 0) ||
               ((e->reads & KVE_READS_VALUES) && lv >= 0 && !is_view(t->op));
    }
    double t0 = now();
    size_t B = e->opt.batch, S = e->m->S, H = e->m->H, G = e->m->G;
    if (qk && rope && lk >= 0) {
        take(e, t, G, e->k + (size_t)lk * B * G * S, "rotated keys (Kcur)", lk);
        e->got[lk] |= 2;
        if (wq && e->qt[lk]) {
            take(e, e->qt[lk], H, e->q + (size_t)lk * B * H * S, "rotated queries (Qcur)", lk);
            e->got[lk] |= 1;
        }
    } else if (lv >= 0 && !is_view(t->op)) {
        struct ggml_tensor v2 = *t; /* (G*S, tokens) or (S, G, tokens): the same floats */
        if (v2.ne[1] == (int64_t)e->n_tokens && v2.ne[2] == 1 && v2.ne[0] == (int64_t)(G * S)) {
            v2.ne[0] = (int64_t)S, v2.ne[1] = (int64_t)G, v2.ne[2] = (int64_t)e->n_tokens;
            v2.nb[1] = S * sizeof(float), v2.nb[2] = G * S * sizeof(float);
        }
        take(e, &v2, G, e->v + (size_t)lv * B * G * S, "values (Vcur)", lv);
        e->got[lv] |= 4;
    }
    if (!e->mask_seen && e->mask) {
        count_cells(e, e->mask);
        e->mask_seen = 1;
    }
    e->kv_seconds += now() - t0;
    return true;
}

void kvl_engine_free(kvl_engine *e)
{
    if (!e)
        return;
    if (e->sync) {
        pthread_mutex_lock(&e->mu);
        e->quit = 1;
        pthread_cond_broadcast(&e->go);
        pthread_mutex_unlock(&e->mu);
    }
    for (size_t h = 0; h < e->n_help; h++)
        pthread_join(e->help[h].thread, NULL);
    for (size_t h = 0; h < e->help_cap; h++)
        free(e->help[h].rows), free(e->help[h].tmp);
    free(e->help);
    if (e->sync) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->go);
        pthread_cond_destroy(&e->done);
    }
    if (e->ctx)
        e->api->llama_free(e->ctx);
    if (e->batch.token)
        e->api->llama_batch_free(e->batch);
    free(e->seqs);
    free(e->q), free(e->k), free(e->v), free(e->got), free(e->attended), free(e->mask_row);
    free(e->qt);
    free(e->rows), free(e->tmp), free(e->victims), free(e->counts), free(e->used);
    free(e);
}

kve_status kvl_engine_new(kvl_model *m, const kvl_options *o, kvl_engine **out)
{
    if (o->batch == 0 || o->sequences == 0 || o->sequences > 64)
        return kve_set_error(KVE_EINVAL, "engine: batch %zu and sequences %zu must be in 1 .. and "
                             "1 .. 64", o->batch, o->sequences);
    if (!o->capture && o->spec)
        return kve_set_error(KVE_EINVAL, "engine: a policy needs the eval callback");
    if (o->window && o->spec)
        return kve_set_error(KVE_EINVAL, "engine: a window by seq_rm is for no policy");
    kvl_engine *e = calloc(1, sizeof *e);
    if (!e)
        return kve_set_error(KVE_ENOMEM, "engine: out of memory");
    e->m = m;
    e->api = m->api;
    e->opt = *o;
    size_t L = m->L, H = m->H, G = m->G, S = m->S, B = o->batch;
    if (o->spec) {
        kve_policy_options po = kve_policy_default_options();
        po.key_dim = S, po.value_dim = S, po.query_group = m->R, po.rope = m->rope;
        kve_policy *p = NULL;
        kve_rng g;
        kve_rng_seed(&g, 0);
        kve_status st = kve_policy_new_ex(o->spec, &g, &po, &p);
        if (st != KVE_OK) {
            kvl_engine_free(e);
            return st;
        }
        e->reads = kve_policy_reads(p);
        e->budget = kve_policy_budget(p);
        kve_policy_free(p);
    }
    e->C = e->budget + B;
    e->Ct = (e->C + KVE_ATTN_TILE - 1) / KVE_ATTN_TILE * KVE_ATTN_TILE;
    size_t cells = o->spec ? e->C : o->window ? o->window + B : o->cells;
    if (cells > (size_t)INT32_MAX / o->sequences)
        cells = (size_t)INT32_MAX / o->sequences;
    struct llama_context_params cp = e->api->llama_context_default_params();
    cp.n_ctx = (uint32_t)(cells * o->sequences);
    cp.n_batch = cp.n_ubatch = (uint32_t)B;
    cp.n_seq_max = (uint32_t)o->sequences;
    cp.kv_unified = o->sequences == 1; /* forks: one stream each, laid out as a separate run */
    cp.n_threads = cp.n_threads_batch = (int32_t)(o->threads ? o->threads : 1);
    cp.no_perf = true;
    if (o->capture) {
        cp.cb_eval = capture;
        cp.cb_eval_user_data = e;
    }
    int ok = (e->seqs = calloc(o->sequences, sizeof(kvl_seq *))) != NULL &&
             (e->got = calloc(L, 1)) != NULL && (e->attended = calloc(B, sizeof(size_t))) != NULL &&
             (e->qt = calloc(L, sizeof(const struct ggml_tensor *))) != NULL;
    if (ok && o->spec) {
        ok = (e->q = calloc(L * B * H * S, sizeof(float))) && (e->k = calloc(L * B * G * S, sizeof(float))) &&
             (e->v = calloc(L * B * G * S, sizeof(float))) && (e->rows = calloc(H * e->C, sizeof(float))) &&
             (e->tmp = calloc(m->R * e->Ct, sizeof(float))) &&
             (e->victims = calloc(L * G * e->C, sizeof(int32_t))) &&
             (e->counts = calloc(L * G, sizeof(size_t))) && (e->used = calloc(e->C, 1));
    }
    if (!ok) {
        kvl_engine_free(e);
        return kve_set_error(KVE_ENOMEM, "engine: out of memory for %zu layers of %zu tokens", L,
                             B);
    }
    kve_status hs = start_helpers(e);
    if (hs != KVE_OK) {
        kvl_engine_free(e);
        return hs;
    }
    e->batch = e->api->llama_batch_init((int32_t)B, 0, 1);
    kvl_llama_error_clear();
    if (!(e->ctx = e->api->llama_init_from_model(m->model, cp))) {
        kvl_engine_free(e);
        return kve_set_error(KVE_EIO, "engine: llama.cpp cannot make a context of %zu cells: %s",
                             cells * o->sequences, kvl_llama_error());
    }
    e->mem = e->api->llama_get_memory(e->ctx);
    e->mask_cap = (size_t)e->api->llama_n_ctx(e->ctx) * sizeof(float);
    if (!(e->mask_row = malloc(e->mask_cap))) {
        kvl_engine_free(e);
        return kve_set_error(KVE_ENOMEM, "engine: out of memory for a mask row");
    }
    *out = e;
    return KVE_OK;
}

size_t kvl_engine_n_ctx(const kvl_engine *e)
{
    return e->api->llama_n_ctx(e->ctx);
}

double kvl_engine_kvevict_seconds(const kvl_engine *e)
{
    return e->kv_seconds;
}

/* ---- sequences ---- */

static kve_status make_bank(const kvl_engine *e, kve_bank **out)
{
    const kvl_model *m = e->m;
    kve_bank_options o = kve_bank_default_options();
    o.same_positions = 1;
    o.key_dim = m->S, o.value_dim = m->S, o.query_group = m->R, o.rope = m->rope;
    kve_rng g;
    kve_rng_seed(&g, e->opt.seed);
    return kve_bank_new_ex(e->opt.spec, m->L * m->G, &g, &o, out);
}

void kvl_seq_free(kvl_seq *s)
{
    if (!s)
        return;
    if (s->e->seqs[s->id] == s)
        s->e->seqs[s->id] = NULL;
    kve_bank_free(s->bank);
    free(s->keys), free(s->kpos), free(s->slot), free(s->logits);
    free(s);
}

kve_status kvl_seq_new(kvl_engine *e, int32_t id, kvl_seq **out)
{
    if (id < 0 || (size_t)id >= e->opt.sequences || e->seqs[id])
        return kve_set_error(KVE_EINVAL, "engine: sequence %d is out of range or in use", id);
    kvl_seq *s = calloc(1, sizeof *s);
    if (!s)
        return kve_set_error(KVE_ENOMEM, "engine: out of memory");
    s->e = e;
    s->id = id;
    const kvl_model *m = e->m;
    int ok = (s->logits = calloc(m->V, sizeof(float))) != NULL;
    const size_t key_bytes = /* whole cache lines (aligned_alloc takes a multiple of 64) */
        (m->L * m->G * e->Ct * m->S * sizeof(uint16_t) + 63) / 64 * 64;
    if (ok && e->opt.spec) /* a tile row is half a cache line when the copy starts on one */
        ok = (s->keys = aligned_alloc(64, key_bytes)) && memset(s->keys, 0, key_bytes) &&
             (s->kpos = calloc(e->C, sizeof(int32_t))) && (s->slot = calloc(e->C, sizeof(int32_t)));
    if (!ok) {
        kvl_seq_free(s);
        return kve_set_error(KVE_ENOMEM, "engine: out of memory for a sequence's key copy (%zu "
                             "slots)", e->C);
    }
    kve_status st = e->opt.spec ? make_bank(e, &s->bank) : KVE_OK;
    if (st != KVE_OK) {
        kvl_seq_free(s);
        return st;
    }
    e->api->llama_memory_seq_rm(e->mem, id, -1, -1);
    e->seqs[id] = s;
    *out = s;
    return KVE_OK;
}

void kvl_seq_reset(kvl_seq *s)
{
    s->e->api->llama_memory_seq_rm(s->e->mem, s->id, -1, -1);
    kve_bank_reset(s->bank);
    s->n = 0;
    s->pos = 0;
    s->max_cells = 0;
    s->broken = 0;
    memset(s->logits, 0, s->e->m->V * sizeof(float));
}

kve_status kvl_seq_copy(kvl_seq *dst, const kvl_seq *src)
{
    kvl_engine *e = dst->e;
    if (src->e != e || src == dst)
        return kve_set_error(KVE_EINVAL, "engine: a copy is between two sequences of one engine");
    if (src->broken)
        return kve_set_error(KVE_EINVAL, "engine: sequence %d is broken", src->id);
    kve_status st = src->bank ? kve_bank_copy(dst->bank, src->bank) : KVE_OK;
    if (st != KVE_OK)
        return st;
    e->api->llama_memory_seq_rm(e->mem, dst->id, -1, -1);
    e->api->llama_memory_seq_cp(e->mem, src->id, dst->id, -1, -1);
    const kvl_model *m = e->m;
    if (src->bank) {
        memcpy(dst->keys, src->keys, m->L * m->G * e->Ct * m->S * sizeof(uint16_t));
        memcpy(dst->kpos, src->kpos, src->n * sizeof(int32_t));
        memcpy(dst->slot, src->slot, src->n * sizeof(int32_t));
    }
    dst->n = src->n;
    dst->pos = src->pos;
    dst->max_cells = src->max_cells;
    dst->broken = 0;
    memcpy(dst->logits, src->logits, m->V * sizeof(float));
    return KVE_OK;
}

const float *kvl_seq_logits(const kvl_seq *s)
{
    return s->logits;
}

int32_t kvl_seq_pos(const kvl_seq *s)
{
    return s->pos;
}

size_t kvl_seq_kept(const kvl_seq *s)
{
    return s->bank || s->e->opt.window ? s->n : (size_t)s->pos;
}

size_t kvl_seq_max_cells(const kvl_seq *s)
{
    return s->max_cells;
}

const kve_bank *kvl_seq_bank(const kvl_seq *s)
{
    return s->bank;
}

/* ---- decoding ---- */

/* Slot i of one (layer, KV head) block of the key copy: its first entry;
 * the S entries are KVE_ATTN_TILE half floats apart (kvevict.h's tiles). */
static uint16_t *key_slot(uint16_t *block, size_t S, size_t i)
{
    return block + (i / KVE_ATTN_TILE) * KVE_ATTN_TILE * S + i % KVE_ATTN_TILE;
}

static void key_put(uint16_t *block, size_t S, size_t i, const float *k)
{
    uint16_t *t = key_slot(block, S, i);
    for (size_t c = 0; c < S; c++)
        t[c * KVE_ATTN_TILE] = lm_f32_to_f16(k[c]); /* as ggml rounds a cell: to nearest even */
}

/* Layer l's part of token i of the decode just made, before its step: the
 * token's keys into slot n of the layer's blocks of the key copy, then (a
 * policy that reads rows) each KV head's query group's rows over the n
 * kept slots and its own (kve_attn_rows_f16: one pass over the head's tiles),
 * into rows (H, n ? n : 1) in kept order; tmp (R, Ct) holds them by slot. */
static kve_status layer_rows(kvl_seq *s, size_t l, size_t i, float *rows, float *tmp)
{
    const kvl_engine *e = s->e;
    const kvl_model *m = e->m;
    const size_t H = m->H, G = m->G, S = m->S, R = m->R, B = e->opt.batch, Ct = e->Ct;
    const size_t n = s->n, ld = n ? n : 1;
    const float *k = e->k + ((l * B + i) * G) * S, *q = e->q + ((l * B + i) * H) * S;
    for (size_t g = 0; g < G; g++)
        key_put(s->keys + (l * G + g) * Ct * S, S, n, k + g * S);
    for (size_t g = 0; (e->reads & KVE_READS_ATTN) && g < G; g++) {
        const uint16_t *kg = s->keys + (l * G + g) * Ct * S;
        kve_status st = kve_attn_rows_f16(q + g * R * S, S, R, S, kg, n + 1, m->scale, tmp, Ct);
        if (st != KVE_OK)
            return st;
        for (size_t r = 0; r < R; r++) { /* slot order to kept order */
            const float *from = tmp + r * Ct;
            float *to = rows + (g * R + r) * ld;
            for (size_t j = 0; j < n; j++)
                to[j] = from[s->slot[j]];
        }
    }
    return KVE_OK;
}

/* Steps layer l's heads of the bank at pos with token i: its rows (NULL
 * for a policy that reads none), keys, queries and values. */
static kve_status layer_step(kvl_seq *s, size_t l, size_t i, int32_t pos, const float *rows)
{
    const kvl_engine *e = s->e;
    const kvl_model *m = e->m;
    const size_t H = m->H, G = m->G, S = m->S, B = e->opt.batch;
    kve_step_data d = kve_step_default_data();
    d.attn = rows;
    d.ld = s->n ? s->n : 1;
    d.group = m->R;
    d.reduce = KVE_REDUCE_MEAN;
    d.keys = e->k + ((l * B + i) * G) * S;
    d.ld_keys = S;
    if (e->reads & KVE_READS_QUERIES) {
        d.queries = e->q + ((l * B + i) * H) * S;
        d.ld_queries = S;
    }
    if (e->reads & KVE_READS_VALUES) {
        d.values = e->v + ((l * B + i) * G) * S;
        d.ld_values = S;
    }
    return kve_bank_step_data(s->bank, l * G, G, pos, &d);
}

/* A helper: layer_rows of its layers for each token the main thread hands
 * out, until told to quit. */
static void *helper_main(void *arg)
{
    kvl_helper *w = arg;
    kvl_engine *e = w->e;
    unsigned long seen = 0;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (e->job == seen && !e->quit)
            pthread_cond_wait(&e->go, &e->mu);
        if (e->quit)
            break;
        seen = e->job;
        kvl_seq *s = e->job_seq;
        const size_t i = e->job_i, HC = e->m->H * e->C;
        pthread_mutex_unlock(&e->mu);
        kve_status st = KVE_OK;
        for (size_t l = w->l0; st == KVE_OK && l < w->l1; l++)
            st = layer_rows(s, l, i, w->rows + (l - w->l0) * HC, w->tmp);
        w->st = st;
        if (st != KVE_OK)
            snprintf(w->msg, sizeof w->msg, "%s", kve_last_error());
        pthread_mutex_lock(&e->mu);
        if (--e->pending == 0)
            pthread_cond_signal(&e->done);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Starts the helpers: min(kv_threads, L) - 1 of them when the policy reads
 * rows (the rest of the per-token work is a small part of it), each with
 * a share of the layers besides the main thread's L / kv_threads. */
static kve_status start_helpers(kvl_engine *e)
{
    const kvl_model *m = e->m;
    const size_t want = e->opt.kv_threads ? e->opt.kv_threads : e->opt.threads;
    const size_t L = m->L, T = want < L ? want : L;
    if (!(e->reads & KVE_READS_ATTN) || T < 2)
        return KVE_OK;
    const int mu = pthread_mutex_init(&e->mu, NULL) == 0;
    const int go = mu && pthread_cond_init(&e->go, NULL) == 0;
    const int done = go && pthread_cond_init(&e->done, NULL) == 0;
    if (!done) {
        if (go)
            pthread_cond_destroy(&e->go);
        if (mu)
            pthread_mutex_destroy(&e->mu);
        return kve_set_error(KVE_ENOMEM, "engine: cannot make the helpers' lock");
    }
    e->sync = 1;
    if (!(e->help = calloc(T - 1, sizeof *e->help)))
        return kve_set_error(KVE_ENOMEM, "engine: out of memory for %zu helpers", T - 1);
    e->help_cap = T - 1;
    e->l_main = L / T;
    for (size_t h = 0; h < T - 1; h++) {
        kvl_helper *w = &e->help[h];
        w->e = e;
        w->l0 = e->l_main + (L - e->l_main) * h / (T - 1);
        w->l1 = e->l_main + (L - e->l_main) * (h + 1) / (T - 1);
        if (!(w->rows = malloc((w->l1 - w->l0) * m->H * e->C * sizeof(float))) ||
            !(w->tmp = malloc(m->R * e->Ct * sizeof(float))))
            return kve_set_error(KVE_ENOMEM, "engine: out of memory for helper %zu's rows", h);
    }
    /* the helpers start with every signal blocked, so that a signal (the
     * tool's cleanup of a temporary file) reaches the main thread only */
    sigset_t all, was;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &was);
    int err = 0;
    for (size_t h = 0; !err && h < T - 1; h++)
        if (!(err = pthread_create(&e->help[h].thread, NULL, helper_main, &e->help[h])))
            e->n_help++;
    pthread_sigmask(SIG_SETMASK, &was, NULL);
    if (err)
        return kve_set_error(KVE_ENOMEM, "engine: cannot start helper thread %zu: %s", e->n_help,
                             strerror(err));
    return KVE_OK;
}

/* Steps the bank at position pos with token i of the decode just made,
 * layer by layer (layer_rows, then layer_step). With helpers, the rows of
 * layers l_main .. L are theirs, made while the main thread does its own
 * layers; the main thread then steps those layers with them: a
 * same_positions bank's steps must not overlap (kvevict.h). */
static kve_status step_token(kvl_seq *s, size_t i, int32_t pos)
{
    kvl_engine *e = s->e;
    const size_t L = e->m->L, HC = e->m->H * e->C, n = s->n;
    const int rows = (e->reads & KVE_READS_ATTN) != 0;
    const size_t own = rows && e->n_help ? e->l_main : L;
    if (own < L) {
        pthread_mutex_lock(&e->mu);
        e->job_seq = s;
        e->job_i = i;
        e->pending = e->n_help;
        e->job++;
        pthread_cond_broadcast(&e->go);
        pthread_mutex_unlock(&e->mu);
    }
    kve_status st = KVE_OK;
    for (size_t l = 0; st == KVE_OK && l < own; l++) {
        st = layer_rows(s, l, i, e->rows, e->tmp);
        if (st == KVE_OK)
            st = layer_step(s, l, i, pos, rows ? e->rows : NULL);
    }
    if (own < L) {
        pthread_mutex_lock(&e->mu);
        while (e->pending)
            pthread_cond_wait(&e->done, &e->mu);
        pthread_mutex_unlock(&e->mu);
        for (size_t h = 0; st == KVE_OK && h < e->n_help; h++) {
            const kvl_helper *w = &e->help[h];
            if (w->st != KVE_OK)
                st = kve_set_error(w->st, "%s", w->msg);
            for (size_t l = w->l0; st == KVE_OK && l < w->l1; l++)
                st = layer_step(s, l, i, pos, w->rows + (l - w->l0) * HC);
        }
    }
    if (st != KVE_OK)
        return st;
    s->kpos[n] = pos;
    s->slot[n] = (int32_t)n;
    s->n = n + 1;
    return KVE_OK;
}

/* Evicts the bank to its budget, removes the victims from llama.cpp's
 * cells and from the key copy, and keeps the copy dense: each slot freed
 * below the new count takes a kept slot from above it. */
static kve_status evict(kvl_seq *s)
{
    kvl_engine *e = s->e;
    const kvl_model *m = e->m;
    const size_t LG = m->L * m->G, S = m->S, C = e->C, Ct = e->Ct;
    kve_status st = kve_bank_evict(s->bank, e->budget, e->victims, C, e->counts);
    if (st != KVE_OK)
        return st;
    const size_t nv = e->counts[0];
    const int32_t *v = e->victims; /* head 0's: every head's are the same */
    for (size_t j = 0; j < nv; j++)
        if (!e->api->llama_memory_seq_rm(e->mem, s->id, v[j], v[j] + 1))
            return kve_set_error(KVE_EIO, "llama.cpp refused to remove position %d of sequence "
                                 "%d", v[j], s->id);
    size_t w = 0, a = 0, n = s->n;
    for (size_t i = 0; i < n; i++) { /* both ascending: one merge */
        while (a < nv && v[a] < s->kpos[i])
            a++;
        if (a < nv && v[a] == s->kpos[i]) {
            e->used[s->slot[i]] = 0;
            continue;
        }
        e->used[s->slot[i]] = 1;
        s->kpos[w] = s->kpos[i];
        s->slot[w++] = s->slot[i];
    }
    size_t free_slot = 0;
    for (size_t i = 0; i < w; i++) {
        if ((size_t)s->slot[i] < w)
            continue;
        while (e->used[free_slot])
            free_slot++;
        for (size_t h = 0; h < LG; h++) {
            uint16_t *to = key_slot(s->keys + h * Ct * S, S, free_slot);
            const uint16_t *from = key_slot(s->keys + h * Ct * S, S, (size_t)s->slot[i]);
            for (size_t c = 0; c < S; c++)
                to[c * KVE_ATTN_TILE] = from[c * KVE_ATTN_TILE];
        }
        e->used[free_slot] = 1;
        s->slot[i] = (int32_t)free_slot;
    }
    memset(e->used, 0, n);
    s->n = w;
    if (kve_bank_size(s->bank, 0) != w ||
        memcmp(kve_bank_positions(s->bank, 0), s->kpos, w * sizeof(int32_t)) != 0)
        return kve_set_error(KVE_EIO, "engine: the key copy lost step with the bank (kvevict "
                             "keeps %zu positions, the copy %zu)", kve_bank_size(s->bank, 0), w);
    return KVE_OK;
}

/* One llama_decode of tokens[0 .. m) (m <= B), then kvevict's part. */
static kve_status decode_batch(kvl_seq *s, const int32_t *tokens, size_t m, float *logits)
{
    kvl_engine *e = s->e;
    const kvl_model *m_ = e->m;
    struct llama_batch *b = &e->batch;
    for (size_t i = 0; i < m; i++) {
        b->token[i] = tokens[i];
        b->pos[i] = s->pos + (int32_t)i;
        b->n_seq_id[i] = 1;
        b->seq_id[i][0] = s->id;
        b->logits[i] = logits || i + 1 == m;
    }
    b->n_tokens = (int32_t)m;
    e->n_tokens = m;
    e->mask_seen = 0;
    e->mask = NULL;
    memset(e->qt, 0, m_->L * sizeof(const struct ggml_tensor *));
    e->bad[0] = '\0';
    memset(e->got, 0, m_->L);
    kvl_llama_error_clear();
    int32_t ret = e->api->llama_decode(e->ctx, *b);
    if (ret != 0)
        return kve_set_error(KVE_EIO, "llama_decode returned %d at position %d (%s)", ret, s->pos,
                             ret == 1 ? "no free cell: the context is full" : kvl_llama_error());
    if (e->bad[0])
        return kve_set_error(KVE_EIO, "llama.cpp's graph: %s", e->bad);
    for (size_t i = logits ? 0 : m - 1; i < m; i++) {
        const float *lg = e->api->llama_get_logits_ith(e->ctx, (int32_t)i);
        if (!lg)
            return kve_set_error(KVE_EIO, "llama.cpp gave no logits for token %zu of the batch",
                                 i);
        for (size_t v = 0; v < m_->V; v++)
            if (!isfinite(lg[v]))
                return kve_set_error(KVE_EIO, "llama.cpp's logit %zu at position %d is not "
                                     "finite", v, s->pos + (int32_t)i);
        if (logits)
            memcpy(logits + i * m_->V, lg, m_->V * sizeof(float));
        if (i + 1 == m)
            memcpy(s->logits, lg, m_->V * sizeof(float));
    }
    double t0 = now();
    kve_status st = KVE_OK;
    if (e->opt.capture && !e->mask_seen)
        st = kve_set_error(KVE_EIO, "llama.cpp's graph: no attention node with a mask in layer "
                           "0: this architecture is not one kvevict-llama reads");
    const size_t before = s->bank || e->opt.window ? s->n : (size_t)s->pos;
    for (size_t i = 0; st == KVE_OK && e->opt.capture && i < m; i++)
        if (e->attended[i] != before + i + 1)
            st = kve_set_error(KVE_EIO, "llama.cpp attends %zu cells at position %d, where "
                               "kvevict keeps %zu and the batch adds %zu", e->attended[i],
                               s->pos + (int32_t)i, before, i + 1);
    if (st == KVE_OK && e->opt.capture && m > 0 &&
        e->attended[m - 1] > s->max_cells)
        s->max_cells = e->attended[m - 1];
    const unsigned want = ((e->reads & (KVE_READS_ATTN | KVE_READS_QUERIES)) ? 1u : 0u) |
                          ((e->reads & (KVE_READS_ATTN | KVE_READS_KEYS | KVE_READS_QUERIES)) ? 2u : 0u) |
                          ((e->reads & KVE_READS_VALUES) ? 4u : 0u);
    for (size_t l = 0; st == KVE_OK && s->bank && l < m_->L; l++) {
        unsigned miss = want & ~(unsigned)e->got[l];
        if (miss)
            st = kve_set_error(KVE_EIO, "llama.cpp's graph: layer %zu gave no %s: this "
                               "architecture does not name them Qcur-%zu, Kcur-%zu and Vcur-%zu",
                               l, miss & 1 ? "rotated queries" : miss & 2 ? "rotated keys" : "values",
                               l, l, l);
    }
    for (size_t i = 0; st == KVE_OK && s->bank && i < m; i++)
        st = step_token(s, i, s->pos + (int32_t)i);
    if (st == KVE_OK && s->bank)
        st = evict(s);
    e->kv_seconds += now() - t0;
    s->pos += (int32_t)m;
    if (st == KVE_OK && e->opt.window && (s->n += m) > e->opt.window) { /* the floor: no kvevict */
        e->api->llama_memory_seq_rm(e->mem, s->id, s->pos - (int32_t)s->n,
                                    s->pos - (int32_t)e->opt.window);
        s->n = e->opt.window;
    }
    return st;
}

kve_status kvl_decode(kvl_seq *s, const int32_t *tokens, size_t n, float *logits)
{
    kvl_engine *e = s->e;
    if (s->broken)
        return kve_set_error(KVE_EINVAL, "engine: sequence %d is broken: reset it", s->id);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (size_t)tokens[i] >= e->m->V)
            return kve_set_error(KVE_EINVAL, "token %d is outside the vocabulary [0, %zu)",
                                 tokens[i], e->m->V);
    if ((size_t)s->pos + n > (size_t)INT32_MAX)
        return kve_set_error(KVE_EINVAL, "position %d + %zu tokens is past 2^31", s->pos, n);
    for (size_t done = 0; done < n;) {
        size_t m = n - done < e->opt.batch ? n - done : e->opt.batch;
        kve_status st = decode_batch(s, tokens + done, m, logits ? logits + done * e->m->V : NULL);
        if (st != KVE_OK) {
            s->broken = 1;
            return st;
        }
        done += m;
    }
    return KVE_OK;
}

/* ---- a sequence's state as bytes ----
 *
 * Layout (little-endian): "kvlseq\0\0", u32 version 1, u32 0, u64 the
 * model's fingerprint, u64 L, G, S, V, u64 the next position, u64 kept n,
 * u64 max_cells, u32 spec length and the spec (0: no policy), u64 bank
 * image bytes and the image (kve_bank_save), n * L*G*S float32 the kept
 * keys in kept order (layer, KV head, then position; each the copy's half
 * float widened, rounded back to one when loaded), u64 llama.cpp's
 * bytes and its llama_state_seq_get_data, V float32 the logits after the
 * last token. The session file around it carries the checksum.
 */

enum { SEQ_VERSION = 1 };
#define LLAMA_IO_MAGIC 0xaf143cd8u /* llama.cpp's io_magic, first in a sequence's state */
static const char seq_magic[8] = {'k', 'v', 'l', 's', 'e', 'q', 0, 0};

typedef struct wbuf {
    unsigned char *p; /* NULL: count only */
    size_t at, cap;
} wbuf;

static void put(wbuf *w, const void *src, size_t n)
{
    if (n && w->p && w->at + n <= w->cap)
        memcpy(w->p + w->at, src, n);
    w->at += n;
}

static void put_u64(wbuf *w, uint64_t v)
{
    unsigned char b[8];
    for (int k = 0; k < 8; k++)
        b[k] = (unsigned char)(v >> (8 * k));
    put(w, b, 8);
}

static void put_u32(wbuf *w, uint32_t v)
{
    unsigned char b[4];
    for (int k = 0; k < 4; k++)
        b[k] = (unsigned char)(v >> (8 * k));
    put(w, b, 4);
}

/* float32 arrays as their bytes: the machines kvevict-llama runs on
 * (x86-64 Linux, llama.cpp's prebuilt) are little-endian. */
size_t kvl_seq_state_bound(const kvl_seq *s)
{
    const kvl_engine *e = s->e;
    const kvl_model *m = e->m;
    const double C = (double)e->C, heads = (double)(m->L * m->G), S = (double)m->S;
    const double spec = e->opt.spec ? (double)strlen(e->opt.spec) : 0;
    size_t empty = 0; /* the bank's image as it is (its per-head state), slots added below */
    if (s->bank && kve_bank_save(s->bank, NULL, 0, &empty) != KVE_OK)
        empty = SIZE_MAX / 4;
    const double bound = 8 + 8 + 8 * 8 + 4 + spec + 8 +                     /* header, spec */
                         (double)empty + C * heads * (8 * S + 64) + 65536 +   /* the bank */
                         C * heads * S * 4 +                                  /* kept keys */
                         8 + C * ((double)m->L * 2 * (double)m->G * S * 4 + 64) +
                         (double)m->L * 64 + 65536 +                          /* llama.cpp's */
                         (double)m->V * 4;                                    /* the logits */
    return bound < (double)(SIZE_MAX / 2) ? (size_t)bound : SIZE_MAX / 2;
}

kve_status kvl_seq_save(const kvl_seq *s, void *buf, size_t cap, size_t *size)
{
    const kvl_engine *e = s->e;
    const kvl_model *m = e->m;
    if (s->broken)
        return kve_set_error(KVE_EINVAL, "session: sequence %d is broken", s->id);
    size_t bank_bytes = 0, llama_bytes = e->api->llama_state_seq_get_size(e->ctx, s->id);
    if (s->bank && kve_bank_save(s->bank, NULL, 0, &bank_bytes) != KVE_OK)
        return KVE_EINVAL;
    size_t spec_len = e->opt.spec ? strlen(e->opt.spec) : 0;
    size_t need = 8 + 8 + 8 * 8 + 4 + spec_len + 8 + bank_bytes +
                  s->n * m->L * m->G * m->S * sizeof(float) + 8 + llama_bytes +
                  m->V * sizeof(float);
    *size = need;
    if (!buf)
        return KVE_OK;
    if (cap < need)
        return kve_set_error(KVE_ERANGE, "session: %zu bytes needed, %zu given", need, cap);
    wbuf w = {buf, 0, cap};
    put(&w, seq_magic, 8);
    put_u32(&w, SEQ_VERSION);
    put_u32(&w, 0);
    put_u64(&w, m->fingerprint);
    put_u64(&w, m->L), put_u64(&w, m->G), put_u64(&w, m->S), put_u64(&w, m->V);
    put_u64(&w, (uint64_t)s->pos), put_u64(&w, s->n), put_u64(&w, s->max_cells);
    put_u32(&w, (uint32_t)spec_len);
    put(&w, e->opt.spec, spec_len);
    put_u64(&w, bank_bytes);
    if (s->bank && kve_bank_save(s->bank, w.p + w.at, bank_bytes, &bank_bytes) != KVE_OK)
        return KVE_EINVAL;
    w.at += bank_bytes;
    for (size_t h = 0; h < m->L * m->G; h++)
        for (size_t i = 0; i < s->n; i++) {
            const uint16_t *k = key_slot(s->keys + h * e->Ct * m->S, m->S, (size_t)s->slot[i]);
            for (size_t c = 0; c < m->S; c++) {
                const float x = lm_f16_to_f32(k[c * KVE_ATTN_TILE]);
                put(&w, &x, sizeof x);
            }
        }
    put_u64(&w, llama_bytes);
    if (e->api->llama_state_seq_get_data(e->ctx, w.p + w.at, llama_bytes, s->id) != llama_bytes)
        return kve_set_error(KVE_EIO, "session: llama.cpp did not write sequence %d's state",
                             s->id);
    w.at += llama_bytes;
    put(&w, s->logits, m->V * sizeof(float));
    return w.at == need ? KVE_OK : kve_set_error(KVE_EIO, "session: %zu bytes written, %zu "
                                                 "planned", w.at, need);
}

typedef struct rbuf {
    const unsigned char *p;
    size_t at, size;
} rbuf;

/* The next n bytes, or NULL when the state ends first. */
static const unsigned char *take_bytes(rbuf *r, size_t n)
{
    if (n > r->size - r->at)
        return NULL;
    r->at += n;
    return r->p + r->at - n;
}

static int get_u64(rbuf *r, uint64_t *v)
{
    const unsigned char *b = take_bytes(r, 8);
    if (!b)
        return 0;
    *v = 0;
    for (int k = 7; k >= 0; k--)
        *v = *v << 8 | b[k];
    return 1;
}

static int get_u32(rbuf *r, uint32_t *v)
{
    const unsigned char *b = take_bytes(r, 4);
    if (!b)
        return 0;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return 1;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Whether a cache element of ggml type t (F32 0, F16 1, BF16 30) is finite. */
static int finite_elt(int32_t t, const unsigned char *p)
{
    if (t == 0) {
        float x;
        memcpy(&x, p, 4);
        return isfinite(x);
    }
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    return t == 1 ? (h & 0x7C00u) != 0x7C00u : (h & 0x7F80u) != 0x7F80u;
}

/* Reads one layer's rows of one kind (K or V) of llama.cpp's state: its
 * type, then (not transposed) the row size and cells rows, or (V
 * transposed) the element size, the width and width x cells elements;
 * each checked against the model (G*S wide, a float type) and finite. */
static kve_status state_rows(rbuf *r, const char *what, size_t l, int transposed, size_t cells,
                             size_t width)
{
    uint32_t t = 0, el = 0, w = 0;
    uint64_t row = 0;
    if (!get_u32(r, &t) || (t != 0 && t != 1 && t != 30))
        return kve_set_error(KVE_EFORMAT, "session: llama.cpp's state: layer %zu's %s are of "
                             "ggml type %u, not float32, float16 or bfloat16", l, what,
                             (unsigned)t);
    size_t esize = t == 0 ? 4 : 2;
    if (!transposed ? !get_u64(r, &row) || row != esize * width
                    : !get_u32(r, &el) || el != esize || !get_u32(r, &w) || w != width)
        return kve_set_error(KVE_EFORMAT, "session: llama.cpp's state: layer %zu's %s are not "
                             "rows of %zu elements", l, what, width);
    const unsigned char *p = take_bytes(r, cells * width * esize);
    if (!p)
        return kve_set_error(KVE_EFORMAT, "session: llama.cpp's state: layer %zu's %s are cut "
                             "off", l, what);
    for (size_t i = 0; i < cells * width; i++)
        if (!finite_elt((int32_t)t, p + i * esize))
            return kve_set_error(KVE_EFORMAT, "session: llama.cpp's state: layer %zu's %s hold "
                                 "a value that is not finite", l, what);
    return KVE_OK;
}

/* llama.cpp's state of one sequence, this release's layout read whole (its
 * magic, the sequence, one stream, the cells: position, sequences, id; the
 * layout of V, the layers; each layer's keys, then each layer's values)
 * before llama.cpp reads it: it holds exactly the positions want[0 .. n)
 * (ascending), each once, rows of the model's width, every value finite,
 * and nothing after them. */
static kve_status check_llama_state(const unsigned char *p, size_t size, const int32_t *want,
                                    size_t n, const kvl_model *m)
{
    rbuf r = {p, 0, p ? size : 0};
    uint32_t magic = 0, seq = 0, streams = 0, cells = 0;
    if (!p || !get_u32(&r, &magic) || magic != LLAMA_IO_MAGIC || !get_u32(&r, &seq) ||
        !get_u32(&r, &streams) || streams != 1 || !get_u32(&r, &cells))
        return kve_set_error(KVE_EFORMAT, "session: llama.cpp's state: not one stream of this "
                             "release (magic %#x)", p && size >= 4 ? (unsigned)p[0] | p[1] << 8 |
                             p[2] << 16 | (unsigned)p[3] << 24 : 0u);
    if (cells != n)
        return kve_set_error(KVE_EFORMAT, "session: llama.cpp's state holds %lu cells, kvevict "
                             "keeps %zu positions", (unsigned long)cells, n);
    int32_t *pos = malloc((n ? n : 1) * sizeof *pos);
    if (!pos)
        return kve_set_error(KVE_ENOMEM, "session: out of memory");
    kve_status st = KVE_OK;
    for (size_t i = 0; st == KVE_OK && i < n; i++) {
        uint32_t p32 = 0, nseq = 0, id = 0;
        if (!get_u32(&r, &p32) || !get_u32(&r, &nseq) || nseq != 1 || !get_u32(&r, &id))
            st = kve_set_error(KVE_EFORMAT, "session: llama.cpp's state: cell %zu is cut off or "
                               "not of one sequence", i);
        pos[i] = (int32_t)p32;
    }
    if (st == KVE_OK) {
        qsort(pos, n, sizeof *pos, cmp_i32);
        for (size_t i = 0; st == KVE_OK && i < n; i++)
            if (pos[i] != want[i])
                st = kve_set_error(KVE_EFORMAT, "session: llama.cpp's cells hold position %d "
                                   "where kvevict keeps %d", pos[i], want[i]);
    }
    free(pos);
    uint32_t v_trans = 0, layers = 0;
    if (st == KVE_OK && n && (!get_u32(&r, &v_trans) || v_trans > 1 || !get_u32(&r, &layers) ||
                              layers != m->L))
        st = kve_set_error(KVE_EFORMAT, "session: llama.cpp's state: not %zu layers of keys and "
                           "values", m->L);
    for (int kind = 0; st == KVE_OK && n && kind < 2; kind++)
        for (size_t l = 0; st == KVE_OK && l < m->L; l++)
            st = state_rows(&r, kind ? "values" : "keys", l, kind && v_trans, n, m->G * m->S);
    if (st == KVE_OK && r.at != size)
        st = kve_set_error(KVE_EFORMAT, "session: llama.cpp's state: %zu bytes after its "
                           "values", size - r.at);
    return st;
}

/* Whether a loaded bank is one this engine's sequences run: the options of
 * the bank it builds (kve_bank_copy names what differs: key_dim, value_dim,
 * query_group, the rope), and a step at the next position accepted by a
 * copy of it (every head at the same last position, below pos), with NULL
 * attention and zero keys, queries and values. */
static kve_status trial(const kvl_engine *e, const kve_bank *bank, int32_t pos)
{
    const kvl_model *m = e->m;
    const size_t LG = m->L * m->G;
    kve_bank *copy = NULL;
    float *zero = calloc(LG * (m->R + 2) * m->S, sizeof *zero);
    kve_status st = zero ? make_bank(e, &copy) : KVE_ENOMEM;
    if (st == KVE_OK && (st = kve_bank_copy(copy, bank)) == KVE_OK) {
        kve_step_data d = kve_step_default_data();
        d.keys = zero, d.ld_keys = m->S;
        d.queries = zero, d.ld_queries = m->S;
        d.values = zero, d.ld_values = m->S;
        st = kve_bank_step_data(copy, 0, LG, pos, &d);
    }
    if (!zero)
        st = kve_set_error(KVE_ENOMEM, "session: out of memory for a trial step");
    else if (st != KVE_OK)
        st = kve_set_error(KVE_EFORMAT, "session: the bank: %s", kve_last_error());
    kve_bank_free(copy);
    free(zero);
    return st;
}

kve_status kvl_seq_load(kvl_seq *s, const void *buf, size_t size)
{
    kvl_engine *e = s->e;
    const kvl_model *m = e->m;
    if (s->pos != 0 || s->broken)
        return kve_set_error(KVE_EINVAL, "session: sequence %d is not empty", s->id);
    rbuf r = {buf, 0, size};
    const unsigned char *mg = take_bytes(&r, 8);
    uint32_t version = 0, flags = 0, spec_len = 0;
    uint64_t fp = 0, L = 0, G = 0, S = 0, V = 0, pos = 0, n = 0, max_cells = 0, bank_bytes = 0,
             llama_bytes = 0;
    if (!mg || memcmp(mg, seq_magic, 8) != 0)
        return kve_set_error(KVE_EFORMAT, "session: not a kvevict-llama sequence state");
    if (!get_u32(&r, &version) || version != SEQ_VERSION)
        return kve_set_error(KVE_EFORMAT, "session: the sequence's version %u, this "
                             "kvevict-llama reads %d", (unsigned)version, SEQ_VERSION);
    if (!get_u32(&r, &flags) || flags)
        return kve_set_error(KVE_EFORMAT, "session: the sequence's flags %#x, this "
                             "kvevict-llama knows none (0)", (unsigned)flags);
    if (!get_u64(&r, &fp) || !get_u64(&r, &L) || !get_u64(&r, &G) || !get_u64(&r, &S) ||
        !get_u64(&r, &V) || !get_u64(&r, &pos) || !get_u64(&r, &n) || !get_u64(&r, &max_cells) ||
        !get_u32(&r, &spec_len))
        return kve_set_error(KVE_EFORMAT, "session: the header is cut off");
    if (fp != m->fingerprint || L != m->L || G != m->G || S != m->S || V != m->V)
        return kve_set_error(KVE_EINVAL, "session: of another model (fingerprint %016llx, %llu "
                             "layers x %llu KV heads; this one's %016llx, %zu x %zu)",
                             (unsigned long long)fp, (unsigned long long)L,
                             (unsigned long long)G, (unsigned long long)m->fingerprint, m->L,
                             m->G);
    const unsigned char *spec = take_bytes(&r, spec_len);
    const char *mine = e->opt.spec ? e->opt.spec : "";
    if (!spec)
        return kve_set_error(KVE_EFORMAT, "session: the policy's spec is cut off");
    if (spec_len != strlen(mine) || memcmp(spec, mine, spec_len) != 0)
        return kve_set_error(KVE_EINVAL, "session: policy: the session's is '%.*s', this run's "
                             "'%s'", (int)spec_len, (const char *)spec,
                             e->opt.spec ? e->opt.spec : "none");
    if (pos > (uint64_t)INT32_MAX || n > e->C || (e->opt.spec && n > e->budget) ||
        (!e->opt.spec && (n != 0 || pos > kvl_engine_n_ctx(e))) || max_cells > pos)
        return kve_set_error(KVE_EFORMAT, "session: position %llu, %llu kept and %llu cells at "
                             "most do not fit this run (budget %zu)", (unsigned long long)pos,
                             (unsigned long long)n, (unsigned long long)max_cells, e->budget);
    const unsigned char *img = get_u64(&r, &bank_bytes) ? take_bytes(&r, bank_bytes) : NULL;
    if (!img)
        return kve_set_error(KVE_EFORMAT, "session: the bank's image is cut off");
    kve_bank *bank = NULL;
    kve_status st = KVE_OK;
    if (e->opt.spec) {
        st = kve_bank_load(img, bank_bytes, NULL, &bank);
        if (st != KVE_OK)
            return kve_set_error(KVE_EFORMAT, "session: the bank: %s", kve_last_error());
        const int32_t *bp = kve_bank_positions(bank, 0);
        /* llama.cpp's cells end at the newest position (the engine never
         * evicts it), from which the next batch must go on */
        int ok = kve_bank_same_positions(bank) && kve_bank_heads(bank) == L * G &&
                 strcmp(kve_bank_spec(bank), e->opt.spec) == 0 && kve_bank_size(bank, 0) == n &&
                 (n ? bp[n - 1] == (int32_t)pos - 1 : pos == 0);
        if (!ok) {
            kve_set_error(KVE_EFORMAT, "session: the bank is not one this run could have made: "
                          "%zu heads (this model: %zu) of '%s', %zu kept, the next position "
                          "%llu", kve_bank_heads(bank), L * G, kve_bank_spec(bank), (size_t)n,
                          (unsigned long long)pos);
            kve_bank_free(bank);
            return KVE_EFORMAT;
        }
        if ((st = trial(e, bank, (int32_t)pos)) != KVE_OK) {
            kve_bank_free(bank);
            return st;
        }
    } else if (bank_bytes) {
        return kve_set_error(KVE_EFORMAT, "session: a bank without a policy");
    }
    const size_t key_floats = (size_t)n * m->L * m->G * m->S;
    const unsigned char *keys = take_bytes(&r, key_floats * sizeof(float));
    const unsigned char *ls = keys && get_u64(&r, &llama_bytes) ? take_bytes(&r, llama_bytes)
                                                                 : NULL;
    const unsigned char *lg = ls ? take_bytes(&r, m->V * sizeof(float)) : NULL;
    if (!keys || !ls || !lg || r.at != size) {
        kve_bank_free(bank);
        return kve_set_error(KVE_EFORMAT, "session: %s", !lg ? "the keys, llama.cpp's state or "
                             "the logits are cut off" : "bytes after the logits");
    }
    for (size_t i = 0; st == KVE_OK && i < key_floats + m->V; i++) {
        float x;
        memcpy(&x, i < key_floats ? keys + 4 * i : lg + 4 * (i - key_floats), 4);
        if (!isfinite(x))
            st = kve_set_error(KVE_EFORMAT, "session: %s %zu is not finite",
                               i < key_floats ? "key value" : "logit",
                               i < key_floats ? i : i - key_floats);
        else if (i < key_floats && fabsf(x) >= 65520.0f) /* infinite in llama.cpp's float16 */
            st = kve_set_error(KVE_EFORMAT, "session: key value %zu (%g) is beyond float16's "
                               "range, where llama.cpp's cache holds the key", i, (double)x);
        else if (i < key_floats && lm_f16_to_f32(lm_f32_to_f16(x)) != x)
            st = kve_set_error(KVE_EFORMAT, "session: key value %zu (%.9g) is not a half float, "
                               "as the key copy holds its keys: not this kvevict-llama's "
                               "session (an older one kept float32 keys)", i, (double)x);
    }
    if (st == KVE_OK) {
        int32_t *want = malloc((e->opt.spec ? n : pos) * sizeof *want + 1);
        if (!want)
            st = kve_set_error(KVE_ENOMEM, "session: out of memory");
        for (size_t i = 0; want && i < (e->opt.spec ? n : pos); i++)
            want[i] = e->opt.spec ? kve_bank_positions(bank, 0)[i] : (int32_t)i;
        if (want)
            st = check_llama_state(ls, llama_bytes, want, e->opt.spec ? (size_t)n : (size_t)pos,
                                   m);
        free(want);
    }
    if (st == KVE_OK && e->api->llama_state_seq_set_data(e->ctx, ls, llama_bytes, s->id) !=
                            llama_bytes)
        st = kve_set_error(KVE_EIO, "session: llama.cpp refused its own state: %s",
                           kvl_llama_error());
    if (st != KVE_OK) {
        kve_bank_free(bank);
        e->api->llama_memory_seq_rm(e->mem, s->id, -1, -1);
        return st;
    }
    if (bank) {
        kve_bank_free(s->bank);
        s->bank = bank;
        for (size_t i = 0; i < n; i++) {
            s->kpos[i] = kve_bank_positions(bank, 0)[i];
            s->slot[i] = (int32_t)i;
        }
        for (size_t h = 0; h < m->L * m->G; h++)
            for (size_t i = 0; i < n; i++) {
                uint16_t *k = key_slot(s->keys + h * e->Ct * m->S, m->S, i);
                for (size_t c = 0; c < m->S; c++) {
                    float x;
                    memcpy(&x, keys + ((h * n + i) * m->S + c) * sizeof x, sizeof x);
                    k[c * KVE_ATTN_TILE] = lm_f32_to_f16(x);
                }
            }
    }
    s->n = (size_t)n;
    s->pos = (int32_t)pos;
    s->max_cells = (size_t)max_cells;
    memcpy(s->logits, lg, m->V * sizeof(float));
    return KVE_OK;
}
