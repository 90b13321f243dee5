/* The CPU kernel library (plugins/kernels): at every ISA level this CPU runs, the row ops give
 * the same bits however the backend's parallel_for cuts the rows, and every item is run
 * exactly once; the GEMM gives each row the bits of its GEMV alone; attention (slots, F16 caches, windows) agrees with a double-precision
 * reference and gives a row the same bits alone, in any batch, in any chunking of its prompt
 * and on one thread or two; MoE routing picks the reference's experts (ties to the lower index) and weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

static uint64_t rng = 12345; /* tu_rand's */

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
    assert_ok(kern_rope(c, row_x, row_pos, NULL, out[2], T, H, HEAD, 0, 1e6f));
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
    tu_fill(row_x, T * H, &rng);
    tu_fill(row_u, T * H, &rng);
    tu_fill(row_w, HEAD, &rng);
    for (int i = 0; i < V * H; i++)
        row_table[i] = rlx_iface_f32_to_bf16(tu_uniform(&rng));
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
// GEMM: the bits of a row alone, for any number of rows

enum { GM_MAX_M = 70, GM_MAX_K = 300, GM_N = 29 };

/* gemm_f32 on the widened weights gives every row the bits gemv_block gives it alone (the
 * batch-invariant mode's promise, now at matrix speed), at every level, for every weight dtype,
 * for row counts that leave every remainder of the register blocks and panels, and for K that
 * are and are not multiples of the vector width; the values also agree with a double sum, and
 * neither kernel reads or writes past its buffers. */
static void test_gemm_gives_each_row_its_gemv_bits(void **state) {
    (void)state;
    static float alone[GM_MAX_M * GM_N];
    static const int64_t ms[] = {9, 13, 16, 25, GM_MAX_M}, ks[] = {1, 37, 64, 256, GM_MAX_K};
    static const int dts[] = {RLX_DTYPE_F32, RLX_DTYPE_BF16, RLX_DTYPE_F16};
    const char *names[PLUGIN_ISA_COUNT];
    for (int l = 0, n = levels(names); l < n; l++) {
        kern_ctx c;
        assert_ok(kern_init(&c, &host, "test", names[l], serial));
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                    const int dt = dts[d];
                    const int64_t K = ks[ki], M = ms[mi];
                    void *maps[5];
                    size_t lens[5];
                    float *x = tu_before_guard((size_t)(M * K) * sizeof(float), &maps[0], &lens[0]);
                    float *wf = tu_before_guard((size_t)(GM_N * K) * sizeof(float), &maps[1], &lens[1]);
                    float *wide = tu_before_guard((size_t)(GM_N * K) * sizeof(float), &maps[2], &lens[2]);
                    uint16_t *w16 = tu_before_guard((size_t)(GM_N * K) * sizeof(uint16_t), &maps[3], &lens[3]);
                    float *many = tu_before_guard((size_t)(M * GM_N) * sizeof(float), &maps[4], &lens[4]);
                    tu_fill(x, M * K, &rng);
                    tu_fill(wf, GM_N * K, &rng);
                    for (int64_t i = 0; i < GM_N * K; i++)
                        w16[i] = dt == RLX_DTYPE_BF16 ? rlx_iface_f32_to_bf16(wf[i]) : rlx_iface_f32_to_f16(wf[i]);
                    const void *w = dt == RLX_DTYPE_F32 ? (const void *)wf : (const void *)w16;
                    c.k->widen(dt, w, wide, GM_N * K);
                    for (int64_t m = 0; m < M; m++)
                        c.k->gemv_block[dt][0](x + m * K, K, w, K, 0, GM_N, alone + m * GM_N, GM_N);
                    c.k->gemm_f32(x, K, M, wide, K, 0, GM_N, many, GM_N);
                    assert_memory_equal(alone, many, (size_t)(M * GM_N) * sizeof(float));
                    for (int64_t m = 0; m < M; m += 7)
                        for (int64_t j = 0; j < GM_N; j++) {
                            double ref = 0;
                            for (int64_t k = 0; k < K; k++)
                                ref += (double)x[m * K + k] * wide[j * K + k];
                            assert_float_equal(many[m * GM_N + j], ref, 1e-5 * (double)K);
                        }
                    /* the M-row block GEMVs of the same weights, rows ending at the guard */
                    for (int64_t mb = 1; mb <= KERN_GEMV_MAX_M; mb++)
                        c.k->gemv_block[dt][mb - 1](x + (M - mb) * K, K, w, K, 0, GM_N, many + (M - mb) * GM_N, GM_N);
                    assert_memory_equal(alone, many, (size_t)(M * GM_N) * sizeof(float));
                    for (int b = 0; b < 5; b++)
                        munmap(maps[b], lens[b]);
                }
        kern_deinit(&c);
    }
}

