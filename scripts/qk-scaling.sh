#!/bin/sh
# SPDX-License-Identifier: MIT
# qk-scaling.sh [STEPS] - the committed model's query/key trace at STEPS
# positions (default 16384; the held-out text is looped when shorter),
# against the dense attention file it replaces, and the time to evaluate
# every policy on it. Writes the markdown block between
# "<!-- qk-scaling:begin -->" and "<!-- qk-scaling:end -->" of docs/trace.md
# (make qk-scaling-docs). Timings depend on the machine and its load: the
# block says when and under what load it was measured, and nothing checks
# them; the sizes follow from the shapes. Needs build/kvevict (make) and
# GNU time (/usr/bin/time -v, for the peak memory).
set -eu
cd "$(dirname "$0")/.."
T=${1:-16384}
K=./build/kvevict
W=build/qk-scaling
mkdir -p "$W"
[ -x "$K" ] || { echo "qk-scaling: build first (make)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "qk-scaling: needs GNU time (apt-get install time)" >&2; exit 1; }

field() { sed -n "s/^.*$1: *//p" "$2" | head -1; }
secs() { # h:mm:ss or m:ss(.ss) -> seconds
  echo "$1" | awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; printf "%.1f", s }'
}

load=$(cut -d' ' -f1 /proc/loadavg)
/usr/bin/time -v "$K" lm dump --model models/kjv.bin --text models/heldout.txt --loop \
  --steps "$T" --qk -o "$W/kjv.qk" 2>"$W/dump.time"
/usr/bin/time -v "$K" bench --trace "qk:$W/kjv.qk" --budget 256,1024 --md \
  >"$W/bench.md" 2>"$W/bench.time"
/usr/bin/time -v "$K" eval --trace "qk:$W/kjv.qk" --policy keydiff:recent_window=32 \
  --budget 1024 --json >"$W/keydiff.json" 2>"$W/keydiff.time"

size=$(stat -c %s "$W/kjv.qk")
json=$("$K" eval --trace "qk:$W/kjv.qk" --policy full --budget 1 --json 2>/dev/null || true)
heads=$(echo "$json" | sed -n 's/.*"heads": \([0-9]*\).*/\1/p')
layers=$(echo "$json" | sed -n 's/.*"layers": \([0-9]*\).*/\1/p')
# The dense [L, G, T, T] float32 .npy of the same heads: 128 bytes of header
# (the header of such a shape pads to 128) and 4 T^2 bytes a head.
dense=$(awk -v h="$heads" -v t="$T" 'BEGIN { printf "%.0f", 128 + 4 * h * t * t }')
{
  echo
  printf 'Measured %s on %s, %s cores (kvevict %s; load average %s when it began), `scripts/qk-scaling.sh %s`.\n\n' \
    "$(date -u +%Y-%m-%d)" "$(uname -m)" "$(nproc)" "$("$K" --version | cut -d' ' -f2)" "$load" "$T"
  echo '| | q/K trace (`qk:`) | dense `.npy` of the same rows |'
  echo '|---|---:|---:|'
  awk -v s="$size" -v d="$dense" -v t="$T" -v h="$heads" -v l="$layers" 'BEGIN {
    printf "| positions T, heads (layers x KV heads) | %d, %d (%d x %d) | %d, %d |\n", t, h, l, h / l, t, h
    printf "| file size | %.1f MB (%d bytes) | %.2f GB (%.0f bytes) |\n", s / 1e6, s, d / 1e9, d
    printf "| grows as | T d (queries and keys) | T^2 |\n"
    printf "| size ratio | 1 | %.0f x |\n", d / s }'
  printf '| written by `lm dump --qk` in | %s s (CPU %s s), peak memory %s MB | (not written: %.1f GB) |\n' \
    "$(secs "$(field 'Elapsed (wall clock) time (h:mm:ss or m:ss)' "$W/dump.time")")" \
    "$(field 'User time (seconds)' "$W/dump.time")" \
    "$(awk -v k="$(field 'Maximum resident set size (kbytes)' "$W/dump.time")" 'BEGIN { printf "%.0f", k / 1024 }')" \
    "$(awk -v d="$dense" 'BEGIN { print d / 1e9 }')"
  printf '| every policy at budgets 256 and 1024, all %s heads (`bench`) | %s s (CPU %s s), peak memory %s MB | |\n' \
    "$heads" "$(secs "$(field 'Elapsed (wall clock) time (h:mm:ss or m:ss)' "$W/bench.time")")" \
    "$(field 'User time (seconds)' "$W/bench.time")" \
    "$(awk -v k="$(field 'Maximum resident set size (kbytes)' "$W/bench.time")" 'BEGIN { printf "%.0f", k / 1024 }')"
  printf '| `keydiff:recent_window=32` alone at budget 1024 (`eval`) | %s s (CPU %s s), peak memory %s MB | |\n' \
    "$(secs "$(field 'Elapsed (wall clock) time (h:mm:ss or m:ss)' "$W/keydiff.time")")" \
    "$(field 'User time (seconds)' "$W/keydiff.time")" \
    "$(awk -v k="$(field 'Maximum resident set size (kbytes)' "$W/keydiff.time")" 'BEGIN { printf "%.0f", k / 1024 }')"
  echo
  echo 'The policies on the trace (means over its heads; `kvevict bench --trace qk:... --budget 256,1024 --md`):'
  echo
  sed -n '/^### Budget 256/,/^### H2O/p' "$W/bench.md" | sed '/^### H2O/d' | sed 's/^### /#### /'
} >"$W/block.md"

# Splice the block into docs/trace.md.
awk -v block="$W/block.md" '
  /^<!-- qk-scaling:begin -->$/ { print; while ((getline line < block) > 0) print line; skip = 1; next }
  /^<!-- qk-scaling:end -->$/ { skip = 0 }
  !skip { print }' docs/trace.md >"$W/trace.md"
grep -q '^<!-- qk-scaling:begin -->$' "$W/trace.md" || { echo "qk-scaling: docs/trace.md has no block" >&2; exit 1; }
cp "$W/trace.md" docs/trace.md
cat "$W/block.md"
