/* The checks of the kit, in report order: for each op the cases with random inputs (compared
 * with the core's reference kernels), then the NumPy fixtures, then the whole-model checks.
 * Case tables cover the edges backends get wrong: one token, odd sizes, long sequences, GQA
 * ratios 1/2/4/8, sliding windows, positions far from 0, MoE with several experts and top-k,
 * partial rotation, recurrent states carried over calls, reset and interleaved by slot, calls
 * that must fail, and every weight dtype. Inputs are drawn from a generator seeded by the case
 * name, so a worker restarted after a crash rebuilds exactly the same case. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kit.h"

// ---------------------------------------------------------------------------------------------
// Tolerances and helpers

double kit_default_tol(int slot) {
    switch (slot) {
    case RLX_OP_EMBED:
    case RLX_OP_ADD:
    case RLX_OP_GATHER_LAST:
    case RLX_OP_CONCAT:
    case RLX_OP_GATHER_ROWS:
        return 0; /* copies and one rounding: exact */
    case RLX_OP_SWIGLU:
    case RLX_OP_SIGMOID_MUL:
        return 1e-6;
    case RLX_OP_RMS_NORM:
        return 1e-5;
    case RLX_OP_SSM_CONV:
    case RLX_OP_GATED_DELTA:
        /* F32 sums (K taps and a SiLU; Dk-term dot products and a state carried over up to 150
         * rows, whose decays <= 1 shrink older rounding) and, in GATED_DELTA, two forms
         * (recurrent, chunk-parallel) that round differently: a few F32 epsilons of
         * max|want| (tests/kernels/test_hybrid_ops.c measured up to 4e-7; the in-tree
         * backends here up to 2e-7), while a real fault (a wrong decay, a skipped reset, a row
         * of another slot, a lost chunk boundary) is 1e-2 or more. States get the same bound. */
        return 1e-5;
    case RLX_OP_MATMUL:
    case RLX_OP_ROPE:
    case RLX_OP_ATTENTION:
    case RLX_OP_MOE:
        return 2e-5;
    case KIT_TOL_MODEL:
        return 1e-4; /* as tests/model/check_golden.py */
    default:
        return 0;
    }
}

double kit_node_tol(const kit_options *o, const kit_node *node) { return o->tol[node->op]; }

// ---------------------------------------------------------------------------------------------
// Random inputs

typedef struct rng {
    uint64_t s;
} rng;

static float uniform(rng *r) { /* in [-1, 1) */
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((r->s >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static uint64_t seed_of(const char *name) { /* FNV-1a */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *name; name++)
        h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
    return h;
}

static rlx_tensor shape2(uint32_t dtype, int64_t rows, int64_t cols) {
    return (rlx_tensor){.dtype = dtype, .n_dims = 2, .shape = {rows, cols, 1, 1}};
}

static rlx_tensor shape1(uint32_t dtype, int64_t n) {
    return (rlx_tensor){.dtype = dtype, .n_dims = 1, .shape = {n, 1, 1, 1}};
}

static void fill_quant(rng *r, rlx_tensor *t, float scale);

static void fill(rng *r, rlx_tensor *t, float scale) {
    if (rlx_iface_dtype_is_quantized(t->dtype)) {
        fill_quant(r, t, scale);
        return;
    }
    int64_t n = rlx_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        float v = uniform(r) * scale;
        if (t->dtype == RLX_DTYPE_F32)
            ((float *)t->data)[i] = v;
        else if (t->dtype == RLX_DTYPE_BF16)
            ((uint16_t *)t->data)[i] = kit_f32_to_bf16(v);
        else
            ((uint16_t *)t->data)[i] = kit_f32_to_f16(v);
    }
}

static const uint32_t dtypes[] = {RLX_DTYPE_F32, RLX_DTYPE_BF16, RLX_DTYPE_F16};

/* The block-quantized weight types (ABI 1.3). */
static const uint32_t qtypes[] = {RLX_DTYPE_Q4_0, RLX_DTYPE_Q4_1, RLX_DTYPE_Q5_0, RLX_DTYPE_Q5_1,
                                  RLX_DTYPE_Q8_0, RLX_DTYPE_Q4_K, RLX_DTYPE_Q5_K, RLX_DTYPE_Q6_K};
#define N_QTYPES 8

/* Random blocks of a quantized tensor: every bit pattern of the packed values and sub-block scales
 * is a valid block, so those are random bytes; the F16 block scales are set so that values are
 * typically about `scale` (the typical stored integer times the scale factors, converted exactly,
 * subnormals included), and minimums (Q4_1, Q5_1, and the K types' dmin) are random, of either
 * sign where the format has one. */
static void fill_quant(rng *r, rlx_tensor *t, float scale) {
    const size_t bytes = rlx_iface_tensor_bytes(t), block = rlx_iface_dtype_block_bytes(t->dtype);
    uint8_t *p = t->data;
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)((uniform(r) * 0.5f + 0.5f) * 256.0f);
    for (size_t b = 0; b < bytes; b += block) {
        const float u = 0.5f + 0.5f * fabsf(uniform(r)), v = uniform(r);
        uint16_t d = 0, m = 0;
        size_t d_at = 0, m_at = 2;
        switch (t->dtype) {
        case RLX_DTYPE_Q4_0: /* (q - 8) d: typically |q - 8| ~ 4 */
            d = rlx_iface_f32_to_f16(u * scale / 4.0f);
            break;
        case RLX_DTYPE_Q5_0:
            d = rlx_iface_f32_to_f16(u * scale / 8.0f);
            break;
        case RLX_DTYPE_Q8_0:
            d = rlx_iface_f32_to_f16(u * scale / 64.0f);
            break;
        case RLX_DTYPE_Q4_1: /* q d + m, q < 16 or 32 */
        case RLX_DTYPE_Q5_1:
            d = rlx_iface_f32_to_f16(u * scale / (t->dtype == RLX_DTYPE_Q4_1 ? 8.0f : 16.0f));
            m = rlx_iface_f32_to_f16(-scale + 0.2f * v * scale);
            break;
        case RLX_DTYPE_Q4_K: /* d sc q - dmin mn, sc and mn < 64 (typically 32), q < 16 or 32 */
        case RLX_DTYPE_Q5_K:
            d = rlx_iface_f32_to_f16(u * scale / (32.0f * (t->dtype == RLX_DTYPE_Q4_K ? 8.0f : 16.0f)));
            m = rlx_iface_f32_to_f16(fabsf(v) * scale / 32.0f);
            break;
        case RLX_DTYPE_Q6_K: /* d sc (q - 32), |sc| typically 64, |q - 32| typically 16 */
            d = rlx_iface_f32_to_f16(u * scale / (64.0f * 16.0f));
            d_at = block - 2;
            break;
        default:
            break;
        }
        memcpy(p + b + d_at, &d, 2);
        if (m)
            memcpy(p + b + m_at, &m, 2);
    }
}

// ---------------------------------------------------------------------------------------------
// Case tables (KIT_SRC_REF)

static const struct {
    int64_t t, k, n;
} matmul_cases[] = {{1, 64, 96},   {1, 33, 17},     {3, 1024, 256}, {7, 130, 65}, {64, 256, 300},
                    {130, 96, 64}, {1, 3072, 1024}, {512, 64, 48},  {2, 1, 5}};

static const struct { int64_t t, v, h; } embed_cases[] = {{1, 37, 19}, {5, 37, 19}, {9, 37, 19}, {512, 1000, 64}};

/* Quantized weights: K a whole number of 256-value blocks (every type's block divides it); a
 * decode row, a few rows, N not a multiple of any blocking, a prefill, a long K. */
