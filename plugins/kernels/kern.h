/* The CPU kernel library of the in-tree CPU backends (cpu-blas, onednn): what they compute the
 * same way, written once. Three layers, each usable without the next:
 *   - kern_simd.h: single-threaded SIMD kernels over rows and ranges, one table per ISA level;
 *   - range ops (kern_rows.c, kern_attention.c, kern_moe.c): embed, RMS norm, RoPE, SwiGLU,
 *     add, BF16 rounding, attention and MoE routing over plain arrays, run on the backend's
 *     threads through kern_par, its parallel_for;
 *   - node ops (kern_op_*): rlx_node_view adapters for the ops whose node form both backends
 *     share, so a backend's compute() only dispatches.
 * A backend keeps what is its own (its matmuls, its thread runtime) and hands the library a
 * kern_ctx: its host, its name for messages, the kernel table and its parallel_for. The library
 * is linked statically into each plugin with hidden symbols; a kern_ctx, like the backend
 * instance it belongs to, is used by one thread at a time. */
#ifndef RLX_PLUGINS_KERN_H
#define RLX_PLUGINS_KERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "isa.h"
#include "kern_bf16.h"
#include "kern_qrp.h"
#include "kern_quant.h"
#include "kern_simd.h"
#include "rlx/backend_iface.h"

/* Below this many multiply-adds (or elements) a job runs on the calling thread alone. */
#define KERN_PAR_MIN 32768
/* Alignment of every buffer the library allocates (a cache line). */
#define KERN_ALIGN 64
/* Ranges of elementwise and matmul output jobs start at multiples of this (whole cache lines of y). */
#define KERN_ROW_ALIGN 16

// ---------------------------------------------------------------------------------------------
// parallel_for: the backend's threads, as the library sees them

/* Items [i0, i1) of a job, run by thread ith (0 = the calling thread, below kern_par.n_threads),
 * which names per-thread scratch such as kern_ctx.att[ith]. */
typedef void (*kern_range_fn)(void *ctx, int ith, int64_t i0, int64_t i1);

/* A backend's thread runtime: cpu-blas maps it to its futex pool (plugins/common/pool.h), onednn
 * to OpenMP regions (oneDNN runs on OpenMP threads, and only one pool may spin). Both calls run
 * fn over every item of [0, n) exactly once and return when all of it has returned, so ctx may
 * live on the caller's stack; a job of less than KERN_PAR_MIN work runs on the calling thread
 * alone. They are called by one thread at a time, and fn must not call them. */
typedef struct kern_par {
    void *self;    /* the backend instance, passed back */
    int n_threads; /* counting the caller; at least 1 */
    /* Even items: ranges start at multiples of align (the last one ends at n), cut the way the
     * runtime balances best (cpu-blas: about four chunks per thread, claimed dynamically;
     * onednn: one static share per thread). */
    void (*parallel_for)(void *self, int64_t n, int64_t align, int64_t work, kern_range_fn fn, void *ctx);
    /* Uneven tasks, handed out one at a time (i1 == i0 + 1), in order of i. */
    void (*parallel_tasks)(void *self, int64_t n, int64_t work, kern_range_fn fn, void *ctx);
} kern_par;

// ---------------------------------------------------------------------------------------------
// Context and scratch

typedef struct kern_buf {
    void *p;
    size_t cap; /* bytes */
} kern_buf;

