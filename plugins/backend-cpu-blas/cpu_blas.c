/* cpu-blas: the CPU backend plugin of rlx. Every op of graph.h runs here on a persistent
 * thread pool owned by the instance (plugins/common/pool.c; the calling thread works too). Matmuls cut the output
 * features (rows of the [N, K] weight) into chunks that the pool's threads take in turn, each
 * calling single-threaded OpenBLAS or a SIMD kernel on its rows:
 *   - F32 weights: cblas_sgemv for one token, the GEMV kernels up to gemv_m tokens (12),
 *     cblas_sgemm above;
 *   - BF16/F16 weights are used as stored: the GEMV kernels widen them on the fly up to
 *     gemv_m tokens, and above that a thread widens a tile of rows (1.5 MiB of F32) into its
 *     scratch and runs cblas_sgemm on it, so no whole-model F32 copy ever exists.
 * Decode attention splits the cache rows across threads (flash-decoding), prefill attention
 * runs sgemm per (KV head, block of queries). Attention, norms, RoPE, SwiGLU and MoE are
 * vectorised with AVX-512, AVX2+FMA+F16C or portable C, chosen at open() from the CPU (option
 * isa=...); cpu_blas_simd.inc holds those kernels once, over a small vector macro layer. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "isa.h"
#include "node_check.h"
#include "openblas.h"
#include "pool.h"
#include "rlx/backend_iface.h"

/* Activation rows one GEMV kernel call handles; more rows are done in blocks of this many. */
#define CPU_BLAS_GEMV_MAX_M 8
/* Weight bytes per pool chunk when the GEMV kernels make several passes over it (L2-sized). */
#define CPU_BLAS_GEMV_CHUNK_BYTES (256 * 1024)
/* Output features of a matmul chunk come in multiples of this (whole cache lines of y). */
#define CPU_BLAS_ROW_ALIGN 16
/* Queries per prefill attention chunk; a chunk covers one KV head and all its query heads. */
#define CPU_BLAS_ATT_TQ 32
/* Below this many multiply-adds (or elements) a job runs on the calling thread alone. */
#define CPU_BLAS_PAR_MIN 32768
#define CPU_BLAS_ALIGN 64

// ---------------------------------------------------------------------------------------------
// Kernel tables, one per instruction set

/* y[m * ldy + n] = x[m * ldx] . w[n] (K values each) for the M rows of x and n in [n0, n1). */
typedef void (*cpu_blas_gemv_fn)(const float *x, int64_t ldx, const void *w, int64_t k, int64_t n0, int64_t n1,
                                 float *y, int64_t ldy);

typedef struct cpu_blas_kernels {
    const char *isa;
    void (*cvt)(int dt, const void *src, float *dst, int64_t n);
    cpu_blas_gemv_fn gemv[3][CPU_BLAS_GEMV_MAX_M]; /* [weight dtype][M - 1] */
    void (*rms_norm)(const float *x, const float *w, float *y, int64_t n, int64_t g, float eps);
    void (*rope)(const float *x, const float *cs, float *y, int64_t n_heads, int64_t half);
    void (*swiglu)(const float *g, const float *u, float *y, int64_t n);
    void (*add)(const float *a, const float *b, float *y, int64_t n);
    void (*axpy)(float a, const float *x, float *y, int64_t n);
    void (*scal)(float a, float *y, int64_t n);
    float (*softmax)(float *s, int64_t n, int64_t lo, int64_t hi, float *max_out);
    float (*dot)(const float *a, const float *b, int64_t n);
} cpu_blas_kernels;

