/* See node_check.h. */
#include "node_check.h"

#include <limits.h>
#include <string.h>

static bool is_weight_dt(uint32_t dt) { return dt == RLX_DTYPE_F32 || dt == RLX_DTYPE_BF16 || dt == RLX_DTYPE_F16; }

/* An F32 activation of `rows` rows of `cols` values (rows < 0: any). */
static bool is_act(const rlx_tensor *t, int64_t rows, int64_t cols) {
    return t->dtype == RLX_DTYPE_F32 && (rows < 0 || rlx_iface_rows(t) == rows) && rlx_iface_cols(t) == cols;
}

/* A weight matrix [n, k] of a weight dtype. */
static bool is_mat(const rlx_tensor *t, int64_t n, int64_t k) {
    return is_weight_dt(t->dtype) && t->n_dims == 2 && t->shape[0] == n && t->shape[1] == k;
}

/* A weight matrix [n, k] of a weight dtype or of a block-quantized one with rows of whole
 * blocks. */
static bool is_qmat(const rlx_tensor *t, int64_t n, int64_t k) {
    if (rlx_iface_dtype_is_quantized(t->dtype))
        return t->n_dims == 2 && t->shape[0] == n && t->shape[1] == k && rlx_iface_row_bytes(t->dtype, k) != 0;
    return is_mat(t, n, k);
}

static bool is_vec(const rlx_tensor *t, uint32_t dt, int64_t n) { return t->dtype == dt && rlx_iface_numel(t) == n; }

/* A recurrent state F32 of row_dims dimensions `row`, or with slots one more in front. */
static bool is_state(const rlx_tensor *t, const int64_t *row, uint32_t row_dims, bool slots) {
    if (t->dtype != RLX_DTYPE_F32 || t->n_dims != row_dims + slots)
        return false;
    for (uint32_t d = 0; d < row_dims; d++)
        if (t->shape[slots + d] != row[d])
            return false;
    return true;
}

/* ABI 1.7 state rows: F32[T, row...], one state after each of the call's T rows. */
static bool is_state_rows(const rlx_tensor *t, int64_t T, const int64_t *row, uint32_t row_dims) {
    return t->shape[0] == T && is_state(t, row, row_dims, true);
}

static int bad(const rlx_host *host, const char *plugin, bool report, int status, const rlx_node_view *n,
               const char *why) {
    if (report)
        host->error(status, "%s: node '%s' (op %u): %s", plugin, n->name ? n->name : "?", n->op, why);
    return status;
}

