/* The graph IR: tensor declarations, node construction with shape inference, and the text dump.
 * Shape inference is where malformed models are caught, so every rejection names the node and
 * the input at fault. */
#include <stdlib.h>
#include <string.h>

#include "graph/graph_impl.h"
#include "util/alloc.h"

size_t rlx_dtype_size(int dtype) { return dtype < 0 ? 0 : rlx_iface_dtype_size((uint32_t)dtype); }

const char *rlx_dtype_name(int dtype) {
    static const char *const names[] = {"f32",  "bf16", "f16",  "i32",  "q4_0", "q4_1",
                                        "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k"};
    _Static_assert(sizeof names / sizeof names[0] == RLX_DTYPE_COUNT, "a name per dtype");
    return dtype >= 0 && dtype < RLX_DTYPE_COUNT ? names[dtype] : "?";
}

const char *rlx_op_name(int op) {
    static const char *const names[] = {"?",         "embed",       "matmul",      "rms_norm",    "rope",
                                        "attention", "swiglu",      "add",         "gather_last", "moe",
                                        "concat",    "gather_rows", "sigmoid_mul", "ssm_conv",    "gated_delta"};
    _Static_assert(sizeof names / sizeof names[0] == RLX_OP_COUNT, "a name per op");
    return op > 0 && op < RLX_OP_COUNT ? names[op] : "?";
}

int64_t rlx_tensor_numel(const rlx_tensor *t) { return rlx_iface_numel(t); }

size_t rlx__tensor_nbytes(const rlx_tensor *t) { return rlx_iface_tensor_bytes(t); }

rlx_status rlx_graph_create(rlx_graph **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_graph_create: out is NULL");
    *out = rlx__calloc(1, sizeof **out);
    return *out ? RLX_OK : rlx_error(RLX_E_NOMEM, "rlx_graph_create: out of memory");
}

void rlx_graph_destroy(rlx_graph *g) {
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n_tensors; i++)
        free(g->tensors[i].name);
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        free(g->nodes[i].name);
        free(g->nodes[i].inputs);
    }
    free(g->tensors);
    free(g->nodes);
    free(g);
}

static int push_tensor(rlx_graph *g, rlx_tensor_role role, const char *name, rlx_dtype dtype, uint32_t n_dims,
                       const int64_t *shape, const void *data) {
    if (g->n_tensors == g->cap_tensors) {
        uint32_t cap = g->cap_tensors ? g->cap_tensors * 2 : 64;
        rlx__tensor_info *t = rlx__realloc(g->tensors, cap * sizeof *t);
        if (!t)
            return rlx_error(RLX_E_NOMEM, "graph: out of memory adding tensor '%s'", name);
        g->tensors = t;
        g->cap_tensors = cap;
    }
    char *copy = rlx__strdup(name);
    if (!copy)
        return rlx_error(RLX_E_NOMEM, "graph: out of memory adding tensor '%s'", name);
    rlx__tensor_info *ti = &g->tensors[g->n_tensors];
    memset(ti, 0, sizeof *ti);
    ti->t.dtype = (uint32_t)dtype;
    ti->t.n_dims = n_dims;
    for (uint32_t i = 0; i < RLX_MAX_DIMS; i++)
        ti->t.shape[i] = i < n_dims ? shape[i] : 1;
    ti->t.data = (void *)data;
    ti->role = role;
    ti->name = copy;
    ti->producer = -1;
    return (int)g->n_tensors++;
}

