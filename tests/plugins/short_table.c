/* A backend whose function table claims to end before `compute`, as a plugin built against an
 * older, shorter table would: must be refused instead of calling past its end. */
#include <stddef.h>

#include "rlx/backend_iface.h"

static int t_open(const rlx_host *host, const rlx_backend_options *opts, void **self) { return RLX_OK; }
static void t_close(void *self) {}
static int t_supports(void *self, const rlx_node_view *node) { return 1; }

static const rlx_backend_iface iface = {
    .size = offsetof(rlx_backend_iface, compute),
    .open = t_open,
    .close = t_close,
    .supports = t_supports,
};

static const rlx_plugin desc = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .kind = RLX_PLUGIN_BACKEND,
    .name = "short-table",
    .version = "0.0.1",
    .iface = &iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return &desc; }
