/* Judging one node: the tested backend's output, its writes and its caches against the
 * expectation (NumPy's, or the reference kernels' on the same inputs), within the tolerance of
 * the precision the backend declared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/quant_iface.h"
#include "runner.h"

/* The worst ratio of an output's error to its bound, and where it is. */
typedef struct worst_error {
    double ratio, err, bound;
    int64_t at;
} worst_error;

static void worst_note(worst_error *w, double err, double bound, int64_t at) {
    if (err / bound > w->ratio)
        *w = (worst_error){.ratio = err / bound, .err = err, .bound = bound, .at = at};
}

/* A MATMUL of a backend that declares RLX_PRECISION_Q8_ACT against the exact result, within
 * KIT_Q8_STEP (kit.h) per element. */
static void judge_q8(kit_runner *r, const kit_check *c, const kit_node *n, const float *got, const float *want,
                     double scale, double tol, kit_result *res) {
    const int64_t M = n->in[0].shape[0], K = n->in[0].shape[1], N = n->in[1].shape[0];
    const int64_t block = rlx_iface_dtype_block(n->in[1].dtype);
    const size_t row_bytes = rlx_iface_row_bytes(n->in[1].dtype, K);
    float *w = kit_alloc((size_t)K * sizeof *w);
    if (!w) {
        result(res, KIT_FAIL, "kit: out of memory");
        return;
    }
    worst_error exact = {0};
    for (int64_t o = 0; o < N; o++) {
        rlx_iface_dequant_row(n->in[1].dtype, (const char *)n->in[1].data + (size_t)o * row_bytes, w, K);
        for (int64_t m = 0; m < M; m++) {
            const float *x = (const float *)n->in[0].data + m * K;
            double bound = tol * scale;
            const int has_min = n->in[1].dtype == RLX_DTYPE_Q4_1 || n->in[1].dtype == RLX_DTYPE_Q5_1;
            const uint8_t *wrow = (const uint8_t *)n->in[1].data + (size_t)o * row_bytes;
            for (int64_t b = 0; b < K; b += block) {
                double amax = 0, wsum = 0, xsum = 0;
                for (int64_t k = b; k < b + block; k++) {
                    amax = fmax(amax, fabs((double)x[k]));
                    wsum += fabs((double)w[k]);
                    xsum += fabs((double)x[k]);
                }
                bound += KIT_Q8_STEP * amax / 127.0 * wsum;
                if (has_min) { /* the block's minimum: its second F16 */
                    uint16_t wmin;
                    memcpy(&wmin, wrow + (size_t)(b / block) * rlx_iface_dtype_block_bytes(n->in[1].dtype) + 2, 2);
                    bound += KIT_Q8_MIN_UNIT * fabs((double)rlx_iface_f16_to_f32(wmin)) * xsum;
                }
            }
            const int64_t i = m * N + o;
            worst_note(&exact, fabs((double)got[i] - want[i]), bound, i);
        }
    }
    free(w);
    res->err = exact.err;
    res->limit = exact.bound;
    if (exact.ratio <= 1) {
        result(res, KIT_PASS, "%s", "");
        return;
    }
    char pos[64];
    where(&n->out, exact.at, pos, sizeof pos);
    result(res, KIT_FAIL,
           "backend '%s' (q8-act), node '%s': output%s = %.7g, exact %.7g: error %.3g beyond the bound %.3g of "
           "8-bit activations",
           rlx_backend_name(r->tested), c->name, pos, (double)got[exact.at], (double)want[exact.at], exact.err,
           exact.bound);
}

/* The tolerance part of judge() for a MATMUL or MOE the backend computes with BF16-rounded
 * inputs (see KIT_BF16_UNIT): within the BF16 bound of the exact expectation `want`, and close
 * to the BF16-emulating reference kernels. tol is the op's F32 tolerance. */
