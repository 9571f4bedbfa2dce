/* SPDX-License-Identifier: MIT */
/*
 * perf_docs.c - the measured section of docs/performance.md and its figure
 * from one `kvevict perf` run (make perf-docs): the conditions of the run,
 * every policy's ns per step and ratio to the floor, the value norms, score
 * rules and expected attention against their counterparts, where h2o's step goes,
 * the targets met or missed, the banks; and perf_vs_budget.png (gnuplot).
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

/* "256", "4Ki", "256Ki". */
static const char *size_label(size_t b, char buf[24])
{
    if (b >= 1024 && b % 1024 == 0)
        snprintf(buf, 24, "%zuKi", b / 1024);
    else
        snprintf(buf, 24, "%zu", b);
    return buf;
}

static const row *find(const perf_rows *rs, const char *impl, const char *name, const char *attn,
                       size_t budget, size_t heads, size_t threads)
{
    for (size_t i = 0; i < rs->n; i++) {
        const row *r = &rs->r[i];
        if (strcmp(r->impl, impl) == 0 && strcmp(r->name, name) == 0 &&
            strcmp(r->attn, attn) == 0 && r->budget == budget && r->heads == heads &&
            r->threads == threads)
            return r;
    }
    return NULL;
}

/* What the run ran on, in one line. */
static void conditions(FILE *f, const timing_opts *o, const double load[3])
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
    fprintf(f, "Measured %s on %s (%ld CPUs online), load average %.2f %.2f %.2f "
               "before the run; kernels: %s; floors: ",
            when, cpu, sysconf(_SC_NPROCESSORS_ONLN), load[0], load[1], load[2], kve_isa_name());
    perf_print_floors(f);
    fprintf(f, " (the fastest is the floor); "
#if defined(__VERSION__)
               "built with " __VERSION__ "; "
#endif
               "best of %zu runs of about %.0f ms of CPU time each (wall time for 2 threads).\n",
            o->reps, o->target * 1e3);
}

/* One row of the targets table: `name`'s worst ratio over `budgets` (attn
 * `attn`), where, the budgets at which it is within `limit`, the verdict. */
