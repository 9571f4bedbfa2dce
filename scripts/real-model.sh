#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# real-model.sh [BUILD] - every measurement of docs/real-model.md with the
# project's own commands; `make real-model` runs it on the committed model
# (models/kjv.bin) and its held-out text. It writes JSON Lines under
# docs/data/real-model/ (what the page's tables are rendered from), the
# reproduction subset (check.jsonl: tests/test_real_model.sh --write), the
# figures (docs/img/real_*.png) and the generated blocks of the pages. About
# 25 minutes of CPU on this project's 2-core machine; REAL_MODEL_JOBS
# (default 2) measurements run at once. The decoder's timings (speed.jsonl)
# run alone, after the rest.
#
# Another llama2.c checkpoint (docs/real-model.md, "Your own checkpoint"):
#   MODEL=stories15M.bin TOKENIZER=tokenizer.bin TEXT=stories.txt OUT=out \
#       POLICIES=window,streaming,h2o:recent_window=16 ./scripts/real-model.sh
# writes the same files and figures under OUT (nothing in docs/). POLICIES,
# H2O_SWEEP (h2o specs at 20%), BUDGETS, STREAM_TOKENS and FULL_TOKENS (the
# long decode's length and the full cache's part of it) override the values
# below; a tokenizer without the pass-key pieces skips the pass key with its
# message.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
K=$B/kvevict
M=${MODEL:-models/kjv.bin}
T=${TEXT:-models/heldout.txt}
D=${OUT:-docs/data/real-model}
JOBS=${REAL_MODEL_JOBS:-2}
ALL=${POLICIES:-window,streaming,random,h2o,scissorhands,tova,h2o_decay,h2o_mean}
BUDGETS=${BUDGETS:-10%,20%,50%}
# h2o's recent window at 20% of the context (budget 102 here): the sweep
# that explains h2o against window (each recent_window below the budget).
H2O=h2o:recent_window=0,h2o:recent_window=16,h2o:recent_window=32,h2o:recent_window=48
H2O=${H2O_SWEEP:-$H2O,h2o:recent_window=64,h2o:recent_window=80,h2o:recent_window=96}
STREAM=${STREAM_POLICIES:-window,streaming,h2o,h2o_mean,tova}
STREAM_CACHE=${STREAM_CACHE_POLICIES:-window,streaming,h2o,h2o_mean,tova}
STREAM_TOKENS=${STREAM_TOKENS:-65536}
FULL_TOKENS=${FULL_TOKENS:-16384}
committed=0
[ -z "${MODEL:-}${TEXT:-}${OUT:-}" ] && committed=1
mkdir -p "$D"
common=(--model "$M" --text "$T" --json)
[ -n "${TOKENIZER:-}" ] && common+=(--tokenizer "$TOKENIZER")

pids=()
# launch NAME ARGS...: kvevict ARGS -o $D/NAME.jsonl in the background, at
# most JOBS at once; a failure stops the script (at the next wait).
launch() {
    local name=$1
    shift
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
        wait -n
    done
    echo "real-model: $name: kvevict $*" >&2
    "$K" "$@" -o "$D/$name.jsonl" &
    pids+=($!)
}

# 1. Held-out bits per byte: every policy at 10%, 20% and 50% of the
#    context, and h2o's recent window at 20%.
launch eval lm eval "${common[@]}" --policy "$ALL" --budget "$BUDGETS"
launch eval-h2o lm eval "${common[@]}" --policy "$H2O" --budget 20%
# 2. Long-range recall: the pass key at distances from 32 (below the
#    smallest budget) to the top of the context, 64 prompts a distance
#    (every key once), every policy and budget; h2o's recent window at 20%;
#    the repeated passage (what this model cannot show).
if "$K" lm passkey "${common[@]}" --trials 1 >/dev/null; then
    DIST=32,64,128,192,256,320,384,448,503
    [ $committed -eq 1 ] || DIST= # the default distances of the checkpoint's context
    dist=()
    [ -n "$DIST" ] && dist=(--distances "$DIST")
    launch passkey lm passkey "${common[@]}" --policy "$ALL" --budget "$BUDGETS" --trials 64 \
        "${dist[@]}"
    launch passkey-h2o lm passkey "${common[@]}" --policy "$H2O" --budget 20% --trials 64 \
        "${dist[@]}"
else
    echo "real-model: no pass-key measurement with this tokenizer (above)" >&2
fi
launch repeat lm repeat "${common[@]}" --policy window,streaming,h2o --budget 20% --trials 32
# 3. The long decode: 65536 positions (the held-out text looped about
#    twice), the full cache for its first 16384; the first 4096 in finer
#    bins, across the training length.
launch stream lm stream "${common[@]}" --policy "$STREAM" --budget 20% \
    --tokens "$STREAM_TOKENS" --bin 1024 --full-tokens "$FULL_TOKENS"
launch stream-cache lm stream "${common[@]}" --policy "$STREAM_CACHE" --budget 20% \
    --positions cache --tokens "$STREAM_TOKENS" --bin 1024 --full-tokens 0
launch stream-start lm stream "${common[@]}" --policy "$STREAM" --budget 20% --tokens 4096 \
    --bin 128
launch stream-start-cache lm stream "${common[@]}" --policy "$STREAM_CACHE" --budget 20% \
    --positions cache --tokens 4096 --bin 128 --full-tokens 0
for p in "${pids[@]}"; do
    wait "$p"
done

# 5. Decoder speed, alone: tokens per second and the bookkeeping share, and
#    the conditions of the run (timings are never drift-checked).
echo "real-model: speed: kvevict-lm-speed --json $M" >&2
"$B"/kvevict-lm-speed --json "$M" >"$D/speed.tmp"
printf '{"cpu": "%s", "cores": %s, "load_average": %s, "date": "%s"}\n' \
    "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1 | tr -d '"\\')" \
    "$(nproc)" "$(cut -d' ' -f1 /proc/loadavg)" "$(date -u +%Y-%m-%d)" >"$D/speed-conditions.tmp"
mv "$D/speed.tmp" "$D/speed.jsonl"
mv "$D/speed-conditions.tmp" "$D/speed-conditions.jsonl"

./scripts/deps.sh gnuplot-nox:gnuplot
if [ $committed -eq 1 ]; then
    # The reproduction subset, the pages' blocks and the figures.
    sh tests/test_real_model.sh "$K" . --write
    "$K" docs docs/real-model.md docs/trace.md docs/results.md
    "$K" plot --real-model "$D" --out docs/img
else
    "$K" plot --real-model "$D" --out "$D" || echo "real-model: some figures need files not made here" >&2
fi
