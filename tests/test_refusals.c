/* SPDX-License-Identifier: MIT */
/*
 * test_refusals.c - every refusal path of every policy returns the right
 * status, leaves a message naming the bad field or value, and changes
 * NOTHING.
 *
 * Method: a policy and an untouched twin are built from one spec (and, for
 * random, from two generators in the same state) and fed the same history.
 * Each refused call goes to the policy only; then both must agree on size,
 * positions, spec and state bytes, and must keep agreeing, victim for
 * victim, over a stretch of further identical steps and evictions. A refusal
 * that moved a score, a mark, a generator or a counter shows up there.
 * Every twin is built with keys of KD floats and every step carries one, so
 * the policies that read keys go through the same cases (and the others
 * validate and ignore theirs). The step refusals run again on twins built
 * unchecked, which skip the weights' validation and must refuse everything
 * else alike.
 */
#include "check.h"
#include "facts.h"
#include "test_allocator.h"
#include "internal.h"
#include "kvevict.h"

enum { MAXN = 512, KD = 5 };

static const char *const specs[] = {
    "full:budget=6",
    "window:budget=6",
    "streaming:budget=6,sinks=2",
    "streaming:budget=6,sinks=0",
    "random:budget=6,recent_window=0",
    "random:budget=6,recent_window=2",
    "h2o:budget=6,recent_window=2",
    "h2o:budget=6,recent_window=0",
    "scissorhands:budget=6,recent_window=2",
    "scissorhands:budget=6,recent_window=1,history=3",
    "tova:budget=6,recent_window=1",
    "h2o_decay:budget=6,recent_window=2,decay=0.5",
    "h2o_mean:budget=6,recent_window=2",
    "knorm:budget=6,recent_window=0",
    "knorm:budget=6,recent_window=2",
    "keydiff:budget=6,recent_window=0",
    "keydiff:budget=6,recent_window=1",
};

typedef struct twins {
    kve_policy *p, *q; /* p takes the refused calls, q never does */
    kve_rng g;         /* attention source, shared by both */
    int32_t pos;       /* last position admitted */
    size_t budget;
    talloc ta;         /* p's allocator */
} twins;

static float row[MAXN];
static float key[KD] = {0.5f, -1.0f, 0.25f, 2.0f, 0.0f}; /* a valid key */
static int32_t vp[MAXN], vq[MAXN];

/* Both policies equal in every observable. Returns 0 after reporting. */
static int same(const twins *t, const char *what)
{
    size_t n = kve_policy_size(t->p);
    const char *spec = kve_policy_spec(t->p);
    if (n != kve_policy_size(t->q) ||
        memcmp(kve_policy_positions(t->p), kve_policy_positions(t->q), n * sizeof(int32_t)) != 0 ||
        strcmp(spec, kve_policy_spec(t->q)) != 0 ||
        kve_policy_state_bytes(t->p) != kve_policy_state_bytes(t->q)) {
        fprintf(stderr, "%s: twins differ after %s\n", spec, what);
        return 0;
    }
    return 1;
}

/* One identical step on both (attention with probability 9/10, with zeros
 * and repeats), then, unless `grow`, an identical evict whose victims must
 * agree. */
