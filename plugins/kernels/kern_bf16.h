/* BF16 matmuls on the CPU's BF16 dot products: the PLUGIN_ISA_AVX512_BF16 and PLUGIN_ISA_AMX
 * levels of the kernel library.
 *
 * Why: OpenBLAS multiplies F32, so BF16 weights had to be widened into F32 tiles for it, and
 * prefill ran at the CPU's F32 FMA rate. VDPBF16PS (AVX512-BF16: AMD Zen 4 and 5) multiplies
 * pairs of BF16 values into F32 sums, twice the multiply-adds per instruction of an F32 FMA;
 * an AMX TDPBF16PS (Intel Xeon from Sapphire Rapids on) multiplies a 16 x 32 BF16 tile by a
 * 32 x 16 one into 16 x 16 F32 sums, several times the FMA rate.
 *
 * Arithmetic (RLX_PRECISION_BF16_ACT): the activations x are rounded to BF16 (nearest even), each
 * product of two BF16 values is exact in F32, and the products of one output are summed in F32
 * pair by pair in the order of k; the hardware flushes denormal inputs and results to zero
 * (values below 2^-126, far under the error bound). A row's sums never involve another row of
 * x, and the k loop is the same for every block of rows and features, so with one kernel an
 * output row's bits do not depend on M, on where the row sits in the batch, or on how the output
 * features are cut among threads. The two kernels round their pair sums in different orders, so
 * their bits differ: the AMX level runs up to 4 rows on VDPBF16PS, faster for decode, unless the
 * backend asks for batch invariance (kern_ctx.batch_invariant, rlx serve's), when every M stays on
 * the tiles and decode and prefill of the same tokens agree bit for bit.
 *
 * Layout of the copy of a BF16 weight w [N, K] (made once, at prepare_weight), which both levels
 * read: K padded with zeros to Kp, a multiple of KERN_BF16_K, and N to whole groups of
 * KERN_BF16_ROWS rows (zero rows); group g holds Kp / 32 tiles in order of k, each 16 rows of 64
 * bytes in the pair-interleaved ("VNNI") form AMX loads: tile row i, column pair c = (w[16g +
 * c][32q + 2i], w[16g + c][32q + 2i + 1]). So pair p of k (values 2p and 2p + 1) of the group's
 * 16 weight rows is one 64-byte line, group g's lines following each other in order of p: AMX
 * loads 16 of them as a tile, VDPBF16PS one as a vector of 16 outputs. */
#ifndef RLX_PLUGINS_KERN_BF16_H
#define RLX_PLUGINS_KERN_BF16_H

#include <stddef.h>
#include <stdint.h>

/* Weight rows per group (the columns of one result tile or vector). */
#define KERN_BF16_ROWS 16
/* BF16 values of k per tile row. */
#define KERN_BF16_K 32

/* K rounded up to a whole tile row. */
static inline int64_t kern_bf16_kp(int64_t K) { return (K + KERN_BF16_K - 1) / KERN_BF16_K * KERN_BF16_K; }
/* Groups of a weight of N rows. */
static inline int64_t kern_bf16_groups(int64_t N) { return (N + KERN_BF16_ROWS - 1) / KERN_BF16_ROWS; }
/* Bytes of the copy of a [N, K] BF16 weight. */
static inline size_t kern_bf16_bytes(int64_t N, int64_t K) {
    return (size_t)kern_bf16_groups(N) * KERN_BF16_ROWS * (size_t)kern_bf16_kp(K) * sizeof(uint16_t);
}

/* Writes groups [g0, g1) of w ([N, K] BF16 rows) into their place in dst (the whole copy, of
 * kern_bf16_bytes); the same bytes whoever calls it, so a weight is packed in pieces. */
void kern_bf16_pack(const uint16_t *w, int64_t N, int64_t K, int64_t g0, int64_t g1, uint16_t *dst);

/* y[m * ldy + n] = x[m] . w[n] for m < M and n in [n0, n1), n0 a multiple of KERN_BF16_ROWS and
 * n1 <= N: copy is the copy of w ([N, K]), xb holds the M rows of x rounded to BF16, Kp values
 * apart, zero from K to Kp, followed by zero rows up to a multiple of 16. Single-threaded; each
 * only on a CPU with its level (plugin_isa_best()), AMX's in a process granted the tile state. */
typedef void (*kern_bf16_part_fn)(const uint16_t *copy, int64_t K, const uint16_t *xb, int64_t M, int64_t n0,
                                  int64_t n1, float *y, int64_t ldy);
void kern_bf16_part_amx(const uint16_t *copy, int64_t K, const uint16_t *xb, int64_t M, int64_t n0, int64_t n1,
                        float *y, int64_t ldy);
void kern_bf16_part_dp(const uint16_t *copy, int64_t K, const uint16_t *xb, int64_t M, int64_t n0, int64_t n1, float *y,
                       int64_t ldy);

#endif
