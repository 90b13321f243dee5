/* The IR: tensor declarations, shape inference and its error messages, and the text dump. */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

static void test_add_node_infers_matmul_shape(void **state) {
    (void)state;
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    int x = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "x", RLX_DTYPE_F32, 2, (int64_t[]){3, 8}, NULL);
    static uint16_t w_data[16 * 8];
    int w = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "w", RLX_DTYPE_BF16, 2, (int64_t[]){16, 8}, w_data);
    int y = rlx_graph_add_node(g, RLX_OP_MATMUL, "proj", (int[]){x, w}, 2, NULL);
    assert_true(y >= 0);
    const rlx_tensor *t = rlx_graph_tensor(g, y);
    assert_int_equal(t->dtype, RLX_DTYPE_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 3);
    assert_int_equal(t->shape[1], 16);
    assert_int_equal(rlx_graph_n_nodes(g), 1);
    assert_int_equal(rlx_graph_find_tensor(g, "w"), w);
    assert_int_equal(rlx_graph_find_tensor(g, "nope"), RLX_E_NOT_FOUND);
    rlx_graph_destroy(g);
}

static void test_matmul_rejects_wrong_inner_dim(void **state) {
    (void)state;
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    int x = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "x", RLX_DTYPE_F32, 2, (int64_t[]){3, 8}, NULL);
    static float w_data[16 * 7];
    int w = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "wq", RLX_DTYPE_F32, 2, (int64_t[]){16, 7}, w_data);
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_MATMUL, "layers.0.q", (int[]){x, w}, 2, NULL), RLX_E_SHAPE);
    assert_error_mentions("layers.0.q");
    assert_error_mentions("'wq'");
    assert_error_mentions("[16,7]");
    assert_int_equal(rlx_graph_n_nodes(g), 0);
    rlx_graph_destroy(g);
}

static void test_concat_widens_rows_and_checks_row_count(void **state) {
    (void)state;
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    int a = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "a", RLX_DTYPE_F32, 2, (int64_t[]){3, 8}, NULL);
    int b = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "b", RLX_DTYPE_F32, 2, (int64_t[]){3, 5}, NULL);
    int short_b = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "short_b", RLX_DTYPE_F32, 2, (int64_t[]){2, 5}, NULL);
    int y = rlx_graph_add_node(g, RLX_OP_CONCAT, "mtp.concat", (int[]){a, b}, 2, NULL);
    assert_true(y >= 0);
    assert_int_equal(rlx_graph_tensor(g, y)->shape[0], 3);
    assert_int_equal(rlx_graph_tensor(g, y)->shape[1], 13);
    assert_string_equal(rlx_op_name(RLX_OP_CONCAT), "concat");
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_CONCAT, "bad", (int[]){a, short_b}, 2, NULL), RLX_E_SHAPE);
    assert_error_mentions("'short_b'");
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_CONCAT, "three", (int[]){a, b, b}, 3, NULL), RLX_E_INVALID);
    rlx_graph_destroy(g);
}

static void test_attention_checks_heads_and_cache(void **state) {
    (void)state;
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    int q = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "q", RLX_DTYPE_F32, 2, (int64_t[]){2, 4 * 8}, NULL);
    int k = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "k", RLX_DTYPE_F32, 2, (int64_t[]){2, 2 * 8}, NULL);
    int pos = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "pos", RLX_DTYPE_I32, 1, (int64_t[]){2}, NULL);
    int kc = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "kc", RLX_DTYPE_F32, 2, (int64_t[]){16, 2 * 8}, NULL);
    int bad_vc = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "vc", RLX_DTYPE_F32, 2, (int64_t[]){15, 2 * 8}, NULL);
    rlx_op_params p = {.head_dim = 8, .n_heads = 4, .n_kv_heads = 2, .scale = 0.35f};
    int in[6] = {q, k, k, pos, kc, kc};
    assert_true(rlx_graph_add_node(g, RLX_OP_ATTENTION, "attn", in, 6, &p) >= 0);
    in[5] = bad_vc;
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ATTENTION, "attn2", in, 6, &p), RLX_E_SHAPE);
    assert_error_mentions("'vc'");
    in[5] = kc;
    p.n_kv_heads = 3; /* 4 query heads cannot share 3 KV heads */
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ATTENTION, "attn3", in, 6, &p), RLX_E_INVALID);
    assert_error_mentions("kv heads");
    rlx_graph_destroy(g);
}

