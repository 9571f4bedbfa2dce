#!/bin/sh
# SPDX-License-Identifier: MIT
# quiet.sh LOG COMMAND... - runs COMMAND with its output in LOG; prints LOG
# only when COMMAND fails (and fails with it). `make run` builds through it,
# so a good build prints nothing and a broken one shows why.
log=${1:?usage: quiet.sh LOG COMMAND...}
shift
mkdir -p "$(dirname "$log")"
"$@" >"$log" 2>&1
rc=$?
[ "$rc" -eq 0 ] && exit 0
cat "$log" >&2
echo "quiet.sh: '$*' failed (exit $rc); the output above is also in $log" >&2
exit "$rc"
