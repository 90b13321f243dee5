/* Row-interleaved weights of the 32-value types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (kern_qrp.h): the
 * layout, its packing, the portable C kernels and the x86 levels (kern_qrp32.inc compiled for
 * AVX2, AVX-512 and AVX-512 with VNNI, as kern_qsimd.c compiles kern_qsimd.inc).
 *
 * The interleaved block of block index b of rows 8g .. 8g + 7 (8 * bb bytes, bb the native
 * block's) holds, in this order:
 *   d[8]   the rows' F16 scales, row r at 2r: one F16C conversion gives a row per lane;
 *   m[8]   Q4_1, Q5_1: the rows' F16 minimums, likewise;
 *   qh[8]  Q5_0, Q5_1: each row's 32 fifth bits as a 32-bit word, element e's bit moved to bit
 *          8 * (e % 4) + 2 * ((e % 16) / 4) + e / 16, so the four elements a chunk of values
 *          holds (below) sit in bit k of the four bytes of the word and one shift and mask puts
 *          them at bit 4 of each byte, beside the nibbles;
 *   qs     the values in chunks of 4 bytes, chunk c of row r at 4 * (8c + r): for Q4 / Q5 the
 *          native bytes 4c .. 4c + 3 (elements 4c .. 4c + 3 in the low nibbles, 16 + 4c ..
 *          19 + 4c in the high ones), c < 4; for Q8_0 elements 4c .. 4c + 3, c < 8.
 * So one 32-byte load of qs holds the same four elements of the 8 rows, one per 32-bit lane,
 * and meets one broadcast of the 4 matching activation bytes: the 8 lanes of a maddubs / madd
 * (vpdpbusd) are the 8 rows' partial sums, and the block's integer sums and its kern_qblock.h
 * scaling land one row per lane without any horizontal sum. Sizes: 16 + 128 (Q4_0), 16 + 16 +
 * 128 (Q4_1), 16 + 32 + 128 (Q5_0), 16 + 16 + 32 + 128 (Q5_1), 16 + 256 (Q8_0) bytes: 8 native
 * blocks exactly. */
#include <stdlib.h>
#include <string.h>

#include "kern_qamx.h"
#include "kern_qblock.h"
#include "kern_qrp.h"

/* Where the parts of an interleaved block start. */
static inline int kern_qrp32_off_m(void) { return 16; }
static inline int kern_qrp32_off_qh(int dt) { return kern_qb_has_min(dt) ? 32 : 16; }
static inline int kern_qrp32_off_qs(int dt) {
    const bool five = dt == RLX_DTYPE_Q5_0 || dt == RLX_DTYPE_Q5_1;
    return kern_qrp32_off_qh(dt) + (five ? 32 : 0);
}

static bool kern_qrp32_type(int dt) {
    return dt == RLX_DTYPE_Q4_0 || dt == RLX_DTYPE_Q4_1 || dt == RLX_DTYPE_Q5_0 || dt == RLX_DTYPE_Q5_1 ||
           dt == RLX_DTYPE_Q8_0;
}

/* Bit e of a native Q5 qh word moves here in the interleaved one. */
static inline int kern_qrp32_qh_bit(int e) { return 8 * (e % 4) + 2 * ((e % 16) / 4) + e / 16; }

