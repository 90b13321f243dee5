/* The batched engine on small random models: each request gives the tokens a session alone
 * gives it, however many run beside it and whatever its slot; a shared prefix is reused and
 * changes nothing; a full queue refuses at once; cancel and drain end requests with one DONE
 * each; bad requests are refused naming the field; log-probabilities are the log-softmax of the
 * session's logits; n choices of one prompt each give their solo tokens from one prompt pass, and
 * are queued or refused whole; and threads submitting (requests or groups of choices) and
 * cancelling at once lose nothing.
 *
 * RLX_BACKEND names the backend (cpu-blas by default, "ref" for the reference kernels),
 * RLX_TEST_KV=f16 puts both the engine's and the sessions' caches in F16, and the model is the
 * first argument (dense-tied-f32-s1 by default). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

#define MAX_REQS 64

static const char *model_dir = RLX_TEST_DATA "/dense-tied-f32-s1";
static rlx_model *model;
static rlx_backend *backend;
static rlx_plugin_handle *plugin;
static int64_t vocab;
static uint32_t kv_dtype = RLX_DTYPE_F32;

/* Waits up to 120 s for the DONE event of a request. */
static void wait_done(tu_events *r) { assert_true(tu_wait_done(r, TU_WAIT_MS)); }

static rlx_engine *new_engine(uint32_t n_slots, uint32_t positions, uint32_t queue, uint32_t step_tokens) {
    rlx_engine_options o = rlx_engine_options_default();
    o.n_slots = n_slots;
    o.slot_positions = positions;
    o.max_queue = queue;
    o.step_tokens = step_tokens;
    o.backends = backend ? &backend : NULL;
    o.n_backends = backend ? 1 : 0;
    o.kv_dtype = kv_dtype;
    rlx_engine *e;
    assert_ok(rlx_engine_create(model, &o, &e));
    return e;
}

static rlx_request greedy_request(const int32_t *prompt, uint32_t n, uint32_t max_tokens, tu_events *r) {
    rlx_request q = {.size = sizeof q, .prompt = prompt, .n_prompt = n, .max_tokens = max_tokens, .ctx = r};
    q.sampler = rlx_sampler_params_default();
    q.sampler.greedy = 1;
    q.on_event = tu_on_event;
    /* no stop ids: random models hit their EOS by chance, which would shorten the comparison */
    static const int32_t none = -1;
    q.stop_ids = &none;
    q.n_stop_ids = 1;
    return q;
}

/* A whole-model session on the engine's backend and cache dtype. */
static rlx_session *new_session(void) {
    const rlx_model_config *c = rlx_model_config_of(model);
    rlx_block_spec spec = {
        .size = sizeof spec, .layer_end = (uint32_t)c->num_hidden_layers, .embed_input = 1, .produce_logits = 1};
    rlx_session_options o = {.size = sizeof o,
                             .kv_capacity = 128,
                             .backends = &backend,
                             .n_backends = backend ? 1 : 0,
                             .kv_dtype = kv_dtype};
    rlx_session *s;
    assert_ok(rlx_session_create(model, &spec, &o, &s));
    return s;
}

/* The greedy tokens of a session alone: the reference every engine request must equal. `gap[k]`
 * is how far step k's best logit lies above the runner-up. */
static uint32_t solo_greedy(const int32_t *prompt, uint32_t n, uint32_t max_new, int32_t *out, float *gap) {
    rlx_session *s = new_session();
    const float *l;
    uint32_t k = 0;
    assert_ok(rlx_session_forward(s, prompt, n, 0, &l));
    for (; k < max_new; k++) {
        int32_t best = 0, second = 1;
        if (l[second] > l[best])
            best = 1, second = 0;
        for (int64_t v = 2; v < vocab; v++)
            if (l[v] > l[best])
                second = best, best = (int32_t)v;
            else if (l[v] > l[second])
                second = (int32_t)v;
        out[k] = best;
        gap[k] = l[best] - l[second];
        if (k + 1 < max_new)
            assert_ok(rlx_session_forward(s, &best, 1, 0, &l));
    }
    rlx_session_destroy(s);
    return k;
}

