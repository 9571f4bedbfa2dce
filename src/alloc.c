/* SPDX-License-Identifier: MIT */
/*
 * alloc.c - the one place the library allocates: every request goes to the
 * kve_allocator of the object or call it is for (kvevict.h, "The
 * allocator"), and the C library's when the caller gave none.
 *
 * Invariants: a request is never for 0 bytes (0 becomes 1, on the way in
 * and on the way out, so the size a block is freed with is the size it was
 * asked for); a release never passes NULL; no state is kept here, so
 * threads allocate through distinct objects without any locking.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* The C library's allocator in lua_Alloc's shape (Lua's l_alloc). */
static void *libc_alloc(void *ud, void *ptr, size_t old_size, size_t new_size)
{
    (void)ud;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

kve_allocator kve__allocator(const kve_allocator *a)
{
    if (a && a->fn)
        return *a;
    kve_allocator c = {libc_alloc, NULL};
    return c;
}

void *kve__alloc(const kve_allocator *a, size_t n)
{
    return a->fn(a->ud, NULL, 0, n ? n : 1);
}

void *kve__alloc_zero(const kve_allocator *a, size_t n)
{
    void *p = kve__alloc(a, n);
    if (p)
        memset(p, 0, n ? n : 1);
    return p;
}

void *kve__alloc_array(const kve_allocator *a, size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    return kve__alloc(a, count * size);
}

void kve__dealloc(const kve_allocator *a, void *p, size_t n)
{
    if (p)
        (void)a->fn(a->ud, p, n ? n : 1, 0);
}