int rlx_graph_add_tensor(rlx_graph *g, rlx_tensor_role role, const char *name, rlx_dtype dtype, uint32_t n_dims,
                         const int64_t *shape, const void *data) {
    if (!g || !name || !shape)
        return rlx_error(RLX_E_INVALID, "rlx_graph_add_tensor: NULL argument");
    if (role == RLX_ROLE_ACTIVATION)
        return rlx_error(RLX_E_INVALID, "tensor '%s': activations are created by nodes", name);
    if ((int)dtype < 0 || rlx_iface_dtype_block((uint32_t)dtype) == 0)
        return rlx_error(RLX_E_INVALID, "tensor '%s': unknown dtype %d", name, (int)dtype);
    if (n_dims < 1 || n_dims > RLX_MAX_DIMS)
        return rlx_error(RLX_E_SHAPE, "tensor '%s': %u dimensions (1..%d allowed)", name, n_dims, RLX_MAX_DIMS);
    for (uint32_t i = 0; i < n_dims; i++)
        if (shape[i] <= 0)
            return rlx_error(RLX_E_SHAPE, "tensor '%s': dimension %u is %lld", name, i, (long long)shape[i]);
    if (rlx_iface_dtype_is_quantized((uint32_t)dtype) && role != RLX_ROLE_WEIGHT &&
        !(role == RLX_ROLE_STATE && dtype == RLX_DTYPE_Q8_0))
        return rlx_error(RLX_E_INVALID, "tensor '%s': only weights (and Q8_0 KV caches) may be %s", name,
                         rlx_dtype_name((int)dtype));
    if (rlx_iface_row_bytes((uint32_t)dtype, shape[n_dims - 1]) == 0)
        return rlx_error(RLX_E_SHAPE, "tensor '%s': rows of %lld values are not a whole number of %s blocks of %lld",
                         name, (long long)shape[n_dims - 1], rlx_dtype_name((int)dtype),
                         (long long)rlx_iface_dtype_block((uint32_t)dtype));
    if (role == RLX_ROLE_WEIGHT && !data)
        return rlx_error(RLX_E_INVALID, "weight '%s' has no data", name);
    return push_tensor(g, role, name, dtype, n_dims, shape, data);
}

void rlx__graph_set_weights(rlx_graph *g, uint64_t owner, uint32_t flags) {
    g->weight_owner = owner;
    g->weight_flags = flags;
}

void rlx__graph_weight_in_memory(rlx_graph *g, int id) {
    if (id >= 0 && (uint32_t)id < g->n_tensors)
        g->tensors[id].in_memory = 1;
}

// ---- shape inference ----

typedef struct infer_ctx {
    const rlx_graph *g;
    const char *node;
    const int *in;
    const char *op;
} infer_ctx;

static const rlx_tensor *input(const infer_ctx *c, uint32_t i) { return &c->g->tensors[c->in[i]].t; }
static const char *input_name(const infer_ctx *c, uint32_t i) { return c->g->tensors[c->in[i]].name; }