typedef struct kern_ctx {
    const rlx_host *host;
    const char *plugin; /* starts every message, e.g. "cpu-blas" */
    const kern_simd *k;
    const kern_qsimd *q; /* the quantized kernels of the same level (kern_quant.h) */
    plugin_isa isa;      /* that level (the repacked kernels of kern_qrp.h are chosen by it) */
    /* The backend's batch_invariant option: a row's bits never depend on how the rows were
     * split into calls or batched. GATED_DELTA's one-sequence form runs row by row too, as the
     * slot form always does (a pipeline stage's replay then rebuilds its state exactly), and
     * BF16 matmuls at the AMX level stay on the tiles for every M (kern_bf16_matmul). */
    bool batch_invariant;
    kern_par par;
    kern_buf *att;      /* [n_threads] attention scores and row pointers */
    kern_buf vec;       /* F32 copy of a small weight vector (bias, norm weight) */
    kern_buf att_rows;  /* attention: the last position of each slot, then blocks and tasks */
    kern_buf att_parts; /* attention: the chunks' results of decode rows */
    kern_buf moe;       /* MoE routing and per-expert buffers */
    kern_buf qx;        /* kern_qmatmul: the quantized activation rows */
    kern_buf rec;       /* the recurrent ops: a call's rows by slot, SSM_CONV's kernel */
    /* ROPE cos/sin rows cached for the latest (theta, head_dim, positions): every layer's q
     * and k rotations of one run share them. */
    kern_buf rope_cs;  /* [T, head_dim] F32: cos of head_dim/2 angles, then their sin; F64 inv_freq */
    kern_buf rope_pos; /* [T] int32 */
    kern_buf rope_ff;  /* [head_dim/2] F32: the frequency factors of the table, if any */
    int64_t rope_t;
    uint32_t rope_d;
    float rope_theta;
    bool rope_has_ff;
    struct kern_qrp_shared *qrp; /* the repacked copies alive, by source (kern_prepare_qrp) */
} kern_ctx;

typedef struct kern_qrp_shared kern_qrp_shared;

/* Sets up c on the threads of par, with the kernels of the backend's isa option (NULL or "auto":
 * the best level of this CPU, at most $RLX_ISA; see plugin_isa_choose); plugin must outlive c.
 * Returns RLX_OK or a negative status after host->error (RLX_E_NOMEM, a bad isa); kern_deinit
 * is required afterwards either way. */
int kern_init(kern_ctx *c, const rlx_host *host, const char *plugin, const char *isa, kern_par par);
/* Frees what c allocated; a zeroed kern_ctx is a no-op. */
void kern_deinit(kern_ctx *c);

/* A backend's own keys of its option string: whether it took o (a key it knows, with a value in
 * range). self is the backend's kern_par.self. */
typedef bool (*kern_option_fn)(void *self, const rlx_iface_option *o);
/* kern_init as a backend's open() calls it, after the options every backend here reads alike:
 * opts->n_threads, when set, in place of par.n_threads (the backend's default), either capped
 * at max_threads, so that c->par.n_threads is the count to run; and the items of opts->extra,
 * isa=auto|avx512|avx2|c for kern_init, every other one through option, which must take it
 * ("<plugin>: unknown or out-of-range option '<item>'" if not). opts may be NULL. Returns RLX_OK
 * or a negative status after host->error; kern_deinit is required afterwards either way. */
int kern_open(kern_ctx *c, const rlx_host *host, const char *plugin, const rlx_backend_options *opts, int max_threads,
              kern_option_fn option, kern_par par);
/* A zeroed block of `bytes` (a backend instance), KERN_ALIGN aligned, or NULL after host->error. */
void *kern_zalloc(const rlx_host *host, const char *plugin, size_t bytes);

/* Makes b hold at least `bytes` (KERN_ALIGN aligned); the old contents are not kept. Returns
 * RLX_OK or RLX_E_NOMEM after host->error. */
int kern_reserve(const kern_ctx *c, kern_buf *b, size_t bytes);
/* An array of n_threads empty buffers, or NULL when out of memory (nothing reported). */
kern_buf *kern_bufs_create(const kern_ctx *c);
/* Frees the buffers of such an array and the array; NULL is a no-op. */
void kern_bufs_destroy(const kern_ctx *c, kern_buf *bufs);
/* kern_reserve on each of the n_threads buffers of an array. */
int kern_reserve_each(const kern_ctx *c, kern_buf *bufs, size_t bytes);
/* n rounded up to a multiple of KERN_ALIGN. */
size_t kern_align_up(size_t n);