/* Portable C: VW = 1 and plain float arithmetic. */
static inline float cpu_blas_pow2i(int n)
{
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define SFX(name) cpu_blas_##name##_c
#define CB_TARGET
#define CB_ISA_NAME "c"
#define CB_GEMV_R(m) ((m) == 1 ? 4 : (m) == 2 ? 2 : 1)
#define CB_NREGS 16
#define VW 1
#define VF float
#define VZERO() 0.0f
#define VSET1(s) (s)
#define VLD(p) (*(p))
#define VST(p, v) (*(p) = (v))
#define VADD(a, b) ((a) + (b))
#define VSUB(a, b) ((a) - (b))
#define VMUL(a, b) ((a) * (b))
#define VDIV(a, b) ((a) / (b))
#define VMAX(a, b) fmaxf(a, b)
#define VMIN(a, b) fminf(a, b)
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VHSUM(v) (v)
#define VHMAX(v) (v)
#define VLD_BF16(p) rlx_iface_bf16_to_f32(*(p))
#define VLD_F16(p) rlx_iface_f16_to_f32(*(p))
#define VROUND(v) rintf(v)
#define VPOW2I(n) cpu_blas_pow2i((int)(n))
#include "cpu_blas_simd.inc"

/* AVX2 + FMA + F16C: 8 floats per vector, 16 registers. */
#define CB_TARGET __attribute__((target("avx2,fma,f16c")))

static inline __attribute__((always_inline)) CB_TARGET float cpu_blas_hsum_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) CB_TARGET float cpu_blas_hmax_avx2(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define SFX(name) cpu_blas_##name##_avx2
#define CB_ISA_NAME "avx2"
#define CB_GEMV_R(m) ((m) == 1 ? 8 : (m) == 2 ? 4 : (m) <= 4 ? 2 : 1)
#define CB_NREGS 16
#define VW 8
#define VF __m256
#define VZERO() _mm256_setzero_ps()
#define VSET1(s) _mm256_set1_ps(s)
#define VLD(p) _mm256_loadu_ps(p)
#define VST(p, v) _mm256_storeu_ps(p, v)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VMIN(a, b) _mm256_min_ps(a, b)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VHSUM(v) cpu_blas_hsum_avx2(v)
#define VHMAX(v) cpu_blas_hmax_avx2(v)
#define VLD_BF16(p)                                                                                         \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define VLD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VROUND(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n)                                                                                           \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#include "cpu_blas_simd.inc"

/* AVX-512 (F, BW, VL): 16 floats per vector, 32 registers. */
#define SFX(name) cpu_blas_##name##_avx512
#define CB_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define CB_ISA_NAME "avx512"
#define CB_GEMV_R(m) ((m) == 1 ? 8 : (m) <= 4 ? 4 : 2)
#define CB_NREGS 32
#define VW 16
#define VF __m512
#define VZERO() _mm512_setzero_ps()
#define VSET1(s) _mm512_set1_ps(s)
#define VLD(p) _mm512_loadu_ps(p)
#define VST(p, v) _mm512_storeu_ps(p, v)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VMIN(a, b) _mm512_min_ps(a, b)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VHSUM(v) _mm512_reduce_add_ps(v)
#define VHMAX(v) _mm512_reduce_max_ps(v)
#define VLD_BF16(p)                                                                                         \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define VLD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VROUND(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VPOW2I(n)                                                                                           \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#include "cpu_blas_simd.inc"

// ---------------------------------------------------------------------------------------------
// Instance

typedef struct cpu_blas_buf {
    void *p;
    size_t cap; /* bytes */
} cpu_blas_buf;

typedef struct cpu_blas {
    const rlx_host *host;
    const cpu_blas_kernels *k;
    plugin_pool *pool;  /* plugins/common/pool.c */
    int64_t spin_ns;    /* the pool's, until open() starts it */
    int n_threads;
    int gemv_max_m;     /* matmuls with at most this many rows of x use the GEMV kernels */
    size_t tile_bytes;  /* per-thread F32 tile of widened weight rows */
    cpu_blas_buf *tile; /* [n_threads] */
    cpu_blas_buf *att;  /* [n_threads] attention scores */
    cpu_blas_buf main;  /* calling thread: converted small weights, MoE buffers */
    /* ROPE cos/sin rows cached for the latest (theta, head_dim, positions): every layer's q
     * and k rotations of one run share them. */
    cpu_blas_buf rope_cs;  /* [T, head_dim] F32: cos of head_dim/2 angles, then their sin; F64 inv_freq */
    cpu_blas_buf rope_pos; /* [T] int32 */
    int64_t rope_t;
    uint32_t rope_d;
    float rope_theta;
    char describe[768]; /* rlx_backend_iface.describe */
} cpu_blas;

/* OpenBLAS, loaded by the first open(); one library serves every instance of the process. */
static const cpu_blas_openblas *cpu_blas_ob;

/* Makes b hold at least `bytes`; the old contents are not kept. */
static int cpu_blas_reserve(const cpu_blas *s, cpu_blas_buf *b, size_t bytes)
{
    if (b->cap >= bytes)
        return RLX_OK;
    s->host->free(b->p);
    b->cap = 0;
    const size_t cap = bytes + bytes / 2;
    b->p = s->host->alloc(cap, CPU_BLAS_ALIGN);
    if (!b->p)
        return s->host->error(RLX_E_NOMEM, "cpu-blas: cannot allocate %zu bytes of scratch", cap);
    b->cap = cap;
    return RLX_OK;
}

/* Items per chunk when n items are cut into about four chunks per thread (so a slow thread
 * delays little), at least min_items and a multiple of align. */
static int64_t cpu_blas_chunk(const cpu_blas *s, int64_t n, int64_t align, int64_t min_items)
{
    int64_t c = (n + 4 * s->n_threads - 1) / (4 * s->n_threads);
    c = c < min_items ? min_items : c;
    return (c + align - 1) / align * align;
}

/* Parses opts->extra, "key=value" pairs separated by commas:
 *   isa=auto|avx512|avx2|c   kernels to use (default auto: the best the CPU has, at most $RLX_ISA)
 *   tile_kb=N                per-thread F32 weight tile for BF16/F16 prefill (default 1536)
 *   spin_us=N                how long an idle pool thread spins before sleeping (default 200)
 *   gemv_m=N                 largest token count using the GEMV kernels (default 12) */
static int cpu_blas_parse_extra(cpu_blas *s, const char *extra, char *isa, size_t isa_len)
{
    const rlx_host *h = s->host;
    const char *cursor = extra;
    rlx_iface_option o;
    char err[256];
    long long v;
    int rc;
    while ((rc = rlx_iface_option_next(&cursor, &o, err, sizeof err)) > 0) {
        if (rlx_iface_option_is(&o, "isa") && o.value_len < isa_len) {
            memcpy(isa, o.value, o.value_len + 1);
        } else if (rlx_iface_option_is(&o, "tile_kb") && rlx_iface_option_int(&o, 16, 65536, &v)) {
            s->tile_bytes = (size_t)v * 1024;
        } else if (rlx_iface_option_is(&o, "spin_us") && rlx_iface_option_int(&o, 0, 1000000, &v)) {
            s->spin_ns = v * 1000;
        } else if (rlx_iface_option_is(&o, "gemv_m") && rlx_iface_option_int(&o, 0, 4096, &v)) {
            s->gemv_max_m = (int)v;
        } else {
            return h->error(RLX_E_INVALID, "cpu-blas: unknown or out-of-range option '%.*s'", o.item_len, o.item);
        }
    }
    return rc < 0 ? h->error(rc, "cpu-blas: %s", err) : rc;
}

static void cpu_blas_close(void *self)
{
    cpu_blas *s = self;
    if (!s)
        return;
    const rlx_host *h = s->host;
    plugin_pool_destroy(s->pool);
    for (int i = 0; s->tile && i < s->n_threads; i++)
        h->free(s->tile[i].p);
    for (int i = 0; s->att && i < s->n_threads; i++)
        h->free(s->att[i].p);
    h->free(s->tile);
    h->free(s->att);
    h->free(s->main.p);
    h->free(s->rope_cs.p);
    h->free(s->rope_pos.p);
    h->free(s);
}

static int cpu_blas_open(const rlx_host *host, const rlx_backend_options *opts, void **self)
{
    *self = NULL;
    cpu_blas *s = host->alloc(sizeof *s, CPU_BLAS_ALIGN);
    if (!s)
        return host->error(RLX_E_NOMEM, "cpu-blas: out of memory");
    memset(s, 0, sizeof *s);
    s->host = host;
    s->tile_bytes = 1536 * 1024;
    s->gemv_max_m = 12;
    s->spin_ns = 200 * 1000;
    /* the cores this process may run on, which a container or taskset can make fewer than online */
    cpu_set_t cpus;
    long n_cpu = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : sysconf(_SC_NPROCESSORS_ONLN);
    s->n_threads = n_cpu > 0 ? (int)(n_cpu < 256 ? n_cpu : 256) : 1;
    char isa[16] = "auto";
    int rc;
    if (opts && RLX_HAS(rlx_backend_options, opts, n_threads) && opts->n_threads > 0)
        s->n_threads = opts->n_threads < 256 ? (int)opts->n_threads : 256;
    if (opts && RLX_HAS(rlx_backend_options, opts, extra) &&
        (rc = cpu_blas_parse_extra(s, opts->extra, isa, sizeof isa)) < 0)
        goto fail;
    if (!cpu_blas_ob && !(cpu_blas_ob = cpu_blas_openblas_load(host))) {
        rc = RLX_E_UNSUPPORTED;
        goto fail;
    }
    static const cpu_blas_kernels *const by_isa[PLUGIN_ISA_COUNT] = {&cpu_blas_kernels_c, &cpu_blas_kernels_avx2,
                                                                       &cpu_blas_kernels_avx512};
    plugin_isa level;
    if ((rc = plugin_isa_choose(host, "cpu-blas", isa, &level)) < 0)
        goto fail;
    s->k = by_isa[level];
    /* The pool parallelises every matmul itself; OpenBLAS threads would only compete with it. */
    cpu_blas_ob->set_num_threads(1);

    const size_t nt = (size_t)s->n_threads;
    s->tile = host->alloc(nt * sizeof *s->tile, CPU_BLAS_ALIGN);
    s->att = host->alloc(nt * sizeof *s->att, CPU_BLAS_ALIGN);
    if (!s->tile || !s->att) {
        rc = host->error(RLX_E_NOMEM, "cpu-blas: out of memory");
        goto fail;
    }
    memset(s->tile, 0, nt * sizeof *s->tile);
    memset(s->att, 0, nt * sizeof *s->att);
    if ((rc = plugin_pool_create(s->n_threads, s->spin_ns, &s->pool)) < 0) {
        rc = host->error(rc, "cpu-blas: cannot start %d worker threads", s->n_threads - 1);
        goto fail;
    }
    snprintf(s->describe, sizeof s->describe, "%s kernels, %d thread%s, OpenBLAS core %s (%s), %s", s->k->isa,
             s->n_threads, s->n_threads == 1 ? "" : "s", cpu_blas_ob->get_corename(), cpu_blas_ob->origin,
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

static int cpu_blas_supports(void *self, const rlx_node_view *node)
{
    return node_check(((const cpu_blas *)self)->host, "cpu-blas", node, false) == RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// Row-wise ops: EMBED, RMS_NORM, ROPE (and its cos/sin table), SWIGLU, ADD

typedef struct cpu_blas_rows_job {
    const cpu_blas *s;
    int op;            /* rlx_op, or 0 for the ROPE cos/sin table */
    int64_t n;         /* rows; flat elements for SWIGLU and ADD */
    int64_t chunk;     /* rows (elements) per pool chunk */
    int64_t cols;      /* values per row */
    const float *a;    /* x, gate or first addend */
    const float *b;    /* up, second addend, F32 norm weight or ROPE table */
    float *y;
    const void *table; /* EMBED: [V, cols] of dtype dt */
    int dt;
    const int32_t *idx; /* EMBED ids, ROPE positions */
    const double *inv_freq;
    int64_t g;          /* RMS_NORM group size; ROPE head_dim / 2 */
    float eps;
} cpu_blas_rows_job;

static void cpu_blas_rows_task(void *arg, int ith, int64_t chunk)
{
    const cpu_blas_rows_job *j = arg;
    const cpu_blas_kernels *k = j->s->k;
    const int64_t r0 = chunk * j->chunk, r1 = r0 + j->chunk < j->n ? r0 + j->chunk : j->n;
    (void)ith;
    switch (j->op) {
    case RLX_OP_EMBED: {
        const size_t row_bytes = (size_t)j->cols * rlx_iface_dtype_size((uint32_t)j->dt);
        for (int64_t r = r0; r < r1; r++)
            k->cvt(j->dt, (const char *)j->table + (size_t)j->idx[r] * row_bytes, j->y + r * j->cols, j->cols);
        break;
    }
    case RLX_OP_RMS_NORM:
        for (int64_t r = r0; r < r1; r++)
            k->rms_norm(j->a + r * j->cols, j->b, j->y + r * j->cols, j->cols, j->g, j->eps);
        break;
    case RLX_OP_ROPE:
        for (int64_t r = r0; r < r1; r++)
            k->rope(j->a + r * j->cols, j->b + r * 2 * j->g, j->y + r * j->cols, j->cols / (2 * j->g), j->g);
        break;
    case RLX_OP_SWIGLU:
        k->swiglu(j->a + r0, j->b + r0, j->y + r0, r1 - r0);
        break;
    case RLX_OP_ADD:
        k->add(j->a + r0, j->b + r0, j->y + r0, r1 - r0);
        break;
    default: /* ROPE table: angles in F64, as the core's reference and the NumPy goldens */
        for (int64_t r = r0; r < r1; r++) {
            float *cs = j->y + r * 2 * j->g;
            for (int64_t i = 0; i < j->g; i++) {
                double sn, cn;
                sincos((double)j->idx[r] * j->inv_freq[i], &sn, &cn);
                cs[i] = (float)cn;
                cs[j->g + i] = (float)sn;
            }
        }
        break;
    }
}

static void cpu_blas_run_rows(cpu_blas *s, cpu_blas_rows_job *j, int64_t work_per_row)
{
    const bool flat = j->op == RLX_OP_SWIGLU || j->op == RLX_OP_ADD;
    j->chunk = cpu_blas_chunk(s, j->n, flat ? CPU_BLAS_ROW_ALIGN : 1, 1);
    plugin_pool_run(s->pool, cpu_blas_rows_task, j, (j->n + j->chunk - 1) / j->chunk,
                      j->n * work_per_row >= CPU_BLAS_PAR_MIN);
}

/* A small weight vector (norm weight, bias) as F32: the weight itself or a copy in s->main. */
static int cpu_blas_f32_vec(cpu_blas *s, const rlx_tensor *t, const float **out)
{
    if (t->dtype == RLX_DTYPE_F32) {
        *out = t->data;
        return RLX_OK;
    }
    const int64_t n = rlx_iface_numel(t);
    const int rc = cpu_blas_reserve(s, &s->main, (size_t)n * sizeof(float));
    if (rc < 0)
        return rc;
    s->k->cvt((int)t->dtype, t->data, s->main.p, n);
    *out = s->main.p;
    return RLX_OK;
}

static int cpu_blas_embed(cpu_blas *s, const rlx_node_view *n)
{
    const rlx_tensor *ids = &n->inputs[0], *tab = &n->inputs[1];
    const int32_t *id = ids->data;
    const int64_t T = rlx_iface_numel(ids), V = tab->shape[0];
    for (int64_t t = 0; t < T; t++)
        if (id[t] < 0 || id[t] >= V)
            return s->host->error(RLX_E_RANGE, "cpu-blas: node '%s': token id %d at %lld outside [0, %lld)",
                                  n->name ? n->name : "?", id[t], (long long)t, (long long)V);
    cpu_blas_rows_job j = {.s = s, .op = RLX_OP_EMBED, .n = T, .cols = tab->shape[1], .y = n->output->data,
                           .table = tab->data, .dt = (int)tab->dtype, .idx = id};
    cpu_blas_run_rows(s, &j, j.cols);
    return RLX_OK;
}

static int cpu_blas_rms_norm(cpu_blas *s, const rlx_node_view *n)
{
    const rlx_tensor *x = &n->inputs[0];
    const float *w;
    const int rc = cpu_blas_f32_vec(s, &n->inputs[1], &w);
    if (rc < 0)
        return rc;
    cpu_blas_rows_job j = {.s = s, .op = RLX_OP_RMS_NORM, .n = rlx_iface_rows(x), .cols = rlx_iface_cols(x),
                           .a = x->data, .b = w, .y = n->output->data, .g = rlx_iface_numel(&n->inputs[1]),
                           .eps = n->params->eps};
    cpu_blas_run_rows(s, &j, 2 * j.cols);
    return RLX_OK;
}

/* Makes s->rope_cs hold the cos/sin rows for these positions, head_dim and theta. */
static int cpu_blas_rope_table(cpu_blas *s, const int32_t *pos, int64_t T, uint32_t D, float theta)
{
    if (s->rope_t == T && s->rope_d == D && s->rope_theta == theta &&
        !memcmp(s->rope_pos.p, pos, (size_t)T * sizeof *pos))
        return RLX_OK;
    const int64_t half = D / 2;
    int rc;
    s->rope_t = -1;
    if ((rc = cpu_blas_reserve(s, &s->rope_cs, (size_t)(T * D) * sizeof(float) + (size_t)half * sizeof(double))) < 0 ||
        (rc = cpu_blas_reserve(s, &s->rope_pos, (size_t)T * sizeof *pos)) < 0)
        return rc;
    double *inv = (double *)((float *)s->rope_cs.p + T * D); /* D even: 8-byte aligned */
    for (int64_t i = 0; i < half; i++)
        inv[i] = pow((double)theta, -2.0 * (double)i / (double)D);
    cpu_blas_rows_job j = {.s = s, .op = 0, .n = T, .y = s->rope_cs.p, .idx = pos, .inv_freq = inv, .g = half};
    cpu_blas_run_rows(s, &j, 16 * half);
    memcpy(s->rope_pos.p, pos, (size_t)T * sizeof *pos);
    s->rope_t = T;
    s->rope_d = D;
    s->rope_theta = theta;
    return RLX_OK;
}

static int cpu_blas_rope(cpu_blas *s, const rlx_node_view *n)
{
    const rlx_tensor *x = &n->inputs[0];
    const int64_t T = rlx_iface_rows(x);
    const uint32_t D = n->params->head_dim;
    if (T == 0)
        return RLX_OK;
    const int rc = cpu_blas_rope_table(s, n->inputs[1].data, T, D, n->params->rope_theta);
    if (rc < 0)
        return rc;
    cpu_blas_rows_job j = {.s = s, .op = RLX_OP_ROPE, .n = T, .cols = rlx_iface_cols(x), .a = x->data,
                           .b = s->rope_cs.p, .y = n->output->data, .g = D / 2};
    cpu_blas_run_rows(s, &j, j.cols);
    return RLX_OK;
}

static int cpu_blas_eltwise(cpu_blas *s, const rlx_node_view *n)
{
    cpu_blas_rows_job j = {.s = s, .op = (int)n->op, .n = rlx_iface_numel(n->output), .a = n->inputs[0].data,
                           .b = n->inputs[1].data, .y = n->output->data};
    cpu_blas_run_rows(s, &j, n->op == RLX_OP_SWIGLU ? 8 : 1);
    return RLX_OK;
}

static int cpu_blas_gather_last(const rlx_node_view *n)
{
    const rlx_tensor *x = &n->inputs[0];
    const int64_t T = rlx_iface_rows(x), C = rlx_iface_cols(x);
    if (T > 0)
        memcpy(n->output->data, (const float *)x->data + (T - 1) * C, (size_t)C * sizeof(float));
    else
        memset(n->output->data, 0, (size_t)C * sizeof(float));
    return RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// MATMUL: y[M, N] = x[M, K] w[N, K]^T (+ bias), output features split across the pool

typedef struct cpu_blas_mm {
    const cpu_blas *s;
    const float *x; /* [M, K] */
    const void *w;  /* [N, K] of dtype wdt */
    const float *bias; /* [N] or NULL */
    float *y;          /* [M, N] */
    int64_t M, K, N;
    int64_t chunk; /* output features per pool chunk; one weight tile on the tile path */
    int wdt;
} cpu_blas_mm;

/* The most rows of one widened weight tile: tile_bytes of F32, a multiple of CPU_BLAS_ROW_ALIGN.
 * Large tiles pay off although they spill from L2: OpenBLAS packs x again for every tile. */
static int64_t cpu_blas_tile_rows(const cpu_blas *s, int64_t K)
{
    const int64_t rows = (int64_t)(s->tile_bytes / sizeof(float)) / K;
    return rows < CPU_BLAS_ROW_ALIGN ? CPU_BLAS_ROW_ALIGN : rows / CPU_BLAS_ROW_ALIGN * CPU_BLAS_ROW_ALIGN;
}

static bool cpu_blas_mm_tiled(const cpu_blas *s, int64_t M, int wdt)
{
    return M > s->gemv_max_m && wdt != RLX_DTYPE_F32;
}

static void cpu_blas_mm_task(void *arg, int ith, int64_t chunk)
{
    const cpu_blas_mm *mm = arg;
    const cpu_blas *s = mm->s;
    const int64_t M = mm->M, K = mm->K, N = mm->N;
    const int64_t n0 = chunk * mm->chunk, n1 = n0 + mm->chunk < N ? n0 + mm->chunk : N;
    const size_t row_bytes = (size_t)K * rlx_iface_dtype_size((uint32_t)mm->wdt);
    const char *w = (const char *)mm->w;
    if (mm->wdt == RLX_DTYPE_F32 && M == 1) {
        /* OpenBLAS 0.3.21 does not route M = 1 sgemm to its much faster sgemv. */
        cpu_blas_ob->sgemv(CblasRowMajor, CblasNoTrans, (int)(n1 - n0), (int)K, 1.0f, (const float *)w + n0 * K, (int)K,
                    mm->x, 1, 0.0f, mm->y + n0, 1);
    } else if (M <= s->gemv_max_m) {
        for (int64_t m0 = 0; m0 < M; m0 += CPU_BLAS_GEMV_MAX_M) {
            const int64_t mb = M - m0 < CPU_BLAS_GEMV_MAX_M ? M - m0 : CPU_BLAS_GEMV_MAX_M;
            s->k->gemv[mm->wdt][mb - 1](mm->x + m0 * K, K, w, K, n0, n1, mm->y + m0 * N, N);
        }
    } else if (mm->wdt == RLX_DTYPE_F32) {
        cpu_blas_ob->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)(n1 - n0), (int)K, 1.0f, mm->x, (int)K,
                    (const float *)w + n0 * K, (int)K, 0.0f, mm->y + n0, (int)N);
    } else {
        /* Widen one tile of weight rows and multiply it while it is still in cache. */
        float *tile = s->tile[ith].p;
        s->k->cvt(mm->wdt, w + (size_t)n0 * row_bytes, tile, (n1 - n0) * K);
        cpu_blas_ob->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)(n1 - n0), (int)K, 1.0f, mm->x, (int)K, tile,
                    (int)K, 0.0f, mm->y + n0, (int)N);
    }
    if (mm->bias)
        for (int64_t m = 0; m < M; m++)
            s->k->add(mm->y + m * N + n0, mm->bias + n0, mm->y + m * N + n0, n1 - n0);
}

static int cpu_blas_mm_run(cpu_blas *s, const float *x, int64_t M, int64_t K, const void *w, int wdt, int64_t N,
                           const float *bias, float *y)
{
    if (M == 0 || N == 0)
        return RLX_OK;
    if (K == 0) {
        for (int64_t m = 0; m < M; m++)
            for (int64_t i = 0; i < N; i++)
                y[m * N + i] = bias ? bias[i] : 0.0f;
        return RLX_OK;
    }
    cpu_blas_mm mm = {.s = s, .x = x, .w = w, .bias = bias, .y = y, .M = M, .K = K, .N = N, .wdt = wdt};
    if (cpu_blas_mm_tiled(s, M, wdt)) {
        /* Whole rounds of tiles for the pool, each as large as tile_bytes allows. */
        const int64_t max_rows = cpu_blas_tile_rows(s, K);
        int64_t n_tiles = (N + max_rows - 1) / max_rows;
        n_tiles = (n_tiles + s->n_threads - 1) / s->n_threads * s->n_threads;
        mm.chunk = ((N + n_tiles - 1) / n_tiles + CPU_BLAS_ROW_ALIGN - 1) / CPU_BLAS_ROW_ALIGN * CPU_BLAS_ROW_ALIGN;
        for (int i = 0; i < s->n_threads; i++) {
            const int rc = cpu_blas_reserve(s, &s->tile[i], (size_t)(mm.chunk * K) * sizeof(float));
            if (rc < 0)
                return rc;
        }
    } else {
        mm.chunk = cpu_blas_chunk(s, N, CPU_BLAS_ROW_ALIGN, 64);
        if (M > CPU_BLAS_GEMV_MAX_M && M <= s->gemv_max_m) {
            /* Later passes over a chunk should find it in L2. */
            int64_t cap = CPU_BLAS_GEMV_CHUNK_BYTES / (K * (int64_t)rlx_iface_dtype_size((uint32_t)wdt));
            cap = cap < CPU_BLAS_ROW_ALIGN ? CPU_BLAS_ROW_ALIGN : cap / CPU_BLAS_ROW_ALIGN * CPU_BLAS_ROW_ALIGN;
            mm.chunk = mm.chunk < cap ? mm.chunk : cap;
        }
    }
    plugin_pool_run(s->pool, cpu_blas_mm_task, &mm, (N + mm.chunk - 1) / mm.chunk, M * N * K >= CPU_BLAS_PAR_MIN);
    return RLX_OK;
}

static int cpu_blas_matmul(cpu_blas *s, const rlx_node_view *n)
{
    const rlx_tensor *x = &n->inputs[0], *w = &n->inputs[1];
    const float *bias = NULL;
    if (n->n_inputs == 3) {
        const int rc = cpu_blas_f32_vec(s, &n->inputs[2], &bias);
        if (rc < 0)
            return rc;
    }
    return cpu_blas_mm_run(s, x->data, rlx_iface_rows(x), rlx_iface_cols(x), w->data, (int)w->dtype, w->shape[0],
                           bias, n->output->data);
}

// ---------------------------------------------------------------------------------------------
// ATTENTION: one pool chunk per (KV head, block of CPU_BLAS_ATT_TQ queries), late (longer)
// blocks first. Scores come from sgemv/sgemm over the cache slice the block can see.

typedef struct cpu_blas_att {
    const cpu_blas *s;
    const float *q;       /* [T, Hq*D] */
    const int32_t *pos;   /* [T] */
    const float *kc, *vc; /* [C, Hkv*D] */
    float *out;           /* [T, Hq*D] */
    int64_t T, D, Hq, Hkv, window;
    float scale;
    int64_t n_blocks;
} cpu_blas_att;

/* First cache row query t may see. */
static int64_t cpu_blas_att_lo(const cpu_blas_att *a, int64_t t)
{
    const int64_t lo = a->window > 0 ? (int64_t)a->pos[t] - a->window + 1 : 0;
    return lo > 0 ? lo : 0;
}

/* Cache rows ahead of use to prefetch: a head's rows are Hkv*D floats apart (4 KiB for Qwen3),
 * so each starts a new page, where hardware prefetchers stop. */
#define CPU_BLAS_ATT_AHEAD 6

static inline void cpu_blas_prefetch(const float *p, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16)
        _mm_prefetch((const char *)(p + i), _MM_HINT_T0);
}

