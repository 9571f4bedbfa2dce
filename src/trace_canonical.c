/* SPDX-License-Identifier: MIT */
/*
 * trace_canonical.c - the canonical synthetic decode trace (docs/trace.md).
 *
 * Row t (t >= 1) is a distribution over keys [0, t) with nothing on the
 * query's own key (row[t] = 0); row 0 is row[0] = 1. Every key of [0, t) is
 * in exactly one of four classes, and each class that is non-empty at step t
 * receives its mass, all masses then being rescaled to sum 1:
 *   sinks       [0, min(sinks, t))                equal shares of sink_mass
 *   band        [max(sinks, t - recent), t)       recent_mass, key at distance
 *                                                 d weighted recent_decay^(d-1)
 *   heavy       the epoch's heavy set (drawn from [sinks, epoch start))
 *                                                 heavy_mass, fixed per-epoch
 *                                                 shares; a heavy key inside
 *                                                 the band gets both weights
 *   background  every other key                   1 - the three masses above,
 *                                                 jittered per row
 * Each weight is computed in double and rounded to float32, and the rounded
 * value is what the row holds.
 *
 * Determinism: the generator uses only IEEE-754 +, -, *, / (no libm, no
 * contraction into FMA), and all randomness is counter-based: row t draws
 * from an Rng seeded by mix(seed, t), epoch e's heavy set from mix(seed, e).
 * So a row is a pure function of (parameters, t), whatever order rows are
 * read in.
 *
 * Cost: O(t) per row (one Rng draw per background key, about 3-4 ns per
 * key), plus O(heavy^2) at worst (sorted insertion) when a row belongs to
 * another epoch than the previous one. Memory: O(recent + heavy), never
 * O(T^2).
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include "trace_impl.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct canon_params {
    uint64_t seed;
    size_t steps;
    size_t sinks;
    double sink_mass;
    size_t recent;
    double recent_mass;
    double recent_decay;
    size_t epoch;
    size_t heavy;
    double heavy_mass;
    double jitter;
} canon_params;

enum { STEPS_MAX = 16777216, HEAVY_MAX = 1024 };

#define P(field) offsetof(canon_params, field)
#define SIZE_DEF(k, def, lo, hi, field, text) \
    {.key = (k), .kind = KVE_PARAM_SIZE, .idefault = (def), .imin = (lo), .imax = (hi), \
     .offset = P(field), .doc = (text)}
#define REAL_DEF(k, def, lo, hi, fl, field, text) \
    {.key = (k), .kind = KVE_PARAM_REAL, .rdefault = (def), .rmin = (lo), .rmax = (hi), \
     .flags = (fl), .offset = P(field), .doc = (text)}
static const kve_param_def canon_defs[] = {
    {.key = "seed", .kind = KVE_PARAM_U64, .idefault = 1, .imin = 0, .imax = UINT64_MAX,
     .offset = P(seed), .doc = "generator seed"},
    SIZE_DEF("steps", 4096, 1, STEPS_MAX, steps, "T, rows"),
    SIZE_DEF("sinks", 4, 0, STEPS_MAX, sinks, "attention sinks"),
    REAL_DEF("sink_mass", 0.10, 0, 1, 0, sink_mass, "mass on the sinks"),
    SIZE_DEF("recent", 64, 0, STEPS_MAX, recent, "recency band width"),
    REAL_DEF("recent_mass", 0.55, 0, 1, 0, recent_mass, "mass on the band"),
    REAL_DEF("recent_decay", 0.96, 0, 1, KVE_PARAM_MIN_OPEN, recent_decay,
             "band weight ratio per position of distance"),
    SIZE_DEF("epoch", 512, 1, STEPS_MAX, epoch, "heavy-hitter epoch"),
    SIZE_DEF("heavy", 16, 0, HEAVY_MAX, heavy, "heavy hitters per epoch"),
    REAL_DEF("heavy_mass", 0.20, 0, 1, 0, heavy_mass, "mass on heavy hitters"),
    REAL_DEF("jitter", 0.5, 0, 0.95, 0, jitter,
             "random weight factors are uniform in [1 - jitter, 1 + jitter)"),
};
#undef SIZE_DEF
#undef REAL_DEF
#undef P
enum { N_DEFS = sizeof canon_defs / sizeof canon_defs[0] };

typedef struct kve_canonical {
    canon_params p;
    double background_mass; /* 1 - sink_mass - recent_mass - heavy_mass, >= 0 */
    double *band;           /* [min(recent, steps)]: band[d-1] = recent_decay^(d-1) */
    size_t band_len;
    int32_t *heavy_pos; /* [heavy]: the cached epoch's heavy keys, ascending */
    double *heavy_w;    /* [heavy]: their shares, summing to 1 */
    size_t heavy_n;     /* entries valid for cached_epoch */
    size_t cached_epoch;
} kve_canonical;

