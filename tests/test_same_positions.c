/* SPDX-License-Identifier: MIT */
/*
 * test_same_positions.c - banks built with same_positions = 1 (kvevict.h,
 * "Same positions") against naive models that decide once for every head:
 *  - every policy of the workload (and pages) against H reference heads
 *    (reference.h) evicted together by ref_evict_same: steps range by range
 *    (a layer at a time), NULL rows, keys, steps without evicts (several
 *    victims later); after every call each head's victims, counts and kept
 *    set agree, and now and then every head's state, score bits included
 *    (through its image, state_image.h);
 *  - expected_attention and a registered score rule, which the reference
 *    does not model, against a plain bank of the same options whose heads
 *    are cut by kve_bank_remove where the combined score of their images
 *    says;
 *  - prefill of the whole bank against per-head kve_prefill_scores added in
 *    head order and a sort;
 *  - the lifecycle (clone, copy, save, load, remove, reset) continuing bit
 *    for bit, mid-round included; version 3 images and their refusals;
 *  - refusals (options, partial evictions, a step past a position some heads
 *    have not admitted), each leaving the bank as it was;
 *  - no allocation in the steady state (a counting allocator).
 * Deterministic per seed (printed; replay with argv[1]).
 */
#include "check.h"
#include "kvevict.h"
#include "reference.h"
#include "state_image.h"
#include "test_allocator.h"
#include "workload.h"

enum { MAXH = 6, MAXN = 700, STEPS = 420, MAXD = 40 };

/* A same_positions bank and the reference heads it must equal. */
typedef struct sp {
    kve_bank *b;
    ref_policy *r[MAXH];
    size_t heads, budget, dim;
    int32_t pos;   /* the last position stepped */
    kve_rng g;     /* the workload */
    float pool[4]; /* repeated weights: ties */
    float key_pool[4 * MAXD];
} sp;

static float rows[MAXH * MAXN], keys[MAXH * (MAXD + 3)];
static int32_t victims[MAXH * MAXN], ref_victims[MAXH * MAXN];
static size_t counts[MAXH], ref_counts[MAXH];

static int sp_new(sp *t, const char *spec, size_t heads, size_t dim, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    kve_rng rb, rr;
    kve_rng_seed(&rb, seed);
    kve_rng_seed(&rr, seed);
    t->heads = heads;
    t->dim = dim;
    t->pos = -1;
    kve_rng_seed(&t->g, seed * 7 + 3);
    for (int k = 0; k < 4; k++)
        t->pool[k] = (float)(k + 1) / 8.0f;
    for (size_t j = 0; j < 4 * dim; j++)
        t->key_pool[j] = (float)kve_rng_uniform(&t->g) - 0.5f;
    kve_bank_options o = kve_bank_default_options();
    o.key_dim = dim;
    o.same_positions = 1;
    if (kve_bank_new_ex(spec, heads, &rb, &o, &t->b) != KVE_OK) {
        fprintf(stderr, "%s: %s\n", spec, kve_last_error());
        return 0;
    }
    for (size_t h = 0; h < heads; h++)
        if (!(t->r[h] = ref_new_keys(kve_bank_spec(t->b), &rr, dim)))
            return 0;
    t->budget = kve_bank_budget(t->b);
    return kve_bank_same_positions(t->b) == 1 && memcmp(&rb, &rr, sizeof rb) == 0;
}

static void sp_free(sp *t)
{
    kve_bank_free(t->b);
    for (size_t h = 0; h < t->heads; h++)
        ref_free(t->r[h]);
}

/* Every head keeps its reference's positions (and so every other head's). */
static int sp_same(const sp *t, const char *when)
{
    for (size_t h = 0; h < t->heads; h++) {
        size_t n = kve_bank_size(t->b, h);
        const int32_t *p = kve_bank_positions(t->b, h);
        int ok = n == t->r[h]->n;
        for (size_t i = 0; ok && i < n; i++)
            ok = p[i] == t->r[h]->slot[i].pos;
        if (!ok) {
            fprintf(stderr, "%s: %s: head %zu keeps %zu positions, its reference %zu\n",
                    kve_bank_spec(t->b), when, h, n, t->r[h]->n);
            return 0;
        }
    }
    return 1;
}

/* Every head's state, score bits included, equals its reference's: the
 * image read back by the second reader. */
