/* SPDX-License-Identifier: MIT */
/*
 * eval_ref.c - the C side of the Python binding's comparisons
 * (tests/test_python.py): the harness and a policy driven through the
 * public header only, printed at full precision for Python to compare bit
 * for bit.
 *
 *   eval_ref eval TRACE HEAD SEED TOPK SPEC[@BUDGET]...
 *       kve_eval_ex on head HEAD of TRACE (a source text): one JSON line per
 *       job with every field of kve_eval_result (%.17g reads back exactly;
 *       NaN as null).
 *   eval_ref bank SPEC HEADS GROUP REDUCE SEED STEPS BUDGET
 *       a bank of HEADS heads stepped with grouped attention from a kve_rng
 *       seeded SEED (weights kve_rng_uniform, as float32, in row order) and
 *       evicted to BUDGET after every step; one JSON line per step with each
 *       head's victims.
 *   eval_ref layout
 *       sizeof and offsetof of the structs the binding mirrors with ctypes.
 * Exits 1 with the library's message when a call is refused.
 */
#include "kvevict.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int refused(const char *what)
{
    fprintf(stderr, "eval_ref: %s: %s\n", what, kve_last_error());
    return 1;
}

static void real(const char *key, double x)
{
    if (isfinite(x))
        printf(", \"%s\": %.17g", key, x);
    else
        printf(", \"%s\": null", key);
}

static int cmd_eval(int argc, char **argv)
{
    if (argc < 6)
        return refused("usage: eval_ref eval TRACE HEAD SEED TOPK SPEC[@BUDGET]...");
    kve_trace *tr = NULL;
    if (kve_trace_open(argv[1], 0, &tr) != KVE_OK)
        return refused(argv[1]);
    size_t n = (size_t)argc - 5;
    kve_eval_job *jobs = calloc(n, sizeof *jobs);
    kve_eval_result *res = calloc(n, sizeof *res);
    char **specs = calloc(n, sizeof *specs);
    if (!jobs || !res || !specs)
        return refused("out of memory");
    for (size_t j = 0; j < n; j++) {
        specs[j] = argv[5 + j];
        char *at = strchr(specs[j], '@');
        jobs[j].budget = 0;
        if (at) {
            *at = '\0';
            jobs[j].budget = (size_t)strtoull(at + 1, NULL, 10);
        }
        jobs[j].spec = specs[j];
    }
    kve_eval_options o = kve_eval_default_options();
    o.seed = strtoull(argv[3], NULL, 10);
    o.topk = (size_t)strtoull(argv[4], NULL, 10);
    int rc = 0;
    if (kve_eval_ex(tr, (size_t)strtoull(argv[2], NULL, 10), jobs, n, &o, res) != KVE_OK) {
        rc = refused("kve_eval_ex");
    } else {
        for (size_t j = 0; j < n; j++) {
            const kve_eval_result *r = &res[j];
            printf("{\"policy\": \"%s\", \"budget\": %zu, \"steps\": %zu, \"scored_steps\": %zu, "
                   "\"state_bytes\": %zu, \"topk\": %zu",
                   r->spec, r->budget, r->steps, r->scored_steps, r->state_bytes, r->topk);
            real("retained_mass", r->retained_mass);
            real("top32_recall", r->top32_recall);
            real("topk_recall", r->topk_recall);
            real("min_retained_mass", r->min_retained_mass);
            printf("}\n");
        }
    }
    free(jobs);
    free(res);
    free(specs);
    kve_trace_free(tr);
    return rc;
}