/* Stream tags keep row and epoch randomness apart. */
enum { STREAM_ROW = 1, STREAM_EPOCH = 2 };

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static void seed_stream(kve_rng *rng, uint64_t seed, uint64_t stream, uint64_t index)
{
    kve_rng_seed(rng, mix64(mix64(seed + 0x9e3779b97f4a7c15u * stream) ^ index));
}

/* A factor uniform in [1 - jitter, 1 + jitter). */
static inline double jitter_factor(kve_rng *rng, double jitter)
{
    return 1.0 + jitter * (2.0 * kve__rng_uniform_inline(rng) - 1.0);
}

static void canonical_free(void *impl);
static kve_status canonical_row(void *impl, size_t head, size_t t, double *row);

static kve_status canonical_open(const char *params, unsigned flags, kve_progress_fn progress,
                                 void *user, kve_trace *tr)
{
    (void)flags; /* rows are distributions by construction */
    (void)progress; /* nothing to validate: rows are made on demand */
    (void)user;
    canon_params p;
    kve_status st = kve__spec_parse("canonical", params, canon_defs, N_DEFS, &p);
    if (st != KVE_OK)
        return st;
    double fixed = p.sink_mass + p.recent_mass + p.heavy_mass;
    if (fixed > 1.0)
        return kve__fail(KVE_EINVAL,
                         "canonical: sink_mass + recent_mass + heavy_mass = %.17g exceeds 1",
                         fixed);

    size_t len = kve__spec_format(NULL, 0, "canonical", canon_defs, N_DEFS, &p);
    kve_canonical *c = kve__calloc(1, sizeof *c);
    char *source = kve__malloc(len + 1);
    size_t band_len = p.recent < p.steps ? p.recent : p.steps;
    double *band = kve__malloc((band_len ? band_len : 1) * sizeof *band);
    int32_t *hp = kve__malloc((p.heavy ? p.heavy : 1) * sizeof *hp);
    double *hw = kve__malloc((p.heavy ? p.heavy : 1) * sizeof *hw);
    if (!c || !source || !band || !hp || !hw) {
        kve__free(c);
        kve__free(source);
        kve__free(band);
        kve__free(hp);
        kve__free(hw);
        return kve__fail(KVE_ENOMEM, "canonical: out of memory");
    }
    kve__spec_format(source, len + 1, "canonical", canon_defs, N_DEFS, &p);
    double w = 1.0;
    for (size_t d = 0; d < band_len; d++) {
        band[d] = w;
        w *= p.recent_decay;
    }
    c->p = p;
    c->background_mass = 1.0 - fixed;
    c->band = band;
    c->band_len = band_len;
    c->heavy_pos = hp;
    c->heavy_w = hw;
    c->heavy_n = 0;
    c->cached_epoch = SIZE_MAX;

    tr->steps = p.steps;
    tr->heads = 1;
    tr->layers = 1;
    tr->source = source;
    tr->impl = c;
    return KVE_OK;
}

static void canonical_free(void *impl)
{
    kve_canonical *c = impl;
    if (!c)
        return;
    kve__free(c->band);
    kve__free(c->heavy_pos);
    kve__free(c->heavy_w);
    kve__free(c);
}

/* Draws epoch e's heavy set: min(heavy, start - sinks) distinct keys of
 * [sinks, start), start = e * epoch, uniformly (Floyd's algorithm, kept
 * sorted by insertion), then one jittered share per key in ascending key
 * order, normalised to sum 1. */
static void load_epoch(kve_canonical *c, size_t e)
{
    if (c->cached_epoch == e)
        return;
    const canon_params *p = &c->p;
    size_t start = e * p->epoch;
    size_t pool = start > p->sinks ? start - p->sinks : 0;
    size_t k = p->heavy < pool ? p->heavy : pool;
    kve_rng rng;
    seed_stream(&rng, p->seed, STREAM_EPOCH, e);
    size_t n = 0;
    for (size_t j = pool - k; j < pool; j++) {
        int32_t cand = (int32_t)(p->sinks + kve_rng_below(&rng, (uint64_t)j + 1));
        /* Binary search for cand among the n sorted keys. */
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (c->heavy_pos[mid] < cand)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < n && c->heavy_pos[lo] == cand) {
            cand = (int32_t)(p->sinks + j); /* j is new: it exceeds every earlier pick */
            lo = n;
        }
        memmove(c->heavy_pos + lo + 1, c->heavy_pos + lo, (n - lo) * sizeof *c->heavy_pos);
        c->heavy_pos[lo] = cand;
        n++;
    }
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        c->heavy_w[i] = jitter_factor(&rng, p->jitter);
        sum += c->heavy_w[i];
    }
    for (size_t i = 0; i < n; i++)
        c->heavy_w[i] /= sum;
    c->heavy_n = n;
    c->cached_epoch = e;
}

