#!/bin/sh
# SPDX-License-Identifier: MIT
# test_split.sh NM CORE_A EVAL_A CORE_SO EVAL_SO SOURCE_DIR BINARY_DIR CC [COMPILER]
# - the engine core apart from the research harness (docs/architecture.md,
# "Two libraries"), checked on the built libraries themselves:
#   1. the core archive defines no kve_trace_* or kve_eval_* symbol and
#      references no file, clock or process call (nm -u: fopen, fread,
#      fwrite, open, mmap, clock_gettime, time and their kin), while the
#      harness archive does both (so the reading is not vacuous);
#   2. include/kvevict.h declares nothing of traces or evaluation and does
#      not bring in <stdio.h>;
#   3. the private ABI the harness calls (kve__ in src/internal.h) is
#      defined once, in the core: exported by libkvevict.so, imported by
#      libkvevict_eval.so, defined by no harness object (so both archives
#      link into one program without duplicate symbols);
#   4. every core source compiles with -std=c11 -pedantic-errors and no
#      feature-test macro, including only standard C headers (and the
#      compiler's intrinsics), with CC and with COMPILER when given.
# COMPILER "clang": that compiler is required, and the test exits 77
# (skipped, the reason printed) when it is not installed.
set -u
NM=${1:?usage: test_split.sh NM CORE_A EVAL_A CORE_SO EVAL_SO SOURCE_DIR BINARY_DIR CC [COMPILER]}
CORE_A=${2:?}
EVAL_A=${3:?}
CORE_SO=${4:?}
EVAL_SO=${5:?}
SRC=${6:?}
BIN=${7:?}
CC=${8:?}
ONLY=${9:-}
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# 4. the core as pure C11, with one compiler
pedantic() { # pedantic COMPILER
    set -- "$1" "$SRC"/src/*.c "$SRC"/src/policies/*.c
    cc=$1
    shift
    n=$#
    if ! out=$("$cc" -std=c11 -pedantic-errors -Werror=implicit-function-declaration \
            -fsyntax-only -I "$SRC/include" -I "$BIN/include" -I "$SRC/src" "$@" 2>&1); then
        fail "$cc -std=c11 -pedantic-errors: $(echo "$out" | head -5)"
    fi
    echo "test_split: $n core sources compile with $cc -std=c11 -pedantic-errors"
}

if [ "$ONLY" = clang ]; then
    if ! command -v clang >/dev/null 2>&1; then
        echo "SKIP: clang is not installed (apt-get install clang): the core was not compiled with it"
        exit 77
    fi
    pedantic clang
    [ "$fails" -eq 0 ]
    exit
fi

# 4a. the system headers the core includes (its sources, private headers
# and kvevict.h): standard C11 ones only, no clock, thread or signal header,
# and the compiler's vector intrinsics
C11='assert|complex|ctype|errno|fenv|float|inttypes|iso646|limits|locale|math|setjmp|stdalign|stdarg|stdatomic|stdbool|stddef|stdint|stdio|stdlib|stdnoreturn|string|tgmath|uchar|wchar|wctype|immintrin'
bad=$(grep -HE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<' "$SRC"/src/*.c "$SRC"/src/*.h \
        "$SRC"/src/*.inc "$SRC"/src/policies/*.c "$SRC"/include/kvevict.h |
    grep -vE "<($C11)\.h>" || true)
[ -z "$bad" ] || fail "the core includes headers beyond C11: $bad"
grep -qE '^#define _(POSIX|GNU|XOPEN|DEFAULT)_' "$SRC"/src/*.c "$SRC"/src/policies/*.c &&
    fail "a core source defines a feature-test macro"

# 1. what the core archive defines and references
defined=$("$NM" -g --defined-only "$CORE_A" | awk 'NF >= 3 {print $3}')
[ -n "$defined" ] || fail "nm read no symbol from $CORE_A"
bad=$(echo "$defined" | grep -E '^kve_(trace|eval)' || true)
[ -z "$bad" ] || fail "the core defines harness symbols: $(echo $bad)"
echo "$defined" | grep -qx kve_policy_new || fail "the core does not define kve_policy_new"
FORBIDDEN='fopen|fopen64|fdopen|freopen|fread|fwrite|fclose|fprintf|fputs|printf|puts|open|open64|openat|creat|read|write|close|mmap|mmap64|munmap|stat|fstat|fstat64|clock_gettime|clock|gettimeofday|time|getenv|exit|_exit|abort|pthread_create'
undefined=$("$NM" -u "$CORE_A" | awk '{print $NF}' | sed 's/@.*//' | sort -u)
bad=$(echo "$undefined" | grep -Ex "$FORBIDDEN" || true)
[ -z "$bad" ] || fail "the core references: $(echo $bad)"
harness=$("$NM" -u "$EVAL_A" | awk '{print $NF}' | sed 's/@.*//' | sort -u)
for want in 'fopen(64)?' 'fread' 'clock_gettime'; do
    echo "$harness" | grep -qEx "$want" || fail "the harness archive does not reference $want (is nm read right?)"
done
"$NM" -g --defined-only "$EVAL_A" | awk '{print $3}' | grep -qx kve_trace_open ||
    fail "the harness archive does not define kve_trace_open"

# 2. the engine's header
pre=$(printf '#include <kvevict.h>\n' | "$CC" -std=c11 -E -P -I "$SRC/include" -I "$BIN/include" -)
[ -n "$pre" ] || fail "kvevict.h did not preprocess"
bad=$(echo "$pre" | grep -oE '\bkve_(trace|eval|progress)[a-z_]*' | sort -u || true)
[ -z "$bad" ] || fail "kvevict.h declares: $(echo $bad)"
echo "$pre" | grep -qwE 'fopen|FILE' && fail "kvevict.h brings in <stdio.h> (FILE, fopen)"
echo "$pre" | grep -qw kve_bank_step_range || fail "kvevict.h did not declare kve_bank_step_range"

# 3. the private ABI: one definition, in the core
private=$(grep -E '^KVE_PRIVATE' "$SRC/src/internal.h" | grep -oE 'kve__[a-z_0-9]+\(' | tr -d '(' | sort -u)
[ -n "$private" ] || fail "src/internal.h marks no KVE_PRIVATE function"
exported=$("$NM" -D --defined-only "$CORE_SO" | awk '{print $3}' | grep '^kve__' | sort -u)
[ "$exported" = "$private" ] ||
    fail "libkvevict.so exports kve__ [$(echo $exported)], internal.h marks [$(echo $private)]"
dup=$("$NM" -g --defined-only "$EVAL_A" | awk '{print $3}' | grep '^kve__' | grep -Fx "$private" || true)
[ -z "$dup" ] || fail "the harness defines the core's private functions too: $(echo $dup)"
imported=$("$NM" -D -u "$EVAL_SO" | awk '{print $2}' | sed 's/@.*//' | grep '^kve__' | sort -u)
[ -n "$imported" ] || fail "libkvevict_eval.so imports no kve__ function (is it linked to the core?)"
for f in $imported; do
    echo "$private" | grep -qx "$f" || fail "libkvevict_eval.so imports $f, which is not KVE_PRIVATE"
done

# 4. with the build's compiler
pedantic "$CC"
[ "$fails" -eq 0 ] && echo "test_split: the core defines no harness symbol and calls no file, clock or process function; kvevict.h declares nothing of traces; the private ABI ($(echo $private | wc -w) functions) is defined once"
[ "$fails" -eq 0 ]
