/* SPDX-License-Identifier: MIT */
/*
 * recall.c - long-range recall: `kvevict lm passkey` (a single-token pass
 * key asked for after held-out text) and `kvevict lm repeat` (the loss on a
 * repeated passage against the distance to its first occurrence), by
 * policy, budget and distance, on the prompts of measure.c.
 */
#include "lm_cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char passkey_usage[] =
    "usage: kvevict lm passkey --model CKPT --text FILE [--tokenizer TOK]\n"
    "                          [--policy SPEC[,SPEC...]] [--budget B[,B...]]\n"
    "                          [--distances D,...] [--trials N] [--positions P] [--seed N]\n"
    "                          [--format F | --json | --csv | --md] [-o FILE]\n"
    "\n"
    "Long-range recall: a single-token pass key (\"<keyNN>\") stated once, held-out\n"
    "text, then asked for; accuracy is how often the model's argmax at the last\n"
    "position is the key (chance 1/64), by policy, budget and distance (key to\n"
    "last position). Prompts are those of models/README.md, built from FILE.\n"
    "\n"
    "  --distances LIST  distances (default: 64, 128, ... within the valid range,\n"
    "                    and its top)\n"
    "  --trials N        prompts per distance (default 128)\n"
    "  other options as for `kvevict lm eval`; JSON rows: policy, budget,\n"
    "  positions, distance, trials, accuracy, accuracy_se, key_accuracy\n"
    "  (argmax over the 64 keys only), chance, seed.\n";

static const char repeat_usage[] =
    "usage: kvevict lm repeat --model CKPT --text FILE [--tokenizer TOK]\n"
    "                         [--policy SPEC[,SPEC...]] [--budget B[,B...]]\n"
    "                         [--distances R,...] [--trials N] [--span P] [--positions P]\n"
    "                         [--seed N] [--format F | --json | --csv | --md] [-o FILE]\n"
    "\n"
    "The continuous recall measure: a held-out window whose last P tokens repeat a\n"
    "passage r tokens earlier; the mean loss (nats/token) on the second occurrence\n"
    "against the first, by policy, budget and distance r. A model that copies\n"
    "predicts the repeat far better than the first occurrence; evicting the first\n"
    "occurrence takes that away. Windows are those of models/README.md.\n"
    "\n"
    "  --distances LIST  distances r (default: P, 64, 128, ... up to L-1-P)\n"
    "  --trials N        windows per distance (default 64)\n"
    "  --span P          repeated tokens (default 32)\n"
    "  other options as for `kvevict lm eval`; JSON rows: policy, budget, positions,\n"
    "  distance, trials, span, first_nats, second_nats, second_nats_se, seed.\n";

static const opt_def passkey_own[] = {
    MEASURE_OPTS, {"distances", 0, OPT_VALUE | OPT_REPEAT}, {"trials", 0, OPT_VALUE}};
static const cli_spec passkey_spec =
    LM_SPEC(passkey_usage, SO_SEED | SO_FORMAT | SO_OUTPUT | SO_QUIET, passkey_own, FMT_TEXT);
static const opt_def repeat_own[] = {MEASURE_OPTS,
                                     {"distances", 0, OPT_VALUE | OPT_REPEAT},
                                     {"trials", 0, OPT_VALUE},
                                     {"span", 0, OPT_VALUE}};
static const cli_spec repeat_spec =
    LM_SPEC(repeat_usage, SO_SEED | SO_FORMAT | SO_OUTPUT | SO_QUIET, repeat_own, FMT_TEXT);

/* Decodes a window from a fresh cache. Without per_pos: all n tokens, and
 * returns the argmax after the last. With per_pos: tokens[0 .. n-1), and
 * per_pos[i] (i < n - 1) is the loss of tokens[i + 1] after tokens[0 .. i]. */
