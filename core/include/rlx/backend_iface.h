/* Backends execute graph nodes. A backend plugin returns an rlx_plugin descriptor of kind
 * RLX_PLUGIN_BACKEND whose iface is an rlx_backend_iface.
 *
 * Contracts for backend authors:
 * - open() creates one backend instance; everything it allocates is released by close().
 * - supports() is asked once per node at planning time (tensor data pointers are NULL); it must
 *   not fail, only answer. The scheduler gives a node to the first backend of the caller's list
 *   that supports it, and the core's reference kernels run what no backend claims.
 * - compute() runs one node whose inputs and output are bound to host memory: row-major,
 *   contiguous, aligned to 64 bytes for activations. The scheduler never lets a node's output
 *   share memory with its inputs. It must write the whole output and may not
 *   keep pointers to the tensors after it returns, except to WEIGHT data, which stays valid and
 *   unchanged while the model it belongs to is open. A backend that repacks weights does it in
 *   prepare_weight (1.2), whose handles live exactly as long as the weight, rather than in a
 *   cache keyed by pointer (a closed model's address may be reused by the next).
 * - Calls on one instance come from one thread at a time; a backend may use its own threads
 *   inside a call. Errors are reported by returning a negative status after host->error().
 * - A backend plugin includes only this header (which brings rlx/plugin_iface.h); the helpers
 *   at its end (numel, dtype sizes, F16/BF16 conversion) are static inline, so a backend does
 *   not link librlx.
 * - Members marked "1.2" are optional: the core calls one only when the plugin's descriptor says
 *   abi_minor >= 2 and the table's size covers it, and otherwise uses the documented default.
 * - The core never shows a backend an op newer than the abi_minor its descriptor names: a
 *   plugin built for 1.0 is not asked about CONCAT (1.1), which the reference kernels run, nor
 *   one built before 1.3 about a node with a quantized input, nor one built before 1.4 about
 *   GATHER_ROWS or an ATTENTION with slots (7 inputs) or F16 caches, nor one built before 1.5
 *   about a ROPE with frequency factors (3 inputs), nor one built before 1.6 about SSM_CONV,
 *   GATED_DELTA, SIGMOID_MUL or a partial ROPE (rope_dims set), nor one built before 1.7 about
 *   an SSM_CONV or GATED_DELTA with state_rows set, nor one built before 1.8 about an ATTENTION over
 *   Q8_0 caches. */
#ifndef RLX_BACKEND_IFACE_H
#define RLX_BACKEND_IFACE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rlx/plugin_iface.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rlx_dtype {
    RLX_DTYPE_F32 = 0,
    RLX_DTYPE_BF16 = 1,
    RLX_DTYPE_F16 = 2,
    RLX_DTYPE_I32 = 3,
    /* ABI 1.3: block-quantized weights, with the block layouts of the GGUF format (rlx/quant_iface.h
     * declares them and their dequantization). A tensor of these types is quantized along its
     * innermost dimension, a whole number of blocks per row; only weights have them, and (ABI 1.8)
     * ATTENTION's Q8_0 caches. */
    RLX_DTYPE_Q4_0 = 4, /* 32 values: F16 scale, 16 bytes of 4-bit values */
    RLX_DTYPE_Q4_1 = 5, /* 32 values: F16 scale and minimum, 16 bytes of 4-bit values */
    RLX_DTYPE_Q5_0 = 6, /* 32 values: F16 scale, 4 bytes of 5th bits, 16 bytes of 4-bit values */
    RLX_DTYPE_Q5_1 = 7, /* 32 values: F16 scale and minimum, 5th bits, 4-bit values */
    RLX_DTYPE_Q8_0 = 8, /* 32 values: F16 scale, 32 signed bytes */
    RLX_DTYPE_Q4_K = 9, /* 256 values: 8 sub-blocks with 6-bit scales and minimums */
    RLX_DTYPE_Q5_K = 10,
    RLX_DTYPE_Q6_K = 11, /* 256 values: 16 sub-blocks with 8-bit scales */
    RLX_DTYPE_COUNT
} rlx_dtype;

#define RLX_MAX_DIMS 4

