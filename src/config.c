/* SPDX-License-Identifier: MIT */
/*
 * config.c - a spec parsed once into the configuration every head shares:
 * the type, its parameters, the canonical spec and the column layout.
 *
 * Invariant: a kve_config that kve__config_parse returned KVE_OK for has
 * passed every check of its type (ranges, recent_window < budget,
 * sinks < budget, the page reserve of pages.c), so construction and the
 * decode path never re-validate parameters. Parsing never allocates.
 */
#include "policy_impl.h"

#include <stdio.h>
#include <string.h>

static kve_status unknown_policy(const char *name)
{
    char known[160] = "";
    for (size_t i = 0; i < kve_policy_type_count(); i++) {
        size_t len = strlen(known);
        snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", kve_policy_type_name(i));
    }
    return kve__fail(KVE_EINVAL, "unknown policy \"%s\" (known: %s)", name, known);
}

/* Every policy column is made of scalars an image can write: a column of
 * 1, 2, 4 or 8 bytes a slot with no unit declared is one scalar; any other
 * must have been declared with kve__column (a type's mistake, caught by
 * the first construction of its policy). */
static kve_status check_units(kve_config *c)
{
    for (int k = KVE_COL_EXTRA0; k <= KVE_COL_EXTRA1; k++) {
        size_t e = c->elem[k], u = c->unit[k];
        if (e && !u && (e == 1 || e == 2 || e == 4 || e == 8))
            c->unit[k] = u = e;
        if (e && !((u == 1 || u == 2 || u == 4 || u == 8) && e % u == 0))
            return kve__fail(KVE_EINVAL,
                             "%s: policy column %d of %zu bytes a slot declares no scalar size "
                             "(kve__column)",
                             c->type->name, k - KVE_COL_EXTRA0, e);
    }
    return KVE_OK;
}

kve_status kve__config_parse(const char *spec, const char *key, const char *value,
                             size_t key_dim, kve_config *c)
{
    char name[KVE_NAME_MAX];
    const char *rest = NULL;
    kve_status st = kve__spec_split(spec, name, &rest);
    if (st != KVE_OK)
        return st;
    const kve_policy_type *type = kve__policy_type_find(name);
    if (!type)
        return unknown_policy(name);
    memset(c, 0, sizeof *c);
    c->type = type;
    c->key_dim = key_dim;
    st = kve__spec_parse(name, rest, type->params, type->n_params, &c->params);
    if (st != KVE_OK)
        return st;
    if (key) {
        size_t d = 0;
        while (d < type->n_params && strcmp(type->params[d].key, key) != 0)
            d++;
        if (d == type->n_params)
            return kve__fail(KVE_EINVAL, "%s: unknown key \"%s\"", name, key);
        if (!value)
            return kve__fail(KVE_EINVAL, "%s: value for %s is NULL", name, key);
        st = kve__spec_parse_value(name, &type->params[d], value, strlen(value), &c->params);
        if (st != KVE_OK)
            return st;
    }

    /* The column layout; init may add extra columns or choose another rule. */
    c->elem[KVE_COL_POS] = c->unit[KVE_COL_POS] = sizeof(int32_t);
    if (type->flags & KVE_TYPE_SCORED) {
        c->elem[KVE_COL_SCORE] = c->unit[KVE_COL_SCORE] = sizeof(double);
        if (!(type->flags & KVE_TYPE_READS_KEYS))
            c->observe = type->observe;
    }
    if (type->flags & (KVE_TYPE_SCORED | KVE_TYPE_MARKED))
        c->elem[KVE_COL_MARK] = c->unit[KVE_COL_MARK] = sizeof(uint8_t);
    st = type->init ? type->init(c) : kve__check_recent_window(c);
    if (st != KVE_OK)
        return st;
    if ((st = check_units(c)) != KVE_OK)
        return st;
    /* Pages: only the scored policies and the sliding ones take a block. */
    c->evict = type->evict;
    if (c->params.block > 1) {
        c->evict = (type->flags & KVE_TYPE_SCORED) ? kve__evict_pages : kve__sliding_evict_pages;
        if ((st = kve__check_pages(c, c->params.budget)) != KVE_OK)
            return st;
    }
    for (int k = 0; k < KVE_NCOLS; k++)
        c->slot_bytes += c->elem[k];
    c->cap0 = type->cap_for_budget ? type->cap_for_budget(c->params.budget) : c->params.budget + 1;
    kve__spec_format(c->spec, sizeof c->spec, type->name, type->params, type->n_params,
                     &c->params);
    return KVE_OK;
}

kve_status kve__config_new(const char *spec, const kve_rng *rng,
                           const kve_policy_options *options, const void *out, kve_config *c)
{
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    kve_policy_options o = options ? *options : kve_policy_default_options();
    if (o.key_dim > KVE_MAX_KEY_DIM)
        return kve__fail(KVE_EINVAL, "key_dim %zu is above the largest, %d", o.key_dim,
                         KVE_MAX_KEY_DIM);
    kve_status st = kve__config_parse(spec, NULL, NULL, o.key_dim, c);
    if (st != KVE_OK)
        return st;
    if ((c->type->flags & KVE_TYPE_NEEDS_RNG) && !rng)
        return kve__fail(KVE_EINVAL, "%s: needs an Rng, but rng is NULL", c->type->name);
    if ((c->type->flags & KVE_TYPE_READS_KEYS) && o.key_dim == 0)
        return kve__fail(KVE_EINVAL,
                         "%s: reads keys, so key_dim must be at least 1 (build it with "
                         "kve_policy_new_ex or kve_bank_new_ex)",
                         c->type->name);
    return KVE_OK;
}

kve_policy_options kve_policy_default_options(void)
{
    kve_policy_options o = {.allocator = NULL, .key_dim = 0};
    return o;
}

kve_reads kve__type_reads(const kve_policy_type *t)
{
    if (t->flags & KVE_TYPE_READS_KEYS)
        return KVE_READS_KEYS;
    return (t->flags & KVE_TYPE_SCORED) ? KVE_READS_ATTN : KVE_READS_NOTHING;
}

kve_status kve_spec_with(const char *spec, const char *key, const char *value, char *out,
                         size_t cap)
{
    kve_config c;
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    kve_status st = kve__config_parse(spec, key, value, 0, &c);
    if (st != KVE_OK)
        return st;
    size_t len = strlen(c.spec);
    if (len >= cap)
        return kve__fail(KVE_ERANGE, "canonical spec needs %zu bytes, out holds %zu", len + 1, cap);
    memcpy(out, c.spec, len + 1);
    return KVE_OK;
}

kve_status kve_spec_min_budget(const char *spec, size_t *out)
{
    kve_config c;
    memset(&c, 0, sizeof c);
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    kve_status st = kve__config_parse(spec, NULL, NULL, 0, &c);
    if (st != KVE_OK)
        return st;
    /* recent_window < budget, sinks < budget, and the page reserve */
    size_t least = c.params.recent_window + 1;
    least = c.params.sinks + 1 > least ? c.params.sinks + 1 : least;
    least = kve__page_reserve(&c) > least ? kve__page_reserve(&c) : least;
    *out = least;
    return KVE_OK;
}
