/* SPDX-License-Identifier: MIT */
/*
 * trace_canonical.c - the canonical synthetic decode trace (docs/trace.md),
 * in its three versions. `version=3` (the default) is "the canonical trace":
 * version 2's generator with heavy, heavy_mass and sink_mass at the point
 * chosen by the declared calibration (docs/trace.md, "Calibration, version
 * 3"); `version=2` and `version=1` are the earlier versions, kept bit for bit
 * so that earlier results can be regenerated. Versions 2 and 3 differ only in
 * their defaults: canonical:version=3 gives the rows of canonical:version=2
 * with those three keys set to version 3's values.
 *
 * Row t (t >= 1) is a distribution over keys [0, t) with nothing on the
 * query's own key (row[t] = 0); row 0 is row[0] = 1. In both versions the
 * keys of [0, t) fall in four classes, each class that is present at step t
 * receives its mass, and the masses present are then rescaled to sum 1:
 *   sinks       [0, min(sinks, t))                equal shares of sink_mass
 *   band        [max(sinks, t - recent), t)       recent_mass, key at distance
 *                                                 d weighted recent_decay^(d-1)
 *   heavy       see below                         heavy_mass
 *   background  the keys between sinks and band   what the others leave,
 *                                                 jittered per row
 * Version 1: each epoch of `epoch` steps has one heavy set of min(heavy,
 *   start - sinks) keys drawn from [sinks, start), start = e * epoch, with
 *   fixed shares for the epoch; heavy keys are taken out of the background
 *   (a heavy key inside the band gets both weights).
 * Versions 2 and 3: heavy hitters arrive during the trace, exactly one in each
 *   slot [sinks + j*epoch/heavy, sinks + (j+1)*epoch/heavy) at a seeded
 *   offset, with a seeded strength s_j. Hitter j at position p_j has weight
 *   u_j(t) = s_j * heavy_decay^k, k = (t - 1 - p_j) / epoch (integer
 *   division): full strength for the `epoch` rows after it arrives, then
 *   multiplied by heavy_decay for each further epoch. With W(t) the sum of
 *   u_j(t) over the hitters before t and W* = heavy / (1 - heavy_decay) its
 *   steady-state value, the class is present with heavy_mass * min(1, W/W*)
 *   and hitter j receives that mass times u_j / W. Hitters stay band or
 *   background keys as well: their share is added on top.
 * Each weight is computed in double and rounded to float32, and the rounded
 * value is what the row holds.
 *
 * Determinism: the generator uses only IEEE-754 +, -, *, / (no libm, no
 * contraction into FMA), and all randomness is counter-based: row t draws
 * its background from an Rng seeded by mix(seed, t); version 1's epoch e its
 * heavy set from mix(seed, e); version 2's slot j its hitter from
 * mix(seed, j). So a row is a pure function of (parameters, t), whatever
 * order rows are read in.
 *
 * Cost: O(t) per row (one Rng draw per background key, about 3-4 ns per
 * key; version 2 adds one multiply-add per hitter before t, t * heavy /
 * epoch of them); version 1 adds O(heavy^2) at worst (sorted insertion)
 * when a row belongs to another epoch than the previous one. Memory:
 * version 1 O(recent + heavy); version 2 O(recent + T * heavy / epoch) for
 * the hitters (drawn once, when the trace is opened) and the powers of
 * heavy_decay (T / epoch + 1 of them). Never O(T^2).
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include "trace_impl.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct canon_params {
    size_t version;
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
    double heavy_decay; /* versions 2 and 3 */
    double jitter;
} canon_params;

enum { STEPS_MAX = 16777216, HEAVY_MAX = 1024, VERSION_LATEST = 3 };

/* The one constant of version 2 fitted to a published figure (docs/trace.md,
 * "Calibration"): the sinks' mass, found by the documented bisection so that
 * streaming:budget=256 retains 0.7367 of the mass on the default trace. */
#define V2_SINK_MASS 0.09034
/* Version 3's three calibrated constants: the point that `kvevict trace
 * --calibrate` chooses (docs/trace.md, "Calibration, version 3";
 * docs/data/calibration-v3.jsonl), sink_mass fitted there as in version 2. */
#define V3_HEAVY 3
#define V3_HEAVY_MASS 0.15
#define V3_SINK_MASS 0.10304

#define P(field) offsetof(canon_params, field)
#define SIZE_DEF(k, def, lo, hi, field, text) \
    {.key = (k), .kind = KVE_PARAM_SIZE, .idefault = (def), .imin = (lo), .imax = (hi), \
     .offset = P(field), .doc = (text)}
