/* SPDX-License-Identifier: MIT */
/*
 * eval_ref.c - the C side of the Python binding's comparisons
 * (tests/test_python.py): the harness and a policy driven through the
 * public header only, printed at full precision for Python to compare bit
 * for bit.
 *
 *   eval_ref eval [KEY=VALUE...] TRACE HEAD SEED TOPK SPEC[@BUDGET]...
 *       kve_eval on heads HEAD .. HEAD + heads - 1 of TRACE (a source text):
 *       one JSON line per job with every field of kve_eval_result (%.17g
 *       reads back exactly; NaN as null), and "per_head", each head's. KEYs
 *       set the head count (heads, default 1) and the options share,
 *       min_share, score_after (defaults: the library's).
 *   eval_ref bank SPEC HEADS GROUP REDUCE SEED STEPS BUDGET
 *       a bank of HEADS heads stepped with grouped attention from a kve_rng
 *       seeded SEED (weights kve_rng_uniform, as float32, in row order) and
 *       evicted to BUDGET after every step; one JSON line per step with each
 *       head's victims.
 *   eval_ref bankx SPEC HEADS KEY_DIM SHARE MIN_SHARE SEED STEPS BUDGET
 *       a bank built with kve_bank_new_ex {KEY_DIM, SHARE, MIN_SHARE} from
 *       a kve_rng seeded SEED; every step draws the attention rows (HEADS x
 *       LD weights kve_rng_uniform as float32, LD = max(SHARE, 1) * BUDGET +
 *       1) and then, with KEY_DIM > 0, the keys (HEADS x KEY_DIM floats
 *       kve_rng_uniform - 0.5 as float32), steps every head with
 *       kve_bank_step_range and evicts with kve_bank_evict_shared to SHARE *
 *       BUDGET (SHARE > 0) or kve_bank_evict to BUDGET; one JSON line per
 *       step with each head's victims and sizes.
 *   eval_ref layout
 *       sizeof and offsetof of the structs the binding mirrors with ctypes.
 * Exits 1 with the library's message when a call is refused.
 */
#include "kvevict_eval.h"

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

/* Sets option `kv` ("key=value") of o, or the head count; 0 when it is
 * not an option. */
static int eval_option(kve_eval_options *o, size_t *heads, const char *kv)
{
    const char *eq = strchr(kv, '=');
    if (!eq)
        return 0;
    size_t n = (size_t)(eq - kv);
    const char *v = eq + 1;
    if (n == 5 && strncmp(kv, "heads", n) == 0)
        *heads = (size_t)strtoull(v, NULL, 10);
    else if (n == 5 && strncmp(kv, "share", n) == 0)
        o->share = (size_t)strtoull(v, NULL, 10);
    else if (n == 9 && strncmp(kv, "min_share", n) == 0)
        o->min_share = strtod(v, NULL);
    else if (n == 11 && strncmp(kv, "score_after", n) == 0)
        o->score_after = (size_t)strtoull(v, NULL, 10);
    else
        return 0;
    return 1;
}

static void print_metrics(const kve_eval_result *r)
{
    printf("\"scored_steps\": %zu, \"state_bytes\": %zu", r->scored_steps, r->state_bytes);
    real("retained_mass", r->retained_mass);
    real("top32_recall", r->top32_recall);
    real("topk_recall", r->topk_recall);
    real("min_retained_mass", r->min_retained_mass);
    real("mean_kept", r->mean_kept);
}

