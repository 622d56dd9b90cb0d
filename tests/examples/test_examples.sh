#!/usr/bin/env bash
# test_examples.sh -- the examples/ programs of the common path, end to end:
#   - each is at most its line budget (non-blank, non-comment lines: the issue's count);
#   - each prints the same numbers as its long form (tests/examples/*_long.c: the same
#     program written without nabla/train.h and the eager helpers), and writes the same
#     checkpoint file byte for byte.
# usage: test_examples.sh <classify> <classify_long> <source dir>
set -u
classify=$1 classify_long=$2 src=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

lines() { # non-blank lines that are not comments (/* ... */ blocks, // lines)
    awk '
        /^[[:space:]]*$/ { next }
        inblock { if ($0 ~ /\*\//) inblock = 0; next }
        /^[[:space:]]*\/\// { next }
        /^[[:space:]]*\/\*/ { if ($0 !~ /\*\//) inblock = 1; next }
        { n++ }
        END { print n + 0 }' "$1"
}

n=$(lines "$src/examples/classify.c")
echo "examples/classify.c: $n lines (budget 60)"
[ "$n" -le 60 ] || fail "classify.c has $n lines, more than 60"

"$classify" "$src/data/iris.csv" "$work/short.safetensors" >"$work/short.out" 2>&1 ||
    fail "classify failed: $(cat "$work/short.out")"
"$classify_long" "$src/data/iris.csv" "$work/long.safetensors" >"$work/long.out" 2>&1 ||
    fail "classify_long failed: $(cat "$work/long.out")"
cat "$work/short.out"
diff "$work/short.out" "$work/long.out" || fail "classify and its long form print different numbers"
cmp "$work/short.safetensors" "$work/long.safetensors" ||
    fail "classify and its long form wrote different checkpoints"
grep -q '^test accuracy [0-9]* of 30$' "$work/short.out" || fail "no test accuracy line"
acc=$(sed -n 's/^test accuracy \([0-9]*\) of 30$/\1/p' "$work/short.out")
[ "$acc" -ge 27 ] || fail "test accuracy $acc of 30 (iris: an MLP gets 27 or more)"
echo "classify: the same output and checkpoint as its long form"
