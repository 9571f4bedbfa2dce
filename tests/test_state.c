/* SPDX-License-Identifier: MIT */
/*
 * test_state.c - the lifecycle of policies and banks (kvevict.h,
 * "Lifecycle"): clone, copy, remove, reset, save and load.
 *
 *  - forks: a bank in a random state, its clone, a copy into a bank that
 *    held another state, and its image loaded back continue in lockstep on
 *    a random workload (steps with and without attention, keys, evictions to
 *    and below the budget, shared evictions, removals and rewinds): the same
 *    statuses, victims and counts, and byte-identical images (every score's
 *    bits) after every call; for every policy of the differential
 *    workload, pages, shared groups, grouped-query banks, banks forked
 *    right after a prefill, and every instruction set (an image
 *    saved under one path and loaded under another continues as the scalar
 *    path alone does);
 *  - remove against the reference model (tests/reference.h): kept sets,
 *    victims and state after removals and rewinds, through policies that
 *    are cloned, copied and reloaded along the way; a rewind steps the
 *    position again; removal is not an undo, a copy from a checkpoint is;
 *  - reset: a reset object replays as a new one, allocating nothing;
 *  - memory: copy and remove allocate nothing where the header says so
 *    (every policy, as a policy, a bank and a shared bank, under a counting
 *    allocator that fails any call), a clone allocates through its
 *    original's allocator;
 *  - refusals: each leaves every argument as it was (the images of the
 *    objects, byte for byte, and the caller's buffers);
 *  - the image: the documented layout read by an independent reader
 *    (state_image.h), a committed image that must not change, the byte-wise
 *    and whole-column paths, every field's refusal and its message;
 *  - sizes: the image of the committed model's bank and of 32 x 8 heads.
 * Deterministic per seed (printed; argv[1] replays).
 */
#include "check.h"
#include "kernels.h" /* kve__isa_force */
#include "lm.h"
#include "policy_impl.h" /* kve__image_force_bytewise */
#include "state_image.h"
#include "test_allocator.h"
#include "workload.h"

#include <float.h>

enum { MAXH = 6, MAXN = 1400, MAXD = 32, FLEET = 4 };

/* Specs with pages, besides the workload's. */
static const char *const page_specs[] = {
    "h2o:budget=16,recent_window=2,block=4",
    "tova:budget=12,recent_window=1,block=3,block_mean=1",
    "scissorhands:budget=24,recent_window=4,history=8,block=2",
    "h2o_mean:budget=14,recent_window=2,block=2",
    "h2o_decay:budget=10,recent_window=0,decay=0.5,block=3",
    "window:budget=9,block=4",
    "streaming:budget=20,sinks=2,block=4",
};

