/* A backend built for ABI 1.3 whose supports() says yes to every node, as a careless author's
 * might: it would read a 3-D cache as one sequence and F16 rows as F32. The core must never
 * offer it what 1.4 added (GATHER_ROWS, ATTENTION with slots or F16 caches), and running a
 * node it was offered fails loudly, so a test sees where each node went. Built again with
 * CLAIM_MINOR=6, it is a 1.6 backend that must not be offered state rows (1.7). */
#include "rlx/backend_iface.h"

#ifndef CLAIM_MINOR
#define CLAIM_MINOR 3
#endif
#define STR_(x) #x
#define STR(x) STR_(x)

static int abi13_open(const rlx_host *host, const rlx_backend_options *opts, void **self) {
    (void)opts;
    *self = (void *)host;
    return RLX_OK;
}

static void abi13_close(void *self) { (void)self; }

static int abi13_supports(void *self, const rlx_node_view *node) {
    (void)self, (void)node;
    return 1;
}

static int abi13_compute(void *self, const rlx_node_view *node) {
    const rlx_host *host = self;
    return host->error(RLX_E_UNSUPPORTED, "abi1" STR(CLAIM_MINOR) ": computes nothing (node '%s')", node->name);
}

static const rlx_backend_iface iface = {
    .size = sizeof(rlx_backend_iface),
    .open = abi13_open,
    .close = abi13_close,
    .supports = abi13_supports,
    .compute = abi13_compute,
};

static const rlx_plugin desc = {
    .size = sizeof(rlx_plugin),
    .abi_major = RLX_ABI_MAJOR,
    .abi_minor = CLAIM_MINOR,
    .kind = RLX_PLUGIN_BACKEND,
    .name = "abi1" STR(CLAIM_MINOR),
    .version = "1." STR(CLAIM_MINOR) ".0",
    .summary = "test backend: claims everything, built for ABI 1." STR(CLAIM_MINOR),
    .iface = &iface,
};

RLX_PLUGIN_EXPORT const rlx_plugin *rlx_plugin_entry(const rlx_host *host) {
    (void)host;
    return &desc;
}
