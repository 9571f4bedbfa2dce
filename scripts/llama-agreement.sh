#!/bin/sh
# SPDX-License-Identifier: MIT
# llama-agreement.sh BUILD OUT [VARIANT] - the decoder against llama.cpp on
# every type llama.cpp's quantizer writes (issue 28's agreement table; `make
# llama-agreement` writes docs/data/llama-agreement.jsonl and renders
# docs/decoder.md's tables; test_llama.sh runs it and holds the rows).
#
# For each type T of F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_M,
# Q4_K_M, Q5_K_M, Q6_K, IQ4_NL and IQ4_XS, `kvevict-llama quantize` writes T
# from models/kjv.gguf and from a random model 256 wide; plain llama.cpp
# (tests/llama_plain) decodes 200 tokens one at a time and `kvevict lm
# logits` decodes them with --products llama and exact. One JSON line a
# (model, type): for each products mode the worst |difference| over the
# row's largest |logit| (`*_worst`), argmax agreement and rows equal bit for
# bit out of `rows`; on kjv also bits per byte of the first 9000 bytes of
# the held-out text with the full cache by llama.cpp (`kvevict-llama eval
# --policy full`'s first row, one token a decode) and by the decoder
# (`kvevict lm eval`'s first row, which --policy full repeats) both ways,
# and their differences to llama.cpp's (`bpb_delta_*`). `cpu` is the CPU
# back end ggml loaded (llama_plain --features)
# and `variant` the decoder's variant of it (lm_llama_cpu; "" when it
# follows none).
#
# VARIANT (avx2, avx512 or avx512-bf16): llama.cpp's library of that
# variant (haswell, skylakex, cooperlake) is loaded instead, from a folder
# of its own, against `--products llama:VARIANT`, kjv only, no bits per
# byte; exit 77 when this CPU cannot run it. The library folder is
# $KVEVICT_LLAMA_LIB, else the node-llama-cpp the build was configured
# with. About three minutes on two cores (a VARIANT: under one).
set -eu
B=${1:?usage: llama-agreement.sh BUILD OUT [VARIANT]}
OUT=${2:?usage: llama-agreement.sh BUILD OUT [VARIANT]}
VARIANT=${3:-}
cd "$(dirname "$0")/.."
K=$B/kvevict
KL=$B/kvevict-llama
PLAIN=$B/tests/llama_plain
dir=$(sed -n 's/^KVEVICT_LLAMA_DIR:PATH=//p' "$B/CMakeCache.txt" 2>/dev/null)
LIB=${KVEVICT_LLAMA_LIB:-${dir:-$B/_llama}/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64}
W=$(mktemp -d "${TMPDIR:-/tmp}/kve-agree.XXXXXX")
trap 'rm -rf "$W"' EXIT

# The decoder's variant of a feature list (llama_plain --features); empty:
# one it does not follow (AMX's kernels, no AVX2).
has() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }
variant_of() {
    if has "$1" AMX_INT8; then
        echo
    elif has "$1" AVX512; then
        has "$1" AVX512_BF16 && echo avx512-bf16 || echo avx512
    elif has "$1" AVX2 && has "$1" FMA && has "$1" F16C; then
        echo avx2
    else
        echo
    fi
}
models="kjv w256"
modes="llama exact"
if [ -n "$VARIANT" ]; then
    case $VARIANT in
    avx2) so=haswell ;;
    avx512) so=skylakex ;;
    avx512-bf16) so=cooperlake ;;
    *) echo "llama-agreement.sh: VARIANT $VARIANT is none of avx2, avx512, avx512-bf16" >&2
       exit 2 ;;
    esac
    mkdir "$W/lib"
    for f in libggml-base.so libggml.v0.4.0.so libllama.v0.4.0.so libggml-cpu-$so.so; do
        ln -s "$LIB/$f" "$W/lib/$f"
    done
    LIB=$W/lib
    models=kjv
    modes=llama:$VARIANT
