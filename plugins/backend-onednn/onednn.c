/* onednn: the oneDNN backend plugin of rlx. Matmuls are oneDNN matmul primitives; the other
 * ops are the CPU kernel library's (plugins/kernels/kern.h: AVX-512, AVX2 + FMA + F16C or
 * portable C, picked at open()), whose parallel_for runs here on the same OpenMP threads as
 * oneDNN, so only one thread pool ever spins.
 *
 * A weight takes one of two paths, fixed by its dtype and by what oneDNN does on this CPU:
 *   - packed: when a plan is made (prepare_weight) the weight is reordered once into the layout
 *     oneDNN prefers (format_tag_any), and the copy lives until its model closes. BF16 weights go
 *     this way where oneDNN runs bf16 x bf16 -> f32 matmuls (AVX-512 CPUs): activations are
 *     rounded to BF16 on the way in, which makes those matmuls approximate (error at most
 *     2^-8 sum |x w| per output). F32 weights go this way, as exact f32 primitives, when the
 *     preferred layout is a blocked one (brgemm on AVX-512).
 *   - widened (F16 weights; BF16 weights where oneDNN has no BF16 matmul or with bf16=0; F32
 *     weights whose preferred layout is plain, as with gemm:jit on AVX2): exact F32 arithmetic
 *     on the stored weights, with no copy of the model. A few activation rows stream the
 *     weights through the library's stream GEMV kernels, which widen them in registers; more
 *     rows widen one L2-sized tile of weight rows per thread at a time (F32 rows are used in
 *     place) and run a single-threaded oneDNN f32 matmul on it while it is hot.
 * Block-quantized weights (GGUF Q4_0 ... Q6_K) take neither: the kernel library runs them as
 * cpu-blas does, activations quantized to int8 blocks (RLX_PRECISION_Q8_ACT); a type with a
 * repacked form (kern_qrp.h) is repacked at prepare_weight into row-interleaved groups, which
 * kern_qrp multiplies for every token count, and the others (or a node run outside a plan)
 * take kern_qmatmul on the stored weight, the same bits.
 * Packing a weight the core marks as a read-only mapping of a model file (RLX_WEIGHT_FILE_BACKED)
 * drops the mapped pages afterwards (option drop=1, the default): dropping them only lowers the
 * resident size, and any later read faults them back from the file. A node run outside a plan
 * (no prepared handle) packs its weight for that call alone.
 * Idle OpenMP threads busy-wait: libgomp spins 300000 times (about 3 ms) at every barrier unless
 * GOMP_SPINCOUNT or OMP_WAIT_POLICY say otherwise, and reads them once, when it is loaded with
 * this plugin, before any of its code runs. So the rlx app sets GOMP_SPINCOUNT=20000 (about
 * 0.2 ms) at startup when neither is set, and a process that shares the machine yields its cores
 * soon; an application embedding librlx sets them itself before loading plugins. */
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "kern.h"
#include "node_check.h"
#include "plugin_entry.h"
#include "pool.h"
#include "rlx/backend_iface.h"

/* Matmul primitives kept; the least recently used one is destroyed beyond that. */
#define ONEDNN_PRIM_SLOTS 256

// ---------------------------------------------------------------------------------------------
// Instance

/* The packed layout oneDNN chose for weights of one shape and compute type; every weight of
 * that shape is packed into it, so one primitive per M serves them all. */
typedef struct onednn_layout {
    int64_t N, K;
    dnnl_data_type_t dt;
    dnnl_memory_desc_t md;
} onednn_layout;

/* A packed weight: a handle of prepare_weight (kind ONEDNN_WEIGHT_PACKED), or packed for one
 * call of a node run outside a plan. */
typedef struct onednn_weight {
    kern_weight base;
    uint32_t layout; /* index into onednn.layouts */
    void *packed;    /* our copy in the layout, NULL when the original already is in it */
    dnnl_memory_t mem;
} onednn_weight;

enum { ONEDNN_WEIGHT_PACKED = KERN_WEIGHT_BACKEND };

enum { ONEDNN_PRIM_PACKED = 1, ONEDNN_PRIM_TILE = 2 };

/* A matmul primitive. PACKED: x[M, K] times a packed weight of `layout`, optional bias, into
 * y[M, N]. TILE: single-threaded f32 x[M, K] times a plain tile w[N, K] into y rows ldy apart. */
typedef struct onednn_prim {
    uint32_t kind; /* 0 = free slot */
    uint32_t layout;
    int64_t M, K, N, ldy;
    int bias;
    uint64_t used; /* LRU clock */
    dnnl_primitive_t p;
    dnnl_memory_desc_t src_md, dst_md, bias_md;
    size_t scratch; /* scratchpad bytes */
} onednn_prim;

typedef struct onednn {
    const rlx_host *host;
    char describe[256]; /* rlx_backend_iface.describe */
    kern_ctx kern;      /* the kernel library on the OpenMP threads */
    int n_threads;
    plugin_stragglers stragglers; /* when the plugin's own regions go serial (plugins/common/pool.h) */
    int bf16;                     /* BF16 weights run as oneDNN bf16 matmuls (activations rounded to BF16) */
    int drop;                     /* drop the mapped pages of packed weights */
    int pack_f32;                 /* 1: pack F32 weights even into a plain layout; 2: into the AVX-512 blocked one */
    size_t pack_bytes;            /* weight bytes reordered at a time while packing (then their pages drop) */
    int gemv_max_m;               /* widened matmuls with at most this many rows use the GEMV kernels */
    size_t tile_bytes;            /* per-thread F32 tile of widened weight rows */
    dnnl_engine_t engine;
    dnnl_stream_t *streams; /* [n_threads]: a stream is not for concurrent use */
    onednn_layout *layouts;
    uint32_t n_layouts, cap_layouts;
    onednn_prim prims[ONEDNN_PRIM_SLOTS];
    uint64_t clock;
    kern_buf *scratch; /* [n_threads] oneDNN scratchpads */
    kern_buf *tile;    /* [n_threads] widened weight tiles */
    kern_buf act;      /* BF16 activations of the current matmul */
} onednn;

