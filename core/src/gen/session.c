/* Sessions: the KV cache of one sequence and a small cache of plans, one per run width (the
 * prompt, one decode token, k + 1 verified tokens), so a steady decode builds nothing.
 *
 * A block with Gated DeltaNet layers also holds their recurrent state, which sums up every
 * position so far and cannot be cut back. Its session keeps the inputs of the positions it
 * holds, and a truncation marks the state stale: the next forward first rebuilds it by running
 * kept positions again (the KV rows they rewrite get the same values), so the last forward's
 * rows stay readable until then. A speculative verification (a forward of 2 to
 * SESSION_STATE_ROWS positions that reads every row's logits) has its recurrent ops write the
 * state after each row (ABI 1.7 state rows): a truncation into it (rejected draft tokens) copies
 * the kept row's state back, and nothing runs again. A session cut back every few one-position
 * forwards (a draft model's) keeps the state after each of them the same way. Before any other
 * forward of several positions (a prompt) the state is copied aside: a truncation back into
 * that forward restores the copy and runs only the kept positions again. A truncation further
 * back (a chat turn that keeps a shorter prefix) runs the kept positions again from position 0,
 * where the recurrent ops start from a zero state. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rlx/gen.h"
#include "rlx/sched.h"
#include "util/alloc.h"

#include "gen/gen_internal.h"
#include "model/model_internal.h"
#include "sched/finite.h"
#include "util/clock.h"
#include "util/sized.h"

/* the prompt, one decode token, k + 1 verified tokens, and a speculator's own catch-up widths
 * (1 to k + 1 accepted tokens): fewer slots make speculative decoding rebuild plans each round */
#define PLAN_SLOTS 10
/* The widest verification whose states are kept per row: k + 1 for up to 7 draft tokens. Each
 * kept row is a whole recurrent state (Qwen3.5-9B: about 48 MiB), written by every verification;
 * a wider one copies the state aside and runs the accepted positions again instead. */
#define SESSION_STATE_ROWS 8

typedef struct plan_slot {
    uint32_t n;
    int all_rows;
    uint64_t last_used;
    rlx_graph *graph;
    rlx_plan *plan;
    rlx_batch_io io;
    int with_rows; /* the plan's recurrent ops write state rows into the session's rows */
} plan_slot;

struct rlx_session {
    const rlx_model *m;
    rlx_block_spec spec;
    rlx_backend **backends;
    size_t n_backends;
    rlx_place_rule *rules;
    size_t n_rules;
    uint32_t capacity, length;
    uint32_t kv_dtype;
    uint32_t plan_flags;       /* RLX_PLAN_CHECK_FINITE with check_finite */
    size_t *cache_bytes;       /* per layer of the block, k then v */
    void **k_cache, **v_cache; /* per layer of the block: [capacity, kv_heads * head_dim], or a
                                * linear layer's convolution and delta-rule states */
    /* recurrent blocks (rlx__model_recurrent): the inputs of positions [0, length), and how many
     * positions the recurrent state holds (more than length after a truncation) */
    int recurrent;
    uint8_t *history;
    size_t history_row; /* bytes of one position's input */
    uint32_t history_cap, state_length;
    /* the recurrent states as they were at position snap_length (UINT32_MAX: no copy), per
     * layer of the block, k then v; NULL for full-attention layers */
    void **snap;
    uint32_t snap_length;
    /* the state rows of the last forward that wrote them: per layer of the block, k then v,
     * [SESSION_STATE_ROWS][state] (NULL for full-attention layers); rows_n rows, the states after
     * positions rows_from .. rows_from + rows_n - 1 (rows_n 0: none valid) */
    void **rows;
    uint32_t rows_from, rows_n;
    /* one-position forwards since the last truncation back by at most SESSION_STATE_ROWS
     * positions, and whether they keep their states as rows (a draft model's session) */
    uint32_t steps_since_cut;
    int keep_steps;
    uint64_t replayed;  /* positions run again to rebuild a state */
    int32_t *positions; /* [capacity] */
    plan_slot slots[PLAN_SLOTS];
    uint64_t clock;
    size_t last_peak;
    const float *hidden; /* emit_hidden: the last forward's final-normed rows, in its plan */
};

rlx_status rlx_session_create(const rlx_model *m, const rlx_block_spec *spec, const rlx_session_options *opts,
                              rlx_session **out) {
    if (!m || !spec || !out)
        return rlx_error(RLX_E_INVALID, "rlx_session_create: NULL argument");
    *out = NULL;
    rlx_status rc = rlx_model_check_block(m, spec);
    if (rc != RLX_OK)
        return rc;
    /* a caller built against an older header has a shorter struct: read only what it wrote */
    rlx_session_options o = {.size = sizeof o};
    if (opts && (rc = rlx__read_sized(&o, sizeof o, opts, offsetof(rlx_session_options, rules),
                                      "rlx_session_options")) != RLX_OK)
        return rc;
    const rlx_model_config *c = rlx_model_config_of(m);
    uint32_t max_pos = c->max_position_embeddings > 0 && c->max_position_embeddings < UINT32_MAX
                           ? (uint32_t)c->max_position_embeddings
                           : UINT32_MAX;
    uint32_t capacity = o.kv_capacity ? o.kv_capacity : (max_pos < 4096 ? max_pos : 4096);
    if (capacity > max_pos && !o.beyond_trained)
        return rlx_error(RLX_E_RANGE, "context of %u positions exceeds the model's max_position_embeddings %u",
                         capacity, max_pos);
    rlx_session *s = rlx__calloc(1, sizeof *s);
    if (!s)
        return rlx_error(RLX_E_NOMEM, "session: out of memory");
    s->m = m;
    rlx__block_spec_read(spec, &s->spec); /* rlx_model_check_block read it already */
    s->capacity = capacity;
    uint32_t n_layers = spec->layer_end - spec->layer_start;
    const rlx_status kv_ok = rlx__kv_dtype_check(m, o.kv_dtype);
    if (kv_ok != RLX_OK) {
        free(s);
        return kv_ok;
    }
    s->kv_dtype = o.kv_dtype;
    s->plan_flags = o.check_finite ? RLX_PLAN_CHECK_FINITE : 0;
    s->recurrent = rlx__model_recurrent(m, spec);
    s->snap_length = UINT32_MAX;
    s->history_row = spec->embed_input ? sizeof(int32_t) : (size_t)c->hidden_size * sizeof(float);
    s->cache_bytes = rlx__calloc(2 * (size_t)n_layers, sizeof *s->cache_bytes);
    s->k_cache = rlx__calloc(n_layers, sizeof *s->k_cache);
    s->v_cache = rlx__calloc(n_layers, sizeof *s->v_cache);
    s->positions = rlx__malloc(capacity * sizeof *s->positions);
    s->n_backends = o.n_backends;
    s->backends = rlx__calloc(o.n_backends + 1, sizeof *s->backends);
    s->n_rules = o.n_rules;
    s->rules = rlx__calloc(o.n_rules + 1, sizeof *s->rules);
    if (!s->cache_bytes || !s->k_cache || !s->v_cache || !s->positions || !s->backends || !s->rules)
        goto nomem;
    for (size_t i = 0; i < o.n_rules; i++)
        s->rules[i] = o.rules[i];
    for (size_t i = 0; i < o.n_backends; i++)
        s->backends[i] = o.backends[i];
    for (uint32_t i = 0; i < capacity; i++)
        s->positions[i] = (int32_t)i;
    for (uint32_t l = 0; l < n_layers; l++) {
        const uint32_t layer = spec->mtp ? UINT32_MAX : spec->layer_start + l;
        s->cache_bytes[2 * l] = rlx__layer_cache_bytes(m, layer, capacity, o.kv_dtype, 0);
        s->cache_bytes[2 * l + 1] = rlx__layer_cache_bytes(m, layer, capacity, o.kv_dtype, 1);
        if (!(s->k_cache[l] = rlx__map_zeroed(s->cache_bytes[2 * l])) ||
            !(s->v_cache[l] = rlx__map_zeroed(s->cache_bytes[2 * l + 1])))
            goto nomem;
    }
    *out = s;
    return RLX_OK;
nomem:
    rlx_session_destroy(s);
    return rlx_error(RLX_E_NOMEM, "session: out of memory for a KV cache of %u positions", capacity);
}

static void slot_clear(plan_slot *slot) {
    rlx_plan_destroy(slot->plan);
    rlx_graph_destroy(slot->graph);
    memset(slot, 0, sizeof *slot);
}

void rlx_session_destroy(rlx_session *s) {
    if (!s)
        return;
    for (int i = 0; i < PLAN_SLOTS; i++)
        slot_clear(&s->slots[i]);
    uint32_t n_layers = s->spec.layer_end - s->spec.layer_start;
    for (uint32_t l = 0; l < n_layers && s->k_cache && s->v_cache && s->cache_bytes; l++) {
        if (s->k_cache[l])
            munmap(s->k_cache[l], s->cache_bytes[2 * l]);
        if (s->v_cache[l])
            munmap(s->v_cache[l], s->cache_bytes[2 * l + 1]);
    }
    for (uint32_t l = 0; s->snap && l < 2 * n_layers; l++)
        free(s->snap[l]);
    free(s->snap);
    for (uint32_t l = 0; s->rows && l < 2 * n_layers; l++)
        if (s->rows[l])
            munmap(s->rows[l], SESSION_STATE_ROWS * s->cache_bytes[l]);
    free(s->rows);
    free(s->cache_bytes);
    free(s->history);
    free(s->k_cache);
    free(s->v_cache);
    free(s->positions);
    free(s->backends);
    free(s->rules);
    free(s);
}

uint32_t rlx_session_length(const rlx_session *s) { return s->length; }

/* Whether layer l of the session's block is a linear-attention layer (an MTP layer never is). */
static int layer_linear(const rlx_session *s, uint32_t l) {
    return !s->spec.mtp && rlx__model_layer_linear(s->m, s->spec.layer_start + l);
}

void rlx_session_memory(const rlx_session *s, uint64_t *kv_bytes, uint64_t *state_bytes) {
    uint64_t kv = 0, state = 0;
    for (uint32_t l = 0; s && l < s->spec.layer_end - s->spec.layer_start; l++)
        *(layer_linear(s, l) ? &state : &kv) += s->cache_bytes[2 * l] + s->cache_bytes[2 * l + 1];
    if (kv_bytes)
        *kv_bytes = kv;
    if (state_bytes)
        *state_bytes = state;
}
uint32_t rlx_session_capacity(const rlx_session *s) { return s->capacity; }
size_t rlx_session_peak_activation_bytes(const rlx_session *s) { return s->last_peak; }

/* The session's state rows, mapped at their first use: pages no verification touches cost
 * nothing. */
static rlx_status rows_alloc(rlx_session *s) {
    const uint32_t n_layers = s->spec.layer_end - s->spec.layer_start;
    if (!s->rows && !(s->rows = rlx__calloc(2 * (size_t)n_layers, sizeof *s->rows)))
        return rlx_error(RLX_E_NOMEM, "session: out of memory for the state rows of a verification");
    for (uint32_t l = 0; l < 2 * n_layers; l++)
        if (layer_linear(s, l / 2) && !s->rows[l] &&
            !(s->rows[l] = rlx__map_zeroed(SESSION_STATE_ROWS * s->cache_bytes[l])))
            return rlx_error(RLX_E_NOMEM, "session: out of memory for the state rows of a verification");
    return RLX_OK;
}

