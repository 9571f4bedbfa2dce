#!/bin/sh
# SPDX-License-Identifier: MIT
# test_save_durable.sh KVEVICT CC [SOURCE_DIR] - the order of the system
# calls that make a save durable (tools/output.c, out_close), for an output
# (eval -o) and a session (generate --session, with SOURCE_DIR's
# models/kjv.bin; skipped, saying so, without it), seen through an
# LD_PRELOAD shim compiled here that logs every fsync, fdatasync, rename,
# flock and linkat with the path of its file (/proc/self/fd):
#   - a new or singly linked file: fsync of the finished temporary
#     NAME.tmp.kvevict.XXXXXX, then its rename onto NAME, then fsync of
#     NAME's directory (without the first, a crash can leave NAME empty or
#     torn after the rename; without the last, the rename itself can be
#     lost);
#   - the temporary locked before its name exists (O_TMPFILE, flock, then
#     linkat to the name), so that another run's sweep of stale temporaries
#     can never take a live one; where $D's file system has no O_TMPFILE
#     (a probe compiled here says) the tool falls back to mkstemp, then the
#     lock, and the check is only that it is locked;
#   - a hard-linked file, which a rename would cut off from its other names:
#     fsync of the finished temporary, then its bytes copied into NAME in
#     place and NAME fsynced, and no rename (so, unlike a rename, a crash
#     during the copy can leave NAME torn; docs/robustness.md says so).
# Exit 77 (skipped, reason printed) without a C compiler that builds the
# shim, without /proc/self/fd, or when the shim is not loaded (a statically
# linked tool).
set -u
K=${1:?usage: test_save_durable.sh PATH/TO/kvevict CC [SOURCE_DIR]}
CC=${2:?usage: test_save_durable.sh PATH/TO/kvevict CC [SOURCE_DIR]}
SRC=${3:-}
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
#include <sys/stat.h>
#include <unistd.h>

/* One line "WHAT INO A [B]" appended to $KVE_SHIM_LOG per call: INO the
 * inode the call is about (0 when unknown), so that a file is followed
 * across its names (an O_TMPFILE's fd path stays "DIR/#N (deleted)" after
 * it is linked). */
static void note(const char *what, unsigned long long ino, const char *a, const char *b)
{
    const char *log = getenv("KVE_SHIM_LOG");
    if (!log)
        return;
    char line[8400];
    int n = snprintf(line, sizeof line, "%s %llu %s%s%s\n", what, ino, a, b ? " " : "",
                     b ? b : "");
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd >= 0) {
        if (n > 0)
            (void)!write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        close(fd);
    }
}

static unsigned long long fd_ino(int fd, char *out, size_t cap)
{
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, cap - 1);
    out[n > 0 ? n : 0] = '\0';
    struct stat sb;
    return fstat(fd, &sb) == 0 ? (unsigned long long)sb.st_ino : 0;
}

static unsigned long long path_ino(const char *path)
{
    struct stat sb;
    return path && lstat(path, &sb) == 0 ? (unsigned long long)sb.st_ino : 0;
}

int fsync(int fd)
{
    char p[4096];
    unsigned long long ino = fd_ino(fd, p, sizeof p);
    note("fsync", ino, p, NULL);
    return ((int (*)(int))dlsym(RTLD_NEXT, "fsync"))(fd);
}

int fdatasync(int fd)
{
    char p[4096];
    unsigned long long ino = fd_ino(fd, p, sizeof p);
    note("fdatasync", ino, p, NULL);
    return ((int (*)(int))dlsym(RTLD_NEXT, "fdatasync"))(fd);
}

