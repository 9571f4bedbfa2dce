/*
 * tokenizer.c - llama2.c's tokenizer.bin: reading, encoding, decoding; and
 * what every kind shares (the lookup, lm_decode, lm_tokenize). The GGUF
 * kinds encode in vocab.c.
 *
 * Invariants: a returned tokenizer has at least one piece, every piece length
 * lies in [0, max_token_length] and no piece holds a NUL byte (run.c handles
 * pieces as C strings; refusing NULs makes every accepted file mean the same
 * here as there). `sorted` orders the ids by (bytes, id), so a lookup finds
 * the lowest id among equal pieces (a GGUF's: by (bytes, -id), the highest,
 * as llama.cpp's map keeps the last).
 *
 * Encoding gives run.c's result (greedy merges of the highest-scoring pair,
 * the leftmost on ties) in O(n log n) rather than run.c's O(n^2): the
 * candidate pairs sit in a heap ordered by (score descending, position
 * ascending) and stale candidates are skipped when popped. A token's
 * position is the index of its first byte's token in the initial sequence,
 * which preserves sequence order through every merge.
 */
#define _POSIX_C_SOURCE 200809L
#include "heap.h"
#include "lm.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int32_t get_i32(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* memcmp order with the shorter of two equal prefixes first. */
static int cmp_bytes(const char *a, size_t na, const char *b, size_t nb)
{
    int c = memcmp(a, b, na < nb ? na : nb);
    if (c != 0)
        return c;
    return na < nb ? -1 : na > nb;
}

typedef struct sort_item {
    const char *p;
    int32_t len, id;
} sort_item;

/* By bytes, then by id: ascending (dir 1) or descending (-1). */
static int cmp_items_dir(const void *x, const void *y, int dir)
{
    const sort_item *a = x, *b = y;
    int c = cmp_bytes(a->p, (size_t)a->len, b->p, (size_t)b->len);
    return c != 0 ? c : dir * ((a->id > b->id) - (a->id < b->id));
}

static int cmp_items(const void *x, const void *y)
{
    return cmp_items_dir(x, y, 1);
}

static int cmp_items_last(const void *x, const void *y) /* equal bytes: the highest id first */
{
    return cmp_items_dir(x, y, -1);
}

void lm_tokenizer_free(lm_tokenizer *t)
{
    if (!t)
        return;
    const kve_allocator a = t->alloc;
    lm_free(&a, t->piece);
    lm_free(&a, t->len);
    lm_free(&a, t->score);
    lm_free(&a, t->sorted);
    lm_free(&a, t->bytes);
    lm_free(&a, t->attr);
    lm_free(&a, (void *)t->text);
    lm_free(&a, t->text_len);
    lm_free(&a, t->text_bytes);
    lm_free(&a, t->user);
    lm_free(&a, t->eog);
    lm_free(&a, t->merge);
    lm_free(&a, t->merge_bytes);
    lm_free(&a, t);
}

