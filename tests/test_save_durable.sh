#!/bin/sh
# SPDX-License-Identifier: MIT
# test_save_durable.sh KVEVICT CC - the order of the system calls that make a
# save durable (tools/output.c, out_close; sessions are saved the same way),
# seen through an LD_PRELOAD shim compiled here that logs every fsync,
# fdatasync and rename with the path of its file (/proc/self/fd):
#   - a new or singly linked file: fsync of the finished temporary
#     NAME.tmp.XXXXXX, then its rename onto NAME, then fsync of NAME's
#     directory (without the first, a crash can leave NAME empty or torn
#     after the rename; without the last, the rename itself can be lost);
#   - a hard-linked file, which a rename would cut off from its other names:
#     fsync of the finished temporary, then its bytes copied into NAME in
#     place and NAME fsynced, and no rename (so, unlike a rename, a crash
#     during the copy can leave NAME torn; docs/robustness.md says so).
# Exit 77 (skipped, reason printed) without a C compiler that builds the
# shim, without /proc/self/fd, or when the shim is not loaded (a statically
# linked tool).
set -u
K=${1:?usage: test_save_durable.sh PATH/TO/kvevict CC}
CC=${2:?usage: test_save_durable.sh PATH/TO/kvevict CC}
. "$(dirname "$0")/check.sh"
scratch kvevict-durable
D=$(cd "$D" && pwd -P) # the paths /proc/self/fd gives
if [ ! -d /proc/self/fd ]; then
    echo "SKIP: no /proc/self/fd to name the files fsync is given"
    exit 77
fi
cat >"$D/shim.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One line "WHAT A [B]" appended to $KVE_SHIM_LOG per call. */
static void note(const char *what, const char *a, const char *b)
{
    const char *log = getenv("KVE_SHIM_LOG");
    if (!log)
        return;
    char line[8400];
    int n = snprintf(line, sizeof line, "%s %s%s%s\n", what, a, b ? " " : "", b ? b : "");
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd >= 0) {
        if (n > 0)
            (void)!write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        close(fd);
    }
}

static void fd_path(int fd, char *out, size_t cap)
{
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, cap - 1);
    out[n > 0 ? n : 0] = '\0';
}

int fsync(int fd)
{
    char p[4096];
    fd_path(fd, p, sizeof p);
    note("fsync", p, NULL);
    return ((int (*)(int))dlsym(RTLD_NEXT, "fsync"))(fd);
}

int fdatasync(int fd)
{
    char p[4096];
    fd_path(fd, p, sizeof p);
    note("fdatasync", p, NULL);
    return ((int (*)(int))dlsym(RTLD_NEXT, "fdatasync"))(fd);
}

int rename(const char *from, const char *to)
{
    note("rename", from, to);
    return ((int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename"))(from, to);
}
C
if ! "$CC" -shared -fPIC -o "$D/shim.so" "$D/shim.c" -ldl >"$D/cc.log" 2>&1; then
    echo "SKIP: $CC does not build the LD_PRELOAD shim: $(head -1 "$D/cc.log")"
    exit 77
fi
# A sanitized tool checks that its runtime comes first; the shim needs none.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
save() { # LOG: kvevict eval -o $D/out.json under the shim, calls logged to LOG
    rm -f "$1"
    KVE_SHIM_LOG=$1 LD_PRELOAD="$D/shim.so" "$K" eval --trace canonical:steps=300 \
        --policy h2o:budget=64 --json -o "$D/out.json" 2>"$D/err" ||
        fail "kvevict eval -o exits $?: $(cat "$D/err")"
}
# The number of the first line of LOG after line AFTER that is a sync
# (fsync or fdatasync) of PATH, or, with WHAT "rename", a rename from PATH;
# empty when none. Paths are compared as strings.
line_of() { # LOG AFTER WHAT PATH
    awk -v after="$2" -v what="$3" -v path="$4" 'NR > after && $2 == path &&
        (what == "rename" ? $1 == "rename" : ($1 == "fsync" || $1 == "fdatasync")) {
        print NR; exit }' "$1"
}
calls() { tr '\n' ';' <"$D/log"; }

# 1. A new file, then an existing one: rename, and the directory synced.
for round in new existing; do
    save "$D/log"
    if [ ! -s "$D/log" ]; then
        echo "SKIP: the shim was not loaded (no call logged; a statically linked $K?)"
        exit 77
    fi
    tmp=$(awk -v out="$D/out.json" '$1 == "rename" && $3 == out &&
        index($2, out ".tmp.") == 1 { print $2; exit }' "$D/log")
    if [ -z "$tmp" ]; then
        fail "$round file: no rename of a temporary onto out.json: $(calls)"
        continue
    fi
    r=$(line_of "$D/log" 0 rename "$tmp")
    f=$(line_of "$D/log" 0 sync "$tmp")
    if [ -n "$f" ] && [ "$f" -lt "$r" ]; then ok; else
        fail "$round file: the temporary is not fsynced before its rename: $(calls)"
    fi
    if [ -n "$(line_of "$D/log" "$r" sync "$D")" ]; then ok; else
        fail "$round file: the directory is not fsynced after the rename: $(calls)"
    fi
    check "$round file: out.json is the result" grep -q '"retained_mass"' "$D/out.json"
done

# 2. A hard-linked file: written in place once the temporary is synced.
ln "$D/out.json" "$D/other.json"
before=$(ls -i "$D/out.json" | cut -d' ' -f1)
save "$D/log"
f=$(awk -v out="$D/out.json" '($1 == "fsync" || $1 == "fdatasync") &&
    index($2, out ".tmp.") == 1 { print NR; exit }' "$D/log")
if [ -n "$f" ]; then ok; else fail "hard link: the temporary is not fsynced: $(calls)"; fi
if [ -n "$(line_of "$D/log" "${f:-0}" sync "$D/out.json")" ]; then ok; else
    fail "hard link: out.json is not fsynced after the temporary: $(calls)"
fi
if awk -v out="$D/out.json" '$1 == "rename" && $3 == out { found = 1 } END { exit !found }' \
        "$D/log"; then
    fail "hard link: renamed onto, which cuts off its other name: $(calls)"
else
    ok
fi
check "hard link: the same file under both names" \
    [ "$(ls -i "$D/out.json" | cut -d' ' -f1)" = "$before" ]
check "hard link: the other name sees the new bytes" cmp -s "$D/out.json" "$D/other.json"
if ls "$D" | grep -q 'out\.json\.tmp'; then fail "a temporary left beside out.json"; else ok; fi

[ "$fails" -eq 0 ] || exit 1
echo "test_save_durable: $checks checks: fsync of the temporary, rename, fsync of the directory (a hard link: fsync, copy in place, fsync)"