static int advance(twins *t, int grow)
{
    size_t n = kve_policy_size(t->p);
    int with_attn = kve_rng_below(&t->g, 10) != 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = kve_rng_below(&t->g, 4);
        row[i] = k == 0 ? 0.0f : k == 1 ? 0.25f : (float)kve_rng_uniform(&t->g);
    }
    float k[KD]; /* from a pool of two directions: equal scores happen */
    for (size_t j = 0; j < KD; j++)
        k[j] = kve_rng_below(&t->g, 3) == 0 ? (float)kve_rng_uniform(&t->g)
                                            : (float)(j + kve_rng_below(&t->g, 2));
    t->pos += 1 + (int32_t)kve_rng_below(&t->g, 2);
    if (kve_policy_step_keys(t->p, t->pos, with_attn ? row : NULL, n, k) != KVE_OK ||
        kve_policy_step_keys(t->q, t->pos, with_attn ? row : NULL, n, k) != KVE_OK) {
        fprintf(stderr, "step failed: %s\n", kve_last_error());
        return 0;
    }
    if (grow)
        return same(t, "a step");
    size_t np = 0, nq = 0;
    if (kve_policy_evict(t->p, t->budget, vp, MAXN, &np) != KVE_OK ||
        kve_policy_evict(t->q, t->budget, vq, MAXN, &nq) != KVE_OK) {
        fprintf(stderr, "evict failed: %s\n", kve_last_error());
        return 0;
    }
    if (np != nq || memcmp(vp, vq, np * sizeof *vp) != 0) {
        fprintf(stderr, "%s: victims differ after a refusal\n", kve_policy_spec(t->p));
        return 0;
    }
    return same(t, "an evict");
}

/* Twins built unchecked (kvevict.h, "Unchecked steps") skip the validation
 * of weights and nothing else: every other refusal must be the same. */
static int twins_new_ex(twins *t, const char *spec, uint64_t seed, int unchecked)
{
    kve_rng a, b;
    kve_rng_seed(&a, seed);
    kve_rng_seed(&b, seed);
    memset(t, 0, sizeof *t);
    kve_rng_seed(&t->g, seed + 1);
    t->pos = -1;
    talloc_init(&t->ta);
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = KD;
    o.unchecked = unchecked;
    if (kve_policy_new_ex(spec, &b, &o, &t->q) != KVE_OK)
        return 0;
    o.allocator = &t->ta.a;
    if (kve_policy_new_ex(spec, &a, &o, &t->p) != KVE_OK) {
        fprintf(stderr, "%s: %s\n", spec, kve_last_error());
        return 0;
    }
    t->budget = kve_policy_budget(t->p);
    for (int s = 0; s < 20; s++) /* a history with real scores */
        if (!advance(t, 0))
            return 0;
    return 1;
}

static int twins_new(twins *t, const char *spec, uint64_t seed)
{
    return twins_new_ex(t, spec, seed, 0);
}

static void twins_free(twins *t)
{
    kve_policy_free(t->p);
    kve_policy_free(t->q);
    talloc_check_empty(&t->ta);
}

/* After a refusal: the twins agree now and over 12 more steps. The
 * attention generator is left in place so later steps differ per case. */
#define CHECK_UNCHANGED(t, what)                                              \
    do {                                                                      \
        if (!same(t, what))                                                   \
            CHECK_FAIL_AT("state changed by %s", what);                       \
        for (int k_ = 0; k_ < 12; k_++)                                       \
            if (!advance(t, k_ == 5))                                         \
                CHECK_FAIL_AT("behaviour changed after %s", what);            \
    } while (0)

#define REFUSED(call, want, needle, t, what)                                  \
    do {                                                                      \
        ASSERT_STATUS(call, want);                                            \
        ASSERT_CONTAINS(kve_last_error(), needle);                            \
        CHECK_UNCHANGED(t, what);                                             \
    } while (0)

