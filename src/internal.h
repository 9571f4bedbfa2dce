/* SPDX-License-Identifier: MIT */
/*
 * internal.h - what the files of both libraries share and nothing public
 * sees: error reporting, allocation, top-k selection and the spec parser.
 *
 * Invariants:
 *  - Every failure goes through kve__fail() (kve_set_error), so a non-OK
 *    status always comes with a message in this thread's kve_last_error().
 *  - Every allocation goes through kve__alloc and every release through
 *    kve__dealloc with the size it was allocated with, both with the
 *    allocator of the object (or of the call) they are for: every byte
 *    reaches the caller's kve_allocator.
 *  - The functions marked KVE_PRIVATE are the core's private ABI: libkvevict
 *    exports them for libkvevict_eval alone (hidden visibility keeps the
 *    rest in), so one copy of each runs in any program, built shared or
 *    static. They may change in any release: the harness refuses a core of
 *    another version (kve__check_core).
 */
#ifndef KVE_INTERNAL_H
#define KVE_INTERNAL_H

#include "kvevict.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define KVE_COLD __attribute__((cold)) /* refusals: kept off the hot paths */
#else
#define KVE_COLD
#endif
/* The core's private ABI (see the top of this file). */
#define KVE_PRIVATE KVE_API

/* Whether two doubles have the same bits (a saved rope base or rotation
 * against the one a state was built with: 0.0 and -0.0 differ, a NaN equals
 * itself). */
static inline bool kve__same_bits(double a, double b)
{
    uint64_t x, y;
    memcpy(&x, &a, sizeof x);
    memcpy(&y, &b, sizeof y);
    return x == y;
}

/* ---- errors (error.c) ---- */

/* Formats the thread's error message and returns `s`: kve_set_error, the
 * public face of the library's own failures. */
kve_status kve_set_error(kve_status s, const char *fmt, ...) KVE_COLD; /* adds: cold */
#ifdef __clang_analyzer__
/* The static analyser sees one file at a time; this tells it that kve__fail
 * returns `s` (always a constant), so it does not follow impossible
 * "failed but returned KVE_OK" paths. Not compiled into the library. */
#define kve__fail(s, ...) (kve_set_error((s), __VA_ARGS__), (s))
#else
#define kve__fail kve_set_error
#endif

/* For the harness: KVE_OK when the core linked at run time is the version
 * the harness was built with, else KVE_EINVAL naming both. */
static inline kve_status kve__check_core(void)
{
    if (kve_version_number() == KVEVICT_VERSION_NUMBER)
        return KVE_OK;
    return kve__fail(KVE_EINVAL, "kvevict_eval %s needs libkvevict %s, but %s is linked",
                     KVEVICT_VERSION_STRING, KVEVICT_VERSION_STRING, kve_version());
}

/* ---- random numbers ---- */

/* One xoshiro256** step, inline so that hot loops (the canonical trace draws
 * one number per key) pay no call. kve_rng_next is this function. */
static inline uint64_t kve__rng_next_inline(kve_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t x = s[1] * 5;
    uint64_t result = ((x << 7) | (x >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* kve_rng_uniform, inline: the top 53 bits times 2^-53, in [0, 1). */
static inline double kve__rng_uniform_inline(kve_rng *rng)
{
    return (double)(kve__rng_next_inline(rng) >> 11) * 0x1.0p-53;
}

/* ---- allocation (alloc.c) ---- */

/* The allocator an object keeps: a copy of the caller's, or the C
 * library's for NULL (a->fn NULL counts as NULL). */
KVE_PRIVATE kve_allocator kve__allocator(const kve_allocator *a);
/* n bytes (1 when n is 0: the interface never asks for 0) from a, which
 * kve__allocator made; NULL on failure. */
KVE_PRIVATE void *kve__alloc(const kve_allocator *a, size_t n);
/* The same, zeroed. */
KVE_PRIVATE void *kve__alloc_zero(const kve_allocator *a, size_t n);
/* count * size bytes, NULL (nothing allocated) when the product overflows. */
KVE_PRIVATE void *kve__alloc_array(const kve_allocator *a, size_t count, size_t size);
/* Releases p, allocated from a with n bytes (the n given to kve__alloc,
 * kve__alloc_zero, or count * size). NULL is a no-op. */
KVE_PRIVATE void kve__dealloc(const kve_allocator *a, void *p, size_t n);

/* ---- top-k selection (topk.c) ---- */

typedef struct kve__top_entry {
    double w;
    int32_t pos;
} kve__top_entry;

/* The min(k, m) entries of highest score among score[0 .. m) (entry i at
 * position i), ties to the lower position, into heap[0 .. return) in heap
 * order (not sorted). heap holds min(k, m) entries. O(m log k). */
KVE_PRIVATE size_t kve__top_k(const double *score, size_t m, size_t k, kve__top_entry *heap);

/* ---- specs (spec.c) ---- */

/* The grammar is documented in kvevict.h. A param def binds one key to a
 * typed field of a caller struct at `offset`. */
typedef enum kve_param_kind {
    KVE_PARAM_SIZE, /* size_t, decimal digits, in [imin, imax] */
    KVE_PARAM_U64,  /* uint64_t, decimal digits, in [imin, imax] */
    KVE_PARAM_REAL  /* double, finite decimal, in [rmin, rmax] (rmin open if flagged) */
} kve_param_kind;

/* KVE_PARAM_MIN_OPEN: a real's minimum is excluded. KVE_PARAM_OMIT_DEFAULT:
 * the canonical form spells the key only when its value is not the default
 * (keys added after specs were published, so that every spec written before
 * them keeps its canonical text). */
enum { KVE_PARAM_MIN_OPEN = 1u, KVE_PARAM_OMIT_DEFAULT = 2u };

typedef struct kve_param_def {
    const char *key;
    kve_param_kind kind;
    uint64_t idefault, imin, imax; /* integer kinds */
    double rdefault, rmin, rmax;   /* KVE_PARAM_REAL */
    unsigned flags;
    size_t offset; /* offsetof the field in the destination struct */
    const char *doc;
} kve_param_def;

enum { KVE_NAME_MAX = 32 }; /* KVE_SPEC_MAX is public (kvevict.h) */

/* Splits "name[:params]" into name (copied, NUL-terminated) and a pointer to
 * the params text (NULL when there is no ':'). Refuses empty or over-long
 * names and characters outside [a-z0-9_]. */
KVE_PRIVATE kve_status kve__spec_split(const char *spec, char name[KVE_NAME_MAX], const char **params);

/* Stores every default in `dst`, then parses `params` (may be NULL) against
 * `defs` and stores the values. `what` prefixes messages ("h2o"). On failure
 * `dst` holds unspecified values; callers parse into a scratch struct. */
KVE_PRIVATE kve_status kve__spec_parse(const char *what, const char *params, const kve_param_def *defs,
                           size_t n_defs, void *dst);

/* Parses one value for def `d` into `dst` (same checks as kve__spec_parse). */
KVE_PRIVATE kve_status kve__spec_parse_value(const char *what, const kve_param_def *d, const char *text,
                                 size_t len, void *dst);

/* Writes "name:k=v,..." with every def in order (a KVE_PARAM_OMIT_DEFAULT
 * def only when its value differs from the default). Returns the length that the
 * full text needs (like snprintf); the output is truncated past cap. */
KVE_PRIVATE size_t kve__spec_format(char *out, size_t cap, const char *name, const kve_param_def *defs,
                        size_t n_defs, const void *src);

#endif /* KVE_INTERNAL_H */
