/* SPDX-License-Identifier: MIT */
/*
 * leaderboard.c - `kvevict lm leaderboard`: every method (a policy, and how
 * the prompt is compressed: per-step eviction or a prefill method) at every
 * compression ratio, on one protocol, in one table. A method is one line of
 * lb_methods below; a prefill method one line of lb_prefills.
 *
 * Invariants: every row is measured on the same windows and prompts as the
 * full cache's (row 0), so each difference is paired; every figure but the
 * timing column (policy_time_share, last in each row) is deterministic,
 * bit for bit, for a given checkpoint, text and seed; the full cache is
 * decoded once and its per-window figures are reused by every row.
 */
#define _POSIX_C_SOURCE 200809L
#include "lm_cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the methods: one line each ------------------------------------------------
 *
 * name: the leaderboard's label (the spec for per-step eviction, else
 * PREFILL+SPEC, `own` for the policy's own scores); spec: the policy (its
 * budget set at each ratio), which also evicts at every decode step after
 * the prompt; prefill: a name of lb_prefills. kvpress's presses map onto them as
 * (docs/leaderboard.md says where a row is not the press exactly):
 * StreamingLLMPress = streaming, TOVAPress ~ tova (per head; same_positions+tova
 * averages every layer's heads, kvpress each layer's), SnapKVPress ~ snapkv
 * (prefill snapkv at window 32 and max pooling; kvpress's 64 and mean:
 * snapkv_press), KnormPress = knorm (prefill policy), KeyDiffPress = keydiff
 * (prefill policy), ExpectedAttentionPress in DecodingPress ~
 * expected_attention (future positions from the current one;
 * future_from_buffer=1 DecodingPress's offset), KVzipPress ~ kvzip (per-head
 * budgets, kvevict's sinks; kvzip_press and kvzip_press_layerwise its cut
 * at the ratio the budget prunes); heads: a DuoAttention schedule
 * (kvevict lm duo-calibrate's file, read from the working directory when the
 * row is measured) whose retrieval heads get the larger budgets at the same
 * mean (lm_heads_budgets), NULL for every head at the budget; same: 1 for a
 * bank whose heads keep one set of positions (lm_options.same_positions). */
typedef struct lb_method {
    const char *name, *spec, *prefill, *heads;
    int same;
} lb_method;

static const lb_method lb_methods[] = {
    {"window", "window", "step", NULL, 0},
    {"streaming", "streaming", "step", NULL, 0},
    {"random", "random", "step", NULL, 0},
    {"h2o", "h2o", "step", NULL, 0},
    {"scissorhands", "scissorhands", "step", NULL, 0},
    {"tova", "tova", "step", NULL, 0},
    {"same_positions+tova", "tova", "tova_row", NULL, 1},
    {"h2o_decay", "h2o_decay", "step", NULL, 0},
    {"h2o_mean", "h2o_mean", "step", NULL, 0},
    {"knorm", "knorm", "step", NULL, 0},
    {"knorm:recent_window=32", "knorm:recent_window=32", "step", NULL, 0},
    {"keydiff", "keydiff", "step", NULL, 0},
    {"keydiff:recent_window=32", "keydiff:recent_window=32", "step", NULL, 0},
    {"h2o+h2o", "h2o", "h2o", NULL, 0},
    {"snapkv+h2o", "h2o", "snapkv", NULL, 0},
    {"snapkv+tova", "tova", "snapkv", NULL, 0},
    {"snapkv+h2o_mean", "h2o_mean", "snapkv", NULL, 0},
    {"own+knorm", "knorm", "policy", NULL, 0},
    {"own+knorm:recent_window=32", "knorm:recent_window=32", "policy", NULL, 0},
    {"own+keydiff", "keydiff", "policy", NULL, 0},
    {"own+keydiff:recent_window=32", "keydiff:recent_window=32", "policy", NULL, 0},
    {"expected_attention", "expected_attention", "step", NULL, 0},
    {"expected_attention:recent_window=32", "expected_attention:recent_window=32", "step", NULL, 0},
    {"expected_attention:future_from_buffer=1", "expected_attention:future_from_buffer=1", "step",
     NULL, 0},
    {"h2o:vnorm=1", "h2o:vnorm=1", "step", NULL, 0},
    {"tova:vnorm=1", "tova:vnorm=1", "step", NULL, 0},
    {"h2o_mean:vnorm=1", "h2o_mean:vnorm=1", "step", NULL, 0},
    {"kvzip+h2o", "h2o", "kvzip", NULL, 0},
    {"kvzip_press+h2o", "h2o", "kvzip_press", NULL, 0},
    {"kvzip_press_layerwise+h2o", "h2o", "kvzip_press_layerwise", NULL, 0},
    {"kvzip_plus+h2o", "h2o", "kvzip_plus", NULL, 0},
    {"snapkv_press+h2o", "h2o", "snapkv_press", NULL, 0},
    {"snapkv_press+h2o:vnorm=2", "h2o:vnorm=2,epsilon=0.0064", "snapkv_press", NULL, 0},
    {"h2o+h2o_mean:diagonal=1", "h2o_mean:diagonal=1", "h2o", NULL, 0},
    {"duo+streaming", "streaming", "step", "docs/data/duo-heads.txt", 0},
};
enum { LB_METHODS = sizeof lb_methods / sizeof lb_methods[0] };

