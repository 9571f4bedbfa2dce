/* SPDX-License-Identifier: MIT */
/*
 * traces.c - where a command's --trace comes from: the library's sources
 * (kve_trace_open, with progress while a large file is validated),
 * standard input ("-": spooled to a temporary file, removed once open), and
 * the tool's own sources (tool_sources below: lm:, a model's attention),
 * and the name the user gave each trace, for the output's "trace" key.
 *
 * Invariant: a temporary file a trace was read from is registered with
 * temp_create until the trace is open, then unlinked (the open trace keeps
 * reading it); it and each live lm: trace map back to the name the user
 * gave.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char stdin_source[PATH_MAX]; /* the temporary path a "-" trace was opened from */

/* Copies standard input to a registered temporary file; returns its path. */
static const char *spool_stdin(void)
{
    if (isatty(STDIN_FILENO))
        die_usage("--trace -: standard input is a terminal, not a .npy file");
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    if (snprintf(stdin_source, sizeof stdin_source, "%s/kvevict-stdin.XXXXXX", dir) >=
        (int)sizeof stdin_source)
        die_input("--trace -: TMPDIR is too long");
    int fd = temp_create(stdin_source);
    if (fd < 0)
        die_input("--trace -: cannot create a temporary file in %s: %s", dir, strerror(errno));
    char buf[1 << 16];
    for (;;) {
        ssize_t got = read(STDIN_FILENO, buf, sizeof buf);
        if (got == 0)
            break;
        if (got < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            die_input("--trace -: cannot read standard input: %s", strerror(e));
        }
        for (ssize_t off = 0; off < got;) {
            ssize_t w = write(fd, buf + off, (size_t)(got - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                int e = errno;
                close(fd);
                die_input("--trace -: cannot write %s: %s", stdin_source, strerror(e));
            }
            off += w;
        }
    }
    if (close(fd) != 0)
        die_input("--trace -: cannot write %s: %s", stdin_source, strerror(errno));
    return stdin_source;
}

/* The names the user gave the tool's own live traces (lm_trace_open), by
 * the trace: only a trace whose source is "callback" is looked up, and a
 * trace made at the address of a freed one takes its entry over. */
enum { MAX_ALIASES = 16 };
static struct {
    const kve_trace *tr;
    char *name;
} aliases[MAX_ALIASES];

void trace_alias(const kve_trace *tr, const char *name)
{
    for (size_t i = 0; i < MAX_ALIASES; i++)
        if (!aliases[i].tr || aliases[i].tr == tr) {
            free(aliases[i].name);
            aliases[i].tr = tr;
            aliases[i].name = xstrdup(name);
            return;
        }
    die_input("too many lm: traces in one run (at most %d)", MAX_ALIASES);
}

/* The tool's own sources, tried before the library's: a prefix, and what
 * opens a source that begins with it. A new one is a file and a line here. */
static const struct {
    const char *prefix;
    kve_trace *(*open)(const char *src, unsigned flags);
} tool_sources[] = {
    {"lm:", lm_trace_open}, /* a model's attention (lm/lm_trace.c) */
};

kve_trace *open_trace(const cli_args *a)
{
    const char *src = a->trace ? a->trace : BENCH_TRACE;
    for (size_t i = 0; i < sizeof tool_sources / sizeof tool_sources[0]; i++)
        if (strncmp(src, tool_sources[i].prefix, strlen(tool_sources[i].prefix)) == 0)
            return tool_sources[i].open(src, a->trace_flags);
    int from_stdin = strcmp(src, "-") == 0;
    if (from_stdin)
        src = spool_stdin();
    kve_trace *tr = NULL;
    progress pr;
    progress_begin(&pr, "validating row", 0, 0, 1);
    kve_trace_options o = kve_trace_default_options();
    o.flags = (kve_trace_flags)a->trace_flags;
    o.progress = progress_callback;
    o.user = &pr;
    kve_status s = kve_trace_open(src, &o, &tr);
    progress_end(&pr);
    if (from_stdin) { /* the open file stays readable; the name can go now */
        unlink(stdin_source);
        temp_forget(stdin_source);
    }
    if (s != KVE_OK)
        die_status(s, from_stdin ? "--trace -" : "--trace");
    return tr;
}

kve_trace *open_trace_resolved(cli_args *a, char **spec)
{
    kve_trace *tr = open_trace(a);
    if (a->budgets_relative) { /* --budget P%: of the trace's steps */
        cli_resolve_budgets(a, kve_trace_steps(tr), "the trace's steps");
        free(*spec);
        *spec = canon_spec("--policy", a->policy, a->budget);
    }
    return tr;
}

const char *trace_name(const kve_trace *tr)
{
    const char *s = kve_trace_source(tr);
    for (size_t i = 0; i < MAX_ALIASES && aliases[i].tr && strcmp(s, "callback") == 0; i++)
        if (aliases[i].tr == tr)
            return aliases[i].name;
    return stdin_source[0] && strcmp(s, stdin_source) == 0 ? "-" : s;
}
