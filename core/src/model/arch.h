/* Architectures as data: what the model layer knows about one architecture (Qwen3, Qwen3-MoE,
 * ...) is one rlx__arch, defined in its own file under core/src/model/arch/ and listed in the
 * registry (arch.c). docs/architectures.md says how to add one.
 *
 * An architecture names the Hugging Face model_types and GGUF general.architecture values it
 * answers to, reads config.json or GGUF metadata into the architecture-neutral rlx__model_desc,
 * lists its tensors by role (rlx__tensor: Hugging Face and GGUF names, when a layer has it,
 * whether it may be absent) and builds a decoder layer from the shared blocks of blocks.c. The
 * weights a block reads, the checks before a build and the names a GGUF file maps to are all
 * derived from that one table, and the builder resolves weights by role: no second list exists
 * that could disagree with it. */
#ifndef RLX_MODEL_ARCH_H
#define RLX_MODEL_ARCH_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "model_internal.h"
#include "rlx/graph.h"
#include "rlx/model.h"
#include "rlx/status.h"

struct rlx__gguf;

/* Tensor roles, shared by every architecture (llama.cpp's LLM_TENSOR_* idea): a block asks for
 * "the layer's q projection", the architecture's table says what it is called. */
typedef enum rlx__role {
    RLX__R_TOKEN_EMBD, /* top level: [vocab, hidden] */
    RLX__R_OUTPUT_NORM,
    RLX__R_OUTPUT,
    RLX__R_ATTN_NORM, /* per layer */
    RLX__R_ATTN_Q,
    RLX__R_ATTN_Q_BIAS,
    RLX__R_ATTN_K,
    RLX__R_ATTN_K_BIAS,
    RLX__R_ATTN_V,
    RLX__R_ATTN_V_BIAS,
    RLX__R_ATTN_O,
    RLX__R_ATTN_O_BIAS,
    RLX__R_ATTN_Q_NORM, /* per head, before RoPE */
    RLX__R_ATTN_K_NORM,
    RLX__R_FFN_NORM,
    RLX__R_FFN_GATE,
    RLX__R_FFN_UP,
    RLX__R_FFN_DOWN,
    RLX__R_FFN_GATE_BIAS, /* Llama's mlp_bias */
    RLX__R_FFN_UP_BIAS,
    RLX__R_FFN_DOWN_BIAS,
    RLX__R_FFN_ROUTER,   /* [experts, hidden] */
    RLX__R_FFN_GATE_EXP, /* one per expert */
    RLX__R_FFN_UP_EXP,
    RLX__R_FFN_DOWN_EXP,
    /* An attention layer's per-head output gate (Qwen3.5): the gate half of q_proj, which the
     * architecture's fix_weights splits off into a tensor of its own */
    RLX__R_ATTN_GATE,
    /* Gated DeltaNet linear attention (layers whose kind says linear; the attention roles above
     * apply only to the other layers) */
    RLX__R_SSM_QKV,   /* [2 * k_heads * k_dim + v_heads * v_dim, hidden]: q, k and v */
    RLX__R_SSM_Z,     /* [v_heads * v_dim, hidden]: the output norm's gate */
    RLX__R_SSM_BETA,  /* [v_heads, hidden]: b, the update strength before its sigmoid */
    RLX__R_SSM_ALPHA, /* [v_heads, hidden]: a, the decay's input */
    RLX__R_SSM_CONV,  /* [2 * k_heads * k_dim + v_heads * v_dim, conv_kernel] */
    RLX__R_SSM_A,     /* [v_heads]: A = -exp(A_log), the decay rate (<= 0) */
    RLX__R_SSM_DT,    /* [v_heads]: dt_bias */
    RLX__R_SSM_NORM,  /* [v_dim]: the gated RMS norm's weight, per value head */
    RLX__R_SSM_OUT,   /* [hidden, v_heads * v_dim] */
    /* A MoE layer's shared expert (Qwen3-Next, Qwen3.5-MoE): a SwiGLU MLP every row runs beside
     * the routed experts, its output scaled by sigmoid of one logit of its own gate */
    RLX__R_FFN_GATE_SHEXP, /* [shexp_ff, hidden] */
    RLX__R_FFN_UP_SHEXP,   /* [shexp_ff, hidden] */
    RLX__R_FFN_DOWN_SHEXP, /* [hidden, shexp_ff] */
    RLX__R_FFN_SHEXP_GATE, /* [1, hidden]: the logit whose sigmoid scales the shared expert */
    RLX__R_COUNT
} rlx__role;

