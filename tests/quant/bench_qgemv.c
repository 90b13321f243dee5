/* Benchmark (not a test): the decode GEMV y[1, N] = x[1, K] w[N, K]^T of the kernel library at
 * the best ISA level, for each quantized weight type through kern_qmatmul on the native layout
 * ("native"), through kern_qrp_matmul on the repacked one for every type kern_qrp_supported
 * ("repacked"), and with more rows than cpu-blas's gemv_m (12) as cpu-blas runs prefill on
 * native weights, dequantized tiles times OpenBLAS sgemm ("sgemm"); BF16 through the block GEMV
 * cpu-blas uses; all on the plugins' futex pool. Two figures per type and path, the median
 * of many calls: "hot", the same weights every call (they sit in the caches), and "cold",
 * cycling through enough copies that every call reads its weights from DRAM, which is what
 * decoding a model does. GB/s counts the weight bytes one call reads.
 *   bench_qgemv [--threads T] [--k K] [--n N] [--m M] [--reps R] [--type NAME] [--hot]
 * (--m: activation rows, for prefill; --type: that weight type alone; --hot: no cold runs). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kern.h"
#include "openblas.h"
#include "quant_host.h"
#include "rlx/quant_iface.h"

/* Bytes of weight copies the cold runs cycle through: well past any L3. */
#define BENCH_COLD_BYTES (256u << 20)

// The BF16 reference: the block GEMV over the pool, as cpu-blas runs matmuls of up to 8 rows.

typedef struct bench_bf16 {
    const kern_simd *k;
    const float *x;
    const void *w;
    float *y;
    int64_t M, K, N;
} bench_bf16;

static void bench_bf16_range(void *ctx, int ith, int64_t n0, int64_t n1) {
    const bench_bf16 *b = ctx;
    (void)ith;
    b->k->gemv_block[RLX_DTYPE_BF16][b->M - 1](b->x, b->K, b->w, b->K, n0, n1, b->y, b->N);
}

/* The sgemm path: tiles of rows dequantized into a thread's F32 tile (cpu-blas's 1.5 MiB) and
 * multiplied by single-threaded OpenBLAS while hot, whole rounds of tiles over the threads. */
#define BENCH_TILE_BYTES (1536 * 1024)

typedef struct bench_sgemm {
    const cpu_blas_openblas *ob;
    const float *x;
    const uint8_t *w;
    float *y;
    float **tile; /* [n_threads] */
    int64_t M, K, N, chunk;
    int dt;
} bench_sgemm;

static void bench_sgemm_task(void *ctx, int ith, int64_t c0, int64_t c1) {
    const bench_sgemm *b = ctx;
    (void)c1;
    const int64_t n0 = c0 * b->chunk, cnt = n0 + b->chunk < b->N ? b->chunk : b->N - n0;
    const size_t row = rlx_iface_row_bytes((uint32_t)b->dt, b->K);
    for (int64_t r = 0; r < cnt; r++)
        rlx_iface_dequant_row((uint32_t)b->dt, b->w + (size_t)(n0 + r) * row, b->tile[ith] + r * b->K, b->K);
    b->ob->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b->M, (int)cnt, (int)b->K, 1.0f, b->x, (int)b->K,
                 b->tile[ith], (int)b->K, 0.0f, b->y + n0, (int)b->N);
}

enum { PATH_NATIVE, PATH_REPACKED, PATH_SGEMM, PATH_COUNT };

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Median ns of reps calls cycling through n_copies weights of `bytes` each. */
static int64_t bench_time(kern_ctx *c, int path, bench_sgemm *sg, int dt, const uint8_t *w, size_t bytes, int n_copies,
                          const float *x, int64_t M, int64_t K, int64_t N, float *y, int reps) {
    /* the repacked copies, made once */
    void **packed = NULL;
    if (path == PATH_REPACKED) {
        packed = calloc((size_t)n_copies, sizeof *packed);
        for (int i = 0; i < n_copies; i++) {
            const rlx_tensor t = {
                .dtype = (uint32_t)dt, .n_dims = 2, .shape = {N, K, 1, 1}, .data = (void *)(w + (size_t)i * bytes)};
            const rlx_weight_info info = {
                .size = sizeof info, .tensor = &t, .name = "w", .op = RLX_OP_MATMUL, .input = 1};
            if (kern_prepare_qrp(c, &info, false, &packed[i]) < 0)
                exit(1);
        }
    }
    int64_t *t = malloc((size_t)reps * sizeof *t);
    for (int r = -3; r < reps; r++) {
        const uint8_t *wc = w + (size_t)((r + 3) % n_copies) * bytes;
        const int64_t t0 = plugin_now_ns();
        if (dt == RLX_DTYPE_BF16) {
            bench_bf16 b = {.k = c->k, .x = x, .w = wc, .y = y, .M = M, .K = K, .N = N};
            c->par.parallel_for(c->par.self, N, KERN_ROW_ALIGN, M * N * K, bench_bf16_range, &b);
        } else if (path == PATH_REPACKED) {
            if (kern_qrp_matmul(c, x, M, packed[(r + 3) % n_copies], NULL, y) < 0)
                exit(1);
        } else if (path == PATH_SGEMM) {
            sg->w = wc;
            c->par.parallel_tasks(c->par.self, (N + sg->chunk - 1) / sg->chunk, M * N * K, bench_sgemm_task, sg);
        } else if (kern_qmatmul(c, x, M, K, wc, dt, N, NULL, y) < 0) {
            exit(1);
        }
        if (r >= 0)
            t[r] = plugin_now_ns() - t0;
    }
    for (int i = 0; packed && i < n_copies; i++)
        kern_release_qrp(c, packed[i]);
    free(packed);
    qsort(t, (size_t)reps, sizeof *t, cmp_i64);
    const int64_t median = t[reps / 2];
    free(t);
    return median;
}

