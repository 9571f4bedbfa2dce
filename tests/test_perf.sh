#!/bin/sh
# SPDX-License-Identifier: MIT
# test_perf.sh KVEVICT OUTCHECK SOURCE_DIR - `kvevict perf` runs (briefly,
# --quick), prints one row per measurement in every format with the keys of
# the CLI convention (parsed by outcheck, never grepped), covers every policy
# but full in both attention modes, the naive baselines and the bank sweep,
# refuses bad usage, rewrites only its own block of a --docs file; and the
# committed docs/performance.md holds the generated section and its plot.
# Timings depend on the machine: their presence and types are checked, never
# their values. POSIX sh.
set -u
K=${1:?usage: test_perf.sh PATH/TO/kvevict PATH/TO/outcheck SOURCE_DIR}
J=${2:?usage: test_perf.sh PATH/TO/kvevict PATH/TO/outcheck SOURCE_DIR}
SRC=${3:?usage: test_perf.sh PATH/TO/kvevict PATH/TO/outcheck SOURCE_DIR}
D=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-perf.XXXXXX") || exit 1
trap 'rm -rf "$D"' EXIT INT TERM
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# --quick: budgets 256 and 4096; per budget and placement the floor's five
# rows; in the pool placement every policy but full with rows and NULL (those
# that read keys: once, with keys; expected_attention, which reads queries
# and values too: with --quick only with interval=64, at budgets up to 1024),
# the ones that read attention also unchecked, h2o:vnorm=1 and the two score
# rules (impl "rule"), two naive rows; in the hot placement the ones that
# read attention, checked and unchecked; a bank of 8 heads at 256: in the
# pool placement 1 thread checked and unchecked and 2 threads, in the hot one
# 1 thread checked and unchecked.
"$K" policies | tail -n +2 | awk '{ print $1 "," $3 }' >"$D/pols" # name,reads
policies=$(grep -E ',(attention|nothing)$' "$D/pols" | cut -d, -f1 | grep -vx full)
keyed=$(grep ',keys$' "$D/pols" | cut -d, -f1)
attending=$(grep ',attention$' "$D/pols" | cut -d, -f1)
queried=$(grep ',keys+queries' "$D/pols" | cut -d, -f1)
n_pol=$(printf '%s\n' "$policies" | wc -l)
n_key=$(printf '%s\n' "$keyed" | grep -c .)
n_att=$(printf '%s\n' "$attending" | grep -c .)
n_q=$(printf '%s\n' "$queried" | grep -c .)
[ "$n_key" -eq 2 ] || fail "policies --csv: $n_key policies read keys alone, want 2"
[ "$n_q" -eq 1 ] || fail "policies --csv: $n_q policies read queries, want 1"
[ "$((n_pol + n_key + n_q + 1))" -eq "$(wc -l <"$D/pols")" ] || fail "policies: a reads label unaccounted for"
# per budget: pool (floor, policies, unchecked, h2o:vnorm=1 and the two
# rules, naive) and hot (floor, checked and unchecked); at 256 (<= 1024) the
# row of expected_attention:interval=64 too
per_budget=$((5 + 2 * n_pol + n_key + n_att + 3 + 2 + 5 + 2 * n_att))
want=$((2 * per_budget + 1 + 5))

"$K" perf --quick --json >"$D/p.jsonl" 2>"$D/err" || fail "perf --quick --json: $(cat "$D/err")"
"$J" jsonl --count "$want" --key impl:string --key policy:string --key budget:integer \
    --key heads:integer --key threads:integer --key attn:string --key unchecked:integer \
    --key pool_rows:integer --key ns_per_step:number \
    --key ns_per_slot:number --key floor_ns_per_step:number --key floor_isa:string \
    --key floor_base_ns_per_step:number --key ratio_to_floor:number \
    --key bytes_per_slot:number --key state_bytes:integer --key isa:string \
    --key timed_steps:integer --key load_average:number --no-key steps "$D/p.jsonl" ||
    fail "perf --json rows"
for p in $policies; do
    for attn in rows null; do
        for b in 256 4096; do
            grep "\"policy\": \"$p:budget=$b[,\"]" "$D/p.jsonl" | grep -q "\"attn\": \"$attn\"" ||
                fail "perf --json has no row for $p at $b with attn $attn"
        done
    done
done
for p in $keyed; do
    for b in 256 4096; do
        grep "\"policy\": \"$p:budget=$b[,\"]" "$D/p.jsonl" | grep -q '"attn": "keys"' ||
            fail "perf --json has no row for $p at $b with keys"
    done
done
for p in $attending; do
    for pool in 8 64; do
        n=$(grep "\"policy\": \"$p:budget=256[,\"]" "$D/p.jsonl" | grep '"heads": 1,' |
            grep '"attn": "rows"' | grep '"unchecked": 1' | grep -c "\"pool_rows\": $pool,")
        [ "$n" -eq 1 ] || fail "perf --json: $n unchecked rows for $p at 256 from $pool rows"
    done
