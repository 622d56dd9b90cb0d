#!/usr/bin/env bash
# test_bench.sh -- `nabla bench` end to end (tools/bench.c):
#   - two runs of a small suite (3 problems, 3 optimizers, 2 seeds, 200 steps) print the
#     same digest and write the same bytes; so do runs with 2 kernel threads and 2 jobs;
#   - a run killed midway (SIGKILL after some cells, and at a random moment) and resumed
#     gives the same digest and every file of a straight run byte for byte (results.csv,
#     summary.json, summary.md, the plots' .dat, .gp and .png, the cells), with f32 cells
#     of a classifier (logreg, mlp: a loss read back as f32, an accuracy) among those kept;
#   - a single cell run alone gives its rows of the full suite, bit for bit;
#   - the plots are PNG files, two per problem (loss against step: one curve per optimizer,
#     its band over the seeds, the target line, the x axis ending at the last step; final
#     loss against learning rate);
#   - no run.lock is left after a run that finished;
#   - bad options fail with a message and exit 2 and leave no result files.
#
#   test_bench.sh <nabla binary> <source root>
set -uo pipefail

nabla=$1
src=$2
data=$src/data
work=$(mktemp -d "${TMPDIR:-/tmp}/nabla-bench-test.XXXXXX")
trap '[[ ${NABLA_TEST_KEEP:-0} == 1 ]] || rm -rf "$work"' EXIT
fails=0

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

suite=(--problems rosenbrock2,beale,logreg --optimizers sgd,adam,lion --seeds 0,1 --steps 200
    --data "$data" --progress lines)

same_files() { # same_files <dir> <dir> <what>: the same files, byte for byte
    local x=$1 y=$2 what=$3 f
    if ! diff <(cd "$x" && find . -type f | sort) <(cd "$y" && find . -type f | sort) >/dev/null; then
        fail "$what: not the same files: $(diff <(cd "$x" && find . -type f | sort) \
            <(cd "$y" && find . -type f | sort) | grep '^[<>]' | tr '\n' ' ')"
        return
    fi
    while read -r f; do
        cmp -s "$x/$f" "$y/$f" || fail "$what: $f differs"
    done < <(cd "$x" && find . -type f | sort)
}

digest_of() { # the digest line must be the last line of the output
    tail -n 1 "$1" | sed -n 's/^sha256 of results.csv: \([0-9a-f]\{64\}\)$/\1/p'
}

run() { # run <name> [options...]: output in $work/<name>.out, exit code in $work/<name>.rc
    local name=$1
    shift
    "$nabla" bench "$@" >"$work/$name.out" 2>"$work/$name.err"
    echo $? >"$work/$name.rc"
}

# ---- the same bytes, run to run and for any thread count -------------------------------
run a "${suite[@]}" --out "$work/a"
run a2 "${suite[@]}" --out "$work/a2"
run b "${suite[@]}" --out "$work/b" --threads 2 --jobs 2
for r in a a2 b; do
    [[ $(cat "$work/$r.rc") == 0 ]] || { fail "run $r exited $(cat "$work/$r.rc")"; cat "$work/$r.err"; }
done
da=$(digest_of "$work/a.out")
[[ -n $da ]] || fail "run a did not print the digest last: $(tail -n 2 "$work/a.out")"
echo "digest, 1 thread:            $da"
echo "digest, again:               $(digest_of "$work/a2.out")"
echo "digest, 2 threads x 2 jobs:  $(digest_of "$work/b.out")"
[[ $(digest_of "$work/a2.out") == "$da" ]] || fail "a second run printed another digest"
[[ $(digest_of "$work/b.out") == "$da" ]] || fail "--threads 2 --jobs 2 printed another digest"
[[ $(sha256sum <"$work/a/results.csv" | cut -c1-64) == "$da" ]] ||
    fail "the digest printed is not the SHA-256 of results.csv"
same_files "$work/a" "$work/a2" "a second run"
same_files "$work/a" "$work/b" "2 threads x 2 jobs"
[[ -e $work/a/run.lock ]] && fail "a run that finished left $work/a/run.lock"
rows=$(($(wc -l <"$work/a/results.csv") - 1))
cells=$(find "$work/a/cells" -name '*.csv' | wc -l)
echo "results.csv: $rows rows from $cells cells"
# 3 problems x (4 + 4 + 4 default rates) x 2 seeds
[[ $cells == 72 ]] || fail "expected 72 cells, found $cells"
[[ $rows -gt 72 ]] || fail "results.csv has only $rows rows"
head -n 1 "$work/a/results.csv" | grep -qx 'problem,optimizer,trial,lr,seed,step,loss,accuracy,valid_loss,test_loss' ||
    fail "results.csv's header: $(head -n 1 "$work/a/results.csv")"
