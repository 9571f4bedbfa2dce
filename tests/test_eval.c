/* SPDX-License-Identifier: MIT */
/*
 * test_eval.c - the evaluation harness (kvevict.h, "Evaluation harness"):
 * metric definitions on hand-made traces with answers worked out by hand
 * (including top-32 ties going to the lower position), the exact
 * renormalisation each policy receives (through the internal attention
 * hook), a replay of h2o against a naive in-test reference, determinism,
 * job independence, .npy-written traces evaluating bit for bit like their
 * canonical source, early stop, refusals and allocation failure.
 *
 * Traces are written as small .npy files into a mkdtemp directory.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"
#include "test_allocator.h"
#include "tmpdir.h"
#include "eval_impl.h"
#include "kvevict_eval.h"
#include "eval_options.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005u + 1442695040888963407u;
    return *x >> 11;
}

/* Writes rows (T x T doubles, row-major; only [0, t] of row t is used) as a
 * [T, T] '<f8' (f8) or '<f4' .npy and opens it. */
static kve_status open_matrix(const char *name, const double *m, size_t T, int f8, kve_trace **tr)
{
    char header[128];
    int n = snprintf(header, sizeof header,
                     "{'descr': '<f%d', 'fortran_order': False, 'shape': (%zu, %zu), }\n",
                     f8 ? 8 : 4, T, T);
    FILE *f = fopen(path_of(name), "wb");
    if (!f)
        return KVE_EIO;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)n, 0};
    fwrite(pre, 1, 10, f);
    fwrite(header, 1, (size_t)n, f);
    for (size_t i = 0; i < T * T; i++) {
        double v = (i % T) <= (i / T) ? m[i] : 0.0;
        unsigned char b[8];
        uint64_t bits;
        if (f8) {
            memcpy(&bits, &v, 8);
        } else {
            float x = (float)v;
            uint32_t b32;
            memcpy(&b32, &x, 4);
            bits = b32;
        }
        for (int k = 0; k < (f8 ? 8 : 4); k++)
            b[k] = (unsigned char)(bits >> (8 * k));
        fwrite(b, 1, f8 ? 8 : 4, f);
    }
    if (fclose(f) != 0)
        return KVE_EIO;
    return kve_trace_open(path_of(name), NULL, tr);
}

/* Random distributions over [0, t] per row, with some rows heavy on a few
 * keys so that scores separate. */
static double *random_matrix(size_t T, int f8, uint64_t seed)
{
    double *m = calloc(T * T, sizeof *m);
    if (!m)
        abort();
    uint64_t x = seed;
    for (size_t t = 0; t < T; t++) {
        double *row = m + t * T, s = 0;
        for (size_t i = 0; i <= t; i++) {
            row[i] = (double)(lcg(&x) % 1000 + 1) / 1000.0;
            if (lcg(&x) % 17 == 0)
                row[i] *= 40;
            s += row[i];
        }
        for (size_t i = 0; i <= t; i++)
            row[i] = f8 ? row[i] / s : (double)(float)(row[i] / s);
    }
    return m;
}

static int same_result(const kve_eval_result *a, const kve_eval_result *b)
{
    return strcmp(a->spec, b->spec) == 0 && a->budget == b->budget && a->steps == b->steps &&
           a->scored_steps == b->scored_steps && a->retained_mass == b->retained_mass &&
           a->top32_recall == b->top32_recall && a->min_retained_mass == b->min_retained_mass &&
           a->state_bytes == b->state_bytes && a->topk == b->topk &&
           a->topk_recall == b->topk_recall;
}

/* ---- metric definitions, by hand ---- */

/* A [T, T] float64 trace whose row t is uniform over [0, t]. */
static kve_status open_uniform(const char *name, size_t T, kve_trace **tr)
{
    double *m = calloc(T * T, sizeof *m);
    if (!m)
        return KVE_ENOMEM;
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i <= t; i++)
            m[t * T + i] = 1.0 / (double)(t + 1);
    kve_status st = open_matrix(name, m, T, 1, tr);
    free(m);
    return st;
}

