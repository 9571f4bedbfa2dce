/* SPDX-License-Identifier: MIT */
/*
 * test_spec.c - the spec grammar of kvevict.h: canonical forms and every
 * policy's defaults, round trips, and each way a spec can be malformed, with
 * a message that names the key or the name. kve_spec_with validates without
 * allocating, so out-of-range budgets are probed through it.
 */
#include "check.h"
#include "facts.h"
#include "kvevict.h"

static const struct {
    const char *name, *canonical;
    unsigned reads;
} defaults[] = {
    {"full", "full:budget=512", KVE_READS_NOTHING},
    {"window", "window:budget=512", KVE_READS_NOTHING},
    {"streaming", "streaming:budget=512,sinks=4", KVE_READS_NOTHING},
    {"random", "random:budget=512,recent_window=0", KVE_READS_NOTHING},
    {"h2o", "h2o:budget=512,recent_window=32", KVE_READS_ATTN},
    {"scissorhands", "scissorhands:budget=512,recent_window=32,history=0", KVE_READS_ATTN},
    {"tova", "tova:budget=512,recent_window=1", KVE_READS_ATTN},
    {"h2o_decay", "h2o_decay:budget=512,recent_window=32,decay=0.99", KVE_READS_ATTN},
    {"h2o_mean", "h2o_mean:budget=512,recent_window=32", KVE_READS_ATTN},
    {"knorm", "knorm:budget=512,recent_window=0", KVE_READS_KEYS},
    {"keydiff", "keydiff:budget=512,recent_window=0", KVE_READS_KEYS},
    {"expected_attention",
     "expected_attention:budget=512,recent_window=0,n_future_positions=512,n_sink=4,"
     "use_covariance=1,vnorm=1,epsilon=0,interval=1,n_queries=256",
     KVE_READS_KEYS | KVE_READS_QUERIES | KVE_READS_VALUES},
};
enum { N_POLICIES = sizeof defaults / sizeof defaults[0] };

static void test_registry(void)
{
    ASSERT_EQ(kve_policy_type_count(), N_POLICIES);
    for (size_t i = 0; i < N_POLICIES; i++) {
        ASSERT_STR_EQ(kve_policy_type_name(i), defaults[i].name);
        ASSERT_TRUE(kve_policy_type_summary(i) != NULL);
        ASSERT_TRUE(strlen(kve_policy_type_summary(i)) > 10);
        ASSERT_EQ(kve_policy_type_reads(i), defaults[i].reads);
    }
    ASSERT_EQ(kve_policy_type_reads(N_POLICIES), 0);
    ASSERT_EQ(KVE_READS_QUERIES | KVE_READS_VALUES, 12);
    ASSERT_TRUE(kve_policy_type_name(N_POLICIES) == NULL);
    ASSERT_TRUE(kve_policy_type_summary(N_POLICIES) == NULL);
    ASSERT_TRUE(kve_policy_type_name(SIZE_MAX) == NULL);
}

static void test_defaults_and_round_trip(void)
{
    kve_rng g;
    kve_rng_seed(&g, 1);
    kve_policy_options o = kve_policy_default_options();
    facts_policy(&o); /* the policies that read keys, queries or values need them */
    for (size_t i = 0; i < N_POLICIES; i++) {
        kve_policy *p = NULL, *q = NULL;
        ASSERT_OK(kve_policy_new_ex(defaults[i].name, &g, &o, &p));
        ASSERT_STR_EQ(kve_policy_spec(p), defaults[i].canonical);
        ASSERT_STR_EQ(kve_policy_name(p), defaults[i].name);
        ASSERT_EQ(kve_policy_budget(p), 512);
        ASSERT_EQ(kve_policy_reads(p), defaults[i].reads);
        ASSERT_OK(kve_policy_new_ex(kve_policy_spec(p), &g, &o, &q));
        ASSERT_STR_EQ(kve_policy_spec(q), defaults[i].canonical);
        ASSERT_EQ(kve_policy_state_bytes(q), kve_policy_state_bytes(p));
        kve_policy_free(p);
        kve_policy_free(q);
        char out[160];
        ASSERT_OK(kve_spec_with(defaults[i].name, NULL, NULL, out, sizeof out));
        ASSERT_STR_EQ(out, defaults[i].canonical);
    }
}

/* KVE_SPEC_MAX holds the longest canonical spec of every policy: every key
 * at its widest value (the largest integer, a real of 17 digits and the
 * smallest exponent its range allows). */