static rlx_status get_plan(rlx_session *s, uint32_t n, int all_rows, plan_slot **out) {
    plan_slot *victim = &s->slots[0];
    for (int i = 0; i < PLAN_SLOTS; i++) {
        plan_slot *slot = &s->slots[i];
        if (slot->plan && slot->n == n && slot->all_rows == all_rows) {
            slot->last_used = ++s->clock;
            *out = slot;
            return RLX_OK;
        }
        if (!slot->plan || (victim->plan && slot->last_used < victim->last_used))
            victim = slot;
    }
    slot_clear(victim);
    rlx_block_spec spec = s->spec;
    spec.all_logits = (uint32_t)all_rows;
    rlx_build_options bo = {.size = sizeof bo, .n_tokens = n, .kv_capacity = s->capacity, .kv_dtype = s->kv_dtype};
    const int with_rows = s->recurrent && all_rows && n >= 2 && n <= SESSION_STATE_ROWS;
    rlx__state_rows_io rows_io;
    rlx_status rc = with_rows ? rows_alloc(s) : RLX_OK;
    if (rc == RLX_OK)
        rc = rlx__model_build_block(s->m, &spec, &bo, &victim->graph, &victim->io, with_rows ? &rows_io : NULL);
    const rlx_plan_options po = {.size = sizeof po,
                                 .flags = s->plan_flags,
                                 .backends = s->backends,
                                 .n_backends = s->n_backends,
                                 .rules = s->rules,
                                 .n_rules = s->n_rules};
    if (rc == RLX_OK)
        rc = rlx_plan_create(victim->graph, &po, &victim->plan);
    const rlx_block_io *io = &victim->io.block;
    for (uint32_t l = 0; rc == RLX_OK && l < io->n_layers; l++) {
        rc = rlx_plan_bind(victim->plan, io->k_cache[l], s->k_cache[l]);
        if (rc == RLX_OK)
            rc = rlx_plan_bind(victim->plan, io->v_cache[l], s->v_cache[l]);
        if (rc == RLX_OK && with_rows && rows_io.k_rows[l] >= 0)
            rc = rlx_plan_bind(victim->plan, rows_io.k_rows[l], s->rows[2 * l]);
        if (rc == RLX_OK && with_rows && rows_io.v_rows[l] >= 0)
            rc = rlx_plan_bind(victim->plan, rows_io.v_rows[l], s->rows[2 * l + 1]);
    }
    if (rc != RLX_OK) {
        slot_clear(victim);
        return rc;
    }
    victim->n = n;
    victim->all_rows = all_rows;
    victim->with_rows = with_rows;
    victim->last_used = ++s->clock;
    *out = victim;
    return RLX_OK;
}

rlx_status rlx__logits_check(const float *row, int64_t vocab, uint32_t position) {
    const char *kind;
    const int64_t at = rlx__first_nonfinite(RLX_DTYPE_F32, row, (size_t)vocab, &kind);
    return at < 0 ? RLX_OK
                  : rlx_error(RLX_E_RANGE, "the logits of position %u are not finite (%s at vocabulary index %lld)",
                              position, kind, (long long)at);
}

/* Checks the logits rows of the forward just run over n positions from s->length. A bad row is
 * traced to the first node that wrote a value that is not finite by running the plan again
 * node by node: the same inputs rewrite the same cache rows, and only this failure path pays
 * for the search. */
static rlx_status check_logits(rlx_session *s, rlx_plan *plan, const float *rows, uint32_t n, int all_rows) {
    const int64_t vocab = rlx_model_config_of(s->m)->vocab_size;
    const uint32_t first = all_rows ? s->length : s->length + n - 1, n_rows = all_rows ? n : 1;
    rlx_status rc = RLX_OK;
    for (uint32_t r = 0; rc == RLX_OK && r < n_rows; r++)
        rc = rlx__logits_check(rows + (size_t)r * (size_t)vocab, vocab, first + r);
    if (rc == RLX_OK)
        return RLX_OK;
    char bad[256];
    snprintf(bad, sizeof bad, "%s", rlx_last_error());
    const rlx_status traced = rlx_plan_run_checked(plan);
    if (traced == RLX_E_RANGE)
        return rlx_error(RLX_E_RANGE, "%s; the first node to write a NaN or an infinity: %s", bad, rlx_last_error());
    if (traced == RLX_OK)
        return rlx_error(RLX_E_RANGE,
                         "%s; run again node by node the same positions give finite values, so the fused spans "
                         "of a backend produced it",
                         bad);
    return rlx_error(RLX_E_RANGE, "%s; tracing it node by node failed: %s", bad, rlx_last_error());
}

