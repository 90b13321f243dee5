/* Reference kernels of the recurrent ops of ABI 1.6 (rlx/backend_iface.h defines them):
 * SSM_CONV, a causal depthwise convolution that carries its last K-1 inputs, and GATED_DELTA,
 * the gated delta rule of Gated DeltaNet, whose state is a Dk x Dv matrix per value head.
 *
 * Both take rows of one or several sequences (slots) in one call. A call is checked whole before
 * any state changes: every slot in range, every position >= 0, and the rows of a slot at
 * consecutive positions in row order. The rows of a slot then run in order, each slot (and each
 * head) on its own, so a row's output depends on its own sequence only (batch invariance).
 *
 * GATED_DELTA has two forms with one result. Row by row (the recurrent form) reads and writes
 * the whole state twice per row. A long run of one sequence's rows (a prompt) goes through the
 * chunk-parallel form of Yang et al. (Gated Delta Networks, 2024), as Hugging Face's
 * torch_chunk_gated_delta_rule computes it: within a chunk of L rows with cumulative log decays
 * G_t, the delta rule's corrections u_t solve a unit lower-triangular system
 *     u_t = beta_t (v_t - e^G_t S0^T k_t) - sum_{j<t} beta_t e^(G_t-G_j) (k_t.k_j) u_j,
 * (forward substitution: the WY/UT representation, with S0^T k_t as one matrix product), then
 *     out_t = e^G_t S0^T q_t + sum_{j<=t} e^(G_t-G_j) (q_t.k_j) u_j,
 *     S_L   = e^G_L S0 + sum_j e^(G_L-G_j) k_j u_j^T,
 * which expands the recurrence exactly, so the forms differ only in F32 rounding. Arithmetic is
 * F32 with the weights A and dt_bias widened exactly; the cumulative log decays alone are
 * summed in double, since their rounding would otherwise grow with a chunk's total decay and
 * show in every factor e^(G_t-G_j) taken from them. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend_impl.h"
#include "util/alloc.h"

/* In the one-sequence form (a session's prompt), a run of at least this many rows takes the
 * chunk-parallel form, as a backend's fast path would (sgemm over chunks), so that the reference
 * computes each row as such a backend does and the two are compared within one form's rounding.
 * The slot form (engines, pipeline stages) runs every row by row: the contract asks its results
 * not to depend on how a sequence's rows are split into calls, and the two forms round
 * differently. Decode (one row per sequence) and speculative verification (a few) stay row by
 * row in either form. In this plain C the
 * chunked form is not faster: both forms do about 4 Dk Dv multiply-adds per row and head, and
 * the recurrent one's passes over a state that fits L2 vectorize as well as these products
 * (measured at T=512, Hv=16, Dk=Dv=128: 65 ms row by row, 135 ms chunked, one thread). */
#define GD_CHUNK_MIN_ROWS 16
/* Rows per chunk: Hugging Face's and llama.cpp's 64. The work per row grows with the chunk
 * (its L x L products) while the state passes per row shrink with it; 64 keeps a chunk's q, k,
 * u and products (about 100 KiB at Dk = Dv = 128) within L2. */
#define GD_CHUNK 64
/* Threads of one GATED_DELTA call: one per online CPU, at most one per (slot, head) item and
 * at most GD_MAX_THREADS, started only when the call holds at least GD_THREAD_MIN_MACS
 * multiply-adds: a thread's start costs tens of microseconds, while a decode row of 16 heads of
 * 128 x 128 (1M multiply-adds, about 0.15 ms on one core) is not worth splitting. Every item
 * runs on one thread from start to end, so the bits do not depend on the number of threads. */
#define GD_MAX_THREADS 64
#define GD_THREAD_MIN_MACS (1 << 22)

static float *f32(const rlx_tensor *t) { return (float *)t->data; }
static const int32_t *i32(const rlx_tensor *t) { return (const int32_t *)t->data; }
static float silu(float x) { return x / (1.0f + expf(-x)); }

// ---- the rows of a call, by slot ----

/* The rows of a call grouped by slot: slot s has rows order[start[s]] .. order[start[s + 1] - 1],
 * in row order. */
