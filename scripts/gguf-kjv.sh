#!/bin/sh
# SPDX-License-Identifier: MIT
# gguf-kjv.sh BUILD - the committed model in every checkpoint format and
# weight type the decoder reads, and their full-cache bits per byte on the
# held-out books: docs/data/gguf/kjv-types.jsonl, which docs/decoder.md
# renders (`make gguf-docs`; about two minutes: 17 decodes of 31,285 tokens).
# Also rewrites models/kjv.gguf (F16 matrices, F32 norms, the vocabulary in
# the metadata) and the reproduction subset that tests/test_gguf_kjv.sh
# checks (docs/data/gguf/check.jsonl). Each row: format, type, file_bytes,
# then `kvevict lm eval --json`'s row of the full cache, and delta_vs_legacy
# (its bits per byte less the legacy file's). The model's rows
# hold 128 or 384 values, not whole blocks of 256: asked for Q2_K, Q3_K,
# Q4_K, Q5_K, Q6_K and IQ4_XS, the converter falls back to Q4_0, Q4_0, Q5_0,
# Q5_1, Q8_0 and IQ4_NL (as llama.cpp's quantizer does), and the rows say so.
set -eu
B=${1:?usage: gguf-kjv.sh BUILD}
cd "$(dirname "$0")/.."
K=$B/kvevict
C=$B/kvevict-convert
W=$B/gguf-kjv
mkdir -p "$W" docs/data/gguf
"$C" --model models/kjv.bin --tokenizer models/tokenizer.bin --to gguf --type f16 \
    --name "kvevict KJV 0.93M" -o models/kjv.gguf
out=docs/data/gguf/kjv-types.jsonl
: >"$out.tmp"
row() { # FORMAT TYPE FILE [EVAL ARGS...]: one row
    fmt=$1 typ=$2 f=$3
    shift 3
    bytes=$(wc -c <"$f" | tr -d ' ')
    "$K" lm eval --model "$f" --text models/heldout.txt --json "$@" | head -n 1 |
        sed "s/^{/{\"format\": \"$fmt\", \"type\": \"$typ\", \"file_bytes\": $bytes, /" >>"$out.tmp"
}
row "llama2.c legacy" F32 models/kjv.bin --tokenizer models/tokenizer.bin
"$C" --model models/kjv.bin --to llama2c-v2 -o "$W/kjv-v2.bin"
row "llama2.c version 2" "int8, groups of 64" "$W/kjv-v2.bin" --tokenizer models/tokenizer.bin
for t in f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k iq4_xs; do
    "$C" --model models/kjv.bin --tokenizer models/tokenizer.bin --to gguf --type "$t" \
        -o "$W/kjv-$t.gguf" 2>"$W/kjv-$t.log"
    T=$(echo "$t" | tr a-z A-Z)
    case $t in
    q2_k | q3_k) T="$T, as Q4_0" ;;
    q4_k) T="Q4_K, as Q5_0" ;;
    q5_k) T="Q5_K, as Q5_1" ;;
    q6_k) T="Q6_K, as Q8_0" ;;
    iq4_xs) T="IQ4_XS, as IQ4_NL" ;;
    esac
    row GGUF "$T" "$W/kjv-$t.gguf"
done
# the difference to the legacy file, the first row
awk 'match($0, /"bits_per_byte": [^,]*/) {
        v = substr($0, RSTART + 17, RLENGTH - 17) + 0
        if (NR == 1) legacy = v
        sub(/}$/, sprintf(", \"delta_vs_legacy\": %.6f}", v - legacy))
    }
    { print }' "$out.tmp" >"$out"
rm -f "$out.tmp"
echo "gguf-kjv: wrote $out and models/kjv.gguf"
sh tests/test_gguf_kjv.sh "$K" "$C" . --write