/* Prompt i of a family sharing the first `shared` tokens. */
static uint32_t make_prompt(int i, uint32_t shared, int32_t *out) {
    uint32_t n = shared + 3 + (uint32_t)(i * 5) % 17;
    for (uint32_t k = 0; k < n; k++)
        out[k] = (int32_t)((k < shared ? k * 37 + 11 : k * 53 + (uint32_t)i * 101 + 7) % (uint32_t)vocab);
    return n;
}

/* Outside the batch-invariant mode a row's logits depend on its batch in the last bits (BLAS
 * blocks the sums by M), so where the session alone saw two logits closer than any such rounding
 * the engine may take either; the texts part there and nothing after is compared. A clear margin
 * must give the same token; in the invariant mode every token must. */
#define NEAR_TIE 1e-3f

static void expect_solo(const int32_t *prompt, uint32_t n, uint32_t max_new, const tu_events *r) {
    int32_t want[TU_MAX_TOKENS];
    float gap[TU_MAX_TOKENS];
    solo_greedy(prompt, n, max_new, want, gap);
    assert_int_equal(r->n, max_new);
    for (uint32_t k = 0; k < max_new; k++)
        if (r->tokens[k] != want[k]) {
            fprintf(stderr, "token %u: engine %d, session alone %d (its top two logits %.3g apart)\n", k, r->tokens[k],
                    want[k], (double)gap[k]);
            if (getenv("RLX_TEST_INVARIANT") || gap[k] >= NEAR_TIE)
                fail();
            break;
        }
    assert_int_equal(r->done.finish, RLX_FINISH_LENGTH);
    assert_int_equal(r->done.usage.n_generated, max_new);
    assert_int_equal(r->done.usage.n_prompt, n);
}

static void test_one_request_equals_session(void **state) {
    (void)state;
    rlx_engine *e = new_engine(2, 96, 4, 64);
    int32_t prompt[64];
    uint32_t n = make_prompt(0, 0, prompt);
    tu_events r;
    tu_events_init(&r);
    rlx_request q = greedy_request(prompt, n, 12, &r);
    uint64_t id;
    assert_ok(rlx_engine_submit(e, &q, &id));
    assert_true(id > 0);
    wait_done(&r);
    expect_solo(prompt, n, 12, &r);
    rlx_engine_destroy(e);
    assert_int_equal(r.n_done, 1);
    assert_int_equal(r.events_after_done, 0);
    tu_events_destroy(&r);
}

/* Twelve requests on four slots with a small step budget: prompts are cut into chunks and mixed
 * with other slots' decode rows, requests wait in the queue and take whichever slot is free,
 * and each still gives its solo tokens. */
static void test_concurrent_requests_equal_their_solo_runs(void **state) {
    (void)state;
    enum { N = 12 };
    rlx_engine *e = new_engine(4, 96, 16, 8);
    int32_t prompts[N][64];
    uint32_t lens[N];
    tu_events r[N];
    for (int i = 0; i < N; i++) {
        lens[i] = make_prompt(i, 0, prompts[i]);
        tu_events_init(&r[i]);
        rlx_request q = greedy_request(prompts[i], lens[i], 6 + (uint32_t)i % 5, &r[i]);
        q.logprobs = 1;
        uint64_t id;
        assert_ok(rlx_engine_submit(e, &q, &id));
    }
    for (int i = 0; i < N; i++)
        wait_done(&r[i]);
    int differ = 0;
    for (int i = 0; i < N; i++) {
        expect_solo(prompts[i], lens[i], 6 + (uint32_t)i % 5, &r[i]);
        /* batch invariance, to the bit: the log-probabilities equal those of the request alone,
         * its prompt in one pass of up to 64 rows instead of chunks of 8 beside other rows */
        tu_events alone;
        tu_events_init(&alone);
        rlx_engine *e1 = new_engine(4, 96, 16, 64);
        rlx_request q = greedy_request(prompts[i], lens[i], 6 + (uint32_t)i % 5, &alone);
        q.logprobs = 1;
        uint64_t id;
        assert_ok(rlx_engine_submit(e1, &q, &id));
        wait_done(&alone);
        rlx_engine_destroy(e1);
        for (uint32_t k = 0; k < alone.n; k++)
            if (memcmp(&alone.logprobs[k], &r[i].logprobs[k], sizeof(float)) != 0) {
                fprintf(stderr, "request %d token %u: log-probability %.9g alone, %.9g beside others\n", i, k,
                        alone.logprobs[k], r[i].logprobs[k]);
                differ++;
            }
        tu_events_destroy(&alone);
        tu_events_destroy(&r[i]);
    }
    if (getenv("RLX_TEST_INVARIANT"))
        assert_int_equal(differ, 0);
    rlx_engine_stats st;
    rlx_engine_stats_of(e, &st);
    assert_int_equal(st.requests_done, N);
    assert_true(st.steps > 0);
    assert_int_equal(st.running + st.queued, 0);
    rlx_engine_destroy(e);
}

