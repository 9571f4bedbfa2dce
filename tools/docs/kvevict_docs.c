/* SPDX-License-Identifier: MIT */
/*
 * kvevict_docs.c - kvevict-docs, the documentation build tool of a kvevict
 * checkout: the measured blocks of the docs pages (docs), the figures of
 * docs/img/ (plot), and the measured section of docs/performance.md (perf
 * with --docs/--plot). make builds it beside kvevict; it is never installed,
 * and the user's kvevict runs it for those commands (source_tree.c), so
 * every message reads as kvevict's. It is built on the same pieces as
 * kvevict (cli.h) and held to the same gates (scripts/ci-gates.sh).
 */
#include "docs.h"
#include "perf.h"

#include <string.h>

static const char docs_tool_usage[] =
    "usage: " DOCS_TOOL " COMMAND [OPTIONS]\n"
    "\n"
    "The documentation build tool of a kvevict checkout (kvevict " KVEVICT_VERSION_STRING
    "): make\n"
    "builds it beside kvevict and it is never installed; `kvevict docs`, `kvevict\n"
    "plot` and `kvevict perf --docs/--plot` run it.\n"
    "\n"
    "Commands:\n"
    "  docs      regenerate (or --check) the measured blocks of markdown files\n"
    "  plot      render the figures of docs/img/ with gnuplot\n"
    "  perf      `kvevict perf`, with --docs FILE and --plot DIR\n"
    "\n"
    "Run `" DOCS_TOOL " COMMAND --help` for a command's options.\n";

static int perf_docs(int argc, char **argv)
{
    return perf_main(argc, argv, &perf_docs_renderers);
}

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {{"docs", cmd_docs}, {"plot", cmd_plot}, {"perf", perf_docs}};

int main(int argc, char **argv)
{
    cli_argv0 = argv[0];
    cli_signals_install();
    if (argc < 2)
        die_usage("missing command (see " DOCS_TOOL " --help)");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(docs_tool_usage, stdout);
        finish_stdout();
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) {
            cli_cmd = commands[i].name;
            return commands[i].run(argc - 2, argv + 2);
        }
    die_usage("unknown command '%s' (see " DOCS_TOOL " --help)", argv[1]);
}
