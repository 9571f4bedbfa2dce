/* SPDX-License-Identifier: MIT */
/*
 * source_tree.c - the source-tree commands of the user's kvevict (docs,
 * plot, perf --docs/--plot) are the documentation tool's, kvevict-docs
 * (tools/docs/), which make builds beside kvevict in a checkout's build tree
 * and which is never installed. kvevict runs the kvevict-docs found beside
 * its own executable with the command line unchanged (as git runs its
 * helpers), so those commands behave exactly as kvevict-docs's; without one
 * (an installed kvevict) it says where they live.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

const char *cli_argv0;

/* The directory of the running executable in buf[0 .. cap); 0, or -1. */
static int self_dir(char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    if (n > 0)
        buf[n] = '\0';
    else if (cli_argv0 && strchr(cli_argv0, '/') && strlen(cli_argv0) < cap)
        memcpy(buf, cli_argv0, strlen(cli_argv0) + 1);
    else
        return -1;
    char *slash = strrchr(buf, '/');
    if (!slash)
        return -1;
    slash[slash == buf ? 1 : 0] = '\0';
    return 0;
}

int source_tree_run(const char *cmd, int argc, char **argv)
{
    char path[PATH_MAX];
    static const char tool[] = "/" DOCS_TOOL;
    int found = self_dir(path, sizeof path - sizeof tool) == 0;
    if (found) {
        memcpy(path + strlen(path), tool, sizeof tool);
        found = access(path, X_OK) == 0;
    }
    if (!found)
        die_usage("%s: " DOCS_TOOL " runs %s, built beside kvevict in a kvevict checkout "
                  "(make: build/" DOCS_TOOL ") and never installed; this kvevict has none "
                  "beside it",
                  strcmp(cmd, "perf") == 0 ? "--docs and --plot are source-tree options"
                                           : "a source-tree command",
                  strcmp(cmd, "perf") == 0 ? "them" : "it");
    char **args = xcalloc((size_t)argc + 3, sizeof *args);
    args[0] = path;
    args[1] = xstrdup(cmd);
    for (int i = 0; i < argc; i++)
        args[i + 2] = argv[i];
    fflush(NULL);
    execv(path, args);
    die_input("%s: cannot run it: %s", path, strerror(errno));
}
