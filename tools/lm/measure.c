/* SPDX-License-Identifier: MIT */
/*
 * measure.c - what the decoder's commands share (lm_cli.h): loading the
 * checkpoint, the tokenizer (--tokenizer, else a GGUF's own, else
 * tokenizer.bin beside the checkpoint) and the text, budgets as counts or percentages of the
 * context, the decoders (one kvevict policy per (layer, KV head)), the
 * options and the (policy, budget) jobs of the measuring commands (eval,
 * passkey, repeat, stream, prefill), and the pass-key prompts.
 *
 * Everything loaded stays reachable from lm_ctx until exit, so an early exit
 * leaks nothing that a leak checker could call lost; arguments that can only
 * be checked against the model (a token id, a distance) are usage errors.
 */
#define _POSIX_C_SOURCE 200809L
#include "lm_cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

lm_loaded lm_ctx;

void die_lm(kve_status s, const char *what)
{
    if (s == KVE_EINVAL)
        die_usage("%s: %s", what, kve_last_error());
    die_input("%s: %s", what, kve_last_error());
}

void load_model(const char *path)
{
    kve_status s = lm_model_open(path, NULL, &lm_ctx.model);
    if (s != KVE_OK)
        die_input("--model %s: %s", path, kve_last_error());
    cli_watch_mapping(lm_ctx.model->map, lm_ctx.model->map_size, path);
    /* llama.cpp's arithmetic reads its Q4_K rows in fours, as llama.cpp
     * repacks them: a copy in that layout (the same bits, faster) */
    if (lm_ctx.products == LM_PRODUCTS_LLAMA && lm_model_pack(lm_ctx.model) != KVE_OK)
        die_input("--model %s: %s", path, kve_last_error());
}

lm_tokenizer *open_tokenizer(const char *path, const char *model_path, const lm_model *m,
                             const char *what)
{
    char buf[4096];
    if (!path && m->config.format == LM_FORMAT_GGUF) { /* the GGUF's own vocabulary */
        lm_tokenizer *t = NULL;
        if (lm_tokenizer_from_model(m, NULL, &t) != KVE_OK)
            die_input("%s not given, and %s: %s", what, model_path, kve_last_error());
        return t;
    }
    if (!path) {
        const char *slash = strrchr(model_path, '/');
        int dirlen = slash ? (int)(slash - model_path) : 1;
        snprintf(buf, sizeof buf, "%.*s/tokenizer.bin", dirlen, slash ? model_path : ".");
        if (access(buf, F_OK) != 0)
            die_usage("%s not given and %s does not exist", what, buf);
        path = buf;
    }
    lm_tokenizer *t = NULL;
    kve_status s = lm_tokenizer_open(path, NULL, &t);
    if (s != KVE_OK)
        die_input("%s %s: %s", what, path, kve_last_error());
    if (t->n_pieces != m->config.vocab_size) {
        int32_t n = t->n_pieces;
        lm_tokenizer_free(t);
        die_input("%s %s: %d pieces, but the model's vocab_size is %d", what, path, n,
                  m->config.vocab_size);
    }
    return t;
}

void load_tokenizer(const char *path, const char *model_path)
{
    lm_ctx.tok = open_tokenizer(path, model_path, lm_ctx.model, "--tokenizer");
}

void load_text(const char *path)
{
    kve_status st = lm_read_file(NULL, path, &lm_ctx.text, &lm_ctx.text_len);
    if (st != KVE_OK)
        die_input("--text: %s", kve_last_error());
    const char *nul = memchr(lm_ctx.text, 0, lm_ctx.text_len);
    if (nul)
        die_input("--text %s: a NUL byte at offset %zu", path, (size_t)(nul - lm_ctx.text));
}

int32_t *encode(const char *s, size_t len, size_t *n)
{
    size_t cap = lm_encode_bound(lm_ctx.tok, len);
    if (cap > SIZE_MAX / sizeof(int32_t))
        die_input("encode: %zu bytes of text are too many", len);
    int32_t *ids = xmalloc(cap * sizeof *ids);
    kve_status st = lm_encode(lm_ctx.tok, s, len, ids, cap, n);
    if (st != KVE_OK) {
        free(ids);
        die_lm(st, "encode");
    }
    return ids;
}

void encode_text(const char *path)
{
    lm_ctx.ids = encode(lm_ctx.text, lm_ctx.text_len, &lm_ctx.n_ids);
    if (lm_ctx.n_ids == 0)
        die_input("--text %s: empty", path);
}

