/* Qwen2 and Qwen2.5 (Hugging Face Qwen2ForCausalLM, llama.cpp's qwen2): the Llama layer with
 * biases on the q, k and v projections (always; none on o), no q/k norms, head_dim
 * hidden_size / num_attention_heads unless stated, and Qwen-style sliding windows. The small
 * Qwen2.5 checkpoints tie the LM head to the embedding. llama.cpp's converter keeps the tensors
 * as they are (NeoX RoPE, as here). */
#include "model/arch.h"

static const rlx__tensor tensors[] = {
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
    {RLX__R_ATTN_O, "self_attn.o_proj.weight", "attn_output.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_NORM, "post_attention_layernorm.weight", "ffn_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_GATE, "mlp.gate_proj.weight", "ffn_gate.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_UP, "mlp.up_proj.weight", "ffn_up.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_DOWN, "mlp.down_proj.weight", "ffn_down.weight", RLX__ALWAYS, 0},
    {0},
};

/* Qwen2Config's defaults: max_position_embeddings 32768, head_dim hidden / heads. */
static rlx_status read_hf(const char *path, const cJSON *root, rlx__model_desc *d) {
    const rlx__hf_defaults defaults = {.max_position_embeddings = 32768};
    rlx_status st = rlx__hf_read_decoder(path, root, &defaults, d);
    if (st != RLX_OK)
        return st;
    d->qkv_bias = 1;
    d->cfg.decoder_sparse_step = 1;
    return rlx__hf_read_qwen_sliding(path, root, d);
}

/* llama.cpp's qwen2 graph has no sliding window: every layer attends to the whole context. */
static rlx_status read_gguf(rlx__gguf_cfg *r, rlx__model_desc *d) {
    rlx_status st = rlx__gguf_read_decoder(r, 0, d);
    d->qkv_bias = 1;
    d->cfg.decoder_sparse_step = 1;
    return st;
}

static const char *const hf_types[] = {"qwen2", NULL};
static const char *const gguf_archs[] = {"qwen2", NULL};

const rlx__arch rlx__arch_qwen2 = {
    .name = "qwen2",
    .hf_types = hf_types,
    .gguf_archs = gguf_archs,
    .read_hf = read_hf,
    .read_gguf = read_gguf,
    .tensors = tensors,
    .build_layer = rlx__blk_decoder_layer,
};
