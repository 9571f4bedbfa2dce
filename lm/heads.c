/* SPDX-License-Identifier: MIT */
/*
 * heads.c - DuoAttention schedules (lm.h, "retrieval and streaming heads"):
 * the text format's parser and the per-head budgets a schedule gives at the
 * memory of a uniform budget.
 *
 * Invariants: the parser reads only text[0 .. len), line by line (at most
 * LINE_MAX bytes a line), and hands out a schedule only when every line was
 * valid and every (layer, KV head) was given exactly once; on any error the
 * caller's *out is untouched and nothing is left allocated. Numbers are
 * decimal: layer and head indices without sign or leading zeros beyond "0",
 * the score a finite strtod number without hex, inf or nan.
 */
#include "lm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { HEADS_LINE_MAX = 256 };

void lm_heads_free(lm_heads *h)
{
    if (!h)
        return;
    const kve_allocator a = h->alloc;
    lm_free(&a, h->retrieval);
    lm_free(&a, h->score);
    lm_free(&a, h);
}

/* The next space-separated field of *p (spaces and tabs skip), NUL-ended in
 * place; NULL at the end of the line. */
static char *field(char **p)
{
    char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    if (!*s)
        return NULL;
    char *e = s;
    while (*e && *e != ' ' && *e != '\t')
        e++;
    if (*e)
        *e++ = '\0';
    *p = e;
    return s;
}

/* A decimal index in [0, max]: digits only, no leading zero but "0". */
static int index_of(const char *s, long max, long *out)
{
    if (!s || !*s || (s[0] == '0' && s[1]) || strlen(s) > 9)
        return 0;
    long v = 0;
    for (const char *c = s; *c; c++) {
        if (*c < '0' || *c > '9')
            return 0;
        v = v * 10 + (*c - '0');
    }
    if (v > max)
        return 0;
    *out = v;
    return 1;
}

