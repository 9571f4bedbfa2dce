/*
 * cmd_eval.c - the subcommands that work on one trace source: eval, replay,
 * trace and sweep, and the sweep grid shared with the docs generator.
 *
 * Every argument is validated (specs through kve_spec_with, numbers
 * strictly) before the trace is opened, so usage errors (exit 2) are found
 * before input errors (exit 1).
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

/* ---- eval ---------------------------------------------------------------- */

static const char eval_usage[] =
    "usage: kvevict eval --trace SRC --policy SPEC [--budget B] [--json] [--normalize]\n"
    "                    [--per-head] [--seed N]\n"
    "\n"
    "Evaluates one policy on a trace and prints its retained mass, top-32 recall,\n"
    "minimum retained mass, ns/step of policy work and state bytes. Means are over\n"
    "the steps t > budget.\n"
    "\n"
    "  --trace SRC    canonical, canonical:key=value,... (seed, steps, ...) or a .npy\n"
    "                 file of shape [T,T], [H,T,T] or [L,H,T,T]\n"
    "  --policy SPEC  name[:key=value,...], e.g. h2o:recent_window=64\n"
    "  --budget B     evict down to B positions (default: the spec's budget)\n"
    "  --json         print one JSON object: policy, trace, budget, steps,\n"
    "                 scored_steps, heads, layers, seed, retained_mass, top32_recall,\n"
    "                 min_retained_mass, ns_per_step, state_bytes (and per_head)\n"
    "  --normalize    rescale each row of a .npy file to sum 1 instead of refusing\n"
    "  --per-head     also report every head (layer-major) of a multi-head file\n"
    "  --seed N       seed of the policies' random numbers (default 0)\n"
    "\n"
    "A multi-head file evaluates each head independently: retained mass, recall\n"
    "and ns/step are means over heads, min mass the minimum, state bytes the\n"
    "largest. Exit status: 0 ok, 1 bad input, 2 bad usage.\n";

enum { E_TRACE, E_POLICY, E_BUDGET, E_JSON, E_NORM, E_PERHEAD, E_SEED, E_N };
static const opt_def eval_defs[E_N] = {
    {"trace", 0, 1, 0},     {"policy", 0, 1, 0}, {"budget", 0, 1, 0}, {"json", 0, 0, 0},
    {"normalize", 0, 0, 0}, {"per-head", 0, 0, 0}, {"seed", 0, 1, 0},
};

static const char *need(const opt_val *v, const char *name)
{
    if (v->count == 0)
        die_usage("missing required option '--%s' (see kvevict %s --help)", name, cli_cmd);
    return v->v[0];
}

static size_t opt_budget(const opt_val *v)
{
    return v->count ? (size_t)parse_u64("--budget", v->v[0], 1, 16777216) : 0;
}

static uint64_t opt_seed(const opt_val *v)
{
    return v->count ? parse_u64("--seed", v->v[0], 0, UINT64_MAX) : 0;
}

static void json_result(FILE *f, const kve_eval_result *r)
{
    fprintf(f, "\"retained_mass\": ");
    json_double(f, r->retained_mass);
    fprintf(f, ", \"top32_recall\": ");
    json_double(f, r->top32_recall);
    fprintf(f, ", \"min_retained_mass\": ");
    json_double(f, r->min_retained_mass);
    fprintf(f, ", \"ns_per_step\": ");
    json_double(f, r->ns_per_step);
    fprintf(f, ", \"state_bytes\": %zu", r->state_bytes);
}

