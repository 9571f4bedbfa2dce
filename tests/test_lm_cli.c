/*
 * test_lm_cli.c - `kvevict lm ...` and `kvevict generate` as a user runs
 * them: output formats parsed back, numbers compared with the decoder
 * library run in this process, exit codes and one-line errors.
 *
 * The fixtures (a tiny model in three checkpoint variants, a tokenizer with
 * the 64 pass keys, a text) are written by the test (tests/lm_fixture.h).
 * Logits printed by the CLI must parse back to the library's float32 bits
 * exactly (the promise of full precision). The pass-key and repeated-passage
 * prompts are rebuilt here from the template of models/README.md, on their
 * own, and scored with the library: the CLI must agree. JSON Lines and CSV
 * go through tests/outcheck.c, the strict checker of the other CLI tests.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "kvevict_eval.h"
#include "lm.h"
#include "lm_check.h"
#include "lm_fixture.h"
#include "test_allocator.h"
#include "tmpdir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char kvevict[512], outcheck[512], convert[512];
static char *out_text, *err_text;
static size_t out_len;

/* Runs `kvevict ARGS` (a shell word list), capturing stdout and stderr; the
 * exit status. */
static int run(const char *args)
{
    char cmd[8192], o[400], e[400];
    snprintf(o, sizeof o, "%s", path_of("stdout"));
    snprintf(e, sizeof e, "%s", path_of("stderr"));
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", kvevict, args, o, e);
    int rc = system(cmd);
    free(out_text);
    free(err_text);
    out_text = fx_slurp(o, &out_len);
    err_text = fx_slurp(e, NULL);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* The failure convention: exit `code`, stdout empty, exactly one stderr line
 * "kvevict CMD: ..." containing `needle`. */
#define ASSERT_FAILS(args, code, cmd, needle)                                                      \
    do {                                                                                           \
        int rc_ = run(args);                                                                       \
        if (rc_ != (code))                                                                         \
            CHECK_FAIL_AT("kvevict %s: exit %d, want %d (stderr: %s)", args, rc_, code,            \
                          err_text ? err_text : "");                                               \
        ASSERT_TRUE(out_len == 0);                                                                 \
        ASSERT_TRUE(strncmp(err_text, "kvevict " cmd ": ", strlen("kvevict " cmd ": ")) == 0);     \
        ASSERT_TRUE(strchr(err_text, '\n') == strrchr(err_text, '\n'));                            \
        ASSERT_CONTAINS(err_text, needle);                                                         \
    } while (0)

#define ASSERT_RUNS(args)                                                                          \
    do {                                                                                           \
        int rc_ = run(args);                                                                       \
        if (rc_ != 0)                                                                              \
            CHECK_FAIL_AT("kvevict %s: exit %d (stderr: %s)", args, rc_,                           \
                          err_text ? err_text : "");                                               \
    } while (0)

/* Fixture paths (in the scratch directory). */
static char model0[400], model1[400], model_untied[400], tokpath[400], textpath[400];
static lm_model *lib_model, *lib_model1; /* model0, model1 */
static lm_tokenizer *lib_tok;
static char *text;
static size_t text_len;

enum { D_ = 16, F_ = 24, L_ = 2, H_ = 4, G_ = 2, T_ = 128 };

static void make_fixtures(void)
{
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, FX_PIECES, T_, 1, check_seed);
    snprintf(model0, sizeof model0, "%s", path_of("model.bin"));
    snprintf(model1, sizeof model1, "%s", path_of("model_v1.bin"));
    fx_write_model(&fx, 0, model0);
    fx_write_model(&fx, 1, model1);
    fx_model_free(&fx);
    fx_model_init(&fx, D_, F_, L_, H_, G_, FX_PIECES, T_, 0, check_seed + 1);
    snprintf(model_untied, sizeof model_untied, "%s", path_of("untied.bin"));
    fx_write_model(&fx, 0, model_untied);
    fx_model_free(&fx);
    size_t n;
    unsigned char *img = fx_tokenizer_image(&n);
    snprintf(tokpath, sizeof tokpath, "%s", path_of("tokenizer.bin"));
    fx_write_file(tokpath, img, n);
    free(img);
    /* A text of a few hundred tokens, with multi-byte characters. */
    static const char *const words[] = {"the", "cab", "bat",          "a",   "tea",  "caf\xc3\xa9",
                                        "hat", "ab",  "\xe2\x82\xac", "bee", "that", "ace"};
    char buf[4096];
    size_t len = 0;
    uint64_t s = 99;
    while (len < 1500) {
        const char *w = words[fx_next(&s) % (sizeof words / sizeof words[0])];
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", w,
                                fx_next(&s) % 9 == 0 ? ".\n" : " ");
    }
    snprintf(textpath, sizeof textpath, "%s", path_of("text.txt"));
    fx_write_file(textpath, buf, len);
    text = malloc(len);
    memcpy(text, buf, len);
    text_len = len;
}

/* The library's logits for `tokens` under `opt`. */
static void lib_logits(const int32_t *tokens, size_t n, const lm_options *opt, float *out)
{
    lm_state *s = NULL;
    if (lm_state_new(lib_model, opt, &s) != KVE_OK)
        return;
    for (size_t t = 0; t < n; t++) {
        if (lm_forward(s, tokens[t]) != KVE_OK)
            break;
        memcpy(out + t * FX_PIECES, s->logits, FX_PIECES * sizeof(float));
    }
    lm_state_free(s);
}

static void test_logits(void)
{
    static const int32_t toks[5] = {3, 1, 4, 1, 5};
    float *got = malloc(8 * FX_PIECES * sizeof(float)),
          *want = malloc(8 * FX_PIECES * sizeof(float));
    int32_t back[8];
    struct {
        const char *extra;
        lm_options opt;
    } cases[] = {
        {"", {0}},
        {"--policy full", {.policy = "full"}},
        {"--policy window:budget=2 --positions cache",
         {.policy = "window:budget=2", .positions = LM_POS_CACHE}},
        {"--policy h2o:recent_window=1 --budget 3", {.policy = "h2o:recent_window=1", .budget = 3}},
    };
    const char *models[2] = {model0, model1};
    char *first = NULL;
    for (int m = 0; m < 2; m++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            char args[4096];
            snprintf(args, sizeof args, "lm logits --model %s --tokens 3,1,4,1,5 %s", models[m],
                     cases[c].extra);
            ASSERT_RUNS(args);
            ASSERT_EQ(fx_parse_logits(out_text, FX_PIECES, got, back, 8), 5);
            ASSERT_TRUE(memcmp(back, toks, sizeof toks) == 0);
            lib_logits(toks, 5, &cases[c].opt, want);
            ASSERT_TRUE(memcmp(got, want, 5 * FX_PIECES * sizeof(float)) == 0);
            if (m == 0 && c == 0)
                first = strdup(out_text);
            if (c == 1) /* --policy full prints exactly what no policy prints */
                ASSERT_STR_EQ(out_text, first);
            ASSERT_TRUE(err_text[0] == '\0');
        }
    }
    /* --prompt: BOS, then the encoding; -o writes the same bytes to a file. */
    char args[4096];
    snprintf(args, sizeof args, "lm logits --model %s --tokenizer %s --prompt 'the cab' -o %s",
             model0, tokpath, path_of("logits.jsonl"));
    ASSERT_RUNS(args);
    ASSERT_TRUE(out_len == 0);
    char *file = fx_slurp(path_of("logits.jsonl"), NULL);
    ASSERT_TRUE(file != NULL);
    int32_t enc[16];
    size_t ne;
    ASSERT_OK(lm_encode(lib_tok, "the cab", 7, enc + 1, 15, &ne));
    enc[0] = LM_BOS;
    ASSERT_EQ(fx_parse_logits(file, FX_PIECES, got, back, 8), ne + 1);
    ASSERT_TRUE(memcmp(back, enc, (ne + 1) * sizeof *enc) == 0);
    free(file);
    /* Without --tokenizer, tokenizer.bin beside the model is used. */
    snprintf(args, sizeof args, "lm logits --model %s --prompt 'the cab'", model0);
    ASSERT_RUNS(args);
    ASSERT_EQ(fx_parse_logits(out_text, FX_PIECES, got, back, 8), ne + 1);
    free(first);
    free(got);
    free(want);
}

static void test_errors(void)
{
    char args[4096];
    ASSERT_FAILS("lm logits --tokens 1,2", 2, "lm logits", "missing required option '--model'");
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1,x", model0);
    ASSERT_FAILS(args, 2, "lm logits", "--tokens");
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1,,2", model0);
    ASSERT_FAILS(args, 2, "lm logits", "empty item");
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1,%d", model0, FX_PIECES);
    ASSERT_FAILS(args, 2, "lm logits", "outside the model's vocabulary");
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1 --policy h2o:budget=0", model0);
    ASSERT_FAILS(args, 2, "lm logits", "--policy");
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1 --positions shifted", model0);
    ASSERT_FAILS(args, 2, "lm logits", "--positions");
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1 --prompt x", model0);
    ASSERT_FAILS(args, 2, "lm logits", "exactly one of --tokens and --prompt");
    ASSERT_FAILS("lm logits --model /nonexistent/m.bin --tokens 1", 1, "lm logits",
                 "No such file or directory");
    ASSERT_FAILS("lm bogus", 2, "lm", "unknown command 'bogus'");
    ASSERT_FAILS("lm", 2, "lm", "missing command");
    /* A truncated checkpoint names the field it ends in. */
    size_t n = 0;
    char *img = fx_slurp(model0, &n);
    fx_write_file(path_of("cut.bin"), img, 10);
    fx_write_file(path_of("long.bin"), img, n); /* then one byte more */
    FILE *f = fopen(path_of("long.bin"), "ab");
    fputc(0, f);
    fclose(f);
    free(img);
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1", path_of("cut.bin"));
    ASSERT_FAILS(args, 1, "lm logits", "truncated in the field n_layers");
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1", path_of("long.bin"));
    ASSERT_FAILS(args, 1, "lm logits", "the file holds");
    /* A tokenizer that does not match the model. */
    snprintf(args, sizeof args, "lm eval --model %s --tokenizer %s --text %s", model0,
             path_of("cut.bin"), textpath);
    ASSERT_FAILS(args, 1, "lm eval", "--tokenizer");
    snprintf(args, sizeof args, "lm eval --model %s --text %s --budget 10%%", model0, textpath);
    ASSERT_FAILS(args, 2, "lm eval", "--budget needs --policy");
    snprintf(args, sizeof args, "lm eval --model %s --text %s --policy window --budget 0%%", model0,
             textpath);
    ASSERT_FAILS(args, 2, "lm eval", "not a percentage");
    snprintf(args, sizeof args, "lm eval --model %s --text %s --json --csv", model0, textpath);
    ASSERT_FAILS(args, 2, "lm eval", "contradict each other");
    snprintf(args, sizeof args, "lm dump --model %s --text %s --steps 9999 -o %s", model0, textpath,
             path_of("x.npy"));
    ASSERT_FAILS(args, 2, "lm dump", "--steps 9999");
    ASSERT_TRUE(access(path_of("x.npy"), F_OK) != 0);
    snprintf(args, sizeof args, "lm passkey --model %s --text %s --distances 1", model0, textpath);
    ASSERT_FAILS(args, 2, "lm passkey", "--distances: 1 is outside the valid range");
    snprintf(args, sizeof args, "generate --model %s --steps x", model0);
    ASSERT_FAILS(args, 2, "generate", "--steps");
    remove(path_of("cut.bin"));
    remove(path_of("long.bin"));
}

/* Pulls "key": number out of a JSON line; NAN if absent or null. */
static double json_num(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    if (!p || strncmp(p + strlen(pat), "null", 4) == 0)
        return NAN;
    return strtod(p + strlen(pat), NULL);
}

