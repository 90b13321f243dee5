/* The shared blocks architectures build their layers from (arch.h): weights by role, RMS norm,
 * attention with optional biases, q/k norms and sliding window, the gated MLP and the mixture of
 * experts, and the pre-norm decoder layer of the Llama family made of them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "arch.h"
#include "graph/graph_impl.h"
#include "util/alloc.h"

/* The node name of suffix in the current layer ("layers.3." + suffix), or suffix itself outside
 * one. */
static const char *node_name(const rlx__blk *b, const char *suffix, char *out, size_t len) {
    if (!b->layer)
        return suffix;
    snprintf(out, len, "%s%s", b->layer->nodes, suffix);
    return out;
}

static int declare(rlx__blk *b, const char *name, int64_t rows, int64_t cols, int router) {
    if (b->rc != RLX_OK)
        return -1;
    int id = rlx_graph_find_tensor(b->g, name);
    if (id >= 0)
        return id;
    const rlx_weight *w = rlx__check_weight(b->m, name, rlx__model_find(b->m, name), rows, cols, router, &b->rc);
    if (!w)
        return -1;
    id = rlx_graph_add_tensor(b->g, RLX_ROLE_WEIGHT, name, (rlx_dtype)w->dtype, w->n_dims, w->shape, w->data);
    if (id < 0)
        b->rc = id;
    else if (rlx__model_weight_in_memory(b->m, w))
        rlx__graph_weight_in_memory(b->g, id);
    return id;
}

/* The RoPE frequency divisors of the description (RLX__ROPE_LLAMA3) as a weight, declared once;
 * -1 without them. */
static int rope_factors(rlx__blk *b) {
    if (b->rc != RLX_OK || !b->d->rope_freqs)
        return -1;
    int id = rlx_graph_find_tensor(b->g, "rope_freqs");
    if (id >= 0)
        return id;
    const int64_t half = (b->d->rope_dims ? b->d->rope_dims : b->d->cfg.head_dim) / 2;
    id = rlx_graph_add_tensor(b->g, RLX_ROLE_WEIGHT, "rope_freqs", RLX_DTYPE_F32, 1, &half, b->d->rope_freqs);
    if (id < 0)
        b->rc = id;
    else
        rlx__graph_weight_in_memory(b->g, id);
    return id;
}

/* Row of role that applies here, else NULL. */
static const rlx__tensor *row_here(const rlx__blk *b, rlx__role role) {
    const rlx__tensor *t = rlx__arch_tensor(b->d->arch, role);
    if (!t || rlx__role_is_top(role) != !b->layer)
        return NULL;
    return rlx__tensor_applies(t, b->d, b->layer ? &b->layer->kind : NULL) ? t : NULL;
}

static void row_name(const rlx__blk *b, const rlx__tensor *t, int64_t expert, char *out, size_t len) {
    rlx__tensor_hf_name(t, b->layer ? b->layer->tensors : "", expert, out, len);
}

int rlx__blk_has(rlx__blk *b, rlx__role role) {
    const rlx__tensor *t = row_here(b, role);
    if (!t || !t->optional)
        return t != NULL;
    char name[160];
    row_name(b, t, -1, name, sizeof name);
    return rlx__model_find(b->m, name) != NULL;
}

int rlx__blk_weight(rlx__blk *b, rlx__role role, int64_t expert) {
    if (b->rc != RLX_OK)
        return -1;
    const rlx__tensor *t = row_here(b, role);
    if (!t) {
        b->rc = rlx_error(RLX_E_INTERNAL, "model builder: architecture %s has no tensor of role %d in %s",
                          b->d->arch->name, (int)role, b->layer ? b->layer->tensors : "the top level");
        return -1;
    }
    char name[160];
    row_name(b, t, expert, name, sizeof name);
    int64_t rows, cols;
    rlx__role_shape(role, b->d, &rows, &cols);
    return declare(b, name, rows, cols, role == RLX__R_FFN_ROUTER);
}

int rlx__blk_named_weight(rlx__blk *b, const char *name, int64_t rows, int64_t cols) {
    return declare(b, name, rows, cols, 0);
}

int rlx__blk_input(rlx__blk *b, rlx_tensor_role role, const char *name, rlx_dtype dtype, uint32_t n_dims,
                   const int64_t *shape) {
    if (b->rc != RLX_OK)
        return -1;
    int id = rlx_graph_add_tensor(b->g, role, name, dtype, n_dims, shape, NULL);
    if (id < 0)
        b->rc = id;
    return id;
}

