/* SPDX-License-Identifier: MIT */
/*
 * output.c - where results go and how: output files written under a
 * temporary name and renamed into place, the signal handler that removes
 * them, progress lines, JSON strings and numbers, and the rewriting of a
 * marked block of a file. Where traces come from is traces.c; what a result
 * row holds, results.c.
 *
 * Invariant: a file the tool writes is made whole under a temporary name
 * beside it (NAME.tmp.kvevict.XXXXXX, locked by its writer from before the
 * name exists where the system allows, and removed by a later save only
 * when its writer is gone: sweep_stale), synced (fsync), renamed over NAME,
 * and then NAME's directory is synced: a crash, an error or an interrupt
 * leaves the old file or the new one, never a mix. Two kinds of file are written in
 * place instead, without that guarantee: a device or FIFO, which a rename
 * would replace, written as the output is made; and a hard-linked file,
 * whose other names a rename would cut off. For the latter the temporary is
 * still made whole and synced first, then its bytes are copied over the
 * file's own, the file truncated to them and synced (copy_into): until that
 * fsync returns, a crash, a failed write (a full disk: exit 1, naming the
 * file) or a reader can see the file torn, new bytes over part of the old
 * ones (a torn session is refused when loaded: its size or checksum no
 * longer agrees). A symlink is followed: its target is written, the link
 * kept. An existing file keeps its mode, owner and group; a new one gets
 * 0666 (out_open_private: 0600) less the umask. The temporary is registered
 * with temp_create (errors.c), which die_* and the signal handler remove,
 * so an error or an interrupt leaves no temporary behind.
 */
#define _XOPEN_SOURCE 700 /* realpath, fchown */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- output streams ---- */

typedef struct out_file {
    FILE *f;
    char *path; /* final name: a symlink's target */
    char tmp[PATH_MAX];
    int copy_in; /* a hard-linked file: the finished bytes copied into it, in place */
} out_file;

static out_file outs[MAX_TEMPS];

/* The permissions a new file gets: `mode` less the umask. */
static mode_t masked(mode_t mode)
{
    mode_t u = umask(0);
    umask(u);
    return mode & ~u;
}

/* The file `path` names once its symlinks are followed (the target is
 * written, the link kept); `path` itself when it is not a link. */
static char *final_name(const char *path)
{
    struct stat lb;
    if (lstat(path, &lb) == 0 && S_ISLNK(lb.st_mode)) {
        char *real = realpath(path, NULL);
        if (real)
            return real;
        /* a dangling link: its target is created */
        char target[PATH_MAX];
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n > 0) {
            target[n] = '\0';
            if (target[0] == '/')
                return xstrdup(target);
            const char *slash = strrchr(path, '/');
            size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
            char *full = xmalloc(dir + (size_t)n + 1);
            memcpy(full, path, dir);
            memcpy(full + dir, target, (size_t)n + 1);
            return full;
        }
    }
    return xstrdup(path);
}

/* The temporaries' names: NAME, this infix, then six letters and digits
 * (temp_create's XXXXXX). The infix is what tells them from a user's own
 * "NAME.tmp.something", which the sweep never touches. */
static const char temp_infix[] = ".tmp.kvevict.";
enum { TEMP_SUFFIX = 6, STALE_AFTER_S = 60 };

/* `n` is a temporary this program writes beside `base`: base, the infix,
 * six letters and digits, nothing else. */
static int is_our_temp(const char *n, const char *base)
{
    const size_t blen = strlen(base), ilen = sizeof temp_infix - 1;
    if (strlen(n) != blen + ilen + TEMP_SUFFIX || strncmp(n, base, blen) != 0 ||
        strncmp(n + blen, temp_infix, ilen) != 0)
        return 0;
    for (const char *x = n + blen + ilen; *x; x++)
        if (!((*x >= 'a' && *x <= 'z') || (*x >= 'A' && *x <= 'Z') || (*x >= '0' && *x <= '9')))
            return 0;
    return 1;
}

/* Removes the temporaries beside `name` (is_our_temp) that no live run
 * holds: every writer holds an exclusive flock on its temporary from before
 * its name exists (temp_create: O_TMPFILE, locked, then linked), which the
 * kernel drops when it dies (even of SIGKILL), so one whose lock can be
 * taken was left by a killed run. Where temp_create has to name the file
 * before it locks it (mkstemp, without O_TMPFILE), a file younger than
 * STALE_AFTER_S seconds may be one whose writer has not locked it yet: it
 * is left alone, as is every file not of the exact pattern (a user's).
 * Each removal is reported (a warning). */
static void sweep_stale(const char *name)
{
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    char dir[PATH_MAX];
    path_dir(name, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d)
        return;
    const time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (!is_our_temp(n, base))
            continue;
        char full[PATH_MAX];
        if (snprintf(full, sizeof full, "%s/%s", dir, n) >= (int)sizeof full)
            continue;
        int fd = open(full, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0)
            continue;
        struct stat sb;
        if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && now - sb.st_mtime >= STALE_AFTER_S &&
            flock(fd, LOCK_EX | LOCK_NB) == 0 && unlink(full) == 0)
            warn("removed %s, a temporary file a killed run left", full);
        close(fd);
    }
    closedir(d);
}

