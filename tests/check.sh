# SPDX-License-Identifier: MIT
# check.sh - what the shell tests share (their counterpart of check.h), sourced
# by them: `. "$(dirname "$0")/check.sh"`. expect_err and expect_says run "$K",
# the kvevict binary the sourcing script names.
#   fail DESC            a failed check, reported on stderr and counted
#   ok                   a passed check, counted
#   check DESC CMD...    CMD must succeed
#   scratch NAME         a private directory $D, removed when the script exits
#   expect_err CODE ARGS...         kvevict ARGS exits CODE with exactly one
#                                   line on stderr and nothing on stdout
#   expect_says CODE WORDS ARGS...  expect_err, and that line contains WORDS
#   gguf_file_type_at FILE  the offset of general.file_type's key in a GGUF
#   gguf_file_type FILE     its value (llama.h's LLAMA_FTYPE_*), or "none"
#   logits_rel_rms A B ROWS the relative RMS difference of two `logits`
#                           outputs (JSON Lines, pos, token, logits) of ROWS
#                           rows each, sqrt(sum (a - b)^2 / sum b^2); "nan"
#                           when the rows are not ROWS
fails=0
checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
ok() { checks=$((checks + 1)); }
check() {
    d=$1; shift
    if "$@"; then ok; else fail "$d"; fi
}
scratch() {
    D=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || exit 1
    trap 'rm -rf "$D"' EXIT INT TERM
}
# One error line on stderr, nothing on stdout, exit CODE; 1 (reported) if not.
error_shape() {
    code=$1; shift
    "$K" "$@" >"$D/out" 2>"$D/err"
    rc=$?
    if [ "$rc" -ne "$code" ]; then fail "kvevict $*: exit $rc, expected $code"; return 1; fi
    if [ "$(wc -l <"$D/err")" -ne 1 ]; then fail "kvevict $*: stderr is not one line:"; cat "$D/err" >&2; return 1; fi
    if [ -s "$D/out" ]; then fail "kvevict $*: wrote to stdout on error"; return 1; fi
}
expect_err() {
    error_shape "$@" && ok
}
expect_says() {
    code=$1; words=$2; shift 2
    error_shape "$code" "$@" || return
    if grep -qF -- "$words" "$D/err"; then ok; else fail "kvevict $*: want '$words' in: $(cat "$D/err")"; fi
}
gguf_file_type_at() { grep -obUa 'general\.file_type' "$1" | head -n 1 | cut -d: -f1; }
gguf_file_type() {
    at=$(gguf_file_type_at "$1") # the key's 17 bytes, its type (u32), the value (u32)
    if [ -n "$at" ]; then od -An -tu4 -j $((at + 21)) -N 4 "$1" | tr -d ' '; else echo none; fi
}
logits_rel_rms() {
    paste -d '\n' "$1" "$2" | awk -v want="$3" '
        { gsub(/.*"logits": \[/, ""); gsub(/\]\}/, ""); n = split($0, v, ", ") }
        NR % 2 == 1 { for (i = 1; i <= n; i++) a[i] = v[i]; next }
        { for (i = 1; i <= n; i++) { d = a[i] - v[i]; num += d * d; den += v[i] * v[i] } rows++ }
        END { if (rows != want || !(den > 0)) print "nan"; else printf "%.5f\n", sqrt(num / den) }'
}
