/* Engine tasks (rlx_engine_task_submit) among generation requests, under load:
 * - threads submit embedding tasks (a session of their own on the engine's backend, a chunk of
 *   the input a turn, its hidden rows mean-pooled) and greedy requests at once, cancelling some
 *   requests and abandoning some tasks mid-way: every task gets exactly one last call, a
 *   finished one holds the bits of its input's embedding computed alone before the engine ran,
 *   every request exactly one DONE with the tokens of its prompt run alone on the engine (or
 *   their start, when cancelled); the same over an lm, where tasks run between requests;
 * - destroying the engine with a full task queue behind a held request gives every task one
 *   cancelled call (fn(ctx, 1)) and every request one cancelled DONE, and submits in between
 *   are refused, first for the queue's bound, then for the shutdown;
 * - a drain whose timeout passes ends the tasks that never finish with one cancelled call each,
 *   the others finished or cancelled, never both, and refuses new tasks.
 * Every task call and every event runs on the engine's worker, never two at once. Every wait has
 * a deadline. cpu-blas in its batch-invariant mode (RLX_BACKEND=ref: the reference kernels), so a
 * row's bits do not depend on its batch or chunk; the model is dense-tied-f32-s1. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

#define WAIT_MS 60000 /* the longest any single wait may take (ASan beside other work is slow) */
#define CHUNK 4       /* input positions an embedding task runs a turn */
#define MAX_INPUT 14
#define N_INPUTS 6
#define N_PROMPTS 4
#define MAX_PROMPT 12
#define NEW_TOKENS 6
#define MAX_HIDDEN 256

static rlx_model *model;
static rlx_backend *backend;
static rlx_plugin_handle *plugin;
static int64_t vocab, hidden;

static int32_t inputs[N_INPUTS][MAX_INPUT];
static uint32_t input_len[N_INPUTS];
static float want_embedding[N_INPUTS][MAX_HIDDEN]; /* of each input, computed alone */
static int32_t prompts[N_PROMPTS][MAX_PROMPT];
static uint32_t prompt_len[N_PROMPTS];
static int32_t want_tokens[N_PROMPTS][NEW_TOKENS]; /* of each prompt, run alone on the engine */

// ---- the worker: one thread, one call at a time ----

static pthread_mutex_t worker_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_t worker;
static int worker_known;
static atomic_int inside, worker_errors;

/* Entered by every task call and event: the engine's worker, one call at a time. */
static void enter(void) {
    if (atomic_fetch_add(&inside, 1) != 0)
        atomic_fetch_add(&worker_errors, 1);
    pthread_mutex_lock(&worker_mu);
    if (!worker_known)
        worker = pthread_self(), worker_known = 1;
    else if (!pthread_equal(worker, pthread_self()))
        atomic_fetch_add(&worker_errors, 1);
    pthread_mutex_unlock(&worker_mu);
}

static void leave(void) { atomic_fetch_sub(&inside, 1); }

/* A new engine's worker is another thread. */
static void worker_forget(void) {
    pthread_mutex_lock(&worker_mu);
    worker_known = 0;
    pthread_mutex_unlock(&worker_mu);
}

static int on_event(void *ctx, const rlx_engine_event *ev) {
    enter();
    const int stop = tu_on_event(ctx, ev);
    leave();
    return stop;
}

// ---- embedding tasks ----

typedef struct task {
    int input; /* into inputs; -1: a task that never finishes on its own */
    /* the worker's */
    rlx_session *session;
    uint32_t at;
    double acc[MAX_HIDDEN];
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int turns;            /* calls with cancelled = 0 */
    int last_calls;       /* calls that ended it (returned 0, or cancelled) */
    int calls_after_last; /* the engine's, after it forgot the task: never */
    int cancelled;        /* its last call was fn(ctx, 1) */
    int abandoned;        /* set by its submitter: end at the next turn */
    int finished;         /* every position ran: result holds the embedding */
    rlx_status status;
    char why[256];
    float result[MAX_HIDDEN];
} task;

static void task_init(task *t, int input) {
    memset(t, 0, sizeof *t);
    t->input = input;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
}

