/* SPDX-License-Identifier: MIT */
/*
 * topk.c - the k largest of a row of scores, ties to the lower position:
 * the harness's top-k sets (eval.c) and the kept set of a prefill
 * (prefill.c).
 *
 * A min-heap on "ranks below" (a smaller score, or an equal score at a
 * higher position) keeps the weakest entry kept so far at its root.
 * Candidates arrive in ascending position, so one whose score equals the
 * root's ranks below it and is skipped: a newcomer replaces the root only on
 * a strictly higher score. O(m log k) for m candidates, no allocation.
 */
#include "internal.h"

static int ranks_below(const kve__top_entry *a, const kve__top_entry *b)
{
    return a->w < b->w || (a->w == b->w && a->pos > b->pos);
}

static void sift_down(kve__top_entry *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_below(&h[l], &h[m]))
            m = l;
        if (r < n && ranks_below(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        kve__top_entry tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
}

size_t kve__top_k(const double *score, size_t m, size_t k, kve__top_entry *heap)
{
    size_t n = 0;
    for (size_t i = 0; i < m && k; i++) {
        kve__top_entry e = {score[i], (int32_t)i};
        if (n < k) {
            heap[n++] = e;
            if (n == k)
                for (size_t j = k / 2; j-- > 0;)
                    sift_down(heap, n, j);
        } else if (e.w > heap[0].w) {
            heap[0] = e;
            sift_down(heap, n, 0);
        }
    }
    return n;
}
