/* A plugin that cannot run on this host and says why through host->error. */
#include "rlx/backend_iface.h"

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    host->error(RLX_E_UNSUPPORTED, "needs an instruction set this CPU lacks");
    return NULL;
}
