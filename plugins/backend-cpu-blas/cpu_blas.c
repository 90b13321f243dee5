/* cpu-blas: the CPU backend plugin of rlx. Every op of graph.h runs here on a persistent
 * thread pool owned by the instance (plugins/common/pool.c; the calling thread works too), which
 * is also the parallel_for of the CPU kernel library (plugins/kernels/kern.h). Matmuls cut the
 * output features (rows of the [N, K] weight) into chunks that the pool's threads take in turn,
 * each calling single-threaded OpenBLAS or a kernel of the library on its rows:
 *   - F32 weights: cblas_sgemv for one token, the GEMV kernels up to 8 tokens, the library's
 *     GEMM up to gemv_m tokens (12), cblas_sgemm above;
 *   - BF16 weights (MATMUL and MOE experts), at the kernel levels avx512_bf16 and amx: on the
 *     CPU's BF16 dot products, activations rounded to BF16, from a copy made at prepare_weight
 *     in place of the mapped pages (kern_bf16.h);
 *   - BF16 weights below those levels, and F16 weights, are used as stored: the GEMV kernels
 *     widen them on the fly up to 8 tokens; above that a thread widens a tile of rows into its
 *     scratch (a chunk of up to 256 KiB of F32 for the library's GEMM up to gemv_m tokens;
 *     1.5 MiB for cblas_sgemm above), so no whole-model F32 copy ever exists;
 *   - block-quantized weights (GGUF Q4_0 ... Q6_K): the library quantizes the activations to
 *     int8 blocks as llama.cpp does and runs integer dot products (RLX_PRECISION_Q8_ACT), for
 *     MATMUL and MOE experts alike. A weight of a type with a repacked form (kern_qrp.h) is
 *     repacked once at prepare_weight into row-interleaved groups, in place of its mapped pages,
 *     and kern_qrp runs it for every token count, decode and prefill; run outside a plan it
 *     takes kern_qmatmul, the same bits. Types without one use kern_qmatmul up to gemv_m
 *     tokens, and above that tiles of rows dequantized and multiplied by cblas_sgemm as BF16
 *     tiles are.
 * Attention is the library's, batch-invariant (kern_att_run): a query's bits do not depend on
 * the rest of the batch or on the thread count. The library's kernels (AVX-512, AVX2+FMA+F16C
 * or portable C, chosen at open() from the CPU, option isa=...) do the rest: norms, RoPE,
 * SwiGLU, MoE routing, conversions. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kern.h"
#include "node_check.h"
#include "openblas.h"
#include "plugin_entry.h"
#include "pool.h"
#include "rlx/backend_iface.h"
#include "rlx/quant_iface.h"

/* F32 weight bytes per pool chunk that the GEMM kernel passes over once per panel of rows
 * (with the panel, L2-sized). */
#define CPU_BLAS_GEMM_CHUNK_BYTES (256 * 1024)

// ---------------------------------------------------------------------------------------------
// Instance

typedef struct cpu_blas {
    const rlx_host *host;
    kern_ctx kern;     /* the kernel library on this pool */
    plugin_pool *pool; /* plugins/common/pool.c */
    int64_t spin_ns;   /* the pool's, until open() starts it */
    int n_threads;
    int gemv_max_m; /* matmuls with at most this many rows of x use the GEMV kernels */
    /* batch_invariant=1: the library's GEMV and GEMM kernels for every M (a row's sum in one
     * order whatever its neighbours), so a row's result never depends on the batch */
    bool invariant;
    bool fuse;              /* plan spans of more than one node */
    size_t tile_bytes;      /* per-thread F32 tile of widened weight rows */
    kern_buf *tile;         /* [n_threads] */
    kern_buf span_x;        /* a span's normalised rows that nothing after it reads */
    kern_buf span_xq[2];    /* a span's rows quantized for 32-value and for 256-value weight blocks */
    kern_buf *span_scratch; /* [n_threads] a fused SWIGLU's gate and up rows of one chunk */
    char describe[768];     /* rlx_backend_iface.describe */
} cpu_blas;

/* OpenBLAS, loaded by the first open(); one library serves every instance of the process. */
static const cpu_blas_openblas *cpu_blas_ob;

/* Items per chunk when n items are cut into about four chunks per thread (so a slow thread
 * delays little), at least min_items and a multiple of align. */
static int64_t cpu_blas_chunk(const cpu_blas *s, int64_t n, int64_t align, int64_t min_items) {
    int64_t c = (n + 4 * s->n_threads - 1) / (4 * s->n_threads);
    c = c < min_items ? min_items : c;
    return (c + align - 1) / align * align;
}

