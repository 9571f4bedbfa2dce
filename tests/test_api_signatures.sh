#!/bin/sh
# SPDX-License-Identifier: MIT
# test_api_signatures.sh CC SOURCE_DIR BUILD_INCLUDE - docs/api.md's "Every
# signature" is what the headers declare (scripts/api-signatures.sh --check),
# and a swapped argument order of the call a newcomer guessed wrong,
# kve_policy_new_ex(spec, options, rng, out), does not build with the flag
# api.md and the README give (-Werror=incompatible-pointer-types), while the
# right order builds with it.
set -u
CC=${1:?usage: test_api_signatures.sh CC SOURCE_DIR BUILD_INCLUDE}
SRC=${2:?}
INC=${3:?}
. "$(dirname "$0")/check.sh"
scratch kvevict-api
sh "$SRC/scripts/api-signatures.sh" --check "$SRC" || fail "docs/api.md's signatures drifted"
grep -q -- '-Werror=incompatible-pointer-types' "$SRC/README.md" ||
    fail "README's build line lacks -Werror=incompatible-pointer-types"
call() { # FILE ARGS: a program calling kve_policy_new_ex(ARGS)
    cat >"$1" <<C
#include <kvevict.h>
int main(void)
{
    kve_rng rng;
    kve_rng_seed(&rng, 1);
    kve_policy_options o = kve_policy_default_options();
    kve_policy *p = NULL;
    kve_status st = kve_policy_new_ex($2);
    kve_policy_free(p);
    return st != KVE_OK;
}
C
}
call "$D/right.c" '"h2o:budget=8", &rng, &o, &p'
call "$D/wrong.c" '"h2o:budget=8", &o, &rng, &p'
flags="-std=c11 -Werror=incompatible-pointer-types -I$SRC/include -I$INC -c"
# shellcheck disable=SC2086
"$CC" $flags "$D/right.c" -o "$D/right.o" 2>"$D/right.err" ||
    fail "the right order does not build: $(cat "$D/right.err")"
# shellcheck disable=SC2086
if "$CC" $flags "$D/wrong.c" -o "$D/wrong.o" 2>"$D/wrong.err"; then
    fail "kve_policy_new_ex(spec, options, rng, out) builds: a swapped order must not"
elif ! grep -q "incompatible-pointer-types\|incompatible pointer" "$D/wrong.err"; then
    fail "the swapped order fails for another reason: $(cat "$D/wrong.err")"
fi
[ "$fails" -eq 0 ] || exit 1
echo "test_api_signatures: api.md is the headers'; a swapped kve_policy_new_ex does not build"
