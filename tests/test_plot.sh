#!/bin/sh
# SPDX-License-Identifier: MIT
# test_plot.sh KVEVICT - the figures of the documentation tool (kvevict-docs,
# run through kvevict) rendered with gnuplot: `plot` (the four PNG files of
# docs/img/), `plot --jsonl` (a figure of JSON Lines rows: series, filters,
# numeric and category axes), `plot --real-model` (the figures of
# docs/real-model.md from its committed data files; a missing file skips its
# figure), `perf --plot`; the refusals; and no temporary file left behind.
# Skipped (exit 77) where gnuplot is not installed (`make test` installs it).
set -u
K=${1:?usage: test_plot.sh PATH/TO/kvevict}
command -v gnuplot >/dev/null 2>&1 || { echo "test_plot: gnuplot not installed, skipped"; exit 77; }
. "$(dirname "$0")/check.sh"
scratch kvevict-plot-test
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir "$D/img" "$D/tmp"
is_png() { head -c 4 "$1" 2>/dev/null | od -c | grep -q 'P   N   G'; }
no_temps() { check "$1: no temporary file left in TMPDIR" [ -z "$(ls "$D/tmp")" ]; }

TMPDIR="$D/tmp" "$K" plot --out "$D/img" --trace canonical:steps=1200 >"$D/out" 2>"$D/err"
check "plot ($(cat "$D/err"))" [ $? -eq 0 ]
for f in mass_vs_budget recall_vs_budget h2o_recent_window trace_h2o; do
    check "plot: $f.png" is_png "$D/img/$f.png"
done
no_temps plot
# The default --out (docs/img of the current directory) and a trace whose
# name gnuplot could not quote (the titles name it generically).
mkdir -p "$D/cwd/docs/img"
"$K" trace --trace canonical:steps=300 -o "$D/it's.npy" 2>"$D/err"
(cd "$D/cwd" && TMPDIR="$D/tmp" "$K" plot --trace "$D/it's.npy" >"$D/out" 2>"$D/err")
check "plot into ./docs/img, a trace named with a quote ($(cat "$D/err"))" is_png "$D/cwd/docs/img/trace_h2o.png"
expect_says 2 "--out: quotes and newlines are not supported" plot --out "$D/it's"
expect_says 2 "--out: quotes and newlines are not supported" plot --out "$D/a\"b"
"$K" plot --out "$D/a
b" >/dev/null 2>&1
check "plot --out with a newline: usage error" [ $? -eq 2 ]
mkdir "$D/q'd"
TMPDIR="$D/q'd" "$K" plot --out "$D/img" --trace canonical:steps=300 >"$D/out" 2>"$D/err"
check "a quote in TMPDIR is refused (2)" [ $? -eq 2 ] && grep -q "TMPDIR: quotes are not supported" "$D/err"
TMPDIR="$D/no/such" "$K" plot --out "$D/img" --trace canonical:steps=300 >"$D/out" 2>"$D/err"
check "an unusable TMPDIR is bad input (1)" [ $? -eq 1 ] && grep -q "cannot create a temporary directory" "$D/err"

# ---- plot --jsonl: one figure of committed measurements --------------------------
cat >"$D/rows.jsonl" <<'DATA'
{"policy": "h2o:budget=8", "budget": 8, "head": 0, "mass": 0.5, "name": "a"}
{"policy": "h2o:budget=16", "budget": 16, "head": 0, "mass": 0.7, "name": "b"}

{"policy": "window:budget=8", "budget": 8, "head": 1, "mass": null, "name": "a"}
{"policy": "window:budget=16", "budget": 16, "head": 1, "mass": 0.6, "name": "b"}
{"policy": "full", "budget": null, "head": 1, "mass": 1, "name": "c"}
{"policy": "none:budget=16", "budget": 16, "mass": 0.1, "name": "d"}
DATA
TMPDIR="$D/tmp" "$K" plot --jsonl "$D/rows.jsonl" --x budget --y mass --series head \
    --where 'policy!full' --title "a 'quoted'