static void task_destroy(task *t) {
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

/* A whole-model session that also returns the final hidden rows, on the test's backend. */
static rlx_status embedder_create(rlx_session **out) {
    const rlx_block_spec spec = {.size = sizeof spec,
                                 .layer_end = (uint32_t)rlx_model_config_of(model)->num_hidden_layers,
                                 .embed_input = 1,
                                 .produce_logits = 1,
                                 .emit_hidden = 1};
    const rlx_session_options o = {
        .size = sizeof o, .kv_capacity = MAX_INPUT, .backends = &backend, .n_backends = backend ? 1 : 0};
    return rlx_session_create(model, &spec, &o, out);
}

/* Adds the hidden rows of positions [at, at + n) of the input to acc, through s. */
static rlx_status embed_rows(rlx_session *s, const int32_t *ids, uint32_t n, double *acc) {
    const float *logits;
    rlx_status rc = rlx_session_forward(s, ids, n, 0, &logits);
    if (rc != RLX_OK)
        return rc;
    const float *rows = rlx_session_hidden(s);
    for (uint32_t r = 0; r < n; r++)
        for (int64_t k = 0; k < hidden; k++)
            acc[k] += rows[(size_t)r * (size_t)hidden + (size_t)k];
    return RLX_OK;
}

/* One chunk of the task's input; 1 while positions are left. The session is made at the first
 * turn, on the worker, as a server's embedder would use it. */
static int embed_turn(task *t, rlx_status *rc) {
    const uint32_t len = input_len[t->input], n = len - t->at < CHUNK ? len - t->at : CHUNK;
    if (!t->session && (*rc = embedder_create(&t->session)) != RLX_OK)
        return 0;
    if ((*rc = embed_rows(t->session, inputs[t->input] + t->at, n, t->acc)) != RLX_OK)
        return 0;
    t->at += n;
    if (t->at < len)
        return 1;
    for (int64_t k = 0; k < hidden; k++)
        t->result[k] = (float)(t->acc[k] / len);
    return 0;
}

static int task_turn(void *ctx, int cancelled) {
    task *t = ctx;
    enter();
    pthread_mutex_lock(&t->mu);
    const int over = t->last_calls > 0, abandoned = t->abandoned;
    if (over)
        t->calls_after_last++;
    pthread_mutex_unlock(&t->mu);
    if (over) {
        leave();
        return 0;
    }
    rlx_status rc = RLX_OK;
    int more = 0;
    if (!cancelled && !abandoned)
        more = t->input < 0 ? 1 : embed_turn(t, &rc);
    if (!more) {
        rlx_session_destroy(t->session);
        t->session = NULL;
    }
    pthread_mutex_lock(&t->mu);
    t->turns += !cancelled;
    if (!more) {
        t->last_calls++;
        t->cancelled = cancelled;
        t->finished = !cancelled && !abandoned && rc == RLX_OK;
        t->status = rc;
        snprintf(t->why, sizeof t->why, "%s", rc == RLX_OK ? "" : rlx_last_error());
    }
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    leave();
    return more;
}

static void task_abandon(task *t) {
    pthread_mutex_lock(&t->mu);
    t->abandoned = 1;
    pthread_mutex_unlock(&t->mu);
}

/* Waits up to ms for the task's last call; whether it came. */
static int task_wait_last(task *t, long ms) {
    const struct timespec until = tu_after_ms(ms);
    pthread_mutex_lock(&t->mu);
    while (!t->last_calls)
        if (pthread_cond_timedwait(&t->cv, &t->mu, &until) != 0)
            break;
    const int over = t->last_calls > 0;
    pthread_mutex_unlock(&t->mu);
    return over;
}

/* One last call (within ms), nothing after it, and what it computed, if it finished, the input's
 * embedding alone to the bit. `may_cancel`: the engine may have ended it; `may_abandon`: its
 * submitter may. */
static void expect_task(const char *what, int i, task *t, long ms, int may_cancel, int may_abandon) {
    if (!task_wait_last(t, ms))
        fail_msg("%s: task %d got no last call within %ld ms (%d turns)", what, i, ms, t->turns);
    pthread_mutex_lock(&t->mu);
    const int last_calls = t->last_calls, after = t->calls_after_last, cancelled = t->cancelled,
              abandoned = t->abandoned, finished = t->finished;
    const rlx_status status = t->status;
    pthread_mutex_unlock(&t->mu);
    if (after || last_calls != 1)
        fail_msg("%s: task %d: %d last calls, %d calls after them", what, i, last_calls, after);
    if (status != RLX_OK)
        fail_msg("%s: task %d failed: %s", what, i, t->why);
    if (cancelled && !may_cancel)
        fail_msg("%s: task %d was cancelled by the engine", what, i);
    if (!finished && !cancelled && !(may_abandon && abandoned))
        fail_msg("%s: task %d ended unfinished, neither cancelled nor abandoned", what, i);
    /* the result was written before the last call took the lock */
    if (finished && memcmp(t->result, want_embedding[t->input], (size_t)hidden * sizeof(float)) != 0)
        fail_msg("%s: task %d: the embedding of input %d differs from the one computed alone", what, i, t->input);
}

/* Submits t, trying again while the task queue is full; RLX_OK, or the status that refused it. */
static rlx_status submit_task(rlx_engine *e, task *t) {
    const double give_up = tu_now_s() + WAIT_MS / 1000.0;
    rlx_status rc;
    while ((rc = rlx_engine_task_submit(e, task_turn, t)) == RLX_E_BUSY && strstr(rlx_last_error(), "tasks wait") &&
           tu_now_s() < give_up)
        tu_sleep_ms(2);
    return rc;
}

// ---- requests ----

static rlx_request greedy_request(int prompt, tu_events *r) {
    rlx_request q = {.size = sizeof q,
                     .prompt = prompts[prompt],
                     .n_prompt = prompt_len[prompt],
                     .max_tokens = NEW_TOKENS,
                     .on_event = on_event,
                     .ctx = r};
    q.sampler = rlx_sampler_params_default();
    q.sampler.greedy = 1;
    /* no stop ids: a random model hits its EOS by chance, which would shorten the comparison */
    static const int32_t none = -1;
    q.stop_ids = &none;
    q.n_stop_ids = 1;
    return q;
}

/* Submits a request, trying again while the queue is full; its id. */
static uint64_t submit_request(rlx_engine *e, int prompt, tu_events *r) {
    const rlx_request q = greedy_request(prompt, r);
    const double give_up = tu_now_s() + WAIT_MS / 1000.0;
    uint64_t id = 0;
    rlx_status rc;
    while ((rc = rlx_engine_submit(e, &q, &id)) == RLX_E_BUSY && tu_now_s() < give_up)
        tu_sleep_ms(2);
    assert_ok(rc);
    tu_events_submitted(r, e, id);
    return id;
}

/* One DONE and nothing after it; the prompt's tokens alone, all of them unless it may have been
 * cancelled, when it may end early. */
static void expect_request(const char *what, int i, tu_events *r, int prompt, int may_cancel) {
    if (!tu_wait_done(r, WAIT_MS))
        fail_msg("%s: request %d got no DONE within %d ms (%u tokens)", what, i, WAIT_MS, tu_tokens_of(r));
    pthread_mutex_lock(&r->mu);
    const uint32_t n = r->n, n_done = r->n_done, finish = r->done.finish;
    const int after = r->events_after_done + r->bad_events;
    pthread_mutex_unlock(&r->mu);
    if (n_done != 1 || after)
        fail_msg("%s: request %d: %u DONE events, %d events after or beyond", what, i, n_done, after);
    if (finish == RLX_FINISH_CANCELLED ? !may_cancel || n > NEW_TOKENS : finish != RLX_FINISH_LENGTH || n != NEW_TOKENS)
        fail_msg("%s: request %d ended with finish %u after %u tokens: %s", what, i, finish, n, r->message);
    for (uint32_t k = 0; k < n; k++)
        if (r->tokens[k] != want_tokens[prompt][k])
            fail_msg("%s: request %d token %u: %d, alone %d", what, i, k, r->tokens[k], want_tokens[prompt][k]);
}

// ---- engines ----

static rlx_engine *new_engine(uint32_t n_slots, uint32_t queue) {
    rlx_engine_options o = rlx_engine_options_default();
    o.n_slots = n_slots;
    o.slot_positions = 64;
    o.max_queue = queue;
    o.step_tokens = 16;
    o.backends = &backend;
    o.n_backends = backend ? 1 : 0;
    rlx_engine *e;
    worker_forget();
    assert_ok(rlx_engine_create(model, &o, &e));
    return e;
}

/* An engine over an lm: a whole-model session on the test's backend, requests taking turns. */
static rlx_engine *new_lm_engine(rlx_session **s, uint32_t queue) {
    const rlx_block_spec spec = {.size = sizeof spec,
                                 .layer_end = (uint32_t)rlx_model_config_of(model)->num_hidden_layers,
                                 .embed_input = 1,
                                 .produce_logits = 1};
    const rlx_session_options so = {
        .size = sizeof so, .kv_capacity = 64, .backends = &backend, .n_backends = backend ? 1 : 0};
    assert_ok(rlx_session_create(model, &spec, &so, s));
    rlx_lm lm;
    assert_ok(rlx_session_lm(*s, &lm));
    rlx_engine_options o = rlx_engine_options_default();
    o.max_queue = queue;
    rlx_engine *e;
    worker_forget();
    assert_ok(rlx_engine_create_lm(&lm, NULL, 0, &o, &e));
    return e;
}

// ---- many threads at once ----

#define THREADS 3
#define EACH 8

typedef struct load_thread {
    rlx_engine *e;
    int index;
    tu_events r[EACH];
    task t[EACH];
} load_thread;

/* Item i of a thread: a request (every third cancelled: by the thread at once, or by its
 * callback at its second token) and a task (every fourth abandoned once the thread has
 * submitted the next item, so it may have run a turn or two). */
static void *load_run(void *p) {
    load_thread *a = p;
    for (int i = 0; i < EACH; i++) {
        const int k = a->index * EACH + i;
        tu_events *r = &a->r[i];
        if (i % 3 == 2)
            r->cancel_at = 2;
        const uint64_t id = submit_request(a->e, k % N_PROMPTS, r);
        if (i % 3 == 1)
            rlx_engine_cancel(a->e, id);
        if (submit_task(a->e, &a->t[i]) != RLX_OK) {
            fprintf(stderr, "task_submit: %s\n", rlx_last_error());
            return "a task was refused for another reason than a full queue";
        }
        if (i > 0 && (i - 1) % 4 == 3)
            task_abandon(&a->t[i - 1]);
    }
    if ((EACH - 1) % 4 == 3)
        task_abandon(&a->t[EACH - 1]);
    return NULL;
}

static void run_load(const char *what, rlx_engine *e) {
    static load_thread threads[THREADS]; /* 24 collectors of 8 KiB: not for the stack */
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        threads[t].e = e;
        threads[t].index = t;
        for (int i = 0; i < EACH; i++) {
            tu_events_init(&threads[t].r[i]);
            task_init(&threads[t].t[i], (t * EACH + i) % N_INPUTS);
        }
        assert_int_equal(pthread_create(&th[t], NULL, load_run, &threads[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) {
        void *res;
        pthread_join(th[t], &res);
        if (res)
            fail_msg("%s: thread %d: %s", what, t, (const char *)res);
    }
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < EACH; i++) {
            const int k = t * EACH + i;
            expect_request(what, k, &threads[t].r[i], k % N_PROMPTS, i % 3 != 0);
            expect_task(what, k, &threads[t].t[i], WAIT_MS, 0, i % 4 == 3);
        }
    int finished = 0, turns = 0;
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < EACH; i++)
            finished += threads[t].t[i].finished, turns += threads[t].t[i].turns;
    rlx_engine_stats st;
    rlx_engine_stats_of(e, &st);
    fprintf(stderr, "%s: %d tasks, %d finished in %d turns; %d requests, %llu cancelled\n", what, THREADS * EACH,
            finished, turns, THREADS * EACH, (unsigned long long)st.requests_cancelled);
    assert_int_equal(st.requests_done + st.requests_cancelled, THREADS * EACH);
    assert_int_equal(st.requests_failed, 0);
    rlx_engine_destroy(e);
    assert_int_equal(atomic_load(&worker_errors), 0);
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < EACH; i++) {
            /* the engine is gone: nothing called them after their last call */
            assert_int_equal(threads[t].t[i].last_calls, 1);
            assert_int_equal(threads[t].t[i].calls_after_last, 0);
            assert_int_equal(threads[t].r[i].n_done, 1);
            tu_events_destroy(&threads[t].r[i]);
            task_destroy(&threads[t].t[i]);
        }
}

