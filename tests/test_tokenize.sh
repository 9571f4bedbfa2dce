#!/bin/sh
# SPDX-License-Identifier: MIT
# test_tokenize.sh KVEVICT CONVERT LM_TOKENIZE TOK_FIXTURE SOURCE_DIR [LLAMA_TOKENIZE LIBDIR]
#
# A GGUF's vocabulary as llama.cpp reads it (docs/decoder.md, "Tokenizer"):
#  - with llama.cpp (LLAMA_TOKENIZE, tests/llama_tokenize.c over the pinned
#    libllama): on the held-out text and on edge strings (empty, spaces,
#    tabs and newlines, CRLF, emoji, CJK, a BOM, NUL, invalid UTF-8, runs of
#    digits, contractions, special-token text, Unicode spaces, punctuation),
#    the decoder's ids (lm_tokenize: BOS and EOS as the vocabulary adds them)
#    equal llama_tokenize's (add_special, no parse_special), and the bytes
#    each id decodes to equal llama_token_to_piece's, for: the committed
#    SentencePiece model; its vocabulary with add_bos_token false,
#    add_space_prefix false, BOS 5, add_eos_token true; byte-level BPE
#    vocabularies (tok_fixture: merges trained on the held-out text) under
#    every pre-tokenizer family the decoder has (no tokenizer.ggml.pre,
#    default, gpt-2, llama-bpe, llama-bpe without BOS, qwen2, smollm); a BPE
#    model through kvevict-convert (its vocabulary carried, Q8_0) and random
#    weights given that vocabulary with --tokenizer. Without LLAMA_TOKENIZE
#    (kvevict-llama not built) that part is skipped, saying so;
#  - text in, text out: a BPE vocabulary decodes its ids back to the input's
#    bytes for every valid UTF-8 input; `kvevict lm eval`, `lm logits
#    --prompt` (its tokens those of lm_tokenize) and `generate` run on BPE
#    and on the flag variants;
#  - refused with one line naming it: a pre-tokenizer the decoder lacks
#    (tekken), another tokenizer model (bert); kvevict-convert refuses a
#    llama2.c checkpoint with no tokenizer.bin beside it, and writes every
#    GGUF with a vocabulary (--random: a placeholder llama.cpp loads).
set -u
K=${1:?usage: test_tokenize.sh KVEVICT CONVERT LM_TOKENIZE TOK_FIXTURE SOURCE_DIR [LLAMA_TOKENIZE LIBDIR]}
C=${2:?usage}
LT=${3:?usage}
FX=${4:?usage}
SRC=${5:?usage}
LLT=${6:-}
LIB=${7:-}
cd "$SRC" || exit 1
M=models/kjv.gguf
if [ ! -f "$M" ] || [ ! -f models/heldout.txt ]; then
    echo "test_tokenize: no $M or models/heldout.txt here: skipped"
    exit 77
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/kve-tok.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

