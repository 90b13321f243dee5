/* Mistral 7B-style models (Hugging Face MistralForCausalLM): the Llama layer without biases, with
 * a sliding window of sliding_window positions on every layer (null: full attention). llama.cpp's
 * converter writes these as architecture llama (permuted q/k, no window); rlx quantize does the
 * same and adds llama.attention.sliding_window, which arch/llama.c reads back. */
#include "model/arch.h"

/* MistralConfig's defaults: max_position_embeddings 4096 * 32, head_dim hidden / heads,
 * sliding_window 4096. */
static rlx_status read_hf(const char *path, const cJSON *root, rlx__model_desc *d) {
    const rlx__hf_defaults defaults = {.max_position_embeddings = 4096 * 32};
    rlx_status st = rlx__hf_read_decoder(path, root, &defaults, d);
    if (st != RLX_OK || (st = rlx__llama_check_act(path, root)) != RLX_OK)
        return st;
    d->cfg.decoder_sparse_step = 1;
    const cJSON *null_window = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (null_window && cJSON_IsNull(null_window))
        return RLX_OK;
    int64_t window;
    if ((st = rlx__hf_int(path, root, "sliding_window", 4096, 1, INT32_MAX, &window)) == RLX_OK)
        rlx__desc_window_every_layer(d, window);
    return st;
}

static const char *const hf_types[] = {"mistral", NULL};
static const char *const gguf_archs[] = {NULL}; /* llama.cpp's files say llama */

const rlx__arch rlx__arch_mistral = {
    .name = "mistral",
    .hf_types = hf_types,
    .gguf_archs = gguf_archs,
    .read_hf = read_hf,
    .tensors = rlx__llama_tensors,
    .build_layer = rlx__blk_decoder_layer,
    .gguf_qk_permuted = 1,
    .gguf_write_arch = "llama",
};
