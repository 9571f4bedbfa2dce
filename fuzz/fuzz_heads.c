/* SPDX-License-Identifier: MIT */
/*
 * fuzz_heads.c - the DuoAttention schedule parser (lm_heads_parse, lm/heads.c)
 * on whatever bytes the fuzzer makes.
 *
 * Checked:
 *   - a refusal is KVE_EFORMAT (or KVE_ENOMEM) with a non-empty one-line
 *     message and *out untouched;
 *   - an accepted schedule has 1 <= layers * kv_heads <= LM_HEADS_MAX, roles
 *     0 or 1, finite scores, and writing it back in the format and parsing
 *     that gives the same schedule;
 *   - lm_heads_budgets over it, at a few budgets, spends at most the uniform
 *     total, gives every streaming head at least the streaming budget and
 *     every retrieval head at most the context.
 */
#include "kvevict.h"
#include "lm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_heads: CHECK(%s) failed at line %d (last error: %s)\n", #c,      \
                    __LINE__, kve_last_error());                                                    \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void check_budgets(const lm_heads *h)
{
    size_t N = (size_t)h->layers * (size_t)h->kv_heads;
    size_t *out = malloc(N * sizeof *out);
    CHECK(out != NULL);
    lm_config c = {0};
    c.n_layers = h->layers;
    c.n_kv_heads = h->kv_heads;
    static const size_t budgets[][3] = {{256, 16, 512}, {51, 16, 512}, {7, 7, 3}, {1, 1, 1}};
    for (size_t k = 0; k < sizeof budgets / sizeof budgets[0]; k++) {
        size_t B = budgets[k][0], s = budgets[k][1], ctx = budgets[k][2], total = 0;
        CHECK(lm_heads_budgets(h, &c, B, s, ctx, out) == KVE_OK);
        for (size_t i = 0; i < N; i++) {
            total += out[i];
            if (h->retrieval[i])
                CHECK(out[i] <= (ctx > B ? ctx : B));
            else
                CHECK(out[i] >= s);
        }
        CHECK(total <= N * B);
    }
    c.n_layers = h->layers + 1; /* another model is refused */
    CHECK(lm_heads_budgets(h, &c, 8, 4, 8, out) == KVE_EINVAL);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lm_heads *h = (lm_heads *)&h; /* a sentinel: must stay untouched on refusal */
    lm_heads *const sentinel = h;
    kve_status st = lm_heads_parse((const char *)data, size, NULL, &h);
    if (st != KVE_OK) {
        CHECK(st == KVE_EFORMAT || st == KVE_ENOMEM);
        CHECK(h == sentinel);
        const char *m = kve_last_error();
        CHECK(m[0] != '\0' && strchr(m, '\n') == NULL);
        return 0;
    }
    size_t N = (size_t)h->layers * (size_t)h->kv_heads;
    CHECK(h->layers >= 1 && h->kv_heads >= 1 && N <= LM_HEADS_MAX);
    /* written back and parsed again: the same schedule */
    size_t cap = 64 + N * 64, len = 0;
    char *text = malloc(cap);
    CHECK(text != NULL);
    len += (size_t)snprintf(text + len, cap - len, "kvevict-heads 1\nlayers %d kv_heads %d\n",
                            h->layers, h->kv_heads);
    for (size_t i = 0; i < N; i++) {
        CHECK(h->retrieval[i] <= 1 && isfinite(h->score[i]));
        len += (size_t)snprintf(text + len, cap - len, "head %zu %zu %s %.17g\n",
                                i / (size_t)h->kv_heads, i % (size_t)h->kv_heads,
                                h->retrieval[i] ? "retrieval" : "streaming", h->score[i]);
    }
    lm_heads *g = NULL;
    CHECK(lm_heads_parse(text, len, NULL, &g) == KVE_OK);
    CHECK(g->layers == h->layers && g->kv_heads == h->kv_heads);
    CHECK(memcmp(g->retrieval, h->retrieval, N) == 0);
    for (size_t i = 0; i < N; i++)
        CHECK(g->score[i] == h->score[i]);
    check_budgets(h);
    lm_heads_free(g);
    lm_heads_free(h);
    free(text);
    return 0;
}
