/* BF16 matmuls on BF16 dot products: the copy, the AMX and AVX512-BF16 kernels and the matmul over
 * the backend's threads (kern_bf16.h). */
#include "kern_bf16.h"

#include <immintrin.h>
#include <string.h>

#include "kern.h"
#include "kern_amx.h"

void kern_bf16_pack(const uint16_t *w, int64_t N, int64_t K, int64_t g0, int64_t g1, uint16_t *dst) {
    const int64_t Kp = kern_bf16_kp(K);
    for (int64_t g = g0; g < g1; g++) {
        uint32_t *grp = (uint32_t *)(dst + (size_t)g * KERN_BF16_ROWS * (size_t)Kp);
        memset(grp, 0, (size_t)KERN_BF16_ROWS * (size_t)Kp * sizeof(uint16_t));
        for (int c = 0; c < KERN_BF16_ROWS && g * KERN_BF16_ROWS + c < N; c++) {
            const uint16_t *row = w + (size_t)(g * KERN_BF16_ROWS + c) * (size_t)K;
            /* pairs of k: dword (q, i) of the row goes to row i, column c of tile q */
            for (int64_t k = 0; k + 1 < K; k += 2) {
                uint32_t pair;
                memcpy(&pair, row + k, sizeof pair);
                grp[(k / KERN_BF16_K) * KERN_BF16_ROWS * KERN_BF16_ROWS + (k % KERN_BF16_K / 2) * KERN_BF16_ROWS + c] =
                    pair;
            }
            if (K % 2) /* the last value alone, its partner the zero of the padding */
                grp[(K / KERN_BF16_K) * KERN_BF16_ROWS * KERN_BF16_ROWS + (K % KERN_BF16_K / 2) * KERN_BF16_ROWS + c] =
                    row[K - 1];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// AMX

#define KA_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f")))

/* Rows of x one pass over a strip of weight groups covers: their BF16 tiles (about 64 KiB per
 * 1024 values of K) stay in L2 while the strip passes over them. */
#define KA_PANEL 128
/* Weight tiles a strip prefetches ahead of the one it multiplies (decode ran at half speed on
 * the hardware prefetchers alone: a tile load waits for all of its 16 lines). */
#define KA_AHEAD 8

/* Result tile of rows [m, m + 16) and weight rows [n, n + 16) out of the 16 x 16 F32 sums in
 * tmp: only the rows below M and the columns below n1 exist in y. */
static void kern_bf16_put(const float *tmp, int64_t m, int64_t M, int64_t n, int64_t n1, float *y, int64_t ldy) {
    const int64_t rows = M - m < 16 ? M - m : 16, cols = n1 - n < 16 ? n1 - n : 16;
    for (int64_t r = 0; r < rows; r++)
        memcpy(y + (m + r) * ldy + n, tmp + r * 16, (size_t)cols * sizeof(float));
}

/* Stores result tile T (rows m.., weight rows n..): straight into y when it lies inside, else
 * through tmp. */
#define KA_STORE(T, m, n)                                                                                              \
    do {                                                                                                               \
        if ((m) + 16 <= M && (n) + 16 <= n1) {                                                                         \
            _tile_stored(T, y + (m)*ldy + (n), ldy * (int64_t)sizeof(float));                                          \
        } else {                                                                                                       \
            _tile_stored(T, tmp, 16 * (int64_t)sizeof(float));                                                         \
            kern_bf16_put(tmp, m, M, n, n1, y, ldy);                                                                   \
        }                                                                                                              \
    } while (0)

/* One block of up to 32 rows of x (two_m: rows m + 16.. too) by up to 32 weight rows (two_n:
 * group g + 1 too): tiles 0-3 the sums, 4-5 x, 6-7 the weights. two_m and two_n are constants at
 * every call, so each case is its own loop. */
static inline __attribute__((always_inline)) KA_TARGET void
kern_amx_block(bool two_m, bool two_n, const uint16_t *tiles, int64_t Kp, const uint16_t *xb, int64_t m, int64_t M,
               int64_t g, int64_t n1, float *y, int64_t ldy, float *tmp) {
    const int64_t nq = Kp / KERN_BF16_K, tile = KERN_BF16_ROWS * KERN_BF16_K, xs = Kp * (int64_t)sizeof(uint16_t);
    const uint16_t *b0 = tiles + (size_t)g * (size_t)nq * tile, *b1 = b0 + (size_t)nq * tile;
    const uint16_t *a0 = xb + (size_t)m * (size_t)Kp, *a1 = a0 + 16 * (size_t)Kp;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t q = 0; q < nq; q++) {
        for (int l = 0; l < 16; l++) {
            _mm_prefetch((const char *)(b0 + (q + KA_AHEAD) * tile) + 64 * l, _MM_HINT_T0);
            if (two_n)
                _mm_prefetch((const char *)(b1 + (q + KA_AHEAD) * tile) + 64 * l, _MM_HINT_T0);
        }
        _tile_loadd(4, a0 + q * KERN_BF16_K, xs);
        _tile_loadd(6, b0 + q * tile, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two_n) {
            _tile_loadd(7, b1 + q * tile, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (two_m) {
            _tile_loadd(5, a1 + q * KERN_BF16_K, xs);
            _tile_dpbf16ps(2, 5, 6);
            if (two_n)
                _tile_dpbf16ps(3, 5, 7);
        }
    }
    const int64_t n = g * KERN_BF16_ROWS;
    KA_STORE(0, m, n);
    if (two_n)
        KA_STORE(1, m, n + 16);
    if (two_m) {
        KA_STORE(2, m + 16, n);
        if (two_n)
            KA_STORE(3, m + 16, n + 16);
    }
}
#undef KA_STORE

KA_TARGET void kern_bf16_part_amx(const uint16_t *tiles, int64_t K, const uint16_t *xb, int64_t M, int64_t n0,
                                  int64_t n1, float *y, int64_t ldy) {
    static const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    static const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64}; /* every tile 16 rows of 64 bytes */
    _Alignas(64) float tmp[16 * 16];
    const int64_t Kp = kern_bf16_kp(K), g0 = n0 / KERN_BF16_ROWS, g1 = (n1 + KERN_BF16_ROWS - 1) / KERN_BF16_ROWS;
    /* the tile loads are asm without memory operands: x's conversion must be complete in memory */
    __asm__ volatile("" ::: "memory");
    kern_amx_config(rows, colsb);
    for (int64_t p0 = 0; p0 < M; p0 += KA_PANEL) {
        const int64_t p1 = M - p0 < KA_PANEL ? M : p0 + KA_PANEL;
        for (int64_t g = g0; g < g1; g += 2) {
            const bool two_n = g + 1 < g1;
            for (int64_t m = p0; m < p1; m += 32) {
                if (m + 16 < p1) {
                    if (two_n)
                        kern_amx_block(true, true, tiles, Kp, xb, m, M, g, n1, y, ldy, tmp);
                    else
                        kern_amx_block(true, false, tiles, Kp, xb, m, M, g, n1, y, ldy, tmp);
                } else if (two_n) {
                    kern_amx_block(false, true, tiles, Kp, xb, m, M, g, n1, y, ldy, tmp);
                } else {
                    kern_amx_block(false, false, tiles, Kp, xb, m, M, g, n1, y, ldy, tmp);
                }
            }
        }
    }
    /* leaves the tile state to the kernel's lazy save again (and other code's AVX-512 clocks) */
    _tile_release();
}

// ---------------------------------------------------------------------------------------------
// AVX512-BF16: outer products of 16 features by RM rows of x, one 64-byte line of the copy (a
// pair of k for 16 weight rows) times the broadcast pair of each row

#define KD_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
/* Lines of the copy a stream prefetches ahead of the one it multiplies. */
#define KD_AHEAD 16

/* Rows [m, m + RM) of x by groups [g, g + RN): RM * RN accumulators of 16 outputs, each summing
 * its pairs in order of k. RM and RN are constants at every call. */
static inline __attribute__((always_inline)) KD_TARGET void kern_bf16_dp_block(int RM, int RN, const uint16_t *copy,
                                                                               int64_t Kp, const uint16_t *xb,
                                                                               int64_t m, int64_t g, int64_t n1,
                                                                               float *y, int64_t ldy) {
    __m512 acc[8][3];
    for (int i = 0; i < RM; i++)
        for (int r = 0; r < RN; r++)
            acc[i][r] = _mm512_setzero_ps();
    const int64_t np = Kp / 2, group = np * KERN_BF16_ROWS * 2; /* pairs, and uint16 per group */
    const uint16_t *b0 = copy + (size_t)g * (size_t)group;
    const uint16_t *a0 = xb + (size_t)m * (size_t)Kp;
    for (int64_t p = 0; p < np; p++) {
        __m512bh b[3];
        for (int r = 0; r < RN; r++) {
            const uint16_t *line = b0 + (size_t)r * (size_t)group + (size_t)p * 32;
            _mm_prefetch((const char *)(line + KD_AHEAD * 32), _MM_HINT_T0);
            b[r] = (__m512bh)_mm512_loadu_si512(line);
        }
        for (int i = 0; i < RM; i++) {
            int32_t pair;
            memcpy(&pair, a0 + (size_t)i * (size_t)Kp + 2 * p, sizeof pair);
            const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
            for (int r = 0; r < RN; r++)
                acc[i][r] = _mm512_dpbf16_ps(acc[i][r], a, b[r]);
        }
    }
    for (int r = 0; r < RN; r++) {
        const int64_t n = (g + r) * KERN_BF16_ROWS, cols = n1 - n < 16 ? n1 - n : 16;
        const __mmask16 keep = (__mmask16)((1u << cols) - 1u);
        for (int i = 0; i < RM; i++)
            _mm512_mask_storeu_ps(y + (m + i) * ldy + n, keep, acc[i][r]);
    }
}

/* Every (RM, RN) the part uses, as its own loop. */
#define KD_BLOCK(RM, RN) kern_bf16_dp_block(RM, RN, copy, Kp, xb, m, g, n1, y, ldy)
#define KD_ROWS(RN)                                                                                                    \
    do {                                                                                                               \
        int64_t m = 0;                                                                                                 \
        for (; m + 8 <= M; m += 8)                                                                                     \
            KD_BLOCK(8, RN);                                                                                           \
        if (m + 4 <= M) {                                                                                              \
            KD_BLOCK(4, RN);                                                                                           \
            m += 4;                                                                                                    \
        }                                                                                                              \
        if (m + 2 <= M) {                                                                                              \
            KD_BLOCK(2, RN);                                                                                           \
            m += 2;                                                                                                    \
        }                                                                                                              \
        if (m < M)                                                                                                     \
            KD_BLOCK(1, RN);                                                                                           \
    } while (0)

KD_TARGET void kern_bf16_part_dp(const uint16_t *copy, int64_t K, const uint16_t *xb, int64_t M, int64_t n0, int64_t n1,
                                 float *y, int64_t ldy) {
    const int64_t Kp = kern_bf16_kp(K), g1 = (n1 + KERN_BF16_ROWS - 1) / KERN_BF16_ROWS;
    int64_t g = n0 / KERN_BF16_ROWS;
    for (; g + 3 <= g1; g += 3)
        KD_ROWS(3);
    if (g + 2 <= g1)
        KD_ROWS(2);
    else if (g < g1)
        KD_ROWS(1);
}
#undef KD_ROWS
#undef KD_BLOCK

// ---------------------------------------------------------------------------------------------
// The matmul over the backend's threads

/* Rows of x up to which the AMX level multiplies on VDPBF16PS rather than tiles (unless the
 * backend asks for batch invariance: the two kernels round differently): a tile computes 16 rows
 * whatever M is, and measured on a Sapphire Rapids Xeon with 2 threads, decode (M = 1) ran at
 * 23.7 against 21.5 tokens/s and 4-row prefill at 91 against 86, while 8 rows ran at 145
 * against 164 and 32 at 197 against 575. */
#define KERN_BF16_DP_ROWS 4

bool kern_bf16_weight(const kern_ctx *c, const rlx_tensor *w) {
    return c->isa >= PLUGIN_ISA_AVX512_BF16 && w->n_dims == 2 && w->dtype == RLX_DTYPE_BF16;
}

bool kern_bf16_use(const kern_ctx *c, const rlx_weight_info *w) {
    return kern_matmul_weight_use(w) && kern_bf16_weight(c, w->tensor);
}

typedef struct kern_bf16_job {
    kern_ctx *c;
    const float *x;
    uint16_t *xb;
    const uint16_t *tiles;
    const float *bias;
    float *y;
    int64_t M, K, N;
    kern_bf16_part_fn part; /* the level's kernel */
} kern_bf16_job;

/* Rows [i0, i1) of x to BF16, each zero-padded to Kp; the padding rows after M are zeros. */
static void kern_bf16_round_rows(void *ctx, int ith, int64_t i0, int64_t i1) {
    const kern_bf16_job *j = ctx;
    const int64_t Kp = kern_bf16_kp(j->K);
    (void)ith;
    for (int64_t m = i0; m < i1; m++) {
        uint16_t *row = j->xb + (size_t)m * (size_t)Kp;
        if (m < j->M) {
            j->c->k->to_bf16(j->x + m * j->K, row, j->K);
            memset(row + j->K, 0, (size_t)(Kp - j->K) * sizeof(uint16_t));
        } else {
            memset(row, 0, (size_t)Kp * sizeof(uint16_t));
        }
    }
}

static void kern_bf16_range(void *ctx, int ith, int64_t n0, int64_t n1) {
    const kern_bf16_job *j = ctx;
    (void)ith;
    j->part(j->tiles, j->K, j->xb, j->M, n0, n1, j->y, j->N);
    if (j->bias)
        for (int64_t m = 0; m < j->M; m++)
            j->c->k->add(j->y + m * j->N + n0, j->bias + n0, j->y + m * j->N + n0, n1 - n0);
}

int kern_bf16_matmul(kern_ctx *c, const float *x, int64_t M, const rlx_tensor *w, const kern_qrp_weight *copy,
                     const float *bias, float *y) {
    const int64_t N = w->shape[0], K = w->shape[1];
    if (kern_matmul_trivial(M, K, N, bias, y))
        return RLX_OK;
    void *own = NULL;
    if (!copy) { /* a node run outside a plan: a copy for this call alone */
        own = c->host->alloc(kern_bf16_bytes(N, K), KERN_ALIGN);
        if (!own)
            return c->host->error(RLX_E_NOMEM, "%s: out of memory for the tiles of a %lldx%lld BF16 weight", c->plugin,
                                  (long long)N, (long long)K);
        kern_bf16_pack(w->data, N, K, 0, kern_bf16_groups(N), own);
    }
    const int64_t Mp = (M + 15) / 16 * 16, Kp = kern_bf16_kp(K);
    int rc = kern_reserve(c, &c->qx, (size_t)(Mp * Kp) * sizeof(uint16_t));
    if (rc == RLX_OK) {
        kern_bf16_job j = {.c = c,
                           .x = x,
                           .xb = c->qx.p,
                           .tiles = copy ? copy->data : own,
                           .bias = bias,
                           .y = y,
                           .M = M,
                           .K = K,
                           .N = N,
                           .part = c->isa == PLUGIN_ISA_AMX && (c->batch_invariant || M > KERN_BF16_DP_ROWS)
                                       ? kern_bf16_part_amx
                                       : kern_bf16_part_dp};
        c->par.parallel_for(c->par.self, Mp, 1, Mp * K, kern_bf16_round_rows, &j);
        c->par.parallel_for(c->par.self, N, KERN_BF16_ROWS, M * N * K, kern_bf16_range, &j);
    }
    c->host->free(own);
    return rc;
}
