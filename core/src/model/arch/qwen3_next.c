/* Qwen3-Next (Hugging Face Qwen3NextForCausalLM, llama.cpp's qwen3next): the layers Qwen3.5 took
 * over (arch/qwen3_5.c: Gated DeltaNet and gated full attention with partial RoPE, (1 + w) RMS
 * norms, an MTP layer) with Qwen3.5-MoE's mixture of experts and shared expert
 * (arch/qwen3_5_moe.c), in a flat config.json. What differs from Qwen3.5-MoE:
 * - a Gated DeltaNet layer projects q, k, v and z in one matrix, in_proj_qkvz, grouped per key
 *   head (key head h's rows: its query, its key, then the values and z of its v_heads / k_heads
 *   value heads), and b and a in one, in_proj_ba, grouped the same way (head h's b rows, then
 *   its a rows). fix_weights puts them into Qwen3.5's four projections. llama.cpp's converter
 *   does the same to in_proj_qkvz (attn_qkv, attn_gate) but writes in_proj_ba whole (ssm_ba),
 *   and keeps the value heads in Hugging Face's order (not tiled as for qwen35);
 * - norm_topk_prob is a field (default true), and decoder_sparse_step and mlp_only_layers may
 *   leave some layers a dense MLP, as in Qwen3-MoE;
 * - no M-RoPE: plain rotary embedding on partial_rotary_factor of each head. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "model/weights_internal.h"
#include "util/json.h"

/* Ordered as llama.cpp's converter writes a layer. */
static const rlx__tensor tensors[] = {
    {RLX__R_TOKEN_EMBD, "model.embed_tokens.weight", "token_embd.weight", RLX__ALWAYS, 0},
    {RLX__R_OUTPUT_NORM, "model.norm.weight", "output_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_OUTPUT, "lm_head.weight", "output.weight", RLX__IF_UNTIED, 0},
    {RLX__R_ATTN_NORM, "input_layernorm.weight", "attn_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_Q, "self_attn.q_proj.weight", "attn_q.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_GATE, "self_attn.q_proj.weight[gate]", "attn_q.weight[gate]", RLX__IF_ATTN_GATE, 0},
    {RLX__R_ATTN_K, "self_attn.k_proj.weight", "attn_k.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_V, "self_attn.v_proj.weight", "attn_v.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_O, "self_attn.o_proj.weight", "attn_output.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_Q_NORM, "self_attn.q_norm.weight", "attn_q_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_ATTN_K_NORM, "self_attn.k_norm.weight", "attn_k_norm.weight", RLX__ALWAYS, 0},
    /* in_proj_qkvz and in_proj_ba (ssm_ba) split by fix_weights */
    {RLX__R_SSM_QKV, "linear_attn.in_proj_qkv.weight", "attn_qkv.weight", RLX__ALWAYS, 0},
    {RLX__R_SSM_Z, "linear_attn.in_proj_z.weight", "attn_gate.weight", RLX__ALWAYS, 0},
    {RLX__R_SSM_CONV, "linear_attn.conv1d.weight", "ssm_conv1d.weight", RLX__ALWAYS, 0},
    {RLX__R_SSM_DT, "linear_attn.dt_bias", "ssm_dt.bias", RLX__ALWAYS, 0},
    {RLX__R_SSM_A, "linear_attn.A_log", "ssm_a", RLX__ALWAYS, 0},
    {RLX__R_SSM_BETA, "linear_attn.in_proj_b.weight", "ssm_beta.weight", RLX__ALWAYS, 0},
    {RLX__R_SSM_ALPHA, "linear_attn.in_proj_a.weight", "ssm_alpha.weight", RLX__ALWAYS, 0},
    {RLX__R_SSM_NORM, "linear_attn.norm.weight", "ssm_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_SSM_OUT, "linear_attn.out_proj.weight", "ssm_out.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_NORM, "post_attention_layernorm.weight", "post_attention_norm.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_GATE, "mlp.gate_proj.weight", "ffn_gate.weight", RLX__IF_DENSE, 0},
    {RLX__R_FFN_UP, "mlp.up_proj.weight", "ffn_up.weight", RLX__IF_DENSE, 0},
    {RLX__R_FFN_DOWN, "mlp.down_proj.weight", "ffn_down.weight", RLX__IF_DENSE, 0},
    {RLX__R_FFN_ROUTER, "mlp.gate.weight", "ffn_gate_inp.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_GATE_EXP, "mlp.experts.*.gate_proj.weight", "ffn_gate_exps.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_UP_EXP, "mlp.experts.*.up_proj.weight", "ffn_up_exps.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_DOWN_EXP, "mlp.experts.*.down_proj.weight", "ffn_down_exps.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_SHEXP_GATE, "mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_GATE_SHEXP, "mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_UP_SHEXP, "mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight", RLX__IF_MOE, 0},
    {RLX__R_FFN_DOWN_SHEXP, "mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight", RLX__IF_MOE, 0},
    {0},
};

// ---- config.json

/* mlp_only_layers and decoder_sparse_step, as Qwen3NextDecoderLayer reads them: layer i is a
 * mixture of experts unless listed or (i + 1) % decoder_sparse_step != 0. */
static rlx_status read_sparse_layers(const char *path, const cJSON *root, rlx__model_desc *d) {
    rlx_model_config *c = &d->cfg;
    rlx_status st = rlx__hf_int(path, root, "decoder_sparse_step", 1, 1, INT32_MAX, &c->decoder_sparse_step);
    if (st != RLX_OK)
        return st;
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
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        d->layers[i].moe = (uint8_t)rlx_model_config_layer_is_moe(c, i);
        if (!d->layers[i].moe && c->intermediate_size == 0)
            return rlx_error(RLX_E_FORMAT,
                             "%s: missing field 'intermediate_size', needed by the dense MLP of layer %" PRId64, path,
                             i);
    }
    return RLX_OK;
}

static rlx_status read_hf(const char *path, const cJSON *root, rlx__model_desc *d) {
    const cJSON *tc;
    rlx_status st = rlx__qwen3_5_read_hf(path, root, 1, d, &tc);
    if (st == RLX_OK)
        st = rlx__qwen3_5_moe_read_hf(path, tc, d);
    if (st == RLX_OK)
        st = rlx__hf_bool(path, tc, "norm_topk_prob", 1, &d->cfg.norm_topk_prob);
    return st == RLX_OK ? read_sparse_layers(path, tc, d) : st;
}

/* llama.cpp's qwen3next: Qwen3.5's keys and Qwen3.5-MoE's, the value heads in Hugging Face's
 * order (its converter reorders them for qwen35 and qwen35moe only). */
static rlx_status read_gguf(rlx__gguf_cfg *r, rlx__model_desc *d) {
    rlx_status st = rlx__qwen3_5_read_gguf(r, 1, d);
    if (st == RLX_OK)
        st = rlx__qwen3_5_moe_read_gguf(r, d);
    d->gdn.tiled = 0;
    return st;
}

// ---- weights

/* One tensor regroup() makes: its table role and how many consecutive parts it holds. */
typedef struct out_tensor {
    rlx__role role;
    int n_parts;
} out_tensor;

/* t holds `groups` groups of rows, each made of parts of part_rows[p] rows. Its rows are copied
 * part-major (part 0 of every group, then part 1, ...) and the copy is cut into outs, each a run
 * of consecutive parts, named after its role under prefix: t becomes the first, the others are
 * appended. Rows move whole, so any row-wise dtype works. */
static rlx_status regroup(rlx_weights *w, const rlx__model_desc *d, rlx_weight *t, const char *prefix, int64_t groups,
                          const int64_t *part_rows, int n_parts, const out_tensor *outs, int n_outs) {
    int64_t group_rows = 0;
    for (int p = 0; p < n_parts; p++)
        group_rows += part_rows[p];
    const int64_t rows = groups * group_rows;
    if (t->n_dims != 2 || t->shape[0] != rows || t->nbytes % (size_t)rows != 0)
        return rlx_error(RLX_E_FORMAT,
                         "%s: tensor '%s' must have %" PRId64 " rows, %" PRId64 " for each of %" PRId64 " key heads",
                         t->file, t->name, rows, group_rows, groups);
    const size_t row_bytes = t->nbytes / (size_t)rows;
    uint8_t *copy = rlx__weights_own(w, t->nbytes);
    if (!copy)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", t->file);
    const uint8_t *src = t->data;
    int64_t dst_row = 0, skip = 0; /* skip: the rows of a group before part p */
    for (int p = 0; p < n_parts; skip += part_rows[p], p++)
        for (int64_t g = 0; g < groups; g++, dst_row += part_rows[p])
            memcpy(copy + (size_t)dst_row * row_bytes, src + (size_t)(g * group_rows + skip) * row_bytes,
                   (size_t)part_rows[p] * row_bytes);
    rlx__drop_mapped(t->data, t->nbytes); /* the file's order is not read again */
    const rlx_weight whole = *t;
    rlx_status st = RLX_OK;
    int64_t at = 0;
    for (int o = 0, part = 0; st == RLX_OK && o < n_outs; o++) {
        int64_t out_rows = 0;
        for (int k = 0; k < outs[o].n_parts; k++)
            out_rows += groups * part_rows[part++];
        char name[160];
        rlx__tensor_hf_name(rlx__arch_tensor(d->arch, outs[o].role), prefix, -1, name, sizeof name);
        rlx_weight piece = whole;
        piece.data = copy + (size_t)at * row_bytes;
        piece.shape[0] = out_rows;
        piece.nbytes = (size_t)out_rows * row_bytes;
        at += out_rows;
        if (o > 0) {
            piece.name = name;
            st = rlx__weights_append(w, &piece); /* t is not used after: the table may move */
            continue;
        }
        char *own = rlx__weights_own(w, strlen(name) + 1);
        if (!own)
            return rlx_error(RLX_E_NOMEM, "%s: out of memory", t->file);
        memcpy(own, name, strlen(name) + 1);
        piece.name = own;
        *t = piece;
    }
    return st == RLX_OK ? rlx__weights_index(w) : st;
}

/* in_proj_qkvz into in_proj_qkv (q, k, v of all heads) and in_proj_z; in_proj_ba (or a GGUF
 * file's ssm_ba, named `ba`) into in_proj_b and in_proj_a. */
static rlx_status split_linear(rlx_weights *w, const rlx__model_desc *d, const char *prefix, const char *ba) {
    const rlx__gdn *g = &d->gdn;
    const int64_t per_key = g->v_heads / g->k_heads;
    char name[160];
    rlx_weight *t;
    rlx_status st = RLX_OK;
    snprintf(name, sizeof name, "%slinear_attn.in_proj_qkvz.weight", prefix);
    if ((t = (rlx_weight *)rlx_weights_find(w, name))) {
        const int64_t parts[] = {g->k_dim, g->k_dim, per_key * g->v_dim, per_key * g->v_dim};
        const out_tensor outs[] = {{RLX__R_SSM_QKV, 3}, {RLX__R_SSM_Z, 1}};
        st = regroup(w, d, t, prefix, g->k_heads, parts, 4, outs, 2);
    }
    if (st == RLX_OK && (t = (rlx_weight *)rlx_weights_find(w, ba))) {
        const int64_t parts[] = {per_key, per_key};
        const out_tensor outs[] = {{RLX__R_SSM_BETA, 1}, {RLX__R_SSM_ALPHA, 1}};
        st = regroup(w, d, t, prefix, g->k_heads, parts, 2, outs, 2);
    }
    return st; /* a missing tensor is named by the block's weight check */
}

static rlx_status fix_weights(rlx_weights *w, const rlx__model_desc *d, int gguf) {
    char prefix[40], ba[96];
    rlx_status st = RLX_OK;
    for (int64_t l = 0; st == RLX_OK && l < d->cfg.num_hidden_layers; l++) {
        if (!d->layers[l].linear)
            continue;
        snprintf(prefix, sizeof prefix, "model.layers.%u.", (unsigned)l);
        if (gguf)
            snprintf(ba, sizeof ba, "blk.%u.ssm_ba.weight", (unsigned)l);
        else
            snprintf(ba, sizeof ba, "%slinear_attn.in_proj_ba.weight", prefix);
        st = split_linear(w, d, prefix, ba);
    }
    if (st == RLX_OK)
        st = rlx__qwen3_5_fix_weights(w, d, gguf);
    return st == RLX_OK ? rlx__qwen3_5_moe_fix_experts(w, d, gguf) : st;
}

static const rlx__mtp_names mtp_names = {
    .token_norm = "mtp.pre_fc_norm_embedding.weight",
    .hidden_norm = "mtp.pre_fc_norm_hidden.weight",
    .proj = "mtp.fc.weight",
    .final_norm = "mtp.norm.weight",
    .layer = "mtp.layers.{N}.",
    .embedding_first = 1,
    .layer_moe = 1,
};

static const char *const hf_types[] = {"qwen3_next", NULL};
static const char *const gguf_archs[] = {"qwen3next", NULL};

const rlx__arch rlx__arch_qwen3_next = {
    .name = "qwen3_next",
    .hf_types = hf_types,
    .gguf_archs = gguf_archs,
    .read_hf = read_hf,
    .read_gguf = read_gguf,
    .tensors = tensors,
    .build_layer = rlx__blk_decoder_layer,
    .fix_weights = fix_weights,
    .mtp = &mtp_names,
};
