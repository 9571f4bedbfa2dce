/*
 * test_lm_golden.c - the decoder against files written by torch: the tiny
 * models of tests/fixtures/lm/ (legacy and version 1, tied and untied) and
 * their logits, the tokenizer fixtures' encodings, the committed model of
 * models/ with its golden prompt, and its committed q/K trace.
 *
 * Tolerance: |logit - torch| <= 1e-4 (absolute). Both sides compute in
 * float32, in different orders (torch batches the positions and sums its
 * matrix products its own way; the decoder uses 8-lane sums), and torch's
 * rotary angles come from its own float computation; on these files the
 * difference measures below 1e-5 with logits up to about 6 (the test
 * prints the worst), while a misread tensor, a wrong rotation or a wrong
 * cache moves logits by 0.1 or more. Encodings must match exactly.
 *
 * The files are found in $KVE_LM_FIXTURES (default
 * $KVE_SOURCE_DIR/tests/fixtures/lm) and $KVE_LM_MODELS (default
 * $KVE_SOURCE_DIR/models). When a set is absent the test says so and skips
 * it; when both are absent it exits 77, which CTest reports as skipped.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "kvevict.h"
#include "lm.h"
#include "lm_check.h"
#include "lm_fixture.h"

#include <unistd.h>

enum { MAX_POS = 64 };
#define TOL 1e-4

static char fixtures[512], models[512];

static const char *in(const char *dir, const char *name)
{
    static char buf[2][1100];
    static int which;
    which ^= 1;
    snprintf(buf[which], sizeof buf[which], "%s/%s", dir, name);
    return buf[which];
}

/* Decodes the golden file's tokens with `model` and holds every logit to
 * the file's within TOL. */
static void check_logits(const char *model, const char *golden)
{
    lm_model *m = NULL;
    ASSERT_OK(lm_model_open(model, NULL, &m));
    char *text = fx_slurp(golden, NULL);
    ASSERT_TRUE(text != NULL);
    int32_t V = m->config.vocab_size, toks[MAX_POS];
    float *want = malloc((size_t)MAX_POS * (size_t)V * sizeof *want);
    size_t n = fx_parse_logits(text, V, want, toks, MAX_POS);
    free(text);
    if (n == (size_t)-1 || n == 0) {
        free(want);
        lm_model_free(m);
        CHECK_FAIL_AT("%s: not a logits file for vocabulary %d", golden, V);
    }
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, NULL, &s));
    double worst = 0;
    size_t bad_t = SIZE_MAX;
    int32_t bad_i = 0;
    for (size_t t = 0; t < n && bad_t == SIZE_MAX; t++) {
        if (lm_forward(s, toks[t]) != KVE_OK)
            break;
        for (int32_t i = 0; i < V; i++) {
            double d = fabs((double)s->logits[i] - (double)want[t * (size_t)V + (size_t)i]);
            worst = d > worst ? d : worst;
            if (!(d <= TOL) && bad_t == SIZE_MAX)
                bad_t = t, bad_i = i;
        }
    }
    printf("  %-28s %zu positions, worst |logit - torch| %.2e\n", strrchr(model, '/') + 1, n,
           worst);
    ASSERT_EQ(s->pos, n);
    lm_state_free(s);
    lm_model_free(m);
    free(want);
    if (bad_t != SIZE_MAX)
        CHECK_FAIL_AT("%s: position %zu logit %d off by more than %g", model, bad_t, bad_i, TOL);
}

/* A JSON string literal at *p (after the opening quote) into out as UTF-8;
 * advances *p past the closing quote. Returns the length, or -1. */