done
for v in called inline timed-each-monotonic timed-each-cputime with-min; do
    [ "$(grep '"impl": "floor"' "$D/p.jsonl" | grep -c "\"policy\": \"$v\"")" -eq 4 ] ||
        fail "perf --json: the floor's $v rows"
done
for p in $queried; do
    grep "\"policy\": \"$p:budget=256,.*interval=64," "$D/p.jsonl" | grep -q '"attn": "keys"' ||
        fail "perf --json has no row for $p:interval=64 at 256"
done
for p in rule_h2o rule_vh2o; do
    for b in 256 4096; do
        grep "\"policy\": \"$p:budget=$b[,\"]" "$D/p.jsonl" | grep -q '"impl": "rule"' ||
            fail "perf --json has no score rule row for $p at $b"
    done
done
grep '"policy": "h2o:budget=4096,recent_window=32,vnorm=1"' "$D/p.jsonl" | grep -q '"attn": "rows"' ||
    fail "perf --json has no row for h2o:vnorm=1 at 4096"
for impl in naive-passes naive-sort; do
    [ "$(grep -c "\"impl\": \"$impl\"" "$D/p.jsonl")" -eq 2 ] || fail "perf --json: $impl rows"
done
grep '"heads": 8' "$D/p.jsonl" | grep -q '"threads": 2' || fail "perf --json: no bank row on 2 threads"

"$K" perf --quick --budget 300 --csv -o "$D/p.csv" 2>"$D/err" || fail "perf --csv -o: $(cat "$D/err")"
"$J" csv --count $((per_budget + 1 + 5)) --key budget:integer --key ratio_to_floor:number \
    --key unchecked:integer "$D/p.csv" || fail "perf --csv"
"$K" perf --quick --budget 300 >"$D/p.txt" 2>"$D/err" || fail "perf text: $(cat "$D/err")"
grep -q "^impl .*ns/step .*ratio" "$D/p.txt" || fail "perf text has no header"

# Bad usage: exit 2, one line naming the option.
for args in "--reps 0" "--ms x" "--budget 0" "--json --csv" "--nosuch"; do
    # shellcheck disable=SC2086
    "$K" perf $args >/dev/null 2>"$D/err"
    rc=$?
    [ "$rc" -eq 2 ] || fail "perf $args: exit $rc, want 2"
    [ "$(wc -l <"$D/err")" -eq 1 ] || fail "perf $args: not one line: $(cat "$D/err")"
done

# --docs rewrites the block and nothing else; a file without one is refused.
printf 'before\n<!-- perf:begin -->\nold\n<!-- perf:end -->\nafter\n' >"$D/doc.md"
"$K" perf --quick --budget 256 --docs "$D/doc.md" >/dev/null 2>"$D/err" || fail "perf --docs: $(cat "$D/err")"
head -2 "$D/doc.md" | tr '\n' ' ' | grep -q "^before <!-- perf:begin --> $" || fail "--docs changed the text before the block"
tail -2 "$D/doc.md" | tr '\n' ' ' | grep -q "^<!-- perf:end --> after $" || fail "--docs changed the text after the block"
grep -q '^old$' "$D/doc.md" && fail "--docs left the old block"
grep -q '^Measured ' "$D/doc.md" || fail "--docs wrote no conditions line"
printf 'no block\n' >"$D/none.md"
"$K" perf --quick --budget 256 --docs "$D/none.md" >/dev/null 2>"$D/err"
[ $? -eq 1 ] || fail "perf --docs on a file without a block: not exit 1"
[ "$(cat "$D/none.md")" = "no block" ] || fail "perf --docs changed a file without a block"

# The committed page: the generated section (every policy, the floors, the
# targets, the banks) and its plot. Their figures are the machine's own.
P="$SRC/docs/performance.md"
block=$(sed -n '/^<!-- perf:begin -->$/,/^<!-- perf:end -->$/p' "$P")
[ -n "$block" ] || fail "$P has no perf block"
for p in $policies; do
    printf '%s\n' "$block" | grep -q "^| $p | rows |" || fail "$P: no row for $p"
done
for p in $keyed; do
    printf '%s\n' "$block" | grep -q "^| $p | keys |" || fail "$P: no row for $p"
done
for p in $attending; do
    printf '%s\n' "$block" | grep -q "^| $p | rows | yes |" || fail "$P: no unchecked row for $p"
    for place in hot pool; do
        printf '%s\n' "$block" | grep -q "^| $p | $place | yes |" ||
            fail "$P: no unchecked row for $p in the $place placement"
    done
done
for what in '^Measured ' '^| floor (fastest' '^| floor (x86-64)' '^#### Targets' '^#### Banks' '256 x 4Ki' \
    '^| inline | hot |' '^| called (the floor) | pool |' 'within 1.2x of the floor, unchecked' \
    'within 1.6x of the floor, checked'; do
    printf '%s\n' "$block" | grep -q "$what" || fail "$P: the block lacks '$what'"
done
[ -s "$SRC/docs/img/perf_vs_budget.png" ] || fail "docs/img/perf_vs_budget.png is missing"

[ "$fails" -eq 0 ] || exit 1
echo "test_perf: ok"