static int cmd_bank(int argc, char **argv)
{
    if (argc != 8)
        return refused("usage: eval_ref bank SPEC HEADS GROUP REDUCE SEED STEPS BUDGET");
    size_t heads = (size_t)strtoull(argv[2], NULL, 10), group = (size_t)strtoull(argv[3], NULL, 10);
    kve_reduce reduce = (kve_reduce)atoi(argv[4]);
    int32_t steps = (int32_t)atoi(argv[6]);
    size_t budget = (size_t)strtoull(argv[7], NULL, 10);
    kve_rng rng;
    kve_rng_seed(&rng, strtoull(argv[5], NULL, 10));
    kve_bank *b = NULL;
    if (kve_bank_new(argv[1], heads, &rng, &b) != KVE_OK)
        return refused(argv[1]);
    size_t ld = budget + 1; /* attn (heads * group, ld), victims (heads, ld) */
    float *attn = malloc(heads * group * ld * sizeof *attn);
    int32_t *victims = malloc(heads * ld * sizeof *victims);
    size_t *counts = malloc(heads * sizeof *counts);
    if (!attn || !victims || !counts)
        return refused("out of memory");
    int rc = 0;
    for (int32_t pos = 0; pos < steps && rc == 0; pos++) {
        for (size_t i = 0; i < heads * group * ld; i++)
            attn[i] = (float)kve_rng_uniform(&rng);
        if (kve_bank_step_grouped(b, pos, attn, ld, group, reduce) != KVE_OK ||
            kve_bank_evict(b, budget, victims, ld, counts) != KVE_OK) {
            rc = refused("bank");
            break;
        }
        printf("{\"pos\": %d, \"victims\": [", (int)pos);
        for (size_t h = 0; h < heads; h++) {
            printf("%s[", h ? ", " : "");
            for (size_t k = 0; k < counts[h]; k++)
                printf("%s%d", k ? ", " : "", (int)victims[h * ld + k]);
            printf("]");
        }
        printf("]}\n");
    }
    free(attn);
    free(victims);
    free(counts);
    kve_bank_free(b);
    return rc;
}

#define FIELD(s, f) printf(", \"%s.%s\": %zu", #s, #f, offsetof(s, f))

static int cmd_layout(void)
{
    printf("{\"kve_rng\": %zu, \"kve_eval_job\": %zu, \"kve_eval_result\": %zu, "
           "\"kve_eval_options\": %zu",
           sizeof(kve_rng), sizeof(kve_eval_job), sizeof(kve_eval_result),
           sizeof(kve_eval_options));
    FIELD(kve_eval_job, spec);
    FIELD(kve_eval_job, budget);
    FIELD(kve_eval_result, spec);
    FIELD(kve_eval_result, budget);
    FIELD(kve_eval_result, steps);
    FIELD(kve_eval_result, scored_steps);
    FIELD(kve_eval_result, retained_mass);
    FIELD(kve_eval_result, top32_recall);
    FIELD(kve_eval_result, min_retained_mass);
    FIELD(kve_eval_result, ns_per_step);
    FIELD(kve_eval_result, state_bytes);
    FIELD(kve_eval_result, topk);
    FIELD(kve_eval_result, topk_recall);
    FIELD(kve_eval_options, seed);
    FIELD(kve_eval_options, topk);
    FIELD(kve_eval_options, on_step);
    FIELD(kve_eval_options, user);
    printf(", \"KVE_SPEC_MAX\": %d, \"KVE_MAX_BUDGET\": %d, \"KVE_TRACE_NORMALIZE\": %u, "
           "\"KVE_REDUCE_SUM\": %d, \"KVE_REDUCE_MAX\": %d, \"KVE_ECANCELED\": %d, "
           "\"version\": \"%s\"}\n",
           KVE_SPEC_MAX, KVE_MAX_BUDGET, (unsigned)KVE_TRACE_NORMALIZE, (int)KVE_REDUCE_SUM,
           (int)KVE_REDUCE_MAX, (int)KVE_ECANCELED, KVEVICT_VERSION_STRING);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "eval") == 0)
        return cmd_eval(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "bank") == 0)
        return cmd_bank(argc - 1, argv + 1);
    if (argc == 2 && strcmp(argv[1], "layout") == 0)
        return cmd_layout();
    fprintf(stderr, "usage: eval_ref eval|bank|layout ...\n");
    return 2;
}
