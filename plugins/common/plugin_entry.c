/* rlx_plugin_entry's check: see plugin_entry.h. */
#include "plugin_entry.h"

const rlx_plugin *plugin_entry(const rlx_host *host, const rlx_plugin *desc) {
    if (!host || host->abi_major != RLX_ABI_MAJOR) {
        if (host && host->error)
            host->error(RLX_E_ABI, "%s: built for ABI %d, host has %u", desc->name, RLX_ABI_MAJOR, host->abi_major);
        return NULL;
    }
    return desc;
}
