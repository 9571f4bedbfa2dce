/* SPDX-License-Identifier: MIT */
/*
 * kvpress_port.h - what the tests that hold kvevict to ports of kvpress's
 * presses share (test_kvpress_switches.c, test_kvpress_parity.c): kvpress's
 * kept count and top-k, the kept-set comparison, and a head's score read
 * through the lazy gap. Include after check.h and policy_impl.h.
 */
#ifndef KVE_KVPRESS_PORT_H
#define KVE_KVPRESS_PORT_H

/* kvpress's kept count, int(n * (1 - ratio)) at least 1, and its top-k:
 * keep[i] = 1 for the `want` highest scores of n (a tie goes to the lower
 * index; the shapes below have none but the sinks', all kept). */
static size_t n_kept(size_t n, double ratio)
{
    size_t k = (size_t)((double)n * (1.0 - ratio));
    return k ? k : 1;
}

static void top(const double *score, size_t n, size_t want, unsigned char *keep)
{
    memset(keep, 0, n);
    for (size_t k = 0; k < want; k++) {
        size_t best = n;
        for (size_t i = 0; i < n; i++)
            if (!keep[i] && (best == n || score[i] > score[best]))
                best = i;
        keep[best] = 1;
    }
}

/* How many of `got` (count positions) the port's keep[] does not keep. */
static size_t kept_diff(const int32_t *got, size_t count, const unsigned char *keep)
{
    size_t diff = 0;
    for (size_t i = 0; i < count; i++)
        diff += !keep[got[i]];
    return diff;
}

/* The score of slot i of a head, through the lazy gap (policy_impl.h). */
static double head_score(const kve_head *h, size_t i)
{
    size_t src = h->gap != KVE_NONE && i >= h->gap ? i + 1 : i;
    return ((const double *)h->col[KVE_COL_SCORE])[src];
}

#endif
