/* Row quantizers and llama-quantize's per-tensor type choice (quantize.h).
 *
 * The K-type searches work on one sub-block at a time: for a sub-block x with importance weights
 * w, levels q = round((x - m) / s) are tried for a range of candidate scales around the one that
 * spans the sub-block exactly; for each candidate the scale (and minimum) are refitted by
 * weighted least squares given its levels, and the candidate of least weighted squared error
 * wins. The sub-block scales are then quantized to 6 bits (Q4_K, Q5_K, relative to an F16 super
 * scale) or to int8 (Q6_K), and the levels are recomputed with the scales the file will hold. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "arch.h"
#include "model_internal.h"
#include "quantize.h"
#include "rlx/quant_iface.h"
#include "util/alloc.h"
#include "weights_internal.h"

static inline uint16_t f16(float v) { return rlx_iface_f32_to_f16(v); }
static inline float f16r(float v) { return rlx_iface_f16_to_f32(rlx_iface_f32_to_f16(v)); }
/* Round half to even, as llama.cpp's nearest_int does. */
static inline int nearest(float v) { return (int)lrintf(v); }
static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// ---- simple reference rules (32-value blocks)

/* The value of largest magnitude, the first on ties. */
static float signed_absmax(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* Q4_0 (nmax 8) and Q5_0 (nmax 16): d = max / -nmax, q = min(2 nmax - 1, trunc(x / d + nmax + 0.5)). */
static void quant_sym(const float *x, int nmax, uint16_t *d_out, uint8_t *qh, uint8_t *qs) {
    const float d = signed_absmax(x, RLX_QK) / (float)-nmax;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint32_t high = 0;
    *d_out = f16(d);
    for (int j = 0; j < RLX_QK / 2; j++) {
        const int q0 = clampi((int8_t)(x[j] * id + ((float)nmax + 0.5f)), 0, 2 * nmax - 1);
        const int q1 = clampi((int8_t)(x[j + RLX_QK / 2] * id + ((float)nmax + 0.5f)), 0, 2 * nmax - 1);
        qs[j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
        high |= (uint32_t)((q0 >> 4) & 1) << j | (uint32_t)((q1 >> 4) & 1) << (j + RLX_QK / 2);
    }
    if (qh)
        for (int k = 0; k < 4; k++)
            qh[k] = (uint8_t)(high >> (8 * k));
}

/* Q4_1 (nmax 15, clamped) and Q5_1 (nmax 31): d = (max - min) / nmax, q = trunc((x - min) / d + 0.5). */
static void quant_affine(const float *x, int nmax, uint16_t *d_out, uint16_t *m_out, uint8_t *qh, uint8_t *qs) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < RLX_QK; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    const float d = (hi - lo) / (float)nmax;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *d_out = f16(d);
    *m_out = f16(lo);
    uint32_t high = 0;
    for (int j = 0; j < RLX_QK / 2; j++) {
        int q0 = (int8_t)((x[j] - lo) * id + 0.5f), q1 = (int8_t)((x[j + RLX_QK / 2] - lo) * id + 0.5f);
        q0 = clampi(q0, 0, nmax);
        q1 = clampi(q1, 0, nmax);
        qs[j] = (uint8_t)((q0 & 15) | ((q1 & 15) << 4));
        high |= (uint32_t)((q0 >> 4) & 1) << j | (uint32_t)((q1 >> 4) & 1) << (j + RLX_QK / 2);
    }
    if (qh)
        for (int k = 0; k < 4; k++)
            qh[k] = (uint8_t)(high >> (8 * k));
}

static void quant_q8_0(const float *x, rlx_block_q8_0 *b) {
    float amax = 0;
    for (int j = 0; j < RLX_QK; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    b->d = f16(d);
    for (int j = 0; j < RLX_QK; j++)
        b->qs[j] = (int8_t)roundf(x[j] * id);
}

// ---- K types: the sub-block searches

/* Affine fit of n values to levels 0..nmax: returns the scale s and stores the offset (as a
 * non-negative amount subtracted, value = s q - off) and the levels. Candidate inverse scales
 * (nmax + rmin + rdelta k) / (max - min), k = 0..nstep, are tried, min being the best offset
 * found so far; each is refitted by weighted least squares and kept when its weighted squared
 * error is lower. (The operations and their order are those of llama.cpp's reference, so the
 * bytes agree with its files.) */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *q, float *off, float rmin,
                        float rdelta, int nstep) {
    float lo = x[0], hi = x[0], sw = 0, swx = 0;
    for (int i = 0; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sw += w[i];
        swx += w[i] * x[i];
    }
    if (lo > 0)
        lo = 0; /* the offset only ever lowers the grid */
    if (hi <= lo) {
        memset(q, 0, (size_t)n);
        *off = -lo;
        return 0;
    }
    /* the spanning scale first */
    const float span = (float)nmax / (hi - lo);
    float scale = 1.0f / span, min = lo;
    float best = 0;
    for (int i = 0; i < n; i++) {
        q[i] = (uint8_t)clampi(nearest(span * (x[i] - lo)), 0, nmax);
        const float e = scale * q[i] + lo - x[i];
        best += w[i] * (e * e);
    }
    uint8_t trial[32];
    for (int k = 0; k <= nstep; k++) {
        /* candidates are laid from the best offset so far, which moves the grid as it improves */
        const float iscale = (rmin + rdelta * (float)k + (float)nmax) / (hi - min);
        float sl = 0, sll = 0, slx = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest(iscale * (x[i] - min)), 0, nmax);
            trial[i] = (uint8_t)l;
            sl += w[i] * l;
            sll += w[i] * l * l;
            slx += w[i] * l * x[i];
        }
        const float det = sw * sll - sl * sl;
        if (!(det > 0))
            continue;
        float s = (sw * slx - swx * sl) / det, m = (sll * swx - sl * slx) / det;
        if (m > 0) { /* a positive offset is not representable: refit the scale alone */
            m = 0;
            s = sll > 0 ? slx / sll : 0;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float e = s * trial[i] + m - x[i];
            err += w[i] * (e * e);
        }
        if (err < best) {
            best = err;
            scale = s;
            min = m;
            memcpy(q, trial, (size_t)n);
        }
    }
    *off = -min;
    return scale;
}

