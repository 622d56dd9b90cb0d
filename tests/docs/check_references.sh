#!/usr/bin/env bash
# check_references.sh -- what a user reads stands on its own: no reference to documents
# outside the repository (the developers' design notes, issue numbers, ../shared), and
# every repository path or relative link it names exists.
#
#   check_references.sh <source dir>
#
# Read by users: README.md, docs/*.md, benchmarks/README.md, data/README.md,
# tests/fuzz/README.md, the public headers, examples/*.c and the `nabla` tool's sources
# (its --help texts).
set -euo pipefail
shopt -s nullglob
cd "$1"

files=(README.md docs/*.md benchmarks/README.md data/README.md tests/fuzz/README.md
    include/nabla/*.h examples/*.c tools/*.c)
bad=0
report() {
    echo "check_references: $*" >&2
    bad=1
}

# 1. Documents a user does not have, and the tracker's numbers.
while IFS= read -r hit; do
    report "$hit: refers to something outside the repository"
done < <(grep -nHiE 'DESIGN\.md|STYLE\.md|DEVELOPERS\.md|\.\./shared|\bissues? #?[0-9]+\b|seed failure [0-9]' \
    "${files[@]}" || true)

# 2. Repository paths named in text: `docs/x.md`, tests/..., src/ad/op_*.c (a glob must
# match something). Only where the path starts a word (build/tools/nabla is a build
# output, not a repository path).
while IFS= read -r hit; do
    where=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    path=${rest#*:}
    path=${path#[ \`(\[\"\']}
    path=${path%.} # a sentence's full stop
    if [[ "$path" == *"*"* ]]; then
        compgen -G "$path" >/dev/null || report "$where:$line: names '$path', which matches nothing"
    else
        [[ -e "$path" ]] || report "$where:$line: names '$path', which does not exist"
    fi
done < <(grep -noHE "(^|[ \`(\[\"'])(docs|tests|tools|examples|benchmarks|data|include|src|scripts|cmake)/[A-Za-z0-9_./*-]*[A-Za-z0-9_*]" \
    "${files[@]}" | sed -E 's/^([^:]*):([0-9]+):/\1:\2:/' || true)

# 3. Relative links and images in the Markdown files.
for md in README.md docs/*.md benchmarks/README.md data/README.md tests/fuzz/README.md; do
    dir=$(dirname "$md")
    while IFS= read -r hit; do
        line=${hit%%:*}
        target=${hit#*:}
        target=${target#*](}
        target=${target%)}
        target=${target%%#*}
        [[ -z "$target" || "$target" =~ ^[a-z]+: ]] && continue
        [[ -e "$dir/$target" ]] || report "$md:$line: links to '$target', which does not exist"
    done < <(grep -noE '\]\([^)]+\)' "$md" || true)
done

if [[ $bad -ne 0 ]]; then
    exit 1
fi
echo "check_references: ${#files[@]} files, every reference resolves"
