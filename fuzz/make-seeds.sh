#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# make-seeds.sh - writes the seed corpora fuzz/corpus/<target>/ from scratch.
# The output is deterministic and checked in; rerun only to change the seeds
# (findings that libFuzzer adds to the corpus are kept beside these).
#   fuzz_spec  one text file per spec ("spec\nkey\nvalue"): valid, canonical
#              and refused policy and canonical-trace specs
#   fuzz_api   binary programs for fuzz_api.c, a few per policy type
#   fuzz_state recipes of state images for fuzz_state.c: every policy type as
#              a policy, a bank, a shared bank and a same_positions bank, as
#              made, edited and resealed, edited and not; raw bytes (the
#              magic, junk)
#   fuzz_npy   .npy files: valid v1/v2/v3, float32/float64, [T,T], [H,T,T],
#              [L,H,T,T], then one malformed variant per header field,
#              truncations, huge and overflowing shapes, wrong dtypes, Fortran
#              order, non-square shapes, NaN / negative / infinite weights
#   fuzz_qk    q/K traces: valid 2-D, 3-D and 4-D pairs (grouped, float64 K),
#              then one fault each: NaN / infinite / beyond-float32 values,
#              logits beyond float32, a missing or truncated K, trailing
#              bytes, shapes that disagree, bad dtype or order, huge T
#   fuzz_heads DuoAttention schedules (lm/heads.c): valid ones, then one fault
#              each: a head twice or missing, out of range, leading zeros, a
#              bad role, NaN / huge / hex scores, CRLF, NUL, bad magic or shape
#   fuzz_session recipes of decoder sessions (fuzz_session.c): each option set
#              at a few lengths, as made, edited and resealed, edited and not;
#              raw bytes
#   fuzz_memory  in-memory arrays (shape, mode and body bytes; fuzz_memory.c):
#              distributions, unnormalised and zero rows, NaN / -1 / infinite
#              weights, raw float bits, the undefined flag
#   fuzz_vocab byte-level BPE vocabularies (fuzz_vocab.c): a pre-tokenizer of
#              each family, none, refused names; merges, duplicates, a merge
#              without a space, specials and flags
#   fuzz_llama recipes of kvevict-llama's sequence states (fuzz_llama.c):
#              made with and without a policy, edited; raw bytes
#   fuzz_gguf  GGUF files from kvevict-convert (needs a build): every type,
#              tied and untied, with and without a vocabulary, 16-bit norms,
#              one with an infinite scale;
#              cut, big-endian, version 1 (also llama2.c version-2 seeds for
#              fuzz_checkpoint)
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/corpus"

# ---- fuzz_spec ----
rm -f fuzz_spec/s-*
i=0
spec() { printf '%b' "$1" > "fuzz_spec/s-$(printf %03d $i)"; i=$((i + 1)); }
for s in full window streaming random h2o scissorhands tova h2o_decay h2o_mean \
    'h2o:budget=256,recent_window=64' 'window:budget=1' 'streaming:budget=8,sinks=4' \
    'streaming:sinks=0,budget=2' 'random:budget=16,recent_window=3' \
    'scissorhands:budget=64,recent_window=8,history=16' 'scissorhands:history=64' \
    'tova:budget=3,recent_window=0' 'h2o_decay:decay=0.5' 'h2o_decay:decay=1e-3,budget=9' \
    'h2o_mean:budget=100' 'full:budget=16777216' \
    'h2o:' 'h2o:budget=' 'h2o:budget=0' 'h2o:budget=16777217' \
    'h2o:budget=99999999999999999999999' 'h2o:budget=16,recent_window=16' \
    'h2o:budget=1,budget=2' 'H2O' 'h2o:foo=1' 'h2o:budget=1e3' 'h2o:budget=-1' \
    'h2o:budget=+5' 'h2o: budget=5' 'h2o_decay:decay=nan' 'h2o_decay:decay=inf' \
    'h2o_decay:decay=0' 'h2o_decay:decay=1.0000001' 'h2o_decay:decay=0x1p-3' \
    'h2o_decay:decay=1e-400' 'h2o_decay:decay=.' 'h2o,budget=1' 'h2o:budget=12,' \
    'h2o:,budget=12' 'h2o:budget' 'h2o:=3' 'h2o::' ':budget=3' '' \
    'a_very_long_policy_name_that_goes_past_the_limit:budget=1' 'scissorhands:history=65' \
    'streaming:sinks=8,budget=8' 'random:recent_window=511' \
    'canonical' 'canonical:seed=3,steps=100' 'canonical:steps=0' 'canonical:steps=1' \
    'canonical:heavy=2000' 'canonical:sink_mass=1,recent_mass=1,heavy_mass=1' \
    'canonical:jitter=0.95,steps=5000' 'canonical:recent_decay=1e-300,recent=3' \
    'canonical:sinks=0,recent=0,heavy=0,steps=40' 'canonical:epoch=1,heavy=4,steps=64' \
    'canonical:seed=18446744073709551615' 'canonical:seed=18446744073709551616' \
    'canonical:steps=16777216,recent=2' 'canonical:bogus=1' \
    'h2o\nbudget\n64' 'h2o\nrecent_window\n600' 'streaming\nsinks\n999' 'h2o\nnope\n1' \
    'h2o_decay\ndecay\n0.25' 'window:budget=7\nbudget\n' 'tova\nbudget\n1' \
    'canonical:version=1' 'canonical:version=2,seed=5,steps=700' 'canonical:version=3' \
    'canonical:version=' 'canonical:version=1,heavy_decay=0.5' 'canonical:version=1,version=2' \
    'canonical:heavy_decay=0,epoch=16,heavy=16,steps=300' 'canonical:heavy_decay=0.99' \
    'canonical:epoch=8,heavy=9' 'canonical:version=1,epoch=1,heavy=4,steps=64' \
    'canonical:steps=2000,seed=9,version=1' knorm keydiff 'knorm:budget=9,recent_window=8' \
    'keydiff:budget=5,recent_window=1' 'keydiff:recent_window=512' 'knorm:history=3' \
    'h2o:vnorm=1' 'h2o:vnorm=0' 'tova:budget=9,vnorm=1,block=2' 'scissorhands:history=3,vnorm=1' \
    'h2o_mean:vnorm=2' 'knorm:vnorm=1' 'h2o\nvnorm\n1' 'h2o_decay:vnorm=1,decay=0.5' \
    expected_attention 'expected_attention:budget=64,n_sink=0,interval=8,n_queries=16' \
    'expected_attention:n_sink=512' 'expected_attention:epsilon=1e-3,vnorm=0,use_covariance=0' \
    'expected_attention:epsilon=-1' 'expected_attention:epsilon=1e7' 'expected_attention:interval=0' \
    'expected_attention:n_queries=65537' 'expected_attention:n_future_positions=1048577' \
    'expected_attention:use_covariance=2' 'expected_attention:budget=16777216,recent_window=16777215' \
    'expected_attention:block=4,block_mean=1,budget=40' 'expected_attention\ninterval\n512' \
    'expected_attention:history=3' 'no_such_rule:budget=4'; do
  spec "$s"
