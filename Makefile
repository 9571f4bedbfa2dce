# SPDX-License-Identifier: MIT
# The two commands of the README:
#   make run    build (Release, quietly) and run the main job: the benchmark
#   make test   build and run every test, then again under ASan + UBSan, then
#               the thread test under TSan
# Build trees live in build/ (Release), build-asan/ and build-tsan/. Builds
# print nothing unless they fail (scripts/quiet.sh); -Werror is on for every
# build made here (KVE_WERROR=ON), as in CI. The build makes, in build/, the
# two libraries (libkvevict and libkvevict_eval, static and shared) and
# these programs: kvevict (the user's CLI) and kvevict-convert (checkpoints
# to GGUF or llama2.c files), the two that `cmake --install` puts in
# PREFIX/bin; kvevict-docs (the documentation build tool: docs, plots,
# perf-docs) and kvevict-lm-speed and kvevict-prefill-speed (the decoder's
# benchmarks), not installed; kvevict-llama with -DKVEVICT_LLAMA=ON (the
# llama targets, and test when npm is there), not installed; and the tests
# and the fuzz corpus runners, in build/tests and build/fuzz.
# What a build needs is checked (and, as root, installed) once, not on every
# build: build/.deps-ok stands for "checked", and goes with make clean.

JOBS ?= 2
CMAKE_FLAGS ?=
BASE_DEPS = cmake:cmake gcc:gcc make:make pkgconf:pkg-config
# What the tests need beyond the build (else they skip, saying why): gnuplot
# (test_plot), Debian's numpy, torch, pip (with setuptools and wheel) and
# venv for /usr/bin/python3 (the Python binding's tests; test_python_install
# runs docs/python.md's install into a virtual environment), OpenBLAS so
# that numpy and torch run at speed, clang (test_split_clang compiles the
# core with it too), npm and git
# (kvevict-llama's llama.cpp: node-llama-cpp from the npm registry, its source
# bundle cloned; cmake/llama.cmake).
TEST_DEPS = gnuplot-nox:gnuplot python3-numpy:py:numpy python3-pip:py:pip \
  python3-setuptools:py:setuptools python3-wheel:py:wheel python3-venv:py:ensurepip \
  python3-torch:py:torch libopenblas0-pthread clang:clang npm:npm git:git
DEPS_STAMP = build/.deps-ok
TEST_DEPS_STAMP = build/.test-deps-ok
QUIET = ./scripts/quiet.sh
CONFIGURE = cmake -DKVE_WERROR=ON $(CMAKE_FLAGS)

.PHONY: all deps run bench llama-bench lm-vs-llama llama-docs llama-agreement bench-weights gguf-docs perf-docs prefill-docs duo-docs qk-scaling-docs budgets-docs real-model leaderboard python-bench test test-release test-asan test-tsan fuzz ci-gates clean plots docs model

all: build/kvevict

deps: $(DEPS_STAMP)

$(DEPS_STAMP): Makefile scripts/deps.sh
	@./scripts/deps.sh $(BASE_DEPS)
	@mkdir -p build && touch $@

# Without root, deps.sh names what is missing and the tests that need it
# skip: scripts/ctest.sh lists each with its reason at the end of make test.
$(TEST_DEPS_STAMP): Makefile scripts/deps.sh
	@if ./scripts/deps.sh $(TEST_DEPS); then mkdir -p build && touch $@; else \
	  echo "make test: the tests that need them will skip (listed at the end)"; fi

build/kvevict: $(DEPS_STAMP) FORCE
	@$(QUIET) build/build.log sh -c '$(CONFIGURE) -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j $(JOBS)'

run: build/kvevict
	@./build/kvevict bench

# The Python binding's bank step against raw ctypes at 256 heads x 1 Ki
# (bench/python_bank.py; a ratio against the floor measured in the same run,
# quoted in docs/python.md; never a test).
python-bench: build/kvevict
	@KVEVICT_LIBRARY=$(CURDIR)/build/libkvevict_eval.so /usr/bin/python3 bench/python_bank.py

