/* SPDX-License-Identifier: MIT */
/*
 * args.c - option parsing, strict numbers and lists for the kvevict tool
 * (its errors are errors.c's).
 *
 * Options are "--name VALUE", "--name=VALUE", "-x VALUE" or flags. The
 * options several subcommands share (SO_* in cli.h) are parsed here, once,
 * into typed fields of cli_args; a subcommand's own options are kept as
 * given. Numbers are plain decimal digits only: no sign, no blanks, no
 * trailing bytes, no overflow. Every failure exits with one line on stderr.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- numbers and lists ---- */

uint64_t parse_u64(const char *what, const char *s, uint64_t min, uint64_t max)
{
    if (!s[0])
        die_usage("%s: empty number", what);
    uint64_t x = 0;
    for (const char *c = s; *c; c++) {
        if (*c < '0' || *c > '9')
            die_usage("%s: '%s' is not a plain decimal number", what, s);
        uint64_t d = (uint64_t)(*c - '0');
        if (x > (UINT64_MAX - d) / 10)
            die_usage("%s: '%s' is too large", what, s);
        x = x * 10 + d;
    }
    if (x < min || x > max)
        die_usage("%s: %s is out of range [%llu, %llu]", what, s, (unsigned long long)min,
                  (unsigned long long)max);
    return x;
}

double parse_real(const char *what, const char *s, double min, double max)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(s, &end);
    if (!strchr("0123456789.+-", s[0]) || !s[0] || *end || errno || !isfinite(x) ||
        strpbrk(s, "xX"))
        die_usage("%s: '%s' is not a plain decimal number", what, s);
    if (!(x >= min && x <= max))
        die_usage("%s: %s is out of range [%g, %g]", what, s, min, max);
    return x;
}

char **split_list(const char *what, const char *s, size_t *n)
{
    size_t count = 1;
    for (const char *c = s; *c; c++)
        count += *c == ',';
    char **items = xcalloc(count, sizeof *items);
    const char *start = s;
    for (size_t i = 0; i < count; i++) {
        const char *end = strchr(start, ',');
        size_t len = end ? (size_t)(end - start) : strlen(start);
        if (len == 0) {
            free_list(items, i);
            die_usage("%s: empty item in list '%s'", what, s);
        }
        items[i] = xmalloc(len + 1);
        memcpy(items[i], start, len);
        items[i][len] = '\0';
        start = end ? end + 1 : start + len;
    }
    *n = count;
    return items;
}

char **split_lists(const char *what, const opt_val *v, size_t *n)
{
    char **all = NULL;
    *n = 0;
    for (int k = 0; k < v->count; k++) {
        size_t m;
        char **items = split_list(what, v->v[k], &m);
        all = xrealloc(all, (*n + m) * sizeof *all);
        memcpy(all + *n, items, m * sizeof *items);
        *n += m;
        free(items);
    }
    return all;
}

void free_list(char **items, size_t n)
{
    if (!items)
        return;
    for (size_t i = 0; i < n; i++)
        free(items[i]);
    free(items);
}

void parse_budgets(const char *what, const char *s, size_t *out, size_t cap, size_t *n)
{
    size_t count;
    char **items = split_list(what, s, &count);
    if (count > cap) {
        free_list(items, count);
        die_usage("%s: %zu budgets; at most %zu", what, count, cap);
    }
    for (size_t i = 0; i < count; i++) {
        char item[32];
        snprintf(item, sizeof item, "%s", items[i]);
        int too_long = strlen(items[i]) >= sizeof item;
        if (too_long) { /* a number this long is out of range anyway */
            free_list(items, count);
            die_usage("%s: '%s...' is too large", what, item);
        }
        free(items[i]);
        items[i] = NULL;
        out[i] = (size_t)parse_u64(what, item, 1, KVE_MAX_BUDGET);
    }
    free(items);
    *n = count;
}

