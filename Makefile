# SPDX-License-Identifier: MIT
# The two commands of the README:
#   make run    build (Release, quietly) and run the main job: the benchmark
#   make test   build and run every test, then again under ASan + UBSan, then
#               the thread test under TSan
# Build trees live in build/ (Release), build-asan/ and build-tsan/. Builds
# print nothing unless they fail (scripts/quiet.sh); -Werror is on for every
# build made here (KVE_WERROR=ON), as in CI.

JOBS ?= 2
CMAKE_FLAGS ?=
BASE_DEPS = cmake:cmake gcc:gcc make:make pkgconf:pkg-config
QUIET = ./scripts/quiet.sh
CONFIGURE = cmake -DKVE_WERROR=ON $(CMAKE_FLAGS)

.PHONY: all deps run bench test test-release test-asan test-tsan fuzz ci-gates clean plots docs

all: build/kvevict

deps:
	@./scripts/deps.sh $(BASE_DEPS)

build/kvevict: deps FORCE
	@$(QUIET) build/build.log sh -c '$(CONFIGURE) -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j $(JOBS)'

run: build/kvevict
	@./build/kvevict bench

# Per-step cost of every policy against the memory floor (bench/step_cost.c),
# then the llama2.c decoder's tokens per second (bench/lm_speed.c).
bench: build/kvevict
	@./build/kvevict-step-cost
	@./build/kvevict-lm-speed

# The figures of docs/img/ (installs gnuplot-nox when missing) and the measured
# blocks of the docs (docs/results.md, docs/policies/*.md; see kvevict docs --help).
plots: build/kvevict
	@./scripts/deps.sh gnuplot-nox:gnuplot
	./build/kvevict plot --out docs/img

docs: build/kvevict
	./build/kvevict docs $(wildcard docs/*.md docs/policies/*.md)

test: test-release test-asan test-tsan

test-release: build/kvevict
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	@$(QUIET) build-asan/build.log sh -c '$(CONFIGURE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVE_SANITIZE=ON && cmake --build build-asan -j $(JOBS)'
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

# The thread tests (tests/test_threads.c, tests/test_bank_threads.c) under
# ThreadSanitizer.
test-tsan: deps
	@$(QUIET) build-tsan/build.log sh -c '$(CONFIGURE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKVE_TSAN=ON && cmake --build build-tsan -j $(JOBS) --target test_threads test_bank_threads'
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure \
	  -R '^(test_threads|test_bank_threads)$$'

# libFuzzer on every target for FUZZ_SECONDS each (clang; see docs/robustness.md).
FUZZ_SECONDS ?= 60
fuzz:
	@./scripts/deps.sh clang:clang cmake:cmake
	./scripts/fuzz.sh $(FUZZ_SECONDS)

# CI gates after `make test`: valgrind, coverage >= 90% branches, cppcheck, short fuzz.
ci-gates:
	./scripts/ci-gates.sh

clean:
	rm -rf build build-asan build-tsan build-cov build-fuzz build-valgrind

FORCE:
