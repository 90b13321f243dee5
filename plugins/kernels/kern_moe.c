/* MOE in the kernel library: route every token, then run each selected expert once over all of
 * its tokens, with the backend's matmuls. */
#include <math.h>
#include <string.h>

#include "kern.h"

void kern_moe_route(const float *logits, int64_t T, int64_t E, int64_t k, bool norm_topk, int64_t *expert,
                    float *weight) {
    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E;
        int64_t *chosen = expert + t * k;
        float *w = weight + t * k;
        float mx = l[0];
        for (int64_t e = 1; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        double sum = 0.0, picked = 0.0;
        for (int64_t e = 0; e < E; e++)
            sum += exp((double)l[e] - mx);
        for (int64_t i = 0; i < k; i++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t j = 0; j < i; j++)
                    taken |= chosen[j] == e;
                if (!taken && (best < 0 || l[e] > l[best]))
                    best = e;
            }
            chosen[i] = best;
            const double prob = exp((double)l[best] - mx) / sum;
            w[i] = (float)prob;
            picked += prob;
        }
        if (norm_topk)
            for (int64_t i = 0; i < k; i++)
                w[i] = (float)((double)w[i] / picked);
    }
}

/* Rows an expert's matmuls run with for cnt tokens. */
static int64_t kern_moe_rows(const kern_matmul *mm, int64_t cnt) {
    return cnt <= 8 ? cnt : (cnt + mm->row_pad - 1) / mm->row_pad * mm->row_pad;
}

int kern_op_moe(kern_ctx *c, const rlx_node_view *n, const kern_matmul *mm) {
    const rlx_tensor *in = n->inputs;
    const rlx_op_params *p = n->params;
    const int64_t T = rlx_iface_rows(&in[0]), H = rlx_iface_cols(&in[0]), E = p->n_experts, K = p->top_k;
    const int64_t R = kern_moe_rows(mm, T);
    const float *x = in[0].data;
    float *out = n->output->data;
    int64_t F = 0;
    for (int64_t e = 0; e < E; e++)
        F = in[2 + 3 * e].shape[0] > F ? in[2 + 3 * e].shape[0] : F;
    memset(out, 0, (size_t)(T * H) * sizeof(float));
    if (T == 0)
        return RLX_OK;

    /* c->moe holds, each KERN_ALIGN aligned: router logits [T, E]; per (token, slot) pair its
     * expert and weight [T*K]; the pairs' tokens and weights sorted by expert [T*K]; each
     * expert's first sorted slot [E+1] and fill cursor [E]; then xe [R, H], g and u [R, F]
     * and ye [R, H] for one expert's tokens, R rows being the padded token count. */
    enum { L_LOGIT, L_PEXP, L_PWT, L_STOK, L_SWT, L_START, L_FILL, L_XE, L_G, L_U, L_YE, L_N };
    const size_t pairs = (size_t)(T * K);
    const size_t len[L_N] = {
        [L_LOGIT] = (size_t)(T * E) * sizeof(float),
        [L_PEXP] = pairs * sizeof(int64_t),
        [L_PWT] = pairs * sizeof(float),
        [L_STOK] = pairs * sizeof(int64_t),
        [L_SWT] = pairs * sizeof(float),
        [L_START] = (size_t)(E + 1) * sizeof(int64_t),
        [L_FILL] = (size_t)E * sizeof(int64_t),
        [L_XE] = (size_t)(R * H) * sizeof(float),
        [L_G] = (size_t)(R * F) * sizeof(float),
        [L_U] = (size_t)(R * F) * sizeof(float),
        [L_YE] = (size_t)(R * H) * sizeof(float),
    };
    size_t off[L_N + 1] = {0};
    for (int i = 0; i < L_N; i++)
        off[i + 1] = off[i] + kern_align_up(len[i]);
    int rc = kern_reserve(c, &c->moe, off[L_N]);
    if (rc < 0)
        return rc;
    char *base = c->moe.p;
    float *logit = (float *)(base + off[L_LOGIT]), *pwt = (float *)(base + off[L_PWT]);
    float *swt = (float *)(base + off[L_SWT]);
    int64_t *pexp = (int64_t *)(base + off[L_PEXP]), *stok = (int64_t *)(base + off[L_STOK]);
    int64_t *start = (int64_t *)(base + off[L_START]), *fill = (int64_t *)(base + off[L_FILL]);
    float *xe = (float *)(base + off[L_XE]), *g = (float *)(base + off[L_G]), *u = (float *)(base + off[L_U]);
    float *ye = (float *)(base + off[L_YE]);

    if ((rc = mm->run(mm->self, x, T, &in[1], kern_prepared(c, n, 1), logit, true)) < 0)
        return rc;
    kern_moe_route(logit, T, E, K, p->norm_topk, pexp, pwt);
    /* Counting sort of the pairs by expert, so each expert's weights are read once per call. */
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (size_t i = 0; i < pairs; i++)
        start[pexp[i] + 1]++;
    for (int64_t e = 0; e < E; e++)
        start[e + 1] += start[e];
    memcpy(fill, start, (size_t)E * sizeof *fill);
    for (size_t i = 0; i < pairs; i++) {
        const int64_t slot = fill[pexp[i]]++;
        stok[slot] = (int64_t)i / K;
        swt[slot] = pwt[i];
    }

    for (int64_t e = 0; e < E; e++) {
        const int64_t cnt = start[e + 1] - start[e], rows = kern_moe_rows(mm, cnt);
        if (cnt == 0)
            continue;
        const uint32_t ig = 2 + 3 * (uint32_t)e;
        const rlx_tensor *wg = &in[ig], *wu = wg + 1, *wd = wg + 2;
        const int64_t Fe = wg->shape[0];
        const int64_t *tk = stok + start[e];
        for (int64_t r = 0; r < cnt; r++)
            memcpy(xe + r * H, x + tk[r] * H, (size_t)H * sizeof(float));
        memset(xe + cnt * H, 0, (size_t)((rows - cnt) * H) * sizeof(float));
        if ((rc = mm->run(mm->self, xe, rows, wg, kern_prepared(c, n, ig), g, false)) < 0 ||
            (rc = mm->run(mm->self, xe, rows, wu, kern_prepared(c, n, ig + 1), u, false)) < 0)
            return rc;
        kern_swiglu(c, g, u, g, cnt * Fe);
        if ((rc = mm->run(mm->self, g, rows, wd, kern_prepared(c, n, ig + 2), ye, false)) < 0)
            return rc;
        for (int64_t r = 0; r < cnt; r++)
            c->k->axpy(swt[start[e] + r], ye + r * H, out + tk[r] * H, H);
    }
    return RLX_OK;
}