static int real_of(const char *s, double *out)
{
    if (!s || !*s)
        return 0;
    for (const char *c = s; *c; c++)
        if (!strchr("0123456789+-.eE", *c))
            return 0; /* no hex, inf or nan */
    char *end;
    double v = strtod(s, &end);
    if (*end || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

kve_status lm_heads_parse(const char *text, size_t len, const kve_allocator *allocator,
                          lm_heads **out)
{
    if ((!text && len) || !out)
        return kve_set_error(KVE_EINVAL, "heads: NULL argument");
    lm_heads *h = lm_calloc(allocator, 1, sizeof *h);
    if (!h)
        return kve_set_error(KVE_ENOMEM, "heads: out of memory");
    if (allocator)
        h->alloc = *allocator;
    unsigned char *seen = NULL;
    kve_status st = KVE_OK;
    int stage = 0; /* 0: the magic line next, 1: the shape, 2: head lines */
    size_t line = 0, given = 0, N = 0;
    char buf[HEADS_LINE_MAX + 1];
    for (size_t at = 0; at < len && st == KVE_OK;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len, n = end - at;
        line++;
        if (n > HEADS_LINE_MAX) {
            st = kve_set_error(KVE_EFORMAT, "heads: line %zu is longer than %d bytes", line,
                               HEADS_LINE_MAX);
            break;
        }
        memcpy(buf, text + at, n);
        buf[n] = '\0';
        at = end + 1;
        if (memchr(buf, '\0', n) || strchr(buf, '\r')) {
            st = kve_set_error(KVE_EFORMAT, "heads: line %zu holds a NUL or carriage return",
                               line);
            break;
        }
        char *p = buf, *f = field(&p);
        if (!f || f[0] == '#')
            continue;
        if (stage == 0) {
            char *v = field(&p);
            if (strcmp(f, "kvevict-heads") != 0 || !v || strcmp(v, "1") != 0 || field(&p))
                st = kve_set_error(KVE_EFORMAT, "heads: line %zu: expected \"kvevict-heads 1\"",
                                   line);
            stage = 1;
            continue;
        }
        if (stage == 1) {
            long L = 0, G = 0;
            char *a = field(&p), *b = field(&p), *c = field(&p);
            if (strcmp(f, "layers") != 0 || !index_of(a, LM_HEADS_MAX, &L) || !b ||
                strcmp(b, "kv_heads") != 0 || !index_of(c, LM_HEADS_MAX, &G) || field(&p) ||
                L == 0 || G == 0 || L * G > LM_HEADS_MAX) {
                st = kve_set_error(KVE_EFORMAT, "heads: line %zu: expected \"layers L kv_heads "
                                   "G\" with 1 <= L*G <= %d", line, LM_HEADS_MAX);
                break;
            }
            h->layers = (int32_t)L;
            h->kv_heads = (int32_t)G;
            N = (size_t)(L * G);
            h->retrieval = lm_calloc(allocator, N, 1);
            h->score = lm_calloc(allocator, N, sizeof *h->score);
            seen = lm_calloc(allocator, N, 1);
            if (!h->retrieval || !h->score || !seen)
                st = kve_set_error(KVE_ENOMEM, "heads: out of memory for %zu heads", N);
            stage = 2;
            continue;
        }
        long l = 0, g = 0;
        double score = 0;
        char *a = field(&p), *b = field(&p), *role = field(&p), *sc = field(&p);
        if (strcmp(f, "head") != 0 || !sc || field(&p)) {
            st = kve_set_error(KVE_EFORMAT, "heads: line %zu: expected \"head LAYER KV_HEAD "
                               "retrieval|streaming SCORE\"", line);
        } else if (!index_of(a, h->layers - 1, &l)) {
            st = kve_set_error(KVE_EFORMAT, "heads: line %zu: layer '%s' is not in 0 .. %d", line,
                               a, h->layers - 1);
        } else if (!index_of(b, h->kv_heads - 1, &g)) {
            st = kve_set_error(KVE_EFORMAT, "heads: line %zu: KV head '%s' is not in 0 .. %d",
                               line, b, h->kv_heads - 1);
        } else if (strcmp(role, "retrieval") != 0 && strcmp(role, "streaming") != 0) {
            st = kve_set_error(KVE_EFORMAT, "heads: line %zu: role '%s' is neither retrieval nor "
                               "streaming", line, role);
        } else if (!real_of(sc, &score)) {
            st = kve_set_error(KVE_EFORMAT, "heads: line %zu: score '%s' is not a finite number",
                               line, sc);
        } else {
            size_t i = (size_t)l * (size_t)h->kv_heads + (size_t)g;
            if (seen[i]) {
                st = kve_set_error(KVE_EFORMAT, "heads: line %zu: layer %ld KV head %ld given "
                                   "twice", line, l, g);
            } else {
                seen[i] = 1;
                given++;
                h->retrieval[i] = role[0] == 'r';
                h->score[i] = score;
            }
        }
    }
    if (st == KVE_OK && stage < 2)
        st = kve_set_error(KVE_EFORMAT, "heads: %s", stage == 0 ? "no \"kvevict-heads 1\" line"
                                                                : "no \"layers L kv_heads G\" line");
    if (st == KVE_OK && given != N)
        for (size_t i = 0; i < N; i++)
            if (!seen[i]) {
                st = kve_set_error(KVE_EFORMAT, "heads: layer %zu KV head %zu is not given "
                                   "(%zu of %zu heads)", i / (size_t)h->kv_heads,
                                   i % (size_t)h->kv_heads, given, N);
                break;
            }
    lm_free(allocator, seen);
    if (st != KVE_OK) {
        lm_heads_free(h);
        return st;
    }
    *out = h;
    return KVE_OK;
}

kve_status lm_heads_budgets(const lm_heads *h, const lm_config *c, size_t budget,
                            size_t streaming, size_t context, size_t *out)
{
    if (!h || !c || !out)
        return kve_set_error(KVE_EINVAL, "heads: NULL argument");
    if (h->layers != c->n_layers || h->kv_heads != c->n_kv_heads)
        return kve_set_error(KVE_EINVAL, "heads: the schedule has %d layers of %d KV heads, the "
                             "model %d of %d", h->layers, h->kv_heads, c->n_layers,
                             c->n_kv_heads);
    if (budget == 0 || streaming == 0 || streaming > budget || context == 0)
        return kve_set_error(KVE_EINVAL, "heads: budget %zu, streaming budget %zu and context "
                             "%zu must be positive, streaming at most the budget", budget,
                             streaming, context);
    size_t N = (size_t)h->layers * (size_t)h->kv_heads, k = 0;
    for (size_t i = 0; i < N; i++)
        k += h->retrieval[i];
    if (budget > KVE_MAX_BUDGET)
        return kve_set_error(KVE_EINVAL, "heads: budget %zu exceeds %d", budget, KVE_MAX_BUDGET);
    size_t total = N * budget, br = budget, bs = budget;
    if (k == N) {
        br = budget < context ? budget : context;
    } else if (k > 0) {
        br = (total - (N - k) * streaming) / k;
        br = br < context ? br : context;
        bs = (total - k * br) / (N - k);
    }
    for (size_t i = 0; i < N; i++)
        out[i] = h->retrieval[i] ? br : bs;
    return KVE_OK;
}
