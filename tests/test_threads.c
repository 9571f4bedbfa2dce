/* SPDX-License-Identifier: MIT */
/*
 * test_threads.c - the thread-safety promise of kvevict.h: distinct objects
 * may be used from distinct threads at once without locking, the error
 * message is per thread, and allocators are per object.
 *
 * Each of THREADS threads, released together by a barrier, runs the same
 * workload as a single-threaded pass beforehand: every policy type on a
 * deterministic attention stream (step + evict each step, victims hashed),
 * a canonical trace opened and evaluated with kve_eval, a refused call whose
 * message names the thread, and a construction with a failing allocator of
 * the thread's own while the others allocate through theirs. The results
 * must equal the single-threaded ones bit for bit, each thread must still
 * read its own error message after the others failed, and one thread's
 * failing allocator must not make another's allocations fail. Then the
 * registry of score rules, the library's one shared table: threads that
 * register and unregister rules of their own while others build, step and
 * free objects of a rule they share, parse its specs and try to unregister
 * it. Built under ThreadSanitizer by `make test-tsan`, which also sees any
 * data race.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "facts.h"
#include "test_allocator.h"
#include "internal.h"
#include "kvevict_eval.h"
#include "eval_options.h"

#include <pthread.h>

enum { THREADS = 4, STEPS = 600, BUDGET = 48 };

typedef struct outcome {
    uint64_t policy_hash[16]; /* per policy type: victims and final kept set */
    kve_eval_result eval[2];
    int own_message_ok;       /* this thread's error message survived */
    int hook_refused;         /* kve_policy_new_ex with a failing allocator said ENOMEM */
    int failures;             /* unexpected statuses */
} outcome;

static uint64_t fnv(uint64_t h, int32_t v)
{
    for (int i = 0; i < 4; i++) {
        h ^= (uint8_t)((uint32_t)v >> (8 * i));
        h *= 0x100000001b3u;
    }
    return h;
}

static uint64_t run_policy(size_t type, outcome *o)
{
    char base[64], spec[KVE_SPEC_MAX];
    snprintf(base, sizeof base, "%s:budget=%d", kve_policy_type_name(type), BUDGET);
    if (kve_spec_with(base, "recent_window", "8", spec, sizeof spec) != KVE_OK)
        snprintf(spec, sizeof spec, "%s", base);
    kve_rng rng, stream;
    kve_rng_seed(&rng, 100 + type);
    kve_rng_seed(&stream, 7 * type + 1);
    kve_policy *p = NULL;
    kve_policy_options po = kve_policy_default_options();
    facts_policy(&po); /* the policies that read keys, queries or values step with them */
    if (kve_policy_new_ex(spec, &rng, &po, &p) != KVE_OK) {
        o->failures++;
        return 0;
    }
    uint64_t h = 0xcbf29ce484222325u;
    float attn[STEPS];
    int32_t victims[BUDGET + 1];
    for (int32_t pos = 0; pos < STEPS; pos++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            attn[i] = (float)kve_rng_uniform(&stream);
        const float *a = kve_rng_below(&stream, 10) == 0 ? NULL : attn;
        size_t nv = 0;
        if (facts_step(p, pos, a, n, &stream) != KVE_OK ||
            kve_policy_evict(p, BUDGET, victims, BUDGET + 1, &nv) != KVE_OK) {
            o->failures++;
            break;
        }
        for (size_t i = 0; i < nv; i++)
            h = fnv(h, victims[i]);
    }
    for (size_t i = 0; i < kve_policy_size(p); i++)
        h = fnv(h, kve_policy_positions(p)[i]);
    kve_policy_free(p);
    return h;
}

