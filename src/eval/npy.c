/* SPDX-License-Identifier: MIT */
/*
 * npy.c - the NumPy .npy reader and writer behind kve_trace.
 *
 * Accepted (everything else is refused with KVE_EFORMAT and a message saying
 * what is wrong): magic "\x93NUMPY", version 1.0 (u16 header length), 2.0 or
 * 3.0 (u32 header length); a header that is a Python dict literal with
 * exactly the keys 'descr', 'fortran_order', 'shape' in any order (single or
 * double quotes, any white space, optional trailing comma); descr '<f4' or
 * '<f8'; fortran_order False; shape (T, T), (H, T, T) or (L, H, T, T) with
 * every dimension >= 1 and T <= INT32_MAX; a file exactly as long as header
 * plus data. All size arithmetic is checked in 64 bits before anything is
 * allocated, so an allocation is never larger than O(T) = O(sqrt(file size)).
 *
 * Layout legend: heads = L * H, layer-major; element (h, t, i) of the data
 * is at data_offset + ((h * T + t) * T + i) * itemsize. Row t of a head is
 * read as its first t + 1 elements (entries above the diagonal are never
 * read). Memory: one row buffer of T elements; the tensor is never loaded.
 *
 * Every row of every head is validated at open, so reading a row can fail
 * only with KVE_EIO (or KVE_EFORMAT if the file changed since it was opened).
 * This file is two pieces: the source "a path" of the trace source table
 * (npy_open, npy_row, npy_free; trace_impl.h) and the writer, which writes
 * any trace. I/O failures carry the system's reason (strerror_r).
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "trace_impl.h"

#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

enum {
    MAGIC_LEN = 6,
    HEADER_MAX = 1 << 20, /* longest header text we read */
    NDIM_MAX = 4,
    KEY_MAX = 32,
    QUOTE = 24 /* characters of header text quoted in a message */
};

const char *kve__reason(int err, char *buf, size_t cap)
{
    if (strerror_r(err, buf, cap) != 0)
        snprintf(buf, cap, "error %d", err);
    return buf;
}

static const char MAGIC[MAGIC_LEN] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

typedef struct kve_npy {
    FILE *f;
    size_t itemsize; /* 4 or 8 */
    size_t steps;    /* T */
    size_t layers;   /* L */
    size_t heads;    /* L * H */
    uint64_t data_offset;
    unsigned flags;
    unsigned char *raw; /* [T * itemsize] bytes of the row being read */
    const char *path;   /* for messages; owned by the trace */
} kve_npy;

/* ---- little-endian decoding ---- */

static uint64_t load_le(const unsigned char *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;)
        v = (v << 8) | p[i];
    return v;
}

static void store_le(unsigned char *p, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++, v >>= 8)
        p[i] = (unsigned char)(v & 0xffu);
}

