/* Repacked quantized weights (kern_qrp.h): the dispatch to each family of types, and what the
 * backends do with them alike (kern.h): the prepared handle, packing in pieces with the source
 * pages dropped behind, and the matmul over the backend's threads. */
#include "kern_qrp.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kern.h"

const kern_qrp_ops *kern_qrp_ops_at(plugin_isa isa, int dt) {
    const kern_qrp_ops *ops = kern_qrp32_ops_at(isa, dt);
    return ops ? ops : kern_qrpk_ops_at(isa, dt);
}

int kern_qrp_supported(int dt) { return kern_qrp_ops_at(PLUGIN_ISA_C, dt) != NULL; }

void kern_qrp_pack(int dt, const void *w, int64_t K, int64_t g0, int64_t g1, void *dst) {
    if (!kern_qrp32_pack(dt, w, K, g0, g1, dst))
        kern_qrpk_pack(dt, w, K, g0, g1, dst);
}

void kern_qrp_unpack(int dt, const void *wp, int64_t K, int64_t n, int64_t b, void *blk) {
    if (!kern_qrp32_unpack(dt, wp, K, n, b, blk))
        kern_qrpk_unpack(dt, wp, K, n, b, blk);
}

// ---------------------------------------------------------------------------------------------
// Backends

void kern_drop_pages(const void *data, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)data, b = a + bytes;
    const uintptr_t lo = (a + page - 1) / page * page, hi = b / page * page;
    if (hi <= lo)
        return;
    /* The page cache may hold the file in 2 MiB folios that a fault maps whole (FilePmdMapped):
     * a later read of a neighbour in the same 2 MiB, even another weight's packing, would map
     * the dropped pages back. Out of huge mappings, the range is mapped page by page from then on
     * and what is dropped stays dropped. Both calls are advice: a failure changes no result. */
    madvise((void *)lo, hi - lo, MADV_NOHUGEPAGE);
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

bool kern_matmul_weight_use(const rlx_weight_info *w) {
    return ((w->op == RLX_OP_MATMUL && w->input == 1) || (w->op == RLX_OP_MOE && w->input >= 2)) &&
           w->tensor->n_dims == 2;
}

bool kern_qrp_use(const rlx_weight_info *w) {
    return kern_matmul_weight_use(w) && kern_qrp_supported((int)w->tensor->dtype) &&
           rlx_iface_row_bytes(w->tensor->dtype, w->tensor->shape[1]) != 0;
}

struct kern_qrp_shared {
    pthread_mutex_t lock;
    kern_qrp_weight **w;
    size_t n, cap;
};

int kern_qrp_shared_init(kern_ctx *c) {
    c->qrp = c->host->alloc(sizeof *c->qrp, KERN_ALIGN);
    if (!c->qrp)
        return c->host->error(RLX_E_NOMEM, "%s: out of memory", c->plugin);
    *c->qrp = (kern_qrp_shared){.w = NULL};
    pthread_mutex_init(&c->qrp->lock, NULL);
    return RLX_OK;
}

void kern_qrp_shared_deinit(kern_ctx *c) {
    if (!c->qrp)
        return;
    pthread_mutex_destroy(&c->qrp->lock);
    c->host->free(c->qrp->w);
    c->host->free(c->qrp);
    c->qrp = NULL;
}

/* A new copy of w's tensor of the given kind (KERN_WEIGHT_QRP or KERN_WEIGHT_BF16), packed in
 * pieces (see kern_prepare_qrp). */