int32_t first_token(size_t start)
{
    int32_t bos = lm_ctx.model->config.bos;
    return bos >= 0 ? bos : lm_ctx.ids[(start + lm_ctx.n_ids - 1) % lm_ctx.n_ids];
}

void text_window(int32_t *w, size_t start, size_t L)
{
    w[0] = first_token(start);
    memcpy(w + 1, lm_ctx.ids + start, (L - 1) * sizeof *w);
}

double window_bytes(const int32_t *w, size_t from, size_t L, size_t *tokens)
{
    double bytes = 0;
    for (size_t i = from; i < L; i++) {
        size_t len;
        lm_decode(lm_ctx.tok, w[i - 1], w[i], &len);
        bytes += (double)len;
        ++*tokens;
    }
    return bytes;
}

char **split_specs(const opt_val *v, size_t *n)
{
    char **out = NULL;
    *n = 0;
    for (int k = 0; k < v->count; k++) {
        size_t m;
        char **items = split_list("--policy", v->v[k], &m);
        for (size_t i = 0; i < m; i++) {
            if (*n > 0 && strchr(items[i], '=') && !strchr(items[i], ':')) {
                char *prev = out[*n - 1];
                size_t len = strlen(prev) + strlen(items[i]) + 2;
                out[*n - 1] = xmalloc(len);
                snprintf(out[*n - 1], len, "%s,%s", prev, items[i]);
                free(prev);
                continue;
            }
            out = xrealloc(out, (*n + 1) * sizeof *out);
            out[(*n)++] = xstrdup(items[i]);
        }
        free_list(items, m);
    }
    return out;
}

size_t budget_of(const char *s, int32_t seq_len)
{
    double p;
    size_t b = parse_budget("--budget", s, &p);
    return b ? b : budget_of_whole("--budget", s, p, (size_t)seq_len, "the context");
}

lm_state *new_state(const char *spec, size_t budget, lm_positions pos, uint64_t seed)
{
    lm_options o = {.policy = spec, .budget = budget, .positions = pos, .seed = seed,
                    .schedule = lm_ctx.budgets.schedule, .beta = lm_ctx.budgets.beta,
                    .layer_weights = lm_ctx.layer_weights,
                    .share_heads = lm_ctx.budgets.share_heads,
                    .min_share = lm_ctx.budgets.min_share, .threads = lm_ctx.threads,
                    .timing = lm_ctx.timing, .same_positions = lm_ctx.same_positions,
                    .products = lm_ctx.products,
                    .llama_cpu = lm_ctx.llama_cpu, .batch = lm_ctx.batch};
    lm_state *s = NULL;
    kve_status st = lm_state_new(lm_ctx.model, &o, &s);
    if (st != KVE_OK)
        die_lm(st, "--policy");
    if (spec && lm_ctx.heads) { /* the same mean budget, spent as the schedule says */
        const lm_config *c = &lm_ctx.model->config;
        size_t *hb = xmalloc((size_t)c->n_layers * (size_t)c->n_kv_heads * sizeof *hb);
        st = lm_heads_budgets(lm_ctx.heads, c, s->budget, lm_ctx.streaming_budget,
                              (size_t)c->seq_len, hb);
        lm_state_free(s);
        s = NULL;
        if (st != KVE_OK) {
            free(hb);
            die_lm(st, "--heads");
        }
        o.head_budgets = hb;
        st = lm_state_new(lm_ctx.model, &o, &s);
        free(hb);
        if (st != KVE_OK)
            die_lm(st, "--heads");
    }
    return s;
}

lm_heads *load_heads(const char *path, const char *what)
{
    char *text = NULL;
    size_t len = 0;
    kve_status st = lm_read_file(NULL, path, &text, &len);
    if (st != KVE_OK)
        die_input("%s: %s", what, kve_last_error());
    lm_heads *h = NULL;
    st = lm_heads_parse(text, len, NULL, &h);
    lm_free(NULL, text);
    if (st != KVE_OK)
        die_input("%s %s: %s", what, path, kve_last_error());
    const lm_config *c = &lm_ctx.model->config;
    if (h->layers != c->n_layers || h->kv_heads != c->n_kv_heads) {
        int32_t L = h->layers, G = h->kv_heads;
        lm_heads_free(h);
        die_input("%s %s: %d layers of %d KV heads, the model has %d of %d", what, path, L, G,
                  c->n_layers, c->n_kv_heads);
    }
    return h;
}

