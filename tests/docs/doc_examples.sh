#!/usr/bin/env bash
# doc_examples.sh -- every code block the documentation calls complete is compiled and run.
#
#   doc_examples.sh headers <include dir> <library dir> <work dir>
#       Each block between "[example NAME]" and "[end of example]" in a comment of a public
#       header is written to NAME (the comment's " *     " margin removed), compiled with
#       -std=c17 -Wall -Wextra -Wpedantic -Werror against <include dir>, linked with
#       libnabla.so from <library dir> and -lm, and run: it must exit 0. A header comment
#       holding "int main(" outside such a block fails the test (an untested program).
#
#   doc_examples.sh readme <source dir> <work dir>
#       The README's section "Use nabla in your own program", verbatim: the source tree is
#       copied to <work dir>/nabla (a clean clone: no build directories), HOME is set to
#       <work dir>/home, and the blocks marked in README.md run in order --
#         <!-- test: file NAME -->  the next fenced block is written to <work>/project/NAME
#         <!-- test: sh checkout --> the next fenced block runs in bash (-e) in the copy
#         <!-- test: sh project -->  the next fenced block runs in bash (-e) in <work>/project
#       A sh block's lines ending in "# prints: TEXT" must print exactly TEXT. A ```c block
#       holding "int main(" that is not marked "test: file" fails the test.
#
# Environment: CC (default cc); NABLA_DOC_CFLAGS, extra compile and link flags for the
# header examples (the sanitizers, when the library was built with them).
set -euo pipefail

fail() {
    echo "doc_examples: FAILED: $*" >&2
    exit 1
}
cc=${CC:-cc}

# extract_header_examples <header> <out dir>: writes each [example NAME] block to
# <out dir>/NAME and prints the names.
extract_header_examples() {
    awk -v out="$2" '
        /^ \* \[example [^]]+\]$/ {
            name = $0; sub(/^ \* \[example /, "", name); sub(/\]$/, "", name)
            if (inside) { print "nested example in " FILENAME > "/dev/stderr"; exit 3 }
            inside = 1; file = out "/" name; printf "" > file; print name; next
        }
        /^ \* \[end of example\]$/ { inside = 0; close(file); next }
        inside {
            line = $0
            if (line ~ /^ \*$/) line = ""
            else if (line ~ /^ \*     /) line = substr(line, 8)
            else { print "bad margin in " FILENAME ": " $0 > "/dev/stderr"; exit 3 }
            print line >> file
        }
        END { if (inside) { print "unterminated example in " FILENAME > "/dev/stderr"; exit 3 } }
    ' "$1"
}

