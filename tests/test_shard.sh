#!/bin/sh
# SPDX-License-Identifier: MIT
# test_shard.sh KVEVICT OUTCHECK - sweeps split across processes: `sweep
# --shard I/N` and `bench --shard I/N` write JSON Lines (parsed by outcheck)
# whose jobs partition the grid exactly once (for several N), each line
# carrying its whole job; `kvevict merge` gives what the unsharded run
# prints: the same JSON and CSV but for ns_per_step (the one timing), and,
# with the shards' timings set to 0, the same bytes in every format from 1
# shard as from 3 (or 5, given in any order, or concatenated on stdin).
# Also: multi-head traces, --topk, --seed with the random policy, a shard run
# twice, and every refusal: a missing shard, a shard cut short, a shard or
# file given twice, lines of another run or of another shard count, a job in
# the wrong shard, a tampered job, non-JSON, no lines; bad --shard values,
# --shard with another format or with bench --seeds, more shards than jobs.
# Errors are one line on stderr, nothing on stdout, exit 1 (input) or 2
# (usage). POSIX sh; a few seconds natively.
set -u
K=${1:?usage: test_shard.sh PATH/TO/kvevict PATH/TO/outcheck}
J=${2:?usage: test_shard.sh PATH/TO/kvevict PATH/TO/outcheck}
. "$(dirname "$0")/check.sh"
scratch kvevict-shard

# The one timing, set to 0: in JSON Lines (rows or shard lines) and in CSV
# (the column found by its header; fields split as RFC 4180 quotes them).
json_no_ns() { sed -E 's/"ns_per_step": [^,}]*/"ns_per_step": 0/' "$1"; }
csv_no_ns() {
    awk 'function fields(line, f,   n, i, c, q, cur) {
             n = 0; cur = ""; q = 0
             for (i = 1; i <= length(line); i++) {
                 c = substr(line, i, 1)
                 if (q && c == "\"" && substr(line, i + 1, 1) == "\"") { cur = cur c c; i++ }
                 else if (c == "\"") { q = !q; cur = cur c }
                 else if (c == "," && !q) { f[++n] = cur; cur = "" }
                 else cur = cur c
             }
             f[++n] = cur
             return n
         }
         { n = fields($0, f)
           if (NR == 1) for (i = 1; i <= n; i++) if (f[i] == "ns_per_step") col = i
           out = ""
           for (i = 1; i <= n; i++) out = out (i > 1 ? "," : "") (i == col && NR > 1 ? "0" : f[i])
           print out }' "$1"
}

# same_json DESC A B, same_csv DESC A B: equal but for ns_per_step.
same_json() {
    json_no_ns "$2" >"$D/x"
    json_no_ns "$3" >"$D/y"
    check "$1" cmp -s "$D/x" "$D/y"
}
same_csv() {
    csv_no_ns "$2" >"$D/x"
    csv_no_ns "$3" >"$D/y"
    check "$1" cmp -s "$D/x" "$D/y"
}
# covers DESC FILE N: the "job" values of FILE's lines are 0 .. N-1, once each.
covers() {
    sed -E 's/.*"job": ([0-9]+),.*/\1/' "$2" | sort -n >"$D/x"
    seq 0 $(($3 - 1)) >"$D/y"
    check "$1" cmp -s "$D/x" "$D/y"
}

