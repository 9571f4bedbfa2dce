#!/bin/sh
# SPDX-License-Identifier: MIT
# test_budgets_cli.sh KVEVICT OUTCHECK SOURCE_DIR - the command line of
# docs/budgets.md, end to end on the committed model: `kvevict eval` on a
# short dump with a shared budget and layer schedules (every format parsed
# by outcheck, the layer budgets adding up to the total, per-head rows, the
# shared heads' sizes adding up to the layer's budget), `kvevict lm eval`
# with the same options on a short text, the docs `table` block with the
# headers docs/budgets.md gives, `kvevict plot --jsonl` and its --where, and the usage (2) and input (1) errors, each one
# line on stderr. Seconds natively (the dumps are 64 steps, the texts a few
# hundred bytes), under a minute under ASan.
set -u
K=${1:?usage: test_budgets_cli.sh KVEVICT OUTCHECK SOURCE_DIR}
J=${2:?usage: test_budgets_cli.sh KVEVICT OUTCHECK SOURCE_DIR}
SRC=${3:?usage: test_budgets_cli.sh KVEVICT OUTCHECK SOURCE_DIR}
D=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-budgets-cli.XXXXXX") || exit 1
trap 'rm -rf "$D"' EXIT INT TERM
. "$(dirname "$0")/check.sh" # check, expect_err
M=$SRC/models/kjv.bin
TEXT=$SRC/models/heldout.txt
head -c 300 "$TEXT" >"$D/text.txt"
head -c 400 "$SRC/docs/data/calibration.txt" >"$D/cal.txt"
cd "$D" || exit 1
"$K" lm dump --model "$M" --text "$D/text.txt" --steps 64 -o dump.npy 2>"$D/err"
check "lm dump of 64 steps ($(cat "$D/err"))" [ -s dump.npy ]
"$K" lm dump --model "$M" --text "$D/cal.txt" --steps 64 -o cal.npy 2>"$D/err"
check "lm dump of the calibration text" [ -s cal.npy ]
"$K" trace --trace canonical:steps=64 -o one.npy 2>"$D/err"
check "a one-layer trace" [ -s one.npy ]

# ---- kvevict eval: budgets across heads and layers ----
P="h2o:recent_window=4"
KEYS="--key schedule:string --key share:string --key layer_budgets:string --key mean_kept:number --key score_after:integer --key total_state_bytes:integer --key retained_mass:number --key top32_recall:number --key state_bytes:integer"
"$K" eval --trace dump.npy --policy "$P" --budget 12 --share-heads --json >j 2>"$D/err"
check "eval --share-heads --json ($(cat "$D/err"))" "$J" jsonl --count 1 $KEYS --value share='"heads"' --value min_share=0.20000000000000001 --value layer_budgets='"12,12,12,12"' --value mean_kept=12 j
"$K" eval --trace dump.npy --policy "$P" --budget 12 --schedule pyramid --beta 4 --json >j 2>"$D/err"
check "eval --schedule pyramid --json" "$J" jsonl --count 1 $KEYS --value schedule='"pyramid"' --value share='"none"' --value min_share=null j
lb=$(sed -E 's/.*"layer_budgets": "([0-9,]*)".*/\1/' j)
sum=$(echo "$lb" | tr ',' '\n' | awk '{s += $1} END {print s}')
check "pyramid layer budgets $lb add up to 4 x 12" [ "$sum" -eq 48 ]
check "pyramid: more for the lower layers ($lb)" [ "${lb%%,*}" -gt "${lb##*,}" ]
"$K" eval --trace dump.npy --policy "$P" --budget 12 --schedule attention --calibration cal.npy --calibration-window 4 --share-heads --per-head --json >j 2>"$D/err"
check "eval --schedule attention --per-head: a row per head and one for all" "$J" jsonl --count 9 $KEYS --value schedule='"attention"' j
grep -v '"head": "all"' j | sed -E 's/.*"layer": ([0-9]+), .*"mean_kept": ([0-9.e+-]+),.*/\1 \2/' >kept
lbs=$(head -1 j | sed -E 's/.*"layer_budgets": "([0-9,]*)".*/\1/')
n=0
for l in 0 1 2 3; do
    b=$(echo "$lbs" | cut -d, -f$((l + 1)))
    s=$(awk -v l=$l '$1 == l {s += $2} END {printf "%.6f", s}' kept)
    check "shared layer $l: its heads keep 2 x $b in all (got $s)" [ "$s" = "$(awk -v b="$b" 'BEGIN {printf "%.6f", 2 * b}')" ]
    n=$((n + 1))
