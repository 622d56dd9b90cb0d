# nabla -- convenience front end to CMake presets (see CMakePresets.json).
#
#   make / make build   install missing Debian packages, configure build/ once, build
#   make test           build, then every ctest suite (output on failure, -j2), then
#                       test-fuzz
#   make test-fuzz      the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/, then the
#                       ctest test labelled fuzz: 100000 inputs per loader
#   make run            build, then ./build/tools/nabla train (the training demo)
#   make bench          build, then run every program in build/benchmarks/
#   make asan           a Debug build in build-asan/ with clang, ASan + UBSan (incl.
#                       pointer-overflow and float-cast-overflow)
#   make test-asan      asan, then every ctest suite there
#   make test-clang     the default build with clang in build-clang/, then every suite
#   make test-native    the default build in build-native/ with every suite run with the
#                       native tier forced and checked (NABLA_TEST_NATIVE=check: every
#                       executable's generated C against the interpreter, bit for bit)
#   make build-matrix   build everything in every build type (Release, RelWithDebInfo,
#                       MinSizeRel, Debug) with gcc and clang, -Werror, in build-matrix/
#   make format         clang-format -i over all C sources and headers
#   make format-check   fail if any file is not formatted
#   make clean          remove build/, build-asan/, build-clang/, build-fuzz/, build-matrix/,
#                       build-native/
#
# Nothing here needs Python. JOBS=N overrides the parallelism (default 2).

JOBS ?= 2
CMAKE ?= cmake
CTEST ?= ctest
CLANG_FORMAT ?= clang-format

# Sanitizer settings for test-asan, unless the caller set its own.
ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=1:strict_string_checks=1
UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1

# cmake --build runs its own make with its own -j: do not hand it this make's jobserver
# or flags (avoids "-jN forced in submake" warnings and double parallelism).
RUN := env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL

FORMAT_DIRS := src include tests tools examples benchmarks
FORMAT_FILES = $(shell find $(FORMAT_DIRS) -type f \( -name '*.c' -o -name '*.h' \) 2>/dev/null | sort)

.DEFAULT_GOAL := build
# Targets share build directories and apt; never run two of them at once.
.NOTPARALLEL:
.PHONY: build deps test test-fuzz run bench asan test-asan test-clang test-native build-matrix format format-check check-clang-format clean

deps:
	@bash scripts/deps.sh

build: deps
	@test -f build/CMakeCache.txt || $(RUN) $(CMAKE) --preset default
	$(RUN) $(CMAKE) --build --preset default -j $(JOBS)

test: build
	$(RUN) $(CTEST) --preset default -j $(JOBS)
	@$(MAKE) --no-print-directory test-fuzz

# The fuzz targets need clang and libFuzzer (libclang-rt-14-dev, installed by deps.sh);
# only they are built there (the preset names its targets).
test-fuzz: deps
	@test -f build-fuzz/CMakeCache.txt || $(RUN) $(CMAKE) --preset fuzz
	$(RUN) $(CMAKE) --build --preset fuzz
	$(RUN) $(CTEST) --preset fuzz

run: build
	./build/tools/nabla train

# Every benchmark, each printing its own table (peers in benchmarks/peers/ run when their
# virtualenv exists: see benchmarks/README.md).
bench: build
	@for b in build/benchmarks/*; do \
		if [ -f "$$b" ] && [ -x "$$b" ]; then echo "== $$b"; "$$b" || exit 1; fi; \
	done

asan: deps
	@test -f build-asan/CMakeCache.txt || $(RUN) $(CMAKE) --preset asan
	$(RUN) $(CMAKE) --build --preset asan -j $(JOBS)

test-asan: asan
	ASAN_OPTIONS='$(ASAN_OPTIONS)' UBSAN_OPTIONS='$(UBSAN_OPTIONS)' \
		$(RUN) $(CTEST) --preset asan -j $(JOBS)

test-clang: deps
	@test -f build-clang/CMakeCache.txt || $(RUN) $(CMAKE) --preset clang
	$(RUN) $(CMAKE) --build --preset clang -j $(JOBS)
	$(RUN) $(CTEST) --preset clang -j $(JOBS)

test-native: deps
	@test -f build-native/CMakeCache.txt || $(RUN) $(CMAKE) --preset default \
		-B build-native -DNABLA_TEST_NATIVE=check
	$(RUN) $(CMAKE) --build build-native -j $(JOBS)
	cd build-native && $(RUN) $(CTEST) -j $(JOBS) --output-on-failure -LE fuzz

build-matrix: deps
	$(RUN) bash scripts/build_matrix.sh

format: check-clang-format
	$(CLANG_FORMAT) -i $(FORMAT_FILES)

format-check: check-clang-format
	$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_FILES)

# clang-format is not one of the packages scripts/deps.sh installs (the build does not
# need it); say so plainly rather than failing with "command not found".
check-clang-format:
	@command -v $(CLANG_FORMAT) >/dev/null || { \
		echo "clang-format not found: apt-get install clang-format (or set CLANG_FORMAT=...)" >&2; \
		exit 1; }

clean:
	rm -rf build build-asan build-clang build-fuzz build-matrix build-native