size_t parse_budget(const char *what, const char *s, double *percent)
{
    size_t len = strlen(s);
    *percent = 0;
    if (len > 1 && s[len - 1] == '%') {
        char *end;
        errno = 0;
        double p = strtod(s, &end);
        if (end != s + len - 1 || errno || !(p > 0) || p > 100 || s[0] < '0' || s[0] > '9')
            die_usage("%s: '%s' is not a percentage in (0, 100]", what, s);
        *percent = p;
        return 0;
    }
    return (size_t)parse_u64(what, s, 1, KVE_MAX_BUDGET);
}

size_t budget_of_whole(const char *what, const char *s, double percent, size_t whole,
                       const char *of)
{
    size_t b = (size_t)floor(percent * (double)whole / 100.0);
    if (b == 0)
        die_usage("%s: %s of %s (%zu) is no position", what, s, of, whole);
    if (b > KVE_MAX_BUDGET)
        die_usage("%s: %s of %s (%zu) is above %d", what, s, of, whole, KVE_MAX_BUDGET);
    return b;
}

void cli_resolve_budgets(cli_args *a, size_t whole, const char *of)
{
    for (size_t i = 0; i < a->n_budgets; i++)
        if (a->budget_pct[i] > 0) {
            char s[32];
            snprintf(s, sizeof s, "%g%%", a->budget_pct[i]);
            a->budgets[i] = budget_of_whole("--budget", s, a->budget_pct[i], whole, of);
            a->budget_pct[i] = 0;
        }
    a->budget = a->n_budgets ? a->budgets[0] : 0;
    a->budgets_relative = 0;
}

char *canon_spec(const char *what, const char *spec, size_t budget)
{
    char buf[KVE_SPEC_MAX];
    kve_status s;
    if (budget) {
        char num[32];
        snprintf(num, sizeof num, "%zu", budget);
        s = kve_spec_with(spec, "budget", num, buf, sizeof buf);
    } else {
        s = kve_spec_with(spec, NULL, NULL, buf, sizeof buf);
    }
    if (s != KVE_OK)
        die_usage("%s: %s", what, kve_last_error());
    return xstrdup(buf);
}

const char *reads_label(unsigned reads)
{
    static const char *const labels[16] = {
        "nothing", "attention", "keys", "attention+keys", "queries", "attention+queries",
        "keys+queries", "attention+keys+queries", "values", "attention+values", "keys+values",
        "attention+keys+values", "queries+values", "attention+queries+values",
        "keys+queries+values", "attention+keys+queries+values"};
    return labels[reads & 15u];
}

/* ---- options ---- */

/* The shared options as the parser sees them; SO_FORMAT is five words. */
static const struct {
    unsigned so;
    opt_def def;
} shared_defs[] = {
    {SO_TRACE, {"trace", 0, OPT_VALUE}},
    {SO_POLICY, {"policy", 0, OPT_VALUE}},
    {SO_BUDGET, {"budget", 0, OPT_VALUE}},
    {SO_BUDGETS, {"budget", 0, OPT_VALUE | OPT_REPEAT}}, /* a list: split_lists */
    {SO_SEED, {"seed", 0, OPT_VALUE}},
    {SO_NORMALIZE, {"normalize", 0, 0}},
    {SO_TOPK, {"topk", 0, OPT_VALUE}},
    {SO_HEAD, {"head", 0, OPT_VALUE}},
    {SO_FORMAT, {"format", 0, OPT_VALUE}},
    {SO_FORMAT, {"json", 0, 0}},
    {SO_FORMAT, {"csv", 0, 0}},
    {SO_FORMAT, {"md", 0, 0}},
    {SO_FORMAT, {"markdown", 0, 0}},
    {SO_OUTPUT, {"output", 'o', OPT_VALUE}},
    {SO_QUIET, {"quiet", 0, 0}},
};
enum { N_SHARED = sizeof shared_defs / sizeof shared_defs[0] };

/* One table of every option the command takes: shared ones first. */
typedef struct optset {
    const opt_def *def[N_SHARED + CLI_MAX_OWN];
    opt_val *val[N_SHARED + CLI_MAX_OWN];
    size_t n;
} optset;

/* Whether name[0 .. len) spells def with its hyphens left out or put in
 * (--topk and --top-k, --recentwindow ...): one idea, one option, however
 * it is written. */
