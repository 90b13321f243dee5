/* The backends' repacked quantized weights (kern_qrp.h, prepared at prepare_weight): a MATMUL
 * given its prepared handle gives the bits it gives without one (native weights, kern_qmatmul),
 * for decode and prefill token counts, N % 8 tails and a bias, on cpu-blas and onednn as built
 * beside this test; the types with a repacked form are prepared at all (so the comparison is
 * not of one path with itself); and EMBED of a table with a repacked copy reads the copy. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlx/backend.h"
#include "rlx/plugin.h"
#include "rlx/quant_iface.h"
#include "testutil.h"

static uint64_t rng = 7; /* tu_rand's */

/* Valid blocks of any type: random bytes, with every F16 in them (scales, minimums) kept small
 * and finite by clearing bits 2 and 6 of each byte, as bench_qgemv does. */
static uint8_t *random_weight(size_t bytes) {
    uint8_t *w = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        w[i] = (uint8_t)(tu_rand(&rng) & 0x3B);
    return w;
}

static const rlx_op_params no_params;

/* The MATMUL of inputs in into out, outside a plan. */
static rlx_node_view matmul_view(const rlx_tensor *in, rlx_tensor *out, void *const *prepared) {
    return (rlx_node_view){.op = RLX_OP_MATMUL,
                           .n_inputs = 3,
                           .inputs = in,
                           .output = out,
                           .params = &no_params,
                           .name = "mm",
                           .prepared = prepared,
                           .output_id = -1};
}

/* y[M, N] of the MATMUL, its weight's prepared handle given or not. */
static void run_matmul(rlx_backend *b, const rlx_tensor in[3], int64_t M, int64_t N, void *w_handle, float *y) {
    rlx_tensor out = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {M, N, 1, 1}, .data = y};
    void *prepared[3] = {NULL, w_handle, NULL};
    const rlx_node_view v = matmul_view(in, &out, prepared);
    for (int64_t i = 0; i < M * N; i++)
        y[i] = NAN;
    assert_int_equal(rlx_backend_supports(b, &v), 1);
    if (rlx_backend_compute(b, &v) != RLX_OK)
        fail_msg("compute: %s", rlx_last_error());
}

/* Backend name on 2 threads, loaded from the build tree; NULL (said) when it was not built. */
static rlx_backend *open_backend(const char *name, rlx_registry **reg, rlx_plugin_handle **plugin) {
    assert_int_equal(rlx_registry_create(RLX_BUILD_PLUGIN_DIR, reg), RLX_OK);
    if (rlx_registry_load(*reg, RLX_PLUGIN_BACKEND, name, plugin) != RLX_OK) {
        printf("  %s: not built (%s), skipped\n", name, rlx_last_error());
        rlx_registry_destroy(*reg);
        return NULL;
    }
    rlx_backend_options o = rlx_backend_options_default();
    o.n_threads = 2;
    rlx_backend *b;
    if (rlx_backend_create(*plugin, &o, &b) != RLX_OK)
        fail_msg("%s: open: %s", name, rlx_last_error());
    return b;
}

static void close_backend(rlx_backend *b, rlx_plugin_handle *plugin, rlx_registry *reg) {
    rlx_backend_destroy(b);
    rlx_plugin_unload(plugin);
    rlx_registry_destroy(reg);
}