static void cpu_blas_att_block(const cpu_blas_att *a, float *sc, int64_t kvh, int64_t blk)
{
    const cpu_blas_kernels *k = a->s->k;
    const int64_t D = a->D, t0 = blk * CPU_BLAS_ATT_TQ;
    const int64_t nq = a->T - t0 < CPU_BLAS_ATT_TQ ? a->T - t0 : CPU_BLAS_ATT_TQ;
    const int64_t ldq = a->Hq * D, ldk = a->Hkv * D, group = a->Hq / a->Hkv;
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t t = t0; t < t0 + nq; t++) {
        const int64_t l = cpu_blas_att_lo(a, t);
        lo = l < lo ? l : lo;
        hi = a->pos[t] + 1 > hi ? a->pos[t] + 1 : hi;
    }
    const int64_t nk = hi - lo;
    const float *kb = a->kc + lo * ldk + kvh * D, *vb = a->vc + lo * ldk + kvh * D;
    float *inv = sc + nq * nk; /* [nq] 1 / softmax sums */
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
        const float *qh = a->q + t0 * ldq + h * D;
        float *oh = a->out + t0 * ldq + h * D;
        cpu_blas_ob->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)D, a->scale, qh, (int)ldq, kb,
                    (int)ldk, 0.0f, sc, (int)nk);
        for (int64_t r = 0; r < nq; r++)
            inv[r] = 1.0f / k->softmax(sc + r * nk, nk, cpu_blas_att_lo(a, t0 + r) - lo, a->pos[t0 + r] + 1 - lo, NULL);
        cpu_blas_ob->sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)D, (int)nk, 1.0f, sc, (int)nk, vb,
                    (int)ldk, 0.0f, oh, (int)ldq);
        for (int64_t r = 0; r < nq; r++)
            k->scal(inv[r], oh + r * ldq, D);
    }
}

