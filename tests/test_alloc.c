/* SPDX-License-Identifier: MIT */
/*
 * test_alloc.c - the allocator of every constructor (kvevict.h, "The
 * allocator"): allocation failure along every constructor and file path,
 * the balance of every block, and no byte past the caller's allocator.
 *
 * Every object here is built with a test allocator (test_allocator.h),
 * through its options. For each path the test walks k = 0, 1, 2, ...: the
 * first k allocations succeed and the next fails. Every failing k must
 * return KVE_ENOMEM with a message, leave *out (or the object, or the output
 * file) untouched and hand every block back; the first k at which the call
 * succeeds ends the walk, and the result must then equal a run that never
 * failed. After every object is freed, the allocator holds nothing and every
 * block came back with the size it was allocated with (byte-exact balance).
 * Paths: kve_policy_new_ex and kve_bank_new_ex for every policy; storage
 * growth when a policy is stepped past budget + 1 without evicting; the
 * promise that steps up to budget + 1 and every evict never allocate; a bank
 * whose heads all grow at once (all or nothing); kve_prefill_scores and
 * kve_bank_prefill; kve_trace_open (canonical, .npy, both flags),
 * kve_trace_from_memory and kve_trace_write_npy (no file, no temporary left);
 * kve_eval (buffers and banks); the lifecycle: clone (through the
 * original's allocator) and load (through the one given) of every policy,
 * as a policy, a bank and a shared bank grown past its slots, a copy into a
 * bank that must grow (all or nothing), remove and reset (never); an
 * allocator that calls into its own object (while it grows, is cloned,
 * loaded, prefilled or freed) refused each time.
 *
 * No bypass: this executable is linked with --wrap for malloc, calloc,
 * realloc and free (tests/CMakeLists.txt), so every call the library's
 * objects make to the C library's allocator reaches the counters below;
 * while a test allocator is given, the library must make none.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "facts.h"
#include "test_allocator.h"
#include "tmpdir.h"
#include "kvevict_eval.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

enum { WALK_MAX = 200 }; /* no path here makes this many allocations */

/* ---- the C library's allocator, watched (--wrap) ---- */

#ifdef KVE_WRAP_MALLOC
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);

static int watching;   /* 1 while a library call made with a test allocator runs */
static size_t bypass;  /* C-library allocator calls seen while watching */
static int in_talloc;  /* the test allocator's own calls are not the library's */

void *__wrap_malloc(size_t n)
{
    bypass += watching && !in_talloc;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t size)
{
    bypass += watching && !in_talloc;
    return __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n)
{
    bypass += watching && !in_talloc;
    return __real_realloc(p, n);
}
void __wrap_free(void *p)
{
    bypass += watching && !in_talloc && p;
    __real_free(p);
}
#define WATCH(call)                                                                                \
    do {                                                                                           \
        watching = 1;                                                                              \
        call;                                                                                      \
        watching = 0;                                                                              \
    } while (0)
#else
#define WATCH(call) call
#endif

/* The test allocator, its own calls to malloc marked as its own. */
static void *watched_fn(void *ud, void *ptr, size_t old_size, size_t new_size)
{
#ifdef KVE_WRAP_MALLOC
    in_talloc++;
#endif
    void *p = talloc_fn(ud, ptr, old_size, new_size);
#ifdef KVE_WRAP_MALLOC
    in_talloc--;
#endif
    return p;
}

static void ta_init(talloc *t)
{
    talloc_init(t);
    t->a.fn = watched_fn;
}

/* ---- policies and banks ---- */

/* The spec of policy type i with a small budget and, where the policy has
 * one, a recent window of 2 (so evictions have something to choose from). */
static void small_spec(size_t i, char *out, size_t cap)
{
    char tmp[KVE_SPEC_MAX];
    snprintf(tmp, sizeof tmp, "%s:budget=6", kve_policy_type_name(i));
    if (kve_spec_with(tmp, "recent_window", "2", out, cap) != KVE_OK &&
        kve_spec_with(tmp, "sinks", "2", out, cap) != KVE_OK)
        snprintf(out, cap, "%s", tmp);
}

/* Walks the construction of every policy type through every allocation: a
 * policy when heads is 0, else a bank of `heads` (sharing `share` heads a
 * group, for the policies that can). Every failing k returns ENOMEM with a
 * message and leaves *out, the generator and the allocator as they were. */
static void walk_new(size_t heads, size_t share)
{
    for (size_t i = 0; i < kve_policy_type_count(); i++) {
        char spec[KVE_SPEC_MAX];
        small_spec(i, spec, sizeof spec);
        if (share && (kve_policy_type_reads(i) != KVE_READS_ATTN || strstr(spec, "random")))
            continue; /* only the scored policies share a budget */
        talloc ta;
        ta_init(&ta);
        size_t k = 0;
        for (;; k++) {
            ASSERT_TRUE(k < WALK_MAX);
            kve_rng rng, before;
            kve_rng_seed(&rng, 3);
            before = rng;
            kve_policy *no_policy = (kve_policy *)&rng, *p = no_policy;
            kve_bank *no_bank = (kve_bank *)&before, *b = no_bank;
            kve_policy_options o = kve_policy_default_options();
            o.allocator = &ta.a;
            facts_policy(&o); /* keydiff's unit keys, expected_attention's buffers */
            kve_bank_options bo = kve_bank_default_options();
            bo.allocator = &ta.a;
            facts_bank(&bo);
            bo.share = share;
            talloc_fail_after(&ta, k);
            kve_status st;
            WATCH(st = heads ? kve_bank_new_ex(spec, heads, &rng, &bo, &b)
                             : kve_policy_new_ex(spec, &rng, &o, &p));
            size_t made = talloc_fail_after(&ta, SIZE_MAX);
            if (st == KVE_OK) {
                ASSERT_EQ(made, k); /* it needed exactly the k it was allowed */
                ASSERT_STR_EQ(heads ? kve_bank_spec(b) : kve_policy_spec(p), spec);
                ASSERT_EQ(kve_bank_heads(heads ? b : NULL), heads);
                ASSERT_TRUE(ta.bytes > (heads ? kve_bank_state_bytes(b)
                                              : kve_policy_state_bytes(p)));
                WATCH(heads ? kve_bank_free(b) : kve_policy_free(p));
                break;
            }
            ASSERT_STATUS(st, KVE_ENOMEM);
            ASSERT_TRUE(kve_last_error()[0] != '\0');
            ASSERT_TRUE(p == no_policy && b == no_bank);
            ASSERT_TRUE(memcmp(&rng, &before, sizeof rng) == 0); /* rng not advanced */
            ASSERT_EQ(ta.blocks, 0);
        }
        ASSERT_TRUE(k >= 2); /* the handle and at least one column */
        talloc_check_empty(&ta);
    }
}

