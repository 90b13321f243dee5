/* The CPU kernel library (plugins/kernels): at every ISA level this CPU runs, the row ops give
 * the same bits however the backend's parallel_for cuts the rows, and every item is run
 * exactly once; the two attention paths agree with each other and with a double-precision
 * reference; MoE routing picks the reference's experts (ties to the lower index) and weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kern.h"
#include "testutil.h"

// ---------------------------------------------------------------------------------------------
// A host and two parallel_fors: one range, and ranges cut small, in reverse order

static char host_msg[512];

static void host_log(int level, const char *fmt, ...) { (void)level, (void)fmt; }

static int host_error(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(host_msg, sizeof host_msg, fmt, ap);
    va_end(ap);
    return status;
}

static void *host_alloc(size_t size, size_t align) { return aligned_alloc(align, (size + align - 1) / align * align); }

static const rlx_host host = {.size = sizeof(rlx_host),
                              .abi_major = RLX_ABI_MAJOR,
                              .log = host_log,
                              .error = host_error,
                              .alloc = host_alloc,
                              .free = free};

#define MAX_ITEMS 4096
static int item_runs[MAX_ITEMS];

static void count_items(int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++)
        item_runs[i < MAX_ITEMS ? i : MAX_ITEMS - 1]++;
}

static void one_range(void *self, int64_t n, int64_t align, int64_t work, kern_range_fn fn, void *ctx) {
    (void)self, (void)align, (void)work;
    count_items(0, n);
    fn(ctx, 0, 0, n);
}

static void one_range_tasks(void *self, int64_t n, int64_t work, kern_range_fn fn, void *ctx) {
    (void)self, (void)work;
    for (int64_t i = 0; i < n; i++) {
        count_items(i, i + 1);
        fn(ctx, 0, i, i + 1);
    }
}

/* Ranges of 1..3 alignment units from the end backwards, as "threads" 0 and 1 in turn. */
static void small_ranges(void *self, int64_t n, int64_t align, int64_t work, kern_range_fn fn, void *ctx) {
    (void)self, (void)work;
    int64_t units = (n + align - 1) / align, turn = 0;
    while (units > 0) {
        const int64_t take = units < 1 + turn % 3 ? units : 1 + turn % 3;
        const int64_t i0 = (units - take) * align, i1 = units * align < n ? units * align : n;
        count_items(i0, i1);
        fn(ctx, (int)(turn++ % 2), i0, i1);
        units -= take;
    }
}

static void reversed_tasks(void *self, int64_t n, int64_t work, kern_range_fn fn, void *ctx) {
    (void)self, (void)work;
    for (int64_t i = n - 1; i >= 0; i--) {
        count_items(i, i + 1);
        fn(ctx, (int)(i % 2), i, i + 1);
    }
}

static const kern_par serial = {.n_threads = 1, .parallel_for = one_range, .parallel_tasks = one_range_tasks};
static const kern_par shuffled = {.n_threads = 2, .parallel_for = small_ranges, .parallel_tasks = reversed_tasks};

static uint32_t rng = 12345;

static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
}

static void fill(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = frand();
}

/* The ISA levels this CPU runs, by name. */
static int levels(const char **names) {
    int n = 0;
    for (int i = 0; i <= (int)plugin_isa_best(); i++)
        names[n++] = plugin_isa_name((plugin_isa)i);
    return n;
}

static void expect_each_item_once(int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (item_runs[i] != 1)
            fail_msg("item %lld ran %d times", (long long)i, item_runs[i]);
    memset(item_runs, 0, sizeof item_runs);
}

// ---------------------------------------------------------------------------------------------
// Row ops

enum { T = 7, H = 72, HEAD = 24, V = 11 };

static float row_x[T * H], row_u[T * H], row_w[HEAD];
static uint16_t row_table[V * H];
static const int32_t row_ids[T] = {3, 0, 10, 3, 7, 1, 9}, row_pos[T] = {0, 5, 6, 7, 100, 4095, 1};

