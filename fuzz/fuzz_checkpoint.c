/* SPDX-License-Identifier: MIT */
/*
 * fuzz_checkpoint.c - the checkpoint loader (every format: llama2.c legacy,
 * version 1 and 2, GGUF) and the decode step, on whatever bytes the fuzzer
 * makes.
 *
 * Each input is copied into an aligned buffer and parsed with
 * lm_model_from_memory; fuzz_model.h says what is checked of a refusal and
 * of an accepted model (every tensor inside the input, a few decode steps
 * in both position modes). Models stay small: the input holds all their
 * weights. The corpus holds llama2.c files; fuzz_gguf's holds GGUF ones.
 */
#define FUZZ_TARGET "fuzz_checkpoint"
#include "fuzz_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void *buf;
    lm_model *m = load_checked(data, size, &buf);
    if (m) {
        decode_a_little(m, LM_POS_ORIGINAL);
        decode_a_little(m, LM_POS_CACHE);
        lm_model_free(m);
    }
    free(buf);
    return 0;
}
