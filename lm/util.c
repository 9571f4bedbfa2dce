/*
 * util.c - the decoder library's error message, allocation hook and file reading.
 *
 * Invariants, as in the core library: the message is thread-local, always
 * NUL-terminated and one printable line; with the hook unarmed the
 * allocators are plain malloc/calloc/realloc, armed by lm_alloc_fail_after(k)
 * the first k allocations of this thread succeed and the rest return NULL.
 */
#include "lm.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[256];
static _Thread_local size_t allowed = SIZE_MAX;
static _Thread_local size_t made;

const char *lm_last_error(void)
{
    return last_error;
}

kve_status(lm_fail)(kve_status s, const char *fmt, ...) /* (name): not the analyser macro */
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

kve_status lm_read_file(const char *path, char **data, size_t *size)
{
    if (!path || !data || !size)
        return lm_fail(KVE_EINVAL, "read: NULL argument");
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f)
        return lm_fail(KVE_EIO, "cannot open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    kve_status st = KVE_OK;
    for (;;) {
        if (n + 1 >= cap) { /* room for the data and a NUL */
            size_t ncap = cap ? 2 * cap : 65536;
            char *grown = ncap > cap ? lm_realloc(buf, ncap) : NULL;
            if (!grown) {
                st = lm_fail(KVE_ENOMEM, "out of memory reading %s", path);
                break;
            }
            buf = grown;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (st == KVE_OK && ferror(f))
        st = lm_fail(KVE_EIO, "cannot read %s: %s", path, strerror(errno));
    if (!is_stdin)
        fclose(f);
    if (st != KVE_OK) {
        lm_free(buf);
        return st;
    }
    buf[n] = '\0';
    *data = buf;
    *size = n;
    return KVE_OK;
}
