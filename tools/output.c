/* SPDX-License-Identifier: MIT */
/*
 * output.c - where results go and how: output files written under a
 * temporary name and renamed into place, the signal handler that removes
 * them, progress lines, JSON strings and numbers, and the rewriting of a
 * marked block of a file. Where traces come from is traces.c; what a result
 * row holds, results.c.
 *
 * Invariant: a file the tool writes exists under its final name only once
 * it is complete (a device or FIFO, which a rename would replace, is
 * written in place). Until then it is a temporary file registered with
 * temp_create (errors.c), which die_* and the signal handler remove, so an
 * error or an interrupt leaves nothing.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- output streams ---- */

typedef struct out_file {
    FILE *f;
    char *path; /* final name */
    char tmp[PATH_MAX];
} out_file;

static out_file outs[MAX_TEMPS];

FILE *out_open(const char *path)
{
    if (!path || strcmp(path, "-") == 0)
        return stdout;
    size_t slot = 0;
    while (slot < MAX_TEMPS && outs[slot].f)
        slot++;
    if (slot == MAX_TEMPS)
        die_input("%s: too many output files", path);
    out_file *o = &outs[slot];
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        /* A device or FIFO (/dev/null, a named pipe) is written in place:
         * renaming a finished file over it would replace it. */
        o->f = fopen(path, "wb");
        if (!o->f)
            die_input("%s: %s", path, strerror(errno));
        o->tmp[0] = '\0';
        o->path = xstrdup(path);
        return o->f;
    }
    if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp.XXXXXX", path) >= (int)sizeof o->tmp)
        die_input("%s: path is too long", path);
    int fd = temp_create(o->tmp);
    if (fd < 0)
        die_input("%s: cannot create a file beside it: %s", path, strerror(errno));
    (void)fchmod(fd, 0644);
    o->f = fdopen(fd, "wb");
    if (!o->f) {
        int e = errno;
        close(fd);
        die_input("%s: %s", path, strerror(e));
    }
    o->path = xstrdup(path);
    return o->f;
}

void out_close(FILE *f)
{
    if (f == stdout) {
        finish_stdout();
        return;
    }
    for (size_t i = 0; i < MAX_TEMPS; i++) {
        out_file *o = &outs[i];
        if (o->f != f)
            continue;
        int bad = fflush(f) != 0 || ferror(f);
        int e = errno;
        if (fclose(f) != 0 && !bad) {
            bad = 1;
            e = errno;
        }
        o->f = NULL;
        if (bad)
            die_input("%s: cannot write: %s", o->path, strerror(e));
        if (o->tmp[0] == '\0') { /* written in place */
            free(o->path);
            o->path = NULL;
            return;
        }
        if (rename(o->tmp, o->path) != 0)
            die_input("%s: cannot rename the finished file into place: %s", o->path,
                      strerror(errno));
        temp_forget(o->tmp);
        free(o->path);
        o->path = NULL;
        return;
    }
    die_input("internal error: closing a stream that out_open did not give");
}

FILE *null_sink(void)
{
    FILE *f = fopen("/dev/null", "w");
    if (!f)
        f = tmpfile();
    if (!f)
        die_input("cannot open a scratch stream: %s", strerror(errno));
    return f;
}

/* ---- progress ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double started; /* the first progress_begin: one clock for the whole command */

void progress_begin(progress *pr, const char *what, uint64_t total, size_t head, size_t heads)
{
    if (started == 0.0)
        started = now_s();
    pr->what = what;
    pr->total = total;
    pr->head = head;
    pr->heads = heads;
    pr->last = 0.0;
    pr->next = 0;
    pr->shown = 0;
}

int cli_quiet;

void progress_update(progress *pr, uint64_t done)
{
    /* The clock is read after every 256 units of work (and at the end),
     * whatever the size of each update. */
    if (cli_quiet || (done < pr->next && done != pr->total))
        return;
    pr->next = done + 256;
    double now = now_s();
    if (now - started < 2.0 || now - pr->last < 0.25 || !isatty(STDERR_FILENO))
        return;
    pr->last = now;
    double pct = pr->total ? 100.0 * (double)done / (double)pr->total : 100.0;
    if (pr->heads > 1)
        fprintf(stderr, "\rkvevict %s: head %zu/%zu, %s %llu/%llu (%.0f%%) ", cli_cmd,
                pr->head + 1, pr->heads, pr->what, (unsigned long long)done,
                (unsigned long long)pr->total, pct);
    else
        fprintf(stderr, "\rkvevict %s: %s %llu/%llu (%.0f%%) ", cli_cmd, pr->what,
                (unsigned long long)done, (unsigned long long)pr->total, pct);
    pr->shown = 1;
    cli_progress_shown = 1;
}

void progress_end(progress *pr)
{
    if (pr->shown)
        fputs("\r\033[K", stderr);
    pr->shown = 0;
    cli_progress_shown = 0;
}

int progress_callback(void *user, uint64_t done, uint64_t total)
{
    progress *pr = user;
    pr->total = total;
    progress_update(pr, done);
    return 0;
}

/* ---- JSON ---- */

void json_double(FILE *f, double x)
{
    if (!isfinite(x))
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
        else if (*c < 0x20 || *c == 0x7f)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

void rewrite_block(const char *path, const char *name, const char *block)
{
    char begin[64], end[64];
    snprintf(begin, sizeof begin, "<!-- %s:begin -->\n", name);
    snprintf(end, sizeof end, "<!-- %s:end -->", name);
    FILE *in = fopen(path, "rb");
    if (!in)
        die_input("--docs: %s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem)
        die_input("out of memory");
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, got, mem);
    int bad = ferror(in);
    fclose(in);
    fclose(mem);
    if (bad)
        die_input("--docs: %s: cannot read", path);
    char *b = strstr(text, begin);
    char *e = b ? strstr(b, end) : NULL;
    if (!b || !e)
        die_input("--docs: %s has no '<!-- %s:begin -->' ... '<!-- %s:end -->' block", path, name,
                  name);
    FILE *out = out_open(path);
    fwrite(text, 1, (size_t)(b - text) + strlen(begin), out);
    fputs(block, out);
    fputs(e, out);
    out_close(out);
    free(text);
}
