#!/usr/bin/env bash
# test_models.sh -- the three trained models of examples/ end to end, each to its target,
# each bit-identical for 1 and 2 threads (NABLA_THREADS), with the time each took:
#   - cnn: a CNN on the UCI digits, >= 98% of the 359 test digits (352 or more);
#   - char_rnn: a 2-layer GRU character model of Tiny Shakespeare, 300 steps, test loss
#     below 2.80 bits per character (the text's unigram entropy is 4.78, bigram 3.54);
#   - transformer: a one-block transformer on the same text, 300 steps, below 3.35 bits
#     per character (beyond the bigram statistics: it uses the context).
# With a fifth argument "quick" (sanitizer builds, where training is 10-20x slower), each
# model trains a few steps only and just the 1- vs 2-thread identity is checked.
# usage: test_models.sh <cnn> <char_rnn> <transformer> <source dir> [quick]
set -u
cnn=$1 char_rnn=$2 transformer=$3 src=$4 quick=${5:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() { # run <name> <threads> <program> <args...>: output in $work/<name>.<threads>
    local name=$1 threads=$2
    shift 2
    local t0=$(date +%s.%N)
    NABLA_THREADS=$threads "$@" >"$work/$name.$threads" 2>&1 || fail "$name failed: $(cat "$work/$name.$threads")"
    local t1=$(date +%s.%N)
    echo "$name ($threads thread(s)): $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s"
}
same() { # same <name>: the 1- and 2-thread outputs are identical
    diff "$work/$1.1" "$work/$1.2" || fail "$1 prints different numbers with 1 and 2 threads"
}

if [ "$quick" = quick ]; then
    text="$src/data/tinyshakespeare.txt.gz"
    run cnn 1 "$cnn" "$src/data/digits.csv.gz" 2
    run cnn 2 "$cnn" "$src/data/digits.csv.gz" 2
    same cnn
    run char_rnn 1 "$char_rnn" "$text" 3
    run char_rnn 2 "$char_rnn" "$text" 3
    same char_rnn
    run transformer 1 "$transformer" "$text" 5
    run transformer 2 "$transformer" "$text" 5
    same transformer
    echo "quick: the three models give the same bits at 1 and 2 threads (targets not checked)"
    exit 0
fi
run cnn 1 "$cnn" "$src/data/digits.csv.gz"
run cnn 2 "$cnn" "$src/data/digits.csv.gz"
cat "$work/cnn.2"
same cnn
acc=$(sed -n 's/^test accuracy \([0-9]*\) of 359$/\1/p' "$work/cnn.2")
[ -n "$acc" ] || fail "cnn printed no test accuracy"
[ "$acc" -ge 352 ] || fail "cnn: $acc of 359 test digits, below 98%"

text="$src/data/tinyshakespeare.txt.gz"
run char_rnn_100 1 "$char_rnn" "$text" 100
run char_rnn_100 2 "$char_rnn" "$text" 100
same char_rnn_100
run char_rnn 2 "$char_rnn" "$text" 300
cat "$work/char_rnn.2"
bpc=$(sed -n 's/^test \([0-9.]*\) bits per character.*/\1/p' "$work/char_rnn.2")
[ -n "$bpc" ] || fail "char_rnn printed no test loss"
awk -v b="$bpc" 'BEGIN { exit !(b < 2.80) }' || fail "char_rnn: test loss $bpc bits per character (target below 2.80)"

run transformer 1 "$transformer" "$text" 300
run transformer 2 "$transformer" "$text" 300
cat "$work/transformer.2"
same transformer
bpc=$(sed -n 's/^test \([0-9.]*\) bits per character.*/\1/p' "$work/transformer.2")
[ -n "$bpc" ] || fail "transformer printed no test loss"
awk -v b="$bpc" 'BEGIN { exit !(b < 3.35) }' || fail "transformer: test loss $bpc bits per character (target below 3.35)"
echo "the three models reach their targets, the same bits at 1 and 2 threads"