grep -q '^logreg,adam,,0.01,1,200,[0-9.e+-]*,0\.[0-9]*,,$' "$work/a/results.csv" ||
    fail "no final logreg row with an accuracy"
grep -q '"best_lr"' "$work/a/summary.json" || fail "summary.json has no best_lr"
grep -q '^| problem | optimizer | best lr |' "$work/a.out" || fail "the summary table was not printed"
if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$work/a/summary.json" ||
        fail "summary.json is not valid JSON"
fi

# ---- killed and resumed --------------------------------------------------------------
# (1) killed by itself (SIGKILL) after 60 cells were saved: a run stopped between cells,
# among logreg's (f32, with an accuracy): all of sgd's and half of adam's are kept
NABLA_BENCH_KILL_AFTER=60 "$nabla" bench "${suite[@]}" --out "$work/k" >"$work/k.out" 2>&1
rc=$?
[[ $rc == 137 ]] || fail "the killed run exited $rc, not 137 (SIGKILL)"
[[ -f $work/k/results.csv ]] && fail "a killed run left results.csv"
kept=$(find "$work/k/cells" -name '*.csv' | wc -l)
run k2 "${suite[@]}" --out "$work/k" --resume
grep -q "resuming .*: 60 cells finished before, 12 to run" "$work/k2.out" ||
    fail "the resumed run did not keep 60 cells: $(grep resuming "$work/k2.out")"
echo "killed after $kept cells, resumed: $(digest_of "$work/k2.out")"
[[ $(digest_of "$work/k2.out") == "$da" ]] || fail "killed + resumed printed another digest"
same_files "$work/a" "$work/k" "killed after 60 cells + resumed"
# (2) killed at random moments, several times, each time resumed, with 2 jobs
kills=0
rm -rf "$work/r"
"$nabla" bench "${suite[@]}" --problems mlp,logreg --out "$work/r" --jobs 2 --no-plots \
    --steps 100 >"$work/r0.out" 2>&1 &
pid=$!
sleep 0.4
kill -9 $pid 2>/dev/null && kills=$((kills + 1))
wait $pid 2>/dev/null
for i in 1 2 3; do
    "$nabla" bench "${suite[@]}" --problems mlp,logreg --out "$work/r" --jobs 2 --no-plots \
        --steps 100 --resume >"$work/r$i.out" 2>&1 &
    pid=$!
    sleep 0.$((3 + i))
    kill -9 $pid 2>/dev/null && kills=$((kills + 1))
    wait $pid 2>/dev/null
    echo "  random kill $i: $(find "$work/r/cells" -name '*.csv' | wc -l) of 48 cells saved"
done
run rf "${suite[@]}" --problems mlp,logreg --out "$work/r" --jobs 2 --no-plots --steps 100 \
    --resume
run rs "${suite[@]}" --problems mlp,logreg --out "$work/rs" --no-plots --steps 100
echo "killed at random $kills times, then resumed: $(digest_of "$work/rf.out")" \
    "(straight: $(digest_of "$work/rs.out"))"
[[ -n $(digest_of "$work/rs.out") ]] || fail "the straight mlp run failed: $(tail -n 3 "$work/rs.err")"
[[ $(digest_of "$work/rf.out") == "$(digest_of "$work/rs.out")" ]] ||
    fail "randomly killed + resumed printed another digest"
leftovers=$(find "$work/r/cells" -name '.*' -type f | wc -l)
[[ $leftovers == 0 ]] || fail "$leftovers temporary files of killed writes remain after --resume"
[[ $(find "$work/r/cells" -name '*.csv' | wc -l) == 48 ]] || fail "the mlp/logreg run has not 48 cells"
same_files "$work/rs" "$work/r" "killed at random + resumed"