/* Whether the model has Gated DeltaNet layers, whose recurrent state a slot cannot cut back. */
static int model_recurrent(void) {
    for (uint32_t l = 0; l < rlx_model_config_of(model)->num_hidden_layers; l++) {
        rlx_model_layer_info info = {.size = sizeof info};
        assert_ok(rlx_model_layer_info_of(model, l, &info));
        if (info.linear)
            return 1;
    }
    return 0;
}

/* A recurrent model's slot is reused only by a prompt that continues all the slot has run: no
 * shorter common prefix, no copy from a busy slot (engine.c); a continuation of a finished
 * request's prompt and fed tokens takes them all from its slot and still gives solo tokens. */
static void shared_prefix_recurrent(void) {
    rlx_engine *e = new_engine(2, 96, 4, 64);
    int32_t a[96], b[64];
    uint32_t na = make_prompt(1, 24, a), nb = make_prompt(2, 24, b);
    tu_events ra, rb, rc;
    tu_events_init(&ra);
    tu_events_init(&rb);
    tu_events_init(&rc);
    rlx_request qa = greedy_request(a, na, 20, &ra);
    uint64_t id;
    assert_ok(rlx_engine_submit(e, &qa, &id));
    tu_wait_tokens(&ra, 1, TU_WAIT_MS);
    rlx_request qb = greedy_request(b, nb, 8, &rb);
    assert_ok(rlx_engine_submit(e, &qb, &id));
    wait_done(&ra);
    wait_done(&rb);
    assert_int_equal(rb.done.usage.n_cached, 0); /* a's 24 shared rows are not copied */
    expect_solo(a, na, 20, &ra);
    expect_solo(b, nb, 8, &rb);
    /* a's prompt, its 19 fed tokens (the 20th was never run) and 3 more: a's slot holds exactly
     * the first na + 19 positions, so all of them are reused. (Asked before b's prompt again,
     * which, reusing nothing, may take either slot: the least recently used, and which of a and
     * b finished last depends on how the engine split b's prompt under load.) */
    const uint32_t held = na + 19;
    memcpy(a + na, ra.tokens, 19 * sizeof *a);
    a[held] = 5, a[held + 1] = 6, a[held + 2] = 7;
    tu_events rd;
    tu_events_init(&rd);
    rlx_request cont = greedy_request(a, held + 3, 6, &rd);
    assert_ok(rlx_engine_submit(e, &cont, &id));
    wait_done(&rd);
    assert_int_equal(rd.done.usage.n_cached, held);
    expect_solo(a, held + 3, 6, &rd);
    /* b's prompt again: its slot has run past it, so nothing is reused */
    rlx_request again = greedy_request(b, nb, 8, &rc);
    assert_ok(rlx_engine_submit(e, &again, &id));
    wait_done(&rc);
    assert_int_equal(rc.done.usage.n_cached, 0);
    expect_solo(b, nb, 8, &rc);
    rlx_engine_destroy(e);
    tu_events_destroy(&ra);
    tu_events_destroy(&rb);
    tu_events_destroy(&rc);
    tu_events_destroy(&rd);
}

/* A second request with the first one's 24-token prefix takes those rows from the cache (copied
 * from the busy slot, or kept in the freed one) and still gives its solo tokens. */