static void test_eval(void)
{
    char args[4096];
    snprintf(args, sizeof args,
             "lm eval --model %s --text %s --policy window,h2o:recent_window=2 --budget 5,50%% "
             "--json",
             model_untied, textpath);
    ASSERT_RUNS(args);
    /* The library: windows of seq_len - 1 tokens after BOS. */
    int32_t *ids = malloc((text_len + 1) * sizeof *ids);
    size_t n;
    ASSERT_OK(lm_encode(lib_tok, text, text_len, ids, text_len + 1, &n));
    lm_model *m = NULL;
    ASSERT_OK(lm_model_open(model_untied, NULL, &m));
    const char *specs[5] = {NULL, "window:budget=5", "h2o:budget=5,recent_window=2",
                            "window:budget=64", "h2o:budget=64,recent_window=2"};
    const char *line = out_text;
    for (int j = 0; j < 5; j++) {
        lm_options opt = {.policy = specs[j]};
        lm_state *s = NULL;
        ASSERT_OK(lm_state_new(m, &opt, &s));
        double bits = 0;
        size_t chunk = T_ - 1;
        for (size_t w = 0; w * chunk < n; w++) {
            double nats;
            size_t len = n - w * chunk < chunk ? n - w * chunk : chunk;
            ASSERT_OK(lm_window_nats(s, ids + w * chunk, len, &nats, NULL));
            bits += nats / log(2.0);
        }
        lm_state_free(s);
        ASSERT_TRUE(line && *line);
        char spec_json[128];
        snprintf(spec_json, sizeof spec_json, "{\"policy\": \"%s\"", specs[j] ? specs[j] : "full");
        ASSERT_TRUE(strncmp(line, spec_json, strlen(spec_json)) == 0);
        ASSERT_NEAR(json_num(line, "bits_per_byte"), bits / (double)(text_len + 1), 1e-12);
        ASSERT_NEAR(json_num(line, "bits_per_token"), bits / (double)n, 1e-12);
        ASSERT_EQ(json_num(line, "tokens"), n);
        ASSERT_EQ(json_num(line, "windows"), (n + T_ - 2) / (T_ - 1));
        ASSERT_TRUE(json_num(line, "bits_per_byte_se") > 0);
        if (j == 0) {
            ASSERT_TRUE(strstr(line, "\"budget\": null") != NULL);
            ASSERT_TRUE(isnan(json_num(line, "delta_bits_per_byte_se")));
        } else {
            ASSERT_TRUE(json_num(line, "delta_bits_per_byte_se") > 0);
        }
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    ASSERT_TRUE(line && *line == '\0');
    lm_model_free(m);
    free(ids);
    /* Tables: text with a title line, csv with snake_case headers, md. */
    snprintf(args, sizeof args, "lm eval --model %s --text %s --policy window --budget 4 --csv",
             model0, textpath);
    ASSERT_RUNS(args);
    static const char csv_head[] = "policy,budget,positions,windows,tokens,bytes,bits_per_byte,"
                                   "bits_per_byte_se,bits_per_token,full_bits_per_byte,"
                                   "delta_bits_per_byte,delta_bits_per_byte_se,seed\n"
                                   "full,n/a,original,";
    ASSERT_TRUE(strncmp(out_text, csv_head, strlen(csv_head)) == 0);
    ASSERT_CONTAINS(out_text, "\nwindow:budget=4,4,original,");
    snprintf(args, sizeof args, "lm eval --model %s --text %s --format md", model0, textpath);
    ASSERT_RUNS(args);
    ASSERT_TRUE(strncmp(out_text, "| policy", 8) == 0);
    snprintf(args, sizeof args, "lm eval --model %s --text %s", model0, textpath);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(out_text, "windows of up to 127 tokens");
}

/* --batch N: the same output, byte for byte, for every block size (1: one
 * token at a time) in the commands that read prompts and texts, in the
 * exact products and llama.cpp's in each CPU variant; 0 refused. */
static void test_batch_option(void)
{
    static const char *const cmds[] = {
        "lm logits --model %s --tokens 1,3,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3 --policy h2o:budget=6,recent_window=2",
        "lm eval --model %s --text %s --policy window,h2o:recent_window=2 --budget 5 --json",
        "lm stream --model %s --text %s --policy h2o:recent_window=2 --budget 6 --tokens 300 --bin 64 --json",
        "generate --model %s --prompt 'the cab bat' --steps 6 --policy knorm:recent_window=1 --budget 6",
    };
    static const char *const products[] = {"", " --products llama:avx2",
                                           " --products llama:avx512",
                                           " --products llama:avx512-bf16"};
    for (size_t k = 0; k < sizeof cmds / sizeof cmds[0] * 4; k++) {
        const size_t i = k / 4;
        char args[4096], fmt[512], *want = NULL;
        for (int b = 0; b < 3; b++) {
            static const char *const batch[] = {"", " --batch 1", " --batch 3"};
            snprintf(fmt, sizeof fmt, "%s%s%s", cmds[i], products[k % 4], batch[b]);
            snprintf(args, sizeof args, fmt, model_untied, textpath);
            ASSERT_RUNS(args);
            if (!b) {
                want = malloc(out_len + 1);
                memcpy(want, out_text, out_len + 1);
            } else if (strcmp(out_text, want) != 0) {
                free(want);
                CHECK_FAIL_AT("%s: the output differs from --batch 64's", args);
            }
        }
        free(want);
    }
    char args[1024];
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1,2 --batch 0", model0);
    ASSERT_FAILS(args, 2, "lm logits", "--batch");
}

/* --same-positions: eval's rows are the library's decoder with
 * lm_options.same_positions (one bank, one eviction a step for every head)
 * and carry same_positions 1 (null for the full cache); logits equal the
 * library's; what it cannot go with is refused. */
static void test_same_positions_cli(void)
{
    char args[4096];
    snprintf(args, sizeof args,
             "lm eval --model %s --text %s --policy h2o:recent_window=2 --budget 6 --json "
             "--same-positions",
             model_untied, textpath);
    ASSERT_RUNS(args);
    int32_t *ids = malloc((text_len + 1) * sizeof *ids);
    size_t n;
    ASSERT_OK(lm_encode(lib_tok, text, text_len, ids, text_len + 1, &n));
    lm_model *m = NULL;
    ASSERT_OK(lm_model_open(model_untied, NULL, &m));
    lm_options opt = {.policy = "h2o:budget=6,recent_window=2", .same_positions = 1};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(m, &opt, &s));
    double bits = 0;
    size_t chunk = T_ - 1;
    for (size_t w = 0; w * chunk < n; w++) {
        double nats;
        size_t len = n - w * chunk < chunk ? n - w * chunk : chunk;
        ASSERT_OK(lm_window_nats(s, ids + w * chunk, len, &nats, NULL));
        bits += nats / log(2.0);
    }
    lm_state_free(s);
    const char *row = strchr(out_text, '\n');
    ASSERT_TRUE(row != NULL);
    ASSERT_CONTAINS(out_text, "\"same_positions\": null");
    ASSERT_CONTAINS(row, "\"same_positions\": 1");
    ASSERT_NEAR(json_num(row + 1, "bits_per_byte"), bits / (double)(text_len + 1), 1e-12);
    /* the same bank without the option decides differently somewhere */
    snprintf(args, sizeof args, "lm eval --model %s --text %s --policy h2o:recent_window=2 "
             "--budget 6 --json", model_untied, textpath);
    ASSERT_RUNS(args);
    const char *plain = strchr(out_text, '\n');
    ASSERT_TRUE(plain && json_num(plain + 1, "bits_per_byte") != bits / (double)(text_len + 1));
    snprintf(args, sizeof args, "lm eval --model %s --text %s --policy h2o:recent_window=2 "
             "--budget 6 --same-positions --share-heads", model0, textpath);
    ASSERT_FAILS(args, 2, "lm eval", "--same-positions keeps one set of positions");
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1,5,6 --same-positions", model0);
    ASSERT_FAILS(args, 2, "lm logits", "--same-positions needs --policy");
    snprintf(args, sizeof args, "generate --model %s --tokenizer %s --steps 3 --same-positions",
             model0, tokpath);
    ASSERT_FAILS(args, 2, "generate", "--same-positions needs --policy");
    snprintf(args, sizeof args, "generate --model %s --tokenizer %s --steps 20 --policy "
             "window:budget=4 --same-positions --json", model0, tokpath);
    ASSERT_RUNS(args);
    lm_model_free(m);
    free(ids);
}

/* A budget is written as in every command (counts, or P% of the context,
 * here T_ = 128); a spec that cannot take it names --budget once; a budget
 * at which nothing is ever evicted before it is attended warns, and its row
 * is the full cache's. */
static void test_budgets_written(void)
{
    char args[4096];
    snprintf(args, sizeof args, "lm eval --model %s --text %s --policy h2o --budget 1%%", model0,
             textpath);
    ASSERT_FAILS(args, 2, "lm eval",
                 "--budget 1% (1 of the context's 128 positions): h2o: recent_window");
    ASSERT_TRUE(strstr(err_text, "--policy") == NULL);
    snprintf(args, sizeof args, "lm eval --model %s --text %s --policy h2o --budget 8", model0,
             textpath);
    ASSERT_FAILS(args, 2, "lm eval", "--budget 8: h2o: recent_window 32");
    ASSERT_TRUE(strstr(err_text, "--policy") == NULL);
    /* A window decodes BOS and 126 tokens, 127 positions: at budget 126 the
     * last attends over all of them. */
    snprintf(args, sizeof args,
             "lm eval --model %s --text %s --policy window --budget 125,126,600 --json", model0,
             textpath);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(err_text, "warning: no key is ever evicted at budget 126: a window of the "
                              "context decodes at most 127 positions");
    ASSERT_CONTAINS(err_text, "warning: no key is ever evicted at budget 600:");
    ASSERT_TRUE(strstr(err_text, "budget 125") == NULL);
    const char *full = out_text, *l126 = strstr(out_text, "\"budget\": 126");
    const char *l600 = strstr(out_text, "\"budget\": 600");
    ASSERT_TRUE(l126 && l600);
    ASSERT_EQ(json_num(l126, "bits_per_byte"), json_num(full, "bits_per_byte"));
    ASSERT_EQ(json_num(l600, "bits_per_byte"), json_num(full, "bits_per_byte"));
    /* The stream: positions 0 .. N-2 decoded. */
    snprintf(args, sizeof args,
             "lm stream --model %s --text %s --tokens 50 --policy window --budget 47,48 --json",
             model0, textpath);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(err_text, "no key is ever evicted at budget 48: the stream decodes at most 49");
    ASSERT_TRUE(strstr(err_text, "budget 47") == NULL);
    /* One budget (lm logits, generate): P% of the context too. */
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1,2,3,4,5 --policy window --budget 3%%",
             model0);
    ASSERT_RUNS(args);
    char *pct = out_text;
    out_text = NULL;
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1,2,3,4,5 --policy window --budget 3",
             model0);
    ASSERT_RUNS(args);
    ASSERT_STR_EQ(pct, out_text); /* floor(3 * 128 / 100) = 3 */
    free(pct);
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1 --policy window --budget 0.5%%",
             model0);
    ASSERT_FAILS(args, 2, "lm logits", "--budget: 0.5% of the context (128) is no position");
    snprintf(args, sizeof args, "generate --model %s --steps 4 --policy h2o --budget 10%%", model0);
    ASSERT_FAILS(args, 2, "generate", "--budget 10% (12 of the context's 128 positions): h2o");
}

/* The pass-key prompt and repeated window of models/README.md, built here. */
static size_t passkey_prompt(const int32_t *H, size_t nH, size_t L, size_t j, size_t N, size_t d,
                             int32_t *w, int32_t *key)
{
    int32_t intro[32], after[32], question[64];
    size_t a, b, q;
    lm_encode(lib_tok, "The pass key is #", 17, intro, 32, &a);
    lm_encode(lib_tok, "Remember it.", 12, after, 32, &b);
    lm_encode(lib_tok, "What is the pass key? The pass key is #", 39, question, 64, &q);
    size_t k = L - 1 - d, f1 = k - 1 - a, m = L - 2 - a - b - q;
    size_t s = j * (nH - m) / N, o = 0;
    *key = FX_FIRST_KEY + (int32_t)(j % 64);
    w[o++] = 1;
    for (size_t i = 0; i < f1; i++)
        w[o++] = H[s + i];
    for (size_t i = 0; i < a; i++)
        w[o++] = intro[i];
    w[o++] = *key;
    for (size_t i = 0; i < b; i++)
        w[o++] = after[i];
    for (size_t i = f1; i < m; i++)
        w[o++] = H[s + i];
    for (size_t i = 0; i < q; i++)
        w[o++] = question[i];
    return o;
}

static void test_recall(void)
{
    int32_t *H = malloc((text_len + 1) * sizeof *H);
    size_t nH;
    ASSERT_OK(lm_encode(lib_tok, text, text_len, H, text_len + 1, &nH));
    enum { N = 5, L = T_ };
    int32_t w[L];
    char args[4096];
    /* Pass key at the shortest and the longest distance, full cache and a window. */
    int32_t seg[64];
    size_t a, b, q;
    ASSERT_OK(lm_encode(lib_tok, "The pass key is #", 17, seg, 64, &a));
    ASSERT_OK(lm_encode(lib_tok, "Remember it.", 12, seg, 64, &b));
    ASSERT_OK(lm_encode(lib_tok, "What is the pass key? The pass key is #", 39, seg, 64, &q));
    size_t dists[2] = {b + q, L - 2 - a};
    snprintf(args, sizeof args,
             "lm passkey --model %s --text %s --trials %d --distances %zu,%zu --policy window "
             "--budget 6 --json",
             model0, textpath, N, dists[0], dists[1]);
    ASSERT_RUNS(args);
    const char *line = out_text;
    const char *specs[2] = {NULL, "window:budget=6"};
    for (int jb = 0; jb < 2; jb++) {
        for (int di = 0; di < 2; di++) {
            size_t d = dists[di];
            int hits = 0, key_hits = 0;
            for (size_t j = 0; j < N; j++) {
                int32_t key;
                ASSERT_EQ(passkey_prompt(H, nH, L, j, N, d, w, &key), L);
                ASSERT_EQ(w[L - 1 - d], key);
                lm_options opt = {.policy = specs[jb]};
                lm_state *s = NULL;
                ASSERT_OK(lm_state_new(lib_model, &opt, &s));
                for (size_t t = 0; t < L; t++)
                    ASSERT_OK(lm_forward(s, w[t]));
                int32_t best = 0, kbest = FX_FIRST_KEY;
                for (int32_t i = 0; i < FX_PIECES; i++)
                    best = s->logits[i] > s->logits[best] ? i : best;
                for (int32_t i = FX_FIRST_KEY; i < FX_PIECES; i++)
                    kbest = s->logits[i] > s->logits[kbest] ? i : kbest;
                hits += best == key;
                key_hits += kbest == key;
                lm_state_free(s);
            }
            ASSERT_TRUE(line && strstr(line, "\"distance\": ") != NULL);
            ASSERT_EQ(json_num(line, "distance"), d);
            ASSERT_NEAR(json_num(line, "accuracy"), (double)hits / N, 1e-12);
            ASSERT_NEAR(json_num(line, "key_accuracy"), (double)key_hits / N, 1e-12);
            ASSERT_NEAR(json_num(line, "chance"), 1.0 / 64, 1e-15);
            line = strchr(line, '\n') + 1;
        }
    }
    /* Repeated passage: the mean loss over each occurrence, span 4 (--distances
     * repeated: its comma list 4,9, as every list option). */
    snprintf(args, sizeof args,
             "lm repeat --model %s --text %s --trials %d --span 4 --distances 4 --distances 9 "
             "--json",
             model0, textpath, N);
    ASSERT_RUNS(args);
    line = out_text;
    for (int di = 0; di < 2; di++) {
        size_t r = di ? 9 : 4, P = 4;
        double first = 0, second = 0;
        for (size_t j = 0; j < N; j++) {
            size_t s0 = j * (nH - (L - 1)) / N;
            w[0] = 1;
            memcpy(w + 1, H + s0, (L - 1) * sizeof *w);
            for (size_t i = 0; i < P; i++)
                w[L - P + i] = w[L - P - r + i];
            lm_state *s = NULL;
            ASSERT_OK(lm_state_new(lib_model, NULL, &s));
            double loss[L];
            for (size_t t = 0; t + 1 < L; t++) {
                ASSERT_OK(lm_forward(s, w[t]));
                loss[t + 1] = lm_token_nats(s->logits, FX_PIECES, w[t + 1]);
            }
            for (size_t i = 1; i < P; i++) {
                first += loss[L - P - r + i];
                second += loss[L - P + i];
            }
            lm_state_free(s);
        }
        ASSERT_EQ(json_num(line, "distance"), r);
        ASSERT_NEAR(json_num(line, "first_nats"), first / (double)(N * (P - 1)), 1e-9);
        ASSERT_NEAR(json_num(line, "second_nats"), second / (double)(N * (P - 1)), 1e-9);
        line = strchr(line, '\n') + 1;
    }
    ASSERT_TRUE(*line == '\0');
    free(H);
}

typedef struct att_rows {
    float *rows;  /* (L, H / group, T, T): means of `group` query heads */
    size_t T;
    size_t group; /* 0: the KV heads' group, H / G */
} att_rows;

static void collect(void *user, int32_t layer, int32_t pos, const float *att, size_t ld,
                    const size_t *n_keys)
{
    att_rows *a = user;
    size_t group = a->group ? a->group : H_ / G_, heads = H_ / group;
    for (size_t g = 0; g < heads; g++)
        lm_group_mean(a->rows + (((size_t)layer * heads + g) * a->T + (size_t)pos) * a->T,
                      att + g * group * ld, ld, group, n_keys[g * group / (H_ / G_)]);
}