title" --logx --png "$D/img/j1.png" >"$D/out" 2>"$D/err"
check "plot --jsonl, numeric x, series, --where, --logx ($(cat "$D/err"))" is_png "$D/img/j1.png"
check "plot --jsonl says what it wrote" grep -q "^wrote $D/img/j1.png$" "$D/out"
TMPDIR="$D/tmp" "$K" plot --jsonl "$D/rows.jsonl" --x name --y mass --xlabel X --ylabel Y \
    --png "$D/img/j2.png" >"$D/out" 2>"$D/err"
check "plot --jsonl, a category x, no series ($(cat "$D/err"))" is_png "$D/img/j2.png"
TMPDIR="$D/tmp" "$K" plot --jsonl "$D/rows.jsonl" --x head --y mass --series policy \
    --where 'budget:8|16' --where 'name!d' --png "$D/img/j3.png" >"$D/out" 2>"$D/err"
check "plot --jsonl, a few integers on x, named series ($(cat "$D/err"))" is_png "$D/img/j3.png"
TMPDIR="$D/tmp" "$K" plot --jsonl "$D/rows.jsonl" --x budget --y mass --series name \
    --yrange -0.5:0.65 --png "$D/img/j5.png" >"$D/out" 2>"$D/err"
check "plot --jsonl --yrange: lines leave the frame ($(cat "$D/err"))" is_png "$D/img/j5.png"
expect_says 2 "--yrange: '1' is not LO:HI" plot --jsonl "$D/rows.jsonl" --x budget --y mass --yrange 1 --png "$D/x.png"
expect_says 2 "--yrange: 2 is not below 1" plot --jsonl "$D/rows.jsonl" --x budget --y mass --yrange 2:1 --png "$D/x.png"
expect_err 2 plot --jsonl "$D/rows.jsonl" --x budget --y mass --yrange 0:x --png "$D/x.png"
no_temps "plot --jsonl"
PATH=/nonexistent "$K" plot --jsonl "$D/rows.jsonl" --x budget --y mass --png "$D/x.png" >"$D/out" 2>"$D/err"
check "plot --jsonl without gnuplot: bad input, how to install it" [ $? -eq 1 ] && grep -q 'apt-get install gnuplot-nox' "$D/err"
expect_says 2 "--jsonl needs --x, --y and --png" plot --jsonl "$D/rows.jsonl" --y mass --png "$D/x.png"
expect_err 2 plot --jsonl "$D/rows.jsonl" --x budget --y mass --where 'nocolon' --png "$D/x.png"
expect_says 1 "no row satisfies the --where options" plot --jsonl "$D/rows.jsonl" --x budget --y mass --where 'policy:none' --png "$D/x.png"
expect_says 1 "a row without nosuch" plot --jsonl "$D/rows.jsonl" --x nosuch --y mass --png "$D/x.png"
expect_says 1 "a row without nosuch" plot --jsonl "$D/rows.jsonl" --x budget --y nosuch --png "$D/x.png"
expect_says 2 "--jsonl needs --x, --y and --png" plot --jsonl "$D/rows.jsonl" --x budget --png "$D/x.png"
expect_says 2 "--jsonl needs --x, --y and --png" plot --jsonl "$D/rows.jsonl" --x budget --y mass
printf '{"x": "", "y": 1}\n{"x": "b", "y": 2}\n' >"$D/empty-x.jsonl"
TMPDIR= "$K" plot --jsonl "$D/empty-x.jsonl" --x x --y y --png "$D/img/j4.png" >"$D/out" 2>"$D/err"
check "plot --jsonl: an empty x is a category; TMPDIR empty is /tmp ($(cat "$D/err"))" is_png "$D/img/j4.png"
expect_err 1 plot --jsonl "$D/nosuch.jsonl" --x budget --y mass --png "$D/x.png"
printf '{"a": 1}\n{"a": [1]}\n' >"$D/nested.jsonl"
expect_says 1 "nested.jsonl:2:" plot --jsonl "$D/nested.jsonl" --x a --y a --png "$D/x.png"