/* The keys of opts->extra, "key=value" pairs separated by commas, besides kern_open's
 * isa=auto|amx|avx512_bf16|avx512|avx2|c (the kernels: default auto, the best the CPU has, at
 * most $RLX_ISA; amx and avx512_bf16 add BF16 matmuls on AMX tiles or AVX512-BF16 dot products,
 * activations rounded to BF16):
 *   tile_kb=N                per-thread F32 weight tile for BF16/F16 prefill (default 1536)
 *   spin_us=N                how long an idle pool thread spins before sleeping (default 200)
 *   gemv_m=N                 largest token count using the GEMV kernels (default 12)
 *   fuse=0|1                 fuse neighbouring nodes into spans (default 1; 0 runs every node
 *                            by itself, to measure what fusion buys)
 *   batch_invariant=0|1      F32/BF16/F16 matmuls of every M on the library's GEMV and GEMM
 *                            kernels (the same sum per row), so a row's bits
 *                            do not depend on the other rows, and GATED_DELTA row by row in every
 *                            form, so a sequence's do not depend on how it was split into calls
 *                            (default 0: sgemv for one row and sgemm past gemv_m, the chunked
 *                            delta rule over a prompt: faster prefill) */
static bool cpu_blas_option(void *self, const rlx_iface_option *o) {
    cpu_blas *s = self;
    long long v;
    if (rlx_iface_option_is(o, "tile_kb") && rlx_iface_option_int(o, 16, 65536, &v))
        s->tile_bytes = (size_t)v * 1024;
    else if (rlx_iface_option_is(o, "spin_us") && rlx_iface_option_int(o, 0, 1000000, &v))
        s->spin_ns = v * 1000;
    else if (rlx_iface_option_is(o, "gemv_m") && rlx_iface_option_int(o, 0, 4096, &v))
        s->gemv_max_m = (int)v;
    else if (rlx_iface_option_is(o, "fuse") && rlx_iface_option_int(o, 0, 1, &v))
        s->fuse = v != 0;
    else if (rlx_iface_option_is(o, "batch_invariant") && rlx_iface_option_int(o, 0, 1, &v))
        s->invariant = v != 0;
    else
        return false;
    return true;
}

// ---------------------------------------------------------------------------------------------
// The kernel library's parallel_for: the pool

/* A range job of the library, as pool chunks of `chunk` items. */
typedef struct cpu_blas_range {
    kern_range_fn fn;
    void *ctx;
    int64_t n, chunk;
} cpu_blas_range;

static void cpu_blas_range_task(void *arg, int ith, int64_t chunk) {
    const cpu_blas_range *r = arg;
    const int64_t i0 = chunk * r->chunk;
    r->fn(r->ctx, ith, i0, i0 + r->chunk < r->n ? i0 + r->chunk : r->n);
}

static void cpu_blas_parallel_for(void *self, int64_t n, int64_t align, int64_t work, kern_range_fn fn, void *ctx) {
    cpu_blas *s = self;
    cpu_blas_range r = {.fn = fn, .ctx = ctx, .n = n, .chunk = cpu_blas_chunk(s, n, align, 1)};
    plugin_pool_run(s->pool, cpu_blas_range_task, &r, (n + r.chunk - 1) / r.chunk, work >= KERN_PAR_MIN);
}

static void cpu_blas_parallel_tasks(void *self, int64_t n, int64_t work, kern_range_fn fn, void *ctx) {
    cpu_blas *s = self;
    cpu_blas_range r = {.fn = fn, .ctx = ctx, .n = n, .chunk = 1};
    plugin_pool_run(s->pool, cpu_blas_range_task, &r, n, work >= KERN_PAR_MIN);
}

// ---------------------------------------------------------------------------------------------
// Open and close

static void cpu_blas_close(void *self) {
    cpu_blas *s = self;
    if (!s)
        return;
    plugin_pool_destroy(s->pool);
    kern_bufs_destroy(&s->kern, s->tile);
    kern_bufs_destroy(&s->kern, s->span_scratch);
    s->host->free(s->span_x.p);
    s->host->free(s->span_xq[0].p);
    s->host->free(s->span_xq[1].p);
    kern_deinit(&s->kern);
    s->host->free(s);
}