/* Keeps the inputs of n new positions after s->length, for running them again. */
static rlx_status remember(rlx_session *s, const void *input, uint32_t n) {
    const uint32_t need = s->length + n;
    if (need > s->history_cap) {
        uint32_t cap = s->history_cap ? s->history_cap : 256;
        while (cap < need)
            cap = cap > s->capacity / 2 ? s->capacity : cap * 2;
        uint8_t *h = rlx__realloc(s->history, (size_t)cap * s->history_row);
        if (!h)
            return rlx_error(RLX_E_NOMEM, "session: out of memory for the inputs of %u positions", cap);
        s->history = h;
        s->history_cap = cap;
    }
    uint8_t *at = s->history + (size_t)s->length * s->history_row;
    if (input != at) /* a replay runs the kept inputs themselves */
        memcpy(at, input, (size_t)n * s->history_row);
    return RLX_OK;
}

static rlx_status run(rlx_session *s, const void *input, const float *hidden_in, uint32_t n, int all_rows,
                      const float **out);

/* Copies the recurrent states at the current length aside (to = 1) or back (to = 0). */
static rlx_status snapshot(rlx_session *s, int to) {
    const uint32_t n_layers = s->spec.layer_end - s->spec.layer_start;
    if (!s->snap && !(s->snap = rlx__calloc(2 * (size_t)n_layers, sizeof *s->snap)))
        return rlx_error(RLX_E_NOMEM, "session: out of memory for a copy of the recurrent state");
    for (uint32_t l = 0; l < n_layers; l++)
        for (int v = 0; v < 2 && layer_linear(s, l); v++) {
            void **copy = &s->snap[2 * l + v], *state = v ? s->v_cache[l] : s->k_cache[l];
            if (!*copy && !(*copy = rlx__malloc(s->cache_bytes[2 * l + v])))
                return rlx_error(RLX_E_NOMEM, "session: out of memory for a copy of the recurrent state");
            memcpy(to ? *copy : state, to ? state : *copy, s->cache_bytes[2 * l + v]);
        }
    return RLX_OK;
}

/* Rebuilds the recurrent state of the positions [0, length) a truncation kept (file comment). */
static rlx_status replay(rlx_session *s) {
    const uint32_t length = s->length;
    uint32_t from = 0;
    rlx_status rc = RLX_OK;
    if (s->snap_length <= length && (rc = snapshot(s, 0)) == RLX_OK)
        from = s->snap_length;
    s->length = s->state_length = from;
    const float *rows;
    s->replayed += length - from;
    if (rc == RLX_OK && length > from)
        rc = run(s, s->history + (size_t)from * s->history_row, NULL, length - from, 0, &rows);
    if (rc != RLX_OK) { /* the state is partly rebuilt: run it again next time */
        s->length = length;
        s->state_length = UINT32_MAX;
    }
    return rc;
}

/* Copies the recurrent states into state row `row` (to = 1) or back from it (to = 0). */
static void rows_copy(rlx_session *s, uint32_t row, int to) {
    const uint32_t n_layers = s->spec.layer_end - s->spec.layer_start;
    for (uint32_t l = 0; l < 2 * n_layers; l++) {
        if (!s->rows[l])
            continue;
        uint8_t *kept = (uint8_t *)s->rows[l] + (size_t)row * s->cache_bytes[l];
        void *state = l % 2 ? s->v_cache[l / 2] : s->k_cache[l / 2];
        memcpy(to ? kept : state, to ? state : kept, s->cache_bytes[l]);
    }
}

/* After a one-position forward from s->length: a session cut back often by a few positions (a
 * draft model's, which proposes tokens one at a time and drops the rejected ones) keeps the new
 * state as the next state row, so that the cut is a copy. A session that decodes on without
 * such cuts (a chat after its turn's truncation) stops paying the copy. */
static void keep_step(rlx_session *s) {
    if (++s->steps_since_cut > 4 * SESSION_STATE_ROWS)
        s->keep_steps = 0;
    if (!s->keep_steps || rows_alloc(s) != RLX_OK) { /* without rows the cut runs positions again */
        s->rows_n = 0;
        return;
    }
    uint32_t at = 0;
    if (s->rows_n && s->length == s->rows_from + s->rows_n && s->rows_n < SESSION_STATE_ROWS)
        at = s->rows_n++;
    else
        s->rows_from = s->length, s->rows_n = 1;
    rows_copy(s, at, 1);
}

