/* The batched engine (rlx/engine.h): slots of one KV cache, a bounded queue, and a worker that
 * runs one forward pass per step over the rows of every running sequence. Over a pipeline the
 * caches are the stages' and the worker keeps one step per group of slots in flight.
 *
 * Locking: `mu` guards the queue, the cancel flags, the counters and the admission of requests
 * into slots; the worker alone touches the slots' caches, plans and samplers, outside the lock,
 * so a forward pass never holds it. Events are delivered by the worker without the lock held, so
 * a callback may call rlx_engine_cancel or rlx_engine_submit. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rlx/dist.h"
#include "rlx/engine.h"
#include "rlx/grammar.h"
#include "rlx/model.h"
#include "rlx/sched.h"
#include "rlx/speculator.h"

#include "dist/dist_internal.h"
#include "gen/gen_internal.h"
#include "model/model_internal.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/sized.h"

/* An in_flight entry that is a copy between slots, not a group's step. */
#define COPY_IN_FLIGHT UINT32_MAX
/* How long the idle worker sleeps before it looks at the flags again without being woken. */
#define ENGINE_IDLE_MS 200
/* A prefix held by a busy slot is copied to the new request's slot from this many positions:
 * below it, recomputing costs about what the copy does. */
#define ENGINE_MIN_COPY 16

typedef struct engine_req {
    uint64_t id;
    rlx_request r; /* prompt and stop_ids point at the copies below */
    int32_t *prompt, *stop_ids;
    rlx_sampler *sampler;
    rlx_grammar_matcher *grammar; /* the request's place in its grammar; NULL without one */
    int cancelled;                /* under mu */
    /* one of rlx_engine_submit_choices' requests after the first: that one's id, whose prompt
     * pass this one shares; 0 for any other request */
    uint64_t fork_of;
    double t_submit, t_admit, t_first, t_last;
    uint32_t n_cached, n_generated;
    struct engine_req *next; /* the queue */
} engine_req;

/* A caller's work on the worker thread (rlx_engine_task_submit). */
typedef struct engine_task {
    rlx_engine_task_fn fn;
    void *ctx;
    struct engine_task *next;
} engine_task;

enum { SLOT_PROMPT = 0, SLOT_SAMPLE = 1, SLOT_DECODE = 2, SLOT_WAIT = 3 };

typedef struct engine_slot {
    engine_req *req;  /* NULL: free */
    int32_t *tokens;  /* [capacity] the ids whose K and V rows the slot holds, by position */
    uint32_t n_valid; /* rows of tokens (and of the cache) that are valid */
    /* PROMPT: rows of the prompt are left to run; SAMPLE: this step's pass ends the prompt and
     * its last row's logits give the first token; DECODE: `pending` is the next row to feed;
     * WAIT: the request shares the prompt pass of the request it forks from (fork_of), which
     * runs in another slot, and takes that slot's rows and last logits when the pass ends */
    int state;
    int32_t pending;
    int cancel;         /* the worker's copy of the request's flag, taken under mu */
    uint64_t last_used; /* when it last finished a request: the least recent free slot is reused first */
    /* over a pipeline: the ticket of the latest copy out of this slot, which may still be on its
     * way through the stages until a later step is back; the slot takes no new request until
     * then, so a lost stage can be rebuilt from what the slots held */
    uint64_t copy_ticket;
    /* for rlx_engine_slot_info_of, written under mu: n_valid as the latest step began (the
     * worker changes n_valid outside the lock), and the id of the last request the slot ran */
    uint32_t n_held;
    uint64_t last_id;
} engine_slot;

/* Over a pipeline, the slots fall into groups (slot s into group s % n_groups) that take turns
 * through the stages: each group has at most one step in flight, and while the stages compute
 * one group's step the worker samples another's logits and submits its next step. */
typedef struct engine_group {
    int busy;           /* a step of the group is in flight */
    uint64_t ticket;    /* the driver's, of that step */
    uint32_t n_out;     /* logits rows it returns, for the slots below */
    uint32_t *out_slot; /* [n_slots] */
} engine_group;

struct rlx_engine {
    const rlx_model *m; /* batched mode; NULL over an lm or a pipeline */
    rlx__batch *batch;  /* batched mode: the model over the slots */
    /* the model has linear-attention layers: a slot's recurrent state sums up all n_valid
     * positions, so a prompt reuses a slot only when it continues everything the slot ran, and
     * never copies a busy slot's prefix */
    int recurrent;
    /* pipeline mode: the slots live in the stages of d, which runs the steps */
    rlx_driver *pipe;
    engine_group *groups;
    uint32_t n_groups;
    /* groups with a step in flight and copies (COPY_IN_FLIGHT), oldest first: the driver answers
     * in order */
    uint32_t *in_flight;
    uint64_t done_ticket; /* the latest step back from the pipeline */
    uint32_t n_in_flight;
    double busy_since; /* when the pipeline last went from idle to busy */
    /* lm mode: requests run one after another on lm (a pipeline driver, or a session with a
     * speculator), with the speculator when there is one */
    rlx_lm lm;
    int over_lm;
    rlx_speculator *spec;
    uint32_t draft_tokens;
    int64_t vocab;
    const int32_t *eos_ids;
    uint32_t n_eos;
    rlx_backend **backends;
    size_t n_backends;
    rlx_place_rule *rules;
    size_t n_rules;
    uint32_t n_slots, capacity, max_queue, step_tokens;
    engine_slot *slots;
    uint64_t clock;
    /* the step's rows */
    int32_t *ids, *pos, *seq, *out_rows;
    uint32_t *out_slot;
    pthread_t worker;
    int worker_started;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* work arrived, a cancel, or shutdown */
    pthread_cond_t idle; /* the worker finished a step with nothing left */
    engine_req *queue_head, *queue_tail;
    uint32_t n_queued, n_running;
    engine_task *task_head, *task_tail; /* under mu, taking turns with the steps */
    uint32_t n_tasks;
    int tasks_cancel; /* a drain ran out of time: the tasks get their last call */
    int closing, draining;
    uint64_t next_id;
    rlx_engine_stats stats;
};

static void req_free(engine_req *r) {
    if (!r)
        return;
    rlx_sampler_destroy(r->sampler);
    rlx_grammar_matcher_destroy(r->grammar);
    free(r->prompt);
    free(r->stop_ids);
    free(r);
}

static void *engine_main(void *arg);

/* Starts the worker of an engine whose members are set; destroys it on failure. */
static rlx_status engine_start(rlx_engine *e, rlx_engine **out) {
    pthread_mutex_init(&e->mu, NULL);
    rlx__cond_init_monotonic(&e->wake);
    rlx__cond_init_monotonic(&e->idle);
    e->stats.n_slots = e->n_slots;
    e->stats.slot_positions = e->capacity;
    e->next_id = 1;
    int err = pthread_create(&e->worker, NULL, engine_main, e);
    if (err) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->wake);
        pthread_cond_destroy(&e->idle);
        rlx_engine_destroy(e);
        return rlx_error(RLX_E_NOMEM, "engine: cannot start its worker thread: %s", strerror(err));
    }
    e->worker_started = 1;
    *out = e;
    return RLX_OK;
}

static rlx_status read_options(const rlx_engine_options *opts, rlx_engine_options *o) {
    *o = rlx_engine_options_default();
    return opts ? rlx__read_sized(o, sizeof *o, opts, offsetof(rlx_engine_options, rules), "rlx_engine_options")
                : RLX_OK;
}