static void judge_bf16(kit_runner *r, const kit_check *c, const kit_node *n, const float *got, const float *want,
                       double scale, double tol, kit_result *res) {
    const int64_t numel = rlx_tensor_numel(&n->out);
    float *emu = kit_alloc((size_t)numel * 4);
    if (!emu) {
        result(res, KIT_FAIL, "kit: out of memory");
        return;
    }
    rlx_tensor o = n->out;
    o.data = emu;
    rlx_node_view v = {
        .op = n->op, .n_inputs = n->n_inputs, .inputs = n->in, .output = &o, .params = &n->p, .name = c->name};
    phase(r, "the BF16-emulating reference kernels");
    if (rlx_backend_compute(r->ref_bf16, &v) != RLX_OK) {
        result(res, KIT_FAIL, "the BF16-emulating reference kernels failed: %s", rlx_last_error());
        free(emu);
        return;
    }
    /* exact: the worst ratio of |got - want| to its bound */
    worst_error exact = {0};
    const int64_t N = n->out.shape[n->out.n_dims - 1], K = n->in[0].shape[n->in[0].n_dims - 1];
    float *w = kit_alloc((size_t)K * sizeof *w);
    if (!w) {
        free(emu);
        result(res, KIT_FAIL, "kit: out of memory");
        return;
    }
    for (int64_t i = 0; i < numel; i++) {
        double bound = KIT_BF16_MOE_EXACT * scale;
        if (n->op == RLX_OP_MATMUL) {
            const float *x = (const float *)n->in[0].data + (i / N) * K;
            rlx_iface_dequant_row(
                n->in[1].dtype, (const char *)n->in[1].data + (size_t)(i % N) * rlx_iface_row_bytes(n->in[1].dtype, K),
                w, K);
            double sum = 0;
            for (int64_t k = 0; k < K; k++)
                sum += fabs((double)x[k] * w[k]);
            bound = KIT_BF16_UNIT * sum + tol * scale;
        }
        worst_note(&exact, fabs((double)got[i] - want[i]), bound, i);
    }
    free(w);
    double scale_e = 1, err_e = 0;
    int64_t at_e = 0;
    for (int64_t i = 0; i < numel; i++)
        scale_e = fmax(scale_e, fabs(emu[i]));
    for (int64_t i = 0; i < numel; i++)
        if (fabs((double)got[i] - emu[i]) > err_e) {
            err_e = fabs((double)got[i] - emu[i]);
            at_e = i;
        }
    const char *bound_text = n->op == RLX_OP_MATMUL ? "2^-8 sum|x w| + F32" : "stated MOE";
    res->err = err_e;
    res->limit = (n->op == RLX_OP_MATMUL ? tol : KIT_BF16_MOE_EMULATED) * scale_e;
    char pos[64];
    if (exact.ratio > 1) {
        where(&n->out, exact.at, pos, sizeof pos);
        result(res, KIT_FAIL,
               "backend '%s' (bf16-act), node '%s': output%s = %.7g, exact %.7g: error %.3g beyond %s "
               "bound %.3g",
               rlx_backend_name(r->tested), c->name, pos, (double)got[exact.at], (double)want[exact.at], exact.err,
               bound_text, exact.bound);
    } else if (err_e > res->limit) {
        where(&n->out, at_e, pos, sizeof pos);
        result(res, KIT_FAIL, "backend '%s' (bf16-act), node '%s': output%s = %.7g, BF16 emulation %.7g",
               rlx_backend_name(r->tested), c->name, pos, (double)got[at_e], (double)emu[at_e]);
    } else {
        result(res, KIT_PASS, "bf16-act: vs BF16 emulation; vs exact %.3g of the %s bound", exact.ratio, bound_text);
    }
    free(emu);
}

/* The view of node n over inputs in that a backend gets at planning time: shapes and params,
 * data pointers NULL. Returns the input array (freed by the caller; out and v point into it
 * and at out), or NULL when out of memory. */
rlx_tensor *kit_planning_view(const kit_node *n, const rlx_tensor *in, const char *name, rlx_tensor *out,
                              rlx_node_view *v) {
    rlx_tensor *shapes = calloc(n->n_inputs + 1, sizeof *shapes);
    if (!shapes)
        return NULL;
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        shapes[i] = in[i];
        shapes[i].data = NULL;
    }
    *out = n->out;
    out->data = NULL;
    *v = (rlx_node_view){.op = n->op,
                         .n_inputs = n->n_inputs,
                         .inputs = shapes,
                         .output = out,
                         .params = &n->p,
                         .name = name,
                         .output_id = -1};
    return shapes;
}