# Per-step cost of every policy and of banks against the memory floor
# (kvevict perf: under a minute; timings depend on the machine and its load),
# then the llama2.c decoder's tokens per second (bench/lm_speed.c).
bench: build/kvevict
	@./build/kvevict perf
	@./build/kvevict-lm-speed

# kvevict inside llama.cpp at TinyLlama's shape: llama.cpp alone, its floor
# of a bounded cache and each policy at budget 512, tokens per second on 1
# and 2 threads (bench/llama_speed.sh; writes 2.7 GB to LLAMA_BENCH_DIR; a
# timing, quoted in docs/performance.md, never checked).
LLAMA_BENCH_DIR ?= /tmp/kvevict-llama-bench
llama-bench: build/kvevict
	@$(QUIET) build/build.log sh -c '$(CONFIGURE) -S . -B build -DKVEVICT_LLAMA=ON && cmake --build build -j $(JOBS)'
	./bench/llama_speed.sh build $(LLAMA_BENCH_DIR)

# The decoder against llama.cpp itself on llama.cpp's own files (F16, Q8_0,
# Q4_K_M at TinyLlama's shape; docs/performance.md, "The decoder against
# llama.cpp"). A timing.
lm-vs-llama: build/kvevict
	@$(QUIET) build/build.log sh -c '$(CONFIGURE) -S . -B build -DKVEVICT_LLAMA=ON && cmake --build build -j $(JOBS)'
	./bench/lm_vs_llama.sh build $(LLAMA_BENCH_DIR)

# docs/llama.cpp.md's measured blocks: kvevict-llama against the decoder on
# the held-out text (scripts/llama-docs.sh; about ten minutes).
llama-docs: build/kvevict
	@$(QUIET) build/build.log sh -c '$(CONFIGURE) -S . -B build -DKVEVICT_LLAMA=ON && cmake --build build -j $(JOBS)'
	./scripts/llama-docs.sh build

# docs/decoder.md's agreement tables: --products llama and exact against
# llama.cpp on every type its quantizer writes, from the committed model and
# a 256-wide one (scripts/llama-agreement.sh: logits of 200 tokens, bits per
# byte of 9000 held-out bytes; a few minutes). Deterministic for a given CPU
# library of llama.cpp; test_llama re-makes the rows where it is the same.
llama-agreement: build/kvevict
	@$(QUIET) build/build.log sh -c '$(CONFIGURE) -S . -B build -DKVEVICT_LLAMA=ON && cmake --build build -j $(JOBS)'
	./scripts/llama-agreement.sh build docs/data/llama-agreement.jsonl
	./build/kvevict-docs docs docs/decoder.md

# The committed model in every format and weight type, and their bits per
# byte on the held-out books (docs/data/gguf/, rendered in docs/decoder.md;
# about two minutes), with models/kjv.gguf. Deterministic: test_gguf_kjv checks
# a subset.
gguf-docs: build/kvevict
	./scripts/gguf-kjv.sh build

# The decoder's speed on weights in their stored types at TinyLlama's shape
# against the memory-bandwidth floor (writes GGUF files of up to 4.4 GB to
# /tmp, one at a time; a few minutes). A timing: quoted, never checked.
bench-weights: build/kvevict
	@df -h /tmp | tail -1
	./build/kvevict-lm-speed --weights --dir /tmp

# The measured section of docs/performance.md and its plot, regenerated by one
# run of kvevict perf (installs gnuplot-nox when missing). Timings are never
# drift-checked: commit them with the conditions the page states.
perf-docs: build/kvevict
	@./scripts/deps.sh gnuplot-nox:gnuplot
	./build/kvevict-docs perf --docs docs/performance.md --plot docs/img -o build/perf.txt