static void test_tasks_and_requests_from_threads(void **state) {
    (void)state;
    run_load("batched", new_engine(3, 6));
}

static void test_tasks_and_requests_over_an_lm(void **state) {
    (void)state;
    rlx_session *s;
    rlx_engine *e = new_lm_engine(&s, 6);
    run_load("over an lm", e);
    rlx_session_destroy(s);
}

// ---- destroy and drain ----

typedef struct destroyer {
    rlx_engine *e;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} destroyer;

static void *destroy_run(void *p) {
    destroyer *d = p;
    rlx_engine_destroy(d->e);
    pthread_mutex_lock(&d->mu);
    d->done = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* One request holds the worker in its first token's callback while the task queue fills to its
 * bound (n_slots + max_queue) and another request waits; destroy, from another thread, ends
 * them all once the hold is released: no task had a turn, each gets one cancelled call. */
static void test_destroy_with_queued_tasks(void **state) {
    (void)state;
    enum { SLOTS = 2, QUEUE = 3, TASKS = SLOTS + QUEUE };
    rlx_engine *e = new_engine(SLOTS, QUEUE);
    tu_events held, queued;
    tu_events_init(&held);
    tu_events_init(&queued);
    held.hold[0] = 1;
    submit_request(e, 0, &held);
    if (!tu_wait_holding(&held, 1, WAIT_MS))
        fail_msg("the worker did not reach the hold within %d ms", WAIT_MS);
    submit_request(e, 1, &queued);
    task t[TASKS + 1];
    for (int i = 0; i <= TASKS; i++)
        task_init(&t[i], i % N_INPUTS);
    for (int i = 0; i < TASKS; i++)
        assert_ok(rlx_engine_task_submit(e, task_turn, &t[i]));
    assert_int_equal(rlx_engine_task_submit(e, task_turn, &t[TASKS]), RLX_E_BUSY);
    assert_error_mentions("5 tasks wait for the engine already");
    destroyer d = {.e = e};
    pthread_mutex_init(&d.mu, NULL);
    pthread_cond_init(&d.cv, NULL);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, destroy_run, &d), 0);
    /* the engine is closing once a submit says so; until then the queue's bound refuses it */
    const double give_up = tu_now_s() + WAIT_MS / 1000.0;
    rlx_status rc;
    while ((rc = rlx_engine_task_submit(e, task_turn, &t[TASKS])) == RLX_E_BUSY &&
           !strstr(rlx_last_error(), "shutting down") && tu_now_s() < give_up)
        tu_sleep_ms(1);
    assert_int_equal(rc, RLX_E_BUSY);
    assert_error_mentions("the engine is shutting down");
    tu_release(&held);
    const struct timespec until = tu_after_ms(WAIT_MS);
    pthread_mutex_lock(&d.mu);
    while (!d.done)
        if (pthread_cond_timedwait(&d.cv, &d.mu, &until) != 0)
            break;
    const int destroyed = d.done;
    pthread_mutex_unlock(&d.mu);
    if (!destroyed)
        fail_msg("rlx_engine_destroy did not return within %d ms of the release", WAIT_MS);
    pthread_join(th, NULL);
    pthread_mutex_destroy(&d.mu);
    pthread_cond_destroy(&d.cv);
    assert_int_equal(atomic_load(&worker_errors), 0);
    for (int i = 0; i < TASKS; i++) {
        expect_task("destroy", i, &t[i], 0, 1, 0); /* the worker is gone: no waiting */
        assert_true(t[i].cancelled);
        assert_int_equal(t[i].turns, 0);
    }
    assert_int_equal(t[TASKS].last_calls + t[TASKS].turns, 0); /* refused: never called */
    for (int i = 0; i <= TASKS; i++)
        task_destroy(&t[i]);
    assert_int_equal(held.n_done + queued.n_done, 2);
    assert_int_equal(held.done.finish, RLX_FINISH_CANCELLED);
    assert_int_equal(queued.done.finish, RLX_FINISH_CANCELLED);
    assert_int_equal(held.events_after_done + queued.events_after_done, 0);
    tu_events_destroy(&held);
    tu_events_destroy(&queued);
}