/* Symmetric fit of n values to levels -nmax..nmax-1 with weights x^2: returns the scale (signed,
 * the sign of the value of largest magnitude); the largest value maps to -nmax for candidates
 * (nmax + 0.1 k) / max, k = 0 then -9..9, each refitted by least squares; the candidate
 * maximising (sum w x q)^2 / sum w q^2 (least weighted error after the refit) wins. */
static float fit_symmetric(int n, int nmax, const float *x) {
    const float max = signed_absmax(x, n);
    if (max == 0)
        return 0;
    float scale = 0, best = 0;
    /* the nominal grid (k = 0) first, then the others; best = scale * sum w x q */
    for (int step = 0; step <= 18; step++) {
        const int k = step == 0 ? 0 : step <= 9 ? step - 10 : step - 9;
        const float iscale = -((float)nmax + 0.1f * (float)k) / max;
        float slx = 0, sll = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            slx += w * x[i] * l;
            sll += w * l * l;
        }
        if (step == 0) {
            scale = sll > 0 ? slx / sll : 0;
            best = scale * slx;
        } else if (sll > 0 && slx * slx > best * sll) {
            scale = slx / sll;
            best = scale * slx;
        }
    }
    return scale;
}

/* Stores 6-bit scale sc and minimum m of sub-block s as rlx_iface_q4k_scale reads them. */
static void put_k4_scale(uint8_t scales[12], int s, int sc, int m) {
    if (s < 4) {
        scales[s] = (uint8_t)((scales[s] & 0xC0) | sc);
        scales[s + 4] = (uint8_t)((scales[s + 4] & 0xC0) | m);
    } else {
        scales[s + 4] = (uint8_t)((sc & 0xF) | ((m & 0xF) << 4));
        scales[s - 4] = (uint8_t)((scales[s - 4] & 0x3F) | ((sc >> 4) << 6));
        scales[s] = (uint8_t)((scales[s] & 0x3F) | ((m >> 4) << 6));
    }
}

/* The common part of Q4_K (nmax 15) and Q5_K (nmax 31) over one 256-value block: the levels
 * (0..nmax) of every value into q, the super scales and the packed sub-block scales. */
