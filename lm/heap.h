/*
 * heap.h - a binary min-heap over an array, written once for the merge
 * queues of tokenizer.c (run.c's encoding) and vocab.c (llama.cpp's).
 *
 * LM_HEAP(prefix, type, before) defines
 *   static void prefix_push(type *heap, size_t *n, type x);
 *   static type prefix_pop(type *heap, size_t *n);     (n > 0)
 * where before(const type *a, const type *b) says a pops first. The array
 * holds at least the most elements ever pushed at once. O(log n) a call.
 */
#ifndef KVE_LM_HEAP_H
#define KVE_LM_HEAP_H

#include <stddef.h>

#define LM_HEAP(prefix, type, before)                                                            \
    static void prefix##_push(type *heap, size_t *n, type x)                                     \
    {                                                                                            \
        size_t i = (*n)++;                                                                       \
        while (i > 0 && before(&x, &heap[(i - 1) / 2])) {                                        \
            heap[i] = heap[(i - 1) / 2];                                                         \
            i = (i - 1) / 2;                                                                     \
        }                                                                                        \
        heap[i] = x;                                                                             \
    }                                                                                            \
    static type prefix##_pop(type *heap, size_t *n)                                              \
    {                                                                                            \
        type top = heap[0], last = heap[--*n];                                                   \
        size_t i = 0;                                                                            \
        for (;;) {                                                                               \
            size_t c = 2 * i + 1;                                                                \
            if (c >= *n)                                                                         \
                break;                                                                           \
            if (c + 1 < *n && before(&heap[c + 1], &heap[c]))                                    \
                c++;                                                                             \
            if (!before(&heap[c], &last))                                                        \
                break;                                                                           \
            heap[i] = heap[c];                                                                   \
            i = c;                                                                               \
        }                                                                                        \
        if (*n)                                                                                  \
            heap[i] = last;                                                                      \
        return top;                                                                              \
    }

#endif /* KVE_LM_HEAP_H */