int main(int argc, char **argv) {
    int n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN), reps = 2001;
    int64_t K = 1024, N = 3072, M = 1;
    const char *only = NULL;
    bool hot_only = false;
    for (int i = 1; i < argc; i++)
        hot_only |= !strcmp(argv[i], "--hot");
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--hot"))
            i--;
        else if (!strcmp(argv[i], "--threads"))
            n_threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--k"))
            K = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--n"))
            N = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--m"))
            M = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--type"))
            only = argv[i + 1];
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    quant_pool qp;
    if (quant_pool_start(&qp, n_threads) < 0)
        return 1;
    const kern_par par = quant_pool_par(&qp);
    kern_ctx c;
    if (kern_init(&c, &quant_host, "bench", NULL, par) < 0)
        return 1;
    printf("M=%lld K=%lld N=%lld, %d thread%s, %s kernels (quantized: %s), median of %d calls\n", (long long)M,
           (long long)K, (long long)N, n_threads, n_threads == 1 ? "" : "s", c.k->isa, c.q->isa, reps);
    const cpu_blas_openblas *ob = cpu_blas_openblas_load(&quant_host);
    if (!ob)
        return 1;
    ob->set_num_threads(1);
    printf("%-6s %-9s %10s %12s %10s %12s %10s\n", "type", "path", "MiB", "hot ns", "hot GB/s", "cold ns", "cold GB/s");
    static const int types[] = {RLX_DTYPE_BF16, RLX_DTYPE_Q4_0, RLX_DTYPE_Q4_1, RLX_DTYPE_Q5_0, RLX_DTYPE_Q5_1,
                                RLX_DTYPE_Q8_0, RLX_DTYPE_Q4_K, RLX_DTYPE_Q5_K, RLX_DTYPE_Q6_K};
    static const char *const type_names[] = {"BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"};
    float *x = malloc((size_t)(M * K) * sizeof(float)), *y = malloc((size_t)(M * N) * sizeof(float));
    for (int64_t k = 0; k < M * K; k++)
        x[k] = (float)((k * 7919) % 201 - 100) / 100.0f;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const int dt = types[t];
        const size_t bytes = (size_t)N * rlx_iface_row_bytes((uint32_t)dt, K);
        if (bytes == 0 || (only && strcmp(only, type_names[t])) || (dt == RLX_DTYPE_BF16 && M > KERN_GEMV_MAX_M))
            continue;
        const int n_copies = hot_only ? 1 : (int)(BENCH_COLD_BYTES / bytes) + 1;
        uint8_t *w = malloc(bytes * (size_t)n_copies);
        /* random bytes are valid blocks; F16 scales kept small and finite */
        uint32_t s = 12345;
        for (size_t i = 0; i < bytes * (size_t)n_copies; i++) {
            s = s * 1664525u + 1013904223u;
            w[i] = (uint8_t)((s >> 24) & 0x3B);
        }
        /* the sgemm path's tiles: whole rounds of them over the threads, as cpu-blas cuts them */
        int64_t rows = BENCH_TILE_BYTES / (int64_t)sizeof(float) / K, n_tiles;
        rows = rows < KERN_ROW_ALIGN ? KERN_ROW_ALIGN : rows / KERN_ROW_ALIGN * KERN_ROW_ALIGN;
        n_tiles = ((N + rows - 1) / rows + n_threads - 1) / n_threads * n_threads;
        bench_sgemm sg = {.ob = ob, .x = x, .y = y, .M = M, .K = K, .N = N, .dt = dt};
        sg.chunk = ((N + n_tiles - 1) / n_tiles + KERN_ROW_ALIGN - 1) / KERN_ROW_ALIGN * KERN_ROW_ALIGN;
        float *tiles[256];
        for (int i = 0; i < n_threads; i++)
            tiles[i] = malloc((size_t)(sg.chunk * K) * sizeof(float));
        sg.tile = tiles;
        static const char *const path_names[PATH_COUNT] = {"native", "repacked", "sgemm"};
        for (int path = 0; path < PATH_COUNT; path++) {
            if ((dt == RLX_DTYPE_BF16 && path != PATH_NATIVE) || (path == PATH_REPACKED && !kern_qrp_supported(dt)) ||
                (path == PATH_SGEMM && M <= 12))
                continue;
            const int64_t hot = bench_time(&c, path, &sg, dt, w, bytes, 1, x, M, K, N, y, reps);
            const int64_t cold =
                hot_only ? hot : bench_time(&c, path, &sg, dt, w, bytes, n_copies, x, M, K, N, y, reps);
            printf("%-6s %-9s %10.2f %12lld %10.2f %12lld %10.2f\n", type_names[t], path_names[path],
                   (double)bytes / (1 << 20), (long long)hot, (double)bytes / (double)hot, (long long)cold,
                   (double)bytes / (double)cold);
        }
        for (int i = 0; i < n_threads; i++)
            free(tiles[i]);
        free(w);
    }
    free(x);
    free(y);
    kern_deinit(&c);
    plugin_pool_destroy(qp.pool);
    return 0;
}
