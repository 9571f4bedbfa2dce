# SPDX-License-Identifier: MIT
# sources.cmake - the one definition of what the two libraries are built
# from and of the flag every build of them carries, included by the top
# CMakeLists.txt (so the library build, the fuzz build and the decoder see
# the same lists and the same flag).
#
#   KVE_CORE_SOURCES  libkvevict: the engine core (include/kvevict.h); the
#                     policies are read from src/policies/list.h, one file
#                     per KVE_POLICY(name) line
#   KVE_EVAL_SOURCES  libkvevict_eval: traces, .npy files, the harness
#                     (include/kvevict_eval.h)
#   kve_exact_fp(TARGET)  -ffp-contract=off on TARGET: every instruction-set
#                     path, the canonical trace and the harness give the
#                     same bits only if no a*b+c is fused into one rounding
#                     (GCC fuses by default in GNU modes, Clang within an
#                     expression, and at -O1 in the fuzz build too)
# Paths are absolute, so a subdirectory can use the lists as they are.

set(KVE_CORE_SOURCES)
foreach(f error alloc rng version spec config bank policy scored sliding pages group budgets
    registry rules isa kernels attn prefill topk lifecycle image)
  list(APPEND KVE_CORE_SOURCES ${PROJECT_SOURCE_DIR}/src/${f}.c)
endforeach()
file(STRINGS ${PROJECT_SOURCE_DIR}/src/policies/list.h kve_policy_lines
  REGEX "^KVE_POLICY\\([a-z0-9_]+\\)")
foreach(line IN LISTS kve_policy_lines)
  string(REGEX REPLACE "^KVE_POLICY\\(([a-z0-9_]+)\\).*" "\\1" name "${line}")
  list(APPEND KVE_CORE_SOURCES ${PROJECT_SOURCE_DIR}/src/policies/${name}.c)
endforeach()
if(NOT kve_policy_lines)
  message(FATAL_ERROR "src/policies/list.h names no policy")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/src/policies/list.h)

set(KVE_EVAL_SOURCES)
foreach(f trace trace_canonical trace_qk trace_memory trace_callback npy eval)
  list(APPEND KVE_EVAL_SOURCES ${PROJECT_SOURCE_DIR}/src/eval/${f}.c)
endforeach()

function(kve_exact_fp target)
  if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -ffp-contract=off)
  endif()
endfunction()
