/* A block over rows of many sequences (gen_internal.h): the slots' KV cache (and the recurrent
 * states of linear-attention layers) and a small cache of plans, shared by the batched engine
 * and the pipeline stage. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gen/gen_internal.h"
#include "model/model_internal.h"
#include "util/alloc.h"

/* Plans kept, keyed by (rows, logits rows): a steady decode of n streams reuses one. */
#define BATCH_PLANS 16

typedef struct batch_plan {
    uint32_t n_rows, n_out;
    uint64_t last_used;
    rlx_graph *graph;
    rlx_plan *plan;
    rlx_batch_io io;
} batch_plan;

struct rlx__batch {
    const rlx_model *m;
    rlx_block_spec spec;
    rlx__batch_options o;
    uint32_t n_layers;
    size_t row_bytes;          /* one position of one attention layer's K (or V) */
    size_t *slot_bytes;        /* per layer of the block, k then v: one slot's part */
    void **k_cache, **v_cache; /* per layer of the block: [n_slots, ...] */
    batch_plan plans[BATCH_PLANS];
    batch_plan *last; /* of the last run, for rlx__batch_trace_nonfinite */
    uint64_t clock;
};

static void plan_clear(batch_plan *p) {
    rlx_plan_destroy(p->plan);
    rlx_graph_destroy(p->graph);
    memset(p, 0, sizeof *p);
}

void rlx__batch_destroy(rlx__batch *b) {
    if (!b)
        return;
    for (int i = 0; i < BATCH_PLANS; i++)
        plan_clear(&b->plans[i]);
    for (uint32_t l = 0; l < b->n_layers && b->k_cache && b->v_cache && b->slot_bytes; l++) {
        if (b->k_cache[l])
            munmap(b->k_cache[l], b->slot_bytes[2 * l] * b->o.n_slots);
        if (b->v_cache[l])
            munmap(b->v_cache[l], b->slot_bytes[2 * l + 1] * b->o.n_slots);
    }
    free(b->slot_bytes);
    free(b->k_cache);
    free(b->v_cache);
    free(b);
}

rlx_status rlx__batch_create(const rlx_model *m, const rlx_block_spec *spec, const rlx__batch_options *o,
                             rlx__batch **out) {
    *out = NULL;
    if (spec->all_logits || spec->emit_hidden || spec->mtp || !o->n_slots || !o->capacity)
        return rlx_error(RLX_E_INVALID, "batched block: no slots, no positions, or a block kind rows cannot run");
    const rlx_status kv_ok = rlx__kv_dtype_check(m, o->kv_dtype);
    if (kv_ok != RLX_OK)
        return kv_ok;
    const rlx_model_config *c = rlx_model_config_of(m);
    rlx__batch *b = rlx__calloc(1, sizeof *b);
    if (!b)
        return rlx_error(RLX_E_NOMEM, "batched block: out of memory");
    b->m = m;
    b->spec = *spec;
    b->o = *o;
    b->n_layers = spec->layer_end - spec->layer_start;
    b->row_bytes = rlx_iface_row_bytes(o->kv_dtype, (int64_t)c->num_key_value_heads * c->head_dim);
    b->slot_bytes = rlx__calloc(2 * (size_t)b->n_layers, sizeof *b->slot_bytes);
    b->k_cache = rlx__calloc(b->n_layers, sizeof *b->k_cache);
    b->v_cache = rlx__calloc(b->n_layers, sizeof *b->v_cache);
    for (uint32_t l = 0; b->slot_bytes && b->k_cache && b->v_cache && l < b->n_layers; l++) {
        const uint32_t layer = spec->layer_start + l;
        b->slot_bytes[2 * l] = rlx__layer_cache_bytes(m, layer, o->capacity, o->kv_dtype, 0);
        b->slot_bytes[2 * l + 1] = rlx__layer_cache_bytes(m, layer, o->capacity, o->kv_dtype, 1);
        if (!(b->k_cache[l] = rlx__map_zeroed(b->slot_bytes[2 * l] * o->n_slots)) ||
            !(b->v_cache[l] = rlx__map_zeroed(b->slot_bytes[2 * l + 1] * o->n_slots)))
            break;
    }
    if (!b->slot_bytes || !b->k_cache || !b->v_cache || (b->n_layers && !b->v_cache[b->n_layers - 1])) {
        rlx__batch_destroy(b);
        return rlx_error(RLX_E_NOMEM, "out of memory for a KV cache of %u slots of %u positions", o->n_slots,
                         o->capacity);
    }
    *out = b;
    return RLX_OK;
}