static void test_longest_specs_fit(void)
{
    for (size_t t = 0; t < kve_policy_type_count(); t++) {
        char spec[1024];
        const char *name = kve_policy_type_name(t);
        snprintf(spec, sizeof spec, "%s", name);
        static const char *const widest[][2] = {
            {"budget", "16777216"},     {"recent_window", "16777215"}, {"sinks", "16777215"},
            {"n_sink", "16777215"},     {"history", "64"},             {"block", "16777216"},
            {"block_mean", "1"},        {"vnorm", "1"},
            {"decay", "0.12345678901234567"},
            {"epsilon", "0.0012345678901234567"},
            {"n_future_positions", "1048576"}, {"use_covariance", "1"},
            {"interval", "16777216"},   {"n_queries", "65536"},
            {"future_from_buffer", "1"}, {"diagonal", "1"},
        };
        for (size_t k = 0; k < sizeof widest / sizeof widest[0]; k++) {
            char out[1024];
            if (kve_spec_with(spec, widest[k][0], widest[k][1], out, sizeof out) == KVE_OK)
                snprintf(spec, sizeof spec, "%s", out);
        }
        char fits[KVE_SPEC_MAX];
        /* the widths alone may break a cross-key check (recent_window <
         * budget holds; pages need none): canonicalise what parsed */
        if (kve_spec_with(spec, NULL, NULL, fits, sizeof fits) != KVE_OK)
            CHECK_FAIL_AT("%s: its widest spec (%zu bytes) does not fit KVE_SPEC_MAX: %s", name,
                          strlen(spec) + 1, kve_last_error());
        ASSERT_TRUE(strlen(spec) > strlen(name));
    }
}

/* Non-default specs, keys in any order, come back in the fixed order. */
static void test_canonical_forms(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"h2o:recent_window=8,budget=64", "h2o:budget=64,recent_window=8"},
        {"scissorhands:history=7,budget=100", "scissorhands:budget=100,recent_window=32,history=7"},
        {"scissorhands:history=64,recent_window=0,budget=1",
         "scissorhands:budget=1,recent_window=0,history=64"},
        {"streaming:sinks=0,budget=1", "streaming:budget=1,sinks=0"},
        {"h2o_decay:decay=1", "h2o_decay:budget=512,recent_window=32,decay=1"},
        {"h2o_decay:decay=0.5", "h2o_decay:budget=512,recent_window=32,decay=0.5"},
        {"h2o_decay:decay=.5", "h2o_decay:budget=512,recent_window=32,decay=0.5"},
        {"h2o_decay:decay=1e-3", "h2o_decay:budget=512,recent_window=32,decay=0.001"},
        {"h2o_decay:decay=5E-1", "h2o_decay:budget=512,recent_window=32,decay=0.5"},
        {"h2o_decay:decay=0.990", "h2o_decay:budget=512,recent_window=32,decay=0.99"},
        {"h2o_decay:decay=+0.25", "h2o_decay:budget=512,recent_window=32,decay=0.25"},
        {"h2o_decay:decay=0.333333333333333314829616256247",
         "h2o_decay:budget=512,recent_window=32,decay=0.3333333333333333"},
        {"tova:budget=0002", "tova:budget=2,recent_window=1"},
        {"random:budget=16777216", "random:budget=16777216,recent_window=0"},
        {"h2o:budget=16777216,recent_window=16777215",
         "h2o:budget=16777216,recent_window=16777215"},
        {"window:budget=1", "window:budget=1"},
        {"full", "full:budget=512"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[160], again[160];
        ASSERT_OK(kve_spec_with(cases[i].in, NULL, NULL, out, sizeof out));
        ASSERT_STR_EQ(out, cases[i].out);
        ASSERT_OK(kve_spec_with(out, NULL, NULL, again, sizeof again));
        ASSERT_STR_EQ(again, out);
    }
    /* Build (small budgets only) and compare with the policy's own spec. */
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o_decay:decay=1e-3,recent_window=2,budget=9", NULL, &p));
    ASSERT_STR_EQ(kve_policy_spec(p), "h2o_decay:budget=9,recent_window=2,decay=0.001");
    kve_policy_free(p);
}

