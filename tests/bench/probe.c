/* rlx_probe: the two hardware ceilings the rlx benchmark is judged against, measured on this
 * machine right now.
 *
 *   read_gbps     streaming read bandwidth of N threads, each summing its own part of a buffer
 *                 far larger than L3 (the buffer is touched first so no page faults are timed);
 *                 median over passes, 1 GB/s = 1e9 bytes/s.
 *   sgemm_gflops  OpenBLAS sgemm on N threads over the matmuls of one Qwen3-0.6B layer for a
 *                 128-token prompt (C[M,N] = A[M,K] * W[N,K]^T, i.e. RowMajor, NoTrans, Trans:
 *                 how Linear weights are stored); total FLOPs over total time of one sweep,
 *                 median over repetitions.
 *   sgemm_1024_gflops  the same for a plain square 1024^3 sgemm, for reference.
 *
 * usage: rlx_probe [--threads N] [--json] [--mib MIB] [--passes P] [--reps R] [--thp]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <cblas.h>
#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MAX_THREADS 256
#define MAX_REPS 1000

/* ---------------------------------------------------------------- helpers */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v). */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "rlx_probe: %s needs an integer in [%ld, %ld]\n", opt, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---------------------------------------------------------------- read bandwidth */

/* Sum of 64-bit words: integer adds have a 1-cycle latency, so the loop is bound by the
 * loads, never by the add chain. n_words is a multiple of 64 (the part sizes are). */
__attribute__((target("avx512f"))) static uint64_t sum_avx512(const uint64_t *p, size_t n_words) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n_words; i += 32) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512((const void *)(p + i)));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512((const void *)(p + i + 8)));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512((const void *)(p + i + 16)));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512((const void *)(p + i + 24)));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, size_t n_words) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n_words; i += 16) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(p + i + 4)));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(p + i + 8)));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

static uint64_t sum_portable(const uint64_t *p, size_t n_words) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n_words; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    return s0 + s1 + s2 + s3;
}

enum { KERNEL_PORTABLE, KERNEL_AVX2, KERNEL_AVX512 };
static const char *const kernel_names[] = {"portable", "avx2", "avx512"};

typedef struct {
    int id, passes;
    int kernel;     /* KERNEL_* */
    uint64_t *part; /* this thread's slice */
    size_t part_words;
    pthread_barrier_t *start, *stop;
    double *pass_seconds; /* written by thread 0 only */
    uint64_t sum;         /* keeps the reads alive */
} bw_worker;

static void *bw_run(void *arg) {
    bw_worker *w = arg;
    /* First touch: each thread writes its own part (page faults happen here, untimed). */
    for (size_t i = 0; i < w->part_words; i++)
        w->part[i] = (uint64_t)i;
    uint64_t sum = 0;
    /* passes + 1: the first read pass is a warm-up and not recorded. */
    for (int pass = 0; pass <= w->passes; pass++) {
        pthread_barrier_wait(w->start);
        double t0 = now_seconds();
        sum += w->kernel == KERNEL_AVX512 ? sum_avx512(w->part, w->part_words)
               : w->kernel == KERNEL_AVX2 ? sum_avx2(w->part, w->part_words)
                                          : sum_portable(w->part, w->part_words);
        pthread_barrier_wait(w->stop); /* the pass ends when the slowest thread is done */
        if (w->id == 0 && pass > 0)
            w->pass_seconds[pass - 1] = now_seconds() - t0;
    }
    w->sum = sum;
    return NULL;
}

/* Median GB/s over `passes`, or a negative value on error. */
static double measure_read_bw(int n_threads, size_t total_bytes, int passes, int thp, int *kernel_used,
                              double *best_gbps) {
    size_t part_words = total_bytes / (size_t)n_threads / sizeof(uint64_t) / 64 * 64;
    size_t bytes = part_words * sizeof(uint64_t) * (size_t)n_threads;
    uint64_t *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        fprintf(stderr, "rlx_probe: cannot map %zu bytes: %s\n", bytes, strerror(errno));
        return -1;
    }
    if (thp)
        madvise(buf, bytes, MADV_HUGEPAGE);
    __builtin_cpu_init();
    /* Widest vector loads the CPU has; the kernel only changes how few instructions the core
     * needs per cache line, the bandwidth is the memory system's. */
    int kernel = __builtin_cpu_supports("avx512f") ? KERNEL_AVX512
                 : __builtin_cpu_supports("avx2")  ? KERNEL_AVX2
                                                   : KERNEL_PORTABLE;
    *kernel_used = kernel;

    pthread_barrier_t start, stop;
    pthread_barrier_init(&start, NULL, (unsigned)n_threads);
    pthread_barrier_init(&stop, NULL, (unsigned)n_threads);
    double seconds[MAX_REPS];
    bw_worker w[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < n_threads; t++)
        w[t] = (bw_worker){.id = t,
                           .passes = passes,
                           .kernel = kernel,
                           .part = buf + (size_t)t * part_words,
                           .part_words = part_words,
                           .start = &start,
                           .stop = &stop,
                           .pass_seconds = seconds};
    for (int t = 1; t < n_threads; t++) {
        int rc = pthread_create(&tid[t], NULL, bw_run, &w[t]);
        if (rc) { /* the started threads would wait at the barrier forever: end the process */
            fprintf(stderr, "rlx_probe: pthread_create: %s\n", strerror(rc));
            exit(1);
        }
    }
    bw_run(&w[0]);
    for (int t = 1; t < n_threads; t++)
        pthread_join(tid[t], NULL);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&stop);

    /* Each word i of a part holds i, so every part sums to the same known value per pass. */
    uint64_t expect = (uint64_t)part_words * (part_words - 1) / 2 * (uint64_t)(passes + 1);
    for (int t = 0; t < n_threads; t++)
        if (w[t].sum != expect) {
            fprintf(stderr, "rlx_probe: read-bandwidth checksum mismatch in thread %d\n", t);
            munmap(buf, bytes);
            return -1;
        }
    munmap(buf, bytes);
    double gbps[MAX_REPS];
    *best_gbps = 0;
    for (int i = 0; i < passes; i++) {
        gbps[i] = (double)bytes / seconds[i] / 1e9;
        if (gbps[i] > *best_gbps)
            *best_gbps = gbps[i];
    }
    return median(gbps, passes);
}

/* ---------------------------------------------------------------- sgemm */

/* The matmuls of one Qwen3-0.6B decoder layer (hidden 1024, 16 q heads and 8 kv heads of
 * 128, MLP 3072): weight [n, k], activations [M, k]. */
typedef struct {
    const char *name;
    int n, k;
} gemm_shape;

static const gemm_shape layer_shapes[] = {
    {"q_proj", 2048, 1024},  {"k_proj", 1024, 1024},    {"v_proj", 1024, 1024}, {"gate_proj", 3072, 1024},
    {"up_proj", 3072, 1024}, {"down_proj", 1024, 3072}, {"o_proj", 1024, 2048},
};
#define N_SHAPES ((int)(sizeof layer_shapes / sizeof layer_shapes[0]))
#define PREFILL_M 128

static float *random_floats(size_t n, uint32_t seed) {
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p)
        return NULL;
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (float)((int32_t)(x >> 8) - (1 << 23)) / (float)(1 << 23); /* uniform in [-1, 1) */
    }
    return p;
}

typedef struct {
    double sweep_gflops;           /* median over repetitions of one layer sweep */
    double shape_gflops[N_SHAPES]; /* median per shape */
    double square_gflops;          /* 1024^3, NoTrans NoTrans */
} gemm_result;

static int measure_sgemm(int reps, gemm_result *r) {
    const int M = PREFILL_M;
    int max_k = 0, max_n = 0;
    float *w[N_SHAPES] = {0};
    int status = -1;
    for (int s = 0; s < N_SHAPES; s++) {
        max_k = layer_shapes[s].k > max_k ? layer_shapes[s].k : max_k;
        max_n = layer_shapes[s].n > max_n ? layer_shapes[s].n : max_n;
    }
    float *a = random_floats((size_t)M * max_k, 1), *c = random_floats((size_t)M * max_n, 2);
    float *sq_a = random_floats(1024 * 1024, 3), *sq_b = random_floats(1024 * 1024, 4),
          *sq_c = random_floats(1024 * 1024, 5);
    int ok = a && c && sq_a && sq_b && sq_c;
    for (int s = 0; s < N_SHAPES && ok; s++) /* separate weights: one layer is ~63 MB of f32, > L3 */
        ok = (w[s] = random_floats((size_t)layer_shapes[s].n * layer_shapes[s].k, 10 + (uint32_t)s)) != NULL;
    if (!ok) {
        fprintf(stderr, "rlx_probe: out of memory for the sgemm buffers\n");
        goto done;
    }

    double sweep_flops = 0;
    for (int s = 0; s < N_SHAPES; s++)
        sweep_flops += 2.0 * M * layer_shapes[s].n * layer_shapes[s].k;
    double sweep[MAX_REPS], shape[N_SHAPES][MAX_REPS];
    for (int rep = -2; rep < reps; rep++) { /* two warm-up sweeps */
        double total = 0;
        for (int s = 0; s < N_SHAPES; s++) {
            const gemm_shape *g = &layer_shapes[s];
            double t0 = now_seconds();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, g->n, g->k, 1.0f, a, g->k, w[s], g->k, 0.0f, c,
                        g->n);
            double dt = now_seconds() - t0;
            total += dt;
            if (rep >= 0)
                shape[s][rep] = 2.0 * M * g->n * g->k / dt / 1e9;
        }
        if (rep >= 0)
            sweep[rep] = sweep_flops / total / 1e9;
    }
    r->sweep_gflops = median(sweep, reps);
    for (int s = 0; s < N_SHAPES; s++)
        r->shape_gflops[s] = median(shape[s], reps);

    double square[MAX_REPS];
    for (int rep = -1; rep < reps; rep++) {
        double t0 = now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1024, 1024, 1024, 1.0f, sq_a, 1024, sq_b, 1024, 0.0f,
                    sq_c, 1024);
        double dt = now_seconds() - t0;
        if (rep >= 0)
            square[rep] = 2.0 * 1024 * 1024 * 1024 / dt / 1e9;
    }
    r->square_gflops = median(square, reps);
    status = 0;
