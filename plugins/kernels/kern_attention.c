/* ATTENTION in the kernel library: the cache update every backend does first, then two ways to
 * compute it, all in F32 like the reference. Split keys (flash-decoding) is for a single query:
 * its cache rows are cut into parts across the threads, each read whole and in order for all
 * heads. Panels take one task per (KV head, block of queries), taken dynamically, late (longer)
 * blocks first: a task scores all query heads of its KV head against the cache rows the block
 * can see, softmaxes each row and multiplies by V. Prefill tasks read keys from panels
 * (att_pack) made once per KV head and call, shared by all blocks; decode tasks, with a row or
 * two per key, read the cache directly. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kern.h"

/* Split keys: cache rows ahead of use to prefetch. A head's rows are Hkv*D floats apart (4 KiB
 * for Qwen3), so each starts a new page, where hardware prefetchers stop. */
#define KERN_SPLIT_AHEAD 6
/* Split keys: the fewest cache rows of a part. */
#define KERN_SPLIT_MIN_ROWS 32
/* Panels: queries per task. */
#define KERN_PANEL_TQ 16
/* Panels: tasks with at most this many query rows score keys straight from the cache. */
#define KERN_PANEL_DIRECT_ROWS 4

int kern_att_begin(kern_ctx *c, const rlx_node_view *n, kern_att *a) {
    const rlx_tensor *in = n->inputs;
    const rlx_op_params *p = n->params;
    const int64_t T = rlx_iface_rows(&in[0]), C = rlx_iface_rows(&in[4]);
    const int64_t D = p->head_dim, Hkv = p->n_kv_heads, kv = Hkv * D;
    const int32_t *pos = in[3].data;
    memset(a, 0, sizeof *a);
    if (T == 0)
        return RLX_OK;
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t t = 0; t < T; t++) {
        if (pos[t] < 0 || pos[t] >= C)
            return c->host->error(RLX_E_RANGE, "%s: node '%s': position %d of token %lld outside the cache [0, %lld)",
                                  c->plugin, n->name ? n->name : "?", pos[t], (long long)t, (long long)C);
        lo = pos[t] < lo ? pos[t] : lo;
        hi = pos[t] + 1 > hi ? pos[t] + 1 : hi;
    }
    float *kc = in[4].data, *vc = in[5].data;
    for (int64_t t = 0; t < T; t++) {
        memcpy(kc + pos[t] * kv, (const float *)in[1].data + t * kv, (size_t)kv * sizeof(float));
        memcpy(vc + pos[t] * kv, (const float *)in[2].data + t * kv, (size_t)kv * sizeof(float));
    }
    const int64_t first = p->window > 0 ? lo - (int64_t)p->window + 1 : 0;
    *a = (kern_att){.q = in[0].data,
                    .pos = pos,
                    .kc = kc,
                    .vc = vc,
                    .out = n->output->data,
                    .T = T,
                    .D = D,
                    .Hq = p->n_heads,
                    .Hkv = Hkv,
                    .window = p->window,
                    .first = first > 0 ? first : 0,
                    .hi = hi,
                    .scale = p->scale};
    return RLX_OK;
}

int64_t kern_att_lo(const kern_att *a, int64_t t) {
    const int64_t lo = a->window > 0 ? (int64_t)a->pos[t] - a->window + 1 : 0;
    return lo > 0 ? lo : 0;
}

// ---------------------------------------------------------------------------------------------
// Split keys

/* Part i covers cache rows [lo + i * rows, ...) of the nk visible ones and leaves in
 * part[i] = {max[Hq], sum[Hq], out[Hq, D]} its per-head results. */
typedef struct kern_split_job {
    const kern_ctx *c;
    const kern_att *a;
    int64_t lo, nk, rows;
    float *part;
} kern_split_job;

static inline void kern_prefetch(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16)
        _mm_prefetch((const char *)(p + i), _MM_HINT_T0);
}