# (3) damaged cell files are run again, not trusted: a row deleted, the head's outcome
# edited, bytes after a NUL, a file cut short, a row of another cell
cp -r "$work/a" "$work/d"
cells_d=$work/d/cells
sed -i '3d' "$cells_d/beale.adam.lr0.1.seed0.csv"
sed -i '1s/reached \(-\?[0-9]*\)/reached 3/' "$cells_d/beale.sgd.lr0.01.seed1.csv"
printf '\0garbage\n' >>"$cells_d/logreg.lion.lr0.001.seed0.csv"
truncate -s -7 "$cells_d/rosenbrock2.sgd.lr0.1.seed0.csv"
sed -n '2p' "$cells_d/beale.lion.lr0.1.seed1.csv" >>"$cells_d/beale.lion.lr0.1.seed0.csv"
rm "$work/d/results.csv"
run d2 "${suite[@]}" --out "$work/d" --resume
grep -q "resuming .*: 67 cells finished before, 5 to run" "$work/d2.out" ||
    fail "damaged cells were kept: $(grep resuming "$work/d2.out")"
[[ $(digest_of "$work/d2.out") == "$da" ]] || fail "resumed over damaged cells: another digest"
for f in "$work"/a/cells/*.csv; do
    cmp -s "$f" "$cells_d/$(basename "$f")" || fail "cell $(basename "$f") was not rewritten"
done
echo "5 damaged cell files: run again, digest $(digest_of "$work/d2.out")"

# (4) a second run cannot write into a directory a run is writing into
"$nabla" bench "${suite[@]}" --problems mlp --out "$work/l" --no-plots >"$work/l.out" 2>&1 &
pid=$!
for _ in $(seq 100); do
    [[ -f $work/l/run.cfg ]] && break
    sleep 0.05
done
run l2 "${suite[@]}" --problems mlp --out "$work/l" --no-plots --resume
[[ -e $work/l/run.lock ]] || fail "the refused run removed the lock of the run still writing"
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
[[ $(cat "$work/l2.rc") == 2 ]] && grep -q "another nabla bench (pid $pid) is writing into" "$work/l2.err" ||
    fail "a concurrent run was not refused: $(cat "$work/l2.err")"

# (5) gnuplot: missing or broken at the start is an error before anything is written; one
# that fails on the plots leaves complete results, the table and the digest
mkdir -p "$work/fakebin"
printf '#!/bin/sh\nexit 1\n' >"$work/fakebin/gnuplot"
chmod +x "$work/fakebin/gnuplot"
PATH="$work/fakebin:$PATH" run g1 "${suite[@]}" --out "$work/g1"
[[ $(cat "$work/g1.rc") == 2 && ! -e $work/g1 ]] ||
    fail "a broken gnuplot was not refused up front (exit $(cat "$work/g1.rc"))"
grep -q "gnuplot with its pngcairo terminal is needed" "$work/g1.err" || fail "g1: $(cat "$work/g1.err")"
printf '#!/bin/sh\n[ "$1" = "-e" ] && exit 0\nexit 1\n' >"$work/fakebin/gnuplot"
PATH="$work/fakebin:$PATH" run g2 "${suite[@]}" --out "$work/g2"
[[ $(cat "$work/g2.rc") == 1 ]] || fail "a gnuplot failing on the plots: exit $(cat "$work/g2.rc")"
grep -q "the plots were not drawn" "$work/g2.err" || fail "g2: $(cat "$work/g2.err")"
[[ -e $work/g2/run.lock ]] && fail "a run that failed on its plots left run.lock"
[[ $(digest_of "$work/g2.out") == "$da" ]] || fail "g2 did not print the digest last"
run g3 "${suite[@]}" --out "$work/g2" --resume
[[ $(cat "$work/g3.rc") == 0 && -s $work/g2/plots/beale.png ]] || fail "--resume did not draw the plots"
[[ -z $(find "$work/g2" -name '.*' -type f) ]] || fail "temporary files left in $work/g2"

# (6) data changed since: --resume refuses to mix two data sets
cp -r "$data" "$work/data2"
sed -i '2s/^17.99,/17.98,/' "$work/data2/breast_cancer.csv"
run dd "${suite[@]}" --out "$work/a" --resume --data "$work/data2"
[[ $(cat "$work/dd.rc") == 2 ]] && grep -q "was made with other options, data or nabla" "$work/dd.err" ||
    fail "--resume with other data was not refused: $(head -n 2 "$work/dd.err")"

# ---- one cell alone -------------------------------------------------------------------
run one --problems beale --optimizers lion --lrs 0.001 --seeds 1 --steps 200 --data "$data" \
    --out "$work/one" --progress lines
grep '^beale,lion,,0.001,1,' "$work/a/results.csv" >"$work/one.expect"
tail -n +2 "$work/one/results.csv" >"$work/one.got"
[[ -s $work/one.expect ]] || fail "the suite has no beale/lion/0.001/seed 1 rows"
cmp -s "$work/one.expect" "$work/one.got" || fail "the cell alone differs from its suite rows"
echo "one cell alone: $(wc -l <"$work/one.got") rows, identical to the suite's"

# ---- stochastic problems: minibatches from the cell key, the same bytes all the same -------
ssuite=(--problems logreg_mb,mlp_mb,noisy_quadratic --optimizers sgd,adam --lrs 0.01,0.1
    --seeds 0,1 --steps 120 --data "$data" --progress lines --no-plots)
run s1 "${ssuite[@]}" --out "$work/s1"
run s2 "${ssuite[@]}" --out "$work/s2" --threads 2 --jobs 2
NABLA_BENCH_KILL_AFTER=10 "$nabla" bench "${ssuite[@]}" --out "$work/s3" >"$work/s3k.out" 2>&1
rc=$?
[[ $rc == 137 ]] || fail "the killed stochastic run exited $rc, not 137"
run s3 "${ssuite[@]}" --out "$work/s3" --resume
for r in s1 s2 s3; do
    [[ $(cat "$work/$r.rc") == 0 ]] || { fail "stochastic run $r exited $(cat "$work/$r.rc")"; cat "$work/$r.err"; }
done
ds=$(digest_of "$work/s1.out")
echo "stochastic digest: $ds; --threads 2 --jobs 2: $(digest_of "$work/s2.out");" \
    "killed after 10 cells + resumed: $(digest_of "$work/s3.out")"
[[ -n $ds && $(digest_of "$work/s2.out") == "$ds" ]] || fail "stochastic: --threads 2 --jobs 2 differs"
[[ $(digest_of "$work/s3.out") == "$ds" ]] || fail "stochastic: killed + resumed differs"
same_files "$work/s1" "$work/s2" "stochastic, 2 threads x 2 jobs"
same_files "$work/s1" "$work/s3" "stochastic, killed + resumed"
[[ $(grep -c '^' "$work/s1/results.csv") -gt 24 ]] || fail "the stochastic run has too few rows"
# a classifier's row: training loss, test accuracy, validation and test losses; the
# quadratic's: no accuracy
num='[0-9.e+-]\+'
grep -q "^mlp_mb,adam,,0.01,1,120,$num,0\.[0-9]*,$num,$num\$" "$work/s1/results.csv" ||
    fail "no final mlp_mb row with its validation and test losses"
grep -q "^noisy_quadratic,sgd,,0.01,0,120,$num,,$num,$num\$" "$work/s1/results.csv" ||
    fail "no final noisy_quadratic row with its validation and test losses"
run sone --problems mlp_mb --optimizers adam --lrs 0.1 --seeds 1 --steps 120 --data "$data" \
    --out "$work/sone" --progress lines --no-plots
grep '^mlp_mb,adam,,0.1,1,' "$work/s1/results.csv" >"$work/sone.expect"
tail -n +2 "$work/sone/results.csv" >"$work/sone.got"
[[ -s $work/sone.expect ]] && cmp -s "$work/sone.expect" "$work/sone.got" ||
    fail "a stochastic cell alone differs from its suite rows"
# the groups: full-batch is the default; stochastic names the six minibatch problems
"$nabla" bench --help >"$work/help.txt"
grep -q "full-batch (the" "$work/help.txt" || fail "--help does not list the groups"
run grp --problems stochastic --optimizers adam --lrs 0.01 --seeds 0 --steps 2 --log-every 1 \
    --data "$data" --out "$work/grp" --progress lines --no-plots
[[ $(cut -d, -f1 "$work/grp/results.csv" | tail -n +2 | sort -u | tr '\n' ' ') == \
    "char_gru cnn_mb logreg_mb lotka_volterra_mb mlp_mb noisy_quadratic " ]] ||
    fail "--problems stochastic ran: $(cut -d, -f1 "$work/grp/results.csv" | sort -u | tr '\n' ' ')"

# ---- --tune random:K: K trials per optimizer on the first seed, the chosen one on all -------
tsuite=(--problems mlp_mb,logreg --optimizers sgd,adam --tune random:4:7 --seeds 0,1,2 --steps 60
    --data "$data" --progress lines)
run t1 "${tsuite[@]}" --out "$work/t1"
run t2 "${tsuite[@]}" --out "$work/t2" --threads 2 --jobs 2 --no-plots
# killed in the first phase (after 5 trials) and in the second (after 2 re-runs)
for kill in 5 18; do
    NABLA_BENCH_KILL_AFTER=$kill "$nabla" bench "${tsuite[@]}" --out "$work/tk$kill" \
        >"$work/tk$kill.k.out" 2>&1
    rc=$?
    [[ $rc == 137 ]] || fail "the tuning run killed after $kill cells exited $rc, not 137"
    run tk$kill "${tsuite[@]}" --out "$work/tk$kill" --resume
done
for r in t1 t2 tk5 tk18; do
    [[ $(cat "$work/$r.rc") == 0 ]] || { fail "tuning run $r exited $(cat "$work/$r.rc")"; cat "$work/$r.err"; }
done
dt=$(digest_of "$work/t1.out")
echo "tuning digest: $dt; 2 threads x 2 jobs: $(digest_of "$work/t2.out"); killed after 5" \
    "and after 18 cells + resumed: $(digest_of "$work/tk5.out"), $(digest_of "$work/tk18.out")"
for r in t2 tk5 tk18; do
    [[ -n $dt && $(digest_of "$work/$r.out") == "$dt" ]] || fail "tuning run $r: another digest"
done
same_files "$work/t1" "$work/tk5" "tuning, killed in the trials + resumed"
same_files "$work/t1" "$work/tk18" "tuning, killed in the re-runs + resumed"
# 2 problems x 2 optimizers x (4 trials + 2 more seeds of the chosen one) = 24 cells
[[ $(find "$work/t1/cells" -name '*.csv' | wc -l) == 24 ]] || fail "the tuning run has not 24 cells"
# the chosen trial: the argmin of the final validation loss over the trials on seed 0 (the
# training loss for the full-batch logreg), run on seeds 1 and 2 as well
for po in mlp_mb,adam mlp_mb,sgd logreg,adam logreg,sgd; do
    col=9
    [[ $po == logreg,* ]] && col=7
    # (a trial whose loss went inf or nan has no such final row: its cell stopped there)
    want=$(awk -F, -v po="$po" -v c=$col '$1 "," $2 == po && $5 == 0 && $6 == 60 && $c ~ /^[0-9.e+-]+$/ {
        if (best == "" || $c + 0 < bv) { best = $3; bv = $c + 0 } } END { print best }' \
        "$work/t1/results.csv")
    reruns=$(awk -F, -v po="$po" '$1 "," $2 == po && $5 != 0 && $6 == 60 { print $3 }' \
        "$work/t1/results.csv" | sort -u | tr '\n' ' ')
    p=${po%,*} o=${po#*,}
    got=$(grep -A1 "^- $p, $o: " "$work/t1/summary.md" | head -n 1 | sed -n 's/.*: trial \([0-9]*\) .*/\1/p')
    echo "tuning $po: argmin over the trials $want, chosen $got, re-run on seeds 1 and 2: $reruns"
    [[ -n $want && $got == "$want" && $reruns == "$want " ]] ||
        fail "$po: chosen trial '$got', re-runs '$reruns'; the argmin is '$want'"
