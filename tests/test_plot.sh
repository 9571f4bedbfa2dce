#!/bin/sh
# SPDX-License-Identifier: MIT
# test_plot.sh KVEVICT - `kvevict plot` renders its four PNG files with
# gnuplot and removes its temporary files. Skipped (exit 77) where gnuplot is
# not installed: `make plots` installs it, `make test` does not.
set -u
K=${1:?usage: test_plot.sh PATH/TO/kvevict}
command -v gnuplot >/dev/null 2>&1 || { echo "test_plot: gnuplot not installed, skipped"; exit 77; }
D=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-plot-test.XXXXXX") || exit 1
trap 'rm -rf "$D"' EXIT INT TERM
mkdir "$D/img" "$D/tmp"
fails=0
TMPDIR="$D/tmp" "$K" plot --out "$D/img" --trace canonical:steps=1200 >"$D/out" 2>"$D/err" || { echo "FAIL: plot: $(cat "$D/err")"; fails=1; }
for f in mass_vs_budget recall_vs_budget h2o_recent_window trace_h2o; do
    head -c 4 "$D/img/$f.png" 2>/dev/null | od -c | grep -q 'P   N   G' || { echo "FAIL: no PNG $f.png"; fails=1; }
done
[ -z "$(ls "$D/tmp")" ] || { echo "FAIL: temporary files left in TMPDIR"; fails=1; }
[ "$fails" -eq 0 ] && echo "test_plot: 4 PNG files written"
exit "$fails"
