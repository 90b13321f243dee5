/* ATTENTION with slots and F16 caches, and GATHER_ROWS (ABI 1.4): what the graph accepts, and
 * the reference kernels' semantics beyond one call, which the NumPy fixtures of the conformance
 * kit (apps/rlx-conformance/gen_expectations.py) cannot show: a prompt cut into chunks gives the
 * rows of one call, a row does not depend on the other slots' rows, F16 stores round to nearest
 * even (checked against hand-worked bit patterns), and malformed rows are refused before any
 * cache row is written. */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

enum { D = 8, HQ = 4, HKV = 2, KV = HKV * D, S = 3, C = 24 };

static uint64_t rng = 1;

static const rlx_op_params params = {.scale = 0.35f, .head_dim = D, .n_heads = HQ, .n_kv_heads = HKV};

/* One call: rows t < T of q[T, HQ*D], k and v [T, KV] (row t of all of them drawn from
 * seed + pos[t] + 1000 seq[t], so a row is the same whatever call it is in), into caches
 * [S, C, KV] of dtype dt (or [C, KV] when seq is NULL); output [T, HQ*D]. */
static int run(rlx_backend *ref, const int32_t *seq, const int32_t *pos, int64_t T, uint32_t dt, void *kc, void *vc,
               float *out) {
    float *q = malloc((size_t)T * HQ * D * sizeof *q), *k = malloc((size_t)T * KV * sizeof *k),
          *v = malloc((size_t)T * KV * sizeof *v);
    for (int64_t t = 0; t < T; t++) {
        rng = 77 + (uint64_t)pos[t] + 1000u * (uint64_t)(seq ? seq[t] : 0);
        for (int i = 0; i < HQ * D; i++)
            q[t * HQ * D + i] = tu_uniform(&rng);
        for (int i = 0; i < KV; i++) {
            k[t * KV + i] = 2 * tu_uniform(&rng);
            v[t * KV + i] = tu_uniform(&rng);
        }
    }
    const rlx_tensor cache = seq ? (rlx_tensor){.dtype = dt, .n_dims = 3, .shape = {S, C, KV, 1}}
                                 : (rlx_tensor){.dtype = dt, .n_dims = 2, .shape = {C, KV, 1, 1}};
    rlx_tensor in[7] = {
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, HQ * D, 1, 1}, .data = q},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, KV, 1, 1}, .data = k},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, KV, 1, 1}, .data = v},
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {T, 1, 1, 1}, .data = (void *)pos},
        cache,
        cache,
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {T, 1, 1, 1}, .data = (void *)seq},
    };
    in[4].data = kc;
    in[5].data = vc;
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, HQ * D, 1, 1}, .data = out};
    const rlx_node_view n = {.op = RLX_OP_ATTENTION,
                             .n_inputs = seq ? 7 : 6,
                             .inputs = in,
                             .output = &o,
                             .params = &params,
                             .name = "layers.2.attn"};
    const int rc = rlx_backend_compute(ref, &n);
    free(q), free(k), free(v);
    return rc;
}

/* Caches of dtype dt with random contents (the earlier positions of every slot). */
static void *cache_new(uint32_t dt, uint64_t seed) {
    const size_t n = (size_t)S * C * KV;
    void *c = malloc(n * 4);
    rng = seed;
    for (size_t i = 0; i < n; i++) {
        const float x = tu_uniform(&rng);
        if (dt == RLX_DTYPE_F16)
            ((uint16_t *)c)[i] = rlx_iface_f32_to_f16(x);
        else
            ((float *)c)[i] = x;
    }
    return c;
}

static void *cache_copy(const void *c) {
    void *d = malloc((size_t)S * C * KV * 4);
    memcpy(d, c, (size_t)S * C * KV * 4);
    return d;
}

static size_t cache_bytes(uint32_t dt) { return (size_t)S * C * KV * rlx_iface_dtype_size(dt); }

// ---------------------------------------------------------------------------------------------
// Graph validation

