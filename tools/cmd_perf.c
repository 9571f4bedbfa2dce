/* SPDX-License-Identifier: MIT */
/*
 * cmd_perf.c - `kvevict perf`: what a policy costs in an engine's decode
 * loop, per step, against the memory floor measured in the same run.
 *
 * The floor is one pass that reads B float32 attention weights and adds
 * them into B float64 scores (score[i] += attn[i]): the least any policy that
 * reads attention must do per step. It is compiled for every instruction set
 * the machine has (x86-64 baseline, AVX2, AVX-512) and the fastest is the
 * floor, so a ratio is never flattered by a slow floor; the baseline x86-64
 * floor is reported beside it. The floor is one call per step, timed in
 * batches of calls, as a policy's step is. Beside it (impl "floor") the same
 * pass inlined into the loop over steps (no call), and the call timed one at
 * a time with a clock read around each (the monotonic clock, and the thread
 * CPU-time clock): what a call and a clock add at small sizes.
 *
 * Placements. Attention rows come from a pool of precomputed random rows,
 * read in turn, the same pool for the floor and the policies of one size, so
 * neither is timed drawing random numbers:
 *   pool  up to POOL_ROWS rows, at most 64 MiB: the rows come from L2 at
 *         small budgets and from L3 or memory at large ones;
 *   hot   HOT_ROWS rows: an engine's freshly computed attention, which sits
 *         in L1 or L2 as long as it fits there.
 * Each row records its placement (pool_rows) and is divided by the floor
 * measured in the same placement.
 *
 * Rows, each the best of `reps` timings of about `target` seconds of the
 * measuring thread's CPU time (so time the scheduler gives other processes
 * on a shared machine does not count; wall time for the two-thread banks),
 * each with the 1-minute load average read just before it:
 *   - every policy but full (which never evicts, so has no steady state) at
 *     every budget, in the steady state: step with an attention row (or
 *     NULL), then evict to the budget (one victim a step); the policies that
 *     read keys are stepped with NULL attention and a key of PERF_KEY_DIM
 *     floats (mode "keys"), keydiff up to KEYDIFF_MAX_BUDGET. The policies
 *     that read attention are also built unchecked (unchecked = 1:
 *     kve_policy_options.unchecked) and measured in both placements, the
 *     others in the pool placement; expected_attention (pool placement)
 *     also with PERF_GROUP queries and a value, up to EA_MAX_BUDGET (its
 *     default rescoring every step; not with --quick), and the same with
 *     interval=64 up to EA_INTERVAL_MAX_BUDGET;
 *   - the score rules of an application's own against the built-in lanes
 *     (impl "rule", pool placement): h2o written as a registered rule
 *     (rule_h2o) against h2o, and value-aware h2o (rule_vh2o) against
 *     h2o:vnorm=1, which is timed too, every step carrying a value of
 *     PERF_KEY_DIM floats (the row's first);
 *   - a naive h2o at every budget: the same arithmetic as separate passes
 *     (add, then argmin, then compaction), and with the victim chosen by
 *     sorting the unprotected slots (what a first implementation does);
 *   - the floor's own rows (impl "floor"), in both placements;
 *   - the bank sweep: banks of h2o of several sizes (heads x budget), driven
 *     by 1 thread (checked and unchecked, both placements) and by 2 threads
 *     on disjoint head ranges (checked, pool placement), against the floor
 *     of their size (heads x budget slots in one pass).
 * Policies are filled to the budget with NULL steps (O(1) each), then run in
 * the steady state; the calibration run is their warm-up.
 *
 * Timings depend on the machine and its load: they are never asserted and
 * never drift-checked. --docs FILE rewrites the block between the lines
 * "<!-- perf:begin -->" and "<!-- perf:end -->" of FILE (the conditions, the
 * tables, the targets); --plot DIR draws DIR/perf_vs_budget.png (gnuplot):
 * both are the documentation tool's (tools/docs/perf_docs.c), which runs
 * this same measurement with its renderers (perf_main); the installed
 * kvevict hands them to it (source_tree_run).
 */
#define _POSIX_C_SOURCE 200809L
#include "perf.h"
#include "rule_examples.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const size_t default_budgets[] = {256, 1024, 4096, 16384, 65536, 262144};
static const size_t quick_budgets[] = {256, 4096};
static const size_t bank_heads[] = {8, 64, 256}; /* 256 = 32 layers x 8 KV heads */
static const size_t bank_budgets[] = {256, 1024, 4096};
enum { N_BANK_HEADS = 3, N_BANK_BUDGETS = 3, NAIVE_RECENT = 32 };
/* keydiff re-scores every kept key at every step, O(kept * d), so filling it
 * to budget B costs O(B^2 d): it is timed at budgets up to this one. */
enum { KEYDIFF_MAX_BUDGET = 16384 };
/* Calls of the floor timed one by one, at most (a CPU-time clock read is a
 * system call: hundreds of ns). */
enum { EACH_MAX_STEPS = 20000 };
/* expected_attention rescores every kept key at every step by default,
 * O(kept G d^2): timed up to this budget; with interval=64 up to the next. */
enum { EA_MAX_BUDGET = 256, EA_INTERVAL_MAX_BUDGET = 1024 };
#define POOL_BYTES ((size_t)64 << 20)

/* Seconds of `clock`: the calling thread's CPU time for single-threaded
 * work (time the scheduler gives other processes on a shared machine does
 * not count), the wall clock when threads share the work. */
static double now_s(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double load1(void)
{
    double load = NAN;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1)
            load = NAN;
        fclose(f);
    }
    return load;
}

/* ---- the floor, once per instruction set ---- */

/* One pass, and the same pass over `steps` rows of a pool inlined into the
 * loop (rows of `width` floats, n_rows of them, read from *next on in turn;
 * *next is left at the next). */
