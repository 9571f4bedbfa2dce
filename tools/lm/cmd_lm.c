/* SPDX-License-Identifier: MIT */
/*
 * cmd_lm.c - `kvevict lm COMMAND`: the llama2.c decoder on the command line
 * (lm/lm.h, one kvevict policy per (layer, KV head)), one line per command
 * in the table below; the commands are one file per family in this folder
 * (generate.c: logits; loss.c: eval, stream; recall.c: passkey, repeat;
 * dump.c; prefill.c; leaderboard.c), on what measure.c shares. `kvevict generate` is
 * generate.c's too, and `kvevict lm generate` is the same command.
 */
#include "lm_cli.h"

#include <stdio.h>
#include <string.h>

/* ---- lm: the dispatcher ------------------------------------------------------- */

static const char lm_usage[] =
    "usage: kvevict lm COMMAND [OPTIONS]\n"
    "\n"
    "A llama2.c or GGUF model decoded with a KV cache that kvevict's policies\n"
    "manage, one policy per (layer, KV head) (docs/decoder.md). Checkpoints:\n"
    "llama2.c legacy, version 1 (float32) and version 2 (int8), and GGUF\n"
    "(architecture llama; F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,\n"
    "Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS: every type of llama.cpp's presets), told\n"
    "from the file; a GGUF carries its tokenizer.\n"
    "\n"
    "Commands:\n"
    "  logits   the logits at every position of a token sequence (JSON Lines)\n"
    "  eval     bits per byte of a text, full cache beside every policy and budget\n"
    "  passkey  long-range recall of a single-token pass key by distance\n"
    "  repeat   loss on a repeated passage against the distance to its first copy\n"
    "  stream   loss against position over one long decode with a bounded cache\n"
    "  dump     the model's attention as an [L,H,T,T] .npy trace (or a q/K trace)\n"
    "  prefill  a long prompt compressed at prefill against per-step eviction\n"
    "  duo-calibrate  DuoAttention's retrieval and streaming heads, as a schedule\n"
    "  leaderboard    every method against compression ratio on one protocol\n"
    "  generate text with a bounded cache: `kvevict generate`, the same command\n"
    "\n"
    "Run `kvevict lm COMMAND --help` for its options. See also `kvevict generate`.\n";

int cmd_lm(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } subs[] = {{"logits", lm_logits},
                {"eval", lm_eval},
                {"passkey", lm_passkey},
                {"repeat", lm_repeat},
                {"stream", lm_stream},
                {"dump", lm_dump},
                {"prefill", lm_prefill_cmd},
                {"duo-calibrate", lm_duo_calibrate},
                {"leaderboard", lm_leaderboard},
                {"generate", cmd_generate}};
    if (argc < 1)
        die_usage("missing command (see kvevict lm --help)");
    if (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
        fputs(lm_usage, stdout);
        finish_stdout();
        return 0;
    }
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        if (strcmp(argv[0], subs[i].name) == 0) {
            static char name[32];
            snprintf(name, sizeof name, "lm %s", subs[i].name);
            cli_cmd = name;
            return subs[i].run(argc - 1, argv + 1);
        }
    }
    die_usage("unknown command '%s' (see kvevict lm --help)", argv[0]);
}
