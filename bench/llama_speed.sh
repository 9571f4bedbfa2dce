#!/bin/sh
# SPDX-License-Identifier: MIT
# bench/llama_speed.sh BUILD DIR [THREADS...]: kvevict inside llama.cpp at
# TinyLlama's shape (22 layers, width 2048, 32 query and 4 KV heads of 64,
# hidden 5632, 32000 tokens): random weights written by kvevict-convert
# (F16), quantized by llama.cpp's own quantizer to Q4_K_M (kvevict-llama
# quantize), then `kvevict-llama bench` at budget 512 on each thread count
# (default: 1 and 2). The files (2.2 GB and 0.7 GB) go to DIR and stay for
# a rerun. The vocabulary is a synthetic tokenizer.bin of 32000 pieces
# (BOS, EOS, the 256 bytes, then filler): the benchmark decodes token ids,
# never text. A timing: docs/performance.md quotes it with the machine's
# conditions; nothing checks it.
set -eu
build=${1:?usage: bench/llama_speed.sh BUILD DIR [THREADS...]}
dir=${2:?usage: bench/llama_speed.sh BUILD DIR [THREADS...]}
shift 2
threads=${*:-1 2}
mkdir -p "$dir"
tok=$dir/tok32000.bin f16=$dir/tinyllama-f16.gguf q4=$dir/tinyllama-q4_k_m.gguf
if [ ! -s "$tok" ]; then
  # int32 max_token_length, then per piece: float32 score, int32 length, bytes
  awk 'function le32(v,  i, s) { s = ""; for (i = 0; i < 4; i++) { s = s sprintf("%c", v % 256); v = int(v / 256) } return s }
       BEGIN { printf "%s", le32(16) > "/dev/stdout"
               n = split("<unk> <s> </s>", sp, " ")
               for (i = 0; i < 32000; i++) {
                 if (i < 3) p = sp[i + 1]; else if (i < 259) p = sprintf("<0x%02X>", i - 3); else p = sprintf("t%d", i)
                 printf "%s%s%s", le32(0), le32(length(p)), p } }' LC_ALL=C > "$tok.tmp"
  mv "$tok.tmp" "$tok"
fi
[ -s "$f16" ] || "$build/kvevict-convert" --tokenizer "$tok" --to gguf --type f16 --name tinyllama-random \
  --random dim=2048,hidden=5632,layers=22,heads=32,kv_heads=4,vocab=32000,seq_len=2048,seed=7 -o "$f16"
[ -s "$q4" ] || "$build/kvevict-llama" quantize --model "$f16" -o "$q4" --type Q4_K_M
[ -n "${LLAMA_SPEED_FILES_ONLY:-}" ] && exit 0 # bench/lm_vs_llama.sh: the files alone
for t in $threads; do
  "$build/kvevict-llama" bench --model "$q4" --policy h2o,streaming,tova,knorm:recent_window=1,keydiff:recent_window=1,expected_attention:recent_window=1 \
    --budget 512 --tokens 128 --repeats 5 --threads "$t" "${BENCH_FORMAT:---md}"
done