typedef struct rlx_tensor {
    uint32_t dtype;              /* rlx_dtype */
    uint32_t n_dims;             /* 1..RLX_MAX_DIMS */
    int64_t shape[RLX_MAX_DIMS]; /* outermost first; unused entries are 1 */
    void *data;                  /* NULL while planning; bound memory while running */
} rlx_tensor;

/* The ops. Shapes use T = tokens in this run, H = hidden size, D = head_dim.
 *   EMBED       (ids I32[T], table[V,H])                       -> F32[T,H]; ids must be < V
 *   MATMUL      (x F32[T,K], w[N,K] [, bias[N]])                -> F32[T,N]  y = x w^T + b
 *   RMS_NORM    (x F32[T,C], w[G])                              -> F32[T,C]; C % G == 0, each
 *               group of G values is normalised on its own (G == D gives per-head norm)
 *   ROPE        (x F32[T,n*D], pos I32[T] [, factors F32[D/2]])  -> F32[T,n*D]; NeoX rotate-half
 *               over the whole head_dim with base rope_theta: pair i (values i and i + D/2)
 *               turns by pos * rope_theta^(-2i/D), divided by factors[i] when given (ABI 1.5;
 *               llama.cpp's rope_freqs, Llama 3's frequency scaling). ABI 1.6, partial
 *               rotation: with rope_dims set (even, below head_dim) only the first rope_dims
 *               values of each head turn, as a head of rope_dims would (pair i: values i and
 *               i + rope_dims/2, by pos * rope_theta^(-2i/rope_dims), factors F32[rope_dims/2]);
 *               the rest pass unchanged. 0 or head_dim turns the whole head.
 *   ATTENTION   (q F32[T,Hq*D], k F32[T,Hkv*D], v F32[T,Hkv*D], pos I32[T],
 *                k_cache [C,Hkv*D], v_cache [C,Hkv*D])           -> F32[T,Hq*D]
 *               writes row t of k and v into cache row pos[t], then lets query t attend to
 *               cache rows j <= pos[t] (and pos[t] - j < window when window > 0), GQA with
 *               Hq/Hkv queries per KV head, softmax scaled by `scale`. Every row is written
 *               before any query reads. pos[t] outside [0, C) is RLX_E_RANGE.
 *               ABI 1.4, slots: the caches may be [S,C,Hkv*D], S sequences of C positions, and
 *               a 7th input seq I32[T] is then required: row t belongs to slot seq[t] in [0, S)
 *               (else RLX_E_RANGE), writes slot seq[t] row pos[t] and attends to rows of its own
 *               slot only. Within one call the rows of a slot must have strictly increasing
 *               positions, in row order (else RLX_E_INVALID): no two rows write one cache row,
 *               and a batch is a slot's next rows, decode or a prompt chunk, as an engine
 *               sends them. 2-D caches (one sequence) take no 7th input and any positions
 *               that are distinct.
 *               ABI 1.4, F16 caches: k_cache and v_cache (always of one dtype and shape) may be
 *               F16; a row is stored rounded to nearest even (rlx_iface_f32_to_f16, inf past
 *               65504) and read back widened exactly, so a query sees the stored values.
 *               ABI 1.8, Q8_0 caches: k_cache and v_cache may be Q8_0 when head_dim is a
 *               multiple of 32 (each head's slice of a row is whole blocks); a row is stored
 *               as rlx_iface_quant_q8_0 quantizes it (rlx/quant_iface.h) and read back as
 *               d * q, so a query sees the stored values.
 *               A backend claiming the slot form computes it batch-invariantly: a row's output
 *               is the same bits whatever else the call holds and however many threads run
 *               it (the conformance kit checks this); the in-tree backends do so for every form.
 *   SWIGLU      (gate F32[T,F], up F32[T,F])                    -> F32[T,F]  silu(gate) * up
 *   ADD         (a F32[T,C], b F32[T,C])                        -> F32[T,C]
 *   GATHER_LAST (x F32[T,C])                                    -> F32[1,C]  row T-1
 *   MOE         (x F32[T,H], router[E,H], then for each expert e: gate_e[F,H], up_e[F,H],
 *                down_e[H,F])                                   -> F32[T,H]
 *               softmax over router logits, top_k experts per token (renormalised to sum 1
 *               when norm_topk_prob), output = sum_k p_k * down_e(silu(gate_e x) * up_e x)
 *   CONCAT      (a F32[T,A], b F32[T,B])                        -> F32[T,A+B]  rows side by side
 *               (ABI 1.1; backends built for 1.0 do not claim it and the reference kernel runs it)
 *   GATHER_ROWS (x F32[T,C], idx I32[R])                        -> F32[R,C]  row r = x row idx[r]
 *               (ABI 1.4); idx[r] outside [0, T) is RLX_E_RANGE; an index may repeat
 *   SIGMOID_MUL (x F32[T,C], g F32[T,C])                        -> F32[T,C]  x * sigmoid(g) (ABI 1.6;
 *               an attention output gate)
 *   SSM_CONV    (x F32[T,C], w[C,K], pos I32[T], state F32[K-1,C] [, seq I32[T]])
 *                                                               -> F32[T,C]  (ABI 1.6)
 *               causal depthwise convolution with SiLU, carrying its last K-1 inputs as state:
 *               y[t,c] = silu(sum_j w[c,j] * u[p-K+1+j, c]) over the sequence u of the inputs of
 *               row t's sequence, where p = pos[t]; u at positions below 0 is zero, u[p] is row
 *               t's x. Inputs of positions before the call's first row of a sequence come from
 *               the state (state row i holds u[p0-K+1+i] for that first row's position p0), so
 *               a row at position 0 reads no state. After the call the state holds the last
 *               K-1 inputs of every sequence that had rows. Slots: the state may be
 *               [S,K-1,C] with a 5th input seq I32[T] naming each row's slot in [0, S) (else
 *               RLX_E_RANGE); a 2-D state is one sequence. The rows of one sequence must have
 *               consecutive positions in row order (else RLX_E_INVALID): a sequence advances
 *               one position per row. Rows of different slots are independent (batch invariant
 *               as ATTENTION's slot form).
 *   GATED_DELTA (qkv F32[T,2*Hk*Dk+Hv*Dv], a F32[T,Hv], b F32[T,Hv], A[Hv], dt_bias[Hv],
 *                pos I32[T], state F32[Hv,Dk,Dv] [, seq I32[T]])
 *                                                               -> F32[T,Hv*Dv]  (ABI 1.6)
 *               the gated delta rule (Gated DeltaNet linear attention), Hv = n_heads, Hk =
 *               n_kv_heads (Hv % Hk == 0; value head h reads key head h / (Hv/Hk), or h % Hk with
 *               kv_tiled, llama.cpp's order of value heads), Dk =
 *               head_dim, Dv = head_dim_v. Row t of qkv holds q (Hk heads of Dk), then k (Hk
 *               heads of Dk), then v (Hv heads of Dv): the SSM_CONV output, as the checkpoints
 *               project them in one matrix. Per row t and value head h, with the head's state
 *               S (Dk x Dv, row-major, zero when pos[t] is 0, else the sequence's state):
 *                   q' = scale * q_h / sqrt(|q_h|^2 + eps),   k' = k_h / sqrt(|k_h|^2 + eps)
 *                   g = exp(A[h] * softplus(a[t,h] + dt_bias[h])),   beta = sigmoid(b[t,h])
 *                   S = g S;   S = S + k' (beta (v_h - S^T k'))^T;   out_h = S^T q'
 *               (softplus(x) = log(1 + e^x); A <= 0 makes g a decay in (0, 1]). The state
 *               holds S after the sequence's last row. Slots, positions and batch invariance
 *               as SSM_CONV. A kernel may run a long run of one sequence's rows in the
 *               chunk-parallel form (matrix products over chunks of rows) and a short one row
 *               by row: both compute the rule above, differing only in F32 rounding. In the slot
 *               form a row's result must not depend on how its sequence's rows were split into
 *               calls either (an engine splits a prompt by its load): one form for every run.
 *   State rows (ABI 1.7), for SSM_CONV and GATED_DELTA: with params.state_rows = 1 the node
 *               takes one more input, after all the others: rows F32[T, K-1, C] (SSM_CONV) or
 *               F32[T, Hv, Dk, Dv] (GATED_DELTA). Row t of it receives the state of row t's
 *               sequence as it is after row t, i.e. what the state would hold had the call
 *               ended there. A caller that may cut a sequence back inside the call (rejected
 *               speculative tokens) restores the state from them instead of running the kept
 *               rows again. Such a call runs GATED_DELTA row by row (the recurrent form, whose
 *               state exists after every row), so its outputs and final state are those of
 *               the call without state rows whenever that call also runs row by row (the slot
 *               form, or fewer rows than the chunk-parallel form is worth).
 * Weights (table, w, router, expert matrices) may be F32, BF16 or F16; bias and norm weights
 * likewise. From ABI 1.3 the table, w and the expert matrices may also be block-quantized
 * (RLX_DTYPE_Q*, rlx/quant_iface.h), K a whole number of blocks. */
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
    RLX_OP_CONCAT = 10,
    RLX_OP_GATHER_ROWS = 11, /* ABI 1.4 */
    RLX_OP_SIGMOID_MUL = 12, /* ABI 1.6 */
    RLX_OP_SSM_CONV = 13,    /* ABI 1.6 */
    RLX_OP_GATED_DELTA = 14, /* ABI 1.6 */
    RLX_OP_COUNT
} rlx_op;

