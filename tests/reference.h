/* SPDX-License-Identifier: MIT */
/*
 * reference.h - a deliberately naive, obviously correct model of every
 * policy, for differential tests and fuzzers. Header only, no test framework,
 * no library internals; it uses only the public kve_rng struct (and computes
 * the generator itself, so it does not trust rng.c either).
 *
 * API (every function returns 0 on success, -1 on a refusal that leaves the
 * model unchanged):
 *
 *   ref_policy *ref_new(const char *spec, kve_rng *rng);
 *       Builds the model from a VALID spec ("name" or "name:k=v,..."; the
 *       canonical spec of a real policy always works). Unknown names/keys
 *       give NULL; ranges are not checked (that is the library's job and is
 *       tested elsewhere). `random` draws one kve_rng_next-equivalent output
 *       from *rng (NULL rng: NULL result) to seed its private generator;
 *       the others ignore rng.
 *   ref_policy *ref_new_keys(const char *spec, kve_rng *rng, size_t dim);
 *       The same, for steps that carry keys of `dim` floats (ref_new is
 *       dim 0). A policy that reads keys needs dim >= 1 (NULL otherwise).
 *   void ref_free(ref_policy *r);
 *   int  ref_step(ref_policy *r, int32_t pos, const float *attn, size_t n);
 *       Refuses pos < 0, pos <= the last position, and (attn != NULL) n != size
 *       or a NaN/infinite/negative weight. Otherwise observes attn (NULL: no
 *       information, nothing changes but the admission) and admits pos.
 *   int  ref_step_keys(ref_policy *r, int32_t pos, const float *attn, size_t n,
 *                      const float *key);
 *       ref_step with the key of pos (dim floats, or NULL). Refuses besides:
 *       a policy that reads keys without one, a key with dim 0, a NaN or
 *       infinite key entry.
 *   int  ref_evict(ref_policy *r, size_t budget, int32_t *victims, size_t *n);
 *       Refuses budget 0, budget <= recent_window (when recent_window > 0)
 *       and budget <= sinks (when sinks > 0). Otherwise evicts down to
 *       budget; victims must hold size entries; they come out ascending and
 *       their count goes to *n (n may be NULL).
 *   r->n, r->slot[i].pos   the kept positions, ascending (kept order).
 *   double ref_score(const ref_policy *r, size_t i)   eviction key of slot i.
 *   size_t ref_remove(ref_policy *r, int32_t p0, int32_t p1);
 *       Removes every kept position p with p0 <= p < p1 (p1 == INT32_MAX,
 *       KVE_POS_END: every p >= p0); returns how many. The others keep
 *       everything; the last position becomes the largest kept (-1: none);
 *       streaming's sinks become the first `sinks` kept slots.
 *   void ref_reset(ref_policy *r);   back to ref_new's state (random: its seed).
 *   ref_policy *ref_clone(const ref_policy *r);   a deep copy.
 *
 * Semantics, one line each, as documented in kvevict.h and src/policies/:
 *   full         never evicts.
 *   window       keeps the newest `budget`.
 *   streaming    keeps the first `sinks` positions ever admitted + the newest
 *                budget - sinks.
 *   random       per victim k (0-based): r = below(own, limit - k) over the
 *                unprotected slots [0, limit = n - recent_window) in kept
 *                order, victim = the r-th slot not already chosen.
 *   h2o          score = sum of (double)attn over informative steps.
 *   scissorhands vote = attn[i] > (float)(1.0 / n); score = number of votes
 *                (history 0) or votes among the last `history` informative
 *                steps the position was kept through.
 *   tova         score = weight of the last informative step (0 before).
 *   h2o_decay    score = decay * score + attn per informative step.
 *   h2o_mean     score = sum / (double)count, count = informative steps since
 *                admission; 0 when count is 0.
 *   knorm        score = -norm(key), norm = sqrt of the sum of squares in
 *                double, term j added to lane j mod 8, the 8 lanes then added
 *                as (l + l+4), then (l + l+2), then (l + l+1).
 *   keydiff      unit u = (float)(key_j / max(norm, 1e-12)); after each
 *                keyed step, S_j = sum over kept slots (newest included) in
 *                kept order of (double)u_j, and every slot's score =
 *                -(u . S) with the products summed in the same 8 lanes.
 *   Scored policies evict by SORTING the unprotected slots by (score, pos)
 *   and taking the first size - budget.
 *
 * Pages (block = b > 1, the keys block and block_mean): slots are grouped by
 * pos / b; a page is a candidate when its last position (pos/b + 1) * b - 1
 * is <= the last admitted position and (scored) all its slots lie before
 * the newest recent_window, or (window, streaming) none of its slots is a
 * sink. Scored pages are SORTED by (key, page) with key = the sum of the
 * slots' scores in kept order (block_mean=1: that sum / its slot count);
 * window and streaming by page; whole pages are taken in that order until at
 * least size - budget positions are chosen.
 *
 *   int ref_evict_same(ref_policy **heads, size_t H, size_t budget,
 *                      int32_t *victims, size_t ld, size_t *counts);
 *       One decision for H heads that keep the same positions
 *       (same_positions): scored heads' slots SORTED by (the sum of
 *       ref_score over the heads in head order, pos), pages by the sum of
 *       those sums; window, streaming as one head; random by head 0's draws;
 *       the chosen slots leave every head.
 *   int ref_evict_shared(ref_policy **heads, size_t G, size_t budget,
 *                        double min_share, int32_t *victims, size_t ld,
 *                        size_t *counts);
 *       One budget for G scored heads (Ada-KV): refuses budget <= G * rw.
 *       floor = max(rw, (size_t)(min_share * (double)budget / (double)G));
 *       every unprotected slot of every head is SORTED by (score, head, pos)
 *       and taken in that order, skipping a head once it is down to its
 *       floor, until the heads hold budget. Head h's victims (ascending) at
 *       victims + h * ld, their count in counts[h].
 * Cost: O(n log n) per evict, O(n * 64) per step. Nobody should ship this.
 */