int cmd_eval(int argc, char **argv)
{
    opt_val v[E_N];
    size_t npos;
    args_parse(argc, argv, eval_usage, eval_defs, E_N, v, NULL, 0, &npos);
    const char *src = need(&v[E_TRACE], "trace");
    const char *pol = need(&v[E_POLICY], "policy");
    size_t budget = opt_budget(&v[E_BUDGET]);
    uint64_t seed = opt_seed(&v[E_SEED]);
    char *spec = canon_spec("--policy", pol, budget);
    kve_trace *tr = open_trace(src, v[E_NORM].count ? KVE_TRACE_NORMALIZE : 0u);

    evalset es;
    evalset_init(&es);
    size_t idx = evalset_index(&es, spec, 0);
    evalset_run(&es, tr, seed, v[E_PERHEAD].count > 0);
    const kve_eval_result *r = &es.res[idx];
    size_t heads = es.heads, layers = es.layers, per_layer = heads / (layers ? layers : 1);

    if (v[E_JSON].count) {
        printf("{\"policy\": ");
        json_string(stdout, r->spec);
        printf(", \"trace\": ");
        json_string(stdout, kve_trace_source(tr));
        printf(", \"budget\": %zu, \"steps\": %zu, \"scored_steps\": %zu, \"heads\": %zu, "
               "\"layers\": %zu, \"seed\": %llu, ",
               r->budget, r->steps, r->scored_steps, heads, layers, (unsigned long long)seed);
        json_result(stdout, r);
        if (v[E_PERHEAD].count) {
            printf(", \"per_head\": [");
            for (size_t h = 0; h < heads; h++) {
                printf("%s{\"layer\": %zu, \"head\": %zu, ", h ? ", " : "", h / per_layer,
                       h % per_layer);
                json_result(stdout, &es.per_head[h * es.n + idx]);
                printf("}");
            }
            printf("]");
        }
        printf("}\n");
    } else {
        printf("policy             %s\n", r->spec);
        printf("trace              %s\n", kve_trace_source(tr));
        printf("budget             %zu\n", r->budget);
        printf("steps              %zu (%zu scored: t > budget)\n", r->steps, r->scored_steps);
        printf("heads              %zu (layers: %zu)\n", heads, layers);
        printf("retained mass      %.6f\n", r->retained_mass);
        printf("top-32 recall      %.6f\n", r->top32_recall);
        printf("min retained mass  %.6f\n", r->min_retained_mass);
        printf("ns/step            %.1f\n", r->ns_per_step);
        printf("state bytes        %zu\n", r->state_bytes);
        if (v[E_PERHEAD].count) {
            static const char *const head[] = {"layer", "head", "retained mass",
                                               "top-32 recall", "min mass", "ns/step",
                                               "state bytes"};
            table t;
            table_init(&t, 7, head, NULL, 0);
            for (size_t h = 0; h < heads; h++) {
                const kve_eval_result *q = &es.per_head[h * es.n + idx];
                table_add(&t, "%zu", h / per_layer);
                table_add(&t, "%zu", h % per_layer);
                table_add(&t, "%.6f", q->retained_mass);
                table_add(&t, "%.6f", q->top32_recall);
                table_add(&t, "%.6f", q->min_retained_mass);
                table_add(&t, "%.1f", q->ns_per_step);
                table_add(&t, "%zu", q->state_bytes);
            }
            printf("\n");
            table_print(&t, stdout, FMT_TEXT);
            table_free(&t);
        }
    }
    evalset_free(&es);
    kve_trace_free(tr);
    free(spec);
    finish_stdout();
    return 0;
}

/* ---- replay -------------------------------------------------------------- */

static const char replay_usage[] =
    "usage: kvevict replay --trace SRC --policy SPEC [--budget B] [--head N] [--normalize]\n"
    "                      [--seed N]\n"
    "\n"
    "Runs one policy over a trace and prints one JSON object per step, in step order:\n"
    "  {\"pos\": t, \"victims\": [ascending positions evicted after step t], \"size\": n}\n"
    "where size is the number of kept positions after the eviction.\n"
    "\n"
    "  --trace SRC    canonical, canonical:key=value,... or a .npy file\n"
    "  --policy SPEC  name[:key=value,...]\n"
    "  --budget B     evict down to B positions (default: the spec's budget)\n"
    "  --head N       head of a multi-head file, layer-major (default 0)\n"
    "  --normalize    rescale each row of a .npy file to sum 1 instead of refusing\n"
    "  --seed N       seed of the policy's random numbers (default 0)\n";

enum { R_TRACE, R_POLICY, R_BUDGET, R_HEAD, R_NORM, R_SEED, R_N };
static const opt_def replay_defs[R_N] = {
    {"trace", 0, 1, 0}, {"policy", 0, 1, 0},    {"budget", 0, 1, 0},
    {"head", 0, 1, 0},  {"normalize", 0, 0, 0}, {"seed", 0, 1, 0},
};

/* Exits with bad usage (releasing tr and also_free first, so leak checkers
 * stay quiet) when --head is not a head of the trace. */
static void check_head(size_t head, kve_trace *tr, void *also_free)
{
    size_t nh = kve_trace_heads(tr);
    if (head < nh)
        return;
    kve_trace_free(tr);
    free(also_free);
    die_usage("--head: %zu is out of range: the trace has %zu head%s", head, nh,
              nh == 1 ? "" : "s");
}