static const struct {
    int64_t t, k, n;
} qmatmul_cases[] = {{1, 256, 96}, {3, 512, 33}, {9, 1024, 64}, {130, 256, 48}, {1, 3072, 128}};

static const struct { int64_t t, v, h; } qembed_cases[] = {{5, 37, 256}, {64, 300, 512}};

static const struct {
    int64_t t, c, g;
    float eps;
} norm_cases[] = {{1, 1024, 1024, 1e-6f}, {5, 64, 16, 1e-6f},     {3, 2048, 128, 1e-6f}, {2, 7, 7, 1e-5f},
                  {4, 33, 11, 1e-6f},     {512, 256, 128, 1e-6f}, {1, 1, 1, 1e-6f}};

/* factors: the node has ABI 1.5's third input, per-pair frequency divisors (Llama 3.1);
 * rope_dims (ABI 1.6, partial rotation): only the first rope_dims values of each head turn, as
 * a head of rope_dims would (Qwen3.5: 64 of 256), the rest pass; rope_dims == D is the whole
 * head, and 2 a single pair. */
static const struct {
    int64_t t, heads, d;
    int32_t first;
    float theta;
    int factors;
    uint32_t rope_dims;
} rope_cases[] = {
    {1, 2, 16, 0, 10000, 0, 0},       {6, 4, 128, 0, 1000000, 0, 0},      {3, 3, 64, 1000, 1000000, 0, 0},
    {2, 1, 8, 5000, 10000, 0, 0},     {512, 8, 64, 0, 1000000, 0, 0},     {1, 16, 128, 30000, 1000000, 0, 0},
    {7, 5, 2, 11, 10000, 0, 0},       {5, 4, 64, 0, 500000, 1, 0},        {3, 2, 128, 20000, 500000, 1, 0},
    {1, 1, 2, 7, 10000, 1, 0},        {1, 2, 32, 0, 10000, 0, 8},         {5, 4, 256, 40000, 10000000, 0, 64},
    {64, 8, 256, 0, 10000000, 0, 64}, {3, 3, 64, 100000, 1000000, 0, 16}, {4, 3, 8, 77, 10000, 0, 2},
    {2, 2, 16, 100, 10000, 0, 16},    {3, 2, 64, 20000, 500000, 1, 16}};

static const struct {
    int64_t t, hq, hkv, d, cap;
    int32_t first;
    uint32_t window;
} att_cases[] = {
    {1, 4, 4, 16, 8, 0, 0},           /* one token at position 0, GQA 1 */
    {5, 8, 4, 16, 32, 0, 0},          /* GQA 2 */
    {5, 8, 2, 16, 32, 0, 0},          /* GQA 4 */
    {17, 8, 1, 32, 40, 3, 0},         /* GQA 8, odd T */
    {1, 16, 8, 128, 64, 40, 0},       /* decode */
    {7, 3, 3, 12, 16, 2, 0},          /* odd head count and head_dim */
    {6, 4, 2, 16, 32, 9, 3},          /* sliding window */
    {12, 6, 3, 8, 16, 0, 5},          /* window inside the prefill */
    {1, 4, 2, 64, 600, 555, 0},       /* far decode */
    {1, 8, 1, 64, 4200, 4100, 0},     /* very far decode, GQA 8 */
    {3, 8, 2, 64, 4200, 4000, 128},   /* far, windowed */
    {130, 16, 8, 128, 160, 0, 0},     /* prefill */
    {512, 8, 2, 64, 512, 0, 0},       /* long prefill, cache exactly full */
    {512, 16, 2, 64, 1024, 300, 256}, /* long prefill after a prefix, GQA 8, window */
};

/* ABI 1.4: caches of several slots (3-D, with seq), F32 or F16. A case's rows are a prompt
 * chunk of t rows of slot 0 from position `first`, with one decode row of every other slot s
 * (at att_decode_pos) inserted among them; each case runs with F32 and with F16 caches. */
static const struct {
    int64_t t, hq, hkv, d, slots, cap;
    int32_t first;
    uint32_t window;
} att_slot_cases[] = {
    {5, 8, 4, 16, 2, 32, 0, 0},        /* a short prompt and one decode row */
    {1, 16, 8, 128, 4, 64, 40, 0},     /* decode rows of four slots, Qwen3's heads */
    {12, 6, 3, 8, 3, 40, 20, 5},       /* a window inside the chunk */
    {40, 8, 2, 64, 3, 700, 240, 0},    /* a chunk across position 256, decode rows far out */
    {33, 16, 8, 128, 2, 1200, 500, 0}, /* Qwen3's heads, across 512 */
    {20, 8, 1, 32, 5, 600, 250, 100},  /* GQA 8, window, across 256 */
};

/* The decode row of slot s >= 1 of slot case i: somewhere in the slot's cache. */
static int32_t att_decode_pos(int i, int64_t s) {
    return (int32_t)((att_slot_cases[i].first / 2 + 97 * s) % att_slot_cases[i].cap);
}

/* Slot cases come in pairs (F32, F16 caches); after all of them, the same cases again as
 * invariance checks (kit_ref_invariance), which run only on F16 caches of the longer cases. */
#define N_ATT_SLOT (COUNT(att_slot_cases) * 2)
static const int att_invariance_cases[] = {3, 4, 5};

static const struct { int64_t t, c; } ew_cases[] = {{1, 3072}, {5, 17}, {64, 1024}, {512, 96}, {1, 1}, {3, 1}};

/* CONCAT widths: equal halves as the MTP head uses, uneven and one-column sides */
static const struct {
    int64_t t, a, b;
} concat_cases[] = {{1, 64, 64}, {5, 17, 3}, {64, 256, 256}, {3, 1, 9}, {7, 33, 1}};

static const struct {
    int64_t t, h, f;
    uint32_t experts, top_k, norm;
} moe_cases[] = {{1, 32, 16, 4, 2, 1},  {6, 48, 24, 8, 2, 0}, {13, 64, 40, 8, 3, 1}, {3, 16, 8, 2, 2, 1},
                 {5, 32, 16, 16, 8, 1}, {4, 16, 8, 4, 1, 0},  {64, 32, 16, 8, 2, 1}};

/* The recurrent ops of ABI 1.6 (SSM_CONV, GATED_DELTA). A case is a sequence of calls over
 * one state, which the op updates: each side (reference kernels, tested backend) carries its
 * own state from call to call, and the kit compares every call's output and the state after
 * it. A call's rows are runs, each some rows of one sequence (slot, first position, rows),
 * interleaved row by row as an engine's batch mixes its requests' decode rows and prompt
 * chunks. The state starts random, so a run from position 0 must not read it. Some calls are
 * ones the contract makes fail (status: a slot out of range or a negative position is
 * RLX_E_RANGE, a sequence's positions not consecutive in row order RLX_E_INVALID), each with one
 * fault and between calls that must not fail: they must return that status and leave the state
 * as it was. slots 0 is the one-sequence form (a 2-D state, no seq input), whose runs are
 * slot 0. */
#define REC_RUNS 3
#define REC_CALLS 7
typedef struct rec_run {
    int32_t slot, first, rows;
} rec_run;
typedef struct rec_call {
    int status;
    rec_run run[REC_RUNS]; /* up to the first without rows */
} rec_call;