/* When a layer (or the model, for a top-level role) has a tensor of the table. */
typedef enum rlx__when {
    RLX__ALWAYS,
    RLX__IF_DENSE,     /* the layer's MLP is dense */
    RLX__IF_MOE,       /* the layer's MLP is a mixture of experts */
    RLX__IF_QKV_BIAS,  /* rlx__model_desc.qkv_bias */
    RLX__IF_O_BIAS,    /* rlx__model_desc.o_bias */
    RLX__IF_MLP_BIAS,  /* rlx__model_desc.mlp_bias (a dense layer's gate, up and down) */
    RLX__IF_UNTIED,    /* the LM head is not the embedding table */
    RLX__IF_ATTN_GATE, /* rlx__model_desc.attn_gate */
} rlx__when;

/* One row of an architecture's tensor table. Names are whole for a top-level role, follow the
 * layer prefix ("model.layers.N." / "blk.N.") for a layer's, and for an expert's the Hugging Face
 * name holds one '*' for the expert index while the GGUF name is the stacked [experts, rows, cols]
 * tensor. The shape follows from the role (arch.c). */
typedef struct rlx__tensor {
    rlx__role role;
    const char *hf;
    const char *gguf;
    rlx__when when;
    uint8_t optional; /* 1: used when the file has it, else the block does without */
} rlx__tensor;

/* How one layer is built. */
typedef struct rlx__layer {
    uint32_t window; /* sliding-window attention over this many positions, 0 = full attention */
    uint8_t moe;     /* 1: mixture-of-experts MLP */
    uint8_t linear;  /* 1: Gated DeltaNet linear attention instead of self-attention */
} rlx__layer;

/* The shape of Gated DeltaNet layers (rlx__layer.linear): HF's linear_num_key_heads,
 * linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim. */
typedef struct rlx__gdn {
    int64_t k_heads, v_heads, k_dim, v_dim, conv_kernel;
    /* value heads in llama.cpp's tiled order (its converter reorders them from Hugging Face's,
     * where the v_heads / k_heads value heads of a key head are neighbours): value head h reads
     * key head h % k_heads */
    uint8_t tiled;
} rlx__gdn;

typedef enum rlx__rope_type {
    RLX__ROPE_DEFAULT, /* rotate-half RoPE, theta only */
    /* Llama 3.1's frequency scaling (Hugging Face rope_type "llama3"): pair i's frequency is
     * divided by rope_freqs[i], computed from rope_scaling or read from GGUF rope_freqs */
    RLX__ROPE_LLAMA3,
} rlx__rope_type;

/* rope_scaling of type llama3, as Hugging Face's _compute_llama3_parameters reads it (zero when
 * the factors came from a GGUF file's rope_freqs instead). */
typedef struct rlx__rope_llama3 {
    double factor, low_freq_factor, high_freq_factor;
    int64_t original_max_position_embeddings;
} rlx__rope_llama3;

struct rlx__arch;

/* The architecture-neutral description of a model: what the builder reads. cfg is the versioned
 * public configuration (rlx/model.h), which holds the shape and counts; the rest is what that
 * struct cannot say and plugins read through rlx_model_arch_info_of / rlx_model_layer_info_of. */
