/* SPDX-License-Identifier: MIT */
/*
 * rules.c - score rules registered at run time (kvevict.h, "Score rules"):
 * the table of them, and the two halves of their step.
 *
 * The table is KVE_MAX_SCORE_RULES slots in static storage, never moved or
 * freed. A slot holds a copy of the rule (its name and summary in the
 * slot's own buffers), the param table of its spec keys and the
 * kve_policy_type the configs of its objects point to. Every read or write
 * of the table's bookkeeping (used, holds, a slot's contents while it is
 * filled or emptied) happens under one lock, a spin on an atomic flag taken
 * with acquire and dropped with release ordering, so a thread that finds a
 * rule also sees everything written when it was registered. A slot's
 * contents are written only while it is unused, and a used slot is emptied
 * only while nothing holds it; a holder (a config being parsed, an object
 * built from it) therefore reads its type without the lock.
 *
 * Columns of a rule's heads (policy_impl.h): score, mark, pos; extra0 the
 * rule's state (state doubles a slot, lazy); row (float) the step's reduced
 * attention; scratch ((1 + state) doubles a slot) the rule's output,
 * laid out as new_score[0 .. cap) then new_state[cap * state]: a region of
 * the head's own slots, used within one step only. With vnorm the raw and
 * vnorm columns of every scored policy.
 *
 * A step with attention runs in two halves: prepare (before any head of the
 * range is stepped: closes the gap, reduces the rows, copies the state into
 * the output buffer, calls the rule, checks its scores and state, all
 * finite, so that a saved image always loads) and the commit (the lane's
 * pass: copies the outputs into place, multiplies by the value norms under
 * vnorm, finds the argmin). A failing rule thus leaves every head as it
 * was. Cost per step: O(n (group + 2 + 2 state)) around the rule's own.
 */
#include "policy_impl.h"
#include "simd.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

enum { SUMMARY_MAX = 128, N_RULE_PARAMS = 7 };
enum { STATE = KVE_COL_EXTRA0 };

typedef struct rule_slot {
    int used;          /* registered */
    size_t holds;      /* configs and objects holding it */
    char name[KVE_NAME_MAX];
    char summary[SUMMARY_MAX];
    kve_score_rule rule; /* the caller's, with name and summary pointing here */
    kve_param_def params[N_RULE_PARAMS];
    kve_policy_type type;
} rule_slot;

static rule_slot slots[KVE_MAX_SCORE_RULES];
static atomic_flag registry_lock = ATOMIC_FLAG_INIT;

static void lock(void)
{
    while (atomic_flag_test_and_set_explicit(&registry_lock, memory_order_acquire))
        ; /* held for a lookup of a few names at most */
}

static void unlock(void)
{
    atomic_flag_clear_explicit(&registry_lock, memory_order_release);
}

static const rule_slot *slot_of(const kve_policy_type *t)
{
    return (const rule_slot *)t->data;
}

/* The used slot named `name`, or NULL; under the lock. */
static rule_slot *find_locked(const char *name)
{
    for (size_t i = 0; i < KVE_MAX_SCORE_RULES; i++)
        if (slots[i].used && strcmp(slots[i].name, name) == 0)
            return &slots[i];
    return NULL;
}

const kve_policy_type *kve__rule_find(const char *name)
{
    lock();
    rule_slot *s = find_locked(name);
    if (s)
        s->holds++;
    unlock();
    return s ? &s->type : NULL;
}

void kve__rule_hold(const kve_policy_type *t)
{
    lock();
    ((rule_slot *)(uintptr_t)slot_of(t))->holds++;
    unlock();
}

void kve__rule_release(const kve_policy_type *t)
{
    lock();
    ((rule_slot *)(uintptr_t)slot_of(t))->holds--;
    unlock();
}

bool kve__rule_reads_values(const kve_policy_type *t)
{
    return slot_of(t)->rule.values != 0;
}

/* ---- the step ---- */

static kve_status rule_init(kve_config *c)
{
    const kve_score_rule *r = &slot_of(c->type)->rule;
    kve__column(c, STATE, r->state, sizeof(double));
    c->elem[KVE_COL_SCRATCH] = (1 + r->state) * sizeof(double);
    c->elem[KVE_COL_ROW] = sizeof(float);
    if (r->values)
        c->elem[KVE_COL_VNORM] = c->unit[KVE_COL_VNORM] = sizeof(double);
    return kve__check_recent_window(c);
}

static void rule_admit(const kve_config *c, kve_head *h, size_t i)
{
    size_t e = c->elem[STATE];
    if (e)
        memset((char *)h->col[STATE] + i * e, 0, e);
}

/* "head 3: " for a bank's head, "" for a policy (head KVE_NONE). */
static const char *head_label(size_t head, char buf[32])
{
    buf[0] = '\0';
    if (head != KVE_NONE)
        snprintf(buf, 32, "head %zu: ", head);
    return buf;
}

