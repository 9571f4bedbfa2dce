/* SPDX-License-Identifier: MIT */
/*
 * image.c - the state of a policy or a bank as bytes: kve_*_save writes an
 * image, kve_*_load builds a new object from one. docs/api.md ("State
 * images") gives the layout byte for byte; in short:
 *
 *   header   magic, version, kind, size, heads, key_dim, share, min_share,
 *            the bytes a slot of the score and the policy's two columns,
 *            the canonical spec (which names a score rule by its name);
 *            version 2 only: the methods' block (value_dim, query_group,
 *            the rope, the bytes a slot of the raw scores and value norms,
 *            the bytes of a head's policy state); version 3 only: that
 *            block and the bank's flags (bit 0: same_positions)
 *   heads    per head: size, steps observed, last position, flags, the
 *            generator's seed and state, then its columns, each whole:
 *            positions, scores, the policy's two columns, the raw scores
 *            and value norms of vnorm=1, in kept order; then the policy's
 *            per-head state (expected_attention's counters, statistics and
 *            query ring: kve_config.aux_state)
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
 *    same one by a scan), no marks, no scratch columns or per-head scratch
 *    (keydiff's sum is recomputed by every step, expected_attention's tmp
 *    by every rescoring), no capacity. So one state has one image:
 *    saving a copy, a clone or a loaded object gives the same bytes.
 *  - Load trusts nothing: it checks the magic, version, kind, size and
 *    checksum, then the header against the spec's own layout, every length
 *    before it allocates (so an image can make it allocate no more than
 *    about its own size), then every head (flags, generator, positions,
 *    scores, and the policy's columns through its type's check_state), and
 *    refuses with KVE_EINVAL and a message naming the field; the object it
 *    was building is freed, and *out is untouched.
 *  - Versions: save writes version 1 (the layout before the methods) for
 *    an object none of whose facts or state is the methods' (value_dim 0,
 *    query_group 1, rope unset, no raw or vnorm column, no policy state),
 *    so such images are unchanged, and version 2 (version 1 plus the
 *    methods' block after the spec) otherwise; load reads both. A version 2
 *    image of an object version 1 describes is refused (one state, one
 *    image). A same_positions bank writes version 3: version 2's layout,
 *    its block always present and followed by the bank's flags, since
 *    the option is state (which victims the heads will take). Its heads
 *    are checked to keep one kept set.
 *  - Version: VERSION below. A layout or meaning that changes gets a new
 *    version, and load reads each version it documents (converting the
 *    older), refusing the others by number.
 * Cost: save O(bytes of the image) (the checksum reads them once more);
 * load the same plus the policy's checks (keydiff: O(kept * d)).
 */
#include "policy_impl.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum {
    VERSION = 3,     /* the newest layout (version 1: without the methods' block; 2:
                        with it; 3: with it and the bank's flags) */
    KIND_POLICY = 1, /* kve_policy_save */
    KIND_BANK = 2,   /* kve_bank_save */
    HEADER = 72,     /* bytes before the spec */
    METHODS = 48,    /* version 2: the methods' block after the spec */
    FLAGS = 8,       /* version 3: the bank's flags after that block */
    HEAD = 64,       /* bytes of a head's record before its columns */
    CHECKSUM = 8
};

/* \x89 k v e \r \n \x1a \n: a byte above 127 first and both line endings
 * (PNG's device), so a transfer that alters text is caught at once. */
static const uint8_t magic[8] = {0x89, 'k', 'v', 'e', '\r', '\n', 0x1a, '\n'};

/* The stored columns in image order: pos, score, extra0, extra1, raw,
 * vnorm (marks and the columns from KVE_COL_SCRATCH on are scratch). */
static const int stored[] = {KVE_COL_POS,    KVE_COL_SCORE, KVE_COL_EXTRA0,
                             KVE_COL_EXTRA1, KVE_COL_RAW,   KVE_COL_VNORM};
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

/* Image bytes of a head's policy state (kve_config.aux_state). */
static size_t aux_image_bytes(const kve_config *c)
{
    return c->aux_state[0].bytes + c->aux_state[1].bytes;
}