int node_check(const rlx_host *host, const char *plugin, const rlx_node_view *n, bool report) {
    const uint32_t ni = n->n_inputs;
    const rlx_tensor *in = n->inputs, *out = n->output;
    const rlx_op_params *p = n->params;
    if (!out || (ni && !in))
        return bad(host, plugin, report, RLX_E_INVALID, n, "missing tensors");
    for (uint32_t i = 0; i < ni; i++)
        if (in[i].n_dims < 1 || in[i].n_dims > RLX_MAX_DIMS)
            return bad(host, plugin, report, RLX_E_SHAPE, n, "bad input rank");
    for (uint32_t i = 0; i < ni; i++)
        for (uint32_t d = 0; d < in[i].n_dims; d++)
            if (in[i].shape[d] < 0 || in[i].shape[d] > INT_MAX)
                return bad(host, plugin, report, RLX_E_SHAPE, n, "dimension outside [0, INT_MAX]");
    if (out->n_dims < 1 || out->n_dims > RLX_MAX_DIMS || out->dtype != RLX_DTYPE_F32)
        return bad(host, plugin, report, RLX_E_UNSUPPORTED, n, "output must be F32 of rank 1..4");
    const int64_t T = rlx_iface_rows(out), C = rlx_iface_cols(out);
    switch (n->op) {
    case RLX_OP_EMBED:
        if (ni != 2 || !is_vec(&in[0], RLX_DTYPE_I32, T) || !is_qmat(&in[1], in[1].shape[0], C))
            return bad(host, plugin, report, RLX_E_SHAPE, n, "want ids I32[T], table[V,H] -> F32[T,H]");
        return RLX_OK;
    case RLX_OP_MATMUL: {
        if (ni != 2 && ni != 3)
            return bad(host, plugin, report, RLX_E_INVALID, n, "want 2 or 3 inputs");
        const int64_t K = rlx_iface_cols(&in[0]);
        if (!is_act(&in[0], T, K) || !is_qmat(&in[1], C, K) ||
            (ni == 3 && (!is_weight_dt(in[2].dtype) || rlx_iface_numel(&in[2]) != C)))
            return bad(host, plugin, report, RLX_E_SHAPE, n, "want x F32[T,K], w[N,K], bias[N] -> F32[T,N]");
        return RLX_OK;
    }
    case RLX_OP_RMS_NORM: {
        if (ni != 2 || !p)
            return bad(host, plugin, report, RLX_E_INVALID, n, "want 2 inputs and params");
        const int64_t G = rlx_iface_numel(&in[1]);
        if (!is_act(&in[0], T, C) || !is_weight_dt(in[1].dtype) || G < 1 || C % G)
            return bad(host, plugin, report, RLX_E_SHAPE, n, "want x F32[T,C], w[G] with C % G == 0");
        return RLX_OK;
    }
    case RLX_OP_ROPE:
        if ((ni != 2 && ni != 3) || !p)
            return bad(host, plugin, report, RLX_E_INVALID, n, "want 2 or 3 inputs and params");
        if (p->head_dim < 2 || p->head_dim % 2 || !is_act(&in[0], T, C) || C % p->head_dim ||
            !is_vec(&in[1], RLX_DTYPE_I32, T) || (ni == 3 && !is_vec(&in[2], RLX_DTYPE_F32, p->head_dim / 2)))
            return bad(host, plugin, report, RLX_E_SHAPE, n,
                       "want x F32[T,n*D] (D even), pos I32[T], factors F32[D/2] (1.5)");
        /* a partial rotation (1.6): rope_dims is a reserved field to an older core */
        if (host->abi_minor >= 6 && p->rope_dims && p->rope_dims != p->head_dim &&
            (p->rope_dims % 2 || p->rope_dims > p->head_dim || ni == 3))
            return bad(host, plugin, report, RLX_E_SHAPE, n,
                       "want rope_dims even and below head_dim, without frequency factors (1.6)");
        return RLX_OK;
    case RLX_OP_ATTENTION: {
        /* caches [C, Hkv*D] with 6 inputs, or (1.4) [S, C, Hkv*D] with seq I32[T] as the 7th;
         * F32, (1.4) F16 or (1.8) Q8_0 with heads of whole blocks, both alike */
        const bool slots = ni > 4 && in[4].n_dims == 3;
        if (ni != 6u + slots || !p)
            return bad(host, plugin, report, RLX_E_INVALID, n, "want 6 inputs (7 with 3-D caches) and params");
        const int64_t D = p->head_dim, Hq = p->n_heads, Hkv = p->n_kv_heads;
        if (D < 1 || Hq < 1 || Hkv < 1 || Hq % Hkv || C != Hq * D)
            return bad(host, plugin, report, RLX_E_SHAPE, n, "want n_heads % n_kv_heads == 0, out F32[T,Hq*D]");
        const rlx_tensor *kc = &in[4], *vc = &in[5];
        if (!is_act(&in[0], T, Hq * D) || !is_act(&in[1], T, Hkv * D) || !is_act(&in[2], T, Hkv * D) ||
            !is_vec(&in[3], RLX_DTYPE_I32, T) || (slots && !is_vec(&in[6], RLX_DTYPE_I32, T)))
            return bad(host, plugin, report, RLX_E_SHAPE, n,
                       "want q F32[T,Hq*D], k, v F32[T,Hkv*D], pos I32[T] (and seq I32[T])");
        const bool cache_dt = kc->dtype == RLX_DTYPE_F32 || kc->dtype == RLX_DTYPE_F16 ||
                              (kc->dtype == RLX_DTYPE_Q8_0 && D % rlx_iface_dtype_block(RLX_DTYPE_Q8_0) == 0);
        if (!cache_dt || (kc->n_dims != 2 && kc->n_dims != 3) || rlx_iface_cols(kc) != Hkv * D ||
            vc->dtype != kc->dtype || vc->n_dims != kc->n_dims || memcmp(vc->shape, kc->shape, sizeof kc->shape) != 0)
            return bad(host, plugin, report, RLX_E_SHAPE, n,
                       "want caches F32, F16 or Q8_0 (head_dim % 32 == 0) [C,Hkv*D] or [S,C,Hkv*D], alike");
        return RLX_OK;
    }
    case RLX_OP_SWIGLU:
    case RLX_OP_ADD:
        if (ni != 2 || !is_act(&in[0], T, C) || !is_act(&in[1], T, C))
            return bad(host, plugin, report, RLX_E_SHAPE, n, "want two F32[T,C] -> F32[T,C]");
        return RLX_OK;
    case RLX_OP_GATHER_LAST:
        if (ni != 1 || T != 1 || !is_act(&in[0], -1, C))
            return bad(host, plugin, report, RLX_E_SHAPE, n, "want x F32[T,C] -> F32[1,C]");
        return RLX_OK;
    case RLX_OP_MOE: {
        if (!p || p->n_experts < 1 || p->top_k < 1 || p->top_k > p->n_experts || ni != 2 + 3 * (uint64_t)p->n_experts)
            return bad(host, plugin, report, RLX_E_INVALID, n, "want 1 <= top_k <= n_experts, 2 + 3 E inputs");
        const int64_t E = p->n_experts;
        if (!is_act(&in[0], T, C) || !is_mat(&in[1], E, C))
            return bad(host, plugin, report, RLX_E_SHAPE, n, "want x F32[T,H], router[E,H] -> F32[T,H]");
        for (int64_t e = 0; e < E; e++) {
            const rlx_tensor *g = &in[2 + 3 * e];
            const int64_t F = g->shape[0];
            if (!is_qmat(g, F, C) || !is_qmat(g + 1, F, C) || !is_qmat(g + 2, C, F))
                return bad(host, plugin, report, RLX_E_SHAPE, n, "want gate, up [F,H] and down [H,F] per expert");
        }
        return RLX_OK;
    }
    case RLX_OP_GATHER_ROWS:
        if (ni != 2 || !is_act(&in[0], -1, C) || in[0].n_dims != 2 || in[1].dtype != RLX_DTYPE_I32 ||
            in[1].n_dims != 1 || in[1].shape[0] != T || out->n_dims != 2)
            return bad(host, plugin, report, RLX_E_SHAPE, n, "want x F32[T,C], idx I32[R] -> F32[R,C]");
        return RLX_OK;
    case RLX_OP_SIGMOID_MUL:
        if (host->abi_minor < 6)
            break;
        if (ni != 2 || !is_act(&in[0], T, C) || !is_act(&in[1], T, C))
            return bad(host, plugin, report, RLX_E_SHAPE, n, "want x, g F32[T,C] -> F32[T,C]");
        return RLX_OK;
    case RLX_OP_SSM_CONV: {
        if (host->abi_minor < 6)
            break;
        const bool rows = p && p->state_rows;
        if (rows && host->abi_minor < 7)
            break;
        const uint32_t nb = ni - (rows ? 1u : 0u); /* the inputs before the state rows */
        const bool slots = nb == 5;
        const rlx_tensor *st = &in[3];
        const int64_t K = in[1].n_dims == 2 ? in[1].shape[1] : 0;
        if ((nb != 4 && nb != 5) || !is_act(&in[0], T, C) || !is_mat(&in[1], C, K) || K < 2 ||
            !is_vec(&in[2], RLX_DTYPE_I32, T) || (slots && !is_vec(&in[4], RLX_DTYPE_I32, T)) ||
            !is_state(st, (const int64_t[]){K - 1, C}, 2, slots) ||
            (rows && !is_state_rows(&in[nb], T, (const int64_t[]){K - 1, C}, 2)))
            return bad(host, plugin, report, RLX_E_SHAPE, n,
                       "want x F32[T,C], w[C,K] (K >= 2), pos I32[T], state F32[K-1,C] or [S,K-1,C] with seq I32[T], "
                       "then with state_rows F32[T,K-1,C]");
        return RLX_OK;
    }
    case RLX_OP_GATED_DELTA: {
        if (host->abi_minor < 6)
            break;
        if (!p)
            return bad(host, plugin, report, RLX_E_INVALID, n, "want params");
        const bool rows = p->state_rows != 0;
        if (rows && host->abi_minor < 7)
            break;
        const uint32_t nb = ni - (rows ? 1u : 0u); /* the inputs before the state rows */
        const bool slots = nb == 8;
        if (nb != 7 && nb != 8)
            return bad(host, plugin, report, RLX_E_INVALID, n,
                       "want 7 inputs (8 with slots, one more with state_rows)");
        const int64_t Hv = p->n_heads, Hk = p->n_kv_heads, Dk = p->head_dim, Dv = p->head_dim_v;
        if (Hv < 1 || Hk < 1 || Dk < 1 || Dv < 1 || Hv % Hk || !(p->eps > 0) || p->kv_tiled > 1 || C != Hv * Dv)
            return bad(host, plugin, report, RLX_E_SHAPE, n,
                       "want n_heads % n_kv_heads == 0, head_dim and head_dim_v >= 1, eps > 0, out F32[T,Hv*Dv]");
        if (!is_act(&in[0], T, 2 * Hk * Dk + Hv * Dv) || !is_act(&in[1], T, Hv) || !is_act(&in[2], T, Hv) ||
            !is_weight_dt(in[3].dtype) || rlx_iface_numel(&in[3]) != Hv || !is_weight_dt(in[4].dtype) ||
            rlx_iface_numel(&in[4]) != Hv || !is_vec(&in[5], RLX_DTYPE_I32, T) ||
            (slots && !is_vec(&in[7], RLX_DTYPE_I32, T)) ||
            !is_state(&in[6], (const int64_t[]){Hv, Dk, Dv}, 3, slots) ||
            (rows && !is_state_rows(&in[nb], T, (const int64_t[]){Hv, Dk, Dv}, 3)))
            return bad(host, plugin, report, RLX_E_SHAPE, n,
                       "want qkv F32[T,2*Hk*Dk+Hv*Dv], a, b F32[T,Hv], A, dt_bias[Hv], pos I32[T], state "
                       "F32[Hv,Dk,Dv] or [S,Hv,Dk,Dv] with seq I32[T], then with state_rows F32[T,Hv,Dk,Dv]");
        return RLX_OK;
    }
    default: /* includes CONCAT (ABI 1.1), a row copy left to the reference kernels */
        break;
    }
    return bad(host, plugin, report, RLX_E_UNSUPPORTED, n, "unknown op");
}

int node_weight_dtype(const rlx_node_view *n) {
    if (n->op == RLX_OP_MATMUL && n->n_inputs > 1)
        return (int)n->inputs[1].dtype;
    if (n->op == RLX_OP_MOE && n->n_inputs > 2)
        return (int)n->inputs[2].dtype;
    return -1;
}