typedef struct rlx_op_params {
    float eps;            /* RMS_NORM; GATED_DELTA: the q and k L2 norms' */
    float rope_theta;     /* ROPE */
    float scale;          /* ATTENTION: softmax scale, usually 1/sqrt(D); GATED_DELTA: q's */
    uint32_t head_dim;    /* ROPE, ATTENTION; GATED_DELTA: Dk */
    uint32_t n_heads;     /* ATTENTION: query heads; GATED_DELTA: value heads */
    uint32_t n_kv_heads;  /* ATTENTION; GATED_DELTA: key heads */
    uint32_t window;      /* ATTENTION: sliding window in positions, 0 = none */
    uint32_t n_experts;   /* MOE */
    uint32_t top_k;       /* MOE */
    uint32_t norm_topk;   /* MOE: 1 = renormalise the top-k probabilities */
    uint32_t layer;       /* informational: model layer the node belongs to */
    uint32_t head_dim_v;  /* GATED_DELTA: Dv (ABI 1.6) */
    uint32_t rope_dims;   /* ROPE: values of a head that turn, 0 = all (ABI 1.6) */
    uint32_t kv_tiled;    /* GATED_DELTA: value head h reads key head h % Hk, not h / (Hv/Hk) (ABI 1.6) */
    uint32_t state_rows;  /* SSM_CONV, GATED_DELTA: 1 = a last input receives each row's state (ABI 1.7) */
    uint32_t reserved[1]; /* zero */
} rlx_op_params;