/* Tasks that never finish on their own keep a drain busy to its timeout, then get one cancelled
 * call each; embedding tasks and requests beside them finish or are cancelled (each one way);
 * after the drain, tasks are refused. */
static void test_drain_past_its_timeout_cancels_tasks(void **state) {
    (void)state;
    enum { ENDLESS = 2, EMBED = 4, REQUESTS = 3 };
    rlx_engine *e = new_engine(2, 4);
    task t[ENDLESS + EMBED];
    tu_events r[REQUESTS];
    for (int i = 0; i < REQUESTS; i++) {
        tu_events_init(&r[i]);
        submit_request(e, i % N_PROMPTS, &r[i]);
    }
    for (int i = 0; i < ENDLESS + EMBED; i++) {
        task_init(&t[i], i < ENDLESS ? -1 : i % N_INPUTS);
        assert_ok(submit_task(e, &t[i]));
    }
    rlx_engine_drain(e, 300);
    task late;
    task_init(&late, 0);
    assert_int_equal(rlx_engine_task_submit(e, task_turn, &late), RLX_E_BUSY);
    assert_error_mentions("shutting down");
    for (int i = 0; i < ENDLESS + EMBED; i++) {
        expect_task("drain", i, &t[i], WAIT_MS, 1, 0);
        if (i < ENDLESS)
            assert_true(t[i].cancelled);
    }
    for (int i = 0; i < REQUESTS; i++)
        expect_request("drain", i, &r[i], i % N_PROMPTS, 1);
    rlx_engine_destroy(e);
    assert_int_equal(atomic_load(&worker_errors), 0);
    for (int i = 0; i < ENDLESS + EMBED; i++) {
        assert_int_equal(t[i].calls_after_last, 0);
        task_destroy(&t[i]);
    }
    assert_int_equal(late.last_calls + late.turns, 0);
    task_destroy(&late);
    for (int i = 0; i < REQUESTS; i++)
        tu_events_destroy(&r[i]);
}

