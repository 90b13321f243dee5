/* The rlx graph IR: typed tensors and the transformer ops a backend executes.
 *
 * A graph is a list of nodes in SSA form. Each node reads tensors and defines exactly one new
 * tensor. Tensors are dense, row-major and contiguous; shapes list the outermost dimension
 * first. Activations are [n_tokens, features]. Weights use the Hugging Face `[out, in]` layout.
 *
 * Tensors have a role: an INPUT (token ids, positions) and a STATE (a KV cache) are bound to
 * caller memory before each run, a WEIGHT is bound once at build time (usually to a mapped
 * safetensors region), and an ACTIVATION lives in the scheduler's arena.
 *
 * rlx_tensor, rlx_op_params and rlx_node_view are part of the plugin ABI (see backend.h): they
 * use fixed-width fields and only grow by appending members. */
#ifndef RLX_GRAPH_H
#define RLX_GRAPH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rlx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rlx_dtype {
    RLX_DTYPE_F32 = 0,
    RLX_DTYPE_BF16 = 1,
    RLX_DTYPE_F16 = 2,
    RLX_DTYPE_I32 = 3,
    RLX_DTYPE_COUNT
} rlx_dtype;

#define RLX_MAX_DIMS 4

typedef struct rlx_tensor {
    uint32_t dtype;               /* rlx_dtype */
    uint32_t n_dims;              /* 1..RLX_MAX_DIMS */
    int64_t shape[RLX_MAX_DIMS];  /* outermost first; unused entries are 1 */
    void *data;                   /* NULL while planning; bound memory while running */
} rlx_tensor;

/* The ops. Shapes use T = tokens in this run, H = hidden size, D = head_dim.
 *   EMBED       (ids I32[T], table[V,H])                       -> F32[T,H]; ids must be < V
 *   MATMUL      (x F32[T,K], w[N,K] [, bias[N]])                -> F32[T,N]  y = x w^T + b
 *   RMS_NORM    (x F32[T,C], w[G])                              -> F32[T,C]; C % G == 0, each
 *               group of G values is normalised on its own (G == D gives per-head norm)
 *   ROPE        (x F32[T,n*D], pos I32[T])                      -> F32[T,n*D]; NeoX rotate-half
 *               over the whole head_dim with base rope_theta
 *   ATTENTION   (q F32[T,Hq*D], k F32[T,Hkv*D], v F32[T,Hkv*D], pos I32[T],
 *                k_cache F32[C,Hkv*D], v_cache F32[C,Hkv*D])   -> F32[T,Hq*D]
 *               writes row t of k and v into cache row pos[t], then lets query t attend to
 *               cache rows j <= pos[t] (and pos[t] - j < window when window > 0), GQA with
 *               Hq/Hkv queries per KV head, softmax scaled by `scale`
 *   SWIGLU      (gate F32[T,F], up F32[T,F])                    -> F32[T,F]  silu(gate) * up
 *   ADD         (a F32[T,C], b F32[T,C])                        -> F32[T,C]
 *   GATHER_LAST (x F32[T,C])                                    -> F32[1,C]  row T-1
 *   MOE         (x F32[T,H], router[E,H], then for each expert e: gate_e[F,H], up_e[F,H],
 *                down_e[H,F])                                   -> F32[T,H]
 *               softmax over router logits, top_k experts per token (renormalised to sum 1
 *               when norm_topk_prob), output = sum_k p_k * down_e(silu(gate_e x) * up_e x)
 * Weights (table, w, router, expert matrices) may be F32, BF16 or F16; bias and norm weights
 * likewise. */
typedef enum rlx_op {
    RLX_OP_EMBED = 1,
    RLX_OP_MATMUL = 2,
    RLX_OP_RMS_NORM = 3,
    RLX_OP_ROPE = 4,
    RLX_OP_ATTENTION = 5,
    RLX_OP_SWIGLU = 6,
    RLX_OP_ADD = 7,
    RLX_OP_GATHER_LAST = 8,
    RLX_OP_MOE = 9,
    RLX_OP_COUNT
} rlx_op;