static int cpu_blas_open(const rlx_host *host, const rlx_backend_options *opts, void **self) {
    *self = NULL;
    cpu_blas *s = kern_zalloc(host, "cpu-blas", sizeof *s);
    if (!s)
        return RLX_E_NOMEM;
    s->host = host;
    s->tile_bytes = 1536 * 1024;
    s->gemv_max_m = 12;
    s->spin_ns = 200 * 1000;
    s->fuse = true;
    /* the cores this process may run on, which a container or taskset can make fewer than online */
    cpu_set_t cpus;
    long n_cpu = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : sysconf(_SC_NPROCESSORS_ONLN);
    const kern_par par = {.self = s,
                          .n_threads = n_cpu > 0 ? (int)(n_cpu < 256 ? n_cpu : 256) : 1,
                          .parallel_for = cpu_blas_parallel_for,
                          .parallel_tasks = cpu_blas_parallel_tasks};
    int rc = kern_open(&s->kern, host, "cpu-blas", opts, 256, cpu_blas_option, par);
    if (rc < 0)
        goto fail;
    s->n_threads = s->kern.par.n_threads;
    s->kern.batch_invariant = s->invariant;
    if (!cpu_blas_ob && !(cpu_blas_ob = cpu_blas_openblas_load(host))) {
        rc = RLX_E_UNSUPPORTED;
        goto fail;
    }
    /* The pool parallelises every matmul itself; OpenBLAS threads would only compete with it. */
    cpu_blas_ob->set_num_threads(1);

    if (!(s->tile = kern_bufs_create(&s->kern))) {
        rc = host->error(RLX_E_NOMEM, "cpu-blas: out of memory");
        goto fail;
    }
    if ((rc = plugin_pool_create(s->n_threads, s->spin_ns, &s->pool)) < 0) {
        rc = host->error(rc, "cpu-blas: cannot start %d worker threads", s->n_threads - 1);
        goto fail;
    }
    snprintf(s->describe, sizeof s->describe,
             "%s kernels, %d thread%s%s, quantized matmuls on %s kernels, OpenBLAS core %s (%s), %s", s->kern.k->isa,
             s->n_threads, s->n_threads == 1 ? "" : "s",
             s->kern.isa == PLUGIN_ISA_AMX           ? ", BF16 matmuls on AMX tiles (BF16 activations)"
             : s->kern.isa == PLUGIN_ISA_AVX512_BF16 ? ", BF16 matmuls on AVX512-BF16 dot products (BF16 activations)"
                                                     : "",
             kern_qrp_ops_at(s->kern.isa, RLX_DTYPE_Q8_0)->isa, cpu_blas_ob->get_corename(), cpu_blas_ob->origin,
             cpu_blas_ob->get_config());
    host->log(RLX_LOG_DEBUG, "cpu-blas: %s, %zu KiB tiles", s->describe, s->tile_bytes / 1024);
    *self = s;
    return RLX_OK;
fail:
    cpu_blas_close(s);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Node validation: plugins/common/node_check.c

static int cpu_blas_supports(void *self, const rlx_node_view *node) {
    return node_check(((const cpu_blas *)self)->host, "cpu-blas", node, false) == RLX_OK;
}

static bool cpu_blas_mm_tiled(const cpu_blas *s, int64_t M, int wdt);

/* Whether a node multiplies on BF16 dot products (kern_bf16.h): a MATMUL of a weight the level
 * takes, or a MOE whose experts are such weights (the router stays exact). */
static bool cpu_blas_bf16(const cpu_blas *s, const rlx_node_view *n) {
    return (n->op == RLX_OP_MATMUL && kern_bf16_weight(&s->kern, &n->inputs[1])) ||
           (n->op == RLX_OP_MOE && n->n_inputs > 2 && kern_bf16_weight(&s->kern, &n->inputs[2]));
}

/* BF16 weights at the avx512_bf16 and amx levels round the activations to BF16 (cpu_blas_bf16).
 * Matmuls on block-quantized weights quantize their activations to int8 blocks (kern_quant.h):
 * for every M on a type with a repacked form, else up to gemv_m rows, longer ones multiplying
 * dequantized tiles in F32, as MOE experts may, whose rows per expert are known only at run
 * time, so a MOE declares the looser bound. Everything else is F32 arithmetic on exactly
 * widened weights. */
static uint32_t cpu_blas_precision(void *self, const rlx_node_view *node) {
    if (cpu_blas_bf16(self, node))
        return RLX_PRECISION_BF16_ACT;
    const int wdt = node_weight_dtype(node);
    if (wdt < 0 || !kern_quant_supported(wdt))
        return RLX_PRECISION_F32;
    return node->op == RLX_OP_MATMUL && cpu_blas_mm_tiled(self, rlx_iface_rows(&node->inputs[0]), wdt)
               ? RLX_PRECISION_F32
               : RLX_PRECISION_Q8_ACT;
}

// ---------------------------------------------------------------------------------------------
// MATMUL: y[M, N] = x[M, K] w[N, K]^T (+ bias), output features split across the pool

typedef struct cpu_blas_mm {
    const cpu_blas *s;
    const float *x;    /* [M, K] */
    const void *w;     /* [N, K] of dtype wdt */
    const float *bias; /* [N] or NULL */
    float *y;          /* [M, N] */
    int64_t M, K, N;
    int64_t chunk; /* output features per pool chunk; one weight tile on the tile path */
    int wdt;
} cpu_blas_mm;

/* Whether a matmul multiplies widened (or dequantized) tiles with sgemm: more than gemv_m rows on
 * BF16/F16 weights, or on quantized ones without a repacked form. */
static bool cpu_blas_mm_tiled(const cpu_blas *s, int64_t M, int wdt) {
    return M > s->gemv_max_m && !s->invariant && wdt != RLX_DTYPE_F32 && !kern_qrp_supported(wdt);
}

/* The repacked copy prepared for input k of n, or NULL. */
static const kern_qrp_weight *cpu_blas_qrp(const cpu_blas *s, const rlx_node_view *n, uint32_t k) {
    return kern_as_qrp(kern_prepared(&s->kern, n, k));
}

/* Output features [0, cnt) of y = x w^T + bias for a part of the weight: w is its first row,
 * bias its first value (or NULL), and y[m * ldy + r] receives row m's feature r. */
static void cpu_blas_mm_part(const cpu_blas *s, int ith, const float *x, int64_t M, int64_t K, const char *w, int wdt,
                             int64_t cnt, const float *bias, float *y, int64_t ldy) {
    if (wdt == RLX_DTYPE_F32 && M == 1 && !s->invariant) {
        /* OpenBLAS 0.3.21 does not route M = 1 sgemm to its much faster sgemv. */
        cpu_blas_ob->sgemv(CblasRowMajor, CblasNoTrans, (int)cnt, (int)K, 1.0f, (const float *)w, (int)K, x, 1, 0.0f, y,
                           1);
    } else if (M <= KERN_GEMV_MAX_M) {
        s->kern.k->gemv_block[wdt][M - 1](x, K, w, K, 0, cnt, y, ldy);
    } else if (M <= s->gemv_max_m || s->invariant) {
        /* gemv_block's bits at matrix speed, on the weights widened to a tile once for all M */
        const float *wf = (const float *)w;
        if (wdt != RLX_DTYPE_F32) {
            s->kern.k->widen(wdt, w, s->tile[ith].p, cnt * K);
            wf = s->tile[ith].p;
        }
        s->kern.k->gemm_f32(x, K, M, wf, K, 0, cnt, y, ldy);
    } else if (wdt == RLX_DTYPE_F32) {
        cpu_blas_ob->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)cnt, (int)K, 1.0f, x, (int)K,
                           (const float *)w, (int)K, 0.0f, y, (int)ldy);
    } else {
        /* Widen (or dequantize) one tile of weight rows and multiply it while it is in cache. */
        float *tile = s->tile[ith].p;
        if (rlx_iface_dtype_is_quantized((uint32_t)wdt))
            for (int64_t r = 0; r < cnt; r++)
                rlx_iface_dequant_row((uint32_t)wdt, w + (size_t)r * rlx_iface_row_bytes((uint32_t)wdt, K),
                                      tile + r * K, K);
        else
            s->kern.k->widen(wdt, w, tile, cnt * K);
        cpu_blas_ob->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)cnt, (int)K, 1.0f, x, (int)K, tile,
                           (int)K, 0.0f, y, (int)ldy);
    }
    if (bias)
        for (int64_t m = 0; m < M; m++)
            s->kern.k->add(y + m * ldy, bias, y + m * ldy, cnt);
}