/* Whether c needs version 2's block: a fact or a state of the methods. */
static bool has_methods(const kve_config *c)
{
    return c->value_dim || c->query_group != 1 || c->rope.rotary_dim != KVE_ROPE_UNSET ||
           c->elem[KVE_COL_RAW] || c->elem[KVE_COL_VNORM] || aux_image_bytes(c);
}

/* The version an object's image is written in: 3 for a same_positions
 * bank, 2 for an object with the methods' facts or state, else 1. */
static uint32_t image_version(const kve_bank *b)
{
    return b->same_positions ? 3 : has_methods(&b->cfg) ? 2 : 1;
}

/* Bytes between the spec and the first head record in a version's layout. */
static size_t ext_bytes_of(uint32_t version)
{
    return version == 3 ? METHODS + FLAGS : version == 2 ? METHODS : 0;
}

static size_t image_bytes(const kve_bank *b)
{
    size_t n = HEADER + strlen(b->cfg.spec) + CHECKSUM, slot = slot_image_bytes(&b->cfg);
    n += ext_bytes_of(image_version(b));
    for (size_t h = 0; h < b->n_heads; h++)
        n += HEAD + b->heads[h].size * slot + aux_image_bytes(&b->cfg);
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
    for (int k = 0; k < 2; k++)
        if (c->aux_state[k].bytes)
            p = put_scalars(p, (const char *)h->aux + c->aux_state[k].offset,
                            c->aux_state[k].bytes, c->aux_state[k].unit);
    return p;
}

static kve_status save(const kve_bank *b, uint32_t kind, void *buf, size_t cap, size_t *size)
{
    const kve_config *c = &b->cfg;
    if (!size)
        return kve__fail(KVE_EINVAL, "%s: size is NULL", c->type->name);
    /* No version records the rope's scaling: refused, not written unscaled. */
    if (c->rope.scaling != KVE_ROPE_SCALING_NONE)
        return kve__fail(KVE_EINVAL, "%s: rope.scaling %d: an image does not record the rope's "
                         "scaling", c->type->name, (int)c->rope.scaling);
    if (c->rope_nff)
        return kve__fail(KVE_EINVAL, "%s: rope.freq_factors: an image does not record the rope's "
                         "per-pair factors", c->type->name);
    if (c->rope.attention_factor != 0.0)
        return kve__fail(KVE_EINVAL, "%s: rope.attention_factor %g: an image does not record the "
                         "rope's scaling", c->type->name, c->rope.attention_factor);
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
    const uint32_t version = image_version(b);
    const bool v2 = version >= 2;
    p = put_u32(p + 8, version);
    p = put_u32(p, kind);
    p = put_u64(p, need);
    p = put_u64(p, b->n_heads);
    p = put_u64(p, c->key_dim);
    p = put_u64(p, b->share);
    uint64_t bits;
    memcpy(&bits, &b->min_share, sizeof bits);
    p = put_u64(p, bits);
    for (int k = 1; k < 4; k++) /* score, extra0, extra1 */
        p = put_u32(p, (uint32_t)c->elem[stored[k]]);
    p = put_u32(p, (uint32_t)len);
    memcpy(p, c->spec, len);
    p += len;
    if (v2) {
        p = put_u64(p, c->value_dim);
        p = put_u64(p, c->query_group);
        p = put_u64(p, c->rope.rotary_dim == KVE_ROPE_UNSET ? UINT64_MAX : c->rope.rotary_dim);
        memcpy(&bits, &c->rope.base, sizeof bits);
        p = put_u64(p, bits);
        p = put_u32(p, (uint32_t)c->rope.pairs);
        for (int k = 4; k < N_STORED; k++) /* raw, vnorm */
            p = put_u32(p, (uint32_t)c->elem[stored[k]]);
        p = put_u32(p, (uint32_t)aux_image_bytes(c));
    }
    if (version == 3)
        p = put_u64(p, 1); /* flags: bit 0, same_positions */
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
    kve_status st = kve__check_idle(b, "a save");
    return st == KVE_OK ? save(b, KIND_BANK, buf, cap, size) : st;
}

