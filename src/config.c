/* SPDX-License-Identifier: MIT */
/*
 * config.c - a spec parsed once into the configuration every head shares:
 * the type, its parameters, the canonical spec and the column layout.
 *
 * Invariant: a kve_config that kve__config_parse returned KVE_OK for has
 * passed every check of its type (ranges, recent_window < budget,
 * sinks < budget, the page reserve of pages.c), so construction and the
 * decode path never re-validate parameters; it holds its type (a score
 * rule registered at run time cannot go away under it) until released or
 * handed to an object. Parsing never allocates.
 */
#include "policy_impl.h"

#include <float.h>
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

/* vnorm=2 (CriticalKV): its two keys only with it; no pages (a page is
 * evicted whole, not by two stages); a value of query_group equal parts. */
static kve_status check_critical(const kve_config *c)
{
    const kve_params *p = &c->params;
    const char *name = c->type->name;
    size_t k = 0; /* expected_attention has a vnorm and epsilon of its own */
    while (k < c->type->n_params && strcmp(c->type->params[k].key, "first_stage") != 0)
        k++;
    if (k == c->type->n_params)
        return KVE_OK;
    if (p->vnorm != 2 && (p->epsilon != KVE_CRITICAL_EPSILON || p->first_stage != 0.5))
        return kve__fail(KVE_EINVAL, "%s: epsilon and first_stage are CriticalKV's (vnorm=2); "
                         "with vnorm=%zu leave them at their defaults", name, p->vnorm);
    if (p->vnorm != 2)
        return KVE_OK;
    if (p->block > 1)
        return kve__fail(KVE_EINVAL, "%s: vnorm=2 (CriticalKV) selects positions in two stages; "
                         "pages (block %zu) are not supported with it", name, p->block);
    if (c->value_dim && c->query_group && c->value_dim % c->query_group)
        return kve__fail(KVE_EINVAL, "%s: vnorm=2 reads a value of query_group %zu parts (W_o v "
                         "of each query head), but value_dim %zu is not a multiple of it", name,
                         c->query_group, c->value_dim);
    return KVE_OK;
}

/* The body of kve__config_parse once the type is held. */
static kve_status parse_held(const kve_policy_type *type, const char *name, const char *rest,
                             const char *key, const char *value, const kve_policy_options *o,
                             kve_config *c)
{
    memset(c, 0, sizeof *c);
    c->type = type;
    c->key_dim = o->key_dim;
    c->value_dim = o->value_dim;
    c->query_group = o->query_group;
    c->rope = o->rope;
    c->rope.freq_factors = NULL; /* copied (checked by kve__check_facts) */
    if (o->rope.freq_factors && o->rope.rotary_dim != KVE_ROPE_UNSET) {
        c->rope_nff = o->rope.rotary_dim / 2;
        if (c->rope_nff)
            memcpy(c->rope_ff, o->rope.freq_factors, c->rope_nff * sizeof(float));
    }
    kve_status st = kve__spec_parse(name, rest, type->params, type->n_params, &c->params);
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
            c->lane = type->lane;
    }
    if (type->flags & (KVE_TYPE_SCORED | KVE_TYPE_MARKED))
        c->elem[KVE_COL_MARK] = c->unit[KVE_COL_MARK] = sizeof(uint8_t);
    st = type->init ? type->init(c) : kve__check_recent_window(c);
    if (st != KVE_OK)
        return st;
    if ((st = check_units(c)) != KVE_OK)
        return st;
    /* vnorm: the value's norm beside every slot, and (a rule of the fused
     * pass) the rule's own score beside the product. */
    if (c->params.vnorm) {
        c->elem[KVE_COL_VNORM] = c->unit[KVE_COL_VNORM] = sizeof(double);
        if (c->lane)
            c->elem[KVE_COL_RAW] = c->unit[KVE_COL_RAW] = sizeof(double);
    }
    if (c->lane)
        c->observe = c->params.vnorm ? c->lane->vn : c->lane->fn;
    if ((type->flags & KVE_TYPE_VNORM) && (st = check_critical(c)) != KVE_OK)
        return st;
    c->reads = kve__type_reads(type) & ~(kve_reads)KVE_READS_VALUES;
    if (c->elem[KVE_COL_VNORM])
        c->reads |= KVE_READS_VALUES;
    if (c->params.query_stats) /* expected_attention: the caller's statistics, no queries */
        c->reads &= ~(kve_reads)KVE_READS_QUERIES;
    /* Pages: only the scored policies and the sliding ones take a block. */
    c->evict = type->evict;
    if ((type->flags & KVE_TYPE_VNORM) && c->params.vnorm == 2) {
        c->evict = kve__evict_critical; /* stage one's heap: budget entries a head */
        c->aux_bytes = c->params.budget * sizeof(kve__top_entry);
    }
    if (c->params.block > 1) {
        c->evict = (type->flags & KVE_TYPE_SCORED) ? kve__evict_pages : kve__sliding_evict_pages;
        if ((st = kve__check_pages(c, c->params.budget)) != KVE_OK)
            return st;
    }
    for (int k = 0; k < KVE_NCOLS; k++)
        c->slot_bytes += c->elem[k];
    c->cap0 = type->cap_for_budget ? type->cap_for_budget(c->params.budget) : c->params.budget + 1;
    size_t len = kve__spec_format(c->spec, sizeof c->spec, type->name, type->params,
                                  type->n_params, &c->params);
    if (len >= sizeof c->spec) /* never for the built-in tables (tests/test_spec.c) */
        return kve__fail(KVE_EINVAL, "%s: the canonical spec needs %zu bytes, more than "
                         "KVE_SPEC_MAX", name, len + 1);
    return KVE_OK;
}

