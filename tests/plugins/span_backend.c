/* A backend built for ABI 1.2 that uses both optional lifecycles: it prepares weights (F32
 * copies of MATMUL and RMS_NORM weights, whatever their stored dtype) and runs spans, fusing
 *   - an RMS_NORM with the MATMULs right after it that read its output (the q/k/v or gate/up
 *     projections of a block): each normalised row is made once, in the backend's own buffer,
 *     and written to the arena only when a node after the span reads it;
 *   - two MATMULs over one input followed by the SWIGLU of their outputs: gate and up rows are
 *     combined as they are made and written out only when read after the span.
 * Its ops are RMS_NORM, MATMUL, SWIGLU and ADD; per node and in a span it sums in the same
 * order, so fused results equal per-node ones bit for bit. rlx_test_span_stats() reports its
 * calls, for tests that check the core's side of the contract. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/backend_iface.h"

typedef struct span_stats {
    int prepared, released, live_handles;
    int spans_planned, spans_released, fused_spans, compute_span_calls, compute_calls;
    int bad_calls; /* calls that broke the contract: a handle not prepared, a span after release */
} span_stats;

/* Instances on several threads count into one set (the stress test checks the totals). */
static span_stats stats;
#define COUNT(field, d) __atomic_add_fetch(&stats.field, (d), __ATOMIC_RELAXED)

RLX_PLUGIN_EXPORT void rlx_test_span_stats(span_stats *out) {
    int *to = (int *)out;
    for (size_t i = 0; i < sizeof stats / sizeof(int); i++)
        to[i] = __atomic_load_n((int *)&stats + i, __ATOMIC_RELAXED);
}

typedef struct weight_copy {
    uint32_t magic;
    int64_t n;
    float data[];
} weight_copy;

#define WEIGHT_MAGIC 0x5eed1234u
#define SPAN_MAGIC 0x5ba71234u

enum { KIND_SINGLE, KIND_NORM_MATMULS, KIND_GATE_UP_SWIGLU };

typedef struct span_plan {
    uint32_t magic;
    int kind;
    int64_t width; /* row width of the span's input */
    float *row;    /* one row of the normalised input, or of gate outputs */
} span_plan;

typedef struct backend {
    const rlx_host *host;
} backend;

static int span_open(const rlx_host *host, const rlx_backend_options *opts, void **self) {
    (void)opts;
    backend *b = host->alloc(sizeof *b, 16);
    if (!b)
        return host->error(RLX_E_NOMEM, "span: out of memory");
    b->host = host;
    *self = b;
    return RLX_OK;
}

static void span_close(void *self) {
    backend *b = self;
    b->host->free(b);
}

static int f32_rows(const rlx_tensor *t) { return t->dtype == RLX_DTYPE_F32; }

static int span_supports(void *self, const rlx_node_view *n) {
    (void)self;
    switch (n->op) {
    case RLX_OP_ADD:
    case RLX_OP_SWIGLU:
        return f32_rows(&n->inputs[0]) && f32_rows(&n->inputs[1]);
    case RLX_OP_RMS_NORM:
        return f32_rows(&n->inputs[0]);
    case RLX_OP_MATMUL:
        return f32_rows(&n->inputs[0]) && n->inputs[1].n_dims == 2;
    default:
        return 0;
    }
}

static int span_prepare_weight(void *self, const rlx_weight_info *w, void **handle) {
    backend *b = self;
    *handle = NULL;
    /* the node it comes with reads it, as planned: the same shape, no data yet */
    if (!w->node || w->node->op != w->op || w->input >= w->node->n_inputs || w->node->inputs[w->input].data ||
        memcmp(w->node->inputs[w->input].shape, w->tensor->shape, sizeof w->tensor->shape) != 0)
        COUNT(bad_calls, 1);
    const int wanted =
        (w->op == RLX_OP_MATMUL && (w->input == 1 || w->input == 2)) || (w->op == RLX_OP_RMS_NORM && w->input == 1);
    if (!wanted)
        return RLX_OK;
    const int64_t n = rlx_iface_numel(w->tensor);
    weight_copy *c = b->host->alloc(sizeof *c + (size_t)n * sizeof(float), 64);
    if (!c)
        return b->host->error(RLX_E_NOMEM, "span: no memory for a copy of '%s'", w->name);
    c->magic = WEIGHT_MAGIC;
    c->n = n;
    for (int64_t i = 0; i < n; i++)
        c->data[i] = rlx_iface_load_f32(w->tensor->dtype, w->tensor->data, i);
    COUNT(prepared, 1);
    COUNT(live_handles, 1);
    *handle = c;
    return RLX_OK;
}

static void span_release_weight(void *self, void *handle) {
    backend *b = self;
    weight_copy *c = handle;
    if (c->magic != WEIGHT_MAGIC) {
        COUNT(bad_calls, 1);
        return;
    }
    c->magic = 0;
    COUNT(released, 1);
    COUNT(live_handles, -1);
    b->host->free(c);
}

