#!/bin/sh
# SPDX-License-Identifier: MIT
# test_leaderboard.sh KVEVICT SOURCE_DIR [--write] - the reproduction check of
# docs/leaderboard.md. Its tables are rendered from docs/data/leaderboard.jsonl
# (test_docs checks that they equal that file); this test
#  - re-runs a small deterministic subset of `kvevict lm leaderboard` (three
#    methods: a prefill's scores, the policy's own, per-step eviction under a
#    DuoAttention schedule (the fourth field); at ratio 0.9 on one window,
#    one pass-key prompt and one repeated passage: about 6,000 decoded
#    positions) and requires docs/data/leaderboard-check.jsonl to the last
#    digit, the timing column (policy_time_share) left out; `make
#    leaderboard` writes that file with this script (--write);
#  - requires the committed leaderboard to hold every method of `kvevict lm
#    leaderboard --list` at each of its ratios, and no other (a method added
#    to the table, or removed, fails here until `make leaderboard` is rerun);
#  - checks that --methods, --ratio and --distances repeated are their comma
#    lists, row for row;
#  - checks the command's refusals (an unknown method, a ratio outside (0, 1)).
# With `quick` as the third argument (sanitized builds, where
# the subset takes minutes) it skips the subset and checks the rest.
# Skipped (77) in a tree without models/.
set -u
K=${1:?usage: test_leaderboard.sh PATH/TO/kvevict SOURCE_DIR [--write]}
SRC=${2:?usage: test_leaderboard.sh PATH/TO/kvevict SOURCE_DIR [--write]}
WRITE=${3:-}
case $K in /*) ;; *) K=$(pwd)/$K ;; esac
cd "$SRC" || exit 1
M=models/kjv.bin
T=models/heldout.txt
D=docs/data
if [ ! -f "$M" ] || [ ! -f "$T" ]; then
    echo "test_leaderboard: no $M here: skipped"
    exit 77
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/kve-leaderboard.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
fail=0
untimed() { sed 's/, "policy_time_share": [^,}]*//' "$1"; }
if [ "$WRITE" != quick ]; then
"$K" lm leaderboard --model "$M" --text "$T" --methods snapkv+h2o,own+keydiff,duo+streaming \
    --ratio 0.9 --windows 1 --trials 1 --distances 503 --repeat-trials 1 --json --quiet \
    >"$W/run.jsonl" || { echo "FAIL: the check command failed" >&2; exit 1; }
untimed "$W/run.jsonl" >"$W/check.jsonl"
if [ "$WRITE" = --write ]; then
    cp "$W/check.jsonl" "$D/leaderboard-check.jsonl" || exit 1
    echo "test_leaderboard: wrote $D/leaderboard-check.jsonl"
    exit 0
fi
if ! cmp -s "$W/check.jsonl" "$D/leaderboard-check.jsonl"; then
    echo "FAIL: lm leaderboard no longer reproduces $D/leaderboard-check.jsonl:" >&2
    diff "$D/leaderboard-check.jsonl" "$W/check.jsonl" | head -8 >&2
    fail=1
fi
# Four rows, the timing a share in [0, 1] (the full cache's 0: no policy).
[ "$(wc -l <"$W/run.jsonl")" -eq 4 ] || { echo "FAIL: not 4 rows" >&2; fail=1; }
if grep -v '"policy_time_share": \(0\|0\.[0-9]*\|1\), "skipped": null}$' "$W/run.jsonl" >/dev/null; then
    echo "FAIL: a policy_time_share outside [0, 1]" >&2
    fail=1
fi
# A method that cannot run at a ratio is a row saying why; the run goes on
# (ratio 0.95 of 512 positions: budget 25, below h2o's recent window of 32).
small="--windows 1 --trials 1 --distances 503 --repeat-trials 1 --json --quiet"
# shellcheck disable=SC2086
"$K" lm leaderboard --model "$M" --text "$T" --methods h2o,streaming --ratio 0.95 $small >"$W/skip.jsonl" \
    2>"$W/err" || { echo "FAIL: a method that does not fit aborted the run: $(cat "$W/err")" >&2; fail=1; }
grep -q '^{"method": "h2o",.*"bits_per_byte": null,.*"skipped": "budget 25: h2o: recent_window 32 must be smaller than budget 25"}$' \
    "$W/skip.jsonl" || { echo "FAIL: no skipped h2o row with its reason:" >&2; cat "$W/skip.jsonl" >&2; fail=1; }
grep -q '^{"method": "streaming",.*"bits_per_byte": [0-9.]*,.*"skipped": null}$' "$W/skip.jsonl" ||
    { echo "FAIL: streaming not measured beside the skipped h2o" >&2; fail=1; }
# A list option takes a comma list or repeats of itself, as --policy does:
# --methods A --methods B is --methods A,B, row for row (so are --ratio and
# --distances).
lists="--windows 1 --trials 1 --repeat-trials 1 --json --quiet"
# shellcheck disable=SC2086
"$K" lm leaderboard --model "$M" --text "$T" --methods h2o,streaming --ratio 0.9,0.95 \
    --distances 448,503 $lists >"$W/comma.jsonl" 2>"$W/err" &&
    "$K" lm leaderboard --model "$M" --text "$T" --methods h2o --methods streaming --ratio 0.9 \
        --ratio=0.95 --distances 448 --distances 503 $lists >"$W/repeated.jsonl" 2>>"$W/err" ||
    { echo "FAIL: repeated --methods, --ratio or --distances refused: $(cat "$W/err")" >&2; fail=1; }
