/* Batch invariance (slot forms: ATTENTION, ABI 1.4; SSM_CONV and GATED_DELTA, ABI 1.6): a
 * row's bits must not depend on the batch it runs in, nor on the backend's thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

/* Runs rows[0..m) of slot-form node n, gathered into a call of their own, on b: each input with
 * a row per row of the node (activations, positions, slots) gathered, weights as they are, and
 * state input i over states[i]. Output into out [m, cols]. */
static int run_rows(rlx_backend *b, const kit_node *n, const int64_t *rows, int64_t m, void *const *states, float *out,
                    const char *name) {
    const uint32_t ni = n->n_inputs;
    rlx_tensor *in = calloc(ni, sizeof *in);
    void **buf = calloc(ni, sizeof *buf);
    int rc = RLX_E_NOMEM;
    if (!in || !buf)
        goto done;
    memcpy(in, n->in, ni * sizeof *in);
    for (uint32_t i = 0; i < ni; i++) {
        if (is_state(n, i)) {
            in[i].data = states[i];
            continue;
        }
        if (n->is_weight[i])
            continue;
        const size_t row_bytes = bytes_of(&n->in[i]) / (size_t)n->in[i].shape[0];
        if (!(buf[i] = kit_alloc((size_t)m * row_bytes)))
            goto done;
        for (int64_t k = 0; k < m; k++)
            memcpy((char *)buf[i] + k * row_bytes, (const char *)n->in[i].data + rows[k] * row_bytes, row_bytes);
        in[i].shape[0] = m;
        in[i].data = buf[i];
    }
    rlx_tensor o = n->out;
    o.shape[0] = m;
    o.data = out;
    const rlx_node_view v = {
        .op = n->op, .n_inputs = ni, .inputs = in, .output = &o, .params = &n->p, .name = name, .output_id = -1};
    rc = rlx_backend_compute(b, &v);
done:
    for (uint32_t i = 0; buf && i < ni; i++)
        free(buf[i]);
    free(buf);
    free(in);
    return rc;
}

/* The recurrent state of slot 0 (pass 3 runs only its rows) or of every slot after a pass
 * matches the whole batch's, bit for bit. Returns 0, or -1 with res set. */
static int same_states(const kit_node *n, void *const *states, void *const *batch, int slot0_only, const char *bname,
                       const char *name, const char *what, kit_result *res) {
    for (uint32_t i = 0; i < n->n_inputs; i++) {
        if (!is_state(n, i))
            continue;
        const size_t bytes = bytes_of(&n->in[i]) / (slot0_only ? (size_t)n->in[i].shape[0] : 1);
        if (memcmp(states[i], batch[i], bytes) != 0) {
            result(res, KIT_FAIL,
                   "backend '%s', node '%s': the state %s differs from the whole batch's (a slot's state must not "
                   "depend on the batch)",
                   bname, name, what);
            return -1;
        }
    }
    return 0;
}

/* Node n (slot form, inputs filled) as one batch on the tested backend, then on an instance
 * with another thread count, then each row in a call of its own (in order, so every row sees
 * the cache rows or state written before it), then slot 0's rows in calls of 5 without the
 * other slots' rows: every row's output must be the same bits every time, and so must a
 * recurrent op's state after each pass (slot 0's, after the last). */
