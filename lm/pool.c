/* SPDX-License-Identifier: MIT */
/*
 * pool.c - the decoder's worker threads: a run calls one function on every
 * part, the caller doing part 0, and returns when every part is done.
 *
 * Invariants: `gen` counts runs; a worker that has seen generation g waits
 * until gen != g, then runs its part of the current job and decrements
 * `pending`; the caller waits until pending is 0, so when lm_pool_run
 * returns no worker touches the job any more. Waiting is polling first
 * (SPIN pauses: a decoder's token is some hundred runs, and waking a
 * sleeping thread cost about 45 microseconds a run on a two-core virtual
 * machine, more than a small product), then sleeping on `go` or `done`
 * under `mu`: gen is raised and `go` broadcast under mu, and the last
 * worker signals `done` under mu, so no wake-up is lost. fn and arg are
 * written before gen's release and read after its acquire. `turn` makes
 * runs from several callers take turns. A job is what the caller passes;
 * the pool allocates nothing after lm_pool_new.
 */
#define _GNU_SOURCE /* sched_getaffinity */
#include "lm.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RELAX() _mm_pause()
#else
#define RELAX() ((void)0)
#endif

enum { SPIN = 4096 }; /* polls before a wait sleeps */

struct lm_pool {
    pthread_mutex_t mu, turn;
    pthread_cond_t go, done;
    size_t parts;      /* threads, the caller included */
    pthread_t *thread; /* (parts - 1) */
    size_t started;    /* workers running */
    lm_job_fn fn;
    void *arg;
    atomic_uint_fast64_t gen;
    atomic_size_t pending; /* workers still in the current run */
    atomic_int stop;
    kve_allocator alloc; /* the pool's two blocks came from it (a copy) */
};

typedef struct worker {
    lm_pool *pool;
    size_t part;
} worker;

/* The workers' own arguments, one per thread, after the pool. */
static worker *workers_of(lm_pool *p)
{
    return (worker *)(void *)(p + 1);
}

/* Whether a new run (or the end) has come, for a worker that saw `seen`. */
static int news(lm_pool *p, uint64_t seen)
{
    return atomic_load_explicit(&p->gen, memory_order_acquire) != seen ||
           atomic_load_explicit(&p->stop, memory_order_relaxed);
}

/* Whether the current run's workers are all done (the caller's wait). */
static int finished(lm_pool *p, uint64_t unused)
{
    (void)unused;
    return atomic_load_explicit(&p->pending, memory_order_acquire) == 0;
}

/* The one way anything here waits: polls ready SPIN times, then sleeps on
 * cv under mu until it holds (whoever makes it hold signals cv under mu). */
static void await(lm_pool *p, int (*ready)(lm_pool *, uint64_t), uint64_t arg,
                  pthread_cond_t *cv)
{
    for (int i = 0; i < SPIN && !ready(p, arg); i++)
        RELAX();
    if (ready(p, arg))
        return;
    pthread_mutex_lock(&p->mu);
    while (!ready(p, arg))
        pthread_cond_wait(cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void *work(void *arg)
{
    const worker *w = arg;
    lm_pool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        await(p, news, seen, &p->go);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed))
            break;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        p->fn(p->arg, w->part, p->parts);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

void lm_pool_free(lm_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < p->started; i++)
        pthread_join(p->thread[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->turn);
    const kve_allocator a = p->alloc;
    lm_free(&a, p->thread);
    lm_free(&a, p);
}

kve_status lm_pool_new(size_t threads, const kve_allocator *allocator, lm_pool **out)
{
    if (!out || threads == 0 || threads > LM_MAX_THREADS)
        return kve_set_error(KVE_EINVAL, "threads: %zu is outside [1, %d]", threads, LM_MAX_THREADS);
    lm_pool *p = lm_calloc(allocator, 1, sizeof *p + threads * sizeof(worker));
    if (!p)
        return kve_set_error(KVE_ENOMEM, "threads: out of memory");
    if (allocator)
        p->alloc = *allocator;
    p->parts = threads;
    p->thread = lm_calloc(allocator, threads, sizeof *p->thread);
    if (!p->thread) {
        lm_free(allocator, p);
        return kve_set_error(KVE_ENOMEM, "threads: out of memory");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->turn, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (size_t i = 0; i + 1 < threads; i++) {
        worker *w = &workers_of(p)[i];
        w->pool = p;
        w->part = i + 1;
        if (pthread_create(&p->thread[i], NULL, work, w) != 0) {
            lm_pool_free(p);
            return kve_set_error(KVE_ENOMEM, "threads: cannot start thread %zu of %zu", i + 2, threads);
        }
        p->started++;
    }
    *out = p;
    return KVE_OK;
}

void lm_pool_run(lm_pool *p, lm_job_fn fn, void *arg)
{
    if (!p || p->parts == 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->turn);
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->parts - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->parts);
    await(p, finished, 0, &p->done);
    pthread_mutex_unlock(&p->turn);
}

size_t lm_cores(void)
{
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return (size_t)CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (size_t)n : 1;
}