/* Specs a shared group accepts (scored, no pages). */
static const char *const shared_specs[] = {
    "h2o:budget=8,recent_window=2",
    "tova:budget=10,recent_window=1",
    "scissorhands:budget=12,recent_window=1,history=7",
    "scissorhands:budget=9,recent_window=0,history=0",
    "h2o_decay:budget=8,recent_window=2,decay=0.5",
    "h2o_mean:budget=8,recent_window=1",
    "knorm:budget=9,recent_window=0",
    "keydiff:budget=8,recent_window=1",
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static float rows[2 * MAXH * MAXN], keys[MAXH * (MAXD + 2)];
/* The model facts of the methods' cases (test_methods_state): values of
 * g_vdim floats and g_qg queries a KV head (of the key's dimension) with a
 * rotary embedding of g_rot dimensions; 0: none. new_bank builds with them,
 * and every step then carries them (kve_bank_step_data). */
static size_t g_vdim, g_qg;
static float queries[MAXH * 3 * (MAXD + 2)], values[MAXH * (MAXD + 2)];
static int32_t victims[FLEET][MAXH * MAXN];
static size_t counts[FLEET][MAXH];

/* ---- images ---- */

/* The image of policy p or (p NULL) bank b, malloc'ed; its size in *n. */
static uint8_t *image_of(const kve_policy *p, const kve_bank *b, size_t *n)
{
    if ((p ? kve_policy_save(p, NULL, 0, n) : kve_bank_save(b, NULL, 0, n)) != KVE_OK)
        return NULL;
    uint8_t *img = malloc(*n);
    size_t got = 0;
    if (img && ((p ? kve_policy_save(p, img, *n, &got) : kve_bank_save(b, img, *n, &got)) !=
                    KVE_OK ||
                got != *n)) {
        free(img);
        return NULL;
    }
    return img;
}

static uint8_t *bank_image(const kve_bank *b, size_t *n)
{
    return image_of(NULL, b, n);
}

static uint8_t *policy_image(const kve_policy *p, size_t *n)
{
    return image_of(p, NULL, n);
}

/* Whether a and b have the same image. */
static int same_image(const kve_bank *a, const kve_bank *b)
{
    size_t na = 0, nb = 0;
    uint8_t *ia = bank_image(a, &na), *ib = bank_image(b, &nb);
    int same = ia && ib && na == nb && memcmp(ia, ib, na) == 0;
    free(ia);
    free(ib);
    return same;
}

/* A new bank from a's image (the allocator NULL or given). */
static kve_bank *reload(const kve_bank *a, const kve_allocator *alloc)
{
    size_t n = 0;
    uint8_t *img = bank_image(a, &n);
    kve_bank *b = NULL;
    if (img && kve_bank_load(img, n, alloc, &b) != KVE_OK)
        fprintf(stderr, "reload: %s\n", kve_last_error());
    free(img);
    return b;
}

/* ---- a fleet: banks that receive the same calls ---- */

typedef struct fleet {
    kve_bank *b[FLEET];
    size_t n;       /* banks in the fleet */
    size_t heads, dim, share, budget, lo; /* lo: the smallest budget evict accepts */
    size_t group;   /* query heads a KV head (grouped-query attention); 1 */
    int32_t pos;    /* the next position */
    kve_rng g;      /* the workload */
    float pool[4];  /* repeated weights: ties */
    float key_pool[4 * MAXD];
} fleet;

static kve_bank *new_bank(const char *spec, size_t heads, size_t dim, size_t share,
                          uint64_t seed, const kve_allocator *alloc)
{
    kve_rng r;
    kve_rng_seed(&r, seed);
    kve_bank_options o = kve_bank_default_options();
    o.key_dim = dim;
    o.share = share;
    o.allocator = alloc;
    o.value_dim = g_vdim;
    if (g_qg) {
        o.query_group = g_qg;
        o.rope.rotary_dim = dim - dim % 2;
        o.rope.pairs = dim % 4 ? KVE_ROPE_ADJACENT : KVE_ROPE_HALF;
    }
    kve_bank *b = NULL;
    if (kve_bank_new_ex(spec, heads, &r, &o, &b) != KVE_OK)
        fprintf(stderr, "%s: %s\n", spec, kve_last_error());
    return b;
}

/* A step of heads [0, heads) at pos with rows (NULL: none), keys of ldk
 * floats a head (dim 0: none), and with the methods' facts their queries,
 * values (of g the workload) and now and then KVE_STEP_RESCORE. */
static kve_status step_with(kve_bank *b, size_t heads, int32_t pos, const float *attn, size_t ld,
                            size_t group, kve_reduce reduce, size_t dim, size_t ldk, kve_rng *g)
{
    kve_step_data d = kve_step_default_data();
    d.attn = attn;
    d.ld = ld;
    d.group = group;
    d.reduce = reduce;
    d.keys = dim ? keys : NULL;
    d.ld_keys = ldk;
    if (g_qg) {
        d.queries = queries;
        d.ld_queries = ldk;
        d.flags = g && kve_rng_below(g, 25) == 0 ? KVE_STEP_RESCORE : 0;
    }
    if (g_vdim) {
        d.values = values;
        d.ld_values = g_vdim;
    }
    return kve_bank_step_data(b, 0, heads, pos, &d);
}

/* The smallest budget an evict of spec accepts. */
static size_t floor_budget(const char *spec)
{
    size_t lo = 1;
    return kve_spec_min_budget(spec, &lo) == KVE_OK ? lo : 1;
}

static int fleet_init(fleet *f, const char *spec, size_t heads, size_t dim, size_t share,
                      uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->heads = heads;
    f->dim = dim;
    f->share = share;
    f->group = 1;
    kve_rng_seed(&f->g, seed * 31 + 7);
    for (int k = 0; k < 4; k++)
        f->pool[k] = (float)(k + 1) / 8.0f;
    for (size_t j = 0; j < 4 * dim; j++)
        f->key_pool[j] = (float)kve_rng_uniform(&f->g) - 0.5f;
    f->b[0] = new_bank(spec, heads, dim, share, seed, NULL);
    f->n = 1;
    if (!f->b[0])
        return 0;
    f->budget = kve_bank_budget(f->b[0]);
    f->lo = floor_budget(spec);
    return 1;
}

static void fleet_free(fleet *f)
{
    for (size_t k = 0; k < f->n; k++)
        kve_bank_free(f->b[k]);
    f->n = 0;
}

static size_t widest(const kve_bank *b)
{
    size_t m = 0;
    for (size_t h = 0; h < kve_bank_heads(b); h++)
        if (kve_bank_size(b, h) > m)
            m = kve_bank_size(b, h);
    return m;
}

/* Every bank of the fleet gave status st[k], and for evictions the victims
 * and counts of bank 0; and every image is bank 0's. */
static int fleet_agree(const fleet *f, const kve_status *st, int evicted, const char *what)
{
    for (size_t k = 1; k < f->n; k++) {
        if (st[k] != st[0]) {
            fprintf(stderr, "%s: %s: bank %zu returned %s, bank 0 %s\n", kve_bank_spec(f->b[0]),
                    what, k, kve_status_name(st[k]), kve_status_name(st[0]));
            return 0;
        }
        if (evicted && st[0] == KVE_OK &&
            (memcmp(counts[k], counts[0], f->heads * sizeof counts[0][0]) != 0 ||
             memcmp(victims[k], victims[0], sizeof victims[0]) != 0)) {
            fprintf(stderr, "%s: %s: bank %zu's victims differ\n", kve_bank_spec(f->b[0]),
                    what, k);
            return 0;
        }
        if (!same_image(f->b[0], f->b[k])) {
            fprintf(stderr, "%s: %s: bank %zu's image differs from bank 0's\n",
                    kve_bank_spec(f->b[0]), what, k);
            return 0;
        }
    }
    return 1;
}

/* One random call on every bank of the fleet (steady: a step and an evict
 * to the budget, nothing else); 0 when they disagree. */
static int fleet_op(fleet *f, int steady)
{
    kve_rng *g = &f->g;
    kve_status st[FLEET];
    uint64_t kind = steady ? 0 : kve_rng_below(g, 100);
    size_t ld = widest(f->b[0]);
    if (ld > MAXN / 2)
        kind = 60; /* hold the sizes down */
    if (kind < 58) { /* a step: attention (mostly), keys when the bank has them */
        int with_attn = kve_rng_below(g, 12) != 0;
        size_t ldr = ld + (size_t)kve_rng_below(g, 3);
        if (kve_rng_below(g, 40) == 0)
            for (int k = 0; k < 4; k++)
                f->pool[k] = (float)kve_rng_uniform(g);
        for (size_t h = 0; h < f->heads; h++) {
            size_t n = kve_bank_size(f->b[0], h);
            for (size_t q = h * f->group; q < (h + 1) * f->group; q++)
                for (size_t i = 0; i < ldr; i++)
                    rows[q * ldr + i] = i < n ? random_weight(g, f->pool, n) : 0.0f;
        }
        /* grouped query heads: their rows reduced by mean or max */
        kve_reduce reduce = f->group > 1 && kve_rng_below(g, 2) ? KVE_REDUCE_MAX : KVE_REDUCE_MEAN;
        size_t ldk = f->dim + (size_t)kve_rng_below(g, 2);
        for (size_t h = 0; h < f->heads; h++)
            random_key(g, f->key_pool, f->dim, keys + h * ldk);
        for (size_t q = 0; q < f->heads * g_qg; q++) /* queries near the keys */
            random_key(g, f->key_pool, f->dim, queries + q * ldk);
        for (size_t i = 0; i < f->heads * g_vdim; i++) /* norms with zeros and ties */
            values[i] = kve_rng_below(g, 6) ? (float)kve_rng_below(g, 5) - 2.0f : 0.0f;
        f->pos += kve_rng_below(g, 10) == 0 ? 2 : 1;
        uint64_t flags = g_qg ? kve_rng_below(g, 1u << 30) : 0; /* the same for all */
        for (size_t k = 0; k < f->n; k++) {
            kve_rng same;
            kve_rng_seed(&same, flags);
            st[k] = step_with(f->b[k], f->heads, f->pos - 1, with_attn ? rows : NULL, ldr,
                              f->group, reduce, f->dim, ldk, &same);
        }
        if (!fleet_agree(f, st, 0, "step"))
            return 0;
        if (!steady)
            return st[0] == KVE_OK;
    }
    if (steady || kind < 90) { /* evict: to the budget, sometimes below it, or shared */
        size_t budget = f->budget;
        if (!steady && kind >= 84 && f->budget > f->lo)
            budget = f->lo + (size_t)kve_rng_below(g, f->budget - f->lo);
        int shared = f->share && (steady || kve_rng_below(g, 2));
        size_t ldv = widest(f->b[0]);
        for (size_t k = 0; k < f->n; k++) {
            memset(victims[k], 0xff, sizeof victims[k]);
            st[k] = shared ? kve_bank_evict_shared(f->b[k], 0, f->heads, f->share * budget,
                                                   victims[k], ldv, counts[k])
                           : kve_bank_evict(f->b[k], budget, victims[k], ldv, counts[k]);
        }
        if (st[0] != KVE_OK)
            fprintf(stderr, "evict: %s\n", kve_last_error());
        return fleet_agree(f, st, 1, "evict") && st[0] == KVE_OK;
    }
    /* remove: a range, or a rewind of the newest positions (stepped again
     * next) */
    int32_t p0, p1;
    if (kind < 95) {
        p0 = (int32_t)kve_rng_below(g, (uint64_t)f->pos + 2) - 1;
        p1 = kve_rng_below(g, 8) == 0 ? KVE_POS_END : p0 + 1 + (int32_t)kve_rng_below(g, 12);
    } else {
        p0 = f->pos - 1 - (int32_t)kve_rng_below(g, 6);
        p0 = p0 < 0 ? 0 : p0;
        p1 = KVE_POS_END;
        f->pos = p0;
    }
    for (size_t k = 0; k < f->n; k++)
        st[k] = kve_bank_remove(f->b[k], p0, p1);
    return fleet_agree(f, st, 0, "remove") && st[0] == KVE_OK;
}

/* Bank 0, a new sequence, compressed to the prefill of an n-token prompt
 * (method KVE_PREFILL_H2O or KVE_PREFILL_SNAPKV), its grouped query heads'
 * rows reduced by mean; the next position is n. */
static void fleet_prefill(fleet *f, size_t n, kve_prefill_method method)
{
    kve_prefill_options po = kve_prefill_default_options();
    po.method = method;
    po.window = 4;
    po.kernel = 3;
    size_t r = kve_prefill_rows(n, &po), nq = f->heads * f->group;
    float *pr = malloc(nq * r * n * sizeof *pr);
    ASSERT_TRUE(pr != NULL);
    for (size_t i = 0; i < nq * r * n; i++) /* ties from the pool, zeros, fresh weights */
        pr[i] = random_weight(&f->g, f->pool, n);
    kve_status st = kve_bank_prefill(f->b[0], 0, f->heads, n, f->budget, pr, n, f->group,
                                     KVE_REDUCE_MEAN, &po);
    free(pr);
    if (st != KVE_OK)
        CHECK_FAIL_AT("%s: prefill: %s", kve_bank_spec(f->b[0]), kve_last_error());
    f->pos = (int32_t)n;
}

/* A random state on bank 0 (after a prefill when prefill >= 0, the
 * kve_prefill_method), then its clone, a copy into a bank that held another
 * state, and its image loaded back: all four continue in lockstep. Steps
 * give `group` query rows a KV head. */
static void forks_case_ex(const char *spec, size_t heads, size_t dim, size_t share, size_t group,
                          int prefill, size_t after, uint64_t seed)
{
    fleet f;
    ASSERT_TRUE(fleet_init(&f, spec, heads, dim, share, seed));
    f.group = group;
    size_t before = 20 + (size_t)kve_rng_below(&f.g, 200);
    if (prefill >= 0) { /* a prompt, then the fork (parallel sampling) or a few steps first */
        fleet_prefill(&f, 2 * f.budget + 5, (kve_prefill_method)prefill);
        before = (size_t)kve_rng_below(&f.g, 2) * (size_t)kve_rng_below(&f.g, 12);
    }
    for (size_t s = 0; s < before; s++)
        if (!fleet_op(&f, 0))
            break;
    ASSERT_OK(kve_bank_clone(f.b[0], &f.b[1]));
    f.b[2] = new_bank(spec, heads, dim, share, seed + 1, NULL);
    ASSERT_TRUE(f.b[2] != NULL);
    /* another state first: grown past its slots, so the copy replaces
     * storage as well as contents */
    for (int32_t p = 0; p < (int32_t)(2 * f.budget + 3); p++)
        ASSERT_OK(step_with(f.b[2], heads, p, NULL, 0, 1, KVE_REDUCE_MEAN, dim, dim, NULL));
    ASSERT_OK(kve_bank_copy(f.b[2], f.b[0]));
    f.b[3] = reload(f.b[0], NULL);
    ASSERT_TRUE(f.b[3] != NULL);
    f.n = 4;
    kve_status none[FLEET] = {KVE_OK, KVE_OK, KVE_OK, KVE_OK};
    ASSERT_TRUE(fleet_agree(&f, none, 0, "the forks"));
    for (size_t s = 0; s < after; s++)
        if (!fleet_op(&f, 0)) {
            fleet_free(&f);
            CHECK_FAIL_AT("%s: the forks disagree at call %zu after the fork", spec, s);
        }
    fleet_free(&f);
}

static void forks_case(const char *spec, size_t heads, size_t dim, size_t share, uint64_t seed)
{
    forks_case_ex(spec, heads, dim, share, 1, -1, 160, seed);
}

static void test_forks_continue(void)
{
    for (size_t i = 0; i < N_OF(workload_specs); i++) {
        const char *spec = workload_specs[i];
        forks_case(spec, 3, workload_key_dim(spec, i), 0, check_seed + i);
    }
    for (size_t i = 0; i < N_OF(page_specs); i++)
        forks_case(page_specs[i], 3, i % 2 ? 5 : 0, 0, check_seed + 100 + i);
}

static void test_forks_shared(void)
{
    for (size_t i = 0; i < N_OF(shared_specs); i++) {
        const char *spec = shared_specs[i];
        size_t dim = strncmp(spec, "k", 1) == 0 ? 3 + i : 0;
        forks_case(spec, 6, dim, i % 2 ? 3 : 2, check_seed + 200 + i);
    }
}

/* Grouped-query banks (2 and 3 query heads a KV head, reduced by mean or
 * max), and banks forked right after a prefill (H2O's and SnapKV's, with
 * and without a shared budget): the parallel sampling of one prompt. */
static void test_forks_gqa_prefill(void)
{
    static const char *const gqa[] = {
        "h2o:budget=12,recent_window=2", "tova:budget=9,recent_window=1",
        "scissorhands:budget=12,recent_window=1,history=7", "h2o_mean:budget=8,recent_window=1",
        "knorm:budget=9,recent_window=2", "keydiff:budget=8,recent_window=1",
        "random:budget=10,recent_window=3", "h2o:budget=16,recent_window=2,block=4",
    };
    for (size_t i = 0; i < N_OF(gqa); i++) {
        size_t dim = strncmp(gqa[i], "k", 1) == 0 ? 5 : 0;
        forks_case_ex(gqa[i], 3, dim, 0, 2 + i % 2, -1, 150, check_seed + 400 + i);
    }
    static const char *const scored[] = {
        "h2o:budget=12,recent_window=2",
        "tova:budget=10,recent_window=1",
        "h2o_decay:budget=9,recent_window=2,decay=0.5",
        "h2o_mean:budget=8,recent_window=1",
        "scissorhands:budget=12,recent_window=1,history=7",
    };
    for (size_t i = 0; i < N_OF(scored); i++) { /* each spec by both methods */
        int m = (int)(i % 2);
        forks_case_ex(scored[i], 2, 0, 0, 2, m, 150, check_seed + 420 + 2 * i);
        forks_case_ex(scored[i], 4, 0, 2, 1, !m, 150, check_seed + 421 + 2 * i);
    }
}

/* An image saved under one instruction set and loaded under another
 * continues exactly as a run on the scalar path alone. */
static void isa_case(const char *spec, size_t dim, uint64_t seed)
{
    enum { BEFORE = 120, AFTER = 160 };
    /* the scalar run, one image per call */
    uint8_t *ref[BEFORE + AFTER] = {0};
    size_t ref_n[BEFORE + AFTER] = {0};
    fleet f;
    ASSERT_TRUE(kve__isa_force(KVE_ISA_SCALAR));
    ASSERT_TRUE(fleet_init(&f, spec, 3, dim, 0, seed));
    for (int s = 0; s < BEFORE + AFTER; s++) {
        ASSERT_TRUE(fleet_op(&f, 0));
        ref[s] = bank_image(f.b[0], &ref_n[s]);
    }
    fleet_free(&f);
    for (int a = 0; a < KVE_ISA_COUNT; a++) {
        for (int b = 0; b < KVE_ISA_COUNT; b++) {
            if (!kve__isa_supported((kve_isa)a) || !kve__isa_supported((kve_isa)b))
                continue;
            ASSERT_TRUE(kve__isa_force((kve_isa)a));
            ASSERT_TRUE(fleet_init(&f, spec, 3, dim, 0, seed));
            for (int s = 0; s < BEFORE; s++)
                ASSERT_TRUE(fleet_op(&f, 0));
            ASSERT_TRUE(kve__isa_force((kve_isa)b));
            kve_bank *loaded = reload(f.b[0], NULL);
            ASSERT_TRUE(loaded != NULL);
            kve_bank_free(f.b[0]);
            f.b[0] = loaded;
            for (int s = BEFORE; s < BEFORE + AFTER; s++) {
                ASSERT_TRUE(fleet_op(&f, 0));
                size_t n = 0;
                uint8_t *img = bank_image(f.b[0], &n);
                int same = img && n == ref_n[s] && memcmp(img, ref[s], n) == 0;
                free(img);
                if (!same) {
                    fleet_free(&f);
                    kve__isa_force(KVE_ISA_COUNT);
                    CHECK_FAIL_AT("%s: saved on path %d, loaded on %d: call %d differs from "
                                  "the scalar run",
                                  spec, a, b, s);
                }
            }
            fleet_free(&f);
        }
    }
    kve__isa_force(KVE_ISA_COUNT);
    for (int s = 0; s < BEFORE + AFTER; s++)
        free(ref[s]);
}

static void test_isa_paths(void)
{
    static const char *const specs[] = {
        "h2o:budget=40,recent_window=4", "tova:budget=33,recent_window=1",
        "scissorhands:budget=24,recent_window=4,history=64", "h2o_decay:budget=35,decay=0.9",
        "h2o_mean:budget=37,recent_window=3", "knorm:budget=30,recent_window=2",
        "keydiff:budget=28,recent_window=1", "h2o:budget=36,recent_window=3,block=4",
        "random:budget=20,recent_window=2",
    };
    for (size_t i = 0; i < N_OF(specs); i++)
        isa_case(specs[i], strncmp(specs[i], "k", 1) == 0 ? 13 : 0, check_seed + 300 + i);
}

/* ---- remove, against the reference model ---- */

/* Policy p and the reference r hold the same state (the image read back). */
static int policy_as_ref(const kve_policy *p, const ref_policy *r)
{
    size_t n = 0;
    uint8_t *img = policy_image(p, &n);
    img_hdr h;
    ref_policy *back = img && img_header(img, n, &h) == 0 ? img_ref(img, &h, 0) : NULL;
    int same = back && ref_same(back, r) == 0;
    if (!same)
        fprintf(stderr, "%s: the policy's state differs from the reference's (%d)\n",
                kve_policy_spec(p), back ? ref_same(back, r) : -99);
    ref_free(back);
    free(img);
    return same;
}

/* Replaces *p by a fork of itself: a clone, a copy or its image reloaded. */
static int refork(kve_policy **p, uint64_t how, size_t dim)
{
    kve_policy *q = NULL;
    kve_status st = KVE_OK;
    if (how == 0) {
        st = kve_policy_clone(*p, &q);
    } else if (how == 1) {
        kve_policy_options o = kve_policy_default_options();
        o.key_dim = dim;
        kve_rng r;
        kve_rng_seed(&r, 99);
        st = kve_policy_new_ex(kve_policy_spec(*p), &r, &o, &q);
        if (st == KVE_OK)
            st = kve_policy_copy(q, *p);
    } else {
        size_t n = 0;
        uint8_t *img = policy_image(*p, &n);
        st = img ? kve_policy_load(img, n, NULL, &q) : KVE_ENOMEM;
        free(img);
    }
    if (st != KVE_OK) {
        fprintf(stderr, "refork %d: %s\n", (int)how, kve_last_error());
        kve_policy_free(q);
        return 0;
    }
    kve_policy_free(*p);
    *p = q;
    return 1;
}

static void remove_case(const char *spec, size_t dim, uint64_t seed)
{
    kve_rng rp, rr, g;
    kve_rng_seed(&rp, seed);
    rr = rp;
    kve_rng_seed(&g, seed ^ 0x5eed);
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = dim;
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new_ex(spec, &rp, &o, &p));
    ref_policy *r = ref_new_keys(kve_policy_spec(p), &rr, dim);
    ASSERT_TRUE(r != NULL);
    float pool[4] = {0.125f, 0.25f, 0.5f, 0.75f}, key_pool[4 * MAXD], key[MAXD];
    for (size_t j = 0; j < 4 * dim; j++)
        key_pool[j] = (float)kve_rng_uniform(&g) - 0.5f;
    size_t budget = kve_policy_budget(p), lo = floor_budget(spec);
    int32_t pos = 0;
    int32_t vp[MAXN], vr[MAXN];
    int failed = 0;
    for (int s = 0; s < 700 && !failed; s++) {
        uint64_t kind = kve_rng_below(&g, 100);
        size_t n = kve_policy_size(p);
        if (n > MAXN / 2)
            kind = 70;
        if (kind < 55) {
            int with_attn = kve_rng_below(&g, 10) != 0;
            for (size_t i = 0; i < n; i++)
                rows[i] = random_weight(&g, pool, n);
            random_key(&g, key_pool, dim, key);
            const float *k = dim ? key : NULL;
            kve_status st = kve_policy_step_keys(p, pos, with_attn ? rows : NULL, n, k);
            int rst = ref_step_keys(r, pos, with_attn ? rows : NULL, n, k);
            failed = st != KVE_OK || rst != 0;
            pos += kve_rng_below(&g, 8) == 0 ? 3 : 1;
        } else if (kind < 85) {
            size_t b = kind < 80 || budget == lo ? budget
                                                 : lo + (size_t)kve_rng_below(&g, budget - lo);
            size_t np = 0, nr = 0;
            failed = kve_policy_evict(p, b, vp, MAXN, &np) != KVE_OK ||
                     ref_evict(r, b, vr, &nr) != 0 || np != nr ||
                     (np && memcmp(vp, vr, np * sizeof *vp) != 0);
        } else if (kind < 97) {
            int32_t p0, p1;
            if (kind < 92) {
                p0 = (int32_t)kve_rng_below(&g, (uint64_t)pos + 2) - 1;
                p1 = kve_rng_below(&g, 6) == 0 ? KVE_POS_END
                                                : p0 + 1 + (int32_t)kve_rng_below(&g, 9);
            } else { /* a rewind: the next step is at p0 again */
                p0 = pos - 1 - (int32_t)kve_rng_below(&g, 5);
                p0 = p0 < 0 ? 0 : p0;
                p1 = KVE_POS_END;
                pos = p0;
            }
            size_t gone = SIZE_MAX;
            failed = kve_policy_remove(p, p0, p1, &gone) != KVE_OK || gone != ref_remove(r, p0, p1);
        } else {
            failed = !refork(&p, kve_rng_below(&g, 3), dim);
        }
        if (failed)
            fprintf(stderr, "%s: call %d (kind %d) disagrees with the reference: %s\n", spec, s,
                    (int)kind, kve_last_error());
        else
            failed = !policy_as_ref(p, r);
        if (failed)
            fprintf(stderr, "  at call %d\n", s);
    }
    kve_policy_free(p);
    ref_free(r);
    ASSERT_TRUE(!failed);
}

