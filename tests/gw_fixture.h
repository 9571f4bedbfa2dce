/* SPDX-License-Identifier: MIT */
/*
 * gw_fixture.h - the converter's writer (tools/gguf_write.h) fed from a
 * fixture model (lm_fixture.h): the source callback and the spec of its
 * shape, for the tests that write GGUF files of random weights.
 */
#ifndef KVE_GW_FIXTURE_H
#define KVE_GW_FIXTURE_H

#include "gguf_write.h"
#include "lm_fixture.h"

static inline int fx_source(void *user, gw_kind kind, int layer, float *out)
{
    const fx_model *m = user;
    size_t D = (size_t)m->dim, F = (size_t)m->hidden, S = D / (size_t)m->heads;
    size_t K = (size_t)m->kv_heads * S, V = (size_t)m->vocab, l = (size_t)layer;
    const float *src = NULL;
    size_t n = 0;
    switch (kind) {
    case GW_EMB: src = m->emb, n = V * D; break;
    case GW_CLS: src = m->cls, n = V * D; break;
    case GW_RMS_ATT: src = m->rms_att + l * D, n = D; break;
    case GW_RMS_FFN: src = m->rms_ffn + l * D, n = D; break;
    case GW_RMS_FINAL: src = m->rms_final, n = D; break;
    case GW_WQ: src = m->wq + l * D * D, n = D * D; break;
    case GW_WK: src = m->wk + l * K * D, n = K * D; break;
    case GW_WV: src = m->wv + l * K * D, n = K * D; break;
    case GW_WO: src = m->wo + l * D * D, n = D * D; break;
    case GW_W1: src = m->w1 + l * F * D, n = F * D; break;
    case GW_W2: src = m->w2 + l * D * F, n = D * F; break;
    case GW_W3: src = m->w3 + l * F * D, n = F * D; break;
    default: return -1;
    }
    memcpy(out, src, n * sizeof *out);
    return 0;
}

static inline gw_spec spec_of(const fx_model *m, uint32_t type)
{
    return (gw_spec){.dim = m->dim, .hidden = m->hidden, .layers = m->layers, .heads = m->heads,
                     .kv_heads = m->kv_heads, .vocab = m->vocab, .seq_len = m->seq_len,
                     .shared = m->shared, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                     .type = type, .emb_type = type, .norm_type = GW_F32};
}

#endif /* KVE_GW_FIXTURE_H */
