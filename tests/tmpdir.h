/* SPDX-License-Identifier: MIT */
/*
 * tmpdir.h - a private scratch directory for a test program that writes
 * files: made once in main (tmpdir_make), named paths inside it (path_of),
 * its entries counted (files_in_dir, so "no partial file left" can be
 * checked), and removed with its contents at the end (remove_dir).
 * `dir` is the directory's path; the directory is flat.
 */
#ifndef KVE_TMPDIR_H
#define KVE_TMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

/* Makes $TMPDIR/<prefix>.XXXXXX (or under /tmp); 0 on success. */
static inline int tmpdir_make(const char *prefix)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%.30s/%.20s.XXXXXX", tmp && *tmp ? tmp : "/tmp", prefix);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

/* dir/name, in a static buffer valid until the next call. */
static inline const char *path_of(const char *name)
{
    static char buf[400];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* Entries of dir other than "." and ".."; SIZE_MAX if it cannot be read. */
static inline size_t files_in_dir(void)
{
    DIR *d = opendir(dir);
    if (!d)
        return (size_t)-1;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* Removes dir's files and empty subdirectories, then dir itself. */
static inline void remove_dir(void)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                remove(path_of(e->d_name));
        closedir(d);
    }
    rmdir(dir);
}

#endif /* KVE_TMPDIR_H */