/* SSM_CONV: K of 2 to 4, channels from 1 to Qwen3-Next's 8192, odd ones past a vector width. */
static const struct {
    struct {
        int64_t k, c, slots;
        int wdt;  /* w's dtype: dtypes[wdt] */
        int rows; /* 1: with state rows (ABI 1.7) */
    } g;
    const char *what;
    rec_call calls[REC_CALLS]; /* up to the first without rows */
} conv_cases[] = {
    {{4, 33, 0, 0, 0},
     "from position 0 in 4 calls",
     {{0, {{0, 0, 5}}}, {0, {{0, 5, 1}}}, {0, {{0, 6, 1}}}, {0, {{0, 7, 7}}}}},
    {{2, 1, 0, 1, 0}, "from position 3, reading the state", {{0, {{0, 3, 4}}}, {0, {{0, 7, 1}}}, {0, {{0, 8, 2}}}}},
    {{3, 4099, 0, 2, 0},
     "back to position 0",
     {{0, {{0, 100, 9}}}, {0, {{0, 109, 1}}}, {0, {{0, 0, 3}}}, {0, {{0, 3, 1}}}}},
    {{4, 8192, 0, 0, 0}, "a prompt, then decode", {{0, {{0, 0, 64}}}, {0, {{0, 64, 1}}}, {0, {{0, 65, 1}}}}},
    {{4, 65, 4, 1, 0},
     "interleaved",
     {{0, {{0, 0, 6}, {2, 30, 1}, {3, 0, 2}}},
      {0, {{1, 12, 3}, {0, 6, 1}, {2, 31, 1}}},
      {0, {{3, 2, 5}, {0, 0, 2}, {1, 15, 1}}}}},
    {{2, 3, 2, 2, 0}, "interleaved", {{0, {{1, 0, 3}, {0, 7, 1}}}, {0, {{0, 8, 4}}}, {0, {{1, 3, 1}, {0, 12, 1}}}}},
    {{4, 4097, 3, 0, 0},
     "a long chunk among decode rows",
     {{0, {{0, 0, 17}, {1, 40, 1}, {2, 5, 2}}}, {0, {{2, 7, 1}, {0, 17, 3}, {1, 41, 1}}}}},
    {{4, 33, 0, 0, 0},
     "calls that must fail",
     {{0, {{0, 0, 3}}},
      {RLX_E_INVALID, {{0, 3, 2}, {0, 9, 1}}},
      {RLX_E_INVALID, {{0, 4, 1}, {0, 4, 1}}},
      {RLX_E_RANGE, {{0, -2, 3}}},
      {0, {{0, 3, 2}}}}},
    {{3, 65, 3, 1, 0},
     "calls that must fail",
     {{0, {{0, 0, 2}, {1, 4, 1}}},
      {RLX_E_RANGE, {{0, 2, 2}, {3, 0, 1}}},
      {RLX_E_RANGE, {{1, 5, 1}, {-1, 0, 1}}},
      {RLX_E_INVALID, {{1, 5, 2}, {0, 2, 1}, {1, 9, 1}}},
      {RLX_E_RANGE, {{0, 2, 1}, {2, -1, 2}}},
      {0, {{0, 2, 1}, {1, 5, 1}}}}},
    {{4, 4099, 0, 0, 1},
     "state rows: a verification of 4, decode, 20 rows",
     {{0, {{0, 0, 4}}}, {0, {{0, 4, 1}}}, {0, {{0, 5, 20}}}}},
    {{3, 65, 3, 2, 1},
     "state rows, interleaved",
     {{0, {{0, 0, 3}, {2, 30, 1}, {1, 5, 2}}}, {RLX_E_RANGE, {{0, 3, 1}, {3, 0, 1}}}, {0, {{1, 7, 4}, {0, 3, 1}}}}},
};

/* GATED_DELTA: runs of 16 rows or more of one sequence may take the chunk-parallel form (the
 * reference kernels' from 16, in chunks of 64), so runs of 15, 16, 64, 65 and 150 rows cross its
 * edges; Hv/Hk of 1, 2, 4 with both orders of value heads (kv_tiled), Dk != Dv, and Qwen3-Next's
 * heads (Hv 32, Hk 16, Dk = Dv = 128). */
static const struct {
    struct {
        int64_t hv, hk, dk, dv, slots;
        uint32_t tiled;
        int wdt;  /* A's and dt_bias's dtype: dtypes[wdt] */
        int rows; /* 1: with state rows (ABI 1.7) */
    } g;
    const char *what;
    rec_call calls[REC_CALLS];
} gd_cases[] = {
    {{2, 2, 16, 16, 0, 0, 0, 0},
     "runs of 1, 15, 16, 64, 65, 150 rows",
     {{0, {{0, 0, 1}}},
      {0, {{0, 1, 15}}},
      {0, {{0, 16, 16}}},
      {0, {{0, 32, 64}}},
      {0, {{0, 96, 65}}},
      {0, {{0, 161, 150}}}}},
    {{4, 2, 32, 16, 0, 0, 1, 0},
     "from position 7, then back to 0",
     {{0, {{0, 7, 16}}}, {0, {{0, 23, 1}}}, {0, {{0, 24, 65}}}, {0, {{0, 0, 20}}}, {0, {{0, 20, 3}}}}},
    {{8, 2, 16, 24, 0, 1, 2, 0}, "150 rows, then more", {{0, {{0, 0, 150}}}, {0, {{0, 150, 1}}}, {0, {{0, 151, 17}}}}},
    {{4, 1, 8, 32, 0, 1, 0, 0}, "from position 5", {{0, {{0, 5, 64}}}, {0, {{0, 69, 15}}}}},
    {{32, 16, 128, 128, 0, 0, 1, 0}, "a prompt, then decode", {{0, {{0, 0, 33}}}, {0, {{0, 33, 1}}}}},
    {{4, 2, 16, 8, 3, 0, 0, 0},
     "interleaved",
     {{0, {{0, 0, 20}, {1, 9, 1}, {2, 0, 3}}},
      {0, {{1, 10, 16}, {0, 20, 1}}},
      {0, {{2, 3, 1}, {0, 0, 2}, {1, 26, 1}}}}},
    {{8, 2, 32, 16, 4, 1, 2, 0},
     "interleaved",
     {{0, {{3, 50, 1}, {1, 0, 17}, {0, 5, 2}}},
      {0, {{2, 0, 1}, {3, 51, 4}, {1, 17, 1}}},
      {0, {{0, 7, 1}, {2, 1, 1}, {3, 55, 1}}}}},
    {{3, 3, 8, 8, 2, 0, 1, 0}, "interleaved", {{0, {{1, 0, 4}, {0, 30, 1}}}, {0, {{0, 31, 2}, {1, 4, 1}}}}},
    {{4, 2, 16, 8, 0, 0, 0, 0},
     "calls that must fail",
     {{0, {{0, 0, 3}}},
      {RLX_E_INVALID, {{0, 3, 2}, {0, 9, 1}}},
      {RLX_E_RANGE, {{0, -1, 2}}},
      {RLX_E_INVALID, {{0, 3, 20}, {0, 40, 1}}},
      {0, {{0, 3, 2}}}}},
    {{4, 2, 8, 16, 3, 1, 2, 0},
     "calls that must fail",
     {{0, {{0, 0, 2}, {1, 4, 1}}},
      {RLX_E_RANGE, {{0, 2, 2}, {3, 0, 1}}},
      {RLX_E_RANGE, {{1, 5, 1}, {-1, 0, 1}}},
      {RLX_E_INVALID, {{1, 5, 2}, {0, 2, 1}, {1, 9, 1}}},
      {RLX_E_RANGE, {{0, 2, 1}, {2, -1, 2}}},
      {0, {{0, 2, 1}, {1, 5, 1}}}}},
    /* state rows: every row's state, in the one-sequence form over runs that would otherwise
     * take the chunk-parallel form (20 and 65 rows), and with slots interleaved */
    {{4, 2, 16, 24, 0, 0, 0, 1},
     "state rows: a verification of 4, decode, 20 and 65 rows",
     {{0, {{0, 0, 4}}}, {0, {{0, 4, 1}}}, {0, {{0, 5, 20}}}, {0, {{0, 25, 65}}}}},
    {{16, 16, 128, 128, 0, 1, 1, 1},
     "state rows: Qwen3.5-0.8B's heads, a verification of 4",
     {{0, {{0, 0, 9}}}, {0, {{0, 9, 4}}}}},
    {{4, 2, 16, 8, 3, 0, 2, 1},
     "state rows, interleaved",
     {{0, {{0, 0, 5}, {1, 9, 1}, {2, 0, 3}}},
      {RLX_E_INVALID, {{1, 10, 2}, {1, 13, 1}}},
      {0, {{2, 3, 2}, {0, 5, 1}, {1, 10, 1}}}}},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Slot cases run again as batch-invariance checks (kit_ref_invariance): their first call, rows
 * of several slots in one batch, whose rows must give the same bits whatever else the call
 * holds or however a slot's rows are split into calls (the contract's slot form). */