rlx_status rlx_engine_create_lm(const rlx_lm *lm, rlx_speculator *spec, uint32_t draft_tokens,
                                const rlx_engine_options *opts, rlx_engine **out) {
    if (!lm || !out)
        return rlx_error(RLX_E_INVALID, "rlx_engine_create_lm: NULL argument");
    *out = NULL;
    rlx_engine_options o;
    rlx_status rc = read_options(opts, &o);
    if (rc != RLX_OK)
        return rc;
    if (o.n_slots > 1)
        return rlx_error(RLX_E_UNSUPPORTED,
                         "%u slots over an lm (a speculating session, or a pipeline's one sequence): "
                         "requests take turns there, so it has one slot (rlx_engine_create_pipeline "
                         "runs many over a pipeline)",
                         o.n_slots);
    if (spec && (draft_tokens == 0 || draft_tokens > RLX_SPEC_MAX_DRAFT))
        return rlx_error(RLX_E_INVALID, "%u draft tokens: want 1 to %d", draft_tokens, RLX_SPEC_MAX_DRAFT);
    rlx_engine *e = rlx__calloc(1, sizeof *e);
    if (e)
        e->n_slots = 1;
    if (!e || !(e->slots = rlx__calloc(1, sizeof *e->slots)) ||
        !(e->slots[0].tokens = rlx__malloc(lm->capacity(lm->self) * sizeof *e->slots[0].tokens))) {
        rlx_engine_destroy(e);
        return rlx_error(RLX_E_NOMEM, "engine: out of memory");
    }
    e->lm = *lm;
    e->over_lm = 1;
    e->spec = spec;
    e->draft_tokens = draft_tokens;
    e->vocab = lm->vocab;
    e->eos_ids = lm->eos_ids;
    e->n_eos = lm->n_eos;
    e->capacity = lm->capacity(lm->self);
    e->max_queue = o.max_queue ? o.max_queue : 4;
    return engine_start(e, out);
}

/* Allocates the slots and the step's rows of an engine whose n_slots, capacity and step_tokens
 * are set. */
static rlx_status alloc_slots(rlx_engine *e) {
    e->slots = rlx__calloc(e->n_slots, sizeof *e->slots);
    e->ids = rlx__malloc(e->step_tokens * sizeof *e->ids);
    e->pos = rlx__malloc(e->step_tokens * sizeof *e->pos);
    e->seq = rlx__malloc(e->step_tokens * sizeof *e->seq);
    e->out_rows = rlx__malloc(e->n_slots * sizeof *e->out_rows);
    e->out_slot = rlx__malloc(e->n_slots * sizeof *e->out_slot);
    if (!e->slots || !e->ids || !e->pos || !e->seq || !e->out_rows || !e->out_slot)
        return RLX_E_NOMEM;
    for (uint32_t s = 0; s < e->n_slots; s++)
        if (!(e->slots[s].tokens = rlx__malloc(e->capacity * sizeof *e->slots[s].tokens)))
            return RLX_E_NOMEM;
    return RLX_OK;
}

/* Checks the slot figures of o (defaults filled in) against a model of max_pos positions. */
static rlx_status check_slots(rlx_engine_options *o, uint32_t max_pos) {
    o->n_slots = o->n_slots ? o->n_slots : 4;
    o->slot_positions = o->slot_positions ? o->slot_positions : (max_pos < 4096 ? max_pos : 4096);
    o->max_queue = o->max_queue ? o->max_queue : 4 * o->n_slots;
    o->step_tokens = o->step_tokens ? o->step_tokens : 128;
    if (o->slot_positions > max_pos && !o->beyond_trained)
        return rlx_error(RLX_E_RANGE, "a slot of %u positions exceeds the model's max_position_embeddings %u",
                         o->slot_positions, max_pos);
    if (o->n_slots > RLX_ENGINE_MAX_SLOTS || o->step_tokens < o->n_slots || o->step_tokens > 65536)
        return rlx_error(RLX_E_INVALID,
                         "engine of %u slots with %u rows per step: want 1..%d slots and "
                         "n_slots <= step_tokens <= 65536",
                         o->n_slots, o->step_tokens, RLX_ENGINE_MAX_SLOTS);
    return RLX_OK;
}

static uint32_t max_positions(const rlx_model_config *c) {
    return c->max_position_embeddings > 0 && c->max_position_embeddings < UINT32_MAX
               ? (uint32_t)c->max_position_embeddings
               : UINT32_MAX;
}

/* A slotted engine of model configuration c and checked options o, its slots not allocated yet. */
static rlx_engine *engine_new(const rlx_model_config *c, const rlx_engine_options *o) {
    rlx_engine *e = rlx__calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->vocab = c->vocab_size;
    e->eos_ids = c->eos_ids;
    e->n_eos = c->n_eos;
    e->n_slots = o->n_slots;
    e->capacity = o->slot_positions;
    e->max_queue = o->max_queue;
    e->step_tokens = o->step_tokens;
    return e;
}

rlx_status rlx_engine_create(const rlx_model *m, const rlx_engine_options *opts, rlx_engine **out) {
    if (!m || !out)
        return rlx_error(RLX_E_INVALID, "rlx_engine_create: NULL argument");
    *out = NULL;
    rlx_engine_options o;
    rlx_status rc = read_options(opts, &o);
    if (rc != RLX_OK)
        return rc;
    const rlx_model_config *c = rlx_model_config_of(m);
    const rlx_block_spec spec = {.size = sizeof spec,
                                 .layer_start = 0,
                                 .layer_end = (uint32_t)c->num_hidden_layers,
                                 .embed_input = 1,
                                 .produce_logits = 1};
    if ((rc = rlx_model_check_block(m, &spec)) != RLX_OK || (rc = check_slots(&o, max_positions(c))) != RLX_OK)
        return rc;
    rlx_engine *e = engine_new(c, &o);
    if (!e)
        return rlx_error(RLX_E_NOMEM, "engine: out of memory");
    e->m = m;
    e->n_backends = o.n_backends;
    e->backends = rlx__calloc(o.n_backends + 1, sizeof *e->backends);
    e->n_rules = o.n_rules;
    e->rules = rlx__calloc(o.n_rules + 1, sizeof *e->rules);
    if (!e->backends || !e->rules || alloc_slots(e) != RLX_OK) {
        rlx_engine_destroy(e);
        return rlx_error(RLX_E_NOMEM, "engine: out of memory for %u slots of %u positions", o.n_slots,
                         o.slot_positions);
    }
    for (size_t i = 0; i < o.n_backends; i++)
        e->backends[i] = o.backends[i];
    for (size_t i = 0; i < o.n_rules; i++)
        e->rules[i] = o.rules[i];
    e->recurrent = rlx__model_recurrent(m, &spec);
    const rlx__batch_options bo = {.n_slots = e->n_slots,
                                   .capacity = e->capacity,
                                   .kv_dtype = o.kv_dtype,
                                   .backends = e->backends,
                                   .n_backends = e->n_backends,
                                   .rules = e->rules,
                                   .n_rules = e->n_rules,
                                   .check_finite = o.check_finite};
    if ((rc = rlx__batch_create(m, &spec, &bo, &e->batch)) != RLX_OK) {
        rlx_engine_destroy(e);
        return rc;
    }
    return engine_start(e, out);
}

