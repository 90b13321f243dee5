/* ABI 1.4's additions are never offered to an older backend: a 1.3 backend that claims every
 * node is not asked about GATHER_ROWS or an ATTENTION with slots or F16 caches (the reference
 * kernels run them), while the 1.3 form of ATTENTION still goes to it; the 1.0 backend, which
 * says yes to ops it does not know, is not asked about GATHER_ROWS either. */
#include "testutil.h"

enum { D = 8, HQ = 2, HKV = 1, S = 2, C = 8, T = 3 };

static const rlx_op_params params = {.scale = 0.5f, .head_dim = D, .n_heads = HQ, .n_kv_heads = HKV};

/* supports() through the core for an ATTENTION over caches of dtype dt, with slots or not */
static int offered_attention(rlx_backend *b, uint32_t dt, int slots) {
    const rlx_tensor cache = slots ? (rlx_tensor){.dtype = dt, .n_dims = 3, .shape = {S, C, HKV * D, 1}}
                                   : (rlx_tensor){.dtype = dt, .n_dims = 2, .shape = {C, HKV * D, 1, 1}};
    const rlx_tensor in[7] = {
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, HQ * D, 1, 1}},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, HKV * D, 1, 1}},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, HKV * D, 1, 1}},
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {T, 1, 1, 1}},
        cache,
        cache,
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {T, 1, 1, 1}},
    };
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, HQ * D, 1, 1}};
    const rlx_node_view v = {.op = RLX_OP_ATTENTION,
                             .n_inputs = slots ? 7 : 6,
                             .inputs = in,
                             .output = &o,
                             .params = &params,
                             .name = "attn"};
    return rlx_backend_supports(b, &v);
}

static int offered_gather_rows(rlx_backend *b) {
    const rlx_tensor in[2] = {{.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, 4, 1, 1}},
                              {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {1, 1, 1, 1}}};
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, 4, 1, 1}};
    const rlx_node_view v = {.op = RLX_OP_GATHER_ROWS, .n_inputs = 2, .inputs = in, .output = &o, .name = "rows"};
    return rlx_backend_supports(b, &v);
}

