/* The one exported function of an in-tree plugin, written once: each plugin's rlx_plugin_entry
 * returns plugin_entry(host, &desc), and a backend builds its desc with PLUGIN_BACKEND_DESC.
 * Linked statically into each plugin, hidden from its exports. */
#ifndef RLX_PLUGINS_PLUGIN_ENTRY_H
#define RLX_PLUGINS_PLUGIN_ENTRY_H

#include "rlx/plugin_iface.h"

/* The rlx_plugin of a backend built against this tree's ABI, iface its rlx_backend_iface. */
#define PLUGIN_BACKEND_DESC(name_, version_, summary_, iface_)                                                         \
    {                                                                                                                  \
        .size = sizeof(rlx_plugin), .abi_major = RLX_ABI_MAJOR, .abi_minor = RLX_ABI_MINOR,                            \
        .kind = RLX_PLUGIN_BACKEND, .name = (name_), .version = (version_), .summary = (summary_), .iface = (iface_)   \
    }

/* desc when host speaks its ABI major, else NULL, after host->error (when host has one) naming
 * the plugin and both majors. */
const rlx_plugin *plugin_entry(const rlx_host *host, const rlx_plugin *desc);

#endif
