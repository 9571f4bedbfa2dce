/* SPDX-License-Identifier: MIT */
/*
 * test_neighbours.c - H2O's structural neighbours (docs/policies/): the streaming
 * sink layout, window, full, random's determinism and Rng use, and the
 * state-bytes figure of every policy as its file comment states it.
 */
#include "check.h"
#include "facts.h"
#include "test_allocator.h"
#include "internal.h"
#include "kvevict.h"

enum { MAXN = 4096 };

static float row[MAXN];
static int32_t victims[MAXN], victims2[MAXN];

/* Steps with a random row (or NULL one time in five) at `pos`, and every
 * vector a policy may read (facts.h). */
static kve_status step_random(kve_policy *p, int32_t pos, kve_rng *g)
{
    size_t n = kve_policy_size(p);
    for (size_t i = 0; i < n; i++)
        row[i] = (float)kve_rng_uniform(g);
    return facts_step(p, pos, kve_rng_below(g, 5) ? row : NULL, n, g);
}

/* Streaming keeps the first `sinks` positions ever admitted and the newest
 * budget - sinks, whatever the attention says; checked exactly after every
 * step, with gaps between positions and runs past the sliding block. */
static void test_streaming_sinks(void)
{
    kve_policy *p = NULL;
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    ASSERT_OK(kve_policy_new("streaming:budget=12,sinks=4", NULL, &p));
    int32_t admitted[3000];
    int32_t pos = 4;
    size_t nv = 0;
    for (int t = 0; t < 3000; t++) {
        pos += 1 + (int32_t)kve_rng_below(&g, 3);
        admitted[t] = pos;
        ASSERT_OK(step_random(p, pos, &g));
        ASSERT_OK(kve_policy_evict(p, 12, victims, MAXN, &nv));
        size_t seen = (size_t)t + 1;
        size_t want = seen < 12 ? seen : 12;
        ASSERT_EQ(kve_policy_size(p), want);
        ASSERT_EQ(nv, seen > 12 ? 1 : 0);
        if (nv)
            ASSERT_EQ(victims[0], admitted[t - 8]); /* the oldest non-sink */
        const int32_t *kept = kve_policy_positions(p);
        for (size_t i = 0; i < want; i++) {
            int32_t expect = i < 4 || seen <= 12 ? admitted[i] : admitted[seen - (want - i)];
            ASSERT_EQ(kept[i], expect);
        }
    }
    /* A deeper cut takes the oldest non-sinks, ascending. */
    ASSERT_OK(kve_policy_evict(p, 7, victims, MAXN, &nv));
    ASSERT_EQ(nv, 5);
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(victims[i], admitted[3000 - 8 + i]);
    const int32_t *kept = kve_policy_positions(p);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(kept[i], admitted[i]);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(kept[4 + i], admitted[3000 - 3 + i]);
    /* Down to sinks + 1. */
    ASSERT_OK(kve_policy_evict(p, 5, victims, MAXN, &nv));
    ASSERT_EQ(nv, 2);
    ASSERT_EQ(kve_policy_positions(p)[4], admitted[2999]);
    kve_policy_free(p);
}

/* The default streaming layout: positions 0..3 forever + the newest 508. */
static void test_streaming_default(void)
{
    kve_policy *p = NULL;
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    ASSERT_OK(kve_policy_new("streaming", NULL, &p));
    size_t nv = 0;
    for (int32_t t = 0; t < 2000; t++) {
        ASSERT_OK(step_random(p, t, &g));
        ASSERT_OK(kve_policy_evict(p, 512, victims, MAXN, &nv));
    }
    const int32_t *kept = kve_policy_positions(p);
    ASSERT_EQ(kve_policy_size(p), 512);
    for (int32_t i = 0; i < 4; i++)
        ASSERT_EQ(kept[i], i);
    for (int32_t i = 4; i < 512; i++)
        ASSERT_EQ(kept[i], 2000 - 512 + i);
    kve_policy_free(p);
}

/* Streaming with sinks = 0 is window: same victims every step. */
static void test_streaming_without_sinks_is_window(void)
{
    kve_policy *s = NULL, *w = NULL;
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    ASSERT_OK(kve_policy_new("streaming:budget=9,sinks=0", NULL, &s));
    ASSERT_OK(kve_policy_new("window:budget=9", NULL, &w));
    size_t ns = 0, nw = 0;
    for (int32_t t = 0; t < 1500; t++) {
        ASSERT_OK(kve_policy_step(s, t, NULL, 0));
        ASSERT_OK(kve_policy_step(w, t, NULL, 0));
        if (kve_rng_below(&g, 4) == 0)
            continue; /* several steps without an evict, then several victims */
        size_t b = 1 + (size_t)kve_rng_below(&g, 9);
        ASSERT_OK(kve_policy_evict(s, b, victims, MAXN, &ns));
        ASSERT_OK(kve_policy_evict(w, b, victims2, MAXN, &nw));
        ASSERT_EQ(ns, nw);
        ASSERT_TRUE(memcmp(victims, victims2, ns * sizeof *victims) == 0);
        ASSERT_EQ(kve_policy_size(s), kve_policy_size(w));
        ASSERT_TRUE(memcmp(kve_policy_positions(s), kve_policy_positions(w),
                           kve_policy_size(s) * sizeof(int32_t)) == 0);
    }
    kve_policy_free(s);
    kve_policy_free(w);
}

