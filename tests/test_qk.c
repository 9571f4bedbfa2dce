/* SPDX-License-Identifier: MIT */
/*
 * test_qk.c - query/key traces ("qk:PATH", src/eval/trace_qk.c).
 *
 * Files are written here, byte by byte, as numpy's np.save writes them (two
 * arrays back to back). Checked:
 *   - every row against a naive computation in double (softmax of the scaled
 *     dot products over [0, t], the group of query heads averaged), within
 *     2e-6; each row of a one-query-head group equals kve_attn_row's output
 *     bit for bit (the definition); keys read back exactly (float32 files)
 *     or rounded once (float64);
 *   - the q/K trace against the dense .npy written from the same vectors
 *     (the naive rows in float64): the harness's metrics for every policy
 *     that reads attention agree within 1e-6 (retained mass) and exactly
 *     (top-32 recall: the same top sets), and so do the victims;
 *   - the policies that read keys, run by the harness on a q/K trace, take
 *     the victims tests/reference.h takes when stepped with the file's keys;
 *   - every malformed file refused with KVE_EFORMAT (or KVE_EIO) and a
 *     message naming the fault, *out untouched; a row whose logits overflow
 *     float32 refused when read; kve_trace_key's refusals; a job that reads
 *     keys refused on a trace without them;
 *   - progress, cancellation, and allocation failure at every allocation of
 *     opening.
 * Deterministic per seed (printed; replay with argv[1]).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "test_allocator.h"
#include "internal.h"
#include "kvevict_eval.h"
#include "eval_options.h"
#include "npy_file.h"
#include "reference.h"
#include "tmpdir.h"

#include <float.h>

enum { L = 2, H = 4, G = 2, T = 150, D = 12, R = H / G };

static float q[L][H][T][D], k[L][G][T][D];
static double dense[L][G][T][T];
static char qk_path[512], npy_path[512], src[600];
static int dir_made;

/* ---- writing files as numpy does ---- */

/* Writes q then k (float32, or float64 when f8) as a q/K file. */
static void write_qk(const char *path, int f8)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    size_t dq[4] = {L, H, T, D}, dk[4] = {L, G, T, D};
    const float *arrays[2] = {&q[0][0][0][0], &k[0][0][0][0]};
    size_t counts[2] = {(size_t)L * H * T * D, (size_t)L * G * T * D};
    for (int a = 0; a < 2; a++) {
        if (npy_put_header(f, f8 ? "<f8" : "<f4", a ? dk : dq, 4) != 0)
            abort();
        for (size_t i = 0; i < counts[a]; i++) {
            if (f8) {
                double v = (double)arrays[a][i];
                fwrite(&v, 8, 1, f);
            } else {
                fwrite(&arrays[a][i], 4, 1, f);
            }
        }
    }
    fclose(f);
}

/* Random queries and keys, a few times larger than unit so rows are peaked. */
static void make_vectors(uint64_t seed)
{
    kve_rng g;
    kve_rng_seed(&g, seed);
    for (size_t l = 0; l < L; l++)
        for (size_t t = 0; t < T; t++) {
            for (size_t h = 0; h < H; h++)
                for (size_t j = 0; j < D; j++)
                    q[l][h][t][j] = (float)(kve_rng_uniform(&g) * 4.0 - 2.0);
            for (size_t h = 0; h < G; h++)
                for (size_t j = 0; j < D; j++)
                    k[l][h][t][j] = (float)(kve_rng_uniform(&g) * 4.0 - 2.0);
        }
}

