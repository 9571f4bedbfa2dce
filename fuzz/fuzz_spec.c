/* SPDX-License-Identifier: MIT */
/*
 * fuzz_spec.c - the spec grammar, through every public entry point that
 * parses one: kve_policy_new, kve_spec_with and kve_trace_open("canonical").
 *
 * Input: up to three lines, "spec\nkey\nvalue" (key and value optional; a
 * NUL byte ends the input). Checked properties:
 *   - kve_spec_with(spec) and kve_policy_new_ex(spec, with every model fact:
 *     keys of 4 floats, values of 3, 2 query heads, a rotary embedding)
 *     agree on accepting it, and refuse only with KVE_EINVAL, a non-empty
 *     one-line message, and *out untouched; kve_policy_new (no facts)
 *     accepts it too, unless the policy reads keys, queries or values;
 *   - an accepted spec has a canonical form that is a fixed point
 *     (canonical(canonical(s)) == canonical(s)), is what kve_policy_spec
 *     reports, and builds a policy with the same spec;
 *   - kve_spec_with refuses a buffer one byte short with KVE_ERANGE and does
 *     not write to it;
 *   - kve_spec_with(spec, key, value) either refuses or yields a spec that is
 *     itself canonical;
 *   - "canonical:<params>" (the spec's own text when it names the canonical
 *     trace, else its parameter text) opens or is refused cleanly; an opened
 *     trace reopens from its source to the same rows, and its rows are
 *     distributions (finite, >= 0, summing to 1 within 1e-3).
 * Large budgets or steps are only parsed, not built, so one input stays fast.
 */
#include "kvevict_eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { TEXT_MAX = 512, SPEC_CAP = 512, MAX_BUILD_BUDGET = 1 << 16, MAX_ROW = 1024 };

#define CHECK(c)                                                                      \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "fuzz_spec: CHECK(%s) failed at line %d (last error: %s)\n", #c, \
                    __LINE__, kve_last_error());                                      \
            abort();                                                                  \
        }                                                                             \
    } while (0)

static void check_refusal(kve_status st)
{
    CHECK(st == KVE_EINVAL);
    const char *msg = kve_last_error();
    CHECK(msg[0] != '\0');
    CHECK(strchr(msg, '\n') == NULL);
}

/* The budget=N value of a canonical policy spec (every policy spells it). */
static size_t canonical_budget(const char *canon)
{
    const char *b = strstr(canon, "budget=");
    CHECK(b != NULL);
    return (size_t)strtoull(b + 7, NULL, 10);
}

/* Options with every model fact a policy may need. */
static kve_policy_options facts(void)
{
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = 4;
    o.value_dim = 4; /* a multiple of query_group: vnorm=2 reads W_o v by query head */
    o.query_group = 2;
    o.rope.rotary_dim = 4;
    return o;
}

static void fuzz_policy(const char *spec, const char *key, const char *value)
{
    char canon[SPEC_CAP], again[SPEC_CAP];
    kve_status st = kve_spec_with(spec, NULL, NULL, canon, sizeof canon);
    if (st != KVE_OK) {
        check_refusal(st);
        kve_rng rng;
        kve_rng_seed(&rng, 1);
        kve_policy *p = (kve_policy *)&rng;
        kve_policy_options o = facts();
        check_refusal(kve_policy_new_ex(spec, &rng, &o, &p));
        CHECK(p == (kve_policy *)&rng);
    } else {
        size_t len = strlen(canon);
        CHECK(kve_spec_with(canon, NULL, NULL, again, sizeof again) == KVE_OK);
        CHECK(strcmp(canon, again) == 0);
        memset(again, 0x5a, sizeof again);
        CHECK(kve_spec_with(spec, NULL, NULL, again, len) == KVE_ERANGE);
        for (size_t i = 0; i < sizeof again; i++)
            CHECK((unsigned char)again[i] == 0x5a);
        if (canonical_budget(canon) <= MAX_BUILD_BUDGET) {
            kve_rng rng;
            kve_rng_seed(&rng, 7);
            kve_policy *p = NULL, *q = NULL;
            kve_policy_options o = facts();
            CHECK(kve_policy_new_ex(spec, &rng, &o, &p) == KVE_OK);
            CHECK(strcmp(kve_policy_spec(p), canon) == 0);
            CHECK(kve_policy_size(p) == 0);
            st = kve_policy_new(canon, &rng, &q);
            if (kve_policy_reads(p) & (KVE_READS_KEYS | KVE_READS_QUERIES | KVE_READS_VALUES)) {
                check_refusal(st); /* no facts */
                st = kve_policy_new_ex(canon, &rng, &o, &q);
            }
            CHECK(st == KVE_OK);
            CHECK(strcmp(kve_policy_spec(q), canon) == 0);
            CHECK(kve_policy_state_bytes(p) == kve_policy_state_bytes(q));
            kve_policy_free(p);
            kve_policy_free(q);
        }
    }
    if (key) {
        char out[SPEC_CAP];
        st = kve_spec_with(spec, key, value, out, sizeof out);
        if (st == KVE_OK) {
            CHECK(kve_spec_with(out, NULL, NULL, again, sizeof again) == KVE_OK);
            CHECK(strcmp(out, again) == 0);
        } else {
            check_refusal(st);
        }
    }
}