kve_status lm_tokenizer_from_memory(const void *data, size_t size, const kve_allocator *allocator,
                                    lm_tokenizer **out)
{
    if (!data || !out)
        return kve_set_error(KVE_EINVAL, "tokenizer: NULL argument");
    const unsigned char *d = data;
    if (size < 4)
        return kve_set_error(KVE_EFORMAT, "tokenizer: %zu bytes, truncated in the field max_token_length",
                       size);
    int32_t max_len = get_i32(d);
    if (max_len <= 0)
        return kve_set_error(KVE_EFORMAT, "tokenizer: max_token_length %d must be positive", max_len);

    /* First pass: validate every piece and count them and their bytes. */
    size_t n = 0, total = 0;
    for (size_t off = 4; off < size; n++) {
        if (n >= INT32_MAX)
            return kve_set_error(KVE_EFORMAT, "tokenizer: more than %d pieces", INT32_MAX);
        if (size - off < 4)
            return kve_set_error(KVE_EFORMAT, "tokenizer: piece %zu truncated in the field score", n);
        float score;
        memcpy(&score, d + off, sizeof score);
        if (isnan(score))
            return kve_set_error(KVE_EFORMAT, "tokenizer: piece %zu has a NaN score", n);
        if (size - off - 4 < 4)
            return kve_set_error(KVE_EFORMAT, "tokenizer: piece %zu truncated in the field len", n);
        int32_t len = get_i32(d + off + 4);
        if (len < 0 || len > max_len)
            return kve_set_error(KVE_EFORMAT,
                           "tokenizer: piece %zu: len %d outside [0, max_token_length %d]", n, len,
                           max_len);
        off += 8;
        if (size - off < (size_t)len)
            return kve_set_error(KVE_EFORMAT, "tokenizer: piece %zu truncated in its %d bytes", n, len);
        if (memchr(d + off, 0, (size_t)len))
            return kve_set_error(KVE_EFORMAT, "tokenizer: piece %zu contains a NUL byte", n);
        off += (size_t)len;
        total += (size_t)len;
    }
    if (n == 0)
        return kve_set_error(KVE_EFORMAT, "tokenizer: no pieces after max_token_length");

    lm_tokenizer *t;
    kve_status st = lm__tokenizer_alloc(allocator, n, total, &t);
    if (st != KVE_OK)
        return st;
    t->max_token_length = max_len;
    char *dst = t->bytes;
    size_t off = 4;
    for (size_t i = 0; i < n; i++) {
        memcpy(&t->score[i], d + off, sizeof(float));
        t->len[i] = get_i32(d + off + 4);
        off += 8;
        memcpy(dst, d + off, (size_t)t->len[i]);
        t->piece[i] = dst;
        dst += t->len[i];
        off += (size_t)t->len[i];
    }
    st = lm__tokenizer_finish(t);
    if (st != KVE_OK) {
        lm_tokenizer_free(t);
        return st;
    }
    *out = t;
    return KVE_OK;
}

kve_status lm__tokenizer_alloc(const kve_allocator *a, size_t n, size_t total, lm_tokenizer **out)
{
    lm_tokenizer *t = lm_calloc(a, 1, sizeof *t);
    if (t) {
        if (a)
            t->alloc = *a;
        t->piece = lm_malloc(a, n * sizeof *t->piece);
        t->len = lm_malloc(a, n * sizeof *t->len);
        t->score = lm_malloc(a, n * sizeof *t->score);
        t->sorted = lm_malloc(a, n * sizeof *t->sorted);
        t->bytes = lm_malloc(a, total);
    }
    if (!t || !t->piece || !t->len || !t->score || !t->sorted || !t->bytes) {
        lm_tokenizer_free(t);
        return kve_set_error(KVE_ENOMEM, "tokenizer: out of memory for %zu pieces", n);
    }
    t->n_pieces = (int32_t)n;
    *out = t;
    return KVE_OK;
}

kve_status lm__tokenizer_finish(lm_tokenizer *t)
{
    size_t n = (size_t)t->n_pieces;
    sort_item *items = lm_malloc(&t->alloc, n * sizeof *items);
    if (!items)
        return kve_set_error(KVE_ENOMEM, "tokenizer: out of memory for %zu pieces", n);
    t->longest = 0;
    for (size_t i = 0; i < n; i++) {
        items[i] = (sort_item){t->piece[i], t->len[i], (int32_t)i};
        t->longest = t->len[i] > t->longest ? t->len[i] : t->longest;
    }
    qsort(items, n, sizeof *items, t->kind == LM_TOK_RUNC ? cmp_items : cmp_items_last);
    for (size_t i = 0; i < n; i++)
        t->sorted[i] = items[i].id;
    lm_free(&t->alloc, items);
    for (int b = 0; b < 256; b++) {
        t->byte_pieces[b] = (unsigned char)b;
        t->byte_id[b] = 3 + b < t->n_pieces ? 3 + b : -1; /* run.c's byte + 3 */
    }
    t->unk = -1;
    if (t->kind == LM_TOK_RUNC) { /* run.c's: BOS 1 first, EOS 2, the dummy prefix */
        t->bos = LM_BOS, t->eos = LM_EOS;
        t->add_bos = 1, t->add_space_prefix = 1;
    }
    return KVE_OK;
}