static const int conv_invariance_cases[] = {4, 6};
static const int gd_invariance_cases[] = {5, 6};

/* Cases per op (op order is report order). */
static int n_cases(uint32_t op) {
    switch (op) {
    case RLX_OP_EMBED:
        return COUNT(embed_cases) * 3 + COUNT(qembed_cases) * N_QTYPES;
    case RLX_OP_MATMUL:
        return COUNT(matmul_cases) * 3 * 2 + COUNT(qmatmul_cases) * N_QTYPES;
    case RLX_OP_RMS_NORM:
        return COUNT(norm_cases) * 3;
    case RLX_OP_ROPE:
        return COUNT(rope_cases);
    case RLX_OP_ATTENTION:
        return COUNT(att_cases) + N_ATT_SLOT + COUNT(att_invariance_cases);
    case RLX_OP_SWIGLU:
    case RLX_OP_ADD:
    case RLX_OP_GATHER_LAST:
    case RLX_OP_SIGMOID_MUL:
        return COUNT(ew_cases);
    case RLX_OP_MOE:
        return COUNT(moe_cases) * 3;
    case RLX_OP_CONCAT:
        return COUNT(concat_cases);
    case RLX_OP_SSM_CONV:
        return COUNT(conv_cases) + COUNT(conv_invariance_cases);
    case RLX_OP_GATED_DELTA:
        return COUNT(gd_cases) + COUNT(gd_invariance_cases);
    default:
        return 0;
    }
}

static void case_name(uint32_t op, int i, char *name, size_t len) {
    switch (op) {
    case RLX_OP_EMBED: {
        int r = i / 3;
        if (i >= COUNT(embed_cases) * 3) {
            const int q = i - COUNT(embed_cases) * 3;
            snprintf(name, len, "embed T=%lld V=%lld H=%lld table=%s", (long long)qembed_cases[q / N_QTYPES].t,
                     (long long)qembed_cases[q / N_QTYPES].v, (long long)qembed_cases[q / N_QTYPES].h,
                     rlx_dtype_name((int)qtypes[q % N_QTYPES]));
            break;
        }
        snprintf(name, len, "embed T=%lld V=%lld H=%lld table=%s", (long long)embed_cases[r].t,
                 (long long)embed_cases[r].v, (long long)embed_cases[r].h, rlx_dtype_name((int)dtypes[i % 3]));
        break;
    }
    case RLX_OP_MATMUL: {
        int r = i / 6;
        if (i >= COUNT(matmul_cases) * 6) {
            const int q = i - COUNT(matmul_cases) * 6;
            snprintf(name, len, "matmul T=%lld K=%lld N=%lld w=%s", (long long)qmatmul_cases[q / N_QTYPES].t,
                     (long long)qmatmul_cases[q / N_QTYPES].k, (long long)qmatmul_cases[q / N_QTYPES].n,
                     rlx_dtype_name((int)qtypes[q % N_QTYPES]));
            break;
        }
        snprintf(name, len, "matmul T=%lld K=%lld N=%lld w=%s%s", (long long)matmul_cases[r].t,
                 (long long)matmul_cases[r].k, (long long)matmul_cases[r].n, rlx_dtype_name((int)dtypes[(i / 2) % 3]),
                 i % 2 ? " +bias" : "");
        break;
    }
    case RLX_OP_RMS_NORM: {
        int r = i / 3;
        snprintf(name, len, "rms_norm T=%lld C=%lld G=%lld eps=%g w=%s", (long long)norm_cases[r].t,
                 (long long)norm_cases[r].c, (long long)norm_cases[r].g, (double)norm_cases[r].eps,
                 rlx_dtype_name((int)dtypes[i % 3]));
        break;
    }
    case RLX_OP_ROPE: {
        char part[32] = "";
        if (rope_cases[i].rope_dims)
            snprintf(part, sizeof part, " rope_dims=%u", rope_cases[i].rope_dims);
        snprintf(name, len, "rope T=%lld heads=%lld D=%lld pos0=%d theta=%g%s%s", (long long)rope_cases[i].t,
                 (long long)rope_cases[i].heads, (long long)rope_cases[i].d, rope_cases[i].first,
                 (double)rope_cases[i].theta, rope_cases[i].factors ? " factors" : "", part);
        break;
    }
    case RLX_OP_ATTENTION:
        if (i >= COUNT(att_cases)) {
            const int inv = i - COUNT(att_cases) - N_ATT_SLOT,
                      k = inv >= 0 ? att_invariance_cases[inv] : (i - COUNT(att_cases)) / 2;
            snprintf(name, len,
                     "attention %sslots=%lld T=%lld Hq=%lld Hkv=%lld D=%lld cache=%lld pos0=%d window=%u kv=%s",
                     inv >= 0 ? "invariance " : "", (long long)att_slot_cases[k].slots,
                     (long long)(att_slot_cases[k].t + att_slot_cases[k].slots - 1), (long long)att_slot_cases[k].hq,
                     (long long)att_slot_cases[k].hkv, (long long)att_slot_cases[k].d, (long long)att_slot_cases[k].cap,
                     att_slot_cases[k].first, att_slot_cases[k].window,
                     inv >= 0 || (i - COUNT(att_cases)) % 2 ? "f16" : "f32");
            break;
        }
        snprintf(name, len, "attention T=%lld Hq=%lld Hkv=%lld D=%lld cache=%lld pos0=%d window=%u",
                 (long long)att_cases[i].t, (long long)att_cases[i].hq, (long long)att_cases[i].hkv,
                 (long long)att_cases[i].d, (long long)att_cases[i].cap, att_cases[i].first, att_cases[i].window);
        break;
    case RLX_OP_SWIGLU:
    case RLX_OP_ADD:
    case RLX_OP_GATHER_LAST:
    case RLX_OP_SIGMOID_MUL:
        snprintf(name, len, "%s T=%lld C=%lld", rlx_op_name((int)op), (long long)ew_cases[i].t,
                 (long long)ew_cases[i].c);
        break;
    case RLX_OP_MOE: {
        int r = i / 3;
        snprintf(name, len, "moe T=%lld H=%lld F=%lld E=%u k=%u norm=%u w=%s", (long long)moe_cases[r].t,
                 (long long)moe_cases[r].h, (long long)moe_cases[r].f, moe_cases[r].experts, moe_cases[r].top_k,
                 moe_cases[r].norm, rlx_dtype_name((int)dtypes[i % 3]));
        break;
    }
    case RLX_OP_CONCAT:
        snprintf(name, len, "concat T=%lld A=%lld B=%lld", (long long)concat_cases[i].t, (long long)concat_cases[i].a,
                 (long long)concat_cases[i].b);
        break;
    case RLX_OP_SSM_CONV: {
        const int inv = i - COUNT(conv_cases), k = inv >= 0 ? conv_invariance_cases[inv] : i;
        char slots[32] = "";
        if (conv_cases[k].g.slots)
            snprintf(slots, sizeof slots, " slots=%lld", (long long)conv_cases[k].g.slots);
        snprintf(name, len, "ssm_conv %sK=%lld C=%lld%s w=%s: %s", inv >= 0 ? "invariance " : "",
                 (long long)conv_cases[k].g.k, (long long)conv_cases[k].g.c, slots,
                 rlx_dtype_name((int)dtypes[conv_cases[k].g.wdt]), inv >= 0 ? "its first call" : conv_cases[k].what);
        break;
    }
    case RLX_OP_GATED_DELTA: {
        const int inv = i - COUNT(gd_cases), k = inv >= 0 ? gd_invariance_cases[inv] : i;
        char slots[32] = "";
        if (gd_cases[k].g.slots)
            snprintf(slots, sizeof slots, " slots=%lld", (long long)gd_cases[k].g.slots);
        snprintf(name, len, "gated_delta %sHv=%lld Hk=%lld Dk=%lld Dv=%lld%s%s A=%s: %s", inv >= 0 ? "invariance " : "",
                 (long long)gd_cases[k].g.hv, (long long)gd_cases[k].g.hk, (long long)gd_cases[k].g.dk,
                 (long long)gd_cases[k].g.dv, slots, gd_cases[k].g.tiled ? " kv_tiled" : "",
                 rlx_dtype_name((int)dtypes[gd_cases[k].g.wdt]), inv >= 0 ? "its first call" : gd_cases[k].what);
        break;
    }
    default:
        snprintf(name, len, "?");
    }
}

