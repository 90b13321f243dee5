/* ATTENTION in the kernel library, batch-invariant: a query's output is the same bits whatever
 * else the call holds (other slots' rows, the other rows of its prompt chunk, T) and whatever
 * the thread count, so concurrency never changes an answer.
 *
 * Every query follows one sequence of operations, fixed by its own position and window: its
 * visible keys are cut into chunks at multiples of KERN_ATT_CHUNK (absolute positions, so a
 * prompt chunk's start moves no boundary); per chunk and query head, scores (att_qk, each one
 * fixed sum), a softmax over exactly the query's keys in the chunk (its maximum m and sum s),
 * and the unnormalised output o = P V over the same keys (att_pv, from zero in key order); the
 * chunk's (m, s, o) is folded into the query's running ones in chunk order (kern_att_fold),
 * and the output is the final o times 1 / s. A block of a slot's consecutive rows scores all of
 * them against the union of their keys at once (a key's score does not depend on which others
 * are computed) and runs P V per query over its own keys only: a masked key's value is never
 * multiplied by a zero, which would turn an infinite F16 value into a NaN. Tasks (block, KV
 * head) write disjoint outputs, so how threads take them changes nothing. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern.h"

static int64_t kern_att_first(const kern_att *a, int64_t t) {
    const int64_t lo = a->window > 0 ? (int64_t)a->pos[t] - a->window + 1 : 0;
    return lo > 0 ? lo : 0;
}

static int kern_att_rows_ok(kern_ctx *c, const rlx_node_view *n, int64_t S, int64_t C) {
    const rlx_tensor *in = n->inputs;
    const int64_t T = rlx_iface_rows(&in[0]);
    const int32_t *pos = in[3].data, *seq = n->n_inputs > 6 ? in[6].data : NULL;
    const char *name = n->name ? n->name : "?";
    int rc = kern_reserve(c, &c->att_rows, (size_t)S * sizeof(int32_t));
    if (rc < 0)
        return rc;
    int32_t *last = c->att_rows.p;
    for (int64_t s = 0; s < S; s++)
        last[s] = -1;
    for (int64_t t = 0; t < T; t++) {
        const int32_t slot = seq ? seq[t] : 0, at = pos[t];
        if (slot < 0 || slot >= S)
            return c->host->error(RLX_E_RANGE, "%s: node '%s': row %lld: slot %d is outside the cache's %lld slots",
                                  c->plugin, name, (long long)t, slot, (long long)S);
        if (at < 0 || at >= C)
            return c->host->error(RLX_E_RANGE,
                                  "%s: node '%s': row %lld: position %d is outside the KV cache of %lld positions",
                                  c->plugin, name, (long long)t, at, (long long)C);
        if (at <= last[slot])
            return c->host->error(RLX_E_INVALID,
                                  "%s: node '%s': row %lld: position %d of slot %d does not follow position %d of an "
                                  "earlier row (a slot's rows take strictly increasing positions)",
                                  c->plugin, name, (long long)t, at, slot, last[slot]);
        last[slot] = at;
    }
    return RLX_OK;
}

int kern_att_begin(kern_ctx *c, const rlx_node_view *n, kern_att *a) {
    const rlx_tensor *in = n->inputs;
    const rlx_op_params *p = n->params;
    const rlx_tensor *kc = &in[4];
    const int64_t T = rlx_iface_rows(&in[0]), D = p->head_dim, kv = (int64_t)p->n_kv_heads * D;
    const int64_t S = kc->n_dims == 3 ? kc->shape[0] : 1, C = kc->shape[kc->n_dims - 2];
    memset(a, 0, sizeof *a);
    if (T == 0)
        return RLX_OK;
    int rc = kern_att_rows_ok(c, n, S, C);
    if (rc < 0)
        return rc;
    const int32_t *pos = in[3].data, *seq = n->n_inputs > 6 ? in[6].data : NULL;
    const int dt = (int)kc->dtype;
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = ((seq ? seq[t] : 0) * C + pos[t]) * kv;
        const float *k = (const float *)in[1].data + t * kv, *v = (const float *)in[2].data + t * kv;
        if (dt == RLX_DTYPE_Q8_0) {
            rlx_block_q8_0 *kb = (rlx_block_q8_0 *)kc->data + row / RLX_QK,
                           *vb = (rlx_block_q8_0 *)in[5].data + row / RLX_QK;
            for (int64_t b = 0; b < kv / RLX_QK; b++) {
                rlx_iface_quant_q8_0(k + b * RLX_QK, kb + b);
                rlx_iface_quant_q8_0(v + b * RLX_QK, vb + b);
            }
        } else if (dt == RLX_DTYPE_F16) {
            c->k->to_f16(k, (uint16_t *)kc->data + row, kv);
            c->k->to_f16(v, (uint16_t *)in[5].data + row, kv);
        } else {
            memcpy((float *)kc->data + row, k, (size_t)kv * sizeof(float));
            memcpy((float *)in[5].data + row, v, (size_t)kv * sizeof(float));
        }
    }
    *a = (kern_att){.q = in[0].data,
                    .pos = pos,
                    .seq = seq,
                    .kc = kc->data,
                    .vc = in[5].data,
                    .dt = dt,
                    .out = n->output->data,
                    .T = T,
                    .D = D,
                    .Hq = p->n_heads,
                    .Hkv = p->n_kv_heads,
                    .C = C,
                    .window = p->window,
                    .scale = p->scale};
    return RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// Tasks. Two shapes, one arithmetic: a block of many queries is a task per KV head, walking its
// chunks in order (each chunk's keys and values of the head gathered contiguously first) and
// folding each into the outputs as it goes; a block of one or two queries (decode) is a task
// per KERN_ATT_SPLIT_CHUNKS chunks over every head, whose (m, s, o) per chunk are kept and
// folded in chunk order afterwards, so a long context spreads across threads. Decode chunks are
// read in sub-blocks of KERN_ATT_SUB keys for every head at once: a cache row (Hkv*D values) is
// read whole, as the older split-keys kernel read it. Which shape a block takes changes no bit.

/* Keys per sub-block of a decode chunk. */
#define KERN_ATT_SUB 16
/* Blocks of at most this many queries take the decode shape. */
#define KERN_ATT_SPLIT_ROWS 2
/* Chunks per decode-shape task, read as one stream (each still a result of its own). */
#define KERN_ATT_SPLIT_CHUNKS 4