/* The definition in double: the group's softmaxes over [0, t], averaged. */
static void naive_rows(void)
{
    double scale = 1.0 / sqrt((double)D), logit[T];
    for (size_t l = 0; l < L; l++)
        for (size_t g = 0; g < G; g++)
            for (size_t t = 0; t < T; t++) {
                for (size_t i = 0; i < T; i++)
                    dense[l][g][t][i] = 0.0;
                for (size_t r = 0; r < R; r++) {
                    size_t h = g * R + r;
                    double m = -INFINITY, sum = 0;
                    for (size_t i = 0; i <= t; i++) {
                        double dot = 0;
                        for (size_t j = 0; j < D; j++)
                            dot += (double)q[l][h][t][j] * (double)k[l][g][i][j];
                        logit[i] = scale * dot;
                        m = logit[i] > m ? logit[i] : m;
                    }
                    for (size_t i = 0; i <= t; i++)
                        sum += exp(logit[i] - m);
                    for (size_t i = 0; i <= t; i++)
                        dense[l][g][t][i] += exp(logit[i] - m) / sum / (double)R;
                }
            }
}

static void write_dense(const char *path)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    size_t dims[4] = {L, G, T, T};
    ASSERT_TRUE(npy_put_header(f, "<f8", dims, 4) == 0);
    fwrite(dense, sizeof(double), (size_t)L * G * T * T, f);
    fclose(f);
}

/* dir/name into path, and "qk:" + path into source. */
static void qk_file(const char *name, char path[600], char source[700])
{
    snprintf(path, 600, "%s/%s", dir, name);
    snprintf(source, 700, "qk:%s", path);
}

static void setup(void)
{
    if (!dir_made) {
        if (tmpdir_make("kvevict-qk") != 0)
            abort();
        dir_made = 1;
        snprintf(qk_path, sizeof qk_path, "%s/t.qk", dir);
        snprintf(npy_path, sizeof npy_path, "%s/t.npy", dir);
        snprintf(src, sizeof src, "qk:%s", qk_path);
    }
    make_vectors(check_seed);
    write_qk(qk_path, 0);
    naive_rows();
    write_dense(npy_path);
}

/* ---- rows and keys ---- */

static double row[T];

static void test_rows_match_naive(void)
{
    setup();
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open(src, NULL, &tr));
    ASSERT_EQ(kve_trace_steps(tr), T);
    ASSERT_EQ(kve_trace_heads(tr), L * G);
    ASSERT_EQ(kve_trace_layers(tr), L);
    ASSERT_EQ(kve_trace_key_dim(tr), D);
    ASSERT_STR_EQ(kve_trace_source(tr), src);
    double worst = 0;
    for (size_t h = 0; h < L * G; h++)
        for (size_t t = 0; t < T; t++) {
            size_t tt = (h % 2) ? T - 1 - t : t; /* some heads in descending order */
            ASSERT_OK(kve_trace_row(tr, h, tt, row, tt + 1));
            double sum = 0;
            for (size_t i = 0; i <= tt; i++) {
                double diff = fabs(row[i] - dense[h / G][h % G][tt][i]);
                worst = diff > worst ? diff : worst;
                sum += row[i];
            }
            ASSERT_NEAR(sum, 1.0, 1e-5);
        }
    printf("  largest difference to the naive rows: %.3g\n", worst);
    ASSERT_TRUE(worst <= 2e-6);
    /* Keys read back exactly, from any head in any order. */
    float key[D];
    for (size_t h = 0; h < L * G; h++)
        for (size_t t = 0; t < T; t += 7) {
            ASSERT_OK(kve_trace_key(tr, L * G - 1 - h, t, key, kve_trace_key_dim(tr)));
            ASSERT_TRUE(memcmp(key, k[(L * G - 1 - h) / G][(L * G - 1 - h) % G][t], sizeof key) ==
                        0);
        }
    kve_trace_free(tr);
}

/* Every `stride`-th row of head ha of a equals that of head hb of b: bit
 * for bit, or (f32) once rounded to float32. */
static void same_rows(kve_trace *a, size_t ha, kve_trace *b, size_t hb, size_t stride, int f32)
{
    static double ra[T], rb[T];
    for (size_t t = 0; t < T; t += stride) {
        ASSERT_OK(kve_trace_row(a, ha, t, ra, t + 1));
        ASSERT_OK(kve_trace_row(b, hb, t, rb, t + 1));
        for (size_t i = 0; i <= t; i++)
            if (rb[i] != (f32 ? (double)(float)ra[i] : ra[i]))
                CHECK_FAIL_AT("row %zu key %zu: %.17g against %.17g", t, i, ra[i], rb[i]);
    }
}

/* With one query head a KV head, a row is kve_attn_row's, bit for bit. */
static void test_rows_are_attn_rows(void)
{
    setup();
    char path[600], one[700];
    qk_file("one.qk", path, one);
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    size_t dims[2] = {T, D};
    ASSERT_TRUE(npy_put_header(f, "<f4", dims, 2) == 0);
    fwrite(q[1][3], sizeof(float), (size_t)T * D, f);
    ASSERT_TRUE(npy_put_header(f, "<f4", dims, 2) == 0);
    fwrite(k[1][1], sizeof(float), (size_t)T * D, f);
    fclose(f);
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open(one, NULL, &tr));
    ASSERT_EQ(kve_trace_heads(tr), 1);
    ASSERT_EQ(kve_trace_layers(tr), 1);
    float want[T];
    float scale = (float)(1.0 / sqrt((double)D));
    for (size_t t = 0; t < T; t++) {
        ASSERT_OK(kve_trace_row(tr, 0, t, row, t + 1));
        ASSERT_OK(kve_attn_row(q[1][3][t], D, &k[1][1][0][0], D, t + 1, scale, want));
        for (size_t i = 0; i <= t; i++)
            if (row[i] != (double)want[i])
                CHECK_FAIL_AT("row %zu key %zu: %.9g, kve_attn_row %.9g", t, i, row[i],
                              (double)want[i]);
    }
    kve_trace_free(tr);
    /* A float64 file of the same vectors gives the same rows. */
    char p8[600], s8[700];
    qk_file("f8.qk", p8, s8);
    write_qk(p8, 1);
    kve_trace *a = NULL;
    ASSERT_OK(kve_trace_open(s8, NULL, &a));
    kve_trace *b = NULL;
    ASSERT_OK(kve_trace_open(src, NULL, &b));
    same_rows(a, 3, b, 3, 13, 0);
    kve_trace_free(a);
    kve_trace_free(b);
}

/* ---- the q/K trace against the dense .npy of the same vectors ---- */

typedef struct victims_log {
    size_t n;
    int32_t v[2][T * 4]; /* per trace: every victim of job 1, in order */
    size_t count[2];
    int which;
} victims_log;

static int log_victims(void *user, size_t job, int32_t pos, const int32_t *victims, size_t nv)
{
    victims_log *lg = user;
    (void)pos;
    if (job == 1)
        for (size_t i = 0; i < nv && lg->count[lg->which] < T * 4; i++)
            lg->v[lg->which][lg->count[lg->which]++] = victims[i];
    return 0;
}

