/* SPDX-License-Identifier: MIT */
/*
 * fuzz_state.c - kve_policy_load and kve_bank_load on corrupted, truncated
 * and random images, and whatever loads held to the reference model.
 *
 * Input: byte 0 is the mode.
 *   mode % 4 == 0 (raw): the rest of the input is an image, given to both
 *     loaders as it is.
 *   otherwise (made): the rest is a recipe: a policy type, budget, a
 *     parameter (recent_window / sinks), a history, a page size, the kind
 *     (a policy, or a bank of 1 to 4 heads, shared in groups of 2 when the
 *     policy can share, or built with same_positions), a key dimension, a seed and a number of steps. The
 *     object is built and driven by a random workload from the seed (steps
 *     with attention and keys, evictions, removals), saved, and then the
 *     image is edited by the remaining bytes, four at a time (op, offset,
 *     value): set, flip, truncate, extend, or write a special 4- or 8-byte
 *     value (NaN, infinities, -0.0, -1, INT32_MIN, huge counts, ...). With
 *     mode bit 2 the size field and the checksum are then rewritten to fit,
 *     so the edit reaches the checks behind them.
 * Every refusal is KVE_EINVAL (or KVE_ENOMEM) with a one-line message, and
 * *out untouched. Every image that loads is held to what it says:
 *   - saving the loaded object gives the input bytes back, exactly;
 *   - the reference model built from the image by an independent reader
 *     (tests/state_image.h: one model per head) and the loaded object then
 *     take the same 48 calls (steps with attention and keys, evictions to
 *     and below the budget, shared evictions, removals and rewinds) with the
 *     same statuses and victims (a same_positions bank's evictions against
 *     ref_evict_same), and after each call hold the same state:
 *     the object's image read back equals the models', score bits included.
 * Any violation abort()s. KVE_FUZZ_TRACE=1 prints what was built.
 */
#include "fuzz.h"
#include "reference.h"
#include "state_image.h"
#include "test_allocator.h"
#include "workload.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAXH = 4, MAXD = 7, CALLS = 48 };

#define CHECK(c) FUZZ_CHECK("fuzz_state", c)

static bool trace_on;

/* ---- the loaded object and its models ---- */

typedef struct world {
    kve_policy *p;          /* a policy's image, or */
    kve_bank *b;            /* a bank's */
    size_t heads, share, dim, budget, lo;
    bool same;              /* a same_positions bank (a version 3 image) */
    ref_policy *r[MAXH];    /* head h's model */
    kve_rng g;              /* the calls' weights and keys */
    int32_t pos;            /* the next position (int32 arithmetic kept in range) */
} world;

static kve_status w_step(world *w, int32_t pos, const float *rows, size_t ld, const float *keys)
{
    if (w->p)
        return kve_policy_step_keys(w->p, pos, rows, kve_policy_size(w->p), keys);
    return kve_bank_step_range(w->b, 0, w->heads, pos, rows, ld, 1, KVE_REDUCE_MEAN, keys,
                               w->dim);
}

static size_t w_size(const world *w, size_t h)
{
    return w->p ? kve_policy_size(w->p) : kve_bank_size(w->b, h);
}

static uint8_t *w_image(const world *w, size_t *n)
{
    kve_status st = w->p ? kve_policy_save(w->p, NULL, 0, n) : kve_bank_save(w->b, NULL, 0, n);
    CHECK(st == KVE_OK);
    uint8_t *img = malloc(*n);
    CHECK(img != NULL);
    size_t got = 0;
    st = w->p ? kve_policy_save(w->p, img, *n, &got) : kve_bank_save(w->b, img, *n, &got);
    CHECK(st == KVE_OK && got == *n);
    return img;
}

/* The object holds what the models hold, every field. */
static void check_same(const world *w)
{
    size_t n = 0;
    uint8_t *img = w_image(w, &n);
    img_hdr h;
    CHECK(img_header(img, n, &h) == 0 && h.n_heads == w->heads);
    for (size_t k = 0; k < w->heads; k++) {
        ref_policy *back = img_ref(img, &h, k);
        CHECK(back != NULL);
        CHECK(ref_same(back, w->r[k]) == 0);
        ref_free(back);
    }
    free(img);
}

