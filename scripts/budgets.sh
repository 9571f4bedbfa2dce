#!/bin/sh
# SPDX-License-Identifier: MIT
# budgets.sh [--check [quick]] [KVEVICT] - the measurements of docs/budgets.md.
#
# Without --check (make budgets-docs): runs every measurement on the
# committed model (models/kjv.bin, bits per byte and pass-key recall on
# models/heldout.txt) and on its attention traces (kvevict lm dump of the
# first 512 tokens of the held-out text), writes them as JSON Lines to
# docs/data/budgets-*.jsonl, draws docs/img/budgets-*.png with gnuplot and
# renders the tables of docs/budgets.md (kvevict docs). About ten minutes on
# a 2-core machine.
#
# With --check (the drift test, tests/test_budgets_docs.sh): re-runs a small
# deterministic subset the same way (the trace rows of every allocation at
# budget 51, and unless `quick`, the pass-key row of the shared budget at
# budget 51 and distance 500) and fails unless each row it prints is a row
# of the committed files, character for character. Timings (ns_per_step)
# are dropped from every row before it is written or compared.
#
# Each row gets the labels of the run that made it ("allocation", and for
# pages "family" and "block"): the runs differ in their options, not in
# what their rows say.
set -eu
check=0
quick=0
if [ "${1:-}" = "--check" ]; then
    check=1
    shift
    if [ "${1:-}" = "quick" ]; then
        quick=1
        shift
    fi
fi
K=$(cd "$(dirname "${1:-build/kvevict}")" && pwd)/$(basename "${1:-build/kvevict}")
SRC=$(cd "$(dirname "$0")/.." && pwd)
MODEL=$SRC/models/kjv.bin
TEXT=$SRC/models/heldout.txt
CAL=$SRC/docs/data/calibration.txt
DATA=$SRC/docs/data
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-budgets.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" # the traces are named by relative paths in the rows

# The allocations compared at equal memory: "label|options".
ALLOCS='uniform|
shared heads|--share-heads
pyramid|--schedule pyramid
pyramid + shared|--schedule pyramid --share-heads
attention|--schedule attention --calibration CAL
attention + shared|--schedule attention --calibration CAL --share-heads'

# Drops the timing and prefixes the labels "$1" (JSON members, ", "-joined).
label() {
    sed -E -e 's/, "ns_per_step": [^,}]*//' -e "s/^\\{/{$1, /"
}

# Runs "$@" (a kvevict command, its JSON on stdout) and labels its rows.
rows() {
    lab=$1
    shift
    "$K" "$@" | label "$lab"
}

each_alloc() { # each_alloc FUNCTION: FUNCTION "label" options...
    echo "$ALLOCS" | while IFS='|' read -r name opts; do
        "$1" "$name" $opts
    done
}

"$K" lm dump --model "$MODEL" --text "$TEXT" --steps 512 -o heldout.npy
"$K" lm dump --model "$MODEL" --text "$CAL" --steps 512 -o calibration.npy

# `--schedule uniform` when no schedule is given: every row carries the
# budgets keys (and the trace is evaluated one bank per layer).
with_schedule() {
    case " $* " in
    *" --schedule "*) echo "$@" ;;
    *) echo "$@" --schedule uniform ;;
    esac
}

trace_rows() { # scored after twice the budget: every schedule's layers evict by then
    name=$1
    shift
    opts=$(with_schedule "$@" | sed 's|CAL|calibration.npy|')
    for b in $budgets; do
        rows "\"allocation\": \"$name\"" eval --trace heldout.npy --policy h2o --budget "$b" \
            --score-after $((2 * b)) $opts --json
    done
}

model_rows() { # lm eval or passkey with every allocation's options
    name=$1
    shift
    opts=$(with_schedule "$@" | sed "s|CAL|$CAL|")
    rows "\"allocation\": \"$name\"" lm "$command" --model "$MODEL" --text "$TEXT" --policy h2o \
        --budget "$budgets" $extra $opts --json | grep -v '"policy": "full"' || true
}

if [ $check = 1 ]; then
    fail=0
    compare() { # compare FILE: every line of stdin is a line of FILE
        while IFS= read -r line; do
            if ! grep -Fxq -- "$line" "$1"; then
                echo "test_budgets_docs: not in $1: $line" >&2
                fail=1
            fi
        done
    }
    budgets=51
    each_alloc trace_rows >trace.jsonl
    compare "$DATA/budgets-trace.jsonl" <trace.jsonl
    n=$(wc -l <trace.jsonl)
    if [ $quick = 0 ]; then
        command=passkey
        budgets=51
        extra="--distances 500 --trials 32"
        model_rows "shared heads" --share-heads >passkey.jsonl
        compare "$DATA/budgets-passkey.jsonl" <passkey.jsonl
        n=$((n + $(wc -l <passkey.jsonl)))
    fi
    [ "$n" -gt 0 ] || { echo "test_budgets_docs: no row was made" >&2; exit 1; }
    [ $fail = 0 ] || { echo "test_budgets_docs: the measurements drifted: make budgets-docs" >&2; exit 1; }
    echo "test_budgets_docs: $n rows re-made, each equal to its committed row"
    exit 0
