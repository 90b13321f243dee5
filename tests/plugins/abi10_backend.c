/* A backend as a plugin author wrote one for ABI 1.0, built against the frozen 1.0 headers in
 * abi-1.0/ (not the current ones): ADD, SWIGLU, GATHER_LAST and RMS_NORM, with a supports()
 * that refuses the 1.0 ops it does not compute and says yes to anything else. That default was
 * harmless in 1.0, when every op was known; the core must never offer such a plugin an op of a
 * later minor (CONCAT, 1.1), which it could not compute. */
#include <math.h>
#include <string.h>

#include "rlx/backend.h"

#if RLX_ABI_MINOR != 0
#error "abi10_backend.c must be built against tests/plugins/abi-1.0"
#endif

static int abi10_open(const rlx_host *h, const rlx_backend_options *opts, void **self) {
    (void)opts;
    *self = (void *)h;
    return RLX_OK;
}

static void abi10_close(void *self) { (void)self; }

static int64_t numel(const rlx_tensor *t) {
    int64_t n = 1;
    for (uint32_t i = 0; i < t->n_dims; i++)
        n *= t->shape[i];
    return n;
}

static float load(const rlx_tensor *t, int64_t i) {
    uint32_t bits;
    float f;
    switch (t->dtype) {
    case RLX_DTYPE_BF16:
        bits = (uint32_t)((const uint16_t *)t->data)[i] << 16;
        memcpy(&f, &bits, 4);
        return f;
    case RLX_DTYPE_F16: {
        const uint16_t h = ((const uint16_t *)t->data)[i];
        const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, s = (uint32_t)(h & 0x8000) << 16;
        if (e == 0) {
            f = (float)m * 0x1p-24f;
            return s ? -f : f;
        }
        bits = s | (e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13);
        memcpy(&f, &bits, 4);
        return f;
    }
    default:
        return ((const float *)t->data)[i];
    }
}

static int abi10_supports(void *self, const rlx_node_view *node) {
    (void)self;
    switch (node->op) {
    case RLX_OP_EMBED:
    case RLX_OP_MATMUL:
    case RLX_OP_ROPE:
    case RLX_OP_ATTENTION:
    case RLX_OP_MOE:
        return 0;
    default:
        return 1;
    }
}

static int abi10_compute(void *self, const rlx_node_view *node) {
    const rlx_host *h = self;
    float *out = node->output->data;
    const rlx_tensor *in = node->inputs;
    const int64_t n = numel(node->output);
    switch (node->op) {
    case RLX_OP_ADD:
        for (int64_t i = 0; i < n; i++)
            out[i] = ((const float *)in[0].data)[i] + ((const float *)in[1].data)[i];
        return RLX_OK;
    case RLX_OP_SWIGLU:
        for (int64_t i = 0; i < n; i++) {
            const float g = ((const float *)in[0].data)[i];
            out[i] = g / (1.0f + expf(-g)) * ((const float *)in[1].data)[i];
        }
        return RLX_OK;
    case RLX_OP_GATHER_LAST: {
        const int64_t cols = in[0].shape[in[0].n_dims - 1], rows = numel(&in[0]) / cols;
        memcpy(out, (const float *)in[0].data + (rows - 1) * cols, (size_t)cols * sizeof *out);
        return RLX_OK;
    }
    case RLX_OP_RMS_NORM: {
        const int64_t group = numel(&in[1]);
        const float *x = in[0].data;
        for (int64_t g0 = 0; g0 < n; g0 += group) {
            double ss = 0;
            for (int64_t j = 0; j < group; j++)
                ss += (double)x[g0 + j] * x[g0 + j];
            const float r = (float)(1.0 / sqrt(ss / (double)group + node->params->eps));
            for (int64_t j = 0; j < group; j++)
                out[g0 + j] = x[g0 + j] * r * load(&in[1], j);
        }
        return RLX_OK;
    }
    default:
        return h->error(RLX_E_UNSUPPORTED, "abi10: op %u is unknown to a 1.0 backend", node->op);
    }
}

static const rlx_backend_iface iface = {
    .size = sizeof(rlx_backend_iface),
    .open = abi10_open,
    .close = abi10_close,
    .supports = abi10_supports,
    .compute = abi10_compute,
};

static const rlx_plugin desc = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_BACKEND,
    .name = "abi10",
    .version = "1.0.0",
    .summary = "test backend built against the ABI 1.0 headers",
    .iface = &iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *h) {
    (void)h;
    return &desc;
}
