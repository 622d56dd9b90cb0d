#!/usr/bin/env bash
# build_matrix.sh -- build everything (library, tools, examples, tests, benchmarks) in
# every build type with every compiler, warnings as errors, so that no configuration a
# user or a distribution picks can fail on a warning.
#
#   bash scripts/build_matrix.sh [compilers...]     default: gcc clang
#
# Build types: Release (-O3), RelWithDebInfo (-O2), MinSizeRel (-Os), Debug (-O0); each
# configured as a user would (just CMAKE_BUILD_TYPE and the compiler) plus NABLA_WERROR=ON
# and the benchmarks, in build-matrix/<compiler>-<type>. A build also fails when its log
# holds any warning at all (CMake's, the linker's). Called by .ci/run (make build-matrix).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

compilers=("$@")
[[ ${#compilers[@]} -gt 0 ]] || compilers=(gcc clang)
types=(Release RelWithDebInfo MinSizeRel Debug)
jobs=${JOBS:-2}

failed=()
for cc in "${compilers[@]}"; do
    command -v "$cc" >/dev/null || { echo "build_matrix: $cc not found" >&2; exit 1; }
    for type in "${types[@]}"; do
        dir=build-matrix/$cc-$type
        log=$dir.log
        mkdir -p build-matrix
        start=$SECONDS
        if env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL cmake -S . -B "$dir" \
            -DCMAKE_BUILD_TYPE="$type" -DCMAKE_C_COMPILER="$cc" \
            -DNABLA_WERROR=ON -DNABLA_BUILD_BENCHMARKS=ON >"$log" 2>&1 &&
            env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL cmake --build "$dir" -j "$jobs" >>"$log" 2>&1; then
            if grep -niE 'warning[:]|CMake Warning' "$log" >/dev/null; then
                echo "build_matrix: $cc $type: built, but with warnings:" >&2
                grep -niE 'warning[:]|CMake Warning' "$log" | head -20 >&2
                failed+=("$cc-$type")
            else
                echo "build_matrix: $cc $type: ok ($((SECONDS - start)) s)"
            fi
        else
            echo "build_matrix: $cc $type: FAILED ($log):" >&2
            grep -E 'error|warning' "$log" | head -30 >&2 || tail -30 "$log" >&2
            failed+=("$cc-$type")
        fi
    done
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "build_matrix: failed: ${failed[*]}" >&2
    exit 1
fi
echo "build_matrix: all ${#compilers[@]}x${#types[@]} configurations built without a warning"
