/* SPDX-License-Identifier: MIT */
/*
 * fuzz_session.c - the decoder's session images (lm_session_load), on
 * whatever bytes the fuzzer makes, into decoders of a fixed tiny model.
 *
 * Input: byte 0 is the mode, byte 1 picks the decoder's options (policy,
 * positions, sharing) from a table.
 *   mode bit 0 clear: the rest of the input is the image, loaded as is;
 *   mode bit 0 set (a recipe): byte 2 is a count of tokens; a real session
 *       of that many tokens is made, then each following 3 bytes (offset
 *       LE16, xor) edit it, and with mode bit 1 set the checksum is
 *       recomputed, so the edits reach the fields behind it.
 * Checked:
 *   - a refusal is KVE_EFORMAT, KVE_EINVAL or KVE_ENOMEM with a one-line
 *     message, and leaves the decoder unchanged: it still decodes exactly as
 *     a new decoder does (logits compared bit for bit);
 *   - an accepted image is canonical: the loaded decoder saves back to the
 *     very same bytes, and it decodes on from there as a copy of itself
 *     (lm_state_copy) does, bit for bit (or both refuse the same step);
 *   - lm_session_size of the image's first bytes refuses as a load may
 *     (one line), and takes every image the load accepts, stating its size:
 *     no session that loads is over the size bound.
 */
#include "fuzz.h"
#include "lm.h"
#include "lm_fixture.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c) FUZZ_CHECK("fuzz_session", c)

enum { D_ = 16, F_ = 24, L_ = 2, H_ = 4, G_ = 2, V_ = 40, T_ = 12, MAX_TOKENS = 40 };

static const lm_options table[] = {
    {.policy = "h2o:budget=5,recent_window=2"},
    {.policy = "tova:budget=4", .positions = LM_POS_CACHE},
    {.policy = "knorm:budget=5"},
    {.policy = "random:budget=6", .seed = 3},
    {.policy = "h2o:budget=4,recent_window=1", .share_heads = 1, .min_share = 0.25},
    {.policy = NULL},
};
enum { N_TABLE = sizeof table / sizeof table[0] };

static lm_model *model;
static unsigned char *model_img;

static void open_model(void)
{
    if (model)
        return;
    fx_model fx;
    fx_model_init(&fx, D_, F_, L_, H_, G_, V_, T_, 1, 20261129u);
    size_t n;
    model_img = fx_image(&fx, 1, &n);
    fx_model_free(&fx);
    CHECK(lm_model_from_memory(model_img, n, NULL, &model) == KVE_OK);
}

static int32_t tok(size_t t)
{
    return (int32_t)(3 + (t * 7 + 5) % (V_ - 3));
}

/* Decodes up to three tokens on s, their logits into out (3 * V, zeros
 * from a refused step on); the first refusal's status, else KVE_OK (keys
 * edited to huge finite values can overflow the attention, which the
 * policies then refuse). */
static kve_status three_steps(lm_state *s, float *out)
{
    memset(out, 0, 3 * V_ * sizeof(float));
    for (size_t t = 0; t < 3; t++) {
        kve_status st = lm_forward(s, tok(t + 100));
        if (st != KVE_OK)
            return st;
        memcpy(out + t * V_, s->logits, sizeof(float) * V_);
    }
    return KVE_OK;
}

/* A real session of n tokens under options o; *size bytes, malloc'ed. */
static unsigned char *make(const lm_options *o, size_t n, size_t *size)
{
    lm_state *s = NULL;
    CHECK(lm_state_new(model, o, &s) == KVE_OK);
    int32_t toks[MAX_TOKENS];
    for (size_t t = 0; t < n; t++)
        CHECK(lm_forward(s, toks[t] = tok(t)) == KVE_OK);
    lm_session ss = {.tokens = toks, .n_tokens = n};
    kve_rng_seed(&ss.rng, n);
    CHECK(lm_session_save(s, &ss, NULL, 0, size) == KVE_OK);
    unsigned char *img = malloc(*size);
    CHECK(img != NULL && lm_session_save(s, &ss, img, *size, size) == KVE_OK);
    lm_state_free(s);
    return img;
}

static void reseal(unsigned char *img, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n - 8; i++)
        h = (h ^ img[i]) * 0x100000001b3u;
    for (int i = 0; i < 8; i++)
        img[n - 8 + (size_t)i] = (unsigned char)(h >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    open_model();
    fuzz_reader r = {data, size, 0};
    uint8_t mode = fuzz_take(&r);
    const lm_options *o = &table[fuzz_take(&r) % N_TABLE];
    unsigned char *img;
    size_t n;
    if (mode & 1) {
        img = make(o, fuzz_take(&r) % MAX_TOKENS, &n);
        while (r.i + 3 <= r.n) {
            size_t at = (size_t)fuzz_take(&r) | (size_t)fuzz_take(&r) << 8;
            uint8_t x = fuzz_take(&r);
            img[at % n] ^= x;
        }
        if ((mode & 2) && n >= 8)
            reseal(img, n);
    } else {
        n = size - r.i;
        img = malloc(n ? n : 1);
        CHECK(img != NULL);
        if (n)
            memcpy(img, data + r.i, n);
    }
    lm_state *s = NULL;
    CHECK(lm_state_new(model, o, &s) == KVE_OK);
    size_t stated = 0;
    kve_status zs = n >= LM_SESSION_HEADER ? lm_session_size(s, img, n, &stated) : KVE_EFORMAT;
    CHECK(zs == KVE_OK || zs == KVE_EFORMAT || zs == KVE_EINVAL || zs == KVE_ENOMEM);
    if (zs != KVE_OK && n >= LM_SESSION_HEADER)
        CHECK(kve_last_error()[0] != '\0' && strchr(kve_last_error(), '\n') == NULL);
    lm_session got = {.tokens = (int32_t *)&got};
    kve_status st = lm_session_load(s, img, n, &got);
    if (st != KVE_OK) {
        CHECK(st == KVE_EFORMAT || st == KVE_EINVAL || st == KVE_ENOMEM);
        CHECK(kve_last_error()[0] != '\0' && strchr(kve_last_error(), '\n') == NULL);
        CHECK(got.tokens == (int32_t *)&got && s->pos == 0);
        lm_state *fresh = NULL;
        CHECK(lm_state_new(model, o, &fresh) == KVE_OK);
        float a[3 * V_], b[3 * V_];
        CHECK(three_steps(s, a) == KVE_OK && three_steps(fresh, b) == KVE_OK);
        CHECK(memcmp(a, b, sizeof a) == 0);
        lm_state_free(fresh);
    } else {
        size_t n2;
        CHECK(zs == KVE_OK && stated == n);
        CHECK(got.n_tokens == (size_t)s->pos);
        CHECK(lm_session_save(s, &got, NULL, 0, &n2) == KVE_OK && n2 == n);
        unsigned char *again = malloc(n);
        CHECK(again && lm_session_save(s, &got, again, n, &n2) == KVE_OK);
        CHECK(memcmp(again, img, n) == 0);
        free(again);
        lm_state *twin = NULL;
        CHECK(lm_state_new(model, o, &twin) == KVE_OK && lm_state_copy(twin, s) == KVE_OK);
        float a[3 * V_], b[3 * V_];
        CHECK(three_steps(s, a) == three_steps(twin, b));
        CHECK(memcmp(a, b, sizeof a) == 0);
        lm_state_free(twin);
        lm_free(&s->alloc, got.tokens);
    }
    lm_state_free(s);
    free(img);
    return 0;
}
