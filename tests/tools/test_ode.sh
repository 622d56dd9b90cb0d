#!/usr/bin/env bash
# test_ode.sh -- the ODE fitting demo end to end: `nabla ode` with its defaults (seed 0)
# recovers all four Lotka-Volterra parameters within 2 % of the truth (a fit to noisy data
# cannot reach them exactly: the defaults land within 0.3 %), in under 20 s, traces its train
# step once, prints the same fitted parameters and final loss bits with 1 and 2 threads and
# with either adjoint (recursive checkpoint and direct give the same gradient bits), prints
# plain lines (no progress bar) when its output is not a terminal, and rejects bad options
# with exit status 2 and a message that names the problem.
#   usage: test_ode.sh <path to the nabla program> [time limit in s, default 20]
set -u
nabla=$1
limit=${2:-20}
fail() { echo "FAIL: $*"; exit 1; }
out1=$(mktemp) out2=$(mktemp) out3=$(mktemp) err=$(mktemp)
trap 'rm -f "$out1" "$out2" "$out3" "$err"' EXIT

start=$(date +%s.%N)
"$nabla" ode --threads 1 >"$out1" 2>&1 || { cat "$out1"; fail "nabla ode exited $?"; }
end=$(date +%s.%N)
cat "$out1"
secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
echo "wall time: $secs s"
awk -v s="$secs" -v l="$limit" 'BEGIN { exit !(s < l) }' || fail "took $secs s (goal: under $limit s)"

# the table: "  a    1.5000    1.500107    +0.007%" -- name, true, fitted, relative error
for p in a b c d; do
    line=$(grep -E "^  $p +[0-9.]+ +[0-9.]+ +[-+][0-9.]+%$" "$out1") || fail "no fitted value for $p"
    read -r _ truth fitted _ <<<"$line"
    awk -v t="$truth" -v f="$fitted" 'BEGIN { r = (f - t) / t; if (r < 0) r = -r; exit !(r < 0.02) }' ||
        fail "$p: fitted $fitted is not within 2% of $truth"
done
grep -q '^train step traces: 1 ' "$out1" || fail "the train step traced more than once"
grep -q $'\r' "$out1" && fail "a progress bar was drawn into a file (expected plain lines)"
grep -q '^  step   500/500  loss' "$out1" || fail "no plain per-step lines"

# determinism: everything but the timing line is the same for 1 and 2 threads, and for the
# direct adjoint (the same gradient bits as the recursive checkpoint)
"$nabla" ode --threads 2 >"$out2" 2>&1 || fail "nabla ode --threads 2 failed"
"$nabla" ode --threads 1 --adjoint direct >"$out3" 2>&1 || fail "nabla ode --adjoint direct failed"
strip() { grep -v -e ' steps in ' -e '^  fit: ' "$1"; }
diff <(strip "$out1") <(strip "$out2") >/dev/null || {
    diff <(strip "$out1") <(strip "$out2")
    fail "output differs between 1 and 2 threads"
}
diff <(strip "$out1") <(strip "$out3") >/dev/null || {
    diff <(strip "$out1") <(strip "$out3")
    fail "output differs between the checkpointed and the direct adjoint"
}
echo "1 thread: $(grep '^final loss' "$out1") | 2 threads: $(grep '^final loss' "$out2")"

# --help: exit 0, usage on stdout
"$nabla" ode --help >"$out2" 2>&1 || fail "--help exited non-zero"
grep -q '^usage: nabla ode' "$out2" || fail "--help printed no usage"

# bad options: exit status 2 and a clear message
bad() { # bad <expected message fragment> <args...>
    local want=$1
    shift
    "$nabla" ode "$@" >/dev/null 2>"$err"
    local rc=$?
    [ "$rc" -eq 2 ] || fail "'$*' exited $rc (expected 2)"
    grep -q -- "$want" "$err" || { cat "$err"; fail "unclear message for '$*'"; }
}
bad "unknown solver 'rk45'" --solver rk45
bad "rk4 has no error estimate" --solver rk4
bad "--steps wants an integer" --steps -5
bad "--steps wants an integer" --steps 0
bad "--adjoint backsolve is not offered" --adjoint backsolve
bad "unknown option '--optimizer'" --optimizer adam
bad "missing value: '--lr'" --lr
bad "--lr wants a number" --lr abc
bad "--noise wants a number" --noise -0.1
bad "--init wants four positive numbers" --init 1,2,3
bad "--points wants an integer" --points 0
bad "--rtol wants a number" --rtol 0
echo "PASS"
