/* SPDX-License-Identifier: MIT */
/*
 * jsonl.h - reading back the JSON Lines the tool writes (jsonl.c): one JSON
 * value per line as a tree (jv_parse; `merge` reads shard lines so), or a
 * line that is one flat object, whose values are strings, numbers, true,
 * false or null, as fields (jrow_parse; the committed measurement files of
 * the docs and plots). Fuzzed by fuzz/fuzz_jsonl.c.
 */
#ifndef KVE_JSONL_H
#define KVE_JSONL_H

#include <stddef.h>

/* The tool's allocators (cli.h), which exit when memory runs out; a program
 * that links jsonl.c without the tool defines them. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);

typedef enum { JV_NULL, JV_FALSE, JV_TRUE, JV_NUMBER, JV_STRING, JV_ARRAY, JV_OBJECT } jv_kind;

typedef struct jv {
    jv_kind kind;
    char *key;         /* the member's name inside an object, else NULL */
    char *text;        /* STRING: decoded (UTF-8); NUMBER: as written; else NULL */
    size_t start, end; /* the value's own text: line[start .. end) */
    struct jv *child;  /* ARRAY, OBJECT: the members, in order */
    size_t n;
} jv;

/* Parses `line` (one JSON value and nothing else, RFC 8259, no key twice
 * in an object, nesting at most 16 deep). NULL on refusal, with "what was
 * expected at column C" (one line) in err[0 .. cap). Free with jv_free. */
jv *jv_parse(const char *line, char *err, size_t cap);
void jv_free(jv *v);
/* The member `key` of an object; NULL when absent or obj is no object. */
const jv *jv_get(const jv *obj, const char *key);

typedef struct jfield {
    char *key;    /* unescaped, NUL-terminated */
    char *text;   /* a string's unescaped bytes; a number's literal; "true",
                   * "false" or "null" */
    jv_kind type; /* JV_NULL .. JV_STRING: never nested */
} jfield;

typedef struct jrow {
    size_t n;
    jfield *f; /* (n) in the order of the line */
} jrow;

/* Parses line[0 .. len) (no newline; NUL bytes refused) into *row (fresh
 * memory; free with jrow_free): one object of scalar members. Returns 0, or
 * -1 with *row empty and a one-line message ("expected ':' at column 12")
 * in err[0 .. errcap). O(len). */
int jrow_parse(const char *line, size_t len, jrow *row, char *err, size_t errcap);
void jrow_free(jrow *row);
/* The field `key` of r, NULL when absent. O(n). */
const jfield *jrow_get(const jrow *r, const char *key);
/* Its text, NULL when absent. O(n). */
const char *jrow_text(const jrow *r, const char *key);

#endif /* KVE_JSONL_H */
