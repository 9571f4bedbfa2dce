/* SPDX-License-Identifier: MIT */
/*
 * check.h - the in-house test framework: typed assertions that print both
 * sides, a failure counter, and a seed every randomised test prints and
 * accepts back (KVE_TEST_SEED=N or argv[1]) for replay.
 *
 * A test file defines test functions, then:
 *     int main(int argc, char **argv) { CHECK_INIT(argc, argv); RUN(test_a); ...; return CHECK_DONE(); }
 * An assertion failure reports and returns from the current test function.
 *
 * check_light(): KVE_TEST_LIGHT=1 (scripts/ci-gates.sh's valgrind gate, where
 * a step costs some hundred times its native time) asks a test whose grid is
 * large for its light grid: every path it reaches (type, variant, thread
 * count, policy) still taken, each once rather than in every combination.
 * Natively and under the sanitizers the full grid runs.
 */
#ifndef KVE_CHECK_H
#define KVE_CHECK_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures;
static int check_tests;
static uint64_t check_seed = 20261129u;

static inline int check_light(void)
{
    const char *s = getenv("KVE_TEST_LIGHT");
    return s && *s && strcmp(s, "0") != 0;
}

#define CHECK_FAIL_AT(...)                                              \
    do {                                                                \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                 \
        fprintf(stderr, __VA_ARGS__);                                   \
        fprintf(stderr, "\n");                                          \
        check_failures++;                                               \
        return;                                                         \
    } while (0)

#define ASSERT_TRUE(c) \
    do { if (!(c)) CHECK_FAIL_AT("ASSERT_TRUE(%s) failed", #c); } while (0)
#define ASSERT_EQ(a, b)                                                                    \
    do {                                                                                   \
        long long va_ = (long long)(a), vb_ = (long long)(b);                              \
        if (va_ != vb_) CHECK_FAIL_AT("ASSERT_EQ(%s, %s): %lld != %lld", #a, #b, va_, vb_); \
    } while (0)
#define ASSERT_U64_EQ(a, b)                                                           \
    do {                                                                              \
        uint64_t va_ = (uint64_t)(a), vb_ = (uint64_t)(b);                            \
        if (va_ != vb_)                                                               \
            CHECK_FAIL_AT("ASSERT_U64_EQ(%s, %s): %" PRIu64 " != %" PRIu64, #a, #b, va_, vb_); \
    } while (0)
#define ASSERT_NEAR(a, b, tol)                                                              \
    do {                                                                                    \
        double va_ = (double)(a), vb_ = (double)(b);                                        \
        if (!(fabs(va_ - vb_) <= (tol)))                                                    \
            CHECK_FAIL_AT("ASSERT_NEAR(%s, %s, %s): %.17g vs %.17g", #a, #b, #tol, va_, vb_); \
    } while (0)
#define ASSERT_STR_EQ(a, b)                                                       \
    do {                                                                          \
        const char *sa_ = (a), *sb_ = (b);                                        \
        if (!sa_ || !sb_ || strcmp(sa_, sb_) != 0)                                \
            CHECK_FAIL_AT("ASSERT_STR_EQ(%s, %s): \"%s\" != \"%s\"", #a, #b,      \
                          sa_ ? sa_ : "(null)", sb_ ? sb_ : "(null)");            \
    } while (0)
#define ASSERT_CONTAINS(hay, needle)                                                   \
    do {                                                                               \
        const char *h_ = (hay), *n_ = (needle);                                        \
        if (!h_ || !strstr(h_, n_))                                                    \
            CHECK_FAIL_AT("ASSERT_CONTAINS(%s, \"%s\"): got \"%s\"", #hay, n_, h_ ? h_ : "(null)"); \
    } while (0)
/* A kve_status call that must succeed; prints the library's message if not. */
#define ASSERT_OK(call)                                                                  \
    do {                                                                                 \
        kve_status st_ = (call);                                                         \
        if (st_ != KVE_OK)                                                               \
            CHECK_FAIL_AT("%s -> %s: %s", #call, kve_status_name(st_), kve_last_error()); \
    } while (0)
#define ASSERT_STATUS(call, want)                                                        \
    do {                                                                                 \
        kve_status st_ = (call);                                                         \
        if (st_ != (want))                                                               \
            CHECK_FAIL_AT("%s -> %s, want %s (%s)", #call, kve_status_name(st_),         \
                          kve_status_name(want), kve_last_error());                      \
    } while (0)

#define CHECK_INIT(argc, argv)                                                   \
    do {                                                                         \
        const char *s_ = getenv("KVE_TEST_SEED");                                \
        if ((argc) > 1) s_ = (argv)[1];                                          \
        if (s_) check_seed = strtoull(s_, NULL, 10);                             \
        printf("seed %" PRIu64 " (replay: %s %" PRIu64 ")\n", check_seed, (argv)[0], check_seed); \
    } while (0)

#define RUN(fn)                                                                  \
    do {                                                                         \
        int before_ = check_failures;                                            \
        check_tests++;                                                           \
        fn();                                                                    \
        printf("%s %s\n", check_failures == before_ ? "ok  " : "FAIL", #fn);     \
    } while (0)

#define CHECK_DONE()                                                             \
    (printf("%d tests, %d failures\n", check_tests, check_failures), check_failures ? 1 : 0)

#endif /* KVE_CHECK_H */