/* Runs every row op on the same inputs into out[6][T * H]. */
static void run_row_ops(kern_ctx *c, float out[6][T * H]) {
    kern_embed(c, row_table, RLX_DTYPE_BF16, H, row_ids, T, out[0]);
    expect_each_item_once(T);
    kern_rms_norm(c, row_x, row_w, out[1], T, H, HEAD, 1e-6f);
    expect_each_item_once(T);
    assert_ok(kern_rope(c, row_x, row_pos, out[2], T, H, HEAD, 1e6f));
    memset(item_runs, 0, sizeof item_runs); /* the table and the rotation: two jobs of T rows */
    kern_swiglu(c, row_x, row_u, out[3], T * H);
    expect_each_item_once(T * H);
    kern_add(c, row_x, row_u, out[4], T * H);
    expect_each_item_once(T * H);
    uint16_t xb[T * H];
    kern_to_bf16(c, row_x, xb, T, H);
    expect_each_item_once(T);
    for (int i = 0; i < T * H; i++)
        out[5][i] = rlx_iface_bf16_to_f32(xb[i]);
}

/* RMS norm and NeoX RoPE against their definitions, in double. */
static void check_norm_and_rope(float out[6][T * H]) {
    for (int g = 0; g < T * H / HEAD; g++) {
        const float *x = row_x + g * HEAD;
        double ss = 0.0;
        for (int i = 0; i < HEAD; i++)
            ss += (double)x[i] * x[i];
        const double inv = 1.0 / sqrt(ss / HEAD + 1e-6);
        for (int i = 0; i < HEAD; i++)
            assert_float_equal(out[1][g * HEAD + i], x[i] * inv * row_w[i], 1e-5);
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H / HEAD; h++)
            for (int i = 0; i < HEAD / 2; i++) {
                const float *x = row_x + t * H + h * HEAD;
                const double ang = row_pos[t] * pow(1e6, -2.0 * i / HEAD);
                const double y0 = x[i] * cos(ang) - x[i + HEAD / 2] * sin(ang);
                const double y1 = x[i + HEAD / 2] * cos(ang) + x[i] * sin(ang);
                assert_float_equal(out[2][t * H + h * HEAD + i], y0, 1e-5);
                assert_float_equal(out[2][t * H + h * HEAD + i + HEAD / 2], y1, 1e-5);
            }
}

static void test_row_ops_do_not_depend_on_the_split(void **state) {
    (void)state;
    fill(row_x, T * H);
    fill(row_u, T * H);
    fill(row_w, HEAD);
    for (int i = 0; i < V * H; i++)
        row_table[i] = rlx_iface_f32_to_bf16(frand());
    const char *names[PLUGIN_ISA_COUNT];
    for (int l = 0, n = levels(names); l < n; l++) {
        static float one[6][T * H], cut[6][T * H];
        kern_ctx a, b;
        assert_ok(kern_init(&a, &host, "test", names[l], serial));
        assert_ok(kern_init(&b, &host, "test", names[l], shuffled));
        run_row_ops(&a, one);
        run_row_ops(&b, cut);
        assert_memory_equal(one, cut, sizeof one);
        check_norm_and_rope(one);
        kern_deinit(&a);
        kern_deinit(&b);
    }
}

// ---------------------------------------------------------------------------------------------
// Attention

enum { D = 20, HQ = 4, HKV = 2, C = 90 };

/* out[HQ * D] of the query at position p in cache rows [lo, p], in double. */
static void attention_ref(const float *q, const float *kc, const float *vc, int64_t lo, int64_t p, float scale,
                          double *out) {
    for (int h = 0; h < HQ; h++) {
        const int kvh = h / (HQ / HKV);
        double s[C], mx = -INFINITY, sum = 0.0;
        for (int64_t j = lo; j <= p; j++) {
            s[j] = 0.0;
            for (int d = 0; d < D; d++)
                s[j] += (double)q[h * D + d] * kc[j * HKV * D + kvh * D + d];
            s[j] *= scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int64_t j = lo; j <= p; j++)
            sum += s[j] = exp(s[j] - mx);
        for (int d = 0; d < D; d++) {
            double o = 0.0;
            for (int64_t j = lo; j <= p; j++)
                o += s[j] * vc[j * HKV * D + kvh * D + d];
            out[h * D + d] = o / sum;
        }
    }
}