static void check_row(const double *row, size_t t)
{
    double sum = 0;
    for (size_t i = 0; i <= t; i++) {
        CHECK(isfinite(row[i]) && row[i] >= 0);
        sum += row[i];
    }
    CHECK(fabs(sum - 1.0) <= 1e-3);
}

static void fuzz_trace(const char *src)
{
    kve_trace *tr = (kve_trace *)&src;
    kve_status st = kve_trace_open(src, NULL, &tr);
    if (st != KVE_OK) {
        check_refusal(st);
        CHECK(tr == (kve_trace *)&src);
        return;
    }
    CHECK(kve_trace_heads(tr) == 1 && kve_trace_layers(tr) == 1);
    size_t steps = kve_trace_steps(tr);
    CHECK(steps >= 1);
    CHECK(strncmp(kve_trace_source(tr), "canonical", 9) == 0);
    kve_trace *tr2 = NULL;
    CHECK(kve_trace_open(kve_trace_source(tr), NULL, &tr2) == KVE_OK);
    CHECK(strcmp(kve_trace_source(tr), kve_trace_source(tr2)) == 0);
    CHECK(kve_trace_steps(tr2) == steps);

    static double row[MAX_ROW + 1], row2[MAX_ROW + 1];
    size_t last = steps - 1 < MAX_ROW ? steps - 1 : MAX_ROW;
    size_t ts[4] = {0, last, last / 2, last > 0 ? 1 : 0};
    for (int k = 0; k < 4; k++) {
        CHECK(kve_trace_row(tr, 0, ts[k], row, (ts[k]) + 1) == KVE_OK);
        check_row(row, ts[k]);
        CHECK(kve_trace_row(tr2, 0, ts[k], row2, (ts[k]) + 1) == KVE_OK);
        CHECK(memcmp(row, row2, (ts[k] + 1) * sizeof *row) == 0);
    }
    CHECK(kve_trace_row(tr, 1, 0, row, 1) == KVE_EINVAL);
    CHECK(kve_trace_row(tr, 0, steps, row, steps + 1) == KVE_EINVAL);
    kve_trace_free(tr);
    kve_trace_free(tr2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char text[TEXT_MAX + 1];
    size_t n = size < TEXT_MAX ? size : TEXT_MAX;
    memcpy(text, data, n);
    text[n] = '\0';
    char *lines[3] = {text, NULL, NULL};
    for (int k = 1; k < 3; k++) {
        char *nl = lines[k - 1] ? strchr(lines[k - 1], '\n') : NULL;
        if (nl) {
            *nl = '\0';
            lines[k] = nl + 1;
        }
    }
    const char *spec = lines[0];
    fuzz_policy(spec, lines[1], lines[2] ? lines[2] : "");

    /* Steps are O(1) memory, but reading rows costs O(t): keep the rows read short. */
    char src[TEXT_MAX + 16];
    if (strncmp(spec, "canonical", 9) == 0) {
        snprintf(src, sizeof src, "%s", spec);
    } else {
        const char *colon = strchr(spec, ':');
        snprintf(src, sizeof src, "canonical%s%s", colon ? ":" : "", colon ? colon + 1 : "");
    }
    if (strcmp(src, "canonical") == 0 || strncmp(src, "canonical:", 10) == 0)
        fuzz_trace(src);
    return 0;
}
