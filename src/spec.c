/* SPDX-License-Identifier: MIT */
/*
 * spec.c - the "name:key=value,..." grammar shared by policies and traces.
 *
 * Invariants:
 *  - Parsing never allocates and never reads past the terminating NUL.
 *  - Every refusal names the key (or the name) and quotes the offending text,
 *    truncated to a readable length.
 *  - kve__spec_format prints reals in the shortest form that strtod reads
 *    back to the same double, so a canonical spec round-trips exactly.
 * Cost: O(length of the spec x number of defs).
 */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { QUOTE_MAX = 40 }; /* characters of user text quoted in a message */

static int quote_len(size_t len)
{
    return (int)(len < QUOTE_MAX ? len : QUOTE_MAX);
}

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

kve_status kve__spec_split(const char *spec, char name[KVE_NAME_MAX], const char **params)
{
    if (!spec)
        return kve__fail(KVE_EINVAL, "spec is NULL");
    size_t len = strcspn(spec, ":");
    if (len == 0)
        return kve__fail(KVE_EINVAL, "spec \"%.*s\" has no name before ':'",
                         quote_len(strlen(spec)), spec);
    if (len >= KVE_NAME_MAX)
        return kve__fail(KVE_EINVAL, "spec name \"%.*s...\" is longer than %d characters",
                         quote_len(len), spec, KVE_NAME_MAX - 1);
    for (size_t i = 0; i < len; i++)
        if (!is_name_char(spec[i]))
            return kve__fail(KVE_EINVAL, "spec name \"%.*s\" has an invalid character at offset %zu",
                             quote_len(len), spec, i);
    memcpy(name, spec, len);
    name[len] = '\0';
    *params = spec[len] == ':' ? spec + len + 1 : NULL;
    return KVE_OK;
}

static void store_default(const kve_param_def *d, void *dst)
{
    char *field = (char *)dst + d->offset;
    switch (d->kind) {
    case KVE_PARAM_SIZE: {
        size_t v = (size_t)d->idefault;
        memcpy(field, &v, sizeof v);
        break;
    }
    case KVE_PARAM_U64: memcpy(field, &d->idefault, sizeof d->idefault); break;
    case KVE_PARAM_REAL: memcpy(field, &d->rdefault, sizeof d->rdefault); break;
    }
}

static kve_status parse_integer(const char *what, const kve_param_def *d, const char *text,
                                size_t len, uint64_t *out)
{
    if (len == 0)
        return kve__fail(KVE_EINVAL, "%s: %s has an empty value", what, d->key);
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c < '0' || c > '9')
            return kve__fail(KVE_EINVAL, "%s: %s=\"%.*s\" is not a non-negative integer", what,
                             d->key, quote_len(len), text);
        unsigned digit = (unsigned)(c - '0');
        if (v > (UINT64_MAX - digit) / 10)
            return kve__fail(KVE_EINVAL, "%s: %s=\"%.*s\" is out of range [%llu, %llu]", what,
                             d->key, quote_len(len), text, (unsigned long long)d->imin,
                             (unsigned long long)d->imax);
        v = v * 10 + digit;
    }
    if (v < d->imin || v > d->imax)
        return kve__fail(KVE_EINVAL, "%s: %s=%llu is out of range [%llu, %llu]", what, d->key,
                         (unsigned long long)v, (unsigned long long)d->imin,
                         (unsigned long long)d->imax);
    *out = v;
    return KVE_OK;
}

static kve_status parse_real(const char *what, const kve_param_def *d, const char *text,
                             size_t len, double *out)
{
    char buf[64];
    if (len == 0)
        return kve__fail(KVE_EINVAL, "%s: %s has an empty value", what, d->key);
    /* Only plain decimal notation: no white space, hex, inf or nan. */
    bool ok = len < sizeof buf;
    for (size_t i = 0; ok && i < len; i++)
        ok = strchr("0123456789.eE+-", text[i]) != NULL;
    if (ok) {
        memcpy(buf, text, len);
        buf[len] = '\0';
        char *end = NULL;
        errno = 0;
        double v = strtod(buf, &end);
        ok = end == buf + len;
        if (ok && (errno == ERANGE || !isfinite(v)))
            return kve__fail(KVE_EINVAL, "%s: %s=%.*s is too %s for a double", what, d->key,
                             quote_len(len), text, fabs(v) < 1.0 ? "small" : "large");
        if (ok) {
            bool low = (d->flags & KVE_PARAM_MIN_OPEN) ? !(v > d->rmin) : !(v >= d->rmin);
            if (low || !(v <= d->rmax))
                return kve__fail(KVE_EINVAL, "%s: %s=%.*s is out of range %c%g, %g]", what,
                                 d->key, quote_len(len), text,
                                 (d->flags & KVE_PARAM_MIN_OPEN) ? '(' : '[', d->rmin, d->rmax);
            *out = v;
            return KVE_OK;
        }
    }
    return kve__fail(KVE_EINVAL, "%s: %s=\"%.*s\" is not a finite decimal number", what, d->key,
                     quote_len(len), text);
}

