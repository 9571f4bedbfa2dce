/* SPDX-License-Identifier: MIT */
/*
 * stats.c - `kvevict trace --stats`: what a trace's attention looks like,
 * per head, in the terms the canonical trace is built from (docs/trace.md,
 * "Realism, measured"), so that a synthetic trace and a model's attention
 * can be set side by side.
 *
 * For head h of a trace of T rows (row t holds weights over keys 0..t):
 *   sink_mass           mean over rows t >= SINKS + RECENT of sum row[0, SINKS)
 *   recent_mass         mean over the same rows of sum row[t - RECENT, t)
 *   self_mass           mean over the same rows of row[t]
 *   top32_persistence   mean over rows t >= TOPK + 1 of |A(t-1) & A(t)| / TOPK,
 *                       A(t) the TOPK largest of row[0, t) (ties: the lower
 *                       position), as in the harness
 *   block_heavy_mass    rows cut into blocks of `block`; H(b) = the TOPK keys
 *                       with the largest sum over block b's rows (ties: the
 *                       lower position); the mean per row of H(b)'s mass in
 *                       block b ...
 *   block_heavy_next_mass  ... and in block b + 1; both averaged over the
 *                       blocks b whose next block is complete.
 * The first three start where the sinks and the last RECENT keys cannot
 * overlap. A mean over no row is NaN (null, n/a).
 * Memory: O(T) per head (a row, the block sums, two TOPK sets and a mark per
 * key). Time: one pass over the rows, O(t) per row plus O(TOPK) per key that
 * enters a top-K set.
 */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { SINKS = 4, RECENT = 64, TOPK = 32 };

/* The k largest of v[0, n) into idx[0, *m), m = min(k, n), best first;
 * equal values rank the lower position first. O(n) plus O(k) per entry. */
