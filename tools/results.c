/* SPDX-License-Identifier: MIT */
/*
 * results.c - one result row of an evaluation (kve_eval_result) as every
 * command prints it: its context (the trace's name, seed, heads, k), its
 * JSON keys (KEY_* in cli.h: the same key for the same quantity in every
 * subcommand) and its table columns, in one place.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

void result_ctx_init(result_ctx *c, const cli_args *a, const kve_trace *tr)
{
    memset(c, 0, sizeof *c);
    c->trace = trace_name(tr);
    c->seed = a->seed;
    c->heads = kve_trace_heads(tr);
    c->layers = kve_trace_layers(tr);
    c->topk = a->topk;
    c->topk_given = a->topk_given;
    c->timings = 1;
}

const char *recall_key(const result_ctx *c)
{
    return c->topk_given ? KEY_TOPK_RECALL : KEY_RECALL32;
}

double recall_of(const result_ctx *c, const kve_eval_result *r)
{
    return c->topk == 32 ? r->top32_recall : r->topk_recall;
}

void json_result_begin(FILE *f, const result_ctx *c, const kve_eval_result *r)
{
    fprintf(f, "{\"" KEY_POLICY "\": ");
    json_string(f, r->spec);
    fprintf(f, ", \"" KEY_TRACE "\": ");
    json_string(f, c->trace);
    fprintf(f,
            ", \"" KEY_BUDGET "\": %zu, \"" KEY_STEPS "\": %zu, \"" KEY_SCORED "\": %zu, "
            "\"" KEY_HEADS "\": %zu, \"" KEY_LAYERS "\": %zu, \"" KEY_SEED "\": %llu",
            r->budget, r->steps, r->scored_steps, c->heads, c->layers,
            (unsigned long long)c->seed);
    if (c->topk_given)
        fprintf(f, ", \"" KEY_TOPK "\": %zu", c->topk);
}

void json_metrics(FILE *f, const result_ctx *c, const kve_eval_result *r)
{
    fprintf(f, "\"" KEY_MASS "\": ");
    json_double(f, r->retained_mass);
    fprintf(f, ", \"" KEY_RECALL32 "\": ");
    json_double(f, r->top32_recall);
    if (c->topk_given) {
        fprintf(f, ", \"" KEY_TOPK_RECALL "\": ");
        json_double(f, recall_of(c, r));
    }
    fprintf(f, ", \"" KEY_MIN_MASS "\": ");
    json_double(f, r->min_retained_mass);
    fprintf(f, ", \"" KEY_NS "\": ");
    json_double(f, r->ns_per_step);
    fprintf(f, ", \"" KEY_STATE "\": %zu", r->state_bytes);
}

void json_result(FILE *f, const result_ctx *c, const kve_eval_result *r)
{
    json_result_begin(f, c, r);
    fputs(", ", f);
    json_metrics(f, c, r);
    fputs("}\n", f);
}

/* ---- as a table (table.c) ---- */

size_t result_cols(col *cols, size_t n, const result_ctx *c)
{
    static char recall_head[48];
    snprintf(recall_head, sizeof recall_head, "top-%zu recall", c->topk);
    cols[n++] = (col){"retained mass", KEY_MASS, COL_ALL};
    if (c->topk_given) /* k = 32 always has its key; the table shows the recall at k */
        cols[n++] = (col){"top-32 recall", KEY_RECALL32, COL_CSV | COL_JSON};
    cols[n++] = (col){recall_head, recall_key(c), COL_ALL};
    cols[n++] = (col){"min mass", KEY_MIN_MASS, COL_ALL};
    cols[n++] = (col){"ns/step", KEY_NS, c->timings ? COL_ALL : COL_CSV | COL_JSON};
    cols[n++] = (col){"state bytes", KEY_STATE, COL_ALL};
    /* what the text says once above the table, each CSV row carries */
    cols[n++] = (col){"trace", KEY_TRACE, COL_CSV};
    cols[n++] = (col){"steps", KEY_STEPS, COL_CSV};
    cols[n++] = (col){"scored steps", KEY_SCORED, COL_CSV};
    cols[n++] = (col){"heads", KEY_HEADS, COL_CSV};
    cols[n++] = (col){"layers", KEY_LAYERS, COL_CSV};
    cols[n++] = (col){"seed", KEY_SEED, COL_CSV};
    if (c->topk_given)
        cols[n++] = (col){"topk", KEY_TOPK, COL_CSV};
    return n;
}

void result_cells(table *t, const result_ctx *c, const kve_eval_result *r)
{
    table_real(t, r->retained_mass, "%.4f");
    if (c->topk_given)
        table_real(t, r->top32_recall, "%.4f");
    table_real(t, recall_of(c, r), "%.4f");
    table_real(t, r->min_retained_mass, "%.4f");
    table_real(t, r->ns_per_step, "%.1f");
    table_uint(t, r->state_bytes);
    table_str(t, c->trace ? c->trace : "");
    table_uint(t, r->steps);
    table_uint(t, r->scored_steps);
    table_uint(t, c->heads);
    table_uint(t, c->layers);
    table_uint(t, c->seed);
    if (c->topk_given)
        table_uint(t, c->topk);
}
