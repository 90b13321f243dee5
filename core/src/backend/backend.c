/* Backend instances: the built-in reference backend and instances opened from plugins. All
 * calls into a plugin go through here so failures are reported with the backend's name. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"

rlx_backend_options rlx_backend_options_default(void) {
    return (rlx_backend_options){.size = sizeof(rlx_backend_options)};
}

/* abi_minor: what the plugin was built for; members of later minors are never read. */
static rlx_status backend_new(const rlx_backend_iface *iface, uint32_t abi_minor, const char *name,
                              const rlx_backend_options *opts, rlx_backend **out) {
    rlx_backend *b = calloc(1, sizeof *b);
    if (!b)
        return rlx_error(RLX_E_NOMEM, "backend '%s': out of memory", name);
    b->iface = iface;
    if (abi_minor >= 2) {
        b->precision = RLX_HAS(rlx_backend_iface, iface, precision) ? iface->precision : NULL;
        b->describe = RLX_HAS(rlx_backend_iface, iface, describe) ? iface->describe : NULL;
    }
    snprintf(b->name, sizeof b->name, "%s", name);
    rlx_backend_options o = opts ? *opts : rlx_backend_options_default();
    rlx_error_clear();
    int rc = iface->open(rlx_host_table(), &o, &b->self);
    if (rc < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", *rlx_last_error() ? rlx_last_error() : rlx_status_str(rc));
        free(b);
        return rlx_error(rc, "backend '%s' failed to open: %s", name, why);
    }
    *out = b;
    return RLX_OK;
}

rlx_status rlx_backend_create_ref(rlx_backend **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_backend_create_ref: out is NULL");
    *out = NULL;
    return backend_new(&rlx__ref_backend_iface, RLX_ABI_MINOR, "ref", NULL, out);
}

rlx_status rlx_backend_create_ref_opts(const rlx_backend_options *opts, rlx_backend **out) {
    if (!out)
        return rlx_error(RLX_E_INVALID, "rlx_backend_create_ref_opts: out is NULL");
    *out = NULL;
    return backend_new(&rlx__ref_backend_iface, RLX_ABI_MINOR, "ref", opts, out);
}

rlx_status rlx_backend_create(const rlx_plugin_handle *plugin, const rlx_backend_options *opts, rlx_backend **out) {
    if (!plugin || !out)
        return rlx_error(RLX_E_INVALID, "rlx_backend_create: NULL argument");
    *out = NULL;
    const rlx_plugin *d = rlx_plugin_desc(plugin);
    if (d->kind != RLX_PLUGIN_BACKEND)
        return rlx_error(RLX_E_INVALID, "%s: plugin '%s' is a %s, not a backend", rlx_plugin_path(plugin), d->name,
                         rlx_plugin_kind_name(d->kind));
    return backend_new(d->iface, d->abi_minor, d->name, opts, out);
}

void rlx_backend_destroy(rlx_backend *b) {
    if (!b)
        return;
    b->iface->close(b->self);
    free(b);
}

const char *rlx_backend_name(const rlx_backend *b) { return b ? b->name : "?"; }

int rlx_backend_supports(rlx_backend *b, const rlx_node_view *node) { return b->iface->supports(b->self, node) > 0; }

uint32_t rlx_backend_precision(rlx_backend *b, const rlx_node_view *node) {
    if (!b || !b->precision)
        return RLX_PRECISION_F32;
    const uint32_t p = b->precision(b->self, node);
    return p < RLX_PRECISION_COUNT ? p : RLX_PRECISION_F32;
}

const char *rlx_backend_describe(rlx_backend *b) {
    const char *d = b && b->describe ? b->describe(b->self) : NULL;
    return d ? d : "";
}

const char *rlx_precision_name(uint32_t precision) {
    switch (precision) {
    case RLX_PRECISION_F32:
        return "f32";
    case RLX_PRECISION_BF16_ACT:
        return "bf16-act";
    default:
        return "?";
    }
}

rlx_status rlx_backend_compute(rlx_backend *b, const rlx_node_view *node) {
    rlx_error_clear();
    int rc = b->iface->compute(b->self, node);
    if (rc >= 0)
        return RLX_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", *rlx_last_error() ? rlx_last_error() : rlx_status_str(rc));
    return rlx_error(rc, "backend '%s' failed on node '%s' (%s): %s", b->name, node->name, rlx_op_name((int)node->op),
                     why);
}
