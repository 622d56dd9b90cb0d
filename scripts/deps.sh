#!/usr/bin/env bash
# deps.sh -- make sure the Debian packages nabla builds and tests with are installed.
#
# Nothing missing: exits 0 silently (one dpkg-query per package, well under a second).
# Missing, as root: apt-get update + install of just the missing packages.
# Missing, not root: prints the command to run and exits 1.
set -euo pipefail

packages=(
    build-essential # gcc, g++ (test_headers_cxx), make, libc headers
    clang           # the second compiler CI builds and tests with (make test-clang)
    cmake           # >= 3.25 for CMakePresets.json version 6
    pkg-config      # test_install checks nabla.pc; FindSLEEF uses sleef.pc as a hint
    libsleef-dev    # vectorized elementary functions
    libblis-dev     # gemm and friends
    libblis-serial-dev # the same BLIS built without threads, preferred (cmake/FindBLIS.cmake)
    libcmocka-dev   # unit test framework
    zlib1g-dev      # gzip-compressed data sets
    gnuplot-nox     # benchmark plots
    libclang-rt-14-dev # libFuzzer and the sanitizer runtimes for clang (make test-fuzz)
    libopenmpi-dev  # MPI for nabla_dist (nabla/dist.h)
    openmpi-bin     # mpirun, for test_dist
    chromium        # headless, for test_bench_report (nabla bench's report.html)
    libxml2-utils   # xmllint: report.html is well-formed
)

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps.sh: not a Debian system (no dpkg-query); install the equivalents of:" >&2
    echo "  ${packages[*]}" >&2
    exit 0
fi

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    if [[ "$status" != "install ok installed" ]]; then
        missing+=("$p")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

echo "deps.sh: missing packages: ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then
    echo "deps.sh: not root; install them with:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi

if ! apt-get update -q; then
    echo "deps.sh: 'apt-get update' failed; check the network and /etc/apt/sources.list" >&2
    exit 1
fi
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}"; then
    echo "deps.sh: 'apt-get install ${missing[*]}' failed; see the apt output above" >&2
    exit 1
fi
echo "deps.sh: installed ${missing[*]}" >&2