/* One interleaved block from block b of the 8 rows at src (rows row_bytes apart). */
static void kern_qrp32_pack_block(int dt, const uint8_t *src, size_t row_bytes, uint8_t *dst) {
    const bool five = dt == RLX_DTYPE_Q5_0 || dt == RLX_DTYPE_Q5_1;
    const int chunks = dt == RLX_DTYPE_Q8_0 ? 8 : 4;
    const int qs = kern_qrp32_off_qs(dt);
    for (int r = 0; r < KERN_QRP_ROWS; r++) {
        const uint8_t *blk = src + (size_t)r * row_bytes;
        memcpy(dst + 2 * r, blk + KQ_OFF_D, 2);
        if (kern_qb_has_min(dt))
            memcpy(dst + kern_qrp32_off_m() + 2 * r, blk + KQ_OFF_M, 2);
        if (five) {
            const uint32_t qh = rlx_iface_q5_high_bits(blk + kern_qb_qh(dt));
            uint32_t moved = 0;
            for (int e = 0; e < RLX_QK; e++)
                moved |= ((qh >> e) & 1u) << kern_qrp32_qh_bit(e);
            memcpy(dst + kern_qrp32_off_qh(dt) + 4 * r, &moved, 4);
        }
        for (int c = 0; c < chunks; c++)
            memcpy(dst + qs + 4 * (KERN_QRP_ROWS * c + r), blk + kern_qb_qs(dt) + 4 * c, 4);
    }
}

int kern_qrp32_pack(int dt, const void *w, int64_t K, int64_t g0, int64_t g1, void *dst) {
    if (!kern_qrp32_type(dt))
        return 0;
    const size_t bb = rlx_iface_dtype_block_bytes((uint32_t)dt), row_bytes = rlx_iface_row_bytes((uint32_t)dt, K);
    const int64_t nb = K / RLX_QK;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t b = 0; b < nb; b++)
            kern_qrp32_pack_block(dt, (const uint8_t *)w + (size_t)g * KERN_QRP_ROWS * row_bytes + (size_t)b * bb,
                                  row_bytes,
                                  (uint8_t *)dst + ((size_t)g * (size_t)nb + (size_t)b) * KERN_QRP_ROWS * bb);
    return 1;
}

int kern_qrp32_unpack(int dt, const void *wp, int64_t K, int64_t n, int64_t b, void *blk) {
    if (!kern_qrp32_type(dt))
        return 0;
    const size_t bb = rlx_iface_dtype_block_bytes((uint32_t)dt);
    const int64_t nb = K / RLX_QK, r = n % KERN_QRP_ROWS;
    const uint8_t *ib =
        (const uint8_t *)wp + ((size_t)(n / KERN_QRP_ROWS) * (size_t)nb + (size_t)b) * KERN_QRP_ROWS * bb;
    uint8_t *o = blk;
    memcpy(o + KQ_OFF_D, ib + 2 * r, 2);
    if (kern_qb_has_min(dt))
        memcpy(o + KQ_OFF_M, ib + kern_qrp32_off_m() + 2 * r, 2);
    if (dt == RLX_DTYPE_Q5_0 || dt == RLX_DTYPE_Q5_1) {
        uint32_t moved, qh = 0;
        memcpy(&moved, ib + kern_qrp32_off_qh(dt) + 4 * r, 4);
        for (int e = 0; e < RLX_QK; e++)
            qh |= ((moved >> kern_qrp32_qh_bit(e)) & 1u) << e;
        const uint8_t bytes[4] = {(uint8_t)qh, (uint8_t)(qh >> 8), (uint8_t)(qh >> 16), (uint8_t)(qh >> 24)};
        memcpy(o + kern_qb_qh(dt), bytes, 4);
    }
    for (int c = 0; c < (dt == RLX_DTYPE_Q8_0 ? 8 : 4); c++)
        memcpy(o + kern_qb_qs(dt) + 4 * c, ib + kern_qrp32_off_qs(dt) + 4 * (KERN_QRP_ROWS * c + r), 4);
    return 1;
}

// ---------------------------------------------------------------------------------------------
// Portable C: each row of an interleaved block decoded to its integers, summed exactly

