/* Qwen3.5 and Qwen3.6 dense (Hugging Face Qwen3_5ForConditionalGeneration's text model and
 * Qwen3_5ForCausalLM): a hybrid of Gated DeltaNet linear-attention layers and full-attention
 * layers (layer_types, or every full_attention_interval-th layer), each followed by a SwiGLU MLP.
 *
 * What the checkpoint stores differently from what the blocks read is put right once at open
 * (fix_weights): the text model's tensors of a ConditionalGeneration checkpoint live under
 * model.language_model. (the vision tower, model.visual., is left unread); the RMS norms other
 * than the DeltaNet output norm are stored as w with (1 + w) applied; A is stored as A_log; the
 * conv1d weight is [channels, 1, kernel]; and q_proj yields, per head, the query followed by an
 * output gate, which is split into a query projection and a gate projection of their own.
 *
 * Full attention: q/k RMS norms per head, rotary embedding on the first partial_rotary_factor of
 * each head (M-RoPE's sections all see the same position for text, so it is plain RoPE there),
 * the output multiplied by sigmoid(gate). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/weights_internal.h"
#include "util/log.h"

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
    {RLX__R_FFN_GATE, "mlp.gate_proj.weight", "ffn_gate.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_UP, "mlp.up_proj.weight", "ffn_up.weight", RLX__ALWAYS, 0},
    {RLX__R_FFN_DOWN, "mlp.down_proj.weight", "ffn_down.weight", RLX__ALWAYS, 0},
    {0},
};

// ---- config.json

/* A number of rope_parameters (or the text config, in older files) in (0, max]. */
static rlx_status get_number(const char *path, const cJSON *obj, const char *key, double dflt, double max,
                             double *out) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!item || cJSON_IsNull(item)) {
        *out = dflt;
        return RLX_OK;
    }
    if (!cJSON_IsNumber(item) || !(item->valuedouble > 0 && item->valuedouble <= max))
        return rlx__hf_wrong_type(path, key, max <= 1 ? "a number in (0, 1]" : "a positive number", item);
    *out = item->valuedouble;
    return RLX_OK;
}

/* rope_parameters (transformers 5) or the older top-level rope_theta / partial_rotary_factor;
 * only the default rope type exists for these models, and mrope_section only matters for
 * images and video, whose three position rows differ. */
static rlx_status read_rope(const char *path, const cJSON *tc, rlx__model_desc *d) {
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(tc, "rope_parameters");
    if (rp && !cJSON_IsNull(rp) && !cJSON_IsObject(rp))
        return rlx__hf_wrong_type(path, "rope_parameters", "an object", rp);
    const cJSON *from = cJSON_IsObject(rp) ? rp : tc;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(from, "rope_type");
    if (type && !cJSON_IsNull(type) && !(cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0))
        return rlx__hf_wrong_type(path, "rope_parameters.rope_type", "\"default\" (the rotary embedding rlx runs)",
                                  type);
    double factor = 0.25; /* get_number sets it; initialised for -O3's maybe-uninitialized */
    rlx_status st = get_number(path, from, "rope_theta", d->cfg.rope_theta, 1e300, &d->cfg.rope_theta);
    if (st == RLX_OK)
        st = get_number(path, from, "partial_rotary_factor", 0.25, 1, &factor);
    if (st != RLX_OK)
        return st;
    const double dims = factor * (double)d->cfg.head_dim;
    d->rope_dims = (int64_t)dims; /* transformers truncates: int(head_dim * factor) */
    if (d->rope_dims < 2 || d->rope_dims % 2 != 0)
        return rlx_error(RLX_E_FORMAT,
                         "%s: partial_rotary_factor %g of head_dim %lld turns %lld values; rotary embeddings need an "
                         "even number of at least 2",
                         path, factor, (long long)d->cfg.head_dim, (long long)d->rope_dims);
    if (d->rope_dims == d->cfg.head_dim)
        d->rope_dims = 0;
    return RLX_OK;
}

/* layer_types ("linear_attention" / "full_attention"), else every full_attention_interval-th
 * layer (default 4) is full attention, as Qwen3_5TextConfig derives it. */