kve_status kve__config_parse(const char *spec, const char *key, const char *value,
                             const kve_policy_options *o, kve_config *c)
{
    char name[KVE_NAME_MAX];
    const char *rest = NULL;
    kve_status st = kve__spec_split(spec, name, &rest);
    if (st != KVE_OK)
        return st;
    const kve_policy_type *type = kve__policy_type_find(name);
    if (!type)
        return unknown_policy(name);
    const kve_policy_options none = kve_policy_default_options();
    st = parse_held(type, name, rest, key, value, o ? o : &none, c);
    if (st != KVE_OK)
        kve__type_release(type);
    return st;
}

/* The model facts of options, on their own. */
/* The scaling fields of kve_rope within the header's limits; zeros read
 * as the defaults. */
static kve_status check_rope_scaling(const kve_rope *r)
{
    if (r->scaling != KVE_ROPE_SCALING_NONE && r->scaling != KVE_ROPE_SCALING_LINEAR &&
        r->scaling != KVE_ROPE_SCALING_LLAMA3 && r->scaling != KVE_ROPE_SCALING_YARN)
        return kve__fail(KVE_EINVAL, "rope: scaling %d is not a kve_rope_scaling",
                         (int)r->scaling);
    if (r->factor != 0.0 && !(r->factor >= 1.0 && r->factor <= DBL_MAX))
        return kve__fail(KVE_EINVAL, "rope: factor %g must be finite and at least 1 (0: 1)",
                         r->factor);
    const struct {
        const char *name;
        double v;
    } positive[] = {{"low_freq_factor", r->low_freq_factor},
                    {"high_freq_factor", r->high_freq_factor},
                    {"beta_fast", r->beta_fast},
                    {"beta_slow", r->beta_slow}};
    for (size_t k = 0; k < sizeof positive / sizeof positive[0]; k++)
        if (!(positive[k].v >= 0.0 && positive[k].v <= DBL_MAX))
            return kve__fail(KVE_EINVAL, "rope: %s %g must be finite and above 0 (0: the "
                             "default)", positive[k].name, positive[k].v);
    if (!(r->attention_factor >= 0.0 && r->attention_factor <= DBL_MAX))
        return kve__fail(KVE_EINVAL, "rope: attention_factor %g must be finite and at least 0 "
                         "(0: derived)", r->attention_factor);
    if (r->original_max_position > (size_t)INT32_MAX)
        return kve__fail(KVE_EINVAL, "rope: original_max_position %zu is above 2^31 - 1",
                         r->original_max_position);
    const kve_rope e = kve__rope_effective(r);
    const bool needs_l =
        r->scaling == KVE_ROPE_SCALING_LLAMA3 || r->scaling == KVE_ROPE_SCALING_YARN;
    if (needs_l && r->original_max_position == 0)
        return kve__fail(KVE_EINVAL, "rope: original_max_position 0 (unset): scaling %s needs "
                         "the model's original_max_position_embeddings",
                         r->scaling == KVE_ROPE_SCALING_YARN ? "yarn" : "llama3");
    if (r->scaling == KVE_ROPE_SCALING_LLAMA3 && !(e.low_freq_factor < e.high_freq_factor))
        return kve__fail(KVE_EINVAL, "rope: llama3 low_freq_factor %g must be below "
                         "high_freq_factor %g", e.low_freq_factor, e.high_freq_factor);
    if (r->scaling == KVE_ROPE_SCALING_YARN && e.beta_slow > e.beta_fast)
        return kve__fail(KVE_EINVAL, "rope: yarn beta_slow %g must be at most beta_fast %g",
                         e.beta_slow, e.beta_fast);
    if (r->scaling == KVE_ROPE_SCALING_YARN && !(r->base > 1.0))
        return kve__fail(KVE_EINVAL, "rope: yarn needs base above 1, not %g", r->base);
    return KVE_OK;
}