# ---- plot --real-model: the figures of docs/real-model.md ------------------------
mkdir "$D/real"
TMPDIR="$D/tmp" "$K" plot --real-model "$SRC/docs/data/real-model" --out "$D/real" >"$D/out" 2>"$D/err"
check "plot --real-model ($(cat "$D/err"))" [ $? -eq 0 ]
n=0
for f in "$D"/real/real_*.png; do is_png "$f" && n=$((n + 1)); done
check "plot --real-model: its six figures ($n)" [ "$n" -eq 6 ]
mkdir "$D/some" "$D/real2"
cp "$SRC/docs/data/real-model/eval.jsonl" "$SRC/docs/data/real-model/eval-h2o.jsonl" "$D/some/"
TMPDIR="$D/tmp" "$K" plot --real-model "$D/some" --out "$D/real2" >"$D/out" 2>"$D/err"
check "plot --real-model with a file or two ($(cat "$D/err"))" is_png "$D/real2/real_bits_per_byte.png"
check "plot --real-model: a figure without its files is skipped, saying so" grep -q 'skipped' "$D/out"
no_temps "plot --real-model"
expect_says 2 "--trace does not apply" plot --real-model "$D/some" --out "$D/real2" --trace canonical
mkdir "$D/none"
TMPDIR="$D/tmp" "$K" plot --real-model "$D/none" --out "$D/real2" >"$D/out" 2>"$D/err"
check "plot --real-model of no data: every figure skipped ($(cat "$D/err"))" [ "$(grep -c '^skipped ' "$D/out")" -eq 6 ]
expect_says 2 "quotes" plot --real-model "$D/q'd" --out "$D/real2"

# ---- plot --calibration: the feasibility maps of docs/trace.md --------------------
for f in calibration-v3 calibration-v3-outside; do
    TMPDIR="$D/tmp" "$K" plot --calibration "$SRC/docs/data/$f.jsonl" --png "$D/img/$f.png" \
        >"$D/out" 2>"$D/err"
    check "plot --calibration $f ($(cat "$D/err"))" is_png "$D/img/$f.png"
    check "plot --calibration says what it wrote" grep -q "^wrote $D/img/$f.png$" "$D/out"
done
no_temps "plot --calibration"
expect_says 2 "--calibration needs --png PATH" plot --calibration "$SRC/docs/data/calibration-v3.jsonl"
expect_says 2 "--png: quotes and newlines are not supported" plot --calibration \
    "$SRC/docs/data/calibration-v3.jsonl" --png "$D/it's.png"
expect_err 1 plot --calibration "$D/nosuch.jsonl" --png "$D/x.png"
printf '{"a": 1}\n' >"$D/notcal.jsonl"
expect_err 1 plot --calibration "$D/notcal.jsonl" --png "$D/x.png"
check "plot --calibration of bad input writes no figure" [ ! -e "$D/x.png" ]

# ---- perf --plot (and --docs over two budgets) -------------------------------------
printf 'before\n<!-- perf:begin -->\n<!-- perf:end -->\nafter\n' >"$D/perf.md"
"$K" perf --quick --budget 1000,1024 --reps 1 --ms 1 --plot "$D/img" --docs "$D/perf.md" \
    >/dev/null 2>"$D/err"
check "perf --plot ($(cat "$D/err"))" is_png "$D/img/perf_vs_budget.png"
check "perf --docs over two budgets: both columns" grep -q '^| policy | attn | unchecked | bytes/slot | 1000 | 1Ki |$' "$D/perf.md"
expect_err 1 perf --quick --budget 256 --reps 1 --ms 1 --plot "$D/no/such/dir" -o "$D/rows"
check "perf --plot to no directory leaves no rows file" [ ! -e "$D/rows" ]
expect_err 2 perf --quick --budget 256 --reps 1 --ms 1 --plot "$D/it's" -o "$D/rows"
[ "$fails" -eq 0 ] && echo "test_plot: $checks checks passed"
exit "$fails"
