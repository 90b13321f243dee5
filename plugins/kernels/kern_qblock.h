/* Private to the quantized kernels (kern_quant.c, kern_qsimd.c): where a block keeps its parts,
 * and the one F32 order in which every level scales and sums the exact integer results of the
 * blocks of a row. Both files are compiled with -ffp-contract=off, so a * b + c stays two
 * roundings everywhere (no level fuses it), which is what makes the levels agree bitwise:
 *   32-value blocks  v_b = (dw_b * dx_b) * isum_b            Q4_0, Q5_0, Q8_0
 *                    v_b = (dw_b * dx_b) * isum_b + mw_b * sx_b   Q4_1, Q5_1
 *   K blocks         v_b = (dx_b * dw_b) * isum_b - (dx_b * dmin_b) * msum_b   Q4_K, Q5_K
 *                    v_b = (dx_b * dw_b) * isum_b                Q6_K
 * (isum_b: the block's integer dot product with its sub-block scales applied and the Q4_0 /
 * Q5_0 / Q6_K offsets taken off; msum_b: the K minimums times the activation sums), then
 * acc[b % 4] += v_b in block order and y = (acc[0] + acc[2]) + (acc[1] + acc[3]): four lanes,
 * the order of an SSE vector of four blocks. */
#ifndef RLX_PLUGINS_KERN_QBLOCK_H
#define RLX_PLUGINS_KERN_QBLOCK_H

#include <stdint.h>
#include <string.h>

#include "kern_quant.h"
#include "rlx/quant_iface.h"

/* Offsets in a block of its F16 scale d, its minimum m (_1 types), its fifth bits qh (Q5) and
 * its values qs, for the 32-value types. */
#define KQ_OFF_D 0
#define KQ_OFF_M 2
static inline int kern_qb_qh(int dt) { return dt == RLX_DTYPE_Q5_0 ? 2 : 4; }
static inline int kern_qb_qs(int dt) {
    switch (dt) {
    case RLX_DTYPE_Q4_0:
    case RLX_DTYPE_Q8_0:
        return 2;
    case RLX_DTYPE_Q4_1:
        return 4;
    case RLX_DTYPE_Q5_0:
        return 6;
    default: /* Q5_1 */
        return 8;
    }
}
/* Whether the 32-value type has a minimum (Q4_1, Q5_1), and the offset its stored values carry
 * otherwise (8 for Q4_0, 16 for Q5_0, none for Q8_0). */
static inline int kern_qb_has_min(int dt) { return dt == RLX_DTYPE_Q4_1 || dt == RLX_DTYPE_Q5_1; }
static inline int kern_qb_offset(int dt) { return dt == RLX_DTYPE_Q4_0 ? 8 : dt == RLX_DTYPE_Q5_0 ? 16 : 0; }

static inline uint16_t kern_qb_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The F32 value of block b's result, added to its lane (the order the header states). */
static inline void kern_qb_add32(float acc[4], int64_t b, float dw, float dx, int32_t isum, float mw, float sx,
                                 int has_min) {
    float v = (dw * dx) * (float)isum;
    if (has_min)
        v = v + mw * sx;
    acc[b & 3] += v;
}

static inline float kern_qb_valuek(float dx, float dw, int32_t isum, float dmin, int32_t msum, int has_min) {
    float v = (dx * dw) * (float)isum;
    if (has_min)
        v = v - (dx * dmin) * (float)msum;
    return v;
}

/* Whether the AVX-512 level runs its VNNI kernels: a run-time choice inside the level (no level
 * of its own), made alike for the native and the repacked kernels (kern_quant.h). */
bool kern_quant_vnni(void);

static inline float kern_qb_total(const float acc[4]) { return (acc[0] + acc[2]) + (acc[1] + acc[3]); }

#endif