typedef void (*floor_fn)(double *acc, const float *attn, size_t n);
typedef void (*floor_loop_fn)(double *acc, const float *rows, size_t width, size_t n_rows,
                              size_t *next, size_t n, size_t steps);

static inline __attribute__((always_inline)) void floor_pass(double *restrict acc,
                                                            const float *restrict attn, size_t n)
{
    for (size_t i = 0; i < n; i++)
        acc[i] += (double)attn[i];
}

static inline __attribute__((always_inline)) void floor_loop(double *restrict acc,
                                                            const float *restrict rows,
                                                            size_t width, size_t n_rows,
                                                            size_t *next, size_t n, size_t steps)
{
    size_t r = *next;
    for (size_t s = 0; s < steps; s++) {
        floor_pass(acc, rows + r * width, n);
        r = r + 1 == n_rows ? 0 : r + 1;
    }
    *next = r;
}

/* The pass that also keeps the lowest new score: one minimum per vector, the
 * least an argmin needs (a tree over four vectors, then the running one), so
 * that the cost of tracking a minimum at the floor's speed is measured too.
 * Written with the vector intrinsics (the
 * compiler does not vectorise a minimum of doubles without -ffast-math);
 * the baseline is the plain loop. */
static inline __attribute__((always_inline)) double floor_min_tail(double *restrict acc,
                                                                  const float *restrict attn,
                                                                  size_t i, size_t n, double low)
{
    for (; i < n; i++) {
        double s = acc[i] + (double)attn[i];
        acc[i] = s;
        low = s < low ? s : low;
    }
    return low;
}

static double floor_min_base(double *acc, const float *attn, size_t n)
{
    return floor_min_tail(acc, attn, 0, n, INFINITY);
}

/* The floors for each instruction set: `attr` is an attribute (it cannot take
 * parentheses), and the lane counts are constants. */
/* NOLINTBEGIN(bugprone-macro-parentheses,bugprone-implicit-widening-of-multiplication-result) */
#define FLOOR_FNS(suffix, attr)                                                             \
    attr static void floor_##suffix(double *acc, const float *attn, size_t n)              \
    {                                                                                       \
        floor_pass(acc, attn, n);                                                           \
    }                                                                                       \
    attr static void floor_loop_##suffix(double *acc, const float *rows, size_t width,     \
                                         size_t n_rows, size_t *next, size_t n, size_t steps) \
    {                                                                                       \
        floor_loop(acc, rows, width, n_rows, next, n, steps);                               \
    }

