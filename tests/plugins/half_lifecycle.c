/* A 1.2 backend that prepares weights but has no release_weight: the core could never give its
 * handles back, so the loader refuses it (one member of a pair is a plugin bug, not an option). */
#include "rlx/backend_iface.h"

static int t_open(const rlx_host *host, const rlx_backend_options *opts, void **self) { return RLX_OK; }
static void t_close(void *self) {}
static int t_supports(void *self, const rlx_node_view *node) { return 0; }
static int t_compute(void *self, const rlx_node_view *node) { return RLX_OK; }
static int t_prepare(void *self, const rlx_weight_info *w, void **handle) { return RLX_OK; }

static const rlx_backend_iface iface = {
    .size = sizeof(rlx_backend_iface),
    .open = t_open,
    .close = t_close,
    .supports = t_supports,
    .compute = t_compute,
    .prepare_weight = t_prepare,
};

static const rlx_plugin desc = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = RLX_ABI_MINOR,
    .kind = RLX_PLUGIN_BACKEND,
    .name = "half-lifecycle",
    .version = "0.0.1",
    .iface = &iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return &desc; }
