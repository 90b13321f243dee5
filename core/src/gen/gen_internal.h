/* Shared by the generation loops of gen/session.c and spec/speculator.c. */
#ifndef RLX_GEN_INTERNAL_H
#define RLX_GEN_INTERNAL_H

#include "rlx/gen.h"
#include "rlx/model.h"
#include "rlx/sched.h"

/* RLX_E_RANGE when row, the vocab logits of position `position`, holds a NaN or an infinity:
 * "the logits of position P are not finite (NaN at vocabulary index I)". A vectorized pass,
 * negligible next to the matmul that computed the row. */
rlx_status rlx__logits_check(const float *row, int64_t vocab, uint32_t position);

/* What the generation code adds to a failed rlx__logits_check when it cannot trace the value
 * to its node itself (logits from a pipeline, or another lm). */
#define RLX__FINITE_HINT "; the first layer or op that produced it is found with --check-finite"

/* rlx_sampler_accept of ids[0..n) in order; stops at the first failure. */
rlx_status rlx__sampler_accept_all(rlx_sampler *s, const int32_t *ids, uint32_t n);

/* A block of a model run over rows of many sequences at once: the KV cache of n_slots sequences
 * of `capacity` positions for the block's layers (mapped once, pages touched as written) and the
 * plans of the row counts seen, kept by (rows, logits rows). The batched engine runs the whole
 * model on one; a pipeline stage runs its layer range on one per driver connection. Not
 * thread-safe: one caller at a time. */
typedef struct rlx__batch rlx__batch;

typedef struct rlx__batch_options {
    uint32_t n_slots, capacity, kv_dtype;
    rlx_backend *const *backends; /* borrowed for the batch's lifetime */
    size_t n_backends;
    const rlx_place_rule *rules; /* borrowed for the batch's lifetime */
    size_t n_rules;
    uint32_t check_finite; /* plans with RLX_PLAN_CHECK_FINITE */
} rlx__batch_options;

/* spec: the block (its all_logits, emit_hidden and mtp must be 0). A block with linear-attention
 * layers holds a recurrent state per slot, which sums up all the slot's positions: the caller
 * keeps rlx__batch_copy's rule and reuses a slot only where its state ends. */
rlx_status rlx__batch_create(const rlx_model *m, const rlx_block_spec *spec, const rlx__batch_options *o,
                             rlx__batch **out);
void rlx__batch_destroy(rlx__batch *b);
/* Runs n rows: input is n token ids (a block that embeds) or n rows of hidden_size F32 values;
 * row r is position pos[r] of slot seq[r]. A logits block computes the logits of rows
 * out_rows[0..n_out) (n_out >= 1); other blocks ignore out_rows and return every row's hidden
 * state. *out stays valid until the next run. Positions and slots are the caller's to check. */
rlx_status rlx__batch_run(rlx__batch *b, const void *input, const int32_t *pos, const int32_t *seq, uint32_t n,
                          const int32_t *out_rows, uint32_t n_out, const float **out);
/* Runs the plan of the last rlx__batch_run again node by node, checking every output
 * (rlx_plan_run_checked), to trace a logit that is not finite to the node that first wrote
 * such a value: RLX_E_RANGE naming it, or RLX_OK when this run finds every value finite. The
 * inputs of the last run must be unchanged; its output is overwritten. */
rlx_status rlx__batch_trace_nonfinite(rlx__batch *b);
/* The bytes of all slots' KV rows and recurrent states (rlx_engine_memory). */
void rlx__batch_memory(const rlx__batch *b, uint64_t *kv_bytes, uint64_t *state_bytes);
/* Copies positions [0, n) of slot `from` into slot `to`, every layer's K and V; a linear
 * layer's recurrent state is copied whole, so for a block with such layers (rlx__model_recurrent)
 * n must be every position slot `from` has run. */
void rlx__batch_copy(rlx__batch *b, uint32_t from, uint32_t to, uint32_t n);

#endif
