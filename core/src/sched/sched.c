/* Execution plans: backend assignment by capability query and an activation arena planned by
 * liveness (first fit over the blocks live at each step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "graph/graph_impl.h"
#include "rlx/sched.h"
#include "sched/finite.h"
#include "util/alloc.h"

#define ARENA_ALIGN 64

/* Nodes one backend call runs: one node, or a span the backend planned. */
typedef struct plan_call {
    rlx_backend *backend;
    uint32_t first, n;
    int fused;    /* through compute_span */
    void *handle; /* the backend's plan of the span */
    rlx_span span;
} plan_call;

typedef struct rebind_slot {
    size_t slot; /* in view_inputs */
    int tensor;
} rebind_slot;

struct rlx_plan {
    const rlx_graph *g;
    uint32_t flags;         /* RLX_PLAN_* */
    rlx_tensor *tensors;    /* per tensor: shape and current data pointer */
    size_t *offsets;        /* per activation: offset in the arena */
    rlx_backend **assigned; /* per node */
    uint32_t *precision;    /* per node: rlx_precision its backend declared */
    rlx_backend *ref;
    unsigned char *arena;
    size_t arena_bytes, total_bytes;
    /* per node, views that live as long as the plan (a span shows a backend several at once):
     * node i's inputs, handles and ids start at input_at[i] of the flat arrays */
    rlx_node_view *views;
    rlx_tensor *view_inputs, *view_outputs;
    void **prepared;
    size_t *input_at;
    rebind_slot *rebind; /* the inputs and states among view_inputs, refreshed per run */
    size_t n_rebind;
    uint32_t *last_use; /* per node: the last node reading its output, UINT32_MAX for outputs */
    plan_call *calls;
    uint32_t n_calls;
    uint32_t *call_last_use; /* flat: each span's last_use, counted from its first node */
    uint64_t own_weights;    /* owner of the weights of a hand-built graph, 0 otherwise */
};

typedef struct block {
    size_t offset, size;
} block;

