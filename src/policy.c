/* SPDX-License-Identifier: MIT */
/*
 * policy.c - the public policy API: construction, validation, storage.
 *
 * Every public entry point validates its arguments completely before it
 * mutates anything, so a refusal leaves the policy exactly as it was. The
 * policy-specific work (score update, victim choice) sits behind the type's
 * function table and only ever sees validated input.
 *
 * Memory: one calloc for the handle, one allocation per column. Columns are
 * sized to cap_for_budget(budget) slots (budget + 1 by default: the steady
 * state of step-then-evict) and grow only when the caller steps past that
 * without evicting.
 */
#include "policy_impl.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- storage ---- */

static size_t column_bytes_per_slot(const kve_policy *p)
{
    size_t bytes = sizeof(int32_t);
    if (p->type->flags & KVE_TYPE_SCORED)
        bytes += sizeof(double);
    if (p->type->flags & (KVE_TYPE_SCORED | KVE_TYPE_MARKED))
        bytes += sizeof(uint8_t);
    for (int i = 0; i < KVE_MAX_EXTRA; i++)
        bytes += p->extra_elem[i];
    return bytes;
}

kve_status kve__policy_resize(kve_policy *p, size_t new_cap)
{
    bool scored = (p->type->flags & KVE_TYPE_SCORED) != 0;
    bool marked = (p->type->flags & (KVE_TYPE_SCORED | KVE_TYPE_MARKED)) != 0;
    if (new_cap < p->size || new_cap > SIZE_MAX / 16)
        return kve__fail(KVE_ENOMEM, "%s: cannot hold %zu positions", p->type->name, new_cap);

    /* Allocate every new column before touching the old ones: all or nothing. */
    int32_t *pos = kve__malloc(new_cap * sizeof *pos);
    double *score = scored ? kve__malloc(new_cap * sizeof *score) : NULL;
    uint8_t *mark = marked ? kve__calloc(new_cap, sizeof *mark) : NULL;
    void *extra[KVE_MAX_EXTRA] = {0};
    bool ok = pos && (!scored || score) && (!marked || mark);
    for (int i = 0; ok && i < KVE_MAX_EXTRA; i++)
        if (p->extra_elem[i])
            ok = (extra[i] = kve__malloc(new_cap * p->extra_elem[i])) != NULL;
    if (!ok) {
        kve__free(pos);
        kve__free(score);
        kve__free(mark);
        for (int i = 0; i < KVE_MAX_EXTRA; i++)
            kve__free(extra[i]);
        return kve__fail(KVE_ENOMEM, "%s: out of memory for %zu slots", p->type->name, new_cap);
    }

    size_t n = p->size;
    if (n) {
        memcpy(pos, p->pos, n * sizeof *pos);
        if (scored)
            memcpy(score, p->score, n * sizeof *score);
        for (int i = 0; i < KVE_MAX_EXTRA; i++)
            if (p->extra_elem[i])
                memcpy(extra[i], p->extra[i], n * p->extra_elem[i]);
    }
    kve__free(p->pos ? p->pos - p->offset : NULL);
    kve__free(p->score);
    kve__free(p->mark);
    for (int i = 0; i < KVE_MAX_EXTRA; i++)
        kve__free(p->extra[i]);
    p->pos = pos;
    p->score = score;
    p->mark = mark;
    memcpy(p->extra, extra, sizeof extra);
    p->offset = 0;
    p->cap = new_cap;
    return KVE_OK;
}

/* Makes room for one more position by doubling. */
static kve_status reserve_one(kve_policy *p)
{
    if (p->size < p->cap)
        return KVE_OK;
    return kve__policy_resize(p, p->cap * 2);
}

/* ---- parsing ---- */

/* Parses `spec` into a type and params, with `key` (if any) set to `value`,
 * then runs the type's cross-parameter checks on `shell`, a handle with no
 * storage. */
static kve_status parse_spec(const char *spec, const char *key, const char *value,
                             kve_policy *shell)
{
    char name[KVE_NAME_MAX];
    const char *rest = NULL;
    kve_status st = kve__spec_split(spec, name, &rest);
    if (st != KVE_OK)
        return st;
    const kve_policy_type *type = kve__policy_type_find(name);
    if (!type) {
        char known[160] = "";
        for (size_t i = 0; i < kve_policy_type_count(); i++) {
            size_t len = strlen(known);
            snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "",
                     kve_policy_type_name(i));
        }
        return kve__fail(KVE_EINVAL, "unknown policy \"%s\" (known: %s)", name, known);
    }
    memset(shell, 0, sizeof *shell);
    shell->type = type;
    st = kve__spec_parse(name, rest, type->params, type->n_params, &shell->params);
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
        st = kve__spec_parse_value(name, &type->params[d], value, strlen(value), &shell->params);
        if (st != KVE_OK)
            return st;
    }
    st = type->init ? type->init(shell) : kve__check_recent_window(shell);
    if (st != KVE_OK)
        return st;
    kve__spec_format(shell->spec, sizeof shell->spec, type->name, type->params, type->n_params,
                     &shell->params);
    return KVE_OK;
}

kve_status kve_spec_with(const char *spec, const char *key, const char *value, char *out,
                         size_t cap)
{
    kve_policy shell;
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    kve_status st = parse_spec(spec, key, value, &shell);
    if (st != KVE_OK)
        return st;
    size_t len = strlen(shell.spec);
    if (len >= cap)
        return kve__fail(KVE_ERANGE, "canonical spec needs %zu bytes, out holds %zu", len + 1,
                         cap);
    memcpy(out, shell.spec, len + 1);
    return KVE_OK;
}

