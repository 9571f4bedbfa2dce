/* SPDX-License-Identifier: MIT */
/*
 * test_rules.c - score rules registered at run time (kvevict.h, "Score
 * rules"): a rule written as an application writes it gives, bit for bit,
 * what the built-in lane gives (h2o and value-aware h2o, through banks of
 * heads with grouped rows, NULL steps, several victims, pages, shared
 * budgets, growth and prefill); a rule that fails or writes a score or a
 * state that is not finite refuses the step and leaves every head of the
 * call as it was;
 * and the registry's contract: names, limits, holds, reuse.
 * Deterministic; the seed is printed (argv[1] replays).
 */
#include "check.h"
#include "policy_impl.h"
#include "rule_examples.h"
#include "state_image.h"
#include "workload.h"

enum { H = 4, G = 3, MAXN = 160, VD = 5 };

/* ---- rules as an application writes them (and tools/rule_examples.h) ---- */

/* Fails at the head whose kept set holds the position *user, or writes a
 * NaN there when *user is negative (-p - 1 for position p). */
static kve_status rule_fail(void *user, const kve_score_step *s)
{
    const int32_t at = *(const int32_t *)user;
    for (size_t i = 0; i < s->n; i++) {
        s->new_score[i] = s->score[i] + (double)s->attn[i];
        if (s->pos[i] == at)
            return kve_set_error(KVE_ERANGE, "position %d is out of my range", at);
        if (s->pos[i] == -at - 1)
            s->new_score[i] = NAN;
    }
    return KVE_OK;
}

/* Refuses without a message of its own. */
static kve_status rule_mute(void *user, const kve_score_step *s)
{
    (void)user;
    (void)s;
    return KVE_EINVAL;
}

/* Reports success and writes no score: the library must not read what
 * its scratch held before (valgrind saw it), but refuse the step. */
static kve_status rule_lazy(void *user, const kve_score_step *s)
{
    (void)user;
    for (size_t i = 0; i + 1 < s->n; i++) /* every slot but the last */
        s->new_score[i] = 1.0;
    return KVE_OK;
}

/* Records what it is given. */
typedef struct seen {
    size_t n;
    uint64_t step;
    int32_t last_pos;
    int had_vnorm;
} seen;

static kve_status rule_spy(void *user, const kve_score_step *s)
{
    seen *w = user;
    w->n = s->n;
    w->step = s->step;
    w->last_pos = s->n ? s->pos[s->n - 1] : -1;
    w->had_vnorm = s->vnorm != NULL;
    for (size_t i = 0; i < s->n; i++)
        s->new_score[i] = (double)s->attn[i];
    return KVE_OK;
}

static void reg(const char *name, kve_score_fn fn, size_t state, int values, void *user)
{
    kve_score_rule r = kve_score_rule_default();
    r.name = name;
    r.observe = fn;
    r.state = state;
    r.values = values;
    r.user = user;
    ASSERT_OK(kve_score_rule_register(&r));
}

/* ---- a rule against the built-in lane ---- */

static float rows[H * G * MAXN], values[H * VD];
static int32_t va[H * MAXN], vb[H * MAXN];

/* Every column the two banks' heads compare on: kept positions and scores,
 * bit for bit, read through the lazy gap. */
static int same_heads(const kve_bank *a, const kve_bank *b)
{
    for (size_t h = 0; h < H; h++) {
        const kve_head *x = &a->heads[h], *y = &b->heads[h];
        if (x->size != y->size ||
            memcmp(x->col[KVE_COL_POS], y->col[KVE_COL_POS], x->size * sizeof(int32_t)) != 0)
            return 0;
        for (size_t i = 0; i < x->size; i++) {
            size_t sx = x->gap != KVE_NONE && i >= x->gap ? i + 1 : i;
            size_t sy = y->gap != KVE_NONE && i >= y->gap ? i + 1 : i;
            double dx = ((const double *)x->col[KVE_COL_SCORE])[sx];
            double dy = ((const double *)y->col[KVE_COL_SCORE])[sy];
            if (memcmp(&dx, &dy, sizeof dx) != 0)
                return 0;
        }
    }
    return 1;
}