#ifndef KVE_REFERENCE_H
#define KVE_REFERENCE_H

#include "kvevict.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { REF_FULL, REF_WINDOW, REF_STREAMING, REF_RANDOM, REF_H2O, REF_SCISSORHANDS,
       REF_TOVA, REF_H2O_DECAY, REF_H2O_MEAN, REF_KNORM, REF_KEYDIFF, REF_KINDS };

enum { REF_MAX_HISTORY = 64 };

typedef struct ref_slot {
    int32_t pos;
    int sink;                              /* streaming: one of the first `sinks` admitted */
    double acc;                            /* h2o sum, decayed sum, tova last, mean's sum, votes */
    uint64_t count;                        /* informative steps observed while kept */
    unsigned char votes[REF_MAX_HISTORY];  /* scissorhands: votes[0] is the newest */
    float *unit;                           /* keydiff: (dim) the key's direction */
} ref_slot;

typedef struct ref_policy {
    int kind;
    size_t budget, recent_window, sinks, history, block, block_mean;
    double decay;
    uint64_t rng[4];   /* random: private xoshiro256** state */
    uint64_t seed;     /* random: what rng was seeded from */
    int32_t last;      /* last admitted position, -1 before any */
    uint64_t admitted; /* positions ever admitted */
    size_t dim;        /* floats of a key; 0: steps carry none */
    ref_slot *slot;    /* (n) kept order */
    size_t n, cap;
} ref_policy;

/* ---- generator: splitmix64 + xoshiro256**, straight from the papers ---- */

static inline uint64_t ref_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t ref_xoshiro(uint64_t s[4])
{
    uint64_t result = ref_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return result;
}

static inline void ref_seed(uint64_t s[4], uint64_t seed)
{
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15u);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
        s[i] = z ^ (z >> 31);
    }
}

/* Uniform in [0, bound): draw until the output is not among the lowest
 * 2^64 mod bound values (those would bias the residues). */
static inline uint64_t ref_below(uint64_t s[4], uint64_t bound)
{
    if (bound == 0)
        return 0;
    uint64_t reject = (UINT64_MAX - bound + 1) % bound;
    for (;;) {
        uint64_t x = ref_xoshiro(s);
        if (x >= reject)
            return x % bound;
    }
}

/* ---- construction ---- */

