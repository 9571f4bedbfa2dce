/* SPDX-License-Identifier: MIT */
/*
 * test_methods.c - the methods of issue 20 held to their independent
 * reference and to their contracts: expected_attention, vnorm=1 of the
 * scored policies, KVzip's prefill scores.
 *
 * The reference is tests/methods_ref.py (numpy, written from the papers and
 * kvpress), whose output tests/vectors/methods.ref this test replays without
 * Python: every step's victims must be the reference's exactly, and the
 * kept slots' scores within 1e-12 relative (the reference sums in numpy's
 * orders and averages the rotation over the future positions as dense
 * matrices; the library uses fixed orders and a closed form). Then the
 * refusals of the step's new data, the construction facts, the rescoring
 * flag, the prefill with values, and the canonical specs that vnorm leaves
 * alone. Deterministic; the seed is printed (argv[1] replays).
 */
#include "check.h"
#include "facts.h"
#include "policy_impl.h"
#include "read_file.h"

#include <stdlib.h>

enum { MAXV = 4096 };

/* ---- the reference file ---- */

static float fa[MAXV], fk[MAXV], fq[MAXV], fv[MAXV];
static double fr[MAXV];
static double worst; /* the largest relative difference of a score */
static int32_t victims[MAXV];

/* The score of slot i of a policy, through the lazy gap (policy_impl.h). */
static double slot_score(const kve_policy *p, size_t i)
{
    const kve_head *h = &p->head;
    size_t src = h->gap != KVE_NONE && i >= h->gap ? i + 1 : i;
    return ((const double *)h->col[KVE_COL_SCORE])[src];
}

/* Reads "TAG N x1 .. xN" (n < 0: the count is not on the line) into out;
 * returns the count, -1 on a malformed line. */
static long read_reals(char *line, const char *tag, long n, double *out)
{
    size_t len = strlen(tag);
    if (strncmp(line, tag, len) != 0 || line[len] != ' ')
        return -1;
    char *at = line + len, *end = NULL;
    if (n < 0) {
        n = strtol(at, &end, 10);
        if (end == at || n < 0 || n > MAXV)
            return -1;
        at = end;
    }
    for (long i = 0; i < n; i++) {
        out[i] = strtod(at, &end);
        if (end == at)
            return -1;
        at = end;
    }
    return n;
}

static long read_floats(char *line, const char *tag, long n, float *out)
{
    n = read_reals(line, tag, n, fr);
    for (long i = 0; i < n; i++)
        out[i] = (float)fr[i];
    return n;
}

/* How many whitespace-separated numbers follow the tag. */
static long count_after(const char *line)
{
    long n = 0;
    const char *s = strchr(line, ' ');
    while (s && *s) {
        while (*s == ' ')
            s++;
        if (*s)
            n++;
        while (*s && *s != ' ')
            s++;
    }
    return n;
}

typedef struct cursor {
    char *next;
    int line;
} cursor;

static char *next_line(cursor *c)
{
    if (!c->next || !*c->next)
        return NULL;
    char *s = c->next;
    char *nl = strchr(s, '\n');
    if (nl)
        *nl = '\0';
    c->next = nl ? nl + 1 : NULL;
    c->line++;
    return s;
}

#define REF_FAIL(c, ...)                                                          \
    do {                                                                          \
        fprintf(stderr, "methods.ref:%d: ", (c)->line);                          \
        CHECK_FAIL_AT(__VA_ARGS__);                                               \
    } while (0)

