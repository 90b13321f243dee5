/* Execution plans: backend assignment by capability query and an activation arena planned by
 * liveness (first fit over the blocks live at each step). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "graph/graph_impl.h"
#include "rlx/sched.h"

#define ARENA_ALIGN 64

struct rlx_plan {
    const rlx_graph *g;
    rlx_tensor *tensors;     /* per tensor: shape and current data pointer */
    size_t *offsets;         /* per activation: offset in the arena */
    rlx_backend **assigned;  /* per node */
    uint32_t *precision;     /* per node: rlx_precision its backend declared */
    rlx_backend *ref;
    unsigned char *arena;
    size_t arena_bytes, total_bytes;
    rlx_tensor *scratch_inputs; /* the widest node's inputs, filled per node at run time */
    uint32_t max_inputs;
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

static rlx_status plan_arena(rlx_plan *p) {
    const rlx_graph *g = p->g;
    int *last_use = malloc(g->n_tensors * sizeof *last_use);
    block *live = malloc((g->n_nodes + 1) * sizeof *live);
    if (!last_use || !live) {
        free(last_use);
        free(live);
        return rlx_error(RLX_E_NOMEM, "scheduler: out of memory");
    }
    for (uint32_t t = 0; t < g->n_tensors; t++)
        last_use[t] = g->tensors[t].is_output ? (int)g->n_nodes : g->tensors[t].producer;
    for (uint32_t i = 0; i < g->n_nodes; i++)
        for (uint32_t k = 0; k < g->nodes[i].n_inputs; k++)
            if (last_use[g->nodes[i].inputs[k]] < (int)i)
                last_use[g->nodes[i].inputs[k]] = (int)i;
    size_t n_live = 0, peak = 0;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        int out = g->nodes[i].output;
        size_t size = align_up(rlx__tensor_nbytes(&g->tensors[out].t));
        p->offsets[out] = place(live, &n_live, size);
        p->total_bytes += size;
        if (p->offsets[out] + size > peak)
            peak = p->offsets[out] + size;
        /* free what dies here (the output itself too when nothing reads it) */
        for (uint32_t k = 0; k <= g->nodes[i].n_inputs; k++) {
            int t = k < g->nodes[i].n_inputs ? g->nodes[i].inputs[k] : out;
            if (g->tensors[t].role == RLX_ROLE_ACTIVATION && last_use[t] == (int)i)
                release(live, &n_live, p->offsets[t]);
        }
    }
    free(last_use);
    free(live);
    p->arena_bytes = peak;
    if (peak && !(p->arena = aligned_alloc(ARENA_ALIGN, peak)))
        return rlx_error(RLX_E_NOMEM, "scheduler: cannot allocate %zu bytes of activations", peak);
    return RLX_OK;
}

static void fill_view(rlx_plan *p, uint32_t i, rlx_node_view *v) {
    const rlx__node *nd = &p->g->nodes[i];
    for (uint32_t k = 0; k < nd->n_inputs; k++)
        p->scratch_inputs[k] = p->tensors[nd->inputs[k]];
    *v = (rlx_node_view){.op = nd->op,
                         .n_inputs = nd->n_inputs,
                         .inputs = p->scratch_inputs,
                         .output = &p->tensors[nd->output],
                         .params = &nd->params,
                         .name = nd->name};
}

rlx_status rlx_plan_create(const rlx_graph *g, rlx_backend *const *backends, size_t n_backends, rlx_plan **out) {
    return rlx_plan_create_placed(g, backends, n_backends, NULL, 0, out);
}

/* The backend for node v: its op's rule if there is one, else the first that supports it. */
static rlx_status assign(rlx_plan *p, const rlx_node_view *v, rlx_backend *const *backends, size_t n_backends,
                         const rlx_place_rule *rules, size_t n_rules, rlx_backend **out) {
    for (size_t r = 0; r < n_rules; r++)
        if (rules[r].op == v->op) {
            if (!rlx_backend_supports(rules[r].backend, v))
                return rlx_error(RLX_E_UNSUPPORTED, "backend '%s' was asked to run %s nodes but does not support '%s'",
                                 rlx_backend_name(rules[r].backend), rlx_op_name((int)v->op), v->name);
            *out = rules[r].backend;
            return RLX_OK;
        }
    *out = p->ref;
    for (size_t b = 0; b < n_backends; b++)
        if (rlx_backend_supports(backends[b], v)) {
            *out = backends[b];
            break;
        }
    return RLX_OK;
}