# The measured block of docs/prefill.md: prefill compression against per-step
# eviction on the committed model (kvevict lm prefill; about ten minutes on
# two cores). Deterministic, so not timing-dependent, but too slow for the
# drift test: rerun it when the decoder, a policy or the prompts change.
PREFILL_POLICIES = h2o,tova,streaming,window,knorm,knorm:recent_window=32,keydiff,keydiff:recent_window=32
prefill-docs: build/kvevict
	./build/kvevict lm prefill --model models/kjv.bin --text models/heldout.txt \
	  --policy $(PREFILL_POLICIES) --budget 64,128 --docs docs/prefill.md -o build/prefill.txt

# Issue 20's decoder methods on the committed model (about twenty minutes on
# two cores; deterministic, too slow for the drift test): KVzip's block of
# docs/prefill.md, then DuoAttention's calibration (docs/data/duo-heads.txt)
# and its two blocks of docs/duo.md, uniform budgets and the schedule at the
# same memory. The JSON Lines beside them are the same rows.
DUO_RUN = ./build/kvevict lm prefill --model models/kjv.bin --text models/heldout.txt \
  --budget 256,102,51 --windows 4 --trials 4 --distances 128,256,384,503 --quiet
duo-docs: build/kvevict
	$(DUO_RUN) --policy h2o --methods step,snapkv,kvzip --docs docs/prefill.md \
	  --docs-block lm-prefill-kvzip --json -o docs/data/prefill-kvzip.jsonl
	./build/kvevict lm duo-calibrate --model models/kjv.bin --text models/heldout.txt \
	  --out docs/data/duo-heads.txt --quiet -o docs/data/duo-calibrate.txt
	$(DUO_RUN) --policy streaming,h2o --methods step --docs docs/duo.md \
	  --docs-block lm-prefill-uniform --json -o docs/data/duo-uniform.jsonl
	$(DUO_RUN) --policy streaming --methods step --heads docs/data/duo-heads.txt \
	  --docs docs/duo.md --docs-block lm-prefill-duo --json -o docs/data/duo.jsonl

# The scaling section of docs/trace.md: the committed model's q/K trace at
# 16Ki positions, its size against the dense file, the time to evaluate it.
qk-scaling-docs: build/kvevict
	./scripts/qk-scaling.sh 16384

# The figures of docs/img/ (installs gnuplot-nox when missing) and the measured
# blocks of the docs (docs/results.md, docs/policies/*.md; see kvevict docs --help).
# The calibration's maps are drawn from its committed runs (docs/data/
# calibration-v3*.jsonl, written by `kvevict trace --calibrate --json`, a few
# minutes: docs/trace.md, "Calibration, version 3").
plots: build/kvevict
	@./scripts/deps.sh gnuplot-nox:gnuplot
	./build/kvevict-docs plot --out docs/img
	./build/kvevict-docs plot --calibration docs/data/calibration-v3.jsonl --png docs/img/calibration_v3.png
	./build/kvevict-docs plot --calibration docs/data/calibration-v3-outside.jsonl --png docs/img/calibration_v3_outside.png