static void test_matches_the_dense_file(void)
{
    setup();
    static const kve_eval_job jobs[] = {
        {"h2o:budget=24,recent_window=4", 0}, {"tova:budget=20,recent_window=1", 0},
        {"h2o_mean:budget=30,recent_window=4", 0}, {"scissorhands:budget=24,recent_window=4", 0},
        {"streaming:budget=20,sinks=2", 0},    {"window:budget=16", 0},
        {"h2o_decay:budget=40,recent_window=8", 0},
    };
    enum { J = sizeof jobs / sizeof jobs[0] };
    kve_eval_result a[J], b[J];
    kve_trace *tq = NULL, *tn = NULL;
    ASSERT_OK(kve_trace_open(src, NULL, &tq));
    ASSERT_OK(kve_trace_open(npy_path, NULL, &tn));
    ASSERT_EQ(kve_trace_key_dim(tn), 0);
    static victims_log lg;
    memset(&lg, 0, sizeof lg);
    double worst = 0;
    for (size_t h = 0; h < L * G; h++) {
        kve_eval_options o = kve_eval_default_options();
        o.on_step = log_victims;
        o.user = &lg;
        lg.which = 0;
        lg.count[0] = lg.count[1] = 0;
        ASSERT_OK(kve_eval(tq, h, 1, jobs, J, &o, a, NULL));
        lg.which = 1;
        ASSERT_OK(kve_eval(tn, h, 1, jobs, J, &o, b, NULL));
        for (size_t j = 0; j < J; j++) {
            double dm = fabs(a[j].retained_mass - b[j].retained_mass);
            worst = dm > worst ? dm : worst;
            ASSERT_NEAR(a[j].retained_mass, b[j].retained_mass, 1e-6);
            ASSERT_NEAR(a[j].min_retained_mass, b[j].min_retained_mass, 1e-6);
            ASSERT_TRUE(a[j].top32_recall == b[j].top32_recall);
            ASSERT_EQ(a[j].scored_steps, b[j].scored_steps);
        }
        ASSERT_EQ(lg.count[0], lg.count[1]);
        ASSERT_TRUE(lg.count[0] > 0 && memcmp(lg.v[0], lg.v[1], lg.count[0] * sizeof(int32_t)) == 0);
    }
    printf("  largest retained-mass difference, q/K against dense: %.3g\n", worst);
    /* The dense writer works on a q/K trace too. */
    char path[600];
    snprintf(path, sizeof path, "%s/w.npy", dir);
    ASSERT_OK(kve_trace_write_npy(tq, 3, path));
    kve_trace *w = NULL;
    ASSERT_OK(kve_trace_open(path, NULL, &w));
    same_rows(tq, 3, w, 0, 11, 1);
    kve_trace_free(w);
    kve_trace_free(tq);
    kve_trace_free(tn);
}

/* ---- the policies that read keys, through the harness ---- */

static int32_t harness_v[T * 4];
static size_t harness_n;

static int keep_victims(void *user, size_t job, int32_t pos, const int32_t *victims, size_t nv)
{
    (void)user;
    (void)pos;
    if (job == 0)
        for (size_t i = 0; i < nv; i++)
            harness_v[harness_n++] = victims[i];
    return 0;
}

static void test_key_policies_in_the_harness(void)
{
    setup();
    static const char *const specs[] = {"knorm:budget=20,recent_window=0",
                                        "knorm:budget=24,recent_window=5",
                                        "keydiff:budget=20,recent_window=0",
                                        "keydiff:budget=31,recent_window=3"};
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open(src, NULL, &tr));
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++)
        for (size_t h = 0; h < L * G; h += 3) {
            kve_eval_job jobs[2] = {{specs[s], 0}, {"h2o:budget=16,recent_window=2", 0}};
            kve_eval_result res[2];
            kve_eval_options o = kve_eval_default_options();
            o.on_step = keep_victims;
            harness_n = 0;
            ASSERT_OK(kve_eval(tr, h, 1, jobs, 2, &o, res, NULL));
            ASSERT_TRUE(res[0].retained_mass > 0 && res[0].retained_mass <= 1.0);
            /* the reference, stepped with the file's keys */
            ref_policy *r = ref_new_keys(specs[s], NULL, D);
            ASSERT_TRUE(r != NULL);
            int32_t v[T];
            size_t nv, got = 0;
            for (size_t t = 0; t < T; t++) {
                ASSERT_EQ(ref_step_keys(r, (int32_t)t, NULL, 0, k[h / G][h % G][t]), 0);
                ASSERT_EQ(ref_evict(r, r->budget, v, &nv), 0);
                for (size_t i = 0; i < nv; i++, got++)
                    if (got >= harness_n || harness_v[got] != v[i])
                        CHECK_FAIL_AT("%s head %zu at %zu: the harness's victim differs from "
                                      "the reference's %ld", specs[s], h, t, (long)v[i]);
            }
            ASSERT_EQ(got, harness_n);
            ref_free(r);
        }
    kve_trace_free(tr);
    /* On a trace without keys such a job is refused, naming it. */
    kve_trace *c = NULL;
    ASSERT_OK(kve_trace_open("canonical:steps=100", NULL, &c));
    kve_eval_job job = {"knorm:budget=16", 0};
    kve_eval_result res;
    ASSERT_STATUS(kve_eval(c, 0, 1, &job, 1, EVAL_OPTS(0, NULL, NULL), &res, NULL), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "job 0 (\"knorm:budget=16\"): the policy reads keys, but "
                                      "the trace has none");
    float key[D];
    ASSERT_STATUS(kve_trace_key(c, 0, 0, key, kve_trace_key_dim(c)), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "has no keys");
    ASSERT_EQ(kve_trace_key_dim(c), 0);
    ASSERT_EQ(kve_trace_key_dim(NULL), 0);
    kve_trace_free(c);
    ASSERT_OK(kve_trace_open(src, NULL, &tr));
    ASSERT_STATUS(kve_trace_key(NULL, 0, 0, key, kve_trace_key_dim(NULL)), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_key(tr, 0, 0, NULL, kve_trace_key_dim(tr)), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_key(tr, L * G, 0, key, kve_trace_key_dim(tr)), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "head 4 is out of range");
    ASSERT_STATUS(kve_trace_key(tr, 0, T, key, kve_trace_key_dim(tr)), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "step 150 is out of range");
    kve_trace_free(tr);
}

