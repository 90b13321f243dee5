/* The recurrent ops (SSM_CONV, GATED_DELTA; ABI 1.6) run as several calls over one state,
 * checked after each. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

/* Element i of tensor t as an index per dimension, "[1,0,5]". */
static void index_of(const rlx_tensor *t, int64_t i, char *buf, size_t len) {
    int64_t idx[RLX_MAX_DIMS];
    for (int d = (int)t->n_dims - 1; d >= 0; d--) {
        idx[d] = i % t->shape[d];
        i /= t->shape[d];
    }
    size_t at = (size_t)snprintf(buf, len, "[");
    for (uint32_t d = 0; d < t->n_dims && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%lld", d ? "," : "", (long long)idx[d]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* The calls of a recurrent node (kit_node's n_calls), in order: each on the reference kernels
 * over their state and on the tested backend over its own, so that each side carries what it
 * computed. A call that must succeed gets judge()'s checks on its output, then the state is
 * compared with the reference's within the op's tolerance (relative to max(1, max|state|)); a
 * call that must fail must return the contract's status and leave the state as it was, bit
 * for bit. A later call whose shapes the backend declines runs on the reference kernels, as a
 * plan for them would place it (run_op reports a case whose first call it declines NOT
 * CLAIMED). With state rows (ABI 1.7), every row's state is compared as the output is. */
void kit_judge_calls(kit_runner *r, const kit_check *c, kit_node *n, kit_result *res) {
    const char *bname = rlx_backend_name(r->tested);
    const uint32_t ni = n->n_inputs, ri = n->p.state_rows ? ni - 1 : UINT32_MAX;
    uint32_t si = 0, declined = 0, failing = 0;
    for (uint32_t i = 0; i < ni; i++)
        if (is_state(n, i))
            si = i;
    const size_t state_bytes = bytes_of(&n->in[si]);
    const int64_t cols = n->out.shape[1], state_numel = rlx_tensor_numel(&n->in[si]);
    int64_t max_rows = 1;
    for (uint32_t k = 0; k < n->n_calls; k++)
        max_rows = n->calls[(size_t)k * ni].shape[0] > max_rows ? n->calls[(size_t)k * ni].shape[0] : max_rows;
    const size_t out_cap = (size_t)(max_rows * cols) * 4;
    float *ref_state = kit_alloc(state_bytes), *state = kit_alloc(state_bytes), *before = kit_alloc(state_bytes);
    float *ref_out = kit_alloc(out_cap);
    /* the reference's state rows: as many rows as the longest call, each one sequence's state */
    const size_t rows_cap = ri != UINT32_MAX ? (size_t)max_rows * bytes_of(&n->in[ri]) / (size_t)n->in[ri].shape[0] : 0;
    float *ref_rows = rows_cap ? kit_alloc(rows_cap) : NULL;
    uint8_t *out = kit_alloc(out_cap + GUARD_BYTES);
    rlx_tensor *in = calloc(ni, sizeof *in), *ref_in = calloc(ni, sizeof *ref_in), *shapes = NULL;
    uint64_t *hashes = calloc(ni, sizeof *hashes);
    void **prepared = calloc(ni, sizeof *prepared);
    if (!ref_state || !state || !before || !ref_out || !out || !in || !ref_in || !hashes || !prepared ||
        (rows_cap && !ref_rows)) {
        result(res, KIT_FAIL, "kit: out of memory");
        goto done;
    }
    memcpy(ref_state, n->in[si].data, state_bytes);
    memcpy(state, n->in[si].data, state_bytes);
    const double tol = kit_node_tol(r->o, n);
    double ratio = -1, s_ratio = -1, state_err = 0, state_limit = 0;
    for (uint32_t k = 0; k < n->n_calls; k++) {
        const rlx_tensor *call = n->calls + (size_t)k * ni;
        const int64_t numel = call[0].shape[0] * cols;
        for (uint32_t i = 0; i < ni; i++)
            in[i] = n->is_weight[i] || i == si ? n->in[i] : call[i];
        memcpy(ref_in, in, ni * sizeof *in);
        in[si].data = state;
        ref_in[si].data = ref_state;
        if (ri != UINT32_MAX)
            ref_in[ri].data = ref_rows;
        rlx_tensor o = n->out;
        o.shape[0] = call[0].shape[0];
        o.data = ref_out;
        const rlx_node_view rv = {
            .op = n->op, .n_inputs = ni, .inputs = ref_in, .output = &o, .params = &n->p, .name = c->name};
        phase(r, "the reference kernels");
        int rc = rlx_backend_compute(r->ref, &rv);
        if (rc != n->call_status[k]) {
            result(res, KIT_FAIL,
                   "the reference kernels returned %d on call %u, the case wants %d (a bad case in the kit?): %s", rc,
                   k + 1, n->call_status[k], rc ? rlx_last_error() : "");
            goto done;
        }
        /* the tested backend, asked about this call's shapes as a plan for them would ask */
        rlx_tensor planned_out;
        rlx_node_view planned;
        free(shapes);
        if (!(shapes = kit_planning_view(n, in, c->name, &planned_out, &planned))) {
            result(res, KIT_FAIL, "kit: out of memory");
            goto done;
        }
        planned.output->shape[0] = o.shape[0];
        phase(r, "supports()");
        const int claimed = rlx_backend_supports(r->tested, &planned);
        declined += !claimed;
        if (claimed && k == 0 && (rlx_backend_features(r->tested) & RLX_BACKEND_PREPARES_WEIGHTS)) {
            phase(r, "prepare_weight()");
            for (uint32_t i = 0; i < ni; i++) {
                const rlx_weight_info w = {
                    .size = sizeof w, .tensor = &in[i], .name = c->name, .op = n->op, .input = i, .node = &planned};
                if (n->is_weight[i] && rlx_backend_prepare_weight(r->tested, &w, &prepared[i]) != RLX_OK) {
                    result(res, KIT_FAIL, "claimed the node, then failed to prepare its weight (input %u): %s", i,
                           rlx_last_error());
                    goto done;
                }
            }
        }
        for (uint32_t i = 0; i < ni; i++)
            hashes[i] = i == si || i == ri ? 0 : hash_bytes(in[i].data, bytes_of(&in[i]));
        const uint32_t marker = MARKER_BITS;
        for (int64_t i = 0; i < numel; i++)
            memcpy(out + 4 * i, &marker, 4);
        const int64_t rows_numel = ri != UINT32_MAX ? rlx_tensor_numel(&in[ri]) : 0;
        for (int64_t i = 0; i < rows_numel; i++) /* a row the backend leaves unwritten shows */
            memcpy((float *)in[ri].data + i, &marker, 4);
        memset(out + (size_t)numel * 4, 0xa5, GUARD_BYTES);
        memcpy(before, state, state_bytes);
        o.data = out;
        const rlx_node_view v = {.op = n->op,
                                 .n_inputs = ni,
                                 .inputs = in,
                                 .output = &o,
                                 .params = &n->p,
                                 .name = c->name,
                                 .prepared = claimed ? prepared : NULL,
                                 .output_id = -1};
        phase(r, claimed ? "compute()" : "the reference kernels (a call the backend declined)");
        rc = rlx_backend_compute(claimed ? r->tested : r->ref, &v);
        if (n->call_status[k] != RLX_OK) {
            failing++;
            if (rc != n->call_status[k]) {
                result(res, KIT_FAIL,
                       "backend '%s', node '%s': call %u of %u returned %d (%s); the contract makes it fail with %d "
                       "(%s)",
                       bname, c->name, k + 1, n->n_calls, rc, rlx_status_str(rc), n->call_status[k],
                       rlx_status_str(n->call_status[k]));
                goto done;
            }
            if (memcmp(before, state, state_bytes) != 0) {
                result(res, KIT_FAIL,
                       "backend '%s', node '%s': call %u of %u failed as it must, but changed the state (a call that "
                       "fails must leave it as it was)",
                       bname, c->name, k + 1, n->n_calls);
                goto done;
            }
            continue;
        }
        if (rc != RLX_OK) {
            result(res, KIT_FAIL, "claimed the node, then failed call %u of %u: %s", k + 1, n->n_calls,
                   rlx_last_error());
            goto done;
        }
        double worst, scale;
        int64_t at;
        if (kit_check_written(bname, c->name, n, in, hashes, out, numel, res) < 0 ||
            kit_compare_out(bname, c->name, &o, (const float *)out, ref_out, numel, &worst, &at, &scale, res) < 0)
            goto done;
        const double r_call = tol > 0 ? worst / (tol * scale) : worst > 0 ? INFINITY : 0;
        if (r_call > ratio || !(worst <= tol * scale)) {
            ratio = r_call;
            res->err = worst;
            res->limit = tol * scale;
        }
        char pos[64];
        if (!(worst <= tol * scale)) {
            where(&o, at, pos, sizeof pos);
            result(res, KIT_FAIL, "backend '%s', node '%s': call %u of %u: output%s = %.7g, expected %.7g", bname,
                   c->name, k + 1, n->n_calls, pos, (double)((const float *)out)[at], (double)ref_out[at]);
            goto done;
        }
        if (rows_numel) {
            double rworst, rscale;
            if (kit_compare_out(bname, c->name, &in[ri], in[ri].data, ref_rows, rows_numel, &rworst, &at, &rscale,
                                res) < 0) {
                strncat(res->detail, " (in its state rows)", sizeof res->detail - strlen(res->detail) - 1);
                goto done;
            }
            if (!(rworst <= tol * rscale)) {
                index_of(&in[ri], at, pos, sizeof pos);
                result(res, KIT_FAIL,
                       "backend '%s', node '%s': call %u of %u: state rows%s = %.7g, expected %.7g (error %.3g, "
                       "limit %.3g)",
                       bname, c->name, k + 1, n->n_calls, pos, (double)((const float *)in[ri].data)[at],
                       (double)ref_rows[at], rworst, tol * rscale);
                goto done;
            }
        }
        /* the state it carries to the next call */
        double sworst = 0, sscale = 1;
        int64_t sat = 0;
        for (int64_t i = 0; i < state_numel; i++)
            sscale = fmax(sscale, fabs(ref_state[i]));
        for (int64_t i = 0; i < state_numel; i++) {
            const double d = fabs((double)state[i] - ref_state[i]);
            if (!(d <= sworst)) {
                sworst = isnan(d) ? INFINITY : d;
                sat = i;
            }
        }
        const double s_call = tol > 0 ? sworst / (tol * sscale) : sworst > 0 ? INFINITY : 0;
        if (s_call > s_ratio) {
            s_ratio = s_call;
            state_err = sworst;
            state_limit = tol * sscale;
        }
        if (!(sworst <= tol * sscale)) {
            index_of(&n->in[si], sat, pos, sizeof pos);
            result(res, KIT_FAIL,
                   "backend '%s', node '%s': after call %u of %u the state%s = %.7g, expected %.7g (error %.3g, limit "
                   "%.3g)",
                   bname, c->name, k + 1, n->n_calls, pos, (double)state[sat], (double)ref_state[sat], sworst,
                   tol * sscale);
            goto done;
        }
    }
    char declined_text[96] = "";
    if (declined)
        snprintf(declined_text, sizeof declined_text, "; %u declined, run on the reference kernels", declined);
    char failing_text[64] = "";
    if (failing)
        snprintf(failing_text, sizeof failing_text, " (%u failing as they must, state kept)", failing);
    result(res, KIT_PASS, "%u calls%s, the state after each within %.3g (limit %.3g)%s", n->n_calls, failing_text,
           state_err, state_limit, declined_text);
done:
    for (uint32_t i = 0; prepared && i < ni; i++)
        rlx_backend_release_weight(r->tested, prepared[i]);
    free(prepared);
    free(shapes);
    free(hashes);
    free(in);
    free(ref_in);
    free(out);
    free(ref_out);
    free(ref_state);
    free(state);
    free(before);
    free(ref_rows);
}