/* Threads worth using for a job of `work` multiply-adds (or elements) over `items` units. */
static int onednn_nth(onednn *s, int64_t work, int64_t items) {
    if (work < KERN_PAR_MIN || items < 2 || s->n_threads == 1 || plugin_stragglers_serial(&s->stragglers))
        return 1;
    return items < s->n_threads ? (int)items : s->n_threads;
}

/* The straggler rule for the plugin's own OpenMP regions: a region started at t0 whose master
 * thread finished its own share at own_done. The rest of the region was spent waiting at its
 * barrier for threads that lost their core to another process (see plugins/common/pool.h). */
static void onednn_region_done(onednn *s, int64_t t0, int64_t own_done) {
    const int64_t now = plugin_now_ns();
    plugin_stragglers_note(&s->stragglers, now - t0, now - own_done);
}

/* [*a, *b): the share of thread ith of n items, cut at multiples of align. */
static void onednn_split(int64_t n, int ith, int nth, int64_t align, int64_t *a, int64_t *b) {
    int64_t chunk = (n + nth - 1) / nth;
    chunk = (chunk + align - 1) / align * align;
    *a = chunk * ith < n ? chunk * ith : n;
    *b = *a + chunk < n ? *a + chunk : n;
}

// ---------------------------------------------------------------------------------------------
// The kernel library's parallel_for: OpenMP regions

static void onednn_parallel_for(void *self, int64_t n, int64_t align, int64_t work, kern_range_fn fn, void *ctx) {
    onednn *s = self;
    const int nth = onednn_nth(s, work, (n + align - 1) / align);
    if (nth == 1) {
        fn(ctx, 0, 0, n);
        return;
    }
    const int64_t t0 = plugin_now_ns();
    int64_t own_done = t0;
#pragma omp parallel num_threads(nth)
    {
        int64_t i0, i1;
        onednn_split(n, omp_get_thread_num(), omp_get_num_threads(), align, &i0, &i1);
        fn(ctx, omp_get_thread_num(), i0, i1);
        if (omp_get_thread_num() == 0)
            own_done = plugin_now_ns();
    }
    onednn_region_done(s, t0, own_done);
}

static void onednn_parallel_tasks(void *self, int64_t n, int64_t work, kern_range_fn fn, void *ctx) {
    onednn *s = self;
    const int nth = onednn_nth(s, work, n);
    const int64_t t0 = plugin_now_ns();
    int64_t own_done = t0;
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t i = 0; i < n; i++)
            fn(ctx, omp_get_thread_num(), i, i + 1);
        if (omp_get_thread_num() == 0)
            own_done = plugin_now_ns();
    }
    if (nth > 1)
        onednn_region_done(s, t0, own_done);
}

static const char *onednn_status_str(dnnl_status_t st) {
    switch (st) {
    case dnnl_success:
        return "success";
    case dnnl_out_of_memory:
        return "out of memory";
    case dnnl_invalid_arguments:
        return "invalid arguments";
    case dnnl_unimplemented:
        return "unimplemented";
    case dnnl_iterator_ends:
        return "iterator ends";
    case dnnl_runtime_error:
        return "runtime error";
    case dnnl_not_required:
        return "not required";
    default:
        return "unknown status";
    }
}

/* Reports a failed oneDNN call: `what` names the call and the shapes involved. */
static int onednn_fail(const onednn *s, dnnl_status_t st, const char *what) {
    return s->host->error(st == dnnl_out_of_memory ? RLX_E_NOMEM : RLX_E_PLUGIN, "onednn: %s: oneDNN says %s", what,
                          onednn_status_str(st));
}

/* Whether oneDNN implements bf16 x bf16 -> f32 matmuls on this CPU (2.6 does on AVX-512 only;
 * elsewhere primitive creation says unimplemented). */
static bool onednn_has_bf16(const onednn *s) {
    dnnl_memory_desc_t src, wei, dst;
    if (dnnl_memory_desc_init_by_tag(&src, 2, (dnnl_dims_t){1, 64}, dnnl_bf16, dnnl_ab) ||
        dnnl_memory_desc_init_by_tag(&wei, 2, (dnnl_dims_t){64, 64}, dnnl_bf16, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&dst, 2, (dnnl_dims_t){1, 64}, dnnl_f32, dnnl_ab))
        return false;
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_matmul_desc_init(&d, &src, &wei, NULL, &dst) || dnnl_primitive_desc_create(&pd, &d, NULL, s->engine, NULL))
        return false;
    dnnl_primitive_desc_destroy(pd);
    return true;
}

/* The keys of opts->extra, "key=value" pairs separated by commas, besides kern_open's
 * isa=auto|avx512|avx2|c (the kernels of the non-matmul ops: default auto, the best the CPU has,
 * at most $RLX_ISA; oneDNN's own are capped by DNNL_MAX_CPU_ISA):
 *   bf16=auto|0              0: never round activations to BF16; BF16 weights are then widened
 *                            and multiplied in F32, exact like the reference (default auto)
 *   f32=auto|packed|blocked  packed: copy F32 weights into oneDNN's layout even where it is a
 *                            plain one (default auto: only a blocked layout is worth a copy);
 *                            blocked: into the blocked layout brgemm uses on AVX-512, whatever the
 *                            CPU (tests the packing path anywhere; slow where oneDNN has no kernel
 *                            for that layout and runs its reference one)
 *   pack_kb=N                weight KiB reordered at a time while packing (default 16384)
 *   drop=1|0                 drop the mapped pages of packed weights (default 1)
 *   gemv_m=N                 widened matmuls up to N rows use the GEMV kernels, 0..8 (default 8)
 *   tile_kb=N                per-thread F32 tile of widened weights (default 384) */
