/* SPDX-License-Identifier: MIT */
/*
 * fuzz_api.c - decodes the input into a program of policy calls and holds the
 * library to its contract after every call.
 *
 * Program: a header (policy type, budget, recent_window / sinks / history /
 * decay, rng seed, an allocation-failure point for construction, a page
 * size and page score where the budget leaves room for pages), then one
 * op per byte: step with attention, step with NULL attention, evict (to the
 * policy's budget or to an arbitrary, possibly refused one, with a possibly
 * too small or NULL victims buffer), a bad step (negative or repeated
 * position, wrong n, NaN / infinite / negative weight, a NaN key, no key for
 * a policy that reads keys), a position gap, a step under a failing
 * allocator, and calls on a NULL policy. Every policy is built with keys of
 * 1 + seed % 7 floats and every step carries one, made from the step's
 * bytes and position (so equal keys, hence equal scores, recur).
 *
 * Three models run side by side: A (receives every call), B (a twin that
 * receives only the calls A accepted) and R (tests/reference.h, the naive
 * model). After every call:
 *   - kept positions strictly ascending; A, B and R hold the same kept set;
 *   - a refusal returns the documented status, leaves a message, and changes
 *     nothing (A equals its snapshot, and later behaviour still equals B's);
 *   - an accepted evict leaves size <= budget (full: unchanged), reports
 *     exactly the removed positions (with pages, up to block - 1 more than
 *     the excess), ascending, each previously kept, and the same victims as
 *     B and R;
 *   - R refuses exactly what A refuses for the reasons R models.
 * Any violation abort()s with the op number; KVE_FUZZ_TRACE=1 in the
 * environment prints the decoded program to stderr for replay.
 */
#include "fuzz.h"
#include "internal.h"
#include "reference.h"
#include "test_allocator.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool trace_on;
static size_t op_no;
static talloc ta; /* the allocator of policy a and of the failing constructions */
static char spec[KVE_SPEC_MAX];

