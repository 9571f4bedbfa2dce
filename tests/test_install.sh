#!/bin/sh
# SPDX-License-Identifier: MIT
# test_install.sh CMAKE BUILD_DIR SOURCE_DIR CC [FLAGS] - kvevict as a library
# other projects adopt: `cmake --install` of the build tree to a temporary
# prefix, which is then moved (the package must be relocatable), and three
# small consumers built and run against it:
#   1. pkg-config: cc $(pkg-config --cflags --libs kvevict), shared library;
#   2. find_package(kvevict CONFIG REQUIRED) with kvevict::kvevict_static;
#   3. add_subdirectory() of the source tree with kvevict::kvevict, which
#      must not build kvevict's tests or tool, nor force -Werror.
# Each consumer checks the version three ways (header, library, package).
# FLAGS are the sanitizer/coverage flags the build used, so its instrumented
# library links. Exit 77 (skipped) only when pkg-config is not installed.
set -u
CMAKE=${1:?usage: test_install.sh CMAKE BUILD_DIR SOURCE_DIR CC [FLAGS]}
BUILD=${2:?}
SRC=${3:?}
CC=${4:?}
FLAGS=${5:-}
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "test_install: pkg-config is not installed (apt-get install pkgconf), skipped"
    exit 77
fi
D=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-install.XXXXXX") || exit 1
trap 'rm -rf "$D"' EXIT INT TERM
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
run() { # run LOG COMMAND...: quiet unless it fails
    log=$1; shift
    if ! "$@" >"$D/$log.log" 2>&1; then
        fail "$log: $*"; tail -30 "$D/$log.log" >&2; return 1
    fi
}

VERSION=$(sed -n 's/^project(kvevict VERSION \([0-9.]*\) .*/\1/p' "$SRC/CMakeLists.txt")
[ -n "$VERSION" ] || fail "no version in CMakeLists.txt"

run install "$CMAKE" --install "$BUILD" --prefix "$D/staged" || exit 1
mv "$D/staged" "$D/prefix" # relocated: nothing may point at the staging path
P=$D/prefix
LIBDIR=$(cd "$P" && ls -d lib* | head -n 1)
[ -f "$P/include/kvevict.h" ] || fail "kvevict.h not installed"
[ -f "$P/include/kvevict_version.h" ] || fail "kvevict_version.h not installed"
[ -x "$P/bin/kvevict" ] || fail "the kvevict tool not installed in bin/"
PC=$(find "$P" -name kvevict.pc | head -n 1)
[ -n "$PC" ] || { fail "kvevict.pc not installed"; exit 1; }
if grep -q "$D/staged" "$PC" $(find "$P" -name '*.cmake'); then
    fail "installed package files name the staging prefix"
fi

cat >"$D/main.c" <<'C'
#include <kvevict.h>
#include <stdio.h>
#include <string.h>
#ifndef KVE_EXPECT_VERSION
#error "KVE_EXPECT_VERSION is not defined"
#endif
int main(void)
{
    kve_policy *p;
    if (strcmp(kve_version(), KVEVICT_VERSION_STRING) != 0 ||
        strcmp(kve_version(), KVE_EXPECT_VERSION) != 0) {
        fprintf(stderr, "version: library %s, header %s, package %s\n", kve_version(),
                KVEVICT_VERSION_STRING, KVE_EXPECT_VERSION);
        return 1;
    }
    if (kve_policy_new("h2o:budget=8,recent_window=2", NULL, &p) != KVE_OK)
        return 1;
    for (int32_t pos = 0; pos < 100; pos++) {
        float attn[9];
        size_t n = kve_policy_size(p), nv;
        int32_t victims[2];
        for (size_t i = 0; i < n; i++)
            attn[i] = 1.0f / (float)n;
        if (kve_policy_step(p, pos, attn, n) != KVE_OK ||
            kve_policy_evict(p, 8, victims, 2, &nv) != KVE_OK)
            return 1;
    }
    printf("consumer ok: kvevict %s keeps %zu\n", kve_version(), kve_policy_size(p));
    kve_policy_free(p);
    return 0;
}
C

# 1. pkg-config, against the shared library.
export PKG_CONFIG_PATH="$(dirname "$PC")"
[ "$(pkg-config --modversion kvevict)" = "$VERSION" ] || fail "pkg-config --modversion is not $VERSION"
INC=$(pkg-config --cflags-only-I kvevict | sed 's/^ *-I//; s/ *$//')
if [ ! -d "$INC" ] || [ "$(cd "$INC" && pwd -P)" != "$(cd "$P/include" && pwd -P)" ]; then
    fail "pkg-config --cflags does not name the moved prefix's include/: $INC"