static inline ref_policy *ref_new_keys(const char *spec, kve_rng *rng, size_t dim)
{
    static const char *const names[REF_KINDS] = {
        "full", "window", "streaming", "random", "h2o", "scissorhands",
        "tova", "h2o_decay", "h2o_mean", "knorm", "keydiff"};
    size_t len = strcspn(spec, ":");
    int kind = -1;
    for (int k = 0; k < REF_KINDS; k++)
        if (strlen(names[k]) == len && strncmp(names[k], spec, len) == 0)
            kind = k;
    if (kind < 0 || ((kind == REF_KNORM || kind == REF_KEYDIFF) && dim == 0))
        return NULL;
    ref_policy *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->kind = kind;
    r->dim = dim;
    r->budget = 512;
    r->recent_window = kind == REF_TOVA ? 1 : kind >= REF_KNORM ? 0 : kind >= REF_H2O ? 32 : 0;
    r->sinks = kind == REF_STREAMING ? 4 : 0;
    r->decay = 0.99;
    r->block = 1;
    r->last = -1;
    const char *p = spec[len] == ':' ? spec + len + 1 : NULL;
    while (p && *p) {
        const char *eq = strchr(p, '=');
        if (!eq) {
            free(r);
            return NULL;
        }
        size_t klen = (size_t)(eq - p);
        char *end = NULL;
        if (klen == 5 && !strncmp(p, "decay", 5)) {
            r->decay = strtod(eq + 1, &end);
        } else {
            size_t v = (size_t)strtoull(eq + 1, &end, 10);
            if (klen == 6 && !strncmp(p, "budget", 6))
                r->budget = v;
            else if (klen == 13 && !strncmp(p, "recent_window", 13))
                r->recent_window = v;
            else if (klen == 5 && !strncmp(p, "sinks", 5))
                r->sinks = v;
            else if (klen == 7 && !strncmp(p, "history", 7))
                r->history = v;
            else if (klen == 5 && !strncmp(p, "block", 5))
                r->block = v;
            else if (klen == 10 && !strncmp(p, "block_mean", 10))
                r->block_mean = v;
            else
                end = NULL;
        }
        if (!end || (*end != ',' && *end != '\0')) {
            free(r);
            return NULL;
        }
        p = *end == ',' ? end + 1 : NULL;
    }
    if (kind == REF_RANDOM) {
        if (!rng) {
            free(r);
            return NULL;
        }
        r->seed = ref_xoshiro(rng->s);
        ref_seed(r->rng, r->seed);
    }
    return r;
}

static inline ref_policy *ref_new(const char *spec, kve_rng *rng)
{
    return ref_new_keys(spec, rng, 0);
}

static inline void ref_free(ref_policy *r)
{
    if (r) {
        for (size_t i = 0; i < r->n; i++)
            free(r->slot[i].unit);
        free(r->slot);
    }
    free(r);
}

/* ---- keys ---- */

/* The 8 lanes of the key sums, added as the definition says. */
static inline double ref_lanes(double lane[8])
{
    for (int w = 4; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            lane[l] = lane[l] + lane[l + w];
    return lane[0];
}

static inline double ref_norm(const float *key, size_t dim)
{
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t j = 0; j < dim; j++)
        lane[j % 8] += (double)key[j] * (double)key[j];
    return sqrt(ref_lanes(lane));
}

/* keydiff: every kept slot's score from the anchor of every kept slot. */
static inline void ref_keydiff_scores(ref_policy *r)
{
    double *S = calloc(r->dim, sizeof *S);
    if (!S)
        abort();
    for (size_t i = 0; i < r->n; i++)
        for (size_t j = 0; j < r->dim; j++)
            S[j] += (double)r->slot[i].unit[j];
    for (size_t i = 0; i < r->n; i++) {
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (size_t j = 0; j < r->dim; j++)
            lane[j % 8] += (double)r->slot[i].unit[j] * S[j];
        r->slot[i].acc = -ref_lanes(lane);
    }
    free(S);
}

/* ---- scores ---- */

static inline double ref_score(const ref_policy *r, size_t i)
{
    const ref_slot *s = &r->slot[i];
    if (r->kind == REF_H2O_MEAN)
        return s->count ? s->acc / (double)s->count : 0.0;
    if (r->kind == REF_SCISSORHANDS && r->history) {
        double votes = 0;
        for (size_t k = 0; k < r->history; k++)
            votes += s->votes[k];
        return votes;
    }
    return s->acc;
}

/* ---- decode path ---- */

