#!/bin/sh
# SPDX-License-Identifier: MIT
# test_llama.sh KVEVICT_LLAMA KVEVICT LLAMA_PLAIN OUTCHECK LIBDIR SOURCE_DIR [quick] -
# kvevict inside llama.cpp (docs/llama.cpp.md), end to end on the committed
# model:
#  - full-cache logits of kvevict-llama equal plain llama.cpp decoding
#    (tests/llama_plain.c, linked against libllama, no callback) bit for bit,
#    at batch 1 and at batch 8 (--batch), without a policy and with one whose
#    budget is never reached (the eval callback and the bank change no bit of
#    llama.cpp's arithmetic); a prompt in batches of B holds at most budget +
#    B cells, and reaches it; with
#    eviction, the logits follow the decoder's (`kvevict lm logits
#    --same-positions`) within 0.05 and keep its argmax at 98% of positions;
#  - `kvevict-llama eval` and `kvevict lm eval --same-positions` agree within
#    0.01 bits per byte for h2o, tova, streaming, knorm (run at
#    recent_window 1 on both sides: llama.cpp cannot drop the newest
#    position) and expected_attention:recent_window=32 at budgets 51 and 102,
#    on the first 9000 bytes of the held-out text (6 windows: the whole text
#    is make llama-docs's), with max_cells at most budget + 1; and the
#    committed h2o row at 51 of docs/data/llama-eval.jsonl (the whole text)
#    is re-made within 0.001 (llama.cpp picks its CPU kernels at run time);
#  - a 10,000-token generation at budget 64 through a context of 256 cells,
#    at most 65 cells held; --samples K equals K separate runs (random
#    included: --policy-seed); --top-k 1 and a tiny --top-p are greedy; the
#    greedy text equals `kvevict lm generate --same-positions`'s for h2o,
#    streaming, tova and expected_attention; a resumed session equals an
#    uninterrupted run (its JSON seed null), and corrupted (a flags field
#    named), truncated and foreign sessions are refused, left as they were;
#  - `eval --budget 10%` is --budget 51; `lm passkey --same-positions` rows
#    carry same_positions and differ from per head; `bench` gives its rows;
#  - `kvevict lm logits --products llama` follows llama.cpp on every type its
#    quantizer's presets write (the block below says to what), and bits per
#    byte of `kvevict lm eval --policy full` (both --products) follow
#    `kvevict-llama eval`'s within 0.005 on each type's file of kjv;
#  With QUICK (the sanitizer build's run) the eval comparison takes one
#  window and h2o and streaming, and the drift and 10,000-token checks are
#  left to the native run.
#  - bad input (a truncated GGUF, a file that is no GGUF, a GGUF of an
#    architecture llama.cpp does not know, a bad spec, a
#    budget above the context, vnorm=1, a missing llama.cpp) gets one line
#    on stderr and exit 1.
set -u
KL=${1:?usage: test_llama.sh KVEVICT_LLAMA KVEVICT LLAMA_PLAIN OUTCHECK LIBDIR SOURCE_DIR}
K=${2:?usage}
PLAIN=${3:?usage}
J=${4:?usage}
LIB=${5:?usage}
SRC=${6:?usage}
QUICK=${7:-}
cd "$SRC" || exit 1
M=models/kjv.gguf
if [ ! -f "$M" ]; then
    echo "test_llama: no $M here: skipped"
    exit 77
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/kve-llama.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }
# One thread each: ggml's threads spin between the graph's pieces, and the
# tests run two at a time on two cores.
kl() { "$KL" "$@" --threads 1; }

# ---- logits ----
toks=$(awk 'BEGIN { s = "1"; for (i = 1; i < 200; i++) s = s "," (3 + (i * 577) % 1000); print s }')
# plain llama.cpp at batch B (llama_plain's BATCH) against kvevict-llama
# --batch B, bit for bit: without a policy and with h2o at budget 512 (no
# eviction: the eval callback and the bank change no bit of llama.cpp's)
full_cache_equal() { # B: writes $W/plain-B.jsonl
    "$PLAIN" "$LIB" "$M" "$toks" 1 "$1" >"$W/plain-$1.jsonl" 2>"$W/err" ||
        bad "llama_plain at batch $1: $(cat "$W/err")"
    kl logits --model "$M" --tokens "$toks" --batch "$1" -o "$W/none.jsonl" ||
        bad "kvevict-llama logits --batch $1"
    kl logits --model "$M" --tokens "$toks" --batch "$1" --policy h2o --budget 512 -o "$W/h2o512.jsonl" ||
        bad "kvevict-llama logits --batch $1 --policy h2o --budget 512"
    for f in plain-$1 none; do
        "$J" jsonl --count 200 --key pos:number --key token:number --key logits:array "$W/$f.jsonl" ||
            bad "$f at batch $1: not 200 JSON lines of pos, token, logits"
    done
    cmp -s "$W/plain-$1.jsonl" "$W/none.jsonl" ||
        bad "logits at batch $1 without a policy differ from plain llama.cpp's"
    cmp -s "$W/plain-$1.jsonl" "$W/h2o512.jsonl" ||
        bad "logits at batch $1 with h2o at budget 512 (no eviction) differ from plain llama.cpp's"
}
full_cache_equal 1
cp "$W/plain-1.jsonl" "$W/plain.jsonl"
spec=h2o:recent_window=8
kl logits --model "$M" --tokens "$toks" --policy $spec --budget 32 -o "$W/kl.jsonl" ||
    bad "kvevict-llama logits --policy $spec --budget 32"
"$K" lm logits --threads 1 --model "$M" --tokens "$toks" --policy $spec --budget 32 --same-positions \
    -o "$W/kv.jsonl" || bad "kvevict lm logits --same-positions"
