/* SPDX-License-Identifier: MIT */
/*
 * npy_file.h - writes .npy files the way numpy.save does (version 1.0, C
 * order, header padded to a multiple of 64 bytes): a header for any float
 * dtype (test_qk writes two arrays back to back), or a whole float32 array
 * (tests and fuzz targets that hold an in-memory trace to the .npy reader).
 * Little-endian hosts only (the data is written as it lies).
 */
#ifndef KVE_NPY_FILE_H
#define KVE_NPY_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* A version 1.0 header for dtype `descr` ("<f4", "<f8") and shape
 * dims[0 .. ndim) (ndim 1 to 4) as numpy.save writes it: "(3,)", "(2, 3)",
 * padded so the data starts on a multiple of 64 bytes. Returns 0, or -1 on
 * an I/O error. */
static inline int npy_put_header(FILE *f, const char *descr, const size_t *dims, size_t ndim)
{
    char shape[128] = "(";
    for (size_t i = 0; i < ndim; i++)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%zu%s", dims[i],
                 ndim == 1 ? ",)" : i + 1 < ndim ? ", " : ")");
    char text[256];
    int len = snprintf(text, sizeof text, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                       descr, shape);
    int pad = (64 - (10 + len + 1) % 64) % 64;
    unsigned hl = (unsigned)(len + pad + 1);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff),
                             (unsigned char)(hl >> 8)};
    int ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre &&
             fwrite(text, 1, (size_t)len, f) == (size_t)len;
    for (int i = 0; ok && i < pad; i++)
        ok = fputc(' ', f) != EOF;
    return ok && fputc('\n', f) != EOF ? 0 : -1;
}

/* Writes `data`, of shape dims[0 .. ndim) (ndim 1 to 4), to `path`.
 * Returns 0 on success, -1 on any I/O error. */
static inline int npy_write_f4(const char *path, const size_t *dims, size_t ndim,
                               const float *data)
{
    uint64_t elems = 1;
    for (size_t i = 0; i < ndim; i++)
        elems *= dims[i];
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = npy_put_header(f, "<f4", dims, ndim) == 0 &&
             (elems == 0 || fwrite(data, sizeof *data, (size_t)elems, f) == elems);
    return fclose(f) == 0 && ok ? 0 : -1;
}

#endif /* KVE_NPY_FILE_H */