static void step_refusals(const char *spec, uint64_t seed, int unchecked)
{
    twins t;
    ASSERT_TRUE(twins_new_ex(&t, spec, seed, unchecked));
    kve_policy *p = t.p;
    size_t n = kve_policy_size(p);
    ASSERT_TRUE(n > 0);
    for (size_t i = 0; i < n; i++)
        row[i] = 0.5f;

    REFUSED(kve_policy_step_keys(NULL, t.pos + 1, row, n, key), KVE_EINVAL, "NULL", &t, "NULL policy");
    REFUSED(kve_policy_step_keys(p, -1, NULL, 0, key), KVE_EINVAL, "pos -1", &t, "pos -1");
    REFUSED(kve_policy_step_keys(p, INT32_MIN, row, kve_policy_size(p), key), KVE_EINVAL, "negative", &t,
            "INT32_MIN");
    REFUSED(kve_policy_step_keys(p, t.pos, NULL, 0, key), KVE_EINVAL, "not greater", &t, "pos repeated");
    REFUSED(kve_policy_step_keys(p, t.pos - 1, NULL, 0, key), KVE_EINVAL, "not greater", &t,
            "pos decreasing");
    /* The position check comes before the attention is admitted: a good row
     * with a bad position is still refused. */
    n = kve_policy_size(p);
    for (size_t i = 0; i < n; i++)
        row[i] = 0.5f;
    REFUSED(kve_policy_step_keys(p, t.pos, row, n, key), KVE_EINVAL, "pos", &t, "pos repeated with attn");

    n = kve_policy_size(p);
    REFUSED(kve_policy_step_keys(p, t.pos + 1, row, n + 1, key), KVE_EINVAL, "n is", &t, "n = size + 1");
    n = kve_policy_size(p);
    REFUSED(kve_policy_step_keys(p, t.pos + 1, row, n - 1, key), KVE_EINVAL, "n is", &t, "n = size - 1");

    static const struct {
        float bad;
        const char *word;
    } weights[] = {{NAN, "NaN"}, {INFINITY, "infinite"}, {-INFINITY, "infinite"},
                   {-0.5f, "negative"}, {-1e-30f, "negative"}};
    for (size_t w = 0; w < sizeof weights / sizeof weights[0] && !unchecked; w++) {
        n = kve_policy_size(p);
        size_t at = (w * 7 + 3) % n; /* various indices, the last included */
        if (w == 0)
            at = n - 1;
        for (size_t i = 0; i < n; i++)
            row[i] = 0.5f;
        row[at] = weights[w].bad;
        char needle[32];
        snprintf(needle, sizeof needle, "attn[%zu]", at);
        REFUSED(kve_policy_step_keys(p, t.pos + 1, row, n, key), KVE_EINVAL, needle, &t, weights[w].word);
        ASSERT_CONTAINS(kve_last_error(), weights[w].word);
    }
    /* -0.0 is >= 0: accepted on both twins. */
    n = kve_policy_size(p);
    for (size_t i = 0; i < n; i++)
        row[i] = -0.0f;
    ASSERT_OK(kve_policy_step_keys(p, t.pos + 1, row, n, key));
    ASSERT_OK(kve_policy_step_keys(t.q, t.pos + 1, row, n, key));
    t.pos++;
    CHECK_UNCHANGED(&t, "a -0.0 row");

    /* Keys: a policy that reads them refuses a step without one; every
     * policy refuses a NaN or infinite entry, naming its index. */
    if (kve_policy_reads(p) & KVE_READS_KEYS) {
        REFUSED(kve_policy_step(p, t.pos + 1, NULL, 0), KVE_EINVAL, "reads keys, but the step "
                "carries none", &t, "no key");
        REFUSED(kve_policy_step_keys(p, t.pos + 1, NULL, 0, NULL), KVE_EINVAL, "carries none",
                &t, "NULL key");
    }
    static const float bad_keys[] = {NAN, INFINITY, -INFINITY};
    for (size_t w = 0; w < 3; w++) {
        float k[KD];
        memcpy(k, key, sizeof k);
        k[(w * 2 + 1) % KD] = bad_keys[w];
        char needle[32];
        snprintf(needle, sizeof needle, "key[%zu]", (w * 2 + 1) % KD);
        REFUSED(kve_policy_step_keys(p, t.pos + 1, NULL, 0, k), KVE_EINVAL, needle, &t,
                "a bad key");
        ASSERT_CONTAINS(kve_last_error(), w ? "infinite" : "NaN");
    }
    /* The position and attention checks come before the key's. */
    float k[KD] = {NAN, NAN, NAN, NAN, NAN};
    REFUSED(kve_policy_step_keys(p, t.pos, NULL, 0, k), KVE_EINVAL, "not greater", &t,
            "pos before key");
    twins_free(&t);
}

