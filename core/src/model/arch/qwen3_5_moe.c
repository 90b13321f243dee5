/* Qwen3.5-MoE and Qwen3.6-MoE (Hugging Face Qwen3_5MoeForConditionalGeneration's text model and
 * Qwen3_5MoeForCausalLM, llama.cpp's qwen35moe): Qwen3.5's hybrid of Gated DeltaNet and gated
 * full-attention layers (arch/qwen3_5.c, whose config reader and weight fixes it shares), with a
 * mixture of experts as every layer's MLP, its own MTP layer's too: softmax over the router's
 * logits, the top num_experts_per_tok experts renormalised to sum 1 (always: the config has no
 * norm_topk_prob), plus a shared expert, a SwiGLU MLP every row runs, scaled by sigmoid of one
 * logit of its own gate (mlp.shared_expert_gate).
 *
 * Hugging Face checkpoints store the experts of a layer fused, as transformers defines them:
 * mlp.experts.gate_up_proj [experts, 2 * moe_intermediate_size, hidden] (each expert's gate rows
 * then its up rows) and mlp.experts.down_proj [experts, hidden, moe_intermediate_size]; a
 * checkpoint with one tensor per expert (mlp.experts.E.gate_proj.weight, ...) is read as well.
 * llama.cpp's converter writes them stacked (ffn_*_exps), its shared-expert gate as a vector. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "model/weights_internal.h"
#include "util/alloc.h"

/* Qwen3.5's rows, the MLP a mixture of experts with a shared expert; ordered as llama.cpp's
 * converter writes a layer. */
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

/* At most this many experts per layer, far above any model's (Qwen3-Next: 512): it bounds the
 * views made of fused tensors and the MOE node's inputs (2 + 3 per expert). */
#define MOE_MAX_EXPERTS 4096
/* A bound on the intermediate sizes, as GDN_MAX_DIM bounds Gated DeltaNet shapes: it keeps an
 * expert's size far from overflow whatever a file says. */
#define MOE_MAX_FF (1 << 20)

// ---- config

/* hidden_size ones for the shared expert's gate (arch.h), owned by d. */
static rlx_status alloc_ones(const char *path, rlx__model_desc *d) {
    const int64_t h = d->cfg.hidden_size;
    d->shexp_ones = rlx__malloc((size_t)h * sizeof *d->shexp_ones);
    if (!d->shexp_ones)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", path);
    for (int64_t i = 0; i < h; i++)
        d->shexp_ones[i] = 1.0f;
    return RLX_OK;
}

/* Every layer (and the MTP layer, by its rlx__mtp_names) a mixture of experts, as Qwen3.5-MoE's
 * has; Qwen3-Next may then mark some dense. */
static rlx_status check_counts(const char *path, rlx__model_desc *d) {
    rlx_model_config *c = &d->cfg;
    if (c->num_experts_per_tok > c->num_experts)
        return rlx_error(RLX_E_FORMAT,
                         "%s: field 'num_experts_per_tok' (%" PRId64 ") exceeds num_experts (%" PRId64 ")", path,
                         c->num_experts_per_tok, c->num_experts);
    c->norm_topk_prob = 1;
    c->decoder_sparse_step = 1;
    for (int64_t i = 0; i < c->num_hidden_layers; i++)
        d->layers[i].moe = 1;
    return alloc_ones(path, d);
}

rlx_status rlx__qwen3_5_moe_read_hf(const char *path, const cJSON *tc, rlx__model_desc *d) {
    rlx_model_config *c = &d->cfg;
    rlx_status st;
    if ((st = rlx__hf_int(path, tc, "num_experts", RLX__REQUIRED, 1, MOE_MAX_EXPERTS, &c->num_experts)) != RLX_OK ||
        (st = rlx__hf_int(path, tc, "num_experts_per_tok", RLX__REQUIRED, 1, MOE_MAX_EXPERTS,
                          &c->num_experts_per_tok)) != RLX_OK ||
        (st = rlx__hf_int(path, tc, "moe_intermediate_size", RLX__REQUIRED, 1, MOE_MAX_FF,
                          &c->moe_intermediate_size)) != RLX_OK ||
        (st = rlx__hf_int(path, tc, "shared_expert_intermediate_size", RLX__REQUIRED, 1, MOE_MAX_FF, &d->shexp_ff)) !=
            RLX_OK)
        return st;
    return check_counts(path, d);
}

