/* The quantized matmul kernels of the CPU kernel library (plugins/kernels/kern_quant.h), for each
 * of the eight GGUF weight types at every ISA level this CPU runs:
 *   - the activation quantizers give llama.cpp's blocks bit for bit (restated here from its
 *     x86 quantize_row_q8_0 / _q8_1 and quantize_row_q8_K_ref);
 *   - each output is within a few F32 roundings of the exact (double) dot product of the
 *     dequantized weights with the dequantized activations, and within the
 *     RLX_PRECISION_Q8_ACT bound of the product with the unquantized activations;
 *   - every level, and every way of cutting the rows over threads (emulated cuts, and the
 *     plugins' futex pool with 2 to 5 threads), gives the portable C level's bits, for one
 *     block or many, odd N and M = 1..9, with and without bias;
 *   - repacked weights (kern_qrp.h), packed at once or group by group, give kern_qmatmul's
 *     bits at every level, for M of decode and prefill, on any range of groups, with native
 *     tail rows, bias, and any cut over threads; repacking a mapped file drops its pages;
 *   - EMBED dequantizes rows of quantized tables as rlx_iface_dequant_row does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kern.h"
#include "kern_qblock.h"
#include "quant_host.h"
#include "rlx/quant_iface.h"
#include "testutil.h"

// ---------------------------------------------------------------------------------------------
// parallel_fors: one range, and small ranges in reverse order over "threads"

/* Ranges of `*self` alignment units (1 to 3 in turn when 0), from the end backwards. */
static void cut_ranges(void *self, int64_t n, int64_t align, int64_t work, kern_range_fn fn, void *ctx) {
    (void)work;
    const int64_t fixed = *(const int64_t *)self;
    int64_t units = (n + align - 1) / align, turn = 0;
    while (units > 0) {
        int64_t take = fixed ? fixed : 1 + turn % 3;
        take = take < units ? take : units;
        const int64_t i0 = (units - take) * align, i1 = units * align < n ? units * align : n;
        fn(ctx, (int)(turn++ % 3), i0, i1);
        units -= take;
    }
}

static uint64_t rng = 1; /* tu_rand's */

/* The ISA levels this CPU runs, by name. */
static int levels(const char **names) {
    int n = 0;
    for (int i = 0; i <= (int)plugin_isa_best(); i++)
        names[n++] = plugin_isa_name((plugin_isa)i);
    return n;
}

static const int qtypes[] = {RLX_DTYPE_Q4_0, RLX_DTYPE_Q4_1, RLX_DTYPE_Q5_0, RLX_DTYPE_Q5_1,
                             RLX_DTYPE_Q8_0, RLX_DTYPE_Q4_K, RLX_DTYPE_Q5_K, RLX_DTYPE_Q6_K};
enum { N_QTYPES = sizeof qtypes / sizeof qtypes[0] };

// ---------------------------------------------------------------------------------------------
// Test-only weight quantizers: a scale from the largest magnitude, values rounded; for the K
// types random stored bits (every value, scale and minimum the format allows) under random F16
// super-block scales. None of this has to be a good quantizer, only valid blocks.

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, sizeof v); }

/* One 32-value block of dtype dt from x[32]. */
static void quantize_block32(int dt, const float *x, uint8_t *blk) {
    float lo = x[0], hi = x[0], amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
        amax = fmaxf(amax, fabsf(x[j]));
    }
    const bool with_min = dt == RLX_DTYPE_Q4_1 || dt == RLX_DTYPE_Q5_1;
    const int top = dt == RLX_DTYPE_Q8_0 ? 127 : (dt == RLX_DTYPE_Q4_0 || dt == RLX_DTYPE_Q4_1) ? 15 : 31;
    const float d = with_min ? (hi - lo) / (float)top : amax / (float)(top / 2);
    const int zero = with_min || dt == RLX_DTYPE_Q8_0 ? 0 : top / 2 + 1;
    int q[32];
    for (int j = 0; j < 32; j++) {
        const float v = with_min ? (x[j] - lo) / d : x[j] / d;
        q[j] = dt == RLX_DTYPE_Q8_0 ? clampi((int)lrintf(v), -127, 127) : clampi((int)lrintf(v) + zero, 0, top);
    }
    put_u16(blk, rlx_iface_f32_to_f16(d));
    if (with_min)
        put_u16(blk + 2, rlx_iface_f32_to_f16(lo));
    if (dt == RLX_DTYPE_Q8_0) {
        for (int j = 0; j < 32; j++)
            blk[2 + j] = (uint8_t)(int8_t)q[j];
        return;
    }
    const bool five = dt == RLX_DTYPE_Q5_0 || dt == RLX_DTYPE_Q5_1;
    uint8_t *qs = blk + (with_min ? 4 : 2) + (five ? 4 : 0);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        qh |= (uint32_t)(q[j] >> 4 & 1) << j | (uint32_t)(q[j + 16] >> 4 & 1) << (j + 16);
    }
    if (five)
        memcpy(blk + (with_min ? 4 : 2), &qh, 4);
}

