/* SPDX-License-Identifier: MIT */
/*
 * grid.c - the sweep grid, the one implementation behind `kvevict sweep`
 * and the docs' `sweep` blocks: a base spec, keys each with a list of
 * values, and budgets. Point i sets every key with kve_spec_with (so each
 * point is validated exactly as kve_policy_new would), budgets outermost,
 * the last key varying fastest.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void grid_init(grid *g, const char *base)
{
    memset(g, 0, sizeof *g);
    g->base = base;
}

void grid_add_param(grid *g, const char *what, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || eq[1] == '\0')
        die_usage("%s: '%s' is not KEY=V1,V2,...", what, arg);
    if (g->n_keys == OPT_MAXREP)
        die_usage("%s: more than %d keys", what, OPT_MAXREP);
    size_t len = (size_t)(eq - arg);
    char *key = xmalloc(len + 1);
    memcpy(key, arg, len);
    key[len] = '\0';
    for (size_t k = 0; k < g->n_keys; k++)
        if (strcmp(g->key[k], key) == 0) {
            free(key);
            die_usage("%s: key '%.*s' given more than once", what, (int)len, arg);
        }
    if (strcmp(key, "budget") == 0 && g->n_budgets) {
        free(key);
        die_usage("%s: budget=... and --budget contradict each other", what);
    }
    g->key[g->n_keys] = key;
    g->vals[g->n_keys] = split_list(what, eq + 1, &g->n_vals[g->n_keys]);
    g->n_keys++;
}

void grid_set_budgets(grid *g, const size_t *budgets, size_t n)
{
    for (size_t k = 0; k < g->n_keys; k++)
        if (strcmp(g->key[k], "budget") == 0)
            die_usage("--param budget=... and --budget contradict each other");
    memcpy(g->budgets, budgets, n * sizeof *budgets);
    g->n_budgets = n;
}

size_t grid_points(const grid *g)
{
    size_t n = g->n_budgets ? g->n_budgets : 1;
    for (size_t k = 0; k < g->n_keys; k++) {
        if (g->n_vals[k] > GRID_MAX_POINTS || n > GRID_MAX_POINTS)
            return GRID_MAX_POINTS + 1; /* no overflow: anything this big is refused */
        n *= g->n_vals[k];
    }
    return n;
}

size_t grid_val(const grid *g, size_t i, size_t k)
{
    size_t stride = 1;
    for (size_t j = g->n_keys; j-- > k + 1;)
        stride *= g->n_vals[j];
    return (i / stride) % g->n_vals[k];
}

char *grid_spec(const grid *g, size_t i)
{
    size_t per_budget = grid_points(g) / (g->n_budgets ? g->n_budgets : 1);
    size_t budget = g->n_budgets ? g->budgets[i / per_budget] : 0;
    char buf[2][KVE_SPEC_MAX];
    const char *cur = g->base;
    for (size_t k = 0; k < g->n_keys; k++) {
        const char *val = g->vals[k][grid_val(g, i, k)];
        kve_status s = kve_spec_with(cur, g->key[k], val, buf[k & 1], sizeof buf[k & 1]);
        if (s != KVE_OK)
            die_usage("--param %s=%s: %s", g->key[k], val, kve_last_error());
        cur = buf[k & 1];
    }
    return canon_spec(budget ? "--budget" : "--policy", cur, budget);
}

void grid_check(const grid *g)
{
    /* The base spec alone first: what no budget mends (a malformed spec, an
     * unknown key) is --policy's fault, whatever --budget says; what a
     * budget or a value causes is named at its point, below. */
    char buf[KVE_SPEC_MAX], num[32];
    snprintf(num, sizeof num, "%d", KVE_MAX_BUDGET);
    if (kve_spec_with(g->base, NULL, NULL, buf, sizeof buf) != KVE_OK &&
        kve_spec_with(g->base, "budget", num, buf, sizeof buf) != KVE_OK)
        die_usage("--policy: %s", kve_last_error());
    size_t n = grid_points(g);
    if (n > GRID_MAX_POINTS)
        die_usage("the grid has more than %d points", GRID_MAX_POINTS);
    for (size_t i = 0; i < n; i++)
        free(grid_spec(g, i));
}

void grid_free(grid *g)
{
    for (size_t k = 0; k < g->n_keys; k++) {
        free(g->key[k]);
        free_list(g->vals[k], g->n_vals[k]);
    }
    g->n_keys = 0;
}

void json_params(FILE *f, const grid *g, size_t i)
{
    fputs("\"params\": {", f);
    for (size_t k = 0; k < g->n_keys; k++) {
        fputs(k ? ", " : "", f);
        json_string(f, g->key[k]);
        fputs(": ", f);
        json_string(f, g->vals[k][grid_val(g, i, k)]);
    }
    fputc('}', f);
}

void render_grid(FILE *f, evalset *es, const grid *g, const result_ctx *c, tfmt fmt)
{
    size_t n = grid_points(g);
    if (fmt == FMT_JSON) {
        for (size_t i = 0; i < n; i++) {
            char *spec = grid_spec(g, i);
            const kve_eval_result *r = evalset_get(es, spec, 0);
            if (f) {
                json_result_begin(f, c, r);
                fputs(", ", f);
                json_params(f, g, i);
                fputs(", ", f);
                json_metrics(f, c, r);
                fputs("}\n", f);
            }
            free(spec);
        }
        return;
    }
    col cols[TABLE_MAXCOLS];
    size_t nc = 0;
    for (size_t k = 0; k < g->n_keys; k++)
        cols[nc++] = (col){g->key[k], g->key[k], COL_TEXT | COL_CSV};
    cols[nc++] = (col){"budget", KEY_BUDGET, COL_TEXT | COL_CSV};
    nc = result_cols(cols, nc, c);
    cols[nc++] = (col){"policy spec", KEY_POLICY, COL_TEXT | COL_CSV | COL_LEFT | COL_CODE};
    table t;
    table_init(&t, cols, nc);
    for (size_t i = 0; i < n; i++) {
        char *spec = grid_spec(g, i);
        const kve_eval_result *r = evalset_get(es, spec, 0);
        for (size_t k = 0; k < g->n_keys; k++)
            table_str(&t, g->vals[k][grid_val(g, i, k)]);
        table_uint(&t, r->budget);
        result_cells(&t, c, r);
        table_str(&t, r->spec);
        free(spec);
    }
    table_print(&t, f, fmt);
    table_free(&t);
}
