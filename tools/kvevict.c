/* SPDX-License-Identifier: MIT */
/*
 * kvevict.c - the kvevict command-line tool: dispatch to the subcommands,
 * and the small `policies` listing. Uses only the public header. See cli.h
 * for the conventions every subcommand follows, docs/cli.md for the user's
 * version. The source-tree commands (docs, plot) are the documentation
 * tool's (tools/docs/), run from beside this program (source_tree.c).
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
    "  bench     every policy at budgets 256 and 512 (or --budget B1,...) on the\n"
    "            canonical trace or yours, the H2O recent-window sweep, and the\n"
    "            claims of the H2O page (docs/policies/h2o.md) checked (--seeds N:\n"
    "            the claims on N seeds of the canonical trace), then every policy\n"
    "            on the committed model's attention (from a checkout)\n"
    "  eval      one policy on a trace: retained mass, top-K recall, cost\n"
    "  replay    one policy on a trace, its victims step by step\n"
    "  sweep     a grid of parameter values and budgets, one row per point\n"
    "            (sweep and bench --shard I/N: one shard of the grid)\n"
    "  merge     the shards of a sharded sweep or bench, combined into what\n"
    "            the unsharded run prints\n"
    "  trace     write a trace as a [T,T] float32 .npy file, or (--stats) measure\n"
    "            its sinks, recency and persistence per head\n"
    "  perf      per-step cost of every policy and of banks against the memory\n"
    "            floor, at budgets 256 to 256Ki (under a minute)\n"
    "  policies  list the registered policies\n"
    "  lm        a llama2.c model whose KV cache the policies manage: logits,\n"
    "            eval (bits per byte), passkey and repeat (recall), stream (loss\n"
    "            over a long decode), dump (attention)\n"
    "  generate  stream text from a llama2.c model with a bounded cache\n"
    "  help      this text, or `kvevict help COMMAND`\n"
    "  --version the version\n"
    "\n"
    "Source-tree commands (they maintain the docs of a kvevict checkout; " DOCS_TOOL ",\n"
    "built there beside kvevict and not installed, runs them):\n"
    "  docs      regenerate (or --check) the measured blocks of markdown files\n"
    "  plot      render the figures of docs/img/ with gnuplot (--real-model DIR:\n"
    "            those of docs/real-model.md)\n"
    "\n"
    "Traces (SRC): canonical, canonical:key=value,... (version, seed, steps, ...\n"
    "see docs/trace.md; version=1 is the first version), a .npy file of shape\n"
    "[T,T], [H,T,T] or [L,H,T,T], qk:FILE (a model's queries and keys, the rows\n"
    "computed on demand; the policies that read keys need one), - for a .npy on\n"
    "standard input, or lm:model=CKPT,text=FILE[,steps=T,window=W,heads=kv|query,\n"
    "tokenizer=TOK] for a llama2.c model's attention. Policies (SPEC):\n"
    "name[:key=value,...], e.g.\n"
    "h2o:budget=256,recent_window=64.\n"
    "Output: --format text|md|csv|json (--json, --csv, --md), -o FILE (- for\n"
    "standard output); JSON is one object per line. Run `kvevict COMMAND --help`\n"
    "for a command's options. Exit status: 0 ok, 1 bad input (unreadable or\n"
    "malformed data, I/O errors), 2 bad usage.\n";

static const char policies_usage[] =
    "usage: kvevict policies [--format text|md|csv|json | --json | --csv | --md] [-o FILE]\n"
    "\n"
    "Lists the registered policies, each with its canonical default spec, what it\n"
    "reads at each step (attention, keys or nothing) and a one-line summary, in the\n"
    "order every table uses. The policies that read keys run on traces with keys\n"
    "(qk:PATH). JSON keys: name, policy (the default spec), reads, summary.\n";

static const cli_spec policies_spec = {
    .usage = policies_usage,
    .shared = SO_FORMAT | SO_OUTPUT,
    .default_format = FMT_TEXT,
};

int cmd_policies(int argc, char **argv)
{
    cli_args a;
    cli_parse(&a, &policies_spec, argc, argv);
    static const col cols[] = {
        {"name", "name", COL_ALL | COL_LEFT | COL_CODE},
        {"default spec", KEY_POLICY, COL_ALL | COL_LEFT | COL_CODE},
        {"reads", "reads", COL_ALL | COL_LEFT},
        {"summary", "summary", COL_ALL | COL_LEFT},
    };
    FILE *out = out_open(a.output);
    table t;
    table_init(&t, cols, 4);
    for (size_t i = 0; i < kve_policy_type_count(); i++) {
        char *spec = canon_spec("policy", kve_policy_type_name(i), 0);
        unsigned reads = kve_policy_type_reads(i);
        table_str(&t, kve_policy_type_name(i));
        table_str(&t, spec);
        table_str(&t, reads_label(reads));
        table_str(&t, kve_policy_type_summary(i));
        free(spec);
    }
    table_print(&t, out, a.format);
    table_free(&t);
    out_close(out);
    return 0;
}

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv); /* NULL: a source-tree command (DOCS_TOOL's) */
} command;

/* One line per subcommand; the order is not significant. */
static const command commands[] = {
    {"bench", cmd_bench}, {"eval", cmd_eval},         {"replay", cmd_replay},
    {"trace", cmd_trace}, {"sweep", cmd_sweep},       {"policies", cmd_policies},
    {"docs", NULL},       {"plot", NULL},             {"lm", cmd_lm},
    {"generate", cmd_generate}, {"perf", cmd_perf},     {"merge", cmd_merge},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static const command *find(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

/* Runs command c on argv[0 .. argc). */
static int run(const command *c, int argc, char **argv)
{
    cli_cmd = c->name;
    return c->run ? c->run(argc, argv) : source_tree_run(c->name, argc, argv);
}

int main(int argc, char **argv)
{
    cli_argv0 = argv[0];
    cli_signals_install();
    if (argc < 2)
        die_usage("missing command (see kvevict --help)");
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        if (strcmp(name, "help") == 0 && argc > 2) {
            const command *c = find(argv[2]);
            if (!c)
                die_usage("help: unknown command '%s'", argv[2]);
            char help[] = "--help";
            char *args[] = {help, NULL};
            return run(c, 1, args);
        }
        fputs(main_usage, stdout);
        finish_stdout();
        return 0;
    }
    if (strcmp(name, "--version") == 0) {
        /* The header this tool was compiled with and the library it runs on. */
        if (strcmp(kve_version(), KVEVICT_VERSION_STRING) == 0)
            printf("kvevict %s\n", kve_version());
        else
            printf("kvevict %s (library %s)\n", KVEVICT_VERSION_STRING, kve_version());
        finish_stdout();
        return 0;
    }
    const command *c = find(name);
    if (!c)
        die_usage("unknown command '%s' (see kvevict --help)", name);
    return run(c, argc - 2, argv + 2);
}