/* One K block: random stored bits, d (and dmin) from the scale of x. */
static void random_block_k(int dt, float scale, uint8_t *blk) {
    const size_t bytes = rlx_iface_dtype_block_bytes((uint32_t)dt);
    for (size_t i = 0; i < bytes; i++)
        blk[i] = (uint8_t)tu_rand(&rng);
    const uint16_t d = rlx_iface_f32_to_f16(scale * (0.5f + 0.5f * fabsf(tu_uniform(&rng))) / 64.0f);
    if (dt == RLX_DTYPE_Q6_K) {
        put_u16(blk + bytes - 2, d);
    } else {
        put_u16(blk, d);
        put_u16(blk + 2, rlx_iface_f32_to_f16(scale * fabsf(tu_uniform(&rng)) / 64.0f));
    }
}

/* A weight [N, K] of dtype dt; 32-value types from random floats, some blocks of random bits
 * (so extreme stored values, Q8_0's -128 among them, occur). */
static uint8_t *make_weight(int dt, int64_t N, int64_t K) {
    const size_t row = rlx_iface_row_bytes((uint32_t)dt, K), bb = rlx_iface_dtype_block_bytes((uint32_t)dt);
    const int64_t blk = rlx_iface_dtype_block((uint32_t)dt), nb = K / blk;
    uint8_t *w = malloc((size_t)N * row);
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *p = w + (size_t)n * row + (size_t)b * bb;
            const float scale = 0.05f + 2.0f * fabsf(tu_uniform(&rng));
            if (blk == RLX_QK_K) {
                random_block_k(dt, scale, p);
            } else if (tu_rand(&rng) % 8 == 0) {
                for (size_t i = 0; i < bb; i++)
                    p[i] = (uint8_t)tu_rand(&rng);
                put_u16(p, rlx_iface_f32_to_f16(scale / 64.0f));
                if (dt == RLX_DTYPE_Q4_1 || dt == RLX_DTYPE_Q5_1)
                    put_u16(p + 2, rlx_iface_f32_to_f16(-scale * fabsf(tu_uniform(&rng))));
            } else {
                float x[32];
                for (int j = 0; j < 32; j++)
                    x[j] = scale * tu_uniform(&rng);
                quantize_block32(dt, x, p);
            }
        }
    return w;
}

/* Activations [M, K]: values of mixed magnitudes, some blocks all zero, some with ties. */
static float *make_x(int64_t M, int64_t K) {
    float *x = malloc((size_t)(M * K) * sizeof(float));
    for (int64_t i = 0; i < M * K; i++) {
        const int64_t blk = i / 32;
        x[i] = blk % 11 == 5   ? 0.0f
               : blk % 13 == 7 ? (float)((int)(tu_rand(&rng) % 9) - 4) * 0.25f
                               : tu_uniform(&rng) * (1.0f + (float)(blk % 5));
    }
    return x;
}

// ---------------------------------------------------------------------------------------------
// (a) The activation quantizers against llama.cpp's rules, restated