static void test_remove_reference(void)
{
    for (size_t i = 0; i < N_OF(workload_specs); i++)
        remove_case(workload_specs[i], workload_key_dim(workload_specs[i], i),
                    check_seed + 400 + i);
    for (size_t i = 0; i < N_OF(page_specs); i++)
        remove_case(page_specs[i], 0, check_seed + 500 + i);
}

/* A shared bank against the reference's shared eviction, through removals
 * and rewinds: the groups stay consistent (the same victims, sizes and
 * state as the reference's heads) and forks taken on the way agree. */
static void test_shared_remove_reference(void)
{
    for (size_t si = 0; si < N_OF(shared_specs); si++) {
        const char *spec = shared_specs[si];
        size_t dim = strncmp(spec, "k", 1) == 0 ? 3 : 0;
        enum { HS = 4, G = 2 };
        fleet f;
        ASSERT_TRUE(fleet_init(&f, spec, HS, dim, G, check_seed + 700 + si));
        kve_rng rr;
        kve_rng_seed(&rr, check_seed + 700 + si);
        ref_policy *r[HS];
        for (size_t h = 0; h < HS; h++)
            ASSERT_TRUE((r[h] = ref_new_keys(kve_bank_spec(f.b[0]), &rr, dim)) != NULL);
        int32_t rv[HS * MAXN];
        size_t rc[HS];
        int failed = 0;
        for (int s = 0; s < 400 && !failed; s++) {
            uint64_t kind = kve_rng_below(&f.g, 10);
            size_t ld = widest(f.b[0]) + 1;
            if (kind < 5) {
                for (size_t h = 0; h < HS; h++)
                    for (size_t i = 0; i < ld; i++)
                        rows[h * ld + i] = random_weight(&f.g, f.pool, r[h]->n ? r[h]->n : 1);
                for (size_t j = 0; j < HS * dim; j++)
                    keys[j] = (float)kve_rng_uniform(&f.g) - 0.5f;
                failed = kve_bank_step_range(f.b[0], 0, HS, f.pos, rows, ld, 1, KVE_REDUCE_MEAN,
                                             dim ? keys : NULL, dim) != KVE_OK;
                for (size_t h = 0; h < HS && !failed; h++)
                    failed = ref_step_keys(r[h], f.pos, rows + h * ld, r[h]->n,
                                           dim ? keys + h * dim : NULL) != 0;
                f.pos++;
            } else if (kind < 8) {
                size_t budget = G * f.budget;
                failed = kve_bank_evict_shared(f.b[0], 0, HS, budget, victims[0], ld,
                                               counts[0]) != KVE_OK;
                for (size_t g = 0; g < HS / G && !failed; g++)
                    failed = ref_evict_shared(r + g * G, G, budget, kve_bank_min_share(f.b[0]),
                                              rv + g * G * ld, ld, rc + g * G) != 0;
                for (size_t h = 0; h < HS && !failed; h++)
                    failed = counts[0][h] != rc[h] ||
                             memcmp(victims[0] + h * ld, rv + h * ld,
                                    rc[h] * sizeof(int32_t)) != 0;
            } else {
                int32_t p0 = kind == 8 ? (int32_t)kve_rng_below(&f.g, (uint64_t)f.pos + 1) : 0;
                int32_t p1 = kind == 8 ? p0 + 1 + (int32_t)kve_rng_below(&f.g, 8) : KVE_POS_END;
                if (kind == 9) /* a rewind */
                    p0 = f.pos = f.pos > 3 ? f.pos - 3 : 0;
                failed = kve_bank_remove(f.b[0], p0, p1) != KVE_OK;
                for (size_t h = 0; h < HS; h++)
                    (void)ref_remove(r[h], p0, p1);
            }
            size_t n = 0;
            uint8_t *img = failed ? NULL : bank_image(f.b[0], &n);
            img_hdr hd;
            for (size_t h = 0; img && h < HS && !failed; h++) {
                ref_policy *back = img_header(img, n, &hd) == 0 ? img_ref(img, &hd, h) : NULL;
                failed = !back || ref_same(back, r[h]) != 0;
                ref_free(back);
            }
            free(img);
            if (failed)
                fprintf(stderr, "%s: call %d (kind %d) differs from the reference\n", spec, s,
                        (int)kind);
            if (!failed && s % 50 == 49) { /* a fork in the middle: continue with it */
                kve_bank *c = kve_rng_below(&f.g, 2) ? reload(f.b[0], NULL) : NULL;
                if (!c)
                    failed = kve_bank_clone(f.b[0], &c) != KVE_OK;
                kve_bank_free(f.b[0]);
                f.b[0] = c;
            }
        }
        for (size_t h = 0; h < HS; h++)
            ref_free(r[h]);
        fleet_free(&f);
        ASSERT_TRUE(!failed);
    }
}