/* Row t uniform over [0, t], T = 40. window:budget=8 keeps t-8..t-1, so the
 * retained mass is 9/(t+1); streaming:budget=8,sinks=4 keeps 0..3 and
 * t-4..t-1, the same mass. Every key ties, so top-32 is keys
 * 0..min(32,t)-1: window recalls 8/t up to t = 32, then (40-t)/32;
 * streaming recalls 8/t, then (4 + max(0, 36-t))/32. */
static void test_metrics_uniform_rows(void)
{
    enum { T = 40 };
    kve_trace *tr = NULL;
    ASSERT_OK(open_uniform("uniform.npy", T, &tr));
    kve_eval_job jobs[] = {{"window", 8}, {"streaming:sinks=4", 8}, {"full", 8}, {"window", 40}};
    kve_eval_result r[4];
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, 4, EVAL_OPTS(1, NULL, NULL), r, NULL));
    double mass = 0, rw = 0, rs = 0;
    for (size_t t = 9; t < T; t++) {
        mass += 9.0 / (double)(t + 1);
        rw += t <= 32 ? 8.0 / (double)t : (40.0 - (double)t) / 32.0;
        rs += t <= 32 ? 8.0 / (double)t : (4.0 + (t < 36 ? 36.0 - (double)t : 0.0)) / 32.0;
    }
    ASSERT_STR_EQ(r[0].spec, "window:budget=8");
    ASSERT_EQ(r[0].budget, 8);
    ASSERT_EQ(r[0].steps, T);
    ASSERT_EQ(r[0].scored_steps, T - 9);
    ASSERT_NEAR(r[0].retained_mass, mass / 31, 1e-12);
    ASSERT_NEAR(r[0].top32_recall, rw / 31, 1e-12);
    ASSERT_NEAR(r[0].min_retained_mass, 9.0 / 40.0, 1e-12);
    ASSERT_STR_EQ(r[1].spec, "streaming:budget=8,sinks=4");
    ASSERT_NEAR(r[1].retained_mass, mass / 31, 1e-12);
    ASSERT_NEAR(r[1].top32_recall, rs / 31, 1e-12);
    /* full keeps everything: mass 1, recall 1; its budget is only a size. */
    ASSERT_NEAR(r[2].retained_mass, 1.0, 1e-12);
    ASSERT_NEAR(r[2].min_retained_mass, 1.0, 1e-12);
    ASSERT_TRUE(r[2].top32_recall == 1.0);
    ASSERT_EQ(r[2].scored_steps, T - 9);
    /* No step beyond the budget: no metric, NaN rather than a perfect 1. */
    ASSERT_EQ(r[3].scored_steps, 0);
    ASSERT_EQ(r[3].steps, T);
    ASSERT_TRUE(isnan(r[3].retained_mass) && isnan(r[3].top32_recall) &&
                isnan(r[3].topk_recall) && isnan(r[3].min_retained_mass));
    ASSERT_TRUE(r[3].state_bytes > 0);
    /* kve_eval is top-32: topk_recall is the same figure. */
    for (int j = 0; j < 3; j++) {
        ASSERT_EQ(r[j].topk, 32);
        ASSERT_TRUE(r[j].topk_recall == r[j].top32_recall);
    }
    kve_trace_free(tr);
}

/* The same rows at k = 8: every key ties, so the top-8 of row t >= 8 is keys
 * 0..7. window:budget=8 keeps t-8..t-1: 16 - t of them for t < 16, none
 * after; streaming:budget=8,sinks=4 keeps 0..3 and t-4..t-1: 4 + max(0,
 * 12 - t). k larger than T takes every earlier key: full recalls 1. Top-32
 * is unchanged by the option. k = 32 given explicitly equals the defaults. */