rlx_status rlx_engine_create_pipeline(rlx_driver *d, const rlx_engine_options *opts, rlx_engine **out) {
    if (!d || !out)
        return rlx_error(RLX_E_INVALID, "rlx_engine_create_pipeline: NULL argument");
    *out = NULL;
    rlx_engine_options o;
    rlx_status rc = read_options(opts, &o);
    if (rc != RLX_OK)
        return rc;
    const uint32_t n_slots = rlx_driver_n_slots(d);
    if (!n_slots)
        return rlx_error(RLX_E_INVALID, "the pipeline driver was created without slots (rlx_driver_options.n_slots)");
    if ((o.n_slots && o.n_slots != n_slots) || (o.slot_positions && o.slot_positions != rlx_driver_capacity(d)))
        return rlx_error(RLX_E_INVALID, "%u slots of %u positions asked of a pipeline whose stages hold %u of %u",
                         o.n_slots, o.slot_positions, n_slots, rlx_driver_capacity(d));
    o.n_slots = n_slots;
    o.slot_positions = rlx_driver_capacity(d);
    const rlx_model_config *c = rlx_driver_config(d);
    if ((rc = check_slots(&o, max_positions(c))) != RLX_OK)
        return rc;
    rlx_engine *e = engine_new(c, &o);
    if (!e)
        return rlx_error(RLX_E_NOMEM, "engine: out of memory");
    e->pipe = d;
    e->recurrent = rlx__driver_recurrent(d);
    /* one group per stage keeps every stage busy; more would only split the batches */
    e->n_groups = rlx_driver_n_stages(d) < e->n_slots ? rlx_driver_n_stages(d) : e->n_slots;
    e->groups = rlx__calloc(e->n_groups, sizeof *e->groups);
    /* a step per group, and copies (copy_prefix keeps to the room) */
    e->in_flight = rlx__calloc(e->n_groups + e->n_slots, sizeof *e->in_flight);
    rc = e->groups && e->in_flight ? alloc_slots(e) : RLX_E_NOMEM;
    for (uint32_t g = 0; rc == RLX_OK && g < e->n_groups; g++)
        if (!(e->groups[g].out_slot = rlx__calloc(e->n_slots, sizeof *e->groups[g].out_slot)))
            rc = RLX_E_NOMEM;
    if (rc != RLX_OK) {
        rlx_engine_destroy(e);
        return rlx_error(RLX_E_NOMEM, "engine: out of memory for %u slots", o.n_slots);
    }
    return engine_start(e, out);
}

static void deliver_done(rlx_engine *e, engine_req *r, uint32_t finish, rlx_status status, const char *message) {
    rlx_engine_event ev = {.kind = RLX_ENGINE_DONE,
                           .id = r->id,
                           .finish = finish,
                           .status = status,
                           .message = message ? message : "",
                           .usage = {.n_prompt = r->r.n_prompt,
                                     .n_cached = r->n_cached,
                                     .n_generated = r->n_generated,
                                     .queue_seconds = r->t_admit > 0 ? r->t_admit - r->t_submit : 0,
                                     .prompt_seconds = r->t_first > 0 ? r->t_first - r->t_admit : 0,
                                     .decode_seconds = r->t_first > 0 ? r->t_last - r->t_first : 0}};
    /* counted first, so whoever the event wakes reads counters that include it */
    pthread_mutex_lock(&e->mu);
    if (finish == RLX_FINISH_CANCELLED)
        e->stats.requests_cancelled++;
    else if (finish == RLX_FINISH_ERROR)
        e->stats.requests_failed++;
    else
        e->stats.requests_done++;
    pthread_mutex_unlock(&e->mu);
    r->r.on_event(r->r.ctx, &ev);
}

void rlx_engine_destroy(rlx_engine *e) {
    if (!e)
        return;
    if (e->worker_started) {
        /* steps in flight come back within their deadlines, but a lost stage's replacement may
         * take the whole recovery timeout: give it up, its requests are cancelled anyway */
        if (e->pipe)
            rlx_driver_stop_recovery(e->pipe);
        pthread_mutex_lock(&e->mu);
        e->closing = 1;
        pthread_cond_broadcast(&e->wake);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->worker, NULL); /* it cancels every request on its way out */
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->wake);
        pthread_cond_destroy(&e->idle);
    }
    rlx__batch_destroy(e->batch);
    for (uint32_t g = 0; g < e->n_groups && e->groups; g++)
        free(e->groups[g].out_slot);
    free(e->groups);
    free(e->in_flight);
    for (uint32_t s = 0; s < e->n_slots && e->slots; s++)
        free(e->slots[s].tokens);
    free(e->slots);
    free(e->ids);
    free(e->pos);
    free(e->seq);
    free(e->out_rows);
    free(e->out_slot);
    free(e->backends);
    free(e->rules);
    free(e);
}

/* A queue entry of request req, checked and copied, in *out. */
static rlx_status make_req(rlx_engine *e, const rlx_request *req, engine_req **out) {
    *out = NULL;
    rlx_request r = {.size = sizeof r};
    rlx_status rc = rlx__read_sized(&r, sizeof r, req, offsetof(rlx_request, ctx) + sizeof r.ctx, "rlx_request");
    if (rc != RLX_OK)
        return rc;
    if (!r.grammar != !r.grammar_vocab)
        return rlx_error(RLX_E_INVALID,
                         "request: a grammar needs its vocabulary (grammar_vocab) and the other way round");
    if (!r.on_event)
        return rlx_error(RLX_E_INVALID, "request: on_event is required");
    if (!r.prompt || r.n_prompt == 0)
        return rlx_error(RLX_E_INVALID, "request: the prompt is empty");
    if (r.n_prompt >= e->capacity)
        return rlx_error(RLX_E_RANGE, "request: a prompt of %u tokens leaves no room in a slot of %u positions",
                         r.n_prompt, e->capacity);
    if (r.top_logprobs > RLX_ENGINE_MAX_TOP_LOGPROBS)
        return rlx_error(RLX_E_INVALID, "request: top_logprobs %u exceeds %d", r.top_logprobs,
                         RLX_ENGINE_MAX_TOP_LOGPROBS);
    if (r.n_stop_ids && !r.stop_ids)
        return rlx_error(RLX_E_INVALID, "request: %u stop ids but no array", r.n_stop_ids);
    for (uint32_t i = 0; i < r.n_prompt; i++)
        if (r.prompt[i] < 0 || r.prompt[i] >= e->vocab)
            return rlx_error(RLX_E_RANGE,
                             "request: token id %d (prompt position %u) is outside the vocabulary [0, %lld)",
                             r.prompt[i], i, (long long)e->vocab);
    engine_req *q = rlx__calloc(1, sizeof *q);
    if (!q)
        return rlx_error(RLX_E_NOMEM, "request: out of memory");
    q->r = r;
    const int32_t *stops = r.stop_ids ? r.stop_ids : e->eos_ids;
    q->r.n_stop_ids = r.stop_ids ? r.n_stop_ids : e->n_eos;
    q->prompt = rlx__malloc(r.n_prompt * sizeof *q->prompt);
    q->stop_ids = rlx__malloc((q->r.n_stop_ids + 1) * sizeof *q->stop_ids);
    if (!q->prompt || !q->stop_ids) {
        req_free(q);
        return rlx_error(RLX_E_NOMEM, "request: out of memory");
    }
    memcpy(q->prompt, r.prompt, r.n_prompt * sizeof *q->prompt);
    if (q->r.n_stop_ids)
        memcpy(q->stop_ids, stops, q->r.n_stop_ids * sizeof *q->stop_ids);
    q->r.prompt = q->prompt;
    q->r.stop_ids = q->stop_ids;
    if ((rc = rlx_sampler_create(&r.sampler, e->vocab, &q->sampler)) != RLX_OK ||
        (r.grammar &&
         ((rc = rlx_grammar_matcher_create(r.grammar, r.grammar_vocab, &q->grammar)) != RLX_OK ||
          (rc = rlx_sampler_set_grammar(q->sampler, q->grammar, q->stop_ids, q->r.n_stop_ids)) != RLX_OK))) {
        req_free(q);
        return rc;
    }
    *out = q;
    return RLX_OK;
}