static void test_graph_checks_slots_f16_caches_and_gather_rows(void **state) {
    (void)state;
    rlx_graph *g;
    assert_ok(rlx_graph_create(&g));
    const int q = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "q", RLX_DTYPE_F32, 2, (int64_t[]){5, HQ * D}, NULL);
    const int k = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "k", RLX_DTYPE_F32, 2, (int64_t[]){5, KV}, NULL);
    const int pos = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "pos", RLX_DTYPE_I32, 1, (int64_t[]){5}, NULL);
    const int seq = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "seq", RLX_DTYPE_I32, 1, (int64_t[]){5}, NULL);
    const int seq4 = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "seq4", RLX_DTYPE_I32, 1, (int64_t[]){4}, NULL);
    const int c2 = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "c2", RLX_DTYPE_F16, 2, (int64_t[]){C, KV}, NULL);
    const int c3 = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "c3", RLX_DTYPE_F16, 3, (int64_t[]){S, C, KV}, NULL);
    const int c3f = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "c3f", RLX_DTYPE_F32, 3, (int64_t[]){S, C, KV}, NULL);
    const int c3s = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "c3s", RLX_DTYPE_F16, 3, (int64_t[]){S, C + 1, KV}, NULL);
    const int cbf = rlx_graph_add_tensor(g, RLX_ROLE_STATE, "cbf", RLX_DTYPE_BF16, 2, (int64_t[]){C, KV}, NULL);
    /* the accepted forms: one F16 sequence (6 inputs), F16 slots with seq (7) */
    assert_true(rlx_graph_add_node(g, RLX_OP_ATTENTION, "a", (int[]){q, k, k, pos, c2, c2}, 6, &params) >= 0);
    const int y = rlx_graph_add_node(g, RLX_OP_ATTENTION, "b", (int[]){q, k, k, pos, c3, c3, seq}, 7, &params);
    assert_true(y >= 0);
    assert_int_equal(rlx_graph_tensor(g, y)->shape[0], 5);
    assert_int_equal(rlx_graph_tensor(g, y)->shape[1], HQ * D);
    /* slots without seq, seq without slots, seq of the wrong length */
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ATTENTION, "c", (int[]){q, k, k, pos, c3, c3}, 6, &params),
                     RLX_E_INVALID);
    assert_error_mentions("takes 7 inputs with 3-D");
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ATTENTION, "d", (int[]){q, k, k, pos, c2, c2, seq}, 7, &params),
                     RLX_E_INVALID);
    assert_error_mentions("takes 6 inputs with 2-D");
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ATTENTION, "e", (int[]){q, k, k, pos, c3, c3, seq4}, 7, &params),
                     RLX_E_SHAPE);
    assert_error_mentions("input 6 'seq4'");
    /* caches of different dtypes or shapes, or of a dtype other than F32 and F16 */
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ATTENTION, "f", (int[]){q, k, k, pos, c3, c3f, seq}, 7, &params),
                     RLX_E_SHAPE);
    assert_error_mentions("input 5 'c3f'");
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ATTENTION, "g", (int[]){q, k, k, pos, c3, c3s, seq}, 7, &params),
                     RLX_E_SHAPE);
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_ATTENTION, "h", (int[]){q, k, k, pos, cbf, cbf}, 6, &params),
                     RLX_E_SHAPE);
    assert_error_mentions("an f32, f16 or q8_0 (head_dim % 32 == 0) cache");
    /* GATHER_ROWS: R rows of x's width; idx must be I32[R] */
    const int idx = rlx_graph_add_tensor(g, RLX_ROLE_INPUT, "idx", RLX_DTYPE_I32, 1, (int64_t[]){3}, NULL);
    const int r = rlx_graph_add_node(g, RLX_OP_GATHER_ROWS, "rows", (int[]){q, idx}, 2, NULL);
    assert_true(r >= 0);
    assert_int_equal(rlx_graph_tensor(g, r)->shape[0], 3);
    assert_int_equal(rlx_graph_tensor(g, r)->shape[1], HQ * D);
    assert_string_equal(rlx_op_name(RLX_OP_GATHER_ROWS), "gather_rows");
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_GATHER_ROWS, "bad", (int[]){q, k}, 2, NULL), RLX_E_SHAPE);
    assert_int_equal(rlx_graph_add_node(g, RLX_OP_GATHER_ROWS, "three", (int[]){q, idx, idx}, 3, NULL), RLX_E_INVALID);
    rlx_graph_destroy(g);
}

// ---------------------------------------------------------------------------------------------
// Reference kernels

/* Slot 1's prompt at positions 0..9 as one call, as two chunks (0..3, 4..9), and interleaved with
 * other slots' rows (a decode row of slot 0, a chunk of slot 2): each row's output and the
 * caches are the same bits every time. */
