/* SPDX-License-Identifier: MIT */
/*
 * outcheck.c - a strict checker for the machine-readable output of the
 * kvevict tool, so the shell tests parse what they read instead of grepping
 * it (and need no Python).
 *
 *   outcheck json  [CHECKS] [FILE|-]   exactly one JSON value (RFC 8259)
 *   outcheck jsonl [CHECKS] [FILE|-]   JSON Lines: one object per line, each
 *                                       line ending in '\n', no blank line
 *   outcheck csv   [CHECKS] [FILE|-]   RFC 4180: a header row of unique
 *                                       names, then rows of as many fields
 * CHECKS (a "record" is the JSON object, each JSON Lines object, or each CSV
 * row under its header):
 *   --count N        exactly N records
 *   --key KEY:TYPES  every record has KEY, of one of TYPES joined by '|':
 *                    string, number, integer, bool, null, object, array
 *                    (CSV: a cell "n/a" is null, a JSON number is number)
 *   --value KEY=RAW  every record's KEY is exactly RAW as written (the JSON
 *                    text of the value, or the CSV cell)
 *   --no-key KEY     no record has KEY
 * The JSON grammar is RFC 8259's, strictly: no trailing commas, no comments,
 * no leading zeros, no NaN, strings of valid UTF-8 without raw control
 * characters, \u escapes with paired surrogates, no duplicate member names.
 * The first error is reported as "FILE:LINE:COL: message" on stderr.
 * Exit status: 0 valid and every check holds, 1 otherwise, 2 bad usage.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_CHECKS = 64, MAX_MEMBERS = 256, MAX_DEPTH = 256 };

typedef enum { T_STRING = 1, T_NUMBER = 2, T_INTEGER = 4, T_BOOL = 8, T_NULL = 16,
               T_OBJECT = 32, T_ARRAY = 64 } vtype;

typedef struct check {
    enum { C_KEY, C_VALUE, C_NO_KEY } kind;
    char key[128];
    unsigned types;  /* C_KEY */
    const char *raw; /* C_VALUE */
} check;

static check checks[MAX_CHECKS];
static size_t n_checks;
static const char *name = "-";
static const unsigned char *buf;
static size_t len, at;

/* One member of the record being checked: name and value span. */
typedef struct member {
    char key[128];
    unsigned type;
    size_t lo, hi; /* raw text [lo, hi) in buf */
} member;

static member members[MAX_MEMBERS];
static size_t n_members;

#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 2, 3)))
#endif
static void fail_at(size_t pos, const char *fmt, ...);