paste -d '\n' "$W/kl.jsonl" "$W/kv.jsonl" | awk '
    { gsub(/.*"logits": \[/, ""); gsub(/\]\}/, ""); n = split($0, v, ", ") }
    NR % 2 == 1 { for (i = 1; i <= n; i++) a[i] = v[i]; next }
    { ia = 1; ib = 1; for (i = 1; i <= n; i++) { d = a[i] - v[i]; if (d < 0) d = -d
        if (d > worst) worst = d; if (a[i] > a[ia]) ia = i; if (v[i] > v[ib]) ib = i }
      same += ia == ib; rows++ }
    END { printf "logits under eviction: worst difference %.4f, argmax agreement %d of %d\n",
          worst, same, rows; exit !(rows == 200 && worst <= 0.05 && same >= 0.98 * rows) }' ||
    bad "kvevict-llama's logits under eviction do not follow the decoder's"

# ---- batches: --batch N against plain llama.cpp decoding N tokens a call ----
# llama.cpp's logits of a batch of several tokens are not its one-token
# logits bit for bit (other kernels for several rows), so like is compared
# with like: llama_plain at batch 8 against kvevict-llama --batch 8, as at
# batch 1 above; the difference between llama.cpp's batch 8 and batch 1 is
# printed (and held to the 0.05 of the comparisons above). Under eviction, a batch of B tokens
# attends the kept positions and the batch: a prompt of many batches reaches
# budget + B cells and no more (llama.cpp's mask, max_cells).
full_cache_equal 8
paste -d '\n' "$W/plain.jsonl" "$W/plain-8.jsonl" | awk '
    { gsub(/.*"logits": \[/, ""); gsub(/\]\}/, ""); n = split($0, v, ", ") }
    NR % 2 == 1 { for (i = 1; i <= n; i++) a[i] = v[i]; next }
    { ia = 1; ib = 1; w = 0; for (i = 1; i <= n; i++) { d = a[i] - v[i]; if (d < 0) d = -d
        if (d > w) w = d; if (a[i] > a[ia]) ia = i; if (v[i] > v[ib]) ib = i }
      if (w > worst) worst = w; equal += w == 0; same += ia == ib; rows++ }
    END { printf "llama.cpp at batch 8 against batch 1: worst difference %.4f, %d of %d rows equal, argmax %d of %d\n",
          worst, equal, rows, same, rows
          exit !(rows == 200 && worst <= 0.05 && same >= 0.98 * rows) }' ||
    bad "llama.cpp's batched logits are not its one-token logits within 0.05"
head -c 600 models/heldout.txt | tr '\n' ' ' >"$W/prompt600.txt"
for B in 8 40; do
    kl generate --model "$M" --prompt "$(cat "$W/prompt600.txt")" -n 5 --policy h2o:recent_window=8 \
        --budget 24 --batch $B --json >"$W/batch.json" 2>"$W/err" || bad "a prompt in batches of $B: $(cat "$W/err")"
    awk -v B=$B '{ p = $0; sub(/.*"positions": /, "", p); sub(/,.*/, "", p)
           c = $0; sub(/.*"max_cells": /, "", c); sub(/,.*/, "", c)
           printf "a prompt of %d positions in batches of %d at budget 24: at most %s cells\n", p, B, c
           exit !(p + 0 >= 3 * B && c + 0 == 24 + B) }' "$W/batch.json" ||
        bad "a prompt in batches of $B: max_cells is not budget + batch"
done