/* The 32 stored integers of row r of an interleaved block (unsigned for Q4/Q5, signed for Q8_0). */
static void kern_qrp32_decode(int dt, const uint8_t *ib, int r, int q[RLX_QK]) {
    const uint8_t *qs = ib + kern_qrp32_off_qs(dt);
    if (dt == RLX_DTYPE_Q8_0) {
        for (int e = 0; e < RLX_QK; e++)
            q[e] = (int8_t)qs[4 * (KERN_QRP_ROWS * (e / 4) + r) + e % 4];
        return;
    }
    const bool five = dt == RLX_DTYPE_Q5_0 || dt == RLX_DTYPE_Q5_1;
    uint32_t qh = 0;
    if (five)
        memcpy(&qh, ib + kern_qrp32_off_qh(dt) + 4 * r, 4);
    for (int e = 0; e < RLX_QK; e++) {
        const uint8_t byte = qs[4 * (KERN_QRP_ROWS * ((e % 16) / 4) + r) + e % 4];
        q[e] = (int)((e < 16 ? byte & 0xF : byte >> 4) | (((qh >> kern_qrp32_qh_bit(e)) & 1u) << 4));
    }
}

static void kern_qrp32_c(int dt, const void *wp, int64_t K, const void *x, size_t x_stride, int64_t M, int64_t g0,
                         int64_t g1, float *y, int64_t ldy) {
    const size_t bb = rlx_iface_dtype_block_bytes((uint32_t)dt);
    const int64_t nb = K / RLX_QK;
    const int offset = kern_qb_offset(dt), has_min = kern_qb_has_min(dt);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *gw = (const uint8_t *)wp + (size_t)g * (size_t)nb * KERN_QRP_ROWS * bb;
        for (int64_t m = 0; m < M; m++) {
            const kern_q8_row xr = kern_q8_view(dt, (const char *)x + (size_t)m * x_stride, K);
            float acc[KERN_QRP_ROWS][4] = {{0.0f}};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *ib = gw + (size_t)b * KERN_QRP_ROWS * bb;
                for (int r = 0; r < KERN_QRP_ROWS; r++) {
                    int q[RLX_QK];
                    kern_qrp32_decode(dt, ib, r, q);
                    int32_t isum = 0;
                    for (int e = 0; e < RLX_QK; e++)
                        isum += q[e] * xr.qs[b * RLX_QK + e];
                    isum -= offset * xr.sums[b];
                    const float mw =
                        has_min ? rlx_iface_f16_to_f32(kern_qb_u16(ib + kern_qrp32_off_m() + 2 * r)) : 0.0f;
                    kern_qb_add32(acc[r], b, rlx_iface_f16_to_f32(kern_qb_u16(ib + 2 * r)), xr.d[b], isum, mw,
                                  has_min ? xr.s[b] : 0.0f, has_min);
                }
            }
            for (int r = 0; r < KERN_QRP_ROWS; r++)
                y[m * ldy + g * KERN_QRP_ROWS + r] = kern_qb_total(acc[r]);
        }
    }
}

#define KRC_DEF(DT, NAME)                                                                                              \
    static void kern_qrp32_c_##NAME(const void *wp, int64_t K, const void *x, size_t xs, int64_t M, int64_t g0,        \
                                    int64_t g1, float *y, int64_t ldy) {                                               \
        kern_qrp32_c(DT, wp, K, x, xs, M, g0, g1, y, ldy);                                                             \
    }
KRC_DEF(RLX_DTYPE_Q4_0, q4_0)
KRC_DEF(RLX_DTYPE_Q4_1, q4_1)
KRC_DEF(RLX_DTYPE_Q5_0, q5_0)
KRC_DEF(RLX_DTYPE_Q5_1, q5_1)
KRC_DEF(RLX_DTYPE_Q8_0, q8_0)
#undef KRC_DEF

/* The ops of one level, indexed by dtype. */
typedef struct kern_qrp32_level {
    kern_qrp_ops ops[RLX_DTYPE_COUNT];
} kern_qrp32_level;

