/* SPDX-License-Identifier: MIT */
/*
 * driver.c - a plain main() for the fuzz targets, used when they are not
 * linked with libFuzzer: ordinary CI runs every checked-in corpus through
 * LLVMFuzzerTestOneInput under ASan + UBSan.
 *
 * Usage: fuzz_X_corpus PATH...   each PATH is a file (one input) or a
 *        directory (every regular file in it, in name order, not recursive).
 *        fuzz_X_corpus --random N SEED DIR...   also runs N pseudo-random
 *        mutations of the corpus inputs (byte flips, truncations, splices),
 *        deterministic for a given SEED, printed so a failure replays.
 * Exits 1 when no input was run (a missing corpus is a failure, not a pass);
 * a finding aborts inside the target, which fails the run with a stack trace.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct blob {
    uint8_t *data;
    size_t size;
} blob;

static blob *inputs;
static size_t n_inputs, cap_inputs;

static void die(const char *what, const char *path)
{
    fprintf(stderr, "driver: %s: %s\n", what, path);
    exit(1);
}

static void load_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open", path);
    blob b = {NULL, 0};
    size_t cap = 0;
    for (;;) {
        if (b.size == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *grown = realloc(b.data, cap);
            if (!grown)
                die("out of memory reading", path);
            b.data = grown;
        }
        size_t got = fread(b.data + b.size, 1, cap - b.size, f);
        if (got == 0)
            break;
        b.size += got;
    }
    if (ferror(f))
        die("cannot read", path);
    fclose(f);
    if (n_inputs == cap_inputs) {
        cap_inputs = cap_inputs ? 2 * cap_inputs : 64;
        blob *grown = realloc(inputs, cap_inputs * sizeof *grown);
        if (!grown)
            die("out of memory listing", path);
        inputs = grown;
    }
    inputs[n_inputs++] = b;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void load_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        die("no such file or directory", path);
    if (!S_ISDIR(st.st_mode)) {
        load_file(path);
        return;
    }
    DIR *d = opendir(path);
    if (!d)
        die("cannot open directory", path);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, cap * sizeof *grown);
            if (!grown)
                die("out of memory listing", path);
            names = grown;
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len)))
            die("out of memory listing", path);
        snprintf(names[n], len, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n; i++) {
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode))
            load_file(names[i]);
        free(names[i]);
    }
    free(names);
}

/* splitmix64: the driver's own generator, so it depends on nothing under test. */
static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* One mutation of a corpus input: flips, overwrites, truncation or a splice. */
static void run_mutant(uint64_t *s)
{
    const blob *a = &inputs[next(s) % n_inputs];
    const blob *b = &inputs[next(s) % n_inputs];
    size_t size = a->size + b->size + 8;
    uint8_t *buf = malloc(size);
    if (!buf)
        die("out of memory", "mutant");
    memcpy(buf, a->data, a->size);
    size = a->size;
    switch (next(s) % 4) {
    case 0: /* truncate */
        size = size ? (size_t)(next(s) % size) : 0;
        break;
    case 1: /* splice a tail of b */
        if (b->size) {
            size_t from = (size_t)(next(s) % b->size);
            size = size ? (size_t)(next(s) % size) : 0;
            memcpy(buf + size, b->data + from, b->size - from);
            size += b->size - from;
        }
        break;
    default: /* a few byte overwrites */
        for (int k = 0, n = 1 + (int)(next(s) % 8); size && k < n; k++)
            buf[next(s) % size] = (uint8_t)next(s);
        break;
    }
    LLVMFuzzerTestOneInput(buf, size);
    free(buf);
}

int main(int argc, char **argv)
{
    unsigned long long mutants = 0;
    uint64_t seed = 0;
    int first = 1;
    if (argc > 3 && strcmp(argv[1], "--random") == 0) {
        mutants = strtoull(argv[2], NULL, 10);
        seed = strtoull(argv[3], NULL, 10);
        first = 4;
    }
    for (int i = first; i < argc; i++)
        load_path(argv[i]);
    if (n_inputs == 0) {
        fprintf(stderr, "driver: no inputs given\n");
        return 1;
    }
    for (size_t i = 0; i < n_inputs; i++)
        LLVMFuzzerTestOneInput(inputs[i].data, inputs[i].size);
    printf("%s: ran %zu corpus inputs\n", argv[0], n_inputs);
    if (mutants) {
        printf("%s: %llu mutants, seed %" PRIu64 " (replay: %s --random %llu %" PRIu64 " ...)\n",
               argv[0], mutants, seed, argv[0], mutants, seed);
        fflush(stdout);
        uint64_t s = seed;
        for (unsigned long long k = 0; k < mutants; k++)
            run_mutant(&s);
    }
    for (size_t i = 0; i < n_inputs; i++)
        free(inputs[i].data);
    free(inputs);
    return 0;
}
