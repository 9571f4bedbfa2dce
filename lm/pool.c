/* SPDX-License-Identifier: MIT */
/*
 * pool.c - the decoder's worker threads: a run calls one function on every
 * part, the caller doing part 0, and returns when every part is done.
 *
 * Invariants: `gen` counts runs; a worker that has seen generation g waits
 * (on `go`) until gen != g, then runs its part of the current job and
 * decrements `pending`; the caller waits (on `done`) until pending is 0, so
 * when lm_pool_run returns no worker touches the job any more. All of it is
 * under `mu`; `turn` makes runs from several callers take turns. A job is
 * what the caller passes; the pool allocates nothing after lm_pool_new.
 */
#define _GNU_SOURCE /* sched_getaffinity */
#include "lm.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

struct lm_pool {
    pthread_mutex_t mu, turn;
    pthread_cond_t go, done;
    size_t parts;      /* threads, the caller included */
    pthread_t *thread; /* (parts - 1) */
    size_t started;    /* workers running */
    lm_job_fn fn;
    void *arg;
    uint64_t gen;
    size_t pending; /* workers still in the current run */
    int stop;
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

static void *work(void *arg)
{
    const worker *w = arg;
    lm_pool *p = w->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stop)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        lm_job_fn fn = p->fn;
        void *job = p->arg;
        pthread_mutex_unlock(&p->mu);
        fn(job, w->part, p->parts);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void lm_pool_free(lm_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->parts - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->parts);
    pthread_mutex_lock(&p->mu);
    while (p->pending)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
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
