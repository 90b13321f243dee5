/* The ops of ABI 1.6 in the kernel library: SSM_CONV, GATED_DELTA and SIGMOID_MUL
 * (rlx/backend_iface.h states them; the core's reference kernels, core/src/backend/
 * ref_recurrent.c, compute the same rules with the same choice of form).
 *
 * A call is checked whole before any state changes: every slot in range, every position >= 0,
 * the rows of a slot at consecutive positions in row order. Then:
 * - SSM_CONV: channels are independent, so threads take ranges of channels and run every row of
 *   every slot over their channels in row order.
 * - GATED_DELTA: a task per (slot, value head), each on one thread from start to end, so the
 *   bits do not depend on the thread count. The one-sequence form (a session's prompt) runs a
 *   run of at least KERN_GD_CHUNK_MIN_ROWS rows in the chunk-parallel form, whose work is small
 *   matrix products (kern_simd.h mm_acc); shorter runs, and every run of the slot form (the
 *   contract asks a slot's result not to depend on how its rows were split into calls), go row
 *   by row (gd_step), which passes over the state once per row. The chunk form's algebra is
 *   the reference's (ref_recurrent.c's comment gives it); only the products' blocking differs. */
#include <math.h>
#include <string.h>

#include "kern.h"

static const char *node_name(const rlx_node_view *n) { return n->name ? n->name : "?"; }

// ---------------------------------------------------------------------------------------------
// The rows of a call, by slot

typedef struct kern_rec_rows {
    int64_t *start;  /* [slots + 1]: slot s has rows order[start[s]] .. order[start[s + 1] - 1] */
    int32_t *order;  /* [T], in row order within each slot */
    int32_t *active; /* [T]: the slots that have rows */
    int64_t n_active;
} kern_rec_rows;

/* Checks the rows of n (positions in input pos_in, slots in input seq_in when present) against
 * `slots` sequences and groups them by slot, in c->rec after `extra` bytes the caller keeps
 * for itself (returned in *extra_out). */