typedef struct rec_rows {
    int64_t slots;
    int64_t *start; /* [slots + 1] */
    int32_t *order; /* [T] */
} rec_rows;

static void rec_rows_free(rec_rows *g) {
    free(g->start);
    free(g->order);
}

/* Checks the rows of node n (positions in input pos_in, slots in input seq_in when the node has
 * it) against `slots` sequences and groups them by slot. */
static int rec_rows_make(const rlx_node_view *n, const char *op, uint32_t pos_in, uint32_t seq_in, int64_t slots,
                         rec_rows *g) {
    const uint32_t n_in = n->n_inputs - (rlx_iface_state_rows(n) ? 1u : 0u);
    const int32_t *pos = i32(&n->inputs[pos_in]), *seq = n_in > seq_in ? i32(&n->inputs[seq_in]) : NULL;
    const int64_t t_len = n->inputs[pos_in].shape[0];
    const char *name = n->name ? n->name : "?";
    g->slots = slots;
    g->start = rlx__calloc((size_t)slots + 1, sizeof *g->start);
    g->order = rlx__malloc((size_t)(t_len > 0 ? t_len : 1) * sizeof *g->order);
    if (!g->start || !g->order) {
        rec_rows_free(g);
        return rlx_error(RLX_E_NOMEM, "%s: out of memory", op);
    }
    for (int64_t t = 0; t < t_len; t++) {
        const int32_t s = seq ? seq[t] : 0;
        if (s < 0 || s >= slots) {
            rec_rows_free(g);
            return rlx_error(RLX_E_RANGE, "node '%s' (%s): row %lld: slot %d is outside the state's %lld slots", name,
                             op, (long long)t, s, (long long)slots);
        }
        if (pos[t] < 0) {
            rec_rows_free(g);
            return rlx_error(RLX_E_RANGE, "node '%s' (%s): row %lld: position %d is negative", name, op, (long long)t,
                             pos[t]);
        }
        g->start[s + 1]++;
    }
    for (int64_t s = 0; s < slots; s++)
        g->start[s + 1] += g->start[s];
    for (int64_t t = 0, *fill = g->start; t < t_len; t++)
        g->order[fill[seq ? seq[t] : 0]++] = (int32_t)t;
    /* fill[s] ran up to start[s + 1]: shift back to where each slot starts */
    for (int64_t s = slots; s > 0; s--)
        g->start[s] = g->start[s - 1];
    g->start[0] = 0;
    for (int64_t s = 0; s < slots; s++)
        for (int64_t i = g->start[s] + 1; i < g->start[s + 1]; i++) {
            const int32_t r = g->order[i], prev = g->order[i - 1];
            if ((int64_t)pos[r] != (int64_t)pos[prev] + 1) {
                const int32_t p = pos[r], before = pos[prev];
                rec_rows_free(g);
                return rlx_error(RLX_E_INVALID,
                                 "node '%s' (%s): row %d: position %d of slot %lld does not follow position %d of row "
                                 "%d (a sequence's rows in one call take consecutive positions, in row order)",
                                 name, op, r, p, (long long)s, before, prev);
            }
        }
    return RLX_OK;
}

// ---- SSM_CONV ----

