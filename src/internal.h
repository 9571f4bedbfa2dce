/* SPDX-License-Identifier: MIT */
/*
 * internal.h - what every library file shares and nothing public sees:
 * error reporting, the allocation hook, and the spec parser.
 *
 * Invariants:
 *  - Every failure goes through kve__fail(), so a non-OK status always comes
 *    with a message in this thread's kve_last_error().
 *  - Every allocation goes through kve__malloc/kve__calloc/kve__realloc, so a
 *    test can make the k-th allocation fail (kve__alloc_fail_after).
 */
#ifndef KVE_INTERNAL_H
#define KVE_INTERNAL_H

#include "kvevict.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define KVE_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define KVE_COLD __attribute__((cold)) /* refusals: kept off the hot paths */
#else
#define KVE_PRINTF(fmt, args)
#define KVE_COLD
#endif

/* ---- errors (error.c) ---- */

/* Formats the thread's error message and returns `s`. */
kve_status kve__fail(kve_status s, const char *fmt, ...) KVE_PRINTF(2, 3) KVE_COLD;
#ifdef __clang_analyzer__
/* The static analyser sees one file at a time; this tells it that kve__fail
 * returns `s` (always a constant), so it does not follow impossible
 * "failed but returned KVE_OK" paths. Not compiled into the library. */
#define kve__fail(s, ...) (kve__fail((s), __VA_ARGS__), (s))
#endif

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

void *kve__malloc(size_t n);
void *kve__calloc(size_t count, size_t size);
void *kve__realloc(void *ptr, size_t n);
void kve__free(void *ptr);

/* Test hook: after `k` more successful allocations, every allocation in this
 * thread fails until the hook is reset with k = SIZE_MAX (the default).
 * Returns the number of allocations made since the last call. */
size_t kve__alloc_fail_after(size_t k);

/* ---- top-k selection (topk.c) ---- */

typedef struct kve__top_entry {
    double w;
    int32_t pos;
} kve__top_entry;

/* The min(k, m) entries of highest score among score[0 .. m) (entry i at
 * position i), ties to the lower position, into heap[0 .. return) in heap
 * order (not sorted). heap holds min(k, m) entries. O(m log k). */
size_t kve__top_k(const double *score, size_t m, size_t k, kve__top_entry *heap);

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
kve_status kve__spec_split(const char *spec, char name[KVE_NAME_MAX], const char **params);

/* Stores every default in `dst`, then parses `params` (may be NULL) against
 * `defs` and stores the values. `what` prefixes messages ("h2o"). On failure
 * `dst` holds unspecified values; callers parse into a scratch struct. */
kve_status kve__spec_parse(const char *what, const char *params, const kve_param_def *defs,
                           size_t n_defs, void *dst);

/* Parses one value for def `d` into `dst` (same checks as kve__spec_parse). */
kve_status kve__spec_parse_value(const char *what, const kve_param_def *d, const char *text,
                                 size_t len, void *dst);

/* Writes "name:k=v,..." with every def in order (a KVE_PARAM_OMIT_DEFAULT
 * def only when its value differs from the default). Returns the length that the
 * full text needs (like snprintf); the output is truncated past cap. */
size_t kve__spec_format(char *out, size_t cap, const char *name, const kve_param_def *defs,
                        size_t n_defs, const void *src);

#endif /* KVE_INTERNAL_H */