static inline double round_f32(double x)
{
    return (double)(float)x;
}

/* Row t into row[0 .. t]. Never fails. */
static void make_row(kve_canonical *c, size_t t, double *row)
{
    const canon_params *p = &c->p;
    if (t == 0) {
        row[0] = 1.0;
        return;
    }
    load_epoch(c, t / p->epoch);
    size_t s_end = p->sinks < t ? p->sinks : t;                   /* sinks [0, s_end) */
    size_t b_lo = t - s_end > p->recent ? t - p->recent : s_end; /* band [b_lo, t) */
    size_t n_heavy = c->heavy_n;
    size_t heavy_in_bg = 0; /* heavy keys below b_lo, i.e. taken out of the background */
    while (heavy_in_bg < n_heavy && (size_t)c->heavy_pos[heavy_in_bg] < b_lo)
        heavy_in_bg++;
    size_t n_bg = (b_lo - s_end) - heavy_in_bg;

    double m_sink = s_end ? p->sink_mass : 0.0;
    double m_band = b_lo < t ? p->recent_mass : 0.0;
    double m_heavy = n_heavy ? p->heavy_mass : 0.0;
    double m_bg = n_bg ? c->background_mass : 0.0;
    double total = m_sink + m_band + m_heavy + m_bg;

    row[t] = 0.0;
    if (!(total > 0.0)) {
        /* Every available class has mass 0 (possible only with such
         * parameters): the row is uniform over [0, t). */
        for (size_t i = 0; i < t; i++)
            row[i] = round_f32(1.0 / (double)t);
        return;
    }
    m_sink /= total;
    m_band /= total;
    m_heavy /= total;
    m_bg /= total;

    /* Each key is written once here, then band and heavy keys get their
     * heavy share added and are rounded last; sinks and background are
     * rounded as they are written. */
    if (s_end) {
        double share = round_f32(m_sink / (double)s_end);
        for (size_t i = 0; i < s_end; i++)
            row[i] = share;
    }
    if (b_lo > s_end) {
        /* Background keys draw, in ascending order, one jitter factor each;
         * heavy keys among them hold 0 until their share is added. */
        kve_rng rng;
        seed_stream(&rng, p->seed, STREAM_ROW, t);
        const double jitter = p->jitter;
        double sum = 0;
        size_t lo = s_end;
        for (size_t h = 0; h <= heavy_in_bg; h++) {
            size_t hi = h < heavy_in_bg ? (size_t)c->heavy_pos[h] : b_lo;
            for (size_t i = lo; i < hi; i++) {
                double f = jitter_factor(&rng, jitter);
                row[i] = f;
                sum += f;
            }
            if (h < heavy_in_bg)
                row[hi] = 0.0;
            lo = hi + 1;
        }
        if (n_bg) {
            double scale = m_bg / sum;
            for (size_t i = s_end; i < b_lo; i++)
                row[i] = round_f32(row[i] * scale);
        }
    }
    if (b_lo < t) {
        size_t width = t - b_lo;
        double sum = 0;
        for (size_t d = 0; d < width; d++)
            sum += c->band[d];
        for (size_t d = 0; d < width; d++)
            row[t - 1 - d] = m_band * c->band[d] / sum;
    }
    for (size_t k = 0; k < n_heavy; k++) {
        size_t i = (size_t)c->heavy_pos[k];
        double add = m_heavy * c->heavy_w[k];
        row[i] = i < b_lo ? round_f32(add) : row[i] + add;
    }
    for (size_t i = b_lo; i < t; i++)
        row[i] = round_f32(row[i]);
}

static kve_status canonical_row(void *impl, size_t head, size_t t, double *row)
{
    (void)head; /* one head */
    make_row(impl, t, row);
    return KVE_OK;
}

const kve_trace_source_type kve__canonical_source = {
    .prefix = "canonical",
    .open = canonical_open,
    .row = canonical_row,
    .free = canonical_free,
};
