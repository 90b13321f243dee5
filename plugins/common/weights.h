/* Scalar access to weight elements, shared by the in-tree backend plugins: weights come in
 * F32, BF16 or F16 as stored, and every kernel that reads one element at a time (norm
 * weights, biases, scalar tails of the SIMD kernels) widens it the same exact way. */
#ifndef RLX_PLUGINS_WEIGHTS_H
#define RLX_PLUGINS_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rlx/graph.h"

static inline float weight_bf16_to_f32(uint16_t h)
{
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float weight_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (ex == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (ex == 0) {
        const float f = (float)man * 0x1p-24f; /* zero or subnormal: exact in F32 */
        return sign ? -f : f;
    } else {
        bits = sign | ((ex + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Element i of a weight array of dtype dt (F32, BF16 or F16) as F32. */
static inline float weight_scalar(int dt, const void *w, int64_t i)
{
    switch (dt) {
    case RLX_DTYPE_BF16:
        return weight_bf16_to_f32(((const uint16_t *)w)[i]);
    case RLX_DTYPE_F16:
        return weight_f16_to_f32(((const uint16_t *)w)[i]);
    default:
        return ((const float *)w)[i];
    }
}

static inline size_t weight_dtype_size(uint32_t dt)
{
    return dt == RLX_DTYPE_BF16 || dt == RLX_DTYPE_F16 ? 2 : 4;
}

#endif