rlx_status rlx_plan_create_placed(const rlx_graph *g, rlx_backend *const *backends, size_t n_backends,
                                  const rlx_place_rule *rules, size_t n_rules, rlx_plan **out) {
    if (!g || !out || (n_backends && !backends) || (n_rules && !rules))
        return rlx_error(RLX_E_INVALID, "rlx_plan_create: NULL argument");
    *out = NULL;
    rlx_plan *p = calloc(1, sizeof *p);
    if (!p)
        return rlx_error(RLX_E_NOMEM, "scheduler: out of memory");
    p->g = g;
    for (uint32_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].n_inputs > p->max_inputs)
            p->max_inputs = g->nodes[i].n_inputs;
    p->tensors = calloc(g->n_tensors + 1, sizeof *p->tensors);
    p->offsets = calloc(g->n_tensors + 1, sizeof *p->offsets);
    p->assigned = calloc(g->n_nodes + 1, sizeof *p->assigned);
    p->precision = calloc(g->n_nodes + 1, sizeof *p->precision);
    p->scratch_inputs = calloc(p->max_inputs + 1, sizeof *p->scratch_inputs);
    rlx_status rc = RLX_E_NOMEM;
    if (!p->tensors || !p->offsets || !p->assigned || !p->precision || !p->scratch_inputs) {
        rc = rlx_error(RLX_E_NOMEM, "scheduler: out of memory");
        goto fail;
    }
    if ((rc = rlx_backend_create_ref(&p->ref)) < 0)
        goto fail;
    for (uint32_t t = 0; t < g->n_tensors; t++)
        p->tensors[t] = g->tensors[t].t;
    if ((rc = plan_arena(p)) < 0)
        goto fail;
    for (uint32_t t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].role == RLX_ROLE_ACTIVATION)
            p->tensors[t].data = p->arena + p->offsets[t];
        else if (g->tensors[t].role != RLX_ROLE_WEIGHT)
            p->tensors[t].data = NULL;
    for (uint32_t i = 0; i < g->n_nodes; i++) {
        rlx_node_view v;
        fill_view(p, i, &v);
        /* backends decide from dtypes and shapes alone, so hide the data pointers */
        for (uint32_t k = 0; k < v.n_inputs; k++)
            p->scratch_inputs[k].data = NULL;
        rlx_tensor out_shape = *v.output;
        out_shape.data = NULL;
        v.output = &out_shape;
        if ((rc = assign(p, &v, backends, n_backends, rules, n_rules, &p->assigned[i])) < 0)
            goto fail;
        p->precision[i] = rlx_backend_precision(p->assigned[i], &v);
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
    rlx_backend_destroy(p->ref);
    free(p->tensors);
    free(p->offsets);
    free(p->assigned);
    free(p->precision);
    free(p->scratch_inputs);
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

rlx_status rlx_plan_run(rlx_plan *p) {
    if (!p)
        return rlx_error(RLX_E_INVALID, "rlx_plan_run: plan is NULL");
    for (uint32_t t = 0; t < p->g->n_tensors; t++)
        if (!p->tensors[t].data && p->g->tensors[t].role != RLX_ROLE_ACTIVATION)
            return rlx_error(RLX_E_INVALID, "tensor '%s' is not bound", p->g->tensors[t].name);
    for (uint32_t i = 0; i < p->g->n_nodes; i++) {
        rlx_node_view v;
        fill_view(p, i, &v);
        rlx_status rc = rlx_backend_compute(p->assigned[i], &v);
        if (rc < 0)
            return rc;
    }
    return RLX_OK;
}

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
