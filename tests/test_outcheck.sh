#!/bin/sh
# SPDX-License-Identifier: MIT
# test_outcheck.sh OUTCHECK - the output checker itself: it must accept
# valid JSON, JSON Lines and CSV, and refuse each kind of malformation with
# "NAME:LINE:COL: message" (a checker that accepted everything would make
# the CLI tests worthless). POSIX sh.
set -u
C=${1:?usage: test_outcheck.sh PATH/TO/outcheck}
D=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-outcheck.XXXXXX") || exit 1
trap 'rm -rf "$D"' EXIT INT TERM
fails=0
checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# good MODE TEXT [CHECKS...]: accepted, silently.
good() {
    mode=$1; text=$2; shift 2
    printf '%b' "$text" >"$D/in"
    if "$C" "$mode" "$@" "$D/in" 2>"$D/err"; then checks=$((checks + 1))
    else fail "$mode rejected $(printf '%s' "$text" | head -c 80): $(cat "$D/err")"; fi
}
# bad MODE TEXT WHERE [CHECKS...]: refused (exit 1), the message at WHERE (LINE:COL).
bad() {
    mode=$1; text=$2; where=$3; shift 3
    printf '%b' "$text" >"$D/in"
    "$C" "$mode" "$@" "$D/in" 2>"$D/err"
    rc=$?
    if [ "$rc" -ne 1 ]; then fail "$mode accepted (exit $rc): $(printf '%s' "$text" | head -c 80)"; return; fi
    if ! grep -q "in:$where: " "$D/err"; then fail "$mode: want the error at $where, got: $(cat "$D/err")"; return; fi
    checks=$((checks + 1))
}

good json '{"a": 1, "b": [true, false, null], "c": {"d": "e\\\\u00e9\\\\n"}, "f": -0.5e+3}\n'
good json ' [ ] '
good json '"caf\303\251 \360\237\230\200 \\\\ud83d\\\\ude00"'
good json '0'
good json '{"x": 1.5}' --key x:number --value x=1.5 --no-key y
good json '{"x": null}' --key 'x:number|null'
bad json '' 1:1
bad json '{"a": 1,}' 1:9
bad json '{"a" 1}' 1:6
bad json '[1, 2' 1:1
bad json '01' 1:1
bad json '1.' 1:3
bad json '.5' 1:1
bad json '1e' 1:3
bad json 'NaN' 1:1
bad json 'nul' 1:1
bad json '"a\tb"' 1:3
bad json '"\\x"' 1:3
bad json '"\\ud800"' 1:2
bad json '"\\udc00"' 1:2
bad json '"\300\200"' 1:2
bad json '"\355\240\200"' 1:2
bad json '"\377"' 1:2
bad json '{"a": 1, "a": 2}' 1:10
bad json '{"a": 1} x' 1:10
bad json '{"a": 1}' 1:1 --key b:number
bad json '{"a": "1"}' 1:7 --key a:number
bad json '{"a": 1.5}' 1:7 --key a:integer
bad json '{"a": 2}' 1:7 --value a=1
bad json '{"a": 2}' 1:7 --no-key a

good jsonl '{"a": 1}\n{"a": 2}\n' --count 2 --key a:integer
bad jsonl '{"a": 1}\n{"a": 2}\n' 3:1 --count 3
bad jsonl '{"a": 1}' 1:9
bad jsonl '{"a": 1}\n\n{"a": 2}\n' 2:1
bad jsonl '{"a": 1} {"a": 2}\n' 1:10
bad jsonl '[1]\n' 1:1
bad jsonl '{"a": 1}\n{"b": 2}\n' 2:1 --key a:number
bad jsonl '{"a":\n1}\n' 1:6

good csv 'a,b,c\n1,"x,y",n/a\n-2.5,"say ""hi""",3\n' --count 2 --key a:number --key c:'number|null'
good csv 'a\n' --count 0
bad csv '' 1:1
bad csv 'a,b\n1\n' 2:1
bad csv 'a,b\n1,2,3\n' 2:1
bad csv 'a,a\n1,2\n' 1:3
bad csv 'a,b\n1,2' 2:4
bad csv 'a\n"x\n' 2:1
bad csv 'a\n"x"y\n' 2:4
bad csv 'a\nx"y\n' 2:2
bad csv 'a,b\n1,x\n' 2:3 --key b:number
bad csv 'a,b\n1,2\n' 2:1 --key c:number

"$C" nosuchmode "$D/in" 2>/dev/null
[ $? -eq 2 ] && checks=$((checks + 1)) || fail "a bad mode is not a usage error"
"$C" json --key a:nosuchtype "$D/in" 2>/dev/null
[ $? -eq 2 ] && checks=$((checks + 1)) || fail "a bad type is not a usage error"

echo "test_outcheck: $checks checks passed, $fails failed"
[ "$fails" -eq 0 ]