static int sp_same_state(const sp *t)
{
    size_t n = 0;
    if (kve_bank_save(t->b, NULL, 0, &n) != KVE_OK)
        return 0;
    uint8_t *img = malloc(n);
    img_hdr hd;
    int ok = img && kve_bank_save(t->b, img, n, &n) == KVE_OK && img_header(img, n, &hd) == 0 &&
             hd.version == 3 && hd.flags == 1;
    for (size_t h = 0; ok && h < t->heads; h++) {
        ref_policy *back = img_ref(img, &hd, h);
        ok = back && ref_same(back, t->r[h]) == 0;
        if (!ok)
            fprintf(stderr, "%s: head %zu's state differs from its reference\n",
                    kve_bank_spec(t->b), h);
        ref_free(back);
    }
    free(img);
    return ok;
}

/* Steps heads [first, first + count) at t->pos: rows random (or NULL), keys
 * when the bank takes them; the references with the same. */
static int sp_step(sp *t, size_t first, size_t count, int with_attn)
{
    kve_rng *g = &t->g;
    size_t ld = kve_bank_size(t->b, first) + (size_t)kve_rng_below(g, 3);
    for (size_t j = 0; j < count; j++) {
        size_t n = kve_bank_size(t->b, first + j);
        for (size_t i = 0; i < ld; i++)
            rows[j * ld + i] = i < n ? random_weight(g, t->pool, n) : NAN;
    }
    size_t ldk = t->dim + (size_t)kve_rng_below(g, 3);
    for (size_t j = 0; j < count; j++)
        random_key(g, t->key_pool, t->dim, keys + j * ldk);
    const float *attn = with_attn ? rows : NULL, *k = t->dim ? keys : NULL;
    kve_status st = kve_bank_step_range(t->b, first, count, t->pos, attn, ld, 1,
                                        KVE_REDUCE_MEAN, k, ldk);
    if (st != KVE_OK) {
        fprintf(stderr, "%s: step: %s\n", kve_bank_spec(t->b), kve_last_error());
        return 0;
    }
    for (size_t j = 0; j < count; j++) {
        ref_policy *r = t->r[first + j];
        if (ref_step_keys(r, t->pos, attn ? rows + j * ld : NULL, r->n,
                          k ? keys + j * ldk : NULL) != 0)
            return 0;
    }
    return 1;
}

/* Steps every head at the next position in one to three ranges. */
static int sp_step_all(sp *t, int with_attn)
{
    t->pos += kve_rng_below(&t->g, 8) == 0 ? 3 : 1;
    size_t cut1 = t->heads > 1 ? 1 + (size_t)kve_rng_below(&t->g, t->heads - 1) : t->heads;
    size_t cut2 = cut1 + (cut1 < t->heads ? (size_t)kve_rng_below(&t->g, t->heads - cut1) : 0);
    size_t at[4] = {0, cut1, cut2, t->heads};
    for (int k = 0; k < 3; k++)
        if (at[k + 1] > at[k] && !sp_step(t, at[k], at[k + 1] - at[k], with_attn))
            return 0;
    return sp_same(t, "after a step");
}

/* Evicts the bank to `budget`; every head's victims must be the
 * reference's, the same in every head. */
static int sp_evict(sp *t, size_t budget)
{
    size_t ld = kve_bank_size(t->b, 0) + 2;
    kve_status st = kve_bank_evict(t->b, budget, victims, ld, counts);
    if (st != KVE_OK) {
        fprintf(stderr, "%s: evict to %zu: %s\n", kve_bank_spec(t->b), budget,
                kve_last_error());
        return 0;
    }
    if (ref_evict_same(t->r, t->heads, budget, ref_victims, ld, ref_counts) != 0)
        return 0;
    for (size_t h = 0; h < t->heads; h++) {
        if (counts[h] != ref_counts[h] || counts[h] != counts[0] ||
            memcmp(victims + h * ld, ref_victims + h * ld, counts[h] * sizeof *victims) != 0 ||
            memcmp(victims + h * ld, victims, counts[h] * sizeof *victims) != 0) {
            fprintf(stderr, "%s: evict to %zu: head %zu's %zu victims differ (reference: %zu)\n",
                    kve_bank_spec(t->b), budget, h, counts[h], ref_counts[h]);
            return 0;
        }
    }
    return sp_same(t, "after an evict");
}

/* The lowest budget an evict of the empty bank b accepts (above its recent
 * window or sinks); the evicts it tries change nothing. */
static size_t floor_budget(kve_bank *b)
{
    size_t lo = 1;
    while (lo < kve_bank_budget(b) && kve_bank_evict(b, lo, NULL, 0, NULL) == KVE_EINVAL)
        lo++;
    return lo;
}