KVE_COLD static kve_status rule_failed(const kve_config *c, size_t head, kve_status st)
{
    char why[200], at[32];
    snprintf(why, sizeof why, "%s", kve_last_error());
    if (!why[0])
        return kve__fail(st, "%s: %sthe rule refused the step (%s)", c->type->name,
                         head_label(head, at), kve_status_name(st));
    return kve__fail(st, "%s: %s%s", c->type->name, head_label(head, at), why);
}

static kve_status rule_prepare(const kve_config *c, kve_head *h, const kve_rows *in, size_t head)
{
    const rule_slot *slot = slot_of(c->type);
    const size_t n = h->size, ns = slot->rule.state;
    kve__close_gap(c, h);
    float *row = h->col[KVE_COL_ROW];
    for (size_t i = 0; i < n; i++)
        row[i] = in->group == 1 ? in->row[i] : kv1_rows(in, i);
    double *out = h->col[KVE_COL_SCRATCH];
    const double *state = ns ? h->col[STATE] : NULL;
    for (size_t i = 0; i < n; i++) /* a score the rule leaves unwritten is refused below */
        out[i] = NAN;
    if (ns)
        memcpy(out + h->cap, state, n * ns * sizeof(double));
    kve_score_step s = {
        .n = n,
        .pos = h->col[KVE_COL_POS],
        .attn = row,
        .score = h->col[c->params.vnorm ? KVE_COL_RAW : KVE_COL_SCORE],
        .state = state,
        .n_state = ns,
        .vnorm = slot->rule.values ? h->col[KVE_COL_VNORM] : NULL,
        .step = h->observed + 1,
        .new_score = out,
        .new_state = ns ? out + h->cap : NULL,
    };
    (void)kve_set_error(KVE_OK, NULL);
    kve_status st = slot->rule.observe(slot->rule.user, &s);
    if (st != KVE_OK)
        return rule_failed(c, head, st);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(out[i])) {
            char at[32];
            return kve__fail(KVE_EINVAL, "%s: %sthe rule's new score of slot %zu (position %ld) "
                             "is %g, not finite (every new_score must be written)", c->type->name,
                             head_label(head, at), i,
                             (long)s.pos[i], out[i]);
        }
    /* under vnorm the policy's score is the rule's times ||v||: finite too
     * (an image holds both, and a load refuses an infinite one) */
    const double *norm = c->params.vnorm ? h->col[KVE_COL_VNORM] : NULL;
    for (size_t i = 0; norm && i < n; i++)
        if (!isfinite(out[i] * norm[i])) {
            char at[32];
            return kve__fail(KVE_EINVAL, "%s: %sthe rule's new score of slot %zu (position %ld), "
                             "%g, times the value norm %g is not finite", c->type->name,
                             head_label(head, at), i, (long)s.pos[i], out[i], norm[i]);
        }
    /* a state that is not finite would be saved, and refused by the load
     * (rule_check_state): refused here, so that what is saved loads */
    const double *nst = out + h->cap;
    for (size_t j = 0; j < n * ns; j++)
        if (!isfinite(nst[j])) {
            char at[32];
            return kve__fail(KVE_EINVAL, "%s: %sthe rule's new state[%zu][%zu] (slot %zu, "
                             "position %ld) is %g, not finite", c->type->name,
                             head_label(head, at), j / ns, j % ns, j / ns,
                             (long)s.pos[j / ns], nst[j]);
        }
    return KVE_OK;
}

/* The commit of prepare's outputs, as the lane's pass (vn: with vnorm). */
static size_t rule_commit(const kve_config *c, kve_head *h, size_t limit, int vn)
{
    const size_t n = h->size, ns = slot_of(c->type)->rule.state;
    const double *out = h->col[KVE_COL_SCRATCH];
    double *score = h->col[KVE_COL_SCORE];
    if (vn) {
        double *raw = h->col[KVE_COL_RAW];
        const double *norm = h->col[KVE_COL_VNORM];
        for (size_t i = 0; i < n; i++) {
            raw[i] = out[i];
            score[i] = out[i] * norm[i];
        }
    } else {
        memcpy(score, out, n * sizeof *score);
    }
    if (ns)
        memcpy(h->col[STATE], out + h->cap, n * ns * sizeof(double));
    return kve__shift_argmin(score, n, n, limit);
}

static size_t rule_observe(const kve_config *c, kve_head *h, const kve_rows *in, size_t limit)
{
    (void)in; /* read by prepare */
    return rule_commit(c, h, limit, 0);
}

static size_t rule_observe_vn(const kve_config *c, kve_head *h, const kve_rows *in, size_t limit)
{
    (void)in;
    return rule_commit(c, h, limit, 1);
}

static const kve_lane rule_lane = {{rule_observe, rule_observe, rule_observe},
                                   {rule_observe_vn, rule_observe_vn, rule_observe_vn}};

/* ---- the public API ---- */

kve_score_rule kve_score_rule_default(void)
{
    kve_score_rule r = {.name = NULL, .summary = NULL, .observe = NULL, .user = NULL,
                        .state = 0, .recent_window = 32, .values = 0};
    return r;
}

