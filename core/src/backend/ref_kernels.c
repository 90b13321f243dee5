/* The reference backend: the plainest correct C for every op. It runs nodes no backend claims
 * and is the oracle the backends are tested against, so it favours clarity over speed and
 * accumulates in double where a sum is long. With the option act=bf16 an instance rounds every
 * matmul input to BF16 first (MATMUL, and MOE experts; the router stays exact): the emulation
 * of backends that declare RLX_PRECISION_BF16_ACT, against which they are checked tightly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "rlx/quant_iface.h"
#include "util/alloc.h"

float rlx__load(const void *data, uint32_t dtype, size_t i) {
    switch (dtype) {
    case RLX_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, (const char *)data + 2 * i, 2);
        return rlx_iface_bf16_to_f32(h);
    }
    case RLX_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, (const char *)data + 2 * i, 2);
        return rlx_iface_f16_to_f32(h);
    }
    case RLX_DTYPE_Q8_0: { /* a KV cache's: d * q, as rlx_iface_dequant_q8_0 */
        const rlx_block_q8_0 *b = (const rlx_block_q8_0 *)data + i / RLX_QK;
        return (float)b->qs[i % RLX_QK] * rlx_iface_f16_to_f32(b->d);
    }
    default: {
        float f;
        memcpy(&f, (const char *)data + 4 * i, 4);
        return f;
    }
    }
}

/* f as BF16 holds it (rlx_iface_f32_to_bf16: nearest even, NaN stays a quiet NaN). */
static float round_bf16(float f) { return rlx_iface_bf16_to_f32(rlx_iface_f32_to_bf16(f)); }

/* The n inputs of a matmul as it reads them: x itself, or with act_bf16 dst holding x rounded
 * to BF16 (dst may be x). */
static const float *matmul_inputs(const float *x, float *dst, int64_t n, int act_bf16) {
    if (!act_bf16)
        return x;
    for (int64_t i = 0; i < n; i++)
        dst[i] = round_bf16(x[i]);
    return dst;
}

typedef struct ref_backend {
    int act_bf16; /* round matmul inputs to BF16 */
} ref_backend;

static float *f32(const rlx_tensor *t) { return (float *)t->data; }
static const int32_t *i32(const rlx_tensor *t) { return (const int32_t *)t->data; }

static int ref_embed(const rlx_node_view *n) {
    const rlx_tensor *ids = &n->inputs[0], *table = &n->inputs[1];
    int64_t t_len = ids->shape[0], vocab = table->shape[0], h = table->shape[1];
    const size_t row_bytes = rlx_iface_row_bytes(table->dtype, h);
    for (int64_t t = 0; t < t_len; t++) {
        int32_t id = i32(ids)[t];
        if (id < 0 || id >= vocab)
            return rlx_error(RLX_E_RANGE, "token id %d at position %lld is outside the vocabulary [0, %lld)", id,
                             (long long)t, (long long)vocab);
        rlx_iface_dequant_row(table->dtype, (const char *)table->data + (size_t)id * row_bytes, f32(n->output) + t * h,
                              h);
    }
    return RLX_OK;
}

/* y[t, o] = sum_k x[t, k] * w[o, k] (+ bias[o]), w widened (or dequantized) row by row into a
 * scratch row of k_len floats. */
static int matvec_rows(const float *x, const rlx_tensor *w, const rlx_tensor *bias, float *y, int64_t rows,
                       int64_t k_len, int64_t n_out) {
    float *row = rlx__malloc((size_t)(k_len > 0 ? k_len : 1) * sizeof *row);
    if (!row)
        return rlx_error(RLX_E_NOMEM, "matmul: out of memory");
    const size_t row_bytes = rlx_iface_row_bytes(w->dtype, k_len);
    for (int64_t o = 0; o < n_out; o++) {
        rlx_iface_dequant_row(w->dtype, (const char *)w->data + (size_t)o * row_bytes, row, k_len);
        for (int64_t t = 0; t < rows; t++) {
            double acc = bias ? rlx__load(bias->data, bias->dtype, (size_t)o) : 0.0;
            for (int64_t k = 0; k < k_len; k++)
                acc += (double)x[t * k_len + k] * row[k];
            y[t * n_out + o] = (float)acc;
        }
    }
    free(row);
    return RLX_OK;
}

