/* SPDX-License-Identifier: MIT */
/*
 * rule_examples.h - two score rules as an application writes them
 * (kvevict.h, "Score rules"): `kvevict perf` times them against the
 * built-in policies they restate, and tests/test_rules.c requires them to
 * keep exactly what those policies keep.
 *
 *   example_rule_h2o   h2o: the state is the sum of the attention a position
 *                      received, and the score is that sum;
 *   example_rule_vh2o  value-aware h2o (CriticalKV, VATP): the same sum,
 *                      scored times the value's norm (h2o:vnorm=1).
 */
#ifndef KVE_RULE_EXAMPLES_H
#define KVE_RULE_EXAMPLES_H

#include <kvevict.h>

static kve_status example_rule_h2o(void *user, const kve_score_step *s)
{
    (void)user;
    for (size_t i = 0; i < s->n; i++) {
        s->new_state[i] = s->state[i] + (double)s->attn[i];
        s->new_score[i] = s->new_state[i];
    }
    return KVE_OK;
}

static kve_status example_rule_vh2o(void *user, const kve_score_step *s)
{
    (void)user;
    for (size_t i = 0; i < s->n; i++) {
        s->new_state[i] = s->state[i] + (double)s->attn[i];
        s->new_score[i] = s->new_state[i] * s->vnorm[i];
    }
    return KVE_OK;
}

#endif