# ---- RoPE scaling: the decoder reads a GGUF's as llama.cpp does ----
# kvevict-convert writes the committed model with each scaling llama.cpp
# reads (llama.rope.scaling.* and a rope_freqs.weight of Llama 3's factors);
# the decoder's full-cache logits must follow plain llama.cpp's on the same
# file (within 0.05, argmax at 98% of positions), and llama.cpp's must move
# (by more than 1) from the unscaled file's, so that the scaling is in force.
CONV=$(dirname "$K")/kvevict-convert
for spec in linear:2 yarn:4,orig=128 llama3:8,orig=64 linear:1.5,attn=1.2; do
    f="$W/rope-$(echo "$spec" | tr ':,=' '___').gguf"
    "$CONV" --model "$M" --to gguf --rope-scaling "$spec" -o "$f" 2>"$W/err" ||
        { bad "kvevict-convert --rope-scaling $spec: $(cat "$W/err")"; continue; }
    "$PLAIN" "$LIB" "$f" "$toks" >"$W/rs-plain.jsonl" 2>"$W/err" ||
        { bad "llama_plain on --rope-scaling $spec: $(cat "$W/err")"; continue; }
    "$K" lm logits --threads 1 --model "$f" --tokens "$toks" -o "$W/rs-kv.jsonl" ||
        { bad "kvevict lm logits on --rope-scaling $spec"; continue; }
    paste -d '\n' "$W/rs-plain.jsonl" "$W/rs-kv.jsonl" "$W/plain.jsonl" | awk -v spec="$spec" '
        { gsub(/.*"logits": \[/, ""); gsub(/\]\}/, ""); n = split($0, v, ", ") }
        NR % 3 == 1 { for (i = 1; i <= n; i++) a[i] = v[i]; next }
        NR % 3 == 2 { ia = 1; ib = 1; for (i = 1; i <= n; i++) { d = a[i] - v[i]; if (d < 0) d = -d
            if (d > worst) worst = d; if (a[i] > a[ia]) ia = i; if (v[i] > v[ib]) ib = i }
          same += ia == ib; rows++; next }
        { for (i = 1; i <= n; i++) { d = a[i] - v[i]; if (d < 0) d = -d; if (d > moved) moved = d } }
        END { printf "rope scaling %s: worst difference to llama.cpp %.4f, argmax agreement %d of %d, llama.cpp moved by %.2f from the unscaled file\n",
              spec, worst, same, rows, moved
              exit !(rows == 200 && worst <= 0.05 && same >= 0.98 * rows && moved > 1) }' ||
        bad "the decoder does not follow llama.cpp on --rope-scaling $spec"
    # expected attention reads the rotation: kvevict-llama hands it the same
    # scaled kve_rope as the decoder (its logits under eviction follow the
    # decoder's --same-positions), Llama 3's rope_freqs too: both carry them
    # as kve_rope.freq_factors (lm_model_rope; kvevict-llama reads the tensor
    # from the file)
    ea="expected_attention:recent_window=8,n_future_positions=64"
    kl logits --model "$f" --tokens "$toks" --policy "$ea" --budget 32 -o "$W/rs-kl.jsonl" \
        2>"$W/err-kl"
    rkl=$?
    "$K" lm logits --threads 1 --model "$f" --tokens "$toks" --policy "$ea" --budget 32 \
        --same-positions -o "$W/rs-kd.jsonl" 2>"$W/err-kd"
    rkd=$?
    case $spec in
    *)
        [ $rkl -eq 0 ] && [ $rkd -eq 0 ] || { bad "expected attention on --rope-scaling $spec: kvevict-llama exit $rkl ($(cat "$W/err-kl")), decoder exit $rkd ($(cat "$W/err-kd"))"; continue; }
        paste -d '\n' "$W/rs-kl.jsonl" "$W/rs-kd.jsonl" | awk -v spec="$spec" '
            { gsub(/.*"logits": \[/, ""); gsub(/\]\}/, ""); n = split($0, v, ", ") }
            NR % 2 == 1 { for (i = 1; i <= n; i++) a[i] = v[i]; next }
            { ia = 1; ib = 1; for (i = 1; i <= n; i++) { d = a[i] - v[i]; if (d < 0) d = -d
                if (d > worst) worst = d; if (a[i] > a[ia]) ia = i; if (v[i] > v[ib]) ib = i }
              same += ia == ib; rows++ }
            END { printf "rope scaling %s, expected attention at 32: kvevict-llama against the decoder %.4f, argmax %d of %d\n",
                  spec, worst, same, rows
                  exit !(rows == 200 && worst <= 0.05 && same >= 0.98 * rows) }' ||
            bad "kvevict-llama's expected attention on --rope-scaling $spec does not follow the decoder's"
        ;;
    esac
done