static void test_topk_option(void)
{
    enum { T = 40 };
    kve_trace *tr = NULL;
    ASSERT_OK(open_uniform("uniform_k.npy", T, &tr));
    kve_eval_job jobs[] = {{"window", 8}, {"streaming:sinks=4", 8}, {"full", 8}};
    kve_eval_result r[3], r32[3], plain[3];
    kve_eval_options o = kve_eval_default_options();
    ASSERT_EQ(o.topk, 32);
    ASSERT_U64_EQ(o.seed, 0);
    ASSERT_TRUE(o.on_step == NULL && o.user == NULL);
    o.topk = 8;
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, 3, &o, r, NULL));
    double rw = 0, rs = 0;
    for (size_t t = 9; t < T; t++) {
        rw += t < 16 ? (16.0 - (double)t) / 8.0 : 0.0;
        rs += (4.0 + (t < 12 ? 12.0 - (double)t : 0.0)) / 8.0;
    }
    ASSERT_EQ(r[0].topk, 8);
    ASSERT_NEAR(r[0].topk_recall, rw / 31, 1e-12);
    ASSERT_NEAR(r[1].topk_recall, rs / 31, 1e-12);
    ASSERT_TRUE(r[2].topk_recall == 1.0);
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, 3, EVAL_OPTS(0, NULL, NULL), plain, NULL));
    for (int j = 0; j < 3; j++) {
        ASSERT_TRUE(r[j].top32_recall == plain[j].top32_recall);
        ASSERT_TRUE(r[j].retained_mass == plain[j].retained_mass);
    }
    o.topk = 1000; /* more than T: the top set is every earlier key */
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, 3, &o, r, NULL));
    ASSERT_TRUE(r[2].topk_recall == 1.0);
    double all = 0; /* window keeps 8 of the t earlier keys */
    for (size_t t = 9; t < T; t++)
        all += 8.0 / (double)t;
    ASSERT_NEAR(r[0].topk_recall, all / 31, 1e-12);
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, 3, NULL, r32, NULL)); /* NULL: the defaults */
    for (int j = 0; j < 3; j++) {
        ASSERT_TRUE(same_result(&r32[j], &plain[j]));
        ASSERT_TRUE(r32[j].topk_recall == plain[j].topk_recall && r32[j].topk == 32);
    }
    kve_trace_free(tr);
}

/* The own key counts as retained: a row with all its mass on the diagonal
 * retains 1 whatever is kept; recall then only counts kept keys among the
 * (all-zero) top-32, lowest positions first. */
static void test_metrics_diagonal_rows(void)
{
    enum { T = 12 };
    double m[T * T] = {0};
    for (size_t t = 0; t < T; t++)
        m[t * T + t] = 1.0;
    kve_trace *tr = NULL;
    ASSERT_OK(open_matrix("diag.npy", m, T, 0, &tr));
    kve_eval_job jobs[] = {{"window", 3}, {"streaming:sinks=1", 3}};
    kve_eval_result r[2];
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, 2, EVAL_OPTS(1, NULL, NULL), r, NULL));
    ASSERT_TRUE(r[0].retained_mass == 1.0 && r[0].min_retained_mass == 1.0);
    /* window keeps t-3..t-1 of top = 0..t-1 (t < 32): recall 3/t; streaming
     * keeps 0, t-2, t-1: also 3/t. */
    double want = 0;
    for (size_t t = 4; t < T; t++)
        want += 3.0 / (double)t;
    ASSERT_NEAR(r[0].top32_recall, want / (T - 4), 1e-12);
    ASSERT_NEAR(r[1].top32_recall, want / (T - 4), 1e-12);
    kve_trace_free(tr);
}

/* ---- what the policy receives ---- */

typedef struct attn_check {
    kve_trace *tr; /* an independent handle on the same file */
    double *row;
    size_t calls, nulls, empties, bad;
} attn_check;

