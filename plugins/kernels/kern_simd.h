/* The SIMD kernels of the CPU kernel library, one table per instruction-set level (portable C,
 * AVX2 + FMA + F16C, AVX-512 F/BW/VL), all compiled from one ISA-generic source
 * (kern_simd.inc) over a small vector macro layer (kern_simd.c). A backend picks a table once,
 * with plugin_isa_choose (plugins/common/isa.h), and calls its members on rows and ranges: they
 * are plain functions, single-threaded, with no state, safe to call from any thread.
 * Weight dtypes are RLX_DTYPE_F32, RLX_DTYPE_BF16 and RLX_DTYPE_F16 (the [3] dimensions). */
#ifndef RLX_PLUGINS_KERN_SIMD_H
#define RLX_PLUGINS_KERN_SIMD_H

#include <stdint.h>

#include "isa.h"
#include "rlx/quant_iface.h"

/* Activation rows one GEMV kernel call handles; more rows are done in blocks of this many. */
#define KERN_GEMV_MAX_M 8

/* y[m * ldy + n] = x[m * ldx] . w[n] (K values each) for the M rows of x and n in [n0, n1). */
typedef void (*kern_gemv_fn)(const float *x, int64_t ldx, const void *w, int64_t k, int64_t n0, int64_t n1, float *y,
                             int64_t ldy);

typedef struct kern_simd {
    const char *isa; /* plugin_isa_name of the level */
    /* dst[0..n) = src[0..n) of dtype dt as F32 */
    void (*widen)(int dt, const void *src, float *dst, int64_t n);
    /* dst[0..n) = src[0..n) rounded to BF16 (nearest even, NaN stays NaN) */
    void (*to_bf16)(const float *src, uint16_t *dst, int64_t n);
    /* Two small-M GEMV designs, [weight dtype][M - 1]. block: a few weight rows at a time in
     * register blocks, the next block prefetched into L2 (cpu-blas, whose pool threads claim
     * chunks dynamically). stream: one weight row after the other, a single sequential stream
     * with a fixed prefetch distance (onednn, whose OpenMP threads each own a contiguous share). */
    kern_gemv_fn gemv_block[3][KERN_GEMV_MAX_M];
    kern_gemv_fn gemv_stream[3][KERN_GEMV_MAX_M];
    /* y[m * ldy + n] = x[m * ldx] . w[n] for m < M and n in [n0, n1), w F32 rows K apart: the
     * bits gemv_block gives each row alone, for any M, at matrix speed (register-blocked over
     * several rows of x and of w) */
    void (*gemm_f32)(const float *x, int64_t ldx, int64_t M, const float *w, int64_t K, int64_t n0, int64_t n1,
                     float *y, int64_t ldy);
    /* one row of n values normalised in groups of g with the g F32 weights w; y may be x */
    void (*rms_norm)(const float *x, const float *w, float *y, int64_t n, int64_t g, float eps);
    /* NeoX rotate-half of n_heads heads of 2 * half values by the cos/sin row cs; y may be x */
    void (*rope)(const float *x, const float *cs, float *y, int64_t n_heads, int64_t half);
    void (*swiglu)(const float *g, const float *u, float *y, int64_t n); /* y = silu(g) * u */
    void (*add)(const float *a, const float *b, float *y, int64_t n);    /* y = a + b */
    void (*axpy)(float a, const float *x, float *y, int64_t n);          /* y += a * x */
    void (*scal)(float a, float *y, int64_t n);                          /* y *= a */
    float (*dot)(const float *a, const float *b, int64_t n);
    /* Unnormalised softmax of s[lo..hi) in place, the rest of s[0..n) zeroed; returns the sum
     * of the exponentials and stores the maximum in *max_out unless it is NULL. */
    float (*softmax)(float *s, int64_t n, int64_t lo, int64_t hi, float *max_out);
    /* dst[0..n) = src[0..n) as F16, rounded to nearest even (infinity past 65504) */
    void (*to_f16)(const float *src, uint16_t *dst, int64_t n);
    /* Attention, each score and output row one fixed sum whatever else the call computes
     * (kern_simd.inc), so a query's bits do not depend on the batch. Keys and values are rows
     * ldk (ldv) values apart, of dtype dt: RLX_DTYPE_F32, RLX_DTYPE_F16 or RLX_DTYPE_Q8_0 (then
     * k and v start at a block, and D and ldk are whole blocks: values read as d * q).
     * s[r * lds + j] = scale * q[r] . k[j] for r < rows, j < nk; prefetches the values v of the
     * same keys for att_pv. */
    void (*att_qk)(int dt, const float *const *q, int64_t rows, const void *k, const void *v, int64_t ldk, int64_t nk,
                   int64_t D, float scale, float *s, int64_t lds);
    /* o[r][0..D) += sum_{j < nk} p[r * ldp + j] v[j] for r < rows, in key order (keys cut into
     * several calls give the same bits as one call) */
    void (*att_pv)(int dt, const float *p, int64_t ldp, int64_t rows, const void *v, int64_t ldv, int64_t nk, int64_t D,
                   float *const *o);
    /* The recurrent ops' pieces (kern_recurrent.inc, used by kern_recurrent.c). */
    /* Y[m][n] += alpha * A[m][kd] B[kd][n], row-major with leading dimensions lda, ldb, ldy;
     * each sum runs over kd in order */
    void (*mm_acc)(int64_t m, int64_t n, int64_t kd, const float *A, int64_t lda, const float *B, int64_t ldb, float *Y,
                   int64_t ldy, float alpha);
    /* one row of the gated delta rule for one head: S = g S; S += k (beta (v - S^T k))^T;
     * o = S^T q, S [dk][dv] row-major, k and q normalised */
    void (*gd_step)(float *S, int64_t dk, int64_t dv, float g, const float *k, const float *q, const float *v,
                    float beta, float *o);
    /* one SSM_CONV row over n channels: y = silu(sum_j w[j] u[j]), u[j] = state row j (ldu apart)
     * for j < K-1 and x for j = K-1, w the kernel as [K][ldw] */
    void (*conv_row)(const float *w, int64_t ldw, const float *u, int64_t ldu, const float *x, float *y, int64_t n,
                     int64_t K);
    void (*sigmoid_mul)(const float *x, const float *g, float *y, int64_t n); /* y = x * sigmoid(g) */
} kern_simd;

/* Bytes of n consecutive values of a KV cache of dtype dt (F32, F16, or Q8_0 with n a whole
 * number of blocks), as the attention kernels step through a cache. */
static inline int64_t kern_kv_bytes(int dt, int64_t n) {
    return dt == RLX_DTYPE_Q8_0 ? n / RLX_QK * (int64_t)sizeof(rlx_block_q8_0) : n * (dt == RLX_DTYPE_F16 ? 2 : 4);
}

/* Value i of a KV cache of dtype dt (F32, F16 or Q8_0) as F32: the stored value exactly. */
static inline float kern_kv_load1(int dt, const void *c, int64_t i) {
    if (dt == RLX_DTYPE_Q8_0) {
        const rlx_block_q8_0 *b = (const rlx_block_q8_0 *)c + i / RLX_QK;
        return (float)b->qs[i % RLX_QK] * rlx_iface_f16_to_f32(b->d);
    }
    return rlx_iface_load_f32((uint32_t)dt, c, i);
}

/* The table of level isa; never NULL for a level below PLUGIN_ISA_COUNT. */
const kern_simd *kern_simd_at(plugin_isa isa);

#endif
