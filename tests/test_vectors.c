/* SPDX-License-Identifier: MIT */
/*
 * test_vectors.c - runs every distinguishing vector in tests/vectors/ (files named *.vec)
 * (format: tests/vectors/README.md) against every policy it names, and
 * refuses malformed vector files with file:line and a reason.
 *
 * A vector is parsed and validated completely before anything runs, so a
 * malformed file is reported as such, never as a policy failure. Each
 * `expect` line builds its policy afresh (Rng seeded from the file's `seed`),
 * replays every step and evict, and compares the final kept set. Every
 * registered policy that can run the file must have at least one `expect`
 * line in it (the policies that read keys run the files that give keys:
 * a `dim` line and a key at every step; those that read queries and values,
 * the files with a `queries` line, whose steps give a query and a value of
 * dim floats too), and each `separates A B` line must name two
 * expectations that differ.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"
#include "kvevict.h"
#include "read_file.h"

#include <dirent.h>
#include <errno.h>

enum {
    MAX_OPS = 256, MAX_W = 64, MAX_EXPECT = 32, MAX_KEPT = 64, MAX_SEP = 16, SPEC_LEN = 160,
    MAX_DIM = 16
};

typedef struct vop {
    int line;
    int is_evict;
    int32_t pos;     /* step */
    int null;        /* step: no information */
    size_t nw;       /* step: listed weights */
    int32_t wpos[MAX_W];
    float w[MAX_W];
    float key[MAX_DIM]; /* step: the key of pos, when the vector has a dim */
    float query[MAX_DIM], value[MAX_DIM]; /* step: with `queries` */
    size_t budget;   /* evict: 0 = each policy's own */
} vop;

typedef struct vexpect {
    int line;
    char spec[SPEC_LEN];
    size_t n;
    int32_t kept[MAX_KEPT];
} vexpect;

typedef struct vector {
    const char *file;
    uint64_t seed;
    size_t dim; /* floats of a key; 0: the steps carry none */
    int queries; /* the steps carry a query and a value of dim floats too */
    size_t n_ops, n_expect, n_sep;
    vop ops[MAX_OPS];
    vexpect expect[MAX_EXPECT];
    int sep_line[MAX_SEP];
    char sep[MAX_SEP][2][SPEC_LEN];
} vector;

static char errbuf[512];

#define VFAIL(v, line, ...)                                                             \
    do {                                                                                \
        int n_ = snprintf(errbuf, sizeof errbuf, "%s:%d: ", (v)->file, (line));         \
        snprintf(errbuf + n_, sizeof errbuf - (size_t)n_, __VA_ARGS__);                 \
        return -1;                                                                      \
    } while (0)

/* ---- parsing ---- */