// ---- the references, computed alone ----

/* Each input's embedding by one forward of all of it in a session of its own (the tasks run it
 * in chunks: the batch-invariant kernels give the same rows), and each prompt's tokens from an
 * engine running that request alone. */
static void compute_references(void) {
    uint64_t rng = 2026;
    for (int i = 0; i < N_INPUTS; i++) {
        input_len[i] = 5 + (uint32_t)i * 7 % (MAX_INPUT - 4);
        for (uint32_t k = 0; k < input_len[i]; k++)
            inputs[i][k] = (int32_t)(tu_rand(&rng) % (uint64_t)vocab);
        rlx_session *s;
        assert_ok(embedder_create(&s));
        double acc[MAX_HIDDEN] = {0};
        assert_ok(embed_rows(s, inputs[i], input_len[i], acc));
        for (int64_t k = 0; k < hidden; k++)
            want_embedding[i][k] = (float)(acc[k] / input_len[i]);
        rlx_session_destroy(s);
    }
    rlx_engine *e = new_engine(1, 1);
    for (int p = 0; p < N_PROMPTS; p++) {
        prompt_len[p] = 3 + (uint32_t)p * 3;
        for (uint32_t k = 0; k < prompt_len[p]; k++)
            prompts[p][k] = (int32_t)(tu_rand(&rng) % (uint64_t)vocab);
        tu_events r;
        tu_events_init(&r);
        submit_request(e, p, &r);
        assert_true(tu_wait_done(&r, WAIT_MS));
        assert_int_equal(r.n, NEW_TOKENS);
        memcpy(want_tokens[p], r.tokens, sizeof want_tokens[p]);
        tu_events_destroy(&r);
    }
    rlx_engine_destroy(e);
}

static int setup(void **state) {
    (void)state;
    /* one thread: the worker's calls are the test's concurrency, not the kernels' */
    const rlx_backend_options bo = {.size = sizeof bo, .n_threads = 1, .extra = "batch_invariant=1"};
    if (tu_open_model(RLX_TEST_DATA "/dense-tied-f32-s1", NULL, &bo, &model, &plugin, &backend) != 0)
        return -1;
    vocab = rlx_model_config_of(model)->vocab_size;
    hidden = rlx_model_config_of(model)->hidden_size;
    if (hidden > MAX_HIDDEN) {
        fprintf(stderr, "setup: a hidden size of %lld is more than the test holds\n", (long long)hidden);
        return -1;
    }
    compute_references();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_close_model(model, plugin, backend);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tasks_and_requests_from_threads),
        cmocka_unit_test(test_tasks_and_requests_over_an_lm),
        cmocka_unit_test(test_destroy_with_queued_tasks),
        cmocka_unit_test(test_drain_past_its_timeout_cancels_tasks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
