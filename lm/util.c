/*
 * util.c - the decoder library's allocation and file reading.
 *
 * Allocation goes through the caller's kve_allocator (kvevict.h, "The
 * allocator"), the C library's for NULL, exactly as the core's does: each
 * block carries its size in a header (as aligned as malloc's blocks), so
 * the decoder's many buffers, grown and freed in many places, go back to
 * the allocator with exactly the size they were asked for. Errors are the
 * core's: kve_set_error sets the thread's message, kve_last_error reads it.
 */
#define _POSIX_C_SOURCE 200809L /* fileno, fstat */
#include "lm.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The header of a block: its size, padded to the strictest alignment. */
typedef union lm_block {
    size_t bytes; /* the block, header included */
    max_align_t align; /* cppcheck-suppress unusedStructMember ; only its alignment is used */
} lm_block;

/* One call of the allocator interface: a's, or the C library's. */
static void *call(const kve_allocator *a, void *p, size_t old, size_t n)
{
    if (a && a->fn)
        return a->fn(a->ud, p, old, n);
    if (n == 0) {
        free(p);
        return NULL;
    }
    return realloc(p, n);
}

void *lm_realloc(const kve_allocator *a, void *p, size_t n)
{
    if (n > SIZE_MAX - sizeof(lm_block))
        return NULL;
    lm_block *b = p ? (lm_block *)p - 1 : NULL;
    lm_block *q = call(a, b, b ? b->bytes : 0, sizeof(lm_block) + n);
    if (!q)
        return NULL;
    q->bytes = sizeof(lm_block) + n;
    return q + 1;
}

void *lm_malloc(const kve_allocator *a, size_t n)
{
    return lm_realloc(a, NULL, n);
}

void *lm_calloc(const kve_allocator *a, size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size)
        return NULL;
    void *p = lm_malloc(a, count * size);
    if (p)
        memset(p, 0, count * size);
    return p;
}

void lm_free(const kve_allocator *a, void *p)
{
    if (p) {
        lm_block *b = (lm_block *)p - 1;
        (void)call(a, b, b->bytes, 0);
    }
}

/* Reads f to its end into a buffer grown by doubling (never past max + 1
 * bytes and a NUL): what arrives, not what a size claims, bounds memory. */
static kve_status read_stream(const kve_allocator *a, FILE *f, const char *path, size_t max,
                              size_t hint, char **data, size_t *size)
{
    char *buf = NULL;
    size_t n = 0, cap = 0;
    const size_t most = max < SIZE_MAX - 2 ? max + 2 : SIZE_MAX; /* max + 1 data, a NUL */
    kve_status st = KVE_OK;
    for (;;) {
        if (n + 1 >= cap) { /* room for the data and a NUL */
            if (cap >= most) {
                st = kve_set_error(KVE_EFORMAT, "%s is larger than %zu bytes, the most it may "
                                   "hold", path, max);
                break;
            }
            size_t ncap = cap ? (cap > most / 2 ? most : 2 * cap)
                              : (hint + 2 < most ? hint + 2 : most);
            if (ncap < 2)
                ncap = 2;
            char *grown = lm_realloc(a, buf, ncap);
            if (!grown) {
                st = kve_set_error(KVE_ENOMEM, "out of memory reading %s", path);
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
        st = kve_set_error(KVE_EIO, "cannot read %s: %s", path, strerror(errno));
    if (st == KVE_OK && n > max)
        st = kve_set_error(KVE_EFORMAT, "%s is larger than %zu bytes, the most it may hold",
                           path, max);
    if (st != KVE_OK) {
        lm_free(a, buf);
        return st;
    }
    buf[n] = '\0';
    *data = buf;
    *size = n;
    return KVE_OK;
}

kve_status lm_read_file_max(const kve_allocator *a, const char *path, size_t max, char **data,
                            size_t *size)
{
    if (!path || !data || !size)
        return kve_set_error(KVE_EINVAL, "read: NULL argument");
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f)
        return kve_set_error(KVE_EIO, "cannot open %s: %s", path, strerror(errno));
    /* A regular file says its size: refused before a byte is read when it
     * is over max, read in one piece otherwise. */
    size_t hint = 65536;
    struct stat sb;
    if (!is_stdin && fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode)) {
        if ((uintmax_t)sb.st_size > (uintmax_t)max) {
            fclose(f);
            return kve_set_error(KVE_EFORMAT, "%s is %jd bytes, more than %zu, the most it "
                                 "may hold", path, (intmax_t)sb.st_size, max);
        }
        hint = (size_t)sb.st_size;
    }
    kve_status st = read_stream(a, f, path, max, hint < max ? hint : max, data, size);
    if (!is_stdin)
        fclose(f);
    return st;
}

kve_status lm_read_file(const kve_allocator *a, const char *path, char **data, size_t *size)
{
    return lm_read_file_max(a, path, SIZE_MAX - 2, data, size);
}

kve_status lm_read_head(const char *path, void *buf, size_t n, size_t *got)
{
    if (!path || !buf || !got)
        return kve_set_error(KVE_EINVAL, "read: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return kve_set_error(KVE_EIO, "cannot open %s: %s", path, strerror(errno));
    *got = fread(buf, 1, n, f);
    kve_status st = ferror(f) ? kve_set_error(KVE_EIO, "cannot read %s: %s", path,
                                              strerror(errno))
                              : KVE_OK;
    fclose(f);
    return st;
}
