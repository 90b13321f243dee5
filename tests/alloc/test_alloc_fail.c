/* Allocation failures, SQLite's way: a scenario (load a tokenizer, encode a prompt, open a
 * model, plan it on a plugin backend and the reference kernels, sample with penalties,
 * generate, decode the text; or open the model through the runtime with placement and
 * generate; or run a request through the batched engine) is run once per allocation it makes, with that allocation made to fail. Each run must end in an error that says memory ran out, or, where a failure only
 * costs a cache, in exactly the text of a run without failures; never a crash. The sanitizer
 * build finds what a failure path leaks or touches after freeing. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "rlx/private.h"
#include "testutil.h"

#define MODEL RLX_SOURCE_DIR "/share/models/brown/draft"

static rlx_plugin_handle *plugin;

static int collect(void *ctx, int32_t token, const float *logits) {
    (void)logits;
    int32_t **out = ctx;
    *(*out)++ = token;
    return 0;
}

/* The scenario; returns its status and, on success, the generated text in out (out_size
 * bytes), everything released whatever happened. */
static rlx_status session_scenario(char *out, size_t out_size) {
    rlx_tokenizer *tok = NULL;
    rlx_model *m = NULL;
    rlx_backend *backends[2] = {NULL, NULL};
    rlx_session *s = NULL;
    rlx_lm lm;
    rlx_sampler *sampler = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *text = NULL;
    size_t text_len = 0;
    int32_t generated[8], *next = generated;
    rlx_status rc;
    if ((rc = rlx_tokenizer_open(MODEL, &tok)) < 0 ||
        (rc = rlx_tokenizer_encode(tok, "the brown fox", 13, 1, &ids, &n_ids)) < 0 ||
        (rc = rlx_model_open(MODEL, &m)) < 0 || (rc = rlx_backend_create(plugin, NULL, &backends[0])) < 0 ||
        (rc = rlx_backend_create_ref(NULL, &backends[1])) < 0)
        goto done;
    const rlx_model_config *c = rlx_model_config_of(m);
    const rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                                 .layer_end = (uint32_t)c->num_hidden_layers,
                                 .embed_input = 1,
                                 .produce_logits = 1};
    const rlx_session_options o = {
        .size = sizeof(rlx_session_options), .kv_capacity = 32, .backends = backends, .n_backends = 2};
    rlx_sampler_params sp = rlx_sampler_params_default();
    sp.greedy = 0;
    sp.temperature = 0.8f;
    sp.top_k = 20;
    sp.repeat_penalty = 1.3f;
    sp.seed = 5;
    if ((rc = rlx_session_create(m, &spec, &o, &s)) < 0 ||
        (rc = rlx_sampler_create(&sp, c->vocab_size, &sampler)) < 0 || (rc = rlx_session_lm(s, &lm)) < 0 ||
        (rc = rlx_generate(&lm, sampler, ids, (uint32_t)n_ids, 8, collect, &next, NULL)) < 0)
        goto done;
    if ((rc = rlx_tokenizer_decode(tok, generated, (size_t)(next - generated), 0, &text, &text_len)) == RLX_OK)
        snprintf(out, out_size, "%s", text);
done:
    free(text);
    free(ids);
    rlx_sampler_destroy(sampler);
    rlx_session_destroy(s);
    rlx_backend_destroy(backends[1]);
    rlx_backend_destroy(backends[0]);
    rlx_model_close(m);
    rlx_tokenizer_close(tok);
    return rc;
}

/* The runtime's way in: the backends of a placement found through the registry, the model, a
 * session, then greedy ids written to out. */
static rlx_status runtime_scenario(char *out, size_t out_size) {
    const rlx_runtime_backend ref = {.name = "ref"};
    rlx_runtime_options o = rlx_runtime_options_default();
    o.model_dir = MODEL;
    o.backends = &ref;
    o.n_backends = 1;
    o.place = "matmul=cpu-blas";
    o.kv_capacity = 32;
    rlx_runtime *rt = NULL;
    rlx_sampler *sampler = NULL;
    const int32_t prompt[] = {11, 200, 31};
    int32_t generated[8], *next = generated;
    rlx_sampler_params sp = rlx_sampler_params_default();
    sp.greedy = 1;
    rlx_status rc;
    if ((rc = rlx_runtime_open(&o, &rt)) == RLX_OK &&
        (rc = rlx_sampler_create(&sp, rlx_runtime_lm(rt)->vocab, &sampler)) == RLX_OK &&
        (rc = rlx_generate(rlx_runtime_lm(rt), sampler, prompt, 3, 8, collect, &next, NULL)) == RLX_OK) {
        size_t len = 0;
        for (const int32_t *t = generated; t < next && len < out_size; t++)
            len += (size_t)snprintf(out + len, out_size - len, "%d ", *t);
    }
    rlx_sampler_destroy(sampler);
    rlx_runtime_close(rt);
    return rc;
}

/* What the engine scenario's request received. */
typedef struct engine_got {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tokens[8];
    uint32_t n;
    int done;
    rlx_status status;
    char message[256];
} engine_got;

