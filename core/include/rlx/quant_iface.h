/* The block-quantized weight types (ABI 1.3) as the GGUF format lays them out, byte for byte, so
 * that a tensor of a llama.cpp file is used where it is mapped. Each block holds the values of 32
 * or 256 consecutive elements of a row; the structs below are packed to the file's layout (their
 * sizes are those of rlx_iface_dtype_block_bytes). F16 fields are IEEE binary16 bits.
 *
 * A value decodes as follows, q being the stored integer:
 *   Q4_0  d * (q - 8)          q: 4 bits; element j < 16 in the low nibble of qs[j], element
 *                              j + 16 in its high nibble
 *   Q4_1  d * q + m            as Q4_0
 *   Q5_0  d * (q - 16)         q: 5 bits; the 4 low bits as Q4_0, the fifth of element j in bit j
 *                              of qh (a little-endian 32-bit word)
 *   Q5_1  d * q + m            as Q5_0
 *   Q8_0  d * q                q: int8
 *   Q4_K  d * sc_s * q - dmin * m_s   8 sub-blocks s of 32; sc_s and m_s: 6 bits, packed in
 *                              scales[12] (rlx_iface_q4k_scale); 64 elements per 32 bytes of qs,
 *                              the first 32 in the low nibbles, the next 32 in the high ones
 *   Q5_K  as Q4_K, with a fifth bit per element in qh: element 64i + l (l < 32) in bit 2i of
 *                              qh[l], element 64i + 32 + l in bit 2i + 1
 *   Q6_K  d * sc_s * (q - 32)  16 sub-blocks of 16 with int8 scales; q: 6 bits, the low 4 in ql,
 *                              the high 2 in qh, in groups of 128 elements (see the code)
 * The dequantizers compute in F32 in the order written here, as llama.cpp's reference
 * dequantizers do, so both give the same bits. */
#ifndef RLX_QUANT_IFACE_H
#define RLX_QUANT_IFACE_H

#include <stdint.h>
#include <string.h>

#include "rlx/backend_iface.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RLX_QK 32    /* values per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 */
#define RLX_QK_K 256 /* values per block of the K types */

typedef struct rlx_block_q4_0 {
    uint16_t d;
    uint8_t qs[RLX_QK / 2];
} rlx_block_q4_0;

typedef struct rlx_block_q4_1 {
    uint16_t d, m;
    uint8_t qs[RLX_QK / 2];
} rlx_block_q4_1;

typedef struct rlx_block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[RLX_QK / 2];
} rlx_block_q5_0;

typedef struct rlx_block_q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[RLX_QK / 2];
} rlx_block_q5_1;

typedef struct rlx_block_q8_0 {
    uint16_t d;
    int8_t qs[RLX_QK];
} rlx_block_q8_0;

typedef struct rlx_block_q4_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[RLX_QK_K / 2];
} rlx_block_q4_k;

typedef struct rlx_block_q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[RLX_QK_K / 8];
    uint8_t qs[RLX_QK_K / 2];
} rlx_block_q5_k;

typedef struct rlx_block_q6_k {
    uint8_t ql[RLX_QK_K / 2];
    uint8_t qh[RLX_QK_K / 4];
    int8_t scales[RLX_QK_K / 16];
    uint16_t d;
} rlx_block_q6_k;

/* The layouts are the file's: no padding anywhere (every struct is uint16/uint8 aligned). */
_Static_assert(sizeof(rlx_block_q4_0) == 18, "Q4_0 block layout");
_Static_assert(sizeof(rlx_block_q4_1) == 20, "Q4_1 block layout");
_Static_assert(sizeof(rlx_block_q5_0) == 22, "Q5_0 block layout");
_Static_assert(sizeof(rlx_block_q5_1) == 24, "Q5_1 block layout");
_Static_assert(sizeof(rlx_block_q8_0) == 34, "Q8_0 block layout");
_Static_assert(sizeof(rlx_block_q4_k) == 144, "Q4_K block layout");
_Static_assert(sizeof(rlx_block_q5_k) == 176, "Q5_K block layout");
_Static_assert(sizeof(rlx_block_q6_k) == 210, "Q6_K block layout");