static void fail_at(size_t pos, const char *fmt, ...)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < len; i++) {
        if (buf[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    fprintf(stderr, "%s:%zu:%zu: ", name, line, col);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* ---- JSON ---- */

static int one_line; /* JSON Lines: a value may not span lines */

static void skip_ws(void)
{
    while (at < len && (buf[at] == ' ' || buf[at] == '\t' || buf[at] == '\r' ||
                        (buf[at] == '\n' && !one_line)))
        at++;
}

static void skip_ws_line(void) /* JSON Lines: white space without newlines */
{
    while (at < len && (buf[at] == ' ' || buf[at] == '\t' || buf[at] == '\r'))
        at++;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static unsigned read_u4(void)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = at < len ? hexval(buf[at]) : -1;
        if (h < 0)
            fail_at(at, "\\u needs four hex digits");
        v = v * 16 + (unsigned)h;
        at++;
    }
    return v;
}

/* Parses a string at buf[at] == '"'; copies up to cap-1 bytes of its
 * decoded ASCII-ish content into out (for member names). */
static void parse_string(char *out, size_t cap)
{
    size_t start = at, n = 0;
    at++;
    for (;;) {
        if (at >= len)
            fail_at(start, "unterminated string");
        unsigned c = buf[at];
        if (c == '"') {
            at++;
            break;
        }
        if (c < 0x20)
            fail_at(at, "raw control character 0x%02x in a string", c);
        if (c == '\\') {
            at++;
            if (at >= len)
                fail_at(at, "unterminated escape");
            unsigned e = buf[at++];
            unsigned cp = 0;
            switch (e) {
            case '"': case '\\': case '/': cp = e; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                cp = read_u4();
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    fail_at(at - 6, "lone low surrogate \\u%04x", cp);
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (at + 1 >= len || buf[at] != '\\' || buf[at + 1] != 'u')
                        fail_at(at - 6, "high surrogate \\u%04x without a low one", cp);
                    at += 2;
                    unsigned lo = read_u4();
                    if (lo < 0xdc00 || lo > 0xdfff)
                        fail_at(at - 6, "high surrogate followed by \\u%04x", lo);
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                break;
            default:
                fail_at(at - 1, "invalid escape '\\%c'", (int)e);
            }
            if (out && n + 1 < cap)
                out[n++] = cp < 0x80 ? (char)cp : '?';
            continue;
        }
        /* UTF-8: the length from the lead byte, continuation bytes checked,
         * overlong forms, surrogates and code points past U+10FFFF refused. */
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
                                  : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (k == 0)
            fail_at(at, "invalid UTF-8 lead byte 0x%02x", c);
        unsigned cp = k == 1 ? c : k == 2 ? (c & 0x1f) : k == 3 ? (c & 0x0f) : (c & 0x07);
        for (size_t i = 1; i < k; i++) {
            if (at + i >= len || (buf[at + i] & 0xc0) != 0x80)
                fail_at(at, "truncated UTF-8 sequence");
            cp = (cp << 6) | (buf[at + i] & 0x3f);
        }
        static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            fail_at(at, "invalid UTF-8 (overlong, surrogate or out of range)");
        if (out && n + 1 < cap)
            out[n++] = k == 1 ? (char)c : '?';
        at += k;
    }
    if (out)
        out[n] = '\0';
}

static unsigned parse_number(void)
{
    size_t start = at;
    int integer = 1;
    if (at < len && buf[at] == '-')
        at++;
    if (at >= len || buf[at] < '0' || buf[at] > '9')
        fail_at(start, "invalid value");
    if (buf[at] == '0') {
        at++;
        if (at < len && buf[at] >= '0' && buf[at] <= '9')
            fail_at(start, "number with a leading zero");
    } else {
        while (at < len && buf[at] >= '0' && buf[at] <= '9')
            at++;
    }
    if (at < len && buf[at] == '.') {
        integer = 0;
        at++;
        if (at >= len || buf[at] < '0' || buf[at] > '9')
            fail_at(at, "a digit must follow the decimal point");
        while (at < len && buf[at] >= '0' && buf[at] <= '9')
            at++;
    }
    if (at < len && (buf[at] == 'e' || buf[at] == 'E')) {
        integer = 0;
        at++;
        if (at < len && (buf[at] == '+' || buf[at] == '-'))
            at++;
        if (at >= len || buf[at] < '0' || buf[at] > '9')
            fail_at(at, "a digit must follow the exponent");
        while (at < len && buf[at] >= '0' && buf[at] <= '9')
            at++;
    }
    return integer ? T_NUMBER | T_INTEGER : T_NUMBER;
}

static unsigned parse_value(int depth, int record);

static void literal(const char *word)
{
    size_t n = strlen(word);
    if (len - at < n || memcmp(buf + at, word, n) != 0)
        fail_at(at, "invalid value");
    at += n;
}

/* After an element of the object or array opened at `open`: 1 after a ','
 * (another element follows), 0 after the closing character. */
static int list_next(size_t open, char close, const char *kind, const char *element)
{
    skip_ws();
    if (at >= len)
        fail_at(open, "unterminated %s", kind);
    if (buf[at] == ',' || buf[at] == close)
        return buf[at++] == ',';
    fail_at(at, "expected ',' or '%c' after %s", close, element);
}

/* An object; when `record`, its members are kept for the checks. */
static unsigned parse_object(int depth, int record)
{
    char seen[MAX_MEMBERS][128];
    size_t n_seen = 0;
    size_t open = at;
    at++;
    if (record)
        n_members = 0;
    skip_ws();
    if (at < len && buf[at] == '}') {
        at++;
        return T_OBJECT;
    }
    for (;;) {
        skip_ws();
        if (at >= len || buf[at] != '"')
            fail_at(at, "expected a member name (a string)");
        size_t key_at = at;
        char key[128];
        parse_string(key, sizeof key);
        for (size_t i = 0; i < n_seen; i++)
            if (strcmp(seen[i], key) == 0)
                fail_at(key_at, "duplicate member name \"%s\"", key);
        if (n_seen < MAX_MEMBERS)
            snprintf(seen[n_seen++], sizeof seen[0], "%s", key);
        skip_ws();
        if (at >= len || buf[at] != ':')
            fail_at(at, "expected ':' after a member name");
        at++;
        skip_ws();
        size_t lo = at;
        unsigned t = parse_value(depth + 1, 0);
        if (record && n_members < MAX_MEMBERS) {
            member *m = &members[n_members++];
            snprintf(m->key, sizeof m->key, "%s", key);
            m->type = t;
            m->lo = lo;
            m->hi = at;
        }
        if (!list_next(open, '}', "object", "an object member"))
            return T_OBJECT;
    }
}

static unsigned parse_value(int depth, int record)
{
    if (depth > MAX_DEPTH)
        fail_at(at, "nesting deeper than %d", MAX_DEPTH);
    if (at >= len)
        fail_at(at, "expected a value");
    switch (buf[at]) {
    case '{':
        return parse_object(depth, record);
    case '[': {
        size_t open = at;
        at++;
        skip_ws();
        if (at < len && buf[at] == ']') {
            at++;
            return T_ARRAY;
        }
        do {
            skip_ws();
            parse_value(depth + 1, 0);
        } while (list_next(open, ']', "array", "an array element"));
        return T_ARRAY;
    }
    case '"':
        parse_string(NULL, 0);
        return T_STRING;
    case 't':
        literal("true");
        return T_BOOL;
    case 'f':
        literal("false");
        return T_BOOL;
    case 'n':
        literal("null");
        return T_NULL;
    default:
        return parse_number();
    }
}

/* ---- checks ---- */

static const char *type_names[] = {"string", "number", "integer", "bool", "null", "object",
                                   "array"};

static unsigned parse_types(const char *s)
{
    unsigned t = 0;
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s", s);
    for (char *tok = strtok(tmp, "|"); tok; tok = strtok(NULL, "|")) {
        size_t i = 0;
        while (i < 7 && strcmp(tok, type_names[i]) != 0)
            i++;
        if (i == 7) {
            fprintf(stderr, "outcheck: unknown type '%s'\n", tok);
            exit(2);
        }
        t |= 1u << i;
    }
    return t;
}

static void check_record(size_t record_at, size_t n)
{
    for (size_t c = 0; c < n_checks; c++) {
        const check *k = &checks[c];
        const member *m = NULL;
        for (size_t i = 0; i < n_members && !m; i++)
            if (strcmp(members[i].key, k->key) == 0)
                m = &members[i];
        if (k->kind == C_NO_KEY) {
            if (m)
                fail_at(m->lo, "record %zu has key \"%s\", which it must not", n, k->key);
            continue;
        }
        if (!m)
            fail_at(record_at, "record %zu has no key \"%s\"", n, k->key);
        if (k->kind == C_KEY && !(m->type & k->types))
            fail_at(m->lo, "record %zu: \"%s\" is not of the expected type", n, k->key);
        if (k->kind == C_VALUE &&
            (strlen(k->raw) != m->hi - m->lo || memcmp(buf + m->lo, k->raw, m->hi - m->lo) != 0))
            fail_at(m->lo, "record %zu: \"%s\" is %.*s, expected %s", n, k->key,
                    (int)(m->hi - m->lo), buf + m->lo, k->raw);
    }
}

/* ---- CSV ---- */

typedef struct field {
    size_t lo, hi; /* decoded content is copied to text */
    char text[256];
} field;

/* Parses one CSV field at `at`; stops before ',' or the end of the line. */
static void csv_field(field *f)
{
    size_t n = 0;
    f->lo = at;
    if (at < len && buf[at] == '"') {
        size_t open = at++;
        for (;;) {
            if (at >= len)
                fail_at(open, "unterminated quoted field");
            if (buf[at] == '"') {
                if (at + 1 < len && buf[at + 1] == '"') {
                    if (n + 1 < sizeof f->text)
                        f->text[n++] = '"';
                    at += 2;
                    continue;
                }
                at++;
                break;
            }
            if (n + 1 < sizeof f->text)
                f->text[n++] = (char)buf[at];
            at++;
        }
        if (at < len && buf[at] != ',' && buf[at] != '\n' && buf[at] != '\r')
            fail_at(at, "text after a closing quote");
    } else {
        while (at < len && buf[at] != ',' && buf[at] != '\n' && buf[at] != '\r') {
            if (buf[at] == '"')
                fail_at(at, "a quote inside an unquoted field");
            if (n + 1 < sizeof f->text)
                f->text[n++] = (char)buf[at];
            at++;
        }
    }
    f->hi = at;
    f->text[n] = '\0';
}

/* Parses one record (a line); returns the number of fields. */
static size_t csv_record(field *fields, size_t cap)
{
    size_t n = 0;
    for (;;) {
        if (n == cap)
            fail_at(at, "more than %zu fields", cap);
        csv_field(&fields[n++]);
        if (at < len && buf[at] == ',') {
            at++;
            continue;
        }
        if (at < len && buf[at] == '\r')
            at++;
        if (at >= len || buf[at] != '\n')
            fail_at(at, "a record must end with a newline");
        at++;
        return n;
    }
}

static unsigned cell_type(const char *s)
{
    if (strcmp(s, "n/a") == 0)
        return T_NULL | T_STRING;
    const unsigned char *save_buf = buf;
    size_t save_len = len, save_at = at;
    unsigned t = T_STRING;
    size_t n = strlen(s);
    /* a JSON number exactly, else a string */
    int ok = n > 0 && (s[0] == '-' || (s[0] >= '0' && s[0] <= '9'));
    if (ok) {
        size_t i = 0;
        int digits = 0;
        if (s[i] == '-')
            i++;
        if (s[i] == '0') {
            i++;
            digits = 1;
        } else {
            while (s[i] >= '0' && s[i] <= '9') {
                i++;
                digits = 1;
            }
        }
        int integer = 1;
        if (s[i] == '.') {
            integer = 0;
            i++;
            int d = 0;
            while (s[i] >= '0' && s[i] <= '9') {
                i++;
                d = 1;
            }
            digits &= d;
        }
        if (s[i] == 'e' || s[i] == 'E') {
            integer = 0;
            i++;
            if (s[i] == '+' || s[i] == '-')
                i++;
            int d = 0;
            while (s[i] >= '0' && s[i] <= '9') {
                i++;
                d = 1;
            }
            digits &= d;
        }
        if (digits && i == n)
            t |= integer ? T_NUMBER | T_INTEGER : T_NUMBER;
    }
    buf = save_buf;
    len = save_len;
    at = save_at;
    return t;
}

static size_t check_csv(void)
{
    static field head[MAX_MEMBERS], row[MAX_MEMBERS];
    if (len == 0)
        fail_at(0, "empty input: no header row");
    size_t nh = csv_record(head, MAX_MEMBERS);
    for (size_t i = 0; i < nh; i++) {
        if (head[i].text[0] == '\0')
            fail_at(head[i].lo, "empty column name");
        for (size_t j = 0; j < i; j++)
            if (strcmp(head[i].text, head[j].text) == 0)
                fail_at(head[i].lo, "duplicate column name \"%s\"", head[i].text);
    }
    size_t records = 0;
    while (at < len) {
        size_t row_at = at;
        size_t nf = csv_record(row, MAX_MEMBERS);
        records++;
        if (nf != nh)
            fail_at(row_at, "row %zu has %zu fields, the header %zu", records, nf, nh);
        n_members = 0;
        for (size_t i = 0; i < nf; i++) {
            member *m = &members[n_members++];
            snprintf(m->key, sizeof m->key, "%.127s", head[i].text);
            m->type = cell_type(row[i].text);
            m->lo = row[i].lo;
            m->hi = row[i].hi;
        }
        check_record(row_at, records);
    }
    return records;
}

/* ---- main ---- */

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "outcheck: cannot open %s\n", path);
        exit(1);
    }
    size_t cap = 1 << 16, m = 0;
    unsigned char *b = malloc(cap);
    for (;;) {
        if (!b) {
            fprintf(stderr, "outcheck: out of memory\n");
            exit(1);
        }
        size_t got = fread(b + m, 1, cap - m, f);
        m += got;
        if (got == 0)
            break;
        if (m == cap)
            b = realloc(b, cap *= 2);
    }
    if (f != stdin)
        fclose(f);
    *n = m;
    return b;
}