static void evict_refusals(const char *spec, uint64_t seed)
{
    twins t;
    ASSERT_TRUE(twins_new(&t, spec, seed));
    kve_policy *p = t.p;
    size_t nv = 777;
    const int never = strncmp(spec, "full", 4) == 0;

    REFUSED(kve_policy_evict(NULL, 4, vp, MAXN, &nv), KVE_EINVAL, "NULL", &t, "NULL policy");
    ASSERT_EQ(nv, 777);
    REFUSED(kve_policy_evict(p, 0, vp, MAXN, &nv), KVE_EINVAL, "budget", &t, "budget 0");
    ASSERT_EQ(nv, 777);

    /* Grow past the budget so that an evict has victims to report. */
    for (int k = 0; k < 3; k++)
        ASSERT_TRUE(advance(&t, 1));
    size_t size = kve_policy_size(p);
    ASSERT_TRUE(size >= t.budget + 3);

    /* recent_window / sinks floors, read back from the canonical spec. */
    const char *rw = strstr(kve_policy_spec(p), "recent_window=");
    const char *sk = strstr(kve_policy_spec(p), "sinks=");
    size_t floor = rw ? (size_t)atoi(rw + 14) : sk ? (size_t)atoi(sk + 6) : 0;
    if (floor) {
        const char *param = rw ? "recent_window" : "sinks";
        REFUSED(kve_policy_evict(p, floor, vp, MAXN, &nv), KVE_EINVAL, param, &t,
                "budget = floor");
        ASSERT_EQ(nv, 777);
        if (floor > 1)
            REFUSED(kve_policy_evict(p, floor - 1, vp, MAXN, &nv), KVE_EINVAL, param, &t,
                    "budget < floor");
        ASSERT_EQ(nv, 777);
    }

    size = kve_policy_size(p);
    REFUSED(kve_policy_evict(p, t.budget, NULL, 4, &nv), KVE_EINVAL, "victims", &t,
            "victims NULL");
    ASSERT_EQ(nv, 777);
    for (int k = 0; k < 3; k++) /* the checks above evicted: grow again */
        ASSERT_TRUE(advance(&t, 1));
    if (!never) {
        size = kve_policy_size(p);
        size_t need = size - t.budget;
        ASSERT_TRUE(need >= 2);
        char needle[48];
        snprintf(needle, sizeof needle, "%zu victims", need);
        REFUSED(kve_policy_evict(p, t.budget, vp, need - 1, &nv), KVE_ERANGE, needle, &t,
                "cap one short");
        for (int k = 0; k < 3; k++)
            ASSERT_TRUE(advance(&t, 1));
        REFUSED(kve_policy_evict(p, t.budget, NULL, 0, &nv), KVE_ERANGE, "cap", &t,
                "cap 0 with victims due");
        ASSERT_EQ(nv, 777);
        /* Exactly enough is fine, and n_victims may be NULL. */
        for (int k = 0; k < 3; k++)
            ASSERT_TRUE(advance(&t, 1));
        size = kve_policy_size(p);
        need = size - t.budget;
        ASSERT_OK(kve_policy_evict(p, t.budget, vp, need, NULL));
        ASSERT_OK(kve_policy_evict(t.q, t.budget, vq, need, NULL));
        ASSERT_TRUE(memcmp(vp, vq, need * sizeof *vp) == 0);
        ASSERT_TRUE(same(&t, "an exact-cap evict"));
    } else {
        /* full never evicts, so no capacity is ever needed. */
        ASSERT_OK(kve_policy_evict(p, 1, NULL, 0, &nv));
        ASSERT_EQ(nv, 0);
        ASSERT_OK(kve_policy_evict(t.q, 1, NULL, 0, &nv));
        ASSERT_TRUE(same(&t, "full's evict"));
    }
    twins_free(&t);
}