static void kern_split_part(const kern_split_job *d, float *sc, int64_t part) {
    const kern_att *a = d->a;
    const kern_simd *k = d->c->k;
    const int64_t D = a->D, Hq = a->Hq, ldk = a->Hkv * D, group = Hq / a->Hkv;
    const int64_t j0 = d->lo + part * d->rows, n = d->lo + d->nk - j0 < d->rows ? d->lo + d->nk - j0 : d->rows;
    float *mx = d->part + part * Hq * (D + 2), *sum = mx + Hq, *out = sum + Hq;
    for (int64_t j = 0; j < n; j++) {
        const float *kr = a->kc + (j0 + j) * ldk;
        if (j + KERN_SPLIT_AHEAD < n)
            kern_prefetch(kr + KERN_SPLIT_AHEAD * ldk, ldk);
        for (int64_t h = 0; h < Hq; h++)
            sc[h * n + j] = k->dot(a->q + h * D, kr + h / group * D, D) * a->scale;
    }
    for (int64_t h = 0; h < Hq; h++)
        sum[h] = k->softmax(sc + h * n, n, 0, n, &mx[h]);
    memset(out, 0, (size_t)(Hq * D) * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        const float *vr = a->vc + (j0 + j) * ldk;
        if (j + KERN_SPLIT_AHEAD < n)
            kern_prefetch(vr + KERN_SPLIT_AHEAD * ldk, ldk);
        for (int64_t h = 0; h < Hq; h++)
            k->axpy(sc[h * n + j], vr + h / group * D, out + h * D, D);
    }
}

static void kern_split_range(void *ctx, int ith, int64_t i0, int64_t i1) {
    const kern_split_job *d = ctx;
    for (int64_t i = i0; i < i1; i++)
        kern_split_part(d, d->c->att[ith].p, i);
}

int kern_att_split_keys(kern_ctx *c, const kern_att *a) {
    const kern_simd *k = c->k;
    const int64_t D = a->D, Hq = a->Hq, lo = kern_att_lo(a, 0), nk = a->pos[0] + 1 - lo;
    /* about four parts per thread, so a slow thread delays little */
    const int64_t per = 4 * (int64_t)c->par.n_threads, want = (nk + per - 1) / per;
    const int64_t rows = want < KERN_SPLIT_MIN_ROWS ? KERN_SPLIT_MIN_ROWS : want, n_parts = (nk + rows - 1) / rows;
    int rc;
    if ((rc = kern_reserve(c, &c->parts, (size_t)(n_parts * Hq * (D + 2)) * sizeof(float))) < 0 ||
        (rc = kern_reserve_each(c, c->att, (size_t)(Hq * rows) * sizeof(float))) < 0)
        return rc;
    float *part = c->parts.p;
    kern_split_job d = {.c = c, .a = a, .lo = lo, .nk = nk, .rows = rows, .part = part};
    c->par.parallel_tasks(c->par.self, n_parts, nk * Hq * D, kern_split_range, &d);
    /* out = sum_c e^(max_c - max) out_c / sum_c e^(max_c - max) sum_c */
    for (int64_t h = 0; h < Hq; h++) {
        float m = part[h];
        for (int64_t i = 1; i < n_parts; i++)
            m = part[i * Hq * (D + 2) + h] > m ? part[i * Hq * (D + 2) + h] : m;
        float *oh = a->out + h * D, total = 0.0f;
        memset(oh, 0, (size_t)D * sizeof(float));
        for (int64_t i = 0; i < n_parts; i++) {
            const float *pc = part + i * Hq * (D + 2);
            const float f = expf(pc[h] - m);
            total += f * pc[Hq + h];
            k->axpy(f, pc + 2 * Hq + h * D, oh, D);
        }
        k->scal(1.0f / total, oh, D);
    }
    return RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// Panels

typedef struct kern_panel_job {
    const kern_ctx *c;
    const kern_att *a;
    float *panels;    /* [Hkv][np, D] keys from cache row a->first on, or NULL (direct) */
    int64_t np;       /* keys per KV head in panels: the visible range, in whole panels */
    int64_t rows_max; /* query rows of a task: query heads per KV head times queries per block */
    int64_t lds;      /* score row stride: the widest key range of a block, in whole panels */
    int64_t n_blocks;
} kern_panel_job;

/* Byte offsets of a task's buffers in its thread's scratch: scores [rows_max, lds], 1 / softmax
 * sums [rows_max], then query and output row pointers. */
typedef struct kern_panel_layout {
    size_t inv, qp, op, total;
} kern_panel_layout;

static kern_panel_layout kern_panel_sizes(const kern_panel_job *j) {
    kern_panel_layout l;
    const size_t rows = (size_t)j->rows_max;
    l.inv = kern_align_up(rows * (size_t)j->lds * sizeof(float));
    l.qp = l.inv + kern_align_up(rows * sizeof(float));
    l.op = l.qp + kern_align_up(rows * sizeof(float *));
    l.total = l.op + kern_align_up(rows * sizeof(float *));
    return l;
}

static void kern_panel_task(const kern_panel_job *j, char *buf, int64_t kvh, int64_t blk) {
    const kern_att *a = j->a;
    const kern_simd *k = j->c->k;
    const kern_panel_layout l = kern_panel_sizes(j);
    const int64_t D = a->D, t0 = blk * KERN_PANEL_TQ;
    const int64_t nq = a->T - t0 < KERN_PANEL_TQ ? a->T - t0 : KERN_PANEL_TQ;
    const int64_t ldq = a->Hq * D, ldk = a->Hkv * D, group = a->Hq / a->Hkv, rows = group * nq;
    float *sc = (float *)buf, *inv = (float *)(buf + l.inv);
    const float **qp = (const float **)(buf + l.qp);
    float **op = (float **)(buf + l.op);
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t t = t0; t < t0 + nq; t++) {
        const int64_t first = kern_att_lo(a, t);
        lo = first < lo ? first : lo;
        hi = a->pos[t] + 1 > hi ? a->pos[t] + 1 : hi;
    }
    /* row r is query t0 + r % nq of query head kvh * group + r / nq */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t h = kvh * group + r / nq, t = t0 + r % nq;
        qp[r] = a->q + t * ldq + h * D;
        op[r] = a->out + t * ldq + h * D;
    }
    if (j->panels) {
        /* start at a panel boundary; the extra keys before lo are masked below */
        lo = a->first + (lo - a->first) / k->att_pw * k->att_pw;
        k->att_qk(qp, rows, j->panels + (kvh * j->np + lo - a->first) * D, hi - lo, D, a->scale, sc, j->lds);
    } else {
        for (int64_t r = 0; r < rows; r += 2)
            k->att_qk_direct(qp + r, rows - r < 2 ? rows - r : 2, a->kc + lo * ldk + kvh * D, ldk, hi - lo, D, a->scale,
                             sc + r * j->lds, j->lds);
    }
    const int64_t nk = hi - lo;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t t = t0 + r % nq;
        inv[r] = 1.0f / k->softmax(sc + r * j->lds, nk, kern_att_lo(a, t) - lo, a->pos[t] + 1 - lo, NULL);
    }
    k->att_pv(sc, j->lds, rows, a->vc + lo * ldk + kvh * D, ldk, nk, D, op, inv);
}