static FILE *open_out(const char *path, mode_t new_mode)
{
    if (!path || strcmp(path, "-") == 0)
        return stdout;
    size_t slot = 0;
    while (slot < MAX_TEMPS && outs[slot].f)
        slot++;
    if (slot == MAX_TEMPS)
        die_input("%s: too many output files", path);
    out_file *o = &outs[slot];
    char *name = final_name(path);
    struct stat sb;
    int exists = stat(name, &sb) == 0;
    if (exists && !S_ISREG(sb.st_mode)) {
        /* A device or FIFO (/dev/null, a named pipe) is written in place:
         * renaming a finished file over it would replace it. */
        o->f = fopen(name, "wb");
        if (!o->f)
            die_input("%s: %s", path, strerror(errno));
        o->tmp[0] = '\0';
        o->copy_in = 0;
        o->path = name;
        return o->f;
    }
    if (snprintf(o->tmp, sizeof o->tmp, "%s%sXXXXXX", name, temp_infix) >= (int)sizeof o->tmp) {
        free(name);
        die_input("%s: path is too long", path);
    }
    sweep_stale(name);
    int fd = temp_create(o->tmp);
    if (fd < 0) {
        int e = errno;
        free(name);
        die_input("%s: cannot create a file beside it: %s", path, strerror(e));
    }
    /* locked by temp_create (before its name existed, where it can be):
     * sweep_stale leaves it alone while this run lives */
    /* An existing file keeps its mode, owner and group (a session made
     * private stays private); a new one gets new_mode less the umask. */
    if (exists) {
        (void)fchmod(fd, sb.st_mode & 07777);
        if (fchown(fd, sb.st_uid, sb.st_gid) != 0) /* not ours to give: the mode still holds */
            (void)fchmod(fd, sb.st_mode & 0700);
    } else {
        (void)fchmod(fd, masked(new_mode));
    }
    o->copy_in = exists && sb.st_nlink > 1; /* a rename would cut the other names off */
    o->f = fdopen(fd, o->copy_in ? "w+b" : "wb");
    if (!o->f) {
        int e = errno;
        close(fd);
        free(name);
        die_input("%s: %s", path, strerror(e));
    }
    o->path = name;
    return o->f;
}

FILE *out_open(const char *path)
{
    return open_out(path, 0666);
}

FILE *out_open_private(const char *path)
{
    return open_out(path, 0600);
}