static void check_attn(void *user, size_t job, int32_t pos, const int32_t *kept,
                       const float *attn, size_t n)
{
    attn_check *c = user;
    (void)job;
    c->calls++;
    if (kve_trace_row(c->tr, 0, (size_t)pos, c->row, ((size_t)pos) + 1) != KVE_OK) {
        c->bad++;
        return;
    }
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += c->row[kept[i]];
    if (n == 0) {
        c->empties++;
        c->bad += attn == NULL || pos != 0;
        return;
    }
    if (sum == 0) {
        c->nulls++;
        c->bad += attn != NULL;
        return;
    }
    if (!attn) {
        c->bad++;
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (attn[i] != (float)(c->row[kept[i]] / sum)) {
            fprintf(stderr, "pos %d slot %zu: got %.9g want %.9g\n", pos, i, (double)attn[i],
                    (double)(float)(c->row[kept[i]] / sum));
            c->bad++;
        }
}

/* Each kept weight divided in double by the kept sum (summed in double in
 * kept order) and rounded to float32; NULL for a zero kept sum; an empty
 * non-NULL vector at t = 0. float64 rows make every rounding matter. */
static void test_renormalisation_exact(void)
{
    enum { T = 160 };
    double *m = random_matrix(T, 1, check_seed);
    /* Rows 50 and 90 put everything on keys window:budget=5 has evicted. */
    for (size_t k = 0; k < 2; k++) {
        size_t t = k ? 90 : 50;
        memset(m + t * T, 0, T * sizeof *m);
        m[t * T + 0] = 0.25;
        m[t * T + t] = 0.75;
    }
    kve_trace *tr = NULL, *tr2 = NULL;
    ASSERT_OK(open_matrix("renorm.npy", m, T, 1, &tr));
    ASSERT_OK(kve_trace_open(path_of("renorm.npy"), NULL, &tr2));
    free(m);
    attn_check c = {tr2, malloc(T * sizeof(double)), 0, 0, 0, 0};
    ASSERT_TRUE(c.row != NULL);
    kve_eval_job jobs[] = {{"window", 5}, {"h2o:recent_window=4", 20}, {"full", 1}};
    kve_eval_result r[3];
    kve__eval_set_attn_hook(check_attn, &c);
    kve_status st = kve_eval(tr, 0, 1, jobs, 3, EVAL_OPTS(1, NULL, NULL), r, NULL);
    kve__eval_set_attn_hook(NULL, NULL);
    ASSERT_OK(st);
    ASSERT_EQ(c.calls, 3 * T);
    ASSERT_EQ(c.empties, 3);
    ASSERT_EQ(c.nulls, 2); /* window at rows 50 and 90 (h2o and full keep key 0) */
    ASSERT_EQ(c.bad, 0);
    free(c.row);
    kve_trace_free(tr2);
    kve_trace_free(tr);
}

/* ---- h2o replay against a naive reference ---- */

typedef struct naive_h2o {
    size_t budget, window, n;
    int32_t pos[512];
    double score[512];
} naive_h2o;

/* Step t on row p (over [0, t]): renormalise as documented, accumulate in
 * double, admit t with score 0, evict the lowest score among all but the
 * newest `window`, ties to the lower position. Returns the victim or -1. */
static int32_t naive_step(naive_h2o *h, const double *p, size_t t)
{
    double sum = 0;
    for (size_t i = 0; i < h->n; i++)
        sum += p[h->pos[i]];
    if (sum > 0)
        for (size_t i = 0; i < h->n; i++)
            h->score[i] += (double)(float)(p[h->pos[i]] / sum);
    h->pos[h->n] = (int32_t)t;
    h->score[h->n] = 0;
    h->n++;
    if (h->n <= h->budget)
        return -1;
    size_t best = 0;
    for (size_t i = 1; i < h->n - h->window; i++)
        if (h->score[i] < h->score[best])
            best = i;
    int32_t v = h->pos[best];
    memmove(h->pos + best, h->pos + best + 1, (h->n - best - 1) * sizeof h->pos[0]);
    memmove(h->score + best, h->score + best + 1, (h->n - best - 1) * sizeof h->score[0]);
    h->n--;
    return v;
}

typedef struct replay {
    kve_trace *tr;
    double *row;
    naive_h2o ref;
    size_t steps, mismatches;
    double mass_sum, recall_sum;
    size_t scored;
} replay;

/* The reference metrics of the kept set before step t. */
static void naive_metrics(replay *r, size_t t)
{
    const double *p = r->row;
    double kept = 0;
    for (size_t i = 0; i < r->ref.n; i++)
        kept += p[r->ref.pos[i]];
    /* top-32 by selection: repeatedly the largest remaining, lowest first. */
    size_t k = t < 32 ? t : 32, hits = 0;
    unsigned char taken[512] = {0};
    for (size_t j = 0; j < k; j++) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < t; i++)
            if (!taken[i] && (best == SIZE_MAX || p[i] > p[best]))
                best = i;
        taken[best] = 1;
        for (size_t i = 0; i < r->ref.n; i++)
            hits += (size_t)r->ref.pos[i] == best;
    }
    if (t > r->ref.budget) {
        double total = 0; /* the row's own mass: what a kept fraction is of */
        for (size_t i = 0; i <= t; i++)
            total += p[i];
        r->mass_sum += (p[t] + kept) / total;
        r->recall_sum += (double)hits / (double)k;
        r->scored++;
    }
}