static void usage(void)
{
    fprintf(stderr, "usage: outcheck json|jsonl|csv [--count N] [--key KEY:TYPES]... "
                    "[--value KEY=RAW]... [--no-key KEY]... [FILE|-]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    const char *mode = argv[1];
    if (strcmp(mode, "json") != 0 && strcmp(mode, "jsonl") != 0 && strcmp(mode, "csv") != 0)
        usage();
    long count = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || strcmp(a, "-") == 0) {
            name = a;
            continue;
        }
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (strcmp(a, "--count") == 0) {
            count = atol(v);
            continue;
        }
        if (n_checks == MAX_CHECKS)
            usage();
        check *c = &checks[n_checks++];
        const char *sep = strcmp(a, "--key") == 0 ? strrchr(v, ':')
                          : strcmp(a, "--value") == 0 ? strchr(v, '=')
                          : strcmp(a, "--no-key") == 0 ? v + strlen(v)
                                                       : NULL;
        if (!sep || sep == v || (size_t)(sep - v) >= sizeof c->key)
            usage();
        snprintf(c->key, sizeof c->key, "%.*s", (int)(sep - v), v);
        if (strcmp(a, "--key") == 0) {
            c->kind = C_KEY;
            c->types = parse_types(sep + 1);
        } else if (strcmp(a, "--value") == 0) {
            c->kind = C_VALUE;
            c->raw = sep + 1;
        } else {
            c->kind = C_NO_KEY;
        }
    }
    unsigned char *data = read_all(name, &len);
    buf = data;
    size_t records = 0;
    if (strcmp(mode, "csv") == 0) {
        records = check_csv();
    } else if (strcmp(mode, "json") == 0) {
        skip_ws();
        size_t start = at;
        unsigned t = parse_value(0, 1);
        skip_ws();
        if (at < len)
            fail_at(at, "text after the JSON value");
        records = 1;
        if (n_checks && t != T_OBJECT)
            fail_at(start, "key checks need an object");
        check_record(start, 1);
    } else {
        if (len == 0)
            fail_at(0, "empty input: no JSON line");
        one_line = 1;
        while (at < len) {
            size_t start = at;
            skip_ws_line();
            if (at >= len || buf[at] == '\n')
                fail_at(start, "blank line in JSON Lines");
            if (buf[at] != '{')
                fail_at(at, "a JSON Lines record here must be an object");
            parse_value(0, 1);
            skip_ws_line();
            if (at >= len)
                fail_at(at, "the last line must end with a newline");
            if (buf[at] != '\n')
                fail_at(at, "text after the object on its line");
            at++;
            records++;
            check_record(start, records);
        }
    }
    if (count >= 0 && records != (size_t)count)
        fail_at(len, "%zu records, expected %ld", records, count);
    free(data);
    return 0;
}