static void test_shared_prefix_is_reused(void **state) {
    (void)state;
    if (model_recurrent()) {
        shared_prefix_recurrent();
        return;
    }
    rlx_engine *e = new_engine(2, 96, 4, 64);
    int32_t a[64], b[64];
    uint32_t na = make_prompt(1, 24, a), nb = make_prompt(2, 24, b);
    tu_events ra, rb;
    tu_events_init(&ra);
    tu_events_init(&rb);
    rlx_request qa = greedy_request(a, na, 20, &ra);
    uint64_t id;
    assert_ok(rlx_engine_submit(e, &qa, &id));
    /* wait for a's first token, so its prompt rows are in its slot while it decodes */
    tu_wait_tokens(&ra, 1, TU_WAIT_MS);
    rlx_request qb = greedy_request(b, nb, 8, &rb);
    assert_ok(rlx_engine_submit(e, &qb, &id));
    wait_done(&ra);
    wait_done(&rb);
    assert_int_equal(rb.done.usage.n_cached, 24);
    expect_solo(a, na, 20, &ra);
    expect_solo(b, nb, 8, &rb);
    /* the same prompt again, after both finished: all but its last token come from the cache */
    tu_events rc;
    tu_events_init(&rc);
    rlx_request qc = greedy_request(b, nb, 8, &rc);
    assert_ok(rlx_engine_submit(e, &qc, &id));
    wait_done(&rc);
    assert_int_equal(rc.done.usage.n_cached, nb - 1);
    expect_solo(b, nb, 8, &rc);
    rlx_engine_stats st;
    rlx_engine_stats_of(e, &st);
    assert_int_equal(st.cached_tokens, 24 + nb - 1);
    rlx_engine_destroy(e);
    tu_events_destroy(&ra);
    tu_events_destroy(&rb);
    tu_events_destroy(&rc);
}

/* A full queue refuses with BUSY; cancel ends a running request and queued ones. */
static void test_full_queue_refuses_and_cancel_ends(void **state) {
    (void)state;
    rlx_engine *e = new_engine(1, 96, 2, 64);
    int32_t prompt[64];
    uint32_t n = make_prompt(3, 0, prompt);
    tu_events r[4];
    uint64_t ids[4];
    for (int i = 0; i < 4; i++)
        tu_events_init(&r[i]);
    /* one running, held in its first token's callback so that it cannot finish, and two queued
     * fill the engine: the fourth is refused */
    r[0].hold[0] = 1;
    rlx_request q = greedy_request(prompt, n, 60, &r[0]);
    assert_ok(rlx_engine_submit(e, &q, &ids[0]));
    tu_wait_tokens(&r[0], 1, TU_WAIT_MS);
    for (int i = 1; i < 3; i++) {
        q = greedy_request(prompt, n, 60, &r[i]);
        assert_ok(rlx_engine_submit(e, &q, &ids[i]));
    }
    q = greedy_request(prompt, n, 60, &r[3]);
    assert_int_equal(rlx_engine_submit(e, &q, &ids[3]), RLX_E_BUSY);
    assert_error_mentions("busy");
    for (int i = 0; i < 3; i++)
        rlx_engine_cancel(e, ids[i]);
    tu_release(&r[0]);
    for (int i = 0; i < 3; i++) {
        wait_done(&r[i]);
        assert_int_equal(r[i].done.finish, RLX_FINISH_CANCELLED);
        assert_int_equal(r[i].n_done, 1);
    }
    assert_int_equal(r[0].n, 1);
    assert_int_equal(r[1].n + r[2].n, 0);
    rlx_engine_cancel(e, 9999); /* unknown: nothing happens */
    rlx_engine_stats st;
    rlx_engine_stats_of(e, &st);
    assert_int_equal(st.requests_refused, 1);
    assert_int_equal(st.requests_cancelled, 3);
    rlx_engine_destroy(e);
    for (int i = 0; i < 4; i++)
        tu_events_destroy(&r[i]);
}

/* A callback that asks to stop ends its request with FINISH_STOP after that token; drain lets a
 * short request finish, cancels a long one at the deadline and then refuses new ones. */