/* How the prompt is compressed: one line a way. method: a kve_prefill_method
 * (its refusals checked before any decoding, kve_bank_prefill), or LB_STEP
 * (every prompt position a decode step that evicts: no run) or LB_OWN (the
 * policy's own scores once); run: the decoder's prefill, given the method's
 * options (kve_prefill_default_options with the method set). */
enum { LB_STEP = -2, LB_OWN = -1 };
typedef kve_status (*lb_prefill_fn)(lm_state *s, const int32_t *tokens, size_t n,
                                    const kve_prefill_options *options);

static kve_status lb_prefill_own(lm_state *s, const int32_t *tokens, size_t n,
                                 const kve_prefill_options *options)
{
    (void)options;
    return lm_prefill(s, tokens, n, NULL);
}

/* KVzip's reconstruction prompts, from the tokenizer (lm_kvzip_default) once
 * it is loaded. */
static lm_kvzip lb_kvzip;

static kve_status lb_prefill_kvzip(lm_state *s, const int32_t *tokens, size_t n,
                                   const kve_prefill_options *options)
{
    return lm_prefill_kvzip(s, tokens, n, &lb_kvzip, options);
}

/* kvpress's KVzipPress, layerwise=False (OVERALL: one threshold over every
 * head and layer) or True (PER_LAYER), its sinks (the BOS is the prefix),
 * with KVzip+ (kvzip_plus_normalization=True) when plus; each layer then
 * keeps its total while decoding (share). */
static kve_status kvzip_press(lm_state *s, const int32_t *tokens, size_t n,
                              const kve_prefill_options *options, kve_prefill_budgets budgets,
                              int plus)
{
    lm_kvzip kz = lb_kvzip;
    kz.plus = plus;
    kve_prefill_options q = *options;
    q.budgets = budgets;
    q.prefix = 1;
    return lm_prefill_kvzip(s, tokens, n, &kz, &q);
}

static kve_status lb_prefill_kvzip_press(lm_state *s, const int32_t *tokens, size_t n,
                                         const kve_prefill_options *options)
{
    return kvzip_press(s, tokens, n, options, KVE_PREFILL_OVERALL, 0);
}

static kve_status lb_prefill_kvzip_layerwise(lm_state *s, const int32_t *tokens, size_t n,
                                             const kve_prefill_options *options)
{
    return kvzip_press(s, tokens, n, options, KVE_PREFILL_PER_LAYER, 0);
}

static kve_status lb_prefill_kvzip_plus(lm_state *s, const int32_t *tokens, size_t n,
                                        const kve_prefill_options *options)
{
    return kvzip_press(s, tokens, n, options, KVE_PREFILL_OVERALL, 1);
}

/* share: the row's state shares each layer's budget among its KV heads
 * (lm_options.share_heads), which a cut across heads needs. window, pool,
 * kernel: SnapKV's settings when not the defaults (window 0: 32, max
 * pooling; kernel 0: 5); snapkv_press is kvpress's SnapKVPress, window 64,
 * kernel 5, average pooling (where the budget is at most 64 it is skipped:
 * kvpress would keep a part of its window, tied at the largest score, in no
 * defined order); tova_row is TOVAPress's prompt score, the last query's
 * row (window 1, kernel 1). */
static const struct {
    const char *name;
    int method;
    lb_prefill_fn run;
    int share;
    size_t window;
    kve_pool pool;
    size_t kernel;
} lb_prefills[] = {
    {"step", LB_STEP, NULL, 0, 0, KVE_POOL_MAX, 0},
    {"policy", LB_OWN, lb_prefill_own, 0, 0, KVE_POOL_MAX, 0},
    {"h2o", KVE_PREFILL_H2O, lm_prefill, 0, 0, KVE_POOL_MAX, 0},
    {"snapkv", KVE_PREFILL_SNAPKV, lm_prefill, 0, 0, KVE_POOL_MAX, 0},
    {"snapkv_press", KVE_PREFILL_SNAPKV, lm_prefill, 0, 64, KVE_POOL_AVG, 0},
    {"tova_row", KVE_PREFILL_SNAPKV, lm_prefill, 0, 1, KVE_POOL_MAX, 1},
    {"kvzip", KVE_PREFILL_KVZIP, lb_prefill_kvzip, 0, 0, KVE_POOL_MAX, 0},
    {"kvzip_press", KVE_PREFILL_KVZIP, lb_prefill_kvzip_press, 1, 0, KVE_POOL_MAX, 0},
    {"kvzip_press_layerwise", KVE_PREFILL_KVZIP, lb_prefill_kvzip_layerwise, 1, 0, KVE_POOL_MAX, 0},
    {"kvzip_plus", KVE_PREFILL_KVZIP, lb_prefill_kvzip_plus, 1, 0, KVE_POOL_MAX, 0},
};
enum { LB_PREFILLS = sizeof lb_prefills / sizeof lb_prefills[0] };

/* The method and SnapKV settings of lb_prefills[pf] applied to *q. */
static void prefill_options(size_t pf, kve_prefill_options *q)
{
    if (lb_prefills[pf].method >= 0)
        q->method = (kve_prefill_method)lb_prefills[pf].method;
    if (lb_prefills[pf].window) {
        q->window = lb_prefills[pf].window;
        q->pool = lb_prefills[pf].pool;
    }
    if (lb_prefills[pf].kernel)
        q->kernel = lb_prefills[pf].kernel;
}