/* One call on the object and on the models. */
static void call(world *w, uint8_t op)
{
    static float rows[MAXH * 4096], keys[MAXH * MAXD];
    static int32_t vic[MAXH * 4096], rv[MAXH * 4096];
    size_t counts[MAXH], rc[MAXH];
    size_t ld = 0;
    for (size_t h = 0; h < w->heads; h++)
        ld = w_size(w, h) > ld ? w_size(w, h) : ld;
    if (ld > 2048)
        op = 3; /* keep the sizes down: evict */
    switch (op % 6) {
    case 0:
    case 1:
    case 2: { /* a step, with attention (mostly) and keys (when the object has them) */
        bool with_attn = op % 3 != 2;
        static const float pool[4] = {0.125f, 0.25f, 0.0f, 0.5f};
        for (size_t h = 0; h < w->heads; h++)
            for (size_t i = 0; i < ld; i++)
                rows[h * ld + i] = random_weight(&w->g, pool, w_size(w, h) ? w_size(w, h) : 1);
        for (size_t j = 0; j < w->heads * w->dim; j++)
            keys[j] = (float)(kve_rng_uniform(&w->g) * 4.0 - 2.0);
        const float *k = w->dim ? keys : NULL;
        kve_status st = w_step(w, w->pos, with_attn ? rows : NULL, ld, k);
        CHECK(st == KVE_OK);
        for (size_t h = 0; h < w->heads; h++)
            CHECK(ref_step_keys(w->r[h], w->pos, with_attn ? rows + h * ld : NULL,
                                w->r[h]->n, k ? keys + h * w->dim : NULL) == 0);
        w->pos++;
        break;
    }
    case 3:
    case 4: { /* evict each head to the budget or below, or each group to one */
        size_t budget = op % 2 || w->budget == w->lo
                            ? w->budget
                            : w->lo + (size_t)kve_rng_below(&w->g, w->budget - w->lo);
        size_t ldv = ld ? ld : 1;
        if (w->share && op % 4 == 0) {
            CHECK(kve_bank_evict_shared(w->b, 0, w->heads, w->share * budget, vic, ldv,
                                        counts) == KVE_OK);
            for (size_t g = 0; g < w->heads / w->share; g++)
                CHECK(ref_evict_shared(w->r + g * w->share, w->share, w->share * budget,
                                       kve_bank_min_share(w->b), rv + g * w->share * ldv, ldv,
                                       rc + g * w->share) == 0);
        } else {
            kve_status st = w->p ? kve_policy_evict(w->p, budget, vic, ldv, counts)
                                 : kve_bank_evict(w->b, budget, vic, ldv, counts);
            CHECK(st == KVE_OK);
            if (w->same)
                CHECK(ref_evict_same(w->r, w->heads, budget, rv, ldv, rc) == 0);
            for (size_t h = 0; !w->same && h < w->heads; h++)
                CHECK(ref_evict(w->r[h], budget, rv + h * ldv, &rc[h]) == 0);
        }
        for (size_t h = 0; h < w->heads; h++) {
            CHECK(counts[h] == rc[h]);
            CHECK(memcmp(vic + h * ldv, rv + h * ldv, counts[h] * sizeof *vic) == 0);
        }
        break;
    }
    default: { /* remove a range, or rewind the newest positions */
        int32_t p0, p1;
        if (op & 8) {
            p0 = w->pos - 1 - (int32_t)kve_rng_below(&w->g, 4);
            p0 = p0 < 0 ? 0 : p0;
            p1 = KVE_POS_END;
            w->pos = p0;
        } else {
            p0 = (int32_t)kve_rng_below(&w->g, (uint64_t)w->pos + 1);
            p1 = p0 + 1 + (int32_t)kve_rng_below(&w->g, 6);
        }
        size_t gone = 0, ref_gone = 0;
        for (size_t h = 0; h < w->heads; h++)
            ref_gone += ref_remove(w->r[h], p0, p1);
        if (w->p) {
            CHECK(kve_policy_remove(w->p, p0, p1, &gone) == KVE_OK);
            CHECK(gone == ref_gone);
        } else {
            CHECK(kve_bank_remove(w->b, p0, p1) == KVE_OK);
        }
        break;
    }
    }
    check_same(w);
}

