/* SPDX-License-Identifier: MIT */
/*
 * claims.c - the six claims of the H2O page (docs/policies/h2o.md, "Claims,
 * checked"), each judged on an evalset with the figures behind it: shared by
 * the benchmark report (cmd_bench.c), the claims on several seeds (seeds.c)
 * and the docs' observations block.
 *
 * The claims are judged only on a canonical trace (they are statements about
 * it), and a claim whose figures include a metric over no scored step is
 * "not judged". The criteria were fixed before any figure was seen:
 *  (3) "the gain saturates at 64": retained mass rises by more than
 *      SAT_EPS at each step 16 -> 32 -> 48 -> 64 and no window in
 *      {80, 96, 128} retains more than mass(64) + SAT_EPS;
 *  (5) "within a hundredth": |difference| <= 0.01 on both metrics at both
 *      budgets;
 *  (6) the page's 0.7367: reproduced when ours rounds to it at 4 decimals.
 */
#include "calibrate.h"
#include "cli.h"

#include <math.h>
#include <string.h>

#define SAT_EPS 0.001
#define PAGE_STREAMING_MASS 0.7367

const char *const obs_claims[N_OBS] = {
    "h2o at recent_window 32 retains less mass than streaming at budget 256.",
    "h2o at recent_window 64 beats streaming on both metrics at budget 256.",
    "the gain of widening recent_window saturates at exactly 64.",
    "h2o (defaults) recovers more of the top-32 than every policy that does not read "
    "attention (window, streaming, random), at budgets 256 and 512.",
    "h2o and scissorhands (defaults) land within 0.01 of each other on both metrics at "
    "budgets 256 and 512.",
    "streaming retains 0.7367 of the mass at budget 256 (the page's figure on its trace).",
};

/* The budgets of the page's claims, and bench's default budgets. */
const size_t bench_default_budgets[2] = {256, 512};
const size_t claim_windows[N_CLAIM_WINDOWS] = {16, 32, 48, 64, 80, 96, 128};

const kve_eval_result *h2o_window(evalset *es, size_t w, size_t budget)
{
    char spec[64];
    snprintf(spec, sizeof spec, "h2o:recent_window=%zu", w);
    return evalset_get(es, spec, budget);
}

/* x with `fmt` ("%.4f", "%+.4f"), or n/a for a metric over no scored step;
 * from a ring of buffers, so one printf can take several. The ring is the
 * thread's own: bench --seeds and trace --calibrate judge on threads. */
static const char *num(double x, const char *fmt)
{
    static _Thread_local char ring[32][32];
    static _Thread_local size_t next;
    char *b = ring[next++ % 32];
    if (isnan(x))
        snprintf(b, 32, "n/a");
    else
        snprintf(b, 32, fmt, x);
    return b;
}

#define N4(x) num((x), "%.4f")
#define S4(x) num((x), "%+.4f")

/* One claim: verdict, claim, then the figures behind it. A claim whose
 * figures include a metric over no scored step is not judged. Returns the
 * outcome (OBS_*) and prints when f is not NULL. */
static int obs(FILE *f, int md, int num, int nodata, int ok, const char *verdict_ok,
               const char *claim, const char *figures)
{
    int outcome = nodata ? OBS_NOT_JUDGED : ok ? OBS_HOLDS : OBS_FAILS;
    const char *verdict = nodata ? "not judged" : ok ? verdict_ok : "not reproduced";
    if (!f)
        return outcome;
    if (md)
        fprintf(f, "%d. **%s**: %s\n   %s\n", num, verdict, claim, figures);
    else
        fprintf(f, "(%d) %s: %s\n    %s\n", num, verdict, claim, figures);
    return outcome;
}

static int nan2(double a, double b)
{
    return isnan(a) || isnan(b);
}

int is_calibrated_trace(const char *src)
{
    if (strncmp(src, "canonical", 9) != 0 || (src[9] != '\0' && src[9] != ':'))
        return 0;
    kve_trace *a = NULL, *b = NULL, *v2 = NULL;
    int opened = kve_trace_open(src, NULL, &a) == KVE_OK &&
                 kve_trace_open(BENCH_TRACE, NULL, &b) == KVE_OK &&
                 kve_trace_open("canonical:version=2", NULL, &v2) == KVE_OK;
    int which = !opened                                                   ? 0
                : strcmp(kve_trace_source(a), kve_trace_source(b)) == 0  ? 3
                : strcmp(kve_trace_source(a), kve_trace_source(v2)) == 0 ? 2
                                                                          : 0;
    kve_trace_free(a);
    kve_trace_free(b);
    kve_trace_free(v2);
    return which;
}

