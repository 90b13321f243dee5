/* The row-interleaved K-type weights of the CPU kernel library (plugins/kernels/kern_qrpk.c,
 * the K family of kern_qrp.h), for Q4_K, Q5_K and Q6_K at every ISA level this CPU runs:
 *   - packing in pieces of groups writes every byte of the groups, the same bytes as packing at
 *     once;
 *   - the repacked matmul over groups [g0, g1), cut in pieces, with the native tail rows from
 *     kern_qmatmul_part, gives kern_qmatmul_part's bits on the native weight (the portable C
 *     level's, which every level of kern_qmatmul gives) for M in 1..128 (every way the kernels
 *     cut M into 4 rows and fewer), K of 1, 2, 3, 4 and 12 blocks (each lane b % 4 with one
 *     block or several), N below 8 and not a multiple of 8;
 *   - other types have no K repacked form.
 * `quant_repacked_k --bench [--threads T]` times the packing, and the repacked kernels against
 * kern_qmatmul's at K = 1024, N = 3072, M = 1 and 128 (never run by ctest). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kern_qblock.h"
#include "kern_qrp.h"
#include "quant_host.h"
#include "rlx/quant_iface.h"
#include "testutil.h"

static uint64_t rng = 7; /* tu_rand's */

static const int ktypes[] = {RLX_DTYPE_Q4_K, RLX_DTYPE_Q5_K, RLX_DTYPE_Q6_K};
enum { N_KTYPES = sizeof ktypes / sizeof ktypes[0] };

/* A weight [N, K] of K blocks of random bits (every stored value, scale and minimum the format
 * allows) under F16 super-block scales of random magnitudes. */
static uint8_t *make_weight(int dt, int64_t N, int64_t K) {
    const size_t bb = rlx_iface_dtype_block_bytes((uint32_t)dt),
                 bytes = (size_t)N * rlx_iface_row_bytes((uint32_t)dt, K);
    uint8_t *w = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        w[i] = (uint8_t)tu_rand(&rng);
    for (size_t at = 0; at < bytes; at += bb) {
        const float scale = (0.05f + 2.0f * fabsf(tu_uniform(&rng))) / 64.0f;
        const uint16_t d = rlx_iface_f32_to_f16(scale), dmin = rlx_iface_f32_to_f16(scale * fabsf(tu_uniform(&rng)));
        if (dt == RLX_DTYPE_Q6_K) {
            memcpy(w + at + bb - 2, &d, 2);
        } else {
            memcpy(w + at, &d, 2);
            memcpy(w + at + 2, &dmin, 2);
        }
    }
    return w;
}

/* M activation rows of K values quantized for the K types (one layout for all three), the
 * magnitudes varying by block and some blocks all zero (d = 0). */
static char *make_xq(int64_t M, int64_t K, size_t *stride) {
    *stride = kern_q8_row_bytes(RLX_DTYPE_Q4_K, K);
    char *xq = quant_host_alloc((size_t)M * *stride, 64);
    float *x = malloc((size_t)K * sizeof(float));
    for (int64_t m = 0; m < M; m++) {
        for (int64_t i = 0; i < K; i++) {
            const int64_t blk = (m * K + i) / RLX_QK_K;
            x[i] = blk % 7 == 3 ? 0.0f : tu_uniform(&rng) * (1.0f + (float)(blk % 5));
        }
        kern_q8_quantize_row(RLX_DTYPE_Q4_K, x, K, xq + (size_t)m * *stride);
    }
    free(x);
    return xq;
}

/* The end of a piece of 1 to `most` groups from g0, at most G. */
static int64_t piece_end(int64_t g0, int64_t G, int most) {
    const int64_t g1 = g0 + 1 + (int64_t)(tu_rand(&rng) % (uint32_t)most);
    return g1 < G ? g1 : G;
}