/* Decode (T = 1) splits the visible cache rows [lo, lo + nk) into chunks instead: a chunk reads
 * its rows whole and in order for all heads, and leaves per head its score maximum, its sum of
 * exponentials and its unnormalised output in part[chunk] = {max[Hq], sum[Hq], out[Hq, D]}. */
typedef struct cpu_blas_dec {
    const cpu_blas_att *a;
    int64_t lo, nk, rows; /* rows per chunk */
    float *part;
} cpu_blas_dec;

static void cpu_blas_dec_task(void *arg, int ith, int64_t chunk)
{
    const cpu_blas_dec *d = arg;
    const cpu_blas_att *a = d->a;
    const cpu_blas_kernels *k = a->s->k;
    const int64_t D = a->D, Hq = a->Hq, ldk = a->Hkv * D, group = Hq / a->Hkv;
    const int64_t j0 = d->lo + chunk * d->rows, n = d->lo + d->nk - j0 < d->rows ? d->lo + d->nk - j0 : d->rows;
    float *sc = a->s->att[ith].p; /* [Hq, n] */
    float *mx = d->part + chunk * Hq * (D + 2), *sum = mx + Hq, *out = sum + Hq;
    for (int64_t j = 0; j < n; j++) {
        const float *kr = a->kc + (j0 + j) * ldk;
        if (j + CPU_BLAS_ATT_AHEAD < n)
            cpu_blas_prefetch(kr + CPU_BLAS_ATT_AHEAD * ldk, ldk);
        for (int64_t h = 0; h < Hq; h++)
            sc[h * n + j] = k->dot(a->q + h * D, kr + h / group * D, D) * a->scale;
    }
    for (int64_t h = 0; h < Hq; h++)
        sum[h] = k->softmax(sc + h * n, n, 0, n, &mx[h]);
    memset(out, 0, (size_t)(Hq * D) * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        const float *vr = a->vc + (j0 + j) * ldk;
        if (j + CPU_BLAS_ATT_AHEAD < n)
            cpu_blas_prefetch(vr + CPU_BLAS_ATT_AHEAD * ldk, ldk);
        for (int64_t h = 0; h < Hq; h++)
            k->axpy(sc[h * n + j], vr + h / group * D, out + h * D, D);
    }
}