static void check_backend(const char *name) {
    rlx_registry *reg;
    rlx_plugin_handle *plugin;
    rlx_backend *b = open_backend(name, &reg, &plugin);
    if (!b)
        return;
    assert_true(rlx_backend_features(b) & RLX_BACKEND_PREPARES_WEIGHTS);
    static const uint32_t types[] = {RLX_DTYPE_Q4_0, RLX_DTYPE_Q4_1, RLX_DTYPE_Q5_0, RLX_DTYPE_Q5_1,
                                     RLX_DTYPE_Q8_0, RLX_DTYPE_Q4_K, RLX_DTYPE_Q5_K, RLX_DTYPE_Q6_K};
    static const int64_t Ms[] = {1, 3, 12, 13, 40}, Ns[] = {5, 200};
    const int64_t K = 512;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            const int64_t N = Ns[ni];
            uint8_t *w = random_weight((size_t)N * rlx_iface_row_bytes(types[t], K));
            float *bias = malloc((size_t)N * sizeof(float));
            for (int64_t n = 0; n < N; n++)
                bias[n] = (float)(tu_rand(&rng) % 2001) / 1000.0f - 1.0f;
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int64_t M = Ms[mi];
                float *x = malloc((size_t)(M * K) * sizeof(float)), *y0 = malloc((size_t)(M * N) * sizeof(float)),
                      *y1 = malloc((size_t)(M * N) * sizeof(float));
                for (int64_t i = 0; i < M * K; i++)
                    x[i] = (float)(tu_rand(&rng) % 2001) / 500.0f - 2.0f;
                const rlx_tensor in[3] = {
                    {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {M, K, 1, 1}, .data = x},
                    {.dtype = types[t], .n_dims = 2, .shape = {N, K, 1, 1}, .data = w},
                    {.dtype = RLX_DTYPE_F32, .n_dims = 1, .shape = {N, 1, 1, 1}, .data = bias},
                };
                /* what planning shows prepare_weight: the node without data */
                rlx_tensor planned_in[3] = {in[0], in[1], in[2]}, planned_out = {
                                                                      .dtype = RLX_DTYPE_F32,
                                                                      .n_dims = 2,
                                                                      .shape = {M, N, 1, 1},
                                                                  };
                for (int i = 0; i < 3; i++)
                    planned_in[i].data = NULL;
                const rlx_node_view planned = matmul_view(planned_in, &planned_out, NULL);
                const rlx_weight_info info = {.size = sizeof info,
                                              .tensor = &in[1],
                                              .name = "mm.w",
                                              .op = RLX_OP_MATMUL,
                                              .input = 1,
                                              .node = &planned};
                void *h = NULL;
                if (rlx_backend_prepare_weight(b, &info, &h) != RLX_OK)
                    fail_msg("%s: prepare_weight: %s", name, rlx_last_error());
                if (!h)
                    fail_msg("%s did not repack a weight of dtype %u", name, types[t]);
                run_matmul(b, in, M, N, NULL, y0);
                run_matmul(b, in, M, N, h, y1);
                rlx_backend_release_weight(b, h);
                for (int64_t i = 0; i < M * N; i++)
                    if (memcmp(&y0[i], &y1[i], sizeof y0[i]))
                        fail_msg("%s, dtype %u, M %lld N %lld: y[%lld] %.9g repacked, %.9g native", name, types[t],
                                 (long long)M, (long long)N, (long long)i, y1[i], y0[i]);
                free(y1);
                free(y0);
                free(x);
            }
            free(bias);
            free(w);
        }
    close_backend(b, plugin, reg);
}

/* out[T, K] = EMBED of rows ids of table (no prepared handle: EMBED is never prepared). */
static void run_embed(rlx_backend *b, const rlx_tensor *table, const int32_t *ids, int64_t T, float *out) {
    const rlx_tensor in[2] = {{.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {T, 1, 1, 1}, .data = (void *)ids},
                              *table};
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {T, table->shape[1], 1, 1}, .data = out};
    const rlx_node_view v = {
        .op = RLX_OP_EMBED, .n_inputs = 2, .inputs = in, .output = &o, .params = &no_params, .name = "embed"};
    assert_int_equal(rlx_backend_supports(b, &v), 1);
    if (rlx_backend_compute(b, &v) != RLX_OK)
        fail_msg("embed: %s", rlx_last_error());
}

/* A tied table: once its output MATMUL use holds a repacked copy (and its mapped pages may be
 * gone), EMBED reads the rows from the copy. Shown by overwriting the table after preparing: the
 * rows must still be those of the original, for every type and for rows in whole groups and in
 * the native tail; after the release EMBED reads the table itself again. */
