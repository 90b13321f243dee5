/* Backends broken on purpose, to show that rlx-conformance reports each fault clearly (naming
 * the plugin and the node), exits non-zero and does not crash itself. Built once per mode:
 *   BROKEN_ERROR      claims ATTENTION, then returns an error from compute
 *   BROKEN_NAN        claims F32 MATMUL, computes it, then puts a NaN in the output
 *   BROKEN_WRONG      claims ADD and computes a - b
 *   BROKEN_CRASH      claims RMS_NORM and segfaults in it; ADD is claimed and correct, so the
 *                     report must go on after the crash
 *   BROKEN_UNWRITTEN  claims SWIGLU and writes only the first half of the output
 *   BROKEN_OVERRUN    claims ADD and writes one value past the end of the output
 *   BROKEN_MUTATE     claims F32 MATMUL and scribbles on its input x
 *   BROKEN_HANG       claims GATHER_LAST and never returns
 *   BROKEN_REFUSE     open() fails
 *   BROKEN_ABI        built for the next ABI major: refused at load time
 *   BROKEN_TRUNC      claims F32 MATMUL as RLX_PRECISION_BF16_ACT but truncates x to BF16
 *                     instead of rounding it to nearest: within the loose bound, not the mode
 *   BROKEN_UNDECLARED rounds x of F32 MATMUL to BF16 correctly but does not declare it
 *   BROKEN_OLD_MINOR  as BROKEN_UNDECLARED, declaring it in a `precision` member while built
 *                     for ABI 1.1, whose tables have no such member: the core must not read it
 *   BROKEN_VARIANT    claims ATTENTION over slots (ABI 1.4) and fills each output with the
 *                     call's row count: a row's bits depend on the batch
 *   BROKEN_DESCRIBE   claims nothing (the reference kernels run every node) and describes itself
 *                     with a quote, a backslash and control characters, which a report printing
 *                     it (rlx bench's JSON) must escape
 *   BROKEN_STATELESS  claims SSM_CONV (ABI 1.6) and computes each call right from the state it
 *                     is given, but never writes the state back: the next call starts stale
 *   BROKEN_UNCHECKED  claims SSM_CONV and computes it, but accepts a sequence's positions that
 *                     are negative or not consecutive instead of failing the call
 *   BROKEN_NO_ROWS    claims SSM_CONV with state rows (ABI 1.7) and computes it, but leaves the
 *                     state rows unwritten (the modes above decline state rows)
 *   BROKEN_CONV_VARIANT claims SSM_CONV and computes it, then adds (T - 1) * 1e-7 to every
 *                     output: within the tolerance, but a row's bits depend on the batch
 *   BROKEN_OLD_CLAIMS built for ABI 1.5, claims every ROPE (whole heads, as 1.5 states it) and
 *                     the op numbers 1.6 later gave SIGMOID_MUL, SSM_CONV and GATED_DELTA (a
 *                     careless supports()): the core must never offer it those nodes nor a
 *                     partial ROPE, and it fails any such node it is given */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rlx/backend_iface.h"

static const rlx_host *host;

static int b_open(const rlx_host *h, const rlx_backend_options *opts, void **self) {
    host = h;
    *self = NULL;
#ifdef BROKEN_REFUSE
    return h->error(RLX_E_UNSUPPORTED, "broken-refuse: refusing to open, on purpose");
#else
    return RLX_OK;
#endif
}

static void b_close(void *self) {}

__attribute__((unused)) static int f32_matmul(const rlx_node_view *n) {
    return n->op == RLX_OP_MATMUL && n->n_inputs == 2 && n->inputs[1].dtype == RLX_DTYPE_F32;
}

static int b_supports(void *self, const rlx_node_view *n) {
#if defined(BROKEN_ERROR)
    return n->op == RLX_OP_ATTENTION;
#elif defined(BROKEN_NAN) || defined(BROKEN_MUTATE) || defined(BROKEN_TRUNC) || defined(BROKEN_UNDECLARED) ||          \
    defined(BROKEN_OLD_MINOR)
    return f32_matmul(n);
#elif defined(BROKEN_WRONG) || defined(BROKEN_OVERRUN)
    return n->op == RLX_OP_ADD;
#elif defined(BROKEN_CRASH)
    return n->op == RLX_OP_RMS_NORM || n->op == RLX_OP_ADD;
#elif defined(BROKEN_UNWRITTEN)
    return n->op == RLX_OP_SWIGLU;
#elif defined(BROKEN_HANG)
    return n->op == RLX_OP_GATHER_LAST;
#elif defined(BROKEN_VARIANT)
    return n->op == RLX_OP_ATTENTION && n->n_inputs == 7;
#elif defined(BROKEN_STATELESS) || defined(BROKEN_UNCHECKED) || defined(BROKEN_CONV_VARIANT)
    return n->op == RLX_OP_SSM_CONV && !n->params->state_rows;
#elif defined(BROKEN_NO_ROWS)
    return n->op == RLX_OP_SSM_CONV;
#elif defined(BROKEN_OLD_CLAIMS)
    return n->op == RLX_OP_ROPE || n->op == RLX_OP_SIGMOID_MUL || n->op == RLX_OP_SSM_CONV ||
           n->op == RLX_OP_GATED_DELTA;
#else
    return 0;
#endif
}

