#!/bin/sh
# SPDX-License-Identifier: MIT
# test_doc_facts.sh KVEVICT SOURCE_DIR - facts the prose states about the
# build and the tools, held to the tree (issue 29's drift, items 1, 7 and 9):
#   - every `cc` command of README.md's sh blocks builds with
#     -Werror=incompatible-pointer-types, as its prose says to;
#   - README's first pkg-config block links with the run path
#     (-Wl,-rpath,...) in every command: the commands that work for any
#     prefix come first;
#   - README says `make test` runs a TSan pass too (the Makefile's test
#     target does: test-tsan);
#   - docs/results.md names the format option as `kvevict bench --help`
#     does (--md), and no option bench does not take;
#   - every program tools/CMakeLists.txt installs is named as installed by
#     the Makefile's header and README's Install, and docs/cli.md does not
#     call it "not installed";
#   - every test docs/robustness.md names (`test_...`) exists: a CTest name,
#     a C test function or a Python test method.
set -u
K=${1:?usage: test_doc_facts.sh PATH/TO/kvevict SOURCE_DIR}
SRC=${2:?usage: test_doc_facts.sh PATH/TO/kvevict SOURCE_DIR}
. "$(dirname "$0")/check.sh"
scratch kvevict-docfacts

# The commands of FILE's sh blocks, one a line, continuations joined.
commands() {
    awk '/^```sh$/ { b = 1; next } b && /^```$/ { b = 0; print "--block--"; next }
         b { line = line $0; if (line ~ /\\$/) { sub(/\\$/, "", line); next }
             print line; line = "" }' "$1"
}
commands "$SRC/README.md" >"$D/readme.cmds"

# 1. cc lines carry the flag.
n=0
while IFS= read -r c; do
    case $c in
    cc\ *)
        n=$((n + 1))
        case $c in
        *-Werror=incompatible-pointer-types*) ok ;;
        *) fail "README.md: a cc command without -Werror=incompatible-pointer-types: $c" ;;
        esac
        ;;
    esac
done <"$D/readme.cmds"
check "README.md has cc commands to check" [ "$n" -ge 4 ]

# 2. The first pkg-config block: every cc command with the run path.
awk '/^\*\*pkg-config\*\*/ { p = 1 } p' "$SRC/README.md" >"$D/pc.md"
commands "$D/pc.md" | awk '/^--block--$/ { exit } { print }' >"$D/pc.cmds"
check "README.md's first pkg-config block has its two commands" \
    [ "$(grep -c '^cc ' "$D/pc.cmds")" -eq 2 ]
if grep '^cc ' "$D/pc.cmds" | grep -v -q -- '-Wl,-rpath,'; then
    fail "README.md's first pkg-config block has a command without the run path: $(cat "$D/pc.cmds")"
else
    ok
fi

# 3. make test's TSan pass, in the README and in the Makefile.
check "the Makefile's test target runs test-tsan" grep -q '^test:.* test-tsan' "$SRC/Makefile"
awk '/^make test/ { t = 1 } t && /^```$/ { exit } t' "$SRC/README.md" >"$D/maketest"
check "README.md says make test runs a TSan pass: $(cat "$D/maketest")" grep -q TSan "$D/maketest"

# 4. results.md's bench options are bench's.
"$K" bench --help >"$D/bench.help" 2>&1
grep -o '`kvevict bench [^`]*`' "$SRC/docs/results.md" | tr -d '`' >"$D/results.cmds"
check "docs/results.md names its kvevict bench command" [ -s "$D/results.cmds" ]
check "docs/results.md names --md" grep -q -- '--md' "$D/results.cmds"
check "docs/results.md does not say --markdown" sh -c "! grep -q -- '--markdown' '$SRC/docs/results.md'"
for opt in $(grep -o -- '--[a-z][a-z-]*' "$D/results.cmds" | sort -u); do
    if grep -q -- "$opt\\b" "$D/bench.help"; then ok; else
        fail "docs/results.md: kvevict bench $opt, which bench --help does not list"
    fi
done

# 5. Installed programs, as the docs say.
progs=$(sed -n 's/^ *install(TARGETS \([a-z-]*\) RUNTIME.*/\1/p' "$SRC/tools/CMakeLists.txt")
check "tools/CMakeLists.txt installs kvevict and kvevict-convert" \
    [ "$(echo $progs)" = "kvevict kvevict-convert" ]
sed -n '1,/^[^#]/p' "$SRC/Makefile" >"$D/makefile.head"
awk '/^## Install$/ { i = 1; next } i && /^## / { exit } i' "$SRC/README.md" >"$D/install.md"
for p in $progs; do
    check "the Makefile's header names $p" grep -q "$p\\b" "$D/makefile.head"
    check "README.md's Install names $p in PREFIX/bin" grep -q "\`$p\`" "$D/install.md"
    # "P (built ..., not installed)" or "P ... is not installed" in cli.md
    if tr '\n' ' ' <"$SRC/docs/cli.md" | grep -q "\`$p\` ([^)]*not installed"; then
        fail "docs/cli.md says $p is not installed; tools/CMakeLists.txt installs it"
    else
        ok
    fi
done
check "the Makefile's header says which programs cmake --install installs" \
    grep -q 'cmake --install' "$D/makefile.head"

# 6. The tests robustness.md names exist.
grep -o '`test_[a-z0-9_]*`' "$SRC/docs/robustness.md" | tr -d '`' | sort -u >"$D/named"
for t in $(cat "$D/named"); do
    if grep -Eq "kve_add_test\($t[ )]|add_test\(NAME $t " "$SRC/tests/CMakeLists.txt" ||
       grep -q "^static void $t(" "$SRC"/tests/*.c ||
       grep -q "^ *def $t(" "$SRC"/tests/*.py; then
        ok
    else
        fail "docs/robustness.md names $t, which no test registers or defines"
    fi
done

[ "$fails" -eq 0 ] || exit 1
echo "test_doc_facts: $checks checks: README's build lines, make test's TSan, results.md's --md, installed programs, robustness.md's test names"
