/* example: a small rlx backend plugin written against the installed SDK only (<rlx/backend_iface.h>,
 * the header for backend authors: its types and static inline helpers, nothing to link).
 *
 * It computes MATMUL (F32, BF16 or F16 weights, optional bias), ADD, SWIGLU and RMS_NORM with
 * plain portable C on the calling thread, and claims nothing else: the scheduler runs every
 * other node (EMBED, ROPE, ATTENTION, ...) on the reference kernels of librlx. It shows the
 * parts every backend has: the descriptor, the function table, a supports() that checks
 * shapes and dtypes without touching data, and a compute() that reports errors through the
 * host. Correctness over speed: sums are accumulated in double. */
#include <math.h>
#include <stdint.h>

#include <rlx/backend_iface.h>

/* One instance per rlx_backend_create(); the host table outlives it. */
typedef struct example {
    const rlx_host *host;
    uint32_t n_threads; /* asked for; this backend always runs on the calling thread */
} example;

// ---------------------------------------------------------------------------------------------
// Tensors: dense, row-major; activations F32 [rows, cols], weights F32/BF16/F16. Shapes
// (rlx_iface_numel, _rows, _cols) and exact widening (rlx_iface_load_f32) are the header's.

static int example_is_weight_dtype(uint32_t dt) {
    return dt == RLX_DTYPE_F32 || dt == RLX_DTYPE_BF16 || dt == RLX_DTYPE_F16;
}

/* An F32 activation of rows x cols. */
static int example_is_act(const rlx_tensor *t, int64_t rows, int64_t cols) {
    return t->dtype == RLX_DTYPE_F32 && t->n_dims >= 1 && rlx_iface_cols(t) == cols && rlx_iface_rows(t) == rows;
}

// ---------------------------------------------------------------------------------------------
// Which nodes this backend takes. Called at planning time: data pointers are NULL.