done

# ---- fuzz_api ----
# Header: type, budget, param, history, decay, seed, fail_at; then op bytes.
rm -f fuzz_api/p-*
lcg=12345
rnd() { lcg=$(( (lcg * 1103515245 + 12345) % 2147483648 )); R=$(( (lcg >> 8) % 256 )); }
bytes() { local out=""; for b in "$@"; do out+=$(printf '\\%03o' "$b"); done; printf '%b' "$out"; }
for type in 0 1 2 3 4 5 6 7 8 9 10; do
  for variant in 0 1 2; do
    case $variant in
      0) hdr="$type 8 3 4 2 1 200";;   # budget 9, small window
      1) hdr="$type 1 0 0 0 7 0";;     # budget 2, construction fails at allocation 0
      2) hdr="$type 31 250 64 5 9 2";; # budget 32, large window, history 64
    esac
    ops=""
    for _ in $(seq 1 160); do rnd; ops+=" $R"; done
    # Make sure every op kind appears: steps, evicts, bad steps, gaps, alloc
    # failure; the jump to INT32_MAX (7 255) comes last, since after it every
    # step is refused.
    ops="0 10 0 0 20 0 2 3 1 50 1 7 4 6 3 6 9 1 8 0 0 0 $ops 3 7 255 0 1 9 2 0 9"
    # shellcheck disable=SC2086
    bytes $hdr $ops > "fuzz_api/p-$type-$variant"
  done
done

# ---- fuzz_state ----
# Made images (fuzz_state.c): mode, then type, budget, param, history,
# block, kind, key_dim, seed, steps; then 4 bytes per edit; then the calls.
# kind 0 a policy, 1 a bank of 1 head, 7 of 4 heads, 15 of 4 heads shared
# by 2. Mode 1: the image as made (it loads); 21: two edits, resealed; 17:
# two edits, not resealed (the checksum refuses them).
rm -f fuzz_state/s-*
mkdir -p fuzz_state
for type in 0 1 2 3 4 5 6 7 8 9 10; do
  for kind in 0 1 7 15; do
    for mode in 1 21 17; do
      rnd; seed=$R; rnd; budget=$((R % 24)); rnd; param=$R; rnd; hist=$R; rnd; blk=$R
      rec="$mode $type $budget $param $hist $blk $kind 3 $seed 90"
      edits=""
      [ "$mode" != 1 ] && for _ in 1 2 3 4 5 6 7 8; do rnd; edits+=" $R"; done
      ops=""
      for _ in $(seq 1 48); do rnd; ops+=" $R"; done
      # shellcheck disable=SC2086
      bytes $rec $edits $ops > "fuzz_state/s-$type-$kind-$mode"
    done
  done
done
# Same-positions banks (kind 23: 4 heads, bit 16 set; version 3 images),
# every type, as made and with two edits resealed; fixed bytes, so the
# seeds above keep theirs.
for type in 0 1 2 3 4 5 6 7 8 9 10; do
  for mode in 1 21; do
    rec="$mode $type $((5 + type * 3)) $((type * 7)) $((type * 11)) $type 23 3 $((type * 13 + 1)) 90"
    edits=""
    [ "$mode" != 1 ] && edits="0 $((type * 17)) 0 5 4 $((type * 29)) 0 255"
    ops=""
    for k in $(seq 1 48); do ops+=" $(( (k * 37 + type * 5) % 256 ))"; done
    # shellcheck disable=SC2086
    bytes $rec $edits $ops > "fuzz_state/s-same-$type-$mode"
  done
done
# Raw images: the magic alone, the magic and a header of zeros, junk.
{ printf '\000'; printf '\211kve\r\n\032\n'; } > fuzz_state/r-magic
{ printf '\000'; printf '\211kve\r\n\032\n'; head -c 72 /dev/zero; } > fuzz_state/r-zeros
{ printf '\000'; for _ in $(seq 1 64); do rnd; bytes "$R"; done; } > fuzz_state/r-junk
printf '\000' > fuzz_state/r-empty