/* A loaded object: its image is the input, and it continues as its models. */
static void hold(kve_policy *p, kve_bank *b, const uint8_t *img, size_t n, fuzz_reader *in)
{
    world w = {0};
    w.p = p;
    w.b = b;
    size_t got = 0;
    uint8_t *again = w_image(&w, &got);
    CHECK(got == n && memcmp(again, img, n) == 0); /* load, then save: the same bytes */
    free(again);
    img_hdr h;
    CHECK(img_header(img, n, &h) == 0);
    w.heads = (size_t)h.n_heads;
    w.share = (size_t)h.share;
    w.dim = (size_t)h.key_dim;
    w.same = h.version == 3;
    CHECK(!w.same || (b && kve_bank_same_positions(b)));
    CHECK(w.heads >= 1);
    if (w.heads > MAXH || w.dim > MAXD)
        return; /* more than the calls' buffers hold: the bytes were checked */
    const char *spec = p ? kve_policy_spec(p) : kve_bank_spec(b);
    CHECK(strcmp(spec, h.spec) == 0);
    w.budget = p ? kve_policy_budget(p) : kve_bank_budget(b);
    w.lo = 1;
    CHECK(kve_spec_min_budget(spec, &w.lo) == KVE_OK);
    for (size_t k = 0; k < w.heads; k++) {
        w.r[k] = img_ref(img, &h, k);
        CHECK(w.r[k] != NULL);
        if (w.r[k]->last + 1 > w.pos)
            w.pos = w.r[k]->last + 1;
    }
    kve_rng_seed(&w.g, (uint64_t)n * 2654435761u);
    for (int k = 0; k < CALLS; k++) {
        uint8_t op = fuzz_take(in);
        if (w.pos < 0 || w.pos > INT32_MAX - 2 * CALLS)
            op = op % 6 < 3 ? 3 : op; /* near the largest position: no steps */
        call(&w, op);
    }
    for (size_t k = 0; k < w.heads; k++)
        ref_free(w.r[k]);
}

/* Both loaders on one image. */
static void load(const uint8_t *img, size_t n, fuzz_reader *in)
{
    int sentinel;
    kve_policy *p = (kve_policy *)&sentinel;
    kve_bank *b = (kve_bank *)&sentinel;
    /* what a load would allocate, asked first: the peak of a load that
     * succeeds, to the byte (a counting allocator), and an answer for every
     * image some load accepts */
    size_t need = 0;
    kve_status sz = kve_image_load_bytes(img, n, &need);
    CHECK(sz == KVE_OK || sz == KVE_EINVAL);
    talloc ta;
    talloc_init(&ta);
    kve_status sp = kve_policy_load(img, n, &ta.a, &p);
    if (sp == KVE_OK) {
        CHECK(sz == KVE_OK && ta.peak == need);
        kve_policy_free(p);
        CHECK(ta.blocks == 0 && ta.bytes == 0 && ta.bad == 0);
        p = (kve_policy *)&sentinel;
        talloc_init(&ta);
        sp = kve_policy_load(img, n, NULL, &p);
        CHECK(sp == KVE_OK);
    }
    if (sp != KVE_OK) {
        CHECK(sp == KVE_EINVAL || sp == KVE_ENOMEM);
        CHECK(p == (kve_policy *)&sentinel);
        CHECK(kve_last_error()[0] != '\0' && !strchr(kve_last_error(), '\n'));
    }
    kve_status sb = kve_bank_load(img, n, &ta.a, &b);
    if (sb == KVE_OK) {
        CHECK(sz == KVE_OK && ta.peak == need);
        kve_bank_free(b);
        CHECK(ta.blocks == 0 && ta.bytes == 0 && ta.bad == 0);
        b = (kve_bank *)&sentinel;
        sb = kve_bank_load(img, n, NULL, &b);
        CHECK(sb == KVE_OK);
    }
    if (sb != KVE_OK) {
        CHECK(sb == KVE_EINVAL || sb == KVE_ENOMEM);
        CHECK(b == (kve_bank *)&sentinel);
        CHECK(kve_last_error()[0] != '\0' && !strchr(kve_last_error(), '\n'));
    }
    CHECK(sp != KVE_OK || sb != KVE_OK); /* an image is one kind or the other */
    if (trace_on)
        fprintf(stderr, "load %zu bytes: policy %s, bank %s (%s)\n", n, kve_status_name(sp),
                kve_status_name(sb), kve_last_error());
    if (sp == KVE_OK) {
        hold(p, NULL, img, n, in);
        kve_policy_free(p);
    }
    if (sb == KVE_OK) {
        hold(NULL, b, img, n, in);
        kve_bank_free(b);
    }
}