static void test_policy_new_every_type(void)
{
    walk_new(0, 0);
}

static void test_bank_new_every_type(void)
{
    walk_new(3, 0);
    walk_new(4, 2);
}

/* The library's promise the other way round: without an allocator it uses
 * the C library's, and the convenience constructors are exactly that. */
static void test_default_allocator(void)
{
    kve_policy *p = NULL;
    kve_bank *b = NULL;
    kve_policy_options o = kve_policy_default_options();
    ASSERT_TRUE(o.allocator == NULL);
    ASSERT_TRUE(kve_bank_default_options().allocator == NULL);
    kve_allocator none = {NULL, NULL}; /* fn NULL: the C library's too */
    o.allocator = &none;
    ASSERT_OK(kve_policy_new_ex("h2o", NULL, &o, &p));
    ASSERT_OK(kve_bank_new("tova", 2, NULL, &b));
    ASSERT_OK(kve_policy_step(p, 0, NULL, 0));
    ASSERT_OK(kve_bank_step(b, 0, NULL, 0));
    kve_policy_free(p);
    kve_bank_free(b);
}

/* Steps p once at `pos` with uniform attention over its kept set and the
 * vectors of facts.h, drawn from a generator seeded by pos. */
static kve_status step_uniform(kve_policy *p, int32_t pos)
{
    float attn[256];
    size_t n = kve_policy_size(p);
    if (n > 256)
        return KVE_EINVAL;
    for (size_t i = 0; i < n; i++)
        attn[i] = (float)(i % 7 + 1) / 16.0f;
    kve_rng g;
    kve_rng_seed(&g, (uint64_t)pos);
    return facts_step(p, pos, attn, n, &g);
}

/* step_uniform on a policy of a test allocator, watched. */
static kve_status step_watched(kve_policy *p, int32_t pos)
{
    kve_status st;
    WATCH(st = step_uniform(p, pos));
    return st;
}

static void test_growth_and_no_alloc_promises(void)
{
    for (size_t i = 0; i < kve_policy_type_count(); i++) {
        char spec[KVE_SPEC_MAX];
        small_spec(i, spec, sizeof spec);
        kve_rng ra, rb;
        kve_rng_seed(&ra, 11);
        rb = ra;
        talloc ta;
        ta_init(&ta);
        kve_policy *a = NULL, *b = NULL;
        kve_policy_options o = kve_policy_default_options();
        facts_policy(&o);
        ASSERT_OK(kve_policy_new_ex(spec, &rb, &o, &b));
        o.allocator = &ta.a;
        ASSERT_OK(kve_policy_new_ex(spec, &ra, &o, &a));
        size_t budget = kve_policy_budget(a);
        int32_t pos = 0;

        /* Up to budget + 1 positions: no allocation at all. */
        talloc_fail_after(&ta, 0);
        for (; (size_t)pos <= budget; pos++) {
            kve_status st = step_watched(a, pos);
            if (st != KVE_OK) {
                talloc_fail_after(&ta, SIZE_MAX);
                ASSERT_OK(st);
            }
        }
        ASSERT_EQ(talloc_fail_after(&ta, SIZE_MAX), 0);
        for (int32_t q = 0; q < pos; q++)
            ASSERT_OK(step_uniform(b, q));

        /* Past it: growth, walked through every failing allocation. */
        for (int round = 0; round < 3; round++, pos++) {
            size_t k = 0;
            for (;; k++) {
                ASSERT_TRUE(k < WALK_MAX);
                size_t size = kve_policy_size(a), bytes = kve_policy_state_bytes(a);
                size_t live = ta.blocks;
                int32_t kept[64];
                ASSERT_TRUE(size <= 64);
                memcpy(kept, kve_policy_positions(a), size * sizeof *kept);
                talloc_fail_after(&ta, k);
                kve_status st = step_watched(a, pos);
                talloc_fail_after(&ta, SIZE_MAX);
                if (st == KVE_OK)
                    break;
                ASSERT_STATUS(st, KVE_ENOMEM);
                ASSERT_EQ(kve_policy_size(a), size);
                ASSERT_EQ(kve_policy_state_bytes(a), bytes);
                ASSERT_EQ(ta.blocks, live);
                ASSERT_TRUE(memcmp(kept, kve_policy_positions(a), size * sizeof *kept) == 0);
            }
            ASSERT_OK(step_uniform(b, pos));
        }

        /* Evict never allocates, and the failed growths left no trace: a
         * and b (which never failed) agree from here on. */
        int32_t va[64], vb[64];
        size_t na = 0, nb = 0;
        for (int round = 0; round < 4; round++, pos++) {
            talloc_fail_after(&ta, 0);
            kve_status st;
            WATCH(st = kve_policy_evict(a, budget, va, 64, &na));
            talloc_fail_after(&ta, SIZE_MAX);
            ASSERT_OK(st);
            ASSERT_OK(kve_policy_evict(b, budget, vb, 64, &nb));
            ASSERT_EQ(na, nb);
            ASSERT_TRUE(memcmp(va, vb, na * sizeof *va) == 0);
            ASSERT_EQ(kve_policy_size(a), kve_policy_size(b));
            ASSERT_TRUE(memcmp(kve_policy_positions(a), kve_policy_positions(b),
                               kve_policy_size(a) * sizeof(int32_t)) == 0);
            ASSERT_OK(step_watched(a, pos));
            ASSERT_OK(step_uniform(b, pos));
        }
        WATCH(kve_policy_free(a));
        kve_policy_free(b);
        talloc_check_empty(&ta);
    }
}

/* Every head of a bank steps past its slots at once: each needs a block, and
 * a failure at any of them leaves every head as it was (the blocks already
 * made are released). Steady-state steps and evicts, grouped or not, never
 * allocate. */