static int parse_int(const char *tok, long long lo, long long hi, long long *out)
{
    if (!*tok)
        return 0;
    for (const char *c = tok; *c; c++)
        if (*c < '0' || *c > '9')
            return 0;
    errno = 0;
    long long v = strtoll(tok, NULL, 10);
    if (errno || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* A finite non-negative decimal weight, rounded to float32. */
static int parse_weight(const char *tok, float *out)
{
    if (!*tok)
        return 0;
    for (const char *c = tok; *c; c++)
        if (!strchr("0123456789.eE+-", *c))
            return 0;
    char *end = NULL;
    errno = 0;
    double d = strtod(tok, &end);
    if (*end || errno || !(d >= 0.0) || d > 3.4e38)
        return 0;
    *out = (float)d;
    return 1;
}

static int admitted_before(const vector *v, int32_t pos)
{
    for (size_t i = 0; i < v->n_ops; i++)
        if (!v->ops[i].is_evict && v->ops[i].pos == pos)
            return 1;
    return 0;
}

static const vexpect *find_expect(const vector *v, const char *spec)
{
    for (size_t i = 0; i < v->n_expect; i++)
        if (strcmp(v->expect[i].spec, spec) == 0)
            return &v->expect[i];
    return NULL;
}

/* Parses `text` (NUL-terminated, modified in place) into *v. */
static int parse_vector(vector *v, const char *file, char *text)
{
    memset(v, 0, sizeof *v);
    v->file = file;
    v->seed = 1;
    int32_t last = -1;
    int line = 0;
    for (char *next = text; next && *next;) {
        char *s = next;
        next = strchr(s, '\n');
        if (next)
            *next++ = '\0';
        line++;
        char *hash = strchr(s, '#');
        if (hash)
            *hash = '\0';
        char *tok[MAX_W + 6];
        size_t nt = 0;
        for (char *t = strtok(s, " \t\r"); t; t = strtok(NULL, " \t\r")) {
            if (nt == MAX_W + 4)
                VFAIL(v, line, "too many fields (at most %d weights a step)", MAX_W);
            tok[nt++] = t;
        }
        if (nt == 0)
            continue;
        long long x;
        if (!strcmp(tok[0], "seed")) {
            if (nt != 2 || !parse_int(tok[1], 0, INT64_MAX, &x))
                VFAIL(v, line, "seed takes one non-negative integer");
            v->seed = (uint64_t)x;
        } else if (!strcmp(tok[0], "queries")) {
            if (nt != 1 || v->queries || v->n_ops)
                VFAIL(v, line, "queries takes nothing and comes once, before the first step");
            v->queries = 1;
        } else if (!strcmp(tok[0], "dim")) {
            if (nt != 2 || !parse_int(tok[1], 1, MAX_DIM, &x))
                VFAIL(v, line, "dim takes one integer in 1..%d", MAX_DIM);
            if (v->dim || v->n_ops)
                VFAIL(v, line, "dim comes once, before the first step");
            v->dim = (size_t)x;
        } else if (!strcmp(tok[0], "step")) {
            if (v->n_ops == MAX_OPS)
                VFAIL(v, line, "too many steps and evicts (at most %d)", MAX_OPS);
            vop *op = &v->ops[v->n_ops];
            if (nt < 2 || !parse_int(tok[1], 0, INT32_MAX, &x))
                VFAIL(v, line, "step needs a position (a non-negative integer)");
            if ((int32_t)x <= last)
                VFAIL(v, line, "step %lld: positions must increase (last was %ld)", x,
                      (long)last);
            op->line = line;
            op->pos = (int32_t)x;
            int have = 0; /* bits: key, query, value */
            while (nt > 2) {
                static const char *const names[3] = {"key", "query", "value"};
                float *dst[3] = {op->key, op->query, op->value};
                int f = !strncmp(tok[nt - 1], "key=", 4)     ? 0
                        : !strncmp(tok[nt - 1], "query=", 6) ? 1
                        : !strncmp(tok[nt - 1], "value=", 6) ? 2
                                                             : -1;
                if (f < 0)
                    break;
                if (!v->dim)
                    VFAIL(v, line, "a %s without a dim line", names[f]);
                if (f && !v->queries)
                    VFAIL(v, line, "a %s without a queries line", names[f]);
                if (have & (1 << f))
                    VFAIL(v, line, "%s= is given twice", names[f]);
                have |= 1 << f;
                char *at = strchr(tok[nt - 1], '=') + 1;
                for (size_t j = 0; j < v->dim; j++) {
                    char *end = NULL;
                    errno = 0;
                    double k = strtod(at, &end);
                    if (end == at || errno || !(k - k == 0.0) || fabs(k) > 3.4e38 ||
                        (*end != ',' && *end != '\0') || (*end == ',') != (j + 1 < v->dim))
                        VFAIL(v, line, "%s needs %zu finite decimals separated by commas",
                              names[f], v->dim);
                    dst[f][j] = (float)k;
                    at = end + 1;
                }
                nt--;
            }
            if (v->dim && !(have & 1))
                VFAIL(v, line, "step %lld has no key=... (the vector has dim %zu)", x, v->dim);
            if (v->queries && have != 7)
                VFAIL(v, line, "step %lld needs key=, query= and value= (the vector has a "
                      "queries line)", x);
            if (nt == 3 && !strcmp(tok[2], "null")) {
                op->null = 1;
            } else {
                for (size_t i = 2; i < nt; i++) {
                    char *colon = strchr(tok[i], ':');
                    if (!colon)
                        VFAIL(v, line, "weight \"%s\" is not POS:WEIGHT", tok[i]);
                    *colon = '\0';
                    float w;
                    if (!parse_int(tok[i], 0, INT32_MAX, &x))
                        VFAIL(v, line, "weight position \"%s\" is not a position", tok[i]);
                    if (!parse_weight(colon + 1, &w))
                        VFAIL(v, line, "weight \"%s\" of position %lld is not a finite decimal >= 0",
                              colon + 1, x);
                    if (!admitted_before(v, (int32_t)x))
                        VFAIL(v, line, "position %lld was never stepped before step %ld", x,
                              (long)op->pos);
                    for (size_t k = 0; k < op->nw; k++)
                        if (op->wpos[k] == (int32_t)x)
                            VFAIL(v, line, "position %lld is given two weights", x);
                    op->wpos[op->nw] = (int32_t)x;
                    op->w[op->nw++] = w;
                }
            }
            last = op->pos;
            v->n_ops++;
        } else if (!strcmp(tok[0], "evict")) {
            if (v->n_ops == MAX_OPS)
                VFAIL(v, line, "too many steps and evicts (at most %d)", MAX_OPS);
            vop *op = &v->ops[v->n_ops];
            if (nt > 2 || (nt == 2 && !parse_int(tok[1], 1, 16777216, &x)))
                VFAIL(v, line, "evict takes nothing or one budget in 1..16777216");
            op->line = line;
            op->is_evict = 1;
            op->budget = nt == 2 ? (size_t)x : 0;
            v->n_ops++;
        } else if (!strcmp(tok[0], "expect")) {
            if (v->n_expect == MAX_EXPECT)
                VFAIL(v, line, "too many expect lines (at most %d)", MAX_EXPECT);
            vexpect *e = &v->expect[v->n_expect];
            size_t len = nt >= 2 ? strlen(tok[1]) : 0;
            if (len < 2 || tok[1][len - 1] != ':' || len >= SPEC_LEN)
                VFAIL(v, line, "expect needs \"SPEC:\" then the kept positions (or -)");
            memcpy(e->spec, tok[1], len - 1);
            e->spec[len - 1] = '\0';
            if (find_expect(v, e->spec))
                VFAIL(v, line, "a second expect line for %s", e->spec);
            e->line = line;
            if (nt == 3 && !strcmp(tok[2], "-")) {
                e->n = 0;
            } else {
                if (nt < 3)
                    VFAIL(v, line, "expect %s: no positions (write - for an empty set)", e->spec);
                if (nt - 2 > MAX_KEPT)
                    VFAIL(v, line, "expect %s: more than %d positions", e->spec, MAX_KEPT);
                for (size_t i = 2; i < nt; i++) {
                    if (!parse_int(tok[i], 0, INT32_MAX, &x))
                        VFAIL(v, line, "expect %s: \"%s\" is not a position", e->spec, tok[i]);
                    if (e->n && (int32_t)x <= e->kept[e->n - 1])
                        VFAIL(v, line, "expect %s: positions must be ascending", e->spec);
                    e->kept[e->n++] = (int32_t)x;
                }
            }
            v->n_expect++;
        } else if (!strcmp(tok[0], "separates")) {
            if (v->n_sep == MAX_SEP)
                VFAIL(v, line, "too many separates lines (at most %d)", MAX_SEP);
            if (nt != 3 || strlen(tok[1]) >= SPEC_LEN || strlen(tok[2]) >= SPEC_LEN)
                VFAIL(v, line, "separates takes two specs");
            v->sep_line[v->n_sep] = line;
            strcpy(v->sep[v->n_sep][0], tok[1]);
            strcpy(v->sep[v->n_sep][1], tok[2]);
            v->n_sep++;
        } else {
            VFAIL(v, line,
                  "unknown directive \"%s\" (seed, dim, step, evict, expect, separates)",
                  tok[0]);
        }
    }
    if (v->n_ops == 0 || v->ops[0].is_evict)
        VFAIL(v, line, "a vector starts with a step");
    if (v->n_expect == 0)
        VFAIL(v, line, "no expect lines");
    if (v->queries && !v->dim)
        VFAIL(v, line, "a queries line needs a dim line");
    /* Every registered policy runs every vector it can: those that read keys
     * the vectors with keys, those that read queries or values the vectors
     * with both. */
    for (size_t t = 0; t < kve_policy_type_count(); t++) {
        const char *name = kve_policy_type_name(t);
        const unsigned reads = kve_policy_type_reads(t);
        if ((reads & KVE_READS_KEYS) && !v->dim)
            continue;
        if ((reads & (KVE_READS_QUERIES | KVE_READS_VALUES)) && !v->queries)
            continue;
        size_t len = strlen(name), i = 0;
        while (i < v->n_expect && !(strncmp(v->expect[i].spec, name, len) == 0 &&
                                    (v->expect[i].spec[len] == ':' || v->expect[i].spec[len] == '\0')))
            i++;
        if (i == v->n_expect)
            VFAIL(v, line, "no expect line for policy %s (every policy runs every vector)", name);
    }
    for (size_t s = 0; s < v->n_sep; s++)
        for (int k = 0; k < 2; k++)
            if (!find_expect(v, v->sep[s][k]))
                VFAIL(v, v->sep_line[s], "separates names %s, which has no expect line",
                      v->sep[s][k]);
    return 0;
}

/* ---- running ---- */

static float row[MAX_KEPT * 4];
static int32_t victims[MAX_KEPT * 4];

static int same_set(const vexpect *e, const int32_t *kept, size_t n)
{
    return n == e->n && memcmp(kept, e->kept, n * sizeof *kept) == 0;
}

static void format_set(char *out, size_t cap, const int32_t *kept, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && len < cap; i++) {
        int k = snprintf(out + len, cap - len, "%s%ld", i ? " " : "", (long)kept[i]);
        len += k > 0 ? (size_t)k : 0;
    }
    if (n == 0)
        snprintf(out, cap, "-");
}

/* Replays the vector on the policy of expectation `e`; stores the final
 * kept set in got[0 .. *n_got). */
static int run_expect(const vector *v, const vexpect *e, int32_t *got, size_t *n_got)
{
    kve_rng rng;
    kve_rng_seed(&rng, v->seed);
    kve_policy *p = NULL;
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = v->dim;
    if (v->queries) { /* one query head, no rotary embedding, values of dim floats */
        o.value_dim = v->dim;
        o.rope.rotary_dim = 0;
    }
    if (kve_policy_new_ex(e->spec, &rng, &o, &p) != KVE_OK)
        VFAIL(v, e->line, "bad spec %s: %s", e->spec, kve_last_error());
    for (size_t i = 0; i < v->n_ops; i++) {
        const vop *op = &v->ops[i];
        kve_status st;
        if (op->is_evict) {
            size_t b = op->budget ? op->budget : kve_policy_budget(p);
            size_t nv = 0;
            st = kve_policy_evict(p, b, victims, sizeof victims / sizeof *victims, &nv);
        } else {
            size_t n = kve_policy_size(p);
            if (n > sizeof row / sizeof *row) {
                kve_policy_free(p);
                VFAIL(v, op->line, "%s keeps more than %zu positions", e->spec,
                      sizeof row / sizeof *row);
            }
            const int32_t *kept = kve_policy_positions(p);
            for (size_t k = 0; k < n; k++) {
                row[k] = 0.0f;
                for (size_t j = 0; j < op->nw; j++)
                    if (op->wpos[j] == kept[k])
                        row[k] = op->w[j];
            }
            kve_step_data d = kve_step_default_data();
            d.attn = op->null ? NULL : row;
            d.ld = n;
            d.keys = v->dim ? op->key : NULL;
            d.ld_keys = v->dim;
            if (v->queries) {
                d.queries = op->query;
                d.ld_queries = v->dim;
                d.values = op->value;
                d.ld_values = v->dim;
            }
            st = kve_policy_step_data(p, op->pos, &d);
        }
        if (st != KVE_OK) {
            kve_policy_free(p);
            VFAIL(v, op->line, "%s refused this line: %s: %s", e->spec, kve_status_name(st),
                  kve_last_error());
        }
    }
    *n_got = kve_policy_size(p);
    if (*n_got > MAX_KEPT * 4) {
        kve_policy_free(p);
        VFAIL(v, e->line, "%s keeps too many positions", e->spec);
    }
    memcpy(got, kve_policy_positions(p), *n_got * sizeof *got);
    kve_policy_free(p);
    return 0;
}

static int run_vector(const vector *v)
{
    static int32_t got[MAX_EXPECT][MAX_KEPT * 4];
    size_t n_got[MAX_EXPECT];
    for (size_t i = 0; i < v->n_expect; i++) {
        const vexpect *e = &v->expect[i];
        if (run_expect(v, e, got[i], &n_got[i]) != 0)
            return -1;
        if (!same_set(e, got[i], n_got[i])) {
            char a[256], b[256];
            format_set(a, sizeof a, got[i], n_got[i]);
            format_set(b, sizeof b, e->kept, e->n);
            VFAIL(v, e->line, "%s kept {%s}, the vector expects {%s}", e->spec, a, b);
        }
    }
    for (size_t s = 0; s < v->n_sep; s++) {
        const vexpect *a = find_expect(v, v->sep[s][0]), *b = find_expect(v, v->sep[s][1]);
        if (a->n == b->n && memcmp(a->kept, b->kept, a->n * sizeof *a->kept) == 0)
            VFAIL(v, v->sep_line[s], "%s and %s end with the same kept set: nothing separated",
                  v->sep[s][0], v->sep[s][1]);
    }
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static vector vec;

static void test_vector_files(void)
{
    const char *src = getenv("KVE_SOURCE_DIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/vectors", src ? src : ".");
    DIR *d = opendir(dir);
    if (!d)
        CHECK_FAIL_AT("cannot open %s (set KVE_SOURCE_DIR to the source tree)", dir);
    char *names[256];
    size_t n = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        size_t len = strlen(de->d_name);
        if (len > 4 && strcmp(de->d_name + len - 4, ".vec") == 0 && n < 256) {
            names[n] = malloc(len + 1);
            if (names[n])
                memcpy(names[n++], de->d_name, len + 1);
        }
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    size_t expectations = 0, keyed = 0, queried = 0;
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        char *text = read_whole_file(path, NULL);
        if (!text) {
            fprintf(stderr, "%s: cannot read\n", path);
            failed = 1;
            continue;
        }
        if (parse_vector(&vec, path, text) != 0 || run_vector(&vec) != 0) {
            fprintf(stderr, "%s\n", errbuf);
            failed = 1;
        } else {
            printf("     %s: %zu expectations hold%s\n", names[i], vec.n_expect,
                   vec.queries ? " (with keys, queries and values)" : vec.dim ? " (with keys)" : "");
            expectations += vec.n_expect;
            keyed += vec.dim != 0;
            queried += vec.queries != 0;
        }
        free(text);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    ASSERT_TRUE(!failed);
    ASSERT_TRUE(n >= 7);
    ASSERT_TRUE(keyed >= 3);
    ASSERT_TRUE(queried >= 1);
    size_t key_types = 0, query_types = 0;
    for (size_t t = 0; t < kve_policy_type_count(); t++) {
        unsigned reads = kve_policy_type_reads(t);
        query_types += (reads & KVE_READS_QUERIES) != 0;
        key_types += (reads & KVE_READS_KEYS) && !(reads & KVE_READS_QUERIES);
    }
    ASSERT_TRUE(key_types == 2 && query_types == 1);
    ASSERT_TRUE(expectations >= n * kve_policy_type_count() - (n - keyed) * key_types -
                                    (n - queried) * query_types);
}

/* Malformed vectors are refused with the right line and a reason. */
static void test_malformed_vectors(void)
{
    static const struct {
        const char *text;
        int line;
        const char *reason;
    } bad[] = {
        {"bogus 1\n", 1, "unknown directive"},
        {"step 0 null\nstep 0 null\n", 2, "must increase"},
        {"step 3 null\nstep 2 null\n", 2, "must increase"},
        {"step -1 null\n", 1, "position"},
        {"step\n", 1, "position"},
        {"step 0 null\nstep 1 0:nan\n", 2, "finite"},
        {"step 0 null\nstep 1 0:inf\n", 2, "finite"},
        {"step 0 null\nstep 1 0:-0.5\n", 2, "finite"},
        {"step 0 null\nstep 1 0:0x1p-1\n", 2, "finite"},
        {"step 0 null\nstep 1 0:\n", 2, "finite"},
        {"step 0 null\nstep 1 0.5\n", 2, "POS:WEIGHT"},
        {"step 0 null\nstep 1 x:0.5\n", 2, "not a position"},
        {"step 0 null\nstep 1 0:0.5 0:0.25\n", 2, "two weights"},
        {"step 0 null\nstep 2 1:0.5\n", 2, "never stepped"},
        {"step 0 null\n\n# comment\nstep 1 1:0.5\n", 4, "never stepped"},
        {"step 0 null\nevict 0\n", 2, "budget"},
        {"step 0 null\nevict x\n", 2, "budget"},
        {"step 0 null\nevict 1 2\n", 2, "budget"},
        {"seed -1\n", 1, "seed"},
        {"seed\n", 1, "seed"},
        {"evict 1\nstep 0 null\nexpect full: 0\n", 3, "starts with a step"},
        {"step 0 null\nexpect full 0\n", 2, "SPEC:"},
        {"step 0 null\nexpect full:\n", 2, "no positions"},
        {"step 0 null\nexpect full: 1 0\n", 2, "ascending"},
        {"step 0 null\nexpect full: 0\nexpect full: 0\n", 3, "second expect"},
        {"step 0 null\nexpect full: a\n", 2, "not a position"},
        {"step 0 null\n", 1, "no expect lines"},
        {"step 0 null\nexpect full: 0\n", 2, "no expect line for policy window"},
        {"step 0 null\nexpect full: 0\nseparates full:budget=1\n", 3, "two specs"},
        {"dim 0\n", 1, "dim takes"},
        {"dim 1\nqueries\nstep 0 null key=1\n", 3, "needs key=, query= and value="},
        {"dim 1\nstep 0 null key=1 query=1\n", 2, "without a queries line"},
        {"dim 1\nqueries\nqueries\n", 3, "comes once"},
        {"dim 1\nqueries\nstep 0 null key=1 query=1 value=1 value=2\n", 3, "given twice"},
        {"queries\nstep 0 null key=1 query=1 value=1\n", 2, "without a dim"},
        {"dim 17\n", 1, "dim takes"},
        {"dim 2\ndim 2\n", 2, "once"},
        {"step 0 null\ndim 2\n", 2, "before the first step"},
        {"step 0 null key=1\n", 1, "without a dim"},
        {"dim 2\nstep 0 null\n", 2, "no key="},
        {"dim 2\nstep 0 null key=1\n", 2, "2 finite decimals"},
        {"dim 2\nstep 0 null key=1,2,3\n", 2, "2 finite decimals"},
        {"dim 2\nstep 0 null key=1,nan\n", 2, "2 finite decimals"},
        {"dim 2\nstep 0 null key=1,\n", 2, "2 finite decimals"},
        {"dim 2\nstep 0 null key=1,1e39\n", 2, "2 finite decimals"},
        {"dim 1\nstep 0 null key=-1.5\nexpect full: 0\n", 3, "no expect line for policy window"},
        {"dim 1\nstep 0 null key=2\nexpect full: 0\nexpect window: 0\nexpect streaming: 0\n"
         "expect random: 0\nexpect h2o: 0\nexpect scissorhands: 0\nexpect tova: 0\n"
         "expect h2o_decay: 0\nexpect h2o_mean: 0\nexpect knorm: 0\n",
         12, "no expect line for policy keydiff"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s", bad[i].text);
        if (parse_vector(&vec, "mem.vec", text) == 0)
            CHECK_FAIL_AT("case %zu accepted: %s", i, bad[i].text);
        char want[32];
        snprintf(want, sizeof want, "mem.vec:%d: ", bad[i].line);
        if (strncmp(errbuf, want, strlen(want)) != 0)
            CHECK_FAIL_AT("case %zu: \"%s\" does not start with \"%s\"", i, errbuf, want);
        ASSERT_CONTAINS(errbuf, bad[i].reason);
    }
}

/* A well-formed vector whose expectations are wrong, or whose policies
 * refuse a line, fails with the line of the culprit. */
static void test_runner_can_fail(void)
{
    static const char head[] =
        "step 0 null\nstep 1 0:1\nstep 2 0:0.5 1:0.5\nevict 2\n"
        "expect full:budget=2: 0 1 2\n"
        "expect window:budget=2: 1 2\n"
        "expect streaming:budget=2,sinks=1: 0 2\n"
        "expect random:budget=2,recent_window=1: %s\n"
        "expect h2o:budget=2,recent_window=1: 0 2\n"
        "expect scissorhands:budget=2,recent_window=1: 1 2\n"
        "expect tova:budget=2,recent_window=1: 1 2\n"
        "expect h2o_decay:budget=2,recent_window=1,decay=0.5: 0 2\n"
        "expect h2o_mean:budget=2,recent_window=1: 0 2\n"
        "separates %s\n";
    static const char refusing[] =
        "step 0 null\nstep 1 0:1\nevict 1\n"
        "expect streaming:budget=2,sinks=1: 0\n"
        "expect full: 0 1\nexpect window: 1\nexpect random: 1\nexpect h2o: 1\n"
        "expect scissorhands: 1\nexpect tova: 1\nexpect h2o_decay: 1\nexpect h2o_mean: 1\n";
    /* random's victim is one of 0 and 1: find which with a correct run first. */
    char text[2048];
    const char *rand_sets[2] = {"1 2", "0 2"};
    int passes = 0, which = -1;
    for (int k = 0; k < 2; k++) {
        snprintf(text, sizeof text, head, rand_sets[k], "h2o:budget=2,recent_window=1 window:budget=2");
        ASSERT_EQ(parse_vector(&vec, "mem.vec", text), 0);
        if (run_vector(&vec) == 0) {
            passes++;
            which = k;
        } else {
            ASSERT_CONTAINS(errbuf, "mem.vec:8: random");
        }
    }
    ASSERT_EQ(passes, 1);
    /* A separates line whose two policies agree. */
    snprintf(text, sizeof text, head, rand_sets[which],
             "h2o:budget=2,recent_window=1 h2o_decay:budget=2,recent_window=1,decay=0.5");
    ASSERT_EQ(parse_vector(&vec, "mem.vec", text), 0);
    ASSERT_EQ(run_vector(&vec), -1);
    ASSERT_CONTAINS(errbuf, "mem.vec:14: ");
    ASSERT_CONTAINS(errbuf, "nothing separated");
    /* A policy that refuses a line: streaming (run first) cannot evict to
     * budget 1 <= sinks 1. */
    ASSERT_EQ(parse_vector(&vec, "mem.vec", strcpy(text, refusing)), 0);
    ASSERT_EQ(run_vector(&vec), -1);
    ASSERT_CONTAINS(errbuf, "mem.vec:3: streaming:budget=2,sinks=1 refused this line");
    /* A bad spec in an expect line. */
    snprintf(text, sizeof text, head, rand_sets[which], "window:budget=2 full:budget=2");
    char *h = strstr(text, "expect h2o:budget=2,recent_window=1");
    ASSERT_TRUE(h != NULL);
    memcpy(h + 7, "h2o:budget=2,recent_window=2", 28);
    ASSERT_EQ(parse_vector(&vec, "mem.vec", text), 0);
    ASSERT_EQ(run_vector(&vec), -1);
    ASSERT_CONTAINS(errbuf, "mem.vec:9: bad spec");
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_malformed_vectors);
    RUN(test_runner_can_fail);
    RUN(test_vector_files);
    return CHECK_DONE();
}
