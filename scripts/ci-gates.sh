#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ci-gates.sh - the robustness gates, run by .ci/run after `make test` (which
# already ran every test natively, under ASan + UBSan and the thread test
# under TSan). Each gate fails the run:
#   static     cppcheck and clang-tidy (.clang-tidy) clean on src/, lm/ and
#              tools/ (the user's CLI, tools/lm/, and the documentation tool
#              tools/docs/)
#   valgrind   every C test executable under valgrind memcheck (build-valgrind/):
#              zero errors, zero definite or indirect leaks (the tests with
#              large grids on their light grid, KVE_TEST_LIGHT=1)
#   fuzz       each libFuzzer target for CI_FUZZ_SECONDS (default 20) s
#   coverage   gcc --coverage build (build-cov/), whole suite, one gcovr pass
#              (build-cov/coverage.json), then reports of the documentation
#              tool (tools/docs/), of the user's CLI (tools/ but tools/docs/)
#              and of src/, lines and branches, printed last. Branch coverage
#              of src/ below COVERAGE_MIN_BRANCH (default 90) % fails; so do
#              the documentation tool's below COVERAGE_MIN_BRANCH_DOCS
#              (default 90) and the user's CLI's below COVERAGE_MIN_BRANCH_CLI
#              (default 80)
# Usage: ./scripts/ci-gates.sh [GATE...]   (default: all, in the order above)
# Installs what it needs with apt-get when root (scripts/deps.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
FUZZ_SECONDS=${CI_FUZZ_SECONDS:-20}
MIN_BRANCH=${COVERAGE_MIN_BRANCH:-90}
MIN_BRANCH_CLI=${COVERAGE_MIN_BRANCH_CLI:-80}
MIN_BRANCH_DOCS=${COVERAGE_MIN_BRANCH_DOCS:-90}
gates=${*:-static valgrind fuzz coverage}
COV=${KVE_COV_BUILD:-build-cov}      # build trees (overridable, e.g. for a private run)
VG=${KVE_VG_BUILD:-build-valgrind}

./scripts/deps.sh cmake:cmake gcc:gcc pkgconf:pkg-config valgrind:valgrind gcovr:gcovr cppcheck:cppcheck \
  clang:clang clang-tidy:clang-tidy || exit 1