static void test_bank_growth_all_or_nothing(void)
{
    enum { H = 3, G = 2 };
    talloc ta;
    ta_init(&ta);
    kve_bank *a = NULL, *b = NULL;
    kve_bank_options bo = kve_bank_default_options();
    bo.allocator = &ta.a;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=4,recent_window=1", H, NULL, &bo, &a));
    ASSERT_OK(kve_bank_new("h2o:budget=4,recent_window=1", H, NULL, &b));
    float rows[H * G * 16];
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        rows[i] = (float)(i % 5) / 8.0f;
    int32_t victims[H * 16];
    size_t counts[H];
    int32_t pos = 0;
    talloc_fail_after(&ta, 0);
    for (; pos < 40; pos++) { /* the steady state, grouped every other step */
        kve_status st;
        WATCH(st = pos % 2 ? kve_bank_step(a, pos, rows, 16)
                           : kve_bank_step_range(a, 0, H, pos, rows, 16, G, KVE_REDUCE_MEAN,
                                                 NULL, 0));
        if (st == KVE_OK)
            WATCH(st = kve_bank_evict(a, 4, victims, 16, counts));
        if (st != KVE_OK) {
            talloc_fail_after(&ta, SIZE_MAX);
            ASSERT_OK(st);
        }
    }
    talloc_fail_after(&ta, SIZE_MAX);
    for (int32_t q = 0; q < pos; q++) {
        ASSERT_OK(q % 2 ? kve_bank_step(b, q, rows, 16)
                        : kve_bank_step_range(b, 0, H, q, rows, 16, G, KVE_REDUCE_MEAN, NULL, 0));
        ASSERT_OK(kve_bank_evict(b, 4, victims, 16, counts));
    }
    ASSERT_OK(kve_bank_step(a, pos, rows, 16)); /* 5 kept: the slots are full */
    ASSERT_OK(kve_bank_step(b, pos++, rows, 16));
    size_t bytes = kve_bank_state_bytes(a), live = ta.blocks;
    size_t k = 0;
    for (;; k++) {
        ASSERT_TRUE(k < WALK_MAX);
        talloc_fail_after(&ta, k);
        kve_status st;
        WATCH(st = kve_bank_step(a, pos, rows, 16));
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK)
            break;
        ASSERT_STATUS(st, KVE_ENOMEM);
        ASSERT_EQ(kve_bank_state_bytes(a), bytes);
        ASSERT_EQ(ta.blocks, live);
        for (size_t h = 0; h < H; h++) {
            ASSERT_EQ(kve_bank_size(a, h), 5);
            ASSERT_TRUE(memcmp(kve_bank_positions(a, h), kve_bank_positions(b, h),
                               5 * sizeof(int32_t)) == 0);
        }
    }
    ASSERT_EQ(k, H); /* one block per head */
    ASSERT_OK(kve_bank_step(b, pos++, rows, 16));
    /* From here a (which failed H times) and b (which never did) agree. */
    for (int round = 0; round < 6; round++, pos++) {
        size_t ca[H], cb[H];
        int32_t vb[H * 16];
        ASSERT_OK(kve_bank_evict(a, 4, victims, 16, ca));
        ASSERT_OK(kve_bank_evict(b, 4, vb, 16, cb));
        for (size_t h = 0; h < H; h++) {
            ASSERT_EQ(ca[h], cb[h]);
            ASSERT_TRUE(memcmp(victims + h * 16, vb + h * 16, ca[h] * sizeof(int32_t)) == 0);
        }
        ASSERT_OK(kve_bank_step(a, pos, rows, 16));
        ASSERT_OK(kve_bank_step(b, pos, rows, 16));
    }
    WATCH(kve_bank_free(a));
    kve_bank_free(b);
    talloc_check_empty(&ta);
}

/* A shared bank that outgrows its group's region, with keys, through every
 * failing allocation: then its blocks all come back with their sizes. */
static void test_shared_bank_growth(void)
{
    enum { H = 4, G = 2, D = 3 };
    talloc ta;
    ta_init(&ta);
    kve_bank *b = NULL;
    kve_bank_options bo = kve_bank_default_options();
    bo.allocator = &ta.a;
    bo.share = G;
    bo.key_dim = D;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=6,recent_window=1", H, NULL, &bo, &b));
    float rows[H * 64], keys[H * D];
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        rows[i] = (float)(i % 3 + 1) / 64.0f;
    for (size_t i = 0; i < H * D; i++)
        keys[i] = (float)i;
    size_t grew = 0;
    for (int32_t pos = 0; pos < 40; pos++) {
        size_t k = 0;
        for (;; k++) {
            ASSERT_TRUE(k < WALK_MAX);
            size_t live = ta.blocks;
            talloc_fail_after(&ta, k);
            kve_status st;
            WATCH(st = kve_bank_step_range(b, 0, H, pos, rows, 64, 1, KVE_REDUCE_MEAN, keys, D));
            talloc_fail_after(&ta, SIZE_MAX);
            if (st == KVE_OK)
                break;
            ASSERT_STATUS(st, KVE_ENOMEM);
            ASSERT_EQ(ta.blocks, live);
        }
        grew += k;
        if (pos % 3 == 2) { /* evict now and then: the groups grow meanwhile */
            int32_t victims[H * 64];
            kve_status st;
            WATCH(st = kve_bank_evict_shared(b, 0, H, G * 6, victims, 64, NULL));
            ASSERT_OK(st);
        }
    }
    ASSERT_TRUE(grew > 0); /* some step needed a bigger block */
    WATCH(kve_bank_free(b));
    talloc_check_empty(&ta);
}

/* ---- prefill ---- */

static void test_prefill(void)
{
    enum { N = 24, H = 2 };
    float rows[H * N * N];
    for (size_t h = 0; h < H; h++)
        for (size_t t = 0; t < N; t++)
            for (size_t i = 0; i < N; i++)
                rows[(h * N + t) * N + i] = i <= t ? 1.0f / (float)(t + 1) : 0.0f;
    for (int method = 0; method < 2; method++) {
        talloc ta, tb;
        ta_init(&ta);
        ta_init(&tb);
        kve_prefill_options po = kve_prefill_default_options();
        po.method = method ? KVE_PREFILL_SNAPKV : KVE_PREFILL_H2O;
        po.window = 4;
        size_t r = kve_prefill_rows(N, &po);
        const float *last = rows + (N - r) * N; /* head 0's last r rows */
        double want[N], got[N];
        ASSERT_OK(kve_prefill_scores(N, last, N, 1, KVE_REDUCE_MEAN, &po, want));
        po.allocator = &ta.a;
        for (size_t k = 0;; k++) { /* the call's scratch */
            ASSERT_TRUE(k < WALK_MAX);
            memcpy(got, want, sizeof got);
            got[0] = -1;
            talloc_fail_after(&ta, k);
            kve_status st;
            WATCH(st = kve_prefill_scores(N, last, N, 1, KVE_REDUCE_MEAN, &po, got));
            talloc_fail_after(&ta, SIZE_MAX);
            if (st == KVE_OK)
                break;
            ASSERT_STATUS(st, KVE_ENOMEM);
            ASSERT_TRUE(got[0] == -1); /* untouched */
        }
        ASSERT_TRUE(memcmp(got, want, sizeof got) == 0);
        talloc_check_empty(&ta);
        /* kve_bank_prefill: the bank's allocator when the options give none,
         * else the options'. */
        kve_bank_options bo = kve_bank_default_options();
        bo.allocator = &tb.a;
        kve_bank *b = NULL;
        ASSERT_OK(kve_bank_new_ex("h2o:budget=12,recent_window=2", H, NULL, &bo, &b));
        po.allocator = NULL;
        float prows[H * 24 * N];
        for (size_t h = 0; h < H; h++)
            memcpy(prows + h * r * N, rows + (N - r) * N, r * N * sizeof *rows);
        size_t k = 0;
        for (;; k++) {
            ASSERT_TRUE(k < WALK_MAX);
            size_t live = tb.blocks;
            talloc_fail_after(&tb, k);
            kve_status st;
            WATCH(st = kve_bank_prefill(b, 0, H, N, 10, prows, N, 1, KVE_REDUCE_MEAN, &po));
            talloc_fail_after(&tb, SIZE_MAX);
            ASSERT_EQ(tb.blocks, live); /* the scratch is the call's */
            if (st == KVE_OK)
                break;
            ASSERT_STATUS(st, KVE_ENOMEM);
            ASSERT_EQ(kve_bank_size(b, 0), 0);
        }
        ASSERT_EQ(k, 1); /* one block of scratch, from the bank's allocator */
        ASSERT_EQ(kve_bank_size(b, 1), 10);
        kve_bank_free(b);
        talloc_check_empty(&tb);
    }
}