static void test_stop_from_callback_and_drain(void **state) {
    (void)state;
    rlx_engine *e = new_engine(2, 96, 4, 64);
    int32_t prompt[64];
    uint32_t n = make_prompt(4, 0, prompt);
    tu_events a, b, c;
    tu_events_init(&a);
    tu_events_init(&b);
    tu_events_init(&c);
    a.stop_after = 3;
    rlx_request q = greedy_request(prompt, n, 40, &a);
    uint64_t id;
    assert_ok(rlx_engine_submit(e, &q, &id));
    wait_done(&a);
    assert_int_equal(a.n, 3);
    assert_int_equal(a.done.finish, RLX_FINISH_STOP);
    q = greedy_request(prompt, n, 4, &b);
    assert_ok(rlx_engine_submit(e, &q, &id));
    /* c, unbounded, runs beside b and then sleeps 1.5 s in its sixth token's callback: b (4
     * tokens, admitted first) is done by then, c still runs at the 1 s deadline */
    c.hold[0] = 6;
    c.hold_ms = 1500;
    q = greedy_request(prompt, n, 0, &c);
    assert_ok(rlx_engine_submit(e, &q, &id));
    uint32_t cancelled = rlx_engine_drain(e, 1000);
    wait_done(&b);
    wait_done(&c);
    assert_int_equal(b.done.finish, RLX_FINISH_LENGTH);
    assert_int_equal(c.done.finish, RLX_FINISH_CANCELLED);
    assert_int_equal(cancelled, 1);
    tu_events d;
    tu_events_init(&d);
    q = greedy_request(prompt, n, 4, &d);
    assert_int_equal(rlx_engine_submit(e, &q, &id), RLX_E_BUSY);
    assert_error_mentions("shutting down");
    rlx_engine_destroy(e);
    tu_events_destroy(&a);
    tu_events_destroy(&b);
    tu_events_destroy(&c);
    tu_events_destroy(&d);
}

static void test_bad_requests_are_refused(void **state) {
    (void)state;
    rlx_engine *e = new_engine(1, 32, 4, 64);
    int32_t prompt[40] = {0};
    tu_events r;
    tu_events_init(&r);
    uint64_t id;
    rlx_request q = greedy_request(prompt, 32, 4, &r);
    assert_int_equal(rlx_engine_submit(e, &q, &id), RLX_E_RANGE);
    assert_error_mentions("no room");
    q = greedy_request(prompt, 4, 4, &r);
    prompt[2] = (int32_t)vocab;
    assert_int_equal(rlx_engine_submit(e, &q, &id), RLX_E_RANGE);
    assert_error_mentions("prompt position 2");
    prompt[2] = 1;
    q.top_logprobs = RLX_ENGINE_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(rlx_engine_submit(e, &q, &id), RLX_E_INVALID);
    assert_error_mentions("top_logprobs");
    q = greedy_request(prompt, 4, 4, &r);
    q.sampler.greedy = 0;
    q.sampler.top_p = 2.0f;
    assert_int_equal(rlx_engine_submit(e, &q, &id), RLX_E_INVALID);
    q = greedy_request(prompt, 4, 4, &r);
    q.on_event = NULL;
    assert_int_equal(rlx_engine_submit(e, &q, &id), RLX_E_INVALID);
    q = greedy_request(prompt, 0, 4, &r);
    assert_int_equal(rlx_engine_submit(e, &q, &id), RLX_E_INVALID);
    assert_int_equal(id, 0);
    rlx_engine_destroy(e);
    assert_int_equal(r.n_done, 0);
    tu_events_destroy(&r);
    rlx_engine_options o = rlx_engine_options_default();
    o.n_slots = 8;
    o.step_tokens = 4;
    rlx_engine *bad;
    assert_int_equal(rlx_engine_create(model, &o, &bad), RLX_E_INVALID);
    o = rlx_engine_options_default();
    o.kv_dtype = RLX_DTYPE_BF16;
    assert_int_equal(rlx_engine_create(model, &o, &bad), RLX_E_INVALID);
}

/* Each token's log-probability is the log-softmax of the session's logits at it, and the top
 * alternatives are the largest logits, best first. */
