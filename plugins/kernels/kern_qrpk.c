/* The K types of the row-interleaved weights (kern_qrp.h): Q4_K, Q5_K and Q6_K.
 *
 * The interleaved block. A native K block is a few fields (Q4_K: d, dmin, scales[12], qs[128];
 * Q5_K: d, dmin, scales[12], qh[32], qs[128]; Q6_K: ql[128], qh[64], scales[16], d). The
 * interleaved block of 8 rows keeps the fields in their native order, field f of native offset
 * off starting at 8 * off, and inside it the 8 rows take turns by units: a whole F16 for d and
 * dmin (so the 8 rows' d are 8 consecutive F16, one _mm256_cvtph_ps), 4 bytes for every byte
 * array. Unit k of row r lands at 8 * off + (8 * k + r) * unit. So one 32-byte load of a byte
 * array holds the same 4 bytes of the 8 rows, one row per int32 lane, and one broadcast of 4
 * activation bytes meets all 8 in maddubs / madd. The 6-bit scales and minimums of Q4_K / Q5_K
 * stay packed (8 bytes of them would need 128 bytes, the block has 96): their three 4-byte
 * words of the 8 rows are three vectors, decoded for all rows at once with the shifts and masks
 * of rlx_iface_q4k_scale. Offsets in the interleaved block:
 *   Q4_K (1152 bytes)  d 0, dmin 16, scales 32 (3 x 32), qs 128 (32 x 32)
 *   Q5_K (1408 bytes)  d 0, dmin 16, scales 32, qh 128 (8 x 32), qs 384
 *   Q6_K (1680 bytes)  ql 0 (32 x 32), qh 1024 (16 x 32), scales 1536 (4 x 32), d 1664
 *
 * Results: per row and block, isum (sub-block scales applied, Q6_K's offset 32 through the
 * activation sums) and msum (the Q4_K / Q5_K minimums times the sums) are the exact integers of
 * kern_quant.c, and the F32 steps are kern_qblock.h's, lane for lane: each level gives
 * kern_qmatmul's bits. The C level works row by row from the interleaved bytes; the x86 levels
 * (kern_qrpk.inc) keep one row per lane. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kern_qamx.h"
#include "kern_qblock.h"
#include "kern_qrp.h"

/* Where a field of a native block goes (the rule above). */
typedef struct krk_field {
    uint16_t off, bytes, unit;
} krk_field;

typedef struct krk_type {
    int n_fields;
    krk_field f[5];
} krk_type;

static const krk_type krk_types[3] = {
    {4, {{0, 2, 2}, {2, 2, 2}, {4, 12, 4}, {16, 128, 4}}},
    {5, {{0, 2, 2}, {2, 2, 2}, {4, 12, 4}, {16, 32, 4}, {48, 128, 4}}},
    {4, {{0, 128, 4}, {128, 64, 4}, {192, 16, 4}, {208, 2, 2}}},
};

/* Offsets in the interleaved blocks (8 times the native ones). */
#define KRK_Q45_D 0
#define KRK_Q45_DMIN 16
#define KRK_Q45_SCALES 32
#define KRK_Q5_QH 128
#define KRK_Q4_QS 128
#define KRK_Q5_QS 384
#define KRK_Q6_QL 0
#define KRK_Q6_QH 1024
#define KRK_Q6_SCALES 1536
#define KRK_Q6_D 1664

static int krk_index(int dt) {
    switch (dt) {
    case RLX_DTYPE_Q4_K:
        return 0;
    case RLX_DTYPE_Q5_K:
        return 1;
    case RLX_DTYPE_Q6_K:
        return 2;
    default:
        return -1;
    }
}

