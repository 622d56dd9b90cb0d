#!/usr/bin/env bash
# test_bench_diverged.sh -- `nabla bench` when optimizers diverge (tools/bench.c):
#   - an optimizer whose every learning rate diverges is flagged, not given a best rate:
#     sgd at 10 and 100 on rosenbrock2 and the quadratic (the loss goes to inf), momentum
#     at 0.001 and 0.01 on the quadratic (0.001 stays finite but ends ~1e110 times above its
#     start: the "best" a plain lowest-mean rule used to report);
#   - summary.md and summary.json say how many seeds diverged, and define "diverged";
#   - the loss plot's y range comes from the curves that did not diverge (the diverged ones
#     are drawn clipped and labelled), it draws the target line and a band over the seeds,
#     and its x axis ends at the last step;
#   - plots/<problem>_lr.png (final loss against learning rate) is drawn, the diverged
#     rates marked;
#   - no run.lock is left behind.
#
#   test_bench_diverged.sh <nabla binary> <source root>
set -uo pipefail

nabla=$1
src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/nabla-bench-diverged.XXXXXX")
trap '[[ ${NABLA_TEST_KEEP:-0} == 1 ]] || rm -rf "$work"' EXIT
fails=0

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

out=$work/dv
"$nabla" bench --problems rosenbrock2,quadratic --optimizers sgd,momentum,adam \
    --lr sgd=10,100 --lr momentum=0.001,0.01 --lr adam=0.01,0.1 --seeds 0,1 --steps 60 \
    --data "$src/data" --out "$out" --progress lines >"$work/dv.out" 2>"$work/dv.err"
rc=$?
[[ $rc == 0 ]] || fail "the run exited $rc: $(cat "$work/dv.err")"
sed -n '/^| problem/,/^$/p' "$work/dv.out"

# ---- the summary ------------------------------------------------------------------------
md=$out/summary.md
row() { # row <problem title prefix> <optimizer>: the optimizer's row of that problem
    awk -v t="$1" -v o="$2" -F' [|] ' '
        /^\| [A-Z]/ { inside = index($0, "| " t) == 1 }
        inside && $2 == o { print; exit }' "$md"
}
for p in "Rosenbrock 2-D" "Ill-conditioned quadratic"; do
    r=$(row "$p" sgd)
    [[ $r == *"diverged at every lr"* ]] || fail "$p, sgd: not flagged as diverged at every lr: '$r'"
    [[ $r =~ \|\ sgd\ \|\ —\ \| ]] || fail "$p, sgd: a best learning rate is shown: '$r'"
done
r=$(row "Ill-conditioned quadratic" momentum)
[[ $r == *"diverged at every lr"* ]] ||
    fail "quadratic, momentum (1e110 times its start at lr 0.001): not flagged: '$r'"
[[ $r == *"e+1"[0-9][0-9]* ]] && fail "quadratic, momentum: a blown-up loss is shown as its best: '$r'"
r=$(row "Rosenbrock 2-D" momentum)
[[ $r =~ \|\ momentum\ \|\ 0\.001\ \|\ [0-9.]+e-0[0-9]\ ±\ [0-9.e+-]+\ \|\ no\ \| ]] ||
    fail "rosenbrock2, momentum: not a best rate with no seed diverged: '$r'"
r=$(row "Ill-conditioned quadratic" adam)
[[ $r =~ \|\ adam\ \|\ 0\.1\ \|\ .*\ \|\ no\ \| ]] || fail "quadratic, adam: '$r'"
grep -q "^| problem | optimizer | best lr | final loss (mean ± std, 2 seeds) | diverged |" "$md" ||
    fail "summary.md has no diverged column: $(head -n 1 "$md")"
grep -q "more than 1000 times" "$md" || fail "summary.md does not define diverged"
grep -q "more than 1000 times" <("$nabla" bench --help) || fail "--help does not define diverged"

js=$out/summary.json
grep -q '"diverged_at_every_lr": true' "$js" || fail "summary.json: no diverged_at_every_lr"
grep -q '"diverged_seeds": 2' "$js" || fail "summary.json: no diverged_seeds"
if command -v python3 >/dev/null 2>&1; then
    python3 - "$js" <<'EOF' || fail "summary.json (above)"
import json, sys
s = json.load(open(sys.argv[1]))
bad = []
want = {  # (problem, optimizer): (best lr, diverged at every lr, seeds diverged at best lr)
    ("rosenbrock2", "sgd"): (None, True, 2), ("rosenbrock2", "momentum"): (0.001, False, 0),
    ("rosenbrock2", "adam"): (0.1, False, 0), ("quadratic", "sgd"): (None, True, 2),
    ("quadratic", "momentum"): (None, True, 2), ("quadratic", "adam"): (0.1, False, 0)}