static int cmd_eval(int argc, char **argv)
{
    kve_eval_options o = kve_eval_default_options();
    size_t heads = 1;
    while (argc > 1 && eval_option(&o, &heads, argv[1])) {
        argv++;
        argc--;
    }
    if (argc < 6)
        return refused("usage: eval_ref eval [KEY=VALUE...] TRACE HEAD SEED TOPK "
                       "SPEC[@BUDGET]...");
    kve_trace *tr = NULL;
    if (kve_trace_open(argv[1], NULL, &tr) != KVE_OK)
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
        jobs[j].budget = KVE_EVAL_BUDGET_SPEC;
        if (at) {
            *at = '\0';
            jobs[j].budget = (size_t)strtoull(at + 1, NULL, 10);
        }
        jobs[j].spec = specs[j];
    }
    o.seed = strtoull(argv[3], NULL, 10);
    o.topk = (size_t)strtoull(argv[4], NULL, 10);
    kve_eval_result *per = calloc(n * (heads ? heads : 1), sizeof *per); /* (job, head) */
    if (!per)
        return refused("out of memory");
    int rc = 0;
    if (kve_eval(tr, (size_t)strtoull(argv[2], NULL, 10), heads, jobs, n, &o, res, per) !=
        KVE_OK) {
        rc = refused("kve_eval");
    } else {
        for (size_t j = 0; j < n; j++) {
            const kve_eval_result *r = &res[j];
            printf("{\"policy\": \"%s\", \"budget\": %zu, \"steps\": %zu, \"topk\": %zu, ",
                   r->spec, r->budget, r->steps, r->topk);
            print_metrics(r);
            printf(", \"per_head\": [");
            for (size_t h = 0; h < heads; h++) {
                printf(h ? ", {" : "{");
                print_metrics(&per[j * heads + h]);
                printf("}");
            }
            printf("]}\n");
        }
    }
    free(per);
    free(jobs);
    free(res);
    free(specs);
    kve_trace_free(tr);
    return rc;
}

/* The start of a step's line: {"pos": P, "victims": [[head 0's], ...] */
static void print_victims(int32_t pos, const int32_t *victims, size_t ld, const size_t *counts,
                          size_t heads)
{
    printf("{\"pos\": %d, \"victims\": [", (int)pos);
    for (size_t h = 0; h < heads; h++) {
        printf("%s[", h ? ", " : "");
        for (size_t k = 0; k < counts[h]; k++)
            printf("%s%d", k ? ", " : "", (int)victims[h * ld + k]);
        printf("]");
    }
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
        if (kve_bank_step_range(b, 0, kve_bank_heads(b), pos, attn, ld, group, reduce, NULL, 0) != KVE_OK ||
            kve_bank_evict(b, budget, victims, ld, counts) != KVE_OK) {
            rc = refused("bank");
            break;
        }
        print_victims(pos, victims, ld, counts, heads);
        printf("]}\n");
    }
    free(attn);
    free(victims);
    free(counts);
    kve_bank_free(b);
    return rc;
}

static int cmd_bankx(int argc, char **argv)
{
    if (argc != 9)
        return refused("usage: eval_ref bankx SPEC HEADS KEY_DIM SHARE MIN_SHARE SEED STEPS "
                       "BUDGET");
    kve_bank_options bo = kve_bank_default_options();
    size_t heads = (size_t)strtoull(argv[2], NULL, 10);
    bo.key_dim = (size_t)strtoull(argv[3], NULL, 10);
    bo.share = (size_t)strtoull(argv[4], NULL, 10);
    bo.min_share = strtod(argv[5], NULL);
    int32_t steps = (int32_t)atoi(argv[7]);
    size_t budget = (size_t)strtoull(argv[8], NULL, 10);
    kve_rng rng;
    kve_rng_seed(&rng, strtoull(argv[6], NULL, 10));
    kve_bank *b = NULL;
    if (kve_bank_new_ex(argv[1], heads, &rng, &bo, &b) != KVE_OK)
        return refused(argv[1]);
    const size_t d = bo.key_dim;
    size_t ld = (bo.share ? bo.share : 1) * budget + 1; /* attn (heads, ld), victims (heads, ld) */
    float *attn = malloc(heads * ld * sizeof *attn);
    float *keys = malloc(heads * (d ? d : 1) * sizeof *keys); /* (heads, d) */
    int32_t *victims = malloc(heads * ld * sizeof *victims);
    size_t *counts = malloc(heads * sizeof *counts);
    if (!attn || !keys || !victims || !counts)
        return refused("out of memory");
    int rc = 0;
    for (int32_t pos = 0; pos < steps && rc == 0; pos++) {
        for (size_t i = 0; i < heads * ld; i++)
            attn[i] = (float)kve_rng_uniform(&rng);
        for (size_t i = 0; i < heads * d; i++)
            keys[i] = (float)(kve_rng_uniform(&rng) - 0.5);
        kve_status st = kve_bank_step_range(b, 0, heads, pos, attn, ld, 1, KVE_REDUCE_MEAN,
                                           d ? keys : NULL, d);
        if (st == KVE_OK)
            st = bo.share ? kve_bank_evict_shared(b, 0, heads, bo.share * budget, victims, ld,
                                                  counts)
                          : kve_bank_evict(b, budget, victims, ld, counts);
        if (st != KVE_OK) {
            rc = refused("bankx");
            break;
        }
        print_victims(pos, victims, ld, counts, heads);
        printf("], \"sizes\": [");
        for (size_t h = 0; h < heads; h++)
            printf(h ? ", %zu" : "%zu", kve_bank_size(b, h));
        printf("]}\n");
    }
    free(attn);
    free(keys);
    free(victims);
    free(counts);
    kve_bank_free(b);
    return rc;
}

