# SPDX-License-Identifier: MIT
# kvevict-llama: kvevict's policies inside llama.cpp (tools/llama/,
# docs/llama.cpp.md). llama.cpp is a test and integration dependency only:
# the libraries and the tool never link it; kvevict-llama loads it at run
# time. The dependency is llama.cpp as its users install it from the npm
# registry, pinned:
#   npm i -E node-llama-cpp@3.21.1 --ignore-scripts
# which brings the prebuilt libllama for Linux x64 and the exact source of
# that release as a git bundle, cloned here for llama.h and ggml's headers.
# Nothing is vendored.
#
#   -DKVEVICT_LLAMA=ON            fetch it into the build tree (_llama/) and build
#   -DKVEVICT_LLAMA_DIR=DIR       or take DIR, a folder where that npm command ran
set(KVEVICT_LLAMA_VERSION 3.21.1)
set(KVEVICT_LLAMA_DIR "" CACHE PATH
  "A folder where `npm i -E node-llama-cpp@${KVEVICT_LLAMA_VERSION} --ignore-scripts` ran (default: fetched into the build tree)")

if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux" OR NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  message(FATAL_ERROR "KVEVICT_LLAMA: node-llama-cpp's prebuilt libllama used here is for "
    "Linux x86-64; this is ${CMAKE_SYSTEM_NAME} ${CMAKE_SYSTEM_PROCESSOR}")
endif()

set(kvl_dir "${KVEVICT_LLAMA_DIR}")
if(NOT kvl_dir)
  set(kvl_dir "${PROJECT_BINARY_DIR}/_llama")
  if(NOT EXISTS "${kvl_dir}/node_modules/node-llama-cpp/package.json")
    find_program(KVL_NPM npm)
    if(NOT KVL_NPM)
      message(FATAL_ERROR "KVEVICT_LLAMA: npm is needed to fetch node-llama-cpp "
        "(Debian: apt-get install npm), or give -DKVEVICT_LLAMA_DIR")
    endif()
    message(STATUS "kvevict-llama: npm i -E node-llama-cpp@${KVEVICT_LLAMA_VERSION} --ignore-scripts")
    file(MAKE_DIRECTORY "${kvl_dir}")
    execute_process(COMMAND "${KVL_NPM}" i -E "node-llama-cpp@${KVEVICT_LLAMA_VERSION}"
        --ignore-scripts --no-audit --no-fund --loglevel=error
      WORKING_DIRECTORY "${kvl_dir}" RESULT_VARIABLE kvl_rc OUTPUT_QUIET)
    if(NOT kvl_rc EQUAL 0)
      message(FATAL_ERROR "KVEVICT_LLAMA: npm i node-llama-cpp@${KVEVICT_LLAMA_VERSION} failed "
        "(${kvl_rc}) in ${kvl_dir}")
    endif()
  endif()
endif()

set(kvl_pkg "${kvl_dir}/node_modules/node-llama-cpp")
if(NOT EXISTS "${kvl_pkg}/package.json")
  message(FATAL_ERROR "KVEVICT_LLAMA_DIR ${kvl_dir}: no node_modules/node-llama-cpp")
endif()
file(READ "${kvl_pkg}/package.json" kvl_json)
string(JSON kvl_version GET "${kvl_json}" version)
if(NOT kvl_version STREQUAL KVEVICT_LLAMA_VERSION)
  message(FATAL_ERROR "KVEVICT_LLAMA: node-llama-cpp ${kvl_version} in ${kvl_dir}, "
    "kvevict-llama is built for ${KVEVICT_LLAMA_VERSION} exactly")
endif()
set(KVEVICT_LLAMA_LIB_DIR "${kvl_dir}/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64")
if(NOT EXISTS "${KVEVICT_LLAMA_LIB_DIR}/libllama.v0.4.0.so")
  message(FATAL_ERROR "KVEVICT_LLAMA: no libllama.v0.4.0.so in ${KVEVICT_LLAMA_LIB_DIR}")
endif()

# The release's source, for its headers: the bundle cloned once.
set(kvl_src "${PROJECT_BINARY_DIR}/_llama/src")
if(NOT EXISTS "${kvl_src}/include/llama.h")
  find_package(Git REQUIRED)
  file(REMOVE_RECURSE "${kvl_src}")
  execute_process(COMMAND "${GIT_EXECUTABLE}" clone --quiet
      "${kvl_pkg}/llama/gitRelease.bundle" "${kvl_src}"
    RESULT_VARIABLE kvl_rc ERROR_QUIET)
  if(NOT kvl_rc EQUAL 0 OR NOT EXISTS "${kvl_src}/include/llama.h")
    message(FATAL_ERROR "KVEVICT_LLAMA: git clone of ${kvl_pkg}/llama/gitRelease.bundle failed")
  endif()
endif()
file(READ "${kvl_pkg}/llama/llama.cpp.info.json" kvl_info)
string(JSON kvl_tag GET "${kvl_info}" tag)
message(STATUS "kvevict-llama: llama.cpp ${kvl_tag} of node-llama-cpp ${kvl_version}, "
  "libraries in ${KVEVICT_LLAMA_LIB_DIR}")
set(KVEVICT_LLAMA_INCLUDE_DIRS "${kvl_src}/include" "${kvl_src}/ggml/include")

add_executable(kvevict-llama tools/llama/kvevict_llama.c tools/llama/engine.c
  tools/llama/llama_dl.c)
target_include_directories(kvevict-llama PRIVATE tools/llama tools/lm
  SYSTEM ${KVEVICT_LLAMA_INCLUDE_DIRS})
target_compile_definitions(kvevict-llama PRIVATE
  KVL_DEFAULT_LIB_DIR="${KVEVICT_LLAMA_LIB_DIR}")
find_package(Threads REQUIRED) # the engine's helpers (tools/llama/engine.c)
target_link_libraries(kvevict-llama PRIVATE kvevict_cli Threads::Threads ${CMAKE_DL_LIBS})
set_target_properties(kvevict-llama PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