/* A real that needs 17 digits survives the round trip exactly. */
static void test_real_round_trip(void)
{
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    for (int k = 0; k < 200; k++) {
        double d = 1.0 - kve_rng_uniform(&g); /* (0, 1] */
        char value[64], spec[160], back[160];
        snprintf(value, sizeof value, "%.17g", d);
        ASSERT_OK(kve_spec_with("h2o_decay", "decay", value, spec, sizeof spec));
        const char *v = strstr(spec, "decay=");
        ASSERT_TRUE(v != NULL);
        ASSERT_TRUE(strtod(v + 6, NULL) == d);
        ASSERT_OK(kve_spec_with(spec, NULL, NULL, back, sizeof back));
        ASSERT_STR_EQ(back, spec);
    }
}

static void test_malformed_specs(void)
{
    static const struct {
        const char *spec, *needle;
    } bad[] = {
        {"", "name"},
        {":budget=4", "name"},
        {"H2O", "invalid character"},
        {"h2o ", "invalid character"},
        {" h2o", "invalid character"},
        {"h2o-x", "invalid character"},
        {"abcdefghijklmnopqrstuvwxyzabcdefgh", "longer than"},
        {"lru", "unknown policy \"lru\""},
        {"lru", "h2o_mean"}, /* the message lists the known names */
        {"h2o:", "nothing follows"},
        {"h2o:bogus=1", "bogus"},
        {"h2o:sinks=1", "sinks"},
        {"window:recent_window=1", "recent_window"},
        {"h2o:budget=8,budget=9", "twice"},
        {"h2o:budget=8,budget=8", "budget"},
        {"h2o:budget=", "budget"},
        {"h2o:budget=", "empty"},
        {"h2o:budget=8,", "trailing"},
        {"h2o:budget=8,,recent_window=1", "empty parameter"},
        {"h2o:,budget=8", "empty parameter"},
        {"h2o:budget", "no '='"},
        {"h2o:budget=8,recent_window", "recent_window"},
        {"h2o:=8", "unknown key"},
        {"h2o:budget= 8", "budget"},
        {"h2o:budget=8 ", "budget"},
        {"h2o: budget=8", "unknown key"},
        {"h2o:budget=-1", "budget"},
        {"h2o:budget=+8", "budget"},
        {"h2o:budget=0", "budget"},
        {"h2o:budget=0", "out of range"},
        {"h2o:budget=16777217", "budget=16777217"},
        {"h2o:budget=18446744073709551615", "budget"},
        {"h2o:budget=18446744073709551616", "out of range"},
        {"h2o:budget=99999999999999999999999999", "budget"},
        {"h2o:budget=0x10", "budget"},
        {"h2o:budget=1e3", "budget"},
        {"h2o:budget=8.0", "budget"},
        {"h2o:recent_window=16777216,budget=16777216", "recent_window"},
        {"h2o:budget=8,recent_window=8", "recent_window"},
        {"h2o_mean:budget=8,recent_window=9", "recent_window"},
        {"scissorhands:history=65", "history"},
        {"scissorhands:history=-1", "history"},
        {"streaming:sinks=512", "sinks"},
        {"streaming:budget=2,sinks=3", "sinks"},
        {"tova:budget=1", "recent_window"},
        {"random:recent_window=512", "recent_window"},
        {"h2o_decay:decay=0", "decay"},
        {"h2o_decay:decay=0.0", "out of range"},
        {"h2o_decay:decay=-0.5", "decay"},
        {"h2o_decay:decay=1.0000001", "decay"},
        {"h2o_decay:decay=2", "decay"},
        {"h2o_decay:decay=inf", "decay"},
        {"h2o_decay:decay=nan", "decay"},
        {"h2o_decay:decay=0x1p-1", "decay"},
        {"h2o_decay:decay=1e400", "decay"},
        {"h2o_decay:decay=0.5.5", "decay"},
        {"h2o_decay:decay=--1", "decay"},
        {"h2o_decay:decay= 0.5", "decay"},
        {"h2o_decay:decay=", "decay"},
        {"h2o_decay:decay=e", "decay"},
        {"h2o_decay:decay=0.5,decay=0.5", "twice"},
        {"full:budget=4:budget=5", "budget"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char out[160] = "untouched";
        kve_policy *p = NULL;
        kve_status st = kve_policy_new(bad[i].spec, NULL, &p);
        if (st != KVE_EINVAL)
            CHECK_FAIL_AT("\"%s\" -> %s, want KVE_EINVAL", bad[i].spec, kve_status_name(st));
        ASSERT_CONTAINS(kve_last_error(), bad[i].needle);
        ASSERT_TRUE(p == NULL);
        ASSERT_STATUS(kve_spec_with(bad[i].spec, NULL, NULL, out, sizeof out), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), bad[i].needle);
        ASSERT_STR_EQ(out, "untouched");
    }
    kve_policy *p = NULL;
    ASSERT_STATUS(kve_policy_new(NULL, NULL, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "spec");
}

static void test_spec_with(void)
{
    char out[160];
    ASSERT_OK(kve_spec_with("h2o", "budget", "256", out, sizeof out));
    ASSERT_STR_EQ(out, "h2o:budget=256,recent_window=32");
    ASSERT_OK(kve_spec_with("h2o:budget=128", "recent_window", "8", out, sizeof out));
    ASSERT_STR_EQ(out, "h2o:budget=128,recent_window=8");
    ASSERT_OK(kve_spec_with("h2o:budget=128,recent_window=8", "budget", "64", out, sizeof out));
    ASSERT_STR_EQ(out, "h2o:budget=64,recent_window=8");
    ASSERT_OK(kve_spec_with("h2o_decay:decay=0.5", "decay", "0.25", out, sizeof out));
    ASSERT_STR_EQ(out, "h2o_decay:budget=512,recent_window=32,decay=0.25");
    ASSERT_OK(kve_spec_with("scissorhands", "history", "64", out, sizeof out));
    ASSERT_STR_EQ(out, "scissorhands:budget=512,recent_window=32,history=64");
    /* Cross-parameter checks apply to the result: a replacement may resolve a
     * contradiction of the spec it edits, or create one. */
    ASSERT_OK(kve_spec_with("h2o:budget=16", "recent_window", "4", out, sizeof out));
    ASSERT_STR_EQ(out, "h2o:budget=16,recent_window=4");
    ASSERT_OK(kve_spec_with("h2o:budget=16,recent_window=40", "recent_window", "4", out,
                            sizeof out));
    ASSERT_STR_EQ(out, "h2o:budget=16,recent_window=4");
    ASSERT_OK(kve_spec_with("h2o:budget=16", "budget", "33", out, sizeof out));
    ASSERT_STR_EQ(out, "h2o:budget=33,recent_window=32");
    ASSERT_STATUS(kve_spec_with("h2o:budget=64", "budget", "32", out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "recent_window");

    /* Errors name the key. */
    strcpy(out, "untouched");
    ASSERT_STATUS(kve_spec_with("h2o", "sinks", "1", out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "sinks");
    ASSERT_STATUS(kve_spec_with("h2o", "budget", NULL, out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "budget");
    ASSERT_STATUS(kve_spec_with("h2o", "budget", "abc", out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "budget");
    ASSERT_STATUS(kve_spec_with("h2o", "budget", "", out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "budget");
    ASSERT_STATUS(kve_spec_with("h2o", "budget", "16777217", out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "budget");
    ASSERT_STATUS(kve_spec_with("h2o", "", "1", out, sizeof out), KVE_EINVAL);
    ASSERT_STATUS(kve_spec_with("h2o_decay", "decay", "0", out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "decay");
    ASSERT_STATUS(kve_spec_with("nosuch", "budget", "1", out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "nosuch");
    ASSERT_STATUS(kve_spec_with(NULL, NULL, NULL, out, sizeof out), KVE_EINVAL);
    ASSERT_STATUS(kve_spec_with("h2o", NULL, NULL, NULL, 10), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "out");
    ASSERT_STR_EQ(out, "untouched");

    /* Capacity: the text and its NUL; ERANGE leaves out untouched. */
    const char *want = "h2o:budget=512,recent_window=32";
    size_t len = strlen(want);
    ASSERT_STATUS(kve_spec_with("h2o", NULL, NULL, out, len), KVE_ERANGE);
    ASSERT_CONTAINS(kve_last_error(), "32 bytes");
    ASSERT_STR_EQ(out, "untouched");
    ASSERT_STATUS(kve_spec_with("h2o", NULL, NULL, out, 0), KVE_ERANGE);
    ASSERT_STR_EQ(out, "untouched");
    ASSERT_OK(kve_spec_with("h2o", NULL, NULL, out, len + 1));
    ASSERT_STR_EQ(out, want);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_registry);
    RUN(test_longest_specs_fit);
    RUN(test_defaults_and_round_trip);
    RUN(test_canonical_forms);
    RUN(test_real_round_trip);
    RUN(test_malformed_specs);
    RUN(test_spec_with);
    return CHECK_DONE();
}