double kve__npy_decode(const unsigned char *p, size_t itemsize)
{
    if (itemsize == 4) {
        uint32_t bits = (uint32_t)load_le(p, 4);
        float f;
        memcpy(&f, &bits, sizeof f);
        return (double)f;
    }
    uint64_t bits = load_le(p, 8);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* ---- header parsing ---- */

typedef kve__npy_header header;

typedef struct cursor {
    const char *s;
    size_t len, i;
    const char *path;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->i < c->len &&
           (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r'))
        c->i++;
}

static int peek(const cursor *c)
{
    return c->i < c->len ? (unsigned char)c->s[c->i] : -1;
}

/* Refuses with a one-line message quoting the header text at the cursor
 * (control characters shown as '?'). */
static kve_status bad(const cursor *c, const char *what)
{
    char quote[QUOTE + 1];
    size_t n = 0;
    for (size_t i = c->i; i < c->len && n < QUOTE; i++, n++) {
        unsigned char ch = (unsigned char)c->s[i];
        quote[n] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    quote[n] = '\0';
    return kve__fail(KVE_EFORMAT, "%s: .npy header: %s at offset %zu (\"%s\")", c->path, what,
                     c->i, quote);
}

static kve_status expect(cursor *c, char ch, const char *what)
{
    skip_ws(c);
    if (peek(c) != (unsigned char)ch)
        return bad(c, what);
    c->i++;
    return KVE_OK;
}

/* A quoted string without escapes into out[0 .. cap). */
static kve_status parse_string(cursor *c, char *out, size_t cap, const char *what)
{
    skip_ws(c);
    int q = peek(c);
    if (q != '\'' && q != '"')
        return bad(c, what);
    size_t start = ++c->i;
    while (c->i < c->len && c->s[c->i] != (char)q) {
        if (c->s[c->i] == '\\' || c->s[c->i] == '\n')
            return bad(c, "escape or line break inside a string");
        c->i++;
    }
    if (c->i >= c->len)
        return bad(c, "unterminated string");
    size_t n = c->i - start;
    c->i++;
    if (n >= cap) {
        c->i = start;
        return bad(c, "string too long");
    }
    memcpy(out, c->s + start, n);
    out[n] = '\0';
    return KVE_OK;
}

static int match_word(cursor *c, const char *w)
{
    size_t n = strlen(w);
    if (c->len - c->i < n || memcmp(c->s + c->i, w, n) != 0)
        return 0;
    /* The word must end there (no "Falsey"). */
    if (c->i + n < c->len) {
        char nx = c->s[c->i + n];
        if ((nx >= 'a' && nx <= 'z') || (nx >= 'A' && nx <= 'Z') || (nx >= '0' && nx <= '9') ||
            nx == '_')
            return 0;
    }
    c->i += n;
    return 1;
}

static kve_status parse_shape(cursor *c, header *h)
{
    kve_status st = expect(c, '(', "'shape' is not a tuple");
    if (st != KVE_OK)
        return st;
    h->ndim = 0;
    for (;;) {
        skip_ws(c);
        if (peek(c) == ')') {
            c->i++;
            return KVE_OK;
        }
        if (peek(c) == '-')
            return bad(c, "negative dimension in 'shape'");
        if (peek(c) < '0' || peek(c) > '9')
            return bad(c, "'shape' entry is not a non-negative integer");
        uint64_t v = 0;
        while (peek(c) >= '0' && peek(c) <= '9') {
            if (v > ((uint64_t)1 << 62) / 10)
                return bad(c, "dimension in 'shape' is too large");
            v = v * 10 + (uint64_t)(peek(c) - '0');
            c->i++;
        }
        if (peek(c) == 'L') /* Python 2 long suffix */
            c->i++;
        if (h->ndim == NDIM_MAX)
            return bad(c, "'shape' has more than 4 dimensions (want (T, T), (H, T, T) or (L, H, T, T))");
        h->dims[h->ndim++] = v;
        skip_ws(c);
        if (peek(c) == ',') {
            c->i++;
        } else if (peek(c) != ')') {
            return bad(c, "expected ',' or ')' in 'shape'");
        }
    }
}

static kve_status parse_header(const char *text, size_t len, const char *path, header *h)
{
    cursor c = {text, len, 0, path};
    memset(h, 0, sizeof *h);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch >= 0x7f || (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r')) {
            c.i = i;
            return bad(&c, "non-ASCII or control byte");
        }
    }
    kve_status st = expect(&c, '{', "header is not a dict (expected '{')");
    if (st != KVE_OK)
        return st;
    for (;;) {
        skip_ws(&c);
        if (peek(&c) == '}') {
            c.i++;
            break;
        }
        char key[KEY_MAX];
        size_t key_at = c.i;
        if ((st = parse_string(&c, key, sizeof key, "expected a quoted key")) != KVE_OK)
            return st;
        if ((st = expect(&c, ':', "expected ':' after a key")) != KVE_OK)
            return st;
        skip_ws(&c);
        if (strcmp(key, "descr") == 0) {
            if (h->have_descr++) {
                c.i = key_at;
                return bad(&c, "'descr' given twice");
            }
            char descr[KEY_MAX];
            size_t at = c.i;
            if ((st = parse_string(&c, descr, sizeof descr, "'descr' is not a string (structured dtypes are not supported)")) != KVE_OK)
                return st;
            if (strcmp(descr, "<f4") == 0) {
                h->itemsize = 4;
            } else if (strcmp(descr, "<f8") == 0) {
                h->itemsize = 8;
            } else {
                c.i = at;
                return kve__fail(KVE_EFORMAT,
                                 "%s: .npy dtype '%s' is not supported (want '<f4' or '<f8': "
                                 "little-endian float32 or float64)",
                                 path, descr);
            }
        } else if (strcmp(key, "fortran_order") == 0) {
            if (h->have_order++) {
                c.i = key_at;
                return bad(&c, "'fortran_order' given twice");
            }
            if (match_word(&c, "True"))
                return kve__fail(KVE_EFORMAT,
                                 "%s: .npy fortran_order is True: only C-order arrays are "
                                 "supported (save with np.ascontiguousarray)",
                                 path);
            if (!match_word(&c, "False"))
                return bad(&c, "'fortran_order' is not True or False");
        } else if (strcmp(key, "shape") == 0) {
            if (h->have_shape++) {
                c.i = key_at;
                return bad(&c, "'shape' given twice");
            }
            if ((st = parse_shape(&c, h)) != KVE_OK)
                return st;
        } else {
            c.i = key_at;
            return bad(&c, "unknown key (want 'descr', 'fortran_order', 'shape')");
        }
        skip_ws(&c);
        if (peek(&c) == ',') {
            c.i++;
        } else if (peek(&c) != '}') {
            return bad(&c, "expected ',' or '}'");
        }
    }
    skip_ws(&c);
    if (c.i != len)
        return bad(&c, "trailing text after the dict");
    if (!h->have_descr)
        return kve__fail(KVE_EFORMAT, "%s: .npy header has no 'descr' key", path);
    if (!h->have_order)
        return kve__fail(KVE_EFORMAT, "%s: .npy header has no 'fortran_order' key", path);
    if (!h->have_shape)
        return kve__fail(KVE_EFORMAT, "%s: .npy header has no 'shape' key", path);
    return KVE_OK;
}

/* ---- open ---- */

static void shape_text(const header *h, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < h->ndim && len < cap; i++) {
        int n = snprintf(out + len, cap - len, "%s%llu", i ? ", " : "",
                         (unsigned long long)h->dims[i]);
        len += n > 0 ? (size_t)n : 0;
    }
}

static int mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

kve_status kve__npy_read_at(FILE *f, const char *path, uint64_t offset, void *buf, size_t n,
                            const char *what)
{
    if (offset > (uint64_t)INT64_MAX || fseeko(f, (off_t)offset, SEEK_SET) != 0) {
        char why[128];
        return kve__fail(KVE_EIO, "%s: cannot seek to the %s (offset %llu): %s", path, what,
                         (unsigned long long)offset, kve__reason(errno, why, sizeof why));
    }
    /* Sizes were checked against the file first, so a short read means the
     * file shrank or failed underneath us: an I/O error either way. */
    if (n && fread(buf, 1, n, f) != n) {
        char why[128];
        return kve__fail(KVE_EIO, "%s: %s while reading the %s", path,
                         ferror(f) ? kve__reason(errno, why, sizeof why) : "unexpected end of file",
                         what);
    }
    return KVE_OK;
}

/* Reads row t of head h into raw and decodes it into row[0 .. t] without
 * checks or normalisation. */
static kve_status read_row(kve_npy *n, size_t h, size_t t, double *row)
{
    uint64_t T = n->steps;
    uint64_t offset = n->data_offset + (((uint64_t)h * T + t) * T) * n->itemsize;
    size_t bytes = (t + 1) * n->itemsize;
    kve_status st = kve__npy_read_at(n->f, n->path, offset, n->raw, bytes, "trace data");
    if (st != KVE_OK)
        return st;
    for (size_t i = 0; i <= t; i++)
        row[i] = kve__npy_decode(n->raw + i * n->itemsize, n->itemsize);
    return KVE_OK;
}

/* Checks row t of head h (in row[0 .. t]) and returns its sum in *sum. */
static kve_status check_row(const kve_npy *n, size_t h, size_t t, const double *row, double *sum)
{
    return kve__trace_check_row(n->path, n->heads, n->layers, n->flags, h, t, row, sum);
}

static kve_status validate(kve_npy *n, double *row, kve_progress_fn progress, void *user)
{
    uint64_t total = (uint64_t)n->heads * n->steps, done = 0;
    if (progress && progress(user, 0, total))
        return kve__fail(KVE_ECANCELED, "%s: validation canceled at row 0 of %llu", n->path,
                         (unsigned long long)total);
    for (size_t h = 0; h < n->heads; h++)
        for (size_t t = 0; t < n->steps; t++) {
            double sum;
            kve_status st = read_row(n, h, t, row);
            if (st == KVE_OK)
                st = check_row(n, h, t, row, &sum);
            if (st != KVE_OK)
                return st;
            done++;
            if (progress && progress(user, done, total))
                return kve__fail(KVE_ECANCELED, "%s: validation canceled at row %llu of %llu",
                                 n->path, (unsigned long long)done, (unsigned long long)total);
        }
    return KVE_OK;
}

kve_status kve__npy_read_header(kve_trace *tr, FILE *f, const char *path, uint64_t at,
                                uint64_t size, header *h, uint64_t *data_offset)
{
    unsigned char pre[12];
    if (at > size || size - at < 10)
        return kve__fail(KVE_EFORMAT, "%s: %llu bytes is too short for a .npy %s", path,
                         (unsigned long long)(size - (at < size ? at : size)),
                         at ? "array" : "file");
    size -= at; /* from here on, sizes and offsets count from `at` */
    kve_status st = kve__npy_read_at(f, path, at, pre, 10, "preamble");
    if (st != KVE_OK)
        return st;
    if (memcmp(pre, MAGIC, MAGIC_LEN) != 0)
        return kve__fail(KVE_EFORMAT, "%s: not a .npy file (bad magic; want \\x93NUMPY)", path);
    unsigned major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0)
        return kve__fail(KVE_EFORMAT, "%s: .npy version %u.%u is not supported (want 1.0, 2.0 "
                         "or 3.0)", path, major, minor);
    size_t pre_len = major == 1 ? 10 : 12;
    if (size < pre_len)
        return kve__fail(KVE_EFORMAT, "%s: truncated .npy preamble", path);
    if (major > 1 && (st = kve__npy_read_at(f, path, at + 10, pre + 10, 2, "preamble")) != KVE_OK)
        return st;
    uint64_t hlen = load_le(pre + 8, major == 1 ? 2 : 4);
    if (hlen > HEADER_MAX)
        return kve__fail(KVE_EFORMAT, "%s: .npy header length %llu exceeds the %d-byte limit",
                         path, (unsigned long long)hlen, HEADER_MAX);
    if (pre_len + hlen > size)
        return kve__fail(KVE_EFORMAT, "%s: truncated .npy header (%llu bytes announced, %llu "
                         "present)", path, (unsigned long long)hlen,
                         (unsigned long long)(size - pre_len));
    char *text = kve__trace_malloc(tr, (size_t)hlen + 1);
    if (!text)
        return kve__fail(KVE_ENOMEM, "%s: out of memory for the .npy header", path);
    st = kve__npy_read_at(f, path, at + pre_len, text, (size_t)hlen, "header");
    if (st == KVE_OK) {
        text[hlen] = '\0';
        st = parse_header(text, (size_t)hlen, path, h);
    }
    kve__trace_free(tr, text);
    *data_offset = at + pre_len + hlen;
    return st;
}