static void test_logprobs_are_the_log_softmax(void **state) {
    (void)state;
    rlx_engine *e = new_engine(1, 96, 4, 64);
    int32_t prompt[64];
    uint32_t n = make_prompt(5, 0, prompt);
    tu_events r;
    tu_events_init(&r);
    rlx_request q = greedy_request(prompt, n, 2, &r);
    q.logprobs = 1;
    q.top_logprobs = 3;
    uint64_t id;
    assert_ok(rlx_engine_submit(e, &q, &id));
    wait_done(&r);
    rlx_session *s = new_session();
    const float *l;
    assert_ok(rlx_session_forward(s, prompt, n, 0, &l));
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < vocab; v++)
        mx = fmax(mx, l[v]);
    for (int64_t v = 0; v < vocab; v++)
        sum += exp(l[v] - mx);
    assert_true(fabs(r.logprobs[0] - (l[r.tokens[0]] - mx - log(sum))) < 1e-4);
    assert_int_equal(r.top_ids[0][0], r.tokens[0]); /* greedy: the best is the one taken */
    for (int k = 1; k < 3; k++) {
        assert_true(l[r.top_ids[0][k]] <= l[r.top_ids[0][k - 1]]);
        for (int64_t v = 0; v < vocab; v++) /* nothing outside the top beats the third */
            if (v != r.top_ids[0][0] && v != r.top_ids[0][1] && v != r.top_ids[0][2])
                assert_true(l[v] <= l[r.top_ids[0][2]]);
    }
    rlx_session_destroy(s);
    rlx_engine_destroy(e);
    tu_events_destroy(&r);
}

/* Four threads submit 40 requests each and cancel every third at once; every accepted request
 * gets exactly one DONE, the refused ones none, and the engine ends idle. With choices, the 40
 * go as groups of 1 to 3 choices of the thread's prompt (rlx_engine_submit_choices), the last
 * of every other group cancelled: a group is accepted or refused whole. */
typedef struct stress_arg {
    rlx_engine *e;
    int choices;
    int32_t prompt[64];
    uint32_t n;
    tu_events r[40];
    int accepted[40];
} stress_arg;

static void *stress_thread(void *p) {
    stress_arg *a = p;
    for (int i = 0, g = 0; i < 40; g++) {
        const int k = a->choices ? (g % 3 + 1 < 40 - i ? g % 3 + 1 : 40 - i) : 1;
        rlx_request q[3];
        uint64_t ids[3];
        for (int c = 0; c < k; c++)
            q[c] = greedy_request(a->prompt, a->n, 2 + (uint32_t)(i + c) % 3, &a->r[i + c]);
        const rlx_status rc =
            a->choices ? rlx_engine_submit_choices(a->e, q, (uint32_t)k, ids) : rlx_engine_submit(a->e, q, ids);
        for (int c = 0; c < k; c++)
            a->accepted[i + c] = rc == RLX_OK;
        if (rc == RLX_OK && (a->choices ? g % 2 == 0 : i % 3 == 0))
            rlx_engine_cancel(a->e, ids[k - 1]);
        if (rc != RLX_OK && rc != RLX_E_BUSY)
            return "unexpected status";
        i += k;
    }
    return NULL;
}

static void stress_submit_and_cancel(int choices) {
    rlx_engine *e = new_engine(4, 64, 8, 32);
    static stress_arg args[4]; /* 160 collectors: too large for the stack */
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        args[t].e = e;
        args[t].choices = choices;
        args[t].n = make_prompt(t, 6, args[t].prompt);
        for (int i = 0; i < 40; i++)
            tu_events_init(&args[t].r[i]);
        assert_int_equal(pthread_create(&th[t], NULL, stress_thread, &args[t]), 0);
    }
    uint64_t accepted = 0;
    for (int t = 0; t < 4; t++) {
        void *res;
        pthread_join(th[t], &res);
        assert_null(res);
        for (int i = 0; i < 40; i++)
            if (args[t].accepted[i]) {
                wait_done(&args[t].r[i]);
                accepted++;
            }
    }
    rlx_engine_stats st;
    rlx_engine_stats_of(e, &st);
    assert_int_equal(st.requests_done + st.requests_cancelled, accepted);
    assert_int_equal(st.requests_refused, 160 - accepted);
    assert_int_equal(st.requests_failed, 0);
    rlx_engine_destroy(e);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 40; i++) {
            assert_int_equal(args[t].r[i].n_done, args[t].accepted[i] ? 1 : 0);
            assert_int_equal(args[t].r[i].events_after_done, 0);
            tu_events_destroy(&args[t].r[i]);
        }
}