done
grep -q '"chosen_trial": [0-9]' "$work/t1/summary.json" || fail "summary.json has no chosen_trial"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$work/t1/summary.json" ||
    fail "the tuning summary.json is not valid JSON"
grep -q "^trial 3 lr " "$work/t1/run.cfg" || fail "run.cfg does not list the trials"

# ---- the plots --------------------------------------------------------------------------
declare -A target=([rosenbrock2]=0.001 [beale]=0.001 [logreg]=0.1)
for p in rosenbrock2 beale logreg; do
    for png in "$work/a/plots/$p.png" "$work/a/plots/${p}_lr.png"; do
        if [[ ! -s $png ]]; then
            fail "no plot $png"
            continue
        fi
        magic=$(head -c 16 "$png" | od -An -tx1 | tr -d ' \n')
        [[ $magic == 89504e470d0a1a0a0000000d49484452 ]] || fail "$png is not a PNG ($magic)"
    done
    gp=$work/a/plots/$p.gp
    curves=$(grep -c "using 1:2 with lines lw 2" "$gp")
    bands=$(grep -c "using 1:3:4 with filledcurves" "$gp")
    echo "plot $p.png: $(stat -c %s "$work/a/plots/$p.png") bytes, $curves curves, $bands bands"
    [[ $curves == 3 ]] || fail "$p.gp draws $curves curves, not one per optimizer (3)"
    [[ $bands == 3 ]] || fail "$p.gp draws $bands bands over the seeds, not one per optimizer (3)"
    grep -q "^set xrange \[0:200\]$" "$gp" || fail "$p.gp: the x axis does not end at step 200"
    grep -q "^     ${target[$p]} with lines .* title 'target ${target[$p]}'" "$gp" ||
        fail "$p.gp draws no line at the target loss ${target[$p]}"
    grep -q "^set yrange \[[0-9.e+-]*:[0-9.e+-]*\]$" "$gp" || fail "$p.gp sets no y range"
    lines=$(grep -c "with yerrorlines" "$work/a/plots/${p}_lr.gp")
    [[ $lines == 3 ]] || fail "${p}_lr.gp draws $lines lines, not one per optimizer (3)"
    grep -q "^set logscale xy$" "$work/a/plots/${p}_lr.gp" || fail "${p}_lr.gp: not log-log"