/* What every prepared-weight handle (ABI 1.2 prepare_weight) of a backend on this library starts
 * with, so the library reads the handles it understands and a backend's release_weight tells
 * the kinds apart. */
typedef struct kern_weight {
    uint32_t kind;    /* KERN_WEIGHT_VEC, or a backend's own kind from KERN_WEIGHT_BACKEND on */
    const float *f32; /* KERN_WEIGHT_VEC: the F32 copy */
} kern_weight;

enum { KERN_WEIGHT_VEC = 1, KERN_WEIGHT_QRP = 2, KERN_WEIGHT_BF16 = 3, KERN_WEIGHT_BACKEND = 16 };

/* Whether input `input` of op is a small weight vector: an RMS_NORM weight or a MATMUL bias. */
bool kern_is_vec_input(uint32_t op, uint32_t input);
/* prepare_weight for a small weight vector stored as BF16 or F16: a KERN_WEIGHT_VEC with an F32
 * copy, so no call widens it again and a span can read several at once. F32 vectors and other
 * inputs are declined (*handle NULL). */
int kern_prepare_vec(const kern_ctx *c, const rlx_weight_info *w, void **handle);
/* Frees a KERN_WEIGHT_VEC handle. */
void kern_release_vec(const kern_ctx *c, void *handle);
/* The handle prepared for input k of node n, or NULL (none, or a core before ABI 1.2). */
const kern_weight *kern_prepared(const kern_ctx *c, const rlx_node_view *n, uint32_t k);
/* Input k of node n, a small weight vector, as F32: its prepared copy, the tensor itself when
 * it is F32, else a copy in c->vec (valid until the next call). */
int kern_vec(kern_ctx *c, const rlx_node_view *n, uint32_t k, const float **out);
/* Whether kern_vec of input k of n needs c->vec (it is neither F32 nor prepared): a span that
 * reads several vectors at once must not rely on that. */
bool kern_vec_needs_copy(const kern_ctx *c, const rlx_node_view *n, uint32_t k);

// ---------------------------------------------------------------------------------------------
// Repacked quantized weights (kern_qrp.h), as both backends prepare and multiply them

/* Source bytes packed between two drops of the source pages: small enough that the weight is
 * never resident twice, large enough that the madvise calls cost nothing. */
#define KERN_QRP_PIECE (8 << 20)

/* A repacked copy of a [N, K] weight: a KERN_WEIGHT_QRP handle for a quantized one, a
 * KERN_WEIGHT_BF16 handle (ops and q NULL) for the pair-interleaved copy of a BF16 one
 * (kern_bf16.h). */
typedef struct kern_qrp_weight {
    kern_weight base;
    const kern_qrp_ops *ops; /* the repacked kernels of the context's level for dt */
    const kern_qsimd *q;     /* the native kernels, for the N % 8 tail rows */
    int dt;
    int64_t N, K;
    void *data;      /* rlx_iface_tensor_bytes of it, KERN_ALIGN aligned */
    const void *src; /* the tensor it copies */
    int refs;        /* uses sharing it (kern_prepare_qrp) */
} kern_qrp_weight;

/* h as a repacked copy, or NULL when it is none (or NULL). */
static inline const kern_qrp_weight *kern_as_qrp(const kern_weight *h) {
    return h && h->kind == KERN_WEIGHT_QRP ? (const kern_qrp_weight *)h : NULL;
}
/* h as the copy of a BF16 weight, or NULL when it is none (or NULL). */
static inline const kern_qrp_weight *kern_as_bf16(const kern_weight *h) {
    return h && h->kind == KERN_WEIGHT_BF16 ? (const kern_qrp_weight *)h : NULL;
}

/* Lowers the resident size of a read-only mapping of a model file by the whole pages inside
 * [data, data + bytes): they hold nothing but file contents, so any later read (the EMBED rows
 * of a tied table, say) faults them back from the file. Only for such mappings. */