static int ref_matmul(const rlx_node_view *n, int act_bf16) {
    const rlx_tensor *x = &n->inputs[0], *w = &n->inputs[1];
    const float *in = f32(x);
    float *rounded = NULL;
    if (act_bf16) {
        const int64_t len = rlx_tensor_numel(x);
        if (!(rounded = rlx__malloc((size_t)(len > 0 ? len : 1) * sizeof *rounded)))
            return rlx_error(RLX_E_NOMEM, "matmul: out of memory");
        in = matmul_inputs(in, rounded, len, 1);
    }
    int rc = matvec_rows(in, w, n->n_inputs > 2 ? &n->inputs[2] : NULL, f32(n->output), x->shape[0], x->shape[1],
                         w->shape[0]);
    free(rounded);
    return rc;
}

static int ref_rms_norm(const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0], *w = &n->inputs[1];
    int64_t groups = rlx_tensor_numel(x) / w->shape[0], g_len = w->shape[0];
    for (int64_t g = 0; g < groups; g++) {
        const float *in = f32(x) + g * g_len;
        float *out = f32(n->output) + g * g_len;
        double ss = 0;
        for (int64_t j = 0; j < g_len; j++)
            ss += (double)in[j] * in[j];
        double inv = 1.0 / sqrt(ss / (double)g_len + n->params->eps);
        for (int64_t j = 0; j < g_len; j++)
            out[j] = (float)(in[j] * inv * rlx__load(w->data, w->dtype, (size_t)j));
    }
    return RLX_OK;
}

/* Partial rotation (1.6): the first `turn` values of each head rotate as a head of that size
 * would, the rest are copied. */
static int ref_rope(const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0];
    const int64_t t_len = x->shape[0], cols = x->shape[1], d = n->params->head_dim;
    const int64_t turn = n->params->rope_dims ? n->params->rope_dims : d, half = turn / 2;
    const float *factors = n->n_inputs > 2 ? f32(&n->inputs[2]) : NULL;
    for (int64_t t = 0; t < t_len; t++) {
        double pos = i32(&n->inputs[1])[t];
        for (int64_t h = 0; h < cols / d; h++) {
            const float *in = f32(x) + t * cols + h * d;
            float *out = f32(n->output) + t * cols + h * d;
            memcpy(out + turn, in + turn, (size_t)(d - turn) * sizeof *out);
            for (int64_t i = 0; i < half; i++) {
                double angle = pos * pow((double)n->params->rope_theta, -2.0 * (double)i / (double)turn);
                if (factors)
                    angle /= (double)factors[i];
                double c = cos(angle), s = sin(angle), x1 = in[i], x2 = in[i + half];
                out[i] = (float)(x1 * c - x2 * s);
                out[i + half] = (float)(x2 * c + x1 * s);
            }
        }
    }
    return RLX_OK;
}

/* ATTENTION's rows as a node passes them (slots and F16 caches from ABI 1.4): every seq and pos
 * in range, and the rows of each slot at strictly increasing positions, checked before any
 * cache row is written so that a rejected call changes nothing. */
static int ref_attention_rows(const rlx_node_view *n, int64_t slots, int64_t cap) {
    const int32_t *pos = i32(&n->inputs[3]), *seq = n->n_inputs > 6 ? i32(&n->inputs[6]) : NULL;
    const int64_t t_len = n->inputs[0].shape[0];
    int32_t *last = rlx__malloc((size_t)slots * sizeof *last);
    if (!last)
        return rlx_error(RLX_E_NOMEM, "attention: out of memory");
    for (int64_t s = 0; s < slots; s++)
        last[s] = -1;
    int rc = RLX_OK;
    for (int64_t t = 0; t < t_len && rc == RLX_OK; t++) {
        const int32_t slot = seq ? seq[t] : 0, at = pos[t];
        if (slot < 0 || slot >= slots)
            rc = rlx_error(RLX_E_RANGE, "node '%s' (attention): row %lld: slot %d is outside the cache's %lld slots",
                           n->name ? n->name : "?", (long long)t, slot, (long long)slots);
        else if (at < 0 || at >= cap)
            rc = rlx_error(RLX_E_RANGE,
                           "node '%s' (attention): row %lld: position %d is outside the KV cache of %lld positions",
                           n->name ? n->name : "?", (long long)t, at, (long long)cap);
        else if (at <= last[slot])
            rc = rlx_error(RLX_E_INVALID,
                           "node '%s' (attention): row %lld: position %d of slot %d does not follow position %d of an "
                           "earlier row (a slot's rows take strictly increasing positions)",
                           n->name ? n->name : "?", (long long)t, at, slot, last[slot]);
        else
            last[slot] = at;
    }
    free(last);
    return rc;
}