kve_status kve__check_facts(const kve_policy_options *o)
{
    if (o->key_dim > KVE_MAX_KEY_DIM)
        return kve__fail(KVE_EINVAL, "key_dim %zu is above the largest, %d", o->key_dim,
                         KVE_MAX_KEY_DIM);
    if (o->value_dim > KVE_MAX_KEY_DIM)
        return kve__fail(KVE_EINVAL, "value_dim %zu is above the largest, %d", o->value_dim,
                         KVE_MAX_KEY_DIM);
    if (o->query_group == 0 || o->query_group > KVE_MAX_QUERY_GROUP)
        return kve__fail(KVE_EINVAL, "query_group %zu is not in 1 .. %d", o->query_group,
                         KVE_MAX_QUERY_GROUP);
    const kve_rope *r = &o->rope;
    if (r->rotary_dim != KVE_ROPE_UNSET && (r->rotary_dim % 2 || r->rotary_dim > o->key_dim))
        return kve__fail(KVE_EINVAL, "rope: rotary_dim %zu must be even and at most key_dim %zu",
                         r->rotary_dim, o->key_dim);
    if (!(r->base > 0.0 && r->base <= DBL_MAX))
        return kve__fail(KVE_EINVAL, "rope: base %g must be finite and above 0", r->base);
    if (r->pairs != KVE_ROPE_ADJACENT && r->pairs != KVE_ROPE_HALF)
        return kve__fail(KVE_EINVAL, "rope: pairs %d is not a kve_rope_pairs", (int)r->pairs);
    if (r->freq_factors) {
        if (r->rotary_dim == KVE_ROPE_UNSET || r->rotary_dim / 2 > KVE_ROPE_MAX_FACTORS)
            return kve__fail(KVE_EINVAL, "rope: freq_factors need a rotary_dim of at most %d, "
                             "not %s", 2 * KVE_ROPE_MAX_FACTORS,
                             r->rotary_dim == KVE_ROPE_UNSET ? "unset" : "more");
        if (r->scaling == KVE_ROPE_SCALING_LLAMA3)
            return kve__fail(KVE_EINVAL, "rope: freq_factors with scaling llama3: the factors are "
                             "llama3's already (give one or the other)");
        for (size_t j = 0; j < r->rotary_dim / 2; j++)
            if (!(r->freq_factors[j] > 0.0f && r->freq_factors[j] <= FLT_MAX))
                return kve__fail(KVE_EINVAL, "rope: freq_factors[%zu] = %g is not finite and "
                                 "above 0", j, (double)r->freq_factors[j]);
    }
    return check_rope_scaling(r);
}

kve_rope kve__rope_effective(const kve_rope *r)
{
    kve_rope e = *r;
    e.factor = e.factor == 0.0 ? 1.0 : e.factor;
    e.low_freq_factor = e.low_freq_factor == 0.0 ? 1.0 : e.low_freq_factor;
    e.high_freq_factor = e.high_freq_factor == 0.0 ? 4.0 : e.high_freq_factor;
    e.beta_fast = e.beta_fast == 0.0 ? 32.0 : e.beta_fast;
    e.beta_slow = e.beta_slow == 0.0 ? 1.0 : e.beta_slow;
    return e;
}