static long json_str(const char **p, char *out, size_t cap)
{
    const char *s = *p;
    size_t n = 0;
    while (*s && *s != '"') {
        unsigned cp;
        if (*s != '\\') {
            cp = (unsigned char)*s++;
            if (n + 1 > cap)
                return -1;
            out[n++] = (char)cp;
            continue;
        }
        s++;
        char e = *s++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (simple && e) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            cp = (unsigned char)map[simple - "\"\\/bfnrt"];
        } else if (e == 'u') {
            if (sscanf(s, "%4x", &cp) != 1)
                return -1;
            s += 4;
            if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
                unsigned lo;
                if (s[0] != '\\' || s[1] != 'u' || sscanf(s + 2, "%4x", &lo) != 1)
                    return -1;
                s += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
        } else {
            return -1;
        }
        unsigned char u[4];
        size_t k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (k == 1)
            u[0] = (unsigned char)cp;
        else {
            for (size_t j = k - 1; j > 0; j--, cp >>= 6)
                u[j] = (unsigned char)(0x80 | (cp & 0x3F));
            u[0] = (unsigned char)((k == 2 ? 0xC0 : k == 3 ? 0xE0 : 0xF0) | cp);
        }
        if (n + k > cap)
            return -1;
        memcpy(out + n, u, k);
        n += k;
    }
    if (*s != '"')
        return -1;
    *p = s + 1;
    return (long)n;
}

/* Each line {"text": "...", "tokens": [...]} must encode exactly so. */
static void check_encodings(const char *tokenizer, const char *cases)
{
    lm_tokenizer *t = NULL;
    ASSERT_OK(lm_tokenizer_open(tokenizer, NULL, &t));
    char *text = fx_slurp(cases, NULL);
    ASSERT_TRUE(text != NULL);
    int lines = 0, bad = 0;
    for (const char *p = text; *p;) {
        char str[4096];
        const char *q = strstr(p, "{\"text\": \"");
        long len = q ? (q += 10, json_str(&q, str, sizeof str)) : -1;
        q = len >= 0 ? strstr(q, "\"tokens\": [") : NULL;
        if (!q) {
            bad++;
            break;
        }
        q += 11;
        int32_t want[1024], got[4200];
        size_t nw = 0, ng = 0;
        while (*q != ']' && nw < 1024) {
            char *end;
            want[nw++] = (int32_t)strtol(q, &end, 10);
            q = end;
            if (*q == ',')
                q++;
            while (*q == ' ')
                q++;
        }
        lines++;
        if (lm_encode(t, str, (size_t)len, got, 4200, &ng) != KVE_OK || ng != nw ||
            memcmp(got, want, nw * sizeof *got) != 0) {
            fprintf(stderr, "%s line %d: the encoding differs\n", cases, lines);
            bad++;
        }
        p = strchr(q, '\n');
        p = p ? p + 1 : q + strlen(q);
    }
    printf("  %-28s %d texts\n", strrchr(cases, '/') + 1, lines);
    free(text);
    lm_tokenizer_free(t);
    ASSERT_TRUE(lines > 0);
    ASSERT_EQ(bad, 0);
}

static void test_tiny_models(void)
{
    static const char *const files[4][2] = {{"tiny-tied.bin", "tiny-tied.logits.jsonl"},
                                            {"tiny-tied-v1.bin", "tiny-tied.logits.jsonl"},
                                            {"tiny-untied.bin", "tiny-untied.logits.jsonl"},
                                            {"tiny-untied-v1.bin", "tiny-untied.logits.jsonl"}};
    for (int i = 0; i < 4; i++) {
        char model[1100];
        snprintf(model, sizeof model, "%s", in(fixtures, files[i][0]));
        check_logits(model, in(fixtures, files[i][1]));
    }
    check_encodings(in(fixtures, "tiny-tokenizer.bin"), in(fixtures, "tiny-tokenizer.jsonl"));
}

static void test_committed_model(void)
{
    char model[1100];
    snprintf(model, sizeof model, "%s", in(models, "kjv.bin"));
    check_logits(model, in(models, "golden.jsonl"));
    if (access(in(fixtures, "kjv-encodings.jsonl"), R_OK) == 0) {
        char tok[1100];
        snprintf(tok, sizeof tok, "%s", in(models, "tokenizer.bin"));
        check_encodings(tok, in(fixtures, "kjv-encodings.jsonl"));
    }
}

/* models/kjv.qk is what `kvevict lm dump --qk --steps 512` writes from the
 * committed model and heldout.txt: BOS then the text's first 511 tokens,
 * the rotated queries (L, H, 512, S) and keys (L, G, 512, S), float32. The
 * decoder is deterministic, so the file must hold exactly the vectors it
 * hands on_qk (bit for bit); a stale file fails here. */
typedef struct qk_file {
    const float *q, *k; /* into the file's data */
    size_t H, G, T, S;
    size_t mismatches;
} qk_file;