static int node_alloc(kit_node *n, uint32_t op, uint32_t n_inputs) {
    memset(n, 0, sizeof *n);
    n->op = op;
    n->n_inputs = n_inputs;
    n->in = calloc(n_inputs, sizeof *n->in);
    n->is_weight = calloc(n_inputs, 1);
    return n->in && n->is_weight ? 0 : -1;
}

/* Router logits of MoE token t must separate the k-th and (k+1)-th expert clearly, or float32
 * rounding could pick other experts than the float64 reference: redraws such tokens. */
static void moe_condition(rng *r, kit_node *n) {
    const rlx_tensor *x = &n->in[0], *router = &n->in[1];
    int64_t t_len = x->shape[0], h = x->shape[1], e_len = n->p.n_experts;
    double *logits = malloc((size_t)e_len * sizeof *logits);
    if (!logits)
        return;
    for (int64_t t = 0; t < t_len; t++)
        for (int attempt = 0; attempt < 100; attempt++) {
            float *xt = (float *)x->data + t * h;
            for (int64_t e = 0; e < e_len; e++) {
                double acc = 0;
                for (int64_t k = 0; k < h; k++)
                    acc += (double)xt[k] * kit_load(router->data, router->dtype, (size_t)(e * h + k));
                logits[e] = acc;
            }
            /* the gap at rank top_k, by partial selection */
            double margin = INFINITY;
            if (n->p.top_k < e_len) {
                double kth = 0, next = 0;
                for (uint32_t k = 0; k <= n->p.top_k; k++) {
                    int64_t best = -1;
                    for (int64_t e = 0; e < e_len; e++)
                        if (logits[e] > -INFINITY && (best < 0 || logits[e] > logits[best]))
                            best = e;
                    if (k + 1 == n->p.top_k)
                        kth = logits[best];
                    if (k == n->p.top_k)
                        next = logits[best];
                    logits[best] = -INFINITY;
                }
                margin = kth - next;
            }
            if (margin >= 1e-3)
                break;
            for (int64_t k = 0; k < h; k++)
                xt[k] = uniform(r);
        }
    free(logits);
}

/* ATTENTION's inputs 0..5, output and params for t rows over caches shaped as `cache`. */
static void att_shapes(kit_node *n, int64_t t, int64_t hq, int64_t hkv, int64_t d, uint32_t window, rlx_tensor cache) {
    n->in[0] = shape2(RLX_DTYPE_F32, t, hq * d);
    n->in[1] = shape2(RLX_DTYPE_F32, t, hkv * d);
    n->in[2] = shape2(RLX_DTYPE_F32, t, hkv * d);
    n->in[3] = shape1(RLX_DTYPE_I32, t);
    n->in[4] = n->in[5] = cache;
    n->out = shape2(RLX_DTYPE_F32, t, hq * d);
    n->p.head_dim = (uint32_t)d;
    n->p.n_heads = (uint32_t)hq;
    n->p.n_kv_heads = (uint32_t)hkv;
    n->p.window = window;
    n->p.scale = 1.0f / sqrtf((float)d);
}

/* The shapes of slot case i (index past att_cases). */
static int att_slot_node(int i, kit_node *n) {
    const int inv = i - COUNT(att_cases) - N_ATT_SLOT;
    const int k = inv >= 0 ? att_invariance_cases[inv] : (i - COUNT(att_cases)) / 2;
    const uint32_t dt = inv >= 0 || (i - COUNT(att_cases)) % 2 ? RLX_DTYPE_F16 : RLX_DTYPE_F32;
    const int64_t t = att_slot_cases[k].t + att_slot_cases[k].slots - 1, d = att_slot_cases[k].d;
    const int64_t kv = att_slot_cases[k].hkv * d;
    if (node_alloc(n, RLX_OP_ATTENTION, 7))
        return -1;
    att_shapes(
        n, t, att_slot_cases[k].hq, att_slot_cases[k].hkv, d, att_slot_cases[k].window,
        (rlx_tensor){.dtype = dt, .n_dims = 3, .shape = {att_slot_cases[k].slots, att_slot_cases[k].cap, kv, 1}});
    n->in[6] = shape1(RLX_DTYPE_I32, t);
    n->max_pos = (double)(att_slot_cases[k].cap - 1);
    return 0;
}

/* Row positions and slots of slot case i: slot 0's prompt with slot s's decode row inserted
 * before prompt row s * t / slots. */
static void att_slot_rows(int i, int32_t *pos, int32_t *seq) {
    const int inv = i - COUNT(att_cases) - N_ATT_SLOT;
    const int k = inv >= 0 ? att_invariance_cases[inv] : (i - COUNT(att_cases)) / 2;
    const int64_t t = att_slot_cases[k].t, slots = att_slot_cases[k].slots;
    int64_t row = 0;
    for (int64_t p = 0; p < t; p++) {
        for (int64_t s = 1; s < slots; s++)
            if (p == s * t / slots) {
                pos[row] = att_decode_pos(k, s);
                seq[row++] = (int32_t)s;
            }
        pos[row] = att_slot_cases[k].first + (int32_t)p;
        seq[row++] = 0;
    }
}

int kit_is_state_rows(const kit_node *n, uint32_t i) {
    return (n->op == RLX_OP_SSM_CONV || n->op == RLX_OP_GATED_DELTA) && n->p.state_rows && i + 1 == n->n_inputs;
}

int kit_is_state(uint32_t op, uint32_t i) {
    switch (op) {
    case RLX_OP_ATTENTION:
        return i == 4 || i == 5;
    case RLX_OP_SSM_CONV:
        return i == 3;
    case RLX_OP_GATED_DELTA:
        return i == 6;
    default:
        return 0;
    }
}