/* Attention of the single query of a T = 1 run; part is scratch of n_chunks * Hq * (D + 2). */
static void cpu_blas_decode(cpu_blas *s, const cpu_blas_att *a, float *part, int64_t rows, int64_t n_chunks)
{
    const cpu_blas_kernels *k = s->k;
    const int64_t D = a->D, Hq = a->Hq;
    const int64_t lo = cpu_blas_att_lo(a, 0), nk = a->pos[0] + 1 - lo;
    cpu_blas_dec d = {.a = a, .lo = lo, .nk = nk, .rows = rows, .part = part};
    plugin_pool_run(s->pool, cpu_blas_dec_task, &d, n_chunks, nk * Hq * D >= CPU_BLAS_PAR_MIN);
    /* out = sum_c e^(max_c - max) out_c / sum_c e^(max_c - max) sum_c */
    for (int64_t h = 0; h < Hq; h++) {
        float m = part[h];
        for (int64_t c = 1; c < n_chunks; c++)
            m = part[c * Hq * (D + 2) + h] > m ? part[c * Hq * (D + 2) + h] : m;
        float *oh = a->out + h * D, total = 0.0f;
        memset(oh, 0, (size_t)D * sizeof(float));
        for (int64_t c = 0; c < n_chunks; c++) {
            const float *pc = part + c * Hq * (D + 2);
            const float f = expf(pc[h] - m);
            total += f * pc[Hq + h];
            k->axpy(f, pc + 2 * Hq + h * D, oh, D);
        }
        k->scal(1.0f / total, oh, D);
    }
}

