/* ABI 1.5's ROPE with frequency factors (a third input F32[D/2], Llama 3.1's scaled RoPE): the
 * graph checks the input, an older backend claiming every node is never asked about it (the
 * reference kernels run it) while a plain ROPE still goes to it, and the reference turns pair i
 * by pos * theta^(-2i/D) / factors[i]. */
#include <math.h>

#include "testutil.h"

enum { D = 8, HALF = D / 2, HEADS = 2, T = 3 };

static const rlx_op_params params = {.rope_theta = 100.0f, .head_dim = D};

static int offered_rope(rlx_backend *b, uint32_t n_inputs) {
    const rlx_tensor in[3] = {{.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, HEADS * D, 1, 1}},
                              {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {T, 1, 1, 1}},
                              {.dtype = RLX_DTYPE_F32, .n_dims = 1, .shape = {HALF, 1, 1, 1}}};
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, HEADS * D, 1, 1}};
    const rlx_node_view v = {
        .op = RLX_OP_ROPE, .n_inputs = n_inputs, .inputs = in, .output = &o, .params = &params, .name = "rope"};
    return rlx_backend_supports(b, &v);
}

static void test_rope_factors(void **state) {
    (void)state;
    rlx_plugin_handle *h13;
    rlx_backend *b13;
    assert_ok(rlx_plugin_load(RLX_TEST_ABI13, &h13));
    assert_ok(rlx_backend_create(h13, NULL, &b13));
    assert_true(offered_rope(b13, 2));
    assert_false(offered_rope(b13, 3));

    static float factors[HALF] = {1.0f, 1.5f, 4.0f, 8.0f};
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    const int x = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "x", RLX_DTYPE_F32, 2, (int64_t[]){T, HEADS * D}, NULL);
    const int pos = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "pos", RLX_DTYPE_I32, 1, (int64_t[]){T}, NULL);
    const int ff = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "ff", RLX_DTYPE_F32, 1, (int64_t[]){HALF}, factors);
    /* the factors must be F32 [D/2] */
    const int short_ff =
        rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "short", RLX_DTYPE_F32, 1, (int64_t[]){HALF - 1}, factors);
    static uint16_t half_ff[HALF];
    const int f16_ff = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "f16", RLX_DTYPE_F16, 1, (int64_t[]){HALF}, half_ff);
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ROPE, "bad", (int[]){x, pos, short_ff}, 3, &params), RLX_E_SHAPE);
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ROPE, "bad", (int[]){x, pos, f16_ff}, 3, &params), RLX_E_SHAPE);
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ROPE, "bad", (int[]){x, pos, ff, ff}, 4, &params), RLX_E_INVALID);
    const int rope = rlx_graph_add_node(g, RLX_OP_ROPE, "rope", (int[]){x, pos, ff}, 3, &params);
    assert_true(rope >= 0);
    assert_ok(rlx_graph_mark_output(g, rope));
    rlx_plan *p;
    assert_ok(rlx_plan_create(
        g, &(rlx_plan_options){.size = sizeof(rlx_plan_options), .backends = &b13, .n_backends = 1}, &p));
    assert_string_equal(rlx_plan_node_backend(p, 0), "ref");
    float xd[T * HEADS * D];
    for (int i = 0; i < T * HEADS * D; i++)
        xd[i] = (float)(i % 11) * 0.125f - 0.5f;
    int32_t pd[T] = {0, 5, 17};
    assert_ok(rlx_plan_bind(p, x, xd));
    assert_ok(rlx_plan_bind(p, pos, pd));
    assert_ok(rlx_plan_run(p));
    const float *out = rlx_plan_data(p, rope);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HEADS; h++)
            for (int i = 0; i < HALF; i++) {
                const double angle = pd[t] * pow(100.0, -2.0 * i / D) / factors[i];
                const float *in = xd + (t * HEADS + h) * D;
                const float *y = out + (t * HEADS + h) * D;
                assert_float_equal(y[i], in[i] * cos(angle) - in[i + HALF] * sin(angle), 1e-6);
                assert_float_equal(y[i + HALF], in[i + HALF] * cos(angle) + in[i] * sin(angle), 1e-6);
            }
    rlx_plan_destroy(p);
    rlx_graph_destroy(g);
    rlx_backend_destroy(b13);
    rlx_plugin_unload(h13);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_factors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