static void cpu_blas_mm_task(void *arg, int ith, int64_t chunk) {
    const cpu_blas_mm *mm = arg;
    const int64_t n0 = chunk * mm->chunk, n1 = n0 + mm->chunk < mm->N ? n0 + mm->chunk : mm->N;
    const size_t row_bytes = rlx_iface_row_bytes((uint32_t)mm->wdt, mm->K);
    cpu_blas_mm_part(mm->s, ith, mm->x, mm->M, mm->K, (const char *)mm->w + (size_t)n0 * row_bytes, mm->wdt, n1 - n0,
                     mm->bias ? mm->bias + n0 : NULL, mm->y + n0, mm->N);
}

/* Output features per pool chunk of a matmul that is not tiled. */
static int64_t cpu_blas_mm_chunk(const cpu_blas *s, int64_t M, int64_t K, int64_t N) {
    int64_t chunk = cpu_blas_chunk(s, N, KERN_ROW_ALIGN, 64);
    if (M > KERN_GEMV_MAX_M && (M <= s->gemv_max_m || s->invariant)) {
        /* Later passes over a chunk should find it in L2. */
        int64_t cap = CPU_BLAS_GEMM_CHUNK_BYTES / (K * (int64_t)sizeof(float));
        cap = cap < KERN_ROW_ALIGN ? KERN_ROW_ALIGN : cap / KERN_ROW_ALIGN * KERN_ROW_ALIGN;
        chunk = chunk < cap ? chunk : cap;
    }
    return chunk;
}

/* Reserves each thread's tile for chunk widened weight rows where cpu_blas_mm_part multiplies
 * M rows with gemm_f32 on BF16/F16 weights. */
static int cpu_blas_mm_reserve(cpu_blas *s, int64_t M, int64_t K, int wdt, int64_t chunk) {
    if (M <= KERN_GEMV_MAX_M || (wdt != RLX_DTYPE_BF16 && wdt != RLX_DTYPE_F16) || cpu_blas_mm_tiled(s, M, wdt))
        return RLX_OK;
    const int rc = kern_reserve_each(&s->kern, s->tile, (size_t)(chunk * K) * sizeof(float));
    return rc < 0 ? rc : RLX_OK;
}