int kern_qrpk_pack(int dt, const void *w, int64_t K, int64_t g0, int64_t g1, void *dst) {
    const int t = krk_index(dt);
    if (t < 0)
        return 0;
    const krk_type *ty = &krk_types[t];
    const size_t bb = rlx_iface_dtype_block_bytes((uint32_t)dt), row = rlx_iface_row_bytes((uint32_t)dt, K);
    const int64_t nb = K / RLX_QK_K;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = (uint8_t *)dst + (size_t)(g * nb + b) * KERN_QRP_ROWS * bb;
            const uint8_t *src[KERN_QRP_ROWS];
            for (int r = 0; r < KERN_QRP_ROWS; r++)
                src[r] = (const uint8_t *)w + (size_t)(g * KERN_QRP_ROWS + r) * row + (size_t)b * bb;
            /* in the order of the destination, with copies of a constant size (single moves):
             * a weight is repacked at load, at the speed of its reading */
            for (int i = 0; i < ty->n_fields; i++) {
                const krk_field f = ty->f[i];
                uint8_t *of = o + KERN_QRP_ROWS * f.off;
                if (f.unit == 2) {
                    for (int r = 0; r < KERN_QRP_ROWS; r++)
                        memcpy(of + 2 * r, src[r] + f.off, 2);
                    continue;
                }
                for (int k = 0; k < f.bytes / 4; k++, of += 4 * KERN_QRP_ROWS)
                    for (int r = 0; r < KERN_QRP_ROWS; r++)
                        memcpy(of + 4 * r, src[r] + f.off + 4 * k, 4);
            }
        }
    return 1;
}

int kern_qrpk_unpack(int dt, const void *wp, int64_t K, int64_t n, int64_t b, void *blk) {
    const int t = krk_index(dt);
    if (t < 0)
        return 0;
    const krk_type *ty = &krk_types[t];
    const size_t bb = rlx_iface_dtype_block_bytes((uint32_t)dt);
    const int64_t nb = K / RLX_QK_K, r = n % KERN_QRP_ROWS;
    const uint8_t *ib =
        (const uint8_t *)wp + ((size_t)(n / KERN_QRP_ROWS) * (size_t)nb + (size_t)b) * KERN_QRP_ROWS * bb;
    for (int i = 0; i < ty->n_fields; i++) {
        const krk_field f = ty->f[i];
        const uint8_t *in = ib + KERN_QRP_ROWS * f.off;
        if (f.unit == 2) {
            memcpy((uint8_t *)blk + f.off, in + 2 * r, 2);
            continue;
        }
        for (int k = 0; k < f.bytes / 4; k++)
            memcpy((uint8_t *)blk + f.off + 4 * k, in + 4 * (KERN_QRP_ROWS * k + r), 4);
    }
    return 1;
}

// ---------------------------------------------------------------------------------------------
// Portable C: row r of each interleaved block, its integers summed as kern_quant.c sums them

/* Byte o of row r's byte array whose native offset is off (4-byte units). */
static inline uint8_t krk_byte(const uint8_t *blk, int off, int o, int r) {
    return blk[KERN_QRP_ROWS * off + (KERN_QRP_ROWS * (o / 4) + r) * 4 + o % 4];
}

/* Row r's F16 field whose interleaved offset is at, as F32. */
static inline float krk_f16(const uint8_t *blk, int at, int r) {
    return rlx_iface_f16_to_f32(kern_qb_u16(blk + at + 2 * r));
}

/* Block value of row r for Q4_K / Q5_K against activation block b of x. */
static float krk_c_value45(bool five, const uint8_t *blk, int r, const kern_q8_row *x, int64_t b) {
    uint8_t scales[12];
    for (int k = 0; k < 12; k++)
        scales[k] = krk_byte(blk, 4, k, r);
    const int qs_off = five ? 48 : 16;
    const int8_t *xq = x->qs + b * RLX_QK_K;
    const int16_t *bs = x->sums + b * 16;
    int32_t isum = 0, msum = 0;
    for (int s = 0; s < 8; s++) {
        uint8_t sc, mn;
        rlx_iface_q4k_scale(scales, s, &sc, &mn);
        int32_t dot = 0;
        for (int l = 0; l < 32; l++) {
            const uint8_t byte = krk_byte(blk, qs_off, 32 * (s / 2) + l, r);
            int q = s & 1 ? byte >> 4 : byte & 0xF;
            if (five)
                q |= ((krk_byte(blk, 16, l, r) >> s) & 1) << 4;
            dot += q * xq[32 * s + l];
        }
        isum += sc * dot;
        msum += mn * (bs[2 * s] + bs[2 * s + 1]);
    }
    return kern_qb_valuek(x->d[b], krk_f16(blk, KRK_Q45_D, r), isum, krk_f16(blk, KRK_Q45_DMIN, r), msum, 1);
}

