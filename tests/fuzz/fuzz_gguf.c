/* libFuzzer target: the GGUF header parser (core/src/model/gguf.c) on arbitrary bytes. Whatever
 * it accepts is then read the way the model and tokenizer readers read it (every string of every
 * string array, every integer array element, the first and last byte of every tensor), so an
 * accepted header whose lengths or offsets lie is caught by AddressSanitizer. */
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rlx__gguf *g;
    if (rlx__gguf_parse("fuzz.gguf", data, size, &g) != RLX_OK)
        return 0;
    volatile uint64_t sink = 0;
    for (size_t i = 0; i < g->n_kv; i++) {
        const rlx__gguf_kv *kv = &g->kv[i];
        if (kv->type == RLX_GGUF_STRING && kv->v.str.len)
            sink += (uint8_t)kv->v.str.s[kv->v.str.len - 1];
        if (kv->type != RLX_GGUF_ARRAY)
            continue;
        const uint8_t *cursor = kv->v.arr.data;
        for (uint64_t j = 0; j < kv->v.arr.n; j++) {
            if (kv->v.arr.type == RLX_GGUF_STRING) {
                const rlx__gguf_str s = rlx__gguf_next_string(&cursor);
                sink += s.len ? (uint8_t)s.s[s.len - 1] : 0;
            } else if (kv->v.arr.type != RLX_GGUF_F32 && kv->v.arr.type != RLX_GGUF_F64 &&
                       kv->v.arr.type != RLX_GGUF_BOOL) {
                sink += (uint64_t)rlx__gguf_array_int(kv, j);
            }
        }
    }
    for (size_t i = 0; i < g->n_tensors; i++)
        sink += g->tensors[i].data[0] + g->tensors[i].data[g->tensors[i].nbytes - 1];
    (void)sink;
    rlx__gguf_close(g);
    return 0;
}
