#!/bin/sh
# SPDX-License-Identifier: MIT
# test_cli.sh KVEVICT OUTCHECK - the kvevict command-line tool, end to end:
# every subcommand's --help, output formats (every machine-readable output
# parsed by outcheck, the strict JSON / JSON Lines / CSV checker) and
# contents, metrics over no scored step (null / n/a, a warning), --topk,
# -o and "-" (and -o to a FIFO, written in place), determinism, the .npy
# round trip, replay's line format, sweep's grid size, a list option
# repeated (its comma list), an interrupted `trace -o` leaving no file, and
# the exit codes of bad usage (2) and bad input (1), each with exactly one
# line on stderr and nothing on stdout, naming the option that was wrong.
# POSIX sh; a few seconds natively.
set -u
K=${1:?usage: test_cli.sh PATH/TO/kvevict PATH/TO/outcheck}
J=${2:?usage: test_cli.sh PATH/TO/kvevict PATH/TO/outcheck}
D=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-cli.XXXXXX") || exit 1
trap 'rm -rf "$D"' EXIT INT TERM
# fail, ok, check, expect_err CODE ARGS... (exit CODE, exactly one line on
# stderr, no stdout)
. "$(dirname "$0")/check.sh"

# ---- help ------------------------------------------------------------------
for c in "" bench eval replay trace sweep plot docs policies; do
    if [ -z "$c" ]; then "$K" --help >"$D/out" 2>"$D/err"; else "$K" "$c" --help >"$D/out" 2>"$D/err"; fi
    rc=$?
    check "kvevict $c --help exits 0" [ "$rc" -eq 0 ]
    check "kvevict $c --help prints usage on stdout" grep -q '^usage: kvevict' "$D/out"
    check "kvevict $c --help is quiet on stderr" [ ! -s "$D/err" ]
done
"$K" help >"$D/out" 2>&1; check "kvevict help exits 0" [ $? -eq 0 ]
"$K" help eval >"$D/out" 2>&1; check "kvevict help eval" grep -q '^usage: kvevict eval' "$D/out"
"$K" eval --bogus --help >"$D/out" 2>&1; check "--help wins over a bad option" [ $? -eq 0 ]

# ---- bench -----------------------------------------------------------------
"$K" bench >"$D/bench" 2>"$D/err"
check "bench exits 0" [ $? -eq 0 ]
check "bench is quiet on stderr" [ ! -s "$D/err" ]
check "bench prints the budget 256 table" grep -q '^Budget 256$' "$D/bench"
check "bench prints the budget 512 table" grep -q '^Budget 512$' "$D/bench"
check "bench prints the sweep" grep -q 'recent-window sweep at budget 256' "$D/bench"
"$K" policies >"$D/policies"
check "policies lists every policy" [ "$(wc -l <"$D/policies")" -ge 5 ]
check "policies says what each reads" grep -q '^knorm .* keys ' "$D/policies"
# The policies that read keys do not run on an attention trace: bench lists the others.
for p in $(tail -n +2 "$D/policies" | grep -v ' keys ' | cut -d" " -f1); do
    for b in 256 512; do
        check "bench has a row for $p at $b" grep -q "^$p:budget=$b[ ,]" "$D/bench"
    done
done
for w in 16 32 48 64 80 96 128; do
    check "bench sweep has recent_window $w" grep -q "^h2o:budget=256,recent_window=$w " "$D/bench"
done
n=$(grep -cE '^\([1-6]\) (reproduced|not reproduced|fitted): ' "$D/bench")
check "bench lists six observations (got $n)" [ "$n" -eq 6 ]
check "bench: the default trace is the one claim 6 was fitted on" grep -q '^(6) fitted: ' "$D/bench"
"$K" bench --markdown --trace canonical:steps=1200 >"$D/bench.md"
check "bench --markdown prints tables" grep -q '^| policy spec ' "$D/bench.md"
n=$(grep -cE '^[1-6]\. \*\*(reproduced|not reproduced)\*\*: ' "$D/bench.md")
check "bench --markdown lists six observations" [ "$n" -eq 6 ]
# The same verdicts both ways.
grep -oE '^\([1-6]\) (reproduced|not reproduced)' "$D/bench" | tr -d '()' >"$D/v1"
grep -oE '^[1-6]\. \*\*(reproduced|not reproduced)' "$D/bench.md" | tr -d '.*' >"$D/v2"
"$K" bench --trace canonical:steps=1200 | grep -oE '^\([1-6]\) (reproduced|not reproduced)' | tr -d '()' >"$D/v1"
check "bench text and markdown agree on the verdicts" cmp -s "$D/v1" "$D/v2"
check "bench: claim 6 is a check, not the fit, on another trace" grep -qE '^6 (reproduced|not reproduced)$' "$D/v1"
"$K" bench --trace canonical:version=1,steps=1200 >"$D/out"
check "bench judges version 1 too" [ "$(grep -cE '^\([1-6]\) (reproduced|not reproduced): ' "$D/out")" -eq 6 ]
check "bench names version 1's spec" grep -q '^kvevict bench: trace canonical:version=1,seed=1,steps=1200,' "$D/out"

# ---- bench --seeds: the claims on several trace seeds ----------------------------
"$K" bench --seeds 3 --trace canonical:steps=1200 >"$D/seeds" 2>"$D/err"
check "bench --seeds exits 0, quiet ($(cat "$D/err"))" [ ! -s "$D/err" ]
check "bench --seeds names the seeds" grep -q '^with seeds 1 to 3, policy seed 0$' "$D/seeds"
check "bench --seeds: six claims" [ "$(grep -cE '^\([1-6]\) ' "$D/seeds")" -eq 6 ]
check "bench --seeds: one row per seed" [ "$(grep -cE '^ +[1-3] +(yes|no|n/a) ' "$D/seeds")" -eq 3 ]
# Seed 1's column is the single-seed verdicts of the same trace.
grep -E '^ +1 +' "$D/seeds" | awk '{for (i = 2; i <= 7; i++) print (i - 1) " " ($i == "yes" ? "reproduced" : "not reproduced")}' >"$D/s1"
check "bench --seeds: seed 1 agrees with bench" cmp -s "$D/v1" "$D/s1"
# The summary follows from the matrix: a count per claim, and reproduced
# exactly when seed 1 holds and at least half of the others do.
awk '/^\([1-6]\) / { n = substr($1, 2, 1); line[n] = $0 }
     /^ +[0-9]+ +(yes|no|n\/a) / { for (k = 1; k <= 6; k++) { if ($(k + 1) == "yes") { c[k]++; if (!first) f[k] = 1; else o[k]++ } } first = 1; seeds++ }
     END { bad = 0
           for (k = 1; k <= 6; k++) {
               want = c[k] + 0 " of " seeds
               if (index(line[k], want) == 0) { print "count " k; bad = 1 }
               v = (f[k] && 2 * o[k] >= seeds - 1) ? "reproduced" : "not reproduced"
               got = line[k] ~ /not reproduced$/ ? "not reproduced" : line[k] ~ / reproduced$/ ? "reproduced" : "?"
               if (got != v) { print "verdict " k; bad = 1 } }
           exit bad }' "$D/seeds" >"$D/out"