/* qrp: w's repacked copy, or NULL. */
static int cpu_blas_mm_run(cpu_blas *s, const float *x, int64_t M, int64_t K, const void *w, int wdt, int64_t N,
                           const kern_qrp_weight *qrp, const float *bias, float *y) {
    /* block-quantized: the library's integer kernels, on the repacked copy for every M; on
     * native weights for decode, where prefill's rows amortise the dequantized tiles OpenBLAS
     * multiplies for the types that have no repacked form */
    if (qrp)
        return kern_qrp_matmul(&s->kern, x, M, qrp, bias, y);
    if (kern_quant_supported(wdt) && !cpu_blas_mm_tiled(s, M, wdt))
        return kern_qmatmul(&s->kern, x, M, K, w, wdt, N, bias, y);
    if (kern_matmul_trivial(M, K, N, bias, y))
        return RLX_OK;
    cpu_blas_mm mm = {.s = s, .x = x, .w = w, .bias = bias, .y = y, .M = M, .K = K, .N = N, .wdt = wdt};
    if (cpu_blas_mm_tiled(s, M, wdt)) {
        /* Whole rounds of tiles for the pool, each as large as tile_bytes allows: large tiles
         * pay off although they spill from L2, as OpenBLAS packs x again for every tile. */
        const int64_t max_rows = kern_tile_rows(s->tile_bytes, K);
        int64_t n_tiles = (N + max_rows - 1) / max_rows;
        n_tiles = (n_tiles + s->n_threads - 1) / s->n_threads * s->n_threads;
        mm.chunk = ((N + n_tiles - 1) / n_tiles + KERN_ROW_ALIGN - 1) / KERN_ROW_ALIGN * KERN_ROW_ALIGN;
        const int rc = kern_reserve_each(&s->kern, s->tile, (size_t)(mm.chunk * K) * sizeof(float));
        if (rc < 0)
            return rc;
    } else {
        mm.chunk = cpu_blas_mm_chunk(s, M, K, N);
        const int rc = cpu_blas_mm_reserve(s, M, K, wdt, mm.chunk);
        if (rc < 0)
            return rc;
    }
    plugin_pool_run(s->pool, cpu_blas_mm_task, &mm, (N + mm.chunk - 1) / mm.chunk, M * N * K >= KERN_PAR_MIN);
    return RLX_OK;
}

static int cpu_blas_matmul(cpu_blas *s, const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0], *w = &n->inputs[1];
    const float *bias;
    const int rc = kern_op_bias(&s->kern, n, &bias);
    if (rc >= 0 && kern_bf16_weight(&s->kern, w))
        return kern_bf16_matmul(&s->kern, x->data, rlx_iface_rows(x), w, kern_as_bf16(kern_prepared(&s->kern, n, 1)),
                                bias, n->output->data);
    return rc < 0 ? rc
                  : cpu_blas_mm_run(s, x->data, rlx_iface_rows(x), rlx_iface_cols(x), w->data, (int)w->dtype,
                                    w->shape[0], cpu_blas_qrp(s, n, 1), bias, n->output->data);
}

// ---------------------------------------------------------------------------------------------
// MOE: the library's, on these matmuls

static int cpu_blas_moe_mm(void *self, const float *x, int64_t M, const rlx_tensor *w, const kern_weight *prepared,
                           float *y, bool exact) {
    cpu_blas *s = self;
    if (!exact && kern_bf16_weight(&s->kern, w))
        return kern_bf16_matmul(&s->kern, x, M, w, kern_as_bf16(prepared), NULL, y);
    return cpu_blas_mm_run(self, x, M, w->shape[1], w->data, (int)w->dtype, w->shape[0], kern_as_qrp(prepared), NULL,
                           y);
}

// ---------------------------------------------------------------------------------------------
// Entry

/* The setting is process-wide: if anything raised it since open(), every pool thread's
 * OpenBLAS call would start threads of its own. */
static void cpu_blas_single_threaded_blas(void) {
    if (cpu_blas_ob->get_num_threads() != 1)
        cpu_blas_ob->set_num_threads(1);
}

/* A node that passed node_check. */
static int cpu_blas_run(cpu_blas *s, const rlx_node_view *node) {
    switch (node->op) {
    case RLX_OP_MATMUL:
        return cpu_blas_matmul(s, node);
    case RLX_OP_ATTENTION: /* the library's, batch-invariant (not sgemm: its blocking depends on T) */
        return kern_op_attention(&s->kern, node);
    case RLX_OP_MOE:
        return kern_op_moe(&s->kern, node, &(kern_matmul){.run = cpu_blas_moe_mm, .self = s, .row_pad = 1});
    case RLX_OP_SIGMOID_MUL:
    case RLX_OP_SSM_CONV:
    case RLX_OP_GATED_DELTA:
        return kern_op_recurrent(&s->kern, node);
    default:
        return kern_op_rows(&s->kern, node);
    }
}

static int cpu_blas_compute(void *self, const rlx_node_view *node) {
    cpu_blas *s = self;
    const int rc = node_check(s->host, "cpu-blas", node, true);
    if (rc < 0)
        return rc;
    cpu_blas_single_threaded_blas();
    return cpu_blas_run(s, node);
}

// ---------------------------------------------------------------------------------------------
// Spans (ABI 1.2): neighbours fused into one pool job
//
// A decode step of a dense Qwen3 layer is 17 nodes; the matmuls among them are memory-bound
// passes over their weights, each one pool job with its own wake-up and its own tail (the
// threads that finished waiting for the last chunk). Spans merge them:
//   [RMS_NORM,] MATMUL x1..4 over one input   the q/k/v projections behind their norm: one job
//                                             over the chunks of every matmul, the normalised
//                                             row made once, in place of its own node;
//   [RMS_NORM,] MATMUL gate, MATMUL up, SWIGLU one job over chunks of features, each chunk's
//                                             gate and up rows combined while in cache;
//   MATMUL, ADD                               a projection and its residual, added per chunk.
// Only matmuls off the tiled path fuse (M <= gemv_m, F32 weights, or quantized ones with a
// repacked form): prefill's tiled BF16 matmuls are long jobs whose wake-ups cost nothing. Every
// chunk boundary, kernel and order of operations is the one compute() uses node by node, so a
// span gives the same bits. Matmuls on block-quantized weights fuse too: the span quantizes x
// once per block length (32 or 256) for all of them, and kern_qmatmul_part and kern_qrp_part
// (on the repacked copy, whose mapped pages a span must not fault back in) give kern_qmatmul's
// bits whatever the chunks.