static size_t align_up(size_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

/* First fit among the live blocks, sorted by offset. */
static size_t place(block *live, size_t *n_live, size_t size) {
    size_t at = 0, i = 0;
    for (; i < *n_live; i++) {
        if (live[i].offset >= at + size)
            break;
        at = live[i].offset + live[i].size > at ? live[i].offset + live[i].size : at;
    }
    memmove(&live[i + 1], &live[i], (*n_live - i) * sizeof *live);
    live[i] = (block){at, size};
    (*n_live)++;
    return at;
}

static void release(block *live, size_t *n_live, size_t offset) {
    for (size_t i = 0; i < *n_live; i++)
        if (live[i].offset == offset) {
            memmove(&live[i], &live[i + 1], (*n_live - i - 1) * sizeof *live);
            (*n_live)--;
            return;
        }
}

/* Offsets of the activations in one arena, call by call: a tensor's memory is reused only
 * after the call that reads it last, so the outputs of a span never overwrite what the span
 * still reads (a span may write node i's output before reading node i-1's input). */
static rlx_status plan_arena(rlx_plan *p) {
    const rlx_graph *g = p->g;
    block *live = rlx__malloc((g->n_nodes + 1) * sizeof *live);
    uint8_t *released = rlx__calloc(g->n_tensors + 1, 1);
    if (!live || !released) {
        free(live);
        free(released);
        return rlx_error(RLX_E_NOMEM, "scheduler: out of memory");
    }
    size_t n_live = 0, peak = 0;
    for (uint32_t c = 0; c < p->n_calls; c++) {
        const uint32_t first = p->calls[c].first, last = first + p->calls[c].n - 1;
        for (uint32_t i = first; i <= last; i++) {
            int out = g->nodes[i].output;
            size_t size = align_up(rlx__tensor_nbytes(&g->tensors[out].t));
            p->offsets[out] = place(live, &n_live, size);
            p->total_bytes += size;
            if (p->offsets[out] + size > peak)
                peak = p->offsets[out] + size;
        }
        /* free what dies in this call (an output too when nothing reads it) */
        for (uint32_t i = first; i <= last; i++)
            for (uint32_t k = 0; k <= g->nodes[i].n_inputs; k++) {
                int t = k < g->nodes[i].n_inputs ? g->nodes[i].inputs[k] : g->nodes[i].output;
                /* an activation is the output of its producer, which build_views gave a last use */
                if (g->tensors[t].role == RLX_ROLE_ACTIVATION && p->last_use[g->tensors[t].producer] <= last &&
                    !released[t]) {
                    release(live, &n_live, p->offsets[t]);
                    released[t] = 1;
                }
            }
    }
    free(live);
    free(released);
    p->arena_bytes = peak;
    if (peak && !(p->arena = rlx__aligned_alloc(ARENA_ALIGN, peak)))
        return rlx_error(RLX_E_NOMEM, "scheduler: cannot allocate %zu bytes of activations", peak);
    return RLX_OK;
}

/* The backend for node v: its op's rule if there is one, else the first that supports it. */
static rlx_status assign(rlx_plan *p, const rlx_node_view *v, const rlx_plan_options *o, rlx_backend **out) {
    for (size_t r = 0; r < o->n_rules; r++)
        if (o->rules[r].op == v->op) {
            if (!rlx_backend_supports(o->rules[r].backend, v))
                return rlx_error(RLX_E_UNSUPPORTED, "backend '%s' was asked to run %s nodes but does not support '%s'",
                                 rlx_backend_name(o->rules[r].backend), rlx_op_name((int)v->op), v->name);
            *out = o->rules[r].backend;
            return RLX_OK;
        }
    *out = p->ref;
    for (size_t b = 0; b < o->n_backends; b++)
        if (rlx_backend_supports(o->backends[b], v)) {
            *out = o->backends[b];
            break;
        }
    return RLX_OK;
}

/* Views of every node with the data pointers hidden (backends plan from dtypes and shapes),
 * and when each node's output is read for the last time. */
static rlx_status build_views(rlx_plan *p) {
    const rlx_graph *g = p->g;
    size_t n_in = 0;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        p->input_at[i] = n_in;
        n_in += g->nodes[i].n_inputs;
    }
    p->view_inputs = rlx__calloc(n_in + 1, sizeof *p->view_inputs);
    p->prepared = rlx__calloc(n_in + 1, sizeof *p->prepared);
    p->rebind = rlx__calloc(n_in + 1, sizeof *p->rebind);
    int32_t *reader = rlx__malloc((g->n_tensors + 1) * sizeof *reader);
    if (!p->view_inputs || !p->prepared || !p->rebind || !reader) {
        free(reader);
        return rlx_error(RLX_E_NOMEM, "scheduler: out of memory");
    }
    for (uint32_t t = 0; t < g->n_tensors; t++)
        reader[t] = -1;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const rlx__node *nd = &g->nodes[i];
        for (uint32_t k = 0; k < nd->n_inputs; k++) {
            rlx_tensor *t = &p->view_inputs[p->input_at[i] + k];
            *t = p->tensors[nd->inputs[k]];
            t->data = NULL;
            reader[nd->inputs[k]] = (int32_t)i;
            const rlx_tensor_role role = g->tensors[nd->inputs[k]].role;
            if (role == RLX_ROLE_INPUT || role == RLX_ROLE_STATE)
                p->rebind[p->n_rebind++] = (rebind_slot){p->input_at[i] + k, nd->inputs[k]};
        }
        p->view_outputs[i] = p->tensors[nd->output];
        p->view_outputs[i].data = NULL;
        p->views[i] = (rlx_node_view){.op = nd->op,
                                      .n_inputs = nd->n_inputs,
                                      .inputs = &p->view_inputs[p->input_at[i]],
                                      .output = &p->view_outputs[i],
                                      .params = &nd->params,
                                      .name = nd->name,
                                      .prepared = &p->prepared[p->input_at[i]],
                                      .input_ids = (const int32_t *)nd->inputs,
                                      .output_id = nd->output};
    }
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        const int out = g->nodes[i].output;
        p->last_use[i] = g->tensors[out].is_output ? UINT32_MAX : reader[out] > (int32_t)i ? (uint32_t)reader[out] : i;
    }
    free(reader);
    return RLX_OK;
}

