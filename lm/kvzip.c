/* SPDX-License-Identifier: MIT */
/*
 * kvzip.c - KVzip's reconstruction prompts for the decoder
 * (lm_prefill_kvzip in decode.c does the reconstruction itself).
 *
 * The texts are kvpress's KVzipPress (`prepare`) for a model without a chat
 * template: "\n\nRepeat the previous context exactly." before the first
 * chunk, "\n\nRepeat the part of the previous context exactly, starting
 * with" and the previous chunk's last 8 tokens before a later one, then the
 * suffix "\n"; chunks of 2048 prompt positions. Encoded here with the
 * model's own tokenizer (lm_encode: the dummy-prefix space first).
 */
#include "lm.h"

#include <string.h>

kve_status lm_kvzip_default(const lm_tokenizer *t, lm_kvzip *out)
{
    static const char first[] = "\n\nRepeat the previous context exactly.\n";
    static const char later[] = "\n\nRepeat the part of the previous context exactly, starting with";
    if (!t || !out)
        return kve_set_error(KVE_EINVAL, "kvzip: NULL argument");
    lm_kvzip k;
    memset(&k, 0, sizeof k);
    int32_t nl[4];
    size_t n_nl = 0;
    kve_status st = lm_encode(t, "\n", 1, nl, 4, &n_nl); /* the dummy prefix, then "\n" */
    if (st == KVE_OK && n_nl == 0)
        st = kve_set_error(KVE_EINVAL, "the tokenizer encodes a newline to no token");
    if (st == KVE_OK) {
        k.newline = nl[n_nl - 1];
        st = lm_encode(t, first, sizeof first - 1, k.first, LM_KVZIP_PROMPT_MAX, &k.n_first);
    }
    if (st == KVE_OK)
        st = lm_encode(t, later, sizeof later - 1, k.later, LM_KVZIP_PROMPT_MAX, &k.n_later);
    if (st != KVE_OK)
        return kve_set_error(st, "kvzip: encoding its prompts: %s", kve_last_error());
    k.chunk = 2048;
    k.overlap = 8;
    *out = k;
    return KVE_OK;
}
