/* SPDX-License-Identifier: MIT */
/*
 * data.c - committed measurement files (JSON Lines under docs/data/, read
 * whole by jfile.c) rendered: row filters (the where= of the docs block `table`, the
 * --where of `plot --jsonl`, the figures of plot_real.c: one syntax), and
 * the docs block `table`, which renders a file's rows as a markdown table so
 * that a page shows exactly what its data file holds (the drift tests
 * compare them; docs/real-model.md, docs/budgets.md).
 *
 * A row's value of a key is its text (a string unescaped, a number's
 * literal, true/false/null); a missing key reads as null. One derived key,
 * `spec`, is the row's `policy` without its `budget=N` parameter
 * ("h2o:budget=102,recent_window=32" -> "h2o:recent_window=32"), so that rows
 * of one policy at several budgets can share a table row.
 */
#define _POSIX_C_SOURCE 200809L
#include "docs.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- values and filters ---- */

static const char *strip_budget(const char *policy, char *buf, size_t cap)
{
    const char *colon = strchr(policy, ':');
    if (!colon) {
        snprintf(buf, cap, "%s", policy);
        return buf;
    }
    size_t n = (size_t)snprintf(buf, cap, "%.*s", (int)(colon - policy), policy);
    char sep = ':';
    const char *p = colon + 1;
    while (*p && n < cap) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (strncmp(p, "budget=", 7) != 0) {
            n += (size_t)snprintf(buf + n, cap - n, "%c%.*s", sep, (int)len, p);
            sep = ',';
        }
        p += len + (comma ? 1 : 0);
    }
    return buf;
}

const char *jrow_value(const jrow *r, const char *key, char *buf, size_t cap)
{
    if (strcmp(key, "spec") == 0) {
        const jfield *p = jrow_get(r, "policy");
        return p && p->type == JV_STRING ? strip_budget(p->text, buf, cap) : "null";
    }
    const jfield *f = jrow_get(r, key);
    return f ? f->text : "null";
}

void filter_parse(row_filter *flt, const char *what, const char *arg)
{
    const char *op = strpbrk(arg, ":!");
    if (!op || op == arg || !op[1] || (op[0] == '!' && op[1] == '='))
        die_usage("%s: '%s' is not KEY:V1|V2... or KEY!V1|V2...", what, arg);
    flt->key = xstrndup(arg, (size_t)(op - arg));
    flt->negate = *op == '!';
    flt->vals = xstrdup(op + 1);
}

void filter_free(row_filter *flt)
{
    free(flt->key);
    free(flt->vals);
}

int filters_match(const row_filter *flt, size_t n, const jrow *r)
{
    for (size_t i = 0; i < n; i++) {
        char buf[256];
        const char *v = jrow_value(r, flt[i].key, buf, sizeof buf);
        size_t vl = strlen(v);
        int hit = 0;
        for (const char *p = flt[i].vals; !hit;) {
            const char *bar = strchr(p, '|');
            size_t len = bar ? (size_t)(bar - p) : strlen(p);
            hit = len == vl && strncmp(p, v, len) == 0;
            if (!bar)
                break;
            p = bar + 1;
        }
        if (hit == flt[i].negate)
            return 0;
    }
    return 1;
}

/* ---- the docs block `table` ---- */

typedef struct tcol {
    char *key;
    char fmt[8]; /* "" raw, "%.Nf", "%+.Nf", or "code" */
    char *head;  /* the header given (`_` read as a blank), or NULL */
} tcol;

/* KEY[:F[:Header]]: F is empty, N, +N (N one digit: decimals) or code; the
 * header is the rest, `_` standing for a blank (block arguments are split at
 * blanks). */
static void tcol_parse(tcol *c, const char *s)
{
    const char *colon = strchr(s, ':');
    c->key = xstrndup(s, colon ? (size_t)(colon - s) : strlen(s));
    c->fmt[0] = '\0';
    c->head = NULL;
    if (!c->key[0])
        die_usage("block 'table': a column without a key in '%s'", s);
    if (!colon)
        return;
    const char *head = strchr(colon + 1, ':');
    char *f = xstrndup(colon + 1, head ? (size_t)(head - colon - 1) : strlen(colon + 1));
    if (strcmp(f, "code") == 0)
        snprintf(c->fmt, sizeof c->fmt, "code");
    else if (f[0] >= '0' && f[0] <= '9' && !f[1])
        snprintf(c->fmt, sizeof c->fmt, "%%.%cf", f[0]);
    else if (f[0] == '+' && f[1] >= '0' && f[1] <= '9' && !f[2])
        snprintf(c->fmt, sizeof c->fmt, "%%+.%cf", f[1]);
    else if (f[0]) /* empty: the value as written */
        die_usage("block 'table': format '%s' of %s is not N, +N or code (N: 0 to 9 decimals)",
                  f, c->key);
    free(f);
    if (head) {
        if (!head[1])
            die_usage("block 'table': an empty header in '%s'", s);
        c->head = xstrdup(head + 1);
        for (char *p = c->head; *p; p++)
            if (*p == '_')
                *p = ' ';
    }
}