static rlx_status read_layer_kinds(const char *path, const cJSON *tc, rlx__model_desc *d) {
    const int64_t n = d->cfg.num_hidden_layers;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(tc, "layer_types");
    if (types && !cJSON_IsNull(types)) {
        if (!cJSON_IsArray(types))
            return rlx__hf_wrong_type(path, "layer_types", "a list of strings", types);
        if (cJSON_GetArraySize(types) != n)
            return rlx_error(RLX_E_FORMAT, "%s: field 'layer_types' has %d entries, num_hidden_layers is %lld", path,
                             cJSON_GetArraySize(types), (long long)n);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, types) {
            const int linear = cJSON_IsString(e) && strcmp(e->valuestring, "linear_attention") == 0;
            if (!linear && !(cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0)) {
                char field[32];
                snprintf(field, sizeof field, "layer_types[%d]", i);
                return rlx__hf_wrong_type(path, field, "\"linear_attention\" or \"full_attention\"", e);
            }
            d->layers[i++].linear = (uint8_t)linear;
        }
        return RLX_OK;
    }
    int64_t interval;
    rlx_status st = rlx__hf_int(path, tc, "full_attention_interval", 4, 1, INT32_MAX, &interval);
    for (int64_t i = 0; st == RLX_OK && i < n; i++)
        d->layers[i].linear = (i + 1) % interval != 0;
    return st;
}

/* Bounds on a Gated DeltaNet shape, far above any model's (Qwen3.5: 16 key heads of 128 over 32
 * value heads, a kernel of 4), the same for config.json and GGUF metadata: they keep a state's
 * size far from overflow whatever a file says. */
#define GDN_MAX_DIM 4096
#define GDN_MAX_KERNEL 64

static rlx_status read_gdn(const char *path, const cJSON *tc, rlx__model_desc *d) {
    rlx__gdn *g = &d->gdn;
    rlx_status st;
    if ((st = rlx__hf_int(path, tc, "linear_num_key_heads", 16, 1, GDN_MAX_DIM, &g->k_heads)) != RLX_OK ||
        (st = rlx__hf_int(path, tc, "linear_num_value_heads", 32, 1, GDN_MAX_DIM, &g->v_heads)) != RLX_OK ||
        (st = rlx__hf_int(path, tc, "linear_key_head_dim", 128, 1, GDN_MAX_DIM, &g->k_dim)) != RLX_OK ||
        (st = rlx__hf_int(path, tc, "linear_value_head_dim", 128, 1, GDN_MAX_DIM, &g->v_dim)) != RLX_OK ||
        (st = rlx__hf_int(path, tc, "linear_conv_kernel_dim", 4, 1, GDN_MAX_KERNEL, &g->conv_kernel)) != RLX_OK)
        return st;
    if (g->v_heads % g->k_heads != 0)
        return rlx_error(RLX_E_FORMAT,
                         "%s: field 'linear_num_key_heads' (%lld) does not divide linear_num_value_heads (%lld)", path,
                         (long long)g->k_heads, (long long)g->v_heads);
    return RLX_OK;
}

/* tie_word_embeddings may sit in the text config, at the top level or both; two different values
 * leave it unclear which matrix the LM head is, so that is refused rather than guessed. */
static rlx_status read_tie(const char *path, const cJSON *root, const cJSON *tc, rlx__model_desc *d) {
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(tc, "tie_word_embeddings");
    const cJSON *outer = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    int in_value = 0, out_value = 0;
    rlx_status st;
    if ((st = rlx__hf_bool(path, tc, "tie_word_embeddings", 0, &in_value)) != RLX_OK ||
        (st = rlx__hf_bool(path, root, "tie_word_embeddings", 0, &out_value)) != RLX_OK)
        return st;
    const int has_in = inner && !cJSON_IsNull(inner), has_out = tc != root && outer && !cJSON_IsNull(outer);
    if (has_in && has_out && in_value != out_value)
        return rlx_error(RLX_E_FORMAT, "%s: field 'tie_word_embeddings' is %s at the top level but %s in text_config",
                         path, out_value ? "true" : "false", in_value ? "true" : "false");
    d->cfg.tie_word_embeddings = has_in ? in_value : out_value;
    return RLX_OK;
}