static void workload(size_t id, outcome *o)
{
    memset(o, 0, sizeof *o);
    for (size_t t = 0; t < kve_policy_type_count() && t < 16; t++)
        o->policy_hash[t] = run_policy(t, o);

    /* A failure whose message names this thread, then only successful calls. */
    char bad[32], want[32];
    snprintf(bad, sizeof bad, "nosuch%zu", id);
    snprintf(want, sizeof want, "\"nosuch%zu\"", id);
    kve_policy *p = NULL;
    if (kve_policy_new(bad, NULL, &p) != KVE_EINVAL)
        o->failures++;

    kve_trace *tr = NULL;
    if (kve_trace_open("canonical:steps=300,seed=4", NULL, &tr) == KVE_OK) {
        const kve_eval_job jobs[2] = {{"h2o:budget=32,recent_window=8", 0}, {"random", 40}};
        if (kve_eval(tr, 0, 1, jobs, 2, EVAL_OPTS(9, NULL, NULL), o->eval, NULL) != KVE_OK)
            o->failures++;
        kve_trace_free(tr);
    } else {
        o->failures++;
    }

    /* Successful calls since the failure did not clear or replace it. */
    o->own_message_ok = strstr(kve_last_error(), want) != NULL;

    /* This thread's failing allocator refuses this construction only. */
    talloc ta;
    talloc_init(&ta);
    kve_policy_options po = kve_policy_default_options();
    po.allocator = &ta.a;
    talloc_fail_after(&ta, 0);
    o->hook_refused = kve_policy_new_ex("h2o", NULL, &po, &p) == KVE_ENOMEM && ta.blocks == 0;
    talloc_fail_after(&ta, SIZE_MAX);
}

typedef struct job {
    size_t id;
    pthread_barrier_t *start;
    outcome out;
} job;

static void *thread_main(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(j->start);
    workload(j->id, &j->out);
    return NULL;
}

static void test_threads_match_single_threaded(void)
{
    outcome want;
    workload(99, &want);
    ASSERT_EQ(want.failures, 0);
    ASSERT_TRUE(want.own_message_ok);
    ASSERT_TRUE(want.hook_refused);

    kve_policy *none = NULL;
    ASSERT_STATUS(kve_policy_new("nosuchmain", NULL, &none), KVE_EINVAL);

    pthread_barrier_t start;
    ASSERT_EQ(pthread_barrier_init(&start, NULL, THREADS), 0);
    job jobs[THREADS];
    pthread_t th[THREADS];
    for (size_t i = 0; i < THREADS; i++) {
        jobs[i].id = i;
        jobs[i].start = &start;
        ASSERT_EQ(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
    }
    for (size_t i = 0; i < THREADS; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&start);

    for (size_t i = 0; i < THREADS; i++) {
        const outcome *o = &jobs[i].out;
        ASSERT_EQ(o->failures, 0);
        ASSERT_TRUE(o->own_message_ok);
        ASSERT_TRUE(o->hook_refused);
        for (size_t t = 0; t < 16; t++)
            ASSERT_U64_EQ(o->policy_hash[t], want.policy_hash[t]);
        for (int e = 0; e < 2; e++) {
            ASSERT_STR_EQ(o->eval[e].spec, want.eval[e].spec);
            ASSERT_TRUE(o->eval[e].retained_mass == want.eval[e].retained_mass);
            ASSERT_TRUE(o->eval[e].top32_recall == want.eval[e].top32_recall);
            ASSERT_TRUE(o->eval[e].min_retained_mass == want.eval[e].min_retained_mass);
            ASSERT_EQ(o->eval[e].scored_steps, want.eval[e].scored_steps);
        }
    }
    /* The threads' failures did not touch the main thread's message. */
    ASSERT_CONTAINS(kve_last_error(), "\"nosuchmain\"");
}

/* One policy used by several threads one after another (handed over through
 * pthread_join) is fine: the rule is only "not two threads at the same time". */
static void *step_some(void *arg)
{
    kve_policy *p = arg;
    int32_t victims[4];
    size_t n = kve_policy_size(p);
    int32_t start = n ? kve_policy_positions(p)[n - 1] + 1 : 0;
    for (int32_t pos = start; pos < start + 100; pos++)
        if (kve_policy_step(p, pos, NULL, 0) != KVE_OK ||
            kve_policy_evict(p, 16, victims, 4, NULL) != KVE_OK)
            return p;
    return NULL;
}

static void test_handover(void)
{
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("window:budget=16", NULL, &p));
    for (int round = 0; round < 3; round++) {
        pthread_t th;
        void *ret = p;
        ASSERT_EQ(pthread_create(&th, NULL, step_some, p), 0);
        ASSERT_EQ(pthread_join(th, &ret), 0);
        ASSERT_TRUE(ret == NULL);
    }
    ASSERT_EQ(kve_policy_size(p), 16);
    for (size_t i = 0; i < 16; i++)
        ASSERT_EQ(kve_policy_positions(p)[i], 284 + (int32_t)i);
    kve_policy_free(p);
}