#define CHECK(c)                                                                       \
    do {                                                                               \
        if (!(c)) {                                                                    \
            fprintf(stderr, "fuzz_api: op %zu on %s: CHECK(%s) failed (last error: %s)\n", \
                    op_no, spec, #c, kve_last_error());                                \
            abort();                                                                   \
        }                                                                              \
    } while (0)

#define TRACE(...)                                \
    do {                                          \
        if (trace_on)                             \
            fprintf(stderr, __VA_ARGS__);         \
    } while (0)

/* A weight from one byte: ordinary values, zeroes, tiny, huge and FLT_MAX. */
static float weight(uint8_t b)
{
    if (b < 160)
        return (float)b / 64.0f;
    if (b < 200)
        return 0.0f;
    if (b < 230)
        return ldexpf(1.0f, -(int)(b - 200) * 4); /* down to subnormal */
    if (b < 250)
        return (float)(b - 229) * 1e30f;
    return b == 250 ? FLT_MAX : b == 251 ? -0.0f : 1.0f / 3.0f;
}

typedef struct snapshot {
    size_t size;
    int32_t *pos;
} snapshot;

static void snap(const kve_policy *p, snapshot *s)
{
    s->size = kve_policy_size(p);
    s->pos = malloc((s->size ? s->size : 1) * sizeof *s->pos);
    if (!s->pos)
        abort();
    if (s->size)
        memcpy(s->pos, kve_policy_positions(p), s->size * sizeof *s->pos);
}

static bool same_as(const kve_policy *p, const snapshot *s)
{
    return kve_policy_size(p) == s->size &&
           (s->size == 0 || memcmp(kve_policy_positions(p), s->pos, s->size * sizeof *s->pos) == 0);
}

static bool same_policies(const kve_policy *a, const kve_policy *b)
{
    size_t n = kve_policy_size(a);
    return n == kve_policy_size(b) &&
           (n == 0 || memcmp(kve_policy_positions(a), kve_policy_positions(b), n * sizeof(int32_t)) == 0);
}

static bool same_as_ref(const kve_policy *a, const ref_policy *r)
{
    size_t n = kve_policy_size(a);
    if (n != r->n)
        return false;
    const int32_t *pos = kve_policy_positions(a);
    for (size_t i = 0; i < n; i++)
        if (pos[i] != r->slot[i].pos)
            return false;
    return true;
}

static void check_ascending(const kve_policy *p)
{
    size_t n = kve_policy_size(p);
    const int32_t *pos = kve_policy_positions(p);
    for (size_t i = 1; i < n; i++)
        CHECK(pos[i - 1] < pos[i]);
}

static bool in_snapshot(const snapshot *s, int32_t v)
{
    for (size_t i = 0; i < s->size; i++)
        if (s->pos[i] == v)
            return true;
    return false;
}

/* Sets `key` of spec to `value` when the policy has that key. */
static void set_key(const char *key, const char *value)
{
    char out[KVE_SPEC_MAX];
    if (kve_spec_with(spec, key, value, out, sizeof out) == KVE_OK)
        memcpy(spec, out, sizeof out);
}

enum { MAX_DIM = 7 };

typedef struct world {
    kve_policy *a, *b;
    ref_policy *r;
    size_t budget;
    size_t dim;            /* floats of a key */
    float key[MAX_DIM];    /* the key of the next step */
    const float *keyp;     /* what the next step passes: key, or NULL */
    int32_t next_pos;
    float *attn;     /* (attn_cap) */
    size_t attn_cap;
    int32_t *vic[3]; /* (vic_cap) A's, B's and R's victims */
    size_t vic_cap;
} world;

static void reserve(world *w)
{
    size_t need = kve_policy_size(w->a) + 4;
    if (need > w->attn_cap) {
        float *grown = realloc(w->attn, need * sizeof *grown);
        if (!grown)
            abort();
        w->attn = grown;
        w->attn_cap = need;
    }
    if (need > w->vic_cap) {
        for (int k = 0; k < 3; k++) {
            int32_t *grown = realloc(w->vic[k], need * sizeof *grown);
            if (!grown)
                abort();
            w->vic[k] = grown;
        }
        w->vic_cap = need;
    }
}

/* A step A may refuse; B and R see it only when A accepted it. `modelled`:
 * R models the reason A may refuse it, so R must agree on the verdict. */
/* The key of the next step, from a byte of the program and the position. */
static void make_key(world *w, uint8_t b)
{
    for (size_t j = 0; j < w->dim; j++) {
        uint8_t v = (uint8_t)(b + (uint32_t)w->next_pos % 3u * 17u + j * 29u);
        w->key[j] = v < 200 ? (float)((int)(v % 9) - 4) * 0.5f : weight(v);
    }
}

static void do_step(world *w, int32_t pos, const float *attn, size_t n, bool modelled)
{
    snapshot s;
    snap(w->a, &s);
    kve_status st = kve_policy_step_keys(w->a, pos, attn, n, w->keyp);
    TRACE("  step pos=%ld attn=%s n=%zu key=%s -> %s\n", (long)pos, attn ? "vec" : "NULL", n,
          w->keyp ? "vec" : "NULL", kve_status_name(st));
    if (st == KVE_OK) {
        CHECK(kve_policy_size(w->a) == s.size + 1);
        CHECK(kve_policy_positions(w->a)[s.size] == pos);
        CHECK(kve_policy_step_keys(w->b, pos, attn, n, w->keyp) == KVE_OK);
        CHECK(ref_step_keys(w->r, pos, attn, n, w->keyp) == 0);
    } else {
        CHECK(st == KVE_EINVAL || st == KVE_ENOMEM);
        CHECK(kve_last_error()[0] != '\0');
        CHECK(same_as(w->a, &s));
        if (modelled && st == KVE_EINVAL) {
            ref_policy probe = *w->r; /* ref refuses before touching anything */
            CHECK(ref_step_keys(&probe, pos, attn, n, w->keyp) == -1);
        }
    }
    free(s.pos);
    check_ascending(w->a);
    CHECK(same_policies(w->a, w->b));
    CHECK(same_as_ref(w->a, w->r));
}

static void do_evict(world *w, size_t budget, bool null_victims, size_t cap)
{
    reserve(w);
    snapshot s;
    snap(w->a, &s);
    size_t nv = (size_t)-1;
    int32_t *victims = null_victims ? NULL : w->vic[0];
    kve_status st = kve_policy_evict(w->a, budget, victims, cap, &nv);
    TRACE("  evict budget=%zu victims=%s cap=%zu -> %s\n", budget, victims ? "buf" : "NULL",
          cap, kve_status_name(st));
    bool full = strcmp(kve_policy_name(w->a), "full") == 0;
    size_t need = !full && s.size > budget ? s.size - budget : 0;
    /* pages (block b > 1) remove whole pages: up to b - 1 more than needed */
    size_t b = w->r->block, extra = b > 1 ? b - 1 : 0;
    size_t most = need && need + extra < s.size ? need + extra : need ? s.size : 0;
    if (st == KVE_OK) {
        CHECK(nv >= need && nv <= most);
        CHECK(kve_policy_size(w->a) == s.size - nv);
        CHECK(full ? kve_policy_size(w->a) == s.size : kve_policy_size(w->a) <= budget);
        for (size_t i = 0; i < nv; i++) {
            CHECK(in_snapshot(&s, victims[i]));
            CHECK(i == 0 || victims[i - 1] < victims[i]);
        }
        /* kept after + victims == kept before, as sets (all sorted, disjoint). */
        const int32_t *kept = kve_policy_positions(w->a);
        size_t ik = 0, iv = 0;
        for (size_t i = 0; i < s.size; i++) {
            if (ik < kve_policy_size(w->a) && kept[ik] == s.pos[i])
                ik++;
            else if (iv < nv && victims[iv] == s.pos[i])
                iv++;
            else
                CHECK(0 && "a kept position vanished without being reported");
        }
        size_t nb = 0, nr = 0;
        CHECK(kve_policy_evict(w->b, budget, w->vic[1], w->vic_cap, &nb) == KVE_OK);
        CHECK(ref_evict(w->r, budget, w->vic[2], &nr) == 0);
        CHECK(nb == nv && nr == nv);
        CHECK(nv == 0 || memcmp(victims, w->vic[1], nv * sizeof *victims) == 0);
        CHECK(nv == 0 || memcmp(victims, w->vic[2], nv * sizeof *victims) == 0);
    } else {
        CHECK(kve_last_error()[0] != '\0');
        CHECK(same_as(w->a, &s));
        CHECK(nv == (size_t)-1);
        ref_policy probe = *w->r;
        bool sliding = probe.kind == REF_WINDOW || probe.kind == REF_STREAMING;
        size_t reserve = b < 2      ? 0
                         : sliding ? (probe.sinks ? probe.sinks + b - 1 : 0) + b - 1
                                   : (probe.recent_window > b - 1 ? probe.recent_window : b - 1) +
                                         b - 1;
        bool ref_refuses = budget == 0 || (probe.recent_window && budget <= probe.recent_window) ||
                           (probe.sinks && budget <= probe.sinks) || budget < reserve;
        if (st == KVE_ERANGE) {
            CHECK(!ref_refuses && !(null_victims && cap > 0) && cap < most);
        } else {
            CHECK(st == KVE_EINVAL);
            CHECK(ref_refuses || (null_victims && cap > 0));
        }
    }
    free(s.pos);
    check_ascending(w->a);
    CHECK(same_policies(w->a, w->b));
    CHECK(same_as_ref(w->a, w->r));
}

static void fill_attn(world *w, fuzz_reader *in, size_t n)
{
    reserve(w);
    uint8_t pattern = fuzz_take(in);
    for (size_t i = 0; i < n; i++)
        w->attn[i] = weight((uint8_t)(pattern + (i * 37u) % 11u * (pattern & 7u)));
    if (n)
        w->attn[fuzz_take(in) % n] = weight(fuzz_take(in));
}

/* After a step of A from size n: the next position, saturating at INT32_MAX (a
 * step there again is a refusal R models). */
static void advance(world *w, size_t n)
{
    if (kve_policy_size(w->a) > n && w->next_pos < INT32_MAX)
        w->next_pos++;
}

static void run_program(fuzz_reader *in)
{
    size_t n_types = kve_policy_type_count();
    const char *name = kve_policy_type_name(fuzz_take(in) % n_types);
    size_t budget = 1 + fuzz_take(in) % 48;
    uint8_t param = fuzz_take(in), history = fuzz_take(in), decay = fuzz_take(in);
    uint64_t seed = fuzz_take(in);
    uint8_t fail_at = fuzz_take(in), block = fuzz_take(in);

    char value[32];
    snprintf(spec, sizeof spec, "%s", name);
    set_key("recent_window", "0"); /* so that any budget is accepted */
    set_key("sinks", "0");
    snprintf(value, sizeof value, "%zu", budget);
    set_key("budget", value);
    snprintf(value, sizeof value, "%zu", (size_t)param % budget);
    set_key("recent_window", value);
    set_key("sinks", value);
    snprintf(value, sizeof value, "%u", (unsigned)history % 65u);
    set_key("history", value);
    static const char *const decays[] = {"1", "0.5", "0.99", "1e-3", "0.9999999", "1e-300"};
    set_key("decay", decays[decay % 6]);
    static const char *const blocks[] = {"1", "2", "3", "8"};
    set_key("block", blocks[block % 4]); /* when the budget leaves room for pages */
    set_key("block_mean", block & 4 ? "1" : "0");
    TRACE("program on %s, seed %llu\n", spec, (unsigned long long)seed);

    kve_rng ra, rb, rr;
    kve_rng_seed(&ra, seed);
    rb = rr = ra;

    /* Construction under a failing allocator: ENOMEM, *out untouched, rng untouched. */
    talloc_init(&ta);
    if (fail_at < 4) {
        kve_policy *sentinel = (kve_policy *)&ra, *p = sentinel;
        kve_rng before = ra;
        kve_policy_options o = kve_policy_default_options();
        o.allocator = &ta.a;
        o.key_dim = 1 + seed % MAX_DIM;
        talloc_fail_after(&ta, fail_at);
        kve_status st = kve_policy_new_ex(spec, &ra, &o, &p);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK) {
            kve_policy_free(p);
            ra = before;
        } else {
            CHECK(st == KVE_ENOMEM);
            CHECK(p == sentinel);
            CHECK(memcmp(&before, &ra, sizeof ra) == 0);
        }
        CHECK(ta.blocks == 0 && ta.bytes == 0 && ta.bad == 0);
    }

    world w = {0};
    w.dim = 1 + seed % MAX_DIM;
    w.keyp = w.key;
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = w.dim;
    o.allocator = &ta.a;
    CHECK(kve_policy_new_ex(spec, &ra, &o, &w.a) == KVE_OK);
    o.allocator = NULL;
    CHECK(kve_policy_new_ex(spec, &rb, &o, &w.b) == KVE_OK);
    CHECK(kve_policy_key_dim(w.a) == w.dim);
    CHECK((w.r = ref_new_keys(kve_policy_spec(w.a), &rr, w.dim)) != NULL);
    CHECK(strcmp(kve_policy_spec(w.a), spec) == 0);
    w.budget = kve_policy_budget(w.a);
    CHECK(w.budget == budget);

    for (op_no = 0; in->i < in->n && op_no < 4096; op_no++) {
        uint8_t op = fuzz_take(in);
        size_t n = kve_policy_size(w.a);
        switch (op % 10) {
        case 0:
        case 1: /* informative step */
            fill_attn(&w, in, n);
            make_key(&w, op);
            do_step(&w, w.next_pos, w.attn, n, true);
            advance(&w, n);
            break;
        case 2: /* no information; n is ignored */
            make_key(&w, op);
            do_step(&w, w.next_pos, NULL, fuzz_take(in), true);
            advance(&w, n);
            break;
        case 3:
        case 4: { /* evict to the policy's budget with room enough */
            do_evict(&w, w.budget, false, n + 1);
            break;
        }
        case 5: { /* evict to any budget, any cap, maybe a NULL buffer */
            uint8_t b = fuzz_take(in), c = fuzz_take(in);
            size_t cap = c < 128 ? n + 1 : (size_t)c % (n + 2);
            do_evict(&w, (size_t)b % (w.budget + 3), (c & 3) == 3, cap);
            break;
        }
        case 6: { /* a step that must be refused */
            fill_attn(&w, in, n + 2);
            uint8_t how = fuzz_take(in);
            int32_t last = w.r->last;
            make_key(&w, how);
            switch (how % 9) {
            case 0: do_step(&w, -1 - (int32_t)(how >> 3), w.attn, n, true); break;
            case 1: do_step(&w, last >= 0 ? last : -1, w.attn, n, true); break;
            case 2: do_step(&w, w.next_pos, w.attn, n + 1 + (how >> 7), true); break;
            case 3:
                if (n) {
                    w.attn[how % n] = nanf("");
                    do_step(&w, w.next_pos, w.attn, n, true);
                }
                break;
            case 4:
                if (n) {
                    w.attn[how % n] = (how & 8) ? INFINITY : -INFINITY;
                    do_step(&w, w.next_pos, w.attn, n, true);
                }
                break;
            case 5:
                if (n) {
                    w.attn[how % n] = -ldexpf(1.0f, -(int)(how >> 3));
                    do_step(&w, w.next_pos, w.attn, n, true);
                }
                break;
            case 7: /* a NaN key */
                w.key[how % w.dim] = nanf("");
                do_step(&w, w.next_pos, NULL, 0, true);
                break;
            case 8: /* no key: refused by a policy that reads keys */
                w.keyp = NULL;
                do_step(&w, w.next_pos, NULL, 0, true);
                w.keyp = w.key;
                if ((kve_policy_reads(w.a) & KVE_READS_KEYS) == 0)
                    advance(&w, n);
                break;
            default: /* the NULL policy */
                CHECK(kve_policy_step(NULL, w.next_pos, NULL, 0) == KVE_EINVAL);
                CHECK(kve_policy_evict(NULL, 1, NULL, 0, NULL) == KVE_EINVAL);
                CHECK(kve_policy_size(NULL) == 0 && kve_policy_positions(NULL) == NULL);
                CHECK(kve_policy_state_bytes(NULL) == 0 && kve_policy_spec(NULL) == NULL);
                break;
            }
            break;
        }
        case 7: { /* a gap in positions, sometimes up to the int32 limit */
            uint8_t g = fuzz_take(in);
            if (g == 255)
                w.next_pos = INT32_MAX - 2 > w.next_pos ? INT32_MAX - 2 : w.next_pos;
            else if (w.next_pos < INT32_MAX - 4096)
                w.next_pos += g;
            break;
        }
        case 8: { /* a step under a failing allocator: accepted or ENOMEM, never half-done */
            fill_attn(&w, in, n);
            bool null_attn = fuzz_take(in) & 1;
            make_key(&w, op);
            talloc_fail_after(&ta, 0);
            do_step(&w, w.next_pos, null_attn ? NULL : w.attn, n, false);
            talloc_fail_after(&ta, SIZE_MAX);
            advance(&w, n);
            break;
        }
        default: /* steps past the last position the type can hold are refused */
            if (w.next_pos == INT32_MAX) {
                make_key(&w, op);
                do_step(&w, INT32_MAX, NULL, 0, true);
                if (kve_policy_size(w.a) > n)
                    CHECK(kve_policy_step(w.a, INT32_MAX, NULL, 0) == KVE_EINVAL);
            }
            break;
        }
        CHECK(kve_policy_state_bytes(w.a) > 0);
    }
    /* Whatever happened, the canonical spec still builds the same policy. */
    kve_policy *again = NULL;
    CHECK(kve_policy_new_ex(kve_policy_spec(w.a), &rr, &o, &again) == KVE_OK);
    CHECK(strcmp(kve_policy_spec(again), kve_policy_spec(w.a)) == 0);
    kve_policy_free(again);

    kve_policy_free(w.a);
    kve_policy_free(w.b);
    CHECK(ta.blocks == 0 && ta.bytes == 0 && ta.bad == 0); /* every block back, sized */
    ref_free(w.r);
    free(w.attn);
    for (int k = 0; k < 3; k++)
        free(w.vic[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    if (!init) {
        init = 1;
        trace_on = getenv("KVE_FUZZ_TRACE") != NULL;
    }
    fuzz_reader in = {data, size, 0};
    op_no = 0;
    run_program(&in);
    return 0;
}
