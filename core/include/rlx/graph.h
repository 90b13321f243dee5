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
 * rlx_dtype, rlx_tensor, rlx_op, rlx_op_params and rlx_node_view are part of the plugin ABI and
 * live in rlx/backend_iface.h (included here): they use fixed-width fields and only grow by
 * appending members. */
#ifndef RLX_GRAPH_H
#define RLX_GRAPH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rlx/backend_iface.h"
#include "rlx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

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
RLX_API int rlx_graph_add_tensor(rlx_graph *g, rlx_tensor_role role, const char *name, rlx_dtype dtype, uint32_t n_dims,
                                 const int64_t *shape, const void *data);

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
RLX_API rlx_status rlx_graph_dump(const rlx_graph *g, FILE *f, const char *(*annotate)(void *ctx, uint32_t node),
                                  void *ctx);

#ifdef __cplusplus
}
#endif
#endif