/* Asks each node's backend, when it prepares weights, for its handle of every weight the node
 * reads. */
static rlx_status prepare_weights(rlx_plan *p) {
    const rlx_graph *g = p->g;
    uint64_t owner = g->weight_owner;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        rlx_backend *b = p->assigned[i];
        if (!(rlx_backend_features(b) & RLX_BACKEND_PREPARES_WEIGHTS))
            continue;
        if (!owner)
            owner = p->own_weights = rlx__weight_owner_new();
        const rlx__node *nd = &g->nodes[i];
        for (uint32_t k = 0; k < nd->n_inputs; k++) {
            const rlx__tensor_info *ti = &g->tensors[nd->inputs[k]];
            if (ti->role != RLX_ROLE_WEIGHT)
                continue;
            const rlx_weight_info w = {.size = sizeof w,
                                       .flags = g->weight_owner && !ti->in_memory ? g->weight_flags : 0,
                                       .tensor = &p->tensors[nd->inputs[k]],
                                       .name = ti->name,
                                       .op = nd->op,
                                       .input = k,
                                       .node = &p->views[i]};
            rlx_status rc = rlx__backend_prepared(b, owner, &w, &p->prepared[p->input_at[i] + k]);
            if (rc < 0)
                return rc;
        }
    }
    return RLX_OK;
}

/* Groups the nodes into backend calls: on a backend that runs spans, each run of consecutive
 * nodes it was given is offered to plan_span until the backend has taken all of it. */
static rlx_status plan_calls(rlx_plan *p) {
    const uint32_t n = p->g->n_nodes;
    p->calls = rlx__calloc(n + 1, sizeof *p->calls);
    p->call_last_use = rlx__calloc(n + 1, sizeof *p->call_last_use);
    if (!p->calls || !p->call_last_use)
        return rlx_error(RLX_E_NOMEM, "scheduler: out of memory");
    for (uint32_t i = 0; i < n;) {
        rlx_backend *b = p->assigned[i];
        plan_call *c = &p->calls[p->n_calls];
        *c = (plan_call){.backend = b, .first = i, .n = 1};
        /* a checked plan runs node by node (rlx_plan_run_checked) */
        if (!(rlx_backend_features(b) & RLX_BACKEND_RUNS_SPANS) ||
            (p->flags & (RLX_PLAN_PER_NODE | RLX_PLAN_CHECK_FINITE))) {
            p->n_calls++;
            i++;
            continue;
        }
        uint32_t end = i + 1;
        while (end < n && p->assigned[end] == b)
            end++;
        uint32_t *rel = &p->call_last_use[i];
        for (uint32_t k = i; k < end; k++)
            rel[k - i] = p->last_use[k] == UINT32_MAX ? UINT32_MAX : p->last_use[k] - i;
        const rlx_span run = {.size = sizeof run, .n_nodes = end - i, .nodes = &p->views[i], .last_use = rel};
        uint32_t taken = 0;
        void *handle = NULL;
        rlx_status rc = rlx__backend_plan_span(b, &run, &taken, &handle);
        if (rc < 0)
            return rc;
        c->n = taken;
        c->fused = 1;
        c->handle = handle;
        c->span = (rlx_span){.size = sizeof c->span, .n_nodes = taken, .nodes = &p->views[i], .last_use = rel};
        p->n_calls++;
        i += taken;
    }
    return RLX_OK;
}