int rlx__ref_ssm_conv(const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0], *w = &n->inputs[1], *st = &n->inputs[3];
    const int32_t *pos = i32(&n->inputs[2]);
    const int64_t ch = x->shape[1], k = w->shape[1], slots = st->n_dims == 3 ? st->shape[0] : 1;
    float *rows = rlx_iface_state_rows(n);
    rec_rows g;
    int rc = rec_rows_make(n, "ssm_conv", 2, 4, slots, &g);
    if (rc != RLX_OK)
        return rc;
    float *wf = rlx__malloc((size_t)(ch * k) * sizeof *wf);
    if (!wf) {
        rec_rows_free(&g);
        return rlx_error(RLX_E_NOMEM, "ssm_conv: out of memory");
    }
    for (int64_t i = 0; i < ch * k; i++)
        wf[i] = rlx__load(w->data, w->dtype, (size_t)i);
    /* The state of a slot is its window u[p-K+1 .. p-1] before each row at position p: row p
     * reads it and x, then slides it by one. */
    for (int64_t s = 0; s < slots; s++) {
        float *state = f32(st) + s * (k - 1) * ch;
        for (int64_t i = g.start[s]; i < g.start[s + 1]; i++) {
            const int32_t r = g.order[i];
            const float *xr = f32(x) + r * ch;
            float *y = f32(n->output) + r * ch;
            if (pos[r] == 0)
                memset(state, 0, (size_t)((k - 1) * ch) * sizeof *state);
            for (int64_t c = 0; c < ch; c++) {
                float acc = 0;
                for (int64_t j = 0; j < k - 1; j++)
                    acc += wf[c * k + j] * state[j * ch + c];
                y[c] = silu(acc + wf[c * k + k - 1] * xr[c]);
            }
            memmove(state, state + ch, (size_t)((k - 2) * ch) * sizeof *state);
            memcpy(state + (k - 2) * ch, xr, (size_t)ch * sizeof *state);
            if (rows)
                memcpy(rows + r * (k - 1) * ch, state, (size_t)((k - 1) * ch) * sizeof *state);
        }
    }
    free(wf);
    rec_rows_free(&g);
    return RLX_OK;
}

// ---- GATED_DELTA ----

typedef struct gd_ctx {
    const float *q, *k, *v; /* row 0 of each inside qkv, whose rows are qkv_cols apart */
    const float *a, *b;
    const int32_t *pos;
    float *out, *state;
    float *after;           /* state rows (ABI 1.7): [T][Hv][Dk][Dv], the state after each row, or NULL */
    float *decay, *dt_bias; /* A and dt_bias widened, [Hv] each */
    int64_t hv, hk, dk, dv, qkv_cols;
    int tiled;   /* value head h reads key head h % Hk, else h / (Hv / Hk) */
    int slotted; /* the slot form: every run row by row (the contract's split invariance) */
    float scale, eps;
    rec_rows rows;
    int32_t *active;           /* the slots that have rows, [n_active] */
    int64_t n_active, n_items; /* items: (active slot, value head) pairs, slot-major */
} gd_ctx;

/* One thread's scratch: a chunk's normalised q and k, corrections u and outputs, its products
 * and decays. The recurrent form uses the first rows of q, k and u. */
typedef struct gd_scratch {
    float *q, *k, *kt; /* [GD_CHUNK * Dk] q, k and k transposed ([Dk][GD_CHUNK]) */
    float *u, *o;      /* [GD_CHUNK * Dv] */
    float *qk, *kk;    /* [GD_CHUNK * GD_CHUNK] */
    float *beta;       /* [GD_CHUNK] */
    double *g;         /* [GD_CHUNK] cumulative log decays */
} gd_scratch;

static void gd_scratch_free(gd_scratch *w) {
    free(w->q);
    free(w->k);
    free(w->kt);
    free(w->u);
    free(w->o);
    free(w->qk);
    free(w->kk);
    free(w->beta);
    free(w->g);
}

static int gd_scratch_init(gd_scratch *w, int64_t dk, int64_t dv) {
    w->q = rlx__malloc((size_t)(GD_CHUNK * dk) * sizeof *w->q);
    w->k = rlx__malloc((size_t)(GD_CHUNK * dk) * sizeof *w->k);
    w->kt = rlx__malloc((size_t)(GD_CHUNK * dk) * sizeof *w->kt);
    w->u = rlx__malloc((size_t)(GD_CHUNK * dv) * sizeof *w->u);
    w->o = rlx__malloc((size_t)(GD_CHUNK * dv) * sizeof *w->o);
    w->qk = rlx__malloc((size_t)(GD_CHUNK * GD_CHUNK) * sizeof *w->qk);
    w->kk = rlx__malloc((size_t)(GD_CHUNK * GD_CHUNK) * sizeof *w->kk);
    w->beta = rlx__malloc(GD_CHUNK * sizeof *w->beta);
    w->g = rlx__malloc(GD_CHUNK * sizeof *w->g);
    if (w->q && w->k && w->kt && w->u && w->o && w->qk && w->kk && w->beta && w->g)
        return RLX_OK;
    gd_scratch_free(w);
    return rlx_error(RLX_E_NOMEM, "gated_delta: out of memory");
}

