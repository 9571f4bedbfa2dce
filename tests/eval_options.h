/* SPDX-License-Identifier: MIT */
/*
 * eval_options.h - the harness's options as one expression, for the many
 * calls of the tests that set one or two fields: each macro is a pointer to
 * a block-scope compound literal started from kve_X_default_options(), so
 * a field added to the library later keeps its default here too.
 *   TRACE_FLAGS(f)          kve_trace_open(src, TRACE_FLAGS(KVE_TRACE_NORMALIZE), &tr)
 *   TRACE_OPTS(f, fn, user) ... with a progress callback
 *   EVAL_OPTS(seed, fn, user)  kve_eval(tr, 0, 1, jobs, n, EVAL_OPTS(1, NULL, NULL), r, NULL)
 */
#ifndef KVE_EVAL_OPTIONS_H
#define KVE_EVAL_OPTIONS_H

#include "kvevict_eval.h"

static inline kve_trace_options trace_opts(unsigned flags, kve_progress_fn progress, void *user)
{
    kve_trace_options o = kve_trace_default_options();
    o.flags = (kve_trace_flags)flags;
    o.progress = progress;
    o.user = user;
    return o;
}

static inline kve_eval_options eval_opts(uint64_t seed, kve_eval_step_fn on_step, void *user)
{
    kve_eval_options o = kve_eval_default_options();
    o.seed = seed;
    o.on_step = on_step;
    o.user = user;
    return o;
}

#define TRACE_OPTS(f, fn, user) ((kve_trace_options[]){trace_opts((unsigned)(f), (fn), (user))})
#define TRACE_FLAGS(f) TRACE_OPTS((f), NULL, NULL)
#define EVAL_OPTS(seed, fn, user) ((kve_eval_options[]){eval_opts((seed), (fn), (user))})

#endif /* KVE_EVAL_OPTIONS_H */