rlx_status rlx_plan_create(const rlx_graph *g, const rlx_plan_options *o, rlx_plan **out) {
    static const rlx_plan_options none = {.size = sizeof none};
    if (!o)
        o = &none;
    if (!g || !out || (o->n_backends && !o->backends) || (o->n_rules && !o->rules))
        return rlx_error(RLX_E_INVALID, "rlx_plan_create: NULL argument");
    if (o->size < sizeof *o)
        return rlx_error(RLX_E_INVALID, "rlx_plan_create: options of %u bytes, this rlx needs %zu", o->size, sizeof *o);
    *out = NULL;
    rlx_plan *p = rlx__calloc(1, sizeof *p);
    if (!p)
        return rlx_error(RLX_E_NOMEM, "scheduler: out of memory");
    p->g = g;
    p->flags = o->flags;
    p->tensors = rlx__calloc(g->n_tensors + 1, sizeof *p->tensors);
    p->offsets = rlx__calloc(g->n_tensors + 1, sizeof *p->offsets);
    p->assigned = rlx__calloc(g->n_nodes + 1, sizeof *p->assigned);
    p->precision = rlx__calloc(g->n_nodes + 1, sizeof *p->precision);
    p->views = rlx__calloc(g->n_nodes + 1, sizeof *p->views);
    p->view_outputs = rlx__calloc(g->n_nodes + 1, sizeof *p->view_outputs);
    p->input_at = rlx__calloc(g->n_nodes + 1, sizeof *p->input_at);
    p->last_use = rlx__calloc(g->n_nodes + 1, sizeof *p->last_use);
    rlx_status rc = RLX_E_NOMEM;
    if (!p->tensors || !p->offsets || !p->assigned || !p->precision || !p->views || !p->view_outputs || !p->input_at ||
        !p->last_use) {
        rc = rlx_error(RLX_E_NOMEM, "scheduler: out of memory");
        goto fail;
    }
    if ((rc = rlx_backend_create_ref(NULL, &p->ref)) < 0)
        goto fail;
    for (uint32_t t = 0; t < g->n_tensors; t++) {
        p->tensors[t] = g->tensors[t].t;
        if (g->tensors[t].role != RLX_ROLE_WEIGHT)
            p->tensors[t].data = NULL;
    }
    if ((rc = build_views(p)) < 0)
        goto fail;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        if ((rc = assign(p, &p->views[i], o, &p->assigned[i])) < 0)
            goto fail;
        p->precision[i] = rlx_backend_precision(p->assigned[i], &p->views[i]);
    }
    if ((rc = prepare_weights(p)) < 0 || (rc = plan_calls(p)) < 0 || (rc = plan_arena(p)) < 0)
        goto fail;
    for (uint32_t t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].role == RLX_ROLE_ACTIVATION)
            p->tensors[t].data = p->arena + p->offsets[t];
    /* planned: from now on the views carry the data (inputs and states are refreshed per run) */
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        for (uint32_t k = 0; k < g->nodes[i].n_inputs; k++)
            p->view_inputs[p->input_at[i] + k].data = p->tensors[g->nodes[i].inputs[k]].data;
        p->view_outputs[i].data = p->tensors[g->nodes[i].output].data;
    }
    *out = p;
    return RLX_OK;
fail:
    rlx_plan_destroy(p);
    return rc;
}

void rlx_plan_destroy(rlx_plan *p) {
    if (!p)
        return;
    for (uint32_t c = 0; c < p->n_calls; c++)
        if (p->calls[c].handle)
            rlx__backend_release_span(p->calls[c].backend, p->calls[c].handle);
    if (p->own_weights)
        rlx__weight_owner_release(p->own_weights);
    rlx_backend_destroy(p->ref);
    free(p->tensors);
    free(p->offsets);
    free(p->assigned);
    free(p->precision);
    free(p->views);
    free(p->view_inputs);
    free(p->view_outputs);
    free(p->prepared);
    free(p->input_at);
    free(p->rebind);
    free(p->last_use);
    free(p->calls);
    free(p->call_last_use);
    free(p->arena);
    free(p);
}

size_t rlx_plan_peak_bytes(const rlx_plan *p) { return p->arena_bytes; }
size_t rlx_plan_total_activation_bytes(const rlx_plan *p) { return p->total_bytes; }

