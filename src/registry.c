/* SPDX-License-Identifier: MIT */
/*
 * registry.c - the fixed, ordered list of policies. The order is the order of
 * every table the tools print: ceiling first, then the policies that ignore
 * attention, then the attention-aware family, then the policies that read
 * keys.
 */
#include "policy_impl.h"

#include <string.h>

static const kve_policy_type *const types[] = {
    &kve__full_type,         &kve__window_type, &kve__streaming_type,
    &kve__random_type,       &kve__h2o_type,    &kve__scissorhands_type,
    &kve__tova_type,         &kve__h2o_decay_type, &kve__h2o_mean_type,
    &kve__knorm_type,        &kve__keydiff_type,
};

enum { N_TYPES = sizeof types / sizeof types[0] };

const kve_policy_type *kve__policy_type_find(const char *name)
{
    for (size_t i = 0; i < N_TYPES; i++)
        if (strcmp(types[i]->name, name) == 0)
            return types[i];
    return NULL;
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

unsigned kve_policy_type_reads(size_t i)
{
    return i < N_TYPES ? kve__type_reads(types[i]) : 0;
}
