/* SPDX-License-Identifier: MIT */
/*
 * test_npy.c - the .npy reader and writer: round trip through the writer,
 * hand-built files of every accepted kind (versions 1.0/2.0/3.0, '<f4' and
 * '<f8', [T,T], [H,T,T], [L,H,T,T], header spelling variants), every
 * malformation refused with the right status and a message saying what is
 * wrong, KVE_TRACE_NORMALIZE, entries above the diagonal ignored, writer
 * failures leaving no file, allocation failure, and a seeded mutation loop
 * (the fuzz target's cheap cousin) that must never crash.
 *
 * Files live in a fresh mkdtemp directory removed at the end.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"
#include "test_allocator.h"
#include "tmpdir.h"
#include "internal.h"
#include "kvevict_eval.h"
#include "eval_options.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    return fclose(f) == 0 && w == len ? 0 : -1;
}

/* A growable byte buffer. */
typedef struct bytes {
    unsigned char *p;
    size_t n, cap;
} bytes;

static void put(bytes *b, const void *data, size_t len)
{
    if (b->n + len > b->cap) {
        b->cap = (b->n + len) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort();
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
}

static void put_le(bytes *b, uint64_t v, size_t n)
{
    unsigned char tmp[8];
    for (size_t i = 0; i < n; i++, v >>= 8)
        tmp[i] = (unsigned char)(v & 0xff);
    put(b, tmp, n);
}

/* Magic, version major.minor, header length (u16 or u32) and header. */
static void put_preamble(bytes *b, int major, int minor, const char *header)
{
    put(b, "\x93NUMPY", 6);
    unsigned char ver[2] = {(unsigned char)major, (unsigned char)minor};
    put(b, ver, 2);
    size_t len = strlen(header);
    put_le(b, len, major == 1 ? 2 : 4);
    put(b, header, len);
}

static void put_value(bytes *b, double v, int f8)
{
    if (f8) {
        uint64_t bits;
        memcpy(&bits, &v, sizeof bits);
        put_le(b, bits, 8);
    } else {
        float f = (float)v;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        put_le(b, bits, 4);
    }
}

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005u + 1442695040888963407u;
    return *x >> 11;
}

/* data[(h * T + t) * T + i]: row t of head h is a random distribution over
 * [0, t] (rounded to float32 when !f8); entries above the diagonal are
 * garbage (NaN, -1, 1e30) that the reader must ignore. */
static double *random_tensor(size_t heads, size_t T, int f8, uint64_t seed)
{
    double *d = malloc(heads * T * T * sizeof *d);
    if (!d)
        abort();
    uint64_t x = seed;
    for (size_t h = 0; h < heads; h++)
        for (size_t t = 0; t < T; t++) {
            double *row = d + (h * T + t) * T, s = 0;
            for (size_t i = 0; i <= t; i++) {
                row[i] = (double)(lcg(&x) % 1000 + 1) * ((lcg(&x) & 7) == 0 ? 50.0 : 1.0);
                s += row[i];
            }
            for (size_t i = 0; i <= t; i++)
                row[i] = f8 ? row[i] / s : (double)(float)(row[i] / s);
            for (size_t i = t + 1; i < T; i++)
                row[i] = (i % 3 == 0) ? NAN : (i % 3 == 1) ? -1.0 : 1e30;
        }
    return d;
}

static void put_tensor(bytes *b, const double *d, size_t n, int f8)
{
    for (size_t i = 0; i < n; i++)
        put_value(b, d[i], f8);
}

/* Reads every row of every head and compares with data (as float32 when
 * !f8). */
static int rows_match(kve_trace *tr, const double *d, size_t heads, size_t T)
{
    double *row = malloc(T * sizeof *row);
    int ok = row != NULL;
    for (size_t h = 0; ok && h < heads; h++)
        for (size_t t = 0; ok && t < T; t++) {
            ok = kve_trace_row(tr, h, t, row, t + 1) == KVE_OK;
            for (size_t i = 0; ok && i <= t; i++)
                ok = row[i] == d[(h * T + t) * T + i];
            if (!ok)
                fprintf(stderr, "mismatch at head %zu row %zu\n", h, t);
        }
    free(row);
    return ok;
}