/* ---- traces ---- */

/* Walks kve_trace_open(src, flags) through every allocation of `ta`; on
 * success returns the trace in *out. */
static void walk_trace_open(const char *src, kve_trace_flags flags, talloc *ta, kve_trace **out)
{
    *out = NULL;
    kve_trace_options o = kve_trace_default_options();
    o.flags = flags;
    o.allocator = &ta->a;
    for (size_t k = 0;; k++) {
        ASSERT_TRUE(k < WALK_MAX);
        kve_trace *sentinel = (kve_trace *)&k, *tr = sentinel;
        talloc_fail_after(ta, k);
        kve_status st;
        WATCH(st = kve_trace_open(src, &o, &tr));
        talloc_fail_after(ta, SIZE_MAX);
        if (st == KVE_OK) {
            *out = tr;
            return;
        }
        ASSERT_STATUS(st, KVE_ENOMEM);
        ASSERT_TRUE(kve_last_error()[0] != '\0');
        ASSERT_TRUE(tr == sentinel);
        ASSERT_EQ(ta->blocks, 0);
    }
}

static bool same_rows(kve_trace *a, kve_trace *b, size_t head)
{
    size_t steps = kve_trace_steps(a);
    double ra[64], rb[64];
    if (steps != kve_trace_steps(b) || steps > 64)
        return false;
    for (size_t t = 0; t < steps; t++) {
        kve_status st;
        WATCH(st = kve_trace_row(a, head, t, ra, 64));
        if (st != KVE_OK || kve_trace_row(b, 0, t, rb, 64) != KVE_OK)
            return false;
        if (memcmp(ra, rb, (t + 1) * sizeof *ra) != 0)
            return false;
    }
    return true;
}

static void test_trace_open_canonical(void)
{
    const char *srcs[] = {"canonical:steps=40,seed=5", "canonical:steps=64,epoch=8,heavy=4",
                          "canonical:version=1,steps=64", "canonical"};
    for (size_t s = 0; s < 4; s++) {
        talloc ta;
        ta_init(&ta);
        kve_trace *tr = NULL, *plain = NULL;
        walk_trace_open(srcs[s], KVE_TRACE_NONE, &ta, &tr);
        ASSERT_TRUE(tr != NULL);
        ASSERT_OK(kve_trace_open(srcs[s], NULL, &plain));
        ASSERT_EQ(kve_trace_steps(tr), kve_trace_steps(plain));
        ASSERT_STR_EQ(kve_trace_source(tr), kve_trace_source(plain));
        if (kve_trace_steps(tr) <= 64)
            ASSERT_TRUE(same_rows(tr, plain, 0));
        WATCH(kve_trace_free(tr));
        kve_trace_free(plain);
        talloc_check_empty(&ta);
    }
}

/* Files go to a private directory (tmpdir.h), so "no partial or temporary
 * file" can be checked by listing it. */
static void test_npy_write_and_open(void)
{
    talloc tw;
    ta_init(&tw);
    kve_trace_options wo = kve_trace_default_options();
    wo.allocator = &tw.a;
    kve_trace *src = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=48,seed=9", &wo, &src));
    char path[128];
    snprintf(path, sizeof path, "%s/t.npy", dir);

    /* Writing: every failure leaves the directory empty; the scratch is the
     * trace's, returned before the call does. */
    size_t k = 0, live = tw.blocks;
    for (;; k++) {
        ASSERT_TRUE(k < WALK_MAX);
        talloc_fail_after(&tw, k);
        kve_status st;
        WATCH(st = kve_trace_write_npy(src, 0, path));
        talloc_fail_after(&tw, SIZE_MAX);
        ASSERT_EQ(tw.blocks, live);
        if (st == KVE_OK)
            break;
        ASSERT_STATUS(st, KVE_ENOMEM);
        ASSERT_EQ(files_in_dir(), 0);
    }
    ASSERT_TRUE(k >= 2); /* the temporary name, then the row buffers */
    ASSERT_EQ(files_in_dir(), 1);

    /* Reading it back, both flags. */
    for (int flags = KVE_TRACE_NONE; flags <= KVE_TRACE_NORMALIZE; flags++) {
        talloc ta;
        ta_init(&ta);
        kve_trace *tr = NULL;
        walk_trace_open(path, (kve_trace_flags)flags, &ta, &tr);
        ASSERT_TRUE(tr != NULL);
        ASSERT_EQ(kve_trace_steps(tr), 48);
        ASSERT_EQ(kve_trace_heads(tr), 1);
        double ra[48], rb[48];
        for (size_t t = 0; t < 48; t++) {
            ASSERT_OK(kve_trace_row(tr, 0, t, ra, 48));
            ASSERT_OK(kve_trace_row(src, 0, t, rb, 48));
            for (size_t i = 0; i <= t; i++)
                ASSERT_NEAR(ra[i], rb[i], flags ? 1e-6 : 0.0);
        }
        WATCH(kve_trace_free(tr));
        talloc_check_empty(&ta);
    }
    /* Overwriting an existing file under failure keeps the old one intact. */
    talloc_fail_after(&tw, 0);
    kve_status st = kve_trace_write_npy(src, 0, path);
    talloc_fail_after(&tw, SIZE_MAX);
    ASSERT_STATUS(st, KVE_ENOMEM);
    ASSERT_EQ(files_in_dir(), 1);
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open(path, NULL, &tr));
    ASSERT_EQ(kve_trace_steps(tr), 48);
    kve_trace_free(tr);
    WATCH(kve_trace_free(src));
    talloc_check_empty(&tw);
    ASSERT_EQ(unlink(path), 0);
}

