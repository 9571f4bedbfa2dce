#!/bin/sh
# SPDX-License-Identifier: MIT
# ctest.sh DIR [CTEST-ARGS...] - runs ctest in the build tree DIR (its output
# also goes to DIR/ctest.out), then lists the tests that skipped, each with
# its reason: the last line the test printed (every test that skips prints
# why, then exits 77). ctest's own summary says "100% tests passed" whether or
# not some skipped; this list is what says which did not run. Exit: ctest's.
# ctest.sh --summary DIR... - the skipped tests of the last run in each DIR,
# one summary (make test ends with it); with KVE_REQUIRE_ALL_TESTS=1 (CI) a
# skipped test fails it (exit 1).
set -u
skipped() { # DIR: "NAME: REASON" per test that skipped in the last run there
    [ -f "$1/ctest.out" ] || return 0
    sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .*\*\*\*Skipped.*/\1/p' "$1/ctest.out" |
        while read -r name; do
            reason=$(awk -v t="$name" '
                $0 ~ "^[0-9]+/[0-9]+ Testing: " t "$" { on = 1; out = 0; next }
                on && /^Output:$/ { out = 1; getline; next }
                on && out && /^<end of output>$/ { exit }
                on && out && NF { last = $0 }
                END { print last }' "$1/Testing/Temporary/LastTest.log" 2>/dev/null)
            echo "$name: ${reason:-(it printed no reason)}"
        done
}
if [ "${1:-}" = --summary ]; then
    shift
    total=0
    list=""
    for d in "$@"; do
        s=$(skipped "$d")
        [ -n "$s" ] || continue
        total=$((total + $(printf '%s\n' "$s" | wc -l)))
        list="$list$(printf '%s\n' "$s" | sed "s|^|  $d: |")
"
    done
    if [ "$total" -eq 0 ]; then
        echo "make test: every registered test ran (none skipped) in: $*"
    else
        echo "make test: $total test(s) did NOT run (skipped), each with its reason:"
        printf '%s' "$list"
        echo "(as root, make test installs what they need; see scripts/deps.sh)"
        [ "${KVE_REQUIRE_ALL_TESTS:-0}" = 1 ] && { echo "make test: KVE_REQUIRE_ALL_TESTS=1: every test must run"; exit 1; }
    fi
    exit 0
fi
DIR=${1:?usage: ctest.sh DIR [CTEST-ARGS...] | ctest.sh --summary DIR...}
shift
rcfile=$(mktemp "${TMPDIR:-/tmp}/kvevict-ctest.XXXXXX") || exit 1
{ (cd "$DIR" && ctest "$@" 2>&1); echo $? >"$rcfile"; } | tee "$DIR/ctest.out"
rc=$(cat "$rcfile")
rm -f "$rcfile"
s=$(skipped "$DIR")
if [ -n "$s" ]; then
    echo "Skipped in $DIR, each with its reason:"
    printf '%s\n' "$s" | sed 's/^/  /'
fi
exit "$rc"