static int shape_str(const rlx_tensor *t, char *buf, size_t n) {
    int len = snprintf(buf, n, "%s[", rlx_dtype_name((int)t->dtype));
    for (uint32_t i = 0; i < t->n_dims && (size_t)len < n; i++)
        len += snprintf(buf + len, n - (size_t)len, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if ((size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, "]");
    return len;
}

static int bad_input(const infer_ctx *c, uint32_t i, const char *want) {
    char have[96];
    shape_str(input(c, i), have, sizeof have);
    return rlx_error(RLX_E_SHAPE, "node '%s' (%s): input %u '%s' is %s, expected %s", c->node, c->op, i,
                     input_name(c, i), have, want);
}

static int is_weight_dtype(uint32_t dt) { return dt == RLX_DTYPE_F32 || dt == RLX_DTYPE_BF16 || dt == RLX_DTYPE_F16; }

/* x must be a 2-D F32 activation; returns its rows via *rows and columns via *cols. */
static int want_rows(const infer_ctx *c, uint32_t i, int64_t cols, int64_t rows) {
    const rlx_tensor *t = input(c, i);
    if (t->dtype != RLX_DTYPE_F32 || t->n_dims != 2 || (cols > 0 && t->shape[1] != cols) ||
        (rows > 0 && t->shape[0] != rows)) {
        char want[64];
        if (cols > 0 && rows > 0)
            snprintf(want, sizeof want, "f32[%lld,%lld]", (long long)rows, (long long)cols);
        else if (cols > 0)
            snprintf(want, sizeof want, "f32[T,%lld]", (long long)cols);
        else
            snprintf(want, sizeof want, "a 2-D f32 tensor");
        return bad_input(c, i, want);
    }
    return 0;
}

/* A weight matrix [rows, cols] (a dimension <= 0: any); quantized unless float_only. */
static int want_matrix(const infer_ctx *c, uint32_t i, int64_t rows, int64_t cols, int float_only) {
    const rlx_tensor *t = input(c, i);
    const int dtype_ok = is_weight_dtype(t->dtype) || (!float_only && rlx_iface_dtype_is_quantized(t->dtype));
    if (!dtype_ok || t->n_dims != 2 || (rows > 0 && t->shape[0] != rows) || (cols > 0 && t->shape[1] != cols)) {
        char want[80];
        snprintf(want, sizeof want, "a %s matrix [%lld,%lld]", float_only ? "f32/bf16/f16" : "float or quantized",
                 (long long)rows, (long long)cols);
        return bad_input(c, i, want);
    }
    return 0;
}

static int want_vector(const infer_ctx *c, uint32_t i, int64_t n, rlx_dtype dtype_or_weight) {
    const rlx_tensor *t = input(c, i);
    int dtype_ok = dtype_or_weight == RLX_DTYPE_I32 ? t->dtype == RLX_DTYPE_I32 : is_weight_dtype(t->dtype);
    if (!dtype_ok || t->n_dims != 1 || (n > 0 && t->shape[0] != n)) {
        char want[64];
        snprintf(want, sizeof want, "%s[%lld]", dtype_or_weight == RLX_DTYPE_I32 ? "i32" : "f32/bf16/f16",
                 (long long)n);
        return bad_input(c, i, want);
    }
    return 0;
}

/* ATTENTION's caches, inputs 4 and 5: both F32, both F16 (1.4) or both Q8_0 with heads of whole
 * blocks (1.8), of one shape, [C, kv_cols] or, with slots (1.4), [S, C, kv_cols]. */
static int want_cache(const infer_ctx *c, int64_t kv_cols, int64_t head_dim) {
    const rlx_tensor *k = input(c, 4), *v = input(c, 5);
    const int dtype_ok = k->dtype == RLX_DTYPE_F32 || k->dtype == RLX_DTYPE_F16 ||
                         (k->dtype == RLX_DTYPE_Q8_0 && head_dim % rlx_iface_dtype_block(RLX_DTYPE_Q8_0) == 0);
    if (!dtype_ok || (k->n_dims != 2 && k->n_dims != 3) || k->shape[k->n_dims - 1] != kv_cols) {
        char want[112];
        snprintf(want, sizeof want, "an f32, f16 or q8_0 (head_dim %% 32 == 0) cache [C,%lld] or [S,C,%lld]",
                 (long long)kv_cols, (long long)kv_cols);
        return bad_input(c, 4, want);
    }
    if (v->dtype != k->dtype || v->n_dims != k->n_dims || memcmp(v->shape, k->shape, sizeof k->shape) != 0) {
        char want[112], have[96];
        shape_str(k, have, sizeof have);
        snprintf(want, sizeof want, "%.96s, as k_cache", have);
        return bad_input(c, 5, want);
    }
    return 0;
}

/* The recurrent state of SSM_CONV (input 3) or GATED_DELTA (input 6): F32 of shape `row` (the
 * last row_dims dimensions: [K-1,C] or [Hv,Dk,Dv]), one sequence, or with one more leading
 * dimension S, slots. *slots is set to whether it has that dimension. */
static int want_state(const infer_ctx *c, uint32_t i, const int64_t *row, uint32_t row_dims, int *slots) {
    const rlx_tensor *t = input(c, i);
    *slots = t->n_dims == row_dims + 1;
    int ok = t->dtype == RLX_DTYPE_F32 && (t->n_dims == row_dims || *slots);
    for (uint32_t d = 0; ok && d < row_dims; d++)
        ok = t->shape[t->n_dims - row_dims + d] == row[d];
    if (!ok) {
        char want[160], dims[48];
        int len = 0;
        for (uint32_t d = 0; d < row_dims; d++)
            len += snprintf(dims + len, sizeof dims - (size_t)len, d ? ",%lld" : "%lld", (long long)row[d]);
        snprintf(want, sizeof want, "an f32 state [%s] or, with slots, [S,%s]", dims, dims);
        return bad_input(c, i, want);
    }
    return 0;
}

#define CHECK(expr)                                                                                                    \
    do {                                                                                                               \
        int rc_ = (expr);                                                                                              \
        if (rc_ < 0)                                                                                                   \
            return rc_;                                                                                                \
    } while (0)

/* The inputs after a recurrent op's state: seq I32[T] with slots, then with state rows (ABI 1.7)
 * F32[T, row...], each row one state of the sequence (the row_dims dimensions of `row`). */
static int want_seq(const infer_ctx *c, uint32_t n, uint32_t state, int slots, int64_t t, const rlx_op_params *p,
                    const int64_t *row, uint32_t row_dims) {
    const uint32_t rows = p && p->state_rows ? 1u : 0u;
    if (p && p->state_rows > 1)
        return rlx_error(RLX_E_INVALID, "node '%s' (%s): state_rows is %u, not 0 or 1", c->node, c->op, p->state_rows);
    if (n != state + 1u + (uint32_t)slots + rows)
        return rlx_error(RLX_E_INVALID, "node '%s' (%s): takes %u inputs with a %s state%s", c->node, c->op,
                         state + 1u + (uint32_t)slots + rows,
                         slots ? "slotted (then seq I32[T])" : "one-sequence (no seq input)",
                         rows ? " and state rows (the last input)" : "");
    if (slots)
        CHECK(want_vector(c, state + 1, t, RLX_DTYPE_I32));
    if (!rows)
        return 0;
    const rlx_tensor *r = input(c, n - 1);
    int ok = r->dtype == RLX_DTYPE_F32 && r->n_dims == row_dims + 1 && r->shape[0] == t;
    for (uint32_t d = 0; ok && d < row_dims; d++)
        ok = r->shape[d + 1] == row[d];
    if (!ok) {
        char want[160], dims[48];
        int len = 0;
        for (uint32_t d = 0; d < row_dims; d++)
            len += snprintf(dims + len, sizeof dims - (size_t)len, ",%lld", (long long)row[d]);
        snprintf(want, sizeof want, "f32 state rows [%lld%s]", (long long)t, dims);
        return bad_input(c, n - 1, want);
    }
    return 0;
}

/* GATED_DELTA's heads and head sizes are at most this: far above any model's (Qwen3-Next: 32
 * value heads of 128), and it keeps every product of them (Hv*Dk*Dv, a state's size) far from
 * int64 overflow whatever the params say. */
#define GATED_DELTA_MAX_DIM 65536

/* GATED_DELTA (1.6): qkv F32[T,2*Hk*Dk+Hv*Dv], a, b F32[T,Hv], A, dt_bias [Hv], pos I32[T],
 * state F32[Hv,Dk,Dv] (or [S,Hv,Dk,Dv] and seq I32[T]) -> F32[T,Hv*Dv]. */
static int infer_gated_delta(const infer_ctx *c, uint32_t n, const rlx_op_params *p, rlx_tensor *out) {
    const int64_t hv = p->n_heads, hk = p->n_kv_heads, dk = p->head_dim, dv = p->head_dim_v;
    if (hv == 0 || hk == 0 || dk == 0 || dv == 0 || hv % hk || hv > GATED_DELTA_MAX_DIM || dk > GATED_DELTA_MAX_DIM ||
        dv > GATED_DELTA_MAX_DIM)
        return rlx_error(RLX_E_INVALID,
                         "node '%s' (gated_delta): %lld value heads (n_heads), %lld key heads (n_kv_heads), head_dim "
                         "%lld, head_dim_v %lld: each in [1, %d] and n_heads a multiple of n_kv_heads",
                         c->node, (long long)hv, (long long)hk, (long long)dk, (long long)dv, GATED_DELTA_MAX_DIM);
    if (!(p->eps > 0))
        return rlx_error(RLX_E_INVALID, "node '%s' (gated_delta): eps must be > 0", c->node);
    if (p->kv_tiled > 1)
        return rlx_error(RLX_E_INVALID, "node '%s' (gated_delta): kv_tiled is %u, not 0 or 1", c->node, p->kv_tiled);
    CHECK(want_rows(c, 0, 2 * hk * dk + hv * dv, -1));
    const int64_t t = input(c, 0)->shape[0];
    CHECK(want_rows(c, 1, hv, t));
    CHECK(want_rows(c, 2, hv, t));
    CHECK(want_vector(c, 3, hv, RLX_DTYPE_F32));
    CHECK(want_vector(c, 4, hv, RLX_DTYPE_F32));
    CHECK(want_vector(c, 5, t, RLX_DTYPE_I32));
    int slots;
    CHECK(want_state(c, 6, (const int64_t[]){hv, dk, dv}, 3, &slots));
    CHECK(want_seq(c, n, 6, slots, t, p, (const int64_t[]){hv, dk, dv}, 3));
    out->shape[0] = t;
    out->shape[1] = hv * dv;
    return 0;
}

static int infer(const infer_ctx *c, uint32_t op, uint32_t n, const rlx_op_params *p, rlx_tensor *out) {
    static const uint32_t min_inputs[RLX_OP_COUNT] = {0, 2, 2, 2, 2, 6, 2, 2, 1, 2, 2, 2, 2, 4, 7};
    if (n < min_inputs[op])
        return rlx_error(RLX_E_INVALID, "node '%s' (%s): %u inputs, needs %u", c->node, c->op, n, min_inputs[op]);
    out->dtype = RLX_DTYPE_F32;
    out->n_dims = 2;
    out->shape[2] = out->shape[3] = 1;
    const rlx_tensor *x = input(c, 0);
    switch (op) {
    case RLX_OP_EMBED: {
        if (x->dtype != RLX_DTYPE_I32 || x->n_dims != 1)
            return bad_input(c, 0, "i32[T] token ids");
        CHECK(want_matrix(c, 1, -1, -1, 0));
        out->shape[0] = x->shape[0];
        out->shape[1] = input(c, 1)->shape[1];
        return n == 2 ? 0 : rlx_error(RLX_E_INVALID, "node '%s' (embed): takes 2 inputs", c->node);
    }
    case RLX_OP_MATMUL: {
        CHECK(want_rows(c, 0, -1, -1));
        CHECK(want_matrix(c, 1, -1, x->shape[1], 0));
        int64_t n_out = input(c, 1)->shape[0];
        if (n == 3)
            CHECK(want_vector(c, 2, n_out, RLX_DTYPE_F32));
        else if (n != 2)
            return rlx_error(RLX_E_INVALID, "node '%s' (matmul): takes 2 or 3 inputs", c->node);
        out->shape[0] = x->shape[0];
        out->shape[1] = n_out;
        return 0;
    }
    case RLX_OP_RMS_NORM: {
        CHECK(want_rows(c, 0, -1, -1));
        CHECK(want_vector(c, 1, -1, RLX_DTYPE_F32));
        if (x->shape[1] % input(c, 1)->shape[0] != 0)
            return rlx_error(RLX_E_SHAPE,
                             "node '%s' (rms_norm): row of %lld values is not a multiple of weight '%s' [%lld]",
                             c->node, (long long)x->shape[1], input_name(c, 1), (long long)input(c, 1)->shape[0]);
        if (!(p->eps > 0))
            return rlx_error(RLX_E_INVALID, "node '%s' (rms_norm): eps must be > 0", c->node);
        out->shape[0] = x->shape[0];
        out->shape[1] = x->shape[1];
        return n == 2 ? 0 : rlx_error(RLX_E_INVALID, "node '%s' (rms_norm): takes 2 inputs", c->node);
    }
    case RLX_OP_ROPE: {
        CHECK(want_rows(c, 0, -1, -1));
        CHECK(want_vector(c, 1, x->shape[0], RLX_DTYPE_I32));
        if (p->head_dim == 0 || p->head_dim % 2 || x->shape[1] % p->head_dim)
            return rlx_error(RLX_E_SHAPE, "node '%s' (rope): head_dim %u must be even and divide %lld", c->node,
                             p->head_dim, (long long)x->shape[1]);
        if (!(p->rope_theta > 0))
            return rlx_error(RLX_E_INVALID, "node '%s' (rope): rope_theta must be > 0", c->node);
        /* partial rotation (1.6): the first rope_dims values of each head turn */
        const uint32_t turn = p->rope_dims ? p->rope_dims : p->head_dim;
        if (turn % 2 || turn > p->head_dim)
            return rlx_error(RLX_E_SHAPE, "node '%s' (rope): rope_dims %u must be even and at most head_dim %u",
                             c->node, p->rope_dims, p->head_dim);
        if (n == 3) { /* frequency factors (1.5): F32 only, read as they are, one per turning pair */
            const char *want = turn == p->head_dim ? "f32[head_dim/2]" : "f32[rope_dims/2]";
            const rlx_tensor *ff = input(c, 2);
            if (ff->dtype != RLX_DTYPE_F32 || ff->n_dims != 1 || ff->shape[0] != turn / 2)
                return bad_input(c, 2, want);
        }
        out->shape[0] = x->shape[0];
        out->shape[1] = x->shape[1];
        return n == 2 || n == 3 ? 0 : rlx_error(RLX_E_INVALID, "node '%s' (rope): takes 2 or 3 inputs", c->node);
    }
    case RLX_OP_ATTENTION: {
        if (p->head_dim == 0 || p->n_heads == 0 || p->n_kv_heads == 0 || p->n_heads % p->n_kv_heads)
            return rlx_error(RLX_E_INVALID, "node '%s' (attention): %u query heads, %u kv heads, head_dim %u", c->node,
                             p->n_heads, p->n_kv_heads, p->head_dim);
        int64_t t = x->shape[0], q_cols = (int64_t)p->n_heads * p->head_dim,
                kv_cols = (int64_t)p->n_kv_heads * p->head_dim;
        CHECK(want_rows(c, 0, q_cols, -1));
        CHECK(want_rows(c, 1, kv_cols, t));
        CHECK(want_rows(c, 2, kv_cols, t));
        CHECK(want_vector(c, 3, t, RLX_DTYPE_I32));
        CHECK(want_cache(c, kv_cols, p->head_dim));
        const int slots = input(c, 4)->n_dims == 3;
        if (n != 6u + slots)
            return rlx_error(RLX_E_INVALID, "node '%s' (attention): takes %u inputs with %s caches", c->node,
                             6u + slots, slots ? "3-D [S,C,Hkv*D] (the 7th is seq I32[T])" : "2-D [C,Hkv*D]");
        if (slots)
            CHECK(want_vector(c, 6, t, RLX_DTYPE_I32));
        out->shape[0] = t;
        out->shape[1] = q_cols;
        return 0;
    }
    case RLX_OP_SWIGLU:
    case RLX_OP_ADD:
    case RLX_OP_SIGMOID_MUL: {
        CHECK(want_rows(c, 0, -1, -1));
        CHECK(want_rows(c, 1, x->shape[1], x->shape[0]));
        out->shape[0] = x->shape[0];
        out->shape[1] = x->shape[1];
        return n == 2 ? 0 : rlx_error(RLX_E_INVALID, "node '%s' (%s): takes 2 inputs", c->node, c->op);
    }
    case RLX_OP_GATHER_LAST: {
        CHECK(want_rows(c, 0, -1, -1));
        out->shape[0] = 1;
        out->shape[1] = x->shape[1];
        return n == 1 ? 0 : rlx_error(RLX_E_INVALID, "node '%s' (gather_last): takes 1 input", c->node);
    }
    case RLX_OP_MOE: {
        CHECK(want_rows(c, 0, -1, -1));
        int64_t h = x->shape[1];
        if (p->n_experts == 0 || p->top_k == 0 || p->top_k > p->n_experts)
            return rlx_error(RLX_E_INVALID, "node '%s' (moe): top_k %u of %u experts", c->node, p->top_k, p->n_experts);
        if (n != 2 + 3 * p->n_experts)
            return rlx_error(RLX_E_INVALID, "node '%s' (moe): %u inputs, %u experts need %u", c->node, n, p->n_experts,
                             2 + 3 * p->n_experts);
        CHECK(want_matrix(c, 1, p->n_experts, h, 1));
        int64_t f = input(c, 2)->shape[0];
        for (uint32_t e = 0; e < p->n_experts; e++) {
            CHECK(want_matrix(c, 2 + 3 * e, f, h, 0));
            CHECK(want_matrix(c, 3 + 3 * e, f, h, 0));
            CHECK(want_matrix(c, 4 + 3 * e, h, f, 0));
        }
        out->shape[0] = x->shape[0];
        out->shape[1] = h;
        return 0;
    }
    case RLX_OP_CONCAT: {
        CHECK(want_rows(c, 0, -1, -1));
        CHECK(want_rows(c, 1, -1, -1));
        if (input(c, 1)->shape[0] != x->shape[0]) {
            char want[64];
            snprintf(want, sizeof want, "f32[%lld,B] (as many rows as input 0)", (long long)x->shape[0]);
            return bad_input(c, 1, want);
        }
        out->shape[0] = x->shape[0];
        out->shape[1] = x->shape[1] + input(c, 1)->shape[1];
        return n == 2 ? 0 : rlx_error(RLX_E_INVALID, "node '%s' (concat): takes 2 inputs", c->node);
    }
    case RLX_OP_GATHER_ROWS: {
        CHECK(want_rows(c, 0, -1, -1));
        CHECK(want_vector(c, 1, -1, RLX_DTYPE_I32));
        out->shape[0] = input(c, 1)->shape[0];
        out->shape[1] = x->shape[1];
        return n == 2 ? 0 : rlx_error(RLX_E_INVALID, "node '%s' (gather_rows): takes 2 inputs", c->node);
    }
    case RLX_OP_SSM_CONV: {
        CHECK(want_rows(c, 0, -1, -1));
        const int64_t t = x->shape[0], ch = x->shape[1];
        CHECK(want_matrix(c, 1, ch, -1, 1));
        const int64_t k = input(c, 1)->shape[1];
        if (k < 2)
            return bad_input(c, 1, "a kernel of at least 2 taps [C,K]");
        CHECK(want_vector(c, 2, t, RLX_DTYPE_I32));
        int slots;
        CHECK(want_state(c, 3, (const int64_t[]){k - 1, ch}, 2, &slots));
        CHECK(want_seq(c, n, 3, slots, t, p, (const int64_t[]){k - 1, ch}, 2));
        out->shape[0] = t;
        out->shape[1] = ch;
        return 0;
    }
    case RLX_OP_GATED_DELTA:
        return infer_gated_delta(c, n, p, out);
    default:
        return rlx_error(RLX_E_INVALID, "node '%s': unknown op %u", c->node, op);
    }
}

int rlx_graph_add_node(rlx_graph *g, rlx_op op, const char *name, const int *inputs, uint32_t n_inputs,
                       const rlx_op_params *params) {
    if (!g || !name || (n_inputs && !inputs))
        return rlx_error(RLX_E_INVALID, "rlx_graph_add_node: NULL argument");
    if (op <= 0 || op >= RLX_OP_COUNT)
        return rlx_error(RLX_E_INVALID, "node '%s': unknown op %d", name, (int)op);
    for (uint32_t i = 0; i < n_inputs; i++)
        if (inputs[i] < 0 || (uint32_t)inputs[i] >= g->n_tensors)
            return rlx_error(RLX_E_INVALID, "node '%s' (%s): input %u refers to tensor %d of %u", name, rlx_op_name(op),
                             i, inputs[i], g->n_tensors);
    rlx_op_params p = params ? *params : (rlx_op_params){0};
    infer_ctx c = {g, name, inputs, rlx_op_name(op)};
    rlx_tensor out = {0};
    CHECK(infer(&c, (uint32_t)op, n_inputs, &p, &out));

    if (g->n_nodes == g->cap_nodes) {
        uint32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 64;
        rlx__node *nodes = rlx__realloc(g->nodes, cap * sizeof *nodes);
        if (!nodes)
            return rlx_error(RLX_E_NOMEM, "graph: out of memory adding node '%s'", name);
        g->nodes = nodes;
        g->cap_nodes = cap;
    }
    rlx__node *nd = &g->nodes[g->n_nodes];
    memset(nd, 0, sizeof *nd);
    nd->name = rlx__strdup(name);
    nd->inputs = rlx__malloc((n_inputs ? n_inputs : 1) * sizeof *nd->inputs);
    if (!nd->name || !nd->inputs)
        goto nomem;
    memcpy(nd->inputs, inputs, n_inputs * sizeof *inputs);
    nd->n_inputs = n_inputs;
    nd->op = (uint32_t)op;
    nd->params = p;
    int id = push_tensor(g, RLX_ROLE_ACTIVATION, name, (rlx_dtype)out.dtype, out.n_dims, out.shape, NULL);
    if (id < 0)
        goto nomem;
    g->tensors[id].producer = (int)g->n_nodes;
    nd->output = id;
    g->n_nodes++;
    return id;
nomem:
    free(nd->name);
    free(nd->inputs);
    return rlx_error(RLX_E_NOMEM, "graph: out of memory adding node '%s'", name);
}

rlx_status rlx_graph_mark_output(rlx_graph *g, int id) {
    if (!g || id < 0 || (uint32_t)id >= g->n_tensors)
        return rlx_error(RLX_E_INVALID, "rlx_graph_mark_output: no tensor %d", id);
    g->tensors[id].is_output = 1;
    return RLX_OK;
}

uint32_t rlx_graph_n_nodes(const rlx_graph *g) { return g ? g->n_nodes : 0; }
uint32_t rlx_graph_n_tensors(const rlx_graph *g) { return g ? g->n_tensors : 0; }

int rlx_graph_find_tensor(const rlx_graph *g, const char *name) {
    for (uint32_t i = 0; g && name && i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return (int)i;
    return RLX_E_NOT_FOUND;
}

const rlx_tensor *rlx_graph_tensor(const rlx_graph *g, int id) {
    return g && id >= 0 && (uint32_t)id < g->n_tensors ? &g->tensors[id].t : NULL;
}

const char *rlx_graph_tensor_name(const rlx_graph *g, int id) {
    return g && id >= 0 && (uint32_t)id < g->n_tensors ? g->tensors[id].name : NULL;
}

rlx_tensor_role rlx_graph_tensor_role(const rlx_graph *g, int id) {
    return g && id >= 0 && (uint32_t)id < g->n_tensors ? g->tensors[id].role : RLX_ROLE_INPUT;
}

rlx_status rlx_graph_dump(const rlx_graph *g, FILE *f, const char *(*annotate)(void *ctx, uint32_t node), void *ctx) {
    static const char *const roles[] = {"input", "weight", "state", "activation"};
    if (!g || !f)
        return rlx_error(RLX_E_INVALID, "rlx_graph_dump: NULL argument");
    char shape[96];
    fprintf(f, "graph: %u tensors, %u nodes\n", g->n_tensors, g->n_nodes);
    for (uint32_t i = 0; i < g->n_tensors; i++) {
        const rlx__tensor_info *ti = &g->tensors[i];
        if (ti->role == RLX_ROLE_ACTIVATION)
            continue;
        shape_str(&ti->t, shape, sizeof shape);
        fprintf(f, "  %%%u = %s %s %s\n", i, roles[ti->role], shape, ti->name);
    }
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const rlx__node *nd = &g->nodes[i];
        shape_str(&g->tensors[nd->output].t, shape, sizeof shape);
        fprintf(f, "  %%%d = %s(", nd->output, rlx_op_name((int)nd->op));
        for (uint32_t k = 0; k < nd->n_inputs; k++) {
            if (nd->op == RLX_OP_MOE && k == 5) {
                fprintf(f, ", ... %u more", nd->n_inputs - k);
                break;
            }
            fprintf(f, k ? ", %%%d" : "%%%d", nd->inputs[k]);
        }
        fprintf(f, ") -> %s %s", shape, nd->name);
        if (g->tensors[nd->output].is_output)
            fputs(" [output]", f);
        if (annotate)
            fprintf(f, "  @%s", annotate(ctx, i));
        fputc('\n', f);
    }
    return ferror(f) ? rlx_error(RLX_E_IO, "graph dump: write failed") : RLX_OK;
}
