/* Row ops of the kernel library: EMBED, RMS_NORM, ROPE (and its cos/sin table), SWIGLU, ADD,
 * GATHER_LAST, GATHER_ROWS and BF16 rounding, each row (or range of elements) independent of the others, so
 * any split across threads gives the same bits. */
#include <math.h>
#include <string.h>

#include "kern.h"
#include "rlx/quant_iface.h"

/* The ROPE cos/sin table, a row job of its own beside the rlx_op ones. */
#define KERN_ROPE_TABLE 0

typedef struct kern_rows_job {
    const kern_simd *k;
    int op;         /* rlx_op, or KERN_ROPE_TABLE */
    int64_t cols;   /* values per row */
    const float *a; /* x, gate or first addend */
    const float *b; /* up, second addend, F32 norm weight or ROPE table */
    float *y;
    const void *table;                /* EMBED: [V, cols] of dtype dt */
    const kern_qrp_weight *table_qrp; /* or its repacked copy */
    int dt;
    const int32_t *idx; /* EMBED ids, ROPE positions */
    const double *inv_freq;
    int64_t g;    /* RMS_NORM group size; ROPE rope_dims / 2 */
    int64_t head; /* ROPE: values per head (2 g unless only the first rope_dims of each turn) */
    float eps;
} kern_rows_job;

/* EMBED rows [r0, r1) of a repacked table: each row's blocks put back in their native bytes,
 * one at a time, then dequantized as the native rows are (the same values). */
static void kern_embed_qrp(const kern_qrp_weight *w, const int32_t *idx, int64_t r0, int64_t r1, float *y) {
    const uint32_t dt = (uint32_t)w->dt;
    const int64_t bs = rlx_iface_dtype_block(dt), nb = w->K / bs, whole = w->N / KERN_QRP_ROWS * KERN_QRP_ROWS;
    const size_t row_bytes = rlx_iface_row_bytes(dt, w->K);
    uint8_t blk[256]; /* a native block: at most 210 bytes (Q6_K) */
    for (int64_t r = r0; r < r1; r++) {
        float *out = y + r * w->K;
        if (idx[r] >= whole) { /* the native tail rows */
            rlx_iface_dequant_row(dt, (const char *)w->data + (size_t)idx[r] * row_bytes, out, w->K);
            continue;
        }
        for (int64_t b = 0; b < nb; b++) {
            kern_qrp_unpack(w->dt, w->data, w->K, idx[r], b, blk);
            rlx_iface_dequant_row(dt, blk, out + b * bs, bs);
        }
    }
}

/* Rows [r0, r1), or elements for SWIGLU and ADD. */
static void kern_rows_range(void *ctx, int ith, int64_t r0, int64_t r1) {
    const kern_rows_job *j = ctx;
    const kern_simd *k = j->k;
    (void)ith;
    switch (j->op) {
    case RLX_OP_EMBED: {
        const size_t row_bytes = rlx_iface_row_bytes((uint32_t)j->dt, j->cols);
        if (j->table_qrp) {
            kern_embed_qrp(j->table_qrp, j->idx, r0, r1, j->y);
            break;
        }
        for (int64_t r = r0; r < r1; r++) {
            const char *row = (const char *)j->table + (size_t)j->idx[r] * row_bytes;
            if (rlx_iface_dtype_is_quantized((uint32_t)j->dt)) /* the reference dequantizer: llama.cpp's bits */
                rlx_iface_dequant_row((uint32_t)j->dt, row, j->y + r * j->cols, j->cols);
            else
                k->widen(j->dt, row, j->y + r * j->cols, j->cols);
        }
        break;
    }
    case RLX_OP_RMS_NORM:
        for (int64_t r = r0; r < r1; r++)
            k->rms_norm(j->a + r * j->cols, j->b, j->y + r * j->cols, j->cols, j->g, j->eps);
        break;
    case RLX_OP_ROPE:
        for (int64_t r = r0; r < r1; r++) {
            const float *x = j->a + r * j->cols, *cs = j->b + r * 2 * j->g;
            float *y = j->y + r * j->cols;
            if (j->head == 2 * j->g) {
                k->rope(x, cs, y, j->cols / j->head, j->g);
                continue;
            }
            for (int64_t h = 0; h < j->cols; h += j->head) { /* partial: the rest of the head passes */
                k->rope(x + h, cs, y + h, 1, j->g);
                if (y != x)
                    memcpy(y + h + 2 * j->g, x + h + 2 * j->g, (size_t)(j->head - 2 * j->g) * sizeof *y);
            }
        }
        break;
    case RLX_OP_SWIGLU:
        k->swiglu(j->a + r0, j->b + r0, j->y + r0, r1 - r0);
        break;
    case RLX_OP_ADD:
        k->add(j->a + r0, j->b + r0, j->y + r0, r1 - r0);
        break;
    default: /* ROPE table: angles in F64, as the core's reference and the NumPy goldens */
        for (int64_t r = r0; r < r1; r++) {
            float *cs = j->y + r * 2 * j->g;
            for (int64_t i = 0; i < j->g; i++) {
                double sn, cn;
                sincos((double)j->idx[r] * j->inv_freq[i], &sn, &cn);
                cs[i] = (float)cn;
                cs[j->g + i] = (float)sn;
            }
        }
        break;
    }
}