/* A block: rows [t0, t0 + nq) of one slot, at increasing positions; together they see cache
 * rows [lo, hi) of the slot. A decode-shape block keeps its chunks' results at part. */
typedef struct kern_att_block {
    int64_t t0, nq, lo, hi;
    int64_t c_first, n_chunks; /* chunks: [c_first, c_first + n_chunks) * KERN_ATT_CHUNK */
    float *part;               /* decode shape: [n_chunks][nq * Hq][D + 2] (o, m, s), else NULL */
} kern_att_block;

/* A task: block `block`, and its KV head (many queries) or its chunks from index *
 * KERN_ATT_SPLIT_CHUNKS on (decode shape). */
typedef struct kern_att_task {
    int64_t block, index;
} kern_att_task;

typedef struct kern_att_job {
    const kern_ctx *c;
    const kern_att *a;
    const kern_att_block *blocks;
    const kern_att_task *tasks;
    int64_t n_tasks, rows_max; /* query rows of a task: query heads (per KV head, or all of them)
                                * times queries */
    const int64_t *merges;     /* decode-shape blocks, for the fold after the tasks */
} kern_att_job;

/* Byte offsets of a task's buffers in its thread's scratch: scores [rows_max, KERN_ATT_CHUNK],
 * running maxima and sums [rows_max], a chunk's outputs [group, D], query and output row
 * pointers [rows_max], and one KV head's keys and values of a chunk [KERN_ATT_CHUNK, D] each. */
typedef struct kern_att_layout {
    size_t mx, sum, oc, qp, op, kp, vp, total;
} kern_att_layout;