static int on_replay_step(void *user, size_t job, int32_t pos, const int32_t *victims, size_t nv)
{
    replay *r = user;
    (void)job;
    size_t t = (size_t)pos;
    if (kve_trace_row(r->tr, 0, t, r->row, t + 1) != KVE_OK || t != r->steps) {
        r->mismatches++;
        return 1;
    }
    naive_metrics(r, t);
    int32_t v = naive_step(&r->ref, r->row, t);
    if ((v < 0 && nv != 0) || (v >= 0 && (nv != 1 || victims[0] != v))) {
        fprintf(stderr, "step %zu: library evicted %zu (%d), reference %d\n", t, nv,
                nv ? victims[0] : -1, v);
        r->mismatches++;
    }
    r->steps++;
    return 0;
}

static void test_h2o_replay_matches_reference(void)
{
    enum { T = 420 };
    double *m = random_matrix(T, 0, check_seed + 1);
    kve_trace *tr = NULL, *tr2 = NULL;
    ASSERT_OK(open_matrix("replay.npy", m, T, 0, &tr));
    ASSERT_OK(kve_trace_open(path_of("replay.npy"), NULL, &tr2));
    free(m);
    replay r = {tr2, malloc(T * sizeof(double)), {40, 8, 0, {0}, {0}}, 0, 0, 0, 0, 0};
    ASSERT_TRUE(r.row != NULL);
    kve_eval_job job = {"h2o:budget=40,recent_window=8", 0};
    kve_eval_result res;
    ASSERT_OK(kve_eval(tr, 0, 1, &job, 1, EVAL_OPTS(1, on_replay_step, &r), &res, NULL));
    ASSERT_EQ(r.steps, T);
    ASSERT_EQ(r.mismatches, 0);
    ASSERT_EQ(res.scored_steps, r.scored);
    ASSERT_NEAR(res.retained_mass, r.mass_sum / (double)r.scored, 1e-12);
    ASSERT_NEAR(res.top32_recall, r.recall_sum / (double)r.scored, 1e-12);
    free(r.row);
    kve_trace_free(tr2);
    kve_trace_free(tr);
}

/* ---- determinism ---- */

static const kve_eval_job every_policy[] = {
    {"full", 0},         {"window", 0},    {"streaming", 0}, {"random", 0},   {"h2o", 0},
    {"scissorhands", 0}, {"tova", 0},      {"h2o_decay", 0}, {"h2o_mean", 0},
};
enum { N_EVERY = sizeof every_policy / sizeof every_policy[0] };

