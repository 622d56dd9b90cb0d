#!/bin/sh
# Builds benchmarks/peers/cvodes_lv.c (the SUNDIALS CVODES peer of the ODE benchmarks) into
# <outdir>/cvodes_lv, then benchmarks/peers/cvodes_stiff.c (the peer of the stiff-ODE
# work-precision benchmark) into <outdir>/cvodes_stiff, with the same flags and libraries;
# prints the two paths, one a line. Installs Debian's libsundials-dev first when its headers
# are missing (needs root; otherwise fails with a message). Usage, from anywhere:
#   benchmarks/peers/build_cvodes.sh [outdir]     (default: build/peers, under the repo root)
# Environment: CC (default cc), CFLAGS (default -O2).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-"$root/build/peers"}
cc=${CC:-cc}
cflags=${CFLAGS:--O2}

if [ ! -f /usr/include/cvodes/cvodes.h ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "build_cvodes.sh: installing libsundials-dev" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y libsundials-dev >&2
    else
        echo "build_cvodes.sh: SUNDIALS headers missing; apt-get install libsundials-dev" >&2
        exit 1
    fi
fi

mkdir -p "$out"
# shellcheck disable=SC2086
"$cc" -std=c17 $cflags "$here/cvodes_lv.c" -o "$out/cvodes_lv" \
    -lsundials_cvodes -lsundials_nvecserial -lsundials_sunmatrixdense \
    -lsundials_sunlinsoldense -lsundials_sunnonlinsolfixedpoint -lm
echo "$out/cvodes_lv"
# shellcheck disable=SC2086
"$cc" -std=c17 $cflags "$here/cvodes_stiff.c" -o "$out/cvodes_stiff" \
    -lsundials_cvodes -lsundials_nvecserial -lsundials_sunmatrixdense \
    -lsundials_sunlinsoldense -lsundials_sunnonlinsolfixedpoint -lm
echo "$out/cvodes_stiff"