/* The index of the prefill `name` in lb_prefills, LB_PREFILLS if none. */
static size_t prefill_of(const char *name)
{
    size_t i = 0;
    while (i < LB_PREFILLS && strcmp(lb_prefills[i].name, name) != 0)
        i++;
    return i;
}

static const char leaderboard_usage[] =
    "usage: kvevict lm leaderboard --model CKPT --text FILE [--tokenizer TOK]\n"
    "                              [--methods NAME[,NAME...]|none] [--method M ...]\n"
    "                              [--ratio R[,R...]]\n"
    "                              [--windows N] [--prompt P] [--distances D,...]\n"
    "                              [--trials N] [--repeat-distance R] [--repeat-trials N]\n"
    "                              [--span P] [--list] [--seed N]\n"
    "                              [--format F | --json | --csv | --md] [-o FILE]\n"
    "\n"
    "Every method against compression on one protocol (docs/leaderboard.md). A\n"
    "method is a policy and how the prompt is compressed: step (per-step\n"
    "eviction while it is read), h2o or snapkv (kve_bank_prefill's prompt\n"
    "scores; snapkv_press: kvpress's; tova_row: the last query's row), policy\n"
    "(its own scores, once), kvzip (KVzip's; kvzip_press[_layerwise], kvzip_plus:\n"
    "kvpress's cuts, KVzip+); duo+ splits the budget by a DuoAttention schedule,\n"
    "same_positions+ keeps one set of positions in every head. At ratio R\n"
    "the budget is floor((1 - R) * seq_len) positions per (layer, KV head), on\n"
    "average; the policy then evicts at every decode step after the prompt.\n"
    "Measured, each from steps after the compression, on the same windows and\n"
    "prompts as the full cache (row 0), so every difference is paired:\n"
    "  bits per byte   the first N windows of `lm eval` ([BOS] + seq_len - 1\n"
    "                  tokens), the first P positions the prompt, the tokens\n"
    "                  after it scored; the difference to the full cache with\n"
    "                  its standard error, paired per window\n"
    "  pass key        the prompts of `lm passkey` at the distances beyond the\n"
    "                  budget, all but the last token the prompt\n"
    "  repeat          the loss on a repeated passage at distance R (`lm\n"
    "                  repeat`), the text before the second copy the prompt\n"
    "  kept bytes      keys, values and positions kept after a window, plus\n"
    "                  the policies' state (kve_bank_state_bytes)\n"
    "  time share      the policy's share of the CPU time of the decode steps\n"
    "                  (a timing: machine-dependent, the last key of a row)\n"
    "\n"
    "  --methods LIST      names of the leaderboard (--list prints them; default\n"
    "                      all; none: only --method's)\n"
    "  --method M          a method of your own, added after those (repeatable, up\n"
    "                      to 8): SPEC, per-step eviction, or PREFILL+SPEC with\n"
    "                      PREFILL a prefill above or own (the policy's own\n"
    "                      scores); its label is M\n"
    "  --ratio LIST        compression ratios in (0, 1) (default 0.5,0.8,0.9)\n"
    "  --windows N         bits-per-byte windows, the text's first N (default 8)\n"
    "  --prompt P          prompt positions of a window (default seq_len - 64)\n"
    "  --distances LIST    pass-key distances (default 128, 256, ... and the top),\n"
    "                      each row using those beyond its budget\n"
    "  --trials N          pass-key prompts per distance (default 4)\n"
    "  --repeat-distance R distance of the repeated passage (default the largest\n"
    "                      multiple of 64 that fits)\n"
    "  --repeat-trials N   repeated-passage windows (default 4)\n"
    "  --span P            repeated tokens (default 32)\n"
    "  --list              print the methods (name, policy, prefill) and exit\n"
    "  other options as for `kvevict lm eval`. A LIST option may be repeated,\n"
    "  its items adding up.\n"
    "\n"
    "The first row is the full cache (method full, budget null). JSON keys:\n"
    "method, policy, prefill, compression_ratio, budget, windows, tokens, bytes,\n"
    "bits_per_byte, delta_bits_per_byte, delta_bits_per_byte_se, bpb_rank,\n"
    "passkey_distances, passkey_prompts, passkey_accuracy, passkey_accuracy_se,\n"
    "full_passkey_accuracy, passkey_rank, repeat_distance, repeat_nats,\n"
    "repeat_nats_se, full_repeat_nats, first_nats, kv_bytes, policy_bytes,\n"
    "kept_bytes, seed, policy_time_share, skipped. Ranks are within a ratio (1\n"
    "the best; ties share a rank). A method that cannot run at a ratio (a\n"
    "recent window as large as the budget, a prefill the policy refuses) is a\n"
    "row with its reason under skipped and null figures; the others are\n"
    "measured as if it were absent.\n";