/* llama.cpp's nearest_int: the float trick that rounds to nearest even. */
static int nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static void check_q8_row(int dt, const float *x, int64_t K, const void *row) {
    const kern_q8_row r = kern_q8_view(dt, row, K);
    if (rlx_iface_dtype_block((uint32_t)dt) == RLX_QK) {
        for (int64_t b = 0; b < K / 32; b++) {
            const float *xb = x + b * 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
            const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                const int q = (int)nearbyintf(xb[j] * id);
                assert_int_equal(r.qs[b * 32 + j], q);
                sum += q;
            }
            assert_int_equal(r.sums[b], sum);
            const float d16 = rlx_iface_f16_to_f32(rlx_iface_f32_to_f16(d));
            const float s16 = rlx_iface_f16_to_f32(rlx_iface_f32_to_f16(d * (float)sum));
            assert_memory_equal(&r.d[b], &d16, sizeof d16);
            assert_memory_equal(&r.s[b], &s16, sizeof s16);
        }
        return;
    }
    for (int64_t b = 0; b < K / 256; b++) {
        const float *xb = x + b * 256;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 256; j++)
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        const float iscale = amax != 0.0f ? -127.f / max : 0.0f;
        for (int j = 0; j < 256; j++) {
            const int v = amax != 0.0f ? nearest_int(iscale * xb[j]) : 0;
            assert_int_equal(r.qs[b * 256 + j], v < 127 ? v : 127);
        }
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += r.qs[b * 256 + g * 16 + j];
            assert_int_equal(r.sums[b * 16 + g], sum);
        }
        const float d = amax != 0.0f ? 1 / iscale : 0.0f;
        assert_memory_equal(&r.d[b], &d, sizeof d);
    }
}

/* Every level's quantizer on rows with zero blocks, exact halves and ties of magnitude. */
static void test_activation_quantizers_are_llama_cpps(void **state) {
    (void)state;
    for (int t = 0; t < N_QTYPES; t++) {
        const int64_t K = 1024;
        float *x = make_x(3, K);
        x[7] = 0.5f * (x[8] = 127.0f / 64.0f); /* exact halves after scaling */
        for (int i = 0; i < 512; i++)          /* magnitudes tied, signs mixed: the first one decides Q8_K's sign */
            x[2 * K + i] = (tu_rand(&rng) & 1 ? 1.0f : -1.0f) * (i % 3 ? 0.5f : 1.0f);
        void *row = quant_host_alloc(kern_q8_row_bytes(qtypes[t], K), 64);
        const char *names[PLUGIN_ISA_COUNT];
        for (int l = 0, n = levels(names); l < n; l++)
            for (int m = 0; m < 3; m++) {
                memset(row, 0x55, kern_q8_row_bytes(qtypes[t], K));
                kern_qsimd_at((plugin_isa)l)->quantize(qtypes[t], x + m * K, K, row);
                check_q8_row(qtypes[t], x + m * K, K, row);
            }
        free(row);
        free(x);
    }
}

// ---------------------------------------------------------------------------------------------
// (b), (c) Accuracy against double-precision sums

/* Checks y[M, N] (no bias) against the exact products of dequant(w) with dequant(q8(x)) and
 * with x itself. */
static void check_accuracy(int dt, const uint8_t *w, const float *x, int64_t M, int64_t K, int64_t N, const float *y) {
    const size_t row = rlx_iface_row_bytes((uint32_t)dt, K), qrow = kern_q8_row_bytes(dt, K);
    const int64_t blk = rlx_iface_dtype_block((uint32_t)dt);
    float *wf = malloc((size_t)K * sizeof(float));
    void *xq = quant_host_alloc(qrow, 64);
    for (int64_t m = 0; m < M; m++) {
        kern_q8_quantize_row(dt, x + m * K, K, xq);
        const kern_q8_row r = kern_q8_view(dt, xq, K);
        for (int64_t n = 0; n < N; n++) {
            assert_int_equal(rlx_iface_dequant_row((uint32_t)dt, w + (size_t)n * row, wf, K), 0);
            double exact_q = 0.0, exact = 0.0, mag = 0.0, bound = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double xd = (double)r.d[k / blk] * r.qs[k];
                exact_q += (double)wf[k] * xd;
                exact += (double)wf[k] * x[m * K + k];
                mag += fabs((double)wf[k] * xd);
                bound += fabs((double)r.d[k / blk]) / 2 * fabs((double)wf[k]);
            }
            if (dt == RLX_DTYPE_Q4_1 || dt == RLX_DTYPE_Q5_1) {
                /* the minimum meets the activations through Q8_1's s = F16(d * sum q), not through
                 * the sum of the dequantized activations: exact_q takes s, and the bound its
                 * rounding (part of llama.cpp's Q8_1; the ABI's bound leaves it out) */
                const uint8_t *wr = w + (size_t)n * row;
                for (int64_t b = 0; b < K / 32; b++) {
                    uint16_t mh;
                    memcpy(&mh, wr + (size_t)b * rlx_iface_dtype_block_bytes((uint32_t)dt) + 2, sizeof mh);
                    const double mw = rlx_iface_f16_to_f32(mh), sx = (double)r.d[b] * r.sums[b];
                    exact_q += mw * ((double)r.s[b] - sx);
                    bound += fabs(mw * ((double)r.s[b] - sx));
                }
            }
            const double got = y[m * N + n];
            /* F32 products and sums, about nb + 8 roundings deep, each at most 2^-24 relative */
            const double slack = (double)(K / blk + 16) * 0x1p-23 * (mag + 1e-30);
            if (fabs(got - exact_q) > slack)
                fail_msg("dtype %d K %lld m %lld n %lld: %.9g, exact %.9g (slack %.3g)", dt, (long long)K, (long long)m,
                         (long long)n, got, exact_q, slack);
            if (fabs(got - exact) > bound + slack + 1e-30)
                fail_msg("dtype %d K %lld m %lld n %lld: %.9g vs unquantized %.9g beyond the Q8_ACT bound %.3g", dt,
                         (long long)K, (long long)m, (long long)n, got, exact, bound + slack);
        }
    }
    free(xq);
    free(wf);
}

