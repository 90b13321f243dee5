/* Models in Hugging Face layout (config.json, safetensors weights, mapped, never copied) or GGUF
 * files, of the architectures core/src/model/arch/ defines (docs/architectures.md), and the graph
 * of one block, a contiguous layer range [layer_start, layer_end).
 *
 * A block built with embed_input takes token ids, otherwise the previous block's hidden states
 * F32[T, hidden]. A block built with produce_logits applies the final norm and the LM head,
 * otherwise it returns hidden states. A block of all layers with both flags is the whole model;
 * pipeline stages are blocks. */
#ifndef RLX_MODEL_H
#define RLX_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RLX_MAX_EOS 8
#define RLX_MAX_LAYERS 1024

/* Speculator plugins read the model's through rlx_model_config_of, so members are only appended
 * (their offsets are pinned in core/src/plugin/abi.c). What it cannot say about an architecture
 * (q/k norms, which projections have biases, the RoPE variant, each layer's kind) is read with
 * rlx_model_arch_info_of and rlx_model_layer_info_of. */
typedef struct rlx_model_config {
    char model_type[32]; /* config.json's model_type ("qwen3", "qwen3_moe"); for a GGUF file, the
                          * architecture's name in rlx */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;
    int64_t head_dim; /* defaults to hidden_size / num_attention_heads */
    int64_t max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    int tie_word_embeddings;
    int attention_bias; /* config.json's attention_bias (Qwen3: biases on q, k, v and o) */
    /* Sliding window: layer i uses a window of `sliding_window` positions when
     * layer_sliding[i] is set (from `layer_types`, or use_sliding_window with
     * i >= max_window_layers as Hugging Face derives it). */
    int use_sliding_window;
    int64_t sliding_window;
    int64_t max_window_layers;
    uint8_t layer_sliding[RLX_MAX_LAYERS];
    /* Mixture of experts (qwen3_moe): layer i is sparse when num_experts > 0, i is not in
     * mlp_only_layers and (i + 1) % decoder_sparse_step == 0. */
    int64_t num_experts;
    int64_t num_experts_per_tok;
    int64_t moe_intermediate_size;
    int64_t decoder_sparse_step;
    int norm_topk_prob;
    uint8_t layer_dense_mlp[RLX_MAX_LAYERS]; /* 1 = layer listed in mlp_only_layers */
    /* End-of-sequence ids from config.json and generation_config.json (merged, unique). */
    int32_t eos_ids[RLX_MAX_EOS];
    uint32_t n_eos;
    int32_t bos_id; /* -1 when absent */
} rlx_model_config;

/* Parses a config.json of an architecture rlx runs (its model_type picks it; another is
 * RLX_E_FORMAT listing the ones there are). Unknown fields are ignored; a missing required field,
 * a wrong JSON type or an impossible value (head counts that do not divide, more than
 * RLX_MAX_LAYERS layers) is RLX_E_FORMAT with a message naming the file and the field. */
RLX_API rlx_status rlx_model_config_load(const char *config_path, rlx_model_config *out);

/* The configuration of the model at model_path: a directory's config.json with the EOS ids of
 * its generation_config.json, or a GGUF file's metadata (its first shard for a split one).
 * Errors as rlx_model_config_load's, naming the file. */
RLX_API rlx_status rlx_model_config_load_model(const char *model_path, rlx_model_config *out);

/* Adds the EOS ids of a generation_config.json (integer or list) to cfg; a missing file is
 * not an error, a malformed one is. */
RLX_API rlx_status rlx_model_config_load_generation(const char *path, rlx_model_config *cfg);

/* The sampling keys of a model's generation_config.json, with Hugging Face's meaning: without
 * do_sample, generate() decodes greedily (the repetition penalty still applies, to the whole
 * context); with it, an absent temperature, top_k or top_p takes Hugging Face's default. Each
 * has_ flag says whether the file gave the key (JSON null counts as not given). */
typedef struct rlx_generation_defaults {
    int has_do_sample, has_temperature, has_top_k, has_top_p, has_min_p, has_repetition_penalty;
    int do_sample;            /* 0 when absent */
    float temperature;        /* >= 0; 1 when absent */
    int32_t top_k;            /* >= 0 (0 = off); 50 when absent */
    float top_p;              /* (0, 1]; 1 when absent */
    float min_p;              /* [0, 1]; 0 (off) when absent */
    float repetition_penalty; /* > 0; 1 (off) when absent */
} rlx_generation_defaults;

/* Reads model_dir/generation_config.json into *out. A missing file is not an error (*out then
 * holds the defaults with no has_ flag set); a malformed file, a key of the wrong type or a
 * value the sampler would refuse is RLX_E_FORMAT naming the file and the key, and leaves *out
 * unchanged. Other keys are ignored. For a GGUF file (which has no generation_config.json) the
 * defaults are llama.cpp's (do_sample with temperature 0.8, top_k 40, top_p 0.95, min_p 0.05),
 * as far as the file's general.sampling.* keys do not set others. */