/* ---- made images ---- */

static void set_key(char *spec, const char *key, const char *value)
{
    char out[KVE_SPEC_MAX];
    if (kve_spec_with(spec, key, value, out, sizeof out) == KVE_OK)
        memcpy(spec, out, sizeof out);
}

/* The image of an object built and driven from the recipe; NULL when the
 * recipe names none. */
static uint8_t *made(fuzz_reader *in, size_t *n)
{
    /* the policies tests/reference.h models: all but those that read queries
     * (expected_attention: its state's lifecycle is test_state's
     * test_methods_state) */
    size_t types[64], n_types = 0;
    for (size_t t = 0; t < kve_policy_type_count() && n_types < 64; t++)
        if (!(kve_policy_type_reads(t) & KVE_READS_QUERIES))
            types[n_types++] = t;
    const char *name = kve_policy_type_name(types[fuzz_take(in) % n_types]);
    size_t budget = 1 + fuzz_take(in) % 40;
    uint8_t param = fuzz_take(in), history = fuzz_take(in), block = fuzz_take(in), kind = fuzz_take(in);
    size_t dim = 1 + fuzz_take(in) % MAXD;
    uint64_t seed = fuzz_take(in);
    size_t steps = fuzz_take(in);
    char spec[KVE_SPEC_MAX], value[32];
    snprintf(spec, sizeof spec, "%s", name);
    set_key(spec, "recent_window", "0");
    set_key(spec, "sinks", "0");
    snprintf(value, sizeof value, "%zu", budget);
    set_key(spec, "budget", value);
    snprintf(value, sizeof value, "%zu", (size_t)param % budget);
    set_key(spec, "recent_window", value);
    set_key(spec, "sinks", value);
    snprintf(value, sizeof value, "%u", (unsigned)history % 65u);
    set_key(spec, "history", value);
    static const char *const blocks[] = {"1", "2", "3"};
    set_key(spec, "block", blocks[block % 3]);
    kve_rng r;
    kve_rng_seed(&r, seed);
    size_t heads = kind % 2 ? 1 + (size_t)(kind / 2) % MAXH : 0; /* 0: a policy */
    size_t share = heads >= 2 && heads % 2 == 0 && (kind & 8) ? 2 : 0;
    int same = heads >= 2 && !share && (kind & 16);
    kve_policy *p = NULL;
    kve_bank *b = NULL;
    kve_policy_options po = kve_policy_default_options();
    po.key_dim = dim;
    kve_bank_options bo = kve_bank_default_options();
    bo.key_dim = dim;
    bo.share = share;
    bo.same_positions = same;
    if (!heads) {
        CHECK(kve_policy_new_ex(spec, &r, &po, &p) == KVE_OK);
    } else if (kve_bank_new_ex(spec, heads, &r, &bo, &b) != KVE_OK) {
        bo.share = share = 0; /* a policy that cannot share */
        CHECK(kve_bank_new_ex(spec, heads, &r, &bo, &b) == KVE_OK);
    }
    size_t H = heads ? heads : 1, lo = 1;
    CHECK(kve_spec_min_budget(spec, &lo) == KVE_OK);
    static float rows[MAXH * 1024], keys[MAXH * MAXD];
    static int32_t vic[MAXH * 1024];
    static const float pool[4] = {0.25f, 0.5f, 0.0f, 0.125f};
    int32_t pos = 0;
    for (size_t s = 0; s < steps; s++) {
        size_t ld = 0;
        for (size_t h = 0; h < H; h++) {
            size_t sz = p ? kve_policy_size(p) : kve_bank_size(b, h);
            ld = sz > ld ? sz : ld;
        }
        uint64_t what = kve_rng_below(&r, 10);
        if (what < 6 && ld < 1000) {
            for (size_t i = 0; i < H * ld; i++)
                rows[i] = random_weight(&r, pool, ld ? ld : 1);
            for (size_t j = 0; j < H * dim; j++)
                keys[j] = (float)(kve_rng_uniform(&r) - 0.5);
            const float *attn = what ? rows : NULL;
            kve_status st = p ? kve_policy_step_keys(p, pos, attn, kve_policy_size(p), keys)
                              : kve_bank_step_range(b, 0, H, pos, attn, ld, 1, KVE_REDUCE_MEAN,
                                                    keys, dim);
            CHECK(st == KVE_OK);
            pos += 1 + (int32_t)(what == 5);
        } else if (what < 9) {
            size_t bud = what == 8 ? lo : budget;
            kve_status st = p ? kve_policy_evict(p, bud, vic, MAXH * 1024, NULL)
                            : share && what == 7
                                ? kve_bank_evict_shared(b, 0, H, share * bud, vic, 1024, NULL)
                                : kve_bank_evict(b, bud, vic, 1024, NULL);
            CHECK(st == KVE_OK);
        } else {
            int32_t p0 = (int32_t)kve_rng_below(&r, (uint64_t)pos + 1);
            CHECK((p ? kve_policy_remove(p, p0, p0 + 3, NULL) : kve_bank_remove(b, p0, p0 + 3)) ==
                  KVE_OK);
        }
    }
    if (trace_on)
        fprintf(stderr, "made %s of \"%s\", %zu heads, share %zu, same %d, key_dim %zu, %zu "
                "steps\n", p ? "a policy" : "a bank", spec, H, share, same, dim, steps);
    kve_status st = p ? kve_policy_save(p, NULL, 0, n) : kve_bank_save(b, NULL, 0, n);
    CHECK(st == KVE_OK);
    uint8_t *img = malloc(*n + 64);
    CHECK(img != NULL);
    st = p ? kve_policy_save(p, img, *n, n) : kve_bank_save(b, img, *n, n);
    CHECK(st == KVE_OK);
    kve_policy_free(p);
    kve_bank_free(b);
    return img;
}