static inline int ref_step_keys(ref_policy *r, int32_t pos, const float *attn, size_t n,
                                const float *key)
{
    int keyed = r->kind == REF_KNORM || r->kind == REF_KEYDIFF;
    if (pos < 0 || pos <= r->last)
        return -1;
    if ((keyed && !key) || (key && r->dim == 0))
        return -1;
    for (size_t j = 0; key && j < r->dim; j++)
        if (isnan(key[j]) || isinf(key[j]))
            return -1;
    if (attn) {
        if (n != r->n)
            return -1;
        for (size_t i = 0; i < n; i++)
            if (isnan(attn[i]) || isinf(attn[i]) || attn[i] < 0.0f)
                return -1;
        for (size_t i = 0; i < n; i++) {
            ref_slot *s = &r->slot[i];
            double a = (double)attn[i];
            s->count++;
            switch (r->kind) {
            case REF_H2O:
            case REF_H2O_MEAN: s->acc += a; break;
            case REF_TOVA: s->acc = a; break;
            case REF_H2O_DECAY: s->acc = r->decay * s->acc + a; break;
            case REF_SCISSORHANDS: {
                int vote = attn[i] > (float)(1.0 / (double)n);
                s->acc += vote;
                memmove(s->votes + 1, s->votes, REF_MAX_HISTORY - 1);
                s->votes[0] = (unsigned char)vote;
                break;
            }
            default: break;
            }
        }
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        ref_slot *grown = realloc(r->slot, cap * sizeof *grown);
        if (!grown)
            abort(); /* a test helper: running out of memory is not a case it models */
        r->slot = grown;
        r->cap = cap;
    }
    ref_slot *s = &r->slot[r->n++];
    memset(s, 0, sizeof *s);
    s->pos = pos;
    s->sink = r->admitted < r->sinks;
    r->admitted++;
    r->last = pos;
    if (r->kind == REF_KNORM) {
        s->acc = -ref_norm(key, r->dim);
    } else if (r->kind == REF_KEYDIFF) {
        double norm = ref_norm(key, r->dim);
        s->unit = malloc(r->dim * sizeof *s->unit);
        if (!s->unit)
            abort();
        for (size_t j = 0; j < r->dim; j++)
            s->unit[j] = (float)((double)key[j] / (norm > 1e-12 ? norm : 1e-12));
        ref_keydiff_scores(r);
    }
    return 0;
}

static inline int ref_step(ref_policy *r, int32_t pos, const float *attn, size_t n)
{
    return ref_step_keys(r, pos, attn, n, NULL);
}

/* A candidate victim: sorted by (score, head, pos); head is 0 but for a
 * shared budget. */
typedef struct ref_cand {
    double score;
    size_t head;
    int32_t pos;
    size_t index;
} ref_cand;

static inline int ref_cmp_cand(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? -1 : 1;
    if (x->head != y->head)
        return x->head < y->head ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static inline int ref_cmp_pos(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A page of slots [first, end) and its sort key. */
typedef struct ref_page {
    double key;
    int64_t page;
    size_t first, end;
} ref_page;

static inline int ref_cmp_page(const void *a, const void *b)
{
    const ref_page *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->page > y->page) - (x->page < y->page);
}

/* Chooses whole pages (see the top) until `need` positions are chosen;
 * slot j scores key[j] (NULL: ref_score). */
static inline void ref_choose_pages(const ref_policy *r, size_t need, const double *key,
                                    unsigned char *chosen)
{
    ref_page *pg = malloc(r->n * sizeof *pg);
    if (!pg)
        abort();
    size_t np = 0, b = r->block;
    int sliding = r->kind == REF_WINDOW || r->kind == REF_STREAMING;
    for (size_t i = 0; i < r->n;) {
        int64_t page = r->slot[i].pos / (int64_t)b;
        size_t j = i;
        double sum = 0;
        int sink = 0;
        while (j < r->n && r->slot[j].pos / (int64_t)b == page) {
            sum += key ? key[j] : ref_score(r, j);
            sink |= r->slot[j].sink;
            j++;
        }
        int complete = (int64_t)r->last >= (page + 1) * (int64_t)b - 1;
        int outside = sliding ? !sink : j <= r->n - r->recent_window;
        if (complete && outside) {
            pg[np].key = sliding ? 0.0 : r->block_mean ? sum / (double)(j - i) : sum;
            pg[np].page = page;
            pg[np].first = i;
            pg[np].end = j;
            np++;
        }
        i = j;
    }
    qsort(pg, np, sizeof *pg, ref_cmp_page);
    size_t got = 0;
    for (size_t k = 0; k < np && got < need; k++) {
        for (size_t i = pg[k].first; i < pg[k].end; i++)
            chosen[i] = 1;
        got += pg[k].end - pg[k].first;
    }
    free(pg);
}

/* Removes the chosen slots, writing their positions ascending; returns how many. */
static inline size_t ref_remove_chosen(ref_policy *r, const unsigned char *chosen, int32_t *victims)
{
    size_t w = 0, nv = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (chosen[i]) {
            victims[nv++] = r->slot[i].pos;
            free(r->slot[i].unit);
        } else {
            r->slot[w++] = r->slot[i];
        }
    }
    r->n = w;
    qsort(victims, nv, sizeof *victims, ref_cmp_pos); /* already ascending; says the contract */
    return nv;
}