kve_status lm_tokenizer_open(const char *path, const kve_allocator *allocator, lm_tokenizer **out)
{
    if (!path || !out)
        return kve_set_error(KVE_EINVAL, "tokenizer: NULL argument");
    char *buf;
    size_t size;
    kve_status st = lm_read_file_max(allocator, path, LM_MAX_TOKENIZER_BYTES, &buf, &size);
    if (st != KVE_OK)
        return st;
    st = lm_tokenizer_from_memory(buf, size, allocator, out);
    lm_free(allocator, buf);
    return st;
}

int32_t lm_piece_id(const lm_tokenizer *t, const char *piece, size_t len)
{
    size_t lo = 0, hi = (size_t)t->n_pieces;
    while (lo < hi) { /* the first sorted entry >= piece */
        size_t mid = lo + (hi - lo) / 2;
        int32_t id = t->sorted[mid];
        if (cmp_bytes(t->piece[id], (size_t)t->len[id], piece, len) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < (size_t)t->n_pieces) {
        int32_t id = t->sorted[lo];
        if (cmp_bytes(t->piece[id], (size_t)t->len[id], piece, len) == 0)
            return id;
    }
    return -1;
}

/* The byte a piece "<0xHH>" stands for (hex digits of either case), or -1. */
static int raw_byte(const char *p, size_t len)
{
    if (len != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p[i];
        int h = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

const char *lm_decode(const lm_tokenizer *t, int32_t prev, int32_t token, size_t *len)
{
    if (token < 0 || token >= t->n_pieces)
        return NULL;
    const char *p = t->text ? t->text[token] : t->piece[token];
    size_t n = (size_t)(t->text ? t->text_len[token] : t->len[token]);
    if (prev == t->bos && prev >= 0 && t->add_space_prefix && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    int b = t->kind == LM_TOK_RUNC ? raw_byte(p, n) : -1;
    if (b >= 0) {
        p = (const char *)&t->byte_pieces[b];
        n = 1;
    }
    *len = n;
    return p;
}

int lm_token_ends(const lm_tokenizer *t, int32_t token)
{
    if (token == t->bos && token >= 0)
        return 1;
    size_t lo = 0, hi = t->n_eog;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->eog[mid] == token)
            return 1;
        if (t->eog[mid] < token)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

size_t lm_encode_bound(const lm_tokenizer *t, size_t len)
{
    if (t->kind == LM_TOK_RUNC)
        return len < SIZE_MAX ? len + 1 : SIZE_MAX;
    return len <= (SIZE_MAX - 3) / 4 ? 4 * len + 3 : SIZE_MAX;
}

/* ---- encoding ---- */

typedef struct pair { /* a merge candidate: node `left` and the node after it */
    float score;
    int32_t id; /* the merged piece */
    size_t left, right;
    uint32_t ver_left, ver_right;
} pair;

typedef struct encoder {
    const lm_tokenizer *t;
    size_t n;            /* nodes made */
    int32_t *id;         /* (n) */
    size_t *next, *prev; /* links; SIZE_MAX ends the list */
    uint32_t *ver;       /* bumped whenever a node changes or dies */
    unsigned char *dead;
    pair *heap;
    size_t heap_n;
    char *buf; /* 2 * longest: one concatenation */
} encoder;

static int before(const pair *a, const pair *b) /* a pops before b */
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

LM_HEAP(heap, pair, before)

/* Pushes the pair (left, next[left]) if its concatenation is a piece that
 * run.c would merge: its score beats run.c's starting best of -1e10. */
static void consider(encoder *e, size_t left)
{
    size_t right = e->next[left];
    if (right == SIZE_MAX)
        return;
    const lm_tokenizer *t = e->t;
    int32_t a = e->id[left], b = e->id[right];
    size_t la = (size_t)t->len[a], lb = (size_t)t->len[b];
    if (la + lb > (size_t)t->longest)
        return; /* longer than every piece */
    memcpy(e->buf, t->piece[a], la);
    memcpy(e->buf + la, t->piece[b], lb);
    int32_t id = lm_piece_id(t, e->buf, la + lb);
    if (id < 0 || !(t->score[id] > -1e10f))
        return;
    heap_push(e->heap, &e->heap_n, (pair){t->score[id], id, left, right, e->ver[left], e->ver[right]});
}

static kve_status push_token(encoder *e, int32_t id, unsigned byte)
{
    if (id < 0) {
        id = e->t->byte_id[byte] >= 0 ? e->t->byte_id[byte] : e->t->unk;
        if (id < 0)
            return kve_set_error(KVE_EFORMAT,
                           "tokenizer: byte 0x%02X has no piece (byte fallback needs 259 pieces, "
                           "there are %d)",
                           byte, e->t->n_pieces);
    }
    size_t i = e->n++;
    e->id[i] = id;
    e->prev[i] = i ? i - 1 : SIZE_MAX;
    e->next[i] = SIZE_MAX;
    if (i)
        e->next[i - 1] = i;
    return KVE_OK;
}

static kve_status encode_into(encoder *e, const char *text, size_t len)
{
    const lm_tokenizer *t = e->t;
    kve_status st = KVE_OK;
    if (len > 0) /* run.c's add_dummy_prefix */
        st = push_token(e, lm_piece_id(t, " ", 1), ' ');
    /* One token per code point found among the pieces, else its bytes. */
    char cp[4];
    size_t cp_len = 0;
    for (size_t i = 0; i < len && st == KVE_OK; i++) {
        unsigned char c = (unsigned char)text[i];
        if ((c & 0xC0) != 0x80)
            cp_len = 0;
        cp[cp_len++] = (char)c;
        unsigned char next = i + 1 < len ? (unsigned char)text[i + 1] : 0;
        if ((next & 0xC0) == 0x80 && cp_len < 4)
            continue;
        int32_t id = lm_piece_id(t, cp, cp_len);
        if (id >= 0)
            st = push_token(e, id, 0);
        else
            for (size_t k = 0; k < cp_len && st == KVE_OK; k++)
                st = push_token(e, -1, (unsigned char)cp[k]);
        cp_len = 0;
    }
    if (st != KVE_OK)
        return st;
    for (size_t i = 0; i + 1 < e->n; i++)
        consider(e, i);
    while (e->heap_n) {
        pair p = heap_pop(e->heap, &e->heap_n);
        if (e->dead[p.left] || e->dead[p.right] || e->ver[p.left] != p.ver_left ||
            e->ver[p.right] != p.ver_right || e->next[p.left] != p.right)
            continue; /* stale: one side merged since */
        /* Merge right into left. */
        e->id[p.left] = p.id;
        e->ver[p.left]++;
        e->dead[p.right] = 1;
        e->ver[p.right]++;
        e->next[p.left] = e->next[p.right];
        if (e->next[p.right] != SIZE_MAX)
            e->prev[e->next[p.right]] = p.left;
        if (e->prev[p.left] != SIZE_MAX)
            consider(e, e->prev[p.left]);
        consider(e, p.left);
    }
    return KVE_OK;
}

kve_status lm__encode_vocab(const lm_tokenizer *t, const char *text, size_t len, int32_t *out,
                            size_t *n_out);

/* The GGUF kinds (vocab.c) into a block of lm_encode_bound tokens first. */
static kve_status encode_gguf(const lm_tokenizer *t, const char *text, size_t len, int32_t *tokens,
                              size_t cap, size_t *n)
{
    size_t most = lm_encode_bound(t, len);
    if (most > SIZE_MAX / 64)
        return kve_set_error(KVE_ENOMEM, "encode: text of %zu bytes is too long", len);
    int32_t *out = lm_malloc(&t->alloc, most * sizeof *out);
    if (!out)
        return kve_set_error(KVE_ENOMEM, "encode: out of memory for %zu bytes of text", len);
    size_t count = 0;
    kve_status st = lm__encode_vocab(t, text, len, out, &count);
    if (st == KVE_OK && count > cap)
        st = kve_set_error(KVE_ERANGE, "encode: %zu tokens do not fit in %zu", count, cap);
    if (st == KVE_OK) {
        if (count)
            memcpy(tokens, out, count * sizeof *out);
        *n = count;
    }
    lm_free(&t->alloc, out);
    return st;
}

kve_status lm_tokenize(const lm_tokenizer *t, const char *text, size_t len, int32_t *tokens,
                       size_t cap, size_t *n)
{
    if (!t || (!text && len) || (!tokens && cap) || !n)
        return kve_set_error(KVE_EINVAL, "tokenize: NULL argument");
    size_t first = t->add_bos && t->bos >= 0, last = t->add_eos && t->eos >= 0, m = 0;
    if (cap < first)
        return kve_set_error(KVE_ERANGE, "tokenize: BOS does not fit in %zu", cap);
    kve_status st = lm_encode(t, text, len, tokens + first, cap - first, &m);
    if (st != KVE_OK)
        return st;
    if (m > cap - first || last > cap - first - m) /* first + m + last > cap, without overflow */
        return kve_set_error(KVE_ERANGE, "tokenize: %zu tokens do not fit in %zu", first + m + last,
                             cap);
    if (first)
        tokens[0] = t->bos;
    if (last)
        tokens[first + m] = t->eos;
    *n = first + m + last;
    return KVE_OK;
}

kve_status lm_encode(const lm_tokenizer *t, const char *text, size_t len, int32_t *tokens,
                     size_t cap, size_t *n)
{
    if (!t || (!text && len) || (!tokens && cap) || !n)
        return kve_set_error(KVE_EINVAL, "encode: NULL argument");
    if (t->kind != LM_TOK_RUNC)
        return encode_gguf(t, text, len, tokens, cap, n);
    size_t most = len + 1; /* the dummy prefix, then at most one token a byte */
    if (most > SIZE_MAX / 64)
        return kve_set_error(KVE_ENOMEM, "encode: text of %zu bytes is too long", len);
    encoder e = {.t = t};
    e.id = lm_malloc(&t->alloc, most * sizeof *e.id);
    e.next = lm_malloc(&t->alloc, most * sizeof *e.next);
    e.prev = lm_malloc(&t->alloc, most * sizeof *e.prev);
    e.ver = lm_calloc(&t->alloc, most, sizeof *e.ver);
    e.dead = lm_calloc(&t->alloc, most, 1);
    /* Each merge pushes at most two candidates: n - 1 + 2 (n - 1) in all. */
    e.heap = lm_malloc(&t->alloc, 3 * most * sizeof *e.heap);
    e.buf = lm_malloc(&t->alloc, 2 * (size_t)t->longest);
    kve_status st;
    if (!e.id || !e.next || !e.prev || !e.ver || !e.dead || !e.heap || !e.buf)
        st = kve_set_error(KVE_ENOMEM, "encode: out of memory for %zu bytes of text", len);
    else
        st = encode_into(&e, text, len);
    size_t count = 0;
    if (st == KVE_OK) {
        for (size_t i = e.n ? 0 : SIZE_MAX; i != SIZE_MAX; i = e.next[i])
            count++;
        if (count > cap)
            st = kve_set_error(KVE_ERANGE, "encode: %zu tokens do not fit in %zu", count, cap);
    }
    if (st == KVE_OK) {
        size_t i = 0; /* node 0 is never merged away: the list starts there */
        for (size_t k = 0; k < count; k++, i = e.next[i])
            tokens[k] = e.id[i];
        *n = count;
    }
    lm_free(&t->alloc, e.id);
    lm_free(&t->alloc, e.next);
    lm_free(&t->alloc, e.prev);
    lm_free(&t->alloc, e.ver);
    lm_free(&t->alloc, e.dead);
    lm_free(&t->alloc, e.heap);
    lm_free(&t->alloc, e.buf);
    return st;
}
