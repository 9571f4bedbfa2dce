/* SPDX-License-Identifier: MIT */
/*
 * jsonl.c - the tool's one JSON reader, for the JSON Lines it writes and
 * reads back: shard lines (`merge`), committed measurement files (the docs'
 * `table` and `jsonl` blocks, the plots), and the fuzz target fuzz_jsonl.
 *
 * jv_parse is RFC 8259 exactly: objects, arrays, strings (every escape,
 * \uXXXX with surrogate pairs decoded to UTF-8; raw control characters,
 * lone surrogates and \u0000 refused), numbers by the JSON grammar (no
 * leading zeros, no '+', no NaN), true, false, null; white space between
 * tokens; nothing after the value. On top of the grammar: nesting at most
 * JV_MAX_DEPTH deep, and no key twice in one object. A refusal is one line
 * saying what was expected and at which column (1-based), whatever bytes
 * the input held.
 *
 * A parsed value is a tree of jv nodes, each owning its key, text and
 * children; `start`/`end` delimit the value's own text in the line, so a
 * caller can compare two values as written. jrow_parse flattens a line that
 * is one object of scalar members (the rows of every --json output) into
 * fields, and refuses anything nested.
 *
 * Memory comes from xmalloc, xcalloc and xrealloc (cli.h: they exit when it
 * runs out); the parser itself never prints or exits. Cost: O(bytes).
 */
#include "jsonl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JV_MAX_DEPTH = 16 };

typedef struct reader {
    const char *s;
    size_t i;
    char *err;
    size_t cap;
    int failed;
} reader;

static int fail(reader *r, const char *fmt, ...)
{
    if (!r->failed) {
        char what[160];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        snprintf(r->err, r->cap, "%s at column %zu", what, r->i + 1);
        for (char *c = r->err; *c; c++) /* one line, whatever the input held */
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
        r->failed = 1;
    }
    return 0;
}