/* Row r, value head h: q' (scale included) and k' of its key head into qn and kn, its log
 * decay A softplus(a + dt_bias) and its beta. */
static float gd_row(const gd_ctx *c, int64_t r, int64_t h, float *qn, float *kn, float *beta) {
    const int64_t kh = c->tiled ? h % c->hk : h / (c->hv / c->hk);
    const float *qr = c->q + r * c->qkv_cols + kh * c->dk, *kr = c->k + r * c->qkv_cols + kh * c->dk;
    float sq = 0, sk = 0;
    for (int64_t i = 0; i < c->dk; i++) {
        sq += qr[i] * qr[i];
        sk += kr[i] * kr[i];
    }
    const float iq = c->scale / sqrtf(sq + c->eps), ik = 1.0f / sqrtf(sk + c->eps);
    for (int64_t i = 0; i < c->dk; i++) {
        qn[i] = qr[i] * iq;
        kn[i] = kr[i] * ik;
    }
    const float x = c->a[r * c->hv + h] + c->dt_bias[h];
    const float softplus = x > 20.0f ? x : log1pf(expf(x)); /* torch's threshold: equal in F32 there */
    *beta = 1.0f / (1.0f + expf(-c->b[r * c->hv + h]));
    return c->decay[h] * softplus;
}

/* The recurrence, row by row, over the n rows of one slot for value head h; S its state. */
static void gd_recurrent(const gd_ctx *c, int64_t h, const int32_t *rows, int64_t n, float *S, gd_scratch *w) {
    const int64_t dk = c->dk, dv = c->dv;
    float *qn = w->q, *kn = w->k, *delta = w->u;
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = rows[i];
        float beta;
        const float g = expf(gd_row(c, r, h, qn, kn, &beta));
        if (c->pos[r] == 0)
            memset(S, 0, (size_t)(dk * dv) * sizeof *S);
        memset(delta, 0, (size_t)dv * sizeof *delta);
        for (int64_t a = 0; a < dk; a++) { /* S = g S; delta = S^T k' */
            float *sa = S + a * dv;
            for (int64_t j = 0; j < dv; j++) {
                sa[j] *= g;
                delta[j] += sa[j] * kn[a];
            }
        }
        const float *vr = c->v + r * c->qkv_cols + h * dv;
        for (int64_t j = 0; j < dv; j++)
            delta[j] = beta * (vr[j] - delta[j]);
        float *o = c->out + (r * c->hv + h) * dv;
        memset(o, 0, (size_t)dv * sizeof *o);
        for (int64_t a = 0; a < dk; a++) { /* S += k' delta^T; out = S^T q' */
            float *sa = S + a * dv;
            for (int64_t j = 0; j < dv; j++) {
                sa[j] += kn[a] * delta[j];
                o[j] += sa[j] * qn[a];
            }
        }
        if (c->after)
            memcpy(c->after + (r * c->hv + h) * dk * dv, S, (size_t)(dk * dv) * sizeof *S);
    }
}

/* u[r] += kq[r] s and o[r] += kq[4 + r] s for the four consecutive rows r of u and o (Dv
 * values each): s read once for four rows; restrict lets the compiler vectorize it. */
static void gd_axpy4(const float *restrict s, int64_t dv, const float *kq, float *restrict u, float *restrict o) {
    float *restrict u0 = u, *restrict u1 = u + dv, *restrict u2 = u + 2 * dv, *restrict u3 = u + 3 * dv;
    float *restrict o0 = o, *restrict o1 = o + dv, *restrict o2 = o + 2 * dv, *restrict o3 = o + 3 * dv;
    const float k0 = kq[0], k1 = kq[1], k2 = kq[2], k3 = kq[3], q0 = kq[4], q1 = kq[5], q2 = kq[6], q3 = kq[7];
    for (int64_t j = 0; j < dv; j++) {
        const float sj = s[j];
        u0[j] += k0 * sj, u1[j] += k1 * sj, u2[j] += k2 * sj, u3[j] += k3 * sj;
        o0[j] += q0 * sj, o1[j] += q1 * sj, o2[j] += q2 * sj, o3[j] += q3 * sj;
    }
}

