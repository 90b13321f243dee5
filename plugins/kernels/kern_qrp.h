/* Row-interleaved ("repacked") block-quantized weights: the layout a backend makes once per
 * weight at prepare_weight, and the matmul kernels that read it for every M, decode and prefill
 * alike.
 *
 * Why: the native GGUF layout keeps each weight row's blocks together, so a kernel reduces one
 * row at a time and pays its F32 scaling and horizontal sums per row and block. Interleaving
 * KERN_QRP_ROWS rows block by block puts one row per vector lane: one activation block is loaded
 * and broadcast once for all the rows of a group, the integer products of the rows land in the
 * lanes of one vector, and the scaling of kern_qblock.h runs once per block for all of them.
 * Prefill kernels reuse each unpacked weight block over several activation rows.
 *
 * Layout of an [N, K] weight of dtype dt (nb = K / block values, bb = block bytes):
 *   - rows in groups of KERN_QRP_ROWS; group g (rows 8g .. 8g + 7) occupies the bytes
 *     [g * nb * 8 * bb, (g + 1) * nb * 8 * bb): for each block index b in order, one
 *     "interleaved block" of exactly 8 * bb bytes holding block b of the 8 rows, arranged as the
 *     type's kernels want it (kern_qrp_pack defines it for each type);
 *   - the rows after the last whole group (N % 8 of them) follow in the native layout.
 * So the repacked weight has exactly the native size, rlx_iface_tensor_bytes, and replaces the
 * mapped pages it was made from (the memory limit counts the file once).
 *
 * Results: every kernel gives, bit for bit, what kern_qmatmul gives on the native weight: the
 * same exact integer block sums and the same F32 order (kern_qblock.h: lane b % 4 of each row,
 * then (acc0 + acc2) + (acc1 + acc3)), whatever M, the level, or the split into groups. So a
 * row's output does not depend on how many rows are in the batch. */
#ifndef RLX_PLUGINS_KERN_QRP_H
#define RLX_PLUGINS_KERN_QRP_H

#include <stddef.h>
#include <stdint.h>

#include "isa.h"

/* Weight rows interleaved in one group. */
#define KERN_QRP_ROWS 8

/* y[m * ldy + n] = w[n] . x[m] for m < M (any M >= 1) and the rows n of groups [g0, g1) (n from
 * 8 * g0 to 8 * g1 - 1): wp is the whole repacked weight of K columns, x holds M activation rows
 * quantized for dt (kern_q8_quantize_row) x_stride bytes apart. */
typedef void (*kern_qrp_matmul_fn)(const void *wp, int64_t K, const void *x, size_t x_stride, int64_t M, int64_t g0,
                                   int64_t g1, float *y, int64_t ldy);

typedef struct kern_qrp_ops {
    const char *isa; /* the level that runs: "c", "avx2", "avx512", "avx512-vnni", "amx" */
    kern_qrp_matmul_fn matmul;
} kern_qrp_ops;

/* The repacked kernels of level isa for weights of dtype dt, or NULL when dt has no repacked
 * form (the caller keeps the native layout and kern_qmatmul). */
const kern_qrp_ops *kern_qrp_ops_at(plugin_isa isa, int dt);

/* Whether dt has a repacked form (at every level: the C level has every type the others have). */
int kern_qrp_supported(int dt);

/* Writes groups [g0, g1) of the native weight w ([N, K] of dtype dt) into their place in the
 * repacked buffer dst (the whole weight's buffer); the same bytes whoever calls it, so a weight
 * can be repacked in pieces, each piece's source pages released right after. The native tail rows
 * are copied by the caller. */
void kern_qrp_pack(int dt, const void *w, int64_t K, int64_t g0, int64_t g1, void *dst);

/* Writes native block b of row n (one of the whole groups) of the repacked weight wp ([N, K] of
 * dtype dt) into blk (rlx_iface_dtype_block_bytes of it): the bytes the native weight had, so
 * rows are read back from the copy (EMBED of a table whose copy replaced the mapped pages). */
void kern_qrp_unpack(int dt, const void *wp, int64_t K, int64_t n, int64_t b, void *blk);

/* Per family of types, the parts kern_qrp_ops_at, kern_qrp_supported, kern_qrp_pack and
 * kern_qrp_unpack dispatch to: the 32-value types (kern_qrp32.c) and the K types (kern_qrpk.c).
 * Each returns NULL / 0 for a type that is not its own. */
const kern_qrp_ops *kern_qrp32_ops_at(plugin_isa isa, int dt);
int kern_qrp32_pack(int dt, const void *w, int64_t K, int64_t g0, int64_t g1, void *dst);
int kern_qrp32_unpack(int dt, const void *wp, int64_t K, int64_t n, int64_t b, void *blk);
const kern_qrp_ops *kern_qrpk_ops_at(plugin_isa isa, int dt);
int kern_qrpk_pack(int dt, const void *w, int64_t K, int64_t g0, int64_t g1, void *dst);
int kern_qrpk_unpack(int dt, const void *wp, int64_t K, int64_t n, int64_t b, void *blk);

#endif
