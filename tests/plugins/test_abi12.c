/* The plugin ABI's growth path: a backend built against the 1.0 headers is never offered an op
 * of a later minor; a 1.2 backend's prepared weights live exactly as long as their owner (a
 * model, or the plan of a hand-built graph) and its spans as long as their plan; fused spans
 * compute what the same nodes compute one by one, write what is read after them, and models
 * run through them (with fewer backend calls), also with models and backends opened and closed
 * on several threads at once. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

#define MODEL RLX_TEST_DATA "/dense-untied-bias-f32-s1"

typedef struct span_stats {
    int prepared, released, live_handles;
    int spans_planned, spans_released, fused_spans, compute_span_calls, compute_calls;
    int bad_calls;
} span_stats;

static rlx_plugin_handle *span_plugin;
static void (*span_stats_of)(span_stats *);

static span_stats stats_now(void) {
    span_stats s;
    span_stats_of(&s);
    return s;
}

static int setup(void **state) {
    (void)state;
    if (rlx_plugin_load(RLX_TEST_PLUGIN_DIR "/rlx-test-span.so", &span_plugin) != RLX_OK)
        return -1;
    void *dl = dlopen(RLX_TEST_PLUGIN_DIR "/rlx-test-span.so", RTLD_NOW | RTLD_NOLOAD);
    if (!dl)
        return -1;
    *(void **)&span_stats_of = dlsym(dl, "rlx_test_span_stats");
    dlclose(dl);
    return span_stats_of ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    rlx_plugin_unload(span_plugin);
    return 0;
}

static void test_abi10_backend_loads_and_is_never_offered_concat(void **state) {
    (void)state;
    rlx_plugin_handle *h;
    assert_ok(rlx_plugin_load(RLX_TEST_PLUGIN_DIR "/rlx-test-abi10.so", &h));
    rlx_backend *b;
    assert_ok(rlx_backend_create(h, NULL, &b));
    assert_int_equal(rlx_backend_abi_minor(b), 0);
    assert_int_equal(rlx_backend_features(b), 0);
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    const int x = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "x", RLX_DTYPE_F32, 2, (int64_t[]){2, 3}, NULL);
    const int sum = rlx_graph_add_node(g, RLX_OP_ADD, "sum", (int[]){x, x}, 2, NULL);
    const int both = rlx_graph_add_node(g, RLX_OP_CONCAT, "both", (int[]){x, sum}, 2, NULL);
    assert_ok(rlx_graph_mark_output(g, both));
    rlx_plan *p;
    assert_ok(
        rlx_plan_create(g, &(rlx_plan_options){.size = sizeof(rlx_plan_options), .backends = &b, .n_backends = 1}, &p));
    assert_string_equal(rlx_plan_node_backend(p, 0), "abi10");
    assert_string_equal(rlx_plan_node_backend(p, 1), "ref"); /* its supports() would have said yes */
    float in[6] = {1, 2, 3, 4, 5, 6};
    assert_ok(rlx_plan_bind(p, x, in));
    assert_ok(rlx_plan_run(p));
    const float *out = rlx_plan_data(p, both);
    const float want[12] = {1, 2, 3, 2, 4, 6, 4, 5, 6, 8, 10, 12};
    for (int i = 0; i < 12; i++)
        assert_float_equal(out[i], want[i], 0);
    rlx_plan_destroy(p);
    /* asked directly, the 1.0 backend is not offered CONCAT either */
    const rlx_tensor shapes[2] = {{.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {2, 3, 1, 1}},
                                  {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {2, 3, 1, 1}}};
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {2, 6, 1, 1}};
    rlx_op_params prm = {0};
    const rlx_node_view v = {
        .op = RLX_OP_CONCAT, .n_inputs = 2, .inputs = shapes, .output = &o, .params = &prm, .name = "c"};
    assert_false(rlx_backend_supports(b, &v));
    rlx_graph_destroy(g);
    rlx_backend_destroy(b);
    rlx_plugin_unload(h);
}

/* x -> h = rms_norm(x) -> q, k = h W^T (q is a graph output) -> s = q + k
 *   -> gate, up = s W^T -> y = swiglu(gate, up) */
typedef struct block {
    rlx_graph *g;
    int x, q, y;
    float wn[8], wq[6 * 8], wk[6 * 8], bk[6], wg[4 * 6], wu[4 * 6];
} block;

static void fill(float *w, int n, float scale, uint64_t *seed) {
    for (int i = 0; i < n; i++)
        w[i] = scale * tu_uniform(seed);
}

