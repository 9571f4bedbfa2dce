/* SPDX-License-Identifier: MIT */
/*
 * alloc.c - the one place the library allocates.
 *
 * Invariant: with the hook unarmed (the default) these are plain
 * malloc/calloc/realloc/free. Armed by kve__alloc_fail_after(k), the first k
 * allocations of this thread succeed and every later one returns NULL, which
 * lets a test walk a failure through every allocation of a constructor.
 * The counters are thread-local, so tests may arm the hook in one thread
 * while others run normally.
 */
#include "internal.h"

#include <stdlib.h>

static _Thread_local size_t allowed = SIZE_MAX; /* allocations left before failing */
static _Thread_local size_t made;               /* allocations since the last arming */

static bool take_one(void)
{
    if (allowed == 0)
        return false;
    if (allowed != SIZE_MAX)
        allowed--;
    made++;
    return true;
}

size_t kve__alloc_fail_after(size_t k)
{
    size_t n = made;
    made = 0;
    allowed = k;
    return n;
}

void *kve__malloc(size_t n)
{
    return take_one() ? malloc(n ? n : 1) : NULL;
}

void *kve__calloc(size_t count, size_t size)
{
    return take_one() ? calloc(count ? count : 1, size ? size : 1) : NULL;
}

void *kve__realloc(void *ptr, size_t n)
{
    return take_one() ? realloc(ptr, n ? n : 1) : NULL;
}

void kve__free(void *ptr)
{
    free(ptr);
}