static void cpu_blas_att_task(void *arg, int ith, int64_t chunk)
{
    const cpu_blas_att *a = arg;
    cpu_blas_att_block(a, a->s->att[ith].p, chunk % a->Hkv, a->n_blocks - 1 - chunk / a->Hkv);
}

static int cpu_blas_attention(cpu_blas *s, const rlx_node_view *n)
{
    const rlx_tensor *in = n->inputs;
    const rlx_op_params *p = n->params;
    const int64_t T = rlx_iface_rows(&in[0]), C = rlx_iface_rows(&in[4]);
    const int64_t D = p->head_dim, Hkv = p->n_kv_heads, kv = Hkv * D;
    const int32_t *pos = in[3].data;
    if (T == 0)
        return RLX_OK;
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t t = 0; t < T; t++) {
        if (pos[t] < 0 || pos[t] >= C)
            return s->host->error(RLX_E_RANGE, "cpu-blas: node '%s': position %d of token %lld outside the cache "
                                  "[0, %lld)", n->name ? n->name : "?", pos[t], (long long)t, (long long)C);
        lo = pos[t] < lo ? pos[t] : lo;
        hi = pos[t] + 1 > hi ? pos[t] + 1 : hi;
    }
    float *kc = in[4].data, *vc = in[5].data;
    for (int64_t t = 0; t < T; t++) {
        memcpy(kc + pos[t] * kv, (const float *)in[1].data + t * kv, (size_t)kv * sizeof(float));
        memcpy(vc + pos[t] * kv, (const float *)in[2].data + t * kv, (size_t)kv * sizeof(float));
    }
    /* A block sees at most rows [min lo, max pos] of the cache: bound its score matrix by that. */
    const int64_t first = p->window > 0 ? lo - (int64_t)p->window + 1 : 0;
    const int64_t max_nk = hi - (first > 0 ? first : 0);
    cpu_blas_att a = {.s = s, .q = in[0].data, .pos = pos, .kc = kc, .vc = vc, .out = n->output->data, .T = T,
                      .D = D, .Hq = p->n_heads, .Hkv = Hkv, .window = p->window, .scale = p->scale,
                      .n_blocks = (T + CPU_BLAS_ATT_TQ - 1) / CPU_BLAS_ATT_TQ};
    int rc;
    if (T == 1) {
        const int64_t rows = cpu_blas_chunk(s, max_nk, 1, 32), n_chunks = (max_nk + rows - 1) / rows;
        if ((rc = cpu_blas_reserve(s, &s->main, (size_t)(n_chunks * a.Hq * (D + 2)) * sizeof(float))) < 0)
            return rc;
        for (int i = 0; i < s->n_threads; i++)
            if ((rc = cpu_blas_reserve(s, &s->att[i], (size_t)(a.Hq * rows) * sizeof(float))) < 0)
                return rc;
        cpu_blas_decode(s, &a, s->main.p, rows, n_chunks);
        return RLX_OK;
    }
    /* Scores of a block: tq queries of one head, plus their 1 / sums. */
    const int64_t tq = T < CPU_BLAS_ATT_TQ ? T : CPU_BLAS_ATT_TQ;
    for (int i = 0; i < s->n_threads; i++)
        if ((rc = cpu_blas_reserve(s, &s->att[i], (size_t)(tq * (max_nk + 1)) * sizeof(float))) < 0)
            return rc;
    plugin_pool_run(s->pool, cpu_blas_att_task, &a, a.n_blocks * Hkv,
                      T * max_nk * p->n_heads * D >= CPU_BLAS_PAR_MIN);
    return RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// MOE: route every token, then run each selected expert once over all of its tokens