/* Block value of row r for Q6_K. */
static float krk_c_value6(const uint8_t *blk, int r, const kern_q8_row *x, int64_t b) {
    const int8_t *xq = x->qs + b * RLX_QK_K;
    const int16_t *bs = x->sums + b * 16;
    int32_t dot[16] = {0};
    for (int e = 0; e < RLX_QK_K; e++) {
        const int h = e / 128, qn = (e % 128) / 32, l = e % 32;
        const uint8_t lo = krk_byte(blk, 0, 64 * h + 32 * (qn & 1) + l, r);
        const int q = (qn < 2 ? lo & 0xF : lo >> 4) | (((krk_byte(blk, 128, 32 * h + l, r) >> (2 * qn)) & 3) << 4);
        dot[e / 16] += q * xq[e];
    }
    int32_t isum = 0;
    for (int s = 0; s < 16; s++) {
        const int sc = (int8_t)krk_byte(blk, 192, s, r);
        isum += sc * dot[s] - 32 * sc * bs[s];
    }
    return kern_qb_valuek(x->d[b], krk_f16(blk, KRK_Q6_D, r), isum, 0.0f, 0, 0);
}

static void krk_c_matmul(int dt, const void *wp, int64_t K, const void *x, size_t xs, int64_t M, int64_t g0, int64_t g1,
                         float *y, int64_t ldy) {
    const int64_t nb = K / RLX_QK_K;
    const size_t ib = KERN_QRP_ROWS * rlx_iface_dtype_block_bytes((uint32_t)dt);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *grp = (const uint8_t *)wp + (size_t)(g * nb) * ib;
        for (int64_t m = 0; m < M; m++) {
            const kern_q8_row xr = kern_q8_view(dt, (const char *)x + (size_t)m * xs, K);
            float acc[KERN_QRP_ROWS][4] = {{0.0f}};
            for (int64_t b = 0; b < nb; b++)
                for (int r = 0; r < KERN_QRP_ROWS; r++) {
                    const uint8_t *blk = grp + (size_t)b * ib;
                    acc[r][b & 3] += dt == RLX_DTYPE_Q6_K ? krk_c_value6(blk, r, &xr, b)
                                                          : krk_c_value45(dt == RLX_DTYPE_Q5_K, blk, r, &xr, b);
                }
            for (int r = 0; r < KERN_QRP_ROWS; r++)
                y[m * ldy + g * KERN_QRP_ROWS + r] = kern_qb_total(acc[r]);
        }
    }
}

#define KRK_C(DT, NAME)                                                                                                \
    static void krk_c_##NAME(const void *wp, int64_t K, const void *x, size_t xs, int64_t M, int64_t g0, int64_t g1,   \
                             float *y, int64_t ldy) {                                                                  \
        krk_c_matmul(DT, wp, K, x, xs, M, g0, g1, y, ldy);                                                             \
    }
KRK_C(RLX_DTYPE_Q4_K, q4k)
KRK_C(RLX_DTYPE_Q5_K, q5k)
KRK_C(RLX_DTYPE_Q6_K, q6k)
#undef KRK_C

static const kern_qrp_ops krk_c_ops[3] = {{"c", krk_c_q4k}, {"c", krk_c_q5k}, {"c", krk_c_q6k}};

// ---------------------------------------------------------------------------------------------
// The x86 levels: kern_qrpk.inc for AVX2 and for AVX-512 (the same 256-bit kernels on EVEX with
// 32 registers), and inside the AVX-512 level a variant on AVX512-VNNI (kern_quant_vnni()): one
// vpdpbusd per activation row and weight vector where maddubs and an int16 add were two, and a
// 32-bit multiply per sub-block applying its scale where a madd did.

/* Fully unrolls the loop that follows. */
#define KRK_UNROLL_ALL _Pragma("GCC unroll 16")
/* Bytes prefetched ahead of the interleaved block being read (the groups of a range are one
 * sequential stream). */