static int engine_event(void *ctx, const rlx_engine_event *ev) {
    engine_got *g = ctx;
    pthread_mutex_lock(&g->mu);
    if (ev->kind == RLX_ENGINE_TOKEN && g->n < 8)
        g->tokens[g->n++] = ev->token;
    if (ev->kind == RLX_ENGINE_DONE) {
        g->done = 1;
        g->status = ev->status;
        snprintf(g->message, sizeof g->message, "%s", ev->message);
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    return 0;
}

/* The batched engine: its slots, queue and worker, a request with log-probabilities on the
 * cpu-blas backend; an error the worker met comes back in the DONE event and is raised here. */
static rlx_status engine_scenario(char *out, size_t out_size) {
    rlx_model *m = NULL;
    rlx_backend *b = NULL;
    rlx_engine *e = NULL;
    engine_got g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    const int32_t prompt[] = {11, 200, 31, 7};
    rlx_status rc;
    if ((rc = rlx_model_open(MODEL, &m)) < 0 || (rc = rlx_backend_create(plugin, NULL, &b)) < 0)
        goto done;
    rlx_engine_options o = rlx_engine_options_default();
    o.n_slots = 2;
    o.slot_positions = 32;
    o.backends = &b;
    o.n_backends = 1;
    rlx_request q = {.size = sizeof q,
                     .prompt = prompt,
                     .n_prompt = 4,
                     .max_tokens = 8,
                     .logprobs = 1,
                     .top_logprobs = 2,
                     .on_event = engine_event,
                     .ctx = &g};
    q.sampler = rlx_sampler_params_default();
    q.sampler.greedy = 1;
    uint64_t id;
    if ((rc = rlx_engine_create(m, &o, &e)) < 0 || (rc = rlx_engine_submit(e, &q, &id)) < 0)
        goto done;
    pthread_mutex_lock(&g.mu);
    while (!g.done)
        pthread_cond_wait(&g.cv, &g.mu); /* the engine delivers exactly one DONE per request */
    pthread_mutex_unlock(&g.mu);
    if ((rc = g.status) < 0)
        rlx_error(rc, "%s", g.message);
    else {
        size_t len = 0;
        for (uint32_t i = 0; i < g.n && len < out_size; i++)
            len += (size_t)snprintf(out + len, out_size - len, "%d ", g.tokens[i]);
    }
done:
    rlx_engine_destroy(e);
    rlx_backend_destroy(b);
    rlx_model_close(m);
    return rc;
}

typedef struct scenario_case {
    rlx_status (*run)(char *out, size_t out_size);
} scenario_case;

static const scenario_case session_case = {session_scenario}, runtime_case = {runtime_scenario},
                           engine_case = {engine_scenario};

static void test_every_allocation_fails_cleanly(void **state) {
    rlx_status (*scenario)(char *out, size_t out_size) = ((const scenario_case *)*state)->run;
    char want[512], got[512];
    rlx_debug_fail_alloc(0, 0);
    assert_ok(scenario(want, sizeof want));
    assert_true(strlen(want) > 0);
    const uint64_t total = rlx_debug_fail_alloc(0, 0);
    assert_true(total > 100); /* the scenario allocates through the hook at all */
    uint64_t failed = 0, bad = 0;
    for (uint64_t n = 1;; n++) {
        rlx_debug_fail_alloc(n, 0);
        rlx_error_clear();
        got[0] = 0;
        const rlx_status rc = scenario(got, sizeof got);
        const uint64_t made = rlx_debug_fail_alloc(0, 0);
        if (made < n) { /* the run ended before its nth allocation: every one has failed once */
            assert_ok(rc);
            break;
        }
        /* every problem is listed, then the test fails */
        const char *msg = rlx_last_error();
        const int recovered = rc == RLX_OK && strcmp(got, want) == 0;
        if (rc == RLX_OK && !recovered)
            fprintf(stderr, "allocation %llu: failed, and the scenario succeeded with other text: %s\n",
                    (unsigned long long)n, got);
        else if (rc < 0 && rc != RLX_E_NOMEM)
            fprintf(stderr, "allocation %llu: status %d (%s), want RLX_E_NOMEM: %s\n", (unsigned long long)n, rc,
                    rlx_status_str(rc), msg);
        else if (rc < 0 && !strstr(msg, "memory") && !strstr(msg, "allocate"))
            fprintf(stderr, "allocation %llu: the message does not say memory ran out: %s\n", (unsigned long long)n,
                    msg);
        else
            failed += rc < 0;
        bad += !recovered && (rc != RLX_E_NOMEM || (!strstr(msg, "memory") && !strstr(msg, "allocate")));
    }
    if (bad)
        fail_msg("%llu of the scenario's allocations fail badly (listed above)", (unsigned long long)bad);
    assert_true(failed >= total / 2);
    /* persistent failures from the middle on: the same, with every later allocation failing too */
    rlx_debug_fail_alloc(total / 2, 1);
    assert_int_equal(scenario(got, sizeof got), RLX_E_NOMEM);
    rlx_debug_fail_alloc(0, 0);
    assert_ok(scenario(got, sizeof got));
    assert_string_equal(got, want);
}

int main(void) {
    if (rlx_plugin_load(RLX_BUILD_PLUGIN_DIR "/rlx-backend-cpu-blas.so", &plugin) != RLX_OK) {
        fprintf(stderr, "cannot load cpu-blas: %s\n", rlx_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_every_allocation_fails_cleanly, (void *)&session_case),
        cmocka_unit_test_prestate(test_every_allocation_fails_cleanly, (void *)&runtime_case),
        cmocka_unit_test_prestate(test_every_allocation_fails_cleanly, (void *)&engine_case),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    rlx_plugin_unload(plugin);
    return failed;
}
