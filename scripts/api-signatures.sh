#!/bin/sh
# SPDX-License-Identifier: MIT
# api-signatures.sh [--check] [SOURCE_DIR] - the "Every signature" section of
# docs/api.md, from the public headers themselves: for each numbered section
# of include/kvevict.h and include/kvevict_eval.h, every type it defines
# (enums, structs with their fields and comments, function types) and every
# KVE_API declaration, as the header writes them. Without --check it rewrites
# the part of docs/api.md between the markers; with --check it exits 1 (and
# shows the difference) when the page is not what the headers give, which is
# what test_api_signatures runs, so the page cannot drift from the headers.
set -eu
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
src=${1:-$(dirname "$0")/..}
page=$src/docs/api.md
begin='<!-- signatures: begin (scripts/api-signatures.sh writes this part from the headers) -->'
end='<!-- signatures: end -->'
grep -qxF "$begin" "$page" && grep -qxF "$end" "$page" ||
    { echo "api-signatures: $page has no signature markers" >&2; exit 1; }

# One header: its sections, each a heading and one C block of its types and
# declarations. A type is a typedef up to the line ending its name and ';'
# (an opaque one is one line); a declaration runs from KVE_API to its ';'.
section() { # HEADER
    awk -v hdr="$(basename "$1")" '
    function flush() { sub(/\n\n$/, "\n", body); if (body != "") { printf "### %s: %s\n\n```c\n%s```\n\n", hdr, title, body } body = "" }
    /^\/\* =+$/ { banner = 1; next }
    banner == 1 && /^ \* [0-9]+\. / { flush(); title = substr($0, 4); banner = 0; next }
    { banner = 0 }
    intype { body = body $0 "\n"; if ($0 ~ /^}[^;]*;/) { intype = 0; body = body "\n" } next }
    indecl { body = body $0 "\n"; if ($0 ~ /;/) { indecl = 0 } next }
    /^typedef / {
        body = body $0 "\n"
        if ($0 ~ /;/ && $0 !~ /\{/) { next }
        if ($0 ~ /\{/) intype = 1; else indecl = 1
        next
    }
    /^KVE_API / { line = $0; sub(/^KVE_API /, "", line); body = body line "\n"; if ($0 !~ /;/) indecl = 1; next }
    END { flush() }' "$1"
}
gen() {
    echo "$begin"
    echo
    for h in "$src/include/kvevict.h" "$src/include/kvevict_eval.h"; do
        section "$h"
    done
    echo "$end"
}
tmp=$(mktemp "${TMPDIR:-/tmp}/kve-api.XXXXXX")
trap 'rm -f "$tmp" "$tmp.page"' EXIT
gen >"$tmp"
# the page with the generated part replaced
awk -v b="$begin" -v e="$end" -v gen="$tmp" '
    $0 == b { while ((getline l < gen) > 0) print l; skip = 1; next }
    $0 == e { skip = 0; next }
    !skip { print }' "$page" >"$tmp.page"
if [ $check = 1 ]; then
    if ! cmp -s "$tmp.page" "$page"; then
        echo "api-signatures: docs/api.md's signatures are not the headers' (run scripts/api-signatures.sh):" >&2
        diff "$page" "$tmp.page" | head -20 >&2
        exit 1
    fi
    n=$(grep -c '^KVE_API ' "$src/include/kvevict.h" "$src/include/kvevict_eval.h" | awk -F: '{ s += $2 } END { print s }')
    echo "api-signatures: docs/api.md lists the headers' $n declarations and their types, as written"
    exit 0
fi
cp "$tmp.page" "$page"