static kve_status open_bytes(const bytes *b, const char *name, unsigned flags, kve_trace **tr)
{
    const char *p = path_of(name);
    if (write_bytes(p, b->p, b->n) != 0)
        return KVE_EIO;
    return kve_trace_open(p, TRACE_FLAGS(flags), tr);
}

/* ---- accepted files ---- */

static void test_writer_round_trip(void)
{
    kve_trace *c = NULL, *r = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=300,seed=9", NULL, &c));
    const char *p = path_of("rt.npy");
    ASSERT_OK(kve_trace_write_npy(c, 0, p));
    struct stat sb;
    ASSERT_TRUE(stat(p, &sb) == 0);
    ASSERT_EQ(sb.st_size, 128 + 300 * 300 * 4); /* data starts at 128, a multiple of 64 */
    FILE *f = fopen(p, "rb");
    ASSERT_TRUE(f != NULL);
    unsigned char head[128];
    ASSERT_EQ(fread(head, 1, sizeof head, f), sizeof head);
    fclose(f);
    ASSERT_TRUE(memcmp(head, "\x93NUMPY\x01\x00", 8) == 0);
    ASSERT_EQ(head[8] | head[9] << 8, 118);
    ASSERT_EQ(head[127], '\n');
    ASSERT_TRUE(memcmp(head + 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (300, 300), }",
                       63) == 0);

    ASSERT_OK(kve_trace_open(p, NULL, &r));
    ASSERT_EQ(kve_trace_steps(r), 300);
    ASSERT_EQ(kve_trace_heads(r), 1);
    ASSERT_EQ(kve_trace_layers(r), 1);
    ASSERT_STR_EQ(kve_trace_source(r), p);
    double a[300], b[300];
    for (size_t t = 0; t < 300; t++) {
        ASSERT_OK(kve_trace_row(c, 0, t, a, t + 1));
        ASSERT_OK(kve_trace_row(r, 0, t, b, t + 1));
        if (memcmp(a, b, (t + 1) * sizeof a[0]) != 0)
            CHECK_FAIL_AT("row %zu differs after the round trip", t);
    }
    /* Writing the file's own head again over itself gives identical bytes. */
    ASSERT_OK(kve_trace_write_npy(r, 0, path_of("rt2.npy")));
    kve_trace *r2 = NULL;
    ASSERT_OK(kve_trace_open(path_of("rt2.npy"), NULL, &r2));
    for (size_t t = 0; t < 300; t += 7) {
        ASSERT_OK(kve_trace_row(r2, 0, t, a, t + 1));
        ASSERT_OK(kve_trace_row(r, 0, t, b, t + 1));
        ASSERT_TRUE(memcmp(a, b, (t + 1) * sizeof a[0]) == 0);
    }
    kve_trace_free(r2);
    kve_trace_free(r);
    kve_trace_free(c);
}

static void test_hand_built_variants(void)
{
    static const struct {
        int major;
        int f8;
        const char *fmt; /* header with %s for the shape text and the dtype first */
        size_t ndim, dims[4];
    } cases[] = {
        {1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }\n", 2, {7, 7}},
        {1, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (%s), }\n", 2, {7, 7}},
        {2, 0, "{'shape': (%s), 'fortran_order': False, 'descr': '<f4'}", 3, {3, 6, 6}},
        {3, 1, "{\"descr\":\"<f8\",\"fortran_order\":False,\"shape\":(%s)}   \n", 4, {2, 3, 5, 5}},
        {1, 0, "{ 'fortran_order' : False , 'descr' : '<f4' , 'shape' : ( %s , ) , }\t\r\n", 2,
         {4, 4}},
        {2, 1, "{'descr': '<f8',\n 'fortran_order': False,\n 'shape': (%s)}\n", 2, {1, 1}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char shape[64] = "", header[256];
        size_t len = 0, heads = 1;
        for (size_t i = 0; i < cases[k].ndim; i++) {
            len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%zu", i ? ", " : "",
                                    cases[k].dims[i]);
            if (i + 2 < cases[k].ndim)
                heads *= cases[k].dims[i];
        }
        snprintf(header, sizeof header, cases[k].fmt, shape);
        size_t T = cases[k].dims[cases[k].ndim - 1];
        double *d = random_tensor(heads, T, cases[k].f8, check_seed + k);
        bytes b = {0};
        put_preamble(&b, cases[k].major, 0, header);
        put_tensor(&b, d, heads * T * T, cases[k].f8);
        kve_trace *tr = NULL;
        kve_status st = open_bytes(&b, "v.npy", 0, &tr);
        if (st != KVE_OK)
            CHECK_FAIL_AT("case %zu: %s: %s", k, kve_status_name(st), kve_last_error());
        ASSERT_EQ(kve_trace_steps(tr), T);
        ASSERT_EQ(kve_trace_heads(tr), heads);
        ASSERT_EQ(kve_trace_layers(tr), cases[k].ndim == 4 ? cases[k].dims[0] : 1);
        ASSERT_TRUE(rows_match(tr, d, heads, T));
        /* Descending reads give the same rows (the fast path is only fast). */
        double row[8];
        ASSERT_OK(kve_trace_row(tr, heads - 1, T - 1, row, T));
        ASSERT_TRUE(row[0] == d[((heads - 1) * T + T - 1) * T]);
        ASSERT_STATUS(kve_trace_row(tr, heads, 0, row, 1), KVE_EINVAL);
        kve_trace_free(tr);
        free(d);
        free(b.p);
    }
}

