/* SPDX-License-Identifier: MIT */
/*
 * npy_file.h - writes a float32 array as a version 1.0 .npy file, the way
 * numpy.save does ('<f4', C order, header padded to a multiple of 64
 * bytes), for tests and fuzz targets that hold an in-memory trace to the
 * .npy reader. Little-endian hosts only (the data is written as it lies).
 */
#ifndef KVE_NPY_FILE_H
#define KVE_NPY_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Writes `data`, of shape dims[0 .. ndim) (ndim 1 to 4), to `path`.
 * Returns 0 on success, -1 on any I/O error. */
static inline int npy_write_f4(const char *path, const size_t *dims, size_t ndim,
                               const float *data)
{
    char header[192];
    size_t len = (size_t)snprintf(header, sizeof header,
                                  "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    uint64_t elems = 1;
    for (size_t i = 0; i < ndim; i++) {
        len += (size_t)snprintf(header + len, sizeof header - len, "%zu, ", dims[i]);
        elems *= dims[i];
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "), }");
    size_t padded = (10 + len + 1 + 63) / 64 * 64; /* preamble + header + '\n' */
    memset(header + len, ' ', padded - 10 - len - 1);
    header[padded - 10 - 1] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             (unsigned char)((padded - 10) & 0xff),
                             (unsigned char)((padded - 10) >> 8)};
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre &&
             fwrite(header, 1, padded - 10, f) == padded - 10 &&
             (elems == 0 || fwrite(data, sizeof *data, (size_t)elems, f) == elems);
    return fclose(f) == 0 && ok ? 0 : -1;
}

#endif /* KVE_NPY_FILE_H */