static bool onednn_option(void *self, const rlx_iface_option *o) {
    onednn *s = self;
    long long v;
    if (rlx_iface_option_is(o, "bf16") && (!strcmp(o->value, "auto") || !strcmp(o->value, "0")))
        s->bf16 = strcmp(o->value, "0") != 0; /* auto: where oneDNN has BF16 matmuls, decided at open() */
    else if (rlx_iface_option_is(o, "f32") &&
             (!strcmp(o->value, "auto") || !strcmp(o->value, "packed") || !strcmp(o->value, "blocked")))
        s->pack_f32 = !strcmp(o->value, "packed") ? 1 : !strcmp(o->value, "blocked") ? 2 : 0;
    else if (rlx_iface_option_is(o, "pack_kb") && rlx_iface_option_int(o, 4, 4194304, &v))
        s->pack_bytes = (size_t)v * 1024;
    else if (rlx_iface_option_is(o, "drop") && rlx_iface_option_int(o, 0, 1, &v))
        s->drop = (int)v;
    else if (rlx_iface_option_is(o, "gemv_m") && rlx_iface_option_int(o, 0, KERN_GEMV_MAX_M, &v))
        s->gemv_max_m = (int)v;
    else if (rlx_iface_option_is(o, "tile_kb") && rlx_iface_option_int(o, 16, 65536, &v))
        s->tile_bytes = (size_t)v * 1024;
    else
        return false;
    return true;
}

static void onednn_close(void *self) {
    onednn *s = self;
    if (!s)
        return;
    const rlx_host *h = s->host;
    for (int i = 0; i < ONEDNN_PRIM_SLOTS; i++)
        if (s->prims[i].kind)
            dnnl_primitive_destroy(s->prims[i].p);
    h->free(s->layouts);
    kern_bufs_destroy(&s->kern, s->scratch);
    kern_bufs_destroy(&s->kern, s->tile);
    h->free(s->act.p);
    for (int i = 0; s->streams && i < s->n_threads; i++)
        if (s->streams[i])
            dnnl_stream_destroy(s->streams[i]);
    h->free(s->streams);
    if (s->engine)
        dnnl_engine_destroy(s->engine);
    kern_deinit(&s->kern);
    h->free(s);
}

/* The name oneDNN's documentation gives the instruction set it runs its primitives with. */
static const char *onednn_isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41:
        return "sse41";
    case dnnl_cpu_isa_avx:
        return "avx";
    case dnnl_cpu_isa_avx2:
        return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
        return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic:
        return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops:
        return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core:
        return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
        return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
        return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
        return "avx512_core_amx";
    default:
        return "unknown";
    }
}

static int onednn_open(const rlx_host *host, const rlx_backend_options *opts, void **self) {
    *self = NULL;
    onednn *s = kern_zalloc(host, "onednn", sizeof *s);
    if (!s)
        return RLX_E_NOMEM;
    s->host = host;
    s->drop = 1;
    s->pack_bytes = (size_t)16 << 20;
    /* OpenMP's static shares stall a whole region for any late thread: go serial sooner than
     * the pool does (plugins/common/pool.h); measured with a busy neighbour on 2 cores */
    plugin_stragglers_init(&s->stragglers, 500000, 10);
    s->gemv_max_m = KERN_GEMV_MAX_M;
    s->tile_bytes = 384 * 1024;
    s->bf16 = 1; /* bf16=auto: onednn_has_bf16 decides once the engine exists */
    const int n_cpu = omp_get_num_procs();
    const kern_par par = {.self = s,
                          .n_threads = n_cpu > 0 ? (n_cpu < 256 ? n_cpu : 256) : 1,
                          .parallel_for = onednn_parallel_for,
                          .parallel_tasks = onednn_parallel_tasks};
    /* oneDNN partitions work for the threads it asks OpenMP for and computes garbage if it
     * gets fewer, so never ask for more than OMP_THREAD_LIMIT allows */
    const int limit = omp_get_thread_limit();
    int rc = kern_open(&s->kern, host, "onednn", opts, limit < 256 ? limit : 256, onednn_option, par);
    if (rc < 0)
        goto fail;
    s->n_threads = s->kern.par.n_threads;
    s->scratch = kern_bufs_create(&s->kern);
    s->tile = kern_bufs_create(&s->kern);
    s->streams = host->alloc((size_t)s->n_threads * sizeof *s->streams, KERN_ALIGN);
    if (!s->scratch || !s->tile || !s->streams) {
        rc = host->error(RLX_E_NOMEM, "onednn: out of memory");
        goto fail;
    }
    memset(s->streams, 0, (size_t)s->n_threads * sizeof *s->streams);
    dnnl_status_t st = dnnl_engine_create(&s->engine, dnnl_cpu, 0);
    for (int i = 0; st == dnnl_success && i < s->n_threads; i++)
        st = dnnl_stream_create(&s->streams[i], s->engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        rc = onednn_fail(s, st, "creating the CPU engine");
        goto fail;
    }
    s->bf16 = s->bf16 && onednn_has_bf16(s);
    const dnnl_version_t *v = dnnl_version();
    snprintf(s->describe, sizeof s->describe,
             "oneDNN %d.%d.%d on %s, %s kernels, quantized matmuls on %s kernels, BF16 weights %s, %d thread%s",
             v->major, v->minor, v->patch, onednn_isa_name(dnnl_get_effective_cpu_isa()), s->kern.k->isa,
             kern_qrp_ops_at(s->kern.isa, RLX_DTYPE_Q8_0)->isa,
             s->bf16 ? "packed (BF16 activations)" : "widened to F32", s->n_threads, s->n_threads == 1 ? "" : "s");
    host->log(RLX_LOG_DEBUG, "onednn: %s", s->describe);
    *self = s;
    return RLX_OK;
fail:
    onednn_close(s);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Node validation: plugins/common/node_check.c

static int onednn_supports(void *self, const rlx_node_view *node) {
    return node_check(((const onednn *)self)->host, "onednn", node, false) == RLX_OK;
}

/* BF16 weights go to bf16 x bf16 primitives (activations rounded) where the CPU has them:
 * every MATMUL on such weights, and the experts of a MOE (its router stays exact). Block-
 * quantized weights run the kernel library's integer kernels (activations quantized). */
static uint32_t onednn_precision(void *self, const rlx_node_view *node) {
    const onednn *s = self;
    const int wdt = node_weight_dtype(node);
    if (wdt >= 0 && kern_quant_supported(wdt))
        return RLX_PRECISION_Q8_ACT;
    return s->bf16 && wdt == RLX_DTYPE_BF16 ? RLX_PRECISION_BF16_ACT : RLX_PRECISION_F32;
}

// ---------------------------------------------------------------------------------------------
// Matmul primitives, cached per shape with an LRU bound

static dnnl_primitive_attr_t onednn_user_scratchpad_attr(void) {
    dnnl_primitive_attr_t attr = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success)
        return NULL;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    return attr;
}

