/*
 * table.c - tables of preformatted cells printed three ways: aligned text
 * (two blanks between columns, numbers right-aligned), markdown (a header,
 * an alignment row, one row per line) and CSV (RFC 4180 quoting).
 * Cells are owned by the table; ncells is a multiple of ncols when printed.
 */
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void table_init(table *t, size_t ncols, const char *const *head, const char *const *csv_head,
                unsigned left)
{
    memset(t, 0, sizeof *t);
    t->ncols = ncols;
    for (size_t c = 0; c < ncols && c < TABLE_MAXCOLS; c++) {
        t->head[c] = head[c];
        t->csv_head[c] = csv_head ? csv_head[c] : head[c];
    }
    t->left = left;
}

void table_add(table *t, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (t->ncells == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->cells = xrealloc(t->cells, t->cap * sizeof *t->cells);
    }
    t->cells[t->ncells++] = xstrdup(buf);
}

static void print_padded(FILE *f, const char *s, size_t width, int left)
{
    size_t len = strlen(s);
    if (!left)
        for (size_t i = len; i < width; i++)
            fputc(' ', f);
    fputs(s, f);
    if (left)
        for (size_t i = len; i < width; i++)
            fputc(' ', f);
}

static void csv_cell(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

void table_print(const table *t, FILE *f, tfmt fmt)
{
    if (!f)
        return;
    size_t nc = t->ncols, nr = nc ? t->ncells / nc : 0;
    if (fmt == FMT_CSV) {
        for (size_t c = 0; c < nc; c++) {
            if (c)
                fputc(',', f);
            csv_cell(f, t->csv_head[c]);
        }
        fputc('\n', f);
        for (size_t r = 0; r < nr; r++) {
            for (size_t c = 0; c < nc; c++) {
                if (c)
                    fputc(',', f);
                csv_cell(f, t->cells[r * nc + c]);
            }
            fputc('\n', f);
        }
        return;
    }
    size_t width[TABLE_MAXCOLS];
    for (size_t c = 0; c < nc; c++) {
        width[c] = strlen(t->head[c]);
        for (size_t r = 0; r < nr; r++) {
            size_t w = strlen(t->cells[r * nc + c]);
            if (w > width[c])
                width[c] = w;
        }
        if (fmt == FMT_MD && width[c] < 3)
            width[c] = 3;
    }
    const char *sep = fmt == FMT_MD ? " | " : "  ";
    for (size_t r = 0; r < nr + 2; r++) {
        if (fmt == FMT_TEXT && r == 1)
            continue;
        if (fmt == FMT_MD)
            fputs("| ", f);
        for (size_t c = 0; c < nc; c++) {
            int left = (t->left >> c) & 1u;
            if (c)
                fputs(sep, f);
            if (r == 0 && fmt == FMT_TEXT && c + 1 == nc && left) {
                fputs(t->head[c], f);
            } else if (r == 0) {
                print_padded(f, t->head[c], width[c], left);
            } else if (r == 1) {
                for (size_t i = 0; i + 1 < width[c]; i++)
                    fputc('-', f);
                fputc(left ? '-' : ':', f);
            } else if (fmt == FMT_TEXT && c + 1 == nc && left) {
                fputs(t->cells[(r - 2) * nc + c], f); /* no trailing blanks */
            } else {
                print_padded(f, t->cells[(r - 2) * nc + c], width[c], left);
            }
        }
        if (fmt == FMT_MD)
            fputs(" |", f);
        fputc('\n', f);
    }
}

void table_free(table *t)
{
    for (size_t i = 0; i < t->ncells; i++)
        free(t->cells[i]);
    free(t->cells);
    t->cells = NULL;
    t->ncells = t->cap = 0;
}