/* One `case` of the file: a policy stepped and evicted as the file says. */
static void replay_case(cursor *c, const char *spec, size_t *steps, size_t *scores)
{
    char *line = next_line(c);
    size_t kd = 0, vd = 0, g = 1;
    char rot[16], pairs[16];
    double base = 0;
    if (!line || sscanf(line, "facts %zu %zu %zu %15s %lf %15s", &kd, &vd, &g, rot, &base,
                        pairs) != 6)
        REF_FAIL(c, "no facts line");
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = kd;
    o.value_dim = vd;
    o.query_group = g;
    o.rope.rotary_dim = strcmp(rot, "unset") ? (size_t)atol(rot) : KVE_ROPE_UNSET;
    o.rope.base = base;
    o.rope.pairs = strcmp(pairs, "half") ? KVE_ROPE_ADJACENT : KVE_ROPE_HALF;
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new_ex(spec, NULL, &o, &p));
    char canon[KVE_SPEC_MAX];
    ASSERT_OK(kve_spec_with(spec, NULL, NULL, canon, sizeof canon));
    ASSERT_STR_EQ(kve_policy_spec(p), canon);
    kve_step_data d = kve_step_default_data();
    int32_t pos = 0;
    unsigned flags = 0;
    while ((line = next_line(c)) != NULL && strcmp(line, "end") != 0) {
        switch (line[0]) {
        case 's':
            if (sscanf(line, "s %d %u", &pos, &flags) != 2)
                REF_FAIL(c, "bad step line");
            d = kve_step_default_data();
            d.flags = flags;
            break;
        case 'a':
            if (strcmp(line, "a -") != 0) {
                long n = read_floats(line, "a", -1, fa);
                if (n < 0 || (size_t)n != kve_policy_size(p))
                    REF_FAIL(c, "attention of %ld weights for %zu kept", n, kve_policy_size(p));
                d.attn = fa;
                d.ld = (size_t)n;
            }
            break;
        case 'k':
            if (read_floats(line, "k", (long)kd, fk) != (long)kd)
                REF_FAIL(c, "bad key");
            d.keys = fk;
            d.ld_keys = kd;
            break;
        case 'q':
            if (read_floats(line, "q", (long)(g * kd), fq) != (long)(g * kd))
                REF_FAIL(c, "bad queries");
            d.queries = fq;
            d.ld_queries = kd;
            break;
        case 'v':
            if (read_floats(line, "v", (long)vd, fv) != (long)vd)
                REF_FAIL(c, "bad value");
            d.values = fv;
            d.ld_values = vd;
            break;
        case 'x': {
            size_t budget = 0, nv = 0, got = 0;
            if (sscanf(line, "x %zu %zu", &budget, &nv) != 2)
                REF_FAIL(c, "bad evict line");
            ASSERT_OK(kve_policy_step_data(p, pos, &d));
            ASSERT_OK(kve_policy_evict(p, budget, victims, MAXV, &got));
            long n = count_after(line) - 2;
            char *rest = line + 2;
            for (int skip = 0; skip < 2; skip++)
                rest = strchr(rest + 1, ' ') ? strchr(rest + 1, ' ') : rest + strlen(rest);
            if (got != nv || (long)nv != n)
                REF_FAIL(c, "%s at %d: %zu victims, the reference %zu", spec, pos, got, nv);
            for (size_t i = 0; i < nv; i++) {
                long want = strtol(rest, &rest, 10);
                if (victims[i] != want)
                    REF_FAIL(c, "%s at %d: victim %zu is %d, the reference's %ld", spec, pos, i,
                             victims[i], want);
            }
            (*steps)++;
            break;
        }
        case 'r': {
            long n = read_reals(line, "r", -1, fr);
            if (n < 0 || (size_t)n != kve_policy_size(p))
                REF_FAIL(c, "%s at %d: %zu kept, the reference %ld", spec, pos,
                         kve_policy_size(p), n);
            for (long i = 0; i < n; i++) {
                double s = slot_score(p, (size_t)i), want = fr[i];
                if (s != want && fabs(s - want) / fmax(fabs(s), fabs(want)) > worst)
                    worst = fabs(s - want) / fmax(fabs(s), fabs(want));
                if (!(s == want || fabs(s - want) <= 1e-12 * fmax(fabs(s), fabs(want))))
                    REF_FAIL(c, "%s at %d: slot %ld (position %d) scores %.17g, the reference "
                             "%.17g", spec, pos, i, kve_policy_positions(p)[i], s, want);
                (*scores)++;
            }
            break;
        }
        default: REF_FAIL(c, "unknown line \"%.20s\"", line);
        }
    }
    kve_policy_free(p);
}