/* Creates the primitive of slot q (whose key fields are set) for the weights layout wmd. With
 * user scratchpads one primitive can run on several threads at once, each with its own. */
static dnnl_status_t onednn_prim_create(const onednn *s, onednn_prim *q, dnnl_data_type_t src_dt,
                                        const dnnl_memory_desc_t *wmd) {
    dnnl_status_t st;
    if ((st = dnnl_memory_desc_init_by_tag(&q->src_md, 2, (dnnl_dims_t){q->M, q->K}, src_dt, dnnl_ab)) ||
        (st = dnnl_memory_desc_init_by_strides(&q->dst_md, 2, (dnnl_dims_t){q->M, q->N}, dnnl_f32,
                                               (dnnl_dims_t){q->ldy, 1})) ||
        (st = dnnl_memory_desc_init_by_tag(&q->bias_md, 2, (dnnl_dims_t){1, q->N}, dnnl_f32, dnnl_ab)))
        return st;
    dnnl_matmul_desc_t d;
    if ((st = dnnl_matmul_desc_init(&d, &q->src_md, wmd, q->bias ? &q->bias_md : NULL, &q->dst_md)))
        return st;
    dnnl_primitive_attr_t attr = onednn_user_scratchpad_attr();
    if (!attr)
        return dnnl_out_of_memory;
    dnnl_primitive_desc_t pd = NULL;
    st = dnnl_primitive_desc_create(&pd, &d, attr, s->engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (st)
        return st;
    /* oneDNN falls back to its reference kernels for a weight layout its fast ones refuse:
     * correct, but far slower, so say so (the layout was chosen for another M) */
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
        !strncmp(impl, "ref", 3))
        s->host->log(RLX_LOG_WARN, "onednn: matmul M=%lld K=%lld N=%lld runs on oneDNN's reference implementation",
                     (long long)q->M, (long long)q->K, (long long)q->N);
    q->scratch = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    st = dnnl_primitive_create(&q->p, pd);
    dnnl_primitive_desc_destroy(pd);
    return st;
}

/* The cached primitive for this key, created on first use. The returned slot stays valid
 * until the next call. */
static int onednn_prim_get(onednn *s, uint32_t kind, uint32_t layout, int64_t M, int64_t K, int64_t N, int64_t ldy,
                           int bias, onednn_prim **out) {
    onednn_prim *victim = &s->prims[0];
    for (int i = 0; i < ONEDNN_PRIM_SLOTS; i++) {
        onednn_prim *q = &s->prims[i];
        if (q->kind == kind && q->layout == layout && q->M == M && q->K == K && q->N == N && q->ldy == ldy &&
            q->bias == bias) {
            q->used = ++s->clock;
            *out = q;
            return RLX_OK;
        }
        if (!q->kind || (victim->kind && q->used < victim->used))
            victim = q;
    }
    if (victim->kind)
        dnnl_primitive_destroy(victim->p);
    memset(victim, 0, sizeof *victim);
    onednn_prim q = {.kind = kind, .layout = layout, .M = M, .K = K, .N = N, .ldy = ldy, .bias = bias};
    dnnl_status_t st;
    if (kind == ONEDNN_PRIM_PACKED) {
        const onednn_layout *l = &s->layouts[layout];
        st = onednn_prim_create(s, &q, l->dt, &l->md);
    } else {
        dnnl_memory_desc_t wmd;
        st = dnnl_memory_desc_init_by_tag(&wmd, 2, (dnnl_dims_t){K, N}, dnnl_f32, dnnl_ba);
        if (st == dnnl_success)
            st = onednn_prim_create(s, &q, dnnl_f32, &wmd);
    }
    if (st != dnnl_success) {
        char what[128];
        snprintf(what, sizeof what, "creating a matmul primitive for M=%lld K=%lld N=%lld", (long long)M, (long long)K,
                 (long long)N);
        return onednn_fail(s, st, what);
    }
    q.used = ++s->clock;
    *victim = q;
    *out = victim;
    return RLX_OK;
}

/* Runs primitive q on thread ith's stream with the given buffers; scratch must hold
 * q->scratch bytes. Memory objects are made per call: that costs well under a microsecond. */
static dnnl_status_t onednn_prim_run(const onednn *s, int ith, const onednn_prim *q, const void *src, dnnl_memory_t wei,
                                     const float *bias, float *dst, void *scratch) {
    dnnl_memory_t m[4] = {NULL, NULL, NULL, NULL};
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_WEIGHTS, wei}};
    int n_args = 1;
    dnnl_memory_desc_t sp_md;
    dnnl_status_t st;
    if ((st = dnnl_memory_create(&m[0], &q->src_md, s->engine, (void *)src)) ||
        (st = dnnl_memory_create(&m[1], &q->dst_md, s->engine, dst)))
        goto done;
    args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, m[0]};
    args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_DST, m[1]};
    if (q->scratch) {
        if ((st = dnnl_memory_desc_init_by_tag(&sp_md, 1, (dnnl_dims_t){(dnnl_dim_t)q->scratch}, dnnl_u8, dnnl_a)) ||
            (st = dnnl_memory_create(&m[2], &sp_md, s->engine, scratch)))
            goto done;
        args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m[2]};
    }
    if (q->bias) {
        if ((st = dnnl_memory_create(&m[3], &q->bias_md, s->engine, (void *)bias)))
            goto done;
        args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, m[3]};
    }
    st = dnnl_primitive_execute(q->p, s->streams[ith], n_args, args);
    if (st == dnnl_success)
        st = dnnl_stream_wait(s->streams[ith]);
done:
    for (int i = 0; i < 4; i++)
        if (m[i])
            dnnl_memory_destroy(m[i]);
    return st;
}

// ---------------------------------------------------------------------------------------------
// Packed weights: one reorder per weight pointer, then oneDNN matmuls on the packed copy

/* The layout for weights [N, K] computed in dt, chosen by oneDNN (format_tag_any) for a
 * matmul with M rows the first time the shape is seen. */
