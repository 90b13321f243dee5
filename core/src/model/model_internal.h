/* Helpers shared by the sources of core/src/model. */
#ifndef RLX_MODEL_INTERNAL_H
#define RLX_MODEL_INTERNAL_H

#include <stdint.h>

#include "rlx/dist.h"
#include "rlx/model.h"
#include "rlx/status.h"

/* The caller's block spec as this version lays it out: the members its size covers, 0 for the
 * rest (RLX_E_INVALID when the size does not reach produce_logits). */
rlx_status rlx__block_spec_read(const rlx_block_spec *in, rlx_block_spec *out);

/* Maps one safetensors file (any name) as rlx_weights_open maps a model's, with the same checks. */
rlx_status rlx__weights_open_file(const char *path, rlx_weights **out);

/* Which reader a model path takes (weights.c decides it for every caller): *gguf = 1 for a
 * regular file, which must then be a GGUF file (else the error of rlx__gguf_not_gguf), 0 for
 * anything else (a directory in Hugging Face layout, whose readers report what is missing). */
rlx_status rlx__weights_path_is_gguf(const char *path, int *gguf);

/* The first (metadata-holding) GGUF file of weights opened from a GGUF model, else NULL. */
struct rlx__gguf;
const struct rlx__gguf *rlx__weights_gguf(const rlx_weights *w);
/* rlx__gguf_release_header on each file of weights opened from a GGUF model (a no-op for
 * safetensors): for whoever has read what it needs from the metadata. */
void rlx__weights_release_gguf_headers(const rlx_weights *w);
/* The name in the GGUF file of w's tensor t (for an expert's view, the stacked tensor holding
 * it), or NULL when w is not a GGUF model or t is not one of its tensors: errors about a tensor
 * name the one a user finds in the file besides rlx's Hugging Face name. */
const char *rlx__weights_gguf_name(const rlx_weights *w, const rlx_weight *t);

/* The public configuration of a GGUF model from its metadata and tensors (rlx__model_desc_from_gguf's
 * cfg); errors name the file and key. */
rlx_status rlx__model_config_from_gguf(const rlx_weights *w, rlx_model_config *out);

/* rlx_model_id of an open model, from the header it parsed for a GGUF model (whose pages it
 * releases again after hashing them) rather than from a second parse of the file. */
rlx_status rlx__model_id_of(const rlx_model *m, char out[RLX_MODEL_ID_SIZE]);
/* rlx_model_config_load_model and rlx_model_id of one model path, a GGUF header parsed once for
 * both, and whether the model has linear-attention layers (*recurrent). */
rlx_status rlx__model_config_and_id(const char *model_path, rlx_model_config *cfg, char id[RLX_MODEL_ID_SIZE],
                                    int *recurrent);

/* Whether the block has Gated DeltaNet layers, whose per-sequence state is recurrent: it cannot
 * be cut back to an earlier position, only rebuilt by running the positions again. */
int rlx__model_recurrent(const rlx_model *m, const rlx_block_spec *spec);
/* Whether model layer `layer` is a Gated DeltaNet layer (0 past the last layer: an MTP layer). */
int rlx__model_layer_linear(const rlx_model *m, uint32_t layer);
/* Bytes of one sequence's tensor `which` (0: k_cache, or a linear layer's convolution state; 1:
 * v_cache, or its delta-rule state) of model layer `layer` (UINT32_MAX: an MTP layer, full
 * attention) for a context of capacity positions and KV caches of kv_dtype. */
size_t rlx__layer_cache_bytes(const rlx_model *m, uint32_t layer, uint32_t capacity, uint32_t kv_dtype, int which);
/* RLX_OK when m's attention layers can keep their KV caches in kv_dtype: F32, F16, or Q8_0 with a
 * head_dim of whole blocks; else the error, set. */
rlx_status rlx__kv_dtype_check(const rlx_model *m, uint32_t kv_dtype);

/* The state rows of a block's linear layers (ABI 1.7): per layer of the block, k then v as its
 * caches, an F32[n_tokens, state...] STATE input receiving the state after each row, or -1 for
 * a full-attention layer. */
typedef struct rlx__state_rows_io {
    int k_rows[RLX_MAX_LAYERS];
    int v_rows[RLX_MAX_LAYERS];
} rlx__state_rows_io;

/* rlx_model_build_block that, with rows non-NULL, also gives every recurrent op of the block
 * state rows: a caller that cuts the sequence back inside a run restores the states from them. */
rlx_status rlx__model_build_block(const rlx_model *m, const rlx_block_spec *spec, const rlx_build_options *opts,
                                  rlx_graph **graph, rlx_batch_io *bio, rlx__state_rows_io *rows);

#endif
