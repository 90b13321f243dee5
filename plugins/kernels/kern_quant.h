/* Matmuls on block-quantized weights (ABI 1.3, rlx/quant_iface.h) in the CPU kernel library:
 * y[M, N] = x[M, K] dequant(w)[N, K]^T the way llama.cpp computes it, so that rlx's results
 * track llama.cpp's on the same GGUF files (RLX_PRECISION_Q8_ACT):
 *   - each activation row is quantized once per call to int8 blocks (kern_q8_quantize_row;
 *     one row layout for all five 32-value types, so a span quantizes once per block length):
 *     blocks of 32 for the weight types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (llama.cpp's Q8_0 and, for
 *     the _1 types, Q8_1 with its scaled sum), blocks of 256 for Q4_K, Q5_K, Q6_K (Q8_K);
 *   - every block's integer dot product with a weight row is exact, the same integer at every
 *     ISA level;
 *   - the block results are scaled and summed in F32 in one fixed order (kern_qblock.h), the
 *     same at every level, so all levels give the same bits.
 * The 32-value rule is the one llama.cpp's x86 build runs (its AVX2/AVX quantize_row_q8_0 and
 * _q8_1, not the portable reference): d = amax / 127 kept as F16, q = x * (127 / amax) rounded
 * to nearest even; Q8_1 adds s = F16(d * sum q). Q8_K is quantize_row_q8_K_ref's rule: the
 * value of largest magnitude (the first one on ties) gives iscale = -127 / max, q =
 * nearest_int(iscale * x) at most 127, d = 1 / iscale (an F32), bsums the sums of each 16 q.
 *
 * The bits are llama.cpp's for the quantized activations; the F32 scaling and summation order
 * of the blocks is rlx's own (llama.cpp's differs per ISA), so outputs agree with llama.cpp's
 * to F32 rounding, not bit for bit.
 *
 * Levels: portable C (scalar integer sums), AVX2 (maddubs/madd), AVX-512 (the AVX2 kernels on
 * EVEX with 32 registers, and with AVX512-VNNI vpdpbusd for the 32-value types where the CPU has
 * it, a run-time choice inside the avx512 level, not a level of its own; the environment
 * variable RLX_QUANT_VNNI=0 turns VNNI off, for testing the plain AVX-512 path on a VNNI
 * machine). */
#ifndef RLX_PLUGINS_KERN_QUANT_H
#define RLX_PLUGINS_KERN_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "isa.h"
#include "rlx/backend_iface.h"

/* Activation rows one quantized GEMV call handles: each weight row is read once per group. */
#define KERN_QGEMV_MAX_M 4

/* An activation row of K values quantized for a weight dtype, as laid out in a kern_q8 row
 * buffer (kern_q8_row_bytes per row): qs[K] int8, then per block of 32 (256 for the K types)
 * d[nb] F32, then for 32-value blocks s[nb] F32 (d * sum q as F16, used by Q4_1 and Q5_1) and
 * sum[nb] int16 (sum q, the offsets of Q4_0 and Q5_0), for the K types bsums[K / 16] int16. The
 * F16 scales of llama.cpp's blocks are kept widened, the same values. */
typedef struct kern_q8_row {
    const int8_t *qs;
    const float *d;
    const float *s;      /* 32-value blocks only */
    const int16_t *sums; /* 32-value blocks: per block; K types: per 16 values (bsums) */
} kern_q8_row;

/* Whether kern_qmatmul takes weights of dtype dt (the eight quantized types). */
bool kern_quant_supported(int dt);
/* Bytes of one quantized activation row of K values for weights of dtype dt (a multiple of 64;
 * 0 when K is not a whole number of blocks). */
size_t kern_q8_row_bytes(int dt, int64_t K);
/* Quantizes x[K] for weights of dtype dt into dst (kern_q8_row_bytes of it): the portable C
 * quantizer, whose bytes every level's kern_qsimd.quantize gives too (max, products, rounding
 * to nearest even and F16 conversions are exact operations, whatever the vector width). */
void kern_q8_quantize_row(int dt, const float *x, int64_t K, void *dst);
/* The parts of a row made by kern_q8_quantize_row. */
kern_q8_row kern_q8_view(int dt, const void *row, int64_t K);

/* y[m * ldy + n] = w[n] . x[m] for m < M (the kern_qgemv table index is M - 1) and n in
 * [n0, n1): w rows are rlx_iface_row_bytes(dt, K) apart, x rows (quantized) x_stride bytes. */
typedef void (*kern_qgemv_fn)(const void *w, int64_t K, const void *x, size_t x_stride, int64_t n0, int64_t n1,
                              float *y, int64_t ldy);

typedef struct kern_qsimd {
    const char *isa;                                                /* "c", "avx2", "avx512", "avx512-vnni" */
    kern_qgemv_fn gemv[RLX_DTYPE_COUNT][KERN_QGEMV_MAX_M];          /* NULL for unquantized dtypes */
    void (*quantize)(int dt, const float *x, int64_t K, void *dst); /* kern_q8_quantize_row's bytes */
} kern_qsimd;

/* The quantized kernels of level isa: for PLUGIN_ISA_AVX512, the VNNI ones when the CPU has
 * AVX512-VNNI and RLX_QUANT_VNNI is not 0. */
const kern_qsimd *kern_qsimd_at(plugin_isa isa);

struct kern_ctx;
struct kern_buf;
/* y[M, N] = x[M, K] dequant(w)[N, K]^T (+ bias[N] unless NULL) for w of a quantized dtype dt
 * with K a whole number of its blocks: x's rows are quantized once into c->qx (in parallel),
 * then the N output features are split over c->par, each range reading its weight rows once per
 * KERN_QGEMV_MAX_M rows of x. Any split gives the same bits. Returns RLX_OK, RLX_E_SHAPE (K is
 * not whole blocks) or RLX_E_NOMEM after host->error. */
int kern_qmatmul(struct kern_ctx *c, const float *x, int64_t M, int64_t K, const void *w, int dt, int64_t N,
                 const float *bias, float *y);

/* The two steps of kern_qmatmul, for backends that run the second inside jobs of their own
 * (cpu-blas's spans): the M rows of x quantized for dt into buf (parallel over c->par), rows
 * *stride bytes apart; then, on any thread, the output features [0, cnt) of a part of the
 * weight whose first row is w (and bias its first value, or NULL): y[m * ldy + r]. A part
 * gives the same bits as kern_qmatmul does for those features. */
int kern_q8_quantize(struct kern_ctx *c, int dt, const float *x, int64_t M, int64_t K, struct kern_buf *buf,
                     size_t *stride);
void kern_qmatmul_part(const kern_qsimd *q, int dt, const void *xq, size_t stride, int64_t M, int64_t K, const void *w,
                       int64_t cnt, const float *bias, float *y, int64_t ldy);

#endif