/* What a backend sees of one node, at planning time (data pointers NULL) and at run time. */
typedef struct rlx_node_view {
    uint32_t op; /* rlx_op */
    uint32_t n_inputs;
    const rlx_tensor *inputs; /* n_inputs entries, in the order documented above */
    rlx_tensor *output;
    const rlx_op_params *params;
    const char *name; /* node name for messages, e.g. "layers.3.attn.q_proj" */
    /* Version 1.2: read these only when host->abi_minor >= 2 (an older core does not set them). */
    void *const *prepared;    /* per input: the handle prepare_weight returned for this use of a
                                * weight, or NULL (not a weight, declined, or run outside a plan) */
    const int32_t *input_ids; /* per input: the plan's id of the tensor (equal ids, same tensor),
                                * or NULL outside a plan */
    int32_t output_id;        /* the plan's id of the output, -1 outside a plan */
} rlx_node_view;

/* How a weight offered to prepare_weight is stored. */
enum {
    /* A mapping of a model file: its pages can be dropped (madvise MADV_DONTNEED) once the
     * backend has its own copy, and are read back from the file if touched again. */
    RLX_WEIGHT_FILE_BACKED = 1u << 0,
    /* Mapped read-only: writing to it faults. */
    RLX_WEIGHT_READ_ONLY = 1u << 1,
};

/* One use of a weight: the tensor as `input` of nodes of op `op` (a tied embedding is one
 * tensor with two uses, EMBED's table and the output MATMUL's w, and may be prepared twice). */
typedef struct rlx_weight_info {
    uint32_t size;             /* sizeof(rlx_weight_info) of the core */
    uint32_t flags;            /* RLX_WEIGHT_* */
    const rlx_tensor *tensor;  /* dtype, shape and data, valid and unchanged until release_weight */
    const char *name;          /* the tensor's name, for messages */
    uint32_t op;               /* rlx_op reading it */
    uint32_t input;            /* its input index in that op */
    const rlx_node_view *node; /* the first node reading it, as planned (data pointers NULL): its
                                * shapes, for a layout that depends on them (rows of a matmul) */
} rlx_weight_info;