mode=${1:-}
case "$mode" in
headers)
    [[ $# -eq 4 ]] || fail "usage: $0 headers <include dir> <library dir> <work dir>"
    inc=$2 libdir=$3 work=$4
    rm -rf "$work" && mkdir -p "$work"
    n=0
    for h in "$inc"/nabla/*.h; do
        # A program in a comment outside a marked example is one nobody compiles.
        outside=$(awk '/^ \* \[example /{i=1} /^ \* \[end of example\]/{i=0}
                       !i && /int main\(/ {print FILENAME ":" FNR ": " $0}' "$h")
        [[ -z "$outside" ]] || fail "a program outside [example] markers: $outside"
        names=$(extract_header_examples "$h" "$work") || fail "cannot extract from $h"
        for name in $names; do
            src=$work/$name
            exe=$work/${name%.c}
            echo "== $(basename "$h"): $name"
            # shellcheck disable=SC2086
            "$cc" -std=c17 -Wall -Wextra -Wpedantic -Werror ${NABLA_DOC_CFLAGS:-} -I"$inc" "$src" \
                -o "$exe" -L"$libdir" -Wl,-rpath,"$libdir" -lnabla -lm ||
                fail "$name from $h does not compile"
            "$exe" >"$exe.out" 2>&1 || { cat "$exe.out"; fail "$name from $h exited $?"; }
            cat "$exe.out"
            # Lines the example shows as its output ("//   text" right after the call that
            # prints) must be what it prints.
            while IFS= read -r want; do
                grep -qxF -- "$want" "$exe.out" || fail "$name does not print '$want'"
            done < <(sed -n 's|^ *//   \(.*\)$|\1|p' "$src")
            n=$((n + 1))
        done
    done
    [[ $n -gt 0 ]] || fail "no [example] blocks found under $inc/nabla"
    echo "doc_examples headers: $n example(s) compiled and run"
    ;;
readme)
    [[ $# -eq 3 ]] || fail "usage: $0 readme <source dir> <work dir>"
    src=$(cd "$2" && pwd) work=$3
    readme=$src/README.md
    rm -rf "$work" && mkdir -p "$work/home" "$work/project" "$work/blocks"
    work=$(cd "$work" && pwd)

    # Every complete C program in the README is marked for this test.
    unmarked=$(awk '/^<!-- test: file /{m=1; next} /^```c$/{inb=1; mk=m; m=0; s=""; start=FNR; next}
                    inb && /^```$/{ if (s ~ /int main\(/ && !mk) print "README.md:" start; inb=0; next}
                    inb {s = s $0 "\n"; next} {if ($0 !~ /^$/) m=0}' "$readme")
    [[ -z "$unmarked" ]] || fail "a complete C program in the README is not tested: $unmarked"

    # The blocks, in order: kind, name, text.
    awk -v out="$work/blocks" '
        /^<!-- test: (file|sh) [^ ]+ -->$/ { split($0, f, " "); kind = f[3]; name = f[4]; want = 1; next }
        want && /^```/ { inb = 1; want = 0; n++; file = sprintf("%s/%02d.%s.%s", out, n, kind, name);
                         printf "" > file; next }
        inb && /^```$/ { inb = 0; close(file); next }
        inb { print >> file; next }
        want && !/^$/ { print "README.md:" FNR ": a test marker not followed by a code block" > "/dev/stderr"; exit 3 }
    ' "$readme" || fail "README markers"
    blocks=("$work"/blocks/*)
    [[ ${#blocks[@]} -ge 4 ]] || fail "expected the own-program section's blocks, found ${#blocks[@]}"

    # A clean clone: the sources without build directories (build*, or any directory
    # holding a CMakeCache.txt, such as this test's own build tree when it is not named
    # build*: else the copy would copy itself) or VCS data.
    mkdir -p "$work/nabla"
    tar -C "$src" --exclude='./build*' --exclude-tag-all=CMakeCache.txt --exclude='./.git' \
        --exclude='./.cache' -cf - . |
        tar -C "$work/nabla" -xf -

    export HOME=$work/home
    unset PKG_CONFIG_PATH CMAKE_PREFIX_PATH LD_LIBRARY_PATH
    for b in "${blocks[@]}"; do
        base=$(basename "$b")
        kind=$(cut -d. -f2 <<<"$base")
        name=${base#*.*.}
        case "$kind" in
        file) cp "$b" "$work/project/$name" && echo "== README file $name" ;;
        sh)
            case "$name" in
            checkout) dir=$work/nabla ;;
            project) dir=$work/project ;;
            *) fail "README: unknown sh block place '$name'" ;;
            esac
            echo "== README sh block ($name):"
            cat "$b"
            # The block runs as written, in one shell; a line ending in '# prints: TEXT'
            # must print exactly TEXT.
            script=$work/blocks/$base.run.sh
            {
                echo 'set -eo pipefail'
                while IFS= read -r line || [[ -n "$line" ]]; do
                    if [[ "$line" == *"# prints: "* ]]; then
                        want=${line##*# prints: }
                        cmd=${line%%# prints: *}
                        printf '__got=$(%s)\n' "$cmd"
                        printf 'printf "%%s\\n" "$__got"\n'
                        printf 'if [[ "$__got" != %q ]]; then echo "README: %s printed that, the README says %s" >&2; exit 1; fi\n' \
                            "$want" "${cmd//\"/}" "${want//\"/}"
                    else
                        printf '%s\n' "$line"
                    fi
                done <"$b"
            } >"$script"
            (cd "$dir" && bash "$script") >"$script.log" 2>&1 ||
                { tail -40 "$script.log"; fail "README block $base failed"; }
            tail -5 "$script.log"
            ;;
        *) fail "README: unknown block kind '$kind'" ;;
        esac
    done
    # The README's C files are clean under strict warnings too, and the static build holds
    # no reference to libnabla.so.
    for c in "$work"/project/*.c; do
        "$cc" -std=c17 -Wall -Wextra -Wpedantic -Werror -fsyntax-only \
            -I"$HOME/.local/include" "$c" || fail "README's $(basename "$c") warns"
    done
    if [[ -x "$work/project/fit-static" ]] && command -v ldd >/dev/null; then
        deps=$(ldd "$work/project/fit-static")
        if grep -q libnabla <<<"$deps"; then fail "fit-static loads libnabla.so: $deps"; fi
    fi
    rm -rf "$work"
    echo "doc_examples readme: ${#blocks[@]} blocks ran verbatim"
    ;;
*) fail "usage: $0 headers|readme ..." ;;
esac
