/* The engine: many generation requests on one model at once (continuous batching).
 *
 * An engine owns a KV cache of n_slots sequences of slot_positions each, allocated once, and a
 * worker thread. Each step it runs one forward pass over rows of several sequences: one decode
 * row per running sequence, then chunks of the prompts of newly admitted ones up to a token
 * budget, so running streams keep a steady pace while a long prompt is read. Requests beyond
 * the free slots wait in a bounded queue; beyond that, rlx_engine_submit refuses them at once
 * (RLX_E_BUSY), never growing memory. A new request reuses the longest prefix of its prompt that
 * any slot holds (a shared system prompt is computed once, its KV rows copied).
 *
 * Batch invariance: a row's logits do not depend on the other rows of the step, on how a
 * prompt was cut into chunks, or on which slot holds the sequence, wherever the backends'
 * kernels keep their reduction order per row whatever the number of rows (the attention
 * kernels and the quantized repacked matmuls do; BLAS sgemm does not). Each request samples
 * with its own sampler and seed, so a request gives the same tokens alone or among others.
 *
 * Events are delivered on the worker thread, in order per request, through the request's
 * callback: every generated token, then exactly one DONE. A callback must return quickly (copy
 * what it needs and signal its own thread); returning non-zero from a TOKEN event finishes the
 * request with RLX_FINISH_STOP (the caller matched a stop string).
 *
 * Over a pipeline (rlx_engine_create_pipeline) the slots are the stages' and the same holds: a
 * row's logits are the bits the one-process engine computes, wherever the stages' kernels are
 * batch invariant. */
#ifndef RLX_ENGINE_H
#define RLX_ENGINE_H

#include <stdint.h>
#include <string.h>

#include "rlx/dist.h"
#include "rlx/gen.h"
#include "rlx/speculator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most slots of one engine (and of one driver connection in a pipeline stage). */
#define RLX_ENGINE_MAX_SLOTS 1024

/* The most alternatives a request may ask log-probabilities for (OpenAI's top_logprobs bound). */
#define RLX_ENGINE_MAX_TOP_LOGPROBS 20

/* Start from rlx_engine_options_default(); members are only appended (size says which). */
typedef struct rlx_engine_options {
    uint32_t size;
    uint32_t n_slots;             /* sequences in flight; 0 = 4 */
    uint32_t slot_positions;      /* KV positions per slot; 0 = min(max_position_embeddings, 4096) */
    uint32_t max_queue;           /* requests waiting for a slot; 0 = 4 * n_slots */
    uint32_t step_tokens;         /* the most rows of one forward pass; 0 = 128 (>= n_slots): a
                                   * step of prompt rows stalls the running streams that long */
    uint32_t kv_dtype;            /* RLX_DTYPE_F32 (0) or RLX_DTYPE_F16 */
    rlx_backend *const *backends; /* preference order, borrowed for the engine's lifetime */
    size_t n_backends;
    const rlx_place_rule *rules; /* borrowed; may be NULL */
    size_t n_rules;
    /* appended: a local engine's plans check every node's output (rlx_session_options'
     * check_finite); without it only the logits rows are checked, and a row that is not finite
     * ends its request with an error */
    uint32_t check_finite;
    /* appended: non-zero allows slot_positions past the model's max_position_embeddings
     * (rlx_session_options.beyond_trained) */
    uint32_t beyond_trained;
} rlx_engine_options;

static inline rlx_engine_options rlx_engine_options_default(void) {
    rlx_engine_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    return o;
}

typedef struct rlx_engine rlx_engine;

/* Why a request ended. */
typedef enum rlx_finish {
    RLX_FINISH_NONE = 0,
    RLX_FINISH_EOS = 1,       /* a stop id was generated (it was reported as a token) */
    RLX_FINISH_LENGTH = 2,    /* max_tokens were generated */
    RLX_FINISH_STOP = 3,      /* the callback returned non-zero */
    RLX_FINISH_CONTEXT = 4,   /* the slot is full: the last token was reported, not fed */
    RLX_FINISH_CANCELLED = 5, /* rlx_engine_cancel, or the engine was drained or destroyed */
    RLX_FINISH_ERROR = 6,     /* status and message say why */
} rlx_finish;

typedef enum rlx_engine_event_kind {
    RLX_ENGINE_TOKEN = 1,
    RLX_ENGINE_DONE = 2,
} rlx_engine_event_kind;

/* Timings and counts of one request, complete in its DONE event. */
typedef struct rlx_request_usage {
    uint32_t n_prompt;     /* prompt tokens */
    uint32_t n_cached;     /* of them, taken from a cached prefix instead of computed */
    uint32_t n_generated;  /* tokens reported */
    double queue_seconds;  /* from submit to admission into a slot */
    double prompt_seconds; /* from admission to the first token */
    double decode_seconds; /* from the first token to the last */
} rlx_request_usage;