/* Rows of a call: its runs interleaved row by row, their positions into pos and slots into seq
 * (each when not NULL). Returns the row count. */
static int64_t rec_rows(const rec_call *call, int32_t *pos, int32_t *seq) {
    int64_t t = 0;
    for (int32_t i = 0, more = 1; more; i++) {
        more = 0;
        for (int k = 0; k < REC_RUNS; k++)
            if (i < call->run[k].rows) {
                if (pos)
                    pos[t] = call->run[k].first + i;
                if (seq)
                    seq[t] = call->run[k].slot;
                t++;
                more = 1;
            }
    }
    return t;
}

static int rec_n_calls(const rec_call *calls) {
    int n = 0;
    while (n < REC_CALLS && calls[n].run[0].rows > 0)
        n++;
    return n;
}

/* v into element i of a float tensor of dtype dt. */
static void put(void *data, uint32_t dt, size_t i, float v) {
    if (dt == RLX_DTYPE_F32)
        ((float *)data)[i] = v;
    else if (dt == RLX_DTYPE_BF16)
        ((uint16_t *)data)[i] = kit_f32_to_bf16(v);
    else
        ((uint16_t *)data)[i] = kit_f32_to_f16(v);
}

/* SSM_CONV and GATED_DELTA (see conv_cases): the node's weights and state, then each call's row
 * inputs (activations, pos, and seq in the slot form) of that call's row count. */
static int rec_node(const kit_check *c, kit_node *n, int with_data, rng *r) {
    const int conv = c->op == RLX_OP_SSM_CONV, inv = c->spec - (conv ? COUNT(conv_cases) : COUNT(gd_cases));
    const int i = inv < 0 ? c->spec : conv ? conv_invariance_cases[inv] : gd_invariance_cases[inv];
    const rec_call *calls = conv ? conv_cases[i].calls : gd_cases[i].calls;
    const int64_t slots = conv ? conv_cases[i].g.slots : gd_cases[i].g.slots;
    const uint32_t wdt = dtypes[conv ? conv_cases[i].g.wdt : gd_cases[i].g.wdt];
    const int rows = conv ? conv_cases[i].g.rows : gd_cases[i].g.rows;
    const uint32_t n_before = (conv ? 4 : 7) + (slots > 0); /* the inputs before the state rows */
    const uint32_t ni = n_before + (rows ? 1u : 0u), pos_in = conv ? 2 : 5, state_in = conv ? 3 : 6;
    const int n_calls = inv >= 0 ? 1 : rec_n_calls(calls); /* an invariance check takes the first */
    int64_t cols_out;
    if (node_alloc(n, c->op, ni))
        return -1;
    if (conv) {
        const int64_t k = conv_cases[i].g.k, ch = conv_cases[i].g.c;
        n->in[1] = shape2(wdt, ch, k);
        n->in[3] = shape2(RLX_DTYPE_F32, k - 1, ch);
        cols_out = ch;
    } else {
        const int64_t hv = gd_cases[i].g.hv, dk = gd_cases[i].g.dk, dv = gd_cases[i].g.dv;
        n->in[3] = n->in[4] = shape1(wdt, hv);
        n->in[6] = (rlx_tensor){.dtype = RLX_DTYPE_F32, .n_dims = 3, .shape = {hv, dk, dv, 1}};
        n->p.eps = 1e-6f;
        n->p.scale = 1.0f / sqrtf((float)dk);
        n->p.head_dim = (uint32_t)dk;
        n->p.head_dim_v = (uint32_t)dv;
        n->p.n_heads = (uint32_t)hv;
        n->p.n_kv_heads = (uint32_t)gd_cases[i].g.hk;
        n->p.kv_tiled = gd_cases[i].g.tiled;
        cols_out = hv * dv;
    }
    n->is_weight[conv ? 1 : 3] = n->is_weight[conv ? 1 : 4] = 1;
    n->p.state_rows = (uint32_t)rows;
    if (slots) { /* one more dimension in front of the state */
        rlx_tensor *st = &n->in[state_in];
        memmove(st->shape + 1, st->shape, (RLX_MAX_DIMS - 1) * sizeof *st->shape);
        st->shape[0] = slots;
        st->n_dims++;
    }
    n->n_calls = (uint32_t)n_calls;
    n->calls = calloc((size_t)n_calls * ni, sizeof *n->calls);
    n->call_status = calloc((size_t)n_calls, sizeof *n->call_status);
    if (!n->calls || !n->call_status)
        return -1;
    const int64_t qkv = conv ? 0 : 2 * gd_cases[i].g.hk * gd_cases[i].g.dk + gd_cases[i].g.hv * gd_cases[i].g.dv;
    for (int k = 0; k < n_calls; k++) {
        rlx_tensor *in = n->calls + (size_t)k * ni;
        const int64_t t = rec_rows(&calls[k], NULL, NULL);
        n->call_status[k] = calls[k].status;
        in[0] = shape2(RLX_DTYPE_F32, t, conv ? conv_cases[i].g.c : qkv);
        if (!conv)
            in[1] = in[2] = shape2(RLX_DTYPE_F32, t, gd_cases[i].g.hv);
        in[pos_in] = shape1(RLX_DTYPE_I32, t);
        if (slots)
            in[n_before - 1] = shape1(RLX_DTYPE_I32, t);
        if (rows) { /* [T, the one sequence's state shape] */
            const rlx_tensor *st = &n->in[state_in];
            in[ni - 1] = (rlx_tensor){.dtype = RLX_DTYPE_F32, .n_dims = st->n_dims + (slots ? 0u : 1u)};
            in[ni - 1].shape[0] = t;
            for (uint32_t d = slots ? 1u : 0u; d < st->n_dims; d++)
                in[ni - 1].shape[d + (slots ? 0u : 1u)] = st->shape[d];
        }
        for (uint32_t j = 0; j < ni; j++)
            if (n->is_weight[j] || j == state_in)
                in[j] = n->in[j];
            else if (k == 0)
                n->in[j] = in[j];
    }
    n->out = shape2(RLX_DTYPE_F32, n->in[0].shape[0], cols_out);
    for (int k = 0; k < n_calls; k++)
        for (int j = 0; j < REC_RUNS; j++)
            if (calls[k].run[j].rows > 0)
                n->max_pos = fmax(n->max_pos, calls[k].run[j].first + calls[k].run[j].rows - 1);
    if (!with_data) {
        n->n_calls = inv >= 0 ? 0 : n->n_calls; /* one node of in[]'s shapes */
        return 0;
    }
    /* weights and the starting state (what the node's inputs hold), then each call's rows */
    for (uint32_t j = 0; j < ni; j++)
        if ((n->is_weight[j] || j == state_in) && !(n->in[j].data = kit_alloc(rlx_iface_tensor_bytes(&n->in[j]))))
            return -1;
    if (conv) {
        fill(r, &n->in[1], 1);
        fill(r, &n->in[3], 2);
    } else { /* A = -exp(A_log), A_log in [0, log 16] as Qwen3-Next draws it; dt_bias near 0 */
        for (int64_t h = 0; h < gd_cases[i].g.hv; h++) {
            put(n->in[3].data, wdt, (size_t)h, -expf((uniform(r) * 0.5f + 0.5f) * logf(16.0f)));
            put(n->in[4].data, wdt, (size_t)h, uniform(r));
        }
        fill(r, &n->in[6], 0.5f);
    }
    for (int k = 0; k < n_calls; k++) {
        rlx_tensor *in = n->calls + (size_t)k * ni;
        for (uint32_t j = 0; j < ni; j++) {
            if (n->is_weight[j] || j == state_in)
                continue;
            if (!(in[j].data = kit_alloc(rlx_iface_tensor_bytes(&in[j]))))
                return -1;
        }
        rec_rows(&calls[k], in[pos_in].data, slots ? in[n_before - 1].data : NULL);
        fill(r, &in[0], conv ? 2 : 1);
        if (!conv) { /* a + dt_bias in softplus's curve and its linear tail; beta across (0, 1) */
            fill(r, &in[1], 3);
            fill(r, &in[2], 3);
        }
    }
    if (inv >= 0) { /* an invariance check: the first call alone, as one node */
        for (uint32_t j = 0; j < ni; j++)
            if (!n->is_weight[j] && j != state_in) {
                n->in[j].data = n->calls[j].data;
                n->calls[j].data = NULL;
            }
        n->n_calls = 0;
    }
    return 0;
}

