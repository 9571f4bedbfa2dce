/* SPDX-License-Identifier: MIT */
/*
 * test_trace_callback.c - live traces from the caller's callbacks
 * (kve_trace_from_callback): rows and evaluation results bit for bit those
 * of a memory trace of the same floats (flags 0 and KVE_TRACE_NORMALIZE)
 * and, with keys, those of the q/K trace the callbacks relay (key-reading
 * policies included); one callback per step when the heads are read
 * together, again from step 0 when a reader goes back; bad rows and keys
 * refused with messages naming head, row and key, and asked for again; the
 * callback's own status and message passed on (a generic message when it
 * set none, a status outside kve_status refused); every argument refusal
 * with no callback called; the free callback called once; the reserved
 * source text "callback"; allocation through the options' allocator and
 * allocation failure; a read of the trace from inside its own callback
 * refused, the row being delivered intact.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "test_allocator.h"
#include "kvevict_eval.h"
#include "eval_options.h"
#include "npy_file.h"
#include "tmpdir.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { L = 2, H = 3, T = 40, HEADS = L * H };

/* ---- a callback over an array: [HEADS, T, T] floats, delivered by step ---- */

typedef struct array_src {
    const float *a;  /* [HEADS, T, T] */
    size_t calls;    /* rows callbacks */
    size_t backward; /* calls for a step below the previous one */
    size_t last;     /* the previous step + 1 */
    size_t frees;
    int poison_at;   /* step + 1 whose head 1, key 2 is made negative; 0: none */
    kve_status fail; /* returned by every call when not KVE_OK */
    int message;     /* with fail: set a message first */
} array_src;

static kve_status array_rows(void *user, size_t t, float *rows, size_t ld)
{
    array_src *s = user;
    s->calls++;
    if (t + 1 < s->last)
        s->backward++;
    s->last = t + 1;
    if (s->fail != KVE_OK)
        return s->message ? kve_set_error(s->fail, "my model: step %zu broke", t) : s->fail;
    for (size_t h = 0; h < HEADS; h++) {
        memcpy(rows + h * ld, s->a + (h * T + t) * T, (t + 1) * sizeof *rows);
        if (s->poison_at == (int)t + 1 && h == 1)
            rows[h * ld + 2] = -0.5f;
    }
    return KVE_OK;
}

static void array_free(void *user)
{
    ((array_src *)user)->frees++;
}

static const kve_trace_callbacks array_cb = {.rows = array_rows, .free = array_free};

static uint64_t lcg_state;
static double lcg_uniform(void)
{
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}

/* Rows positive over [0, t], summing to `scale` (1 within rounding). */
static void fill_rows(float *a, double scale)
{
    for (size_t h = 0; h < HEADS; h++)
        for (size_t t = 0; t < T; t++) {
            float *row = a + (h * T + t) * T;
            double sum = 0;
            for (size_t i = 0; i <= t; i++)
                sum += row[i] = (float)(0.05 + lcg_uniform() * (i % 7 == 0 ? 5.0 : 1.0));
            for (size_t i = 0; i < T; i++)
                row[i] = i <= t ? (float)(row[i] / sum * scale) : 0.0f;
        }
}

static int same_result(const kve_eval_result *a, const kve_eval_result *b)
{
    return strcmp(a->spec, b->spec) == 0 && a->steps == b->steps &&
           a->scored_steps == b->scored_steps &&
           memcmp(&a->retained_mass, &b->retained_mass, sizeof(double)) == 0 &&
           memcmp(&a->top32_recall, &b->top32_recall, sizeof(double)) == 0 &&
           memcmp(&a->topk_recall, &b->topk_recall, sizeof(double)) == 0 &&
           memcmp(&a->min_retained_mass, &b->min_retained_mass, sizeof(double)) == 0 &&
           memcmp(&a->mean_kept, &b->mean_kept, sizeof(double)) == 0 &&
           a->state_bytes == b->state_bytes;
}

static float arr[HEADS * T * T];