static int example_check(const rlx_node_view *n) {
    const rlx_tensor *in = n->inputs, *out = n->output;
    if (!out || out->dtype != RLX_DTYPE_F32 || out->n_dims < 1 || (n->n_inputs && !in))
        return 0;
    const int64_t rows = rlx_iface_rows(out), cols = rlx_iface_cols(out);
    switch (n->op) {
    case RLX_OP_MATMUL: { /* x F32[T,K], w[N,K] (+ bias[N]) -> F32[T,N] */
        if (n->n_inputs != 2 && n->n_inputs != 3)
            return 0;
        const rlx_tensor *x = &in[0], *w = &in[1];
        const int64_t k = rlx_iface_cols(x);
        if (!example_is_act(x, rows, k) || !example_is_weight_dtype(w->dtype) || w->n_dims != 2 ||
            w->shape[0] != cols || w->shape[1] != k)
            return 0;
        return n->n_inputs == 2 || (example_is_weight_dtype(in[2].dtype) && rlx_iface_numel(&in[2]) == cols);
    }
    case RLX_OP_ADD:    /* a, b F32[T,C] -> F32[T,C] */
    case RLX_OP_SWIGLU: /* gate, up F32[T,F] -> F32[T,F] */
        return n->n_inputs == 2 && example_is_act(&in[0], rows, cols) && example_is_act(&in[1], rows, cols);
    case RLX_OP_RMS_NORM: { /* x F32[T,C], w[G], C % G == 0 -> F32[T,C] */
        if (n->n_inputs != 2 || !n->params || !example_is_act(&in[0], rows, cols) ||
            !example_is_weight_dtype(in[1].dtype))
            return 0;
        const int64_t g = rlx_iface_numel(&in[1]);
        return g >= 1 && cols % g == 0;
    }
    default:
        return 0;
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels

static void example_matmul(const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0], *w = &n->inputs[1], *bias = n->n_inputs > 2 ? &n->inputs[2] : NULL;
    const float *xs = x->data;
    float *y = n->output->data;
    const int64_t t_len = rlx_iface_rows(x), k_len = rlx_iface_cols(x), n_out = w->shape[0];
    for (int64_t t = 0; t < t_len; t++)
        for (int64_t o = 0; o < n_out; o++) {
            double acc = bias ? rlx_iface_load_f32(bias->dtype, bias->data, o) : 0.0;
            for (int64_t k = 0; k < k_len; k++)
                acc += (double)xs[t * k_len + k] * rlx_iface_load_f32(w->dtype, w->data, o * k_len + k);
            y[t * n_out + o] = (float)acc;
        }
}

static void example_add(const rlx_node_view *n) {
    const float *a = n->inputs[0].data, *b = n->inputs[1].data;
    float *y = n->output->data;
    for (int64_t i = 0, len = rlx_iface_numel(n->output); i < len; i++)
        y[i] = a[i] + b[i];
}

static void example_swiglu(const rlx_node_view *n) {
    const float *gate = n->inputs[0].data, *up = n->inputs[1].data;
    float *y = n->output->data;
    for (int64_t i = 0, len = rlx_iface_numel(n->output); i < len; i++)
        y[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static void example_rms_norm(const rlx_node_view *n) {
    const rlx_tensor *w = &n->inputs[1];
    const float *x = n->inputs[0].data;
    float *y = n->output->data;
    const int64_t g_len = rlx_iface_numel(w), groups = rlx_iface_numel(n->output) / g_len;
    for (int64_t g = 0; g < groups; g++) {
        const float *in = x + g * g_len;
        double ss = 0;
        for (int64_t j = 0; j < g_len; j++)
            ss += (double)in[j] * in[j];
        const double inv = 1.0 / sqrt(ss / (double)g_len + n->params->eps);
        for (int64_t j = 0; j < g_len; j++)
            y[g * g_len + j] = (float)(in[j] * inv * rlx_iface_load_f32(w->dtype, w->data, j));
    }
}

// ---------------------------------------------------------------------------------------------
// The function table

static int example_open(const rlx_host *host, const rlx_backend_options *opts, void **self) {
    if (opts->extra && *opts->extra)
        return host->error(RLX_E_INVALID, "example: unknown backend options '%s'", opts->extra);
    /* memory the core may free, or that crosses the boundary, comes from host->alloc */
    example *s = host->alloc(sizeof *s, 64);
    if (!s)
        return host->error(RLX_E_NOMEM, "example: out of memory");
    s->host = host;
    s->n_threads = opts->n_threads;
    *self = s;
    host->log(RLX_LOG_DEBUG, "example: opened (naive C kernels, 1 thread)");
    return RLX_OK;
}

static void example_close(void *self) {
    example *s = self;
    s->host->free(s);
}

static int example_supports(void *self, const rlx_node_view *node) {
    (void)self;
    return example_check(node);
}

static int example_compute(void *self, const rlx_node_view *node) {
    example *s = self;
    if (!example_check(node)) /* the core only sends claimed nodes; check anyway, cheaply */
        return s->host->error(RLX_E_UNSUPPORTED, "example: node '%s' is not one this backend claimed", node->name);
    switch (node->op) {
    case RLX_OP_MATMUL:
        example_matmul(node);
        break;
    case RLX_OP_ADD:
        example_add(node);
        break;
    case RLX_OP_SWIGLU:
        example_swiglu(node);
        break;
    default:
        example_rms_norm(node);
        break;
    }
    return RLX_OK;
}

/* Designated initializers: a member appended in a later minor version starts out NULL. */
static const rlx_backend_iface example_iface = {
    .size = sizeof(rlx_backend_iface),
    .open = example_open,
    .close = example_close,
    .supports = example_supports,
    .compute = example_compute,
};

static const rlx_plugin example_desc = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_BACKEND,
    .name = "example",
    .version = "0.1.0",
    .summary = "example out-of-tree backend: naive C matmul, add, swiglu, rms_norm",
    .iface = &example_iface,
};

/* The only exported symbol. Returning NULL (after host->error) would refuse this host. */
RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    if (host->abi_major != RLX_ABI_MAJOR) {
        host->error(RLX_E_ABI, "example: built for ABI %d, host has %u", RLX_ABI_MAJOR, host->abi_major);
        return NULL;
    }
    return &example_desc;
}