#define REAL_DEF(k, def, lo, hi, fl, field, text) \
    {.key = (k), .kind = KVE_PARAM_REAL, .rdefault = (def), .rmin = (lo), .rmax = (hi), \
     .flags = (fl), .offset = P(field), .doc = (text)}
#define SEED_DEF \
    {.key = "seed", .kind = KVE_PARAM_U64, .idefault = 1, .imin = 0, .imax = UINT64_MAX, \
     .offset = P(seed), .doc = "generator seed"}
#define COMMON_HEAD \
    SEED_DEF, SIZE_DEF("steps", 4096, 1, STEPS_MAX, steps, "T, rows"), \
        SIZE_DEF("sinks", 4, 0, STEPS_MAX, sinks, "attention sinks")
#define COMMON_BAND \
    SIZE_DEF("recent", 64, 0, STEPS_MAX, recent, "recency band width"), \
        REAL_DEF("recent_mass", 0.55, 0, 1, 0, recent_mass, "mass on the band"), \
        REAL_DEF("recent_decay", 0.96, 0, 1, KVE_PARAM_MIN_OPEN, recent_decay, \
                 "band weight ratio per position of distance"), \
        SIZE_DEF("epoch", 512, 1, STEPS_MAX, epoch, "heavy-hitter epoch")
#define JITTER_DEF \
    REAL_DEF("jitter", 0.5, 0, 0.95, 0, jitter, \
             "random weight factors are uniform in [1 - jitter, 1 + jitter)")

/* The key `version` alone, to find the table before parsing the rest. */
static const kve_param_def version_def =
    SIZE_DEF("version", VERSION_LATEST, 1, VERSION_LATEST, version, "trace version");

static const kve_param_def v1_defs[] = {
    SIZE_DEF("version", 1, 1, VERSION_LATEST, version, "trace version"),
    COMMON_HEAD,
    REAL_DEF("sink_mass", 0.10, 0, 1, 0, sink_mass, "mass on the sinks"),
    COMMON_BAND,
    SIZE_DEF("heavy", 16, 0, HEAVY_MAX, heavy, "heavy hitters per epoch"),
    REAL_DEF("heavy_mass", 0.20, 0, 1, 0, heavy_mass, "mass on heavy hitters"),
    JITTER_DEF,
};
#define HEAVY_DECAY_DEF \
    REAL_DEF("heavy_decay", 0.5, 0, 0.99, 0, heavy_decay, \
             "a hitter's weight factor per epoch after its first")
static const kve_param_def v2_defs[] = {
    SIZE_DEF("version", 2, 1, VERSION_LATEST, version, "trace version"),
    COMMON_HEAD,
    REAL_DEF("sink_mass", V2_SINK_MASS, 0, 1, 0, sink_mass, "mass on the sinks (fitted)"),
    COMMON_BAND,
    SIZE_DEF("heavy", 16, 0, HEAVY_MAX, heavy, "heavy hitters arriving per epoch"),
    REAL_DEF("heavy_mass", 0.20, 0, 1, 0, heavy_mass, "mass on heavy hitters"),
    HEAVY_DECAY_DEF,
    JITTER_DEF,
};
static const kve_param_def v3_defs[] = {
    SIZE_DEF("version", 3, 1, VERSION_LATEST, version, "trace version"),
    COMMON_HEAD,
    REAL_DEF("sink_mass", V3_SINK_MASS, 0, 1, 0, sink_mass, "mass on the sinks (calibrated)"),
    COMMON_BAND,
    SIZE_DEF("heavy", V3_HEAVY, 0, HEAVY_MAX, heavy,
             "heavy hitters arriving per epoch (calibrated)"),
    REAL_DEF("heavy_mass", V3_HEAVY_MASS, 0, 1, 0, heavy_mass,
             "mass on heavy hitters (calibrated)"),
    HEAVY_DECAY_DEF,
    JITTER_DEF,
};
#undef HEAVY_DECAY_DEF
#undef JITTER_DEF
#undef COMMON_BAND
#undef COMMON_HEAD
#undef SEED_DEF
#undef SIZE_DEF
#undef REAL_DEF
#undef P
enum {
    N_V1_DEFS = sizeof v1_defs / sizeof v1_defs[0],
    N_V2_DEFS = sizeof v2_defs / sizeof v2_defs[0],
    N_V3_DEFS = sizeof v3_defs / sizeof v3_defs[0]
};