# ---- sweep: partition, lines, merge ----------------------------------------
S="--trace canonical:steps=500 --policy h2o:budget=64"
G="--param recent_window=4,8,16,32 --budget 48,64,96"
JOBS=12
"$K" sweep $S $G --json >"$D/full.json" 2>"$D/err"
check "unsharded sweep runs" [ $? -eq 0 ]
"$K" sweep $S $G --csv >"$D/full.csv"
for n in 1 2 3 5 12; do
    i=0
    : >"$D/all.$n"
    while [ $i -lt $n ]; do
        "$K" sweep $S $G --shard $i/$n -o "$D/s$i.$n" 2>"$D/err"
        check "sweep --shard $i/$n runs" [ $? -eq 0 ]
        check "sweep --shard $i/$n is quiet on stderr" [ ! -s "$D/err" ]
        check "sweep --shard $i/$n: valid JSON Lines with the job's keys" "$J" jsonl \
            --key shard:string --value "shard=\"$i/$n\"" --key job:integer --value "jobs=$JOBS" \
            --key run:object --key policy:string --key params:object --key topk:integer \
            --key retained_mass:number --key top32_recall:number --key ns_per_step:number \
            --key state_bytes:integer "$D/s$i.$n"
        # every job of the shard is congruent to its index
        bad=$(sed -E 's/.*"job": ([0-9]+),.*/\1/' "$D/s$i.$n" | awk -v n=$n -v i=$i '$1 % n != i' | wc -l)
        check "shard $i/$n holds only jobs j with j % $n == $i" [ "$bad" -eq 0 ]
        cat "$D/s$i.$n" >>"$D/all.$n"
        i=$((i + 1))
    done
    covers "$n shards cover the $JOBS jobs exactly once" "$D/all.$n" $JOBS
    "$K" merge --json "$D"/s*."$n" >"$D/merged.json" 2>"$D/err"
    check "merge of $n shards runs" [ $? -eq 0 ]
    same_json "merge of $n shards: the unsharded JSON but for ns_per_step" "$D/full.json" "$D/merged.json"
    "$K" merge --csv "$D"/s*."$n" >"$D/merged.csv"
    same_csv "merge of $n shards: the unsharded CSV but for ns_per_step" "$D/full.csv" "$D/merged.csv"
done
check "the shard lines carry the run" grep -q '"run": {"command": "sweep", "trace": "canonical:steps=500", "policy": "h2o:budget=64", "param": \["recent_window=4,8,16,32"\], "budget": \[48, 64, 96\], "seed": 0, "topk": null, "normalize": false}' "$D/s0.3"
json_no_ns "$D/s0.1" | sed -E 's/, "topk": 32//; s/, "shard": .*$/}/' >"$D/rows"
json_no_ns "$D/full.json" >"$D/a"
check "a shard line is the unsharded row plus the shard's keys" cmp -s "$D/a" "$D/rows"

# With the timings set to 0 in the shard files, merge prints the same bytes
# from 1 shard as from 3, in every format; also shards in another order, and
# lines concatenated on standard input.
for n in 1 3 5; do
    for f in "$D"/s*."$n"; do json_no_ns "$f" >"$f.z"; done
done
for fmt in text md csv json; do
    "$K" merge --format $fmt "$D"/s0.1.z >"$D/one.$fmt"
    "$K" merge --format $fmt "$D"/s2.3.z "$D"/s0.3.z "$D"/s1.3.z >"$D/three.$fmt"
    check "merge --format $fmt: 3 shards (any order) give what 1 shard gives" cmp -s "$D/one.$fmt" "$D/three.$fmt"
    cat "$D"/s*.5.z | "$K" merge --format $fmt - >"$D/five.$fmt"
    check "merge --format $fmt: 5 shards on stdin give what 1 shard gives" cmp -s "$D/one.$fmt" "$D/five.$fmt"
done
check "merge text is the sweep's table" grep -q '^recent_window  budget  retained mass' "$D/one.text"
check "merge md is a markdown table" grep -q '^| recent_window | budget |' "$D/one.md"
check "merged CSV parses with 12 rows" "$J" csv --count 12 "$D/one.csv"
check "merged JSON parses with 12 rows" "$J" jsonl --count 12 --key params:object --no-key shard "$D/one.json"
"$K" merge --csv -o "$D/out.csv" "$D"/s*.3.z
check "merge -o writes the file" cmp -s "$D/out.csv" "$D/one.csv"

# A shard run twice gives the same lines but for the timing.
"$K" sweep $S $G --shard 1/3 >"$D/again"
same_json "a shard is deterministic" "$D/again" "$D/s1.3"

