/* The kernel library's context and scratch buffers: see kern.h. */
#include "kern.h"

#include <string.h>

int kern_init(kern_ctx *c, const rlx_host *host, const char *plugin, const char *isa, kern_par par) {
    memset(c, 0, sizeof *c);
    c->host = host;
    c->plugin = plugin;
    c->par = par;
    plugin_isa level;
    const int rc = plugin_isa_choose(host, plugin, isa, &level);
    if (rc < 0)
        return rc;
    c->k = kern_simd_at(level);
    c->q = kern_qsimd_at(level);
    c->isa = level;
    c->att = kern_bufs_create(c);
    if (!c->att)
        return host->error(RLX_E_NOMEM, "%s: out of memory", plugin);
    return kern_qrp_shared_init(c);
}

int kern_open(kern_ctx *c, const rlx_host *host, const char *plugin, const rlx_backend_options *opts, int max_threads,
              kern_option_fn option, kern_par par) {
    memset(c, 0, sizeof *c);
    const uint32_t want = opts && RLX_HAS(rlx_backend_options, opts, n_threads) && opts->n_threads > 0
                              ? opts->n_threads
                              : (uint32_t)par.n_threads;
    par.n_threads = want < (uint32_t)max_threads ? (int)want : max_threads;
    const char *cursor = opts && RLX_HAS(rlx_backend_options, opts, extra) ? opts->extra : NULL;
    char isa[16] = "auto";
    rlx_iface_option o;
    char err[256];
    int rc;
    while ((rc = rlx_iface_option_next(&cursor, &o, err, sizeof err)) > 0) {
        if (rlx_iface_option_is(&o, "isa") && o.value_len < sizeof isa)
            memcpy(isa, o.value, o.value_len + 1);
        else if (!option(par.self, &o))
            return host->error(RLX_E_INVALID, "%s: unknown or out-of-range option '%.*s'", plugin, o.item_len, o.item);
    }
    return rc < 0 ? host->error(rc, "%s: %s", plugin, err) : kern_init(c, host, plugin, isa, par);
}

void *kern_zalloc(const rlx_host *host, const char *plugin, size_t bytes) {
    void *p = host->alloc(bytes, KERN_ALIGN);
    if (!p) {
        host->error(RLX_E_NOMEM, "%s: out of memory", plugin);
        return NULL;
    }
    return memset(p, 0, bytes);
}

void kern_deinit(kern_ctx *c) {
    if (!c->host)
        return;
    const rlx_host *h = c->host;
    kern_bufs_destroy(c, c->att);
    kern_qrp_shared_deinit(c);
    h->free(c->vec.p);
    h->free(c->att_rows.p);
    h->free(c->att_parts.p);
    h->free(c->moe.p);
    h->free(c->qx.p);
    h->free(c->rec.p);
    h->free(c->rope_cs.p);
    h->free(c->rope_pos.p);
    h->free(c->rope_ff.p);
    memset(c, 0, sizeof *c);
}

int kern_reserve(const kern_ctx *c, kern_buf *b, size_t bytes) {
    if (b->cap >= bytes)
        return RLX_OK;
    c->host->free(b->p);
    b->cap = 0;
    const size_t cap = bytes + bytes / 2;
    b->p = c->host->alloc(cap, KERN_ALIGN);
    if (!b->p)
        return c->host->error(RLX_E_NOMEM, "%s: cannot allocate %zu bytes of scratch", c->plugin, cap);
    b->cap = cap;
    return RLX_OK;
}

kern_buf *kern_bufs_create(const kern_ctx *c) {
    const size_t bytes = (size_t)c->par.n_threads * sizeof(kern_buf);
    kern_buf *b = c->host->alloc(bytes, KERN_ALIGN);
    if (b)
        memset(b, 0, bytes);
    return b;
}

void kern_bufs_destroy(const kern_ctx *c, kern_buf *bufs) {
    if (!bufs)
        return;
    for (int i = 0; i < c->par.n_threads; i++)
        c->host->free(bufs[i].p);
    c->host->free(bufs);
}