/* ---- malformed files ---- */

/* One file: Q's header and data (nq values of `dq` dims), K's likewise,
 * then `extra` bytes; values from the vectors, with value[at] = bad when
 * at >= 0 (index into Q then K). */
static void write_case(const char *path, const char *dq_descr, const size_t *dq, size_t nq_dims,
                       const char *dk_descr, const size_t *dk, size_t nk_dims, long at, double bad,
                       size_t drop, size_t extra)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    const char *descr[2] = {dq_descr, dk_descr};
    const size_t *dims[2] = {dq, dk};
    size_t nd[2] = {nq_dims, nk_dims};
    const float *data[2] = {&q[0][0][0][0], &k[0][0][0][0]};
    long index = 0;
    for (int a = 0; a < 2; a++) {
        if (!descr[a])
            continue;
        ASSERT_TRUE(npy_put_header(f, descr[a], dims[a], nd[a]) == 0);
        size_t count = 1, item = strcmp(descr[a], "<f8") == 0 ? 8 : 4;
        for (size_t i = 0; i < nd[a]; i++)
            count *= dims[a][i];
        if (a == 1 && drop)
            count -= drop;
        for (size_t i = 0; i < count; i++, index++) {
            double v = index == at ? bad : (double)data[a][i % ((size_t)L * G * T * D)];
            if (item == 8) {
                fwrite(&v, 8, 1, f);
            } else {
                float x = (float)v;
                fwrite(&x, 4, 1, f);
            }
        }
    }
    for (size_t i = 0; i < extra; i++)
        fputc(0, f);
    fclose(f);
}

