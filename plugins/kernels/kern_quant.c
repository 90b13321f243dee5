/* Quantized matmuls of the kernel library (kern_quant.h): the activation quantizers, the
 * portable C kernels (the integer reference every other level must equal) and kern_qmatmul. */
#include "kern_quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kern.h"
#include "kern_qblock.h"

bool kern_quant_supported(int dt) { return dt >= RLX_DTYPE_Q4_0 && dt <= RLX_DTYPE_Q6_K; }

static bool kern_q8_is_k(int dt) { return rlx_iface_dtype_block((uint32_t)dt) == RLX_QK_K; }

size_t kern_q8_row_bytes(int dt, int64_t K) {
    if (!kern_quant_supported(dt) || rlx_iface_row_bytes((uint32_t)dt, K) == 0)
        return 0;
    const int64_t nb = K / rlx_iface_dtype_block((uint32_t)dt);
    /* qs, d, then s and sum per 32-value block, or bsums per 16 values */
    const size_t bytes = kern_q8_is_k(dt) ? (size_t)(K + 4 * nb + K / 8) : (size_t)(K + 10 * nb);
    return kern_align_up(bytes);
}

kern_q8_row kern_q8_view(int dt, const void *row, int64_t K) {
    const char *p = row;
    const int64_t nb = K / rlx_iface_dtype_block((uint32_t)dt);
    kern_q8_row r = {.qs = (const int8_t *)p, .d = (const float *)(p + K)};
    if (kern_q8_is_k(dt)) {
        r.sums = (const int16_t *)(p + K + 4 * nb);
    } else {
        r.s = (const float *)(p + K + 4 * nb);
        r.sums = (const int16_t *)(p + K + 8 * nb);
    }
    return r;
}

static float kern_f16_round(float f) { return rlx_iface_f16_to_f32(rlx_iface_f32_to_f16(f)); }

/* Blocks of 32 (llama.cpp's x86 quantize_row_q8_0 / _q8_1). */
static void kern_q8_quantize_32(const float *x, int64_t K, int8_t *qs, float *d, float *s, int16_t *sums) {
    for (int64_t b = 0; b < K / RLX_QK; b++) {
        const float *xb = x + b * RLX_QK;
        float amax = 0.0f;
        for (int j = 0; j < RLX_QK; j++) {
            const float a = fabsf(xb[j]);
            amax = amax > a ? amax : a; /* llama.cpp's MAX (and maxps): NaN wins */
        }
        const float db = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < RLX_QK; j++) {
            /* |x * id| <= 127 (up to a rounding of the product), so the int8 holds it */
            const int q = (int)rintf(xb[j] * id);
            qs[b * RLX_QK + j] = (int8_t)q;
            sum += q;
        }
        d[b] = kern_f16_round(db);
        s[b] = kern_f16_round(db * (float)sum);
        sums[b] = (int16_t)sum;
    }
}

/* Blocks of 256 (llama.cpp's quantize_row_q8_K_ref). */
static void kern_q8_quantize_k(const float *x, int64_t K, int8_t *qs, float *d, int16_t *bsums) {
    for (int64_t b = 0; b < K / RLX_QK_K; b++) {
        const float *xb = x + b * RLX_QK_K;
        int8_t *q = qs + b * RLX_QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < RLX_QK_K; j++)
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        if (amax == 0.0f) {
            d[b] = 0.0f;
            memset(q, 0, RLX_QK_K);
            memset(bsums + b * 16, 0, 16 * sizeof *bsums);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < RLX_QK_K; j++) {
            /* nearest_int: to nearest, ties to even (the default rounding mode) */
            const int v = (int)rintf(iscale * xb[j]);
            q[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += q[g * 16 + j];
            bsums[b * 16 + g] = (int16_t)sum;
        }
        d[b] = 1.0f / iscale;
    }
}

void kern_q8_quantize_row(int dt, const float *x, int64_t K, void *dst) {
    const kern_q8_row r = kern_q8_view(dt, dst, K);
    if (kern_q8_is_k(dt))
        kern_q8_quantize_k(x, K, (int8_t *)r.qs, (float *)r.d, (int16_t *)r.sums);
    else
        kern_q8_quantize_32(x, K, (int8_t *)r.qs, (float *)r.d, (float *)r.s, (int16_t *)r.sums);
}

// ---------------------------------------------------------------------------------------------
// Portable C: each block decoded to its integers, the dot products summed exactly

/* The 32 stored integers of a 32-value block (unsigned for Q4/Q5, signed for Q8_0). */
static void kern_qc_decode32(int dt, const uint8_t *blk, int q[RLX_QK]) {
    const uint8_t *qs = blk + kern_qb_qs(dt);
    if (dt == RLX_DTYPE_Q8_0) {
        for (int j = 0; j < RLX_QK; j++)
            q[j] = (int8_t)qs[j];
        return;
    }
    const bool five = dt == RLX_DTYPE_Q5_0 || dt == RLX_DTYPE_Q5_1;
    const uint32_t qh = five ? rlx_iface_q5_high_bits(blk + kern_qb_qh(dt)) : 0;
    for (int j = 0; j < RLX_QK / 2; j++) {
        q[j] = (int)((qs[j] & 0xF) | (((qh >> j) & 1u) << 4));
        q[j + 16] = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    }
}

static float kern_qc_row32(int dt, const uint8_t *w, int64_t nb, const kern_q8_row *x) {
    const size_t bb = rlx_iface_dtype_block_bytes((uint32_t)dt);
    const int offset = kern_qb_offset(dt), has_min = kern_qb_has_min(dt);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * bb;
        int q[RLX_QK];
        kern_qc_decode32(dt, blk, q);
        int32_t isum = 0;
        for (int j = 0; j < RLX_QK; j++)
            isum += q[j] * x->qs[b * RLX_QK + j];
        isum -= offset * x->sums[b];
        const float mw = has_min ? rlx_iface_f16_to_f32(kern_qb_u16(blk + KQ_OFF_M)) : 0.0f;
        kern_qb_add32(acc, b, rlx_iface_f16_to_f32(kern_qb_u16(blk + KQ_OFF_D)), x->d[b], isum, mw,
                      has_min ? x->s[b] : 0.0f, has_min);
    }
    return kern_qb_total(acc);
}

/* The 256 stored integers of a K block, its 8 (Q4_K, Q5_K) or 16 (Q6_K) sub-block scales, its
 * 8 minimums, and d, dmin. */
static void kern_qc_decodek(int dt, const uint8_t *blk, int q[RLX_QK_K], int sc[16], int mn[8], float *d, float *dmin) {
    if (dt == RLX_DTYPE_Q6_K) {
        const rlx_block_q6_k *b6 = (const rlx_block_q6_k *)blk;
        for (int e = 0; e < RLX_QK_K; e++) {
            const int h = e / 128, qn = (e % 128) / 32, l = e % 32;
            const uint8_t lo = b6->ql[64 * h + 32 * (qn & 1) + l];
            q[e] = (int)((qn < 2 ? lo & 0xF : lo >> 4) | (((b6->qh[32 * h + l] >> (2 * qn)) & 3) << 4));
        }
        for (int i = 0; i < 16; i++)
            sc[i] = b6->scales[i];
        *d = rlx_iface_f16_to_f32(b6->d);
        *dmin = 0.0f;
        return;
    }
    /* Q4_K and Q5_K share d, dmin and scales; qs follows qh in Q5_K */
    const rlx_block_q4_k *b4 = (const rlx_block_q4_k *)blk;
    const bool five = dt == RLX_DTYPE_Q5_K;
    const uint8_t *qh = five ? ((const rlx_block_q5_k *)blk)->qh : NULL;
    const uint8_t *qs = five ? ((const rlx_block_q5_k *)blk)->qs : b4->qs;
    for (int s = 0; s < 8; s++) {
        uint8_t scale, m;
        rlx_iface_q4k_scale(b4->scales, s, &scale, &m);
        sc[s] = scale;
        mn[s] = m;
        for (int l = 0; l < 32; l++) {
            const uint8_t byte = qs[32 * (s / 2) + l];
            q[32 * s + l] = (int)((s & 1 ? byte >> 4 : byte & 0xF) | (five ? ((qh[l] >> s) & 1) << 4 : 0));
        }
    }
    *d = rlx_iface_f16_to_f32(b4->d);
    *dmin = rlx_iface_f16_to_f32(b4->dmin);
}

static float kern_qc_rowk(int dt, const uint8_t *w, int64_t nb, const kern_q8_row *x) {
    const size_t bb = rlx_iface_dtype_block_bytes((uint32_t)dt);
    const bool six = dt == RLX_DTYPE_Q6_K;
    const int group = six ? 16 : 32; /* values per sub-block scale */
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < nb; b++) {
        int q[RLX_QK_K], sc[16], mn[8];
        float d, dmin;
        kern_qc_decodek(dt, w + (size_t)b * bb, q, sc, mn, &d, &dmin);
        const int8_t *xq = x->qs + b * RLX_QK_K;
        const int16_t *bs = x->sums + b * 16;
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < RLX_QK_K / group; s++) {
            int32_t dot = 0;
            for (int l = 0; l < group; l++)
                dot += q[s * group + l] * xq[s * group + l];
            isum += sc[s] * dot;
        }
        if (six) {
            for (int i = 0; i < 16; i++)
                isum -= 32 * sc[i] * bs[i];
        } else {
            for (int s = 0; s < 8; s++)
                msum += mn[s] * (bs[2 * s] + bs[2 * s + 1]);
        }
        acc[b & 3] += kern_qb_valuek(x->d[b], d, isum, dmin, msum, !six);
    }
    return kern_qb_total(acc);
}

static void kern_qc_gemv(int dt, int M, const void *w, int64_t K, const void *x, size_t x_stride, int64_t n0,
                         int64_t n1, float *y, int64_t ldy) {
    const int64_t nb = K / rlx_iface_dtype_block((uint32_t)dt);
    const size_t row_bytes = rlx_iface_row_bytes((uint32_t)dt, K);
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)n * row_bytes;
        for (int m = 0; m < M; m++) {
            const kern_q8_row xr = kern_q8_view(dt, (const char *)x + (size_t)m * x_stride, K);
            y[m * ldy + n] = kern_q8_is_k(dt) ? kern_qc_rowk(dt, wr, nb, &xr) : kern_qc_row32(dt, wr, nb, &xr);
        }
    }
}

#define KQC_DEF(DT, NAME, M)                                                                                           \
    static void kern_qc_##NAME##_##M(const void *w, int64_t K, const void *x, size_t xs, int64_t n0, int64_t n1,       \
                                     float *y, int64_t ldy) {                                                          \
        kern_qc_gemv(DT, M, w, K, x, xs, n0, n1, y, ldy);                                                              \
    }
#define KQC_FOR_M(DT, NAME) KQC_DEF(DT, NAME, 1) KQC_DEF(DT, NAME, 2) KQC_DEF(DT, NAME, 3) KQC_DEF(DT, NAME, 4)
#define KQC_ROW(NAME)                                                                                                  \
    { kern_qc_##NAME##_1, kern_qc_##NAME##_2, kern_qc_##NAME##_3, kern_qc_##NAME##_4 }
KQC_FOR_M(RLX_DTYPE_Q4_0, q4_0)
KQC_FOR_M(RLX_DTYPE_Q4_1, q4_1)
KQC_FOR_M(RLX_DTYPE_Q5_0, q5_0)
KQC_FOR_M(RLX_DTYPE_Q5_1, q5_1)
KQC_FOR_M(RLX_DTYPE_Q8_0, q8_0)
KQC_FOR_M(RLX_DTYPE_Q4_K, q4_k)
KQC_FOR_M(RLX_DTYPE_Q5_K, q5_k)
KQC_FOR_M(RLX_DTYPE_Q6_K, q6_k)

static const kern_qsimd kern_qsimd_c = {
    .isa = "c",
    .quantize = kern_q8_quantize_row,
    .gemv = {[RLX_DTYPE_Q4_0] = KQC_ROW(q4_0),
             [RLX_DTYPE_Q4_1] = KQC_ROW(q4_1),
             [RLX_DTYPE_Q5_0] = KQC_ROW(q5_0),
             [RLX_DTYPE_Q5_1] = KQC_ROW(q5_1),
             [RLX_DTYPE_Q8_0] = KQC_ROW(q8_0),
             [RLX_DTYPE_Q4_K] = KQC_ROW(q4_k),
             [RLX_DTYPE_Q5_K] = KQC_ROW(q5_k),
             [RLX_DTYPE_Q6_K] = KQC_ROW(q6_k)},
};

/* kern_qsimd.c */
extern const kern_qsimd kern_q_qsimd_avx2, kern_q_qsimd_avx512, kern_q_qsimd_avx512_vnni;

bool kern_quant_vnni(void) {
    const char *env = getenv("RLX_QUANT_VNNI");
    if (env && !strcmp(env, "0"))
        return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
}

const kern_qsimd *kern_qsimd_at(plugin_isa isa) {
    switch (isa) {
    case PLUGIN_ISA_AVX2:
        return &kern_q_qsimd_avx2;
    case PLUGIN_ISA_AVX512:
    case PLUGIN_ISA_AVX512_BF16:
    case PLUGIN_ISA_AMX:
        return kern_quant_vnni() ? &kern_q_qsimd_avx512_vnni : &kern_q_qsimd_avx512;
    default:
        return &kern_qsimd_c;
    }
}

// ---------------------------------------------------------------------------------------------
// kern_qmatmul

/* Weight bytes of the rows a range walks through for every group of activation rows before
 * moving on, so that later groups find them in L2. */
#define KERN_QTILE_BYTES (128 * 1024)

typedef struct kern_qmm {
    const kern_qsimd *q;
    const float *x; /* [M, K] */
    const void *w;  /* [N] rows of dtype dt */
    const float *bias;
    float *y; /* [M, N] */
    void *xq; /* [M] quantized rows of xq_stride bytes */
    size_t xq_stride, w_row;
    int64_t M, K, N;
    int dt;
} kern_qmm;

static void kern_qmm_quantize(void *ctx, int ith, int64_t r0, int64_t r1) {
    const kern_qmm *j = ctx;
    (void)ith;
    for (int64_t r = r0; r < r1; r++)
        j->q->quantize(j->dt, j->x + r * j->K, j->K, (char *)j->xq + (size_t)r * j->xq_stride);
}

int kern_q8_quantize(kern_ctx *c, int dt, const float *x, int64_t M, int64_t K, kern_buf *buf, size_t *stride) {
    kern_qmm j = {.q = c->q, .x = x, .M = M, .K = K, .dt = dt, .xq_stride = kern_q8_row_bytes(dt, K)};
    if (j.xq_stride == 0)
        return c->host->error(RLX_E_SHAPE, "%s: %lld values are not a whole number of blocks of dtype %d", c->plugin,
                              (long long)K, dt);
    const int rc = kern_reserve(c, buf, (size_t)M * j.xq_stride);
    if (rc < 0)
        return rc;
    j.xq = buf->p;
    c->par.parallel_for(c->par.self, M, 1, M * K, kern_qmm_quantize, &j);
    *stride = j.xq_stride;
    return RLX_OK;
}

void kern_qmatmul_part(const kern_qsimd *q, int dt, const void *xq, size_t stride, int64_t M, int64_t K, const void *w,
                       int64_t cnt, const float *bias, float *y, int64_t ldy) {
    const size_t w_row = rlx_iface_row_bytes((uint32_t)dt, K);
    int64_t tile = (int64_t)(KERN_QTILE_BYTES / w_row);
    tile = tile < 1 ? 1 : tile;
    for (int64_t t0 = 0; t0 < cnt; t0 += tile) {
        const int64_t t1 = t0 + tile < cnt ? t0 + tile : cnt;
        for (int64_t m0 = 0; m0 < M; m0 += KERN_QGEMV_MAX_M) {
            const int64_t mb = M - m0 < KERN_QGEMV_MAX_M ? M - m0 : KERN_QGEMV_MAX_M;
            q->gemv[dt][mb - 1](w, K, (const char *)xq + (size_t)m0 * stride, stride, t0, t1, y + m0 * ldy, ldy);
        }
        if (bias)
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = t0; n < t1; n++)
                    y[m * ldy + n] += bias[n];
    }
}

static void kern_qmm_range(void *ctx, int ith, int64_t n0, int64_t n1) {
    const kern_qmm *j = ctx;
    (void)ith;
    kern_qmatmul_part(j->q, j->dt, j->xq, j->xq_stride, j->M, j->K, (const char *)j->w + (size_t)n0 * j->w_row, n1 - n0,
                      j->bias ? j->bias + n0 : NULL, j->y + n0, j->N);
}

int kern_qmatmul(kern_ctx *c, const float *x, int64_t M, int64_t K, const void *w, int dt, int64_t N, const float *bias,
                 float *y) {
    if (kern_matmul_trivial(M, K, N, bias, y))
        return RLX_OK;
    kern_qmm j = {.q = c->q, .w = w, .bias = bias, .y = y, .M = M, .K = K, .N = N, .dt = dt};
    j.w_row = rlx_iface_row_bytes((uint32_t)dt, K);
    const int rc = kern_q8_quantize(c, dt, x, M, K, &c->qx, &j.xq_stride);
    if (rc < 0)
        return rc;
    j.xq = c->qx.p;
    c->par.parallel_for(c->par.self, N, KERN_ROW_ALIGN, M * N * K, kern_qmm_range, &j);
    return RLX_OK;
}