static void test_dump(void)
{
    enum { T = 9 };
    char args[4096];
    snprintf(args, sizeof args, "lm dump --model %s --text %s --steps %d -o %s", model1, textpath,
             T, path_of("attn.npy"));
    ASSERT_RUNS(args);
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open(path_of("attn.npy"), NULL, &tr));
    ASSERT_EQ(kve_trace_steps(tr), T);
    ASSERT_EQ(kve_trace_layers(tr), L_);
    ASSERT_EQ(kve_trace_heads(tr), L_ * G_);
    /* Row by row what the decoder's policies would receive (own key included). */
    att_rows a = {calloc(L_ * G_ * T * T, sizeof(float)), T, 0};
    lm_options opt = {.on_attention = collect, .user = &a};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(lib_model, &opt, &s));
    int32_t ids[64];
    size_t n;
    ASSERT_OK(lm_encode(lib_tok, text, 40, ids, 64, &n));
    ASSERT_OK(lm_forward(s, LM_BOS));
    for (size_t t = 1; t < T; t++)
        ASSERT_OK(lm_forward(s, ids[t - 1]));
    lm_state_free(s);
    double row[T];
    for (size_t h = 0; h < L_ * G_; h++) {
        for (size_t t = 0; t < T; t++) {
            ASSERT_OK(kve_trace_row(tr, h, t, row, t + 1));
            double sum = 0;
            for (size_t i = 0; i <= t; i++) {
                ASSERT_TRUE(row[i] == (double)a.rows[(h * T + t) * T + i]);
                sum += row[i];
            }
            ASSERT_NEAR(sum, 1.0, 1e-5);
        }
    }
    kve_trace_free(tr);
    free(a.rows);
    /* --query-heads: every query head; `kvevict eval` reads the file. */
    snprintf(args, sizeof args, "lm dump --model %s --text %s --steps %d -o %s --query-heads",
             model1, textpath, T, path_of("attn_q.npy"));
    ASSERT_RUNS(args);
    ASSERT_OK(kve_trace_open(path_of("attn_q.npy"), NULL, &tr));
    ASSERT_EQ(kve_trace_heads(tr), L_ * H_);
    kve_trace_free(tr);
    snprintf(args, sizeof args, "eval --trace %s --policy window:budget=4 --json",
             path_of("attn.npy"));
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(out_text, "\"heads\": 4");
    remove(path_of("attn.npy"));
    remove(path_of("attn_q.npy"));
}

/* Runs outcheck on the last stdout (saved to a file) with `checks`. */
static int outcheck_ok(const char *mode, const char *checks)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s %s %s", outcheck, mode, checks, path_of("stdout"));
    int rc = system(cmd);
    return WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

/* --qk: the decoder's rotated queries and keys, read back as a q/K trace
 * whose rows are the dense dump's within float rounding (the trace computes
 * the softmax with kve_attn_row's arithmetic, the decoder with run.c's). */
typedef struct qk_vectors {
    float *k; /* (L, G, T, S) */
    size_t T;
} qk_vectors;

static void collect_qk(void *user, int32_t layer, int32_t pos, const float *q, const float *k)
{
    qk_vectors *v = user;
    enum { S = D_ / H_ };
    (void)q;
    for (size_t g = 0; g < G_; g++)
        memcpy(v->k + (((size_t)layer * G_ + g) * v->T + (size_t)pos) * S, k + g * S,
               S * sizeof(float));
}

static void test_dump_qk(void)
{
    enum { T = 300, S = D_ / H_ }; /* longer than the text: --loop */
    static const char short_text[] = "the cab bat a tea that ace. the hat";
    char shortpath[400];
    snprintf(shortpath, sizeof shortpath, "%s", path_of("short.txt"));
    fx_write_file(shortpath, short_text, sizeof short_text - 1);
    char args[4096];
    snprintf(args, sizeof args, "lm dump --model %s --text %s --steps %d --qk -o %s", model1,
             shortpath, T, path_of("t.qk"));
    ASSERT_FAILS(args, 2, "lm dump", "--loop");
    snprintf(args, sizeof args, "lm dump --model %s --text %s --steps %d --qk --query-heads -o %s",
             model1, textpath, 9, path_of("t.qk"));
    ASSERT_FAILS(args, 2, "lm dump", "--query-heads");
    snprintf(args, sizeof args, "lm dump --model %s --text %s --steps %d --qk --loop -o %s",
             model1, shortpath, T, path_of("t.qk"));
    ASSERT_RUNS(args);
    snprintf(args, sizeof args, "lm dump --model %s --text %s --steps %d --loop -o %s", model1,
             shortpath, T, path_of("t.npy"));
    ASSERT_RUNS(args);
    char src[500];
    snprintf(src, sizeof src, "qk:%s", path_of("t.qk"));
    kve_trace *q = NULL, *dn = NULL;
    ASSERT_OK(kve_trace_open(src, NULL, &q));
    ASSERT_OK(kve_trace_open(path_of("t.npy"), NULL, &dn));
    ASSERT_EQ(kve_trace_steps(q), T);
    ASSERT_EQ(kve_trace_heads(q), L_ * G_);
    ASSERT_EQ(kve_trace_layers(q), L_);
    ASSERT_EQ(kve_trace_key_dim(q), S);
    struct stat st;
    ASSERT_TRUE(stat(path_of("t.qk"), &st) == 0);
    /* the data and two headers of 128 bytes: O(T S), not O(T^2) */
    ASSERT_EQ((size_t)st.st_size, (size_t)L_ * (H_ + G_) * T * S * 4 + 2 * 128);
    static double a[T], b[T];
    double worst = 0;
    for (size_t h = 0; h < L_ * G_; h++)
        for (size_t t = 0; t < T; t += 7) {
            ASSERT_OK(kve_trace_row(q, h, t, a, t + 1));
            ASSERT_OK(kve_trace_row(dn, h, t, b, t + 1));
            for (size_t i = 0; i <= t; i++)
                worst = fabs(a[i] - b[i]) > worst ? fabs(a[i] - b[i]) : worst;
        }
    printf("  q/K rows against the decoder's own: largest difference %.3g\n", worst);
    ASSERT_TRUE(worst < 1e-5);
    /* The keys are the decoder's, as on_qk hands them. */
    qk_vectors v = {calloc((size_t)L_ * G_ * T * S, sizeof(float)), T};
    lm_options opt = {.on_qk = collect_qk, .user = &v};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(lib_model, &opt, &s));
    int32_t ids[64];
    size_t n;
    ASSERT_OK(lm_encode(lib_tok, short_text, sizeof short_text - 1, ids, 64, &n));
    ASSERT_TRUE(n + 1 < T);
    for (size_t t = 0; t < T; t++)
        ASSERT_OK(lm_forward(s, t ? ids[(t - 1) % n] : LM_BOS));
    lm_state_free(s);
    float key[S];
    for (size_t h = 0; h < L_ * G_; h++)
        for (size_t t = 0; t < T; t += 5) {
            ASSERT_OK(kve_trace_key(q, h, t, key, kve_trace_key_dim(q)));
            ASSERT_TRUE(memcmp(key, v.k + (h * T + t) * S, sizeof key) == 0);
        }
    free(v.k);
    kve_trace_free(q);
    kve_trace_free(dn);
    /* The policies that read keys run on it from the command line. */
    snprintf(args, sizeof args, "eval --trace %s --policy knorm:budget=16,recent_window=4 --json",
             src);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(out_text, "\"heads\": 4");
    remove(path_of("t.qk"));
    remove(path_of("t.npy"));
    remove(shortpath);
}

/* lm prefill against the library: the same windows and prompts, decoded
 * here with lm_prefill and lm_forward. */
static void test_prefill_cmd(void)
{
    enum { L = T_, P = 60 };
    char args[4096];
    int32_t *H = malloc((text_len + 1) * sizeof *H);
    size_t nH;
    ASSERT_OK(lm_encode(lib_tok, text, text_len, H, text_len + 1, &nH));
    int32_t seg[64];
    size_t a, b, q;
    ASSERT_OK(lm_encode(lib_tok, "The pass key is #", 17, seg, 64, &a));
    ASSERT_OK(lm_encode(lib_tok, "Remember it.", 12, seg, 64, &b));
    ASSERT_OK(lm_encode(lib_tok, "What is the pass key? The pass key is #", 39, seg, 64, &q));
    size_t d = b + q + 7;
    snprintf(args, sizeof args,
             "lm prefill --model %s --text %s --policy h2o:budget=24,recent_window=2 --budget 24 "
             "--methods step,h2o,snapkv,kvzip,policy --window 6 --kernel 3 --pool avg --prompt %d "
             "--kvzip-chunk 40 "
             "--windows 2 --trials 3 --distances %zu --json",
             model0, textpath, P, d);
    ASSERT_RUNS(args);
    ASSERT_TRUE(outcheck_ok("jsonl", "--count 6 --key policy:string --key 'budget:integer|null' "
                                     "--key positions:string --key prefill:string "
                                     "--key windows:integer --key tokens:integer "
                                     "--key bytes:number --key bits_per_byte:number "
                                     "--key delta_bits_per_byte:number --key prompts:integer "
                                     "--key passkey_accuracy:number "
                                     "--key passkey_accuracy_se:number --key seed:integer"));
    /* --methods repeated is its comma list, row for row (as lm eval's --policy) */
    char *comma = malloc(out_len + 1);
    memcpy(comma, out_text, out_len + 1);
    snprintf(args, sizeof args,
             "lm prefill --model %s --text %s --policy h2o:budget=24,recent_window=2 --budget 24 "
             "--methods step,h2o --methods snapkv --methods=kvzip,policy --window 6 --kernel 3 "
             "--pool avg --prompt %d --kvzip-chunk 40 --windows 2 --trials 3 --distances %zu "
             "--json",
             model0, textpath, P, d);
    ASSERT_RUNS(args);
    ASSERT_TRUE(strcmp(out_text, comma) == 0);
    free(comma); /* out_text, the rows below read, is the same */
    kve_prefill_options pp = kve_prefill_default_options();
    pp.method = KVE_PREFILL_SNAPKV;
    pp.window = 6;
    pp.kernel = 3;
    pp.pool = KVE_POOL_AVG;
    const char *methods[6] = {"-", "step", "h2o", "snapkv", "kvzip", "policy"};
    lm_kvzip kz;
    ASSERT_OK(lm_kvzip_default(lib_tok, &kz));
    kz.chunk = 40; /* two chunks of the 60-position prompt (BOS not repeated) */
    const char *line = out_text;
    int32_t w[L];
    for (int r = 0; r < 6; r++) {
        lm_options opt = {.policy = r ? "h2o:budget=24,recent_window=2" : NULL};
        lm_state *s = NULL;
        ASSERT_OK(lm_state_new(lib_model, &opt, &s));
        kve_prefill_options p = pp;
        p.method = r == 2 ? KVE_PREFILL_H2O : r == 4 ? KVE_PREFILL_KVZIP : KVE_PREFILL_SNAPKV;
        /* bits per byte over the tokens after the prompt's first step */
        double nats = 0, bytes = 0;
        for (size_t wi = 0; wi < 2; wi++) {
            w[0] = LM_BOS;
            memcpy(w + 1, H + wi * (L - 1), (L - 1) * sizeof *w);
            ASSERT_OK(lm_state_reset(s));
            size_t i = 0;
            if (r >= 2) {
                ASSERT_OK(r == 4 ? lm_prefill_kvzip(s, w, P, &kz, &p)
                                 : lm_prefill(s, w, P, r == 5 ? NULL : &p));
                i = P;
            }
            for (; i + 1 < L; i++) {
                ASSERT_OK(lm_forward(s, w[i]));
                if (i >= P) {
                    nats += lm_token_nats(s->logits, FX_PIECES, w[i + 1]);
                    size_t len;
                    lm_decode(lib_tok, w[i], w[i + 1], &len);
                    bytes += (double)len;
                }
            }
        }
        /* pass key: the prompt but its last token, then that token */
        int hits = 0;
        for (size_t j = 0; j < 3; j++) {
            int32_t key;
            ASSERT_EQ(passkey_prompt(H, nH, L, j, 3, d, w, &key), L);
            ASSERT_OK(lm_state_reset(s));
            size_t i = 0;
            if (r >= 2) {
                ASSERT_OK(r == 4 ? lm_prefill_kvzip(s, w, L - 1, &kz, &p)
                                 : lm_prefill(s, w, L - 1, r == 5 ? NULL : &p));
                i = L - 1;
            }
            for (; i < L; i++)
                ASSERT_OK(lm_forward(s, w[i]));
            int32_t best = 0;
            for (int32_t v = 1; v < FX_PIECES; v++)
                best = s->logits[v] > s->logits[best] ? v : best;
            hits += best == key;
        }
        lm_state_free(s);
        ASSERT_TRUE(line && *line);
        char want[64];
        snprintf(want, sizeof want, "\"prefill\": \"%s\"", methods[r]);
        ASSERT_CONTAINS(line, want);
        ASSERT_NEAR(json_num(line, "bits_per_byte"), nats / log(2.0) / bytes, 1e-12);
        ASSERT_NEAR(json_num(line, "bytes"), bytes, 0);
        ASSERT_NEAR(json_num(line, "passkey_accuracy"), hits / 3.0, 1e-12);
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    /* Refused: a method the policy cannot take; a window not below the
     * budget; an even kernel. */
    snprintf(args, sizeof args,
             "lm prefill --model %s --text %s --policy window --budget 24 --methods h2o",
             model0, textpath);
    ASSERT_FAILS(args, 2, "lm prefill", "--methods h2o with window:budget=24");
    snprintf(args, sizeof args,
             "lm prefill --model %s --text %s --policy h2o:recent_window=2 --budget 24 "
             "--window 24", model0, textpath);
    ASSERT_FAILS(args, 2, "lm prefill", "must be greater than window 24");
    snprintf(args, sizeof args,
             "lm prefill --model %s --text %s --policy h2o --kernel 4", model0, textpath);
    ASSERT_FAILS(args, 2, "lm prefill", "--kernel 4");
    /* KVzip as kvpress cuts it (every head and layer, its sinks) with
     * KVzip+: the command's bits per byte are the library's. */
    for (int mode = 0; mode < 2; mode++) {
        snprintf(args, sizeof args,
                 "lm prefill --model %s --text %s --policy h2o:budget=24,recent_window=2 "
                 "--budget 24 --methods kvzip --prompt %d --kvzip-chunk 40 --share-heads "
                 "--kvzip-budgets %s --kvzip-sinks kvpress --kvzip-plus --windows 2 --trials 1 "
                 "--distances %zu --json",
                 model0, textpath, P, mode ? "overall" : "layer", d);
        ASSERT_RUNS(args);
        const char *row = strchr(out_text, '\n');
        ASSERT_TRUE(row != NULL);
        lm_options opt = {.policy = "h2o:budget=24,recent_window=2", .share_heads = 1};
        lm_state *s = NULL;
        ASSERT_OK(lm_state_new(lib_model, &opt, &s));
        kve_prefill_options p = kve_prefill_default_options();
        p.method = KVE_PREFILL_KVZIP;
        p.budgets = mode ? KVE_PREFILL_OVERALL : KVE_PREFILL_PER_LAYER;
        p.prefix = 1;
        kz.plus = 1;
        double nats = 0, bytes = 0;
        for (size_t wi = 0; wi < 2; wi++) {
            w[0] = LM_BOS;
            memcpy(w + 1, H + wi * (L - 1), (L - 1) * sizeof *w);
            ASSERT_OK(lm_state_reset(s));
            ASSERT_OK(lm_prefill_kvzip(s, w, P, &kz, &p));
            for (size_t i = P; i + 1 < L; i++) {
                ASSERT_OK(lm_forward(s, w[i]));
                nats += lm_token_nats(s->logits, FX_PIECES, w[i + 1]);
                size_t len;
                lm_decode(lib_tok, w[i], w[i + 1], &len);
                bytes += (double)len;
            }
        }
        kz.plus = 0;
        lm_state_free(s);
        ASSERT_NEAR(json_num(row + 1, "bits_per_byte"), nats / log(2.0) / bytes, 1e-12);
    }
    snprintf(args, sizeof args,
             "lm prefill --model %s --text %s --policy h2o --kvzip-budgets layer", model0,
             textpath);
    ASSERT_FAILS(args, 2, "lm prefill", "--kvzip-budgets layer needs --share-heads");
    snprintf(args, sizeof args,
             "lm prefill --model %s --text %s --policy h2o --kvzip-budgets all", model0, textpath);
    ASSERT_FAILS(args, 2, "lm prefill", "--kvzip-budgets: 'all' is not head, layer or overall");
    snprintf(args, sizeof args,
             "lm prefill --model %s --text %s --policy h2o --kvzip-sinks both", model0, textpath);
    ASSERT_FAILS(args, 2, "lm prefill", "--kvzip-sinks: 'both'");
    free(H);
}

/* Every machine-readable output, through the strict checker of the CLI tests. */
static void test_machine_outputs(void)
{
    char args[4096];
    snprintf(args, sizeof args, "lm logits --model %s --tokens 3,1,4", model0);
    ASSERT_RUNS(args);
    ASSERT_TRUE(outcheck_ok("jsonl", "--count 3 --key pos:integer --key token:integer "
                                     "--key logits:array"));
    static const char eval_keys[] =
        "--key policy:string --key 'budget:integer|null' --key positions:string "
        "--key windows:integer --key tokens:integer --key bytes:integer "
        "--key bits_per_byte:number --key 'bits_per_byte_se:number|null' "
        "--key bits_per_token:number --key full_bits_per_byte:number "
        "--key delta_bits_per_byte:number --key 'delta_bits_per_byte_se:number|null' "
        "--key seed:integer";
    snprintf(args, sizeof args,
             "lm eval --model %s --text %s --policy window,tova --budget 4 "
             "--json",
             model0, textpath);
    ASSERT_RUNS(args);
    char checks[1024];
    snprintf(checks, sizeof checks, "--count 3 %s", eval_keys);
    ASSERT_TRUE(outcheck_ok("jsonl", checks));
    snprintf(args, sizeof args, "lm eval --model %s --text %s --policy window --budget 4 --csv",
             model0, textpath);
    ASSERT_RUNS(args);
    snprintf(checks, sizeof checks, "--count 2 %s", eval_keys);
    ASSERT_TRUE(outcheck_ok("csv", checks));
    snprintf(args, sizeof args, "lm passkey --model %s --text %s --trials 2 --json", model0,
             textpath);
    ASSERT_RUNS(args);
    ASSERT_TRUE(outcheck_ok("jsonl", "--key policy:string --key budget:null --key distance:integer "
                                     "--key trials:integer --key accuracy:number "
                                     "--key accuracy_se:number --key key_accuracy:number "
                                     "--key chance:number --key seed:integer"));
    snprintf(args, sizeof args, "lm repeat --model %s --text %s --trials 2 --span 8 --csv", model0,
             textpath);
    ASSERT_RUNS(args);
    ASSERT_TRUE(outcheck_ok("csv", "--key distance:integer --key span:integer "
                                   "--key first_nats:number --key second_nats:number "
                                   "--key second_nats_se:number"));
    /* Every command's help. */
    static const char *const helps[] = {"lm --help",         "lm logits --help", "lm eval --help",
                                        "lm passkey --help", "lm repeat --help", "lm dump --help",
                                        "lm prefill --help", "lm stream --help",
                                        "generate --help",   "help lm"};
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        ASSERT_RUNS(helps[i]);
        ASSERT_TRUE(strncmp(out_text, "usage: kvevict ", 15) == 0);
    }
}