/* Runs j over n rows (elements for SWIGLU and ADD) of work_per_row multiply-adds each. */
static void kern_rows_run(kern_ctx *c, kern_rows_job *j, int64_t n, int64_t work_per_row) {
    j->k = c->k;
    const bool flat = j->op == RLX_OP_SWIGLU || j->op == RLX_OP_ADD;
    c->par.parallel_for(c->par.self, n, flat ? KERN_ROW_ALIGN : 1, n * work_per_row, kern_rows_range, j);
}

void kern_embed(kern_ctx *c, const void *table, int dt, int64_t cols, const int32_t *ids, int64_t T, float *y) {
    kern_rows_job j = {.op = RLX_OP_EMBED, .cols = cols, .y = y, .table = table, .dt = dt, .idx = ids};
    kern_rows_run(c, &j, T, cols);
}

void kern_rms_norm(kern_ctx *c, const float *x, const float *w, float *y, int64_t rows, int64_t cols, int64_t g,
                   float eps) {
    kern_rows_job j = {.op = RLX_OP_RMS_NORM, .cols = cols, .a = x, .b = w, .y = y, .g = g, .eps = eps};
    kern_rows_run(c, &j, rows, 2 * cols);
}

/* Makes c->rope_cs hold the cos/sin rows for these positions, head_dim, theta and factors. */
static int kern_rope_table(kern_ctx *c, const int32_t *pos, const float *factors, int64_t T, uint32_t D, float theta) {
    const int64_t half = D / 2;
    if (c->rope_t == T && c->rope_d == D && c->rope_theta == theta &&
        !memcmp(c->rope_pos.p, pos, (size_t)T * sizeof *pos) && c->rope_has_ff == (factors != NULL) &&
        (!factors || !memcmp(c->rope_ff.p, factors, (size_t)half * sizeof *factors)))
        return RLX_OK;
    int rc;
    c->rope_t = -1;
    if ((rc = kern_reserve(c, &c->rope_cs, (size_t)(T * D) * sizeof(float) + (size_t)half * sizeof(double))) < 0 ||
        (rc = kern_reserve(c, &c->rope_pos, (size_t)T * sizeof *pos)) < 0 ||
        (factors && (rc = kern_reserve(c, &c->rope_ff, (size_t)half * sizeof *factors)) < 0))
        return rc;
    double *inv = (double *)((float *)c->rope_cs.p + T * D); /* D even: 8-byte aligned */
    for (int64_t i = 0; i < half; i++)
        inv[i] = pow((double)theta, -2.0 * (double)i / (double)D) / (factors ? (double)factors[i] : 1.0);
    kern_rows_job j = {.op = KERN_ROPE_TABLE, .y = c->rope_cs.p, .idx = pos, .inv_freq = inv, .g = half};
    kern_rows_run(c, &j, T, 16 * half);
    memcpy(c->rope_pos.p, pos, (size_t)T * sizeof *pos);
    if (factors)
        memcpy(c->rope_ff.p, factors, (size_t)half * sizeof *factors);
    c->rope_has_ff = factors != NULL;
    c->rope_t = T;
    c->rope_d = D;
    c->rope_theta = theta;
    return RLX_OK;
}

int kern_rope(kern_ctx *c, const float *x, const int32_t *pos, const float *factors, float *y, int64_t T, int64_t cols,
              uint32_t head_dim, uint32_t rope_dims, float theta) {
    if (T == 0)
        return RLX_OK;
    const uint32_t turn = rope_dims ? rope_dims : head_dim;
    const int rc = kern_rope_table(c, pos, factors, T, turn, theta);
    if (rc < 0)
        return rc;
    kern_rows_job j = {
        .op = RLX_OP_ROPE, .cols = cols, .a = x, .b = c->rope_cs.p, .y = y, .g = turn / 2, .head = head_dim};
    kern_rows_run(c, &j, T, cols);
    return RLX_OK;
}

void kern_swiglu(kern_ctx *c, const float *g, const float *u, float *y, int64_t n) {
    kern_rows_job j = {.op = RLX_OP_SWIGLU, .a = g, .b = u, .y = y};
    kern_rows_run(c, &j, n, 8);
}

void kern_add(kern_ctx *c, const float *a, const float *b, float *y, int64_t n) {
    kern_rows_job j = {.op = RLX_OP_ADD, .a = a, .b = b, .y = y};
    kern_rows_run(c, &j, n, 1);
}

typedef struct kern_bf16_job {
    const kern_simd *k;
    const float *x;
    uint16_t *xb;
    int64_t cols;
} kern_bf16_job;