rlx_status rlx_engine_submit(rlx_engine *e, const rlx_request *req, uint64_t *id) {
    return rlx_engine_submit_choices(e, req, 1, id);
}

rlx_status rlx_engine_submit_choices(rlx_engine *e, const rlx_request *reqs, uint32_t n, uint64_t *ids) {
    if (!e || !reqs || !ids)
        return rlx_error(RLX_E_INVALID, "rlx_engine_submit: NULL argument");
    if (n == 0 || n > e->n_slots)
        return rlx_error(RLX_E_INVALID, "%u choices of one prompt: want 1 to the engine's %u slots", n, e->n_slots);
    memset(ids, 0, n * sizeof *ids);
    engine_req *q[RLX_ENGINE_MAX_SLOTS] = {0};
    rlx_status rc = RLX_OK;
    /* the array's stride is the caller's sizeof(rlx_request), which an older header made smaller */
    uint32_t stride;
    memcpy(&stride, reqs, sizeof stride);
    for (uint32_t i = 0; i < n && rc == RLX_OK; i++) {
        const rlx_request *r = (const rlx_request *)(const void *)((const char *)reqs + (size_t)i * stride);
        if ((rc = make_req(e, r, &q[i])) == RLX_OK && i &&
            (q[i]->r.n_prompt != q[0]->r.n_prompt ||
             memcmp(q[i]->prompt, q[0]->prompt, q[0]->r.n_prompt * sizeof *q[0]->prompt) != 0))
            rc = rlx_error(RLX_E_INVALID, "request: choice %u's prompt differs from choice 0's", i);
    }
    if (rc != RLX_OK) {
        for (uint32_t i = 0; i < n; i++)
            req_free(q[i]);
        return rc;
    }
    const double now = rlx__now_seconds();
    pthread_mutex_lock(&e->mu);
    /* requests the worker has yet to put into free slots are not the queue's */
    if (e->closing || e->draining || e->n_queued + e->n_running + n > e->n_slots + e->max_queue) {
        e->stats.requests_refused += n;
        const int why = e->closing || e->draining;
        const uint32_t queued = e->n_queued;
        pthread_mutex_unlock(&e->mu);
        for (uint32_t i = 0; i < n; i++)
            req_free(q[i]);
        return why ? rlx_error(RLX_E_BUSY, "the engine is shutting down and takes no new requests")
                   : rlx_error(RLX_E_BUSY, "all %u slots are busy and %u requests wait already", e->n_slots, queued);
    }
    /* together in the queue, so they are admitted together (admit_next) */
    for (uint32_t i = 0; i < n; i++) {
        q[i]->t_submit = now;
        q[i]->id = ids[i] = e->next_id++;
        q[i]->fork_of = i ? ids[0] : 0;
        if (e->queue_tail)
            e->queue_tail->next = q[i];
        else
            e->queue_head = q[i];
        e->queue_tail = q[i];
    }
    e->n_queued += n;
    e->stats.queued = e->n_queued;
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->mu);
    return RLX_OK;
}

rlx_status rlx_engine_task_submit(rlx_engine *e, rlx_engine_task_fn fn, void *ctx) {
    if (!e || !fn)
        return rlx_error(RLX_E_INVALID, "rlx_engine_task_submit: NULL argument");
    engine_task *t = rlx__calloc(1, sizeof *t);
    if (!t)
        return rlx_error(RLX_E_NOMEM, "engine task: out of memory");
    t->fn = fn;
    t->ctx = ctx;
    pthread_mutex_lock(&e->mu);
    if (e->closing || e->draining || e->n_tasks >= e->n_slots + e->max_queue) {
        const int why = e->closing || e->draining;
        const uint32_t waiting = e->n_tasks;
        pthread_mutex_unlock(&e->mu);
        free(t);
        return why ? rlx_error(RLX_E_BUSY, "the engine is shutting down and takes no new work")
                   : rlx_error(RLX_E_BUSY, "%u tasks wait for the engine already", waiting);
    }
    if (e->task_tail)
        e->task_tail->next = t;
    else
        e->task_head = t;
    e->task_tail = t;
    e->n_tasks++;
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->mu);
    return RLX_OK;
}

/* The first task, taken off the list; called with mu held. */
static engine_task *pop_task(rlx_engine *e) {
    engine_task *t = e->task_head;
    if (t && !(e->task_head = t->next))
        e->task_tail = NULL;
    return t;
}

/* Gives the first task its turn (its last call, cancelled, when the engine closes or a drain ran
 * out of time, for every task); called with mu held, which it drops around the call. */
static void run_task(rlx_engine *e) {
    const int cancel = e->closing || e->tasks_cancel;
    engine_task *t = pop_task(e);
    if (!t)
        return;
    pthread_mutex_unlock(&e->mu);
    const int more = t->fn(t->ctx, cancel) && !cancel;
    pthread_mutex_lock(&e->mu);
    if (more) {
        t->next = NULL;
        if (e->task_tail)
            e->task_tail->next = t;
        else
            e->task_head = t;
        e->task_tail = t;
        return;
    }
    free(t);
    e->n_tasks--;
}