#define KR_LEVEL(ISA, F)                                                                                               \
    {                                                                                                                  \
        .ops = {                                                                                                       \
            [RLX_DTYPE_Q4_0] = {ISA, F(q4_0)},                                                                         \
            [RLX_DTYPE_Q4_1] = {ISA, F(q4_1)},                                                                         \
            [RLX_DTYPE_Q5_0] = {ISA, F(q5_0)},                                                                         \
            [RLX_DTYPE_Q5_1] = {ISA, F(q5_1)},                                                                         \
            [RLX_DTYPE_Q8_0] = {ISA, F(q8_0)}                                                                          \
        }                                                                                                              \
    }

#define KR_C(NAME) kern_qrp32_c_##NAME
static const kern_qrp32_level kern_qrp32_lc = KR_LEVEL("c", KR_C);

// ---------------------------------------------------------------------------------------------
// x86 levels

#include <immintrin.h>

/* Fully unrolls the loop that follows (trip counts of at most 8 here). */
#define KR_UNROLL_ALL _Pragma("GCC unroll 16")
/* Bytes prefetched ahead of the interleaved blocks being read: a group's blocks are one
 * sequential stream, which decode reads from DRAM once per token. */
#define KR_AHEAD 1024
/* Activation rows per micro-kernel (KR_MT): each unpacked interleaved block meets KR_MT rows of
 * x, each row keeping 4 F32 accumulators (its lanes b % 4). 4 rather than 2 is faster on AVX2 too
 * although 16 accumulators and the block's 8 value vectors do not all fit its 16 registers
 * (bench_qgemv --m 128); on VNNI, 8 rows share each unpacked block, their accumulators (updated
 * once per block) partly on the stack. */
#define SFX(name) kern_qrp32_##name##_avx2
#define KR_TARGET __attribute__((target("avx2,fma,f16c")))
#define KR_MT 4
#include "kern_qrp32.inc"

#define SFX(name) kern_qrp32_##name##_avx512
#define KR_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define KR_MT 4
#include "kern_qrp32.inc"

#define SFX(name) kern_qrp32_##name##_avx512_vnni
#define KR_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#define KR_VNNI 1
#define KR_MT 8
#include "kern_qrp32.inc"

// ---------------------------------------------------------------------------------------------
// AMX (kern_qamx.h): a block is one sub-block, its values staged from SFX(values) less the
// type's offset; the F32 part is SFX(block)'s

/* kqa_stage_fn of the 32-value types. */
static KQA_TARGET void kern_qrp32_amx_stage(const kqa_kind *k, const uint8_t *gw0, const uint8_t *gw1, int64_t b0,
                                            int nbc, kqa_stage *st) {
    const int dt = k->dt;
    const __m256i off = _mm256_set1_epi8((char)kern_qb_offset(dt));
    const __m256 z = _mm256_setzero_ps();
    for (int bi = 0; bi < nbc; bi++) {
        __m256i v0[8], v1[8];
        const uint8_t *ib0 = gw0 + (size_t)(b0 + bi) * k->ibb, *ib1 = gw1 ? gw1 + (size_t)(b0 + bi) * k->ibb : NULL;
        kern_qrp32_values_avx512_vnni(dt, ib0, v0);
        if (ib1)
            kern_qrp32_values_avx512_vnni(dt, ib1, v1);
        KR_UNROLL_ALL
        for (int j = 0; j < 8; j++) {
            const int chunk = kern_qrp32_xoff_avx512_vnni(dt, j) / 4; /* it holds values 4 chunk .. + 3 */
            _mm512_store_si512(
                st->tiles + bi * 512 + chunk * 64,
                kqa_join(_mm256_sub_epi8(v0[j], off), ib1 ? _mm256_sub_epi8(v1[j], off) : _mm256_setzero_si256()));
        }
        _mm256_store_ps(st->d[bi], _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)ib0)));
        _mm256_store_ps(st->d[bi] + 8, ib1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)ib1)) : z);
        if (kern_qb_has_min(dt)) {
            _mm256_store_ps(st->dmin[bi],
                            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ib0 + kern_qrp32_off_m()))));
            _mm256_store_ps(st->dmin[bi] + 8,
                            ib1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ib1 + kern_qrp32_off_m()))) : z);
        }
    }
}