static void skip_ws(reader *r)
{
    while (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\r' || r->s[r->i] == '\n')
        r->i++;
}

/* A growable string. */
typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static void put(buf *b, char c)
{
    if (b->n + 1 >= b->cap) {
        b->cap = b->cap ? 2 * b->cap : 32;
        b->p = xrealloc(b->p, b->cap);
    }
    b->p[b->n++] = c;
    b->p[b->n] = '\0';
}

static void put_utf8(buf *b, unsigned long cp)
{
    if (cp < 0x80) {
        put(b, (char)cp);
    } else if (cp < 0x800) {
        put(b, (char)(0xc0 | (cp >> 6)));
        put(b, (char)(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        put(b, (char)(0xe0 | (cp >> 12)));
        put(b, (char)(0x80 | ((cp >> 6) & 0x3f)));
        put(b, (char)(0x80 | (cp & 0x3f)));
    } else {
        put(b, (char)(0xf0 | (cp >> 18)));
        put(b, (char)(0x80 | ((cp >> 12) & 0x3f)));
        put(b, (char)(0x80 | ((cp >> 6) & 0x3f)));
        put(b, (char)(0x80 | (cp & 0x3f)));
    }
}

static int hex4(reader *r, unsigned long *out)
{
    unsigned long v = 0;
    for (int k = 0; k < 4; k++) {
        char c = r->s[r->i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return fail(r, "expected 4 hex digits after \\u");
        v = v * 16 + (unsigned long)d;
        r->i++;
    }
    *out = v;
    return 1;
}

/* A string at r->i (the opening quote), decoded into a fresh string. */
static char *read_string(reader *r)
{
    buf b = {NULL, 0, 0};
    put(&b, 'x'); /* allocate, then empty */
    b.n = 0;
    b.p[0] = '\0';
    r->i++;
    for (;;) {
        unsigned char c = (unsigned char)r->s[r->i];
        if (c == '"') {
            r->i++;
            return b.p;
        }
        if (c < 0x20) { /* NUL included */
            fail(r, c ? "raw control character in a string" : "unterminated string");
            free(b.p);
            return NULL;
        }
        r->i++;
        if (c != '\\') {
            put(&b, (char)c);
            continue;
        }
        char e = r->s[r->i++];
        unsigned long cp = 0, lo = 0;
        switch (e) {
        case '"': put(&b, '"'); break;
        case '\\': put(&b, '\\'); break;
        case '/': put(&b, '/'); break;
        case 'b': put(&b, '\b'); break;
        case 'f': put(&b, '\f'); break;
        case 'n': put(&b, '\n'); break;
        case 'r': put(&b, '\r'); break;
        case 't': put(&b, '\t'); break;
        case 'u':
            if (!hex4(r, &cp))
                break;
            if (cp >= 0xd800 && cp < 0xdc00) {
                if (r->s[r->i] != '\\' || r->s[r->i + 1] != 'u') {
                    fail(r, "a high surrogate without its low half");
                    break;
                }
                r->i += 2;
                if (!hex4(r, &lo))
                    break;
                if (lo < 0xdc00 || lo >= 0xe000) {
                    fail(r, "a high surrogate without its low half");
                    break;
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                fail(r, "a low surrogate without its high half");
                break;
            }
            if (cp == 0) {
                fail(r, "\\u0000 in a string");
                break;
            }
            put_utf8(&b, cp);
            break;
        default:
            r->i--;
            fail(r, "unknown escape");
            break;
        }
        if (r->failed) {
            free(b.p);
            return NULL;
        }
    }
}

static int digits(reader *r)
{
    size_t from = r->i;
    while (r->s[r->i] >= '0' && r->s[r->i] <= '9')
        r->i++;
    return r->i > from;
}

/* A number by the JSON grammar; its text as written. */
static int read_number(reader *r)
{
    if (r->s[r->i] == '-')
        r->i++;
    if (r->s[r->i] == '0') {
        r->i++;
        if (r->s[r->i] >= '0' && r->s[r->i] <= '9')
            return fail(r, "leading zero in a number");
    } else if (!digits(r)) {
        return fail(r, "expected a value");
    }
    if (r->s[r->i] == '.') {
        r->i++;
        if (!digits(r))
            return fail(r, "expected digits after '.'");
    }
    if (r->s[r->i] == 'e' || r->s[r->i] == 'E') {
        r->i++;
        if (r->s[r->i] == '+' || r->s[r->i] == '-')
            r->i++;
        if (!digits(r))
            return fail(r, "expected digits in the exponent");
    }
    return 1;
}

static int word(reader *r, const char *w)
{
    size_t n = strlen(w);
    if (strncmp(r->s + r->i, w, n) != 0)
        return fail(r, "expected a value");
    r->i += n;
    return 1;
}

static void add_child(jv *parent, const jv *child)
{
    parent->child = xrealloc(parent->child, (parent->n + 1) * sizeof *parent->child);
    parent->child[parent->n++] = *child;
}

static int read_value(reader *r, jv *v, int depth);

static int read_members(reader *r, jv *v, int depth, char close)
{
    r->i++;
    skip_ws(r);
    if (r->s[r->i] == close) {
        r->i++;
        return 1;
    }
    for (;;) {
        jv m;
        memset(&m, 0, sizeof m);
        if (close == '}') {
            if (r->s[r->i] != '"')
                return fail(r, "expected a key");
            size_t at = r->i;
            m.key = read_string(r);
            if (!m.key)
                return 0;
            for (size_t k = 0; k < v->n; k++)
                if (strcmp(v->child[k].key, m.key) == 0) {
                    r->i = at;
                    free(m.key);
                    return fail(r, "key \"%.40s\" given twice", v->child[k].key);
                }
            skip_ws(r);
            if (r->s[r->i] != ':') {
                free(m.key);
                return fail(r, "expected ':'");
            }
            r->i++;
            skip_ws(r);
        }
        int ok = read_value(r, &m, depth + 1);
        add_child(v, &m); /* owned by v from here, freed with it */
        if (!ok)
            return 0;
        skip_ws(r);
        if (r->s[r->i] == ',') {
            r->i++;
            skip_ws(r);
            continue;
        }
        if (r->s[r->i] == close) {
            r->i++;
            return 1;
        }
        return fail(r, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int read_value(reader *r, jv *v, int depth)
{
    if (depth > JV_MAX_DEPTH)
        return fail(r, "nesting deeper than %d", JV_MAX_DEPTH);
    v->start = r->i;
    int ok;
    switch (r->s[r->i]) {
    case '{':
        v->kind = JV_OBJECT;
        ok = read_members(r, v, depth, '}');
        break;
    case '[':
        v->kind = JV_ARRAY;
        ok = read_members(r, v, depth, ']');
        break;
    case '"':
        v->kind = JV_STRING;
        v->text = read_string(r);
        ok = v->text != NULL;
        break;
    case 't': v->kind = JV_TRUE; ok = word(r, "true"); break;
    case 'f': v->kind = JV_FALSE; ok = word(r, "false"); break;
    case 'n': v->kind = JV_NULL; ok = word(r, "null"); break;
    default:
        v->kind = JV_NUMBER;
        ok = read_number(r);
        if (ok) {
            size_t len = r->i - v->start;
            v->text = xmalloc(len + 1);
            memcpy(v->text, r->s + v->start, len);
            v->text[len] = '\0';
        }
        break;
    }
    v->end = r->i;
    return ok;
}

static void free_members(jv *v)
{
    for (size_t k = 0; k < v->n; k++)
        free_members(&v->child[k]);
    free(v->child);
    free(v->key);
    free(v->text);
}

jv *jv_parse(const char *line, char *err, size_t cap)
{
    reader r = {line, 0, err, cap, 0};
    jv *v = xcalloc(1, sizeof *v);
    skip_ws(&r);
    int ok = read_value(&r, v, 1);
    if (ok) {
        skip_ws(&r);
        if (line[r.i] != '\0')
            ok = fail(&r, "text after the value");
    }
    if (!ok) {
        jv_free(v);
        return NULL;
    }
    return v;
}

void jv_free(jv *v)
{
    if (!v)
        return;
    free_members(v);
    free(v);
}

const jv *jv_get(const jv *obj, const char *key)
{
    if (!obj || obj->kind != JV_OBJECT)
        return NULL;
    for (size_t k = 0; k < obj->n; k++)
        if (strcmp(obj->child[k].key, key) == 0)
            return &obj->child[k];
    return NULL;
}

/* ---- flat rows ---- */

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

const char *jrow_text(const jrow *r, const char *key)
{
    const jfield *f = jrow_get(r, key);
    return f ? f->text : NULL;
}

int jrow_parse(const char *line, size_t len, jrow *row, char *err, size_t errcap)
{
    row->n = 0;
    row->f = NULL;
    const char *nul = memchr(line, '\0', len);
    if (nul) {
        snprintf(err, errcap, "a NUL byte at column %zu", (size_t)(nul - line) + 1);
        return -1;
    }
    char *text = xmalloc(len + 1);
    memcpy(text, line, len);
    text[len] = '\0';
    jv *v = jv_parse(text, err, errcap);
    free(text);
    if (!v)
        return -1;
    if (v->kind != JV_OBJECT) {
        snprintf(err, errcap, "not an object at column %zu", v->start + 1);
        jv_free(v);
        return -1;
    }
    for (size_t i = 0; i < v->n; i++)
        if (v->child[i].kind == JV_OBJECT || v->child[i].kind == JV_ARRAY) {
            snprintf(err, errcap, "a nested object or array at column %zu",
                     v->child[i].start + 1);
            jv_free(v);
            return -1;
        }
    row->f = xcalloc(v->n ? v->n : 1, sizeof *row->f);
    for (size_t i = 0; i < v->n; i++) {
        jv *c = &v->child[i];
        jfield *f = &row->f[i];
        static const char *const words[] = {[JV_NULL] = "null", [JV_FALSE] = "false",
                                            [JV_TRUE] = "true"};
        f->key = c->key; /* the strings move from the tree to the row */
        c->key = NULL;
        f->type = c->kind;
        if (c->text) {
            f->text = c->text;
            c->text = NULL;
        } else {
            size_t n = strlen(words[c->kind]) + 1;
            f->text = memcpy(xmalloc(n), words[c->kind], n);
        }
    }
    row->n = v->n;
    jv_free(v);
    return 0;
}