// ---------------------------------------------------------------------------------------------
// (d), (e) Every level and every split give the C level's bits

typedef struct shape {
    int64_t K_blocks, N, M;
} shape;

static void run_qmatmul(const char *isa, kern_par par, int dt, const uint8_t *w, const float *x, int64_t M, int64_t K,
                        int64_t N, const float *bias, float *y) {
    kern_ctx c;
    assert_ok(kern_init(&c, &quant_host, "test", isa, par));
    for (int64_t i = 0; i < M * N; i++)
        y[i] = NAN; /* every output must be written */
    assert_ok(kern_qmatmul(&c, x, M, K, w, dt, N, bias, y));
    kern_deinit(&c);
}

static void test_qmatmul_topand_splits_agree(void **state) {
    (void)state;
    static const shape shapes[] = {{1, 1, 1}, {1, 5, 2},  {3, 17, 3}, {4, 16, 4},  {5, 33, 5},
                                   {8, 7, 6}, {9, 20, 7}, {2, 3, 8},  {33, 19, 9}, {12, 40, 1}};
    const char *names[PLUGIN_ISA_COUNT];
    const int n_levels = levels(names);
    static int64_t fixed[] = {0, 1, 2, 5};
    for (int t = 0; t < N_QTYPES; t++) {
        const int dt = qtypes[t];
        const int64_t blk = rlx_iface_dtype_block((uint32_t)dt);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            /* the K types on fewer blocks: 256 values each */
            const int64_t K = (blk == RLX_QK_K ? (shapes[s].K_blocks + 3) / 4 : shapes[s].K_blocks) * blk;
            const int64_t N = shapes[s].N, M = shapes[s].M;
            uint8_t *w = make_weight(dt, N, K);
            float *x = make_x(M, K), *bias = malloc((size_t)N * sizeof(float));
            for (int64_t n = 0; n < N; n++)
                bias[n] = tu_uniform(&rng);
            float *ref = malloc((size_t)(M * N) * sizeof(float)), *y = malloc((size_t)(M * N) * sizeof(float));
            const kern_par serial = {
                .n_threads = 1, .parallel_for = quant_serial_for, .parallel_tasks = quant_serial_tasks};
            run_qmatmul("c", serial, dt, w, x, M, K, N, NULL, ref);
            check_accuracy(dt, w, x, M, K, N, ref);
            for (int l = 0; l < n_levels; l++) {
                run_qmatmul(names[l], serial, dt, w, x, M, K, N, NULL, y);
                if (memcmp(ref, y, (size_t)(M * N) * sizeof(float)))
                    fail_msg("dtype %d at %s differs from c (K %lld N %lld M %lld)", dt, names[l], (long long)K,
                             (long long)N, (long long)M);
                for (size_t f = 0; f < sizeof fixed / sizeof fixed[0]; f++) {
                    const kern_par cut = {.self = &fixed[f],
                                          .n_threads = 3,
                                          .parallel_for = cut_ranges,
                                          .parallel_tasks = quant_serial_tasks};
                    run_qmatmul(names[l], cut, dt, w, x, M, K, N, bias, y);
                    for (int64_t i = 0; i < M * N; i++) {
                        const float want = ref[i] + bias[i % N];
                        if (memcmp(&want, &y[i], sizeof want))
                            fail_msg("dtype %d at %s, split %lld: y[%lld] %.9g, want %.9g", dt, names[l],
                                     (long long)fixed[f], (long long)i, y[i], want);
                    }
                }
            }
            free(y);
            free(ref);
            free(bias);
            free(x);
            free(w);
        }
    }
}

