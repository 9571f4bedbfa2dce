/* SPDX-License-Identifier: MIT */
/*
 * policy.c - the public policy API: a policy is a bank of one head
 * (policy_impl.h), allocated with its head in one block, whose messages do
 * not name the head. Everything past the argument checks of this file is the
 * bank's code, so a policy and head h of a bank behave identically by
 * construction.
 *
 * Memory: one allocation for the handle and its head, one per column
 * (policy_impl.h); the columns hold cap_for_budget(budget) slots (budget + 1
 * by default: the steady state of step-then-evict) and grow only when the
 * caller steps past that without evicting.
 */
#include "policy_impl.h"

kve_status kve_policy_new_ex(const char *spec, kve_rng *rng, const kve_policy_options *options,
                            kve_policy **out)
{
    kve_config c;
    kve_status st = kve__config_new(spec, rng, options, out, &c);
    if (st != KVE_OK)
        return st;
    const kve_allocator alloc = kve__allocator(options ? options->allocator : NULL);
    return kve__policy_create(&c, rng, &alloc, out);
}

kve_status kve__policy_create(const kve_config *c, kve_rng *rng, const kve_allocator *alloc,
                              kve_policy **out)
{
    kve_policy *p = kve__alloc(alloc, sizeof *p);
    if (!p) {
        kve__type_release(c->type);
        return kve__fail(KVE_ENOMEM, "%s: out of memory for the handle", c->type->name);
    }
    kve_frame f; /* its allocator runs: a call into the half-built policy is refused */
    kve__enter_new(&f, &p->bank, c->type->name, true);
    kve_status st = kve__bank_init(&p->bank, c, alloc, 1, &p->head, NULL, NULL, rng);
    if (st != KVE_OK)
        kve__dealloc(alloc, p, sizeof *p);
    kve__leave(&f);
    if (st != KVE_OK) {
        kve__type_release(c->type);
        return st;
    }
    p->bank.is_policy = true;
    p->bank.handle_bytes = sizeof *p;
    *out = p;
    return KVE_OK;
}

kve_status kve_policy_new(const char *spec, kve_rng *rng, kve_policy **out)
{
    return kve_policy_new_ex(spec, rng, NULL, out);
}

void kve_policy_free(kve_policy *p)
{
    kve_frame f; /* its allocator runs: a call into it meanwhile is refused */
    if (!p || kve__enter(&f, &p->bank, "kve_policy_free") != KVE_OK)
        return; /* from its own callback: not freed (kvevict.h) */
    const kve_allocator alloc = p->bank.alloc;
    kve__bank_release(&p->bank);
    kve__dealloc(&alloc, p, sizeof *p);
    kve__leave(&f);
}

kve_status kve_policy_step_keys(kve_policy *p, int32_t pos, const float *attn, size_t n,
                                const float *key)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    return kve__policy_step(&p->bank, pos, attn, n, key);
}

kve_status kve_policy_step(kve_policy *p, int32_t pos, const float *attn, size_t n)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    return kve__policy_step(&p->bank, pos, attn, n, NULL);
}

kve_status kve_policy_step_data(kve_policy *p, int32_t pos, const kve_step_data *data)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    const kve_step_data d = data ? *data : kve_step_default_data();
    if (d.group != 1)
        return kve__fail(KVE_EINVAL, "%s: group is %zu, but a policy reads one row (a bank "
                         "reduces groups)", p->bank.cfg.type->name, d.group);
    return kve__bank_step_data(&p->bank, 0, 1, pos, &d);
}

kve_status kve_policy_evict(kve_policy *p, size_t budget, int32_t *victims, size_t cap,
                            size_t *n_victims)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    return kve__policy_evict(&p->bank, budget, victims, cap, n_victims);
}

size_t kve_policy_size(const kve_policy *p)
{
    return p ? p->head.size : 0;
}

const int32_t *kve_policy_positions(const kve_policy *p)
{
    return p ? (const int32_t *)p->head.col[KVE_COL_POS] : NULL;
}

size_t kve_policy_state_bytes(const kve_policy *p)
{
    return kve_bank_state_bytes(p ? &p->bank : NULL);
}

const char *kve_policy_spec(const kve_policy *p)
{
    return p ? p->bank.cfg.spec : NULL;
}

const char *kve_policy_name(const kve_policy *p)
{
    return p ? p->bank.cfg.type->name : NULL;
}

size_t kve_policy_budget(const kve_policy *p)
{
    return p ? p->bank.cfg.params.budget : 0;
}

kve_reads kve_policy_reads(const kve_policy *p)
{
    return kve_bank_reads(p ? &p->bank : NULL);
}

size_t kve_policy_key_dim(const kve_policy *p)
{
    return kve_bank_key_dim(p ? &p->bank : NULL);
}