fi

# ---- every measurement ----
budgets="51 102"
each_alloc trace_rows >"$DATA/budgets-trace.jsonl"
budgets=51
rows '"allocation": "shared heads"' eval --trace heldout.npy --policy h2o --budget 51 \
    --score-after 102 --share-heads --per-head --json >"$DATA/budgets-trace-heads.jsonl"
rows '"allocation": "uniform"' eval --trace heldout.npy --policy h2o --budget 51 \
    --score-after 102 --schedule uniform --per-head --json >>"$DATA/budgets-trace-heads.jsonl"

budgets=51,102,256
command=eval
extra=
each_alloc model_rows >"$DATA/budgets-lm.jsonl"
"$K" lm eval --model "$MODEL" --text "$TEXT" --json | label '"allocation": "full cache"' \
    >>"$DATA/budgets-lm.jsonl"
command=passkey
extra="--distances 64,256,500 --trials 32"
each_alloc model_rows >"$DATA/budgets-passkey.jsonl"

# Pages: h2o and streaming, block 1, 16 and 64, at budgets 130 and 256 (130:
# the smallest that streaming's 4 sinks accept with pages of 64).
: >"$DATA/budgets-pages-trace.jsonl"
: >"$DATA/budgets-pages-lm.jsonl"
: >"$DATA/budgets-pages-passkey.jsonl"
for family in h2o streaming; do
    for block in 1 16 64; do
        lab="\"family\": \"$family\", \"block\": $block"
        for b in 130 256; do
            rows "$lab" eval --trace heldout.npy --policy "$family:block=$block" --budget "$b" \
                --schedule uniform --json >>"$DATA/budgets-pages-trace.jsonl"
        done
        rows "$lab" lm eval --model "$MODEL" --text "$TEXT" --policy "$family:block=$block" \
            --budget 130,256 --json | grep -v '"policy": "full"' >>"$DATA/budgets-pages-lm.jsonl"
        rows "$lab" lm passkey --model "$MODEL" --text "$TEXT" --policy "$family:block=$block" \
            --budget 130,256 --distances 64,256,500 --trials 32 --json |
            grep -v '"policy": "full"' >>"$DATA/budgets-pages-passkey.jsonl"
    done
done

# ---- figures and tables ----
IMG=$SRC/docs/img
plot() { "$K" plot "$@" >/dev/null; }
plot --jsonl "$DATA/budgets-lm.jsonl" --where 'schedule!null' --x budget --y delta_bits_per_byte \
    --series allocation --logx --title 'h2o on the model: held-out bits/byte above the full cache' \
    --xlabel 'mean budget per KV head' --ylabel 'bits/byte minus the full cache' \
    --png "$IMG/budgets-bpb.png"
plot --jsonl "$DATA/budgets-passkey.jsonl" --where budget:51 --x distance --y accuracy \
    --series allocation --title 'h2o at budget 51 (10%): pass-key accuracy' \
    --xlabel 'distance from the key to the question' --ylabel 'exact-match accuracy' \
    --png "$IMG/budgets-passkey.png"
plot --jsonl "$DATA/budgets-trace.jsonl" --x budget --y retained_mass --series allocation --logx \
    --title 'h2o on the attention trace: retained mass (steps t > 2 x budget)' \
    --xlabel 'mean budget per KV head' --png "$IMG/budgets-trace.png"
plot --jsonl "$DATA/budgets-trace-heads.jsonl" --where 'allocation:shared heads' --where 'head!all' \
    --x layer --y mean_kept --series head \
    --title 'One budget for the 2 KV heads of each layer (51 each on average): positions kept' \
    --xlabel layer --ylabel 'mean kept positions' --png "$IMG/budgets-heads.png"
plot --jsonl "$DATA/budgets-pages-lm.jsonl" --where budget:130 --x block --y delta_bits_per_byte \
    --series family --logx --title 'Pages at budget 130: held-out bits/byte above the full cache' \
    --xlabel 'block (positions per page)' --ylabel 'bits/byte minus the full cache' \
    --png "$IMG/budgets-pages.png"
cd "$SRC"
"$K" docs docs/budgets.md