static kern_att_layout kern_att_sizes(const kern_att_job *j) {
    const size_t rows = (size_t)j->rows_max, group = (size_t)(j->a->Hq / j->a->Hkv), D = (size_t)j->a->D;
    const size_t panel = kern_align_up((size_t)kern_kv_bytes(j->a->dt, KERN_ATT_CHUNK * (int64_t)D));
    kern_att_layout l;
    l.mx = kern_align_up(rows * KERN_ATT_CHUNK * sizeof(float));
    l.sum = l.mx + kern_align_up(rows * sizeof(float));
    l.oc = l.sum + kern_align_up(rows * sizeof(float));
    l.qp = l.oc + kern_align_up(group * D * sizeof(float));
    l.op = l.qp + kern_align_up(rows * sizeof(float *));
    l.kp = l.op + kern_align_up(rows * sizeof(float *));
    l.vp = l.kp + panel;
    l.total = l.vp + panel;
    return l;
}

/* Rows [0, n) of one head's slice of a cache (rows ld bytes apart), as n contiguous rows of
 * row bytes (a head's D values): the same values, read many times from a few pages instead of
 * one page per key. */
static void kern_att_gather(const char *src, int64_t ld, int64_t n, int64_t row, char *dst) {
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * row, src + i * ld, (size_t)row);
}

/* Folds a chunk's maximum m, sum s and outputs o[D] into a query head's running mx, sum and
 * out[D]; the same operations in the same order for every query. */
static void kern_att_fold(const kern_simd *k, float *mx, float *sum, float *out, float m, float s, const float *o,
                          int64_t D) {
    const float top = m > *mx ? m : *mx, keep = expf(*mx - top), add = expf(m - top);
    *sum = *sum * keep + s * add;
    k->scal(keep, out, D);
    k->axpy(add, o, out, D);
    *mx = top;
}

/* The queries of block b meeting chunk [c0, c1): [*ta, *tb) from *ta on (positions and first
 * keys increase through a block), and the union of their keys in it, [*k0, *k1). False when
 * there are none (a gap between windows). */
static bool kern_att_active(const kern_att *a, const kern_att_block *b, int64_t c0, int64_t c1, int64_t *ta,
                            int64_t *tb, int64_t *k0, int64_t *k1) {
    while (*ta < b->nq && a->pos[b->t0 + *ta] < c0)
        ++*ta;
    *tb = *ta;
    while (*tb < b->nq && kern_att_first(a, b->t0 + *tb) < c1)
        ++*tb;
    if (*tb == *ta)
        return false;
    const int64_t first = kern_att_first(a, b->t0 + *ta), last = a->pos[b->t0 + *tb - 1] + 1;
    *k0 = first > c0 ? first : c0;
    *k1 = last < c1 ? last : c1;
    return true;
}

/* Query t's keys in chunk [c0, c1), chunk-local: [*lo, *hi). */
static void kern_att_keys(const kern_att *a, int64_t t, int64_t c0, int64_t c1, int64_t *lo, int64_t *hi) {
    const int64_t first = kern_att_first(a, t), last = a->pos[t] + 1;
    *lo = (first > c0 ? first : c0) - c0;
    *hi = (last < c1 ? last : c1) - c0;
}