/* Marks in chosen (r->n, zeroed) the `need` victims of r; slot i scores
 * key[i] (NULL: ref_score). */
static inline void ref_choose(ref_policy *r, size_t need, const double *key,
                              unsigned char *chosen)
{
    size_t limit = r->n - r->recent_window;
    if (r->block > 1) {
        ref_choose_pages(r, need, key, chosen);
    } else if (r->kind == REF_WINDOW || r->kind == REF_STREAMING) {
        size_t k = 0;
        for (size_t i = 0; k < need; i++) /* oldest non-sinks first */
            if (!r->slot[i].sink) {
                chosen[i] = 1;
                k++;
            }
    } else if (r->kind == REF_RANDOM) {
        for (size_t k = 0; k < need; k++) {
            uint64_t want = ref_below(r->rng, limit - k);
            for (size_t i = 0, seen = 0; i < limit; i++) {
                if (chosen[i])
                    continue;
                if (seen++ == want) {
                    chosen[i] = 1;
                    break;
                }
            }
        }
    } else {
        ref_cand *c = malloc((limit ? limit : 1) * sizeof *c);
        if (!c)
            abort();
        for (size_t i = 0; i < limit; i++) {
            c[i].score = key ? key[i] : ref_score(r, i);
            c[i].head = 0;
            c[i].pos = r->slot[i].pos;
            c[i].index = i;
        }
        qsort(c, limit, sizeof *c, ref_cmp_cand);
        for (size_t k = 0; k < need; k++)
            chosen[c[k].index] = 1;
        free(c);
    }
}

static inline int ref_evict(ref_policy *r, size_t budget, int32_t *victims, size_t *n_victims)
{
    if (budget == 0 || (r->recent_window && budget <= r->recent_window) ||
        (r->sinks && budget <= r->sinks))
        return -1;
    size_t need = r->kind != REF_FULL && r->n > budget ? r->n - budget : 0;
    if (n_victims)
        *n_victims = need;
    if (!need)
        return 0;
    unsigned char *chosen = calloc(r->n, 1);
    if (!chosen)
        abort();
    ref_choose(r, need, NULL, chosen);
    size_t nv = ref_remove_chosen(r, chosen, victims);
    free(chosen);
    if (n_victims)
        *n_victims = nv; /* pages may take more than the need */
    return 0;
}

/* One decision for H heads that keep the same positions (kvevict.h, "Same
 * positions"): the scored policies rank slot i by the sum over the heads,
 * in head order, of ref_score (from head 0's, in double), SORTED by (sum,
 * pos), or pages by the sum of their slots' sums; window and streaming as
 * each head would; random by head 0's draws. The same slots leave every
 * head: head h's victims (ascending) at victims + h * ld, their count in
 * counts[h]. Refuses what ref_evict refuses, and heads that keep different
 * positions. */
static inline int ref_evict_same(ref_policy **heads, size_t H, size_t budget, int32_t *victims,
                                 size_t ld, size_t *counts)
{
    ref_policy *r = heads[0];
    if (budget == 0 || (r->recent_window && budget <= r->recent_window) ||
        (r->sinks && budget <= r->sinks))
        return -1;
    for (size_t h = 1; h < H; h++) {
        if (heads[h]->n != r->n)
            return -1;
        for (size_t i = 0; i < r->n; i++)
            if (heads[h]->slot[i].pos != r->slot[i].pos)
                return -1;
    }
    size_t need = r->kind != REF_FULL && r->n > budget ? r->n - budget : 0;
    for (size_t h = 0; h < H; h++)
        counts[h] = 0;
    if (!need)
        return 0;
    unsigned char *chosen = calloc(r->n, 1);
    double *key = calloc(r->n, sizeof *key);
    if (!chosen || !key)
        abort();
    int scored = r->kind != REF_WINDOW && r->kind != REF_STREAMING && r->kind != REF_RANDOM;
    for (size_t i = 0; scored && i < r->n; i++) {
        key[i] = ref_score(heads[0], i);
        for (size_t h = 1; h < H; h++)
            key[i] += ref_score(heads[h], i);
    }
    ref_choose(r, need, scored ? key : NULL, chosen);
    for (size_t h = 0; h < H; h++)
        counts[h] = ref_remove_chosen(heads[h], chosen, victims + h * ld);
    free(chosen);
    free(key);
    return 0;
}