/* Makes the rename of a finished file durable: its directory synced. */
static void sync_dir(const char *path)
{
    char dir[PATH_MAX];
    path_dir(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* A hard-linked file's new bytes, from the finished and synced temporary
 * f, copied into it in place (every name sees them), the file truncated to
 * them and synced. Not atomic: until the fsync returns the file may hold new
 * bytes over part of the old ones, and a failure (errno returned) leaves it
 * so. 0 on success. */
static int copy_into(FILE *f, const char *path)
{
    FILE *dst = fopen(path, "r+b");
    if (!dst)
        return errno;
    int e = 0;
    char buf[65536];
    size_t n;
    rewind(f);
    while (!e && (n = fread(buf, 1, sizeof buf, f)) > 0)
        if (fwrite(buf, 1, n, dst) != n)
            e = errno ? errno : EIO;
    if (!e && (ferror(f) || fflush(dst) != 0 || ftruncate(fileno(dst), ftell(dst)) != 0 ||
               fsync(fileno(dst)) != 0))
        e = errno ? errno : EIO;
    if (fclose(dst) != 0 && !e)
        e = errno;
    return e;
}

void out_close(FILE *f)
{
    if (f == stdout) {
        finish_stdout();
        return;
    }
    for (size_t i = 0; i < MAX_TEMPS; i++) {
        out_file *o = &outs[i];
        if (o->f != f)
            continue;
        /* the bytes reach the disk before the name does (a crash leaves the
         * old file or the new one), except for a hard-linked file, copied in
         * place once they have (a crash during the copy can tear it) */
        int bad = fflush(f) != 0 || ferror(f) || (o->tmp[0] && fsync(fileno(f)) != 0);
        int e = errno;
        if (!bad && o->copy_in && (e = copy_into(f, o->path)) != 0)
            bad = 1;
        if (fclose(f) != 0 && !bad) {
            bad = 1;
            e = errno;
        }
        o->f = NULL;
        if (bad)
            die_input("%s: cannot write: %s", o->path, strerror(e));
        if (o->tmp[0] == '\0') { /* written in place */
            free(o->path);
            o->path = NULL;
            return;
        }
        if (o->copy_in) {
            (void)remove(o->tmp);
        } else {
            if (rename(o->tmp, o->path) != 0)
                die_input("%s: cannot rename the finished file into place: %s", o->path,
                          strerror(errno));
            sync_dir(o->path);
        }
        temp_forget(o->tmp);
        free(o->path);
        o->path = NULL;
        return;
    }
    die_input("internal error: closing a stream that out_open did not give");
}

/* ---- sessions held for a run ---- */

static struct {
    int fd;      /* the session file, flocked; -1: none was there */
    int held;    /* session_hold ran */
    dev_t dev;
    ino_t ino;
} session = {-1, 0, 0, 0};

int session_hold(const char *path)
{
    char *name = final_name(path);
    for (int tries = 0; tries < 8; tries++) {
        int fd = open(name, O_RDONLY);
        if (fd < 0) {
            if (errno != ENOENT)
                die_input("--session %s: %s", path, strerror(errno));
            session.held = 1;
            free(name);
            return 0;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            free(name);
            if (e == EWOULDBLOCK)
                die_input("--session %s is in use by another run (it holds the file's lock); "
                          "run one at a time", path);
            die_input("--session %s: cannot lock it: %s", path, strerror(e));
        }
        struct stat a, b;
        /* locked what the name still names? (a run that saved renamed a new
         * file into place while we waited: take that one) */
        if (fstat(fd, &a) == 0 && stat(name, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            session.fd = fd;
            session.dev = a.st_dev;
            session.ino = a.st_ino;
            session.held = 1;
            free(name);
            return 1;
        }
        close(fd);
    }
    free(name);
    die_input("--session %s keeps being replaced by another run", path);
}

void session_check(const char *path)
{
    if (!session.held)
        return;
    char *name = final_name(path);
    struct stat sb;
    int there = stat(name, &sb) == 0;
    free(name);
    if (session.fd < 0 && there)
        die_input("--session %s was created by another run since this one started; not saved "
                  "(this run's continuation is lost, the other's kept)", path);
    if (session.fd >= 0 && (!there || sb.st_dev != session.dev || sb.st_ino != session.ino))
        die_input("--session %s was replaced since this run read it; not saved", path);
}

FILE *null_sink(void)
{
    FILE *f = fopen("/dev/null", "w");
    if (!f)
        f = tmpfile();
    if (!f)
        die_input("cannot open a scratch stream: %s", strerror(errno));
    return f;
}

/* ---- progress ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double started; /* the first progress_begin: one clock for the whole command */

void progress_begin(progress *pr, const char *what, uint64_t total, size_t head, size_t heads)
{
    if (started == 0.0)
        started = now_s();
    pr->what = what;
    pr->total = total;
    pr->head = head;
    pr->heads = heads;
    pr->last = 0.0;
    pr->next = 0;
    pr->shown = 0;
}

int cli_quiet;

void progress_update(progress *pr, uint64_t done)
{
    /* The clock is read after every 256 units of work (and at the end),
     * whatever the size of each update. */
    if (cli_quiet || (done < pr->next && done != pr->total))
        return;
    pr->next = done + 256;
    double now = now_s();
    if (now - started < 2.0 || now - pr->last < 0.25 || !isatty(STDERR_FILENO))
        return;
    pr->last = now;
    double pct = pr->total ? 100.0 * (double)done / (double)pr->total : 100.0;
    if (pr->heads > 1)
        fprintf(stderr, "\rkvevict %s: head %zu/%zu, %s %llu/%llu (%.0f%%) ", cli_cmd,
                pr->head + 1, pr->heads, pr->what, (unsigned long long)done,
                (unsigned long long)pr->total, pct);
    else
        fprintf(stderr, "\rkvevict %s: %s %llu/%llu (%.0f%%) ", cli_cmd, pr->what,
                (unsigned long long)done, (unsigned long long)pr->total, pct);
    pr->shown = 1;
    cli_progress_shown = 1;
}

void progress_end(progress *pr)
{
    if (pr->shown)
        fputs("\r\033[K", stderr);
    pr->shown = 0;
    cli_progress_shown = 0;
}

int progress_callback(void *user, uint64_t done, uint64_t total)
{
    progress *pr = user;
    pr->total = total;
    progress_update(pr, done);
    return 0;
}

/* ---- JSON ---- */

void json_double(FILE *f, double x)
{
    if (!isfinite(x))
        fputs("null", f);
    else
        fprintf(f, "%.17g", x);
}

void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20 || *c == 0x7f)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

void rewrite_block(const char *path, const char *name, const char *block)
{
    char begin[64], end[64];
    snprintf(begin, sizeof begin, "<!-- %s:begin -->\n", name);
    snprintf(end, sizeof end, "<!-- %s:end -->", name);
    FILE *in = fopen(path, "rb");
    if (!in)
        die_input("--docs: %s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem)
        die_input("out of memory");
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, got, mem);
    int bad = ferror(in);
    fclose(in);
    fclose(mem);
    if (bad)
        die_input("--docs: %s: cannot read", path);
    char *b = strstr(text, begin);
    char *e = b ? strstr(b, end) : NULL;
    if (!b || !e)
        die_input("--docs: %s has no '<!-- %s:begin -->' ... '<!-- %s:end -->' block", path, name,
                  name);
    FILE *out = out_open(path);
    fwrite(text, 1, (size_t)(b - text) + strlen(begin), out);
    fputs(block, out);
    fputs(e, out);
    out_close(out);
    free(text);
}