static void compare_qk(void *user, int32_t layer, int32_t pos, const float *q, const float *k)
{
    qk_file *f = user;
    size_t l = (size_t)layer, t = (size_t)pos, S = f->S;
    for (size_t h = 0; h < f->H; h++)
        f->mismatches += memcmp(q + h * S, f->q + ((l * f->H + h) * f->T + t) * S,
                                S * sizeof(float)) != 0;
    for (size_t g = 0; g < f->G; g++)
        f->mismatches += memcmp(k + g * S, f->k + ((l * f->G + g) * f->T + t) * S,
                                S * sizeof(float)) != 0;
}

static void test_committed_qk_trace(void)
{
    size_t size = 0;
    char *bytes = fx_slurp(in(models, "kjv.qk"), &size);
    ASSERT_TRUE(bytes != NULL);
    lm_model *m = NULL;
    ASSERT_OK(lm_model_open(in(models, "kjv.bin"), NULL, &m));
    lm_tokenizer *tok = NULL;
    ASSERT_OK(lm_tokenizer_open(in(models, "tokenizer.bin"), NULL, &tok));
    size_t tlen = 0;
    char *text = fx_slurp(in(models, "heldout.txt"), &tlen);
    ASSERT_TRUE(text != NULL);
    int32_t *ids = malloc((tlen + 1) * sizeof *ids);
    size_t n = 0;
    ASSERT_OK(lm_encode(tok, text, tlen, ids, tlen + 1, &n));
    const lm_config *c = &m->config;
    qk_file f = {0};
    f.H = (size_t)c->n_heads;
    f.G = (size_t)c->n_kv_heads;
    f.T = 512;
    f.S = (size_t)c->head_size;
    /* two version 1.0 headers: the data of each starts at the 10-byte
     * preamble plus its little-endian header length */
    size_t q_off = 10 + (size_t)(unsigned char)bytes[8] + 256u * (unsigned char)bytes[9];
    size_t q_bytes = (size_t)c->n_layers * f.H * f.T * f.S * sizeof(float);
    ASSERT_TRUE(size > q_off + q_bytes + 10);
    size_t k_at = q_off + q_bytes;
    size_t k_off = k_at + 10 + (size_t)(unsigned char)bytes[k_at + 8] +
                   256u * (unsigned char)bytes[k_at + 9];
    ASSERT_EQ(size, k_off + (size_t)c->n_layers * f.G * f.T * f.S * sizeof(float));
    f.q = (const float *)(const void *)(bytes + q_off);
    f.k = (const float *)(const void *)(bytes + k_off);
    lm_options opt = {.on_qk = compare_qk, .user = &f};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    for (size_t t = 0; t < f.T; t++)
        ASSERT_OK(lm_forward(s, t ? ids[t - 1] : LM_BOS));
    ASSERT_EQ(f.mismatches, 0);
    lm_state_free(s);
    free(ids);
    free(text);
    free(bytes);
    lm_tokenizer_free(tok);
    lm_model_free(m);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    const char *src = getenv("KVE_SOURCE_DIR");
    const char *f = getenv("KVE_LM_FIXTURES"), *m = getenv("KVE_LM_MODELS");
    snprintf(fixtures, sizeof fixtures, "%s%s",
             f     ? f
             : src ? src
                   : ".",
             f ? "" : "/tests/fixtures/lm");
    snprintf(models, sizeof models, "%s%s", m ? m : src ? src : ".", m ? "" : "/models");
    int have_fixtures = access(in(fixtures, "tiny-tied.bin"), R_OK) == 0;
    int have_models = access(in(models, "golden.jsonl"), R_OK) == 0;
    if (!have_fixtures && !have_models) {
        printf("skipped: no fixtures in %s and no model in %s\n", fixtures, models);
        return 77;
    }
    if (have_fixtures)
        RUN(test_tiny_models);
    else
        printf("skipped test_tiny_models: no fixtures in %s\n", fixtures);
    if (have_models)
        RUN(test_committed_model);
    if (have_models && access(in(models, "kjv.qk"), R_OK) == 0)
        RUN(test_committed_qk_trace);
    else
        printf("skipped test_committed_model: no model in %s\n", models);
    return CHECK_DONE();
}