/* One graph run over n new positions; hidden_in is the MTP block's second input (else NULL). */
static rlx_status run(rlx_session *s, const void *input, const float *hidden_in, uint32_t n, int all_rows,
                      const float **out) {
    s->hidden = NULL;
    rlx_status rc;
    if (s->recurrent && s->state_length != s->length && (rc = replay(s)) != RLX_OK)
        return rc;
    if (n > s->capacity - s->length)
        return rlx_error(RLX_E_RANGE, "%u new positions after %u exceed the context of %u positions", n, s->length,
                         s->capacity);
    if (s->spec.embed_input) {
        int64_t vocab = rlx_model_config_of(s->m)->vocab_size;
        const int32_t *ids = input;
        for (uint32_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= vocab)
                return rlx_error(RLX_E_RANGE, "token id %d (input %u) is outside the vocabulary [0, %lld)", ids[i], i,
                                 (long long)vocab);
    }
    if (s->recurrent && (rc = remember(s, input, n)) != RLX_OK)
        return rc;
    plan_slot *slot;
    if ((rc = get_plan(s, n, all_rows ? 1 : 0, &slot)) != RLX_OK)
        return rc;
    const rlx_block_io *io = &slot->io.block;
    if (s->recurrent && n > 1 && !slot->with_rows && input != s->history + (size_t)s->length * s->history_row) {
        /* a forward that may be cut back into (a replay's input is its own history) */
        if ((rc = snapshot(s, 1)) != RLX_OK)
            return rc;
        s->snap_length = s->length;
    }
    if (s->recurrent) /* until this run succeeds the state may hold part of it */
        s->state_length = UINT32_MAX;
    if ((rc = rlx_plan_bind(slot->plan, io->input, (void *)input)) != RLX_OK ||
        (hidden_in && (rc = rlx_plan_bind(slot->plan, io->hidden_input, (void *)hidden_in)) != RLX_OK) ||
        (rc = rlx_plan_bind(slot->plan, io->positions, s->positions + s->length)) != RLX_OK ||
        (rc = rlx_plan_run(slot->plan)) != RLX_OK)
        return rc;
    const float *rows = rlx_plan_data(slot->plan, io->output);
    if (s->spec.produce_logits && (rc = check_logits(s, slot->plan, rows, n, all_rows)) != RLX_OK)
        return rc;
    if (slot->with_rows) {
        s->rows_from = s->length;
        s->rows_n = n;
    } else if (s->recurrent && n == 1) {
        keep_step(s);
    } else {
        s->rows_n = 0;
    }
    s->length += n;
    s->state_length = s->length;
    s->last_peak = rlx_plan_peak_bytes(slot->plan);
    *out = rows;
    if (io->hidden >= 0)
        s->hidden = rlx_plan_data(slot->plan, io->hidden);
    return RLX_OK;
}

rlx_status rlx_session_forward(rlx_session *s, const void *input, uint32_t n, int all_rows, const float **out) {
    if (!s || !input || !out || n == 0)
        return rlx_error(RLX_E_INVALID, "rlx_session_forward: NULL input or no positions");
    *out = NULL;
    if (s->spec.mtp)
        return rlx_error(RLX_E_INVALID, "an MTP block takes (token, hidden state) pairs: use rlx_session_forward_mtp");
    return run(s, input, NULL, n, all_rows, out);
}

/* The MTP layer's cache rows sit at the session's own positions 0, 1, ...: pair i of a sequence
 * (token x[t+1] with h[t]) goes to position i, not t + 1. RoPE attention depends only on the
 * distance between positions, and pairs keep the order and spacing of the target's positions,
 * so the offset changes nothing and the session needs no position of its own. */
rlx_status rlx_session_forward_mtp(rlx_session *s, const int32_t *ids, const float *hidden, uint32_t n, int all_rows,
                                   const float **logits) {
    if (!s || !ids || !hidden || !logits || n == 0)
        return rlx_error(RLX_E_INVALID, "rlx_session_forward_mtp: NULL argument or no positions");
    *logits = NULL;
    if (!s->spec.mtp)
        return rlx_error(RLX_E_INVALID, "rlx_session_forward_mtp: the session's block is not an MTP layer");
    return run(s, ids, hidden, n, all_rows, logits);
}

