/* SPDX-License-Identifier: MIT */
/*
 * eval_impl.h - the evaluation harness's test hook (eval.c). Only tests
 * include it.
 *
 * When set, kve_eval calls fn with what each job's policy is about to
 * receive at step pos (kept positions and the attention vector, NULL for "no
 * information"), just before kve_policy_step. Per thread; NULL (the default)
 * disables it.
 */
#ifndef KVE_EVAL_IMPL_H
#define KVE_EVAL_IMPL_H

#include "internal.h"

typedef void (*kve__eval_attn_fn)(void *user, size_t job, int32_t pos, const int32_t *kept,
                                  const float *attn, size_t n);
void kve__eval_set_attn_hook(kve__eval_attn_fn fn, void *user);

#endif /* KVE_EVAL_IMPL_H */