/* Many queries: block b, KV head kvh, every chunk in order. */
static void kern_att_heads(const kern_att_job *j, char *buf, const kern_att_block *b, int64_t kvh) {
    const kern_att *a = j->a;
    const kern_simd *k = j->c->k;
    const kern_att_layout l = kern_att_sizes(j);
    const int64_t D = a->D, ldq = a->Hq * D, ldk = a->Hkv * D, group = a->Hq / a->Hkv, rows = group * b->nq;
    const int dt = a->dt;
    float *sc = (float *)buf, *mx = (float *)(buf + l.mx), *sum = (float *)(buf + l.sum), *oc = (float *)(buf + l.oc);
    const float **qp = (const float **)(buf + l.qp);
    float **op = (float **)(buf + l.op);
    /* row r is query t0 + r / group, head kvh * group + r % group: a query's heads are adjacent,
     * as they share its keys in P V */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = b->t0 + r / group, h = kvh * group + r % group;
        qp[r] = a->q + t * ldq + h * D;
        op[r] = a->out + t * ldq + h * D;
        sum[r] = 0.0f; /* no chunk yet: every chunk adds at least exp(0) */
        memset(op[r], 0, (size_t)D * sizeof(float));
    }
    float *cp[64]; /* group <= 64: checked by kern_att_run */
    for (int64_t g = 0; g < group; g++)
        cp[g] = oc + g * D;
    const int64_t slot = a->seq ? a->seq[b->t0] : 0;
    const char *kb = (const char *)a->kc + kern_kv_bytes(dt, slot * a->C * ldk + kvh * D);
    const char *vb = (const char *)a->vc + kern_kv_bytes(dt, slot * a->C * ldk + kvh * D);
    int64_t ta = 0, tb, k0, k1;
    for (int64_t ci = 0; ci < b->n_chunks; ci++) {
        const int64_t c0 = (b->c_first + ci) * KERN_ATT_CHUNK,
                      c1 = c0 + KERN_ATT_CHUNK < b->hi ? c0 + KERN_ATT_CHUNK : b->hi;
        if (!kern_att_active(a, b, c0, c1, &ta, &tb, &k0, &k1))
            continue;
        /* the chunk's keys and values of this head, contiguous (column j is cache row k0 + j) */
        char *kp = buf + l.kp, *vp = buf + l.vp;
        kern_att_gather(kb + kern_kv_bytes(dt, k0 * ldk), kern_kv_bytes(dt, ldk), k1 - k0, kern_kv_bytes(dt, D), kp);
        kern_att_gather(vb + kern_kv_bytes(dt, k0 * ldk), kern_kv_bytes(dt, ldk), k1 - k0, kern_kv_bytes(dt, D), vp);
        /* scores in chunk-local columns: a query's softmax lanes start where its keys do */
        k->att_qk(dt, qp + ta * group, (tb - ta) * group, kp, vp, D, k1 - k0, D, a->scale, sc + (k0 - c0),
                  KERN_ATT_CHUNK);
        for (int64_t t = ta; t < tb; t++) {
            int64_t lo, hi;
            kern_att_keys(a, b->t0 + t, c0, c1, &lo, &hi);
            const int64_t r0 = t * group;
            float *p = sc + (r0 - ta * group) * KERN_ATT_CHUNK;
            float m[64], s[64];
            for (int64_t g = 0; g < group; g++)
                s[g] = k->softmax(p + g * KERN_ATT_CHUNK, hi, lo, hi, &m[g]);
            const bool first_chunk = sum[r0] == 0.0f;
            if (!first_chunk)
                memset(oc, 0, (size_t)(group * D) * sizeof(float));
            k->att_pv(dt, p + lo, KERN_ATT_CHUNK, group, vp + kern_kv_bytes(dt, (c0 + lo - k0) * D), D, hi - lo, D,
                      first_chunk ? op + r0 : cp);
            for (int64_t g = 0; g < group; g++) {
                if (first_chunk) {
                    mx[r0 + g] = m[g];
                    sum[r0 + g] = s[g];
                } else {
                    kern_att_fold(k, &mx[r0 + g], &sum[r0 + g], op[r0 + g], m[g], s[g], cp[g], D);
                }
            }
        }
    }
    for (int64_t r = 0; r < rows; r++)
        k->scal(1.0f / sum[r], op[r], D);
}

/* Brings [p, p + bytes), whole cache rows of every head, into the caches ahead of a decode
 * chunk's use: keys into L1 (used right away), values into L2 (used after the chunk's softmax). */
static void kern_att_prefetch(const char *p, int64_t bytes, bool l1) {
    for (int64_t b = 0; b < bytes; b += 64)
        if (l1)
            _mm_prefetch(p + b, _MM_HINT_T0);
        else
            _mm_prefetch(p + b, _MM_HINT_T1);
}

/* Decode shape: block b, chunk ci, every head; (o, m, s) of each query head into b->part (s = 0
 * for a query the chunk does not meet). */