static void test_trace_from_memory(void)
{
    enum { L = 2, H = 2, T = 16 };
    static float attn[L * H * T * T];
    for (size_t h = 0; h < L * H; h++)
        for (size_t t = 0; t < T; t++)
            for (size_t i = 0; i <= t; i++)
                attn[(h * T + t) * T + i] = 1.0f / (float)(t + 1);
    for (int flags = KVE_TRACE_NONE; flags <= KVE_TRACE_NORMALIZE; flags++) {
        talloc ta;
        ta_init(&ta);
        kve_trace_options o = kve_trace_default_options();
        o.flags = (kve_trace_flags)flags;
        o.allocator = &ta.a;
        kve_trace *tr = NULL;
        size_t k = 0;
        for (;; k++) {
            ASSERT_TRUE(k < WALK_MAX);
            kve_trace *sentinel = (kve_trace *)&k;
            tr = sentinel;
            talloc_fail_after(&ta, k);
            kve_status st;
            WATCH(st = kve_trace_from_memory(attn, L, H, T, &o, &tr));
            talloc_fail_after(&ta, SIZE_MAX);
            if (st == KVE_OK)
                break;
            ASSERT_STATUS(st, KVE_ENOMEM);
            ASSERT_TRUE(tr == sentinel);
            ASSERT_EQ(ta.blocks, 0);
        }
        ASSERT_TRUE(k >= 3); /* handle, validation row, state */
        ASSERT_EQ(kve_trace_heads(tr), L * H);
        double row[T];
        ASSERT_OK(kve_trace_row(tr, 3, T - 1, row, T));
        ASSERT_TRUE(row[0] == (double)(1.0f / (float)T) || flags);
        WATCH(kve_trace_free(tr));
        talloc_check_empty(&ta);
    }
}

/* ---- the harness ---- */

static int count_steps(void *user, size_t job, int32_t pos, const int32_t *victims,
                       size_t n_victims)
{
    (void)job;
    (void)pos;
    (void)victims;
    (void)n_victims;
    ++*(size_t *)user;
    return 0;
}

static void test_eval(void)
{
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=80,seed=2", NULL, &tr));
    const kve_eval_job jobs[] = {
        {"h2o:budget=16,recent_window=4", KVE_EVAL_BUDGET_SPEC},
        {"random:budget=32", 12},
        {"streaming:budget=8,sinks=2", KVE_EVAL_BUDGET_SPEC},
        {"h2o_mean", 40},
    };
    enum { N = sizeof jobs / sizeof jobs[0] };
    kve_eval_result want[N];
    size_t calls = 0;
    kve_eval_options o = kve_eval_default_options();
    o.seed = 42;
    o.on_step = count_steps;
    o.user = &calls;
    ASSERT_OK(kve_eval(tr, 0, 1, jobs, N, &o, want, NULL));
    ASSERT_EQ(calls, 80 * N);

    talloc ta;
    ta_init(&ta);
    o.on_step = NULL;
    o.allocator = &ta.a;
    size_t k = 0;
    for (;; k++) {
        ASSERT_TRUE(k < WALK_MAX);
        kve_eval_result got[N], untouched[N];
        memset(got, 0xab, sizeof got);
        memcpy(untouched, got, sizeof got);
        talloc_fail_after(&ta, k);
        kve_status st;
        WATCH(st = kve_eval(tr, 0, 1, jobs, N, &o, got, NULL));
        talloc_fail_after(&ta, SIZE_MAX);
        ASSERT_EQ(ta.blocks, 0); /* the buffers and the banks are the call's */
        if (st == KVE_OK) {
            for (size_t j = 0; j < N; j++) {
                ASSERT_STR_EQ(got[j].spec, want[j].spec);
                ASSERT_EQ(got[j].budget, want[j].budget);
                ASSERT_EQ(got[j].scored_steps, want[j].scored_steps);
                ASSERT_TRUE(got[j].retained_mass == want[j].retained_mass);
                ASSERT_TRUE(got[j].top32_recall == want[j].top32_recall);
                ASSERT_TRUE(got[j].min_retained_mass == want[j].min_retained_mass);
                ASSERT_EQ(got[j].state_bytes, want[j].state_bytes);
            }
            break;
        }
        ASSERT_STATUS(st, KVE_ENOMEM);
        ASSERT_TRUE(kve_last_error()[0] != '\0');
        ASSERT_TRUE(memcmp(got, untouched, sizeof got) == 0);
    }
    ASSERT_TRUE(k >= 2 * N); /* at least a bank and its columns per policy */
    talloc_check_empty(&ta);

    /* Several heads, sharing, per-head results, top-k: the same balance. */
    kve_trace *mem = NULL;
    static float attn[4 * 40 * 40];
    for (size_t h = 0; h < 4; h++)
        for (size_t t = 0; t < 40; t++)
            for (size_t i = 0; i <= t; i++)
                attn[(h * 40 + t) * 40 + i] = (float)(i + h + 1);
    kve_trace_options to = kve_trace_default_options();
    to.flags = KVE_TRACE_NORMALIZE;
    to.allocator = &ta.a;
    ASSERT_OK(kve_trace_from_memory(attn, 1, 4, 40, &to, &mem));
    o.share = 2;
    o.topk = 5;
    kve_eval_result res[1], heads[4];
    kve_eval_job job = {"h2o:budget=10,recent_window=2", KVE_EVAL_BUDGET_SPEC};
    kve_status st;
    WATCH(st = kve_eval(mem, 0, 4, &job, 1, &o, res, heads));
    ASSERT_OK(st);
    ASSERT_TRUE(res[0].retained_mass <= 1.0 && heads[3].retained_mass <= 1.0);
    WATCH(kve_trace_free(mem));
    talloc_check_empty(&ta);
    kve_trace_free(tr);
}

/* ---- the lifecycle ---- */

