/* Private layout of rlx_graph, shared by the graph builder and the scheduler. */
#ifndef RLX_GRAPH_IMPL_H
#define RLX_GRAPH_IMPL_H

#include "rlx/graph.h"

typedef struct rlx__tensor_info {
    rlx_tensor t;
    rlx_tensor_role role;
    char *name;
    int producer; /* node index defining it, -1 for non-activations */
    int is_output;
    int in_memory; /* a weight held in a buffer, not a page of a model file: no weight_flags */
} rlx__tensor_info;

typedef struct rlx__node {
    uint32_t op;
    char *name;
    int *inputs;
    uint32_t n_inputs;
    rlx_op_params params;
    int output;
} rlx__node;

struct rlx_graph {
    rlx__tensor_info *tensors;
    uint32_t n_tensors, cap_tensors;
    rlx__node *nodes;
    uint32_t n_nodes, cap_nodes;
    /* whose weights these are (backends keep what they prepared for them until the owner
     * goes); 0 for a hand-built graph, whose plan is the owner */
    uint64_t weight_owner;
    uint32_t weight_flags; /* RLX_WEIGHT_* of every weight of the graph */
};

/* Declares that g's weights belong to owner (rlx__weight_owner_new) and are stored as flags
 * say. */
void rlx__graph_set_weights(rlx_graph *g, uint64_t owner, uint32_t flags);
/* Marks weight id as held in memory of its own (computed, or rewritten when the model was read):
 * backends are offered it without the graph's RLX_WEIGHT_* flags, so none drops its "pages". */
void rlx__graph_weight_in_memory(rlx_graph *g, int id);

/* Bytes of tensor data (numel * dtype size). */
size_t rlx__tensor_nbytes(const rlx_tensor *t);

#endif