typedef struct kve_canonical {
    canon_params p;
    double background_mass; /* 1 - sink_mass - recent_mass - heavy_mass, >= 0 */
    double *band;           /* [min(recent, steps)]: band[d-1] = recent_decay^(d-1) */
    size_t band_len;
    /* version 1 */
    int32_t *heavy_pos; /* [heavy]: the cached epoch's heavy keys, ascending */
    double *heavy_w;    /* [heavy]: their shares, summing to 1 */
    size_t heavy_n;     /* entries valid for cached_epoch */
    size_t cached_epoch;
    /* versions 2 and 3 */
    struct hitter {
        double s;    /* strength, in [1 - jitter, 1 + jitter) */
        int32_t pos; /* position */
    } *hits;            /* [n_hits]: ascending positions, one per slot (16 bytes each) */
    size_t n_hits;      /* hitters at positions < steps */
    double *decay_pow;  /* [steps / epoch + 1]: heavy_decay^k */
    double w_star;      /* heavy / (1 - heavy_decay), the steady-state W */
} kve_canonical;

/* Stream tags keep row, epoch and slot randomness apart. */
enum { STREAM_ROW = 1, STREAM_EPOCH = 2, STREAM_SLOT = 3 };

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

/* First position of version 2's slot j (slot j holds exactly one hitter). */
static uint64_t slot_start(const canon_params *p, uint64_t j)
{
    return (uint64_t)p->sinks + j * (uint64_t)p->epoch / (uint64_t)p->heavy;
}

/* The number of version 2 hitters at positions < steps: one per slot whose
 * start is below steps (the hitter of the last such slot may still fall at
 * or past steps, and is then dropped by the caller). */
static size_t slot_count(const canon_params *p)
{
    if (p->heavy == 0 || p->sinks >= p->steps)
        return 0;
    /* slot_start(j) < steps  <=>  j * epoch < (steps - sinks) * heavy */
    uint64_t room = (uint64_t)(p->steps - p->sinks) * (uint64_t)p->heavy;
    return (size_t)((room + p->epoch - 1) / p->epoch);
}

/* Finds `version=` in the params text, if any, and parses it into p. */
static kve_status find_version(const char *params, canon_params *p)
{
    p->version = VERSION_LATEST;
    for (const char *q = params; q && *q;) {
        size_t item = strcspn(q, ",");
        size_t key_len = strcspn(q, "=,");
        if (key_len < item && key_len == 7 && memcmp(q, "version", 7) == 0)
            return kve__spec_parse_value("canonical", &version_def, q + 8, item - 8, p);
        q += item + (q[item] == ',');
    }
    return KVE_OK;
}

static kve_status canonical_row(void *impl, size_t head, size_t t, double *row);

/* Version 2's hitters: slot j's rng gives its offset, then its strength. */
static void draw_hitters(kve_canonical *c, size_t slots)
{
    const canon_params *p = &c->p;
    size_t n = 0;
    for (size_t j = 0; j < slots; j++) {
        uint64_t lo = slot_start(p, j), width = slot_start(p, j + 1) - lo;
        kve_rng rng;
        seed_stream(&rng, p->seed, STREAM_SLOT, j);
        uint64_t pos = lo + kve_rng_below(&rng, width);
        double s = jitter_factor(&rng, p->jitter);
        if (pos >= p->steps)
            break;
        c->hits[n].pos = (int32_t)pos;
        c->hits[n].s = s;
        n++;
    }
    c->n_hits = n;
    size_t n_pow = p->steps / p->epoch + 1;
    double w = 1.0;
    for (size_t k = 0; k < n_pow; k++) {
        c->decay_pow[k] = w;
        w *= p->heavy_decay;
    }
    c->w_star = (double)p->heavy / (1.0 - p->heavy_decay);
}