/* After a claimed call: nothing written past the output (numel F32 values, then GUARD_BYTES
 * of 0xa5) nor into an input other than state (hashes taken before). Returns 0, or -1 with res
 * set. */
int kit_check_written(const char *bname, const char *name, const kit_node *n, const rlx_tensor *in,
                      const uint64_t *hashes, const uint8_t *out, int64_t numel, kit_result *res) {
    const size_t out_bytes = (size_t)numel * 4;
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (out[out_bytes + i] != 0xa5) {
            result(res, KIT_FAIL, "backend '%s' wrote past the end of the output of node '%s' (byte %zu after it)",
                   bname, name, i);
            return -1;
        }
    for (uint32_t i = 0; i < n->n_inputs; i++)
        if (!is_state(n, i) && !kit_is_state_rows(n, i) && hash_bytes(in[i].data, bytes_of(&in[i])) != hashes[i]) {
            result(res, KIT_FAIL, "backend '%s' modified input %u of node '%s' (inputs are read-only)", bname, i, name);
            return -1;
        }
    return 0;
}

/* Every value of got (shaped as shape) written and finite; the largest |got - want| into
 * *worst (at *at) and max(1, max|want|) into *scale. Returns 0, or -1 with res set. */
int kit_compare_out(const char *bname, const char *name, const rlx_tensor *shape, const float *got, const float *want,
                    int64_t numel, double *worst, int64_t *at, double *scale, kit_result *res) {
    *worst = 0;
    *scale = 1;
    *at = -1;
    for (int64_t i = 0; i < numel; i++)
        *scale = fmax(*scale, fabs(want[i]));
    for (int64_t i = 0; i < numel; i++) {
        char pos[64];
        uint32_t bits;
        memcpy(&bits, &got[i], 4);
        if (bits == MARKER_BITS) {
            where(shape, i, pos, sizeof pos);
            result(res, KIT_FAIL, "backend '%s' left output%s of node '%s' unwritten (it must write the whole output)",
                   bname, pos, name);
            res->err = INFINITY;
            return -1;
        }
        if (!isfinite(got[i])) {
            where(shape, i, pos, sizeof pos);
            result(res, KIT_FAIL, "backend '%s' returned %g at output%s of node '%s' (expected %.6g)", bname,
                   (double)got[i], pos, name, (double)want[i]);
            res->err = INFINITY;
            return -1;
        }
        const double d = fabs((double)got[i] - (double)want[i]);
        if (d > *worst) {
            *worst = d;
            *at = i;
        }
    }
    return 0;
}

/* What judge() holds for one node, freed together when it ends. */
typedef struct judging {
    int64_t numel;
    size_t out_bytes;
    float *want, *ref_out;                         /* the expectation: n->want, or ref_out */
    void *want_cache[2], *ref_cache[2], *cache[2]; /* ATTENTION's K and V caches: expected, reference's, tested's */
    void **prepared;                               /* the tested backend's handles of the weights */
    rlx_tensor *shapes;                            /* what the backend saw at planning time */
    uint64_t *hashes;                              /* of every input but state, before the call */
    rlx_tensor *in;                                /* the tested backend's inputs */
    uint8_t *out;                                  /* numel F32 values, then GUARD_BYTES of 0xa5 */
} judging;

static void judging_free(kit_runner *r, const kit_node *n, judging *j) {
    for (uint32_t i = 0; j->prepared && i < n->n_inputs; i++)
        rlx_backend_release_weight(r->tested, j->prepared[i]);
    free(j->prepared);
    free(j->shapes);
    free(j->hashes);
    free(j->in);
    free(j->out);
    free(j->ref_out);
    free(j->ref_cache[0]);
    free(j->ref_cache[1]);
    free(j->cache[0]);
    free(j->cache[1]);
}

/* Without a NumPy expectation: the reference kernels on the node, over private copies of the
 * state. Returns 0, or -1 with res set. */
