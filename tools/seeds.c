/* SPDX-License-Identifier: MIT */
/*
 * seeds.c - the claims of the H2O page checked on several seeds of a
 * canonical trace (`kvevict bench --seeds N`, the docs' `seeds` block).
 *
 * Seed i (i = 0 .. n-1) is the given canonical trace with its `seed` key
 * replaced by first + i, `first` being the trace's own seed (1 for the
 * default trace): the default seed and the n - 1 that follow. Each seed is
 * one evalset holding only the specs the claims need, evaluated in one
 * lockstep pass. Seeds are independent, so they run on up to one thread
 * per online CPU (SEEDS_THREADS at most), each taking the next seed not yet
 * taken; results land in the seed's own slot, so they do not depend on the
 * number of threads or the order the seeds finish in. Cost: about n times
 * the claims' share of `kvevict bench`, divided among the threads.
 *
 * Verdict over the seeds, fixed before any figure was seen: a claim is
 * "reproduced" when it holds on the first seed and on at least half of the
 * others; an observation that holds on the default seed but fails on most
 * others is "not reproduced". Claim 6 on the calibrated trace is the fit
 * itself: its verdict is "fitted", and the other seeds show how far the fit
 * carries.
 */
#define _POSIX_C_SOURCE 200809L
#include "calibrate.h"
#include "cli.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SEEDS_THREADS = 8 };

/* Short names of the claims for the tables (obs_claims has them in full). */
static const char *const obs_short[N_OBS] = {
    "h2o window 32 retains less than streaming @256",
    "h2o window 64 beats streaming on both metrics @256",
    "the window's gain saturates at exactly 64",
    "h2o's top-32 recall beats window, streaming, random @256, @512",
    "h2o and scissorhands within 0.01 @256, @512",
    "streaming retains 0.7367 @256",
};

/* `base` (a canonical source with ",seed=N," spelled out) with seed s. */
static char *with_seed(const char *base, uint64_t s)
{
    const char *at = strstr(base, ",seed=");
    if (!at)
        die_input("internal error: no seed in '%s'", base);
    const char *rest = at + 6 + strspn(at + 6, "0123456789");
    size_t head = (size_t)(at - base), len = head + strlen(rest) + 32;
    char *out = xmalloc(len);
    snprintf(out, len, "%.*s,seed=%llu%s", (int)head, base, (unsigned long long)s, rest);
    return out;
}

/* The work the threads share: the next seed not yet taken. */
typedef struct seeds_work {
    seeds_run *r;
    cli_args args;
    size_t next;
    pthread_mutex_t lock;
} seeds_work;

/* Seed i of r into its own slots. */
static void one_seed(seeds_run *r, size_t i, const cli_args *a)
{
    char *spec = with_seed(r->base, r->first + i);
    evalset es;
    evalset_init(&es);
    es.quiet = 1; /* no progress line from a worker thread */
    judge_observations(NULL, &es, 0, 0, r->outcome[i]); /* collect */
    kve_trace *tr = NULL;
    kve_status st = kve_trace_open(spec, NULL, &tr);
    if (st != KVE_OK)
        die_status(st, spec);
    evalset_run(&es, tr, a, 0);
    judge_observations(NULL, &es, 0, i == 0 && r->calibrated, r->outcome[i]);
    r->streaming[i] = evalset_get(&es, "streaming", 256)->retained_mass;
    evalset_free(&es);
    kve_trace_free(tr);
    free(spec);
}

static void *seeds_worker(void *arg)
{
    seeds_work *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->lock);
        size_t i = w->next++;
        pthread_mutex_unlock(&w->lock);
        if (i >= w->r->n)
            return NULL;
        one_seed(w->r, i, &w->args);
    }
}