static kve_status canonical_open(const char *params, unsigned flags, kve_progress_fn progress,
                                 void *user, kve_trace *tr)
{
    (void)flags; /* rows are distributions by construction */
    (void)progress; /* nothing to validate: rows are made on demand */
    (void)user;
    canon_params p;
    memset(&p, 0, sizeof p);
    kve_status st = find_version(params, &p);
    if (st != KVE_OK)
        return st;
    const kve_param_def *defs = p.version == 1 ? v1_defs : p.version == 2 ? v2_defs : v3_defs;
    size_t n_defs = p.version == 1 ? N_V1_DEFS : p.version == 2 ? N_V2_DEFS : N_V3_DEFS;
    st = kve__spec_parse("canonical", params, defs, n_defs, &p);
    if (st != KVE_OK)
        return st;
    double fixed = p.sink_mass + p.recent_mass + p.heavy_mass;
    if (fixed > 1.0)
        return kve__fail(KVE_EINVAL,
                         "canonical: sink_mass + recent_mass + heavy_mass = %.17g exceeds 1",
                         fixed);
    if (p.version >= 2 && p.heavy > p.epoch)
        return kve__fail(KVE_EINVAL,
                         "canonical: heavy=%zu exceeds epoch=%zu (version %zu places one heavy "
                         "hitter in every epoch/heavy positions)",
                         p.heavy, p.epoch, p.version);

    size_t len = kve__spec_format(NULL, 0, "canonical", defs, n_defs, &p);
    size_t band_len = p.recent < p.steps ? p.recent : p.steps;
    kve_canonical *c = kve__trace_calloc(tr, 1, sizeof *c);
    char *source = kve__trace_malloc(tr, len + 1);
    double *band = kve__trace_malloc(tr, (band_len ? band_len : 1) * sizeof *band);
    /* Version 1: the cached epoch's heavy set; version 2: the hitters and
     * the powers of heavy_decay. */
    size_t n_a = p.version == 1 ? p.heavy : slot_count(&p);
    size_t n_b = p.version == 1 ? p.heavy : p.steps / p.epoch + 1;
    void *a = kve__trace_malloc(tr, (n_a ? n_a : 1) *
                          (p.version == 1 ? sizeof *c->heavy_pos : sizeof *c->hits));
    double *b = kve__trace_malloc(tr, (n_b ? n_b : 1) * sizeof *b);
    if (!c || !source || !band || !a || !b) {
        kve__trace_free(tr, c);
        kve__trace_free(tr, source);
        kve__trace_free(tr, band);
        kve__trace_free(tr, a);
        kve__trace_free(tr, b);
        return kve__fail(KVE_ENOMEM, "canonical: out of memory");
    }
    kve__spec_format(source, len + 1, "canonical", defs, n_defs, &p);
    double w = 1.0;
    for (size_t d = 0; d < band_len; d++) {
        band[d] = w;
        w *= p.recent_decay;
    }
    c->p = p;
    c->background_mass = 1.0 - fixed;
    c->band = band;
    c->band_len = band_len;
    c->cached_epoch = SIZE_MAX;
    if (p.version == 1) {
        c->heavy_pos = a;
        c->heavy_w = b;
    } else {
        c->hits = a;
        c->decay_pow = b;
        draw_hitters(c, n_a);
    }

    tr->steps = p.steps;
    tr->heads = 1;
    tr->layers = 1;
    tr->source = source;
    tr->impl = c;
    return KVE_OK;
}

/* Version 1: draws epoch e's heavy set: min(heavy, start - sinks) distinct
 * keys of [sinks, start), start = e * epoch, uniformly (Floyd's algorithm,
 * kept sorted by insertion), then one jittered share per key in ascending
 * key order, normalised to sum 1. */
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

/* The four classes, in the order their masses are summed. */
enum { SINK, BAND, HEAVY, BG, N_CLASSES };

/* Rescales the masses of the classes present at step t (0 for a class
 * absent) by 1 / their sum and sets row[t] = 0. When every class present
 * has mass 0 (possible only with such parameters) the row is uniform over
 * [0, t) instead, and 0 is returned. */
static int rescale_or_uniform(double m[N_CLASSES], size_t t, double *row)
{
    double total = m[SINK] + m[BAND] + m[HEAVY] + m[BG];
    row[t] = 0.0;
    if (!(total > 0.0)) {
        for (size_t i = 0; i < t; i++)
            row[i] = round_f32(1.0 / (double)t);
        return 0;
    }
    for (int k = 0; k < N_CLASSES; k++)
        m[k] /= total;
    return 1;
}

/* The band [b_lo, t) into row, unrounded: key t - 1 - d gets m_band times
 * recent_decay^d over the sum of those weights. */
static void write_band(const kve_canonical *c, size_t t, size_t b_lo, double m_band, double *row)
{
    size_t width = t - b_lo;
    double sum = 0;
    for (size_t d = 0; d < width; d++)
        sum += c->band[d];
    for (size_t d = 0; d < width; d++)
        row[t - 1 - d] = m_band * c->band[d] / sum;
}