/* ---- refused files ---- */

typedef struct bad_case {
    const char *what;
    int major, minor;
    const char *header;
    size_t data_bytes; /* zero bytes of payload appended */
    kve_status want;
    const char *msg;
} bad_case;

static const char OK_HDR[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }\n";

static void test_malformed_headers(void)
{
    static const bad_case cases[] = {
        {"version 4.0", 4, 0, OK_HDR, 16, KVE_EFORMAT, "version 4.0"},
        {"version 1.1", 1, 1, OK_HDR, 16, KVE_EFORMAT, "version 1.1"},
        {"version 0.0", 0, 0, OK_HDR, 16, KVE_EFORMAT, "version 0.0"},
        {"not a dict", 1, 0, "['descr']\n", 16, KVE_EFORMAT, "not a dict"},
        {"no shape", 1, 0, "{'descr': '<f4', 'fortran_order': False}", 16, KVE_EFORMAT,
         "no 'shape'"},
        {"no descr", 1, 0, "{'fortran_order': False, 'shape': (2, 2)}", 16, KVE_EFORMAT,
         "no 'descr'"},
        {"no order", 1, 0, "{'descr': '<f4', 'shape': (2, 2)}", 16, KVE_EFORMAT,
         "no 'fortran_order'"},
        {"unknown key", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), 'x': 1}",
         16, KVE_EFORMAT, "unknown key"},
        {"duplicate", 1, 0, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 2)}",
         16, KVE_EFORMAT, "'descr' given twice"},
        {"big endian", 1, 0, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2)}", 16,
         KVE_EFORMAT, "dtype '>f4'"},
        {"int", 1, 0, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2)}", 16,
         KVE_EFORMAT, "dtype '<i4'"},
        {"half", 1, 0, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2)}", 8,
         KVE_EFORMAT, "dtype '<f2'"},
        {"structured", 1, 0, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 2)}",
         16, KVE_EFORMAT, "not a string"},
        {"fortran", 1, 0, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}", 16,
         KVE_EFORMAT, "fortran_order is True"},
        {"order garbage", 1, 0, "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2, 2)}", 16,
         KVE_EFORMAT, "not True or False"},
        {"1-d", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", 16, KVE_EFORMAT,
         "1 dimensions"},
        {"scalar", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': ()}", 4, KVE_EFORMAT,
         "0 dimensions"},
        {"5-d", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 2, 2)}", 16,
         KVE_EFORMAT, "more than 4"},
        {"not square", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", 24,
         KVE_EFORMAT, "must be equal"},
        {"negative", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2, -2)}", 16,
         KVE_EFORMAT, "negative"},
        {"zero", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 0)}", 0,
         KVE_EFORMAT, "is 0"},
        {"zero heads", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 2, 2)}", 0,
         KVE_EFORMAT, "is 0"},
        {"huge T", 1, 0,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", 16,
         KVE_EFORMAT, "exceeds the largest position"},
        {"overflow", 1, 0,
         "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904, 65536, 65536)}",
         16, KVE_EFORMAT, "too large"},
        {"digits", 1, 0,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999, 2, 2)}", 16,
         KVE_EFORMAT, "too large"},
        {"float dim", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2.0, 2)}", 16,
         KVE_EFORMAT, "expected ','"},
        {"truncated data", 1, 0, OK_HDR, 15, KVE_EFORMAT, "truncated"},
        {"trailing data", 1, 0, OK_HDR, 17, KVE_EFORMAT, "trailing data"},
        {"trailing text", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2)} x", 16,
         KVE_EFORMAT, "trailing text"},
        {"unterminated", 1, 0, "{'descr: '<f4'", 16, KVE_EFORMAT, "expected ':'"},
        {"open string", 1, 0, "{'descr", 16, KVE_EFORMAT, "unterminated"},
        {"no close", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2)", 16,
         KVE_EFORMAT, "expected ',' or '}'"},
        {"empty", 1, 0, "", 16, KVE_EFORMAT, "not a dict"},
        {"non-ascii", 1, 0, "{'descr': '<f4\xc3\xa9', 'fortran_order': False, 'shape': (2, 2)}",
         16, KVE_EFORMAT, "non-ASCII"},
        {"control byte", 1, 0, "{'descr': '<f4\x01', 'fortran_order': False, 'shape': (2, 2)}",
         16, KVE_EFORMAT, "control byte"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        bytes b = {0};
        put_preamble(&b, cases[k].major, cases[k].minor, cases[k].header);
        for (size_t i = 0; i < cases[k].data_bytes; i++)
            put(&b, "\0", 1);
        kve_trace *tr = (kve_trace *)&b; /* sentinel */
        kve_status st = open_bytes(&b, "bad.npy", 0, &tr);
        free(b.p);
        if (st != cases[k].want || !strstr(kve_last_error(), cases[k].msg))
            CHECK_FAIL_AT("%s: got %s \"%s\", want %s containing \"%s\"", cases[k].what,
                          kve_status_name(st), kve_last_error(), kve_status_name(cases[k].want),
                          cases[k].msg);
        ASSERT_TRUE(tr == (kve_trace *)&b);
        ASSERT_CONTAINS(kve_last_error(), "bad.npy");
    }
}

