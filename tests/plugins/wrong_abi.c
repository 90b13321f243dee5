/* A plugin built for a future ABI major: must be refused at load time. */
#include "rlx/backend_iface.h"

static const rlx_plugin desc = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR + 1,
    .kind = RLX_PLUGIN_BACKEND,
    .name = "wrong-abi",
    .version = "9.0.0",
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return &desc; }