/* One chunk of l rows (see the file's comment); S holds S0 and then S_L. The loops keep a
 * contiguous run of Dv (or of the chunk's rows) innermost, so they vectorize without
 * reassociating any sum, and the passes over S0 take rows four at a time, reading S once per
 * four rows where the recurrent form reads it twice per row. */
static void gd_chunk(const gd_ctx *c, int64_t h, const int32_t *rows, int64_t l, float *S, gd_scratch *w) {
    const int64_t dk = c->dk, dv = c->dv;
    double cum = 0;
    for (int64_t t = 0; t < l; t++) {
        cum += gd_row(c, rows[t], h, w->q + t * dk, w->k + t * dk, &w->beta[t]);
        w->g[t] = cum;
        for (int64_t i = 0; i < dk; i++)
            w->kt[i * GD_CHUNK + t] = w->k[t * dk + i];
    }
    /* qk[t][j] = e^(G_t-G_j) q_t.k_j (j <= t), kk[t][j] = beta_t e^(G_t-G_j) k_t.k_j (j < t) */
    for (int64_t t = 0; t < l; t++) {
        float *qk = w->qk + t * GD_CHUNK, *kk = w->kk + t * GD_CHUNK;
        memset(qk, 0, (size_t)(t + 1) * sizeof *qk);
        memset(kk, 0, (size_t)(t + 1) * sizeof *kk);
        for (int64_t i = 0; i < dk; i++) {
            const float qi = w->q[t * dk + i], ki = w->k[t * dk + i], *kti = w->kt + i * GD_CHUNK;
            for (int64_t j = 0; j <= t; j++) {
                qk[j] += qi * kti[j];
                kk[j] += ki * kti[j];
            }
        }
        for (int64_t j = 0; j <= t; j++) {
            const float e = (float)exp(w->g[t] - w->g[j]);
            qk[j] *= e;
            kk[j] *= w->beta[t] * e;
        }
    }
    /* from S0: u_t = beta_t (v_t - e^G_t S0^T k_t) and out_t = e^G_t S0^T q_t */
    memset(w->u, 0, (size_t)(l * dv) * sizeof *w->u);
    memset(w->o, 0, (size_t)(l * dv) * sizeof *w->o);
    int64_t t0 = 0;
    for (; t0 + 4 <= l; t0 += 4)
        for (int64_t a = 0; a < dk; a++) {
            const float kq[8] = {w->kt[a * GD_CHUNK + t0],
                                 w->kt[a * GD_CHUNK + t0 + 1],
                                 w->kt[a * GD_CHUNK + t0 + 2],
                                 w->kt[a * GD_CHUNK + t0 + 3],
                                 w->q[t0 * dk + a],
                                 w->q[(t0 + 1) * dk + a],
                                 w->q[(t0 + 2) * dk + a],
                                 w->q[(t0 + 3) * dk + a]};
            gd_axpy4(S + a * dv, dv, kq, w->u + t0 * dv, w->o + t0 * dv);
        }
    for (; t0 < l; t0++)
        for (int64_t a = 0; a < dk; a++) {
            const float *sa = S + a * dv, ka = w->k[t0 * dk + a], qa = w->q[t0 * dk + a];
            float *ut = w->u + t0 * dv, *ot = w->o + t0 * dv;
            for (int64_t j = 0; j < dv; j++) {
                ut[j] += ka * sa[j];
                ot[j] += qa * sa[j];
            }
        }
    for (int64_t t = 0; t < l; t++) {
        float *ut = w->u + t * dv, *ot = w->o + t * dv;
        const float eg = (float)exp(w->g[t]), *vt = c->v + rows[t] * c->qkv_cols + h * dv;
        for (int64_t j = 0; j < dv; j++) {
            ut[j] = w->beta[t] * (vt[j] - eg * ut[j]);
            ot[j] *= eg;
        }
    }
    /* forward substitution through the unit lower-triangular system, then the chunk's own rows */
    for (int64_t t = 1; t < l; t++)
        for (int64_t j = 0; j < t; j++) {
            const float f = w->kk[t * GD_CHUNK + j], *uj = w->u + j * dv;
            float *ut = w->u + t * dv;
            for (int64_t x = 0; x < dv; x++)
                ut[x] -= f * uj[x];
        }
    for (int64_t t = 0; t < l; t++) {
        float *ot = w->o + t * dv;
        for (int64_t j = 0; j <= t; j++) {
            const float f = w->qk[t * GD_CHUNK + j], *uj = w->u + j * dv;
            for (int64_t x = 0; x < dv; x++)
                ot[x] += f * uj[x];
        }
        memcpy(c->out + (rows[t] * c->hv + h) * dv, ot, (size_t)dv * sizeof *ot);
    }
    /* S_L = e^G_L S0 + sum_j e^(G_L-G_j) k_j u_j^T, four rows j at a time */
    const float el = (float)exp(w->g[l - 1]);
    for (int64_t j = 0; j < l; j++)
        w->beta[j] = (float)exp(w->g[l - 1] - w->g[j]); /* beta is no longer needed */
    for (int64_t a = 0; a < dk; a++) {
        float *sa = S + a * dv;
        const float *ka = w->kt + a * GD_CHUNK;
        for (int64_t x = 0; x < dv; x++)
            sa[x] *= el;
        int64_t j = 0;
        for (; j + 4 <= l; j += 4) {
            const float f0 = w->beta[j] * ka[j], f1 = w->beta[j + 1] * ka[j + 1], f2 = w->beta[j + 2] * ka[j + 2],
                        f3 = w->beta[j + 3] * ka[j + 3];
            const float *u0 = w->u + j * dv, *u1 = u0 + dv, *u2 = u1 + dv, *u3 = u2 + dv;
            for (int64_t x = 0; x < dv; x++)
                sa[x] += f0 * u0[x] + f1 * u1[x] + f2 * u2[x] + f3 * u3[x];
        }
        for (; j < l; j++) {
            const float f = w->beta[j] * ka[j], *uj = w->u + j * dv;
            for (int64_t x = 0; x < dv; x++)
                sa[x] += f * uj[x];
        }
    }
}