static void test_malformed_preambles(void)
{
    kve_trace *tr = NULL;
    /* Shorter than the preamble, wrong magic, header length past the end,
     * over the header limit. */
    ASSERT_TRUE(write_bytes(path_of("p.npy"), "", 0) == 0);
    ASSERT_STATUS(kve_trace_open(path_of("p.npy"), NULL, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "too short");
    ASSERT_TRUE(write_bytes(path_of("p.npy"), "\x93NUMPZ\x01\x00\x00\x00", 10) == 0);
    ASSERT_STATUS(kve_trace_open(path_of("p.npy"), NULL, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "bad magic");
    ASSERT_TRUE(write_bytes(path_of("p.npy"), "\x93NUMPY\x01\x00\x50\x00{'d", 13) == 0);
    ASSERT_STATUS(kve_trace_open(path_of("p.npy"), NULL, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "truncated .npy header");
    ASSERT_TRUE(write_bytes(path_of("p.npy"), "\x93NUMPY\x02\x00\xff\xff\xff\xff{", 13) == 0);
    ASSERT_STATUS(kve_trace_open(path_of("p.npy"), NULL, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "limit");
    ASSERT_TRUE(write_bytes(path_of("p.npy"), "\x93NUMPY\x02\x00\x00\x00", 10) == 0);
    ASSERT_STATUS(kve_trace_open(path_of("p.npy"), NULL, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "preamble");
    ASSERT_TRUE(tr == NULL);
    /* Every proper prefix of a valid file is refused, never crashes. */
    kve_trace *c = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=5", NULL, &c));
    ASSERT_OK(kve_trace_write_npy(c, 0, path_of("full.npy")));
    kve_trace_free(c);
    FILE *f = fopen(path_of("full.npy"), "rb");
    ASSERT_TRUE(f != NULL);
    unsigned char buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    ASSERT_EQ(n, 128 + 5 * 5 * 4);
    for (size_t len = 0; len < n; len++) {
        ASSERT_TRUE(write_bytes(path_of("prefix.npy"), buf, len) == 0);
        ASSERT_STATUS(kve_trace_open(path_of("prefix.npy"), NULL, &tr), KVE_EFORMAT);
    }
    /* I/O failures: a missing file, a directory. */
    ASSERT_STATUS(kve_trace_open(path_of("missing.npy"), NULL, &tr), KVE_EIO);
    ASSERT_CONTAINS(kve_last_error(), "missing.npy");
    ASSERT_STATUS(kve_trace_open(dir, NULL, &tr), KVE_EIO);
    ASSERT_TRUE(tr == NULL);
}

/* A 4x4 trace from explicit rows (above-diagonal entries -7 are ignored). */
static kve_status open_rows(const double rows[4][4], int f8, unsigned flags, kve_trace **tr)
{
    bytes b = {0};
    put_preamble(&b, 1, 0,
                 f8 ? "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 4, 4), }\n"
                    : "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4, 4), }\n");
    for (size_t t = 0; t < 4; t++)
        for (size_t i = 0; i < 4; i++)
            put_value(&b, i <= t ? rows[t][i] : -7.0, f8);
    kve_status st = open_bytes(&b, "rows.npy", flags, tr);
    free(b.p);
    return st;
}

static void test_bad_rows(void)
{
    static const struct {
        double rows[4][4];
        const char *msg;
    } cases[] = {
        {{{1}, {0.5, 0.5}, {0.2, NAN, 0.8}, {0.25, 0.25, 0.25, 0.25}}, "row 2: weight at key 1"},
        {{{1}, {0.5, 0.5}, {0.2, 0, 0.8}, {0.25, 0.25, INFINITY, 0.25}}, "row 3: weight at key 2"},
        {{{1}, {1.5, -0.5}, {0.2, 0, 0.8}, {0.25, 0.25, 0.25, 0.25}}, "row 1: weight at key 1"},
        {{{1}, {0.5, 0.5}, {0.2, 0, 0.8}, {0.25, 0.25, 0.25, 0.2}}, "row 3 sums to 0.95"},
        {{{1}, {0.5, 0.5}, {0.2, 0.1, 0.8}, {0.25, 0.25, 0.25, 0.25}}, "row 2 sums to 1.1"},
        {{{-1}, {0.5, 0.5}, {0.2, 0, 0.8}, {0.25, 0.25, 0.25, 0.25}}, "row 0: weight at key 0"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        kve_trace *tr = NULL;
        ASSERT_STATUS(open_rows(cases[k].rows, 1, 0, &tr), KVE_EFORMAT);
        ASSERT_CONTAINS(kve_last_error(), cases[k].msg);
        ASSERT_CONTAINS(kve_last_error(), "head 0");
        ASSERT_TRUE(tr == NULL);
    }
    /* Within 1e-3 is accepted; row 0 is not held to sum 1. */
    static const double near[4][4] = {
        {0.3}, {0.5, 0.5009}, {0.2, 0, 0.7992}, {0.25, 0.25, 0.25, 0.25}};
    kve_trace *tr = NULL;
    ASSERT_OK(open_rows(near, 1, 0, &tr));
    double row[4];
    ASSERT_OK(kve_trace_row(tr, 0, 1, row, 2));
    ASSERT_TRUE(row[1] == 0.5009);
    kve_trace_free(tr);
    /* The message names layer and head for a 4-d file. */
    bytes b = {0};
    put_preamble(&b, 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 2, 2)}");
    for (int h = 0; h < 4; h++) {
        put_value(&b, 1, 0);
        put_value(&b, 0, 0);
        put_value(&b, h == 3 ? 0.7 : 0.5, 0);
        put_value(&b, 0.5, 0);
    }
    ASSERT_STATUS(open_bytes(&b, "lh.npy", 0, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "head 3 (layer 1, head 1), row 1 sums to 1.1999");
    free(b.p);
}

static void test_normalize(void)
{
    static const double raw[4][4] = {{2}, {3, 1}, {0, 0, 5}, {1, 2, 3, 4}};
    kve_trace *tr = NULL;
    ASSERT_STATUS(open_rows(raw, 0, 0, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "row 1 sums to 4");
    ASSERT_OK(open_rows(raw, 0, KVE_TRACE_NORMALIZE, &tr));
    double row[4];
    ASSERT_OK(kve_trace_row(tr, 0, 0, row, 1));
    ASSERT_TRUE(row[0] == 1.0);
    ASSERT_OK(kve_trace_row(tr, 0, 1, row, 2));
    ASSERT_TRUE(row[0] == 0.75 && row[1] == 0.25);
    ASSERT_OK(kve_trace_row(tr, 0, 3, row, 4));
    for (int i = 0; i < 4; i++)
        ASSERT_TRUE(row[i] == (double)(i + 1) / 10.0);
    kve_trace_free(tr);
    tr = NULL;
    /* An all-zero row (including row 0) is refused even when normalising;
     * NaN and negative weights still are too. */
    static const double zero_row[4][4] = {{1}, {0, 0}, {0, 0, 5}, {1, 2, 3, 4}};
    ASSERT_STATUS(open_rows(zero_row, 0, KVE_TRACE_NORMALIZE, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "row 1: all weights");
    static const double zero_first[4][4] = {{0}, {1, 0}, {0, 0, 5}, {1, 2, 3, 4}};
    ASSERT_STATUS(open_rows(zero_first, 0, KVE_TRACE_NORMALIZE, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "row 0");
    static const double neg[4][4] = {{1}, {2, -1}, {0, 0, 5}, {1, 2, 3, 4}};
    ASSERT_STATUS(open_rows(neg, 0, KVE_TRACE_NORMALIZE, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "row 1: weight at key 1");
    static const double overflow[4][4] = {{1}, {1e308, 1e308}, {0, 0, 5}, {1, 2, 3, 4}};
    ASSERT_STATUS(open_rows(overflow, 1, KVE_TRACE_NORMALIZE, &tr), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "overflows");
    ASSERT_TRUE(tr == NULL);
}

static int count_tmp_files(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

static void test_writer_failures(void)
{
    kve_trace *tr = NULL;
    talloc ta;
    talloc_init(&ta);
    kve_trace_options o = kve_trace_default_options();
    o.allocator = &ta.a; /* the writer's scratch comes from the trace's allocator */
    ASSERT_OK(kve_trace_open("canonical:steps=20", &o, &tr));
    ASSERT_STATUS(kve_trace_write_npy(tr, 0, path_of("no/such/dir/x.npy")), KVE_EIO);
    ASSERT_CONTAINS(kve_last_error(), "x.npy");
    ASSERT_STATUS(kve_trace_write_npy(tr, 1, path_of("x.npy")), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_write_npy(tr, 0, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_write_npy(tr, 0, ""), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_write_npy(NULL, 0, path_of("x.npy")), KVE_EINVAL);
    /* Renaming onto a directory fails after the data is written: the
     * temporary file is removed and the directory is untouched. */
    ASSERT_TRUE(mkdir(path_of("adir"), 0755) == 0);
    ASSERT_STATUS(kve_trace_write_npy(tr, 0, path_of("adir")), KVE_EIO);
    ASSERT_CONTAINS(kve_last_error(), "rename");
    struct stat sb;
    ASSERT_TRUE(stat(path_of("adir"), &sb) == 0 && S_ISDIR(sb.st_mode));
    ASSERT_EQ(count_tmp_files(), 0);
    /* Allocation failure: ENOMEM, no file, no temporary. */
    for (size_t k = 0; k < 3; k++) {
        talloc_fail_after(&ta, k);
        kve_status st = kve_trace_write_npy(tr, 0, path_of("oom.npy"));
        talloc_fail_after(&ta, SIZE_MAX);
        ASSERT_EQ(st, KVE_ENOMEM);
        ASSERT_TRUE(stat(path_of("oom.npy"), &sb) != 0);
    }
    ASSERT_EQ(count_tmp_files(), 0);
    /* Overwriting an existing file replaces it whole. */
    ASSERT_TRUE(write_bytes(path_of("over.npy"), "junk", 4) == 0);
    ASSERT_OK(kve_trace_write_npy(tr, 0, path_of("over.npy")));
    kve_trace *r = NULL;
    ASSERT_OK(kve_trace_open(path_of("over.npy"), NULL, &r));
    ASSERT_EQ(kve_trace_steps(r), 20);
    kve_trace_free(r);
    kve_trace_free(tr);
    talloc_check_empty(&ta);
    ASSERT_EQ(count_tmp_files(), 0);
}

/* Records progress calls; asks to stop once `stop_at` units are done. */
typedef struct progress_log {
    uint64_t calls, first, last, total, stop_at;
    int backwards;
} progress_log;

static int log_progress(void *user, uint64_t done, uint64_t total)
{
    progress_log *l = user;
    if (l->calls == 0)
        l->first = done;
    else if (done < l->last)
        l->backwards = 1;
    l->calls++;
    l->last = done;
    l->total = total;
    return done >= l->stop_at;
}

/* kve_trace_write_npy_file writes exactly the bytes kve_trace_write_npy
 * does, kve_trace_npy_bytes of them, reporting one unit per row; progress
 * can stop it and kve_trace_open (options.progress) with KVE_ECANCELED. */
static void test_stream_writer_and_progress(void)
{
    enum { T = 70 };
    kve_trace *c = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=70,seed=3", NULL, &c));
    ASSERT_U64_EQ(kve_trace_npy_bytes(c), 128 + 4 * T * T);
    ASSERT_U64_EQ(kve_trace_npy_bytes(NULL), 0);
    const char *p = path_of("stream.npy");
    ASSERT_OK(kve_trace_write_npy(c, 0, p));
    FILE *f = tmpfile();
    ASSERT_TRUE(f != NULL);
    progress_log log = {0, 0, 0, 0, UINT64_MAX, 0};
    ASSERT_OK(kve_trace_write_npy_file(c, 0, f, log_progress, &log));
    ASSERT_U64_EQ(log.calls, T + 1);
    ASSERT_U64_EQ(log.first, 0);
    ASSERT_U64_EQ(log.last, T);
    ASSERT_U64_EQ(log.total, T);
    ASSERT_EQ(log.backwards, 0);
    long size = ftell(f);
    ASSERT_EQ(size, 128 + 4 * T * T);
    unsigned char *a = malloc((size_t)size), *b = malloc((size_t)size);
    ASSERT_TRUE(a && b);
    rewind(f);
    ASSERT_EQ(fread(a, 1, (size_t)size, f), (size_t)size);
    FILE *g = fopen(p, "rb");
    ASSERT_TRUE(g != NULL);
    ASSERT_EQ(fread(b, 1, (size_t)size, g), (size_t)size);
    fclose(g);
    ASSERT_TRUE(memcmp(a, b, (size_t)size) == 0);
    free(a);
    free(b);
    fclose(f);

    /* Stopped by the callback, at the start and part way. */
    for (uint64_t stop = 0; stop <= 5; stop += 5) {
        f = tmpfile();
        ASSERT_TRUE(f != NULL);
        progress_log s = {0, 0, 0, 0, stop, 0};
        ASSERT_STATUS(kve_trace_write_npy_file(c, 0, f, log_progress, &s), KVE_ECANCELED);
        ASSERT_CONTAINS(kve_last_error(), "canceled");
        ASSERT_U64_EQ(s.last, stop);
        fclose(f);
    }
    ASSERT_STR_EQ(kve_status_name(KVE_ECANCELED), "KVE_ECANCELED");
    /* Refusals, and a stream that cannot be written. */
    f = tmpfile();
    ASSERT_TRUE(f != NULL);
    ASSERT_STATUS(kve_trace_write_npy_file(NULL, 0, f, NULL, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_write_npy_file(c, 0, NULL, NULL, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_write_npy_file(c, 1, f, NULL, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 1");
    fclose(f);
    FILE *ro = fopen(p, "rb");
    ASSERT_TRUE(ro != NULL);
    ASSERT_STATUS(kve_trace_write_npy_file(c, 0, ro, NULL, NULL), KVE_EIO);
    ASSERT_CONTAINS(kve_last_error(), "write error");
    fclose(ro);

    /* Opening reports one unit per row of every head; a synthetic trace
     * reports nothing; a stop is KVE_ECANCELED with *out untouched. */
    kve_trace *r = NULL;
    progress_log o = {0, 0, 0, 0, UINT64_MAX, 0};
    ASSERT_OK(kve_trace_open(p, TRACE_OPTS(0, log_progress, &o), &r));
    ASSERT_U64_EQ(o.calls, T + 1);
    ASSERT_U64_EQ(o.total, T);
    ASSERT_U64_EQ(o.last, T);
    kve_trace_free(r);
    kve_trace *untouched = (kve_trace *)&o;
    for (uint64_t stop = 0; stop <= 9; stop += 9) {
        progress_log s = {0, 0, 0, 0, stop, 0};
        r = untouched;
        ASSERT_STATUS(kve_trace_open(p, TRACE_OPTS(0, log_progress, &s), &r), KVE_ECANCELED);
        ASSERT_TRUE(r == untouched);
        ASSERT_CONTAINS(kve_last_error(), "canceled");
    }
    progress_log none = {0, 0, 0, 0, 0, 0};
    ASSERT_OK(kve_trace_open("canonical:steps=10", TRACE_OPTS(0, log_progress, &none), &r));
    ASSERT_U64_EQ(none.calls, 0);
    kve_trace_free(r);
    kve_trace_free(c);
}

static void test_open_alloc_failure(void)
{
    double *d = random_tensor(2, 9, 0, check_seed);
    bytes b = {0};
    put_preamble(&b, 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 9, 9)}");
    put_tensor(&b, d, 2 * 9 * 9, 0);
    ASSERT_TRUE(write_bytes(path_of("oom.npy"), b.p, b.n) == 0);
    free(b.p);
    free(d);
    talloc ta;
    talloc_init(&ta);
    kve_trace_options o = kve_trace_default_options();
    o.allocator = &ta.a;
    for (size_t k = 0;; k++) {
        kve_trace *tr = NULL;
        talloc_fail_after(&ta, k);
        kve_status st = kve_trace_open(path_of("oom.npy"), &o, &tr);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK) {
            kve_trace_free(tr);
            break;
        }
        ASSERT_EQ(st, KVE_ENOMEM);
        ASSERT_TRUE(tr == NULL);
        ASSERT_EQ(ta.blocks, 0);
        ASSERT_TRUE(k < 20);
    }
    talloc_check_empty(&ta);
}

/* Seeded random mutations of a valid file: any status is fine, a crash or
 * a leak (sanitizer build) is not; an accepted file yields valid rows. */
static void test_mutations(void)
{
    double *d = random_tensor(2, 6, 0, check_seed);
    bytes b = {0};
    put_preamble(&b, 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 6, 6), }\n");
    put_tensor(&b, d, 2 * 6 * 6, 0);
    free(d);
    unsigned char *m = malloc(b.n + 8);
    ASSERT_TRUE(m != NULL);
    uint64_t x = check_seed;
    int accepted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(m, b.p, b.n);
        size_t n = b.n;
        int edits = 1 + (int)(lcg(&x) % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)(lcg(&x) % n);
            switch (lcg(&x) % 4) {
            case 0: m[at] = (unsigned char)lcg(&x); break;
            case 1: m[at] ^= (unsigned char)(1u << (lcg(&x) % 8)); break;
            case 2: m[at] = "0123456789(),'{}: -TF"[lcg(&x) % 21]; break;
            default: n = at > 0 ? at : 1; break;
            }
        }
        ASSERT_TRUE(write_bytes(path_of("mut.npy"), m, n) == 0);
        kve_trace *tr = NULL;
        kve_status st = kve_trace_open(path_of("mut.npy"), TRACE_FLAGS((unsigned)(iter & 1)), &tr);
        if (st == KVE_OK) {
            accepted++;
            double row[64];
            size_t T = kve_trace_steps(tr);
            ASSERT_TRUE(T <= 64);
            for (size_t h = 0; h < kve_trace_heads(tr); h++)
                for (size_t t = 0; t < T; t++)
                    ASSERT_OK(kve_trace_row(tr, h, t, row, t + 1));
            kve_trace_free(tr);
        } else {
            ASSERT_TRUE(st == KVE_EFORMAT);
            ASSERT_TRUE(tr == NULL);
            ASSERT_TRUE(strchr(kve_last_error(), '\n') == NULL);
        }
    }
    printf("mutations: %d of 3000 accepted\n", accepted);
    free(m);
    free(b.p);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    if (tmpdir_make("kve_test_npy") != 0)
        return 1;
    RUN(test_writer_round_trip);
    RUN(test_hand_built_variants);
    RUN(test_malformed_headers);
    RUN(test_malformed_preambles);
    RUN(test_bad_rows);
    RUN(test_normalize);
    RUN(test_writer_failures);
    RUN(test_stream_writer_and_progress);
    RUN(test_open_alloc_failure);
    RUN(test_mutations);
    remove_dir();
    return CHECK_DONE();
}