static int loose_same(const char *def, const char *name, size_t len)
{
    size_t i = 0;
    for (;; def++) {
        while (*def == '-')
            def++;
        while (i < len && name[i] == '-')
            i++;
        if (!*def || i == len)
            return !*def && i == len;
        if (*def != name[i++])
            return 0;
    }
}

static const opt_def *find_long(const optset *o, const char *name, size_t len, size_t *idx)
{
    for (size_t i = 0; i < o->n; i++)
        if (strlen(o->def[i]->name) == len && strncmp(o->def[i]->name, name, len) == 0) {
            *idx = i;
            return o->def[i];
        }
    /* no exact match: the one option spelled so but for hyphens */
    const opt_def *found = NULL;
    for (size_t i = 0; i < o->n; i++)
        if (loose_same(o->def[i]->name, name, len)) {
            if (found)
                return NULL; /* two would match: the user must spell it out */
            found = o->def[i];
            *idx = i;
        }
    return found;
}

static const opt_def *find_short(const optset *o, char c, size_t *idx)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->def[i]->short_name && o->def[i]->short_name == c) {
            *idx = i;
            return o->def[i];
        }
    return NULL;
}

static const char *need_value(const opt_val *v)
{
    return v->count ? v->v[0] : NULL;
}

static tfmt parse_format(const char *s)
{
    if (strcmp(s, "text") == 0)
        return FMT_TEXT;
    if (strcmp(s, "md") == 0 || strcmp(s, "markdown") == 0)
        return FMT_MD;
    if (strcmp(s, "csv") == 0)
        return FMT_CSV;
    if (strcmp(s, "json") == 0)
        return FMT_JSON;
    die_usage("--format: '%s' is not one of text, md, csv, json", s);
}