static void top_k(const double *v, size_t n, size_t k, size_t *idx, size_t *m)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        /* Scanning upwards, an equal value never beats an entry already in. */
        if (c == k && !(v[i] > v[idx[c - 1]]))
            continue;
        size_t j = c < k ? c++ : c - 1;
        while (j > 0 && v[i] > v[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
    *m = c;
}

void trace_stats_head(kve_trace *tr, size_t head, size_t block, trace_stats *s)
{
    size_t T = kve_trace_steps(tr);
    double *row = xmalloc(T * sizeof *row);  /* (T): row t in [0, t] */
    double *acc = xcalloc(T, sizeof *acc);   /* (T): sums over the current block */
    unsigned char *mark = xcalloc(T, 1);     /* (T): keys of the previous top-K */
    size_t prev[TOPK], cur[TOPK], heavy[TOPK], n_prev = 0, n_cur = 0, n_heavy = 0;
    double sink = 0, recent = 0, self = 0, persist = 0;
    double own = 0, next = 0, next_block = 0, pending_own = 0;
    size_t rows = 0, pairs = 0, blocks = 0;
    int have_heavy = 0;
    for (size_t t = 0; t < T; t++) {
        kve_status st = kve_trace_row(tr, head, t, row, T);
        if (st != KVE_OK) {
            free(row);
            free(acc);
            free(mark);
            die_status(st, trace_name(tr));
        }
        if (t >= SINKS + RECENT) {
            for (size_t i = 0; i < SINKS; i++)
                sink += row[i];
            for (size_t i = t - RECENT; i < t; i++)
                recent += row[i];
            self += row[t];
            rows++;
        }
        top_k(row, t, TOPK, cur, &n_cur);
        if (t >= TOPK + 1) {
            size_t same = 0;
            for (size_t j = 0; j < n_cur; j++)
                same += mark[cur[j]];
            persist += (double)same / TOPK;
            pairs++;
        }
        for (size_t j = 0; j < n_prev; j++)
            mark[prev[j]] = 0;
        for (size_t j = 0; j < n_cur; j++)
            mark[cur[j]] = 1;
        memcpy(prev, cur, n_cur * sizeof *cur);
        n_prev = n_cur;

        /* Blocks: the heavy set of the previous block, measured now. */
        if (have_heavy)
            for (size_t j = 0; j < n_heavy; j++)
                next_block += row[heavy[j]];
        for (size_t i = 0; i <= t; i++)
            acc[i] += row[i];
        if ((t + 1) % block == 0) { /* a block is complete */
            if (have_heavy) {           /* ... and it is the previous one's next */
                own += pending_own;
                next += next_block / (double)block;
                blocks++;
            }
            top_k(acc, t + 1, TOPK, heavy, &n_heavy);
            double mass = 0;
            for (size_t j = 0; j < n_heavy; j++)
                mass += acc[heavy[j]];
            pending_own = mass / (double)block; /* counts once its next block is complete */
            have_heavy = 1;
            next_block = 0;
            memset(acc, 0, (t + 1) * sizeof *acc);
        }
    }
    free(row);
    free(acc);
    free(mark);
    s->rows = rows;
    s->pairs = pairs;
    s->blocks = blocks;
    s->sink_mass = rows ? sink / (double)rows : NAN;
    s->recent_mass = rows ? recent / (double)rows : NAN;
    s->self_mass = rows ? self / (double)rows : NAN;
    s->top32_persistence = pairs ? persist / (double)pairs : NAN;
    s->block_heavy_mass = blocks ? own / (double)blocks : NAN;
    s->block_heavy_next_mass = blocks ? next / (double)blocks : NAN;
}

void render_trace_stats(FILE *f, kve_trace *tr, size_t head, int all_heads, size_t block,
                        tfmt fmt)
{
    /* A multi-layer trace also shows each head as layer.head (the head
     * within its layer) and gives its layer in CSV and JSON. */
    size_t nh = kve_trace_heads(tr), nl = kve_trace_layers(tr), per = nh / (nl ? nl : 1);
    int layered = nl > 1;
    col cols[TABLE_MAXCOLS];
    size_t nc = 0;
    cols[nc++] = (col){"head", "head", COL_ALL};
    if (layered) {
        cols[nc++] = (col){"layer.head", "layer_head", COL_TEXT};
        cols[nc++] = (col){"layer", KEY_LAYER, COL_CSV | COL_JSON};
    }
    static const col rest[] = {
        {"sink mass", "sink_mass", COL_ALL},
        {"last-64 mass", "recent_mass", COL_ALL},
        {"own-key mass", "self_mass", COL_ALL},
        {"top-32 persistence", "top32_persistence", COL_ALL},
        {"block heavy mass", "block_heavy_mass", COL_ALL},
        {"... in the next block", "block_heavy_next_mass", COL_ALL},
        {"trace", KEY_TRACE, COL_CSV | COL_JSON},
        {"steps", KEY_STEPS, COL_CSV | COL_JSON},
        {"heads", KEY_HEADS, COL_CSV | COL_JSON},
        {"layers", KEY_LAYERS, COL_CSV | COL_JSON},
        {"block", "block", COL_CSV | COL_JSON},
    };
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        cols[nc++] = rest[i];
    size_t lo = all_heads ? 0 : head, hi = all_heads ? nh : head + 1;
    double sum[6] = {0};
    table t;
    table_init(&t, cols, nc);
    progress pr;
    progress_begin(&pr, "head", hi - lo, 0, 1);
    for (size_t h = lo; h < hi; h++) {
        trace_stats s;
        trace_stats_head(tr, h, block, &s);
        progress_update(&pr, h - lo + 1);
        const double v[6] = {s.sink_mass,          s.recent_mass,      s.self_mass,
                             s.top32_persistence,  s.block_heavy_mass, s.block_heavy_next_mass};
        table_uint(&t, h);
        if (layered) {
            table_fmt(&t, "%zu.%zu", h / per, h % per);
            table_uint(&t, h / per);
        }
        for (int k = 0; k < 6; k++) {
            table_real(&t, v[k], "%.4f");
            sum[k] += v[k];
        }
        table_str(&t, trace_name(tr));
        table_uint(&t, kve_trace_steps(tr));
        table_uint(&t, nh);
        table_uint(&t, kve_trace_layers(tr));
        table_uint(&t, block);
    }
    progress_end(&pr);
    /* Text and markdown end with the mean over the heads shown. */
    if (hi - lo > 1 && (fmt == FMT_TEXT || fmt == FMT_MD)) {
        table_str(&t, "mean");
        if (layered) {
            table_str(&t, "");
            table_real(&t, NAN, "%.0f");
        }
        for (int k = 0; k < 6; k++)
            table_real(&t, sum[k] / (double)(hi - lo), "%.4f");
        table_str(&t, trace_name(tr));
        table_uint(&t, kve_trace_steps(tr));
        table_uint(&t, nh);
        table_uint(&t, kve_trace_layers(tr));
        table_uint(&t, block);
    }
    table_print(&t, f, fmt);
    table_free(&t);
}