// ---------------------------------------------------------------------------------------------
// Attention

enum { D = 20, HQ = 4, HKV = 2, KV = HKV * D, SLOTS = 3, C = 700 };

/* The inputs of the query at (slot, pos): the same whatever call it is in. */
static void att_row(int32_t slot, int32_t pos, float *q, float *k, float *v) {
    const uint64_t saved = rng;
    rng = 1000u * (uint64_t)slot + (uint64_t)pos + 1u;
    tu_fill(q, HQ * D, &rng);
    tu_fill(k, KV, &rng);
    tu_fill(v, KV, &rng);
    rng = saved;
}

/* One ATTENTION call through the library: rows t < n at (seq[t], pos[t]) (seq NULL: one
 * sequence, caches [C, KV]) over caches of dtype dt, output [n, HQ * D]. */
static int att_call(kern_ctx *c, const int32_t *seq, const int32_t *pos, int64_t n, uint32_t dt, uint32_t window,
                    void *kc, void *vc, float *out) {
    float *q = malloc((size_t)n * HQ * D * sizeof *q), *k = malloc((size_t)n * KV * sizeof *k),
          *v = malloc((size_t)n * KV * sizeof *v);
    for (int64_t t = 0; t < n; t++)
        att_row(seq ? seq[t] : 0, pos[t], q + t * HQ * D, k + t * KV, v + t * KV);
    const rlx_op_params p = {.scale = 0.3f, .head_dim = D, .n_heads = HQ, .n_kv_heads = HKV, .window = window};
    const rlx_tensor cache = seq ? (rlx_tensor){.dtype = dt, .n_dims = 3, .shape = {SLOTS, C, KV, 1}}
                                 : (rlx_tensor){.dtype = dt, .n_dims = 2, .shape = {C, KV, 1, 1}};
    rlx_tensor in[7] = {
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {n, HQ * D, 1, 1}, .data = q},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {n, KV, 1, 1}, .data = k},
        {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {n, KV, 1, 1}, .data = v},
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {n, 1, 1, 1}, .data = (void *)pos},
        cache,
        cache,
        {.dtype = RLX_DTYPE_I32, .n_dims = 1, .shape = {n, 1, 1, 1}, .data = (void *)seq},
    };
    in[4].data = kc;
    in[5].data = vc;
    rlx_tensor o = {.dtype = RLX_DTYPE_F32, .n_dims = 2, .shape = {n, HQ * D, 1, 1}, .data = out};
    const rlx_node_view node = {
        .op = RLX_OP_ATTENTION, .n_inputs = seq ? 7 : 6, .inputs = in, .output = &o, .params = &p, .name = "att"};
    const int rc = kern_op_attention(c, &node);
    free(q), free(k), free(v);
    return rc;
}

/* Caches of every slot, with random earlier positions. */
static void *att_cache(uint32_t dt, uint32_t seed) {
    const size_t n = (size_t)SLOTS * C * KV;
    void *c = malloc(n * sizeof(float));
    const uint64_t saved = rng;
    rng = seed;
    for (size_t i = 0; i < n; i++) {
        const float x = tu_uniform(&rng);
        if (dt == RLX_DTYPE_F16)
            ((uint16_t *)c)[i] = rlx_iface_f32_to_f16(x);
        else
            ((float *)c)[i] = x;
    }
    rng = saved;
    return c;
}

