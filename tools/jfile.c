/* SPDX-License-Identifier: MIT */
/*
 * jfile.c - a committed JSON Lines file of flat objects read whole (jsonl.c's
 * jrow_parse a line): the measurement files of docs/data/ that the
 * documentation tool renders (tools/docs/data.c) and the calibration run that
 * `kvevict trace --calibrate --from` reads back (calibrate.c).
 *
 * Invariant: a file is all rows or an exit naming PATH:LINE; blank lines are
 * skipped, and a file of no rows is refused.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void jfile_read(jfile *jf, const char *path)
{
    memset(jf, 0, sizeof *jf);
    FILE *f = fopen(path, "rb");
    if (!f)
        die_input("%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, lineno = 0, rcap = 0;
    ssize_t len;
    errno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            len--;
        if (strspn(line, " \t\r") == (size_t)len)
            continue; /* a blank line */
        if (jf->n == rcap)
            jf->rows = xrealloc(jf->rows, (rcap = rcap ? 2 * rcap : 64) * sizeof *jf->rows);
        char err[160];
        if (jrow_parse(line, (size_t)len, &jf->rows[jf->n], err, sizeof err) != 0) {
            free(line);
            fclose(f);
            die_input("%s:%zu: %s", path, lineno, err);
        }
        jf->n++;
    }
    int bad = ferror(f);
    free(line);
    fclose(f);
    if (bad)
        die_input("%s: cannot read: %s", path, strerror(errno));
    if (jf->n == 0)
        die_input("%s: no rows", path);
}

void jfile_free(jfile *jf)
{
    for (size_t i = 0; i < jf->n; i++)
        jrow_free(&jf->rows[i]);
    free(jf->rows);
    memset(jf, 0, sizeof *jf);
}