static void test_same_as_memory(void)
{
    const unsigned flags[2] = {KVE_TRACE_NONE, KVE_TRACE_NORMALIZE};
    for (int f = 0; f < 2; f++) {
        lcg_state = check_seed + (uint64_t)f;
        fill_rows(arr, f ? 3.0 : 1.0);
        array_src s = {.a = arr};
        kve_trace *live = NULL, *mem = NULL;
        ASSERT_OK(kve_trace_from_callback(&array_cb, &s, L, H, T, 0, TRACE_FLAGS(flags[f]),
                                          &live));
        ASSERT_OK(kve_trace_from_memory(arr, L, H, T, TRACE_FLAGS(flags[f]), &mem));
        ASSERT_EQ(s.calls, 0); /* nothing asked for before a read */
        ASSERT_EQ(kve_trace_heads(live), HEADS);
        ASSERT_EQ(kve_trace_layers(live), L);
        ASSERT_EQ(kve_trace_steps(live), T);
        ASSERT_EQ(kve_trace_key_dim(live), 0);
        ASSERT_STR_EQ(kve_trace_source(live), "callback");
        /* The harness over every head at once: one callback per step. */
        kve_eval_job jobs[3] = {{"h2o:budget=12,recent_window=4", 0}, {"tova:budget=9", 0},
                                {"streaming:budget=10", 0}};
        kve_eval_result rl[3], rm[3], hl[3 * HEADS], hm[3 * HEADS];
        ASSERT_OK(kve_eval(live, 0, HEADS, jobs, 3, EVAL_OPTS(7, NULL, NULL), rl, hl));
        ASSERT_EQ(s.calls, T);
        ASSERT_EQ(s.backward, 0);
        ASSERT_OK(kve_eval(mem, 0, HEADS, jobs, 3, EVAL_OPTS(7, NULL, NULL), rm, hm));
        for (int j = 0; j < 3; j++)
            ASSERT_TRUE(same_result(&rl[j], &rm[j]));
        for (int j = 0; j < 3 * HEADS; j++)
            ASSERT_TRUE(same_result(&hl[j], &hm[j]));
        /* Head by head: each pass starts again from step 0. */
        s.calls = 0;
        for (size_t h = 0; h < HEADS; h++) {
            ASSERT_OK(kve_eval(live, h, 1, jobs, 1, EVAL_OPTS(7, NULL, NULL), rl, NULL));
            ASSERT_OK(kve_eval(mem, h, 1, jobs, 1, EVAL_OPTS(7, NULL, NULL), rm, NULL));
            ASSERT_TRUE(same_result(&rl[0], &rm[0]));
        }
        ASSERT_EQ(s.calls, HEADS * T);
        ASSERT_EQ(s.backward, HEADS);
        /* Rows in any order, the same bits. */
        double a[T], b[T];
        for (size_t k = 0; k < 50; k++) {
            size_t h = (size_t)(lcg_uniform() * HEADS), t = (size_t)(lcg_uniform() * T);
            ASSERT_OK(kve_trace_row(live, h, t, a, T));
            ASSERT_OK(kve_trace_row(mem, h, t, b, T));
            ASSERT_TRUE(memcmp(a, b, (t + 1) * sizeof *a) == 0);
        }
        ASSERT_STATUS(kve_trace_row(live, 0, 5, a, 5), KVE_ERANGE);
        ASSERT_STATUS(kve_trace_row(live, HEADS, 5, a, T), KVE_EINVAL);
        ASSERT_STATUS(kve_trace_key(live, 0, 5, (float *)a, T), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "has no keys");
        kve_trace_free(mem);
        ASSERT_EQ(s.frees, 0);
        kve_trace_free(live);
        ASSERT_EQ(s.frees, 1);
    }
}