#define KRK_AHEAD 1024

#define SFX(name) krk_##name##_avx2
#define KQ_TARGET __attribute__((target("avx2,fma,f16c")))
#define KQ_ISA_NAME "avx2"
#define KQ_VNNI 0
#define KQ_MR 4
#include "kern_qrpk.inc"

#define SFX(name) krk_##name##_avx512
#define KQ_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))
#define KQ_ISA_NAME "avx512"
#define KQ_VNNI 0
#define KQ_MR 4
#include "kern_qrpk.inc"

#define SFX(name) krk_##name##_avx512_vnni
#define KQ_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#define KQ_ISA_NAME "avx512-vnni"
#define KQ_VNNI 1
#define KQ_MR 8
#include "kern_qrpk.inc"

// ---------------------------------------------------------------------------------------------
// AMX (kern_qamx.h): a Q4_K / Q5_K sub-block of 32 values, or a Q6_K one of 16, per tile
// product. Per row, the sub-block sums take their scales with the 32-bit multiplies of the VNNI
// kernel, the minimums meet the activation sums in int16 pairs as its madds do, and the F32
// steps are SFX(group)'s: its integers and bits. Q6_K's offset 32 comes off the staged values.

/* Half hi (rows 8-15 of the tile's columns) of tile row i of staged tile t: 32 bytes. */
static inline KQA_AI void krk_amx_put(kqa_stage *st, int sub, int t, int i, int hi, __m256i v) {
    _mm256_store_si256((__m256i *)(st->tiles + (size_t)t * (size_t)sub * 16 + 64 * i + 32 * hi), v);
}

/* The F16 field at of the interleaved block widened, 8 lanes of 16. */
static inline KQA_AI void krk_amx_f16(float *dst, const uint8_t *blk, int at) {
    _mm256_store_ps(dst, blk ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + at))) : _mm256_setzero_ps());
}

/* kqa_stage_fn of the K types. */
static KQA_TARGET void krk_amx_stage(const kqa_kind *k, const uint8_t *gw0, const uint8_t *gw1, int64_t b0, int nbc,
                                     kqa_stage *st) {
    const bool six = k->dt == RLX_DTYPE_Q6_K, five = k->dt == RLX_DTYPE_Q5_K;
    const int subs = k->block / k->sub;
    for (int bi = 0; bi < nbc; bi++)
        for (int hi = 0; hi < 2; hi++) {
            const uint8_t *gw = hi ? gw1 : gw0;
            const uint8_t *blk = gw ? gw + (size_t)(b0 + bi) * k->ibb : NULL;
            const int t0 = bi * subs;
            if (!blk) {
                for (int t = t0; t < t0 + subs; t++) {
                    for (int i = 0; i < k->sub / 4; i++)
                        krk_amx_put(st, k->sub, t, i, 1, _mm256_setzero_si256());
                    _mm256_store_si256((__m256i *)(st->sc[t] + 8), _mm256_setzero_si256());
                    _mm256_store_si256((__m256i *)(st->mn[t] + 8), _mm256_setzero_si256());
                }
            } else if (six) {
                __m256i sc[4];
                for (int j = 0; j < 4; j++)
                    sc[j] = krk_load_avx512_vnni(blk + KRK_Q6_SCALES + 32 * j);
                for (int s = 0; s < 16; s++) {
                    for (int i = 0; i < 4; i++)
                        krk_amx_put(
                            st, k->sub, t0 + s, i, hi,
                            _mm256_sub_epi8(krk_values_q6k_avx512_vnni(blk, s, 4 * (s % 2) + i), _mm256_set1_epi8(32)));
                    _mm256_store_si256((__m256i *)(st->sc[t0 + s] + 8 * hi), krk_sbyte32_avx512_vnni(sc[s / 4], s % 4));
                }
            } else {
                __m256i sc[2], mn[2];
                krk_scales_q45k_avx512_vnni(blk, sc, mn);
                for (int s = 0; s < 8; s++) {
                    for (int i = 0; i < 8; i++)
                        krk_amx_put(st, k->sub, t0 + s, i, hi, krk_values_q45k_avx512_vnni(five, blk, s, i));
                    _mm256_store_si256((__m256i *)(st->sc[t0 + s] + 8 * hi), krk_ubyte32_avx512_vnni(sc[s / 4], s % 4));
                    _mm256_store_si256((__m256i *)(st->mn[t0 + s] + 8 * hi), krk_upair_avx512_vnni(mn[s / 4], s % 4));
                }
            }
            krk_amx_f16(st->d[bi] + 8 * hi, blk, six ? KRK_Q6_D : KRK_Q45_D);
            if (!six)
                krk_amx_f16(st->dmin[bi] + 8 * hi, blk, KRK_Q45_DMIN);
        }
}