void rlx_engine_cancel(rlx_engine *e, uint64_t id) {
    if (!e || id == 0)
        return;
    pthread_mutex_lock(&e->mu);
    for (engine_req *r = e->queue_head; r; r = r->next)
        if (r->id == id)
            r->cancelled = 1;
    for (uint32_t s = 0; s < e->n_slots; s++)
        if (e->slots[s].req && e->slots[s].req->id == id)
            e->slots[s].req->cancelled = 1;
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

uint32_t rlx_engine_drain(rlx_engine *e, uint32_t timeout_ms) {
    if (!e)
        return 0;
    struct timespec until = rlx__deadline_in(timeout_ms);
    uint32_t cancelled = 0;
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    while (e->n_queued + e->n_running + e->n_tasks > 0)
        if (pthread_cond_timedwait(&e->idle, &e->mu, &until) == ETIMEDOUT)
            break;
    e->tasks_cancel = 1;
    for (engine_req *r = e->queue_head; r; r = r->next)
        if (!r->cancelled) {
            r->cancelled = 1;
            cancelled++;
        }
    for (uint32_t s = 0; s < e->n_slots; s++)
        if (e->slots[s].req && !e->slots[s].req->cancelled) {
            e->slots[s].req->cancelled = 1;
            cancelled++;
        }
    pthread_cond_broadcast(&e->wake);
    /* the worker delivers the cancellations; bound the wait as every wait is bounded */
    struct timespec grace = rlx__deadline_in(timeout_ms < 1000 ? 1000 : timeout_ms);
    while (e->n_queued + e->n_running + e->n_tasks > 0)
        if (pthread_cond_timedwait(&e->idle, &e->mu, &grace) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&e->mu);
    return cancelled;
}

void rlx_engine_memory(const rlx_engine *e, uint64_t *kv_bytes, uint64_t *state_bytes) {
    uint64_t kv = 0, state = 0;
    if (e && e->batch) /* fixed at creation: no lock needed */
        rlx__batch_memory(e->batch, &kv, &state);
    if (kv_bytes)
        *kv_bytes = kv;
    if (state_bytes)
        *state_bytes = state;
}

void rlx_engine_stats_of(rlx_engine *e, rlx_engine_stats *out) {
    if (!e || !out)
        return;
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    out->running = e->n_running;
    out->queued = e->n_queued;
    pthread_mutex_unlock(&e->mu);
}

rlx_status rlx_engine_slot_info_of(rlx_engine *e, uint32_t i, rlx_engine_slot_info *out) {
    if (!e || !out)
        return rlx_error(RLX_E_INVALID, "rlx_engine_slot_info_of: NULL argument");
    uint32_t size;
    memcpy(&size, out, sizeof size);
    const size_t first = offsetof(rlx_engine_slot_info, sampler) + sizeof out->sampler;
    if (size < first)
        return rlx_error(RLX_E_INVALID, "rlx_engine_slot_info.size is %u, below the %zu bytes of its first version",
                         size, first);
    if (i >= e->n_slots)
        return rlx_error(RLX_E_RANGE, "slot %u of an engine of %u slots", i, e->n_slots);
    rlx_engine_slot_info info = {.size = sizeof info, .n_positions = e->capacity};
    pthread_mutex_lock(&e->mu);
    const engine_slot *sl = &e->slots[i];
    const engine_req *r = sl->req;
    info.busy = r != NULL;
    info.request_id = r ? r->id : sl->last_id;
    info.n_held = sl->n_held;
    if (r) {
        info.n_prompt = r->r.n_prompt;
        info.n_cached = r->n_cached;
        info.n_generated = r->n_generated;
        info.max_tokens = r->r.max_tokens;
        info.top_logprobs = r->r.top_logprobs;
        info.has_grammar = r->r.grammar != NULL;
        info.sampler = r->r.sampler;
        info.sampler.logit_bias = NULL; /* the caller's array, borrowed only until submit returned */
    }
    pthread_mutex_unlock(&e->mu);
    memcpy(out, &info, size < sizeof info ? size : sizeof info);
    memcpy(out, &size, sizeof size);
    return RLX_OK;
}

// ---- the worker ----

static uint32_t common_prefix(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb) {
    uint32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Copies slot `from`'s first n positions into slot `to`; 0 when it cannot (a pipeline that is
 * down: the request then computes its prompt and meets the pipeline's error there). */
static int copy_prefix(rlx_engine *e, uint32_t from, uint32_t to, uint32_t n) {
    if (e->pipe) {
        /* a request cancelled before its first step frees its slot for another copy while its
         * own may still be on its way: past the list's room, the prompt is computed instead */
        if (e->n_in_flight == e->n_groups + e->n_slots ||
            rlx_driver_copy_slot(e->pipe, from, to, n, &e->slots[from].copy_ticket) != RLX_OK)
            return 0;
        e->in_flight[e->n_in_flight++] = COPY_IN_FLIGHT;
    } else {
        rlx__batch_copy(e->batch, from, to, n);
    }
    memcpy(e->slots[to].tokens, e->slots[from].tokens, n * sizeof *e->slots[to].tokens);
    return 1;
}

static uint32_t group_of(const rlx_engine *e, uint32_t s) { return e->n_groups ? s % e->n_groups : 0; }

/* A slot that may take a new request. */
static int slot_open(const rlx_engine *e, uint32_t s) {
    return !e->slots[s].req && e->slots[s].copy_ticket <= e->done_ticket;
}

static uint32_t open_slots(const rlx_engine *e) {
    uint32_t n = 0;
    for (uint32_t s = 0; s < e->n_slots; s++)
        n += slot_open(e, s);
    return n;
}

/* The slot running request id with its prompt pass not done yet, or -1. */
static int prompt_slot_of(const rlx_engine *e, uint64_t id) {
    for (uint32_t s = 0; id && s < e->n_slots; s++)
        if (e->slots[s].req && e->slots[s].req->id == id &&
            (e->slots[s].state == SLOT_PROMPT || e->slots[s].state == SLOT_SAMPLE))
            return (int)s;
    return -1;
}

/* Running requests per group, so a new one goes where the fewest run (a group whose streams all
 * wait on one another pipelines nothing). */
static uint32_t group_load(const rlx_engine *e, uint32_t g) {
    uint32_t n = 0;
    for (uint32_t s = g; s < e->n_slots; s += e->n_groups)
        n += e->slots[s].req != NULL;
    return n;
}

/* Puts r into a free slot, reusing the longest prefix of its prompt the cache holds: in that
 * free slot itself, or copied from a busy one. At least the prompt's last token is computed, for
 * the logits of the first new token, unless r shares the prompt pass of the request it forks
 * from, which is still to end: r then waits for that pass (SLOT_WAIT), keeping what its slot
 * holds in case the pass never ends. Called by the worker with mu held. */
static void admit(rlx_engine *e, engine_req *r) {
    const int waits = prompt_slot_of(e, r->fork_of) >= 0;
    const uint32_t limit = r->r.n_prompt - 1;
    int best_free = -1, best_any = -1;
    uint32_t len_free = 0, len_any = 0;
    uint32_t least = UINT32_MAX; /* the lightest group with a free slot */
    for (uint32_t s = 0; e->n_groups && s < e->n_slots; s++)
        if (slot_open(e, s) && group_load(e, group_of(e, s)) < least)
            least = group_load(e, group_of(e, s));
    for (uint32_t s = 0; s < e->n_slots; s++) {
        engine_slot *sl = &e->slots[s];
        uint32_t n = common_prefix(sl->tokens, sl->n_valid, r->prompt, limit);
        if (e->recurrent && n != sl->n_valid)
            n = 0;
        if (slot_open(e, s) && (!e->n_groups || group_load(e, group_of(e, s)) == least) &&
            (best_free < 0 || n > len_free || (n == len_free && sl->last_used < e->slots[best_free].last_used)))
            best_free = (int)s, len_free = n;
        if (sl->req && n > len_any && !e->recurrent)
            best_any = (int)s, len_any = n;
    }
    engine_slot *sl = &e->slots[best_free];
    uint32_t reuse = len_free;
    if (!waits && best_any >= 0 && len_any >= ENGINE_MIN_COPY && len_any > len_free &&
        copy_prefix(e, (uint32_t)best_any, (uint32_t)best_free, len_any))
        reuse = len_any;
    sl->req = r;
    sl->n_valid = reuse;
    sl->state = waits ? SLOT_WAIT : SLOT_PROMPT;
    /* the penalties see the whole prompt; the ids were checked by submit, so this cannot fail */
    rlx__sampler_accept_all(r->sampler, r->prompt, r->r.n_prompt);
    r->n_cached = reuse;
    r->t_admit = rlx__now_seconds();
    e->stats.cached_tokens += reuse;
    e->stats.prompt_tokens += r->r.n_prompt;
}

static void emit(rlx_engine *e, uint32_t s, const float *logits, const char *unchecked);

/* The prompt pass of slot s ends this step, its last row's logits in `logits`: every request
 * waiting to share it takes a copy of the slot's rows (and recurrent state: nothing else ran
 * in the slot yet) and samples its first token from the same logits, with its own sampler, as
 * if it had run the prompt itself. One whose copy cannot be made runs the prompt after all. */
static void fork_waiting(rlx_engine *e, uint32_t s, const float *logits) {
    const engine_slot *from = &e->slots[s];
    for (uint32_t w = 0; w < e->n_slots; w++) {
        engine_slot *sl = &e->slots[w];
        if (!sl->req || sl->state != SLOT_WAIT || sl->req->fork_of != from->req->id)
            continue;
        if (!copy_prefix(e, s, w, from->n_valid)) {
            sl->state = SLOT_PROMPT;
            continue;
        }
        pthread_mutex_lock(&e->mu);
        e->stats.cached_tokens += from->n_valid - sl->req->n_cached;
        sl->req->n_cached = from->n_valid;
        pthread_mutex_unlock(&e->mu);
        sl->n_valid = from->n_valid;
        sl->state = SLOT_SAMPLE;
        emit(e, w, logits, NULL);
    }
}

/* Ends the request of slot s: its event, then the slot is free (its rows stay, for a later
 * prompt with the same prefix). */
static void finish_slot(rlx_engine *e, uint32_t s, uint32_t finish, rlx_status status, const char *message) {
    engine_slot *sl = &e->slots[s];
    engine_req *r = sl->req;
    /* freed first, so whoever the event wakes sees the slot free (only this thread admits) */
    pthread_mutex_lock(&e->mu);
    sl->req = NULL;
    sl->last_id = r->id;
    sl->last_used = ++e->clock;
    e->n_running--;
    pthread_mutex_unlock(&e->mu);
    /* requests waiting for r's prompt pass, which will not end now, run their own */
    for (uint32_t w = 0; w < e->n_slots; w++)
        if (e->slots[w].req && e->slots[w].state == SLOT_WAIT && e->slots[w].req->fork_of == r->id)
            e->slots[w].state = SLOT_PROMPT;
    deliver_done(e, r, finish, status, message);
    req_free(r);
}

static int is_stop(const engine_req *r, int32_t token) {
    for (uint32_t i = 0; i < r->r.n_stop_ids; i++)
        if (r->stop_ids[i] == token)
            return 1;
    return 0;
}

/* log-softmax of the raw logits at token and the top alternatives, best first */
static float log_probs(rlx_engine *e, const float *logits, int32_t token, uint32_t n_top, int32_t *top_ids,
                       float *top_lp) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < e->vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < e->vocab; i++)
        sum += exp((double)logits[i] - mx);
    const float lse = mx + (float)log(sum);
    for (uint32_t k = 0; k < n_top; k++)
        top_ids[k] = -1;
    for (int64_t i = 0; i < e->vocab && n_top; i++) {
        if (top_ids[n_top - 1] >= 0 && logits[i] <= logits[top_ids[n_top - 1]])
            continue;
        uint32_t k = n_top - 1;
        while (k > 0 && (top_ids[k - 1] < 0 || logits[i] > logits[top_ids[k - 1]])) {
            top_ids[k] = top_ids[k - 1];
            k--;
        }
        top_ids[k] = (int32_t)i;
    }
    for (uint32_t k = 0; k < n_top; k++)
        top_lp[k] = top_ids[k] >= 0 ? logits[top_ids[k]] - lse : -INFINITY;
    return logits[token] - lse;
}