/* Consecutive nodes of a plan that one backend runs. */
typedef struct rlx_span {
    uint32_t size;              /* sizeof(rlx_span) of the core */
    uint32_t n_nodes;           /* at least 1 */
    const rlx_node_view *nodes; /* in execution order; an input of one may be an output of an
                                  * earlier one (compare input_ids with output_id) */
    /* Per node: the index, counted from nodes[0], of the last node of the whole plan that reads
     * its output, or UINT32_MAX when the graph returns it. A span of n nodes must write node i's
     * output when last_use[i] >= n; an output only the span itself reads may stay in the
     * backend's own memory, unwritten. */
    const uint32_t *last_use;
} rlx_span;

typedef struct rlx_backend_options {
    uint32_t size;      /* sizeof(rlx_backend_options) of the core */
    uint32_t n_threads; /* threads the backend may use; 0 = its own default */
    const char *extra;  /* free-form "key=value,key=value" backend options, may be NULL */
} rlx_backend_options;

/* How a backend computes a node: what its error against exact arithmetic is bounded by. Tests
 * (the conformance kit, the golden checks) take their tolerances from it. */
typedef enum rlx_precision {
    /* F32 arithmetic on weights widened exactly from their stored dtype: only the rounding of
     * F32 sums (about 1e-6 relative) separates the result from exact arithmetic. */
    RLX_PRECISION_F32 = 0,
    /* MATMUL inputs (the activations x) rounded to BF16, nearest even, then multiplied by the
     * (BF16) weights exactly and summed in F32: |y - exact| <= 2^-8 * sum_k |x_k w_k| plus the
     * F32 summation error. On MOE: the experts' matmul inputs likewise, the router exact. */
    RLX_PRECISION_BF16_ACT = 1,
    /* ABI 1.3, on nodes with block-quantized weights: the MATMUL inputs x quantized to int8 in
     * blocks of the weight's block length (32 or 256 values, scale d = max|x| / 127 of the block,
     * round to nearest; d may be stored as F16, as llama.cpp does), each block's integer dot
     * product exact, block results scaled and summed in F32. Each x_k moves by at most half a
     * step plus 127 times the F16 rounding of d, 0.57 d, so |y - exact| <= sum over blocks of
     * 0.57 d sum_k |w_k| (w dequantized exactly), plus, for weights with a block minimum m (Q4_1,
     * Q5_1), 2^-10 |m| sum_k |x_k| (the F16 rounding of the block's sum of x), plus the F32
     * summation error. On MOE: the experts' inputs likewise, the router exact. */
    RLX_PRECISION_Q8_ACT = 2,
    RLX_PRECISION_COUNT
} rlx_precision;