static int onednn_layout_get(onednn *s, int64_t N, int64_t K, dnnl_data_type_t dt, int64_t M, uint32_t *out) {
    for (uint32_t i = 0; i < s->n_layouts; i++)
        if (s->layouts[i].N == N && s->layouts[i].K == K && s->layouts[i].dt == dt) {
            *out = i;
            return RLX_OK;
        }
    if (s->n_layouts == s->cap_layouts) {
        const uint32_t cap = s->cap_layouts ? 2 * s->cap_layouts : 16;
        onednn_layout *l = s->host->alloc(cap * sizeof *l, KERN_ALIGN);
        if (!l)
            return s->host->error(RLX_E_NOMEM, "onednn: out of memory");
        if (s->n_layouts)
            memcpy(l, s->layouts, s->n_layouts * sizeof *l);
        s->host->free(s->layouts);
        s->layouts = l;
        s->cap_layouts = cap;
    }
    dnnl_memory_desc_t src, wei, dst;
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t st;
    if ((st = dnnl_memory_desc_init_by_tag(&src, 2, (dnnl_dims_t){M, K}, dt, dnnl_ab)) ||
        (st = dnnl_memory_desc_init_by_tag(&wei, 2, (dnnl_dims_t){K, N}, dt,
                                           dt == dnnl_f32 && s->pack_f32 == 2 ? dnnl_BA16a64b : dnnl_format_tag_any)) ||
        (st = dnnl_memory_desc_init_by_tag(&dst, 2, (dnnl_dims_t){M, N}, dnnl_f32, dnnl_ab)) ||
        (st = dnnl_matmul_desc_init(&d, &src, &wei, NULL, &dst)) ||
        (st = dnnl_primitive_desc_create(&pd, &d, NULL, s->engine, NULL))) {
        char what[128];
        snprintf(what, sizeof what, "choosing the weight layout for K=%lld N=%lld", (long long)K, (long long)N);
        return onednn_fail(s, st, what);
    }
    onednn_layout *l = &s->layouts[s->n_layouts];
    *l = (onednn_layout){.N = N, .K = K, .dt = dt, .md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0)};
    dnnl_primitive_desc_destroy(pd);
    *out = s->n_layouts++;
    return RLX_OK;
}

/* Output features per packing chunk of a weight in layout md: about pack_bytes of the plain
 * source, in whole blocks of the layout's N blocking (a chunk must start on a block). 0: pack
 * the weight in one reorder (a layout that is not a plain blocking, or a small weight). */
static int64_t onednn_pack_rows(const onednn *s, const dnnl_memory_desc_t *md, int64_t N, int64_t K, size_t esz) {
    if (md->format_kind != dnnl_blocked)
        return 0;
    int64_t block = 1;
    for (int i = 0; i < md->format_desc.blocking.inner_nblks; i++)
        if (md->format_desc.blocking.inner_idxs[i] == 1)
            block *= md->format_desc.blocking.inner_blks[i];
    int64_t rows = (int64_t)(s->pack_bytes / ((size_t)K * esz)) / block * block;
    rows = rows < block ? block : rows;
    return rows < N ? rows : 0;
}

/* Reorders rows [n0, n0 + cnt) of the plain weight (dims {K, N}, tag ba) into the same rows of
 * e->mem's layout. */
static dnnl_status_t onednn_reorder_rows(const onednn *s, const dnnl_memory_desc_t *plain, const void *data,
                                         const onednn_weight *e, int64_t n0, int64_t cnt) {
    const onednn_layout *l = &s->layouts[e->layout];
    const int64_t K = l->K;
    dnnl_memory_desc_t from_md = *plain, to_md = l->md;
    dnnl_memory_t from = NULL, to = NULL;
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_status_t st = dnnl_success;
    if (cnt < l->N &&
        ((st = dnnl_memory_desc_init_submemory(&from_md, plain, (dnnl_dims_t){K, cnt}, (dnnl_dims_t){0, n0})) ||
         (st = dnnl_memory_desc_init_submemory(&to_md, &l->md, (dnnl_dims_t){K, cnt}, (dnnl_dims_t){0, n0}))))
        return st;
    if ((st = dnnl_memory_create(&from, &from_md, s->engine, (void *)data)) == dnnl_success &&
        (st = dnnl_memory_create(&to, &to_md, s->engine, e->packed)) == dnnl_success &&
        (st = dnnl_reorder_primitive_desc_create(&rpd, &from_md, s->engine, &to_md, s->engine, NULL)) == dnnl_success &&
        (st = dnnl_primitive_create(&r, rpd)) == dnnl_success &&
        (st = dnnl_primitive_execute(r, s->streams[0], 2,
                                     (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}})) == dnnl_success)
        st = dnnl_stream_wait(s->streams[0]);
    if (r)
        dnnl_primitive_destroy(r);
    if (rpd)
        dnnl_primitive_desc_destroy(rpd);
    if (from)
        dnnl_memory_destroy(from);
    if (to)
        dnnl_memory_destroy(to);
    return st;
}

/* Reorders w (plain [N, K] of its own dtype) into the layout of e and creates e->mem. Large
 * weights are reordered a chunk of rows at a time, each chunk's mapped pages dropped once it is
 * packed, so a weight is never resident twice: for a tied LM head (a quarter of a small model's
 * bytes) the peak would otherwise rise by its whole size. */