void kern_drop_pages(const void *data, size_t bytes);
/* Whether a weight use is a matmul's weight: a MATMUL's w or a MOE's expert weight (not its
 * router), 2-D. */
bool kern_matmul_weight_use(const rlx_weight_info *w);
/* Whether a weight use is one the repacked kernels serve: a matmul's weight of a type
 * kern_qrp_supported, whole blocks per row. */
bool kern_qrp_use(const rlx_weight_info *w);
/* prepare_weight for such a use: a KERN_WEIGHT_QRP handle, packed in pieces of KERN_QRP_PIECE
 * bytes, each piece's source pages dropped right after it when drop (the caller says so only
 * for RLX_WEIGHT_FILE_BACKED weights). Every use of one tensor gets the same handle (counted,
 * kern_release_qrp frees it with the last). RLX_OK, or RLX_E_NOMEM after host->error. */
int kern_prepare_qrp(const kern_ctx *c, const rlx_weight_info *w, bool drop, void **handle);
/* Frees a KERN_WEIGHT_QRP or KERN_WEIGHT_BF16 handle with its last use. */
void kern_release_qrp(const kern_ctx *c, void *handle);
/* The live repacked copy of tensor t, or NULL. EMBED reads the rows of a tied table from the
 * output MATMUL's copy: the table's mapped pages were dropped for it, and gathering rows from
 * them would fault them back (a table no matmul reads is never copied: its rows are few). */
const kern_qrp_weight *kern_qrp_find(const kern_ctx *c, const rlx_tensor *t);
/* Whether c's level (PLUGIN_ISA_AVX512_BF16 and up) multiplies the weight w on BF16 dot products
 * (kern_bf16.h): a 2-D BF16 one. */
bool kern_bf16_weight(const kern_ctx *c, const rlx_tensor *w);
/* Whether a weight use is one of those: a matmul's weight (the MOE router stays exact). */
bool kern_bf16_use(const kern_ctx *c, const rlx_weight_info *w);
/* prepare_weight for such a use: a KERN_WEIGHT_BF16 handle, made and shared as kern_prepare_qrp's
 * (pieces, dropped pages, one copy per tensor). */
int kern_prepare_bf16(const kern_ctx *c, const rlx_weight_info *w, bool drop, void **handle);
/* y[M, N] = x[M, K] w[N, K]^T (+ bias) with kern_bf16.h's arithmetic, on the kernel of c's level
 * (AMX tiles or AVX512-BF16), over the threads of c: copy is w's copy, or NULL to make one for
 * this call. RLX_OK or RLX_E_NOMEM after host->error. */
int kern_bf16_matmul(kern_ctx *c, const float *x, int64_t M, const rlx_tensor *w, const kern_qrp_weight *copy,
                     const float *bias, float *y);
/* The table of c->qrp, made by kern_init and freed by kern_deinit (kern_qrp.c keeps it). */
int kern_qrp_shared_init(kern_ctx *c);
void kern_qrp_shared_deinit(kern_ctx *c);
/* kern_qmatmul on a repacked weight: the same bits, for every M. */
int kern_qrp_matmul(kern_ctx *c, const float *x, int64_t M, const kern_qrp_weight *w, const float *bias, float *y);
/* kern_qmatmul_part on a repacked weight: features [n0, n0 + cnt) (n0 a multiple of
 * KERN_QRP_ROWS) of rows xq quantized by kern_q8_quantize, into y[m * ldy + r], plus bias[r]
 * unless NULL (bias and y start at feature n0); on any thread, the bits of kern_qrp_matmul. */
void kern_qrp_part(const kern_qrp_weight *w, const void *xq, size_t stride, int64_t M, int64_t n0, int64_t cnt,
                   const float *bias, float *y, int64_t ldy);

// ---------------------------------------------------------------------------------------------
// Matmul helpers: the parts of y[M, N] = x[M, K] w[N, K]^T (+ bias) every backend does alike

