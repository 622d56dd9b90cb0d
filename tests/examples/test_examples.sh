#!/usr/bin/env bash
# test_examples.sh -- the examples/ programs of the common path, end to end:
#   - each is at most its line budget (non-blank, non-comment lines: the issue's count);
#   - each prints the same numbers as its long form (tests/examples/*_long.c: the same
#     program written without nabla/train.h and the eager helpers), and writes the same
#     checkpoint file byte for byte.
# usage: test_examples.sh <classify> <classify_long> <fit_ode> <fit_ode_long> <rnn> <rnn_long>
#                         <compare_optimizers> <source dir>
set -u
classify=$1 classify_long=$2 fit_ode=$3 fit_ode_long=$4 rnn=$5 rnn_long=$6 compare=$7 src=$8
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

n=$(lines "$src/examples/fit_ode.c")
echo "examples/fit_ode.c: $n lines (budget 70)"
[ "$n" -le 70 ] || fail "fit_ode.c has $n lines, more than 70"
"$fit_ode" >"$work/fit.out" 2>&1 || fail "fit_ode failed: $(cat "$work/fit.out")"
"$fit_ode_long" >"$work/fit_long.out" 2>&1 || fail "fit_ode_long failed: $(cat "$work/fit_long.out")"
cat "$work/fit.out"
diff "$work/fit.out" "$work/fit_long.out" || fail "fit_ode and its long form print different numbers"
k=$(sed -n 's/^k \([0-9.]*\) .*/\1/p' "$work/fit.out") c=$(sed -n 's/.*  c \([0-9.]*\) .*/\1/p' "$work/fit.out")
awk -v k="$k" -v c="$c" 'BEGIN { exit !(k > 1.99 && k < 2.01 && c > 0.29 && c < 0.31) }' ||
    fail "fit_ode recovered k $k, c $c (true 2 and 0.3)"
echo "fit_ode: the same output as its long form"

n=$(lines "$src/examples/rnn.c")
echo "examples/rnn.c: $n lines (budget 70)"
[ "$n" -le 70 ] || fail "rnn.c has $n lines, more than 70"
"$rnn" >"$work/rnn.out" 2>&1 || fail "rnn failed: $(cat "$work/rnn.out")"
"$rnn_long" >"$work/rnn_long.out" 2>&1 || fail "rnn_long failed: $(cat "$work/rnn_long.out")"
cat "$work/rnn.out"
diff "$work/rnn.out" "$work/rnn_long.out" || fail "rnn and its long form print different numbers"
l=$(sed -n 's/^loss after 300 steps \([0-9.e+-]*\) .*/\1/p' "$work/rnn.out")
awk -v l="$l" 'BEGIN { exit !(l > 0 && l < 0.03) }' || fail "rnn's loss $l did not fall below 0.03"
echo "rnn: the same output as its long form"

# compare_optimizers: 6 optimizers x 3 learning rates, the same table on a second run
"$compare" "$src/data/wine_data.csv" >"$work/cmp1.out" 2>&1 || fail "compare_optimizers failed"
"$compare" "$src/data/wine_data.csv" >"$work/cmp2.out" 2>&1 || fail "compare_optimizers failed"
cat "$work/cmp1.out"
cmp -s "$work/cmp1.out" "$work/cmp2.out" || fail "compare_optimizers printed another table on a second run"
[ "$(grep -c ' / 45$' "$work/cmp1.out")" = 18 ] || fail "compare_optimizers: not 18 rows"
grep -q '^adam  *1e-02 .* 4[3-5] / 45$' "$work/cmp1.out" || fail "adam at 1e-2 below 43 of 45"
