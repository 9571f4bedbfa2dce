/* SPDX-License-Identifier: MIT */
/*
 * gguf_kv.h - raw GGUF metadata pairs (key, type, value, little endian) in
 * a growing buffer, for gw_spec.extra_kv; and GPT-2's byte characters. For
 * tests/tok_fixture.c and fuzz/fuzz_vocab.c, which write byte-level BPE
 * vocabularies; nothing here shares code with lm/.
 */
#ifndef KVE_GGUF_KV_H
#define KVE_GGUF_KV_H

#include "lm_fixture.h"

#include <stdint.h>
#include <string.h>

enum { KV_U32 = 4, KV_I32 = 5, KV_BOOL = 7, KV_STRING = 8, KV_ARRAY = 9 };

typedef struct kv_pairs {
    fx_buf b;
    size_t count; /* pairs */
} kv_pairs;

static inline void kv_u32(fx_buf *b, uint32_t v)
{
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 24)};
    fx_put(b, le, 4);
}

/* A GGUF string: uint64 length, the bytes. */
static inline void kv_str(fx_buf *b, const void *s, size_t n)
{
    kv_u32(b, (uint32_t)n);
    kv_u32(b, (uint32_t)((uint64_t)n >> 32));
    fx_put(b, s, n);
}

static inline void kv_key(kv_pairs *k, const char *name, uint32_t type)
{
    kv_str(&k->b, name, strlen(name));
    kv_u32(&k->b, type);
    k->count++;
}

static inline void kv_key_str(kv_pairs *k, const char *name, const char *v)
{
    kv_key(k, name, KV_STRING);
    kv_str(&k->b, v, strlen(v));
}

static inline void kv_key_u32(kv_pairs *k, const char *name, uint32_t v)
{
    kv_key(k, name, KV_U32);
    kv_u32(&k->b, v);
}

static inline void kv_key_bool(kv_pairs *k, const char *name, int v)
{
    unsigned char c = (unsigned char)(v != 0);
    kv_key(k, name, KV_BOOL);
    fx_put(&k->b, &c, 1);
}

/* An array's key and header: n elements of type et follow. */
static inline void kv_key_array(kv_pairs *k, const char *name, uint32_t et, size_t n)
{
    kv_key(k, name, KV_ARRAY);
    kv_u32(&k->b, et);
    kv_u32(&k->b, (uint32_t)n);
    kv_u32(&k->b, (uint32_t)((uint64_t)n >> 32));
}

/* GPT-2's character for byte b (bytes_to_unicode: the printable bytes
 * themselves, the other 68 U+0100 onwards in byte order), as UTF-8 into
 * out; returns its length (1 or 2). */
static inline size_t kv_byte_char(unsigned b, char *out)
{
    unsigned cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
        cp = 0x100;
        for (unsigned x = 0; x < b; x++)
            cp += !((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

#endif /* KVE_GGUF_KV_H */
