/* Values that are not numbers: the scheduler's per-node check (RLX_PLAN_CHECK_FINITE and
 * rlx_plan_run_checked) names the first node that writes a NaN or an infinity, its op, backend,
 * element and kind, in every block of a long output; a healthy graph computes the same values
 * with and without it. The generation loop refuses a logits row that is not finite instead of
 * drawing a token from it. (The session's own check and its trace to a model's layer run
 * through the CLI in tests/model/check_finite.py, on a model with a poisoned layer.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define ROWS 3
#define CHAIN 4

/* x -> d1 = x + x -> ... -> d4 (testutil.h): a value of x near FLT_MAX overflows a known node */
static rlx_graph *doubling_graph(int64_t cols, int *x, int *out) {
    return tu_doubling_chain(ROWS, cols, CHAIN, 0, x, out);
}

/* Runs the doubling graph over x with x[at] = bad, checked, and expects the message. */
static void expect_node(int64_t cols, int64_t at, float bad, const char *want) {
    int x, out;
    rlx_graph *g = doubling_graph(cols, &x, &out);
    rlx_plan *p;
    const rlx_plan_options o = {.size = sizeof o, .flags = RLX_PLAN_CHECK_FINITE};
    assert_ok(rlx_plan_create(g, &o, &p));
    float *data = calloc((size_t)(ROWS * cols), sizeof *data);
    assert_non_null(data);
    data[at] = bad;
    assert_ok(rlx_plan_bind(p, x, data));
    assert_int_equal(rlx_plan_run(p), RLX_E_RANGE);
    assert_error_mentions(want);
    rlx_plan_destroy(p);
    rlx_graph_destroy(g);
    free(data);
}

static void test_check_names_the_first_bad_node(void **state) {
    (void)state;
    /* 1e38 doubles to 2e38 (finite) in d1 and overflows in d2 */
    expect_node(5, 7, 1e38f, "node 'd2' (add on ref) wrote +Inf at element 7 of its [3, 5] output");
    expect_node(5, 0, -1e38f, "node 'd2' (add on ref) wrote -Inf at element 0 of its [3, 5] output");
    /* an input is not checked: the first node reading it is named */
    expect_node(5, 14, NAN, "node 'd1' (add on ref) wrote NaN at element 14 of its [3, 5] output");
    /* a long output scanned block by block: a bad value past the first blocks, and in the last
     * value of a partial block */
    expect_node(5000, 9001, INFINITY, "node 'd1' (add on ref) wrote +Inf at element 9001 of its [3, 5000] output");
    expect_node(5000, 14999, -INFINITY, "wrote -Inf at element 14999 of");
}

/* Without the flag a run leaves the infinity in the output; rlx_plan_run_checked on the same
 * plan finds it; a healthy input gives the same values either way. */
static void test_checked_run_of_a_plain_plan(void **state) {
    (void)state;
    int x, out;
    rlx_graph *g = doubling_graph(5, &x, &out);
    rlx_plan *p, *checked;
    assert_ok(rlx_plan_create(g, NULL, &p));
    const rlx_plan_options o = {.size = sizeof o, .flags = RLX_PLAN_CHECK_FINITE};
    assert_ok(rlx_plan_create(g, &o, &checked));
    float data[ROWS * 5];
    for (int i = 0; i < ROWS * 5; i++)
        data[i] = (float)i - 7.5f;
    assert_ok(rlx_plan_bind(p, x, data));
    assert_ok(rlx_plan_bind(checked, x, data));
    assert_ok(rlx_plan_run(p));
    assert_ok(rlx_plan_run(checked));
    const float *a = rlx_plan_data(p, out), *b = rlx_plan_data(checked, out);
    for (int i = 0; i < ROWS * 5; i++) {
        assert_float_equal(a[i], data[i] * (1 << CHAIN), 0);
        assert_float_equal(b[i], a[i], 0);
    }
    data[3] = 3e38f;
    assert_ok(rlx_plan_run(p));
    assert_true(isinf(((const float *)rlx_plan_data(p, out))[3]));
    assert_int_equal(rlx_plan_run_checked(p), RLX_E_RANGE);
    assert_error_mentions("node 'd1' (add on ref) wrote +Inf at element 3");
    rlx_plan_destroy(p);
    rlx_plan_destroy(checked);
    rlx_graph_destroy(g);
}

#define VOCAB 300

/* An lm that hands out given logits rows, as a pipeline driver hands out its last stage's: row
 * k is the logits after the k-th forward. */
typedef struct rows_lm {
    const float *rows;
    uint32_t length, n_forward;
} rows_lm;

static rlx_status rows_forward(void *self, const int32_t *ids, uint32_t n, int all_rows, const float **logits) {
    (void)ids;
    (void)all_rows;
    rows_lm *r = self;
    r->length += n;
    *logits = r->rows + (size_t)r->n_forward++ * VOCAB;
    return RLX_OK;
}

static rlx_status rows_truncate(void *self, uint32_t length) {
    ((rows_lm *)self)->length = length;
    return RLX_OK;
}

static uint32_t rows_length(const void *self) { return ((const rows_lm *)self)->length; }
static uint32_t rows_capacity(const void *self) {
    (void)self;
    return 64;
}

static int count_token(void *ctx, int32_t token, const float *logits) {
    (void)token, (void)logits;
    (*(uint32_t *)ctx)++;
    return 0;
}

/* The row after the prompt and the first token are fine; the next holds a NaN: the loop reports
 * two tokens and fails naming the position and the index, never drawing from the bad row. */
static void test_generate_refuses_a_row_that_is_not_finite(void **state) {
    (void)state;
    static float rows[3 * VOCAB];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < VOCAB; i++)
            rows[k * VOCAB + i] = (float)((i * 7 + k) % 13);
    rows[2 * VOCAB + 42] = NAN;
    rows_lm r = {.rows = rows};
    const rlx_lm lm = {.self = &r,
                       .forward = rows_forward,
                       .truncate = rows_truncate,
                       .length = rows_length,
                       .capacity = rows_capacity,
                       .vocab = VOCAB};
    rlx_sampler_params p = rlx_sampler_params_default();
    p.greedy = 1;
    rlx_sampler *s;
    assert_ok(rlx_sampler_create(&p, VOCAB, &s));
    const int32_t prompt[] = {5, 6, 7};
    uint32_t n_tokens = 0;
    rlx_gen_stats st;
    assert_int_equal(rlx_generate(&lm, s, prompt, 3, 10, count_token, &n_tokens, &st), RLX_E_RANGE);
    assert_int_equal(n_tokens, 2);
    assert_int_equal(st.stop, RLX_GEN_STOP_NONE);
    /* positions 0-2 are the prompt, 3 and 4 the two tokens fed back */
    assert_error_mentions("the logits of position 4 are not finite (NaN at vocabulary index 42); the first layer or "
                          "op that produced it is found with --check-finite");
    /* a bad row right after the prompt: no token at all */
    rows[42] = -INFINITY;
    r = (rows_lm){.rows = rows};
    n_tokens = 0;
    assert_int_equal(rlx_generate(&lm, s, prompt, 3, 10, count_token, &n_tokens, &st), RLX_E_RANGE);
    assert_int_equal(n_tokens, 0);
    assert_error_mentions("the logits of position 2 are not finite (-Inf at vocabulary index 42)");
    rlx_sampler_destroy(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_names_the_first_bad_node),
        cmocka_unit_test(test_checked_run_of_a_plain_plan),
        cmocka_unit_test(test_generate_refuses_a_row_that_is_not_finite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
