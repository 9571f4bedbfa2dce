/* SPDX-License-Identifier: MIT */
/*
 * trace_impl.h - the kve_trace object and the table of trace sources behind
 * it, shared by trace.c (public entry points, dispatch), the sources
 * (trace_canonical.c: the synthetic generator; npy.c: the .npy reader;
 * trace_memory.c: the caller's float32 array; trace_callback.c: the
 * caller's callbacks), the .npy writer (npy.c) and
 * the q/K reader (trace_qk.c). Nothing outside those files sees it.
 *
 * A source is one kve_trace_source_type (prefix, open, row, free), in the
 * manner of the policies' function tables: a new source (a q/K trace, a
 * model) is one file defining its table and one line in trace.c's list.
 *
 * Memory. A source allocates its state with kve__trace_malloc/calloc: blocks
 * the trace owns, taken from the trace's allocator (the caller's
 * kve_allocator, copied when the trace was made), each carrying its size so
 * it goes back with exactly that size. kve_trace_free releases every block
 * left, and a failed open every block the source made, so a source frees
 * only what it is done with early (scratch) and never tracks sizes; its
 * `free` releases what is not memory (an open file).
 *
 * Invariants:
 *  - steps >= 1, heads >= 1, layers >= 1, layers divides heads, and
 *    heads * steps * steps fits in 64 bits.
 *  - `source` is owned, NUL-terminated and never NULL.
 *  - `type` and `impl` are set together by the source's open; impl is owned
 *    by the trace and released by type->free.
 *  - A row function is called with head < heads and t < steps already
 *    checked; it writes row[0 .. t] and nothing else.
 * Memory: O(steps) per trace (a q/K trace: O(steps * d); a live trace one
 * step of every head, O(heads * steps)), whatever the source: the library
 * never holds a T x T matrix (the memory source reads the caller's, which
 * it borrows).
 */
#ifndef KVE_TRACE_IMPL_H
#define KVE_TRACE_IMPL_H

#include "internal.h"
#include "kvevict_eval.h"

#include <stdio.h>

typedef struct kve_trace_source_type {
    /* The source text this source opens: "NAME" or "NAME:PARAMS" for a
     * prefix NAME; NULL for the fallback (any other text is a path), which
     * must come last in the list. */
    const char *prefix;
    /* Opens `arg` (PARAMS or NULL for a prefixed source, the path for the
     * fallback) with flags (KVE_TRACE_NORMALIZE), reporting progress through
     * progress(user, ...) when not NULL. Fills tr->steps/heads/layers/
     * source/impl, all its memory blocks of tr. On failure nothing stays
     * open; the caller releases the blocks. */
    kve_status (*open)(const char *arg, unsigned flags, kve_progress_fn progress, void *user,
                       kve_trace *tr);
    /* NULL open: the source is made by a constructor of its own (memory,
     * callback), and its prefix is reserved: kve_trace_open refuses it,
     * saying "PREFIX: MADE_BY, not opened by name" with this text. */
    const char *made_by;
    /* Row t of head `head` into row[0 .. t]. O(t) (a q/K trace: O(t d)). */
    kve_status (*row)(void *impl, size_t head, size_t t, double *row);
    /* The key of position t of head `head` into key[0 .. key_dim); NULL for
     * a source without keys (key_dim 0). */
    kve_status (*key)(void *impl, size_t head, size_t t, float *key);
    /* Releases what impl holds besides memory (an open file); NULL: nothing
     * to release. Called with impl NULL too. The blocks go with the trace. */
    void (*free)(void *impl);
} kve_trace_source_type;

typedef struct kve__block kve__block; /* a block of a trace's memory (trace.c) */

struct kve_trace {
    const kve_trace_source_type *type;
    void *impl;          /* the source's state */
    size_t steps;        /* T */
    size_t heads;        /* L * H */
    size_t layers;       /* L */
    size_t key_dim;      /* d of the keys (kve_trace_key); 0: the source has none */
    char *source;        /* canonical spec or path */
    kve_allocator alloc; /* every byte of the trace: the caller's, copied */
    kve__block *blocks;  /* the blocks the trace owns, most recent first */
};

