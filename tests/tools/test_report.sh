#!/usr/bin/env bash
# test_report.sh -- nabla bench's report.html (tools/bench.c, bn_report), in a real browser:
#   - self-contained: no script, no <img>, no link or URL but SVG's namespace;
#   - well-formed (xmllint reads it as XML: every element closed, every entity defined);
#   - one SVG per plot: the performance profile, then per problem its loss curves, its
#     accuracy curves (classifiers) and its final loss against the learning rate, each
#     with one curve (or set of points) per optimizer;
#   - the same bytes when the run is made again, and after --resume;
#   - headless Chromium (Debian's chromium; scripts/deps.sh installs it) loads it: the DOM
#     it builds holds every SVG, and its screenshot is a page with content (far larger than
#     a blank page's). NABLA_REPORT_SHOT=<file.png> keeps the screenshot to look at.
# Usage: test_report.sh <nabla> <source dir>
set -uo pipefail
nabla=$1
src=$2
data=$src/data
work=$(mktemp -d "${TMPDIR:-/tmp}/nabla-report-test.XXXXXX")
trap '[[ ${NABLA_TEST_KEEP:-0} == 1 ]] || rm -rf "$work"' EXIT
fails=0
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}

run=(--problems beale,logreg_mb,noisy_quadratic --optimizers sgd,adam --tune random:3 --seeds 0,1
    --steps 60 --data "$data" --progress lines --no-plots)
"$nabla" bench "${run[@]}" --out "$work/r" >"$work/r.out" 2>"$work/r.err" ||
    fail "nabla bench exited $?: $(tail -n 3 "$work/r.err")"
html=$work/r/report.html
[[ -s $html ]] || { echo "FAIL: no report.html"; exit 1; }
echo "report.html: $(stat -c %s "$html") bytes"

# ---- self-contained and well-formed -------------------------------------------------------
grep -qi "<script" "$html" && fail "report.html has a script"
grep -qi "<img" "$html" && fail "report.html has an <img> (plots are inline SVG)"
refs=$(grep -Eo '(src|href)="[^"]*"' "$html" | sort -u | tr '\n' ' ')
[[ -z $refs ]] || fail "report.html refers to other files or places: $refs"
urls=$(grep -Eo 'https?://[^" ]*' "$html" | sort -u | tr '\n' ' ')
[[ $urls == "http://www.w3.org/2000/svg " ]] || fail "report.html has URLs: $urls"
if command -v xmllint >/dev/null 2>&1; then
    xmllint --noout "$html" 2>"$work/xmllint.err" ||
        fail "report.html is not well-formed: $(head -n 3 "$work/xmllint.err")"
else
    fail "xmllint not found (Debian: libxml2-utils; scripts/deps.sh installs it)"
fi

# ---- the plots ------------------------------------------------------------------------------
# profile 1 + beale (loss, lr) 2 + logreg_mb (loss, accuracy, lr) 3 + noisy_quadratic 2
svgs=$(grep -c "<svg " "$html")
[[ $svgs == 8 ]] || fail "report.html has $svgs SVG plots, not 8"
for title in "Performance profile over" "Beale: loss" "training loss (train_eval)" \
    "test accuracy" "final loss (step 60) against the learning rate"; do
    grep -q "<title>[^<]*$title" "$html" || fail "no plot titled '... $title ...'"
done
# every curve plot draws both optimizers: a polyline each (and a band each)
curves=$(grep -c '<polyline fill="none" stroke="#1f77b4"' "$html")
curves_adam=$(grep -c '<polyline fill="none" stroke="#d62728"' "$html")
[[ $curves == 5 && $curves_adam == 5 ]] ||
    fail "sgd and adam draw $curves and $curves_adam curves, not 5 each (4 curve plots + profile)"
bands=$(grep -c '<polygon fill="#d62728" fill-opacity' "$html")
[[ $bands == 4 ]] || fail "adam has $bands seed bands, not 4"
grep -q "<th>chosen trial (lr)</th>" "$html" || fail "the summary table has no chosen-trial column"
rows=$(grep -c '^<tr><td class="l">' "$html")
[[ $rows == 6 ]] || fail "the summary table has $rows rows, not 3 problems x 2 optimizers"

# ---- the same bytes ----------------------------------------------------------------------------
"$nabla" bench "${run[@]}" --out "$work/r2" >/dev/null 2>&1 || fail "the second run failed"
cmp -s "$html" "$work/r2/report.html" || fail "a second run wrote another report.html"
rm -f "$work/r2/report.html" "$work/r2/results.csv"
"$nabla" bench "${run[@]}" --out "$work/r2" --resume >/dev/null 2>&1 || fail "--resume failed"
cmp -s "$html" "$work/r2/report.html" || fail "--resume wrote another report.html"

# ---- in a browser ------------------------------------------------------------------------------
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $browser ]]; then
    if ((fails == 0)); then
        echo "SKIP: chromium not found (Debian: chromium; scripts/deps.sh installs it)"
        exit 77
    fi
    echo "test_report: $fails failure(s)"
    exit 1
fi
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile")
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$html" >"$work/dom.html" 2>"$work/chromium.err" ||
    fail "chromium --dump-dom failed: $(tail -n 2 "$work/chromium.err")"
dom_svgs=$(grep -o "<svg " "$work/dom.html" | wc -l)
echo "chromium: the DOM holds $dom_svgs SVG plots"
[[ $dom_svgs == 8 ]] || fail "the browser's DOM holds $dom_svgs SVG plots, not 8"
grep -q "<h2>Performance profile</h2>" "$work/dom.html" || fail "the DOM has no profile heading"
grep -q "<img" "$work/dom.html" && fail "the DOM has an image to load"
shot=$work/shot.png
timeout 120 "$browser" "${flags[@]}" --window-size=1100,3200 --screenshot="$shot" "file://$html" \
    >/dev/null 2>>"$work/chromium.err" || fail "chromium --screenshot failed"
if [[ -s $shot ]]; then
    magic=$(head -c 8 "$shot" | od -An -tx1 | tr -d ' \n')
    size=$(stat -c %s "$shot")
    echo "screenshot: $size bytes (a blank page of that size is ~16 KB)"
    [[ $magic == 89504e470d0a1a0a ]] || fail "the screenshot is not a PNG"
    ((size > 80000)) || fail "the screenshot ($size bytes) looks blank"
    [[ -n ${NABLA_REPORT_SHOT:-} ]] && cp "$shot" "$NABLA_REPORT_SHOT"
else
    fail "no screenshot"
fi

if ((fails > 0)); then
    echo "test_report: $fails failure(s)"
    exit 1
fi
echo "test_report: OK"
