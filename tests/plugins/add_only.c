/* A working backend that claims only ADD (and computes it), for capability-based placement. */
#include "rlx/backend_iface.h"

static int add_open(const rlx_host *host, const rlx_backend_options *opts, void **self) {
    *self = (void *)host;
    return RLX_OK;
}

static void add_close(void *self) {}

static int add_supports(void *self, const rlx_node_view *node) { return node->op == RLX_OP_ADD; }

static int add_compute(void *self, const rlx_node_view *node) {
    const float *a = node->inputs[0].data, *b = node->inputs[1].data;
    float *out = node->output->data;
    int64_t n = rlx_iface_numel(node->output);
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
    return RLX_OK;
}

static const rlx_backend_iface iface = {
    .size = sizeof(rlx_backend_iface),
    .open = add_open,
    .close = add_close,
    .supports = add_supports,
    .compute = add_compute,
};

static const rlx_plugin desc = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_BACKEND,
    .name = "Add-Only",
    .version = "1.2.3",
    .summary = "test backend: additions only",
    .iface = &iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return &desc; }