static kve_status check_rule(const kve_score_rule *r)
{
    if (!r)
        return kve__fail(KVE_EINVAL, "score rule: rule is NULL");
    if (!r->name)
        return kve__fail(KVE_EINVAL, "score rule: name is NULL");
    size_t len = strlen(r->name);
    if (len == 0 || len >= KVE_NAME_MAX)
        return kve__fail(KVE_EINVAL, "score rule: name \"%.40s\" must have 1 to %d characters",
                         r->name, KVE_NAME_MAX - 1);
    for (size_t i = 0; i < len; i++) {
        char ch = r->name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_'))
            return kve__fail(KVE_EINVAL, "score rule: name \"%s\" has a character outside "
                             "[a-z0-9_] at offset %zu", r->name, i);
    }
    if (!r->observe)
        return kve__fail(KVE_EINVAL, "score rule %s: observe is NULL", r->name);
    if (r->state > KVE_MAX_RULE_STATE)
        return kve__fail(KVE_EINVAL, "score rule %s: state %zu is above %d", r->name, r->state,
                         KVE_MAX_RULE_STATE);
    if (r->values != 0 && r->values != 1)
        return kve__fail(KVE_EINVAL, "score rule %s: values %d must be 0 or 1", r->name,
                         r->values);
    if (r->recent_window >= KVE_MAX_BUDGET)
        return kve__fail(KVE_EINVAL, "score rule %s: recent_window %zu must be below %d",
                         r->name, r->recent_window, KVE_MAX_BUDGET);
    return KVE_OK;
}

/* A rule's head from an image: its per-slot state finite, as observe left
 * it (a step refuses a state it could not have written). */
static bool rule_check_state(const kve_config *c, const kve_head *h, char *msg, size_t cap)
{
    const size_t ns = slot_of(c->type)->rule.state;
    const double *state = h->col[KVE_COL_EXTRA0];
    for (size_t i = 0; ns && i < h->size; i++)
        for (size_t k = 0; k < ns; k++)
            if (!isfinite(state[i * ns + k])) {
                snprintf(msg, cap, "state[%zu][%zu] of rule %s is %s", i, k, c->type->name,
                         isnan(state[i * ns + k]) ? "NaN" : "infinite");
                return false;
            }
    return true;
}

/* Fills an unused slot from a checked rule; under the lock. */
static void fill(rule_slot *s, const kve_score_rule *r)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", r->name);
    snprintf(s->summary, sizeof s->summary, "%s", r->summary ? r->summary : "");
    s->rule = *r;
    s->rule.name = s->name;
    s->rule.summary = s->summary;
    const kve_param_def defs[N_RULE_PARAMS] = {
        KVE_DEF_BUDGET,
        KVE_DEF_RECENT_WINDOW(r->recent_window),
        KVE_DEF_PAGES,
        KVE_DEF_VNORM,
    };
    memcpy(s->params, defs, sizeof defs);
    s->type.name = s->name;
    s->type.summary = s->summary;
    s->type.params = s->params;
    s->type.n_params = N_RULE_PARAMS;
    s->type.flags = KVE_TYPE_SCORED | KVE_TYPE_VNORM;
    s->type.init = rule_init;
    s->type.lane = &rule_lane;
    s->type.prepare = rule_prepare;
    s->type.admit = rule_admit;
    s->type.select = kve__select_argmin;
    s->type.evict = kve__evict_scored;
    s->type.check_state = rule_check_state;
    s->type.data = s;
    s->used = 1;
}

kve_status kve_score_rule_register(const kve_score_rule *rule)
{
    kve_status st = check_rule(rule);
    if (st != KVE_OK)
        return st;
    if (kve__builtin_type(rule->name))
        return kve__fail(KVE_EINVAL, "score rule %s: the name is a built-in policy's",
                         rule->name);
    lock();
    rule_slot *free_slot = NULL;
    bool taken = find_locked(rule->name) != NULL;
    for (size_t i = 0; i < KVE_MAX_SCORE_RULES && !free_slot && !taken; i++)
        if (!slots[i].used)
            free_slot = &slots[i];
    if (free_slot)
        fill(free_slot, rule);
    unlock();
    if (taken)
        return kve__fail(KVE_EINVAL, "score rule %s: a rule of that name is registered already",
                         rule->name);
    if (!free_slot)
        return kve__fail(KVE_ENOMEM, "score rule %s: %d rules are registered already (the most "
                         "at once)", rule->name, KVE_MAX_SCORE_RULES);
    return KVE_OK;
}

kve_status kve_score_rule_unregister(const char *name)
{
    if (!name)
        return kve__fail(KVE_EINVAL, "score rule: name is NULL");
    lock();
    rule_slot *s = find_locked(name);
    size_t holds = s ? s->holds : 0;
    if (s && holds == 0)
        s->used = 0;
    unlock();
    if (!s)
        return kve__fail(KVE_EINVAL, "score rule \"%.40s\" is not registered", name);
    if (holds)
        return kve__fail(KVE_EINVAL, "score rule \"%s\" is held by %zu object%s (free them "
                         "first)", name, holds, holds == 1 ? "" : "s");
    return KVE_OK;
}