typedef struct rlx_backend_iface {
    uint32_t size; /* sizeof(rlx_backend_iface) the plugin was built with */
    uint32_t reserved;
    /* Version 1.0 */
    int (*open)(const rlx_host *host, const rlx_backend_options *opts, void **self); /* required */
    void (*close)(void *self);                                                       /* required */
    int (*supports)(void *self, const rlx_node_view *node);                          /* required: 1 yes, 0 no */
    int (*compute)(void *self, const rlx_node_view *node);                           /* required */
    /* Version 1.2 */
    /* How the backend computes `node` (rlx_precision), asked at planning time after supports()
     * said yes (data pointers NULL). Optional; default RLX_PRECISION_F32. */
    uint32_t (*precision)(void *self, const rlx_node_view *node);
    /* One line saying what this instance runs on, for `rlx plugins -v` and benchmark records:
     * kernel ISA, library cores, threads ("avx2 kernels, OpenBLAS core Zen, 2 threads").
     * Borrowed until close(). Optional; default "". */
    const char *(*describe)(void *self);
    /* Prepares one use of a weight, once per model and backend instance, at planning time after
     * supports() claimed a node reading it: the backend may repack the data into its own layout
     * (and, for a FILE_BACKED weight, drop the mapped pages) and answers with its own handle in
     * *handle, or NULL to be given the tensor as it is. Every node reading that use then gets
     * the handle in node->prepared. The core calls release_weight(handle) exactly once for
     * every non-NULL handle: when the model closes, or before close() of the backend, whichever
     * comes first. Optional, but prepare_weight and release_weight come together. */
    int (*prepare_weight)(void *self, const rlx_weight_info *weight, void **handle);
    void (*release_weight)(void *self, void *handle);
    /* Spans, for backends that fuse neighbours or keep intermediates in their own memory.
     * At planning time the core offers each run of consecutive nodes the backend claimed, and
     * plan_span answers how many of them, from the first, it runs as one call (*n_taken, 1 to
     * run->n_nodes) and its own plan for them in *span (may be NULL); the core offers the rest
     * of the run again. Validation belongs here: compute_span runs a span with bound data
     * (the same nodes, shapes and params, new data pointers) and may trust what plan_span saw.
     * release_span frees a plan when the core's plan is destroyed. With these members every
     * node the backend claims runs through compute_span, never compute(), except when the
     * caller asks a plan for per-node execution (RLX_PLAN_PER_NODE), which compute() must then
     * match. Optional, but the three come together. */
    int (*plan_span)(void *self, const rlx_span *run, uint32_t *n_taken, void **span);
    int (*compute_span)(void *self, void *span, const rlx_span *nodes);
    void (*release_span)(void *self, void *span);
} rlx_backend_iface;

/* ---- helpers for backend authors (static inline: nothing to link) ---- */

/* Number of elements of t: the product of its n_dims dimensions. */
static inline int64_t rlx_iface_numel(const rlx_tensor *t) {
    int64_t n = 1;
    for (uint32_t i = 0; i < t->n_dims; i++)
        n *= t->shape[i];
    return n;
}

/* SSM_CONV's or GATED_DELTA's state rows (ABI 1.7): the data of its last input when
 * params.state_rows is set, else NULL. */
static inline float *rlx_iface_state_rows(const rlx_node_view *n) {
    return n->params && n->params->state_rows ? (float *)n->inputs[n->n_inputs - 1].data : NULL;
}

/* The innermost dimension of t (n_dims >= 1): the row length of a row-major tensor. */
static inline int64_t rlx_iface_cols(const rlx_tensor *t) { return t->shape[t->n_dims - 1]; }

/* Rows of t: the product of every dimension but the innermost (1 for a vector). */
static inline int64_t rlx_iface_rows(const rlx_tensor *t) {
    int64_t r = 1;
    for (uint32_t i = 0; i + 1 < t->n_dims; i++)
        r *= t->shape[i];
    return r;
}

/* Bytes of one element of dtype (rlx_dtype); 0 for an unknown dtype. */
static inline size_t rlx_iface_dtype_size(uint32_t dtype) {
    switch (dtype) {
    case RLX_DTYPE_F32:
    case RLX_DTYPE_I32:
        return 4;
    case RLX_DTYPE_BF16:
    case RLX_DTYPE_F16:
        return 2;
    default:
        return 0;
    }
}

/* Values per block of dtype: 32 or 256 for the quantized types, 1 for the others; 0 for an
 * unknown dtype. */
static inline int64_t rlx_iface_dtype_block(uint32_t dtype) {
    switch (dtype) {
    case RLX_DTYPE_F32:
    case RLX_DTYPE_I32:
    case RLX_DTYPE_BF16:
    case RLX_DTYPE_F16:
        return 1;
    case RLX_DTYPE_Q4_0:
    case RLX_DTYPE_Q4_1:
    case RLX_DTYPE_Q5_0:
    case RLX_DTYPE_Q5_1:
    case RLX_DTYPE_Q8_0:
        return 32;
    case RLX_DTYPE_Q4_K:
    case RLX_DTYPE_Q5_K:
    case RLX_DTYPE_Q6_K:
        return 256;
    default:
        return 0;
    }
}