/* The TOKEN event of r's next token, drawn from the logits row; returns what the callback does.
 * *cancelled says whether the request was cancelled (or the engine is closing) by then. */
static int report_token(rlx_engine *e, engine_req *r, int32_t token, const float *logits, int *cancelled) {
    const double now = rlx__now_seconds();
    if (r->t_first == 0)
        r->t_first = now;
    r->t_last = now;
    int32_t top_ids[RLX_ENGINE_MAX_TOP_LOGPROBS];
    float top_lp[RLX_ENGINE_MAX_TOP_LOGPROBS];
    rlx_engine_event ev = {.kind = RLX_ENGINE_TOKEN, .id = r->id, .token = token};
    if (r->r.logprobs || r->r.top_logprobs) {
        ev.logprob = log_probs(e, logits, token, r->r.top_logprobs, top_ids, top_lp);
        ev.n_top = r->r.top_logprobs;
        ev.top_ids = top_ids;
        ev.top_logprobs = top_lp;
    }
    pthread_mutex_lock(&e->mu);
    r->n_generated++; /* under mu: rlx_engine_slot_info_of reads it */
    e->stats.generated_tokens++;
    *cancelled = r->cancelled || e->closing;
    pthread_mutex_unlock(&e->mu);
    return r->r.on_event(r->r.ctx, &ev);
}

/* Samples the next token of slot s from its logits row and reports it; ends the request when
 * it should end (a cancel is taken at the start of the next step). With a non-NULL `unchecked`
 * the row is checked to be finite first: one that is not ends the request with an error,
 * followed by `unchecked` (what is known of where the value came from); the other slots go on,
 * since rows of different slots do not mix. */
static void emit(rlx_engine *e, uint32_t s, const float *logits, const char *unchecked) {
    engine_slot *sl = &e->slots[s];
    engine_req *r = sl->req;
    rlx_status rc = unchecked ? rlx__logits_check(logits, e->vocab, sl->n_valid - 1) : RLX_OK;
    if (rc != RLX_OK) {
        char message[1024];
        snprintf(message, sizeof message, "%s%s", rlx_last_error(), unchecked);
        sl->n_valid = 0; /* its cache rows are not to be reused */
        finish_slot(e, s, RLX_FINISH_ERROR, rc, message);
        return;
    }
    if (sl->state == SLOT_SAMPLE)
        fork_waiting(e, s, logits);
    int32_t token = rlx_sampler_sample(r->sampler, logits);
    rc = token < 0 ? RLX_E_INVALID /* a grammar that allows nothing here: its error is set */
                   : rlx_sampler_accept(r->sampler, token);
    if (rc != RLX_OK) {
        finish_slot(e, s, RLX_FINISH_ERROR, rc, rlx_last_error());
        return;
    }
    int cancelled;
    const int stop = report_token(e, r, token, logits, &cancelled);
    if (is_stop(r, token))
        finish_slot(e, s, RLX_FINISH_EOS, RLX_OK, NULL);
    else if (stop)
        finish_slot(e, s, RLX_FINISH_STOP, RLX_OK, NULL);
    else if (r->r.max_tokens && r->n_generated >= r->r.max_tokens)
        finish_slot(e, s, RLX_FINISH_LENGTH, RLX_OK, NULL);
    else if (sl->n_valid >= e->capacity)
        finish_slot(e, s, RLX_FINISH_CONTEXT, RLX_OK, NULL);
    else {
        sl->state = SLOT_DECODE;
        sl->pending = token;
    }
}

/* Gathers the rows of the next step of group g's slots (every slot with g < 0) into e->ids,
 * e->pos and e->seq: one decode row per decoding slot first, so their pace does not depend on
 * prompts, then prompt chunks, oldest request first, within the step's budget. The slots whose
 * logits the step returns go to out_slot, their rows to e->out_rows (a step of prompt rows
 * alone names its last row, whose logits go unused). The rows count as held from here: the
 * caller forgets them when the step fails. Returns the number of rows. */
