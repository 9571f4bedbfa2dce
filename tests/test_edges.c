/* SPDX-License-Identifier: MIT */
/*
 * test_edges.c - the corners the module tests do not reach, found with the
 * coverage report: status names outside the enum, the allocator's zero-size
 * requests, spec text at the edges of the grammar (long quotes, characters
 * just outside [a-z0-9_], reals that overflow or underflow strtod), the NULL
 * accessors of traces, trace sources that only look canonical, and a
 * canonical trace with empty band and heavy sets, and a .npy file that
 * changes or shrinks after it was opened and validated. Each case asserts the
 * documented behaviour, not merely that the line ran.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "internal.h"
#include "test_allocator.h"
#include "kvevict_eval.h"
#include "eval_options.h"

#include <stdlib.h>
#include <unistd.h>

static void test_status_names(void)
{
    ASSERT_STR_EQ(kve_status_name(KVE_OK), "KVE_OK");
    ASSERT_STR_EQ(kve_status_name(KVE_EINVAL), "KVE_EINVAL");
    ASSERT_STR_EQ(kve_status_name(KVE_ENOMEM), "KVE_ENOMEM");
    ASSERT_STR_EQ(kve_status_name(KVE_ERANGE), "KVE_ERANGE");
    ASSERT_STR_EQ(kve_status_name(KVE_EFORMAT), "KVE_EFORMAT");
    ASSERT_STR_EQ(kve_status_name(KVE_EIO), "KVE_EIO");
    ASSERT_STR_EQ(kve_status_name((kve_status)99), "KVE_UNKNOWN");
    ASSERT_STR_EQ(kve_status_name((kve_status)-1), "KVE_UNKNOWN");
}

/* Zero-size requests still return a distinct, freeable block (never NULL
 * for success), so callers need no special case for empty shapes. */
/* The version the library reports is the header's, generated from the one
 * definition in CMakeLists.txt; the number orders like the string. */
static void test_version(void)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", KVEVICT_VERSION_MAJOR, KVEVICT_VERSION_MINOR,
             KVEVICT_VERSION_PATCH);
    ASSERT_STR_EQ(kve_version(), want);
    ASSERT_STR_EQ(kve_version(), KVEVICT_VERSION_STRING);
    ASSERT_EQ(kve_version_number(), KVEVICT_VERSION_NUMBER);
    ASSERT_EQ(kve_version_number(),
              KVEVICT_VERSION_MAJOR * 10000 + KVEVICT_VERSION_MINOR * 100 + KVEVICT_VERSION_PATCH);
    /* The public limits are what the parser enforces. */
    char out[KVE_SPEC_MAX], spec[64];
    snprintf(spec, sizeof spec, "window:budget=%d", KVE_MAX_BUDGET);
    ASSERT_OK(kve_spec_with(spec, NULL, NULL, out, sizeof out));
    snprintf(spec, sizeof spec, "window:budget=%d", KVE_MAX_BUDGET + 1);
    ASSERT_STATUS(kve_spec_with(spec, NULL, NULL, out, sizeof out), KVE_EINVAL);
}

/* Requests of 0 bytes become 1 (the allocator interface never sees 0,
 * which means "free"), going out and coming back; NULL is never freed; an
 * overflowing array is refused before the allocator is asked. */
static void test_zero_size_allocations(void)
{
    talloc ta;
    talloc_init(&ta);
    const kve_allocator a = kve__allocator(&ta.a);
    void *p = kve__alloc(&a, 0), *q = kve__alloc_zero(&a, 0), *r = kve__alloc_array(&a, 0, 8);
    ASSERT_TRUE(p && q && r && p != q && q != r);
    ASSERT_EQ(ta.bytes, 3);
    ASSERT_TRUE(kve__alloc_array(&a, SIZE_MAX / 2, 3) == NULL);
    ASSERT_EQ(ta.made, 3);
    kve__dealloc(&a, p, 0);
    kve__dealloc(&a, q, 0);
    kve__dealloc(&a, r, 0 * 8);
    kve__dealloc(&a, NULL, 5);
    talloc_check_empty(&ta);
    /* NULL, or an allocator without a function: the C library's. */
    const kve_allocator c = kve__allocator(NULL);
    kve_allocator none = {NULL, &ta};
    ASSERT_TRUE(c.fn != NULL && kve__allocator(&none).fn == c.fn);
    void *m = kve__alloc_zero(&c, 16);
    ASSERT_TRUE(m != NULL && ((unsigned char *)m)[15] == 0);
    kve__dealloc(&c, m, 16);
    ASSERT_EQ(ta.calls, 6); /* three requests, three releases */
}

/* kve_set_error: for the layers built on kvevict. It returns its status,
 * sets what kve_last_error reads, may quote the message it replaces, keeps
 * to one printable line of at most 255 bytes; a NULL format clears it. */