static void compare(const char *rule_spec, const char *builtin, size_t share, uint64_t seed)
{
    kve_bank_options o = kve_bank_default_options();
    o.value_dim = VD;
    o.share = share;
    kve_bank *a = NULL, *b = NULL;
    ASSERT_OK(kve_bank_new_ex(rule_spec, H, NULL, &o, &a));
    ASSERT_OK(kve_bank_new_ex(builtin, H, NULL, &o, &b));
    size_t budget = kve_bank_budget(a), lo = 0;
    ASSERT_OK(kve_spec_min_budget(rule_spec, &lo));
    kve_rng g;
    kve_rng_seed(&g, seed);
    float pool[4] = {0.5f, 0.25f, 0.125f, 1.0f};
    int32_t pos = 0;
    for (int s = 0; s < 400; s++, pos += 1 + (int32_t)kve_rng_below(&g, 2)) {
        size_t n = 0;
        for (size_t h = 0; h < H; h++)
            n = kve_bank_size(a, h) > n ? kve_bank_size(a, h) : n;
        if (n >= MAXN)
            break;
        size_t group = 1 + (size_t)kve_rng_below(&g, G);
        kve_reduce reduce = (kve_reduce)kve_rng_below(&g, 3);
        for (size_t r = 0; r < H * group; r++)
            for (size_t i = 0; i < n; i++)
                rows[r * n + i] = random_weight(&g, pool, n);
        for (size_t k = 0; k < H * VD; k++)
            values[k] = kve_rng_below(&g, 6) ? (float)kve_rng_uniform(&g) - 0.5f : 0.0f;
        kve_step_data d = kve_step_default_data();
        d.attn = kve_rng_below(&g, 8) ? rows : NULL;
        d.ld = n;
        d.group = group;
        d.reduce = reduce;
        d.values = values;
        d.ld_values = VD;
        ASSERT_OK(kve_bank_step_data(a, 0, H, pos, &d));
        ASSERT_OK(kve_bank_step_data(b, 0, H, pos, &d));
        if (kve_rng_below(&g, 10) == 0)
            continue; /* no evict: the next step may grow the heads */
        size_t ca[H], cb[H];
        size_t to = kve_rng_below(&g, 15) == 0 ? lo + (size_t)kve_rng_below(&g, budget - lo + 1)
                                               : budget;
        if (share) {
            ASSERT_OK(kve_bank_evict_shared(a, 0, H, share * to, va, MAXN, ca));
            ASSERT_OK(kve_bank_evict_shared(b, 0, H, share * to, vb, MAXN, cb));
        } else {
            ASSERT_OK(kve_bank_evict(a, to, va, MAXN, ca));
            ASSERT_OK(kve_bank_evict(b, to, vb, MAXN, cb));
        }
        for (size_t h = 0; h < H; h++) {
            ASSERT_EQ(ca[h], cb[h]);
            ASSERT_TRUE(memcmp(va + h * MAXN, vb + h * MAXN, ca[h] * sizeof(int32_t)) == 0);
        }
        if (!same_heads(a, b))
            CHECK_FAIL_AT("%s against %s (share %zu): heads differ after step %d", rule_spec,
                          builtin, share, s);
    }
    ASSERT_TRUE(same_heads(a, b));
    kve_bank_free(a);
    kve_bank_free(b);
}

static void test_rules_equal_builtin_lanes(void)
{
    reg("my_h2o", example_rule_h2o, 1, 0, NULL);
    reg("my_vh2o", example_rule_vh2o, 1, 1, NULL);
    compare("my_h2o:budget=24,recent_window=4", "h2o:budget=24,recent_window=4", 0, check_seed);
    compare("my_h2o:budget=9,recent_window=0", "h2o:budget=9,recent_window=0", 0, check_seed + 1);
    compare("my_vh2o:budget=24,recent_window=4", "h2o:budget=24,recent_window=4,vnorm=1", 0,
            check_seed + 2);
    /* the generic vnorm on a rule: h2o's rule times ||v|| is value-aware h2o */
    compare("my_h2o:budget=20,recent_window=3,vnorm=1", "my_vh2o:budget=20,recent_window=3", 0,
            check_seed + 3);
    compare("my_vh2o:budget=16,recent_window=2,block=4",
            "h2o:budget=16,recent_window=2,block=4,vnorm=1", 0, check_seed + 4);
    compare("my_vh2o:budget=20,recent_window=2", "h2o:budget=20,recent_window=2,vnorm=1", 2,
            check_seed + 5);
    compare("my_h2o:budget=12,recent_window=1,block=3,block_mean=1",
            "h2o:budget=12,recent_window=1,block=3,block_mean=1", 0, check_seed + 6);
    /* prefill: a rule starts as admitted, score 0, as h2o_mean does */
    static float prompt[20 * 20];
    for (size_t t = 0; t < 20; t++)
        for (size_t i = 0; i <= t; i++)
            prompt[t * 20 + i] = (float)((t * 7 + i * 3) % 11) / 11.0f;
    kve_bank *p = NULL;
    ASSERT_OK(kve_bank_new("my_h2o:budget=8,recent_window=2", 1, NULL, &p));
    ASSERT_OK(kve_bank_prefill(p, 0, 1, 20, 8, prompt, 20, 1, KVE_REDUCE_MEAN, NULL));
    ASSERT_EQ(kve_bank_size(p, 0), 8);
    for (size_t i = 0; i < 8; i++)
        ASSERT_TRUE(((const double *)p->heads[0].col[KVE_COL_SCORE])[i] == 0.0 &&
                    ((const double *)p->heads[0].col[KVE_COL_EXTRA0])[i] == 0.0);
    kve_bank_free(p);
    ASSERT_OK(kve_score_rule_unregister("my_h2o"));
    ASSERT_OK(kve_score_rule_unregister("my_vh2o"));
}