/* lm stream: every row against the same decode run here, bin by bin. */
static void test_stream(void)
{
    int32_t *H = malloc((text_len + 1) * sizeof *H);
    size_t nH;
    ASSERT_OK(lm_encode(lib_tok, text, text_len, H, text_len + 1, &nH));
    /* Past the context (128) and round the text more than once. */
    size_t N = 2 * nH + 37, W = 64, M = 200;
    char args[4096];
    snprintf(args, sizeof args,
             "lm stream --model %s --text %s --tokens %zu --bin %zu --full-tokens %zu "
             "--policy window,h2o:recent_window=2 --budget 8 --positions cache --json",
             model0, textpath, N, W, M);
    ASSERT_RUNS(args);
    const char *specs[3] = {NULL, "window:budget=8", "h2o:budget=8,recent_window=2"};
    const char *line = out_text;
    size_t n_bins = (N + W - 1) / W;
    double *nats = calloc(n_bins, sizeof *nats);
    for (int j = 0; j < 3; j++) {
        lm_options opt = {.policy = specs[j], .positions = LM_POS_CACHE};
        lm_state *s = NULL;
        ASSERT_OK(lm_state_new(lib_model, &opt, &s));
        size_t n = j ? N : M;
        memset(nats, 0, n_bins * sizeof *nats);
        for (size_t p = 0; p + 1 < n; p++) {
            ASSERT_OK(lm_forward(s, p ? H[(p - 1) % nH] : LM_BOS));
            nats[(p + 1) / W] += lm_token_nats(s->logits, FX_PIECES, H[p % nH]);
        }
        lm_state_free(s);
        for (size_t b = 0; b * W < n; b++) {
            size_t start = b * W, end = start + W < n ? start + W : n, first = start ? start : 1;
            double bytes = 0;
            for (size_t p = first; p < end; p++) {
                size_t len;
                lm_decode(lib_tok, 0, H[(p - 1) % nH], &len);
                bytes += (double)len;
            }
            ASSERT_TRUE(line && *line);
            char head[160];
            snprintf(head, sizeof head, "{\"policy\": \"%s\", \"budget\": %s, \"positions\": \"cache\"",
                     specs[j] ? specs[j] : "full", j ? "8" : "null");
            ASSERT_TRUE(strncmp(line, head, strlen(head)) == 0);
            ASSERT_EQ(json_num(line, "start"), start);
            ASSERT_EQ(json_num(line, "end"), end);
            ASSERT_EQ(json_num(line, "tokens"), end - first);
            ASSERT_EQ(json_num(line, "bytes"), bytes);
            ASSERT_NEAR(json_num(line, "nats_per_token"), nats[b] / (double)(end - first), 1e-12);
            ASSERT_NEAR(json_num(line, "bits_per_byte"), nats[b] / log(2.0) / bytes, 1e-12);
            line = strchr(line, '\n') + 1;
        }
    }
    ASSERT_TRUE(*line == '\0');
    free(nats);
    ASSERT_TRUE(outcheck_ok("jsonl", "--key policy:string --key 'budget:integer|null' "
                                     "--key positions:string --key start:integer "
                                     "--key end:integer --key tokens:integer --key bytes:integer "
                                     "--key nats_per_token:number --key bits_per_byte:number "
                                     "--key seed:integer"));
    /* The same decode in a text table; no full cache with --full-tokens 0. */
    snprintf(args, sizeof args,
             "lm stream --model %s --text %s --tokens 100 --full-tokens 0 --policy window "
             "--budget 8",
             model0, textpath);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(out_text, "stream of 100 positions: BOS, then ");
    ASSERT_CONTAINS(out_text, "bins of 128 positions"); /* the context, by default */
    ASSERT_TRUE(strstr(out_text, "\nfull ") == NULL);
    ASSERT_CONTAINS(out_text, "\nwindow:budget=8 ");
    /* Refusals. */
    snprintf(args, sizeof args, "lm stream --model %s --text %s", model0, textpath);
    ASSERT_FAILS(args, 2, "lm stream", "missing required option '--tokens'");
    snprintf(args, sizeof args, "lm stream --model %s --text %s --tokens 1", model0, textpath);
    ASSERT_FAILS(args, 2, "lm stream", "--tokens");
    snprintf(args, sizeof args, "lm stream --model %s --text %s --tokens 9 --full-tokens 10",
             model0, textpath);
    ASSERT_FAILS(args, 2, "lm stream", "--full-tokens 10: the stream has 9 positions");
    snprintf(args, sizeof args, "lm stream --model %s --text %s --tokens 9 --bin 0", model0,
             textpath);
    ASSERT_FAILS(args, 2, "lm stream", "--bin");
    free(H);
}

/* Removes "\"trace\": \"...\", " from a JSON line (in place). */
static void drop_trace_key(char *s)
{
    for (char *p = strstr(s, "\"trace\": \""); p; p = strstr(p, "\"trace\": \"")) {
        char *end = strstr(p + 10, "\", ");
        if (!end)
            return;
        memmove(p, end + 3, strlen(end + 3) + 1);
    }
}

/* --trace lm:...: the model's attention as a trace in every command that
 * reads one, equal to what lm dump writes; bench's model section. */
