#!/bin/sh
# SPDX-License-Identifier: MIT
# test_install.sh CMAKE BUILD_DIR SOURCE_DIR CC [FLAGS] - kvevict as the two
# libraries other projects adopt, the engine core (kvevict) and the harness
# (kvevict_eval): `cmake --install` of the build tree to a temporary prefix,
# which is then moved (the package must be relocatable), and three kinds of
# consumer built and run against each library:
#   1. pkg-config (kvevict, kvevict-eval), against the shared libraries: with
#      -Wl,-rpath,$(pkg-config --variable=libdir ...) the program runs with
#      no environment (the README's advice), without it through
#      LD_LIBRARY_PATH; the harness finds the core beside it ($ORIGIN);
#   2. find_package(kvevict CONFIG REQUIRED): the core consumer with
#      kvevict::kvevict_static, the harness consumer with
#      kvevict::kvevict_eval_shared, which runs with no environment (CMake
#      puts the imported library's directory in the build's RPATH);
#   3. add_subdirectory() of the source tree: by default the core alone
#      (no kvevict::kvevict_eval, none of kvevict's tests or tool, -Werror
#      not forced), and with KVE_BUILD_EVAL=ON the harness too.
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
ran() { # ran NAME PROGRAM [ENV...]: PROGRAM ran and said it is NAME's consumer
    ran_name=$1 ran_prog=$2; shift 2
    env "$@" "$ran_prog" >"$ran_prog.out" 2>&1 || { fail "$ran_name: $(cat "$ran_prog.out")"; return; }
    grep -q "consumer ok: .* $VERSION" "$ran_prog.out" ||
        fail "$ran_name did not run: $(cat "$ran_prog.out")"
}

VERSION=$(sed -n 's/^project(kvevict VERSION \([0-9.]*\) .*/\1/p' "$SRC/CMakeLists.txt")
[ -n "$VERSION" ] || fail "no version in CMakeLists.txt"

run install "$CMAKE" --install "$BUILD" --prefix "$D/staged" || exit 1
mv "$D/staged" "$D/prefix" # relocated: nothing may point at the staging path
P=$D/prefix
LIBDIR=$(cd "$P" && ls -d lib* | head -n 1)
for f in include/kvevict.h include/kvevict_eval.h include/kvevict_version.h \
         "$LIBDIR/libkvevict.a" "$LIBDIR/libkvevict_eval.a"; do
    [ -f "$P/$f" ] || fail "$f not installed"
done
[ -x "$P/bin/kvevict" ] || fail "the kvevict tool not installed in bin/"
# decoder.md's "Your own model" runs the converter: it is installed too, and
# runs from the relocated prefix
[ -x "$P/bin/kvevict-convert" ] || fail "kvevict-convert not installed in bin/"
"$P/bin/kvevict-convert" --help >"$D/convert-help" 2>&1 ||
    fail "the installed kvevict-convert --help exits $?"
grep -q "usage" "$D/convert-help" || fail "the installed kvevict-convert prints no usage"
PCDIR=$(dirname "$(find "$P" -name kvevict.pc | head -n 1)")
for pc in kvevict kvevict-eval; do
    [ -f "$PCDIR/$pc.pc" ] || { fail "$pc.pc not installed"; exit 1; }
done
if grep -q "$D/staged" "$PCDIR"/*.pc $(find "$P" -name '*.cmake'); then
    fail "installed package files name the staging prefix"
fi

# The two programs: one per library, each printing "consumer ok: LIB VERSION".
cat >"$D/core.c" <<'C'
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
cat >"$D/eval.c" <<'C'
#include <kvevict_eval.h>
#include <stdio.h>
#include <string.h>
#ifndef KVE_EXPECT_VERSION
#error "KVE_EXPECT_VERSION is not defined"
#endif
int main(void)
{
    if (strcmp(kve_version(), KVE_EXPECT_VERSION) != 0) {
        fprintf(stderr, "version: library %s, package %s\n", kve_version(), KVE_EXPECT_VERSION);
        return 1;
    }
    kve_trace *tr = NULL;
    kve_eval_job job = {"h2o:budget=64", KVE_EVAL_BUDGET_SPEC};
    kve_eval_result r;
    if (kve_trace_open("canonical:steps=300", NULL, &tr) != KVE_OK ||
        kve_eval(tr, 0, 1, &job, 1, NULL, &r, NULL) != KVE_OK) {
        fprintf(stderr, "%s\n", kve_last_error());
        return 1;
    }
    kve_trace_free(tr);
    if (!(r.retained_mass > 0.5 && r.retained_mass <= 1.0))
        return 1;
    printf("consumer ok: kvevict_eval %s retains %.4f\n", kve_version(), r.retained_mass);
    return 0;
}
C

# 1. pkg-config, against the shared libraries.
export PKG_CONFIG_PATH="$PCDIR"
for pc in kvevict kvevict-eval; do
    [ "$(pkg-config --modversion $pc)" = "$VERSION" ] || fail "$pc: --modversion is not $VERSION"
    INC=$(pkg-config --cflags-only-I $pc | sed 's/^ *-I//; s/ *$//')
    if [ ! -d "$INC" ] || [ "$(cd "$INC" && pwd -P)" != "$(cd "$P/include" && pwd -P)" ]; then
        fail "$pc: pkg-config --cflags does not name the moved prefix's include/: $INC"
    fi
    case "$(pkg-config --libs --static $pc)" in
        *-lpthread*) fail "$pc.pc lists -lpthread, which the library does not use" ;;
    esac
    pkg-config --libs --static $pc | grep -q -- '-lm' || fail "pkg-config --static $pc lacks -lm"
done
pkg-config --libs kvevict-eval | grep -q -- '-lkvevict_eval .*-lkvevict' ||
    fail "pkg-config --libs kvevict-eval does not list the harness, then the core"
for prog in core eval; do
    pc=kvevict
    [ $prog = eval ] && pc=kvevict-eval
    libdir=$(pkg-config --variable=libdir $pc)
    # shellcheck disable=SC2086
    if run pc-$prog "$CC" $FLAGS -DKVE_EXPECT_VERSION="\"$VERSION\"" "$D/$prog.c" \
            -o "$D/pc-$prog" $(pkg-config --cflags --libs $pc) &&
       run pc-$prog-rpath "$CC" $FLAGS -DKVE_EXPECT_VERSION="\"$VERSION\"" "$D/$prog.c" \
            -o "$D/pc-$prog-rpath" $(pkg-config --cflags --libs $pc) -Wl,-rpath,"$libdir"; then
        ran "pkg-config $pc (LD_LIBRARY_PATH)" "$D/pc-$prog" LD_LIBRARY_PATH="$P/$LIBDIR"
        ran "pkg-config $pc (-rpath, no environment)" "$D/pc-$prog-rpath" -u LD_LIBRARY_PATH
    fi
done

# 2. find_package: the core static, the harness shared.
mkdir "$D/fp"
cat >"$D/fp/CMakeLists.txt" <<C
cmake_minimum_required(VERSION 3.16)
project(consumer_fp C)
find_package(kvevict $VERSION CONFIG REQUIRED)
foreach(t kvevict kvevict_static kvevict_shared kvevict_eval kvevict_eval_static kvevict_eval_shared)
  if(NOT TARGET kvevict::\${t})
    message(FATAL_ERROR "missing target kvevict::\${t}")
  endif()
endforeach()
add_executable(core core.c)
target_compile_definitions(core PRIVATE KVE_EXPECT_VERSION="\${kvevict_VERSION}")
target_link_libraries(core PRIVATE kvevict::kvevict_static)
add_executable(eval eval.c)
target_compile_definitions(eval PRIVATE KVE_EXPECT_VERSION="\${kvevict_VERSION}")
target_link_libraries(eval PRIVATE kvevict::kvevict_eval_shared)
C
cp "$D/core.c" "$D/eval.c" "$D/fp/"
if run fp-configure "$CMAKE" -S "$D/fp" -B "$D/fp/build" -DCMAKE_PREFIX_PATH="$P" \
        -DCMAKE_C_COMPILER="$CC" "-DCMAKE_C_FLAGS=$FLAGS" "-DCMAKE_EXE_LINKER_FLAGS=$FLAGS" &&
   run fp-build "$CMAKE" --build "$D/fp/build"; then
    ran "find_package kvevict::kvevict_static" "$D/fp/build/core" -u LD_LIBRARY_PATH
    ran "find_package kvevict::kvevict_eval_shared" "$D/fp/build/eval" -u LD_LIBRARY_PATH
fi

# 3. add_subdirectory of the source tree: only the libraries are built, with
#    the consumer's own flags (-Werror is not forced on it). By default the
#    core alone (checked at configure time); asked, the harness too, and the
#    core consumer's build compiles no harness source.
sub_project() { # sub_project DIR ASK: a consumer project of the source tree
    mkdir "$1"
    cat >"$1/CMakeLists.txt" <<C
cmake_minimum_required(VERSION 3.16)
project(consumer_sub C)
$2
add_subdirectory("$SRC" kvevict)
foreach(t kvevict kvevict_static kvevict_shared)
  if(NOT TARGET kvevict::\${t})
    message(FATAL_ERROR "missing target kvevict::\${t}")
  endif()
endforeach()
if(KVE_BUILD_EVAL AND NOT TARGET kvevict::kvevict_eval)
  message(FATAL_ERROR "KVE_BUILD_EVAL is on, but there is no kvevict::kvevict_eval")
elseif(NOT KVE_BUILD_EVAL AND TARGET kvevict::kvevict_eval)
  message(FATAL_ERROR "add_subdirectory built kvevict::kvevict_eval without being asked")
endif()
foreach(t kvevict test_eval kvevict-lm-speed fuzz_api_corpus kvevict_lm)
  if(TARGET \${t})
    message(FATAL_ERROR "add_subdirectory built kvevict's own \${t}")
  endif()
endforeach()
if(KVE_WERROR)
  message(FATAL_ERROR "KVE_WERROR is on for a consumer")
endif()
add_executable(core core.c)
target_compile_definitions(core PRIVATE KVE_EXPECT_VERSION="\${kvevict_VERSION}")
target_link_libraries(core PRIVATE kvevict::kvevict)
if(KVE_BUILD_EVAL)
  add_executable(eval eval.c)
  target_compile_definitions(eval PRIVATE KVE_EXPECT_VERSION="\${kvevict_VERSION}")
  target_link_libraries(eval PRIVATE kvevict::kvevict_eval)
endif()
C
    cp "$D/core.c" "$D/eval.c" "$1/"
    run "$(basename "$1")-configure" "$CMAKE" -S "$1" -B "$1/build" -DCMAKE_BUILD_TYPE=Debug \
        -DCMAKE_C_COMPILER="$CC" "-DCMAKE_C_FLAGS=$FLAGS" "-DCMAKE_EXE_LINKER_FLAGS=$FLAGS" \
        "-DCMAKE_SHARED_LINKER_FLAGS=$FLAGS"
}
sub_project "$D/sub-default" ""
if sub_project "$D/sub" "set(KVE_BUILD_EVAL ON)" &&
   run sub-core "$CMAKE" --build "$D/sub/build" -j 2 --target core; then
    ran "add_subdirectory kvevict::kvevict" "$D/sub/build/core"
    built=$(find "$D/sub/build" -name '*.o' -path '*kvevict_eval_objects*' | wc -l)
    [ "$built" -eq 0 ] || fail "building the core consumer compiled $built harness sources"
    if run sub-eval "$CMAKE" --build "$D/sub/build" -j 2 --target eval; then
        ran "add_subdirectory kvevict::kvevict_eval" "$D/sub/build/eval"
    fi
fi

[ "$fails" -eq 0 ] && echo "test_install: pkg-config, find_package and add_subdirectory consumers of kvevict and kvevict_eval built and ran (kvevict $VERSION, relocated prefix)"
[ "$fails" -eq 0 ]
