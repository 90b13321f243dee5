/* Qwen3-MoE (Hugging Face Qwen3MoeForCausalLM, llama.cpp's qwen3moe): Qwen3's attention with a
 * mixture-of-experts MLP in layer i when num_experts > 0, i is not in mlp_only_layers and
 * (i + 1) % decoder_sparse_step == 0, a dense one otherwise. Qwen3's table holds the expert rows. */
#include <inttypes.h>
#include <stdio.h>

#include "model/arch.h"
#include "util/json.h"

static rlx_status read_hf_moe(const char *path, const cJSON *root, rlx_model_config *c) {
    rlx_status st;
    if ((st = rlx__hf_int(path, root, "num_experts", 0, 0, INT32_MAX, &c->num_experts)) != RLX_OK)
        return st;
    if ((st = rlx__hf_int(path, root, "decoder_sparse_step", 1, 1, INT32_MAX, &c->decoder_sparse_step)) != RLX_OK)
        return st;
    if ((st = rlx__hf_bool(path, root, "norm_topk_prob", 0, &c->norm_topk_prob)) != RLX_OK)
        return st;
    if (c->num_experts > 0) {
        if ((st = rlx__hf_int(path, root, "num_experts_per_tok", RLX__REQUIRED, 1, INT32_MAX,
                              &c->num_experts_per_tok)) != RLX_OK)
            return st;
        if (c->num_experts_per_tok > c->num_experts)
            return rlx_error(RLX_E_FORMAT,
                             "%s: field 'num_experts_per_tok' (%" PRId64 ") exceeds num_experts (%" PRId64 ")", path,
                             c->num_experts_per_tok, c->num_experts);
        if ((st = rlx__hf_int(path, root, "moe_intermediate_size", RLX__REQUIRED, 1, INT32_MAX,
                              &c->moe_intermediate_size)) != RLX_OK)
            return st;
    }
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (only && !cJSON_IsNull(only)) {
        if (!cJSON_IsArray(only))
            return rlx__hf_wrong_type(path, "mlp_only_layers", "a list of layer indices", only);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, only) {
            int64_t layer;
            if (!rlx__json_int(e, &layer) || layer < 0 || layer >= c->num_hidden_layers) {
                char field[40], expected[64];
                snprintf(field, sizeof field, "mlp_only_layers[%d]", i);
                snprintf(expected, sizeof expected, "a layer index in [0, %" PRId64 ")", c->num_hidden_layers);
                return rlx__hf_wrong_type(path, field, expected, e);
            }
            c->layer_dense_mlp[layer] = 1;
            i++;
        }
    }
    /* intermediate_size is needed only if some layer keeps a dense MLP */
    for (int64_t i = 0; i < c->num_hidden_layers; i++)
        if (c->intermediate_size == 0 && !rlx_model_config_layer_is_moe(c, i))
            return rlx_error(RLX_E_FORMAT,
                             "%s: missing field 'intermediate_size', needed by the dense MLP of layer %" PRId64, path,
                             i);
    return RLX_OK;
}

static void mark_moe_layers(rlx__model_desc *d) {
    for (int64_t i = 0; i < d->cfg.num_hidden_layers; i++)
        d->layers[i].moe = (uint8_t)rlx_model_config_layer_is_moe(&d->cfg, i);
}

/* Unlike Qwen3Config, Qwen3MoeConfig falls back to hidden_size / num_attention_heads for head_dim. */
static rlx_status read_hf(const char *path, const cJSON *root, rlx__model_desc *d) {
    const rlx__hf_defaults defaults = {.intermediate_optional = 1, .max_position_embeddings = 32768};
    rlx_status st = rlx__hf_read_decoder(path, root, &defaults, d);
    if (st == RLX_OK)
        st = rlx__qwen3_read_hf_attention(path, root, d);
    if (st == RLX_OK)
        st = read_hf_moe(path, root, &d->cfg);
    if (st == RLX_OK)
        mark_moe_layers(d);
    return st;
}

static rlx_status read_gguf(rlx__gguf_cfg *r, rlx__model_desc *d) {
    rlx_model_config *c = &d->cfg;
    rlx_status st = rlx__gguf_read_decoder(r, 1, d);
    if (st != RLX_OK)
        return st;
    rlx__qwen3_read_gguf_attention(r, d);
    c->num_experts = rlx__gguf_cfg_int(r, "expert_count", 0, 0);
    c->num_experts_per_tok = rlx__gguf_cfg_int(r, "expert_used_count", 0, 0);
    c->moe_intermediate_size = rlx__gguf_cfg_int(r, "expert_feed_forward_length", 0, 0);
    c->norm_topk_prob = 1; /* llama.cpp's qwen3moe graph always renormalises the top k */
    if (c->intermediate_size == 0)
        c->intermediate_size = c->moe_intermediate_size;
    if (r->st != RLX_OK)
        return r->st;
    if (c->num_experts_per_tok > c->num_experts)
        return rlx_error(RLX_E_FORMAT, "%s: %" PRId64 " experts per token of %" PRId64, r->path, c->num_experts_per_tok,
                         c->num_experts);
    mark_moe_layers(d);
    return RLX_OK;
}

static const char *const hf_types[] = {"qwen3_moe", NULL};
static const char *const gguf_archs[] = {"qwen3moe", NULL};

const rlx__arch rlx__arch_qwen3_moe = {
    .name = "qwen3_moe",
    .hf_types = hf_types,
    .gguf_archs = gguf_archs,
    .read_hf = read_hf,
    .read_gguf = read_gguf,
    .tensors = rlx__qwen3_tensors,
    .build_layer = rlx__blk_decoder_layer,
};