/* Input k of node n as F32: its prepared copy when there is one, else converted into tmp. */
static const float *weight_f32(const rlx_node_view *n, uint32_t k, float *tmp) {
    const weight_copy *c = n->prepared ? n->prepared[k] : NULL;
    if (c) {
        if (c->magic != WEIGHT_MAGIC || c->n != rlx_iface_numel(&n->inputs[k]))
            COUNT(bad_calls, 1);
        return c->data;
    }
    const int64_t count = rlx_iface_numel(&n->inputs[k]);
    for (int64_t i = 0; i < count; i++)
        tmp[i] = rlx_iface_load_f32(n->inputs[k].dtype, n->inputs[k].data, i);
    return tmp;
}

static float dot(const float *x, const float *w, int64_t k) {
    float s = 0;
    for (int64_t i = 0; i < k; i++)
        s += x[i] * w[i];
    return s;
}

static void norm_row(const float *x, const float *w, int64_t cols, int64_t group, float eps, float *out) {
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
        float ss = 0;
        for (int64_t j = 0; j < group; j++)
            ss += x[g0 + j] * x[g0 + j];
        const float r = 1.0f / sqrtf(ss / (float)group + eps);
        for (int64_t j = 0; j < group; j++)
            out[g0 + j] = x[g0 + j] * r * w[j];
    }
}

/* Row t of a MATMUL: y[0..N) = x w^T + bias. */
static void matmul_row(const float *x, const float *w, const float *bias, int64_t n_out, int64_t k, float *y) {
    for (int64_t j = 0; j < n_out; j++)
        y[j] = dot(x, w + j * k, k) + (bias ? bias[j] : 0.0f);
}

static float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Scratch for weights a node gets unprepared (outside a plan): as large as its largest. */
static float *scratch_for(backend *b, const rlx_node_view *n) {
    int64_t most = 1;
    for (uint32_t k = 1; k < n->n_inputs; k++)
        if (rlx_iface_numel(&n->inputs[k]) > most)
            most = rlx_iface_numel(&n->inputs[k]);
    return b->host->alloc((size_t)most * sizeof(float), 64);
}

static int run_node(backend *b, const rlx_node_view *n) {
    float *out = n->output->data;
    const float *x = n->inputs[0].data;
    const int64_t rows = rlx_iface_rows(n->output), cols = rlx_iface_cols(n->output);
    if (n->op == RLX_OP_ADD || n->op == RLX_OP_SWIGLU) {
        const float *y = n->inputs[1].data;
        for (int64_t i = 0; i < rows * cols; i++)
            out[i] = n->op == RLX_OP_ADD ? x[i] + y[i] : silu_mul(x[i], y[i]);
        return RLX_OK;
    }
    float *tmp = scratch_for(b, n), *tmp_bias = NULL;
    if (!tmp)
        return b->host->error(RLX_E_NOMEM, "span: out of memory");
    if (n->op == RLX_OP_RMS_NORM) {
        const float *w = weight_f32(n, 1, tmp);
        for (int64_t t = 0; t < rows; t++)
            norm_row(x + t * cols, w, cols, rlx_iface_numel(&n->inputs[1]), n->params->eps, out + t * cols);
    } else {
        const int64_t k = rlx_iface_cols(&n->inputs[0]);
        const float *w = weight_f32(n, 1, tmp), *bias = NULL;
        if (n->n_inputs > 2) {
            if (!(tmp_bias = b->host->alloc((size_t)cols * sizeof(float), 64))) {
                b->host->free(tmp);
                return b->host->error(RLX_E_NOMEM, "span: out of memory");
            }
            bias = weight_f32(n, 2, tmp_bias);
        }
        for (int64_t t = 0; t < rows; t++)
            matmul_row(x + t * k, w, bias, cols, k, out + t * cols);
    }
    b->host->free(tmp);
    b->host->free(tmp_bias);
    return RLX_OK;
}

static int span_compute(void *self, const rlx_node_view *n) {
    COUNT(compute_calls, 1);
    return run_node(self, n);
}

/* Whether every weight input of the n nodes has a prepared copy (a fused span reads no other). */
static int all_prepared(const rlx_node_view *nd, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 1; k < nd[i].n_inputs; k++)
            if (nd[i].op != RLX_OP_SWIGLU && (!nd[i].prepared || !nd[i].prepared[k]))
                return 0;
    return 1;
}

static int reads(const rlx_node_view *n, uint32_t input, const rlx_node_view *producer) {
    return n->input_ids && input < n->n_inputs && n->input_ids[input] == producer->output_id;
}