kve_status kve__spec_parse_value(const char *what, const kve_param_def *d, const char *text,
                                 size_t len, void *dst)
{
    char *field = (char *)dst + d->offset;
    kve_status st;
    if (d->kind == KVE_PARAM_REAL) {
        double v = 0;
        if ((st = parse_real(what, d, text, len, &v)) != KVE_OK)
            return st;
        memcpy(field, &v, sizeof v);
        return KVE_OK;
    }
    uint64_t v = 0;
    if ((st = parse_integer(what, d, text, len, &v)) != KVE_OK)
        return st;
    if (d->kind == KVE_PARAM_SIZE) {
        size_t z = (size_t)v;
        memcpy(field, &z, sizeof z);
    } else {
        memcpy(field, &v, sizeof v);
    }
    return KVE_OK;
}

kve_status kve__spec_parse(const char *what, const char *params, const kve_param_def *defs,
                           size_t n_defs, void *dst)
{
    uint64_t seen = 0; /* bit i: defs[i] was given */
    for (size_t i = 0; i < n_defs; i++)
        store_default(&defs[i], dst);
    if (!params)
        return KVE_OK;
    if (*params == '\0')
        return kve__fail(KVE_EINVAL, "%s: nothing follows ':'", what);
    const char *p = params;
    for (;;) {
        size_t item = strcspn(p, ",");
        size_t key_len = strcspn(p, "=,");
        if (item == 0)
            return kve__fail(KVE_EINVAL, "%s: empty parameter in \"%.*s\"", what,
                             quote_len(strlen(params)), params);
        if (key_len == item)
            return kve__fail(KVE_EINVAL, "%s: parameter \"%.*s\" has no '='", what,
                             quote_len(item), p);
        size_t d = 0;
        while (d < n_defs && !(strlen(defs[d].key) == key_len && !memcmp(defs[d].key, p, key_len)))
            d++;
        if (d == n_defs)
            return kve__fail(KVE_EINVAL, "%s: unknown key \"%.*s\"", what, quote_len(key_len), p);
        if (seen & ((uint64_t)1 << d))
            return kve__fail(KVE_EINVAL, "%s: key %s is given twice", what, defs[d].key);
        seen |= (uint64_t)1 << d;
        kve_status st = kve__spec_parse_value(what, &defs[d], p + key_len + 1,
                                              item - key_len - 1, dst);
        if (st != KVE_OK)
            return st;
        if (p[item] == '\0')
            return KVE_OK;
        p += item + 1;
        if (*p == '\0')
            return kve__fail(KVE_EINVAL, "%s: trailing ',' in \"%.*s\"", what,
                             quote_len(strlen(params)), params);
    }
}

/* Shortest "%.*g" form of v that reads back to exactly v. */
static void format_real(char *buf, size_t cap, double v)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

size_t kve__spec_format(char *out, size_t cap, const char *name, const kve_param_def *defs,
                        size_t n_defs, const void *src)
{
    size_t len = 0, printed = 0;
    int n = snprintf(out, cap, "%s", name);
    len += n > 0 ? (size_t)n : 0;
    for (size_t i = 0; i < n_defs; i++) {
        const char *field = (const char *)src + defs[i].offset;
        char value[40];
        switch (defs[i].kind) {
        case KVE_PARAM_SIZE: {
            size_t v;
            memcpy(&v, field, sizeof v);
            if ((defs[i].flags & KVE_PARAM_OMIT_DEFAULT) && v == defs[i].idefault)
                continue;
            snprintf(value, sizeof value, "%zu", v);
            break;
        }
        case KVE_PARAM_U64: {
            uint64_t v;
            memcpy(&v, field, sizeof v);
            snprintf(value, sizeof value, "%llu", (unsigned long long)v);
            break;
        }
        case KVE_PARAM_REAL: {
            double v;
            memcpy(&v, field, sizeof v);
            if ((defs[i].flags & KVE_PARAM_OMIT_DEFAULT) && v == defs[i].rdefault)
                continue;
            format_real(value, sizeof value, v);
            break;
        }
        }
        n = snprintf(len < cap ? out + len : NULL, len < cap ? cap - len : 0, "%c%s=%s",
                     printed++ == 0 ? ':' : ',', defs[i].key, value);
        len += n > 0 ? (size_t)n : 0;
    }
    return len;
}