# ---- the decoder's --products llama against llama.cpp, every preset type ----
# scripts/llama-agreement.sh (make llama-agreement's rows): llama.cpp's
# quantizer writes each type from the committed model (kjv, 128 wide) and
# from a random 256-wide model; plain llama.cpp's logits over 200 tokens
# against `kvevict lm logits --products llama` and `exact`; on kjv, bits per
# byte of the first 9000 held-out bytes with the full cache by llama.cpp and
# by the decoder both ways. Held to, on every type of both models (issue
# 28's target, the same for every type): every logit of `llama` within
# 0.005 of its row's largest and the argmax at 98% of rows (196 of 200);
# where the CPU back end ggml loaded is a variant the decoder follows
# (lm_llama_cpu), every row bit for bit; bits per byte within 0.005 of
# llama.cpp's both ways. docs/data/llama-agreement.jsonl's rows are re-made
# exactly where they were measured on the same CPU back end, else their
# `exact` bits per byte (the decoder's own arithmetic, the same everywhere).
# Then each other variant this CPU runs, loaded from a folder of its own,
# against `--products llama:VARIANT` on kjv: every row bit for bit. Native
# run only.
if [ -z "$QUICK" ]; then
    B=$(dirname "$K")
    KVEVICT_LLAMA_LIB=$LIB sh scripts/llama-agreement.sh "$B" "$W/agree.jsonl" 2>"$W/err" ||
        bad "scripts/llama-agreement.sh: $(cat "$W/err")"
    # hold FILE BITEXACT: each row printed and held (BITEXACT = 1: every row
    # of llama bit for bit)
    hold() {
        awk -v exact="$2" '
            function val(k,  m) { if (match($0, "\"" k "\": [^,}]*")) { m = substr($0, RSTART, RLENGTH)
                sub(/^"[^"]*": /, "", m); gsub(/"/, "", m); return m } return "" }
            function num(k) { return val(k) + 0 }
            function abs(x) { return x < 0 ? -x : x }
            { r = val("rows"); line = sprintf("%-4s %-6s llama: worst %.4f, argmax %d/%d, %d rows equal",
                  val("model"), val("type"), val("llama_worst"), val("llama_argmax"), r, val("llama_equal"))
              if (val("exact_worst") != "")
                  line = line sprintf("; exact: %.4f, %d/%d", val("exact_worst"), val("exact_argmax"), r)
              if (val("bpb_llama_cpp") != "")
                  line = line sprintf("; bits/byte llama.cpp %.4f, llama %+.5f, exact %+.5f",
                      val("bpb_llama_cpp"), val("bpb_delta_llama"), val("bpb_delta_exact"))
              print line; n++
              if (r + 0 != 200 || num("llama_worst") > 0.005 || num("llama_argmax") < 196 ||
                  (exact == 1 && num("llama_equal") != 200)) { print "  off the target"; bad = 1 }
              if (val("bpb_llama_cpp") != "" && (abs(num("bpb_delta_llama")) > 0.005 ||
                  abs(num("bpb_delta_exact")) > 0.005)) { print "  bits per byte off"; bad = 1 } }
            END { exit bad || n == 0 }' "$1"
    }
    here=$(sed -n '1s/.*"variant": "\([^"]*\)".*/\1/p' "$W/agree.jsonl")
    echo "llama.cpp's CPU back end here: $(sed -n '1s/.*"cpu": "\([^"]*\)".*/\1/p' "$W/agree.jsonl") (the decoder's variant: ${here:-none it follows})"
    [ "$(wc -l <"$W/agree.jsonl")" -eq 28 ] || bad "llama-agreement: not 28 rows"
    hold "$W/agree.jsonl" "$([ -n "$here" ] && echo 1 || echo 0)" ||
        bad "--products llama does not follow llama.cpp"
    committed=docs/data/llama-agreement.jsonl
    if [ ! -f $committed ]; then
        bad "$committed is missing (make llama-agreement)"
    elif [ "$(sed -n '1s/.*"cpu": "\([^"]*\)".*/\1/p' $committed)" = \
           "$(sed -n '1s/.*"cpu": "\([^"]*\)".*/\1/p' "$W/agree.jsonl")" ]; then
        cmp -s $committed "$W/agree.jsonl" || bad "$committed drifted: $(diff $committed "$W/agree.jsonl" | head -4)"
    else
        for f in $committed "$W/agree.jsonl"; do
            sed -n 's/.*"type": "\([^"]*\)".*"bpb_exact": \([^,]*\),.*/\1 \2/p' "$f"
        done | awk '{ if ($1 in v) { if (v[$1] != $2) bad = 1; n++ } else v[$1] = $2 }
                    END { exit bad || n != 14 }' ||
            bad "$committed drifted: the exact bits per byte differ"
    fi
    for v in avx2 avx512 avx512-bf16; do
        [ "$v" = "$here" ] && continue
        KVEVICT_LLAMA_LIB=$LIB sh scripts/llama-agreement.sh "$B" "$W/agree-$v.jsonl" $v 2>"$W/err"
        rc=$?
        if [ $rc -eq 77 ]; then
            echo "the $v variant: $(cat "$W/err")"
            continue
        fi
        [ $rc -eq 0 ] || { bad "scripts/llama-agreement.sh $v: $(cat "$W/err")"; continue; }
        echo "the $v variant (--products llama:$v against its library):"
        [ "$(wc -l <"$W/agree-$v.jsonl")" -eq 14 ] && hold "$W/agree-$v.jsonl" 1 ||
            bad "--products llama:$v does not follow llama.cpp's $v library"
    done
fi
"$K" lm logits --model "$M" --tokens 1 --products fast >/dev/null 2>"$W/err"
[ $? -eq 2 ] && grep -q "neither 'llama' nor 'exact'" "$W/err" || bad "--products fast: not a usage error"
"$K" lm logits --model "$M" --tokens 1 --products llama:avx3 >/dev/null 2>"$W/err"
[ $? -eq 2 ] && grep -q "none of avx2, avx512, avx512-bf16" "$W/err" ||
    bad "--products llama:avx3: not a usage error"

# ---- eval: llama.cpp against the decoder ----
head -c 9000 models/heldout.txt >"$W/text.txt"
pol="h2o,tova,streaming,knorm:recent_window=1,expected_attention:recent_window=32"
rows=11
if [ -n "$QUICK" ]; then
    head -c 1500 models/heldout.txt >"$W/text.txt"
    pol=h2o,streaming
    rows=5
fi
kl eval --model "$M" --text "$W/text.txt" --policy knorm --budget 51 --json -o "$W/raised.jsonl" \
    2>"$W/err" || bad "kvevict-llama eval knorm"
grep -q 'recent_window 0 raised to 1' "$W/err" || bad "knorm's recent window 0: no warning"
grep -q '"policy": "knorm:budget=51,recent_window=1"' "$W/raised.jsonl" ||
    bad "knorm: the rows do not name the spec that ran"
# a budget written P% is that share of the model's context (512: 10% is 51),
# as in `kvevict lm eval`: the same rows as the count; in batches of 8,
# every window reaches budget + 8 cells
head -c 1500 models/heldout.txt >"$W/short.txt"
kl eval --model "$M" --text "$W/short.txt" --policy h2o,streaming --budget 10% --json --quiet \
    -o "$W/pct.jsonl" || bad "kvevict-llama eval --budget 10%"
kl eval --model "$M" --text "$W/short.txt" --policy h2o,streaming --budget 51 --json --quiet \
    -o "$W/b51.jsonl" || bad "kvevict-llama eval --budget 51"
grep -q '"policy": "h2o:budget=51,' "$W/pct.jsonl" && cmp -s "$W/pct.jsonl" "$W/b51.jsonl" ||
    bad "eval --budget 10% is not --budget 51 on a context of 512"
kl eval --model "$M" --text "$W/short.txt" --policy h2o,streaming --budget 51 --batch 8 --json --quiet \
    -o "$W/b51-8.jsonl" || bad "kvevict-llama eval --batch 8"
awk '/"budget": 51/ { c = $0; sub(/.*"max_cells": /, "", c); sub(/[,}].*/, "", c); n++
         printf "eval in batches of 8 at budget 51: at most %s cells\n", c; if (c + 0 != 59) bad = 1 }
     END { exit bad || n != 2 }' "$W/b51-8.jsonl" || bad "eval --batch 8: max_cells is not budget + 8"