static void test_stress_submit_and_cancel(void **state) {
    (void)state;
    stress_submit_and_cancel(0);
}

static void test_stress_submit_choices_and_cancel(void **state) {
    (void)state;
    stress_submit_and_cancel(1);
}

/* n choices of one prompt: each gives the tokens a session alone gives (greedy, so all alike)
 * from one prompt pass (the copies count the whole prompt as cached); a group of none, of more
 * than the slots or whose prompts differ is refused naming why, and one the engine has no room
 * for is refused whole (BUSY, every choice counted refused, none gets an event). */
static void test_choices_share_one_prompt_pass(void **state) {
    (void)state;
    enum { C = 3 };
    rlx_engine *e = new_engine(C, 96, 1, 64);
    int32_t prompt[64], other[64], blocker[64];
    const uint32_t n = make_prompt(5, 0, prompt), n_blocker = make_prompt(6, 0, blocker);
    memcpy(other, prompt, sizeof prompt);
    other[n - 1] = (int32_t)((other[n - 1] + 1) % vocab);
    tu_events r[C + 2];
    rlx_request q[C + 2];
    uint64_t ids[C + 2];
    for (int i = 0; i < C + 2; i++) {
        tu_events_init(&r[i]);
        q[i] = greedy_request(prompt, n, 10, &r[i]);
    }
    assert_int_equal(rlx_engine_submit_choices(e, q, 0, ids), RLX_E_INVALID);
    assert_int_equal(rlx_engine_submit_choices(e, q, C + 1, ids), RLX_E_INVALID);
    assert_error_mentions("choices");
    q[1].prompt = other;
    assert_int_equal(rlx_engine_submit_choices(e, q, C, ids), RLX_E_INVALID);
    assert_error_mentions("differs");
    q[1].prompt = prompt;
    /* one request held running (its worker blocked) and one queued leave room for C - 1 more
     * (C slots, a queue of 1): the group of C is refused whole */
    q[C] = greedy_request(blocker, n_blocker, 10, &r[C]); /* another prompt: no prefix to reuse */
    q[C + 1] = greedy_request(blocker, n_blocker, 10, &r[C + 1]);
    r[C].hold[0] = 1;
    assert_ok(rlx_engine_submit(e, &q[C], &ids[C]));
    assert_true(tu_wait_holding(&r[C], 1, TU_WAIT_MS));
    assert_ok(rlx_engine_submit(e, &q[C + 1], &ids[C + 1]));
    assert_int_equal(rlx_engine_submit_choices(e, q, C, ids), RLX_E_BUSY);
    assert_error_mentions("busy");
    for (int i = 0; i < C; i++)
        assert_int_equal(ids[i], 0);
    rlx_engine_cancel(e, ids[C]);
    rlx_engine_cancel(e, ids[C + 1]);
    tu_release(&r[C]);
    wait_done(&r[C]);
    wait_done(&r[C + 1]);
    assert_ok(rlx_engine_submit_choices(e, q, C, ids));
    for (int i = 0; i < C; i++) {
        assert_true(ids[i] > 0);
        for (int j = 0; j < i; j++)
            assert_true(ids[i] != ids[j]);
    }
    for (int i = 0; i < C; i++)
        wait_done(&r[i]);
    for (int i = 0; i < C; i++) {
        expect_solo(prompt, n, 10, &r[i]);
        assert_int_equal(r[i].done.usage.n_cached, i ? n : 0);
    }
    rlx_engine_stats st;
    rlx_engine_stats_of(e, &st);
    assert_int_equal(st.requests_refused, C);
    assert_int_equal(st.requests_done, C);
    assert_int_equal(st.requests_cancelled, 2);
    rlx_engine_destroy(e);
    for (int i = 0; i < C + 2; i++) {
        assert_int_equal(r[i].n_done, 1);
        assert_int_equal(r[i].events_after_done, 0);
        tu_events_destroy(&r[i]);
    }
}

