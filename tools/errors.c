/* SPDX-License-Identifier: MIT */
/*
 * errors.c - how the kvevict tools fail: one line "kvevict CMD: message" on
 * stderr and an exit code (die_*), allocation that exits when memory runs
 * out (x*), and what every failure and interrupt must undo first: the
 * temporary files registered with temp_create, removed by die_* and by the
 * signal handler, which then dies of the signal.
 *
 * Invariant: a registered temporary file is removed on every exit but a
 * successful one that renamed or forgot it first; the signal handler uses
 * only async-signal-safe calls (unlink, write, signal, raise).
 */
#define _GNU_SOURCE /* O_TMPFILE (Linux); POSIX 2008 otherwise */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

/* ---- messages and exits ---- */

const char *cli_cmd = "";
const char *cli_program = "kvevict";

static void vmsg(const char *kind, const char *fmt, va_list ap)
{
    fflush(stdout);
    if (cli_cmd[0])
        fprintf(stderr, "%s %s: %s", cli_program, cli_cmd, kind);
    else
        fprintf(stderr, "%s: %s", cli_program, kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg("", fmt, ap);
    va_end(ap);
    temp_remove_all();
    exit(EXIT_USAGE);
}

void die_input(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg("", fmt, ap);
    va_end(ap);
    temp_remove_all();
    exit(EXIT_INPUT);
}

void warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg("warning: ", fmt, ap);
    va_end(ap);
}

/* The library names its flags as C identifiers; the CLI's user knows them
 * as options. */
static const struct {
    const char *c_name, *option;
} flag_words[] = {
    {"KVE_TRACE_NORMALIZE", "--normalize"},
};

void die_status(kve_status s, const char *what)
{
    char msg[512];
    const char *e = kve_last_error();
    size_t n = 0;
    while (*e && n + 1 < sizeof msg) {
        size_t k = 0;
        for (; k < sizeof flag_words / sizeof flag_words[0]; k++)
            if (strncmp(e, flag_words[k].c_name, strlen(flag_words[k].c_name)) == 0)
                break;
        if (k < sizeof flag_words / sizeof flag_words[0]) {
            n += (size_t)snprintf(msg + n, sizeof msg - n, "%s", flag_words[k].option);
            e += strlen(flag_words[k].c_name);
            if (n >= sizeof msg)
                n = sizeof msg - 1;
        } else {
            msg[n++] = *e++;
        }
    }
    msg[n] = '\0';
    if (s == KVE_EINVAL)
        what ? die_usage("%s: %s", what, msg) : die_usage("%s", msg);
    what ? die_input("%s: %s", what, msg) : die_input("%s", msg);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die_input("out of memory");
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        die_input("out of memory");
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        die_input("out of memory");
    return q;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = xmalloc(n);
    memcpy(d, s, n);
    return d;
}

char *xstrndup(const char *s, size_t n)
{
    size_t len = 0;
    while (len < n && s[len])
        len++;
    char *d = xmalloc(len + 1);
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

void finish_stdout(void)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        int e = errno;
        fprintf(stderr, "kvevict%s%s: cannot write standard output: %s\n", cli_cmd[0] ? " " : "",
                cli_cmd, strerror(e));
        temp_remove_all();
        exit(EXIT_INPUT);
    }
}

/* ---- temporary files ---- */

static char temp_path[MAX_TEMPS][PATH_MAX];
static volatile sig_atomic_t temp_used[MAX_TEMPS];
volatile sig_atomic_t cli_progress_shown;

static void block_signals(sigset_t *old)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, old);
}

void path_dir(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, cap, ".");
    else if (slash == path)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

/* Random letters and digits over the last six bytes of `name` (its
 * XXXXXX), from a generator seeded by the process and the clock. */
static void fill_suffix(char *name)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static uint64_t state;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    state += 0x9e3779b97f4a7c15u ^ ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^
             ((uint64_t)ts.tv_sec << 20);
    uint64_t z = state; /* splitmix64's output */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    z ^= z >> 31;
    char *x = name + strlen(name) - 6;
    for (int i = 0; i < 6; i++, z /= 62)
        x[i] = digits[z % 62];
}

/* The file of `name` (ending in XXXXXX, rewritten) created, and locked
 * before its name exists: an unnamed file in its directory (O_TMPFILE),
 * locked, then linked under a free name. -1 (errno: why) where the system
 * or the file system has no such file or cannot link it. */
static int create_unnamed_first(char *name)
{
#if defined(O_TMPFILE) && defined(__linux__)
    char dir[PATH_MAX];
    path_dir(name, dir, sizeof dir);
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
        for (int tries = 0; tries < 100; tries++) {
            fill_suffix(name);
            if (linkat(AT_FDCWD, self, AT_FDCWD, name, AT_SYMLINK_FOLLOW) == 0)
                return fd;
            if (errno != EEXIST)
                break;
        }
    int e = errno;
    close(fd);
    errno = e;
    return -1;
#else
    (void)name;
    errno = ENOTSUP;
    return -1;
#endif
}