# ---- fuzz_npy ----
rm -f fuzz_npy/n-*
# arr VERSION HEADER_DICT PAYLOAD: one .npy array on standard output
arr() {
  local ver=$1 dict=$2 payload=$3 pre=10
  [ "$ver" != 1 ] && pre=12
  local len=$(( ${#dict} + 1 ))
  local pad=$(( (64 - (pre + len) % 64) % 64 ))
  local hdr
  hdr="$dict$(printf '%*s' "$pad" '')"$'\n'
  len=${#hdr}
  local lenbytes
  if [ "$ver" = 1 ]; then
    lenbytes=$(printf '\\%03o\\%03o' $((len % 256)) $((len / 256)))
  else
    lenbytes=$(printf '\\%03o\\%03o\\000\\000' $((len % 256)) $((len / 256)))
  fi
  printf '\223NUMPY'; printf '%b' "\\$(printf %03o "$ver")\\000$lenbytes"; printf '%s' "$hdr"
  printf '%b' "$payload"
}
# npy NAME VERSION HEADER_DICT PAYLOAD(printf %b): fuzz_npy/n-NAME.npy
npy() { arr "$2" "$3" "$4" > "fuzz_npy/n-$1.npy"; }
F1='\000\000\200\077'; F5='\000\000\000\077'; F25='\000\000\200\076'; F0='\000\000\000\000'
F7='\000\000\340\100'; FNAN='\000\000\300\177'; FINF='\000\000\200\177'; FNEG='\000\000\000\277'
D1='\000\000\000\000\000\000\360\077'; D5='\000\000\000\000\000\000\340\077'
D25='\000\000\000\000\000\000\320\077'; D0='\000\000\000\000\000\000\000\000'
T3="$F1$F0$F0$F5$F5$F0$F25$F25$F5"           # rows [1], [.5 .5], [.25 .25 .5]
T3D="$D1$D0$D0$D5$D5$D0$D25$D25$D5"
d() { echo "{'descr': '$1', 'fortran_order': ${3:-False}, 'shape': $2, }"; }
npy v1-f4-3 1 "$(d '<f4' '(3, 3)')" "$T3"
npy v2-f4-3 2 "$(d '<f4' '(3, 3)')" "$T3"
npy v3-f4-3 3 "$(d '<f4' '(3, 3)')" "$T3"
npy v1-f8-3 1 "$(d '<f8' '(3, 3)')" "$T3D"
npy v1-f4-h2 1 "$(d '<f4' '(2, 3, 3)')" "$T3$T3"
npy v1-f4-l2h1 1 "$(d '<f4' '(2, 1, 3, 3)')" "$T3$T3"
npy v1-f4-l1h2 1 "$(d '<f4' '(1, 2, 3, 3)')" "$T3$T3"
npy v1-f4-1 1 "$(d '<f4' '(1, 1)')" "$F1"
npy v1-upper-garbage 1 "$(d '<f4' '(3, 3)')" "$F1$F7$FNAN$F5$F5$FNEG$F25$F25$F5"
npy v1-reordered 1 "{'shape': (3, 3), 'fortran_order': False, 'descr': '<f4', }" "$T3"
npy v1-no-trailing-comma 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 3)}" "$T3"
npy v1-tuple-comma 1 "$(d '<f4' '(3, 3,)')" "$T3"
npy v1-no-spaces 1 "{'descr':'<f4','fortran_order':False,'shape':(3,3)}" "$T3"
npy v1-unnormalized 1 "$(d '<f4' '(3, 3)')" "$F1$F0$F0$F1$F1$F0$F25$F25$F5"
npy v1-zero-row 1 "$(d '<f4' '(3, 3)')" "$F1$F0$F0$F0$F0$F0$F25$F25$F5"
npy v1-zero-row0 1 "$(d '<f4' '(3, 3)')" "$F0$F0$F0$F5$F5$F0$F25$F25$F5"
npy v1-nan 1 "$(d '<f4' '(3, 3)')" "$F1$F0$F0$F5$FNAN$F0$F25$F25$F5"
npy v1-inf 1 "$(d '<f4' '(3, 3)')" "$F1$F0$F0$F5$F5$F0$FINF$F25$F5"
npy v1-neg 1 "$(d '<f4' '(3, 3)')" "$F1$F0$F0$F5$F5$F0$FNEG$F1$F5"
npy v1-fortran 1 "$(d '<f4' '(3, 3)' True)" "$T3"
npy v1-big-endian 1 "$(d '>f4' '(3, 3)')" "$T3"
npy v1-int32 1 "$(d '<i4' '(3, 3)')" "$T3"
npy v1-half 1 "$(d '<f2' '(3, 3)')" "$T3"
npy v1-u1 1 "$(d '|u1' '(3, 3)')" "$T3"
npy v1-c8 1 "$(d '<c8' '(3, 3)')" "$T3$T3"
npy v1-structured 1 "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3, 3), }" "$T3"
npy v1-nonsquare 1 "$(d '<f4' '(3, 4)')" "$T3$F0$F0$F0"
npy v1-nonsquare-3d 1 "$(d '<f4' '(1, 3, 2)')" "$F1$F0$F5$F5$F25$F25"
npy v1-scalar 1 "$(d '<f4' '()')" "$F1"
npy v1-1d 1 "$(d '<f4' '(3,)')" "$F1$F5$F5"
npy v1-5d 1 "$(d '<f4' '(1, 1, 1, 3, 3)')" "$T3"
npy v1-zero-dim 1 "$(d '<f4' '(0, 0)')" ""
npy v1-huge 1 "$(d '<f4' '(4294967296, 4294967296)')" "$T3"
npy v1-overflow 1 "$(d '<f4' '(99999999999999999999999, 99999999999999999999999)')" "$T3"
npy v1-overflow-heads 1 "$(d '<f4' '(4611686018427387904, 3, 3)')" "$T3"
npy v1-negative-dim 1 "$(d '<f4' '(-3, -3)')" "$T3"
npy v1-truncated-payload 1 "$(d '<f4' '(3, 3)')" "$F1$F0$F0$F5$F5$F0$F25"
npy v1-trailing-bytes 1 "$(d '<f4' '(3, 3)')" "$T3$F1"
npy v1-missing-shape 1 "{'descr': '<f4', 'fortran_order': False, }" "$T3"
npy v1-missing-descr 1 "{'fortran_order': False, 'shape': (3, 3), }" "$T3"
npy v1-duplicate-key 1 "{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (3, 3), }" "$T3"
npy v1-extra-key 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 3), 'x': 1, }" "$T3"
npy v1-bad-bool 1 "$(d '<f4' '(3, 3)' Maybe)" "$T3"
npy v1-unterminated 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 3), " "$T3"
npy v1-bad-quote 1 "{'descr\": '<f4', 'fortran_order': False, 'shape': (3, 3), }" "$T3"
npy v4-f4-3 4 "$(d '<f4' '(3, 3)')" "$T3"
npy v1-escape 1 "{'descr': '<f\\4', 'fortran_order': False, 'shape': (3, 3), }" "$T3"
npy v1-falsey 1 "$(d '<f4' '(3, 3)' Falsey)" "$T3"
npy v1-long-suffix 1 "$(d '<f4' '(3L, 3L)')" "$T3"
npy v1-dup-order 1 "{'descr': '<f4', 'fortran_order': False, 'fortran_order': False, 'shape': (3, 3), }" "$T3"
npy v1-dup-shape 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 3), 'shape': (3, 3), }" "$T3"
npy v1-overflow-3d 1 "$(d '<f4' '(4294967296, 4294967296, 4294967296)')" "$T3"
npy v1-double-quotes 1 '{"descr": "<f4", "fortran_order": False, "shape": (3, 3), }' "$T3"
# Hand-broken framing: bad magic, header length past the end, no newline, bare magic.
{ printf 'XNUMPY\001\000\166\000'; head -c 118 fuzz_npy/n-v1-f4-3.npy | tail -c 108; } \
  > fuzz_npy/n-bad-magic.npy
{ head -c 8 fuzz_npy/n-v1-f4-3.npy; printf '\377\377'; tail -c +11 fuzz_npy/n-v1-f4-3.npy; } \
  > fuzz_npy/n-header-len-past-end.npy
{ head -c 10 fuzz_npy/n-v1-f4-3.npy; tail -c +11 fuzz_npy/n-v1-f4-3.npy | tr '\n' ' '; } \
  > fuzz_npy/n-header-no-newline.npy