static void test_ref_rows_do_not_depend_on_the_batch(void **state) {
    (void)state;
    static const uint32_t dts[2] = {RLX_DTYPE_F32, RLX_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        rlx_backend *ref;
        assert_ok(rlx_backend_create_ref(NULL, &ref));
        const uint32_t dt = dts[d];
        void *kc = cache_new(dt, 5), *vc = cache_new(dt, 6), *kc2 = cache_copy(kc), *vc2 = cache_copy(vc);
        float one[10 * HQ * D], chunked[10 * HQ * D], mixed[13 * HQ * D];
        int32_t seq[13], pos[13];
        for (int t = 0; t < 10; t++)
            seq[t] = 1, pos[t] = t;
        assert_ok(run(ref, seq, pos, 10, dt, kc, vc, one));
        assert_ok(run(ref, seq, pos, 4, dt, kc2, vc2, chunked));
        assert_ok(run(ref, seq + 4, pos + 4, 6, dt, kc2, vc2, chunked + 4 * HQ * D));
        assert_memory_equal(one, chunked, sizeof one);
        assert_memory_equal(kc, kc2, cache_bytes(dt));
        assert_memory_equal(vc, vc2, cache_bytes(dt));
        /* rows: slot 2 at 7, slot 1 at 0..9 with slot 0 at 20 after its third, slot 2 at 8 last */
        const int32_t mseq[13] = {2, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 2};
        const int32_t mpos[13] = {7, 0, 1, 2, 20, 3, 4, 5, 6, 7, 8, 9, 8};
        void *kc3 = cache_new(dt, 5), *vc3 = cache_new(dt, 6);
        assert_ok(run(ref, mseq, mpos, 13, dt, kc3, vc3, mixed));
        for (int t = 0, row = 0; t < 13; t++)
            if (mseq[t] == 1)
                assert_memory_equal(mixed + t * HQ * D, one + row++ * HQ * D, HQ * D * sizeof(float));
        /* slot 1 as stored by the one call; the other slots hold their new rows as well */
        const size_t slot = (size_t)C * KV * rlx_iface_dtype_size(dt);
        assert_memory_equal((char *)kc3 + slot, (char *)kc + slot, slot);
        assert_memory_not_equal((char *)kc3 + 2 * slot, (char *)kc + 2 * slot, slot);
        free(kc), free(vc), free(kc2), free(vc2), free(kc3), free(vc3);
        rlx_backend_destroy(ref);
    }
}

/* F16 stores round to nearest even, overflow to infinity; the F32 values below are hand-worked
 * against IEEE binary16 (1 + 2^-11 is a tie between 1 and 1 + 2^-10). */
static void test_ref_rounds_f16_cache_rows_to_nearest_even(void **state) {
    (void)state;
    rlx_backend *ref;
    assert_ok(rlx_backend_create_ref(NULL, &ref));
    static const float values[6] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, 65519.0f, 65520.0f, -1e6f};
    static const uint16_t bits[6] = {0x3c00, 0x3c02, 0x7bff, 0x7bff, 0x7c00, 0xfc00};
    uint16_t kc[C * KV] = {0}, vc[C * KV] = {0};
    float q[HQ * D] = {0}, k[KV] = {0}, v[KV] = {0}, out[HQ * D];
    memcpy(v, values, sizeof values);
    memcpy(k, values, 2 * sizeof(float)); /* finite scores: q is 0 */
    const int32_t pos = 9;
    rlx_tensor in[6] = {
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HQ * D, 1, 1}, .data = q},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, KV, 1, 1}, .data = k},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, KV, 1, 1}, .data = v},
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {1, 1, 1, 1}, .data = (void *)&pos},
        {.dtype = RLX_DTYPE_F16, .n_dims = 2, .shape = {C, KV, 1, 1}, .data = kc},
        {.dtype = RLX_DTYPE_F16, .n_dims = 2, .shape = {C, KV, 1, 1}, .data = vc},
    };
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HQ * D, 1, 1}, .data = out};
    const rlx_node_view n = {
        .op = RLX_OP_ATTENTION, .n_inputs = 6, .inputs = in, .output = &o, .params = &params, .name = "attn"};
    assert_ok(rlx_backend_compute(ref, &n));
    for (int i = 0; i < 6; i++)
        assert_int_equal(vc[pos * KV + i], bits[i]);
    assert_int_equal(kc[pos * KV + 1], 0x3c02);
    /* all scores are 0: head 0 averages the 10 stored rows of its KV head, 9 of them zero */
    assert_float_equal(out[0], 1.0f / 10, 1e-7);
    assert_float_equal(out[1], (1.0f + 0x1p-9f) / 10, 1e-7); /* 0x3c02 */
    rlx_backend_destroy(ref);
}