static void test_lm_trace(void)
{
    char args[4096], src[1024];
    const char *tmp = getenv("TMPDIR");
    char *saved = tmp ? strdup(tmp) : NULL;
    setenv("TMPDIR", dir, 1); /* the trace is live: no file may appear there */
    size_t files = files_in_dir();
    snprintf(src, sizeof src, "lm:model=%s,text=%s,steps=9", model1, textpath);
    snprintf(args, sizeof args, "trace --stats --trace %s --block 4 --json", src);
    ASSERT_RUNS(args);
    char *from_lm = strdup(out_text);
    ASSERT_CONTAINS(from_lm, "\"layer\": 1");
    snprintf(args, sizeof args, "lm dump --model %s --text %s --steps 9 -o %s", model1, textpath,
             path_of("d.npy"));
    ASSERT_RUNS(args);
    snprintf(args, sizeof args, "trace --stats --trace %s --block 4 --json", path_of("d.npy"));
    ASSERT_RUNS(args);
    drop_trace_key(from_lm);
    drop_trace_key(out_text);
    ASSERT_STR_EQ(from_lm, out_text);
    free(from_lm);
    remove(path_of("d.npy"));
    snprintf(args, sizeof args, "trace --stats --trace %s --block 4", src);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(out_text, " 1.1 "); /* layer.head */
    snprintf(args, sizeof args, "eval --trace %s --policy window:budget=4 --json", src);
    ASSERT_RUNS(args);
    char want[1100];
    snprintf(want, sizeof want, "\"trace\": \"%s\"", src);
    ASSERT_CONTAINS(out_text, want);
    /* window=1, heads=query: rows against the library, head by head. */
    int32_t *ids = malloc((text_len + 2) * sizeof *ids);
    size_t n;
    ASSERT_OK(lm_encode(lib_tok, text, text_len, ids + 1, text_len + 1, &n));
    int32_t *w1 = ids + (T_ - 1); /* BOS, then the text from token 127 */
    w1[0] = LM_BOS;
    enum { T = 7 };
    att_rows q = {calloc((size_t)L_ * H_ * T * T, sizeof(float)), T, 1};
    lm_options opt = {.on_attention = collect, .user = &q};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(lib_model1, &opt, &s));
    for (size_t t = 0; t < T; t++)
        ASSERT_OK(lm_forward(s, w1[t]));
    lm_state_free(s);
    for (size_t h = 0; h < (size_t)L_ * H_; h++) {
        snprintf(args, sizeof args,
                 "trace --trace lm:model=%s,text=%s,window=1,steps=%d,heads=query --head %zu "
                 "-o %s",
                 model1, textpath, T, h, path_of("h.npy"));
        ASSERT_RUNS(args);
        kve_trace *tr = NULL;
        ASSERT_OK(kve_trace_open(path_of("h.npy"), NULL, &tr));
        double row[T];
        for (size_t t = 0; t < T; t++) {
            ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
            for (size_t i = 0; i <= t; i++)
                ASSERT_TRUE(row[i] == (double)q.rows[(h * T + t) * T + i]);
        }
        kve_trace_free(tr);
    }
    /* lm_trace_new itself, read head after head (as trace --stats does):
     * without a row cache each head decodes again from step 0, with one
     * the rows come from it; the same bits either way, and kve_eval over
     * every head equal to the memory trace of the collected rows. */
    for (int cached = 0; cached < 2; cached++) {
        lm_trace_options lo = {.group = 1, .cache_bytes = cached ? 1u << 20 : 0};
        kve_trace *live = NULL, *mem = NULL;
        ASSERT_OK(lm_trace_new(lib_model1, w1, T, &lo, &live));
        ASSERT_EQ(kve_trace_heads(live), (size_t)L_ * H_);
        ASSERT_EQ(kve_trace_layers(live), (size_t)L_);
        double row[T];
        for (size_t h = 0; h < (size_t)L_ * H_; h++)
            for (size_t t = 0; t < T; t++) {
                ASSERT_OK(kve_trace_row(live, h, t, row, T));
                for (size_t i = 0; i <= t; i++)
                    ASSERT_TRUE(row[i] == (double)q.rows[(h * T + t) * T + i]);
            }
        ASSERT_OK(kve_trace_from_memory(q.rows, (size_t)L_, (size_t)H_, T, NULL, &mem));
        kve_eval_job job = {"window:budget=3", 0};
        kve_eval_result a, b;
        ASSERT_OK(kve_eval(live, 0, (size_t)L_ * H_, &job, 1, NULL, &a, NULL));
        ASSERT_OK(kve_eval(mem, 0, (size_t)L_ * H_, &job, 1, NULL, &b, NULL));
        ASSERT_TRUE(memcmp(&a.retained_mass, &b.retained_mass, sizeof(double)) == 0);
        ASSERT_TRUE(memcmp(&a.top32_recall, &b.top32_recall, sizeof(double)) == 0);
        kve_trace_free(mem);
        kve_trace_free(live);
    }
    {
        /* Every byte through the trace options' allocator; each allocation
         * failing in turn: KVE_ENOMEM, nothing left behind. */
        talloc ta;
        talloc_init(&ta);
        kve_trace_options to = kve_trace_default_options();
        to.allocator = &ta.a;
        lm_trace_options lo = {.trace = &to, .group = 1, .cache_bytes = 1u << 16};
        kve_trace *tr = NULL;
        ASSERT_OK(lm_trace_new(lib_model1, w1, T, &lo, &tr));
        double row[T];
        ASSERT_OK(kve_trace_row(tr, 3, T - 1, row, T));
        size_t made = talloc_fail_after(&ta, SIZE_MAX);
        kve_trace_free(tr);
        talloc_check_empty(&ta);
        for (size_t k = 0; k < made; k++) {
            talloc_fail_after(&ta, k);
            tr = NULL;
            kve_status st = lm_trace_new(lib_model1, w1, T, &lo, &tr);
            if (st == KVE_OK) { /* the decoder grows its caches while reading */
                ASSERT_STATUS(kve_trace_row(tr, 3, T - 1, row, T), KVE_ENOMEM);
                kve_trace_free(tr);
            } else {
                ASSERT_EQ(st, KVE_ENOMEM);
                ASSERT_TRUE(tr == NULL);
            }
            talloc_check_empty(&ta);
        }
    }
    {
        int32_t bad_tok[2] = {LM_BOS, 1 << 30};
        kve_trace *tr = NULL;
        ASSERT_STATUS(lm_trace_new(lib_model1, bad_tok, 2, NULL, &tr), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "token 1 is 1073741824, outside the vocabulary");
        lm_trace_options lo = {.group = 3};
        ASSERT_STATUS(lm_trace_new(lib_model1, w1, T, &lo, &tr), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "group 3 is neither 1");
        ASSERT_TRUE(tr == NULL);
    }
    free(q.rows);
    free(ids);
    remove(path_of("h.npy"));
    /* bench: the model section on the given trace, none, or the note. */
    snprintf(args, sizeof args,
             "bench --trace canonical:steps=300 --model-trace lm:model=%s,text=%s", model1,
             textpath);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(out_text, "\nThe committed model's attention\n");
    ASSERT_CONTAINS(out_text, "\nModel trace, budget 12\n"); /* 10% of 128 steps */
    ASSERT_CONTAINS(out_text, "\nModel trace, budget 25\n");
    ASSERT_CONTAINS(out_text, "\nModel trace, budget 64\n");
    ASSERT_CONTAINS(out_text, "\nh2o:budget=64,recent_window=32 ");
    ASSERT_CONTAINS(out_text, "\nwindow:budget=12 ");
    ASSERT_CONTAINS(out_text, "\nNot run at budget 12 (their default recent window or sinks do "
                              "not fit below it): h2o, scissorhands, h2o_decay, h2o_mean.\n");
    snprintf(args, sizeof args, "bench --trace canonical:steps=300 --model-trace none");
    ASSERT_RUNS(args);
    ASSERT_TRUE(strstr(out_text, "committed model") == NULL);
    char cwd[4096];
    ASSERT_TRUE(getcwd(cwd, sizeof cwd) != NULL);
    ASSERT_TRUE(chdir(dir) == 0); /* no models/ here */
    ASSERT_RUNS("bench --md --budget 64");
    ASSERT_TRUE(chdir(cwd) == 0);
    ASSERT_CONTAINS(out_text, "### The committed model's attention: not measured here");
    /* With --trace, only --model-trace asks for the section. */
    ASSERT_RUNS("bench --trace canonical:steps=300");
    ASSERT_TRUE(strstr(out_text, "committed model") == NULL);
    snprintf(args, sizeof args,
             "bench --trace canonical:steps=300 --json --model-trace lm:model=%s,text=%s", model1,
             textpath);
    ASSERT_RUNS(args);
    ASSERT_TRUE(strstr(out_text, "lm:model") == NULL); /* csv and json: the canonical rows */
    /* Refusals, before or after decoding; no file left behind. */
    static const struct {
        const char *extra; /* after lm:model=MODEL,text=TEXT */
        int code;
        const char *needle;
    } bad[] = {
        {",colour=red", 2, "unknown key 'colour'"},
        {",heads=all", 2, "heads=all is neither kv nor query"},
        {",window=99", 2, "window 99 of 128 steps needs"},
        {",steps=x", 2, "steps"},
        {",steps=8193", 2, "window 0 of 8193 steps needs 8192"}, /* no 8192 cap: the text's */
        {",steps=1048577", 2, "1048577 is out of range [1, 1048576]"}, /* lm dump's --steps */
        {",heads=kv,heads=query", 2, "heads is given twice"},
        {",text=again", 2, "text is given twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "trace --stats --trace lm:model=%s,text=%s%s", model1,
                 textpath, bad[i].extra);
        ASSERT_FAILS(args, bad[i].code, "trace", bad[i].needle);
    }
    snprintf(args, sizeof args, "trace --stats --trace lm:model=%s", model1);
    ASSERT_FAILS(args, 2, "trace", "model= and text= are required");
    snprintf(args, sizeof args, "trace --stats --trace lm:model=/nonexistent.bin,text=%s",
             textpath);
    ASSERT_FAILS(args, 1, "trace", "No such file or directory");
    ASSERT_EQ(files_in_dir(), files);
    if (saved) {
        setenv("TMPDIR", saved, 1);
        free(saved);
    } else {
        unsetenv("TMPDIR");
    }
}

static void test_generate(void)
{
    char args[4096];
    snprintf(args, sizeof args, "generate --model %s --prompt 'the cab' --steps 12", model0);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(err_text, "tokens/s");
    ASSERT_CONTAINS(err_text, "kept per (layer, KV head)");
    /* Greedy: the library's argmax continuation, decoded. */
    int32_t toks[64];
    size_t n;
    ASSERT_OK(lm_encode(lib_tok, "the cab", 7, toks + 1, 63, &n));
    toks[0] = LM_BOS;
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(lib_model, NULL, &s));
    char want[1024];
    size_t wl = 0;
    for (size_t i = 0; i < n + 12; i++) {
        ASSERT_OK(lm_forward(s, toks[i]));
        int32_t next = 0;
        if (i < n) {
            next = toks[i + 1];
        } else {
            for (int32_t v = 1; v < FX_PIECES; v++) /* the pass keys are never chosen */
                if (v < FX_FIRST_KEY || v >= FX_FIRST_KEY + FX_KEYS)
                    next = s->logits[v] > s->logits[next] ? v : next;
        }
        if (next == LM_BOS)
            break;
        toks[i + 1] = next;
        size_t len;
        const char *p = lm_decode(lib_tok, toks[i], next, &len);
        if (!(len == 1 && (unsigned char)p[0] < 0x20 && p[0] != '\n' && p[0] != '\t' &&
              p[0] != '\r')) {
            memcpy(want + wl, p, len);
            wl += len;
        }
    }
    want[wl++] = '\n';
    want[wl] = '\0';
    lm_state_free(s);
    ASSERT_STR_EQ(out_text, want);
    /* Read at prefill, the prompt that fits the budget is kept whole under
     * every method: the same text. */
    static const char *const pf[] = {"kvzip", "snapkv", "h2o", "policy"};
    for (size_t k = 0; k < 4; k++) {
        snprintf(args, sizeof args,
                 "generate --model %s --prompt 'the cab' --steps 12 --policy "
                 "h2o:recent_window=2 --budget 64 --prefill %s", model0, pf[k]);
        ASSERT_RUNS(args);
        ASSERT_STR_EQ(out_text, want);
    }
    snprintf(args, sizeof args, "generate --model %s --prompt x --prefill zip --policy h2o",
             model0);
    ASSERT_FAILS(args, 2, "generate", "--prefill: 'zip' is not h2o, snapkv, kvzip or policy");
    snprintf(args, sizeof args, "generate --model %s --prompt x --prefill kvzip", model0);
    ASSERT_FAILS(args, 2, "generate", "--prefill needs --policy");
    /* Sampling repeats itself for a seed, under a bounded cache. */
    snprintf(args, sizeof args,
             "generate --model %s --prompt the --steps 40 --temperature 1.5 --seed 7 "
             "--policy window:budget=5",
             model0);
    ASSERT_RUNS(args);
    char *first = strdup(out_text);
    ASSERT_CONTAINS(err_text, "5..5 of");
    ASSERT_RUNS(args);
    ASSERT_STR_EQ(out_text, first);
    free(first);
}

/* ---- GGUF and llama2.c version 2 through the command line ---- */

/* The stdout of `kvevict ARGS`, or NULL when it fails (free()). */
static char *output_of(const char *args)
{
    if (run(args) != 0) {
        fprintf(stderr, "kvevict %s failed: %s\n", args, err_text ? err_text : "");
        return NULL;
    }
    char *copy = malloc(out_len + 1);
    memcpy(copy, out_text, out_len);
    copy[out_len] = '\0';
    return copy;
}

