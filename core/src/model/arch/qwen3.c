/* Qwen3 (Hugging Face Qwen3ForCausalLM, llama.cpp's qwen3): the Llama layer with per-head RMS
 * norms on q and k, biases on all four attention projections when attention_bias is set, and
 * Qwen2-style sliding windows. Its table also holds Qwen3-MoE's expert rows (arch/qwen3_moe.c). */
#include "model/arch.h"

/* In llama.cpp's converter order (a GGUF file written from it keeps this order per layer); a bias
 * before its weight, as name order puts it. */
const rlx__tensor rlx__qwen3_tensors[] = {
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
    {RLX__R_ATTN_Q_NORM, "self_attn.q_norm.weight", "attn_q_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_K_NORM, "self_attn.k_norm.weight", "attn_k_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_NORM, "post_attention_layernorm.weight", "ffn_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_GATE, "mlp.gate_proj.weight", "ffn_gate.weight", RLX__IF_DENSE, 0},
    {RLX__R_FFN_UP, "mlp.up_proj.weight", "ffn_up.weight", RLX__IF_DENSE, 0},
    {RLX__R_FFN_DOWN, "mlp.down_proj.weight", "ffn_down.weight", RLX__IF_DENSE, 0},
    {RLX__R_FFN_ROUTER, "mlp.gate.weight", "ffn_gate_inp.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_GATE_EXP, "mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_UP_EXP, "mlp.experts.*.up_proj.weight", "ffn_up_exps.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_DOWN_EXP, "mlp.experts.*.down_proj.weight", "ffn_down_exps.weight", RLX__IF_MOE, 0},
    {0},
};

rlx_status rlx__qwen3_read_hf_attention(const char *path, const cJSON *root, rlx__model_desc *d) {
    rlx_status st = rlx__hf_bool(path, root, "attention_bias", 0, &d->cfg.attention_bias);
    if (st != RLX_OK)
        return st;
    d->qkv_bias = d->o_bias = (uint8_t)d->cfg.attention_bias;
    d->cfg.decoder_sparse_step = 1;
    return rlx__hf_read_qwen_sliding(path, root, d);
}

void rlx__qwen3_read_gguf_attention(rlx__gguf_cfg *r, rlx__model_desc *d) {
    d->cfg.attention_bias = rlx_weights_find(r->w, "model.layers.0.self_attn.q_proj.bias") != NULL;
    d->qkv_bias = d->o_bias = (uint8_t)d->cfg.attention_bias;
    d->cfg.decoder_sparse_step = 1;
}

/* Hugging Face's Qwen3Config defaults head_dim to 128, not hidden_size / num_attention_heads. */
static rlx_status read_hf(const char *path, const cJSON *root, rlx__model_desc *d) {
    const rlx__hf_defaults defaults = {.head_dim = 128, .max_position_embeddings = 32768};
    rlx_status st = rlx__hf_read_decoder(path, root, &defaults, d);
    return st == RLX_OK ? rlx__qwen3_read_hf_attention(path, root, d) : st;
}

static rlx_status read_gguf(rlx__gguf_cfg *r, rlx__model_desc *d) {
    rlx_status st = rlx__gguf_read_decoder(r, 0, d);
    if (st == RLX_OK)
        rlx__qwen3_read_gguf_attention(r, d);
    return st;
}

static const char *const hf_types[] = {"qwen3", NULL};
static const char *const gguf_archs[] = {"qwen3", NULL};

const rlx__arch rlx__arch_qwen3 = {
    .name = "qwen3",
    .hf_types = hf_types,
    .gguf_archs = gguf_archs,
    .read_hf = read_hf,
    .read_gguf = read_gguf,
    .tensors = rlx__qwen3_tensors,
    .build_layer = rlx__blk_decoder_layer,
};