static void test_rms_norm_group_must_divide_row(void **state) {
    (void)state;
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    static float w_data[6];
    int x = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "x", RLX_DTYPE_F32, 2, (int64_t[]){1, 16}, NULL);
    int w = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "norm", RLX_DTYPE_F32, 1, (int64_t[]){6}, w_data);
    rlx_op_params p = {.eps = 1e-6f};
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_RMS_NORM, "n", (int[]){x, w}, 2, &p), RLX_E_SHAPE);
    assert_error_mentions("multiple");
    rlx_graph_destroy(g);
}

static void test_embed_needs_int_ids(void **state) {
    (void)state;
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    static float table[10 * 4];
    int ids = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "ids", RLX_DTYPE_F32, 1, (int64_t[]){3}, NULL);
    int t = rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "table", RLX_DTYPE_F32, 2, (int64_t[]){10, 4}, table);
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_EMBED, "embed", (int[]){ids, t}, 2, NULL), RLX_E_SHAPE);
    assert_error_mentions("token ids");
    rlx_graph_destroy(g);
}

static void test_tensor_declaration_errors(void **state) {
    (void)state;
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    assert_int_equal(rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "x", RLX_DTYPE_F32, 2, (int64_t[]){0, 4}, NULL),
                     RLX_E_SHAPE);
    assert_int_equal(rlx_graph_add_tensor(g, RLX_ROLE_WEIGHT, "w", RLX_DTYPE_F32, 1, (int64_t[]){4}, NULL),
                     RLX_E_INVALID);
    assert_int_equal(rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "x", (rlx_dtype)9, 1, (int64_t[]){4}, NULL),
                     RLX_E_INVALID);
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ADD, "a", (int[]){0, 1}, 2, NULL), RLX_E_INVALID);
    assert_int_equal(rlx_graph_n_tensors(g), 0);
    rlx_graph_destroy(g);
}

static void test_dump_lists_nodes_and_annotations(void **state) {
    (void)state;
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    int a = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "a", RLX_DTYPE_F32, 2, (int64_t[]){2, 4}, NULL);
    int s = rlx_graph_add_node(g, RLX_OP_ADD, "sum", (int[]){a, a}, 2, NULL);
    int last = rlx_graph_add_node(g, RLX_OP_GATHER_LAST, "last", &s, 1, NULL);
    assert_ok(rlx_graph_mark_output(g, last));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_ok(rlx_graph_dump(g, f, NULL, NULL));
    fclose(f);
    assert_non_null(strstr(buf, "input f32[2,4] a"));
    assert_non_null(strstr(buf, "= add(%0, %0) -> f32[2,4] sum"));
    assert_non_null(strstr(buf, "gather_last(%1) -> f32[1,4] last [output]"));
    free(buf);
    rlx_graph_destroy(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_node_infers_matmul_shape),
        cmocka_unit_test(test_matmul_rejects_wrong_inner_dim),
        cmocka_unit_test(test_concat_widens_rows_and_checks_row_count),
        cmocka_unit_test(test_attention_checks_heads_and_cache),
        cmocka_unit_test(test_rms_norm_group_must_divide_row),
        cmocka_unit_test(test_embed_needs_int_ids),
        cmocka_unit_test(test_tensor_declaration_errors),
        cmocka_unit_test(test_dump_lists_nodes_and_annotations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