static const char *const page_specs[] = {
    "h2o:budget=16,recent_window=2,block=4",
    "tova:budget=12,recent_window=1,block=3,block_mean=1",
    "h2o_decay:budget=10,recent_window=0,decay=0.9,block=2",
    "window:budget=12,block=4",
    "streaming:budget=13,sinks=2,block=4",
};

static void run_spec(const char *spec, size_t dim, uint64_t seed)
{
    sp t;
    size_t heads = 1 + (size_t)(seed % MAXH);
    ASSERT_TRUE(sp_new(&t, spec, heads, dim, seed));
    kve_rng *g = &t.g;
    size_t lo = floor_budget(t.b);
    ASSERT_TRUE(kve_bank_size(t.b, 0) == 0); /* the probe evicted nothing */
    int pending = 0; /* steps since the last evict */
    for (int s = 0; s < STEPS; s++) {
        if (s % 50 == 0)
            for (int k = 0; k < 4; k++)
                t.pool[k] = (float)kve_rng_uniform(g);
        ASSERT_TRUE(sp_step_all(&t, kve_rng_below(g, 10) != 0));
        pending++;
        uint64_t what = kve_rng_below(g, 16);
        if (what == 0 && pending < 40)
            continue; /* no evict: the heads grow, several victims later */
        size_t budget = t.budget;
        if (what == 1) /* below the spec's budget: several victims */
            budget = lo + (size_t)kve_rng_below(g, t.budget - lo + 1);
        ASSERT_TRUE(sp_evict(&t, budget));
        pending = 0;
        if (s % 37 == 0)
            ASSERT_TRUE(sp_same_state(&t));
    }
    ASSERT_TRUE(sp_same_state(&t));
    sp_free(&t);
}

static void test_against_reference(void)
{
    size_t n = sizeof workload_specs / sizeof workload_specs[0];
    for (size_t i = 0; i < n; i++)
        run_spec(workload_specs[i], workload_key_dim(workload_specs[i], i), check_seed + i);
    for (size_t i = 0; i < sizeof page_specs / sizeof page_specs[0]; i++)
        run_spec(page_specs[i], i % 2 ? 5 : 0,
                 check_seed + 100 + i);
}

/* ---- policies the reference does not model: a plain bank cut where the
 * combined score of its heads' images says ---- */

/* Head h's score of slot i in a bank image (versions 1 to 3). */
static double image_score(const uint8_t *img, const img_hdr *hd, size_t h, size_t i)
{
    const uint8_t *p = img + img_head_at(img, hd, h);
    size_t n = (size_t)img_le(p, 8);
    return img_f64(p + IMG_HEAD + 4 * n + 8 * i);
}

/* The victims of an eviction to `budget` of the plain bank b by the combined
 * score (ties to the lower index), removed from b with kve_bank_remove; they
 * go to out, ascending, their count returned. */
static size_t oracle_evict(kve_bank *b, size_t budget, size_t rw, int32_t *out)
{
    size_t H = kve_bank_heads(b), n = kve_bank_size(b, 0);
    if (n <= budget)
        return 0;
    size_t bytes = 0;
    if (kve_bank_save(b, NULL, 0, &bytes) != KVE_OK)
        return SIZE_MAX;
    uint8_t *img = malloc(bytes);
    img_hdr hd;
    double *sum = calloc(n, sizeof *sum);
    unsigned char *gone = calloc(n, 1);
    if (!img || !sum || !gone || kve_bank_save(b, img, bytes, &bytes) != KVE_OK ||
        img_header(img, bytes, &hd) != 0)
        abort();
    for (size_t i = 0; i < n; i++)
        for (size_t h = 0; h < H; h++)
            sum[i] = h ? sum[i] + image_score(img, &hd, h, i) : image_score(img, &hd, 0, i);
    for (size_t k = 0; k < n - budget; k++) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i + rw < n; i++)
            if (!gone[i] && (best == SIZE_MAX || sum[i] < sum[best]))
                best = i;
        gone[best] = 1;
    }
    const int32_t *pos = kve_bank_positions(b, 0);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (gone[i])
            out[m++] = pos[i];
    for (size_t k = 0; k < m; k++)
        if (kve_bank_remove(b, out[k], out[k] + 1) != KVE_OK)
            abort();
    free(img);
    free(sum);
    free(gone);
    return m;
}

/* A same_positions bank and a plain one of spec and options o, stepped with
 * the same data (queries and values when the policy reads them), evicted to
 * the budget (sometimes below) by each: the same victims every time. */