#define CPU_BLAS_SPAN_MM 4

typedef struct cpu_blas_span {
    bool norm;          /* nodes[0] is the RMS_NORM whose output the matmuls read */
    uint32_t mm0, n_mm; /* the matmuls: nodes [mm0, mm0 + n_mm) */
    bool glu;           /* the two matmuls are gate and up, and nodes[mm0 + 2] their SWIGLU */
    bool resid;         /* nodes[mm0 + 1] adds the one matmul's output to a residual */
} cpu_blas_span;

/* Whether node i of nd reads the output of node j at input k. */
static bool cpu_blas_reads(const rlx_node_view *nd, uint32_t i, uint32_t k, uint32_t j) {
    return nd[i].input_ids && k < nd[i].n_inputs && nd[i].input_ids[k] == nd[j].output_id;
}

/* A MATMUL a span can take: off the tiled path (cpu_blas_mm_tiled) and off the BF16 levels' path,
 * its bias F32 or prepared (a span reads several vectors at once, and the library's conversion
 * buffer holds one). */
static bool cpu_blas_span_mm(const cpu_blas *s, const rlx_node_view *n) {
    return n->op == RLX_OP_MATMUL && !kern_bf16_weight(&s->kern, &n->inputs[1]) &&
           !cpu_blas_mm_tiled(s, rlx_iface_rows(&n->inputs[0]), (int)n->inputs[1].dtype) &&
           (n->n_inputs < 3 || !kern_vec_needs_copy(&s->kern, n, 2));
}

static int cpu_blas_plan_span(void *self, const rlx_span *run, uint32_t *n_taken, void **out) {
    cpu_blas *s = self;
    const rlx_node_view *nd = run->nodes;
    const uint32_t n = run->n_nodes;
    cpu_blas_span sp = {0};
    *n_taken = 1;
    *out = NULL;
    if (!s->fuse || !nd[0].input_ids)
        return RLX_OK;
    uint32_t i = 0;
    if (nd[0].op == RLX_OP_RMS_NORM && n > 1 && cpu_blas_reads(nd, 1, 0, 0) && cpu_blas_span_mm(s, &nd[1])) {
        sp.norm = true;
        i = 1;
    }
    const int32_t x = sp.norm ? nd[0].output_id : nd[0].input_ids[0];
    sp.mm0 = i;
    while (i < n && sp.n_mm < CPU_BLAS_SPAN_MM && cpu_blas_span_mm(s, &nd[i]) && nd[i].input_ids[0] == x) {
        i++;
        sp.n_mm++;
    }
    if (sp.n_mm == 2 && i < n && nd[i].op == RLX_OP_SWIGLU && cpu_blas_reads(nd, i, 0, i - 2) &&
        cpu_blas_reads(nd, i, 1, i - 1) && nd[i - 2].inputs[1].shape[0] == nd[i - 1].inputs[1].shape[0]) {
        sp.glu = true;
        i++;
    } else if (!sp.norm && sp.n_mm == 1 && i < n && nd[i].op == RLX_OP_ADD &&
               (cpu_blas_reads(nd, i, 0, i - 1) != cpu_blas_reads(nd, i, 1, i - 1))) {
        sp.resid = true;
        i++;
    }
    if (sp.n_mm == 0 || (sp.n_mm == 1 && !sp.norm && !sp.resid))
        return RLX_OK; /* nothing to fuse: the node runs by itself */
    cpu_blas_span *p = s->host->alloc(sizeof *p, KERN_ALIGN);
    if (!p)
        return s->host->error(RLX_E_NOMEM, "cpu-blas: out of memory");
    *p = sp;
    *n_taken = i;
    *out = p;
    return RLX_OK;
}

static void cpu_blas_release_span(void *self, void *span) { ((cpu_blas *)self)->host->free(span); }

/* One fused job: matmuls over x, chunk c of the job belonging to the matmul whose chunks start
 * at or before it. */
typedef struct cpu_blas_fused {
    const cpu_blas *s;
    const float *x; /* [M, K] */
    int64_t M, K;
    uint32_t n_mm; /* matmuls whose chunks the job runs (glu: 1, gate, with up alongside) */
    bool glu;
    struct {
        const char *w;
        int wdt;
        int64_t N, chunk, first; /* features, per chunk, and the job's first chunk of this matmul */
        const float *bias;
        float *y;       /* [M, N], NULL when nothing after the span reads it */
        const void *xq; /* block-quantized weights: x's rows quantized for them, xq_stride apart */
        size_t xq_stride;
        const kern_qrp_weight *qrp; /* the weight's repacked copy, or NULL */
    } mm[CPU_BLAS_SPAN_MM];
    float *out;         /* glu: the SWIGLU's [M, N]; resid: the ADD's */
    const float *resid; /* resid: the residual [M, N] */
    kern_buf *scratch;  /* glu: per thread, gate and up rows of a chunk kept off the arena */
} cpu_blas_fused;

