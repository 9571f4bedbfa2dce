#!/bin/sh
# SPDX-License-Identifier: MIT
# test_cli_robust.sh KVEVICT SOURCE_DIR - the kvevict tool against bad
# arguments and bad files, systematically (tests/test_cli.sh checks the
# happy paths and a hand-picked set of errors):
#   - every subcommand: missing required options, an option missing its
#     value, a repeated single option, an unknown option, a stray word,
#     every numeric option given malformed and huge numbers, bad and
#     contradictory policy specs and trace specs -> exit 2;
#   - every .npy file of the fuzz seed corpus (malformed headers, dtypes,
#     shapes, truncations, NaN / inf / negative weights) and truncations of a
#     valid file, through eval, replay, sweep and trace -> exit 0 with output,
#     or exit 1; never a crash, never exit 2 for a bad file;
#   - every failure prints exactly one line on stderr and nothing on stdout,
#     and `trace -o` leaves no output or temporary file behind.
# POSIX sh. Prints "N passed, M failed".
set -u
K=${1:?usage: test_cli_robust.sh PATH/TO/kvevict SOURCE_DIR}
SRC=${2:?usage: test_cli_robust.sh PATH/TO/kvevict SOURCE_DIR}
D=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-robust.XXXXXX") || exit 1
trap 'rm -rf "$D"' EXIT INT TERM
passed=0
failed=0
fail() { echo "FAIL: $*" >&2; failed=$((failed + 1)); }

# expect CODES ARGS... : the exit status is one of CODES ("2", "1", "01");
# a failure has exactly one line on stderr and nothing on stdout; a success
# prints something on stdout.
expect() {
    codes=$1; shift
    "$K" "$@" >"$D/out" 2>"$D/err"
    rc=$?
    case "$codes" in
        *"$rc"*) ;;
        *) fail "kvevict $*: exit $rc, want one of $codes"; sed 's/^/  | /' "$D/err" | head -3 >&2; return 1 ;;
    esac
    if [ "$rc" -ne 0 ]; then
        if [ "$(wc -l <"$D/err")" -ne 1 ]; then
            fail "kvevict $*: $(wc -l <"$D/err") lines on stderr, want 1"; head -3 "$D/err" >&2; return 1
        fi
        if [ -s "$D/out" ]; then fail "kvevict $*: exit $rc with output on stdout"; return 1; fi
    elif [ ! -s "$D/out" ] && [ "$1" != trace ]; then
        fail "kvevict $*: exit 0 with nothing on stdout"; return 1
    fi
    passed=$((passed + 1))
    return 0
}

C="canonical:steps=48"
P="h2o:budget=16,recent_window=4"

# ---- usage: missing, repeated, unknown, stray ------------------------------
expect 2 nosuchcommand
expect 2 --nosuchoption
for cmd in eval replay sweep; do
    expect 2 $cmd
    expect 2 $cmd --trace "$C"
    expect 2 $cmd --policy "$P"
    expect 2 $cmd --trace "$C" --policy "$P" --nosuchoption
    expect 2 $cmd --trace "$C" --policy "$P" stray
    expect 2 $cmd --trace "$C" --policy "$P" --trace "$C"
    expect 2 $cmd --trace "$C" --policy "$P" --policy "$P"
    expect 2 $cmd --trace "$C" --policy
    expect 2 $cmd --policy "$P" --trace
    expect 2 $cmd --trace "$C" --policy "$P" --seed
    expect 2 $cmd --trace "$C" --policy "$P" --normalize=1
    expect 2 $cmd --trace "" --policy "$P"
    expect 2 $cmd --trace "$C" --policy ""
done
expect 2 trace
expect 2 trace --trace "$C"
expect 2 trace -o "$D/x.npy"
expect 2 trace --trace "$C" -o
expect 2 trace --trace "$C" -o "$D/x.npy" -o "$D/y.npy"
expect 2 trace --trace "$C" -o "$D/x.npy" stray
expect 2 trace --trace "$C" -o "$D/x.npy" --head
expect 2 trace --trace "$C" -o ""
expect 2 bench stray
expect 2 bench --trace
expect 2 bench --seed
expect 2 policies stray
expect 2 plot --out
expect 2 plot stray stray2
expect 2 docs
expect 2 docs --check
expect 2 help nosuchcommand
[ -e "$D/x.npy" ] && fail "trace wrote $D/x.npy on a usage error"

# ---- usage: numbers --------------------------------------------------------
for n in "" " 1" "1 " "-1" "+1" "0x10" "1e3" "1.5" "abc" "99999999999999999999999" \
         "18446744073709551616" "18446744073709551615"; do
    expect 2 eval --trace "$C" --policy "$P" --budget "$n"
    expect 2 replay --trace "$C" --policy "$P" --budget "$n"
    expect 2 sweep --trace "$C" --policy "$P" --budget "$n"
    expect 2 sweep --trace "$C" --policy "$P" --budget "32,$n"
    expect 2 replay --trace "$C" --policy "$P" --head "$n"
    expect 2 trace --trace "$C" -o "$D/x.npy" --head "$n"
    [ "$n" = "18446744073709551615" ] || expect 2 eval --trace "$C" --policy "$P" --seed "$n"
    expect 2 sweep --trace "$C" --policy "$P" --param "recent_window=$n"
    expect 2 eval --trace "canonical:steps=$n" --policy "$P"
    expect 2 eval --trace "$C" --policy "h2o:budget=$n"
