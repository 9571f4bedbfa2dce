/* SPDX-License-Identifier: MIT */
/*
 * calibrate.c - `kvevict trace --calibrate`: the declared calibration of the
 * canonical trace's version 3 (docs/trace.md, "Calibration, version 3"),
 * its feasibility map, and the outside check; the docs' `calibration`
 * block, which renders a committed run.
 *
 * The procedure, as the page fixes it: on every point (heavy, heavy_mass)
 * of a 10 x 16 grid, version 2's generator with every other key at its
 * default and seed 1; sink_mass fitted by version 2's bisection (multiples
 * of 0.00001 in [0, 1 - 0.55 - heavy_mass], the smallest with streaming's
 * retained mass at budget 256 >= 0.73665); the six observations judged by
 * `kvevict bench`'s judge_observations, unchanged. The chosen point: the
 * most of observations 1-5 holding, then 6 holding, then the greatest
 * depth (Chebyshev grid distance to the nearest point where one of its
 * holding observations fails), then the fewest grid steps from version 2's
 * (16, 0.200), then grid order. With --sink-mass M nothing is fitted and
 * every point is judged at M on seeds 1 .. --seeds (the outside check).
 * Every row also keeps, from replays of scissorhands and h2o at their
 * defaults, what the argument about observations (4) and (5) reads: when
 * scissorhands's kept set freezes, and what each holds at the end.
 *
 * Invariants: a row depends only on its point, its seed and the fixed
 * sink_mass (if any): points run on up to CALIB_THREADS threads, each row
 * into its own slot, so the output is the same for any number of threads
 * and any order of completion; the choice and the map are functions of the
 * rows, so a committed JSON Lines file renders the same text as the run
 * that wrote it. Cost: a fitted point is 2 + ceil(log2(top)) evaluations of
 * streaming (about 17) plus one of the 17 specs the observations read, each
 * O(T^2) in the trace's rows (T = 4096); memory O(T) a thread.
 */
#define _POSIX_C_SOURCE 200809L
#include "calibrate.h"

#include "jsonl.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CALIB_THREADS = 16, V2_I = 7, V2_J = 7, NO_FAIL_DEPTH = 16 };

const size_t calib_heavy[CALIB_N_HEAVY] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};

unsigned calib_mass_milli(size_t j)
{
    return 25u * (unsigned)(j + 1);
}

/* The fit's window: f rounds to the page's 0.7367. */
static const double TARGET_LO = 0.73665, TARGET_HI = 0.73675;

static const char *const fit_names[] = {"reproduced", "missed", "below", "above", "fixed"};

/* The JSON keys of the figures, in row order (CF_*). */
static const char *const fig_keys[CF_COUNT] = {
    "streaming_retained_mass_256", "streaming_top32_recall_256", "streaming_top32_recall_512",
    "h2o_w16_retained_mass_256",   "h2o_w32_retained_mass_256",  "h2o_w48_retained_mass_256",
    "h2o_w64_retained_mass_256",   "h2o_w80_retained_mass_256",  "h2o_w96_retained_mass_256",
    "h2o_w128_retained_mass_256",  "h2o_w64_top32_recall_256",   "h2o_top32_recall_256",
    "h2o_retained_mass_512",       "h2o_top32_recall_512",       "scissorhands_retained_mass_256",
    "scissorhands_top32_recall_256", "scissorhands_retained_mass_512",
    "scissorhands_top32_recall_512", "window_top32_recall_256",  "window_top32_recall_512",
    "random_top32_recall_256",     "random_top32_recall_512",
    "scissorhands_frozen_from_256", "scissorhands_frozen_from_512",
    "scissorhands_late_kept_256",  "scissorhands_late_kept_512", "h2o_late_kept_256",
    "h2o_late_kept_512",
};

/* ---- one point ------------------------------------------------------------ */

/* The largest sink_mass the generator takes beside column j's heavy_mass,
 * in units of 0.00001: 1 - 0.55 - heavy_mass. */
static unsigned top_units(size_t j)
{
    return 45000u - 100u * calib_mass_milli(j);
}

static void point_spec(char *buf, size_t cap, size_t i, size_t j, unsigned long long seed,
                       unsigned units)
{
    unsigned m = calib_mass_milli(j);
    snprintf(buf, cap, "canonical:version=2,seed=%llu,heavy=%zu,heavy_mass=%u.%03u,"
             "sink_mass=%u.%05u",
             seed, calib_heavy[i], m / 1000, m % 1000, units / 100000, units % 100000);
}

/* f: the retained mass of streaming:budget=256 at sink_mass units. */
static double f_streaming(size_t i, size_t j, unsigned long long seed, unsigned units)
{
    char spec[160];
    point_spec(spec, sizeof spec, i, j, seed, units);
    kve_trace *tr = NULL;
    kve_status st = kve_trace_open(spec, NULL, &tr);
    if (st != KVE_OK)
        die_status(st, spec);
    kve_eval_job job = {"streaming", 256};
    kve_eval_result r;
    kve_eval_options o = kve_eval_default_options();
    o.seed = BENCH_SEED;
    st = kve_eval(tr, 0, 1, &job, 1, &o, &r, NULL);
    kve_trace_free(tr);
    if (st != KVE_OK)
        die_status(st, "calibration: streaming");
    return r.retained_mass;
}

/* Version 2's bisection at point (i, j): row->sink_units and row->fit. */
static void fit_point(calib_row *row)
{
    unsigned lo = 0, hi = top_units(row->j);
    double f_lo = f_streaming(row->i, row->j, row->seed, lo);
    double f_hi = f_streaming(row->i, row->j, row->seed, hi);
    row->fit_evals = 2;
    if (f_lo >= TARGET_LO) {
        row->fit = CALIB_FIT_ABOVE;
        row->sink_units = 0;
        return;
    }
    if (f_hi < TARGET_LO) {
        row->fit = CALIB_FIT_BELOW;
        row->sink_units = hi;
        return;
    }
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        double fm = f_streaming(row->i, row->j, row->seed, mid);
        row->fit_evals++;
        if (fm >= TARGET_LO) {
            hi = mid;
            f_hi = fm;
        } else {
            lo = mid;
        }
    }
    row->sink_units = hi;
    row->fit = f_hi < TARGET_HI ? CALIB_FIT_OK : CALIB_FIT_MISSED;
}

