/* SPDX-License-Identifier: MIT */
/*
 * image.c - the state of a policy or a bank as bytes: kve_*_save writes an
 * image, kve_*_load builds a new object from one. docs/api.md ("State
 * images") gives the layout byte for byte; in short:
 *
 *   header   magic, version, kind, size, heads, key_dim, share, min_share,
 *            the bytes a slot of each stored column, the canonical spec
 *   heads    per head: size, steps observed, last position, flags, the
 *            generator's seed and state, then its columns, each whole:
 *            positions, scores, the policy's two columns, in kept order
 *   checksum FNV-1a (64 bits) of every byte before it
 *
 * Invariants:
 *  - Every scalar is little-endian, written and read byte by byte through
 *    shifts, whatever the machine (on a little-endian one a column is
 *    copied whole, which gives the same bytes; kve__image_force_bytewise
 *    lets the tests compare); a column's scalars are its unit bytes each
 *    (kve_config.unit). No struct is ever copied into an image.
 *  - An image holds the state normalised: columns dense (the lazy gap
 *    closed), no sliding offset, no cached victim (the next evict finds the
 *    same one by a scan), no marks, no per-head scratch (keydiff's sum is
 *    recomputed by every step), no capacity. So one state has one image:
 *    saving a copy, a clone or a loaded object gives the same bytes.
 *  - Load trusts nothing: it checks the magic, version, kind, size and
 *    checksum, then the header against the spec's own layout, every length
 *    before it allocates (so an image can make it allocate no more than
 *    about its own size), then every head (flags, generator, positions,
 *    scores, and the policy's columns through its type's check_state), and
 *    refuses with KVE_EINVAL and a message naming the field; the object it
 *    was building is freed, and *out is untouched.
 *  - Version: VERSION below. A layout or meaning that changes gets a new
 *    version, and load reads each version it documents (converting the
 *    older), refusing the others by number.
 * Cost: save O(bytes of the image) (the checksum reads them once more);
 * load the same plus the policy's checks (keydiff: O(kept * d)).
 */
#include "policy_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum {
    VERSION = 1,     /* of the layout below */
    KIND_POLICY = 1, /* kve_policy_save */
    KIND_BANK = 2,   /* kve_bank_save */
    HEADER = 72,     /* bytes before the spec */
    HEAD = 64,       /* bytes of a head's record before its columns */
    CHECKSUM = 8
};

/* \x89 k v e \r \n \x1a \n: a byte above 127 first and both line endings
 * (PNG's device), so a transfer that alters text is caught at once. */
static const uint8_t magic[8] = {0x89, 'k', 'v', 'e', '\r', '\n', 0x1a, '\n'};

/* The stored columns in image order: pos, score, extra0, extra1 (marks are
 * scratch). */
static const int stored[] = {KVE_COL_POS, KVE_COL_SCORE, KVE_COL_EXTRA0, KVE_COL_EXTRA1};
enum { N_STORED = sizeof stored / sizeof stored[0] };

static bool bytewise;

void kve__image_force_bytewise(bool on)
{
    bytewise = on;
}

/* Whether a column's bytes in memory are already its image: a little-endian
 * machine (asked of the machine itself, not of the compiler). */
static bool native_is_image(void)
{
    const uint32_t one = 1;
    uint8_t low;
    memcpy(&low, &one, 1);
    return low == 1 && !bytewise;
}

/* ---- scalars ---- */

