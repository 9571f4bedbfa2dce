#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# fuzz.sh SECONDS [TARGET...] - builds the libFuzzer targets (clang, ASan +
# UBSan) in build-fuzz/ and fuzzes each target for SECONDS, one at a time
# (one process: the machine is shared).
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
targets=${*:-fuzz_spec fuzz_api fuzz_state fuzz_npy fuzz_qk fuzz_memory fuzz_checkpoint fuzz_tokenizer fuzz_session fuzz_jsonl}
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

CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DKVE_FUZZ=ON -DKVE_BUILD_TESTS=OFF \
  >/dev/null || exit 1
# shellcheck disable=SC2086
cmake --build "$build" -j "${JOBS:-2}" --target $targets >/dev/null || {
  echo "fuzz: build failed (rerun: cmake --build $build --target $targets)" >&2
  exit 1
}

status=0
for t in $targets; do
  work="fuzz/corpus-$t"
  art="$build/findings-$t/"
  mkdir -p "$work" "$art"
  log="$build/$t.log"
  echo "fuzz: $t for ${secs}s, -seed=$seed"
  "$build/fuzz/$t" -seed="$seed" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$art" "$work" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz: $t: no finding in ${secs}s (${runs:-?} runs, corpus $(ls "$work" | wc -l) + $(ls "fuzz/corpus/$t" | wc -l) seeds)"
    continue
  fi
  status=1
  echo "fuzz: $t: FINDING (exit $rc), log $log:" >&2
  grep -E "ERROR|CHECK|runtime error|SUMMARY" "$log" | head -5 >&2
  for f in "$art"*; do
    [ -f "$f" ] || continue
    keep="fuzz/corpus/$t/finding-$(basename "$f")"
    cp "$f" "$keep"
    echo "fuzz: $t: kept $keep; replay: $build/fuzz/$t $keep" \
         " (or build-asan/fuzz/${t}_corpus $keep)" >&2
  done
done
exit $status