done:
    for (int s = 0; s < N_SHAPES; s++)
        free(w[s]);
    free(a);
    free(c);
    free(sq_a);
    free(sq_b);
    free(sq_c);
    return status;
}

/* ---------------------------------------------------------------- main */

static const char usage[] = "usage: rlx_probe [--threads N] [--json] [--mib MIB] [--passes P] [--reps R] [--thp]\n\n"
                            "Measures the streaming read bandwidth and the OpenBLAS sgemm rate of this machine.\n\n"
                            "  --threads N  threads for both measurements (default 2)\n"
                            "  --json       print one JSON object instead of text\n"
                            "  --mib MIB    read-bandwidth buffer size in MiB, must be far above L3 (default 1024)\n"
                            "  --passes P   timed read passes, median reported (default 9)\n"
                            "  --reps R     timed sgemm repetitions, median reported (default 9)\n"
                            "  --thp        ask for transparent huge pages on the read buffer (default: plain 4 KiB\n"
                            "               pages, like the page-cache mapping of the model file)\n";

int main(int argc, char **argv) {
    long threads = 2, mib = 1024, passes = 9, reps = 9;
    int json = 0, thp = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--thp") == 0) {
            thp = 1;
        } else if (strcmp(a, "--threads") == 0) {
            if (parse_int(a, v, 1, MAX_THREADS, &threads) < 0)
                return 2;
            i++;
        } else if (strcmp(a, "--mib") == 0) {
            if (parse_int(a, v, 1, 1 << 20, &mib) < 0)
                return 2;
            i++;
        } else if (strcmp(a, "--passes") == 0) {
            if (parse_int(a, v, 1, MAX_REPS, &passes) < 0)
                return 2;
            i++;
        } else if (strcmp(a, "--reps") == 0) {
            if (parse_int(a, v, 1, MAX_REPS, &reps) < 0)
                return 2;
            i++;
        } else {
            fprintf(stderr, "rlx_probe: unknown option '%s'\n%s", a, usage);
            return 2;
        }
    }

    int kernel = KERNEL_PORTABLE;
    double best_gbps = 0;
    double read_gbps = measure_read_bw((int)threads, (size_t)mib << 20, (int)passes, thp, &kernel, &best_gbps);
    if (read_gbps < 0)
        return 1;
    openblas_set_num_threads((int)threads);
    gemm_result g;
    if (measure_sgemm((int)reps, &g) < 0)
        return 1;

    const char *corename = openblas_get_corename();
    if (json) {
        printf("{\"threads\": %ld, \"read_gbps\": %.3f, \"read_best_gbps\": %.3f, \"read_mib\": %ld, "
               "\"read_passes\": %ld, \"read_kernel\": \"%s\", \"thp\": %s, \"sgemm_gflops\": %.3f, "
               "\"sgemm_1024_gflops\": %.3f, \"sgemm_reps\": %ld, \"sgemm_m\": %d, \"sgemm_shapes\": {",
               threads, read_gbps, best_gbps, mib, passes, kernel_names[kernel], thp ? "true" : "false", g.sweep_gflops,
               g.square_gflops, reps, PREFILL_M);
        for (int s = 0; s < N_SHAPES; s++)
            printf("%s\"%s %dx%d\": %.3f", s ? ", " : "", layer_shapes[s].name, layer_shapes[s].n, layer_shapes[s].k,
                   g.shape_gflops[s]);
        printf("}, \"openblas_core\": \"%s\"}\n", corename ? corename : "unknown");
    } else {
        printf("threads %ld, OpenBLAS core %s\n", threads, corename ? corename : "unknown");
        printf("read bandwidth: %.2f GB/s median of %ld passes over %ld MiB (best %.2f, %s kernel%s)\n", read_gbps,
               passes, mib, best_gbps, kernel_names[kernel], thp ? ", THP" : "");
        printf("sgemm M=%d layer sweep (RowMajor NoTrans x Trans): %.2f GFLOP/s median of %ld\n", PREFILL_M,
               g.sweep_gflops, reps);
        for (int s = 0; s < N_SHAPES; s++)
            printf("  %-9s N=%-4d K=%-4d %8.2f GFLOP/s\n", layer_shapes[s].name, layer_shapes[s].n, layer_shapes[s].k,
                   g.shape_gflops[s]);
        printf("sgemm 1024^3: %.2f GFLOP/s median of %ld\n", g.square_gflops, reps);
    }
    return fflush(stdout) == 0 ? 0 : 1;
}