/* Stores src[n] into cache row dst of dtype F32, F16 (rounded to nearest even) or Q8_0
 * (rlx_iface_quant_q8_0, n a whole number of blocks). */
static void ref_cache_store(void *cache, uint32_t dtype, int64_t row, const float *src, int64_t n) {
    if (dtype == RLX_DTYPE_Q8_0) {
        rlx_block_q8_0 *dst = (rlx_block_q8_0 *)cache + row * (n / RLX_QK);
        for (int64_t b = 0; b < n / RLX_QK; b++)
            rlx_iface_quant_q8_0(src + b * RLX_QK, dst + b);
    } else if (dtype == RLX_DTYPE_F16) {
        uint16_t *dst = (uint16_t *)cache + row * n;
        for (int64_t i = 0; i < n; i++)
            dst[i] = rlx_iface_f32_to_f16(src[i]);
    } else {
        memcpy((float *)cache + row * n, src, (size_t)n * sizeof(float));
    }
}

static int ref_attention(const rlx_node_view *n) {
    const rlx_op_params *p = n->params;
    const rlx_tensor *q = &n->inputs[0], *k = &n->inputs[1], *v = &n->inputs[2], *pos = &n->inputs[3];
    const rlx_tensor *kc = &n->inputs[4], *vc = &n->inputs[5];
    const int32_t *seq = n->n_inputs > 6 ? i32(&n->inputs[6]) : NULL;
    const int64_t t_len = q->shape[0], d = p->head_dim, kv_cols = (int64_t)p->n_kv_heads * d;
    const int64_t slots = kc->n_dims == 3 ? kc->shape[0] : 1, cap = kc->shape[kc->n_dims - 2];
    const int64_t group = p->n_heads / p->n_kv_heads;
    int rc = ref_attention_rows(n, slots, cap);
    if (rc != RLX_OK)
        return rc;
    for (int64_t t = 0; t < t_len; t++) {
        const int64_t row = (seq ? seq[t] : 0) * cap + i32(pos)[t];
        ref_cache_store(kc->data, kc->dtype, row, f32(k) + t * kv_cols, kv_cols);
        ref_cache_store(vc->data, vc->dtype, row, f32(v) + t * kv_cols, kv_cols);
    }
    double *scores = rlx__malloc((size_t)cap * sizeof *scores);
    if (!scores)
        return rlx_error(RLX_E_NOMEM, "attention: out of memory");
    for (int64_t t = 0; t < t_len; t++) {
        int64_t at = i32(pos)[t], first = p->window && at + 1 > p->window ? at + 1 - p->window : 0;
        const size_t base = (size_t)((seq ? seq[t] : 0) * cap * kv_cols); /* the row's slot */
        for (int64_t h = 0; h < p->n_heads; h++) {
            const float *qh = f32(q) + t * p->n_heads * d + h * d;
            int64_t kvh = h / group;
            double max = -INFINITY, sum = 0;
            for (int64_t j = first; j <= at; j++) {
                const size_t kj = base + (size_t)(j * kv_cols + kvh * d);
                double dot = 0;
                for (int64_t i = 0; i < d; i++)
                    dot += (double)qh[i] * rlx__load(kc->data, kc->dtype, kj + (size_t)i);
                scores[j] = dot * p->scale;
                if (scores[j] > max)
                    max = scores[j];
            }
            for (int64_t j = first; j <= at; j++) {
                scores[j] = exp(scores[j] - max);
                sum += scores[j];
            }
            float *out = f32(n->output) + t * p->n_heads * d + h * d;
            for (int64_t i = 0; i < d; i++) {
                double acc = 0;
                for (int64_t j = first; j <= at; j++)
                    acc += scores[j] * rlx__load(vc->data, vc->dtype, base + (size_t)(j * kv_cols + kvh * d + i));
                out[i] = (float)(acc / sum);
            }
        }
    }
    free(scores);
    return RLX_OK;
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

static int ref_swiglu(const rlx_node_view *n) {
    int64_t len = rlx_tensor_numel(n->output);
    for (int64_t i = 0; i < len; i++)
        f32(n->output)[i] = silu(f32(&n->inputs[0])[i]) * f32(&n->inputs[1])[i];
    return RLX_OK;
}

static int ref_add(const rlx_node_view *n) {
    int64_t len = rlx_tensor_numel(n->output);
    for (int64_t i = 0; i < len; i++)
        f32(n->output)[i] = f32(&n->inputs[0])[i] + f32(&n->inputs[1])[i];
    return RLX_OK;
}

static int ref_sigmoid_mul(const rlx_node_view *n) {
    const int64_t len = rlx_tensor_numel(n->output);
    for (int64_t i = 0; i < len; i++)
        f32(n->output)[i] = f32(&n->inputs[0])[i] / (1.0f + expf(-f32(&n->inputs[1])[i]));
    return RLX_OK;
}

static int ref_gather_last(const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0];
    memcpy(n->output->data, f32(x) + (x->shape[0] - 1) * x->shape[1], (size_t)x->shape[1] * sizeof(float));
    return RLX_OK;
}