done

# ---- bad options: a message, exit 2, no result files -------------------------------------
bad() { # bad <expected message> <options...>
    local want=$1
    shift
    rm -rf "$work/bad"
    "$nabla" bench "$@" >"$work/bad.out" 2>"$work/bad.err"
    local rc=$?
    [[ $rc == 2 ]] || fail "bench $* exited $rc, not 2"
    grep -q -- "$want" "$work/bad.err" || fail "bench $*: no '$want' in: $(cat "$work/bad.err")"
    [[ -e $work/bad/results.csv || -e $work/bad/summary.json ]] && fail "bench $* left results"
    echo "bad options ($*): $(head -n 1 "$work/bad.err")"
}
bad "unknown optimizer 'adamx'" --optimizers adam,adamx --out "$work/bad"
bad "unknown problem 'rosenbrock3'" --problems rosenbrock3 --out "$work/bad"
bad "--tune draws the learning rates" --tune random:3 --lrs 0.1 --out "$work/bad"
bad "--tune wants random:K" --tune grid:3 --out "$work/bad"
bad "K from 1 to 64" --tune random:0 --out "$work/bad"
bad "K from 1 to 64" --tune random:3:x --out "$work/bad"
bad "--steps wants an integer" --steps -5 --out "$work/bad"
bad "--steps wants an integer" --steps 0 --out "$work/bad"
bad "--lrs" --lrs 0.1:0.01:x --out "$work/bad"
bad "--lrs wants a number" --lrs -1 --out "$work/bad"
bad "unknown option '--frobnicate'" --frobnicate --out "$work/bad"
bad "wants LO < HI with N >= 2" --lrs 0.1:0.1:3 --out "$work/bad"
bad "are the same to 6 significant digits" --lrs 0.001,0.0010000001 --out "$work/bad"
bad "sgd is not among --optimizers" --optimizers adam --lr sgd=0.1 --out "$work/bad"
bad "logs more than 10^6 rows" --steps 100000000 --log-every 1 --out "$work/bad"
bad "cannot create the output directory" --data "$data" --out "$work/bad/x/$(printf 'y%.0s' {1..300})/z"
[[ -e $work/bad ]] && fail "a failed mkdir -p left directories behind"
bad "cannot create the output directory" "${suite[@]}" --out /dev/null/bench
bad "cannot be set up" --problems logreg --data "$work/no-such-dir" --out "$work/bad"
[[ -e $work/bad ]] && fail "a missing data directory still created --out"
bad "holds no run to continue" "${suite[@]}" --out "$work/bad" --resume
bad "already holds a run" "${suite[@]}" --out "$work/a"
bad "was made with other options" "${suite[@]}" --steps 100 --out "$work/a" --resume
cmp -s "$work/a/results.csv" "$work/b/results.csv" || fail "a refused run changed results.csv"

if [[ $fails -gt 0 ]]; then
    echo "test_bench: $fails failure(s)"
    exit 1
fi
echo "test_bench: all checks passed"