static void run_oracle(const char *spec, const kve_bank_options *o, size_t heads, uint64_t seed)
{
    enum { D = 8, G = 2 };
    kve_bank_options so = *o;
    so.same_positions = 1;
    kve_bank *same = NULL, *plain = NULL;
    ASSERT_OK(kve_bank_new_ex(spec, heads, NULL, &so, &same));
    ASSERT_OK(kve_bank_new_ex(spec, heads, NULL, o, &plain));
    kve_rng g;
    kve_rng_seed(&g, seed);
    /* the recent window, as the canonical spec spells it */
    const char *w = strstr(kve_bank_spec(same), "recent_window=");
    size_t budget = kve_bank_budget(same), rw = w ? (size_t)strtoul(w + 14, NULL, 10) : 0;
    size_t lo = floor_budget(same); /* above the recent window and the sinks */
    static float q[MAXH * G * D], v[MAXH * D], k[MAXH * D];
    int32_t mine[MAXN];
    for (int s = 0; s < 300; s++) {
        size_t n = kve_bank_size(same, 0), ld = n + 1;
        for (size_t i = 0; i < heads * ld; i++)
            rows[i] = (float)kve_rng_uniform(&g) / (float)(n ? n : 1);
        for (size_t i = 0; i < heads * D; i++) {
            k[i] = (float)kve_rng_uniform(&g) - 0.5f;
            v[i] = (float)kve_rng_uniform(&g) - 0.5f;
        }
        for (size_t i = 0; i < heads * G * D; i++)
            q[i] = (float)kve_rng_uniform(&g) - 0.5f;
        kve_step_data d = kve_step_default_data();
        d.attn = rows;
        d.ld = ld;
        d.keys = o->key_dim ? k : NULL;
        d.ld_keys = D;
        d.queries = o->query_group > 1 ? q : NULL;
        d.ld_queries = D;
        d.values = o->value_dim ? v : NULL;
        d.ld_values = D;
        ASSERT_OK(kve_bank_step_data(same, 0, heads, s, &d));
        ASSERT_OK(kve_bank_step_data(plain, 0, heads, s, &d));
        size_t to = s % 29 == 28 ? lo + (size_t)kve_rng_below(&g, budget - lo + 1) : budget;
        ASSERT_OK(kve_bank_evict(same, to, victims, MAXN, counts));
        size_t m = oracle_evict(plain, to, rw, mine);
        ASSERT_EQ(counts[0], m);
        for (size_t h = 0; h < heads; h++) {
            ASSERT_EQ(counts[h], m);
            if (memcmp(victims + h * MAXN, mine, m * sizeof *mine) != 0)
                fprintf(stderr, "%s step %d head %zu: victim %d, the oracle's %d (of %zu)\n",
                        spec, s, h, victims[h * MAXN], mine[0], m);
            ASSERT_TRUE(memcmp(victims + h * MAXN, mine, m * sizeof *mine) == 0);
            ASSERT_EQ(kve_bank_size(same, h), kve_bank_size(plain, h));
        }
    }
    kve_bank_free(same);
    kve_bank_free(plain);
}

/* h2o as an application registers it: score += the step's weight. */
static kve_status rule_h2o(void *user, const kve_score_step *s)
{
    (void)user;
    for (size_t i = 0; i < s->n; i++)
        s->new_score[i] = s->score[i] + (double)s->attn[i];
    return KVE_OK;
}

static void test_oracle(void)
{
    enum { D = 8, G = 2 };
    kve_bank_options o = kve_bank_default_options();
    o.key_dim = D;
    o.value_dim = D;
    o.query_group = G;
    o.rope.rotary_dim = D;
    o.rope.base = 10000.0;
    run_oracle("expected_attention:budget=20,n_future_positions=4,interval=3", &o, 4,
               check_seed + 1);
    run_oracle("expected_attention:budget=16,recent_window=2,interval=1,n_queries=8", &o, 3,
               check_seed + 2);
    kve_score_rule r = kve_score_rule_default();
    r.name = "sp_h2o";
    r.observe = rule_h2o;
    r.recent_window = 3;
    ASSERT_OK(kve_score_rule_register(&r));
    kve_bank_options plain = kve_bank_default_options();
    run_oracle("sp_h2o:budget=14", &plain, 5, check_seed + 3);
    kve_bank_options values = kve_bank_default_options();
    values.value_dim = D;
    run_oracle("h2o:budget=24,recent_window=4,vnorm=1", &values, 4, check_seed + 4);
    ASSERT_OK(kve_score_rule_unregister("sp_h2o"));
}

/* ---- prefill of the whole bank ---- */