static void test_determinism_and_independence(void)
{
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=900,seed=5", NULL, &tr));
    kve_eval_job jobs[N_EVERY];
    for (size_t i = 0; i < N_EVERY; i++) {
        jobs[i] = every_policy[i];
        jobs[i].budget = 100;
    }
    kve_eval_result a[N_EVERY], b[N_EVERY], alone;
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, N_EVERY, EVAL_OPTS(42, NULL, NULL), a, NULL));
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, N_EVERY, EVAL_OPTS(42, NULL, NULL), b, NULL));
    for (size_t i = 0; i < N_EVERY; i++) {
        ASSERT_TRUE(same_result(&a[i], &b[i]));
        ASSERT_TRUE(a[i].ns_per_step >= 0 && isfinite(a[i].ns_per_step));
        ASSERT_EQ(a[i].budget, 100);
        ASSERT_CONTAINS(a[i].spec, "budget=100");
        /* A job's result does not depend on its neighbours. */
        ASSERT_OK(kve_eval(tr, 0, 1, &jobs[i], 1, EVAL_OPTS(42, NULL, NULL), &alone, NULL));
        ASSERT_TRUE(same_result(&a[i], &alone));
    }
    /* The seed reaches random: another seed, another result. */
    ASSERT_OK(kve_eval(tr, 0, 1, &jobs[3], 1, EVAL_OPTS(43, NULL, NULL), &alone, NULL));
    ASSERT_TRUE(alone.retained_mass != a[3].retained_mass);
    /* Budget 0 keeps the spec's. */
    kve_eval_job own = {"h2o:budget=77", 0};
    ASSERT_OK(kve_eval(tr, 0, 1, &own, 1, EVAL_OPTS(42, NULL, NULL), &alone, NULL));
    ASSERT_EQ(alone.budget, 77);
    ASSERT_EQ(alone.scored_steps, 900 - 78);
    kve_trace_free(tr);
}

/* `kvevict trace -o f.npy` then eval: identical to the canonical source. */
static void test_written_trace_evaluates_identically(void)
{
    kve_trace *c = NULL, *f = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=1100", NULL, &c));
    ASSERT_OK(kve_trace_write_npy(c, 0, path_of("canon.npy")));
    ASSERT_OK(kve_trace_open(path_of("canon.npy"), NULL, &f));
    kve_eval_job jobs[N_EVERY];
    for (size_t i = 0; i < N_EVERY; i++) {
        jobs[i] = every_policy[i];
        jobs[i].budget = 128;
    }
    kve_eval_result a[N_EVERY], b[N_EVERY];
    ASSERT_OK(kve_eval(c, 0, 1, jobs, N_EVERY, EVAL_OPTS(7, NULL, NULL), a, NULL));
    ASSERT_OK(kve_eval(f, 0, 1, jobs, N_EVERY, EVAL_OPTS(7, NULL, NULL), b, NULL));
    for (size_t i = 0; i < N_EVERY; i++)
        if (!same_result(&a[i], &b[i]))
            CHECK_FAIL_AT("%s: canonical %.17g/%.17g, .npy %.17g/%.17g", a[i].spec,
                          a[i].retained_mass, a[i].top32_recall, b[i].retained_mass,
                          b[i].top32_recall);
    kve_trace_free(f);
    kve_trace_free(c);
}

/* ---- callback and early stop ---- */

typedef struct stopper {
    size_t calls, stop_at, bad;
    size_t budget;
} stopper;

static int stop_cb(void *user, size_t job, int32_t pos, const int32_t *victims, size_t nv)
{
    stopper *s = user;
    s->calls++;
    /* window:budget=B evicts exactly pos - B from step B on. */
    if (job == 0) {
        if ((size_t)pos >= s->budget)
            s->bad += nv != 1 || victims[0] != pos - (int32_t)s->budget;
        else
            s->bad += nv != 0;
    }
    for (size_t i = 1; i < nv; i++)
        s->bad += victims[i - 1] >= victims[i];
    return job == 0 && (size_t)pos == s->stop_at;
}