void check_budget(const char *spec, size_t budget, const char *text)
{
    char what[128];
    if (strchr(text, '%'))
        snprintf(what, sizeof what, "--budget %s (%zu of the context's %d positions)", text,
                 budget, lm_ctx.model->config.seq_len);
    else
        snprintf(what, sizeof what, "--budget %s", text);
    free(canon_spec(what, spec, budget));
}

void resolve_budget(cli_args *a)
{
    if (!a->n_budgets)
        return;
    char text[32];
    if (a->budget_pct[0] > 0)
        snprintf(text, sizeof text, "%g%%", a->budget_pct[0]);
    else
        snprintf(text, sizeof text, "%zu", a->budget);
    cli_resolve_budgets(a, (size_t)lm_ctx.model->config.seq_len, "the context");
    check_budget(a->policy, a->budget, text);
}

/* ---- the measuring commands' common part: eval, passkey, repeat, stream, prefill */

void measure_parse(measure_args *m, const cli_spec *spec, int argc, char **argv)
{
    memset(m, 0, sizeof *m);
    cli_parse(&m->a, spec, argc, argv);
    m->model = need(&m->a, spec, "model");
    m->text = need(&m->a, spec, "text");
    m->specs = split_specs(cli_own(&m->a, spec, "policy"), &m->n_specs);
    for (size_t i = 0; i < m->n_specs; i++)
        free(canon_spec("--policy", m->specs[i], 0));
    const opt_val *bv = cli_own(&m->a, spec, "budget");
    for (int k = 0; k < bv->count; k++) {
        size_t n;
        char **items = split_list("--budget", bv->v[k], &n);
        for (size_t i = 0; i < n; i++)
            budget_of(items[i], 100); /* the syntax; the size once the model is known */
        m->budgets = xrealloc(m->budgets, (m->n_budgets + n) * sizeof *m->budgets);
        memcpy(m->budgets + m->n_budgets, items, n * sizeof *items);
        m->n_budgets += n;
        free(items);
    }
    if (m->n_budgets && !m->n_specs)
        die_usage("--budget needs --policy");
    m->positions = opt_positions(own(&m->a, spec, "positions"));
    parse_threads(&m->a, spec);
    parse_batch(&m->a, spec);
    budget_args_parse(&lm_ctx.budgets, &m->a, spec);
    m->heads = own(&m->a, spec, "heads");
    const char *v = own(&m->a, spec, "streaming-budget");
    lm_ctx.streaming_budget = v ? (size_t)parse_u64("--streaming-budget", v, 1, KVE_MAX_BUDGET) : 16;
    if (v && !m->heads)
        die_usage("--streaming-budget needs --heads");
    if (m->heads && (lm_ctx.budgets.share_heads || lm_ctx.budgets.schedule != KVE_SCHEDULE_UNIFORM))
        die_usage("--heads takes neither --share-heads nor a --schedule other than uniform");
    parse_same_positions(&m->a, spec);
    if (lm_ctx.same_positions && (m->heads || lm_ctx.budgets.share_heads ||
                                  lm_ctx.budgets.schedule != KVE_SCHEDULE_UNIFORM))
        die_usage("--same-positions keeps one set of positions, so one budget: it takes neither "
                  "--heads, --share-heads nor a --schedule other than uniform");
}

/* --schedule attention: each layer's spread beyond the calibration window,
 * on BOS and the first seq_len - 1 tokens of the --calibration text. */
static void load_calibration(const char *path)
{
    char *text = NULL;
    size_t len = 0, n = 0;
    kve_status st = lm_read_file(NULL, path, &text, &len);
    if (st != KVE_OK)
        die_input("--calibration: %s", kve_last_error());
    int32_t *ids = encode(text, len, &n);
    size_t most = (size_t)lm_ctx.model->config.seq_len - 1;
    lm_ctx.layer_weights =
        xcalloc((size_t)lm_ctx.model->config.n_layers, sizeof *lm_ctx.layer_weights);
    st = lm_layer_spread(lm_ctx.model, ids, n < most ? n : most, lm_ctx.budgets.calibration_window,
                         lm_ctx.layer_weights);
    lm_free(NULL, text);
    free(ids);
    if (st != KVE_OK)
        die_input("--calibration %s: %s", path, kve_last_error());
}

