/* The registry of architectures, the shapes of the tensor roles and the name mapping between
 * Hugging Face and GGUF that every architecture's table defines (arch.h). */
#include <stdio.h>
#include <string.h>

#include "arch.h"

static const rlx__arch *const registry[] = {&rlx__arch_qwen3,       &rlx__arch_qwen3_moe, &rlx__arch_qwen2,
                                            &rlx__arch_llama,       &rlx__arch_mistral,   &rlx__arch_qwen3_5,
                                            &rlx__arch_qwen3_5_moe, &rlx__arch_qwen3_next};
#define N_ARCHS (sizeof registry / sizeof registry[0])

/* Layer prefixes: every architecture so far keeps Hugging Face's and llama.cpp's. */
#define HF_LAYER "model.layers.%u."
#define GGUF_LAYER "blk.%u."

const rlx__arch *rlx__arch_by_hf(const char *model_type) {
    for (size_t i = 0; i < N_ARCHS; i++)
        for (const char *const *t = registry[i]->hf_types; *t; t++)
            if (strcmp(*t, model_type) == 0)
                return registry[i];
    return NULL;
}

const rlx__arch *rlx__arch_by_gguf(const char *name, size_t len) {
    for (size_t i = 0; i < N_ARCHS; i++)
        for (const char *const *t = registry[i]->gguf_archs; *t; t++)
            if (strlen(*t) == len && memcmp(*t, name, len) == 0)
                return registry[i];
    return NULL;
}

static void append_names(char *out, size_t len, size_t *at, const char *const *names) {
    if (!*names)
        *at += (size_t)snprintf(out + *at, len - *at, "none");
    for (const char *const *t = names; *t && *at < len; t++)
        *at += (size_t)snprintf(out + *at, len - *at, "%s%s", t == names ? "" : "/", *t);
}

const char *rlx__arch_list(char *text, size_t len) {
    size_t at = 0;
    text[0] = '\0';
    for (size_t i = 0; i < N_ARCHS && at < len; i++) {
        at += (size_t)snprintf(text + at, len - at, "%s%s (model_type ", i ? ", " : "", registry[i]->name);
        append_names(text, len, &at, registry[i]->hf_types);
        if (at < len)
            at += (size_t)snprintf(text + at, len - at, ", GGUF ");
        append_names(text, len, &at, registry[i]->gguf_archs);
        if (at < len)
            at += (size_t)snprintf(text + at, len - at, ")");
    }
    return text;
}

// ---- roles

/* The dimensions a role's shape is made of. */
typedef enum dim {
    D_NONE,
    D_VOCAB,
    D_HIDDEN,
    D_Q,
    D_KV,
    D_HEAD,
    D_FF,
    D_EXPERTS,
    D_EXPERT_FF,
    D_SSM_QKV, /* Gated DeltaNet: q, k and v of all heads */
    D_SSM_V,   /* value heads * value dim */
    D_SSM_HEADS,
    D_SSM_VDIM,
    D_SSM_CONV,
    D_SHEXP_FF, /* the shared expert's intermediate size */
    D_ONE,
} dim;