static void *att_copy(const void *c) {
    void *d = malloc((size_t)SLOTS * C * KV * sizeof(float));
    memcpy(d, c, (size_t)SLOTS * C * KV * sizeof(float));
    return d;
}

/* out[HQ * D] of the query at (slot, pos) over cache rows [lo, pos] of the slot, in double. */
static void att_ref(uint32_t dt, const void *kc, const void *vc, int32_t slot, int32_t pos, int64_t lo, float scale,
                    double *out) {
    float q[HQ * D], k[KV], v[KV];
    att_row(slot, pos, q, k, v);
    const int64_t base = (int64_t)slot * C * KV;
    double *s = malloc((size_t)C * sizeof *s);
    for (int h = 0; h < HQ; h++) {
        const int kvh = h / (HQ / HKV);
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = lo; j <= pos; j++) {
            s[j] = 0.0;
            for (int d = 0; d < D; d++)
                s[j] += (double)q[h * D + d] * rlx_iface_load_f32(dt, kc, base + j * KV + kvh * D + d);
            s[j] *= scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int64_t j = lo; j <= pos; j++)
            sum += s[j] = exp(s[j] - mx);
        for (int d = 0; d < D; d++) {
            double o = 0.0;
            for (int64_t j = lo; j <= pos; j++)
                o += s[j] * rlx_iface_load_f32(dt, vc, base + j * KV + kvh * D + d);
            out[h * D + d] = o / sum;
        }
    }
    free(s);
}

/* A batch of several slots: a prompt chunk of slot 0 crossing chunk boundaries (two blocks),
 * a decode row of slot 2, and a prompt of slot 1 interleaved with slot 0's rows. */
enum { BATCH = 26 };
static const int32_t batch_seq[BATCH] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2};
static const int32_t batch_pos[BATCH] = {3,   250, 251, 252, 253, 254, 255, 256, 257, 258, 259, 260, 261,
                                         262, 263, 264, 265, 4,   266, 267, 268, 269, 510, 511, 512, 600};

static void test_attention_agrees_with_the_reference(void **state) {
    (void)state;
    const char *names[PLUGIN_ISA_COUNT];
    static const uint32_t dts[2] = {RLX_DTYPE_F32, RLX_DTYPE_F16};
    for (int l = 0, n = levels(names); l < n; l++)
        for (int d = 0; d < 2; d++)
            for (uint32_t window = 0; window <= 100; window += 100) {
                const uint32_t dt = dts[d];
                void *kc = att_cache(dt, 5), *vc = att_cache(dt, 6);
                static float out[BATCH * HQ * D];
                kern_ctx c;
                assert_ok(kern_init(&c, &host, "test", names[l], shuffled));
                assert_ok(att_call(&c, batch_seq, batch_pos, BATCH, dt, window, kc, vc, out));
                memset(item_runs, 0, sizeof item_runs);
                for (int t = 0; t < BATCH; t++) {
                    double ref[HQ * D];
                    const int64_t lo = window && batch_pos[t] >= (int32_t)window ? batch_pos[t] - window + 1 : 0;
                    att_ref(dt, kc, vc, batch_seq[t], batch_pos[t], lo, 0.3f, ref);
                    for (int i = 0; i < HQ * D; i++)
                        if (fabs(out[t * HQ * D + i] - ref[i]) > 2e-5)
                            fail_msg("%s %s window %u: row %d value %d is %g, expected %g", names[l],
                                     rlx_dtype_name((int)dt), window, t, i, (double)out[t * HQ * D + i], ref[i]);
                    /* the row's k and v as the cache stores them */
                    float q[HQ * D], k[KV], v[KV];
                    att_row(batch_seq[t], batch_pos[t], q, k, v);
                    const int64_t row = ((int64_t)batch_seq[t] * C + batch_pos[t]) * KV;
                    for (int i = 0; i < KV; i++) {
                        const float want =
                            dt == RLX_DTYPE_F16 ? rlx_iface_f16_to_f32(rlx_iface_f32_to_f16(v[i])) : v[i];
                        assert_true(rlx_iface_load_f32(dt, vc, row + i) == want);
                    }
                }
                kern_deinit(&c);
                free(kc), free(vc);
            }
}

