/* SPDX-License-Identifier: MIT */
/*
 * gnuplot.c - what the docs tool's figures share: gnuplot found or refused,
 * gnuplot's quoting of a string, the temporary directory its data and
 * scripts go to (removed by the caller once gnuplot has run), a written file
 * closed and checked, and gnuplot run on a script.
 */
#define _POSIX_C_SOURCE 200809L
#include "docs.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void gp_quote(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', f);
        fputc(*s == '\n' ? ' ' : *s, f);
    }
    fputc('\'', f);
}

const char *plot_tmpdir(char *buf, size_t cap)
{
    const char *base = getenv("TMPDIR");
    snprintf(buf, cap, "%s/kvevict-plot-XXXXXX", base && base[0] ? base : "/tmp");
    if (strchr(buf, '\''))
        die_usage("TMPDIR: quotes are not supported");
    const char *dir = mkdtemp(buf);
    if (!dir)
        die_input("cannot create a temporary directory");
    return dir;
}

void gp_require(void)
{
    if (system("command -v gnuplot >/dev/null 2>&1") != 0)
        die_input("gnuplot not found: apt-get install gnuplot-nox (or run make plots)");
}

void gp_close(FILE *f, const char *path)
{
    if (ferror(f) | fclose(f))
        die_input("%s: cannot write", path);
}

int gp_run(const char *script)
{
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "gnuplot '%s'", script);
    return system(cmd);
}