static void block_build(block *b) {
    uint64_t seed = 7;
    fill(b->wn, 8, 1, &seed);
    fill(b->wq, 48, 0.5f, &seed);
    fill(b->wk, 48, 0.5f, &seed);
    fill(b->bk, 6, 0.1f, &seed);
    fill(b->wg, 24, 0.5f, &seed);
    fill(b->wu, 24, 0.5f, &seed);
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    b->x = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "x", RLX_DTYPE_F32, 2, (int64_t[]){3, 8}, NULL);
    const int wn = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "wn", RLX_DTYPE_F32, 1, (int64_t[]){8}, b->wn);
    const int wq = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "wq", RLX_DTYPE_F32, 2, (int64_t[]){6, 8}, b->wq);
    const int wk = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "wk", RLX_DTYPE_F32, 2, (int64_t[]){6, 8}, b->wk);
    const int bk = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "bk", RLX_DTYPE_F32, 1, (int64_t[]){6}, b->bk);
    const int wg = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "wg", RLX_DTYPE_F32, 2, (int64_t[]){4, 6}, b->wg);
    const int wu = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "wu", RLX_DTYPE_F32, 2, (int64_t[]){4, 6}, b->wu);
    const rlx_op_params eps = {.eps = 1e-6f};
    const int h = rlx_graph_add_node(g, RLX_OP_RMS_NORM, "h", (int[]){b->x, wn}, 2, &eps);
    b->q = rlx_graph_add_node(g, RLX_OP_MATMUL, "q", (int[]){h, wq}, 2, NULL);
    const int k = rlx_graph_add_node(g, RLX_OP_MATMUL, "k", (int[]){h, wk, bk}, 3, NULL);
    const int s = rlx_graph_add_node(g, RLX_OP_ADD, "s", (int[]){b->q, k}, 2, NULL);
    const int gate = rlx_graph_add_node(g, RLX_OP_MATMUL, "gate", (int[]){s, wg}, 2, NULL);
    const int up = rlx_graph_add_node(g, RLX_OP_MATMUL, "up", (int[]){s, wu}, 2, NULL);
    b->y = rlx_graph_add_node(g, RLX_OP_SWIGLU, "y", (int[]){gate, up}, 2, NULL);
    assert_true(b->y >= 0);
    assert_ok(rlx_graph_mark_output(g, b->q));
    assert_ok(rlx_graph_mark_output(g, b->y));
    b->g = g;
}

/* Runs a plan of the block over backend (flags RLX_PLAN_*) and copies q and y out. */
static void block_run(block *b, rlx_backend *backend, uint32_t flags, uint32_t *n_calls, float q[18], float y[12]) {
    static float x[24];
    uint64_t seed = 3;
    fill(x, 24, 2, &seed);
    const rlx_plan_options o = {.size = sizeof o, .flags = flags, .backends = &backend, .n_backends = 1};
    rlx_plan *p;
    assert_ok(rlx_plan_create(b->g, &o, &p));
    for (uint32_t i = 0; i < rlx_graph_n_nodes(b->g); i++)
        assert_string_equal(rlx_plan_node_backend(p, i), rlx_backend_name(backend));
    assert_ok(rlx_plan_bind(p, b->x, x));
    assert_ok(rlx_plan_run(p));
    memcpy(q, rlx_plan_data(p, b->q), 18 * sizeof *q);
    memcpy(y, rlx_plan_data(p, b->y), 12 * sizeof *y);
    *n_calls = rlx_plan_n_calls(p);
    rlx_plan_destroy(p);
}

static void test_fused_spans_match_per_node_and_reference(void **state) {
    (void)state;
    rlx_backend *span, *ref;
    assert_ok(rlx_backend_create(span_plugin, NULL, &span));
    assert_ok(rlx_backend_create_ref(NULL, &ref));
    assert_int_equal(rlx_backend_features(span), RLX_BACKEND_PREPARES_WEIGHTS | RLX_BACKEND_RUNS_SPANS);
    block b;
    block_build(&b);
    float q_fused[18], y_fused[12], q_node[18], y_node[12], q_ref[18], y_ref[12];
    uint32_t calls_fused, calls_node, calls_ref;
    const span_stats before = stats_now();
    block_run(&b, span, 0, &calls_fused, q_fused, y_fused);
    const span_stats fused = stats_now();
    block_run(&b, span, RLX_PLAN_PER_NODE, &calls_node, q_node, y_node);
    const span_stats per_node = stats_now();
    block_run(&b, ref, 0, &calls_ref, q_ref, y_ref);
    /* norm+q+k and gate+up+swiglu fused, the addition alone: 3 calls for 7 nodes */
    assert_int_equal(calls_fused, 3);
    assert_int_equal(calls_node, 7);
    assert_int_equal(calls_ref, 7);
    assert_int_equal(fused.fused_spans - before.fused_spans, 2);
    assert_int_equal(fused.compute_calls - before.compute_calls, 0);
    assert_int_equal(per_node.compute_calls - fused.compute_calls, 7);
    assert_int_equal(per_node.fused_spans - fused.fused_spans, 0);
    /* q is read after its span (a graph output): written; same sums in the same order */
    assert_memory_equal(q_fused, q_node, sizeof q_fused);
    assert_memory_equal(y_fused, y_node, sizeof y_fused);
    for (int i = 0; i < 18; i++)
        assert_float_equal(q_fused[i], q_ref[i], 1e-5 * fmax(1, fabs(q_ref[i])));
    for (int i = 0; i < 12; i++)
        assert_float_equal(y_fused[i], y_ref[i], 1e-5 * fmax(1, fabs(y_ref[i])));
    const span_stats end = stats_now();
    assert_int_equal(end.bad_calls, 0);
    assert_int_equal(end.spans_planned, end.spans_released);
    assert_int_equal(end.live_handles, 0); /* each plan of a hand-built graph owned its weights */
    rlx_graph_destroy(b.g);
    rlx_backend_destroy(ref);
    rlx_backend_destroy(span);
}