static kern_qrp_weight *kern_qrp_make(const kern_ctx *c, const rlx_weight_info *w, uint32_t kind, bool drop) {
    const rlx_tensor *t = w->tensor;
    const int dt = (int)t->dtype;
    const bool bf16 = kind == KERN_WEIGHT_BF16;
    const int64_t N = t->shape[0], K = t->shape[1];
    const size_t src_bytes = rlx_iface_tensor_bytes(t), row_bytes = rlx_iface_row_bytes(t->dtype, K);
    const size_t bytes = bf16 ? kern_bf16_bytes(N, K) : src_bytes;
    kern_qrp_weight *h = c->host->alloc(sizeof *h, KERN_ALIGN);
    void *data = c->host->alloc(bytes ? bytes : 1, KERN_ALIGN);
    if (!h || !data) {
        c->host->free(h);
        c->host->free(data);
        c->host->error(RLX_E_NOMEM, "%s: out of memory for a repacked copy of '%s' (%zu bytes)", c->plugin, w->name,
                       bytes);
        return NULL;
    }
    *h = (kern_qrp_weight){.base = {.kind = kind},
                           .ops = bf16 ? NULL : kern_qrp_ops_at(c->isa, dt),
                           .q = bf16 ? NULL : c->q,
                           .dt = dt,
                           .N = N,
                           .K = K,
                           .data = data,
                           .src = t->data,
                           .refs = 1};
    /* Pieces of about KERN_QRP_PIECE source bytes, whole groups: with drop, the mapped pages
     * of one piece go as soon as its copy exists, so the weight is never resident twice. The
     * tile copy pads its last group with zero rows; the repacked one keeps the rows after its
     * last whole group native. */
    const int64_t rows = bf16 ? KERN_BF16_ROWS : KERN_QRP_ROWS, G = bf16 ? kern_bf16_groups(N) : N / KERN_QRP_ROWS;
    const int64_t group_bytes = (int64_t)(rows * row_bytes);
    int64_t per = KERN_QRP_PIECE / group_bytes;
    per = per < 1 ? 1 : per;
    for (int64_t g0 = 0; g0 < G; g0 += per) {
        const int64_t g1 = g0 + per < G ? g0 + per : G;
        if (bf16)
            kern_bf16_pack(t->data, N, K, g0, g1, data);
        else
            kern_qrp_pack(dt, t->data, K, g0, g1, data);
        if (drop) {
            const int64_t r1 = g1 * rows < N ? g1 * rows : N;
            kern_drop_pages((const char *)t->data + g0 * group_bytes, (size_t)((r1 - g0 * rows) * (int64_t)row_bytes));
        }
    }
    if (!bf16) {
        const size_t tail = (size_t)G * (size_t)group_bytes;
        memcpy((char *)data + tail, (const char *)t->data + tail, src_bytes - tail);
        if (drop)
            kern_drop_pages((const char *)t->data + tail, src_bytes - tail);
    }
    return h;
}

/* The live copy of tensor t in sh, or NULL; sh->lock held. */
static kern_qrp_weight *kern_qrp_lookup(const kern_qrp_shared *sh, const rlx_tensor *t) {
    for (size_t i = 0; i < sh->n; i++)
        if (sh->w[i]->src == t->data && sh->w[i]->dt == (int)t->dtype && sh->w[i]->N == t->shape[0] &&
            sh->w[i]->K == t->shape[1])
            return sh->w[i];
    return NULL;
}

/* kern_prepare_qrp and kern_prepare_bf16: a copy of the kind shared by every use of a tensor. */
static int kern_prepare_copy(const kern_ctx *c, const rlx_weight_info *w, uint32_t kind, bool drop, void **handle) {
    *handle = NULL;
    const rlx_tensor *t = w->tensor;
    kern_qrp_shared *sh = c->qrp;
    int rc = RLX_OK;
    pthread_mutex_lock(&sh->lock);
    kern_qrp_weight *shared = kern_qrp_lookup(sh, t);
    if (shared) {
        shared->refs++;
        *handle = shared;
        goto out;
    }
    if (sh->n == sh->cap) {
        const size_t cap = sh->cap ? 2 * sh->cap : 64;
        kern_qrp_weight **grown = c->host->alloc(cap * sizeof *grown, KERN_ALIGN);
        if (!grown) {
            rc = c->host->error(RLX_E_NOMEM, "%s: out of memory", c->plugin);
            goto out;
        }
        if (sh->n)
            memcpy(grown, sh->w, sh->n * sizeof *grown);
        c->host->free(sh->w);
        sh->w = grown;
        sh->cap = cap;
    }
    kern_qrp_weight *h = kern_qrp_make(c, w, kind, drop);
    if (!h) {
        rc = RLX_E_NOMEM;
        goto out;
    }
    sh->w[sh->n++] = h;
    *handle = h;
out:
    pthread_mutex_unlock(&sh->lock);
    return rc;
}