typedef struct replay_ctx {
    size_t size;
    progress pr;
} replay_ctx;

static int replay_step(void *user, size_t job, int32_t pos, const int32_t *victims, size_t n)
{
    replay_ctx *c = user;
    (void)job;
    c->size = c->size + 1 - n;
    printf("{\"pos\": %ld, \"victims\": [", (long)pos);
    for (size_t i = 0; i < n; i++)
        printf(i ? ", %ld" : "%ld", (long)victims[i]);
    printf("], \"size\": %zu}\n", c->size);
    progress_tick(&c->pr, pos);
    return ferror(stdout) ? 1 : 0;
}

int cmd_replay(int argc, char **argv)
{
    opt_val v[R_N];
    size_t npos;
    args_parse(argc, argv, replay_usage, replay_defs, R_N, v, NULL, 0, &npos);
    const char *src = need(&v[R_TRACE], "trace");
    const char *pol = need(&v[R_POLICY], "policy");
    size_t budget = opt_budget(&v[R_BUDGET]);
    uint64_t seed = opt_seed(&v[R_SEED]);
    size_t head = v[R_HEAD].count ? (size_t)parse_u64("--head", v[R_HEAD].v[0], 0, SIZE_MAX) : 0;
    char *spec = canon_spec("--policy", pol, budget);
    kve_trace *tr = open_trace(src, v[R_NORM].count ? KVE_TRACE_NORMALIZE : 0u);
    check_head(head, tr, spec);
    kve_eval_job job = {spec, 0};
    kve_eval_result res;
    replay_ctx ctx = {0, {0}};
    progress_begin(&ctx.pr, kve_trace_steps(tr), 0, 1);
    kve_status s = kve_eval(tr, head, &job, 1, seed, replay_step, &ctx, &res);
    progress_end(&ctx.pr);
    kve_trace_free(tr);
    free(spec);
    if (s != KVE_OK)
        die_status(s, "replay");
    finish_stdout();
    return 0;
}

/* ---- trace --------------------------------------------------------------- */

static const char trace_usage[] =
    "usage: kvevict trace --trace SRC -o FILE.npy [--head N] [--normalize]\n"
    "\n"
    "Writes one head of a trace as a [T,T] float32 C-order .npy file (zeros above\n"
    "the diagonal) that eval, replay and sweep read back to the same results\n"
    "(up to float32 rounding of the weights). The file is written under a\n"
    "temporary name and renamed into place: a failure leaves no partial file.\n"
    "\n"
    "  --trace SRC        canonical, canonical:key=value,... or a .npy file\n"
    "  -o, --output FILE  the .npy file to write\n"
    "  --head N           head of a multi-head file, layer-major (default 0)\n"
    "  --normalize        rescale each row of a .npy file to sum 1 instead of refusing\n";

enum { T_TRACE, T_OUT, T_HEAD, T_NORM, T_N };
static const opt_def trace_defs[T_N] = {
    {"trace", 0, 1, 0}, {"output", 'o', 1, 0}, {"head", 0, 1, 0}, {"normalize", 0, 0, 0}};

int cmd_trace(int argc, char **argv)
{
    opt_val v[T_N];
    size_t npos;
    args_parse(argc, argv, trace_usage, trace_defs, T_N, v, NULL, 0, &npos);
    const char *src = need(&v[T_TRACE], "trace");
    const char *out = need(&v[T_OUT], "output");
    size_t head = v[T_HEAD].count ? (size_t)parse_u64("--head", v[T_HEAD].v[0], 0, SIZE_MAX) : 0;
    kve_trace *tr = open_trace(src, v[T_NORM].count ? KVE_TRACE_NORMALIZE : 0u);
    check_head(head, tr, NULL);
    kve_status s = kve_trace_write_npy(tr, head, out);
    kve_trace_free(tr);
    if (s != KVE_OK)
        die_input("%s: %s (%s)", out, kve_last_error(), kve_status_name(s));
    return 0;
}

/* ---- the sweep grid ---------------------------------------------------- */

size_t grid_points(const grid *g)
{
    size_t n = g->n_budgets ? g->n_budgets : 1;
    for (size_t k = 0; k < g->n_keys; k++)
        n *= g->n_vals[k];
    return n;
}