static void test_prepared_weights_live_with_their_owner(void **state) {
    (void)state;
    rlx_backend *span;
    assert_ok(rlx_backend_create(span_plugin, NULL, &span));
    block b;
    block_build(&b);
    float q[18], y[12];
    uint32_t calls;
    /* a hand-built graph: every plan prepares its own (6 uses: wn, wq, wk, bk, wg, wu) and
     * releases them when it goes */
    const span_stats s0 = stats_now();
    block_run(&b, span, 0, &calls, q, y);
    block_run(&b, span, 0, &calls, q, y);
    const span_stats s1 = stats_now();
    assert_int_equal(s1.prepared - s0.prepared, 12);
    assert_int_equal(s1.released - s0.released, 12);
    rlx_graph_destroy(b.g);
    /* a model's weights: a backend closed before the model releases what it holds first, and
     * closing the model afterwards calls nothing of the closed backend */
    rlx_model *m;
    assert_ok(rlx_model_open(MODEL, &m));
    const rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                                 .layer_end = (uint32_t)rlx_model_config_of(m)->num_hidden_layers,
                                 .embed_input = 1,
                                 .produce_logits = 1};
    const rlx_session_options o = {
        .size = sizeof(rlx_session_options), .kv_capacity = 8, .backends = &span, .n_backends = 1};
    rlx_session *s;
    assert_ok(rlx_session_create(m, &spec, &o, &s));
    const float *logits;
    assert_ok(rlx_session_forward(s, (const int32_t[]){2, 7}, 2, 0, &logits));
    rlx_session_destroy(s);
    assert_true(stats_now().live_handles > 0);
    rlx_backend_destroy(span);
    assert_int_equal(stats_now().live_handles, 0);
    rlx_model_close(m);
    assert_int_equal(stats_now().bad_calls, 0);
}

static void test_models_run_through_spans_with_weights_prepared_once(void **state) {
    (void)state;
    rlx_backend *span, *ref;
    assert_ok(rlx_backend_create(span_plugin, NULL, &span));
    assert_ok(rlx_backend_create_ref(NULL, &ref));
    rlx_model *m;
    assert_ok(rlx_model_open(MODEL, &m));
    const rlx_model_config *c = rlx_model_config_of(m);
    const rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                                 .layer_end = (uint32_t)c->num_hidden_layers,
                                 .embed_input = 1,
                                 .produce_logits = 1};
    rlx_session *fused, *plain;
    const rlx_session_options fo = {
        .size = sizeof(rlx_session_options), .kv_capacity = 16, .backends = &span, .n_backends = 1};
    const rlx_session_options po = {
        .size = sizeof(rlx_session_options), .kv_capacity = 16, .backends = &ref, .n_backends = 1};
    assert_ok(rlx_session_create(m, &spec, &fo, &fused));
    assert_ok(rlx_session_create(m, &spec, &po, &plain));
    const int32_t prompt[5] = {3, 1, 4, 1, 5};
    const float *got, *want;
    const span_stats s0 = stats_now();
    assert_ok(rlx_session_forward(fused, prompt, 4, 0, &got));
    const span_stats s1 = stats_now();
    assert_ok(rlx_session_forward(plain, prompt, 4, 0, &want));
    for (int64_t i = 0; i < c->vocab_size; i++)
        assert_float_equal(got[i], want[i], 1e-4 * fmax(1, fabs(want[i])));
    /* a second plan (one position) of the same model prepares nothing again */
    assert_ok(rlx_session_forward(fused, &prompt[4], 1, 0, &got));
    assert_ok(rlx_session_forward(plain, &prompt[4], 1, 0, &want));
    for (int64_t i = 0; i < c->vocab_size; i++)
        assert_float_equal(got[i], want[i], 1e-4 * fmax(1, fabs(want[i])));
    const span_stats s2 = stats_now();
    assert_true(s1.prepared > s0.prepared);
    assert_true(s1.fused_spans > s0.fused_spans);
    assert_int_equal(s2.prepared, s1.prepared);
    rlx_session_destroy(fused);
    rlx_session_destroy(plain);
    assert_true(stats_now().live_handles > 0); /* the model is still open */
    rlx_model_close(m);
    assert_int_equal(stats_now().live_handles, 0);
    assert_int_equal(stats_now().bad_calls, 0);
    rlx_backend_destroy(ref);
    rlx_backend_destroy(span);
}