static void tcol_free(tcol *c)
{
    free(c->key);
    free(c->head);
}

/* The cell of value v (text of a field of type t) under column c; a number
 * format on a value that is no number is bad input (a mistaken key). */
static void put_cell(table *t, const tcol *c, const char *v, int is_number)
{
    if (strcmp(v, "null") == 0) {
        table_str(t, "n/a");
        return;
    }
    if (c->fmt[0] == '%') {
        if (!is_number)
            die_input("block 'table': %s is '%s', not a number for its format", c->key, v);
        table_fmt(t, c->fmt, strtod(v, NULL));
        return;
    }
    if (is_number && strpbrk(v, ".eE")) {
        table_fmt(t, "%.4f", strtod(v, NULL));
        return;
    }
    table_str(t, v);
}

static int is_num(const jrow *r, const char *key)
{
    const jfield *f = jrow_get(r, key);
    return f && f->type == JV_NUMBER;
}

/* Column c's header: the one given, else its key with blanks for `_` (the
 * key spec reads "policy"). */
static void header_of(const tcol *c, char *buf, size_t cap)
{
    if (c->head) {
        snprintf(buf, cap, "%s", c->head);
        return;
    }
    snprintf(buf, cap, "%s", strcmp(c->key, "spec") == 0 ? "policy" : c->key);
    for (char *p = buf; *p; p++)
        if (*p == '_')
            *p = ' ';
}