static int cpu_blas_moe(cpu_blas *s, const rlx_node_view *n)
{
    const rlx_tensor *in = n->inputs;
    const rlx_op_params *p = n->params;
    const int64_t T = rlx_iface_rows(&in[0]), H = rlx_iface_cols(&in[0]), E = p->n_experts, K = p->top_k;
    const float *x = in[0].data;
    float *out = n->output->data;
    int64_t F = 0;
    for (int64_t e = 0; e < E; e++)
        F = in[2 + 3 * e].shape[0] > F ? in[2 + 3 * e].shape[0] : F;
    memset(out, 0, (size_t)(T * H) * sizeof(float));
    if (T == 0)
        return RLX_OK;

    /* s->main holds, each 64-byte aligned: router probabilities [T, E]; per (token, slot) pair
     * its expert and weight [T*K]; the pairs' tokens and weights sorted by expert [T*K]; each
     * expert's first sorted slot [E+1] and fill cursor [E]; then xe [T, H], g and u [T, F]
     * and ye [T, H] for one expert's tokens. */
    enum { L_PROB, L_PEXP, L_PWT, L_STOK, L_SWT, L_START, L_FILL, L_XE, L_G, L_U, L_YE, L_N };
    const size_t pairs = (size_t)(T * K);
    const size_t len[L_N] = {
        [L_PROB] = (size_t)(T * E) * sizeof(float), [L_PEXP] = pairs * sizeof(int64_t),
        [L_PWT] = pairs * sizeof(float),            [L_STOK] = pairs * sizeof(int64_t),
        [L_SWT] = pairs * sizeof(float),            [L_START] = (size_t)(E + 1) * sizeof(int64_t),
        [L_FILL] = (size_t)E * sizeof(int64_t),     [L_XE] = (size_t)(T * H) * sizeof(float),
        [L_G] = (size_t)(T * F) * sizeof(float),    [L_U] = (size_t)(T * F) * sizeof(float),
        [L_YE] = (size_t)(T * H) * sizeof(float),
    };
    size_t off[L_N + 1] = {0};
    for (int i = 0; i < L_N; i++)
        off[i + 1] = off[i] + (len[i] + CPU_BLAS_ALIGN - 1) / CPU_BLAS_ALIGN * CPU_BLAS_ALIGN;
    int rc = cpu_blas_reserve(s, &s->main, off[L_N]);
    if (rc < 0)
        return rc;
    char *base = s->main.p;
    float *prob = (float *)(base + off[L_PROB]), *pwt = (float *)(base + off[L_PWT]);
    float *swt = (float *)(base + off[L_SWT]);
    int64_t *pexp = (int64_t *)(base + off[L_PEXP]), *stok = (int64_t *)(base + off[L_STOK]);
    int64_t *start = (int64_t *)(base + off[L_START]), *fill = (int64_t *)(base + off[L_FILL]);
    float *xe = (float *)(base + off[L_XE]), *g = (float *)(base + off[L_G]), *u = (float *)(base + off[L_U]);
    float *ye = (float *)(base + off[L_YE]);

    if ((rc = cpu_blas_mm_run(s, x, T, H, in[1].data, (int)in[1].dtype, E, NULL, prob)) < 0)
        return rc;
    /* Softmax over the router logits, then top-k; ties go to the lower expert index and a
     * taken expert is marked with -1 (probabilities are >= 0). */
    for (int64_t t = 0; t < T; t++) {
        float *l = prob + t * E, mx = l[0], sum = 0.0f, ksum = 0.0f;
        for (int64_t e = 1; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        for (int64_t e = 0; e < E; e++)
            sum += l[e] = expf(l[e] - mx);
        for (int64_t i = 0; i < K; i++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (l[e] != -1.0f && (best < 0 || l[e] > l[best]))
                    best = e;
            pexp[t * K + i] = best;
            pwt[t * K + i] = l[best] / sum;
            ksum += pwt[t * K + i];
            l[best] = -1.0f;
        }
        if (p->norm_topk)
            for (int64_t i = 0; i < K; i++)
                pwt[t * K + i] /= ksum;
    }
    /* Counting sort of the pairs by expert, so each expert's weights are read once per call. */
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (size_t i = 0; i < pairs; i++)
        start[pexp[i] + 1]++;
    for (int64_t e = 0; e < E; e++)
        start[e + 1] += start[e];
    memcpy(fill, start, (size_t)E * sizeof *fill);
    for (size_t i = 0; i < pairs; i++) {
        const int64_t slot = fill[pexp[i]]++;
        stok[slot] = (int64_t)i / K;
        swt[slot] = pwt[i];
    }

    for (int64_t e = 0; e < E; e++) {
        const int64_t cnt = start[e + 1] - start[e];
        if (cnt == 0)
            continue;
        const rlx_tensor *wg = &in[2 + 3 * e], *wu = wg + 1, *wd = wg + 2;
        const int64_t Fe = wg->shape[0];
        const int64_t *tk = stok + start[e];
        for (int64_t r = 0; r < cnt; r++)
            memcpy(xe + r * H, x + tk[r] * H, (size_t)H * sizeof(float));
        if ((rc = cpu_blas_mm_run(s, xe, cnt, H, wg->data, (int)wg->dtype, Fe, NULL, g)) < 0 ||
            (rc = cpu_blas_mm_run(s, xe, cnt, H, wu->data, (int)wu->dtype, Fe, NULL, u)) < 0)
            return rc;
        cpu_blas_rows_job j = {.s = s, .op = RLX_OP_SWIGLU, .n = cnt * Fe, .a = g, .b = u, .y = g};
        cpu_blas_run_rows(s, &j, 8);
        if ((rc = cpu_blas_mm_run(s, g, cnt, Fe, wd->data, (int)wd->dtype, H, NULL, ye)) < 0)
            return rc;
        for (int64_t r = 0; r < cnt; r++)
            s->k->axpy(swt[start[e] + r], ye + r * H, out + tk[r] * H, H);
    }
    return RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// Entry

static int cpu_blas_compute(void *self, const rlx_node_view *node)
{
    cpu_blas *s = self;
    const int rc = node_check(s->host, "cpu-blas", node, true);
    if (rc < 0)
        return rc;
    /* The setting is process-wide: if anything raised it since open(), every pool thread's
     * OpenBLAS call would start threads of its own. */
    if (cpu_blas_ob->get_num_threads() != 1)
        cpu_blas_ob->set_num_threads(1);
    switch (node->op) {
    case RLX_OP_EMBED:
        return cpu_blas_embed(s, node);
    case RLX_OP_MATMUL:
        return cpu_blas_matmul(s, node);
    case RLX_OP_RMS_NORM:
        return cpu_blas_rms_norm(s, node);
    case RLX_OP_ROPE:
        return cpu_blas_rope(s, node);
    case RLX_OP_ATTENTION:
        return cpu_blas_attention(s, node);
    case RLX_OP_SWIGLU:
    case RLX_OP_ADD:
        return cpu_blas_eltwise(s, node);
    case RLX_OP_GATHER_LAST:
        return cpu_blas_gather_last(node);
    default:
        return cpu_blas_moe(s, node);
    }
}

static const char *cpu_blas_describe(void *self) { return ((const cpu_blas *)self)->describe; }

static const rlx_backend_iface cpu_blas_iface = {
    .size = sizeof(rlx_backend_iface),
    .open = cpu_blas_open,
    .close = cpu_blas_close,
    .supports = cpu_blas_supports,
    .compute = cpu_blas_compute,
    .describe = cpu_blas_describe,
};

static const rlx_plugin cpu_blas_plugin = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_BACKEND,
    .name = "cpu-blas",
    .version = "0.1.0",
    .summary = "CPU backend: OpenBLAS plus AVX-512/AVX2 kernels on its own thread pool; F32/BF16/F16 weights",
    .iface = &cpu_blas_iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host)
{
    if (!host || host->abi_major != RLX_ABI_MAJOR) {
        if (host && host->error)
            host->error(RLX_E_ABI, "cpu-blas: built for ABI %d, host has %u", RLX_ABI_MAJOR, host->abi_major);
        return NULL;
    }
    return &cpu_blas_plugin;
}