static int kern_rec_rows_make(kern_ctx *c, const rlx_node_view *n, const char *op, uint32_t pos_in, uint32_t seq_in,
                              int64_t slots, size_t extra, void **extra_out, kern_rec_rows *g) {
    const int32_t *pos = n->inputs[pos_in].data;
    const uint32_t n_in = n->n_inputs - (rlx_iface_state_rows(n) ? 1u : 0u);
    const int32_t *seq = n_in > seq_in ? n->inputs[seq_in].data : NULL;
    const int64_t t_len = n->inputs[pos_in].shape[0];
    const size_t start_bytes = kern_align_up((size_t)(slots + 1) * sizeof(int64_t));
    const size_t rows_bytes = kern_align_up((size_t)(t_len + 1) * sizeof(int32_t));
    const size_t head = kern_align_up(extra);
    const int rc = kern_reserve(c, &c->rec, head + start_bytes + 2 * rows_bytes);
    if (rc < 0)
        return rc;
    char *base = c->rec.p;
    *extra_out = base;
    g->start = (int64_t *)(base + head);
    g->order = (int32_t *)(base + head + start_bytes);
    g->active = (int32_t *)(base + head + start_bytes + rows_bytes);
    g->n_active = 0;
    memset(g->start, 0, (size_t)(slots + 1) * sizeof *g->start);
    for (int64_t t = 0; t < t_len; t++) {
        const int32_t s = seq ? seq[t] : 0;
        if (s < 0 || s >= slots)
            return c->host->error(RLX_E_RANGE,
                                  "%s: node '%s' (%s): row %lld: slot %d is outside the state's %lld slots", c->plugin,
                                  node_name(n), op, (long long)t, s, (long long)slots);
        if (pos[t] < 0)
            return c->host->error(RLX_E_RANGE, "%s: node '%s' (%s): row %lld: position %d is negative", c->plugin,
                                  node_name(n), op, (long long)t, pos[t]);
        g->start[s + 1]++;
    }
    for (int64_t s = 0; s < slots; s++)
        g->start[s + 1] += g->start[s];
    /* each slot's rows in row order: fill from the slot's start, then shift the starts back */
    for (int64_t t = 0; t < t_len; t++)
        g->order[g->start[seq ? seq[t] : 0]++] = (int32_t)t;
    for (int64_t s = slots; s > 0; s--)
        g->start[s] = g->start[s - 1];
    g->start[0] = 0;
    for (int64_t s = 0; s < slots; s++) {
        if (g->start[s + 1] > g->start[s])
            g->active[g->n_active++] = (int32_t)s;
        for (int64_t i = g->start[s] + 1; i < g->start[s + 1]; i++) {
            const int32_t r = g->order[i], prev = g->order[i - 1];
            if ((int64_t)pos[r] != (int64_t)pos[prev] + 1)
                return c->host->error(RLX_E_INVALID,
                                      "%s: node '%s' (%s): row %d: position %d of slot %lld does not follow position "
                                      "%d of row %d (a sequence's rows in one call take consecutive positions)",
                                      c->plugin, node_name(n), op, r, pos[r], (long long)s, pos[prev], prev);
        }
    }
    return RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// SSM_CONV

typedef struct kern_conv_job {
    const kern_simd *k;
    const float *x, *w; /* w: the kernel as F32 [K][C] */
    const int32_t *pos;
    float *y, *state; /* state: [slots][K-1][C] */
    float *rows;      /* state rows [T][K-1][C], or NULL */
    int64_t C, K;
    const kern_rec_rows *g;
} kern_conv_job;

/* Channels [c0, c1) of every row, slot by slot in row order; the window of a slot slides by one
 * row after each (the state holds the K-1 inputs before the next row). */
static void kern_conv_range(void *ctx, int ith, int64_t c0, int64_t c1) {
    const kern_conv_job *j = ctx;
    const int64_t C = j->C, K = j->K, n = c1 - c0;
    (void)ith;
    for (int64_t a = 0; a < j->g->n_active; a++) {
        const int64_t s = j->g->active[a];
        float *st = j->state + s * (K - 1) * C + c0;
        for (int64_t i = j->g->start[s]; i < j->g->start[s + 1]; i++) {
            const int32_t r = j->g->order[i];
            const float *x = j->x + r * C + c0;
            if (j->pos[r] == 0)
                for (int64_t q = 0; q < K - 1; q++)
                    memset(st + q * C, 0, (size_t)n * sizeof *st);
            j->k->conv_row(j->w + c0, C, st, C, x, j->y + r * C + c0, n, K);
            for (int64_t q = 0; q + 2 < K; q++)
                memcpy(st + q * C, st + (q + 1) * C, (size_t)n * sizeof *st);
            memcpy(st + (K - 2) * C, x, (size_t)n * sizeof *st);
            for (int64_t q = 0; j->rows && q < K - 1; q++)
                memcpy(j->rows + (r * (K - 1) + q) * C + c0, st + q * C, (size_t)n * sizeof *st);
        }
    }
}

static int kern_op_ssm_conv(kern_ctx *c, const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0], *w = &n->inputs[1], *st = &n->inputs[3];
    const int64_t C = x->shape[1], K = w->shape[1], T = x->shape[0];
    const int64_t slots = st->n_dims == 3 ? st->shape[0] : 1;
    kern_rec_rows g;
    float *wt; /* [K][C], then w widened to F32 [C][K] */
    const int rc =
        kern_rec_rows_make(c, n, "ssm_conv", 2, 4, slots, (size_t)(2 * C * K) * sizeof *wt, (void **)&wt, &g);
    if (rc < 0)
        return rc;
    /* the kernel transposed to [K][C], so a row's taps are contiguous vectors */
    const float *wf = w->data;
    if (w->dtype != RLX_DTYPE_F32) {
        c->k->widen((int)w->dtype, w->data, wt + C * K, C * K);
        wf = wt + C * K;
    }
    for (int64_t ch = 0; ch < C; ch++)
        for (int64_t q = 0; q < K; q++)
            wt[q * C + ch] = wf[ch * K + q];
    kern_conv_job j = {.k = c->k,
                       .x = x->data,
                       .w = wt,
                       .pos = n->inputs[2].data,
                       .y = n->output->data,
                       .state = st->data,
                       .rows = rlx_iface_state_rows(n),
                       .C = C,
                       .K = K,
                       .g = &g};
    c->par.parallel_for(c->par.self, C, KERN_ROW_ALIGN, T * C * K, kern_conv_range, &j);
    return RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// GATED_DELTA

typedef struct kern_gd_job {
    const kern_simd *k;
    const float *q, *kk, *v; /* row 0 of each inside qkv, whose rows are cols apart */
    const float *a, *b, *A, *dt_bias;
    const int32_t *pos;
    float *out, *state;
    float *rows; /* state rows [T][Hv][Dk][Dv], or NULL */
    int64_t hv, hk, dk, dv, cols;
    bool tiled, rows_only; /* rows_only: the slot form, c->batch_invariant or state rows */
    float scale, eps;
    const kern_rec_rows *g;
    kern_buf *scratch; /* [n_threads] */
} kern_gd_job;

/* A thread's scratch for one chunk (the recurrent form uses the first rows of q and k). */
typedef struct kern_gd_scratch {
    float *q, *k, *kt; /* [CH][Dk], [CH][Dk], [Dk][CH] */
    float *u, *o;      /* [CH][Dv] */
    float *qk, *kk;    /* [CH][CH] */
    float *beta;       /* [CH] */
    double *g;         /* [CH] cumulative log decays */
} kern_gd_scratch;

static size_t kern_gd_scratch_bytes(int64_t dk, int64_t dv) {
    const int64_t ch = KERN_GD_CHUNK;
    return kern_align_up((size_t)(ch * dk) * sizeof(float)) * 3 + kern_align_up((size_t)(ch * dv) * sizeof(float)) * 2 +
           kern_align_up((size_t)(ch * ch) * sizeof(float)) * 2 + kern_align_up((size_t)ch * sizeof(float)) +
           kern_align_up((size_t)ch * sizeof(double));
}

static kern_gd_scratch kern_gd_scratch_at(void *p, int64_t dk, int64_t dv) {
    const int64_t ch = KERN_GD_CHUNK;
    char *b = p;
    kern_gd_scratch w;
#define TAKE(field, count)                                                                                             \
    w.field = (void *)b;                                                                                               \
    b += kern_align_up((size_t)(count) * sizeof *w.field)
    TAKE(q, ch * dk);
    TAKE(k, ch * dk);
    TAKE(kt, ch * dk);
    TAKE(u, ch * dv);
    TAKE(o, ch * dv);
    TAKE(qk, ch * ch);
    TAKE(kk, ch * ch);
    TAKE(beta, ch);
    TAKE(g, ch);
#undef TAKE
    return w;
}

/* Row r, value head h: q' (scale included) and k' of its key head into qn and kn, its beta, and
 * its log decay A softplus(a + dt_bias) as the return value. */
static float kern_gd_row(const kern_gd_job *j, int64_t r, int64_t h, float *qn, float *kn, float *beta) {
    const int64_t kh = j->tiled ? h % j->hk : h / (j->hv / j->hk);
    const float *qr = j->q + r * j->cols + kh * j->dk, *kr = j->kk + r * j->cols + kh * j->dk;
    const float iq = j->scale / sqrtf(j->k->dot(qr, qr, j->dk) + j->eps);
    const float ik = 1.0f / sqrtf(j->k->dot(kr, kr, j->dk) + j->eps);
    for (int64_t i = 0; i < j->dk; i++) {
        qn[i] = qr[i] * iq;
        kn[i] = kr[i] * ik;
    }
    const float x = j->a[r * j->hv + h] + j->dt_bias[h];
    const float softplus = x > 20.0f ? x : log1pf(expf(x)); /* torch's threshold, as the reference */
    *beta = 1.0f / (1.0f + expf(-j->b[r * j->hv + h]));
    return j->A[h] * softplus;
}

static void kern_gd_recurrent(const kern_gd_job *j, int64_t h, const int32_t *rows, int64_t n, float *S,
                              kern_gd_scratch *w) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = rows[i];
        float beta;
        const float g = expf(kern_gd_row(j, r, h, w->q, w->k, &beta));
        if (j->pos[r] == 0)
            memset(S, 0, (size_t)(j->dk * j->dv) * sizeof *S);
        j->k->gd_step(S, j->dk, j->dv, g, w->k, w->q, j->v + r * j->cols + h * j->dv, beta,
                      j->out + (r * j->hv + h) * j->dv);
        if (j->rows)
            memcpy(j->rows + (r * j->hv + h) * j->dk * j->dv, S, (size_t)(j->dk * j->dv) * sizeof *S);
    }
}