/* Rows [from, from + n) of slot `slot`'s prompt computed by several calls of `step` rows each
 * (the last shorter), into out[(pos - from) * HQ * D]. */
static void att_chunked(kern_ctx *c, int one_sequence, int32_t slot, int32_t from, int32_t n, int32_t step, uint32_t dt,
                        uint32_t window, void *kc, void *vc, float *out) {
    int32_t seq[512], pos[512];
    for (int32_t t0 = 0; t0 < n; t0 += step) {
        const int32_t m = n - t0 < step ? n - t0 : step;
        for (int32_t t = 0; t < m; t++)
            seq[t] = slot, pos[t] = from + t0 + t;
        assert_ok(att_call(c, one_sequence ? NULL : seq, pos, m, dt, window, kc, vc, out + (int64_t)t0 * HQ * D));
    }
}

/* The same prompt rows as one call, cut into chunks of 100 and of 7 rows, one row at a time,
 * and on one "thread" or two: the same bits. With one sequence (2-D caches), as 1.3 has it. */
static void test_attention_rows_do_not_depend_on_the_chunks(void **state) {
    (void)state;
    enum { FROM = 200, N = 300 };
    const char *names[PLUGIN_ISA_COUNT];
    for (int l = 0, n = levels(names); l < n; l++)
        for (uint32_t window = 0; window <= 100; window += 100) {
            static float want[N * HQ * D], got[N * HQ * D];
            static const int32_t steps[4] = {N, 100, 7, 1};
            kern_ctx one, two;
            assert_ok(kern_init(&one, &host, "test", names[l], serial));
            assert_ok(kern_init(&two, &host, "test", names[l], shuffled));
            void *kc = att_cache(RLX_DTYPE_F32, 5), *vc = att_cache(RLX_DTYPE_F32, 6);
            att_chunked(&one, 1, 0, FROM, N, N, RLX_DTYPE_F32, window, kc, vc, want);
            for (int s = 0; s < 8; s++) {
                void *kc2 = att_cache(RLX_DTYPE_F32, 5), *vc2 = att_cache(RLX_DTYPE_F32, 6);
                att_chunked(s < 4 ? &two : &one, 1, 0, FROM, N, steps[s % 4], RLX_DTYPE_F32, window, kc2, vc2, got);
                for (int t = 0; t < N; t++)
                    if (memcmp(got + t * HQ * D, want + t * HQ * D, HQ * D * sizeof(float)) != 0)
                        fail_msg("%s window %u: row at %d differs in chunks of %d on %d thread(s)", names[l], window,
                                 FROM + t, steps[s % 4], s < 4 ? 2 : 1);
                free(kc2), free(vc2);
            }
            memset(item_runs, 0, sizeof item_runs);
            free(kc), free(vc);
            kern_deinit(&one);
            kern_deinit(&two);
        }
}

/* Each row of the batch above computed alone, and in the batch: the same bits, for both
 * cache dtypes and on one or two "threads"; slot 0's prompt also chunked differently. */
