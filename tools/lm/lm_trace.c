/* SPDX-License-Identifier: MIT */
/*
 * lm_trace.c - the `lm:` trace source of every command that reads a trace:
 * the command line's side (the spec's keys, loading the checkpoint, the
 * tokenizer and the text, the window) of a llama2.c model's full-cache
 * attention, which lm_trace_new (lm/trace.c) streams into the harness as the
 * decoder computes it: no temporary file, no size ceiling beyond memory for
 * the decoder's cache. traces.c opens it.
 */
#define _POSIX_C_SOURCE 200809L
#include "lm_cli.h"

#include <stdlib.h>
#include <string.h>

/* ---- the model's attention as a trace source -----------------------------------
 *
 * --trace lm:model=CKPT,text=FILE[,tokenizer=TOK][,steps=T][,window=W][,heads=kv|query]
 * in every command that reads a trace: what `lm dump` writes for evaluation
 * window W of the text (BOS, then the encoded text from token W * (seq_len - 1)
 * on: the windows of `lm eval`), T steps (default: the model's context, at
 * most 8192; given, at most 2^20, as `lm dump --steps`). The trace owns the
 * model; the text and the tokenizer are freed before returning. The
 * commands read a trace head after head (eval, trace --stats), so the rows
 * of the first steps are kept as they are decoded, up to LM_TRACE_CACHE
 * bytes (every step of 32 heads of 2 Ki, or of 8 heads of 4 Ki): a longer
 * trace decodes again from its start for each head past the first.
 */

enum { LM_TRACE_CACHE = 512u << 20 };

static const char lm_trace_keys[] = "model, text, tokenizer, steps, window, heads";

kve_trace *lm_trace_open(const char *src, unsigned flags)
{
    const char *model = NULL, *text = NULL, *tokenizer = NULL, *steps = NULL, *window = NULL,
               *heads = NULL;
    size_t n_items;
    char **items = split_list("--trace", src + 3, &n_items);
    for (size_t i = 0; i < n_items; i++) {
        char *eq = strchr(items[i], '=');
        if (!eq || eq == items[i] || !eq[1])
            die_usage("--trace %s: '%s' is not key=value (keys: %s)", src, items[i],
                      lm_trace_keys);
        *eq = '\0';
        const char *k = items[i], *v = eq + 1;
        const char **slot = strcmp(k, "model") == 0       ? &model
                            : strcmp(k, "text") == 0      ? &text
                            : strcmp(k, "tokenizer") == 0 ? &tokenizer
                            : strcmp(k, "steps") == 0     ? &steps
                            : strcmp(k, "window") == 0    ? &window
                            : strcmp(k, "heads") == 0     ? &heads
                                                          : NULL;
        if (!slot)
            die_usage("--trace %s: unknown key '%s' (keys: %s)", src, k, lm_trace_keys);
        if (*slot)
            die_usage("--trace %s: %s is given twice", src, k);
        *slot = v;
    }
    if (!model || !text)
        die_usage("--trace %s: model= and text= are required", src);
    if (heads && strcmp(heads, "query") != 0 && strcmp(heads, "kv") != 0)
        die_usage("--trace %s: heads=%s is neither kv nor query", src, heads);
    size_t T = steps ? (size_t)parse_u64("--trace lm: steps", steps, 1, 1u << 20) : 0;
    size_t w = window ? (size_t)parse_u64("--trace lm: window", window, 0, SIZE_MAX / 2) : 0;

    lm_model *m = NULL;
    if (lm_model_open(model, NULL, &m) != KVE_OK)
        die_input("--trace lm: model %s: %s", model, kve_last_error());
    cli_watch_mapping(m->map, m->map_size, model); /* the trace owns it for the command */
    lm_tokenizer *tok = open_tokenizer(tokenizer, model, m, "--trace lm: tokenizer");
    char *txt = NULL;
    size_t txt_len = 0;
    if (lm_read_file(NULL, text, &txt, &txt_len) != KVE_OK)
        die_input("--trace lm: text: %s", kve_last_error());
    if (memchr(txt, 0, txt_len))
        die_input("--trace lm: text %s: holds a NUL byte", text);
    size_t cap = lm_encode_bound(tok, txt_len);
    if (cap > SIZE_MAX / sizeof(int32_t) - 1)
        die_input("--trace lm: text %s: too long", text);
    int32_t *ids = xmalloc((cap + 1) * sizeof *ids);
    size_t n_ids;
    kve_status st = lm_encode(tok, txt, txt_len, ids + 1, cap, &n_ids);
    if (st != KVE_OK)
        die_lm(st, "--trace lm: text");
    const lm_config *c = &m->config;
    if (!T)
        T = (size_t)c->seq_len < (1u << 13) ? (size_t)c->seq_len : 1u << 13;
    size_t chunk = c->seq_len > 1 ? (size_t)c->seq_len - 1 : 1, start = w * chunk;
    if (start > n_ids || n_ids - start < T - 1)
        die_usage("--trace %s: the text has %zu tokens; window %zu of %zu steps needs %zu", src,
                  n_ids, w, T, start + T - 1);
    /* BOS just before the window's first token (without one, the text token
     * before it: the text's last for window 0). */
    int32_t *toks = ids + start;
    if (m->config.bos >= 0)
        toks[0] = m->config.bos;
    else if (n_ids == 0)
        die_usage("--trace %s: the text is empty and the model has no BOS to start from", src);
    else if (start == 0)
        toks[0] = ids[n_ids];
    size_t group = heads && strcmp(heads, "query") == 0 ? 1 : (size_t)(c->n_heads / c->n_kv_heads);

    kve_trace_options o = kve_trace_default_options();
    o.flags = (kve_trace_flags)flags;
    lm_trace_options lo = {.trace = &o, .group = group, .own_model = 1,
                           .cache_bytes = LM_TRACE_CACHE};
    kve_trace *tr = NULL;
    st = lm_trace_new(m, toks, T, &lo, &tr);
    free(ids);
    lm_free(NULL, txt);
    lm_tokenizer_free(tok);
    free_list(items, n_items);
    if (st != KVE_OK) {
        lm_model_free(m);
        die_status(st, "--trace");
    }
    trace_alias(tr, src);
    return tr;
}