# ---- --topk, --seed (random draws), a multi-head .npy trace -----------------
R="--trace canonical:steps=400,seed=7 --policy random:budget=64 --param recent_window=2,8,16 --budget 64,100 --seed 11 --topk 8"
"$K" sweep $R --json >"$D/r.json"
"$K" sweep $R --shard 0/2 >"$D/r0"
"$K" sweep $R --shard 1/2 >"$D/r1"
"$K" merge --json "$D/r1" "$D/r0" >"$D/rm.json"
same_json "random policy, --seed 11, --topk 8: merged equals unsharded" "$D/r.json" "$D/rm.json"
check "--topk 8: topk_recall and topk beside top32_recall in the merged rows" "$J" jsonl --key topk_recall:number --value topk=8 --key top32_recall:number --no-key top8_recall "$D/rm.json"
check "--topk 8: shard lines carry topk_recall and top32_recall" "$J" jsonl --key topk_recall:number --key top32_recall:number "$D/r0"
"$K" trace --trace canonical:steps=300,seed=3 -o "$D/h0.npy"
"$K" trace --trace canonical:steps=300,seed=4 -o "$D/h1.npy"
# a [2, T, T] file from two [T, T] files: the first's 128-byte header with
# the shape widened into three of its padding blanks, then both payloads
{ head -c 128 "$D/h0.npy" | sed 's/(300, 300), }   /(2, 300, 300), }/'; tail -c +129 "$D/h0.npy"
  tail -c +129 "$D/h1.npy"; } >"$D/two.npy"
M="--trace $D/two.npy --policy tova:budget=32 --param recent_window=0,4 --budget 32,64"
"$K" sweep $M --json >"$D/m.json" 2>"$D/err"
check "a two-head trace sweeps" [ $? -eq 0 ]
check "the two-head trace has 2 heads" "$J" jsonl --value heads=2 "$D/m.json"
"$K" sweep $M --shard 0/3 >"$D/m0"; "$K" sweep $M --shard 1/3 >"$D/m1"; "$K" sweep $M --shard 2/3 >"$D/m2"
"$K" merge --json "$D/m0" "$D/m1" "$D/m2" >"$D/mm.json"
same_json "two heads: means over heads merged equal unsharded" "$D/m.json" "$D/mm.json"

# ---- bench: the report's grid -----------------------------------------------
B="--trace canonical:steps=600"
"$K" bench $B --json >"$D/bench.json"
"$K" bench $B --csv >"$D/bench.csv"
"$K" bench $B --shard 0/1 >"$D/b1"
bjobs=$(wc -l <"$D/b1")
check "bench's grid: more jobs than its policy tables (the sweep and claims' specs)" [ "$bjobs" -gt "$(wc -l <"$D/bench.json")" ]
i=0
: >"$D/ball"
while [ $i -lt 4 ]; do
    "$K" bench $B --shard $i/4 >"$D/b$i.4"
    check "bench --shard $i/4: valid shard lines" "$J" jsonl --key shard:string --value "jobs=$bjobs" --no-key params "$D/b$i.4"
    cat "$D/b$i.4" >>"$D/ball"
    i=$((i + 1))
done
covers "bench: 4 shards cover its $bjobs jobs exactly once" "$D/ball" "$bjobs"
"$K" merge --json "$D"/b?.4 >"$D/bm.json"
same_json "bench: merged JSON equals unsharded but for ns_per_step" "$D/bench.json" "$D/bm.json"
"$K" merge --csv "$D"/b?.4 >"$D/bm.csv"
same_csv "bench: merged CSV equals unsharded but for ns_per_step" "$D/bench.csv" "$D/bm.csv"
json_no_ns "$D/b1" >"$D/b1.z"
for f in "$D"/b?.4; do json_no_ns "$f" >"$f.z"; done
for fmt in text md; do
    "$K" merge --format $fmt "$D/b1.z" >"$D/a"
    "$K" merge --format $fmt "$D"/b?.4.z >"$D/b"
    check "bench merge --format $fmt: 4 shards give what 1 gives" cmp -s "$D/a" "$D/b"
