/* SPDX-License-Identifier: MIT */
/*
 * registry.c - the fixed, ordered list of built-in policies: policies/list.h,
 * one line a policy, expanded into the table below (its order is the order
 * of every table the tools print); then, for a name not among them, the
 * score rules registered at run time (rules.c). A type found is held until
 * released: a no-op for a built-in one, a count for a registered rule.
 */
#include "policy_impl.h"

#include <string.h>

static const kve_policy_type *const types[] = {
#define KVE_POLICY(name) &kve__##name##_type,
#include "policies/list.h"
#undef KVE_POLICY
};

enum { N_TYPES = sizeof types / sizeof types[0] };

const kve_policy_type *kve__builtin_type(const char *name)
{
    for (size_t i = 0; i < N_TYPES; i++)
        if (strcmp(types[i]->name, name) == 0)
            return types[i];
    return NULL;
}

const kve_policy_type *kve__policy_type_find(const char *name)
{
    const kve_policy_type *t = kve__builtin_type(name);
    return t ? t : kve__rule_find(name);
}

void kve__type_release(const kve_policy_type *t)
{
    if (t && t->data)
        kve__rule_release(t);
}

void kve__type_hold(const kve_policy_type *t)
{
    if (t && t->data)
        kve__rule_hold(t);
}

size_t kve_policy_type_count(void)
{
    return N_TYPES;
}

const char *kve_policy_type_name(size_t i)
{
    return i < N_TYPES ? types[i]->name : NULL;
}

const char *kve_policy_type_summary(size_t i)
{
    return i < N_TYPES ? types[i]->summary : NULL;
}

kve_reads kve_policy_type_reads(size_t i)
{
    return i < N_TYPES ? kve__type_reads(types[i]) : KVE_READS_NOTHING;
}