static void kern_att_chunk(const kern_att_job *j, char *buf, const kern_att_block *b, int64_t ci, bool more) {
    const kern_att *a = j->a;
    const kern_simd *k = j->c->k;
    const kern_att_layout l = kern_att_sizes(j);
    const int64_t D = a->D, Hq = a->Hq, Hkv = a->Hkv, ldq = Hq * D, ldk = Hkv * D, group = Hq / Hkv;
    const int dt = a->dt;
    float *sc = (float *)buf, *part = b->part + ci * b->nq * Hq * (D + 2);
    const float **qp = (const float **)(buf + l.qp);
    float **op = (float **)(buf + l.op);
    const int64_t c0 = (b->c_first + ci) * KERN_ATT_CHUNK,
                  c1 = c0 + KERN_ATT_CHUNK < b->hi ? c0 + KERN_ATT_CHUNK : b->hi;
    for (int64_t r = 0; r < b->nq * Hq; r++)
        part[r * (D + 2) + D + 1] = 0.0f;
    int64_t ta = 0, tb, k0, k1;
    if (!kern_att_active(a, b, c0, c1, &ta, &tb, &k0, &k1))
        return;
    /* rows by KV head, then query, then head of the group: row kvh * rows_h + (t - ta) * group + g */
    const int64_t rows_h = (tb - ta) * group;
    for (int64_t kvh = 0; kvh < Hkv; kvh++)
        for (int64_t t = ta; t < tb; t++)
            for (int64_t g = 0; g < group; g++) {
                const int64_t r = kvh * rows_h + (t - ta) * group + g, h = kvh * group + g;
                qp[r] = a->q + (b->t0 + t) * ldq + h * D;
                op[r] = part + (t * Hq + h) * (D + 2);
                memset(op[r], 0, (size_t)D * sizeof(float));
            }
    const int64_t slot = a->seq ? a->seq[b->t0] : 0;
    const char *kb = (const char *)a->kc + kern_kv_bytes(dt, slot * a->C * ldk);
    const char *vb = (const char *)a->vc + kern_kv_bytes(dt, slot * a->C * ldk);
    const int64_t row_bytes = kern_kv_bytes(dt, ldk);
    if (ci % KERN_ATT_SPLIT_CHUNKS == 0) /* a task's first chunk; the others were fetched ahead */
        kern_att_prefetch(kb + k0 * row_bytes, (k1 - k0 < KERN_ATT_SUB ? k1 - k0 : KERN_ATT_SUB) * row_bytes, true);
    for (int64_t j0 = k0; j0 < k1; j0 += KERN_ATT_SUB) {
        const int64_t n = k1 - j0 < KERN_ATT_SUB ? k1 - j0 : KERN_ATT_SUB;
        /* the next sub-block's keys, of this chunk or (more) the task's next one */
        const int64_t end = more && j0 + n == k1 ? (c1 + KERN_ATT_SUB < b->hi ? c1 + KERN_ATT_SUB : b->hi) : k1;
        const int64_t next = end - j0 - n < KERN_ATT_SUB ? end - j0 - n : KERN_ATT_SUB;
        for (int64_t kvh = 0; kvh < Hkv; kvh++) {
            /* whole rows, spread over the heads' calls: the next keys, and these values for P V */
            const int64_t bytes = (next * row_bytes + Hkv - 1) / Hkv, vbytes = (n * row_bytes + Hkv - 1) / Hkv;
            if (next > 0)
                kern_att_prefetch(kb + (j0 + n) * row_bytes + kvh * bytes, bytes, true);
            kern_att_prefetch(vb + j0 * row_bytes + kvh * vbytes, vbytes, false);
            k->att_qk(dt, qp + kvh * rows_h, rows_h, kb + kern_kv_bytes(dt, j0 * ldk + kvh * D),
                      vb + kern_kv_bytes(dt, j0 * ldk + kvh * D), ldk, n, D, a->scale,
                      sc + kvh * rows_h * KERN_ATT_CHUNK + (j0 - c0), KERN_ATT_CHUNK);
        }
    }
    for (int64_t kvh = 0; kvh < Hkv; kvh++)
        for (int64_t t = ta; t < tb; t++) {
            int64_t lo, hi;
            kern_att_keys(a, b->t0 + t, c0, c1, &lo, &hi);
            for (int64_t g = 0; g < group; g++) {
                const int64_t r = kvh * rows_h + (t - ta) * group + g;
                float *o = op[r];
                o[D + 1] = k->softmax(sc + r * KERN_ATT_CHUNK, hi, lo, hi, &o[D]);
            }
        }
    for (int64_t j0 = k0; j0 < k1; j0 += KERN_ATT_SUB) {
        const int64_t j1 = k1 - j0 < KERN_ATT_SUB ? k1 : j0 + KERN_ATT_SUB;
        for (int64_t kvh = 0; kvh < Hkv; kvh++)
            for (int64_t t = ta; t < tb; t++) {
                int64_t lo, hi;
                kern_att_keys(a, b->t0 + t, c0, c1, &lo, &hi);
                lo = lo + c0 > j0 ? lo + c0 : j0; /* absolute, within the sub-block */
                hi = hi + c0 < j1 ? hi + c0 : j1;
                if (lo >= hi)
                    continue;
                const int64_t r = kvh * rows_h + (t - ta) * group;
                k->att_pv(dt, sc + r * KERN_ATT_CHUNK + (lo - c0), KERN_ATT_CHUNK, group,
                          vb + kern_kv_bytes(dt, lo * ldk + kvh * D), ldk, hi - lo, D, op + r);
            }
    }
}