typedef struct cand {
    double s;
    int32_t pos;
} cand;

static int by_score_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->s != y->s)
        return x->s > y->s ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static void test_prefill(void)
{
    enum { H = 4, N = 90, B = 30, RW = 6 };
    kve_bank_options o = kve_bank_default_options();
    o.same_positions = 1;
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=30,recent_window=6", H, NULL, &o, &b));
    static float pr[H * N * N];
    kve_rng g;
    kve_rng_seed(&g, check_seed + 9);
    for (size_t h = 0; h < H; h++)
        for (size_t t = 0; t < N; t++) {
            double sum = 0;
            float *row = pr + (h * N + t) * N;
            for (size_t i = 0; i < N; i++)
                sum += row[i] = i <= t ? (float)kve_rng_uniform(&g) : 0.0f;
            for (size_t i = 0; i <= t; i++)
                row[i] = (float)(row[i] / sum);
        }
    /* a part of the bank is refused: one kept set for every head */
    ASSERT_STATUS(kve_bank_prefill(b, 0, H - 1, N, B, pr, N, 1, KVE_REDUCE_MEAN, NULL),
                  KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "same_positions");
    ASSERT_EQ(kve_bank_size(b, 0), 0);
    ASSERT_OK(kve_bank_prefill(b, 0, H, N, B, pr, N, 1, KVE_REDUCE_MEAN, NULL));
    double total[N] = {0}, one[N];
    for (size_t h = 0; h < H; h++) {
        ASSERT_OK(kve_prefill_scores(N, pr + h * N * N, N, 1, KVE_REDUCE_MEAN, NULL, one));
        for (size_t i = 0; i < N; i++)
            total[i] = h ? total[i] + one[i] : one[i];
    }
    cand c[N];
    for (size_t i = 0; i < N - RW; i++)
        c[i] = (cand){total[i], (int32_t)i};
    qsort(c, N - RW, sizeof *c, by_score_desc);
    unsigned char keep[N] = {0};
    for (size_t i = 0; i < B - RW; i++)
        keep[c[i].pos] = 1;
    for (size_t i = N - RW; i < N; i++)
        keep[i] = 1;
    int32_t want[B];
    size_t m = 0;
    for (size_t i = 0; i < N; i++)
        if (keep[i])
            want[m++] = (int32_t)i;
    ASSERT_EQ(m, B);
    for (size_t h = 0; h < H; h++) {
        ASSERT_EQ(kve_bank_size(b, h), B);
        ASSERT_TRUE(memcmp(kve_bank_positions(b, h), want, sizeof want) == 0);
    }
    /* and it decodes on as one bank */
    memset(rows, 0, sizeof rows);
    for (int32_t p = N; p < N + 40; p++) {
        ASSERT_OK(kve_bank_step(b, p, rows, kve_bank_size(b, 0)));
        ASSERT_OK(kve_bank_evict(b, B, victims, 4, counts));
        for (size_t h = 1; h < H; h++)
            ASSERT_TRUE(memcmp(kve_bank_positions(b, h), kve_bank_positions(b, 0),
                               B * sizeof(int32_t)) == 0);
    }
    kve_bank_free(b);
}

/* ---- the lifecycle ---- */

static uint8_t *save(const kve_bank *b, size_t *n)
{
    *n = 0;
    if (kve_bank_save(b, NULL, 0, n) != KVE_OK)
        return NULL;
    uint8_t *img = malloc(*n);
    if (img && kve_bank_save(b, img, *n, n) != KVE_OK) {
        free(img);
        return NULL;
    }
    return img;
}

/* Steps heads [first, first + count) of every bank of bs[0 .. nb) at pos
 * with the same random rows. */
static int lockstep_n(kve_bank **bs, size_t nb, size_t first, size_t count, int32_t pos,
                      kve_rng *g)
{
    size_t ld = kve_bank_size(bs[0], first) + 1;
    for (size_t i = 0; i < count * ld; i++)
        rows[i] = (float)kve_rng_uniform(g);
    for (size_t k = 0; k < nb; k++)
        if (kve_bank_step_range(bs[k], first, count, pos, rows, ld, 1, KVE_REDUCE_MEAN, NULL,
                                0) != KVE_OK)
            return 0;
    return 1;
}

static int lockstep(kve_bank *a, kve_bank *b, size_t first, size_t count, int32_t pos,
                    kve_rng *g)
{
    kve_bank *bs[2] = {a, b};
    return lockstep_n(bs, 2, first, count, pos, g);
}