/* One chunk of l rows in the chunk-parallel form; S holds S0 and then S_L. */
static void kern_gd_chunk(const kern_gd_job *j, int64_t h, const int32_t *rows, int64_t l, float *S,
                          kern_gd_scratch *w) {
    const kern_simd *k = j->k;
    const int64_t dk = j->dk, dv = j->dv, CH = KERN_GD_CHUNK;
    double cum = 0;
    for (int64_t t = 0; t < l; t++) {
        cum += kern_gd_row(j, rows[t], h, w->q + t * dk, w->k + t * dk, &w->beta[t]);
        w->g[t] = cum;
        for (int64_t i = 0; i < dk; i++)
            w->kt[i * CH + t] = w->k[t * dk + i];
    }
    /* qk[t][j] = e^(G_t-G_j) q_t.k_j (j <= t), kk[t][j] = beta_t e^(G_t-G_j) k_t.k_j (j < t), else 0 */
    for (int64_t t = 0; t < l; t++) {
        memset(w->qk + t * CH, 0, (size_t)l * sizeof *w->qk);
        memset(w->kk + t * CH, 0, (size_t)l * sizeof *w->kk);
    }
    k->mm_acc(l, l, dk, w->q, dk, w->kt, CH, w->qk, CH, 1.0f);
    k->mm_acc(l, l, dk, w->k, dk, w->kt, CH, w->kk, CH, 1.0f);
    for (int64_t t = 0; t < l; t++) {
        float *qk = w->qk + t * CH, *kk = w->kk + t * CH;
        for (int64_t i = 0; i < l; i++) {
            const float e = i <= t ? (float)exp(w->g[t] - w->g[i]) : 0.0f;
            qk[i] *= e;
            kk[i] = i < t ? kk[i] * w->beta[t] * e : 0.0f;
        }
    }
    /* from S0: u_t = beta_t (v_t - e^G_t S0^T k_t), out_t = e^G_t S0^T q_t */
    memset(w->u, 0, (size_t)(l * dv) * sizeof *w->u);
    memset(w->o, 0, (size_t)(l * dv) * sizeof *w->o);
    k->mm_acc(l, dv, dk, w->k, dk, S, dv, w->u, dv, 1.0f);
    k->mm_acc(l, dv, dk, w->q, dk, S, dv, w->o, dv, 1.0f);
    for (int64_t t = 0; t < l; t++) {
        float *ut = w->u + t * dv, *ot = w->o + t * dv;
        const float eg = (float)exp(w->g[t]), *vt = j->v + rows[t] * j->cols + h * dv;
        for (int64_t x = 0; x < dv; x++)
            ut[x] = w->beta[t] * (vt[x] - eg * ut[x]);
        k->scal(eg, ot, dv);
    }
    /* forward substitution through the unit lower-triangular system, then the chunk's own rows */
    for (int64_t t = 1; t < l; t++)
        k->mm_acc(1, dv, t, w->kk + t * CH, CH, w->u, dv, w->u + t * dv, dv, -1.0f);
    k->mm_acc(l, dv, l, w->qk, CH, w->u, dv, w->o, dv, 1.0f);
    for (int64_t t = 0; t < l; t++)
        memcpy(j->out + (rows[t] * j->hv + h) * dv, w->o + t * dv, (size_t)dv * sizeof *w->o);
    /* S_L = e^G_L S0 + sum_t e^(G_L-G_t) k_t u_t^T: k^T's columns weighted, then one product */
    for (int64_t i = 0; i < dk; i++)
        for (int64_t t = 0; t < l; t++)
            w->kt[i * CH + t] *= (float)exp(w->g[l - 1] - w->g[t]);
    k->scal((float)exp(w->g[l - 1]), S, dk * dv);
    k->mm_acc(dk, dv, l, w->kt, CH, w->u, dv, S, dv, 1.0f);
}