int kern_prepare_qrp(const kern_ctx *c, const rlx_weight_info *w, bool drop, void **handle) {
    return kern_prepare_copy(c, w, KERN_WEIGHT_QRP, drop, handle);
}

int kern_prepare_bf16(const kern_ctx *c, const rlx_weight_info *w, bool drop, void **handle) {
    return kern_prepare_copy(c, w, KERN_WEIGHT_BF16, drop, handle);
}

const kern_qrp_weight *kern_qrp_find(const kern_ctx *c, const rlx_tensor *t) {
    pthread_mutex_lock(&c->qrp->lock);
    const kern_qrp_weight *found = kern_qrp_lookup(c->qrp, t);
    pthread_mutex_unlock(&c->qrp->lock);
    return found;
}

void kern_release_qrp(const kern_ctx *c, void *handle) {
    kern_qrp_weight *h = handle;
    kern_qrp_shared *sh = c->qrp;
    pthread_mutex_lock(&sh->lock);
    const bool last = --h->refs == 0;
    if (last)
        for (size_t i = 0; i < sh->n; i++)
            if (sh->w[i] == h) {
                sh->w[i] = sh->w[--sh->n];
                break;
            }
    pthread_mutex_unlock(&sh->lock);
    if (last) {
        c->host->free(h->data);
        c->host->free(h);
    }
}

void kern_qrp_part(const kern_qrp_weight *w, const void *xq, size_t stride, int64_t M, int64_t n0, int64_t cnt,
                   const float *bias, float *y, int64_t ldy) {
    const int64_t G = w->N / KERN_QRP_ROWS, n1 = n0 + cnt;
    /* whole groups inside the part, then any native tail rows (n0 is a multiple of 8) */
    const int64_t g0 = n0 / KERN_QRP_ROWS, g1 = n1 / KERN_QRP_ROWS < G ? n1 / KERN_QRP_ROWS : G;
    if (g1 > g0)
        w->ops->matmul(w->data, w->K, xq, stride, M, g0, g1, y - n0, ldy);
    const int64_t t0 = g1 > g0 ? g1 * KERN_QRP_ROWS : n0;
    if (n1 > t0)
        kern_qmatmul_part(w->q, w->dt, xq, stride, M, w->K,
                          (const char *)w->data + (size_t)t0 * rlx_iface_row_bytes((uint32_t)w->dt, w->K), n1 - t0,
                          NULL, y + (t0 - n0), ldy);
    if (bias)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < cnt; n++)
                y[m * ldy + n] += bias[n];
}

typedef struct kern_qrp_job {
    const kern_qrp_weight *w;
    const float *bias;
    float *y;
    const void *xq;
    size_t stride;
    int64_t M;
} kern_qrp_job;

static void kern_qrp_range(void *ctx, int ith, int64_t n0, int64_t n1) {
    const kern_qrp_job *j = ctx;
    (void)ith;
    kern_qrp_part(j->w, j->xq, j->stride, j->M, n0, n1 - n0, j->bias ? j->bias + n0 : NULL, j->y + n0, j->w->N);
}

int kern_qrp_matmul(kern_ctx *c, const float *x, int64_t M, const kern_qrp_weight *w, const float *bias, float *y) {
    if (kern_matmul_trivial(M, w->K, w->N, bias, y))
        return RLX_OK;
    kern_qrp_job j = {.w = w, .bias = bias, .y = y, .M = M};
    const int rc = kern_q8_quantize(c, w->dt, x, M, w->K, &c->qx, &j.stride);
    if (rc < 0)
        return rc;
    j.xq = c->qx.p;
    c->par.parallel_for(c->par.self, w->N, KERN_ROW_ALIGN, M * w->N * w->K, kern_qrp_range, &j);
    return RLX_OK;
}