rlx_status rlx__qwen3_5_read_hf(const char *path, const cJSON *root, int intermediate_optional, rlx__model_desc *d,
                                const cJSON **text) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (tc && !cJSON_IsNull(tc) && !cJSON_IsObject(tc))
        return rlx__hf_wrong_type(path, "text_config", "an object", tc);
    if (!cJSON_IsObject(tc))
        tc = root;
    *text = tc;
    const rlx__hf_defaults defaults = {
        .intermediate_optional = intermediate_optional, .head_dim = 256, .max_position_embeddings = 32768};
    rlx_status st = rlx__hf_read_decoder(path, tc, &defaults, d);
    int gate = 1;
    if (st != RLX_OK || (st = rlx__llama_check_act(path, tc)) != RLX_OK ||
        (st = rlx__hf_bool(path, tc, "attention_bias", 0, &d->cfg.attention_bias)) != RLX_OK ||
        (st = rlx__hf_bool(path, tc, "attn_output_gate", 1, &gate)) != RLX_OK ||
        (st = read_tie(path, root, tc, d)) != RLX_OK || (st = read_rope(path, tc, d)) != RLX_OK ||
        (st = read_layer_kinds(path, tc, d)) != RLX_OK || (st = read_gdn(path, tc, d)) != RLX_OK)
        return st;
    if (d->rope_type != RLX__ROPE_DEFAULT)
        return rlx_error(RLX_E_FORMAT, "%s: field 'rope_scaling' is not supported for %s", path, d->arch->name);
    if (d->cfg.attention_bias)
        return rlx_error(RLX_E_FORMAT,
                         "%s: field 'attention_bias' is true; rlx runs Qwen3.5's gated attention without biases", path);
    d->attn_gate = (uint8_t)gate;
    d->cfg.decoder_sparse_step = 1;
    return RLX_OK;
}

static rlx_status read_hf(const char *path, const cJSON *root, rlx__model_desc *d) {
    const cJSON *tc;
    return rlx__qwen3_5_read_hf(path, root, 0, d, &tc);
}

// ---- weights

#define TEXT_PREFIX "model.language_model."
#define VISION_PREFIX "model.visual."

/* "model.language_model.X" becomes "model.X" by pointing past "language_", so no name is
 * copied; the vision tower is counted for the notice and left where it is. */
static rlx_status unnest_text_model(rlx_weights *w) {
    size_t moved = 0, vision = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        rlx_weight *t = &w->tensors[i];
        if (strncmp(t->name, TEXT_PREFIX, strlen(TEXT_PREFIX)) == 0) {
            t->name += strlen("model.language_");
            moved++;
        } else if (strncmp(t->name, VISION_PREFIX, strlen(VISION_PREFIX)) == 0) {
            vision++;
        }
    }
    if (vision)
        rlx__log(RLX_LOG_WARN,
                 "skipping the vision tower (%zu tensors under " VISION_PREFIX "): rlx runs the text model", vision);
    return moved ? rlx__weights_index(w) : RLX_OK;
}

static rlx_weight *find(rlx_weights *w, const char *name) { return (rlx_weight *)rlx_weights_find(w, name); }

/* The name of role's tensor in d's table under a layer's prefix ("" for a top-level role). */
static const char *role_name(const rlx__model_desc *d, rlx__role role, const char *prefix, char *out, size_t len) {
    rlx__tensor_hf_name(rlx__arch_tensor(d->arch, role), prefix, -1, out, len);
    return out;
}

static const char *layer_prefix(int64_t l, char *out, size_t len) {
    snprintf(out, len, "model.layers.%u.", (unsigned)l);
    return out;
}

typedef enum vector_fix { PLUS_ONE, MINUS_EXP } vector_fix;

/* Replaces vector t by the F32 values (1 + w) or -exp(w) of its elements, computed in F32 as
 * transformers computes them (weight.float()). */