/* The bias of MATMUL node n as F32 (kern_vec), or NULL when n has none. */
int kern_op_bias(kern_ctx *c, const rlx_node_view *n, const float **bias);
/* Does a matmul that multiplies nothing: none when M or N is 0, y = bias (or 0) when K is 0.
 * Returns whether it did, i.e. whether the backend has nothing left to do. */
bool kern_matmul_trivial(int64_t M, int64_t K, int64_t N, const float *bias, float *y);
/* Weight rows of K values whose F32 widening fits tile_bytes, in whole KERN_ROW_ALIGN blocks
 * (at least one): the tile a thread widens and multiplies while it is in cache. */
int64_t kern_tile_rows(size_t tile_bytes, int64_t K);

// ---------------------------------------------------------------------------------------------
// Row ops over plain arrays (kern_rows.c)

/* y[t] = row ids[t] of table [V, cols] (dtype dt) as F32, for t < T; ids must be in range. A
 * block-quantized table (cols a whole number of blocks) is dequantized by rlx_iface_dequant_row. */
void kern_embed(kern_ctx *c, const void *table, int dt, int64_t cols, const int32_t *ids, int64_t T, float *y);
/* Each of `rows` rows of x[rows, cols] normalised in groups of g with F32 weights w[g]; y may be x. */
void kern_rms_norm(kern_ctx *c, const float *x, const float *w, float *y, int64_t rows, int64_t cols, int64_t g,
                   float eps);
/* NeoX RoPE of x[T, cols] (heads of head_dim values) at positions pos[T], each pair's angle
 * divided by factors[i] when factors (head_dim/2 values) is not NULL; y may be x. With
 * rope_dims (even, below head_dim; 0 = all) only the first rope_dims values of each head turn,
 * as a head of rope_dims would, and the rest pass unchanged. The cos/sin rows are cached in c
 * for the next call with the same positions, theta, turned values and factors. */
int kern_rope(kern_ctx *c, const float *x, const int32_t *pos, const float *factors, float *y, int64_t T, int64_t cols,
              uint32_t head_dim, uint32_t rope_dims, float theta);
/* y = silu(g) * u, and y = a + b, over n values; y may be either input. */
void kern_swiglu(kern_ctx *c, const float *g, const float *u, float *y, int64_t n);
void kern_add(kern_ctx *c, const float *a, const float *b, float *y, int64_t n);
/* xb[rows, cols] = x rounded to BF16, the activations of BF16 matmuls. */
void kern_to_bf16(kern_ctx *c, const float *x, uint16_t *xb, int64_t rows, int64_t cols);

/* Computes node n, one of EMBED, RMS_NORM, ROPE, SWIGLU, ADD, GATHER_LAST and GATHER_ROWS (1.4),
 * already checked by node_check. Returns RLX_OK or a status after host->error (an id outside the
 * table, a row index outside x, no memory). */
int kern_op_rows(kern_ctx *c, const rlx_node_view *n);

// ---------------------------------------------------------------------------------------------
// The ops of ABI 1.6 (kern_recurrent.c)
/* Rows per chunk of GATED_DELTA's chunk-parallel form, and the shortest one-sequence run that
 * takes it (the core's reference kernels choose the same way). */
#define KERN_GD_CHUNK 64
#define KERN_GD_CHUNK_MIN_ROWS 16
/* Computes node n, one of SSM_CONV, GATED_DELTA and SIGMOID_MUL (checked by node_check), as
 * rlx/backend_iface.h states them: the rows are checked whole before any state changes (a slot
 * outside the state: RLX_E_RANGE, a negative position: RLX_E_RANGE, a slot's rows not at
 * consecutive positions: RLX_E_INVALID); every (slot, head) of GATED_DELTA runs on one thread,
 * so the bits do not depend on the thread count. Returns RLX_OK or a status after host->error. */
int kern_op_recurrent(kern_ctx *c, const rlx_node_view *n);

// ---------------------------------------------------------------------------------------------
// Attention (kern_attention.c)