/* Real threads: the futex pool with 2, 3 and 5 threads (more than this machine may have cores)
 * on shapes big enough to be cut (KERN_PAR_MIN), every level against one serial C run. */
static void test_qmatmul_threads_give_the_same_bits(void **state) {
    (void)state;
    const char *names[PLUGIN_ISA_COUNT];
    const int n_levels = levels(names);
    const kern_par serial = {.n_threads = 1, .parallel_for = quant_serial_for, .parallel_tasks = quant_serial_tasks};
    for (int t = 0; t < N_QTYPES; t++) {
        const int dt = qtypes[t];
        const int64_t K = 1024, N = 203, M = 6;
        uint8_t *w = make_weight(dt, N, K);
        float *x = make_x(M, K), *ref = malloc((size_t)(M * N) * sizeof(float)),
              *y = malloc((size_t)(M * N) * sizeof(float));
        run_qmatmul("c", serial, dt, w, x, M, K, N, NULL, ref);
        for (int n_threads = 2; n_threads <= 5; n_threads += n_threads == 2 ? 1 : 2) {
            quant_pool qp;
            assert_int_equal(quant_pool_start(&qp, n_threads), 0);
            for (int l = 0; l < n_levels; l++)
                for (int rep = 0; rep < 3; rep++) {
                    run_qmatmul(names[l], quant_pool_par(&qp), dt, w, x, M, K, N, NULL, y);
                    if (memcmp(ref, y, (size_t)(M * N) * sizeof(float)))
                        fail_msg("dtype %d at %s on %d threads differs from serial c", dt, names[l], n_threads);
                }
            plugin_pool_destroy(qp.pool);
        }
        free(y);
        free(ref);
        free(x);
        free(w);
    }
}

/* The kernels straight from each level's table, M = 1..4 on a row range in the middle. */
static void test_gemv_tables_agree(void **state) {
    (void)state;
    const char *names[PLUGIN_ISA_COUNT];
    const int n_levels = levels(names);
    for (int t = 0; t < N_QTYPES; t++) {
        const int dt = qtypes[t];
        const int64_t K = rlx_iface_dtype_block((uint32_t)dt) == RLX_QK ? 32 * 37 : 256 * 5, N = 23;
        uint8_t *w = make_weight(dt, N, K);
        float *x = make_x(KERN_QGEMV_MAX_M, K);
        const size_t qrow = kern_q8_row_bytes(dt, K);
        char *xq = quant_host_alloc(KERN_QGEMV_MAX_M * qrow, 64);
        for (int m = 0; m < KERN_QGEMV_MAX_M; m++)
            kern_q8_quantize_row(dt, x + m * K, K, xq + m * qrow);
        for (int M = 1; M <= KERN_QGEMV_MAX_M; M++) {
            float ref[KERN_QGEMV_MAX_M * N], y[KERN_QGEMV_MAX_M * N];
            memset(ref, 0, sizeof ref);
            kern_qsimd_at(PLUGIN_ISA_C)->gemv[dt][M - 1](w, K, xq, qrow, 3, N - 2, ref, N);
            /* the avx512 level twice: as this CPU picks it (with VNNI if it has it), and with
             * VNNI turned off */
            for (int l = 0; l <= n_levels; l++) {
                const plugin_isa isa = l < n_levels ? (plugin_isa)l : PLUGIN_ISA_AVX512;
                if (l == n_levels && (isa != plugin_isa_best() || strcmp(kern_qsimd_at(isa)->isa, "avx512-vnni")))
                    break;
                if (l == n_levels)
                    setenv("RLX_QUANT_VNNI", "0", 1);
                const kern_qsimd *q = kern_qsimd_at(isa);
                unsetenv("RLX_QUANT_VNNI");
                memset(y, 0, sizeof y);
                q->gemv[dt][M - 1](w, K, xq, qrow, 3, N - 2, y, N);
                if (memcmp(ref, y, sizeof y))
                    fail_msg("dtype %d M %d: level %s differs from c", dt, M, q->isa);
            }
        }
        free(xq);
        free(x);
        free(w);
    }
}