/* Item i: one value head of one slot, over that slot's rows of the call. */
static void gd_item(const gd_ctx *c, int64_t item, gd_scratch *w) {
    const int64_t s = c->active[item / c->hv], h = item % c->hv;
    const int32_t *rows = c->rows.order + c->rows.start[s];
    const int64_t n = c->rows.start[s + 1] - c->rows.start[s];
    float *S = c->state + (s * c->hv + h) * c->dk * c->dv;
    if (n < GD_CHUNK_MIN_ROWS || c->slotted || c->after) {
        gd_recurrent(c, h, rows, n, S, w);
        return;
    }
    if (c->pos[rows[0]] == 0)
        memset(S, 0, (size_t)(c->dk * c->dv) * sizeof *S);
    for (int64_t c0 = 0; c0 < n; c0 += GD_CHUNK)
        gd_chunk(c, h, rows + c0, n - c0 < GD_CHUNK ? n - c0 : GD_CHUNK, S, w);
}

typedef struct gd_worker {
    const gd_ctx *c;
    int64_t first, stride; /* items first, first + stride, ... */
    gd_scratch w;
} gd_worker;

static void *gd_worker_run(void *arg) {
    gd_worker *wk = arg;
    for (int64_t i = wk->first; i < wk->c->n_items; i += wk->stride)
        gd_item(wk->c, i, &wk->w);
    return NULL;
}