static rlx_status fix_vector(rlx_weights *w, rlx_weight *t, vector_fix fix) {
    const int64_t n = t->n_dims == 1 ? t->shape[0] : -1;
    const size_t esize = rlx_dtype_size((int)t->dtype);
    if (n < 0 || esize == 0 || t->dtype == RLX_DTYPE_I32 || t->nbytes != (size_t)n * esize)
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' must be a vector of f32, bf16 or f16 values", t->file, t->name);
    float *v = rlx__weights_own(w, (size_t)n * sizeof *v);
    if (!v)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", t->file);
    for (int64_t i = 0; i < n; i++) {
        const float x = rlx_iface_load_f32(t->dtype, t->data, i);
        v[i] = fix == PLUS_ONE ? 1.0f + x : -expf(x);
    }
    t->data = v;
    t->dtype = RLX_DTYPE_F32;
    t->nbytes = (size_t)n * sizeof *v;
    return RLX_OK;
}

/* conv1d.weight is [channels, 1, kernel] (a depthwise Conv1d's); the op reads [channels, kernel]. */
static rlx_status fix_conv(rlx_weight *t) {
    if (t->n_dims != 3 || t->shape[1] != 1)
        return rlx_error(RLX_E_FORMAT, "%s: tensor '%s' must be [channels, 1, kernel], a depthwise convolution's",
                         t->file, t->name);
    t->shape[1] = t->shape[2];
    t->shape[2] = 1;
    t->n_dims = 2;
    return RLX_OK;
}

/* q_proj holds, head after head, the head's query rows and then its gate rows. Its rows are
 * copied into query rows (all heads) then gate rows, and the two halves become two tensors: the
 * query projection under q_proj's name and the gate projection under the table's gate name.
 * Rows move whole, so any row-wise dtype works. */
static rlx_status split_q_gate(rlx_weights *w, const rlx__model_desc *d, const char *prefix) {
    char name[160], gate_name[160];
    rlx_weight *t = find(w, role_name(d, RLX__R_ATTN_Q, prefix, name, sizeof name));
    if (!t)
        return RLX_OK; /* the block's weight check names what is missing */
    const int64_t heads = d->cfg.num_attention_heads, head_rows = d->cfg.head_dim, rows = 2 * heads * head_rows;
    if (t->n_dims != 2 || t->shape[0] != rows || t->nbytes % (size_t)rows != 0)
        return rlx_error(RLX_E_FORMAT,
                         "%s: tensor '%s' must have %lld rows, a query and an output gate of %lld for each of %lld "
                         "heads",
                         t->file, t->name, (long long)rows, (long long)head_rows, (long long)heads);
    const size_t row_bytes = t->nbytes / (size_t)rows, half = t->nbytes / 2;
    uint8_t *copy = rlx__weights_own(w, t->nbytes);
    if (!copy)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", t->file);
    for (int64_t h = 0; h < heads; h++)
        for (int64_t part = 0; part < 2; part++)
            memcpy(copy + (size_t)part * half + (size_t)(h * head_rows) * row_bytes,
                   (const uint8_t *)t->data + (size_t)((2 * h + part) * head_rows) * row_bytes,
                   (size_t)head_rows * row_bytes);
    rlx__drop_mapped(t->data, t->nbytes); /* the file's order is not read again */
    t->data = copy;
    t->shape[0] = heads * head_rows;
    t->nbytes = half;
    rlx_weight gate = *t;
    gate.name = role_name(d, RLX__R_ATTN_GATE, prefix, gate_name, sizeof gate_name);
    gate.data = copy + half;
    rlx_status st = rlx__weights_append(w, &gate);    /* t is not used after: the table may move */
    return st == RLX_OK ? rlx__weights_index(w) : st; /* finds after an append need it sorted */
}

/* The MTP (next-n) layer Qwen3.5 checkpoints carry: its names (HF mtp.*), read as the MTP block
 * of rlx/model.h with the embedding's norm first in the projection's input, and its decoder layer
 * a full-attention Qwen3.5 layer. */
static const rlx__mtp_names mtp_names = {
    .token_norm = "mtp.pre_fc_norm_embedding.weight",
    .hidden_norm = "mtp.pre_fc_norm_hidden.weight",
    .proj = "mtp.fc.weight",
    .final_norm = "mtp.norm.weight",
    .layer = "mtp.layers.{N}.",
    .embedding_first = 1,
};