/* Evicts a and b to budget: the same counts and victims for every head. */
static int evict_alike(kve_bank *a, kve_bank *b, size_t budget)
{
    enum { LD = 8 };
    static int32_t va[MAXH * LD], vb[MAXH * LD];
    size_t ca[MAXH], cb[MAXH], H = kve_bank_heads(a);
    if (kve_bank_evict(a, budget, va, LD, ca) != KVE_OK ||
        kve_bank_evict(b, budget, vb, LD, cb) != KVE_OK)
        return 0;
    for (size_t h = 0; h < H; h++)
        if (ca[h] != cb[h] || memcmp(va + h * LD, vb + h * LD, ca[h] * sizeof *va) != 0)
            return 0;
    return 1;
}

static int same_images(const kve_bank *a, const kve_bank *b)
{
    size_t na, nb;
    uint8_t *ia = save(a, &na), *ib = save(b, &nb);
    int ok = ia && ib && na == nb && memcmp(ia, ib, na) == 0;
    free(ia);
    free(ib);
    return ok;
}

static void test_lifecycle(void)
{
    enum { H = 5, B = 24 };
    kve_bank_options o = kve_bank_default_options();
    o.same_positions = 1;
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new_ex("tova:budget=24,recent_window=2", H, NULL, &o, &b));
    kve_rng g;
    kve_rng_seed(&g, check_seed + 11);
    int32_t pos = 0;
    for (; pos < 60; pos++) {
        kve_bank *one[1] = {b};
        ASSERT_TRUE(lockstep_n(one, 1, 0, H, pos, &g));
        ASSERT_OK(kve_bank_evict(b, B, victims, 4, counts));
    }
    /* mid-round: heads [0, 2) have admitted pos, the others not yet */
    kve_bank *one[1] = {b};
    ASSERT_TRUE(lockstep_n(one, 1, 0, 2, pos, &g));
    size_t ld = kve_bank_size(b, 2) + 1;
    /* an evict now is refused, and so is a step past pos */
    ASSERT_STATUS(kve_bank_evict(b, B, victims, 4, counts), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "has not admitted position");
    ASSERT_STATUS(kve_bank_step_range(b, 2, 3, pos + 1, rows, ld, 1, KVE_REDUCE_MEAN, NULL, 0),
                  KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "same_positions: head 0 has admitted position");
    ASSERT_STATUS(kve_bank_step_range(b, 1, 2, pos, rows, ld, 1, KVE_REDUCE_MEAN, NULL, 0),
                  KVE_EINVAL); /* head 1 has admitted it already */
    /* the image of a bank mid-round loads; it, a clone and the bank finish
     * the round and evict alike */
    size_t n1;
    uint8_t *img = save(b, &n1);
    ASSERT_TRUE(img != NULL);
    img_hdr hd;
    ASSERT_EQ(img_header(img, n1, &hd), 0);
    ASSERT_EQ(hd.version, 3);
    ASSERT_U64_EQ(hd.flags, 1);
    kve_bank *l = NULL, *c = NULL;
    ASSERT_OK(kve_bank_load(img, n1, NULL, &l));
    ASSERT_EQ(kve_bank_same_positions(l), 1);
    ASSERT_OK(kve_bank_clone(b, &c));
    ASSERT_EQ(kve_bank_same_positions(c), 1);
    ASSERT_TRUE(same_images(b, l) && same_images(b, c));
    kve_bank *three[3] = {b, l, c};
    ASSERT_TRUE(lockstep_n(three, 3, 2, 3, pos, &g));
    ASSERT_TRUE(same_images(b, l) && same_images(b, c));
    kve_bank *c2 = NULL;
    ASSERT_OK(kve_bank_clone(c, &c2));
    ASSERT_TRUE(evict_alike(b, l, B));
    ASSERT_TRUE(evict_alike(c, c2, B));
    ASSERT_TRUE(same_images(b, l) && same_images(b, c));
    kve_bank_free(c2);
    /* copy: into a bank of the same options, not into a plain one */
    kve_bank *d = NULL, *plain = NULL;
    ASSERT_OK(kve_bank_new_ex("tova:budget=24,recent_window=2", H, NULL, &o, &d));
    ASSERT_OK(kve_bank_new("tova:budget=24,recent_window=2", H, NULL, &plain));
    ASSERT_OK(kve_bank_copy(d, b));
    ASSERT_TRUE(same_images(b, d));
    ASSERT_STATUS(kve_bank_copy(plain, b), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "same_positions");
    /* remove: every head loses the same positions, and they go on together */
    pos++;
    int32_t p0 = kve_bank_positions(b, 0)[3], p1 = kve_bank_positions(b, 0)[9];
    ASSERT_OK(kve_bank_remove(b, p0, p1));
    ASSERT_OK(kve_bank_remove(d, p0, p1));
    for (int s = 0; s < 40; s++, pos++) {
        ASSERT_TRUE(lockstep(b, d, 0, H, pos, &g));
        ASSERT_TRUE(evict_alike(b, d, B));
    }
    ASSERT_TRUE(same_images(b, d));
    /* reset: a new bank again */
    kve_bank *fresh = NULL;
    ASSERT_OK(kve_bank_new_ex("tova:budget=24,recent_window=2", H, NULL, &o, &fresh));
    kve_bank_reset(b);
    ASSERT_TRUE(same_images(b, fresh));
    free(img);
    kve_bank_free(fresh);
    kve_bank_free(d);
    kve_bank_free(plain);
    kve_bank_free(c);
    kve_bank_free(l);
    kve_bank_free(b);
}