/* ---- what an engine does to a sequence ---- */

static inline size_t ref_remove(ref_policy *r, int32_t p0, int32_t p1)
{
    size_t w = 0, gone = 0;
    for (size_t i = 0; i < r->n; i++) {
        int32_t p = r->slot[i].pos;
        if (p >= p0 && (p1 == INT32_MAX || p < p1)) {
            free(r->slot[i].unit);
            gone++;
        } else {
            r->slot[w++] = r->slot[i];
        }
    }
    r->n = w;
    r->last = w ? r->slot[w - 1].pos : -1;
    for (size_t i = 0; i < w; i++)
        r->slot[i].sink = i < r->sinks;
    r->admitted = w; /* so the next positions are sinks while fewer are kept */
    return gone;
}

static inline void ref_reset(ref_policy *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->slot[i].unit);
    r->n = 0;
    r->last = -1;
    r->admitted = 0;
    if (r->kind == REF_RANDOM)
        ref_seed(r->rng, r->seed);
}

static inline ref_policy *ref_clone(const ref_policy *r)
{
    ref_policy *c = malloc(sizeof *c);
    if (!c)
        abort();
    *c = *r;
    c->cap = r->n ? r->n : 1;
    c->slot = malloc(c->cap * sizeof *c->slot);
    if (!c->slot)
        abort();
    for (size_t i = 0; i < r->n; i++) {
        c->slot[i] = r->slot[i];
        if (r->slot[i].unit) {
            c->slot[i].unit = malloc(r->dim * sizeof(float));
            if (!c->slot[i].unit)
                abort();
            memcpy(c->slot[i].unit, r->slot[i].unit, r->dim * sizeof(float));
        }
    }
    return c;
}

/* ---- one budget shared by G heads ---- */

static inline int ref_evict_shared(ref_policy **heads, size_t G, size_t budget, double min_share,
                                   int32_t *victims, size_t ld, size_t *counts)
{
    size_t rw = heads[0]->recent_window, total = 0, nc = 0;
    if (budget <= G * rw)
        return -1;
    for (size_t h = 0; h < G; h++)
        total += heads[h]->n;
    ref_cand *c = malloc((total + 1) * sizeof *c);
    size_t *taken = calloc(G, sizeof *taken);
    if (!c || !taken)
        abort();
    size_t floor = (size_t)(min_share * (double)budget / (double)G);
    if (floor < rw)
        floor = rw;
    for (size_t h = 0; h < G; h++)
        for (size_t i = 0; i + rw < heads[h]->n; i++) {
            c[nc].score = ref_score(heads[h], i);
            c[nc].head = h;
            c[nc].pos = heads[h]->slot[i].pos;
            c[nc].index = i;
            nc++;
        }
    qsort(c, nc, sizeof *c, ref_cmp_cand);
    size_t need = total > budget ? total - budget : 0;
    unsigned char **chosen = calloc(G, sizeof *chosen);
    if (!chosen)
        abort();
    for (size_t h = 0; h < G; h++)
        if (!(chosen[h] = calloc(heads[h]->n + 1, 1)))
            abort();
    for (size_t k = 0; k < nc && need > 0; k++) {
        size_t h = c[k].head;
        if (heads[h]->n - taken[h] <= floor)
            continue;
        chosen[h][c[k].index] = 1;
        taken[h]++;
        need--;
    }
    for (size_t h = 0; h < G; h++) {
        counts[h] = ref_remove_chosen(heads[h], chosen[h], victims + h * ld);
        free(chosen[h]);
    }
    free(chosen);
    free(taken);
    free(c);
    return 0;
}

#endif /* KVE_REFERENCE_H */