/* Version 1's row t (t >= 1) into row[0 .. t]. Never fails. */
static void make_row_v1(kve_canonical *c, size_t t, double *row)
{
    const canon_params *p = &c->p;
    load_epoch(c, t / p->epoch);
    size_t s_end = p->sinks < t ? p->sinks : t;                   /* sinks [0, s_end) */
    size_t b_lo = t - s_end > p->recent ? t - p->recent : s_end; /* band [b_lo, t) */
    size_t n_heavy = c->heavy_n;
    size_t heavy_in_bg = 0; /* heavy keys below b_lo, i.e. taken out of the background */
    while (heavy_in_bg < n_heavy && (size_t)c->heavy_pos[heavy_in_bg] < b_lo)
        heavy_in_bg++;
    size_t n_bg = (b_lo - s_end) - heavy_in_bg;

    double m[N_CLASSES] = {s_end ? p->sink_mass : 0.0, b_lo < t ? p->recent_mass : 0.0,
                           n_heavy ? p->heavy_mass : 0.0, n_bg ? c->background_mass : 0.0};
    if (!rescale_or_uniform(m, t, row))
        return;
    const double m_sink = m[SINK], m_band = m[BAND], m_heavy = m[HEAVY], m_bg = m[BG];

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
    write_band(c, t, b_lo, m_band, row);
    for (size_t k = 0; k < n_heavy; k++) {
        size_t i = (size_t)c->heavy_pos[k];
        double add = m_heavy * c->heavy_w[k];
        row[i] = i < b_lo ? round_f32(add) : row[i] + add;
    }
    for (size_t i = b_lo; i < t; i++)
        row[i] = round_f32(row[i]);
}

/* The number of version 2 hitters at positions < t (binary search). */
static size_t hitters_before(const kve_canonical *c, size_t t)
{
    size_t lo = 0, hi = c->n_hits;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((size_t)c->hits[mid].pos < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Version 2's row t (t >= 1) into row[0 .. t]. Never fails. Every weight
 * is accumulated in double and rounded to float32 once, at the end. */
static void make_row_v2(kve_canonical *c, size_t t, double *row)
{
    const canon_params *p = &c->p;
    size_t s_end = p->sinks < t ? p->sinks : t;                   /* sinks [0, s_end) */
    size_t b_lo = t - s_end > p->recent ? t - p->recent : s_end; /* band [b_lo, t) */
    size_t n_h = hitters_before(c, t);
    double w_sum = 0; /* W(t), summed in ascending position order */
    for (size_t j = 0; j < n_h; j++)
        w_sum += c->hits[j].s * c->decay_pow[(t - 1 - (size_t)c->hits[j].pos) / p->epoch];

    double m[N_CLASSES] = {s_end ? p->sink_mass : 0.0, b_lo < t ? p->recent_mass : 0.0, 0.0,
                           b_lo > s_end ? c->background_mass : 0.0};
    if (w_sum > 0.0) /* the heavy class is present in proportion min(1, W / W*) */
        m[HEAVY] = w_sum < c->w_star ? p->heavy_mass * (w_sum / c->w_star) : p->heavy_mass;
    if (!rescale_or_uniform(m, t, row))
        return;
    const double m_sink = m[SINK], m_band = m[BAND], m_heavy = m[HEAVY], m_bg = m[BG];

    for (size_t i = 0; i < s_end; i++)
        row[i] = m_sink / (double)s_end;
    if (b_lo > s_end) {
        kve_rng rng;
        seed_stream(&rng, p->seed, STREAM_ROW, t);
        const double jitter = p->jitter;
        double sum = 0;
        for (size_t i = s_end; i < b_lo; i++) {
            double f = jitter_factor(&rng, jitter);
            row[i] = f;
            sum += f;
        }
        double scale = m_bg / sum;
        for (size_t i = s_end; i < b_lo; i++)
            row[i] *= scale;
    }
    write_band(c, t, b_lo, m_band, row);
    if (m_heavy > 0.0) {
        double scale = m_heavy / w_sum;
        for (size_t j = 0; j < n_h; j++) {
            size_t i = (size_t)c->hits[j].pos;
            row[i] += scale * (c->hits[j].s * c->decay_pow[(t - 1 - i) / p->epoch]);
        }
    }
    for (size_t i = 0; i < t; i++)
        row[i] = round_f32(row[i]);
}

static kve_status canonical_row(void *impl, size_t head, size_t t, double *row)
{
    (void)head; /* one head */
    kve_canonical *c = impl;
    if (t == 0)
        row[0] = 1.0;
    else if (c->p.version == 1)
        make_row_v1(c, t, row);
    else
        make_row_v2(c, t, row);
    return KVE_OK;
}

const kve_trace_source_type kve__canonical_source = {
    .prefix = "canonical",
    .open = canonical_open,
    .row = canonical_row,
};