static const struct {
    dim rows, cols;
} role_dims[RLX__R_COUNT] = {
    [RLX__R_TOKEN_EMBD] = {D_VOCAB, D_HIDDEN},
    [RLX__R_OUTPUT_NORM] = {D_HIDDEN, D_NONE},
    [RLX__R_OUTPUT] = {D_VOCAB, D_HIDDEN},
    [RLX__R_ATTN_NORM] = {D_HIDDEN, D_NONE},
    [RLX__R_ATTN_Q] = {D_Q, D_HIDDEN},
    [RLX__R_ATTN_Q_BIAS] = {D_Q, D_NONE},
    [RLX__R_ATTN_K] = {D_KV, D_HIDDEN},
    [RLX__R_ATTN_K_BIAS] = {D_KV, D_NONE},
    [RLX__R_ATTN_V] = {D_KV, D_HIDDEN},
    [RLX__R_ATTN_V_BIAS] = {D_KV, D_NONE},
    [RLX__R_ATTN_O] = {D_HIDDEN, D_Q},
    [RLX__R_ATTN_O_BIAS] = {D_HIDDEN, D_NONE},
    [RLX__R_ATTN_Q_NORM] = {D_HEAD, D_NONE},
    [RLX__R_ATTN_K_NORM] = {D_HEAD, D_NONE},
    [RLX__R_FFN_NORM] = {D_HIDDEN, D_NONE},
    [RLX__R_FFN_GATE] = {D_FF, D_HIDDEN},
    [RLX__R_FFN_UP] = {D_FF, D_HIDDEN},
    [RLX__R_FFN_DOWN] = {D_HIDDEN, D_FF},
    [RLX__R_FFN_GATE_BIAS] = {D_FF, D_NONE},
    [RLX__R_FFN_UP_BIAS] = {D_FF, D_NONE},
    [RLX__R_FFN_DOWN_BIAS] = {D_HIDDEN, D_NONE},
    [RLX__R_FFN_ROUTER] = {D_EXPERTS, D_HIDDEN},
    [RLX__R_FFN_GATE_EXP] = {D_EXPERT_FF, D_HIDDEN},
    [RLX__R_FFN_UP_EXP] = {D_EXPERT_FF, D_HIDDEN},
    [RLX__R_FFN_DOWN_EXP] = {D_HIDDEN, D_EXPERT_FF},
    [RLX__R_ATTN_GATE] = {D_Q, D_HIDDEN},
    [RLX__R_SSM_QKV] = {D_SSM_QKV, D_HIDDEN},
    [RLX__R_SSM_Z] = {D_SSM_V, D_HIDDEN},
    [RLX__R_SSM_BETA] = {D_SSM_HEADS, D_HIDDEN},
    [RLX__R_SSM_ALPHA] = {D_SSM_HEADS, D_HIDDEN},
    [RLX__R_SSM_CONV] = {D_SSM_QKV, D_SSM_CONV},
    [RLX__R_SSM_A] = {D_SSM_HEADS, D_NONE},
    [RLX__R_SSM_DT] = {D_SSM_HEADS, D_NONE},
    [RLX__R_SSM_NORM] = {D_SSM_VDIM, D_NONE},
    [RLX__R_SSM_OUT] = {D_HIDDEN, D_SSM_V},
    [RLX__R_FFN_GATE_SHEXP] = {D_SHEXP_FF, D_HIDDEN},
    [RLX__R_FFN_UP_SHEXP] = {D_SHEXP_FF, D_HIDDEN},
    [RLX__R_FFN_DOWN_SHEXP] = {D_HIDDEN, D_SHEXP_FF},
    [RLX__R_FFN_SHEXP_GATE] = {D_ONE, D_HIDDEN},
};

static int64_t dim_size(dim x, const rlx__model_desc *d) {
    const rlx_model_config *c = &d->cfg;
    const rlx__gdn *g = &d->gdn;
    switch (x) {
    case D_VOCAB:
        return c->vocab_size;
    case D_HIDDEN:
        return c->hidden_size;
    case D_Q:
        return c->num_attention_heads * c->head_dim;
    case D_KV:
        return c->num_key_value_heads * c->head_dim;
    case D_HEAD:
        return c->head_dim;
    case D_FF:
        return c->intermediate_size;
    case D_EXPERTS:
        return c->num_experts;
    case D_EXPERT_FF:
        return c->moe_intermediate_size;
    case D_SSM_QKV:
        return 2 * g->k_heads * g->k_dim + g->v_heads * g->v_dim;
    case D_SSM_V:
        return g->v_heads * g->v_dim;
    case D_SSM_HEADS:
        return g->v_heads;
    case D_SSM_VDIM:
        return g->v_dim;
    case D_SSM_CONV:
        return g->conv_kernel;
    case D_SHEXP_FF:
        return d->shexp_ff;
    case D_ONE:
        return 1;
    case D_NONE:
        break;
    }
    return 0;
}

void rlx__role_shape(rlx__role role, const rlx__model_desc *d, int64_t *rows, int64_t *cols) {
    *rows = dim_size(role_dims[role].rows, d);
    *cols = dim_size(role_dims[role].cols, d);
}

int rlx__role_is_expert(rlx__role role) {
    return role == RLX__R_FFN_GATE_EXP || role == RLX__R_FFN_UP_EXP || role == RLX__R_FFN_DOWN_EXP;
}

int rlx__role_is_top(rlx__role role) {
    return role == RLX__R_TOKEN_EMBD || role == RLX__R_OUTPUT_NORM || role == RLX__R_OUTPUT;
}

const rlx__tensor *rlx__arch_tensor(const rlx__arch *a, rlx__role role) {
    for (const rlx__tensor *t = a->tensors; t->hf; t++)
        if (t->role == role)
            return t;
    return NULL;
}

/* The token mixer a role belongs to: 1 self-attention, 2 Gated DeltaNet, 0 neither. */
static int mixer_of(rlx__role role) {
    if (role >= RLX__R_ATTN_Q && role <= RLX__R_ATTN_K_NORM)
        return 1;
    if (role == RLX__R_ATTN_GATE)
        return 1;
    return role >= RLX__R_SSM_QKV && role <= RLX__R_SSM_OUT ? 2 : 0;
}