/* Over an lm (here a session; a pipeline driver or a speculator in the server) requests take
 * turns on one slot: queued ones run in order, each equals its solo run, the prefix the lm holds
 * from the previous request is reused, and cancel ends a running request. */
static void test_engine_over_an_lm(void **state) {
    (void)state;
    rlx_session *s = new_session();
    rlx_lm lm;
    assert_ok(rlx_session_lm(s, &lm));
    rlx_engine_options o = rlx_engine_options_default();
    o.n_slots = 2;
    rlx_engine *e;
    assert_int_equal(rlx_engine_create_lm(&lm, NULL, 0, &o, &e), RLX_E_UNSUPPORTED);
    o.n_slots = 0;
    o.max_queue = 3;
    assert_ok(rlx_engine_create_lm(&lm, NULL, 0, &o, &e));
    enum { N = 3 };
    int32_t prompts[N][64];
    uint32_t lens[N];
    tu_events r[N + 1];
    uint64_t id;
    for (int i = 0; i < N; i++) {
        lens[i] = make_prompt(i, 20, prompts[i]);
        tu_events_init(&r[i]);
        rlx_request q = greedy_request(prompts[i], lens[i], 5, &r[i]);
        assert_ok(rlx_engine_submit(e, &q, &id));
    }
    for (int i = 0; i < N; i++)
        wait_done(&r[i]);
    for (int i = 0; i < N; i++)
        expect_solo(prompts[i], lens[i], 5, &r[i]);
    assert_int_equal(r[0].done.usage.n_cached, 0);
    assert_int_equal(r[1].done.usage.n_cached, 20); /* the shared 20 tokens stayed in the lm */
    /* a long request cancelled after its first token ends with CANCELLED */
    tu_events_init(&r[N]);
    r[N].stop_after = 0;
    rlx_request q = greedy_request(prompts[0], lens[0], 60, &r[N]);
    assert_ok(rlx_engine_submit(e, &q, &id));
    tu_wait_tokens(&r[N], 1, TU_WAIT_MS);
    rlx_engine_cancel(e, id);
    wait_done(&r[N]);
    assert_true(r[N].done.finish == RLX_FINISH_CANCELLED || r[N].n == 60);
    rlx_engine_destroy(e);
    for (int i = 0; i <= N; i++)
        tu_events_destroy(&r[i]);
    rlx_session_destroy(s);
}

static int setup(void **state) {
    (void)state;
    /* RLX_TEST_INVARIANT: the backend in its batch-invariant mode, and the log-probabilities of a
     * request beside others must equal those alone to the bit */
    const rlx_backend_options bo = {.size = sizeof bo,
                                    .extra = getenv("RLX_TEST_INVARIANT") ? "batch_invariant=1" : NULL};
    if (tu_open_model(model_dir, NULL, &bo, &model, &plugin, &backend) != 0)
        return -1;
    vocab = rlx_model_config_of(model)->vocab_size;
    kv_dtype = getenv("RLX_TEST_KV") && strcmp(getenv("RLX_TEST_KV"), "f16") == 0 ? RLX_DTYPE_F16 : RLX_DTYPE_F32;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_close_model(model, plugin, backend);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1)
        model_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_request_equals_session),
        cmocka_unit_test(test_concurrent_requests_equal_their_solo_runs),
        cmocka_unit_test(test_shared_prefix_is_reused),
        cmocka_unit_test(test_full_queue_refuses_and_cancel_ends),
        cmocka_unit_test(test_stop_from_callback_and_drain),
        cmocka_unit_test(test_bad_requests_are_refused),
        cmocka_unit_test(test_logprobs_are_the_log_softmax),
        cmocka_unit_test(test_stress_submit_and_cancel),
        cmocka_unit_test(test_choices_share_one_prompt_pass),
        cmocka_unit_test(test_stress_submit_choices_and_cancel),
        cmocka_unit_test(test_engine_over_an_lm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