head -c 6 fuzz_npy/n-v1-f4-3.npy > fuzz_npy/n-magic-only.npy
head -c 40 fuzz_npy/n-v1-f4-3.npy > fuzz_npy/n-truncated-header.npy
: > fuzz_npy/n-empty.npy
# ---- fuzz_qk ----
# q/K traces: two .npy arrays back to back, Q [L, H, T, d] then K [L, G, T, d]
mkdir -p fuzz_qk
rm -f fuzz_qk/q-*
# qk NAME QDICT QPAYLOAD KDICT KPAYLOAD [TAIL]
qk() { { arr 1 "$2" "$3"; [ -n "$4" ] && arr 1 "$4" "$5"; printf '%b' "${6:-}"; } > "fuzz_qk/q-$1"; }
FM1='\000\000\200\277'; F2='\000\000\000\100'; FBIG='\000\000\000\176' # -1, 2, 2^61
D2='\000\000\000\000\000\000\000\100'; DHUGE='\000\000\000\000\000\000\360\107' # 2, 2^128
V4="$F1$F5$FM1$F2"                          # one vector of d = 4
R3="$V4$F25$F0$F1$F5$F2$FM1$F0$F25"        # T = 3 rows of d = 4
qk f4-2d "$(d '<f4' '(3, 4)')" "$R3" "$(d '<f4' '(3, 4)')" "$R3"
qk f4-3d "$(d '<f4' '(2, 3, 4)')" "$R3$R3" "$(d '<f4' '(1, 3, 4)')" "$R3"
qk f4-4d "$(d '<f4' '(2, 2, 3, 4)')" "$R3$R3$R3$R3" "$(d '<f4' '(2, 1, 3, 4)')" "$R3$R3"
qk f8-k "$(d '<f4' '(1, 4)')" "$V4" "$(d '<f8' '(1, 4)')" "$D2$D2$D2$D2"
qk d1 "$(d '<f4' '(3, 1)')" "$F1$F5$F2" "$(d '<f4' '(3, 1)')" "$F2$F1$FM1"
qk nan-q "$(d '<f4' '(3, 4)')" "$F1$F5$FNAN$F2$F25$F0$F1$F5$F2$FM1$F0$F25" "$(d '<f4' '(3, 4)')" "$R3"
qk inf-k "$(d '<f4' '(3, 4)')" "$R3" "$(d '<f4' '(3, 4)')" "$F1$FINF$F1$F1$R3"
qk f8-huge "$(d '<f4' '(1, 4)')" "$V4" "$(d '<f8' '(1, 4)')" "$D2$DHUGE$D2$D2"
qk big-logits "$(d '<f4' '(2, 4)')" "$FBIG$FBIG$FBIG$FBIG$V4" "$(d '<f4' '(2, 4)')" "$FBIG$FBIG$FBIG$FBIG$V4"
qk no-k "$(d '<f4' '(3, 4)')" "$R3" "" ""
qk k-truncated "$(d '<f4' '(3, 4)')" "$R3" "$(d '<f4' '(3, 4)')" "$V4$V4"
qk trailing "$(d '<f4' '(3, 4)')" "$R3" "$(d '<f4' '(3, 4)')" "$R3" '\000\000'
qk t-differs "$(d '<f4' '(3, 4)')" "$R3" "$(d '<f4' '(2, 4)')" "$V4$V4"
qk d-differs "$(d '<f4' '(3, 4)')" "$R3" "$(d '<f4' '(4, 3)')" "$R3"
qk g-not-dividing "$(d '<f4' '(3, 3, 4)')" "$R3$R3$R3" "$(d '<f4' '(2, 3, 4)')" "$R3$R3"
qk ndim-differs "$(d '<f4' '(1, 3, 4)')" "$R3" "$(d '<f4' '(3, 4)')" "$R3"
qk one-d "$(d '<f4' '(4,)')" "$V4" "$(d '<f4' '(4,)')" "$V4"
qk zero-dim "$(d '<f4' '(0, 4)')" "" "$(d '<f4' '(0, 4)')" ""
qk k-bad-dtype "$(d '<f4' '(3, 4)')" "$R3" "$(d '<i4' '(3, 4)')" "$R3"
qk k-fortran "$(d '<f4' '(3, 4)')" "$R3" "$(d '<f4' '(3, 4)' True)" "$R3"
qk huge-t "$(d '<f4' '(4294967296, 1)')" "$V4" "$(d '<f4' '(4294967296, 1)')" "$V4"
{ head -c 20 fuzz_qk/q-f4-2d; } > fuzz_qk/q-cut-header
: > fuzz_qk/q-empty