static void test_bad_rows(void)
{
    lcg_state = check_seed;
    fill_rows(arr, 1.0);
    array_src s = {.a = arr, .poison_at = 4};
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_from_callback(&array_cb, &s, L, H, T, 0, NULL, &tr));
    double row[T];
    ASSERT_OK(kve_trace_row(tr, 0, 3, row, T)); /* head 0 of the step is good */
    ASSERT_STATUS(kve_trace_row(tr, 1, 3, row, T), KVE_EFORMAT);
    ASSERT_STR_EQ(kve_last_error(), "callback: head 1 (layer 0, head 1), row 3: weight at key 2 "
                                    "is -0.5 (want finite and >= 0)");
    /* A row that does not sum to 1. */
    arr[(4 * T + 7) * T + 1] += 0.25f;
    ASSERT_STATUS(kve_trace_row(tr, 4, 7, row, T), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "callback: head 4 (layer 1, head 1), row 7 sums to");
    arr[(4 * T + 7) * T + 1] -= 0.25f;
    kve_eval_job job = {"h2o:budget=12,recent_window=4", 0};
    kve_eval_result r;
    s.poison_at = 6;
    ASSERT_STATUS(kve_eval(tr, 0, HEADS, &job, 1, NULL, &r, NULL), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "row 5: weight at key 2");
    /* The callback's own failures: status and message passed on. */
    s.poison_at = 0;
    s.fail = KVE_EIO;
    s.message = 1;
    size_t before = s.calls;
    ASSERT_STATUS(kve_trace_row(tr, 0, 9, row, T), KVE_EIO);
    ASSERT_STR_EQ(kve_last_error(), "my model: step 9 broke");
    s.message = 0;
    ASSERT_STATUS(kve_trace_row(tr, 0, 9, row, T), KVE_EIO);
    ASSERT_STR_EQ(kve_last_error(), "callback: the rows callback failed (KVE_EIO) for step 9");
    s.fail = (kve_status)42;
    ASSERT_STATUS(kve_trace_row(tr, 2, 9, row, T), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "returned 42 for step 9, which is not a kve_status");
    ASSERT_EQ(s.calls - before, 3); /* a failed step is asked for again */
    s.fail = KVE_OK;
    ASSERT_OK(kve_eval(tr, 0, HEADS, &job, 1, NULL, &r, NULL));
    ASSERT_EQ(r.steps, T);
    kve_trace_free(tr);
    ASSERT_EQ(s.frees, 1);
}

/* ---- a callback relaying a q/K trace: rows and keys ---- */

enum { QD = 8, QT = 30, QG = 2, QH = 4 };

typedef struct relay {
    kve_trace *src;
    size_t rows_calls, keys_calls;
    int bad_key_at; /* position + 1 whose key of head 1 is NaN; 0: none */
} relay;

static kve_status relay_rows(void *user, size_t t, float *rows, size_t ld)
{
    relay *r = user;
    double row[QT];
    r->rows_calls++;
    for (size_t h = 0; h < kve_trace_heads(r->src); h++) {
        kve_status st = kve_trace_row(r->src, h, t, row, QT);
        if (st != KVE_OK)
            return st;
        for (size_t i = 0; i <= t; i++)
            rows[h * ld + i] = (float)row[i];
    }
    return KVE_OK;
}

static kve_status relay_keys(void *user, size_t t, float *keys, size_t ld)
{
    relay *r = user;
    r->keys_calls++;
    for (size_t h = 0; h < kve_trace_heads(r->src); h++) {
        kve_status st = kve_trace_key(r->src, h, t, keys + h * ld, ld);
        if (st != KVE_OK)
            return st;
    }
    if (r->bad_key_at == (int)t + 1)
        keys[ld + 3] = NAN;
    return KVE_OK;
}

static const kve_trace_callbacks relay_cb = {.rows = relay_rows, .keys = relay_keys};

static void write_qk_file(const char *path)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    size_t dq[3] = {QH, QT, QD}, dk[3] = {QG, QT, QD};
    kve_rng g;
    kve_rng_seed(&g, check_seed);
    for (int a = 0; a < 2; a++) {
        if (npy_put_header(f, "<f4", a ? dk : dq, 3) != 0)
            abort();
        for (size_t i = 0; i < (a ? (size_t)QG : (size_t)QH) * QT * QD; i++) {
            float v = (float)(kve_rng_uniform(&g) * 4.0 - 2.0);
            fwrite(&v, 4, 1, f);
        }
    }
    fclose(f);
}