RLX_API rlx_status rlx_generation_config_load(const char *model_dir, rlx_generation_defaults *out);

/* True when layer i of cfg uses a mixture-of-experts MLP. */
RLX_API int rlx_model_config_layer_is_moe(const rlx_model_config *cfg, int64_t layer);

/* The RoPE variants (rlx_model_arch_info.rope_type). */
#define RLX_ROPE_DEFAULT 0 /* rotate-half RoPE with rope_theta, unscaled */
#define RLX_ROPE_LLAMA3 1  /* the same with Llama 3.1's per-pair frequency scaling (rope_type llama3) */

/* What a model's architecture-neutral description says beyond rlx_model_config. Sized: set size
 * to sizeof(rlx_model_arch_info); the core writes the members the size covers (members are only
 * appended). */
typedef struct rlx_model_arch_info {
    uint32_t size;
    uint32_t qk_norm;   /* 1: q and k are RMS-normed per head before RoPE (Qwen3) */
    uint32_t qkv_bias;  /* 1: the q, k and v projections have biases */
    uint32_t o_bias;    /* 1: the attention output projection has one */
    uint32_t rope_type; /* RLX_ROPE_* */
    char arch[32];      /* the architecture's name in rlx ("qwen3", "qwen3_moe") */
} rlx_model_arch_info;

/* One layer's kind. Sized like rlx_model_arch_info. */
typedef struct rlx_model_layer_info {
    uint32_t size;
    uint32_t window; /* sliding-window attention over this many positions, 0 = full attention */
    uint32_t moe;    /* 1: mixture-of-experts MLP, 0: dense */
    uint32_t linear; /* 1: Gated DeltaNet linear attention (a recurrent state, no KV rows) */
} rlx_model_layer_info;

/* ---- safetensors ---- */

typedef struct rlx_weight {
    const char *name;
    uint32_t dtype; /* rlx_dtype */
    uint32_t n_dims;
    int64_t shape[RLX_MAX_DIMS];
    const void *data; /* inside the read-only mapping of `file` */
    size_t nbytes;
    const char *file; /* path of the safetensors file holding it */
} rlx_weight;

typedef struct rlx_weights rlx_weights;

/* Maps the safetensors of a model directory: `model.safetensors`, or the shards listed by
 * `model.safetensors.index.json`. Headers are validated (JSON, dtypes, shapes that match the
 * byte ranges, ranges inside the file and not overlapping); any problem is RLX_E_FORMAT naming
 * the file and tensor. Mappings are lazy: only the pages of tensors actually read count in RSS. */
RLX_API rlx_status rlx_weights_open(const char *model_dir, rlx_weights **out);
RLX_API void rlx_weights_close(rlx_weights *w);
RLX_API size_t rlx_weights_count(const rlx_weights *w);
RLX_API const rlx_weight *rlx_weights_at(const rlx_weights *w, size_t i);
/* The tensor called name, or NULL (no error recorded). */
RLX_API const rlx_weight *rlx_weights_find(const rlx_weights *w, const char *name);
/* Total bytes of all tensor data. */
RLX_API size_t rlx_weights_total_bytes(const rlx_weights *w);

/* ---- model and blocks ---- */

typedef struct rlx_model rlx_model;

/* Opens a model directory: config.json (+ generation_config.json) and its safetensors. */
RLX_API rlx_status rlx_model_open(const char *model_dir, rlx_model **out);
RLX_API void rlx_model_close(rlx_model *m);
RLX_API const rlx_model_config *rlx_model_config_of(const rlx_model *m);
/* The model's rlx_model_arch_info into *out (out->size set by the caller; a size short of arch
 * is RLX_E_INVALID). */
RLX_API rlx_status rlx_model_arch_info_of(const rlx_model *m, rlx_model_arch_info *out);
/* Layer `layer`'s rlx_model_layer_info into *out (out->size set by the caller); a layer outside
 * the model is RLX_E_RANGE. */
RLX_API rlx_status rlx_model_layer_info_of(const rlx_model *m, uint32_t layer, rlx_model_layer_info *out);
RLX_API const rlx_weights *rlx_model_weights(const rlx_model *m);
RLX_API const char *rlx_model_dir(const rlx_model *m);
/* A GGUF model's metadata (its first file's): the string at key (*text inside the file's
 * mapping, valid while m is open, *len bytes with no NUL after them), or the integer. Absent
 * (or a model that is no GGUF file) is RLX_E_NOT_FOUND with no message recorded; a value of
 * another type is RLX_E_FORMAT. */