/* An object's image (outside WATCH: the test's own malloc). */
static uint8_t *image_of(const kve_policy *p, const kve_bank *b, size_t *n)
{
    if ((p ? kve_policy_save(p, NULL, 0, n) : kve_bank_save(b, NULL, 0, n)) != KVE_OK)
        return NULL;
    uint8_t *img = malloc(*n);
    if (img && (p ? kve_policy_save(p, img, *n, n) : kve_bank_save(b, img, *n, n)) != KVE_OK) {
        free(img);
        return NULL;
    }
    return img;
}

static int image_is(const kve_policy *p, const kve_bank *b, const uint8_t *want, size_t n)
{
    size_t got = 0;
    uint8_t *img = image_of(p, b, &got);
    int same = img && got == n && memcmp(img, want, n) == 0;
    free(img);
    return same;
}

/* Every type as a policy (heads 0) or a bank (sharing `share` heads a group
 * for the policies that can), grown past its slots by steps without an
 * evict: clone and load walked through every allocation, each failing k
 * ENOMEM with *out untouched, nothing left allocated and the original
 * unchanged, the success equal to the original; a copy into a new object
 * (which must grow) all or nothing; remove and reset never allocate. */
static void walk_lifecycle(size_t heads, size_t share)
{
    for (size_t i = 0; i < kve_policy_type_count(); i++) {
        char spec[KVE_SPEC_MAX];
        small_spec(i, spec, sizeof spec);
        if (share && (kve_policy_type_reads(i) != KVE_READS_ATTN || strstr(spec, "random")))
            continue;
        talloc ta, tb;
        ta_init(&ta);
        ta_init(&tb);
        kve_rng rng;
        kve_rng_seed(&rng, 7);
        kve_policy *p = NULL, *dp = NULL;
        kve_bank *b = NULL, *db = NULL;
        /* the facts of the policies that read queries and values (the
         * others validate and ignore them): expected_attention's per-head
         * state goes through clone, load and copy too */
        kve_policy_options o = kve_policy_default_options();
        o.allocator = &ta.a;
        o.key_dim = 4;
        o.value_dim = 2;
        o.query_group = 2;
        o.rope.rotary_dim = 4;
        kve_bank_options bo = kve_bank_default_options();
        bo.allocator = &ta.a;
        bo.key_dim = 4;
        bo.share = share;
        bo.value_dim = o.value_dim;
        bo.query_group = o.query_group;
        bo.rope = o.rope;
        ASSERT_OK(heads ? kve_bank_new_ex(spec, heads, &rng, &bo, &b)
                        : kve_policy_new_ex(spec, &rng, &o, &p));
        float keys[4 * 4], queries[4 * 2 * 4], values[4 * 2];
        for (size_t j = 0; j < 16; j++)
            keys[j] = (float)j - 7.5f;
        for (size_t j = 0; j < 32; j++)
            queries[j] = (float)(j % 5) - 2.0f;
        for (size_t j = 0; j < 8; j++)
            values[j] = (float)j - 3.0f;
        kve_step_data d = kve_step_default_data();
        d.keys = keys;
        d.ld_keys = 4;
        d.queries = queries;
        d.ld_queries = 4;
        d.values = values;
        d.ld_values = 2;
        for (int32_t t = 0; t < 20; t++) /* past budget + 1 = 7 slots: grown */
            ASSERT_OK(heads ? kve_bank_step_data(b, 0, heads, t, &d)
                            : kve_policy_step_data(p, t, &d));
        size_t n = 0;
        uint8_t *img = image_of(p, b, &n);
        ASSERT_TRUE(img != NULL);
        const size_t blocks = ta.blocks;
        for (int what = 0; what < 2; what++) { /* clone, then load */
            talloc *t = what ? &tb : &ta;
            for (size_t k = 0;; k++) {
                ASSERT_TRUE(k < WALK_MAX);
                kve_policy *cp = (kve_policy *)&rng, *no_p = cp;
                kve_bank *cb = (kve_bank *)&n, *no_b = cb;
                talloc_fail_after(t, k);
                kve_status st;
                if (what)
                    WATCH(st = heads ? kve_bank_load(img, n, &tb.a, &cb)
                                     : kve_policy_load(img, n, &tb.a, &cp));
                else
                    WATCH(st = heads ? kve_bank_clone(b, &cb) : kve_policy_clone(p, &cp));
                talloc_fail_after(t, SIZE_MAX);
                if (st == KVE_OK) {
                    ASSERT_TRUE(image_is(heads ? NULL : cp, heads ? cb : NULL, img, n));
                    WATCH(heads ? kve_bank_free(cb) : kve_policy_free(cp));
                    break;
                }
                ASSERT_STATUS(st, KVE_ENOMEM);
                ASSERT_TRUE(cp == no_p && cb == no_b);
                ASSERT_EQ(ta.blocks, blocks);
                ASSERT_EQ(tb.blocks, 0);
            }
        }
        ASSERT_TRUE(image_is(p, b, img, n));
        /* a copy into a new object of the same spec, which must grow */
        o.allocator = bo.allocator = &tb.a;
        kve_rng_seed(&rng, 8);
        ASSERT_OK(heads ? kve_bank_new_ex(spec, heads, &rng, &bo, &db)
                        : kve_policy_new_ex(spec, &rng, &o, &dp));
        size_t dn = 0;
        uint8_t *dimg = image_of(dp, db, &dn);
        for (size_t k = 0;; k++) {
            ASSERT_TRUE(k < WALK_MAX);
            talloc_fail_after(&tb, k);
            kve_status st;
            WATCH(st = heads ? kve_bank_copy(db, b) : kve_policy_copy(dp, p));
            talloc_fail_after(&tb, SIZE_MAX);
            if (st == KVE_OK)
                break;
            ASSERT_STATUS(st, KVE_ENOMEM);
            ASSERT_TRUE(image_is(dp, db, dimg, dn)); /* all or nothing */
        }
        ASSERT_TRUE(image_is(dp, db, img, n));
        free(dimg);
        /* remove and reset never allocate */
        talloc_fail_after(&ta, 0);
        size_t gone = 0;
        WATCH(ASSERT_OK(heads ? kve_bank_remove(b, 3, 9) : kve_policy_remove(p, 3, 9, &gone)));
        WATCH(heads ? kve_bank_reset(b) : kve_policy_reset(p));
        ASSERT_EQ(talloc_fail_after(&ta, SIZE_MAX), 0);
        WATCH(heads ? kve_bank_free(b) : kve_policy_free(p));
        WATCH(heads ? kve_bank_free(db) : kve_policy_free(dp));
        free(img);
        talloc_check_empty(&ta);
        talloc_check_empty(&tb);
    }
}

static void test_lifecycle(void)
{
    walk_lifecycle(0, 0);
    walk_lifecycle(3, 0);
    walk_lifecycle(4, 2);
}