/* ---- refusals ---- */

/* A snapshot of a bank's heads: sizes, positions and every lazy column. */
typedef struct snap {
    size_t size[H];
    unsigned char bytes[H][MAXN * 64];
    size_t len[H];
} snap;

static void take(const kve_bank *b, snap *s)
{
    for (size_t h = 0; h < H; h++) {
        const kve_head *x = &b->heads[h];
        kve__close_gap(&b->cfg, (kve_head *)(uintptr_t)x); /* no change of state */
        s->size[h] = x->size;
        size_t at = 0;
        for (int c = 0; c < KVE_NCOLS; c++) {
            size_t e = b->cfg.elem[c];
            if (!e || c == KVE_COL_MARK || c >= KVE_COL_SCRATCH)
                continue;
            memcpy(s->bytes[h] + at, x->col[c], x->size * e);
            at += x->size * e;
        }
        s->len[h] = at;
    }
}

static int same_snap(const snap *a, const snap *b)
{
    for (size_t h = 0; h < H; h++)
        if (a->size[h] != b->size[h] || a->len[h] != b->len[h] ||
            memcmp(a->bytes[h], b->bytes[h], a->len[h]) != 0)
            return 0;
    return 1;
}

static snap before, after;

static void test_failing_rule_changes_nothing(void)
{
    int32_t at = 1000;
    reg("failing", rule_fail, 0, 0, &at);
    reg("mute", rule_mute, 0, 0, NULL);
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("failing:budget=6,recent_window=1", H, NULL, &b));
    for (int32_t t = 0; t < 30; t++) {
        /* head h keeps positions of its own: step head h alone at times */
        for (size_t i = 0; i < H * MAXN; i++)
            rows[i] = 0.125f * (float)(i % 5);
        ASSERT_OK(kve_bank_step_range(b, 0, H, t, rows, MAXN, 1, KVE_REDUCE_MEAN, NULL, 0));
        ASSERT_OK(kve_bank_evict(b, 6, va, MAXN, NULL));
    }
    /* every head keeps 24 .. 29 minus one; fail at a position head 2 keeps
     * (all do): the first head that meets it refuses */
    at = kve_bank_positions(b, 2)[1];
    take(b, &before);
    ASSERT_STATUS(kve_bank_step_range(b, 0, H, 30, rows, MAXN, 1, KVE_REDUCE_MEAN, NULL, 0),
                  KVE_ERANGE);
    ASSERT_CONTAINS(kve_last_error(), "failing: head 0: position");
    ASSERT_CONTAINS(kve_last_error(), "is out of my range");
    take(b, &after);
    ASSERT_TRUE(same_snap(&before, &after));
    /* a score that is not finite */
    at = -kve_bank_positions(b, 3)[2] - 1;
    ASSERT_STATUS(kve_bank_step_range(b, 0, H, 30, rows, MAXN, 1, KVE_REDUCE_MEAN, NULL, 0),
                  KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "failing: head 0: the rule's new score of slot 2");
    ASSERT_CONTAINS(kve_last_error(), "not finite");
    take(b, &after);
    ASSERT_TRUE(same_snap(&before, &after));
    /* only head 3's range: the message names head 3 */
    ASSERT_STATUS(kve_bank_step_range(b, 3, 1, 30, rows, MAXN, 1, KVE_REDUCE_MEAN, NULL, 0),
                  KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "failing: head 3:");
    /* once it passes, the step goes through */
    at = 1000;
    ASSERT_OK(kve_bank_step_range(b, 0, H, 30, rows, MAXN, 1, KVE_REDUCE_MEAN, NULL, 0));
    ASSERT_EQ(kve_bank_size(b, 0), 7);
    /* a rule that leaves a new score unwritten: refused, naming the slot */
    reg("lazy", rule_lazy, 0, 0, NULL);
    kve_bank *lz = NULL;
    ASSERT_OK(kve_bank_new("lazy:budget=6,recent_window=1", H, NULL, &lz));
    /* the first steps: one slot, then two (the last left unwritten: refused
     * from the first step with a kept position) */
    ASSERT_OK(kve_bank_step_range(lz, 0, H, 0, NULL, 0, 1, KVE_REDUCE_MEAN, NULL, 0));
    take(lz, &before);
    for (int k = 0; k < 2; k++) { /* the same refusal every time: nothing left over */
        ASSERT_STATUS(kve_bank_step_range(lz, 0, H, 1, rows, MAXN, 1, KVE_REDUCE_MEAN, NULL, 0),
                      KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "lazy: head 0: the rule's new score of slot");
        ASSERT_CONTAINS(kve_last_error(), "is nan, not finite");
        ASSERT_CONTAINS(kve_last_error(), "every new_score must be written");
    }
    take(lz, &after);
    ASSERT_TRUE(same_snap(&before, &after));
    kve_bank_free(lz);
    ASSERT_OK(kve_score_rule_unregister("lazy"));
    /* a NULL step never calls the rule */
    at = kve_bank_positions(b, 0)[0];
    ASSERT_OK(kve_bank_step(b, 31, NULL, 0));
    kve_bank_free(b);
    /* a policy's message names no head; a rule without a message of its own */
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("mute:budget=4,recent_window=1", NULL, &p));
    ASSERT_OK(kve_policy_step(p, 0, NULL, 0));
    float one = 1.0f;
    ASSERT_STATUS(kve_policy_step(p, 1, &one, 1), KVE_EINVAL);
    ASSERT_STR_EQ(kve_last_error(), "mute: the rule refused the step (KVE_EINVAL)");
    ASSERT_EQ(kve_policy_size(p), 1);
    kve_policy_free(p);
    ASSERT_OK(kve_score_rule_unregister("failing"));
    ASSERT_OK(kve_score_rule_unregister("mute"));
}