/* Checks the shape and the file size; fills steps/layers/heads. */
static kve_status check_shape(const header *h, const char *path, uint64_t size,
                              uint64_t data_offset, kve_npy *n)
{
    char shape[128];
    shape_text(h, shape, sizeof shape);
    if (h->ndim < 2)
        return kve__fail(KVE_EFORMAT, "%s: .npy shape (%s) has %zu dimensions (want (T, T), "
                         "(H, T, T) or (L, H, T, T))", path, shape, h->ndim);
    uint64_t T = h->dims[h->ndim - 1];
    if (h->dims[h->ndim - 2] != T)
        return kve__fail(KVE_EFORMAT, "%s: .npy shape (%s): the last two dimensions must be "
                         "equal (a T x T attention matrix)", path, shape);
    for (size_t i = 0; i < h->ndim; i++)
        if (h->dims[i] == 0)
            return kve__fail(KVE_EFORMAT, "%s: .npy shape (%s): dimension %zu is 0 (the trace "
                             "would be empty)", path, shape, i);
    if (T > (uint64_t)INT32_MAX)
        return kve__fail(KVE_EFORMAT, "%s: .npy shape (%s): T = %llu exceeds the largest "
                         "position %d", path, shape, (unsigned long long)T, INT32_MAX);
    uint64_t heads = 1, elems, bytes;
    for (size_t i = 0; i + 2 < h->ndim; i++)
        if (!mul_ok(heads, h->dims[i], &heads))
            return kve__fail(KVE_EFORMAT, "%s: .npy shape (%s) is too large", path, shape);
    if (!mul_ok(heads, T, &elems) || !mul_ok(elems, T, &elems) ||
        !mul_ok(elems, h->itemsize, &bytes) || bytes > UINT64_MAX - data_offset ||
        heads > SIZE_MAX)
        return kve__fail(KVE_EFORMAT, "%s: .npy shape (%s) is too large", path, shape);
    if (data_offset + bytes != size)
        return kve__fail(KVE_EFORMAT, "%s: .npy file is %llu bytes but its header and shape "
                         "(%s) of %zu-byte items need %llu (%s)", path,
                         (unsigned long long)size, shape, h->itemsize,
                         (unsigned long long)(data_offset + bytes),
                         size < data_offset + bytes ? "truncated" : "trailing data");
    n->steps = (size_t)T;
    n->heads = (size_t)heads;
    n->layers = h->ndim == 4 ? (size_t)h->dims[0] : 1;
    n->itemsize = h->itemsize;
    n->data_offset = data_offset;
    return KVE_OK;
}