static int ref_gather_rows(const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0], *idx = &n->inputs[1];
    const int64_t rows = x->shape[0], cols = x->shape[1];
    for (int64_t r = 0; r < idx->shape[0]; r++) {
        const int32_t at = i32(idx)[r];
        if (at < 0 || at >= rows)
            return rlx_error(RLX_E_RANGE, "node '%s' (gather_rows): index %lld is %d, outside the %lld rows of x",
                             n->name ? n->name : "?", (long long)r, at, (long long)rows);
        memcpy(f32(n->output) + r * cols, f32(x) + at * cols, (size_t)cols * sizeof(float));
    }
    return RLX_OK;
}

static int ref_concat(const rlx_node_view *n) {
    const rlx_tensor *a = &n->inputs[0], *b = &n->inputs[1];
    int64_t rows = a->shape[0], a_cols = a->shape[1], b_cols = b->shape[1], out_cols = a_cols + b_cols;
    for (int64_t t = 0; t < rows; t++) {
        memcpy(f32(n->output) + t * out_cols, f32(a) + t * a_cols, (size_t)a_cols * sizeof(float));
        memcpy(f32(n->output) + t * out_cols + a_cols, f32(b) + t * b_cols, (size_t)b_cols * sizeof(float));
    }
    return RLX_OK;
}

static int ref_moe(const rlx_node_view *n, int act_bf16) {
    const rlx_op_params *p = n->params;
    const rlx_tensor *x = &n->inputs[0];
    int64_t t_len = x->shape[0], h = x->shape[1], f = n->inputs[2].shape[0], e_len = p->n_experts;
    float *logits = rlx__malloc((size_t)e_len * sizeof *logits), *gate = rlx__malloc((size_t)f * 2 * sizeof *gate),
          *down = rlx__malloc((size_t)h * sizeof *down), *xr = rlx__malloc((size_t)h * sizeof *xr);
    int64_t *chosen = rlx__malloc(p->top_k * sizeof *chosen);
    double *prob = rlx__malloc(p->top_k * sizeof *prob);
    if (!logits || !gate || !down || !xr || !chosen || !prob) {
        free(logits), free(gate), free(down), free(xr), free(chosen), free(prob);
        return rlx_error(RLX_E_NOMEM, "moe: out of memory");
    }
    float *up = gate + f;
    for (int64_t t = 0; t < t_len; t++) {
        const float *xt = f32(x) + t * h;
        int rc = matvec_rows(xt, &n->inputs[1], NULL, logits, 1, h, e_len);
        double max = -INFINITY, sum = 0;
        for (int64_t e = 0; e < e_len; e++)
            max = logits[e] > max ? logits[e] : max;
        for (int64_t e = 0; e < e_len; e++)
            sum += exp(logits[e] - max);
        /* top-k by repeated selection; ties go to the lower expert index, as torch.topk does */
        double picked_sum = 0;
        for (uint32_t k = 0; k < p->top_k; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < e_len; e++) {
                int taken = 0;
                for (uint32_t j = 0; j < k; j++)
                    taken |= chosen[j] == e;
                if (!taken && (best < 0 || logits[e] > logits[best]))
                    best = e;
            }
            chosen[k] = best;
            prob[k] = exp(logits[best] - max) / sum;
            picked_sum += prob[k];
        }
        float *out = f32(n->output) + t * h;
        memset(out, 0, (size_t)h * sizeof *out);
        const float *x_in = matmul_inputs(xt, xr, h, act_bf16);
        for (uint32_t k = 0; k < p->top_k; k++) {
            const rlx_tensor *w = &n->inputs[2 + 3 * chosen[k]];
            double weight = p->norm_topk ? prob[k] / picked_sum : prob[k];
            if (rc == RLX_OK)
                rc = matvec_rows(x_in, &w[0], NULL, gate, 1, h, f);
            if (rc == RLX_OK)
                rc = matvec_rows(x_in, &w[1], NULL, up, 1, h, f);
            for (int64_t i = 0; i < f; i++)
                gate[i] = silu(gate[i]) * up[i];
            if (rc == RLX_OK)
                rc = matvec_rows(matmul_inputs(gate, gate, f, act_bf16), &w[2], NULL, down, 1, f, h);
            if (rc != RLX_OK) {
                free(logits), free(gate), free(down), free(xr), free(chosen), free(prob);
                return rc;
            }
            for (int64_t i = 0; i < h; i++)
                out[i] += (float)(weight * down[i]);
        }
    }
    free(logits), free(gate), free(down), free(xr), free(chosen), free(prob);
    return RLX_OK;
}

