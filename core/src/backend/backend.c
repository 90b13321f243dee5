/* Backend instances: the built-in reference backend and instances opened from plugins. All
 * calls into a plugin go through here so failures are reported with the backend's name. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "util/alloc.h"

/* Every open backend, so that closing a model can release what each prepared for it. The
 * lock also guards every backend's table of prepared weights. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static rlx_backend *live;
static atomic_uint_fast64_t last_owner;

/* The ABI minor a node needs of a backend, which is never asked about a node of a later one: 1
 * for CONCAT, 3 for a quantized input (a plugin built before 1.3 could not tell a block-quantized
 * tensor from garbage), 4 for GATHER_ROWS and for an ATTENTION with slots or F16 caches (an
 * older plugin would read a 3-D cache as one sequence and F16 rows as F32), 5 for a ROPE with
 * factors, 6 for SIGMOID_MUL, SSM_CONV, GATED_DELTA and a partial ROPE (an older plugin would
 * turn the whole head: rope_dims was a reserved field to it), 7 for a recurrent op with state rows
 * (an older plugin would leave them unwritten), 8 for an ATTENTION over Q8_0 caches (an older plugin
 * would read their blocks as F32 or F16 values). */
static uint32_t node_minor(const rlx_node_view *node) {
    if ((node->op == RLX_OP_SSM_CONV || node->op == RLX_OP_GATED_DELTA) && node->params && node->params->state_rows)
        return 7;
    if (node->op == RLX_OP_SIGMOID_MUL || node->op == RLX_OP_SSM_CONV || node->op == RLX_OP_GATED_DELTA)
        return 6;
    if (node->op == RLX_OP_ROPE && node->params && node->params->rope_dims &&
        node->params->rope_dims != node->params->head_dim)
        return 6;
    if (node->op == RLX_OP_ROPE && node->n_inputs > 2)
        return 5;
    if (node->op == RLX_OP_GATHER_ROWS)
        return 4;
    if (node->op == RLX_OP_ATTENTION && rlx_iface_dtype_is_quantized(node->inputs[4].dtype))
        return 8;
    if (node->op == RLX_OP_ATTENTION &&
        (node->n_inputs != 6 || node->inputs[4].n_dims != 2 || node->inputs[4].dtype != RLX_DTYPE_F32 ||
         node->inputs[5].dtype != RLX_DTYPE_F32))
        return 4;
    for (uint32_t i = 0; i < node->n_inputs; i++)
        if (rlx_iface_dtype_is_quantized(node->inputs[i].dtype))
            return 3;
    return node->op == RLX_OP_CONCAT ? 1 : 0;
}

/* A member the plugin's table has, NULL when it is shorter or the plugin predates 1.2. */
#define MEMBER_12(iface, abi_minor, m) ((abi_minor) >= 2 && RLX_HAS(rlx_backend_iface, iface, m) ? (iface)->m : NULL)

/* The detail a plugin gave with status rc (its host->error message, else the status's name),
 * copied out, since the core's own rlx_error about it replaces the thread's message. */
typedef struct plugin_why {
    char text[512];
} plugin_why;

static const char *why_of(int rc, plugin_why *w) {
    snprintf(w->text, sizeof w->text, "%s", *rlx_last_error() ? rlx_last_error() : rlx_status_str(rc));
    return w->text;
}

rlx_backend_options rlx_backend_options_default(void) {
    return (rlx_backend_options){.size = sizeof(rlx_backend_options)};
}

/* abi_minor: what the plugin was built for; members of later minors are never read. */
static rlx_status backend_new(const rlx_backend_iface *iface, uint32_t abi_minor, const char *name,
                              const rlx_backend_options *opts, rlx_backend **out) {
    rlx_backend *b = rlx__calloc(1, sizeof *b);
    if (!b)
        return rlx_error(RLX_E_NOMEM, "backend '%s': out of memory", name);
    b->iface = iface;
    b->abi_minor = abi_minor;
    b->precision = MEMBER_12(iface, abi_minor, precision);
    b->describe = MEMBER_12(iface, abi_minor, describe);
    b->prepare_weight = MEMBER_12(iface, abi_minor, prepare_weight);
    b->release_weight = MEMBER_12(iface, abi_minor, release_weight);
    b->plan_span = MEMBER_12(iface, abi_minor, plan_span);
    b->compute_span = MEMBER_12(iface, abi_minor, compute_span);
    b->release_span = MEMBER_12(iface, abi_minor, release_span);
    snprintf(b->name, sizeof b->name, "%s", name);
    rlx_backend_options o = opts ? *opts : rlx_backend_options_default();
    rlx_error_clear();
    int rc = iface->open(rlx_host_table(), &o, &b->self);
    if (rc < 0) {
        plugin_why why;
        why_of(rc, &why);
        free(b);
        return rlx_error(rc, "backend '%s' failed to open: %s", name, why.text);
    }
    pthread_mutex_lock(&live_lock);
    b->next_live = live;
    if (live)
        live->prev_live = b;
    live = b;
    pthread_mutex_unlock(&live_lock);
    *out = b;
    return RLX_OK;
}