/* ---- an allocator that calls into its own object ---- */

/* An allocator (kvevict.h, "Calls from callbacks") that, at every call the
 * library makes to it, tries every call into the objects it serves: its
 * targets, set by the test or captured as the first block it hands out
 * while `capture` is set (the handle of a clone or load being built). Each
 * must be refused, KVE_EINVAL naming the re-entry, or ignored (free, reset)
 * with that message. */
typedef struct meddler {
    talloc t;              /* first: the blocks (talloc_fn's ud) */
    void *target[2];       /* policies (is_bank 0) or banks (1) */
    int is_bank;
    int capture;           /* 1: the next block handed out becomes target[1] */
    int inside;            /* a meddle is running */
    size_t tried, refused; /* calls tried, and refused as they must be */
} meddler;

static kve_policy *other_policy; /* objects of their own, for copies */
static kve_bank *other_bank;

static void meddle_check(meddler *m, kve_status st)
{
    m->tried++;
    if (st == KVE_EINVAL && (strstr(kve_last_error(), "called from inside one of this") ||
                             strstr(kve_last_error(), "called from inside a callback of a copy")))
        m->refused++;
}

static void meddle(meddler *m, void *target)
{
    float w[64] = {0};
    int32_t victims[64];
    size_t n = 0;
    static unsigned char img[1 << 14];
    if (!m->is_bank) {
        kve_policy *p = target, *c = NULL;
        meddle_check(m, kve_policy_step(p, 1 << 20, NULL, 0));
        meddle_check(m, kve_policy_step(p, 1 << 20, w, 1));
        meddle_check(m, kve_policy_evict(p, 3, victims, 64, &n));
        meddle_check(m, kve_policy_remove(p, 0, KVE_POS_END, &n));
        meddle_check(m, kve_policy_clone(p, &c));
        meddle_check(m, kve_policy_save(p, img, sizeof img, &n));
        meddle_check(m, kve_policy_copy(p, other_policy));
        meddle_check(m, kve_policy_copy(other_policy, p));
        kve_set_error(KVE_OK, NULL);
        kve_policy_reset(p);
        meddle_check(m, KVE_EINVAL); /* ignored: the message says so */
        kve_policy_free(p);
        meddle_check(m, KVE_EINVAL);
        ASSERT_TRUE(c == NULL);
    } else {
        kve_bank *b = target, *c = NULL;
        meddle_check(m, kve_bank_step(b, 1 << 20, NULL, 0));
        meddle_check(m, kve_bank_evict(b, 3, victims, 64, NULL));
        meddle_check(m, kve_bank_remove(b, 0, KVE_POS_END));
        meddle_check(m, kve_bank_clone(b, &c));
        meddle_check(m, kve_bank_save(b, img, sizeof img, &n));
        meddle_check(m, kve_bank_copy(b, other_bank));
        meddle_check(m, kve_bank_copy(other_bank, b));
        meddle_check(m, kve_bank_prefill(b, 0, 1, 2, 4, w, 2, 1, KVE_REDUCE_MEAN, NULL));
        kve_set_error(KVE_OK, NULL);
        kve_bank_reset(b);
        meddle_check(m, KVE_EINVAL);
        kve_bank_free(b);
        meddle_check(m, KVE_EINVAL);
        ASSERT_TRUE(c == NULL);
    }
}

static void *meddle_fn(void *ud, void *ptr, size_t old_size, size_t new_size)
{
    meddler *m = ud;
    for (int i = 0; i < 2; i++)
        if (ptr && new_size == 0 && ptr == m->target[i])
            m->target[i] = NULL; /* the handle goes: the object is no more */
    void *r = watched_fn(&m->t, ptr, old_size, new_size);
    if (m->capture && r && !ptr) {
        m->target[1] = r; /* the handle: a half-built object's */
        m->capture = 0;
    } else if (!m->inside) {
        m->inside = 1;
        for (int i = 0; i < 2; i++)
            if (m->target[i])
                meddle(m, m->target[i]);
        m->inside = 0;
    }
    return r;
}

static void meddler_init(meddler *m, int is_bank)
{
    memset(m, 0, sizeof *m);
    ta_init(&m->t);
    m->t.a.fn = meddle_fn;
    m->t.a.ud = m;
    m->is_bank = is_bank;
}

/* Every call into the object was refused, and there were some. */
#define ASSERT_MEDDLED(m)                                                                          \
    do {                                                                                           \
        ASSERT_TRUE((m)->tried > 0);                                                               \
        ASSERT_EQ((m)->refused, (m)->tried);                                                       \
        (m)->tried = (m)->refused = 0;                                                             \
    } while (0)

/* A clone of p (or b), whose allocator m is, then a load of its image
 * img[0 .. n) through an allocator of the same kind, then its free: each
 * with every call into the object (the original, the half-built clone or
 * load, the one being released) refused, and each result the image. */
static void clone_load_free(meddler *m, kve_policy *p, kve_bank *b, const uint8_t *img, size_t n)
{
    kve_policy *pc = NULL, *pl = NULL;
    kve_bank *bc = NULL, *bl = NULL;
    m->target[0] = p ? (void *)p : (void *)b;
    m->capture = 1;
    ASSERT_OK(p ? kve_policy_clone(p, &pc) : kve_bank_clone(b, &bc));
    m->target[0] = m->target[1] = NULL;
    ASSERT_MEDDLED(m);
    ASSERT_TRUE(image_is(p, b, img, n));
    ASSERT_TRUE(image_is(pc, bc, img, n));
    kve_policy_free(pc);
    kve_bank_free(bc);
    /* a load: the object being built (its slabs, then the blocks of grown
     * heads), known to the allocator as the first block it handed out */
    meddler ml;
    meddler_init(&ml, b != NULL);
    ml.capture = 1;
    ASSERT_OK(p ? kve_policy_load(img, n, &ml.t.a, &pl) : kve_bank_load(img, n, &ml.t.a, &bl));
    ASSERT_TRUE(ml.target[1] == (p ? (void *)pl : (void *)bl));
    ml.target[1] = NULL;
    ASSERT_MEDDLED(&ml);
    ASSERT_TRUE(image_is(pl, bl, img, n));
    kve_policy_free(pl);
    kve_bank_free(bl);
    talloc_check_empty(&ml.t);
    /* a free: its allocator releases the columns first, the handle last */
    m->target[0] = p ? (void *)p : (void *)b;
    if (p)
        kve_policy_free(p);
    else
        kve_bank_free(b);
    ASSERT_TRUE(m->target[0] == NULL);
    ASSERT_MEDDLED(m);
    talloc_check_empty(&m->t);
}