/* Scale and minimum (6 bits each) of sub-block s (0..7) of a Q4_K or Q5_K block: sub-blocks 0-3
 * keep theirs in the low 6 bits of scales[s] and scales[s + 4]; 4-7 in the nibbles of
 * scales[s + 4] with their top 2 bits in the spare top bits of scales[s - 4] and scales[s]. */
static inline void rlx_iface_q4k_scale(const uint8_t scales[12], int s, uint8_t *sc, uint8_t *m) {
    if (s < 4) {
        *sc = scales[s] & 63;
        *m = scales[s + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[s + 4] & 0xF) | ((scales[s - 4] >> 6) << 4));
        *m = (uint8_t)((scales[s + 4] >> 4) | ((scales[s] >> 6) << 4));
    }
}

static inline void rlx_iface_dequant_q4_0(const rlx_block_q4_0 *b, float *y) {
    const float d = rlx_iface_f16_to_f32(b->d);
    for (int j = 0; j < RLX_QK / 2; j++) {
        y[j] = (float)((b->qs[j] & 0xF) - 8) * d;
        y[j + RLX_QK / 2] = (float)((b->qs[j] >> 4) - 8) * d;
    }
}

static inline void rlx_iface_dequant_q4_1(const rlx_block_q4_1 *b, float *y) {
    const float d = rlx_iface_f16_to_f32(b->d), m = rlx_iface_f16_to_f32(b->m);
    for (int j = 0; j < RLX_QK / 2; j++) {
        y[j] = (float)(b->qs[j] & 0xF) * d + m;
        y[j + RLX_QK / 2] = (float)(b->qs[j] >> 4) * d + m;
    }
}