/* Version 3 images that must be refused, each naming what is wrong. */
static void test_image_refusals(void)
{
    enum { H = 3 };
    kve_bank_options o = kve_bank_default_options();
    o.same_positions = 1;
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=8,recent_window=2", H, NULL, &o, &b));
    for (int32_t p = 0; p < 20; p++) { /* no information: ties, the oldest go */
        ASSERT_OK(kve_bank_step(b, p, NULL, 0));
        ASSERT_OK(kve_bank_evict(b, 8, victims, 4, counts));
    }
    size_t n;
    uint8_t *img = save(b, &n), *bad = malloc(n);
    ASSERT_TRUE(img && bad);
    img_hdr hd;
    ASSERT_EQ(img_header(img, n, &hd), 0);
    const size_t flags_at = IMG_HEADER + hd.spec_len + 48;
    kve_bank *out = NULL;
    static const uint64_t wrong_flags[] = {0, 2, 3};
    for (size_t k = 0; k < 3; k++) {
        memcpy(bad, img, n);
        img_put(bad + flags_at, wrong_flags[k], 8);
        img_reseal(bad, n);
        ASSERT_STATUS(kve_bank_load(bad, n, NULL, &out), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "version 3 flags");
    }
    /* a head that keeps another position than the others: head 1's oldest,
     * 12 of 12 .. 19, made 11 (still ascending) */
    memcpy(bad, img, n);
    size_t at = img_head_at(bad, &hd, 1) + IMG_HEAD;
    ASSERT_U64_EQ(img_le(bad + at, 4), 12);
    img_put(bad + at, 11, 4);
    img_reseal(bad, n);
    ASSERT_STATUS(kve_bank_load(bad, n, NULL, &out), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "same_positions: head 1");
    /* version 3 as a policy's image */
    memcpy(bad, img, n);
    img_put(bad + 12, 1, 4);
    img_reseal(bad, n);
    kve_policy *p = NULL;
    ASSERT_STATUS(kve_policy_load(bad, n, NULL, &p), KVE_EINVAL);
    ASSERT_TRUE(out == NULL && p == NULL);
    /* a plain bank's image is version 1, as before */
    kve_bank *plain = NULL;
    ASSERT_OK(kve_bank_new("h2o:budget=8,recent_window=2", H, NULL, &plain));
    size_t pn;
    uint8_t *pimg = save(plain, &pn);
    ASSERT_EQ(img_header(pimg, pn, &hd), 0);
    ASSERT_EQ(hd.version, 1);
    free(pimg);
    kve_bank_free(plain);
    free(bad);
    free(img);
    kve_bank_free(b);
}

/* ---- refusals and options ---- */