rlx_status rlx__qwen3_5_moe_read_gguf(rlx__gguf_cfg *r, rlx__model_desc *d) {
    rlx_model_config *c = &d->cfg;
    c->num_experts = rlx__gguf_cfg_int(r, "expert_count", 0, 0);
    c->num_experts_per_tok = rlx__gguf_cfg_int(r, "expert_used_count", 0, 0);
    c->moe_intermediate_size = rlx__gguf_cfg_int(r, "expert_feed_forward_length", 0, 0);
    d->shexp_ff = rlx__gguf_cfg_int(r, "expert_shared_feed_forward_length", 0, 0);
    if (r->st != RLX_OK)
        return r->st;
    if (c->num_experts > MOE_MAX_EXPERTS || c->moe_intermediate_size > MOE_MAX_FF || d->shexp_ff > MOE_MAX_FF)
        return rlx_error(RLX_E_FORMAT,
                         "%s: %" PRId64 " experts of %" PRId64 " and a shared expert of %" PRId64
                         " exceed rlx's bounds (%d experts, intermediate sizes of %d)",
                         r->path, c->num_experts, c->moe_intermediate_size, d->shexp_ff, MOE_MAX_EXPERTS, MOE_MAX_FF);
    if (c->intermediate_size == 0)
        c->intermediate_size = c->moe_intermediate_size; /* no dense layer reads it */
    return check_counts(r->path, d);
}

static rlx_status read_hf(const char *path, const cJSON *root, rlx__model_desc *d) {
    const cJSON *tc;
    rlx_status st = rlx__qwen3_5_read_hf(path, root, 1, d, &tc);
    return st == RLX_OK ? rlx__qwen3_5_moe_read_hf(path, tc, d) : st;
}

static rlx_status read_gguf(rlx__gguf_cfg *r, rlx__model_desc *d) {
    rlx_status st = rlx__qwen3_5_read_gguf(r, 1, d);
    return st == RLX_OK ? rlx__qwen3_5_moe_read_gguf(r, d) : st;
}

// ---- weights

/* Splits fused tensor t ([experts, parts * rows, cols]) into one [rows, cols] view per expert and
 * part, named after role[part]'s row under prefix; t itself becomes expert 0's first part, so
 * the bytes are counted once. */
static rlx_status split_fused(rlx_weights *w, const rlx__model_desc *d, rlx_weight *t, const char *prefix,
                              const rlx__role *roles, int64_t parts, int64_t rows, int64_t cols) {
    const int64_t experts = d->cfg.num_experts;
    const size_t esize = rlx_dtype_size((int)t->dtype);
    if (t->n_dims != 3 || t->shape[0] != experts || t->shape[1] != parts * rows || t->shape[2] != cols || esize == 0 ||
        rlx_iface_dtype_is_quantized(t->dtype) || t->nbytes != (size_t)(experts * parts * rows * cols) * esize)
        return rlx_error(RLX_E_FORMAT,
                         "%s: tensor '%s' must be [%" PRId64 ", %" PRId64 ", %" PRId64 "] of f32, bf16 or f16, "
                         "the layer's experts fused",
                         t->file, t->name, experts, parts * rows, cols);
    const size_t view_bytes = (size_t)(rows * cols) * esize;
    rlx_weight view = *t;
    view.n_dims = 2;
    view.shape[0] = rows;
    view.shape[1] = cols;
    view.nbytes = view_bytes;
    const uint8_t *base = t->data;
    char name[160];
    rlx_status st = RLX_OK;
    for (int64_t e = 0; st == RLX_OK && e < experts; e++)
        for (int64_t p = 0; st == RLX_OK && p < parts; p++) {
            rlx__tensor_hf_name(rlx__arch_tensor(d->arch, roles[p]), prefix, e, name, sizeof name);
            view.data = base + (size_t)(e * parts + p) * view_bytes;
            if (e == 0 && p == 0) {
                char *copy = rlx__weights_own(w, strlen(name) + 1);
                if (!copy)
                    return rlx_error(RLX_E_NOMEM, "%s: out of memory", t->file);
                memcpy(copy, name, strlen(name) + 1);
                *t = view;
                t->name = copy;
                continue;
            }
            view.name = name;
            st = rlx__weights_append(w, &view); /* t is not used after: the table may move */
            t = NULL;
        }
    return st;
}

