/* SPDX-License-Identifier: MIT */
/*
 * fuzz_jsonl.c - the JSON reader of the tool (tools/jsonl.c), which reads
 * back shard lines (merge) and committed measurement files (docs, plots).
 *
 * Input: one line (any bytes). Checked properties:
 *   - jv_parse accepts exactly the lines that are one JSON value: a refusal
 *     is a non-empty one-line message ending in "at column C", C within the
 *     line; an accepted tree's values delimit their own text, and its
 *     objects hold no key twice;
 *   - jrow_parse returns 0 or -1; a refusal leaves the row empty and a
 *     non-empty one-line message; it accepts exactly the objects whose
 *     members are all scalars;
 *   - an accepted row has distinct keys, strings without NUL bytes, numbers
 *     that strtod reads whole, and true/false/null spelled so;
 *   - written back as JSON (every byte >= 0x80 and every control character
 *     escaped as \u, the rest as is) it parses to the same fields: the
 *     escapes and the UTF-8 they stand for round-trip.
 * Inputs are parsed as given (not NUL-terminated), so a read past the end is
 * an ASan finding.
 */
#include "jsonl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The tool's allocators, which jsonl.c uses (they exit on failure there). */
void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        abort();
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        abort();
    return q;
}

#define CHECK(c)                                                                                  \
    do {                                                                                          \
        if (!(c)) {                                                                               \
            fprintf(stderr, "fuzz_jsonl: CHECK(%s) failed at line %d\n", #c, __LINE__);          \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        b->p = realloc(b->p, b->cap);
        CHECK(b->p != NULL);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* A UTF-8 sequence at s (of at most n bytes) decoded, or 0 when it is not a
 * well-formed one; *len gets its length. */
static unsigned utf8(const unsigned char *s, size_t n, size_t *len)
{
    unsigned c = s[0];
    size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (k == 0 || k > n)
        return 0;
    unsigned cp = k == 1 ? c : c & (0x7fu >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    *len = k;
    return cp;
}

/* Writes s as a JSON string; returns 0 when s is not valid UTF-8 (such a
 * string cannot be written with escapes, so the round trip is skipped). */
static int put_string(buf *b, const char *s)
{
    put(b, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        char esc[16];
        if (u[i] == '"' || u[i] == '\\') {
            esc[0] = '\\', esc[1] = (char)u[i];
            put(b, esc, 2);
            i++;
            continue;
        }
        if (u[i] >= 0x20 && u[i] < 0x80) {
            put(b, (const char *)u + i, 1);
            i++;
            continue;
        }
        size_t len = 0;
        unsigned cp = utf8(u + i, n - i, &len);
        if (cp == 0)
            return 0;
        if (cp >= 0x10000) {
            unsigned v = cp - 0x10000;
            snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
        } else {
            snprintf(esc, sizeof esc, "\\u%04x", cp);
        }
        put(b, esc, strlen(esc));
        i += len;
    }
    put(b, "\"", 1);
    return 1;
}

static int one_line(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20)
            return 0;
    return 1;
}

/* A tree's values delimit their own text in the line, inside their parent's;
 * no object holds a key twice. */
static void check_node(const jv *v, size_t lo, size_t hi)
{
    CHECK(lo <= v->start && v->start < v->end && v->end <= hi);
    CHECK((v->kind == JV_STRING || v->kind == JV_NUMBER) == (v->text != NULL));
    for (size_t i = 0; i < v->n; i++) {
        check_node(&v->child[i], v->start, v->end);
        CHECK((v->kind == JV_OBJECT) == (v->child[i].key != NULL));
        for (size_t j = 0; v->kind == JV_OBJECT && j < i; j++)
            CHECK(strcmp(v->child[j].key, v->child[i].key) != 0);
    }
}

/* jv_parse on the line (NUL-terminated copy; a line with a NUL byte is
 * refused by jrow_parse before the parser sees it). */
static void check_tree(const char *line, size_t size, char *err, size_t cap)
{
    if (memchr(line, '\0', size))
        return;
    char *s = malloc(size + 1);
    CHECK(s != NULL);
    memcpy(s, line, size);
    s[size] = '\0';
    jv *v = jv_parse(s, err, cap);
    if (v) {
        check_node(v, 0, size);
        jv_free(v);
    } else {
        /* the last " at column ": a message may quote the input (a key) */
        const char *at = strstr(err, " at column ");
        for (const char *next = at; next; next = strstr(at + 1, " at column "))
            at = next;
        CHECK(at != NULL && one_line(err));
        CHECK(strtoul(at + 11, NULL, 10) <= size + 1);
    }
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16)
        return 0;
    char *line = malloc(size ? size : 1);
    CHECK(line != NULL);
    if (size)
        memcpy(line, data, size);
    char err[160];
    check_tree(line, size, err, sizeof err);
    jrow row;
    int rc = jrow_parse(line, size, &row, err, sizeof err);
    CHECK(rc == 0 || rc == -1);
    if (rc != 0) {
        CHECK(row.n == 0 && row.f == NULL);
        CHECK(err[0] != '\0' && one_line(err));
        free(line);
        return 0;
    }
    buf b = {NULL, 0, 0};
    int writable = 1;
    put(&b, "{", 1);
    for (size_t i = 0; i < row.n; i++) {
        const jfield *f = &row.f[i];
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(row.f[j].key, f->key) != 0);
        CHECK(jrow_get(&row, f->key) == f);
        if (f->type == JV_NUMBER) {
            char *end;
            (void)strtod(f->text, &end);
            CHECK(*end == '\0' && end != f->text);
        } else if (f->type == JV_TRUE || f->type == JV_FALSE) {
            CHECK(strcmp(f->text, f->type == JV_TRUE ? "true" : "false") == 0);
        } else if (f->type == JV_NULL) {
            CHECK(strcmp(f->text, "null") == 0);
        }
        if (i)
            put(&b, ", ", 2);
        writable &= put_string(&b, f->key);
        put(&b, ": ", 2);
        if (f->type == JV_STRING)
            writable &= put_string(&b, f->text);
        else
            put(&b, f->text, strlen(f->text));
    }
    put(&b, "}", 1);
    if (writable) {
        jrow back;
        CHECK(jrow_parse(b.p, b.n, &back, err, sizeof err) == 0);
        CHECK(back.n == row.n);
        for (size_t i = 0; i < row.n; i++) {
            CHECK(strcmp(back.f[i].key, row.f[i].key) == 0);
            CHECK(strcmp(back.f[i].text, row.f[i].text) == 0);
            CHECK(back.f[i].type == row.f[i].type);
        }
        jrow_free(&back);
    }
    free(b.p);
    jrow_free(&row);
    free(line);
    return 0;
}