static void test_early_stop(void)
{
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=200", NULL, &tr));
    kve_eval_job jobs[] = {{"window:budget=6", 0}, {"h2o:budget=6,recent_window=2", 0},
                           {"full", 0}};
    kve_eval_result r[3];
    stopper s = {0, 10, 0, 6};
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, 3, EVAL_OPTS(1, stop_cb, &s), r, NULL));
    ASSERT_EQ(s.calls, 10 * 3 + 1);
    ASSERT_EQ(s.bad, 0);
    for (int j = 0; j < 3; j++)
        ASSERT_EQ(r[j].steps, 11); /* the step in progress is finished by every job */
    ASSERT_EQ(r[0].scored_steps, 4);
    kve_trace_free(tr);
}

/* ---- heads and I/O ---- */

/* Head h of an [H, T, T] file evaluates exactly like a [T, T] file holding
 * that head alone; a file truncated after opening gives KVE_EIO and leaves
 * the results untouched. */
static void test_heads_and_io(void)
{
    enum { T = 90, H = 3 };
    double *m[H];
    for (size_t h = 0; h < H; h++)
        m[h] = random_matrix(T, 0, check_seed + 10 + h);
    FILE *f = fopen(path_of("heads.npy"), "wb");
    ASSERT_TRUE(f != NULL);
    const char header[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 90, 90), }\n";
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, sizeof header - 1, 0};
    fwrite(pre, 1, 10, f);
    fwrite(header, 1, sizeof header - 1, f);
    for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < T * T; i++) {
            float x = (i % T) <= (i / T) ? (float)m[h][i] : 0.0f;
            uint32_t bits;
            memcpy(&bits, &x, 4);
            unsigned char b[4] = {(unsigned char)bits, (unsigned char)(bits >> 8),
                                  (unsigned char)(bits >> 16), (unsigned char)(bits >> 24)};
            fwrite(b, 1, 4, f);
        }
    ASSERT_TRUE(fclose(f) == 0);
    kve_trace *all = NULL;
    ASSERT_OK(kve_trace_open(path_of("heads.npy"), NULL, &all));
    ASSERT_EQ(kve_trace_heads(all), H);
    kve_eval_job jobs[] = {{"h2o:recent_window=3", 12}, {"tova", 12}};
    for (size_t h = 0; h < H; h++) {
        kve_trace *one = NULL;
        ASSERT_OK(open_matrix("one.npy", m[h], T, 0, &one));
        kve_eval_result a[2], b[2];
        ASSERT_OK(kve_eval(all, h, 1, jobs, 2, EVAL_OPTS(1, NULL, NULL), a, NULL));
        ASSERT_OK(kve_eval(one, 0, 1, jobs, 2, EVAL_OPTS(1, NULL, NULL), b, NULL));
        ASSERT_TRUE(same_result(&a[0], &b[0]) && same_result(&a[1], &b[1]));
        kve_trace_free(one);
    }
    ASSERT_TRUE(truncate(path_of("heads.npy"), 200) == 0);
    kve_eval_result r[2], untouched;
    memset(r, 0x5a, sizeof r);
    memset(&untouched, 0x5a, sizeof untouched);
    ASSERT_STATUS(kve_eval(all, 1, 1, jobs, 2, EVAL_OPTS(1, NULL, NULL), r, NULL), KVE_EIO);
    ASSERT_CONTAINS(kve_last_error(), "heads.npy");
    ASSERT_TRUE(memcmp(&r[0], &untouched, sizeof untouched) == 0);
    kve_trace_free(all);
    for (size_t h = 0; h < H; h++)
        free(m[h]);
}

/* ---- refusals ---- */