/* ---- construction ---- */

kve_status kve_policy_new(const char *spec, kve_rng *rng, kve_policy **out)
{
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    kve_policy shell;
    kve_status st = parse_spec(spec, NULL, NULL, &shell);
    if (st != KVE_OK)
        return st;
    if ((shell.type->flags & KVE_TYPE_NEEDS_RNG) && !rng)
        return kve__fail(KVE_EINVAL, "%s: needs an Rng, but rng is NULL", shell.type->name);

    kve_policy *p = kve__malloc(sizeof *p);
    if (!p)
        return kve__fail(KVE_ENOMEM, "%s: out of memory for the handle", shell.type->name);
    *p = shell;
    size_t cap = p->type->cap_for_budget ? p->type->cap_for_budget(p->params.budget)
                                         : p->params.budget + 1;
    st = kve__policy_resize(p, cap);
    if (st != KVE_OK) {
        kve__free(p);
        return st;
    }
    /* Drawn last: a failed construction leaves the caller's generator as it was. */
    if (p->type->flags & KVE_TYPE_NEEDS_RNG)
        kve_rng_seed(&p->rng, kve_rng_next(rng));
    *out = p;
    return KVE_OK;
}

void kve_policy_free(kve_policy *p)
{
    if (!p)
        return;
    kve__free(p->pos ? p->pos - p->offset : NULL);
    kve__free(p->score);
    kve__free(p->mark);
    for (int i = 0; i < KVE_MAX_EXTRA; i++)
        kve__free(p->extra[i]);
    kve__free(p);
}

/* ---- decode path ---- */

static kve_status check_attention(const kve_policy *p, const float *attn, size_t n)
{
    if (n != p->size)
        return kve__fail(KVE_EINVAL, "%s: n is %zu but the policy keeps %zu positions",
                         p->type->name, n, p->size);
    /* One branch-free pass the compiler can vectorise; the offending index is
     * looked for only once the pass has found that there is one. */
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= !((attn[i] >= 0.0f) & (attn[i] <= FLT_MAX)); /* NaN, negative, infinite */
    if (!bad)
        return KVE_OK;
    size_t i = 0;
    while (attn[i] >= 0.0f && attn[i] <= FLT_MAX)
        i++;
    float a = attn[i];
    return kve__fail(KVE_EINVAL, "%s: attn[%zu] = %g is %s", p->type->name, i, (double)a,
                     isnan(a) ? "NaN" : isinf(a) ? "infinite" : "negative");
}

kve_status kve_policy_step(kve_policy *p, int32_t pos, const float *attn, size_t n)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    if (pos < 0)
        return kve__fail(KVE_EINVAL, "%s: pos %ld is negative", p->type->name, (long)pos);
    if (p->any_pos && pos <= p->last_pos)
        return kve__fail(KVE_EINVAL, "%s: pos %ld is not greater than the last position %ld",
                         p->type->name, (long)pos, (long)p->last_pos);
    kve_status st;
    if (attn && (st = check_attention(p, attn, n)) != KVE_OK)
        return st;
    st = p->type->reserve ? p->type->reserve(p) : reserve_one(p);
    if (st != KVE_OK)
        return st;

    if (attn) {
        p->observed++;
        if (p->type->observe)
            p->type->observe(p, attn, n);
    }
    size_t i = p->size++;
    p->pos[i] = pos;
    if (p->score)
        p->score[i] = 0.0;
    if (p->type->admit)
        p->type->admit(p, i);
    p->last_pos = pos;
    p->any_pos = true;
    return KVE_OK;
}

kve_status kve_policy_evict(kve_policy *p, size_t budget, int32_t *victims, size_t cap,
                            size_t *n_victims)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    const char *name = p->type->name;
    if (budget == 0)
        return kve__fail(KVE_EINVAL, "%s: budget must be at least 1", name);
    if (p->params.recent_window && budget <= p->params.recent_window)
        return kve__fail(KVE_EINVAL,
                         "%s: budget %zu must be greater than recent_window %zu", name, budget,
                         p->params.recent_window);
    if (p->params.sinks && budget <= p->params.sinks)
        return kve__fail(KVE_EINVAL, "%s: budget %zu must be greater than sinks %zu", name,
                         budget, p->params.sinks);
    if (!victims && cap)
        return kve__fail(KVE_EINVAL, "%s: victims is NULL but cap is %zu", name, cap);
    size_t need = 0;
    if (!(p->type->flags & KVE_TYPE_NEVER_EVICTS) && p->size > budget)
        need = p->size - budget;
    if (need > cap)
        return kve__fail(KVE_ERANGE, "%s: %zu victims to report but cap is %zu", name, need, cap);
    if (need) {
        if (p->type->evict)
            p->type->evict(p, need, victims);
        else
            kve__evict_marked(p, need, victims);
    }
    if (n_victims)
        *n_victims = need;
    return KVE_OK;
}

/* ---- accessors ---- */

size_t kve_policy_size(const kve_policy *p)
{
    return p ? p->size : 0;
}

const int32_t *kve_policy_positions(const kve_policy *p)
{
    return p ? p->pos : NULL;
}

size_t kve_policy_state_bytes(const kve_policy *p)
{
    return p ? p->cap * column_bytes_per_slot(p) : 0;
}

const char *kve_policy_spec(const kve_policy *p)
{
    return p ? p->spec : NULL;
}

const char *kve_policy_name(const kve_policy *p)
{
    return p ? p->type->name : NULL;
}

size_t kve_policy_budget(const kve_policy *p)
{
    return p ? p->params.budget : 0;
}