static void kern_panel_pack_range(void *ctx, int ith, int64_t h0, int64_t h1) {
    const kern_panel_job *j = ctx;
    const kern_att *a = j->a;
    const int64_t D = a->D, kv = a->Hkv * D;
    (void)ith;
    for (int64_t h = h0; h < h1; h++)
        j->c->k->att_pack(a->kc + a->first * kv + h * D, kv, a->hi - a->first, D, j->panels + h * j->np * D);
}

static void kern_panel_range(void *ctx, int ith, int64_t i0, int64_t i1) {
    const kern_panel_job *j = ctx;
    const int64_t Hkv = j->a->Hkv;
    for (int64_t i = i0; i < i1; i++)
        kern_panel_task(j, j->c->att[ith].p, i % Hkv, j->n_blocks - 1 - i / Hkv);
}

int kern_att_panels(kern_ctx *c, const kern_att *a) {
    const int64_t T = a->T, Hkv = a->Hkv;
    /* Every query sees at most cache rows [first, hi), which bounds a block's score rows (plus
     * the alignment of its start to a panel boundary). */
    const int64_t pw = c->k->att_pw, np = (a->hi - a->first + pw - 1) / pw * pw;
    kern_panel_job j = {.c = c,
                        .a = a,
                        .np = np,
                        .rows_max = a->Hq / Hkv * (T < KERN_PANEL_TQ ? T : KERN_PANEL_TQ),
                        .lds = np + pw,
                        .n_blocks = (T + KERN_PANEL_TQ - 1) / KERN_PANEL_TQ};
    int rc = kern_reserve_each(c, c->att, kern_panel_sizes(&j).total);
    if (rc < 0)
        return rc;
    const bool packed = j.rows_max > KERN_PANEL_DIRECT_ROWS;
    if (packed && (rc = kern_reserve(c, &c->panels, (size_t)(Hkv * np * a->D) * sizeof(float))) < 0)
        return rc;
    j.panels = packed ? c->panels.p : NULL;
    /* the packing is decided by the whole job's work, so both run on the same threads */
    const int64_t work = T * (a->hi - a->first) * a->Hq * a->D;
    if (packed)
        c->par.parallel_for(c->par.self, Hkv, 1, work, kern_panel_pack_range, &j);
    c->par.parallel_tasks(c->par.self, j.n_blocks * Hkv, work, kern_panel_range, &j);
    return RLX_OK;
}