/* x as BF16 would hold it: to nearest even (round), or toward zero (the BROKEN_TRUNC fault). */
__attribute__((unused)) static float to_bf16(float f, int round) {
    if (round)
        return rlx_iface_bf16_to_f32(rlx_iface_f32_to_bf16(f));
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits &= 0xffff0000u;
    memcpy(&f, &bits, 4);
    return f;
}

/* y = x w^T, with x taken as F32 (rounding < 0) or converted to BF16 by to_bf16(., rounding). */
__attribute__((unused)) static void matmul_x(const rlx_node_view *n, int rounding) {
    const float *x = n->inputs[0].data, *w = n->inputs[1].data;
    float *y = n->output->data;
    int64_t t_len = n->inputs[0].shape[0], k_len = n->inputs[0].shape[1], n_out = n->inputs[1].shape[0];
    for (int64_t t = 0; t < t_len; t++)
        for (int64_t o = 0; o < n_out; o++) {
            double acc = 0;
            for (int64_t k = 0; k < k_len; k++) {
                const float xv = x[t * k_len + k];
                acc += (double)(rounding < 0 ? xv : to_bf16(xv, rounding)) * w[o * k_len + k];
            }
            y[t * n_out + o] = (float)acc;
        }
}

__attribute__((unused)) static void matmul(const rlx_node_view *n) { matmul_x(n, -1); }

/* SSM_CONV as the contract states it, row by row over a copy of the state that is written
 * back at the end (not with BROKEN_STATELESS). Slots are always checked (a row of another slot
 * would write outside the state); positions only without BROKEN_UNCHECKED. */
__attribute__((unused)) static int ssm_conv(const rlx_node_view *n) {
    const float *x = n->inputs[0].data;
    const uint32_t n_in = n->n_inputs - (rlx_iface_state_rows(n) ? 1u : 0u); /* the inputs before state rows */
    const int32_t *pos = n->inputs[2].data, *seq = n_in > 4 ? n->inputs[4].data : NULL;
    const rlx_tensor *w = &n->inputs[1], *st = &n->inputs[3];
    const int64_t T = n->inputs[0].shape[0], C = n->inputs[0].shape[1], K = w->shape[1];
    const int64_t slots = st->n_dims == 3 ? st->shape[0] : 1, win = (K - 1) * C;
    float *y = n->output->data;
    for (int64_t t = 0; t < T; t++) {
        const int32_t s = seq ? seq[t] : 0;
        if (s < 0 || s >= slots)
            return host->error(RLX_E_RANGE, "%s: row %lld: slot %d out of range", BROKEN_NAME, (long long)t, s);
#ifndef BROKEN_UNCHECKED
        if (pos[t] < 0)
            return host->error(RLX_E_RANGE, "%s: row %lld: negative position", BROKEN_NAME, (long long)t);
        for (int64_t u = t - 1; u >= 0; u--)
            if ((seq ? seq[u] : 0) == s) {
                if (pos[u] + 1 != pos[t])
                    return host->error(RLX_E_INVALID, "%s: row %lld: position not consecutive", BROKEN_NAME,
                                       (long long)t);
                break;
            }
#endif
    }
    float *state = malloc((size_t)(slots * win) * sizeof *state);
    if (!state)
        return host->error(RLX_E_NOMEM, "%s: out of memory", BROKEN_NAME);
    memcpy(state, st->data, (size_t)(slots * win) * sizeof *state);
    for (int64_t t = 0; t < T; t++) {
        float *sw = state + (seq ? seq[t] : 0) * win;
        if (pos[t] == 0)
            memset(sw, 0, (size_t)win * sizeof *sw);
        for (int64_t c = 0; c < C; c++) {
            float acc = 0;
            for (int64_t j = 0; j < K - 1; j++)
                acc += rlx_iface_load_f32(w->dtype, w->data, c * K + j) * sw[j * C + c];
            acc += rlx_iface_load_f32(w->dtype, w->data, c * K + K - 1) * x[t * C + c];
            y[t * C + c] = acc / (1.0f + expf(-acc));
        }
        memmove(sw, sw + C, (size_t)((K - 2) * C) * sizeof *sw);
        memcpy(sw + (K - 2) * C, x + t * C, (size_t)C * sizeof *sw);
    }
#ifndef BROKEN_STATELESS
    memcpy(st->data, state, (size_t)(slots * win) * sizeof *state);
#endif
    free(state);
    return RLX_OK;
}

