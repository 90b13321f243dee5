/* A plugin of a kind this rlx does not know. */
#include "rlx/backend_iface.h"

static const int table;

static const rlx_plugin desc = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .kind = 77,
    .name = "strange",
    .version = "0.0.1",
    .iface = &table,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) { return &desc; }