void measure_load(const measure_args *m, const cli_spec *spec)
{
    load_model(m->model);
    load_tokenizer(own(&m->a, spec, "tokenizer"), m->model);
    load_text(m->text);
    encode_text(m->text);
    if (lm_ctx.budgets.calibration)
        load_calibration(lm_ctx.budgets.calibration);
    if (m->heads)
        lm_ctx.heads = load_heads(m->heads, "--heads");
}

void measure_free(measure_args *m)
{
    free_list(m->specs, m->n_specs);
    free_list(m->budgets, m->n_budgets);
}

/* The (policy, budget) jobs: job 0 is the full cache (no policy), then every
 * spec at every budget, budgets outermost. */
job *jobs_new(const measure_args *m, size_t *n_jobs)
{
    size_t nb = m->n_budgets ? m->n_budgets : 1;
    job *jobs = xcalloc(1 + m->n_specs * nb, sizeof *jobs);
    jobs[0].s = new_state(NULL, 0, m->positions, m->a.seed);
    size_t n = 1;
    size_t span = m->span ? m->span : (size_t)lm_ctx.model->config.seq_len;
    for (size_t b = 0; b < nb; b++) {
        size_t budget = m->n_budgets ? budget_of(m->budgets[b], lm_ctx.model->config.seq_len) : 0;
        for (size_t i = 0; i < m->n_specs; i++) {
            if (budget)
                check_budget(m->specs[i], budget, m->budgets[b]);
            jobs[n].s = new_state(m->specs[i], budget, m->positions, m->a.seed);
            jobs[n].spec = xstrdup(jobs[n].s->spec);
            jobs[n].budget = jobs[n].s->budget;
            /* A step attends over the kept keys and its own: at budget B >= span - 1
             * no key is gone before the last step, as `eval` warns of a budget
             * with no scored step. Once per budget. */
            size_t k = 1;
            while (k < n && jobs[k].budget != jobs[n].budget)
                k++;
            if (k == n && jobs[n].budget + 1 >= span)
                warn("no key is ever evicted at budget %zu: %s decodes at most %zu positions, "
                     "each step attending over the budget and its own key; the rows at this "
                     "budget equal the full cache's",
                     jobs[n].budget, m->span_name ? m->span_name : "a window of the context",
                     span);
            n++;
        }
    }
    *n_jobs = n;
    return jobs;
}

void jobs_free(job *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        lm_state_free(jobs[i].s);
        free(jobs[i].spec);
    }
    free(jobs);
}

void job_cells(table *t, const job *jb, lm_positions positions)
{
    table_str(t, jb->spec ? jb->spec : "full");
    if (jb->spec)
        table_uint(t, jb->budget);
    else
        table_real(t, NAN, "%.0f");
    table_str(t, positions_name(positions));
    budget_cells(t, &lm_ctx.budgets, jb->spec ? jb->s->layer_budget : NULL,
                 (size_t)lm_ctx.model->config.n_layers);
    if (lm_ctx.same_positions) /* the full cache's row keeps every position anyway */
        table_real(t, jb->spec ? 1.0 : NAN, "%.0f");
    if (lm_ctx.heads) { /* the budget of every (layer, KV head), layer-major */
        char list[1024] = "";
        const lm_config *c = &lm_ctx.model->config;
        for (size_t i = 0; jb->spec && i < (size_t)c->n_layers * (size_t)c->n_kv_heads; i++) {
            size_t len = strlen(list);
            if (len + 24 < sizeof list)
                snprintf(list + len, sizeof list - len, "%s%zu", i ? "," : "", jb->s->head_budget[i]);
        }
        table_str(t, list);
    }
}

size_t job_cols(col *cols, const col *rest, size_t n_rest)
{
    size_t n = 0;
    cols[n++] = (col){"policy", KEY_POLICY, COL_ALL | COL_LEFT | COL_CODE};
    cols[n++] = (col){"budget", KEY_BUDGET, COL_ALL};
    cols[n++] = (col){"positions", "positions", COL_CSV | COL_JSON};
    n = budget_cols(cols, n, &lm_ctx.budgets);
    if (lm_ctx.same_positions)
        cols[n++] = (col){"same positions", "same_positions", COL_CSV | COL_JSON};
    if (lm_ctx.heads)
        cols[n++] = (col){"head budgets", "head_budgets", COL_ALL | COL_LEFT};
    memcpy(cols + n, rest, n_rest * sizeof *rest);
    return n + n_rest;
}

