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
    rlx_model_config *c = &d->cfg;
    c->decoder_sparse_step = 1;
    const cJSON *window = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (window && cJSON_IsNull(window))
        return RLX_OK;
    if ((st = rlx__hf_int(path, root, "sliding_window", 4096, 1, INT32_MAX, &c->sliding_window)) != RLX_OK)
        return st;
    c->use_sliding_window = 1;
    for (int64_t i = 0; i < c->num_hidden_layers; i++)
        d->layers[i].window = (uint32_t)c->sliding_window;
    return RLX_OK;
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