/* An allocator that steps, evicts, clones, saves, copies, resets or frees
 * its own object while the library is inside it: during a step that grows
 * the object, a prefill, a clone (the original and the half-built clone),
 * a load (the half-built object, known to the allocator as the first block
 * it handed out) and a free. Every such call is refused (KVE_EINVAL, named;
 * free and reset ignored), the outer call goes through, and the object is
 * as it would be without them (before: a load's or a free's object took
 * the calls, half built or half released: SIGSEGV). */
static void test_allocator_calls_into_its_object(void)
{
    const char *spec = "h2o:budget=8,recent_window=2";
    ASSERT_OK(kve_policy_new(spec, NULL, &other_policy));
    ASSERT_OK(kve_bank_new(spec, 2, NULL, &other_bank));
    meddler m;
    meddler_init(&m, 0);
    kve_policy_options po = kve_policy_default_options();
    po.allocator = &m.t.a;
    kve_policy *p = NULL, *ref = NULL;
    ASSERT_OK(kve_policy_new_ex(spec, NULL, &po, &p));
    ASSERT_OK(kve_policy_new(spec, NULL, &ref));
    float w[64];
    for (int32_t t = 0; t < 24; t++) { /* the last 12 steps without an evict: it grows */
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            w[i] = (float)(1 + (i * 5 + (size_t)t) % 7) / (float)(4 * n);
        m.target[0] = p;
        ASSERT_OK(kve_policy_step(p, t, n ? w : NULL, n));
        m.target[0] = NULL;
        ASSERT_OK(kve_policy_step(ref, t, n ? w : NULL, n));
        int32_t v[64];
        size_t nv = 0;
        if (t < 12) {
            ASSERT_OK(kve_policy_evict(p, 8, v, 64, &nv));
            ASSERT_OK(kve_policy_evict(ref, 8, v, 64, &nv));
        }
    }
    ASSERT_MEDDLED(&m); /* the growth */
    size_t n_img = 0;
    uint8_t *img = image_of(ref, NULL, &n_img);
    ASSERT_TRUE(img != NULL);
    ASSERT_TRUE(image_is(p, NULL, img, n_img));
    clone_load_free(&m, p, NULL, img, n_img);
    free(img);
    /* a copy into a policy that must grow for it: its allocator runs while
     * the source is read, and a step of the source there (which grows it
     * past the block being made for it) is refused too (before: the copy
     * then wrote past that block) */
    meddler md;
    meddler_init(&md, 0);
    po.allocator = &md.t.a;
    kve_policy *dst = NULL;
    ASSERT_OK(kve_policy_new_ex(spec, NULL, &po, &dst));
    kve_policy_reset(ref);
    for (int32_t t = 0; t < 18; t++) /* 18 kept, 18 slots: its next step grows it */
        ASSERT_OK(kve_policy_step(ref, t, NULL, 0));
    img = image_of(ref, NULL, &n_img);
    ASSERT_TRUE(img != NULL);
    md.target[0] = ref;
    ASSERT_OK(kve_policy_copy(dst, ref));
    md.target[0] = NULL;
    ASSERT_MEDDLED(&md);
    ASSERT_TRUE(image_is(ref, NULL, img, n_img));
    ASSERT_TRUE(image_is(dst, NULL, img, n_img));
    kve_policy_free(dst);
    talloc_check_empty(&md.t);
    free(img);
    kve_policy_free(ref);
    /* a bank: its prefill (scratch from its allocator), then the same */
    meddler mb;
    meddler_init(&mb, 1);
    kve_bank_options bo = kve_bank_default_options();
    bo.allocator = &mb.t.a;
    kve_bank *b = NULL, *bref = NULL;
    ASSERT_OK(kve_bank_new_ex(spec, 2, NULL, &bo, &b));
    ASSERT_OK(kve_bank_new(spec, 2, NULL, &bref));
    enum { N = 16 };
    const size_t r = kve_prefill_rows(N, NULL); /* (2, r, N): the last r causal rows */
    float rows[2 * N * N];
    for (size_t h = 0; h < 2; h++)
        for (size_t j = 0; j < r; j++) {
            size_t t = N - r + j;
            for (size_t i = 0; i < N; i++)
                rows[(h * r + j) * N + i] =
                    i <= t ? (float)(1 + (i * 3 + h) % 5) / (float)(3 * (t + 1)) : 0.0f;
        }
    mb.target[0] = b;
    ASSERT_OK(kve_bank_prefill(b, 0, 2, N, 6, rows, N, 1, KVE_REDUCE_MEAN, NULL));
    mb.target[0] = NULL;
    ASSERT_MEDDLED(&mb);
    ASSERT_OK(kve_bank_prefill(bref, 0, 2, N, 6, rows, N, 1, KVE_REDUCE_MEAN, NULL));
    img = image_of(NULL, bref, &n_img);
    ASSERT_TRUE(img != NULL);
    ASSERT_TRUE(image_is(NULL, b, img, n_img));
    clone_load_free(&mb, NULL, b, img, n_img);
    free(img);
    kve_bank_free(bref);
    kve_policy_free(other_policy);
    kve_bank_free(other_bank);
}

/* The --wrap counters saw every call above: none came from the library. */
static void test_nothing_bypasses(void)
{
#ifdef KVE_WRAP_MALLOC
    printf("C-library allocator calls from kvevict while a test allocator was given: %zu\n",
           bypass);
    ASSERT_EQ(bypass, 0);
    /* The counters do count: a call made without an allocator is seen. */
    kve_policy *p = NULL;
    WATCH(ASSERT_OK(kve_policy_new("h2o", NULL, &p)));
    WATCH(kve_policy_free(p));
    ASSERT_TRUE(bypass > 0);
#else
    printf("skip: linked without --wrap=malloc (not a GNU-compatible linker): the bypass check "
           "did not run\n");
#endif
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    if (tmpdir_make("kve-alloc") != 0)
        return 1;
    RUN(test_policy_new_every_type);
    RUN(test_default_allocator);
    RUN(test_growth_and_no_alloc_promises);
    RUN(test_bank_new_every_type);
    RUN(test_bank_growth_all_or_nothing);
    RUN(test_shared_bank_growth);
    RUN(test_prefill);
    RUN(test_trace_open_canonical);
    RUN(test_npy_write_and_open);
    RUN(test_trace_from_memory);
    RUN(test_eval);
    RUN(test_lifecycle);
    RUN(test_allocator_calls_into_its_object);
    RUN(test_nothing_bypasses);
    remove_dir();
    return CHECK_DONE();
}
