/* SPDX-License-Identifier: MIT */
/*
 * perf.h - what `kvevict perf` measured, for its renderers: the rows
 * (cmd_perf.c prints them in every format) and, in the documentation tool,
 * the measured block of docs/performance.md and its figure
 * (tools/docs/perf_docs.c), handed to perf_main as perf_renderers.
 */
#ifndef KVE_PERF_H
#define KVE_PERF_H

#include "cli.h"

typedef struct timing_opts {
    size_t reps;
    double target; /* seconds per timed run */
} timing_opts;

/* The rows of the two placements of the attention rows: a pool of up to
 * POOL_ROWS rows (at most 64 MiB), and a hot pool of HOT_ROWS. */
enum { POOL_ROWS = 64, HOT_ROWS = 8 };
/* Steps over which the positions an evict moves are counted (untimed). */
enum { MOVED_STEPS = 256 };
enum { PERF_KEY_DIM = 128 }; /* a common head size; keys come from the attention pool */
enum { PERF_GROUP = 4 };     /* query heads a KV head (Llama 3 8B: 32 / 8) */

typedef enum { PLACE_POOL, PLACE_HOT, N_PLACES } place;

/* One measurement: a policy (or the naive h2o, or a bank, or a score rule,
 * or one of the floor's own variants) at one size, in one placement. */
typedef struct row {
    const char *impl; /* "kvevict", "rule", "naive-passes", "naive-sort", "floor" */
    char name[32];
    char spec[KVE_SPEC_MAX];
    size_t budget, heads, threads, steps, state_bytes, pool_rows;
    const char *attn; /* "rows", "null" or "keys" (NULL attention and a key) */
    int unchecked;    /* built with kve_*_options.unchecked = 1 */
    place where;
    double ns, floor_ns, floor_base_ns, load1;
    double moved; /* positions an evict moved, mean over MOVED_STEPS; NaN if not measured */
    const char *floor_isa;
} row;

typedef struct perf_rows {
    row *r;
    size_t n, cap;
} perf_rows;

/* ns per kept slot's divisor: heads x budget. */
static inline double slots_of(const row *r)
{
    return (double)r->heads * (double)r->budget;
}

/* --docs FILE and --plot DIR: the block of FILE between <!-- perf:begin -->
 * and <!-- perf:end --> (the conditions, the tables, the targets), and
 * DIR/perf_vs_budget.png. Errors exit. */
typedef struct perf_renderers {
    void (*docs)(const char *path, const perf_rows *rs, const size_t *budgets, size_t n_budgets,
                 const timing_opts *o, const double load[3]);
    void (*plot)(const char *dir, const perf_rows *rs, const size_t *budgets, size_t n_budgets);
} perf_renderers;

/* `kvevict perf` with these renderers; NULL (the user's kvevict): --docs and
 * --plot are handed to the documentation tool (source_tree_run). */
int perf_main(int argc, char **argv, const perf_renderers *render);
/* The instruction sets of the floors this machine has, "x86-64, avx2, ...". */
void perf_print_floors(FILE *f);

#endif /* KVE_PERF_H */