static const opt_def leaderboard_own[] = {
    {"model", 0, OPT_VALUE},          {"text", 0, OPT_VALUE},
    {"tokenizer", 0, OPT_VALUE},      {"methods", 0, OPT_VALUE | OPT_REPEAT},
    {"ratio", 0, OPT_VALUE | OPT_REPEAT}, {"windows", 0, OPT_VALUE},
    {"prompt", 0, OPT_VALUE},         {"distances", 0, OPT_VALUE | OPT_REPEAT},
    {"trials", 0, OPT_VALUE},         {"repeat-distance", 0, OPT_VALUE},
    {"repeat-trials", 0, OPT_VALUE},  {"span", 0, OPT_VALUE},
    {"list", 0, 0},                   {"method", 0, OPT_VALUE | OPT_REPEAT}};
static const cli_spec leaderboard_spec = LM_SPEC(
    leaderboard_usage, SO_SEED | SO_FORMAT | SO_OUTPUT | SO_QUIET, leaderboard_own, FMT_TEXT);

/* One (method, ratio): its figures, summed while measuring. */
typedef struct lb_row {
    const lb_method *m; /* NULL: the full cache */
    double ratio;
    size_t budget;
    lm_state *s;
    size_t pf;        /* its prefill: an index of lb_prefills */
    double *bits;     /* (windows) bits of the scored tokens of each window */
    double pk_hits;   /* pass-key prompts answered, at the distances beyond the budget */
    double pk_full;   /* the full cache's on the same prompts */
    size_t pk_n;      /* those prompts */
    size_t pk_d;      /* those distances */
    double rp_sum, rp_sq; /* repeat: second-copy loss, summed, and its squares */
    size_t kept;      /* bytes of keys, values and positions after a window, at most */
    double cpu_s, policy_s; /* decode steps' CPU time, the policy's part */
    int bpb_rank, pk_rank;
    char skipped[200]; /* why the method cannot run at this ratio; "" when measured */
} lb_row;

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Decodes tokens[0 .. n) from a fresh cache: the first p compressed as
 * r->pf says (step: stepped like the rest), the rest one step at a
 * time; per_pos[i] (i in [p, n - 1)) gets the loss of tokens[i + 1]. The
 * decode steps' CPU time and the policy's part go to r. Returns the argmax
 * after the last token. */
static int32_t lb_run(lb_row *r, const int32_t *tokens, size_t n, size_t p, double *per_pos)
{
    lm_state *s = r->s;
    kve_status st = lm_state_reset(s);
    int32_t V = lm_ctx.model->config.vocab_size;
    size_t i = 0;
    if (st == KVE_OK && lb_prefills[r->pf].run && s->bank) {
        kve_prefill_options q = kve_prefill_default_options();
        prefill_options(r->pf, &q);
        st = lb_prefills[r->pf].run(s, tokens, p, &q);
        i = p;
    }
    double book = s->bookkeeping_s, t0 = thread_cpu();
    next_loss nl = {tokens, per_pos, i, p, n, V};
    if (st == KVE_OK) /* the rest in blocks (lm_forward_batch) */
        st = lm_forward_batch(s, tokens + i, n - i, next_loss_add, &nl);
    r->cpu_s += thread_cpu() - t0;
    r->policy_s += s->bookkeeping_s - book;
    if (st != KVE_OK)
        die_lm(st, r->m ? r->m->name : "full cache");
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++)
        if (s->logits[v] > s->logits[best])
            best = v;
    return best;
}

/* Bytes of keys, values and positions the caches hold now, plus the
 * policies' state. */
static size_t kept_bytes(const lm_state *s, size_t *policy)
{
    const lm_config *c = &lm_ctx.model->config;
    size_t n = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int32_t g = 0; g < c->n_kv_heads; g++)
            n += lm_state_kept(s, l, g);
    *policy = s->bank ? kve_bank_state_bytes(s->bank) : 0;
    return n * (2 * (size_t)c->head_size * sizeof(float) + sizeof(int32_t));
}

/* Competition ranks (1 the best; ties share) of rows [lo, hi) by key,
 * ascending (`desc` 0) or descending. */
static void rank_rows(lb_row *rows, size_t lo, size_t hi, const double *key, int desc,
                      int bpb)
{
    for (size_t a = lo; a < hi; a++) {
        int rank = 1;
        for (size_t b = lo; b < hi; b++) /* NaN (a skipped row) compares false */
            rank += desc ? key[b] > key[a] : key[b] < key[a];
        if (bpb)
            rows[a].bpb_rank = rank;
        else
            rows[a].pk_rank = rank;
    }
}

static size_t parse_count(cli_args *a, const char *name, size_t dflt, size_t lo, size_t hi)
{
    const char *v = own(a, &leaderboard_spec, name);
    char what[40];
    snprintf(what, sizeof what, "--%s", name);
    return v ? (size_t)parse_u64(what, v, lo, hi) : dflt;
}