# kvevict's own threads (--kv-threads: the rows of a share of the layers
# each, the bank stepped by the main thread) change no bit: 3 threads over
# the model's 4 layers (1, 1 and 2 layers), a token at a time and in batches
for b in 1 8; do
    f=b51.jsonl; [ "$b" = 8 ] && f=b51-8.jsonl
    kl eval --model "$M" --text "$W/short.txt" --policy h2o,streaming --budget 51 --batch $b \
        --kv-threads 3 --json --quiet -o "$W/kvt-$b.jsonl" || bad "kvevict-llama eval --kv-threads 3"
    cmp -s "$W/$f" "$W/kvt-$b.jsonl" || bad "eval --kv-threads 3 --batch $b is not one thread's bits"
done
echo "eval with 3 kvevict threads at batches 1 and 8: one thread's bits"
kl eval --model "$M" --text "$W/text.txt" --policy "$pol" --budget 51,102 --json --quiet \
    -o "$W/kl-eval.jsonl" || bad "kvevict-llama eval"
"$K" lm eval --threads 1 --model "$M" --text "$W/text.txt" --policy "$pol" --budget 51,102 --same-positions \
    --json --quiet -o "$W/kv-eval.jsonl" || bad "kvevict lm eval --same-positions"
"$J" jsonl --count $rows --key policy:string --key bits_per_byte:number --key max_cells:number \
    --key n_ctx:number --key 'same_positions:number|null' "$W/kl-eval.jsonl" ||
    bad "kvevict-llama eval: not $rows rows with the keys of lm eval and max_cells"
cat "$W/kl-eval.jsonl" "$W/kv-eval.jsonl" | awk -v rows=$rows '
    function val(k,  m) { if (match($0, "\"" k "\": [^,}]*")) { m = substr($0, RSTART, RLENGTH)
        sub(/^"[^"]*": /, "", m); gsub(/"/, "", m); return m } return "" }
    { key = val("policy") "@" val("budget") }
    NR <= rows { kl[key] = val("bits_per_byte"); cells[key] = val("max_cells"); b[key] = val("budget")
               ntok[key] = val("tokens"); next }
    { if (!(key in kl)) { print "no kvevict-llama row for " key; bad = 1; next }
      if (ntok[key] != val("tokens")) { print key ": llama.cpp tokenized " ntok[key] " tokens, kvevict " val("tokens"); bad = 1 }
      d = kl[key] - val("bits_per_byte"); if (d < 0) d = -d
      printf "%-70s llama.cpp %.4f  kvevict %.4f  |d| %.4f  max_cells %s\n", key, kl[key],
             val("bits_per_byte"), d, cells[key]
      if (d > 0.01) bad = 1
      if (b[key] != "null" && cells[key] + 0 > b[key] + 1) { print key ": max_cells above budget + 1"; bad = 1 }
      seen++ }
    END { exit bad || seen != rows }' || bad "eval: kvevict-llama and kvevict lm eval --same-positions disagree"
# `kvevict lm passkey --same-positions`: the rows say so and the option is in
# force: tova at budget 128 recalls the key at distance 200 under same
# positions on every prompt of 16, and per head on few (measured 16 and 1)
if [ -z "$QUICK" ]; then
    for sp in --same-positions ""; do
        "$K" lm passkey --threads 1 --model "$M" --text models/heldout.txt --policy tova --budget 128 \
            --distances 200 --trials 16 --json --quiet $sp | grep '"policy": "tova' >"$W/pk$sp" ||
            bad "kvevict lm passkey $sp"
    done
    grep -q '"same_positions": 1,' "$W/pk--same-positions" && ! grep -q same_positions "$W/pk" ||
        bad "lm passkey --same-positions: its row does not carry same_positions 1"
    awk 'function val(k,  m) { if (match($0, "\"" k "\": [^,}]*")) { m = substr($0, RSTART, RLENGTH)
             sub(/^"[^"]*": /, "", m); return m } return "" }
         { a[NR] = val("accuracy") }
         END { printf "lm passkey, tova at 128, distance 200: accuracy %s with --same-positions, %s per head\n", a[1], a[2]
               exit !(NR == 2 && a[1] != a[2]) }' "$W/pk--same-positions" "$W/pk" ||
        bad "lm passkey --same-positions: the same accuracy as per head (is the option ignored?)"
fi
# the committed row of the whole text
if [ -n "$QUICK" ]; then
    :
elif [ -f docs/data/llama-eval.jsonl ]; then
    want=$(grep '"engine": "llama.cpp"' docs/data/llama-eval.jsonl |
        grep '"policy": "h2o:budget=51,recent_window=32"' | sed 's/.*"bits_per_byte": \([^,]*\),.*/\1/')
    kl eval --model "$M" --text models/heldout.txt --policy h2o --budget 51 --json --quiet \
        -o "$W/full.jsonl" || bad "kvevict-llama eval on the held-out text"
    got=$(grep '"policy": "h2o' "$W/full.jsonl" | sed 's/.*"bits_per_byte": \([^,]*\),.*/\1/')
    awk -v a="$want" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d
        printf "docs/data/llama-eval.jsonl h2o@51: committed %s, now %s\n", a, b
        exit !(a != "" && b != "" && d <= 0.001) }' || bad "docs/data/llama-eval.jsonl drifted"
else
    bad "docs/data/llama-eval.jsonl is missing (make llama-docs)"
fi

# ---- generate: bounded memory, samples, sessions ----
# docs/llama.cpp.md's three commands: llama.cpp's quantizer, then the generation
kl quantize --model "$M" -o "$W/kjv-q8_0.gguf" --type Q8_0 2>"$W/err" || bad "quantize: $(cat "$W/err")"
long=10000
[ -n "$QUICK" ] && long=600
kl generate --model "$W/kjv-q8_0.gguf" --prompt "In the beginning" -n $long --policy h2o --budget 64 --json \
    >"$W/long.json" 2>"$W/err" || bad "a $long-token generation: $(cat "$W/err")"