fi
case "$(pkg-config --libs --static kvevict)" in
    *-lpthread*) fail "kvevict.pc lists -lpthread, which the library does not use" ;;
esac
pkg-config --libs --static kvevict | grep -q -- '-lm' || fail "pkg-config --static lacks -lm"
# shellcheck disable=SC2086
if run pkgconfig "$CC" $FLAGS -DKVE_EXPECT_VERSION="\"$VERSION\"" "$D/main.c" -o "$D/pc" \
        $(pkg-config --cflags --libs kvevict); then
    LD_LIBRARY_PATH="$P/$LIBDIR" "$D/pc" >"$D/pc.out" 2>&1 || fail "pkg-config consumer: $(cat "$D/pc.out")"
    grep -q "consumer ok: kvevict $VERSION" "$D/pc.out" || fail "pkg-config consumer did not run"
fi

# 2. find_package, against the static library.
mkdir "$D/fp"
cat >"$D/fp/CMakeLists.txt" <<C
cmake_minimum_required(VERSION 3.16)
project(consumer_fp C)
find_package(kvevict $VERSION CONFIG REQUIRED)
foreach(t kvevict::kvevict kvevict::kvevict_static kvevict::kvevict_shared)
  if(NOT TARGET \${t})
    message(FATAL_ERROR "missing target \${t}")
  endif()
endforeach()
add_executable(consumer main.c)
target_compile_definitions(consumer PRIVATE KVE_EXPECT_VERSION="\${kvevict_VERSION}")
target_link_libraries(consumer PRIVATE kvevict::kvevict_static)
C
cp "$D/main.c" "$D/fp/"
if run fp-configure "$CMAKE" -S "$D/fp" -B "$D/fp/build" -DCMAKE_PREFIX_PATH="$P" \
        -DCMAKE_C_COMPILER="$CC" "-DCMAKE_C_FLAGS=$FLAGS" "-DCMAKE_EXE_LINKER_FLAGS=$FLAGS" &&
   run fp-build "$CMAKE" --build "$D/fp/build"; then
    "$D/fp/build/consumer" >"$D/fp.out" 2>&1 || fail "find_package consumer: $(cat "$D/fp.out")"
    grep -q "consumer ok: kvevict $VERSION" "$D/fp.out" || fail "find_package consumer did not run"
fi

# 3. add_subdirectory of the source tree: only the library is built, with
#    the consumer's own flags (-Werror is not forced on it).
mkdir "$D/sub"
cat >"$D/sub/CMakeLists.txt" <<C
cmake_minimum_required(VERSION 3.16)
project(consumer_sub C)
add_subdirectory("$SRC" kvevict)
foreach(t kvevict::kvevict kvevict::kvevict_static kvevict::kvevict_shared)
  if(NOT TARGET \${t})
    message(FATAL_ERROR "missing target \${t}")
  endif()
endforeach()
foreach(t kvevict test_eval kvevict-lm-speed fuzz_api_corpus)
  if(TARGET \${t})
    message(FATAL_ERROR "add_subdirectory built kvevict's own \${t}")
  endif()
endforeach()
if(KVE_WERROR)
  message(FATAL_ERROR "KVE_WERROR is on for a consumer")
endif()
add_executable(consumer main.c)
target_compile_definitions(consumer PRIVATE KVE_EXPECT_VERSION="\${kvevict_VERSION}")
target_link_libraries(consumer PRIVATE kvevict::kvevict)
C
cp "$D/main.c" "$D/sub/"
if run sub-configure "$CMAKE" -S "$D/sub" -B "$D/sub/build" -DCMAKE_BUILD_TYPE=Debug \
        -DCMAKE_C_COMPILER="$CC" "-DCMAKE_C_FLAGS=$FLAGS" "-DCMAKE_EXE_LINKER_FLAGS=$FLAGS" \
        "-DCMAKE_SHARED_LINKER_FLAGS=$FLAGS" &&
   run sub-build "$CMAKE" --build "$D/sub/build" -j 2; then
    "$D/sub/build/consumer" >"$D/sub.out" 2>&1 || fail "add_subdirectory consumer: $(cat "$D/sub.out")"
    grep -q "consumer ok: kvevict $VERSION" "$D/sub.out" || fail "add_subdirectory consumer did not run"
fi

[ "$fails" -eq 0 ] && echo "test_install: pkg-config, find_package and add_subdirectory consumers built and ran (kvevict $VERSION, relocated prefix)"
[ "$fails" -eq 0 ]