kve_status kve__npy_open_file(const char *path, FILE **f, uint64_t *size)
{
    char why[128];
    FILE *in = fopen(path, "rb");
    if (!in)
        return kve__fail(KVE_EIO, "%s: cannot open for reading: %s", path,
                         kve__reason(errno, why, sizeof why));
    struct stat sb;
    kve_status st = KVE_OK;
    if (fstat(fileno(in), &sb) != 0)
        st = kve__fail(KVE_EIO, "%s: cannot stat: %s", path, kve__reason(errno, why, sizeof why));
    else if (!S_ISREG(sb.st_mode))
        st = kve__fail(KVE_EIO, "%s: not a regular file", path);
    if (st != KVE_OK) {
        fclose(in);
        return st;
    }
    *f = in;
    *size = (uint64_t)sb.st_size;
    return KVE_OK;
}

static void npy_free(void *impl)
{
    kve_npy *n = impl;
    if (n && n->f)
        fclose(n->f);
}

static kve_status npy_open(const char *path, unsigned flags, kve_progress_fn progress, void *user,
                           kve_trace *tr)
{
    size_t plen = strlen(path);
    char *source = kve__trace_malloc(tr, plen + 1);
    kve_npy *n = kve__trace_calloc(tr, 1, sizeof *n);
    if (!source || !n) {
        kve__trace_free(tr, source);
        kve__trace_free(tr, n);
        return kve__fail(KVE_ENOMEM, "%s: out of memory", path);
    }
    memcpy(source, path, plen + 1);
    n->path = source;
    n->flags = flags;
    double *row = NULL;
    uint64_t size = 0;
    kve_status st = kve__npy_open_file(path, &n->f, &size);
    if (st != KVE_OK)
        goto fail;
    header h;
    uint64_t data_offset = 0;
    if ((st = kve__npy_read_header(tr, n->f, path, 0, size, &h, &data_offset)) != KVE_OK)
        goto fail;
    if ((st = check_shape(&h, path, size, data_offset, n)) != KVE_OK)
        goto fail;
    n->raw = kve__trace_malloc(tr, n->steps * n->itemsize);
    row = kve__trace_malloc(tr, n->steps * sizeof *row);
    if (!n->raw || !row) {
        st = kve__fail(KVE_ENOMEM, "%s: out of memory for a row of %zu entries", path, n->steps);
        goto fail;
    }
    if ((st = validate(n, row, progress, user)) != KVE_OK)
        goto fail;
    kve__trace_free(tr, row);
    tr->steps = n->steps;
    tr->heads = n->heads;
    tr->layers = n->layers;
    tr->source = source;
    tr->impl = n;
    return KVE_OK;
fail:
    npy_free(n); /* the file; the blocks go with the discarded trace */
    return st;
}

