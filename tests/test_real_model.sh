#!/bin/sh
# SPDX-License-Identifier: MIT
# test_real_model.sh KVEVICT SOURCE_DIR [--write] - the reproduction check of
# docs/real-model.md. Its tables are rendered from docs/data/real-model/*.jsonl
# (test_docs checks that they equal those files); this test re-runs a small
# deterministic subset of the measurements that wrote them and requires the
# same numbers to the last digit (the decoder gives the same bits on every
# x86-64 machine, docs/decoder.md):
#  - the start of the long decode, 256 positions in bins of 128: h2o at 20%
#    with the full cache (original positions) and window at 20% (cache
#    positions); every row must be a line of stream-start.jsonl or
#    stream-start-cache.jsonl, which the full run wrote (a decode's first bins
#    do not depend on how long it goes on);
#  - lm eval (h2o at 20%, the first 12 lines of the held-out text), lm passkey
#    (h2o and window at 20%, one prompt at distance 64) and lm repeat (window
#    at 20%, one window at distance 64): their output must equal check.jsonl,
#    which `make real-model` writes with this script (--write).
# About 4,500 decoded positions: under a second natively. Skipped (77) in a
# tree without models/.
set -u
K=${1:?usage: test_real_model.sh PATH/TO/kvevict SOURCE_DIR [--write]}
SRC=${2:?usage: test_real_model.sh PATH/TO/kvevict SOURCE_DIR [--write]}
WRITE=${3:-}
case $K in /*) ;; *) K=$(pwd)/$K ;; esac
cd "$SRC" || exit 1
M=models/kjv.bin
T=models/heldout.txt
D=docs/data/real-model
if [ ! -f "$M" ] || [ ! -f "$T" ]; then
    echo "test_real_model: no $M here: skipped"
    exit 77
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/kve-real-model.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
fail=0
head -n 12 "$T" >"$W/text.txt"
{
    "$K" lm eval --model "$M" --text "$W/text.txt" --policy h2o --budget 20% --json &&
        "$K" lm passkey --model "$M" --text "$T" --policy h2o,window --budget 20% --trials 1 \
            --distances 64 --json &&
        "$K" lm repeat --model "$M" --text "$T" --policy window --budget 20% --trials 1 \
            --distances 64 --json
} >"$W/check.jsonl" || { echo "FAIL: a check command failed" >&2; exit 1; }
if [ "$WRITE" = --write ]; then
    cp "$W/check.jsonl" "$D/check.jsonl" || exit 1
    echo "test_real_model: wrote $D/check.jsonl"
    exit 0
fi
if ! cmp -s "$W/check.jsonl" "$D/check.jsonl"; then
    echo "FAIL: eval/passkey/repeat no longer reproduce $D/check.jsonl:" >&2
    diff "$D/check.jsonl" "$W/check.jsonl" | head -8 >&2
    fail=1
fi
# stream-start FILE ARGS...: every row of `lm stream ARGS` is a line of FILE.
stream_in() {
    file=$1
    shift
    "$K" lm stream --model "$M" --text "$T" --tokens 256 --bin 128 --budget 20% --json "$@" \
        >"$W/stream.jsonl" || { echo "FAIL: lm stream $*" >&2; fail=1; return; }
    n=0
    while IFS= read -r line; do
        n=$((n + 1))
        if ! grep -Fqx -- "$line" "$D/$file"; then
            echo "FAIL: lm stream $* no longer reproduces this row of $D/$file: $line" >&2
            fail=1
        fi
    done <"$W/stream.jsonl"
    if [ $n -lt 2 ]; then
        echo "FAIL: lm stream $* printed $n rows" >&2
        fail=1
    fi
}
stream_in stream-start.jsonl --policy h2o
stream_in stream-start-cache.jsonl --policy window --positions cache --full-tokens 0
[ $fail -eq 0 ] || exit 1
echo "test_real_model: eval, passkey, repeat and the start of both streams reproduce $D"