gate_static() {
  # ctunullpointer in spec.c: kve__spec_format(NULL, 0, ...) measures the
  # length with snprintf(NULL, 0, ...), which C11 7.21.6.5 allows.
  cppcheck --std=c11 --enable=warning,style,performance,portability --inline-suppr \
    --error-exitcode=1 --quiet -I include -I src -I src/eval -I lm --suppress=ctunullpointer:src/spec.c \
    src/ lm/ || return 1
  # The tools: -D__GNUC__ so that cppcheck sees die_*'s noreturn (cli.h
  # declares it for GCC and Clang), as the compilers do.
  cmake -S . -B "$COV" -DCMAKE_BUILD_TYPE=Debug -DKVE_COVERAGE=ON -DKVE_WERROR=ON \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null || return 1
  cppcheck --std=c11 --enable=warning,style,performance,portability --inline-suppr \
    --error-exitcode=1 --quiet -D__GNUC__ -I include -I "$COV"/include -I lm -I tools \
    -I tools/lm -I tools/docs -i tools/llama tools/ || return 1
  local out
  out=$(printf '%s\n' src/*.c src/eval/*.c src/policies/*.c lm/*.c tools/*.c tools/lm/*.c tools/docs/*.c |
    xargs -P "$JOBS" -n 8 clang-tidy -p "$COV" --quiet 2>&1)
  local rc=$?
  # kvevict-llama (tools/llama/): with llama.cpp's headers, which make test
  # cloned into build/_llama (-DKVEVICT_LLAMA=ON); the coverage build that
  # gives the others their compile commands is made without it.
  local ll=build/_llama/src
  if [ -f "$ll/include/llama.h" ]; then
    cppcheck --std=c11 --enable=warning,style,performance,portability --inline-suppr \
      --error-exitcode=1 --quiet -D__GNUC__ -I include -I "$COV"/include -I lm -I tools \
      -I tools/lm -I tools/llama tools/llama/ || return 1
    out="$out
$(clang-tidy --quiet tools/llama/*.c -- -std=c11 -D_POSIX_C_SOURCE=200809L -I include \
      -I "$COV"/include -I lm -I tools -I tools/lm -I tools/llama -isystem "$ll/include" \
      -isystem "$ll/ggml/include" 2>&1)" || rc=1
  else
    echo "static: build/_llama has no llama.cpp headers (make test without npm): tools/llama/ unchecked"
    rc=1
  fi
  if [ $rc -ne 0 ] || echo "$out" | grep -qE "(warning|error):"; then
    echo "$out" | grep -E "(warning|error):" -A3
    return 1
  fi
  echo "static: cppcheck and clang-tidy report nothing on src/, lm/ and tools/ (tools/llama/ too)"
}

gate_valgrind() {
  # Every add_test whose command is an executable target runs under the
  # emulator: the C tests and the fuzz corpus runners (scripts are not wrapped).
  local vg="valgrind;--error-exitcode=99;--leak-check=full;--errors-for-leak-kinds=definite,indirect"
  vg="$vg;--show-leak-kinds=definite,indirect;--track-fds=no;-q"
  cmake -S . -B "$VG" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVE_WERROR=ON \
    "-DCMAKE_CROSSCOMPILING_EMULATOR=$vg" >/dev/null || return 1
  cmake --build "$VG" -j "$JOBS" >/dev/null || return 1
  # Only those run here: the scripts' tests (the CLI's, the docs', the
  # install's, Python's) already ran natively and under ASan in make test,
  # and the emulator does not reach them.
  local log="$VG"/valgrind.log wrapped
  wrapped=$(cd "$VG" && ctest -N -V | awk '/Test command: [^ ]*\/valgrind /{w=1; next}
    w && /Test +#[0-9]+: /{sub(/.*: /, ""); printf "%s^%s$", n++ ? "|" : "", $0; w=0}')
  [ -n "$wrapped" ] || { echo "valgrind: no test executable is wrapped"; return 1; }
  # KVE_TEST_LIGHT=1: the tests with large grids (tests/check.h, check_light)
  # take every path of theirs once rather than in every combination, since a
  # step costs some hundred times its native time here (their full grids ran
  # natively and under ASan in make test).
  (cd "$VG" && KVE_TEST_LIGHT=1 ctest -j "$JOBS" --output-on-failure -R "$wrapped") >"$log" 2>&1
  local rc=$?
  grep -E "tests passed|tests failed" "$log"
  if [ $rc -ne 0 ]; then
    grep -E "^[0-9]+/[0-9]+ Test .*(Failed|Timeout)|==[0-9]+== (ERROR SUMMARY|.*lost)" "$log" | head -40
    echo "valgrind: see $log"
    return 1
  fi
  echo "valgrind: $(grep -cE 'Test +#' "$log") test executables under memcheck (every one" \
    "the build registers): zero errors, zero definite/indirect leaks"
}

gate_fuzz() {
  ./scripts/fuzz.sh "$FUZZ_SECONDS"
}

gate_coverage() {
  cmake -S . -B "$COV" -DCMAKE_BUILD_TYPE=Debug -DKVE_COVERAGE=ON -DKVE_WERROR=ON \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null || return 1
  cmake --build "$COV" -j "$JOBS" >/dev/null || return 1
  find "$COV" -name '*.gcda' -delete
  (cd "$COV" && ctest -j "$JOBS" --output-on-failure) >"$COV"/ctest.log 2>&1 || {
    tail -40 "$COV"/ctest.log
    return 1
  }
  # gcov runs once; each report reads its result back.
  gcovr --root . --object-directory "$COV" --json "$COV"/coverage.json || return 1
  local obj=(--root . --add-tracefile "$COV"/coverage.json)
  local rc=0
  echo "---- coverage of the documentation tool (tools/docs/): branches ----"
  gcovr "${obj[@]}" --filter 'tools/docs/' --txt --branches --print-summary \
    --fail-under-branch "$MIN_BRANCH_DOCS" || {
    echo "coverage: branch coverage of tools/docs/ is below $MIN_BRANCH_DOCS%"
    rc=1
  }
  echo "---- coverage of the user's CLI (tools/ but tools/docs/): branches ----"
  gcovr "${obj[@]}" --filter 'tools/' --exclude 'tools/docs/' --txt --branches --print-summary \
    --fail-under-branch "$MIN_BRANCH_CLI" || {
    echo "coverage: branch coverage of the user's CLI is below $MIN_BRANCH_CLI%"
    rc=1
  }
  local common=("${obj[@]}" --filter 'src/')
  echo "---- coverage of src/: lines ----"
  gcovr "${common[@]}" --txt || return 1
  echo "---- coverage of src/: branches ----"
  gcovr "${common[@]}" --txt --branches --print-summary --fail-under-branch "$MIN_BRANCH" || {
    echo "coverage: branch coverage of src/ is below $MIN_BRANCH%"
    rc=1
  }
  return $rc
}

failed=""
summary=""
for g in $gates; do
  start=$SECONDS
  echo "==== gate $g ===="
  if "gate_$g"; then
    summary="$summary\n  $g: pass ($((SECONDS - start)) s)"
  else
    summary="$summary\n  $g: FAIL ($((SECONDS - start)) s)"
    failed="$failed $g"
  fi
done
printf "==== gates ====%b\n" "$summary"
if [ -n "$failed" ]; then
  echo "ci-gates: failed:$failed"
  exit 1
fi
echo "ci-gates: all passed"