static kve_status npy_row(void *impl, size_t head, size_t t, double *row)
{
    kve_npy *n = impl;
    kve_status st = read_row(n, head, t, row);
    if (st != KVE_OK)
        return st;
    double sum = 0;
    if ((st = check_row(n, head, t, row, &sum)) != KVE_OK)
        return st; /* the file changed since it was validated */
    if (n->flags & KVE_TRACE_NORMALIZE)
        for (size_t i = 0; i <= t; i++)
            row[i] /= sum;
    return KVE_OK;
}

const kve_trace_source_type kve__npy_source = {
    .prefix = NULL, /* any text that names no other source is a path */
    .open = npy_open,
    .row = npy_row,
    .free = npy_free,
};

/* ---- writer ---- */

/* The v1.0 header text and its padded length: the data starts at a
 * multiple of 64 bytes, as numpy writes it. */
static size_t format_header(size_t T, char *text, size_t cap, size_t *text_len)
{
    int hn = snprintf(text, cap, "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu, %zu), }",
                      T, T);
    *text_len = (size_t)hn; /* < cap: two size_t fit in 128 bytes with the rest */
    size_t total = 10 + *text_len + 1;
    return (total + 63) / 64 * 64;
}

uint64_t kve__npy_bytes(size_t steps)
{
    char text[128];
    size_t len;
    return format_header(steps, text, sizeof text, &len) + (uint64_t)4 * steps * steps;
}