check "bench --seeds: counts and verdicts follow the per-seed rows ($(cat "$D/out"))" [ $? -eq 0 ]
"$K" bench --seeds 2 --trace canonical:steps=1200,seed=5 >"$D/out"
check "bench --seeds starts at the trace's seed" grep -q '^with seeds 5 to 6, ' "$D/out"
"$K" bench --seeds 2 --trace canonical:steps=1200 --csv >"$D/c"
check "bench --seeds --csv: one row per seed" "$J" csv --count 2 --key trace:string --key trace_seed:integer --key seed:integer --key claim_1:string --key claim_6:string --key streaming_retained_mass_256:number "$D/c"
"$K" bench --seeds 2 --trace canonical:steps=1200 --json >"$D/j"
check "bench --seeds --json: one object per seed" "$J" jsonl --count 2 --key trace:string --key trace_seed:integer --key claim_3:string --key streaming_retained_mass_256:number "$D/j"
check "bench --seeds --json: seed 2's trace" grep -q '"trace": "canonical:version=3,seed=2,steps=1200,' "$D/j"
"$K" bench --seeds 2 --trace canonical:steps=1200 --md >"$D/m"
check "bench --seeds --md: two markdown tables" [ "$(grep -c '^| ---' "$D/m")" -eq 2 ]
expect_err 2 bench --seeds 0
expect_err 2 bench --seeds 1001
expect_err 2 bench --seeds x
expect_err 2 bench --seeds 2 --trace "$D/t.npy"
expect_err 2 bench --seeds 2 --budget 256
expect_err 2 bench --seeds 2 --topk 8
expect_err 2 bench --seeds 2 --trace canonical:seed=18446744073709551615
expect_err 2 bench --seeds 2 --trace canonical:steps=zz
# a budget a policy's defaults do not fit: one line naming --budget, the
# policy once (before: "kvevict bench: h2o: h2o: recent_window 32 ...")
expect_says 2 "kvevict bench: --budget 32: h2o: recent_window 32 must be smaller than budget 32" \
    bench --budget 32
check "bench --budget 32 names the policy once" [ "$(grep -o 'h2o' "$D/err" | wc -l)" -eq 1 ]

# ---- eval ------------------------------------------------------------------
C=canonical:steps=700
"$K" eval --trace "$C" --policy h2o --budget 256 --json >"$D/e1" 2>"$D/err"
check "eval --json exits 0" [ $? -eq 0 ]
check "eval --json is one line" [ "$(wc -l <"$D/e1")" -eq 1 ]
check "eval --json is one object" grep -qE '^\{.*\}$' "$D/e1"
for key in policy trace budget steps retained_mass top32_recall min_retained_mass ns_per_step state_bytes; do
    check "eval --json has $key" grep -q "\"$key\": " "$D/e1"
done
check "eval --json names the canonical spec" grep -q '"policy": "h2o:budget=256,recent_window=32"' "$D/e1"
check "eval --json budget" grep -q '"budget": 256,' "$D/e1"
check "eval --json steps" grep -q '"steps": 700,' "$D/e1"
check "eval --json has no NaN" sh -c "! grep -qiE 'nan|inf' '$D/e1'"
"$K" eval --trace="$C" --policy=h2o --budget=256 --json >"$D/e2"
strip() { sed -e 's/"ns_per_step": [^,}]*//' "$1"; }
strip "$D/e1" >"$D/s1"; strip "$D/e2" >"$D/s2"
check "eval is deterministic (and --opt=value works)" cmp -s "$D/s1" "$D/s2"
"$K" eval --trace "$C" --policy random:budget=128 --seed 7 --json | strip /dev/stdin >"$D/r1"
"$K" eval --trace "$C" --policy random:budget=128 --seed 7 --json | strip /dev/stdin >"$D/r2"
"$K" eval --trace "$C" --policy random:budget=128 --seed 8 --json | strip /dev/stdin >"$D/r3"
check "eval --seed replays random" cmp -s "$D/r1" "$D/r2"
check "eval --seed changes random" sh -c "! cmp -s '$D/r1' '$D/r3'"
"$K" eval --trace "$C" --policy h2o:budget=256 >"$D/out"
check "eval text names retained mass" grep -q '^retained mass ' "$D/out"

# ---- trace: .npy round trip ------------------------------------------------
"$K" trace --trace "$C" -o "$D/t.npy" >"$D/out" 2>"$D/err"
check "trace -o exits 0" [ $? -eq 0 ]
check "trace -o writes a .npy" sh -c "head -c 6 '$D/t.npy' | od -c | grep -q 'N   U   M   P   Y'"
"$K" eval --trace "$D/t.npy" --policy h2o --budget 256 --json >"$D/e3"
field() { sed -e "s/.*\"$1\": \([^,}]*\).*/\1/" "$2"; }
for key in retained_mass top32_recall min_retained_mass steps scored_steps; do
    check "the .npy evaluates to the same $key" [ "$(field $key "$D/e1")" = "$(field $key "$D/e3")" ]
done
"$K" trace --trace "$C" --output="$D/t2.npy"
check "trace is deterministic" cmp -s "$D/t.npy" "$D/t2.npy"