done
"$K" merge "$D"/b?.4 >"$D/bm.txt"
n=$(grep -cE '^\([1-6]\) (reproduced|not reproduced|fitted): ' "$D/bm.txt")
check "bench merged text judges the six claims (got $n)" [ "$n" -eq 6 ]
"$K" bench $B >"$D/bench.txt"
grep -E '^\([1-6]\) ' "$D/bench.txt" >"$D/a"
grep -E '^\([1-6]\) ' "$D/bm.txt" >"$D/b"
check "bench: the merged report reaches the unsharded verdicts" cmp -s "$D/a" "$D/b"

# ---- refusals ---------------------------------------------------------------
expect_says 1 "shard 1/3 is missing" merge "$D/s0.3" "$D/s2.3"
expect_says 1 "shards 1/5, 3/5 are missing" merge "$D/s0.5" "$D/s2.5" "$D/s4.5"
expect_says 1 "a shard given twice" merge "$D/s0.3" "$D/s1.3" "$D/s1.3.z" "$D/s2.3"
expect_says 1 "the file is given twice" merge "$D/s0.3" "$D/s1.3" "$D/s1.3" "$D/s2.3"
head -n 1 "$D/s2.3" >"$D/cut"
expect_says 1 "shard 2/3 is incomplete: job 5 is missing" merge "$D/s0.3" "$D/s1.3" "$D/cut"
head -c 100 "$D/s2.3" >"$D/torn"
expect_says 1 "torn:1: not JSON: unterminated string" merge "$D/s0.3" "$D/s1.3" "$D/torn"
expect_says 1 "a line of another run" merge "$D/s0.3" "$D/r1"
expect_says 1 "but " merge "$D/s0.3" "$D/s1.5"
sed 's/"job": 1,/"job": 2,/' "$D/s1.3" >"$D/moved"
expect_says 1 "job 2 is not in shard 1/3" merge "$D/s0.3" "$D/moved" "$D/s2.3"
sed 's/h2o:budget=48,recent_window=8/h2o:budget=48,recent_window=9/' "$D/s1.3" >"$D/tampered"
expect_says 1 "but the run's grid gives" merge "$D/s0.3" "$D/tampered" "$D/s2.3"
sed 's/"jobs": 12/"jobs": 13/' "$D/s0.1" >"$D/bigger"
expect_says 1 "a grid of 13 jobs" merge "$D/bigger"
sed 's/"shard": "0\/1", //' "$D/s0.1" >"$D/noshard"
expect_says 1 "no \"shard\" key" merge "$D/noshard"
expect_says 1 "full.json:1: no \"shard\" key" merge "$D/full.json"
expect_says 1 "not JSON" merge "$D/full.csv"
: >"$D/empty"
expect_says 1 "no shard lines" merge "$D/empty"
expect_says 1 "No such file or directory" merge "$D/absent"
expect_says 2 "no files to merge" merge
expect_says 2 "contradict" merge --csv --json "$D/s0.1"
expect_says 2 "not I/N" sweep $S --shard 1
expect_says 2 "not I/N" sweep $S --shard /3
expect_says 2 "not I/N" sweep $S --shard 1/
expect_says 2 "not a plain decimal" sweep $S --shard a/3
expect_says 2 "out of range" sweep $S --shard 0/0
expect_says 2 "below the count" sweep $S --shard 3/3
expect_says 2 "at most 12 shards" sweep $S $G --shard 0/13
expect_says 2 "give the format to merge" sweep $S --shard 0/2 --csv
expect_says 2 "give the format to merge" bench --shard 0/2 --md
expect_says 2 "--seeds does not shard" bench --seeds 2 --shard 0/2
"$K" merge --json -o "$D/no.json" "$D/s0.3" "$D/s2.3" 2>/dev/null
check "a refused merge leaves no -o file" [ ! -e "$D/no.json" ]
check "a refused merge leaves no temporary file" [ -z "$(ls "$D" | grep 'no.json.tmp')" ]
"$K" merge --help >"$D/out" 2>"$D/err"
check "merge --help" grep -q '^usage: kvevict merge' "$D/out"

echo "test_shard: $checks checks, $fails failures"
[ "$fails" -eq 0 ]