typedef struct rlx__model_desc {
    const struct rlx__arch *arch;
    rlx_model_config cfg;
    uint8_t qkv_bias, o_bias, mlp_bias;
    rlx__rope_type rope_type;
    rlx__rope_llama3 llama3;
    float *rope_freqs; /* RLX__ROPE_LLAMA3: rope_dims / 2 frequency divisors, owned; else NULL */
    int64_t rope_dims; /* values of each head RoPE turns (partial_rotary_factor), 0 = head_dim */
    uint8_t attn_gate; /* attention output multiplied by sigmoid of a per-head gate (RLX__R_ATTN_GATE) */
    rlx__gdn gdn;      /* with any linear layer */
    /* The shared expert of MoE layers (RLX__R_FFN_*_SHEXP): its intermediate size, and
     * hidden_size ones (owned) with which one MATMUL widens its gate's logit [T,1] to the
     * [T,hidden] SIGMOID_MUL reads, exactly (x * 1 summed over one term); 0 and NULL without */
    int64_t shexp_ff;
    float *shexp_ones;
    rlx__layer *layers; /* cfg.num_hidden_layers entries, owned (rlx__model_desc_free) */
} rlx__model_desc;

/* A GGUF model's metadata as an architecture reads it: keys under the file's own architecture
 * prefix ("qwen3moe.expert_count"); the first error sticks and later reads return dflt. */
typedef struct rlx__gguf_cfg {
    const struct rlx__gguf *g;
    const rlx_weights *w; /* its tensors, under their Hugging Face names */
    const char *path;     /* the (first) file, for messages */
    char arch[32];
    rlx_status st;
} rlx__gguf_cfg;

typedef struct rlx__blk rlx__blk;

/* Where an architecture keeps its multi-token-prediction layers (rlx/model.h's MTP block):
 * names in which "{N}" stands for the MTP layer's number (a name without it belongs to layer 0,
 * the only one such a checkpoint has). NULL in rlx__arch: MiMo's model.mtp_layers.N. names. */
typedef struct rlx__mtp_names {
    const char *token_norm, *hidden_norm, *proj, *final_norm;
    const char *layer; /* the prefix of the decoder layer's tensors */
    /* 1: proj reads concat(normed token embedding, normed hidden) (Qwen3.5, DeepSeek-V3's
     * eh_proj order); 0: concat(hidden, token) (MiMo) */
    uint8_t embedding_first;
    /* 1: the MTP layer's MLP is the model's mixture of experts when it has experts (Qwen3-Next,
     * Qwen3.5-MoE); 0: a dense MLP */
    uint8_t layer_moe;
} rlx__mtp_names;

typedef struct rlx__arch {
    const char *name;              /* rlx's name, and the model_type given to a GGUF model */
    const char *const *hf_types;   /* config.json model_type values, NULL-terminated */
    const char *const *gguf_archs; /* general.architecture values, NULL-terminated */
    /* Fill d (zeroed, arch set) from config.json; errors name path and the field. EOS and BOS
     * ids are read by the caller. */
    rlx_status (*read_hf)(const char *path, const cJSON *root, rlx__model_desc *d);
    /* Fill d from GGUF metadata and tensor presence; errors name the file and key (NULL when
     * gguf_archs is empty: no GGUF file names the architecture). */
    rlx_status (*read_gguf)(rlx__gguf_cfg *r, rlx__model_desc *d);
    const rlx__tensor *tensors; /* ended by a row whose hf is NULL */
    /* One decoder layer: x is the residual stream in, the return value the stream out. */
    int (*build_layer)(rlx__blk *b, int x);
    /* 1: llama.cpp's converter permutes the rows of each q and k head (and their biases) from
     * Hugging Face's rotate-half layout into its interleaved-RoPE one (LlamaModel.permute); the
     * GGUF reader undoes it and the GGUF writer does it, so the builder sees Hugging Face's
     * layout either way. */
    uint8_t gguf_qk_permuted;
    /* The general.architecture rlx quantize writes; NULL: gguf_archs[0]; "" when rlx cannot
     * write the architecture as GGUF. */
    const char *gguf_write_arch;
    /* Puts the tensors of weights opened from a Hugging Face directory (gguf 0) or a GGUF file
     * into the form the table and the blocks read, once at open (NULL: they are already):
     * renames, splits and transforms of weights the checkpoint stores otherwise. */
    rlx_status (*fix_weights)(rlx_weights *w, const rlx__model_desc *d, int gguf);
    const rlx__mtp_names *mtp;
} rlx__arch;