/* Renames t to `name`, in memory w owns. */
static rlx_status rename_tensor(rlx_weights *w, rlx_weight *t, const char *name) {
    const size_t len = strlen(name) + 1;
    char *copy = rlx__weights_own(w, len);
    if (!copy)
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", t->file);
    memcpy(copy, name, len);
    t->name = copy;
    return RLX_OK;
}

/* llama.cpp's converter writes the MTP layer as block num_hidden_layers: its decoder tensors
 * (named through the table as model.layers.L.*) and blk.L.nextn.* for the rest. They get the
 * Hugging Face names the MTP block reads. */
static rlx_status rename_gguf_mtp(rlx_weights *w, const rlx__model_desc *d) {
    char layer[40], nextn[48];
    const int layer_len = snprintf(layer, sizeof layer, "model.layers.%u.", (unsigned)d->cfg.num_hidden_layers);
    snprintf(nextn, sizeof nextn, "blk.%u.nextn.", (unsigned)d->cfg.num_hidden_layers);
    static const char *const nextn_names[][2] = {{"eh_proj.weight", "mtp.fc.weight"},
                                                 {"enorm.weight", "mtp.pre_fc_norm_embedding.weight"},
                                                 {"hnorm.weight", "mtp.pre_fc_norm_hidden.weight"},
                                                 {"shared_head_norm.weight", "mtp.norm.weight"}};
    rlx_status st = RLX_OK;
    size_t renamed = 0;
    for (size_t i = 0; st == RLX_OK && i < w->n_tensors; i++) {
        rlx_weight *t = &w->tensors[i];
        char name[200] = "";
        if (strncmp(t->name, layer, (size_t)layer_len) == 0)
            snprintf(name, sizeof name, RLX__QWEN3_5_MTP_LAYER "%s", t->name + layer_len);
        for (size_t k = 0; !*name && strncmp(t->name, nextn, strlen(nextn)) == 0 && k < 4; k++)
            if (strcmp(t->name + strlen(nextn), nextn_names[k][0]) == 0)
                snprintf(name, sizeof name, "%s", nextn_names[k][1]);
        if (*name && (st = rename_tensor(w, t, name)) == RLX_OK)
            renamed++;
    }
    return st == RLX_OK && renamed ? rlx__weights_index(w) : st;
}

/* The (1 + w) norms of a layer of the given kind under prefix. */
static rlx_status fix_layer_norms(rlx_weights *w, const rlx__model_desc *d, const rlx__layer *kind,
                                  const char *prefix) {
    static const rlx__role plus_one[] = {RLX__R_ATTN_NORM, RLX__R_FFN_NORM, RLX__R_ATTN_Q_NORM, RLX__R_ATTN_K_NORM};
    char name[160];
    rlx_weight *t;
    rlx_status st = RLX_OK;
    for (size_t i = 0; st == RLX_OK && i < sizeof plus_one / sizeof plus_one[0]; i++)
        if (rlx__tensor_applies(rlx__arch_tensor(d->arch, plus_one[i]), d, kind) &&
            (t = find(w, role_name(d, plus_one[i], prefix, name, sizeof name))))
            st = fix_vector(w, t, PLUS_ONE);
    return st;
}

/* A GGUF file from llama.cpp's converter has its norms, A and conv1d in the blocks' form
 * already and only the query and gate rows of q_proj to split (and its MTP layer to name). */