awk -v long=$long '{ p = $0; sub(/.*"positions": /, "", p); sub(/,.*/, "", p)
       c = $0; sub(/.*"max_cells": /, "", c); sub(/,.*/, "", c)
       x = $0; sub(/.*"n_ctx": /, "", x); sub(/[,}].*/, "", x)
       printf "%d tokens at budget 64: %s positions, at most %s cells, a context of %s\n", long, p, c, x
       exit !(p + 0 > long && c + 0 == 65 && x + 0 == 256) }' "$W/long.json" ||
    bad "the long generation was not bounded"
# --samples 3 equals three separate runs (seeds 5, 6, 7) of every policy,
# random too: its victims come from --policy-seed's streams, never from the
# sampler's --seed, so a fork's bank is a separate run's
strip() { sed 's/"sample": [0-9]*, //; s/, "n_ctx": [0-9]*//'; }
samples_equal_runs() { # NAME GENERATE-ARGS...
    name=$1
    shift
    kl generate "$@" --samples 3 --seed 5 2>/dev/null | strip >"$W/$name-3" || bad "--samples 3 of $name"
    for s in 5 6 7; do
        kl generate "$@" --seed $s 2>/dev/null
    done | strip >"$W/$name-1"
    [ "$(wc -l <"$W/$name-3")" -eq 3 ] && cmp -s "$W/$name-3" "$W/$name-1" ||
        bad "--samples 3 of $name differ from three separate runs"
}
gen="--model $M --prompt And_God_said -n 80 --policy h2o:recent_window=8 --budget 24 --temp 0.9 --json"
samples_equal_runs h2o $gen
rgen="--model $M --prompt And_God_said -n 60 --policy random:recent_window=4 --budget 24 --temp 0.9 --json"
samples_equal_runs random $rgen
# --policy-seed is in force: another one moves random's text
kl generate $rgen --seed 5 --policy-seed 9 2>/dev/null | strip >"$W/r9" || bad "--policy-seed 9"
[ -s "$W/r9" ] && ! head -1 "$W/random-1" | cmp -s - "$W/r9" || bad "--policy-seed 9 changed nothing of random's text"

# the sampler's options: --top-k 1 and a tiny --top-p leave one candidate,
# the greedy choice, whatever the temperature; top-k and top-p at a
# temperature repeat with their seed and act (another top-k moves the text)
toks_of() { sed 's/.*"tokens": \[//; s/\].*//'; }
sgen="--model $M --prompt And_God_said -n 40 --policy h2o:recent_window=8 --budget 24 --json"
kl generate $sgen 2>/dev/null | toks_of >"$W/greedy" || bad "greedy"
kl generate $sgen --temp 0.9 --seed 3 --top-k 1 2>/dev/null | toks_of >"$W/k1tok" || bad "--top-k 1"
kl generate $sgen --temp 0.9 --seed 3 --top-p 0.000001 2>/dev/null | toks_of >"$W/p0tok" || bad "--top-p 1e-6"
kl generate $sgen --temp 0.9 --seed 3 2>/dev/null | toks_of >"$W/t09" || bad "--temp 0.9"
cmp -s "$W/greedy" "$W/k1tok" || bad "--top-k 1 is not greedy"
cmp -s "$W/greedy" "$W/p0tok" || bad "--top-p 0.000001 is not greedy"
cmp -s "$W/greedy" "$W/t09" && bad "--temp 0.9 drew the greedy text: the checks above test nothing"
kl generate $sgen --temp 0.9 --seed 9 --top-k 5 --top-p 0.9 2>/dev/null >"$W/kp1" || bad "--top-k 5 --top-p 0.9"
kl generate $sgen --temp 0.9 --seed 9 --top-k 5 --top-p 0.9 2>/dev/null >"$W/kp2" || bad "--top-k 5 --top-p 0.9"
cmp -s "$W/kp1" "$W/kp2" || bad "--top-k 5 --top-p 0.9 --seed 9 twice: not bit-identical"
kl generate $sgen --temp 0.9 --seed 9 --top-k 0 --top-p 1 2>/dev/null >"$W/kp0" || bad "--top-k 0 --top-p 1"
cmp -s "$W/kp1" "$W/kp0" && bad "--top-k 5 --top-p 0.9 changed nothing against --top-k 0 --top-p 1"

# the decoder's twin: `kvevict lm generate --same-positions` writes the text
# kvevict-llama writes, greedy, for policies whose choices the two decoders'
# last-bit differences do not move (knorm's key norms nearly tie: measured
# equal for its first 50 tokens, then not; docs/llama.cpp.md)
for p in h2o:recent_window=8 streaming tova expected_attention:recent_window=8; do
    kl generate --model "$M" --prompt "And God said" -n 80 --policy $p --budget 24 >"$W/gl" 2>"$W/err" ||
        bad "kvevict-llama generate --policy $p: $(cat "$W/err")"
    "$K" lm generate --threads 1 --model "$M" --prompt "And God said" --steps 80 --policy $p --budget 24 \
        --same-positions >"$W/gd" 2>"$W/err" || bad "kvevict lm generate --same-positions --policy $p: $(cat "$W/err")"
    [ "$(wc -c <"$W/gl")" -gt 200 ] && cmp -s "$W/gl" "$W/gd" ||
        bad "greedy text of $p: kvevict-llama and kvevict lm generate --same-positions differ"
done
sess="--model $M --policy h2o:recent_window=8 --budget 24 --temp 0.9"
kl generate $sess --seed 3 --prompt "And God said" -n 50 --session "$W/s.bin" >"$W/a1" 2>/dev/null ||
    bad "--session (new)"