typedef struct rlx_engine_event {
    uint32_t kind; /* rlx_engine_event_kind */
    uint64_t id;   /* the request's */
    /* TOKEN */
    int32_t token;
    float logprob;          /* log-softmax of the raw logits at token, when logprobs were asked for */
    uint32_t n_top;         /* alternatives below, best first */
    const int32_t *top_ids; /* borrowed for the call */
    const float *top_logprobs;
    /* DONE */
    uint32_t finish;     /* rlx_finish */
    rlx_status status;   /* RLX_OK unless finish is RLX_FINISH_ERROR */
    const char *message; /* the error, borrowed for the call; "" otherwise */
    rlx_request_usage usage;
} rlx_engine_event;

typedef int (*rlx_engine_event_fn)(void *ctx, const rlx_engine_event *ev);

typedef struct rlx_request {
    uint32_t size;         /* sizeof(rlx_request) */
    const int32_t *prompt; /* n_prompt >= 1 ids, copied by submit */
    uint32_t n_prompt;
    uint32_t max_tokens; /* 0 = until a stop id or the slot is full */
    rlx_sampler_params sampler;
    int logprobs;            /* 1: report each token's log-probability */
    uint32_t top_logprobs;   /* alternatives per token, at most RLX_ENGINE_MAX_TOP_LOGPROBS */
    const int32_t *stop_ids; /* ids that end the request; NULL = the model's EOS ids; copied */
    uint32_t n_stop_ids;
    rlx_engine_event_fn on_event; /* required */
    void *ctx;
    /* appended: constrained decoding (rlx/grammar.h). With a grammar every generated token is
     * one it allows, and a stop id comes only where its text is complete (a grammar that allows
     * nothing more and no stop id ends the request with an error). Both are borrowed until the
     * DONE event; the vocabulary must be the model's tokenizer's. */
    const struct rlx_grammar *grammar;
    const struct rlx_grammar_vocab *grammar_vocab;
} rlx_request;

/* Creates an engine on model m (borrowed, with the backends, for the engine's lifetime) and
 * starts its worker. The KV cache is mapped once: untouched pages cost nothing, so
 * n_slots * slot_positions may exceed what is ever used. */
RLX_API rlx_status rlx_engine_create(const rlx_model *m, const rlx_engine_options *opts, rlx_engine **out);
/* An engine over an lm rather than a model: a pipeline driver's one sequence (for a speculator
 * over a pipeline; rlx_engine_create_pipeline runs many), or a session with a speculator
 * (spec, with draft_tokens per round; NULL for none). Requests take turns on the lm, one slot,
 * reusing the prefix the lm holds from the previous request (not with a speculator, which reads
 * every prompt whole); the queue, events, cancel and drain are as above. Both are borrowed for
 * the engine's lifetime. More than one slot is RLX_E_UNSUPPORTED. */
RLX_API rlx_status rlx_engine_create_lm(const rlx_lm *lm, rlx_speculator *spec, uint32_t draft_tokens,
                                        const rlx_engine_options *opts, rlx_engine **out);
/* An engine whose slots live in the stages of a pipeline: d (borrowed for the engine's
 * lifetime, created with rlx_driver_options.n_slots) holds n_slots sequences of its capacity
 * in every stage, and the engine batches and schedules them as rlx_engine_create does. The
 * slots fall into min(n_slots, stages) groups that take turns through the stages, one step of
 * each in flight, so every stage computes at once: while stage 1 runs one group's rows, stage 0
 * runs the next group's. opts' n_slots and slot_positions are 0 or the driver's; the cache's
 * dtype is the stages' own, and opts' backends and rules are not used. */
RLX_API rlx_status rlx_engine_create_pipeline(rlx_driver *d, const rlx_engine_options *opts, rlx_engine **out);
/* Cancels every request (each gets its DONE with RLX_FINISH_CANCELLED), stops the worker and
 * frees everything. NULL is a no-op. */
RLX_API void rlx_engine_destroy(rlx_engine *e);

/* Queues a request and returns its id (> 0) in *id. RLX_E_BUSY when the queue is full,
 * RLX_E_RANGE when the prompt does not fit in a slot, RLX_E_INVALID for bad parameters (the
 * message names the field). Submit never waits. After a successful submit exactly one DONE
 * event follows, possibly before submit returns. */
RLX_API rlx_status rlx_engine_submit(rlx_engine *e, const rlx_request *req, uint64_t *id);
/* Queues n requests of one prompt (n choices of a completion: OpenAI's n) as
 * rlx_engine_submit queues one, their ids in ids[0 .. n), and runs the prompt once: they are
 * admitted together once n slots are free, the first computes the prompt (reusing a cached
 * prefix as any request does), and the others take copies of its slot's rows (and recurrent
 * state) and sample their first token from its last prompt row's logits, each with its own
 * sampler, so each gives the tokens it would give alone (batch invariance) while its usage
 * counts the whole prompt as cached. Should the first end before its prompt pass does, the
 * others compute the prompt themselves. reqs is an array of n rlx_request whose stride is
 * reqs[0].size; the prompts must be the same ids (else RLX_E_INVALID); n is 1 to n_slots.
 * All are queued or none (RLX_E_BUSY when the queue lacks room for n); each gets its DONE. */