size_t grid_val(const grid *g, size_t i, size_t k)
{
    size_t stride = 1;
    for (size_t j = g->n_keys; j-- > k + 1;)
        stride *= g->n_vals[j];
    return (i / stride) % g->n_vals[k];
}

char *grid_spec(const grid *g, size_t i, size_t *budget)
{
    size_t per_budget = grid_points(g) / (g->n_budgets ? g->n_budgets : 1);
    *budget = g->n_budgets ? g->budgets[i / per_budget] : 0;
    char cur[512], next[512];
    size_t len = strlen(g->base);
    if (len >= sizeof cur)
        die_usage("--policy: spec is too long");
    memcpy(cur, g->base, len + 1);
    for (size_t k = 0; k < g->n_keys; k++) {
        const char *val = g->vals[k][grid_val(g, i, k)];
        kve_status s = kve_spec_with(cur, g->key[k], val, next, sizeof next);
        if (s != KVE_OK)
            die_usage("--param %s=%s: %s", g->key[k], val, kve_last_error());
        memcpy(cur, next, sizeof cur); /* kve_spec_with NUL-terminated it */
    }
    return canon_spec("--budget", cur, *budget);
}

void render_grid(FILE *f, evalset *es, const grid *g, tfmt fmt)
{
    const char *head[TABLE_MAXCOLS], *csv[TABLE_MAXCOLS];
    size_t nc = 0;
    for (size_t k = 0; k < g->n_keys; k++, nc++)
        head[nc] = csv[nc] = g->key[k];
    static const char *const h2[] = {"budget",   "retained mass", "top-32 recall", "min mass",
                                     "ns/step",  "state bytes",   "policy spec"};
    static const char *const c2[] = {"budget",      "retained_mass", "top32_recall",
                                     "min_retained_mass", "ns_per_step", "state_bytes",
                                     "policy"};
    for (size_t j = 0; j < 7; j++, nc++) {
        head[nc] = h2[j];
        csv[nc] = c2[j];
    }
    table t;
    table_init(&t, nc, head, csv, 1u << (nc - 1));
    size_t n = grid_points(g);
    for (size_t i = 0; i < n; i++) {
        size_t budget;
        char *spec = grid_spec(g, i, &budget);
        const kve_eval_result *r = evalset_get(es, spec, 0);
        for (size_t k = 0; k < g->n_keys; k++)
            table_add(&t, "%s", g->vals[k][grid_val(g, i, k)]);
        table_add(&t, "%zu", r->budget);
        table_add(&t, fmt == FMT_CSV ? "%.9f" : "%.4f", r->retained_mass);
        table_add(&t, fmt == FMT_CSV ? "%.9f" : "%.4f", r->top32_recall);
        table_add(&t, fmt == FMT_CSV ? "%.9f" : "%.4f", r->min_retained_mass);
        table_add(&t, "%.1f", r->ns_per_step);
        table_add(&t, "%zu", r->state_bytes);
        table_add(&t, fmt == FMT_MD ? "`%s`" : "%s", r->spec);
        free(spec);
    }
    table_print(&t, f, fmt);
    table_free(&t);
}

/* ---- sweep --------------------------------------------------------------- */

static const char sweep_usage[] =
    "usage: kvevict sweep --trace SRC --policy SPEC [--param KEY=V1,V2,...]...\n"
    "                     [--budget B1,B2,...] [--csv | --json] [--normalize] [--seed N]\n"
    "\n"
    "Evaluates a grid of policies in one lockstep pass over the trace: every\n"
    "combination of the --param values (up to 8 --param options; the last varies\n"
    "fastest) at every budget (budgets outermost). One row per grid point.\n"
    "\n"
    "  --trace SRC           canonical, canonical:key=value,... or a .npy file\n"
    "  --policy SPEC         the base spec; each point sets its keys with kve_spec_with\n"
    "  --param KEY=V1,...    a parameter of the policy and its values\n"
    "  --budget B1,...       budgets (default: the spec's); not with --param budget=...\n"
    "  --csv                 comma-separated, with a header row\n"
    "  --json                JSON Lines: one object per grid point, with the keys of\n"
    "                        eval --json plus \"params\": {KEY: \"VALUE\", ...}\n"
    "  --normalize           rescale each row of a .npy file to sum 1 instead of refusing\n"
    "  --seed N              seed of the policies' random numbers (default 0)\n"
    "\n"
    "Default output is an aligned table. Multi-head files report means over heads\n"
    "as eval does.\n";