rlx_status rlx_backend_create_ref(const rlx_backend_options *opts, rlx_backend **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_backend_create_ref: out is NULL");
    *out = NULL;
    return backend_new(&rlx__ref_backend_iface, RLX_ABI_MINOR, "ref", opts, out);
}

rlx_status rlx_backend_create(const rlx_plugin_handle *plugin, const rlx_backend_options *opts, rlx_backend **out) {
    if (!plugin || !out)
        return rlx_error(RLX_E_INVALID, "rlx_backend_create: NULL argument");
    *out = NULL;
    const rlx_plugin *d = rlx_plugin_desc(plugin);
    if (d->kind != RLX_PLUGIN_BACKEND)
        return rlx_error(RLX_E_INVALID, "%s: plugin '%s' is a %s, not a backend", rlx_plugin_path(plugin), d->name,
                         rlx_plugin_kind_name(d->kind));
    return backend_new(d->iface, d->abi_minor, d->name, opts, out);
}

void rlx_backend_destroy(rlx_backend *b) {
    if (!b)
        return;
    pthread_mutex_lock(&live_lock);
    if (b->prev_live)
        b->prev_live->next_live = b->next_live;
    else
        live = b->next_live;
    if (b->next_live)
        b->next_live->prev_live = b->prev_live;
    pthread_mutex_unlock(&live_lock);
    for (size_t i = 0; i < b->cap_prepared; i++)
        if (b->prepared[i].owner && b->prepared[i].handle)
            b->release_weight(b->self, b->prepared[i].handle);
    free(b->prepared);
    b->iface->close(b->self);
    free(b);
}

uint32_t rlx_backend_features(const rlx_backend *b) {
    if (!b)
        return 0;
    return (b->prepare_weight ? RLX_BACKEND_PREPARES_WEIGHTS : 0u) | (b->compute_span ? RLX_BACKEND_RUNS_SPANS : 0u);
}

uint32_t rlx_backend_abi_minor(const rlx_backend *b) { return b ? b->abi_minor : 0; }

uint64_t rlx__weight_owner_new(void) { return atomic_fetch_add(&last_owner, 1) + 1; }

static size_t prepared_home(const rlx__prepared *e, size_t cap) {
    uint64_t h = e->owner * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)e->data ^ ((uint64_t)e->op << 40 | e->input);
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (size_t)h & (cap - 1);
}

/* The slot holding key's entry, or the free slot where it belongs (linear probing). */
static size_t prepared_find(const rlx__prepared *table, size_t cap, const rlx__prepared *key) {
    size_t i = prepared_home(key, cap);
    while (table[i].owner && !(table[i].owner == key->owner && table[i].data == key->data && table[i].op == key->op &&
                               table[i].input == key->input))
        i = (i + 1) & (cap - 1);
    return i;
}

/* Empties slot i, shifting later entries of its probe chain back so every entry stays
 * reachable from its home slot (deletion without tombstones or allocation). */
static void prepared_remove(rlx_backend *b, size_t i) {
    const size_t mask = b->cap_prepared - 1;
    b->prepared[i].owner = 0;
    for (size_t j = (i + 1) & mask; b->prepared[j].owner; j = (j + 1) & mask) {
        const size_t home = prepared_home(&b->prepared[j], b->cap_prepared);
        const int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            b->prepared[i] = b->prepared[j];
            b->prepared[j].owner = 0;
            i = j;
        }
    }
    b->n_prepared--;
}

void rlx__weight_owner_release(uint64_t owner) {
    pthread_mutex_lock(&live_lock);
    for (rlx_backend *b = live; b; b = b->next_live)
        for (size_t i = 0; i < b->cap_prepared;) {
            if (b->prepared[i].owner != owner) {
                i++;
                continue;
            }
            if (b->prepared[i].handle)
                b->release_weight(b->self, b->prepared[i].handle);
            prepared_remove(b, i); /* an entry may have moved into slot i: look at it again */
        }
    pthread_mutex_unlock(&live_lock);
}

/* Doubles b's table (or creates it) when it is half full. */
static rlx_status prepared_grow(rlx_backend *b) {
    if (2 * (b->n_prepared + 1) <= b->cap_prepared)
        return RLX_OK;
    const size_t cap = b->cap_prepared ? 2 * b->cap_prepared : 64;
    rlx__prepared *table = rlx__calloc(cap, sizeof *table);
    if (!table)
        return rlx_error(RLX_E_NOMEM, "backend '%s': out of memory for its prepared weights", b->name);
    for (size_t i = 0; i < b->cap_prepared; i++)
        if (b->prepared[i].owner)
            table[prepared_find(table, cap, &b->prepared[i])] = b->prepared[i];
    free(b->prepared);
    b->prepared = table;
    b->cap_prepared = cap;
    return RLX_OK;
}