int rlx__blk_node(rlx__blk *b, rlx_op op, const char *name, const int *in, uint32_t n, const rlx_op_params *p) {
    if (b->rc != RLX_OK)
        return -1;
    char full[96];
    int id = rlx_graph_add_node(b->g, op, node_name(b, name, full, sizeof full), in, n, p);
    if (id < 0)
        b->rc = id;
    return id;
}

int rlx__blk_node2(rlx__blk *b, rlx_op op, const char *name, int x, int y, const rlx_op_params *p) {
    return rlx__blk_node(b, op, name, (int[]){x, y}, 2, p);
}

static uint32_t layer_index(const rlx__blk *b) { return b->layer ? b->layer->index : UINT32_MAX; }

int rlx__blk_rms_norm(rlx__blk *b, const char *name, int x, int w) {
    rlx_op_params norm = {.eps = (float)b->d->cfg.rms_norm_eps, .layer = layer_index(b)};
    return rlx__blk_node2(b, RLX_OP_RMS_NORM, name, x, w, &norm);
}

int rlx__blk_add(rlx__blk *b, const char *name, int x, int y) {
    return rlx__blk_node2(b, RLX_OP_ADD, name, x, y, NULL);
}

/* x @ W^T (+ bias when the layer has the bias role). */
static int linear(rlx__blk *b, const char *name, int x, rlx__role weight, rlx__role bias) {
    int w = rlx__blk_weight(b, weight, -1);
    if (!rlx__blk_has(b, bias))
        return rlx__blk_node2(b, RLX_OP_MATMUL, name, x, w, NULL);
    int bias_id = rlx__blk_weight(b, bias, -1);
    return rlx__blk_node(b, RLX_OP_MATMUL, name, (int[]){x, w, bias_id}, 3, NULL);
}

int rlx__blk_attention(rlx__blk *b, int h) {
    const rlx_model_config *c = &b->d->cfg;
    const uint32_t layer = layer_index(b);
    rlx_op_params rope = {.rope_theta = (float)c->rope_theta,
                          .head_dim = (uint32_t)c->head_dim,
                          .rope_dims = (uint32_t)b->d->rope_dims,
                          .layer = layer};
    rlx_op_params attn = {.scale = (float)(1.0 / sqrt((double)c->head_dim)),
                          .head_dim = (uint32_t)c->head_dim,
                          .n_heads = (uint32_t)c->num_attention_heads,
                          .n_kv_heads = (uint32_t)c->num_key_value_heads,
                          .window = b->layer ? b->layer->kind.window : 0,
                          .layer = layer};
    int q = linear(b, "attn.q_proj", h, RLX__R_ATTN_Q, RLX__R_ATTN_Q_BIAS);
    int k = linear(b, "attn.k_proj", h, RLX__R_ATTN_K, RLX__R_ATTN_K_BIAS);
    int v = linear(b, "attn.v_proj", h, RLX__R_ATTN_V, RLX__R_ATTN_V_BIAS);
    if (rlx__blk_has(b, RLX__R_ATTN_Q_NORM))
        q = rlx__blk_rms_norm(b, "attn.q_norm", q, rlx__blk_weight(b, RLX__R_ATTN_Q_NORM, -1));
    if (rlx__blk_has(b, RLX__R_ATTN_K_NORM))
        k = rlx__blk_rms_norm(b, "attn.k_norm", k, rlx__blk_weight(b, RLX__R_ATTN_K_NORM, -1));
    const int factors = rope_factors(b);
    const uint32_t n_rope = factors >= 0 ? 3 : 2;
    q = rlx__blk_node(b, RLX_OP_ROPE, "attn.q_rope", (int[]){q, b->pos, factors}, n_rope, &rope);
    k = rlx__blk_node(b, RLX_OP_ROPE, "attn.k_rope", (int[]){k, b->pos, factors}, n_rope, &rope);
    const int in[7] = {q, k, v, b->pos, b->kc, b->vc, b->seq};
    int a = rlx__blk_node(b, RLX_OP_ATTENTION, "attn.attention", in, b->seq >= 0 ? 7 : 6, &attn);
    if (rlx__blk_has(b, RLX__R_ATTN_GATE)) {
        int gate =
            rlx__blk_node2(b, RLX_OP_MATMUL, "attn.gate_proj", h, rlx__blk_weight(b, RLX__R_ATTN_GATE, -1), NULL);
        a = rlx__blk_node2(b, RLX_OP_SIGMOID_MUL, "attn.output_gate", a, gate, NULL);
    }
    return linear(b, "attn.o_proj", a, RLX__R_ATTN_O, RLX__R_ATTN_O_BIAS);
}