for p in s["problems"]:
    for o in p["optimizers"]:
        got = (o.get("best_lr"), o.get("diverged_at_every_lr"), o.get("diverged_seeds"))
        if got != want[(p["name"], o["name"])]:
            bad.append(f"{p['name']} {o['name']}: {got} != {want[(p['name'], o['name'])]}")
        if o.get("diverged_at_every_lr") and o.get("final_loss_mean") is not None:
            bad.append(f"{p['name']} {o['name']}: a final loss for a diverged optimizer")
        for lr in o["learning_rates"]:
            if "diverged_seeds" not in lr:
                bad.append(f"{p['name']} {o['name']} lr {lr['lr']}: no diverged_seeds")
if "diverged" not in s:
    bad.append("no definition of diverged")
print("\n".join(bad))
sys.exit(1 if bad else 0)
EOF
fi

# ---- the loss plots ---------------------------------------------------------------------
for p in rosenbrock2 quadratic; do
    gp=$out/plots/$p.gp
    dat=$out/plots/$p.dat
    target=$(awk -v p="$p" '$0 ~ "\"name\": \"" p "\"" { f = 1 } f && /"target_loss"/ {
        sub(/.*: /, ""); sub(/,$/, ""); print; exit }' "$out/summary.json")
    grep -q "^set xrange \[0:60\]$" "$gp" || fail "$p.gp: the x axis does not end at step 60"
    grep -q "^     $target with lines .* title 'target $target'" "$gp" ||
        fail "$p.gp: no line at the target loss $target"
    grep -q "using 1:3:4 with filledcurves" "$gp" || fail "$p.gp: no band over the seeds"
    yr=$(sed -n 's/^set yrange \[\([^:]*\):\([^]]*\)\]$/\1 \2/p' "$gp")
    if [[ -z $yr ]]; then
        fail "$p.gp sets no y range"
        continue
    fi
    read -r ylo yhi <<<"$yr"
    # every point of a curve that did not diverge (mean, band) is inside the range, the
    # diverged curves rise above it (they are clipped), and their key says so
    awk -v lo="$ylo" -v hi="$yhi" -v p="$p" '
        /^# / { div = /diverged at every lr/; next }
        NF == 4 && !div { for (i = 2; i <= 4; i++) if ($i < lo || $i > hi) {
            print "FAIL: " p ".dat: " $0 " is outside the y range [" lo ":" hi "]"; bad = 1 } }
        NF >= 2 && div && $2 > hi { above = 1 }
        END { if (!above) print "FAIL: " p ".dat: no diverged curve above the y range " hi
              exit bad || !above }' "$dat" || fails=$((fails + 1))
    grep -q "title '[a-z]* (lr [0-9.e+-]*): diverged at every lr'" "$gp" ||
        fail "$p.gp: no diverged curve drawn and labelled as such"
    echo "$p.gp: y range [$ylo:$yhi], target $target"
done
# the quadratic's curves without the diverged ones span ~37894 (step 0) down to ~1: the
# range must not reach 1e10 (momentum at 0.001 ends near 1e110)
awk -v hi="$(sed -n 's/^set yrange \[[^:]*:\([^]]*\)\]$/\1/p' "$out/plots/quadratic.gp")" \
    'BEGIN { exit !(hi + 0 < 1e10) }' || fail "quadratic.gp: the y range reaches 1e10"

# ---- the learning-rate plots ------------------------------------------------------------
for p in rosenbrock2 quadratic; do
    png=$out/plots/${p}_lr.png
    magic=$(head -c 16 "$png" 2>/dev/null | od -An -tx1 | tr -d ' \n')
    [[ $magic == 89504e470d0a1a0a0000000d49484452 ]] || fail "$png is not a PNG ('$magic')"
    gp=$out/plots/${p}_lr.gp
    [[ -s $out/plots/${p}_lr.dat ]] || fail "no ${p}_lr.dat"
    grep -q "^set logscale xy$" "$gp" || fail "${p}_lr.gp is not log-log"
    grep -q "title 'every seed diverged (at the top)'" "$gp" ||
        fail "${p}_lr.gp does not mark the diverged learning rates"
done

# ---- no lock left ---------------------------------------------------------------------
[[ -e $out/run.lock ]] && fail "a run that finished left run.lock"
[[ -z $(find "$out" -name '.*' -type f) ]] || fail "temporary files left in $out"

if [[ $fails -gt 0 ]]; then
    echo "test_bench_diverged: $fails failure(s)"
    exit 1
fi
echo "test_bench_diverged: all checks passed"