/* ROPE over whole heads with optional factors, as ABI 1.5 states it. */
__attribute__((unused)) static void rope(const rlx_node_view *n) {
    const float *x = n->inputs[0].data, *factors = n->n_inputs > 2 ? n->inputs[2].data : NULL;
    const int32_t *pos = n->inputs[1].data;
    const int64_t T = n->inputs[0].shape[0], cols = n->inputs[0].shape[1], d = n->params->head_dim, half = d / 2;
    float *y = n->output->data;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < cols / d; h++)
            for (int64_t i = 0; i < half; i++) {
                double angle = pos[t] * pow((double)n->params->rope_theta, -2.0 * (double)i / (double)d);
                if (factors)
                    angle /= (double)factors[i];
                const double c = cos(angle), s = sin(angle), x1 = x[t * cols + h * d + i],
                             x2 = x[t * cols + h * d + i + half];
                y[t * cols + h * d + i] = (float)(x1 * c - x2 * s);
                y[t * cols + h * d + i + half] = (float)(x2 * c + x1 * s);
            }
}

__attribute__((unused)) static uint32_t b_precision(void *self, const rlx_node_view *n) {
    return RLX_PRECISION_BF16_ACT;
}

static int b_compute(void *self, const rlx_node_view *n) {
    const float *a = n->inputs[0].data, *b = n->n_inputs > 1 ? n->inputs[1].data : NULL;
    float *y = n->output->data;
    int64_t len = rlx_iface_numel(n->output);
    (void)a, (void)b, (void)y, (void)len;
#if defined(BROKEN_ERROR)
    return host->error(RLX_E_INTERNAL, "broken-error: node '%s': deliberate failure", n->name);
#elif defined(BROKEN_NAN)
    matmul(n);
    y[len - 1] = NAN;
#elif defined(BROKEN_MUTATE)
    ((float *)n->inputs[0].data)[0] += 1.0f;
    matmul(n);
#elif defined(BROKEN_WRONG)
    for (int64_t i = 0; i < len; i++)
        y[i] = a[i] - b[i];
#elif defined(BROKEN_OVERRUN)
    for (int64_t i = 0; i < len; i++)
        y[i] = a[i] + b[i];
    y[len] = 0.0f; /* one past the end */
#elif defined(BROKEN_CRASH)
    if (n->op == RLX_OP_RMS_NORM) {
        volatile uintptr_t nowhere = 16; /* opaque to the compiler: a plain wild pointer */
        *(volatile float *)nowhere = 1.0f;
    }
    for (int64_t i = 0; i < len; i++)
        y[i] = a[i] + b[i];
#elif defined(BROKEN_UNWRITTEN)
    for (int64_t i = 0; i < len / 2; i++)
        y[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
#elif defined(BROKEN_HANG)
    for (;;)
        pause();
#elif defined(BROKEN_TRUNC)
    matmul_x(n, 0);
#elif defined(BROKEN_UNDECLARED) || defined(BROKEN_OLD_MINOR)
    matmul_x(n, 1);
#elif defined(BROKEN_VARIANT)
    for (int64_t i = 0; i < len; i++)
        y[i] = (float)n->inputs[0].shape[0];
#elif defined(BROKEN_STATELESS) || defined(BROKEN_UNCHECKED) || defined(BROKEN_NO_ROWS)
    return ssm_conv(n);
#elif defined(BROKEN_CONV_VARIANT)
    const int rc = ssm_conv(n);
    for (int64_t i = 0; rc == RLX_OK && i < len; i++)
        y[i] += (float)(n->inputs[0].shape[0] - 1) * 1e-7f;
    return rc;
#elif defined(BROKEN_OLD_CLAIMS)
    if (n->op != RLX_OP_ROPE)
        return host->error(RLX_E_INTERNAL, "%s: given node '%s' of op %u, which ABI 1.5 does not have", BROKEN_NAME,
                           n->name, n->op);
    rope(n);
#endif
    return RLX_OK;
}

#ifdef BROKEN_DESCRIBE
static const char *b_describe(void *self) { return "a \"quoted\" name, a back\\slash,\ta tab and\na newline"; }
#endif

static const rlx_backend_iface iface = {
    .size = sizeof(rlx_backend_iface),
    .open = b_open,
    .close = b_close,
    .supports = b_supports,
    .compute = b_compute,
#if defined(BROKEN_TRUNC) || defined(BROKEN_OLD_MINOR)
    .precision = b_precision,
#endif
#ifdef BROKEN_DESCRIBE
    .describe = b_describe,
#endif
};

static const rlx_plugin desc = {
    .size = sizeof(rlx_plugin),
#ifdef BROKEN_ABI
    .abi_major = RLX_ABI_MAJOR + 1,
#else
    .abi_major = RLX_ABI_MAJOR,
#endif
#ifdef BROKEN_OLD_MINOR
    .abi_minor = 1,
#elif defined(BROKEN_OLD_CLAIMS)
    .abi_minor = 5,
#else
    .abi_minor = RLX_ABI_MINOR,
#endif
    .kind = RLX_PLUGIN_BACKEND,
    .name = BROKEN_NAME,
    .version = "0.0.1",
    .summary = "conformance test backend, broken on purpose",
    .iface = &iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *h) { return &desc; }