// ---------------------------------------------------------------------------------------------
// (f) Repacked weights (kern_qrp.h) give kern_qmatmul's bits

/* The repacked copy of w: group by group in reverse order (as pieces would be), the native tail
 * rows copied; checked against packing every group at once. */
static uint8_t *repack(int dt, const uint8_t *w, int64_t N, int64_t K) {
    const size_t bytes = (size_t)N * rlx_iface_row_bytes((uint32_t)dt, K);
    const int64_t G = N / KERN_QRP_ROWS;
    const size_t tail = (size_t)G * KERN_QRP_ROWS * rlx_iface_row_bytes((uint32_t)dt, K);
    uint8_t *whole = quant_host_alloc(bytes, 64), *pieces = quant_host_alloc(bytes, 64);
    memset(whole, 0xA5, bytes);
    memset(pieces, 0x5A, bytes);
    kern_qrp_pack(dt, w, K, 0, G, whole);
    for (int64_t g = G; g > 0; g--)
        kern_qrp_pack(dt, w, K, g - 1, g, pieces);
    memcpy(whole + tail, w + tail, bytes - tail);
    memcpy(pieces + tail, w + tail, bytes - tail);
    if (memcmp(whole, pieces, bytes))
        fail_msg("dtype %d: packing group by group differs from packing at once (N %lld K %lld)", dt, (long long)N,
                 (long long)K);
    free(pieces);
    return whole;
}

/* Every level's repacked kernel, on the whole groups and on pieces of them, against the C
 * level's kern_qmatmul on the native weight, for the M of decode and prefill alike. */
static void test_repacked_kernels_give_native_bits(void **state) {
    (void)state;
    static const int64_t Ks[] = {1, 3, 8, 37}, Ns[] = {8, 16, 40}, Ms[] = {1, 2, 3, 4, 5, 7, 8, 12, 13, 33, 128};
    const kern_par serial = {.n_threads = 1, .parallel_for = quant_serial_for, .parallel_tasks = quant_serial_tasks};
    int n_types = 0;
    for (int t = 0; t < N_QTYPES; t++) {
        const int dt = qtypes[t];
        if (!kern_qrp_supported(dt))
            continue;
        n_types++;
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                const int64_t K = Ks[ki] * rlx_iface_dtype_block((uint32_t)dt), N = Ns[ni], G = N / KERN_QRP_ROWS;
                uint8_t *w = make_weight(dt, N, K), *wp = repack(dt, w, N, K);
                for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                    const int64_t M = Ms[mi];
                    const size_t qrow = kern_q8_row_bytes(dt, K);
                    float *x = make_x(M, K), *ref = malloc((size_t)(M * N) * sizeof(float)),
                          *y = malloc((size_t)(M * N) * sizeof(float));
                    char *xq = quant_host_alloc((size_t)M * qrow, 64);
                    for (int64_t m = 0; m < M; m++)
                        kern_q8_quantize_row(dt, x + m * K, K, xq + m * qrow);
                    run_qmatmul("c", serial, dt, w, x, M, K, N, NULL, ref);
                    /* the avx512 level twice where the CPU has VNNI: with and without it */
                    const int vnni_too = plugin_isa_best() >= PLUGIN_ISA_AVX512 && kern_quant_vnni();
                    for (int l = 0; l <= (int)plugin_isa_best() + vnni_too; l++) {
                        const int no_vnni = l > (int)plugin_isa_best();
                        if (no_vnni)
                            setenv("RLX_QUANT_VNNI", "0", 1);
                        const kern_qrp_ops *ops = kern_qrp_ops_at(no_vnni ? PLUGIN_ISA_AVX512 : (plugin_isa)l, dt);
                        if (no_vnni)
                            unsetenv("RLX_QUANT_VNNI");
                        for (int64_t piece = 0; piece <= 3; piece++) {
                            /* piece 0: all groups at once; else pieces of 1, 2, 3 groups, last first */
                            for (int64_t i = 0; i < M * N; i++)
                                y[i] = NAN;
                            for (int64_t g1 = G; g1 > 0; g1 -= piece ? piece : G) {
                                const int64_t g0 = piece && g1 - piece > 0 ? g1 - piece : 0;
                                ops->matmul(wp, K, xq, qrow, M, g0, g1, y, N);
                            }
                            for (int64_t m = 0; m < M; m++)
                                if (memcmp(ref + m * N, y + m * N, (size_t)N * sizeof(float)))
                                    fail_msg("dtype %d at %s: repacked row %lld differs (K %lld N %lld M %lld, "
                                             "pieces of %lld groups)",
                                             dt, ops->isa, (long long)m, (long long)K, (long long)N, (long long)M,
                                             (long long)piece);
                        }
                    }
                    free(xq);
                    free(y);
                    free(ref);
                    free(x);
                }
                free(wp);
                free(w);
            }
    }
    if (n_types == 0)
        fail_msg("no type has a repacked form");
}

