/* SPDX-License-Identifier: MIT */
/*
 * table.c - tables of typed cells printed four ways: aligned text (two
 * blanks between columns, numbers right-aligned), markdown (a header, an
 * alignment row, one row per line), CSV (RFC 4180 quoting, the snake_case
 * keys as header) and JSON Lines (one object per row, the same keys).
 *
 * Each cell holds two spellings: what a person reads (rounded, n/a for a
 * missing value) and what a program reads (full precision, null). Columns
 * say in which formats they appear. Cells are owned by the table; ncells
 * is a multiple of ncols when printed.
 */
#include "cli.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void table_init(table *t, const col *cols, size_t ncols)
{
    memset(t, 0, sizeof *t);
    if (ncols > TABLE_MAXCOLS)
        die_input("internal error: a table of %zu columns", ncols);
    t->ncols = ncols;
    memcpy(t->cols, cols, ncols * sizeof *cols);
}

static void add(table *t, const char *text, const char *machine, int number)
{
    if (t->ncells == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->cells = xrealloc(t->cells, t->cap * sizeof *t->cells);
    }
    cell *c = &t->cells[t->ncells++];
    c->text = xstrdup(text);
    c->machine = xstrdup(machine);
    c->number = number;
}

void table_str(table *t, const char *s)
{
    add(t, s, s, 0);
}

void table_fmt(table *t, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    add(t, buf, buf, 0);
}

void table_uint(table *t, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    add(t, buf, buf, 1);
}

void table_real(table *t, double x, const char *shown)
{
    char text[64], machine[64];
    if (!isfinite(x)) {
        add(t, "n/a", "null", 1);
        return;
    }
    snprintf(text, sizeof text, shown, x);
    snprintf(machine, sizeof machine, "%.17g", x);
    add(t, text, machine, 1);
}

void table_real_shown(table *t, double x, const char *shown)
{
    char text[64];
    if (!isfinite(x)) {
        add(t, "n/a", "null", 1);
        return;
    }
    snprintf(text, sizeof text, shown, x);
    add(t, text, text, 1);
}

/* The columns s takes on a terminal: its UTF-8 characters (every byte but
 * the continuation bytes 10xxxxxx), so a header such as "Δ" pads right. */
static size_t text_width(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0u) != 0x80u;
    return n;
}

static void print_padded(FILE *f, const char *s, size_t width, int left)
{
    size_t len = text_width(s);
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
    if (!strpbrk(s, ",\"\n\r")) {
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

/* The text of a cell as shown in `fmt` (markdown quotes specs). */
static const char *shown(const table *t, size_t c, const cell *x, tfmt fmt, char *buf,
                         size_t cap)
{
    if (fmt == FMT_MD && (t->cols[c].flags & COL_CODE)) {
        snprintf(buf, cap, "`%s`", x->text);
        return buf;
    }
    return x->text;
}

static void print_machine(const table *t, FILE *f, tfmt fmt, unsigned want)
{
    size_t nc = t->ncols, nr = nc ? t->ncells / nc : 0;
    if (fmt == FMT_CSV) {
        int first = 1;
        for (size_t c = 0; c < nc; c++)
            if (t->cols[c].flags & want) {
                if (!first)
                    fputc(',', f);
                csv_cell(f, t->cols[c].key);
                first = 0;
            }
        fputc('\n', f);
    }
    for (size_t r = 0; r < nr; r++) {
        int first = 1;
        if (fmt == FMT_JSON)
            fputc('{', f);
        for (size_t c = 0; c < nc; c++) {
            if (!(t->cols[c].flags & want))
                continue;
            const cell *x = &t->cells[r * nc + c];
            if (fmt == FMT_CSV) {
                if (!first)
                    fputc(',', f);
                csv_cell(f, x->number && strcmp(x->machine, "null") == 0 ? "n/a" : x->machine);
            } else {
                if (!first)
                    fputs(", ", f);
                json_string(f, t->cols[c].key);
                fputs(": ", f);
                if (x->number)
                    fputs(x->machine, f);
                else
                    json_string(f, x->machine);
            }
            first = 0;
        }
        fputs(fmt == FMT_JSON ? "}\n" : "\n", f);
    }
}

void table_print(const table *t, FILE *f, tfmt fmt)
{
    if (!f)
        return;
    if (fmt == FMT_CSV || fmt == FMT_JSON) {
        print_machine(t, f, fmt, fmt == FMT_CSV ? COL_CSV : COL_JSON);
        return;
    }
    size_t nc = t->ncols, nr = nc ? t->ncells / nc : 0;
    size_t width[TABLE_MAXCOLS], last = 0;
    char buf[1100];
    for (size_t c = 0; c < nc; c++) {
        if (!(t->cols[c].flags & COL_TEXT))
            continue;
        last = c;
        width[c] = text_width(t->cols[c].head);
        for (size_t r = 0; r < nr; r++) {
            size_t w = text_width(shown(t, c, &t->cells[r * nc + c], fmt, buf, sizeof buf));
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
        int first = 1;
        for (size_t c = 0; c < nc; c++) {
            if (!(t->cols[c].flags & COL_TEXT))
                continue;
            int left = (t->cols[c].flags & COL_LEFT) != 0;
            /* text: no trailing blanks after a left-aligned last column */
            int bare = fmt == FMT_TEXT && c == last && left;
            if (!first)
                fputs(sep, f);
            first = 0;
            if (r == 0) {
                if (bare)
                    fputs(t->cols[c].head, f);
                else
                    print_padded(f, t->cols[c].head, width[c], left);
            } else if (r == 1) {
                for (size_t i = 0; i + 1 < width[c]; i++)
                    fputc('-', f);
                fputc(left ? '-' : ':', f);
            } else {
                const char *s = shown(t, c, &t->cells[(r - 2) * nc + c], fmt, buf, sizeof buf);
                if (bare)
                    fputs(s, f);
                else
                    print_padded(f, s, width[c], left);
            }
        }
        if (fmt == FMT_MD)
            fputs(" |", f);
        fputc('\n', f);
    }
}

void table_free(table *t)
{
    for (size_t i = 0; i < t->ncells; i++) {
        free(t->cells[i].text);
        free(t->cells[i].machine);
    }
    free(t->cells);
    t->cells = NULL;
    t->ncells = t->cap = 0;
}