# ---- fuzz_memory ----
# Header: L-1, H-1, T-1 (each taken modulo 2, 3, 16) and the mode (fuzz_memory.c:
# bit 0 NORMALIZE, bit 1 an undefined flag, bit 2 one byte per weight, bit 3 rows
# made distributions); then the body the array is cycled from.
mkdir -p fuzz_memory
rm -f fuzz_memory/m-*
W='\001\003\007\017\037\077\177\020\040\100\200\002\004\010\021\042'
mem() { printf '%b' "$2" > "fuzz_memory/m-$1"; }
mem weights-rows '\000\001\006\014'"$W"
mem weights-rows-normalize '\001\002\011\015'"$W"
mem weights-normalize '\000\000\005\005'"$W"
mem weights-raw '\000\000\004\004'"$W"
mem weights-nan '\000\001\006\014\001\003\377\017'"$W"
mem weights-negative '\001\000\003\014\001\376\007'"$W"
mem weights-inf '\000\000\003\015\001\375\007'"$W"
mem weights-zero-rows '\000\000\004\005\000\000\000\000\000\007'
mem largest '\001\002\017\015'"$W$W"
mem one-step '\000\000\000\000\000\000\200\077'
mem raw-bits '\000\000\002\000'"$T3"
mem raw-normalize '\000\001\002\001'"$T3$FNEG"
mem undefined-flag '\000\000\002\016'"$W"
mem empty-body '\000\000\003\004'
# ---- fuzz_checkpoint ----
mkdir -p fuzz_checkpoint fuzz_tokenizer
rm -f fuzz_checkpoint/c-* fuzz_tokenizer/t-*
le32() {
  local v=$(( $1 & 0xffffffff ))
  printf '%b' "$(printf '\\%03o\\%03o\\%03o\\%03o' $((v & 255)) $(((v >> 8) & 255)) \
    $(((v >> 16) & 255)) $(((v >> 24) & 255)))"
}
# N float32 cycling through 0.25, -0.05, 0.5, -0.15
floats() {
  local n=$1 i
  for ((i = 0; i < (n + 3) / 4; i++)); do
    printf '\000\000\200\076\315\314\114\275\000\000\000\077\232\231\031\276'
  done | head -c $((4 * n))
}
# ckpt NAME VERSION DIM HIDDEN LAYERS HEADS KV VOCAB SEQ SHARED [EXTRA_BYTES]
ckpt() {
  local name=$1 ver=$2 D=$3 F=$4 L=$5 H=$6 G=$7 V=$8 T=$9 shared=${10} extra=${11:-0}
  local S=$((D / H)) n
  n=$((V * D + 2 * L * D + L * D * D * 2 + 2 * L * G * S * D + 3 * L * F * D + D))
  [ "$ver" = 0 ] && n=$((n + T * S))
  [ "$shared" = 0 ] && n=$((n + V * D))
  {
    if [ "$ver" = 1 ]; then
      le32 $((0x616b3432)); le32 1
      le32 "$D"; le32 "$F"; le32 "$L"; le32 "$H"; le32 "$G"; le32 "$V"; le32 "$T"
      printf '%b' "\\$(printf %03o "$shared")"
      head -c $((256 - 37)) /dev/zero
    else
      local v=$V
      [ "$shared" = 0 ] && v=$((-V))
      le32 "$D"; le32 "$F"; le32 "$L"; le32 "$H"; le32 "$G"; le32 "$v"; le32 "$T"
    fi
    floats $((n + extra))
  } > "fuzz_checkpoint/c-$name"
}
ckpt legacy-tied 0 4 4 1 2 1 4 3 1
ckpt legacy-untied 0 4 4 1 2 1 4 3 0
ckpt v1-tied 1 4 4 1 2 1 4 3 1
ckpt v1-untied 1 4 4 1 2 1 4 3 0
ckpt legacy-gqa 0 8 8 2 4 2 5 4 1
ckpt v1-gqa 1 8 8 2 4 2 5 4 0
ckpt v1-one-head 1 2 3 1 1 1 3 100000 1
ckpt legacy-trailing 0 4 4 1 2 1 4 3 1 1
ckpt v1-bad-version 1 4 4 1 2 1 4 3 1
le32 2 | dd of=fuzz_checkpoint/c-v1-bad-version bs=1 seek=4 conv=notrunc 2>/dev/null
ckpt v1-flag2 1 4 4 1 2 1 4 3 1
printf '\002' | dd of=fuzz_checkpoint/c-v1-flag2 bs=1 seek=36 conv=notrunc 2>/dev/null
# patch NAME FROM OFFSET INT32: a copy of seed FROM with one header field changed
patch() {
  cp "fuzz_checkpoint/c-$2" "fuzz_checkpoint/c-$1"
  le32 "$4" | dd of="fuzz_checkpoint/c-$1" bs=1 seek="$3" conv=notrunc 2>/dev/null
}
patch zero-dim legacy-tied 0 0
patch neg-heads legacy-tied 12 -2
patch odd-head-size legacy-tied 0 6
patch kv-not-dividing legacy-gqa 16 3
patch kv-above-heads v1-tied 24 4
patch huge-layers legacy-tied 8 1073741824
patch huge-dims legacy-gqa 0 2147483640
patch min-vocab legacy-tied 20 -2147483648
patch huge-vocab v1-tied 28 2147483647
patch negative-vocab-v1 v1-untied 28 -4
patch zero-seq v1-tied 32 0
head -c 500 fuzz_checkpoint/c-legacy-tied > fuzz_checkpoint/c-legacy-truncated
head -c 13 fuzz_checkpoint/c-legacy-tied > fuzz_checkpoint/c-header-cut
head -c 100 fuzz_checkpoint/c-v1-tied > fuzz_checkpoint/c-v1-header-cut
head -c 6 fuzz_checkpoint/c-v1-tied > fuzz_checkpoint/c-v1-magic-only
: > fuzz_checkpoint/c-empty