/* kvevict-convert ARGS; its exit status. */
static int run_convert(const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s", convert, args, path_of("convert.err"));
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void test_gguf(void)
{
    char args[4096], g[400], gq[400], gn[400], v2[400];
    snprintf(g, sizeof g, "%s", path_of("model.gguf"));
    snprintf(gq, sizeof gq, "%s", path_of("model-q8.gguf"));
    snprintf(gn, sizeof gn, "%s", path_of("novocab.gguf"));
    snprintf(v2, sizeof v2, "%s", path_of("model-v2.bin"));
    snprintf(args, sizeof args, "--model %s --tokenizer %s --to gguf -o %s", model0, tokpath, g);
    ASSERT_EQ(run_convert(args), 0);
    snprintf(args, sizeof args, "--model %s --tokenizer %s --to gguf --type q8_0 -o %s", model0,
             tokpath, gq);
    ASSERT_EQ(run_convert(args), 0);
    snprintf(args, sizeof args, "--model %s --to gguf --type f16 -o %s", model0, gn);
    ASSERT_EQ(run_convert(args), 0); /* tokenizer.bin beside model0 */
    { /* the vocabulary unnamed: tokenizer.ggml.model made tokenizer.ggml.modeX */
        size_t gl = 0;
        char *gb = fx_slurp(gn, &gl), *key = NULL;
        for (size_t i = 0; gb && !key && i + 20 <= gl; i++)
            if (memcmp(gb + i, "tokenizer.ggml.model", 20) == 0)
                key = gb + i;
        ASSERT_TRUE(key != NULL);
        if (key) {
            key[19] = 'X';
            FILE *f = fopen(gn, "wb");
            ASSERT_TRUE(f && fwrite(gb, 1, gl, f) == gl && fclose(f) == 0);
        }
        free(gb);
    }
    snprintf(args, sizeof args, "--model %s --to llama2c-v2 -o %s", model0, v2);
    ASSERT_EQ(run_convert(args), 0);
    /* A float32 GGUF with its vocabulary in the metadata: the legacy file's
     * output, without --tokenizer. */
    struct {
        const char *cmd;
    } same[] = {{"lm logits --prompt 'the cafe abc' --model %s%s"},
                {"lm eval --json --policy h2o:recent_window=1 --budget 8 --text %s --model %s%s"},
                {"generate --prompt 'the cab' --steps 9 --model %s%s"}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char a1[4096], a2[4096], tail[600];
        snprintf(tail, sizeof tail, " --tokenizer %s", tokpath);
        if (i == 1) {
            snprintf(a1, sizeof a1, same[i].cmd, textpath, model0, tail);
            snprintf(a2, sizeof a2, same[i].cmd, textpath, g, "");
        } else {
            snprintf(a1, sizeof a1, same[i].cmd, model0, tail);
            snprintf(a2, sizeof a2, same[i].cmd, g, "");
        }
        char *o1 = output_of(a1), *o2 = output_of(a2);
        ASSERT_TRUE(o1 && o2 && strcmp(o1, o2) == 0);
        free(o1), free(o2);
    }
    /* The same bits on 1 and 2 threads; Q8_0 and version 2 run. */
    for (int f = 0; f < 2; f++) {
        char a1[4096], a2[4096];
        const char *tok = f ? " --tokenizer " : "", *tp = f ? tokpath : "";
        snprintf(a1, sizeof a1, "lm eval --json --text %s --model %s%s%s --threads 1", textpath,
                 f ? v2 : gq, tok, tp);
        snprintf(a2, sizeof a2, "lm eval --json --text %s --model %s%s%s --threads 2", textpath,
                 f ? v2 : gq, tok, tp);
        char *o1 = output_of(a1), *o2 = output_of(a2);
        ASSERT_TRUE(o1 && o2 && strcmp(o1, o2) == 0);
        ASSERT_TRUE(o1 && strstr(o1, "\"bits_per_byte\": ") != NULL);
        free(o1), free(o2);
    }
    /* Without a vocabulary: text is refused naming the key, token ids work. */
    snprintf(args, sizeof args, "lm logits --model %s --prompt abc", gn);
    ASSERT_FAILS(args, 1, "lm logits", "no tokenizer.ggml.model");
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1,5,9", gn);
    ASSERT_RUNS(args);
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1 --threads 0", g);
    ASSERT_FAILS(args, 2, "lm logits", "--threads");
    snprintf(args, sizeof args, "lm eval --model %s --text %s --threads 9999", g, textpath);
    ASSERT_FAILS(args, 2, "lm eval", "--threads");
    ASSERT_RUNS("lm --help");
    ASSERT_CONTAINS(out_text, "GGUF");
    ASSERT_RUNS("lm logits --help");
    ASSERT_CONTAINS(out_text, "version 2 int8");
    ASSERT_CONTAINS(out_text, "--threads N");
    /* A session names its model by the checkpoint's bytes: one made on the
     * GGUF file continues there, and is refused by the same weights in Q8_0
     * or in the legacy file. */
    char sess[400];
    snprintf(sess, sizeof sess, "%s", path_of("gguf.kvs"));
    remove(sess);
    snprintf(args, sizeof args, "generate --model %s --prompt 'the cab' --steps 3 --session %s",
             g, sess);
    ASSERT_RUNS(args);
    snprintf(args, sizeof args, "generate --model %s --prompt ' a' --steps 2 --session %s", g,
             sess);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(err_text, "a resumed session");
    snprintf(args, sizeof args, "generate --model %s --prompt x --session %s", gq, sess);
    ASSERT_FAILS(args, 2, "generate", "from another model");
    snprintf(args, sizeof args, "generate --model %s --tokenizer %s --prompt x --session %s",
             model0, tokpath, sess);
    ASSERT_FAILS(args, 2, "generate", "from another model");
    remove(sess);
    remove(g), remove(gq), remove(gn), remove(v2), remove(path_of("convert.err"));
}

/* kvevict-convert's refusals, each exit 2 with one line naming the problem,
 * and nothing left at -o; random weights in every output format, with the
 * block fallback said, read back by the decoder. */
static int convert_says(const char *args, int code, const char *needle)
{
    int rc = run_convert(args);
    char *e = fx_slurp(path_of("convert.err"), NULL);
    int ok = rc == code && e && strncmp(e, "kvevict-convert: ", 17) == 0 && strstr(e, needle);
    if (!ok)
        fprintf(stderr, "kvevict-convert %s: exit %d, want %d with '%s' (stderr: %s)\n", args, rc,
                code, needle, e ? e : "");
    free(e);
    return ok;
}

static void test_convert(void)
{
    char args[4096], o[400], v[400];
    snprintf(o, sizeof o, "%s", path_of("conv.out"));
    const char *shape = "dim=64,hidden=96,layers=1,heads=2,kv_heads=1,vocab=40,seq_len=32";
    struct {
        const char *args, *needle;
    } bad[] = {
        {"", "give exactly one of --model and --random"},
        {"--model a --random b --to gguf -o X", "give exactly one of --model and --random"},
        {"--random %s -o X", "--to and -o are required"},
        {"--random %s --to gguf", "--to and -o are required"},
        {"--random %s --to onnx -o X", "--to: 'onnx' is not gguf, llama2c"},
        {"--random %s --to gguf --type q7_k -o X", "--type: 'q7_k' is not f32, f16, bf16"},
        {"--random %s --to gguf --embedding-type f8 -o X", "--embedding-type: 'f8' is not"},
        {"--random %s --to gguf --norm-type q8_0 -o X", "--norm-type: norms are f32, f16 or bf16"},
        {"--random %s --to gguf --bogus 1 -o X", "unknown option '--bogus'"},
        {"--random %s --to", "--to needs a value"},
        {"--random dim --to gguf -o X", "--random: 'dim' is not key=value"},
        {"--random dim=x --to gguf -o X", "--random: dim=x is not a number"},
        {"--random dim= --to gguf -o X", "--random: dim= is not a number"},
        {"--random dim=4294967296 --to gguf -o X", "--random: dim=4294967296 is not a number"},
        {"--random %s,colour=3 --to gguf -o X", "--random: unknown key 'colour'"},
        {"--random dim=64,hidden=96 --to gguf -o X", "--random: give dim, hidden, layers"},
        {"--random %s --to llama2c-v2 --group 7 -o X", "--group 7 must divide dim 64 and hidden 96"},
        {"--random %s --to llama2c-v2 --group 0 -o X", "--group 0 must divide"},
        {"--model /no/such/model.bin --to gguf -o X", "--model /no/such/model.bin: "},
        {"--random %s --tokenizer /no/such/tok.bin --to gguf -o X", "--tokenizer /no/such/tok.bin: "},
        {"--random %s --tokenizer TOK --to gguf -o X", "pieces, the model's vocabulary is 40"},
        {"--random %s --to gguf -o /no/such/dir/x.gguf", "cannot create /no/such/dir/x.gguf.tmp"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char a[2048], b[2048];
        snprintf(a, sizeof a, bad[i].args, shape);
        /* X is the scratch output; TOK the fixture's tokenizer (vocabulary FX_PIECES) */
        const char *x = strstr(a, " X"), *t = strstr(a, "TOK");
        if (t) {
            snprintf(b, sizeof b, "%.*s%s%s", (int)(t - a), a, tokpath, t + 3);
            snprintf(a, sizeof a, "%s", b);
            x = strstr(a, " X");
        }
        if (x) {
            snprintf(b, sizeof b, "%.*s %s%s", (int)(x - a), a, o, x + 2);
            snprintf(a, sizeof a, "%s", b);
        }
        remove(o);
        if (!convert_says(a, 2, bad[i].needle))
            CHECK_FAIL_AT("kvevict-convert refusal %zu", i);
        ASSERT_TRUE(access(o, F_OK) != 0);
    }
    ASSERT_EQ(run_convert("--help"), 0);
    /* Random weights: K-quants on rows of 64 fall back to blocks of 32 (said),
     * every llama2.c version, untied; each is read and decodes. */
    struct {
        const char *to;
        int fallback;
    } ok[] = {{"gguf --type q4_k --norm-type bf16", 1},
              {"gguf --type q6_k --embedding-type f16 --norm-type f16 --name tiny", 1},
              {"gguf --type iq4_xs --embedding-type q5_1", 1},
              {"gguf --type bf16", 0},
              {"llama2c", 0},
              {"llama2c-v1", 0},
              {"llama2c-v2", 0},
              {"llama2c-v2 --group 32", 0}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        snprintf(args, sizeof args, "--random %s,seed=%zu,tied=%d --to %s -o %s", shape, i + 1,
                 (int)(i % 2), ok[i].to, o);
        ASSERT_EQ(run_convert(args), 0);
        char *e = fx_slurp(path_of("convert.err"), NULL);
        ASSERT_TRUE(e && (strstr(e, "not whole blocks of their type") != NULL) == ok[i].fallback);
        free(e);
        snprintf(args, sizeof args, "lm logits --model %s --tokens 1,2,3", o);
        ASSERT_RUNS(args);
        ASSERT_CONTAINS(out_text, "\"logits\"");
    }
    /* The same seed writes the same bytes; --random's placeholder vocabulary
     * is carried by a conversion of its GGUF; a GGUF input converts back. */
    snprintf(v, sizeof v, "%s", path_of("conv2.out"));
    snprintf(args, sizeof args, "--random %s,seed=9 --to gguf -o %s", shape, o);
    ASSERT_EQ(run_convert(args), 0);
    snprintf(args, sizeof args, "--random %s,seed=9 --to gguf -o %s", shape, v);
    ASSERT_EQ(run_convert(args), 0);
    size_t n1 = 0, n2 = 0;
    char *b1 = fx_slurp(o, &n1), *b2 = fx_slurp(v, &n2);
    ASSERT_TRUE(b1 && b2 && n1 == n2 && memcmp(b1, b2, n1) == 0);
    free(b1), free(b2);
    snprintf(args, sizeof args, "--model %s --to gguf --type q8_0 -o %s", o, v);
    ASSERT_EQ(run_convert(args), 0);
    snprintf(args, sizeof args, "lm logits --model %s --prompt ab", v);
    ASSERT_RUNS(args);
    snprintf(args, sizeof args, "--model %s --to llama2c-v1 -o %s", v, o);
    ASSERT_EQ(run_convert(args), 0);
    remove(o), remove(v), remove(path_of("convert.err"));
}

/* ---- generate --samples, --session, the sampler's options ---- */

enum { GEN_CAP = 64 };

/* One generated token of `generate --json --logits`. */
typedef struct gen_line {
    long sample;
    long long seed; /* -1: null (a resumed session's generator) */
    int pos, token;
    float logits[FX_PIECES];
} gen_line;

/* Parses the JSON lines of out (every key the command writes, in order);
 * returns how many, or (size_t)-1 for a line of another shape. */
static size_t parse_gen(const char *out, gen_line *g, size_t cap)
{
    size_t n = 0;
    for (const char *s = out; *s && n < cap; n++) {
        int used = 0, at = 0;
        if (sscanf(s, "{\"sample\": %ld, \"seed\": %n", &g[n].sample, &at) != 1 || !at)
            return (size_t)-1;
        g[n].seed = -1;
        if (strncmp(s + at, "null", 4) == 0)
            at += 4;
        else if (sscanf(s + at, "%lld%n", &g[n].seed, &used) == 1 && g[n].seed >= 0)
            at += used;
        else
            return (size_t)-1;
        used = 0;
        if (sscanf(s + at, ", \"pos\": %d, \"token\": %d, \"piece\": %n", &g[n].pos,
                   &g[n].token, &used) != 2 || !used)
            return (size_t)-1;
        const char *l = strstr(s, "\"logits\": [");
        const char *eol = strchr(s, '\n');
        if (!l || !eol || l > eol)
            return (size_t)-1;
        l += strlen("\"logits\": [");
        for (int i = 0; i < FX_PIECES; i++) {
            char *end;
            g[n].logits[i] = strtof(l, &end);
            if (end == l)
                return (size_t)-1;
            l = end + (i + 1 < FX_PIECES ? 2 : 0);
        }
        if (strncmp(l, "]}\n", 3) != 0)
            return (size_t)-1;
        s = eol + 1;
    }
    return n;
}

/* Sample k of --samples 3 equals a separate run of seed 11 + k, tokens and
 * logits, and the text output is the three runs' texts. */
static void samples_equal_runs(const char *common)
{
    static gen_line all[3 * GEN_CAP], one[GEN_CAP];
    char args[4096];
    snprintf(args, sizeof args, "generate --model %s %s --seed 11 --samples 3 --json --logits",
             model0, common);
    ASSERT_RUNS(args);
    size_t n_all = parse_gen(out_text, all, 3 * GEN_CAP);
    ASSERT_EQ(n_all, 27);
    char *texts = NULL;
    size_t texts_len = 0;
    for (long k = 0; k < 3; k++) {
        snprintf(args, sizeof args, "generate --model %s %s --seed %ld --json --logits", model0,
                 common, 11 + k);
        ASSERT_RUNS(args);
        size_t n = parse_gen(out_text, one, GEN_CAP);
        ASSERT_EQ(n, 9);
        for (size_t i = 0; i < n; i++) {
            const gen_line *a = &all[(size_t)k * 9 + i];
            ASSERT_EQ(a->sample, k);
            ASSERT_EQ(one[i].sample, 0);
            ASSERT_EQ(a->pos, one[i].pos);
            ASSERT_EQ(a->token, one[i].token);
            if (memcmp(a->logits, one[i].logits, sizeof a->logits) != 0)
                CHECK_FAIL_AT("sample %ld, token %zu: logits differ from the run of seed %ld", k,
                              i, 11 + k);
        }
        /* The text of the same run, for the text output below. */
        snprintf(args, sizeof args, "generate --model %s %s --seed %ld", model0, common, 11 + k);
        ASSERT_RUNS(args);
        char head[96];
        int hl = snprintf(head, sizeof head, "--- sample %ld of 3, seed %ld ---\n", k + 1, 11 + k);
        texts = realloc(texts, texts_len + (size_t)hl + out_len + 1);
        memcpy(texts + texts_len, head, (size_t)hl);
        memcpy(texts + texts_len + (size_t)hl, out_text, out_len + 1);
        texts_len += (size_t)hl + out_len;
    }
    int differ = 0; /* the samples are not all one */
    for (size_t i = 0; i < 9; i++)
        differ |= all[i].token != all[9 + i].token;
    ASSERT_TRUE(differ);
    snprintf(args, sizeof args, "generate --model %s %s --seed 11 --samples 3", model0, common);
    ASSERT_RUNS(args);
    ASSERT_STR_EQ(out_text, texts);
    free(texts);
}

/* `kvevict lm generate` is `kvevict generate`: the same output, the same
 * refusals, and `lm --help` names it. */
static void test_lm_generate_alias(void)
{
    static gen_line lines[GEN_CAP];
    char args[4096];
    snprintf(args, sizeof args, "generate --model %s --prompt 'the cab' --steps 9 --temperature "
             "1.3 --seed 3 --policy h2o:budget=6,recent_window=2 --same-positions --json --logits",
             model0);
    ASSERT_RUNS(args);
    char *want = strdup(out_text);
    ASSERT_EQ(parse_gen(want, lines, GEN_CAP), 9);
    char args2[4200];
    snprintf(args2, sizeof args2, "lm %s", args);
    ASSERT_RUNS(args2);
    ASSERT_STR_EQ(out_text, want);
    free(want);
    snprintf(args, sizeof args, "lm generate --model %s --steps 3 --same-positions", model0);
    ASSERT_FAILS(args, 2, "lm generate", "--same-positions needs --policy");
    ASSERT_RUNS("lm --help");
    ASSERT_CONTAINS(out_text, "  generate ");
}

static void test_generate_samples(void)
{
    char args[4096];
    samples_equal_runs("--prompt 'the cab' --steps 9 --temperature 1.3 --top-k 30 --top-p 0.97 "
                       "--repeat-penalty 1.2 --policy h2o:budget=6,recent_window=2");
    /* random draws its victims from --policy-seed's streams, apart from the
     * sampler's --seed: a fork equals a separate run for it too */
    const char *rnd = "--prompt 'the cab' --steps 9 --temperature 1.3 --policy "
                      "random:budget=6,recent_window=1";
    samples_equal_runs(rnd);
    static gen_line p[2][GEN_CAP];
    for (int k = 0; k < 2; k++) { /* the policy's seed is in force, the sampler's unchanged */
        snprintf(args, sizeof args, "generate --model %s %s --seed 11 --policy-seed %d --json "
                 "--logits", model0, rnd, 5 + k);
        ASSERT_RUNS(args);
        ASSERT_EQ(parse_gen(out_text, p[k], GEN_CAP), 9);
    }
    int moved = 0;
    for (size_t i = 0; i < 9; i++)
        moved |= memcmp(p[0][i].logits, p[1][i].logits, sizeof p[0][i].logits) != 0;
    ASSERT_TRUE(moved);
    /* The sampler's options are checked before anything is read. */
    static const char *const bad[][2] = {
        {"--top-p 0", "--top-p"},          {"--repeat-penalty 0", "--repeat-penalty"},
        {"--top-k -1", "--top-k"},         {"--logits", "--logits needs --json"},
        {"--samples 0", "--samples"},      {"--temperature -1", "--temperature"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "generate --model %s %s", model0, bad[i][0]);
        ASSERT_FAILS(args, 2, "generate", bad[i][1]);
    }
}

/* The library's continuation of the decoder s: n tokens drawn as generate
 * draws them (defaults but temperature, pass keys banned), each compared
 * with the CLI's line. */
static void lib_continue(lm_state *s, int32_t *hist, size_t *nh, kve_rng *rng,
                         const gen_line *cli, size_t n, const char *what)
{
    static lm_candidate scratch[FX_PIECES];
    static unsigned char banned[FX_PIECES];
    lm_reserved_tokens(lib_tok, banned);
    lm_sampler_params p = lm_sampler_default_params();
    p.temperature = 1.1;
    for (size_t i = 0; i < n; i++) {
        int32_t t = lm_sample(&p, s->logits, FX_PIECES, banned, hist, *nh, rng, scratch);
        if (t != cli[i].token || s->pos != cli[i].pos ||
            memcmp(s->logits, cli[i].logits, sizeof cli[i].logits) != 0)
            CHECK_FAIL_AT("%s: token %zu: the CLI's %d at %d, the library's %d at %d%s", what, i,
                          cli[i].token, cli[i].pos, t, s->pos,
                          t == cli[i].token ? " (logits differ)" : "");
        ASSERT_OK(lm_forward(s, t));
        hist[(*nh)++] = t;
    }
}

static void lib_force(lm_state *s, int32_t *hist, size_t *nh, const char *words)
{
    int32_t ids[64];
    size_t n;
    ASSERT_OK(lm_encode(lib_tok, words, strlen(words), ids, 64, &n));
    for (size_t i = 0; i < n; i++) {
        ASSERT_OK(lm_forward(s, ids[i]));
        hist[(*nh)++] = ids[i];
    }
}

static void test_generate_session(void)
{
    static gen_line a[GEN_CAP], b[GEN_CAP];
    char args[4096], file[400], cut[400];
    snprintf(file, sizeof file, "%s", path_of("s.kvs"));
    snprintf(cut, sizeof cut, "%s", path_of("cut.kvs"));
    remove(file);
    const char *pol = "--policy h2o:budget=6,recent_window=2 --temperature 1.1";
    snprintf(args, sizeof args,
             "generate --model %s --prompt 'the cab' --steps 6 %s --seed 4 --session %s --json "
             "--logits", model0, pol, file);
    ASSERT_RUNS(args);
    ASSERT_EQ(parse_gen(out_text, a, GEN_CAP), 6);
    snprintf(args, sizeof args,
             "generate --model %s --prompt 'a tea' --steps 7 %s --session %s --json --logits",
             model0, pol, file);
    ASSERT_RUNS(args);
    ASSERT_EQ(parse_gen(out_text, b, GEN_CAP), 7);
    ASSERT_CONTAINS(err_text, "a resumed session");
    /* the seed the sampler was seeded with; null for the file's generator */
    ASSERT_EQ(a[0].seed, 4);
    ASSERT_EQ(b[0].seed, -1);
    /* One decode of A then B in this process. */
    lm_options o = {.policy = "h2o:budget=6,recent_window=2", .seed = 4};
    lm_state *s = NULL;
    ASSERT_OK(lm_state_new(lib_model, &o, &s));
    int32_t hist[256];
    size_t nh = 0;
    kve_rng rng;
    kve_rng_seed(&rng, 4);
    ASSERT_OK(lm_forward(s, LM_BOS));
    hist[nh++] = LM_BOS;
    lib_force(s, hist, &nh, "the cab");
    lib_continue(s, hist, &nh, &rng, a, 6, "run A");
    lib_force(s, hist, &nh, "a tea");
    lib_continue(s, hist, &nh, &rng, b, 7, "run B, resumed");
    lm_state_free(s);

    /* Refusals: a message naming the mismatch, nothing printed, the file
     * unchanged. */
    size_t size;
    char *before = fx_slurp(file, &size);
    ASSERT_TRUE(before != NULL && size > 200);
    snprintf(args, sizeof args,
             "generate --model %s --prompt x --policy window:budget=6 --session %s", model0, file);
    ASSERT_FAILS(args, 2, "generate", "policy: the session's is 'h2o:budget=6,recent_window=2'");
    snprintf(args, sizeof args, "generate --model %s --prompt x %s --positions cache --session %s",
             model0, pol, file);
    ASSERT_FAILS(args, 2, "generate", "positions");
    snprintf(args, sizeof args, "generate --model %s --prompt x %s --session %s", model_untied,
             pol, file);
    ASSERT_FAILS(args, 2, "generate", "from another model");
    size_t after_len;
    char *after = fx_slurp(file, &after_len);
    ASSERT_TRUE(after_len == size && memcmp(after, before, size) == 0);
    free(after);
    fx_write_file(cut, before, size / 2);
    snprintf(args, sizeof args, "generate --model %s --prompt x %s --session %s", model0, pol, cut);
    ASSERT_FAILS(args, 1, "generate", "truncated");
    before[size / 3] ^= 4;
    fx_write_file(cut, before, size);
    ASSERT_FAILS(args, 1, "generate", "checksum");
    after = fx_slurp(cut, &after_len);
    ASSERT_TRUE(after_len == size && memcmp(after, before, size) == 0);
    free(after);
    free(before);
    snprintf(args, sizeof args, "generate --model %s --samples 2 --session %s", model0, file);
    ASSERT_FAILS(args, 2, "generate", "--samples");
}

/* A checkpoint holding a NaN or an infinity is refused at load, naming the
 * tensor; the reserved pass keys are never sampled unless asked for (the
 * committed model writes one after "The pass key is #"). */
/* Saving a session keeps what the user set on the file: a new session is
 * 0600 (it holds the conversation), an existing one keeps its mode; a
 * symlinked session is written through to its target (the link stays a
 * link), a hard-linked one in place (both names see the new bytes); other
 * outputs get the umask's mode. */
static void test_session_file_modes(void)
{
    char args[4096], file[400], link_[400], hard[400], target[400], out[400];
    snprintf(file, sizeof file, "%s", path_of("mode.kvs"));
    snprintf(link_, sizeof link_, "%s", path_of("link.kvs"));
    snprintf(hard, sizeof hard, "%s", path_of("hard.kvs"));
    snprintf(target, sizeof target, "%s", path_of("target.kvs"));
    snprintf(out, sizeof out, "%s", path_of("modes.jsonl"));
    remove(file), remove(link_), remove(hard), remove(target);
    const char *pol = "--policy h2o:budget=6,recent_window=2";
    mode_t old_mask = umask(022);
    struct stat sb;
    snprintf(args, sizeof args, "generate --model %s --prompt 'the cab' --steps 3 %s --session %s",
             model0, pol, file);
    ASSERT_RUNS(args);
    ASSERT_TRUE(stat(file, &sb) == 0 && (sb.st_mode & 07777) == 0600);
    ASSERT_TRUE(chmod(file, 0640) == 0);
    ASSERT_RUNS(args);
    ASSERT_TRUE(stat(file, &sb) == 0 && (sb.st_mode & 07777) == 0640);
    /* Its owner and group too: handed to nobody:nogroup (65534), a resuming
     * save keeps them (the temporary renamed over it is fchown'ed to them).
     * Only root can give a file away, so others skip this part, saying so. */
    if (geteuid() == 0) {
        ASSERT_TRUE(chown(file, 65534, 65534) == 0);
        snprintf(args, sizeof args, "generate --model %s --prompt ' a' --steps 2 %s --session %s",
                 model0, pol, file);
        ASSERT_RUNS(args);
        ASSERT_CONTAINS(err_text, "a resumed session");
        ASSERT_TRUE(stat(file, &sb) == 0);
        ASSERT_EQ(sb.st_uid, 65534);
        ASSERT_EQ(sb.st_gid, 65534);
        ASSERT_EQ(sb.st_mode & 07777, 0640);
        ASSERT_TRUE(chown(file, 0, 0) == 0);
        snprintf(args, sizeof args,
                 "generate --model %s --prompt 'the cab' --steps 3 %s --session %s", model0, pol,
                 file);
    } else {
        printf("test_session_file_modes: owner and group kept on save: skipped (not root: "
               "chown to another user needs root)\n");
    }
    /* a symlink: the target written, the link kept */
    ASSERT_RUNS(args);
    ASSERT_TRUE(rename(file, target) == 0);
    ASSERT_TRUE(symlink("target.kvs", link_) == 0);
    size_t n0, n1;
    char *t0 = fx_slurp(target, &n0);
    snprintf(args, sizeof args, "generate --model %s --prompt ' a' --steps 2 %s --session %s",
             model0, pol, link_);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(err_text, "a resumed session");
    ASSERT_TRUE(lstat(link_, &sb) == 0 && S_ISLNK(sb.st_mode));
    char *t1 = fx_slurp(target, &n1);
    ASSERT_TRUE(t0 && t1 && (n0 != n1 || memcmp(t0, t1, n0) != 0)); /* the target moved on */
    ASSERT_TRUE(stat(target, &sb) == 0 && (sb.st_mode & 07777) == 0640);
    free(t0);
    free(t1);
    /* a hard link: both names see the new session */
    ASSERT_TRUE(link(target, hard) == 0);
    snprintf(args, sizeof args, "generate --model %s --prompt ' b' --steps 2 %s --session %s",
             model0, pol, hard);
    ASSERT_RUNS(args);
    struct stat sh, st;
    ASSERT_TRUE(stat(hard, &sh) == 0 && stat(target, &st) == 0);
    ASSERT_TRUE(sh.st_ino == st.st_ino && sh.st_nlink == 2);
    t0 = fx_slurp(hard, &n0);
    t1 = fx_slurp(target, &n1);
    ASSERT_TRUE(t0 && t1 && n0 == n1 && memcmp(t0, t1, n0) == 0);
    free(t0);
    free(t1);
    /* another output: the umask's 0644 */
    remove(out);
    snprintf(args, sizeof args, "lm eval --model %s --text %s --policy window --budget 5 -o %s",
             model0, textpath, out);
    ASSERT_RUNS(args);
    ASSERT_TRUE(stat(out, &sb) == 0 && (sb.st_mode & 07777) == 0644);
    umask(old_mask);
}

/* Session and tokenizer files are read up to what their header states (a
 * session) or a cap (a tokenizer), never whole before a check: a sparse
 * 1 GiB file with a valid session header, /dev/zero as a session and as a
 * tokenizer, each refused with the reason and no more than a few MB of
 * memory (before: a 1.05 GB peak for the 1 GiB file; /dev/zero grew until
 * an allocation failed). */
static void test_bounded_reads(void)
{
    char args[4096], file[400], big[400];
    snprintf(file, sizeof file, "%s", path_of("bounded.kvs"));
    snprintf(big, sizeof big, "%s", path_of("big.kvs"));
    remove(file);
    const char *pol = "--policy h2o:budget=6,recent_window=2";
    snprintf(args, sizeof args, "generate --model %s --prompt 'the cab' --steps 3 %s --session %s",
             model0, pol, file);
    ASSERT_RUNS(args);
    size_t n = 0;
    char *img = fx_slurp(file, &n);
    ASSERT_TRUE(img && n > LM_SESSION_HEADER);
    FILE *f = fopen(big, "wb");
    ASSERT_TRUE(f && fwrite(img, 1, n, f) == n && fclose(f) == 0);
    free(img);
    ASSERT_TRUE(truncate(big, (off_t)1 << 30) == 0); /* sparse: no disk used */
    struct rusage ru;
    snprintf(args, sizeof args, "generate --model %s --prompt ' a' --steps 1 %s --session %s",
             model0, pol, big);
    ASSERT_FAILS(args, 1, "generate", "more than");
    ASSERT_CONTAINS(err_text, "1073741824 bytes");
    ASSERT_TRUE(getrusage(RUSAGE_CHILDREN, &ru) == 0);
    ASSERT_TRUE(ru.ru_maxrss < 200 * 1024); /* KiB: every child so far, this one included */
    remove(big);
    snprintf(args, sizeof args, "generate --model %s --prompt ' a' --steps 1 %s --session "
             "/dev/zero", model0, pol);
    ASSERT_FAILS(args, 1, "generate", "bad magic");
    snprintf(args, sizeof args, "lm eval --model %s --tokenizer /dev/zero --text %s", model0,
             textpath);
    ASSERT_FAILS(args, 1, "lm eval", "larger than 67108864 bytes");
    ASSERT_TRUE(getrusage(RUSAGE_CHILDREN, &ru) == 0);
    ASSERT_TRUE(ru.ru_maxrss < 200 * 1024);
    remove(file);
    /* The size a header states is bounded by the largest session this
     * decoder could have written after the header's tokens: a full cache's
     * session is exactly that large, one byte more is refused. Before: any
     * size up to SIZE_MAX - 2, so a FIFO with a header stating 2^40 bytes
     * and endless data behind it grew until allocation failed. */
    snprintf(args, sizeof args, "generate --model %s --prompt 'the cab' --steps 3 --session %s",
             model0, file);
    ASSERT_RUNS(args);
    img = fx_slurp(file, &n);
    ASSERT_TRUE(img && n > LM_SESSION_HEADER);
    unsigned char *h = (unsigned char *)img;
    const uint64_t tokens = h[64] | (uint64_t)h[65] << 8 | (uint64_t)h[66] << 16 |
                            (uint64_t)h[67] << 24;
    char want[200];
    snprintf(want, sizeof want, "the header states %zu bytes, more than the %zu a session of "
             "its %llu tokens", n + 1, n, (unsigned long long)tokens);
    for (int k = 0; k < 8; k++) /* the stated size, one more than it is */
        h[112 + k] = (unsigned char)((uint64_t)(n + 1) >> (8 * k));
    f = fopen(big, "wb");
    ASSERT_TRUE(f && fwrite(img, 1, n, f) == n && fputc(0, f) == 0 && fclose(f) == 0);
    snprintf(args, sizeof args, "generate --model %s --prompt ' a' --steps 1 --session %s",
             model0, big);
    ASSERT_FAILS(args, 1, "generate", want);
    /* a session of other options is not held to this decoder's bound: its
     * difference is named, exit 2 (a short session with a policy is larger
     * than the bound of a decoder without one) */
    remove(file);
    snprintf(args, sizeof args, "generate --model %s --prompt 'the' --steps 2 %s --session %s",
             model0, pol, file);
    ASSERT_RUNS(args);
    snprintf(args, sizeof args, "generate --model %s --prompt ' a' --steps 1 --session %s",
             model0, file);
    ASSERT_FAILS(args, 2, "generate", "policy: the session's is 'h2o:budget=6,recent_window=2', "
                                      "this decoder's 'none'");
    for (int k = 0; k < 8; k++) /* 2^40 bytes, over a FIFO fed 300 MB */
        h[112 + k] = (unsigned char)(((uint64_t)1 << 40) >> (8 * k));
    f = fopen(big, "wb");
    ASSERT_TRUE(f && fwrite(img, 1, LM_SESSION_HEADER, f) == LM_SESSION_HEADER && fclose(f) == 0);
    free(img);
    char fifo[400], cmd[2000];
    snprintf(fifo, sizeof fifo, "%s", path_of("endless.kvs"));
    remove(fifo);
    ASSERT_TRUE(mkfifo(fifo, 0600) == 0);
    snprintf(cmd, sizeof cmd, "(cat %s; head -c 300000000 /dev/zero) >%s 2>/dev/null &", big,
             fifo);
    ASSERT_TRUE(system(cmd) == 0);
    snprintf(args, sizeof args, "generate --model %s --prompt ' a' --steps 1 --session %s",
             model0, fifo);
    ASSERT_FAILS(args, 1, "generate", "the header states 1099511627776 bytes, more than the");
    ASSERT_TRUE(getrusage(RUSAGE_CHILDREN, &ru) == 0);
    ASSERT_TRUE(ru.ru_maxrss < 200 * 1024);
    int unblock = open(fifo, O_RDONLY | O_NONBLOCK); /* a writer still waiting: let it go */
    if (unblock >= 0)
        close(unblock);
    remove(fifo), remove(big), remove(file);
}

/* A model file truncated while generate decodes from its mapping: one line
 * naming it, exit 1, the session as it was and no temporary left beside it
 * (before: killed by SIGBUS, exit 135, no message); any other SIGBUS is a
 * plain bus error, exit 1. */
static void test_model_truncated_while_running(void)
{
    char args[4096], copy[400], sess[400], cmd[8192], rcpath[400], o[400], e[400];
    snprintf(o, sizeof o, "%s", path_of("stdout"));
    snprintf(e, sizeof e, "%s", path_of("stderr"));
    snprintf(copy, sizeof copy, "%s", path_of("victim.bin"));
    snprintf(sess, sizeof sess, "%s", path_of("bus.kvs"));
    snprintf(rcpath, sizeof rcpath, "%s", path_of("bus.rc"));
    remove(sess);
    size_t n = 0;
    char *img = fx_slurp(model0, &n);
    FILE *f = fopen(copy, "wb");
    ASSERT_TRUE(img && f && fwrite(img, 1, n, f) == n && fclose(f) == 0);
    free(img);
    const char *pol = "--policy window:budget=8";
    snprintf(args, sizeof args, "generate --model %s --prompt 'the' --steps 2 %s --session %s",
             copy, pol, sess);
    ASSERT_RUNS(args);
    size_t n0 = 0, n1 = 0;
    char *s0 = fx_slurp(sess, &n0);
    /* a run of a million steps (minutes), its model emptied once it runs */
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --prompt ' a' --steps 1000000 %s --session %s >%s 2>%s & "
             "pid=$!; i=0; while [ ! -s %s ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; "
             ": >%s; wait $pid; echo $? >%s",
             kvevict, copy, pol, sess, o, e, o, copy, rcpath);
    remove(o); /* waited for: the run's first token */
    ASSERT_TRUE(system(cmd) == 0);
    char *rc = fx_slurp(rcpath, NULL);
    char *err = fx_slurp(e, NULL);
    ASSERT_TRUE(rc && err);
    ASSERT_STR_EQ(rc, "1\n");
    char said[600];
    snprintf(said, sizeof said, "kvevict generate: the model file %s was truncated or changed",
             copy);
    ASSERT_TRUE(strncmp(err, said, strlen(said)) == 0);
    ASSERT_TRUE(strchr(err, '\n') == strrchr(err, '\n'));
    char *s1 = fx_slurp(sess, &n1);
    ASSERT_TRUE(s0 && s1 && n0 == n1 && memcmp(s0, s1, n0) == 0);
    snprintf(cmd, sizeof cmd, "ls -a %s | grep -c 'bus.kvs.' >/dev/null", path_of(""));
    ASSERT_TRUE(system(cmd) != 0); /* no temporary beside it */
    free(rc), free(err), free(s1);
    /* a SIGBUS that is not the model's (here sent with kill, the model
     * intact): a plain bus error, exit 1, the session as it was (before:
     * "the model file was truncated or changed", which was not so) */
    remove(o);
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --prompt ' a' --steps 1000000 %s --session %s >%s 2>%s & "
             "pid=$!; i=0; while [ ! -s %s ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; "
             "kill -BUS $pid; wait $pid; echo $? >%s",
             kvevict, model0, pol, sess, o, e, o, rcpath);
    ASSERT_TRUE(system(cmd) == 0);
    rc = fx_slurp(rcpath, NULL);
    err = fx_slurp(e, NULL);
    ASSERT_TRUE(rc && err);
    ASSERT_STR_EQ(rc, "1\n");
    ASSERT_STR_EQ(err, "kvevict generate: bus error (SIGBUS sent by another process); stopped, "
                       "no file written\n");
    s1 = fx_slurp(sess, &n1);
    ASSERT_TRUE(s1 && n0 == n1 && memcmp(s0, s1, n0) == 0);
    free(rc), free(err), free(s0), free(s1);
    remove(copy), remove(sess), remove(rcpath);
}