rlx_status rlx_plan_bind(rlx_plan *p, int id, void *data) {
    if (!p || id < 0 || (uint32_t)id >= p->g->n_tensors)
        return rlx_error(RLX_E_INVALID, "rlx_plan_bind: no tensor %d", id);
    rlx_tensor_role role = p->g->tensors[id].role;
    if (role != RLX_ROLE_INPUT && role != RLX_ROLE_STATE)
        return rlx_error(RLX_E_INVALID, "rlx_plan_bind: tensor '%s' is not an input or state", p->g->tensors[id].name);
    p->tensors[id].data = data;
    return RLX_OK;
}

/* Values scanned per block before looking at the block's largest magnitude: small enough that
 * a block stays in L1 for the second, scalar pass, large enough to amortise the test. */
#define FINITE_BLOCK 2048

/* The first value of u[0 .. n) whose magnitude bits (u & 0x7fffffff) reach inf, the magnitude
 * of an infinity: each block is first folded by OR over the comparisons, a loop that vectorizes
 * with SSE2 alone (magnitudes are non-negative as signed values, so the signed compare serves),
 * and searched only when one compared true. Bit patterns go through memcpy, which compilers make
 * plain loads. */
static int64_t first_at_least32(const void *u, size_t n, uint32_t inf) {
    for (size_t at = 0; at < n; at += FINITE_BLOCK) {
        const size_t end = n - at < FINITE_BLOCK ? n : at + FINITE_BLOCK;
        int32_t bad = 0;
        for (size_t i = at; i < end; i++) {
            int32_t v;
            memcpy(&v, (const int32_t *)u + i, sizeof v);
            bad |= (v & 0x7fffffff) >= (int32_t)inf;
        }
        for (size_t i = at; bad && i < end; i++) {
            uint32_t v;
            memcpy(&v, (const uint32_t *)u + i, sizeof v);
            if ((v & 0x7fffffffu) >= inf)
                return (int64_t)i;
        }
    }
    return -1;
}

/* first_at_least32 for 16-bit values (magnitude bits u & 0x7fff). */
static int64_t first_at_least16(const void *u, size_t n, uint16_t inf) {
    for (size_t at = 0; at < n; at += FINITE_BLOCK) {
        const size_t end = n - at < FINITE_BLOCK ? n : at + FINITE_BLOCK;
        int16_t bad = 0;
        for (size_t i = at; i < end; i++) {
            int16_t v;
            memcpy(&v, (const int16_t *)u + i, sizeof v);
            bad |= (int16_t)(v & 0x7fff) >= (int16_t)inf;
        }
        for (size_t i = at; bad && i < end; i++) {
            uint16_t v;
            memcpy(&v, (const uint16_t *)u + i, sizeof v);
            if ((v & 0x7fffu) >= inf)
                return (int64_t)i;
        }
    }
    return -1;
}

int64_t rlx__first_nonfinite(uint32_t dtype, const void *data, size_t n, const char **kind) {
    const int wide = dtype == RLX_DTYPE_F32;
    const uint32_t inf = wide ? 0x7f800000u : dtype == RLX_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    if (!wide && dtype != RLX_DTYPE_BF16 && dtype != RLX_DTYPE_F16)
        return -1;
    const int64_t at = wide ? first_at_least32(data, n, inf) : first_at_least16(data, n, (uint16_t)inf);
    if (at >= 0) {
        uint32_t v = 0;
        if (wide)
            memcpy(&v, (const uint32_t *)data + at, sizeof v);
        else {
            uint16_t h;
            memcpy(&h, (const uint16_t *)data + at, sizeof h);
            v = (uint32_t)h << 16; /* the sign bit where F32 has it */
        }
        const uint32_t mag = wide ? v & 0x7fffffffu : (v >> 16) & 0x7fffu;
        *kind = mag > inf ? "NaN" : v & 0x80000000u ? "-Inf" : "+Inf";
    }
    return at;
}

