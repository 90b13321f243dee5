/* libFuzzer target: the safetensors reader (core/src/model/safetensors.c) on arbitrary bytes as a
 * model's model.safetensors. The reader takes a model folder, so each input is written there
 * first. Whatever it accepts is then read the way the model reads it: every tensor's first and
 * last byte, and its size against its shape and dtype, so a header whose offsets or shapes lie is
 * caught by AddressSanitizer or the abort below. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_files.h"
#include "rlx/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t dtype_size(uint32_t dtype) {
    switch (dtype) {
    case RLX_DTYPE_F32:
        return 4;
    case RLX_DTYPE_BF16:
    case RLX_DTYPE_F16:
        return 2;
    default:
        fprintf(stderr, "safetensors accepted a tensor of dtype %u\n", dtype);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("model.safetensors", data, size);
    rlx_weights *w;
    if (rlx_weights_open(fuzz_dir_path(), &w) != RLX_OK)
        return 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < rlx_weights_count(w); i++) {
        const rlx_weight *t = rlx_weights_at(w, i);
        size_t elements = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            elements *= (size_t)t->shape[d];
        if (elements * dtype_size(t->dtype) != t->nbytes || rlx_weights_find(w, t->name) != t) {
            fprintf(stderr, "safetensors accepted tensor '%s' of %zu bytes for %zu elements\n", t->name, t->nbytes,
                    elements);
            abort();
        }
        if (t->nbytes)
            sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
    }
    (void)sink;
    rlx_weights_close(w);
    return 0;
}