cp "$W/s.bin" "$W/s0.bin"
kl generate $sess -n 50 --session "$W/s.bin" >"$W/a2" 2>/dev/null || bad "--session (resumed)"
# the JSON's seed: the sampler's, null where a resumed run continues the file's generator
cp "$W/s0.bin" "$W/sj.bin"
kl generate $sess -n 3 --session "$W/sj.bin" --json 2>/dev/null | grep -q '"seed": null,' ||
    bad "a resumed session's seed is not null"
cp "$W/s0.bin" "$W/sj.bin"
kl generate $sess -n 3 --session "$W/sj.bin" --seed 8 --json 2>/dev/null | grep -q '"seed": 8,' ||
    bad "a resumed session reseeded by --seed 8 does not say 8"
kl generate $sess --seed 3 --prompt "And God said" -n 100 >"$W/b" 2>/dev/null || bad "uninterrupted"
[ "$(cat "$W/a1" "$W/a2" | tr -d '\n')" = "$(tr -d '\n' <"$W/b")" ] ||
    bad "a resumed session differs from an uninterrupted run"
refuse() { # WHAT FILE ARGS...: exit 1, one line, FILE unchanged
    what=$1 f=$2
    shift 2
    cp "$f" "$W/before"
    kl "$@" >/dev/null 2>"$W/err"
    rc=$?
    [ "$rc" -eq 1 ] && [ "$(wc -l <"$W/err")" -eq 1 ] || bad "$what: exit $rc, stderr: $(cat "$W/err")"
    cmp -s "$f" "$W/before" || bad "$what: the file changed"
}
cp "$W/s0.bin" "$W/c.bin"
printf 'x' | dd of="$W/c.bin" bs=1 seek=700 conv=notrunc 2>/dev/null
refuse "a corrupted session" "$W/c.bin" generate $sess -n 5 --session "$W/c.bin"
# a flags field set (the file's, then the sequence's inside it, the checksum
# made again so that the flags are what is read): refused, naming the flags
setflag() { # IN OUT WHICH: WHICH 0 the session's flags, 1 the sequence's
    perl -e 'use integer; local $/; open(my $f, "<", $ARGV[0]) or die; binmode $f; my $d = <$f>;
        sub fnv { my $h = -3750763034362895579; $h = ($h ^ $_) * 1099511628211 for unpack("C*", $_[0]); $h }
        die "the checksum is not FNV-1a 64\n" if fnv(substr($d, 0, -8)) != unpack("q<", substr($d, -8));
        my $at = $ARGV[2] ? 32 + 4 * unpack("Q<", substr($d, 24, 8)) + 40 + 12 : 12;
        die "no sequence state at $at\n" if $ARGV[2] && substr($d, $at - 12, 8) ne "kvlseq\0\0";
        substr($d, $at, 4) = pack("V", 4);
        substr($d, -8) = pack("q<", fnv(substr($d, 0, -8)));
        open(my $o, ">", $ARGV[1]) or die; binmode $o; print $o $d' "$@"
}
for which in 0 1; do
    setflag "$W/s0.bin" "$W/fl.bin" $which 2>"$W/err" || bad "setflag: $(cat "$W/err")"
    refuse "a session's flags field ($which)" "$W/fl.bin" generate $sess -n 5 --session "$W/fl.bin"
    grep -q 'flags 0x4' "$W/err" && ! grep -q 'version 1, this' "$W/err" ||
        bad "a flags field: the line does not name the flags: $(cat "$W/err")"
done
# the first kept key's float32 with its lowest bit set (the checksum made
# again): no half float, as the key copy holds them (an older
# kvevict-llama's session kept float32 keys), refused, naming the value
perl -e 'use integer; local $/; open(my $f, "<", $ARGV[0]) or die; binmode $f; my $d = <$f>;
    sub fnv { my $h = -3750763034362895579; $h = ($h ^ $_) * 1099511628211 for unpack("C*", $_[0]); $h }
    my $s = 32 + 4 * unpack("Q<", substr($d, 24, 8)) + 40;
    die "no sequence state at $s\n" if substr($d, $s, 8) ne "kvlseq\0\0";
    my $spec = unpack("V", substr($d, $s + 80, 4));
    my $at = $s + 84 + $spec + 8 + unpack("Q<", substr($d, $s + 84 + $spec, 8));
    substr($d, $at, 4) = pack("V", unpack("V", substr($d, $at, 4)) | 1);
    substr($d, -8) = pack("q<", fnv(substr($d, 0, -8)));
    open(my $o, ">", $ARGV[1]) or die; binmode $o; print $o $d' "$W/s0.bin" "$W/k.bin" 2>"$W/err" ||
    bad "setkey: $(cat "$W/err")"
refuse "a session key that is no half float" "$W/k.bin" generate $sess -n 5 --session "$W/k.bin"
grep -q 'key value 0 (.*) is not a half float' "$W/err" ||
    bad "a float32 key: the line does not name it: $(cat "$W/err")"
head -c 3000 "$W/s0.bin" >"$W/t.bin"
refuse "a truncated session" "$W/t.bin" generate $sess -n 5 --session "$W/t.bin"
# a header stating more bytes than a session of its tokens can hold: refused
# before anything past the header is read, from a file and from a FIFO that
# would never end (kvl_seq_state_bound)
perl -e 'local $/; my $d = <STDIN>; substr($d, 16, 8) = pack("Q<", 1 << 40); print $d' \
    <"$W/s0.bin" >"$W/big.bin"
