#!/usr/bin/env bash
# test_native_tiers.sh -- issue 19's bit-identity between tiers, end to end: the digits
# training demo (`nabla train`), the Lotka-Volterra fit through checkpointed adjoints
# (`nabla ode`) and `nabla bench`'s results digest print the same bits with the native tier
# forced on (NABLA_NATIVE=now: every executable, loop bodies included, runs generated C) and
# off (the interpreter), at 1 and 2 threads. The native code is cached in the build tree.
#   usage: test_native_tiers.sh <path to the nabla program> <source dir> <cache dir>
set -u
nabla=$1
src=$2
export NABLA_NATIVE_CACHE=$3
mkdir -p "$NABLA_NATIVE_CACHE"
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

strip_time() { grep -v -e ' steps in ' -e '^  fit: ' -e 'wall time' -e ' s)$' -e '^  epoch ' "$1"; }

for t in 1 2; do
    for m in off now; do
        NABLA_NATIVE=$m "$nabla" train --data "$src/data" --threads $t >"$work/train-$m-$t" 2>&1 ||
            { cat "$work/train-$m-$t"; fail "nabla train (NABLA_NATIVE=$m, $t threads) failed"; }
        NABLA_NATIVE=$m "$nabla" ode --threads $t >"$work/ode-$m-$t" 2>&1 ||
            { cat "$work/ode-$m-$t"; fail "nabla ode (NABLA_NATIVE=$m, $t threads) failed"; }
    done
    a=$(grep '^final loss' "$work/train-off-$t") b=$(grep '^final loss' "$work/train-now-$t")
    echo "train, $t thread(s): interpreter: $a | native: $b"
    [[ -n $a && $a == "$b" ]] || fail "nabla train: the final loss differs between the tiers"
    diff <(grep -E '^  (a|b|c|d) ' "$work/ode-off-$t") <(grep -E '^  (a|b|c|d) ' "$work/ode-now-$t") ||
        fail "nabla ode: the fitted parameters differ between the tiers"
    a=$(grep -E '^final loss' "$work/ode-off-$t") b=$(grep -E '^final loss' "$work/ode-now-$t")
    echo "ode, $t thread(s): interpreter: $a | native: $b"
    [[ $a == "$b" ]] || fail "nabla ode: the final loss differs between the tiers"
done

suite=(--problems quadratic,mlp,lotka_volterra --optimizers adam,sgd --lrs 0.01 --seeds 1 --steps 60
    --data "$src/data" --no-plots --progress lines)
for m in off now; do
    NABLA_NATIVE=$m "$nabla" bench "${suite[@]}" --out "$work/bench-$m" >"$work/bench-$m.out" 2>&1 ||
        { cat "$work/bench-$m.out"; fail "nabla bench (NABLA_NATIVE=$m) failed"; }
done
da=$(tail -n 1 "$work/bench-off.out") db=$(tail -n 1 "$work/bench-now.out")
echo "bench: interpreter: $da"
echo "bench: native:      $db"
[[ $da == sha256* && $da == "$db" ]] || fail "nabla bench: the digest differs between the tiers"
echo PASS