void judge_observations(FILE *f, evalset *es, int md, int calibrated, int outcome[N_OBS])
{
    char fig[1024];
    size_t pos = 0;
    const kve_eval_result *s256 = evalset_get(es, "streaming", 256);

    const kve_eval_result *h32 = h2o_window(es, 32, 256), *h64 = h2o_window(es, 64, 256);
    snprintf(fig, sizeof fig, "retained mass: %s %s, %s %s", h32->spec, N4(h32->retained_mass),
             s256->spec, N4(s256->retained_mass));
    outcome[0] = obs(f, md, 1, nan2(h32->retained_mass, s256->retained_mass),
                     h32->retained_mass < s256->retained_mass, "reproduced",
                     obs_claims[0], fig);

    snprintf(fig, sizeof fig, "%s: mass %s, recall %s; %s: mass %s, recall %s", h64->spec,
             N4(h64->retained_mass), N4(h64->top32_recall), s256->spec,
             N4(s256->retained_mass), N4(s256->top32_recall));
    outcome[1] = obs(f, md, 2, nan2(h64->retained_mass, s256->retained_mass),
                     h64->retained_mass > s256->retained_mass &&
                         h64->top32_recall > s256->top32_recall,
                     "reproduced", obs_claims[1], fig);

    double m[N_CLAIM_WINDOWS];
    int rises = 1, flat = 1, nodata = 0;
    size_t i64 = 3;
    pos = (size_t)snprintf(fig, sizeof fig, "h2o retained mass at budget 256 by recent_window:");
    for (size_t i = 0; i < N_CLAIM_WINDOWS; i++) {
        m[i] = h2o_window(es, claim_windows[i], 256)->retained_mass;
        nodata |= isnan(m[i]);
        pos += (size_t)snprintf(fig + pos, sizeof fig - pos, "%s %zu: %s", i ? "," : "",
                                claim_windows[i], N4(m[i]));
        if (i > 0 && i <= i64 && !(m[i] > m[i - 1] + SAT_EPS))
            rises = 0;
        if (i > i64 && m[i] > m[i64] + SAT_EPS)
            flat = 0;
    }
    snprintf(fig + pos, sizeof fig - pos,
             ". Criterion: mass rises by more than %.3f at each step up to 64 (%s) and no "
             "wider window retains more than mass(64) + %.3f (%s).",
             SAT_EPS, rises ? "yes" : "no", SAT_EPS, flat ? "yes" : "no");
    outcome[2] = obs(f, md, 3, nodata, rises && flat, "reproduced", obs_claims[2], fig);

    static const char *const blind[] = {"window", "streaming", "random"};
    int all = 1;
    nodata = 0;
    pos = 0;
    for (size_t b = 0; b < 2; b++) {
        const kve_eval_result *h = evalset_get(es, "h2o", bench_default_budgets[b]);
        nodata |= isnan(h->top32_recall);
        pos += (size_t)snprintf(fig + pos, sizeof fig - pos, "%sbudget %zu: h2o %s",
                                b ? "; " : "", bench_default_budgets[b], N4(h->top32_recall));
        for (size_t j = 0; j < 3; j++) {
            const kve_eval_result *o = evalset_get(es, blind[j], bench_default_budgets[b]);
            pos += (size_t)snprintf(fig + pos, sizeof fig - pos, ", %s %s", blind[j],
                                    N4(o->top32_recall));
            if (!(h->top32_recall > o->top32_recall))
                all = 0;
        }
    }
    snprintf(fig + pos, sizeof fig - pos, " (top-32 recall; full is the unbudgeted ceiling)");
    outcome[3] = obs(f, md, 4, nodata, all, "reproduced", obs_claims[3], fig);

    int near = 1;
    nodata = 0;
    pos = 0;
    for (size_t b = 0; b < 2; b++) {
        const kve_eval_result *h = evalset_get(es, "h2o", bench_default_budgets[b]);
        const kve_eval_result *c = evalset_get(es, "scissorhands", bench_default_budgets[b]);
        double dm = h->retained_mass - c->retained_mass, dr = h->top32_recall - c->top32_recall;
        nodata |= nan2(dm, dr);
        pos += (size_t)snprintf(fig + pos, sizeof fig - pos,
                                "%sbudget %zu: mass h2o %s vs scissorhands %s (%s), "
                                "recall %s vs %s (%s)",
                                b ? "; " : "", bench_default_budgets[b], N4(h->retained_mass),
                                N4(c->retained_mass), S4(dm), N4(h->top32_recall),
                                N4(c->top32_recall), S4(dr));
        if (!(fabs(dm) <= 0.01 && fabs(dr) <= 0.01))
            near = 0;
    }
    outcome[4] = obs(f, md, 5, nodata, near, "reproduced", obs_claims[4], fig);

    snprintf(fig, sizeof fig, "ours: %s %s against the page's 0.7367 (difference %s). %s",
             s256->spec, N4(s256->retained_mass), S4(s256->retained_mass - PAGE_STREAMING_MASS),
             calibrated == 3 ? "sink_mass was fitted to this figure on this trace, at the point "
                               "the calibration chose (docs/trace.md, \"Calibration, version "
                               "3\"): a calibration, not a prediction."
             : calibrated    ? "sink_mass was fitted to this figure on this trace (docs/trace.md, "
                               "\"Calibration\"): a calibration, not a prediction."
                             : "Nothing was fitted to this figure on this trace (the calibration "
                          "uses the default canonical trace), so equality is not expected.");
    outcome[5] = obs(f, md, 6, isnan(s256->retained_mass),
                     fabs(s256->retained_mass - PAGE_STREAMING_MASS) < 0.00005,
                     calibrated ? "fitted" : "reproduced", obs_claims[5], fig);
}

void render_observations(FILE *f, evalset *es, int md, const char *trace)
{
    int outcome[N_OBS];
    judge_observations(f, es, md, f ? is_calibrated_trace(trace) : 0, outcome);
    if (f)
        calib_observations_note(f, md, trace); /* calibrate.c: on version 3 only */
}