refuse "a session stating 2^40 bytes" "$W/big.bin" generate $sess -n 5 --session "$W/big.bin"
grep -q "not a session's size (at most" "$W/err" || bad "2^40 bytes: $(cat "$W/err")"
rm -f "$W/fifo.bin" && mkfifo "$W/fifo.bin"
(head -c 32 "$W/big.bin"; head -c 400000000 /dev/zero) >"$W/fifo.bin" 2>/dev/null &
feeder=$!
kl generate $sess -n 5 --session "$W/fifo.bin" >/dev/null 2>"$W/err"
rc=$?
kill $feeder 2>/dev/null; wait $feeder 2>/dev/null
[ "$rc" -eq 1 ] && grep -q "not a session's size" "$W/err" ||
    bad "a FIFO stating 2^40 bytes: exit $rc, $(cat "$W/err")"
rm -f "$W/fifo.bin"
cp "$W/s0.bin" "$W/f.bin"
refuse "another policy's session" "$W/f.bin" generate --model "$M" --policy tova --budget 24 -n 5 \
    --session "$W/f.bin"
refuse "a session without a policy" "$W/f.bin" generate --model "$M" -n 5 --session "$W/f.bin"
cp "$M" "$W/notsession.bin"
refuse "a GGUF as a session" "$W/notsession.bin" generate $sess -n 5 --session "$W/notsession.bin"

# ---- bench: a smoke run (its JSON's shape, never its timings) ----
kl bench --model "$M" --policy h2o:recent_window=8,expected_attention:recent_window=1 --budget 48 \
    --tokens 4 --repeats 1 --json >"$W/bench.jsonl" 2>"$W/err" || bad "kvevict-llama bench: $(cat "$W/err")"
"$J" jsonl --count 4 --key policy:string --key 'budget:number|null' --key tokens_per_s:number \
    --key tokens_per_s_min:number --key tokens_per_s_max:number --key vs_floor:number \
    --key 'kvevict_share:number|null' --key threads:number --key prompt_tokens:number \
    --key tokens:number --key repeats:number "$W/bench.jsonl" ||
    bad "kvevict-llama bench --json: not 4 rows of its keys"
awk 'function val(k,  m) { if (match($0, "\"" k "\": (\"[^\"]*\"|[^,}]*)")) { m = substr($0, RSTART, RLENGTH)
         sub(/^"[^"]*": /, "", m); gsub(/"/, "", m); return m } return "" }
     { pol[NR] = val("policy"); share[NR] = val("kvevict_share"); b[NR] = val("budget")
       if (val("prompt_tokens") != 48 || val("tokens") != 4 || val("repeats") != 1 ||
           !(val("tokens_per_s") > 0)) bad = 1 }
     END { exit bad || NR != 4 || pol[1] != "llama.cpp alone" || b[1] != "null" || share[1] != "null" ||
               pol[2] !~ /^floor/ || b[2] != 48 || share[2] != "null" ||
               pol[3] != "h2o:budget=48,recent_window=8" || pol[4] !~ /^expected_attention:budget=48,recent_window=1,/ ||
               !(share[3] >= 0 && share[3] < 1 && share[4] >= 0 && share[4] < 1) }' "$W/bench.jsonl" ||
    bad "kvevict-llama bench --json: rows not llama.cpp alone, the floor, then each policy: $(cat "$W/bench.jsonl")"

# ---- bad input: one line, exit 1 ----
head -c 20000 "$M" >"$W/trunc.gguf"
printf 'not a model at all\n' >"$W/junk.gguf"
refuse "a truncated GGUF" "$W/trunc.gguf" logits --model "$W/trunc.gguf" --tokens 1,2
refuse "a file that is no GGUF" "$W/junk.gguf" logits --model "$W/junk.gguf" --tokens 1,2
# a GGUF of an architecture llama.cpp does not know: general.architecture's value, patched
perl -0777 -pe 's/(general\.architecture.{12})llama/$1llamx/s' "$M" >"$W/arch.gguf"
cmp -s "$M" "$W/arch.gguf" && bad "the architecture patch changed nothing"
refuse "a GGUF of an unknown architecture" "$W/arch.gguf" logits --model "$W/arch.gguf" --tokens 1,2
grep -q 'llamx' "$W/err" || bad "an unknown architecture: the line does not name it: $(cat "$W/err")"
refuse "a bad spec" "$M" logits --model "$M" --tokens 1,2 --policy nope
refuse "a spec's bad key" "$M" logits --model "$M" --tokens 1,2 --policy h2o:bogus=1
refuse "a budget above the context" "$M" eval --model "$M" --text "$W/text.txt" --policy h2o --budget 4096
refuse "vnorm=1 (W_o v)" "$M" logits --model "$M" --tokens 1,2 --policy h2o:vnorm=1
refuse "a token outside the vocabulary" "$M" logits --model "$M" --tokens 1,99999
KVEVICT_LLAMA_LIB=$W/nowhere "$KL" logits --model "$M" --tokens 1,2 >/dev/null 2>"$W/err"
rc=$?
[ "$rc" -eq 1 ] && [ "$(wc -l <"$W/err")" -eq 1 ] && grep -q 'libggml-base.so' "$W/err" ||
    bad "a missing llama.cpp: exit $rc, stderr: $(cat "$W/err")"
kl logits --model "$M" --tokens 1,2 --llama-lib "$W/nowhere" >/dev/null 2>&1
[ $? -eq 1 ] || bad "--llama-lib of a folder without llama.cpp: not exit 1"
kl logits --model "$M" --tokens 1,2 --bogus >/dev/null 2>&1
[ $? -eq 2 ] || bad "an unknown option: not the usage exit 2"

[ "$fail" -eq 0 ] && echo "test_llama: every check passed"
exit "$fail"