int rlx__tensor_applies(const rlx__tensor *t, const rlx__model_desc *d, const rlx__layer *layer) {
    const int mixer = mixer_of(t->role);
    if (mixer && (!layer || (mixer == 2) != (layer->linear != 0)))
        return 0;
    switch (t->when) {
    case RLX__ALWAYS:
        return 1;
    case RLX__IF_DENSE:
        return layer && !layer->moe;
    case RLX__IF_MOE:
        return layer && layer->moe;
    case RLX__IF_QKV_BIAS:
        return d->qkv_bias;
    case RLX__IF_O_BIAS:
        return d->o_bias;
    case RLX__IF_MLP_BIAS:
        return d->mlp_bias && layer && !layer->moe;
    case RLX__IF_UNTIED:
        return !d->cfg.tie_word_embeddings;
    case RLX__IF_ATTN_GATE:
        return d->attn_gate;
    }
    return 0;
}

void rlx__tensor_hf_name(const rlx__tensor *t, const char *prefix, int64_t expert, char *out, size_t len) {
    const char *star = strchr(t->hf, '*');
    if (star && expert >= 0)
        snprintf(out, len, "%s%.*s%lld%s", prefix, (int)(star - t->hf), t->hf, (long long)expert, star + 1);
    else
        snprintf(out, len, "%s%s", prefix, t->hf);
}

// ---- names

int rlx__arch_hf_of_gguf(const rlx__arch *a, const char *name, char *out, size_t len) {
    unsigned layer;
    int consumed = 0;
    const int in_layer = sscanf(name, GGUF_LAYER "%n", &layer, &consumed) == 1 && consumed > 0;
    for (const rlx__tensor *t = a ? a->tensors : NULL; t && t->hf; t++) {
        if (rlx__role_is_top(t->role) != !in_layer || strcmp(in_layer ? name + consumed : name, t->gguf) != 0)
            continue;
        char prefix[32] = "";
        if (in_layer)
            snprintf(prefix, sizeof prefix, HF_LAYER, layer);
        rlx__tensor_hf_name(t, prefix, -1, out, len);
        return rlx__role_is_expert(t->role);
    }
    snprintf(out, len, "%s", name);
    return 0;
}

/* Whether hf (after the layer prefix) is row t's name, with the expert index into *expert. */
static int hf_matches(const rlx__tensor *t, const char *hf, int64_t *expert) {
    const char *star = strchr(t->hf, '*');
    if (!star)
        return strcmp(hf, t->hf) == 0;
    const size_t head = (size_t)(star - t->hf);
    if (strncmp(hf, t->hf, head) != 0)
        return 0;
    const char *p = hf + head;
    long long e = 0;
    int used = 0;
    if (*p < '0' || *p > '9' || sscanf(p, "%lld%n", &e, &used) != 1)
        return 0;
    if (strcmp(p + used, star + 1) != 0)
        return 0;
    *expert = e;
    return 1;
}

int rlx__arch_gguf_of_hf(const rlx__arch *a, const char *hf, char *out, size_t len, int *layer, int *part,
                         int64_t *expert) {
    unsigned l;
    int consumed = 0;
    const int in_layer = sscanf(hf, HF_LAYER "%n", &l, &consumed) == 1 && consumed > 0;
    for (const rlx__tensor *t = a ? a->tensors : NULL; t && t->hf; t++) {
        int64_t e = -1;
        if (rlx__role_is_top(t->role) != !in_layer || !hf_matches(t, in_layer ? hf + consumed : hf, &e))
            continue;
        *layer = in_layer ? (int)l : -1;
        *part = (int)(t - a->tensors);
        *expert = e;
        if (in_layer)
            snprintf(out, len, GGUF_LAYER "%s", l, t->gguf);
        else
            snprintf(out, len, "%s", t->gguf);
        return 1;
    }
    return 0;
}

// ---- MTP layers

static const rlx__mtp_names mimo_mtp = {
    .token_norm = "model.mtp_layers.{N}.token_layernorm.weight",
    .hidden_norm = "model.mtp_layers.{N}.hidden_layernorm.weight",
    .proj = "model.mtp_layers.{N}.input_proj.weight",
    .final_norm = "model.mtp_layers.{N}.final_layernorm.weight",
    .layer = "model.mtp_layers.{N}.mtp_block.",
};

const rlx__mtp_names *rlx__arch_mtp(const rlx__arch *a) { return a && a->mtp ? a->mtp : &mimo_mtp; }

int rlx__mtp_name(const char *pattern, uint32_t n, char *out, size_t len) {
    const char *at = strstr(pattern, "{N}");
    const int w = at ? snprintf(out, len, "%.*s%u%s", (int)(at - pattern), pattern, n, at + 3)
                     : snprintf(out, len, "%s", pattern);
    return (at || n == 0) && w >= 0 && (size_t)w < len;
}

// ---- llama.cpp's q/k row order

int64_t rlx__qk_hf_row(int64_t row, int64_t head_rows) {
    /* within a head, GGUF row 2j + h holds Hugging Face row h * head_rows / 2 + j: the pairs
     * rotate-half RoPE turns together (j, j + half) become neighbours for llama.cpp's interleaved
     * RoPE */
    const int64_t head = row / head_rows, within = row % head_rows;
    return head * head_rows + (within % 2) * (head_rows / 2) + within / 2;
}