static void quant_k_affine(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out, uint8_t scales[12],
                           uint8_t q[RLX_QK_K]) {
    float scale[8], off[8], w[32], max_scale = 0, max_off = 0;
    const float rmin = nmax == 15 ? -1.0f : -0.5f;
    const int nstep = nmax == 15 ? 20 : 15;
    for (int s = 0; s < 8; s++) {
        const float *xs = x + 32 * s;
        float sum2 = 0;
        for (int i = 0; i < 32; i++)
            sum2 += xs[i] * xs[i];
        const float av = sqrtf(sum2 / 32);
        for (int i = 0; i < 32; i++)
            w[i] = av + fabsf(xs[i]); /* importance: larger values weigh more */
        scale[s] = fit_affine(32, nmax, xs, w, q + 32 * s, &off[s], rmin, 0.1f, nstep);
        max_scale = scale[s] > max_scale ? scale[s] : max_scale;
        max_off = off[s] > max_off ? off[s] : max_off;
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0, inv_off = max_off > 0 ? 63.0f / max_off : 0;
    int ls[8], lm[8];
    memset(scales, 0, 12);
    for (int s = 0; s < 8; s++) {
        ls[s] = clampi(nearest(inv_scale * scale[s]), 0, 63);
        lm[s] = clampi(nearest(inv_off * off[s]), 0, 63);
        put_k4_scale(scales, s, ls[s], lm[s]);
    }
    *d_out = f16(max_scale / 63.0f);
    *dmin_out = f16(max_off / 63.0f);
    const float d = rlx_iface_f16_to_f32(*d_out), dmin = rlx_iface_f16_to_f32(*dmin_out);
    /* the levels again, with the scales as stored */
    for (int s = 0; s < 8; s++) {
        const float ds = d * (float)ls[s], ms = dmin * (float)lm[s];
        if (ds == 0)
            continue;
        for (int i = 0; i < 32; i++)
            q[32 * s + i] = (uint8_t)clampi(nearest((x[32 * s + i] + ms) / ds), 0, nmax);
    }
}

static void quant_q4_k(const float *x, rlx_block_q4_k *b) {
    uint8_t q[RLX_QK_K];
    quant_k_affine(x, 15, &b->d, &b->dmin, b->scales, q);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            b->qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}

static void quant_q5_k(const float *x, rlx_block_q5_k *b) {
    uint8_t q[RLX_QK_K];
    quant_k_affine(x, 31, &b->d, &b->dmin, b->scales, q);
    memset(b->qh, 0, sizeof b->qh);
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
            b->qs[32 * c + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            b->qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        }
    }
}

static void quant_q6_k(const float *x, rlx_block_q6_k *b) {
    float scale[16], max_scale = 0, max_abs = 0;
    for (int s = 0; s < 16; s++) {
        scale[s] = fit_symmetric(16, 32, x + 16 * s);
        if (fabsf(scale[s]) > max_abs) {
            max_abs = fabsf(scale[s]);
            max_scale = scale[s];
        }
    }
    memset(b, 0, sizeof *b);
    if (max_abs == 0)
        return;
    const float iscale = -128.0f / max_scale;
    b->d = f16(1.0f / iscale);
    const float d = rlx_iface_f16_to_f32(b->d);
    uint8_t q[RLX_QK_K];
    for (int s = 0; s < 16; s++) {
        const int sc = clampi(nearest(iscale * scale[s]), -128, 127);
        b->scales[s] = (int8_t)sc;
        const float ds = d * (float)sc;
        for (int i = 0; i < 16; i++)
            q[16 * s + i] = (uint8_t)(ds != 0 ? clampi(nearest(x[16 * s + i] / ds), -32, 31) + 32 : 32);
    }
    for (int half = 0; half < 2; half++) {
        const uint8_t *qq = q + 128 * half;
        uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((qq[l] & 15) | ((qq[l + 64] & 15) << 4));
            ql[l + 32] = (uint8_t)((qq[l + 32] & 15) | ((qq[l + 96] & 15) << 4));
            qh[l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                              ((qq[l + 96] >> 4) << 6));
        }
    }
}