static float rows[MAXV * 4];
static double scores[MAXV];

/* One `prefill` of the file: KVzip's scores and kept set. */
static void replay_prefill(cursor *c, const char *line)
{
    size_t n = 0, g = 0, sinks = 0, budget = 0, r = 0;
    if (sscanf(line, "prefill %zu %zu %zu %zu %zu", &n, &g, &sinks, &budget, &r) != 5 ||
        g * r * n > sizeof rows / sizeof rows[0])
        REF_FAIL(c, "bad prefill line");
    for (size_t k = 0; k < g; k++) {
        char *w = next_line(c);
        if (!w || read_floats(w, "w", (long)(r * n), rows + k * r * n) != (long)(r * n))
            REF_FAIL(c, "bad rows");
    }
    char *pl = next_line(c);
    if (!pl || read_reals(pl, "p", -1, fr) != (long)n)
        REF_FAIL(c, "bad scores");
    kve_prefill_options o = kve_prefill_default_options();
    o.method = KVE_PREFILL_KVZIP;
    o.queries = r;
    o.sinks = sinks;
    ASSERT_EQ(kve_prefill_rows(n, &o), r);
    ASSERT_OK(kve_prefill_scores(n, rows, n, g, KVE_REDUCE_MAX, &o, scores));
    for (size_t i = 0; i < n; i++)
        if (scores[i] != fr[i]) /* a maximum of the same float32 weights: exact */
            REF_FAIL(c, "score of position %zu is %.17g, the reference %.17g", i, scores[i],
                     fr[i]);
    char *kl = next_line(c);
    long nk = kl ? read_reals(kl, "kept", -1, fr) : -1;
    char spec[64];
    snprintf(spec, sizeof spec, "h2o:budget=%zu,recent_window=0", budget);
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new(spec, 1, NULL, &b));
    ASSERT_OK(kve_bank_prefill(b, 0, 1, n, budget, rows, n, g, KVE_REDUCE_MAX, &o));
    if (nk < 0 || (size_t)nk != kve_bank_size(b, 0))
        REF_FAIL(c, "%zu kept, the reference %ld", kve_bank_size(b, 0), nk);
    for (long i = 0; i < nk; i++)
        if (kve_bank_positions(b, 0)[i] != (int32_t)fr[i])
            REF_FAIL(c, "kept[%ld] is %d, the reference %g", i, kve_bank_positions(b, 0)[i],
                     fr[i]);
    /* after KVzip the policy starts as admitted: score 0 */
    for (size_t i = 0; i < kve_bank_size(b, 0); i++)
        ASSERT_TRUE(((const double *)b->heads[0].col[KVE_COL_SCORE])[i] == 0.0);
    kve_bank_free(b);
    char *e = next_line(c);
    if (!e || strcmp(e, "end") != 0)
        REF_FAIL(c, "no end after the prefill");
}

static void test_reference_file(void)
{
    char path[1024];
    const char *src = getenv("KVE_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/vectors/methods.ref", src ? src : "..");
    char *text = read_whole_file(path, NULL);
    if (!text)
        CHECK_FAIL_AT("cannot read %s (set KVE_SOURCE_DIR to the source tree)", path);
    cursor c = {text, 0};
    size_t cases = 0, steps = 0, scored = 0, prefills = 0;
    char *line;
    int before = check_failures;
    while ((line = next_line(&c)) != NULL && check_failures == before) {
        if (line[0] == '#' || !line[0])
            continue;
        if (!strncmp(line, "case ", 5)) {
            char spec[KVE_SPEC_MAX];
            snprintf(spec, sizeof spec, "%s", line + 5);
            replay_case(&c, spec, &steps, &scored);
            cases++;
        } else if (!strncmp(line, "prefill ", 8)) {
            replay_prefill(&c, line);
            prefills++;
        } else {
            fprintf(stderr, "methods.ref:%d: unknown directive\n", c.line);
            check_failures++;
        }
    }
    free(text);
    printf("     methods.ref: %zu policies, %zu steps (victims equal), %zu scores (within %.1e "
           "relative), %zu KVzip prefills (equal)\n", cases, steps, scored, worst, prefills);
    ASSERT_TRUE(cases >= 12 && prefills >= 4 && steps >= 790 && scored > 1000);
}

