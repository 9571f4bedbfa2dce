#!/bin/sh
# SPDX-License-Identifier: MIT
# test_convert_error.sh CONVERT KVEVICT_LLAMA WEIGHT_ERROR KVEVICT LIBDIR SOURCE_DIR [--write] -
# kvevict-convert's encoders against llama.cpp's quantizer (llama_model_quantize
# through `kvevict-llama quantize`) on the same float32 source, a random
# model 256 wide (rows of 256 and 768: no tensor falls back), every type
# both write:
#  - weight error: over the tensors both files hold in the type (llama.cpp's
#    presets give some tensors other types), the relative RMS error of
#    kvevict-convert's dequantized weights against the source is at most
#    llama.cpp's (weight_error.c; no tolerance: Q8_0, Q4_0, Q5_0, F16 and
#    BF16 are llama.cpp's own bytes, the others search further than it);
#  - general.file_type: the value llama.cpp's quantizer records for the
#    matching preset (q3_k, q4_k, q5_k: Q3_K_M, Q4_K_M, Q5_K_M, as
#    llama-quantize's Q3_K, Q4_K and Q5_K);
#  - llama.cpp reads every file kvevict-convert writes as the decoder does:
#    its logits over 16 positions and the decoder's (`kvevict lm logits`,
#    exact products) on the same file differ by a relative RMS within
#    sqrt(2 M) / 255, M = 16 quantized matrices whose products each
#    quantize their input to 8 bits on one side or both (llama.cpp's
#    vec_dot types; the decoder's Q8_0 and Q4_K), independent errors
#    adding in quadrature; a misread block gives errors of the weights'
#    own size (0.02 to 0.36 here).
# The weight errors (type, preset, tensors, both errors, general.file_type)
# equal docs/data/gguf/convert-error.jsonl, which docs/decoder.md renders
# (written with --write by scripts/llama-docs.sh: both quantizers are
# deterministic, llama.cpp's in its generic ggml-base). Skipped (77) only
# where llama.cpp's library is absent.
set -u
C=${1:?usage: test_convert_error.sh CONVERT KVEVICT_LLAMA WEIGHT_ERROR KVEVICT LIBDIR SOURCE_DIR}
KL=${2:?usage}
WE=${3:?usage}
K=${4:?usage}
LIB=${5:?usage}
SRC=${6:?usage}
WRITE=${7:-}
if [ ! -f "$LIB/libllama.v0.4.0.so" ]; then
    echo "test_convert_error: llama.cpp is not installed ($LIB has no libllama.v0.4.0.so): skipped"
    exit 77
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/kve-convert-error.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }
. "$SRC/tests/check.sh"
"$C" --random dim=256,hidden=768,layers=2,heads=4,kv_heads=2,vocab=289,seq_len=64,seed=7,tied=0 \
    --tokenizer "$SRC/tests/fixtures/lm/tiny-tokenizer.bin" --to gguf -o "$W/src.gguf" ||
    { echo "FAIL: kvevict-convert --random" >&2; exit 1; }
toks=1,5,9,40,77,100,200,288,3,17,64,128,150,151,152,7
echo "type     kvevict  llama.cpp  (relative RMS weight error; llama.cpp reading kvevict's file)"
: >"$W/error.jsonl"
for pair in f16:F16 bf16:BF16 q8_0:Q8_0 q4_0:Q4_0 q4_1:Q4_1 q5_0:Q5_0 q5_1:Q5_1 q2_k:Q2_K \
    q3_k:Q3_K_M q4_k:Q4_K_M q5_k:Q5_K_M q6_k:Q6_K iq4_nl:IQ4_NL iq4_xs:IQ4_XS; do
    t=${pair%%:*} preset=${pair#*:}
    T=$(echo "$t" | tr a-z A-Z)
    "$C" --model "$W/src.gguf" --to gguf --type "$t" -o "$W/kv.gguf" 2>"$W/err" ||
        { bad "kvevict-convert --type $t: $(cat "$W/err")"; continue; }
    "$KL" quantize --model "$W/src.gguf" --type "$preset" -o "$W/ll.gguf" --llama-lib "$LIB" \
        --threads 1 >/dev/null 2>"$W/err" || { bad "kvevict-llama quantize $preset: $(tail -n 2 "$W/err")"; continue; }
    row=$("$WE" "$W/src.gguf" "$T" "$W/kv.gguf" "$W/ll.gguf") || { bad "weight_error $T"; continue; }
    a=$(echo "$row" | sed 's/.*"a": \([^,]*\),.*/\1/') b=$(echo "$row" | sed 's/.*"b": \([^}]*\)}/\1/')
    awk -v a="$a" -v b="$b" 'BEGIN { exit !(a + 0 <= b + 0) }' ||
        bad "$T: kvevict-convert's weight error $a is above llama.cpp's $b"
    fk=$(gguf_file_type "$W/kv.gguf") fl=$(gguf_file_type "$W/ll.gguf")
    [ "$fk" = "$fl" ] || bad "$T: general.file_type $fk, llama.cpp's $preset file says $fl"
    "$KL" logits --model "$W/kv.gguf" --tokens $toks --llama-lib "$LIB" --threads 1 \
        -o "$W/l.jsonl" 2>"$W/err" || { bad "llama.cpp does not read kvevict-convert's $T: $(cat "$W/err")"; continue; }
    "$K" lm logits --threads 1 --model "$W/kv.gguf" --tokens $toks -o "$W/d.jsonl" 2>"$W/err" ||
        { bad "kvevict lm logits on $T: $(cat "$W/err")"; continue; }
    r=$(logits_rel_rms "$W/l.jsonl" "$W/d.jsonl" 16)
    awk -v r="$r" 'BEGIN { exit !(r + 0 <= sqrt(2 * 16) / 255 && r != "nan") }' ||
        bad "$T: llama.cpp's logits on kvevict-convert's file are $r (relative RMS) from the decoder's, beyond $(awk 'BEGIN { printf "%.4f", sqrt(32) / 255 }')"
    n=$(echo "$row" | sed 's/.*"tensors": \([0-9]*\),.*/\1/')
    printf '%-8s %.6f %.6f  (%s tensors; file_type %s; logits %s of the decoder'"'"'s)\n' "$T" "$a" "$b" \
        "$n" "$fk" "$r"
    printf '{"type": "%s", "llama_preset": "%s", "tensors": %s, "kvevict_rms": %s, "llama_rms": %s, "file_type": %s}\n' \
        "$T" "$preset" "$n" "$a" "$b" "$fk" >>"$W/error.jsonl"
done
out=$SRC/docs/data/gguf/convert-error.jsonl
if [ "$WRITE" = --write ]; then
    cp "$W/error.jsonl" "$out" || exit 1
    echo "test_convert_error: wrote $out"
elif ! cmp -s "$W/error.jsonl" "$out"; then
    echo "FAIL: the weight errors no longer reproduce $out:" >&2
    diff "$out" "$W/error.jsonl" | head -8 >&2
    fail=1
fi
[ $fail = 0 ] && echo "test_convert_error: every type's weight error at most llama.cpp's"
exit $fail