/* The promises of kve_policy_remove, one by one. */
static void test_remove_contract(void)
{
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=8,recent_window=2", NULL, &p));
    float w[16];
    for (int32_t t = 0; t < 10; t++) {
        for (size_t i = 0; i < kve_policy_size(p); i++)
            w[i] = 1.0f / (float)kve_policy_size(p);
        ASSERT_OK(kve_policy_step(p, 10 * t, kve_policy_size(p) ? w : NULL, kve_policy_size(p)));
    }
    size_t gone = 99;
    ASSERT_OK(kve_policy_remove(p, 15, 35, &gone)); /* 20 and 30 */
    ASSERT_EQ(gone, 2);
    ASSERT_EQ(kve_policy_size(p), 8);
    ASSERT_OK(kve_policy_remove(p, -5, 1, &gone)); /* 0: p0 may be negative */
    ASSERT_EQ(gone, 1);
    ASSERT_EQ(kve_policy_positions(p)[0], 10);
    ASSERT_OK(kve_policy_remove(p, 41, 49, &gone)); /* nothing kept there */
    ASSERT_EQ(gone, 0);
    ASSERT_OK(kve_policy_remove(p, 80, KVE_POS_END, NULL)); /* a rewind to 80 */
    ASSERT_EQ(kve_policy_size(p), 5);
    ASSERT_EQ(kve_policy_positions(p)[4], 70);
    ASSERT_OK(kve_policy_step(p, 71, NULL, 0)); /* anything past the largest kept */
    ASSERT_STATUS(kve_policy_step(p, 71, NULL, 0), KVE_EINVAL);
    ASSERT_OK(kve_policy_remove(p, 0, KVE_POS_END, &gone));
    ASSERT_EQ(gone, 6);
    ASSERT_OK(kve_policy_step(p, 0, NULL, 0)); /* empty: position 0 again */
    /* INT32_MAX is removable through KVE_POS_END only */
    ASSERT_OK(kve_policy_step(p, INT32_MAX, NULL, 0));
    ASSERT_OK(kve_policy_remove(p, INT32_MAX - 1, KVE_POS_END, &gone));
    ASSERT_EQ(gone, 1);
    ASSERT_STATUS(kve_policy_remove(p, 5, 5, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "p0 must be below p1");
    ASSERT_STATUS(kve_policy_remove(p, 0, -1, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_remove(NULL, 0, 1, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_remove(NULL, 0, 1), KVE_EINVAL);
    kve_policy_free(p);
}

/* Removing the draft is not an undo: its queries' attention stays in the
 * scores of what is kept. A copy from a checkpoint taken before it is. */
static void test_rewind_is_not_undo(void)
{
    kve_policy *p = NULL, *ckpt = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=16,recent_window=2", NULL, &p));
    float w[32];
    int32_t v[32];
    int32_t t = 0;
    for (; t < 40; t++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            w[i] = (float)((i * 7 + (size_t)t) % 5 + 1) / 16.0f;
        ASSERT_OK(kve_policy_step(p, t, n ? w : NULL, n));
        ASSERT_OK(kve_policy_evict(p, 16, v, 32, NULL));
    }
    ASSERT_OK(kve_policy_clone(p, &ckpt));
    size_t nc = 0, np = 0;
    uint8_t *before = policy_image(ckpt, &nc);
    for (int32_t d = 0; d < 4; d++) { /* a draft of 4 tokens, stepped without evicting */
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            w[i] = 1.0f / (float)n;
        ASSERT_OK(kve_policy_step(p, t + d, w, n));
    }
    ASSERT_OK(kve_policy_remove(p, t, KVE_POS_END, NULL)); /* all rejected */
    ASSERT_EQ(kve_policy_size(p), kve_policy_size(ckpt));
    ASSERT_TRUE(memcmp(kve_policy_positions(p), kve_policy_positions(ckpt),
                       kve_policy_size(p) * sizeof(int32_t)) == 0);
    uint8_t *after = policy_image(p, &np);
    ASSERT_TRUE(before && after && nc == np);
    ASSERT_TRUE(memcmp(before, after, nc) != 0); /* the same kept set, other scores */
    free(after);
    ASSERT_OK(kve_policy_copy(p, ckpt)); /* the exact rewind */
    after = policy_image(p, &np);
    ASSERT_TRUE(after && nc == np && memcmp(before, after, nc) == 0);
    free(after);
    free(before);
    kve_policy_free(p);
    kve_policy_free(ckpt);
}

/* ---- reset ---- */

/* A reset bank replays exactly as a new one, allocating nothing, after any
 * history (growth included). */
static void reset_case(const char *spec, size_t dim, size_t heads, size_t share, uint64_t seed)
{
    talloc ta;
    talloc_init(&ta);
    fleet f;
    ASSERT_TRUE(fleet_init(&f, spec, heads, dim, share, seed));
    kve_bank_free(f.b[0]);
    f.b[0] = new_bank(spec, heads, dim, share, seed, &ta.a);
    ASSERT_TRUE(f.b[0] != NULL);
    for (int s = 0; s < 150; s++)
        ASSERT_TRUE(fleet_op(&f, 0));
    for (int32_t p = f.pos; p < f.pos + (int32_t)(3 * f.budget); p++) /* growth */
        ASSERT_OK(step_with(f.b[0], heads, p, NULL, 0, 1, KVE_REDUCE_MEAN, dim, dim, NULL));
    talloc_fail_after(&ta, 0);
    kve_bank_reset(f.b[0]);
    f.b[1] = new_bank(spec, heads, dim, share, seed, NULL);
    ASSERT_TRUE(f.b[1] != NULL);
    f.n = 2;
    f.pos = 0;
    kve_status none[FLEET] = {KVE_OK, KVE_OK};
    ASSERT_TRUE(fleet_agree(&f, none, 0, "reset"));
    /* the steady state: step, evict to the budget (full, which never evicts,
     * grows as a new bank would: its replay stays within what it held) */
    int never = strncmp(spec, "full", 4) == 0;
    for (int s = 0; s < (never ? 60 : 200); s++)
        ASSERT_TRUE(fleet_op(&f, 1));
    ASSERT_EQ(talloc_fail_after(&ta, SIZE_MAX), 0); /* none during the reset and the replay */
    fleet_free(&f);
    talloc_check_empty(&ta);
}

static void test_reset_replays(void)
{
    for (size_t i = 0; i < N_OF(workload_specs); i++)
        reset_case(workload_specs[i], workload_key_dim(workload_specs[i], i), 3, 0,
                   check_seed + 600 + i);
    for (size_t i = 0; i < N_OF(page_specs); i++)
        reset_case(page_specs[i], 0, 2, 0, check_seed + 650 + i);
    for (size_t i = 0; i < N_OF(shared_specs); i++)
        reset_case(shared_specs[i], strncmp(shared_specs[i], "k", 1) == 0 ? 4 : 0, 4, 2,
                   check_seed + 680 + i);
    kve_policy_reset(NULL);
    kve_bank_reset(NULL);
    /* a policy's reset: the same random victims again */
    kve_rng r;
    kve_rng_seed(&r, check_seed);
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("random:budget=4,recent_window=0", &r, &p));
    int32_t first[64], again[64];
    size_t n1 = 0, n2 = 0, nv;
    for (int round = 0; round < 2; round++) {
        int32_t *out = round ? again : first;
        size_t *n = round ? &n2 : &n1;
        for (int32_t t = 0; t < 20; t++) {
            ASSERT_OK(kve_policy_step(p, t, NULL, 0));
            ASSERT_OK(kve_policy_evict(p, 4, out + *n, 64 - *n, &nv));
            *n += nv;
        }
        kve_policy_reset(p);
        ASSERT_EQ(kve_policy_size(p), 0);
    }
    ASSERT_EQ(n1, n2);
    ASSERT_TRUE(memcmp(first, again, n1 * sizeof first[0]) == 0);
    kve_policy_free(p);
}

/* ---- memory ---- */

static void test_memory(void)
{
    const char *spec = "h2o:budget=32,recent_window=4";
    talloc ta, tb;
    talloc_init(&ta);
    talloc_init(&tb);
    fleet f;
    ASSERT_TRUE(fleet_init(&f, spec, 4, 0, 0, check_seed));
    kve_bank_free(f.b[0]);
    f.b[0] = new_bank(spec, 4, 0, 0, check_seed, &ta.a);
    for (int s = 0; s < 100; s++)
        ASSERT_TRUE(fleet_op(&f, 1));
    /* a clone allocates through its original's allocator, and only there */
    size_t blocks = ta.blocks;
    kve_bank *ck = NULL;
    talloc_fail_after(&ta, 0);
    ASSERT_STATUS(kve_bank_clone(f.b[0], &ck), KVE_ENOMEM);
    ASSERT_TRUE(ck == NULL);
    ASSERT_EQ(ta.blocks, blocks);
    talloc_fail_after(&ta, SIZE_MAX);
    ASSERT_OK(kve_bank_clone(f.b[0], &ck));
    ASSERT_TRUE(ta.blocks > blocks);
    /* the checkpoint and restore of speculative decoding: no allocation */
    kve_bank *dst = new_bank(spec, 4, 0, 0, 5, &tb.a);
    talloc_fail_after(&ta, 0);
    talloc_fail_after(&tb, 0);
    for (int round = 0; round < 20; round++) {
        ASSERT_OK(kve_bank_copy(ck, f.b[0]));  /* checkpoint */
        ASSERT_OK(kve_bank_copy(dst, f.b[0])); /* a bank of the same spec, never grown */
        for (int d = 0; d < 3; d++)
            ASSERT_TRUE(fleet_op(&f, 1)); /* draft */
        ASSERT_OK(kve_bank_remove(f.b[0], f.pos - 2, KVE_POS_END)); /* never allocates */
        ASSERT_OK(kve_bank_copy(f.b[0], ck));                       /* restore */
        f.pos -= 3;
        ASSERT_TRUE(same_image(f.b[0], ck));
    }
    ASSERT_EQ(talloc_fail_after(&ta, SIZE_MAX), 0);
    ASSERT_EQ(talloc_fail_after(&tb, SIZE_MAX), 0);
    /* a src that grew: the copy grows dst once (through dst's allocator),
     * all or nothing, then never again */
    for (int32_t p = f.pos; p < f.pos + 100; p++)
        ASSERT_OK(kve_bank_step(f.b[0], p, NULL, 0));
    f.pos += 100;
    uint8_t *img_dst = NULL;
    size_t n_dst = 0;
    img_dst = bank_image(dst, &n_dst);
    for (size_t k = 0;; k++) {
        talloc_fail_after(&tb, k);
        kve_status st = kve_bank_copy(dst, f.b[0]);
        talloc_fail_after(&tb, SIZE_MAX);
        if (st == KVE_OK)
            break;
        ASSERT_EQ(st, KVE_ENOMEM);
        size_t n = 0;
        uint8_t *now = bank_image(dst, &n);
        ASSERT_TRUE(now && n == n_dst && memcmp(now, img_dst, n) == 0);
        free(now);
    }
    free(img_dst);
    ASSERT_TRUE(same_image(dst, f.b[0]));
    talloc_fail_after(&tb, 0);
    ASSERT_OK(kve_bank_copy(dst, f.b[0]));
    ASSERT_EQ(talloc_fail_after(&tb, SIZE_MAX), 0);
    /* a load allocates through the allocator it is given */
    kve_bank *loaded = reload(f.b[0], &tb.a);
    ASSERT_TRUE(loaded != NULL);
    ASSERT_TRUE(same_image(loaded, f.b[0]));
    kve_bank_free(loaded);
    kve_bank_free(dst);
    kve_bank_free(ck);
    fleet_free(&f);
    talloc_check_empty(&ta);
    talloc_check_empty(&tb);
}

/* Every policy in the steady state of a decode (a step, an evict to the
 * budget), as a policy, a bank and a shared bank: a copy into an object of
 * the same spec that was never grown (it has the slots of a new one) and a
 * remove of the copy allocate nothing (the counting allocator of dst sees
 * no call, and would fail one), and the copy is exact. */
static void copy_case(const char *spec, size_t heads, size_t dim, size_t share, uint64_t seed)
{
    talloc ta;
    talloc_init(&ta);
    fleet f;
    ASSERT_TRUE(fleet_init(&f, spec, heads, dim, share, seed));
    kve_bank *dst = new_bank(spec, heads, dim, share, seed + 1, &ta.a);
    ASSERT_TRUE(dst != NULL);
    for (int round = 0; round < 3; round++) {
        for (int s = 0; s < 40; s++)
            ASSERT_TRUE(fleet_op(&f, 1));
        talloc_fail_after(&ta, 0);
        ASSERT_OK(kve_bank_copy(dst, f.b[0]));
        ASSERT_OK(kve_bank_remove(dst, f.pos - 3, KVE_POS_END));
        ASSERT_OK(kve_bank_copy(dst, f.b[0]));
        ASSERT_EQ(talloc_fail_after(&ta, SIZE_MAX), 0);
        ASSERT_TRUE(same_image(dst, f.b[0]));
    }
    kve_bank_free(dst);
    fleet_free(&f);
    talloc_check_empty(&ta);
    if (heads != 1 || share)
        return;
    /* the same through the policy calls */
    talloc_init(&ta);
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = dim;
    kve_policy *src = NULL, *d = NULL;
    kve_rng r;
    kve_rng_seed(&r, seed);
    ASSERT_OK(kve_policy_new_ex(spec, &r, &o, &src));
    o.allocator = &ta.a;
    ASSERT_OK(kve_policy_new_ex(spec, &r, &o, &d));
    float w[2 * MAXN / 10], key[MAXD];
    for (size_t j = 0; j < dim; j++)
        key[j] = (float)j - 1.5f;
    for (int32_t t = 0; t < 100; t++) {
        size_t n = kve_policy_size(src), nv = 0;
        for (size_t i = 0; i < n; i++)
            w[i] = (float)((i * 7 + (size_t)t) % 5) / 8.0f;
        ASSERT_OK(kve_policy_step_keys(src, t, n ? w : NULL, n, dim ? key : NULL));
        ASSERT_OK(kve_policy_evict(src, kve_policy_budget(src), victims[0], MAXN, &nv));
        if (t % 10 == 9) {
            size_t gone = 0, n_src = 0, n_d = 0;
            talloc_fail_after(&ta, 0);
            ASSERT_OK(kve_policy_copy(d, src));
            ASSERT_OK(kve_policy_remove(d, t - 2, KVE_POS_END, &gone));
            ASSERT_OK(kve_policy_copy(d, src));
            ASSERT_EQ(talloc_fail_after(&ta, SIZE_MAX), 0);
            uint8_t *a = policy_image(src, &n_src), *b = policy_image(d, &n_d);
            ASSERT_TRUE(a && b && n_src == n_d && memcmp(a, b, n_src) == 0);
            free(a);
            free(b);
        }
    }
    kve_policy_free(src);
    kve_policy_free(d);
    talloc_check_empty(&ta);
}

static void test_copy_allocates_nothing(void)
{
    for (size_t i = 0; i < N_OF(workload_specs); i++) {
        const char *spec = workload_specs[i];
        if (strncmp(spec, "full", 4) == 0)
            continue; /* never evicts: it outgrows a new object's slots */
        size_t dim = workload_key_dim(spec, i);
        copy_case(spec, i % 2 ? 1 : 3, dim, 0, check_seed + 800 + i);
    }
    for (size_t i = 0; i < N_OF(page_specs); i++)
        copy_case(page_specs[i], 1 + i % 2, 0, 0, check_seed + 850 + i);
    for (size_t i = 0; i < N_OF(shared_specs); i++)
        copy_case(shared_specs[i], 4, strncmp(shared_specs[i], "k", 1) == 0 ? 4 : 0, 2,
                  check_seed + 870 + i);
}

/* ---- refusals change nothing ---- */

static void test_refusals_change_nothing(void)
{
    kve_bank_options o = kve_bank_default_options();
    o.share = 2;
    kve_bank *a = NULL, *twin = NULL, *other = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=8,recent_window=1", 4, NULL, &o, &a));
    fleet f;
    ASSERT_TRUE(fleet_init(&f, "h2o:budget=8,recent_window=1", 4, 0, 2, check_seed));
    kve_bank_free(f.b[0]);
    f.b[0] = a;
    for (int s = 0; s < 60; s++)
        ASSERT_TRUE(fleet_op(&f, 0));
    ASSERT_OK(kve_bank_clone(a, &twin));
    size_t n = 0;
    uint8_t *img = bank_image(a, &n);
    ASSERT_TRUE(img != NULL);
#define UNCHANGED(call, want)                                                                  \
    do {                                                                                       \
        ASSERT_STATUS(call, want);                                                             \
        ASSERT_TRUE(kve_last_error()[0] != '\0');                                              \
        ASSERT_TRUE(same_image(a, twin));                                                      \
    } while (0)
    static const struct {
        const char *spec;
        size_t heads, share, dim;
        double min_share;
        const char *says;
    } others[] = {
        {"h2o:budget=9,recent_window=1", 4, 2, 0, 0.2, "spec"},
        {"h2o:budget=8,recent_window=1", 4, 2, 3, 0.2, "key_dim"},
        {"h2o:budget=8,recent_window=1", 6, 2, 0, 0.2, "heads"},
        {"h2o:budget=8,recent_window=1", 4, 4, 0, 0.2, "share"},
        {"h2o:budget=8,recent_window=1", 4, 0, 0, 0.2, "share"},
        {"h2o:budget=8,recent_window=1", 4, 2, 0, 0.5, "min_share"},
    };
    for (size_t i = 0; i < N_OF(others); i++) {
        kve_bank_options oo = kve_bank_default_options();
        oo.share = others[i].share;
        oo.key_dim = others[i].dim;
        oo.min_share = others[i].min_share;
        ASSERT_OK(kve_bank_new_ex(others[i].spec, others[i].heads, NULL, &oo, &other));
        ASSERT_OK(kve_bank_step(other, 0, NULL, 0));
        uint8_t *oimg = NULL;
        size_t on = 0;
        oimg = bank_image(other, &on);
        UNCHANGED(kve_bank_copy(a, other), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), others[i].says);
        UNCHANGED(kve_bank_copy(other, a), KVE_EINVAL); /* src unchanged too */
        size_t on2 = 0;
        uint8_t *oimg2 = bank_image(other, &on2);
        ASSERT_TRUE(oimg && oimg2 && on == on2 && memcmp(oimg, oimg2, on) == 0);
        free(oimg);
        free(oimg2);
        kve_bank_free(other);
    }
    /* Without shared heads min_share does nothing, so it does not stop a
     * copy (issue 30: a valid copy was refused for it). */
    {
        kve_bank *x = NULL, *y = NULL;
        kve_bank_options ox = kve_bank_default_options(), oy = kve_bank_default_options();
        ox.min_share = 0.5; /* oy's: the default 0.2 */
        ASSERT_OK(kve_bank_new_ex("h2o:budget=8,recent_window=1", 4, NULL, &ox, &x));
        ASSERT_OK(kve_bank_new_ex("h2o:budget=8,recent_window=1", 4, NULL, &oy, &y));
        ASSERT_OK(kve_bank_step(x, 0, NULL, 0));
        ASSERT_OK(kve_bank_copy(y, x));
        ASSERT_TRUE(kve_bank_size(y, 0) == 1 && kve_bank_min_share(y) == 0.2); /* its own */
        kve_bank_free(x);
        kve_bank_free(y);
    }
    UNCHANGED(kve_bank_copy(a, NULL), KVE_EINVAL);
    UNCHANGED(kve_bank_copy(NULL, a), KVE_EINVAL);
    UNCHANGED(kve_bank_remove(a, 7, 7), KVE_EINVAL);
    UNCHANGED(kve_bank_remove(a, 8, 3), KVE_EINVAL);
    uint8_t *buf = malloc(n);
    ASSERT_TRUE(buf != NULL);
    memset(buf, 0xab, n);
    size_t got = 0;
    UNCHANGED(kve_bank_save(a, buf, n - 1, &got), KVE_ERANGE);
    ASSERT_EQ(got, n); /* the one output a refusal writes */
    for (size_t i = 0; i < n; i++)
        if (buf[i] != 0xab)
            CHECK_FAIL_AT("a refused save wrote byte %zu", i);
    UNCHANGED(kve_bank_save(a, buf, n, NULL), KVE_EINVAL);
    UNCHANGED(kve_bank_save(NULL, buf, n, &got), KVE_EINVAL);
    kve_bank *out = (kve_bank *)buf;
    UNCHANGED(kve_bank_clone(a, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_clone(NULL, &out), KVE_EINVAL);
    ASSERT_TRUE(out == (kve_bank *)buf);
    img[n - 1] ^= 1;
    ASSERT_STATUS(kve_bank_load(img, n, NULL, &out), KVE_EINVAL);
    ASSERT_TRUE(out == (kve_bank *)buf);
    ASSERT_STATUS(kve_bank_load(NULL, n, NULL, &out), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_load(img, n, NULL, NULL), KVE_EINVAL);
    ASSERT_TRUE(out == (kve_bank *)buf);
    /* the policy API's own checks */
    kve_policy *p = NULL, *q = NULL, *pout = (kve_policy *)buf;
    ASSERT_OK(kve_policy_new("h2o:budget=40", NULL, &p));
    ASSERT_OK(kve_policy_new("h2o:budget=41", NULL, &q));
    ASSERT_STATUS(kve_policy_copy(p, q), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_copy(NULL, q), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_clone(NULL, &pout), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_clone(p, NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_save(NULL, NULL, 0, &got), KVE_EINVAL);
    ASSERT_STATUS(kve_policy_load(img, n, NULL, &pout), KVE_EINVAL);
    ASSERT_TRUE(pout == (kve_policy *)buf);
    ASSERT_OK(kve_policy_copy(p, p)); /* itself: nothing to do */
    /* the twin test of a policy: p's image after each refusal is its twin's */
    for (int32_t t = 0; t < 50; t++) {
        float w[64];
        size_t np = kve_policy_size(p);
        for (size_t i = 0; i < np; i++)
            w[i] = (float)((i * 5 + (size_t)t) % 7) / 16.0f;
        ASSERT_OK(kve_policy_step(p, t, np ? w : NULL, np));
    }
    kve_policy *ptwin = NULL;
    ASSERT_OK(kve_policy_clone(p, &ptwin));
    size_t pn = 0, pn2 = 0;
    uint8_t *pimg = policy_image(ptwin, &pn);
    uint8_t *pbuf = pimg ? malloc(pn) : NULL;
    ASSERT_TRUE(pimg != NULL && pbuf != NULL);
#define P_UNCHANGED(call, want)                                                                \
    do {                                                                                       \
        ASSERT_STATUS(call, want);                                                             \
        ASSERT_TRUE(kve_last_error()[0] != '\0');                                              \
        uint8_t *now_ = policy_image(p, &pn2);                                                 \
        ASSERT_TRUE(now_ && pn2 == pn && memcmp(now_, pimg, pn) == 0);                         \
        free(now_);                                                                            \
    } while (0)
    size_t gone = 77;
    P_UNCHANGED(kve_policy_copy(p, q), KVE_EINVAL);
    P_UNCHANGED(kve_policy_copy(q, p), KVE_EINVAL);
    P_UNCHANGED(kve_policy_remove(p, 9, 9, &gone), KVE_EINVAL);
    P_UNCHANGED(kve_policy_remove(p, 9, -4, &gone), KVE_EINVAL);
    ASSERT_EQ(gone, 77);
    memset(pbuf, 0xab, pn);
    got = 0;
    P_UNCHANGED(kve_policy_save(p, pbuf, pn - 1, &got), KVE_ERANGE);
    ASSERT_EQ(got, pn);
    for (size_t i = 0; i < pn; i++)
        if (pbuf[i] != 0xab)
            CHECK_FAIL_AT("a refused policy save wrote byte %zu", i);
    P_UNCHANGED(kve_policy_clone(p, NULL), KVE_EINVAL);
    memcpy(pbuf, pimg, pn);
    pbuf[pn / 2] ^= 4; /* a corrupt image (the checksum) */
    P_UNCHANGED(kve_policy_load(pbuf, pn, NULL, &pout), KVE_EINVAL);
    ASSERT_TRUE(pout == (kve_policy *)buf);
#undef P_UNCHANGED
    free(pbuf);
    free(pimg);
    kve_policy_free(ptwin);
    kve_policy_free(p);
    kve_policy_free(q);
#undef UNCHANGED
    ASSERT_TRUE(kve_bank_min_share(a) == 0.2 && kve_bank_min_share(NULL) == 0.0);
    free(buf);
    free(img);
    kve_bank_free(twin);
    fleet_free(&f);
}

/* ---- the image ---- */

/* A small policy in a fixed state. */
static kve_policy *golden_policy(void)
{
    kve_policy *p = NULL;
    if (kve_policy_new("h2o:budget=4,recent_window=1", NULL, &p) != KVE_OK)
        return NULL;
    static const float w[] = {1.0f, 0.25f, 0.75f, 0.5f, 0.125f, 0.375f};
    int32_t v[8];
    for (int32_t t = 0; t < 7; t++) {
        size_t n = kve_policy_size(p);
        if (kve_policy_step(p, 3 * t, n ? w : NULL, n) != KVE_OK ||
            kve_policy_evict(p, 4, v, 8, NULL) != KVE_OK)
            break;
    }
    return p;
}

/* docs/api.md's table, field by field, through the independent reader. */
static void test_image_layout(void)
{
    kve_policy *p = golden_policy();
    ASSERT_TRUE(p != NULL);
    size_t n = 0;
    uint8_t *img = policy_image(p, &n);
    ASSERT_TRUE(img != NULL);
    static const uint8_t magic[8] = {0x89, 'k', 'v', 'e', '\r', '\n', 0x1a, '\n'};
    ASSERT_TRUE(memcmp(img, magic, 8) == 0);
    img_hdr h;
    ASSERT_EQ(img_header(img, n, &h), 0);
    ASSERT_EQ(h.version, 1);
    ASSERT_EQ(h.kind, 1);
    ASSERT_U64_EQ(h.size, n);
    ASSERT_U64_EQ(h.n_heads, 1);
    ASSERT_U64_EQ(h.key_dim, 0);
    ASSERT_U64_EQ(h.share, 0);
    ASSERT_TRUE(h.min_share == 0.0);
    ASSERT_EQ(h.col[0], 8);
    ASSERT_EQ(h.col[1], 0);
    ASSERT_EQ(h.col[2], 0);
    ASSERT_STR_EQ(h.spec, "h2o:budget=4,recent_window=1");
    ASSERT_EQ(h.spec_len, strlen(h.spec));
    ASSERT_EQ(n, 72 + h.spec_len + 64 + 4 * 12 + 8);
    size_t at = img_head_at(img, &h, 0);
    ASSERT_U64_EQ(img_le(img + at, 8), 4);      /* size */
    ASSERT_U64_EQ(img_le(img + at + 8, 8), 6);  /* informative steps */
    ASSERT_U64_EQ(img_le(img + at + 16, 4), 18); /* last position */
    ASSERT_U64_EQ(img_le(img + at + 20, 4), 1);  /* flags */
    for (int k = 0; k < 5; k++)
        ASSERT_U64_EQ(img_le(img + at + 24 + 8 * k, 8), 0); /* seed, rng: h2o draws none */
    for (size_t i = 0; i < 4; i++)
        ASSERT_EQ((int32_t)img_le(img + at + 64 + 4 * i, 4), kve_policy_positions(p)[i]);
    ASSERT_U64_EQ(img_le(img + n - 8, 8), img_fnv1a(img, n - 8));
    /* The committed bytes: this state's image on every machine, path and
     * release that reads version 1. Regenerate only with a new version. */
    static const char golden[] =
        "896b76650d0a1a0a0100000001000000dc000000000000000100000000000000" /* .. n_heads */
        "000000000000000000000000000000000000000000000000" /* key_dim, share, min_share */
        "0800000000000000000000001c000000" /* column bytes, spec length */
        "68326f3a6275646765743d342c726563656e745f77696e646f773d31" /* spec */
        "040000000000000006000000000000001200000001000000" /* size, steps, last_pos, flags */
        "0000000000000000"                                                 /* seed */
        "0000000000000000000000000000000000000000000000000000000000000000" /* rng */
        "00000000030000000600000012000000" /* positions 0, 3, 6, 18 */
        "0000000000001840000000000000f43f00000000000008400000000000000000" /* scores 6 1.25 3 0 */
        "1ca3c0142092e9ca" /* checksum */;
    char hex[2 * 400 + 1];
    ASSERT_TRUE(n <= 400);
    for (size_t i = 0; i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", img[i]);
    if (strcmp(hex, golden) != 0)
        fprintf(stderr, "image now:\n%s\n", hex);
    ASSERT_STR_EQ(hex, golden);
    /* byte by byte and column by column give the same bytes, and read back */
    kve__image_force_bytewise(true);
    size_t n2 = 0;
    uint8_t *img2 = policy_image(p, &n2);
    kve_policy *q = NULL;
    kve_status st = kve_policy_load(img, n, NULL, &q);
    kve__image_force_bytewise(false);
    ASSERT_TRUE(img2 && n2 == n && memcmp(img, img2, n) == 0);
    ASSERT_OK(st);
    size_t n3 = 0;
    uint8_t *img3 = policy_image(q, &n3);
    ASSERT_TRUE(img3 && n3 == n && memcmp(img, img3, n) == 0);
    /* the same through a bank with keys, shared groups and policy columns */
    static const char *const specs[] = {"keydiff:budget=6,recent_window=1",
                                        "h2o_mean:budget=6,recent_window=1",
                                        "scissorhands:budget=6,recent_window=1,history=5",
                                        "random:budget=6,recent_window=1"};
    for (size_t i = 0; i < N_OF(specs); i++) {
        fleet f;
        ASSERT_TRUE(fleet_init(&f, specs[i], 4, i == 0 ? 5 : 0, i < 3 ? 2 : 0, check_seed + i));
        for (int s = 0; s < 80; s++)
            ASSERT_TRUE(fleet_op(&f, 0));
        size_t a = 0, b = 0;
        uint8_t *fast = bank_image(f.b[0], &a);
        kve__image_force_bytewise(true);
        uint8_t *slow = bank_image(f.b[0], &b);
        kve_bank *back = reload(f.b[0], NULL);
        kve__image_force_bytewise(false);
        ASSERT_TRUE(fast && slow && a == b && memcmp(fast, slow, a) == 0);
        ASSERT_TRUE(back && same_image(back, f.b[0]));
        /* the independent reader finds every head's state */
        img_hdr bh;
        ASSERT_EQ(img_header(fast, a, &bh), 0);
        ASSERT_EQ(bh.kind, 2);
        ASSERT_U64_EQ(bh.n_heads, 4);
        ASSERT_EQ(img_head_at(fast, &bh, 4) + 8, a);
        for (size_t hd = 0; hd < 4; hd++) {
            ref_policy *r = img_ref(fast, &bh, hd);
            ASSERT_TRUE(r != NULL);
            ASSERT_EQ(r->n, kve_bank_size(f.b[0], hd));
            for (size_t j = 0; j < r->n; j++)
                ASSERT_EQ(r->slot[j].pos, kve_bank_positions(f.b[0], hd)[j]);
            ref_free(r);
        }
        kve_bank_free(back);
        free(fast);
        free(slow);
        fleet_free(&f);
    }
    free(img);
    free(img2);
    free(img3);
    kve_policy_free(p);
    kve_policy_free(q);
}

/* An image with a field changed (and resealed, unless the test is of the
 * checksum) is refused with KVE_EINVAL and a message naming it. */
static void refused(const uint8_t *img, size_t n, int policy, const char *says, int line)
{
    kve_policy *p = (kve_policy *)&line;
    kve_bank *b = (kve_bank *)&line;
    kve_status st = policy ? kve_policy_load(img, n, NULL, &p) : kve_bank_load(img, n, NULL, &b);
    if (st != KVE_EINVAL || !strstr(kve_last_error(), says) ||
        p != (kve_policy *)&line || b != (kve_bank *)&line) {
        if (st == KVE_OK)
            policy ? kve_policy_free(p) : kve_bank_free(b);
        fprintf(stderr, "line %d: got %s \"%s\", want EINVAL naming \"%s\"\n", line,
                kve_status_name(st), kve_last_error(), says);
        check_failures++;
    }
}

typedef struct edit {
    size_t at;     /* offset; (size_t)-k: k bytes before the checksum */
    int width;     /* bytes of the value, 0: truncate to `value` bytes */
    uint64_t value;
    int reseal;
    const char *says;
} edit;

static void apply(const uint8_t *img, size_t n, int policy, const edit *e, int line)
{
    uint8_t *m = malloc(n + 16);
    if (!m)
        abort();
    memcpy(m, img, n);
    size_t len = n;
    if (e->width == 0) {
        len = (size_t)e->value;
        if (len > n) {
            memset(m + n, 0, len - n);
            memmove(m + len - 8, m + n - 8, 8);
        }
    } else {
        size_t at = e->at > n ? n - 8 - (SIZE_MAX - e->at + 1) : e->at;
        img_put(m + at, e->value, e->width);
    }
    if (e->reseal)
        img_reseal(m, len);
    refused(m, len, policy, e->says, line);
    free(m);
}

#define BACK(k) ((size_t)0 - (k))

static void test_image_refusals(void)
{
    kve_policy *p = golden_policy();
    size_t n = 0;
    uint8_t *img = policy_image(p, &n);
    ASSERT_TRUE(img != NULL);
    img_hdr h;
    ASSERT_EQ(img_header(img, n, &h), 0);
    const size_t head = img_head_at(img, &h, 0), cols = head + 64;
    const uint64_t nan_bits = 0x7ff8000000000000u, neg_one = 0xbff0000000000000u;
    const edit edits[] = {
        {0, 1, 0x88, 1, "magic"},
        {8, 4, 3, 1, "version 3"},
        {8, 4, 0, 1, "version 0"},
        {12, 4, 2, 1, "kve_bank_load"},
        {12, 4, 7, 1, "kind 7"},
        {16, 8, 12345, 0, "size 12345"},
        {40, 1, 0x55, 0, "checksum"},
        {BACK(1), 1, 0x3f, 0, "checksum"},
        {24, 8, 2, 1, "1 head"},
        {40, 8, 1, 1, "share 0"},
        {48, 8, 0x3fd0000000000000u, 1, "min_share 0"},
        {32, 8, 70000, 1, "key_dim 70000"},
        {56, 4, 4, 1, "column score"},
        {60, 4, 8, 1, "column extra0"},
        {64, 4, 8, 1, "column extra1"},
        {68, 4, 0, 1, "spec length 0"},
        {68, 4, 400, 1, "spec length 400"},
        {72, 1, 'x', 1, "unknown policy"},
        {72 + 4, 1, 'B', 1, "spec"},
        {72 + 5, 1, 0, 1, "NUL"},
        {head, 8, 5, 1, "positions need more"},
        {head, 8, 3, 1, "after the last head"},
        {head + 20, 4, 2, 1, "flags"},
        {head + 20, 4, 0, 1, "no position was admitted"},
        {head + 16, 4, 0xffffffffu, 1, "last_pos -1"},
        {head + 16, 4, 10, 1, "past last_pos"},
        {head + 24, 8, 1, 1, "seed and rng must be 0"},
        {head + 40, 8, 1, 1, "seed and rng must be 0"},
        {cols, 4, 0xffffffffu, 1, "pos[0] = -1 is negative"},
        {cols + 4, 4, 0, 1, "pos[1] = 0 is not greater than pos[0]"},
        {cols + 16, 8, nan_bits, 1, "score[0] is NaN"},
        {cols + 24, 8, 0x7ff0000000000000u, 1, "score[1] is infinite"},
        {cols + 16, 8, neg_one, 1, "score[0] = -1 is negative"},
        {0, 0, 20, 0, "truncated"},
        {0, 0, 100, 1, "spec length"},
        {0, 0, 160, 1, "heads need more"},
    };
    for (size_t i = 0; i < N_OF(edits); i++)
        apply(img, n, 1, &edits[i], (int)(1000 + i));
    /* a spec that is valid but not canonical (its keys out of order) */
    uint8_t *nc = malloc(n);
    ASSERT_TRUE(nc != NULL);
    memcpy(nc, img, n);
    memcpy(nc + 72, "h2o:recent_window=1,budget=4", 28);
    img_reseal(nc, n);
    refused(nc, n, 1, "not canonical", 1999);
    free(nc);
    /* a longer image with trailing bytes */
    const edit longer = {0, 0, 0, 1, "after the last head"};
    edit e = longer;
    e.value = n + 8;
    apply(img, n, 1, &e, 2000);
    /* what the loaded policy's own checks refuse */
    static const struct {
        const char *spec;
        size_t dim;
        int col; /* 0: score, 1: extra0, 2: extra1 */
        int width;
        uint64_t value;
        const char *says;
    } policy_edits[] = {
        {"knorm:budget=6", 4, 0, 8, 0x3ff0000000000000u, "positive"},
        {"keydiff:budget=6", 4, 1, 4, 0x3f800000u, "not a unit key"},
        {"keydiff:budget=6", 4, 1, 4, 0x7fc00000u, "not a unit key"},
        {"h2o_mean:budget=6,recent_window=1", 0, 0, 8, 0x3fe0000000000001u, "sum / steps"},
        {"h2o_mean:budget=6,recent_window=1", 0, 1, 8, neg_one, "sum[0]"},
        {"h2o_mean:budget=6,recent_window=1", 0, 2, 4, 0xfffff000u, "birth[0]"},
        {"scissorhands:budget=6,recent_window=1,history=3", 0, 1, 8, 0xf0, "older than history"},
        {"scissorhands:budget=6,recent_window=1,history=3", 0, 1, 8, 0x7, "holds 3 votes"},
        {"scissorhands:budget=6,recent_window=1", 0, 0, 8, 0x3fe0000000000000u, "a count"},
        {"tova:budget=6", 0, 0, 8, neg_one, "attention received"},
        {"random:budget=6", 0, -1, 8, 0, "all zero"},
    };
    for (size_t i = 0; i < N_OF(policy_edits); i++) {
        kve_policy_options o = kve_policy_default_options();
        o.key_dim = policy_edits[i].dim;
        kve_rng r;
        kve_rng_seed(&r, i);
        kve_policy *q = NULL;
        ASSERT_OK(kve_policy_new_ex(policy_edits[i].spec, &r, &o, &q));
        float w[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.5f, 0.5f, 0.5f, 0.5f};
        float key[4] = {1.0f, -2.0f, 0.5f, 3.0f};
        for (int32_t t = 0; t < 5; t++) {
            size_t sz = kve_policy_size(q);
            ASSERT_OK(kve_policy_step_keys(q, t, o.key_dim || !sz ? NULL : w, sz,
                                           o.key_dim ? key : NULL));
        }
        size_t qn = 0;
        uint8_t *qi = policy_image(q, &qn);
        img_hdr qh;
        ASSERT_EQ(img_header(qi, qn, &qh), 0);
        size_t qhead = img_head_at(qi, &qh, 0), sz = kve_policy_size(q);
        size_t at = qhead + 64 + 4 * sz;
        for (int c = 0; c < policy_edits[i].col; c++)
            at += qh.col[c] * sz;
        if (policy_edits[i].col < 0) { /* the generator: all four words zero */
            uint8_t *m = malloc(qn);
            ASSERT_TRUE(m != NULL);
            memcpy(m, qi, qn);
            memset(m + qhead + 32, 0, 32);
            img_reseal(m, qn);
            refused(m, qn, 1, policy_edits[i].says, (int)(3000 + i));
            free(m);
        } else {
            edit pe = {at, policy_edits[i].width, policy_edits[i].value, 1,
                       policy_edits[i].says};
            apply(qi, qn, 1, &pe, (int)(3000 + i));
        }
        /* and the same image, unedited, loads */
        kve_policy *back = NULL;
        ASSERT_OK(kve_policy_load(qi, qn, NULL, &back));
        kve_policy_free(back);
        free(qi);
        kve_policy_free(q);
    }
    /* what a bank's header may not say */
    kve_bank_options bo = kve_bank_default_options();
    bo.share = 2;
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=4,recent_window=1", 4, NULL, &bo, &b));
    ASSERT_OK(kve_bank_step(b, 0, NULL, 0));
    size_t bn = 0;
    uint8_t *bi = bank_image(b, &bn);
    const edit bank_edits[] = {
        {12, 4, 1, 1, "kve_policy_load"},
        {24, 8, 0, 1, "n_heads must be at least 1"},
        {24, 8, 1000, 1, "1000 heads need more"},
        {40, 8, 3, 1, "does not divide"},
        {40, 8, 9, 1, "share 9 does not divide"},
        {48, 8, nan_bits, 1, "min_share"},
        {48, 8, 0x4000000000000000u, 1, "min_share 2"},
    };
    for (size_t i = 0; i < N_OF(bank_edits); i++)
        apply(bi, bn, 0, &bank_edits[i], (int)(4000 + i));
    img_hdr bh;
    ASSERT_EQ(img_header(bi, bn, &bh), 0);
    edit he = {img_head_at(bi, &bh, 2) + 20, 4, 9, 1, "head 2: flags"};
    apply(bi, bn, 0, &he, 4100);
    kve_bank_free(b);
    free(bi);
    /* a head's record cut off after a longer head */
    ASSERT_OK(kve_bank_new("h2o:budget=40", 2, NULL, &b));
    for (int32_t t = 0; t < 10; t++)
        ASSERT_OK(kve_bank_step_range(b, 0, 1, t, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0));
    bi = bank_image(b, &bn);
    ASSERT_EQ(img_header(bi, bn, &bh), 0);
    edit cut = {0, 0, img_head_at(bi, &bh, 1) + 10 + 8, 1, "head 1: its record is cut off"};
    apply(bi, bn, 0, &cut, 4150);
    kve_bank_free(b);
    free(bi);
    /* a policy that reads keys, with none */
    kve_policy *kn = NULL;
    kve_policy_options ko = kve_policy_default_options();
    ko.key_dim = 2;
    ASSERT_OK(kve_policy_new_ex("knorm:budget=3", NULL, &ko, &kn));
    size_t kn_n = 0;
    uint8_t *kni = policy_image(kn, &kn_n);
    edit ke = {32, 8, 0, 1, "reads keys"};
    apply(kni, kn_n, 1, &ke, 4200);
    free(kni);
    kve_policy_free(kn);
    free(img);
    kve_policy_free(p);
}

/* ---- sizes ---- */

/* The image of the committed model's bank (4 layers x 2 KV heads) under
 * h2o at budget 102, after decoding a stretch of held-out text; and of 32 x 8
 * heads of h2o at 4Ki, each at its budget. docs/api.md states both. */
static void test_image_sizes(void)
{
    const char *src = getenv("KVE_SOURCE_DIR");
    char path[1024], tpath[1024], hpath[1024];
    snprintf(path, sizeof path, "%s/models/kjv.bin", src ? src : ".");
    snprintf(tpath, sizeof tpath, "%s/models/tokenizer.bin", src ? src : ".");
    snprintf(hpath, sizeof hpath, "%s/models/heldout.txt", src ? src : ".");
    lm_model *m = NULL;
    lm_tokenizer *tok = NULL;
    ASSERT_OK(lm_model_open(path, NULL, &m));
    ASSERT_OK(lm_tokenizer_open(tpath, NULL, &tok));
    char *text = NULL;
    size_t text_n = 0;
    ASSERT_OK(lm_read_file(NULL, hpath, &text, &text_n));
    size_t len = text_n < 1000 ? text_n : 1000, nt = 0;
    int32_t *tokens = malloc((len + 1) * sizeof *tokens);
    ASSERT_TRUE(tokens != NULL);
    ASSERT_OK(lm_encode(tok, text, len, tokens, len + 1, &nt));
    lm_options o = {0};
    o.policy = "h2o";
    o.budget = 102;
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &o, &s));
    size_t steps = nt < 120 ? nt : 120;
    for (size_t t = 0; t < steps; t++)
        ASSERT_OK(lm_forward(s, tokens[t]));
    ASSERT_TRUE(steps > 102);
    size_t size = 0;
    ASSERT_OK(kve_bank_save(s->bank, NULL, 0, &size));
    const char *spec = kve_bank_spec(s->bank);
    size_t heads = kve_bank_heads(s->bank);
    printf("image of the committed model's bank (%zu heads, \"%s\", after %zu tokens): %zu "
           "bytes\n",
           heads, spec, steps, size);
    ASSERT_EQ(heads, 8);
    ASSERT_STR_EQ(spec, "h2o:budget=102,recent_window=32");
    ASSERT_EQ(size, 72 + strlen(spec) + 8 + heads * (64 + 102 * 12));
    kve_bank *loaded = reload(s->bank, NULL);
    ASSERT_TRUE(loaded && same_image(loaded, s->bank));
    kve_bank_free(loaded);
    lm_state_free(s);
    lm_model_free(m);
    lm_tokenizer_free(tok);
    lm_free(NULL, text);
    free(tokens);

    /* 32 layers x 8 KV heads at 4Ki, every head at its budget: each head
     * filled by the prefill of a 4096-token prompt (SnapKV reading one row,
     * the cheapest: an image's size depends on the kept counts, not on the
     * scores), then one step and an eviction to the budget */
    kve_bank *big = NULL;
    ASSERT_OK(kve_bank_new("h2o:budget=4096", 256, NULL, &big));
    kve_prefill_options po = kve_prefill_default_options();
    po.method = KVE_PREFILL_SNAPKV;
    po.window = 1;
    po.kernel = 1;
    static float row[4096];
    for (size_t i = 0; i < 4096; i++)
        row[i] = 1.0f / 4096.0f;
    for (size_t hd = 0; hd < 256; hd++)
        ASSERT_OK(kve_bank_prefill(big, hd, 1, 4096, 4096, row, 4096, 1, KVE_REDUCE_MEAN, &po));
    ASSERT_OK(kve_bank_step(big, 4096, NULL, 0));
    ASSERT_OK(kve_bank_evict(big, 4096, victims[0], 1, NULL));
    for (size_t hd = 0; hd < 256; hd++)
        ASSERT_EQ(kve_bank_size(big, hd), 4096);
    size_t big_size = 0;
    ASSERT_OK(kve_bank_save(big, NULL, 0, &big_size));
    printf("image of 256 heads of \"%s\", each at its budget: %zu bytes\n", kve_bank_spec(big),
           big_size);
    ASSERT_EQ(big_size, 72 + strlen(kve_bank_spec(big)) + 8 + 256 * (64 + 4096 * 12));
    kve_bank_free(big);
    /* docs/api.md quotes both */
    char api[1024], want[64];
    snprintf(api, sizeof api, "%s/docs/api.md", src ? src : ".");
    char *doc = NULL;
    size_t doc_n = 0;
    ASSERT_OK(lm_read_file(NULL, api, &doc, &doc_n));
    snprintf(want, sizeof want, "%zu bytes", size);
    ASSERT_CONTAINS(doc, want);
    snprintf(want, sizeof want, "%zu bytes", big_size);
    ASSERT_CONTAINS(doc, want);
    lm_free(NULL, doc);
}

/* ---- the methods' state (issue 20 x issue 18) ---- */

/* A score rule with two doubles of state a slot that reads the value
 * norms: a decayed sum and a count, whatever order of calls. */
static kve_status state_rule(void *user, const kve_score_step *s)
{
    (void)user;
    for (size_t i = 0; i < s->n; i++) {
        double *st = s->new_state + i * 2;
        st[0] = 0.5 * st[0] + (double)s->attn[i];
        st[1] += 1.0;
        s->new_score[i] = st[0] / st[1] * (1.0 + s->vnorm[i]);
    }
    return KVE_OK;
}

/* Forks, rewinds, resets and images of the state the methods added: the
 * value norms (and raw scores) of vnorm=1, expected_attention's keys,
 * counters, statistics and query ring (every step, and every few steps),
 * a registered score rule's per-slot state. Each spec as a bank of 3 heads
 * and a shared bank; its image names the rule, and loads only while a rule
 * of that name and layout is registered. */
static void test_methods_state(void)
{
    kve_score_rule rule = kve_score_rule_default();
    rule.name = "state_rule";
    rule.observe = state_rule;
    rule.state = 2;
    rule.values = 1;
    rule.recent_window = 2;
    ASSERT_OK(kve_score_rule_register(&rule));
    static const char *const specs[] = {
        "h2o:budget=12,recent_window=2,vnorm=1",
        "tova:budget=9,recent_window=0,vnorm=1",
        "scissorhands:budget=14,recent_window=1,history=6,vnorm=1",
        "h2o_mean:budget=10,recent_window=1,vnorm=1",
        "h2o:budget=16,recent_window=2,block=4,vnorm=1",
        "expected_attention:budget=12,n_sink=2,n_queries=7",
        "expected_attention:budget=10,recent_window=2,n_sink=1,interval=5,n_queries=9,"
        "use_covariance=0,epsilon=0.25",
        "expected_attention:budget=9,n_sink=0,interval=3,n_queries=40,vnorm=0",
        "state_rule:budget=11",
        "state_rule:budget=8,recent_window=0,vnorm=1",
    };
    for (size_t i = 0; i < N_OF(specs); i++) {
        const int ea = strncmp(specs[i], "expected", 8) == 0;
        const size_t dim = ea ? 4 + i % 3 : 0;
        g_vdim = 3;
        g_qg = ea ? 1 + i % 3 : 0;
        forks_case(specs[i], 3, dim, 0, check_seed + 900 + i);
        if (!ea && !strstr(specs[i], "block")) /* a shared budget compares scores */
            forks_case(specs[i], 6, dim, 3, check_seed + 920 + i);
        reset_case(specs[i], dim, 2, 0, check_seed + 940 + i);
        /* the image and the options: a bank of other facts cannot take the state */
        fleet f;
        ASSERT_TRUE(fleet_init(&f, specs[i], 2, dim, 0, check_seed + 960 + i));
        for (int s = 0; s < 40; s++)
            ASSERT_TRUE(fleet_op(&f, 0));
        g_vdim = 4;
        f.b[1] = new_bank(specs[i], 2, dim, 0, 1, NULL);
        ASSERT_TRUE(f.b[1] != NULL);
        ASSERT_STATUS(kve_bank_copy(f.b[1], f.b[0]), KVE_EINVAL);
        ASSERT_TRUE(strstr(kve_last_error(), "value_dim is 4, src's 3") != NULL);
        f.n = 2;
        fleet_free(&f);
    }
    /* an image that names a rule: refused, naming it, while none is
     * registered; loaded again once it is */
    g_vdim = 3;
    g_qg = 0;
    kve_bank *b = new_bank("state_rule:budget=11", 2, 0, 0, 5, NULL);
    ASSERT_TRUE(b != NULL);
    size_t n = 0;
    uint8_t *img = bank_image(b, &n);
    ASSERT_TRUE(img != NULL);
    ASSERT_STATUS(kve_score_rule_unregister("state_rule"), KVE_EINVAL); /* b holds it */
    kve_bank_free(b);
    ASSERT_OK(kve_score_rule_unregister("state_rule"));
    kve_bank *c = NULL;
    ASSERT_STATUS(kve_bank_load(img, n, NULL, &c), KVE_EINVAL);
    ASSERT_TRUE(c == NULL);
    ASSERT_TRUE(strstr(kve_last_error(), "unknown policy \"state_rule\"") != NULL);
    ASSERT_TRUE(strstr(kve_last_error(), "kve_score_rule_register") != NULL);
    rule.state = 1; /* another layout under the name: refused by its column */
    ASSERT_OK(kve_score_rule_register(&rule));
    ASSERT_STATUS(kve_bank_load(img, n, NULL, &c), KVE_EINVAL);
    ASSERT_TRUE(strstr(kve_last_error(), "column extra0 holds 16 bytes") != NULL);
    ASSERT_OK(kve_score_rule_unregister("state_rule"));
    rule.state = 2;
    ASSERT_OK(kve_score_rule_register(&rule));
    ASSERT_OK(kve_bank_load(img, n, NULL, &c));
    ASSERT_STATUS(kve_score_rule_unregister("state_rule"), KVE_EINVAL); /* the loaded one */
    kve_bank_free(c);
    ASSERT_OK(kve_score_rule_unregister("state_rule"));
    free(img);
    g_vdim = g_qg = 0;
}

/* ---- what a load will allocate (kve_image_load_bytes) ---- */

/* Saves, asks, loads through a counting allocator: the answer is the
 * load's peak to the byte, and the load's own. */
static void load_bytes_of(const uint8_t *img, size_t n, int bank, size_t *out)
{
    size_t need = 0;
    ASSERT_OK(kve_image_load_bytes(img, n, &need));
    talloc ta;
    talloc_init(&ta);
    if (bank) {
        kve_bank *b = NULL;
        ASSERT_OK(kve_bank_load(img, n, &ta.a, &b));
        kve_bank_free(b);
    } else {
        kve_policy *p = NULL;
        ASSERT_OK(kve_policy_load(img, n, &ta.a, &p));
        kve_policy_free(p);
    }
    ASSERT_EQ(ta.peak, need);
    talloc_check_empty(&ta);
    *out = need;
}

/* An image whose spec is replaced by `spec` (resealed): what a forger does
 * to a small image. */
static void with_spec(const uint8_t *img, size_t n, const char *spec, uint8_t *out, size_t cap,
                      size_t *out_n)
{
    img_hdr h;
    ASSERT_TRUE(img_header(img, n, &h) == 0);
    const size_t old = (size_t)img_le(img + 68, 4), len = strlen(spec);
    const size_t m = n - old + len;
    ASSERT_TRUE(m <= cap);
    memcpy(out, img, IMG_HEADER);
    memcpy(out + IMG_HEADER, spec, len);
    memcpy(out + IMG_HEADER + len, img + IMG_HEADER + old, n - IMG_HEADER - old);
    img_put(out + 68, len, 4);
    img_reseal(out, m);
    *out_n = m;
}

/* Before: nothing told a caller what an image would make load allocate; a
 * 179-byte policy image asked for 218 MB, a 64 KB bank image for 67 GB
 * (refused only by the allocation's failure). Now the answer comes before
 * the load, exact, for every layout: a policy, a grown policy, a bank, a
 * shared bank that grew, keydiff's keys and scratch, same positions. */
static void test_image_load_bytes(void)
{
    static uint8_t img[1 << 16], forged[1 << 16];
    size_t n = 0;
    float w[512];
    for (size_t i = 0; i < 512; i++)
        w[i] = 1.0f / 512.0f;
    /* a policy: as made, then grown past its slots */
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("h2o:budget=64,recent_window=8", NULL, &p));
    for (int32_t t = 0; t < 10; t++)
        ASSERT_OK(kve_policy_step(p, t, t ? w : NULL, (size_t)t));
    ASSERT_OK(kve_policy_save(p, img, sizeof img, &n));
    size_t small = 0, large = 0;
    load_bytes_of(img, n, 0, &small);
    for (int32_t t = 10; t < 300; t++)
        ASSERT_OK(kve_policy_step(p, t, w, kve_policy_size(p) < 512 ? kve_policy_size(p) : 512));
    ASSERT_OK(kve_policy_save(p, img, sizeof img, &n));
    load_bytes_of(img, n, 0, &large);
    ASSERT_TRUE(large > small);
    kve_policy_free(p);
    /* the forger's image: one spec changed, 216 MB asked, nothing allocated to say so */
    ASSERT_OK(kve_policy_new("h2o:budget=64,recent_window=8", NULL, &p));
    ASSERT_OK(kve_policy_save(p, img, sizeof img, &n));
    kve_policy_free(p);
    size_t m = 0;
    with_spec(img, n, "h2o:budget=9000000,recent_window=8", forged, sizeof forged, &m);
    size_t need = 0;
    ASSERT_OK(kve_image_load_bytes(forged, m, &need));
    talloc ta; /* what building that policy takes, counted */
    talloc_init(&ta);
    kve_policy_options po = kve_policy_default_options();
    po.allocator = &ta.a;
    kve_policy *probe = NULL;
    ASSERT_OK(kve_policy_new_ex("h2o:budget=9000000,recent_window=8", NULL, &po, &probe));
    ASSERT_EQ(need, ta.peak);
    kve_policy_free(probe);
    talloc_check_empty(&ta);
    /* kvevict.h's example: a 170-odd-byte image, 117 MB */
    ASSERT_EQ(m, 178);
    ASSERT_EQ(need / 1000000, 117);
    /* banks: plain, shared and grown, keydiff, same positions */
    const char *specs[] = {"h2o:budget=16,recent_window=2", "tova:budget=16",
                           "keydiff:budget=16", "h2o:budget=16,recent_window=2"};
    for (int k = 0; k < 4; k++) {
        kve_bank_options o = kve_bank_default_options();
        o.share = k == 1 ? 2 : 0;
        o.key_dim = k == 2 ? 8 : 0;
        o.same_positions = k == 3;
        kve_bank *b = NULL;
        ASSERT_OK(kve_bank_new_ex(specs[k], 4, NULL, &o, &b));
        float kk[4 * 8];
        for (int32_t t = 0; t < 60; t++) {
            for (size_t i = 0; i < 4 * 8; i++)
                kk[i] = (float)((i * 7 + (size_t)t * 3) % 11) / 11.0f - 0.4f;
            size_t kept = kve_bank_size(b, 0);
            static float rr[4 * 64];
            for (size_t h = 0; h < 4; h++)
                for (size_t i = 0; i < 64; i++)
                    rr[h * 64 + i] = kept ? 1.0f / (float)kept : 0.0f;
            ASSERT_OK(kve_bank_step_range(b, 0, 4, t, kept ? rr : NULL, 64, 1,
                                          KVE_REDUCE_MEAN, k == 2 ? kk : NULL, 8));
            if (t % 20 == 19 && k != 1) { /* the shared bank grows: never evicted */
                int32_t v[4 * 64];
                ASSERT_OK(kve_bank_evict(b, 16, v, 64, NULL));
            }
        }
        ASSERT_OK(kve_bank_save(b, img, sizeof img, &n));
        size_t got = 0;
        load_bytes_of(img, n, 1, &got);
        kve_bank_free(b);
    }
    /* refusals: load's own messages, nothing allocated */
    ASSERT_STATUS(kve_image_load_bytes(img, n - 1, &need), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "image: size");
    ASSERT_STATUS(kve_image_load_bytes(img, 10, &need), KVE_EINVAL);
    ASSERT_STATUS(kve_image_load_bytes(NULL, n, &need), KVE_EINVAL);
    ASSERT_STATUS(kve_image_load_bytes(img, n, NULL), KVE_EINVAL);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_remove_contract);
    RUN(test_rewind_is_not_undo);
    RUN(test_refusals_change_nothing);
    RUN(test_image_layout);
    RUN(test_image_refusals);
    RUN(test_memory);
    RUN(test_copy_allocates_nothing);
    RUN(test_forks_continue);
    RUN(test_forks_shared);
    RUN(test_forks_gqa_prefill);
    RUN(test_isa_paths);
    RUN(test_remove_reference);
    RUN(test_shared_remove_reference);
    RUN(test_reset_replays);
    RUN(test_image_sizes);
    RUN(test_methods_state);
    RUN(test_image_load_bytes);
    return CHECK_DONE();
}
