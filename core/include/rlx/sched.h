/* The scheduler turns a graph into an executable plan: nodes run in graph order (which is a
 * topological order, since nodes only read earlier tensors), activations share one arena by
 * liveness, and each node runs on the first backend of the caller's list that supports it,
 * with the core's reference kernels as the fallback for nodes no backend claims. All backends
 * run on host memory, so no copies are needed between nodes placed on different backends. */
#ifndef RLX_SCHED_H
#define RLX_SCHED_H

#include "rlx/backend.h"
#include "rlx/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rlx_plan rlx_plan;

/* Pins every node of one op to a backend, overriding the preference order (for example the
 * matmuls on oneDNN and the rest on cpu-blas). The backend must support each such node. */
typedef struct rlx_place_rule {
    uint32_t op; /* rlx_op */
    rlx_backend *backend;
} rlx_place_rule;

/* How a plan runs its nodes. */
enum {
    /* Every node by itself through compute(), even on backends that run spans: the per-node
     * results that fused spans are checked against. */
    RLX_PLAN_PER_NODE = 1u << 0,
    /* Checks every F32, BF16 and F16 node output after its node runs (rlx_plan_run_checked on
     * every run): a debugging mode that costs a pass over each output. */
    RLX_PLAN_CHECK_FINITE = 1u << 1,
};

typedef struct rlx_plan_options {
    uint32_t size;                /* sizeof(rlx_plan_options) of the caller */
    uint32_t flags;               /* RLX_PLAN_* */
    rlx_backend *const *backends; /* in order of preference, borrowed: they must outlive the plan */
    size_t n_backends;
    const rlx_place_rule *rules; /* borrowed for the call */
    size_t n_rules;
} rlx_plan_options;

/* Plans g over opts->backends (in order of preference; may be none) with opts->rules and
 * opts->flags; opts NULL is no backend, no rule, no flag. The graph and the backends are
 * borrowed and must outlive the plan. A rule whose backend does not support one of its nodes
 * fails the planning with a message naming the node and backend. */
RLX_API rlx_status rlx_plan_create(const rlx_graph *g, const rlx_plan_options *opts, rlx_plan **out);
RLX_API void rlx_plan_destroy(rlx_plan *p);

/* Backend calls one run makes: the nodes, less those that run inside a span with others. */
RLX_API uint32_t rlx_plan_n_calls(const rlx_plan *p);

/* Bytes of the activation arena after liveness-based reuse, and what the activations would
 * take without reuse. */
RLX_API size_t rlx_plan_peak_bytes(const rlx_plan *p);
RLX_API size_t rlx_plan_total_activation_bytes(const rlx_plan *p);

/* Binds an INPUT or STATE tensor to caller memory (borrowed until rebound or the plan dies). */
RLX_API rlx_status rlx_plan_bind(rlx_plan *p, int tensor_id, void *data);

/* Runs every node. Fails if an input or state is unbound, or a backend fails; the message
 * names the node and the backend. */
RLX_API rlx_status rlx_plan_run(rlx_plan *p);

/* Runs every node by itself through compute(), also those the plan runs in spans (the arena
 * keeps every output of a span until the span would have ended, so running its nodes one by
 * one is safe), and checks each F32, BF16 or F16 output as its node finishes. The first NaN or
 * infinity stops the run with RLX_E_RANGE and a message naming the node, its op, the backend
 * that computed it, and the first bad element and its kind: "node 'layers.2.mlp.down_proj'
 * (matmul on cpu-blas) wrote +Inf at element 7 of its [1, 64] output". Integer outputs are
 * not checked. Only a node's own output is checked, so the node named is the first to turn
 * finite inputs into a non-finite value (or the first to read a non-finite weight or input). */
RLX_API rlx_status rlx_plan_run_checked(rlx_plan *p);

/* Data of a tensor after a run (outputs are kept to the end of the run; other activations
 * may have been overwritten). Valid until the next run or rlx_plan_destroy. */
RLX_API const void *rlx_plan_data(const rlx_plan *p, int tensor_id);

/* Name of the backend that runs node i. */
RLX_API const char *rlx_plan_node_backend(const rlx_plan *p, uint32_t node);
/* How that backend computes node i (rlx_precision), as it declared at planning time. */
RLX_API uint32_t rlx_plan_node_precision(const rlx_plan *p, uint32_t node);

/* Number of places where consecutive nodes run on different backends. Every backend computes
 * on host memory, so a switch needs no copy: the next backend reads the arena directly. */
RLX_API uint32_t rlx_plan_backend_switches(const rlx_plan *p);

/* ---- deprecated, removed in rlx 0.3 ---- */

/* rlx_plan_create. */
RLX_API rlx_status rlx_plan_create_opts(const rlx_graph *g, const rlx_plan_options *opts, rlx_plan **out);
/* rlx_plan_create with these backends and rules. */
RLX_API rlx_status rlx_plan_create_placed(const rlx_graph *g, rlx_backend *const *backends, size_t n_backends,
                                          const rlx_place_rule *rules, size_t n_rules, rlx_plan **out);

#ifdef __cplusplus
}
#endif
#endif