static int span_plan_span(void *self, const rlx_span *run, uint32_t *n_taken, void **out) {
    backend *b = self;
    const rlx_node_view *nd = run->nodes;
    int kind = KIND_SINGLE;
    uint32_t n = 1;
    if (nd[0].op == RLX_OP_RMS_NORM) {
        while (n < run->n_nodes && nd[n].op == RLX_OP_MATMUL && reads(&nd[n], 0, &nd[0]))
            n++;
        kind = n > 1 ? KIND_NORM_MATMULS : KIND_SINGLE;
    } else if (run->n_nodes >= 3 && nd[0].op == RLX_OP_MATMUL && nd[1].op == RLX_OP_MATMUL &&
               nd[2].op == RLX_OP_SWIGLU && nd[0].input_ids[0] == nd[1].input_ids[0] && reads(&nd[2], 0, &nd[0]) &&
               reads(&nd[2], 1, &nd[1])) {
        kind = KIND_GATE_UP_SWIGLU;
        n = 3;
    }
    if (kind != KIND_SINGLE && !all_prepared(nd, n)) {
        kind = KIND_SINGLE;
        n = 1;
    }
    *n_taken = n;
    *out = NULL;
    if (kind == KIND_SINGLE)
        return RLX_OK;
    span_plan *p = b->host->alloc(sizeof *p, 16);
    const int64_t width = rlx_iface_cols(nd[0].output); /* the normalised row, or the gate row */
    float *row = b->host->alloc((size_t)width * sizeof(float), 64);
    if (!p || !row) {
        b->host->free(p);
        b->host->free(row);
        return b->host->error(RLX_E_NOMEM, "span: out of memory");
    }
    *p = (span_plan){.magic = SPAN_MAGIC, .kind = kind, .width = width, .row = row};
    COUNT(spans_planned, 1);
    *out = p;
    return RLX_OK;
}

static void span_release_span(void *self, void *span) {
    backend *b = self;
    span_plan *p = span;
    if (p->magic != SPAN_MAGIC) {
        COUNT(bad_calls, 1);
        return;
    }
    p->magic = 0;
    COUNT(spans_released, 1);
    b->host->free(p->row);
    b->host->free(p);
}

static int span_compute_span(void *self, void *span, const rlx_span *s) {
    span_plan *p = span;
    COUNT(compute_span_calls, 1);
    if (!p)
        return run_node(self, &s->nodes[0]); /* a span of one node */
    if (p->magic != SPAN_MAGIC)
        return COUNT(bad_calls, 1), RLX_E_INTERNAL;
    COUNT(fused_spans, 1);
    const rlx_node_view *nd = s->nodes;
    const int64_t rows = rlx_iface_rows(nd[0].output);
    if (p->kind == KIND_NORM_MATMULS) {
        const int64_t cols = p->width, group = rlx_iface_numel(&nd[0].inputs[1]);
        const float *x = nd[0].inputs[0].data, *w = weight_f32(&nd[0], 1, NULL);
        const int keep_norm = s->last_use[0] >= s->n_nodes;
        for (int64_t t = 0; t < rows; t++) {
            float *row = keep_norm ? (float *)nd[0].output->data + t * cols : p->row;
            norm_row(x + t * cols, w, cols, group, nd[0].params->eps, row);
            for (uint32_t j = 1; j < s->n_nodes; j++) {
                const int64_t n_out = rlx_iface_cols(nd[j].output);
                const float *bias = nd[j].n_inputs > 2 ? weight_f32(&nd[j], 2, NULL) : NULL;
                matmul_row(row, weight_f32(&nd[j], 1, NULL), bias, n_out, cols,
                           (float *)nd[j].output->data + t * n_out);
            }
        }
        return RLX_OK;
    }
    /* gate, up, swiglu */
    const int64_t k = rlx_iface_cols(&nd[0].inputs[0]), f = p->width;
    const float *x = nd[0].inputs[0].data;
    const float *wg = weight_f32(&nd[0], 1, NULL), *wu = weight_f32(&nd[1], 1, NULL);
    const float *bg = nd[0].n_inputs > 2 ? weight_f32(&nd[0], 2, NULL) : NULL;
    const float *bu = nd[1].n_inputs > 2 ? weight_f32(&nd[1], 2, NULL) : NULL;
    const int keep_gate = s->last_use[0] >= 3, keep_up = s->last_use[1] >= 3;
    for (int64_t t = 0; t < rows; t++) {
        float *gate = keep_gate ? (float *)nd[0].output->data + t * f : p->row;
        float *out = (float *)nd[2].output->data + t * f;
        matmul_row(x + t * k, wg, bg, f, k, gate);
        for (int64_t j = 0; j < f; j++) {
            const float u = dot(x + t * k, wu + j * k, k) + (bu ? bu[j] : 0.0f);
            if (keep_up)
                ((float *)nd[1].output->data)[t * f + j] = u;
            out[j] = silu_mul(gate[j], u);
        }
    }
    return RLX_OK;
}

static const rlx_backend_iface iface = {
    .size = sizeof(rlx_backend_iface),
    .open = span_open,
    .close = span_close,
    .supports = span_supports,
    .compute = span_compute,
    .prepare_weight = span_prepare_weight,
    .release_weight = span_release_weight,
    .plan_span = span_plan_span,
    .compute_span = span_compute_span,
    .release_span = span_release_span,
};

static const rlx_plugin desc = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    /* written for 1.2: it must never be offered what 1.3 added (quantized weights), which its
     * supports() does not know to refuse */
    .abi_minor = 2,
    .kind = RLX_PLUGIN_BACKEND,
    .name = "span",
    .version = "1.2.0",
    .summary = "test backend: prepared weights and fused spans (ABI 1.2)",
    .iface = &iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    (void)host;
    return &desc;
}
