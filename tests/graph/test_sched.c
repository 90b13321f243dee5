/* The scheduler: liveness-based arena reuse, correct results through reused buffers, placement
 * by capability with the reference kernels as fallback, and unbound inputs refused. */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

#define ROWS 3
#define COLS 5
#define CHAIN 10

/* x -> d1 = x + x -> ... -> d10 -> its last row (testutil.h) */
static rlx_graph *chain_graph(int *x, int *out) { return tu_doubling_chain(ROWS, COLS, CHAIN, 1, x, out); }

static void test_arena_reuses_dead_buffers(void **state) {
    (void)state;
    int x, out;
    rlx_graph *g = chain_graph(&x, &out);
    rlx_plan *p;
    assert_ok(rlx_plan_create(g, NULL, &p));
    size_t one = 64; /* 15 floats rounded up to the 64-byte alignment */
    assert_int_equal(rlx_plan_total_activation_bytes(p), (CHAIN + 1) * one);
    /* never more than a node's input and its output alive at once */
    assert_int_equal(rlx_plan_peak_bytes(p), 2 * one);
    float data[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++)
        data[i] = (float)i;
    assert_ok(rlx_plan_bind(p, x, data));
    assert_ok(rlx_plan_run(p));
    const float *y = rlx_plan_data(p, out);
    for (int j = 0; j < COLS; j++)
        assert_float_equal(y[j], data[(ROWS - 1) * COLS + j] * (1 << CHAIN), 0);
    rlx_plan_destroy(p);
    rlx_graph_destroy(g);
}

static void test_unbound_input_is_refused(void **state) {
    (void)state;
    int x, out;
    rlx_graph *g = chain_graph(&x, &out);
    rlx_plan *p;
    assert_ok(rlx_plan_create(g, NULL, &p));
    assert_int_equal(rlx_plan_run(p), RLX_E_INVALID);
    assert_error_mentions("'x' is not bound");
    assert_int_equal(rlx_plan_bind(p, out, NULL), RLX_E_INVALID);
    rlx_plan_destroy(p);
    rlx_graph_destroy(g);
}

static void test_nodes_go_to_the_backend_that_supports_them(void **state) {
    (void)state;
    rlx_plugin_handle *h;
    assert_ok(rlx_plugin_load(RLX_TEST_PLUGIN_DIR "/rlx-test-add-only.so", &h));
    rlx_backend *b;
    assert_ok(rlx_backend_create(h, NULL, &b));
    int x, out;
    rlx_graph *g = chain_graph(&x, &out);
    rlx_plan *p;
    assert_ok(
        rlx_plan_create(g, &(rlx_plan_options){.size = sizeof(rlx_plan_options), .backends = &b, .n_backends = 1}, &p));
    for (uint32_t i = 0; i < CHAIN; i++)
        assert_string_equal(rlx_plan_node_backend(p, i), "Add-Only");
    assert_string_equal(rlx_plan_node_backend(p, CHAIN), "ref");
    float data[ROWS * COLS] = {[COLS * (ROWS - 1)] = 1.5f};
    assert_ok(rlx_plan_bind(p, x, data));
    assert_ok(rlx_plan_run(p));
    assert_float_equal(((const float *)rlx_plan_data(p, out))[0], 1.5f * (1 << CHAIN), 0);
    rlx_plan_destroy(p);
    rlx_graph_destroy(g);
    rlx_backend_destroy(b);
    rlx_plugin_unload(h);
}

static void test_placement_rules_pin_ops(void **state) {
    (void)state;
    rlx_plugin_handle *h;
    assert_ok(rlx_plugin_load(RLX_TEST_PLUGIN_DIR "/rlx-test-add-only.so", &h));
    rlx_backend *b, *ref;
    assert_ok(rlx_backend_create(h, NULL, &b));
    assert_ok(rlx_backend_create_ref(NULL, &ref));
    int x, out;
    rlx_graph *g = chain_graph(&x, &out);
    /* preference says ref for everything, the rule moves the additions */
    rlx_place_rule rule = {.op = RLX_OP_ADD, .backend = b};
    rlx_plan *p;
    assert_ok(rlx_plan_create(
        g,
        &(rlx_plan_options){
            .size = sizeof(rlx_plan_options), .backends = &ref, .n_backends = 1, .rules = &rule, .n_rules = 1},
        &p));
    assert_string_equal(rlx_plan_node_backend(p, 0), "Add-Only");
    assert_string_equal(rlx_plan_node_backend(p, CHAIN), "ref");
    assert_int_equal(rlx_plan_backend_switches(p), 1);
    rlx_plan_destroy(p);
    /* a rule for an op the backend cannot run is refused, naming both */
    rule.op = RLX_OP_GATHER_LAST;
    assert_int_equal(
        rlx_plan_create(
            g,
            &(rlx_plan_options){
                .size = sizeof(rlx_plan_options), .backends = &ref, .n_backends = 1, .rules = &rule, .n_rules = 1},
            &p),
        RLX_E_UNSUPPORTED);
    assert_error_mentions("'Add-Only'");
    assert_error_mentions("'last'");
    rlx_graph_destroy(g);
    rlx_backend_destroy(ref);
    rlx_backend_destroy(b);
    rlx_plugin_unload(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_reuses_dead_buffers),
        cmocka_unit_test(test_unbound_input_is_refused),
        cmocka_unit_test(test_nodes_go_to_the_backend_that_supports_them),
        cmocka_unit_test(test_placement_rules_pin_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