/* The name of MTP layer n's tensor of pattern (an rlx__mtp_names member) into out; 0 when the
 * pattern has no "{N}" and n is not 0, or out is too short. */
int rlx__mtp_name(const char *pattern, uint32_t n, char *out, size_t len);
/* The architecture's MTP names (MiMo's when it gives none). */
const rlx__mtp_names *rlx__arch_mtp(const rlx__arch *a);

// ---- the registry (arch.c)

/* The architecture answering to model_type / general.architecture, or NULL. */
const rlx__arch *rlx__arch_by_hf(const char *model_type);
const rlx__arch *rlx__arch_by_gguf(const char *name, size_t len);
/* "qwen3 (model_type qwen3, GGUF qwen3), ..." into text (len bytes, truncated to fit), for error
 * messages; returns text. */
#define RLX__ARCH_LIST_SIZE 512
const char *rlx__arch_list(char *text, size_t len);

/* The table row of role in a, or NULL when a has no such tensor. */
const rlx__tensor *rlx__arch_tensor(const rlx__arch *a, rlx__role role);
/* Whether layer (NULL for a top-level role) of d has the row's tensor by its `when`. */
int rlx__tensor_applies(const rlx__tensor *t, const rlx__model_desc *d, const rlx__layer *layer);
/* The [rows, cols] (cols 0 for a vector) role implies under d. */
void rlx__role_shape(rlx__role role, const rlx__model_desc *d, int64_t *rows, int64_t *cols);
int rlx__role_is_expert(rlx__role role);
int rlx__role_is_top(rlx__role role);
/* The Hugging Face name of row t: prefix (a layer's, "" for a top-level role) + t->hf with the
 * expert index for its '*'. */
void rlx__tensor_hf_name(const rlx__tensor *t, const char *prefix, int64_t expert, char *out, size_t len);

/* The Hugging Face name of GGUF tensor `name` under a's table into out, with "*" for the expert
 * of a stacked tensor (returns 1 then, else 0). A name the table does not know keeps its GGUF
 * spelling: no block asks for it. */
int rlx__arch_hf_of_gguf(const rlx__arch *a, const char *name, char *out, size_t len);
/* llama.cpp's name of the Hugging Face tensor hf into out ("blk.3.ffn_down.weight"; the stacked
 * "blk.N.ffn_down_exps.weight" for an expert's), its layer (-1 for a top-level tensor), its place
 * in a's table (the order llama.cpp's converter writes a layer in) and its expert index (-1 if
 * none). Returns 0 for a name the table does not know. */
int rlx__arch_gguf_of_hf(const rlx__arch *a, const char *hf, char *out, size_t len, int *layer, int *part,
                         int64_t *expert);

// ---- descriptions (config.c, gguf_model.c)

void rlx__model_desc_free(rlx__model_desc *d);
/* Sets the public configuration's per-layer window flags from d's layers, for plugins built
 * against it. */
void rlx__model_desc_project(rlx__model_desc *d);
/* config.json (+ generation_config.json's EOS ids) of a model directory into d. */
rlx_status rlx__model_desc_load_dir(const char *model_dir, rlx__model_desc *d);
/* The metadata of a GGUF model (weights opened from it) into d. */
rlx_status rlx__model_desc_from_gguf(const rlx_weights *w, rlx__model_desc *d);

