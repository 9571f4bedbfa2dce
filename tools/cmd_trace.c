/* SPDX-License-Identifier: MIT */
/*
 * cmd_trace.c - `kvevict trace`: one head of a trace as a [T,T] float32
 * .npy file, or with --stats what every head of a trace looks like
 * (stats.c).
 *
 * The file is written under a temporary name beside it (out_open) and
 * renamed into place when complete; an error or SIGINT/SIGTERM/SIGHUP
 * removes the temporary file, so no partial file is ever left. A file of
 * LARGE_FILE bytes or more is announced (size, on stderr) before writing,
 * and refused when its file system has less room than that.
 */
#define _POSIX_C_SOURCE 200809L
#include "calibrate.h"
#include "cli.h"

#include <errno.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define LARGE_FILE (100ull << 20)

static const char trace_usage[] =
    "usage: kvevict trace --trace SRC -o FILE.npy [--head N] [--normalize]\n"
    "       kvevict trace --stats --trace SRC [--head N] [--block B] [--normalize]\n"
    "                     [--format text|md|csv|json | --json | --csv | --md] [-o FILE]\n"
    "       kvevict trace --calibrate ...   (the canonical trace's calibration:\n"
    "                     kvevict trace --calibrate --help)\n"
    "\n"
    "Writes one head of a trace as a [T,T] float32 C-order .npy file (zeros above\n"
    "the diagonal, 4*T*T bytes plus a 128-byte header) that eval, replay and sweep\n"
    "read back to the same results (up to float32 rounding of the weights). The\n"
    "file is written under a temporary name and renamed into place: a failure or\n"
    "an interrupt (SIGINT, SIGTERM) leaves no file at all. Files of 100 MiB or more\n"
    "are announced on stderr first, and refused when the disk has less room.\n"
    "\n"
    "With --stats, prints instead what the attention of every head (or --head N)\n"
    "looks like (docs/trace.md, \"Realism, measured\"): the mean mass on the first\n"
    "4 positions, on the 64 before the query and on the query's own key (rows\n"
    "t >= 68); the mean share of a row's 32 most-attended earlier positions still\n"
    "among the next row's (top-32 persistence); and, cutting the rows into blocks of\n"
    "B, the mass per row of each block's 32 most-attended positions (summed over the\n"
    "block) in that block and in the next one.\n"
    "\n"
    "  --trace SRC        canonical, canonical:key=value,..., a .npy file, qk:FILE,\n"
    "                     or -\n"
    "  -o, --output FILE  the .npy file to write (the stats' output with --stats;\n"
    "                     default standard output); - is standard output\n"
    "  --head N           head of a multi-head file, layer-major (default 0; with\n"
    "                     --stats, every head)\n"
    "  --stats            print the statistics instead of writing a file\n"
    "  --block B          rows per block of the block statistics (default 512)\n"
    "  --format F         text (default), md, csv or json (with --stats)\n"
    "  --normalize        rescale each row of a .npy file to sum 1 instead of refusing\n"
    "  --quiet            no progress line on stderr (drawn on a terminal after 2 s)\n";

static const opt_def trace_own[] = {{"stats", 0, 0}, {"block", 0, OPT_VALUE}};
static const cli_spec trace_spec = {
    .usage = trace_usage,
    .shared = SO_TRACE | SO_OUTPUT | SO_HEAD | SO_NORMALIZE | SO_FORMAT | SO_QUIET,
    .required = SO_TRACE,
    CLI_OWN(trace_own),
    .default_format = FMT_TEXT,
};

/* --stats: the statistics of every head, or of --head N. */
static int trace_stats_cmd(const cli_args *a, int head_given)
{
    const opt_val *b = cli_own(a, &trace_spec, "block");
    size_t block = b->count ? (size_t)parse_u64("--block", b->v[0], 1, KVE_MAX_BUDGET)
                            : STATS_BLOCK;
    kve_trace *tr = open_trace(a);
    size_t nh = kve_trace_heads(tr);
    if (a->head >= nh) {
        kve_trace_free(tr);
        die_usage("--head: %zu is out of range: the trace has %zu head%s", a->head, nh,
                  nh == 1 ? "" : "s");
    }
    FILE *out = out_open(a->output);
    render_trace_stats(out, tr, a->head, !head_given, block, a->format);
    kve_trace_free(tr);
    out_close(out);
    return 0;
}

static void human_size(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)bytes;
    size_t u = 0;
    while (x >= 1024.0 && u + 1 < sizeof unit / sizeof unit[0]) {
        x /= 1024.0;
        u++;
    }
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", x, unit[u]);
}

int cmd_trace(int argc, char **argv)
{
    if (calibrate_requested(argc, argv)) /* calibrate.c: the canonical trace's calibration */
        return cmd_trace_calibrate(argc, argv);
    cli_args a;
    cli_parse(&a, &trace_spec, argc, argv);
    if (cli_own(&a, &trace_spec, "stats")->count)
        return trace_stats_cmd(&a, a.head_given);
    if (cli_own(&a, &trace_spec, "block")->count)
        die_usage("--block applies to --stats only");
    if (a.format != FMT_TEXT)
        die_usage("--format applies to --stats only: the file written is a .npy");
    if (!a.output)
        die_usage("missing required option '--output' (see kvevict trace --help)");
    int to_stdout = strcmp(a.output, "-") == 0;
    if (to_stdout && isatty(STDOUT_FILENO))
        die_usage("-o -: standard output is a terminal; redirect it to a file or a pipe");
    kve_trace *tr = open_trace(&a);
    size_t nh = kve_trace_heads(tr);
    if (a.head >= nh) {
        kve_trace_free(tr);
        die_usage("--head: %zu is out of range: the trace has %zu head%s", a.head, nh,
                  nh == 1 ? "" : "s");
    }
    uint64_t bytes = kve_trace_npy_bytes(tr);
    char size[32];
    human_size(bytes, size, sizeof size);
    if (bytes >= LARGE_FILE) {
        struct statvfs fs;
        char dir[4096];
        path_dir(a.output, dir, sizeof dir);
        if (!to_stdout && statvfs(dir, &fs) == 0) {
            uint64_t room = (uint64_t)fs.f_bavail * fs.f_frsize;
            if (room < bytes) {
                char have[32];
                human_size(room, have, sizeof have);
                kve_trace_free(tr);
                die_input("%s: the file needs %llu bytes (%s) and %s has %s free", a.output,
                          (unsigned long long)bytes, size, dir, have);
            }
        }
        fprintf(stderr, "kvevict trace: writing %s: %llu bytes (%s)\n",
                to_stdout ? "standard output" : a.output, (unsigned long long)bytes, size);
    }
    FILE *out = out_open(a.output);
    progress pr;
    progress_begin(&pr, "row", kve_trace_steps(tr), 0, 1);
    kve_status s = kve_trace_write_npy_file(tr, a.head, out, progress_callback, &pr);
    progress_end(&pr);
    kve_trace_free(tr);
    if (s != KVE_OK)
        die_status(s, to_stdout ? "standard output" : a.output);
    out_close(out);
    return 0;
}
