/* SPDX-License-Identifier: MIT */
/*
 * state_image.h - a second reader of the state images of kve_policy_save
 * and kve_bank_save, written from the table of docs/api.md ("State
 * images"), not from src/image.c: every field at its documented offset (the
 * block after the spec of versions 2 and 3 included), each
 * scalar assembled from its bytes, little-endian. For the tests and
 * fuzz_state, which hold the library to the documented format and build the
 * naive reference model (reference.h) of each head of an image the library
 * accepted. Header only; it validates nothing beyond what it needs to read.
 *
 *   int img_header(const uint8_t *img, size_t n, img_hdr *h);
 *       The header's fields; 0, or -1 when n is shorter than the header.
 *   uint64_t img_fnv1a(const uint8_t *p, size_t n);     the checksum's hash
 *   void img_reseal(uint8_t *img, size_t n);
 *       Rewrites the size field as n and the checksum of img[0 .. n - 8):
 *       what a test does after changing a field on purpose.
 *   size_t img_head_at(const uint8_t *img, const img_hdr *h, size_t head);
 *       The offset of head's record (records assumed to fit).
 *   ref_policy *img_ref(const uint8_t *img, const img_hdr *h, size_t head);
 *       The reference model holding head's state (an image the library
 *       accepted; NULL when reference.h does not know the spec).
 *   int ref_same(const ref_policy *a, const ref_policy *b);
 *       0 when a and b hold the same state, score bits included: kept
 *       positions, ref_score of every slot, last position, and the fields a
 *       policy keeps (sums and counts, votes, unit keys, the generator).
 */
#ifndef KVE_STATE_IMAGE_H
#define KVE_STATE_IMAGE_H

#include "reference.h"

#include <stdint.h>
#include <string.h>

enum { IMG_HEADER = 72, IMG_HEAD = 64, IMG_CHECKSUM = 8 };

typedef struct img_hdr {
    uint32_t version, kind; /* at 8, 12 */
    uint64_t size;          /* at 16 */
    uint64_t n_heads;       /* at 24 */
    uint64_t key_dim;       /* at 32 */
    uint64_t share;         /* at 40 */
    double min_share;       /* at 48 */
    uint32_t col[3];        /* at 56, 60, 64: bytes a slot of score, extra0, extra1 */
    uint32_t spec_len;      /* at 68 */
    char spec[256];         /* at 72 */
    size_t ext;             /* bytes after the spec: 0 (version 1), 48 (2: the methods'
                               block), 56 (3: that block and the bank's flags) */
    uint32_t raw, vnorm;    /* versions 2 and 3: bytes a slot of the raw scores and
                               value norms (block + 36, + 40) */
    uint32_t aux;           /* versions 2 and 3: P, a head's policy state (block + 44) */
    uint64_t flags;         /* version 3: the bank's flags (block + 48; bit 0
                               same_positions) */
} img_hdr;

static inline uint64_t img_le(const uint8_t *p, int w)
{
    uint64_t v = 0;
    for (int i = w - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline void img_put(uint8_t *p, uint64_t v, int w)
{
    for (int i = 0; i < w; i++, v >>= 8)
        p[i] = (uint8_t)(v & 0xff);
}

static inline uint64_t img_fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 14695981039346656037u;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211u;
    }
    return h;
}

static inline void img_reseal(uint8_t *img, size_t n)
{
    if (n < 24)
        return;
    img_put(img + 16, n, 8);
    if (n >= IMG_CHECKSUM)
        img_put(img + n - 8, img_fnv1a(img, n - 8), 8);
}

static inline int img_header(const uint8_t *img, size_t n, img_hdr *h)
{
    if (n < IMG_HEADER)
        return -1;
    h->version = (uint32_t)img_le(img + 8, 4);
    h->kind = (uint32_t)img_le(img + 12, 4);
    h->size = img_le(img + 16, 8);
    h->n_heads = img_le(img + 24, 8);
    h->key_dim = img_le(img + 32, 8);
    h->share = img_le(img + 40, 8);
    uint64_t bits = img_le(img + 48, 8);
    memcpy(&h->min_share, &bits, 8);
    for (int k = 0; k < 3; k++)
        h->col[k] = (uint32_t)img_le(img + 56 + 4 * k, 4);
    h->spec_len = (uint32_t)img_le(img + 68, 4);
    size_t len = h->spec_len < sizeof h->spec ? h->spec_len : sizeof h->spec - 1;
    if (IMG_HEADER + len > n)
        len = n - IMG_HEADER;
    memcpy(h->spec, img + IMG_HEADER, len);
    h->spec[len] = '\0';
    h->ext = h->version == 3 ? 56 : h->version == 2 ? 48 : 0;
    h->raw = h->vnorm = h->aux = 0;
    h->flags = 0;
    const size_t at = IMG_HEADER + h->spec_len;
    if (h->ext && at + h->ext <= n) {
        h->raw = (uint32_t)img_le(img + at + 36, 4);
        h->vnorm = (uint32_t)img_le(img + at + 40, 4);
        h->aux = (uint32_t)img_le(img + at + 44, 4);
        if (h->version == 3)
            h->flags = img_le(img + at + 48, 8);
    }
    return 0;
}

