/* F32 rows to the GGUF block types (rlx/quant_iface.h), and the per-tensor type choice of
 * llama.cpp's llama-quantize, shared by the GGUF writer and in-memory quantization.
 *
 * Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 follow ggml's simple reference rules (the bytes equal
 * llama.cpp's quantize_row_*_ref). Q4_K, Q5_K and Q6_K search each sub-block for the scale (and
 * minimum) of least weighted squared error, then store the sub-block scales in 6 or 8 bits and
 * requantize the levels with the rounded scales. */
#ifndef RLX_QUANTIZE_H
#define RLX_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#include "rlx/status.h"

/* Writes n values of x (n a whole number of dtype's blocks) as dtype: F32, F16, BF16 or a
 * quantized type. Returns 0, or -1 for a dtype it cannot produce. */
int rlx__quantize_row(uint32_t dtype, const float *x, void *dst, int64_t n);

/* What a model is quantized to: one of llama.cpp's file types. */
typedef struct rlx__qtype {
    const char *name;   /* "q4_k_m" */
    uint32_t file_type; /* general.file_type (llama_ftype) */
    uint32_t dtype;     /* the default tensor type */
    char mix;           /* 'M' or 'S' for the K mixes, 0 otherwise */
} rlx__qtype;

/* The file type called name (case-insensitive), or NULL. */
const rlx__qtype *rlx__qtype_find(const char *name);
/* The names, comma separated, for error messages. */
const char *rlx__qtype_names(void);

/* Where a tensor sits, for the per-tensor choice. */
typedef struct rlx__qtensor {
    const char *gguf_name; /* llama.cpp's name: "blk.3.ffn_down.weight", "output.weight" */
    uint32_t n_dims;       /* of the tensor (a stacked expert tensor counts 3) */
    int64_t cols;          /* innermost dimension */
    int64_t n_layers;
    int64_t n_experts;
    int tied; /* the model has no output.weight: token_embd doubles as the LM head */
} rlx__qtensor;

/* The dtype llama-quantize gives a tensor for file type q: vectors, the MoE router and the
 * Gated DeltaNet convolution (ssm_conv1d) stay F32, the LM head (or the tied embedding) and some
 * attn_v / ffn_down layers get more bits, and a row length that is not a whole number of blocks
 * falls back (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, then F16). src_dtype is the tensor's type in the source (F32/BF16/F16 stay as they
 * are for the float file types' vectors). *fallback is set when the fallback applied. */
uint32_t rlx__qtype_tensor(const rlx__qtype *q, const rlx__qtensor *t, int *fallback);

#endif
