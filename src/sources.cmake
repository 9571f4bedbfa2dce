# SPDX-License-Identifier: MIT
# Trace, .npy, q/K, memory and evaluation-harness sources (included by the top CMakeLists.txt).
list(APPEND KVE_SOURCES src/trace.c src/trace_canonical.c src/trace_qk.c src/trace_memory.c
  src/npy.c src/eval.c)
# The canonical trace and the harness's renormalisation promise bit-identical
# results across platforms: never fuse a*b+c into an FMA there.
if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  set_source_files_properties(src/trace_canonical.c src/eval.c PROPERTIES
    COMPILE_OPTIONS -ffp-contract=off)
endif()