/* Bytes of one block of dtype (of one element for the unquantized types); 0 when unknown. */
static inline size_t rlx_iface_dtype_block_bytes(uint32_t dtype) {
    switch (dtype) {
    case RLX_DTYPE_Q4_0:
        return 18;
    case RLX_DTYPE_Q4_1:
        return 20;
    case RLX_DTYPE_Q5_0:
        return 22;
    case RLX_DTYPE_Q5_1:
        return 24;
    case RLX_DTYPE_Q8_0:
        return 34;
    case RLX_DTYPE_Q4_K:
        return 144;
    case RLX_DTYPE_Q5_K:
        return 176;
    case RLX_DTYPE_Q6_K:
        return 210;
    default:
        return rlx_iface_dtype_size(dtype);
    }
}

/* True for the block-quantized dtypes (ABI 1.3). */
static inline int rlx_iface_dtype_is_quantized(uint32_t dtype) { return rlx_iface_dtype_block(dtype) > 1; }

/* Bytes of n consecutive values of dtype: 0 when the dtype is unknown or n is not a whole number
 * of its blocks. */
static inline size_t rlx_iface_row_bytes(uint32_t dtype, int64_t n) {
    const int64_t block = rlx_iface_dtype_block(dtype);
    if (block <= 0 || n < 0 || n % block != 0)
        return 0;
    return (size_t)(n / block) * rlx_iface_dtype_block_bytes(dtype);
}

/* Bytes of a row-major tensor: its rows times the bytes of one row (0 as rlx_iface_row_bytes). */
static inline size_t rlx_iface_tensor_bytes(const rlx_tensor *t) {
    return (size_t)rlx_iface_rows(t) * rlx_iface_row_bytes(t->dtype, rlx_iface_cols(t));
}

/* BF16 bits widened to F32: exact (BF16 is the upper half of an F32), NaN payloads kept. */
static inline float rlx_iface_bf16_to_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* F32 to BF16 bits, rounded to nearest with ties to even (as BF16 hardware does; a value past
 * the largest BF16 becomes infinity). A NaN stays a NaN: its upper half with the quiet bit
 * set, since rounding could otherwise carry a NaN's payload into infinity. */
static inline uint16_t rlx_iface_f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (f != f)
        return (uint16_t)((bits >> 16) | 0x40u);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* F16 (IEEE binary16) bits widened to F32: exact for every value, subnormals included; an
 * infinity stays infinite and a NaN keeps its payload. */
static inline float rlx_iface_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent == 0) {
        const float f = (float)mantissa * (1.0f / 16777216.0f); /* zero or subnormal, times 2^-24: exact */
        return sign ? -f : f;
    } else {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* F32 to F16 bits, rounded to nearest with ties to even, as a hardware conversion (F16C,
 * NumPy's float16) does: values past the largest F16 (65504) round to infinity, tiny ones to
 * subnormals or zero (keeping the sign), and a NaN stays a quiet NaN with the upper bits of its
 * payload. */
static inline uint16_t rlx_iface_f32_to_f16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) /* at or past 65520, halfway above 65504: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (magnitude < 0x38800000u) {   /* below 2^-14: an F16 subnormal (or zero) */
        if (magnitude < 0x33000000u) /* at most 2^-25, half the smallest subnormal: zero */
            return sign;
        /* the significand with its implicit bit, shifted to units of 2^-24, rounded to even */
        const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
        const unsigned shift = 126u - (magnitude >> 23); /* 14 for 2^-14, up to 24 */
        const uint32_t half = 1u << (shift - 1), rest = significand & ((1u << shift) - 1);
        uint32_t v = significand >> shift;
        if (rest > half || (rest == half && (v & 1u)))
            v++;
        return (uint16_t)(sign | v); /* v may carry into the smallest normal: still right */
    }
    /* normal: rebias the exponent, round the 13 dropped bits to even (a carry may reach inf) */
    const uint32_t v = magnitude - 0x38000000u;
    return (uint16_t)(sign | ((v + 0xfffu + ((v >> 13) & 1u)) >> 13));
}

/* Element i of an array of dtype (F32, BF16 or F16) widened to F32, as weights are read. */
static inline float rlx_iface_load_f32(uint32_t dtype, const void *data, int64_t i) {
    switch (dtype) {
    case RLX_DTYPE_BF16:
        return rlx_iface_bf16_to_f32(((const uint16_t *)data)[i]);
    case RLX_DTYPE_F16:
        return rlx_iface_f16_to_f32(((const uint16_t *)data)[i]);
    default:
        return ((const float *)data)[i];
    }
}

#ifdef __cplusplus
}
#endif
#endif