done
for f in text md csv; do
    "$K" eval --trace dump.npy --policy "$P" --budget 12 --share-heads --format $f >o 2>"$D/err"
    check "eval budgets --format $f" grep -q 'heads' o
done
"$K" eval --trace dump.npy --policy "$P" --budget 12 --share-heads --csv >c
check "eval budgets --csv parses" "$J" csv --count 1 --key share:string --key mean_kept:number c
"$K" eval --trace one.npy --policy "$P" --budget 12 --schedule pyramid --json >j
check "a one-layer trace: the pyramid is the whole budget" "$J" jsonl --value layer_budgets='"12"' j
"$K" eval --trace dump.npy --policy "$P" --budget 12 --score-after 40 --json >j
check "--score-after alone: scored after 40" "$J" jsonl --value score_after=40 --value scored_steps=23 --value schedule='"uniform"' j
"$K" eval --trace dump.npy --policy "$P" --budget 60 --score-after 63 --json >j 2>"$D/err"
check "no scored step: null metrics and a warning" "$J" jsonl --value retained_mass=null j
check "... the warning" grep -q 'warning' "$D/err"

expect_err 2 eval --trace dump.npy --policy window --budget 12 --share-heads
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --min-share 0.5
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --share-heads --min-share 1.5
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --share-heads --min-share x
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --schedule cubic
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --schedule attention
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --calibration cal.npy
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --beta 3
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --schedule pyramid --beta 0.5
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --calibration-window 3 --schedule pyramid
expect_err 2 eval --trace dump.npy --policy "$P" --budget 12 --score-after 0
expect_err 2 eval --trace dump.npy --policy "$P" --budget 4 --share-heads
expect_err 1 eval --trace dump.npy --policy "$P" --budget 12 --schedule attention --calibration one.npy
expect_err 1 eval --trace dump.npy --policy "$P" --budget 12 --schedule attention --calibration missing.npy
expect_err 1 eval --trace dump.npy --policy "$P" --budget 12 --schedule attention --calibration cal.npy --calibration-window 63

# ---- kvevict lm eval: the same options on the model ----
"$K" lm eval --model "$M" --text text.txt --policy "$P" --budget 12 --share-heads --schedule pyramid --json >j 2>"$D/err"
check "lm eval --share-heads --schedule pyramid ($(cat "$D/err"))" "$J" jsonl --count 2 --key schedule:string --key share:string --key layer_budgets:string --key bits_per_byte:number j
check "lm eval: the full cache's row has no schedule" grep -q '"policy": "full", .*"schedule": "", "share": ""' j
check "lm eval: the policy's row shares" grep -q '"share": "heads", "min_share": 0.2' j
"$K" lm eval --model "$M" --text text.txt --policy "$P" --budget 12 --schedule attention --calibration cal.txt --calibration-window 4 --md >o 2>"$D/err"
check "lm eval --schedule attention --md" grep -q 'attention' o
"$K" lm eval --model "$M" --text text.txt --policy "$P" --budget 12 --json >j
check "lm eval without budgets options: no budgets keys" "$J" jsonl --no-key schedule --no-key share j
expect_err 2 lm eval --model "$M" --text text.txt --policy window --budget 12 --share-heads
expect_err 2 lm eval --model "$M" --text text.txt --policy "$P" --budget 12 --schedule attention
expect_err 1 lm eval --model "$M" --text text.txt --policy "$P" --budget 12 --schedule attention --calibration missing.txt
printf 'a b' >tiny.txt
expect_err 1 lm eval --model "$M" --text text.txt --policy "$P" --budget 12 --schedule attention --calibration tiny.txt

# ---- the docs table block's headers, and plot --jsonl ----
cat >rows.jsonl <<'EOF'
{"name": "a", "budget": 1, "x": 1, "y": 0.5, "s": "p"}
{"name": "a", "budget": 2, "x": 2, "y": 0.25, "s": "p"}