static int onednn_pack(onednn *s, onednn_weight *e, const rlx_tensor *w, bool drop) {
    const onednn_layout *l = &s->layouts[e->layout];
    const dnnl_data_type_t wdt = w->dtype == RLX_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    const int64_t N = w->shape[0], K = w->shape[1];
    const size_t esz = rlx_iface_dtype_size(w->dtype);
    dnnl_memory_desc_t plain;
    dnnl_status_t st = dnnl_memory_desc_init_by_tag(&plain, 2, (dnnl_dims_t){K, N}, wdt, dnnl_ba);
    if (st == dnnl_success && wdt == l->dt && dnnl_memory_desc_equal(&plain, &l->md)) {
        /* oneDNN wants the layout the weight already has: use it in place, read-only */
        st = dnnl_memory_create(&e->mem, &l->md, s->engine, (void *)w->data);
        return st == dnnl_success ? RLX_OK : onednn_fail(s, st, "wrapping a weight");
    }
    const size_t bytes = dnnl_memory_desc_get_size(&l->md);
    e->packed = s->host->alloc(bytes, KERN_ALIGN);
    if (!e->packed)
        return s->host->error(RLX_E_NOMEM, "onednn: cannot allocate %zu bytes for a packed %lldx%lld weight", bytes,
                              (long long)N, (long long)K);
    /* a layout padded past N (blocks beyond the last row) must read as zeros */
    memset(e->packed, 0, bytes);
    if (st == dnnl_success)
        st = dnnl_memory_create(&e->mem, &l->md, s->engine, e->packed);
    const int64_t rows = st == dnnl_success ? onednn_pack_rows(s, &l->md, N, K, esz) : 0;
    for (int64_t n0 = 0; st == dnnl_success && n0 < N; n0 += rows ? rows : N) {
        const int64_t cnt = rows && N - n0 > rows ? rows : N - n0;
        st = onednn_reorder_rows(s, &plain, w->data, e, n0, cnt);
        if (st == dnnl_success && rows && drop)
            kern_drop_pages((const char *)w->data + (size_t)n0 * (size_t)K * esz, (size_t)(cnt * K) * esz);
    }
    if (st != dnnl_success) {
        char what[96];
        snprintf(what, sizeof what, "packing a %lldx%lld weight", (long long)N, (long long)K);
        return onednn_fail(s, st, what);
    }
    if (!rows && drop)
        kern_drop_pages(w->data, (size_t)(N * K) * esz);
    return RLX_OK;
}

static void onednn_weight_clear(onednn *s, onednn_weight *e) {
    if (e->mem)
        dnnl_memory_destroy(e->mem);
    s->host->free(e->packed);
    memset(e, 0, sizeof *e);
}

/* Packs w into e for matmuls computed in dt (the layout oneDNN picks for M rows); drop: w is a
 * read-only mapping of a model file, whose packed pages may go. */
static int onednn_weight_make(onednn *s, const rlx_tensor *w, dnnl_data_type_t dt, int64_t M, bool drop,
                              onednn_weight *e) {
    *e = (onednn_weight){.base.kind = ONEDNN_WEIGHT_PACKED};
    int rc = onednn_layout_get(s, w->shape[0], w->shape[1], dt, M, &e->layout);
    if (rc == RLX_OK)
        rc = onednn_pack(s, e, w, drop);
    if (rc < 0)
        onednn_weight_clear(s, e);
    return rc;
}

/* y[M, N] = x[M, K] w^T (+ bias) with w packed; oneDNN threads the primitive itself. */
static int onednn_mm_packed(onednn *s, const float *x, int64_t M, const rlx_tensor *w, const onednn_weight *e,
                            const float *bias, float *y) {
    const int64_t N = w->shape[0], K = w->shape[1];
    const dnnl_data_type_t dt = s->layouts[e->layout].dt;
    onednn_prim *q;
    int rc;
    if ((rc = onednn_prim_get(s, ONEDNN_PRIM_PACKED, e->layout, M, K, N, N, bias != NULL, &q)) < 0 ||
        (rc = kern_reserve(&s->kern, &s->scratch[0], q->scratch)) < 0)
        return rc;
    const void *src = x;
    if (dt == dnnl_bf16) {
        if ((rc = kern_reserve(&s->kern, &s->act, (size_t)(M * K) * sizeof(uint16_t))) < 0)
            return rc;
        kern_to_bf16(&s->kern, x, s->act.p, M, K);
        src = s->act.p;
    }
    const dnnl_status_t st = onednn_prim_run(s, 0, q, src, e->mem, bias, y, s->scratch[0].p);
    if (st != dnnl_success) {
        char what[96];
        snprintf(what, sizeof what, "matmul M=%lld K=%lld N=%lld", (long long)M, (long long)K, (long long)N);
        return onednn_fail(s, st, what);
    }
    return RLX_OK;
}

// ---------------------------------------------------------------------------------------------
// Widened weights: exact F32 arithmetic on the stored weights, no copy of the model

typedef struct onednn_widen_job {
    onednn *s;
    const float *x; /* [M, K] */
    const void *w;  /* [N, K] of dtype wdt */
    const float *bias;
    float *y; /* [M, N] */
    int64_t M, K, N, tile_rows;
    int wdt;
    const onednn_prim *full;    /* TILE primitive for tile_rows rows */
    const onednn_prim *last[2]; /* TILE primitives for shorter last tiles of last_rows rows */
    int64_t last_rows[2];
    int n_last;
    dnnl_status_t st[256]; /* per part */
} onednn_widen_job;

/* Part ith of nth (the split the primitives were made for), run by OpenMP thread tid. */
static void onednn_widen_part(onednn_widen_job *j, int ith, int nth, int tid) {
    onednn *s = j->s;
    const int64_t M = j->M, K = j->K, N = j->N;
    int64_t n0, n1;
    onednn_split(N, ith, nth, KERN_ROW_ALIGN, &n0, &n1);
    if (n0 >= n1)
        return;
    if (M <= s->gemv_max_m) {
        s->kern.k->gemv_stream[j->wdt][M - 1](j->x, K, j->w, K, n0, n1, j->y, N);
    } else {
        const size_t row_bytes = (size_t)K * rlx_iface_dtype_size((uint32_t)j->wdt);
        dnnl_memory_desc_t md;
        for (int64_t n = n0; n < n1; n += j->tile_rows) {
            const int64_t cnt = n1 - n < j->tile_rows ? n1 - n : j->tile_rows;
            const onednn_prim *q = cnt == j->tile_rows ? j->full : j->last[j->last_rows[0] == cnt ? 0 : 1];
            const void *rows = (const char *)j->w + (size_t)n * row_bytes;
            float *tile = s->tile[tid].p;
            dnnl_memory_t wm = NULL;
            if (j->wdt == RLX_DTYPE_F32)
                tile = (float *)rows; /* read-only: oneDNN never writes weights */
            else
                s->kern.k->widen(j->wdt, rows, tile, cnt * K);
            dnnl_status_t st = dnnl_memory_desc_init_by_tag(&md, 2, (dnnl_dims_t){K, cnt}, dnnl_f32, dnnl_ba);
            if (st == dnnl_success)
                st = dnnl_memory_create(&wm, &md, s->engine, tile);
            if (st == dnnl_success)
                st = onednn_prim_run(s, tid, q, j->x, wm, NULL, j->y + n, s->scratch[tid].p);
            if (wm)
                dnnl_memory_destroy(wm);
            if (st != dnnl_success) {
                j->st[ith] = st;
                return;
            }
        }
    }
    if (j->bias)
        for (int64_t m = 0; m < M; m++)
            s->kern.k->add(j->y + m * N + n0, j->bias + n0, j->y + m * N + n0, n1 - n0);
}

