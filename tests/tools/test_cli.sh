#!/usr/bin/env bash
# test_cli.sh -- the `nabla` program as a user meets it, outside the source tree too:
#   (1) installed with `cmake --install --prefix` into a scratch prefix, it runs `train` and
#       `demo` from a working directory that has no data/ (the data sets are installed, and
#       found relative to the program);
#   (2) the build tree's program finds ./data from the source tree (what `make run` does),
#       takes NABLA_DATA, and when it finds nothing names where it looked and the fix;
#   (3) `nabla --version` and `nabla version`: the version, the build type, BLIS and SLEEF
#       (kernels), the data directory;
#   (4) every bad option value -- an empty path, a number that under- or overflows a double,
#       --threads beyond its limit, integers beyond 64 bits, trailing garbage -- exits 2 with
#       one line naming the option, the value and the fix;
#   (5) a run that fails says so in words: no C source text ('(ctx', '&', "failed:") in any
#       message.
# Every check runs (a failure does not stop the rest); the failures are listed at the end.
#   usage: test_cli.sh <nabla program> <build dir> <source dir> <version> <build type>
set -u
if [[ $# -ne 5 ]]; then
    echo "usage: $0 <nabla program> <build dir> <source dir> <version> <build type>" >&2
    exit 2
fi
abs() { (cd "$(dirname "$1")" && printf '%s/%s\n' "$(pwd)" "$(basename "$1")"); }
nabla=$(abs "$1") # absolute: the checks run from other working directories
build=$(abs "$2")
src=$(abs "$3")
version=$4
btype=$5
unset NABLA_DATA

failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
work=$(mktemp -d "$build/test-cli.XXXXXX") # the scratch prefix lives in the build tree
empty=$(mktemp -d)                         # a working directory without data/
trap 'rm -rf "$work" "$empty"' EXIT
out=$work/out
err=$work/err

# no_source <file>: fails when a message shows C source text
no_source() {
    if grep -q -e '(ctx' -e '&' -e ' failed: ERR_' "$1"; then
        fail "C source text in a message: $(head -n 3 "$1")"
    fi
}

# ---- (1) installed: runs from anywhere -----------------------------------------------------
echo "== (1) cmake --install $build --prefix $work/prefix"
prefix=$work/prefix
if ! cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1; then
    cat "$work/install.log"
    fail "cmake --install failed"
fi
inst=$prefix/bin/nabla
for f in digits.csv.gz iris.csv breast_cancer.csv wine_data.csv README.md; do
    [[ -f $prefix/share/nabla/data/$f ]] || fail "data set $f not installed in $prefix/share/nabla/data"
done
(cd "$empty" && "$inst" train --epochs 1 --threads 1 --progress lines) >"$out" 2>"$err"
rc=$?
cat "$out" "$err"
[[ $rc -eq 0 ]] || fail "installed 'nabla train' from a directory without data/ exited $rc"
grep -q "($prefix/share/nabla/data/digits.csv.gz)" "$out" ||
    fail "installed 'nabla train' did not read the installed digits.csv.gz"
grep -q '^test accuracy: ' "$out" || fail "installed 'nabla train' printed no test accuracy"
(cd "$empty" && "$inst" demo) >"$out" 2>"$err"
rc=$?
[[ $rc -eq 0 ]] || { cat "$err"; fail "installed 'nabla demo' from a directory without data/ exited $rc"; }
grep -q "^loaded $prefix/share/nabla/data/digits.csv.gz" "$out" ||
    fail "installed 'nabla demo' did not read the installed digits.csv.gz"
(cd "$empty" && "$inst" --version) >"$out" 2>&1
grep -q "^data: $prefix/share/nabla/data (installed with nabla)$" "$out" ||
    fail "installed 'nabla --version' does not show the installed data: $(cat "$out")"

# ---- (2) the build tree's program: ./data, NABLA_DATA, nothing found -----------------------
echo "== (2) the build tree's program"
(cd "$src" && "$nabla" train --epochs 1 --threads 1 --progress lines) >"$out" 2>&1 ||
    { cat "$out"; fail "'nabla train' from the source tree (make run) failed"; }
grep -q '(data/digits.csv.gz)' "$out" || fail "'nabla train' from the source tree did not read ./data"
(cd "$empty" && NABLA_DATA=$src/data "$nabla" train --epochs 1 --threads 1) >"$out" 2>&1 ||
    { cat "$out"; fail "NABLA_DATA=$src/data was not used"; }
(cd "$empty" && NABLA_DATA=$work/nowhere "$nabla" train --epochs 1) >"$out" 2>"$err"
rc=$?
cat "$err"
[[ $rc -ne 0 ]] || fail "NABLA_DATA naming a missing directory was accepted"
grep -q "$work/nowhere/digits.csv.gz" "$err" && grep -q 'from NABLA_DATA' "$err" ||
    fail "a wrong NABLA_DATA is not named as the source of the data directory"
no_source "$err"
(cd "$empty" && "$nabla" train --epochs 1) >"$out" 2>"$err"
rc=$?
cat "$err"
[[ $rc -ne 0 ]] || fail "'nabla train' with no data anywhere exited 0"
grep -q 'cannot read the data set data/digits.csv.gz' "$err" || fail "no plain 'cannot read' message"
grep -q '\$NABLA_DATA' "$err" && grep -q "share/nabla/data" "$err" &&
    grep -q "./data  (in the working directory $empty" "$err" ||
    fail "the message does not name every place looked in"
grep -q -- '--data DIR' "$err" || fail "the message does not name the fix (--data DIR)"
no_source "$err"

# ---- (3) --version ---------------------------------------------------------------------------
echo "== (3) nabla --version"
"$nabla" --version >"$out" 2>&1 || fail "'nabla --version' exited $?"
cat "$out"
for want in "nabla $version" "$btype" "BLIS" "kernels: " "SLEEF" "data: "; do
    grep -q -- "$want" "$out" || fail "'nabla --version' does not show '$want'"
done
"$nabla" version >"$work/out2" 2>&1 || fail "'nabla version' exited $?"
cmp -s "$out" "$work/out2" || fail "'nabla version' and 'nabla --version' differ"

# ---- (4) bad option values: exit 2, one line naming option, value and fix ---------------------
echo "== (4) bad option values"
bad() { # bad <expected fragment> <command and options...>
    local want=$1
    shift
    "$nabla" "$@" >/dev/null 2>"$err"
    local rc=$?
    if [[ $rc -ne 2 ]]; then
        fail "'nabla $*' exited $rc (expected 2)"
        return
    fi
    grep -q -F -- "$want" "$err" || fail "'nabla $*': message '$(head -n 1 "$err")' lacks '$want'"
    [[ $(wc -l <"$err") -eq 1 ]] || fail "'nabla $*': the message is not one line: $(cat "$err")"
    no_source "$err"
}
bad "--data wants a directory, got ''" train --data ''
bad "--data wants a directory, got ''" demo --data ''
bad "--data wants a value" demo --data
bad "unknown option '--bogus'" demo --bogus
bad "--lr wants a number in [0, 1000), got '1e-400' (too small" train --lr 1e-400
bad "--lr wants a number in [0, 1000), got '1e-310' (too small" train --lr 1e-310
bad "--lr wants a number in [0, 1000), got '1e400' (too large" train --lr 1e400
bad "--lr wants a number in [0, 1000), got '0.1x'" train --lr 0.1x
bad "--lr wants a number in [0, 1000), got '-1e-999' (too small" train --lr -1e-999
bad "--threads wants an integer in [0, 256], got '300'" train --threads 300
bad "--threads wants an integer in [0, 256], got '4294967297'" train --threads 4294967297
bad "got '99999999999999999999' (beyond a 64-bit integer)" train --epochs 99999999999999999999
bad "--epochs wants an integer >= 1, got '5x'" train --epochs 5x
bad "--batch wants an integer >= 1, got '-1'" train --batch -1
bad "--width wants an integer in [1, 2147483648], got '3000000000'" train --width 3000000000
bad "--depth wants an integer in [0, 4096], got '5000'" train --depth 5000
bad "--seed wants an integer >= 0, got ' 1'" train --seed ' 1'
bad "--lr wants a number in (0, 10), got '1e-400' (too small" ode --lr 1e-400
bad "--rtol wants a number in (0, 1), got '1e-320' (too small" ode --rtol 1e-320
bad "--atol wants a number in (0, 1), got '1e400' (too large" ode --atol 1e400
bad "--noise wants a number in [0, 10), got '1e-400' (too small" ode --noise 1e-400
bad "--init wants four positive numbers a,b,c,d (each < 1000), got '1e-320,1,1,1' (too small" \
    ode --init 1e-320,1,1,1
bad "--init wants four positive numbers a,b,c,d (each < 1000), got '1, 2,3,4'" ode --init '1, 2,3,4'
bad "--init wants four positive numbers a,b,c,d (each < 1000), got '1,2,3,4,'" ode --init 1,2,3,4,
bad "--threads wants an integer in [0, 256], got '300'" ode --threads 300
bad "--steps wants an integer in [1, 100000000], got '99999999999999999999' (beyond" \
    ode --steps 99999999999999999999
bad "--lrs wants a number in (0, 1000), got '1e-400' (too small" bench --lrs 1e-400
bad "takes no arguments, got 'x'" --version x

# ---- (5) failed runs say so in words ----------------------------------------------------------
echo "== (5) failed runs"
"$nabla" train --data "$empty" --epochs 1 >/dev/null 2>"$err"
rc=$?
cat "$err"
[[ $rc -eq 1 ]] || fail "'nabla train --data <a directory without the data>' exited $rc (expected 1)"
grep -q "^nabla train: cannot read the data set $empty/digits.csv.gz: " "$err" ||
    fail "no plain message for a missing data set"
no_source "$err"
"$nabla" demo --data "$empty" >/dev/null 2>"$err"
rc=$?
cat "$err"
[[ $rc -eq 1 ]] || fail "'nabla demo --data <a directory without the data>' exited $rc (expected 1)"
grep -q "^nabla demo: cannot read the data set $empty/digits.csv.gz: " "$err" ||
    fail "no plain message for a missing data set (demo)"
no_source "$err"
"$nabla" ode --max-steps 1 --steps 1 >/dev/null 2>"$err"
[[ $? -eq 1 ]] || fail "'nabla ode --max-steps 1' did not fail"
no_source "$err"
# what a run cannot be made to fail at from outside: no message is built from the C call
if grep -n '#expr' "$src/tools/nabla.c" "$src/tools/train.c" "$src/tools/ode.c" "$src/tools/cli.c"; then
    fail "a macro turns C source into a message (#expr) in tools/"
fi

if [[ $failures -ne 0 ]]; then
    echo "$failures check(s) FAILED"
    exit 1
fi
echo "PASS"