# ---- replay ----------------------------------------------------------------
"$K" replay --trace canonical:steps=300 --policy h2o:budget=64 >"$D/rp" 2>"$D/err"
check "replay exits 0" [ $? -eq 0 ]
check "replay prints one line per step" [ "$(wc -l <"$D/rp")" -eq 300 ]
awk '
{
    if (!match($0, /^\{"pos": [0-9]+, "victims": \[[0-9, ]*\]/)) { print "bad line " NR ": " $0; bad = 1; exit }
    line = $0
    sub(/^\{"pos": /, "", line); pos = line; sub(/,.*/, "", pos)
    if (pos + 0 != NR - 1) { print "line " NR " has pos " pos; bad = 1; exit }
    v = $0; sub(/.*"victims": \[/, "", v); sub(/\].*/, "", v)
    n = split(v, a, ", ")
    for (i = 2; i <= n; i++) if (a[i] + 0 <= a[i - 1] + 0) { print "victims not ascending at pos " pos; bad = 1; exit }
    for (i = 1; i <= n; i++) if (v != "" && a[i] + 0 > pos + 0) { print "victim after pos " pos; bad = 1; exit }
    total += (v == "" ? 0 : n)
}
END { if (!bad && total != 300 - 64) { print "evicted " total ", expected 236"; bad = 1 } exit bad }
' "$D/rp" >"$D/awk" 2>&1
check "replay lines: pos in step order, victims ascending ($(cat "$D/awk"))" [ ! -s "$D/awk" ]
"$K" replay --trace canonical:steps=300 --policy h2o:budget=64 >"$D/rp2"
check "replay is deterministic" cmp -s "$D/rp" "$D/rp2"
"$K" replay --trace "$D/t.npy" --policy h2o:budget=64 | head -n 300 >"$D/rp3"
"$K" replay --trace "$C" --policy h2o:budget=64 | head -n 300 >"$D/rp4"
check "replay of the .npy equals replay of its source" cmp -s "$D/rp3" "$D/rp4"

# ---- sweep -----------------------------------------------------------------
S="--trace canonical:steps=600 --policy h2o:budget=128"
"$K" sweep $S --param recent_window=16,32,64 --budget 128,256 >"$D/sw" 2>"$D/err"
check "sweep exits 0" [ $? -eq 0 ]
check "sweep table: a header and 6 rows" [ "$(wc -l <"$D/sw")" -eq 7 ]
"$K" sweep $S --param recent_window=16,32,64 --param budget=128,256 --csv >"$D/sw"
check "sweep --csv over two keys: a header and 6 rows" [ "$(wc -l <"$D/sw")" -eq 7 ]
check "sweep --csv header" grep -q '^recent_window,budget,budget,retained_mass,' "$D/sw"
"$K" sweep $S --param recent_window=16,32,64 --json >"$D/sw"
check "sweep --json: one object per point" [ "$(grep -c '^{.*}$' "$D/sw")" -eq 3 ]
check "sweep --json has params" grep -q '"params": {"recent_window": "64"}' "$D/sw"
"$K" sweep $S >"$D/sw"
check "sweep without --param: one row" [ "$(wc -l <"$D/sw")" -eq 2 ]
# A list option takes a comma list or repeats of itself (as lm eval's
# --policy): --budget 128 --budget 256 is --budget 128,256 (strip: timings).
"$K" sweep $S --param recent_window=16,32 --budget 128,256 --json >"$D/sw1"
"$K" sweep $S --param recent_window=16,32 --budget 128 --budget=256 --json >"$D/sw2" 2>"$D/err"
check "sweep takes --budget repeated: $(cat "$D/err")" [ $? -eq 0 ]
strip "$D/sw1" >"$D/sw1u"
strip "$D/sw2" >"$D/sw2u"
check "sweep --budget 128 --budget 256 is --budget 128,256" cmp -s "$D/sw1u" "$D/sw2u"
check "sweep --budget 128,256 over two values: 4 rows" [ "$(wc -l <"$D/sw1")" -eq 4 ]

# ---- usage errors: exit 2, one line ------------------------------------------
expect_err 2
expect_err 2 frobnicate
expect_err 2 eval --trace "$C"
expect_err 2 eval --policy h2o
expect_err 2 eval --trace "$C" --policy h2o --frob
expect_err 2 eval --trace "$C" --policy h2o --budget
expect_err 2 eval --trace "$C" --policy nosuchpolicy
expect_err 2 eval --trace "$C" --policy h2o:recent_window=x
expect_err 2 eval --trace "$C" --policy h2o --budget 16
expect_err 2 eval --trace "$C" --policy h2o --budget 12x
expect_err 2 eval --trace "$C" --policy h2o --budget -3
expect_err 2 eval --trace "$C" --policy h2o --budget " 12"
expect_err 2 eval --trace "$C" --policy h2o --budget 0
expect_err 2 eval --trace "$C" --policy h2o --budget 184467440737095516160
expect_err 2 eval --trace "$C" --policy h2o --seed 18446744073709551616
expect_err 2 eval --trace "$C" --policy h2o --json=yes
expect_err 2 eval --trace "$C" --policy h2o --trace "$C"
expect_err 2 eval --trace canonical:steps=1x --policy h2o
expect_err 2 eval --trace canonical:nokey=1 --policy h2o
expect_err 2 eval --trace "$C" --policy h2o stray
expect_err 2 sweep $S --param recent_window=16 --csv --json
expect_err 2 sweep $S --param recent_window
expect_err 2 sweep $S --param recent_window=16,,32
expect_err 2 sweep $S --param recent_window=16 --param recent_window=32
expect_err 2 sweep $S --param budget=128 --budget 256
expect_err 2 sweep $S --param nokey=1
expect_err 2 sweep $S --budget 128,abc
# A bad --policy is named as --policy, whatever --budget says; a budget a
# point's value does not fit is named as --budget.
expect_says 2 "kvevict sweep: --policy: spec name" sweep --trace "$C" --budget 64 --policy h2o,streaming
expect_says 2 "kvevict sweep: --policy: spec name" sweep --trace "$C" --budget 64 \
    --policy h2o,streaming --param recent_window=8
expect_says 2 "kvevict sweep: --budget: h2o: recent_window 200" sweep --trace "$C" --budget 64 \
    --policy h2o --param recent_window=8,200
expect_err 2 replay --trace "$C" --policy h2o --head 1
expect_err 2 trace --trace "$C"
expect_err 2 bench --steps
expect_err 2 help nosuchcommand
expect_err 2 docs

# ---- input errors: exit 1, one line --------------------------------------------
expect_err 1 eval --trace "$D/missing.npy" --policy h2o
printf 'not a numpy file at all' >"$D/bad.npy"
expect_err 1 eval --trace "$D/bad.npy" --policy h2o
printf '\223NUMPY\001\000\166\000{'"'"'descr'"'"': '"'"'<f4'"'"', '"'"'fortran_order'"'"': False, '"'"'shape'"'"': (4, 4), }' >"$D/trunc.npy"
expect_err 1 eval --trace "$D/trunc.npy" --policy h2o
head -c 200 "$D/t.npy" >"$D/short.npy"
expect_err 1 eval --trace "$D/short.npy" --policy h2o
expect_err 1 replay --trace "$D/bad.npy" --policy h2o
expect_err 1 sweep --trace "$D/bad.npy" --policy h2o --param recent_window=16
expect_err 1 bench --trace "$D/bad.npy"

# Hand-made float32 files of shape [2, 3, 3] and [2, 1, 3, 3]: head 0 and
# head 1 differ in row 2. The header (magic, version 1.0, length 118) pads
# to 128 bytes.
npy2() { # npy2 SHAPE FILE
    hdr="{'descr': '<f4', 'fortran_order': False, 'shape': ($1), }"
    pad=$((128 - 10 - ${#hdr} - 1))
    {
        printf '\223NUMPY\001\000\166\000%s' "$hdr"
        i=0; while [ $i -lt $pad ]; do printf ' '; i=$((i + 1)); done
        printf '\n'
        # head 0: [1 0 0] [.5 .5 0] [.5 .25 .25]; head 1: [1 0 0] [.5 .5 0] [.25 .25 .5]
        printf '\000\000\200\077\000\000\000\000\000\000\000\000'
        printf '\000\000\000\077\000\000\000\077\000\000\000\000'
        printf '\000\000\000\077\000\000\200\076\000\000\200\076'
        printf '\000\000\200\077\000\000\000\000\000\000\000\000'
        printf '\000\000\000\077\000\000\000\077\000\000\000\000'
        printf '\000\000\200\076\000\000\200\076\000\000\000\077'
    } >"$2"
}
npy2 "2, 3, 3" "$D/heads.npy"
npy2 "2, 1, 3, 3" "$D/layers.npy"
"$K" eval --trace "$D/heads.npy" --policy window:budget=1 --per-head --json >"$D/h" 2>"$D/err"
check "eval reads a [2,3,3] file ($(cat "$D/err"))" [ $? -eq 0 ]
check "eval reports 2 heads" grep -q '"heads": 2,' "$D/h"
check "eval --per-head lists both heads" grep -q '"per_head": \[{"layer": 0, "head": 0, .*{"layer": 0, "head": 1, ' "$D/h"
# window:budget=1 keeps position t-1: step 2 retains p(2)+p(1) = .5 (head 0)
# and .75 (head 1); the mean over heads is .625.
check "eval means over heads" grep -q '"retained_mass": 0.625' "$D/h"
"$K" eval --trace "$D/layers.npy" --policy window:budget=1 --per-head --json >"$D/h" 2>"$D/err"
check "eval reads a [2,1,3,3] file ($(cat "$D/err"))" grep -q '"heads": 2, "layers": 2,' "$D/h"
check "eval --per-head numbers heads by layer" grep -q '{"layer": 1, "head": 0, "retained_mass": 0.75,' "$D/h"
"$K" replay --trace "$D/heads.npy" --policy window:budget=1 --head 1 >"$D/out"
check "replay --head 1 of a multi-head file" [ "$(wc -l <"$D/out")" -eq 3 ]
expect_err 2 replay --trace "$D/heads.npy" --policy window:budget=1 --head 2

# ---- trace --stats: statistics with known values -----------------------------------
# Float32 files of shape [heads, 80, 80]: head "diag" puts each row's whole
# mass on the query's own key, head "first" on position 0.
mknpy() { # mknpy FILE SHAPE T HEAD...
    f=$1; shape=$2; T=$3; shift 3
    hdr="{'descr': '<f4', 'fortran_order': False, 'shape': ($shape), }"
    pad=$((128 - 10 - ${#hdr} - 1))
    {
        printf '\223NUMPY\001\000\166\000%s' "$hdr"
        i=0; while [ $i -lt $pad ]; do printf ' '; i=$((i + 1)); done
        printf '\n'
        for h in "$@"; do
            t=0
            while [ $t -lt "$T" ]; do
                if [ "$h" = diag ]; then k=$t; else k=0; fi
                head -c $((4 * k)) /dev/zero
                printf '\000\000\200\077'
                head -c $((4 * (T - 1 - k))) /dev/zero
                t=$((t + 1))
            done
        done
    } >"$f"
}
mknpy "$D/st.npy" "2, 80, 80" 80 diag first
"$K" trace --stats --trace "$D/st.npy" --block 20 --json >"$D/j" 2>"$D/err"
check "trace --stats --json: one object per head ($(cat "$D/err"))" "$J" jsonl --count 2 --key head:integer --key sink_mass:number --key recent_mass:number --key self_mass:number --key top32_persistence:number --key block_heavy_mass:number --key block_heavy_next_mass:number --key trace:string --key steps:integer --key heads:integer --key layers:integer --key block:integer "$D/j"
# Head 0: all on the own key; every top-32 is the 32 lowest (all zero, ties
# to the lower position). Blocks of 20: a block's heavy set is its own 20
# keys (the block has seen no later key), so its mass is 1 in its own block
# and 0 in the next.
check "stats: own key" grep -q '^{"head": 0, "sink_mass": 0, "recent_mass": 0, "self_mass": 1, "top32_persistence": 1, "block_heavy_mass": 1, "block_heavy_next_mass": 0, ' "$D/j"
check "stats: position 0" grep -q '^{"head": 1, "sink_mass": 1, "recent_mass": 0, "self_mass": 0, "top32_persistence": 1, "block_heavy_mass": 1, "block_heavy_next_mass": 1, ' "$D/j"
"$K" trace --stats --trace "$D/st.npy" --head 1 --csv >"$D/c"
check "trace --stats --head 1: that head only" "$J" csv --count 1 --value head=1 --value sink_mass=1 "$D/c"
"$K" trace --stats --trace "$D/st.npy" >"$D/out"
check "trace --stats text: two heads and their mean" [ "$(grep -cE '^ *(0|1|mean) ' "$D/out")" -eq 3 ]
check "stats: blocks of 512 on 80 rows are n/a" grep -qE '^ +0 .* n/a +n/a$' "$D/out"
# The canonical trace with all its mass on the band: the last 64 keys hold 1
# and each top-32 (the 32 nearest keys) shifts by one a step: 31/32.
"$K" trace --stats --trace canonical:steps=300,sinks=0,sink_mass=0,recent_mass=1,heavy_mass=0 --json >"$D/j"
check "stats: the band" grep -qE '"sink_mass": 0, "recent_mass": (1|0\.99999999[0-9]*), "self_mass": 0, "top32_persistence": 0\.96875, ' "$D/j"
"$K" trace --stats --trace canonical:steps=1100 --md -o "$D/m" >"$D/out"
check "trace --stats -o FILE --md" [ "$(grep -c '^| ' "$D/m")" -eq 3 ] && [ ! -s "$D/out" ]
expect_err 2 trace --stats --trace "$D/st.npy" --head 2
expect_err 2 trace --stats --trace "$D/st.npy" --block 0
expect_err 2 trace --stats
expect_err 2 trace --trace "$D/st.npy" --block 20 -o "$D/x.npy"
expect_err 2 trace --trace "$D/st.npy" --json -o "$D/x.npy"
expect_err 2 trace --trace "$D/st.npy"
expect_err 1 trace --stats --trace "$D/bad.npy"

# trace -o failures leave nothing behind.
expect_err 1 trace --trace "$C" -o "$D/nodir/x.npy"
check "no file in a missing directory" [ ! -e "$D/nodir/x.npy" ]
mkdir "$D/target"
before=$(ls "$D" | wc -l)
expect_err 1 trace --trace "$C" -o "$D/target"
check "a failed trace -o leaves no temporary file" [ "$(ls "$D" | wc -l)" -eq "$before" ]
check "a failed trace -o leaves the directory alone" [ -d "$D/target" ] && [ -z "$(ls "$D/target")" ]
expect_err 2 trace --trace canonical:steps=zz -o "$D/never.npy"
check "a usage error writes no file" [ ! -e "$D/never.npy" ]

# ---- plot ------------------------------------------------------------------
expect_err 1 plot --out "$D/no/such/dir"
PATH=/nonexistent "$K" plot --out "$D" >"$D/out" 2>"$D/err"
rc=$?
check "plot without gnuplot exits 1" [ "$rc" -eq 1 ]
check "plot without gnuplot says how to install it" grep -q 'apt-get install gnuplot-nox' "$D/err"
check "plot without gnuplot: one line" [ "$(wc -l <"$D/err")" -eq 1 ]

# ---- the source-tree commands: kvevict-docs beside kvevict, or a clear refusal --
check "kvevict-docs is built beside kvevict" [ -x "$(dirname "$K")/kvevict-docs" ]
"$(dirname "$K")/kvevict-docs" --help >"$D/out" 2>&1
check "kvevict-docs --help" grep -q '^usage: kvevict-docs COMMAND' "$D/out"
"$(dirname "$K")/kvevict-docs" >"$D/out" 2>"$D/err"
check "kvevict-docs without a command: usage error" [ $? -eq 2 ] && grep -q 'missing command' "$D/err"
"$(dirname "$K")/kvevict-docs" -h >"$D/out" 2>&1
check "kvevict-docs -h" grep -q '^usage: kvevict-docs COMMAND' "$D/out"
"$(dirname "$K")/kvevict-docs" eval >"$D/out" 2>"$D/err"
check "kvevict-docs eval: not its command" [ $? -eq 2 ] && grep -q "unknown command 'eval'" "$D/err"
"$K" help docs >"$D/out" 2>&1
check "kvevict help docs: kvevict-docs's usage" grep -q '^usage: kvevict docs ' "$D/out"
mkdir "$D/alone"
cp "$K" "$D/alone/kvevict"
for c in "docs --check x.md" "plot" "help docs" "perf --quick --docs x.md" "perf --plot ."; do
    # shellcheck disable=SC2086
    "$D/alone/kvevict" $c >"$D/out" 2>"$D/err"
    rc=$?
    check "without kvevict-docs, kvevict $c exits 2 ($rc)" [ "$rc" -eq 2 ]
    check "without kvevict-docs, kvevict $c: one line naming kvevict-docs" \
        sh -c "[ \$(wc -l <'$D/err') -eq 1 ] && grep -q 'kvevict-docs.*never installed' '$D/err'"
    check "without kvevict-docs, kvevict $c prints nothing" [ ! -s "$D/out" ]
done
"$D/alone/kvevict" perf --quick --budget 256 --reps 1 --ms 1 --json >"$D/out" 2>"$D/err"
check "without kvevict-docs, perf itself runs" [ $? -eq 0 ] && [ -s "$D/out" ]

# ---- docs: regenerate, check, and mask exactly the timing cells ---------------
cat >"$D/doc.md" <<'DOC'
# A page
Text above.
<!-- kvevict:begin sweep h2o:budget=64 recent_window=16,32 -->
stale
<!-- kvevict:end sweep -->
Text below.
DOC
"$K" docs --trace canonical:steps=600 --check "$D/doc.md" >"$D/out" 2>"$D/err"
check "docs --check fails on a stale block" [ $? -eq 1 ]
check "docs --check names the block" grep -q "doc.md:3: block 'sweep' is out of date" "$D/err"
"$K" docs --trace canonical:steps=600 "$D/doc.md" >"$D/out" 2>"$D/err"
check "docs regenerates" [ $? -eq 0 ]
check "docs keeps the text around blocks" grep -q '^Text below.$' "$D/doc.md"
check "docs writes the table" grep -qE '^\| +32 \| +64 \| ' "$D/doc.md"
"$K" docs --trace canonical:steps=600 --check "$D/doc.md" >"$D/out" 2>"$D/err"
check "docs --check passes after regenerating" [ $? -eq 0 ]
check "docs blocks carry no timing column" sh -c "! grep -q 'ns/step' '$D/doc.md'"
# Change a retained-mass cell: drift.
awk -F'|' 'BEGIN{OFS="|"} /^\| +16 \|/{ $4=" 0.0001 " } {print}' "$D/doc.md" >"$D/doc3.md"
"$K" docs --trace canonical:steps=600 --check "$D/doc3.md" >"$D/out" 2>"$D/err"
check "docs --check catches a changed mass" [ $? -eq 1 ]
"$K" docs --trace canonical:steps=600 --check --skip sweep "$D/doc3.md" >"$D/out" 2>"$D/err"
check "docs --check --skip leaves that block unchecked" [ $? -eq 0 ]
check "docs --check --skip counts what it left" grep -q "1 block left unchecked" "$D/err"
"$K" docs --skip sweep "$D/doc3.md" >"$D/out" 2>"$D/err"
check "docs --skip without --check is refused" [ $? -eq 2 ]
check "docs --skip's refusal names it" grep -q -- "--skip: only with --check" "$D/err"
# Blocks that name their trace: version 1 beside the default, seeds, stats.
cat >"$D/doc4.md" <<'DOC'
<!-- kvevict:begin sweep h2o:budget=64 recent_window=16 -->
<!-- kvevict:end sweep -->
<!-- kvevict:begin sweep h2o:budget=64 recent_window=16 trace=canonical:version=1,steps=600 -->
<!-- kvevict:end sweep -->
<!-- kvevict:begin seeds n=2 trace=canonical:steps=600 -->
<!-- kvevict:end seeds -->
<!-- kvevict:begin trace-stats block=100 trace=canonical:version=1,steps=600 -->
<!-- kvevict:end trace-stats -->
DOC
"$K" docs --trace canonical:steps=600 "$D/doc4.md" >"$D/out" 2>"$D/err"
check "docs with trace= blocks regenerates ($(cat "$D/err"))" [ $? -eq 0 ]
"$K" docs --trace canonical:steps=600 --check "$D/doc4.md" >"$D/out" 2>"$D/err"
check "docs with trace= blocks: --check passes after" [ $? -eq 0 ]
n=$(grep -c '^|  *16 |' "$D/doc4.md")
check "docs: both sweeps written" [ "$n" -eq 2 ]
check "docs: the two traces differ" [ "$(grep '^|  *16 |' "$D/doc4.md" | sort -u | wc -l)" -eq 2 ]
m1=$(grep '^|  *16 |' "$D/doc4.md" | sed -n 2p | awk -F'|' '{print $4 $5}')
m2=$("$K" sweep --trace canonical:version=1,steps=600 --policy h2o:budget=64 --param recent_window=16 --md | grep '^|  *16 |' | awk -F'|' '{print $4 $5}')
check "docs: the version 1 block is what sweep prints on version 1 ($m1, $m2)" [ -n "$m1" ] && [ "$m1" = "$m2" ]
check "docs: a seeds block" grep -q '^Trace `canonical:version=3,seed=1,steps=600,.*` with seeds 1 to 2' "$D/doc4.md"
check "docs: a trace-stats block" grep -qE '^\| +0 \| +0\.[0-9]+ \|' "$D/doc4.md"
printf '<!-- kvevict:begin summary trace=canonical trace=canonical -->\n<!-- kvevict:end summary -->\n' >"$D/twice.md"
expect_err 1 docs --check "$D/twice.md"
printf '<!-- kvevict:begin seeds -->\n<!-- kvevict:end seeds -->\n' >"$D/noseeds.md"
expect_err 2 docs --check "$D/noseeds.md"
printf '<!-- kvevict:begin trace-stats rows=3 -->\n<!-- kvevict:end trace-stats -->\n' >"$D/badstats.md"
expect_err 2 docs --check "$D/badstats.md"
printf '<!-- kvevict:begin nosuch -->\n<!-- kvevict:end nosuch -->\n' >"$D/bad.md"
expect_err 2 docs --check "$D/bad.md"
printf '<!-- kvevict:begin summary -->\n' >"$D/open.md"
expect_err 1 docs --check "$D/open.md"

# ---- docs: tables rendered from a JSON Lines data file ----------------------------
cat >"$D/data.jsonl" <<'DATA'
{"policy": "full", "budget": null, "distance": 64, "accuracy": 1, "x": 0.123456}
{"policy": "full", "budget": null, "distance": 128, "accuracy": 1, "x": 2.5e-1}
{"policy": "h2o:budget=8,recent_window=2", "budget": 8, "distance": 64, "accuracy": 0.25, "x": -1}
{"policy": "h2o:budget=8,recent_window=2", "budget": 8, "distance": 128, "accuracy": 0, "x": 3}
{"policy": "window:budget=16", "budget": 16, "distance": 64, "accuracy": 0.5, "x": 1.5}
DATA
cat >"$D/tab.md" <<DOC
<!-- kvevict:begin table $D/data.jsonl where=policy!full show=policy:code,budget,x:+2 -->
<!-- kvevict:end table -->
<!-- kvevict:begin table $D/data.jsonl rows=spec cols=distance value=accuracy:3 -->
<!-- kvevict:end table -->
DOC
"$K" docs "$D/tab.md" >"$D/out" 2>"$D/err"
check "docs table blocks regenerate ($(cat "$D/err"))" [ $? -eq 0 ]
check "docs table: the filtered rows, formatted" grep -qE '^\| `h2o:budget=8,recent_window=2` +\| +8 \| +-1\.00 \|$' "$D/tab.md"
check "docs table: no filtered-out row" sh -c "! grep -q '^| .full' '$D/tab.md'"
check "docs table: a pivot, its columns the distances" grep -qE '^\| policy +\| distance 64 \| distance 128 \|$' "$D/tab.md"
check "docs table: the budget taken out of the spec" grep -qE '^\| h2o:recent_window=2 +\| +0\.250 \| +0\.000 \|$' "$D/tab.md"
check "docs table: a missing pivot cell is empty" grep -qE '^\| window +\| +0\.500 \| +\|$' "$D/tab.md"
"$K" docs --check "$D/tab.md" >"$D/out" 2>"$D/err"
check "docs table: --check passes after regenerating" [ $? -eq 0 ]
sed 's/"accuracy": 0.25/"accuracy": 0.26/' "$D/data.jsonl" >"$D/data2.jsonl" && mv "$D/data2.jsonl" "$D/data.jsonl"
"$K" docs --check "$D/tab.md" >"$D/out" 2>"$D/err"
check "docs table: --check catches a changed data file" [ $? -eq 1 ]
printf '{"policy": "a", "x": 1}\n{"policy": "b", "x": }\n' >"$D/bad.jsonl"
printf '<!-- kvevict:begin table %s show=x -->\n<!-- kvevict:end table -->\n' "$D/bad.jsonl" >"$D/tab2.md"
expect_err 1 docs --check "$D/tab2.md"
check "docs table: a malformed line is named" grep -q 'bad.jsonl:2: expected a value at column 22' "$D/err"
printf '<!-- kvevict:begin table %s show=x:7x -->\n<!-- kvevict:end table -->\n' "$D/data.jsonl" >"$D/tab3.md"
expect_err 2 docs --check "$D/tab3.md"
printf '<!-- kvevict:begin table %s rows=spec -->\n<!-- kvevict:end table -->\n' "$D/data.jsonl" >"$D/tab4.md"
expect_err 2 docs --check "$D/tab4.md"
printf '<!-- kvevict:begin table %s show=x trace=canonical -->\n<!-- kvevict:end table -->\n' "$D/data.jsonl" >"$D/tab5.md"
expect_err 2 docs --check "$D/tab5.md"
printf '<!-- kvevict:begin table %s/none.jsonl show=x -->\n<!-- kvevict:end table -->\n' "$D" >"$D/tab6.md"
expect_err 1 docs --check "$D/tab6.md"

# ---- docs: every malformed block or page is refused in one line ----------------
refuse() { # CODE NAME BLOCK-LINE [MORE LINES]: a page with that block, refused
    code=$1; name=$2; shift 2
    printf '%s\n' "$@" >"$D/r-$name.md"
    expect_err "$code" docs --check "$D/r-$name.md"
}
E='<!-- kvevict:end table -->'
refuse 2 t-nofile '<!-- kvevict:begin table -->' "$E"
refuse 2 t-where9 "<!-- kvevict:begin table $D/data.jsonl where=a:1 where=a:1 where=a:1 where=a:1 where=a:1 where=a:1 where=a:1 where=a:1 where=a:1 show=x -->" "$E"
refuse 2 t-badwhere "<!-- kvevict:begin table $D/data.jsonl where=nocolon show=x -->" "$E"
for w in ':x' 'a:' 'a!=b'; do
    refuse 2 t-where "<!-- kvevict:begin table $D/data.jsonl where=$w show=x -->" "$E"
done
refuse 2 t-plusfmt "<!-- kvevict:begin table $D/data.jsonl show=x:+z -->" "$E"
refuse 2 t-twocols "<!-- kvevict:begin table $D/data.jsonl rows=spec cols=distance cols=x value=accuracy -->" "$E"
refuse 2 t-twovalues "<!-- kvevict:begin table $D/data.jsonl rows=spec cols=distance value=x value=accuracy -->" "$E"
refuse 2 t-pivotshow "<!-- kvevict:begin table $D/data.jsonl rows=spec cols=distance value=accuracy show=x -->" "$E"
refuse 2 t-nokey "<!-- kvevict:begin table $D/data.jsonl show=:2 -->" "$E"
refuse 2 t-badfmt "<!-- kvevict:begin table $D/data.jsonl show=x:zz -->" "$E"
refuse 2 t-nohead "<!-- kvevict:begin table $D/data.jsonl show=x:2: -->" "$E"
refuse 2 t-colsfmt "<!-- kvevict:begin table $D/data.jsonl rows=spec cols=distance:2 value=accuracy -->" "$E"
refuse 2 t-valhead "<!-- kvevict:begin table $D/data.jsonl rows=spec cols=distance value=accuracy:2:H -->" "$E"
refuse 2 t-unknown "<!-- kvevict:begin table $D/data.jsonl nosuch=1 -->" "$E"
refuse 2 t-halfpivot "<!-- kvevict:begin table $D/data.jsonl rows=spec cols=distance -->" "$E"
refuse 2 t-nothing "<!-- kvevict:begin table $D/data.jsonl where=policy:full -->" "$E"
refuse 2 t-trace "<!-- kvevict:begin table $D/data.jsonl show=x trace=canonical -->" "$E"
refuse 1 t-nomatch "<!-- kvevict:begin table $D/data.jsonl where=policy:none show=x -->" "$E"
refuse 1 t-notnum "<!-- kvevict:begin table $D/data.jsonl show=policy:2 -->" "$E"
refuse 1 t-missing "<!-- kvevict:begin table $D/nosuch.jsonl show=x -->" "$E"
: >"$D/empty.jsonl"
refuse 1 t-empty "<!-- kvevict:begin table $D/empty.jsonl show=x -->" "$E"
printf '{"a": 1}\n{"a": 1,}\n' >"$D/bad.jsonl"
refuse 1 t-badline "<!-- kvevict:begin table $D/bad.jsonl show=a -->" "$E"
refuse 2 b-args '<!-- kvevict:begin summary x=1 -->' '<!-- kvevict:end summary -->'
refuse 2 b-bench '<!-- kvevict:begin bench -->' '<!-- kvevict:end bench -->'
refuse 2 b-bench2 '<!-- kvevict:begin bench budget=8 x=1 -->' '<!-- kvevict:end bench -->'
refuse 2 b-seeds2 '<!-- kvevict:begin seeds n=2 x=1 -->' '<!-- kvevict:end seeds -->'
refuse 2 b-seedsnn '<!-- kvevict:begin seeds nn=2 -->' '<!-- kvevict:end seeds -->'
refuse 1 b-strayend 'text' '<!-- kvevict:end summary -->'
refuse 2 b-sweep '<!-- kvevict:begin sweep -->' '<!-- kvevict:end sweep -->'
refuse 1 b-emptytrace '<!-- kvevict:begin summary trace= -->' '<!-- kvevict:end summary -->'
refuse 1 b-manyargs '<!-- kvevict:begin sweep a b c d e f g h i j k l m n o p q -->' '<!-- kvevict:end sweep -->'
refuse 1 b-badend '<!-- kvevict:begin summary -->' '<!-- kvevict:end bench -->'
refuse 1 b-nested '<!-- kvevict:begin summary -->' '<!-- kvevict:begin bench budget=8 -->'
refuse 1 b-noname '<!-- kvevict:begin  -->' '<!-- kvevict:end  -->'
# a marker with trailing blanks or CR is one; a line that only begins like one is text
printf '<!-- kvevict:begin table %s show=policy -->  \r\n<!-- kvevict:end table -->\n<!-- kvevict:begin x\n' \
    "$D/data.jsonl" >"$D/cr.md"
"$K" docs "$D/cr.md" >"$D/out" 2>"$D/err"
check "docs: a marker with trailing blanks and CR ($(cat "$D/err"))" grep -q '^| full ' "$D/cr.md"
printf '{"policy": "full"}\n{"policy": "h2o"}' >"$D/nonl.jsonl"
printf '<!-- kvevict:begin table %s show=policy -->\n<!-- kvevict:end table -->\n' "$D/nonl.jsonl" >"$D/nonl.md"
"$K" docs "$D/nonl.md" >"$D/out" 2>"$D/err"
check "docs: a data file's last line without a newline ($(cat "$D/err"))" grep -q '^| h2o ' "$D/nonl.md"
printf 'a\000b\n' >"$D/nul.md"
expect_err 1 docs --check "$D/nul.md"
expect_err 1 docs --check "$D/nosuch.md"

# ---- machine-readable output, parsed ---------------------------------------
# The keys every result row carries (docs/cli.md).
ROW="--key policy:string --key trace:string --key budget:integer --key steps:integer
 --key scored_steps:integer --key heads:integer --key layers:integer --key seed:integer
 --key retained_mass:number --key min_retained_mass:number --key ns_per_step:number
 --key state_bytes:integer"
NPOL=$(tail -n +2 "$D/policies" | wc -l)
NATT=$(tail -n +2 "$D/policies" | grep -cv ' keys ') # the policies an attention trace runs
# shellcheck disable=SC2086
"$K" eval --trace "$C" --policy h2o --budget 256 --json >"$D/j" 2>"$D/err"
check "eval --json parses ($(cat "$D/err"))" "$J" json $ROW --key top32_recall:number --no-key topk "$D/j"
"$K" eval --trace "$C" --policy h2o --budget 256 --format json -o "$D/j2" >"$D/out"
check "eval -o FILE writes the file, not stdout" [ ! -s "$D/out" ]
strip "$D/j2" >"$D/s2"
check "eval -o FILE holds what stdout would" cmp -s "$D/s1" "$D/s2"
"$K" eval --trace "$C" --policy h2o --budget 256 --json -o - >"$D/j3"
check "eval -o - is standard output" "$J" json $ROW "$D/j3"
"$K" eval --trace "$C" --policy h2o --budget 256 --csv >"$D/c"
check "eval --csv parses: a header and one row" "$J" csv --count 1 --key policy:string --key retained_mass:number --key top32_recall:number --key state_bytes:integer "$D/c"
"$K" eval --trace "$C" --policy h2o --budget 256 --md >"$D/m"
check "eval --md is a markdown table" grep -q '^| `h2o:budget=256,recent_window=32` ' "$D/m"
"$K" eval --trace "$D/heads.npy" --policy window:budget=1 --per-head --json >"$D/j"
check "eval --per-head --json parses" "$J" json $ROW --key per_head:array --value heads=2 "$D/j"
"$K" eval --trace "$D/heads.npy" --policy window:budget=1 --per-head --csv >"$D/c"
check "eval --per-head --csv: the whole and each head" "$J" csv --count 3 --key layer:string --key head:string "$D/c"
"$K" eval --trace "$C" --policy h2o --budget 256 --topk 16 --json >"$D/j"
check "eval --topk 16: topk_recall and topk beside top32_recall" "$J" json $ROW --key topk_recall:number --value topk=16 --key top32_recall:number --no-key top16_recall "$D/j"
"$K" eval --trace "$C" --policy h2o --budget 256 --top-k 16 --json >"$D/j2"
sed 's/"ns_per_step": [^,]*, //' "$D/j" >"$D/j1u"
sed 's/"ns_per_step": [^,]*, //' "$D/j2" >"$D/j2u"
check "eval --top-k 16 is --topk 16 (one option, however hyphenated)" cmp -s "$D/j1u" "$D/j2u"
check "... and the timing was what differed" grep -q '"topk": 16' "$D/j2u"
"$K" eval --trace "$C" --policy h2o --budget 256 --json >"$D/j32"
t32=$(sed 's/.*"top32_recall": \([^,]*\),.*/\1/' "$D/j32")
check "eval --topk 16: top32_recall is still the recall at 32 ($t32)" grep -q "\"top32_recall\": $t32," "$D/j"
"$K" eval --trace "$C" --policy h2o --budget 256 --topk 16 --csv >"$D/c"
check "eval --topk 16 --csv: the same keys" sh -c "head -1 '$D/c' | grep -q 'top32_recall,topk_recall'"
"$K" eval --trace "$C" --policy h2o --budget 256 --topk 16 >"$D/out"
check "eval --topk 16 text says top-16" grep -q '^top-16 recall ' "$D/out"
# ---- budgets as percentages of the trace's steps, as every command writes them
no_ns() { sed -E 's/"ns_per_step": [^,]*,//' "$1"; }
"$K" eval --trace "$C" --policy h2o --budget 40% --json >"$D/pct" 2>"$D/err"
"$K" eval --trace "$C" --policy h2o --budget 280 --json >"$D/cnt"
check "eval --budget 40% of 700 steps is budget 280" [ "$(no_ns "$D/pct")" = "$(no_ns "$D/cnt")" ]
check "eval --budget 40%: nothing on stderr" [ ! -s "$D/err" ]
expect_says 2 "--budget: 0.1% of the trace's steps (700) is no position" eval --trace "$C" --policy h2o --budget 0.1%
expect_says 2 "--budget: '101%' is not a percentage in (0, 100]" eval --trace "$C" --policy h2o --budget 101%
"$K" eval --trace "$C" --policy h2o --budget 100% --json >"$D/j" 2>"$D/err"
check "eval --budget 100%: the unscored warning of any budget >= T - 1" grep -q 'no step is scored at budget 700' "$D/err"
"$K" sweep --trace "$C" --policy h2o --budget 10%,40% --json >"$D/pct"
"$K" sweep --trace "$C" --policy h2o --budget 70,280 --json >"$D/cnt"
check "sweep --budget 10%,40% is 70,280" [ "$(no_ns "$D/pct")" = "$(no_ns "$D/cnt")" ]
"$K" bench --trace "$C" --budget 40% --json >"$D/pct"
"$K" bench --trace "$C" --budget 280 --json >"$D/cnt"
check "bench --budget 40% is 280" [ "$(no_ns "$D/pct")" = "$(no_ns "$D/cnt")" ]
"$K" replay --trace "$C" --policy h2o --budget 40% >"$D/pct"
"$K" replay --trace "$C" --policy h2o --budget 280 >"$D/cnt"
check "replay --budget 40% is 280" cmp -s "$D/pct" "$D/cnt"
expect_says 2 "perf times policies of a given size" perf --quick --budget 10%
for c in "eval --trace $C --policy h2o" "replay --trace $C --policy h2o" "sweep --trace $C --policy h2o" \
         "bench --trace $C" "trace --trace $C --stats" "lm eval --help" "lm dump --help" "docs --help" "plot --help"; do
    # shellcheck disable=SC2086
    "$K" $c --quiet >/dev/null 2>"$D/err"
    check "$c takes --quiet" [ $? -eq 0 ] && [ ! -s "$D/err" ]
done
"$K" replay --trace canonical:steps=300 --policy h2o:budget=64 >"$D/j"
check "replay JSON Lines parse" "$J" jsonl --count 300 --key pos:integer --key victims:array --key size:integer "$D/j"
"$K" replay --trace canonical:steps=300 --policy h2o:budget=64 --csv >"$D/c"
check "replay --csv parses" "$J" csv --count 300 --key pos:integer --key size:integer "$D/c"
"$K" sweep $S --param recent_window=16,32,64 --budget 128,256 --json >"$D/j"
check "sweep --json parses" "$J" jsonl --count 6 $ROW --key params:object --key top32_recall:number "$D/j"
"$K" sweep $S --param recent_window=16,32,64 --budget 128,256 --format csv >"$D/c"
check "sweep --csv parses" "$J" csv --count 6 --key recent_window:integer --key budget:integer --key policy:string --key top32_recall:number "$D/c"
"$K" sweep $S --param recent_window=16,32 --md >"$D/m"
check "sweep --md is a markdown table" [ "$(grep -c '^| ' "$D/m")" -eq 4 ]
"$K" bench --trace canonical:steps=1200 --json >"$D/j" 2>"$D/err"
check "bench --json: every policy at both budgets" "$J" jsonl --count $((NATT * 2)) $ROW --key top32_recall:number "$D/j"
check "bench --json is quiet on stderr" [ ! -s "$D/err" ]
"$K" bench --trace canonical:steps=1200 --csv >"$D/c"
check "bench --csv parses" "$J" csv --count $((NATT * 2)) --key policy:string --key budget:integer --key retained_mass:number "$D/c"
"$K" policies --json >"$D/j"
check "policies --json parses" "$J" jsonl --count "$NPOL" --key name:string --key policy:string --key reads:string --key summary:string "$D/j"
"$K" policies --csv >"$D/c"
check "policies --csv parses" "$J" csv --count "$NPOL" --key name:string "$D/c"
"$K" --version >"$D/out"
check "--version names the version" grep -qE '^kvevict [0-9]+\.[0-9]+\.[0-9]+$' "$D/out"

# ---- bench on the user's trace and budgets --------------------------------------
"$K" bench --trace "$D/t.npy" --budget 100,200,300 --json >"$D/j" 2>"$D/err"
check "bench --trace FILE --budget: every policy at each budget" "$J" jsonl --count $((NATT * 3)) $ROW "$D/j"
check "bench --budget 300 row" grep -q '"policy": "h2o:budget=300,recent_window=32"' "$D/j"
"$K" bench --trace "$D/t.npy" --budget 100,200 >"$D/out" 2>"$D/err"
check "bench text has the user's budgets" grep -q '^Budget 200$' "$D/out"
check "bench does not judge the page on a file" grep -q '^Not judged: the page.s claims are about the canonical trace' "$D/out"
check "bench judges nothing on a file" sh -c "! grep -qE '^\([1-6]\) ' '$D/out'"

# ---- no scored step: null, n/a, a warning, nothing judged ----------------------
Z=canonical:steps=250
"$K" eval --trace "$Z" --policy h2o --json >"$D/j" 2>"$D/err"
check "eval with no scored step exits 0" [ $? -eq 0 ]
check "eval with no scored step: null metrics" "$J" json --value scored_steps=0 --value retained_mass=null --value top32_recall=null --value min_retained_mass=null --key ns_per_step:number "$D/j"
check "eval with no scored step warns once" [ "$(grep -c 'warning: no step is scored at budget 512' "$D/err")" -eq 1 ]
"$K" eval --trace "$Z" --policy h2o >"$D/out" 2>/dev/null
check "eval text shows n/a" grep -q '^retained mass *n/a$' "$D/out"
"$K" eval --trace "$Z" --policy h2o --csv >"$D/c" 2>/dev/null
check "eval csv shows n/a" "$J" csv --count 1 --value retained_mass=n/a --key state_bytes:integer "$D/c"
"$K" bench --trace "$Z" >"$D/out" 2>"$D/err"
check "bench with no scored step exits 0" [ $? -eq 0 ]
check "bench warns for budget 256" grep -q 'warning: no step is scored at budget 256' "$D/err"
check "bench warns for budget 512" grep -q 'warning: no step is scored at budget 512' "$D/err"
n=$(grep -cE '^\([1-6]\) not judged: ' "$D/out")
check "bench judges no claim on no data (got $n of 6 not judged)" [ "$n" -eq 6 ]
check "bench prints no 1.0000 on no data" sh -c "! grep -q '1\.0000' '$D/out'"
"$K" bench --trace canonical:steps=400 >"$D/out" 2>/dev/null
check "bench judges the budget-256 claims, not the 512 ones" [ "$(grep -cE '^\([1-6]\) not judged: ' "$D/out")" -eq 2 ]

# ---- standard input and output --------------------------------------------------
"$K" eval --trace - --policy h2o --budget 256 --json <"$D/t.npy" >"$D/j" 2>"$D/err"
check "eval --trace - reads a .npy from stdin ($(cat "$D/err"))" "$J" json --value trace='"-"' "$D/j"
for key in retained_mass top32_recall scored_steps; do
    check "stdin evaluates to the same $key" [ "$(field $key "$D/j")" = "$(field $key "$D/e3")" ]
done
"$K" trace --trace "$C" -o - | "$K" eval --trace - --policy h2o --budget 256 --json >"$D/j"
check "trace -o - | eval --trace -" [ "$(field retained_mass "$D/j")" = "$(field retained_mass "$D/e3")" ]
"$K" trace --trace "$C" -o - >"$D/t3.npy"
check "trace -o - writes the same bytes" cmp -s "$D/t.npy" "$D/t3.npy"
printf 'junk' | "$K" eval --trace - --policy h2o >"$D/out" 2>"$D/err"
check "a bad .npy on stdin is bad input, named -" sh -c "[ $? -eq 1 ] && grep -q '^kvevict eval: --trace -: ' '$D/err'"
expect_err 1 eval --trace "$C" --policy h2o -o "$D/nodir/x.json"
check "-o into a missing directory leaves nothing" [ ! -e "$D/nodir" ]
expect_err 2 eval --trace "$C" --policy h2o --format yaml
expect_err 2 eval --trace "$C" --policy h2o --json --csv
expect_err 2 eval --trace "$C" --policy h2o --format csv --md
expect_err 2 eval --trace "$C" --policy h2o --topk 0
expect_err 2 bench --budget 0
expect_err 2 bench --budget 256,,512
expect_err 1 eval --trace "$D/bad.npy" --policy h2o -o "$D/never.json"
check "a failed eval -o leaves no file" [ ! -e "$D/never.json" ]
check "a failed eval -o leaves no temporary file" sh -c "! ls '$D' | grep -q 'never.json'"
# ---- an interrupted trace -o leaves no file ------------------------------------
# A 1.6 GB trace, interrupted as soon as its temporary file exists: the
# signal handler removes it, and the final name never appears. A background
# job of a script ignores SIGINT unless it is reset (env --default-signal).
mkdir "$D/int"
interrupt() { # interrupt SIGNAL EXPECTED_STATUS
    sig=$1
    if [ "$sig" = INT ]; then
        env --default-signal=INT "$K" trace --trace canonical:steps=20000 -o "$D/int/big.npy" 2>"$D/int.err" &
    else
        "$K" trace --trace canonical:steps=20000 -o "$D/int/big.npy" 2>"$D/int.err" &
    fi
    pid=$!
    i=0
    while [ $i -lt 500 ] && ! ls "$D/int" | grep -q 'big\.npy\.tmp\.'; do sleep 0.02; i=$((i + 1)); done
    check "trace -o made its temporary file (SIG$sig)" ls "$D/int" | grep -q 'big\.npy\.tmp\.'
    kill -"$sig" "$pid"
    wait "$pid"
    rc=$?
    check "trace died of SIG$sig (status $rc, want $2)" [ "$rc" -eq "$2" ]
    check "SIG$sig: no file and no temporary file left ($(ls "$D/int"))" [ -z "$(ls "$D/int")" ]
    check "trace -o announced the size first" grep -q "^kvevict trace: writing $D/int/big.npy: 1600000128 bytes (1.5 GiB)$" "$D/int.err"
}
interrupt TERM 143
if env --default-signal=INT true 2>/dev/null; then
    interrupt INT 130
else
    echo "test_cli: env --default-signal is not available; SIGINT case skipped"
fi

# ---- -o to a FIFO (or a device such as /dev/null): written in place ----------
# A rename of a finished file over it would replace it with a regular file.
mkfifo "$D/fifo"
timeout 30 cat "$D/fifo" >"$D/fifo.out" &  # a reader, which never hangs the test
"$K" policies --csv -o "$D/fifo"
wait
check "-o FIFO: still a FIFO afterwards" [ -p "$D/fifo" ]
check "-o FIFO: the output went through it" grep -q '^name,policy,reads,summary$' "$D/fifo.out"

echo "test_cli: $checks checks passed, $fails failed"
[ "$fails" -eq 0 ]