static void test_keys(void)
{
    if (tmpdir_make("kvevict-cb") != 0)
        CHECK_FAIL_AT("cannot make a scratch directory");
    char src[512];
    snprintf(src, sizeof src, "qk:%s", path_of("t.qk"));
    write_qk_file(path_of("t.qk"));
    kve_trace *qk = NULL, *live = NULL;
    ASSERT_OK(kve_trace_open(src, NULL, &qk));
    relay r = {.src = qk};
    ASSERT_OK(kve_trace_from_callback(&relay_cb, &r, 1, QG, QT, QD, NULL, &live));
    ASSERT_EQ(kve_trace_key_dim(live), QD);
    kve_eval_job jobs[3] = {{"knorm:budget=8", 0}, {"keydiff:budget=8", 0}, {"h2o:budget=40", 0}};
    jobs[2].spec = "h2o:budget=10,recent_window=3";
    kve_eval_result a[3], b[3];
    ASSERT_OK(kve_eval(live, 0, QG, jobs, 3, NULL, a, NULL));
    ASSERT_OK(kve_eval(qk, 0, QG, jobs, 3, NULL, b, NULL));
    for (int j = 0; j < 3; j++)
        ASSERT_TRUE(same_result(&a[j], &b[j]));
    ASSERT_EQ(r.rows_calls, QT);
    ASSERT_EQ(r.keys_calls, QT);
    float k1[QD], k2[QD];
    ASSERT_OK(kve_trace_key(live, 1, 17, k1, QD));
    ASSERT_OK(kve_trace_key(qk, 1, 17, k2, QD));
    ASSERT_TRUE(memcmp(k1, k2, sizeof k1) == 0);
    ASSERT_STATUS(kve_trace_key(live, 1, 17, k1, QD - 1), KVE_ERANGE);
    r.bad_key_at = 5;
    ASSERT_STATUS(kve_trace_key(live, 0, 4, k1, QD), KVE_EFORMAT);
    ASSERT_STR_EQ(kve_last_error(), "callback: head 1, position 4: key index 3 is nan (want "
                                    "finite)");
    r.bad_key_at = 0;
    ASSERT_OK(kve_trace_key(live, 0, 4, k1, QD)); /* asked for again */
    kve_trace_free(live);
    kve_trace_free(qk);
    remove_dir();
}

/* ---- refusals ---- */

static size_t never_calls;
static kve_status never_rows(void *user, size_t t, float *rows, size_t ld)
{
    (void)user, (void)t, (void)rows, (void)ld;
    never_calls++;
    return KVE_OK;
}
static kve_status never_keys(void *user, size_t t, float *keys, size_t ld)
{
    (void)user, (void)t, (void)keys, (void)ld;
    never_calls++;
    return KVE_OK;
}
static void never_free(void *user)
{
    (void)user;
    never_calls++;
}

