/* SPDX-License-Identifier: MIT */
/*
 * test_bank_threads.c - the thread rule of a bank (kvevict.h, "Banks"):
 * disjoint head ranges of one bank may be stepped and evicted from different
 * threads at once.
 *
 * For several policies, one bank of H heads is split in two ranges, each
 * driven by its own thread (released together by a barrier) through the same
 * deterministic workload: grouped steps with NULL rows now and then, evicts,
 * and runs of steps without an evict so that heads in both ranges move to
 * private storage at the same time (the slabs are freed by whichever thread
 * is last to leave them). Each thread reads its own heads' kept sets while
 * the other runs. The victims and final kept sets must equal those of the
 * same workloads run one after the other on a second bank, bit for bit.
 * The same with a shared budget: each range is one shared group of HALF
 * heads (its storage laid out again as its heads drift apart, and moved to a
 * private block when stepped without evicting), evicted to HALF * 24.
 * Built under ThreadSanitizer by `make test-tsan`, which also sees any race.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "kvevict.h"

#include <pthread.h>

enum { H = 8, HALF = H / 2, GROUP = 2, STEPS = 240, LD = 256 };

typedef struct range_job {
    kve_bank *b;
    size_t first;
    int shared; /* a shared group: evicted with kve_bank_evict_shared */
    pthread_barrier_t *start;
    uint64_t hash; /* victims, counts and kept sets, in order */
    int failures;
} range_job;

static uint64_t fnv(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (uint8_t)(v >> (8 * i));
        h *= 0x100000001b3u;
    }
    return h;
}

/* The workload of heads [first, first + HALF): rows from a generator seeded
 * by `first`, so both runs of a range see the same rows. */
static void run_range(range_job *j)
{
    static _Thread_local float rows[HALF * GROUP * LD];
    static _Thread_local int32_t victims[HALF * LD];
    kve_rng g;
    kve_rng_seed(&g, 1000 + j->first);
    j->hash = 0xcbf29ce484222325u;
    for (int32_t pos = 0; pos < STEPS; pos++) {
        size_t n = 0; /* rows are read up to each head's size only */
        for (size_t h = j->first; h < j->first + HALF; h++)
            n = kve_bank_size(j->b, h) > n ? kve_bank_size(j->b, h) : n;
        for (size_t r = 0; r < HALF * GROUP; r++)
            for (size_t i = 0; i < n; i++)
                rows[r * LD + i] = (float)kve_rng_below(&g, 8) / 8.0f;
        const float *attn = kve_rng_below(&g, 9) ? rows : NULL;
        if (kve_bank_step_range(j->b, j->first, HALF, pos, attn, LD, GROUP, KVE_REDUCE_MEAN, NULL, 0) !=
            KVE_OK) {
            j->failures++;
            return;
        }
        if (pos % 60 >= 50 && pos < 200) /* ten steps without evicting: growth */
            continue;
        size_t counts[HALF];
        kve_status st = j->shared ? kve_bank_evict_shared(j->b, j->first, HALF, HALF * 24, victims,
                                                          LD, counts)
                                  : kve_bank_evict_range(j->b, j->first, HALF, 24, victims, LD,
                                                         counts);
        if (st != KVE_OK) {
            j->failures++;
            return;
        }
        for (size_t h = 0; h < HALF; h++) {
            j->hash = fnv(j->hash, counts[h]);
            for (size_t k = 0; k < counts[h]; k++)
                j->hash = fnv(j->hash, (uint64_t)victims[h * LD + k]);
        }
    }
    for (size_t h = j->first; h < j->first + HALF; h++) {
        const int32_t *kept = kve_bank_positions(j->b, h);
        for (size_t i = 0; i < kve_bank_size(j->b, h); i++)
            j->hash = fnv(j->hash, (uint64_t)kept[i]);
    }
}

static void *thread_main(void *arg)
{
    range_job *j = arg;
    pthread_barrier_wait(j->start);
    run_range(j);
    return NULL;
}

static void disjoint_ranges(const char *spec, int sharing)
{
    kve_rng ra, rb;
    kve_rng_seed(&ra, 77);
    kve_rng_seed(&rb, 77);
    kve_bank *alone = NULL, *shared = NULL;
    kve_bank_options o = kve_bank_default_options();
    o.share = sharing ? HALF : 0;
    ASSERT_OK(kve_bank_new_ex(spec, H, &ra, &o, &alone));
    ASSERT_OK(kve_bank_new_ex(spec, H, &rb, &o, &shared));

    range_job want[2] = {{alone, 0, sharing, NULL, 0, 0}, {alone, HALF, sharing, NULL, 0, 0}};
    run_range(&want[0]);
    run_range(&want[1]);

    pthread_barrier_t start;
    ASSERT_EQ(pthread_barrier_init(&start, NULL, 2), 0);
    range_job got[2] = {{shared, 0, sharing, &start, 0, 0}, {shared, HALF, sharing, &start, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, thread_main, &got[i]), 0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&start);

    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(want[i].failures, 0);
        ASSERT_EQ(got[i].failures, 0);
        ASSERT_U64_EQ(got[i].hash, want[i].hash);
    }
    ASSERT_EQ(kve_bank_state_bytes(shared), kve_bank_state_bytes(alone));
    kve_bank_free(alone);
    kve_bank_free(shared);
}

static void test_disjoint_ranges_in_two_threads(void)
{
    static const char *const specs[] = {
        "h2o:budget=24,recent_window=4", "scissorhands:budget=24,recent_window=2,history=8",
        "h2o_mean:budget=24,recent_window=3", "random:budget=24,recent_window=2",
        "streaming:budget=24,sinks=2", "full:budget=24",
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        int before = check_failures;
        disjoint_ranges(specs[i], 0);
        if (i < 3) /* the scored ones share a budget too */
            disjoint_ranges(specs[i], 1);
        if (check_failures != before) {
            fprintf(stderr, "spec %s\n", specs[i]);
            return;
        }
    }
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_disjoint_ranges_in_two_threads);
    return CHECK_DONE();
}
