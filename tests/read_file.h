/* SPDX-License-Identifier: MIT */
/*
 * read_file.h - a whole file into memory, for the tests (stdio and malloc:
 * nothing of the libraries under test). NUL-terminated beyond its length,
 * so a text file reads as a string; NULL when it cannot be read (or memory
 * runs out). Free with free().
 */
#ifndef KVE_READ_FILE_H
#define KVE_READ_FILE_H

#include <stdio.h>
#include <stdlib.h>

static inline char *read_whole_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len + 1 < cap)
            break;
        char *grown = realloc(buf, cap * 2);
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    if (buf) {
        buf[len] = '\0';
        if (len_out)
            *len_out = len;
    }
    return buf;
}

#endif /* KVE_READ_FILE_H */