static void test_refusals(void)
{
    const kve_trace_callbacks ok = {.rows = never_rows, .free = never_free};
    const kve_trace_callbacks no_rows = {.free = never_free};
    const kve_trace_callbacks with_keys = {.rows = never_rows, .keys = never_keys};
    static int anchor;
    kve_trace *const sentinel = (kve_trace *)(void *)&anchor; /* must stay untouched */
    kve_trace *tr = sentinel;
    ASSERT_STATUS(kve_trace_from_callback(NULL, NULL, 1, 1, 4, 0, NULL, &tr), KVE_EINVAL);
    ASSERT_STR_EQ(kve_last_error(), "callback: cb is NULL");
    ASSERT_STATUS(kve_trace_from_callback(&no_rows, NULL, 1, 1, 4, 0, NULL, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "cb->rows is NULL");
    ASSERT_STATUS(kve_trace_from_callback(&ok, NULL, 1, 1, 4, 0, NULL, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "out is NULL");
    ASSERT_STATUS(kve_trace_from_callback(&ok, NULL, 1, 1, 4, 3, NULL, &tr), KVE_EINVAL);
    ASSERT_STR_EQ(kve_last_error(), "callback: key_dim 3, but cb->keys is NULL");
    ASSERT_STATUS(kve_trace_from_callback(&with_keys, NULL, 1, 1, 4, 0, NULL, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "cb->keys is set, but key_dim is 0");
    ASSERT_STATUS(kve_trace_from_callback(&with_keys, NULL, 1, 1, 4, KVE_MAX_KEY_DIM + 1, NULL,
                                          &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "above KVE_MAX_KEY_DIM");
    ASSERT_STATUS(kve_trace_from_callback(&ok, NULL, 1, 0, 4, 0, NULL, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "has a zero dimension");
    ASSERT_STATUS(kve_trace_from_callback(&ok, NULL, 0, 1, 4, 0, NULL, &tr), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_from_callback(&ok, NULL, 1, 1, 0, 0, NULL, &tr), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_from_callback(&ok, NULL, 1, 1, (size_t)INT32_MAX + 1, 0, NULL, &tr),
                  KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "exceed the largest position");
    ASSERT_STATUS(kve_trace_from_callback(&ok, NULL, SIZE_MAX / 4, 8, 4, 0, NULL, &tr),
                  KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "more than memory can hold");
    ASSERT_STATUS(kve_trace_from_callback(&ok, NULL, 1, 1, 4, 0, TRACE_FLAGS(4), &tr),
                  KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "callback: trace flags 0x4");
    ASSERT_TRUE(tr == sentinel);
    ASSERT_EQ(never_calls, 0);
    /* The source text is reserved; a file of that name opens as ./callback. */
    ASSERT_STATUS(kve_trace_open("callback", NULL, &tr), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "made by kve_trace_from_callback");
    ASSERT_TRUE(tr == sentinel);
}

/* ---- the allocator ---- */

static void test_allocator(void)
{
    talloc ta;
    talloc_init(&ta);
    kve_trace_options o = kve_trace_default_options();
    o.allocator = &ta.a;
    lcg_state = check_seed;
    fill_rows(arr, 1.0);
    array_src s = {.a = arr};
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_from_callback(&array_cb, &s, L, H, T, 0, &o, &tr));
    size_t made = talloc_fail_after(&ta, SIZE_MAX);
    ASSERT_TRUE(made >= 2);
    ASSERT_TRUE(ta.bytes >= (size_t)HEADS * T * sizeof(float));
    kve_eval_job job = {"h2o:budget=12,recent_window=4", 0};
    kve_eval_result r;
    size_t calls = ta.calls;
    double row[T];
    for (size_t t = 0; t < T; t++)
        ASSERT_OK(kve_trace_row(tr, 3, t, row, T));
    ASSERT_EQ(ta.calls, calls); /* reads never allocate */
    ASSERT_OK(kve_eval(tr, 0, HEADS, &job, 1, NULL, &r, NULL));
    kve_trace_free(tr);
    talloc_check_empty(&ta);
    /* Every allocation failing in turn: KVE_ENOMEM, nothing left, no free callback. */
    for (size_t k = 0; k < made; k++) {
        talloc_fail_after(&ta, k);
        tr = NULL;
        ASSERT_STATUS(kve_trace_from_callback(&array_cb, &s, L, H, T, 0, &o, &tr), KVE_ENOMEM);
        ASSERT_TRUE(tr == NULL);
        talloc_check_empty(&ta);
    }
    ASSERT_EQ(s.frees, 1);
    ASSERT_EQ(s.calls, 2 * T); /* the rows read, then the evaluation from step 0 again */
}

/* ---- a rows callback that reads its own trace ---- */

typedef struct nosy_src {
    kve_trace *tr; /* the trace it feeds */
    size_t tried, refused;
} nosy_src;

static kve_status nosy_rows(void *user, size_t t, float *rows, size_t ld)
{
    nosy_src *s = user;
    for (size_t h = 0; h < HEADS; h++)
        memcpy(rows + h * ld, arr + (h * T + t) * T, (t + 1) * sizeof *rows);
    if (s->tr && t > 0) { /* an earlier step: before, it overwrote the step being delivered */
        double row[T];
        s->tried++;
        if (kve_trace_row(s->tr, 0, t - 1, row, T) == KVE_EINVAL &&
            strstr(kve_last_error(), "from inside its own rows callback"))
            s->refused++;
    }
    return KVE_OK;
}

/* Reading a live trace from inside its rows callback is refused, and every
 * row delivered is the array's (before: the nested read replaced the held
 * step, and the outer read returned step t - 1's row for step t). */
static void test_read_from_inside(void)
{
    fill_rows(arr, 1.0);
    static const kve_trace_callbacks nosy_cb = {.rows = nosy_rows};
    nosy_src s = {0};
    kve_trace *tr = NULL, *mem = NULL;
    ASSERT_OK(kve_trace_from_callback(&nosy_cb, &s, L, H, T, 0, NULL, &tr));
    ASSERT_OK(kve_trace_from_memory(arr, L, H, T, NULL, &mem));
    s.tr = tr;
    double a[T], b[T];
    for (size_t t = 0; t < T; t++)
        for (size_t h = 0; h < HEADS; h++) {
            ASSERT_OK(kve_trace_row(tr, h, t, a, T));
            ASSERT_OK(kve_trace_row(mem, h, t, b, T));
            ASSERT_TRUE(memcmp(a, b, (t + 1) * sizeof *a) == 0);
        }
    ASSERT_EQ(s.tried, T - 1);
    ASSERT_EQ(s.refused, s.tried);
    kve_trace_free(tr);
    kve_trace_free(mem);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_same_as_memory);
    RUN(test_bad_rows);
    RUN(test_keys);
    RUN(test_refusals);
    RUN(test_allocator);
    RUN(test_read_from_inside);
    return CHECK_DONE();
}