/* y[M, N] = x[M, K] w^T (+ bias) for weights used as stored. The output features are split
 * across the threads; each widens its own tiles (F32 rows are used in place) and runs oneDNN
 * on them inside the parallel region, where oneDNN stays single-threaded. */
static int onednn_mm_widen(onednn *s, const float *x, int64_t M, const rlx_tensor *w, const float *bias, float *y) {
    const int64_t N = w->shape[0], K = w->shape[1];
    onednn_widen_job j = {.s = s,
                          .x = x,
                          .w = w->data,
                          .bias = bias,
                          .y = y,
                          .M = M,
                          .K = K,
                          .N = N,
                          .wdt = (int)w->dtype,
                          .st = {dnnl_success}};
    const int nth = onednn_nth(s, M * N * K, (N + KERN_ROW_ALIGN - 1) / KERN_ROW_ALIGN);
    int rc;
    if (M > s->gemv_max_m) {
        /* every primitive a thread needs exists before the threads start */
        onednn_prim *q;
        int64_t n0, n1;
        onednn_split(N, 0, nth, KERN_ROW_ALIGN, &n0, &n1); /* thread 0 has the largest share */
        const int64_t tile_rows = kern_tile_rows(s->tile_bytes, K);
        j.tile_rows = tile_rows < n1 - n0 ? tile_rows : n1 - n0;
        if ((j.wdt != RLX_DTYPE_F32 &&
             (rc = kern_reserve_each(&s->kern, s->tile, (size_t)(j.tile_rows * K) * sizeof(float))) < 0) ||
            (rc = onednn_prim_get(s, ONEDNN_PRIM_TILE, 0, M, K, j.tile_rows, N, 0, &q)) < 0 ||
            (rc = kern_reserve_each(&s->kern, s->scratch, q->scratch)) < 0)
            return rc;
        j.full = q;
        /* every non-empty share but the last has the same size, so at most two shorter last
         * tiles exist; these three primitives are the most recently used, none evicts another */
        for (int i = 0; i < nth; i++) {
            onednn_split(N, i, nth, KERN_ROW_ALIGN, &n0, &n1);
            const int64_t rest = (n1 - n0) % j.tile_rows;
            if (rest == 0 || (j.n_last && j.last_rows[0] == rest) || (j.n_last == 2 && j.last_rows[1] == rest))
                continue;
            if ((rc = onednn_prim_get(s, ONEDNN_PRIM_TILE, 0, M, K, rest, N, 0, &q)) < 0 ||
                (rc = kern_reserve_each(&s->kern, s->scratch, q->scratch)) < 0)
                return rc;
            j.last_rows[j.n_last] = rest;
            j.last[j.n_last++] = q;
        }
    }
    if (nth == 1) {
        onednn_widen_part(&j, 0, 1, 0);
    } else {
        const int64_t t0 = plugin_now_ns();
        int64_t own_done = t0;
        /* should OpenMP start fewer threads (nested in another region, a thread limit), the
         * parts the primitives were made for are still all done */
#pragma omp parallel num_threads(nth)
        {
            for (int i = omp_get_thread_num(); i < nth; i += omp_get_num_threads())
                onednn_widen_part(&j, i, nth, omp_get_thread_num());
            if (omp_get_thread_num() == 0)
                own_done = plugin_now_ns();
        }
        onednn_region_done(s, t0, own_done);
    }
    for (int i = 0; i < nth; i++)
        if (j.st[i] != dnnl_success) {
            char what[96];
            snprintf(what, sizeof what, "matmul M=%lld K=%lld N=%lld", (long long)M, (long long)K, (long long)N);
            return onednn_fail(s, j.st[i], what);
        }
    return RLX_OK;
}

/* The path of weight w in matmuls of M rows: packed (*packed, computed in *dt) or widened.
 * `exact` keeps BF16 weights off the BF16-activation path (the MoE router: rounding could flip
 * an expert). */
static int onednn_path(onednn *s, const rlx_tensor *w, int64_t M, bool exact, bool *packed, dnnl_data_type_t *dt) {
    *packed = false;
    if (w->dtype == RLX_DTYPE_BF16 && s->bf16 && !exact) {
        *packed = true;
        *dt = dnnl_bf16;
    } else if (w->dtype == RLX_DTYPE_F32) {
        /* Copy F32 weights only into a blocked layout (brgemm on AVX-512): where oneDNN wants
         * a plain one (gemm:jit on AVX2) the L2-sized tiles of the widened path, read in place,
         * run about twice as fast as one big call. */
        uint32_t l;
        const int rc = onednn_layout_get(s, w->shape[0], w->shape[1], dnnl_f32, M, &l);
        if (rc < 0)
            return rc;
        const dnnl_memory_desc_t *md = &s->layouts[l].md;
        *packed = s->pack_f32 || (md->format_kind == dnnl_blocked && md->format_desc.blocking.inner_nblks > 0);
        *dt = dnnl_f32;
    }
    return RLX_OK;
}

/* y[M, N] = x[M, K] w[N, K]^T (+ bias[N], F32) for any weight dtype, with w's prepared handle
 * (or NULL: a node run outside a plan, whose packed weight is made for this call alone).
 * Block-quantized weights (GGUF) run the kernel library's kernels, as on cpu-blas (their repacked
 * copy when prepared, else kern_qmatmul): oneDNN has no primitive for their layouts. */