static void kern_att_range(void *ctx, int ith, int64_t i0, int64_t i1) {
    const kern_att_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        const kern_att_task *t = &j->tasks[i];
        const kern_att_block *b = &j->blocks[t->block];
        if (b->part)
            for (int64_t ci = t->index * KERN_ATT_SPLIT_CHUNKS;
                 ci < b->n_chunks && ci < (t->index + 1) * KERN_ATT_SPLIT_CHUNKS; ci++)
                kern_att_chunk(j, j->c->att[ith].p, b, ci,
                               ci + 1 < b->n_chunks && ci + 1 < (t->index + 1) * KERN_ATT_SPLIT_CHUNKS);
        else
            kern_att_heads(j, j->c->att[ith].p, b, t->index);
    }
}

/* Decode-shape blocks: each query head's chunks folded in chunk order, as kern_att_heads folds
 * them, into its output. */
static void kern_att_merge(void *ctx, int ith, int64_t i0, int64_t i1) {
    const kern_att_job *j = ctx;
    const kern_att *a = j->a;
    const int64_t D = a->D, Hq = a->Hq, stride = Hq * (D + 2);
    (void)ith;
    for (int64_t i = i0; i < i1; i++) {
        const kern_att_block *b = &j->blocks[j->merges[i]];
        for (int64_t r = 0; r < b->nq * Hq; r++) {
            float *out = a->out + (b->t0 + r / Hq) * Hq * D + r % Hq * D, mx = 0.0f, sum = 0.0f;
            for (int64_t ci = 0; ci < b->n_chunks; ci++) {
                const float *o = b->part + ci * b->nq * stride + r * (D + 2);
                if (o[D + 1] == 0.0f) /* the chunk does not meet this query */
                    continue;
                if (sum == 0.0f) {
                    memcpy(out, o, (size_t)D * sizeof(float));
                    mx = o[D];
                    sum = o[D + 1];
                } else {
                    kern_att_fold(j->c->k, &mx, &sum, out, o[D], o[D + 1], o, D);
                }
            }
            j->c->k->scal(1.0f / sum, out, D);
        }
    }
}