static void test_refusals(void)
{
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=50", NULL, &tr));
    kve_eval_job ok = {"h2o", 40};
    kve_eval_result r[2], untouched;
    memset(r, 0xab, sizeof r);
    memset(&untouched, 0xab, sizeof untouched);
    ASSERT_STATUS(kve_eval(NULL, 0, 1, &ok, 1, EVAL_OPTS(1, NULL, NULL), r, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_eval(tr, 0, 1, NULL, 1, EVAL_OPTS(1, NULL, NULL), r, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_eval(tr, 0, 1, &ok, 1, EVAL_OPTS(1, NULL, NULL), NULL, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_eval(tr, 0, 1, &ok, 0, EVAL_OPTS(1, NULL, NULL), r, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "n_jobs");
    ASSERT_STATUS(kve_eval(tr, 1, 1, &ok, 1, EVAL_OPTS(1, NULL, NULL), r, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 1");
    kve_eval_job bad_name[] = {{"h2o", 40}, {"nope:budget=3", 0}};
    ASSERT_STATUS(kve_eval(tr, 0, 1, bad_name, 2, EVAL_OPTS(1, NULL, NULL), r, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "job 1 (\"nope:budget=3\")");
    kve_eval_job bad_budget[] = {{"window", 16777217}};
    ASSERT_STATUS(kve_eval(tr, 0, 1, bad_budget, 1, EVAL_OPTS(1, NULL, NULL), r, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "budget");
    kve_eval_job contradiction[] = {{"h2o:recent_window=32", 16}};
    ASSERT_STATUS(kve_eval(tr, 0, 1, contradiction, 1, EVAL_OPTS(1, NULL, NULL), r, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "recent_window");
    kve_eval_job null_spec[] = {{NULL, 3}};
    ASSERT_STATUS(kve_eval(tr, 0, 1, null_spec, 1, EVAL_OPTS(1, NULL, NULL), r, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "job 0");
    kve_eval_options o = kve_eval_default_options();
    o.topk = 0;
    ASSERT_STATUS(kve_eval(tr, 0, 1, &ok, 1, &o, r, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "topk 0");
    o.topk = (size_t)KVE_MAX_BUDGET + 1;
    ASSERT_STATUS(kve_eval(tr, 0, 1, &ok, 1, &o, r, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "topk");
    o.topk = KVE_MAX_BUDGET; /* the largest k is accepted (and costs only min(k, T)) */
    kve_eval_result big;
    ASSERT_OK(kve_eval(tr, 0, 1, &ok, 1, &o, &big, NULL));
    ASSERT_EQ(big.topk, KVE_MAX_BUDGET);
    ASSERT_TRUE(memcmp(&r[0], &untouched, sizeof untouched) == 0);
    ASSERT_TRUE(memcmp(&r[1], &untouched, sizeof untouched) == 0);
    kve_trace_free(tr);
}

static void test_alloc_failure(void)
{
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=60", NULL, &tr));
    kve_eval_job jobs[] = {{"h2o:recent_window=2", 8}, {"random", 8}, {"full", 8}};
    kve_eval_result r[3], untouched;
    memset(&untouched, 0xcd, sizeof untouched);
    talloc ta;
    talloc_init(&ta);
    for (size_t k = 0;; k++) {
        memset(r, 0xcd, sizeof r);
        kve_eval_options o = kve_eval_default_options();
        o.allocator = &ta.a;
        o.seed = 1;
        o.topk = 5; /* a heap of its own, allocated */
        talloc_fail_after(&ta, k);
        kve_status st = kve_eval(tr, 0, 1, jobs, 3, &o, r, NULL);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK)
            break;
        if (st != KVE_ENOMEM)
            CHECK_FAIL_AT("k = %zu: %s: %s", k, kve_status_name(st), kve_last_error());
        ASSERT_TRUE(memcmp(&r[0], &untouched, sizeof untouched) == 0);
        ASSERT_EQ(ta.blocks, 0);
        ASSERT_TRUE(k < 100);
    }
    ASSERT_EQ(r[2].steps, 60);
    talloc_check_empty(&ta);
    kve_trace_free(tr);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    if (tmpdir_make("kve_test_eval") != 0)
        return 1;
    RUN(test_metrics_uniform_rows);
    RUN(test_metrics_diagonal_rows);
    RUN(test_topk_option);
    RUN(test_renormalisation_exact);
    RUN(test_h2o_replay_matches_reference);
    RUN(test_determinism_and_independence);
    RUN(test_written_trace_evaluates_identically);
    RUN(test_early_stop);
    RUN(test_heads_and_io);
    RUN(test_refusals);
    RUN(test_alloc_failure);
    remove_dir();
    return CHECK_DONE();
}