static void test_older_backends_are_never_offered_the_new_forms(void **state) {
    (void)state;
    rlx_plugin_handle *h13, *h10;
    rlx_backend *b13, *b10;
    assert_ok(rlx_plugin_load(RLX_TEST_ABI13, &h13));
    assert_ok(rlx_backend_create(h13, NULL, &b13));
    assert_int_equal(rlx_backend_abi_minor(b13), 3);
    assert_true(offered_attention(b13, RLX_DTYPE_F32, 0));
    assert_false(offered_attention(b13, RLX_DTYPE_F32, 1));
    assert_false(offered_attention(b13, RLX_DTYPE_F16, 0));
    assert_false(offered_attention(b13, RLX_DTYPE_F16, 1));
    assert_false(offered_gather_rows(b13));
    assert_ok(rlx_plugin_load(RLX_TEST_PLUGIN_DIR "/rlx-test-abi10.so", &h10));
    assert_ok(rlx_backend_create(h10, NULL, &b10));
    assert_false(offered_gather_rows(b10));
    /* the reference kernels are asked about everything */
    rlx_backend *ref;
    assert_ok(rlx_backend_create_ref(NULL, &ref));
    assert_true(offered_attention(ref, RLX_DTYPE_F16, 1));
    assert_true(offered_gather_rows(ref));
    rlx_backend_destroy(ref);
    rlx_backend_destroy(b10);
    rlx_plugin_unload(h10);

    /* planned: the slots and the gather run on the reference kernels, and a run succeeds (the
     * 1.3 backend fails every node it is given) */
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    const int q = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "q", RLX_DTYPE_F32, 2, (int64_t[]){T, HQ * D}, NULL);
    const int k = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "k", RLX_DTYPE_F32, 2, (int64_t[]){T, HKV * D}, NULL);
    const int pos = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "pos", RLX_DTYPE_I32, 1, (int64_t[]){T}, NULL);
    const int seq = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "seq", RLX_DTYPE_I32, 1, (int64_t[]){T}, NULL);
    const int idx = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "idx", RLX_DTYPE_I32, 1, (int64_t[]){1}, NULL);
    const int kc = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "kc", RLX_DTYPE_F16, 3, (int64_t[]){S, C, HKV * D}, NULL);
    const int vc = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "vc", RLX_DTYPE_F16, 3, (int64_t[]){S, C, HKV * D}, NULL);
    const int att = rlx_graph_add_node(g, RLX_OP_ATTENTION, "attn", (int[]){q, k, k, pos, kc, vc, seq}, 7, &params);
    const int rows = rlx_graph_add_node(g, RLX_OP_GATHER_ROWS, "rows", (int[]){att, idx}, 2, NULL);
    assert_ok(rlx_graph_mark_output(g, rows));
    rlx_plan *p;
    assert_ok(rlx_plan_create(
        g, &(rlx_plan_options){.size = sizeof(rlx_plan_options), .backends = &b13, .n_backends = 1}, &p));
    assert_string_equal(rlx_plan_node_backend(p, 0), "ref");
    assert_string_equal(rlx_plan_node_backend(p, 1), "ref");
    float qd[T * HQ * D], kd[T * HKV * D];
    for (int i = 0; i < T * HQ * D; i++)
        qd[i] = (float)(i % 7) * 0.25f;
    for (int i = 0; i < T * HKV * D; i++)
        kd[i] = (float)(i % 5) * 0.5f;
    int32_t pd[T] = {0, 1, 0}, sd[T] = {1, 1, 0}, id[1] = {1};
    uint16_t kcd[S * C * HKV * D] = {0}, vcd[S * C * HKV * D] = {0};
    assert_ok(rlx_plan_bind(p, q, qd));
    assert_ok(rlx_plan_bind(p, k, kd));
    assert_ok(rlx_plan_bind(p, pos, pd));
    assert_ok(rlx_plan_bind(p, seq, sd));
    assert_ok(rlx_plan_bind(p, idx, id));
    assert_ok(rlx_plan_bind(p, kc, kcd));
    assert_ok(rlx_plan_bind(p, vc, vcd));
    assert_ok(rlx_plan_run(p));
    /* row 1 (slot 1, position 1) averages k rows 0 and 1 of slot 1 with their softmax weights */
    const float *out = rlx_plan_data(p, rows);
    assert_true(out[0] > 0.0f && out[0] < 2.0f);
    assert_int_equal(vcd[(1 * C + 1) * HKV * D + 1], rlx_iface_f32_to_f16(kd[1 * HKV * D + 1]));
    rlx_plan_destroy(p);
    rlx_graph_destroy(g);

    /* the 1.3 form still goes to the 1.3 backend */
    assert_ok(rlx_graph_create(&g));
    const int q2 = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "q", RLX_DTYPE_F32, 2, (int64_t[]){T, HQ * D}, NULL);
    const int k2 = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "k", RLX_DTYPE_F32, 2, (int64_t[]){T, HKV * D}, NULL);
    const int pos2 = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "pos", RLX_DTYPE_I32, 1, (int64_t[]){T}, NULL);
    const int c2 = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "kc", RLX_DTYPE_F32, 2, (int64_t[]){C, HKV * D}, NULL);
    const int att2 = rlx_graph_add_node(g, RLX_OP_ATTENTION, "attn", (int[]){q2, k2, k2, pos2, c2, c2}, 6, &params);
    assert_ok(rlx_graph_mark_output(g, att2));
    assert_ok(rlx_plan_create(
        g, &(rlx_plan_options){.size = sizeof(rlx_plan_options), .backends = &b13, .n_backends = 1}, &p));
    assert_string_equal(rlx_plan_node_backend(p, 0), "abi13");
    rlx_plan_destroy(p);
    rlx_graph_destroy(g);
    rlx_backend_destroy(b13);
    rlx_plugin_unload(h13);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_older_backends_are_never_offered_the_new_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