void seeds_eval(seeds_run *r, const char *src, size_t n, const cli_args *a)
{
    memset(r, 0, sizeof *r);
    if (strncmp(src, "canonical", 9) != 0 || (src[9] != '\0' && src[9] != ':'))
        die_usage("--seeds: the trace must be canonical (its seed is what varies), not '%s'",
                  src);
    kve_trace *tr = NULL;
    kve_status st = kve_trace_open(src, NULL, &tr);
    if (st != KVE_OK)
        die_status(st, "--trace");
    r->base = xstrdup(kve_trace_source(tr));
    size_t steps = kve_trace_steps(tr);
    kve_trace_free(tr);
    for (size_t b = 256; b <= 512; b += 256) /* the workers are quiet: warn here, once */
        if (b + 1 >= steps)
            warn("no step is scored at budget %zu: the trace has %zu steps and a step t counts "
                 "only when t > budget; the claims that need it are not judged",
                 b, steps);
    const char *at = strstr(r->base, ",seed=");
    r->first = at ? strtoull(at + 6, NULL, 10) : 0;
    if (r->first > UINT64_MAX - (n - 1))
        die_usage("--seeds: seeds %llu to %llu + %zu do not fit in 64 bits",
                  (unsigned long long)r->first, (unsigned long long)r->first, n - 1);
    r->n = n;
    r->policy_seed = a->seed;
    r->calibrated = is_calibrated_trace(r->base);
    r->outcome = xcalloc(n, sizeof *r->outcome);
    r->streaming = xcalloc(n, sizeof *r->streaming);
    seeds_work w = {r, *a, 0, PTHREAD_MUTEX_INITIALIZER};
    w.args.topk = 32;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n_threads = cpus > 1 ? (size_t)cpus : 1;
    n_threads = n_threads < n ? n_threads : n;
    n_threads = n_threads < SEEDS_THREADS ? n_threads : SEEDS_THREADS;
    pthread_t th[SEEDS_THREADS];
    size_t started = 0;
    /* cppcheck-suppress knownConditionTrueFalse ; cppcheck 2.10 reads min(n, enum) as < 1 */
    for (size_t k = 1; k < n_threads; k++, started++)
        if (pthread_create(&th[k - 1], NULL, seeds_worker, &w) != 0)
            break; /* fewer threads: the others take the work */
    seeds_worker(&w);
    for (size_t k = 0; k < started; k++)
        pthread_join(th[k], NULL);
}

void seeds_free(seeds_run *r)
{
    free(r->base);
    free(r->outcome);
    free(r->streaming);
    memset(r, 0, sizeof *r);
}

static const char *word(int outcome)
{
    return outcome == OBS_HOLDS ? "holds" : outcome == OBS_FAILS ? "fails" : "not judged";
}