/* One thread's life of models and backends: each round prepares a model on two backends of its
 * own and closes them in an order of its choice, while the other threads do the same, so
 * model closes walk backends that other threads are creating, preparing on and destroying. */
typedef struct stress_arg {
    int rounds, seed;
    int failures;
    char why[256];
} stress_arg;

static void *stress_thread(void *p) {
    stress_arg *a = p;
    uint64_t seed = (uint64_t)a->seed;
    for (int r = 0; r < a->rounds && !a->failures; r++) {
        rlx_backend *both[2] = {NULL, NULL};
        rlx_model *m = NULL;
        rlx_session *s = NULL;
        const float *logits;
        const unsigned order = tu_rand(&seed) % 3;
        if (rlx_backend_create(span_plugin, NULL, &both[0]) != RLX_OK ||
            rlx_backend_create(span_plugin, NULL, &both[1]) != RLX_OK || rlx_model_open(MODEL, &m) != RLX_OK) {
            a->failures++;
            snprintf(a->why, sizeof a->why, "%s", rlx_last_error());
            rlx_backend_destroy(both[0]);
            rlx_backend_destroy(both[1]);
            break;
        }
        const rlx_block_spec spec = {.size = sizeof(rlx_block_spec),
                                     .layer_end = (uint32_t)rlx_model_config_of(m)->num_hidden_layers,
                                     .embed_input = 1,
                                     .produce_logits = 1};
        /* the matmuls on the second backend, the rest on the first */
        const rlx_place_rule rule = {.op = RLX_OP_MATMUL, .backend = both[1]};
        const rlx_session_options o = {.size = sizeof(rlx_session_options),
                                       .kv_capacity = 8,
                                       .backends = both,
                                       .n_backends = 2,
                                       .rules = &rule,
                                       .n_rules = 1};
        if (rlx_session_create(m, &spec, &o, &s) != RLX_OK ||
            rlx_session_forward(s, (const int32_t[]){1, 2, 3}, 3, 0, &logits) != RLX_OK) {
            a->failures++;
            snprintf(a->why, sizeof a->why, "%s", rlx_last_error());
        }
        rlx_session_destroy(s);
        if (order == 0)
            rlx_model_close(m);
        rlx_backend_destroy(both[order == 1]);
        if (order == 1)
            rlx_model_close(m);
        rlx_backend_destroy(both[order != 1]);
        if (order == 2)
            rlx_model_close(m);
    }
    return NULL;
}

static void test_stress_owners_and_backends_on_threads(void **state) {
    (void)state;
    enum { THREADS = 4, ROUNDS = 12 };
    pthread_t t[THREADS];
    stress_arg args[THREADS];
    const span_stats start = stats_now();
    for (int i = 0; i < THREADS; i++) {
        args[i] = (stress_arg){.rounds = ROUNDS, .seed = 17 + i};
        assert_int_equal(pthread_create(&t[i], NULL, stress_thread, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        if (args[i].failures)
            fail_msg("thread %d: %s", i, args[i].why);
    }
    const span_stats end = stats_now();
    assert_true(end.prepared - start.prepared >= THREADS * ROUNDS);
    assert_int_equal(end.live_handles, 0);
    assert_int_equal(end.prepared, end.released);
    assert_int_equal(end.spans_planned, end.spans_released);
    assert_int_equal(end.bad_calls, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abi10_backend_loads_and_is_never_offered_concat),
        cmocka_unit_test(test_fused_spans_match_per_node_and_reference),
        cmocka_unit_test(test_prepared_weights_live_with_their_owner),
        cmocka_unit_test(test_models_run_through_spans_with_weights_prepared_once),
        cmocka_unit_test(test_stress_owners_and_backends_on_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
