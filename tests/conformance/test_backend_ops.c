/* Every op of a backend plugin against the core's reference kernels, over edge shapes (one
 * token, odd sizes, positions far from 0, GQA ratios, windows, MoE routing) and every weight
 * dtype. The backend is named by RLX_BACKEND (default cpu-blas) and found like `--plugin`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

static rlx_backend *tested, *ref;
static rlx_plugin_handle *plugin;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float uniform(void) { /* in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static uint16_t to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

static uint16_t to_f16(float f) { /* inputs here are small normal numbers */
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint32_t sign = (bits >> 16) & 0x8000, mant = bits & 0x7fffff;
    int32_t exp = (int32_t)((bits >> 23) & 0xff) - 127 + 15;
    if (exp <= 0)
        return (uint16_t)sign;
    uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13);
    if ((mant & 0x1fff) > 0x1000 || ((mant & 0x1fff) == 0x1000 && (half & 1)))
        half++;
    return (uint16_t)half;
}


static rlx_tensor make(uint32_t dtype, int64_t rows, int64_t cols, float scale) {
    rlx_tensor t = {.dtype = dtype, .n_dims = cols ? 2 : 1, .shape = {rows, cols ? cols : 1, 1, 1}};
    int64_t n = rows * (cols ? cols : 1);
    t.data = malloc((size_t)n * 4 + 64);
    for (int64_t i = 0; i < n; i++) {
        float v = uniform() * scale;
        if (dtype == RLX_DTYPE_F32)
            ((float *)t.data)[i] = v;
        else if (dtype == RLX_DTYPE_BF16)
            ((uint16_t *)t.data)[i] = to_bf16(v);
        else if (dtype == RLX_DTYPE_F16)
            ((uint16_t *)t.data)[i] = to_f16(v);
    }
    return t;
}

static rlx_tensor positions(int64_t n, int32_t first) {
    rlx_tensor t = {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {n, 1, 1, 1}};
    t.data = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        ((int32_t *)t.data)[i] = first + (int32_t)i;
    return t;
}

static rlx_tensor copy(const rlx_tensor *src) {
    rlx_tensor t = *src;
    size_t bytes = (size_t)rlx_tensor_numel(src) * rlx_dtype_size((int)src->dtype);
    t.data = malloc(bytes + 64);
    memcpy(t.data, src->data, bytes);
    return t;
}

static int failures;

/* Runs the node on both backends (with private copies of inputs the op writes) and compares
 * outputs and, for attention, the caches. */
/* noipa: specialised for callers with fixed input counts, gcc misreads the attention-only branches */
__attribute__((noipa)) static void check(const char *what, uint32_t op, rlx_tensor *in, uint32_t n_in, int64_t rows, int64_t cols,
                  const rlx_op_params *p, double tol) {
    rlx_tensor out_ref = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {rows, cols, 1, 1}};
    rlx_tensor out_b = out_ref;
    out_ref.data = calloc((size_t)(rows * cols), 4);
    out_b.data = calloc((size_t)(rows * cols), 4);
    rlx_tensor *in_b = malloc(n_in * sizeof *in_b);
    for (uint32_t i = 0; i < n_in; i++)
        in_b[i] = op == RLX_OP_ATTENTION && i >= 4 ? copy(&in[i]) : in[i];
    rlx_node_view v = {.op = op, .n_inputs = n_in, .inputs = in, .output = &out_ref, .params = p, .name = what};
    rlx_node_view vb = v;
    vb.inputs = in_b;
    vb.output = &out_b;
    if (!rlx_backend_supports(tested, &vb)) {
        printf("  %-52s not claimed by %s\n", what, rlx_backend_name(tested));
    } else {
        assert_ok(rlx_backend_compute(ref, &v));
        assert_ok(rlx_backend_compute(tested, &vb));
        double worst = 0, scale = 1;
        int64_t n = rows * cols;
        for (int64_t i = 0; i < n; i++)
            scale = fmax(scale, fabs(((float *)out_ref.data)[i]));
        for (int64_t i = 0; i < n; i++) {
            double d = fabs(((float *)out_ref.data)[i] - ((float *)out_b.data)[i]);
            if (!(d <= worst))
                worst = isnan(d) ? INFINITY : d;
        }
        if (op == RLX_OP_ATTENTION)
            for (uint32_t c = 4; c < 6; c++)
                if (memcmp(in[c].data, in_b[c].data, (size_t)rlx_tensor_numel(&in[c]) * 4) != 0)
                    worst = INFINITY;
        int ok = worst <= tol * scale;
        printf("  %-52s max |diff| %.3g (limit %.3g) %s\n", what, worst, tol * scale, ok ? "ok" : "FAILED");
        failures += !ok;
    }
    for (uint32_t i = 4; op == RLX_OP_ATTENTION && i < n_in; i++)
        free(in_b[i].data);
    free(in_b);
    free(out_ref.data);
    free(out_b.data);
}

