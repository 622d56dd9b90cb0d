#!/usr/bin/env bash
# build_defaults.sh -- a user's plain configure of the source tree: warnings are never
# errors by default (a newer compiler's new warning must not break a user's or a
# distribution's build); only the presets CI uses (and scripts/build_matrix.sh) turn
# NABLA_WERROR on.
#
#   build_defaults.sh <source dir> <work dir>
set -euo pipefail
src=$1 work=$2
fail() {
    echo "test_build_defaults: FAILED: $*" >&2
    exit 1
}
rm -rf "$work"
env -u CFLAGS cmake -S "$src" -B "$work" -DCMAKE_BUILD_TYPE=Release >"$work.log" 2>&1 ||
    { cat "$work.log"; fail "a plain configure failed"; }
grep -q '^NABLA_WERROR:BOOL=OFF$' "$work/CMakeCache.txt" ||
    fail "NABLA_WERROR is not OFF by default: $(grep NABLA_WERROR "$work/CMakeCache.txt")"
flags=$(find "$work" -name flags.make -path '*nabla_objects*' -exec cat {} +)
[[ -n "$flags" ]] || fail "no flags.make for the library"
if grep -q -- '-Werror' <<<"$flags"; then
    fail "the library is compiled with -Werror by default: $(grep -- -Werror <<<"$flags")"
fi
if grep -qiE 'CMake Warning' "$work.log"; then
    fail "configuring warns: $(grep -A3 -i 'CMake Warning' "$work.log")"
fi
# The presets CI builds with do turn it on.
grep -q '"NABLA_WERROR": "ON"' "$src/CMakePresets.json" || fail "the presets do not set NABLA_WERROR"
rm -rf "$work" "$work.log"
echo "test_build_defaults: NABLA_WERROR OFF by default, ON in the presets"