fi
cpu=$("$PLAIN" "$LIB" --features 2>/dev/null) || cpu=""
var=$(variant_of "$cpu")
if [ -n "$VARIANT" ] && [ "$var" != "$VARIANT" ]; then
    echo "llama-agreement.sh: libggml-cpu-$so.so does not run here (${cpu:-not loaded})" >&2
    exit 77
fi
toks=$(awk 'BEGIN { s = "1"; for (i = 1; i < 200; i++) s = s "," (3 + (i * 577) % 1000); print s }')
head -c 9000 models/heldout.txt >"$W/text.txt"
"$B/kvevict-convert" --random dim=256,hidden=768,layers=4,heads=8,kv_heads=4,vocab=1088,seq_len=512,seed=3 \
    --tokenizer models/tokenizer.bin --to gguf -o "$W/w256.gguf" 2>"$W/err"

# compare PLAIN KV: "worst argmax equal rows" of the decoder's logits
# against llama.cpp's, row by row
compare() {
    paste -d '\n' "$1" "$2" | awk '
        { gsub(/.*"logits": \[/, ""); gsub(/\]\}/, ""); n = split($0, v, ", ") }
        NR % 2 == 1 { for (i = 1; i <= n; i++) a[i] = v[i]; next }
        { ia = 1; ib = 1; w = 0
          for (i = 1; i <= n; i++) { d = a[i] - v[i]; if (d < 0) d = -d; if (d > w) w = d
              if (a[i] > a[ia]) ia = i; if (v[i] > v[ib]) ib = i }
          m = a[ia] < 0 ? -a[ia] : a[ia]; if (w / m > rel) rel = w / m
          same += ia == ib; rows++; if (w == 0) equal++ }
        END { printf "%.6g %d %d %d\n", rel, same, equal, rows }'
}
# the full cache's bits per byte of a --json row
bpb() { sed -n '1s/.*"bits_per_byte": \([^,]*\),.*/\1/p' "$1"; }

: >"$OUT.tmp"
for src in $models; do
    [ $src = kjv ] && from=models/kjv.gguf || from=$W/w256.gguf
    for T in F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K_M Q4_K_M Q5_K_M Q6_K IQ4_NL IQ4_XS; do
        f=$W/$src-$T.gguf
        "$KL" quantize --model "$from" -o "$f" --type $T --llama-lib "$LIB" >/dev/null 2>"$W/err"
        "$PLAIN" "$LIB" "$f" "$toks" >"$W/plain.jsonl"
        row="{\"model\": \"$src\", \"type\": \"$T\", \"cpu\": \"$cpu\", \"variant\": \"$var\""
        for mode in $modes; do
            "$K" lm logits --threads 1 --products "$mode" --model "$f" --tokens "$toks" \
                -o "$W/kv.jsonl"
            set -- $(compare "$W/plain.jsonl" "$W/kv.jsonl")
            m=${mode%%:*}
            row="$row, \"${m}_worst\": $1, \"${m}_argmax\": $2, \"${m}_equal\": $3"
        done
        row="$row, \"rows\": $4"
        if [ $src = kjv ] && [ -z "$VARIANT" ]; then
            "$KL" eval --model "$f" --text "$W/text.txt" --policy full --json --quiet --threads 1 \
                --llama-lib "$LIB" -o "$W/l.jsonl"
            c=$(bpb "$W/l.jsonl")
            row="$row, \"bpb_llama_cpp\": $c"
            for mode in $modes; do
                "$K" lm eval --threads 1 --model "$f" --text "$W/text.txt" --products "$mode" \
                    --json --quiet -o "$W/k.jsonl"
                v=$(bpb "$W/k.jsonl")
                d=$(awk -v a="$v" -v b="$c" 'BEGIN { printf "%.6g", a - b }')
                row="$row, \"bpb_$mode\": $v, \"bpb_delta_$mode\": $d"
            done
        fi
        echo "$row}" >>"$OUT.tmp"
    done
done
mv "$OUT.tmp" "$OUT"