/* The whole repacked weight: the groups packed in random pieces, the tail rows copied. */
static uint8_t *repack(int dt, const uint8_t *w, int64_t N, int64_t K) {
    const size_t row = rlx_iface_row_bytes((uint32_t)dt, K);
    const int64_t G = N / KERN_QRP_ROWS;
    uint8_t *wp = malloc((size_t)N * row);
    for (int64_t g0 = 0; g0 < G;) {
        const int64_t g1 = piece_end(g0, G, 3);
        assert_int_equal(kern_qrpk_pack(dt, w, K, g0, g1, wp), 1);
        g0 = g1;
    }
    memcpy(wp + (size_t)G * KERN_QRP_ROWS * row, w + (size_t)G * KERN_QRP_ROWS * row,
           (size_t)(N % KERN_QRP_ROWS) * row);
    return wp;
}

// ---------------------------------------------------------------------------------------------
// Packing

static void test_packing_in_pieces_is_packing_at_once(void **state) {
    (void)state;
    for (int t = 0; t < N_KTYPES; t++) {
        const int dt = ktypes[t];
        const int64_t K = 3 * RLX_QK_K, N = 5 * KERN_QRP_ROWS;
        const size_t bytes = (size_t)N * rlx_iface_row_bytes((uint32_t)dt, K);
        uint8_t *w = make_weight(dt, N, K), *once = malloc(bytes), *pieces = malloc(bytes);
        /* different fillings: equal results mean every byte was written, and written alike */
        memset(once, 0xAA, bytes);
        memset(pieces, 0x55, bytes);
        assert_int_equal(kern_qrpk_pack(dt, w, K, 0, 5, once), 1);
        assert_int_equal(kern_qrpk_pack(dt, w, K, 3, 5, pieces), 1);
        assert_int_equal(kern_qrpk_pack(dt, w, K, 0, 1, pieces), 1);
        assert_int_equal(kern_qrpk_pack(dt, w, K, 1, 3, pieces), 1);
        assert_memory_equal(once, pieces, bytes);
        free(pieces);
        free(once);
        free(w);
    }
}

static void test_other_types_have_no_k_form(void **state) {
    (void)state;
    const int others[] = {RLX_DTYPE_F32, RLX_DTYPE_F16, RLX_DTYPE_Q4_0, RLX_DTYPE_Q5_1, RLX_DTYPE_Q8_0};
    uint8_t byte = 0;
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        for (int l = 0; l < PLUGIN_ISA_COUNT; l++)
            assert_null(kern_qrpk_ops_at((plugin_isa)l, others[i]));
        assert_int_equal(kern_qrpk_pack(others[i], &byte, 256, 0, 0, &byte), 0);
    }
}

// ---------------------------------------------------------------------------------------------
// Matmul against the native kernels

static const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 12, 13, 33, 128};
static const int64_t Ks[] = {256, 512, 768, 1024, 3072};
static const int64_t Ns[] = {3, 8, 21, 44};

/* y = the repacked weight times M rows of xq at level isa: the groups in random pieces, the
 * tail rows native (at the same level, as a backend runs them). ldy > N, the columns past N
 * keep their NaN. */
static void repacked_matmul(plugin_isa isa, int dt, const uint8_t *wp, int64_t N, int64_t K, const char *xq,
                            size_t stride, int64_t M, float *y, int64_t ldy) {
    const kern_qrp_ops *ops = kern_qrpk_ops_at(isa, dt);
    assert_non_null(ops);
    const int64_t G = N / KERN_QRP_ROWS;
    for (int64_t g0 = 0; g0 < G;) {
        const int64_t g1 = piece_end(g0, G, 4);
        ops->matmul(wp, K, xq, stride, M, g0, g1, y, ldy);
        g0 = g1;
    }
    if (N % KERN_QRP_ROWS)
        kern_qmatmul_part(kern_qsimd_at(isa), dt, xq, stride, M, K,
                          wp + (size_t)G * KERN_QRP_ROWS * rlx_iface_row_bytes((uint32_t)dt, K), N % KERN_QRP_ROWS,
                          NULL, y + G * KERN_QRP_ROWS, ldy);
}

static void test_repacked_matmul_gives_the_native_bits(void **state) {
    (void)state;
    const int64_t max_m = Ms[sizeof Ms / sizeof Ms[0] - 1];
    for (int l = (int)plugin_isa_best() + 1; l < PLUGIN_ISA_COUNT; l++)
        printf("level %s not run: this CPU lacks it\n", plugin_isa_name((plugin_isa)l));
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        const int64_t K = Ks[ki];
        size_t stride;
        char *xq = make_xq(max_m, K, &stride);
        for (int t = 0; t < N_KTYPES; t++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                const int dt = ktypes[t];
                const int64_t N = Ns[ni], ldy = N + 3;
                uint8_t *w = make_weight(dt, N, K), *wp = repack(dt, w, N, K);
                float *ref = malloc((size_t)(max_m * ldy) * sizeof(float));
                float *y = malloc((size_t)(max_m * ldy) * sizeof(float));
                for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
                    const int64_t M = Ms[mi];
                    for (int64_t i = 0; i < M * ldy; i++)
                        ref[i] = NAN;
                    kern_qmatmul_part(kern_qsimd_at(PLUGIN_ISA_C), dt, xq, stride, M, K, w, N, NULL, ref, ldy);
                    /* the avx512 level twice where the CPU has VNNI: its vpdpbusd variant, and
                     * with it turned off (RLX_QUANT_VNNI=0) */
                    const int vnni_too = plugin_isa_best() >= PLUGIN_ISA_AVX512 && kern_quant_vnni();
                    for (int lv = 0; lv <= (int)plugin_isa_best() + vnni_too; lv++) {
                        const int no_vnni = lv > (int)plugin_isa_best();
                        if (no_vnni)
                            setenv("RLX_QUANT_VNNI", "0", 1);
                        memcpy(y, ref, (size_t)(M * ldy) * sizeof(float));
                        for (int64_t m = 0; m < M; m++)
                            for (int64_t n = 0; n < N; n++)
                                y[m * ldy + n] = -0.0f;
                        const plugin_isa isa = no_vnni ? PLUGIN_ISA_AVX512 : (plugin_isa)lv;
                        repacked_matmul(isa, dt, wp, N, K, xq, stride, M, y, ldy);
                        if (memcmp(ref, y, (size_t)(M * ldy) * sizeof(float)))
                            fail_msg("dtype %d K %lld N %lld M %lld: level %s differs from the native kernels", dt,
                                     (long long)K, (long long)N, (long long)M, kern_qrpk_ops_at(isa, dt)->isa);
                        if (no_vnni)
                            unsetenv("RLX_QUANT_VNNI");
                    }
                }
                free(y);
                free(ref);
                free(wp);
                free(w);
            }
        free(xq);
    }
}

// ---------------------------------------------------------------------------------------------
// --bench: the repacked kernels against the native ones, on the plugins' futex pool

typedef struct bench_job {
    const kern_qsimd *q;
    const kern_qrp_ops *ops;
    int dt;
    const uint8_t *w;
    const char *xq;
    size_t stride, row;
    int64_t M, K, N;
    float *y;
} bench_job;

static void bench_native(void *ctx, int ith, int64_t n0, int64_t n1) {
    const bench_job *j = ctx;
    (void)ith;
    kern_qmatmul_part(j->q, j->dt, j->xq, j->stride, j->M, j->K, j->w + (size_t)n0 * j->row, n1 - n0, NULL, j->y + n0,
                      j->N);
}

static void bench_repacked(void *ctx, int ith, int64_t g0, int64_t g1) {
    const bench_job *j = ctx;
    (void)ith;
    j->ops->matmul(j->w, j->K, j->xq, j->stride, j->M, g0, g1, j->y, j->N);
}

/* With one thread the whole job runs on the caller: its CPU time leaves out the time other
 * processes of a shared machine take from it; with more, the wall clock. */
static double now(int n_threads) {
    struct timespec ts;
    clock_gettime(n_threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of fn over n units (the best of runs lasting about 0.5 s in all). */
static double bench_time(kern_par *par, int64_t n, int64_t align, kern_range_fn fn, bench_job *j) {
    double best = 1e30, spent = 0.0;
    for (int it = 0; it < 3 || spent < 0.5; it++) {
        const double t0 = now(par->n_threads);
        par->parallel_for(par->self, n, align, KERN_PAR_MIN, fn, j);
        const double dt = now(par->n_threads) - t0;
        spent += dt;
        best = dt < best ? dt : best;
    }
    return best;
}

static int bench(int n_threads) {
    quant_pool pool;
    if (quant_pool_start(&pool, n_threads) < 0)
        return 1;
    kern_par par = quant_pool_par(&pool);
    const int64_t K = 1024, N = 3072, Mb[] = {1, 128};
    const plugin_isa isa = plugin_isa_best();
    printf("K %lld N %lld, %d thread(s) (%s), level %s; GB/s of weight bytes, GMAC/s\n", (long long)K, (long long)N,
           n_threads, n_threads == 1 ? "CPU time" : "wall clock", plugin_isa_name(isa));
    for (int t = 0; t < N_KTYPES; t++) {
        const int dt = ktypes[t];
        const size_t row = rlx_iface_row_bytes((uint32_t)dt, K);
        uint8_t *w = make_weight(dt, N, K), *wp = malloc((size_t)N * row);
        double pack = 1e30;
        for (int it = 0; it < 5; it++) {
            const double t0 = now(1);
            kern_qrpk_pack(dt, w, K, 0, N / KERN_QRP_ROWS, wp);
            const double spent = now(1) - t0;
            pack = spent < pack ? spent : pack;
        }
        printf("  dtype %2d: packing %.1f GB/s\n", dt, (double)(N * row) * 1e-9 / pack);
        for (int mi = 0; mi < 2; mi++) {
            const int64_t M = Mb[mi];
            size_t stride;
            char *xq = make_xq(M, K, &stride);
            float *y = malloc((size_t)(M * N) * sizeof(float));
            bench_job j = {.q = kern_qsimd_at(isa),
                           .ops = kern_qrpk_ops_at(isa, dt),
                           .dt = dt,
                           .w = w,
                           .xq = xq,
                           .stride = stride,
                           .row = row,
                           .M = M,
                           .K = K,
                           .N = N,
                           .y = y};
            const double tn = bench_time(&par, N, KERN_ROW_ALIGN, bench_native, &j);
            j.w = wp;
            const double tr = bench_time(&par, N / KERN_QRP_ROWS, 1, bench_repacked, &j);
            const double gb = (double)(N * row) * 1e-9, gmac = (double)(M * N * K) * 1e-9;
            printf("  dtype %2d M %3lld: native %7.1f GB/s %6.1f GMAC/s   repacked %7.1f GB/s %6.1f GMAC/s   x%.2f\n",
                   dt, (long long)M, gb / tn, gmac / tn, gb / tr, gmac / tr, tn / tr);
            free(y);
            free(xq);
        }
        free(wp);
        free(w);
    }
    plugin_pool_destroy(pool.pool);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bench"))
        return bench(argc > 3 && !strcmp(argv[2], "--threads") ? atoi(argv[3]) : 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packing_in_pieces_is_packing_at_once),
        cmocka_unit_test(test_other_types_have_no_k_form),
        cmocka_unit_test(test_repacked_matmul_gives_the_native_bits),
    };
    printf("repacked K-type kernels at every level up to %s\n", plugin_isa_name(plugin_isa_best()));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