static void keep_figures(calib_row *row, evalset *es)
{
    static const size_t windows[] = {16, 32, 48, 64, 80, 96, 128};
    double *g = row->fig;
    const kve_eval_result *s = evalset_get(es, "streaming", 256);
    g[CF_STREAMING_MASS_256] = s->retained_mass;
    g[CF_STREAMING_RECALL_256] = s->top32_recall;
    g[CF_STREAMING_RECALL_512] = evalset_get(es, "streaming", 512)->top32_recall;
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
        char spec[64];
        snprintf(spec, sizeof spec, "h2o:recent_window=%zu", windows[w]);
        g[CF_H2O_W16_MASS_256 + w] = evalset_get(es, spec, 256)->retained_mass;
    }
    g[CF_H2O_W64_RECALL_256] = evalset_get(es, "h2o:recent_window=64", 256)->top32_recall;
    g[CF_H2O_RECALL_256] = evalset_get(es, "h2o", 256)->top32_recall;
    g[CF_H2O_MASS_512] = evalset_get(es, "h2o", 512)->retained_mass;
    g[CF_H2O_RECALL_512] = evalset_get(es, "h2o", 512)->top32_recall;
    for (size_t b = 0; b < 2; b++) {
        const kve_eval_result *c = evalset_get(es, "scissorhands", 256 * (b + 1));
        g[CF_SCISSORHANDS_MASS_256 + 2 * b] = c->retained_mass;
        g[CF_SCISSORHANDS_RECALL_256 + 2 * b] = c->top32_recall;
        g[CF_WINDOW_RECALL_256 + b] = evalset_get(es, "window", 256 * (b + 1))->top32_recall;
        g[CF_RANDOM_RECALL_256 + b] = evalset_get(es, "random", 256 * (b + 1))->top32_recall;
    }
}

/* The replays: what scissorhands and h2o (defaults) hold, step by step. */
enum { REPLAY_WINDOW = 32, FIRST_EPOCH = 512, N_REPLAYS = 4 };
static const kve_eval_job replay_jobs[N_REPLAYS] = {
    {"scissorhands", 256}, {"scissorhands", 512}, {"h2o", 256}, {"h2o", 512}};

typedef struct replay_track {
    unsigned char *kept[N_REPLAYS]; /* [T] */
    int32_t last_other[N_REPLAYS];  /* last step with a victim other than t - 32 */
} replay_track;

static int track_step(void *user, size_t job, int32_t pos, const int32_t *victims, size_t n)
{
    replay_track *k = user;
    k->kept[job][pos] = 1;
    for (size_t v = 0; v < n; v++)
        k->kept[job][victims[v]] = 0;
    if (n && !(n == 1 && victims[0] == pos - REPLAY_WINDOW))
        k->last_other[job] = pos;
    return 0;
}

static void keep_replays(calib_row *row, kve_trace *tr)
{
    size_t T = kve_trace_steps(tr);
    replay_track k;
    for (int j = 0; j < N_REPLAYS; j++) {
        k.kept[j] = xcalloc(T, 1);
        k.last_other[j] = -1;
    }
    kve_eval_result res[N_REPLAYS];
    kve_eval_options o = kve_eval_default_options();
    o.seed = BENCH_SEED;
    o.on_step = track_step;
    o.user = &k;
    kve_status st = kve_eval(tr, 0, 1, replay_jobs, N_REPLAYS, &o, res, NULL);
    if (st != KVE_OK)
        die_status(st, "calibration: replay");
    size_t late[N_REPLAYS] = {0};
    for (int j = 0; j < N_REPLAYS; j++) {
        for (size_t p = FIRST_EPOCH; p + REPLAY_WINDOW < T; p++)
            late[j] += k.kept[j][p];
        free(k.kept[j]);
    }
    row->fig[CF_SC_FROZEN_256] = (double)(k.last_other[0] + 1);
    row->fig[CF_SC_FROZEN_512] = (double)(k.last_other[1] + 1);
    row->fig[CF_SC_LATE_256] = (double)late[0];
    row->fig[CF_SC_LATE_512] = (double)late[1];
    row->fig[CF_H2O_LATE_256] = (double)late[2];
    row->fig[CF_H2O_LATE_512] = (double)late[3];
}

/* The whole row: fit (unless fixed), then the observations. A point the
 * generator refuses (a fixed sink_mass too large beside its heavy_mass) is
 * not judged. */
static void eval_row(calib_row *row, int fixed, unsigned fixed_units)
{
    for (int k = 0; k < N_OBS; k++)
        row->outcome[k] = OBS_NOT_JUDGED;
    for (int k = 0; k < CF_COUNT; k++)
        row->fig[k] = NAN;
    if (fixed) {
        row->fit = CALIB_FIT_FIXED;
        row->sink_units = fixed_units;
    } else {
        fit_point(row);
    }
    char spec[160];
    point_spec(spec, sizeof spec, row->i, row->j, row->seed, row->sink_units);
    kve_trace *tr = NULL;
    if (fixed && fixed_units > top_units(row->j)) {
        row->trace = xstrdup(spec); /* refused: sink + band + heavy > 1 */
        return;
    }
    kve_status st = kve_trace_open(spec, NULL, &tr);
    if (st != KVE_OK)
        die_status(st, spec);
    row->trace = xstrdup(kve_trace_source(tr));
    evalset es;
    evalset_init(&es);
    es.quiet = 1;
    judge_observations(NULL, &es, 0, 0, row->outcome); /* collect */
    cli_args a;
    memset(&a, 0, sizeof a);
    a.seed = BENCH_SEED;
    a.topk = 32;
    evalset_run(&es, tr, &a, 0);
    judge_observations(NULL, &es, 0, 0, row->outcome);
    keep_figures(row, &es);
    keep_replays(row, tr);
    evalset_free(&es);
    kve_trace_free(tr);
}

/* ---- the run, on threads ---------------------------------------------------- */

typedef struct calib_work {
    calib_run *r;
    int fixed;
    unsigned fixed_units;
    size_t next, done;
    pthread_mutex_t lock;
} calib_work;

static void *calib_worker(void *arg)
{
    calib_work *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->lock);
        size_t k = w->next++;
        pthread_mutex_unlock(&w->lock);
        if (k >= w->r->n)
            return NULL;
        eval_row(&w->r->rows[k], w->fixed, w->fixed_units);
        pthread_mutex_lock(&w->lock);
        w->done++;
        if (isatty(STDERR_FILENO))
            fprintf(stderr, "\rkvevict trace: calibration: %zu/%zu rows ", w->done, w->r->n);
        pthread_mutex_unlock(&w->lock);
    }
}