int rlx__blk_gated_deltanet(rlx__blk *b, int h) {
    const rlx__gdn *g = &b->d->gdn;
    const uint32_t layer = layer_index(b);
    int proj =
        rlx__blk_node2(b, RLX_OP_MATMUL, "linear_attn.in_proj_qkv", h, rlx__blk_weight(b, RLX__R_SSM_QKV, -1), NULL);
    int z = rlx__blk_node2(b, RLX_OP_MATMUL, "linear_attn.in_proj_z", h, rlx__blk_weight(b, RLX__R_SSM_Z, -1), NULL);
    int beta =
        rlx__blk_node2(b, RLX_OP_MATMUL, "linear_attn.in_proj_b", h, rlx__blk_weight(b, RLX__R_SSM_BETA, -1), NULL);
    int alpha =
        rlx__blk_node2(b, RLX_OP_MATMUL, "linear_attn.in_proj_a", h, rlx__blk_weight(b, RLX__R_SSM_ALPHA, -1), NULL);
    const rlx_op_params conv_p = {.layer = layer, .state_rows = b->kc_rows >= 0};
    int conv_in[6] = {proj, rlx__blk_weight(b, RLX__R_SSM_CONV, -1), b->pos, b->kc, b->seq};
    uint32_t n_conv = b->seq >= 0 ? 5 : 4;
    if (b->kc_rows >= 0)
        conv_in[n_conv++] = b->kc_rows;
    int qkv = rlx__blk_node(b, RLX_OP_SSM_CONV, "linear_attn.conv", conv_in, n_conv, &conv_p);
    /* transformers' l2norm epsilon, and q scaled by key_dim^-1/2 */
    const rlx_op_params delta_p = {.eps = 1e-6f,
                                   .scale = (float)(1.0 / sqrt((double)g->k_dim)),
                                   .head_dim = (uint32_t)g->k_dim,
                                   .n_heads = (uint32_t)g->v_heads,
                                   .n_kv_heads = (uint32_t)g->k_heads,
                                   .head_dim_v = (uint32_t)g->v_dim,
                                   .kv_tiled = g->tiled,
                                   .state_rows = b->vc_rows >= 0,
                                   .layer = layer};
    int delta_in[9] = {
        qkv,    alpha, beta,  rlx__blk_weight(b, RLX__R_SSM_A, -1), rlx__blk_weight(b, RLX__R_SSM_DT, -1),
        b->pos, b->vc, b->seq};
    uint32_t n_delta = b->seq >= 0 ? 8 : 7;
    if (b->vc_rows >= 0)
        delta_in[n_delta++] = b->vc_rows;
    int o = rlx__blk_node(b, RLX_OP_GATED_DELTA, "linear_attn.delta", delta_in, n_delta, &delta_p);
    /* the gated RMS norm, per value head: norm(o) * w * silu(z) */
    o = rlx__blk_rms_norm(b, "linear_attn.norm", o, rlx__blk_weight(b, RLX__R_SSM_NORM, -1));
    o = rlx__blk_node2(b, RLX_OP_SWIGLU, "linear_attn.norm_gate", z, o, NULL);
    return rlx__blk_node2(b, RLX_OP_MATMUL, "linear_attn.out_proj", o, rlx__blk_weight(b, RLX__R_SSM_OUT, -1), NULL);
}

int rlx__blk_gated_mlp(rlx__blk *b, int h) {
    int gate = linear(b, "mlp.gate_proj", h, RLX__R_FFN_GATE, RLX__R_FFN_GATE_BIAS);
    int up = linear(b, "mlp.up_proj", h, RLX__R_FFN_UP, RLX__R_FFN_UP_BIAS);
    int act = rlx__blk_node2(b, RLX_OP_SWIGLU, "mlp.swiglu", gate, up, NULL);
    return linear(b, "mlp.down_proj", act, RLX__R_FFN_DOWN, RLX__R_FFN_DOWN_BIAS);
}