int rename(const char *from, const char *to)
{
    note("rename", path_ino(from), from, to);
    return ((int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename"))(from, to);
}

int flock(int fd, int op)
{
    char p[4096];
    unsigned long long ino = fd_ino(fd, p, sizeof p);
    note("flock", ino, p, NULL);
    return ((int (*)(int, int))dlsym(RTLD_NEXT, "flock"))(fd, op);
}

int linkat(int olddir, const char *from, int newdir, const char *to, int flags)
{
    int rc = ((int (*)(int, const char *, int, const char *, int))dlsym(RTLD_NEXT, "linkat"))(
        olddir, from, newdir, to, flags);
    if (rc == 0)
        note("linkat", path_ino(to), from, to);
    return rc;
}
C
if ! "$CC" -shared -fPIC -o "$D/shim.so" "$D/shim.c" -ldl >"$D/cc.log" 2>&1; then
    echo "SKIP: $CC does not build the LD_PRELOAD shim: $(head -1 "$D/cc.log")"
    exit 77
fi
# Whether $D's file system makes unnamed files that can be linked (O_TMPFILE,
# then linkat through /proc/self/fd): there the tool must lock its
# temporary before the name exists.
cat >"$D/probe.c" <<'C'
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv)
{
#ifdef O_TMPFILE
    int fd = open(argv[1], O_TMPFILE | O_RDWR, 0600);
    char self[64], name[4096];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    snprintf(name, sizeof name, "%s/probe.linked", argv[1]);
    int ok = fd >= 0 && linkat(AT_FDCWD, self, AT_FDCWD, name, AT_SYMLINK_FOLLOW) == 0;
    unlink(name);
    return argc == 2 && ok ? 0 : 1;
#else
    (void)argv;
    return argc == 0;
#endif
}
C
tmpfile_here=0
if "$CC" -o "$D/probe" "$D/probe.c" >/dev/null 2>&1 && "$D/probe" "$D"; then tmpfile_here=1; fi
# A sanitized tool checks that its runtime comes first; the shim needs none.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
save() { # LOG: kvevict eval -o $D/out.json under the shim, calls logged to LOG
    rm -f "$1"
    KVE_SHIM_LOG=$1 LD_PRELOAD="$D/shim.so" "$K" eval --trace canonical:steps=300 \
        --policy h2o:budget=64 --json -o "$D/out.json" 2>"$D/err" ||
        fail "kvevict eval -o exits $?: $(cat "$D/err")"
}
save_session() { # LOG: kvevict generate --session $D/s.kvs (new, else resumed) under the shim
    rm -f "$1"
    KVE_SHIM_LOG=$1 LD_PRELOAD="$D/shim.so" "$K" generate --model "$SRC/models/kjv.bin" \
        --prompt 'the' --steps 2 --policy h2o:budget=48,recent_window=8 \
        --session "$D/s.kvs" >/dev/null 2>"$D/err" ||
        fail "kvevict generate --session exits $?: $(cat "$D/err")"
}
# The number of the first line of LOG after line AFTER that is a sync
# (fsync or fdatasync) of the file of inode INO, or, with WHAT "rename" or
# "flock", such a call on it; empty when none.
line_of() { # LOG AFTER WHAT INO
    awk -v after="$2" -v what="$3" -v ino="$4" 'NR > after && $2 == ino &&
        (what == "sync" ? ($1 == "fsync" || $1 == "fdatasync") : $1 == what) {
        print NR; exit }' "$1"
}
# The number of the first sync of the file named PATH (the path its fd
# gives) after line AFTER.
line_of_path() { # LOG AFTER PATH
    awk -v after="$2" -v path="$3" 'NR > after && $3 == path &&
        ($1 == "fsync" || $1 == "fdatasync") { print NR; exit }' "$1"
}
calls() { tr '\n' ';' <"$D/log"; }
# The inode of OUT's temporary in the log: the file linked or renamed under
# OUT.tmp.kvevict.XXXXXX; empty when none.
temp_ino() { # OUT
    awk -v pre="$1.tmp.kvevict." '($1 == "linkat" && index($4, pre) == 1) ||
        ($1 == "rename" && index($3, pre) == 1) { print $2; exit }' "$D/log"
}

# The checks of one save of OUT logged in $D/log (LABEL names it): the
# temporary OUT.tmp.kvevict.XXXXXX locked before its name exists, fsynced,
# renamed onto OUT, the directory fsynced after.
check_save() { # LABEL OUT
    tmp=$(awk -v out="$2" '$1 == "rename" && $4 == out &&
        index($3, out ".tmp.kvevict.") == 1 { print $3; exit }' "$D/log")
    ino=$(temp_ino "$2")
    if [ -z "$tmp" ] || [ -z "$ino" ] || [ "$ino" = 0 ]; then
        fail "$1: no rename of a temporary onto $2: $(calls)"
        return
    fi
    r=$(line_of "$D/log" 0 rename "$ino")
    f=$(line_of "$D/log" 0 sync "$ino")
    if [ -n "$f" ] && [ "$f" -lt "$r" ]; then ok; else
        fail "$1: the temporary is not fsynced before its rename: $(calls)"
    fi
    if [ -n "$(line_of_path "$D/log" "$r" "$D")" ]; then ok; else
        fail "$1: the directory is not fsynced after the rename: $(calls)"
    fi
    # locked before named: a flock of the file while it has no name, then
    # its linkat to the temporary's name
    l=$(awk -v tmp="$tmp" '$1 == "linkat" && $4 == tmp { print NR; exit }' "$D/log")
    k=$(line_of "$D/log" 0 flock "$ino")
    if [ -z "$l" ] && [ "$tmpfile_here" = 1 ]; then
        fail "$1: $tmp was named before it was locked (made by name, not linked), though this file system has O_TMPFILE: $(calls)"
    elif [ -z "$l" ]; then
        echo "note: $1: no linkat of $tmp (no O_TMPFILE here: mkstemp, then the lock)"
        if [ -n "$k" ]; then ok; else fail "$1: the temporary is never locked: $(calls)"; fi
    elif [ -n "$k" ] && [ "$k" -lt "$l" ]; then
        ok
    else
        fail "$1: the temporary is not locked before its name exists: $(calls)"
    fi
}

# 1. A new file, then an existing one: rename, and the directory synced.
for round in new existing; do
    save "$D/log"
    if [ ! -s "$D/log" ]; then
        echo "SKIP: the shim was not loaded (no call logged; a statically linked $K?)"
        exit 77
    fi
    check_save "$round file" "$D/out.json"
    check "$round file: out.json is the result" grep -q '"retained_mass"' "$D/out.json"
done

# 1b. A session: new, then resumed; saved the same way (out_open_private).
if [ -n "$SRC" ] && [ -f "$SRC/models/kjv.bin" ]; then
    for round in new resumed; do
        save_session "$D/log"
        check_save "$round session" "$D/s.kvs"
        check "$round session: s.kvs is a session" [ "$(head -c 7 "$D/s.kvs")" = kvesess ]
    done
    check "the session is private (0600)" [ "$(stat -c %a "$D/s.kvs")" = 600 ]
else
    echo "note: no models/kjv.bin under '$SRC': the session's save not checked"
fi

# 2. A hard-linked file: written in place once the temporary is synced.
ln "$D/out.json" "$D/other.json"
before=$(ls -i "$D/out.json" | cut -d' ' -f1)
save "$D/log"
ino=$(temp_ino "$D/out.json")
if [ -z "$ino" ]; then # mkstemp's file: its fd path is its name
    f=$(awk -v out="$D/out.json" '($1 == "fsync" || $1 == "fdatasync") &&
        index($3, out ".tmp.kvevict.") == 1 { print NR; exit }' "$D/log")
else
    f=$(line_of "$D/log" 0 sync "$ino")
fi
if [ -n "$f" ]; then ok; else fail "hard link: the temporary is not fsynced: $(calls)"; fi
if [ -n "$(line_of_path "$D/log" "${f:-0}" "$D/out.json")" ]; then ok; else
    fail "hard link: out.json is not fsynced after the temporary: $(calls)"
fi
if awk -v out="$D/out.json" '$1 == "rename" && $4 == out { found = 1 } END { exit !found }' \
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
echo "test_save_durable: $checks checks: the temporary locked before it is named, fsync of it, rename, fsync of the directory, for an output and a session (a hard link: fsync, copy in place, fsync)"