const float *rlx_session_hidden(const rlx_session *s) { return s ? s->hidden : NULL; }

rlx_status rlx_session_truncate(rlx_session *s, uint32_t length) {
    if (!s)
        return rlx_error(RLX_E_INVALID, "rlx_session_truncate: session is NULL");
    if (length > s->length)
        return rlx_error(RLX_E_RANGE, "cannot truncate a session of %u positions to %u", s->length, length);
    if (length < s->snap_length)
        s->snap_length = UINT32_MAX; /* it holds positions that are being replaced */
    if (s->recurrent && length < s->length && length + SESSION_STATE_ROWS >= s->length) {
        s->keep_steps = s->keep_steps || s->steps_since_cut <= 2 * SESSION_STATE_ROWS;
        s->steps_since_cut = 0;
    }
    if (s->recurrent && s->rows_n && s->state_length == s->rows_from + s->rows_n && length > s->rows_from &&
        length < s->state_length) {
        /* back into the kept rows: the row of position length - 1 is the state to keep */
        const uint32_t row = length - 1 - s->rows_from;
        rows_copy(s, row, 0);
        s->rows_n = row + 1;
        s->state_length = length;
    }
    s->length = length; /* the last forward's rows stay readable: the speculative loop reads them after */
    return RLX_OK;      /* a recurrent state still ahead of length is rebuilt by the next forward */
}

uint64_t rlx_session_replayed_positions(const rlx_session *s) { return s ? s->replayed : 0; }

typedef struct dump_ctx {
    rlx_plan *plan;
    char text[96];
} dump_ctx;

/* "cpu-blas", or "onednn bf16-act" for a node that is not computed in plain F32 */
static const char *node_backend(void *ctx, uint32_t node) {
    dump_ctx *d = ctx;
    const uint32_t prec = rlx_plan_node_precision(d->plan, node);
    snprintf(d->text, sizeof d->text, "%s%s%s", rlx_plan_node_backend(d->plan, node),
             prec == RLX_PRECISION_F32 ? "" : " ", prec == RLX_PRECISION_F32 ? "" : rlx_precision_name(prec));
    return d->text;
}

rlx_status rlx_session_precision(rlx_session *s, uint32_t n, uint32_t *out) {
    plan_slot *slot;
    rlx_status rc = get_plan(s, n, 0, &slot);
    if (rc != RLX_OK)
        return rc;
    uint32_t worst = RLX_PRECISION_F32;
    for (uint32_t i = 0; i < rlx_graph_n_nodes(slot->graph); i++) {
        const uint32_t p = rlx_plan_node_precision(slot->plan, i);
        worst = p > worst ? p : worst;
    }
    *out = worst;
    return RLX_OK;
}

rlx_status rlx_session_dump_plan(rlx_session *s, uint32_t n, FILE *f) {
    plan_slot *slot;
    rlx_status rc = get_plan(s, n, 0, &slot);
    if (rc != RLX_OK)
        return rc;
    dump_ctx ctx = {.plan = slot->plan};
    rc = rlx_graph_dump(slot->graph, f, node_backend, &ctx);
    if (rc == RLX_OK)
        fprintf(f, "activation arena: %zu bytes (%zu without reuse); %u backend switches, no copies (host memory)\n",
                rlx_plan_peak_bytes(slot->plan), rlx_plan_total_activation_bytes(slot->plan),
                rlx_plan_backend_switches(slot->plan));
    return rc;
}

static rlx_status lm_forward(void *self, const int32_t *ids, uint32_t n, int all_rows, const float **logits) {
    return rlx_session_forward(self, ids, n, all_rows, logits);
}

static rlx_status lm_truncate(void *self, uint32_t length) { return rlx_session_truncate(self, length); }
static uint32_t lm_length(const void *self) { return rlx_session_length(self); }
static uint32_t lm_capacity(const void *self) { return rlx_session_capacity(self); }
static const float *lm_hidden(void *self) { return rlx_session_hidden(self); }