/* Two runs on one session lose nothing silently: while a run holds the
 * session (here this process holds its lock), another is refused at once;
 * a run whose session was replaced while it decoded (another run saved
 * first) refuses to save over it, exit 1; a temporary left beside it by a
 * killed run (nobody holds its lock) is removed by the next save, with a
 * warning, and a live writer's is left alone. Before: both runs exited 0
 * and one continuation was lost; temporaries stayed forever. */
static void test_session_concurrency(void)
{
    char args[4096], sess[400], other[400], cmd[8192], rcpath[400], o[400], e[400];
    char stale[400], live[400];
    snprintf(sess, sizeof sess, "%s", path_of("shared.kvs"));
    snprintf(other, sizeof other, "%s", path_of("other.kvs"));
    snprintf(rcpath, sizeof rcpath, "%s", path_of("shared.rc"));
    snprintf(o, sizeof o, "%s", path_of("stdout"));
    snprintf(e, sizeof e, "%s", path_of("stderr"));
    snprintf(stale, sizeof stale, "%s", path_of("shared.kvs.tmp.kvevict.AbC123"));
    snprintf(live, sizeof live, "%s", path_of("shared.kvs.tmp.kvevict.XyZ789"));
    remove(sess), remove(other);
    const char *pol = "--policy window:budget=8";
    snprintf(args, sizeof args, "generate --model %s --prompt 'the' --steps 2 %s --session %s",
             model0, pol, sess);
    ASSERT_RUNS(args);
    snprintf(args, sizeof args, "generate --model %s --prompt 'the' --steps 3 %s --session %s",
             model0, pol, other);
    ASSERT_RUNS(args);
    /* held by another run */
    int fd = open(sess, O_RDONLY);
    ASSERT_TRUE(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0);
    size_t n0 = 0, n1 = 0;
    char *s0 = fx_slurp(sess, &n0);
    snprintf(args, sizeof args, "generate --model %s --prompt ' a' --steps 2 %s --session %s",
             model0, pol, sess);
    ASSERT_FAILS(args, 1, "generate", "is in use by another run");
    close(fd);
    char *s1 = fx_slurp(sess, &n1);
    ASSERT_TRUE(s0 && s1 && n0 == n1 && memcmp(s0, s1, n0) == 0);
    free(s1);
    /* replaced while this run decodes: not saved over */
    remove(o);
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --prompt ' a' --steps 300000 %s --session %s >%s 2>%s & "
             "pid=$!; i=0; while [ ! -s %s ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; "
             "cp %s %s.new && mv %s.new %s; wait $pid; echo $? >%s",
             kvevict, model0, pol, sess, o, e, o, other, sess, sess, sess, rcpath);
    ASSERT_TRUE(system(cmd) == 0);
    char *rc = fx_slurp(rcpath, NULL), *err = fx_slurp(e, NULL);
    ASSERT_TRUE(rc && err);
    ASSERT_STR_EQ(rc, "1\n");
    ASSERT_CONTAINS(err, "was replaced since this run read it; not saved");
    char *want = fx_slurp(other, &n0);
    s1 = fx_slurp(sess, &n1);
    ASSERT_TRUE(want && s1 && n0 == n1 && memcmp(want, s1, n0) == 0); /* the other run's */
    free(rc), free(err), free(want), free(s1), free(s0);
    /* temporaries: a killed run's (the exact pattern, nobody's lock, an
     * hour old) removed; a live one's (locked) kept; and kept too, since the
     * sweep cannot tell them from a live run's or must not touch them: one
     * younger than a minute whose lock is free (a run between creating and
     * locking it, where the system has no O_TMPFILE) and a user's own files
     * (before: removed: "NAME.tmp." and any six characters) */
    char fresh[400], mine[400], near[400];
    snprintf(fresh, sizeof fresh, "%s", path_of("shared.kvs.tmp.kvevict.NeW456"));
    snprintf(mine, sizeof mine, "%s", path_of("shared.kvs.tmp.AbC123"));
    snprintf(near, sizeof near, "%s", path_of("shared.kvs.tmp.kvevict.AbC-23"));
    const char *planted[5] = {stale, live, fresh, mine, near};
    for (int i = 0; i < 5; i++) {
        FILE *f = fopen(planted[i], "wb");
        ASSERT_TRUE(f && fputs("half a session", f) >= 0 && fclose(f) == 0);
        struct timespec old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
        if (planted[i] != fresh)
            ASSERT_TRUE(utimensat(AT_FDCWD, planted[i], old, 0) == 0);
    }
    int lfd = open(live, O_RDONLY);
    ASSERT_TRUE(lfd >= 0 && flock(lfd, LOCK_EX | LOCK_NB) == 0);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(err_text, "warning: removed");
    ASSERT_CONTAINS(err_text, "shared.kvs.tmp.kvevict.AbC123, a temporary file a killed run left");
    ASSERT_TRUE(strstr(strstr(err_text, "warning: removed") + 1, "warning: removed") == NULL);
    ASSERT_TRUE(access(stale, F_OK) != 0);
    for (int i = 1; i < 5; i++)
        ASSERT_TRUE(access(planted[i], F_OK) == 0);
    close(lfd);
    for (int i = 1; i < 5; i++)
        remove(planted[i]);
    remove(sess), remove(other), remove(rcpath);
}

