#!/bin/sh
# SPDX-License-Identifier: MIT
# test_duo.sh KVEVICT SOURCE_DIR [quick] - DuoAttention on the committed model
# (docs/duo.md):
#  - `kvevict lm duo-calibrate`, not told which heads retrieve, must call
#    layer 0's KV head 1 (query heads 2 and 3, which models/README.md names
#    as the pass key's readers) the one retrieval head, every other head a
#    streaming one (a cheap calibration: prompts of 128 tokens, 1 per
#    distance, no loss windows);
#  - its schedule, through --heads, keeps the pass key where a uniform
#    streaming budget at the same memory loses it (budget 102, distance 400:
#    the retrieval head's budget is the whole context);
#  - a malformed schedule is refused, exit 1, naming the line; usage errors
#    exit 2 before anything is decoded.
# About 5,000 decoded positions natively (2.5 s of CPU). `quick` (the
# sanitized builds, which decode the model about 15 times
# slower) keeps the refusals alone: the parser, the per-head budgets and
# their refusals run under the sanitizers in test_lm and fuzz_heads_corpus.
# Skipped (77) in a tree without models/.
set -u
K=${1:?usage: test_duo.sh PATH/TO/kvevict SOURCE_DIR}
SRC=${2:?usage: test_duo.sh PATH/TO/kvevict SOURCE_DIR}
QUICK=${3:-}
case $K in /*) ;; *) K=$(pwd)/$K ;; esac
cd "$SRC" || exit 1
M=models/kjv.bin
T=models/heldout.txt
if [ ! -f "$M" ] || [ ! -f "$T" ]; then
    echo "test_duo: no $M here: skipped"
    exit 77
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/kve-duo.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
fail=0
no() { echo "test_duo: $*"; fail=1; }

if [ "$QUICK" != quick ]; then
"$K" lm duo-calibrate --model "$M" --text "$T" --out "$W/heads.txt" --context 128 \
    --distances 100 --trials 1 --windows 0 --json >"$W/cal.jsonl" 2>"$W/err" ||
    no "duo-calibrate failed: $(cat "$W/err")"
got=$(grep '^head ' "$W/heads.txt" | awk '$4 == "retrieval" { print $2 "," $3 }' | tr '\n' ' ')
[ "$got" = "0,1 " ] || no "retrieval heads '$got', want '0,1 ' (layer 0, KV head 1)"
[ "$(grep -c '^head .* streaming ' "$W/heads.txt")" = 7 ] || no "not 7 streaming heads"
[ "$(wc -l <"$W/cal.jsonl")" = 9 ] || no "calibration rows: $(wc -l <"$W/cal.jsonl"), want 9"
# --retrieval K: the K best by score, ties to the larger loss (prompts of 64)
"$K" lm duo-calibrate --model "$M" --text "$T" --out "$W/two.txt" --retrieval 2 --context 64 \
    --distances 40 --trials 1 --windows 1 >"$W/out" 2>"$W/err" || no "--retrieval 2: $(cat "$W/err")"
got=$(awk '$1 == "head" && $4 == "retrieval" { print $2 "," $3 }' "$W/two.txt" | tr '\n' ' ')
[ "$got" = "0,1 3,0 " ] || no "--retrieval 2: retrieval heads '$got', want '0,1 3,0 '"

"$K" lm passkey --model "$M" --text "$T" --policy streaming --budget 102 --trials 1 \
    --distances 400 --json >"$W/uniform.jsonl" 2>"$W/err" || no "passkey: $(cat "$W/err")"
"$K" lm passkey --model "$M" --text "$T" --policy streaming --budget 102 --trials 1 \
    --distances 400 --heads "$W/heads.txt" --json >"$W/duo.jsonl" 2>"$W/err" ||
    no "passkey --heads: $(cat "$W/err")"
grep -q '"head_budgets": "43,512,43,43,43,43,43,43".*"accuracy": 1[,.]' "$W/duo.jsonl" ||
    no "duo at 102: $(tail -n 1 "$W/duo.jsonl")"
grep -q '"policy": "streaming.*"accuracy": 0[,.]' "$W/uniform.jsonl" ||
    no "uniform streaming at 102: $(tail -n 1 "$W/uniform.jsonl")"
fi

printf 'kvevict-heads 1\nlayers 4 kv_heads 2\nhead 0 0 sink 0\n' >"$W/bad.txt"
"$K" lm eval --model "$M" --text "$T" --policy streaming --heads "$W/bad.txt" >"$W/out" 2>"$W/err"
rc=$?
[ $rc = 1 ] || no "a malformed schedule: exit $rc, want 1"
grep -q "line 3: role 'sink'" "$W/err" || no "a malformed schedule: $(cat "$W/err")"
# usage errors, before any decoding
"$K" lm duo-calibrate --model "$M" --text "$T" --out "$W/x" --retrieval 1 --threshold 0.5 \
    >"$W/out" 2>"$W/err"
[ $? = 2 ] && grep -q -- "--retrieval and --threshold are two rules" "$W/err" ||
    no "--retrieval with --threshold: $(cat "$W/err")"
"$K" lm duo-calibrate --model "$M" --text "$T" --out "$W/x" --window 512 >"$W/out" 2>"$W/err"
[ $? = 2 ] && grep -q -- "--window 512: the context is 512 positions" "$W/err" ||
    no "--window 512: $(cat "$W/err")"
"$K" lm eval --model "$M" --text "$T" --streaming-budget 8 >"$W/out" 2>"$W/err"
[ $? = 2 ] && grep -q -- "--streaming-budget needs --heads" "$W/err" ||
    no "--streaming-budget alone: $(cat "$W/err")"
[ $fail = 0 ] && echo "test_duo: ok"
exit $fail