/* Keys per chunk of a query's visible range. Chunks start at multiples of this absolute
 * position, so where a chunk boundary falls does not depend on the batch. */
#define KERN_ATT_CHUNK 64
/* Queries per block: consecutive rows of one slot scored together against the same keys. */
#define KERN_ATT_TQ 16

/* One ATTENTION node after kern_att_begin: its rows checked, its k/v rows in the cache. */
typedef struct kern_att {
    const float *q;      /* [T, Hq*D] */
    const int32_t *pos;  /* [T] */
    const int32_t *seq;  /* [T] the slot of each row, or NULL: one sequence (slot 0) */
    const void *kc, *vc; /* [S, C, Hkv*D] of dtype dt */
    int dt;              /* RLX_DTYPE_F32, RLX_DTYPE_F16 or RLX_DTYPE_Q8_0 (D whole blocks) */
    float *out;          /* [T, Hq*D] */
    int64_t T, D, Hq, Hkv, C, window;
    float scale;
} kern_att;

/* Checks the rows of node n (an ATTENTION node that passed node_check, ABI 1.4 forms included):
 * every slot in [0, S) and position in [0, C) (else RLX_E_RANGE), each slot's rows at strictly
 * increasing positions (else RLX_E_INVALID); only then writes the k and v rows into the cache
 * (F16 caches: rounded to nearest even; Q8_0: rlx_iface_quant_q8_0) and describes the node in *a. Returns RLX_OK (with
 * a->T == 0 there is nothing to compute) or the status after host->error. */
int kern_att_begin(kern_ctx *c, const rlx_node_view *n, kern_att *a);
/* Computes every query of a, batch-invariantly: a query's output is the same bits whatever
 * the other rows of the call, T, and the thread count. Its visible keys are cut at multiples of
 * KERN_ATT_CHUNK; each chunk gives per query head a score maximum, a sum of exponentials and
 * an unnormalised output, folded into the query's running ones in chunk order, with one set
 * of kernels (kern_simd.h att_qk, softmax, att_pv) for every row. Rows go in blocks of up to
 * KERN_ATT_TQ consecutive rows of one slot: a task per (block, KV head), or for decode blocks
 * per (block, a few chunks) over every head (kern_attention.c). Returns RLX_OK or
 * RLX_E_UNSUPPORTED (more than 64 query heads per KV head) or RLX_E_NOMEM after host->error. */
int kern_att_run(kern_ctx *c, const kern_att *a);
/* kern_att_begin then kern_att_run. */
int kern_op_attention(kern_ctx *c, const rlx_node_view *n);

// ---------------------------------------------------------------------------------------------
// MoE (kern_moe.c)

/* The backend's matmul, for the router and the experts. */
typedef struct kern_matmul {
    /* y[M, N] = x[M, K] w[N, K]^T for a weight w of F32, BF16 or F16, with the handle the
     * backend prepared for it (or NULL). exact: the router, whose inputs must not be rounded
     * (rounding could flip an expert). Returns a status. */
    int (*run)(void *self, const float *x, int64_t M, const rlx_tensor *w, const kern_weight *prepared, float *y,
               bool exact);
    void *self;
    /* an expert's tokens above 8 are padded with zero rows to a multiple of this (1: never),
     * for backends whose matmuls are made per row count */
    int64_t row_pad;
} kern_matmul;

/* Top-k routing as the reference does it: for each of T tokens, the k of E logits [T, E] that
 * are largest (ties to the lower expert index), their experts in expert[T, k] and their
 * softmax probabilities, computed in double, in weight[T, k], renormalised to sum 1 when
 * norm_topk. */
void kern_moe_route(const float *logits, int64_t T, int64_t E, int64_t k, bool norm_topk, int64_t *expert,
                    float *weight);
/* Computes MOE node n (checked by node_check): routes every token, then runs each selected
 * expert once over all of its tokens with mm. Returns RLX_OK or a status after host->error. */
int kern_op_moe(kern_ctx *c, const rlx_node_view *n, const kern_matmul *mm);

#endif