/* One idea, one option however hyphenated: generate's sampling --top-k is
 * also --topk (the recall option's spelling elsewhere); a name that spells
 * no option is still refused. */
static void test_option_spellings(void)
{
    char args[4096];
    const char *common = "--prompt 'the cab' --steps 9 --temperature 1.3 --seed 5 --json";
    snprintf(args, sizeof args, "generate --model %s %s --top-k 3", model0, common);
    ASSERT_RUNS(args);
    char *hyphen = strdup(out_text);
    ASSERT_TRUE(hyphen != NULL);
    snprintf(args, sizeof args, "generate --model %s %s --topk 3", model0, common);
    ASSERT_RUNS(args);
    ASSERT_TRUE(strcmp(hyphen, out_text) == 0);
    snprintf(args, sizeof args, "generate --model %s %s --top-k 1", model0, common);
    ASSERT_RUNS(args);
    ASSERT_TRUE(strcmp(hyphen, out_text) != 0); /* the value is read: top-k 1 is greedy */
    free(hyphen);
    snprintf(args, sizeof args, "generate --model %s %s --top-kk 3", model0, common);
    ASSERT_FAILS(args, 2, "generate", "--top-kk");
}

static void test_generate_refusals(void)
{
    char args[4096], bad[400];
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, FX_PIECES, T_, 1, check_seed);
    fx.wq[5] = NAN;
    snprintf(bad, sizeof bad, "%s", path_of("nan.bin"));
    fx_write_model(&fx, 1, bad);
    snprintf(args, sizeof args, "lm logits --model %s --tokens 1,2", bad);
    ASSERT_FAILS(args, 1, "lm logits", "tensor wq holds NaN at element 5");
    fx.wq[5] = 0;
    fx.w2[0] = INFINITY;
    fx_write_model(&fx, 0, bad);
    snprintf(args, sizeof args, "generate --model %s --tokenizer %s", bad, tokpath);
    ASSERT_FAILS(args, 1, "generate", "tensor w2 holds an infinity at element 0");
    fx.w2[0] = 0;
    /* Finite weights whose activations overflow: the logits (an output norm
     * of 1e38), then the attention (an attention norm of 1e30: q.k
     * overflows). Refused while
     * decoding, exit 1, with a policy or without, and no session written
     * (before: without a policy it printed <unk> and exited 0, with one it
     * exited 2; generate --session saved a file the next run refused). */
    char sess[400];
    snprintf(sess, sizeof sess, "%s", path_of("overflow.kvs"));
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < D_; i++)
            if (k == 0)
                fx.rms_final[i] = 1e38f;
            else
                fx.rms_att[i] = 1e30f;
        fx_write_model(&fx, 0, bad);
        for (int pol = 0; pol < 2; pol++) {
            remove(sess);
            snprintf(args, sizeof args, "generate --model %s --tokenizer %s --prompt 'the' "
                     "--steps 2 %s --session %s", bad, tokpath,
                     pol ? "--policy h2o:budget=6,recent_window=2" : "", sess);
            ASSERT_FAILS(args, 1, "generate", k ? "attention weight 0 of query head 0" : "logit");
            ASSERT_CONTAINS(err_text, "overflow float32 (its weights are finite)");
            ASSERT_TRUE(access(sess, F_OK) != 0);
        }
        snprintf(args, sizeof args, "lm logits --model %s --tokens 1,2", bad);
        ASSERT_FAILS(args, 1, "lm logits", "overflow float32");
    }
    fx_model_free(&fx);
    const char *src = getenv("KVE_SOURCE_DIR");
    if (!src)
        return;
    snprintf(args, sizeof args,
             "generate --model %s/models/kjv.bin --prompt 'The pass key is #' --steps 3 "
             "--allow-key-tokens", src);
    ASSERT_RUNS(args);
    ASSERT_CONTAINS(out_text, "<key");
    snprintf(args, sizeof args,
             "generate --model %s/models/kjv.bin --prompt 'The pass key is #' --steps 12", src);
    ASSERT_RUNS(args);
    ASSERT_TRUE(strstr(out_text, "<key") == NULL);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    const char *bin = getenv("KVE_BINARY_DIR");
    snprintf(kvevict, sizeof kvevict, "%s/kvevict", bin ? bin : ".");
    snprintf(convert, sizeof convert, "%s/kvevict-convert", bin ? bin : ".");
    if (access(kvevict, X_OK) != 0) {
        fprintf(stderr, "test_lm_cli: %s not found (set KVE_BINARY_DIR)\n", kvevict);
        return 1;
    }
    const char *oc = getenv("KVE_OUTCHECK");
    snprintf(outcheck, sizeof outcheck, "%s", oc ? oc : "outcheck");
    if (tmpdir_make("kve-lm-cli") != 0)
        return 1;
    make_fixtures();
    if (lm_model_open(model0, NULL, &lib_model) != KVE_OK || lm_model_open(model1, NULL, &lib_model1) != KVE_OK ||
        lm_tokenizer_open(tokpath, NULL, &lib_tok) != KVE_OK) {
        fprintf(stderr, "test_lm_cli: fixtures: %s\n", kve_last_error());
        return 1;
    }
    RUN(test_logits);
    RUN(test_errors);
    RUN(test_eval);
    RUN(test_same_positions_cli);
    RUN(test_batch_option);
    RUN(test_budgets_written);
    RUN(test_recall);
    RUN(test_dump);
    RUN(test_dump_qk);
    RUN(test_prefill_cmd);
    RUN(test_machine_outputs);
    RUN(test_stream);
    RUN(test_lm_trace);
    RUN(test_generate);
    RUN(test_gguf);
    RUN(test_convert);
    RUN(test_generate_samples);
    RUN(test_lm_generate_alias);
    RUN(test_generate_session);
    RUN(test_generate_refusals);
    RUN(test_option_spellings);
    RUN(test_session_file_modes);
    RUN(test_bounded_reads);
    RUN(test_model_truncated_while_running);
    RUN(test_session_concurrency);
    lm_model_free(lib_model);
    lm_model_free(lib_model1);
    lm_tokenizer_free(lib_tok);
    free(text);
    free(out_text);
    free(err_text);
    remove_dir();
    return CHECK_DONE();
}