/* What a parsed config needs of the facts to be stepped at all. */
kve_status kve__check_needs(const kve_config *c, const kve_rng *rng)
{
    const char *name = c->type->name;
    if ((c->type->flags & KVE_TYPE_NEEDS_RNG) && !rng)
        return kve__fail(KVE_EINVAL, "%s: needs an Rng, but rng is NULL", name);
    if ((c->reads & (KVE_READS_KEYS | KVE_READS_QUERIES)) && c->key_dim == 0)
        return kve__fail(KVE_EINVAL,
                         "%s: reads keys, so key_dim must be at least 1 (build it with "
                         "kve_policy_new_ex or kve_bank_new_ex)",
                         name);
    if ((c->reads & KVE_READS_VALUES) && c->value_dim == 0)
        return kve__fail(KVE_EINVAL,
                         "%s: reads values (vnorm=1), so value_dim must be at least 1 (build it "
                         "with kve_policy_new_ex or kve_bank_new_ex)",
                         name);
    if ((c->reads & KVE_READS_QUERIES) && c->rope.rotary_dim == KVE_ROPE_UNSET)
        return kve__fail(KVE_EINVAL,
                         "%s: models queries before the rotary embedding, so the options must "
                         "say what it is (rope.rotary_dim; 0 for a model without one)",
                         name);
    return KVE_OK;
}

kve_status kve__config_new(const char *spec, const kve_rng *rng,
                           const kve_policy_options *options, const void *out, kve_config *c)
{
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    kve_policy_options o = options ? *options : kve_policy_default_options();
    if (o.unchecked != 0 && o.unchecked != 1)
        return kve__fail(KVE_EINVAL, "unchecked %d is neither 0 nor 1", o.unchecked);
    kve_status st = kve__check_facts(&o);
    if (st != KVE_OK)
        return st;
    if ((st = kve__config_parse(spec, NULL, NULL, &o, c)) != KVE_OK)
        return st;
    c->unchecked = o.unchecked == 1;
    if ((st = kve__check_needs(c, rng)) != KVE_OK)
        kve__type_release(c->type);
    return st;
}

kve_policy_options kve_policy_default_options(void)
{
    kve_policy_options o = {.allocator = NULL,
                            .key_dim = 0,
                            .value_dim = 0,
                            .query_group = 1,
                            .rope = {.rotary_dim = KVE_ROPE_UNSET,
                                     .base = 10000.0,
                                     .pairs = KVE_ROPE_ADJACENT,
                                     .scaling = KVE_ROPE_SCALING_NONE,
                                     .factor = 1.0,
                                     .low_freq_factor = 1.0,
                                     .high_freq_factor = 4.0,
                                     .original_max_position = 0,
                                     .beta_fast = 32.0,
                                     .beta_slow = 1.0,
                                     .attention_factor = 0.0,
                                     .freq_factors = NULL},
                            .unchecked = 0};
    return o;
}

kve_reads kve__type_reads(const kve_policy_type *t)
{
    kve_reads r = KVE_READS_NOTHING;
    if (t->flags & KVE_TYPE_READS_KEYS)
        r |= KVE_READS_KEYS;
    else if (t->flags & KVE_TYPE_SCORED)
        r |= KVE_READS_ATTN;
    if (t->flags & KVE_TYPE_READS_QUERIES)
        r |= KVE_READS_QUERIES;
    /* the value at the type's defaults (expected_attention's vnorm is 1) */
    for (size_t i = 0; i < t->n_params; i++)
        if (strcmp(t->params[i].key, "vnorm") == 0 && t->params[i].idefault)
            r |= KVE_READS_VALUES;
    if (t->data && kve__rule_reads_values(t))
        r |= KVE_READS_VALUES;
    return r;
}

kve_status kve_spec_with(const char *spec, const char *key, const char *value, char *out,
                         size_t cap)
{
    kve_config c;
    memset(&c, 0, sizeof c);
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    kve_status st = kve__config_parse(spec, key, value, NULL, &c);
    if (st != KVE_OK)
        return st;
    kve__type_release(c.type);
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
    kve_status st = kve__config_parse(spec, NULL, NULL, NULL, &c);
    if (st != KVE_OK)
        return st;
    kve__type_release(c.type);
    /* recent_window < budget, sinks < budget, and the page reserve */
    size_t least = c.params.recent_window + 1;
    least = c.params.sinks + 1 > least ? c.params.sinks + 1 : least;
    least = kve__page_reserve(&c) > least ? kve__page_reserve(&c) : least;
    *out = least;
    return KVE_OK;
}