/* One layer's fused experts (Hugging Face) into views, the table sorted again after each split
 * (a find needs it sorted). */
static rlx_status split_layer_experts(rlx_weights *w, const rlx__model_desc *d, const char *prefix) {
    static const rlx__role gate_up[] = {RLX__R_FFN_GATE_EXP, RLX__R_FFN_UP_EXP}, down[] = {RLX__R_FFN_DOWN_EXP};
    const int64_t h = d->cfg.hidden_size, ff = d->cfg.moe_intermediate_size;
    char name[160];
    snprintf(name, sizeof name, "%smlp.experts.gate_up_proj", prefix);
    rlx_weight *t = (rlx_weight *)rlx_weights_find(w, name);
    rlx_status st = RLX_OK;
    if (t && (st = split_fused(w, d, t, prefix, gate_up, 2, ff, h)) == RLX_OK)
        st = rlx__weights_index(w);
    snprintf(name, sizeof name, "%smlp.experts.down_proj", prefix);
    if (st == RLX_OK && (t = (rlx_weight *)rlx_weights_find(w, name)) &&
        (st = split_fused(w, d, t, prefix, down, 1, h, ff)) == RLX_OK)
        st = rlx__weights_index(w);
    return st;
}

/* A GGUF file's shared-expert gate is the vector [hidden]; the block reads Hugging Face's [1,
 * hidden] matrix, the same bytes. */
static void shexp_gate_matrix(rlx_weights *w, const rlx__model_desc *d, const char *prefix) {
    char name[160];
    rlx__tensor_hf_name(rlx__arch_tensor(d->arch, RLX__R_FFN_SHEXP_GATE), prefix, -1, name, sizeof name);
    rlx_weight *t = (rlx_weight *)rlx_weights_find(w, name);
    if (t && t->n_dims == 1) {
        t->n_dims = 2;
        t->shape[1] = t->shape[0];
        t->shape[0] = 1;
    }
}

rlx_status rlx__qwen3_5_moe_fix_experts(rlx_weights *w, const rlx__model_desc *d, int gguf) {
    char prefix[48];
    rlx_status st = RLX_OK;
    /* layers 0..n-1, then the MTP layer (index n) */
    for (int64_t l = 0; st == RLX_OK && l <= d->cfg.num_hidden_layers; l++) {
        if (l < d->cfg.num_hidden_layers && !d->layers[l].moe)
            continue;
        if (l < d->cfg.num_hidden_layers)
            snprintf(prefix, sizeof prefix, "model.layers.%u.", (unsigned)l);
        else
            snprintf(prefix, sizeof prefix, "%s", RLX__QWEN3_5_MTP_LAYER);
        if (gguf)
            shexp_gate_matrix(w, d, prefix);
        else
            st = split_layer_experts(w, d, prefix);
    }
    return st;
}

/* The text model unnested and the MTP layer named first, so the experts are found under the
 * names the table gives. */
static rlx_status fix_weights(rlx_weights *w, const rlx__model_desc *d, int gguf) {
    rlx_status st = rlx__qwen3_5_fix_weights(w, d, gguf);
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

static const char *const hf_types[] = {"qwen3_5_moe", "qwen3_5_moe_text", NULL};
static const char *const gguf_archs[] = {"qwen35moe", NULL};

const rlx__arch rlx__arch_qwen3_5_moe = {
    .name = "qwen3_5_moe",
    .hf_types = hf_types,
    .gguf_archs = gguf_archs,
    .read_hf = read_hf,
    .read_gguf = read_gguf,
    .tensors = tensors,
    .build_layer = rlx__blk_decoder_layer,
    .fix_weights = fix_weights,
    .mtp = &mtp_names,
};