# ---- fuzz_tokenizer ----
F0='\000\000\000\000'; FM1='\000\000\200\277'; FM2='\000\000\000\300'; FM3='\000\000\100\300'
FNAN='\000\000\300\177'
piece() { printf '%b' "$1"; le32 ${#2}; printf '%s' "$2"; }
{ le32 5; piece "$F0" '<unk>'; piece "$F0" '<s>'; piece "$F0" '</s>'; piece "$FM1" ' '
  piece "$FM2" a; piece "$FM2" b; piece "$FM3" ab; piece "$FM1" ' a'; } > fuzz_tokenizer/t-small
{ le32 6; piece "$F0" '<unk>'; piece "$F0" $'\n<s>\n'; piece "$F0" $'\n</s>\n'
  for b in $(seq 0 255); do piece "$F0" "$(printf '<0x%02X>' "$b")"; done
  piece "$FM1" ' '; piece "$FM2" t; piece "$FM2" h; piece "$FM2" e; piece "$FM1" th
  piece "$FM1" the; piece "$F0" ' the'; piece "$FM3" $'\xc3\xa9'; piece "$FM1" '<key00>'
} > fuzz_tokenizer/t-bytes
{ le32 4; piece "$F0" '<unk>'; piece "$FM1" a; piece "$FM2" a; piece "$FM1" aa; piece "$FM2" aa
  piece "$FM1" ' '; } > fuzz_tokenizer/t-duplicates
{ le32 4; piece "$F0" ab; piece "$FNAN" ' '; } > fuzz_tokenizer/t-nan-score
{ le32 2; piece "$F0" abc; } > fuzz_tokenizer/t-too-long
{ le32 0; piece "$F0" a; } > fuzz_tokenizer/t-zero-max
{ le32 4; printf '%b' "$F0"; le32 -1; } > fuzz_tokenizer/t-negative-len
{ le32 4; printf '%b' "$F0"; le32 3; printf 'a\000b'; } > fuzz_tokenizer/t-nul
head -c 37 fuzz_tokenizer/t-small > fuzz_tokenizer/t-truncated
le32 5 > fuzz_tokenizer/t-no-pieces
: > fuzz_tokenizer/t-empty

# ---- fuzz_vocab: byte 0 the pre-tokenizer, byte 1 flags, then pieces and
# "m LEFT RIGHT" merges a line each, NUL, the text (fuzz_vocab.c) ----
mkdir -p fuzz_vocab
rm -f fuzz_vocab/v-*
printf '\003\001\304\240t\nh\ne\nth\n\304\240th\n\304\240the\nm \304\240 t\nm t h\nm \304\240t h\nm \304\240th e\n\000the then 123 don'"'"'t \xc3\xa9' > fuzz_vocab/v-llama3
printf '\001\000\304\240t\nth\nm \304\240 t\nm t h\n\000Hello, World! $5 + 1234567 ^~ a|b' > fuzz_vocab/v-default
printf '\002\034\304\240a\nm \304\240 a\n\000a <|u|> a<|endoftext|>' > fuzz_vocab/v-gpt2-specials
printf '\004\003ab\nm a b\nm a b\nnoSpace\nm x\n\000ab ab 1 2 3 '"'"'S' > fuzz_vocab/v-qwen2-dups
printf '\010\000\000tekken' > fuzz_vocab/v-tekken-refused
printf '\005\000\000digits 1234 and \xd9\xa3\xd9\xa4' > fuzz_vocab/v-smollm
printf '\012\000\000no pre key \x80\xff' > fuzz_vocab/v-no-pre
printf '\011\000\000gpt2 is not a pre name' > fuzz_vocab/v-gpt2-refused

# ---- fuzz_gguf, and version-2 seeds of fuzz_checkpoint: written by the
# converter (KVE_CONVERT, default build/kvevict-convert; make it first) ----
CONV=${KVE_CONVERT:-../../build/kvevict-convert}
TOK=../../tests/fixtures/lm/tiny-tokenizer.bin # 289 pieces
mkdir -p fuzz_gguf
rm -f fuzz_gguf/g-* fuzz_checkpoint/c-v2-*
conv() { # NAME SHAPE ARGS...: one GGUF seed
  local name=$1 shape=$2
  shift 2
  "$CONV" --random "$shape" --to gguf "$@" -o "fuzz_gguf/g-$name" 2>/dev/null
}
small=dim=8,hidden=16,layers=2,heads=2,kv_heads=1,vocab=289,seq_len=8,seed=1
conv f32-vocab "$small" --tokenizer "$TOK"
conv f16-untied "${small/seed=1/seed=2},tied=0" --type f16 --norm-type f16
conv bf16 "$small" --type bf16 --norm-type bf16 --tokenizer "$TOK"
q32=dim=32,hidden=32,layers=1,heads=2,kv_heads=1,vocab=16,seq_len=8,seed=3
conv q8_0 "$q32" --type q8_0
conv rope-yarn "$small" --rope-scaling yarn:4,orig=4,attn=1.5
conv rope-llama3 "${small/seed=1/seed=5}" --rope-scaling llama3:8,orig=16
conv q4_0-untied "$q32,tied=0" --type q4_0 --embedding-type f16
k256=dim=256,hidden=256,layers=1,heads=2,kv_heads=1,vocab=4,seq_len=4,seed=4
conv q4_k "$k256" --type q4_k --embedding-type q8_0
conv q6_k-untied "$k256,tied=0" --type q6_k --embedding-type q4_0 --norm-type f16
# The other types, each as the converter writes it; g-q2_k-inf-min has the
# last block of its last tensor (blk.0.ffn_up, rows of one block, no
# padding after) with an infinite min scale (refused).
conv q4_1 "$q32" --type q4_1
conv q5_0 "$q32,tied=0" --type q5_0 --embedding-type q5_1
conv q5_1 "$q32" --type q5_1 --norm-type bf16
conv iq4_nl "$q32" --type iq4_nl
conv q2_k "$k256" --type q2_k
conv q3_k "$k256,tied=0" --type q3_k --embedding-type iq4_nl
conv q5_k "$k256" --type q5_k --norm-type f16
conv iq4_xs "$k256,tied=0" --type iq4_xs --embedding-type q4_1
cp fuzz_gguf/g-q2_k fuzz_gguf/g-q2_k-inf-min
size=$(wc -c < fuzz_gguf/g-q2_k-inf-min)
printf '\000\174' | dd of=fuzz_gguf/g-q2_k-inf-min bs=1 seek=$((size - 2)) conv=notrunc 2>/dev/null
head -c 1000 fuzz_gguf/g-q8_0 > fuzz_gguf/g-truncated
head -c 23 fuzz_gguf/g-q8_0 > fuzz_gguf/g-header-cut
cp fuzz_gguf/g-f32-vocab fuzz_gguf/g-big-endian
le32 50331648 | dd of=fuzz_gguf/g-big-endian bs=1 seek=4 conv=notrunc 2>/dev/null
cp fuzz_gguf/g-q8_0 fuzz_gguf/g-version-1
le32 1 | dd of=fuzz_gguf/g-version-1 bs=1 seek=4 conv=notrunc 2>/dev/null
printf 'GGUF' > fuzz_gguf/g-magic-only
"$CONV" --random dim=8,hidden=16,layers=1,heads=2,kv_heads=1,vocab=6,seq_len=4,seed=5 \
  --to llama2c-v2 --group 8 -o fuzz_checkpoint/c-v2-tied 2>/dev/null
"$CONV" --random dim=8,hidden=16,layers=2,heads=2,kv_heads=1,vocab=6,seq_len=4,seed=6,tied=0 \
  --to llama2c-v2 --group 4 -o fuzz_checkpoint/c-v2-untied 2>/dev/null
cp fuzz_checkpoint/c-v2-tied fuzz_checkpoint/c-v2-bad-group
le32 3 | dd of=fuzz_checkpoint/c-v2-bad-group bs=1 seek=37 conv=notrunc 2>/dev/null

# ---- fuzz_heads ----
mkdir -p fuzz_heads
rm -f fuzz_heads/h-*
H1='kvevict-heads 1\nlayers 2 kv_heads 2\n'
printf '%b' "# a schedule\n${H1}head 0 0 streaming 0\nhead 0 1 retrieval 1\nhead 1 0 streaming 0.125\n\nhead 1 1 streaming -2e-3" > fuzz_heads/h-valid
printf '%b' "${H1}head 1 1 retrieval 1\nhead 1 0 retrieval 0.5\nhead 0 1 retrieval 1\nhead 0 0 retrieval 1\n" > fuzz_heads/h-all-retrieval
printf '%b' "kvevict-heads 1\nlayers 1 kv_heads 1\n\thead\t0 0  streaming 0\n" > fuzz_heads/h-one-tabs
printf '%b' "${H1}head 0 0 streaming 0\nhead 0 0 streaming 0\nhead 1 0 streaming 0\nhead 1 1 streaming 0\n" > fuzz_heads/h-twice
printf '%b' "${H1}head 0 0 streaming 0\nhead 0 1 streaming 0\nhead 1 0 streaming 0\n" > fuzz_heads/h-missing
printf '%b' "${H1}head 0 2 streaming 0\n" > fuzz_heads/h-head-range
printf '%b' "${H1}head 01 0 streaming 0\n" > fuzz_heads/h-leading-zero
printf '%b' "${H1}head 0 0 sink 0\n" > fuzz_heads/h-role
printf '%b' "${H1}head 0 0 streaming nan\n" > fuzz_heads/h-nan
printf '%b' "${H1}head 0 0 streaming 1e999\n" > fuzz_heads/h-huge
printf '%b' "${H1}head 0 0 streaming 0x1p3\n" > fuzz_heads/h-hex
printf '%b' "${H1}head 0 0 streaming 0 extra\n" > fuzz_heads/h-extra
printf '%b' "kvevict-heads 1\r\nlayers 1 kv_heads 1\r\nhead 0 0 streaming 0\r\n" > fuzz_heads/h-crlf
printf '%b' "kvevict-heads 2\nlayers 1 kv_heads 1\nhead 0 0 streaming 0\n" > fuzz_heads/h-version
printf '%b' "kvevict-heads 1\nlayers 0 kv_heads 1\n" > fuzz_heads/h-zero-layers
printf '%b' "kvevict-heads 1\nlayers 65536 kv_heads 2\n" > fuzz_heads/h-too-many
printf '%b' "kvevict-heads 1\nlayers 1 kv_heads 1\nhead 0 0 streaming 0\000\n" > fuzz_heads/h-nul
printf '%b' "kvevict-heads 1\n" > fuzz_heads/h-no-shape
: > fuzz_heads/h-empty


# ---- fuzz_session ----
# Recipes (fuzz_session.c): mode, options (0..5), tokens, then 3 bytes per
# edit (offset LE16, xor). Mode 1: a session as made (it loads); 3: edits,
# resealed (the fields behind the checksum refuse them, or they load); 1 with
# edits: not resealed (the checksum refuses them). Mode 0: raw bytes.
mkdir -p fuzz_session
rm -f fuzz_session/e-*
oct() { printf '\\%03o' "$@"; }
for opt in 0 1 2 3 4 5; do
  for n in 0 1 7 20; do
    printf '%b' "$(oct 1 "$opt" "$n")" > "fuzz_session/e-made-$opt-$n"
    printf '%b' "$(oct 3 "$opt" "$n" $((opt * 37 % 256)) 0 255  120 0 1  64 0 3)" \
      > "fuzz_session/e-sealed-$opt-$n"
    printf '%b' "$(oct 1 "$opt" "$n" 200 0 16)" > "fuzz_session/e-unsealed-$opt-$n"
  done
done
printf '%b' "$(oct 0 0)kvesess$(oct 0 1 0 0 0)" > fuzz_session/e-raw-magic
printf '%b' "$(oct 0 5)" > fuzz_session/e-raw-empty
printf '%b' "$(oct 0 2)not a session at all, just some text" > fuzz_session/e-raw-junk

# ---- fuzz_llama ----
# kvevict-llama's sequence states (fuzz_llama.c): mode, then the tokens
# decoded; mode 1 with the policy, 3 without; bits 3-5 the edits (4 bytes
# each); mode 0 raw bytes (16: into the sequence without a policy).
mkdir -p fuzz_llama
rm -f fuzz_llama/*
printf '%b' "$(oct 1 20)" > fuzz_llama/made-policy-20
printf '%b' "$(oct 3 20)" > fuzz_llama/made-none-20
printf '%b' "$(oct 1 47)" > fuzz_llama/made-policy-48
printf '%b' "$(oct 1 0)" > fuzz_llama/made-policy-1
printf '%b' "$(oct 9 30 0 100 0 7)" > fuzz_llama/edit1-set
printf '%b' "$(oct 17 30 1 10 0 3 5 200 1 9)" > fuzz_llama/edit2-flip-special
printf '%b' "$(oct 25 25 2 50 1 0 4 90 0 2)" > fuzz_llama/edit3-truncate
printf '%b' "$(oct 11 12 4 64 0 5)" > fuzz_llama/none-edit-special
printf '%b' "$(oct 0)kvlseq$(oct 0 0 1 0 0 0)" > fuzz_llama/raw-magic
printf '%b' "$(oct 0)not a sequence state" > fuzz_llama/raw-junk
printf '%b' "$(oct 16)" > fuzz_llama/raw-empty-none

echo "seeds: $(ls fuzz_spec | wc -l) spec, $(ls fuzz_api | wc -l) api, $(ls fuzz_state | wc -l) state, $(ls fuzz_npy | wc -l) npy," \
  "$(ls fuzz_qk | wc -l) qk, $(ls fuzz_memory | wc -l) memory, $(ls fuzz_checkpoint | wc -l) checkpoint," \
  "$(ls fuzz_tokenizer | wc -l) tokenizer, $(ls fuzz_gguf | wc -l) gguf, $(ls fuzz_heads | wc -l) heads, $(ls fuzz_session | wc -l) session"
