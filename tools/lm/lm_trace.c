/* SPDX-License-Identifier: MIT */
/*
 * lm_trace.c - the `lm:` trace source of every command that reads a trace:
 * a llama2.c model's full-cache attention, decoded when the command starts
 * and spooled through a temporary .npy file (below). A source of the tool,
 * not of the library, which knows nothing of lm/; traces.c opens it.
 */
#define _POSIX_C_SOURCE 200809L
#include "lm_cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the model's attention as a trace source -----------------------------------
 *
 * --trace lm:model=CKPT,text=FILE[,tokenizer=TOK][,steps=T][,window=W][,heads=kv|query]
 * in every command that reads a trace: what `lm dump` writes for evaluation
 * window W of the text (BOS, then the encoded text from token W * (seq_len - 1)
 * on: the windows of `lm eval`), T steps (default: the model's context; at
 * most 8192, as L * H * T^2 * 4 bytes go to the temporary file),
 * spooled to a temporary .npy file that is removed as soon as it is open.
 * Everything loaded is freed before returning.
 */

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
    /* L * H * T^2 * 4 bytes go to TMPDIR: 2 GiB for 32 heads at the cap */
    size_t T = steps ? (size_t)parse_u64("--trace lm: steps", steps, 1, 1u << 13) : 0;
    size_t w = window ? (size_t)parse_u64("--trace lm: window", window, 0, SIZE_MAX / 2) : 0;

    lm_model *m = NULL;
    if (lm_model_open(model, NULL, &m) != KVE_OK)
        die_input("--trace lm: model %s: %s", model, kve_last_error());
    lm_tokenizer *tok = open_tokenizer(tokenizer, model, m, "--trace lm: tokenizer");
    char *txt = NULL;
    size_t txt_len = 0;
    if (lm_read_file(NULL, text, &txt, &txt_len) != KVE_OK)
        die_input("--trace lm: text: %s", kve_last_error());
    if (memchr(txt, 0, txt_len))
        die_input("--trace lm: text %s: holds a NUL byte", text);
    int32_t *ids = xmalloc((txt_len + 2) * sizeof *ids);
    size_t n_ids;
    kve_status st = lm_encode(tok, txt, txt_len, ids + 1, txt_len + 1, &n_ids);
    if (st != KVE_OK)
        die_lm(st, "--trace lm: text");
    const lm_config *c = &m->config;
    if (!T)
        T = (size_t)c->seq_len < (1u << 13) ? (size_t)c->seq_len : 1u << 13;
    size_t chunk = c->seq_len > 1 ? (size_t)c->seq_len - 1 : 1, start = w * chunk;
    if (start > n_ids || n_ids - start < T - 1)
        die_usage("--trace %s: the text has %zu tokens; window %zu of %zu steps needs %zu", src,
                  n_ids, w, T, start + T - 1);
    /* BOS just before the window's first token. */
    int32_t *toks = ids + start;
    toks[0] = LM_BOS;
    size_t group = heads && strcmp(heads, "query") == 0 ? 1 : (size_t)(c->n_heads / c->n_kv_heads);

    const char *dir = getenv("TMPDIR");
    static unsigned serial; /* names never repeat within a run (trace_name's aliases) */
    char path[4096];
    snprintf(path, sizeof path, "%s/kvevict-lm-%ld-%u-XXXXXX", dir && *dir ? dir : "/tmp",
             (long)getpid(), serial++);
    int fd = temp_create(path);
    if (fd < 0)
        die_input("--trace lm: cannot create a temporary file: %s", strerror(errno));
    FILE *f = fdopen(fd, "wb");
    if (!f)
        die_input("--trace lm: %s: %s", path, strerror(errno));
    if (write_attention(f, m, toks, T, group) != 0 || fclose(f) != 0)
        die_input("--trace lm: cannot write %s: %s", path, strerror(errno));
    free(ids);
    lm_free(NULL, txt);
    lm_tokenizer_free(tok);
    lm_model_free(m);
    free_list(items, n_items);
    kve_trace *tr = NULL;
    progress pr;
    progress_begin(&pr, "validating row", 0, 0, 1);
    kve_trace_options o = kve_trace_default_options();
    o.flags = (kve_trace_flags)flags;
    o.progress = progress_callback;
    o.user = &pr;
    st = kve_trace_open(path, &o, &tr);
    progress_end(&pr);
    unlink(path);
    temp_forget(path);
    if (st != KVE_OK)
        die_status(st, "--trace");
    trace_alias(path, src);
    return tr;
}
