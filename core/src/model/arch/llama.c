/* Llama 3, 3.1, 3.2, 3.3 (Hugging Face LlamaForCausalLM, llama.cpp's llama): the pre-norm layer
 * with grouped-query attention, no q/k norms, biases on all four attention projections when
 * attention_bias is set and on the MLP's when mlp_bias is, head_dim hidden_size /
 * num_attention_heads unless stated, a tied or separate LM head, and RoPE plain or with Llama
 * 3.1's frequency scaling (rope_scaling type llama3; a GGUF file's rope_freqs).
 *
 * llama.cpp's converter permutes the q and k rows of each head for its interleaved RoPE
 * (gguf_qk_permuted: the reader puts them back). It also writes Mistral checkpoints as llama
 * (arch/mistral.c) and keeps no sliding window for them, and llama.cpp's llama graph has none: a
 * file without the key attends to the whole context, as llama.cpp does; a file with
 * llama.attention.sliding_window (rlx quantize writes it for Mistral) slides every layer. */
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "model/gguf.h"

/* In llama.cpp's converter order; a bias before its weight, as name order puts it. */
const rlx__tensor rlx__llama_tensors[] = {
    {RLX__R_TOKEN_EMBD, "model.embed_tokens.weight", "token_embd.weight", RLX__ALWAYS, 0},
    {RLX__R_OUTPUT_NORM, "model.norm.weight", "output_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_OUTPUT, "lm_head.weight", "output.weight", RLX__IF_UNTIED, 0},
    {RLX__R_ATTN_NORM, "input_layernorm.weight", "attn_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_Q_BIAS, "self_attn.q_proj.bias", "attn_q.bias", RLX__IF_QKV_BIAS, 0},
    {RLX__R_ATTN_Q, "self_attn.q_proj.weight", "attn_q.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_K_BIAS, "self_attn.k_proj.bias", "attn_k.bias", RLX__IF_QKV_BIAS, 0},
    {RLX__R_ATTN_K, "self_attn.k_proj.weight", "attn_k.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_V_BIAS, "self_attn.v_proj.bias", "attn_v.bias", RLX__IF_QKV_BIAS, 0},
    {RLX__R_ATTN_V, "self_attn.v_proj.weight", "attn_v.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_O_BIAS, "self_attn.o_proj.bias", "attn_output.bias", RLX__IF_O_BIAS, 0},
    {RLX__R_ATTN_O, "self_attn.o_proj.weight", "attn_output.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_NORM, "post_attention_layernorm.weight", "ffn_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_GATE_BIAS, "mlp.gate_proj.bias", "ffn_gate.bias", RLX__IF_MLP_BIAS, 0},
    {RLX__R_FFN_GATE, "mlp.gate_proj.weight", "ffn_gate.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_UP_BIAS, "mlp.up_proj.bias", "ffn_up.bias", RLX__IF_MLP_BIAS, 0},
    {RLX__R_FFN_UP, "mlp.up_proj.weight", "ffn_up.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_DOWN_BIAS, "mlp.down_proj.bias", "ffn_down.bias", RLX__IF_MLP_BIAS, 0},
    {RLX__R_FFN_DOWN, "mlp.down_proj.weight", "ffn_down.weight", RLX__ALWAYS, 0},
    {0},
};

rlx_status rlx__llama_check_act(const char *path, const cJSON *root) {
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (!act || cJSON_IsNull(act) || (cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0))
        return RLX_OK;
    return rlx__hf_wrong_type(path, "hidden_act", "\"silu\" (the gated MLP rlx runs)", act);
}

/* LlamaConfig's defaults: max_position_embeddings 2048, head_dim hidden / heads, attention_bias
 * and mlp_bias false. */
static rlx_status read_hf(const char *path, const cJSON *root, rlx__model_desc *d) {
    const rlx__hf_defaults defaults = {.max_position_embeddings = 2048};
    rlx_status st = rlx__hf_read_decoder(path, root, &defaults, d);
    int mlp_bias = 0;
    if (st != RLX_OK || (st = rlx__llama_check_act(path, root)) != RLX_OK ||
        (st = rlx__hf_bool(path, root, "attention_bias", 0, &d->cfg.attention_bias)) != RLX_OK ||
        (st = rlx__hf_bool(path, root, "mlp_bias", 0, &mlp_bias)) != RLX_OK)
        return st;
    d->qkv_bias = d->o_bias = (uint8_t)d->cfg.attention_bias;
    d->mlp_bias = (uint8_t)mlp_bias;
    d->cfg.decoder_sparse_step = 1;
    return RLX_OK;
}

static rlx_status read_gguf(rlx__gguf_cfg *r, rlx__model_desc *d) {
    rlx_status st = rlx__gguf_read_decoder(r, 0, d);
    if (st != RLX_OK)
        return st;
    d->qkv_bias = rlx_weights_find(r->w, "model.layers.0.self_attn.q_proj.bias") != NULL;
    d->o_bias = rlx_weights_find(r->w, "model.layers.0.self_attn.o_proj.bias") != NULL;
    d->cfg.attention_bias = d->qkv_bias;
    d->mlp_bias = rlx_weights_find(r->w, "model.layers.0.mlp.gate_proj.bias") != NULL;
    d->cfg.decoder_sparse_step = 1;
    char key[96];
    snprintf(key, sizeof key, "%s.attention.sliding_window", r->arch);
    int64_t window = 0;
    st = rlx__gguf_int(r->g, key, 1, &window);
    if (st == RLX_E_NOT_FOUND)
        return RLX_OK;
    if (st == RLX_OK && (window < 0 || window > INT32_MAX))
        st = rlx_error(RLX_E_FORMAT, "%s: metadata key '%s' is %lld, not a window size", r->path, key,
                       (long long)window);
    if (st == RLX_OK)
        rlx__desc_window_every_layer(d, window);
    return st;
}

static const char *const hf_types[] = {"llama", NULL};
static const char *const gguf_archs[] = {"llama", NULL};

const rlx__arch rlx__arch_llama = {
    .name = "llama",
    .hf_types = hf_types,
    .gguf_archs = gguf_archs,
    .read_hf = read_hf,
    .read_gguf = read_gguf,
    .tensors = rlx__llama_tensors,
    .build_layer = rlx__blk_decoder_layer,
    .gguf_qk_permuted = 1,
};