/* Helpers for the architectures' config.json readers: an integer in [min, max] (absent or null
 * takes dflt, unless dflt is RLX__REQUIRED), a positive number, a boolean; errors name path and
 * key, as config.c documents. */
#define RLX__REQUIRED INT64_MIN
rlx_status rlx__hf_int(const char *path, const cJSON *obj, const char *key, int64_t dflt, int64_t min, int64_t max,
                       int64_t *out);
rlx_status rlx__hf_bool(const char *path, const cJSON *obj, const char *key, int dflt, int *out);
rlx_status rlx__hf_wrong_type(const char *path, const char *field, const char *expected, const cJSON *item);

/* The fields every decoder-only Hugging Face config has (vocab_size, hidden_size,
 * intermediate_size, num_hidden_layers, heads, rms_norm_eps, head_dim, max_position_embeddings,
 * rope_theta and rope_scaling, tie_word_embeddings) into d, allocating d->layers (all dense,
 * full attention). */
typedef struct rlx__hf_defaults {
    int intermediate_optional; /* 1: intermediate_size may be absent (0) */
    int64_t head_dim;          /* head_dim's default; 0: hidden_size / num_attention_heads */
    int64_t max_position_embeddings;
} rlx__hf_defaults;
rlx_status rlx__hf_read_decoder(const char *path, const cJSON *root, const rlx__hf_defaults *def, rlx__model_desc *d);
/* Qwen2-style sliding windows (use_sliding_window, sliding_window, max_window_layers, or an explicit
 * layer_types list) into cfg's fields and each layer's window. */
rlx_status rlx__hf_read_qwen_sliding(const char *path, const cJSON *root, rlx__model_desc *d);
/* A sliding window of window positions (0: none) on every layer, in cfg's fields and each layer's
 * window (Mistral's rule; a GGUF file's ARCH.attention.sliding_window). */
void rlx__desc_window_every_layer(rlx__model_desc *d, int64_t window);

/* rope_scaling of config.json into d: null or type "default" keeps plain RoPE; "llama3" (all four
 * of its parameters required, as transformers' _compute_llama3_parameters reads them) sets
 * RLX__ROPE_LLAMA3 and its factors; any other type is refused naming it. Needs cfg.head_dim and
 * cfg.rope_theta. */
rlx_status rlx__hf_read_rope_scaling(const char *path, const cJSON *root, rlx__model_desc *d);

/* llama.cpp's row permutation of a q or k tensor (LlamaModel.permute): the Hugging Face row that
 * row `row` of the GGUF tensor holds, for heads of head_rows (even) rows each. */
int64_t rlx__qk_hf_row(int64_t row, int64_t head_rows);

/* Helpers for the GGUF readers: "ARCH.name" as a positive count (optional keys give dflt) or a
 * positive number. */
int64_t rlx__gguf_cfg_int(rlx__gguf_cfg *r, const char *name, int optional, int64_t dflt);
double rlx__gguf_cfg_float(rlx__gguf_cfg *r, const char *name, double dflt);
/* The keys llama.cpp writes for every decoder (embedding_length, block_count, head counts,
 * context_length, vocab_size, feed_forward_length, rms epsilon, rope.freq_base, key/value
 * lengths) into d, allocating d->layers; tie_word_embeddings from output.weight's absence. */
rlx_status rlx__gguf_read_decoder(rlx__gguf_cfg *r, int ff_optional, rlx__model_desc *d);

// ---- shared blocks (blocks.c)

/* The model's tensors, for the block builder (model.c). */
const rlx_weight *rlx__model_find(const rlx_model *m, const char *name);
const rlx__model_desc *rlx__model_desc_of(const rlx_model *m);
/* Whether w (a tensor of m) lives in a buffer m's reader made (a GGUF q/k tensor put back in
 * Hugging Face's row order), not in a page of the mapped file. */
int rlx__model_weight_in_memory(const rlx_model *m, const rlx_weight *w);