/* n bytes (or count * size, zeroed; NULL when the product overflows) that
 * `tr` owns, through its allocator; NULL on failure. */
void *kve__trace_malloc(kve_trace *tr, size_t n);
void *kve__trace_calloc(kve_trace *tr, size_t count, size_t size);
/* Returns a block of tr's to its allocator early. NULL is a no-op. */
void kve__trace_free(kve_trace *tr, void *p);

/* A new trace handle (*out, not NULL) with options (NULL: the defaults) checked, for
 * kve_trace_open and kve_trace_from_memory; kve__trace_discard releases a
 * handle whose source failed or never started (every block included). */
kve_status kve__trace_new(const kve_trace_options *options, const char *what, kve_trace **out);
/* What kve__trace_new checks first (the core's version, the flags), which
 * allocates nothing; `what` prefixes the messages. */
kve_status kve__trace_check_options(const kve_trace_options *options, const char *what);
void kve__trace_discard(kve_trace *tr);

/* The sources, one per file. */
extern const kve_trace_source_type kve__canonical_source; /* trace_canonical.c */
extern const kve_trace_source_type kve__qk_source;        /* trace_qk.c */
extern const kve_trace_source_type kve__memory_source;    /* trace_memory.c */
extern const kve_trace_source_type kve__callback_source;  /* trace_callback.c */
extern const kve_trace_source_type kve__npy_source;       /* npy.c */

/* ---- the .npy reading both file sources share (npy.c) ---- */

/* A parsed .npy header: dtype (itemsize 4: '<f4', 8: '<f8'), C order, and a
 * shape of 1 to 4 dimensions (each checked only against overflow). */
typedef struct kve__npy_header {
    int have_descr, have_order, have_shape;
    size_t itemsize;
    size_t ndim;
    uint64_t dims[4];
} kve__npy_header;

/* Parses the preamble and header of the array that starts `at` bytes into
 * the open file f of `size` bytes; *data_offset is where its data starts
 * (from the start of the file). KVE_EFORMAT naming `path` and what is
 * wrong, KVE_EIO, KVE_ENOMEM. Its scratch is a block of tr's, freed before
 * it returns. */
kve_status kve__npy_read_header(kve_trace *tr, FILE *f, const char *path, uint64_t at,
                                uint64_t size, kve__npy_header *h, uint64_t *data_offset);
/* Opens the regular file at `path` for reading: *f and its *size; KVE_EIO
 * with the system's reason (or "not a regular file") otherwise. */
kve_status kve__npy_open_file(const char *path, FILE **f, uint64_t *size);
/* Reads n bytes at `offset`; KVE_EIO naming `what` on failure. */
kve_status kve__npy_read_at(FILE *f, const char *path, uint64_t offset, void *buf, size_t n,
                            const char *what);
/* The little-endian float32 (itemsize 4) or float64 (8) at p. */
double kve__npy_decode(const unsigned char *p, size_t itemsize);
/* The system's reason for errno `err`, thread-safely (XSI strerror_r). */
const char *kve__reason(int err, char *buf, size_t cap);

/* What every source of recorded attention (a .npy file, the caller's
 * memory) accepts as row t of head h, held in row[0 .. t]: every weight
 * finite and >= 0; with KVE_TRACE_NORMALIZE a sum that is > 0 and finite,
 * else (t >= 1) a sum within 1e-3 of 1. Returns the sum (in key order, in
 * double) in *sum; refuses with KVE_EFORMAT and a message that starts with
 * `what` (the path, "memory") and names the head (its layer and head in the
 * layer when layers > 1), the row and the key. O(t). */
kve_status kve__trace_check_row(const char *what, size_t heads, size_t layers, unsigned flags,
                                size_t h, size_t t, const double *row, double *sum);

/* The .npy writer (npy.c): head `head` of any trace as a [T, T] float32
 * v1.0 .npy, to an open stream. */
kve_status kve__npy_write_file(kve_trace *tr, size_t head, FILE *f, kve_progress_fn progress,
                               void *user);
/* The size of what kve__npy_write_file writes for T steps. */
uint64_t kve__npy_bytes(size_t steps);

#endif /* KVE_TRACE_IMPL_H */