untimed "$W/comma.jsonl" >"$W/comma"
untimed "$W/repeated.jsonl" >"$W/repeated"
if [ "$(wc -l <"$W/comma")" -ne 5 ] || ! cmp -s "$W/comma" "$W/repeated"; then
    echo "FAIL: repeated list options are not their comma list:" >&2
    diff "$W/comma" "$W/repeated" | head -4 >&2
    fail=1
fi
# Methods from the command line: --method PREFILL+SPEC is the table's line
# of that name, figure for figure.
# shellcheck disable=SC2086
"$K" lm leaderboard --model "$M" --text "$T" --methods snapkv+tova --ratio 0.9 $small >"$W/a.jsonl" &&
    "$K" lm leaderboard --model "$M" --text "$T" --methods none --method snapkv+tova --ratio 0.9 \
        $small >"$W/b.jsonl" || { echo "FAIL: --method snapkv+tova did not run" >&2; fail=1; }
untimed "$W/a.jsonl" >"$W/a"
untimed "$W/b.jsonl" >"$W/b"
if [ "$(wc -l <"$W/b")" -ne 2 ] || ! cmp -s "$W/a" "$W/b"; then
    echo "FAIL: --method snapkv+tova differs from the table's snapkv+tova:" >&2
    diff "$W/a" "$W/b" | head -4 >&2
    fail=1
fi
fi # not quick
# Every listed method at every committed ratio, and nothing else.
"$K" lm leaderboard --list | cut -f1 | sort >"$W/listed" || fail=1
for r in $(grep -o '"compression_ratio": [0-9.]*' "$D/leaderboard.jsonl" | cut -d' ' -f2 |
    sort -u | grep -v '^0$'); do
    grep "\"compression_ratio\": $r," "$D/leaderboard.jsonl" |
        sed 's/^{"method": "\([^"]*\)".*/\1/' | sort >"$W/measured"
    if ! cmp -s "$W/listed" "$W/measured"; then
        echo "FAIL: the methods measured at ratio $r are not those of --list (make leaderboard):" >&2
        diff "$W/listed" "$W/measured" | head -6 >&2
        fail=1
    fi
done
[ "$(grep -c '^{"method": "full"' "$D/leaderboard.jsonl")" -eq 1 ] ||
    { echo "FAIL: not one full-cache row" >&2; fail=1; }
# Refusals: usage errors (exit 2) naming the problem, before any file is read.
"$K" lm leaderboard --model "$M" --text "$T" --methods nosuch >/dev/null 2>"$W/err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q "no method 'nosuch'" "$W/err"; then
    echo "FAIL: an unknown method: exit $rc, $(cat "$W/err")" >&2
    fail=1
fi
"$K" lm leaderboard --model "$M" --text "$T" --ratio 1 >/dev/null 2>"$W/err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q "ratio" "$W/err"; then
    echo "FAIL: --ratio 1: exit $rc, $(cat "$W/err")" >&2
    fail=1
fi
"$K" lm leaderboard --model "$M" --text "$T" --methods window --windows 1000000 >/dev/null \
    2>"$W/err"
rc=$?
if [ $rc -ne 2 ] || ! grep -q "whole windows" "$W/err"; then
    echo "FAIL: --windows past the text: exit $rc, $(cat "$W/err")" >&2
    fail=1
fi
# More refusals, each a usage error naming its option.
refuse() { # WHAT ARGS...: exit 2 and a message naming WHAT
    what=$1
    shift
    "$K" lm leaderboard --model "$M" --text "$T" "$@" >/dev/null 2>"$W/err"
    rc=$?
    if [ $rc -ne 2 ] || ! grep -q -- "$what" "$W/err"; then
        echo "FAIL: lm leaderboard $*: exit $rc, $(cat "$W/err")" >&2
        fail=1
    fi
}
refuse "at most 16 ratios" --ratio 0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1
refuse "--ratio" --ratio 0
refuse "--prompt" --methods window --prompt 511
refuse "--span 300" --methods window --span 300
refuse "--repeat-distance" --methods window --repeat-distance 500
refuse "no prefill 'bogus'" --method bogus+h2o
refuse "--method h2o:bogus=1" --methods none --method h2o:bogus=1
refuse "has a method of that name" --methods h2o --method h2o
refuse "nothing to measure" --methods none
refuse "none names no method" --methods none --methods h2o
refuse "at most 16 ratios" --ratio 0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1 --ratio 0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1
refuse "--methods: no method 'nosuch'" --methods h2o --methods nosuch
if [ $fail -eq 0 ] && [ "$WRITE" = quick ]; then
    echo "test_leaderboard: quick: every method is measured, the refusals hold (the subset not run)"
elif [ $fail -eq 0 ]; then
    echo "test_leaderboard: the subset reproduces, every method is measured"
fi
exit $fail