static inline uint32_t rlx_iface_q5_high_bits(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static inline void rlx_iface_dequant_q5_0(const rlx_block_q5_0 *b, float *y) {
    const float d = rlx_iface_f16_to_f32(b->d);
    const uint32_t qh = rlx_iface_q5_high_bits(b->qh);
    for (int j = 0; j < RLX_QK / 2; j++) {
        const int lo = (int)((b->qs[j] & 0xF) | (((qh >> j) & 1u) << 4));
        const int hi = (int)((b->qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
        y[j] = (float)(lo - 16) * d;
        y[j + RLX_QK / 2] = (float)(hi - 16) * d;
    }
}

static inline void rlx_iface_dequant_q5_1(const rlx_block_q5_1 *b, float *y) {
    const float d = rlx_iface_f16_to_f32(b->d), m = rlx_iface_f16_to_f32(b->m);
    const uint32_t qh = rlx_iface_q5_high_bits(b->qh);
    for (int j = 0; j < RLX_QK / 2; j++) {
        const int lo = (int)((b->qs[j] & 0xF) | (((qh >> j) & 1u) << 4));
        const int hi = (int)((b->qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
        y[j] = (float)lo * d + m;
        y[j + RLX_QK / 2] = (float)hi * d + m;
    }
}

static inline void rlx_iface_dequant_q8_0(const rlx_block_q8_0 *b, float *y) {
    const float d = rlx_iface_f16_to_f32(b->d);
    for (int j = 0; j < RLX_QK; j++)
        y[j] = (float)b->qs[j] * d;
}

/* Quantizes x[32] into b as KV caches store Q8_0 rows (ABI 1.8), llama.cpp's x86 rule: d = amax / 127
 * kept as F16, q = x * (127 / amax) rounded to nearest even. A block of zeros has d = 0; a value
 * that is not finite (an overflowed activation) saturates to +-127 or, NaN, to 0, never an
 * undefined conversion. */
static inline void rlx_iface_quant_q8_0(const float *x, rlx_block_q8_0 *b) {
    float amax = 0.0f;
    for (int j = 0; j < RLX_QK; j++) {
        const float a = x[j] < 0.0f ? -x[j] : x[j];
        amax = a > amax ? a : amax;
    }
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    b->d = rlx_iface_f32_to_f16(amax / 127.0f);
    for (int j = 0; j < RLX_QK; j++) {
        const float v = x[j] * id;
        b->qs[j] = (int8_t)(v >= 127.0f ? 127 : v <= -127.0f ? -127 : v == v ? __builtin_rintf(v) : 0);
    }
}

static inline void rlx_iface_dequant_q4_k(const rlx_block_q4_k *b, float *y) {
    const float d = rlx_iface_f16_to_f32(b->d), dmin = rlx_iface_f16_to_f32(b->dmin);
    const uint8_t *q = b->qs;
    for (int s = 0; s < 8; s += 2, q += 32, y += 64) {
        uint8_t sc, m;
        rlx_iface_q4k_scale(b->scales, s, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        rlx_iface_q4k_scale(b->scales, s + 1, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            y[l] = d1 * (float)(q[l] & 0xF) - m1;
            y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static inline void rlx_iface_dequant_q5_k(const rlx_block_q5_k *b, float *y) {
    const float d = rlx_iface_f16_to_f32(b->d), dmin = rlx_iface_f16_to_f32(b->dmin);
    const uint8_t *q = b->qs;
    for (int s = 0; s < 8; s += 2, q += 32, y += 64) {
        uint8_t sc, m;
        rlx_iface_q4k_scale(b->scales, s, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        rlx_iface_q4k_scale(b->scales, s + 1, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        const uint8_t lo_bit = (uint8_t)(1u << s), hi_bit = (uint8_t)(2u << s);
        for (int l = 0; l < 32; l++) {
            y[l] = d1 * (float)((q[l] & 0xF) + (b->qh[l] & lo_bit ? 16 : 0)) - m1;
            y[l + 32] = d2 * (float)((q[l] >> 4) + (b->qh[l] & hi_bit ? 16 : 0)) - m2;
        }
    }
}

/* Q6_K: each half of 128 elements uses 64 bytes of ql, 32 of qh and 8 scales; of element l < 32
 * of its four quarters, the low nibbles of ql[l] and ql[l + 32] give quarters 0 and 1, their high
 * nibbles quarters 2 and 3, and bit pairs 0-1, 2-3, 4-5, 6-7 of qh[l] the top bits of each. */
static inline void rlx_iface_dequant_q6_k(const rlx_block_q6_k *b, float *y) {
    const float d = rlx_iface_f16_to_f32(b->d);
    const uint8_t *ql = b->ql, *qh = b->qh;
    const int8_t *sc = b->scales;
    for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128) {
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = (int)((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * (float)q1;
            y[l + 32] = d * sc[is + 2] * (float)q2;
            y[l + 64] = d * sc[is + 4] * (float)q3;
            y[l + 96] = d * sc[is + 6] * (float)q4;
        }
    }
}

/* Widens n values of a row of dtype (any rlx_dtype but I32; n a whole number of blocks) to F32.
 * Returns 0, or -1 for a dtype it does not know. */
static inline int rlx_iface_dequant_row(uint32_t dtype, const void *src, float *dst, int64_t n) {
    const int64_t block = rlx_iface_dtype_block(dtype);
    const size_t block_bytes = rlx_iface_dtype_block_bytes(dtype);
    const uint8_t *p = (const uint8_t *)src;
    switch (dtype) {
    case RLX_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    case RLX_DTYPE_BF16:
    case RLX_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = rlx_iface_load_f32(dtype, src, i);
        return 0;
    default:
        break;
    }
    for (int64_t i = 0; i < n / block; i++, p += block_bytes, dst += block) {
        switch (dtype) {
        case RLX_DTYPE_Q4_0:
            rlx_iface_dequant_q4_0((const rlx_block_q4_0 *)p, dst);
            break;
        case RLX_DTYPE_Q4_1:
            rlx_iface_dequant_q4_1((const rlx_block_q4_1 *)p, dst);
            break;
        case RLX_DTYPE_Q5_0:
            rlx_iface_dequant_q5_0((const rlx_block_q5_0 *)p, dst);
            break;
        case RLX_DTYPE_Q5_1:
            rlx_iface_dequant_q5_1((const rlx_block_q5_1 *)p, dst);
            break;
        case RLX_DTYPE_Q8_0:
            rlx_iface_dequant_q8_0((const rlx_block_q8_0 *)p, dst);
            break;
        case RLX_DTYPE_Q4_K:
            rlx_iface_dequant_q4_k((const rlx_block_q4_k *)p, dst);
            break;
        case RLX_DTYPE_Q5_K:
            rlx_iface_dequant_q5_k((const rlx_block_q5_k *)p, dst);
            break;
        case RLX_DTYPE_Q6_K:
            rlx_iface_dequant_q6_k((const rlx_block_q6_k *)p, dst);
            break;
        default:
            return -1;
        }
    }
    return 0;
}

#ifdef __cplusplus
}
#endif
#endif