/* Threads for the call: 1 below GD_THREAD_MIN_MACS, else one per online CPU, per item at most. */
static int gd_threads(const gd_ctx *c, int64_t t_len) {
    const double macs = (double)t_len * (double)c->hv * (double)c->dk * (double)c->dv * 4;
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t n = cpus > 1 ? cpus : 1;
    n = n < GD_MAX_THREADS ? n : GD_MAX_THREADS;
    n = n < c->n_items ? n : c->n_items;
    return macs < GD_THREAD_MIN_MACS || n < 1 ? 1 : (int)n;
}

/* Runs every item on n_threads threads (the caller's among them); a thread that cannot start
 * leaves its items to the caller, which gives the same bits. */
static int gd_run(const gd_ctx *c, int n_threads) {
    gd_worker wk[GD_MAX_THREADS] = {{0}};
    pthread_t tid[GD_MAX_THREADS];
    int started[GD_MAX_THREADS] = {0}, n_ready = 0, rc = RLX_OK;
    for (; n_ready < n_threads; n_ready++) {
        wk[n_ready] = (gd_worker){.c = c, .first = n_ready, .stride = n_threads};
        if ((rc = gd_scratch_init(&wk[n_ready].w, c->dk, c->dv)) != RLX_OK)
            break;
    }
    if (rc == RLX_OK) {
        for (int i = 1; i < n_threads; i++)
            started[i] = pthread_create(&tid[i], NULL, gd_worker_run, &wk[i]) == 0;
        gd_worker_run(&wk[0]);
        for (int i = 1; i < n_threads; i++) {
            if (started[i])
                pthread_join(tid[i], NULL);
            else
                gd_worker_run(&wk[i]);
        }
    }
    for (int i = 0; i < n_ready; i++)
        gd_scratch_free(&wk[i].w);
    return rc;
}

int rlx__ref_gated_delta(const rlx_node_view *n) {
    const rlx_op_params *p = n->params;
    const rlx_tensor *st = &n->inputs[6], *A = &n->inputs[3], *dtb = &n->inputs[4];
    const float *qkv = f32(&n->inputs[0]);
    const int64_t hk = p->n_kv_heads, dk = p->head_dim;
    gd_ctx c = {.q = qkv,
                .k = qkv + hk * dk,
                .v = qkv + 2 * hk * dk,
                .a = f32(&n->inputs[1]),
                .b = f32(&n->inputs[2]),
                .pos = i32(&n->inputs[5]),
                .out = f32(n->output),
                .state = f32(st),
                .after = rlx_iface_state_rows(n),
                .hv = p->n_heads,
                .hk = hk,
                .dk = dk,
                .dv = p->head_dim_v,
                .qkv_cols = n->inputs[0].shape[1],
                .tiled = p->kv_tiled != 0,
                .slotted = st->n_dims == 4,
                .scale = p->scale,
                .eps = p->eps};
    const int64_t slots = st->n_dims == 4 ? st->shape[0] : 1;
    int rc = rec_rows_make(n, "gated_delta", 5, 7, slots, &c.rows);
    if (rc != RLX_OK)
        return rc;
    const int64_t t_len = n->inputs[0].shape[0];
    c.decay = rlx__malloc((size_t)c.hv * 2 * sizeof *c.decay);
    c.active = rlx__malloc((size_t)(t_len > 0 ? t_len : 1) * sizeof *c.active);
    if (!c.decay || !c.active) {
        free(c.decay);
        free(c.active);
        rec_rows_free(&c.rows);
        return rlx_error(RLX_E_NOMEM, "gated_delta: out of memory");
    }
    for (int64_t s = 0; s < slots; s++)
        if (c.rows.start[s + 1] > c.rows.start[s])
            c.active[c.n_active++] = (int32_t)s;
    c.n_items = c.n_active * c.hv;
    c.dt_bias = c.decay + c.hv;
    for (int64_t h = 0; h < c.hv; h++) {
        c.decay[h] = rlx__load(A->data, A->dtype, (size_t)h);
        c.dt_bias[h] = rlx__load(dtb->data, dtb->dtype, (size_t)h);
    }
    rc = c.n_items ? gd_run(&c, gd_threads(&c, t_len)) : RLX_OK;
    free(c.decay);
    free(c.active);
    rec_rows_free(&c.rows);
    return rc;
}