static void put_le(uint8_t *p, uint64_t v, size_t w)
{
    for (size_t i = 0; i < w; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, size_t w)
{
    uint64_t v = 0;
    for (size_t i = 0; i < w; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* A w-byte scalar of memory (native order), and back. */
static uint64_t load_native(const uint8_t *p, size_t w)
{
    uint16_t a;
    uint32_t b;
    uint64_t c;
    switch (w) {
    case 2: memcpy(&a, p, 2); return a;
    case 4: memcpy(&b, p, 4); return b;
    case 8: memcpy(&c, p, 8); return c;
    default: return p[0];
    }
}

static void store_native(uint8_t *p, uint64_t v, size_t w)
{
    uint16_t a = (uint16_t)v;
    uint32_t b = (uint32_t)v;
    switch (w) {
    case 2: memcpy(p, &a, 2); break;
    case 4: memcpy(p, &b, 4); break;
    case 8: memcpy(p, &v, 8); break;
    default: p[0] = (uint8_t)v; break;
    }
}

/* `bytes` bytes of scalars of w bytes: memory to image, image to memory. */
static uint8_t *put_scalars(uint8_t *out, const void *from, size_t bytes, size_t w)
{
    const uint8_t *s = from;
    if (w == 1 || native_is_image())
        memcpy(out, s, bytes);
    else
        for (size_t i = 0; i < bytes; i += w)
            put_le(out + i, load_native(s + i, w), w);
    return out + bytes;
}

static const uint8_t *get_scalars(void *to, const uint8_t *in, size_t bytes, size_t w)
{
    uint8_t *d = to;
    if (w == 1 || native_is_image())
        memcpy(d, in, bytes);
    else
        for (size_t i = 0; i < bytes; i += w)
            store_native(d + i, get_le(in + i, w), w);
    return in + bytes;
}

static uint8_t *put_u32(uint8_t *p, uint32_t v)
{
    put_le(p, v, 4);
    return p + 4;
}

static uint8_t *put_u64(uint8_t *p, uint64_t v)
{
    put_le(p, v, 8);
    return p + 8;
}

/* FNV-1a, 64 bits: h = 14695981039346656037; h = (h ^ byte) * 1099511628211. */
static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

/* ---- save ---- */

/* Image bytes of one slot: every stored column's. */
static size_t slot_image_bytes(const kve_config *c)
{
    size_t n = 0;
    for (int k = 0; k < N_STORED; k++)
        n += c->elem[stored[k]];
    return n;
}

static size_t image_bytes(const kve_bank *b)
{
    size_t n = HEADER + strlen(b->cfg.spec) + CHECKSUM, slot = slot_image_bytes(&b->cfg);
    for (size_t h = 0; h < b->n_heads; h++)
        n += HEAD + b->heads[h].size * slot;
    return n;
}

static uint8_t *put_head(const kve_config *c, const kve_head *h, uint8_t *p)
{
    p = put_u64(p, h->size);
    p = put_u64(p, h->observed);
    p = put_u32(p, (uint32_t)(h->any_pos ? h->last_pos : 0));
    p = put_u32(p, h->any_pos ? 1u : 0u);
    p = put_u64(p, h->seed);
    for (int k = 0; k < 4; k++)
        p = put_u64(p, h->rng.s[k]);
    const size_t n = h->size, g = h->gap < n ? h->gap : n;
    for (int k = 0; k < N_STORED; k++) {
        const int col = stored[k];
        const size_t e = c->elem[col], u = c->unit[col];
        const char *from = h->col[col];
        if (!e)
            continue;
        if (col == KVE_COL_POS || g == n) {
            p = put_scalars(p, from, n * e, u);
        } else { /* a lazy column: slot i at i + (i >= gap) */
            p = put_scalars(p, from, g * e, u);
            p = put_scalars(p, from + (g + 1) * e, (n - g) * e, u);
        }
    }
    return p;
}

static kve_status save(const kve_bank *b, uint32_t kind, void *buf, size_t cap, size_t *size)
{
    const kve_config *c = &b->cfg;
    if (!size)
        return kve__fail(KVE_EINVAL, "%s: size is NULL", c->type->name);
    const size_t need = image_bytes(b), len = strlen(c->spec);
    if (!buf) {
        *size = need;
        return KVE_OK;
    }
    if (cap < need) {
        *size = need;
        return kve__fail(KVE_ERANGE, "%s: the image needs %zu bytes but cap is %zu", c->type->name,
                         need, cap);
    }
    uint8_t *p = buf;
    memcpy(p, magic, sizeof magic);
    p = put_u32(p + 8, VERSION);
    p = put_u32(p, kind);
    p = put_u64(p, need);
    p = put_u64(p, b->n_heads);
    p = put_u64(p, c->key_dim);
    p = put_u64(p, b->share);
    uint64_t bits;
    memcpy(&bits, &b->min_share, sizeof bits);
    p = put_u64(p, bits);
    for (int k = 1; k < N_STORED; k++)
        p = put_u32(p, (uint32_t)c->elem[stored[k]]);
    p = put_u32(p, (uint32_t)len);
    memcpy(p, c->spec, len);
    p += len;
    for (size_t h = 0; h < b->n_heads; h++)
        p = put_head(c, &b->heads[h], p);
    put_u64(p, fnv1a(buf, need - CHECKSUM));
    *size = need;
    return KVE_OK;
}

kve_status kve_bank_save(const kve_bank *b, void *buf, size_t cap, size_t *size)
{
    if (!b)
        return kve__fail(KVE_EINVAL, "bank is NULL");
    return save(b, KIND_BANK, buf, cap, size);
}

kve_status kve_policy_save(const kve_policy *p, void *buf, size_t cap, size_t *size)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    return save(&p->bank, KIND_POLICY, buf, cap, size);
}

/* ---- load ---- */

/* "image: <message>": what every refusal of an image says. */
KVE_COLD static kve_status bad(const char *fmt, ...) KVE_PRINTF(1, 2);
KVE_COLD static kve_status bad(const char *fmt, ...)
{
    char msg[224];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kve__fail(KVE_EINVAL, "image: %s", msg);
}

/* "image: head H: <message>" (a policy's image: no head). */
KVE_COLD static kve_status bad_head(const kve_bank *b, size_t head, const char *fmt, ...)
    KVE_PRINTF(3, 4);
KVE_COLD static kve_status bad_head(const kve_bank *b, size_t head, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (b->is_policy)
        return bad("%s", msg);
    return bad("head %zu: %s", head, msg);
}

/* The header's fields, read and checked against the spec they name. */
typedef struct header {
    uint32_t kind;
    size_t n_heads;
    kve_config cfg;
    kve_bank_options opt;
    size_t body; /* offset of the first head's record */
} header;

static kve_status read_header(const uint8_t *in, size_t size, uint32_t want, header *hd)
{
    static const char *const kinds[] = {"", "a policy", "a bank"};
    if (size < HEADER + CHECKSUM)
        return bad("%zu bytes, fewer than the %d of an image's header and checksum (truncated?)",
                   size, HEADER + CHECKSUM);
    if (memcmp(in, magic, sizeof magic) != 0)
        return bad("not a kvevict state image (magic: its first 8 bytes differ)");
    uint32_t version = (uint32_t)get_le(in + 8, 4);
    if (version != VERSION)
        return bad("version %lu, but this library (kvevict %s) reads version %d",
                   (unsigned long)version, kve_version(), VERSION);
    uint32_t kind = (uint32_t)get_le(in + 12, 4);
    if (kind != KIND_POLICY && kind != KIND_BANK)
        return bad("kind %lu is neither 1 (a policy) nor 2 (a bank)", (unsigned long)kind);
    if (kind != want)
        return bad("kind %lu: %s's image, to load with kve_%s_load", (unsigned long)kind,
                   kinds[kind], kind == KIND_BANK ? "bank" : "policy");
    uint64_t total = get_le(in + 16, 8);
    if (total != size)
        return bad("size %llu, but %zu bytes were given", (unsigned long long)total, size);
    uint64_t sum = get_le(in + size - CHECKSUM, 8), got = fnv1a(in, size - CHECKSUM);
    if (sum != got)
        return bad("checksum %016llx, but the bytes hash to %016llx (corrupted)",
                   (unsigned long long)sum, (unsigned long long)got);
    uint64_t n_heads = get_le(in + 24, 8), key_dim = get_le(in + 32, 8);
    uint64_t share = get_le(in + 40, 8), bits = get_le(in + 48, 8);
    uint32_t len = (uint32_t)get_le(in + 68, 4);
    if (len == 0 || len >= KVE_SPEC_MAX || len > size - HEADER - CHECKSUM)
        return bad("spec length %lu is outside 1 .. %d", (unsigned long)len, KVE_SPEC_MAX - 1);
    char spec[KVE_SPEC_MAX];
    memcpy(spec, in + HEADER, len);
    spec[len] = '\0';
    if (strlen(spec) != len)
        return bad("the spec holds a NUL byte");
    if (key_dim > KVE_MAX_KEY_DIM)
        return bad("key_dim %llu is above the largest, %d", (unsigned long long)key_dim,
                   KVE_MAX_KEY_DIM);
    kve_config *c = &hd->cfg;
    kve_status st = kve__config_parse(spec, NULL, NULL, (size_t)key_dim, c);
    if (st != KVE_OK)
        return kve__fail(st, "image: spec: %s", kve_last_error());
    if (strcmp(c->spec, spec) != 0)
        return bad("spec \"%s\" is not canonical (\"%s\")", spec, c->spec);
    if ((c->type->flags & KVE_TYPE_READS_KEYS) && key_dim == 0)
        return bad("key_dim 0, but %s reads keys", c->type->name);
    static const char *const col_names[N_STORED] = {"pos", "score", "extra0", "extra1"};
    for (int k = 1; k < N_STORED; k++) {
        uint32_t e = (uint32_t)get_le(in + 56 + 4 * (size_t)(k - 1), 4);
        if (e != c->elem[stored[k]])
            return bad("column %s holds %lu bytes a slot, but %s's holds %zu", col_names[k],
                       (unsigned long)e, c->spec, c->elem[stored[k]]);
    }
    hd->body = HEADER + len;
    if (kind == KIND_POLICY && (n_heads != 1 || share != 0 || bits != 0)) {
        double m;
        memcpy(&m, &bits, sizeof m);
        return bad("a policy's image has 1 head, share 0 and min_share 0, not %llu, %llu and %g",
                   (unsigned long long)n_heads, (unsigned long long)share, m);
    }
    if (n_heads > (size - CHECKSUM - hd->body) / HEAD)
        return bad("%llu heads need more than the %zu bytes after the header",
                   (unsigned long long)n_heads, size - CHECKSUM - hd->body);
    hd->kind = kind;
    hd->n_heads = (size_t)n_heads;
    hd->opt = kve_bank_default_options();
    hd->opt.key_dim = (size_t)key_dim;
    hd->opt.share = (size_t)share;
    memcpy(&hd->opt.min_share, &bits, sizeof bits);
    if (kind == KIND_BANK) {
        if (share > n_heads && n_heads) /* so that it is exact as a size_t */
            return bad("share %llu does not divide n_heads %zu", (unsigned long long)share,
                       hd->n_heads);
        if ((st = kve__bank_check_options(c, hd->n_heads, &hd->opt)) != KVE_OK)
            return kve__fail(st, "image: %s", kve_last_error());
    }
    return KVE_OK;
}

/* Every head's record fits, and together they end where the checksum
 * starts. */
static kve_status check_lengths(const uint8_t *in, size_t size, const header *hd)
{
    const size_t slot = slot_image_bytes(&hd->cfg), end = size - CHECKSUM;
    size_t off = hd->body;
    for (size_t h = 0; h < hd->n_heads; h++) {
        if (end - off < HEAD)
            return bad("head %zu: its record is cut off (%zu bytes left)", h, end - off);
        uint64_t n = get_le(in + off, 8);
        if (n > (end - off - HEAD) / slot)
            return bad("head %zu: %llu positions need more than the %zu bytes left", h,
                       (unsigned long long)n, end - off - HEAD);
        off += HEAD + (size_t)n * slot;
    }
    if (off != end)
        return bad("%zu bytes after the last head, before the checksum", end - off);
    return KVE_OK;
}

/* Reads head h's record at in (lengths checked) into the head, whose
 * storage holds its size, and checks it. */
static kve_status read_head(kve_bank *b, size_t head, const uint8_t *in)
{
    const kve_config *c = &b->cfg;
    kve_head *h = &b->heads[head];
    const size_t n = (size_t)get_le(in, 8);
    h->observed = get_le(in + 8, 8);
    int32_t last = (int32_t)(uint32_t)get_le(in + 16, 4);
    uint32_t flags = (uint32_t)get_le(in + 20, 4);
    h->seed = get_le(in + 24, 8);
    uint64_t any = 0;
    for (int k = 0; k < 4; k++)
        any |= h->rng.s[k] = get_le(in + 32 + 8 * (size_t)k, 8);
    if (flags > 1)
        return bad_head(b, head, "flags %#lx: only bit 0 (a position was admitted) is defined",
                        (unsigned long)flags);
    if (!(flags & 1) && (n || last))
        return bad_head(b, head, "no position was admitted (flags), yet it keeps %zu and "
                        "last_pos is %ld", n, (long)last);
    if (last < 0)
        return bad_head(b, head, "last_pos %ld is negative", (long)last);
    if ((c->type->flags & KVE_TYPE_NEEDS_RNG) && !any)
        return bad_head(b, head, "rng is all zero, a state xoshiro256** never reaches");
    if (!(c->type->flags & KVE_TYPE_NEEDS_RNG) && (any || h->seed))
        return bad_head(b, head, "seed and rng must be 0: %s draws no random numbers",
                        c->type->name);
    in += HEAD;
    for (int k = 0; k < N_STORED; k++) {
        const int col = stored[k];
        if (c->elem[col])
            in = get_scalars(h->col[col], in, n * c->elem[col], c->unit[col]);
    }
    h->size = n;
    h->last_pos = last;
    h->any_pos = flags & 1;
    const int32_t *pos = h->col[KVE_COL_POS];
    for (size_t i = 0; i < n; i++) {
        if (pos[i] < 0)
            return bad_head(b, head, "pos[%zu] = %ld is negative", i, (long)pos[i]);
        if (i && pos[i] <= pos[i - 1])
            return bad_head(b, head, "pos[%zu] = %ld is not greater than pos[%zu] = %ld", i,
                            (long)pos[i], i - 1, (long)pos[i - 1]);
    }
    if (n && pos[n - 1] > last)
        return bad_head(b, head, "pos[%zu] = %ld is past last_pos %ld", n - 1, (long)pos[n - 1],
                        (long)last);
    const double *score = h->col[KVE_COL_SCORE];
    for (size_t i = 0; score && i < n; i++) {
        if (!isfinite(score[i]))
            return bad_head(b, head, "score[%zu] is %s", i, isnan(score[i]) ? "NaN" : "infinite");
        if ((c->type->flags & KVE_TYPE_ATTN_SCORE) && score[i] < 0.0)
            return bad_head(b, head, "score[%zu] = %g is negative: it is attention received", i,
                            score[i]);
    }
    char msg[160];
    if (c->type->check_state && !c->type->check_state(c, h, msg, sizeof msg))
        return bad_head(b, head, "%s", msg);
    return KVE_OK;
}

/* The slots a head of cap slots grows to for n positions: doubled, as a
 * step grows it. */
static size_t grown(size_t cap, size_t n)
{
    while (cap < n)
        cap = cap > SIZE_MAX / 2 ? n : cap * 2;
    return cap;
}

/* Reads the records of heads [first, first + count) (one head, or a
 * shared group) at *at (lengths checked): storage for their sizes first,
 * then each head, checked; *at moves past them. */
static kve_status read_heads(kve_bank *b, size_t first, size_t count, const uint8_t **at)
{
    const size_t slot = slot_image_bytes(&b->cfg);
    const uint8_t *p = *at;
    size_t need = 0;
    for (size_t j = 0; j < count; j++) { /* the sizes first: the layout reads them */
        size_t n = (size_t)get_le(p, 8);
        b->heads[first + j].size = n;
        need += n + 1;
        p += HEAD + n * slot;
    }
    kve_status st;
    void *block;
    if (b->share) {
        size_t gi = first / b->share;
        kve_group *g = &b->groups[gi];
        if (need > g->cap) {
            size_t cap = 2 * g->cap > need ? 2 * g->cap : need;
            if ((st = kve__block_alloc(b, cap, &block)) != KVE_OK)
                return st;
            kve__group_adopt(b, gi, block, cap);
        }
        kve__group_even(b, gi);
    } else if (b->heads[first].size > b->heads[first].cap) {
        kve_head *h = &b->heads[first];
        size_t cap = grown(h->cap, h->size);
        if ((st = kve__block_alloc(b, cap, &block)) != KVE_OK)
            return st;
        kve__head_adopt(b, h, block, cap, false);
    }
    p = *at;
    for (size_t j = 0; j < count; j++) {
        size_t n = (size_t)get_le(p, 8);
        if ((st = read_head(b, first + j, p)) != KVE_OK)
            return st;
        p += HEAD + n * slot;
    }
    *at = p;
    return KVE_OK;
}

/* A new policy (policy != NULL) or bank from a checked header, its heads
 * read from the image; on failure nothing is left allocated. */
static kve_status build(const uint8_t *in, const header *hd, const kve_allocator *allocator,
                        kve_policy **policy, kve_bank **bank)
{
    const kve_allocator alloc = kve__allocator(allocator);
    kve_rng unused; /* every generator is the image's */
    kve_rng_seed(&unused, 0);
    kve_policy *p = NULL;
    kve_bank *b = NULL;
    kve_status st = policy ? kve__policy_create(&hd->cfg, &unused, &alloc, &p)
                           : kve__bank_create(&hd->cfg, hd->n_heads, &unused, &hd->opt, &alloc, &b);
    if (st != KVE_OK)
        return st;
    if (p)
        b = &p->bank;
    const uint8_t *at = in + hd->body;
    const size_t step = b->share ? b->share : 1;
    for (size_t h = 0; st == KVE_OK && h < b->n_heads; h += step)
        st = read_heads(b, h, step, &at);
    if (st != KVE_OK) {
        if (p)
            kve_policy_free(p);
        else
            kve_bank_free(b);
        return st;
    }
    if (policy)
        *policy = p;
    else
        *bank = b;
    return KVE_OK;
}

static kve_status load(const void *buf, size_t size, uint32_t kind, const void *out, header *hd)
{
    if (!out)
        return kve__fail(KVE_EINVAL, "out is NULL");
    if (!buf)
        return kve__fail(KVE_EINVAL, "buf is NULL");
    kve_status st = read_header(buf, size, kind, hd);
    return st == KVE_OK ? check_lengths(buf, size, hd) : st;
}

kve_status kve_policy_load(const void *buf, size_t size, const kve_allocator *allocator,
                           kve_policy **out)
{
    header hd;
    memset(&hd, 0, sizeof hd);
    kve_status st = load(buf, size, KIND_POLICY, out, &hd);
    return st == KVE_OK ? build(buf, &hd, allocator, out, NULL) : st;
}

kve_status kve_bank_load(const void *buf, size_t size, const kve_allocator *allocator,
                         kve_bank **out)
{
    header hd;
    memset(&hd, 0, sizeof hd);
    kve_status st = load(buf, size, KIND_BANK, out, &hd);
    return st == KVE_OK ? build(buf, &hd, allocator, NULL, out) : st;
}