static void release(rlx_tensor *t, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        free(t[i].data);
}

static const uint32_t dtypes[] = {RLX_DTYPE_F32, RLX_DTYPE_BF16, RLX_DTYPE_F16};

static void test_matmul(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{1, 64, 96}, {1, 33, 17}, {3, 1024, 256}, {7, 130, 65}, {64, 256, 300}, {130, 96, 64}, {1, 3072, 1024}};
    failures = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t d = 0; d < 3; d++)
            for (int bias = 0; bias < 2; bias++) {
                int64_t t = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
                rlx_tensor in[3] = {make(RLX_DTYPE_F32, t, k, 1), make(dtypes[d], n, k, 0.1f),
                                    make(dtypes[d], n, 0, 1)};
                char what[96];
                snprintf(what, sizeof what, "matmul T=%lld K=%lld N=%lld %s%s", (long long)t, (long long)k,
                         (long long)n, rlx_dtype_name((int)dtypes[d]), bias ? " +bias" : "");
                rlx_op_params p = {0};
                check(what, RLX_OP_MATMUL, in, bias ? 3 : 2, t, n, &p, 2e-5);
                release(in, 3);
            }
    assert_int_equal(failures, 0);
}

static void test_embed(void **state) {
    (void)state;
    failures = 0;
    for (size_t d = 0; d < 3; d++)
        for (int64_t t = 1; t <= 9; t += 4) {
            rlx_tensor in[2] = {positions(t, 3), make(dtypes[d], 37, 19, 1)};
            char what[64];
            snprintf(what, sizeof what, "embed T=%lld V=37 H=19 %s", (long long)t, rlx_dtype_name((int)dtypes[d]));
            rlx_op_params p = {0};
            check(what, RLX_OP_EMBED, in, 2, t, 19, &p, 0);
            release(in, 2);
        }
    assert_int_equal(failures, 0);
}

static void test_rms_norm(void **state) {
    (void)state;
    failures = 0;
    const int64_t shapes[][3] = {{1, 1024, 1024}, {5, 64, 16}, {3, 2048, 128}, {2, 7, 7}, {4, 33, 11}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t d = 0; d < 3; d++) {
            rlx_tensor in[2] = {make(RLX_DTYPE_F32, shapes[s][0], shapes[s][1], 3), make(dtypes[d], shapes[s][2], 0, 1)};
            char what[64];
            snprintf(what, sizeof what, "rms_norm T=%lld C=%lld G=%lld %s", (long long)shapes[s][0],
                     (long long)shapes[s][1], (long long)shapes[s][2], rlx_dtype_name((int)dtypes[d]));
            rlx_op_params p = {.eps = 1e-6f};
            check(what, RLX_OP_RMS_NORM, in, 2, shapes[s][0], shapes[s][1], &p, 1e-5);
            release(in, 2);
        }
    assert_int_equal(failures, 0);
}