typedef struct rlx_op_params {
    float eps;            /* RMS_NORM */
    float rope_theta;     /* ROPE */
    float scale;          /* ATTENTION: softmax scale, usually 1/sqrt(D) */
    uint32_t head_dim;    /* ROPE, ATTENTION */
    uint32_t n_heads;     /* ATTENTION: query heads */
    uint32_t n_kv_heads;  /* ATTENTION */
    uint32_t window;      /* ATTENTION: sliding window in positions, 0 = none */
    uint32_t n_experts;   /* MOE */
    uint32_t top_k;       /* MOE */
    uint32_t norm_topk;   /* MOE: 1 = renormalise the top-k probabilities */
    uint32_t layer;       /* informational: model layer the node belongs to */
    uint32_t reserved[5]; /* zero */
} rlx_op_params;

/* What a backend sees of one node, at planning time (data pointers NULL) and at run time. */
typedef struct rlx_node_view {
    uint32_t op;               /* rlx_op */
    uint32_t n_inputs;
    const rlx_tensor *inputs;  /* n_inputs entries, in the order documented above */
    rlx_tensor *output;
    const rlx_op_params *params;
    const char *name;          /* node name for messages, e.g. "layers.3.attn.q_proj" */
} rlx_node_view;

typedef enum rlx_tensor_role {
    RLX_ROLE_INPUT = 0,
    RLX_ROLE_WEIGHT = 1,
    RLX_ROLE_STATE = 2,
    RLX_ROLE_ACTIVATION = 3
} rlx_tensor_role;

typedef struct rlx_graph rlx_graph;

/* Size in bytes of one element of dtype, 0 for an unknown dtype. */
RLX_API size_t rlx_dtype_size(int dtype);
/* Static name ("f32", "bf16", "f16", "i32"), "?" for an unknown dtype. */
RLX_API const char *rlx_dtype_name(int dtype);
/* Static lower-case op name ("matmul", ...), "?" for an unknown op. */
RLX_API const char *rlx_op_name(int op);
/* Number of elements of t (product of its shape). */
RLX_API int64_t rlx_tensor_numel(const rlx_tensor *t);

/* Creates an empty graph owned by the caller (release with rlx_graph_destroy). */
RLX_API rlx_status rlx_graph_create(rlx_graph **out);
RLX_API void rlx_graph_destroy(rlx_graph *g); /* NULL is a no-op */

/* Declares a tensor bound by the caller at run time (role INPUT or STATE) or, for WEIGHT, bound
 * now to `data`, which the graph borrows: it must outlive every plan made from the graph.
 * Returns the new tensor id (>= 0) or a negative status. The name is copied. */
RLX_API int rlx_graph_add_tensor(rlx_graph *g, rlx_tensor_role role, const char *name, rlx_dtype dtype,
                                 uint32_t n_dims, const int64_t *shape, const void *data);

/* Appends a node computing `op` over the given input tensor ids; the output shape and dtype
 * are inferred. Returns the id of the new ACTIVATION tensor, or a negative status with a
 * message naming the node and the offending input when shapes or dtypes do not fit. */
RLX_API int rlx_graph_add_node(rlx_graph *g, rlx_op op, const char *name, const int *inputs, uint32_t n_inputs,
                               const rlx_op_params *params);

/* Marks tensor id as a graph output: it survives to the end of a run and can be read. */
RLX_API rlx_status rlx_graph_mark_output(rlx_graph *g, int id);

RLX_API uint32_t rlx_graph_n_nodes(const rlx_graph *g);
RLX_API uint32_t rlx_graph_n_tensors(const rlx_graph *g);
/* Tensor id by name, or RLX_E_NOT_FOUND. */
RLX_API int rlx_graph_find_tensor(const rlx_graph *g, const char *name);
/* Borrowed view of tensor id (data is the weight pointer for WEIGHT, NULL otherwise). */
RLX_API const rlx_tensor *rlx_graph_tensor(const rlx_graph *g, int id);
RLX_API const char *rlx_graph_tensor_name(const rlx_graph *g, int id);
RLX_API rlx_tensor_role rlx_graph_tensor_role(const rlx_graph *g, int id);

/* Writes a readable listing of tensors and nodes to f. `annotate`, when not NULL, is called per
 * node to append text (the scheduler uses it to show the backend of each node). */
RLX_API rlx_status rlx_graph_dump(const rlx_graph *g, FILE *f,
                                  const char *(*annotate)(void *ctx, uint32_t node), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
