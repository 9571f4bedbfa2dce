# SPDX-License-Identifier: MIT
# cli_check.sh - the helpers the command-line tests share, sourced after
# setting K (the kvevict binary) and D (a scratch directory):
#   check DESCRIPTION COMMAND...   the command must succeed
#   expect_err CODE ARGS...        kvevict ARGS exits CODE with exactly one
#                                  line on stderr and nothing on stdout
# They count into `checks` and `fails`; a failure prints "FAIL: ..." on
# stderr. POSIX sh.
fails=0
checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
ok() { checks=$((checks + 1)); }
check() {
    d=$1; shift
    if "$@"; then ok; else fail "$d"; fi
}
expect_err() {
    code=$1; shift
    "$K" "$@" >"$D/out" 2>"$D/err"
    rc=$?
    if [ "$rc" -ne "$code" ]; then fail "kvevict $*: exit $rc, expected $code"; return; fi
    if [ "$(wc -l <"$D/err")" -ne 1 ]; then fail "kvevict $*: stderr is not one line:"; cat "$D/err" >&2; return; fi
    if [ -s "$D/out" ]; then fail "kvevict $*: wrote to stdout on error"; return; fi
    ok
}