static void test_set_error(void)
{
    ASSERT_EQ(kve_set_error(KVE_EFORMAT, "rows: %d is not %s", 3, "4"), KVE_EFORMAT);
    ASSERT_STR_EQ(kve_last_error(), "rows: 3 is not 4");
    ASSERT_EQ(kve_set_error(KVE_EINVAL, "layer %d: %s", 2, kve_last_error()), KVE_EINVAL);
    ASSERT_STR_EQ(kve_last_error(), "layer 2: rows: 3 is not 4");
    kve_policy *p = NULL;
    ASSERT_STATUS(kve_policy_new("nosuch", NULL, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "unknown policy");
    ASSERT_EQ(kve_set_error(KVE_EIO, "a\nb\tc"), KVE_EIO);
    ASSERT_STR_EQ(kve_last_error(), "a?b?c");
    char big[400];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kve_set_error(KVE_EINVAL, "%s", big);
    ASSERT_EQ(strlen(kve_last_error()), 255);
    ASSERT_EQ(kve_set_error(KVE_OK, NULL), KVE_OK);
    ASSERT_STR_EQ(kve_last_error(), "");
}

/* A refusal quotes at most 40 characters of the offending text. */
static void test_long_values_are_quoted_short(void)
{
    char spec[256];
    char value[201];
    memset(value, '7', 200);
    value[200] = '\0';
    value[100] = 'x';
    snprintf(spec, sizeof spec, "h2o:budget=%s", value);
    kve_policy *p = NULL;
    ASSERT_STATUS(kve_policy_new(spec, NULL, &p), KVE_EINVAL);
    ASSERT_TRUE(p == NULL);
    ASSERT_CONTAINS(kve_last_error(), "budget");
    ASSERT_TRUE(strstr(kve_last_error(), "7777777777777777777777777777777777777777") != NULL);
    ASSERT_TRUE(strstr(kve_last_error(), "77777777777777777777777777777777777777777") == NULL);

    char name[80];
    memset(name, 'a', 79);
    name[79] = '\0';
    ASSERT_STATUS(kve_policy_new(name, NULL, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "longer than 31");
}

/* Name characters are exactly [a-z0-9_]: the neighbours of each range are refused. */
static void test_name_character_ranges(void)
{
    const char *bad[] = {"h2o{", "h2o`", "h2o/", "h2o:", "H2O", "h2o-x", "h2o@", "h2o ", "h2o~"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char out[KVE_SPEC_MAX];
        kve_status st = kve_spec_with(bad[i], NULL, NULL, out, sizeof out);
        ASSERT_STATUS(st, KVE_EINVAL);
    }
    char out[KVE_SPEC_MAX];
    ASSERT_OK(kve_spec_with("h2o_decay", NULL, NULL, out, sizeof out));
}

/* Reals strtod cannot hold (overflow to inf, underflow to 0 with ERANGE)
 * are refused, naming the key; the nearest representable ones are not. */
static void test_reals_out_of_strtod_range(void)
{
    char out[KVE_SPEC_MAX];
    ASSERT_STATUS(kve_spec_with("h2o_decay", "decay", "1e400", out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "decay");
    ASSERT_STATUS(kve_spec_with("h2o_decay", "decay", "1e-400", out, sizeof out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "decay");
    ASSERT_STATUS(kve_spec_with("h2o_decay", "decay", "1e-", out, sizeof out), KVE_EINVAL);
    ASSERT_OK(kve_spec_with("h2o_decay", "decay", "1e-300", out, sizeof out));
    ASSERT_STR_EQ(out, "h2o_decay:budget=512,recent_window=32,decay=1e-300");
    ASSERT_OK(kve_spec_with("h2o_decay", "decay", "0.30000000000000004", out, sizeof out));
    ASSERT_STR_EQ(out, "h2o_decay:budget=512,recent_window=32,decay=0.30000000000000004");
    char longval[80];
    memset(longval, '1', 79);
    longval[0] = '0';
    longval[1] = '.';
    longval[79] = '\0';
    ASSERT_STATUS(kve_spec_with("h2o_decay", "decay", longval, out, sizeof out), KVE_EINVAL);
}

static void test_trace_null_accessors(void)
{
    ASSERT_EQ(kve_trace_steps(NULL), 0);
    ASSERT_EQ(kve_trace_heads(NULL), 0);
    ASSERT_EQ(kve_trace_layers(NULL), 0);
    ASSERT_TRUE(kve_trace_source(NULL) == NULL);
    kve_trace_free(NULL);
    double row[1];
    ASSERT_STATUS(kve_trace_row(NULL, 0, 0, row, 1), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_write_npy(NULL, 0, "x.npy"), KVE_EINVAL);
}

/* Only "canonical" and "canonical:..." are the generator; anything else,
 * even "canonicalx", is a path (here a missing one: KVE_EIO). */
static void test_sources_that_look_canonical(void)
{
    const char *paths[] = {"canonicalx", "canonical.npy", "canonica", "./canonical"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        kve_trace *tr = NULL;
        ASSERT_STATUS(kve_trace_open(paths[i], NULL, &tr), KVE_EIO);
        ASSERT_TRUE(tr == NULL);
        ASSERT_CONTAINS(kve_last_error(), paths[i]);
    }
    kve_trace *tr = NULL;
    ASSERT_STATUS(kve_trace_open("canonical:", NULL, &tr), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_open("", NULL, &tr), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_open("canonical", TRACE_FLAGS(2), &tr), KVE_EINVAL);
    ASSERT_TRUE(tr == NULL);
}

/* With no band and no heavy hitters the mass goes to sinks and background:
 * rows are still distributions and the query's own key is still 0. */
static void test_canonical_without_band_or_heavy(void)
{
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=40,recent=0,heavy=0,sinks=0", NULL, &tr));
    double row[40];
    for (size_t t = 1; t < 40; t++) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
        double sum = 0;
        for (size_t i = 0; i <= t; i++) {
            ASSERT_TRUE(row[i] >= 0);
            sum += row[i];
        }
        ASSERT_NEAR(sum, 1.0, 1e-5);
        ASSERT_TRUE(row[t] == 0.0);
    }
    kve_trace_free(tr);
}

/* When every key before the band is a heavy hitter (sinks 0, no band;
 * version 1: the epoch's heavy set is the whole earlier range; version 2:
 * heavy = epoch puts a hitter in every position) the row is still a
 * distribution, positive on every earlier key. */
static void test_canonical_all_heavy_row(void)
{
    const char *specs[] = {"canonical:version=1,steps=8,sinks=0,recent=0,epoch=4,heavy=4",
                           "canonical:version=2,steps=8,sinks=0,recent=0,epoch=4,heavy=4"};
    for (size_t v = 0; v < 2; v++) {
        kve_trace *tr = NULL;
        ASSERT_OK(kve_trace_open(specs[v], NULL, &tr));
        double row[8];
        ASSERT_OK(kve_trace_row(tr, 0, 4, row, 5));
        double sum = 0;
        for (size_t i = 0; i < 4; i++) {
            ASSERT_TRUE(row[i] > 0);
            sum += row[i];
        }
        ASSERT_NEAR(sum, 1.0, 1e-6);
        ASSERT_TRUE(row[4] == 0.0);
        kve_trace_free(tr);
    }
}

/* A .npy file is validated when opened and read again row by row: a row
 * that changed into a non-distribution since is refused (KVE_EFORMAT), a
 * file cut short is refused (KVE_EIO or KVE_EFORMAT), each with a message,
 * and rows that did not change still read back. */
static void test_npy_changed_after_open(void)
{
    char path[96];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%.60s/kve-edges-%ld.npy", tmp ? tmp : "/tmp", (long)getpid());
    kve_trace *src = NULL, *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=128,seed=3", NULL, &src));
    ASSERT_OK(kve_trace_write_npy(src, 0, path));
    ASSERT_OK(kve_trace_open(path, NULL, &tr));
    double row[128], want[128];

    /* Row 5, key 0 becomes NaN: 128 x 128 float32 after the header. The
     * file is 64 KiB, far more than stdio buffers, so row 5 is read anew. */
    FILE *f = fopen(path, "r+b");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fseek(f, -(long)(128 * 128 * 4) + 5 * 128 * 4, SEEK_END), 0);
    const unsigned char nan_bits[4] = {0x00, 0x00, 0xc0, 0x7f};
    ASSERT_EQ(fwrite(nan_bits, 1, 4, f), 4);
    ASSERT_EQ(fclose(f), 0);
    ASSERT_STATUS(kve_trace_row(tr, 0, 5, row, 6), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "row 5");
    ASSERT_OK(kve_trace_row(tr, 0, 4, row, 5));
    ASSERT_OK(kve_trace_row(src, 0, 4, want, 5));
    for (size_t i = 0; i <= 4; i++)
        ASSERT_TRUE(row[i] == (double)(float)want[i]);

    /* Cut to 200 bytes: the header survives, the late rows do not. */
    ASSERT_EQ(truncate(path, 200), 0);
    kve_status st = kve_trace_row(tr, 0, 120, row, 121);
    ASSERT_TRUE(st == KVE_EIO || st == KVE_EFORMAT);
    ASSERT_TRUE(kve_last_error()[0] != '\0');

    kve_trace_free(tr);
    kve_trace_free(src);
    unlink(path);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_status_names);
    RUN(test_version);
    RUN(test_zero_size_allocations);
    RUN(test_set_error);
    RUN(test_long_values_are_quoted_short);
    RUN(test_name_character_ranges);
    RUN(test_reals_out_of_strtod_range);
    RUN(test_trace_null_accessors);
    RUN(test_sources_that_look_canonical);
    RUN(test_canonical_without_band_or_heavy);
    RUN(test_canonical_all_heavy_row);
    RUN(test_npy_changed_after_open);
    return CHECK_DONE();
}