int temp_create(char *template)
{
    size_t len = strlen(template);
    if (len >= PATH_MAX || len < 6 || strcmp(template + len - 6, "XXXXXX") != 0) {
        errno = len >= PATH_MAX ? ENAMETOOLONG : EINVAL;
        return -1;
    }
    sigset_t old;
    block_signals(&old); /* no signal between creating and registering */
    size_t slot = 0;
    while (slot < MAX_TEMPS && temp_used[slot])
        slot++;
    int fd = -1;
    if (slot == MAX_TEMPS) {
        errno = EMFILE;
    } else {
        memcpy(temp_path[slot], template, len + 1);
        fd = create_unnamed_first(temp_path[slot]);
        if (fd < 0) { /* mkstemp, then the lock: a sweep leaves a file this young alone */
            memcpy(temp_path[slot], template, len + 1);
            fd = mkstemp(temp_path[slot]);
            if (fd >= 0)
                (void)flock(fd, LOCK_EX | LOCK_NB);
        }
        if (fd >= 0) {
            memcpy(template, temp_path[slot], len + 1);
            temp_used[slot] = 1;
        }
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return fd;
}

void temp_forget(const char *path)
{
    for (size_t i = 0; i < MAX_TEMPS; i++)
        if (temp_used[i] && strcmp(temp_path[i], path) == 0)
            temp_used[i] = 0;
}

void temp_remove_all(void)
{
    for (size_t i = 0; i < MAX_TEMPS; i++)
        if (temp_used[i]) {
            unlink(temp_path[i]);
            temp_used[i] = 0;
        }
}

static void on_signal(int sig)
{
    for (size_t i = 0; i < MAX_TEMPS; i++)
        if (temp_used[i])
            unlink(temp_path[i]);
    if (cli_progress_shown) {
        static const char erase[] = "\r\033[K";
        ssize_t w = write(STDERR_FILENO, erase, sizeof erase - 1);
        (void)w;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void put_err(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    ssize_t w = write(STDERR_FILENO, s, n);
    (void)w;
}

/* The model files the run maps (cli_watch_mapping), for the SIGBUS
 * handler to tell their faults from any other bus error. Written before
 * the handler can need them, read only by it. */
enum { MAX_MAPPINGS = 8 };
static struct {
    uintptr_t base, size;
    const char *path;
} mappings[MAX_MAPPINGS];
static volatile sig_atomic_t n_mappings;

void cli_watch_mapping(const void *base, size_t size, const char *path)
{
    if (!base || !size || n_mappings == MAX_MAPPINGS)
        return;
    mappings[n_mappings].base = (uintptr_t)base;
    mappings[n_mappings].size = size;
    mappings[n_mappings].path = xstrdup(path);
    n_mappings++; /* the entry whole before it counts */
}

/* `v` in hexadecimal ("0x..."), to stderr; async-signal-safe. */
static void put_hex(uintptr_t v)
{
    char buf[2 + 2 * sizeof v + 1];
    size_t n = sizeof buf - 1;
    buf[n] = '\0';
    do {
        buf[--n] = "0123456789abcdef"[v & 15u];
        v >>= 4;
    } while (v && n > 2);
    buf[--n] = 'x';
    buf[--n] = '0';
    put_err(buf + n);
}

/* A SIGBUS stops the run with one line and exit 1, the temporary files
 * removed (a session being saved is left as it was: it is renamed into
 * place only once written). The line says what the handler can know: a
 * fault at an address inside a model's mapping (si_addr) is that model
 * file cut short or replaced under the process, its pages faulting on the
 * next read; any other (another mapping, an alignment or hardware error, a
 * SIGBUS sent with kill) is a bus error it names by its address or sender. */
static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    (void)sig;
    (void)context;
    for (size_t i = 0; i < MAX_TEMPS; i++)
        if (temp_used[i])
            unlink(temp_path[i]);
    if (cli_progress_shown)
        put_err("\r\033[K");
    put_err(cli_program);
    if (cli_cmd[0]) {
        put_err(" ");
        put_err(cli_cmd);
    }
    const int sent = !info || info->si_code <= 0; /* kill, sigqueue, raise */
    const uintptr_t at = sent ? 0 : (uintptr_t)info->si_addr;
    const char *model = NULL;
    for (sig_atomic_t i = 0; !sent && i < n_mappings; i++)
        if (at - mappings[i].base < mappings[i].size)
            model = mappings[i].path;
    if (model) {
        put_err(": the model file ");
        put_err(model);
        put_err(" was truncated or changed while it was in use (SIGBUS reading its mapped "
                "weights); stopped, no file written\n");
    } else {
        put_err(": bus error (SIGBUS");
        if (sent) {
            put_err(" sent by another process");
        } else {
            put_err(" at address ");
            put_hex(at);
            put_err(", outside the model's mapping");
        }
        put_err("); stopped, no file written\n");
    }
    _exit(EXIT_INPUT);
}

void cli_signals_install(void)
{
    struct sigaction bus;
    memset(&bus, 0, sizeof bus);
    bus.sa_sigaction = on_sigbus;
    bus.sa_flags = SA_SIGINFO;
    sigemptyset(&bus.sa_mask);
    sigaction(SIGBUS, &bus, NULL);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa;
        /* A signal ignored when we start (a background job of a script)
         * stays ignored, as the shell meant. */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}