#define FIELD(s, f) printf(", \"%s.%s\": %zu", #s, #f, offsetof(s, f))

static int cmd_layout(void)
{
    printf("{\"kve_rng\": %zu, \"kve_eval_job\": %zu, \"kve_eval_result\": %zu, "
           "\"kve_eval_options\": %zu, \"kve_bank_options\": %zu, \"kve_policy_options\": %zu, "
           "\"kve_trace_options\": %zu, \"kve_allocator\": %zu, \"kve_rope\": %zu, "
           "\"kve_step_data\": %zu, \"kve_score_step\": %zu, \"kve_score_rule\": %zu, "
           "\"kve_trace_callbacks\": %zu, \"kve_schedule_options\": %zu, "
           "\"kve_prefill_options\": %zu",
           sizeof(kve_rng), sizeof(kve_eval_job), sizeof(kve_eval_result),
           sizeof(kve_eval_options), sizeof(kve_bank_options), sizeof(kve_policy_options),
           sizeof(kve_trace_options), sizeof(kve_allocator), sizeof(kve_rope),
           sizeof(kve_step_data), sizeof(kve_score_step), sizeof(kve_score_rule),
           sizeof(kve_trace_callbacks), sizeof(kve_schedule_options), sizeof(kve_prefill_options));
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
    FIELD(kve_eval_result, mean_kept);
    FIELD(kve_eval_options, allocator);
    FIELD(kve_eval_options, seed);
    FIELD(kve_eval_options, topk);
    FIELD(kve_eval_options, on_step);
    FIELD(kve_eval_options, user);
    FIELD(kve_eval_options, share);
    FIELD(kve_eval_options, min_share);
    FIELD(kve_eval_options, score_after);
    FIELD(kve_bank_options, allocator);
    FIELD(kve_bank_options, key_dim);
    FIELD(kve_bank_options, share);
    FIELD(kve_bank_options, min_share);
    FIELD(kve_bank_options, value_dim);
    FIELD(kve_bank_options, query_group);
    FIELD(kve_bank_options, rope);
    FIELD(kve_bank_options, unchecked);
    FIELD(kve_bank_options, same_positions);
    FIELD(kve_policy_options, allocator);
    FIELD(kve_policy_options, key_dim);
    FIELD(kve_policy_options, value_dim);
    FIELD(kve_policy_options, query_group);
    FIELD(kve_policy_options, rope);
    FIELD(kve_policy_options, unchecked);
    FIELD(kve_rope, rotary_dim);
    FIELD(kve_rope, base);
    FIELD(kve_rope, pairs);
    FIELD(kve_rope, scaling);
    FIELD(kve_rope, factor);
    FIELD(kve_rope, low_freq_factor);
    FIELD(kve_rope, high_freq_factor);
    FIELD(kve_rope, original_max_position);
    FIELD(kve_rope, beta_fast);
    FIELD(kve_rope, beta_slow);
    FIELD(kve_rope, attention_factor);
    FIELD(kve_rope, freq_factors);
    FIELD(kve_step_data, attn);
    FIELD(kve_step_data, ld);
    FIELD(kve_step_data, group);
    FIELD(kve_step_data, reduce);
    FIELD(kve_step_data, keys);
    FIELD(kve_step_data, ld_keys);
    FIELD(kve_step_data, queries);
    FIELD(kve_step_data, ld_queries);
    FIELD(kve_step_data, values);
    FIELD(kve_step_data, ld_values);
    FIELD(kve_step_data, flags);
    FIELD(kve_score_step, n);
    FIELD(kve_score_step, pos);
    FIELD(kve_score_step, attn);
    FIELD(kve_score_step, score);
    FIELD(kve_score_step, state);
    FIELD(kve_score_step, n_state);
    FIELD(kve_score_step, vnorm);
    FIELD(kve_score_step, step);
    FIELD(kve_score_step, new_score);
    FIELD(kve_score_step, new_state);
    FIELD(kve_score_rule, name);
    FIELD(kve_score_rule, summary);
    FIELD(kve_score_rule, observe);
    FIELD(kve_score_rule, user);
    FIELD(kve_score_rule, state);
    FIELD(kve_score_rule, recent_window);
    FIELD(kve_score_rule, values);
    FIELD(kve_trace_options, allocator);
    FIELD(kve_trace_options, flags);
    FIELD(kve_trace_options, progress);
    FIELD(kve_trace_options, user);
    FIELD(kve_trace_callbacks, rows);
    FIELD(kve_trace_callbacks, keys);
    FIELD(kve_trace_callbacks, free);
    FIELD(kve_schedule_options, kind);
    FIELD(kve_schedule_options, floor);
    FIELD(kve_schedule_options, beta);
    FIELD(kve_schedule_options, weights);
    FIELD(kve_prefill_options, method);
    FIELD(kve_prefill_options, window);
    FIELD(kve_prefill_options, kernel);
    FIELD(kve_prefill_options, pool);
    FIELD(kve_prefill_options, allocator);
    FIELD(kve_prefill_options, queries);
    FIELD(kve_prefill_options, sinks);
    FIELD(kve_prefill_options, values);
    FIELD(kve_prefill_options, ld_values);
    FIELD(kve_prefill_options, budgets);
    FIELD(kve_prefill_options, layer_heads);
    FIELD(kve_prefill_options, prefix);
    FIELD(kve_prefill_options, row_scale);
    FIELD(kve_prefill_options, key_scale);
    FIELD(kve_prefill_options, compression_ratio);
    kve_bank_options bo = kve_bank_default_options();
    kve_eval_options eo = kve_eval_default_options();
    printf(", \"default.min_share\": %.17g, \"default.eval_min_share\": %.17g, "
           "\"default.score_after\": %zu, \"default.topk\": %zu",
           bo.min_share, eo.min_share, eo.score_after, eo.topk);
    printf(", \"KVE_READS_ATTN\": %u, \"KVE_READS_KEYS\": %u, \"KVE_MAX_KEY_DIM\": %d",
           (unsigned)KVE_READS_ATTN, (unsigned)KVE_READS_KEYS, KVE_MAX_KEY_DIM);
    printf(", \"KVE_READS_QUERIES\": %u, \"KVE_READS_VALUES\": %u, \"KVE_ROPE_HALF\": %d, "
           "\"KVE_STEP_RESCORE\": %u, \"KVE_MAX_QUERY_GROUP\": %d, \"KVE_MAX_RULE_STATE\": %d",
           (unsigned)KVE_READS_QUERIES, (unsigned)KVE_READS_VALUES, (int)KVE_ROPE_HALF,
           (unsigned)KVE_STEP_RESCORE, KVE_MAX_QUERY_GROUP, KVE_MAX_RULE_STATE);
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
    if (argc >= 2 && strcmp(argv[1], "bankx") == 0)
        return cmd_bankx(argc - 1, argv + 1);
    if (argc == 2 && strcmp(argv[1], "layout") == 0)
        return cmd_layout();
    fprintf(stderr, "usage: eval_ref eval|bank|bankx|layout ...\n");
    return 2;
}