/* The special values an edit writes. */
static uint64_t special(uint8_t v, int width)
{
    static const uint64_t d[] = {0x7ff8000000000000u, 0x7ff0000000000000u, 0xfff0000000000000u,
                                 0x8000000000000000u, 0xbff0000000000000u, 0x7fefffffffffffffu,
                                 0x3ff0000000000000u, 0x0000000000000001u, UINT64_MAX,
                                 0x100000000u,        0x80000000u,         0};
    static const uint64_t f[] = {0, 1, 2, 0xffffffffu, 0x7fffffffu, 0x80000000u, 0x7fc00000u,
                                 0x3f800000u, 0xbf800000u, 64, 65};
    if (width == 8)
        return v < 128 ? d[v % (sizeof d / sizeof d[0])] : v - 128u;
    return v < 128 ? f[v % (sizeof f / sizeof f[0])] : v - 128u;
}

static void edit(uint8_t **img, size_t *n, fuzz_reader *in)
{
    uint8_t op = fuzz_take(in), lo = fuzz_take(in), hi = fuzz_take(in), v = fuzz_take(in);
    size_t at = *n ? ((size_t)hi << 8 | lo) % *n : 0;
    switch (op % 6) {
    case 0: if (*n) (*img)[at] = v; break;
    case 1: if (*n) (*img)[at] ^= (uint8_t)(1u << (v % 8)); break;
    case 2: *n = at; break;
    case 3: { /* extend by v % 16 zero bytes, the checksum moved to the end */
        size_t more = v % 16u;
        uint8_t *g = realloc(*img, *n + more + 1);
        CHECK(g != NULL);
        *img = g;
        memset(g + *n, 0, more);
        if (*n >= 8)
            memmove(g + *n + more - 8, g + *n - 8, 8);
        *n += more;
        break;
    }
    case 4: if (at + 8 <= *n) img_put(*img + at, special(v, 8), 8); break;
    default: if (at + 4 <= *n) img_put(*img + at, special(v, 4), 4); break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    if (!init) {
        init = 1;
        trace_on = getenv("KVE_FUZZ_TRACE") != NULL;
    }
    if (size == 0)
        return 0;
    uint8_t mode = data[0];
    fuzz_reader in = {data + 1, size - 1, 0};
    if (mode % 4 == 0) {
        fuzz_reader none = {NULL, 0, 0};
        load(data + 1, size - 1, &none);
        return 0;
    }
    size_t n = 0;
    uint8_t *img = made(&in, &n);
    for (int k = 0, edits = (mode >> 3) % 5; k < edits; k++)
        edit(&img, &n, &in);
    if (mode & 4)
        img_reseal(img, n);
    load(img, n, &in);
    free(img);
    return 0;
}
