/*
 * util.c - the decoder library's error message and allocation hook.
 *
 * Invariants, as in the core library: the message is thread-local, always
 * NUL-terminated and one printable line; with the hook unarmed the
 * allocators are plain malloc/calloc/realloc, armed by lm_alloc_fail_after(k)
 * the first k allocations of this thread succeed and the rest return NULL.
 */
#include "lm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char last_error[256];
static _Thread_local size_t allowed = SIZE_MAX;
static _Thread_local size_t made;

const char *lm_last_error(void)
{
    return last_error;
}

kve_status (lm_fail)(kve_status s, const char *fmt, ...) /* (name): not the analyser macro */
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    for (char *c = last_error; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return s;
}

static int take_one(void)
{
    if (allowed == 0)
        return 0;
    if (allowed != SIZE_MAX)
        allowed--;
    made++;
    return 1;
}

size_t lm_alloc_fail_after(size_t k)
{
    size_t n = made;
    made = 0;
    allowed = k;
    return n;
}

void *lm_malloc(size_t n)
{
    return take_one() ? malloc(n ? n : 1) : NULL;
}

void *lm_calloc(size_t count, size_t size)
{
    return take_one() ? calloc(count ? count : 1, size ? size : 1) : NULL;
}

void *lm_realloc(void *p, size_t n)
{
    return take_one() ? realloc(p, n ? n : 1) : NULL;
}

void lm_free(void *p)
{
    free(p);
}