enum { S_TRACE, S_POLICY, S_PARAM, S_BUDGET, S_CSV, S_JSON, S_NORM, S_SEED, S_N };
static const opt_def sweep_defs[S_N] = {
    {"trace", 0, 1, 0}, {"policy", 0, 1, 0}, {"param", 0, 1, 1},     {"budget", 0, 1, 0},
    {"csv", 0, 0, 0},   {"json", 0, 0, 0},   {"normalize", 0, 0, 0}, {"seed", 0, 1, 0},
};

int cmd_sweep(int argc, char **argv)
{
    opt_val v[S_N];
    size_t npos;
    args_parse(argc, argv, sweep_usage, sweep_defs, S_N, v, NULL, 0, &npos);
    const char *src = need(&v[S_TRACE], "trace");
    const char *pol = need(&v[S_POLICY], "policy");
    uint64_t seed = opt_seed(&v[S_SEED]);
    if (v[S_CSV].count && v[S_JSON].count)
        die_usage("--csv and --json contradict each other");
    grid g;
    memset(&g, 0, sizeof g);
    g.base = pol;
    char *keybuf[OPT_MAXREP] = {0};
    for (int p = 0; p < v[S_PARAM].count; p++) {
        const char *a = v[S_PARAM].v[p];
        const char *eq = strchr(a, '=');
        if (!eq || eq == a || eq[1] == '\0')
            die_usage("--param: '%s' is not KEY=V1,V2,...", a);
        size_t len = (size_t)(eq - a);
        keybuf[p] = xmalloc(len + 1);
        memcpy(keybuf[p], a, len);
        keybuf[p][len] = '\0';
        for (size_t k = 0; k < g.n_keys; k++)
            if (strcmp(g.key[k], keybuf[p]) == 0)
                die_usage("--param: key '%s' given more than once", keybuf[p]);
        if (strcmp(keybuf[p], "budget") == 0 && v[S_BUDGET].count)
            die_usage("--param budget=... and --budget contradict each other");
        g.key[g.n_keys] = keybuf[p];
        g.vals[g.n_keys] = split_list("--param", eq + 1, &g.n_vals[g.n_keys]);
        g.n_keys++;
    }
    if (v[S_BUDGET].count) {
        char **items = split_list("--budget", v[S_BUDGET].v[0], &g.n_budgets);
        g.budgets = xcalloc(g.n_budgets, sizeof *g.budgets);
        for (size_t i = 0; i < g.n_budgets; i++)
            g.budgets[i] = (size_t)parse_u64("--budget", items[i], 1, 16777216);
        free_list(items, g.n_budgets);
    }
    size_t n = grid_points(&g);
    if (n > 4096)
        die_usage("the grid has %zu points; at most 4096", n);
    evalset es;
    evalset_init(&es);
    render_grid(NULL, &es, &g, FMT_TEXT); /* validates every point, collects */
    kve_trace *tr = open_trace(src, v[S_NORM].count ? KVE_TRACE_NORMALIZE : 0u);
    evalset_run(&es, tr, seed, 0);
    if (v[S_JSON].count) {
        for (size_t i = 0; i < n; i++) {
            size_t budget;
            char *spec = grid_spec(&g, i, &budget);
            const kve_eval_result *r = evalset_get(&es, spec, 0);
            printf("{\"policy\": ");
            json_string(stdout, r->spec);
            printf(", \"trace\": ");
            json_string(stdout, kve_trace_source(tr));
            printf(", \"budget\": %zu, \"steps\": %zu, \"scored_steps\": %zu, \"heads\": %zu, "
                   "\"seed\": %llu, \"params\": {",
                   r->budget, r->steps, r->scored_steps, es.heads, (unsigned long long)seed);
            for (size_t k = 0; k < g.n_keys; k++) {
                printf(k ? ", " : "");
                json_string(stdout, g.key[k]);
                printf(": ");
                json_string(stdout, g.vals[k][grid_val(&g, i, k)]);
            }
            printf("}, ");
            json_result(stdout, r);
            printf("}\n");
            free(spec);
        }
    } else {
        render_grid(stdout, &es, &g, v[S_CSV].count ? FMT_CSV : FMT_TEXT);
    }
    evalset_free(&es);
    kve_trace_free(tr);
    for (size_t k = 0; k < g.n_keys; k++) {
        free(keybuf[k]);
        free_list(g.vals[k], g.n_vals[k]);
    }
    free(g.budgets);
    finish_stdout();
    return 0;
}