/* What the rule is given: the kept set before the newcomer, the step count
 * of informative steps, the value norms only when it asks. */
static void test_what_a_rule_sees(void)
{
    seen w = {0};
    reg("spy", rule_spy, 0, 0, &w);
    reg("spyv", rule_spy, 0, 1, &w);
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("spy:budget=8,recent_window=2", NULL, &p));
    ASSERT_EQ(kve_policy_reads(p), KVE_READS_ATTN);
    float attn[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    ASSERT_OK(kve_policy_step(p, 3, NULL, 0));
    ASSERT_OK(kve_policy_step(p, 5, attn, 1));
    ASSERT_TRUE(w.n == 1 && w.step == 1 && w.last_pos == 3 && !w.had_vnorm);
    ASSERT_OK(kve_policy_step(p, 6, NULL, 0));
    ASSERT_OK(kve_policy_step(p, 9, attn, 3));
    ASSERT_TRUE(w.n == 3 && w.step == 2 && w.last_pos == 6);
    kve_policy_free(p);
    kve_policy_options o = kve_policy_default_options();
    ASSERT_STATUS(kve_policy_new("spyv", NULL, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "spyv: reads values");
    o.value_dim = 2;
    ASSERT_OK(kve_policy_new_ex("spyv:budget=8,recent_window=2", NULL, &o, &p));
    ASSERT_EQ(kve_policy_reads(p), KVE_READS_ATTN | KVE_READS_VALUES);
    float v[2] = {3, 4};
    kve_step_data d = kve_step_default_data();
    d.values = v;
    d.ld_values = 2;
    ASSERT_OK(kve_policy_step_data(p, 0, &d));
    d.attn = attn;
    d.ld = 1;
    ASSERT_OK(kve_policy_step_data(p, 1, &d));
    ASSERT_TRUE(w.had_vnorm);
    ASSERT_TRUE(((const double *)p->head.col[KVE_COL_VNORM])[0] == 5.0);
    kve_policy_free(p);
    ASSERT_OK(kve_score_rule_unregister("spy"));
    ASSERT_OK(kve_score_rule_unregister("spyv"));
}

static void test_registry(void)
{
    kve_score_rule r = kve_score_rule_default();
    ASSERT_TRUE(r.name == NULL && r.observe == NULL && r.state == 0 && r.recent_window == 32 &&
                r.values == 0);
    static const struct {
        const char *name;
        size_t state, rw;
        int values, null_fn;
        const char *needle;
    } bad[] = {
        {NULL, 0, 32, 0, 0, "name is NULL"},
        {"", 0, 32, 0, 0, "must have 1 to 31 characters"},
        {"abcdefghijabcdefghijabcdefghijab", 0, 32, 0, 0, "must have 1 to 31"},
        {"Big", 0, 32, 0, 0, "outside [a-z0-9_] at offset 0"},
        {"a-b", 0, 32, 0, 0, "at offset 1"},
        {"fine", 0, 32, 0, 1, "observe is NULL"},
        {"fine", 17, 32, 0, 0, "state 17 is above 16"},
        {"fine", 0, 32, 2, 0, "values 2 must be 0 or 1"},
        {"fine", 0, KVE_MAX_BUDGET, 0, 0, "must be below"},
        {"h2o", 0, 32, 0, 0, "a built-in policy's"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = kve_score_rule_default();
        r.name = bad[i].name;
        r.observe = bad[i].null_fn ? NULL : example_rule_h2o;
        r.state = bad[i].state;
        r.recent_window = bad[i].rw;
        r.values = bad[i].values;
        ASSERT_STATUS(kve_score_rule_register(&r), KVE_EINVAL);
        if (!strstr(kve_last_error(), bad[i].needle))
            CHECK_FAIL_AT("case %zu: \"%s\" does not say \"%s\"", i, kve_last_error(),
                          bad[i].needle);
    }
    ASSERT_STATUS(kve_score_rule_register(NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_score_rule_unregister(NULL), KVE_EINVAL);
    ASSERT_STATUS(kve_score_rule_unregister("nosuch"), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "\"nosuch\" is not registered");
    ASSERT_STATUS(kve_score_rule_unregister("h2o"), KVE_EINVAL);
    /* a rule's spec: its default window, its keys, its name */
    r = kve_score_rule_default();
    r.name = "r0";
    r.observe = example_rule_h2o;
    r.state = 1;
    r.recent_window = 5;
    r.summary = "the sum, as a rule";
    ASSERT_OK(kve_score_rule_register(&r));
    ASSERT_STATUS(kve_score_rule_register(&r), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "registered already");
    char out[KVE_SPEC_MAX];
    ASSERT_OK(kve_spec_with("r0", NULL, NULL, out, sizeof out));
    ASSERT_STR_EQ(out, "r0:budget=512,recent_window=5");
    ASSERT_OK(kve_spec_with("r0:block=2", "vnorm", "1", out, sizeof out));
    ASSERT_STR_EQ(out, "r0:budget=512,recent_window=5,block=2,vnorm=1");
    ASSERT_STATUS(kve_spec_with("r0:decay=0.5", NULL, NULL, out, sizeof out), KVE_EINVAL);
    size_t least = 0;
    ASSERT_OK(kve_spec_min_budget("r0", &least));
    ASSERT_EQ(least, 6);
    /* holds: every object built from it; spec calls hold it only while they run */
    kve_policy *p = NULL, *q = NULL;
    kve_bank *b = NULL;
    ASSERT_OK(kve_policy_new("r0:budget=16", NULL, &p));
    ASSERT_STR_EQ(kve_policy_name(p), "r0");
    ASSERT_OK(kve_policy_new("r0:budget=16", NULL, &q));
    ASSERT_OK(kve_bank_new("r0:budget=16", 3, NULL, &b));
    ASSERT_STATUS(kve_score_rule_unregister("r0"), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "held by 3 objects");
    kve_policy_free(p);
    kve_bank_free(b);
    ASSERT_STATUS(kve_score_rule_unregister("r0"), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "held by 1 object (");
    /* a failed construction holds nothing */
    ASSERT_STATUS(kve_policy_new("r0:budget=4,recent_window=9", NULL, &p), KVE_EINVAL);
    ASSERT_STATUS(kve_bank_new("r0", 0, NULL, &b), KVE_EINVAL);
    kve_policy_free(q);
    ASSERT_OK(kve_score_rule_unregister("r0"));
    ASSERT_STATUS(kve_policy_new("r0", NULL, &p), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "unknown policy \"r0\"");
    /* the table holds KVE_MAX_SCORE_RULES; a freed name and slot are reused */
    char names[KVE_MAX_SCORE_RULES + 1][16];
    for (size_t i = 0; i <= KVE_MAX_SCORE_RULES; i++) {
        snprintf(names[i], sizeof names[i], "full%zu", i);
        r.name = names[i];
        if (i < KVE_MAX_SCORE_RULES) {
            ASSERT_OK(kve_score_rule_register(&r));
        } else {
            ASSERT_STATUS(kve_score_rule_register(&r), KVE_ENOMEM);
            ASSERT_CONTAINS(kve_last_error(), "16 rules are registered already");
        }
    }
    ASSERT_OK(kve_score_rule_unregister("full3"));
    r.name = names[KVE_MAX_SCORE_RULES];
    ASSERT_OK(kve_score_rule_register(&r));
    r.name = "full3";
    ASSERT_STATUS(kve_score_rule_register(&r), KVE_ENOMEM);
    for (size_t i = 0; i <= KVE_MAX_SCORE_RULES; i++)
        if (i != 3)
            ASSERT_OK(kve_score_rule_unregister(names[i]));
    /* the rule was copied: the caller's strings may go */
    char name[8] = "copied", summary[8] = "x";
    r.name = name;
    r.summary = summary;
    ASSERT_OK(kve_score_rule_register(&r));
    memset(name, 'z', sizeof name - 1);
    ASSERT_OK(kve_policy_new("copied", NULL, &p));
    kve_policy_free(p);
    ASSERT_OK(kve_score_rule_unregister("copied"));
    /* the built-in list does not change */
    for (size_t i = 0; i < kve_policy_type_count(); i++)
        ASSERT_TRUE(strncmp(kve_policy_type_name(i), "full", 4) != 0 ||
                    strcmp(kve_policy_type_name(i), "full") == 0);
}

/* ---- calls from inside a rule's observe (kvevict.h, "Calls from
 * callbacks") ---- */

typedef struct reenter {
    kve_policy *p;     /* the object being stepped (a policy) */
    kve_bank *b;       /* or a bank */
    kve_policy *other; /* an object of its own, which stays usable */
    int calls;         /* observe calls */
    int refused;       /* calls into p or b refused with KVE_EINVAL, named */
    int tried;         /* calls into p or b tried */
    int other_ok;      /* steps of `other` that went through */
} reenter;

static void expect_refused(reenter *r, kve_status st)
{
    r->tried++;
    if (st == KVE_EINVAL && strstr(kve_last_error(), "called from inside one of this") &&
        strstr(kve_last_error(), "own callbacks"))
        r->refused++;
}

static kve_status rule_reenter(void *user, const kve_score_step *s)
{
    reenter *r = user;
    r->calls++;
    float w[64] = {0};
    int32_t victims[64];
    size_t n = 0;
    unsigned char img[4096];
    if (r->p) {
        expect_refused(r, kve_policy_step(r->p, 1000, w, kve_policy_size(r->p)));
        expect_refused(r, kve_policy_step(r->p, 1000, NULL, 0));
        expect_refused(r, kve_policy_evict(r->p, 2, victims, 64, &n));
        expect_refused(r, kve_policy_remove(r->p, 0, KVE_POS_END, &n));
        kve_policy *c = NULL;
        expect_refused(r, kve_policy_clone(r->p, &c));
        expect_refused(r, kve_policy_copy(r->p, r->other));
        expect_refused(r, kve_policy_copy(r->other, r->p));
        expect_refused(r, kve_policy_save(r->p, img, sizeof img, &n));
        kve_policy_reset(r->p); /* ignored */
        kve_policy_free(r->p);  /* ignored: the outer step goes on */
    } else {
        expect_refused(r, kve_bank_step(r->b, 1000, NULL, 0));
        expect_refused(r, kve_bank_evict(r->b, 2, victims, 64, NULL));
        expect_refused(r, kve_bank_remove(r->b, 0, KVE_POS_END));
        kve_bank *c = NULL;
        expect_refused(r, kve_bank_clone(r->b, &c));
        expect_refused(r, kve_bank_save(r->b, img, sizeof img, &n));
        float prows[64] = {0};
        expect_refused(r, kve_bank_prefill(r->b, 0, 1, 2, 2, prows, 2, 1, KVE_REDUCE_MEAN, NULL));
        kve_bank_reset(r->b);
        kve_bank_free(r->b);
    }
    /* another object is another matter */
    if (kve_policy_step(r->other, (int32_t)(2000 + r->calls), NULL, 0) == KVE_OK)
        r->other_ok++;
    for (size_t i = 0; i < s->n; i++)
        s->new_score[i] = s->score[i] + (double)s->attn[i];
    return KVE_OK;
}

/* A rule that steps, evicts, saves, clones, copies, resets or frees its own
 * object from inside observe is refused each time (before: the outer step
 * wrote one slot past its buffer, ASan's heap-buffer-overflow in head_step),
 * and the outer step gives what it gives without them. */
static void test_calls_from_a_rule(void)
{
    reenter r = {0};
    reg("reenter", rule_reenter, 0, 0, &r);
    ASSERT_OK(kve_policy_new("h2o:budget=64,recent_window=1", NULL, &r.other));
    kve_policy *p = NULL, *ref = NULL;
    ASSERT_OK(kve_policy_new("reenter:budget=4,recent_window=1", NULL, &p));
    ASSERT_OK(kve_policy_new("h2o:budget=4,recent_window=1", NULL, &ref));
    r.p = p;
    float w[8];
    int32_t v1[8], v2[8];
    for (int32_t t = 0; t < 12; t++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            w[i] = 1.0f / (float)n * (float)(1 + (i * 7 + (size_t)t) % 3) / 2.0f;
        ASSERT_OK(kve_policy_step(p, t, n ? w : NULL, n));
        ASSERT_OK(kve_policy_step(ref, t, n ? w : NULL, n));
        size_t a = 0, b = 0;
        ASSERT_OK(kve_policy_evict(p, 4, v1, 8, &a));
        ASSERT_OK(kve_policy_evict(ref, 4, v2, 8, &b));
        ASSERT_EQ(a, b);
        for (size_t i = 0; i < a; i++)
            ASSERT_EQ(v1[i], v2[i]);
    }
    ASSERT_TRUE(r.calls > 0);
    ASSERT_EQ(r.refused, r.tried);
    ASSERT_EQ(r.other_ok, r.calls);
    ASSERT_EQ(kve_policy_size(p), kve_policy_size(ref));
    kve_policy_free(p);
    kve_policy_free(ref);
    /* a bank: the same */
    memset(&r.calls, 0, sizeof r - offsetof(reenter, calls));
    r.p = NULL;
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("reenter:budget=4,recent_window=1", 2, NULL, &b));
    r.b = b;
    float brows[2 * 8];
    for (int32_t t = 0; t < 8; t++) {
        size_t n = kve_bank_size(b, 0);
        for (size_t i = 0; i < 2 * 8; i++)
            brows[i] = n ? 1.0f / (float)n : 0.0f;
        ASSERT_OK(kve_bank_step(b, t, n ? brows : NULL, 8));
        ASSERT_OK(kve_bank_evict(b, 4, v1, 4, NULL));
    }
    ASSERT_TRUE(r.calls > 0);
    ASSERT_EQ(r.refused, r.tried);
    ASSERT_EQ(kve_bank_size(b, 1), 4);
    kve_bank_free(b);
    kve_policy_free(r.other);
    ASSERT_OK(kve_score_rule_unregister("reenter"));
}

/* ---- a rule's state in an image ---- */

static kve_status rule_stateful(void *user, const kve_score_step *s)
{
    (void)user;
    for (size_t i = 0; i < s->n; i++) {
        s->new_state[i * 2] = s->state[i * 2] + (double)s->attn[i];
        s->new_state[i * 2 + 1] = (double)s->pos[i];
        s->new_score[i] = s->new_state[i * 2];
    }
    return KVE_OK;
}

/* An image whose rule state is NaN or infinite is refused at load, naming
 * the slot (before: it loaded, and every later step was refused). */
static void test_rule_state_in_images(void)
{
    reg("stateful", rule_stateful, 2, 0, NULL);
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("stateful:budget=8,recent_window=1", NULL, &p));
    float w[8];
    for (int32_t t = 0; t < 6; t++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            w[i] = 1.0f / (float)n;
        ASSERT_OK(kve_policy_step(p, t, n ? w : NULL, n));
    }
    static uint8_t img[4096];
    size_t size = 0;
    ASSERT_OK(kve_policy_save(p, img, sizeof img, &size));
    kve_policy *q = NULL;
    ASSERT_OK(kve_policy_load(img, size, NULL, &q)); /* as saved: loads */
    kve_policy_free(q);
    img_hdr h;
    ASSERT_TRUE(img_header(img, size, &h) == 0);
    const size_t n = kve_policy_size(p);
    /* the head's columns: positions (4 bytes a slot), scores (8), state (16) */
    const size_t state_at = img_head_at(img, &h, 0) + IMG_HEAD + n * 4 + n * 8;
    const double bad[2] = {NAN, INFINITY};
    for (int k = 0; k < 2; k++) {
        uint8_t copy[4096];
        memcpy(copy, img, size);
        uint64_t bits;
        memcpy(&bits, &bad[k], 8);
        img_put(copy + state_at + 3 * 16 + 8, bits, 8); /* slot 3, its second double */
        img_reseal(copy, size);
        q = NULL;
        ASSERT_STATUS(kve_policy_load(copy, size, NULL, &q), KVE_EINVAL);
        ASSERT_TRUE(q == NULL);
        ASSERT_CONTAINS(kve_last_error(), k ? "state[3][1] of rule stateful is infinite"
                                            : "state[3][1] of rule stateful is NaN");
    }
    kve_policy_free(p);
    ASSERT_OK(kve_score_rule_unregister("stateful"));
}

/* Writes what rule_stateful writes, then *user (if not 0) into state[1][1]
 * at every head whose kept set has a slot 1. */
static kve_status rule_nanst(void *user, const kve_score_step *s)
{
    (void)rule_stateful(NULL, s);
    const double bad = *(const double *)user;
    if (bad != 0.0 && s->n > 1)
        s->new_state[1 * 2 + 1] = bad;
    return KVE_OK;
}

/* Scores finite, but too large to be multiplied by a value norm. */
static kve_status rule_huge(void *user, const kve_score_step *s)
{
    (void)user;
    for (size_t i = 0; i < s->n; i++)
        s->new_score[i] = 1e300;
    return KVE_OK;
}

/* p's (or b's) image loads, and the object loaded saves the same bytes. */
static void saved_loads(const kve_policy *p, const kve_bank *b)
{
    static uint8_t img[8192], again[8192];
    size_t size = 0, size2 = 0;
    kve_policy *q = NULL;
    kve_bank *c = NULL;
    ASSERT_OK(p ? kve_policy_save(p, img, sizeof img, &size)
                : kve_bank_save(b, img, sizeof img, &size));
    ASSERT_OK(p ? kve_policy_load(img, size, NULL, &q) : kve_bank_load(img, size, NULL, &c));
    ASSERT_OK(p ? kve_policy_save(q, again, sizeof again, &size2)
                : kve_bank_save(c, again, sizeof again, &size2));
    ASSERT_TRUE(size2 == size && memcmp(img, again, size) == 0);
    kve_policy_free(q);
    kve_bank_free(c);
}

/* A rule that writes a NaN or infinite state is refused at that step,
 * naming the rule and the slot, and the state stays as it was (before:
 * every step succeeded, the save too, and the load refused the image:
 * "state[1][1] of rule nanst is NaN"). What is saved loads. So is a
 * score whose product with the value norm (vnorm=1) is not finite. */
static void test_rule_state_not_finite(void)
{
    double bad = 0.0;
    reg("nanst", rule_nanst, 2, 0, &bad);
    kve_policy *p = NULL;
    ASSERT_OK(kve_policy_new("nanst:budget=8,recent_window=1", NULL, &p));
    float w[8];
    int32_t t = 0;
    for (; t < 4; t++) {
        size_t n = kve_policy_size(p);
        for (size_t i = 0; i < n; i++)
            w[i] = 1.0f / (float)n;
        ASSERT_OK(kve_policy_step(p, t, n ? w : NULL, n));
    }
    static uint8_t img[4096], img2[4096];
    size_t size = 0, size2 = 0;
    const double bads[2] = {NAN, -INFINITY};
    const size_t n = kve_policy_size(p);
    for (size_t i = 0; i < n; i++)
        w[i] = 1.0f / (float)n;
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(kve_policy_save(p, img, sizeof img, &size));
        bad = bads[k];
        ASSERT_STATUS(kve_policy_step(p, t, w, n), KVE_EINVAL);
        ASSERT_CONTAINS(kve_last_error(), "nanst: the rule's new state[1][1] (slot 1, position 1)");
        ASSERT_CONTAINS(kve_last_error(), k ? "is -inf, not finite" : "is nan, not finite");
        ASSERT_OK(kve_policy_save(p, img2, sizeof img2, &size2));
        ASSERT_EQ(size2, size);
        ASSERT_TRUE(memcmp(img, img2, size) == 0); /* unchanged */
        bad = 0.0;
    }
    /* what it saves loads, and the rule goes on */
    ASSERT_OK(kve_policy_step(p, t, w, n));
    saved_loads(p, NULL);
    kve_policy_free(p);
    /* a bank: the head is named, and no head of the call changes */
    kve_bank *b = NULL;
    ASSERT_OK(kve_bank_new("nanst:budget=6,recent_window=1", H, NULL, &b));
    for (t = 0; t < 4; t++) {
        size_t m = kve_bank_size(b, 0);
        for (size_t i = 0; i < H * MAXN; i++)
            rows[i] = m ? 1.0f / (float)m : 0.0f;
        ASSERT_OK(kve_bank_step(b, t, m ? rows : NULL, MAXN));
    }
    take(b, &before);
    bad = NAN;
    ASSERT_STATUS(kve_bank_step(b, t, rows, MAXN), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "nanst: head 0: the rule's new state[1][1]");
    take(b, &after);
    ASSERT_TRUE(same_snap(&before, &after));
    bad = 0.0;
    ASSERT_OK(kve_bank_step(b, t, rows, MAXN));
    saved_loads(NULL, b);
    kve_bank_free(b);
    ASSERT_OK(kve_score_rule_unregister("nanst"));
    /* under vnorm=1 the policy's score is the rule's times ||v||: a finite
     * score whose product is not was saved as infinite, and refused by the
     * load ("score[0] is infinite") */
    reg("huge", rule_huge, 0, 0, NULL);
    kve_policy_options o = kve_policy_default_options();
    o.value_dim = 2;
    ASSERT_OK(kve_policy_new_ex("huge:budget=8,recent_window=1,vnorm=1", NULL, &o, &p));
    const float v[2] = {1e30f, 1e30f};
    kve_step_data d = kve_step_default_data();
    d.values = v;
    d.ld_values = 2;
    ASSERT_OK(kve_policy_step_data(p, 0, &d));
    ASSERT_OK(kve_policy_save(p, img, sizeof img, &size));
    d.attn = w;
    d.ld = 1;
    w[0] = 1.0f;
    ASSERT_STATUS(kve_policy_step_data(p, 1, &d), KVE_EINVAL);
    ASSERT_CONTAINS(kve_last_error(), "huge: the rule's new score of slot 0 (position 0), 1e+300, "
                                      "times the value norm");
    ASSERT_CONTAINS(kve_last_error(), "is not finite");
    ASSERT_OK(kve_policy_save(p, img2, sizeof img2, &size2));
    ASSERT_TRUE(size2 == size && memcmp(img, img2, size) == 0);
    kve_policy_free(p);
    ASSERT_OK(kve_score_rule_unregister("huge"));
}

int main(int argc, char **argv)
{
    CHECK_INIT(argc, argv);
    RUN(test_rules_equal_builtin_lanes);
    RUN(test_failing_rule_changes_nothing);
    RUN(test_what_a_rule_sees);
    RUN(test_registry);
    RUN(test_calls_from_a_rule);
    RUN(test_rule_state_in_images);
    RUN(test_rule_state_not_finite);
    return CHECK_DONE();
}
