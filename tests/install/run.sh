#!/usr/bin/env bash
# test_install: install a built tree into a scratch prefix, then build and run a consumer
# against it twice -- with find_package(nabla) (shared and static targets) and with
# pkg-config.
#
#   run.sh <nabla build dir> <scratch dir> <expected version>
#
# Environment: CC (compiler for the consumers, default cc), NABLA_CONSUMER_CFLAGS (extra
# compile and link flags, e.g. the sanitizers when the library was built with them).
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 <nabla build dir> <scratch dir> <expected version>" >&2
    exit 2
fi
build_dir=$1
work=$2
want="nabla $3"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cc=${CC:-cc}
extra=${NABLA_CONSUMER_CFLAGS:-}

step() { printf '\n== %s\n' "$*"; }
fail() {
    echo "test_install: FAILED: $*" >&2
    exit 1
}
check_output() { # <what> <output>
    [[ "$2" == "$want" ]] || fail "$1 printed '$2', expected '$want'"
    echo "$1: $2"
}

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

step "cmake --install $build_dir --prefix $prefix"
cmake --install "$build_dir" --prefix "$prefix"

step "consumer via find_package(nabla)"
# shellcheck disable=SC2086
cmake -S "$here" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_FLAGS="$extra" -DCMAKE_EXE_LINKER_FLAGS="$extra" \
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
cmake --build "$work/consumer" -j 2
check_output "consumer (nabla::nabla)" "$("$work/consumer/consumer")"
check_output "consumer (nabla::nabla_static)" "$("$work/consumer/consumer_static")"
if command -v ldd >/dev/null; then
    # Capture first: with pipefail, `ldd | grep -q` fails at random when grep exits at its
    # first match and ldd dies writing the rest (SIGPIPE).
    deps=$(ldd "$work/consumer/consumer")
    printf '%s\n' "$deps" | grep "$prefix/.*libnabla\.so" >/dev/null ||
        fail "consumer is not linked against the installed libnabla.so: $deps"
fi

step "consumer via pkg-config"
command -v pkg-config >/dev/null || fail "pkg-config not found (scripts/deps.sh installs it)"
pc=$(find "$prefix" -name nabla.pc -print -quit)
[[ -n "$pc" ]] || fail "nabla.pc was not installed"
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
flags=$(pkg-config --cflags --libs nabla) || fail "pkg-config --cflags --libs nabla"
echo "pkg-config --cflags --libs nabla: $flags"
libdir=$(pkg-config --variable=libdir nabla)
[[ -f "$libdir/libnabla.so" ]] || fail "libdir=$libdir from nabla.pc has no libnabla.so"
# shellcheck disable=SC2086
"$cc" -std=c17 -Wall -Wextra $extra "$here/main.c" -o "$work/consumer_pc" $flags
check_output "consumer (pkg-config)" "$(LD_LIBRARY_PATH="$libdir" "$work/consumer_pc")"

# The MPI component, when it was built: find_package(nabla COMPONENTS dist) and
# pkg-config nabla-dist, each consumer run on 2 processes.
if [[ -f "$(dirname "$pc")/nabla-dist.pc" ]]; then
    step "MPI component: find_package(nabla COMPONENTS dist) and pkg-config nabla-dist"
    command -v mpirun >/dev/null || fail "nabla_dist is installed but mpirun is missing"
    if [[ $(id -u) -eq 0 ]]; then
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
    export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mca_base_component_disable_dlclose=1
    export LSAN_OPTIONS="suppressions=$here/../dist/lsan.supp:print_suppressions=0"
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
    want_dist="nabla dist: 2 processes, sum 3"
    # shellcheck disable=SC2086
    cmake -S "$here/dist" -B "$work/consumer_dist" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_C_FLAGS="$extra" -DCMAKE_EXE_LINKER_FLAGS="$extra" \
        -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
    cmake --build "$work/consumer_dist" -j 2
    out=$(LD_LIBRARY_PATH="$libdir" timeout 120 mpirun --oversubscribe -np 2 \
          "$work/consumer_dist/consumer_dist")
    [[ "$out" == "$want_dist" ]] || fail "consumer_dist (nabla::dist) printed '$out'"
    echo "consumer (nabla::dist): $out"
    flags=$(pkg-config --cflags --libs nabla-dist) || fail "pkg-config --cflags --libs nabla-dist"
    echo "pkg-config --cflags --libs nabla-dist: $flags"
    # shellcheck disable=SC2086
    "$cc" -std=c17 -Wall -Wextra $extra "$here/dist/main.c" -o "$work/consumer_dist_pc" $flags
    out=$(LD_LIBRARY_PATH="$libdir" timeout 120 mpirun --oversubscribe -np 2 "$work/consumer_dist_pc")
    [[ "$out" == "$want_dist" ]] || fail "consumer_dist (pkg-config) printed '$out'"
    echo "consumer (pkg-config nabla-dist): $out"
fi

rm -rf "$work"
echo "test_install: OK"