/* kqa_scale_fn of the 32-value types, for each dtype dt: v = (dw * dx) * isum (+ mw * sx) into
 * lane b % 4 (the chunks start at multiples of 4 blocks). */
_Static_assert(KQA_TILES % 4 == 0, "a chunk of the 32-value types starts at a block of lane 0");
static inline KQA_AI void kern_qrp32_amx_scale(int dt, const kqa_stage *st, const kqa_sums *sums, int64_t b0, int nbc,
                                               const kern_q8_row *xr, int mt, __m512 (*acc)[4]) {
    const int has_min = kern_qb_has_min(dt);
    for (int m = 0; m < mt; m++) {
        __m512 a[4] = {acc[m][0], acc[m][1], acc[m][2], acc[m][3]};
        KR_UNROLL_ALL
        for (int j = 0; j < KQA_TILES; j++) {
            if (j >= nbc)
                break;
            const int64_t b = b0 + j;
            __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(st->d[j]), _mm512_set1_ps(xr[m].d[b])),
                                     _mm512_cvtepi32_ps(_mm512_load_si512((*sums)[j][m])));
            if (has_min)
                v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_load_ps(st->dmin[j]), _mm512_set1_ps(xr[m].s[b])));
            a[j & 3] = _mm512_add_ps(a[j & 3], v);
        }
        KR_UNROLL_ALL
        for (int j = 0; j < 4; j++)
            acc[m][j] = a[j];
    }
}

#define KQA_DEF(DT, NAME)                                                                                              \
    KQA_DEFINE(kern_qrp32_##NAME##_amx, DT, RLX_QK, RLX_QK, 8, kern_qrp32_amx_stage, kern_qrp32_amx_scale,             \
               kern_qrp32_##NAME##_avx512_vnni)
KQA_DEF(RLX_DTYPE_Q4_0, q4_0)
KQA_DEF(RLX_DTYPE_Q4_1, q4_1)
KQA_DEF(RLX_DTYPE_Q5_0, q5_0)
KQA_DEF(RLX_DTYPE_Q5_1, q5_1)
KQA_DEF(RLX_DTYPE_Q8_0, q8_0)
#undef KQA_DEF

#define KR_AVX2(NAME) kern_qrp32_##NAME##_avx2
#define KR_AVX512(NAME) kern_qrp32_##NAME##_avx512
#define KR_VNNI_F(NAME) kern_qrp32_##NAME##_avx512_vnni
#define KR_AMX(NAME) kern_qrp32_##NAME##_amx
static const kern_qrp32_level kern_qrp32_lavx2 = KR_LEVEL("avx2", KR_AVX2);
static const kern_qrp32_level kern_qrp32_lavx512 = KR_LEVEL("avx512", KR_AVX512);
static const kern_qrp32_level kern_qrp32_lvnni = KR_LEVEL("avx512-vnni", KR_VNNI_F);
static const kern_qrp32_level kern_qrp32_lamx = KR_LEVEL("amx", KR_AMX);

const kern_qrp_ops *kern_qrp32_ops_at(plugin_isa isa, int dt) {
    if (!kern_qrp32_type(dt))
        return NULL;
    switch (isa) {
    case PLUGIN_ISA_AVX2:
        return &kern_qrp32_lavx2.ops[dt];
    case PLUGIN_ISA_AVX512:
    case PLUGIN_ISA_AVX512_BF16:
        return kern_quant_vnni() ? &kern_qrp32_lvnni.ops[dt] : &kern_qrp32_lavx512.ops[dt];
    case PLUGIN_ISA_AMX:
        return kern_quant_vnni() ? &kern_qrp32_lamx.ops[dt] : &kern_qrp32_lavx512.ops[dt];
    default:
        return &kern_qrp32_lc.ops[dt];
    }
}
