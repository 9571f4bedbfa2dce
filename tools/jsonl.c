/* SPDX-License-Identifier: MIT */
/*
 * jsonl.c - reading back the JSON Lines the tool writes, for the tables and
 * figures made from committed measurements (`kvevict docs` blocks `jsonl`,
 * `kvevict plot --jsonl`).
 *
 * A file is one flat object per line: keys mapping to strings, numbers,
 * true, false or null; no nesting (the tool never nests a result row's
 * values but for eval's per_head, which is refused here). Each value is
 * kept as text: a string unescaped (\" \\ \/ \b \f \n \r \t; \uXXXX below
 * 0x80 as its byte, else '?'), anything else as written, so a number keeps
 * the digits the tool printed. Blank lines are skipped. Malformed input is
 * bad input (exit 1) naming the file and line.
 * Cost: O(bytes); every row's keys and values are separate strings.
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void add_pair(jrow *r, char *key, char *val, int str)
{
    r->key = xrealloc(r->key, (r->n + 1) * sizeof *r->key);
    r->val = xrealloc(r->val, (r->n + 1) * sizeof *r->val);
    r->str = xrealloc(r->str, (r->n + 1) * sizeof *r->str);
    r->key[r->n] = key;
    r->val[r->n] = val;
    r->str[r->n] = str;
    r->n++;
}

/* A string literal at *p (at its opening quote); returns it unescaped and
 * moves *p past the closing quote; NULL when malformed. */
static char *parse_string(const char **p)
{
    const char *s = *p + 1;
    size_t cap = 16, n = 0;
    char *out = xmalloc(cap);
    for (;;) {
        char c = *s++;
        if (c == '\0' || c == '\n') {
            free(out);
            return NULL;
        }
        if (c == '"')
            break;
        if (c == '\\') {
            char e = *s++;
            const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
            const char *at = e ? strchr(from, e) : NULL;
            if (at) {
                c = to[at - from];
            } else if (e == 'u' && strspn(s, "0123456789abcdefABCDEF") >= 4) {
                char hex[5] = {s[0], s[1], s[2], s[3], 0};
                long v = strtol(hex, NULL, 16);
                c = v < 0x80 ? (char)v : '?';
                s += 4;
            } else {
                free(out);
                return NULL;
            }
        }
        if (n + 2 > cap)
            out = xrealloc(out, cap *= 2);
        out[n++] = c;
    }
    out[n] = '\0';
    *p = s;
    return out;
}

static void skip_blank(const char **p)
{
    while (**p == ' ' || **p == '\t' || **p == '\r')
        (*p)++;
}

/* One line into r; 0 when malformed. */
static int parse_line(const char *p, jrow *r)
{
    skip_blank(&p);
    if (*p++ != '{')
        return 0;
    skip_blank(&p);
    if (*p == '}')
        return 1;
    for (;;) {
        skip_blank(&p);
        if (*p != '"')
            return 0;
        char *key = parse_string(&p);
        if (!key)
            return 0;
        skip_blank(&p);
        if (*p++ != ':') {
            free(key);
            return 0;
        }
        skip_blank(&p);
        char *val;
        int str = *p == '"';
        if (str) {
            val = parse_string(&p);
        } else {
            size_t len = strcspn(p, ",} \t\r\n");
            if (len == 0 || *p == '{' || *p == '[') {
                free(key);
                return 0;
            }
            val = xmalloc(len + 1);
            memcpy(val, p, len);
            val[len] = '\0';
            p += len;
        }
        if (!val) {
            free(key);
            return 0;
        }
        add_pair(r, key, val, str);
        skip_blank(&p);
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p++ != '}')
            return 0;
        skip_blank(&p);
        return *p == '\0' || *p == '\n';
    }
}

static void free_row(jrow *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->key[i]);
        free(r->val[i]);
    }
    free(r->key);
    free(r->val);
    free(r->str);
}

void jsonl_read(jsonl *j, const char *path)
{
    memset(j, 0, sizeof *j);
    FILE *f = fopen(path, "rb");
    if (!f)
        die_input("%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    for (;;) {
        size_t n = 0;
        int c;
        while ((c = fgetc(f)) != EOF && c != '\n') {
            if (n + 2 > cap)
                line = xrealloc(line, cap = cap ? 2 * cap : 256);
            line[n++] = (char)c;
        }
        if (c == EOF && n == 0)
            break;
        if (!line)
            line = xrealloc(line, cap = 256);
        line[n] = '\0';
        lineno++;
        if (strspn(line, " \t\r") == n)
            continue;
        jrow r = {0};
        if (memchr(line, '\0', n) || !parse_line(line, &r)) {
            free_row(&r);
            free(line);
            fclose(f);
            die_input("%s:%zu: not a flat JSON object", path, lineno);
        }
        j->rows = xrealloc(j->rows, (j->n + 1) * sizeof *j->rows);
        j->rows[j->n++] = r;
    }
    int bad = ferror(f);
    fclose(f);
    free(line);
    if (bad)
        die_input("%s: cannot read: %s", path, strerror(errno));
}

void jsonl_free(jsonl *j)
{
    for (size_t i = 0; i < j->n; i++)
        free_row(&j->rows[i]);
    free(j->rows);
    memset(j, 0, sizeof *j);
}

const char *jrow_get(const jrow *r, const char *key)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->key[i], key) == 0)
            return r->val[i];
    return NULL;
}

int jrow_where(const jrow *r, const char *const *where, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(where[i], '=');
        int negate = eq && eq > where[i] && eq[-1] == '!';
        size_t klen = eq ? (size_t)(eq - where[i]) - (size_t)negate : strlen(where[i]);
        const char *v = NULL;
        for (size_t k = 0; k < r->n && !v; k++)
            if (strlen(r->key[k]) == klen && strncmp(r->key[k], where[i], klen) == 0)
                v = r->val[k];
        if (!v || (eq && (strcmp(v, eq + 1) == 0) == negate))
            return 0;
    }
    return 1;
}