/* One layer being built. */
typedef struct rlx__blk_layer {
    char tensors[64]; /* Hugging Face name prefix of its tensors: "model.layers.3." */
    char nodes[32];   /* graph name prefix: "layers.3." */
    uint32_t index;   /* rlx_op_params.layer */
    rlx__layer kind;
} rlx__blk_layer;

/* A graph under construction. The first failure stays in rc and makes later calls return -1
 * without adding anything (one check at the end). */
struct rlx__blk {
    const rlx_model *m;
    const rlx__model_desc *d;
    rlx_graph *g;
    const rlx__blk_layer *layer; /* the layer being built, NULL outside one */
    int pos, seq, kc, vc;        /* positions, slots (-1: one sequence) and the layer's caches */
    int kc_rows, vc_rows;        /* a linear layer's state rows (ABI 1.7), or -1 */
    rlx_status rc;
};

/* The weight of role in the current layer (expert e of an expert role, else -1), declared in the
 * graph once per name; its shape and dtype checked (rlx__check_weight). */
int rlx__blk_weight(rlx__blk *b, rlx__role role, int64_t expert);
/* Whether the current layer (or the model, for a top-level role) has role's tensor. */
int rlx__blk_has(rlx__blk *b, rlx__role role);
/* A top-level weight of the given name and shape (the MTP head's). */
int rlx__blk_named_weight(rlx__blk *b, const char *name, int64_t rows, int64_t cols);
int rlx__blk_input(rlx__blk *b, rlx_tensor_role role, const char *name, rlx_dtype dtype, uint32_t n_dims,
                   const int64_t *shape);
int rlx__blk_node(rlx__blk *b, rlx_op op, const char *name, const int *in, uint32_t n, const rlx_op_params *p);
int rlx__blk_node2(rlx__blk *b, rlx_op op, const char *name, int x, int y, const rlx_op_params *p);
/* Nodes are named after the current layer ("layers.3." + name), or name alone outside one. */
int rlx__blk_rms_norm(rlx__blk *b, const char *name, int x, int weight);
int rlx__blk_add(rlx__blk *b, const char *name, int x, int y);
/* Self-attention of the current layer on h: q/k/v projections (with their biases when the layer
 * has them), per-head q/k norms when it has them, RoPE (partial with rope_dims), attention over
 * the cache (sliding when the layer's window is set), the output gate when the layer has one,
 * the output projection. */
int rlx__blk_attention(rlx__blk *b, int h);
/* Gated DeltaNet linear attention of the current layer on h (Qwen3.5, Qwen3-Next): q, k and v
 * projected together through the causal convolution, the gated delta rule over the layer's
 * state, the per-head RMS norm gated by silu(z), the output projection. */
int rlx__blk_gated_deltanet(rlx__blk *b, int h);
/* SwiGLU MLP: down(silu(gate(h)) * up(h)). */
int rlx__blk_gated_mlp(rlx__blk *b, int h);
/* Mixture of experts: a router picks top-k experts per row, each a SwiGLU MLP; plus the shared
 * expert, gated, when the layer has one (RLX__R_FFN_*_SHEXP). */
int rlx__blk_moe(rlx__blk *b, int h);
/* The pre-norm decoder layer of the Llama family: x + attention(norm(x)), then + mlp(norm(x))
 * with the layer's MLP dense or a mixture of experts; a linear layer's token mixer is Gated
 * DeltaNet instead of attention. */
int rlx__blk_decoder_layer(rlx__blk *b, int x);

/* Checks the tensor found for name against the shape wanted ([rows] when cols is 0) and the
 * dtypes a block reads; returns w, or NULL with *rc set (w NULL is a missing tensor). */
const rlx_weight *rlx__check_weight(const rlx_model *m, const char *name, const rlx_weight *w, int64_t rows,
                                    int64_t cols, int router, rlx_status *rc);

// ---- the architectures (core/src/model/arch/*.c)

