/* SPDX-License-Identifier: MIT */
/*
 * jsonl.h - reading back the JSON Lines the tool writes: one flat object per
 * line, whose values are strings, numbers, true, false or null (no nested
 * objects or arrays). Used by the docs blocks and plots that render
 * committed measurement files (docs/data/), and fuzzed (fuzz/fuzz_jsonl.c).
 *
 * The parser is strict JSON (RFC 8259) for that subset: no trailing commas,
 * no duplicate keys, numbers in JSON's grammar, strings with JSON's escapes
 * (\u escapes, surrogate pairs included, become UTF-8; \u0000 and lone
 * surrogates are refused), no control characters inside strings, nothing
 * after the object but white space. It never prints or exits: a refusal is
 * -1 with a one-line message naming the byte offset.
 */
#ifndef KVE_JSONL_H
#define KVE_JSONL_H

#include <stddef.h>

typedef enum { JV_STRING, JV_NUMBER, JV_BOOL, JV_NULL } jv_type;

typedef struct jfield {
    char *key;    /* unescaped, NUL-terminated */
    char *text;   /* a string's unescaped bytes; a number's literal; "true",
                   * "false" or "null" */
    jv_type type;
} jfield;

typedef struct jrow {
    size_t n;
    jfield *f; /* (n) in the order of the line */
} jrow;

/* Parses line[0 .. len) (no newline) into *row (fresh memory; free with
 * jrow_free). Returns 0, or -1 with *row empty and a message ("at byte 12:
 * expected ':' after a key") in err[0 .. errcap). O(len). */
int jrow_parse(const char *line, size_t len, jrow *row, char *err, size_t errcap);
void jrow_free(jrow *row);
/* The field `key` of r, NULL when absent. O(n). */
const jfield *jrow_get(const jrow *r, const char *key);

#endif /* KVE_JSONL_H */