/* kern_prepare_qrp and kern_qrp_matmul as a backend uses them: N % 8 tail rows in the native
 * layout, bias, cuts of every size and the futex pool, every level, against kern_qmatmul. */
static void test_repacked_matmul_gives_native_bits(void **state) {
    (void)state;
    static const int64_t Ns[] = {1, 5, 13, 203}, Ms[] = {1, 3, 13, 40};
    static int64_t fixed[] = {0, 1, 2, 5};
    const kern_par serial = {.n_threads = 1, .parallel_for = quant_serial_for, .parallel_tasks = quant_serial_tasks};
    quant_pool qp;
    assert_int_equal(quant_pool_start(&qp, 3), 0);
    for (int t = 0; t < N_QTYPES; t++) {
        const int dt = qtypes[t];
        if (!kern_qrp_supported(dt))
            continue;
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            const int64_t K = 11 * rlx_iface_dtype_block((uint32_t)dt), N = Ns[ni];
            uint8_t *w = make_weight(dt, N, K);
            const rlx_tensor tw = {.dtype = (uint32_t)dt, .n_dims = 2, .shape = {N, K, 1, 1}, .data = w};
            const rlx_weight_info info = {
                .size = sizeof info, .tensor = &tw, .name = "w", .op = RLX_OP_MATMUL, .input = 1};
            assert_true(kern_qrp_use(&info));
            float *bias = malloc((size_t)N * sizeof(float));
            for (int64_t n = 0; n < N; n++)
                bias[n] = tu_uniform(&rng);
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                const int64_t M = Ms[mi];
                float *x = make_x(M, K), *ref = malloc((size_t)(M * N) * sizeof(float)),
                      *y = malloc((size_t)(M * N) * sizeof(float));
                run_qmatmul("c", serial, dt, w, x, M, K, N, bias, ref);
                for (int l = 0; l <= (int)plugin_isa_best(); l++)
                    for (size_t f = 0; f <= sizeof fixed / sizeof fixed[0]; f++) {
                        const kern_par cut = {.self = &fixed[f < 4 ? f : 0],
                                              .n_threads = 3,
                                              .parallel_for = cut_ranges,
                                              .parallel_tasks = quant_serial_tasks};
                        kern_ctx c;
                        assert_ok(kern_init(&c, &quant_host, "test", plugin_isa_name((plugin_isa)l),
                                            f < 4 ? cut : quant_pool_par(&qp)));
                        void *h;
                        assert_ok(kern_prepare_qrp(&c, &info, false, &h));
                        for (int64_t i = 0; i < M * N; i++)
                            y[i] = NAN;
                        assert_ok(kern_qrp_matmul(&c, x, M, h, bias, y));
                        if (memcmp(ref, y, (size_t)(M * N) * sizeof(float)))
                            fail_msg("dtype %d at %s, cut %zu: repacked matmul differs (N %lld M %lld)", dt,
                                     plugin_isa_name((plugin_isa)l), f, (long long)N, (long long)M);
                        kern_release_qrp(&c, h);
                        kern_deinit(&c);
                    }
                free(y);
                free(ref);
                free(x);
            }
            free(bias);
            free(w);
        }
    }
    plugin_pool_destroy(qp.pool);
}

/* Resident bytes of this process (mapped file pages included). */
static size_t resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, rss = 0;
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%llu %llu", &size, &rss), 2);
    fclose(f);
    return (size_t)rss * (size_t)sysconf(_SC_PAGESIZE);
}

/* A weight larger than KERN_QRP_PIECE, read-only mapped from a file and repacked with drop: the
 * process holds the repacked copy in place of the mapped pages (its resident size grows by far
 * less than the copy), and the copy, made while earlier pieces' pages were being dropped, still
 * gives kern_qmatmul's bits on the (refaulted) file. */