static void target_row(FILE *f, const perf_rows *rs, const char *target, const char *name,
                       const char *attn, const size_t *budgets, size_t n_budgets, double limit)
{
    char b[24], met[160] = "";
    double worst = 0.0;
    const row *at = NULL;
    for (size_t i = 0; i < n_budgets; i++) {
        const row *r = find(rs, "kvevict", name, attn, budgets[i], 1, 1);
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
    fprintf(f, "| %s | %s | %.2f at %s | %s | ", target, name, worst, size_label(at->budget, b),
            met[0] ? met : "none");
    if (worst <= limit)
        fprintf(f, "met |\n");
    else
        fprintf(f, "missed by %.0f%% |\n", (worst / limit - 1.0) * 100.0);
}

static void print_docs(FILE *f, const perf_rows *rs, const size_t *budgets, size_t n_budgets,
                       const timing_opts *o, const double load[3])
{
    char b[24];
    fputc('\n', f);
    conditions(f, o, load);
    fprintf(f, "\n#### Every policy: ns per step (ratio to the floor)\n\n"
               "Steady state: step (with an attention row, or NULL), then evict one. "
               "Bytes per slot: the state the policy holds (`kve_policy_state_bytes` / "
               "(budget + 1)).\n\n| policy | attn | bytes/slot |");
    for (size_t i = 0; i < n_budgets; i++)
        fprintf(f, " %s |", size_label(budgets[i], b));
    fprintf(f, "\n|---|---|---:|");
    for (size_t i = 0; i < n_budgets; i++)
        fprintf(f, "---:|");
    fputc('\n', f);
    fprintf(f, "| floor (fastest instruction set) | rows | 12 |");
    for (size_t i = 0; i < n_budgets; i++) {
        const row *r = find(rs, "kvevict", "h2o", "rows", budgets[i], 1, 1);
        fprintf(f, " %.1f %s |", r ? r->floor_ns : NAN, r ? r->floor_isa : "");
    }
    fprintf(f, "\n| floor (x86-64) | rows | 12 |");
    for (size_t i = 0; i < n_budgets; i++) {
        const row *r = find(rs, "kvevict", "h2o", "rows", budgets[i], 1, 1);
        fprintf(f, " %.1f |", r ? r->floor_base_ns : NAN);
    }
    fputc('\n', f);
    static const char *const impls[] = {"kvevict", "naive-passes", "naive-sort"};
    for (size_t k = 0; k < 3; k++)
        for (size_t t = 0; t < kve_policy_type_count(); t++)
            for (int attn = 2; attn >= 0; attn--) {
                const char *name = kve_policy_type_name(t);
                const char *mode = attn == 2 ? "keys" : attn ? "rows" : "null";
                const row *r0 = find(rs, impls[k], name, mode, budgets[0], 1, 1);
                if (!r0)
                    continue;
                fprintf(f, "| %s%s%s | %s | %.4g |", k ? "naive " : "", name,
                        k == 1 ? ", separate passes" : k == 2 ? ", sort-based" : "", mode,
                        (double)r0->state_bytes / (double)(r0->budget + 1));
                for (size_t i = 0; i < n_budgets; i++) {
                    const row *r = find(rs, impls[k], name, mode, budgets[i], 1, 1);
                    if (r)
                        fprintf(f, " %.1f (%.2f) |", r->ns, r->ns / r->floor_ns);
                    else
                        fprintf(f, " |");
                }
                fputc('\n', f);
            }

    fprintf(f, "\n#### Value norms, score rules and expected attention\n\n"
               "Each row against its built-in counterpart in the same run: `h2o:vnorm=1` "
               "against `h2o` (every step also carries a value of %d floats, whose norm is "
               "taken), `h2o` written as a registered score rule (`rule_h2o`) against the "
               "built-in lane, value-aware h2o as a rule (`rule_vh2o`) against "
               "`h2o:vnorm=1`, and `expected_attention` (%d query heads of %d floats a KV "
               "head) rescoring every step and every 64 steps against `h2o`. ns per step "
               "(ratio to the counterpart).\n\n| method | counterpart |",
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
        for (size_t i = 0; i < n_budgets; i++) {
            const row *r = find(rs, methods[k][0], methods[k][1], methods[k][2], budgets[i], 1, 1);
            const row *c = find(rs, "kvevict", methods[k][3], "rows", budgets[i], 1, 1);
            if (r && c)
                fprintf(f, " %.0f (%.2f) |", r->ns, r->ns / c->ns);
            else
                fprintf(f, " |");
        }
        fputc('\n', f);
    }

    fprintf(f, "\n#### Where h2o's step goes\n\n"
               "Read off the rows above: the fixed cost of a step and an evict is what "
               "window costs with NULL attention; the validation pass (every weight checked "
               "before any score changes) is what window adds with attention rows; the rest "
               "of h2o's time is its one pass over the scores and the evict.\n\n"
               "| budget | floor | fixed (window, NULL) | validation (window: rows - NULL) | "
               "h2o | h2o - fixed - validation | that / floor |\n"
               "|---|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < n_budgets; i++) {
        const row *h = find(rs, "kvevict", "h2o", "rows", budgets[i], 1, 1);
        const row *wr = find(rs, "kvevict", "window", "rows", budgets[i], 1, 1);
        const row *wn = find(rs, "kvevict", "window", "null", budgets[i], 1, 1);
        if (!h || !wr || !wn)
            continue;
        double pass = h->ns - wr->ns;
        fprintf(f, "| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", size_label(budgets[i], b),
                h->floor_ns, wn->ns, wr->ns - wn->ns, h->ns, pass, pass / h->floor_ns);
    }

    fprintf(f, "\n#### Targets\n\n| target | policy | worst ratio | met at | verdict |\n"
               "|---|---|---:|---|---|\n");
    static const char *const tight[] = {"h2o", "tova", "h2o_decay"};
    static const char *const loose[] = {"scissorhands", "h2o_mean"};
    for (size_t k = 0; k < 3; k++)
        target_row(f, rs, "within 1.3x of the floor, with rows", tight[k], "rows", budgets,
                   n_budgets, 1.3);
    for (size_t k = 0; k < 2; k++)
        target_row(f, rs, "within 2x of the floor, with rows", loose[k], "rows", budgets,
                   n_budgets, 2.0);
    static const char *const flat[] = {"window", "streaming"};
    for (size_t k = 0; k < 2; k++) {
        double lo = INFINITY, hi = 0.0;
        for (size_t i = 0; i < n_budgets; i++) {
            const row *r = find(rs, "kvevict", flat[k], "null", budgets[i], 1, 1);
            if (r) {
                lo = r->ns < lo ? r->ns : lo;
                hi = r->ns > hi ? r->ns : hi;
            }
        }
        fprintf(f, "| flat with NULL: max / min ns per step <= 1.5 | %s | %.2f | | %s |\n",
                flat[k], hi / lo, hi / lo <= 1.5 ? "met" : "missed");
    }
    const row *big = find(rs, "kvevict", "h2o", "rows", 4096, 256, 1);
    if (big) {
        double ratio = big->ns / big->floor_ns;
        fprintf(f, "| bank of 32 x 8 heads x 4Ki within 1.3x of its floor, 1 thread | h2o | %.2f "
                   "| | ", ratio);
        if (ratio <= 1.3)
            fprintf(f, "met |\n");
        else
            fprintf(f, "missed by %.0f%% |\n", (ratio / 1.3 - 1.0) * 100.0);
    }

    fprintf(f, "\n#### Banks of h2o: one thread, and two on the two halves of the heads\n\n"
               "| heads x budget | slots | floor ns | 1 thread ns (ratio) | "
               "2 threads ns (ratio) |\n|---|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < rs->n; i++) {
        const row *r = &rs->r[i];
        if (r->heads == 1 || r->threads != 1)
            continue;
        const row *two = find(rs, "kvevict", "h2o", "rows", r->budget, r->heads, 2);
        fprintf(f, "| %zu x %s | %.0f | %.0f | %.0f (%.2f) |", r->heads,
                size_label(r->budget, b), slots_of(r), r->floor_ns, r->ns, r->ns / r->floor_ns);
        if (two)
            fprintf(f, " %.0f (%.2f) |\n", two->ns, two->ns / two->floor_ns);
        else
            fprintf(f, " |\n");
    }
    fputc('\n', f);
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

/* ns per step against budget, log-log: every policy (with attention rows),
 * window with NULL, the floors and the naive h2o. */
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
        const row *h = find(rs, "kvevict", "h2o", "rows", budgets[i], 1, 1);
        fprintf(g, "%zu %.6g %.6g", budgets[i], h ? h->floor_ns : NAN, h ? h->floor_base_ns : NAN);
        for (size_t t = 0; t < kve_policy_type_count(); t++) {
            const char *mode = kve_policy_type_reads(t) & KVE_READS_KEYS ? "keys" : "rows";
            const row *r = find(rs, "kvevict", kve_policy_type_name(t), mode, budgets[i], 1, 1);
            if (strcmp(kve_policy_type_name(t), "full") != 0)
                fprintf(g, " %.6g", r ? r->ns : NAN);
        }
        const row *wn = find(rs, "kvevict", "window", "null", budgets[i], 1, 1);
        const row *np = find(rs, "naive-passes", "h2o", "rows", budgets[i], 1, 1);
        const row *ns = find(rs, "naive-sort", "h2o", "rows", budgets[i], 1, 1);
        fprintf(g, " %.6g %.6g %.6g\n", wn ? wn->ns : NAN, np ? np->ns : NAN, ns ? ns->ns : NAN);
    }
    fprintf(g, "EOD\nplot $d using 1:2 with linespoints lw 3 lc rgb 'black' title 'floor', "
               "$d using 1:3 with linespoints dt 2 lc rgb 'black' title 'floor, x86-64'");
    int c = 4;
    for (size_t t = 0; t < kve_policy_type_count(); t++)
        if (strcmp(kve_policy_type_name(t), "full") != 0)
            fprintf(g, ", $d using 1:%d with linespoints title '%s'", c++,
                    kve_policy_type_name(t));
    fprintf(g, ", $d using 1:%d with linespoints dt 3 title 'window, NULL'", c++);
    fprintf(g, ", $d using 1:%d with linespoints dt 4 title 'naive h2o, passes'", c++);
    fprintf(g, ", $d using 1:%d with linespoints dt 5 title 'naive h2o, sort'\n", c);
    int rc = pclose(g);
    if (rc != 0)
        die_input("--plot: gnuplot failed (status %d)", rc);
}

const perf_renderers perf_docs_renderers = {write_docs, plot};