static void test_rope(void **state) {
    (void)state;
    failures = 0;
    const struct {
        int64_t t, heads, d;
        int32_t first;
        float theta;
    } cases[] = {{1, 2, 16, 0, 10000}, {6, 4, 128, 0, 1000000}, {3, 3, 64, 1000, 1000000}, {2, 1, 8, 5000, 10000}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t cols = cases[c].heads * cases[c].d;
        rlx_tensor in[2] = {make(RLX_DTYPE_F32, cases[c].t, cols, 1), positions(cases[c].t, cases[c].first)};
        char what[80];
        snprintf(what, sizeof what, "rope T=%lld heads=%lld D=%lld pos0=%d theta=%g", (long long)cases[c].t,
                 (long long)cases[c].heads, (long long)cases[c].d, cases[c].first, (double)cases[c].theta);
        rlx_op_params p = {.head_dim = (uint32_t)cases[c].d, .rope_theta = cases[c].theta};
        /* float32 angles (as Hugging Face computes them) lose ~1e-4 at position 5000 */
        check(what, RLX_OP_ROPE, in, 2, cases[c].t, cols, &p, cases[c].first >= 1000 ? 1e-3 : 2e-5);
        release(in, 2);
    }
    assert_int_equal(failures, 0);
}

static void test_attention(void **state) {
    (void)state;
    failures = 0;
    const struct {
        int64_t t, hq, hkv, d, cap;
        int32_t first;
        uint32_t window;
    } cases[] = {{1, 4, 4, 16, 8, 0, 0},  {5, 8, 2, 16, 32, 0, 0},   {1, 16, 8, 128, 64, 40, 0},
                 {17, 8, 1, 32, 40, 3, 0}, {6, 4, 2, 16, 32, 9, 3},   {1, 4, 2, 64, 600, 555, 0},
                 {12, 6, 3, 8, 16, 0, 5},  {130, 16, 8, 128, 160, 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t t = cases[c].t, kv = cases[c].hkv * cases[c].d;
        rlx_tensor in[6] = {make(RLX_DTYPE_F32, t, cases[c].hq * cases[c].d, 2), make(RLX_DTYPE_F32, t, kv, 2),
                            make(RLX_DTYPE_F32, t, kv, 1),  positions(t, cases[c].first),
                            make(RLX_DTYPE_F32, cases[c].cap, kv, 2), make(RLX_DTYPE_F32, cases[c].cap, kv, 1)};
        char what[96];
        snprintf(what, sizeof what, "attention T=%lld Hq=%lld Hkv=%lld D=%lld pos0=%d window=%u", (long long)t,
                 (long long)cases[c].hq, (long long)cases[c].hkv, (long long)cases[c].d, cases[c].first,
                 cases[c].window);
        rlx_op_params p = {.head_dim = (uint32_t)cases[c].d,
                           .n_heads = (uint32_t)cases[c].hq,
                           .n_kv_heads = (uint32_t)cases[c].hkv,
                           .window = cases[c].window,
                           .scale = 1.0f / sqrtf((float)cases[c].d)};
        check(what, RLX_OP_ATTENTION, in, 6, t, cases[c].hq * cases[c].d, &p, 2e-5);
        release(in, 6);
    }
    assert_int_equal(failures, 0);
}

static void test_elementwise(void **state) {
    (void)state;
    failures = 0;
    const int64_t shapes[][2] = {{1, 3072}, {5, 17}, {64, 1024}};
    for (size_t s = 0; s < 3; s++) {
        rlx_tensor in[2] = {make(RLX_DTYPE_F32, shapes[s][0], shapes[s][1], 4), make(RLX_DTYPE_F32, shapes[s][0], shapes[s][1], 4)};
        rlx_op_params p = {0};
        char what[64];
        snprintf(what, sizeof what, "swiglu T=%lld F=%lld", (long long)shapes[s][0], (long long)shapes[s][1]);
        check(what, RLX_OP_SWIGLU, in, 2, shapes[s][0], shapes[s][1], &p, 1e-6);
        snprintf(what, sizeof what, "add T=%lld C=%lld", (long long)shapes[s][0], (long long)shapes[s][1]);
        check(what, RLX_OP_ADD, in, 2, shapes[s][0], shapes[s][1], &p, 0);
        snprintf(what, sizeof what, "gather_last T=%lld C=%lld", (long long)shapes[s][0], (long long)shapes[s][1]);
        check(what, RLX_OP_GATHER_LAST, in, 1, 1, shapes[s][1], &p, 0);
        release(in, 2);
    }
    assert_int_equal(failures, 0);
}

static void test_moe(void **state) {
    (void)state;
    failures = 0;
    const struct {
        int64_t t, h, f;
        uint32_t experts, top_k, norm;
    } cases[] = {{1, 32, 16, 4, 2, 1}, {6, 48, 24, 8, 2, 0}, {13, 64, 40, 8, 3, 1}, {3, 16, 8, 2, 2, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t d = 0; d < 3; d++) {
            uint32_t n_in = 2 + 3 * cases[c].experts;
            rlx_tensor *in = calloc(n_in, sizeof *in);
            in[0] = make(RLX_DTYPE_F32, cases[c].t, cases[c].h, 1);
            in[1] = make(dtypes[d], cases[c].experts, cases[c].h, 1);
            for (uint32_t e = 0; e < cases[c].experts; e++) {
                in[2 + 3 * e] = make(dtypes[d], cases[c].f, cases[c].h, 0.3f);
                in[3 + 3 * e] = make(dtypes[d], cases[c].f, cases[c].h, 0.3f);
                in[4 + 3 * e] = make(dtypes[d], cases[c].h, cases[c].f, 0.3f);
            }
            char what[96];
            snprintf(what, sizeof what, "moe T=%lld H=%lld F=%lld E=%u k=%u norm=%u %s", (long long)cases[c].t,
                     (long long)cases[c].h, (long long)cases[c].f, cases[c].experts, cases[c].top_k, cases[c].norm,
                     rlx_dtype_name((int)dtypes[d]));
            rlx_op_params p = {.n_experts = cases[c].experts, .top_k = cases[c].top_k, .norm_topk = cases[c].norm};
            check(what, RLX_OP_MOE, in, n_in, cases[c].t, cases[c].h, &p, 2e-5);
            release(in, n_in);
            free(in);
        }
    assert_int_equal(failures, 0);
}

static int setup(void **state) {
    (void)state;
    const char *name = getenv("RLX_BACKEND") ? getenv("RLX_BACKEND") : "cpu-blas";
    rlx_registry *r;
    if (rlx_registry_create(getenv("RLX_BACKEND_DIR"), &r) != RLX_OK ||
        rlx_registry_load(r, RLX_PLUGIN_BACKEND, name, &plugin) != RLX_OK) {
        fprintf(stderr, "cannot load backend %s: %s\n", name, rlx_last_error());
        return -1;
    }
    rlx_registry_destroy(r);
    rlx_backend_options o = rlx_backend_options_default();
    o.n_threads = 2;
    if (rlx_backend_create(plugin, &o, &tested) != RLX_OK || rlx_backend_create_ref(&ref) != RLX_OK) {
        fprintf(stderr, "cannot open backend %s: %s\n", name, rlx_last_error());
        return -1;
    }
    printf("backend under test: %s (%s)\n", rlx_backend_name(tested), rlx_plugin_path(plugin));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    rlx_backend_destroy(tested);
    rlx_backend_destroy(ref);
    rlx_plugin_unload(plugin);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),     cmocka_unit_test(test_matmul),      cmocka_unit_test(test_rms_norm),
        cmocka_unit_test(test_rope),      cmocka_unit_test(test_attention),   cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_moe),
    };
    return cmocka_run_group_tests_name("backend ops", tests, setup, teardown);
}
