/* SPDX-License-Identifier: MIT */
/*
 * gnuplot.c - what the docs tool's figures share: gnuplot's quoting of a
 * string, and the temporary directory its data and scripts go to (removed
 * by the caller once gnuplot has run).
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
