#!/usr/bin/env bash
# run_fuzz.sh -- run the libFuzzer targets for a bounded time (tests/fuzz/README.md).
#
#   tests/fuzz/run_fuzz.sh <build dir> [-runs N | -max_total_time S] [-targets a,b,...]
#                          [-- libFuzzer args...]
#
# Default: -runs 100000 (inputs per target), every target (safetensors, csv, programs).
# Each target starts from its seed corpus (tests/fuzz/corpus_<target>/, plus
# tests/io/oracle/hostile/ for safetensors), copied to a scratch directory, so the source
# tree is never written to. Prints each target's final
# libFuzzer line ("#N DONE cov: X ft: Y ...": executions, edges covered, features) and its
# executions per second. Exits 1 if a target crashes, hangs (> 10 s on one input), leaks,
# trips a sanitizer or breaks one of the rules in the targets' comments, or stops short of
# the runs asked for; the reproducer is copied to <build dir>/fuzz-artifacts/ and the
# command to replay it is printed. NABLA_FUZZ_KEEP=1 keeps the scratch directory (with the
# grown corpora and the logs); NABLA_FUZZ_TMPDIR chooses where it goes (default /dev/shm
# when writable, else $TMPDIR or /tmp).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src_root=$(cd "$here/../.." && pwd)

usage() {
    echo "usage: $0 <build dir> [-runs N | -max_total_time S] [-targets a,b,...]" \
        "[-- libFuzzer args...]" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
build=$1
shift
runs=100000
max_time=""
targets="safetensors csv programs"
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
    -runs | --runs) [[ $# -ge 2 ]] || usage; runs=$2; shift 2 ;;
    -runs=* | --runs=*) runs=${1#*=}; shift ;;
    -max_total_time | --max_total_time) [[ $# -ge 2 ]] || usage; max_time=$2; runs=""; shift 2 ;;
    -max_total_time=* | --max_total_time=*) max_time=${1#*=}; runs=""; shift ;;
    -targets | --targets) [[ $# -ge 2 ]] || usage; targets=${2//,/ }; shift 2 ;;
    -targets=* | --targets=*) targets=${1#*=}; targets=${targets//,/ }; shift ;;
    --) shift; extra=("$@"); break ;;
    *) usage ;;
    esac
done
[[ -z $runs || $runs =~ ^[0-9]+$ ]] || usage
[[ -z $max_time || $max_time =~ ^[0-9]+$ ]] || usage

find_bin() {
    local b
    for b in "$build/tests/fuzz/$1" "$build/$1"; do
        if [[ -x $b ]]; then
            echo "$b"
            return 0
        fi
    done
    find "$build" -type f -name "$1" -perm -u+x 2>/dev/null | head -n 1
}

# The scratch directory holds the corpora and the files the targets write for every input
# (the safetensors target saves with nb_save, which fsyncs): on tmpfs an fsync costs
# nothing, on a disk it makes the run ~20 times slower.
if [[ -n ${NABLA_FUZZ_TMPDIR:-} ]]; then
    base=$NABLA_FUZZ_TMPDIR
elif [[ -d /dev/shm && -w /dev/shm ]]; then
    base=/dev/shm
else
    base=${TMPDIR:-/tmp}
fi
work=$(mktemp -d "$base/nabla-fuzz.XXXXXX") || exit 1
cleanup() {
    if [[ ${NABLA_FUZZ_KEEP:-0} != 0 ]]; then
        echo "run_fuzz.sh: scratch directory kept: $work"
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

# ASan: abort on the first report, leak detection on (the targets check the context's
# own counters too), no stack-use-after-return slowdown. UBSan: a report is fatal.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
for target in $targets; do
    case $target in
    safetensors | csv | programs) ;;
    *) echo "run_fuzz.sh: unknown target '$target' (safetensors, csv, programs)" >&2; exit 2 ;;
    esac
    bin=$(find_bin "fuzz_$target")
    if [[ -z $bin ]]; then
        echo "run_fuzz.sh: fuzz_$target not found under $build (configure with clang and" \
            "-DNABLA_BUILD_FUZZ=ON, then build it)" >&2
        status=1
        continue
    fi
    corpus=$work/corpus_$target
    art=$work/artifacts_$target
    tmp=$work/tmp_$target
    mkdir -p "$corpus" "$art" "$tmp"
    cp "$here/corpus_$target"/* "$corpus"/ 2>/dev/null
    if [[ $target == safetensors && -d $src_root/tests/io/oracle/hostile ]]; then
        cp "$src_root"/tests/io/oracle/hostile/*.safetensors "$corpus"/ 2>/dev/null
    fi
    nseeds=$(find "$corpus" -type f | wc -l)
    args=(-artifact_prefix="$art/" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024
        -print_final_stats=1)
    if [[ $target == programs ]]; then
        # a program is a few hundred bytes at most (the decoder stops at 20 ops); no
        # dictionary: every byte value means something
        args+=(-max_len=512)
    else
        args+=(-dict="$here/$target.dict" -max_len=65536)
    fi
    if [[ -n $runs ]]; then
        args+=(-runs="$runs")
    fi
    if [[ -n $max_time ]]; then
        args+=(-max_total_time="$max_time")
    fi
    log=$work/fuzz_$target.log
    echo "== fuzz_$target: $nseeds seeds, ${runs:+$runs runs}${max_time:+$max_time s}"
    start=$(date +%s.%N)
    TMPDIR=$tmp "$bin" "${args[@]}" "${extra[@]}" "$corpus" >"$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    grep -E '^INFO: Seed:|INITED' "$log" | sed 's/^/   /'
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)
    execs=$(grep -E '^stat::number_of_executed_units:' "$log" | awk '{ print $2 }')
    rate=$(grep -E '^stat::average_exec_per_sec:' "$log" | awk '{ print $2 }')
    if [[ $rc -ne 0 || -z $done_line ]]; then
        echo "   FAILED (exit $rc) after ${secs}s; the end of the log:"
        tail -n 60 "$log" | sed 's/^/   | /'
        keep=$build/fuzz-artifacts
        mkdir -p "$keep"
        for a in "$art"/*; do
            [[ -e $a ]] || continue
            cp "$a" "$keep/fuzz_${target}_$(basename "$a")"
            echo "   reproducer: $keep/fuzz_${target}_$(basename "$a")"
            echo "   replay:     NABLA_FUZZ_DEBUG=1 $bin $keep/fuzz_${target}_$(basename "$a")"
            if [[ $target == programs ]]; then
                drv=$(find_bin fuzz_programs_driver)
                echo "   minimize:   ${drv:-fuzz_programs_driver} --minimize" \
                    "$keep/fuzz_${target}_$(basename "$a")"
            fi
        done
        cp "$log" "$keep/fuzz_$target.log"
        status=1
        continue
    fi
    echo "   $done_line"
    echo "   executions: ${execs:-?} in ${secs}s (${rate:-?} exec/s)"
    if [[ -n $runs && -n $execs && $execs -lt $runs ]]; then
        echo "   FAILED: $execs executions, fewer than the $runs asked for"
        status=1
    fi
done
exit $status