void render_data_table(FILE *f, char *const *args, size_t n_args)
{
    if (n_args < 1)
        die_usage("block 'table' needs a data file");
    const char *path = args[0];
    row_filter flt[8];
    size_t n_flt = 0;
    tcol cols[TABLE_MAXCOLS] = {{0}};
    size_t n_cols = 0;
    tcol rows_[TABLE_MAXCOLS] = {{0}}, value = {0}, pivot_col = {0};
    size_t n_rows = 0;
    const char *pivot = NULL;
    for (size_t i = 1; i < n_args; i++) {
        const char *a = args[i];
        if (strncmp(a, "where=", 6) == 0) {
            if (n_flt == 8)
                die_usage("block 'table': at most 8 where= arguments");
            filter_parse(&flt[n_flt++], "block 'table': where", a + 6);
        } else if (strncmp(a, "show=", 5) == 0 || strncmp(a, "rows=", 5) == 0) {
            size_t n;
            char **items = split_list(a[0] == 's' ? "show" : "rows", a + 5, &n);
            tcol *dst = a[0] == 's' ? cols : rows_;
            size_t *cnt = a[0] == 's' ? &n_cols : &n_rows;
            for (size_t k = 0; k < n; k++) {
                if (*cnt == TABLE_MAXCOLS)
                    die_usage("block 'table': more than %d columns", TABLE_MAXCOLS);
                tcol_parse(&dst[(*cnt)++], items[k]);
            }
            free_list(items, n);
        } else if (strncmp(a, "cols=", 5) == 0 && !pivot) {
            tcol_parse(&pivot_col, a + 5);
            if (pivot_col.fmt[0])
                die_usage("block 'table': cols=%s takes a header (KEY::Header), not a format",
                          pivot_col.key);
            pivot = pivot_col.key;
        } else if (strncmp(a, "value=", 6) == 0 && !value.key) {
            tcol_parse(&value, a + 6);
            if (value.head)
                die_usage("block 'table': value=%s takes no header (the columns are headed by "
                          "cols=KEY::Header)",
                          value.key);
        } else {
            die_usage("block 'table': unknown or repeated argument '%s' (where=, show=, rows=, "
                      "cols=, value=)",
                      a);
        }
    }
    int pivoting = pivot || value.key || n_rows;
    if (pivoting && (!pivot || !value.key || !n_rows || n_cols))
        die_usage("block 'table': a pivot takes rows=, cols= and value= (and no show=)");
    if (!pivoting && !n_cols)
        die_usage("block 'table': give show=KEY,... or rows=, cols= and value=");
    jfile jf;
    jfile_read(&jf, path);
    char buf[256], buf2[256];

    /* The pivot's columns: the distinct values of `pivot`, in file order. */
    char **pv = NULL;
    size_t n_pv = 0;
    if (pivoting) {
        for (size_t r = 0; r < jf.n; r++) {
            if (!filters_match(flt, n_flt, &jf.rows[r]))
                continue;
            const char *v = jrow_value(&jf.rows[r], pivot, buf, sizeof buf);
            size_t k = 0;
            while (k < n_pv && strcmp(pv[k], v) != 0)
                k++;
            if (k == n_pv) {
                if (n_rows + n_pv >= TABLE_MAXCOLS)
                    die_usage("block 'table': %s has too many values for columns", pivot);
                pv = xrealloc(pv, (n_pv + 1) * sizeof *pv);
                pv[n_pv++] = xstrdup(v);
            }
        }
    }
    const tcol *shown = pivoting ? rows_ : cols;
    size_t n_shown = pivoting ? n_rows : n_cols;
    col tc[TABLE_MAXCOLS];
    char heads[TABLE_MAXCOLS][160];
    size_t matching = 0;
    for (size_t r = 0; r < jf.n; r++)
        matching += filters_match(flt, n_flt, &jf.rows[r]);
    if (matching == 0)
        die_input("%s: no row matches the block's where= filters", path);
    size_t nc = 0;
    for (size_t k = 0; k < n_shown; k++, nc++) {
        header_of(&shown[k], heads[nc], sizeof heads[nc]);
        unsigned fl = COL_TEXT;
        if (strcmp(shown[k].fmt, "code") == 0)
            fl |= COL_CODE;
        /* numbers (and n/a) right-aligned, text left */
        int numeric = 0;
        for (size_t r = 0; r < jf.n && !numeric; r++)
            numeric = filters_match(flt, n_flt, &jf.rows[r]) && is_num(&jf.rows[r], shown[k].key);
        if (!numeric)
            fl |= COL_LEFT;
        tc[nc] = (col){heads[nc], shown[k].key, fl};
    }
    for (size_t k = 0; k < n_pv; k++, nc++) {
        char h[64];
        header_of(&pivot_col, h, sizeof h);
        snprintf(heads[nc], sizeof heads[nc], "%s %.80s", h, pv[k]);
        tc[nc] = (col){heads[nc], pv[k], COL_TEXT};
    }
    table t;
    table_init(&t, tc, nc);
    /* Plain: every matching row. Pivot: one row per distinct rows= tuple, in
     * file order, its cells from the rows that share it. */
    char *done = xcalloc(jf.n, 1);
    for (size_t r = 0; r < jf.n; r++) {
        const jrow *row = &jf.rows[r];
        if (done[r] || !filters_match(flt, n_flt, row))
            continue;
        for (size_t k = 0; k < n_shown; k++)
            put_cell(&t, &shown[k], jrow_value(row, shown[k].key, buf, sizeof buf),
                     is_num(row, shown[k].key));
        for (size_t k = 0; k < n_pv; k++) {
            const jrow *hit = NULL;
            for (size_t s = r; s < jf.n && !hit; s++) {
                const jrow *o = &jf.rows[s];
                if (done[s] || !filters_match(flt, n_flt, o))
                    continue;
                int same = strcmp(jrow_value(o, pivot, buf, sizeof buf), pv[k]) == 0;
                for (size_t q = 0; q < n_shown && same; q++)
                    same = strcmp(jrow_value(o, shown[q].key, buf, sizeof buf),
                                  jrow_value(row, shown[q].key, buf2, sizeof buf2)) == 0;
                if (same) {
                    hit = o;
                    done[s] = 1;
                }
            }
            if (hit)
                put_cell(&t, &value, jrow_value(hit, value.key, buf, sizeof buf),
                         is_num(hit, value.key));
            else
                table_str(&t, "");
        }
        done[r] = 1;
    }
    table_print(&t, f, FMT_MD);
    table_free(&t);
    free(done);
    for (size_t k = 0; k < n_pv; k++)
        free(pv[k]);
    free(pv);
    for (size_t k = 0; k < n_cols; k++)
        tcol_free(&cols[k]);
    for (size_t k = 0; k < n_rows; k++)
        tcol_free(&rows_[k]);
    tcol_free(&value);
    tcol_free(&pivot_col);
    for (size_t k = 0; k < n_flt; k++)
        filter_free(&flt[k]);
    jfile_free(&jf);
}