/* Window keeps exactly the newest budget positions. */
static void test_window(void)
{
    kve_policy *p = NULL;
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    ASSERT_OK(kve_policy_new("window:budget=5", NULL, &p));
    size_t nv = 0;
    for (int32_t t = 0; t < 1000; t++) {
        ASSERT_OK(step_random(p, 3 * t, &g));
        ASSERT_OK(kve_policy_evict(p, 5, victims, MAXN, &nv));
        size_t n = kve_policy_size(p);
        ASSERT_EQ(n, t < 5 ? (size_t)t + 1 : 5);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(kve_policy_positions(p)[i], 3 * (t - (int32_t)(n - 1 - i)));
        if (t >= 5) {
            ASSERT_EQ(nv, 1);
            ASSERT_EQ(victims[0], 3 * (t - 5));
        }
    }
    ASSERT_OK(kve_policy_evict(p, 1, victims, MAXN, &nv));
    ASSERT_EQ(nv, 4);
    ASSERT_EQ(kve_policy_positions(p)[0], 3 * 999);
    kve_policy_free(p);
}

/* full never evicts: it grows, reports 0 victims, needs no buffer. */
static void test_full(void)
{
    kve_policy *p = NULL;
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    ASSERT_OK(kve_policy_new("full:budget=4", NULL, &p));
    ASSERT_EQ(kve_policy_state_bytes(p), 4 * 5);
    for (int32_t t = 0; t < 1000; t++) {
        ASSERT_OK(step_random(p, t, &g));
        size_t nv = 99;
        ASSERT_OK(kve_policy_evict(p, 4, NULL, 0, &nv));
        ASSERT_EQ(nv, 0);
        ASSERT_OK(kve_policy_evict(p, 1, victims, MAXN, &nv));
        ASSERT_EQ(nv, 0);
        ASSERT_EQ(kve_policy_size(p), (size_t)t + 1);
    }
    for (int32_t i = 0; i < 1000; i++)
        ASSERT_EQ(kve_policy_positions(p)[i], i);
    /* Geometric growth from budget + 1 = 5 slots: 5, 10, ..., 1280. */
    ASSERT_EQ(kve_policy_state_bytes(p), 4 * 1280);
    kve_policy_free(p);
}

/* random: needs an Rng, draws exactly one output of it, same seed same
 * victims, different seeds different victims, never a protected position. */