/* ---- the registry of score rules ---- */

static kve_status shared_rule(void *user, const kve_score_step *s)
{
    (void)user; /* read-only: safe from any thread */
    for (size_t i = 0; i < s->n; i++)
        s->new_score[i] = s->score[i] + (double)s->attn[i];
    return KVE_OK;
}

typedef struct rule_job {
    size_t id;
    pthread_barrier_t *start;
    int failures;
    uint64_t hash;
} rule_job;

/* Registers, uses and unregisters rules of its own, and uses "shared_r"
 * (built, stepped, its spec parsed) which it must never be able to pull. */
static void *rule_main(void *arg)
{
    rule_job *j = arg;
    pthread_barrier_wait(j->start);
    char name[32], spec[64];
    snprintf(name, sizeof name, "own_%zu", j->id);
    kve_score_rule r = kve_score_rule_default();
    r.observe = shared_rule;
    r.recent_window = 2;
    uint64_t h = 0xcbf29ce484222325u;
    float attn[STEPS];
    int32_t victims[4];
    for (int round = 0; round < 40; round++) {
        r.name = name;
        if (kve_score_rule_register(&r) != KVE_OK)
            j->failures++;
        kve_policy *own = NULL, *sh = NULL;
        snprintf(spec, sizeof spec, "%s:budget=8", name);
        if (kve_policy_new(spec, NULL, &own) != KVE_OK ||
            kve_policy_new("shared_r:budget=8", NULL, &sh) != KVE_OK)
            j->failures++;
        char out[KVE_SPEC_MAX];
        if (kve_spec_with("shared_r", "vnorm", "1", out, sizeof out) != KVE_OK)
            j->failures++;
        for (int32_t pos = 0; pos < 30 && own && sh; pos++) {
            size_t n = kve_policy_size(sh);
            for (size_t i = 0; i < n; i++)
                attn[i] = (float)((i * 7 + (size_t)pos) % 5) / 4.0f;
            size_t nv = 0;
            if (kve_policy_step(own, pos, attn, n) != KVE_OK ||
                kve_policy_step(sh, pos, attn, n) != KVE_OK ||
                kve_policy_evict(own, 8, victims, 4, NULL) != KVE_OK ||
                kve_policy_evict(sh, 8, victims, 4, &nv) != KVE_OK)
                j->failures++;
            for (size_t i = 0; i < nv; i++)
                h = fnv(h, victims[i]);
        }
        /* held by this thread's object (at least): refused */
        if (kve_score_rule_unregister("shared_r") != KVE_EINVAL)
            j->failures++;
        if (kve_score_rule_unregister(name) != KVE_EINVAL) /* held by own */
            j->failures++;
        kve_policy_free(own);
        kve_policy_free(sh);
        if (kve_score_rule_unregister(name) != KVE_OK)
            j->failures++;
    }
    j->hash = h;
    return NULL;
}

static void test_rule_registry_threads(void)
{
    kve_score_rule r = kve_score_rule_default();
    r.name = "shared_r";
    r.observe = shared_rule;
    r.recent_window = 2;
    ASSERT_OK(kve_score_rule_register(&r));
    pthread_barrier_t start;
    ASSERT_EQ(pthread_barrier_init(&start, NULL, THREADS), 0);
    rule_job jobs[THREADS];
    pthread_t th[THREADS];
    for (size_t i = 0; i < THREADS; i++) {
        jobs[i] = (rule_job){i, &start, 0, 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, rule_main, &jobs[i]), 0);
    }
    for (size_t i = 0; i < THREADS; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&start);
    for (size_t i = 0; i < THREADS; i++) {
        ASSERT_EQ(jobs[i].failures, 0);
        ASSERT_U64_EQ(jobs[i].hash, jobs[0].hash); /* the same steps, the same victims */
    }
    ASSERT_OK(kve_score_rule_unregister("shared_r")); /* every hold is gone */
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_threads_match_single_threaded);
    RUN(test_handover);
    RUN(test_rule_registry_threads);
    return CHECK_DONE();
}