/* kqa_scale_fn of the K types, for each dtype dt. */
static inline KQA_AI void krk_amx_scale(int dt, const kqa_stage *st, const kqa_sums *sums, int64_t b0, int nbc,
                                        const kern_q8_row *xr, int mt, __m512 (*acc)[4]) {
    const bool six = dt == RLX_DTYPE_Q6_K;
    const int subs = six ? 16 : 8;
    for (int bi = 0; bi < nbc; bi++) {
        const int64_t b = b0 + bi;
        const __m512 dw = _mm512_load_ps(st->d[bi]), dmin = six ? _mm512_setzero_ps() : _mm512_load_ps(st->dmin[bi]);
        for (int m = 0; m < mt; m++) {
            __m512i isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
            KRK_UNROLL_ALL
            for (int s = 0; s < subs; s++) {
                const int t = bi * subs + s;
                isum = _mm512_add_epi32(
                    isum, _mm512_mullo_epi32(_mm512_load_si512((*sums)[t][m]), _mm512_load_si512(st->sc[t])));
                if (!six) {
                    int32_t pair; /* the activation sums of the sub-block's two halves */
                    memcpy(&pair, xr[m].sums + b * 16 + 2 * s, sizeof pair);
                    msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(st->mn[t]), _mm512_set1_epi32(pair));
                }
            }
            const __m512 dx = _mm512_set1_ps(xr[m].d[b]);
            __m512 v = _mm512_mul_ps(_mm512_mul_ps(dx, dw), _mm512_cvtepi32_ps(isum));
            if (!six)
                v = _mm512_sub_ps(v, _mm512_mul_ps(_mm512_mul_ps(dx, dmin), _mm512_cvtepi32_ps(msum)));
            acc[m][b & 3] = _mm512_add_ps(acc[m][b & 3], v);
        }
    }
}

/* Rows from which the tiles are faster (bench_qgemv --m): Q6_K's 16-value sub-blocks fill half a
 * tile product each. */
KQA_DEFINE(krk_q4k_amx, RLX_DTYPE_Q4_K, RLX_QK_K, 32, 12, krk_amx_stage, krk_amx_scale, krk_q4k_avx512_vnni)
KQA_DEFINE(krk_q5k_amx, RLX_DTYPE_Q5_K, RLX_QK_K, 32, 12, krk_amx_stage, krk_amx_scale, krk_q5k_avx512_vnni)
KQA_DEFINE(krk_q6k_amx, RLX_DTYPE_Q6_K, RLX_QK_K, 16, 16, krk_amx_stage, krk_amx_scale, krk_q6k_avx512_vnni)

static const kern_qrp_ops krk_ops_amx[3] = {{"amx", krk_q4k_amx}, {"amx", krk_q5k_amx}, {"amx", krk_q6k_amx}};

const kern_qrp_ops *kern_qrpk_ops_at(plugin_isa isa, int dt) {
    const int t = krk_index(dt);
    if (t < 0)
        return NULL;
    switch (isa) {
    case PLUGIN_ISA_AVX2:
        return &krk_ops_avx2[t];
    case PLUGIN_ISA_AVX512:
    case PLUGIN_ISA_AVX512_BF16:
        return kern_quant_vnni() ? &krk_ops_avx512_vnni[t] : &krk_ops_avx512[t];
    case PLUGIN_ISA_AMX:
        return kern_quant_vnni() ? &krk_ops_amx[t] : &krk_ops_avx512[t];
    default:
        return &krk_c_ops[t];
    }
}
