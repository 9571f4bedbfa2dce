/* SPDX-License-Identifier: MIT */
/*
 * jsonl.c - one line of JSON Lines, a flat object, into a row of fields
 * (jsonl.h states the accepted subset).
 *
 * A recursive-descent reader over [p, end) that never reads past end (the
 * line need not be NUL-terminated). Every refusal frees what the row held so
 * far and leaves a one-line message naming the byte offset (a control
 * character quoted from the input shows as '?'); every allocation is
 * checked (an allocation failure is a refusal too). Strings are unescaped
 * into buffers as long as their source, which bounds their UTF-8 output.
 */
#include "jsonl.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct reader {
    const char *start, *p, *end;
    char *err;
    size_t errcap;
} reader;

static int fail(reader *r, const char *fmt, ...)
{
    if (r->errcap) {
        int n = snprintf(r->err, r->errcap, "at byte %zu: ", (size_t)(r->p - r->start));
        if (n > 0 && (size_t)n < r->errcap) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(r->err + n, r->errcap - (size_t)n, fmt, ap);
            va_end(ap);
        }
        for (char *c = r->err; *c; c++) /* one line, whatever the input held */
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
    }
    return -1;
}

static void skip_ws(reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\r' || *r->p == '\n'))
        r->p++;
}

static int hex4(reader *r, unsigned *out)
{
    if (r->end - r->p < 4)
        return fail(r, "a \\u escape needs four hex digits");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = r->p[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d == 16)
            return fail(r, "a \\u escape needs four hex digits");
        v = v * 16 + d;
    }
    r->p += 4;
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* A string at r->p (its opening quote) into a fresh *out. The output is
 * never longer than the source: an escape of k bytes yields at most k. */
static int string(reader *r, char **out)
{
    const char *q = r->p + 1;
    while (q < r->end && *q != '"')
        q += *q == '\\' && q + 1 < r->end ? 2 : 1;
    if (q >= r->end)
        return fail(r, "a string is not terminated");
    char *s = malloc((size_t)(q - r->p));
    if (!s)
        return fail(r, "out of memory");
    size_t n = 0;
    r->p++;
    while (*r->p != '"') {
        unsigned char c = (unsigned char)*r->p;
        if (c < 0x20) {
            free(s);
            return fail(r, "a control character inside a string");
        }
        if (c != '\\') {
            s[n++] = (char)c;
            r->p++;
            continue;
        }
        char e = r->p[1];
        r->p += 2;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *k = e ? strchr(from, e) : NULL;
        if (k) {
            s[n++] = to[k - from];
            continue;
        }
        unsigned cp, lo;
        if (e != 'u' || hex4(r, &cp) != 0) {
            free(s);
            return e != 'u' ? fail(r, "an unknown escape '\\%c'", e) : -1;
        }
        if (cp >= 0xdc00 && cp <= 0xdfff) {
            free(s);
            return fail(r, "a lone low surrogate");
        }
        if (cp >= 0xd800 && cp <= 0xdbff) {
            if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u') {
                free(s);
                return fail(r, "a high surrogate without its low half");
            }
            r->p += 2;
            if (hex4(r, &lo) != 0 || lo < 0xdc00 || lo > 0xdfff) {
                free(s);
                return fail(r, "a high surrogate without its low half");
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (cp == 0) {
            free(s);
            return fail(r, "\\u0000 inside a string");
        }
        n += put_utf8(s + n, cp);
    }
    r->p++;
    s[n] = '\0';
    *out = s;
    return 0;
}

static int digits(reader *r)
{
    const char *s = r->p;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9')
        r->p++;
    return r->p > s;
}

/* A number in JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int number(reader *r, char **out)
{
    const char *s = r->p;
    if (r->p < r->end && *r->p == '-')
        r->p++;
    if (r->p < r->end && *r->p == '0')
        r->p++;
    else if (!(r->p < r->end && *r->p >= '1' && *r->p <= '9') || !digits(r))
        return fail(r, "a malformed number");
    if (r->p < r->end && *r->p == '.') {
        r->p++;
        if (!digits(r))
            return fail(r, "a malformed number");
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-'))
            r->p++;
        if (!digits(r))
            return fail(r, "a malformed number");
    }
    size_t n = (size_t)(r->p - s);
    char *t = malloc(n + 1);
    if (!t)
        return fail(r, "out of memory");
    memcpy(t, s, n);
    t[n] = '\0';
    *out = t;
    return 0;
}

static int value(reader *r, jfield *f)
{
    static const struct {
        const char *word;
        jv_type type;
    } words[] = {{"true", JV_BOOL}, {"false", JV_BOOL}, {"null", JV_NULL}};
    if (r->p >= r->end)
        return fail(r, "a value is missing");
    char c = *r->p;
    if (c == '"') {
        f->type = JV_STRING;
        return string(r, &f->text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        f->type = JV_NUMBER;
        return number(r, &f->text);
    }
    if (c == '{' || c == '[')
        return fail(r, "nested objects and arrays are not supported");
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(r->end - r->p) >= n && memcmp(r->p, words[i].word, n) == 0) {
            f->text = malloc(n + 1);
            if (!f->text)
                return fail(r, "out of memory");
            memcpy(f->text, words[i].word, n + 1);
            f->type = words[i].type;
            r->p += n;
            return 0;
        }
    }
    return fail(r, "a value is not a string, number, true, false or null");
}

void jrow_free(jrow *row)
{
    for (size_t i = 0; i < row->n; i++) {
        free(row->f[i].key);
        free(row->f[i].text);
    }
    free(row->f);
    row->n = 0;
    row->f = NULL;
}

const jfield *jrow_get(const jrow *r, const char *key)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->f[i].key, key) == 0)
            return &r->f[i];
    return NULL;
}

static int members(reader *r, jrow *row)
{
    size_t cap = 0;
    skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return 0;
    }
    for (;;) {
        skip_ws(r);
        if (r->p >= r->end || *r->p != '"')
            return fail(r, "expected a key (a string)");
        if (row->n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            jfield *g = realloc(row->f, nc * sizeof *g);
            if (!g)
                return fail(r, "out of memory");
            row->f = g;
            cap = nc;
        }
        jfield *f = &row->f[row->n];
        memset(f, 0, sizeof *f);
        if (string(r, &f->key) != 0)
            return -1;
        row->n++; /* owned by the row from here on */
        for (size_t i = 0; i + 1 < row->n; i++)
            if (strcmp(row->f[i].key, f->key) == 0)
                return fail(r, "the key \"%.40s\" is given twice", f->key);
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':')
            return fail(r, "expected ':' after a key");
        r->p++;
        skip_ws(r);
        if (value(r, f) != 0)
            return -1;
        skip_ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == '}') {
            r->p++;
            return 0;
        }
        return fail(r, "expected ',' or '}' after a value");
    }
}

int jrow_parse(const char *line, size_t len, jrow *row, char *err, size_t errcap)
{
    reader r = {line, line, line + len, err, errcap};
    row->n = 0;
    row->f = NULL;
    if (errcap)
        err[0] = '\0';
    skip_ws(&r);
    int rc = r.p < r.end && *r.p == '{' ? (r.p++, members(&r, row)) : fail(&r, "expected '{'");
    if (rc == 0) {
        skip_ws(&r);
        if (r.p != r.end)
            rc = fail(&r, "something follows the object");
    }
    if (rc != 0)
        jrow_free(row);
    return rc;
}