static void kern_bf16_range(void *ctx, int ith, int64_t r0, int64_t r1) {
    const kern_bf16_job *j = ctx;
    (void)ith;
    j->k->to_bf16(j->x + r0 * j->cols, j->xb + r0 * j->cols, (r1 - r0) * j->cols);
}

void kern_to_bf16(kern_ctx *c, const float *x, uint16_t *xb, int64_t rows, int64_t cols) {
    kern_bf16_job j = {.k = c->k, .x = x, .xb = xb, .cols = cols};
    c->par.parallel_for(c->par.self, rows, 1, rows * cols, kern_bf16_range, &j);
}

// ---------------------------------------------------------------------------------------------
// Node form

static int kern_op_embed(kern_ctx *c, const rlx_node_view *n) {
    const rlx_tensor *ids = &n->inputs[0], *tab = &n->inputs[1];
    const int32_t *id = ids->data;
    const int64_t T = rlx_iface_numel(ids), V = tab->shape[0];
    for (int64_t t = 0; t < T; t++)
        if (id[t] < 0 || id[t] >= V)
            return c->host->error(RLX_E_RANGE, "%s: node '%s': token id %d at %lld outside [0, %lld)", c->plugin,
                                  n->name ? n->name : "?", id[t], (long long)t, (long long)V);
    const kern_qrp_weight *copy = rlx_iface_dtype_is_quantized(tab->dtype) ? kern_qrp_find(c, tab) : NULL;
    if (copy) {
        kern_rows_job j = {.op = RLX_OP_EMBED,
                           .cols = tab->shape[1],
                           .y = n->output->data,
                           .table_qrp = copy,
                           .dt = (int)tab->dtype,
                           .idx = id};
        kern_rows_run(c, &j, T, tab->shape[1]);
        return RLX_OK;
    }
    kern_embed(c, tab->data, (int)tab->dtype, tab->shape[1], id, T, n->output->data);
    return RLX_OK;
}

static int kern_op_rms_norm(kern_ctx *c, const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0];
    const float *w;
    const int rc = kern_vec(c, n, 1, &w);
    if (rc < 0)
        return rc;
    kern_rms_norm(c, x->data, w, n->output->data, rlx_iface_rows(x), rlx_iface_cols(x), rlx_iface_numel(&n->inputs[1]),
                  n->params->eps);
    return RLX_OK;
}

static int kern_op_gather_last(const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0];
    const int64_t T = rlx_iface_rows(x), C = rlx_iface_cols(x);
    if (T > 0)
        memcpy(n->output->data, (const float *)x->data + (T - 1) * C, (size_t)C * sizeof(float));
    else
        memset(n->output->data, 0, (size_t)C * sizeof(float));
    return RLX_OK;
}

static int kern_op_gather_rows(const kern_ctx *c, const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0], *idx = &n->inputs[1];
    const int64_t T = rlx_iface_rows(x), C = rlx_iface_cols(x), R = rlx_iface_numel(idx);
    const int32_t *at = idx->data;
    for (int64_t r = 0; r < R; r++) {
        if (at[r] < 0 || at[r] >= T)
            return c->host->error(RLX_E_RANGE, "%s: node '%s': index %lld is %d, outside the %lld rows of x", c->plugin,
                                  n->name ? n->name : "?", (long long)r, at[r], (long long)T);
        memcpy((float *)n->output->data + r * C, (const float *)x->data + at[r] * C, (size_t)C * sizeof(float));
    }
    return RLX_OK;
}

int kern_op_rows(kern_ctx *c, const rlx_node_view *n) {
    const rlx_tensor *in = n->inputs;
    switch (n->op) {
    case RLX_OP_EMBED:
        return kern_op_embed(c, n);
    case RLX_OP_RMS_NORM:
        return kern_op_rms_norm(c, n);
    case RLX_OP_ROPE:
        return kern_rope(c, in[0].data, in[1].data, n->n_inputs > 2 ? in[2].data : NULL, n->output->data,
                         rlx_iface_rows(&in[0]), rlx_iface_cols(&in[0]), n->params->head_dim,
                         c->host->abi_minor >= 6 ? n->params->rope_dims : 0, n->params->rope_theta);
    case RLX_OP_SWIGLU:
        kern_swiglu(c, in[0].data, in[1].data, n->output->data, rlx_iface_numel(n->output));
        return RLX_OK;
    case RLX_OP_ADD:
        kern_add(c, in[0].data, in[1].data, n->output->data, rlx_iface_numel(n->output));
        return RLX_OK;
    case RLX_OP_GATHER_LAST:
        return kern_op_gather_last(n);
    case RLX_OP_GATHER_ROWS:
        return kern_op_gather_rows(c, n);
    default:
        return c->host->error(RLX_E_UNSUPPORTED, "%s: node '%s': op %u is not a row op", c->plugin,
                              n->name ? n->name : "?", n->op);
    }
}
