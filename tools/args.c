/*
 * args.c - option parsing, strict numbers, lists, error exits and small
 * output helpers for the kvevict tool.
 *
 * Options are "--name VALUE", "--name=VALUE", "-x VALUE" or flags. Numbers
 * are plain decimal digits only: no sign, no blanks, no trailing bytes, no
 * overflow. Every failure exits with one line on stderr.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *cli_cmd = "";

static void vmsg(const char *fmt, va_list ap)
{
    fflush(stdout);
    if (cli_cmd[0])
        fprintf(stderr, "kvevict %s: ", cli_cmd);
    else
        fprintf(stderr, "kvevict: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
    exit(EXIT_USAGE);
}

void die_input(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(fmt, ap);
    va_end(ap);
    exit(EXIT_INPUT);
}

void die_status(kve_status s, const char *what)
{
    if (s == KVE_EINVAL)
        die_usage("%s: %s", what, kve_last_error());
    die_input("%s: %s (%s)", what, kve_last_error(), kve_status_name(s));
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die_input("out of memory");
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        die_input("out of memory");
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        die_input("out of memory");
    return q;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

static const opt_def *find_long(const opt_def *defs, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(defs[i].name) == len && strncmp(defs[i].name, name, len) == 0)
            return &defs[i];
    return NULL;
}

void args_parse(int argc, char **argv, const char *usage, const opt_def *defs, size_t n_defs,
                opt_val *vals, const char **pos, size_t max_pos, size_t *n_pos)
{
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            finish_stdout();
            exit(0);
        }
    }
    for (size_t i = 0; i < n_defs; i++)
        vals[i].count = 0;
    *n_pos = 0;
    int only_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            if (*n_pos >= max_pos)
                die_usage("unexpected argument '%s' (see kvevict %s --help)", a, cli_cmd);
            pos[(*n_pos)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        const opt_def *d = NULL;
        const char *value = NULL;
        if (a[1] == '-') {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            d = find_long(defs, n_defs, name, len);
            if (!d)
                die_usage("unknown option '%.*s' (see kvevict %s --help)", (int)(len + 2), a,
                          cli_cmd);
            if (eq) {
                if (!d->takes_value)
                    die_usage("option '--%s' takes no value", d->name);
                value = eq + 1;
            }
        } else {
            for (size_t k = 0; k < n_defs && !d; k++)
                if (defs[k].short_name && defs[k].short_name == a[1] && a[2] == '\0')
                    d = &defs[k];
            if (!d)
                die_usage("unknown option '%s' (see kvevict %s --help)", a, cli_cmd);
        }
        if (d->takes_value && !value) {
            if (i + 1 >= argc)
                die_usage("option '%s' needs a value", a);
            value = argv[++i];
        }
        opt_val *v = &vals[d - defs];
        if (v->count > 0 && !d->repeatable)
            die_usage("option '--%s' given more than once", d->name);
        if (v->count >= OPT_MAXREP)
            die_usage("option '--%s' given more than %d times", d->name, OPT_MAXREP);
        if (d->takes_value && value[0] == '\0')
            die_usage("option '--%s' needs a non-empty value", d->name);
        v->v[v->count++] = value;
    }
}

uint64_t parse_u64(const char *what, const char *s, uint64_t min, uint64_t max)
{
    if (!s[0])
        die_usage("%s: empty number", what);
    uint64_t x = 0;
    for (const char *c = s; *c; c++) {
        if (*c < '0' || *c > '9')
            die_usage("%s: '%s' is not a plain decimal number", what, s);
        uint64_t d = (uint64_t)(*c - '0');
        if (x > (UINT64_MAX - d) / 10)
            die_usage("%s: '%s' is too large", what, s);
        x = x * 10 + d;
    }
    if (x < min || x > max)
        die_usage("%s: %s is out of range [%llu, %llu]", what, s, (unsigned long long)min,
                  (unsigned long long)max);
    return x;
}

char **split_list(const char *what, const char *s, size_t *n)
{
    size_t count = 1;
    for (const char *c = s; *c; c++)
        count += *c == ',';
    char **items = xcalloc(count, sizeof *items);
    const char *start = s;
    for (size_t i = 0; i < count; i++) {
        const char *end = strchr(start, ',');
        size_t len = end ? (size_t)(end - start) : strlen(start);
        if (len == 0) {
            free_list(items, i);
            die_usage("%s: empty item in list '%s'", what, s);
        }
        items[i] = xmalloc(len + 1);
        memcpy(items[i], start, len);
        items[i][len] = '\0';
        start = end ? end + 1 : start + len;
    }
    *n = count;
    return items;
}

void free_list(char **items, size_t n)
{
    if (!items)
        return;
    for (size_t i = 0; i < n; i++)
        free(items[i]);
    free(items);
}

char *canon_spec(const char *what, const char *spec, size_t budget)
{
    char buf[512], num[32];
    kve_status s;
    if (budget) {
        snprintf(num, sizeof num, "%zu", budget);
        s = kve_spec_with(spec, "budget", num, buf, sizeof buf);
    } else {
        s = kve_spec_with(spec, NULL, NULL, buf, sizeof buf);
    }
    if (s != KVE_OK)
        die_usage("%s: %s", what, kve_last_error());
    return xstrdup(buf);
}

kve_trace *open_trace(const char *src, unsigned flags)
{
    kve_trace *tr = NULL;
    kve_status s = kve_trace_open(src, flags, &tr);
    if (s != KVE_OK)
        die_status(s, "--trace");
    return tr;
}

void json_double(FILE *f, double x)
{
    if (x != x || x > 1.7976931348623157e308 || x < -1.7976931348623157e308)
        fputs("null", f);
    else
        fprintf(f, "%.17g", x);
}

void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

void finish_stdout(void)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        int e = errno;
        fprintf(stderr, "kvevict%s%s: cannot write standard output: %s\n", cli_cmd[0] ? " " : "",
                cli_cmd, strerror(e));
        exit(EXIT_INPUT);
    }
}

FILE *null_sink(void)
{
    FILE *f = fopen("/dev/null", "w");
    if (!f)
        f = tmpfile();
    if (!f)
        die_input("cannot open a scratch stream");
    return f;
}