RLX_API rlx_status rlx_engine_submit_choices(rlx_engine *e, const rlx_request *reqs, uint32_t n, uint64_t *ids);
/* Ends a request early (its slot is free for the next step): its DONE event says
 * RLX_FINISH_CANCELLED unless it had finished already. An unknown or finished id is a no-op. */
RLX_API void rlx_engine_cancel(rlx_engine *e, uint64_t id);
/* Stops admitting new requests (submit says RLX_E_BUSY), waits up to timeout_ms for the
 * running and queued ones to finish, then cancels those left. Returns the number cancelled. */
RLX_API uint32_t rlx_engine_drain(rlx_engine *e, uint32_t timeout_ms);

/* Work for the engine's worker thread besides its requests: a caller that runs a session of its
 * own on the engine's model and backends (an embedding or a reranking pass) must not run it
 * beside the worker, as a backend instance takes calls from one thread at a time. The worker calls
 * fn(ctx, 0) between two steps, without its lock; fn does a bounded piece of work (a prompt
 * chunk) and returns non-zero to be called again after the next step (the tasks and the running
 * requests take turns), 0 once it is done, after which the engine forgets it. When the engine is
 * destroyed, or drained past its timeout, a task not done gets one last call fn(ctx, 1), which
 * must only release it. RLX_E_BUSY when the engine drains or closes, or n_slots + max_queue
 * tasks wait already (the queue's bound); RLX_E_INVALID for a NULL argument. Over an lm, tasks
 * run between requests. */
typedef int (*rlx_engine_task_fn)(void *ctx, int cancelled);
RLX_API rlx_status rlx_engine_task_submit(rlx_engine *e, rlx_engine_task_fn fn, void *ctx);

/* Counters since creation, for /metrics. */
typedef struct rlx_engine_stats {
    uint64_t requests_done, requests_cancelled, requests_failed, requests_refused;
    uint64_t prompt_tokens, cached_tokens, generated_tokens;
    uint64_t steps;
    double busy_seconds; /* time spent in forward passes and sampling */
    uint32_t running, queued;
    uint32_t n_slots, slot_positions;
    uint64_t kv_positions_used; /* summed over the slots now */
} rlx_engine_stats;
RLX_API void rlx_engine_stats_of(rlx_engine *e, rlx_engine_stats *out);
/* One slot as rlx_engine_slot_info_of sees it. Members are only appended (size says which). */
typedef struct rlx_engine_slot_info {
    uint32_t size;        /* sizeof(rlx_engine_slot_info) the caller was built with; set it before the call */
    uint32_t busy;        /* 1: a request runs in the slot (admitted, its prompt or its tokens in progress) */
    uint64_t request_id;  /* the running request's id; when idle, the last one the slot ran (0: none yet) */
    uint32_t n_positions; /* the slot's KV positions (slot_positions) */
    uint32_t n_held;      /* positions whose K and V rows the slot held when the worker's latest step began */
    /* the running request's (all 0 when idle) */
    uint32_t n_prompt;          /* its prompt tokens */
    uint32_t n_cached;          /* of them, taken from a cached prefix */
    uint32_t n_generated;       /* tokens reported so far */
    uint32_t max_tokens;        /* as submitted: 0 = until a stop id or the slot is full */
    uint32_t top_logprobs;      /* alternatives reported per token */
    uint32_t has_grammar;       /* 1: constrained by a grammar */
    rlx_sampler_params sampler; /* as submitted, logit_bias NULL (n_logit_bias says how many it had) */
} rlx_engine_slot_info;

/* What slot i (0 .. n_slots - 1) of e holds now, read under the engine's lock (any thread, any
 * time; the counts may be a step behind the worker). out->size must be set: a caller built
 * against an older header gets the members its size covers. RLX_E_INVALID for a NULL argument
 * or a size below the first version's, RLX_E_RANGE for i past the slots. */
RLX_API rlx_status rlx_engine_slot_info_of(rlx_engine *e, uint32_t i, rlx_engine_slot_info *out);
/* rlx_session_memory for the slots of a batched engine (rlx_engine_create), all slots together;
 * 0 and 0 for an engine over an lm or a pipeline, whose memory is held elsewhere. */
RLX_API void rlx_engine_memory(const rlx_engine *e, uint64_t *kv_bytes, uint64_t *state_bytes);

/* ---- deprecated, removed in rlx 0.3 ---- */

/* rlx_engine_slot_info_of. */
RLX_API rlx_status rlx_engine_slot_info_get(rlx_engine *e, uint32_t i, rlx_engine_slot_info *out);

#ifdef __cplusplus
}
#endif
#endif