/* Features [n0, n0 + cnt) of matmul j of a fused job into y[m * ldy + r]: the chunk node-by-node
 * execution computes alike (a quantized part gives kern_qmatmul's bits whatever the chunks). */
static void cpu_blas_fused_mm(const cpu_blas_fused *f, uint32_t j, int ith, int64_t n0, int64_t cnt, float *y,
                              int64_t ldy) {
    const int wdt = f->mm[j].wdt;
    const char *w = f->mm[j].w + (size_t)n0 * rlx_iface_row_bytes((uint32_t)wdt, f->K);
    const float *bias = f->mm[j].bias ? f->mm[j].bias + n0 : NULL;
    if (f->mm[j].qrp)
        kern_qrp_part(f->mm[j].qrp, f->mm[j].xq, f->mm[j].xq_stride, f->M, n0, cnt, bias, y, ldy);
    else if (f->mm[j].xq)
        kern_qmatmul_part(f->s->kern.q, wdt, f->mm[j].xq, f->mm[j].xq_stride, f->M, f->K, w, cnt, bias, y, ldy);
    else
        cpu_blas_mm_part(f->s, ith, f->x, f->M, f->K, w, wdt, cnt, bias, y, ldy);
}

static void cpu_blas_fused_task(void *arg, int ith, int64_t c) {
    const cpu_blas_fused *f = arg;
    const kern_simd *k = f->s->kern.k;
    uint32_t i = 0;
    while (i + 1 < f->n_mm && c >= f->mm[i + 1].first)
        i++;
    const int64_t N = f->mm[i].N, n0 = (c - f->mm[i].first) * f->mm[i].chunk;
    const int64_t cnt = n0 + f->mm[i].chunk < N ? f->mm[i].chunk : N - n0;
    if (f->glu) {
        float *g = f->mm[0].y ? f->mm[0].y + n0 : f->scratch[ith].p;
        float *u = f->mm[1].y ? f->mm[1].y + n0 : (float *)f->scratch[ith].p + f->M * cnt;
        const int64_t ldg = f->mm[0].y ? N : cnt, ldu = f->mm[1].y ? N : cnt;
        for (uint32_t j = 0; j < 2; j++)
            cpu_blas_fused_mm(f, j, ith, n0, cnt, j ? u : g, j ? ldu : ldg);
        for (int64_t m = 0; m < f->M; m++)
            k->swiglu(g + m * ldg, u + m * ldu, f->out + m * N + n0, cnt);
        return;
    }
    float *y = f->mm[i].y ? f->mm[i].y : f->out; /* resid with an unread projection: straight into the sum */
    cpu_blas_fused_mm(f, i, ith, n0, cnt, y + n0, N);
    if (f->resid)
        for (int64_t m = 0; m < f->M; m++)
            k->add(f->resid + m * N + n0, y + m * N + n0, f->out + m * N + n0, cnt);
}

