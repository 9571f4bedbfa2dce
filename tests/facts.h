/* SPDX-License-Identifier: MIT */
/*
 * facts.h - the model facts a test gives every policy type, so that a test
 * that walks every type can build and step each one: keys of FACT_D floats,
 * values of FACT_V, FACT_G queries a KV head, a rotary embedding over every
 * key dimension (adjacent pairs, base 10000). A policy that reads none of
 * them validates and ignores them when given. facts_step hands a policy
 * those it reads, drawn from a generator, with the attention given (or
 * NULL).
 * Header only; deterministic for a given generator state.
 */
#ifndef KVE_FACTS_H
#define KVE_FACTS_H

#include "kvevict.h"

enum { FACT_D = 8, FACT_V = 6, FACT_G = 2 };

static inline kve_rope facts_rope(void)
{
    kve_rope r = {.rotary_dim = FACT_D, .base = 10000.0, .pairs = KVE_ROPE_ADJACENT};
    return r;
}

/* o (from kve_policy_default_options) with the facts. */
static inline void facts_policy(kve_policy_options *o)
{
    o->key_dim = FACT_D;
    o->value_dim = FACT_V;
    o->query_group = FACT_G;
    o->rope = facts_rope();
}

static inline void facts_bank(kve_bank_options *o)
{
    o->key_dim = FACT_D;
    o->value_dim = FACT_V;
    o->query_group = FACT_G;
    o->rope = facts_rope();
}

/* A key, FACT_G queries and a value of uniform entries in [-1, 1). */
typedef struct facts_vec {
    float key[FACT_D];
    float queries[FACT_G * FACT_D];
    float value[FACT_V];
} facts_vec;

static inline void facts_draw(kve_rng *g, facts_vec *v)
{
    for (size_t j = 0; j < FACT_D; j++)
        v->key[j] = (float)(kve_rng_uniform(g) * 2.0 - 1.0);
    for (size_t j = 0; j < FACT_G * FACT_D; j++)
        v->queries[j] = (float)(kve_rng_uniform(g) * 2.0 - 1.0);
    for (size_t j = 0; j < FACT_V; j++)
        v->value[j] = (float)(kve_rng_uniform(g) * 2.0 - 1.0);
}

/* The step data of one head's step: attn (n weights or NULL) and v. */
static inline kve_step_data facts_data(const float *attn, size_t n, const facts_vec *v)
{
    kve_step_data d = kve_step_default_data();
    d.attn = attn;
    d.ld = n;
    d.keys = v->key;
    d.ld_keys = FACT_D;
    d.queries = v->queries;
    d.ld_queries = FACT_D;
    d.values = v->value;
    d.ld_values = FACT_V;
    return d;
}

/* kve_policy_step with what the policy reads (kve_policy_reads) of the
 * vectors of the facts, drawn from g (always: the draws do not depend on
 * the policy). */
static inline kve_status facts_step(kve_policy *p, int32_t pos, const float *attn, size_t n,
                                    kve_rng *g)
{
    facts_vec v;
    facts_draw(g, &v);
    kve_step_data d = facts_data(attn, n, &v);
    kve_reads r = kve_policy_reads(p);
    if (!(r & KVE_READS_KEYS))
        d.keys = NULL;
    if (!(r & KVE_READS_QUERIES))
        d.queries = NULL;
    if (!(r & KVE_READS_VALUES))
        d.values = NULL;
    return kve_policy_step_data(p, pos, &d);
}

#endif /* KVE_FACTS_H */