extern const rlx__arch rlx__arch_qwen3;
extern const rlx__arch rlx__arch_qwen3_moe;
extern const rlx__arch rlx__arch_qwen2;
extern const rlx__arch rlx__arch_llama;
extern const rlx__arch rlx__arch_mistral;
extern const rlx__arch rlx__arch_qwen3_5;
extern const rlx__arch rlx__arch_qwen3_5_moe;
extern const rlx__arch rlx__arch_qwen3_next;

/* Llama's tensor table (Mistral's too) and its hidden_act check ("silu" or absent) (arch/llama.c). */
extern const rlx__tensor rlx__llama_tensors[];
rlx_status rlx__llama_check_act(const char *path, const cJSON *root);

/* Qwen3's tensor table (with Qwen3-MoE's expert rows, which a dense layer never applies) and its
 * attention configuration, which Qwen3-MoE shares (arch/qwen3.c). */
extern const rlx__tensor rlx__qwen3_tensors[];
/* attention_bias (all four projections) and the sliding windows of a Qwen3 config.json. */
rlx_status rlx__qwen3_read_hf_attention(const char *path, const cJSON *root, rlx__model_desc *d);
/* The same from a GGUF file: biases are there when blk.0.attn_q.bias is. */
void rlx__qwen3_read_gguf_attention(rlx__gguf_cfg *r, rlx__model_desc *d);

/* Qwen3.5's pieces, which Qwen3.5-MoE and Qwen3-Next share (arch/qwen3_5.c). */
/* The text model's config (text_config when there is one, else root, returned in *text) into d:
 * the decoder fields, rope_parameters, layer kinds, the Gated DeltaNet shape, the output gate and
 * the tied head; intermediate_optional as rlx__hf_defaults has it. */
rlx_status rlx__qwen3_5_read_hf(const char *path, const cJSON *root, int intermediate_optional, rlx__model_desc *d,
                                const cJSON **text);
/* GGUF qwen35-style metadata (its ssm.* keys, full_attention_interval) into d; value heads tiled. */
rlx_status rlx__qwen3_5_read_gguf(rlx__gguf_cfg *r, int ff_optional, rlx__model_desc *d);
/* Qwen3.5's fix_weights: the text model unnested, (1 + w) norms, -exp(A_log), conv1d, q and
 * gate rows split, the MTP layer named; d->arch's table names the tensors. */
rlx_status rlx__qwen3_5_fix_weights(rlx_weights *w, const rlx__model_desc *d, int gguf);
/* The prefix of the MTP layer Qwen3.5-style checkpoints carry. */
#define RLX__QWEN3_5_MTP_LAYER "mtp.layers.0."

/* The mixture-of-experts pieces of Qwen3.5-MoE, which Qwen3-Next shares (arch/qwen3_5_moe.c). */
/* num_experts, num_experts_per_tok, moe_intermediate_size and shared_expert_intermediate_size
 * of config object tc into d, all required, and hidden_size ones for the shared expert's gate. */
rlx_status rlx__qwen3_5_moe_read_hf(const char *path, const cJSON *tc, rlx__model_desc *d);
/* The same from GGUF metadata (expert_count, expert_used_count, expert_feed_forward_length,
 * expert_shared_feed_forward_length); every layer's MLP a mixture of experts with norm_topk. */
rlx_status rlx__qwen3_5_moe_read_gguf(rlx__gguf_cfg *r, rlx__model_desc *d);
/* The experts of every MoE layer (and of the MTP layer) in the form the blocks read: a Hugging
 * Face checkpoint's fused [experts, 2 * ff, hidden] mlp.experts.gate_up_proj and [experts,
 * hidden, ff] mlp.experts.down_proj become one view per expert (a checkpoint with one tensor per
 * expert already has that form), and a GGUF file's one-dimensional shared-expert gate the [1,
 * hidden] matrix Hugging Face stores. */
rlx_status rlx__qwen3_5_moe_fix_experts(rlx_weights *w, const rlx__model_desc *d, int gguf);

#endif