static int cpu_blas_compute_span(void *self, void *span, const rlx_span *sp) {
    cpu_blas *s = self;
    const cpu_blas_span *p = span;
    cpu_blas_single_threaded_blas();
    if (!p) /* one node, checked when it was planned */
        return cpu_blas_run(s, &sp->nodes[0]);
    const rlx_node_view *nd = sp->nodes;
    const uint32_t end = p->mm0 + p->n_mm; /* the node after the matmuls */
    const float *x = nd[p->mm0].inputs[0].data;
    int rc;
    if (p->norm) {
        /* the normalised rows go to the arena only when something after the span reads them */
        float *h = nd[0].output->data;
        if (sp->last_use[0] < sp->n_nodes) {
            if ((rc = kern_reserve(&s->kern, &s->span_x, (size_t)rlx_iface_numel(nd[0].output) * sizeof(float))) < 0)
                return rc;
            h = s->span_x.p;
        }
        const float *w;
        if ((rc = kern_vec(&s->kern, &nd[0], 1, &w)) < 0)
            return rc;
        kern_rms_norm(&s->kern, nd[0].inputs[0].data, w, h, rlx_iface_rows(&nd[0].inputs[0]),
                      rlx_iface_cols(&nd[0].inputs[0]), rlx_iface_numel(&nd[0].inputs[1]), nd[0].params->eps);
        x = h;
    }
    cpu_blas_fused f = {.s = s,
                        .x = x,
                        .M = rlx_iface_rows(&nd[p->mm0].inputs[0]),
                        .K = rlx_iface_cols(&nd[p->mm0].inputs[0]),
                        .n_mm = p->glu ? 1 : p->n_mm,
                        .glu = p->glu};
    int64_t chunks = 0, work = 0;
    bool xq_done[2] = {false, false};
    for (uint32_t j = 0; j < p->n_mm; j++) {
        const rlx_node_view *m = &nd[p->mm0 + j];
        const int wdt = (int)m->inputs[1].dtype;
        const int64_t N = m->inputs[1].shape[0];
        if ((rc = kern_op_bias(&s->kern, m, &f.mm[j].bias)) < 0)
            return rc;
        f.mm[j].w = m->inputs[1].data;
        f.mm[j].qrp = cpu_blas_qrp(s, m, 1);
        f.mm[j].wdt = wdt;
        f.mm[j].N = N;
        f.mm[j].chunk = p->glu && j ? f.mm[0].chunk : cpu_blas_mm_chunk(s, f.M, f.K, N);
        if (!f.mm[j].qrp && !kern_quant_supported(wdt) &&
            (rc = cpu_blas_mm_reserve(s, f.M, f.K, wdt, f.mm[j].chunk)) < 0)
            return rc;
        f.mm[j].y = (p->glu || p->resid) && sp->last_use[p->mm0 + j] < sp->n_nodes ? NULL : m->output->data;
        f.mm[j].first = chunks;
        if (kern_quant_supported(wdt)) { /* x quantized once per block length for all of them */
            const int fam = rlx_iface_dtype_block((uint32_t)wdt) == RLX_QK_K;
            size_t stride = kern_q8_row_bytes(wdt, f.K);
            if (!xq_done[fam] && (rc = kern_q8_quantize(&s->kern, wdt, f.x, f.M, f.K, &s->span_xq[fam], &stride)) < 0)
                return rc;
            xq_done[fam] = true;
            f.mm[j].xq = s->span_xq[fam].p;
            f.mm[j].xq_stride = stride;
        }
        if (j < f.n_mm)
            chunks += (N + f.mm[j].chunk - 1) / f.mm[j].chunk;
        work += f.M * N * f.K;
    }
    if (p->glu) {
        f.out = nd[end].output->data;
        if (!f.mm[0].y || !f.mm[1].y) {
            if (!s->span_scratch && !(s->span_scratch = kern_bufs_create(&s->kern)))
                return s->host->error(RLX_E_NOMEM, "cpu-blas: out of memory");
            if ((rc = kern_reserve_each(&s->kern, s->span_scratch, (size_t)(2 * f.M * f.mm[0].chunk) * sizeof(float))) <
                0)
                return rc;
            f.scratch = s->span_scratch;
        }
    } else if (p->resid) {
        f.out = nd[end].output->data;
        f.resid = nd[end].inputs[cpu_blas_reads(nd, end, 0, end - 1) ? 1 : 0].data;
    }
    plugin_pool_run(s->pool, cpu_blas_fused_task, &f, chunks, work >= KERN_PAR_MIN);
    return RLX_OK;
}

static const char *cpu_blas_describe(void *self) { return ((const cpu_blas *)self)->describe; }

/* Prepared weights: repacked copies of quantized matmul and expert weights whose type has a
 * repacked form (their pages dropped piece by piece when they are a read-only mapping of the
 * model file), F32 copies of BF16/F16 norm weights and biases; other matmul weights are read as
 * stored. */
static int cpu_blas_prepare_weight(void *self, const rlx_weight_info *w, void **handle) {
    const cpu_blas *s = self;
    const uint32_t mapped = RLX_WEIGHT_FILE_BACKED | RLX_WEIGHT_READ_ONLY;
    if (kern_qrp_use(w))
        return kern_prepare_qrp(&s->kern, w, (w->flags & mapped) == mapped, handle);
    if (kern_bf16_use(&s->kern, w))
        return kern_prepare_bf16(&s->kern, w, (w->flags & mapped) == mapped, handle);
    return kern_prepare_vec(&s->kern, w, handle);
}

static void cpu_blas_release_weight(void *self, void *handle) {
    const cpu_blas *s = self;
    const uint32_t kind = ((const kern_weight *)handle)->kind;
    if (kind == KERN_WEIGHT_QRP || kind == KERN_WEIGHT_BF16)
        kern_release_qrp(&s->kern, handle);
    else
        kern_release_vec(&s->kern, handle);
}

static const rlx_backend_iface cpu_blas_iface = {
    .size = sizeof(rlx_backend_iface),
    .open = cpu_blas_open,
    .close = cpu_blas_close,
    .supports = cpu_blas_supports,
    .compute = cpu_blas_compute,
    .precision = cpu_blas_precision,
    .describe = cpu_blas_describe,
    .prepare_weight = cpu_blas_prepare_weight,
    .release_weight = cpu_blas_release_weight,
    .plan_span = cpu_blas_plan_span,
    .compute_span = cpu_blas_compute_span,
    .release_span = cpu_blas_release_span,
};

static const rlx_plugin cpu_blas_plugin = PLUGIN_BACKEND_DESC(
    "cpu-blas", "0.1.0",
    "CPU backend: OpenBLAS plus AVX-512/AVX2 kernels on its own thread pool; F32/BF16/F16 and GGUF-quantized weights",
    &cpu_blas_iface);

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    return plugin_entry(host, &cpu_blas_plugin);
}