/* A failed allocation while stepping past the storage changes nothing. */
static void growth_failure(const char *spec, uint64_t seed)
{
    twins t;
    ASSERT_TRUE(twins_new(&t, spec, seed));
    kve_policy *p = t.p;
    size_t bytes = kve_policy_state_bytes(p);
    int failed = 0;
    for (int k = 0; k < 64 && !failed; k++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            row[i] = 0.125f;
        talloc_fail_after(&t.ta, 0);
        kve_status st = kve_policy_step_keys(p, t.pos + 1, row, n, key);
        talloc_fail_after(&t.ta, SIZE_MAX);
        if (st == KVE_ENOMEM) {
            failed = 1;
            ASSERT_TRUE(kve_last_error()[0] != '\0');
            ASSERT_EQ(kve_policy_state_bytes(p), bytes);
            CHECK_UNCHANGED(&t, "a failed growth");
        } else {
            ASSERT_OK(st);
            ASSERT_OK(kve_policy_step_keys(t.q, t.pos + 1, row, n, key));
            t.pos++;
            ASSERT_TRUE(same(&t, "a step without allocation"));
        }
    }
    ASSERT_TRUE(failed);
    twins_free(&t);
}

static void test_step_refusals(void)
{
    for (int unchecked = 0; unchecked < 2; unchecked++)
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
            step_refusals(specs[i], check_seed + i, unchecked);
}

static void test_evict_refusals(void)
{
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        evict_refusals(specs[i], check_seed + 100 + i);
}

static void test_growth_failure(void)
{
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        growth_failure(specs[i], check_seed + 200 + i);
}

