#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shard-speedup.sh [KVEVICT [JOBS [SWEEP ARGS...]]] - the measurement of
# docs/scale-out.md: one sweep of the canonical trace (by default the grid
# below; else SWEEP ARGS) run as a single process, then as JOBS shards
# (--shard I/JOBS) run by GNU parallel -j JOBS and merged; prints the wall
# and CPU times, the speed-up, the load average around each run and whether
# the merged results equal the single run's (JSON Lines, every key but
# ns_per_step, the one timing). Timings depend on the machine and its load: they are reported,
# never asserted, and never drift-checked. Installs GNU parallel with apt-get
# when missing and root (scripts/deps.sh).
#   ./scripts/shard-speedup.sh                      # build/kvevict, 2 shards
#   ./scripts/shard-speedup.sh build/kvevict 2 --trace canonical:steps=65536 \
#       --policy h2o --param recent_window=16,64 --budget 512,1024
set -euo pipefail
cd "$(dirname "$0")/.."
K=${1:-build/kvevict}
N=${2:-2}
shift $(($# < 2 ? $# : 2))
./scripts/deps.sh parallel:parallel time:/usr/bin/time
# By default 27 jobs, 3 windows x 3 decays x 3 budgets on 131072 steps: large
# budgets, so each job's own work (O(kept) per step) outweighs the work every
# shard repeats (generating each row and its top-32, O(t) per step).
GRID=(--trace canonical:steps=131072 --policy h2o_decay:budget=8192
      --param recent_window=64,256,1024 --param decay=0.9,0.99,0.999
      --budget 8192,16384,32768)
[ $# -gt 0 ] && GRID=("$@")
D=$(mktemp -d "${TMPDIR:-/tmp}/kvevict-speedup.XXXXXX")
trap 'rm -rf "$D"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
TIMEFORMAT="%R %U %S" # bash's time: wall, user and system seconds of the children

echo "kvevict shard speed-up: $(nproc) CPUs, $("$K" --version), $N shards"
echo "grid: kvevict sweep ${GRID[*]}"
l0=$(load)
single=$( { time "$K" sweep "${GRID[@]}" --json -o "$D/single.jsonl"; } 2>&1 )
l1=$(load)
sharded=$( { time parallel --will-cite -j "$N" --halt now,fail=1 \
  /usr/bin/time -f "'%U %S'" -o "$D/cpu{}" \
  "$K" sweep "${GRID[*]}" --shard {}/"$N" -o "$D/shard{}.jsonl" ::: $(seq 0 $((N - 1))); } 2>&1 )
busiest=$(awk '{ c = $1 + $2; if (c > m) m = c } END { print m }' "$D"/cpu*)
merge=$( { time "$K" merge --json -o "$D/merged.jsonl" "$D"/shard*.jsonl; } 2>&1 )
l3=$(load)
strip() { sed -E 's/"ns_per_step": [^,}]*//' "$1"; }
if cmp -s <(strip "$D/single.jsonl") <(strip "$D/merged.jsonl"); then same=yes; else same=NO; fi
jobs=$(wc -l <"$D/single.jsonl")
awk -v s="$single" -v p="$sharded" -v m="$merge" -v n="$N" -v jobs="$jobs" -v same="$same" \
    -v busiest="$busiest" \
    -v l0="$l0" -v l1="$l1" -v l3="$l3" 'BEGIN {
  split(s, a, " "); split(p, b, " "); split(m, c, " ")
  wall1 = a[1]; cpu1 = a[2] + a[3]; wall2 = b[1] + c[1]; cpu2 = b[2] + b[3] + c[2] + c[3]
  printf "| run | wall s | CPU s (user + sys) | load average before (1, 5, 15 min) |\n"
  printf "|---|---:|---:|---|\n"
  printf "| single process, %d jobs | %.1f | %.1f | %s |\n", jobs, wall1, cpu1, l0
  printf "| %d shards under parallel -j %d, then merge (%.2f s) | %.1f | %.1f | %s |\n",
         n, n, c[1], wall2, cpu2, l1
  printf "\nwall-clock speed-up %.2fx; the shards used %.2fx the single run'"'"'s CPU time, the busiest %.1f CPU s:\n", wall1 / wall2, cpu2 / cpu1, busiest
  printf "%.2f of the single run'"'"'s, so %d idle cores would allow at most a %.2fx speed-up; load average after: %s;\n", busiest / cpu1, n, cpu1 / busiest, l3
  printf "merged results identical to the single run'"'"'s (every key but ns_per_step): %s\n", same
}'
[ "$same" = yes ]