/* Options: act=bf16|f32 (default f32). */
static int ref_open(const rlx_host *host, const rlx_backend_options *opts, void **self) {
    *self = NULL;
    ref_backend *r = rlx__calloc(1, sizeof *r);
    if (!r)
        return rlx_error(RLX_E_NOMEM, "ref: out of memory");
    const char *extra = opts && RLX_HAS(rlx_backend_options, opts, extra) ? opts->extra : NULL;
    for (const char *item = extra; item && *item;) {
        const size_t len = strcspn(item, ",");
        if (len == 8 && !strncmp(item, "act=bf16", len)) {
            r->act_bf16 = 1;
        } else if (len == 7 && !strncmp(item, "act=f32", len)) {
            r->act_bf16 = 0;
        } else if (len > 0) {
            free(r);
            return rlx_error(RLX_E_INVALID, "ref: unknown option '%.*s' (the reference kernels take act=bf16|f32)",
                             (int)len, item);
        }
        item += len + (item[len] == ',');
    }
    *self = r;
    return RLX_OK;
}

static void ref_close(void *self) { free(self); }

static uint32_t ref_precision(void *self, const rlx_node_view *node) {
    const ref_backend *r = self;
    return r->act_bf16 && (node->op == RLX_OP_MATMUL || node->op == RLX_OP_MOE) ? RLX_PRECISION_BF16_ACT
                                                                                : RLX_PRECISION_F32;
}

static const char *ref_describe(void *self) {
    return ((const ref_backend *)self)->act_bf16 ? "portable C, double sums, matmul inputs rounded to BF16"
                                                 : "portable C, double sums";
}

static int ref_supports(void *self, const rlx_node_view *node) { return node->op > 0 && node->op < RLX_OP_COUNT; }

static int ref_compute(void *self, const rlx_node_view *n) {
    const ref_backend *r = self;
    switch (n->op) {
    case RLX_OP_EMBED:
        return ref_embed(n);
    case RLX_OP_MATMUL:
        return ref_matmul(n, r->act_bf16);
    case RLX_OP_RMS_NORM:
        return ref_rms_norm(n);
    case RLX_OP_ROPE:
        return ref_rope(n);
    case RLX_OP_ATTENTION:
        return ref_attention(n);
    case RLX_OP_SWIGLU:
        return ref_swiglu(n);
    case RLX_OP_ADD:
        return ref_add(n);
    case RLX_OP_GATHER_LAST:
        return ref_gather_last(n);
    case RLX_OP_MOE:
        return ref_moe(n, r->act_bf16);
    case RLX_OP_CONCAT:
        return ref_concat(n);
    case RLX_OP_GATHER_ROWS:
        return ref_gather_rows(n);
    case RLX_OP_SIGMOID_MUL:
        return ref_sigmoid_mul(n);
    case RLX_OP_SSM_CONV:
        return rlx__ref_ssm_conv(n);
    case RLX_OP_GATED_DELTA:
        return rlx__ref_gated_delta(n);
    default:
        return rlx_error(RLX_E_UNSUPPORTED, "op %u", n->op);
    }
}

const rlx_backend_iface rlx__ref_backend_iface = {
    .size = sizeof(rlx_backend_iface),
    .open = ref_open,
    .close = ref_close,
    .supports = ref_supports,
    .compute = ref_compute,
    .precision = ref_precision,
    .describe = ref_describe,
};