void kit_judge_invariance(kit_runner *r, const kit_check *c, kit_node *n, kit_result *res) {
    const char *bname = rlx_backend_name(r->tested);
    const uint32_t ni = n->n_inputs;
    const int recurrent = n->op != RLX_OP_ATTENTION;
    const uint32_t pos_in = n->op == RLX_OP_ATTENTION ? 3 : n->op == RLX_OP_SSM_CONV ? 2 : 5, seq_in = ni - 1;
    const int64_t T = n->in[0].shape[0], cols = n->out.shape[1];
    const size_t row_bytes = (size_t)cols * sizeof(float);
    const int32_t *pos = n->in[pos_in].data, *seq = n->in[seq_in].data;
    float *batch = kit_alloc((size_t)T * row_bytes), *got = kit_alloc((size_t)T * row_bytes);
    void **states = calloc(ni, sizeof *states), **batch_states = calloc(ni, sizeof *batch_states);
    int64_t *rows = calloc((size_t)T, sizeof *rows);
    rlx_backend *other = NULL;
    int ok = batch && got && states && batch_states && rows;
    for (uint32_t i = 0; ok && i < ni; i++)
        if (is_state(n, i))
            ok = (states[i] = kit_alloc(bytes_of(&n->in[i]))) && (batch_states[i] = kit_alloc(bytes_of(&n->in[i])));
    if (!ok) {
        result(res, KIT_FAIL, "kit: out of memory");
        goto done;
    }
    for (int64_t t = 0; t < T; t++)
        rows[t] = t;
    const char *what[4] = {NULL, "on another thread count", "in a call of its own", "in calls of 5 rows of its slot"};
    const char *state_what[4] = {NULL, "on another thread count", "after each row in a call of its own",
                                 "of slot 0 after its rows in calls of 5"};
    for (int pass = 0; pass < 4; pass++) {
        for (uint32_t i = 0; i < ni; i++)
            if (is_state(n, i))
                memcpy(states[i], n->in[i].data, bytes_of(&n->in[i]));
        rlx_backend *b = r->tested;
        if (pass == 1) {
            rlx_backend_options bo = rlx_backend_options_default();
            bo.n_threads = r->o->threads == 1 ? 2 : 1;
            bo.extra = r->o->backend_opts;
            phase(r, "open() with another thread count");
            if ((r->o->builtin_ref ? rlx_backend_create_ref(&bo, &other)
                                   : rlx_backend_create(r->plugin, &bo, &other)) != RLX_OK) {
                result(res, KIT_FAIL, "backend '%s' failed to open with %u threads: %s", bname, bo.n_threads,
                       rlx_last_error());
                goto done;
            }
            b = other;
        }
        phase(r, pass == 0 ? "compute()" : what[pass]);
        int rc = RLX_OK;
        int64_t done_rows = 0;
        if (pass < 2) {
            rc = run_rows(b, n, rows, T, states, pass ? got : batch, c->name);
            done_rows = T;
        } else {
            /* rows[0..m) of this pass, in the batch's order */
            int64_t m = 0;
            for (int64_t t = 0; t < T; t++)
                if (pass == 2 || seq[t] == 0)
                    rows[m++] = t;
            const int64_t step = pass == 2 ? 1 : 5;
            for (int64_t k = 0; k < m && rc == RLX_OK; k += step) {
                const int64_t cnt = m - k < step ? m - k : step;
                rc = run_rows(b, n, rows + k, cnt, states, got + k * cols, c->name);
            }
            done_rows = m;
        }
        if (rc != RLX_OK) {
            result(res, KIT_FAIL, "claimed the node, then failed it %s: %s", pass ? what[pass] : "", rlx_last_error());
            goto done;
        }
        for (int64_t k = 0; pass > 0 && k < done_rows; k++) {
            const int64_t t = pass < 2 ? k : rows[k];
            if (memcmp(got + k * cols, batch + t * cols, row_bytes) != 0) {
                result(res, KIT_FAIL,
                       "backend '%s', node '%s': row %lld (slot %d, position %d) %s differs from the same row in the "
                       "whole batch (a row's bits must not depend on the batch)",
                       bname, c->name, (long long)t, seq[t], pos[t], what[pass]);
                goto done;
            }
        }
        if (recurrent && pass == 0)
            for (uint32_t i = 0; i < ni; i++)
                if (is_state(n, i))
                    memcpy(batch_states[i], states[i], bytes_of(&n->in[i]));
        if (recurrent && pass > 0 &&
            same_states(n, states, batch_states, pass == 3, bname, c->name, state_what[pass], res) < 0)
            goto done;
        for (int64_t t = 0; t < T; t++)
            rows[t] = t;
    }
    res->err = 0;
    res->limit = 0;
    result(res, KIT_PASS, "%s",
           recurrent ? "bit for bit, outputs and states: alone, in slot chunks, and on another thread count"
                     : "bit for bit: alone, in slot chunks, and on another thread count");
done:
    rlx_backend_destroy(other);
    for (uint32_t i = 0; i < ni; i++) {
        free(states ? states[i] : NULL);
        free(batch_states ? batch_states[i] : NULL);
    }
    free(states);
    free(batch_states);
    free(batch);
    free(got);
    free(rows);
}