kve_status kve__npy_write_file(kve_trace *tr, size_t head, FILE *f, kve_progress_fn progress,
                               void *user)
{
    size_t T = tr->steps;
    char header_text[128];
    size_t hn;
    size_t padded = format_header(T, header_text, sizeof header_text, &hn);
    double *row = kve__trace_malloc(tr, T * sizeof *row);
    unsigned char *out = kve__trace_malloc(tr, padded > T * 4 ? padded : T * 4);
    kve_status st = KVE_OK;
    char why[128];
    if (!row || !out) {
        st = kve__fail(KVE_ENOMEM, "%s: out of memory for writing", tr->source);
        goto done;
    }
    if (progress && progress(user, 0, T)) {
        st = kve__fail(KVE_ECANCELED, "writing canceled at row 0 of %zu", T);
        goto done;
    }
    memcpy(out, MAGIC, MAGIC_LEN);
    out[6] = 1;
    out[7] = 0;
    store_le(out + 8, padded - 10, 2);
    memcpy(out + 10, header_text, hn);
    memset(out + 10 + hn, ' ', padded - 10 - hn - 1);
    out[padded - 1] = '\n';
    if (fwrite(out, 1, padded, f) != padded) {
        st = kve__fail(KVE_EIO, "write error: %s", kve__reason(errno, why, sizeof why));
        goto done;
    }
    for (size_t t = 0; t < T; t++) {
        if ((st = kve_trace_row(tr, head, t, row, T)) != KVE_OK)
            goto done;
        for (size_t i = 0; i < T; i++) {
            if (i <= t && !(row[i] <= FLT_MAX)) { /* row 0 is not held to sum 1 */
                st = kve__fail(KVE_ERANGE, "row %zu, key %zu: weight %g does not fit float32", t,
                               i, row[i]);
                goto done;
            }
            float v = i <= t ? (float)row[i] : 0.0f;
            uint32_t bits;
            memcpy(&bits, &v, sizeof bits);
            store_le(out + 4 * i, bits, 4);
        }
        if (fwrite(out, 4, T, f) != T) {
            st = kve__fail(KVE_EIO, "write error at row %zu: %s", t,
                           kve__reason(errno, why, sizeof why));
            goto done;
        }
        if (progress && progress(user, t + 1, T)) {
            st = kve__fail(KVE_ECANCELED, "writing canceled at row %zu of %zu", t + 1, T);
            goto done;
        }
    }
done:
    kve__trace_free(tr, row);
    kve__trace_free(tr, out);
    return st;
}