static batch_plan *get_plan(rlx__batch *b, uint32_t n_rows, uint32_t n_out, rlx_status *rc) {
    batch_plan *victim = &b->plans[0];
    for (int i = 0; i < BATCH_PLANS; i++) {
        batch_plan *p = &b->plans[i];
        if (p->plan && p->n_rows == n_rows && p->n_out == n_out) {
            p->last_used = ++b->clock;
            return p;
        }
        if (!p->plan || (victim->plan && p->last_used < victim->last_used))
            victim = p;
    }
    plan_clear(victim);
    const rlx_build_options bo = {.size = sizeof bo,
                                  .n_tokens = n_rows,
                                  .kv_capacity = b->o.capacity,
                                  .n_slots = b->o.n_slots,
                                  .kv_dtype = b->o.kv_dtype,
                                  .n_out_rows = n_out};
    *rc = rlx_model_build_block(b->m, &b->spec, &bo, &victim->graph, &victim->io);
    const rlx_plan_options po = {.size = sizeof po,
                                 .flags = b->o.check_finite ? RLX_PLAN_CHECK_FINITE : 0,
                                 .backends = b->o.backends,
                                 .n_backends = b->o.n_backends,
                                 .rules = b->o.rules,
                                 .n_rules = b->o.n_rules};
    if (*rc == RLX_OK)
        *rc = rlx_plan_create(victim->graph, &po, &victim->plan);
    const rlx_block_io *io = &victim->io.block;
    for (uint32_t l = 0; *rc == RLX_OK && l < io->n_layers; l++) {
        *rc = rlx_plan_bind(victim->plan, io->k_cache[l], b->k_cache[l]);
        if (*rc == RLX_OK)
            *rc = rlx_plan_bind(victim->plan, io->v_cache[l], b->v_cache[l]);
    }
    if (*rc != RLX_OK) {
        plan_clear(victim);
        return NULL;
    }
    victim->n_rows = n_rows;
    victim->n_out = n_out;
    victim->last_used = ++b->clock;
    return victim;
}

rlx_status rlx__batch_run(rlx__batch *b, const void *input, const int32_t *pos, const int32_t *seq, uint32_t n,
                          const int32_t *out_rows, uint32_t n_out, const float **out) {
    *out = NULL;
    const int logits = b->spec.produce_logits != 0;
    if (n == 0 || (logits && (n_out == 0 || n_out > n || !out_rows)))
        return rlx_error(RLX_E_INVALID, "batched block: %u rows with %u logits rows", n, n_out);
    rlx_status rc = RLX_OK;
    batch_plan *p = b->last = get_plan(b, n, logits ? n_out : 0, &rc);
    if (!p)
        return rc;
    const rlx_batch_io *io = &p->io;
    /* the plan reads its inputs through these pointers during the run only */
    if ((rc = rlx_plan_bind(p->plan, io->block.input, (void *)input)) != RLX_OK ||
        (rc = rlx_plan_bind(p->plan, io->block.positions, (void *)pos)) != RLX_OK ||
        (rc = rlx_plan_bind(p->plan, io->seq, (void *)seq)) != RLX_OK ||
        (logits && (rc = rlx_plan_bind(p->plan, io->out_rows, (void *)out_rows)) != RLX_OK) ||
        (rc = rlx_plan_run(p->plan)) != RLX_OK)
        return rc;
    *out = rlx_plan_data(p->plan, io->block.output);
    return RLX_OK;
}

rlx_status rlx__batch_trace_nonfinite(rlx__batch *b) {
    if (!b->last)
        return rlx_error(RLX_E_INVALID, "batched block: no run to trace");
    return rlx_plan_run_checked(b->last->plan);
}

/* Whether layer l of the batch's block holds a recurrent state, which is copied whole. */
static int layer_linear(const rlx__batch *b, uint32_t l) {
    return rlx__model_layer_linear(b->m, b->spec.layer_start + l);
}

void rlx__batch_memory(const rlx__batch *b, uint64_t *kv_bytes, uint64_t *state_bytes) {
    *kv_bytes = *state_bytes = 0;
    for (uint32_t l = 0; l < b->n_layers; l++)
        *(layer_linear(b, l) ? state_bytes : kv_bytes) +=
            (b->slot_bytes[2 * l] + b->slot_bytes[2 * l + 1]) * b->o.n_slots;
}

void rlx__batch_copy(rlx__batch *b, uint32_t from, uint32_t to, uint32_t n) {
    for (uint32_t l = 0; l < b->n_layers; l++) {
        const size_t ks = b->slot_bytes[2 * l], vs = b->slot_bytes[2 * l + 1];
        const int whole = layer_linear(b, l);
        const size_t kn = whole ? ks : (size_t)n * b->row_bytes, vn = whole ? vs : (size_t)n * b->row_bytes;
        memcpy((char *)b->k_cache[l] + to * ks, (char *)b->k_cache[l] + from * ks, kn);
        memcpy((char *)b->v_cache[l] + to * vs, (char *)b->v_cache[l] + from * vs, vn);
    }
}