/* The shared expert's hidden_size ones as an F32[hidden, 1] weight, declared once. */
static int shexp_ones(rlx__blk *b) {
    if (b->rc != RLX_OK)
        return -1;
    if (!b->d->shexp_ones) {
        b->rc = rlx_error(RLX_E_INTERNAL, "model builder: architecture %s has a shared expert but no ones for its gate",
                          b->d->arch->name);
        return -1;
    }
    int id = rlx_graph_find_tensor(b->g, "shared_expert_gate.ones");
    if (id >= 0)
        return id;
    const int64_t shape[2] = {b->d->cfg.hidden_size, 1};
    id = rlx_graph_add_tensor(b->g, RLX_ROLE_WEIGHT, "shared_expert_gate.ones", RLX_DTYPE_F32, 2, shape,
                              b->d->shexp_ones);
    if (id < 0)
        b->rc = id;
    else
        rlx__graph_weight_in_memory(b->g, id);
    return id;
}

/* sigmoid(h g^T) * down(silu(gate h) * up h), g the shared expert's gate row. The logit [T,1] is
 * widened to [T,hidden] by a MATMUL with ones, since SIGMOID_MUL takes operands of one shape. */
static int shared_expert(rlx__blk *b, int h) {
    int gate = rlx__blk_node2(b, RLX_OP_MATMUL, "mlp.shared_expert.gate_proj", h,
                              rlx__blk_weight(b, RLX__R_FFN_GATE_SHEXP, -1), NULL);
    int up = rlx__blk_node2(b, RLX_OP_MATMUL, "mlp.shared_expert.up_proj", h,
                            rlx__blk_weight(b, RLX__R_FFN_UP_SHEXP, -1), NULL);
    int act = rlx__blk_node2(b, RLX_OP_SWIGLU, "mlp.shared_expert.swiglu", gate, up, NULL);
    int out = rlx__blk_node2(b, RLX_OP_MATMUL, "mlp.shared_expert.down_proj", act,
                             rlx__blk_weight(b, RLX__R_FFN_DOWN_SHEXP, -1), NULL);
    int logit = rlx__blk_node2(b, RLX_OP_MATMUL, "mlp.shared_expert_gate", h,
                               rlx__blk_weight(b, RLX__R_FFN_SHEXP_GATE, -1), NULL);
    int wide = rlx__blk_node2(b, RLX_OP_MATMUL, "mlp.shared_expert_gate.wide", logit, shexp_ones(b), NULL);
    return rlx__blk_node2(b, RLX_OP_SIGMOID_MUL, "mlp.shared_expert.gated", out, wide, NULL);
}

int rlx__blk_moe(rlx__blk *b, int h) {
    const rlx_model_config *c = &b->d->cfg;
    if (b->rc != RLX_OK)
        return -1;
    const uint32_t n_in = 2 + 3 * (uint32_t)c->num_experts;
    int *in = rlx__malloc(n_in * sizeof *in);
    if (!in) {
        b->rc = rlx_error(RLX_E_NOMEM, "model builder: out of memory");
        return -1;
    }
    in[0] = h;
    in[1] = rlx__blk_weight(b, RLX__R_FFN_ROUTER, -1);
    for (int64_t e = 0; e < c->num_experts; e++) {
        in[2 + 3 * e] = rlx__blk_weight(b, RLX__R_FFN_GATE_EXP, e);
        in[3 + 3 * e] = rlx__blk_weight(b, RLX__R_FFN_UP_EXP, e);
        in[4 + 3 * e] = rlx__blk_weight(b, RLX__R_FFN_DOWN_EXP, e);
    }
    rlx_op_params moe = {.n_experts = (uint32_t)c->num_experts,
                         .top_k = (uint32_t)c->num_experts_per_tok,
                         .norm_topk = (uint32_t)c->norm_topk_prob,
                         .layer = layer_index(b)};
    int out = rlx__blk_node(b, RLX_OP_MOE, "mlp.moe", in, n_in, &moe);
    free(in);
    if (rlx__blk_has(b, RLX__R_FFN_GATE_SHEXP))
        out = rlx__blk_add(b, "mlp.shared_expert.residual", out, shared_expert(b, h));
    return out;
}

int rlx__blk_decoder_layer(rlx__blk *b, int x) {
    int h = rlx__blk_rms_norm(b, "input_norm", x, rlx__blk_weight(b, RLX__R_ATTN_NORM, -1));
    const int mixer = b->layer && b->layer->kind.linear ? rlx__blk_gated_deltanet(b, h) : rlx__blk_attention(b, h);
    x = rlx__blk_add(b, "attn.residual", x, mixer);
    h = rlx__blk_rms_norm(b, "post_attn_norm", x, rlx__blk_weight(b, RLX__R_FFN_NORM, -1));
    int mlp = b->layer && b->layer->kind.moe ? rlx__blk_moe(b, h) : rlx__blk_gated_mlp(b, h);
    return rlx__blk_add(b, "mlp.residual", x, mlp);
}