FLOOR_FNS(base, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PERF_X86 1
FLOOR_FNS(avx2, __attribute__((target("avx2"))))
#if defined(__clang__)
FLOOR_FNS(avx512, __attribute__((target("avx512f,avx512vl"))))
#else
FLOOR_FNS(avx512, __attribute__((target("avx512f,avx512vl,prefer-vector-width=512"))))
#endif
#include <immintrin.h>

/* floor_min_SUFFIX for vectors V of W doubles, intrinsics prefixed D (and F
 * for the float half). */
#define FLOOR_MIN(suffix, attr, V, W, D, F)                                                 \
    attr static double floor_min_##suffix(double *acc, const float *attn, size_t n)        \
    {                                                                                       \
        V m = D##_set1_pd(INFINITY), s[4];                                                  \
        size_t i = 0;                                                                       \
        for (; i + 4 * (W) <= n; i += 4 * (W)) {                                            \
            for (size_t k = 0; k < 4; k++) {                                                \
                s[k] = D##_add_pd(D##_loadu_pd(acc + i + (W) * k),                          \
                                  D##_cvtps_pd(F##_loadu_ps(attn + i + (W) * k)));          \
                D##_storeu_pd(acc + i + (W) * k, s[k]);                                     \
            }                                                                               \
            m = D##_min_pd(D##_min_pd(D##_min_pd(s[0], s[1]), D##_min_pd(s[2], s[3])), m);  \
        }                                                                                   \
        double lanes[W], low = INFINITY;                                                    \
        D##_storeu_pd(lanes, m);                                                            \
        for (size_t j = 0; j < (W); j++)                                                    \
            low = lanes[j] < low ? lanes[j] : low;                                          \
        return floor_min_tail(acc, attn, i, n, low);                                        \
    }
FLOOR_MIN(avx2, __attribute__((target("avx2"))), __m256d, 4, _mm256, _mm)
FLOOR_MIN(avx512, __attribute__((target("avx512f,avx512vl"))), __m512d, 8, _mm512, _mm256)
#else
#define PERF_X86 0
#endif
/* NOLINTEND(bugprone-macro-parentheses,bugprone-implicit-widening-of-multiplication-result) */

typedef double (*floor_min_fn)(double *acc, const float *attn, size_t n);

typedef struct floor_isa {
    const char *name;
    floor_fn fn;
    floor_loop_fn loop;
    floor_min_fn min;
    int available;
} floor_isa;

static floor_isa floors[3];
static size_t n_floors;

/* The instruction sets of the floors this machine has, "x86-64, avx2, ...". */
void perf_print_floors(FILE *f)
{
    for (size_t i = 0, k = 0; i < n_floors; i++)
        if (floors[i].available)
            fprintf(f, "%s%s", k++ ? ", " : "", floors[i].name);
}

static void floors_init(void)
{
    n_floors = 0;
    floors[n_floors++] = (floor_isa){"x86-64", floor_base, floor_loop_base, floor_min_base, 1};
#if PERF_X86
    __builtin_cpu_init();
    floors[n_floors++] = (floor_isa){"avx2", floor_avx2, floor_loop_avx2, floor_min_avx2,
                                     __builtin_cpu_supports("avx2") != 0};
    floors[n_floors++] = (floor_isa){"avx512", floor_avx512, floor_loop_avx512, floor_min_avx512,
                                     __builtin_cpu_supports("avx512f") &&
                                         __builtin_cpu_supports("avx512vl")};
#endif
}

/* ---- attention pools ---- */

/* n_rows rows of `width` weights in [0, 2 / width), row r at w + r*width:
 * at most max_rows rows and POOL_BYTES bytes, at least 2 rows. */
typedef struct pool {
    float *w;
    size_t width, n_rows;
} pool;

static void pool_init(pool *p, size_t width, size_t max_rows, uint64_t seed)
{
    p->width = width;
    p->n_rows = POOL_BYTES / (width * sizeof(float));
    p->n_rows = p->n_rows > max_rows ? max_rows : p->n_rows < 2 ? 2 : p->n_rows;
    p->w = xmalloc(p->n_rows * width * sizeof(float));
    kve_rng g;
    kve_rng_seed(&g, seed);
    for (size_t i = 0; i < p->n_rows * width; i++)
        p->w[i] = (float)(kve_rng_uniform(&g) * 2.0 / (double)width);
}

/* ---- workloads ---- */

typedef enum { W_FLOOR, W_FLOOR_LOOP, W_FLOOR_MIN, W_POLICY, W_NAIVE, W_BANK } wkind;

typedef struct work {
    wkind kind;
    const pool *pool;
    size_t row;    /* the next pool row */
    size_t budget;
    int attn;      /* step with rows (1) or NULL (0) */
    int keys;      /* step with a key of PERF_KEY_DIM floats (the pool row's first) */
    int values;    /* ... and a value of PERF_KEY_DIM floats (the next row's) */
    const float *queries; /* ... and PERF_GROUP queries from these QUERY_SETS sets */
    int32_t pos;   /* next position */
    /* W_FLOOR, W_FLOOR_LOOP */
    const floor_isa *floor;
    double *acc;
    size_t width;
    double sink; /* W_FLOOR_MIN: the minima, summed, so that they are computed */
    /* W_POLICY */
    kve_policy *p;
    /* W_NAIVE: h2o's arithmetic, kept in plain arrays */
    int sort;
    int32_t *npos;
    double *nscore;
    size_t *idx;
    size_t n;
    /* W_BANK */
    kve_bank *b;
    size_t heads, threads;
} work;

/* The next row of the pool, in turn (no division: a counter that wraps). */
static const float *next_row(work *w)
{
    const float *r = w->pool->w + w->row * w->pool->width;
    w->row = w->row + 1 == w->pool->n_rows ? 0 : w->row + 1;
    return r;
}

static void checked(kve_status st, const char *what)
{
    if (st != KVE_OK)
        die_status(st, what);
}

enum { QUERY_SETS = 16 };

/* One step of w's policy at w->pos with what w says it reads, from the
 * next pool row (attention, key and value alike); fill: without attention,
 * and a row taken only when the step carries a vector. */
static void step_policy(work *w, int fill)
{
    const int vectors = w->keys || w->values || w->queries;
    const float *a = !fill || vectors ? next_row(w) : NULL;
    const float *attn = !fill && w->attn ? a : NULL;
    if (!w->values && !w->queries) { /* the plain step of the policy API */
        checked(kve_policy_step_keys(w->p, w->pos, attn, attn ? kve_policy_size(w->p) : 0,
                                     w->keys ? a : NULL),
                fill ? "fill" : "step");
        return;
    }
    kve_step_data d = kve_step_default_data();
    d.attn = attn;
    d.ld = attn ? kve_policy_size(w->p) : 0;
    d.keys = w->keys ? a : NULL;
    d.ld_keys = PERF_KEY_DIM;
    d.values = w->values ? a : NULL;
    d.ld_values = PERF_KEY_DIM;
    d.queries = w->queries ? w->queries + (size_t)(w->pos % QUERY_SETS) * PERF_GROUP *
                                              PERF_KEY_DIM
                           : NULL;
    d.ld_queries = PERF_KEY_DIM;
    checked(kve_policy_step_data(w->p, w->pos, &d), fill ? "fill" : "step");
}

static void run_policy(work *w, size_t steps)
{
    int32_t victims[4];
    for (size_t s = 0; s < steps; s++, w->pos++) {
        step_policy(w, 0);
        checked(kve_policy_evict(w->p, w->budget, victims, 4, NULL), "evict");
    }
}

static const double *sort_scores; /* qsort has no context argument */

static int by_score_then_position(const void *x, const void *y)
{
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    if (sort_scores[i] != sort_scores[j])
        return sort_scores[i] < sort_scores[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

static void run_naive(work *w, size_t steps)
{
    for (size_t s = 0; s < steps; s++, w->pos++) {
        const float *a = next_row(w);
        for (size_t i = 0; i < w->n; i++) /* pass 1: add */
            w->nscore[i] += (double)a[i];
        w->npos[w->n] = w->pos;
        w->nscore[w->n++] = 0.0;
        if (w->n <= w->budget)
            continue;
        size_t limit = w->n - NAIVE_RECENT, v = 0;
        if (w->sort) { /* pass 2: sort the unprotected slots by (score, position) */
            for (size_t i = 0; i < limit; i++)
                w->idx[i] = i;
            sort_scores = w->nscore;
            qsort(w->idx, limit, sizeof *w->idx, by_score_then_position);
            v = w->idx[0];
        } else { /* pass 2: argmin */
            for (size_t i = 1; i < limit; i++)
                if (w->nscore[i] < w->nscore[v])
                    v = i;
        }
        /* pass 3: compaction */
        memmove(w->npos + v, w->npos + v + 1, (w->n - v - 1) * sizeof *w->npos);
        memmove(w->nscore + v, w->nscore + v + 1, (w->n - v - 1) * sizeof *w->nscore);
        w->n--;
    }
}

/* One thread's share of a bank step: heads [first, first + count), pool rows
 * from `row` on in turn (the same row for every thread at a token). */
typedef struct share {
    work *w;
    size_t first, count, steps, row;
    int32_t pos;
    pthread_barrier_t *done;
} share;

static void *run_share(void *arg)
{
    share *s = arg;
    work *w = s->w;
    size_t ld = w->budget + 1;
    int32_t *victims = xmalloc(2 * s->count * sizeof *victims);
    for (size_t k = 0; k < s->steps; k++) {
        int32_t pos = s->pos + (int32_t)k;
        const float *rows = w->pool->w + ((s->row + k) % w->pool->n_rows) * w->pool->width +
                            s->first * ld;
        checked(kve_bank_step_range(w->b, s->first, s->count, pos, rows, ld, 1, KVE_REDUCE_MEAN,
                                    NULL, 0),
                "bank step");
        checked(kve_bank_evict_range(w->b, s->first, s->count, w->budget, victims, 2, NULL),
                "bank evict");
        if (s->done)
            pthread_barrier_wait(s->done); /* the token is done when every head is */
    }
    free(victims);
    return NULL;
}

static void run_bank(work *w, size_t steps)
{
    if (w->threads == 1) {
        share s = {w, 0, w->heads, steps, w->row, w->pos, NULL};
        run_share(&s);
    } else {
        pthread_barrier_t done;
        if (pthread_barrier_init(&done, NULL, 2) != 0)
            die_input("cannot create a barrier");
        size_t half = w->heads / 2;
        share s[2] = {{w, 0, half, steps, w->row, w->pos, &done},
                      {w, half, w->heads - half, steps, w->row, w->pos, &done}};
        pthread_t th;
        if (pthread_create(&th, NULL, run_share, &s[1]) != 0)
            die_input("cannot start a thread");
        run_share(&s[0]);
        pthread_join(th, NULL);
        pthread_barrier_destroy(&done);
    }
    w->pos += (int32_t)steps;
    w->row = (w->row + steps) % w->pool->n_rows;
}

static void run(work *w, size_t steps)
{
    switch (w->kind) {
    case W_FLOOR:
        for (size_t s = 0; s < steps; s++)
            w->floor->fn(w->acc, next_row(w), w->width);
        break;
    case W_FLOOR_MIN:
        for (size_t s = 0; s < steps; s++)
            w->sink += w->floor->min(w->acc, next_row(w), w->width);
        break;
    case W_FLOOR_LOOP:
        w->floor->loop(w->acc, w->pool->w, w->pool->width, w->pool->n_rows, &w->row, w->width,
                       steps);
        break;
    case W_POLICY: run_policy(w, steps); break;
    case W_NAIVE: run_naive(w, steps); break;
    case W_BANK: run_bank(w, steps); break;
    }
}

/* ns per step: the best of o->reps runs of about o->target seconds each,
 * after a calibration run that doubles the steps until one run lasts an
 * eighth of the target (and warms caches and state up). */
static double measure(work *w, const timing_opts *o, size_t *steps_out)
{
    const clockid_t clock = w->threads > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID;
    size_t steps = 1;
    double t;
    for (;;) {
        double t0 = now_s(clock);
        run(w, steps);
        t = now_s(clock) - t0;
        if (t >= o->target / 8 || steps >= ((size_t)1 << 24))
            break;
        steps *= 2;
    }
    double per = t / (double)steps;
    steps = per > 0 ? (size_t)(o->target / per) : steps;
    steps = steps < 1 ? 1 : steps;
    double best = INFINITY;
    for (size_t r = 0; r < o->reps; r++) {
        double t0 = now_s(clock);
        run(w, steps);
        double d = (now_s(clock) - t0) / (double)steps;
        best = d < best ? d : best;
    }
    *steps_out = steps;
    return best * 1e9;
}

/* ns per call of w's floor when `steps` calls are each timed on their own
 * with `clock` and the durations summed, as a benchmark that reads a clock
 * around every call reports it: the best of o->reps such sums. */
static double measure_each(work *w, const timing_opts *o, size_t steps, clockid_t clock)
{
    double best = INFINITY;
    for (size_t r = 0; r < o->reps; r++) {
        double sum = 0.0;
        for (size_t s = 0; s < steps; s++) {
            const float *a = next_row(w);
            double t0 = now_s(clock);
            w->floor->fn(w->acc, a, w->width);
            sum += now_s(clock) - t0;
        }
        double d = sum / (double)steps;
        best = d < best ? d : best;
    }
    return best * 1e9;
}

/* ---- rows ---- */

static row *add_row(perf_rows *rs, const pool *p, place where)
{
    if (rs->n == rs->cap)
        rs->r = xrealloc(rs->r, (rs->cap = rs->cap ? 2 * rs->cap : 64) * sizeof *rs->r);
    row *r = &rs->r[rs->n++];
    memset(r, 0, sizeof *r);
    r->impl = "kvevict";
    r->heads = r->threads = 1;
    r->attn = "rows";
    r->where = where;
    r->pool_rows = p->n_rows;
    r->load1 = load1();
    r->moved = NAN;
    return r;
}

/* The floor of `slots` slots, from rows of `p` (width >= slots): the
 * fastest instruction set (the one called `best`) and the baseline. */
typedef struct floor_cost {
    double ns, base_ns;
    const floor_isa *best;
    size_t steps; /* timed per run, by the fastest */
} floor_cost;

static floor_cost measure_floor(const pool *p, size_t slots, const timing_opts *o)
{
    floor_cost f = {INFINITY, INFINITY, &floors[0], 1};
    work w = {.kind = W_FLOOR, .pool = p, .width = slots};
    w.acc = xcalloc(slots, sizeof *w.acc);
    for (size_t i = 0; i < n_floors; i++) {
        if (!floors[i].available)
            continue;
        size_t steps;
        w.floor = &floors[i];
        double ns = measure(&w, o, &steps);
        if (i == 0)
            f.base_ns = ns;
        if (ns < f.ns) {
            f.ns = ns;
            f.best = &floors[i];
            f.steps = steps;
        }
    }
    free(w.acc);
    return f;
}

static void set_floor(row *r, const floor_cost *f)
{
    r->floor_ns = f->ns;
    r->floor_base_ns = f->base_ns;
    r->floor_isa = f->best->name;
}

/* The floor's own rows for `slots` slots of pool p: the floor itself
 * ("called"), the pass inlined into the loop over steps, each call timed on
 * its own with two clocks, and the pass that also tracks the lowest score
 * ("with-min"); all with the fastest instruction set. */
static void floor_rows(perf_rows *rs, const pool *p, place where, size_t budget, size_t heads,
                       size_t slots, const floor_cost *f, const timing_opts *o)
{
    static const char *const names[] = {"called", "inline", "timed-each-monotonic",
                                        "timed-each-cputime", "with-min"};
    work w = {.kind = W_FLOOR_LOOP, .pool = p, .width = slots, .floor = f->best};
    w.acc = xcalloc(slots, sizeof *w.acc);
    size_t each = f->steps < EACH_MAX_STEPS ? f->steps : EACH_MAX_STEPS;
    for (size_t k = 0; k < 5; k++) {
        row *r = add_row(rs, p, where);
        r->impl = "floor";
        snprintf(r->name, sizeof r->name, "%s", names[k]);
        snprintf(r->spec, sizeof r->spec, "%s", names[k]);
        r->budget = budget;
        r->heads = heads;
        r->state_bytes = heads * (budget + 1) * (sizeof(double) + sizeof(float));
        set_floor(r, f);
        if (k == 0) {
            r->ns = f->ns;
            r->steps = f->steps;
        } else if (k == 1 || k == 4) {
            w.kind = k == 1 ? W_FLOOR_LOOP : W_FLOOR_MIN;
            r->ns = measure(&w, o, &r->steps);
        } else {
            r->ns = measure_each(&w, o, each, k == 2 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID);
            r->steps = each;
        }
    }
    free(w.acc);
}

/* The positions a one-victim evict moves to close its hole (those after the
 * victim, a memmove), mean over `steps` more steps of w (not timed): the
 * victim's index is where it would sit among the positions kept after it. */
static double moved_per_evict(work *w, size_t steps)
{
    int32_t victims[4];
    double moved = 0.0;
    size_t evicts = 0;
    for (size_t s = 0; s < steps; s++, w->pos++) {
        step_policy(w, 0);
        size_t nv = 0;
        checked(kve_policy_evict(w->p, w->budget, victims, 4, &nv), "evict");
        if (nv != 1)
            continue;
        const int32_t *pos = kve_policy_positions(w->p);
        size_t lo = 0, hi = kve_policy_size(w->p);
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (pos[mid] < victims[0])
                lo = mid + 1;
            else
                hi = mid;
        }
        moved += (double)(kve_policy_size(w->p) - lo);
        evicts++;
    }
    return evicts ? moved / (double)evicts : NAN;
}

static void spec_of(char *out, const char *name, size_t budget)
{
    char *s = canon_spec("policy", name, budget);
    snprintf(out, KVE_SPEC_MAX, "%s", s);
    free(s);
}

/* The queries expected_attention is stepped with: QUERY_SETS sets of
 * PERF_GROUP queries of PERF_KEY_DIM floats, uniform in [-1, 1). */
static float *query_sets(void)
{
    float *q = xmalloc((size_t)QUERY_SETS * PERF_GROUP * PERF_KEY_DIM * sizeof *q);
    kve_rng g;
    kve_rng_seed(&g, 7);
    for (size_t i = 0; i < (size_t)QUERY_SETS * PERF_GROUP * PERF_KEY_DIM; i++)
        q[i] = (float)(kve_rng_uniform(&g) * 2.0 - 1.0);
    return q;
}

/* How a row steps its policy. */
typedef struct step_mode {
    const char *name; /* "rows", "null", "keys" */
    int attn, keys, values, queries;
} step_mode;

/* One policy row: `spec` at `budget` (named `name` in the tables), in
 * placement `where`, built checked or unchecked, filled to the budget with
 * steps without attention, then timed in the steady state as `m` says. */
static void time_policy(perf_rows *rs, const pool *p, place where, const char *impl,
                        const char *name, const char *spec, size_t budget, const step_mode *m,
                        int unchecked, const float *queries, const floor_cost *f,
                        const timing_opts *o)
{
    row *r = add_row(rs, p, where);
    r->impl = impl;
    snprintf(r->name, sizeof r->name, "%s", name);
    spec_of(r->spec, spec, budget);
    r->budget = budget;
    r->attn = m->name;
    r->unchecked = unchecked;
    if ((m->keys || m->values) && p->width < PERF_KEY_DIM)
        die_usage("budget %zu: the policies that read keys or values are timed at budgets of "
                  "at least %d", budget, PERF_KEY_DIM);
    kve_rng rng;
    kve_rng_seed(&rng, 1);
    work w = {.kind = W_POLICY, .pool = p, .budget = budget, .attn = m->attn, .keys = m->keys,
              .values = m->values, .queries = m->queries ? queries : NULL};
    kve_policy_options po = kve_policy_default_options();
    po.key_dim = m->keys ? PERF_KEY_DIM : 0;
    po.value_dim = m->values ? PERF_KEY_DIM : 0;
    po.query_group = m->queries ? PERF_GROUP : 1;
    po.unchecked = unchecked;
    if (m->queries) {
        po.rope.rotary_dim = PERF_KEY_DIM;
        po.rope.pairs = KVE_ROPE_HALF;
    }
    checked(kve_policy_new_ex(r->spec, &rng, &po, &w.p), r->spec);
    for (; (size_t)w.pos < budget; w.pos++) /* fill: a NULL step, or one vector's work */
        step_policy(&w, 1);
    r->ns = measure(&w, o, &r->steps);
    r->state_bytes = kve_policy_state_bytes(w.p);
    if (kve_policy_reads(w.p) != KVE_READS_NOTHING) /* the scored ones: a memmove */
        r->moved = moved_per_evict(&w, MOVED_STEPS);
    set_floor(r, f);
    kve_policy_free(w.p);
}

/* One row of policy type t at `budget`: stepped with attention rows (attn),
 * NULL, or NULL and keys (and, for expected_attention, queries and a
 * value); built checked or unchecked. */
static void policy_row(perf_rows *rs, const pool *p, place where, size_t t, size_t budget,
                       int attn, int unchecked, const float *queries, const floor_cost *f,
                       const timing_opts *o)
{
    const char *name = kve_policy_type_name(t);
    const kve_reads reads = kve_policy_type_reads(t);
    const int keys = (reads & KVE_READS_KEYS) != 0;
    step_mode m = {keys ? "keys" : attn ? "rows" : "null", attn, keys,
                   (reads & KVE_READS_VALUES) != 0, (reads & KVE_READS_QUERIES) != 0};
    time_policy(rs, p, where, "kvevict", name, name, budget, &m, unchecked, queries, f, o);
}

/* ---- score rules as an application writes them (rule_examples.h) ---- */

static void register_rules(int on)
{
    kve_score_rule r = kve_score_rule_default();
    r.state = 1;
    r.name = "rule_h2o";
    r.summary = "h2o as a score rule";
    r.observe = example_rule_h2o;
    if (on)
        checked(kve_score_rule_register(&r), "rule_h2o");
    else
        (void)kve_score_rule_unregister(r.name);
    r.name = "rule_vh2o";
    r.summary = "value-aware h2o as a score rule";
    r.observe = example_rule_vh2o;
    r.values = 1;
    if (on)
        checked(kve_score_rule_register(&r), "rule_vh2o");
    else
        (void)kve_score_rule_unregister(r.name);
}

static void naive_rows(perf_rows *rs, const pool *p, size_t budget, const floor_cost *f,
                       const timing_opts *o)
{
    for (int sort = 0; sort < 2; sort++) {
        row *r = add_row(rs, p, PLACE_POOL);
        r->impl = sort ? "naive-sort" : "naive-passes";
        snprintf(r->name, sizeof r->name, "h2o");
        spec_of(r->spec, "h2o", budget);
        r->budget = budget;
        work w = {.kind = W_NAIVE, .pool = p, .budget = budget, .sort = sort};
        w.npos = xmalloc((budget + 1) * sizeof *w.npos);
        w.nscore = xmalloc((budget + 1) * sizeof *w.nscore);
        w.idx = xmalloc((budget + 1) * sizeof *w.idx);
        for (; (size_t)w.pos < budget; w.pos++) { /* fill, as the policies */
            w.npos[w.n] = w.pos;
            w.nscore[w.n++] = 0.0;
        }
        r->ns = measure(&w, o, &r->steps);
        r->state_bytes = (budget + 1) * (sizeof *w.npos + sizeof *w.nscore);
        set_floor(r, f);
        free(w.npos);
        free(w.nscore);
        free(w.idx);
    }
}

static void measure_policies(perf_rows *rs, size_t budget, const timing_opts *o, int quiet)
{
    float *queries = query_sets();
    for (int where = PLACE_POOL; where < N_PLACES; where++) {
        pool p;
        pool_init(&p, budget + 1, where == PLACE_HOT ? HOT_ROWS : POOL_ROWS, budget);
        floor_cost f = measure_floor(&p, budget, o);
        floor_rows(rs, &p, (place)where, budget, 1, budget, &f, o);
        for (size_t t = 0; t < kve_policy_type_count(); t++) {
            const char *name = kve_policy_type_name(t);
            const kve_reads reads = kve_policy_type_reads(t);
            if (strcmp(name, "full") == 0 ||
                (strcmp(name, "keydiff") == 0 && budget > KEYDIFF_MAX_BUDGET))
                continue;
            if ((reads & KVE_READS_QUERIES) &&
                (budget > EA_MAX_BUDGET || quiet || where != PLACE_POOL))
                continue; /* --quick: only its interval=64 row (below), which fills faster */
            for (int attn = 1; attn >= 0; attn--) {
                if ((reads & KVE_READS_KEYS) && attn)
                    continue; /* one mode: NULL attention and a key */
                /* The hot placement: the policies that read the rows. */
                if (where == PLACE_HOT && !(attn && (reads & KVE_READS_ATTN)))
                    continue;
                for (int unchecked = 0; unchecked < 2; unchecked++)
                    if (!unchecked || (attn && (reads & KVE_READS_ATTN)))
                        policy_row(rs, &p, (place)where, t, budget, attn, unchecked, queries,
                                   &f, o);
            }
        }
        if (where == PLACE_POOL) {
            /* the methods' variants and the score rules against the built-in lanes */
            static const step_mode rows_values = {"rows", 1, 0, 1, 0};
            static const step_mode rows_only = {"rows", 1, 0, 0, 0};
            static const step_mode ea = {"keys", 0, 1, 1, 1};
            time_policy(rs, &p, PLACE_POOL, "kvevict", "h2o:vnorm=1", "h2o:vnorm=1", budget,
                        &rows_values, 0, queries, &f, o);
            time_policy(rs, &p, PLACE_POOL, "rule", "rule_h2o", "rule_h2o", budget, &rows_only, 0,
                        queries, &f, o);
            time_policy(rs, &p, PLACE_POOL, "rule", "rule_vh2o", "rule_vh2o", budget,
                        &rows_values, 0, queries, &f, o);
            if (budget <= EA_INTERVAL_MAX_BUDGET)
                time_policy(rs, &p, PLACE_POOL, "kvevict", "expected_attention:interval=64",
                            "expected_attention:interval=64", budget, &ea, 0, queries, &f, o);
            naive_rows(rs, &p, budget, &f, o);
        }
        free(p.w);
    }
    free(queries);
    if (!quiet && !cli_quiet && isatty(STDERR_FILENO))
        fprintf(stderr, "\rkvevict perf: budget %zu done   ", budget);
}

static void measure_banks(perf_rows *rs, const size_t *heads, size_t n_heads, const size_t *budgets,
                          size_t n_budgets, const timing_opts *o)
{
    for (size_t bi = 0; bi < n_budgets; bi++)
        for (size_t hi = 0; hi < n_heads; hi++)
            for (int where = PLACE_POOL; where < N_PLACES; where++) {
                size_t budget = budgets[bi], h = heads[hi];
                pool p;
                pool_init(&p, h * (budget + 1), where == PLACE_HOT ? HOT_ROWS : POOL_ROWS,
                          budget * 7 + h);
                floor_cost f = measure_floor(&p, h * budget, o);
                for (size_t k = 0; k < 3; k++) {
                    size_t threads = k == 2 ? 2 : 1;
                    int unchecked = k == 1;
                    if (threads == 2 && where != PLACE_POOL)
                        continue;
                    row *r = add_row(rs, &p, (place)where);
                    snprintf(r->name, sizeof r->name, "h2o");
                    spec_of(r->spec, "h2o", budget);
                    r->budget = budget;
                    r->heads = h;
                    r->threads = threads;
                    r->unchecked = unchecked;
                    work w = {.kind = W_BANK, .pool = &p, .budget = budget, .heads = h,
                              .threads = threads};
                    kve_bank_options bo = kve_bank_default_options();
                    bo.unchecked = unchecked;
                    checked(kve_bank_new_ex(r->spec, h, NULL, &bo, &w.b), r->spec);
                    for (; (size_t)w.pos < budget; w.pos++)
                        checked(kve_bank_step(w.b, w.pos, NULL, 0), "fill");
                    r->ns = measure(&w, o, &r->steps);
                    r->state_bytes = kve_bank_state_bytes(w.b);
                    set_floor(r, &f);
                    kve_bank_free(w.b);
                }
                free(p.w);
            }
}

/* ---- output ---- */

static void print_rows(FILE *f, const perf_rows *rs, tfmt fmt)
{
    static const col cols[] = {
        {"impl", "impl", COL_ALL | COL_LEFT},
        {"policy", "name", COL_TEXT | COL_LEFT},
        {"spec", KEY_POLICY, COL_CSV | COL_JSON},
        {"budget", KEY_BUDGET, COL_ALL},
        {"heads", KEY_HEADS, COL_ALL},
        {"threads", KEY_THREADS, COL_ALL},
        {"attn", "attn", COL_ALL | COL_LEFT},
        {"unchecked", "unchecked", COL_ALL},
        {"pool rows", "pool_rows", COL_ALL},
        {"ns/step", KEY_NS, COL_ALL},
        {"ns/slot", "ns_per_slot", COL_ALL},
        {"floor ns", KEY_FLOOR_NS, COL_ALL},
        {"floor isa", "floor_isa", COL_ALL | COL_LEFT},
        {"x86-64 floor ns", "floor_base_ns_per_step", COL_ALL},
        {"ratio", KEY_RATIO, COL_ALL},
        {"bytes/slot", "bytes_per_slot", COL_ALL},
        {"state bytes", KEY_STATE, COL_CSV | COL_JSON},
        {"isa", "isa", COL_CSV | COL_JSON},
        {"timed steps", "timed_steps", COL_CSV | COL_JSON},
        {"load", "load_average", COL_ALL},
        {"moved/evict", "moved_per_evict", COL_ALL},
    };
    table t;
    table_init(&t, cols, sizeof cols / sizeof cols[0]);
    for (size_t i = 0; i < rs->n; i++) {
        const row *r = &rs->r[i];
        table_str(&t, r->impl);
        table_str(&t, r->name);
        table_str(&t, r->spec);
        table_uint(&t, r->budget);
        table_uint(&t, r->heads);
        table_uint(&t, r->threads);
        table_str(&t, r->attn);
        table_uint(&t, (uint64_t)r->unchecked);
        table_uint(&t, r->pool_rows);
        table_real(&t, r->ns, "%.1f");
        table_real(&t, r->ns / slots_of(r), "%.4f");
        table_real(&t, r->floor_ns, "%.1f");
        table_str(&t, r->floor_isa);
        table_real(&t, r->floor_base_ns, "%.1f");
        table_real(&t, r->ns / r->floor_ns, "%.2f");
        table_real(&t, (double)r->state_bytes / ((double)r->heads * (double)(r->budget + 1)),
                   "%.2f");
        table_uint(&t, r->state_bytes);
        table_str(&t, kve_isa_name());
        table_uint(&t, r->steps);
        table_real(&t, r->load1, "%.2f");
        table_real(&t, r->moved, "%.1f");
    }
    table_print(&t, f, fmt);
    table_free(&t);
}

static void load_average(double load[3])
{
    load[0] = load[1] = load[2] = NAN;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = load[1] = load[2] = NAN;
        fclose(f);
    }
}


static const char perf_usage[] =
    "usage: kvevict perf [--budget B1,B2,...] [--quick] [--reps N] [--ms MS]\n"
    "                    [--format text|md|csv|json | --json | --csv | --md] [-o FILE]\n"
    "                    [--docs FILE] [--plot DIR]\n"
    "\n"
    "Times every policy in an engine's decode loop (step, then evict one, in the\n"
    "steady state) at budgets 256, 1Ki, 4Ki, 16Ki, 64Ki and 256Ki, against the\n"
    "memory floor measured in the same run: one pass reading B float32 weights and\n"
    "adding them into B float64 scores, compiled for every instruction set the\n"
    "machine has (the fastest is the floor; the baseline x86-64 one is shown too).\n"
    "The policies that read attention are timed checked and unchecked (built with\n"
    "unchecked = 1: no validation of the weights), with attention rows from a pool\n"
    "of up to 64 rows and from a hot pool of 8, each against the floor of its own\n"
    "pool; the floor itself also inlined and timed call by call (impl floor).\n"
    "Also a naive h2o (separate passes; sort-based selection) and banks of h2o of\n"
    "8, 64 and 256 heads at 256, 1Ki and 4Ki driven by 1 and 2 threads. One row per\n"
    "measurement: ns/step, ns per kept slot, the floor, the ratio, bytes per slot,\n"
    "the load average when it was taken.\n"
    "Timings depend on the machine and its load; they are never asserted.\n"
    "\n"
    "  --budget B1,...    budgets of the policy rows (default above; counts, not\n"
    "                     percentages: perf times policies of a given size)\n"
    "  --quick            budgets 256 and 4Ki, banks of 8 heads, 2 runs of 2 ms\n"
    "  --reps N           runs per measurement, the best counts (default 7)\n"
    "  --ms MS            milliseconds per run (default 5)\n"
    "  --format F         text (default), md, csv or json; --csv, --json, --md\n"
    "  --json             JSON Lines, one object per row: impl, policy (the spec),\n"
    "                     budget, heads, threads, attn (rows, null or keys),\n"
    "                     unchecked (0 or 1), pool_rows, ns_per_step, ns_per_slot,\n"
    "                     floor_ns_per_step, floor_isa, floor_base_ns_per_step,\n"
    "                     ratio_to_floor, bytes_per_slot, state_bytes, isa (the\n"
    "                     library's kernels), timed_steps, load_average (1 minute,\n"
    "                     before the row), moved_per_evict (positions an evict\n"
    "                     moved, mean; null for the policies without a score)\n"
    "  -o, --output FILE  write there instead of standard output (- for it)\n"
    "  --docs FILE        also rewrite the block between <!-- perf:begin --> and\n"
    "                     <!-- perf:end --> of FILE (conditions, tables, targets)\n"
    "  --plot DIR         also draw DIR/perf_vs_budget.png with gnuplot\n"
    "  --quiet            no line on stderr saying which budget is done\n";

static const opt_def perf_own[] = {
    {"quick", 0, 0}, {"reps", 0, OPT_VALUE}, {"ms", 0, OPT_VALUE},
    {"docs", 0, OPT_VALUE}, {"plot", 0, OPT_VALUE},
};
static const cli_spec perf_spec = {
    .usage = perf_usage,
    .shared = SO_BUDGETS | SO_FORMAT | SO_OUTPUT | SO_QUIET,
    CLI_OWN(perf_own),
    .default_format = FMT_TEXT,
};

int perf_main(int argc, char **argv, const perf_renderers *render)
{
    cli_args a;
    cli_parse(&a, &perf_spec, argc, argv);
    int quick = cli_own(&a, &perf_spec, "quick")->count > 0;
    const opt_val *reps = cli_own(&a, &perf_spec, "reps"), *ms = cli_own(&a, &perf_spec, "ms");
    const opt_val *docs = cli_own(&a, &perf_spec, "docs"), *dir = cli_own(&a, &perf_spec, "plot");
    if ((docs->count || dir->count) && !render) /* the source-tree tool renders them */
        return source_tree_run("perf", argc, argv);
    timing_opts o = {quick ? 2 : 7, quick ? 0.002 : 0.005};
    if (reps->count)
        o.reps = (size_t)parse_u64("--reps", reps->v[0], 1, 1000);
    if (ms->count)
        o.target = (double)parse_u64("--ms", ms->v[0], 1, 60000) / 1e3;
    const size_t *budgets = quick ? quick_budgets : default_budgets;
    size_t n_budgets = quick ? 2 : sizeof default_budgets / sizeof default_budgets[0];
    if (a.budgets_relative)
        die_usage("--budget: perf times policies of a given size, with no trace or model to take "
                  "a percentage of: give counts of positions");
    if (a.n_budgets) {
        budgets = a.budgets;
        n_budgets = a.n_budgets;
    }
    if (dir->count && system("command -v gnuplot >/dev/null 2>&1") != 0)
        die_input("--plot: gnuplot not found (apt-get install gnuplot-nox)");
    FILE *out = out_open(a.output);
    floors_init();
    double load[3];
    load_average(load);

    perf_rows rs = {0};
    register_rules(1);
    for (size_t i = 0; i < n_budgets; i++)
        measure_policies(&rs, budgets[i], &o, quick);
    register_rules(0);
    static const size_t one_budget[] = {256};
    measure_banks(&rs, bank_heads, quick ? 1 : N_BANK_HEADS,
                  quick ? one_budget : bank_budgets, quick ? 1 : N_BANK_BUDGETS, &o);
    if (!quick && !cli_quiet && isatty(STDERR_FILENO))
        fprintf(stderr, "\r%40s\r", "");

    print_rows(out, &rs, a.format);
    if (docs->count)
        render->docs(docs->v[0], &rs, budgets, n_budgets, &o, load);
    if (dir->count)
        render->plot(dir->v[0], &rs, budgets, n_budgets);
    free(rs.r);
    out_close(out);
    return 0;
}

int cmd_perf(int argc, char **argv)
{
    return perf_main(argc, argv, NULL);
}