static void check_embed_reads_copy(const char *name) {
    rlx_registry *reg;
    rlx_plugin_handle *plugin;
    rlx_backend *b = open_backend(name, &reg, &plugin);
    if (!b)
        return;
    static const uint32_t types[] = {RLX_DTYPE_Q4_0, RLX_DTYPE_Q4_1, RLX_DTYPE_Q5_0, RLX_DTYPE_Q5_1,
                                     RLX_DTYPE_Q8_0, RLX_DTYPE_Q4_K, RLX_DTYPE_Q5_K, RLX_DTYPE_Q6_K};
    const int64_t V = 21, K = 512, T = 6; /* rows 16 .. 20 are the native tail */
    static const int32_t ids[6] = {20, 0, 7, 8, 15, 17};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const size_t bytes = (size_t)V * rlx_iface_row_bytes(types[t], K);
        uint8_t *w = random_weight(bytes), *orig = malloc(bytes);
        memcpy(orig, w, bytes);
        const rlx_tensor table = {.dtype = types[t], .n_dims = 2, .shape = {V, K, 1, 1}, .data = w};
        float *want = malloc((size_t)(T * K) * sizeof(float)), *got = malloc((size_t)(T * K) * sizeof(float));
        for (int64_t i = 0; i < T; i++)
            rlx_iface_dequant_row(types[t], orig + (size_t)ids[i] * rlx_iface_row_bytes(types[t], K), want + i * K, K);
        /* the output MATMUL's use, planned for one token */
        rlx_tensor planned_in[3] = {{.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, K, 1, 1}}, table, {0}};
        planned_in[1].data = NULL;
        rlx_tensor planned_out = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, V, 1, 1}};
        rlx_node_view planned = matmul_view(planned_in, &planned_out, NULL);
        planned.n_inputs = 2;
        const rlx_weight_info info = {.size = sizeof info,
                                      .tensor = &table,
                                      .name = "lm_head",
                                      .op = RLX_OP_MATMUL,
                                      .input = 1,
                                      .node = &planned};
        void *h = NULL;
        if (rlx_backend_prepare_weight(b, &info, &h) != RLX_OK || !h)
            fail_msg("%s: dtype %u not repacked: %s", name, types[t], rlx_last_error());
        for (size_t i = 0; i < bytes; i++)
            w[i] = (uint8_t)(tu_rand(&rng) & 0x3B);
        run_embed(b, &table, ids, T, got);
        if (memcmp(got, want, (size_t)(T * K) * sizeof(float)))
            fail_msg("%s, dtype %u: EMBED did not read the rows of the repacked copy", name, types[t]);
        rlx_backend_release_weight(b, h);
        for (int64_t i = 0; i < T; i++)
            rlx_iface_dequant_row(types[t], w + (size_t)ids[i] * rlx_iface_row_bytes(types[t], K), want + i * K, K);
        run_embed(b, &table, ids, T, got);
        if (memcmp(got, want, (size_t)(T * K) * sizeof(float)))
            fail_msg("%s, dtype %u: EMBED after the release did not read the table", name, types[t]);
        free(got);
        free(want);
        free(orig);
        free(w);
    }
    close_backend(b, plugin, reg);
}

static void test_cpu_blas_embed_reads_copy(void **state) {
    (void)state;
    check_embed_reads_copy("cpu-blas");
}

static void test_onednn_embed_reads_copy(void **state) {
    (void)state;
    check_embed_reads_copy("onednn");
}

static void test_cpu_blas_repacked_gives_native_bits(void **state) {
    (void)state;
    check_backend("cpu-blas");
}

static void test_onednn_repacked_gives_native_bits(void **state) {
    (void)state;
    check_backend("onednn");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_blas_repacked_gives_native_bits),
        cmocka_unit_test(test_onednn_repacked_gives_native_bits),
        cmocka_unit_test(test_cpu_blas_embed_reads_copy),
        cmocka_unit_test(test_onednn_embed_reads_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