int kit_ref_invariance(const kit_check *c) {
    return (c->op == RLX_OP_ATTENTION && c->spec >= COUNT(att_cases) + N_ATT_SLOT) ||
           (c->op == RLX_OP_SSM_CONV && c->spec >= COUNT(conv_cases)) ||
           (c->op == RLX_OP_GATED_DELTA && c->spec >= COUNT(gd_cases));
}

int kit_ref_node(const kit_check *c, kit_node *n, int with_data) {
    int i = c->spec;
    rng r = {seed_of(c->name)};
    switch (c->op) {
    case RLX_OP_SSM_CONV:
    case RLX_OP_GATED_DELTA:
        return rec_node(c, n, with_data, &r);
    case RLX_OP_EMBED: {
        const int q = i - COUNT(embed_cases) * 3;
        int64_t t = q >= 0 ? qembed_cases[q / N_QTYPES].t : embed_cases[i / 3].t;
        int64_t v = q >= 0 ? qembed_cases[q / N_QTYPES].v : embed_cases[i / 3].v;
        int64_t h = q >= 0 ? qembed_cases[q / N_QTYPES].h : embed_cases[i / 3].h;
        if (node_alloc(n, c->op, 2))
            return -1;
        n->in[0] = shape1(RLX_DTYPE_I32, t);
        n->in[1] = shape2(q >= 0 ? qtypes[q % N_QTYPES] : dtypes[i % 3], v, h);
        n->is_weight[1] = 1;
        n->out = shape2(RLX_DTYPE_F32, t, h);
        break;
    }
    case RLX_OP_MATMUL: {
        const int q = i - COUNT(matmul_cases) * 6;
        int64_t t = q >= 0 ? qmatmul_cases[q / N_QTYPES].t : matmul_cases[i / 6].t;
        int64_t k = q >= 0 ? qmatmul_cases[q / N_QTYPES].k : matmul_cases[i / 6].k;
        int64_t nn = q >= 0 ? qmatmul_cases[q / N_QTYPES].n : matmul_cases[i / 6].n;
        uint32_t dt = q >= 0 ? qtypes[q % N_QTYPES] : dtypes[(i / 2) % 3];
        const int bias = q < 0 && i % 2;
        if (node_alloc(n, c->op, bias ? 3 : 2))
            return -1;
        n->in[0] = shape2(RLX_DTYPE_F32, t, k);
        n->in[1] = shape2(dt, nn, k);
        n->is_weight[1] = 1;
        if (bias) {
            n->in[2] = shape1(dt, nn);
            n->is_weight[2] = 1;
        }
        n->out = shape2(RLX_DTYPE_F32, t, nn);
        break;
    }
    case RLX_OP_RMS_NORM: {
        int64_t t = norm_cases[i / 3].t, cc = norm_cases[i / 3].c, g = norm_cases[i / 3].g;
        if (node_alloc(n, c->op, 2))
            return -1;
        n->in[0] = shape2(RLX_DTYPE_F32, t, cc);
        n->in[1] = shape1(dtypes[i % 3], g);
        n->is_weight[1] = 1;
        n->out = shape2(RLX_DTYPE_F32, t, cc);
        n->p.eps = norm_cases[i / 3].eps;
        break;
    }
    case RLX_OP_ROPE: {
        int64_t t = rope_cases[i].t, cols = rope_cases[i].heads * rope_cases[i].d;
        if (node_alloc(n, c->op, rope_cases[i].factors ? 3 : 2))
            return -1;
        n->in[0] = shape2(RLX_DTYPE_F32, t, cols);
        n->in[1] = shape1(RLX_DTYPE_I32, t);
        if (rope_cases[i].factors) {
            const uint32_t turn = rope_cases[i].rope_dims ? rope_cases[i].rope_dims : (uint32_t)rope_cases[i].d;
            n->in[2] = shape1(RLX_DTYPE_F32, turn / 2);
            n->is_weight[2] = 1;
        }
        n->out = shape2(RLX_DTYPE_F32, t, cols);
        n->p.head_dim = (uint32_t)rope_cases[i].d;
        n->p.rope_dims = rope_cases[i].rope_dims;
        n->p.rope_theta = rope_cases[i].theta;
        n->max_pos = (double)(rope_cases[i].first + t - 1);
        break;
    }
    case RLX_OP_ATTENTION: {
        if (i >= COUNT(att_cases)) {
            if (att_slot_node(i, n))
                return -1;
            break;
        }
        const int64_t t = att_cases[i].t, d = att_cases[i].d;
        if (node_alloc(n, c->op, 6))
            return -1;
        att_shapes(n, t, att_cases[i].hq, att_cases[i].hkv, d, att_cases[i].window,
                   shape2(RLX_DTYPE_F32, att_cases[i].cap, att_cases[i].hkv * d));
        n->max_pos = (double)(att_cases[i].first + t - 1);
        break;
    }
    case RLX_OP_SWIGLU:
    case RLX_OP_ADD:
    case RLX_OP_GATHER_LAST:
    case RLX_OP_SIGMOID_MUL: {
        int64_t t = ew_cases[i].t, cc = ew_cases[i].c;
        uint32_t ni = c->op == RLX_OP_GATHER_LAST ? 1 : 2;
        if (node_alloc(n, c->op, ni))
            return -1;
        for (uint32_t k = 0; k < ni; k++)
            n->in[k] = shape2(RLX_DTYPE_F32, t, cc);
        n->out = shape2(RLX_DTYPE_F32, c->op == RLX_OP_GATHER_LAST ? 1 : t, cc);
        break;
    }
    case RLX_OP_MOE: {
        int r0 = i / 3;
        int64_t t = moe_cases[r0].t, h = moe_cases[r0].h, f = moe_cases[r0].f;
        uint32_t e_len = moe_cases[r0].experts, dt = dtypes[i % 3];
        if (node_alloc(n, c->op, 2 + 3 * e_len))
            return -1;
        n->in[0] = shape2(RLX_DTYPE_F32, t, h);
        n->in[1] = shape2(dt, e_len, h);
        for (uint32_t e = 0; e < e_len; e++) {
            n->in[2 + 3 * e] = shape2(dt, f, h);
            n->in[3 + 3 * e] = shape2(dt, f, h);
            n->in[4 + 3 * e] = shape2(dt, h, f);
        }
        for (uint32_t k = 1; k < n->n_inputs; k++)
            n->is_weight[k] = 1;
        n->out = shape2(RLX_DTYPE_F32, t, h);
        n->p.n_experts = e_len;
        n->p.top_k = moe_cases[r0].top_k;
        n->p.norm_topk = moe_cases[r0].norm;
        break;
    }
    case RLX_OP_CONCAT: {
        int64_t t = concat_cases[i].t, a = concat_cases[i].a, b = concat_cases[i].b;
        if (node_alloc(n, c->op, 2))
            return -1;
        n->in[0] = shape2(RLX_DTYPE_F32, t, a);
        n->in[1] = shape2(RLX_DTYPE_F32, t, b);
        n->out = shape2(RLX_DTYPE_F32, t, a + b);
        break;
    }
    default:
        return -1;
    }
    if (!with_data)
        return 0;
    for (uint32_t k = 0; k < n->n_inputs; k++) {
        rlx_tensor *t = &n->in[k];
        if (!(t->data = kit_alloc(rlx_iface_tensor_bytes(t))))
            return -1;
    }
    /* scales keep every op's values O(1) */
    switch (c->op) {
    case RLX_OP_EMBED: {
        int32_t *ids = n->in[0].data;
        int64_t t = n->in[0].shape[0], v = n->in[1].shape[0];
        for (int64_t k = 0; k < t; k++)
            ids[k] = (int32_t)((uniform(&r) * 0.5f + 0.5f) * (float)v) % (int32_t)v;
        ids[0] = (int32_t)v - 1; /* the table's edges */
        ids[t - 1] = 0;
        fill(&r, &n->in[1], 1);
        break;
    }
    case RLX_OP_MATMUL:
        fill(&r, &n->in[0], 1);
        fill(&r, &n->in[1], 0.1f);
        if (n->n_inputs > 2)
            fill(&r, &n->in[2], 1);
        break;
    case RLX_OP_RMS_NORM:
        fill(&r, &n->in[0], 3);
        fill(&r, &n->in[1], 1);
        break;
    case RLX_OP_ROPE:
        fill(&r, &n->in[0], 1);
        for (int64_t k = 0; k < n->in[1].shape[0]; k++)
            ((int32_t *)n->in[1].data)[k] = rope_cases[i].first + (int32_t)k;
        for (int64_t k = 0; n->n_inputs > 2 && k < n->in[2].shape[0]; k++) /* divisors in [1, 8) */
            ((float *)n->in[2].data)[k] = 4.5f + 3.5f * uniform(&r);
        break;
    case RLX_OP_ATTENTION:
        fill(&r, &n->in[0], 2);
        fill(&r, &n->in[1], 2);
        fill(&r, &n->in[2], 1);
        if (i >= COUNT(att_cases))
            att_slot_rows(i, n->in[3].data, n->in[6].data);
        else
            for (int64_t k = 0; k < n->in[3].shape[0]; k++)
                ((int32_t *)n->in[3].data)[k] = att_cases[i].first + (int32_t)k;
        fill(&r, &n->in[4], 2); /* earlier positions */
        fill(&r, &n->in[5], 1);
        break;
    case RLX_OP_SWIGLU:
    case RLX_OP_ADD:
    case RLX_OP_GATHER_LAST:
    case RLX_OP_CONCAT:
        for (uint32_t k = 0; k < n->n_inputs; k++)
            fill(&r, &n->in[k], 4);
        break;
    case RLX_OP_SIGMOID_MUL: /* gates far into both tails, where sigmoid saturates */
        fill(&r, &n->in[0], 4);
        fill(&r, &n->in[1], 16);
        break;
    case RLX_OP_MOE:
        fill(&r, &n->in[0], 1);
        fill(&r, &n->in[1], 1);
        for (uint32_t k = 2; k < n->n_inputs; k++)
            fill(&r, &n->in[k], 0.3f);
        moe_condition(&r, n);
        break;
    default:
        break;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Enumeration

static int push(kit_check **list, size_t *n, size_t *cap, const kit_check *c) {
    if (*n == *cap) {
        size_t grown = *cap ? *cap * 2 : 256;
        kit_check *l = realloc(*list, grown * sizeof *l);
        if (!l) {
            fprintf(stderr, "rlx-conformance: out of memory\n");
            return -1;
        }
        *list = l;
        *cap = grown;
    }
    (*list)[(*n)++] = *c;
    return 0;
}

static int wanted(const kit_options *o, const char *name) { return !o->filter || strstr(name, o->filter); }

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

int kit_enumerate(const kit_options *o, kit_check **list, size_t *n) {
    size_t cap = 0;
    *list = NULL;
    *n = 0;
    kit_check c;
    if (!o->is_ref && !o->no_ref)
        for (uint32_t op = 1; op < RLX_OP_COUNT; op++)
            for (int i = 0; i < n_cases(op); i++) {
                memset(&c, 0, sizeof c);
                c.source = KIT_SRC_REF;
                c.op = op;
                c.spec = i;
                case_name(op, i, c.name, sizeof c.name);
                if (wanted(o, c.name) && push(list, n, &cap, &c))
                    return -1;
            }
    if (o->data_dir) {
        struct dirent **entries;
        int count = scandir(o->data_dir, &entries, NULL, by_name);
        int found = 0;
        for (int k = 0; k < count; k++) {
            if (ends_with(entries[k]->d_name, ".rlxcase")) {
                memset(&c, 0, sizeof c);
                c.source = KIT_SRC_NUMPY;
                size_t len = strlen(o->data_dir) + strlen(entries[k]->d_name) + 2;
                if (!(c.path = malloc(len)))
                    return -1;
                snprintf(c.path, len, "%s/%s", o->data_dir, entries[k]->d_name);
                kit_node node;
                char why[256];
                if (kit_fixture_read(c.path, &node, c.name, sizeof c.name, 0, why, sizeof why) < 0) {
                    snprintf(c.name, sizeof c.name, "fixture %.160s", entries[k]->d_name);
                } else {
                    c.op = node.op;
                    kit_node_free(&node);
                }
                found++;
                if (wanted(o, c.name)) {
                    if (push(list, n, &cap, &c))
                        return -1;
                } else {
                    free(c.path);
                }
            }
            free(entries[k]);
        }
        if (count >= 0)
            free(entries);
        if (!found) { /* reported as a failure by the runner: a kit without its data checks less */
            memset(&c, 0, sizeof c);
            c.source = KIT_SRC_NUMPY;
            snprintf(c.name, sizeof c.name, "NumPy expectations in %s", o->data_dir);
            if (push(list, n, &cap, &c))
                return -1;
        }
    }
    for (size_t m = 0; m < o->n_model_dirs; m++) {
        const char *dir = o->model_dirs[m];
        const char *base = strrchr(dir, '/') && strrchr(dir, '/')[1] ? strrchr(dir, '/') + 1 : dir;
        char golden[4200];
        snprintf(golden, sizeof golden, "%s/rlx-golden.txt", dir);
        int has_golden = access(golden, R_OK) == 0;
        static const char *what[] = {"logits (prefill, then decode) vs reference kernels",
                                     "logits vs NumPy golden (rlx-golden.f32)", "greedy ids vs NumPy golden",
                                     "fused spans vs the same nodes one by one"};
        for (int kind = 0; kind < 4; kind++) {
            memset(&c, 0, sizeof c);
            c.source = KIT_SRC_MODEL;
            c.spec = kind;
            if (!(c.path = strdup(dir)))
                return -1;
            snprintf(c.name, sizeof c.name, "model %s: %s", base, what[kind]);
            if ((kind == KIT_MODEL_VS_REF || kind == KIT_MODEL_SPANS) && o->is_ref) {
                free(c.path);
                continue;
            }
            if (kind == KIT_MODEL_GREEDY && !has_golden) {
                free(c.path);
                continue;
            }
            if (wanted(o, c.name)) {
                if (push(list, n, &cap, &c))
                    return -1;
            } else {
                free(c.path);
            }
        }
    }
    return 0;
}
