#!/usr/bin/env bash
# test_train.sh -- the training demo's acceptance (issue 6): `nabla train` on the UCI digits
# from a fixed seed reaches >= 96 % test accuracy in under 10 s, traces its train step once,
# prints the same final loss bits on every run and with 1 or 2 threads, and prints plain
# lines (no progress bar) when its output is not a terminal.
#   usage: test_train.sh <path to the nabla program> <source dir>
set -u
nabla=$1
src=$2
fail() { echo "FAIL: $*"; exit 1; }
out1=$(mktemp) out2=$(mktemp) out3=$(mktemp)
trap 'rm -f "$out1" "$out2" "$out3"' EXIT

start=$(date +%s.%N)
"$nabla" train --data "$src/data" --threads 1 >"$out1" 2>&1 || { cat "$out1"; fail "nabla train exited $?"; }
end=$(date +%s.%N)
cat "$out1"
secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
echo "wall time: $secs s"
awk -v s="$secs" 'BEGIN { exit !(s < 10) }' || fail "took $secs s (goal: under 10 s)"

acc=$(sed -n 's/^test accuracy: \([0-9.]*\)%.*/\1/p' "$out1")
[ -n "$acc" ] || fail "no test accuracy line"
awk -v a="$acc" 'BEGIN { exit !(a >= 96) }' || fail "test accuracy $acc% < 96%"
grep -q '^train step traces: 1 ' "$out1" || fail "the train step traced more than once"
grep -q $'\r' "$out1" && fail "a progress bar was drawn into a file (expected plain lines)"
grep -q '^  epoch  30/30  loss' "$out1" || fail "no plain per-epoch lines"

"$nabla" train --data "$src/data" --threads 2 >"$out2" 2>&1 || fail "nabla train --threads 2 failed"
"$nabla" train --data "$src/data" --threads 1 >"$out3" 2>&1 || fail "second run failed"
bits1=$(grep '^final loss' "$out1") bits2=$(grep '^final loss' "$out2") bits3=$(grep '^final loss' "$out3")
echo "1 thread: $bits1 | 2 threads: $bits2 | again: $bits3"
[ "$bits1" = "$bits2" ] || fail "final loss differs between 1 and 2 threads"
[ "$bits1" = "$bits3" ] || fail "final loss differs between runs"

# bad options: a clear message and a non-zero exit
if "$nabla" train --epochs -3 >/dev/null 2>"$out2"; then fail "--epochs -3 was accepted"; fi
grep -q -- '--epochs wants an integer >= 1' "$out2" || fail "unclear message for --epochs -3"
if "$nabla" train --optimizer adam >/dev/null 2>"$out2"; then fail "unknown option accepted"; fi
grep -q "unknown option '--optimizer'" "$out2" || fail "unclear message for an unknown option"
if "$nabla" train --data /nonexistent >/dev/null 2>"$out2"; then fail "a missing data dir was accepted"; fi
grep -q 'digits.csv.gz' "$out2" || fail "the missing file is not named"
echo "PASS"