static void test_malformed_files(void)
{
    setup();
    char path[600], source[700];
    qk_file("bad.qk", path, source);
    const size_t dq[4] = {L, H, T, D}, dk[4] = {L, G, T, D};
    const size_t dk_l[4] = {L + 1, G, T, D}, dk_t[4] = {L, G, T - 1, D}, dk_d[4] = {L, G, T, D + 1};
    const size_t dk_g3[4] = {L, 3, T, D}, dq3[3] = {H, T, D}, dk1[1] = {T}, dq1[1] = {T};
    const size_t dk0[4] = {L, 0, T, D}, dbig[4] = {1, 1, (size_t)1 << 31, 1};
    const size_t dwide[2] = {1, (size_t)KVE_MAX_KEY_DIM + 1};
    static const long qn = (long)L * H * T * D;
    static const struct {
        const char *name;
        int q_f8, k_f8;
        int q_none, k_none; /* leave the array out */
        int k_shape;        /* 0 dk, 1 dk_l, 2 dk_t, 3 dk_d, 4 dk_g3, 5 dq3-like, 6 1-D, 7 zero */
        long at;
        double bad;
        size_t drop, extra;
        const char *needle;
    } cases[] = {
        {"NaN in Q", 0, 0, 0, 0, 0, 17, NAN, 0, 0, "Q[0, 0, 1, 5] = nan is not finite"},
        {"inf in K", 0, 0, 0, 0, 0, qn + 3 * D + 2, INFINITY, 0, 0, "K[0, 0, 3, 2] = inf"},
        {"f8 beyond float32", 1, 1, 0, 0, 0, qn + D, 1e39, 0, 0, "beyond float32"},
        {"no K", 0, 0, 0, 1, 0, -1, 0, 0, 0, "no K array follows"},
        {"K truncated", 0, 0, 0, 0, 0, -1, 0, 5, 0, "truncated"},
        {"trailing bytes", 0, 0, 0, 0, 0, -1, 0, 0, 3, "trailing data"},
        {"L differs", 0, 0, 0, 0, 1, -1, 0, 0, 0, "the same L, T and d"},
        {"T differs", 0, 0, 0, 0, 2, -1, 0, 0, 0, "the same L, T and d"},
        {"d differs", 0, 0, 0, 0, 3, -1, 0, 0, 0, "the same L, T and d"},
        {"G does not divide H", 0, 0, 0, 0, 4, -1, 0, 0, 0, "not a multiple of 3 KV heads"},
        {"dimensions differ", 0, 0, 0, 0, 5, -1, 0, 0, 0, "same number of dimensions"},
        {"1-D", 0, 0, 0, 0, 6, -1, 0, 0, 0, "has 1 dimensions"},
        {"a zero dimension", 0, 0, 0, 0, 7, -1, 0, 0, 0, "dimension 1 is 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const size_t *kd = cases[i].k_shape == 1   ? dk_l
                           : cases[i].k_shape == 2 ? dk_t
                           : cases[i].k_shape == 3 ? dk_d
                           : cases[i].k_shape == 4 ? dk_g3
                           : cases[i].k_shape == 5 ? dq3
                           : cases[i].k_shape == 6 ? dk1
                           : cases[i].k_shape == 7 ? dk0
                                                   : dk;
        size_t kn = cases[i].k_shape == 5 ? 3 : cases[i].k_shape == 6 ? 1 : 4;
        write_case(path, cases[i].q_f8 ? "<f8" : "<f4", dq, 4,
                   cases[i].k_none ? NULL : cases[i].k_f8 ? "<f8" : "<f4", kd, kn, cases[i].at,
                   cases[i].bad, cases[i].drop, cases[i].extra);
        kve_trace *sentinel = (kve_trace *)&cases, *tr = sentinel;
        kve_status st = kve_trace_open(source, NULL, &tr);
        if (st != KVE_EFORMAT)
            CHECK_FAIL_AT("%s: %s, want KVE_EFORMAT (%s)", cases[i].name, kve_status_name(st),
                          kve_last_error());
        ASSERT_TRUE(tr == sentinel);
        ASSERT_CONTAINS(kve_last_error(), cases[i].needle);
        ASSERT_TRUE(strchr(kve_last_error(), '\n') == NULL);
    }
    /* Q alone malformed: 1-D, and a huge T, a huge d (headers only). */
    write_case(path, "<f4", dq1, 1, "<f4", dk1, 1, -1, 0, 0, 0);
    ASSERT_STATUS(kve_trace_open(source, NULL, &(kve_trace *){NULL}), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "Q has 1 dimensions");
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(npy_put_header(f, "<f4", dbig, 4) == 0);
    fclose(f);
    ASSERT_STATUS(kve_trace_open(source, NULL, &(kve_trace *){NULL}), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "Q's header promises");
    f = fopen(path, "wb");
    ASSERT_TRUE(npy_put_header(f, "<f4", dwide, 2) == 0);
    for (size_t i = 0; i < (size_t)KVE_MAX_KEY_DIM + 1; i++)
        fputc(0, f), fputc(0, f), fputc(0, f), fputc(0, f);
    ASSERT_TRUE(npy_put_header(f, "<f4", dwide, 2) == 0);
    for (size_t i = 0; i < (size_t)KVE_MAX_KEY_DIM + 1; i++)
        fputc(0, f), fputc(0, f), fputc(0, f), fputc(0, f);
    fclose(f);
    ASSERT_STATUS(kve_trace_open(source, NULL, &(kve_trace *){NULL}), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "exceeds the largest key dimension");
    /* Q's header itself bad: the .npy reader's message, naming the file. */
    f = fopen(path, "wb");
    fputs("not a numpy file at all", f);
    fclose(f);
    ASSERT_STATUS(kve_trace_open(source, NULL, &(kve_trace *){NULL}), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "bad magic");
    /* K's header bad: named as K. */
    write_case(path, "<f4", dq, 4, "<i4", dk, 4, -1, 0, 0, 0);
    ASSERT_STATUS(kve_trace_open(source, NULL, &(kve_trace *){NULL}), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "(K): .npy dtype '<i4'");
    /* Not a file, a directory, nothing after "qk:". */
    snprintf(source, sizeof source, "qk:%s/none.qk", dir);
    ASSERT_STATUS(kve_trace_open(source, NULL, &(kve_trace *){NULL}), KVE_EIO);
    ASSERT_CONTAINS(kve_last_error(), "cannot open");
    snprintf(source, sizeof source, "qk:%s", dir);
    ASSERT_STATUS(kve_trace_open(source, NULL, &(kve_trace *){NULL}), KVE_EIO);
    ASSERT_CONTAINS(kve_last_error(), "not a regular file");
    ASSERT_STATUS(kve_trace_open("qk:", NULL, &(kve_trace *){NULL}), KVE_EINVAL);
    ASSERT_STATUS(kve_trace_open("qk", NULL, &(kve_trace *){NULL}), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "qk:PATH");
}

/* Logits beyond float32 open fine (every value is a float) and are refused
 * when their row is read, naming head, row and query head. */
static void test_logit_overflow(void)
{
    setup();
    q[1][2][40][0] = 1e20f; /* only q(40) . k(5) leaves float32 */
    k[1][1][5][0] = 1e20f;
    write_qk(qk_path, 0);
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open(src, NULL, &tr));
    ASSERT_OK(kve_trace_row(tr, 3, 39, row, 40));
    ASSERT_STATUS(kve_trace_row(tr, 3, 40, row, 41), KVE_EFORMAT);
    ASSERT_CONTAINS(kve_last_error(), "head 3 (layer 1, KV head 1), row 40, query head 2");
    ASSERT_CONTAINS(kve_last_error(), "not finite");
    ASSERT_OK(kve_trace_row(tr, 3, 41, row, 42)); /* the next row is fine again */
    kve_trace_free(tr);
}