RLX_API rlx_status rlx_model_gguf_string(const rlx_model *m, const char *key, const char **text, size_t *len);
RLX_API rlx_status rlx_model_gguf_int(const rlx_model *m, const char *key, int64_t *out);
/* rlx_generation_config_load(rlx_model_dir(m)), read for a GGUF model from the header the model
 * parsed at open rather than from a second parse of the file. */
RLX_API rlx_status rlx_generation_config_of(const rlx_model *m, rlx_generation_defaults *out);
/* Adds a safetensors file whose tensors blocks may use besides the model's own (an MTP head
 * shipped separately); a name in both is an RLX_E_FORMAT error. */
RLX_API rlx_status rlx_model_add_weights(rlx_model *m, const char *safetensors_path);
/* True when the model (with added files) holds MTP layer n's input_proj. */
RLX_API int rlx_model_has_mtp(const rlx_model *m, uint32_t n);

/* Speculator plugins fill this in too, so it is sized: set size to sizeof(rlx_block_spec).
 * Members are only appended; the core reads those the size covers and takes 0 for the rest. A
 * size short of produce_logits is RLX_E_INVALID. */
typedef struct rlx_block_spec {
    uint32_t size;           /* sizeof(rlx_block_spec) the caller was built with */
    uint32_t layer_start;    /* first layer */
    uint32_t layer_end;      /* one past the last layer */
    uint32_t embed_input;    /* 1: input is token ids and the block embeds them */
    uint32_t produce_logits; /* 1: final norm and LM head */
    uint32_t all_logits;     /* with produce_logits: logits for every position, else the last */
    uint32_t emit_hidden;    /* with produce_logits: also output the final-normed hidden rows of
                            * every position (rlx_block_io.hidden) */
    uint32_t mtp;            /* 1: the block is multi-token-prediction layer layer_start (see below) */
} rlx_block_spec;

/* Multi-token prediction (DeepSeek-V3 / MiMo style). An MTP block (spec.mtp, one layer, with
 * embed_input and produce_logits) takes pairs (token x[t+1], the target's final hidden state
 * h[t]) and predicts x[t+2]:
 *     e = token_layernorm(embed(x[t+1])),  g = hidden_layernorm(h[t])
 *     y = decoder_layer(input_proj(concat(g, e)))          input_proj: [hidden, 2 * hidden]
 *     out = final_layernorm(y) (the target's model.norm when the MTP has none), logits = lm_head(out)
 * out is the block's hidden output, which chained drafting feeds back as the next h. Tensors,
 * in the model's safetensors or in a file added with rlx_model_add_weights (MiMo's names):
 *     model.mtp_layers.N.token_layernorm.weight      [hidden]
 *     model.mtp_layers.N.hidden_layernorm.weight     [hidden]
 *     model.mtp_layers.N.input_proj.weight           [hidden, 2 * hidden]
 *     model.mtp_layers.N.mtp_block.<a Qwen3 decoder layer: input_layernorm, self_attn.*, post_attention_layernorm, mlp.*>
 *     model.mtp_layers.N.final_layernorm.weight      [hidden] (optional)
 * The embedding and LM head are the target's. */

/* Tensor ids of a built block graph. */
typedef struct rlx_block_io {
    int input;                   /* I32[T] token ids or F32[T, hidden] hidden states */
    int positions;               /* I32[T] */
    int output;                  /* F32[rows, vocab] logits or F32[T, hidden] hidden states */
    int hidden;                  /* with emit_hidden: F32[T, hidden] final-normed hidden states, else -1 */
    int hidden_input;            /* MTP block: F32[T, hidden] the target's hidden states, else -1 */
    uint32_t n_layers;           /* layer_end - layer_start */
    int k_cache[RLX_MAX_LAYERS]; /* STATE tensors F32[capacity, kv_heads * head_dim] */
    int v_cache[RLX_MAX_LAYERS];
} rlx_block_io;

/* Checks a block spec against the model (range inside [0, num_hidden_layers), non-empty) and
 * that every weight the block needs exists with the dtype family and shape the config implies. */
RLX_API rlx_status rlx_model_check_block(const rlx_model *m, const rlx_block_spec *spec);

/* Calls fn with the name of every safetensors tensor the block reads (tied embeddings pull
 * model.embed_tokens.weight into a logits block). */
RLX_API rlx_status rlx_model_block_weights(const rlx_model *m, const rlx_block_spec *spec,
                                           int (*fn)(void *ctx, const char *name), void *ctx);

/* Reads every page of the weights the block needs into memory (they are mapped lazily
 * otherwise, so the first forward pass would fault them in), calling progress (may be NULL)
 * with bytes done and total as it goes. For a progress bar while a large model loads. */
RLX_API rlx_status rlx_model_prefetch(const rlx_model *m, const rlx_block_spec *spec,
                                      void (*progress)(void *ctx, size_t done, size_t total), void *ctx);