static void test_refusals(void)
{
    kve_bank_options o = kve_bank_default_options();
    ASSERT_EQ(o.same_positions, 0);
    kve_bank *b = NULL;
    o.same_positions = 2;
    ASSERT_STATUS(kve_bank_new_ex("h2o", 4, NULL, &o, &b), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "same_positions 2 is neither 0 nor 1");
    o.same_positions = 1;
    o.share = 2;
    ASSERT_STATUS(kve_bank_new_ex("h2o", 4, NULL, &o, &b), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "choose one");
    ASSERT_TRUE(b == NULL);
    o.share = 0;
    ASSERT_OK(kve_bank_new_ex("h2o:budget=6,recent_window=1", 4, NULL, &o, &b));
    ASSERT_EQ(kve_bank_same_positions(NULL), 0);
    for (int32_t p = 0; p < 10; p++)
        ASSERT_OK(kve_bank_step(b, p, NULL, 0));
    /* a part of the bank cannot be evicted */
    ASSERT_STATUS(kve_bank_evict_range(b, 0, 2, 6, victims, 8, counts), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "an eviction decides for every head");
    ASSERT_EQ(kve_bank_size(b, 0), 10);
    ASSERT_OK(kve_bank_evict_range(b, 0, 0, 6, victims, 8, counts)); /* count 0: nothing */
    ASSERT_STATUS(kve_bank_evict(b, 6, victims, 3, counts), KVE_ERANGE); /* 4 victims */
    ASSERT_EQ(kve_bank_size(b, 3), 10);
    ASSERT_OK(kve_bank_evict_range(b, 0, 4, 6, victims, 4, counts));
    for (size_t h = 0; h < 4; h++)
        ASSERT_EQ(counts[h], 4);
    kve_bank_free(b);
    /* a bank of one head is a policy that happens to be a bank */
    ASSERT_OK(kve_bank_new_ex("window:budget=3", 1, NULL, &o, &b));
    for (int32_t p = 0; p < 10; p++) {
        ASSERT_OK(kve_bank_step(b, p, NULL, 0));
        ASSERT_OK(kve_bank_evict(b, 3, victims, 1, counts));
    }
    ASSERT_EQ(kve_bank_positions(b, 0)[0], 7);
    kve_bank_free(b);
}

/* Unchecked steps take the same victims on valid weights. */
static void test_unchecked(void)
{
    enum { H = 4, B = 16 };
    kve_bank_options o = kve_bank_default_options();
    o.same_positions = 1;
    kve_bank *a = NULL, *u = NULL;
    ASSERT_OK(kve_bank_new_ex("h2o_decay:budget=16,recent_window=3,decay=0.9", H, NULL, &o, &a));
    o.unchecked = 1;
    ASSERT_OK(kve_bank_new_ex("h2o_decay:budget=16,recent_window=3,decay=0.9", H, NULL, &o, &u));
    kve_rng g;
    kve_rng_seed(&g, check_seed + 17);
    for (int32_t p = 0; p < 200; p++) {
        ASSERT_TRUE(lockstep(a, u, 0, H, p, &g));
        ASSERT_TRUE(evict_alike(a, u, B));
    }
    ASSERT_TRUE(same_images(a, u));
    kve_bank_free(a);
    kve_bank_free(u);
}

/* No allocation while the bank is evicted after every step; every block
 * returned with its size. */
static void test_steady_state(void)
{
    enum { H = 8, B = 64 };
    talloc ta;
    talloc_init(&ta);
    kve_bank_options o = kve_bank_default_options();
    o.same_positions = 1;
    o.allocator = &ta.a;
    o.key_dim = 4;
    static const char *const specs[] = {"h2o:budget=64", "knorm:budget=64", "streaming:budget=64",
                                        "random:budget=64", "h2o:budget=64,block=8"};
    kve_rng g;
    kve_rng_seed(&g, check_seed + 23);
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        kve_bank *b = NULL;
        ASSERT_OK(kve_bank_new_ex(specs[k], H, &g, &o, &b));
        float key[H * 4];
        size_t cnt[H];
        for (int32_t p = 0; p < 3000; p++) {
            if (p == 2 * B)
                talloc_fail_after(&ta, 0); /* from here every allocation would fail */
            size_t ld = kve_bank_size(b, 0);
            for (size_t i = 0; i < H * ld; i++)
                rows[i] = (float)kve_rng_uniform(&g) / (float)(ld ? ld : 1);
            for (size_t i = 0; i < H * 4; i++)
                key[i] = (float)kve_rng_uniform(&g);
            ASSERT_OK(kve_bank_step_range(b, 0, H / 2, p, rows, ld, 1, KVE_REDUCE_MEAN, key, 4));
            ASSERT_OK(kve_bank_step_range(b, H / 2, H / 2, p, rows + H / 2 * ld, ld, 1,
                                          KVE_REDUCE_MEAN, key + H / 2 * 4, 4));
            ASSERT_OK(kve_bank_evict(b, B, victims, 16, cnt));
        }
        ASSERT_EQ(ta.made, 0);
        talloc_fail_after(&ta, SIZE_MAX);
        kve_bank_free(b);
    }
    talloc_check_empty(&ta);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_against_reference);
    RUN(test_oracle);
    RUN(test_prefill);
    RUN(test_lifecycle);
    RUN(test_image_refusals);
    RUN(test_refusals);
    RUN(test_unchecked);
    RUN(test_steady_state);
    return CHECK_DONE();
}