int kern_att_run(kern_ctx *c, const kern_att *a) {
    const int64_t T = a->T, D = a->D, Hq = a->Hq, Hkv = a->Hkv, group = Hq / Hkv;
    if (T == 0)
        return RLX_OK;
    if (group > 64)
        return c->host->error(RLX_E_UNSUPPORTED, "%s: attention with %lld query heads per KV head (at most 64)",
                              c->plugin, (long long)group);
    /* blocks: runs of consecutive rows of one slot, at most KERN_ATT_TQ each; at most T blocks
     * and T * max(Hkv, chunks of the cache) tasks */
    const int64_t max_chunks = (a->C + KERN_ATT_CHUNK - 1) / KERN_ATT_CHUNK;
    const size_t blocks_bytes = kern_align_up((size_t)T * sizeof(kern_att_block));
    const size_t tasks_bytes =
        kern_align_up((size_t)(T * (Hkv > max_chunks ? Hkv : max_chunks)) * sizeof(kern_att_task));
    const size_t merges_bytes = kern_align_up((size_t)T * sizeof(int64_t));
    int rc = kern_reserve(c, &c->att_rows, blocks_bytes + tasks_bytes + merges_bytes);
    if (rc < 0)
        return rc;
    kern_att_block *blocks = c->att_rows.p;
    kern_att_task *tasks = (kern_att_task *)((char *)c->att_rows.p + blocks_bytes);
    int64_t *merges = (int64_t *)((char *)c->att_rows.p + blocks_bytes + tasks_bytes);
    int64_t n_blocks = 0, work = 0;
    for (int64_t t = 0; t < T; t++) {
        kern_att_block *b = n_blocks ? &blocks[n_blocks - 1] : NULL;
        if (!b || b->nq == KERN_ATT_TQ || (a->seq && a->seq[t] != a->seq[b->t0])) {
            b = &blocks[n_blocks++];
            *b = (kern_att_block){.t0 = t, .lo = kern_att_first(a, t)};
        }
        b->nq++;
        b->hi = a->pos[t] + 1;
        work += (b->hi - kern_att_first(a, t)) * Hq * D;
    }
    /* the decode shape's partial results, one buffer for all its blocks */
    size_t part_floats = 0;
    for (int64_t i = 0; i < n_blocks; i++) {
        kern_att_block *b = &blocks[i];
        b->c_first = b->lo / KERN_ATT_CHUNK;
        b->n_chunks = (b->hi - 1) / KERN_ATT_CHUNK - b->c_first + 1;
        if (b->nq <= KERN_ATT_SPLIT_ROWS)
            part_floats += (size_t)(b->n_chunks * b->nq * Hq * (D + 2));
    }
    if (part_floats && (rc = kern_reserve(c, &c->att_parts, part_floats * sizeof(float))) < 0)
        return rc;
    int64_t n_tasks = 0, n_merges = 0, rows_max = 0;
    size_t at = 0;
    for (int64_t i = n_blocks - 1; i >= 0; i--) { /* late blocks, usually the longer ones, first */
        kern_att_block *b = &blocks[i];
        if (b->nq <= KERN_ATT_SPLIT_ROWS) {
            b->part = (float *)c->att_parts.p + at;
            at += (size_t)(b->n_chunks * b->nq * Hq * (D + 2));
            for (int64_t g = 0; g * KERN_ATT_SPLIT_CHUNKS < b->n_chunks; g++)
                tasks[n_tasks++] = (kern_att_task){.block = i, .index = g};
            merges[n_merges++] = i;
            rows_max = b->nq * Hq > rows_max ? b->nq * Hq : rows_max;
        } else {
            b->part = NULL;
            for (int64_t h = 0; h < Hkv; h++)
                tasks[n_tasks++] = (kern_att_task){.block = i, .index = h};
            rows_max = b->nq * group > rows_max ? b->nq * group : rows_max;
        }
    }
    kern_att_job j = {
        .c = c, .a = a, .blocks = blocks, .tasks = tasks, .n_tasks = n_tasks, .rows_max = rows_max, .merges = merges};
    if ((rc = kern_reserve_each(c, c->att, kern_att_sizes(&j).total)) < 0)
        return rc;
    c->par.parallel_tasks(c->par.self, n_tasks, work, kern_att_range, &j);
    if (n_merges)
        c->par.parallel_for(c->par.self, n_merges, 1, (int64_t)part_floats, kern_att_merge, &j);
    return RLX_OK;
}

int kern_op_attention(kern_ctx *c, const rlx_node_view *n) {
    kern_att a;
    const int rc = kern_att_begin(c, n, &a);
    return rc < 0 ? rc : kern_att_run(c, &a);
}