size_t *distances(const opt_val *list, size_t lo, size_t hi, int with_lo, size_t *n)
{
    size_t *d = xmalloc((hi / 64 + 3) * sizeof *d);
    *n = 0;
    if (list->count) {
        size_t m;
        char **items = split_lists("--distances", list, &m);
        d = xrealloc(d, m * sizeof *d);
        for (size_t i = 0; i < m; i++) {
            d[i] = (size_t)parse_u64("--distances", items[i], 0, SIZE_MAX / 2);
            if (d[i] < lo || d[i] > hi) {
                free_list(items, m);
                die_usage("--distances: %zu is outside the valid range [%zu, %zu] for this "
                          "model and prompt",
                          d[i], lo, hi);
            }
        }
        free_list(items, m);
        *n = m;
        return d;
    }
    if (with_lo)
        d[(*n)++] = lo;
    for (size_t x = 64; x <= hi; x += 64)
        if (x >= lo && (!*n || x > d[*n - 1]))
            d[(*n)++] = x;
    if (!*n || d[*n - 1] != hi)
        d[(*n)++] = hi;
    return d;
}

/* ---- the prompts of lm passkey, lm repeat and lm prefill ----------------------
 *
 * The prompts of the training engineer's models/README.md, rebuilt from
 * token ids: H is the text encoded once (dummy prefix, no BOS/EOS), enc(s)
 * run.c's encode of s, L = seq_len.
 *   pass key, trial j at distance d:
 *     [BOS] F1 enc(INTRO) KEY enc(AFTER) F2 enc(QUESTION), exactly L tokens;
 *     KEY = "<keyNN>", NN = j mod 64, at position k = L-1-d; f1 = k-1-a,
 *     m = L-2-a-b-q (a, b, q the segments' lengths), s = j (|H| - m) / N,
 *     F1 = H[s, s+f1), F2 = H[s+f1, s+m). Scored: the argmax at L-1 is KEY.
 *   repeated passage, trial j at distance r, span P:
 *     W = [BOS] H[s, s+L-1), s = j (|H| - (L-1)) / N, then W[L-P+i] =
 *     W[L-P-r+i] for i < P; scored: the mean loss over i = 1..P-1 of each
 *     occurrence's tokens, each predicted from the position before it.
 */

static const char *const PK_INTRO = "The pass key is #";
static const char *const PK_AFTER = "Remember it.";
static const char *const PK_QUESTION = "What is the pass key? The pass key is #";
void pk_load(pk_template *p)
{
    p->intro = encode(PK_INTRO, strlen(PK_INTRO), &p->na);
    p->after = encode(PK_AFTER, strlen(PK_AFTER), &p->nb);
    p->question = encode(PK_QUESTION, strlen(PK_QUESTION), &p->nq);
    for (int k = 0; k < PK_KEYS; k++) {
        char name[16];
        snprintf(name, sizeof name, "<key%02d>", k);
        p->keys[k] = lm_piece_id(lm_ctx.tok, name, strlen(name));
        if (p->keys[k] < 0)
            die_input("--tokenizer: no piece %s (the pass keys are <key00> .. <key63>)", name);
    }
}

void pk_free(pk_template *p)
{
    free(p->intro), free(p->after), free(p->question);
}

int32_t pk_prompt(const pk_template *p, size_t L, size_t j, size_t N, size_t d, int32_t *w)
{
    size_t na = p->na, nb = p->nb, nq = p->nq;
    size_t k = L - 1 - d, f1 = k - 1 - na, m = L - 2 - na - nb - nq;
    size_t s = (size_t)((uint64_t)j * (lm_ctx.n_ids - m) / N), o = 0;
    int32_t key = p->keys[j % PK_KEYS];
    w[o++] = first_token(s);
    memcpy(w + o, lm_ctx.ids + s, f1 * sizeof *w), o += f1;
    memcpy(w + o, p->intro, na * sizeof *w), o += na;
    w[o++] = key;
    memcpy(w + o, p->after, nb * sizeof *w), o += nb;
    memcpy(w + o, lm_ctx.ids + s + f1, (m - f1) * sizeof *w), o += m - f1;
    memcpy(w + o, p->question, nq * sizeof *w);
    return key;
}