int kern_reserve_each(const kern_ctx *c, kern_buf *bufs, size_t bytes) {
    for (int i = 0; i < c->par.n_threads; i++) {
        const int rc = kern_reserve(c, &bufs[i], bytes);
        if (rc < 0)
            return rc;
    }
    return RLX_OK;
}

size_t kern_align_up(size_t n) { return (n + KERN_ALIGN - 1) / KERN_ALIGN * KERN_ALIGN; }

/* A small weight vector as F32: t's own data or a copy in c->vec, valid until the next call. */
static int kern_f32_vec(kern_ctx *c, const rlx_tensor *t, const float **out) {
    if (t->dtype == RLX_DTYPE_F32) {
        *out = t->data;
        return RLX_OK;
    }
    const int64_t n = rlx_iface_numel(t);
    const int rc = kern_reserve(c, &c->vec, (size_t)n * sizeof(float));
    if (rc < 0)
        return rc;
    c->k->widen((int)t->dtype, t->data, c->vec.p, n);
    *out = c->vec.p;
    return RLX_OK;
}

bool kern_is_vec_input(uint32_t op, uint32_t input) {
    return (op == RLX_OP_RMS_NORM && input == 1) || (op == RLX_OP_MATMUL && input == 2);
}

int kern_prepare_vec(const kern_ctx *c, const rlx_weight_info *w, void **handle) {
    *handle = NULL;
    if (!kern_is_vec_input(w->op, w->input) || w->tensor->dtype == RLX_DTYPE_F32)
        return RLX_OK;
    const int64_t n = rlx_iface_numel(w->tensor);
    kern_weight *h = c->host->alloc(KERN_ALIGN + kern_align_up((size_t)n * sizeof(float)), KERN_ALIGN);
    if (!h)
        return c->host->error(RLX_E_NOMEM, "%s: out of memory for an F32 copy of '%s'", c->plugin, w->name);
    float *copy = (float *)((char *)h + KERN_ALIGN);
    c->k->widen((int)w->tensor->dtype, w->tensor->data, copy, n);
    *h = (kern_weight){.kind = KERN_WEIGHT_VEC, .f32 = copy};
    *handle = h;
    return RLX_OK;
}

void kern_release_vec(const kern_ctx *c, void *handle) { c->host->free(handle); }

const kern_weight *kern_prepared(const kern_ctx *c, const rlx_node_view *n, uint32_t k) {
    return c->host->abi_minor >= 2 && n->prepared ? n->prepared[k] : NULL;
}

int kern_vec(kern_ctx *c, const rlx_node_view *n, uint32_t k, const float **out) {
    const kern_weight *h = kern_prepared(c, n, k);
    if (h && h->kind == KERN_WEIGHT_VEC) {
        *out = h->f32;
        return RLX_OK;
    }
    return kern_f32_vec(c, &n->inputs[k], out);
}

bool kern_vec_needs_copy(const kern_ctx *c, const rlx_node_view *n, uint32_t k) {
    const kern_weight *h = kern_prepared(c, n, k);
    return n->inputs[k].dtype != RLX_DTYPE_F32 && !(h && h->kind == KERN_WEIGHT_VEC);
}

int kern_op_bias(kern_ctx *c, const rlx_node_view *n, const float **bias) {
    *bias = NULL;
    return n->n_inputs == 3 ? kern_vec(c, n, 2, bias) : RLX_OK;
}

bool kern_matmul_trivial(int64_t M, int64_t K, int64_t N, const float *bias, float *y) {
    if (M == 0 || N == 0)
        return true;
    if (K != 0)
        return false;
    for (int64_t m = 0; m < M; m++)
        for (int64_t i = 0; i < N; i++)
            y[m * N + i] = bias ? bias[i] : 0.0f;
    return true;
}

int64_t kern_tile_rows(size_t tile_bytes, int64_t K) {
    const int64_t rows = (int64_t)(tile_bytes / sizeof(float)) / K;
    return rows < KERN_ROW_ALIGN ? KERN_ROW_ALIGN : rows / KERN_ROW_ALIGN * KERN_ROW_ALIGN;
}