void cli_parse(cli_args *a, const cli_spec *spec, int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(spec->usage, stdout);
            finish_stdout();
            exit(0);
        }
    }
    memset(a, 0, sizeof *a);
    a->topk = 32;
    a->format = spec->default_format;

    opt_val shared_val[N_SHARED];
    memset(shared_val, 0, sizeof shared_val);
    optset o;
    o.n = 0;
    for (size_t i = 0; i < N_SHARED; i++)
        if (spec->shared & shared_defs[i].so) {
            o.def[o.n] = &shared_defs[i].def;
            o.val[o.n++] = &shared_val[i];
        }
    if (spec->n_own > CLI_MAX_OWN) { /* a command's table outgrew the parser: a bug, not input */
        fprintf(stderr, "kvevict: internal error: a command has %zu options, more than %d\n",
                spec->n_own, (int)CLI_MAX_OWN);
        exit(3);
    }
    for (size_t i = 0; i < spec->n_own; i++) {
        o.def[o.n] = &spec->own[i];
        o.val[o.n++] = &a->own[i];
    }

    int only_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        if (only_pos || w[0] != '-' || w[1] == '\0') {
            if (a->n_pos >= spec->max_pos)
                die_usage("unexpected argument '%s' (see %s %s --help)", w, cli_program, cli_cmd);
            a->pos[a->n_pos++] = w;
            continue;
        }
        if (strcmp(w, "--") == 0) {
            only_pos = 1;
            continue;
        }
        const opt_def *d = NULL;
        const char *value = NULL;
        size_t idx = 0;
        if (w[1] == '-') {
            const char *name = w + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            d = find_long(&o, name, len, &idx);
            if (!d)
                die_usage("unknown option '%.*s' (see %s %s --help)", (int)(len + 2), w, cli_program,
                          cli_cmd);
            if (eq) {
                if (!(d->flags & OPT_VALUE))
                    die_usage("option '--%s' takes no value", d->name);
                value = eq + 1;
            }
        } else {
            d = w[2] == '\0' ? find_short(&o, w[1], &idx) : NULL;
            if (!d)
                die_usage("unknown option '%s' (see %s %s --help)", w, cli_program, cli_cmd);
        }
        if ((d->flags & OPT_VALUE) && !value) {
            if (i + 1 >= argc)
                die_usage("option '%s' needs a value", w);
            value = argv[++i];
        }
        opt_val *v = o.val[idx];
        if (v->count > 0 && !(d->flags & OPT_REPEAT))
            die_usage("option '--%s' given more than once", d->name);
        if (v->count >= OPT_MAXREP)
            die_usage("option '--%s' given more than %d times", d->name, OPT_MAXREP);
        if ((d->flags & OPT_VALUE) && value[0] == '\0')
            die_usage("option '--%s' needs a non-empty value", d->name);
        v->v[v->count++] = value;
    }

    /* The shared values, checked in the order the table lists them. */
    const char *fmt_word = NULL;
    for (size_t i = 0; i < N_SHARED; i++) {
        const opt_val *v = &shared_val[i];
        if (!(spec->shared & shared_defs[i].so) || v->count == 0)
            continue;
        const char *name = shared_defs[i].def.name;
        const char *s = need_value(v);
        switch (shared_defs[i].so) {
        case SO_TRACE:
            a->trace = s;
            break;
        case SO_POLICY:
            a->policy = s; /* checked by the command, with its --budget */
            break;
        case SO_BUDGET:
            a->budget = parse_budget("--budget", s, &a->budget_pct[0]);
            a->n_budgets = 1;
            a->budgets[0] = a->budget;
            a->budgets_relative = a->budget == 0;
            break;
        case SO_BUDGETS: {
            size_t n;
            char **items = split_lists("--budget", v, &n);
            if (n > CLI_MAX_BUDGETS) {
                free_list(items, n);
                die_usage("--budget: %zu budgets; at most %d", n, CLI_MAX_BUDGETS);
            }
            for (size_t k = 0; k < n; k++) {
                if (strlen(items[k]) >= 32) { /* a number this long is out of range anyway */
                    char item[32];
                    snprintf(item, sizeof item, "%.31s", items[k]);
                    free_list(items, n);
                    die_usage("--budget: '%s...' is too large", item);
                }
                a->budgets[k] = parse_budget("--budget", items[k], &a->budget_pct[k]);
                a->budgets_relative |= a->budgets[k] == 0;
            }
            free_list(items, n);
            a->n_budgets = n;
            a->budget = a->budgets[0];
            break;
        }
        case SO_SEED:
            a->seed = parse_u64("--seed", s, 0, UINT64_MAX);
            break;
        case SO_NORMALIZE:
            a->trace_flags |= KVE_TRACE_NORMALIZE;
            break;
        case SO_TOPK:
            a->topk = (size_t)parse_u64("--topk", s, 1, KVE_MAX_BUDGET);
            a->topk_given = 1;
            break;
        case SO_HEAD:
            a->head = (size_t)parse_u64("--head", s, 0, SIZE_MAX);
            a->head_given = 1;
            break;
        case SO_FORMAT: {
            tfmt f = strcmp(name, "format") == 0 ? parse_format(s)
                     : strcmp(name, "json") == 0 ? FMT_JSON
                     : strcmp(name, "csv") == 0  ? FMT_CSV
                                                 : FMT_MD;
            if (fmt_word && f != a->format)
                die_usage("--%s and --%s contradict each other", fmt_word, name);
            fmt_word = name;
            a->format = f;
            break;
        }
        case SO_OUTPUT:
            a->output = s;
            break;
        case SO_QUIET:
            cli_quiet = 1;
            break;
        default:
            break;
        }
    }
    static const struct {
        unsigned so;
        const char *name;
    } required[] = {{SO_TRACE, "trace"}, {SO_POLICY, "policy"}, {SO_OUTPUT, "output"}};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        if (!(spec->required & required[i].so))
            continue;
        int given = required[i].so == SO_TRACE    ? a->trace != NULL
                    : required[i].so == SO_POLICY ? a->policy != NULL
                                                  : a->output != NULL;
        if (!given)
            die_usage("missing required option '--%s' (see %s %s --help)", required[i].name,
                      cli_program, cli_cmd);
    }
}

const opt_val *cli_own(const cli_args *a, const cli_spec *spec, const char *name)
{
    for (size_t i = 0; i < spec->n_own; i++)
        if (strcmp(spec->own[i].name, name) == 0)
            return &a->own[i];
    die_input("internal error: option '--%s' is not declared", name);
}
