# The two commands of the README:
#   make run    build (Release) and run the main job: the benchmark
#   make test   build and run every test, then again under ASan + UBSan
# Build trees live in build/ (Release), build-asan/ and build-tsan/.

JOBS ?= 2
CMAKE_FLAGS ?=
BASE_DEPS = cmake:cmake gcc:gcc make:make

.PHONY: all deps run test test-release test-asan test-tsan clean

all: build/kvevict

deps:
	@./scripts/deps.sh $(BASE_DEPS)

build/kvevict: deps FORCE
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	cmake --build build -j $(JOBS)

run: build/kvevict
	./build/kvevict bench

test: test-release test-asan

test-release: build/kvevict
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVE_SANITIZE=ON $(CMAKE_FLAGS) >/dev/null
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf build build-asan build-tsan build-cov build-fuzz

FORCE:
