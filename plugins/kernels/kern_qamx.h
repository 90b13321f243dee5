/* Private to the repacked quantized kernels (kern_qrp32.c, kern_qrpk.c): their AMX level's
 * integer sums on tiles, the part both families share.
 *
 * A TDPBSSD multiplies a tile of 16 activation rows by one of 16 weight rows over one
 * sub-block (the values one scale covers: a whole block of the 32-value types, 32 values of
 * Q4_K / Q5_K, 16 of Q6_K), giving the 256 exact integer sums the VNNI kernels compute one
 * vpdpbusd chain at a time. The tile goes to memory, and each row of it is scaled and summed with
 * the very integer and F32 operations of the VNNI kernel of its type (kern_qblock.h's order). So
 * the AMX kernels give the bits of every other level for any M, and the choice between them and
 * the VNNI kernels (which run small M, where a tile pass costs as much for 1 row as for 16)
 * changes no result.
 *
 * The weights enter the tiles through a staging buffer that each type fills from its
 * interleaved blocks: two 8-row groups side by side (16 weight rows, the columns of a result
 * tile), each sub-block a tile of sub / 4 rows of 64 bytes, values as signed bytes with any
 * offset of the type taken off (q - 8 summed against x is the VNNI kernel's isum - 8 * sum x,
 * the same integer). */
#ifndef RLX_PLUGINS_KERN_QAMX_H
#define RLX_PLUGINS_KERN_QAMX_H

#include <immintrin.h>
#include <stdint.h>

#include "kern_amx.h"
#include "kern_qblock.h"
#include "kern_qrp.h"

#define KQA_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#define KQA_AI __attribute__((always_inline)) KQA_TARGET
/* Sub-block tiles staged at once: 8 KiB of weights, and 16 KiB of sums per pass, stay in L1. */
#define KQA_TILES 16
/* Activation rows a staged chunk serves before the next chunk is staged (their accumulators, 32
 * KiB, are on the stack). */
#define KQA_PANEL 128

/* How a type's blocks meet the tiles. */
typedef struct kqa_kind {
    int dt;
    int block;  /* values per block (32 or 256) */
    int sub;    /* values per sub-block, one tile product: 32, or 16 for Q6_K */
    int ch;     /* blocks staged at once: ch * block / sub <= KQA_TILES */
    int min_m;  /* below this many rows the VNNI kernel is faster (bench_qgemv --m) */
    size_t ibb; /* bytes of an interleaved block (8 rows) */
} kqa_kind;

/* The staged chunk: tile t (sub-block t % (block / sub) of the chunk's block t / (block / sub))
 * at tiles + t * sub * 16, row i of it holding values 4i .. 4i + 3 of each of the 16 weight
 * rows; and what the type's scaling needs per weight row (its F16 scales widened, sub-block
 * scales and minimums as int32 lanes). */
typedef struct kqa_stage {
    _Alignas(64) int8_t tiles[KQA_TILES * 32 * 16];
    _Alignas(64) float d[KQA_TILES][16];
    _Alignas(64) float dmin[KQA_TILES][16];
    _Alignas(64) int32_t sc[KQA_TILES][16];
    _Alignas(64) int32_t mn[KQA_TILES][16];
} kqa_stage;

/* Integer sums of the chunk's tiles, per activation row of the pass: sums[t][m][n]. */
typedef int32_t kqa_sums[KQA_TILES][16][16];

/* Fills st with blocks [b0, b0 + nbc) of groups gw0 and gw1 (NULL: zero columns 8-15). */
typedef void (*kqa_stage_fn)(const kqa_kind *k, const uint8_t *gw0, const uint8_t *gw1, int64_t b0, int nbc,
                             kqa_stage *st);
/* Adds the chunk's values for rows xr[0 .. mt) to acc[m][b % 4], from their sums. */
typedef void (*kqa_scale_fn)(const kqa_kind *k, const kqa_stage *st, const kqa_sums *sums, int64_t b0, int nbc,
                             const kern_q8_row *xr, int mt, __m512 (*acc)[4]);

/* Two 256-bit vectors of 8 rows' lanes as one of 16. */
static inline KQA_AI __m512i kqa_join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Tiles 0-3 the sums (rows of x by 16 int32), 4-5 x (rows by sub bytes), 6-7 weights (sub / 4
 * rows of 64 bytes). */
static inline KQA_TARGET void kqa_config(int rows, int sub) {
    const uint8_t r = (uint8_t)rows, w = (uint8_t)(sub / 4);
    const uint8_t tile_rows[8] = {r, r, r, r, r, r, w, w};
    const uint16_t colsb[8] = {64, 64, 64, 64, (uint16_t)sub, (uint16_t)sub, 64, 64};
    kern_amx_config(tile_rows, colsb);
}

/* Tile TC gets the sums of staged tile t for the rows of x at xa (xs bytes apart). */
#define KQA_DOT(TC, TA, TB, t)                                                                                         \
    do {                                                                                                               \
        _tile_loadd(TA, xa + (size_t)(t) * (size_t)sub, (long)xs);                                                     \
        _tile_loadd(TB, st->tiles + (size_t)(t) * (size_t)sub * 16, 64);                                               \
        _tile_zero(TC);                                                                                                \
        _tile_dpbssd(TC, TA, TB);                                                                                      \
    } while (0)

/* The nt staged tiles against the rows of x at xa: four products in flight before their sums
 * are stored. */
static inline KQA_AI void kqa_products(int nt, int sub, const int8_t *xa, size_t xs, const kqa_stage *st,
                                       kqa_sums *sums) {
    int t = 0;
    for (; t + 4 <= nt; t += 4) {
        KQA_DOT(0, 4, 6, t);
        KQA_DOT(1, 5, 7, t + 1);
        KQA_DOT(2, 4, 6, t + 2);
        KQA_DOT(3, 5, 7, t + 3);
        _tile_stored(0, (*sums)[t], 64);
        _tile_stored(1, (*sums)[t + 1], 64);
        _tile_stored(2, (*sums)[t + 2], 64);
        _tile_stored(3, (*sums)[t + 3], 64);
    }
    for (; t < nt; t++) {
        KQA_DOT(0, 4, 6, t);
        _tile_stored(0, (*sums)[t], 64);
    }
    /* the tile stores are asm without memory operands */
    __asm__ volatile("" ::: "memory");
}
#undef KQA_DOT

/* kern_qrp_matmul_fn on tiles for M >= k->min_m (vnni below): panels of up to KQA_PANEL rows
 * of x; in each, every pair of groups, its blocks staged ch at a time and each staged chunk
 * met by the panel's rows 16 at a time; lane sums as kern_qblock.h totals them. */
static inline KQA_AI void kqa_matmul(const kqa_kind *k, kqa_stage_fn stage, kqa_scale_fn scale, kern_qrp_matmul_fn vnni,
                                     const void *wp, int64_t K, const void *x, size_t xs, int64_t M, int64_t g0,
                                     int64_t g1, float *y, int64_t ldy) {
    if (M < k->min_m) {
        vnni(wp, K, x, xs, M, g0, g1, y, ldy);
        return;
    }
    const int64_t nb = K / k->block;
    const size_t gbytes = (size_t)nb * k->ibb;
    const int subs = k->block / k->sub;
    _Alignas(64) kqa_stage st;
    _Alignas(64) kqa_sums sums;
    _Alignas(64) __m512 acc[KQA_PANEL][4];
    kern_q8_row xr[KQA_PANEL];
    int rows = 0; /* the tile rows configured */
    for (int64_t p0 = 0; p0 < M; p0 += KQA_PANEL) {
        const int pm = (int)(M - p0 < KQA_PANEL ? M - p0 : KQA_PANEL);
        for (int m = 0; m < pm; m++)
            xr[m] = kern_q8_view(k->dt, (const char *)x + (size_t)(p0 + m) * xs, K);
        for (int64_t g = g0; g < g1; g += 2) {
            const uint8_t *gw0 = (const uint8_t *)wp + (size_t)g * gbytes, *gw1 = g + 1 < g1 ? gw0 + gbytes : NULL;
            for (int m = 0; m < pm; m++)
                for (int j = 0; j < 4; j++)
                    acc[m][j] = _mm512_setzero_ps();
            for (int64_t b0 = 0; b0 < nb; b0 += k->ch) {
                const int nbc = (int)(nb - b0 < k->ch ? nb - b0 : k->ch);
                stage(k, gw0, gw1, b0, nbc, &st);
                __asm__ volatile("" ::: "memory"); /* the staged tiles are in memory before the loads */
                for (int m0 = 0; m0 < pm; m0 += 16) {
                    const int mt = pm - m0 < 16 ? pm - m0 : 16;
                    if (mt != rows) {
                        kqa_config(mt, k->sub);
                        rows = mt;
                    }
                    kqa_products(nbc * subs, k->sub, xr[m0].qs + b0 * k->block, xs, &st, &sums);
                    scale(k, &st, &sums, b0, nbc, xr + m0, mt, acc + m0);
                }
            }
            const __mmask16 keep = (__mmask16)(gw1 ? 0xFFFFu : 0xFFu);
            for (int m = 0; m < pm; m++)
                _mm512_mask_storeu_ps(
                    y + (p0 + m) * ldy + g * KERN_QRP_ROWS, keep,
                    _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][2]), _mm512_add_ps(acc[m][1], acc[m][3])));
        }
    }
    if (rows) /* leaves the tile state to the kernel's lazy save again */
        _tile_release();
}

/* Defines NAME, the kern_qrp_matmul_fn of dtype DT on tiles: blocks of BLOCK values, sub-blocks
 * of SUB, staged by STAGE (a kqa_stage_fn) and scaled by SCALE (an always-inline function of the
 * dtype and kqa_scale_fn's other arguments, specialised here per dtype), VNNI (the VNNI
 * kernel) running fewer than MIN_M rows. */
#define KQA_DEFINE(NAME, DT, BLOCK, SUB, MIN_M, STAGE, SCALE, VNNI)                                                    \
    static KQA_TARGET void NAME##_scale(const kqa_kind *k, const kqa_stage *st, const kqa_sums *sums, int64_t b0,      \
                                        int nbc, const kern_q8_row *xr, int mt, __m512(*acc)[4]) {                     \
        (void)k;                                                                                                       \
        SCALE(DT, st, sums, b0, nbc, xr, mt, acc);                                                                     \
    }                                                                                                                  \
    static KQA_TARGET void NAME(const void *wp, int64_t K, const void *x, size_t xs, int64_t M, int64_t g0,            \
                                int64_t g1, float *y, int64_t ldy) {                                                   \
        const kqa_kind k = {.dt = DT,                                                                                  \
                            .block = BLOCK,                                                                            \
                            .sub = SUB,                                                                                \
                            .ch = KQA_TILES * (SUB) / (BLOCK),                                                         \
                            .min_m = MIN_M,                                                                            \
                            .ibb = KERN_QRP_ROWS * rlx_iface_dtype_block_bytes(DT)};                                   \
        kqa_matmul(&k, STAGE, NAME##_scale, VNNI, wp, K, x, xs, M, g0, g1, y, ldy);                                    \
    }

#endif