/* What rlx_model_build_block builds. Start from zero with size set; members are only appended. */
typedef struct rlx_build_options {
    uint32_t size;        /* sizeof(rlx_build_options) the caller was built with */
    uint32_t n_tokens;    /* rows per run, >= 1 */
    uint32_t kv_capacity; /* KV positions (per slot with n_slots) */
    /* 0: one sequence (2-D caches [kv_capacity, kv_heads * head_dim], rows at consecutive positions).
     * >= 1: rows of up to n_slots sequences in one run (ABI 1.4 attention): 3-D caches
     * [n_slots, kv_capacity, kv_heads * head_dim], an I32[T] input naming each row's slot, and
     * positions given per row. */
    uint32_t n_slots;
    uint32_t kv_dtype; /* rlx_dtype of the caches: RLX_DTYPE_F32 (0) or RLX_DTYPE_F16 */
    /* With produce_logits and n_slots: the LM head runs on n_out_rows rows picked by an I32 input
     * (rlx_batch_io.out_rows) instead of every row; 0 = every row (all_logits) or the last. */
    uint32_t n_out_rows;
} rlx_build_options;

/* The tensor ids of a block built by rlx_model_build_block. */
typedef struct rlx_batch_io {
    rlx_block_io block;
    int seq;      /* I32[T] slot of each row with n_slots, else -1 */
    int out_rows; /* I32[n_out_rows] rows the logits are computed for, else -1 */
} rlx_batch_io;

/* Builds the graph of a block for o->n_tokens positions per run, with the KV cache layout and
 * dtype of o (see rlx_build_options). The caller owns *graph (rlx_graph_destroy); io receives
 * the ids to bind. */
RLX_API rlx_status rlx_model_build_block(const rlx_model *m, const rlx_block_spec *spec, const rlx_build_options *o,
                                         rlx_graph **graph, rlx_batch_io *io);

/* ---- quantization and GGUF output ---- */

/* One tensor quantized or written, reported as it is done. */
typedef struct rlx_quantize_event {
    const char *name;   /* llama.cpp's tensor name ("blk.0.attn_q.weight") */
    uint32_t src_dtype; /* rlx_dtype in the source */
    uint32_t dtype;     /* rlx_dtype written */
    int fallback;       /* 1: the row length is not a whole number of the type's blocks, a fallback type was used */
    size_t index, count;
    size_t bytes_in, bytes_out;
} rlx_quantize_event;

typedef void (*rlx_quantize_progress)(void *ctx, const rlx_quantize_event *ev);

/* The quantization types (llama.cpp's file types): f32, bf16, f16, q8_0, q4_0, q4_1, q5_0,
 * q5_1, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k. True when name is one of them. */
RLX_API int rlx_quant_type_known(const char *name);

/* Quantizes the matrices of a safetensors model in memory, tensor by tensor, with llama-quantize's
 * per-tensor choice for `type` (norms, biases and a MoE router stay as they are; see rlx quantize).
 * The model owns the new buffers; the mapped pages of each source tensor are released after it is
 * quantized. Call before building blocks. An unknown type is RLX_E_INVALID; a GGUF model is
 * RLX_E_UNSUPPORTED (quantize it with rlx quantize). progress may be NULL. */
RLX_API rlx_status rlx_model_quantize(rlx_model *m, const char *type, rlx_quantize_progress progress, void *ctx);

/* Quantizes n values of src (n a whole number of dtype's blocks) into dst as dtype (rlx_dtype:
 * F32, BF16, F16 or a block type of rlx/quant_iface.h), as rlx quantize does. Returns 0, or -1
 * for a dtype it cannot produce or an n that is not whole blocks. */
RLX_API int rlx_quantize_row(uint32_t dtype, const float *src, void *dst, int64_t n);

struct rlx_tokenizer;
/* Writes the model (a directory or a GGUF file) as a GGUF v3 file at out_path with llama.cpp's
 * tensor names, metadata and tokenizer, its tensors of `type` as rlx_model_quantize chooses them.
 * The file is written as out_path.tmp, row by row, and renamed when complete; errors (disk full,
 * ...) name the file and remove the partial one. progress may be NULL. */
RLX_API rlx_status rlx_model_write_gguf(const rlx_model *m, const struct rlx_tokenizer *tok, const char *out_path,
                                        const char *type, rlx_quantize_progress progress, void *ctx);

/* ---- deprecated, removed in rlx 0.3 ---- */

/* rlx_model_build_block. */
RLX_API rlx_status rlx_model_build_block_ex(const rlx_model *m, const rlx_block_spec *spec, const rlx_build_options *o,
                                            rlx_graph **graph, rlx_batch_io *io);

#ifdef __cplusplus
}
#endif
#endif
