/* SPDX-License-Identifier: MIT */
/*
 * fuzz_llama.c - kvl_seq_load (the sequence state of a kvevict-llama
 * session: the bank's image, the kept keys, llama.cpp's own state and the
 * logits; tools/llama/engine.c) on corrupted, truncated and random bytes,
 * into a llama.cpp context of models/kjv.gguf.
 *
 * Input: byte 0 is the mode.
 *   mode % 4 == 0 (raw): the rest is a state, loaded as it is.
 *   otherwise (made): byte 1 gives the tokens decoded (1 + b % 48, BOS
 *     first, then a fixed stream) under h2o:budget=12,recent_window=2, or
 *     with mode bit 1 without a policy; the state is saved, then edited by
 *     the remaining bytes, four at a time (op, offset, value): set, flip,
 *     truncate, extend, or write a special 4- or 8-byte value.
 * Every refusal is a status with a one-line message and leaves the sequence
 * empty (it decodes from position 0 as a new one); a state that loads is at
 * the saved position and decodes its next token without complaint (the
 * engine's mask check holds llama.cpp's cells to the restored kept set).
 * Any violation abort()s. The model and llama.cpp are loaded once.
 */
#include "engine.h"
#include "fuzz.h"

#include <string.h>

#ifndef KVE_FUZZ_MODEL
#define KVE_FUZZ_MODEL "models/kjv.gguf"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) FUZZ_CHECK("fuzz_llama", c)

static kvl_api api;
static kvl_model model;
static kvl_engine *eng[2]; /* with the policy, without */
static kvl_seq *seq[2];

static void init(void)
{
    char msg[4600];
    if (kvl_api_open(&api, NULL, msg, sizeof msg) != 0) {
        fprintf(stderr, "fuzz_llama: %s\n", msg);
        abort();
    }
    CHECK(kvl_model_open(&api, KVE_FUZZ_MODEL, &model) == KVE_OK);
    for (int k = 0; k < 2; k++) {
        kvl_options o = {.spec = k ? NULL : "h2o:budget=12,recent_window=2", .batch = 4,
                         .sequences = 1, .cells = 64, .threads = 1, .capture = 1};
        CHECK(kvl_engine_new(&model, &o, &eng[k]) == KVE_OK);
        CHECK(kvl_seq_new(eng[k], 0, &seq[k]) == KVE_OK);
    }
}

static uint64_t special(uint8_t v, int width)
{
    static const uint64_t d[] = {0x7ff8000000000000u, 0xfff0000000000000u, UINT64_MAX,
                                 0x100000000u, 0x80000000u, 0, 1, 64};
    static const uint64_t f[] = {0, 1, 2, 0xffffffffu, 0x7fffffffu, 0x7fc00000u, 0x7c00u,
                                 0xaf143cd8u, 12, 13};
    if (width == 8)
        return d[v % (sizeof d / sizeof d[0])];
    return f[v % (sizeof f / sizeof f[0])];
}

static void put_le(uint8_t *p, uint64_t v, int w)
{
    for (int i = 0; i < w; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void edit(uint8_t **img, size_t *n, fuzz_reader *in)
{
    uint8_t op = fuzz_take(in), lo = fuzz_take(in), hi = fuzz_take(in), v = fuzz_take(in);
    size_t at = *n ? ((size_t)hi << 8 | lo) * 7u % *n : 0;
    switch (op % 6) {
    case 0: if (*n) (*img)[at] = v; break;
    case 1: if (*n) (*img)[at] ^= (uint8_t)(1u << (v % 8)); break;
    case 2: *n = at; break;
    case 3: {
        uint8_t *g = realloc(*img, *n + v % 16u + 1);
        CHECK(g != NULL);
        memset(g + *n, v, v % 16u);
        *img = g;
        *n += v % 16u;
        break;
    }
    case 4: if (at + 8 <= *n) put_le(*img + at, special(v, 8), 8); break;
    default: if (at + 4 <= *n) put_le(*img + at, special(v, 4), 4); break;
    }
}

/* Loads bytes into the empty sequence k and holds it to the contract. */
static void load(int k, const uint8_t *img, size_t n, int32_t saved_pos)
{
    kvl_seq *s = seq[k];
    kve_status st = kvl_seq_load(s, img, n);
    int32_t next = 5;
    if (st != KVE_OK) {
        CHECK(st == KVE_EFORMAT || st == KVE_EINVAL || st == KVE_ENOMEM || st == KVE_EIO);
        CHECK(kve_last_error()[0] != '\0' && !strchr(kve_last_error(), '\n'));
        CHECK(kvl_seq_pos(s) == 0 && kvl_seq_kept(s) == 0);
        CHECK(kvl_decode(s, &next, 1, NULL) == KVE_OK); /* a new sequence */
    } else {
        CHECK(saved_pos < 0 || kvl_seq_pos(s) == saved_pos);
        if (kvl_decode(s, &next, 1, NULL) != KVE_OK)
            CHECK(kvl_seq_pos(s) + 1 > 60); /* only a context that is full may refuse */
    }
    kvl_seq_reset(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        init();
        ready = 1;
    }
    if (size == 0)
        return 0;
    uint8_t mode = data[0];
    fuzz_reader in = {data + 1, size - 1, 0};
    if (mode % 4 == 0) {
        load(mode & 16 ? 1 : 0, data + 1, size - 1, -1);
        return 0;
    }
    int k = (mode & 2) != 0;
    kvl_seq *s = seq[k];
    size_t n = 1 + fuzz_take(&in) % 48;
    int32_t toks[48];
    for (size_t i = 0; i < n; i++)
        toks[i] = i ? (int32_t)(3 + (i * 577) % 1000) : 1;
    CHECK(kvl_decode(s, toks, n, NULL) == KVE_OK);
    size_t bytes = 0;
    CHECK(kvl_seq_save(s, NULL, 0, &bytes) == KVE_OK);
    uint8_t *img = malloc(bytes + 1);
    CHECK(img != NULL);
    CHECK(kvl_seq_save(s, img, bytes, &bytes) == KVE_OK);
    int32_t pos = kvl_seq_pos(s);
    kvl_seq_reset(s);
    int edits = (mode >> 3) % 5;
    for (int e = 0; e < edits; e++)
        edit(&img, &bytes, &in);
    load(k, img, bytes, edits ? -1 : pos);
    free(img);
    return 0;
}