int rlx__quantize_row(uint32_t dtype, const float *x, void *dst, int64_t n) {
    const int64_t block = rlx_iface_dtype_block(dtype);
    if (block <= 0 || n % block != 0)
        return -1;
    uint8_t *p = dst;
    switch (dtype) {
    case RLX_DTYPE_F32:
        memcpy(dst, x, (size_t)n * sizeof(float));
        return 0;
    case RLX_DTYPE_F16:
    case RLX_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = dtype == RLX_DTYPE_F16 ? f16(x[i]) : rlx_iface_f32_to_bf16(x[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return 0;
    default:
        break;
    }
    const size_t bytes = rlx_iface_dtype_block_bytes(dtype);
    for (int64_t i = 0; i < n / block; i++, x += block, p += bytes) {
        switch (dtype) {
        case RLX_DTYPE_Q4_0: {
            rlx_block_q4_0 *b = (rlx_block_q4_0 *)p;
            quant_sym(x, 8, &b->d, NULL, b->qs);
            break;
        }
        case RLX_DTYPE_Q5_0: {
            rlx_block_q5_0 *b = (rlx_block_q5_0 *)p;
            quant_sym(x, 16, &b->d, b->qh, b->qs);
            break;
        }
        case RLX_DTYPE_Q4_1: {
            rlx_block_q4_1 *b = (rlx_block_q4_1 *)p;
            quant_affine(x, 15, &b->d, &b->m, NULL, b->qs);
            break;
        }
        case RLX_DTYPE_Q5_1: {
            rlx_block_q5_1 *b = (rlx_block_q5_1 *)p;
            quant_affine(x, 31, &b->d, &b->m, b->qh, b->qs);
            break;
        }
        case RLX_DTYPE_Q8_0:
            quant_q8_0(x, (rlx_block_q8_0 *)p);
            break;
        case RLX_DTYPE_Q4_K:
            quant_q4_k(x, (rlx_block_q4_k *)p);
            break;
        case RLX_DTYPE_Q5_K:
            quant_q5_k(x, (rlx_block_q5_k *)p);
            break;
        case RLX_DTYPE_Q6_K:
            quant_q6_k(x, (rlx_block_q6_k *)p);
            break;
        default:
            return -1;
        }
    }
    return 0;
}

int rlx_quantize_row(uint32_t dtype, const float *src, void *dst, int64_t n) {
    return src && dst && n >= 0 ? rlx__quantize_row(dtype, src, dst, n) : -1;
}

// ---- file types and the per-tensor choice

static const rlx__qtype qtypes[] = {
    {"f32", 0, RLX_DTYPE_F32, 0},        {"f16", 1, RLX_DTYPE_F16, 0},        {"bf16", 32, RLX_DTYPE_BF16, 0},
    {"q8_0", 7, RLX_DTYPE_Q8_0, 0},      {"q4_0", 2, RLX_DTYPE_Q4_0, 0},      {"q4_1", 3, RLX_DTYPE_Q4_1, 0},
    {"q5_0", 8, RLX_DTYPE_Q5_0, 0},      {"q5_1", 9, RLX_DTYPE_Q5_1, 0},      {"q4_k_s", 14, RLX_DTYPE_Q4_K, 'S'},
    {"q4_k_m", 15, RLX_DTYPE_Q4_K, 'M'}, {"q5_k_s", 16, RLX_DTYPE_Q5_K, 'S'}, {"q5_k_m", 17, RLX_DTYPE_Q5_K, 'M'},
    {"q6_k", 18, RLX_DTYPE_Q6_K, 0},
};

const rlx__qtype *rlx__qtype_find(const char *name) {
    for (size_t i = 0; name && i < sizeof qtypes / sizeof qtypes[0]; i++)
        if (strcasecmp(name, qtypes[i].name) == 0)
            return &qtypes[i];
    return NULL;
}

const char *rlx__qtype_names(void) {
    return "f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k";
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third between. */
static int more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static int has_part(const char *name, const char *part) { return strstr(name, part) != NULL; }

uint32_t rlx__qtype_tensor(const rlx__qtype *q, const rlx__qtensor *t, int *fallback) {
    *fallback = 0;
    const char *name = t->gguf_name;
    const size_t len = strlen(name);
    const int weight = len > 7 && strcmp(name + len - 7, ".weight") == 0;
    /* the router, and a Gated DeltaNet layer's small convolution, which llama-quantize keeps */
    if (t->n_dims < 2 || !weight || has_part(name, "ffn_gate_inp") || has_part(name, "ssm_conv1d"))
        return RLX_DTYPE_F32;
    uint32_t type = q->dtype;
    if (!rlx_iface_dtype_is_quantized(type))
        return type;
    int layer = -1;
    if (sscanf(name, "blk.%d.", &layer) != 1)
        layer = -1;
    const int is_k = type == RLX_DTYPE_Q4_K || type == RLX_DTYPE_Q5_K || type == RLX_DTYPE_Q6_K;
    const int q4km = is_k && q->dtype == RLX_DTYPE_Q4_K && q->mix == 'M';
    const int q5km = is_k && q->dtype == RLX_DTYPE_Q5_K && q->mix == 'M';
    const int q4ks = is_k && q->dtype == RLX_DTYPE_Q4_K && q->mix == 'S';
    if (strcmp(name, "output.weight") == 0 || (t->tied && strcmp(name, "token_embd.weight") == 0)) {
        if (type != RLX_DTYPE_Q8_0)
            type = RLX_DTYPE_Q6_K;
    } else if (has_part(name, "attn_v.weight") || has_part(name, "attn_qkv.weight")) {
        /* llama-quantize ranks a fused qkv (a Gated DeltaNet layer's) with attn_v, by its place
         * among them: the layer's, since a hybrid's layer has one or the other */
        if ((q4km || q5km) && more_bits(layer, t->n_layers))
            type = RLX_DTYPE_Q6_K;
        else if (q4ks && layer < 4)
            type = RLX_DTYPE_Q5_K;
        if (t->n_experts == 8)
            type = RLX_DTYPE_Q8_0;
    } else if (has_part(name, "attn_k.weight")) {
        if (t->n_experts == 8)
            type = RLX_DTYPE_Q8_0;
    } else if (has_part(name, "ffn_down")) {
        if ((q4km || q5km) && more_bits(layer, t->n_layers))
            type = RLX_DTYPE_Q6_K;
        else if (q4ks && layer < t->n_layers / 8)
            type = RLX_DTYPE_Q5_K;
    } else if (has_part(name, "attn_output.weight")) {
        if (t->n_experts == 8 && (q4km || q4ks))
            type = RLX_DTYPE_Q5_K;
    }
    if (t->cols % rlx_iface_dtype_block(type) != 0) {
        *fallback = 1;
        switch (type) {
        case RLX_DTYPE_Q4_K:
            type = RLX_DTYPE_Q5_0;
            break;
        case RLX_DTYPE_Q5_K:
            type = RLX_DTYPE_Q5_1;
            break;
        case RLX_DTYPE_Q6_K:
            type = RLX_DTYPE_Q8_0;
            break;
        default:
            break;
        }
        if (t->cols % rlx_iface_dtype_block(type) != 0)
            type = RLX_DTYPE_F16;
    }
    return type;
}

// ---- in-memory quantization of a safetensors model

rlx_status rlx__weights_quantize(rlx_weights *w, const rlx__model_desc *d, const struct rlx__qtype *q,
                                 rlx_quantize_progress progress, void *ctx) {
    const rlx_model_config *c = &d->cfg;
    float *row = NULL;
    int64_t row_cap = 0;
    rlx_status st = RLX_OK;
    /* room for one buffer per tensor more (a second call quantizes what the first left) */
    void **owned = rlx__realloc(w->owned, (w->n_owned + w->n_tensors + 1) * sizeof *owned);
    if (!owned)
        return rlx_error(RLX_E_NOMEM, "out of memory");
    w->owned = owned;
    for (size_t i = 0; i < w->n_tensors && st == RLX_OK; i++) {
        rlx_weight *x = &w->tensors[i];
        char name[96];
        int layer, part;
        int64_t expert;
        if (!rlx__arch_gguf_of_hf(d->arch, x->name, name, sizeof name, &layer, &part, &expert))
            continue;
        const int64_t cols = x->shape[x->n_dims - 1];
        const rlx__qtensor qt = {name,           x->n_dims + (expert >= 0), cols, c->num_hidden_layers,
                                 c->num_experts, c->tie_word_embeddings};
        int fallback;
        const uint32_t dtype = rlx__qtype_tensor(q, &qt, &fallback);
        const size_t in_row = rlx_iface_row_bytes(x->dtype, cols), out_row = rlx_iface_row_bytes(dtype, cols);
        if (dtype == x->dtype || (x->n_dims < 2 && !rlx_iface_dtype_is_quantized(dtype)) || !in_row || !out_row)
            continue; /* vectors keep their float type: the block reads f32, bf16 and f16 alike */
        const int64_t rows = (int64_t)(x->nbytes / in_row);
        if (cols > row_cap) {
            free(row);
            row_cap = cols;
            if (!(row = rlx__malloc((size_t)cols * sizeof *row))) {
                st = rlx_error(RLX_E_NOMEM, "out of memory");
                break;
            }
        }
        uint8_t *dst = rlx__malloc((size_t)rows * out_row);
        if (!dst) {
            st = rlx_error(RLX_E_NOMEM, "%s: cannot allocate %zu bytes to quantize '%s'", x->file,
                           (size_t)rows * out_row, x->name);
            break;
        }
        for (int64_t r = 0; r < rows; r++) {
            rlx_iface_dequant_row(x->dtype, (const uint8_t *)x->data + (size_t)r * in_row, row, cols);
            rlx__quantize_row(dtype, row, dst + (size_t)r * out_row, cols);
        }
        rlx__drop_mapped(x->data, x->nbytes); /* file-backed and clean: only lowers RSS */
        const rlx_quantize_event ev = {name, x->dtype,     dtype,     fallback,
                                       i,    w->n_tensors, x->nbytes, (size_t)rows * out_row};
        w->total_bytes = w->total_bytes - x->nbytes + (size_t)rows * out_row;
        w->owned[w->n_owned++] = dst;
        x->data = dst;
        x->dtype = dtype;
        x->nbytes = (size_t)rows * out_row;
        if (progress)
            progress(ctx, &ev);
    }
    free(row);
    return st;
}