/* Task i: value head i % Hv of the i / Hv-th active slot, over that slot's rows of the call. */
static void kern_gd_task(void *ctx, int ith, int64_t i0, int64_t i1) {
    const kern_gd_job *j = ctx;
    kern_gd_scratch w = kern_gd_scratch_at(j->scratch[ith].p, j->dk, j->dv);
    for (int64_t item = i0; item < i1; item++) {
        const int64_t s = j->g->active[item / j->hv], h = item % j->hv;
        const int32_t *rows = j->g->order + j->g->start[s];
        const int64_t n = j->g->start[s + 1] - j->g->start[s];
        float *S = j->state + (s * j->hv + h) * j->dk * j->dv;
        if (n < KERN_GD_CHUNK_MIN_ROWS || j->rows_only) {
            kern_gd_recurrent(j, h, rows, n, S, &w);
            continue;
        }
        if (j->pos[rows[0]] == 0)
            memset(S, 0, (size_t)(j->dk * j->dv) * sizeof *S);
        for (int64_t c0 = 0; c0 < n; c0 += KERN_GD_CHUNK)
            kern_gd_chunk(j, h, rows + c0, n - c0 < KERN_GD_CHUNK ? n - c0 : KERN_GD_CHUNK, S, &w);
    }
}

static int kern_op_gated_delta(kern_ctx *c, const rlx_node_view *n) {
    const rlx_op_params *p = n->params;
    const rlx_tensor *st = &n->inputs[6];
    const float *qkv = n->inputs[0].data;
    const int64_t hk = p->n_kv_heads, dk = p->head_dim, T = n->inputs[0].shape[0];
    const int64_t slots = st->n_dims == 4 ? st->shape[0] : 1;
    kern_rec_rows g;
    float *decay; /* A and dt_bias widened to F32, [Hv] each */
    int rc = kern_rec_rows_make(c, n, "gated_delta", 5, 7, slots, (size_t)(2 * p->n_heads) * sizeof *decay,
                                (void **)&decay, &g);
    if (rc < 0 || (rc = kern_reserve_each(c, c->att, kern_gd_scratch_bytes(dk, p->head_dim_v))) < 0)
        return rc;
    c->k->widen((int)n->inputs[3].dtype, n->inputs[3].data, decay, p->n_heads);
    c->k->widen((int)n->inputs[4].dtype, n->inputs[4].data, decay + p->n_heads, p->n_heads);
    kern_gd_job j = {.k = c->k,
                     .q = qkv,
                     .kk = qkv + hk * dk,
                     .v = qkv + 2 * hk * dk,
                     .a = n->inputs[1].data,
                     .b = n->inputs[2].data,
                     .A = decay,
                     .dt_bias = decay + p->n_heads,
                     .pos = n->inputs[5].data,
                     .out = n->output->data,
                     .state = st->data,
                     .rows = rlx_iface_state_rows(n),
                     .hv = p->n_heads,
                     .hk = hk,
                     .dk = dk,
                     .dv = p->head_dim_v,
                     .cols = n->inputs[0].shape[1],
                     .tiled = p->kv_tiled != 0,
                     .rows_only = st->n_dims == 4 || c->batch_invariant || p->state_rows,
                     .scale = p->scale,
                     .eps = p->eps,
                     .g = &g,
                     .scratch = c->att};
    const int64_t items = g.n_active * j.hv;
    if (items)
        c->par.parallel_tasks(c->par.self, items, T * j.hv * dk * j.dv * 4, kern_gd_task, &j);
    return RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// SIGMOID_MUL

typedef struct kern_gate_job {
    const kern_simd *k;
    const float *x, *g;
    float *y;
} kern_gate_job;

static void kern_gate_range(void *ctx, int ith, int64_t i0, int64_t i1) {
    const kern_gate_job *j = ctx;
    (void)ith;
    j->k->sigmoid_mul(j->x + i0, j->g + i0, j->y + i0, i1 - i0);
}

int kern_op_recurrent(kern_ctx *c, const rlx_node_view *n) {
    switch (n->op) {
    case RLX_OP_SSM_CONV:
        return kern_op_ssm_conv(c, n);
    case RLX_OP_GATED_DELTA:
        return kern_op_gated_delta(c, n);
    case RLX_OP_SIGMOID_MUL: {
        const int64_t len = rlx_iface_numel(n->output);
        kern_gate_job j = {.k = c->k, .x = n->inputs[0].data, .g = n->inputs[1].data, .y = n->output->data};
        c->par.parallel_for(c->par.self, len, KERN_ROW_ALIGN, len * 8, kern_gate_range, &j);
        return RLX_OK;
    }
    default:
        return c->host->error(RLX_E_UNSUPPORTED, "%s: node '%s': op %u is not a recurrent op", c->plugin, node_name(n),
                              n->op);
    }
}