rlx_status rlx__qwen3_5_fix_weights(rlx_weights *w, const rlx__model_desc *d, int gguf) {
    char prefix[40], name[160];
    const rlx__layer full = {0}; /* the MTP layer's kind */
    rlx_status st = gguf ? rename_gguf_mtp(w, d) : unnest_text_model(w);
    rlx_weight *t;
    if (!gguf && st == RLX_OK && (t = find(w, role_name(d, RLX__R_OUTPUT_NORM, "", name, sizeof name))))
        st = fix_vector(w, t, PLUS_ONE);
    static const char *const mtp_norms[] = {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                                            "mtp.norm.weight"};
    for (size_t i = 0; !gguf && st == RLX_OK && i < sizeof mtp_norms / sizeof mtp_norms[0]; i++)
        if ((t = find(w, mtp_norms[i])))
            st = fix_vector(w, t, PLUS_ONE);
    if (!gguf && st == RLX_OK)
        st = fix_layer_norms(w, d, &full, RLX__QWEN3_5_MTP_LAYER);
    if (st == RLX_OK && d->attn_gate)
        st = split_q_gate(w, d, RLX__QWEN3_5_MTP_LAYER);
    for (int64_t l = 0; st == RLX_OK && l < d->cfg.num_hidden_layers; l++) {
        const rlx__layer *layer = &d->layers[l];
        layer_prefix(l, prefix, sizeof prefix);
        if (!gguf)
            st = fix_layer_norms(w, d, layer, prefix);
        if (!gguf && st == RLX_OK && layer->linear &&
            (t = find(w, role_name(d, RLX__R_SSM_A, prefix, name, sizeof name))))
            st = fix_vector(w, t, MINUS_EXP);
        if (!gguf && st == RLX_OK && layer->linear &&
            (t = find(w, role_name(d, RLX__R_SSM_CONV, prefix, name, sizeof name))))
            st = fix_conv(t);
        if (st == RLX_OK && !layer->linear && d->attn_gate)
            st = split_q_gate(w, d, prefix);
    }
    return st;
}

/* llama.cpp's qwen35 metadata (its converter's Qwen3NextModel keys): ssm.group_count key heads,
 * ssm.time_step_rank value heads, ssm.state_size the key head size, ssm.inner_size all value
 * heads' width; the norms already hold 1 + w and ssm_a holds -exp(A_log). */
rlx_status rlx__qwen3_5_read_gguf(rlx__gguf_cfg *r, int ff_optional, rlx__model_desc *d) {
    rlx_status st = rlx__gguf_read_decoder(r, ff_optional, d);
    if (st != RLX_OK)
        return st;
    rlx__gdn *g = &d->gdn;
    g->conv_kernel = rlx__gguf_cfg_int(r, "ssm.conv_kernel", 0, 0);
    g->k_dim = rlx__gguf_cfg_int(r, "ssm.state_size", 0, 0);
    g->k_heads = rlx__gguf_cfg_int(r, "ssm.group_count", 0, 0);
    g->v_heads = rlx__gguf_cfg_int(r, "ssm.time_step_rank", 0, 0);
    const int64_t inner = rlx__gguf_cfg_int(r, "ssm.inner_size", 0, 0);
    const int64_t interval = rlx__gguf_cfg_int(r, "full_attention_interval", 1, 4);
    if (r->st != RLX_OK)
        return r->st;
    if (g->v_heads % g->k_heads || inner % g->v_heads || g->conv_kernel > GDN_MAX_KERNEL || g->k_dim > GDN_MAX_DIM ||
        g->k_heads > GDN_MAX_DIM || g->v_heads > GDN_MAX_DIM || inner / g->v_heads > GDN_MAX_DIM)
        return rlx_error(RLX_E_FORMAT,
                         "%s: ssm metadata of %lld key heads of %lld, %lld value heads over %lld values and a "
                         "kernel of %lld do not fit together",
                         r->path, (long long)g->k_heads, (long long)g->k_dim, (long long)g->v_heads, (long long)inner,
                         (long long)g->conv_kernel);
    g->v_dim = inner / g->v_heads;
    g->tiled = g->k_heads != g->v_heads;
    for (int64_t i = 0; i < d->cfg.num_hidden_layers; i++)
        d->layers[i].linear = (i + 1) % interval != 0;
    d->attn_gate = 1;
    d->cfg.decoder_sparse_step = 1;
    return RLX_OK;
}

static rlx_status read_gguf(rlx__gguf_cfg *r, rlx__model_desc *d) { return rlx__qwen3_5_read_gguf(r, 0, d); }

static const char *const hf_types[] = {"qwen3_5", "qwen3_5_text", NULL};
static const char *const gguf_archs[] = {"qwen35", NULL};

const rlx__arch rlx__arch_qwen3_5 = {
    .name = "qwen3_5",
    .hf_types = hf_types,
    .gguf_archs = gguf_archs,
    .read_hf = read_hf,
    .read_gguf = read_gguf,
    .tensors = tensors,
    .build_layer = rlx__blk_decoder_layer,
    .fix_weights = rlx__qwen3_5_fix_weights,
    .mtp = &mtp_names,
};