static int32_t run_prompt(lm_state *s, const int32_t *tokens, size_t n, double *per_pos,
                          const char *what)
{
    kve_status st = lm_state_reset(s);
    int32_t V = lm_ctx.model->config.vocab_size;
    next_loss nl = {tokens, per_pos, 0, 0, n, V};
    if (st == KVE_OK) /* in blocks (lm_forward_batch) */
        st = lm_forward_batch(s, tokens, per_pos ? n - 1 : n, next_loss_add, &nl);
    if (st != KVE_OK)
        die_lm(st, what);
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (s->logits[i] > s->logits[best])
            best = i;
    return best;
}

static int lm_recall(int argc, char **argv, int repeat)
{
    const cli_spec *sp = repeat ? &repeat_spec : &passkey_spec;
    measure_args ma;
    measure_parse(&ma, sp, argc, argv);
    const char *tr = own(&ma.a, sp, "trials");
    size_t trials = tr ? (size_t)parse_u64("--trials", tr, 1, 1u << 20) : (repeat ? 64 : 128);
    const char *span = repeat ? own(&ma.a, sp, "span") : NULL;
    size_t P = span ? (size_t)parse_u64("--span", span, 2, 1u << 20) : 32;
    measure_load(&ma, sp);
    size_t L = (size_t)lm_ctx.model->config.seq_len;

    size_t lo, hi;
    pk_template pk = {0};
    if (!repeat) {
        pk_load(&pk);
        size_t na = pk.na, nb = pk.nb, nq = pk.nq;
        if (L < 2 + na + nb + nq)
            die_input("--model: seq_len %zu cannot hold the pass-key prompt", L);
        lo = nb + nq;
        hi = L - 2 - na;
        if (lm_ctx.n_ids < L - 2 - na - nb - nq)
            die_input("--text %s: %zu tokens, the prompts need %zu", ma.text, lm_ctx.n_ids,
                      L - 2 - na - nb - nq);
    } else {
        if (L < 2 * P + 1)
            die_usage("--span %zu: the context %zu holds no repeat", P, L);
        lo = P;
        hi = L - 1 - P;
        if (lm_ctx.n_ids < L - 1)
            die_input("--text %s: %zu tokens, the windows need %zu", ma.text, lm_ctx.n_ids, L - 1);
    }
    size_t nd;
    size_t *dist = distances(cli_own(&ma.a, sp, "distances"), lo, hi, repeat, &nd);
    if (repeat)
        ma.span = L - 1; /* a window's last token is only predicted */
    size_t n_jobs;
    job *jobs = jobs_new(&ma, &n_jobs);
    FILE *out = out_open(ma.a.output);

    int32_t *w = xmalloc(L * sizeof *w);
    double *loss = xmalloc(L * sizeof *loss);
    size_t cells = n_jobs * nd;
    double *r1 = xcalloc(cells, sizeof *r1), *r2 = xcalloc(cells, sizeof *r2);
    double *r3 = xcalloc(cells, sizeof *r3);
    progress pr;
    progress_begin(&pr, "prompt", (uint64_t)nd * trials * n_jobs, 0, 1);
    uint64_t done = 0;
    for (size_t di = 0; di < nd; di++) {
        size_t d = dist[di];
        for (size_t j = 0; j < trials; j++) {
            int32_t key = 0;
            if (!repeat) { /* the pass-key prompt */
                key = pk_prompt(&pk, L, j, trials, d, w);
            } else { /* the repeated passage */
                size_t s = (size_t)((uint64_t)j * (lm_ctx.n_ids - (L - 1)) / trials);
                text_window(w, s, L);
                for (size_t i = 0; i < P; i++)
                    w[L - P + i] = w[L - P - d + i];
            }
            for (size_t jb = 0; jb < n_jobs; jb++) {
                const char *what = jobs[jb].spec ? jobs[jb].spec : "full cache";
                size_t c = jb * nd + di;
                if (!repeat) {
                    int32_t best = run_prompt(jobs[jb].s, w, L, NULL, what);
                    r1[c] += best == key;
                    int32_t kb = pk.keys[0];
                    for (int k = 1; k < PK_KEYS; k++)
                        if (jobs[jb].s->logits[pk.keys[k]] > jobs[jb].s->logits[kb])
                            kb = pk.keys[k];
                    r2[c] += kb == key;
                } else {
                    run_prompt(jobs[jb].s, w, L, loss, what);
                    size_t p1 = L - P - d, p2 = L - P;
                    for (size_t i = 1; i < P; i++) {
                        r1[c] += loss[p1 + i - 1];
                        r2[c] += loss[p2 + i - 1];
                        r3[c] += loss[p2 + i - 1] * loss[p2 + i - 1];
                    }
                }
                progress_update(&pr, ++done);
            }
        }
    }
    progress_end(&pr);

    static const col pk_cols[] = {
        {"distance", "distance", COL_ALL},
        {"trials", "trials", COL_CSV | COL_JSON},
        {"accuracy", "accuracy", COL_ALL},
        {"se", "accuracy_se", COL_ALL},
        {"among keys", "key_accuracy", COL_ALL},
        {"chance", "chance", COL_CSV | COL_JSON},
        {"seed", KEY_SEED, COL_CSV | COL_JSON},
    };
    static const col rp_cols[] = {
        {"distance", "distance", COL_ALL},
        {"trials", "trials", COL_CSV | COL_JSON},
        {"span", "span", COL_CSV | COL_JSON},
        {"first nats", "first_nats", COL_ALL},
        {"second nats", "second_nats", COL_ALL},
        {"se", "second_nats_se", COL_ALL},
        {"seed", KEY_SEED, COL_CSV | COL_JSON},
    };
    table t;
    col cols[TABLE_MAXCOLS];
    if (repeat)
        table_init(&t, cols, job_cols(cols, rp_cols, sizeof rp_cols / sizeof rp_cols[0]));
    else
        table_init(&t, cols, job_cols(cols, pk_cols, sizeof pk_cols / sizeof pk_cols[0]));
    double count = repeat ? (double)trials * (double)(P - 1) : (double)trials;
    for (size_t jb = 0; jb < n_jobs; jb++) {
        for (size_t di = 0; di < nd; di++) {
            size_t c = jb * nd + di;
            double m1 = r1[c] / count, m2 = r2[c] / count;
            job_cells(&t, &jobs[jb], ma.positions);
            table_uint(&t, dist[di]);
            table_uint(&t, trials);
            if (repeat) {
                table_uint(&t, P);
                table_real(&t, m1, "%.4f");
                table_real(&t, m2, "%.4f");
                table_real(&t, sqrt(fmax(0.0, r3[c] / count - m2 * m2) / count), "%.4f");
            } else {
                table_real(&t, m1, "%.4f");
                table_real(&t, sqrt(m1 * (1 - m1) / count), "%.4f");
                table_real(&t, m2, "%.4f");
                table_real(&t, 1.0 / PK_KEYS, "%.4f");
            }
            table_uint(&t, ma.a.seed);
        }
    }
    if (ma.a.format == FMT_TEXT) {
        if (repeat)
            fprintf(out,
                    "repeated passage of %zu tokens, %zu windows per distance, positions "
                    "%s; loss in nats/token over tokens 2..%zu of each occurrence\n\n",
                    P, trials, positions_name(ma.positions), P);
        else
            fprintf(out, "pass key: %zu prompts per distance, positions %s, chance %.4f\n\n",
                    trials, positions_name(ma.positions), 1.0 / PK_KEYS);
    }
    table_print(&t, out, ma.a.format);
    table_free(&t);
    out_close(out);
    free(r1), free(r2), free(r3), free(w), free(loss), free(dist);
    pk_free(&pk);
    jobs_free(jobs, n_jobs);
    measure_free(&ma);
    return 0;
}

int lm_passkey(int argc, char **argv)
{
    return lm_recall(argc, argv, 0);
}

int lm_repeat(int argc, char **argv)
{
    return lm_recall(argc, argv, 1);
}