static int onednn_mm(onednn *s, const float *x, int64_t M, const rlx_tensor *w, const kern_weight *prepared,
                     const float *bias, float *y, bool exact) {
    const kern_qrp_weight *qrp = kern_as_qrp(prepared);
    if (qrp)
        return kern_qrp_matmul(&s->kern, x, M, qrp, bias, y);
    if (kern_quant_supported((int)w->dtype))
        return kern_qmatmul(&s->kern, x, M, w->shape[1], w->data, (int)w->dtype, w->shape[0], bias, y);
    if (kern_matmul_trivial(M, w->shape[1], w->shape[0], bias, y))
        return RLX_OK;
    if (prepared && prepared->kind == ONEDNN_WEIGHT_PACKED)
        return onednn_mm_packed(s, x, M, w, (const onednn_weight *)prepared, bias, y);
    bool packed;
    dnnl_data_type_t dt;
    int rc = onednn_path(s, w, M, exact, &packed, &dt);
    if (rc < 0 || !packed)
        return rc < 0 ? rc : onednn_mm_widen(s, x, M, w, bias, y);
    onednn_weight e;
    if ((rc = onednn_weight_make(s, w, dt, M, false, &e)) < 0)
        return rc;
    rc = onednn_mm_packed(s, x, M, w, &e, bias, y);
    onednn_weight_clear(s, &e);
    return rc;
}

static int onednn_matmul(onednn *s, const rlx_node_view *n) {
    const rlx_tensor *x = &n->inputs[0];
    const float *bias;
    const int rc = kern_op_bias(&s->kern, n, &bias);
    return rc < 0 ? rc
                  : onednn_mm(s, x->data, rlx_iface_rows(x), &n->inputs[1], kern_prepared(&s->kern, n, 1), bias,
                              n->output->data, false);
}

// ---------------------------------------------------------------------------------------------
// ATTENTION and MOE: the library's, on these threads and matmuls

static int onednn_moe_mm(void *self, const float *x, int64_t M, const rlx_tensor *w, const kern_weight *prepared,
                         float *y, bool exact) {
    return onednn_mm(self, x, M, w, prepared, NULL, y, exact);
}

// ---------------------------------------------------------------------------------------------
// Prepared weights (ABI 1.2): each matmul weight on the packed path is packed once, at planning
// time, and released with its model; quantized ones with a repacked form are repacked (kern.h);
// small BF16/F16 vectors get F32 copies.

static int onednn_prepare_weight(void *self, const rlx_weight_info *w, void **handle) {
    onednn *s = self;
    *handle = NULL;
    if (kern_is_vec_input(w->op, w->input))
        return kern_prepare_vec(&s->kern, w, handle);
    const bool drop = s->drop && (w->flags & RLX_WEIGHT_FILE_BACKED) && (w->flags & RLX_WEIGHT_READ_ONLY);
    if (kern_qrp_use(w))
        return kern_prepare_qrp(&s->kern, w, drop, handle);
    const bool router = w->op == RLX_OP_MOE && w->input == 1;
    if (!(w->op == RLX_OP_MATMUL && w->input == 1) && !(w->op == RLX_OP_MOE && w->input >= 1))
        return RLX_OK;
    /* the layout oneDNN prefers for the rows the node multiplies (as first chosen for the shape) */
    const int64_t M = rlx_iface_rows(&w->node->inputs[0]);
    bool packed;
    dnnl_data_type_t dt;
    int rc = onednn_path(s, w->tensor, M, router, &packed, &dt);
    if (rc < 0 || !packed)
        return rc;
    onednn_weight *e = s->host->alloc(sizeof *e, KERN_ALIGN);
    if (!e)
        return s->host->error(RLX_E_NOMEM, "onednn: out of memory");
    omp_set_num_threads(s->n_threads);
    if ((rc = onednn_weight_make(s, w->tensor, dt, M, drop, e)) < 0) {
        s->host->free(e);
        return rc;
    }
    *handle = e;
    return RLX_OK;
}

static void onednn_release_weight(void *self, void *handle) {
    onednn *s = self;
    if (((const kern_weight *)handle)->kind == KERN_WEIGHT_VEC) {
        kern_release_vec(&s->kern, handle);
        return;
    }
    if (((const kern_weight *)handle)->kind == KERN_WEIGHT_QRP) {
        kern_release_qrp(&s->kern, handle);
        return;
    }
    onednn_weight_clear(s, handle);
    s->host->free(handle);
}

// ---------------------------------------------------------------------------------------------
// Entry

static int onednn_compute(void *self, const rlx_node_view *node) {
    onednn *s = self;
    const int rc = node_check(s->host, "onednn", node, true);
    if (rc < 0)
        return rc;
    /* The thread-count ICV is per thread and calls may come from any thread: set it each time
     * (oneDNN reads it when it starts its parallel regions). */
    omp_set_num_threads(s->n_threads);
    switch (node->op) {
    case RLX_OP_MATMUL:
        return onednn_matmul(s, node);
    case RLX_OP_ATTENTION:
        return kern_op_attention(&s->kern, node);
    case RLX_OP_MOE:
        /* primitives exist per row count, so an expert's counts above 8 are padded to a
         * multiple of 16 to keep the number of shapes small */
        return kern_op_moe(&s->kern, node, &(kern_matmul){.run = onednn_moe_mm, .self = s, .row_pad = 16});
    case RLX_OP_SIGMOID_MUL:
    case RLX_OP_SSM_CONV:
    case RLX_OP_GATED_DELTA:
        return kern_op_recurrent(&s->kern, node);
    default:
        return kern_op_rows(&s->kern, node);
    }
}

static const char *onednn_describe(void *self) { return ((const onednn *)self)->describe; }

static const rlx_backend_iface onednn_iface = {
    .size = sizeof(rlx_backend_iface),
    .open = onednn_open,
    .close = onednn_close,
    .supports = onednn_supports,
    .compute = onednn_compute,
    .precision = onednn_precision,
    .describe = onednn_describe,
    .prepare_weight = onednn_prepare_weight,
    .release_weight = onednn_release_weight,
};

static const rlx_plugin onednn_plugin = PLUGIN_BACKEND_DESC(
    "onednn", "0.1.0",
    "CPU backend: oneDNN matmuls (packed BF16 weights on AVX-512) plus SIMD kernels on OpenMP threads", &onednn_iface);

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    return plugin_entry(host, &onednn_plugin);
}