/* Rejected rows leave the caches untouched: they are checked before the first is written. */
static void expect_refused(rlx_backend *ref, const int32_t *seq, const int32_t *pos, int64_t T, int status,
                           const char *message) {
    void *kc = cache_new(RLX_DTYPE_F16, 5), *vc = cache_new(RLX_DTYPE_F16, 6), *before = cache_copy(kc);
    float out[4 * HQ * D];
    assert_int_equal(run(ref, seq, pos, T, RLX_DTYPE_F16, kc, vc, out), status);
    assert_error_mentions(message);
    assert_memory_equal(kc, before, cache_bytes(RLX_DTYPE_F16));
    free(kc), free(vc), free(before);
}

static void test_ref_refuses_rows_outside_the_cache_and_repeated_positions(void **state) {
    (void)state;
    rlx_backend *ref;
    assert_ok(rlx_backend_create_ref(NULL, &ref));
    expect_refused(ref, (int32_t[]){0, 3}, (int32_t[]){1, 1}, 2, RLX_E_RANGE,
                   "node 'layers.2.attn' (attention): row 1: slot 3 is outside the cache's 3 slots");
    expect_refused(ref, (int32_t[]){0, -1}, (int32_t[]){1, 1}, 2, RLX_E_RANGE, "row 1: slot -1");
    expect_refused(ref, (int32_t[]){2, 1, 0}, (int32_t[]){1, 2, C}, 3, RLX_E_RANGE,
                   "row 2: position 24 is outside the KV cache of 24 positions");
    expect_refused(ref, NULL, (int32_t[]){-1}, 1, RLX_E_RANGE, "row 0: position -1");
    /* a repeated (slot, position), and a slot's positions out of order */
    expect_refused(ref, (int32_t[]){0, 1, 0}, (int32_t[]){3, 3, 3}, 3, RLX_E_INVALID,
                   "row 2: position 3 of slot 0 does not follow position 3");
    expect_refused(ref, (int32_t[]){2, 2}, (int32_t[]){5, 4}, 2, RLX_E_INVALID, "row 1: position 4 of slot 2");
    expect_refused(ref, NULL, (int32_t[]){4, 4}, 2, RLX_E_INVALID, "row 1: position 4 of slot 0");
    /* one position in several slots is fine */
    void *kc = cache_new(RLX_DTYPE_F16, 5), *vc = cache_new(RLX_DTYPE_F16, 6);
    float out[3 * HQ * D];
    assert_ok(run(ref, (int32_t[]){0, 1, 2}, (int32_t[]){3, 3, 3}, 3, RLX_DTYPE_F16, kc, vc, out));
    free(kc), free(vc);
    rlx_backend_destroy(ref);
}

static void test_ref_gathers_rows_and_refuses_bad_indices(void **state) {
    (void)state;
    rlx_backend *ref;
    assert_ok(rlx_backend_create_ref(NULL, &ref));
    float x[4 * 3] = {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32}, y[3 * 3];
    int32_t idx[3] = {3, 0, 3};
    const rlx_tensor in[2] = {{.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {4, 3, 1, 1}, .data = x},
                              {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {3, 1, 1, 1}, .data = idx}};
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {3, 3, 1, 1}, .data = y};
    const rlx_node_view n = {.op = RLX_OP_GATHER_ROWS, .n_inputs = 2, .inputs = in, .output = &o, .name = "logit_rows"};
    assert_ok(rlx_backend_compute(ref, &n));
    const float want[9] = {30, 31, 32, 0, 1, 2, 30, 31, 32};
    assert_memory_equal(y, want, sizeof want);
    idx[1] = 4;
    assert_int_equal(rlx_backend_compute(ref, &n), RLX_E_RANGE);
    assert_error_mentions("node 'logit_rows' (gather_rows): index 1 is 4, outside the 4 rows of x");
    idx[1] = -1;
    assert_int_equal(rlx_backend_compute(ref, &n), RLX_E_RANGE);
    rlx_backend_destroy(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_checks_slots_f16_caches_and_gather_rows),
        cmocka_unit_test(test_ref_rows_do_not_depend_on_the_batch),
        cmocka_unit_test(test_ref_rounds_f16_cache_rows_to_nearest_even),
        cmocka_unit_test(test_ref_refuses_rows_outside_the_cache_and_repeated_positions),
        cmocka_unit_test(test_ref_gathers_rows_and_refuses_bad_indices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
