#!/bin/sh
# SPDX-License-Identifier: MIT
# scripts/llama-docs.sh BUILD - the measured blocks of docs/llama.cpp.md
# (make llama-docs; BUILD configured with -DKVEVICT_LLAMA=ON): on the whole
# held-out text, `kvevict-llama eval` (engine llama.cpp) and `kvevict lm eval
# --same-positions` (engine kvevict) for h2o, tova, streaming, knorm,
# knorm:recent_window=1 and expected_attention:recent_window=32 at budgets
# 51 and 102, into docs/data/llama-eval.jsonl (each row with its engine),
# then the page's blocks. Deterministic up to llama.cpp's choice of CPU
# kernels (test_llama re-makes one row within 0.001); about ten minutes.
# Also kvevict-convert's weight error against llama.cpp's quantizer, every
# type (tests/test_convert_error.sh --write: docs/data/gguf/convert-error.jsonl,
# rendered in docs/decoder.md; exact, test_convert_error checks it).
set -eu
B=${1:?usage: scripts/llama-docs.sh BUILD}
cd "$(dirname "$0")/.."
out=docs/data/llama-eval.jsonl
pol=h2o,tova,streaming,knorm:recent_window=1,expected_attention:recent_window=32
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kve-llama-docs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$B/kvevict-llama" eval --model models/kjv.gguf --text models/heldout.txt --policy "$pol" \
  --budget 51,102 --json --quiet -o "$tmp/l.jsonl"
"$B/kvevict" lm eval --model models/kjv.gguf --text models/heldout.txt --policy "$pol,knorm" \
  --budget 51,102 --same-positions --json --quiet -o "$tmp/k.jsonl"
{ sed 's/^{/{"engine": "llama.cpp", /' "$tmp/l.jsonl"
  sed 's/^{/{"engine": "kvevict", /' "$tmp/k.jsonl"; } >"$tmp/all.jsonl"
mv "$tmp/all.jsonl" "$out"
"$B/kvevict-docs" docs docs/llama.cpp.md
npm=$(sed -n 's/^KVEVICT_LLAMA_DIR:PATH=//p' "$B/CMakeCache.txt") # as cmake/llama.cmake finds it
lib=${npm:-$B/_llama}/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
sh tests/test_convert_error.sh "$B/kvevict-convert" "$B/kvevict-llama" "$B/tests/weight_error" \
  "$B/kvevict" "$lib" "$(pwd)" --write
"$B/kvevict-docs" docs docs/decoder.md