static void test_repacking_a_mapped_file_drops_its_pages(void **state) {
    (void)state;
    const int dt = RLX_DTYPE_Q4_0;
    const int64_t K = 4096, N = 4096 + 5, M = 2;
    const size_t bytes = (size_t)N * rlx_iface_row_bytes((uint32_t)dt, K);
    assert_true(bytes > (size_t)KERN_QRP_PIECE); /* two pieces at least */
    uint8_t *w = make_weight(dt, N, K);
    char path[] = "/tmp/rlx_qrp_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    assert_int_equal(write(fd, w, bytes), (ssize_t)bytes);
    const void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    assert_true(map != MAP_FAILED);
    close(fd);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < bytes; i += page) /* every page faulted in */
        (void)((const volatile uint8_t *)map)[i];
    const kern_par serial = {.n_threads = 1, .parallel_for = quant_serial_for, .parallel_tasks = quant_serial_tasks};
    kern_ctx c;
    assert_ok(kern_init(&c, &quant_host, "test", NULL, serial));
    const rlx_tensor tw = {.dtype = (uint32_t)dt, .n_dims = 2, .shape = {N, K, 1, 1}, .data = (void *)map};
    const rlx_weight_info info = {.size = sizeof info,
                                  .flags = RLX_WEIGHT_FILE_BACKED | RLX_WEIGHT_READ_ONLY,
                                  .tensor = &tw,
                                  .name = "w",
                                  .op = RLX_OP_MATMUL,
                                  .input = 1};
    void *h;
    const size_t before = resident_bytes();
    assert_ok(kern_prepare_qrp(&c, &info, true, &h));
    const size_t after = resident_bytes();
    if (after > before + bytes / 4)
        fail_msg("repacking %zu mapped bytes grew the resident size by %zu bytes", bytes, after - before);
    float *x = make_x(M, K), *ref = malloc((size_t)(M * N) * sizeof(float)),
          *y = malloc((size_t)(M * N) * sizeof(float));
    assert_ok(kern_qrp_matmul(&c, x, M, h, NULL, y));
    assert_ok(kern_qmatmul(&c, x, M, K, map, dt, N, NULL, ref));
    assert_memory_equal(ref, y, (size_t)(M * N) * sizeof(float));
    kern_release_qrp(&c, h);
    kern_deinit(&c);
    munmap((void *)map, bytes);
    free(y);
    free(ref);
    free(x);
    free(w);
}

// ---------------------------------------------------------------------------------------------
// EMBED of quantized tables

static void test_embed_dequantizes_rows(void **state) {
    (void)state;
    const kern_par serial = {.n_threads = 1, .parallel_for = quant_serial_for, .parallel_tasks = quant_serial_tasks};
    const int32_t ids[5] = {3, 0, 6, 3, 1};
    for (int t = 0; t < N_QTYPES; t++) {
        const int dt = qtypes[t];
        const int64_t cols = 2 * rlx_iface_dtype_block((uint32_t)dt), V = 7;
        uint8_t *table = make_weight(dt, V, cols);
        float y[5 * 512], want[512];
        kern_ctx c;
        assert_ok(kern_init(&c, &quant_host, "test", NULL, serial));
        kern_embed(&c, table, dt, cols, ids, 5, y);
        kern_deinit(&c);
        for (int i = 0; i < 5; i++) {
            rlx_iface_dequant_row((uint32_t)dt, table + (size_t)ids[i] * rlx_iface_row_bytes((uint32_t)dt, cols), want,
                                  cols);
            assert_memory_equal(y + i * cols, want, (size_t)cols * sizeof(float));
        }
        free(table);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_activation_quantizers_are_llama_cpps),
        cmocka_unit_test(test_gemv_tables_agree),
        cmocka_unit_test(test_qmatmul_topand_splits_agree),
        cmocka_unit_test(test_qmatmul_threads_give_the_same_bits),
        cmocka_unit_test(test_repacked_kernels_give_native_bits),
        cmocka_unit_test(test_repacked_matmul_gives_native_bits),
        cmocka_unit_test(test_repacking_a_mapped_file_drops_its_pages),
        cmocka_unit_test(test_embed_dequantizes_rows),
    };
    printf("quantized kernels at every level up to %s (%s)\n", plugin_isa_name(plugin_isa_best()),
           kern_qsimd_at(plugin_isa_best())->isa);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
