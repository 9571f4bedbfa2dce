#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# fuzz.sh SECONDS [TARGET...] - builds the libFuzzer targets (clang, ASan +
# UBSan) in build-fuzz/ and fuzzes each target for SECONDS, FUZZ_JOBS at a
# time (default JOBS or 2, one process per core).
#
#   ./scripts/fuzz.sh 60                   every target, 60 s each
#   ./scripts/fuzz.sh 300 fuzz_npy         one target
#   FUZZ_SEED=1234 ./scripts/fuzz.sh 60    a fixed libFuzzer -seed= (default: the clock)
#
# Inputs that reach new coverage collect in fuzz/corpus-<target>/ (ignored by
# git; reused by the next run). A finding (crash, leak, timeout, OOM) is
# copied into the checked-in corpus fuzz/corpus/<target>/ so every later
# `make test` replays it, the replay command is printed, and the script fails.
# Without findings it prints, per target, the runs made and the seed.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
# Every target in fuzz/ (fuzz/fuzz_NAME.c), in name order.
targets=${*:-$(cd fuzz && for f in fuzz_*.c; do printf '%s ' "${f%.c}"; done)}
build=${KVE_FUZZ_BUILD:-build-fuzz}
seed=${FUZZ_SEED:-$(date +%s)}

# libFuzzer and the sanitizer runtimes are only "recommended" by clang in
# Debian: install them explicitly when missing.
if [ ! -f "$(clang --print-runtime-dir)/libclang_rt.fuzzer-$(uname -m).a" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "fuzz: installing libclang-rt-dev (libFuzzer)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends libclang-rt-dev \
      >/dev/null || exit 1
  else
    echo "fuzz: libFuzzer is missing; install it with: sudo apt-get install libclang-rt-dev" >&2
    exit 1
  fi
fi

# fuzz_llama needs llama.cpp (kvevict-llama's): the node-llama-cpp that make
# test fetched into build/_llama, or $KVEVICT_LLAMA_DIR.
llama_dir=${KVEVICT_LLAMA_DIR:-$PWD/build/_llama}
llama=()
if [ -f "$llama_dir/node_modules/node-llama-cpp/package.json" ]; then
  llama=(-DKVEVICT_LLAMA=ON "-DKVEVICT_LLAMA_DIR=$llama_dir")
elif [[ " $targets " == *" fuzz_llama "* ]]; then
  targets=$(printf '%s\n' $targets | grep -vx fuzz_llama | tr '\n' ' ')
  echo "fuzz: fuzz_llama left out: no node-llama-cpp in $llama_dir (make test fetches it)" >&2
fi
CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DKVE_FUZZ=ON -DKVE_BUILD_TESTS=OFF \
  "${llama[@]}" >/dev/null || exit 1
# shellcheck disable=SC2086
cmake --build "$build" -j "${JOBS:-2}" --target $targets >/dev/null || {
  echo "fuzz: build failed (rerun: cmake --build $build --target $targets)" >&2
  exit 1
}

# One target: fuzzes it, writes its report to $build/$t.summary and returns
# non-zero on a finding (kept in the checked-in corpus).
fuzz_one() {
  local t=$1
  local work="fuzz/corpus-$t" art="$build/findings-$t/" log="$build/$t.log"
  local out="$build/$t.summary"
  mkdir -p "$work" "$art"
  rm -f "$art"*
  "$build/fuzz/$t" -seed="$seed" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$art" "$work" "fuzz/corpus/$t" >"$log" 2>&1
  local rc=$?
  local runs
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz: $t: no finding in ${secs}s (${runs:-?} runs, corpus $(ls "$work" | wc -l) + $(ls "fuzz/corpus/$t" | wc -l) seeds)" >"$out"
    return 0
  fi
  {
    echo "fuzz: $t: FINDING (exit $rc), log $log:"
    grep -E "ERROR|CHECK|runtime error|SUMMARY" "$log" | head -5
    for f in "$art"*; do
      [ -f "$f" ] || continue
      local keep="fuzz/corpus/$t/finding-$(basename "$f")"
      cp "$f" "$keep"
      echo "fuzz: $t: kept $keep; replay: $build/fuzz/$t $keep" \
           " (or build-asan/fuzz/${t}_corpus $keep)"
    done
  } >"$out"
  return 1
}

# FUZZ_JOBS targets at a time (default JOBS, 2: one per core), each for
# $secs seconds; the reports print in the order of the targets.
jobs_max=${FUZZ_JOBS:-${JOBS:-2}}
echo "fuzz: ${secs}s per target, $jobs_max at a time, -seed=$seed"
status=0
running=0
for t in $targets; do
  if [ "$running" -ge "$jobs_max" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
for t in $targets; do
  cat "$build/$t.summary" 2>/dev/null || { echo "fuzz: $t: no report"; status=1; }
done
exit $status