static inline size_t img_slot_bytes(const img_hdr *h)
{
    return 4 + (size_t)h->col[0] + h->col[1] + h->col[2] + h->raw + h->vnorm;
}

static inline size_t img_head_at(const uint8_t *img, const img_hdr *h, size_t head)
{
    size_t off = IMG_HEADER + h->spec_len + h->ext;
    for (size_t k = 0; k < head; k++)
        off += IMG_HEAD + (size_t)img_le(img + off, 8) * img_slot_bytes(h) + h->aux;
    return off;
}

static inline double img_f64(const uint8_t *p)
{
    uint64_t bits = img_le(p, 8);
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

static inline ref_policy *img_ref(const uint8_t *img, const img_hdr *h, size_t head)
{
    kve_rng unused = {{1, 2, 3, 4}};
    ref_policy *r = ref_new_keys(h->spec, &unused, (size_t)h->key_dim);
    if (!r)
        return NULL;
    const uint8_t *p = img + img_head_at(img, h, head);
    size_t n = (size_t)img_le(p, 8);
    uint64_t observed = img_le(p + 8, 8);
    int32_t last = (int32_t)(uint32_t)img_le(p + 16, 4);
    uint32_t flags = (uint32_t)img_le(p + 20, 4);
    r->seed = img_le(p + 24, 8);
    for (int k = 0; k < 4; k++)
        r->rng[k] = img_le(p + 32 + 8 * k, 8);
    r->last = flags & 1 ? last : -1;
    r->slot = calloc(n ? n : 1, sizeof *r->slot);
    if (!r->slot)
        abort();
    r->n = n;
    r->cap = n ? n : 1;
    r->admitted = n;
    const uint8_t *pos = p + IMG_HEAD, *score = pos + 4 * n, *x0 = score + h->col[0] * (size_t)n;
    const uint8_t *x1 = x0 + h->col[1] * (size_t)n;
    for (size_t i = 0; i < n; i++) {
        ref_slot *s = &r->slot[i];
        s->pos = (int32_t)(uint32_t)img_le(pos + 4 * i, 4);
        s->sink = i < r->sinks;
        if (h->col[0])
            s->acc = img_f64(score + 8 * i);
        if (r->kind == REF_H2O_MEAN) {
            s->acc = img_f64(x0 + 8 * i);                                 /* sum */
            s->count = (uint32_t)((uint32_t)observed - (uint32_t)img_le(x1 + 4 * i, 4)); /* birth */
        } else if (r->kind == REF_SCISSORHANDS && r->history) {
            uint64_t v = img_le(x0 + 8 * i, 8);
            for (int k = 0; k < REF_MAX_HISTORY; k++)
                s->votes[k] = (unsigned char)(v >> k & 1);
        } else if (r->kind == REF_KEYDIFF) {
            s->unit = malloc(r->dim * sizeof(float));
            if (!s->unit)
                abort();
            for (size_t j = 0; j < r->dim; j++) {
                uint32_t bits = (uint32_t)img_le(x0 + 4 * (i * r->dim + j), 4);
                memcpy(&s->unit[j], &bits, 4);
            }
        }
    }
    return r;
}

static inline int ref_same(const ref_policy *a, const ref_policy *b)
{
    if (a->kind != b->kind || a->n != b->n || a->last != b->last)
        return -1;
    if (a->kind == REF_RANDOM && memcmp(a->rng, b->rng, sizeof a->rng) != 0)
        return -2;
    for (size_t i = 0; i < a->n; i++) {
        const ref_slot *x = &a->slot[i], *y = &b->slot[i];
        double sx = ref_score(a, i), sy = ref_score(b, i);
        if (x->pos != y->pos || memcmp(&sx, &sy, sizeof sx) != 0 || x->sink != y->sink)
            return 1 + (int)i;
        if (a->kind == REF_H2O_MEAN &&
            (memcmp(&x->acc, &y->acc, sizeof x->acc) != 0 || x->count != y->count))
            return 1 + (int)i;
        if (a->kind == REF_SCISSORHANDS && a->history &&
            memcmp(x->votes, y->votes, a->history) != 0)
            return 1 + (int)i;
        if (a->kind == REF_KEYDIFF && memcmp(x->unit, y->unit, a->dim * sizeof(float)) != 0)
            return 1 + (int)i;
    }
    return 0;
}

#endif /* KVE_STATE_IMAGE_H */
