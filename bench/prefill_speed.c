/* SPDX-License-Identifier: MIT */
/*
 * prefill_speed.c - what a prefill costs in the decoder: the CPU time of
 * reading one prompt and compressing it, by method, as a ratio to reading
 * it with every key kept and no policy (the floor, measured in the same
 * run). KVzip's reconstruction pass is the figure docs/prefill.md quotes.
 *
 * Usage: kvevict-prefill-speed [CKPT TOKENIZER TEXT [N [BUDGET]]]
 *   defaults: models/kjv.bin, models/tokenizer.bin, models/heldout.txt,
 *   N = seq_len - 1 prompt tokens (BOS and the text's first N - 1), BUDGET
 *   20% of the context; policy h2o.
 * Rows: none (the floor: lm_forward over the prompt, no policy), step
 * (h2o evicting per step), h2o, snapkv (lm_prefill), kvzip
 * (lm_prefill_kvzip, one chunk of 2048 as kvpress). Each the best of five
 * runs of the thread's CPU time. Speed is measured, never asserted.
 */
#define _POSIX_C_SOURCE 200809L
#include "lm.h"

#define BENCH_NAME "kvevict-prefill-speed"
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NONE, STEP, H2O, SNAPKV, KVZIP, METHODS };
static const char *const names[METHODS] = {"none", "step", "h2o", "snapkv", "kvzip"};

static double run(const lm_model *m, const lm_kvzip *kz, int method, const int32_t *toks,
                  size_t n, size_t budget)
{
    lm_options o = {.policy = method == NONE ? NULL : "h2o", .budget = method == NONE ? 0 : budget};
    lm_state *s = NULL;
    if (lm_state_new(m, &o, &s) != KVE_OK)
        die("state");
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        if (lm_state_reset(s) != KVE_OK)
            die("reset");
        kve_prefill_options p = kve_prefill_default_options();
        p.method = method == SNAPKV ? KVE_PREFILL_SNAPKV : method == KVZIP ? KVE_PREFILL_KVZIP
                                                                            : KVE_PREFILL_H2O;
        double t0 = now_s();
        kve_status st = KVE_OK;
        if (method == NONE || method == STEP)
            for (size_t i = 0; i < n && st == KVE_OK; i++)
                st = lm_forward(s, toks[i]);
        else if (method == KVZIP)
            st = lm_prefill_kvzip(s, toks, n, kz, &p);
        else
            st = lm_prefill(s, toks, n, &p);
        double t = now_s() - t0;
        if (st != KVE_OK)
            die(names[method]);
        best = t < best ? t : best;
    }
    lm_state_free(s);
    return best;
}

int main(int argc, char **argv)
{
    const char *ckpt = argc > 1 ? argv[1] : "models/kjv.bin";
    const char *tokp = argc > 2 ? argv[2] : "models/tokenizer.bin";
    const char *textp = argc > 3 ? argv[3] : "models/heldout.txt";
    lm_model *m = NULL;
    lm_tokenizer *t = NULL;
    if (lm_model_open(ckpt, NULL, &m) != KVE_OK)
        die(ckpt);
    if (lm_tokenizer_open(tokp, NULL, &t) != KVE_OK)
        die(tokp);
    char *text = NULL;
    size_t len = 0, nt = 0;
    if (lm_read_file(NULL, textp, &text, &len) != KVE_OK)
        die(textp);
    size_t T = (size_t)m->config.seq_len;
    size_t n = argc > 4 ? (size_t)strtoull(argv[4], NULL, 10) : T - 1;
    size_t budget = argc > 5 ? (size_t)strtoull(argv[5], NULL, 10) : T / 5;
    size_t cap = lm_encode_bound(t, len);
    int32_t *toks = malloc((cap + 1) * sizeof *toks);
    if (!toks || n < 2 || m->config.bos < 0 || lm_encode(t, text, len, toks + 1, cap, &nt) != KVE_OK ||
        nt + 1 < n)
        die("the prompt");
    toks[0] = m->config.bos;
    lm_kvzip kz;
    if (lm_kvzip_default(t, &kz) != KVE_OK)
        die("kvzip prompts");
    printf("prefill of %zu tokens, h2o at budget %zu (CPU seconds, best of 5; ratio to none)\n",
           n, budget);
    double floor = 0;
    for (int k = 0; k < METHODS; k++) {
        double s = run(m, &kz, k, toks, n, budget);
        if (k == NONE)
            floor = s;
        printf("%-7s %8.4f s  %5.2fx\n", names[k], s, s / floor);
    }
    free(toks);
    lm_free(NULL, text);
    lm_tokenizer_free(t);
    lm_model_free(m);
    return 0;
}