static void test_random(void)
{
    kve_policy *p = NULL;
    ASSERT_STATUS(kve_policy_new("random:budget=8", NULL, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "rng");
    ASSERT_TRUE(p == NULL);

    kve_rng a, b, c, a_next;
    kve_rng_seed(&a, 7);
    kve_rng_seed(&b, 7);
    kve_rng_seed(&c, 8);
    a_next = a;
    (void)kve_rng_next(&a_next);
    kve_policy *pa = NULL, *pb = NULL, *pc = NULL;
    ASSERT_OK(kve_policy_new("random:budget=8,recent_window=3", &a, &pa));
    ASSERT_TRUE(memcmp(&a, &a_next, sizeof a) == 0); /* advanced by exactly one draw */
    ASSERT_OK(kve_policy_new("random:budget=8,recent_window=3", &b, &pb));
    ASSERT_OK(kve_policy_new("random:budget=8,recent_window=3", &c, &pc));
    /* A second policy from the same generator draws a different stream. */
    kve_policy *pa2 = NULL;
    ASSERT_OK(kve_policy_new("random:budget=8,recent_window=3", &a, &pa2));

    int32_t vb[MAXN], vc[MAXN], va2[MAXN];
    size_t na = 0, nb = 0, nc = 0, na2 = 0, differ_seed = 0, differ_stream = 0;
    for (int32_t t = 0; t < 2000; t++) {
        kve_policy *all[4] = {pa, pb, pc, pa2};
        for (int k = 0; k < 4; k++)
            ASSERT_OK(kve_policy_step(all[k], t, NULL, 0));
        /* The caller's generators are not touched after construction. */
        size_t budget = t % 7 == 0 ? 4 : 8;
        ASSERT_OK(kve_policy_evict(pa, budget, victims, MAXN, &na));
        ASSERT_OK(kve_policy_evict(pb, budget, vb, MAXN, &nb));
        ASSERT_OK(kve_policy_evict(pc, budget, vc, MAXN, &nc));
        ASSERT_OK(kve_policy_evict(pa2, budget, va2, MAXN, &na2));
        ASSERT_EQ(na, nb);
        ASSERT_TRUE(memcmp(victims, vb, na * sizeof *vb) == 0);
        ASSERT_EQ(nc, na);
        differ_seed += memcmp(victims, vc, na * sizeof *vc) != 0;
        differ_stream += memcmp(victims, va2, na * sizeof *va2) != 0;
        /* The newest recent_window = 3 positions are never victims. */
        for (size_t i = 0; i < na; i++)
            ASSERT_TRUE(victims[i] < t - 2);
        for (size_t i = 1; i < na; i++)
            ASSERT_TRUE(victims[i] > victims[i - 1]);
        ASSERT_EQ(kve_policy_positions(pa)[kve_policy_size(pa) - 1], t);
    }
    ASSERT_TRUE(differ_seed > 500);
    ASSERT_TRUE(differ_stream > 500);
    kve_policy_free(pa);
    kve_policy_free(pb);
    kve_policy_free(pc);
    kve_policy_free(pa2);
}

/* Victims of random are uniform over the unprotected slots: with 4 kept,
 * one protected and one victim per step, each of the 3 candidate slots goes
 * a third of the time. */
static void test_random_uniform(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("random:budget=3,recent_window=1", &g, &p));
    long count[3] = {0};
    size_t nv = 0;
    enum { N = 30000 };
    for (int32_t t = 0; t < N + 3; t++) {
        ASSERT_OK(kve_policy_step(p, t, NULL, 0));
        const int32_t *kept = kve_policy_positions(p);
        int32_t slots[4];
        size_t n = kve_policy_size(p);
        memcpy(slots, kept, n * sizeof *slots);
        ASSERT_OK(kve_policy_evict(p, 3, victims, MAXN, &nv));
        if (nv == 1) {
            size_t i = 0;
            while (slots[i] != victims[0])
                i++;
            ASSERT_TRUE(i < 3);
            count[i]++;
        }
    }
    double chi = 0, expect = (double)N / 3;
    for (int i = 0; i < 3; i++)
        chi += ((double)count[i] - expect) * ((double)count[i] - expect) / expect;
    ASSERT_TRUE(chi < 30.0); /* 2 dof: P(chi > 30) < 1e-6 */
    kve_policy_free(p);
}

/* kve_policy_state_bytes per the file comments: sliding layout 4 bytes a
 * slot over (budget + 1) + max(1, (budget + 1) / 8) slots; the others over
 * budget + 1 slots at full 4, random 5, h2o/tova/h2o_decay/scissorhands 13,
 * scissorhands with a history 21, h2o_mean 25. */
static size_t sliding_slots(size_t budget)
{
    size_t slack = (budget + 1) / 8;
    return budget + 1 + (slack ? slack : 1);
}