kve_status kve_policy_save(const kve_policy *p, void *buf, size_t cap, size_t *size)
{
    if (!p)
        return kve__fail(KVE_EINVAL, "policy is NULL");
    kve_status st = kve__check_idle(&p->bank, "a save");
    return st == KVE_OK ? save(&p->bank, KIND_POLICY, buf, cap, size) : st;
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

/* A spec that does not parse: when it names no built-in policy and no
 * registered score rule, the refusal says the rule must be registered
 * first (an image names a score rule by its name only). */
static kve_status unknown_rule(const char *spec, kve_status st)
{
    char name[KVE_NAME_MAX];
    size_t n = strcspn(spec, ":");
    const kve_policy_type *t = NULL;
    if (n < sizeof name) {
        memcpy(name, spec, n);
        name[n] = '\0';
        if (!kve__builtin_type(name) && (t = kve__rule_find(name)) == NULL) {
            char msg[224];
            snprintf(msg, sizeof msg, "%s", kve_last_error());
            return kve__fail(st, "image: spec: %s; an image names a score rule: register it "
                             "(kve_score_rule_register) before loading", msg);
        }
        if (t)
            kve__rule_release(t);
    }
    return kve__fail(st, "image: spec: %s", kve_last_error());
}

/* The header's checks against the parsed spec: canonical, the facts it
 * needs, the columns and the policy state it lays out. */
static kve_status check_parsed(const uint8_t *in, const uint8_t *ext, uint32_t version,
                               const char *spec, uint32_t aux, const kve_config *c)
{
    if (strcmp(c->spec, spec) != 0)
        return bad("spec \"%s\" is not canonical (\"%s\")", spec, c->spec);
    kve_rng any;
    kve_rng_seed(&any, 0);
    kve_status st = kve__check_needs(c, &any);
    if (st != KVE_OK)
        return kve__fail(st, "image: %s", kve_last_error());
    static const char *const col_names[N_STORED] = {"pos",    "score", "extra0",
                                                    "extra1", "raw",   "vnorm"};
    for (int k = 1; k < N_STORED; k++) { /* raw and vnorm: 0 in version 1 */
        uint32_t e = k < 4 ? (uint32_t)get_le(in + 56 + 4 * (size_t)(k - 1), 4)
                     : ext ? (uint32_t)get_le(ext + 36 + 4 * (size_t)(k - 4), 4)
                           : 0;
        if (e != c->elem[stored[k]])
            return bad("column %s holds %lu bytes a slot, but %s's holds %zu", col_names[k],
                       (unsigned long)e, c->spec, c->elem[stored[k]]);
    }
    if (!ext && has_methods(c)) /* what only version 2 can hold */
        return bad("version 1, but %s with these options needs version 2", c->spec);
    if (version == 2 && !has_methods(c))
        return bad("version 2, but %s with these options is an image of version 1", c->spec);
    if (aux != aux_image_bytes(c))
        return bad("a head's policy state is %lu bytes, but %s's is %zu", (unsigned long)aux,
                   c->spec, aux_image_bytes(c));
    return KVE_OK;
}

static kve_status read_header(const uint8_t *in, size_t size, uint32_t want, header *hd)
{
    static const char *const kinds[] = {"", "a policy", "a bank"};
    if (size < HEADER + CHECKSUM)
        return bad("%zu bytes, fewer than the %d of an image's header and checksum (truncated?)",
                   size, HEADER + CHECKSUM);
    if (memcmp(in, magic, sizeof magic) != 0)
        return bad("not a kvevict state image (magic: its first 8 bytes differ)");
    uint32_t version = (uint32_t)get_le(in + 8, 4);
    if (version < 1 || version > VERSION)
        return bad("version %lu, but this library (kvevict %s) reads versions 1 to %d",
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
    const size_t ext_bytes = ext_bytes_of(version);
    if (len == 0 || len >= KVE_SPEC_MAX || len > size - HEADER - CHECKSUM)
        return bad("spec length %lu is outside 1 .. %d", (unsigned long)len, KVE_SPEC_MAX - 1);
    if (ext_bytes > size - HEADER - CHECKSUM - len)
        return bad("version %lu, but the %zu bytes of its block after the spec are cut off",
                   (unsigned long)version, ext_bytes);
    const uint8_t *ext = ext_bytes ? in + HEADER + len : NULL;
    uint64_t value_dim = ext ? get_le(ext, 8) : 0, query_group = ext ? get_le(ext + 8, 8) : 1;
    uint64_t rotary = ext ? get_le(ext + 16, 8) : UINT64_MAX;
    uint64_t base_bits = ext ? get_le(ext + 24, 8) : 0x40c3880000000000u; /* 10000.0 */
    uint32_t pairs = ext ? (uint32_t)get_le(ext + 32, 4) : (uint32_t)KVE_ROPE_ADJACENT;
    uint32_t aux = ext ? (uint32_t)get_le(ext + 44, 4) : 0;
    uint64_t bank_flags = version == 3 ? get_le(ext + METHODS, 8) : 0;
    if (version == 3 && bank_flags != 1)
        return bad("version 3 flags %#llx: bit 0 (same_positions) must be set, and it is the "
                   "only one defined", (unsigned long long)bank_flags);
    if (version == 3 && kind == KIND_POLICY)
        return bad("version 3 is a same_positions bank's; a policy's image is version 1 or 2");
    char spec[KVE_SPEC_MAX];
    memcpy(spec, in + HEADER, len);
    spec[len] = '\0';
    if (strlen(spec) != len)
        return bad("the spec holds a NUL byte");
    if (key_dim > KVE_MAX_KEY_DIM || value_dim > KVE_MAX_KEY_DIM)
        return bad("%s %llu is above the largest, %d", key_dim > KVE_MAX_KEY_DIM ? "key_dim" :
                   "value_dim", (unsigned long long)(key_dim > KVE_MAX_KEY_DIM ? key_dim :
                   value_dim), KVE_MAX_KEY_DIM);
    if (query_group == 0 || query_group > KVE_MAX_QUERY_GROUP)
        return bad("query_group %llu is outside 1 .. %d", (unsigned long long)query_group,
                   KVE_MAX_QUERY_GROUP);
    if (rotary != UINT64_MAX && rotary > KVE_MAX_KEY_DIM)
        return bad("rope.rotary_dim %llu is above key_dim", (unsigned long long)rotary);
    kve_policy_options o = kve_policy_default_options();
    o.key_dim = (size_t)key_dim;
    o.value_dim = (size_t)value_dim;
    o.query_group = (size_t)query_group;
    o.rope.rotary_dim = rotary == UINT64_MAX ? KVE_ROPE_UNSET : (size_t)rotary;
    memcpy(&o.rope.base, &base_bits, sizeof base_bits);
    o.rope.pairs = pairs == KVE_ROPE_ADJACENT ? KVE_ROPE_ADJACENT : KVE_ROPE_HALF;
    if (pairs != KVE_ROPE_ADJACENT && pairs != KVE_ROPE_HALF)
        return bad("rope.pairs %lu is not a kve_rope_pairs", (unsigned long)pairs);
    kve_status st = kve__check_facts(&o);
    if (st != KVE_OK)
        return kve__fail(st, "image: %s", kve_last_error());
    kve_config *c = &hd->cfg;
    if ((st = kve__config_parse(spec, NULL, NULL, &o, c)) != KVE_OK)
        return unknown_rule(spec, st);
    /* From here c holds its type (a registered rule: a hold), released on
     * every refusal. */
    if ((st = check_parsed(in, ext, version, spec, aux, c)) != KVE_OK)
        goto refuse;
    hd->body = HEADER + len + ext_bytes;
    if (kind == KIND_POLICY && (n_heads != 1 || share != 0 || bits != 0)) {
        double m;
        memcpy(&m, &bits, sizeof m);
        st = bad("a policy's image has 1 head, share 0 and min_share 0, not %llu, %llu and %g",
                 (unsigned long long)n_heads, (unsigned long long)share, m);
        goto refuse;
    }
    if (n_heads > (size - CHECKSUM - hd->body) / HEAD) {
        st = bad("%llu heads need more than the %zu bytes after the header",
                 (unsigned long long)n_heads, size - CHECKSUM - hd->body);
        goto refuse;
    }
    hd->kind = kind;
    hd->n_heads = (size_t)n_heads;
    hd->opt = kve_bank_default_options();
    hd->opt.key_dim = o.key_dim;
    hd->opt.value_dim = o.value_dim;
    hd->opt.query_group = o.query_group;
    hd->opt.rope = o.rope;
    hd->opt.share = (size_t)share;
    memcpy(&hd->opt.min_share, &bits, sizeof bits);
    hd->opt.same_positions = version == 3;
    if (kind == KIND_BANK) {
        if (share > n_heads && n_heads) { /* so that it is exact as a size_t */
            st = bad("share %llu does not divide n_heads %zu", (unsigned long long)share,
                     hd->n_heads);
            goto refuse;
        }
        if ((st = kve__bank_check_options(c, hd->n_heads, &hd->opt)) != KVE_OK) {
            st = kve__fail(st, "image: %s", kve_last_error());
            goto refuse;
        }
    }
    return KVE_OK;
refuse:
    kve__type_release(c->type);
    return st;
}

/* Every head's record fits, and together they end where the checksum
 * starts. */
static kve_status check_lengths(const uint8_t *in, size_t size, const header *hd)
{
    const size_t slot = slot_image_bytes(&hd->cfg), end = size - CHECKSUM;
    const size_t rec = HEAD + aux_image_bytes(&hd->cfg); /* a head's record but its slots */
    size_t off = hd->body;
    for (size_t h = 0; h < hd->n_heads; h++) {
        if (end - off < rec)
            return bad("head %zu: its record is cut off (%zu bytes left)", h, end - off);
        uint64_t n = get_le(in + off, 8);
        if (n > (end - off - rec) / slot)
            return bad("head %zu: %llu positions need more than the %zu bytes left", h,
                       (unsigned long long)n, end - off - rec);
        off += rec + (size_t)n * slot;
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
    for (int k = 0; k < 2; k++)
        if (c->aux_state[k].bytes)
            in = get_scalars((char *)h->aux + c->aux_state[k].offset, in, c->aux_state[k].bytes,
                             c->aux_state[k].unit);
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
    const double *raw = h->col[KVE_COL_RAW], *vnorm = h->col[KVE_COL_VNORM];
    for (size_t i = 0; c->elem[KVE_COL_VNORM] && i < n; i++)
        if (!(vnorm[i] >= 0.0 && vnorm[i] <= DBL_MAX))
            return bad_head(b, head, "vnorm[%zu] = %g is not a value's norm", i, vnorm[i]);
    for (size_t i = 0; c->elem[KVE_COL_RAW] && i < n; i++)
        if (!isfinite(raw[i]))
            return bad_head(b, head, "raw[%zu] is %s", i, isnan(raw[i]) ? "NaN" : "infinite");
    const double *score = h->col[KVE_COL_SCORE];
    for (size_t i = 0; score && i < n; i++) {
        if (!isfinite(score[i]))
            return bad_head(b, head, "score[%zu] is %s", i, isnan(score[i]) ? "NaN" : "infinite");
        if ((c->type->flags & KVE_TYPE_ATTN_SCORE) && score[i] < 0.0)
            return bad_head(b, head, "score[%zu] = %g is negative: it is attention received", i,
                            score[i]);
    }
    char msg[160];
    kve_head rule_view = *h; /* vnorm=1: the rule's own scores are the raw column */
    if (c->elem[KVE_COL_RAW])
        rule_view.col[KVE_COL_SCORE] = rule_view.col[KVE_COL_RAW];
    if (c->type->check_state && !c->type->check_state(c, &rule_view, msg, sizeof msg))
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
    const size_t slot = slot_image_bytes(&b->cfg), aux = aux_image_bytes(&b->cfg);
    const uint8_t *p = *at;
    size_t need = 0;
    for (size_t j = 0; j < count; j++) { /* the sizes first: the layout reads them */
        size_t n = (size_t)get_le(p, 8);
        b->heads[first + j].size = n;
        need += n + 1;
        p += HEAD + n * slot + aux;
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
        p += HEAD + n * slot + aux;
    }
    *at = p;
    return KVE_OK;
}

/* A same_positions bank's heads keep one kept set: a head that has admitted
 * the newest position F of the bank keeps what every such head keeps, and
 * a head that has not (a step stopped part-way through the heads) keeps the
 * same but F, as the steps leave them. */
static kve_status check_same_positions(const kve_bank *b)
{
    size_t ref = b->n_heads; /* the first head at the front */
    for (size_t h = 0; h < b->n_heads; h++) {
        const kve_head *hd = &b->heads[h];
        if (hd->any_pos && (ref == b->n_heads || hd->last_pos > b->heads[ref].last_pos))
            ref = h;
    }
    if (ref == b->n_heads) /* no head has admitted anything: every one is empty */
        return KVE_OK;
    const kve_head *r = &b->heads[ref];
    const int32_t *rp = r->col[KVE_COL_POS], front = r->last_pos;
    for (size_t h = 0; h < b->n_heads; h++) {
        const kve_head *hd = &b->heads[h];
        const int32_t *p = hd->col[KVE_COL_POS];
        const bool at_front = hd->any_pos && hd->last_pos == front;
        /* behind: the front's set without F (F kept there, as no evict ran since) */
        size_t want = at_front ? r->size : r->size && rp[r->size - 1] == front ? r->size - 1 : 0;
        if (!at_front && !(r->size && rp[r->size - 1] == front))
            return bad("same_positions: head %zu has not admitted position %ld, which head %zu "
                       "has but does not keep", h, (long)front, ref);
        if (hd->size != want)
            return bad("same_positions: head %zu keeps %zu positions, but head %zu keeps %zu%s",
                       h, hd->size, ref, r->size, at_front ? "" : " with the newest");
        for (size_t i = 0; i < want; i++)
            if (p[i] != rp[i])
                return bad("same_positions: head %zu's pos[%zu] = %ld, head %zu's %ld", h, i,
                           (long)p[i], ref, (long)rp[i]);
    }
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
    kve_frame f; /* its allocator runs (a head's growth): a call into it is refused */
    kve__enter_new(&f, b, b->cfg.type->name, p != NULL);
    const uint8_t *at = in + hd->body;
    const size_t step = b->share ? b->share : 1;
    for (size_t h = 0; st == KVE_OK && h < b->n_heads; h += step)
        st = read_heads(b, h, step, &at);
    if (st == KVE_OK && b->same_positions)
        st = check_same_positions(b);
    kve__leave(&f);
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
    if (st == KVE_OK && (st = check_lengths(buf, size, hd)) != KVE_OK)
        kve__type_release(hd->cfg.type); /* read_header's hold; build takes it over */
    return st;
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

/* The growth blocks a load of the checked image makes (read_heads' own
 * arithmetic), added to what creation allocates. */
static size_t load_bytes(const uint8_t *in, const header *hd)
{
    const kve_config *c = &hd->cfg;
    const size_t share = hd->opt.share, step = share ? share : 1;
    const size_t slot = slot_image_bytes(c), aux = aux_image_bytes(c);
    const size_t cap0 = share ? kve__sliding_cap(c->params.budget) : c->cap0;
    size_t total = kve__create_bytes(c, hd->n_heads, share, hd->kind == KIND_POLICY);
    const uint8_t *p = in + hd->body;
    for (size_t h = 0; h < hd->n_heads; h += step) {
        size_t need = 0, first = 0;
        for (size_t j = 0; j < step; j++) {
            size_t n = (size_t)get_le(p, 8);
            if (j == 0)
                first = n;
            need += n + 1;
            p += HEAD + n * slot + aux;
        }
        size_t block = 0;
        if (share && need > share * cap0)
            block = kve__block_bytes(c, 2 * share * cap0 > need ? 2 * share * cap0 : need);
        else if (!share && first > cap0)
            block = kve__block_bytes(c, grown(cap0, first));
        total = total > SIZE_MAX - block ? SIZE_MAX : total + block;
    }
    return total;
}

kve_status kve_image_load_bytes(const void *buf, size_t size, size_t *bytes)
{
    if (!buf || !bytes)
        return kve__fail(KVE_EINVAL, "%s is NULL", buf ? "bytes" : "buf");
    const uint8_t *in = buf;
    uint32_t kind = size >= HEADER ? (uint32_t)get_le(in + 12, 4) : KIND_POLICY;
    header hd;
    memset(&hd, 0, sizeof hd);
    kve_status st = read_header(in, size, kind == KIND_BANK ? KIND_BANK : KIND_POLICY, &hd);
    if (st != KVE_OK)
        return st;
    st = check_lengths(in, size, &hd);
    if (st == KVE_OK)
        *bytes = load_bytes(in, &hd);
    kve__type_release(hd.cfg.type); /* read_header's hold */
    return st;
}
