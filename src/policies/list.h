/* SPDX-License-Identifier: MIT */
/*
 * list.h - the registered policies, one line each, in the order of every
 * table the library and the tools print: the ceiling first, then the
 * policies that ignore attention, then the attention-aware family, then the
 * policies that read keys.
 *
 * KVE_POLICY(name) names the file src/policies/name.c, which defines
 * `const kve_policy_type kve__name_type`. Everything else follows from this
 * list: the declarations of the tables and the registry (policy_impl.h,
 * registry.c, through the X-macro) and the build's source list (the top
 * CMakeLists.txt reads these lines). Adding a policy is its file and one
 * line here.
 *
 * No include guard: included once per expansion, with KVE_POLICY defined.
 */
KVE_POLICY(full)
KVE_POLICY(window)
KVE_POLICY(streaming)
KVE_POLICY(random)
KVE_POLICY(h2o)
KVE_POLICY(scissorhands)
KVE_POLICY(tova)
KVE_POLICY(h2o_decay)
KVE_POLICY(h2o_mean)
KVE_POLICY(knorm)
KVE_POLICY(keydiff)
KVE_POLICY(expected_attention)