int rlx_lm_is_eos(const rlx_lm *lm, int32_t token) {
    for (uint32_t i = 0; i < lm->n_eos; i++)
        if (lm->eos_ids[i] == token)
            return 1;
    return 0;
}

rlx_status rlx_session_lm(rlx_session *s, rlx_lm *out) {
    if (!s || !out)
        return rlx_error(RLX_E_INVALID, "rlx_session_lm: NULL argument");
    if (!s->spec.embed_input || !s->spec.produce_logits || s->spec.mtp)
        return rlx_error(RLX_E_INVALID, "a language model needs a block that embeds tokens and produces logits "
                                        "(and is not an MTP layer)");
    const rlx_model_config *c = rlx_model_config_of(s->m);
    *out = (rlx_lm){.self = s,
                    .forward = lm_forward,
                    .truncate = lm_truncate,
                    .length = lm_length,
                    .capacity = lm_capacity,
                    .vocab = c->vocab_size,
                    .eos_ids = c->eos_ids,
                    .n_eos = c->n_eos,
                    .hidden = s->spec.emit_hidden ? lm_hidden : NULL,
                    .hidden_size = c->hidden_size};
    return RLX_OK;
}

/* The logits row of lm's last position, checked to be finite. A session has checked and traced
 * them already; logits from elsewhere (a pipeline) are checked here, before a token is drawn. */
static rlx_status check_lm_logits(const rlx_lm *lm, const float *row) {
    rlx_status rc = rlx__logits_check(row, lm->vocab, lm->length(lm->self) - 1);
    return rc == RLX_OK ? RLX_OK : rlx_error(rc, "%s" RLX__FINITE_HINT, rlx_last_error());
}

rlx_status rlx_generate(const rlx_lm *lm, rlx_sampler *sampler, const int32_t *prompt, uint32_t n_prompt,
                        uint32_t max_new, rlx_token_fn fn, void *ctx, rlx_gen_stats *stats) {
    if (!lm || !sampler || !prompt || n_prompt == 0)
        return rlx_error(RLX_E_INVALID, "rlx_generate: NULL argument or empty prompt");
    rlx_gen_stats st = {.n_prompt = n_prompt};
    const float *logits;
    double t0 = rlx__now_seconds();
    rlx_status rc = lm->forward(lm->self, prompt, n_prompt, 0, &logits);
    double t1 = rlx__now_seconds();
    st.prompt_seconds = t1 - t0;
    if (rc == RLX_OK)
        rc = check_lm_logits(lm, logits);
    if (rc == RLX_OK) /* after the forward, which names a bad id better */
        rc = rlx__sampler_accept_all(sampler, prompt, n_prompt);
    if (rc == RLX_OK && max_new == 0)
        st.stop = RLX_GEN_STOP_MAX_NEW;
    while (rc == RLX_OK && st.n_generated < max_new) {
        int32_t token = rlx_sampler_sample(sampler, logits);
        if (token < 0) { /* a grammar that allows nothing here */
            rc = RLX_E_INVALID;
            break;
        }
        st.n_generated++;
        if ((rc = rlx_sampler_accept(sampler, token)) != RLX_OK)
            break;
        int stop = fn ? fn(ctx, token, logits) : 0;
        if (rlx_lm_is_eos(lm, token)) {
            st.stopped_on_eos = 1;
            st.stop = RLX_GEN_STOP_EOS;
            break;
        }
        if (stop || st.n_generated == max_new) {
            st.stop = stop ? RLX_GEN_STOP_CALLBACK : RLX_GEN_STOP_MAX_NEW;
            break;
        }
        if (lm->length(lm->self) >= lm->capacity(lm->self)) { /* no position left to feed it at */
            st.stop = RLX_GEN_STOP_CONTEXT;
            break;
        }
        if ((rc = lm->forward(lm->self, &token, 1, 0, &logits)) == RLX_OK)
            rc = check_lm_logits(lm, logits);
    }
    st.generate_seconds = rlx__now_seconds() - t1;
    if (stats)
        *stats = st;
    return rc;
}