/* Evaluates the rows already laid out in r (i, j, seed set). */
static void calib_eval(calib_run *r, int fixed, unsigned fixed_units)
{
    calib_work w = {r, fixed, fixed_units, 0, 0, PTHREAD_MUTEX_INITIALIZER};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n_threads = cpus > 1 ? (size_t)cpus : 1;
    n_threads = n_threads < r->n ? n_threads : r->n;
    n_threads = n_threads < CALIB_THREADS ? n_threads : CALIB_THREADS;
    pthread_t th[CALIB_THREADS];
    size_t started = 0;
    /* cppcheck takes sysconf's count for a constant below 2: it is the
     * machine's, read at run time. */
    // cppcheck-suppress knownConditionTrueFalse
    for (size_t k = 1; k < n_threads; k++, started++)
        if (pthread_create(&th[k - 1], NULL, calib_worker, &w) != 0)
            break; /* fewer threads: the others take the work */
    calib_worker(&w);
    for (size_t k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    if (isatty(STDERR_FILENO))
        fputs("\r\033[K", stderr);
}

void calib_free(calib_run *r)
{
    for (size_t k = 0; k < r->n; k++)
        free(r->rows[k].trace);
    free(r->rows);
    memset(r, 0, sizeof *r);
}

/* ---- rows as JSON Lines, and back ------------------------------------------- */

static const char *outcome_word(int o)
{
    return o == OBS_HOLDS ? "holds" : o == OBS_FAILS ? "fails" : "not judged";
}

static void write_row(FILE *f, const calib_row *row)
{
    unsigned m = calib_mass_milli(row->j);
    fprintf(f, "{\"heavy\": %zu, \"heavy_mass\": %u.%03u, \"sink_mass\": %u.%05u, \"fit\": ",
            calib_heavy[row->i], m / 1000, m % 1000, row->sink_units / 100000,
            row->sink_units % 100000);
    json_string(f, fit_names[row->fit]);
    fprintf(f, ", \"fit_evals\": %u, \"trace_seed\": %llu, \"trace\": ", row->fit_evals,
            row->seed);
    json_string(f, row->trace);
    for (int k = 0; k < N_OBS; k++) {
        fprintf(f, ", \"claim_%d\": ", k + 1);
        json_string(f, outcome_word(row->outcome[k]));
    }
    for (int k = 0; k < CF_COUNT; k++) {
        fprintf(f, ", \"%s\": ", fig_keys[k]);
        json_double(f, row->fig[k]);
    }
    fputs("}\n", f);
}

static const char *need(const jrow *q, const char *key, const char *path, size_t line)
{
    const char *v = jrow_text(q, key);
    if (!v)
        die_input("%s:%zu: no \"%s\"", path, line, key);
    return v;
}

/* A decimal with at most `places` places as an integer count of 10^-places. */
static unsigned decimal_units(const char *s, unsigned places, const char *path, size_t line,
                              const char *key)
{
    char *end;
    double x = strtod(s, &end);
    double scale = pow(10.0, (double)places);
    if (*end || !(x >= 0) || x * scale > 4e9 || fabs(x * scale - floor(x * scale + 0.5)) > 1e-6)
        die_input("%s:%zu: \"%s\" is %s, not a multiple of 1e-%u", path, line, key, s, places);
    return (unsigned)floor(x * scale + 0.5);
}

void calib_read(calib_run *r, const char *path)
{
    memset(r, 0, sizeof *r);
    jfile jf;
    jfile_read(&jf, path);
    r->n = jf.n;
    r->rows = xcalloc(jf.n ? jf.n : 1, sizeof *r->rows);
    for (size_t k = 0; k < jf.n; k++) {
        const jrow *q = &jf.rows[k];
        calib_row *row = &r->rows[k];
        size_t line = k + 1;
        unsigned long long h = strtoull(need(q, "heavy", path, line), NULL, 10);
        row->i = CALIB_N_HEAVY;
        for (size_t i = 0; i < CALIB_N_HEAVY; i++)
            if (calib_heavy[i] == h)
                row->i = i;
        unsigned m = decimal_units(need(q, "heavy_mass", path, line), 3, path, line, "heavy_mass");
        if (row->i == CALIB_N_HEAVY || m % 25 || m < 25 || m > 25 * CALIB_N_MASS)
            die_input("%s:%zu: heavy=%llu, heavy_mass=%s is not a point of the grid", path, line,
                      h, need(q, "heavy_mass", path, line));
        row->j = m / 25 - 1;
        row->sink_units =
            decimal_units(need(q, "sink_mass", path, line), 5, path, line, "sink_mass");
        const char *fit = need(q, "fit", path, line);
        row->fit = CALIB_FIT_FIXED + 1;
        for (int n = 0; n <= CALIB_FIT_FIXED; n++)
            if (strcmp(fit, fit_names[n]) == 0)
                row->fit = (calib_fit)n;
        if (row->fit > CALIB_FIT_FIXED)
            die_input("%s:%zu: fit \"%s\" is none of reproduced, missed, below, above, fixed",
                      path, line, fit);
        row->fit_evals = (unsigned)strtoul(need(q, "fit_evals", path, line), NULL, 10);
        row->seed = strtoull(need(q, "trace_seed", path, line), NULL, 10);
        row->trace = xstrdup(need(q, "trace", path, line));
        for (int c = 0; c < N_OBS; c++) {
            char key[16];
            snprintf(key, sizeof key, "claim_%d", c + 1);
            const char *o = need(q, key, path, line);
            row->outcome[c] = strcmp(o, "holds") == 0   ? OBS_HOLDS
                              : strcmp(o, "fails") == 0 ? OBS_FAILS
                                                        : OBS_NOT_JUDGED;
        }
        for (int c = 0; c < CF_COUNT; c++) {
            const char *v = need(q, fig_keys[c], path, line);
            row->fig[c] = strcmp(v, "null") == 0 ? NAN : strtod(v, NULL);
        }
    }
    jfile_free(&jf);
    /* Point-major, the same seeds at every point, every point once. */
    r->seeds = 1;
    while (r->seeds < r->n && r->rows[r->seeds].i == r->rows[0].i &&
           r->rows[r->seeds].j == r->rows[0].j)
        r->seeds++;
    r->fixed = r->n && r->rows[0].fit == CALIB_FIT_FIXED;
    if (r->n != (size_t)CALIB_N_POINTS * r->seeds)
        die_input("%s: %zu rows, not the %d points of the grid times %zu seed%s", path, r->n,
                  CALIB_N_POINTS, r->seeds, r->seeds == 1 ? "" : "s");
    for (size_t k = 0; k < r->n; k++) {
        const calib_row *row = &r->rows[k];
        size_t p = k / r->seeds;
        if (row->i * CALIB_N_MASS + row->j != p || row->seed != r->rows[k % r->seeds].seed ||
            (row->fit == CALIB_FIT_FIXED) != r->fixed)
            die_input("%s:%zu: rows are not in grid order with one set of seeds and one kind of "
                      "fit",
                      path, k + 1);
    }
}

/* ---- the objective ------------------------------------------------------------ */

static unsigned holds_mask(const calib_row *row)
{
    unsigned s = 0;
    for (int k = 0; k < N_OBS; k++)
        s |= (unsigned)(row->outcome[k] == OBS_HOLDS) << k;
    return s;
}

static unsigned popcount5(unsigned s)
{
    unsigned n = 0;
    for (int k = 0; k < 5; k++)
        n += (s >> k) & 1u;
    return n;
}

static size_t absdiff(size_t a, size_t b)
{
    return a > b ? a - b : b - a;
}

/* Grid steps (Chebyshev) from row p to the nearest row where one of p's
 * holding observations fails; NO_FAIL_DEPTH when there is none. */
static size_t depth(const calib_run *r, size_t p)
{
    unsigned s = holds_mask(&r->rows[p]);
    size_t best = NO_FAIL_DEPTH;
    for (size_t q = 0; q < r->n; q++) {
        if ((s & ~holds_mask(&r->rows[q])) == 0)
            continue;
        size_t di = absdiff(r->rows[p].i, r->rows[q].i), dj = absdiff(r->rows[p].j, r->rows[q].j);
        size_t d = di > dj ? di : dj;
        best = d < best ? d : best;
    }
    return best;
}

static size_t v2_distance(const calib_row *row)
{
    return absdiff(row->i, V2_I) + absdiff(row->j, V2_J);
}

/* 1 when point a is preferred to point b (a < b in grid order). */
static int better(const calib_run *r, size_t a, size_t b)
{
    unsigned sa = holds_mask(&r->rows[a]), sb = holds_mask(&r->rows[b]);
    if (popcount5(sa) != popcount5(sb))
        return popcount5(sa) > popcount5(sb);
    if (((sa >> 5) & 1u) != ((sb >> 5) & 1u))
        return (sa >> 5) & 1u;
    size_t da = depth(r, a), db = depth(r, b);
    if (da != db)
        return da > db;
    return v2_distance(&r->rows[a]) < v2_distance(&r->rows[b]);
}

size_t calib_choose(const calib_run *r)
{
    size_t best = 0;
    for (size_t p = 1; p < r->n; p++)
        if (better(r, p, best))
            best = p;
    return best;
}

/* ---- rendering ------------------------------------------------------------------ */

static char mass_heads[CALIB_N_MASS][16];

static void grid_cols(col *cols, const char *corner)
{
    cols[0] = (col){corner, "heavy", COL_ALL};
    for (size_t j = 0; j < CALIB_N_MASS; j++) {
        unsigned m = calib_mass_milli(j);
        snprintf(mass_heads[j], sizeof mass_heads[j], "%u.%03u", m / 1000, m % 1000);
        cols[1 + j] = (col){mass_heads[j], mass_heads[j], COL_ALL};
    }
}

/* The observations holding at a row as digits ("12346"), "-" for none,
 * "n/a" when none was judged. */
static void holds_digits(const calib_row *row, char *buf)
{
    size_t n = 0;
    for (int k = 0; k < N_OBS; k++)
        if (row->outcome[k] == OBS_HOLDS)
            buf[n++] = (char)('1' + k);
    if (n == 0)
        snprintf(buf, N_OBS + 2, "%s", row->outcome[0] == OBS_NOT_JUDGED ? "n/a" : "-");
    else
        buf[n] = '\0';
}

/* The cell of one point in a grid table. */
typedef void (*grid_cell_fn)(table *t, const calib_row *row);

static void map_cell(table *t, const calib_row *row)
{
    char buf[N_OBS + 2];
    holds_digits(row, buf);
    table_str(t, buf);
}

static void sink_cell(table *t, const calib_row *row)
{
    if (row->fit == CALIB_FIT_OK)
        table_fmt(t, "%u.%05u", row->sink_units / 100000, row->sink_units % 100000);
    else
        table_fmt(t, "(%s)", fit_names[row->fit]);
}

/* A table of heavy (rows) by heavy_mass (columns), one cell a point (its
 * first seed's row). */
static void render_grid_table(FILE *f, const calib_run *r, tfmt fmt, grid_cell_fn cell_of)
{
    col cols[1 + CALIB_N_MASS];
    grid_cols(cols, "heavy \\ heavy_mass");
    table t;
    table_init(&t, cols, 1 + CALIB_N_MASS);
    for (size_t i = 0; i < CALIB_N_HEAVY; i++) {
        table_uint(&t, calib_heavy[i]);
        for (size_t j = 0; j < CALIB_N_MASS; j++)
            cell_of(&t, &r->rows[(i * CALIB_N_MASS + j) * r->seeds]);
    }
    table_print(&t, f, fmt);
    table_free(&t);
}

static void render_pairs(FILE *f, const calib_run *r, tfmt fmt)
{
    static const col cols[] = {
        {"", "claim", COL_ALL},  {"(1)", "claim_1", COL_ALL}, {"(2)", "claim_2", COL_ALL},
        {"(3)", "claim_3", COL_ALL}, {"(4)", "claim_4", COL_ALL}, {"(5)", "claim_5", COL_ALL},
        {"(6)", "claim_6", COL_ALL},
    };
    size_t both[N_OBS][N_OBS] = {{0}};
    for (size_t k = 0; k < r->n; k++) {
        unsigned s = holds_mask(&r->rows[k]);
        for (int a = 0; a < N_OBS; a++)
            for (int b = 0; b < N_OBS; b++)
                both[a][b] += ((s >> a) & (s >> b) & 1u);
    }
    table t;
    table_init(&t, cols, 1 + N_OBS);
    for (int a = 0; a < N_OBS; a++) {
        table_fmt(&t, "(%d)", a + 1);
        for (int b = 0; b < N_OBS; b++)
            table_uint(&t, both[a][b]);
    }
    table_print(&t, f, fmt);
    table_free(&t);
    if (fmt != FMT_TEXT && fmt != FMT_MD)
        return;
    char none[256] = "";
    size_t len = 0;
    for (int a = 0; a < N_OBS; a++)
        for (int b = a + 1; b < N_OBS; b++)
            if (both[a][b] == 0)
                len += (size_t)snprintf(none + len, sizeof none - len, "%s(%d) with (%d)",
                                        len ? ", " : "", a + 1, b + 1);
    size_t rows_all = 0;
    for (size_t k = 0; k < r->n; k++)
        rows_all += holds_mask(&r->rows[k]) == (1u << N_OBS) - 1;
    fprintf(f, "\n%s%s. All six together: %zu %s.\n",
            len ? "Pairs that no point holds: " : "Every pair holds together at some point",
            none, rows_all, r->seeds > 1 ? "rows (point, seed)" : "points");
}

static void print_point(FILE *f, const calib_row *row)
{
    unsigned m = calib_mass_milli(row->j);
    fprintf(f, "heavy=%zu, heavy_mass=%u.%03u, sink_mass=%u.%05u", calib_heavy[row->i], m / 1000,
            m % 1000, row->sink_units / 100000, row->sink_units % 100000);
}

static void print_mask(FILE *f, unsigned mask);

static void print_holding(FILE *f, const calib_row *row)
{
    if (holds_mask(row))
        print_mask(f, holds_mask(row));
    else
        fprintf(f, "none");
}

/* The chosen point, how it won, and its figures. */
static void render_choice(FILE *f, const calib_run *r, int md)
{
    if (r->seeds != 1 || r->fixed) {
        fprintf(f, "No point is chosen: this run fixed sink_mass (the outside check).\n");
        return;
    }
    size_t c = calib_choose(r);
    const calib_row *row = &r->rows[c];
    unsigned s = holds_mask(row);
    size_t most = 0, also6 = 0, deep = 0;
    size_t dc = depth(r, c);
    for (size_t p = 0; p < r->n; p++) {
        unsigned q = holds_mask(&r->rows[p]);
        if (popcount5(q) != popcount5(s))
            continue;
        most++;
        if (((q >> 5) & 1u) != ((s >> 5) & 1u))
            continue;
        also6++;
        deep += depth(r, p) == dc;
    }
    const char *b = md ? "**" : "";
    fprintf(f, "%sChosen point%s: %s", b, b, md ? "`" : "");
    print_point(f, row);
    fprintf(f, "%s (fit: %s in %u evaluations of streaming). Observations holding on seed %llu: ",
            md ? "`" : "", fit_names[row->fit], row->fit_evals, row->seed);
    print_holding(f, row);
    fprintf(f, ".\n");
    fprintf(f,
            "%sThe ranking: %zu point%s hold%s %u of the observations (1) to (5), the most any "
            "point holds; %zu of them also hold%s (6); %zu of those %s depth %zu (grid steps to "
            "the nearest point where one of the chosen point's observations fails), the greatest; "
            "the chosen point is %zu grid step%s from version 2's (16, 0.200)%s.\n",
            md ? "\n" : "", most, most == 1 ? "" : "s", most == 1 ? "s" : "", popcount5(s), also6,
            also6 == 1 ? "s" : "", deep, deep == 1 ? "has" : "have", dc, v2_distance(row),
            v2_distance(row) == 1 ? "" : "s",
            deep > 1 ? ", the fewest among them (then grid order)" : "");
    const double *g = row->fig;
    fprintf(f,
            "%sIts figures (seed %llu): streaming %.4f of the mass at budget 256 (recall %.4f); "
            "h2o by recent_window at 256: 16: %.4f, 32: %.4f, 48: %.4f, 64: %.4f, 80: %.4f, "
            "96: %.4f, 128: %.4f; top-32 recall at 256 and 512: h2o %.4f, %.4f, streaming %.4f, "
            "%.4f, window %.4f, %.4f, random %.4f, %.4f; scissorhands against h2o at 256: mass "
            "%.4f vs %.4f, recall %.4f vs %.4f; at 512: mass %.4f vs %.4f, recall %.4f vs %.4f.\n",
            md ? "\n" : "", row->seed, g[CF_STREAMING_MASS_256], g[CF_STREAMING_RECALL_256],
            g[CF_H2O_W16_MASS_256], g[CF_H2O_W32_MASS_256], g[CF_H2O_W48_MASS_256],
            g[CF_H2O_W64_MASS_256], g[CF_H2O_W80_MASS_256], g[CF_H2O_W96_MASS_256],
            g[CF_H2O_W128_MASS_256], g[CF_H2O_RECALL_256], g[CF_H2O_RECALL_512],
            g[CF_STREAMING_RECALL_256], g[CF_STREAMING_RECALL_512], g[CF_WINDOW_RECALL_256],
            g[CF_WINDOW_RECALL_512], g[CF_RANDOM_RECALL_256], g[CF_RANDOM_RECALL_512],
            g[CF_SCISSORHANDS_MASS_256], g[CF_H2O_W32_MASS_256], g[CF_SCISSORHANDS_RECALL_256],
            g[CF_H2O_RECALL_256], g[CF_SCISSORHANDS_MASS_512], g[CF_H2O_MASS_512],
            g[CF_SCISSORHANDS_RECALL_512], g[CF_H2O_RECALL_512]);
    fprintf(f, "%sVersion 3: %s%s%s with version=3.\n", md ? "\n" : "", md ? "`" : "", row->trace,
            md ? "`" : "");
}

/* The outside check: per point, on how many seeds (1) to (4) hold together;
 * then the points where they hold on every seed. */
static void render_outside(FILE *f, const calib_run *r, tfmt fmt)
{
    int md = fmt == FMT_MD;
    size_t ns = r->seeds;
    col cols[1 + CALIB_N_MASS];
    grid_cols(cols, "heavy \\ heavy_mass");
    table t;
    table_init(&t, cols, 1 + CALIB_N_MASS);
    size_t all_pts = 0, with5 = 0, rows5 = 0, judged = 0;
    double lo = INFINITY, hi = -INFINITY, near = NAN;
    size_t near_p = 0;
    for (size_t i = 0; i < CALIB_N_HEAVY; i++) {
        table_uint(&t, calib_heavy[i]);
        for (size_t j = 0; j < CALIB_N_MASS; j++) {
            size_t p = i * CALIB_N_MASS + j, k4 = 0, k5 = 0, nj = 0;
            for (size_t s = 0; s < ns; s++) {
                const calib_row *row = &r->rows[p * ns + s];
                unsigned m = holds_mask(row);
                nj += row->outcome[0] != OBS_NOT_JUDGED;
                k4 += (m & 15u) == 15u;
                k5 += (m & 31u) == 31u;
                rows5 += row->outcome[4] == OBS_HOLDS;
            }
            judged += nj == ns;
            if (nj < ns)
                table_str(&t, "n/a");
            else
                table_fmt(&t, "%zu%s", k4, k5 ? "+5" : "");
            with5 += k5 > 0;
            if (k4 == ns && nj == ns) {
                all_pts++;
                double sm = r->rows[p * ns].fig[CF_STREAMING_MASS_256];
                lo = sm < lo ? sm : lo;
                hi = sm > hi ? sm : hi;
                if (isnan(near) || fabs(sm - 0.7367) < fabs(near - 0.7367)) {
                    near = sm;
                    near_p = p;
                }
            }
        }
    }
    table_print(&t, f, fmt);
    table_free(&t);
    fprintf(f,
            "\nEach cell: on how many of the %zu seeds (1) to (4) hold together (+5: on some seed "
            "(5) holds with them; n/a: the generator refuses sink_mass + 0.55 + heavy_mass > 1). "
            "%zu of the %d points are judged.\n\n",
            ns, judged, CALIB_N_POINTS);
    if (all_pts == 0) {
        fprintf(f, "No point holds (1) to (4) together on all %zu seeds.\n", ns);
    } else {
        unsigned m = calib_mass_milli(r->rows[near_p * ns].j);
        fprintf(f,
                "%zu point%s hold%s (1) to (4) together on all %zu seeds; streaming at budget "
                "256 on seed %llu at %s: %.4f to %.4f, nearest to 0.7367 at %sheavy=%zu, "
                "heavy_mass=%u.%03u%s: %.4f.\n",
                all_pts, all_pts == 1 ? "" : "s", all_pts == 1 ? "s" : "", ns, r->rows[0].seed,
                all_pts == 1 ? "it" : "them", lo, hi, md ? "`" : "",
                calib_heavy[r->rows[near_p * ns].i], m / 1000, m % 1000, md ? "`" : "", near);
    }
    if (with5)
        fprintf(f, "(5) holds together with (1) to (4) at %zu point%s, on some seed", with5,
                with5 == 1 ? "" : "s");
    else
        fprintf(f, "(5) holds together with (1) to (4) at no point, on any seed");
    fprintf(f, "; (5) holds at %zu of the %zu rows (point, seed) in all.\n", rows5, r->n);
    if (all_pts == 0)
        return;
    static const col lcols[] = {
        {"heavy", "heavy", COL_ALL},
        {"heavy_mass", "heavy_mass", COL_ALL},
        {"streaming @256, seed 1", "streaming_retained_mass_256", COL_ALL},
        {"minus 0.7367", "minus_page", COL_ALL},
        {"streaming, the other seeds", "streaming_others", COL_ALL},
        {"(5) holds on", "claim_5_seeds", COL_ALL},
    };
    fprintf(f, "\nThe points at which (1) to (4) hold together on all %zu seeds:\n\n", ns);
    table_init(&t, lcols, sizeof lcols / sizeof lcols[0]);
    for (size_t p = 0; p < CALIB_N_POINTS; p++) {
        size_t k4 = 0, k5 = 0;
        double olo = INFINITY, ohi = -INFINITY;
        for (size_t s = 0; s < ns; s++) {
            const calib_row *row = &r->rows[p * ns + s];
            k4 += (holds_mask(row) & 15u) == 15u;
            k5 += row->outcome[4] == OBS_HOLDS;
            if (s > 0) {
                olo = fmin(olo, row->fig[CF_STREAMING_MASS_256]);
                ohi = fmax(ohi, row->fig[CF_STREAMING_MASS_256]);
            }
        }
        if (k4 != ns)
            continue;
        const calib_row *row = &r->rows[p * ns];
        unsigned m = calib_mass_milli(row->j);
        table_uint(&t, calib_heavy[row->i]);
        table_fmt(&t, "%u.%03u", m / 1000, m % 1000);
        table_real(&t, row->fig[CF_STREAMING_MASS_256], "%.4f");
        table_real(&t, row->fig[CF_STREAMING_MASS_256] - 0.7367, "%+.4f");
        if (ns > 1)
            table_fmt(&t, "%.4f to %.4f", olo, ohi);
        else
            table_str(&t, "-");
        table_fmt(&t, "%zu of %zu", k5, ns);
    }
    table_print(&t, f, fmt);
    table_free(&t);
}

/* The evidence behind the pair (4) with (5), from the rows: what the two
 * policies recover against streaming, and the replays. */
static void render_argument(FILE *f, const calib_run *r)
{
    size_t n4 = 0, n5 = 0, both = 0;
    double sc_below[2] = {INFINITY, -INFINITY}, sc_below512[2] = {INFINITY, -INFINITY};
    double gap_r[2] = {INFINITY, INFINITY}, gap_m[2] = {INFINITY, INFINITY};
    double h2o_late[2] = {INFINITY, -INFINITY}, h5[2] = {INFINITY, -INFINITY};
    double frozen[2][2] = {{INFINITY, -INFINITY}, {INFINITY, -INFINITY}};
    double sc_late[2] = {INFINITY, -INFINITY};
    for (size_t k = 0; k < r->n; k++) {
        const double *g = r->rows[k].fig;
        unsigned s = holds_mask(&r->rows[k]);
        for (int b = 0; b < 2; b++) {
            frozen[b][0] = fmin(frozen[b][0], g[CF_SC_FROZEN_256 + b]);
            frozen[b][1] = fmax(frozen[b][1], g[CF_SC_FROZEN_256 + b]);
        }
        sc_late[0] = fmin(sc_late[0], fmin(g[CF_SC_LATE_256], g[CF_SC_LATE_512]));
        sc_late[1] = fmax(sc_late[1], fmax(g[CF_SC_LATE_256], g[CF_SC_LATE_512]));
        both += (s & 24u) == 24u;
        if (s & 16u) {
            n5++;
            double d = fmax(g[CF_H2O_RECALL_256] - g[CF_STREAMING_RECALL_256],
                            g[CF_H2O_RECALL_512] - g[CF_STREAMING_RECALL_512]);
            h5[0] = fmin(h5[0], d);
            h5[1] = fmax(h5[1], d);
        }
        if (!(s & 8u))
            continue;
        n4++;
        double d256 = g[CF_STREAMING_RECALL_256] - g[CF_SCISSORHANDS_RECALL_256];
        double d512 = g[CF_STREAMING_RECALL_512] - g[CF_SCISSORHANDS_RECALL_512];
        sc_below[0] = fmin(sc_below[0], d256);
        sc_below[1] = fmax(sc_below[1], d256);
        sc_below512[0] = fmin(sc_below512[0], d512);
        sc_below512[1] = fmax(sc_below512[1], d512);
        gap_r[0] = fmin(gap_r[0], g[CF_H2O_RECALL_256] - g[CF_SCISSORHANDS_RECALL_256]);
        gap_r[1] = fmin(gap_r[1], g[CF_H2O_RECALL_512] - g[CF_SCISSORHANDS_RECALL_512]);
        gap_m[0] = fmin(gap_m[0], g[CF_H2O_W32_MASS_256] - g[CF_SCISSORHANDS_MASS_256]);
        gap_m[1] = fmin(gap_m[1], g[CF_H2O_MASS_512] - g[CF_SCISSORHANDS_MASS_512]);
        h2o_late[0] = fmin(h2o_late[0], fmin(g[CF_H2O_LATE_256], g[CF_H2O_LATE_512]));
        h2o_late[1] = fmax(h2o_late[1], fmax(g[CF_H2O_LATE_256], g[CF_H2O_LATE_512]));
    }
    fprintf(f,
            "(4) with (5): %zu point%s hold%s both. The replays: at every one of the %zu "
            "points, scissorhands (lifetime count, window 32) evicts, from some step on, only "
            "the position leaving its window: from step %.0f to %.0f (earliest and latest "
            "point) at budget 256, from %.0f to %.0f at 512; at the end of the trace it holds "
            "%.0f to %.0f positions from after the first epoch (>= 512) outside its window.\n\n",
            both, both == 1 ? "" : "s", both == 1 ? "s" : "", r->n, frozen[0][0], frozen[0][1],
            frozen[1][0], frozen[1][1], sc_late[0], sc_late[1]);
    if (n4)
        fprintf(f,
                "At the %zu points where (4) holds, h2o recovers more of the top-32 than "
                "streaming (what (4) requires) and holds %.0f to %.0f positions from after the "
                "first epoch outside its window at the end (budgets 256 and 512), while "
                "scissorhands recovers less than streaming, by %.4f to %.4f at budget 256 and "
                "%.4f to %.4f at 512. So h2o's top-32 recall exceeds scissorhands's by at least "
                "%.4f at 256 and %.4f at 512, and its retained mass by at least %.4f and %.4f: "
                "never within the 0.01 of (5).\n\n",
                n4, h2o_late[0], h2o_late[1], sc_below[0], sc_below[1], sc_below512[0],
                sc_below512[1], gap_r[0], gap_r[1], gap_m[0], gap_m[1]);
    if (n5)
        fprintf(f,
                "At the %zu points where (5) holds, h2o's top-32 recall minus streaming's, the "
                "larger of budgets 256 and 512, is %+.4f to %+.4f: never above it, as (4) would "
                "need.\n",
                n5, h5[0], h5[1]);
}

static void calib_render(FILE *f, const calib_run *r, const char *part, tfmt fmt)
{
    int md = fmt == FMT_MD, all = part == NULL;
    if (fmt == FMT_JSON) {
        for (size_t k = 0; k < r->n; k++)
            write_row(f, &r->rows[k]);
        return;
    }
    if (r->fixed) {
        if (all)
            fprintf(f,
                    "kvevict trace --calibrate: the outside check, sink_mass fixed at %u.%05u, "
                    "seeds %llu to %llu, version 2's generator on the %d x %d grid of heavy x "
                    "heavy_mass (docs/trace.md, \"Calibration, version 3\"), policy seed 0.\n\n",
                    r->rows[0].sink_units / 100000, r->rows[0].sink_units % 100000,
                    r->rows[0].seed, r->rows[r->seeds - 1].seed, CALIB_N_HEAVY, CALIB_N_MASS);
        if (all || strcmp(part, "outside") == 0)
            render_outside(f, r, fmt);
        if (all)
            fprintf(f, "\nRows (point, seed) at which both observations hold (the diagonal: "
                       "each alone):\n\n");
        if (all || strcmp(part, "pairs") == 0)
            render_pairs(f, r, fmt);
        return;
    }
    if (all)
        fprintf(f,
                "kvevict trace --calibrate: version 2's generator on the %d x %d grid of heavy x "
                "heavy_mass, sink_mass fitted at every point, seed %llu, policy seed 0 "
                "(docs/trace.md, \"Calibration, version 3\").\n\nThe observations holding at "
                "each point:\n\n",
                CALIB_N_HEAVY, CALIB_N_MASS, r->rows[0].seed);
    if (all || strcmp(part, "map") == 0)
        render_grid_table(f, r, fmt, map_cell);
    if (all)
        fprintf(f, "\nThe fitted sink_mass (in parentheses: how the fit ended where it did not "
                   "reproduce 0.7367):\n\n");
    if (all || strcmp(part, "sink") == 0)
        render_grid_table(f, r, fmt, sink_cell);
    if (all)
        fprintf(f, "\nPoints at which both observations hold (the diagonal: each alone), of "
                   "%d:\n\n",
                CALIB_N_POINTS);
    if (all || strcmp(part, "pairs") == 0)
        render_pairs(f, r, fmt);
    if (all)
        fprintf(f, "\n");
    if (all || strcmp(part, "argument") == 0)
        render_argument(f, r);
    if (all)
        fprintf(f, "\n");
    if (all || strcmp(part, "choice") == 0)
        render_choice(f, r, md);
}

void render_calibration_block(FILE *f, char *const *args, size_t n_args)
{
    const char *part = NULL;
    for (size_t k = 1; k < n_args; k++)
        if (strncmp(args[k], "part=", 5) == 0 && !part)
            part = args[k] + 5;
        else
            die_usage("block 'calibration' takes FILE part=map|sink|pairs|argument|choice|outside");
    if (n_args < 1 || !part)
        die_usage("block 'calibration' takes FILE part=map|sink|pairs|argument|choice|outside");
    static const char *const parts[] = {"map", "sink", "pairs", "argument", "choice",
                                        "outside"};
    size_t k = 0;
    while (k < 6 && strcmp(part, parts[k]) != 0)
        k++;
    if (k == 6)
        die_usage("block 'calibration': part=%s is none of map, sink, pairs, argument, choice, "
                  "outside",
                  part);
    calib_run r;
    calib_read(&r, args[0]);
    if ((k == 5) != r.fixed && k != 2)
        die_usage("block 'calibration': part=%s does not apply to %s (%s)", part, args[0],
                  r.fixed ? "the outside check" : "a calibration");
    calib_render(f, &r, part, FMT_MD);
    calib_free(&r);
}

/* ---- notes in bench's report on version 3 ------------------------------------------ */

/* "(1), (2), (3), (4) and (6)" for a mask of observations. */
static void print_mask(FILE *f, unsigned mask)
{
    int n = 0, total = 0;
    for (int k = 0; k < N_OBS; k++)
        total += (mask >> k) & 1u;
    for (int k = 0; k < N_OBS; k++)
        if ((mask >> k) & 1u) {
            n++;
            fprintf(f, "%s(%d)", n == 1 ? "" : n == total ? " and " : ", ", k + 1);
        }
}

void calib_observations_note(FILE *f, int markdown, const char *trace)
{
    if (is_calibrated_trace(trace) != 3)
        return;
    kve_trace *tr = NULL;
    kve_status st = kve_trace_open(trace, NULL, &tr);
    if (st != KVE_OK)
        die_status(st, trace);
    calib_row row;
    memset(&row, 0, sizeof row);
    keep_replays(&row, tr);
    kve_trace_free(tr);
    const double *g = row.fig;
    (void)markdown; /* one paragraph in either */
    fprintf(f, "\nOn this trace (version 3) observations ");
    print_mask(f, CALIB_V3_TARGETS);
    fprintf(f,
            " are calibration targets, not predictions: its heavy, heavy_mass and sink_mass "
            "were chosen so that they hold on this seed (docs/trace.md, \"Calibration, version "
            "3\"), and the other seeds (bench --seeds 21) are their test. No point of the "
            "calibration's grid holds (5) together with (4) (the feasibility map). scissorhands "
            "at its defaults counts a position's votes over its lifetime, at most one a step, so "
            "a position leaving its 32-step window cannot outvote the early positions that "
            "collected votes while the cache filled: a replay of this trace shows that from step "
            "%.0f at budget 256 (%.0f at 512) its every victim is the position leaving its "
            "window, and at the end it holds %.0f positions from after the first epoch outside "
            "its window (%.0f at 512), where h2o holds %.0f (%.0f). (4) needs h2o to keep heavy "
            "hitters that arrive later; the lifetime count keeps none that arrive after it "
            "froze, so the two cannot land within 0.01 of each other wherever (4) holds.\n",
            g[CF_SC_FROZEN_256], g[CF_SC_FROZEN_512], g[CF_SC_LATE_256], g[CF_SC_LATE_512],
            g[CF_H2O_LATE_256], g[CF_H2O_LATE_512]);
}

void calib_seeds_note(FILE *f, int calibrated, int markdown)
{
    if (calibrated != 3)
        return;
    fprintf(f, "On this trace claims ");
    print_mask(f, CALIB_V3_TARGETS);
    fprintf(f,
            " were calibration targets on the first seed (docs/trace.md, \"Calibration, "
            "version 3\"):%sthere they hold by construction, and the other seeds are the "
            "prediction.\n\n",
            markdown ? " " : "\n");
}

/* ---- the command ------------------------------------------------------------------ */

static const char calib_usage[] =
    "usage: kvevict trace --calibrate [--at H,M] [--format text|md|json | --json | --md]\n"
    "                     [-o FILE]\n"
    "       kvevict trace --calibrate --sink-mass M [--seeds N] [--at H,M] [--format F]\n"
    "       kvevict trace --calibrate --from FILE [--format F] [-o FILE]\n"
    "\n"
    "The declared calibration of the canonical trace's version 3 (docs/trace.md,\n"
    "\"Calibration, version 3\"): on every point of a 10 x 16 grid, heavy in\n"
    "{1,2,3,4,6,8,12,16,24,32} by heavy_mass in {0.025,...,0.400}, version 2's\n"
    "generator with sink_mass fitted so that streaming:budget=256 retains 0.7367\n"
    "(version 2's bisection), then the six observations of the H2O page judged as\n"
    "kvevict bench judges them, on seed 1. Prints what holds at every point, the\n"
    "fitted sink_mass, the pairs of observations some point holds together, and\n"
    "the chosen point: the most of observations 1-5, then 6, then the greatest\n"
    "depth inside its region, then the fewest grid steps from version 2's (16, 0.2).\n"
    "A few minutes on two cores; points run on one thread per CPU.\n"
    "\n"
    "  --at H,M         only the point heavy=H, heavy_mass=M of the grid (its row)\n"
    "  --sink-mass M    the outside check: nothing fitted, every point judged at\n"
    "                   sink_mass M (points where M + 0.55 + heavy_mass > 1 are not\n"
    "                   judged); no point is chosen\n"
    "  --seeds N        with --sink-mass: judge seeds 1 to N (default 1)\n"
    "  --from FILE      render the rows of an earlier run (its --json output)\n"
    "                   instead of evaluating\n"
    "  --format F       text (default), md or json (one row per point and seed: what\n"
    "                   docs/data/calibration-v3*.jsonl hold)\n"
    "  -o, --output FILE  write there instead of standard output (- for it)\n";

static const opt_def calib_own[] = {{"calibrate", 0, 0},
                                    {"at", 0, OPT_VALUE},
                                    {"sink-mass", 0, OPT_VALUE},
                                    {"seeds", 0, OPT_VALUE},
                                    {"from", 0, OPT_VALUE}};
static const cli_spec calib_spec = {
    .usage = calib_usage,
    .shared = SO_FORMAT | SO_OUTPUT,
    CLI_OWN(calib_own),
    .default_format = FMT_TEXT,
};

int calibrate_requested(int argc, char **argv)
{
    for (int k = 0; k < argc; k++)
        if (strcmp(argv[k], "--calibrate") == 0)
            return 1;
    return 0;
}

/* --at H,M: the grid indices, or a usage error. */
static void parse_at(const char *s, size_t *pi, size_t *pj)
{
    const char *comma = strchr(s, ',');
    if (!comma)
        die_usage("--at: expected H,M (heavy and heavy_mass), not '%s'", s);
    char *h = xstrndup(s, (size_t)(comma - s));
    uint64_t heavy = parse_u64("--at heavy", h, 1, 1024);
    free(h);
    double m = parse_real("--at heavy_mass", comma + 1, 0, 1);
    *pi = CALIB_N_HEAVY;
    for (size_t i = 0; i < CALIB_N_HEAVY; i++)
        if (calib_heavy[i] == heavy)
            *pi = i;
    double k = m * 40.0;
    if (*pi == CALIB_N_HEAVY || fabs(k - floor(k + 0.5)) > 1e-9 || k < 0.5 ||
        k > CALIB_N_MASS + 0.5)
        die_usage("--at: %s is not a point of the grid (heavy in 1,2,3,4,6,8,12,16,24,32; "
                  "heavy_mass a multiple of 0.025 from 0.025 to 0.400)",
                  s);
    *pj = (size_t)floor(k + 0.5) - 1;
}

int cmd_trace_calibrate(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &calib_spec, argc, argv);
    if (a.format == FMT_CSV)
        die_usage("--calibrate prints text, md or json");
    const opt_val *at = cli_own(&a, &calib_spec, "at");
    const opt_val *sm = cli_own(&a, &calib_spec, "sink-mass");
    const opt_val *sd = cli_own(&a, &calib_spec, "seeds");
    const opt_val *from = cli_own(&a, &calib_spec, "from");
    calib_run r;
    memset(&r, 0, sizeof r);
    if (from->count) {
        if (at->count || sm->count || sd->count)
            die_usage("--from renders a run already made: --at, --sink-mass and --seeds do not "
                      "apply");
        calib_read(&r, from->v[0]);
    } else {
        if (sd->count && !sm->count)
            die_usage("--seeds applies to the outside check (--sink-mass): the calibration "
                      "fits on seed 1 only");
        size_t seeds = sd->count ? (size_t)parse_u64("--seeds", sd->v[0], 1, 1000) : 1;
        unsigned fixed_units = 0;
        if (sm->count) {
            double m = parse_real("--sink-mass", sm->v[0], 0, 1);
            double u = m * 100000.0;
            if (fabs(u - floor(u + 0.5)) > 1e-6)
                die_usage("--sink-mass: %s is not a multiple of 0.00001", sm->v[0]);
            fixed_units = (unsigned)floor(u + 0.5);
        }
        size_t i0 = 0, j0 = 0, points = CALIB_N_POINTS;
        if (at->count) {
            parse_at(at->v[0], &i0, &j0);
            points = 1;
        }
        r.seeds = seeds;
        r.fixed = sm->count > 0;
        r.n = points * seeds;
        r.rows = xcalloc(r.n, sizeof *r.rows);
        for (size_t p = 0; p < points; p++)
            for (size_t s = 0; s < seeds; s++) {
                calib_row *row = &r.rows[p * seeds + s];
                row->i = points == 1 ? i0 : p / CALIB_N_MASS;
                row->j = points == 1 ? j0 : p % CALIB_N_MASS;
                row->seed = 1 + s;
            }
        calib_eval(&r, r.fixed, fixed_units);
        if (points == 1 && a.format != FMT_JSON) {
            /* One point: its row, in words. */
            FILE *out = out_open(a.output);
            for (size_t s = 0; s < seeds; s++) {
                const calib_row *row = &r.rows[s];
                if (row->outcome[0] == OBS_NOT_JUDGED) {
                    fprintf(out, "%s: not judged (sink_mass + 0.55 + heavy_mass > 1)\n",
                            row->trace);
                    continue;
                }
                fprintf(out, "%s: fit %s (%u evaluations); holding: ", row->trace,
                        fit_names[row->fit], row->fit_evals);
                print_holding(out, row);
                fprintf(out, "; streaming %.4f\n", row->fig[CF_STREAMING_MASS_256]);
            }
            out_close(out);
            calib_free(&r);
            return 0;
        }
    }
    FILE *out = out_open(a.output);
    calib_render(out, &r, NULL, a.format);
    out_close(out);
    calib_free(&r);
    return 0;
}