/* "[5, 64]" */
static void shape_text(const rlx_tensor *t, char *text, size_t len) {
    size_t at = (size_t)snprintf(text, len, "[");
    for (uint32_t d = 0; d < t->n_dims && at < len; d++)
        at += (size_t)snprintf(text + at, len - at, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (at < len)
        snprintf(text + at, len - at, "]");
}

/* RLX_E_RANGE naming node i when its output holds a NaN or an infinity. */
static rlx_status check_node(const rlx_plan *p, uint32_t i) {
    const rlx_tensor *out = p->views[i].output;
    if (out->dtype != RLX_DTYPE_F32 && out->dtype != RLX_DTYPE_BF16 && out->dtype != RLX_DTYPE_F16)
        return RLX_OK; /* ids and positions: no value of theirs is "not finite" */
    const size_t n = rlx__tensor_nbytes(out) / rlx_dtype_size((int)out->dtype);
    const char *kind = NULL;
    const int64_t at = rlx__first_nonfinite(out->dtype, out->data, n, &kind);
    if (at < 0)
        return RLX_OK;
    char shape[96];
    shape_text(out, shape, sizeof shape);
    return rlx_error(RLX_E_RANGE, "node '%s' (%s on %s) wrote %s at element %lld of its %s output", p->views[i].name,
                     rlx_op_name((int)p->views[i].op), rlx_backend_name(p->assigned[i]), kind, (long long)at, shape);
}

/* Every input and state bound, and the views pointing at this run's bindings. */
static rlx_status prepare_run(rlx_plan *p) {
    for (uint32_t t = 0; t < p->g->n_tensors; t++)
        if (!p->tensors[t].data && p->g->tensors[t].role != RLX_ROLE_ACTIVATION)
            return rlx_error(RLX_E_INVALID, "tensor '%s' is not bound", p->g->tensors[t].name);
    for (size_t r = 0; r < p->n_rebind; r++)
        p->view_inputs[p->rebind[r].slot].data = p->tensors[p->rebind[r].tensor].data;
    return RLX_OK;
}

rlx_status rlx_plan_run_checked(rlx_plan *p) {
    if (!p)
        return rlx_error(RLX_E_INVALID, "rlx_plan_run_checked: plan is NULL");
    rlx_status rc = prepare_run(p);
    for (uint32_t i = 0; rc == RLX_OK && i < p->g->n_nodes; i++)
        if ((rc = rlx_backend_compute(p->assigned[i], &p->views[i])) == RLX_OK)
            rc = check_node(p, i);
    return rc;
}

rlx_status rlx_plan_run(rlx_plan *p) {
    if (!p)
        return rlx_error(RLX_E_INVALID, "rlx_plan_run: plan is NULL");
    if (p->flags & RLX_PLAN_CHECK_FINITE)
        return rlx_plan_run_checked(p);
    rlx_status rc = prepare_run(p);
    for (uint32_t c = 0; rc == RLX_OK && c < p->n_calls; c++) {
        const plan_call *call = &p->calls[c];
        rc = call->fused ? rlx__backend_compute_span(call->backend, call->handle, &call->span)
                         : rlx_backend_compute(call->backend, &p->views[call->first]);
    }
    return rc;
}

uint32_t rlx_plan_n_calls(const rlx_plan *p) { return p ? p->n_calls : 0; }

const void *rlx_plan_data(const rlx_plan *p, int id) {
    return p && id >= 0 && (uint32_t)id < p->g->n_tensors ? p->tensors[id].data : NULL;
}

const char *rlx_plan_node_backend(const rlx_plan *p, uint32_t node) {
    return p && node < p->g->n_nodes ? rlx_backend_name(p->assigned[node]) : "?";
}

uint32_t rlx_plan_node_precision(const rlx_plan *p, uint32_t node) {
    return p && node < p->g->n_nodes ? p->precision[node] : RLX_PRECISION_F32;
}

uint32_t rlx_plan_backend_switches(const rlx_plan *p) {
    uint32_t n = 0;
    for (uint32_t i = 1; p && i < p->g->n_nodes; i++)
        n += p->assigned[i] != p->assigned[i - 1];
    return n;
}