static void test_state_bytes(void)
{
    static const size_t budgets[] = {1, 2, 7, 8, 63, 100, 512};
    kve_rng g;
    kve_rng_seed(&g, 1);
    for (size_t k = 0; k < sizeof budgets / sizeof budgets[0]; k++) {
        size_t b = budgets[k];
        struct {
            const char *fmt;
            size_t bytes;
        } cases[] = {
            {"full:budget=%zu", 4 * (b + 1)},
            {"window:budget=%zu", 4 * sliding_slots(b)},
            {"streaming:budget=%zu,sinks=0", 4 * sliding_slots(b)},
            {"random:budget=%zu", 5 * (b + 1)},
            {"h2o:budget=%zu,recent_window=0", 13 * (b + 1)},
            {"tova:budget=%zu,recent_window=0", 13 * (b + 1)},
            {"h2o_decay:budget=%zu,recent_window=0", 13 * (b + 1)},
            {"scissorhands:budget=%zu,recent_window=0", 13 * (b + 1)},
            {"scissorhands:budget=%zu,recent_window=0,history=1", 21 * (b + 1)},
            {"scissorhands:budget=%zu,recent_window=0,history=64", 21 * (b + 1)},
            {"h2o_mean:budget=%zu,recent_window=0", 25 * (b + 1)},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            char spec[160];
            snprintf(spec, sizeof spec, cases[c].fmt, b);
            kve_policy *p = NULL;
            ASSERT_OK(kve_policy_new(spec, &g, &p));
            if (kve_policy_state_bytes(p) != cases[c].bytes)
                CHECK_FAIL_AT("%s: %zu state bytes, want %zu", spec, kve_policy_state_bytes(p),
                              cases[c].bytes);
            /* The steady state of step-then-evict never changes it (full has
             * none: it never evicts and grows). */
            if (c == 0) {
                kve_policy_free(p);
                continue;
            }
            size_t nv = 0;
            for (int32_t t = 0; t < (int32_t)(2 * b + 20); t++) {
                size_t n = kve_policy_size(p);
                for (size_t i = 0; i < n; i++)
                    row[i] = 1.0f / (float)(1 + (i * 7 + (size_t)t) % 5);
                ASSERT_OK(kve_policy_step(p, t, row, n));
                ASSERT_OK(kve_policy_evict(p, b, victims, MAXN, &nv));
            }
            ASSERT_EQ(kve_policy_state_bytes(p), cases[c].bytes);
            kve_policy_free(p);
        }
    }
    /* The defaults, as the pages quote them. */
    const struct {
        const char *spec;
        size_t bytes;
    } defaults[] = {
        {"full", 2052},       {"window", 2308}, {"streaming", 2308},
        {"random", 2565},     {"h2o", 6669},    {"scissorhands", 6669},
        {"tova", 6669},       {"h2o_decay", 6669}, {"h2o_mean", 12825},
        {"scissorhands:history=8", 10773},
        /* keys of 64 floats: a scalar a slot for knorm, the unit key too for
         * keydiff (13 + 4 * 64 = 269 bytes a slot) */
        {"knorm", 6669},      {"keydiff", 513 * 269},
        /* vnorm: the rule's score and the value's norm beside it (29 bytes a
         * slot); expected_attention: the key and a logit (21 + 4 * 64), and
         * the norm (its vnorm is 1) */
        {"h2o:vnorm=1", 513 * 29}, {"tova:vnorm=1", 513 * 29}, {"h2o_mean:vnorm=1", 513 * 41},
        {"expected_attention", 513 * 285}, {"expected_attention:vnorm=0", 513 * 277},
    };
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = 64;
    o.value_dim = 4;
    o.query_group = 2;
    o.rope = facts_rope();
    o.rope.rotary_dim = 64;
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) {
        kve_policy *p = NULL;
        ASSERT_OK(kve_policy_new_ex(defaults[i].spec, &g, &o, &p));
        if (kve_policy_state_bytes(p) != defaults[i].bytes)
            CHECK_FAIL_AT("%s: %zu state bytes, want %zu", defaults[i].spec,
                          kve_policy_state_bytes(p), defaults[i].bytes);
        kve_policy_free(p);
    }
}

/* The decode path does not allocate in the steady state of step-then-evict
 * (kvevict.h, kve_policy_step): with every allocation made to fail, a long
 * run of every policy but full (which grows by design) still succeeds. */
static void test_steady_state_never_allocates(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    for (size_t t = 0; t < kve_policy_type_count(); t++) {
        const char *name = kve_policy_type_name(t);
        if (strcmp(name, "full") == 0)
            continue;
        char spec[64];
        /* The default recent_window (32) does not fit budget 24. */
        int has_window = strcmp(name, "window") != 0 && strcmp(name, "streaming") != 0;
        snprintf(spec, sizeof spec, "%s:budget=24%s", name, has_window ? ",recent_window=4" : "");
        kve_policy *p = NULL;
        talloc ta;
        talloc_init(&ta);
        kve_policy_options o = kve_policy_default_options();
        o.allocator = &ta.a;
        facts_policy(&o);
        ASSERT_OK(kve_policy_new_ex(spec, &g, &o, &p));
        talloc_fail_after(&ta, 0);
        int ok = 1;
        size_t nv = 0;
        for (int32_t pos = 0; pos < 500 && ok; pos++) {
            ok = step_random(p, pos, &g) == KVE_OK &&
                 kve_policy_evict(p, 24, victims, MAXN, &nv) == KVE_OK;
        }
        size_t made = talloc_fail_after(&ta, SIZE_MAX);
        if (!ok)
            CHECK_FAIL_AT("%s: failed without allocating: %s", spec, kve_last_error());
        ASSERT_EQ(made, 0);
        kve_policy_free(p);
        talloc_check_empty(&ta);
    }
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_streaming_sinks);
    RUN(test_streaming_default);
    RUN(test_streaming_without_sinks_is_window);
    RUN(test_window);
    RUN(test_full);
    RUN(test_random);
    RUN(test_random_uniform);
    RUN(test_state_bytes);
    RUN(test_steady_state_never_allocates);
    return CHECK_DONE();
}