static uint32_t gather_rows(rlx_engine *e, int g, uint32_t *out_slot, uint32_t *n_out_p) {
    uint32_t n = 0, n_out = 0;
    for (uint32_t s = 0; s < e->n_slots; s++) {
        engine_slot *sl = &e->slots[s];
        if (!sl->req || sl->state != SLOT_DECODE || (g >= 0 && group_of(e, s) != (uint32_t)g))
            continue;
        e->ids[n] = sl->pending;
        e->pos[n] = (int32_t)sl->n_valid;
        e->seq[n] = (int32_t)s;
        e->out_rows[n_out] = (int32_t)n;
        out_slot[n_out++] = s;
        sl->tokens[sl->n_valid++] = sl->pending;
        n++;
    }
    for (;;) {
        int pick = -1;
        for (uint32_t s = 0; s < e->n_slots; s++) {
            engine_slot *sl = &e->slots[s];
            if (sl->req && sl->state == SLOT_PROMPT && (g < 0 || group_of(e, s) == (uint32_t)g) &&
                (pick < 0 || sl->req->id < e->slots[pick].req->id))
                pick = (int)s;
        }
        if (pick < 0 || n == e->step_tokens)
            break;
        engine_slot *sl = &e->slots[pick];
        uint32_t room = e->step_tokens - n, left = sl->req->r.n_prompt - sl->n_valid, take = left < room ? left : room;
        for (uint32_t i = 0; i < take; i++) {
            e->ids[n] = sl->req->prompt[sl->n_valid + i];
            e->pos[n] = (int32_t)(sl->n_valid + i);
            e->seq[n] = pick;
            n++;
        }
        if (take == left) {
            e->out_rows[n_out] = (int32_t)(n - 1);
            out_slot[n_out++] = (uint32_t)pick;
        }
        memcpy(sl->tokens + sl->n_valid, sl->req->prompt + sl->n_valid, take * sizeof *sl->tokens);
        sl->n_valid += take;
        if (take < left)
            break;
        sl->state = SLOT_SAMPLE;
    }
    if (n && !n_out)
        e->out_rows[0] = (int32_t)(n - 1);
    *n_out_p = n_out;
    return n;
}

/* A step of the running slots of group g (all with g < 0) failed: every request in them ends
 * with the error, and what the step wrote is not trusted. */
static void fail_slots(rlx_engine *e, int g, rlx_status rc, const char *why) {
    char message[512];
    snprintf(message, sizeof message, "%s", why);
    for (uint32_t s = 0; s < e->n_slots; s++) {
        engine_slot *sl = &e->slots[s];
        if (sl->req && (g < 0 || group_of(e, s) == (uint32_t)g)) {
            sl->n_valid = 0;
            finish_slot(e, s, RLX_FINISH_ERROR, rc, message);
        }
    }
}

static void count_step(rlx_engine *e, double seconds) {
    pthread_mutex_lock(&e->mu);
    e->stats.steps++;
    e->stats.busy_seconds += seconds;
    pthread_mutex_unlock(&e->mu);
}

/* A step's logits hold a NaN or an infinity: keeps a copy of its rows in *kept (*logits points
 * there after) and runs the step again node by node to name the node that first wrote such a
 * value. Returns the text emit adds to a bad row's error: that node, or the hint. */
static const char *trace_nonfinite(rlx_engine *e, const float **logits, uint32_t n_out, float **kept, char *trace,
                                   size_t len) {
    const size_t bytes = (size_t)n_out * (size_t)e->vocab * sizeof **logits;
    if (!(*kept = rlx__malloc(bytes)))
        return RLX__FINITE_HINT;
    memcpy(*kept, *logits, bytes);
    *logits = *kept;
    const rlx_status rc = rlx__batch_trace_nonfinite(e->batch);
    if (rc == RLX_OK)
        snprintf(trace, len,
                 "; run again node by node the step gives finite values, so the fused spans of a backend "
                 "produced it");
    else
        snprintf(trace, len,
                 rc == RLX_E_RANGE ? "; the first node to write a NaN or an infinity: %s"
                                   : "; tracing it node by node failed: %s",
                 rlx_last_error());
    return trace;
}

/* One forward pass over every running slot; 0 when there was nothing to run. */
static int step(rlx_engine *e) {
    uint32_t n_out;
    const uint32_t n = gather_rows(e, -1, e->out_slot, &n_out);
    if (n == 0)
        return 0;
    const double t0 = rlx__now_seconds();
    const float *logits;
    rlx_status rc = rlx__batch_run(e->batch, e->ids, e->pos, e->seq, n, e->out_rows, n_out ? n_out : 1, &logits);
    if (rc != RLX_OK) {
        fail_slots(e, -1, rc, rlx_last_error());
        return 1;
    }
    float *kept = NULL;
    char trace[512];
    const char *unchecked = NULL;
    for (uint32_t k = 0; k < n_out && !unchecked; k++)
        if (rlx__logits_check(logits + (size_t)k * (size_t)e->vocab, e->vocab, 0) != RLX_OK)
            unchecked = trace_nonfinite(e, &logits, n_out, &kept, trace, sizeof trace);
    for (uint32_t k = 0; k < n_out; k++)
        emit(e, e->out_slot[k], logits + (size_t)k * (size_t)e->vocab, unchecked);
    free(kept);
    count_step(e, rlx__now_seconds() - t0);
    return 1;
}

/* Over a pipeline: submits the next step of every group that has none in flight (not once the
 * engine closes), then takes the oldest step in flight back and samples its logits. 0 when
 * nothing was in flight. */
static int pipe_step(rlx_engine *e, int closing) {
    for (uint32_t g = 0; g < e->n_groups && !closing; g++) {
        engine_group *gr = &e->groups[g];
        if (gr->busy)
            continue;
        const uint32_t n = gather_rows(e, (int)g, gr->out_slot, &gr->n_out);
        if (n == 0)
            continue;
        const rlx_driver_rows rows = {.ids = e->ids,
                                      .positions = e->pos,
                                      .slots = e->seq,
                                      .n = n,
                                      .out_rows = e->out_rows,
                                      .n_out = gr->n_out ? gr->n_out : 1};
        rlx_status rc = rlx_driver_submit(e->pipe, &rows, &gr->ticket);
        if (rc != RLX_OK) {
            fail_slots(e, (int)g, rc, rlx_last_error());
            continue;
        }
        if (e->n_in_flight == 0)
            e->busy_since = rlx__now_seconds();
        gr->busy = 1;
        e->in_flight[e->n_in_flight++] = g;
    }
    if (e->n_in_flight == 0)
        return 0;
    const uint32_t g = e->in_flight[0];
    memmove(e->in_flight, e->in_flight + 1, --e->n_in_flight * sizeof *e->in_flight);
    uint64_t ticket = 0;
    const float *logits = NULL;
    rlx_status rc = rlx_driver_wait(e->pipe, &ticket, &logits);
    if (g == COPY_IN_FLIGHT) {
        /* a failed copy fails the steps after it, which end their requests */
        if (rc == RLX_OK)
            e->done_ticket = ticket;
        return 1;
    }
    engine_group *gr = &e->groups[g];
    gr->busy = 0;
    if (rc == RLX_OK)
        e->done_ticket = ticket;
    if (rc == RLX_OK && ticket != gr->ticket)
        rc = rlx_error(RLX_E_INTERNAL, "the pipeline answered step %llu, expected step %llu",
                       (unsigned long long)ticket, (unsigned long long)gr->ticket);
    if (rc != RLX_OK) {
        fail_slots(e, (int)g, rc, rlx_last_error());
    } else {
        for (uint32_t k = 0; k < gr->n_out; k++)
            emit(e, gr->out_slot[k], logits + (size_t)k * (size_t)e->vocab, RLX__FINITE_HINT);
    }
    pthread_mutex_lock(&e->mu);
    e->stats.steps++;
    if (e->n_in_flight == 0)
        e->stats.busy_seconds += rlx__now_seconds() - e->busy_since;
    pthread_mutex_unlock(&e->mu);
    return 1;
}

/* The oldest queued request, now running; called with mu held. */
static engine_req *pop_queued(rlx_engine *e) {
    engine_req *r = e->queue_head;
    e->queue_head = r->next;
    if (!e->queue_head)
        e->queue_tail = NULL;
    r->next = NULL;
    e->n_queued--;
    e->n_running++;
    e->stats.queued = e->n_queued;
    return r;
}

/* Admits the oldest queued request with the choices that share its prompt (queued right after
 * it by rlx_engine_submit_choices), all at once so they can share its prompt pass; 0 when there
 * is none or too few slots are open. Called by the worker with mu held. */
