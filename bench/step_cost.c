/* SPDX-License-Identifier: MIT */
/*
 * step_cost.c - per-step cost of every policy in the decode loop, as a ratio
 * against the memory floor measured in the same run.
 *
 * For each budget B and policy, the policy is filled to B positions, then
 * timed over `steps` calls of step(pos, attn, B + 0) + evict(B), the attention
 * drawn from a pool of precomputed random rows (so the rng is not timed).
 * The floor is the least work any policy that reads attention must do per
 * step: one pass that reads B floats and adds them into B doubles. A ratio of
 * 1.0 would be a policy at that floor; the `null` column passes attn = NULL
 * (the policies that ignore attention should be called that way).
 *
 * Speed is never asserted: the numbers depend on the machine and its load.
 * The best of `reps` repetitions is reported to damp noise.
 *
 * Usage: kvevict-step-cost [steps [reps]]   (defaults 20000 and 5)
 */
#define _POSIX_C_SOURCE 200809L
#include "kvevict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { POOL = 64 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "kvevict-step-cost: %s: %s\n", what, kve_last_error());
    exit(1);
}

/* Seconds per step of the floor: read B floats, add into B doubles. */
static double floor_cost(const float *pool, size_t budget, size_t steps, double *acc)
{
    double t0 = now_s();
    for (size_t s = 0; s < steps; s++) {
        const float *a = pool + (s % POOL) * (budget + 1);
        for (size_t i = 0; i < budget; i++)
            acc[i] += (double)a[i];
    }
    return (now_s() - t0) / (double)steps;
}

/* Seconds per step of `spec` at `budget`; with_attn = 0 passes NULL. */
static double policy_cost(const char *spec, const float *pool, size_t budget, size_t steps,
                          int with_attn)
{
    kve_rng rng;
    kve_rng_seed(&rng, 1);
    kve_policy *p;
    if (kve_policy_new(spec, &rng, &p) != KVE_OK)
        die(spec);
    int32_t victims[2];
    size_t nv;
    int32_t pos = 0;
    for (; (size_t)pos <= budget; pos++) { /* fill: not timed */
        size_t n = kve_policy_size(p);
        if (kve_policy_step(p, pos, with_attn ? pool : NULL, n) != KVE_OK ||
            kve_policy_evict(p, budget, victims, 2, &nv) != KVE_OK)
            die(spec);
    }
    double t0 = now_s();
    for (size_t s = 0; s < steps; s++, pos++) {
        const float *a = with_attn ? pool + (s % POOL) * (budget + 1) : NULL;
        if (kve_policy_step(p, pos, a, kve_policy_size(p)) != KVE_OK ||
            kve_policy_evict(p, budget, victims, 2, &nv) != KVE_OK)
            die(spec);
    }
    double dt = (now_s() - t0) / (double)steps;
    kve_policy_free(p);
    return dt;
}

static size_t parse_count(const char *s, const char *what)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s < '0' || *s > '9' || *end || v == 0 || v > 100000000ull) {
        fprintf(stderr, "kvevict-step-cost: %s must be a whole number in [1, 1e8]: '%s'\n", what,
                s);
        exit(2);
    }
    return (size_t)v;
}

int main(int argc, char **argv)
{
    size_t steps = argc > 1 ? parse_count(argv[1], "steps") : 20000;
    size_t reps = argc > 2 ? parse_count(argv[2], "reps") : 5;
    static const size_t budgets[] = {256, 1024, 4096};
    printf("per-step cost of step + evict in the steady state, best of %zu runs of %zu steps\n"
           "ratio = policy time / floor time (floor: read B floats, add into B doubles)\n\n",
           reps, steps);
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        size_t budget = budgets[b];
        float *pool = malloc(POOL * (budget + 1) * sizeof *pool);
        double *acc = calloc(budget, sizeof *acc);
        if (!pool || !acc) {
            fprintf(stderr, "kvevict-step-cost: out of memory\n");
            return 1;
        }
        kve_rng rng;
        kve_rng_seed(&rng, 42);
        for (size_t i = 0; i < POOL * (budget + 1); i++)
            pool[i] = (float)(kve_rng_uniform(&rng) * 2.0 / (double)budget);
        double fl = 1e9;
        for (size_t r = 0; r < reps; r++) {
            double c = floor_cost(pool, budget, steps, acc);
            fl = c < fl ? c : fl;
        }
        printf("budget %zu: floor %.1f ns/step (checksum %.3g)\n", budget, fl * 1e9, acc[0]);
        printf("  %-14s %12s %8s %12s %8s\n", "policy", "attn ns", "ratio", "null ns", "ratio");
        for (size_t k = 0; k < kve_policy_type_count(); k++) {
            char spec[96];
            const char *name = kve_policy_type_name(k);
            if (strcmp(name, "full") == 0) /* never evicts: no steady state at B */
                continue;
            snprintf(spec, sizeof spec, "%s:budget=%zu", name, budget);
            double with = 1e9, without = 1e9;
            for (size_t r = 0; r < reps; r++) {
                double c = policy_cost(spec, pool, budget, steps, 1);
                with = c < with ? c : with;
                c = policy_cost(spec, pool, budget, steps, 0);
                without = c < without ? c : without;
            }
            printf("  %-14s %12.1f %8.2f %12.1f %8.2f\n", name, with * 1e9, with / fl,
                   without * 1e9, without / fl);
        }
        printf("\n");
        free(pool);
        free(acc);
    }
    return 0;
}