done
expect 0 eval --trace "$C" --policy "$P" --seed 18446744073709551615
expect 2 eval --trace "$C" --policy "$P" --budget 0
expect 2 eval --trace "$C" --policy "$P" --budget 16777217
expect 2 eval --trace "$C" --policy "$P" --budget 4          # <= recent_window
expect 2 eval --trace "$C" --policy "streaming:budget=8,sinks=4" --budget 3
expect 2 replay --trace "$C" --policy "$P" --head 1         # one head only
expect 2 trace --trace "$C" -o "$D/x.npy" --head 1
expect 2 eval --trace "canonical:steps=16777217" --policy "$P"
expect 2 eval --trace "canonical:steps=0" --policy "$P"
expect 2 eval --trace "canonical:heavy=1025" --policy "$P"
expect 2 eval --trace "canonical:seed=18446744073709551616" --policy "$P"
expect 2 eval --trace "canonical:jitter=0.96" --policy "$P"
expect 2 eval --trace "canonical:," --policy "$P"
expect 2 eval --trace "canonical:" --policy "$P"
[ -e "$D/x.npy" ] && fail "trace wrote $D/x.npy on a usage error"

# ---- usage: policy specs, for every policy ----------------------------------
for p in $("$K" policies | tail -n +2 | cut -d" " -f1); do
    for bad in "$p:budget=0" "$p:budget=16777217" "$p:budget=" "$p:" "$p:budget=8,budget=8" \
               "$p:nokey=1" "$p:budget=8," "$p,budget=8" "$p:budget=8:budget=9"; do
        expect 2 eval --trace "$C" --policy "$bad"
    done
    expect 2 sweep --trace "$C" --policy "$p" --param nokey=1
    expect 2 sweep --trace "$C" --policy "$p" --param budget=16 --budget 32
    expect 2 sweep --trace "$C" --policy "$p" --budget 16 --csv --json
done

# ---- input: every .npy of the fuzz seed corpus, and truncations ---------------
"$K" trace --trace "canonical:steps=24" -o "$D/good.npy" 2>"$D/err" ||
    fail "trace could not write a valid file: $(cat "$D/err")"
size=$(wc -c <"$D/good.npy")
for cut in 0 1 5 6 8 9 10 11 64 127 128 129 $((size / 2)) $((size - 4)) $((size - 1)); do
    head -c "$cut" "$D/good.npy" >"$D/trunc-$cut.npy"
done
mkdir "$D/w"
for f in "$SRC"/fuzz/corpus/fuzz_npy/* "$D"/trunc-*.npy; do
    [ -f "$f" ] || continue
    # A bad file is bad input (1), never usage (2), never a crash.
    expect 01 eval --trace "$f" --policy window:budget=2 || continue
    ok=$( [ -s "$D/out" ] && echo 1 || echo 0 )
    expect 01 eval --trace "$f" --policy window:budget=2 --normalize
    expect 01 replay --trace "$f" --policy window:budget=2
    expect 01 sweep --trace "$f" --policy tova:budget=2,recent_window=0 --budget 1,2
    rm -f "$D/w/"*
    if expect 01 trace --trace "$f" -o "$D/w/t.npy"; then
        if [ -f "$D/w/t.npy" ]; then
            [ "$ok" = 1 ] || fail "trace converted $f, which eval refused"
            expect 0 eval --trace "$D/w/t.npy" --policy window:budget=2
        elif [ -n "$(ls "$D/w")" ]; then
            fail "trace --trace $f left $(ls "$D/w") behind"
        fi
    fi
done
case "$(ls "$D"/trunc-*.npy 2>/dev/null | wc -l)" in 0) fail "no truncations made" ;; esac
for t in "$D"/trunc-*.npy; do
    expect 1 eval --trace "$t" --policy "$P"
done

# ---- input: unreadable paths; failed writes leave nothing ----------------
expect 1 eval --trace "$D/missing.npy" --policy "$P"
expect 1 eval --trace "$D" --policy "$P"
expect 1 eval --trace /dev/null --policy "$P"
: >"$D/empty.npy"
expect 1 eval --trace "$D/empty.npy" --policy "$P"
expect 1 trace --trace "$C" -o "$D/no/such/dir/x.npy"
mkdir "$D/isdir.npy"
expect 1 trace --trace "$C" -o "$D/isdir.npy"
cp "$D/good.npy" "$D/keep.npy"
expect 1 trace --trace "$D/trunc-129.npy" -o "$D/keep.npy"
cmp -s "$D/good.npy" "$D/keep.npy" || fail "a failed trace -o changed the existing file"
ls "$D" | grep -q '\.tmp\|keep\.npy\.' && fail "a failed trace -o left a temporary file"
expect 1 docs --check "$D/missing.md"
# The library's flag names reach the user as the CLI's options, and an I/O
# error carries the system's reason.
expect 1 eval --trace "$SRC/fuzz/corpus/fuzz_npy/n-v1-unnormalized.npy" --policy "$P"
grep -q 'pass --normalize' "$D/err" || fail "the sum error does not say 'pass --normalize': $(cat "$D/err")"
grep -q 'KVE_' "$D/err" && fail "a C name in a CLI message: $(cat "$D/err")"
expect 1 eval --trace "$D/missing.npy" --policy "$P"
grep -q 'No such file or directory' "$D/err" || fail "no system reason: $(cat "$D/err")"
[ "$(grep -o "$D/missing.npy" "$D/err" | wc -l)" -eq 1 ] || fail "the path is not printed once: $(cat "$D/err")"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