/* ---- progress and allocation ---- */

typedef struct prog {
    uint64_t calls, last, total;
    uint64_t stop_at;
} prog;

static int on_progress(void *user, uint64_t done, uint64_t total)
{
    prog *p = user;
    if (done < p->last || (p->total && total != p->total))
        return 2; /* regress: refused below as a cancellation, then caught */
    p->calls++;
    p->last = done;
    p->total = total;
    return p->stop_at && done >= p->stop_at;
}

static void test_progress_and_allocation(void)
{
    setup();
    prog p = {0};
    kve_trace *tr = NULL;
    ASSERT_OK(kve_trace_open(src, TRACE_OPTS(0, on_progress, &p), &tr));
    ASSERT_U64_EQ(p.total, (uint64_t)L * (H + G) * T);
    ASSERT_U64_EQ(p.last, p.total);
    ASSERT_TRUE(p.calls >= 2);
    kve_trace_free(tr);
    prog stop = {0};
    stop.stop_at = 1;
    kve_trace *sentinel = (kve_trace *)&stop;
    tr = sentinel;
    ASSERT_STATUS(kve_trace_open(src, TRACE_OPTS(0, on_progress, &stop), &tr), KVE_ECANCELED);
    ASSERT_TRUE(tr == sentinel);
    talloc ta, te;
    talloc_init(&ta);
    talloc_init(&te);
    kve_trace_options to = kve_trace_default_options();
    to.allocator = &ta.a;
    size_t k2 = 0;
    for (;; k2++) {
        ASSERT_TRUE(k2 < 64);
        tr = sentinel;
        talloc_fail_after(&ta, k2);
        kve_status st = kve_trace_open(src, &to, &tr);
        talloc_fail_after(&ta, SIZE_MAX);
        if (st == KVE_OK)
            break;
        ASSERT_STATUS(st, KVE_ENOMEM);
        ASSERT_TRUE(tr == sentinel);
        ASSERT_EQ(ta.blocks, 0);
    }
    ASSERT_TRUE(k2 >= 4);
    /* Reading rows and keys allocates nothing. */
    talloc_fail_after(&ta, 0);
    kve_status st = kve_trace_row(tr, 1, T - 1, row, T);
    float key[D];
    if (st == KVE_OK)
        st = kve_trace_key(tr, 2, 3, key, D);
    ASSERT_EQ(talloc_fail_after(&ta, SIZE_MAX), 0);
    ASSERT_OK(st);
    /* The key buffer must hold a key. */
    ASSERT_STATUS(kve_trace_key(tr, 2, 3, key, D - 1), KVE_ERANGE);
    ASSERT_CONTAINS(kve_last_error(), "buffer holds");
    /* The harness with a policy that reads keys (its key buffer included):
     * every failing allocation refused, the results untouched; then the
     * same results as a run that never failed. */
    const kve_eval_job jobs[2] = {{"keydiff:budget=16,recent_window=2", 0},
                                  {"h2o:budget=16,recent_window=2", 0}};
    kve_eval_result want[2], got[2];
    ASSERT_OK(kve_eval(tr, 1, 1, jobs, 2, NULL, want, NULL));
    kve_eval_options eo = kve_eval_default_options();
    eo.allocator = &te.a;
    for (k2 = 0;; k2++) {
        ASSERT_TRUE(k2 < 64);
        memset(got, 0x5a, sizeof got);
        talloc_fail_after(&te, k2);
        st = kve_eval(tr, 1, 1, jobs, 2, &eo, got, NULL);
        talloc_fail_after(&te, SIZE_MAX);
        ASSERT_EQ(te.blocks, 0);
        if (st == KVE_OK)
            break;
        ASSERT_STATUS(st, KVE_ENOMEM);
        ASSERT_TRUE(((const unsigned char *)got)[0] == 0x5a);
    }
    talloc_check_empty(&te);
    ASSERT_TRUE(k2 >= 5);
    for (int j = 0; j < 2; j++) {
        ASSERT_TRUE(got[j].retained_mass == want[j].retained_mass);
        ASSERT_TRUE(got[j].top32_recall == want[j].top32_recall);
    }
    kve_trace_free(tr);
    talloc_check_empty(&ta);
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_rows_match_naive);
    RUN(test_rows_are_attn_rows);
    RUN(test_matches_the_dense_file);
    RUN(test_key_policies_in_the_harness);
    RUN(test_malformed_files);
    RUN(test_logit_overflow);
    RUN(test_progress_and_allocation);
    remove_dir();
    return CHECK_DONE();
}
