#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# leaderboard.sh [BUILD] - docs/leaderboard.md from scratch: `kvevict lm
# leaderboard` on the committed model (models/kjv.bin, models/heldout.txt),
# one process per compression ratio (LEADERBOARD_JOBS at once, default 3),
# their rows joined into docs/data/leaderboard.jsonl (the full cache's row
# once, first; ranks are within a ratio, so splitting by ratio changes no
# figure), then the reproduction subset that tests/test_leaderboard.sh
# checks (docs/data/leaderboard-check.jsonl), the page's blocks and its
# figures (docs/img/leaderboard-*.png, gnuplot). `make leaderboard` runs it.
#
# Another checkpoint (docs/decoder.md, "Your own model"):
#   MODEL=my.bin TOKENIZER=tokenizer.bin TEXT=heldout.txt OUT=out \
#       ./scripts/leaderboard.sh
# writes OUT/leaderboard.jsonl and OUT/leaderboard-*.png (nothing in docs/).
# METHODS (names of `kvevict lm leaderboard --list`) and RATIOS override the
# defaults (every method; 0.5, 0.8, 0.9).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
K=$B/kvevict
KD=$B/kvevict-docs
M=${MODEL:-models/kjv.bin}
T=${TEXT:-models/heldout.txt}
D=${OUT:-docs/data}
IMG=${OUT:-docs/img}
JOBS=${LEADERBOARD_JOBS:-3}
RATIOS=${RATIOS:-0.5,0.8,0.9}
committed=0
[ -z "${MODEL:-}${TEXT:-}${OUT:-}" ] && committed=1
mkdir -p "$D" "$IMG"
args=(lm leaderboard --model "$M" --text "$T" --json --quiet)
[ -n "${TOKENIZER:-}" ] && args+=(--tokenizer "$TOKENIZER")
[ -n "${METHODS:-}" ] && args+=(--methods "$METHODS")
W=$(mktemp -d "${TMPDIR:-/tmp}/kve-leaderboard.XXXXXX")
trap 'rm -rf "$W"' EXIT
IFS=, read -ra ratios <<<"$RATIOS"
for i in "${!ratios[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
        wait -n
    done
    echo "leaderboard: kvevict ${args[*]} --ratio ${ratios[$i]}" >&2
    "$K" "${args[@]}" --ratio "${ratios[$i]}" -o "$W/$i.jsonl" &
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
    wait -n
done
for i in "${!ratios[@]}"; do
    [ -s "$W/$i.jsonl" ] || { echo "leaderboard: ratio ${ratios[$i]} failed" >&2; exit 1; }
done
{
    head -n 1 "$W/0.jsonl"
    for i in "${!ratios[@]}"; do
        tail -n +2 "$W/$i.jsonl"
    done
} >"$D/leaderboard.jsonl"
echo "leaderboard: wrote $D/leaderboard.jsonl" >&2
if [ $committed -eq 1 ]; then
    sh tests/test_leaderboard.sh "$K" . --write
    "$KD" docs docs/leaderboard.md
fi
# The figures in kvpress's form: a score against the compression ratio, one
# line per method (the full cache, 0 and 1 by definition, left out). On the committed model the
# key-based policies without a recent window lie 0.1 to 1.2 bits per byte
# above the rest: the bits-per-byte figure stops at 0.06 (BPB_YRANGE, LO:HI;
# empty: gnuplot's own range, the default on another model).
yr=()
BPB_YRANGE=${BPB_YRANGE-$([ $committed -eq 1 ] && echo -0.005:0.06)}
[ -n "$BPB_YRANGE" ] && yr=(--yrange "$BPB_YRANGE")
"$KD" plot --jsonl "$D/leaderboard.jsonl" --x compression_ratio --y delta_bits_per_byte \
    --where method!full --series method "${yr[@]}" --title "bits per byte above the full cache (lower is better)" \
    --xlabel "compression ratio" --ylabel "bits per byte above the full cache" \
    --png "$IMG/leaderboard-bpb.png"
"$KD" plot --jsonl "$D/leaderboard.jsonl" --x compression_ratio --y passkey_accuracy \
    --where method!full --series method --yrange -0.05:1.05 --title "pass-key accuracy beyond the budget (higher is better)" \
    --xlabel "compression ratio" --ylabel "pass-key accuracy" \
    --png "$IMG/leaderboard-passkey.png"
echo "leaderboard: wrote $IMG/leaderboard-bpb.png, $IMG/leaderboard-passkey.png" >&2