static void test_attention_rows_do_not_depend_on_the_batch(void **state) {
    (void)state;
    const char *names[PLUGIN_ISA_COUNT];
    static const uint32_t dts[2] = {RLX_DTYPE_F32, RLX_DTYPE_F16};
    for (int l = 0, n = levels(names); l < n; l++)
        for (int d = 0; d < 2; d++)
            for (uint32_t window = 0; window <= 100; window += 100) {
                const uint32_t dt = dts[d];
                static float batch[BATCH * HQ * D], alone[HQ * D], chunked[BATCH * HQ * D];
                kern_ctx one, two;
                assert_ok(kern_init(&one, &host, "test", names[l], serial));
                assert_ok(kern_init(&two, &host, "test", names[l], shuffled));
                void *kc = att_cache(dt, 5), *vc = att_cache(dt, 6);
                void *kc2 = att_copy(kc), *vc2 = att_copy(vc);
                assert_ok(att_call(&two, batch_seq, batch_pos, BATCH, dt, window, kc, vc, batch));
                /* alone, in the batch's order, on one thread: each row after the ones before it */
                for (int t = 0; t < BATCH; t++) {
                    assert_ok(att_call(&one, batch_seq + t, batch_pos + t, 1, dt, window, kc2, vc2, alone));
                    if (memcmp(alone, batch + t * HQ * D, sizeof alone) != 0)
                        fail_msg("%s %s window %u: row %d (slot %d at %d) alone differs from the batch", names[l],
                                 rlx_dtype_name((int)dt), window, t, batch_seq[t], batch_pos[t]);
                }
                assert_memory_equal(kc, kc2, (size_t)SLOTS * C * KV * rlx_iface_dtype_size(dt));
                /* slot 0's rows 250..269 in calls of 3, with none of the other slots' rows */
                free(kc2), free(vc2);
                kc2 = att_cache(dt, 5), vc2 = att_cache(dt, 6);
                att_chunked(&two, 0, 0, 250, 20, 3, dt, window, kc2, vc2, chunked);
                for (int t = 1; t <= 16; t++) /* batch rows 1..16 are slot 0 at 250..265 */
                    if (memcmp(chunked + (t - 1) * HQ * D, batch + t * HQ * D, HQ * D * sizeof(float)) != 0)
                        fail_msg("%s %s window %u: slot 0 at %d in chunks of 3 differs from the batch", names[l],
                                 rlx_dtype_name((int)dt), window, batch_pos[t]);
                memset(item_runs, 0, sizeof item_runs);
                free(kc), free(vc), free(kc2), free(vc2);
                kern_deinit(&one);
                kern_deinit(&two);
            }
}

static void test_attention_rejects_rows_outside_the_cache_or_out_of_order(void **state) {
    (void)state;
    kern_ctx c;
    assert_ok(kern_init(&c, &host, "test", "c", serial));
    void *kc = att_cache(RLX_DTYPE_F16, 5), *vc = att_cache(RLX_DTYPE_F16, 6), *before = att_copy(kc);
    float out[3 * HQ * D];
    assert_int_equal(att_call(&c, (int32_t[]){0, 3}, (int32_t[]){1, 1}, 2, RLX_DTYPE_F16, 0, kc, vc, out), RLX_E_RANGE);
    assert_non_null(strstr(host_msg, "test: node 'att': row 1: slot 3 is outside the cache's 3 slots"));
    assert_int_equal(att_call(&c, NULL, (int32_t[]){C}, 1, RLX_DTYPE_F16, 0, kc, vc, out), RLX_E_RANGE);
    assert_non_null(strstr(host_msg, "test: node 'att': row 0: position 700 is outside the KV cache of 700"));
    assert_int_equal(att_call(&c, (int32_t[]){2, 1, 2}, (int32_t[]){9, 9, 9}, 3, RLX_DTYPE_F16, 0, kc, vc, out),
                     RLX_E_INVALID);
    assert_non_null(strstr(host_msg, "row 2: position 9 of slot 2 does not follow position 9"));
    assert_int_equal(att_call(&c, NULL, (int32_t[]){5, 4}, 2, RLX_DTYPE_F16, 0, kc, vc, out), RLX_E_INVALID);
    /* refused calls write nothing */
    assert_memory_equal(kc, before, (size_t)SLOTS * C * KV * 2);
    free(kc), free(vc), free(before);
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
        cmocka_unit_test(test_gemm_gives_each_row_its_gemv_bits),
        cmocka_unit_test(test_attention_agrees_with_the_reference),
        cmocka_unit_test(test_attention_rows_do_not_depend_on_the_chunks),
        cmocka_unit_test(test_attention_rows_do_not_depend_on_the_batch),
        cmocka_unit_test(test_attention_rejects_rows_outside_the_cache_or_out_of_order),
        cmocka_unit_test(test_moe_route_takes_ties_in_expert_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