static int judge_expect(kit_runner *r, const kit_check *c, kit_node *n, judging *j, kit_result *res) {
    rlx_tensor *in = j->in;
    memcpy(in, n->in, n->n_inputs * sizeof *in);
    for (uint32_t s = 0; s < 2 && n->op == RLX_OP_ATTENTION; s++) {
        if (!(j->ref_cache[s] = kit_alloc(bytes_of(&n->in[4 + s])))) {
            result(res, KIT_FAIL, "kit: out of memory");
            return -1;
        }
        memcpy(j->ref_cache[s], n->in[4 + s].data, bytes_of(&n->in[4 + s]));
        in[4 + s].data = j->ref_cache[s];
    }
    rlx_tensor o = n->out;
    if (!(o.data = j->ref_out = kit_alloc(j->out_bytes))) {
        result(res, KIT_FAIL, "kit: out of memory");
        return -1;
    }
    rlx_node_view v = {
        .op = n->op, .n_inputs = n->n_inputs, .inputs = in, .output = &o, .params = &n->p, .name = c->name};
    phase(r, "the reference kernels");
    if (rlx_backend_compute(r->ref, &v) != RLX_OK) {
        result(res, KIT_FAIL, "the reference kernels failed (a bad case in the kit?): %s", rlx_last_error());
        return -1;
    }
    j->want = j->ref_out;
    j->want_cache[0] = j->ref_cache[0];
    j->want_cache[1] = j->ref_cache[1];
    return 0;
}

/* The tested backend's inputs: shared read-only inputs, hashed to catch a write, and its own
 * copies of the state; the output filled with the "never written" marker and its guard bytes.
 * Returns 0, or -1 with res set. */
static int judge_inputs(kit_node *n, judging *j, kit_result *res) {
    rlx_tensor *in = j->in;
    memcpy(in, n->in, n->n_inputs * sizeof *in);
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        if (n->op == RLX_OP_ATTENTION && is_state(n, i)) { /* the only state judge() copies */
            if (!(j->cache[i - 4] = kit_alloc(bytes_of(&n->in[i])))) {
                result(res, KIT_FAIL, "kit: out of memory");
                return -1;
            }
            memcpy(j->cache[i - 4], n->in[i].data, bytes_of(&n->in[i]));
            in[i].data = j->cache[i - 4];
        } else {
            j->hashes[i] = hash_bytes(in[i].data, bytes_of(&in[i]));
        }
    }
    uint32_t marker = MARKER_BITS;
    for (int64_t i = 0; i < j->numel; i++)
        memcpy(j->out + 4 * i, &marker, 4);
    memset(j->out + j->out_bytes, 0xa5, GUARD_BYTES);
    return 0;
}

/* A backend that prepares weights gets its handles, as a plan would give them, each with what
 * the backend saw at planning time. Returns 0, or -1 with res set. */
static int judge_prepare(kit_runner *r, const kit_check *c, kit_node *n, judging *j, kit_result *res) {
    rlx_tensor planned_out;
    rlx_node_view planned;
    if (!(j->prepared = calloc(n->n_inputs, sizeof *j->prepared)) ||
        !(j->shapes = kit_planning_view(n, j->in, c->name, &planned_out, &planned))) {
        result(res, KIT_FAIL, "kit: out of memory");
        return -1;
    }
    if (!(rlx_backend_features(r->tested) & RLX_BACKEND_PREPARES_WEIGHTS))
        return 0;
    phase(r, "prepare_weight()");
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        const rlx_weight_info w = {
            .size = sizeof w, .tensor = &j->in[i], .name = c->name, .op = n->op, .input = i, .node = &planned};
        if (n->is_weight[i] && rlx_backend_prepare_weight(r->tested, &w, &j->prepared[i]) != RLX_OK) {
            result(res, KIT_FAIL, "claimed the node, then failed to prepare its weight (input %u): %s", i,
                   rlx_last_error());
            return -1;
        }
    }
    return 0;
}

/* ATTENTION's caches compared bit for bit in their own dtype (F16 rows rounded to nearest
 * even); a row of a 3-D cache is named by slot and position. Returns 0, or -1 with res set. */