static int admit_next(rlx_engine *e) {
    uint32_t n = 0;
    for (const engine_req *r = e->queue_head; r && (n == 0 || r->fork_of == e->queue_head->id); r = r->next)
        n++;
    if (n == 0 || e->n_running + n > e->n_slots || open_slots(e) < n)
        return 0;
    for (uint32_t i = 0; i < n; i++)
        admit(e, pop_queued(e));
    return 1;
}

// ---- lm mode ----

typedef struct lm_run {
    rlx_engine *e;
    engine_req *r;
    int32_t *held; /* the slot's tokens: what the lm holds, for the next request's prefix */
    uint32_t n_held;
} lm_run;

static int lm_token(void *ctx, int32_t token, const float *logits) {
    lm_run *run = ctx;
    rlx_engine *e = run->e;
    engine_req *r = run->r;
    if (run->n_held < e->capacity)
        run->held[run->n_held++] = token;
    int cancelled;
    const int stop = report_token(e, r, token, logits, &cancelled);
    if (cancelled) {
        r->cancelled = 1; /* read again by this thread alone */
        return 1;
    }
    return stop;
}

/* Runs request r to its end on the lm: the prompt after the prefix the lm already holds (the
 * whole prompt with a speculator, which must read it all), then generation with the request's
 * stop ids as the lm's end-of-sequence ids. */
static void run_on_lm(rlx_engine *e, engine_req *r) {
    engine_slot *sl = &e->slots[0];
    rlx_lm lm = e->lm;
    lm.eos_ids = r->stop_ids;
    lm.n_eos = r->r.n_stop_ids;
    uint32_t keep = e->spec ? 0 : common_prefix(sl->tokens, sl->n_valid, r->prompt, r->r.n_prompt - 1);
    if (keep > lm.length(lm.self))
        keep = lm.length(lm.self);
    r->t_admit = rlx__now_seconds();
    pthread_mutex_lock(&e->mu);
    r->n_cached = keep;
    e->stats.cached_tokens += keep;
    e->stats.prompt_tokens += r->r.n_prompt;
    pthread_mutex_unlock(&e->mu);
    rlx_status rc = lm.truncate(lm.self, keep);
    const uint32_t room = e->capacity - keep;
    const uint32_t max_new = r->r.max_tokens && r->r.max_tokens < room ? r->r.max_tokens : room;
    /* the penalties see the kept prefix here, the rest as the loop feeds it */
    if (rc == RLX_OK)
        rc = rlx__sampler_accept_all(r->sampler, r->prompt, keep);
    memcpy(sl->tokens + keep, r->prompt + keep, (r->r.n_prompt - keep) * sizeof *sl->tokens);
    lm_run run = {.e = e, .r = r, .held = sl->tokens, .n_held = r->r.n_prompt};
    sl->n_valid = 0; /* unknown while the lm runs */
    uint32_t stop = RLX_GEN_STOP_NONE;
    if (rc == RLX_OK && e->spec) {
        rlx_spec_stats st;
        rc = rlx_spec_generate(&lm, e->spec, e->draft_tokens, r->sampler, r->prompt, r->r.n_prompt, max_new, lm_token,
                               &run, &st);
        stop = st.gen.stop;
    } else if (rc == RLX_OK) {
        rlx_gen_stats st;
        rc = rlx_generate(&lm, r->sampler, r->prompt + keep, r->r.n_prompt - keep, max_new, lm_token, &run, &st);
        stop = st.stop;
    }
    /* the lm holds the prompt and every generated token but the last */
    const uint32_t held = lm.length(lm.self);
    sl->n_valid = rc == RLX_OK && held <= run.n_held ? held : 0;
    uint32_t finish = RLX_FINISH_ERROR;
    if (rc == RLX_OK)
        finish = stop == RLX_GEN_STOP_EOS        ? RLX_FINISH_EOS
                 : stop == RLX_GEN_STOP_CONTEXT  ? RLX_FINISH_CONTEXT
                 : stop == RLX_GEN_STOP_CALLBACK ? (r->cancelled ? RLX_FINISH_CANCELLED : RLX_FINISH_STOP)
                 : r->r.max_tokens && r->n_generated >= r->r.max_tokens ? RLX_FINISH_LENGTH
                                                                        : RLX_FINISH_CONTEXT;
    pthread_mutex_lock(&e->mu);
    sl->req = NULL;
    sl->last_id = r->id;
    sl->n_held = sl->n_valid;
    e->n_running--;
    pthread_mutex_unlock(&e->mu);
    deliver_done(e, r, finish, rc, rc == RLX_OK ? NULL : rlx_last_error());
    req_free(r);
}

static void *engine_main(void *arg) {
    rlx_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        /* cancellations first: their slots are free for this step's admissions */
        engine_req *cancelled = NULL;
        for (engine_req **at = &e->queue_head; *at;) {
            engine_req *r = *at;
            if (r->cancelled || e->closing) {
                *at = r->next;
                r->next = cancelled;
                cancelled = r;
                e->n_queued--;
            } else
                at = &r->next;
        }
        e->queue_tail = NULL;
        for (engine_req *r = e->queue_head; r; r = r->next)
            e->queue_tail = r;
        /* a slot whose step is in flight ends when the step is back */
        for (uint32_t s = 0; s < e->n_slots; s++)
            e->slots[s].cancel = e->slots[s].req && (e->slots[s].req->cancelled || e->closing) &&
                                 !(e->pipe && e->groups[group_of(e, s)].busy);
        pthread_mutex_unlock(&e->mu);
        for (engine_req *r = cancelled, *next; r; r = next) {
            next = r->next;
            deliver_done(e, r, RLX_FINISH_CANCELLED, RLX_OK, NULL);
            req_free(r);
        }
        /* a slot cut short keeps the rows it computed, for a later prompt with that prefix */
        for (uint32_t s = 0; s < e->n_slots; s++)
            if (e->slots[s].cancel)
                finish_slot(e, s, RLX_FINISH_CANCELLED, RLX_OK, NULL);
        pthread_mutex_lock(&e->mu);
        /* one turn of a task per step; every task's last call when closing */
        run_task(e);
        while (e->closing && e->task_head)
            run_task(e);
        if (e->closing && e->n_in_flight) {
            /* the steps in flight come back (or fail) within the driver's deadlines */
            pthread_mutex_unlock(&e->mu);
            pipe_step(e, 1);
            continue;
        }
        if (e->closing) {
            pthread_cond_broadcast(&e->idle);
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
        if (e->over_lm && e->queue_head) {
            engine_req *r = pop_queued(e);
            e->slots[0].req = r; /* where rlx_engine_cancel finds it */
            pthread_mutex_unlock(&e->mu);
            run_on_lm(e, r);
            continue;
        }
        while (admit_next(e))
            ;
        uint64_t used = 0;
        for (uint32_t s = 0; s < e->n_slots; s++) {
            used += e->slots[s].req ? e->slots[s].n_valid : 0;
            e->slots[s].n_held = e->slots[s].n_valid;
        }
        e->stats.kv_positions_used = used;
        pthread_mutex_unlock(&e->mu);
        if (e->pipe ? pipe_step(e, 0) : !e->over_lm && step(e))
            continue;
        pthread_mutex_lock(&e->mu);
        pthread_cond_broadcast(&e->idle);
        if (!e->closing && !e->queue_head && !e->task_head) {
            struct timespec until = rlx__deadline_in(ENGINE_IDLE_MS);
            pthread_cond_timedwait(&e->wake, &e->mu, &until);
        }
        pthread_mutex_unlock(&e->mu);
    }
}
