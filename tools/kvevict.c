/*
 * kvevict.c - the kvevict command-line tool: dispatch to the subcommands.
 * Uses only the public header (include/kvevict.h). See cli.h for the exit
 * codes and the one-line error convention.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char main_usage[] =
    "usage: kvevict COMMAND [OPTIONS]\n"
    "\n"
    "KV-cache eviction policies measured on attention traces (kvevict " KVEVICT_VERSION_STRING
    ").\n"
    "\n"
    "Commands:\n"
    "  bench    every policy on the canonical trace at budgets 256 and 512, the H2O\n"
    "           recent-window sweep and the H2O page's observations checked\n"
    "  eval     one policy on a trace: retained mass, top-32 recall, cost\n"
    "  replay   one policy on a trace, its victims step by step (JSON Lines)\n"
    "  trace    write a trace as a [T,T] float32 .npy file\n"
    "  sweep    a grid of parameter values and budgets, one row per point\n"
    "  plot     render the figures of docs/img/ with gnuplot\n"
    "  docs     regenerate (or --check) the measured blocks of markdown files\n"
    "  policies list the registered policies\n"
    "  help     this text, or `kvevict help COMMAND`\n"
    "  --version  the version\n"
    "\n"
    "Traces (SRC): canonical, canonical:key=value,... (seed, steps, ... see\n"
    "docs/trace.md) or a .npy file of shape [T,T], [H,T,T] or [L,H,T,T].\n"
    "Policies (SPEC): name[:key=value,...], e.g. h2o:budget=256,recent_window=64.\n"
    "Run `kvevict COMMAND --help` for a command's options. Exit status: 0 ok,\n"
    "1 bad input (unreadable or malformed data), 2 bad usage.\n";

static const char policies_usage[] =
    "usage: kvevict policies\n"
    "\n"
    "Lists the registered policies, each with its canonical default spec and a\n"
    "one-line summary, in the order every table uses.\n";

static int cmd_policies(int argc, char **argv)
{
    opt_val v[1];
    size_t npos;
    static const opt_def none[1] = {{"", 0, 0, 0}};
    args_parse(argc, argv, policies_usage, none, 0, v, NULL, 0, &npos);
    static const char *const head[] = {"name", "default spec", "summary"};
    table t;
    table_init(&t, 3, head, NULL, 7u);
    for (size_t i = 0; i < kve_policy_type_count(); i++) {
        char *spec = canon_spec("policy", kve_policy_type_name(i), 0);
        table_add(&t, "%s", kve_policy_type_name(i));
        table_add(&t, "%s", spec);
        table_add(&t, "%s", kve_policy_type_summary(i));
        free(spec);
    }
    table_print(&t, stdout, FMT_TEXT);
    table_free(&t);
    finish_stdout();
    return 0;
}

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"bench", cmd_bench}, {"eval", cmd_eval},   {"replay", cmd_replay},
    {"trace", cmd_trace}, {"sweep", cmd_sweep}, {"plot", cmd_plot},
    {"docs", cmd_docs},   {"policies", cmd_policies},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static const command *find(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        die_usage("missing command (see kvevict --help)");
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        if (strcmp(name, "help") == 0 && argc > 2) {
            const command *c = find(argv[2]);
            if (!c)
                die_usage("help: unknown command '%s'", argv[2]);
            cli_cmd = c->name;
            char help[] = "--help";
            char *args[] = {help, NULL};
            return c->run(1, args);
        }
        fputs(main_usage, stdout);
        finish_stdout();
        return 0;
    }
    if (strcmp(name, "--version") == 0) {
        printf("kvevict %s\n", KVEVICT_VERSION_STRING);
        finish_stdout();
        return 0;
    }
    const command *c = find(name);
    if (!c)
        die_usage("unknown command '%s' (see kvevict --help)", name);
    cli_cmd = c->name;
    return c->run(argc - 2, argv + 2);
}