/* ---- contracts ---- */

static kve_policy_options ea_options(void)
{
    kve_policy_options o = kve_policy_default_options();
    facts_policy(&o);
    return o;
}

/* What the step's new data refuses, each time naming it and changing
 * nothing. */
static void test_step_data_refusals(void)
{
    kve_policy_options o = ea_options();
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new_ex("expected_attention:budget=8,n_sink=1", NULL, &o, &p));
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    facts_vec v;
    for (int32_t t = 0; t < 5; t++)
        ASSERT_OK(facts_step(p, t, NULL, 0, &g));
    size_t n = kve_policy_size(p);
    facts_draw(&g, &v);
    kve_step_data d = facts_data(NULL, 0, &v);
    static const struct {
        const char *what, *needle;
    } cases[] = {
        {"no queries", "reads queries, but the step carries none"},
        {"no values", "reads values, but the step carries none"},
        {"no key", "reads keys, but the step carries none"},
        {"nan query", "query head 1: query[3] = nan is NaN"},
        {"inf value", "value[2] = inf is infinite"},
        {"ld_queries", "ld_queries 7 is smaller than key_dim 8"},
        {"ld_values", "ld_values 5 is smaller than value_dim 6"},
        {"flags", "flags 0x6 has bits outside"},
        {"group", "group is 2, but a policy reads one row"},
        {"pos", "is not greater than the last position"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kve_step_data e = d;
        facts_vec w = v;
        int32_t pos = 10;
        switch (i) {
        case 0: e.queries = NULL; break;
        case 1: e.values = NULL; break;
        case 2: e.keys = NULL; break;
        case 3: w.queries[FACT_D + 3] = NAN; e.queries = w.queries; break;
        case 4: w.value[2] = INFINITY; e.values = w.value; break;
        case 5: e.ld_queries = FACT_D - 1; break;
        case 6: e.ld_values = FACT_V - 1; break;
        case 7: e.flags = 6; break;
        case 8: e.group = 2; break;
        case 9: pos = 4; break;
        }
        ASSERT_STATUS(kve_policy_step_data(p, pos, &e), KVE_EINVAL);
        if (!strstr(kve_last_error(), cases[i].needle))
            CHECK_FAIL_AT("%s: \"%s\" does not say \"%s\"", cases[i].what, kve_last_error(),
                          cases[i].needle);
        ASSERT_EQ(kve_policy_size(p), n);
    }
    ASSERT_OK(kve_policy_step_data(p, 10, &d));
    ASSERT_EQ(kve_policy_size(p), n + 1);
    /* a query or a value given to a policy built without their dimensions */
    kve_policy *h = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=4,recent_window=1", NULL, &h));
    kve_step_data q = kve_step_default_data();
    q.queries = v.queries;
    q.ld_queries = FACT_D;
    ASSERT_STATUS(kve_policy_step_data(h, 0, &q), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "a query is given, but the policy was built with key_dim 0");
    q = kve_step_default_data();
    q.values = v.value;
    q.ld_values = FACT_V;
    ASSERT_STATUS(kve_policy_step_data(h, 0, &q), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "value_dim 0");
    ASSERT_OK(kve_policy_step_data(h, 0, NULL)); /* NULL data: nothing, a NULL step */
    ASSERT_EQ(kve_policy_size(h), 1);
    ASSERT_STATUS(kve_policy_step_data(NULL, 1, NULL), KVE_EINVAL);
    kve_policy_free(h);
    /* a bank names the head */
    kve_bank *b = NULL;
    kve_bank_options bo = kve_bank_default_options();
    facts_bank(&bo);
    ASSERT_OK(kve_bank_new_ex("expected_attention:budget=8", 3, NULL, &bo, &b));
    float qs[3 * FACT_G * FACT_D], ks[3 * FACT_D], vs[3 * FACT_V];
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++)
        qs[i] = 0.25f;
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        ks[i] = 0.5f;
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++)
        vs[i] = 1.0f;
    kve_step_data bd = kve_step_default_data();
    bd.keys = ks;
    bd.ld_keys = FACT_D;
    bd.queries = qs;
    bd.ld_queries = FACT_D;
    bd.values = vs;
    bd.ld_values = FACT_V;
    qs[(2 * FACT_G + 1) * FACT_D] = NAN; /* head 2, query head 1 */
    ASSERT_STATUS(kve_bank_step_data(b, 0, 3, 0, &bd), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 2: query head 1: query[0]");
    for (size_t h2 = 0; h2 < 3; h2++)
        ASSERT_EQ(kve_bank_size(b, h2), 0);
    qs[(2 * FACT_G + 1) * FACT_D] = 0.25f;
    ASSERT_OK(kve_bank_step_data(b, 0, 3, 0, &bd));
    bd.ld_queries = SIZE_MAX / 2;
    ASSERT_STATUS(kve_bank_step_data(b, 0, 3, 1, &bd), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "overflow the address space");
    bd.group = 0;
    ASSERT_STATUS(kve_bank_step_data(b, 0, 3, 1, &bd), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_step_data(b, 0, 4, 1, NULL), KVE_EINVAL);
    kve_bank_free(b);
    kve_policy_free(p);
}