docs: build/kvevict
	./build/kvevict-docs docs $(wildcard docs/*.md docs/policies/*.md)

# The measurements of docs/budgets.md (the model and its attention traces;
# about ten minutes), its figures and tables: scripts/budgets.sh. The drift
# test (test_budgets_docs) re-makes a subset of the committed rows.
budgets-docs: build/kvevict
	@./scripts/deps.sh gnuplot-nox:gnuplot
	./scripts/budgets.sh build/kvevict
# docs/real-model.md from scratch: every measurement of the committed model
# with kvevict's own commands (scripts/real-model.sh: about 25 minutes of CPU,
# two at a time), written to docs/data/real-model/, then the page's blocks,
# its figures (installs gnuplot-nox when missing) and the reproduction subset
# that tests/test_real_model.sh checks.
real-model: build/kvevict
	./scripts/real-model.sh build

# docs/leaderboard.md from scratch: `kvevict lm leaderboard` (every method at
# compression ratios 0.5, 0.8 and 0.9 on the committed model, one process per
# ratio; scripts/leaderboard.sh) into docs/data/leaderboard.jsonl, the
# reproduction subset that tests/test_leaderboard.sh checks, the page's
# blocks and its figures (installs gnuplot-nox when missing). Deterministic
# but for the timing column; about 8 minutes of CPU (3 processes).
leaderboard: build/kvevict
	@./scripts/deps.sh gnuplot-nox:gnuplot
	./scripts/leaderboard.sh build

# Each suite lists the tests that skipped with their reasons (scripts/ctest.sh);
# make test ends with the list over the three.
test: test-release test-asan test-tsan
	@./scripts/ctest.sh --summary build build-asan build-tsan

# With npm, the test builds add kvevict-llama (-DKVEVICT_LLAMA=ON: llama.cpp
# fetched once into build/_llama, which the sanitizer build shares); without
# it its tests skip, saying why.
LLAMA_CONFIGURE = if command -v npm >/dev/null 2>&1; then echo -DKVEVICT_LLAMA=ON; fi
test-release: build/kvevict $(TEST_DEPS_STAMP)
	@$(QUIET) build/build.log sh -c '$(CONFIGURE) -S . -B build $$($(LLAMA_CONFIGURE)) && cmake --build build -j $(JOBS)'
	@./scripts/ctest.sh build --output-on-failure -j $(JOBS)

test-asan: $(DEPS_STAMP) $(TEST_DEPS_STAMP)
	@$(QUIET) build-asan/build.log sh -c '$(CONFIGURE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVE_SANITIZE=ON $$($(LLAMA_CONFIGURE)) $$([ -d build/_llama/node_modules ] && echo -DKVEVICT_LLAMA_DIR=$(CURDIR)/build/_llama) && cmake --build build-asan -j $(JOBS)'
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ./scripts/ctest.sh build-asan --output-on-failure -j $(JOBS)

# The thread tests (tests/test_threads.c, tests/test_bank_threads.c, and the
# decoder's products on threads in tests/test_lm_matvec.c) under
# ThreadSanitizer.
test-tsan: $(DEPS_STAMP)
	@$(QUIET) build-tsan/build.log sh -c '$(CONFIGURE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKVE_TSAN=ON && cmake --build build-tsan -j $(JOBS) --target test_threads test_bank_threads test_lm_matvec'
	@TSAN_OPTIONS=halt_on_error=1 ./scripts/ctest.sh build-tsan --output-on-failure \
	  -R '^(test_threads|test_bank_threads|test_lm_matvec)$$'

# libFuzzer on every target for FUZZ_SECONDS each (clang; see docs/robustness.md).
FUZZ_SECONDS ?= 60
fuzz:
	@./scripts/deps.sh clang:clang cmake:cmake
	./scripts/fuzz.sh $(FUZZ_SECONDS)

# The model of models/ from scratch (tools/train/README.md): corpus, tokenizer,
# about 40 minutes of training on 2 cores, export, golden files, evaluation.
# Installs Debian's python3-torch, python3-numpy, libopenblas0-pthread and
# bible-kjv when missing. `make test` never needs any of it.
MODEL_WORK ?= build-model
model:
	@./scripts/deps.sh bible-kjv:bible
	@./scripts/deps.sh python3-torch:py:torch python3-numpy:py:numpy libopenblas0-pthread
	./tools/train/pipeline.sh $(MODEL_WORK)

# CI gates after `make test`: valgrind, coverage >= 90% branches, cppcheck, short fuzz.
ci-gates:
	./scripts/ci-gates.sh

clean:
	rm -rf build build-asan build-tsan build-cov build-fuzz build-valgrind

FORCE:
