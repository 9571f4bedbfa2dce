/* SPDX-License-Identifier: MIT */
/*
 * perf_docs.c - the measured section of docs/performance.md and its figure
 * from one `kvevict perf` run (make perf-docs): the conditions of the run,
 * every policy's ns per step and ratio to the floor (checked and unchecked),
 * the floor's own variants, the attention readers in both placements (pool
 * and hot), the value norms, score rules and expected attention against
 * their counterparts, where h2o's step goes, what an evict moves, the
 * targets met or missed, the banks; and perf_vs_budget.png (gnuplot).
 * Timings depend on the machine: this text is committed with the
 * conditions it states, never drift-checked.
 */
#define _POSIX_C_SOURCE 200809L
#include "docs.h"
#include "perf.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const place_names[N_PLACES] = {"pool", "hot"};

/* "256", "4Ki", "256Ki". */
static const char *size_label(size_t b, char buf[24])
{
    if (b >= 1024 && b % 1024 == 0)
        snprintf(buf, 24, "%zuKi", b / 1024);
    else
        snprintf(buf, 24, "%zu", b);
    return buf;
}

/* What a lookup asks for: a row's identity. */
typedef struct key {
    const char *impl, *name, *attn;
    int unchecked;
    place where;
    size_t heads, threads;
} key;

static const row *find(const perf_rows *rs, key k, size_t budget)
{
    for (size_t i = 0; i < rs->n; i++) {
        const row *r = &rs->r[i];
        if (strcmp(r->impl, k.impl) == 0 && strcmp(r->name, k.name) == 0 &&
            strcmp(r->attn, k.attn) == 0 && r->unchecked == k.unchecked && r->where == k.where &&
            r->budget == budget && r->heads == k.heads && r->threads == k.threads)
            return r;
    }
    return NULL;
}

/* A policy's row: one head, one thread. */
static key pkey(const char *name, const char *attn, int unchecked, place where)
{
    key k = {"kvevict", name, attn, unchecked, where, 1, 1};
    return k;
}

static key floor_key(const char *variant, place where)
{
    key k = {"floor", variant, "rows", 0, where, 1, 1};
    return k;
}

/* The range of the load averages of the rows, for the conditions line. */
static void load_range(const perf_rows *rs, double *lo, double *hi)
{
    *lo = INFINITY;
    *hi = -INFINITY;
    for (size_t i = 0; i < rs->n; i++) {
        *lo = rs->r[i].load1 < *lo ? rs->r[i].load1 : *lo;
        *hi = rs->r[i].load1 > *hi ? rs->r[i].load1 : *hi;
    }
}

/* What the run ran on, in one line. */
static void conditions(FILE *f, const perf_rows *rs, const timing_opts *o, const double load[3])
{
    char cpu[128] = "an unknown CPU", line[256];
    FILE *c = fopen("/proc/cpuinfo", "r");
    while (c && fgets(line, sizeof line, c)) {
        char *v = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && v) {
            snprintf(cpu, sizeof cpu, "%s", v + 2);
            cpu[strcspn(cpu, "\n")] = '\0';
            break;
        }
    }
    if (c)
        fclose(c);
    char when[32] = "";
    time_t t = time(NULL);
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
    double lo, hi;
    load_range(rs, &lo, &hi);
    fprintf(f, "Measured %s on %s (%ld CPUs online), load average %.2f %.2f %.2f "
               "before the run, %.2f to %.2f (1 minute) over its measurements; kernels: %s; "
               "floors: ",
            when, cpu, sysconf(_SC_NPROCESSORS_ONLN), load[0], load[1], load[2], lo, hi,
            kve_isa_name());
    perf_print_floors(f);
    fprintf(f, " (the fastest is the floor); "
#if defined(__VERSION__)
               "built with " __VERSION__ "; "
#endif
               "best of %zu runs of about %.0f ms of CPU time each (wall time for 2 threads).\n",
            o->reps, o->target * 1e3);
}
/* One row of the targets table: the worst ratio of the rows `k` over
 * `budgets`, the budgets at which it is within `limit`, the verdict. */
static void target_row(FILE *f, const perf_rows *rs, const char *target, key k,
                       const size_t *budgets, size_t n_budgets, double limit)
{
    char b[24], met[160] = "";
    double worst = 0.0;
    const row *at = NULL;
    for (size_t i = 0; i < n_budgets; i++) {
        const row *r = find(rs, k, budgets[i]);
        if (!r)
            continue;
        double ratio = r->ns / r->floor_ns;
        if (ratio > worst) {
            worst = ratio;
            at = r;
        }
        if (ratio <= limit) {
            size_t len = strlen(met);
            snprintf(met + len, sizeof met - len, "%s%s", len ? ", " : "",
                     size_label(budgets[i], b));
        }
    }
    if (!at)
        return;
    fprintf(f, "| %s | %s | %s | %.2f at %s | %s | ", target, k.name, place_names[k.where],
            worst, size_label(at->budget, b), met[0] ? met : "none");
    if (worst <= limit)
        fprintf(f, "met |\n");
    else
        fprintf(f, "missed by %.0f%% |\n", (worst / limit - 1.0) * 100.0);
}

/* " 123.4 (1.23) |", or " |" when there is no such row. */
static void ratio_cell(FILE *f, const row *r)
{
    if (r)
        fprintf(f, " %.1f (%.2f) |", r->ns, r->ns / r->floor_ns);
    else
        fprintf(f, " |");
}

/* The cells of rows q at every budget, then the line's end. */
static void ratio_cells(FILE *f, const perf_rows *rs, key q, const size_t *budgets,
                        size_t n_budgets)
{
    for (size_t i = 0; i < n_budgets; i++)
        ratio_cell(f, find(rs, q, budgets[i]));
    fputc('\n', f);
}

static void header(FILE *f, const char *lead, const size_t *budgets, size_t n_budgets)
{
    char b[24];
    fprintf(f, "%s", lead);
    for (size_t i = 0; i < n_budgets; i++)
        fprintf(f, " %s |", size_label(budgets[i], b));
    fprintf(f, "\n|");
    for (const char *c = lead + 1; *c; c++)
        if (*c == '|')
            fprintf(f, "---|");
    for (size_t i = 0; i < n_budgets; i++)
        fprintf(f, "---:|");
    fputc('\n', f);
}

static const char *const tight[] = {"h2o", "tova", "h2o_decay"};

static void print_docs(FILE *f, const perf_rows *rs, const size_t *budgets, size_t n_budgets,
                       const timing_opts *o, const double load[3])
{
    char b[24];
    fputc('\n', f);
    conditions(f, rs, o, load);

    /* Every policy, pool placement. */
    fprintf(f, "\n#### Every policy: ns per step (ratio to the floor)\n\n"
               "Steady state: step (with an attention row, or NULL), then evict one; rows from "
               "the pool placement (up to %d rows). unchecked: built with unchecked = 1 (no "
               "validation of the weights). Bytes per slot: the state the policy holds "
               "(`kve_policy_state_bytes` / (budget + 1)).\n\n",
            POOL_ROWS);
    header(f, "| policy | attn | unchecked | bytes/slot |", budgets, n_budgets);
    fprintf(f, "| floor (fastest instruction set) | rows | | 12 |");
    for (size_t i = 0; i < n_budgets; i++) {
        const row *r = find(rs, floor_key("called", PLACE_POOL), budgets[i]);
        fprintf(f, " %.1f %s |", r ? r->floor_ns : NAN, r ? r->floor_isa : "");
    }
    fprintf(f, "\n| floor (x86-64) | rows | | 12 |");
    for (size_t i = 0; i < n_budgets; i++) {
        const row *r = find(rs, floor_key("called", PLACE_POOL), budgets[i]);
        fprintf(f, " %.1f |", r ? r->floor_base_ns : NAN);
    }
    fputc('\n', f);
    static const char *const impls[] = {"kvevict", "naive-passes", "naive-sort"};
    for (size_t k = 0; k < 3; k++)
        for (size_t t = 0; t < kve_policy_type_count(); t++)
            for (int mode = 2; mode >= 0; mode--)
                for (int unchecked = 0; unchecked < 2; unchecked++) {
                    const char *name = kve_policy_type_name(t);
                    const char *attn = mode == 2 ? "keys" : mode ? "rows" : "null";
                    key q = {impls[k], name, attn, unchecked, PLACE_POOL, 1, 1};
                    const row *r0 = find(rs, q, budgets[0]);
                    if (!r0)
                        continue;
                    fprintf(f, "| %s%s%s | %s | %s | %.4g |", k ? "naive " : "", name,
                            k == 1 ? ", separate passes" : k == 2 ? ", sort-based" : "", attn,
                            unchecked ? "yes" : "no",
                            (double)r0->state_bytes / (double)(r0->budget + 1));
                    ratio_cells(f, rs, q, budgets, n_budgets);
                }

    /* The floor itself, in both placements. */
    fprintf(f, "\n#### The floor, checked: what a call and a clock cost, in both placements\n\n"
               "ns per pass. called: the floor (one call of the pass a step, timed in batches "
               "of calls, as every policy row is); inline: the same pass inlined into the loop "
               "over steps; timed each call: every call timed on its own with a clock read "
               "before and after it (the monotonic clock, and the thread's CPU-time clock, a "
               "system call), the durations summed; with a minimum: the pass that also keeps "
               "the lowest new score (one minimum a vector, the least an argmin needs). pool: "
               "rows from a pool of up to %d; hot: from a pool of %d.\n\n",
            POOL_ROWS, HOT_ROWS);
    header(f, "| floor | placement | rows |", budgets, n_budgets);
    static const char *const variants[] = {"called", "inline", "timed-each-monotonic",
                                           "timed-each-cputime", "with-min"};
    static const char *const variant_text[] = {"called (the floor)", "inline",
                                               "timed each call, monotonic clock",
                                               "timed each call, CPU-time clock",
                                               "called, with a minimum"};
    for (int where = PLACE_HOT; where >= PLACE_POOL; where--)
        for (size_t v = 0; v < 5; v++) {
            const row *r0 = find(rs, floor_key(variants[v], (place)where), budgets[0]);
            if (!r0)
                continue;
            fprintf(f, "| %s | %s | %s |", variant_text[v], place_names[where],
                    where == PLACE_HOT ? "8" : "up to 64");
            for (size_t i = 0; i < n_budgets; i++) {
                const row *r = find(rs, floor_key(variants[v], (place)where), budgets[i]);
                if (r)
                    fprintf(f, " %.1f |", r->ns);
                else
                    fprintf(f, " |");
            }
            fputc('\n', f);
        }

    /* The attention readers in both placements. */
    fprintf(f, "\n#### The policies that read attention, checked and unchecked, in both "
               "placements\n\nns per step (ratio to the floor of the same placement).\n\n");
    header(f, "| policy | placement | unchecked |", budgets, n_budgets);
    for (size_t t = 0; t < kve_policy_type_count(); t++)
        for (int where = PLACE_HOT; where >= PLACE_POOL; where--)
            for (int unchecked = 0; unchecked < 2; unchecked++) {
                key q = pkey(kve_policy_type_name(t), "rows", unchecked, (place)where);
                if (!(kve_policy_type_reads(t) & KVE_READS_ATTN) || !find(rs, q, budgets[0]))
                    continue;
                fprintf(f, "| %s | %s | %s |", q.name, place_names[where],
                        unchecked ? "yes" : "no");
                ratio_cells(f, rs, q, budgets, n_budgets);
            }

    fprintf(f, "\n#### Value norms, score rules and expected attention\n\n"
               "Each row against its built-in counterpart in the same run: `h2o:vnorm=1` "
               "against `h2o` (every step also carries a value of %d floats, whose norm is "
               "taken), `h2o` written as a registered score rule (`rule_h2o`) against the "
               "built-in lane, value-aware h2o as a rule (`rule_vh2o`) against "
               "`h2o:vnorm=1`, and `expected_attention` (%d query heads of %d floats a KV "
               "head) rescoring every step and every 64 steps against `h2o`. Checked, pool "
               "placement; ns per step (ratio to the counterpart).\n\n| method | counterpart |",
            PERF_KEY_DIM, PERF_GROUP, PERF_KEY_DIM);
    for (size_t i = 0; i < n_budgets; i++)
        fprintf(f, " %s |", size_label(budgets[i], b));
    fprintf(f, "\n|---|---|");
    for (size_t i = 0; i < n_budgets; i++)
        fprintf(f, "---:|");
    fputc('\n', f);
    static const char *const methods[][4] = {
        {"kvevict", "h2o:vnorm=1", "rows", "h2o"},
        {"rule", "rule_h2o", "rows", "h2o"},
        {"rule", "rule_vh2o", "rows", "h2o:vnorm=1"},
        {"kvevict", "expected_attention", "keys", "h2o"},
        {"kvevict", "expected_attention:interval=64", "keys", "h2o"},
    };
    for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++) {
        fprintf(f, "| `%s` | `%s` |", methods[k][1], methods[k][3]);
        for (size_t i = 0; i < n_budgets; i++) { /* checked, pool placement */
            key mk = {methods[k][0], methods[k][1], methods[k][2], 0, PLACE_POOL, 1, 1};
            const row *r = find(rs, mk, budgets[i]);
            const row *c = find(rs, pkey(methods[k][3], "rows", 0, PLACE_POOL), budgets[i]);
            if (r && c)
                fprintf(f, " %.0f (%.2f) |", r->ns, r->ns / c->ns);
            else
                fprintf(f, " |");
        }
        fputc('\n', f);
    }

    fprintf(f, "\n#### Where h2o's step goes\n\n"
               "Read off the rows above, hot placement: the fixed cost of a step and an evict "
               "is what window costs with NULL attention; the validation pass is what h2o "
               "checked costs more than h2o unchecked; the rest of h2o's unchecked time is its "
               "one pass over the scores and the evict.\n\n"
               "| budget | floor (hot) | fixed (window, NULL) | validation (checked - "
               "unchecked) | h2o unchecked | unchecked - fixed | that / floor |\n"
               "|---|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < n_budgets; i++) {
        const row *hc = find(rs, pkey("h2o", "rows", 0, PLACE_HOT), budgets[i]);
        const row *hu = find(rs, pkey("h2o", "rows", 1, PLACE_HOT), budgets[i]);
        const row *wn = find(rs, pkey("window", "null", 0, PLACE_POOL), budgets[i]);
        if (!hc || !hu || !wn)
            continue;
        double pass = hu->ns - wn->ns;
        fprintf(f, "| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n",
                size_label(budgets[i], b), hu->floor_ns, wn->ns, hc->ns - hu->ns, hu->ns, pass,
                pass / hu->floor_ns);
    }

    fprintf(f, "\n#### What an evict moves\n\n"
               "The kept positions stay one ascending array (`kve_policy_positions`), so an "
               "evict closes its victim's hole in them at once: a memmove of the positions after "
               "the victim. Mean positions moved per evict over %d more steps (not timed), "
               "unchecked, hot placement, and that as a fraction of the budget.\n\n",
            MOVED_STEPS);
    header(f, "| policy |", budgets, n_budgets);
    for (size_t k = 0; k < 3; k++) {
        fprintf(f, "| %s |", tight[k]);
        for (size_t i = 0; i < n_budgets; i++) {
            const row *r = find(rs, pkey(tight[k], "rows", 1, PLACE_HOT), budgets[i]);
            if (r && isfinite(r->moved))
                fprintf(f, " %.0f (%.2f) |", r->moved, r->moved / (double)budgets[i]);
            else
                fprintf(f, " |");
        }
        fputc('\n', f);
    }

    fprintf(f, "\n#### Targets\n\n| target | policy | placement | worst ratio | met at | "
               "verdict |\n|---|---|---|---:|---|---|\n");
    for (int where = PLACE_HOT; where >= PLACE_POOL; where--) {
        for (size_t k = 0; k < 3; k++)
            target_row(f, rs, "within 1.2x of the floor, unchecked",
                       pkey(tight[k], "rows", 1, (place)where), budgets, n_budgets, 1.2);
        for (size_t k = 0; k < 3; k++)
            target_row(f, rs, "within 1.6x of the floor, checked",
                       pkey(tight[k], "rows", 0, (place)where), budgets, n_budgets, 1.6);
    }
    static const char *const loose[] = {"scissorhands", "h2o_mean"};
    for (size_t k = 0; k < 2; k++)
        target_row(f, rs, "within 2x of the floor, checked", pkey(loose[k], "rows", 0, PLACE_POOL),
                   budgets, n_budgets, 2.0);
    static const char *const flat[] = {"window", "streaming"};
    for (size_t k = 0; k < 2; k++) {
        double lo = INFINITY, hi = 0.0;
        for (size_t i = 0; i < n_budgets; i++) {
            const row *r = find(rs, pkey(flat[k], "null", 0, PLACE_POOL), budgets[i]);
            if (r) {
                lo = r->ns < lo ? r->ns : lo;
                hi = r->ns > hi ? r->ns : hi;
            }
        }
        fprintf(f, "| flat with NULL: max / min ns per step <= 1.5 | %s | pool | %.2f | | %s |\n",
                flat[k], hi / lo, hi / lo <= 1.5 ? "met" : "missed");
    }
    for (int where = PLACE_HOT; where >= PLACE_POOL; where--)
        for (int unchecked = 1; unchecked >= 0; unchecked--) {
            key q = {"kvevict", "h2o", "rows", unchecked, (place)where, 256, 1};
            const row *big = find(rs, q, 4096);
            if (!big)
                continue;
            double ratio = big->ns / big->floor_ns, limit = unchecked ? 1.2 : 1.3;
            fprintf(f, "| bank of 32 x 8 heads x 4Ki within %.1fx of its floor, 1 thread, %s | "
                       "h2o | %s | %.2f | | ",
                    limit, unchecked ? "unchecked" : "checked", place_names[where], ratio);
            if (ratio <= limit)
                fprintf(f, "met |\n");
            else
                fprintf(f, "missed by %.0f%% |\n", (ratio / limit - 1.0) * 100.0);
        }

    fprintf(f, "\n#### Banks of h2o: one thread, and two on the two halves of the heads\n\n"
               "ns per step (ratio to the floor of the same size and placement); two threads: "
               "checked, pool placement.\n\n"
               "| heads x budget | slots | placement | floor ns | 1 thread, checked | "
               "1 thread, unchecked | 2 threads, checked |\n|---|---:|---|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < rs->n; i++) {
        const row *r = &rs->r[i];
        if (r->heads == 1 || r->threads != 1 || r->unchecked)
            continue;
        key u = {"kvevict", "h2o", "rows", 1, r->where, r->heads, 1};
        key two = {"kvevict", "h2o", "rows", 0, r->where, r->heads, 2};
        fprintf(f, "| %zu x %s | %.0f | %s | %.0f |", r->heads, size_label(r->budget, b),
                slots_of(r), place_names[r->where], r->floor_ns);
        ratio_cell(f, r);
        ratio_cell(f, find(rs, u, r->budget));
        ratio_cell(f, find(rs, two, r->budget));
        fputc('\n', f);
    }
    fputc('\n', f);
}

/* ns per step against budget, log-log: every policy (with attention rows,
 * pool placement), h2o unchecked in both placements, window with NULL, the
 * floors and the naive h2o. */
static void plot(const char *dir, const perf_rows *rs, const size_t *budgets, size_t n_budgets)
{
    if (strchr(dir, '\'') || strchr(dir, '\n'))
        die_usage("--plot: quotes and newlines are not supported in '%s'", dir);
    if (access(dir, W_OK) != 0)
        die_input("--plot: '%s' is not a writable directory", dir);
    FILE *g = popen("gnuplot", "w");
    if (!g)
        die_input("--plot: cannot run gnuplot: %s", strerror(errno));
    fprintf(g, "set terminal pngcairo size 960,640 noenhanced font 'Sans,11'\n"
               "set output '%s/perf_vs_budget.png'\n"
               "set logscale xy\nset format xy '%%g'\nset grid\nset key outside right\n"
               "set xlabel 'budget (kept positions)'\nset ylabel 'ns per step (step + evict)'\n"
               "set title 'Per-step cost against budget (%s kernels)'\n",
            dir, kve_isa_name());
    fprintf(g, "$d << EOD\n");
    for (size_t i = 0; i < n_budgets; i++) {
        const row *fp = find(rs, floor_key("called", PLACE_POOL), budgets[i]);
        const row *fh = find(rs, floor_key("called", PLACE_HOT), budgets[i]);
        fprintf(g, "%zu %.6g %.6g %.6g", budgets[i], fp ? fp->ns : NAN, fp ? fp->floor_base_ns : NAN,
                fh ? fh->ns : NAN);
        for (size_t t = 0; t < kve_policy_type_count(); t++) {
            const char *mode = kve_policy_type_reads(t) & KVE_READS_KEYS ? "keys" : "rows";
            const row *r = find(rs, pkey(kve_policy_type_name(t), mode, 0, PLACE_POOL), budgets[i]);
            if (strcmp(kve_policy_type_name(t), "full") != 0)
                fprintf(g, " %.6g", r ? r->ns : NAN);
        }
        const row *up = find(rs, pkey("h2o", "rows", 1, PLACE_POOL), budgets[i]);
        const row *uh = find(rs, pkey("h2o", "rows", 1, PLACE_HOT), budgets[i]);
        const row *wn = find(rs, pkey("window", "null", 0, PLACE_POOL), budgets[i]);
        key kp = {"naive-passes", "h2o", "rows", 0, PLACE_POOL, 1, 1};
        key ks = {"naive-sort", "h2o", "rows", 0, PLACE_POOL, 1, 1};
        const row *np = find(rs, kp, budgets[i]), *ns = find(rs, ks, budgets[i]);
        fprintf(g, " %.6g %.6g %.6g %.6g %.6g\n", up ? up->ns : NAN, uh ? uh->ns : NAN,
                wn ? wn->ns : NAN, np ? np->ns : NAN, ns ? ns->ns : NAN);
    }
    fprintf(g, "EOD\nplot $d using 1:2 with linespoints lw 3 lc rgb 'black' title 'floor', "
               "$d using 1:3 with linespoints dt 2 lc rgb 'black' title 'floor, x86-64', "
               "$d using 1:4 with linespoints lw 2 dt 3 lc rgb 'black' title 'floor, hot rows'");
    int c = 5;
    for (size_t t = 0; t < kve_policy_type_count(); t++)
        if (strcmp(kve_policy_type_name(t), "full") != 0)
            fprintf(g, ", $d using 1:%d with linespoints title '%s'", c++,
                    kve_policy_type_name(t));
    fprintf(g, ", $d using 1:%d with linespoints lw 2 title 'h2o, unchecked'", c++);
    fprintf(g, ", $d using 1:%d with linespoints lw 2 dt 3 title 'h2o, unchecked, hot rows'", c++);
    fprintf(g, ", $d using 1:%d with linespoints dt 3 title 'window, NULL'", c++);
    fprintf(g, ", $d using 1:%d with linespoints dt 4 title 'naive h2o, passes'", c++);
    fprintf(g, ", $d using 1:%d with linespoints dt 5 title 'naive h2o, sort'\n", c);
    int rc = pclose(g);
    if (rc != 0)
        die_input("--plot: gnuplot failed (status %d)", rc);
}

/* --docs FILE: the block of FILE rewritten (rewrite_block). */
static void write_docs(const char *path, const perf_rows *rs, const size_t *budgets, size_t n_budgets,
                       const timing_opts *o, const double load[3])
{
    char *block = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&block, &len);
    if (!m)
        die_input("out of memory");
    print_docs(m, rs, budgets, n_budgets, o, load);
    fclose(m);
    rewrite_block(path, "perf", block);
    free(block);
}

const perf_renderers perf_docs_renderers = {write_docs, plot};