static rlx_status prepare(rlx_backend *b, const rlx_weight_info *weight, void **handle) {
    *handle = NULL;
    rlx_error_clear();
    int rc = b->prepare_weight(b->self, weight, handle);
    if (rc >= 0)
        return RLX_OK;
    *handle = NULL;
    plugin_why why;
    return rlx_error(rc, "backend '%s' failed to prepare weight '%s' (input %u of %s): %s", b->name, weight->name,
                     weight->input, rlx_op_name((int)weight->op), why_of(rc, &why));
}

rlx_status rlx__backend_prepared(rlx_backend *b, uint64_t owner, const rlx_weight_info *weight, void **handle) {
    *handle = NULL;
    if (!b->prepare_weight)
        return RLX_OK;
    const rlx__prepared key = {.owner = owner, .data = weight->tensor->data, .op = weight->op, .input = weight->input};
    pthread_mutex_lock(&live_lock);
    rlx_status rc = prepared_grow(b);
    if (rc == RLX_OK) {
        rlx__prepared *e = &b->prepared[prepared_find(b->prepared, b->cap_prepared, &key)];
        if (e->owner) {
            *handle = e->handle;
        } else if ((rc = prepare(b, weight, handle)) == RLX_OK) {
            *e = key;
            e->handle = *handle;
            b->n_prepared++;
        }
    }
    pthread_mutex_unlock(&live_lock);
    return rc;
}

rlx_status rlx_backend_prepare_weight(rlx_backend *b, const rlx_weight_info *weight, void **handle) {
    if (!b || !weight || !weight->tensor || !handle)
        return rlx_error(RLX_E_INVALID, "rlx_backend_prepare_weight: NULL argument");
    *handle = NULL;
    return b->prepare_weight ? prepare(b, weight, handle) : RLX_OK;
}

void rlx_backend_release_weight(rlx_backend *b, void *handle) {
    if (b && handle && b->release_weight)
        b->release_weight(b->self, handle);
}

const char *rlx_backend_name(const rlx_backend *b) { return b ? b->name : "?"; }

int rlx_backend_supports(rlx_backend *b, const rlx_node_view *node) {
    return node_minor(node) <= b->abi_minor && b->iface->supports(b->self, node) > 0;
}

uint32_t rlx_backend_precision(rlx_backend *b, const rlx_node_view *node) {
    if (!b || !b->precision)
        return RLX_PRECISION_F32;
    const uint32_t p = b->precision(b->self, node);
    return p < RLX_PRECISION_COUNT ? p : RLX_PRECISION_F32;
}

const char *rlx_backend_describe(rlx_backend *b) {
    const char *d = b && b->describe ? b->describe(b->self) : NULL;
    return d ? d : "";
}

const char *rlx_precision_name(uint32_t precision) {
    switch (precision) {
    case RLX_PRECISION_F32:
        return "f32";
    case RLX_PRECISION_BF16_ACT:
        return "bf16-act";
    default:
        return "?";
    }
}

rlx_status rlx_backend_compute(rlx_backend *b, const rlx_node_view *node) {
    rlx_error_clear();
    int rc = b->iface->compute(b->self, node);
    if (rc >= 0)
        return RLX_OK;
    plugin_why why;
    return rlx_error(rc, "backend '%s' failed on node '%s' (%s): %s", b->name, node->name, rlx_op_name((int)node->op),
                     why_of(rc, &why));
}

rlx_status rlx__backend_compute_span(rlx_backend *b, void *span, const rlx_span *nodes) {
    rlx_error_clear();
    int rc = b->compute_span(b->self, span, nodes);
    if (rc >= 0)
        return RLX_OK;
    plugin_why why;
    why_of(rc, &why);
    const rlx_node_view *first = &nodes->nodes[0], *last = &nodes->nodes[nodes->n_nodes - 1];
    if (nodes->n_nodes == 1)
        return rlx_error(rc, "backend '%s' failed on node '%s' (%s): %s", b->name, first->name,
                         rlx_op_name((int)first->op), why.text);
    return rlx_error(rc, "backend '%s' failed on the %u nodes '%s' to '%s': %s", b->name, nodes->n_nodes, first->name,
                     last->name, why.text);
}

rlx_status rlx__backend_plan_span(rlx_backend *b, const rlx_span *run, uint32_t *n_taken, void **span) {
    *n_taken = 0;
    *span = NULL;
    rlx_error_clear();
    int rc = b->plan_span(b->self, run, n_taken, span);
    const char *first = run->nodes[0].name;
    if (rc < 0) {
        plugin_why why;
        return rlx_error(rc, "backend '%s' failed to plan the nodes from '%s': %s", b->name, first, why_of(rc, &why));
    }
    if (*n_taken < 1 || *n_taken > run->n_nodes) {
        if (*span)
            b->release_span(b->self, *span);
        *span = NULL;
        return rlx_error(RLX_E_PLUGIN, "backend '%s' took %u of the %u nodes from '%s' offered to plan_span (1 to %u)",
                         b->name, *n_taken, run->n_nodes, first, run->n_nodes);
    }
    return RLX_OK;
}

void rlx__backend_release_span(rlx_backend *b, void *span) { b->release_span(b->self, span); }