{"name": "b", "budget": 1, "x": 1, "y": null, "s": "q\u0041"}
EOF
cat >doc.md <<'EOF'
# t
<!-- kvevict:begin table rows.jsonl rows=name:code:the_name cols=budget::Δ_at value=y:2 -->
<!-- kvevict:end table -->
<!-- kvevict:begin table rows.jsonl where=name:a where=s!null show=budget,y:+3:why,s::Σ -->
<!-- kvevict:end table -->
EOF
"$K" docs doc.md >/dev/null 2>"$D/err"
check "docs table: a given header, a pivot's prefix, padded by characters ($(cat "$D/err"))" \
    grep -q '^| the name | Δ at 1 | Δ at 2 |$' doc.md
check "... a pivot row" grep -q '^| `a`      |   0.50 |   0.25 |$' doc.md
check "... null is n/a, a missing cell empty" grep -q '^| `b`      |    n/a |        |$' doc.md
check "... where= filters; a header on an unformatted column" grep -q '^|      2 | +0.250 | p   |$' doc.md
check "... the headers of the show= block" grep -q '^| budget |    why | Σ   |$' doc.md
"$K" docs --check doc.md >/dev/null 2>&1
check "docs --check: up to date" [ $? -eq 0 ]
sed 's/0.25/0.75/' rows.jsonl >rows2.jsonl && mv rows2.jsonl rows.jsonl
"$K" docs --check doc.md >/dev/null 2>"$D/err"
check "docs --check: a changed row is drift (exit 1)" [ $? -eq 1 ]
for args in 'show=name bogus=1' 'show=y:%.2f' 'rows=name cols=budget:2 value=y' \
    'rows=name cols=budget value=y::h' 'show=name:2:' 'show=:2' 'rows=name cols=x value=y show=s' \
    'where=name=a show=y' 'where=name!=a show=y'; do
    printf '# t\n<!-- kvevict:begin table rows.jsonl %s -->\n<!-- kvevict:end table -->\n' "$args" >bad.md
    expect_err 2 docs bad.md
done
printf '# t\n<!-- kvevict:begin table rows.jsonl where=name:z show=y -->\n<!-- kvevict:end table -->\n' >bad.md
expect_err 1 docs bad.md
printf '# t\n<!-- kvevict:begin table rows.jsonl show=name:2 -->\n<!-- kvevict:end table -->\n' >bad.md
expect_err 1 docs bad.md
for broken in '{"a": [1]}' '{"a": 1,}' '{"a" 1}' 'x' '{"a": "b' '{"a": 1} x' '{"a": "\q"}'; do
    printf '%s\n' "$broken" >broken.jsonl
    printf '# t\n<!-- kvevict:begin table broken.jsonl show=a -->\n<!-- kvevict:end table -->\n' >bad.md
    expect_err 1 docs bad.md
done
printf '# t\n<!-- kvevict:begin table missing.jsonl show=a -->\n<!-- kvevict:end table -->\n' >bad.md
expect_err 1 docs bad.md
expect_err 2 plot --jsonl rows.jsonl --x x --png p.png
expect_err 1 plot --jsonl rows.jsonl --x x --y nope --png p.png
expect_err 2 plot --jsonl rows.jsonl --x x --y y --where budget --png p.png
expect_err 2 plot --jsonl rows.jsonl --x x --y y --where budget=1 --png p.png
expect_err 2 plot --jsonl rows.jsonl --x x --y y --where 'budget!=1' --png p.png
if command -v gnuplot >/dev/null 2>&1; then
    expect_says 1 'no row satisfies the --where' plot --jsonl rows.jsonl --x x --y y --where name:z --png p.png
    expect_err 1 plot --jsonl rows.jsonl --x x --y y --where 'name!a|b' --png p.png
    expect_err 1 plot --jsonl rows.jsonl --x x --y y --where name:a --where 'budget!1|2' --png p.png
    "$K" plot --jsonl rows.jsonl --x x --y y --series name --where budget!null --title "it's" --logx --png p.png >/dev/null 2>"$D/err"
    check "plot --jsonl draws a PNG ($(cat "$D/err"))" [ -s p.png ]
    "$K" plot --jsonl rows.jsonl --x name --y x --where 'name:a|b' --png q.png >/dev/null 2>"$D/err"
    check "plot --jsonl with categories" [ -s q.png ]
fi

echo "test_budgets_cli: $checks checks, $fails failures"
[ "$fails" -eq 0 ]