static void test_attention_paths_agree_with_the_reference(void **state) {
    (void)state;
    const char *names[PLUGIN_ISA_COUNT];
    static float kc[C * HKV * D], vc[C * HKV * D];
    float q[HQ * D], k[HKV * D], v[HKV * D], split[HQ * D], panels[HQ * D];
    const int32_t pos = 80;
    rng = 7;
    fill(kc, C * HKV * D);
    fill(vc, C * HKV * D);
    fill(q, HQ * D);
    fill(k, HKV * D);
    fill(v, HKV * D);
    for (int l = 0, n = levels(names); l < n; l++)
        for (uint32_t window = 0; window <= 50; window += 50) {
            const rlx_op_params p = {.scale = 0.3f, .head_dim = D, .n_heads = HQ, .n_kv_heads = HKV, .window = window};
            const rlx_tensor in[6] = {
                {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HQ * D}, .data = q},
                {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HKV * D}, .data = k},
                {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HKV * D}, .data = v},
                {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {1}, .data = (void *)&pos},
                {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {C, HKV * D}, .data = kc},
                {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {C, HKV * D}, .data = vc},
            };
            rlx_tensor out = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HQ * D}, .data = split};
            const rlx_node_view node = {
                .op = RLX_OP_ATTENTION, .n_inputs = 6, .inputs = in, .output = &out, .params = &p, .name = "att"};
            kern_ctx c;
            kern_att a;
            assert_ok(kern_init(&c, &host, "test", names[l], shuffled));
            assert_ok(kern_att_begin(&c, &node, &a));
            assert_ok(kern_att_split_keys(&c, &a));
            expect_each_item_once(1);
            out.data = panels;
            assert_ok(kern_att_begin(&c, &node, &a));
            assert_ok(kern_att_panels(&c, &a));
            memset(item_runs, 0, sizeof item_runs);
            double ref[HQ * D];
            attention_ref(q, kc, vc, window ? pos - window + 1 : 0, pos, p.scale, ref);
            for (int i = 0; i < HQ * D; i++) {
                assert_float_equal(split[i], ref[i], 1e-5);
                assert_float_equal(panels[i], ref[i], 1e-5);
            }
            kern_deinit(&c);
        }
}

static void test_attention_rejects_a_position_outside_the_cache(void **state) {
    (void)state;
    float x[HQ * D] = {0}, kc[4 * HKV * D];
    const int32_t pos = 4;
    const rlx_op_params p = {.scale = 1.0f, .head_dim = D, .n_heads = HQ, .n_kv_heads = HKV};
    const rlx_tensor in[6] = {
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HQ * D}, .data = x},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HKV * D}, .data = x},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HKV * D}, .data = x},
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {1}, .data = (void *)&pos},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {4, HKV * D}, .data = kc},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {4, HKV * D}, .data = kc},
    };
    rlx_tensor out = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {1, HQ * D}, .data = x};
    const rlx_node_view node = {
        .op = RLX_OP_ATTENTION, .n_inputs = 6, .inputs = in, .output = &out, .params = &p, .name = "layers.0.attn"};
    kern_ctx c;
    kern_att a;
    assert_ok(kern_init(&c, &host, "test", "c", serial));
    assert_int_equal(kern_att_begin(&c, &node, &a), RLX_E_RANGE);
    assert_non_null(strstr(host_msg, "test: node 'layers.0.attn': position 4"));
    kern_deinit(&c);
}

// ---------------------------------------------------------------------------------------------
// MoE routing

static void test_moe_route_takes_ties_in_expert_order(void **state) {
    (void)state;
    const float logits[2 * 4] = {1.0f, 3.0f, 3.0f, 0.5f, -2.0f, -2.0f, -2.0f, -2.0f};
    int64_t expert[2 * 2];
    float weight[2 * 2];
    kern_moe_route(logits, 2, 4, 2, false, expert, weight);
    assert_int_equal(expert[0], 1);
    assert_int_equal(expert[1], 2);
    assert_int_equal(expert[2], 0);
    assert_int_equal(expert[3], 1);
    const double sum = exp(1.0 - 3.0) + 2.0 + exp(0.5 - 3.0);
    assert_float_equal(weight[0], 1.0 / sum, 1e-7);
    assert_float_equal(weight[2], 0.25, 1e-7);
    kern_moe_route(logits, 2, 4, 2, true, expert, weight);
    assert_float_equal(weight[0], 0.5, 1e-7);
    assert_float_equal(weight[1], 0.5, 1e-7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_ops_do_not_depend_on_the_split),
        cmocka_unit_test(test_attention_paths_agree_with_the_reference),
        cmocka_unit_test(test_attention_rejects_a_position_outside_the_cache),
        cmocka_unit_test(test_moe_route_takes_ties_in_expert_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