void render_seeds(FILE *f, const seeds_run *r, tfmt fmt)
{
    int md = fmt == FMT_MD;
    unsigned long long first = r->first, last = r->first + (r->n - 1);
    if (fmt == FMT_CSV || fmt == FMT_JSON) {
        /* The raw data: one row per seed. */
        static const col cols[] = {
            {"trace", KEY_TRACE, COL_ALL}, {"trace seed", "trace_seed", COL_ALL},
            {"seed", KEY_SEED, COL_ALL},   {"(1)", "claim_1", COL_ALL},
            {"(2)", "claim_2", COL_ALL},   {"(3)", "claim_3", COL_ALL},
            {"(4)", "claim_4", COL_ALL},   {"(5)", "claim_5", COL_ALL},
            {"(6)", "claim_6", COL_ALL},   {"streaming mass @256", "streaming_retained_mass_256", COL_ALL},
        };
        table t;
        table_init(&t, cols, sizeof cols / sizeof cols[0]);
        for (size_t i = 0; i < r->n; i++) {
            char *spec = with_seed(r->base, r->first + i);
            table_str(&t, spec);
            free(spec);
            table_uint(&t, r->first + i);
            table_uint(&t, r->policy_seed);
            for (int k = 0; k < N_OBS; k++)
                table_str(&t, word(r->outcome[i][k]));
            table_real(&t, r->streaming[i], "%.4f");
        }
        table_print(&t, f, fmt);
        table_free(&t);
        return;
    }
    if (md)
        fprintf(f, "Trace `%s` with seeds %llu to %llu (%zu seeds), policy seed %llu.\n\n",
                r->base, first, last, r->n, (unsigned long long)r->policy_seed);
    else
        fprintf(f, "kvevict bench --seeds %zu: trace %s\nwith seeds %llu to %llu, policy seed %llu\n\n",
                r->n, r->base, first, last, (unsigned long long)r->policy_seed);
    fprintf(f,
            "A claim is reproduced when it holds on seed %llu and on at least half of the other "
            "seeds;%sone that holds on seed %llu but fails on most others is not reproduced.\n\n",
            first, md ? " " : "\n", first);
    calib_seeds_note(f, r->calibrated, md); /* calibrate.c: version 3's targets */

    static const col sum_cols[] = {
        {"claim", "claim", COL_ALL | COL_LEFT},
        {"seed 1", "first_seed", COL_ALL},
        {"holds on", "holds", COL_ALL},
        {"verdict", "verdict", COL_ALL | COL_LEFT},
    };
    col sc[4];
    memcpy(sc, sum_cols, sizeof sc);
    char first_head[40];
    snprintf(first_head, sizeof first_head, "seed %llu", first);
    sc[1].head = first_head;
    table t;
    table_init(&t, sc, 4);
    for (int k = 0; k < N_OBS; k++) {
        size_t holds = 0, others = 0, judged = 1;
        for (size_t i = 0; i < r->n; i++) {
            holds += r->outcome[i][k] == OBS_HOLDS;
            others += i > 0 && r->outcome[i][k] == OBS_HOLDS;
            judged &= r->outcome[i][k] != OBS_NOT_JUDGED;
        }
        int fitted = k == 5 && r->calibrated;
        table_fmt(&t, "(%d) %s", k + 1, obs_short[k]);
        table_str(&t, fitted && r->outcome[0][k] == OBS_HOLDS ? "fitted" : word(r->outcome[0][k]));
        table_fmt(&t, "%zu of %zu", holds, r->n);
        if (!judged) {
            table_str(&t, "not judged");
        } else if (fitted) {
            double lo = INFINITY, hi = -INFINITY;
            for (size_t i = 1; i < r->n; i++) {
                lo = r->streaming[i] < lo ? r->streaming[i] : lo;
                hi = r->streaming[i] > hi ? r->streaming[i] : hi;
            }
            if (r->n > 1)
                table_fmt(&t, "fitted on seed %llu; %.4f to %.4f on the others", first, lo, hi);
            else
                table_fmt(&t, "fitted on seed %llu", first);
        } else {
            int ok = r->outcome[0][k] == OBS_HOLDS && 2 * others >= r->n - 1;
            table_str(&t, ok ? "reproduced" : "not reproduced");
        }
    }
    table_print(&t, f, fmt);
    table_free(&t);

    fprintf(f, "\n");
    static const col seed_cols[] = {
        {"trace seed", "trace_seed", COL_ALL}, {"(1)", "claim_1", COL_ALL},
        {"(2)", "claim_2", COL_ALL},           {"(3)", "claim_3", COL_ALL},
        {"(4)", "claim_4", COL_ALL},           {"(5)", "claim_5", COL_ALL},
        {"(6)", "claim_6", COL_ALL},           {"streaming mass @256", "streaming", COL_ALL},
    };
    table_init(&t, seed_cols, sizeof seed_cols / sizeof seed_cols[0]);
    for (size_t i = 0; i < r->n; i++) {
        table_uint(&t, r->first + i);
        for (int k = 0; k < N_OBS; k++) {
            int o = r->outcome[i][k];
            table_str(&t, o == OBS_HOLDS ? "yes" : o == OBS_FAILS ? "no" : "n/a");
        }
        table_real(&t, r->streaming[i], "%.4f");
    }
    table_print(&t, f, fmt);
    table_free(&t);
}