/* The model facts at construction, and expected_attention's own checks. */
static void test_construction_facts(void)
{
    kve_policy *p = NULL;
    kve_policy_options o = ea_options();
    static const struct {
        const char *spec, *needle;
        int field;
        size_t value;
    } bad[] = {
        {"expected_attention", "rope.rotary_dim", 0, KVE_ROPE_UNSET},
        {"h2o", "rotary_dim 7 must be even", 0, 7},
        {"h2o", "rotary_dim 10 must be even and at most key_dim 8", 0, 10},
        {"h2o", "query_group 0 is not in 1 ..", 1, 0},
        {"h2o", "query_group 4097", 1, KVE_MAX_QUERY_GROUP + 1},
        {"expected_attention", "value_dim must be at least 1", 2, 0},
        {"h2o:vnorm=1", "reads values (vnorm=1)", 2, 0},
        {"h2o", "value_dim 65537 is above", 2, KVE_MAX_KEY_DIM + 1},
        {"expected_attention:vnorm=0", "key_dim must be at least 1", 3, 0},
        {"expected_attention:budget=4,n_sink=4", "n_sink 4 must be smaller than budget 4", 4, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kve_policy_options x = o;
        switch (bad[i].field) {
        case 0: x.rope.rotary_dim = bad[i].value; break;
        case 1: x.query_group = bad[i].value; break;
        case 2: x.value_dim = bad[i].value; break;
        case 3: x.key_dim = 0; x.rope.rotary_dim = 0; break;
        default: break;
        }
        ASSERT_STATUS(kve_policy_new_ex(bad[i].spec, NULL, &x, &p), KVE_EINVAL);
        if (!strstr(kve_last_error(), bad[i].needle))
            CHECK_FAIL_AT("%s: \"%s\" does not say \"%s\"", bad[i].spec, kve_last_error(),
                          bad[i].needle);
        ASSERT_TRUE(p == NULL);
    }
    kve_policy_options x = o;
    x.rope.base = 0.0;
    ASSERT_STATUS(kve_policy_new_ex("h2o", NULL, &x, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "base 0 must be finite and above 0");
    x.rope.base = INFINITY;
    ASSERT_STATUS(kve_policy_new_ex("h2o", NULL, &x, &p), KVE_EINVAL);
    x = o;
    x.rope.pairs = (kve_rope_pairs)2;
    ASSERT_STATUS(kve_policy_new_ex("h2o", NULL, &x, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "pairs 2 is not a kve_rope_pairs");
    /* a model without rotary embedding: rotary_dim 0 */
    x = o;
    x.rope.rotary_dim = 0;
    ASSERT_OK(kve_policy_new_ex("expected_attention", NULL, &x, &p));
    ASSERT_EQ(kve_policy_reads(p), KVE_READS_KEYS | KVE_READS_QUERIES | KVE_READS_VALUES);
    /* per slot: position, score, mark, the key, the logit, the value norm */
    ASSERT_EQ(kve_policy_state_bytes(p), 513 * (4 + 8 + 1 + 4 * FACT_D + 8 + 8));
    kve_policy_free(p);
    ASSERT_OK(kve_policy_new_ex("expected_attention:vnorm=0", NULL, &x, &p));
    ASSERT_EQ(kve_policy_reads(p), KVE_READS_KEYS | KVE_READS_QUERIES);
    kve_policy_free(p);
    /* the defaults, and the facts a bank carries */
    kve_policy_options d = kve_policy_default_options();
    ASSERT_TRUE(d.value_dim == 0 && d.query_group == 1 && d.rope.rotary_dim == KVE_ROPE_UNSET &&
                d.rope.base == 10000.0 && d.rope.pairs == KVE_ROPE_ADJACENT);
    kve_bank_options bo = kve_bank_default_options();
    ASSERT_TRUE(bo.value_dim == 0 && bo.query_group == 1 && bo.rope.rotary_dim == KVE_ROPE_UNSET);
    kve_bank *b = NULL;
    ASSERT_STATUS(kve_bank_new_ex("expected_attention", 2, NULL, &bo, &b), KVE_EINVAL);
    facts_bank(&bo);
    ASSERT_OK(kve_bank_new_ex("expected_attention", 2, NULL, &bo, &b));
    ASSERT_EQ(kve_bank_reads(b), KVE_READS_KEYS | KVE_READS_QUERIES | KVE_READS_VALUES);
    kve_bank_free(b);
    /* spec calls need no facts */
    char out[KVE_SPEC_MAX];
    ASSERT_OK(kve_spec_with("expected_attention", "interval", "64", out, sizeof out));
    ASSERT_STR_EQ(out, "expected_attention:budget=512,recent_window=0,n_future_positions=512,"
                       "n_sink=4,use_covariance=1,vnorm=1,epsilon=0,interval=64,n_queries=256");
    size_t least = 0;
    ASSERT_OK(kve_spec_min_budget("expected_attention:n_sink=9", &least));
    ASSERT_EQ(least, 10);
    ASSERT_STATUS(kve_spec_with("expected_attention:epsilon=-1", NULL, NULL, out, sizeof out),
                  KVE_EINVAL);
    ASSERT_STATUS(kve_spec_with("expected_attention:interval=0", NULL, NULL, out, sizeof out),
                  KVE_EINVAL);
    ASSERT_STATUS(kve_spec_with("knorm:vnorm=1", NULL, NULL, out, sizeof out), KVE_EINVAL);
}

/* vnorm=0 is each policy without it: the same canonical spec (the key
 * omitted), the same victims; vnorm=1 is spelled. */
static void test_vnorm_specs(void)
{
    static const char *const names[] = {"h2o", "tova", "h2o_decay", "h2o_mean", "scissorhands"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char a[KVE_SPEC_MAX], b[KVE_SPEC_MAX], c[KVE_SPEC_MAX];
        ASSERT_OK(kve_spec_with(names[i], NULL, NULL, a, sizeof a));
        ASSERT_OK(kve_spec_with(names[i], "vnorm", "0", b, sizeof b));
        ASSERT_STR_EQ(a, b);
        ASSERT_TRUE(strstr(a, "vnorm") == NULL);
        ASSERT_OK(kve_spec_with(names[i], "vnorm", "1", c, sizeof c));
        ASSERT_TRUE(strlen(c) > 8 && strcmp(c + strlen(c) - 8, ",vnorm=1") == 0);
    }
    /* a zero value scores 0 whatever its attention; the recent window still
     * protects; ties between zero scores go to the lower position */
    kve_policy_options o = kve_policy_default_options();
    o.value_dim = 2;
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new_ex("h2o:budget=3,recent_window=1,vnorm=1", NULL, &o, &p));
    static const float vals[5][2] = {{0, 0}, {3, 4}, {0, 0}, {1, 0}, {0, 0}};
    float attn[8] = {0};
    int32_t v[4];
    size_t nv = 0;
    for (int32_t t = 0; t < 5; t++) {
        for (size_t i = 0; i < kve_policy_size(p); i++)
            attn[i] = 0.5f;
        kve_step_data d = kve_step_default_data();
        d.attn = attn;
        d.ld = kve_policy_size(p);
        d.values = vals[t];
        d.ld_values = 2;
        ASSERT_OK(kve_policy_step_data(p, t, &d));
        ASSERT_OK(kve_policy_evict(p, 3, v, 4, &nv));
        if (t == 3) /* kept 0 1 2 3: p0 and p2 score 0, the tie drops p0 */
            ASSERT_TRUE(nv == 1 && v[0] == 0);
        if (t == 4) /* kept 1 2 3 4 (4 protected): p2 scores 0 */
            ASSERT_TRUE(nv == 1 && v[0] == 2);
    }
    ASSERT_EQ(kve_policy_size(p), 3);
    ASSERT_TRUE(slot_score(p, 0) == 1.5 * 5.0); /* p1: three halves, times ||(3, 4)|| */
    /* kve_policy_step (no values) is refused */
    ASSERT_STATUS(kve_policy_step(p, 9, NULL, 0), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "reads values, but the step carries none");
    kve_policy_free(p);
}

/* KVE_STEP_RESCORE: a policy that rescores every 1000 steps, flagged at one
 * step, then has the scores of one that rescores at every step. */
static void test_rescore_flag(void)
{
    kve_policy_options o = ea_options();
    kve_policy *a = NULL, *b = NULL;
    ASSERT_OK(kve_policy_new_ex("expected_attention:budget=64,interval=1000,n_sink=2", NULL, &o,
                                &a));
    ASSERT_OK(kve_policy_new_ex("expected_attention:budget=64,interval=1,n_sink=2", NULL, &o, &b));
    kve_rng g;
    kve_rng_seed(&g, check_seed + 1);
    for (int32_t t = 0; t < 40; t++) {
        facts_vec v;
        facts_draw(&g, &v);
        kve_step_data d = facts_data(NULL, 0, &v);
        ASSERT_OK(kve_policy_step_data(b, t, &d));
        d.flags = t == 39 ? KVE_STEP_RESCORE : 0;
        ASSERT_OK(kve_policy_step_data(a, t, &d));
        if (t == 20) { /* before the flag: never rescored, every non-sink 0 */
            ASSERT_TRUE(slot_score(a, 5) == 0.0 && slot_score(b, 5) > 0.0);
            ASSERT_TRUE(slot_score(a, 0) == 1e300 && slot_score(a, 1) == 1e300);
        }
    }
    for (size_t i = 0; i < 40; i++)
        ASSERT_TRUE(slot_score(a, i) == slot_score(b, i));
    kve_policy_free(a);
    kve_policy_free(b);
}

/* The prefill of a policy with vnorm=1 takes the prompt's values; KVzip's
 * own refusals. */
static void test_prefill_values_and_kvzip(void)
{
    enum { N = 12, B = 6 };
    static float tri[N * N];
    static float vals[N * 3];
    for (size_t t = 0; t < N; t++)
        for (size_t i = 0; i <= t; i++)
            tri[t * N + i] = 1.0f / (float)(t + 1);
    for (size_t i = 0; i < N * 3; i++)
        vals[i] = (float)(i % 3) + (float)(i / 3) * 0.5f;
    kve_bank_options bo = kve_bank_default_options();
    bo.value_dim = 3;
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=8,recent_window=2,vnorm=1", 1, NULL, &bo, &b));
    kve_prefill_options o = kve_prefill_default_options();
    ASSERT_STATUS(kve_bank_prefill(b, 0, 1, N, B, tri, N, 1, KVE_REDUCE_MEAN, &o), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "options.values is NULL");
    o.values = vals;
    o.ld_values = 2;
    ASSERT_STATUS(kve_bank_prefill(b, 0, 1, N, B, tri, N, 1, KVE_REDUCE_MEAN, &o), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "ld_values 2 is smaller than value_dim 3");
    o.ld_values = 3;
    vals[7] = NAN;
    ASSERT_STATUS(kve_bank_prefill(b, 0, 1, N, B, tri, N, 1, KVE_REDUCE_MEAN, &o), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "the value of position 2: value[1] = nan");
    ASSERT_EQ(kve_bank_size(b, 0), 0);
    vals[7] = 1.0f;
    ASSERT_OK(kve_bank_prefill(b, 0, 1, N, B, tri, N, 1, KVE_REDUCE_MEAN, &o));
    ASSERT_EQ(kve_bank_size(b, 0), B);
    const kve_head *h = &b->heads[0];
    for (size_t i = 0; i < B; i++) { /* score = column sum (the raw) * ||v|| */
        int32_t p = kve_bank_positions(b, 0)[i];
        double raw = ((const double *)h->col[KVE_COL_RAW])[i];
        double norm = ((const double *)h->col[KVE_COL_VNORM])[i];
        const float *v = vals + p * 3;
        double want = sqrt((double)v[0] * v[0] + (double)v[1] * v[1] + (double)v[2] * v[2]);
        ASSERT_NEAR(norm, want, 1e-15 * want);
        ASSERT_TRUE(((const double *)h->col[KVE_COL_SCORE])[i] == raw * norm);
    }
    kve_bank_free(b);
    /* KVzip: queries 0, a budget not above the sinks; sinks may exceed n */
    o = kve_prefill_default_options();
    o.method = KVE_PREFILL_KVZIP;
    o.queries = 0;
    double s[N];
    ASSERT_STATUS(kve_prefill_scores(N, tri, N, 1, KVE_REDUCE_MAX, &o, s), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "kvzip: queries must be at least 1");
    o.queries = 2; /* rows of queries over all N keys: rows t = 0, 1 read whole */
    ASSERT_OK(kve_bank_new("tova:budget=10", 1, NULL, &b));
    ASSERT_STATUS(kve_bank_prefill(b, 0, 1, N, 4, tri, N, 1, KVE_REDUCE_MAX, &o), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "greater than sinks 4");
    tri[1] = NAN; /* a weight past the causal diagonal: KVzip reads it */
    ASSERT_STATUS(kve_prefill_scores(N, tri, N, 1, KVE_REDUCE_MAX, &o, s), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "weight on key 1");
    tri[1] = 0.0f;
    ASSERT_OK(kve_prefill_scores(N, tri, N, 1, KVE_REDUCE_MAX, &o, s));
    ASSERT_TRUE(s[0] == 1.0 && s[1] == 0.5 && s[5] == 0.0);
    o.sinks = 3;
    ASSERT_OK(kve_bank_prefill(b, 0, 1, N, 5, tri, N, 1, KVE_REDUCE_MAX, &o));
    ASSERT_EQ(kve_bank_size(b, 0), 5); /* the sinks 0 1 2, then the best of the rest: 3 and 4 */
    for (int32_t i = 0; i < 5; i++)
        ASSERT_EQ(kve_bank_positions(b, 0)[i], i);
    kve_bank_free(b);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_reference_file);
    RUN(test_step_data_refusals);
    RUN(test_construction_facts);
    RUN(test_vnorm_specs);
    RUN(test_rescore_flag);
    RUN(test_prefill_values_and_kvzip);
    return CHECK_DONE();
}