# ---- the strings ----
E=$W/edge
mkdir -p "$E"
printf '' >"$E/empty"
printf ' ' >"$E/space"
printf '    ' >"$E/spaces"
printf ' leading space' >"$E/leading"
printf 'a\tb\nc\n\n\tindented\n' >"$E/tabs"
printf 'line one\r\nline two\r\n\r\n' >"$E/crlf"
printf 'smile \360\237\231\202 party \360\237\216\211\360\237\216\211!' >"$E/emoji"
printf '\346\227\245\346\234\254\350\252\236\343\201\256\343\203\206\343\202\255\343\202\271\343\203\210 \344\270\255\346\226\207 \355\225\234\352\265\255\354\226\264' >"$E/cjk"
printf '\357\273\277BOM first' >"$E/bom"
printf 'a\000b \000' >"$E/nul"
printf 'x\200y' >"$E/invalid1"
printf 'a\303 b' >"$E/invalid2"
printf 'bad \377\376 bytes' >"$E/invalid3"
printf 'cut \346\227' >"$E/invalid4"
printf '1 12 123 1234 12345 1234567890 3.14 2024-01-01 007' >"$E/digits"
printf "don't I'm we're they've you'll he'd IT'S We'Re O'Neil 's 't" >"$E/contractions"
printf '<s> </s> <unk> <|endoftext|> <|sep|> x<|sep|>y <|eot_id|><|sep|>' >"$E/special"
printf 'caf\303\251 na\303\257ve \303\234n\303\257c\303\266d\303\251' >"$E/accents"
printf 'Hello, World! (test) [x] {y} $100 + 5 = 105 ^_^ ~t~ a|b `q` #1 @me 50%%' >"$E/punct"
printf 'a  b   c    \n   \n\t\t x   ' >"$E/multispace"
printf 'a\302\240b\342\200\203c\343\200\200d \302\205e' >"$E/uspace"
printf 'And the LORD said unto Moses, Bethlehemjudah.' >"$E/kjv"
cp models/heldout.txt "$E/heldout"
valid="empty space spaces leading tabs crlf emoji cjk bom nul digits contractions special accents punct multispace uspace kjv heldout"
FILES=$(for f in "$E"/*; do printf '%s ' "$f"; done)

# ---- the vocabularies ----
V=$W/v
mkdir -p "$V"
cp "$M" "$V/spm.gguf"
"$FX" vocab "$M" "$V/spm-nobos.gguf" add_bos=0 || bad "tok_fixture vocab add_bos=0"
"$FX" vocab "$M" "$V/spm-noprefix.gguf" add_space_prefix=0 || bad "tok_fixture add_space_prefix=0"
"$FX" vocab "$M" "$V/spm-bos5.gguf" bos=5 || bad "tok_fixture vocab bos=5"
"$FX" vocab "$M" "$V/spm-eos.gguf" add_eos=1 || bad "tok_fixture vocab add_eos=1"
for pre in - default gpt-2 llama-bpe qwen2 smollm; do
    "$FX" bpe models/heldout.txt $pre 600 "$V/bpe-$pre.gguf" 2>/dev/null || bad "tok_fixture bpe $pre"
done
"$FX" bpe models/heldout.txt llama-bpe 600 "$V/bpe-llama-nobos.gguf" add_bos=0 2>/dev/null ||
    bad "tok_fixture bpe llama-bpe add_bos=0"
"$C" --model "$V/bpe-llama-bpe.gguf" --to gguf --type q8_0 -o "$V/bpe-converted.gguf" 2>"$W/err" ||
    bad "kvevict-convert of a BPE model: $(cat "$W/err")"
"$C" --random dim=64,hidden=128,layers=1,heads=2,kv_heads=1,vocab=859,seq_len=64 \
    --tokenizer "$V/bpe-qwen2.gguf" --to gguf -o "$V/bpe-random.gguf" 2>"$W/err" ||
    bad "kvevict-convert --random --tokenizer BPE.gguf: $(cat "$W/err")"

# ---- against llama.cpp ----
if [ -n "$LLT" ]; then
    total=0
    for v in "$V"/*.gguf; do
        name=$(basename "$v" .gguf)
        # shellcheck disable=SC2086
        "$LT" "$v" $FILES >"$W/lm.out" 2>"$W/err" || { bad "lm_tokenize $name: $(cat "$W/err")"; continue; }
        # shellcheck disable=SC2086
        "$LLT" "$LIB" "$v" $FILES >"$W/llama.out" 2>"$W/err" ||
            { bad "llama_tokenize $name: $(cat "$W/err")"; continue; }
        i=0
        same=0
        toks=0
        for f in $FILES; do
            i=$((i + 1))
            [ "$(basename "$f")" = heldout ] &&
                toks=$(sed -n "$((2 * i - 1))p" "$W/lm.out" | tr ',' '\n' | wc -l | tr -d ' ')
            a=$(sed -n "$((2 * i - 1)),$((2 * i))p" "$W/lm.out")
            b=$(sed -n "$((2 * i - 1)),$((2 * i))p" "$W/llama.out")
            if [ "$a" = "$b" ]; then
                same=$((same + 1))
            else
                bad "$name, $(basename "$f"): ids or pieces differ from llama.cpp's
  decoder: $(printf '%s' "$a" | head -c 400)
  llama:   $(printf '%s' "$b" | head -c 400)"
            fi
        done
        echo "$name: $same of $i strings equal llama.cpp's ids and pieces (held-out text: $toks tokens)"
        total=$((total + same))
    done
    echo "tokens equal to llama.cpp's on $total strings in all"
else
    echo "test_tokenize: llama.cpp's side skipped: kvevict-llama is not built (configure with -DKVEVICT_LLAMA=ON)"
fi

# ---- the figures docs/decoder.md quotes (Tokenizer, "Measured") ----
count() { "$LT" "$1" "$E/heldout" | sed -n '1s/^ids //p' | tr ',' '\n' | wc -l | tr -d ' '; }
nspm=$(count "$V/spm.gguf")
nbpe=$(count "$V/bpe-gpt-2.gguf")
nstr=$(echo $FILES | wc -w | tr -d ' ')
nvoc=$(ls "$V"/*.gguf | wc -l | tr -d ' ')
group() { printf '%s' "$1" | sed -e ':a' -e 's/\([0-9]\)\([0-9]\{3\}\)\($\|,\)/\1,\2\3/' -e 'ta'; }
doc=$(tr '\n' ' ' <docs/decoder.md)
for fact in "$(group "$nspm") tokens with BOS on the committed vocabulary" \
    "$(group "$nbpe") tokens of the held-out text" "on the $nstr strings" "for each of $nvoc vocabularies"; do
    case $doc in
    *"$fact"*) ;;
    *) bad "docs/decoder.md does not say '$fact' (measured now)" ;;
    esac
done

# ---- text in, text out ----
hex() { od -An -tx1 -v "$1" | tr -d ' \n'; }
for v in bpe-default bpe-llama-bpe bpe-qwen2 bpe-converted; do
    for s in $valid; do
        "$LT" "$V/$v.gguf" "$E/$s" >"$W/rt" 2>"$W/err" || { bad "lm_tokenize $v $s: $(cat "$W/err")"; continue; }
        [ "$(sed -n 2p "$W/rt")" = "text $(hex "$E/$s")" ] || bad "$v: $s does not decode back to its bytes"
    done
done
head -c 3000 models/heldout.txt >"$W/text"
for v in bpe-llama-bpe bpe-llama-nobos bpe-gpt-2 spm-nobos spm-noprefix spm-bos5; do
    "$K" lm eval --model "$V/$v.gguf" --text "$W/text" --threads 1 --quiet --json >"$W/eval" 2>"$W/err" ||
        bad "lm eval on $v: $(cat "$W/err")"
    grep -q '"bits_per_byte": [0-9]' "$W/eval" || bad "lm eval on $v: no bits per byte"
    "$K" generate --model "$V/$v.gguf" --prompt "And Ruth said" --steps 6 --threads 1 >"$W/gen" 2>"$W/err" ||
        bad "generate on $v: $(cat "$W/err")"
    printf "don't 12345" >"$W/p"
    "$K" lm logits --model "$V/$v.gguf" --prompt "don't 12345" --threads 1 -o "$W/logits" 2>"$W/err" ||
        bad "lm logits --prompt on $v: $(cat "$W/err")"
    got=$(sed 's/.*"token": \([0-9]*\).*/\1/' "$W/logits" | tr '\n' ',' | sed 's/,$//')
    want=$("$LT" "$V/$v.gguf" "$W/p" | sed -n '1s/^ids //p')
    [ "$got" = "$want" ] || bad "lm logits --prompt on $v: tokens $got, lm_tokenize $want"
done
# bytes of a window: the SentencePiece prefix space counts, BPE has none
"$K" lm eval --model "$V/bpe-gpt-2.gguf" --text "$W/text" --threads 1 --quiet --json >"$W/eval" 2>&1
grep -q '"bytes": 3000' "$W/eval" || bad "lm eval on BPE: not 3000 bytes ($(head -c 300 "$W/eval"))"
"$K" lm eval --model "$V/spm.gguf" --text "$W/text" --threads 1 --quiet --json >"$W/eval" 2>&1
grep -q '"bytes": 3001' "$W/eval" || bad "lm eval on SentencePiece: not 3001 bytes"

# ---- refusals ----
"$FX" vocab "$V/bpe-qwen2.gguf" "$V/tekken.gguf" pre=tekken || bad "tok_fixture pre=tekken"
"$FX" vocab "$M" "$V/bert.gguf" model=bert || bad "tok_fixture model=bert"
for r in "tekken:tokenizer.ggml.pre 'tekken' is not supported" "bert:tokenizer.ggml.model 'bert' is not supported"; do
    v=${r%%:*}
    want=${r#*:}
    if "$K" lm eval --model "$V/$v.gguf" --text "$W/text" --threads 1 --quiet >"$W/out" 2>"$W/err"; then
        bad "lm eval on $v: accepted"
    fi
    [ "$(wc -l <"$W/err")" -eq 1 ] && grep -q "$want" "$W/err" || bad "lm eval on $v: not one line saying '$want': $(cat "$W/err")"
    if "$C" --model "$V/$v.gguf" --to gguf -o "$W/x.gguf" 2>"$W/err"; then
        bad "kvevict-convert carried an unreadable vocabulary ($v)"
    fi
    grep -q "$want" "$W/err" || bad "kvevict-convert on $v: $(cat "$W/err")"
    [ ! -e "$W/x.gguf" ] || bad "kvevict-convert on $v left an output"
done
cp models/kjv.bin "$W/lone.bin"
"$C" --model "$W/lone.bin" --to gguf -o "$W/x.gguf" 2>"$W/err" && bad "a llama2.c checkpoint without a tokenizer converted"
grep -q "give --tokenizer" "$W/err" || bad "kvevict-convert without a vocabulary: $(cat "$W/err")"
"$C" --random dim=64,hidden=128,layers=1,heads=2,kv_heads=1,vocab=300,seq_len=64 --to gguf \
    -o "$W/r.gguf" 2>"$W/err" || bad "kvevict-convert --random: $(cat "$W/err")"
"$LT" "$W/r.gguf" "$E/kjv" >/dev/null 2>"$W/err" || bad "--random's placeholder vocabulary: $(cat "$W/err")"
if [ -n "$LLT" ]; then
    "$LLT" "$LIB" "$W/r.gguf" "$E/kjv" >/dev/null 2>"$W/err" ||
        bad "llama.cpp refuses --random's placeholder vocabulary: $(cat "$W/err")"
fi
[ $fail -eq 0 ] && echo "test_tokenize: ok"
exit $fail
