#!/bin/sh
# SPDX-License-Identifier: MIT
# test_docs.sh KVEVICT SOURCE_DIR - the docs drift test: every measured block
# of docs/*.md and docs/policies/*.md must equal what the tools print now
# (kvevict docs --check), except the cells of "ns/step" columns, which are
# timings. On failure, run `make docs` and commit the result.
# With a third argument `quick` (the sanitized, instrumented and emulated
# builds), the `seeds` blocks are left unchecked: each is 21 benches, minutes
# under ASan or valgrind, of code every other block and test_calibration run
# there too; the native suite checks them all.
set -u
K=${1:?usage: test_docs.sh PATH/TO/kvevict SOURCE_DIR}
SRC=${2:?usage: test_docs.sh PATH/TO/kvevict SOURCE_DIR}
SKIP=
[ "${3:-}" = quick ] && SKIP="--skip seeds"
set --
for f in "$SRC"/docs/*.md "$SRC"/docs/policies/*.md; do
    [ -f "$f" ] && set -- "$@" "$f"
done
if ! grep -q '^<!-- kvevict:begin results -->' "$SRC/docs/results.md"; then
    echo "FAIL: docs/results.md has no 'results' block" >&2
    exit 1
fi
cd "$SRC" || exit 1 # blocks may name a trace by a path relative to the tree
# shellcheck disable=SC2086
"$K" docs --check $SKIP "$@" || { echo "FAIL: the docs drifted from the tools' output; run make docs" >&2; exit 1; }
echo "test_docs: $# files checked${SKIP:+ (quick: seeds blocks left to the native suite)}"