kve_status kve_trace_write_npy(kve_trace *tr, size_t head, const char *path)
{
    if (!tr)
        return kve__fail(KVE_EINVAL, "trace is NULL");
    if (!path || !*path)
        return kve__fail(KVE_EINVAL, "output path is %s", path ? "empty" : "NULL");
    if (head >= tr->heads)
        return kve__fail(KVE_EINVAL, "head %zu is out of range (the trace has %zu heads)", head,
                         tr->heads);
    size_t plen = strlen(path);
    static const char suffix[] = ".tmp.XXXXXX";
    char *tmp = kve__trace_malloc(tr, plen + sizeof suffix);
    if (!tmp)
        return kve__fail(KVE_ENOMEM, "%s: out of memory for writing", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, suffix, sizeof suffix);

    char why[128];
    kve_status st = KVE_OK;
    int fd = mkstemp(tmp);
    if (fd < 0) {
        st = kve__fail(KVE_EIO, "%s: cannot create a temporary file beside it: %s", path,
                       kve__reason(errno, why, sizeof why));
        goto done;
    }
    (void)fchmod(fd, 0644);
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        st = kve__fail(KVE_EIO, "%s: cannot open the temporary file: %s", path,
                       kve__reason(errno, why, sizeof why));
        close(fd);
        goto unlink_tmp;
    }
    st = kve__npy_write_file(tr, head, f, NULL, NULL);
    if (st != KVE_OK) {
        char inner[256];
        snprintf(inner, sizeof inner, "%s", kve_last_error());
        fclose(f);
        st = kve__fail(st, "%s: %s", path, inner);
        goto unlink_tmp;
    }
    if (fclose(f) != 0) {
        st = kve__fail(KVE_EIO, "%s: error closing the written file: %s", path,
                       kve__reason(errno, why, sizeof why));
        goto unlink_tmp;
    }
    if (rename(tmp, path) != 0) {
        st = kve__fail(KVE_EIO, "%s: cannot rename the temporary file into place: %s", path,
                       kve__reason(errno, why, sizeof why));
        goto unlink_tmp;
    }
    goto done;
unlink_tmp:
    remove(tmp);
done:
    kve__trace_free(tr, tmp);
    return st;
}