int lm_leaderboard(int argc, char **argv)
{
    const cli_spec *sp = &leaderboard_spec;
    cli_args a;
    cli_parse(&a, sp, argc, argv);
    if (cli_own(&a, sp, "list")->count) {
        for (size_t i = 0; i < LB_METHODS; i++)
            printf("%s\t%s\t%s\n", lb_methods[i].name, lb_methods[i].spec,
                   lb_methods[i].prefill);
        finish_stdout();
        return 0;
    }
    const char *model = need(&a, sp, "model"), *text = need(&a, sp, "text");
    /* The methods asked for, in the table's order, then --method's. */
    lb_method ms[LB_METHODS + OPT_MAXREP];
    size_t n_ms = 0;
    int want[LB_METHODS];
    for (size_t i = 0; i < LB_METHODS; i++) {
        want[i] = !own(&a, sp, "methods");
        free(canon_spec("a leaderboard method", lb_methods[i].spec, 0));
        if (prefill_of(lb_methods[i].prefill) == LB_PREFILLS)
            die_usage("leaderboard method %s: no prefill '%s'", lb_methods[i].name,
                      lb_methods[i].prefill);
    }
    if (own(&a, sp, "methods")) { /* A,B or --methods A --methods B; none alone */
        size_t n;
        char **items = split_lists("--methods", cli_own(&a, sp, "methods"), &n);
        for (size_t k = 0; k < n; k++) {
            if (strcmp(items[k], "none") == 0) {
                if (n > 1) {
                    free_list(items, n);
                    die_usage("--methods: none names no method, and cannot go with others");
                }
                continue;
            }
            size_t i = 0;
            while (i < LB_METHODS && strcmp(lb_methods[i].name, items[k]) != 0)
                i++;
            if (i == LB_METHODS) {
                char bad[128];
                snprintf(bad, sizeof bad, "%s", items[k]);
                free_list(items, n);
                die_usage("--methods: no method '%s' (see kvevict lm leaderboard --list)", bad);
            }
            want[i] = 1;
        }
        free_list(items, n);
    }
    for (size_t i = 0; i < LB_METHODS; i++)
        if (want[i])
            ms[n_ms++] = lb_methods[i];
    /* --method PREFILL+SPEC or SPEC: the argument is the label; the strings
     * stay in argv */
    char own_spec[OPT_MAXREP][KVE_SPEC_MAX];
    const opt_val *mv = cli_own(&a, sp, "method");
    for (int k = 0; k < mv->count; k++) {
        const char *m = mv->v[k], *plus = strchr(m, '+');
        lb_method x = {m, m, "step", NULL, 0};
        if (plus) {
            size_t len = (size_t)(plus - m);
            x.prefill = NULL;
            for (size_t i = 0; i < LB_PREFILLS; i++) {
                const char *name = strcmp(lb_prefills[i].name, "policy") == 0 ? "own"
                                                                              : lb_prefills[i].name;
                if (lb_prefills[i].method != LB_STEP && strlen(name) == len &&
                    strncmp(name, m, len) == 0)
                    x.prefill = lb_prefills[i].name;
            }
            if (!x.prefill)
                die_usage("--method %s: no prefill '%.*s' (h2o, snapkv, snapkv_press, tova_row, "
                          "kvzip, kvzip_press, kvzip_press_layerwise, kvzip_plus, own)", m,
                          (int)len, m);
            snprintf(own_spec[k], sizeof own_spec[k], "%s", plus + 1);
            x.spec = own_spec[k];
        }
        char what[KVE_SPEC_MAX + 16];
        snprintf(what, sizeof what, "--method %s", m);
        free(canon_spec(what, x.spec, 0));
        for (size_t i = 0; i < n_ms; i++)
            if (strcmp(ms[i].name, m) == 0)
                die_usage("--method %s: the leaderboard has a method of that name", m);
        ms[n_ms++] = x;
    }
    if (!n_ms)
        die_usage("--methods none and no --method: nothing to measure");
    double ratios[16] = {0.5, 0.8, 0.9};
    size_t n_ratios = 3;
    if (own(&a, sp, "ratio")) { /* A,B or --ratio A --ratio B */
        char **items = split_lists("--ratio", cli_own(&a, sp, "ratio"), &n_ratios);
        if (n_ratios > 16) {
            free_list(items, n_ratios);
            die_usage("--ratio: at most 16 ratios");
        }
        for (size_t k = 0; k < n_ratios; k++) {
            ratios[k] = parse_real("--ratio", items[k], 0, 1);
            if (ratios[k] <= 0 || ratios[k] >= 1) {
                free_list(items, n_ratios);
                die_usage("--ratio: %g is not inside (0, 1)", ratios[k]);
            }
        }
        free_list(items, n_ratios);
    }
    size_t n_windows = parse_count(&a, "windows", 8, 1, 1u << 20);
    size_t trials = parse_count(&a, "trials", 4, 1, 1u << 20);
    size_t rp_trials = parse_count(&a, "repeat-trials", 4, 1, 1u << 20);
    size_t span = parse_count(&a, "span", 32, 2, 1u << 20);
    const char *prompt_opt = own(&a, sp, "prompt"), *rd_opt = own(&a, sp, "repeat-distance");

    load_model(model);
    load_tokenizer(own(&a, sp, "tokenizer"), model);
    load_text(text);
    encode_text(text);
    lm_ctx.timing = 1;
    kve_status kst = lm_kvzip_default(lm_ctx.tok, &lb_kvzip);
    if (kst != KVE_OK)
        die_lm(kst, "--tokenizer (KVzip's prompts)");
    const size_t L = (size_t)lm_ctx.model->config.seq_len;
    size_t P = prompt_opt ? (size_t)parse_u64("--prompt", prompt_opt, 1, L > 2 ? L - 2 : 1)
                          : (L > 66 ? L - 64 : L / 2);
    if (L < 4 || P + 2 > L)
        die_usage("--prompt %zu: a window of %zu positions holds no text after it", P, L);
    if (L < 2 * span + 1)
        die_usage("--span %zu: the context %zu holds no repeat", span, L);
    size_t rd = rd_opt ? (size_t)parse_u64("--repeat-distance", rd_opt, span, L - 1 - span)
                       : ((L - 1 - span) / 64 ? (L - 1 - span) / 64 * 64 : L - 1 - span);
    /* The pass key needs the pieces <key00> .. <key63>: without them (a
     * tokenizer of another model) the rows have no pass-key figures. */
    pk_template pk = {0};
    size_t nd = 0, *dist = NULL;
    if (lm_ctx.n_ids < L - 1)
        die_input("--text %s: %zu tokens, the windows need %zu", text, lm_ctx.n_ids, L - 1);
    if (lm_piece_id(lm_ctx.tok, "<key00>", 7) >= 0) {
        pk_load(&pk);
        if (L < 2 + pk.na + pk.nb + pk.nq)
            die_input("--model: seq_len %zu is too short for the pass-key prompts", L);
        size_t d_lo = pk.nb + pk.nq, d_hi = L - 2 - pk.na;
        dist = distances(cli_own(&a, sp, "distances"), d_lo, d_hi, 0, &nd);
        if (!own(&a, sp, "distances")) { /* 128, 256, ... and the top */
            nd = 0;
            for (size_t x = 128; x <= d_hi; x += 128)
                if (x >= d_lo && x < d_hi)
                    dist[nd++] = x;
            dist[nd++] = d_hi;
        }
    } else {
        warn("the tokenizer has no piece <key00>: no pass-key figures (null)");
    }
    if (n_windows > lm_ctx.n_ids / (L - 1))
        die_usage("--windows %zu: the text holds %zu whole windows", n_windows,
                  lm_ctx.n_ids / (L - 1));

    /* The rows: the full cache, then every ratio's methods. */
    size_t n_rows = 1;
    lb_row *rows = xcalloc(1 + n_ratios * n_ms, sizeof *rows);
    rows[0].s = new_state(NULL, 0, LM_POS_ORIGINAL, a.seed);
    rows[0].pf = prefill_of("step");
    for (size_t k = 0; k < n_ratios; k++) {
        size_t budget = (size_t)floor((1 - ratios[k]) * (double)L + 1e-9);
        for (size_t i = 0; i < n_ms; i++) {
            lb_row *r = &rows[n_rows++];
            r->m = &ms[i];
            r->ratio = ratios[k];
            r->budget = budget;
            r->pf = prefill_of(r->m->prefill);
            /* a method that does not fit this ratio is a row saying why */
            char buf[KVE_SPEC_MAX], num[32];
            snprintf(num, sizeof num, "%zu", budget);
            if (kve_spec_with(r->m->spec, "budget", num, buf, sizeof buf) != KVE_OK) {
                snprintf(r->skipped, sizeof r->skipped, "budget %zu: %s", budget,
                         kve_last_error());
                continue;
            }
            if (r->m->heads) { /* the schedule, for this row's budgets only */
                lm_ctx.heads = load_heads(r->m->heads, r->m->name);
                lm_ctx.streaming_budget = 16; /* lm's --streaming-budget default */
            }
            const int shared = lm_ctx.budgets.share_heads, same = lm_ctx.same_positions;
            lm_ctx.budgets.share_heads = shared || lb_prefills[r->pf].share;
            lm_ctx.same_positions = same || r->m->same;
            r->s = new_state(r->m->spec, budget, LM_POS_ORIGINAL, a.seed);
            lm_ctx.budgets.share_heads = shared;
            lm_ctx.same_positions = same;
            lm_heads_free(lm_ctx.heads);
            lm_ctx.heads = NULL;
            r->budget = r->s->budget;
            if (lb_prefills[r->pf].method >= 0) { /* a refused combination: skipped */
                kve_prefill_options q = kve_prefill_default_options();
                prefill_options(r->pf, &q);
                if (kve_bank_prefill(r->s->bank, 0, 0, L, budget, NULL, L, 1, KVE_REDUCE_MEAN,
                                     &q) != KVE_OK) {
                    snprintf(r->skipped, sizeof r->skipped, "prefill %s: %s", r->m->prefill,
                             kve_last_error());
                    lm_state_free(r->s);
                    r->s = NULL;
                }
            }
        }
    }
    for (size_t r = 0; r < n_rows; r++)
        rows[r].bits = xcalloc(n_windows, sizeof *rows[r].bits);

    FILE *out = out_open(a.output);
    int32_t *w = xmalloc(L * sizeof *w);
    double *loss = xmalloc(L * sizeof *loss), *wbytes = xcalloc(n_windows, sizeof *wbytes);
    double *full_pk = xcalloc(nd, sizeof *full_pk); /* the full cache's hits by distance */
    double bytes = 0, full_first = 0, full_rp = 0;
    size_t tokens = 0;
    size_t n_run = 0;
    for (size_t r = 0; r < n_rows; r++)
        n_run += rows[r].s != NULL;
    uint64_t total = (uint64_t)(n_windows + rp_trials) * n_run;
    for (size_t r = 0; r < n_rows; r++)
        for (size_t di = 0; rows[r].s && di < nd; di++)
            total += (!r || dist[di] > rows[r].budget) ? trials : 0;
    progress pr;
    progress_begin(&pr, "prompt", total, 0, 1);
    uint64_t done = 0;
    /* 1. bits per byte after a compressed prompt. */
    for (size_t wi = 0; wi < n_windows; wi++) {
        text_window(w, wi * (L - 1), L);
        wbytes[wi] = window_bytes(w, P + 1, L, &tokens);
        bytes += wbytes[wi];
        for (size_t r = 0; r < n_rows; r++) {
            if (!rows[r].s)
                continue;
            lb_run(&rows[r], w, L, P, loss);
            for (size_t i = P; i + 1 < L; i++)
                rows[r].bits[wi] += loss[i] / log(2.0);
            size_t policy, kv = kept_bytes(rows[r].s, &policy);
            if (kv + policy > rows[r].kept)
                rows[r].kept = kv + policy;
            progress_update(&pr, ++done);
        }
    }
    /* 2. the pass key at the distances beyond each budget. */
    for (size_t di = 0; di < nd; di++) {
        for (size_t j = 0; j < trials; j++) {
            int32_t key = pk_prompt(&pk, L, j, trials, dist[di], w);
            int full_hit = 0;
            for (size_t r = 0; r < n_rows; r++) {
                if (!rows[r].s || (r && dist[di] <= rows[r].budget))
                    continue;
                int hit = lb_run(&rows[r], w, L, L - 1, NULL) == key;
                progress_update(&pr, ++done);
                if (!r) {
                    full_hit = hit;
                    full_pk[di] += hit;
                    continue;
                }
                rows[r].pk_hits += hit;
                rows[r].pk_full += full_hit;
                rows[r].pk_n++;
            }
        }
        for (size_t r = 1; r < n_rows; r++)
            rows[r].pk_d += rows[r].s && dist[di] > rows[r].budget;
    }
    rows[0].pk_hits = 0;
    for (size_t di = 0; di < nd; di++)
        rows[0].pk_hits += full_pk[di];
    rows[0].pk_full = rows[0].pk_hits;
    rows[0].pk_n = nd * trials;
    /* (rows without a prompt have null accuracies: pk_n 0) */
    rows[0].pk_d = nd;
    /* 3. the repeated passage at distance rd: the second copy's tokens 2 ..
     * span, each predicted by a step after the compressed prompt. */
    size_t p2 = L - span, p1 = p2 - rd;
    for (size_t j = 0; j < rp_trials; j++) {
        size_t s = (size_t)((uint64_t)j * (lm_ctx.n_ids - (L - 1)) / rp_trials);
        text_window(w, s, L);
        for (size_t i = 0; i < span; i++)
            w[p2 + i] = w[p1 + i];
        for (size_t r = 0; r < n_rows; r++) {
            if (!rows[r].s)
                continue;
            lb_run(&rows[r], w, L, r ? p2 : 0, loss);
            double x = 0;
            for (size_t i = 1; i < span; i++)
                x += loss[p2 + i - 1];
            if (!r)
                for (size_t i = 1; i < span; i++)
                    full_first += loss[p1 + i - 1];
            rows[r].rp_sum += x;
            for (size_t i = 1; i < span; i++)
                rows[r].rp_sq += loss[p2 + i - 1] * loss[p2 + i - 1];
            progress_update(&pr, ++done);
        }
    }
    full_rp = rows[0].rp_sum;
    progress_end(&pr);

    /* Ranks within a ratio. */
    double *kb = xmalloc(n_rows * sizeof *kb), *kp = xmalloc(n_rows * sizeof *kp);
    for (size_t r = 0; r < n_rows; r++) {
        double sum = 0;
        for (size_t wi = 0; wi < n_windows; wi++)
            sum += rows[r].bits[wi] - rows[0].bits[wi];
        kb[r] = rows[r].s ? sum : NAN;
        kp[r] = rows[r].pk_n ? rows[r].pk_hits / (double)rows[r].pk_n : NAN;
    }
    for (size_t lo = 1; lo < n_rows;) {
        size_t hi = lo;
        while (hi < n_rows && rows[hi].ratio == rows[lo].ratio)
            hi++;
        rank_rows(rows, lo, hi, kb, 0, 1);
        rank_rows(rows, lo, hi, kp, 1, 0);
        lo = hi;
    }

    static const col cols[] = {
        {"method", "method", COL_ALL | COL_LEFT | COL_CODE},
        {"policy", KEY_POLICY, COL_CSV | COL_JSON},
        {"prefill", "prefill", COL_ALL},
        {"ratio", "compression_ratio", COL_ALL},
        {"budget", KEY_BUDGET, COL_ALL},
        {"windows", "windows", COL_CSV | COL_JSON},
        {"tokens", "tokens", COL_CSV | COL_JSON},
        {"bytes", "bytes", COL_CSV | COL_JSON},
        {"bits/byte", "bits_per_byte", COL_ALL},
        {"delta", "delta_bits_per_byte", COL_ALL},
        {"se", "delta_bits_per_byte_se", COL_ALL},
        {"rank", "bpb_rank", COL_CSV | COL_JSON},
        {"distances", "passkey_distances", COL_CSV | COL_JSON},
        {"prompts", "passkey_prompts", COL_CSV | COL_JSON},
        {"pass key", "passkey_accuracy", COL_ALL},
        {"se", "passkey_accuracy_se", COL_ALL},
        {"full", "full_passkey_accuracy", COL_CSV | COL_JSON},
        {"rank", "passkey_rank", COL_CSV | COL_JSON},
        {"repeat r", "repeat_distance", COL_CSV | COL_JSON},
        {"repeat nats", "repeat_nats", COL_ALL},
        {"se", "repeat_nats_se", COL_CSV | COL_JSON},
        {"full repeat", "full_repeat_nats", COL_CSV | COL_JSON},
        {"first nats", "first_nats", COL_CSV | COL_JSON},
        {"kv bytes", "kv_bytes", COL_CSV | COL_JSON},
        {"policy bytes", "policy_bytes", COL_CSV | COL_JSON},
        {"kept bytes", "kept_bytes", COL_ALL},
        {"seed", KEY_SEED, COL_CSV | COL_JSON},
        {"time share", "policy_time_share", COL_ALL},
        {"skipped", "skipped", COL_ALL | COL_LEFT},
    };
    table t;
    table_init(&t, cols, sizeof cols / sizeof cols[0]);
    double rp_count = (double)rp_trials * (double)(span - 1);
    for (size_t r = 0; r < n_rows; r++) {
        const lb_row *x = &rows[r];
        double sum = 0;
        for (size_t wi = 0; wi < n_windows; wi++)
            sum += x->bits[wi];
        double *d = xmalloc(n_windows * sizeof *d);
        for (size_t wi = 0; wi < n_windows; wi++)
            d[wi] = x->bits[wi] - rows[0].bits[wi];
        double acc = x->pk_n ? x->pk_hits / (double)x->pk_n : NAN;
        const double none = NAN, run = x->s ? 1.0 : none; /* skipped: every figure null */
        double m2 = x->rp_sum / rp_count * run;
        size_t policy = x->s && x->s->bank ? kve_bank_state_bytes(x->s->bank) : 0;
        /* a skipped row's spec as given: it could not take the budget */
        const char *spec_shown = x->m ? x->s ? x->s->spec : x->m->spec : "full";
        table_str(&t, x->m ? x->m->name : "full");
        table_str(&t, spec_shown);
        table_str(&t, x->m ? x->m->prefill : "-");
        table_real_shown(&t, x->m ? x->ratio : 0.0, "%g");
        if (x->m)
            table_uint(&t, x->budget);
        else
            table_real(&t, NAN, "%.0f");
        table_uint(&t, n_windows);
        table_uint(&t, tokens);
        table_real(&t, bytes, "%.0f");
        table_real(&t, sum / bytes * run, "%.4f");
        table_real(&t, kb[r] / bytes, "%+.4f");
        table_real(&t, r ? ratio_se(d, wbytes, n_windows, bytes) * run : NAN, "%.4f");
        if (r && x->s)
            table_uint(&t, (uint64_t)x->bpb_rank);
        else
            table_real(&t, NAN, "%.0f");
        table_uint(&t, x->pk_d);
        table_uint(&t, x->pk_n);
        table_real(&t, acc, "%.3f");
        table_real(&t, x->pk_n ? sqrt(acc * (1 - acc) / (double)x->pk_n) : NAN, "%.3f");
        table_real(&t, x->pk_n ? x->pk_full / (double)x->pk_n : NAN, "%.3f");
        if (r && x->pk_n)
            table_uint(&t, (uint64_t)x->pk_rank);
        else
            table_real(&t, NAN, "%.0f");
        table_uint(&t, rd);
        table_real(&t, m2, "%.4f");
        table_real(&t, sqrt(fmax(0.0, x->rp_sq / rp_count - m2 * m2) / rp_count) * run, "%.4f");
        table_real(&t, full_rp / rp_count, "%.4f");
        table_real(&t, full_first / rp_count, "%.4f");
        if (x->s) {
            table_uint(&t, x->kept - policy);
            table_uint(&t, policy);
            table_uint(&t, x->kept);
        } else {
            for (int c = 0; c < 3; c++)
                table_real(&t, none, "%.0f");
        }
        table_uint(&t, a.seed);
        table_real(&t, x->cpu_s > 0 ? x->policy_s / x->cpu_s : NAN, "%.3f");
        if (x->skipped[0])
            table_str(&t, x->skipped);
        else
            table_real(&t, none, "%.0f");
        free(d);
    }
    if (a.format == FMT_TEXT)
        fprintf(out,
                "%zu windows of %zu positions (the first %zu the prompt; %zu tokens, %.0f bytes "
                "scored); pass key: %zu prompts a distance, those beyond the budget; repeated "
                "passage: %zu tokens at distance %zu, %zu windows; policy seed %llu\n\n",
                n_windows, L, P, tokens, bytes, trials, span, rd, rp_trials,
                (unsigned long long)a.seed);
    table_print(&t, out, a.format);
    table_free(&t);
    out_close(out);
    for (size_t r = 0; r < n_rows; r++) {
        lm_state_free(rows[r].s); /* NULL for a skipped row */
        free(rows[r].bits);
    }
    free(rows), free(kb), free(kp), free(w), free(loss), free(wbytes), free(full_pk), free(dist);
    if (nd)
        pk_free(&pk);
    return 0;
}