/* Construction refusals leave *out and the caller's generator untouched. */
static void test_construction_refusals(void)
{
    static const struct {
        const char *spec, *needle;
    } bad[] = {
        {"nosuch", "nosuch"},
        {"h2o:foo=1", "foo"},
        {"h2o:budget=0", "budget"},
        {"h2o:budget=8,recent_window=8", "recent_window"},
        {"tova:budget=1", "recent_window"},
        {"streaming:budget=4,sinks=4", "sinks"},
        {"streaming:budget=4", "sinks"}, /* default sinks 4 */
        {"random:budget=2,recent_window=2", "recent_window"},
        {"scissorhands:history=65", "history"},
        {"h2o_decay:decay=0", "decay"},
        {"h2o_decay:decay=1.5", "decay"},
        {"window:recent_window=1", "recent_window"},
        {"full:sinks=1", "sinks"},
        {"random:budget=-3", "budget"},
    };
    kve_rng g, before;
    kve_rng_seed(&g, check_seed);
    before = g;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kve_policy *sentinel = (kve_policy *)&g, *out = sentinel;
        ASSERT_STATUS(kve_policy_new(bad[i].spec, &g, &out), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), bad[i].needle);
        ASSERT_TRUE(out == sentinel);
        ASSERT_TRUE(memcmp(&g, &before, sizeof g) == 0);
    }
    kve_policy *out = NULL;
    ASSERT_STATUS(kve_policy_new("random", NULL, &out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "rng");
    ASSERT_TRUE(out == NULL);
    ASSERT_STATUS(kve_policy_new(NULL, &g, &out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "spec");
    ASSERT_STATUS(kve_policy_new("h2o", NULL, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "out");

    /* Keys: a policy that reads them needs a dimension, and no dimension is
     * above the largest; the bank says the same. */
    kve_policy_options o = kve_policy_default_options();
    ASSERT_EQ(o.key_dim, 0);
    talloc ta;
    talloc_init(&ta);
    ASSERT_STATUS(kve_policy_new("knorm", NULL, &out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "key_dim must be at least 1");
    ASSERT_STATUS(kve_policy_new_ex("keydiff:budget=4", NULL, &o, &out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "keydiff: reads keys");
    o.key_dim = KVE_MAX_KEY_DIM + 1;
    ASSERT_STATUS(kve_policy_new_ex("h2o", NULL, &o, &out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "key_dim");
    kve_bank *bout = NULL;
    kve_bank_options bo = kve_bank_default_options();
    bo.key_dim = o.key_dim;
    ASSERT_STATUS(kve_bank_new_ex("knorm", 2, NULL, &bo, &bout), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "key_dim");
    ASSERT_STATUS(kve_bank_new("keydiff", 2, NULL, &bout), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "key_dim must be at least 1");
    ASSERT_TRUE(out == NULL && bout == NULL);
    o.key_dim = KVE_MAX_KEY_DIM; /* the largest is accepted */
    ASSERT_OK(kve_policy_new_ex("keydiff:budget=2", NULL, &o, &out));
    ASSERT_EQ(kve_policy_state_bytes(out), 3 * (13 + 4 * (size_t)KVE_MAX_KEY_DIM));
    kve_policy_free(out);
    out = NULL;
    /* A key given to a policy built without a dimension is refused. */
    ASSERT_OK(kve_policy_new("h2o:budget=4,recent_window=1", NULL, &out));
    ASSERT_STATUS(kve_policy_step_keys(out, 0, NULL, 0, key), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "key_dim 0");
    ASSERT_EQ(kve_policy_size(out), 0);
    ASSERT_OK(kve_policy_step_keys(out, 0, NULL, 0, NULL));
    kve_policy_free(out);
    out = NULL;

    /* Allocation failure at every allocation of every constructor: ENOMEM,
     * *out untouched, the generator not advanced, nothing leaked (ASan). */
    for (size_t t = 0; t < kve_policy_type_count(); t++) {
        const char *name = kve_policy_type_name(t);
        facts_policy(&o);
        o.allocator = &ta.a;
        for (size_t k = 0;; k++) {
            kve_policy *p = (kve_policy *)&g;
            talloc_fail_after(&ta, k);
            kve_status st = kve_policy_new_ex(name, &g, &o, &p);
            talloc_fail_after(&ta, SIZE_MAX);
            if (st == KVE_OK) {
                ASSERT_TRUE(k > 0);
                kve_policy_free(p);
                break;
            }
            ASSERT_EQ(st, KVE_ENOMEM);
            ASSERT_TRUE(p == (kve_policy *)&g);
            ASSERT_TRUE(memcmp(&g, &before, sizeof g) == 0);
            ASSERT_TRUE(k < 16);
            ASSERT_EQ(ta.blocks, 0);
        }
        before = g; /* random's success drew one output */
    }
    talloc_check_empty(&ta);
}

/* The accessors accept NULL. */
static void test_null_accessors(void)
{
    ASSERT_EQ(kve_policy_size(NULL), 0);
    ASSERT_TRUE(kve_policy_positions(NULL) == NULL);
    ASSERT_EQ(kve_policy_state_bytes(NULL), 0);
    ASSERT_TRUE(kve_policy_spec(NULL) == NULL);
    ASSERT_TRUE(kve_policy_name(NULL) == NULL);
    ASSERT_EQ(kve_policy_budget(NULL), 0);
    ASSERT_EQ(kve_policy_reads(NULL), 0);
    ASSERT_EQ(kve_policy_key_dim(NULL), 0);
    ASSERT_EQ(kve_bank_reads(NULL), 0);
    ASSERT_EQ(kve_bank_key_dim(NULL), 0);
    ASSERT_STATUS(kve_policy_step_keys(NULL, 0, NULL, 0, key), KVE_EINVAL);
    kve_policy_free(NULL);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_step_refusals);
    RUN(test_evict_refusals);
    RUN(test_growth_failure);
    RUN(test_construction_refusals);
    RUN(test_null_accessors);
    return CHECK_DONE();
}
