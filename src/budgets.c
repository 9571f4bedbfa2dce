/* SPDX-License-Identifier: MIT */
/*
 * budgets.c - one total split into per-layer budgets (kvevict.h, "Budgets
 * across layers"): uniform, PyramidKV's linear schedule, or proportional to
 * weights the caller measured.
 *
 * Every schedule is the same apportionment: each layer gets the floor, and
 * the rest R = total - L * floor is split by weights w_l into quotas
 * q_l = R * w_l / sum(w); layer l gets floor + floor(q_l), and the units the
 * floors leave go one each to the largest fractional parts of q_l, ties to
 * the lower layer (Hamilton's method). So the budgets add up to the total
 * exactly, equal weights give equal budgets (the first R mod L layers one
 * more), and the result is the same on every machine (IEEE double, fixed
 * order of operations).
 * Cost: O(L^2) for L layers (the largest remainders by repeated scans); no
 * allocation.
 */
#include "internal.h"

#include <math.h>

kve_schedule_options kve_schedule_default_options(void)
{
    kve_schedule_options s = {.kind = KVE_SCHEDULE_UNIFORM, .floor = 0, .beta = 20.0,
                              .weights = NULL};
    return s;
}

/* w_l of the schedule (checked). PyramidKV: the top layer's part above the
 * floor is the mean part / beta, the bottom layer's twice the mean minus
 * that, the layers between on the straight line; the weights average 1. */
static double weight(const kve_schedule_options *s, size_t l, size_t L)
{
    switch (s->kind) {
    case KVE_SCHEDULE_PYRAMID: {
        if (L == 1)
            return 1.0;
        double top = 1.0 / s->beta, bottom = 2.0 - top;
        return bottom - (double)l * ((bottom - top) / (double)(L - 1));
    }
    case KVE_SCHEDULE_WEIGHTED: return s->weights[l];
    default: return 1.0;
    }
}

kve_status kve_layer_budgets(size_t total, size_t n_layers, const kve_schedule_options *options,
                             size_t *out)
{
    const kve_schedule_options defaults = kve_schedule_default_options();
    const kve_schedule_options *s = options ? options : &defaults;
    if (!out)
        return kve__fail(KVE_EINVAL, "layer budgets: out is NULL");
    if (n_layers == 0)
        return kve__fail(KVE_EINVAL, "layer budgets: n_layers is 0");
    if (s->kind != KVE_SCHEDULE_UNIFORM && s->kind != KVE_SCHEDULE_PYRAMID &&
        s->kind != KVE_SCHEDULE_WEIGHTED)
        return kve__fail(KVE_EINVAL, "layer budgets: kind %d is not a kve_schedule_kind",
                         (int)s->kind);
    if (s->kind == KVE_SCHEDULE_PYRAMID && !(s->beta >= 1.0 && isfinite(s->beta)))
        return kve__fail(KVE_EINVAL, "layer budgets: beta %g must be finite and at least 1",
                         s->beta);
    if (s->floor && n_layers > total / s->floor)
        return kve__fail(KVE_EINVAL, "layer budgets: total %zu cannot give %zu layers %zu each",
                         total, n_layers, s->floor);
    double sum = 0.0;
    if (s->kind == KVE_SCHEDULE_WEIGHTED) {
        if (!s->weights)
            return kve__fail(KVE_EINVAL, "layer budgets: weights is NULL");
        for (size_t l = 0; l < n_layers; l++) {
            if (!(s->weights[l] >= 0.0 && isfinite(s->weights[l])))
                return kve__fail(KVE_EINVAL, "layer budgets: weights[%zu] = %g is not a finite "
                                 "number >= 0", l, s->weights[l]);
            sum += s->weights[l];
        }
        if (!(sum > 0.0 && isfinite(sum)))
            return kve__fail(KVE_EINVAL, "layer budgets: the weights sum to %g", sum);
    } else {
        for (size_t l = 0; l < n_layers; l++)
            sum += weight(s, l, n_layers);
    }
    size_t rest = total - n_layers * s->floor, given = 0;
    for (size_t l = 0; l < n_layers; l++) {
        double q = (double)rest * (weight(s, l, n_layers) / sum);
        size_t whole = q > (double)rest ? rest : (size_t)q;
        out[l] = whole;
        given += whole;
    }
    /* Rounding may leave the floors a few units off the rest, either way:
     * add to the largest fractional parts, take from the smallest. */
    while (given != rest) {
        int add = given < rest;
        size_t pick = n_layers;
        double pick_frac = 0.0;
        for (size_t l = 0; l < n_layers; l++) {
            double q = (double)rest * (weight(s, l, n_layers) / sum);
            double frac = q - (double)out[l];
            if (!add && out[l] == 0)
                continue;
            if (pick == n_layers || (add ? frac > pick_frac : frac < pick_frac)) {
                pick = l;
                pick_frac = frac;
            }
        }
        if (add) {
            out[pick]++;
            given++;
        } else {
            out[pick]--;
            given--;
        }
    }
    for (size_t l = 0; l < n_layers; l++)
        out[l] += s->floor;
    return KVE_OK;
}