static int judge_caches(const char *bname, const kit_check *c, const kit_node *n, const judging *j, kit_result *res) {
    for (uint32_t s = 0; s < 2 && n->op == RLX_OP_ATTENTION; s++) {
        const rlx_tensor *t = &n->in[4 + s];
        const int64_t cap = t->shape[t->n_dims - 2];
        const size_t row_bytes = rlx_iface_row_bytes(t->dtype, rlx_iface_cols(t));
        for (int64_t row = 0; row < rlx_iface_rows(t); row++)
            if (memcmp((const char *)j->cache[s] + row * row_bytes, (const char *)j->want_cache[s] + row * row_bytes,
                       row_bytes) != 0) {
                char which[64];
                if (t->n_dims == 3)
                    snprintf(which, sizeof which, "slot %lld row %lld", (long long)(row / cap), (long long)(row % cap));
                else
                    snprintf(which, sizeof which, "row %lld", (long long)row);
                result(res, KIT_FAIL, "backend '%s': %s %s after node '%s' differs from the expected cache", bname,
                       s ? "v_cache" : "k_cache", which, c->name);
                return -1;
            }
    }
    return 0;
}

/* The verdict on an output that is whole and finite: the precision's own judgement for BF16
 * and Q8 activations, else the largest difference (worst, at element at) within the op's
 * tolerance relative to scale. */
static void judge_verdict(kit_runner *r, const kit_check *c, const kit_node *n, uint32_t prec, const float *got,
                          const float *want, double worst, int64_t at, double scale, kit_result *res) {
    double tol = kit_node_tol(r->o, n);
    if (prec == RLX_PRECISION_BF16_ACT && (n->op == RLX_OP_MATMUL || n->op == RLX_OP_MOE)) {
        judge_bf16(r, c, n, got, want, scale, tol, res);
        return;
    }
    if (prec == RLX_PRECISION_Q8_ACT && n->op == RLX_OP_MATMUL) {
        judge_q8(r, c, n, got, want, scale, tol, res);
        return;
    }
    res->err = worst;
    res->limit = tol * scale;
    if (worst <= res->limit) {
        result(res, KIT_PASS, "%s", "");
    } else {
        char pos[64];
        where(&n->out, at, pos, sizeof pos);
        result(res, KIT_FAIL, "backend '%s', node '%s': output%s = %.7g, expected %.7g", rlx_backend_name(r->tested),
               c->name, pos, (double)got[at], (double)want[at]);
    }
}

/* Runs node (inputs filled) on the tested backend, which computes it in precision prec, and
 * judges it. */
void kit_judge(kit_runner *r, const kit_check *c, kit_node *n, uint32_t prec, kit_result *res) {
    const char *bname = rlx_backend_name(r->tested);
    judging j = {
        .numel = rlx_tensor_numel(&n->out), .want = n->want, .want_cache = {n->want_cache[0], n->want_cache[1]}};
    j.out_bytes = (size_t)j.numel * 4;
    j.hashes = calloc(n->n_inputs, sizeof *j.hashes);
    j.in = calloc(n->n_inputs, sizeof *j.in);
    j.out = kit_alloc(j.out_bytes + GUARD_BYTES);
    if (!j.hashes || !j.in || !j.out) {
        result(res, KIT_FAIL, "kit: out of memory");
        goto done;
    }
    if ((!j.want && judge_expect(r, c, n, &j, res) < 0) || judge_inputs(n, &j, res) < 0 ||
        judge_prepare(r, c, n, &j, res) < 0)
        goto done;
    rlx_tensor o = n->out;
    o.data = j.out;
    rlx_node_view v = {.op = n->op,
                       .n_inputs = n->n_inputs,
                       .inputs = j.in,
                       .output = &o,
                       .params = &n->p,
                       .name = c->name,
                       .prepared = j.prepared,
                       .output_id = -1};
    phase(r, "compute()");
    if (rlx_backend_compute(r->tested, &v) != RLX_OK) {
        result(res, KIT_FAIL, "claimed the node, then failed it: %s", rlx_last_error());
        goto done;
    }
    const float *got = (const float *)j.out;
    double worst = 0, scale = 1;
    int64_t at = -1;
    if (kit_check_written(bname, c->name, n, j.in, j.hashes, j.out, j.numel, res) < 0 ||
        kit_compare_out(bname, c->name, &n->out, got, j.want, j.numel, &worst, &at, &scale, res) < 0 ||
        judge_caches(bname, c, n, &j, res) < 0)
        goto done;
    judge_verdict(r, c, n, prec, got, j.want, worst, at, scale, res);
done:
    judging_free(r, n, &j);
}
